//! cairn's buffer cache.
//!
//! A cache of whole blocks over an `Arc<dyn BlockDevice>`: a memory budget with LRU
//! eviction, delayed writes gathered into clustered device writes (contiguous dirty blocks,
//! up to `max_cluster_bytes` per write), an optional syncer thread, and the write hooks that
//! the consistency strategies are built on.
//!
//! # The write hooks
//!
//! Every device write of a buffer the cache issues — from [`BufferCache::write_now`],
//! [`BufferCache::write_back_all`] / [`BufferCache::write_back_filter`] / [`BufferCache::sync`],
//! the syncer thread, or eviction under memory pressure (unless the hooks defer it:
//! [`WriteHooks::on_pressure`]) — goes through one path, which calls the installed
//! [`WriteHooks`] around it. (The one exception is an undo rollback's writes, below: images
//! that already went through the hooks, or contents from before the scope.) Per buffer, in
//! this order:
//!
//! 1. The buffer's I/O lock is taken (buffers of one cluster in ascending block order). It
//!    is held until step 5, so two writes of the same buffer never overlap and a strategy
//!    always sees `before_write`, then `after_write` (or `write_failed`), before the next
//!    `before_write` of that buffer.
//! 2. The contents are copied into a private *image* under the buffer's read lock, and the
//!    buffer's modification generation is recorded.
//! 3. **`before_write(buf, image)`** runs. The hook may change `image` — this is where soft
//!    updates *rolls back* pointers whose dependencies are unsatisfied (Soft Updates paper,
//!    002 §3: "undo/redo at write time"; an inode's unsafe block pointer is nullified and its
//!    size reduced, an unsafe directory entry's inode number is cleared) — and may do I/O
//!    first — this is where write-ahead logging forces its log up to [`Buf::high_lsn`]
//!    (000/001 §3: "all log information up to the last log entry relating to the
//!    to-be-written block must be flushed"). The buffer's own contents are never touched by
//!    the cache, so, unlike FreeBSD, the roll back is invisible to readers and the buffer
//!    does not need locking against them during the write: the *roll forward* is simply
//!    not having changed the buffer. A hook that rolled something back must call
//!    [`Buf::keep_dirty`] so the buffer stays dirty and is written again later. An error
//!    from `before_write` abandons the whole cluster: nothing is written.
//! 4. The cluster's image is written with one device write (not flushed).
//! 5. **`after_write(buf)`** runs for each buffer once the write returned successfully:
//!    soft updates marks the dependencies the written image satisfied as complete (and may
//!    make others' work ready); write-ahead logging may note that the log space up to
//!    [`Buf::low_lsn`] is reclaimable once the data is flushed. Then the buffer becomes clean
//!    — its dirty flag is cleared and its LSNs are reset to 0 — *unless* it was modified (or
//!    `keep_dirty` was called) since step 2. If `before_write` failed for a later buffer of
//!    the cluster or the device write failed, **`write_failed(buf)`** runs instead for every
//!    buffer whose `before_write` succeeded, and the buffers stay dirty.
//!
//! After every device flush the cache issues ([`BufferCache::flush_device`],
//! [`BufferCache::sync`], [`BufferCache::shutdown`]), **`after_flush()`** runs: every write
//! whose `after_write` ran before the flush started is durable.
//!
//! Two more tell the strategy what the cache decides on its own: **`invalidated(buf)`** when
//! [`BufferCache::invalidate`] dropped a freed block's buffer (the cache never writes it
//! again), and **`on_pressure()`** when the cache is
//! over budget with only dirty buffers left to evict: the strategy says whether the cache
//! may write them (`EvictDirty`) or must leave the order of writes to it (`Defer`: the
//! budget goes soft until the strategy writes back).
//!
//! ## What a hook may and may not do
//! - May: modify `image`; read the buffer ([`Buf::read`]), its LSNs, kind and
//!   [`Buf::deps`]; lock other buffers' `deps`; call `keep_dirty`; call cache methods that
//!   do not write back in bulk: `read`, `lookup`, `get_new`, `mark_dirty` (on any buffer,
//!   including this one), `invalidate`, and `write_now`/`flush_device` *of blocks that are
//!   never written through a hook that itself writes* (a log's own blocks), or write to the
//!   device directly.
//! - May not: call `write_back_all`, `write_back_filter`, `sync` or `shutdown` (they wait
//!   for the I/O locks of buffers this thread may hold: deadlock); take [`Buf::write`] on
//!   a buffer being written by this cluster if the caller of the write could hold its read
//!   guard; hold a lock across the hook that a thread calling into the cache might hold
//!   while waiting for a write.
//! - Hooks run on whichever thread triggered the write (an application thread in
//!   `write_now`, the syncer, or any thread whose `read` caused an eviction), never with the
//!   cache's internal lock held.
//!
//! ## Lock order
//! `buffer I/O locks (ascending block order)` → `hooks` → `buffer read lock` (briefly, to
//! copy) and `cache state lock` (briefly, never across I/O or hooks). A caller must not
//! hold a buffer's [`Buf::write`] guard while calling a cache method that writes that
//! buffer (`write_now`, `write_back_*`, `sync`): the copy needs the read lock.
//!
//! ## Rules for callers
//! - Modify a buffer only through [`Buf::write`], and call [`BufferCache::mark_dirty`]
//!   after (or while) modifying it; call [`Buf::note_lsn`] while holding the write guard.
//! - Call [`BufferCache::invalidate`] for a freed block *before* the block can be allocated
//!   again. It never waits for a write in flight (the caller may hold its own lock); the
//!   next read or write of the block (a direct one, [`BufferCache::write_uncached`],
//!   included) waits for that write instead, so a stale image can never land on top of the
//!   block's next contents.
//! - Dropping the cache does not write dirty buffers (so tests can simulate a crash); call
//!   [`BufferCache::shutdown`] or [`BufferCache::sync`] to keep them.
//!
//! # Undo: taking back a failed operation
//!
//! A file-system operation changes several buffers and may fail halfway (no space left,
//! a device error, corruption found). [`BufferCache::begin_undo`] opens a scope;
//! [`BufferCache::commit_undo`] keeps what the scope did, [`BufferCache::rollback_undo`]
//! takes it back. While a scope is open the cache records, at no cost to buffers the scope
//! does not touch:
//!
//! - the *before-image* of every byte the scope changes: the first [`Buf::write`] of a
//!   buffer in the scope copies its whole contents, dirty flag and kind; [`Buf::write_range`]
//!   copies only the bytes it hands out (rounded to 1/64ths of the block, each once per
//!   scope). Every modification goes through one of them, so none escapes (the one
//!   exception, [`Buf::write_untracked`], is for changes made after the operation's last
//!   point of failure). A buffer `get_new` creates is recorded as "absent". The copies are
//!   recycled: a warm cache saves without allocating;
//! - every buffer [`BufferCache::invalidate`] drops, so a rollback can put it back;
//! - every device write the cache issues (the cluster image it already had) and every
//!   flush: the writes between two flushes form an *epoch*.
//!
//! Buffers the open scope touched are not evicted until it ends.
//!
//! A rollback gives every recorded buffer its contents from the start of the scope and
//! drops the buffers the scope created. On the device it writes the scope's epochs back in
//! reverse order, each followed by a flush: every block an epoch wrote gets the image it had
//! before that epoch. **Invariant**: every state the device passes through during a rollback
//! is a state a crash during the scope's own writes could have left (a mix of one epoch's
//! blocks before and after it), so a rollback is exactly as crash-safe as the operation it
//! takes back, and when it completes the device holds, for every block the scope changed,
//! the contents the cache holds. If the device refuses the rollback's writes, they stay
//! pending and go first before any later write, flush or scope of the cache.
//!
//! Rules: one scope at a time, and every buffer modification made while it is open belongs
//! to it (the caller serializes its operations; the ffs engine holds its state lock). Device
//! writes that bypass the cache are not recorded. Write-back by other threads (a syncer, a
//! memory-pressure write-back, an fsync of another file, run without the caller's lock) may
//! go on while a scope is open: their writes of blocks the scope changed are recorded like the
//! scope's own (the device half of a rollback puts those blocks back too), and a rollback
//! first waits for such writes in flight and keeps new ones out until the buffers are
//! restored (it holds their I/O locks), so the device and the cache agree when it returns. A buffer the scope created with `get_new`
//! must be for a block the scope allocated, if the scope writes it: the rollback does not
//! restore what the device held there. The rollback's own writes bypass the write hooks:
//! they are images that already went through them, or contents from before the scope.
//!
//! # Memory budget
//! `budget_bytes` bounds the cached blocks (metadata per buffer is not counted). When an
//! insertion goes over budget, clean buffers nobody holds are evicted, least recently used
//! first; if that is not enough, the least recently used dirty ones are written back
//! (through the hooks) and evicted — unless the hooks answer [`Pressure::Defer`], in which
//! case the budget is exceeded until the strategy writes back. Buffers someone holds (a [`BufRef`] besides the
//! cache's) are never evicted, so the budget can be exceeded while they are held. A dirty
//! buffer is never dropped except by `invalidate`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_blockdev::BlockDevice;
use parking_lot::{Condvar, Mutex, RwLock};

