//! `async` (named `Delayed` because `async` is a Rust keyword): FFS mounted async. Every
//! fact only leaves its buffers dirty, and what is freed is released at once; the syncer
//! and memory pressure write the buffers in block order with no regard for the rules. The
//! fast, unsafe upper bound the papers normalize against (000 §4): a crash can leave any
//! subset of the delayed writes on disk.

use std::time::Duration;

use cairn_vfs::Result;
use cairn_vfs::modes::Commit;

use super::{
    Apply, DirChange, DirRemove, Engine, FreeBlocks, FreeFile, IoModel, Release, Strategy, SyncWhy,
    Tx,
};

pub struct Delayed;

impl Strategy for Delayed {
    fn name(&self) -> &'static str {
        "async"
    }
    fn commit_policy(&self) -> Commit {
        Commit::Async
    }
    fn syncer_interval(&self) -> Duration {
        Duration::from_secs(30)
    }
    /// Nothing is ordered, so nothing needs the engine's lock around a write: the syncer,
    /// memory pressure, fsync, sync(2) and streams never stall other calls.
    fn io_model(&self) -> IoModel {
        IoModel::Concurrent
    }
    fn setup_directory_remove(&self, _: &mut Tx, _: &DirRemove) -> Result<Apply> {
        Ok(Apply::Now)
    }
    fn setup_directory_change(&self, _: &mut Tx, _: &DirChange) -> Result<Apply> {
        Ok(Apply::Now)
    }
    fn setup_freeblocks(&self, tx: &mut Tx, f: &FreeBlocks) -> Result<()> {
        if !f.freed.is_empty() {
            tx.release(Release::Blocks(f.freed.to_vec()));
        }
        Ok(())
    }
    fn setup_freefile(&self, tx: &mut Tx, f: &FreeFile) -> Result<()> {
        tx.release(Release::Inode {
            ino: f.ino,
            is_dir: f.is_dir,
        });
        Ok(())
    }
    /// Every dirty buffer, in block order, no barriers.
    fn sync(&self, e: &dyn Engine, why: SyncWhy) -> Result<()> {
        e.io().write_back_unordered(why.durable())
    }
}
