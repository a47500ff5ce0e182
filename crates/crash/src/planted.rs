//! The catalogue of planted bugs: deliberately broken orderings that claim a real mode's
//! guarantees, so the harness can prove it catches what it exists to catch.
//!
//! A checker that never fails proves nothing. Each entry below is one small, plausible
//! ordering bug of the kind a mode's author could write, planted as a wrapper around the
//! real strategy: one `match` arm on the facts it concerns, or a different way of writing
//! sync's steps (`StepWriter`). No engine code changes: every bug here is expressible at
//! the strategy interface. CI's bounded campaign (`tests/campaign.rs`) runs every entry over the
//! scripted workloads and fails unless each one is caught; `cairn crash run --planted NAME`
//! runs the same campaign for one entry and exits 1 when it is caught, 0 when it slips
//! through. Each entry names the scripted workload written to catch it (the campaign must
//! catch it there), so no catch depends on a random seed.
//!
//! A bug of another format cannot be a strategy: `lfs-checkpoint-first` is planted in the
//! LFS engine behind its `planted` feature (compiled for tests and this crate only, reached
//! through no mount option) and recorded through [`Planted::mount`].
//!
//! A new mode adds its own entries (soft updates with one rollback skipped, a journal
//! writing a block before its log records, LFS writing a checkpoint before its segments):
//! `every_ordering_mode_has_planted_bugs` fails for a registered mode that forbids
//! corruption and has none.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cairn_bufcache::{Buf, BufRef};
use cairn_ffs::format::kind;
use cairn_ffs::strategy::{
    AllocDirect, AllocIndir, Apply, AttrChange, BlkMapDep, BlockKind, DirAdd, DirChange, DirRemove,
    Engine, FreeBlocks, FreeFile, FsyncReq, Ino, InoMapDep, Io, LinkChange, LinkWhy, OpKind,
    OpState, Ordered, Release, StepWriter, Strategy, Sync, SyncWhy, Tx,
};
use cairn_vfs::Result as FsResult;
use parking_lot::Mutex;

use crate::declared::{self, Expectation};

/// One planted bug.
#[derive(Clone, Copy, Debug)]
pub struct Planted {
    /// The name `cairn crash run --planted` takes (also its mode name in reports).
    pub name: &'static str,
    /// The mode whose guarantees it claims.
    pub base: &'static str,
    /// What it breaks.
    pub breaks: &'static str,
    /// How it is planted (which hook does what instead).
    pub how: &'static str,
    /// The scripted workload that catches it in CI's campaign.
    pub workload: &'static str,
    fault: Fault,
}

/// The faults, one per entry: which hook misbehaves and how (see [`PlantedSync`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    BarrierDropped,
    DirentDirty,
    LazyReturn,
    FreeBeforeClear,
    GroupsNoBarrier,
    RenameRemoveFirst,
    FsyncMetaFirst,
    DataAllocsUnowed,
    DirentFirst,
    SoftdepEntryUnrolled,
    SoftdepRenameUnforced,
    LfsCheckpointFirst,
    LfsReleaseAtFlush,
    LfsRollForwardUncommitted,
    LfsPassRegionEarly,
}

