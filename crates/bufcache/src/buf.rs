//! One cached block.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard, ReentrantMutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A block address on the device.
pub type BlockNo = u64;

/// A shared handle on a cached block. While anyone holds one, the buffer is never evicted.
pub type BufRef = Arc<Buf>;

/// A cached block: its contents plus the per-buffer state the cache and the consistency
/// strategies keep (dirty flag, LSN range, dependency slot, kind tag).
pub struct Buf {
    blkno: BlockNo,
    data: RwLock<Vec<u8>>,
    /// Changed only under the cache's state lock so that it always agrees with the cache's
    /// dirty index; read without it.
    pub(crate) dirty: AtomicBool,
    /// Bumped by every `write()` (after the lock is taken) and every `mark_dirty`. The
    /// write-back records it while copying the contents and clears the dirty flag only if it
    /// is unchanged when the write completes, so a modification made during the write is
    /// never lost.
    pub(crate) generation: AtomicU64,
    low_lsn: AtomicU64,
    high_lsn: AtomicU64,
    deps: Mutex<Option<Box<dyn Any + Send>>>,
    kind: AtomicU8,
    /// Held from the copy of the contents through `before_write`, the device write and
    /// `after_write` (or `write_failed`), so a strategy never sees two writes of one buffer
    /// overlap, and `invalidate` can wait for a write in flight. Reentrant so a hook that
    /// touches a buffer of its own cluster (e.g. invalidates it) cannot deadlock its thread.
    pub(crate) io: ReentrantMutex<()>,
    /// Set by `invalidate`: the buffer no longer belongs to the cache and is never written.
    pub(crate) detached: AtomicBool,
}

impl Buf {
    pub(crate) fn new(blkno: BlockNo, data: Vec<u8>) -> Buf {
        Buf {
            blkno,
            data: RwLock::new(data),
            dirty: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            low_lsn: AtomicU64::new(0),
            high_lsn: AtomicU64::new(0),
            deps: Mutex::new(None),
            kind: AtomicU8::new(0),
            io: ReentrantMutex::new(()),
            detached: AtomicBool::new(false),
        }
    }

    pub fn blkno(&self) -> BlockNo {
        self.blkno
    }

    /// The contents (`len() ==` block size).
    pub fn read(&self) -> RwLockReadGuard<'_, Vec<u8>> {
        self.data.read()
    }

    /// The contents, for modification. Call [`crate::BufferCache::mark_dirty`] afterwards
    /// (while still holding the guard or after dropping it); call [`Buf::note_lsn`] while
    /// holding the guard. Do not resize the vector.
    pub fn write(&self) -> RwLockWriteGuard<'_, Vec<u8>> {
        let guard = self.data.write();
        self.generation.fetch_add(1, Ordering::AcqRel);
        guard
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    /// Oldest log record describing a change not yet on disk in this block (0 = none).
    pub fn low_lsn(&self) -> u64 {
        self.low_lsn.load(Ordering::Acquire)
    }

    /// Newest log record describing a change to this block (0 = none): write-ahead logging
    /// forces the log up to here before the block is written.
    pub fn high_lsn(&self) -> u64 {
        self.high_lsn.load(Ordering::Acquire)
    }

    /// Records that log record `lsn` describes a change to this buffer: sets the low LSN if
    /// unset and raises the high LSN. Both return to 0 once a write of the buffer completes
    /// with no change made since its contents were copied. `lsn == 0` is ignored.
    ///
    /// Call it while holding the [`Buf::write`] guard of the change it describes: the
    /// write-back copies the contents under the read lock, so the copy then can never
    /// include a change whose LSN the `before_write` hook does not see.
    pub fn note_lsn(&self, lsn: u64) {
        if lsn == 0 {
            return;
        }
        let _ = self
            .low_lsn
            .compare_exchange(0, lsn, Ordering::AcqRel, Ordering::Acquire);
        self.high_lsn.fetch_max(lsn, Ordering::AcqRel);
    }

    pub(crate) fn reset_lsns(&self) {
        self.low_lsn.store(0, Ordering::Release);
        self.high_lsn.store(0, Ordering::Release);
    }

    /// Slot for a consistency strategy's per-buffer dependency list (soft updates'
    /// worklist). The cache never looks inside and never clears it, not even on
    /// `invalidate` or `get_new`.
    pub fn deps(&self) -> MutexGuard<'_, Option<Box<dyn Any + Send>>> {
        self.deps.lock()
    }

    /// A class tag set by the file system (superblock, group, inode, directory, indirect,
    /// data...) so strategies and statistics can tell buffers apart. Default 0.
    pub fn set_kind(&self, k: u8) {
        self.kind.store(k, Ordering::Relaxed);
    }

    pub fn kind(&self) -> u8 {
        self.kind.load(Ordering::Relaxed)
    }

    /// Says that the image being written does not hold everything in the buffer (a
    /// `before_write` hook rolled something back), so the buffer must stay dirty after this
    /// write and be written again later. Call it from `before_write` or `after_write`.
    pub fn keep_dirty(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether [`crate::BufferCache::invalidate`] dropped this buffer from the cache.
    pub fn is_invalidated(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }
}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf")
            .field("blkno", &self.blkno)
            .field("dirty", &self.is_dirty())
            .field("kind", &self.kind())
            .field("low_lsn", &self.low_lsn())
            .field("high_lsn", &self.high_lsn())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_range_tracks_first_and_highest() {
        let b = Buf::new(1, vec![0; 8]);
        assert_eq!((b.low_lsn(), b.high_lsn()), (0, 0));
        b.note_lsn(0);
        assert_eq!((b.low_lsn(), b.high_lsn()), (0, 0));
        b.note_lsn(10);
        b.note_lsn(30);
        b.note_lsn(20);
        assert_eq!((b.low_lsn(), b.high_lsn()), (10, 30));
        b.reset_lsns();
        b.note_lsn(40);
        assert_eq!((b.low_lsn(), b.high_lsn()), (40, 40));
    }

    #[test]
    fn write_guard_and_keep_dirty_bump_generation() {
        let b = Buf::new(1, vec![0; 8]);
        let g0 = b.generation.load(Ordering::Acquire);
        b.write()[0] = 1;
        let g1 = b.generation.load(Ordering::Acquire);
        assert!(g1 > g0);
        drop(b.read());
        assert_eq!(b.generation.load(Ordering::Acquire), g1);
        b.keep_dirty();
        assert!(b.generation.load(Ordering::Acquire) > g1);
    }

    #[test]
    fn deps_slot_holds_any_strategy_state() {
        let b = Buf::new(1, vec![0; 8]);
        *b.deps() = Some(Box::new(vec![1u32, 2]));
        let deps = b.deps();
        let v = deps.as_ref().unwrap().downcast_ref::<Vec<u32>>().unwrap();
        assert_eq!(v, &vec![1, 2]);
        b.set_kind(3);
        assert_eq!(b.kind(), 3);
    }
}
