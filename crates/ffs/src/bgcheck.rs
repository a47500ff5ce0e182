//! Background check: soft updates' background fsck (002 §3.3 and §4) on the live mount.
//!
//! After a crash a soft-updates image mounts at once: rules 1–3 held on disk at every
//! instant, so what a crash can leave is only *leaks* — blocks and inodes marked allocated
//! that nothing references, link counts above the names pointing at an inode, inodes that
//! were open and unlinked, a group summary above the truth, and a block count that lags
//! its blocks (above them, or below by blocks an index block names: an index block and the
//! inode counting its new pointers reach disk in either order). This module
//! reclaims them while applications keep calling (`cairn fsck --background MOUNTPOINT`).
//!
//! **The epoch rule.** While the check runs, every fact the engine declares and every
//! release it applies marks the inodes and blocks it names ([`Marks`], set by [`Marker`],
//! which wraps the strategy for the facts of calls made during the scan). The scan walks the
//! inodes by number in chunks under the engine's lock, releasing it between chunks, and
//! collects the blocks every allocated inode references and, per inode, the entries naming
//! it. At the end, under the lock, only what is **untouched** (no mark), **idle** (no open
//! handle, kernel reference or write in flight, not an orphan) and **not held by the mode**
//! (the strategy's pending frees and link-count drops, [`Held`]) is fixed.
//!
//! Why this is correct: the engine changes who references a block or how many names an
//! inode has only by calls that declare facts naming it — a block is referenced by
//! `BlkMapDep`/`AllocDirect`/`AllocIndir` and unreferenced by `FreeBlocks`; an entry naming
//! inode `i` is added, removed or re-pointed by `DirAdd`/`DirRemove`/`DirChange` naming `i`;
//! an inode is allocated by `InoMapDep`, freed by `FreeFile` and its count changed by
//! `LinkChange`; bits are cleared only by releases. So for an untouched block or inode, the
//! facts the scan collected about it at different instants were the same at every instant
//! of the scan, and are still true under the final lock: the scan's picture of it is exact
//! although the file system changed around it. Things the mode still owes (a free waiting
//! for a pointer-clearing write, a link drop waiting for a removal) look like leaks in the
//! in-memory picture and are not: the strategy names them and the check leaves them alone.
//!
//! Every fix goes through the engine's ordinary paths as a call of its own
//! (`OpKind::Background`), so the strategy orders it: a leaked inode is freed the way an
//! unlinked one is (`reclaim`: `FreeBlocks` and `FreeFile`, whose bits soft updates releases
//! only after the zeroed inode is on disk); a count is lowered with a `LinkChange` to the
//! names that exist in memory, which are never fewer than the names on disk (a removal not
//! yet on disk is a held drop); a leaked block's bit is cleared through the allocator
//! callback (no pointer to it exists on disk or in memory). A leaked empty directory is
//! freed like an rmdir: its parent's count (the `..` it held) drops only after a full sync
//! has put the freed directory on disk, so a crash in between leaves a count too high (a
//! leak), never too low.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_blockdev::BlockDevice;
use cairn_bufcache::{BufRef, WriteHooks};
use cairn_vfs::modes::AfterCrash;
use cairn_vfs::{Errno, FsError, Result};
use parking_lot::Mutex;

use crate::format::{ROOT_INO, Superblock, bitmap, get_u64, kind};
use crate::strategy::{
    self, AllocDirect, AllocIndir, Apply, AttrChange, Blk, BlkMapDep, DataZeroed, DirAdd,
    DirChange, DirRemove, Engine, FreeBlocks, FreeFile, FsyncReq, Ino, InoMapDep, IoModel,
    LinkChange, LinkWhy, OpKind, OpState, Release, Strategy, SyncWhy, Tx,
};
use crate::{Ffs, State, corrupt_err};

/// Inodes scanned per hold of the engine's lock: small enough that a call waits for one
/// chunk at most (well under a millisecond of inode decoding), large enough that the lock
/// is not taken a million times for a large image.
pub const CHUNK_INODES: u64 = 256;

/// Scans one check makes at most (see `check_rounds`).
const MAX_ROUNDS: u64 = 4;

#[cfg(test)]
mod tests;