/// Every planted bug, in the order `cairn crash list` prints them.
pub const CATALOGUE: &[Planted] = &[
    Planted {
        name: "barrier-dropped",
        base: "sync",
        breaks: "rule 1: a new inode and the entry naming it land in one epoch, in any order",
        how: "every step sync makes of the facts is written at once with no flush before it (owed group blocks too); only the end of the call flushes",
        workload: "create",
        fault: Fault::BarrierDropped,
    },
    Planted {
        name: "dirent-dirty",
        base: "sync",
        breaks: "durability on return: a new directory entry is left dirty in the cache",
        how: "setup_directory_add writes nothing",
        workload: "create",
        fault: Fault::DirentDirty,
    },
    Planted {
        name: "lazy-return",
        base: "sync",
        breaks: "durability on return: the last step of each call is not flushed before it returns",
        how: "end_op does not flush",
        workload: "setattr-size",
        fault: Fault::LazyReturn,
    },
    Planted {
        name: "free-before-clear",
        base: "sync",
        breaks: "rule 2: bitmaps free an inode's blocks before its cleared pointers are on disk",
        how: "setup_freeblocks releases the blocks at once and holds the cleared pointers; the next step writes the group blocks (with the freed bits) and flushes, then the held pointers",
        workload: "unlink",
        fault: Fault::FreeBeforeClear,
    },
    Planted {
        name: "groups-no-barrier",
        base: "sync",
        breaks: "rule 2: group blocks with freed bits land in the same epoch as the cleared pointers written just before",
        how: "owed group blocks (at write-back, fsync and before a pointer step) are written with no flush before them",
        workload: "write-rmdir",
        fault: Fault::GroupsNoBarrier,
    },
    Planted {
        name: "rename-remove-first",
        base: "sync",
        breaks: "rule 3: rename removes the old name before the new one is on disk",
        how: "setup_directory_add and _change hold the entry's block until the next setup_directory_remove has written its own",
        workload: "rename-across",
        fault: Fault::RenameRemoveFirst,
    },
    Planted {
        name: "fsync-meta-first",
        base: "sync",
        breaks: "fsync ordering: the inode (new size, new pointers) reaches disk before the data",
        how: "fsync writes every dirty metadata block, flushes, then the file's data",
        workload: "write-fsync",
        fault: Fault::FsyncMetaFirst,
    },
    Planted {
        name: "data-allocs-unowed",
        base: "sync",
        breaks: "rule 1 for block pointers: an inode points to blocks its bitmap does not mark used yet",
        how: "the data path's allocation facts (setup_allocdirect/_allocindir of data blocks) never reach sync, so it never owes their group blocks",
        workload: "write-chmod",
        fault: Fault::DataAllocsUnowed,
    },
    Planted {
        name: "dirent-first",
        base: "sync",
        breaks: "rule 1: a new entry reaches disk before the inode it names",
        how: "a new inode's first update_inodeblock is held until setup_directory_add has written the entry",
        workload: "create",
        fault: Fault::DirentFirst,
    },
    Planted {
        name: "softdep-entry-unrolled",
        base: "softdep",
        breaks: "rule 1: a new entry reaches disk before the inode it names (one rollback skipped)",
        how: "before_write does not roll back directory entries whose inodes are not on disk",
        // A write-back round writes inode blocks an epoch before directory blocks, so a
        // plain create hides the bug; mkdir's new inode is still rolled back (its first
        // block not on disk) when the parent's entry is written.
        workload: "mkdir",
        fault: Fault::SoftdepEntryUnrolled,
    },
    Planted {
        name: "softdep-rename-unforced",
        base: "softdep",
        breaks: "rule 3: a file rename's new name and the old name's removal reach disk in one write-back, in either order, so a crash can leave the file in no directory",
        how: "the old name of a file's rename is not put back at write time (SoftDep::without_rename_force: rule 3's rollback skipped for names of non-directories), so its removal and the new name reach disk in whatever order the write-back takes",
        // A name made durable by an fsync (written by it), then moved across directories.
        workload: "fsync-rename",
        fault: Fault::SoftdepRenameUnforced,
    },
    Planted {
        name: "lfs-checkpoint-first",
        base: "lfs",
        breaks: "004 §4.1: a checkpoint region reaches disk before the segments it names",
        how: "the checkpoint writes its region first, then the partial segment with the inode map and usage table blocks it names, with no flush between them",
        // Every workload ends in an unmount, whose checkpoint shows it; create is the
        // smallest.
        workload: "create",
        fault: Fault::LfsCheckpointFirst,
    },
    Planted {
        name: "lfs-release-before-checkpoint",
        base: "lfs",
        breaks: "004 §3.3: a segment is reused before a durable checkpoint says it is empty, so the log overwrites blocks the last durable checkpoint still names",
        how: "every flush releases the segments the in-memory usage table shows empty (release_empty_segments), instead of the checkpoint once its region is durable",
        // Only a log that wraps round writes a released segment again.
        workload: "log-wrap",
        fault: Fault::LfsReleaseAtFlush,
    },
    Planted {
        name: "lfs-rollforward-uncommitted",
        base: "lfs-cleaning",
        breaks: "004 §4.2: roll-forward applies the partial segments of a flush whose COMMIT never reached disk, so a crash inside a flush leaves half of it",
        how: "roll-forward applies each partial segment as it reads it instead of holding a flush's partials until its COMMIT (the recovery runs that engine's read-write mount)",
        // Flushes written as several partial segments, inode blocks before the last.
        workload: "flush-split",
        fault: Fault::LfsRollForwardUncommitted,
    },
    Planted {
        name: "lfs-background-region-early",
        base: "lfs-background",
        breaks: "004 §4.1: a background cleaning pass's checkpoint region reaches disk before the segments it names",
        how: "the pass made as a mount's background cleaner makes it writes its checkpoint's region as soon as it is prepared, before the device flush (lfs and lfs-cleaning, which clean in the operation's hold, never run that pass)",
        // The cleaner runs after most operations of a long random sequence.
        workload: "random-1",
        fault: Fault::LfsPassRegionEarly,
    },
];

/// The entry called `name`.
pub fn by_name(name: &str) -> Option<&'static Planted> {
    CATALOGUE.iter().find(|p| p.name == name)
}

impl Planted {
    /// The strategy with the bug in it, for a bug in an FFS mode (`None` for another
    /// format's: see [`Planted::mount`]).
    pub fn strategy(&self) -> Option<Box<dyn Strategy>> {
        // Every fault says where it is planted (a match without a catch-all: a new fault
        // must choose), never derived from its base mode's name.
        let steps: Arc<dyn StepWriter> = match self.fault {
            Fault::LfsCheckpointFirst
            | Fault::LfsReleaseAtFlush
            | Fault::LfsRollForwardUncommitted
            | Fault::LfsPassRegionEarly => return None,
            Fault::SoftdepEntryUnrolled => {
                return Some(Box::new(
                    cairn_ffs::strategy::softdep::SoftDep::without_entry_rollback(self.name),
                ));
            }
            Fault::SoftdepRenameUnforced => {
                return Some(Box::new(
                    cairn_ffs::strategy::softdep::SoftDep::without_rename_force(self.name),
                ));
            }
            Fault::BarrierDropped => Arc::new(Unbarriered),
            Fault::LazyReturn => Arc::new(NoEndFlush),
            Fault::GroupsNoBarrier => Arc::new(GroupsUnbarriered),
            Fault::DirentDirty
            | Fault::FreeBeforeClear
            | Fault::RenameRemoveFirst
            | Fault::FsyncMetaFirst
            | Fault::DataAllocsUnowed
            | Fault::DirentFirst => Arc::new(Ordered),
        };
        Some(Box::new(PlantedSync {
            fault: self.fault,
            name: self.name,
            inner: Sync::with_steps(steps),
            held: Mutex::new(Vec::new()),
            new_inodes: Mutex::new(Vec::new()),
            freed: AtomicBool::new(false),
        }))
    }

