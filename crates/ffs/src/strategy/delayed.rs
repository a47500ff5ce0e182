//! `async` (named `Delayed` because `async` is a Rust keyword): FFS mounted async. Every
//! step only leaves its buffers dirty; the syncer and memory pressure write them in block
//! order with no regard for the rules. The fast, unsafe upper bound the papers normalize
//! against (000 §4): a crash can leave any subset of the delayed writes on disk.

use std::time::Duration;

use cairn_bufcache::BufRef;
use cairn_vfs::{KernelCachePolicy, Result};

use super::{Io, Strategy};

pub struct Delayed;

impl Strategy for Delayed {
    fn name(&self) -> &'static str {
        "async"
    }
    fn cache_policy(&self) -> KernelCachePolicy {
        KernelCachePolicy {
            writeback_cache: false,
            entry_ttl: Duration::from_secs(60),
            attr_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(60),
        }
    }
    fn syncer_interval(&self) -> Duration {
        Duration::from_secs(30)
    }
    fn setup_inode_alloc(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn setup_block_init(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn setup_directory_add(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn setup_directory_remove(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn setup_link_add(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn setup_link_remove(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn setup_freeblocks(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn setup_attr_change(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn op_done(&self, _: &Io) -> Result<()> {
        Ok(())
    }
    fn write_back(&self, io: &Io, durable: bool) -> Result<()> {
        io.write_back_unordered(durable)
    }
}