#[cfg(test)]
thread_local! {
    /// Test only: a broken check that ignores the epoch's marks (fixes what calls touched
    /// during its scan), which the concurrent test must catch. Per thread, so it breaks
    /// only the checks the test runs itself.
    static IGNORE_MARKS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The marks of the epoch that just ended (none, in the test-only broken check).
fn epoch_marks(st: &mut State) -> Marks {
    let m = st.bg.take().unwrap_or_default();
    #[cfg(test)]
    if IGNORE_MARKS.with(|b| b.get()) {
        return Marks::default();
    }
    m
}

/// What a mode still owes and a background check must leave alone (soft updates'
/// worklist): blocks it will release, inodes it will release or whose on-disk count it will
/// lower. `dirs`: the inodes among them released as directories (their zeroed encoding no
/// longer says so, but the group's directory count still includes them).
#[derive(Clone, Debug, Default)]
pub struct Held {
    pub blocks: HashSet<Blk>,
    pub inodes: HashSet<Ino>,
    pub dirs: HashSet<Ino>,
}

impl Held {
    pub fn hold_inode(&mut self, ino: Ino, is_dir: bool) {
        self.inodes.insert(ino);
        if is_dir {
            self.dirs.insert(ino);
        }
    }
}

/// The inodes and blocks touched since the scan began (the epoch).
#[derive(Default)]
pub(crate) struct Marks {
    inodes: HashSet<Ino>,
    blocks: HashSet<Blk>,
}

impl Marks {
    fn ino(&mut self, i: Ino) {
        self.inodes.insert(i);
    }
    fn blk(&mut self, b: Blk) {
        if b != 0 {
            self.blocks.insert(b);
        }
    }
    /// A release the engine applies (a strategy's deferred free, or one at once).
    pub(crate) fn release(&mut self, r: &Release) {
        match r {
            Release::Blocks(bs) => bs.iter().for_each(|b| self.blk(*b)),
            Release::Inode { ino, .. } => self.ino(*ino),
        }
    }
}

/// The strategy as the facts of a call see it while a check scans: marks what each fact
/// names, then hands the fact on unchanged. Every method delegates, so the mode behaves
/// exactly as without a check.
pub(crate) struct Marker<'a> {
    inner: &'a dyn Strategy,
    marks: Mutex<&'a mut Marks>,
}

impl<'a> Marker<'a> {
    pub(crate) fn new(inner: &'a dyn Strategy, marks: &'a mut Marks) -> Marker<'a> {
        Marker {
            inner,
            marks: Mutex::new(marks),
        }
    }
    fn mark(&self, f: impl FnOnce(&mut Marks)) {
        f(&mut self.marks.lock())
    }
}