    /// It claims its base mode's guarantees: the campaign must show it does not deliver. A
    /// bug in a recovery brings its own: the crash states are recovered by it.
    pub fn expectation(&self) -> Option<Expectation> {
        let mut e = declared::expectation(self.base)?;
        e.mode = self.name.to_string();
        if self.fault == Fault::LfsRollForwardUncommitted {
            e.recovery = Some(recover_lfs_uncommitted);
        }
        Some(e)
    }

    /// The bug planted in the LFS engine, for a bug of that format.
    fn lfs_fault(&self) -> Option<cairn_lfs::Planted> {
        match self.fault {
            Fault::LfsCheckpointFirst => Some(cairn_lfs::Planted::CheckpointFirst),
            Fault::LfsReleaseAtFlush => Some(cairn_lfs::Planted::ReleaseAtFlush),
            Fault::LfsRollForwardUncommitted => Some(cairn_lfs::Planted::RollForwardUncommitted),
            Fault::LfsPassRegionEarly => Some(cairn_lfs::Planted::PassRegionEarly),
            _ => None,
        }
    }

    /// A read-write mount of `dev` with the bug in it and the mount options `opts` (its
    /// base's, a variant's among them), for a bug in a format other than FFS (planted in
    /// the format's engine behind its `planted` feature); `None` for an FFS bug, which is
    /// a strategy.
    pub fn mount(
        &self,
        dev: Arc<dyn cairn_blockdev::BlockDevice>,
        opts: &[declared::MountOption],
    ) -> Option<FsResult<Arc<dyn cairn_vfs::FileSystem>>> {
        let planted = self.lfs_fault()?;
        let mut o = cairn_lfs::MountOptions {
            syncer: false,
            ..Default::default()
        };
        for (k, v) in opts {
            if let Err(e) = o.set_for_device(k, v.as_deref()) {
                return Some(Err(cairn_vfs::FsError::Refused(
                    cairn_vfs::Errno::EINVAL,
                    e,
                )));
            }
        }
        Some(
            cairn_lfs::Lfs::mount_device_planted(dev, &o, planted)
                .map(|fs| fs as Arc<dyn cairn_vfs::FileSystem>),
        )
    }
}

/// The recovery of `lfs-rollforward-uncommitted`: the next mount after the crash is the
/// broken engine's (a read-write mount rolls forward — applying partial segments without
/// their COMMIT — and checkpoints what it applied), then the state is checked as usual.
fn recover_lfs_uncommitted(
    dev: Arc<dyn cairn_blockdev::BlockDevice>,
    _log: Option<Arc<dyn cairn_blockdev::BlockDevice>>,
) -> Result<(), String> {
    let o = cairn_lfs::MountOptions {
        syncer: false,
        ..Default::default()
    };
    let fs =
        cairn_lfs::Lfs::mount_device_planted(dev, &o, cairn_lfs::Planted::RollForwardUncommitted)
            .map_err(|e| e.to_string())?;
    cairn_vfs::FileSystem::destroy(fs.as_ref()).map_err(|e| e.to_string())
}

/// barrier-dropped: a step is written with no flush before it, owed group blocks too; the
/// end of a call still flushes (`Io` marks the writes unflushed).
struct Unbarriered;

impl StepWriter for Unbarriered {
    fn step(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        io.write_unordered(bufs)
    }
    fn groups(&self, io: &Io) -> FsResult<()> {
        io.write_groups_unordered()
    }
    fn durable(&self, io: &Io) -> FsResult<()> {
        io.barrier()
    }
}

/// lazy-return: a call returns with its last step unflushed.
struct NoEndFlush;

impl StepWriter for NoEndFlush {
    fn step(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        Ordered.step(io, bufs)
    }
    fn groups(&self, io: &Io) -> FsResult<()> {
        Ordered.groups(io)
    }
    fn durable(&self, _: &Io) -> FsResult<()> {
        Ok(())
    }
}

/// groups-no-barrier: owed group blocks are written with no flush before them.
struct GroupsUnbarriered;

impl StepWriter for GroupsUnbarriered {
    fn step(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        Ordered.step(io, bufs)
    }
    fn groups(&self, io: &Io) -> FsResult<()> {
        io.write_groups_unordered()
    }
    fn durable(&self, io: &Io) -> FsResult<()> {
        Ordered.durable(io)
    }
}

