//! `sync`: classic FFS. Each ordered step is written at once, after a device flush that
//! makes the previous step durable (the barrier), and every metadata call ends with a flush,
//! so it is durable when it returns. Costs one flush per ordered step: create = 2 (inode,
//! then entry), remove = 1 (the entry; the lowered link count and the freed inode follow
//! behind the next barrier), rename = 3 (link count up, new name, old name gone), which is
//! the price the papers measure for synchronous metadata (000 §2).

use std::time::Duration;

use cairn_bufcache::BufRef;
use cairn_vfs::{KernelCachePolicy, Result};

use super::{Io, Strategy};

pub struct Sync;

impl Strategy for Sync {
    fn name(&self) -> &'static str {
        "sync"
    }

    fn cache_policy(&self) -> KernelCachePolicy {
        // No kernel writeback cache: with it, ENOSPC and EFBIG would surface only at
        // writeback (after write() returned) and the kernel would own mtime. Writes are still
        // delayed in our buffer cache, as in classic FFS.
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

    fn setup_inode_alloc(&self, io: &Io, bufs: &[&BufRef]) -> Result<()> {
        io.write_ordered(bufs)
    }
    fn setup_block_init(&self, io: &Io, bufs: &[&BufRef]) -> Result<()> {
        io.write_initialized(bufs)
    }
    fn setup_directory_add(&self, io: &Io, bufs: &[&BufRef]) -> Result<()> {
        io.write_ordered(bufs)
    }
    fn setup_directory_remove(&self, io: &Io, bufs: &[&BufRef]) -> Result<()> {
        io.write_ordered(bufs)
    }
    fn setup_link_add(&self, io: &Io, bufs: &[&BufRef]) -> Result<()> {
        io.write_ordered(bufs)
    }
    /// Left dirty: the syncer or the next ordered write of the block carries it, always
    /// after the removal it follows is durable (op_done flushed it). A crash before then
    /// leaves a link count one too high: a leak fsck reclaims, never a lost file.
    fn setup_link_remove(&self, _: &Io, _: &[&BufRef]) -> Result<()> {
        Ok(())
    }
    fn setup_freeblocks(&self, io: &Io, bufs: &[&BufRef]) -> Result<()> {
        io.write_ordered(bufs)
    }
    fn setup_attr_change(&self, io: &Io, bufs: &[&BufRef]) -> Result<()> {
        io.write_ordered(bufs)
    }
    fn op_done(&self, io: &Io) -> Result<()> {
        io.barrier()
    }
    fn write_back(&self, io: &Io, durable: bool) -> Result<()> {
        io.write_back_ordered(durable)
    }
}
