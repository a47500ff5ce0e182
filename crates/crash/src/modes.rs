//! Per-mode expectations: what each metadata-update mode promises about a crash, in one
//! table that the campaign checks its measurements against (issue 5 §4).
//!
//! A mode registered in `cairn_ffs::modes()` without an entry here makes the campaign fail:
//! a mode must declare what it guarantees before it can be said to deliver it. Later modes
//! add one line using the constructors below (`soft_updates`, `journaling`, `log_structured`),
//! with their recovery where they have one.
//!
//! The test-only mode [`DIRENT_FIRST`] claims `sync`'s guarantees but writes a new directory
//! entry before the inode it names (breaking rule 1, 002 §3): the campaign must catch it.

use std::sync::Arc;
use std::time::Duration;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::BufRef;
use cairn_ffs::format::kind;
use cairn_ffs::strategy::{self, Io, Strategy};
use cairn_vfs::{KernelCachePolicy, Result as FsResult};
use parking_lot::Mutex;
use serde::Serialize;

use crate::oracle::Promises;

/// Whether an outcome may occur.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Allow {
    /// Any occurrence fails the campaign.
    Forbidden,
    /// May occur.
    Allowed,
    /// Must occur at least once over a campaign that includes the scripted workloads: the
    /// weakness a baseline exists to show must be demonstrated, not hidden.
    Demonstrated,
}

impl Allow {
    pub fn word(self) -> &'static str {
        match self {
            Allow::Forbidden => "forbidden",
            Allow::Allowed => "allowed",
            Allow::Demonstrated => "expected (must be shown)",
        }
    }
}

/// A mode's recovery, run on the crash state before fsck (journal replay, roll-forward).
pub type Recovery = fn(&dyn BlockDevice) -> Result<(), String>;

/// What a mode promises about the states a crash can leave.
#[derive(Clone, Debug, Serialize)]
pub struct Expectation {
    pub mode: String,
    pub promises: Promises,
    pub corrupt: Allow,
    pub leak: Allow,
    /// A directory rename caught between its two flushes (see docs/CRASH.md).
    pub interrupted_rename: Allow,
    /// Durability violations are never allowed; the promises say what is checked.
    pub durability: Allow,
    #[serde(skip)]
    pub recovery: Option<Recovery>,
    /// Where the promise comes from.
    pub basis: &'static str,
}

impl Expectation {
    /// Classic FFS (`sync`): metadata durable on return, ordered writes, so a crash leaves
    /// only what fsck reclaims (000 §5, 002 §3.3); a directory rename is not atomic without a
    /// log (001 §6), so the window between its steps is allowed and repaired by fsck.
    pub fn synchronous(mode: &str) -> Expectation {
        Expectation {
            mode: mode.into(),
            promises: Promises {
                metadata_on_return: true,
                no_stale_data: false,
            },
            corrupt: Allow::Forbidden,
            leak: Allow::Allowed,
            interrupted_rename: Allow::Allowed,
            durability: Allow::Forbidden,
            recovery: None,
            basis: "000 §5: create, delete, rename durable on return; 002 §3: rules 1-3 by synchronous writes; 001 §6: rename not atomic",
        }
    }

    /// FFS mounted async: no ordering, so corruption is expected (000 Table 3: "recovery is
    /// non-deterministic and may be impossible"); only fsync is honoured.
    pub fn unordered(mode: &str) -> Expectation {
        Expectation {
            mode: mode.into(),
            promises: Promises {
                metadata_on_return: false,
                no_stale_data: false,
            },
            corrupt: Allow::Demonstrated,
            leak: Allow::Allowed,
            interrupted_rename: Allow::Allowed,
            durability: Allow::Forbidden,
            recovery: None,
            basis: "000 §5 and Table 3: FFS-async makes no guarantee; fsync is honoured in every mode",
        }
    }