/// The real `sync` with one [`Fault`]: facts the fault does not concern are sync's own.
struct PlantedSync {
    fault: Fault,
    name: &'static str,
    inner: Sync,
    /// Buffers a fact held back (dirent-first: the new inode; free-before-clear: cleared
    /// pointers; rename-remove-first: the new name).
    held: Mutex<Vec<BufRef>>,
    /// dirent-first: inodes allocated by this call whose first encoding is still to come,
    /// with their group blocks.
    new_inodes: Mutex<Vec<(Ino, [BufRef; 2])>>,
    /// free-before-clear: blocks were freed since the held pointers were cleared.
    freed: AtomicBool,
}

impl PlantedSync {
    fn hold(&self, bufs: impl IntoIterator<Item = BufRef>) {
        self.held.lock().extend(bufs);
    }

    /// Writes whatever a fact held back, in one ordered step.
    fn write_held(&self, io: &Io) -> FsResult<()> {
        let held = std::mem::take(&mut *self.held.lock());
        if held.is_empty() {
            return Ok(());
        }
        let refs: Vec<&BufRef> = held.iter().collect();
        io.write_step(&refs)
    }

    /// Runs before every fact that makes sync write a step, and at the end of a call: the
    /// work a fault deferred to "the next step".
    fn before_step(&self, io: &Io) -> FsResult<()> {
        match self.fault {
            Fault::FreeBeforeClear if self.freed.swap(false, Ordering::AcqRel) => {
                // The bug: the freed bits go first, durably; the pointers they freed after.
                io.cache
                    .write_back_filter(&|b: &Buf| b.kind() == kind::GROUP)?;
                io.cache.flush_device()?;
                self.write_held(io)
            }
            Fault::RenameRemoveFirst => self.write_held(io),
            _ => Ok(()),
        }
    }
}

