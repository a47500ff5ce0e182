//! `softdep`: Soft Updates (002 §3–§4; FreeBSD's `ffs_softdep.c`). Every metadata write is
//! delayed; each fact attaches dependency records ([`deps`]) to the buffers it names, and a
//! buffer with unsatisfied records is written with the unsafe changes rolled back in the
//! private image ([`rollback`]), so the disk always satisfies rules 1–3 while calls never
//! wait for a write. Frees and link-count drops wait on the worklist until what they depend
//! on is on disk, and the worker applies them. See docs/DESIGN.md, "Soft updates".
//!
//! Writes are ordered by the record conditions alone: a record's condition holds once a
//! write that began after the record was made has been *flushed* (a completed write in a
//! device cache is not yet on disk), so write-back goes in rounds — data and group blocks,
//! flush; indirect blocks, flush; inode blocks, flush; directory blocks, flush — and each
//! round makes the next one's rollbacks unnecessary.
//!
//! Concurrency: the engine calls write-back without its lock (`IoModel::Concurrent`), so
//! the worklist can call back into the engine. A call's changes to buffers and the facts
//! declaring them must never be split by a write, so a gate ([`Gate`]) is held from
//! `begin_op` to `end_op` and around every soft-updates write pass.

mod deps;
mod rollback;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::{Buf, BufRef, BufferCache, Pressure, WriteHooks};
use cairn_vfs::Result;
use cairn_vfs::modes::{
    AfterCrash, Allowed, Commit, Facts, Family, Guarantees, LogPlacement, OptionSpec, Recovery,
};
use parking_lot::{Condvar, Mutex};

use super::{
    AllocDirect, AllocIndir, Apply, AttrChange, Blk, BlkMapDep, DataZeroed, DirAdd, DirChange,
    DirRemove, Engine, FreeBlocks, FreeFile, FsyncReq, Ino, InoMapDep, InodePtr, IoModel,
    LinkChange, LinkWhy, ModeInfo, OpKind, OpState, Release, Strategy, SyncWhy, Tx,
};
use crate::format::{DiskInode, Geometry, INODE_SIZE, Superblock, dir, kind};
use deps::{Action, Cond, Deps, PtrAt, What};

/// Default cap on dependency records (FreeBSD's `max_softdeps`, scaled to a user-space
/// cache): at the cap, a new call first writes back so existing records complete.
pub const DEFAULT_MAX_DEPS: usize = 200_000;

/// Write-back rounds the syncer makes (memory pressure makes one batch; sync(2) and unmount
/// go on until nothing is left).
const PERIODIC_ROUNDS: usize = 2;
/// A drain that has not finished after this many rounds is stuck: reported, not looped.
const MAX_ROUNDS: usize = 200;
/// Write waves one `settle` makes at most (a chain of pending names up a deep tree).
const MAX_WAVES: usize = 32;
/// The buffer kinds of each write-back batch of a round, in its order.
const PASSES: [&[u8]; 4] = [
    &[kind::DATA, kind::GROUP, kind::XATTR],
    &[kind::INDIRECT],
    &[kind::INODE],
    &[kind::DIRECTORY],
];
/// Directory batches a round makes at most.
const DIRECTORY_PASSES: usize = 3;
/// Buffers a write pass writes per hold of the gate (`Inner::write_sliced`): on the
/// papers' disks (~5–10 ms a write) a call waits at most a few hundred milliseconds for a
/// syncer round, where a whole batch held it for seconds.
const WRITE_SLICE: usize = 32;

/// Calls and soft-updates write passes exclude each other; one thread may nest.
struct Gate {
    st: Mutex<(Option<std::thread::ThreadId>, u32)>,
    cv: Condvar,
    /// How long calls waited to enter and write passes held it (`cairn stats`).
    waits: GateWaits,
}

/// What the gate cost: calls that found it held (by a write pass, or by another call) and
/// how long they waited; how long write passes held it. A write pass holds it while it
/// issues its writes, which are synchronous, so on a slow device a call that begins during
/// a syncer round waits for the round's device writes (docs/bench/history.md, issue 24).
#[derive(Default)]
struct GateWaits {
    call_waits: AtomicU64,
    call_wait_ns: AtomicU64,
    call_wait_max_ns: AtomicU64,
    write_holds: AtomicU64,
    write_hold_ns: AtomicU64,
    write_hold_max_ns: AtomicU64,
}

impl GateWaits {
    fn add(n: &AtomicU64, total: &AtomicU64, max: &AtomicU64, ns: u64) {
        n.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(ns, Ordering::Relaxed);
        max.fetch_max(ns, Ordering::Relaxed);
    }

    fn json(&self) -> serde_json::Value {
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        serde_json::json!({
            "call_waits": self.call_waits.load(Ordering::Relaxed),
            "call_wait_ms": ms(&self.call_wait_ns),
            "call_wait_max_ms": ms(&self.call_wait_max_ns),
            "write_holds": self.write_holds.load(Ordering::Relaxed),
            "write_hold_ms": ms(&self.write_hold_ns),
            "write_hold_max_ms": ms(&self.write_hold_max_ns),
        })
    }
}

impl Gate {
    fn new() -> Gate {
        Gate {
            st: Mutex::new((None, 0)),
            cv: Condvar::new(),
            waits: GateWaits::default(),
        }
    }
    /// Enters; whether this thread had to wait for another.
    fn enter_timed(&self) -> Option<std::time::Duration> {
        let me = std::thread::current().id();
        let mut s = self.st.lock();
        let mut since = None;
        loop {
            match s.0 {
                None => {
                    *s = (Some(me), 1);
                    return since.map(|t: std::time::Instant| t.elapsed());
                }
                Some(t) if t == me => {
                    s.1 += 1;
                    return since.map(|t: std::time::Instant| t.elapsed());
                }
                _ => {
                    since.get_or_insert_with(std::time::Instant::now);
                    self.cv.wait(&mut s)
                }
            }
        }
    }
    fn enter(&self) {
        self.enter_timed();
    }
    /// Enters for a call: the wait, if any, is counted.
    fn enter_call(&self) {
        if let Some(w) = self.enter_timed() {
            let g = &self.waits;
            GateWaits::add(
                &g.call_waits,
                &g.call_wait_ns,
                &g.call_wait_max_ns,
                w.as_nanos() as u64,
            );
        }
    }
    /// Runs `f` (a write pass's writes) inside the gate; how long it held it is counted.
    fn hold_for_writes<R>(&self, f: impl FnOnce() -> R) -> R {
        self.enter();
        let t = std::time::Instant::now();
        let r = f();
        let g = &self.waits;
        GateWaits::add(
            &g.write_holds,
            &g.write_hold_ns,
            &g.write_hold_max_ns,
            t.elapsed().as_nanos() as u64,
        );
        self.leave();
        r
    }
    fn leave(&self) {
        let mut s = self.st.lock();
        s.1 = s.1.saturating_sub(1);
        if s.1 == 0 {
            s.0 = None;
            self.cv.notify_all();
        }
    }
}

/// Why soft updates wrote and flushed (`cairn stats`: `flushes` by cause): the syncer's
/// and memory pressure's rounds, or a write forced inside a call or by fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    /// A write-back round (syncer, memory pressure, the cap, sync(2), unmount).
    Round,
    /// rename: its new names forced before the old one may go (rule 3).
    Rename,
    /// rmdir: the directory's own removals forced before its name goes.
    Rmdir,
    /// A truncation of a file that stays: its inode forced first.
    Truncate,
    /// fsync(2).
    Fsync,
    /// A name, or the bytes of one, reused while its removal is still put back: the
    /// removal made durable first.
    Reuse,
}

impl Cause {
    const ALL: [Cause; 6] = [
        Cause::Round,
        Cause::Rename,
        Cause::Rmdir,
        Cause::Truncate,
        Cause::Fsync,
        Cause::Reuse,
    ];
    fn name(self) -> &'static str {
        match self {
            Cause::Round => "round",
            Cause::Rename => "rename",
            Cause::Rmdir => "rmdir",
            Cause::Truncate => "truncate",
            Cause::Fsync => "fsync",
            Cause::Reuse => "reuse",
        }
    }
}

/// Counters shown in `cairn stats`.
#[derive(Default)]
struct Counters {
    /// Device flushes soft updates issued, by [`Cause`].
    flushes: [AtomicU64; 6],
    rollbacks: AtomicU64,
    writes_rolled_back: AtomicU64,
    writes: AtomicU64,
    records_made: AtomicU64,
    work_done: AtomicU64,
    cap_waits: AtomicU64,
    rounds: AtomicU64,
}

pub(crate) struct Inner {
    deps: Mutex<Deps>,
    geo: Mutex<Option<Geometry>>,
    cache: Mutex<Option<Arc<BufferCache>>>,
    gate: Gate,
    max_deps: usize,
    counters: Counters,
    /// A planted bug (the crash harness's, and tests'), or none.
    broken: Broken,
    /// The batch of a round memory pressure writes next.
    next_pass: std::sync::atomic::AtomicUsize,
}

