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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::{Buf, BufRef, BufferCache, Pressure, WriteHooks};
use cairn_vfs::modes::{AfterCrash, Allowed, Guarantees, ModeOption};
use cairn_vfs::{KernelCachePolicy, Result};
use parking_lot::{Condvar, Mutex};

use super::{
    AllocDirect, AllocIndir, Apply, AttrChange, Blk, BlkMapDep, DirAdd, DirChange, DirRemove,
    Engine, FreeBlocks, FreeFile, FsyncReq, Ino, InoMapDep, InodePtr, IoModel, LinkChange, LinkWhy,
    ModeInfo, OpKind, OpState, Release, Strategy, SyncWhy, Tx,
};
use crate::format::{DiskInode, Geometry, INODE_SIZE, Superblock, kind};
use deps::{Action, Cond, Deps, OpLog, PtrAt, What};

/// Default cap on dependency records (FreeBSD's `max_softdeps`, scaled to a user-space
/// cache): at the cap, a new call first writes back so existing records complete.
pub const DEFAULT_MAX_DEPS: usize = 200_000;

/// Write-back rounds a periodic or pressure pass makes (sync(2) and unmount go on until
/// nothing is left).
const PERIODIC_ROUNDS: usize = 2;
/// A drain that has not finished after this many rounds is stuck: reported, not looped.
const MAX_ROUNDS: usize = 200;