impl Strategy for PlantedSync {
    fn name(&self) -> &'static str {
        self.name
    }
    fn commit_policy(&self) -> cairn_vfs::modes::Commit {
        self.inner.commit_policy()
    }
    fn syncer_interval(&self) -> Duration {
        self.inner.syncer_interval()
    }
    fn begin_op(&self, kind: OpKind) -> FsResult<OpState> {
        self.new_inodes.lock().clear();
        self.inner.begin_op(kind)
    }
    fn commit_point(&self, tx: &mut Tx) -> FsResult<()> {
        self.inner.commit_point(tx)
    }
    fn end_op(&self, tx: &mut Tx, ok: bool) -> FsResult<()> {
        if !ok {
            self.held.lock().clear();
            return self.inner.end_op(tx, ok);
        }
        self.before_step(tx.io)?;
        if self.fault == Fault::DirentFirst {
            // Whatever is still held (an inode whose entry never came) goes out now.
            self.write_held(tx.io)?;
        }
        self.inner.end_op(tx, ok)
    }
    fn setup_inomapdep(&self, tx: &mut Tx, f: &InoMapDep) -> FsResult<()> {
        if self.fault == Fault::DirentFirst {
            let groups = [Arc::clone(f.desc), Arc::clone(f.bitmap)];
            self.new_inodes.lock().push((f.ino, groups));
        }
        self.inner.setup_inomapdep(tx, f)
    }
    fn setup_blkmapdep(&self, tx: &mut Tx, f: &BlkMapDep) -> FsResult<()> {
        self.inner.setup_blkmapdep(tx, f)
    }
    fn setup_allocdirect(&self, tx: &mut Tx, f: &AllocDirect) -> FsResult<()> {
        if self.fault == Fault::DataAllocsUnowed && f.kind == BlockKind::Data {
            return Ok(());
        }
        if f.kind.is_metadata() {
            self.before_step(tx.io)?;
        }
        self.inner.setup_allocdirect(tx, f)
    }
    fn setup_allocindir(&self, tx: &mut Tx, f: &AllocIndir) -> FsResult<()> {
        if self.fault == Fault::DataAllocsUnowed && f.kind == BlockKind::Data {
            return Ok(());
        }
        if f.kind.is_metadata() {
            self.before_step(tx.io)?;
        }
        self.inner.setup_allocindir(tx, f)
    }
    fn update_inodeblock(&self, tx: &mut Tx, ino: Ino, buf: &BufRef, was: u64) -> FsResult<()> {
        if self.fault == Fault::DirentFirst {
            let mut pending = self.new_inodes.lock();
            if let Some(i) = pending.iter().position(|(i, _)| *i == ino) {
                // The bug: the new inode's first encoding waits for its entry.
                let (_, [desc, bitmap]) = pending.swap_remove(i);
                self.hold([desc, bitmap, Arc::clone(buf)]);
                return Ok(());
            }
        }
        self.inner.update_inodeblock(tx, ino, buf, was)
    }
    fn setup_directory_add(&self, tx: &mut Tx, f: &DirAdd) -> FsResult<()> {
        match self.fault {
            Fault::DirentDirty => Ok(()),
            Fault::RenameRemoveFirst => {
                self.hold([Arc::clone(f.buf)]);
                Ok(())
            }
            Fault::DirentFirst if !self.held.lock().is_empty() => {
                // The directory block alone first: the parent's inode often shares an
                // inode block with the new inode and would carry it along.
                tx.io.write_step(&[f.buf])?;
                if self.inner.take_groups_owed() {
                    tx.io.write_groups()?;
                }
                self.write_held(tx.io)?;
                self.inner.setup_directory_add(tx, f)
            }
            _ => self.inner.setup_directory_add(tx, f),
        }
    }
    fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> FsResult<Apply> {
        if self.fault == Fault::RenameRemoveFirst && tx.kind != OpKind::Exchange {
            self.hold([Arc::clone(f.buf)]);
            return Ok(Apply::Now);
        }
        self.inner.setup_directory_change(tx, f)
    }
    fn setup_directory_remove(&self, tx: &mut Tx, f: &DirRemove) -> FsResult<Apply> {
        if self.fault == Fault::RenameRemoveFirst {
            // The old name goes first; the new one (held) after it.
            let apply = self.inner.setup_directory_remove(tx, f)?;
            self.write_held(tx.io)?;
            return Ok(apply);
        }
        self.before_step(tx.io)?;
        self.inner.setup_directory_remove(tx, f)
    }
    fn change_linkcnt(&self, tx: &mut Tx, f: &LinkChange) -> FsResult<()> {
        if f.after > f.before && f.why != LinkWhy::DotDot {
            self.before_step(tx.io)?;
        }
        self.inner.change_linkcnt(tx, f)
    }
    fn setup_freeblocks(&self, tx: &mut Tx, f: &FreeBlocks) -> FsResult<()> {
        self.before_step(tx.io)?;
        if self.fault == Fault::FreeBeforeClear {
            // Hold these cleared pointers and free the bits at once.
            self.hold(f.holders.iter().cloned().chain([Arc::clone(f.inode_buf)]));
            if !f.freed.is_empty() {
                tx.release(Release::Blocks(f.freed.to_vec()));
            }
            self.freed.store(true, Ordering::Release);
            return Ok(());
        }
        self.inner.setup_freeblocks(tx, f)
    }
    fn setup_freefile(&self, tx: &mut Tx, f: &FreeFile) -> FsResult<()> {
        self.inner.setup_freefile(tx, f)
    }
    fn setup_attr_change(&self, tx: &mut Tx, f: &AttrChange) -> FsResult<()> {
        self.before_step(tx.io)?;
        self.inner.setup_attr_change(tx, f)
    }
    fn fsync(&self, e: &dyn Engine, f: &FsyncReq) -> FsResult<()> {
        let (io, data) = (e.io(), f.blocks);
        self.before_step(io)?;
        match self.fault {
            Fault::FsyncMetaFirst => {
                // The bug: pointers (inode, indirect blocks, bitmaps) first, durably; the
                // data they point to after.
                self.inner.take_groups_owed();
                io.cache
                    .write_back_filter(&|b: &Buf| b.kind() != kind::DATA)?;
                io.cache.flush_device()?;
                let dirty: Vec<&BufRef> = data.iter().filter(|b| b.is_dirty()).collect();
                if !dirty.is_empty() {
                    io.cache.write_now(&dirty)?;
                }
                io.cache.flush_device()?;
                Ok(())
            }
            Fault::GroupsNoBarrier => {
                io.write_groups_unordered()?;
                self.inner.fsync(e, f)
            }
            _ => self.inner.fsync(e, f),
        }
    }
    fn sync(&self, e: &dyn Engine, why: SyncWhy) -> FsResult<()> {
        self.before_step(e.io())?;
        if self.fault == Fault::GroupsNoBarrier {
            e.io().write_groups_unordered()?;
        }
        self.inner.sync(e, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_names_are_unique_and_resolve() {
        for (i, p) in CATALOGUE.iter().enumerate() {
            assert!(
                CATALOGUE[..i].iter().all(|q| q.name != p.name),
                "{}",
                p.name
            );
            assert!(!crate::modes::registered().contains(&p.name));
            // An FFS bug is a strategy, another format's a mount of its engine.
            match p.strategy() {
                Some(s) => assert_eq!(s.name(), p.name),
                None => assert!(!crate::modes::is_ffs(p.base), "{}", p.name),
            }
            assert_eq!(p.expectation().unwrap().mode, p.name);
            // Its workload is in its campaign.
            assert!(
                crate::campaign::for_planted(p, None)
                    .workloads
                    .iter()
                    .any(|w| w.name == p.workload),
                "{}: workload {} is not in its campaign",
                p.name,
                p.workload
            );
        }
    }

    /// A mode that forbids corruption must show the harness can catch its ordering bugs: a
    /// new mode adds its planted bugs here when it registers.
    #[test]
    fn every_ordering_mode_has_planted_bugs() {
        for m in crate::modes::registered() {
            let e = crate::modes::expectation(m).unwrap();
            if e.corrupt == crate::modes::Allow::Forbidden {
                assert!(
                    CATALOGUE.iter().any(|p| p.base == m)
                        || JOURNAL_CATALOGUE.iter().any(|p| p.base == m),
                    "mode '{m}' forbids corruption but has no planted bug in the catalogue"
                );
            }
        }
    }
}

// ----- the journal's planted bugs ---------------------------------------------------------

/// A planted bug of the journal (`mode=journal`): kept apart from [`CATALOGUE`], whose
/// entries are wrappers around `sync`.
#[derive(Clone, Copy, Debug)]
pub struct PlantedJournal {
    pub name: &'static str,
    pub base: &'static str,
    pub breaks: &'static str,
    pub how: &'static str,
    pub workload: &'static str,
    fault: JournalFault,
}

/// How a planted journal is broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JournalFault {
    /// [`WriteBeforeLog`].
    WriteBeforeLog,
    /// The real journal with its hold on freed blocks opened at the end of the call that
    /// freed them (`Journal::plant_reuse_before_log`, behind cairn-ffs's `planted` feature).
    ReuseBeforeLog,
    /// The real journal in commit=group whose `after_op` does not force
    /// (`Journal::plant_no_group_force`).
    NoGroupForce,
    /// The real journal with its log on a device whose flush goes to the file system's
    /// device instead ([`FlushElsewhere`]).
    ForceFlushesHome,
    /// The real journal, recovered by one whose replay ignores REVOKE records
    /// (`Journal::plant_ignore_revoke`).
    IgnoreRevoke,
}