    /// Soft updates: delayed but ordered writes: leaks only, never stale data (000 §5,
    /// 002 §3–4); two names after a directory rename are possible (001 §6).
    pub fn soft_updates(mode: &str) -> Expectation {
        Expectation {
            mode: mode.into(),
            promises: Promises {
                metadata_on_return: false,
                no_stale_data: true,
            },
            corrupt: Allow::Forbidden,
            leak: Allow::Allowed,
            interrupted_rename: Allow::Allowed,
            durability: Allow::Forbidden,
            recovery: None,
            basis: "000 §5: integrity assured, freed blocks/inodes may leak, no metadata points to bad data",
        }
    }

    /// Journaling: clean after log replay (001 §3, atomic rename); `sync_log` when the log
    /// is written synchronously (FFS's durability).
    pub fn journaling(mode: &str, sync_log: bool, replay: Recovery) -> Expectation {
        Expectation {
            mode: mode.into(),
            promises: Promises {
                metadata_on_return: sync_log,
                no_stale_data: false,
            },
            corrupt: Allow::Forbidden,
            leak: Allow::Forbidden,
            interrupted_rename: Allow::Forbidden,
            durability: Allow::Forbidden,
            recovery: Some(replay),
            basis: "001 §3: after log replay the file system is consistent; rename is atomic",
        }
    }

    /// Log-structured: clean after roll-forward from the last checkpoint (004 §4).
    pub fn log_structured(mode: &str, roll_forward: Recovery) -> Expectation {
        Expectation {
            mode: mode.into(),
            promises: Promises {
                metadata_on_return: false,
                no_stale_data: false,
            },
            corrupt: Allow::Forbidden,
            leak: Allow::Forbidden,
            interrupted_rename: Allow::Forbidden,
            durability: Allow::Forbidden,
            recovery: Some(roll_forward),
            basis: "004 §4: checkpoints plus roll-forward with the directory operation log",
        }
    }
}

/// The test-only broken ordering: a new name reaches the disk before its inode.
pub const DIRENT_FIRST: &str = "broken-dirent-first";
/// The test-only broken durability: `sync` whose calls return before their last step is
/// flushed (no barrier in `op_done`).
pub const LAZY_RETURN: &str = "broken-lazy-return";

/// Every mode's expectation. `None` for a mode that declared nothing.
pub fn expectation(mode: &str) -> Option<Expectation> {
    match mode {
        "sync" => Some(Expectation::synchronous(mode)),
        "async" => Some(Expectation::unordered(mode)),
        // Claims sync's guarantees; the campaign must show that it does not deliver them.
        DIRENT_FIRST | LAZY_RETURN => Some(Expectation::synchronous(mode)),
        _ => None,
    }
}

/// Every registered mode (the ones `cairn crash run` checks by default).
pub fn registered() -> Vec<&'static str> {
    cairn_ffs::modes().iter().map(|m| m.name).collect()
}

/// The strategy for `mode`: a registered one, or a test-only broken one.
pub fn strategy_for(mode: &str) -> Option<Box<dyn Strategy>> {
    if mode == DIRENT_FIRST {
        return Some(Box::new(DirentFirst::new()));
    }
    if mode == LAZY_RETURN {
        return Some(Box::new(LazyReturn(strategy::by_name("sync")?)));
    }
    strategy::by_name(mode)
}

/// `sync` with rule 1 broken: the inode written in `setup_inode_alloc` is held back and
/// written only after the directory entry that names it, behind a barrier. A crash between
/// the two leaves a name pointing at an unallocated, uninitialized inode.
pub struct DirentFirst {
    inner: Box<dyn Strategy>,
    held: Mutex<Vec<BufRef>>,
}

impl DirentFirst {
    pub fn new() -> DirentFirst {
        DirentFirst {
            inner: strategy::by_name("sync").expect("sync is always registered"),
            held: Mutex::new(Vec::new()),
        }
    }
}

impl Default for DirentFirst {
    fn default() -> Self {
        DirentFirst::new()
    }
}