/// Calls and soft-updates write passes exclude each other; one thread may nest.
struct Gate {
    st: Mutex<(Option<std::thread::ThreadId>, u32)>,
    cv: Condvar,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            st: Mutex::new((None, 0)),
            cv: Condvar::new(),
        }
    }
    fn enter(&self) {
        let me = std::thread::current().id();
        let mut s = self.st.lock();
        loop {
            match s.0 {
                None => {
                    *s = (Some(me), 1);
                    return;
                }
                Some(t) if t == me => {
                    s.1 += 1;
                    return;
                }
                _ => self.cv.wait(&mut s),
            }
        }
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

/// Counters shown in `cairn stats`.
#[derive(Default)]
struct Counters {
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
    /// Test-only planted bug: directory entries are never rolled back.
    skip_entry_rollback: bool,
    /// Test-only planted bug: a rename that moves no directory does not write its new
    /// entries before it returns.
    skip_rename_force: bool,
    /// The planted bug's note that the call in progress named a directory in an entry it
    /// added or changed (set only when `skip_rename_force`).
    op_names_dir: AtomicBool,
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
        SoftDep::build("softdep", max_deps)
    }

    /// A broken soft updates, called `name`, for the crash harness's planted bugs: new
    /// directory entries are written before the inodes they name (the entry rollback in
    /// `before_write` is skipped). Never reachable from a mount.
    pub fn without_entry_rollback(name: &'static str) -> SoftDep {
        let mut s = SoftDep::build(name, DEFAULT_MAX_DEPS);
        Arc::get_mut(&mut s.inner)
            .expect("just built")
            .skip_entry_rollback = true;
        s
    }

    /// A broken soft updates, called `name`, for the crash harness's planted bugs: a rename
    /// that moves no directory leaves its new entry to the write-back like any other (the
    /// force at its end that keeps rule 3 is skipped), so the new name and the old name's
    /// removal can reach disk in one write-back, in either order. Never reachable from a
    /// mount.
    pub fn without_rename_force(name: &'static str) -> SoftDep {
        let mut s = SoftDep::build(name, DEFAULT_MAX_DEPS);
        Arc::get_mut(&mut s.inner)
            .expect("just built")
            .skip_rename_force = true;
        s
    }

    fn build(name: &'static str, max_deps: usize) -> SoftDep {
        SoftDep {
            name,
            inner: Arc::new(Inner {
                deps: Mutex::new(Deps::default()),
                geo: Mutex::new(None),
                cache: Mutex::new(None),
                gate: Gate::new(),
                max_deps: max_deps.max(64),
                counters: Counters::default(),
                skip_entry_rollback: false,
                skip_rename_force: false,
                op_names_dir: AtomicBool::new(false),
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
    /// to it, unrolled: a write that rolled something back keeps it dirty).
    fn sweep(&self, d: &mut Deps) {
        let Some(cache) = self.cache.lock().clone() else {
            return;
        };
        for blk in d.waited_blocks() {
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

    /// Writes the dirty buffers `pick` selects, then flushes.
    fn pass(&self, cache: &BufferCache, pick: &dyn Fn(&Buf) -> bool) -> Result<()> {
        cache.write_back_filter(pick)?;
        cache.flush_device()?;
        Ok(())
    }

    /// One round of write-back in dependency order.
    fn round(&self, cache: &BufferCache) -> Result<()> {
        self.gate.enter();
        let r = (|| {
            self.sweep(&mut self.deps.lock());
            self.pass(cache, &|b| {
                matches!(b.kind(), kind::DATA | kind::GROUP | kind::XATTR)
            })?;
            self.pass(cache, &|b| b.kind() == kind::INDIRECT)?;
            self.pass(cache, &|b| b.kind() == kind::INODE)?;
            self.pass(cache, &|b| b.kind() == kind::DIRECTORY)?;
            self.sweep(&mut self.deps.lock());
            Ok(())
        })();
        self.gate.leave();
        r
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

    /// Makes inode `ino` reach disk with nothing rolled back: what its pending pointers
    /// wait for first, then the indirect blocks carrying them, then its own block.
    fn flush_inode(&self, cache: &BufferCache, geo: &Geometry, ino: Ino) -> Result<()> {
        let (iblk, _) = geo.inode_location(ino);
        for _ in 0..8 {
            let (waits, holders) = {
                let d = self.deps.lock();
                let ids = d.inode_records(ino);
                let mut waits = Vec::new();
                let mut holders = Vec::new();
                for id in ids {
                    if let Some(r) = d.recs.get(&id) {
                        waits.extend(r.waits.iter().map(|c| c.blk()));
                        if let What::Alloc {
                            at: PtrAt::Indir { holder, .. },
                            ..
                        } = r.what
                        {
                            holders.push(holder);
                        }
                    }
                }
                (waits, holders)
            };
            self.write_blocks(cache, &waits)?;
            self.write_blocks(cache, &holders)?;
            self.write_blocks(cache, &[iblk])?;
            let d = self.deps.lock();
            let clean = !cache.lookup(iblk).is_some_and(|b| b.is_dirty());
            if clean && !d.inode_pending(ino) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Writes the dirty ones of `blks`, flushes, and sweeps.
    fn write_blocks(&self, cache: &BufferCache, blks: &[Blk]) -> Result<()> {
        let bufs: Vec<BufRef> = blks
            .iter()
            .filter_map(|b| cache.lookup(*b))
            .filter(|b| b.is_dirty())
            .collect();
        if !bufs.is_empty() {
            let refs: Vec<&BufRef> = bufs.iter().collect();
            cache.write_now(&refs)?;
        }
        cache.flush_device()?;
        self.sweep(&mut self.deps.lock());
        Ok(())
    }

    /// The pending entries naming `ino`, and those naming the directories holding them,
    /// up the tree: (directory, block, inodes the entry waits for), the topmost first.
    fn entry_chain(&self, ino: Ino) -> Vec<(Ino, Blk, Vec<Ino>)> {
        let d = self.deps.lock();
        let mut out: Vec<(Ino, Blk, Vec<Ino>)> = Vec::new();
        let mut todo = vec![(ino, 0u32)];
        while let Some((t, depth)) = todo.pop() {
            for id in d.entries_naming(t) {
                let Some(r) = d.recs.get(&id) else { continue };
                let What::Entry { dir, blk, .. } = r.what else {
                    continue;
                };
                let inos = r
                    .waits
                    .iter()
                    .filter_map(|c| match c {
                        Cond::Inode { ino, .. } => Some(*ino),
                        _ => None,
                    })
                    .collect();
                if out.iter().any(|(d2, b2, _)| *d2 == dir && *b2 == blk) {
                    continue;
                }
                out.push((dir, blk, inos));
                if depth < 16 {
                    todo.push((dir, depth + 1));
                }
            }
        }
        out.reverse();
        out
    }

    /// Makes the entries of `chain` durable, topmost first: the inodes each waits for, its
    /// directory's inode, then its block.
    fn flush_chain(
        &self,
        cache: &BufferCache,
        geo: &Geometry,
        chain: &[(Ino, Blk, Vec<Ino>)],
    ) -> Result<()> {
        for (dir, blk, inos) in chain {
            for i in inos {
                self.flush_inode(cache, geo, *i)?;
            }
            self.flush_inode(cache, geo, *dir)?;
            self.write_blocks(cache, &[*blk])?;
        }
        Ok(())
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
        let mut rolled = if k == kind::DIRECTORY && i.skip_entry_rollback {
            rollback::Rolled::default()
        } else {
            rollback::roll_back(&d, &geo, buf.blkno(), k, image)?
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
            d.unflushed.push(w);
        }
    }

    fn write_failed(&self, buf: &Buf) {
        self.0.deps.lock().inflight.remove(&buf.blkno());
    }

    fn after_flush(&self) {
        let mut d = self.0.deps.lock();
        for w in std::mem::take(&mut d.unflushed) {
            d.on_durable(&w);
        }
    }

    fn invalidated(&self, buf: &Buf) {
        // A freed block: what was rolled back in it, or waited for on it, is moot.
        let blk = buf.blkno();
        let mut d = self.0.deps.lock();
        let ids = deps::ids_at(&d.by_block, &blk);
        for id in ids {
            let keyed_here = match d.recs.get(&id).map(|r| &r.what) {
                Some(What::Entry { blk: b, .. }) => *b == blk,
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
        for id in d.waiting_on(blk) {
            d.drop_conds(id, |c| matches!(c, Cond::Block(b, _) if *b == blk));
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
        d.entries_naming(dir)
            .into_iter()
            .filter_map(|id| match d.recs.get(&id).map(|r| &r.what) {
                Some(What::Entry { blk, off, .. }) => Some(Cond::Entry {
                    blk: *blk,
                    off: *off,
                    seq: d.seq,
                }),
                _ => None,
            })
            .collect()
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
    ) -> Result<()> {
        let geo = self.geo()?;
        let mut d = self.inner.deps.lock();
        let mut waits = Vec::new();
        if let Some(groups) = d.blkmap.remove(&new_blk) {
            for g in groups {
                waits.extend(self.inner.cond_block(&d, g));
            }
        }
        // The new block's contents (data arrives after this fact, in the same call).
        waits.push(Cond::Block(new_blk, d.seq));
        let mut old_blk = old_blk;
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
                && let Some(What::Alloc { old_blk: o, .. }) = d.remove(id).map(|r| r.what)
            {
                old_blk = o;
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

    /// rename: the entries this call made reach disk before the old name's removal can
    /// (rule 3), by writing them now.
    fn force_op_entries(&self, tx: &mut Tx) -> Result<()> {
        let geo = self.geo()?;
        let targets: Vec<Ino> = {
            let d = self.inner.deps.lock();
            let Some(op) = d.op.as_ref() else {
                return Ok(());
            };
            op.entries
                .iter()
                .filter_map(|id| match d.recs.get(id).map(|r| &r.what) {
                    Some(What::Entry { target, .. }) => Some(*target),
                    _ => None,
                })
                .collect()
        };
        let cache = tx.io.cache.clone();
        for t in targets {
            let chain = self.inner.entry_chain(t);
            self.inner.flush_inode(&cache, &geo, t)?;
            self.inner.flush_chain(&cache, &geo, &chain)?;
        }
        let d = self.inner.deps.lock();
        if let Some(op) = d.op.as_ref() {
            for id in &op.entries {
                if let Some(r) = d.recs.get(id) {
                    log::warn!("softdep: forced entry still pending: {r:?}");
                }
            }
        }
        Ok(())
    }
}

impl Strategy for SoftDep {
    fn name(&self) -> &'static str {
        self.name
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
        let rounds = if why.durable() {
            MAX_ROUNDS
        } else {
            PERIODIC_ROUNDS
        };
        for _ in 0..rounds {
            self.inner.counters.rounds.fetch_add(1, Ordering::Relaxed);
            self.inner.round(&cache)?;
            // Memory pressure is relieved from inside a call, with the engine's lock held:
            // the worklist (which takes that lock) waits for the worker then.
            let ran = if why == SyncWhy::Pressure {
                0
            } else {
                self.inner.run_ready(e, usize::MAX)?
            };
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
            cache.flush_device()?;
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
        self.inner.gate.enter();
        let mut d = self.inner.deps.lock();
        match d.op.as_mut() {
            Some(op) => op.nesting += 1,
            None => d.op = Some(OpLog::default()),
        }
        Ok(None)
    }

    fn end_op(&self, tx: &mut Tx, ok: bool) -> Result<()> {
        let outer = self
            .inner
            .deps
            .lock()
            .op
            .as_ref()
            .is_some_and(|o| o.nesting == 0);
        // The planted bug forgets the force for a rename that moves no directory (fsck
        // would find a directory left in no directory; a file in none it calls a leak).
        let planted_skip =
            self.inner.skip_rename_force && !self.inner.op_names_dir.swap(false, Ordering::AcqRel);
        if ok && outer && matches!(tx.kind, OpKind::Rename | OpKind::Exchange) && !planted_skip {
            // Rule 3: the new name (and a moved directory's new `..`) reach disk before
            // the old name's removal can: nothing writes during a call but the call itself.
            // On failure the engine takes the call back and ends it again, not ok.
            self.force_op_entries(tx)?;
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
        let prev = {
            let mut d = self.inner.deps.lock();
            let prev = if size == 0 || d.inomap.contains_key(&ino) {
                0
            } else {
                d.enc_size.get(&ino).copied().unwrap_or(was)
            };
            // Most updates raise no size (times, link counts, a write inside the file) and
            // only a regular file's raised size needs a hold: those are told from the mode
            // and size alone, without decoding the inode.
            if mode & libc::S_IFMT != libc::S_IFREG || size <= prev {
                d.enc_size.insert(ino, size);
                return Ok(());
            }
            prev
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
        if !di.is_reg() || di.size <= prev || di.fast_link.is_some() {
            return Ok(());
        }
        let bs = geo.block_size as u64;
        let first = prev / bs;
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
        self.alloc(
            f.ino,
            PtrAt::Inode { ptr: f.ptr, iblk },
            Some(f.ptr),
            f.lbn,
            f.new_blk,
            f.old_blk,
            f.kind,
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
        )
    }

    fn setup_directory_add(&self, _tx: &mut Tx, f: &DirAdd) -> Result<()> {
        if self.inner.skip_rename_force && f.dtype == libc::DT_DIR {
            self.inner.op_names_dir.store(true, Ordering::Release);
        }
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
        let blk = f.buf.blkno();
        let off = f.offset;
        if let Some(old) = d.entries.get(&(blk, off)).copied() {
            d.remove(old);
        }
        d.insert(
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
        Ok(())
    }

    fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> Result<Apply> {
        if self.inner.skip_rename_force && (f.dotdot || f.dtype == libc::DT_DIR) {
            self.inner.op_names_dir.store(true, Ordering::Release);
        }
        let geo = self.geo()?;
        let blk = f.buf.blkno();
        let off = f.offset;
        let old_dtype = if f.old_is_dir || f.dotdot {
            libc::DT_DIR
        } else {
            self.dtype_of(&geo, f.old_ino, f.dtype)
        };
        let drops = Self::removal_drops(tx.kind, f);
        let mut d = self.inner.deps.lock();
        let mut waits = self.entry_waits(&d, &geo, f.new_ino);
        waits.extend(self.reachable_waits(&d, f.dir));
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
                prev.unwrap_or(Some((f.old_ino as u32, old_dtype)))
            }
            None => Some((f.old_ino as u32, old_dtype)),
        };
        let on_disk = old.is_some();
        d.insert(
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
        {
            // The entry is gone from the buffer: a pending record of it goes first, before
            // anything below writes the block.
            let mut d = self.inner.deps.lock();
            if let Some(id) = d.entries.get(&(blk, f.offset)).copied() {
                let never = matches!(
                    d.recs.get(&id).map(|r| &r.what),
                    Some(What::Entry {
                        old: None,
                        applied: false,
                        ..
                    })
                );
                d.remove(id);
                // What waited for this name to be on disk (to reach its directory) waits
                // no more: the name is gone, and any other name has a record of its own.
                let off = f.offset;
                for w in d.waiting_on(blk) {
                    d.drop_conds(w, |c| matches!(c, Cond::Entry { blk: b, off: o, .. } if *b == blk && *o == off));
                }
                if never {
                    // 002 Fig. 1: the name never reached disk, so its removal need not
                    // either before the count drops (FreeBSD cancels the diradd against
                    // the dirrem).
                    return Ok(Apply::Now);
                }
            }
        }
        if f.rmdir {
            // The directory's own removals reach disk before its name goes: a directory no
            // entry reaches but still holding names is damage, not a leak.
            let blks = self.inner.deps.lock().removed_in.remove(&f.ino);
            if let Some(blks) = blks {
                self.inner.write_blocks(&tx.io.cache, &blks)?;
            }
        }
        let mut d = self.inner.deps.lock();
        let v = d.removed_in.entry(f.dir).or_default();
        if !v.contains(&blk) {
            v.push(blk);
        }
        let mut drops = vec![(f.ino, if f.rmdir { 2 } else { 1 })];
        if f.rmdir {
            drops.push((f.dir, 1));
        }
        let w = self.inner.cond_block(&d, blk);
        let waits: Vec<Cond> = w.into_iter().collect();
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
        for b in f.freed {
            let pending = allocs.iter().copied().find(|id| {
                matches!(d.recs.get(id).map(|r| &r.what),
                    Some(What::Alloc { new_blk, applied: false, .. }) if new_blk == b)
            });
            match pending {
                Some(id) => {
                    d.remove(id);
                    now.push(*b);
                }
                None if never_on_disk => now.push(*b),
                None => later.push(*b),
            }
        }
        // Applied (safe, awaiting their holder) records of freed blocks are moot.
        for id in allocs {
            if let Some(What::Alloc { new_blk, .. }) = d.recs.get(&id).map(|r| &r.what)
                && f.freed.contains(new_blk)
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
            self.inner.write_blocks(&tx.io.cache, &[iblk])?;
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
        self.inner.gate.enter();
        let r = (|| {
            let data: Vec<&BufRef> = f
                .blocks
                .iter()
                .filter(|b| b.kind() != kind::INDIRECT)
                .collect();
            if !data.is_empty() {
                cache.write_now(&data)?;
            }
            // The names first, collected before anything is written (a record satisfied
            // by the writes below still leaves its block dirty).
            let chain = self.inner.entry_chain(f.ino);
            self.inner.flush_inode(&cache, &geo, f.ino)?;
            self.inner.flush_chain(&cache, &geo, &chain)?;
            cache.flush_device()?;
            Ok(())
        })();
        self.inner.gate.leave();
        r
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
pub const OPTIONS: &[ModeOption] = &[ModeOption {
    key: "max_softdeps",
    values: "N",
    help: "cap on dependency records; at the cap a new call first writes back so existing ones complete (default 200000, at least 64)",
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
    options: OPTIONS,
    make,
};
