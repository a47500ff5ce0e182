//! One cached block.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use parking_lot::{
    MappedRwLockWriteGuard, Mutex, MutexGuard, ReentrantMutex, RwLock, RwLockReadGuard,
    RwLockWriteGuard,
};

use crate::undo::UndoShared;

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
    /// The cache's undo state (None for a buffer made outside a cache). [`Buf::write`]
    /// saves the contents into the open undo scope the first time it runs in that scope.
    undo: Option<Arc<UndoShared>>,
    /// The last undo scope that saved (part of) this buffer's contents: the cache does not
    /// evict it while that scope is open. Changed only under the contents' write lock.
    pub(crate) undo_touched: AtomicU64,
    /// The last undo scope that saved the whole contents (or created the buffer): later
    /// changes in that scope need no save.
    pub(crate) undo_full: AtomicU64,
    /// Which 1/64ths of the contents the scope `undo_touched` has saved (for
    /// [`Buf::write_range`]; meaningless once that scope has ended).
    undo_saved: AtomicU64,
    /// Which 1/64ths of the contents changed since the last [`Buf::take_touched`] (all of
    /// them for a new buffer): set by every change, under the contents' write lock, so a
    /// strategy that compares the contents with an image it keeps (the journal's diff base)
    /// need look only at these.
    touched: AtomicU64,
}

impl Buf {
    #[cfg(test)]
    pub(crate) fn new(blkno: BlockNo, data: Vec<u8>) -> Buf {
        Buf::with_undo(blkno, data, None)
    }

    pub(crate) fn with_undo(blkno: BlockNo, data: Vec<u8>, undo: Option<Arc<UndoShared>>) -> Buf {
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
            undo,
            undo_touched: AtomicU64::new(0),
            undo_full: AtomicU64::new(0),
            undo_saved: AtomicU64::new(0),
            touched: AtomicU64::new(u64::MAX),
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
    ///
    /// While an undo scope is open ([`crate::BufferCache::begin_undo`]), the first `write` of
    /// the buffer in that scope saves the whole contents, dirty flag and kind first: the
    /// before-image a rollback restores. Every modification goes through here or
    /// [`Buf::write_range`], so no change can escape the undo.
    pub fn write(&self) -> RwLockWriteGuard<'_, Vec<u8>> {
        let guard = self.data.write();
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.touched.store(u64::MAX, Ordering::Release);
        if let Some(scope) = self.undo_scope() {
            // The contents' write lock is held: no other writer of this buffer races
            // between the check and the stores.
            if self.undo_full.load(Ordering::Acquire) != scope {
                self.undo_full.store(scope, Ordering::Release);
                self.undo_touched.store(scope, Ordering::Release);
                if let Some(u) = &self.undo {
                    u.save(self, 0, Some(&guard));
                }
            }
        }
        guard
    }

    /// Bytes `at..at + len` of the contents, for modification (same rules as
    /// [`Buf::write`]). Inside an undo scope only these bytes are saved (rounded out to
    /// 1/64ths of the block, each saved once per scope), so a change of a few bytes (an
    /// inode, a bitmap bit, a pointer, a directory chunk) costs a copy of a few bytes, not of
    /// the block. The range is cut to the block.
    pub fn write_range(&self, at: usize, len: usize) -> MappedRwLockWriteGuard<'_, [u8]> {
        let guard = self.data.write();
        self.generation.fetch_add(1, Ordering::AcqRel);
        let end = at.saturating_add(len).min(guard.len());
        let at = at.min(end);
        if at < end {
            let grain = Self::grain_of(guard.len());
            let (g0, g1) = (at / grain, (end - 1) / grain);
            self.touched
                .fetch_or((u64::MAX >> (63 - (g1 - g0))) << g0, Ordering::AcqRel);
        }
        if let Some(scope) = self.undo_scope()
            && self.undo_full.load(Ordering::Acquire) != scope
            && at < end
        {
            let grain = Self::grain_of(guard.len());
            let (g0, g1) = (at / grain, (end - 1) / grain);
            let want = (u64::MAX >> (63 - (g1 - g0))) << g0;
            let have = if self.undo_touched.swap(scope, Ordering::AcqRel) == scope {
                self.undo_saved.load(Ordering::Acquire)
            } else {
                0
            };
            if want & !have != 0 {
                self.undo_saved.store(have | want, Ordering::Release);
                let (s0, s1) = (g0 * grain, ((g1 + 1) * grain).min(guard.len()));
                if let Some(u) = &self.undo {
                    u.save(self, s0, Some(&guard[s0..s1]));
                }
            }
        }
        RwLockWriteGuard::map(guard, |v| &mut v[at..end])
    }

    /// The contents, for a modification the open undo scope must not record: only for a
    /// change made after the operation's last point of failure (so no rollback can
    /// follow it), where saving a before-image would be wasted work (a data block
    /// overwritten by a write). Otherwise as [`Buf::write`].
    pub fn write_untracked(&self) -> RwLockWriteGuard<'_, Vec<u8>> {
        let guard = self.data.write();
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.touched.store(u64::MAX, Ordering::Release);
        guard
    }

    /// Bytes per bit of [`Buf::take_touched`]'s mask for contents of `len` bytes: a 64th
    /// (64 bytes of a 4 KiB block), at least one.
    pub fn grain_of(len: usize) -> usize {
        len.div_ceil(64).max(1)
    }

    /// Which 1/64ths of the contents (bit `i`: bytes `i * grain..(i + 1) * grain`,
    /// [`Buf::grain_of`]) changed since the last call, and clears the mask: a change outside
    /// them has not been made since. Every buffer starts with all bits set, and
    /// [`Buf::write`], [`Buf::write_untracked`] and a rollback set all. Call it while holding
    /// the [`Buf::read`] guard of the contents compared, so no change falls between the two.
    pub fn take_touched(&self) -> u64 {
        self.touched.swap(0, Ordering::AcqRel)
    }

    /// The open undo scope, if this buffer belongs to the cache and one is open.
    fn undo_scope(&self) -> Option<u64> {
        let scope = self.undo.as_ref()?.scope();
        (scope != 0 && !self.is_invalidated()).then_some(scope)
    }

    /// Replaces the contents without saving a before-image (a rollback restoring one).
    pub(crate) fn restore(&self, image: &[u8]) {
        let mut data = self.data.write();
        data.clear();
        data.extend_from_slice(image);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.touched.store(u64::MAX, Ordering::Release);
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