impl Strategy for Marker<'_> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn commit_policy(&self) -> cairn_vfs::modes::Commit {
        self.inner.commit_policy()
    }
    fn syncer_interval(&self) -> Duration {
        self.inner.syncer_interval()
    }
    fn has_pending_frees(&self) -> bool {
        self.inner.has_pending_frees()
    }
    fn background_check_holds(&self) -> Option<Held> {
        self.inner.background_check_holds()
    }
    fn io_model(&self) -> IoModel {
        self.inner.io_model()
    }
    fn write_hooks(&self) -> Arc<dyn WriteHooks> {
        self.inner.write_hooks()
    }
    fn recover(&self, dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
        self.inner.recover(dev, sb)
    }
    fn mount(&self, e: &dyn Engine) -> Result<()> {
        self.inner.mount(e)
    }
    fn background_interval(&self) -> Option<Duration> {
        self.inner.background_interval()
    }
    fn background(&self, e: &dyn Engine) -> Result<bool> {
        self.inner.background(e)
    }
    fn sync(&self, e: &dyn Engine, why: SyncWhy) -> Result<()> {
        self.inner.sync(e, why)
    }
    fn unmount(&self, e: &dyn Engine) -> Result<()> {
        self.inner.unmount(e)
    }
    fn write_superblock(&self, e: &dyn Engine, buf: &BufRef) -> Result<()> {
        self.inner.write_superblock(e, buf)
    }
    fn write_stream(&self, io: &strategy::Io, ino: Ino, blk: Blk, data: &[u8]) -> Result<()> {
        self.inner.write_stream(io, ino, blk, data)
    }
    fn held_dir_bytes(&self, blk: Blk) -> Vec<(u32, u32)> {
        self.inner.held_dir_bytes(blk)
    }
    fn dir_bytes_given_back(&self) -> Vec<(Ino, Blk)> {
        self.inner.dir_bytes_given_back()
    }
    fn begin_op(&self, kind: OpKind) -> Result<OpState> {
        self.inner.begin_op(kind)
    }
    fn commit_point(&self, tx: &mut Tx) -> Result<()> {
        self.inner.commit_point(tx)
    }
    fn end_op(&self, tx: &mut Tx, ok: bool) -> Result<()> {
        self.inner.end_op(tx, ok)
    }
    fn setup_inomapdep(&self, tx: &mut Tx, f: &InoMapDep) -> Result<()> {
        self.mark(|m| m.ino(f.ino));
        self.inner.setup_inomapdep(tx, f)
    }
    fn setup_blkmapdep(&self, tx: &mut Tx, f: &BlkMapDep) -> Result<()> {
        self.mark(|m| {
            m.blk(f.blk);
            m.ino(f.ino)
        });
        self.inner.setup_blkmapdep(tx, f)
    }
    fn setup_allocdirect(&self, tx: &mut Tx, f: &AllocDirect) -> Result<()> {
        self.mark(|m| {
            m.ino(f.ino);
            m.blk(f.new_blk);
            m.blk(f.old_blk)
        });
        self.inner.setup_allocdirect(tx, f)
    }
    /// The blocks were named by their allocations (marked there); the fact goes on so
    /// soft updates counts the zeros as the blocks' writes during a scan as at any time.
    fn setup_data_zeroed(&self, tx: &mut Tx, f: &DataZeroed) -> Result<()> {
        self.mark(|m| m.ino(f.ino));
        self.inner.setup_data_zeroed(tx, f)
    }
    fn setup_allocindir(&self, tx: &mut Tx, f: &AllocIndir) -> Result<()> {
        self.mark(|m| {
            m.ino(f.ino);
            m.blk(f.indir.blkno());
            m.blk(f.new_blk);
            m.blk(f.old_blk)
        });
        self.inner.setup_allocindir(tx, f)
    }
    // An inode's encoding changing (size, times, mode) changes none of what the check
    // decides on: its pointers, its count and the names of it change by the other facts.
    fn update_inodeblock(&self, tx: &mut Tx, ino: Ino, buf: &BufRef, was: u64) -> Result<()> {
        self.inner.update_inodeblock(tx, ino, buf, was)
    }
    fn setup_directory_add(&self, tx: &mut Tx, f: &DirAdd) -> Result<()> {
        self.mark(|m| {
            m.ino(f.dir);
            m.ino(f.ino)
        });
        self.inner.setup_directory_add(tx, f)
    }
    fn setup_directory_remove(&self, tx: &mut Tx, f: &DirRemove) -> Result<Apply> {
        self.mark(|m| {
            m.ino(f.dir);
            m.ino(f.ino)
        });
        self.inner.setup_directory_remove(tx, f)
    }
    fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> Result<Apply> {
        self.mark(|m| {
            m.ino(f.dir);
            m.ino(f.old_ino);
            m.ino(f.new_ino)
        });
        self.inner.setup_directory_change(tx, f)
    }
    fn change_linkcnt(&self, tx: &mut Tx, f: &LinkChange) -> Result<()> {
        self.mark(|m| m.ino(f.ino));
        self.inner.change_linkcnt(tx, f)
    }
    fn before_tail_zeroed(&self, tx: &mut Tx, ino: Ino, buf: &BufRef) -> Result<()> {
        self.inner.before_tail_zeroed(tx, ino, buf)
    }
    fn setup_freeblocks(&self, tx: &mut Tx, f: &FreeBlocks) -> Result<()> {
        self.mark(|m| {
            m.ino(f.ino);
            f.freed.iter().for_each(|b| m.blk(*b));
            f.holders.iter().for_each(|h| m.blk(h.blkno()));
        });
        self.inner.setup_freeblocks(tx, f)
    }
    fn setup_freefile(&self, tx: &mut Tx, f: &FreeFile) -> Result<()> {
        self.mark(|m| m.ino(f.ino));
        self.inner.setup_freefile(tx, f)
    }
    fn setup_attr_change(&self, tx: &mut Tx, f: &AttrChange) -> Result<()> {
        self.inner.setup_attr_change(tx, f)
    }
    fn fsync(&self, e: &dyn Engine, f: &FsyncReq) -> Result<()> {
        self.inner.fsync(e, f)
    }
    fn stats(&self) -> Option<serde_json::Value> {
        self.inner.stats()
    }
}

/// What a background check did (the summary `cairn fsck --background` prints).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    pub mode: String,
    pub inodes_total: u64,
    pub inodes_scanned: u64,
    /// Scans made (another follows one that freed directories, up to four).
    pub rounds: u64,
    /// Directories the last round freed.
    #[serde(skip)]
    dirs_freed_last: u64,
    /// Allocated inodes the scan found.
    pub inodes_in_use: u64,
    pub chunks: u64,
    pub blocks_freed: u64,
    /// Leaked inodes freed (with their blocks, counted in `blocks_freed_with_inodes`).
    pub inodes_freed: u64,
    pub blocks_freed_with_inodes: u64,
    pub link_counts_fixed: u64,
    pub block_counts_fixed: u64,
    /// Group summaries (free counts, directories) set to the recount.
    pub summaries_fixed: u64,
    /// Leaks left alone because a call touched them during the scan.
    pub skipped_changed: u64,
    /// Leaks left alone because they are open, in use, or owed by the mode's pending work.
    pub skipped_busy: u64,
    /// Findings that are not leaks (a count below its names, an unreferenced directory
    /// that is not empty): left for an offline `cairn fsck`.
    pub left_for_fsck: u64,
    /// What each of those was (the first few).
    pub left: Vec<String>,
    pub seconds: f64,
    /// The longest the check held the engine's lock at once (a scan chunk, or the final
    /// phase), in milliseconds: what a call may have waited for it.
    pub lock_held_max_ms: f64,
    /// The final phase's hold (recount and fixes).
    pub final_phase_ms: f64,
}