impl Strategy for DirentFirst {
    fn name(&self) -> &'static str {
        DIRENT_FIRST
    }
    fn cache_policy(&self) -> KernelCachePolicy {
        self.inner.cache_policy()
    }
    fn syncer_interval(&self) -> Duration {
        self.inner.syncer_interval()
    }
    fn setup_inode_alloc(&self, _io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.held.lock().extend(bufs.iter().map(|b| Arc::clone(b)));
        Ok(())
    }
    fn setup_block_init(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.inner.setup_block_init(io, bufs)
    }
    fn setup_directory_add(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        // The directory block alone first: the parent's inode often shares an inode block
        // with the new inode and would carry it along.
        let (entries, rest): (Vec<&BufRef>, Vec<&BufRef>) =
            bufs.iter().partition(|b| b.kind() == kind::DIRECTORY);
        io.write_ordered(&entries)?;
        let held = std::mem::take(&mut *self.held.lock());
        let mut refs: Vec<&BufRef> = held.iter().collect();
        refs.extend(rest);
        io.write_ordered(&refs)
    }
    fn setup_directory_remove(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.inner.setup_directory_remove(io, bufs)
    }
    fn setup_link_add(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.inner.setup_link_add(io, bufs)
    }
    fn setup_link_remove(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.inner.setup_link_remove(io, bufs)
    }
    fn setup_freeblocks(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.inner.setup_freeblocks(io, bufs)
    }
    fn setup_attr_change(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.inner.setup_attr_change(io, bufs)
    }
    fn op_done(&self, io: &Io) -> FsResult<()> {
        // Whatever is still held (an xattr block allocation) goes out before the call returns.
        let held = std::mem::take(&mut *self.held.lock());
        if !held.is_empty() {
            let refs: Vec<&BufRef> = held.iter().collect();
            io.write_ordered(&refs)?;
        }
        self.inner.op_done(io)
    }
    fn write_back(&self, io: &Io, durable: bool) -> FsResult<()> {
        self.inner.write_back(io, durable)
    }
}

/// `sync` without the flush at the end of a call: each step is still ordered behind a
/// barrier, but the last one is not durable when the call returns.
pub struct LazyReturn(Box<dyn Strategy>);

impl Strategy for LazyReturn {
    fn name(&self) -> &'static str {
        LAZY_RETURN
    }
    fn cache_policy(&self) -> KernelCachePolicy {
        self.0.cache_policy()
    }
    fn syncer_interval(&self) -> Duration {
        self.0.syncer_interval()
    }
    fn setup_inode_alloc(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.0.setup_inode_alloc(io, bufs)
    }
    fn setup_block_init(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.0.setup_block_init(io, bufs)
    }
    fn setup_directory_add(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.0.setup_directory_add(io, bufs)
    }
    fn setup_directory_remove(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.0.setup_directory_remove(io, bufs)
    }
    fn setup_link_add(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.0.setup_link_add(io, bufs)
    }
    fn setup_link_remove(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.0.setup_link_remove(io, bufs)
    }
    fn setup_freeblocks(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.0.setup_freeblocks(io, bufs)
    }
    fn setup_attr_change(&self, io: &Io, bufs: &[&BufRef]) -> FsResult<()> {
        self.0.setup_attr_change(io, bufs)
    }
    fn op_done(&self, _io: &Io) -> FsResult<()> {
        Ok(())
    }
    fn write_back(&self, io: &Io, durable: bool) -> FsResult<()> {
        self.0.write_back(io, durable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_mode_declares_its_expectations() {
        for m in registered() {
            let e = expectation(m)
                .unwrap_or_else(|| panic!("mode '{m}' declares no crash expectations"));
            assert_eq!(e.mode, m);
            assert_eq!(e.durability, Allow::Forbidden);
            assert!(strategy_for(m).is_some());
        }
        assert_eq!(strategy_for(DIRENT_FIRST).unwrap().name(), DIRENT_FIRST);
        assert_eq!(strategy_for(LAZY_RETURN).unwrap().name(), LAZY_RETURN);
    }
}
