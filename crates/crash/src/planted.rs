//! The catalogue of planted bugs: deliberately broken orderings that claim a real mode's
//! guarantees, so the harness can prove it catches what it exists to catch.
//!
//! A checker that never fails proves nothing. Each entry below is one small, plausible
//! ordering bug of the kind a mode's author could write, planted as a wrapper around the
//! real strategy (no engine code changes: every bug here is expressible at the strategy
//! interface). CI's bounded campaign (`tests/campaign.rs`) runs every entry over the
//! scripted workloads and fails unless each one is caught; `cairn crash run --planted NAME`
//! runs the same campaign for one entry and exits 1 when it is caught, 0 when it slips
//! through. Each entry names the scripted workload written to catch it (the campaign must
//! catch it there), so no catch depends on a random seed.
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
use cairn_ffs::strategy::{self, Io, Strategy};
use cairn_vfs::{KernelCachePolicy, Result as FsResult};
use parking_lot::Mutex;

use crate::campaign::CampaignOptions;
use crate::modes::Expectation;
use crate::workload;

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
}

/// Every planted bug, in the order `cairn crash list` prints them.
pub const CATALOGUE: &[Planted] = &[
    Planted {
        name: "barrier-dropped",
        base: "sync",
        breaks: "rule 1: a new inode and the entry naming it land in one epoch, in any order",
        how: "every setup hook writes its buffers at once with no flush before them; only the end of the call flushes",
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
        how: "op_done does not flush",
        workload: "setattr-size",
        fault: Fault::LazyReturn,
    },
    Planted {
        name: "free-before-clear",
        base: "sync",
        breaks: "rule 2: bitmaps free an inode's blocks before its cleared pointers are on disk",
        how: "setup_freeblocks holds its buffers; the next hook writes the group blocks (with the freed bits) and flushes, then the held pointers",
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
        how: "setup_directory_add holds its buffers until the next setup_directory_remove has written its own",
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
        how: "the data path's allocations are never marked owed: every hook clears Io::data_allocs_pending first",
        workload: "write-chmod",
        fault: Fault::DataAllocsUnowed,
    },
    Planted {
        name: "dirent-first",
        base: "sync",
        breaks: "rule 1: a new entry reaches disk before the inode it names",
        how: "setup_inode_alloc holds the inode until setup_directory_add has written the entry",
        workload: "create",
        fault: Fault::DirentFirst,
    },
];

/// The entry called `name`.
pub fn by_name(name: &str) -> Option<&'static Planted> {
    CATALOGUE.iter().find(|p| p.name == name)
}

impl Planted {
    /// The strategy with the bug in it.
    pub fn strategy(&self) -> Option<Box<dyn Strategy>> {
        Some(Box::new(PlantedSync {
            fault: self.fault,
            name: self.name,
            inner: strategy::by_name(self.base)?,
            held: Mutex::new(Vec::new()),
            freed: AtomicBool::new(false),
            unflushed: AtomicBool::new(false),
        }))
    }

    /// It claims its base mode's guarantees: the campaign must show it does not deliver.
    pub fn expectation(&self) -> Option<Expectation> {
        let mut e = crate::modes::expectation(self.base)?;
        e.mode = self.name.to_string();
        Some(e)
    }
}

/// States per planted bug in CI's campaign and by default for `cairn crash run --planted`.
pub const CAMPAIGN_STATES: usize = 1200;

/// The campaign that must catch `p`: its mode over the scripted workloads, with a fixed
/// seed, so CI and `cairn crash run --planted` check the same states.
pub fn campaign(p: &Planted, states: Option<usize>) -> CampaignOptions {
    CampaignOptions {
        modes: vec![p.name.to_string()],
        workloads: workload::scripted_set(),
        states: states.unwrap_or(CAMPAIGN_STATES),
        seed: 1,
        ..Default::default()
    }
}