impl Report {
    /// Adds a later round's counts.
    fn absorb(&mut self, r: Report) {
        self.rounds += r.rounds;
        self.chunks += r.chunks;
        self.inodes_in_use = r.inodes_in_use;
        self.blocks_freed += r.blocks_freed;
        self.inodes_freed += r.inodes_freed;
        self.blocks_freed_with_inodes += r.blocks_freed_with_inodes;
        self.link_counts_fixed += r.link_counts_fixed;
        self.block_counts_fixed += r.block_counts_fixed;
        self.summaries_fixed += r.summaries_fixed;
        self.skipped_changed = r.skipped_changed;
        self.skipped_busy = r.skipped_busy;
        self.left_for_fsck = r.left_for_fsck;
        self.left = r.left;
        self.lock_held_max_ms = self.lock_held_max_ms.max(r.lock_held_max_ms);
        self.final_phase_ms = self.final_phase_ms.max(r.final_phase_ms);
        self.dirs_freed_last = r.dirs_freed_last;
    }

    fn leave(&mut self, what: String) {
        self.left_for_fsck += 1;
        if self.left.len() < 20 {
            self.left.push(what);
        }
    }
}

/// What the scan learned of one allocated inode.
#[derive(Clone, Debug)]
struct Seen {
    nlink: u32,
    blocks_field: u64,
    /// Blocks its pointers reference (data, indirect, xattr).
    blocks: u64,
    is_dir: bool,
    /// Its encoding is free while its bit is set (an inode a crash left allocated).
    free: bool,
    /// For a directory: where its `..` points, and its entries other than `.` and `..`.
    dotdot: Ino,
    entries: u64,
}

/// The scan's picture of the file system.
struct Scan {
    /// Referenced blocks, one bit each.
    used: Vec<u64>,
    /// Entries naming each inode (`.` and `..` included, as link counts count them).
    names: HashMap<Ino, u32>,
    seen: HashMap<Ino, Seen>,
}

impl Scan {
    fn use_blk(&mut self, b: Blk) {
        self.used[(b / 64) as usize] |= 1 << (b % 64);
    }
    fn is_used(&self, b: Blk) -> bool {
        self.used[(b / 64) as usize] & (1 << (b % 64)) != 0
    }
}

fn names_of(scan: &Scan, ino: Ino) -> u32 {
    scan.names.get(&ino).copied().unwrap_or(0)
}

fn damaged(msg: String) -> FsError {
    corrupt_err(format!(
        "{msg}: the image is damaged, not only leaking; unmount it and run `cairn fsck -y`"
    ))
}