mod buf;
mod undo;

pub use buf::{BlockNo, Buf, BufRef};

use undo::{Replay, UndoShared};

/// Called by the cache around every device write of a buffer (see the crate documentation
/// for when they run and what they may do).
pub trait WriteHooks: Send + Sync {
    /// `image` is a private copy of the buffer's contents that will be written; the hook may
    /// change it (roll back) and may do I/O first (force a log). The buffer's own contents
    /// are not touched.
    fn before_write(&self, buf: &Buf, image: &mut [u8]) -> io::Result<()> {
        let _ = (buf, image);
        Ok(())
    }
    /// The write of `buf` has completed (not necessarily flushed).
    fn after_write(&self, buf: &Buf) {
        let _ = buf;
    }
    /// The write prepared by a successful `before_write` did not happen (another buffer's
    /// hook failed or the device write failed): nothing of `image` reached the device.
    fn write_failed(&self, buf: &Buf) {
        let _ = buf;
    }
    /// Called after each device flush the cache issues (writes before it are durable).
    fn after_flush(&self) {}
    /// The block of `buf` was freed: [`BufferCache::invalidate`] dropped the buffer (unwritten
    /// if it was dirty). The cache will never write it again (a write of it already in
    /// flight still completes, with its `after_write` or `write_failed`); a strategy drops
    /// what it tracked on it (soft updates: dependencies of a freed block are moot).
    fn invalidated(&self, buf: &Buf) {
        let _ = buf;
    }
    /// The cache is over its budget and every clean buffer it could drop is gone. With
    /// [`Pressure::EvictDirty`] (the default) it writes the least recently used dirty
    /// buffers through these hooks and evicts them; with [`Pressure::Defer`] it writes
    /// nothing, lets the budget be exceeded, and leaves it to the strategy to write back in
    /// its own order (a file system that must order its writes never has one forced out by
    /// a read on an unrelated thread).
    fn on_pressure(&self) -> Pressure {
        Pressure::EvictDirty
    }
}

/// What the cache does about dirty buffers when it is over budget ([`WriteHooks::on_pressure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pressure {
    /// Write the least recently used dirty buffers and evict them.
    EvictDirty,
    /// Write nothing: the budget becomes soft until the strategy writes back.
    Defer,
}

/// Hooks that do nothing: the `sync` and `delayed` strategies need no per-write work.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl WriteHooks for NoHooks {}