/// The journal's planted bugs: write-ahead broken in each journal mode (`commit=sync` and
/// `commit=async`, the log in the image and on a device of its own), freed blocks reused
/// before their free is durable, and a log on its own device forced by flushing the other.
pub const JOURNAL_CATALOGUE: &[PlantedJournal] = &[
    PlantedJournal {
        name: "journal-write-before-log",
        base: "journal",
        breaks: "write-ahead: a call's blocks reach their home locations before its log records",
        how: "end_op writes every buffer the call's facts named (through the cache) before the journal logs and forces the call",
        workload: "create",
        fault: JournalFault::WriteBeforeLog,
    },
    PlantedJournal {
        name: "journal-async-write-before-log",
        base: "journal-async",
        breaks: "write-ahead: a call's blocks reach their home locations before its log records",
        how: "as journal-write-before-log, with commit=async",
        workload: "create",
        fault: JournalFault::WriteBeforeLog,
    },
    PlantedJournal {
        name: "journal-replay-ignores-revoke",
        base: "journal",
        breaks: "recovery puts a freed block's logged image back over the data its next owner wrote there: a returned, fsynced write replaced by metadata",
        how: "the replay applies every logged update, those of blocks a later REVOKE record freed too (the writing journal is the real one; the mount after the crash runs the broken replay)",
        // A logged indirect block freed and reused as fsynced data before a checkpoint.
        workload: "reuse-logged",
        fault: JournalFault::IgnoreRevoke,
    },
    PlantedJournal {
        name: "journal-async-reuse-before-log",
        base: "journal-async",
        breaks: "a freed block is handed out again before the log records of its free are durable: its next data can land over a file a crash brings back",
        how: "the journal's hold on the blocks a call frees opens when the call ends instead of when its END record is durable",
        workload: "reuse-indirect",
        fault: JournalFault::ReuseBeforeLog,
    },
    PlantedJournal {
        name: "journal-group-return-before-force",
        base: "journal-group",
        breaks: "durability on return: a call returns before its log records are forced",
        how: "commit=group's after_op, which forces the call's END record once the engine's lock is dropped, returns without forcing",
        workload: "create",
        fault: JournalFault::NoGroupForce,
    },
    PlantedJournal {
        name: "journal-2sync-write-before-log",
        base: "journal-2sync",
        breaks: "write-ahead across devices: a call's blocks reach the file system's device before its log records reach the log device",
        how: "as journal-write-before-log, with the log on its own device",
        workload: "create",
        fault: JournalFault::WriteBeforeLog,
    },
    PlantedJournal {
        name: "journal-2async-write-before-log",
        base: "journal-2async",
        breaks: "write-ahead across devices: a call's blocks reach the file system's device before its log records reach the log device",
        how: "as journal-write-before-log, with commit=async and the log on its own device",
        workload: "create",
        fault: JournalFault::WriteBeforeLog,
    },
    PlantedJournal {
        name: "journal-2sync-force-flushes-home",
        base: "journal-2sync",
        breaks: "write-ahead and durability on return: the log is \"forced\" by a flush of the file system's device, which says nothing about the log device's writes (one flush covers both only when the log is in the image)",
        how: "the log device's flush flushes the file system's device instead (FlushElsewhere around the log device); the journal is the real one",
        workload: "create",
        fault: JournalFault::ForceFlushesHome,
    },
];

/// The journal's planted bug called `name`.
pub fn journal_by_name(name: &str) -> Option<&'static PlantedJournal> {
    JOURNAL_CATALOGUE.iter().find(|p| p.name == name)
}

impl PlantedJournal {
    /// The journal with the bug in it, its log in the image's log area (a bug claiming a
    /// log-device variant's guarantees: [`PlantedJournal::strategy_on`]).
    pub fn strategy(&self) -> Box<dyn Strategy> {
        self.with_log(cairn_ffs::strategy::journal::LogSpec::File)
    }