fn has_pointers(bufs: &[&BufRef]) -> bool {
    bufs.iter()
        .any(|b| b.kind() == kind::INODE || b.kind() == kind::INDIRECT)
}

/// The base strategy with one [`Fault`]. Hooks the fault does not concern are the base's.
struct PlantedSync {
    fault: Fault,
    name: &'static str,
    inner: Box<dyn Strategy>,
    /// Buffers a hook held back (dirent-first: the new inode; free-before-clear: cleared
    /// pointers; rename-remove-first: the new name).
    held: Mutex<Vec<BufRef>>,
    /// free-before-clear: blocks were freed since the held pointers were cleared.
    freed: AtomicBool,
    /// barrier-dropped: written since the last flush.
    unflushed: AtomicBool,
}

impl PlantedSync {
    fn take_held(&self) -> Vec<BufRef> {
        std::mem::take(&mut *self.held.lock())
    }

    /// Writes whatever a hook held back, in one ordered step.
    fn write_held(&self, io: &Io) -> FsResult<()> {
        let held = self.take_held();
        if held.is_empty() {
            return Ok(());
        }
        let refs: Vec<&BufRef> = held.iter().collect();
        io.write_ordered(&refs)
    }

    /// Runs before every hook: the work a fault deferred to "the next step".
    fn before_step(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        match self.fault {
            Fault::FreeBeforeClear if self.freed.swap(false, Ordering::AcqRel) => {
                // The bug: the freed bits go first, durably; the pointers they freed after.
                io.cache
                    .write_back_filter(&|b: &Buf| b.kind() == kind::GROUP)?;
                io.cache.flush_device()?;
                self.write_held(io)
            }
            Fault::DataAllocsUnowed => {
                io.data_allocs_pending.store(false, Ordering::Release);
                Ok(())
            }
            Fault::GroupsNoBarrier
                if has_pointers(bufs) && io.data_allocs_pending.swap(false, Ordering::AcqRel) =>
            {
                io.cache
                    .write_back_filter(&|b: &Buf| b.kind() == kind::GROUP)?;
                Ok(())
            }
            Fault::RenameRemoveFirst => self.write_held(io),
            _ => Ok(()),
        }
    }