/// Deliberately broken soft updates, to prove that the checkers catch what they must.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    None,
    /// New directory entries are written before the inodes they name (rule 1).
    EntryRollback,
    /// A rename's old name is removed on disk before its new name is there (rule 3).
    RemovalPutBack,
    /// As `RemovalPutBack`, for the old names of renamed files only (what a rename that
    /// moves no directory used to force).
    RenameUnforced,
}

/// The soft-updates strategy.
pub struct SoftDep {
    inner: Arc<Inner>,
    name: &'static str,
}

/// The write hooks: rollback in `before_write`, bookkeeping after.
struct Hooks(Arc<Inner>);

impl SoftDep {
    pub fn new(max_deps: usize) -> SoftDep {
        SoftDep::build("softdep", max_deps, Broken::None)
    }

    /// A broken soft updates, called `name`, for the crash harness's planted bugs: new
    /// directory entries are written before the inodes they name (the entry rollback in
    /// `before_write` is skipped). Never reachable from a mount.
    pub fn without_entry_rollback(name: &'static str) -> SoftDep {
        SoftDep::build(name, DEFAULT_MAX_DEPS, Broken::EntryRollback)
    }

    /// A broken soft updates, called `name`, for planted bugs: a rename's old name is never
    /// put back at write time, so its removal may reach disk before the new name (rule 3) —
    /// a crash then leaves a renamed file with no name, which fsck calls a leak. Never
    /// reachable from a mount.
    pub fn without_removal_putback(name: &'static str) -> SoftDep {
        SoftDep::build(name, DEFAULT_MAX_DEPS, Broken::RemovalPutBack)
    }

    /// A broken soft updates, called `name`, for the crash harness's planted bugs: the old
    /// name of a file's rename is not put back at write time (rule 3 skipped for a rename
    /// that moves no directory), so the new name and the old name's removal reach disk in
    /// whatever order the write-back takes. A crash can leave the file in no directory,
    /// which fsck calls a leak and the names-kept judge a lost name. Directory renames
    /// (settled in the call) and rmdir keep their put-back. Never reachable from a mount.
    pub fn without_rename_force(name: &'static str) -> SoftDep {
        SoftDep::build(name, DEFAULT_MAX_DEPS, Broken::RenameUnforced)
    }

    fn build(name: &'static str, max_deps: usize, broken: Broken) -> SoftDep {
        SoftDep {
            name,
            inner: Arc::new(Inner {
                deps: Mutex::new(Deps::default()),
                geo: Mutex::new(None),
                cache: Mutex::new(None),
                gate: Gate::new(),
                max_deps: max_deps.max(64),
                counters: Counters::default(),
                broken,
                next_pass: Default::default(),
            }),
        }
    }

    fn geo(&self) -> Result<Geometry> {
        (*self.inner.geo.lock()).ok_or_else(|| {
            cairn_vfs::FsError::Corrupt(
                "soft updates: no geometry (the strategy was never attached to an image)".into(),
            )
        })
    }

    /// Dependency records outstanding (rollbacks and worklist items, ready ones included).
    pub fn outstanding(&self) -> usize {
        let d = self.inner.deps.lock();
        d.recs.len() + d.ready.len()
    }
}

impl Inner {
    /// A condition on block `blk` changed before now: `None` if it already holds (the
    /// buffer is clean and no write of it awaits a flush).
    fn cond_block(&self, d: &Deps, blk: Blk) -> Option<Cond> {
        let dirty = self
            .cache
            .lock()
            .as_ref()
            .and_then(|c| c.lookup(blk))
            .is_some_and(|b| b.is_dirty());
        (dirty || d.pending_write(blk)).then_some(Cond::Block(blk, d.seq))
    }

    /// A condition on inode `ino` being on disk as it is now, unrolled.
    fn cond_inode(&self, d: &Deps, geo: &Geometry, ino: Ino) -> Option<Cond> {
        let (iblk, _) = geo.inode_location(ino);
        let pending = d.inode_pending(ino);
        (pending || self.cond_block(d, iblk).is_some()).then_some(Cond::Inode {
            ino,
            blk: iblk,
            seq: d.seq,
        })
    }

    /// Drops every condition that holds because its block is clean and not awaiting a
    /// flush (a dirty buffer becomes clean only by a write that carried every change made
    /// to it, unrolled: a write that rolled something back keeps it dirty). A condition is
    /// only made on a block that is dirty or being written, so the blocks a flush made
    /// durable are where this can change: `after_flush` sweeps those, and this whole sweep
    /// runs once a write-back round (scanning every waited block on every flush was 56% of
    /// the daemon's time in fsstress).
    fn sweep(&self, d: &mut Deps) {
        let blks = d.waited_blocks();
        self.sweep_blocks(d, &blks);
    }