    /// The journal with the bug in it, its log on `log` (`fs`: the file system's device).
    pub fn strategy_on(
        &self,
        fs: Arc<dyn cairn_blockdev::BlockDevice>,
        log: Arc<dyn cairn_blockdev::BlockDevice>,
    ) -> Box<dyn Strategy> {
        let log: Arc<dyn cairn_blockdev::BlockDevice> = match self.fault {
            JournalFault::ForceFlushesHome => Arc::new(FlushElsewhere { log, fs }),
            _ => log,
        };
        self.with_log(cairn_ffs::strategy::journal::LogSpec::Device(log))
    }

    fn with_log(&self, log: cairn_ffs::strategy::journal::LogSpec) -> Box<dyn Strategy> {
        let inner =
            cairn_ffs::strategy::journal::Journal::new(log, declared::journal_commit(self.base));
        match self.fault {
            JournalFault::WriteBeforeLog => Box::new(WriteBeforeLog {
                name: self.name,
                inner,
                named: Mutex::new(Vec::new()),
            }),
            JournalFault::ReuseBeforeLog => {
                inner.plant_reuse_before_log();
                Box::new(inner.named(self.name))
            }
            JournalFault::NoGroupForce => {
                inner.plant_no_group_force();
                Box::new(inner.named(self.name))
            }
            JournalFault::ForceFlushesHome | JournalFault::IgnoreRevoke => {
                Box::new(inner.named(self.name))
            }
        }
    }

    /// It claims the journal's guarantees; a bug in the replay brings its recovery.
    pub fn expectation(&self) -> Option<Expectation> {
        let mut e = declared::expectation(self.base)?;
        e.mode = self.name.to_string();
        if self.fault == JournalFault::IgnoreRevoke {
            e.recovery = Some(recover_ignoring_revokes);
        }
        Some(e)
    }
}

/// The recovery of `journal-replay-ignores-revoke`: the journal's, replaying revoked updates.
fn recover_ignoring_revokes(
    dev: Arc<dyn cairn_blockdev::BlockDevice>,
    log: Option<Arc<dyn cairn_blockdev::BlockDevice>>,
) -> Result<(), String> {
    declared::recover_journal_as(dev, log, |j| j.plant_ignore_revoke())
}

/// journal-2sync-force-flushes-home: a log device whose flush goes to the file system's
/// device. The journal forces its log exactly as it should; the barrier lands on the wrong
/// device, as it would in a journal written for a log inside the image, where one flush
/// covers log and home blocks alike. Only a crash model that keeps a flush to its own
/// device sees it: the log's records stay volatile while home blocks written after the
/// "force" become durable.
struct FlushElsewhere {
    log: Arc<dyn cairn_blockdev::BlockDevice>,
    fs: Arc<dyn cairn_blockdev::BlockDevice>,
}

impl cairn_blockdev::BlockDevice for FlushElsewhere {
    fn block_size(&self) -> u32 {
        self.log.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.log.num_blocks()
    }
    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.log.read_blocks(block, buf)
    }
    fn write_blocks(&self, block: u64, buf: &[u8]) -> std::io::Result<()> {
        self.log.write_blocks(block, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.fs.flush()
    }
    fn counters(&self) -> &cairn_blockdev::DeviceCounters {
        self.log.counters()
    }
    fn set_trace(&self, sink: Option<Arc<dyn cairn_blockdev::TraceSink>>) {
        self.log.set_trace(sink);
    }
}

/// journal-write-before-log: the real journal, except that `end_op` first writes the call's
/// buffers home (their LSNs are the previous calls', so the write-ahead force in
/// `before_write` does not cover this call's changes).
struct WriteBeforeLog {
    name: &'static str,
    inner: cairn_ffs::strategy::journal::Journal,
    named: Mutex<Vec<BufRef>>,
}

impl WriteBeforeLog {
    fn note(&self, bufs: &[&BufRef]) {
        let mut v = self.named.lock();
        for b in bufs {
            if !v.iter().any(|x| x.blkno() == b.blkno()) {
                v.push(Arc::clone(b));
            }
        }
    }
}