impl Ffs {
    /// Runs a background check (module documentation) while calls go on; `progress(done,
    /// total)` after each chunk of inodes.
    pub fn check_background_report(&self, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Report> {
        let t0 = Instant::now();
        if self.read_only {
            return Err(FsError::Refused(
                Errno::EROFS,
                "mounted read-only: a background check changes the file system".into(),
            ));
        }
        {
            let mut st = self.st.lock();
            if self.strategy.background_check_holds().is_none() {
                return Err(self.refusal());
            }
            if st.bg.is_some() {
                return Err(FsError::Refused(
                    Errno::EBUSY,
                    "a background check is already running on this mount".into(),
                ));
            }
            st.bg = Some(Marks::default());
        }
        let r = self.check_rounds(progress);
        self.st.lock().bg = None;
        let mut r = r?;
        r.seconds = t0.elapsed().as_secs_f64();
        Ok(r)
    }

    /// One scan, and another while the last freed directories: a leaked directory whose
    /// only names were the `..` of leaked subdirectories (soft updates lets a new
    /// subdirectory's inode and first block reach disk before its parent is named) is
    /// unnamed only once those are freed. Each round is a full epoch of its own.
    fn check_rounds(&self, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Report> {
        let mut total = self.check_epoch(progress)?;
        while total.dirs_freed_last > 0 && total.rounds < MAX_ROUNDS {
            self.st.lock().bg = Some(Marks::default());
            let r = self.check_epoch(progress)?;
            total.absorb(r);
        }
        Ok(total)
    }

    /// Why this mode refuses a background check.
    fn refusal(&self) -> FsError {
        let mode = self.strategy.name();
        let info = crate::modes()
            .iter()
            .chain(strategy::unlisted_modes())
            .find(|m| m.name == mode);
        let msg = match info.map(|m| m.guarantees.after_crash) {
            Some(AfterCrash::Fsck) => format!(
                "mode '{mode}' needs a full fsck after a crash, not a background check: \
                 unmount and run `cairn fsck -y IMAGE`"
            ),
            _ => format!(
                "mode '{mode}' has no background check (only soft updates leaves an image \
                 that needs nothing but leaks reclaimed)"
            ),
        };
        FsError::Refused(Errno::EOPNOTSUPP, msg)
    }

    fn check_epoch(&self, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<Report> {
        let geo = self.vol.geo;
        let total = geo.total_inodes();
        let mut rep = Report {
            mode: self.strategy.name().to_string(),
            inodes_total: total,
            rounds: 1,
            ..Report::default()
        };
        let mut scan = Scan {
            used: vec![0u64; geo.total_blocks.div_ceil(64) as usize],
            names: HashMap::new(),
            seen: HashMap::new(),
        };
        let mut next = 0u64;
        while next < total {
            let end = (next + CHUNK_INODES).min(total);
            {
                let st = self.st.lock();
                let held = Instant::now();
                for ino in next..end {
                    self.scan_inode(&st, ino, &mut scan)?;
                }
                let ms = held.elapsed().as_secs_f64() * 1e3;
                rep.lock_held_max_ms = rep.lock_held_max_ms.max(ms);
            }
            rep.chunks += 1;
            rep.inodes_scanned = end;
            next = end;
            progress(end, total);
        }
        rep.inodes_in_use = scan.seen.len() as u64;
        let parents = self.fix(&scan, &mut rep)?;
        rep.dirs_freed_last = parents.values().map(|&n| n as u64).sum();
        if !parents.is_empty() {
            // The freed directories' `..` must be gone from disk before their parents'
            // counts drop (rule 2): a full sync writes the zeroed inodes first. The epoch
            // goes on meanwhile (`fix` started a fresh one), so a parent a call touched
            // now is left alone.
            self.sync_as(SyncWhy::All)?;
            self.fix_parents(&scan, &parents, &mut rep)?;
        }
        Ok(rep)
    }

    /// Records inode `ino` as it is now (the engine's lock held).
    fn scan_inode(&self, st: &State, ino: Ino, scan: &mut Scan) -> Result<()> {
        let geo = &self.vol.geo;
        if ino < ROOT_INO {
            return Ok(());
        }
        let g = geo.group_of_ino(ino);
        let map = self.bread(geo.inode_bitmap(g), kind::GROUP)?;
        if !bitmap::get(&map.read(), (ino % geo.inodes_per_group) as usize) {
            return Ok(());
        }
        let d = match st.inodes.loaded(ino) {
            Some(ic) => ic.d.clone(),
            None => self.vol.read_disk_inode(ino)?,
        };
        let mut seen = Seen {
            nlink: d.nlink,
            blocks_field: d.blocks,
            blocks: 0,
            is_dir: d.is_dir(),
            free: d.is_free(),
            dotdot: 0,
            entries: 0,
        };
        if seen.free {
            scan.seen.insert(ino, seen);
            return Ok(());
        }
        let mut data = Vec::new();
        let mut count = 0u64;
        for &p in d.direct.iter().filter(|&&p| p != 0) {
            data.push(p);
        }
        for (level, &root) in d.indirect.iter().enumerate() {
            if root != 0 {
                self.scan_tree(ino, root, level + 1, &mut data, scan, &mut count)?;
            }
        }
        let xattr_blocks = if d.xattr == 0 {
            Vec::new()
        } else {
            // The attribute list's blocks: one, or a chain.
            self.xattr_chain(ino, d.xattr)
                .map_err(|e| damaged(e.to_string()))?
                .blocks
        };
        for &b in data.iter().chain(&xattr_blocks) {
            if !geo.is_data_block(b) {
                return Err(damaged(format!("inode {ino}: pointer {b} out of range")));
            }
            scan.use_blk(b);
            count += 1;
        }
        seen.blocks = count;
        if seen.is_dir {
            self.scan_dir(ino, &data, scan, &mut seen)?;
        }
        scan.seen.insert(ino, seen);
        Ok(())
    }

    fn scan_tree(
        &self,
        ino: Ino,
        blk: Blk,
        level: usize,
        data: &mut Vec<Blk>,
        scan: &mut Scan,
        count: &mut u64,
    ) -> Result<()> {
        if !self.vol.geo.is_data_block(blk) {
            return Err(damaged(format!(
                "inode {ino}: indirect pointer {blk} out of range"
            )));
        }
        scan.use_blk(blk);
        *count += 1;
        let b = self.bread(blk, kind::INDIRECT)?;
        let ptrs: Vec<Blk> = {
            let img = b.read();
            (0..self.vol.geo.ptrs_per_block() as usize)
                .map(|i| get_u64(&img, i * 8))
                .filter(|&p| p != 0)
                .collect()
        };
        for p in ptrs {
            if level == 1 {
                data.push(p);
            } else {
                self.scan_tree(ino, p, level - 1, data, scan, count)?;
            }
        }
        Ok(())
    }

    /// Counts the entries of directory `ino` (blocks `data`, in no particular order).
    fn scan_dir(&self, ino: Ino, data: &[Blk], scan: &mut Scan, seen: &mut Seen) -> Result<()> {
        for &b in data {
            let buf = self.bread(b, kind::DIRECTORY)?;
            let img = buf.read();
            for e in crate::format::dir::entries(&img) {
                let e = e.map_err(|e| damaged(format!("directory {ino}: {}", e.0)))?;
                let target = e.ino as Ino;
                *scan.names.entry(target).or_default() += 1;
                match e.name {
                    b"." => {}
                    b".." => seen.dotdot = target,
                    _ => seen.entries += 1,
                }
            }
        }
        Ok(())
    }

    /// The end of the epoch, under the engine's lock: recounts the group summaries, then
    /// fixes every untouched, idle leak the mode does not hold. Returns the parents whose
    /// count drops once the directories freed here are on disk (parent → `..` entries gone).
    fn fix(&self, scan: &Scan, rep: &mut Report) -> Result<HashMap<Ino, u32>> {
        let mut st = self.st.lock();
        let held_since = Instant::now();
        let r = self.fix_locked(&mut st, scan, rep);
        rep.final_phase_ms = held_since.elapsed().as_secs_f64() * 1e3;
        rep.lock_held_max_ms = rep.lock_held_max_ms.max(rep.final_phase_ms);
        r
    }

    fn fix_locked(
        &self,
        st: &mut State,
        scan: &Scan,
        rep: &mut Report,
    ) -> Result<HashMap<Ino, u32>> {
        let geo = self.vol.geo;
        // Nothing else runs while the lock is held: the facts of the fixes below are this
        // check's own and mark nothing. A fresh epoch starts when the lock is let go.
        let marks = epoch_marks(st);
        if self.unmounted.load(std::sync::atomic::Ordering::Acquire) {
            return Err(FsError::Refused(
                Errno(libc::ESHUTDOWN),
                "the file system was unmounted during the check".into(),
            ));
        }
        let held = self
            .strategy
            .background_check_holds()
            .ok_or_else(|| self.refusal())?;
        self.fix_summaries(st, &held, &marks, scan, rep)?;

        // Blocks: marked in a bitmap, referenced by no inode.
        let mut leaked = Vec::new();
        for g in 0..geo.group_count {
            let map = self.bread(geo.block_bitmap(g), kind::GROUP)?;
            let img = map.read();
            let start = geo.group_start(g);
            for i in 0..geo.group_len(g) {
                let b = start + i;
                if img.get(i as usize / 8) == Some(&0) {
                    continue; // eight free blocks (the common case): no bit to look at
                }
                if !bitmap::get(&img, i as usize) || !geo.is_data_block(b) || scan.is_used(b) {
                    continue;
                }
                if marks.blocks.contains(&b) {
                    rep.skipped_changed += 1;
                } else if held.blocks.contains(&b) {
                    rep.skipped_busy += 1;
                } else {
                    leaked.push(b);
                }
            }
        }
        if !leaked.is_empty() {
            let n = leaked.len() as u64;
            self.in_op(st, OpKind::Background, |st| {
                if let Some(op) = st.op.as_mut() {
                    op.released.push(Release::Blocks(leaked));
                }
                self.apply_releases(st)
            })?;
            rep.blocks_freed += n;
        }

        // Inodes, in number order (the write stream must not depend on hash order): first
        // the ones to free, then the counts to lower, which depend on which were freed.
        let mut inos: Vec<Ino> = scan.seen.keys().copied().collect();
        inos.sort_unstable();
        // Directories no entry names, by the parent their `..` holds a count of.
        let mut unnamed_children: HashMap<Ino, u32> = HashMap::new();
        for (&ino, seen) in &scan.seen {
            if seen.is_dir && !seen.free && ino != ROOT_INO && names_of(scan, ino) <= 1 {
                *unnamed_children.entry(seen.dotdot).or_default() += 1;
            }
        }
        let mut parents: HashMap<Ino, u32> = HashMap::new();
        for &ino in &inos {
            let seen = &scan.seen[&ino];
            let names = names_of(scan, ino);
            // A directory no entry names other than its own `.` (the root is named by its
            // own `..` too, and is never freed).
            let unnamed_dir = seen.is_dir && names <= 1 && ino != ROOT_INO;
            if !(seen.free || unnamed_dir || (names == 0 && !seen.is_dir)) {
                continue;
            }
            if marks.inodes.contains(&ino) {
                rep.skipped_changed += 1;
                continue;
            }
            if held.inodes.contains(&ino) {
                rep.skipped_busy += 1;
                continue;
            }
            if seen.free {
                // Its bit reached disk, its inode never did (soft updates writes a new
                // inode as free until its bitmap is on disk, so this is the other half).
                self.in_op(st, OpKind::Background, |st| {
                    if let Some(op) = st.op.as_mut() {
                        op.released.push(Release::Inode { ino, is_dir: false });
                    }
                    self.apply_releases(st)
                })?;
                rep.inodes_freed += 1;
                continue;
            }
            let (busy, deferred) = self.in_use(st, ino);
            if deferred || busy {
                rep.skipped_busy += 1;
                continue;
            }
            if unnamed_dir {
                if seen.entries > 0 || unnamed_children.contains_key(&ino) {
                    rep.leave(format!("directory {ino}: not empty and no entry names it"));
                    continue;
                }
                if seen.dotdot == 0 || seen.dotdot == ino {
                    rep.leave(format!(
                        "directory {ino}: no entry names it, no parent in '..'"
                    ));
                    continue;
                }
                if marks.inodes.contains(&seen.dotdot) || held.inodes.contains(&seen.dotdot) {
                    rep.skipped_changed += 1;
                    continue;
                }
            }
            let nblocks = seen.blocks;
            self.in_op(st, OpKind::Background, |st| self.free_leaked(st, ino))?;
            rep.inodes_freed += 1;
            rep.blocks_freed_with_inodes += nblocks;
            if unnamed_dir {
                *parents.entry(seen.dotdot).or_default() += 1;
            }
        }
        for &ino in &inos {
            let seen = &scan.seen[&ino];
            let names = names_of(scan, ino);
            if seen.free || names == 0 || (seen.is_dir && names <= 1 && ino != ROOT_INO) {
                continue; // freed above, or left there
            }
            if parents.contains_key(&ino) || unnamed_children.contains_key(&ino) {
                // Its count waits for its freed children to be on disk (`fix_parents`), or
                // holds the `..` of a child left alone.
                continue;
            }
            // Above the truth (the inode reached disk before the index block with its
            // newest pointers) or below it (the index block first: soft updates orders
            // neither way, as FreeBSD's does not); either is a count to set, nothing lost.
            let fix_blocks = seen.blocks != seen.blocks_field;
            if names == seen.nlink && !fix_blocks {
                continue;
            }
            // Touched during the scan: its count and its names were read at different
            // instants (a link's count raised after its inode's chunk was read, its entry
            // added before its directory's was), so neither a fix nor a finding holds.
            if marks.inodes.contains(&ino) {
                rep.skipped_changed += 1;
                continue;
            }
            if names > seen.nlink {
                rep.leave(format!(
                    "inode {ino}: link count {} below its {names} names",
                    seen.nlink
                ));
                continue;
            }
            let (busy, deferred) = self.in_use(st, ino);
            if held.inodes.contains(&ino) || deferred {
                rep.skipped_busy += 1;
                continue;
            }
            let was_in_core = st.inodes.loaded(ino).is_some();
            if seen.nlink > names {
                self.in_op(st, OpKind::Background, |st| self.lower_link(st, ino, names))?;
                rep.link_counts_fixed += 1;
            }
            if fix_blocks && !busy {
                let n = seen.blocks;
                self.in_op(st, OpKind::Background, |st| {
                    self.iget(st, ino)?.d.blocks = n;
                    let b = self.store(st, ino)?;
                    let f = AttrChange {
                        ino,
                        inode_buf: &b,
                        extra: &[],
                        acl_mode: None,
                    };
                    self.fact(st, |s, tx| s.setup_attr_change(tx, &f))
                })?;
                rep.block_counts_fixed += 1;
            }
            // An inode the fix brought into core leaves it again, as a forget would let it
            // (a check must not grow the inode table by every inode it fixed).
            if !was_in_core && st.inodes.loaded(ino).is_some_and(|ic| ic.may_leave_core()) {
                st.inodes.remove(ino);
            }
        }
        if !parents.is_empty() {
            st.bg = Some(Marks::default());
        }
        Ok(parents)
    }

    /// Whether in-core inode `ino` is in use (open, known to the kernel, written, an
    /// orphan) and whether a drop of its on-disk count is deferred (soft updates).
    fn in_use(&self, st: &State, ino: Ino) -> (bool, bool) {
        match st.inodes.loaded(ino) {
            Some(ic) => (
                ic.nopen > 0 || ic.nlookup > 0 || ic.writing > 0 || ic.effnlink == 0,
                ic.effnlink != ic.d.nlink,
            ),
            None => (false, false),
        }
    }

    /// Lowers inode `ino`'s count, on disk and as the namespace sees it, to `names`.
    fn lower_link(&self, st: &mut State, ino: Ino, names: u32) -> Result<()> {
        let ic = self.iget(st, ino)?;
        let before = ic.d.nlink;
        ic.d.nlink = names;
        ic.effnlink = names;
        if before == names {
            return Ok(());
        }
        let b = self.store(st, ino)?;
        let f = LinkChange {
            ino,
            inode_buf: &b,
            before,
            after: names,
            why: LinkWhy::Drop,
        };
        self.fact(st, |s, tx| s.change_linkcnt(tx, &f))
    }

    /// Frees a leaked inode and its blocks the way an unlinked one is freed.
    fn free_leaked(&self, st: &mut State, ino: Ino) -> Result<()> {
        self.lower_link(st, ino, 0)?;
        self.reclaim(st, ino)?;
        if st.inodes.loaded(ino).is_some() {
            return Err(corrupt_err(format!("leaked inode {ino} not freed")));
        }
        Ok(())
    }

    /// The second half of freeing leaked directories: their parents lose the `..` counts,
    /// now that the freed directories are on disk.
    fn fix_parents(
        &self,
        scan: &Scan,
        parents: &HashMap<Ino, u32>,
        rep: &mut Report,
    ) -> Result<()> {
        let mut st = self.st.lock();
        let marks = epoch_marks(&mut st);
        let held = self
            .strategy
            .background_check_holds()
            .ok_or_else(|| self.refusal())?;
        let mut ps: Vec<_> = parents.iter().collect();
        ps.sort_unstable();
        for (&p, &n) in ps {
            let Some(seen) = scan.seen.get(&p) else {
                continue;
            };
            let want = scan.names.get(&p).copied().unwrap_or(0).saturating_sub(n);
            let deferred = st
                .inodes
                .loaded(p)
                .is_some_and(|ic| ic.effnlink != ic.d.nlink);
            if marks.inodes.contains(&p) || held.inodes.contains(&p) || deferred {
                rep.skipped_changed += 1;
                continue;
            }
            if want == 0 || seen.nlink <= want {
                continue;
            }
            self.in_op(&mut st, OpKind::Background, |st| {
                self.lower_link(st, p, want)
            })?;
            rep.link_counts_fixed += 1;
        }
        Ok(())
    }

    /// Sets every group's summary to a recount, under the engine's lock: free blocks and
    /// inodes from the bitmaps, directories from the inodes (the mode's held inodes count
    /// as what they were: their zeroed encodings no longer say).
    fn fix_summaries(
        &self,
        st: &mut State,
        held: &Held,
        marks: &Marks,
        scan: &Scan,
        rep: &mut Report,
    ) -> Result<()> {
        let geo = self.vol.geo;
        for g in 0..geo.group_count {
            let bmap = self.bread(geo.block_bitmap(g), kind::GROUP)?;
            let used_blocks = bitmap::count_set(&bmap.read(), geo.group_len(g) as usize) as u64;
            let free_blocks = (geo.group_len(g) - used_blocks) as u32;
            let imap = self.bread(geo.inode_bitmap(g), kind::GROUP)?;
            let mut used = Vec::new();
            {
                let img = imap.read();
                for i in 0..geo.inodes_per_group {
                    if img.get(i as usize / 8) != Some(&0) && bitmap::get(&img, i as usize) {
                        used.push(g * geo.inodes_per_group + i);
                    }
                }
            }
            let free_inodes = (geo.inodes_per_group - used.len() as u64) as u32;
            let have = st.alloc.summary(g);
            let dirs = self.count_dirs(st, &used, held, marks, scan)?;
            let want = (free_blocks, free_inodes, dirs);
            if want != have {
                self.in_op(st, OpKind::Background, |st| {
                    st.alloc.set_summary(&self.vol, g, want)
                })?;
                rep.summaries_fixed += 1;
            }
        }
        Ok(())
    }

    /// The directories among `used` (allocated inodes of one group), as they are now: what
    /// the scan saw of an untouched inode (whether an inode is a directory changes only when
    /// it is allocated or freed, which marks it), else the inode itself.
    fn count_dirs(
        &self,
        st: &State,
        used: &[Ino],
        held: &Held,
        marks: &Marks,
        scan: &Scan,
    ) -> Result<u32> {
        let mut n = 0u32;
        for &ino in used {
            let seen = scan.seen.get(&ino).filter(|_| !marks.inodes.contains(&ino));
            let is_dir = if held.dirs.contains(&ino) {
                true
            } else if ino < ROOT_INO {
                false
            } else if let Some(seen) = seen {
                seen.is_dir && !seen.free
            } else if let Some(ic) = st.inodes.loaded(ino) {
                ic.d.is_dir()
            } else {
                self.vol.read_disk_inode(ino)?.is_dir()
            };
            n += is_dir as u32;
        }
        Ok(n)
    }
}