/// Tunables of a [`BufferCache`].
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Bytes of block contents to keep cached (default 256 MiB).
    pub budget_bytes: u64,
    /// How often the syncer thread writes back every dirty buffer; `None` = no syncer.
    pub syncer_interval: Option<Duration>,
    /// Largest single device write of a cluster of contiguous dirty blocks (default 1 MiB;
    /// at least one block is always written).
    pub max_cluster_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            budget_bytes: 256 << 20,
            syncer_interval: None,
            max_cluster_bytes: 1 << 20,
        }
    }
}

/// Counters of a cache since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheStats {
    /// `read`s served from the cache.
    pub hits: u64,
    /// `read`s that went to the device.
    pub misses: u64,
    /// Buffers dropped to stay within the budget.
    pub evictions: u64,
    /// Buffers the evictions looked at (bounded per eviction: see `evict_if_needed`).
    pub eviction_scans: u64,
    /// Buffers written to the device.
    pub writebacks: u64,
    /// Device writes the cache issued; each carries one cluster of one or more contiguous
    /// buffers, so `writebacks / cluster_writes` is the mean cluster length.
    pub cluster_writes: u64,
    /// Device writes (or `before_write` hooks) that failed.
    pub write_errors: u64,
    /// Dirty buffers now.
    pub dirty_buffers: u64,
    /// Cached buffers now.
    pub cached_buffers: u64,
    /// Buffers put in the cache so far (a read's miss, a read-ahead, `get_new`, a rollback
    /// putting one back): how many buffers an operation made, whatever was evicted since.
    #[serde(default)]
    pub insertions: u64,
    /// Bytes of cached contents now.
    pub cached_bytes: u64,
    /// The configured budget.
    pub budget_bytes: u64,
}

struct Entry {
    buf: BufRef,
    /// Key of this buffer in `State::lru`.
    tick: u64,
}

/// Everything protected by the cache-wide lock. Invariants: `lru` has exactly one tick per
/// entry of `map`; `dirty` holds exactly the block numbers of the mapped buffers whose dirty
/// flag is set.
#[derive(Default)]
struct State {
    map: HashMap<BlockNo, Entry>,
    lru: BTreeMap<u64, BlockNo>,
    dirty: BTreeSet<BlockNo>,
    next_tick: u64,
    /// Buffers ever put in the map (`CacheStats::insertions`).
    inserted: u64,
}

impl State {
    /// A hit: the buffer of `blk`, moved to the young end of the LRU order unless it is
    /// already among the youngest quarter of the cache. Every tick after an entry's was given
    /// to one other entry at most, so an entry `age` ticks old has fewer than `age` entries
    /// younger than it: one younger than `map.len() / 4` ticks stays in the youngest quarter
    /// without moving, and is moved by the first hit after it leaves. Eviction takes from the
    /// old end, so it still never takes a buffer hit within the last quarter of the cache's
    /// turnover. What this saves: the two ordered-map updates of a hit on the blocks a file
    /// system asks for again and again in one call (an indirect block, a bitmap, a group
    /// descriptor: several hits per data block of a streaming read or write).
    fn touch(&mut self, blk: BlockNo) -> Option<BufRef> {
        let tick = self.next_tick;
        let young = (self.map.len() / 4) as u64;
        let e = self.map.get_mut(&blk)?;
        if tick - e.tick < young {
            return Some(Arc::clone(&e.buf));
        }
        self.move_young(blk)
    }

    /// Moves the buffer of `blk` to the young end of the LRU order, wherever it is.
    fn move_young(&mut self, blk: BlockNo) -> Option<BufRef> {
        let tick = self.next_tick;
        let e = self.map.get_mut(&blk)?;
        self.next_tick += 1;
        self.lru.remove(&e.tick);
        e.tick = tick;
        self.lru.insert(tick, blk);
        Some(Arc::clone(&e.buf))
    }

    fn insert(&mut self, buf: BufRef) {
        let tick = self.next_tick;
        self.next_tick += 1;
        self.inserted += 1;
        self.lru.insert(tick, buf.blkno());
        self.map.insert(buf.blkno(), Entry { buf, tick });
    }

    fn remove(&mut self, blk: BlockNo) -> Option<BufRef> {
        let e = self.map.remove(&blk)?;
        self.lru.remove(&e.tick);
        self.dirty.remove(&blk);
        Some(e.buf)
    }

    /// Whether `buf` is the buffer the cache holds for its block.
    fn owns(&self, buf: &Buf) -> bool {
        self.map
            .get(&buf.blkno())
            .is_some_and(|e| std::ptr::eq(Arc::as_ptr(&e.buf), buf))
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    eviction_scans: AtomicU64,
    writebacks: AtomicU64,
    cluster_writes: AtomicU64,
    write_errors: AtomicU64,
}

/// Shared between the cache and its syncer thread, so the syncer can be stopped without a
/// strong reference to the cache.
#[derive(Default)]
struct SyncerControl {
    stop: Mutex<bool>,
    wake: Condvar,
}

/// Whether a cluster write waits for buffers another thread is writing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LockMode {
    /// Wait: the caller needs the buffers written when it returns.
    Wait,
    /// Skip busy buffers: eviction only needs *some* buffers written, and must not wait on
    /// a buffer a hook of this very thread might be writing.
    Try,
}

/// The buffer cache. See the crate documentation.
pub struct BufferCache {
    dev: Arc<dyn BlockDevice>,
    block_size: usize,
    cfg: CacheConfig,
    hooks: RwLock<Arc<dyn WriteHooks>>,
    state: Mutex<State>,
    counters: Counters,
    syncer: Mutex<Option<JoinHandle<()>>>,
    control: Arc<SyncerControl>,
    /// The undo scope's log, shared with every buffer (see "Undo").
    undo: Arc<UndoShared>,
    /// Reverse epochs of a rollback whose device writes failed, oldest first; written
    /// before anything else the cache writes (see "Undo").
    pending_undo: Mutex<std::collections::VecDeque<undo::Epoch>>,
    /// Whether `pending_undo` may be non-empty (checked without its lock on every write).
    undo_owed: std::sync::atomic::AtomicBool,
    /// Buffers [`BufferCache::invalidate`] dropped while a write of them was in flight, by
    /// block. Attached by `invalidate` (which does not wait), freed by the next read or
    /// write of the block, which first waits for that old write: so its stale image can
    /// never land over the block's next contents, and the thread that freed the block (a
    /// file system holding its own lock) never waits for a device write.
    retiring: Mutex<HashMap<BlockNo, BufRef>>,
}