    /// [`Inner::sweep`] of the conditions on `blks` only.
    fn sweep_blocks(&self, d: &mut Deps, blks: &[Blk]) {
        let Some(cache) = self.cache.lock().clone() else {
            return;
        };
        for &blk in blks {
            let clean = !cache.lookup(blk).is_some_and(|b| b.is_dirty()) && !d.pending_write(blk);
            if !clean {
                continue;
            }
            for id in d.waiting_on(blk) {
                let pending = |ino: Ino, d: &Deps| d.inode_pending(ino);
                let inos: Vec<Ino> = d
                    .recs
                    .get(&id)
                    .map(|r| {
                        r.waits
                            .iter()
                            .filter_map(|c| match c {
                                Cond::Inode { ino, .. } if pending(*ino, d) => Some(*ino),
                                _ => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                d.drop_conds(id, |c| {
                    c.blk() == blk
                        && match c {
                            Cond::Inode { ino, .. } => !inos.contains(ino),
                            _ => true,
                        }
                });
            }
        }
    }

    /// A device flush on behalf of `why`.
    fn flush(&self, cache: &BufferCache, why: Cause) -> Result<()> {
        self.counters.flushes[why as usize].fetch_add(1, Ordering::Relaxed);
        cache.flush_device()?;
        Ok(())
    }

    /// One batch of write-back: the dirty buffers of `kinds`, then a flush — none if
    /// nothing was dirty. The gate is held only while the writes are issued (no call's
    /// changes may be split by them), not across the flush, and only for a slice of the
    /// batch at a time ([`Inner::write_sliced`]). Whether anything was written.
    fn pass(&self, cache: &BufferCache, kinds: &[u8]) -> Result<bool> {
        // The batch: the dirty buffers of `kinds` as they are now (the filter writes none).
        let picked = Mutex::new(Vec::new());
        cache.write_back_filter(&|b| {
            if kinds.contains(&b.kind())
                && let Some(r) = cache.lookup(b.blkno())
            {
                picked.lock().push(r);
            }
            false
        })?;
        let picked = picked.into_inner();
        if picked.is_empty() {
            return Ok(false);
        }
        self.write_sliced(cache, picked)?;
        self.flush(cache, Cause::Round)?;
        Ok(true)
    }

    /// Writes the dirty ones of `bufs` (no flush), in block order, [`WRITE_SLICE`] buffers
    /// per hold of the gate: a call that begins meanwhile waits for one slice's device
    /// writes, not the batch's (the writes are synchronous: a syncer round on a slow disk
    /// held every call for seconds). Safe per slice as per batch: each write's image is
    /// copied and rolled back with the gate held, and a record a call makes between two
    /// slices is numbered before every write of the later ones.
    fn write_sliced(&self, cache: &BufferCache, mut bufs: Vec<BufRef>) -> Result<()> {
        bufs.sort_by_key(|b| b.blkno());
        let mut first_err = None;
        for slice in bufs.chunks(WRITE_SLICE) {
            let r = self.gate.hold_for_writes(|| {
                let dirty: Vec<&BufRef> = slice.iter().filter(|b| b.is_dirty()).collect();
                if dirty.is_empty() {
                    Ok(())
                } else {
                    cache.write_now(&dirty)
                }
            });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// One round of write-back in dependency order (002 §3.2: "write order chosen to avoid
    /// rollbacks"): data, group and xattr blocks; indirect blocks; inode blocks; directory
    /// blocks — each a batch of its own, so each makes the next one's rollbacks needless.
    /// Directories get a few batches while each lets more go: a rename's new name, then a
    /// moved directory's `..`, then the old name's removal each wait for the one before.
    fn round(&self, cache: &BufferCache) -> Result<()> {
        self.sweep(&mut self.deps.lock());
        for kinds in &PASSES[..PASSES.len() - 1] {
            self.pass(cache, kinds)?;
        }
        for _ in 0..DIRECTORY_PASSES {
            let (done0, rolled0) = (
                self.deps.lock().completed,
                self.counters.writes_rolled_back.load(Ordering::Relaxed),
            );
            if !self.pass(cache, PASSES[PASSES.len() - 1])? {
                break;
            }
            let rolled = self.counters.writes_rolled_back.load(Ordering::Relaxed) > rolled0;
            if !rolled || self.deps.lock().completed == done0 {
                break;
            }
        }
        Ok(())
    }

    /// Applies ready worklist items through the engine (never with the gate held: the
    /// engine's call enters it).
    fn run_ready(&self, e: &dyn Engine, limit: usize) -> Result<usize> {
        let mut n = 0;
        while n < limit {
            let a = {
                let mut d = self.deps.lock();
                let Some(a) = d.ready.pop_front() else {
                    break;
                };
                d.running.push(a.clone());
                a
            };
            let r = match &a {
                Action::Drop(ino, k) => e.apply_link_drop(*ino, *k),
                Action::Release(r) => e.release(r.clone()),
            };
            let mut d = self.deps.lock();
            if let Some(i) = d.running.iter().position(|x| *x == a) {
                d.running.swap_remove(i);
            }
            if let Err(err) = r {
                d.ready.push_front(a);
                return Err(err);
            }
            drop(d);
            self.counters.work_done.fetch_add(1, Ordering::Relaxed);
            n += 1;
        }
        Ok(n)
    }

    /// Writes the dirty ones of `blks`, then flushes.
    fn write_blocks(&self, cache: &BufferCache, blks: &[Blk], why: Cause) -> Result<()> {
        let bufs: Vec<BufRef> = blks
            .iter()
            .filter_map(|b| cache.lookup(*b))
            .filter(|b| b.is_dirty())
            .collect();
        self.write_sliced(cache, bufs)?;
        self.flush(cache, why)?;
        Ok(())
    }

    /// Makes every condition of `goal` hold, in as few flushes as the dependencies allow
    /// (002 §3.3, fsync: "the soft updates code ... pushes to disk ... and waits for the
    /// writes to complete" — in dependency order, each level a batch): each wave writes,
    /// at once, every block some unmet condition waits for *and* that can be written
    /// usefully now (what its rollbacks wait for holds), then flushes. A new file's fsync
    /// takes three waves (its data and bitmaps; its inode; its name), an append two, an
    /// overwrite one. Returns the waves made.
    fn settle(&self, cache: &BufferCache, goal: Vec<Cond>, why: Cause) -> Result<usize> {
        if goal.is_empty() {
            return Ok(0);
        }
        let probe = self.deps.lock().insert(What::Probe, goal);
        let mut waves = 0;
        let r = (|| {
            while waves < MAX_WAVES {
                let blks = {
                    let mut d = self.deps.lock();
                    if waves > 0 && waves % 8 == 0 {
                        // Slow progress: a condition only a whole sweep sees may hold.
                        self.sweep(&mut d);
                    }
                    let Some(r) = d.recs.get(&probe) else {
                        break;
                    };
                    let mut out = std::collections::BTreeSet::new();
                    let mut seen = std::collections::HashSet::new();
                    for c in r.waits.clone() {
                        frontier(&d, c, 0, &mut seen, &mut out);
                    }
                    out.into_iter().collect::<Vec<Blk>>()
                };
                if blks.is_empty() {
                    break;
                }
                waves += 1;
                self.write_blocks(cache, &blks, why)?;
            }
            Ok(())
        })();
        let mut d = self.deps.lock();
        if let Some(left) = d.remove(probe) {
            log::warn!(
                "soft updates: {waves} write waves left {:?} unmet",
                left.waits
            );
        }
        r.map(|()| waves)
    }
}

/// The blocks to write now towards condition `c`: its block if what rolls it back there
/// already holds, else (recursively) what that waits for. `seen` keeps a condition from
/// being walked twice; the depth bounds a chain (a directory tree's pending names).
fn frontier(
    d: &Deps,
    c: Cond,
    depth: u32,
    seen: &mut std::collections::HashSet<Cond>,
    out: &mut std::collections::BTreeSet<Blk>,
) {
    if depth > 64 || !seen.insert(c) {
        return;
    }
    let mut before: Vec<Cond> = Vec::new();
    match c {
        Cond::Block(..) => {}
        Cond::Inode { ino, .. } => {
            for id in d.inode_records(ino) {
                if let Some(r) = d.recs.get(&id) {
                    before.extend(r.waits.iter().copied());
                }
            }
        }
        Cond::Entry { blk, off, .. } => {
            if let Some(r) = d.entries.get(&(blk, off)).and_then(|id| d.recs.get(id))
                && let What::Entry { applied: false, .. } = r.what
            {
                before.extend(r.waits.iter().copied());
            }
        }
        Cond::Removed { blk, off, .. } => {
            for id in d.removed_in_block(blk) {
                if let Some(r) = d.recs.get(&id)
                    && matches!(r.what, What::Removed { off: o, .. } if o == off)
                {
                    before.extend(r.waits.iter().copied());
                }
            }
        }
    }
    if before.is_empty() {
        out.insert(c.blk());
    } else {
        for b in before {
            frontier(d, b, depth + 1, seen, out);
        }
    }
}

impl WriteHooks for Hooks {
    fn before_write(&self, buf: &Buf, image: &mut [u8]) -> std::io::Result<()> {
        let i = &self.0;
        let Some(geo) = *i.geo.lock() else {
            return Ok(());
        };
        let mut d = i.deps.lock();
        let seq = d.next_seq();
        let k = buf.kind();
        let mut rolled = if k == kind::DIRECTORY && i.broken == Broken::EntryRollback {
            rollback::Rolled::default()
        } else {
            let put_back = match i.broken {
                Broken::RemovalPutBack => rollback::PutBack::Nothing,
                Broken::RenameUnforced => rollback::PutBack::Directories,
                Broken::None | Broken::EntryRollback => rollback::PutBack::All,
            };
            rollback::roll_back(&d, &geo, buf.blkno(), k, image, put_back)?
        };
        rolled.written.blk = buf.blkno();
        rolled.written.seq = seq;
        i.counters.writes.fetch_add(1, Ordering::Relaxed);
        if rolled.count > 0 {
            buf.keep_dirty();
            i.counters
                .rollbacks
                .fetch_add(rolled.count, Ordering::Relaxed);
            i.counters
                .writes_rolled_back
                .fetch_add(1, Ordering::Relaxed);
        }
        d.inflight.insert(buf.blkno(), rolled.written);
        Ok(())
    }

    fn after_write(&self, buf: &Buf) {
        let mut d = self.0.deps.lock();
        if let Some(w) = d.inflight.remove(&buf.blkno()) {
            d.unflushed_blks.insert(w.blk);
            d.unflushed.push(w);
        }
    }

    fn write_failed(&self, buf: &Buf) {
        self.0.deps.lock().inflight.remove(&buf.blkno());
    }

    fn after_flush(&self) {
        let mut d = self.0.deps.lock();
        let written = std::mem::take(&mut d.unflushed);
        d.unflushed_blks.clear();
        for w in &written {
            d.on_durable(w);
        }
        let mut blks: Vec<Blk> = written.iter().map(|w| w.blk).collect();
        blks.sort_unstable();
        blks.dedup();
        self.0.sweep_blocks(&mut d, &blks);
    }

    fn invalidated(&self, buf: &Buf) {
        // A freed block: what was rolled back in it, or waited for on it, is moot.
        let blk = buf.blkno();
        let mut d = self.0.deps.lock();
        let ids = deps::ids_at(&d.by_block, &blk);
        for id in ids {
            let keyed_here = match d.recs.get(&id).map(|r| &r.what) {
                Some(What::Entry { blk: b, .. } | What::Removed { blk: b, .. }) => *b == blk,
                Some(What::Alloc {
                    at: PtrAt::Indir { holder, .. },
                    ..
                }) => *holder == blk,
                _ => false,
            };
            if keyed_here {
                d.remove(id);
            }
        }
        // Nothing is written there any more: no condition on the block can be met, and
        // none needs to be (the entries of a freed directory block are no names).
        for id in d.waiting_on(blk) {
            d.drop_conds(id, |c| c.blk() == blk);
        }
    }

    fn on_pressure(&self) -> Pressure {
        // Evicting dirty buffers would write them outside the gate; the strategy writes
        // back in its own order (the engine calls `sync` with `SyncWhy::Pressure`).
        Pressure::Defer
    }
}

impl SoftDep {
    fn with_op<R>(&self, f: impl FnOnce(&mut Deps) -> R) -> R {
        f(&mut self.inner.deps.lock())
    }

    fn made(&self) {
        self.inner
            .counters
            .records_made
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The inode raises of the call in progress an entry must wait for, with `target`.
    fn entry_waits(&self, d: &Deps, geo: &Geometry, target: Ino) -> Vec<Cond> {
        let mut inos = vec![target];
        if let Some(op) = d.op.as_ref() {
            for r in &op.raised {
                if !inos.contains(r) {
                    inos.push(*r);
                }
            }
        }
        inos.into_iter()
            .filter_map(|i| self.inner.cond_inode(d, geo, i))
            .collect()
    }

    /// The pending entries naming directory `dir`: one added to it waits for them.
    fn reachable_waits(&self, d: &Deps, dir: Ino) -> Vec<Cond> {
        d.entry_conds(d.entries_naming(dir))
    }

    /// An entry naming a directory makes that directory's `..` a reference to `parent`:
    /// the parent's link count on disk must count it first (link count >= references).
    /// mkdir and a move to another parent raise the count in the call (`entry_waits`);
    /// a directory renamed within its parent raises nothing, but its earlier name may
    /// never have reached disk — the mkdir's entry cancelled by this rename, and with it
    /// the wait for the parent's raised count (MKDIR_PARENT). So the entry waits for the
    /// parent's inode as it is now, unless `waits` already does. (The crash campaign's
    /// `random-12:400`: mkdir d5, rename d5 m18, an fsync writing the parent's directory
    /// block: the root's count on disk one short of its references.)
    fn parent_count_wait(
        &self,
        d: &Deps,
        geo: &Geometry,
        parent: Ino,
        dtype: u8,
        waits: &[Cond],
    ) -> Option<Cond> {
        if dtype != libc::DT_DIR
            || waits
                .iter()
                .any(|c| matches!(c, Cond::Inode { ino, .. } if *ino == parent))
        {
            return None;
        }
        self.inner.cond_inode(d, geo, parent)
    }

    /// The type of inode `ino` as a directory entry records it, from its cached block.
    fn dtype_of(&self, geo: &Geometry, ino: Ino, fallback: u8) -> u8 {
        let (blk, off) = geo.inode_location(ino);
        let Some(b) = self.inner.cache.lock().as_ref().and_then(|c| c.lookup(blk)) else {
            return fallback;
        };
        let data = b.read();
        match DiskInode::decode(ino, &data[off..off + INODE_SIZE]) {
            Ok(di) if !di.is_free() => ((di.mode & libc::S_IFMT) >> 12) as u8,
            _ => fallback,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn alloc(
        &self,
        ino: Ino,
        at: PtrAt,
        ptr: Option<InodePtr>,
        lbn: u64,
        new_blk: Blk,
        old_blk: Blk,
        bk: super::BlockKind,
        (chain, blocks_back): (&[Blk], i64),
    ) -> Result<()> {
        let geo = self.geo()?;
        let mut d = self.inner.deps.lock();
        let mut waits = Vec::new();
        // The new block and the rest of its chain (an xattr chain's blocks name each
        // other): every one's bitmap and contents before the pointer (rule 1).
        for &b in std::iter::once(&new_blk).chain(chain) {
            if let Some(groups) = d.blkmap.remove(&b) {
                for g in groups {
                    waits.extend(self.inner.cond_block(&d, g));
                }
            }
            // The new block's contents (data arrives after this fact, in the same call).
            waits.push(Cond::Block(b, d.seq));
        }
        let mut old_blk = old_blk;
        let mut blocks_back = blocks_back;
        if ptr == Some(InodePtr::Xattr) {
            // FreeBSD's allocdirect_merge: the xattr pointer replaced again while its last
            // replacement is not on disk. The block on disk is still the one before that
            // replacement, so that is what the pointer rolls back to; the replaced record
            // goes (its block is being freed by this call).
            let pending = deps::ids_at(&d.alloc_by_ino, &ino).into_iter().find(|id| {
                matches!(
                    d.recs.get(id).map(|r| &r.what),
                    Some(What::Alloc {
                        at: PtrAt::Inode {
                            ptr: InodePtr::Xattr,
                            ..
                        },
                        applied: false,
                        ..
                    })
                )
            });
            if let Some(id) = pending
                && let Some(What::Alloc {
                    old_blk: o,
                    blocks_back: b,
                    ..
                }) = d.remove(id).map(|r| r.what)
            {
                old_blk = o;
                blocks_back += b;
            }
        }
        let cut = rollback::cut_of(&geo, bk, ptr, lbn);
        d.insert(
            What::Alloc {
                ino,
                at,
                cut,
                new_blk,
                old_blk,
                blocks_back,
                kind: bk,
                applied: false,
            },
            waits,
        );
        self.made();
        Ok(())
    }

    /// The drops a removal causes, as the `Apply` documentation lists them.
    fn removal_drops(kind: OpKind, f: &DirChange) -> Vec<(Ino, u32)> {
        if f.dotdot {
            return vec![(f.old_ino, 1)];
        }
        if kind == OpKind::Exchange {
            return vec![];
        }
        if f.old_is_dir {
            vec![(f.old_ino, 2), (f.dir, 1)]
        } else {
            vec![(f.old_ino, 1)]
        }
    }

    /// The records that waited for the pending entry at `at` (naming `ino`) to reach disk,
    /// once a removal — or a whiteout taking the name — cancelled it: a drop of the inode
    /// it replaced now waits for `removal`; an earlier rename's old name, put back until
    /// this name was there, waits for the inode's other names still on their way (this
    /// rename's new ones among them: the file keeps a name on disk throughout; none when it
    /// has no other name left, or only names already on disk); entries (and a `..`) waiting
    /// for it to reach the directory it names wait for this rename's new names, or, when
    /// the directory's name is unlinked, no more.
    fn rewire_cancelled_entry(
        d: &mut Deps,
        (blk, off): (Blk, u32),
        ino: Ino,
        removal: Option<Cond>,
        new_names: &[Cond],
    ) {
        let seq = d.seq;
        let others = d.entry_conds(d.entries_naming(ino));
        let at =
            |c: &Cond| matches!(c, Cond::Entry { blk: b, off: o, .. } if *b == blk && *o == off);
        for w in d.waiting_on(blk) {
            let extra: Vec<Cond> = match d.recs.get(&w).map(|r| &r.what) {
                Some(What::Work(Action::Drop(..))) => removal.into_iter().collect(),
                Some(What::Removed { .. }) => others.clone(),
                Some(What::Entry { blk: b, off: o, .. }) => {
                    let me = Cond::Entry {
                        blk: *b,
                        off: *o,
                        seq,
                    };
                    new_names.iter().copied().filter(|c| *c != me).collect()
                }
                _ => new_names.to_vec(),
            };
            d.replace_conds(w, at, &extra);
        }
    }

    /// The entries the call in progress added or changed, as conditions: written (durably,
    /// not rolled back) after now. A rename's old name waits for them (rule 3).
    fn op_entry_conds(&self, d: &Deps) -> Vec<Cond> {
        let Some(op) = d.op.as_ref() else {
            return Vec::new();
        };
        d.entry_conds(op.entries.iter().copied())
    }

    /// A directory renamed or moved (rename, or an exchange across parents) is on disk
    /// when the call returns: its new name, its new `..`, then its old name's removal, each
    /// a wave of its own. Without a log a directory rename is not atomic (001 §6): while
    /// those writes are under way the directory has two names, or a `..` its new name does
    /// not agree with — states fsck repairs, allowed only while the call is in flight
    /// (docs/CRASH.md, "Interrupted rename"). A file's rename is not held to it: two names
    /// of a file with a raised link count are a consistent hard link, so its old name's
    /// removal simply waits (`What::Removed`) and the call writes nothing.
    fn settle_directory_move(&self, tx: &mut Tx) -> Result<()> {
        let goal = {
            let d = self.inner.deps.lock();
            let Some(op) = d.op.as_ref().filter(|o| o.nesting == 0) else {
                return Ok(());
            };
            if op.dir_names_gone.is_empty() && op.dotdot.is_none() && !op.dir_whiteout {
                return Ok(());
            }
            let seq = d.seq;
            let mut goal = self.op_entry_conds(&d);
            goal.extend(op.dir_names_gone.iter().map(|&(blk, off)| Cond::Removed {
                blk,
                off,
                seq,
            }));
            goal
        };
        self.inner.settle(&tx.io.cache, goal, Cause::Rename)?;
        Ok(())
    }

    /// A directory moved by the call in progress that has no name on disk (its old name
    /// never reached it, and no earlier name is put back): its new `..` goes before its new
    /// name, so that the name never reaches disk beside a `..` naming another parent (fsck:
    /// damage). With a name on disk the order is the other way round — new name, then `..`,
    /// then the old name's removal — so every state keeps a name its `..` agrees with.
    fn dotdot_first(&self, d: &mut Deps, moved: Ino) {
        let Some(op) = d.op.as_ref() else { return };
        let Some(dd) = op.dotdot else { return };
        let names: Vec<u64> = op
            .entries
            .iter()
            .copied()
            .filter(|id| {
                *id != dd
                    && matches!(d.recs.get(id).map(|r| &r.what), Some(What::Entry { target, .. }) if *target == moved)
            })
            .collect();
        let Some(What::Entry { blk, off, .. }) = d.recs.get(&dd).map(|r| r.what.clone()) else {
            return;
        };
        let seq = d.seq;
        let dd_cond = Cond::Entry { blk, off, seq };
        for n in names {
            let Some(What::Entry {
                blk: nb, off: no, ..
            }) = d.recs.get(&n).map(|r| r.what.clone())
            else {
                continue;
            };
            d.drop_conds(
                dd,
                |c| matches!(c, Cond::Entry { blk, off, .. } if *blk == nb && *off == no),
            );
            d.wait_also(n, dd_cond);
        }
    }

    /// What the name of directory `ino`, emptied and about to go (rmdir, or a rename over
    /// it), waits for: the directory's own removals on disk — its blocks that had entries
    /// removed written after now, and no removed entry of them still put back. A directory
    /// no name reaches must not still hold names on disk (fsck: damage, not a leak).
    fn emptied_waits(&self, d: &mut Deps, ino: Ino) -> Vec<Cond> {
        let blks = d.removed_in.remove(&ino).unwrap_or_default();
        let mut waits = Vec::new();
        for b in blks {
            waits.extend(self.inner.cond_block(d, b));
            for id in d.removed_in_block(b) {
                if let Some(What::Removed { off, .. }) = d.recs.get(&id).map(|r| &r.what) {
                    waits.push(Cond::Removed {
                        blk: b,
                        off: *off,
                        seq: d.seq,
                    });
                }
            }
        }
        waits
    }
}

impl Strategy for SoftDep {
    fn name(&self) -> &'static str {
        self.name
    }

    fn commit_policy(&self) -> Commit {
        Commit::Async
    }

    fn syncer_interval(&self) -> Duration {
        Duration::from_secs(30)
    }

    fn io_model(&self) -> IoModel {
        IoModel::Concurrent
    }

    fn write_hooks(&self) -> Arc<dyn WriteHooks> {
        Arc::new(Hooks(self.inner.clone()))
    }

    fn attach(&self, sb: &Superblock) -> Result<()> {
        // The geometry is what the rollbacks need to find inodes in their blocks; a
        // read-only mount needs it too (reads consult the dependency records).
        let g = sb
            .geometry()
            .map_err(|e| cairn_vfs::FsError::Corrupt(e.0))?;
        *self.inner.geo.lock() = Some(g);
        Ok(())
    }

    fn recover(&self, _dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
        // Nothing to replay (002 §4: the disk is always consistent but for leaks). Harnesses
        // call `recover` without a mount: attach is idempotent.
        self.attach(sb)
    }

    fn mount(&self, e: &dyn Engine) -> Result<()> {
        *self.inner.cache.lock() = Some(e.io().cache.clone());
        Ok(())
    }

    fn background_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(200))
    }

    fn background(&self, e: &dyn Engine) -> Result<bool> {
        self.inner.run_ready(e, 64)?;
        Ok(!self.inner.deps.lock().ready.is_empty())
    }

    fn sync(&self, e: &dyn Engine, why: SyncWhy) -> Result<()> {
        let cache = e.io().cache.clone();
        if why == SyncWhy::Pressure {
            // A call that left the cache over its dirty mark pays one batch — the next one
            // of the round, in turn — not a round: no call waits on more than one write-back
            // batch, and successive calls make the round between them (each batch still
            // goes in dependency order after the one before it).
            self.inner.counters.rounds.fetch_add(1, Ordering::Relaxed);
            for _ in 0..PASSES.len() {
                let i = self.inner.next_pass.fetch_add(1, Ordering::Relaxed) % PASSES.len();
                if self.inner.pass(&cache, PASSES[i])? {
                    break;
                }
            }
            return Ok(());
        }
        let rounds = if why.durable() {
            MAX_ROUNDS
        } else {
            PERIODIC_ROUNDS
        };
        for _ in 0..rounds {
            self.inner.counters.rounds.fetch_add(1, Ordering::Relaxed);
            self.inner.round(&cache)?;
            let ran = self.inner.run_ready(e, usize::MAX)?;
            let done = {
                let d = self.inner.deps.lock();
                d.recs.is_empty() && d.ready.is_empty()
            };
            if done && ran == 0 && cache.dirty_count() == 0 {
                return Ok(());
            }
        }
        if why.durable() {
            let left = self.outstanding();
            if left > 0 {
                log::error!("soft updates: {left} dependencies left after a full drain");
            }
            cache.write_back_all()?;
            self.inner.flush(&cache, Cause::Round)?;
        }
        Ok(())
    }

    fn relieve(&self, e: &dyn Engine) -> Result<()> {
        // At the cap (FreeBSD's `max_softdeps`), the writer that reached it makes existing
        // records complete (a write-back round) and runs the worklist they turn into, until
        // three quarters of the cap: the hysteresis keeps every call from paying a round.
        // Without this the worker alone ran the worklist, and a mass delete grew it without
        // bound while it competed for the engine's lock
        // (`a_million_files_stay_under_the_default_cap`).
        if self.outstanding() < self.inner.max_deps {
            return Ok(());
        }
        let Some(cache) = self.inner.cache.lock().clone() else {
            return Ok(());
        };
        self.inner
            .counters
            .cap_waits
            .fetch_add(1, Ordering::Relaxed);
        let low = self.inner.max_deps / 4 * 3;
        for _ in 0..8 {
            let ready = self.inner.deps.lock().ready.len();
            self.inner.run_ready(e, ready)?;
            if self.outstanding() <= low {
                break;
            }
            self.inner.round(&cache)?;
        }
        Ok(())
    }

    fn begin_op(&self, _kind: OpKind) -> Result<OpState> {
        // The hard cap, for calls that race past `relieve`: inside a call the worklist
        // cannot run (it takes the engine's lock), so only records are counted here.
        let over = self.inner.deps.lock().recs.len() >= self.inner.max_deps;
        let cache = self.inner.cache.lock().clone();
        if over && let Some(cache) = cache {
            self.inner
                .counters
                .cap_waits
                .fetch_add(1, Ordering::Relaxed);
            self.inner.round(&cache)?;
        }
        self.inner.gate.enter_call();
        let mut d = self.inner.deps.lock();
        match d.op.as_mut() {
            Some(op) => op.nesting += 1,
            None => d.begin_op(),
        }
        Ok(None)
    }

    fn end_op(&self, tx: &mut Tx, ok: bool) -> Result<()> {
        if ok && matches!(tx.kind, OpKind::Rename | OpKind::Exchange) {
            self.settle_directory_move(tx)?;
        }
        {
            let mut d = self.inner.deps.lock();
            let finished = match d.op.as_mut() {
                Some(op) if op.nesting > 0 => {
                    op.nesting -= 1;
                    false
                }
                Some(_) => true,
                None => false,
            };
            if finished && let Some(log) = d.op.take() {
                if !ok {
                    d.undo_op(log);
                }
                d.blkmap.clear();
            }
        }
        self.inner.gate.leave();
        Ok(())
    }

    fn setup_inomapdep(&self, _tx: &mut Tx, f: &InoMapDep) -> Result<()> {
        let geo = self.geo()?;
        let (iblk, _) = geo.inode_location(f.ino);
        let mut d = self.inner.deps.lock();
        let mut waits = Vec::new();
        waits.extend(self.inner.cond_block(&d, f.bitmap.blkno()));
        waits.extend(self.inner.cond_block(&d, f.desc.blkno()));
        if let Some(old) = d.inomap.get(&f.ino).copied() {
            d.remove(old);
        }
        // A fresh inode is always written as free until its bitmap is on disk, even when
        // the bitmap already is: `waits` empty completes the record at once.
        d.insert(What::InoMap { ino: f.ino, iblk }, waits);
        self.made();
        Ok(())
    }

    /// A raised size of a regular file waits for the dirty blocks it newly covers that
    /// the file already had (new blocks wait through their allocation records).
    fn update_inodeblock(&self, tx: &mut Tx, ino: Ino, buf: &BufRef, was: u64) -> Result<()> {
        let geo = self.geo()?;
        let (iblk, off) = geo.inode_location(ino);
        let Some((mode, size)) = DiskInode::peek_mode_size(buf.read().get(off..).unwrap_or(&[]))
        else {
            return Ok(());
        };
        // The size on disk before this update, as far as a raised size goes: 0 for a fresh
        // inode (its allocation not yet on disk), the size last encoded this mount, else
        // (the first encoding since the block was read) the size the slot held — what the
        // disk holds. Reading it from the device instead cost every first write or atime
        // update after a mount a device read (small-file reads: 2.07 device reads per file
        // against async's 1.07).
        //
        // `scanned`: where this update's look at the file's blocks starts. Blocks below
        // the size last encoded were looked at by the update that raised it (held then if
        // dirty; a block allocated since is a new allocation, held by its own record), so
        // only the raised range needs a look. For a fresh inode the safe size stays 0 but
        // the look starts there too: from 0 it was up to 1,024 cache lookups per write of
        // a file being streamed out (twice per write: more than half of soft updates' CPU
        // writing an 80 MiB file, fstests generic/371).
        let (prev, scanned) = {
            let mut d = self.inner.deps.lock();
            let encoded = d.enc_size.get(&ino).copied();
            let (prev, scanned) = if size == 0 {
                (0, 0)
            } else if d.inomap.contains_key(&ino) {
                (0, encoded.unwrap_or(0))
            } else {
                let p = encoded.unwrap_or(was);
                (p, p)
            };
            // Most updates raise no size (times, link counts, a write inside the file) and
            // only a regular file's raised size needs a hold: those are told from the mode
            // and size alone, without decoding the inode.
            if mode & libc::S_IFMT != libc::S_IFREG || size <= scanned {
                d.enc_size.insert(ino, size);
                return Ok(());
            }
            (prev, scanned)
        };
        let di = {
            let data = buf.read();
            match data
                .get(off..off + INODE_SIZE)
                .map(|b| DiskInode::decode(ino, b))
            {
                Some(Ok(di)) => di,
                _ => return Ok(()),
            }
        };
        let mut d = self.inner.deps.lock();
        d.enc_size.insert(ino, di.size);
        if !di.is_reg() || di.size <= scanned || di.fast_link.is_some() {
            return Ok(());
        }
        let bs = geo.block_size as u64;
        let first = scanned / bs;
        let last = (di.size - 1) / bs;
        let cache = &tx.io.cache;
        let mut waits = Vec::new();
        // Bounded: a size raised over a long run is a truncate up (holes) or a stream (new
        // blocks, held by their allocations); the blocks that matter are at its ends.
        let lbns: Vec<u64> = if last - first <= 1024 {
            (first..=last).collect()
        } else {
            (first..first + 512).chain(last - 511..=last).collect()
        };
        for lbn in lbns {
            let Some(p) = map_cached(cache, &geo, &di, lbn) else {
                continue;
            };
            if d.alloc_new.contains_key(&(ino, p)) {
                continue;
            }
            if cache.lookup(p).is_some_and(|b| b.is_dirty()) {
                waits.push(Cond::Block(p, d.seq));
            }
        }
        if !waits.is_empty() {
            d.insert(
                What::Size {
                    ino,
                    iblk,
                    safe: prev,
                },
                waits,
            );
            self.made();
        }
        Ok(())
    }

    fn setup_blkmapdep(&self, _tx: &mut Tx, f: &BlkMapDep) -> Result<()> {
        self.with_op(|d| {
            d.blkmap.insert(f.blk, [f.bitmap.blkno(), f.desc.blkno()]);
        });
        Ok(())
    }

    fn setup_allocdirect(&self, _tx: &mut Tx, f: &AllocDirect) -> Result<()> {
        let geo = self.geo()?;
        let (iblk, _) = geo.inode_location(f.ino);
        let chain: Vec<Blk> = f.chain.iter().map(|b| b.blkno()).collect();
        // The xattr pointer's blocks are its whole list's (`AllocDirect::new_size`): what
        // the count shows more (or less) when the pointer rolls back to the old list.
        let blocks_back = if f.ptr == InodePtr::Xattr {
            (i64::from(f.old_size) - i64::from(f.new_size)) / i64::from(geo.block_size)
        } else {
            0
        };
        self.alloc(
            f.ino,
            PtrAt::Inode { ptr: f.ptr, iblk },
            Some(f.ptr),
            f.lbn,
            f.new_blk,
            f.old_blk,
            f.kind,
            (&chain, blocks_back),
        )
    }

    fn setup_allocindir(&self, _tx: &mut Tx, f: &AllocIndir) -> Result<()> {
        let geo = self.geo()?;
        let (iblk, _) = geo.inode_location(f.ino);
        self.alloc(
            f.ino,
            PtrAt::Indir {
                holder: f.indir.blkno(),
                slot: f.slot,
                iblk,
            },
            None,
            f.lbn,
            f.new_blk,
            f.old_blk,
            f.kind,
            (&[], 0),
        )
    }

    /// The zero-range write of the new blocks is durable: for each block's allocation
    /// record, the condition "the block written after the record was made" holds, exactly
    /// as a durable write of a buffer of zeros would have made it hold (`on_durable` with a
    /// sequence number above every record the call made).
    fn setup_data_zeroed(&self, _tx: &mut Tx, f: &DataZeroed) -> Result<()> {
        let mut d = self.inner.deps.lock();
        let seq = d.next_seq();
        for blk in f.first..f.first.saturating_add(f.count) {
            d.on_durable(&deps::Written {
                blk,
                seq,
                ..Default::default()
            });
        }
        Ok(())
    }

    fn setup_directory_add(&self, tx: &mut Tx, f: &DirAdd) -> Result<()> {
        let geo = self.geo()?;
        let mut d = self.inner.deps.lock();
        let mut waits = self.entry_waits(&d, &geo, f.ino);
        if f.new_inode
            && !waits
                .iter()
                .any(|c| matches!(c, Cond::Inode { ino, .. } if *ino == f.ino))
        {
            let (iblk, _) = geo.inode_location(f.ino);
            waits.push(Cond::Inode {
                ino: f.ino,
                blk: iblk,
                seq: d.seq,
            });
        }
        // An entry in a directory whose own name is not on disk yet waits for that name:
        // a non-empty directory no entry reaches is damage, not a leak.
        waits.extend(self.reachable_waits(&d, f.dir));
        waits.extend(self.parent_count_wait(&d, &geo, f.dir, f.dtype, &waits));
        let blk = f.buf.blkno();
        let off = f.offset;
        if let Some(old) = d.entries.get(&(blk, off)).copied() {
            d.remove(old);
        }
        let len = dir::rec_size(f.name.len());
        let id = d.insert(
            What::Entry {
                dir: f.dir,
                blk,
                off,
                target: f.ino,
                old: None,
                applied: false,
            },
            waits,
        );
        self.made();
        // Under the name of a removed entry still put back in this directory (a name
        // reused before the syncer wrote its removal), or over its bytes: the entry waits
        // for that removal to be on disk (the two cannot be there together), and the
        // removal is made durable now, which keeps a later rename from making the removal
        // wait for this very entry. The bytes are held from new entries
        // (`held_dir_bytes`: the engine's directory index places them elsewhere), so only
        // a reused name comes here; the byte check stays as the last line of rule 3.
        let in_way = d.put_backs_in_the_way(f.dir, blk, off, len, f.name);
        if !in_way.is_empty() {
            let seq = d.seq;
            let goal: Vec<Cond> = in_way
                .iter()
                .filter_map(|r| match d.recs.get(r).map(|x| &x.what) {
                    Some(What::Removed { blk, off, .. }) => Some(Cond::Removed {
                        blk: *blk,
                        off: *off,
                        seq,
                    }),
                    _ => None,
                })
                .collect();
            for c in &goal {
                d.wait_also(id, *c);
            }
            drop(d);
            self.inner.settle(&tx.io.cache, goal, Cause::Reuse)?;
        }
        Ok(())
    }

    fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> Result<Apply> {
        let geo = self.geo()?;
        let blk = f.buf.blkno();
        let off = f.offset;
        let old_dtype = if f.old_is_dir || f.dotdot {
            libc::DT_DIR
        } else {
            self.dtype_of(&geo, f.old_ino, f.old_dtype)
        };
        let drops = Self::removal_drops(tx.kind, f);
        let mut d = self.inner.deps.lock();
        let mut waits = self.entry_waits(&d, &geo, f.new_ino);
        waits.extend(self.reachable_waits(&d, f.dir));
        if !f.dotdot {
            waits.extend(self.parent_count_wait(&d, &geo, f.dir, f.dtype, &waits));
        }
        let mut new_names = Vec::new();
        if f.whiteout {
            // A rename's old name given to the whiteout the call made: the whiteout's
            // inode first, as for mknod's entry (rule 1), and the rename's new names
            // first, as for its old name's removal (rule 3). A directory's old name is
            // settled when the call ends, as a renamed directory's removed name is.
            if !waits
                .iter()
                .any(|c| matches!(c, Cond::Inode { ino, .. } if *ino == f.new_ino))
            {
                let (iblk, _) = geo.inode_location(f.new_ino);
                waits.push(Cond::Inode {
                    ino: f.new_ino,
                    blk: iblk,
                    seq: d.seq,
                });
            }
            new_names = self.op_entry_conds(&d);
            waits.extend(new_names.iter().copied());
            if old_dtype == libc::DT_DIR
                && let Some(op) = d.op.as_mut()
            {
                op.dir_whiteout = true;
            }
        }
        if f.old_is_dir && !f.dotdot {
            // A rename over an empty directory: its name goes as rmdir's would.
            let emptied = self.emptied_waits(&mut d, f.old_ino);
            waits.extend(emptied);
        }
        // What the disk holds at this entry: an earlier pending record's view wins.
        let old = match d.entries.get(&(blk, off)).copied() {
            Some(id) => {
                let prev = match d.recs.get(&id).map(|r| &r.what) {
                    // Allowed on disk already (perhaps written): the entry as it is now
                    // is what a rollback may safely show.
                    Some(What::Entry { applied: true, .. }) => {
                        Some(Some((f.old_ino as u32, old_dtype)))
                    }
                    // Not on disk: the disk still shows what that record rolls back to
                    // (nothing, for an add).
                    Some(What::Entry { old, .. }) => Some(*old),
                    _ => None,
                };
                d.remove(id);
                if f.whiteout {
                    // The old name is leaving the moved inode, as a rename's removal
                    // would take it: what waited for it waits as it would then, a drop
                    // for the whiteout's entry itself.
                    let removal = Cond::Entry {
                        blk,
                        off,
                        seq: d.seq,
                    };
                    Self::rewire_cancelled_entry(
                        &mut d,
                        (blk, off),
                        f.old_ino,
                        Some(removal),
                        &new_names,
                    );
                }
                prev.unwrap_or(Some((f.old_ino as u32, old_dtype)))
            }
            None => Some((f.old_ino as u32, old_dtype)),
        };
        // The disk still names, here, an inode other than the one this call replaces or
        // puts here: an earlier call's change of this entry (a rename over it, a whiteout
        // left by a rename) never reached disk, and this one takes its place. Writing it
        // takes that inode's durable name away as the earlier change would have, so it
        // waits as that one did (rule 3) for the inode's names still on their way — else a
        // file renamed away, then its old name renamed over, could reach disk with no name
        // at all (the crash workload `rename-whiteout` found it).
        if let Some((x, _)) = old
            && Ino::from(x) != f.old_ino
            && Ino::from(x) != f.new_ino
        {
            waits.extend(d.entry_conds(d.entries_naming(Ino::from(x))));
        }
        let on_disk = old.is_some();
        if f.whiteout && !on_disk && old_dtype == libc::DT_DIR && !d.named_by_put_back(f.old_ino) {
            // A moved directory whose old name never reached disk: its new `..` first.
            self.dotdot_first(&mut d, f.old_ino);
        }
        let id = d.insert(
            What::Entry {
                dir: f.dir,
                blk,
                off,
                target: f.new_ino,
                old,
                applied: false,
            },
            waits,
        );
        self.made();
        if f.dotdot
            && let Some(op) = d.op.as_mut()
        {
            op.dotdot = Some(id);
        }
        if drops.is_empty() {
            return Ok(Apply::Now);
        }
        if !on_disk {
            // The old name never reached disk at this entry: nothing to wait for.
            return Ok(Apply::Now);
        }
        // The old inode's count drops once the changed entry is on disk (not rolled back).
        let seq = d.seq;
        for (ino, n) in drops {
            d.insert(
                What::Work(Action::Drop(ino, n)),
                vec![Cond::Entry { blk, off, seq }],
            );
            self.made();
        }
        Ok(Apply::Deferred)
    }

    fn setup_directory_remove(&self, tx: &mut Tx, f: &DirRemove) -> Result<Apply> {
        let blk = f.buf.blkno();
        let off = f.offset;
        let rename = tx.kind == OpKind::Rename;
        let mut d = self.inner.deps.lock();
        // What a write of this block would show at the entry if the removal were undone:
        // the buffer's entry, or what a pending record of it still writes instead.
        let dtype = f.buf.read().get(off as usize + 6).copied().unwrap_or(0);
        let mut disk = Some((f.ino, dtype));
        let mut pending = None;
        if let Some(id) = d.entries.get(&(blk, off)).copied()
            && let Some(What::Entry { old, applied, .. }) = d.recs.get(&id).map(|r| &r.what)
        {
            if !applied {
                disk = old.map(|(i, t)| (i as Ino, t));
            }
            pending = Some(id);
        }
        // 002 Fig. 1: a name that never reached disk need not be removed there before the
        // count drops (FreeBSD cancels the diradd against the dirrem).
        let never = disk.is_none();
        // The disk still names, here, an inode other than the one removed: an earlier
        // call's change of this entry (a rename over it, a whiteout left by a rename) never
        // reached disk. Removing the entry takes that inode's durable name away, as the
        // earlier change would have: it waits as that one did (rule 3) for the inode's names
        // still on their way (the crash workload `rename-whiteout`: a file renamed away
        // leaving a whiteout, the whiteout unlinked, the file left with no name on disk).
        let earlier = disk.map(|(i, _)| i).filter(|&i| i != f.ino);
        // The old name of a rename, and the name of a removed directory, stay on disk until
        // what they wait for is (rule 3; an emptied directory's removals): their removal is
        // put back at write time until then. Other removals go with their block's next write.
        let restorable = !never && (rename || f.rmdir || earlier.is_some());
        let seq = d.seq;
        let removal = if restorable {
            Some(Cond::Removed { blk, off, seq })
        } else {
            self.inner.cond_block(&d, blk)
        };
        let new_names = if rename {
            self.op_entry_conds(&d)
        } else {
            Vec::new()
        };
        if let Some(id) = pending {
            d.remove(id);
            // What waited for the entry to be on disk: a drop of the inode it replaced now
            // waits for this removal; an earlier rename's old name, put back until this
            // name was there, waits for the inode's other names still on their way (this
            // rename's new ones among them: the file keeps a name on disk throughout; none
            // when it has no other name left, or only names already on disk); entries (and a
            // `..`) waiting for it to reach the directory it names wait for this rename's
            // new names, or, when the directory's name is unlinked, no more.
            Self::rewire_cancelled_entry(&mut d, (blk, off), f.ino, removal, &new_names);
        }
        if rename && disk.is_none() && !d.named_by_put_back(f.ino) {
            self.dotdot_first(&mut d, f.ino);
        }
        let emptied = if f.rmdir {
            self.emptied_waits(&mut d, f.ino)
        } else {
            Vec::new()
        };
        if never {
            return Ok(Apply::Now);
        }
        let v = d.removed_in.entry(f.dir).or_default();
        if !v.contains(&blk) {
            v.push(blk);
        }
        if rename
            && dtype == libc::DT_DIR
            && let Some(op) = d.op.as_mut()
        {
            op.dir_names_gone.push((blk, off));
        }
        if restorable && let Some((ino, dtype)) = disk {
            let mut waits = if rename { new_names } else { emptied };
            if let Some(x) = earlier {
                waits.extend(d.entry_conds(d.entries_naming(x)));
            }
            d.insert(
                What::Removed {
                    dir: f.dir,
                    blk,
                    off,
                    ino,
                    dtype,
                    name: f.name.into(),
                },
                waits,
            );
            self.made();
        }
        let mut drops = vec![(f.ino, if f.rmdir { 2 } else { 1 })];
        if f.rmdir {
            drops.push((f.dir, 1));
        }
        let waits: Vec<Cond> = removal.into_iter().collect();
        for (ino, n) in drops {
            d.insert(What::Work(Action::Drop(ino, n)), waits.clone());
            self.made();
        }
        Ok(Apply::Deferred)
    }

    fn change_linkcnt(&self, _tx: &mut Tx, f: &LinkChange) -> Result<()> {
        if f.after > f.before && f.why != LinkWhy::Drop {
            self.with_op(|d| {
                if let Some(op) = d.op.as_mut()
                    && !op.raised.contains(&f.ino)
                {
                    op.raised.push(f.ino);
                }
            });
        }
        Ok(())
    }

    /// A mode changed with the access ACL: the mode waits for what the new xattr pointer
    /// waits for (`What::Mode`).
    fn setup_attr_change(&self, _tx: &mut Tx, f: &AttrChange) -> Result<()> {
        let Some(am) = f.acl_mode else {
            return Ok(());
        };
        let geo = self.geo()?;
        let (iblk, _) = geo.inode_location(f.ino);
        let mut d = self.inner.deps.lock();
        let waits = deps::ids_at(&d.alloc_by_ino, &f.ino)
            .into_iter()
            .find_map(|id| match d.recs.get(&id) {
                Some(r)
                    if matches!(r.what, What::Alloc {
                    at: PtrAt::Inode { ptr: InodePtr::Xattr, .. },
                    new_blk,
                    applied: false,
                    ..
                } if new_blk == am.xattr_blk) =>
                {
                    Some(r.waits.clone())
                }
                _ => None,
            })
            .unwrap_or_default();
        match d.modes.get(&f.ino).copied() {
            Some(id) => d.rewait(id, waits),
            None if waits.is_empty() => {}
            None => {
                d.insert(
                    What::Mode {
                        ino: f.ino,
                        iblk,
                        safe: am.old_mode,
                    },
                    waits,
                );
                self.made();
            }
        }
        Ok(())
    }

    fn setup_freeblocks(&self, tx: &mut Tx, f: &FreeBlocks) -> Result<()> {
        let geo = self.geo()?;
        let mut d = self.inner.deps.lock();
        // Pointers still pending never reached disk: their blocks go back at once.
        let mut now = Vec::new();
        let mut later = Vec::new();
        let allocs = deps::ids_at(&d.alloc_by_ino, &f.ino);
        let never_on_disk = d.inomap.contains_key(&f.ino);
        // The blocks whose allocation is still pending, gathered in one pass over the
        // inode's records (not one pass per freed block: removing a file of 20,000 blocks
        // written since the last write-back was 400 million lookups, seconds per `rm`).
        let mut pending: rustc_hash::FxHashSet<u64> = allocs
            .iter()
            .filter_map(|id| match d.recs.get(id).map(|r| &r.what) {
                Some(What::Alloc {
                    new_blk,
                    applied: false,
                    ..
                }) => Some(*new_blk),
                _ => None,
            })
            .collect();
        for b in f.freed {
            if pending.remove(b) || never_on_disk {
                now.push(*b);
            } else {
                later.push(*b);
            }
        }
        // Every allocation record of a freed block is moot: a pending one (its block went
        // back above), or an applied one (safe, awaiting its holder).
        let freed: rustc_hash::FxHashSet<u64> = f.freed.iter().copied().collect();
        for id in allocs {
            if let Some(What::Alloc { new_blk, .. }) = d.recs.get(&id).map(|r| &r.what)
                && freed.contains(new_blk)
            {
                d.remove(id);
            }
        }
        if !now.is_empty() {
            tx.release(Release::Blocks(now));
        }
        if !f.whole_file {
            // A truncation: the inode with its new size goes to disk first. What follows it
            // may otherwise land before it — the last block's zeroed tail, indirect blocks
            // with cleared pointers (a write-back round writes data and indirect blocks
            // before inodes) — and an old size over them reads as zeros where data was
            // (FFS with soft updates truncates a file still in use synchronously as well).
            let (iblk, _) = geo.inode_location(f.ino);
            drop(d);
            self.inner
                .write_blocks(&tx.io.cache, &[iblk], Cause::Truncate)?;
            d = self.inner.deps.lock();
        }
        if !later.is_empty() {
            let mut waits: Vec<Cond> = self.inner.cond_inode(&d, &geo, f.ino).into_iter().collect();
            for h in f.holders {
                waits.extend(self.inner.cond_block(&d, h.blkno()));
            }
            d.insert(What::Work(Action::Release(Release::Blocks(later))), waits);
            self.made();
        }
        Ok(())
    }

    fn setup_freefile(&self, tx: &mut Tx, f: &FreeFile) -> Result<()> {
        let geo = self.geo()?;
        let mut d = self.inner.deps.lock();
        let r = Release::Inode {
            ino: f.ino,
            is_dir: f.is_dir,
        };
        // Everything the inode still had pending is moot: it is free now.
        let never = d.inomap.contains_key(&f.ino);
        for id in d.inode_records(f.ino) {
            d.remove(id);
        }
        d.enc_size.remove(&f.ino);
        if never {
            // The inode never reached disk: its bit goes back at once.
            tx.release(r);
            return Ok(());
        }
        let waits: Vec<Cond> = self.inner.cond_inode(&d, &geo, f.ino).into_iter().collect();
        d.insert(What::Work(Action::Release(r)), waits);
        self.made();
        Ok(())
    }

    fn fsync(&self, e: &dyn Engine, f: &FsyncReq) -> Result<()> {
        let geo = self.geo()?;
        let cache = e.io().cache.clone();
        let goal = {
            let d = self.inner.deps.lock();
            let seq = d.seq;
            // The file's dirty data and indirect blocks.
            let mut goal: Vec<Cond> = f
                .blocks
                .iter()
                .filter(|b| b.is_dirty())
                .map(|b| Cond::Block(b.blkno(), seq))
                .collect();
            // Its inode, whole; then the names reaching it, up the tree, and the inodes of
            // the directories holding them where those still roll something back (a
            // directory's new block is no place for a name until the pointer to it is).
            let (iblk, _) = geo.inode_location(f.ino);
            if d.inode_pending(f.ino) || self.inner.cond_block(&d, iblk).is_some() {
                goal.push(Cond::Inode {
                    ino: f.ino,
                    blk: iblk,
                    seq,
                });
            }
            let mut todo = vec![f.ino];
            let mut seen = vec![f.ino];
            while let Some(t) = todo.pop() {
                for id in d.entries_naming(t) {
                    let Some(What::Entry { dir, blk, off, .. }) = d.recs.get(&id).map(|r| &r.what)
                    else {
                        continue;
                    };
                    goal.push(Cond::Entry {
                        blk: *blk,
                        off: *off,
                        seq,
                    });
                    if d.inode_pending(*dir) {
                        let (b, _) = geo.inode_location(*dir);
                        goal.push(Cond::Inode {
                            ino: *dir,
                            blk: b,
                            seq,
                        });
                    }
                    if seen.len() < 64 && !seen.contains(dir) {
                        seen.push(*dir);
                        todo.push(*dir);
                    }
                }
            }
            goal
        };
        let waves = self.inner.settle(&cache, goal, Cause::Fsync)?;
        if waves == 0 {
            // Nothing cached was dirty; a stream may still have written the device.
            self.inner.flush(&cache, Cause::Fsync)?;
        }
        Ok(())
    }

    /// A removed entry put back at write time ([`What::Removed`]) holds the bytes its
    /// removal merged away: an entry placed over them would have to wait for the removal
    /// (the two cannot be on disk together), and that wait is what used to force the
    /// removal and its chain to disk in the call (`Cause::Reuse`, ~4 flushes each).
    fn held_dir_bytes(&self, blk: Blk) -> Vec<(u32, u32)> {
        self.inner.deps.lock().held_in_block(blk)
    }

    fn dir_bytes_given_back(&self) -> Vec<(Ino, Blk)> {
        let mut d = self.inner.deps.lock();
        if d.given_back.is_empty() {
            return Vec::new();
        }
        let mut v: Vec<(Ino, Blk)> = d.given_back.drain().collect();
        v.sort_unstable();
        v
    }

    fn has_pending_frees(&self) -> bool {
        // Frees wait on records (a removal not yet on disk) or sit ready in the worklist.
        let d = self.inner.deps.lock();
        !d.recs.is_empty() || !d.ready.is_empty()
    }

    fn background_check_holds(&self) -> Option<crate::bgcheck::Held> {
        // Everything the worklist will still do: waiting on records, ready, or being
        // applied right now (002 §3.3: the background check must not free what the
        // worklist is about to free, nor lower a count the worklist is about to lower).
        let d = self.inner.deps.lock();
        let mut h = crate::bgcheck::Held::default();
        let waiting = d.recs.values().filter_map(|r| match &r.what {
            What::Work(a) => Some(a),
            _ => None,
        });
        for a in waiting.chain(d.ready.iter()).chain(d.running.iter()) {
            match a {
                Action::Drop(ino, _) => h.hold_inode(*ino, false),
                Action::Release(Release::Inode { ino, is_dir }) => h.hold_inode(*ino, *is_dir),
                Action::Release(Release::Blocks(b)) => h.blocks.extend(b.iter().copied()),
            }
        }
        Some(h)
    }

    fn stats(&self) -> Option<serde_json::Value> {
        let c = &self.inner.counters;
        let d = self.inner.deps.lock();
        Some(serde_json::json!({
            "dependencies": d.recs.len(),
            "worklist_ready": d.ready.len(),
            "dependencies_peak": d.peak,
            "max_dependencies": self.inner.max_deps,
            "dependencies_made": c.records_made.load(Ordering::Relaxed),
            "work_done": c.work_done.load(Ordering::Relaxed),
            "writes": c.writes.load(Ordering::Relaxed),
            "writes_rolled_back": c.writes_rolled_back.load(Ordering::Relaxed),
            "rollbacks": c.rollbacks.load(Ordering::Relaxed),
            "cap_waits": c.cap_waits.load(Ordering::Relaxed),
            "write_back_rounds": c.rounds.load(Ordering::Relaxed),
            "gate": self.inner.gate.waits.json(),
            "flushes": Cause::ALL
                .iter()
                .map(|w| {
                    let n = c.flushes[*w as usize].load(Ordering::Relaxed);
                    (w.name().to_string(), serde_json::Value::from(n))
                })
                .collect::<serde_json::Map<_, _>>(),
        }))
    }
}

/// Block `lbn` of the file `di` describes, through indirect blocks in the cache only
/// (`None`: a hole, or not cached — a block the engine just wrote is always cached).
fn map_cached(cache: &BufferCache, geo: &Geometry, di: &DiskInode, lbn: u64) -> Option<Blk> {
    let nd = crate::format::NDIRECT as u64;
    if lbn < nd {
        return Some(di.direct[lbn as usize]).filter(|p| *p != 0);
    }
    let ppb = (geo.block_size / 8) as u64;
    let mut rel = lbn - nd;
    let mut span = ppb;
    for level in 0..3usize {
        if rel < span {
            let mut cur = di.indirect[level];
            let mut sub = span;
            for _ in 0..=level {
                if cur == 0 {
                    return None;
                }
                sub /= ppb;
                let b = cache.lookup(cur)?;
                let idx = (rel / sub) as usize;
                cur = crate::format::get_u64(&b.read(), idx * 8);
                rel %= sub;
            }
            return Some(cur).filter(|p| *p != 0);
        }
        rel -= span;
        span = span.saturating_mul(ppb);
    }
    None
}

/// The mode options softdep parses itself.
pub const OPTIONS: &[OptionSpec] = &[OptionSpec {
    key: "max_softdeps",
    values: "N",
    default: "200000",
    help: "cap on dependency records; at the cap a new call first writes back so existing ones complete (at least 64)",
}];

fn make(opts: &[(String, Option<String>)]) -> std::result::Result<Box<dyn Strategy>, String> {
    let mut max = DEFAULT_MAX_DEPS;
    for (k, v) in opts {
        match (k.as_str(), v) {
            ("max_softdeps", Some(v)) => {
                max = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= 64)
                    .ok_or_else(|| format!("max_softdeps={v}: a count of at least 64"))?;
            }
            ("max_softdeps", None) => return Err("max_softdeps needs a value".into()),
            _ => {
                return Err(format!(
                    "mount option '{k}' is not an option of mode softdep"
                ));
            }
        }
    }
    Ok(Box::new(SoftDep::new(max)))
}

/// Soft updates as the registry lists it.
pub const MODE: ModeInfo = ModeInfo {
    name: "softdep",
    description: "soft updates: delayed metadata writes ordered by per-pointer dependencies rolled back at write time; frees in the background",
    // 002 §4: the disk is always consistent but for leaks; new blocks reach disk before
    // any pointer to them (no stale data, 001 §6); fsync writes the file, its inode and
    // the entries naming it.
    guarantees: Guarantees {
        metadata_on_return: false,
        fsync_data_first: true,
        no_stale_data: true,
        names_kept: true,
        corrupt: Allowed::Never,
        leak: Allowed::May,
        interrupted_rename: Allowed::May,
        after_crash: AfterCrash::Mount,
        basis: "002 §3-§4: rules 1-3 kept by dependencies rolled back at write time; only leaks after a crash; no pointer to uninitialized data",
    },
    facts: Facts {
        family: Family::SoftUpdates,
        commit: Commit::Async,
        recovery: Recovery::None,
        log: LogPlacement::None,
    },
    options: OPTIONS,
    make,
};