impl Strategy for WriteBeforeLog {
    fn name(&self) -> &'static str {
        self.name
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
    fn io_model(&self) -> cairn_ffs::strategy::IoModel {
        self.inner.io_model()
    }
    fn write_hooks(&self) -> Arc<dyn cairn_bufcache::WriteHooks> {
        self.inner.write_hooks()
    }
    fn attach(&self, sb: &cairn_ffs::format::Superblock) -> FsResult<()> {
        self.inner.attach(sb)
    }
    fn recover(
        &self,
        dev: &dyn cairn_blockdev::BlockDevice,
        sb: &cairn_ffs::format::Superblock,
    ) -> FsResult<()> {
        self.inner.recover(dev, sb)
    }
    fn mount(&self, e: &dyn Engine) -> FsResult<()> {
        self.inner.mount(e)
    }
    fn background_interval(&self) -> Option<Duration> {
        self.inner.background_interval()
    }
    fn relieve(&self, e: &dyn Engine) -> FsResult<()> {
        self.inner.relieve(e)
    }
    fn background(&self, e: &dyn Engine) -> FsResult<bool> {
        self.inner.background(e)
    }
    fn sync(&self, e: &dyn Engine, why: SyncWhy) -> FsResult<()> {
        self.inner.sync(e, why)
    }
    fn unmount(&self, e: &dyn Engine) -> FsResult<()> {
        self.inner.unmount(e)
    }
    fn write_stream(&self, io: &Io, ino: Ino, blk: u64, data: &[u8]) -> FsResult<()> {
        self.inner.write_stream(io, ino, blk, data)
    }
    fn begin_op(&self, kind: OpKind) -> FsResult<OpState> {
        self.named.lock().clear();
        self.inner.begin_op(kind)
    }
    fn commit_point(&self, tx: &mut Tx) -> FsResult<()> {
        self.inner.commit_point(tx)
    }
    fn end_op(&self, tx: &mut Tx, ok: bool) -> FsResult<()> {
        let named = std::mem::take(&mut *self.named.lock());
        if ok {
            let dirty: Vec<&BufRef> = named.iter().filter(|b| b.is_dirty()).collect();
            if !dirty.is_empty() {
                tx.io.cache.write_now(&dirty)?;
            }
        }
        self.inner.end_op(tx, ok)
    }
    fn setup_inomapdep(&self, tx: &mut Tx, f: &InoMapDep) -> FsResult<()> {
        self.note(&[f.bitmap, f.desc]);
        self.inner.setup_inomapdep(tx, f)
    }
    fn setup_blkmapdep(&self, tx: &mut Tx, f: &BlkMapDep) -> FsResult<()> {
        self.note(&[f.bitmap, f.desc]);
        self.inner.setup_blkmapdep(tx, f)
    }
    fn setup_allocdirect(&self, tx: &mut Tx, f: &AllocDirect) -> FsResult<()> {
        if let Some(b) = f.new_buf {
            self.note(&[b]);
        }
        self.inner.setup_allocdirect(tx, f)
    }
    fn setup_allocindir(&self, tx: &mut Tx, f: &AllocIndir) -> FsResult<()> {
        self.note(&[f.indir]);
        self.inner.setup_allocindir(tx, f)
    }
    fn update_inodeblock(&self, tx: &mut Tx, ino: Ino, buf: &BufRef, was: u64) -> FsResult<()> {
        self.note(&[buf]);
        self.inner.update_inodeblock(tx, ino, buf, was)
    }
    fn setup_directory_add(&self, tx: &mut Tx, f: &DirAdd) -> FsResult<()> {
        self.note(&[f.buf]);
        self.inner.setup_directory_add(tx, f)
    }
    fn setup_directory_remove(&self, tx: &mut Tx, f: &DirRemove) -> FsResult<Apply> {
        self.note(&[f.buf]);
        self.inner.setup_directory_remove(tx, f)
    }
    fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> FsResult<Apply> {
        self.note(&[f.buf]);
        self.inner.setup_directory_change(tx, f)
    }
    fn change_linkcnt(&self, tx: &mut Tx, f: &LinkChange) -> FsResult<()> {
        self.note(&[f.inode_buf]);
        self.inner.change_linkcnt(tx, f)
    }
    fn before_tail_zeroed(&self, tx: &mut Tx, ino: Ino, buf: &BufRef) -> FsResult<()> {
        self.inner.before_tail_zeroed(tx, ino, buf)
    }
    fn setup_freeblocks(&self, tx: &mut Tx, f: &FreeBlocks) -> FsResult<()> {
        self.note(&[f.inode_buf]);
        self.inner.setup_freeblocks(tx, f)
    }
    fn setup_freefile(&self, tx: &mut Tx, f: &FreeFile) -> FsResult<()> {
        self.inner.setup_freefile(tx, f)
    }
    fn setup_attr_change(&self, tx: &mut Tx, f: &AttrChange) -> FsResult<()> {
        self.note(&[f.inode_buf]);
        self.inner.setup_attr_change(tx, f)
    }
    fn fsync(&self, e: &dyn Engine, f: &FsyncReq) -> FsResult<()> {
        self.inner.fsync(e, f)
    }
}

#[cfg(test)]
mod journal_tests {
    use super::*;

    #[test]
    fn the_journals_planted_bugs_resolve_and_claim_its_guarantees() {
        for p in JOURNAL_CATALOGUE {
            assert!(by_name(p.name).is_none());
            let two = crate::modes::needs_log_device(p.name);
            if two {
                let mem = |n| -> Arc<dyn cairn_blockdev::BlockDevice> {
                    Arc::new(cairn_blockdev::MemDevice::new(4096, n))
                };
                let s = crate::modes::strategy_with_log(p.name, mem(16), mem(16)).unwrap();
                assert_eq!(s.name(), p.name);
                assert!(crate::modes::strategy_for(p.name).is_none());
            } else {
                assert_eq!(p.strategy().name(), p.name);
            }
            let e = p.expectation().unwrap();
            assert_eq!(e.mode, p.name);
            assert!(e.recovery.is_some());
            // The log in the image's log area, or on its own device: never both.
            assert_ne!(crate::modes::needs_log_area(p.name), two, "{}", p.name);
            assert!(crate::modes::known(p.name));
            assert!(crate::workload::by_name(p.workload).is_some());
        }
    }
}
