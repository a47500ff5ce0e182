//! The device-facing side a strategy works with: the buffer cache plus the barrier
//! bookkeeping. `Io` knows nothing of modes; each strategy decides what to write when.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_bufcache::{Buf, BufRef, BufferCache};
use cairn_vfs::Result;
use parking_lot::Mutex;

use crate::format::kind;

pub struct Io {
    pub cache: Arc<BufferCache>,
    /// Batches of writes issued so far (each counted once it returned)...
    written: AtomicU64,
    /// ...and how many of them a completed flush covers. A barrier flushes only if
    /// `written > flushed`.
    flushed: AtomicU64,
    /// Held across a barrier's flush: a thread whose writes a flush in progress covers
    /// waits for it and then finds nothing to do, so concurrent barriers share flushes and
    /// none returns before its own writes are durable.
    flush_lock: Mutex<()>,
}

impl Io {
    pub fn new(cache: Arc<BufferCache>) -> Io {
        Io {
            cache,
            written: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            flush_lock: Mutex::new(()),
        }
    }

    /// Records a batch of writes that returned (the next barrier must flush).
    fn mark_written(&self) {
        self.written.fetch_add(1, Ordering::AcqRel);
    }

    /// One ordered step: a barrier (everything written before is durable), then the step's
    /// dirty buffers, written now. Clean buffers in `bufs` are skipped.
    pub fn write_step(&self, bufs: &[&BufRef]) -> Result<()> {
        self.barrier()?;
        self.write_unordered(bufs)
    }

    /// Writes the dirty buffers of `bufs` now, with no barrier before them (the next
    /// barrier flushes them).
    pub fn write_unordered(&self, bufs: &[&BufRef]) -> Result<()> {
        let dirty: Vec<&BufRef> = bufs.iter().copied().filter(|b| b.is_dirty()).collect();
        if !dirty.is_empty() {
            self.cache.write_now(&dirty)?;
            self.mark_written();
        }
        Ok(())
    }

    /// Flushes if anything was written since the last flush: when this returns, every
    /// write counted before it was called is durable. A failed flush leaves them counted as
    /// unflushed, so the next barrier tries again.
    pub fn barrier(&self) -> Result<()> {
        let target = self.written.load(Ordering::Acquire);
        if self.flushed.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        let _g = self.flush_lock.lock();
        if self.flushed.load(Ordering::Acquire) >= target {
            // A flush that started after our writes returned has covered them.
            return Ok(());
        }
        let covered = self.written.load(Ordering::Acquire);
        self.cache.flush_device()?;
        self.flushed.fetch_max(covered, Ordering::AcqRel);
        Ok(())
    }

    /// Writes `bufs` (marked dirty) now and flushes: the superblock at mount and unmount.
    pub fn write_durable(&self, bufs: &[&BufRef]) -> Result<()> {
        self.cache.write_now(bufs)?;
        self.cache.flush_device()?;
        Ok(())
    }

    /// Writes file data straight to the device from `blk` on, bypassing the cache (a
    /// stream's whole, uncached blocks), after any write still in flight of a freed buffer
    /// of those blocks (`BufferCache::write_uncached`: with no engine lock held, a stream
    /// can overlap the syncer's write of the blocks' previous owner). Not counted by the
    /// barrier: data is ordered only by fsync, which writes cached data itself.
    pub fn write_stream(&self, blk: u64, data: &[u8]) -> Result<()> {
        self.cache.write_uncached(blk, data)?;
        Ok(())
    }

    /// Gives new data blocks their zeros on the device — one zero-range request per run
    /// `(first, count)`, no buffer — and flushes: when this returns the zeros are durable
    /// (what `DataZeroed` then declares). A write still in flight of a freed buffer of one
    /// of the blocks is waited for first (`BufferCache::zero_uncached`).
    pub fn write_zeros(&self, runs: &[(u64, u64)]) -> Result<()> {
        for &(first, count) in runs {
            self.cache.zero_uncached(first, count)?;
            self.mark_written();
        }
        self.barrier()
    }

    /// Writes every dirty group block (bitmaps, descriptors). A barrier comes first: a
    /// group block may carry freed bits whose cleared pointers were written but not yet
    /// flushed (rule 2: the bitmap may free a block only after no pointer to it is on disk).
    pub fn write_groups(&self) -> Result<()> {
        self.barrier()?;
        self.write_groups_unordered()
    }

    /// Writes every dirty group block with no barrier before it.
    pub fn write_groups_unordered(&self) -> Result<()> {
        self.cache
            .write_back_filter(&|b: &Buf| b.kind() == kind::GROUP)?;
        self.mark_written();
        Ok(())
    }

    /// Writes every dirty buffer in rule order (group blocks, barrier, the rest) and, if
    /// `durable`, flushes at the end.
    pub fn write_back_ordered(&self, durable: bool) -> Result<()> {
        self.write_groups()?;
        self.barrier()?;
        self.cache.write_back_all()?;
        self.mark_written();
        if durable {
            self.barrier()?;
        }
        Ok(())
    }

    /// fsync of one file whose dirty data and indirect blocks are `blocks`: its data and
    /// the group blocks (bitmaps) that allocated it, a barrier, its indirect blocks (the
    /// pointers to that data) behind a barrier of their own, then every dirty metadata
    /// buffer (inodes, directories: the file's name may not be on disk yet), and a flush.
    /// Other files' data stays in the cache. Every pointer reaches disk after what it points
    /// to — data, then indirect blocks, then the inode — so while the fsync is in flight the
    /// file never shows zeros or another file's blocks within its size on disk (an inode
    /// written with its indirect block in one epoch could land alone: its new size over a
    /// hole), and an fsynced file never shows stale blocks after a crash.
    pub fn fsync_file(&self, blocks: &[BufRef]) -> Result<()> {
        let (data, indirect): (Vec<&BufRef>, Vec<&BufRef>) = blocks
            .iter()
            .filter(|b| b.is_dirty())
            .partition(|b| b.kind() != kind::INDIRECT);
        if !data.is_empty() {
            self.cache.write_now(&data)?;
            self.mark_written();
        }
        self.write_groups()?;
        if !indirect.is_empty() {
            self.barrier()?;
            self.cache.write_now(&indirect)?;
            self.mark_written();
        }
        self.barrier()?;
        self.cache
            .write_back_filter(&|b: &Buf| b.kind() != kind::DATA)?;
        self.mark_written();
        self.barrier()
    }

    /// Writes every dirty buffer with no ordering at all.
    pub fn write_back_unordered(&self, durable: bool) -> Result<()> {
        self.cache.write_back_all()?;
        self.mark_written();
        if durable {
            self.barrier()?;
        }
        Ok(())
    }
}