    /// barrier-dropped: a step written with no flush before it (the owed group blocks
    /// still go first, in the same epoch).
    fn write_unbarriered(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        if has_pointers(bufs) && io.data_allocs_pending.swap(false, Ordering::AcqRel) {
            io.cache
                .write_back_filter(&|b: &Buf| b.kind() == kind::GROUP)?;
        }
        let dirty: Vec<&BufRef> = bufs.iter().copied().filter(|b| b.is_dirty()).collect();
        if !dirty.is_empty() {
            io.cache.write_now(&dirty)?;
            self.unflushed.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// A hook the fault does not change, unless it is barrier-dropped.
    fn step(&self, io: &Io, bufs: &[&BufRef], base: impl FnOnce() -> FsResult<()>) -> FsResult<()> {
        self.before_step(io, bufs)?;
        if self.fault == Fault::BarrierDropped {
            self.write_unbarriered(io, bufs)
        } else {
            base()
        }
    }
}

impl Strategy for PlantedSync {
    fn name(&self) -> &'static str {
        self.name
    }
    fn cache_policy(&self) -> KernelCachePolicy {
        self.inner.cache_policy()
    }
    fn syncer_interval(&self) -> Duration {
        self.inner.syncer_interval()
    }
    fn setup_inode_alloc(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        if self.fault == Fault::DirentFirst {
            self.held.lock().extend(bufs.iter().map(|b| Arc::clone(b)));
            return Ok(());
        }
        self.step(io, bufs, || self.inner.setup_inode_alloc(io, bufs))
    }
    fn setup_block_init(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.step(io, bufs, || self.inner.setup_block_init(io, bufs))
    }
    fn setup_directory_add(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        match self.fault {
            Fault::DirentDirty => Ok(()),
            Fault::RenameRemoveFirst => {
                self.held.lock().extend(bufs.iter().map(|b| Arc::clone(b)));
                Ok(())
            }
            Fault::DirentFirst => {
                // The directory block alone first: the parent's inode often shares an
                // inode block with the new inode and would carry it along.
                let (entries, rest): (Vec<&BufRef>, Vec<&BufRef>) =
                    bufs.iter().partition(|b| b.kind() == kind::DIRECTORY);
                io.write_ordered(&entries)?;
                let held = self.take_held();
                let mut refs: Vec<&BufRef> = held.iter().collect();
                refs.extend(rest);
                io.write_ordered(&refs)
            }
            _ => self.step(io, bufs, || self.inner.setup_directory_add(io, bufs)),
        }
    }
    fn setup_directory_remove(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        if self.fault == Fault::RenameRemoveFirst {
            // The old name goes first; the new one (held) after it.
            self.inner.setup_directory_remove(io, bufs)?;
            return self.write_held(io);
        }
        self.step(io, bufs, || self.inner.setup_directory_remove(io, bufs))
    }
    fn setup_link_add(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.step(io, bufs, || self.inner.setup_link_add(io, bufs))
    }
    fn setup_link_remove(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        // sync leaves a lowered count dirty; so does every fault.
        self.before_step(io, bufs)?;
        self.inner.setup_link_remove(io, bufs)
    }
    fn setup_freeblocks(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        if self.fault == Fault::FreeBeforeClear {
            // Finish an earlier free first (its bitmaps are dirty by now), then hold these
            // cleared pointers: the caller frees the bits after this returns.
            self.before_step(io, bufs)?;
            self.held.lock().extend(bufs.iter().map(|b| Arc::clone(b)));
            self.freed.store(true, Ordering::Release);
            return Ok(());
        }
        self.step(io, bufs, || self.inner.setup_freeblocks(io, bufs))
    }
    fn setup_attr_change(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.step(io, bufs, || self.inner.setup_attr_change(io, bufs))
    }
    fn op_done(&self, io: &Io) -> FsResult<()> {
        self.before_step(io, &[])?;
        match self.fault {
            Fault::LazyReturn => Ok(()),
            Fault::DirentFirst => {
                // Whatever is still held (an inode whose entry never came) goes out now.
                self.write_held(io)?;
                self.inner.op_done(io)
            }
            Fault::BarrierDropped => {
                if self.unflushed.swap(false, Ordering::AcqRel) {
                    io.cache.flush_device()?;
                }
                self.inner.op_done(io)
            }
            _ => self.inner.op_done(io),
        }
    }
    fn fsync(&self, io: &Io, data: &[BufRef]) -> FsResult<()> {
        self.before_step(io, &[])?;
        match self.fault {
            Fault::FsyncMetaFirst => {
                // The bug: pointers (inode, indirect blocks, bitmaps) first, durably; the
                // data they point to after.
                io.data_allocs_pending.store(false, Ordering::Release);
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
                io.cache
                    .write_back_filter(&|b: &Buf| b.kind() == kind::GROUP)?;
                self.inner.fsync(io, data)
            }
            _ => self.inner.fsync(io, data),
        }
    }
    fn write_back(&self, io: &Io, durable: bool) -> FsResult<()> {
        self.before_step(io, &[])?;
        if self.fault == Fault::GroupsNoBarrier {
            io.cache
                .write_back_filter(&|b: &Buf| b.kind() == kind::GROUP)?;
        }
        self.inner.write_back(io, durable)
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
            assert_eq!(p.strategy().expect("base mode exists").name(), p.name);
            assert_eq!(p.expectation().unwrap().mode, p.name);
            assert!(
                workload::scripted_set()
                    .iter()
                    .any(|w| w.name == p.workload),
                "{}: workload {} is not scripted",
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
                    CATALOGUE.iter().any(|p| p.base == m),
                    "mode '{m}' forbids corruption but has no planted bug in the catalogue"
                );
            }
        }
    }
}