impl BufferCache {
    /// Creates a cache and, if `cfg.syncer_interval` is set, starts its syncer thread, which
    /// calls [`BufferCache::write_back_all`] every interval until the cache is dropped or
    /// shut down.
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        cfg: CacheConfig,
        hooks: Arc<dyn WriteHooks>,
    ) -> Arc<BufferCache> {
        let block_size = dev.block_size() as usize;
        let cache = Arc::new(BufferCache {
            dev,
            block_size,
            cfg,
            hooks: RwLock::new(hooks),
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            syncer: Mutex::new(None),
            control: Arc::new(SyncerControl::default()),
            undo: Arc::new(UndoShared::default()),
            pending_undo: Mutex::new(Default::default()),
            undo_owed: std::sync::atomic::AtomicBool::new(false),
            retiring: Mutex::new(HashMap::new()),
        });
        if let Some(interval) = cache.cfg.syncer_interval {
            let weak = Arc::downgrade(&cache);
            let control = Arc::clone(&cache.control);
            let spawned = std::thread::Builder::new()
                .name("cairn-syncer".into())
                .spawn(move || syncer(weak, control, interval));
            match spawned {
                Ok(handle) => *cache.syncer.lock() = Some(handle),
                Err(e) => log::error!("cannot start the syncer thread: {e}"),
            }
        }
        cache
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// The buffer of `blk`, from the cache or read from the device.
    pub fn read(&self, blk: BlockNo) -> io::Result<BufRef> {
        if let Some(buf) = self.state.lock().touch(blk) {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(buf);
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        self.read_missed(blk)
    }

    /// [`BufferCache::read`], and on a miss the uncached blocks of `start..start + count`
    /// (which holds `blk`) read with it as [`BufferCache::prefetch`] reads them: a cluster
    /// of blocks the caller will likely want next (an inode table's neighbours), in one
    /// device read. One hit or one miss is counted, as for `read`. A failed read-ahead is
    /// not the call's error: `blk` alone is read then.
    pub fn read_around(&self, blk: BlockNo, start: BlockNo, count: u64) -> io::Result<BufRef> {
        if let Some(buf) = self.state.lock().touch(blk) {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(buf);
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        if self.prefetch(start, count).is_ok()
            && let Some(buf) = self.state.lock().touch(blk)
        {
            return Ok(buf);
        }
        self.read_missed(blk)
    }

    /// The device read of a `read` that missed, its miss counted.
    fn read_missed(&self, blk: BlockNo) -> io::Result<BufRef> {
        self.wait_retiring(&[blk], &[]);
        let mut data = vec![0; self.block_size];
        self.dev.read_blocks(blk, &mut data)?;
        let buf = {
            let mut st = self.state.lock();
            // Another thread may have read or created the block while we were reading; its
            // buffer may already be newer than the device, so it wins.
            match st.touch(blk) {
                Some(existing) => existing,
                None => {
                    let buf = Arc::new(self.new_buf(blk, data));
                    st.insert(Arc::clone(&buf));
                    buf
                }
            }
        };
        self.evict_if_needed();
        Ok(buf)
    }

    /// Reads every uncached block of `start..start + count` from the device with as few
    /// device reads as possible (contiguous runs, at most `max_cluster_bytes` each) and caches
    /// them, for read-ahead. Cached blocks are left alone. Counts neither hits nor misses.
    /// Blocks being written back as they leave the cache are waited for first, as `read`
    /// waits for its block: read before their write lands, they would come back stale.
    pub fn prefetch(&self, start: BlockNo, count: u64) -> io::Result<()> {
        let max_blocks = self.max_cluster_blocks() as u64;
        let end = start.saturating_add(count);
        let mut blk = start;
        while blk < end {
            let missing = {
                let st = self.state.lock();
                let mut n = 0;
                while blk + n < end && n < max_blocks && !st.map.contains_key(&(blk + n)) {
                    n += 1;
                }
                if n == 0 {
                    blk += 1;
                    continue;
                }
                n
            };
            // As `read` does after its miss.
            self.wait_retiring_range(blk, missing);
            let mut data = vec![0; missing as usize * self.block_size];
            self.dev.read_blocks(blk, &mut data)?;
            {
                let mut st = self.state.lock();
                for (i, chunk) in data.chunks_exact(self.block_size).enumerate() {
                    let b = blk + i as u64;
                    if !st.map.contains_key(&b) {
                        st.insert(Arc::new(self.new_buf(b, chunk.to_vec())));
                    }
                }
            }
            self.evict_if_needed();
            blk += missing;
        }
        Ok(())
    }

    /// The cached buffer of `blk`, if any, without device I/O and without counting a hit.
    pub fn lookup(&self, blk: BlockNo) -> Option<BufRef> {
        self.state.lock().map.get(&blk).map(|e| Arc::clone(&e.buf))
    }

    /// A zero-filled buffer for a newly allocated block, without reading the device. If the
    /// block is cached, that same buffer is zeroed in place (so there is never more than one
    /// buffer per block); its dirty state, LSNs, kind and dependency slot are kept. Mark it
    /// dirty once it is filled. A block beyond the device is accepted here and fails when
    /// written.
    pub fn get_new(&self, blk: BlockNo) -> BufRef {
        let (buf, fresh) = {
            let mut st = self.state.lock();
            match st.touch(blk) {
                Some(buf) => (buf, false),
                None => {
                    let buf = Arc::new(self.new_buf(blk, vec![0; self.block_size]));
                    st.insert(Arc::clone(&buf));
                    (buf, true)
                }
            }
        };
        if fresh {
            // A buffer the open undo scope made: a rollback drops it again.
            let scope = self.undo.scope();
            if scope != 0 {
                buf.undo_full.store(scope, Ordering::Release);
                buf.undo_touched.store(scope, Ordering::Release);
                self.undo.save(&buf, 0, None);
            }
            self.evict_if_needed();
        } else {
            buf.write().fill(0);
        }
        buf
    }

    /// Marks `buf` dirty: it will be written by the next write-back and is never evicted
    /// unwritten. Ignored for a buffer that was invalidated (its block was freed).
    pub fn mark_dirty(&self, buf: &Buf) {
        let mut st = self.state.lock();
        buf.generation.fetch_add(1, Ordering::AcqRel);
        if buf.is_invalidated() || !st.owns(buf) {
            log::debug!("mark_dirty of block {} ignored: not cached", buf.blkno());
            return;
        }
        if !buf.dirty.swap(true, Ordering::AcqRel) {
            st.dirty.insert(buf.blkno());
        }
    }

    /// Writes these buffers now (clustered where contiguous, hooks applied), without a
    /// flush. They become clean unless modified during the write. Clean buffers are written
    /// too; invalidated ones are skipped.
    pub fn write_now(&self, bufs: &[&BufRef]) -> io::Result<()> {
        let mut v: Vec<BufRef> = bufs.iter().map(|b| Arc::clone(b)).collect();
        v.sort_by_key(|b| b.blkno());
        v.dedup_by(|a, b| Arc::ptr_eq(a, b));
        self.write_sorted(&v, LockMode::Wait, false)
    }

    /// Writes whole blocks from `blk` on straight to the device, bypassing the buffers: data
    /// nobody has cached (a file system's streaming writes). The blocks must not be cached.
    /// A write still in flight of a freed buffer of one of them is waited for first, so that
    /// stale image cannot land over the new contents; the pending writes of a refused
    /// rollback go first too. Not recorded by an undo scope (see "Undo").
    pub fn write_uncached(&self, blk: BlockNo, data: &[u8]) -> io::Result<()> {
        let n = (data.len() / self.block_size) as u64;
        let blks: Vec<BlockNo> = (blk..blk.saturating_add(n)).collect();
        self.wait_retiring(&blks, &[]);
        self.settle_undo()?;
        self.dev.write_blocks(blk, data)
    }

    /// Makes blocks `blk..blk + count` read as zeros on the device with one zero-range
    /// request ([`BlockDevice::zero_blocks`]: no buffer of zeros, none cached): a file
    /// system's new blocks whose initial contents are zeros. Same rules as
    /// [`BufferCache::write_uncached`]: the blocks must not be cached, a write in flight of
    /// a freed buffer of one of them is waited for first, a refused rollback's writes go
    /// first, and an undo scope does not record it (the blocks must be free when the scope
    /// began, so their contents do not matter to it). Not durable until a flush.
    pub fn zero_uncached(&self, blk: BlockNo, count: u64) -> io::Result<()> {
        self.wait_retiring_range(blk, count);
        self.settle_undo()?;
        self.dev.zero_blocks(blk, count)
    }

    /// Device barrier, then the `after_flush` hook.
    pub fn flush_device(&self) -> io::Result<()> {
        self.settle_undo()?;
        self.undo.note_flush();
        self.dev.flush()?;
        let hooks = Arc::clone(&*self.hooks.read());
        hooks.after_flush();
        Ok(())
    }

    /// Writes every dirty buffer, clustered, in block order; no flush. Every cluster is
    /// attempted; the first error is returned.
    pub fn write_back_all(&self) -> io::Result<()> {
        self.write_back_filter(&|_| true)
    }

    /// Like [`BufferCache::write_back_all`], for the dirty buffers matching `f` only (e.g.
    /// by kind), so a strategy can impose an order. `f` runs without any cache lock held.
    pub fn write_back_filter(&self, f: &dyn Fn(&Buf) -> bool) -> io::Result<()> {
        let dirty: Vec<BufRef> = {
            let st = self.state.lock();
            st.dirty
                .iter()
                .filter_map(|blk| st.map.get(blk).map(|e| Arc::clone(&e.buf)))
                .collect()
        };
        let chosen: Vec<BufRef> = dirty.into_iter().filter(|b| f(b)).collect();
        self.write_sorted(&chosen, LockMode::Wait, true)
    }

    /// `write_back_all` + `flush_device`.
    pub fn sync(&self) -> io::Result<()> {
        self.write_back_all()?;
        self.flush_device()
    }

    /// The block was freed: drop its buffer without writing it, even if dirty. Does not
    /// wait for a write of it already in flight: the buffer is kept aside (`retiring`) and
    /// the next read or write of the block waits for that write first, so it cannot land
    /// after the block's next contents. Holders of the buffer keep a detached copy that the
    /// cache ignores.
    ///
    /// Inside an undo scope the dropped buffer is kept in the scope's log: a rollback puts
    /// it back, contents and dirty flag included.
    pub fn invalidate(&self, blk: BlockNo) {
        let removed = {
            let mut st = self.state.lock();
            let buf = st.remove(blk);
            if let Some(b) = &buf {
                b.detached.store(true, Ordering::Release);
                let was_dirty = b.dirty.swap(false, Ordering::AcqRel);
                self.undo.note_detached(Arc::clone(b), was_dirty);
            }
            buf
        };
        if let Some(b) = removed {
            if b.io.try_lock().is_none() {
                let mut r = self.retiring.lock();
                // Entries whose write is over by now need no waiting any more.
                r.retain(|_, old| old.io.try_lock().is_none());
                r.insert(blk, Arc::clone(&b));
            }
            let hooks = Arc::clone(&*self.hooks.read());
            hooks.invalidated(&b);
        }
    }

    /// Waits for the writes in flight of dropped buffers of `blks` (other than `own`, the
    /// buffers the caller is about to write itself) and forgets them.
    fn wait_retiring(&self, blks: &[BlockNo], own: &[BufRef]) {
        let old: Vec<BufRef> = {
            let mut r = self.retiring.lock();
            if r.is_empty() {
                return;
            }
            blks.iter().filter_map(|b| r.remove(b)).collect()
        };
        for b in old {
            if !own.iter().any(|o| Arc::ptr_eq(o, &b)) {
                drop(b.io.lock());
            }
        }
    }

    /// [`BufferCache::wait_retiring`] for every block of `start..start + count`, without a
    /// list of them (a zero range may cover a million blocks; few are ever retiring).
    fn wait_retiring_range(&self, start: BlockNo, count: u64) {
        let end = start.saturating_add(count);
        let blks: Vec<BlockNo> = {
            let r = self.retiring.lock();
            r.keys()
                .copied()
                .filter(|b| (start..end).contains(b))
                .collect()
        };
        if !blks.is_empty() {
            self.wait_retiring(&blks, &[]);
        }
    }

    pub fn dirty_count(&self) -> usize {
        self.state.lock().dirty.len()
    }

    pub fn stats(&self) -> CacheStats {
        let (dirty, cached, insertions) = {
            let st = self.state.lock();
            (st.dirty.len() as u64, st.map.len() as u64, st.inserted)
        };
        let c = &self.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            eviction_scans: c.eviction_scans.load(Ordering::Relaxed),
            writebacks: c.writebacks.load(Ordering::Relaxed),
            cluster_writes: c.cluster_writes.load(Ordering::Relaxed),
            write_errors: c.write_errors.load(Ordering::Relaxed),
            dirty_buffers: dirty,
            cached_buffers: cached,
            insertions,
            cached_bytes: cached * self.block_size as u64,
            budget_bytes: self.cfg.budget_bytes,
        }
    }

    /// Replaces the hooks (strategies are chosen after the cache exists). Writes already past
    /// `before_write` finish with the hooks they started with.
    pub fn set_hooks(&self, hooks: Arc<dyn WriteHooks>) {
        *self.hooks.write() = hooks;
    }

    /// Stops the syncer thread (waiting for a pass in progress), then syncs.
    pub fn shutdown(&self) -> io::Result<()> {
        self.stop_syncer();
        self.sync()
    }

    fn stop_syncer(&self) {
        *self.control.stop.lock() = true;
        self.control.wake.notify_all();
        let handle = self.syncer.lock().take();
        if let Some(h) = handle {
            // shutdown() called from a hook running on the syncer thread must not join it.
            if h.thread().id() != std::thread::current().id() && h.join().is_err() {
                log::error!("the syncer thread panicked");
            }
        }
    }

    fn new_buf(&self, blk: BlockNo, data: Vec<u8>) -> Buf {
        Buf::with_undo(blk, data, Some(Arc::clone(&self.undo)))
    }

    /// Opens an undo scope (see "Undo"). Fails if a scope is already open, or if the device
    /// writes of an earlier rollback are still pending and the device refuses them again:
    /// nothing may change before the image is back where that rollback left it.
    pub fn begin_undo(&self) -> io::Result<()> {
        self.settle_undo()?;
        if !self.undo.begin() {
            return Err(io::Error::other("an undo scope is already open"));
        }
        Ok(())
    }

    /// Closes the undo scope, keeping every change. Costs only emptying the log.
    pub fn commit_undo(&self) {
        self.undo.commit();
    }

    /// Closes the undo scope and takes back everything changed since [`Self::begin_undo`]:
    ///
    /// - in memory, every buffer the scope changed gets its contents, kind and dirty flag
    ///   from the start of the scope back (its saved bytes applied newest first over its
    ///   current contents); buffers the scope created are dropped; buffers it invalidated
    ///   are put back;
    /// - on the device, every block the scope changed and wrote is rewritten in reverse
    ///   flush-epoch order, each epoch followed by a flush, so the image walks back through
    ///   the states the scope's own writes passed through (see `UndoLog::replay`). A
    ///   restored buffer is then clean if the replay wrote its start contents, else dirty as
    ///   it was.
    ///
    /// Returns the replay's outcome. If the device refuses it, the remaining epochs stay
    /// pending and the restored buffers stay dirty: every later write and flush of the cache,
    /// and every [`Self::begin_undo`], first writes the pending epochs, so nothing newer can
    /// reach the device before the image is back.
    pub fn rollback_undo(&self) -> io::Result<()> {
        // Another thread may be writing back a buffer the scope changed (a file system that
        // does not hold its own lock across write-back). Its write is recorded in the scope
        // only once it returned, and its completion would clear the dirty flag the rollback
        // sets: so wait for every such write and keep new ones out until the buffers are
        // restored, by holding their I/O locks (ascending, as a cluster write takes them).
        // Then every write of the scope's blocks is in the log the replay reads, and none
        // can copy a half-restored buffer.
        let (blks, detached) = self.undo.touched();
        let mut locked: Vec<BufRef> = blks
            .into_iter()
            .filter_map(|b| self.lookup(b))
            .chain(detached)
            .collect();
        locked.sort_by_key(|b| (b.blkno(), Arc::as_ptr(b) as usize));
        locked.dedup_by(|a, b| Arc::ptr_eq(a, b));
        let _io: Vec<_> = locked.iter().map(|b| b.io.lock()).collect();
        let log = self.undo.take();
        // Buffers the scope invalidated come back first (newest first): the saves of a
        // block apply to the buffer it had at the start.
        for (buf, dirty) in log.detached.iter().rev() {
            let mut st = self.state.lock();
            if let Some(cur) = st.remove(buf.blkno()) {
                cur.detached.store(true, Ordering::Release);
                cur.dirty.store(false, Ordering::Release);
            }
            buf.detached.store(false, Ordering::Release);
            buf.dirty.store(*dirty, Ordering::Release);
            if *dirty {
                st.dirty.insert(buf.blkno());
            }
            st.insert(Arc::clone(buf));
        }
        // Each changed block's contents at the start of the scope. The scope's buffers are
        // never evicted while it is open, so each is still cached.
        let changed = log.changed();
        let mut start: HashMap<BlockNo, Option<Vec<u8>>> = HashMap::new();
        let mut bufs = Vec::with_capacity(changed.len());
        for c in &changed {
            let cur = self.lookup(c.blkno);
            if c.absent {
                // The scope created the block's first buffer it recorded — unless it
                // invalidated an untouched buffer of the block before that: then that one,
                // just put back, is the block's buffer from the start and stays.
                // (If the scope wrote the block, the replay puts that buffer's contents back.)
                match cur {
                    Some(b) if b.undo_full.load(Ordering::Acquire) != log.next_scope => {
                        start.insert(c.blkno, Some(b.read().clone()));
                        bufs.push(None);
                    }
                    created => {
                        start.insert(c.blkno, None);
                        bufs.push(created);
                    }
                }
                continue;
            }
            let Some(buf) = cur else {
                log::error!(
                    "rollback: block {} left the cache during its scope",
                    c.blkno
                );
                bufs.push(None);
                continue;
            };
            let mut image = buf.read().clone();
            for (at, bytes) in c.saves.iter().rev() {
                if let Some(dst) = image.get_mut(*at..*at + bytes.len()) {
                    dst.copy_from_slice(bytes);
                }
            }
            start.insert(c.blkno, Some(image));
            bufs.push(Some(buf));
        }
        let replay: Replay = log.replay(&start, self.block_size);
        let written: std::collections::HashSet<BlockNo> = replay
            .iter()
            .flat_map(|e| e.iter().map(|(b, _)| *b))
            .collect();
        if !replay.is_empty() {
            self.pending_undo.lock().extend(replay);
            self.undo_owed.store(true, Ordering::Release);
        }
        let device = self.settle_undo();
        for (c, buf) in changed.iter().zip(bufs) {
            let Some(buf) = buf else { continue };
            if c.absent {
                let mut st = self.state.lock();
                if st.owns(&buf) {
                    st.remove(c.blkno);
                    buf.detached.store(true, Ordering::Release);
                    buf.dirty.store(false, Ordering::Release);
                }
                continue;
            }
            if let Some(Some(image)) = start.get(&c.blkno) {
                // Not under the state lock: a writer may hold the contents' lock while it
                // takes the state lock (mark_dirty).
                buf.restore(image);
            }
            buf.set_kind(c.kind);
            let on_device = written.contains(&c.blkno) && device.is_ok();
            let dirty = if written.contains(&c.blkno) {
                !on_device
            } else {
                c.dirty
            };
            let mut st = self.state.lock();
            if !st.owns(&buf) {
                continue;
            }
            buf.dirty.store(dirty, Ordering::Release);
            if dirty {
                st.dirty.insert(c.blkno);
            } else {
                st.dirty.remove(&c.blkno);
            }
        }
        device
    }

    /// Whether a rollback's device writes are still pending (the device refused them).
    pub fn undo_pending(&self) -> bool {
        !self.pending_undo.lock().is_empty()
    }

    /// Writes a rollback's pending reverse epochs, each followed by a flush. On failure the
    /// epoch that failed and the later ones stay pending.
    pub fn settle_undo(&self) -> io::Result<()> {
        if !self.undo_owed.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut pending = self.pending_undo.lock();
        while let Some(epoch) = pending.front() {
            for (b, image) in epoch {
                self.dev.write_blocks(*b, image)?;
            }
            self.dev.flush()?;
            pending.pop_front();
        }
        self.undo_owed.store(false, Ordering::Release);
        Ok(())
    }

    fn max_cluster_blocks(&self) -> usize {
        (self.cfg.max_cluster_bytes / self.block_size).max(1)
    }

    /// Writes `bufs` (sorted by block, distinct) in clusters of contiguous blocks. With
    /// `only_dirty`, buffers found clean once locked (someone else wrote them) are skipped.
    fn write_sorted(&self, bufs: &[BufRef], mode: LockMode, only_dirty: bool) -> io::Result<()> {
        // A rollback's device writes come before anything newer (see "Undo").
        self.settle_undo()?;
        let max = self.max_cluster_blocks();
        let mut first_err = None;
        for run in runs(bufs, max) {
            let blks: Vec<BlockNo> = run.iter().map(|b| b.blkno()).collect();
            self.wait_retiring(&blks, run);
            let guards: Vec<_> = match mode {
                LockMode::Wait => run.iter().map(|b| Some(b.io.lock())).collect(),
                LockMode::Try => run.iter().map(|b| b.io.try_lock()).collect(),
            };
            let ready: Vec<BufRef> = run
                .iter()
                .zip(&guards)
                .filter(|(b, g)| {
                    g.is_some() && !b.is_invalidated() && (!only_dirty || b.is_dirty())
                })
                .map(|(b, _)| Arc::clone(b))
                .collect();
            for sub in runs(&ready, max) {
                if let Err(e) = self.write_cluster(sub) {
                    first_err.get_or_insert(e);
                }
            }
            drop(guards);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Writes one run of contiguous buffers whose I/O locks the caller holds.
    fn write_cluster(&self, run: &[BufRef]) -> io::Result<()> {
        let bs = self.block_size;
        let mut image = vec![0; run.len() * bs];
        let mut generations = Vec::with_capacity(run.len());
        let hooks = Arc::clone(&*self.hooks.read());
        for (i, buf) in run.iter().enumerate() {
            let slot = &mut image[i * bs..(i + 1) * bs];
            {
                let data = buf.read();
                // A caller that resized the vector broke the contract; write what fits
                // rather than panic.
                let n = data.len().min(bs);
                slot[..n].copy_from_slice(&data[..n]);
                generations.push(buf.generation.load(Ordering::Acquire));
            }
            if let Err(e) = hooks.before_write(buf, slot) {
                run[..i].iter().for_each(|b| hooks.write_failed(b));
                self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        }
        let written = self.dev.write_blocks(run[0].blkno(), &image);
        // Kept for a rollback even if the write failed: a device may have stored part of it.
        self.undo.note_write(run[0].blkno(), image);
        if let Err(e) = written {
            run.iter().for_each(|b| hooks.write_failed(b));
            self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        self.counters.cluster_writes.fetch_add(1, Ordering::Relaxed);
        self.counters
            .writebacks
            .fetch_add(run.len() as u64, Ordering::Relaxed);
        run.iter().for_each(|b| hooks.after_write(b));
        let mut st = self.state.lock();
        for (buf, generation) in run.iter().zip(generations) {
            // Same generation: nothing changed since the copy, so the device now holds
            // exactly the buffer's contents. Checked under the state lock, which
            // mark_dirty also takes, so a concurrent mark_dirty is either seen here or
            // re-dirties the buffer afterwards.
            if buf.generation.load(Ordering::Acquire) == generation && st.owns(buf) {
                buf.dirty.store(false, Ordering::Release);
                buf.reset_lsns();
                st.dirty.remove(&buf.blkno());
            }
        }
        Ok(())
    }

    /// Brings the cache back under budget: clean unheld buffers first (LRU order), then
    /// unheld dirty ones after writing them back, unless the hooks defer that
    /// ([`WriteHooks::on_pressure`]). Write errors leave the buffers cached and dirty (they
    /// are counted and logged; the next sync reports them).
    fn evict_if_needed(&self) {
        let max_bufs = (self.cfg.budget_bytes / self.block_size as u64) as usize;
        let scope = self.undo.scope();
        let dirty_victims: Vec<BufRef> = {
            let mut st = self.state.lock();
            if st.map.len() <= max_bufs {
                return;
            }
            let mut excess = st.map.len() - max_bufs;
            let mut clean = Vec::new();
            let mut dirty = Vec::new();
            let mut held = Vec::new();
            // The scan is bounded, by a constant: a scope that creates many buffers (an
            // fallocate of a GiB) holds every one of them, and they are all "excess", so a
            // scan at each insertion until `excess` were found walked all of them again —
            // quadratic, minutes of CPU. Each held buffer it passes goes to the young end,
            // so the next scan starts past it; a cache far over budget for other reasons
            // comes back by up to 128 buffers per insertion.
            let limit = excess.min(16) * 4 + 64;
            let mut scanned = 0;
            for blk in st.lru.values() {
                if clean.len() == excess || scanned == limit {
                    break;
                }
                scanned += 1;
                let buf = &st.map[blk].buf;
                // Only the map holds it: nobody can be using or writing it, and nobody can
                // get a new reference without the state lock we hold.
                // A buffer the open undo scope changed is kept until the scope ends: its
                // rollback starts from the buffer's contents; and writing it now would put
                // on the device a change the scope may still take back, which for a buffer
                // the scope created from nothing (`get_new`) the rollback could not undo.
                if Arc::strong_count(buf) > 1
                    || (scope != 0 && buf.undo_touched.load(Ordering::Acquire) == scope)
                {
                    held.push(*blk);
                    continue;
                }
                if buf.is_dirty() {
                    dirty.push(Arc::clone(buf));
                } else {
                    clean.push(*blk);
                }
            }
            for blk in &clean {
                st.remove(*blk);
            }
            // A held buffer is in use, hence recently used: moving it to the young end keeps
            // the next scans from walking over it again (a second chance, as in CLOCK).
            for blk in held {
                st.move_young(blk);
            }
            self.counters
                .evictions
                .fetch_add(clean.len() as u64, Ordering::Relaxed);
            self.counters
                .eviction_scans
                .fetch_add(scanned as u64, Ordering::Relaxed);
            excess -= clean.len();
            // Write a few more than strictly needed so clustering has something to gather
            // and the next insertions find clean victims.
            dirty.truncate(if excess == 0 { 0 } else { excess.max(16) });
            dirty
        };
        if !dirty_victims.is_empty() {
            let hooks = Arc::clone(&*self.hooks.read());
            if hooks.on_pressure() == Pressure::Defer {
                return;
            }
        }
        if dirty_victims.is_empty() {
            return;
        }
        let mut sorted = dirty_victims;
        sorted.sort_by_key(|b| b.blkno());
        if let Err(e) = self.write_sorted(&sorted, LockMode::Try, true) {
            log::warn!("write-back during eviction failed: {e}");
        }
        let blknos: Vec<BlockNo> = sorted.iter().map(|b| b.blkno()).collect();
        drop(sorted);
        let mut st = self.state.lock();
        for blk in blknos {
            if st.map.len() <= max_bufs {
                break;
            }
            let evictable = st
                .map
                .get(&blk)
                .is_some_and(|e| Arc::strong_count(&e.buf) == 1 && !e.buf.is_dirty());
            if evictable {
                st.remove(blk);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for BufferCache {
    /// Stops the syncer without writing anything (see "Rules for callers").
    fn drop(&mut self) {
        *self.control.stop.lock() = true;
        self.control.wake.notify_all();
        // Not joined: the last reference may be dropped by the syncer thread itself.
    }
}

/// Splits `bufs` (sorted by block) into runs of contiguous blocks of at most `max` buffers.
fn runs(bufs: &[BufRef], max: usize) -> impl Iterator<Item = &[BufRef]> {
    let mut rest = bufs;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut n = 1;
        while n < rest.len()
            && n < max
            && rest[n - 1].blkno().checked_add(1) == Some(rest[n].blkno())
        {
            n += 1;
        }
        let (run, tail) = rest.split_at(n);
        rest = tail;
        Some(run)
    })
}

fn syncer(cache: Weak<BufferCache>, control: Arc<SyncerControl>, interval: Duration) {
    loop {
        {
            let mut stop = control.stop.lock();
            if !*stop {
                control.wake.wait_for(&mut stop, interval);
            }
            if *stop {
                return;
            }
        }
        let Some(cache) = cache.upgrade() else { return };
        if let Err(e) = cache.write_back_all() {
            log::warn!("syncer write-back failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
