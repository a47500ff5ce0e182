//! Per-mode expectations: what each metadata-update mode promises about a crash, in one
//! table that the campaign checks its measurements against (issue 5 §4).
//!
//! Every mode of the registry (`cairn_fstypes::modes()`) declares what it guarantees beside
//! its strategy (`cairn_vfs::modes::Guarantees`); the campaign holds it to exactly that
//! ([`Expectation::declared`]), so a mode cannot be said to deliver what it never declared,
//! and a new mode needs no edit here.
//!
//! The planted bugs of [`crate::planted`] claim their base mode's guarantees: the campaign
//! must show they do not deliver them.

use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_ffs::strategy::journal::{Commit, Journal, LogSpec};
use cairn_ffs::strategy::{self, Strategy};
use serde::Serialize;

use cairn_vfs::modes::{Allowed, Commit as VfsCommit, Facts, LogPlacement, ModeSpec};

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
/// It gets the state as a shared device, so it can mount it, and the state of the log's
/// own device when the mode keeps its log on one (a two-device recording: see
/// [`log_device_variant`]).
pub type Recovery = fn(Arc<dyn BlockDevice>, Option<Arc<dyn BlockDevice>>) -> Result<(), String>;

/// The journal's recovery: a read-write mount (which replays the log and frees the orphans
/// it names) and a clean unmount — what the next mount after a crash does. With a log
/// device, the journal reads its log there (`log=dev`), as it crashed: the two devices'
/// states come from the same crash.
fn recover_journal(
    dev: Arc<dyn BlockDevice>,
    log: Option<Arc<dyn BlockDevice>>,
) -> Result<(), String> {
    recover_journal_as(dev, log, |_| {})
}

/// The journal's recovery by a journal `plant` has broken (a planted bug in the replay):
/// the mount after the crash is that journal's.
pub(crate) fn recover_journal_as(
    dev: Arc<dyn BlockDevice>,
    log: Option<Arc<dyn BlockDevice>>,
    plant: impl FnOnce(&Journal),
) -> Result<(), String> {
    let opts = cairn_ffs::MountOptions {
        mode: "journal".into(),
        cache_bytes: 16 << 20,
        syncer_interval: Some(std::time::Duration::from_secs(24 * 3600)),
        read_only: false,
        // The crash left the superblock "mounted": the journal recovers it itself.
        force: true,
        mode_options: Vec::new(),
    };
    // The commit policy plays no part in recovery.
    let journal = match log {
        Some(log) => journal_on(log, Commit::Sync),
        None => Journal::new(LogSpec::File, Commit::Sync),
    };
    plant(&journal);
    let fs = cairn_ffs::Ffs::mount_device_with_strategy(dev, &opts, Box::new(journal))
        .map_err(|e| e.to_string())?;
    fs.unmount().map_err(|e| e.to_string())
}

/// The journal with its log on `log` (a device formatted by `cairn_wal::Wal::format`).
pub fn journal_on(log: Arc<dyn BlockDevice>, commit: Commit) -> Journal {
    Journal::new(LogSpec::Device(log), commit)
}

/// A variant of a registered mode (the registry's `cairn_fstypes::variants`): a journal
/// with its log on a device of its own (001 §5.2's WAFS; the paper's LFFS-wafs-2sync and
/// -2async, the benchmarks' cairn-journal-2sync and -2async), recorded as two devices — the
/// crash states that matter are the ones across the devices —, or a mode on an image made
/// and mounted to drive a path its plain runs seldom reach (lfs-cleaning). Checked by name
/// (`cairn crash run --modes journal-2sync`).
pub use cairn_fstypes::{Variant, variant, variants};

/// The facts of `mode`: a registered mode or variant, an FFS mode built but not listed, or
/// a planted bug (its base's).
pub fn facts(mode: &str) -> Option<Facts> {
    cairn_fstypes::facts_of(mode)
        .or_else(|| cairn_ffs::strategy::candidate(mode).map(|m| m.facts))
        .or_else(|| facts(crate::planted::journal_by_name(mode)?.base))
        .or_else(|| facts(crate::planted::by_name(mode)?.base))
}

/// The log-device variant called `name`.
pub fn log_device_variant(name: &str) -> Option<&'static Variant> {
    variant(name).filter(|v| v.log == LogPlacement::Device)
}

/// Whether a recording of `mode` has a second device for the journal's log (a log-device
/// variant or a planted bug claiming one's guarantees).
pub fn needs_log_device(mode: &str) -> bool {
    facts(mode).is_some_and(|f| f.log == LogPlacement::Device)
}

/// The commit policy of a journal mode (registered, a log-device variant of one, or a
/// planted bug claiming one's guarantees), as its declaration says.
pub fn journal_commit(mode: &str) -> Commit {
    match facts(mode).map(|f| f.commit) {
        Some(VfsCommit::Async) => Commit::Async,
        Some(VfsCommit::Group) => Commit::Group,
        Some(VfsCommit::Sync) | None => Commit::Sync,
    }
}

/// The strategy recording `mode` with its log on `log` (see [`needs_log_device`]); `fs` is
/// the file system's device (a planted bug may misuse it). `None` for a mode without a log
/// device.
pub fn strategy_with_log(
    mode: &str,
    fs: Arc<dyn BlockDevice>,
    log: Arc<dyn BlockDevice>,
) -> Option<Box<dyn Strategy>> {
    if let Some(v) = log_device_variant(mode) {
        return Some(Box::new(
            journal_on(log, journal_commit(v.base)).named(v.name),
        ));
    }
    crate::planted::journal_by_name(mode)
        .filter(|p| log_device_variant(p.base).is_some())
        .map(|p| p.strategy_on(fs, log))
}

/// The recovery the harness runs before fsck, read off the mode's declaration: a mode
/// whose recovery is its log's replay is recovered by a read-write mount, because cairn's
/// fsck reads the device as it is. A mode that rolls forward does so in its own check and
/// read-only mount (LFS, in memory).
fn recovery_of(spec: &ModeSpec) -> Option<Recovery> {
    (spec.facts.recovery == cairn_vfs::modes::Recovery::LogReplay)
        .then_some(recover_journal as Recovery)
}

/// Whether a recording of `mode` needs an image with a journal log area (`log=file`).
pub fn needs_log_area(mode: &str) -> bool {
    facts(mode).is_some_and(|f| f.log == LogPlacement::Area)
}

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

impl Allow {
    /// The campaign's reading of a mode's declared [`Allowed`].
    pub fn from_declared(a: Allowed) -> Allow {
        match a {
            Allowed::Never => Allow::Forbidden,
            Allowed::May => Allow::Allowed,
            Allowed::Shown => Allow::Demonstrated,
        }
    }
}

impl Expectation {
    /// What the campaign holds a mode to: exactly the guarantees its format declares for it
    /// (`cairn_vfs::modes::Guarantees`, listed by `cairn_fstypes`). Durability violations
    /// are never allowed: the promises say which durability is checked.
    /// A format whose crash states are prefixes of the calls (`FsType::crash_prefix`) is
    /// held to that too; the recovery is the one the declaration implies ([`recovery_of`]).
    pub fn declared(spec: &ModeSpec, fs: &cairn_fstypes::FsType) -> Expectation {
        let g = &spec.guarantees;
        Expectation {
            mode: spec.name.to_string(),
            promises: Promises {
                metadata_on_return: g.metadata_on_return,
                fsync_data_first: g.fsync_data_first,
                no_stale_data: g.no_stale_data,
                names_kept: g.names_kept,
                prefix: fs.crash_prefix,
            },
            corrupt: Allow::from_declared(g.corrupt),
            leak: Allow::from_declared(g.leak),
            interrupted_rename: Allow::from_declared(g.interrupted_rename),
            durability: Allow::Forbidden,
            recovery: recovery_of(spec),
            basis: g.basis,
        }
    }
}

/// The planted bug writing a new name before its inode (see [`crate::planted`]).
pub const DIRENT_FIRST: &str = "dirent-first";
/// The planted bug whose calls return before their last step is flushed.
pub const LAZY_RETURN: &str = "lazy-return";

/// Every mode's expectation, planted bugs included (each claims its base mode's). `None`
/// for a name that is neither a registered mode nor a planted bug.
pub fn expectation(mode: &str) -> Option<Expectation> {
    match cairn_fstypes::mode(mode) {
        Some(m) => Some(Expectation::declared(&m.spec, m.fs)),
        None => {
            // FFS modes built and tested but not yet listed are checked by name.
            if let Some(m) = cairn_ffs::strategy::candidate(mode) {
                return Some(Expectation::declared(&m.spec(), cairn_fstypes::ffs()));
            }
            if let Some(p) = crate::planted::journal_by_name(mode) {
                return p.expectation();
            }
            // The base's promises and recovery (which takes the log device's state, for a
            // log-device variant).
            if let Some(v) = variant(mode) {
                let mut e = expectation(v.base)?;
                e.mode = v.name.to_string();
                return Some(e);
            }
            crate::planted::by_name(mode).and_then(|p| p.expectation())
        }
    }
}

pub use cairn_fstypes::MountOption;

/// The format a mode (registered, an FFS mode not yet listed, a variant or a planted bug)
/// records and checks in. `None` for an unknown name.
pub fn format_of(mode: &str) -> Option<&'static cairn_fstypes::FsType> {
    if let Some(m) = cairn_fstypes::mode(mode) {
        return Some(m.fs);
    }
    if cairn_ffs::strategy::candidate(mode).is_some()
        || crate::planted::journal_by_name(mode).is_some()
    {
        return Some(cairn_fstypes::ffs());
    }
    if let Some(v) = variant(mode) {
        return format_of(v.base);
    }
    crate::planted::by_name(mode).and_then(|p| format_of(p.base))
}

/// Whether the mode's format is FFS: it is recorded through a strategy (so planted FFS bugs
/// and the modes not yet listed plug in) and checked with cairn's fsck and an FFS mount.
/// Any other format is recorded and checked through its registry entry
/// (`cairn_fstypes::DeviceOps`).
pub fn is_ffs(mode: &str) -> bool {
    format_of(mode).is_some_and(|f| std::ptr::eq(f, cairn_fstypes::ffs()))
}

/// Whether `mode` can be recorded: an FFS strategy, or a mode of another registered format
/// (or a planted bug in one).
pub fn known(mode: &str) -> bool {
    if needs_log_device(mode) {
        return true;
    }
    if is_ffs(mode) {
        strategy_for(mode).is_some()
    } else {
        format_of(mode).is_some()
    }
}

/// The registered mode a state of `mode` is mounted in to be walked (a planted bug's base;
/// an FFS mode not yet listed is read in the format's default mode, whose read-only mount
/// reads any FFS image).
pub fn mount_mode(mode: &str) -> String {
    if cairn_fstypes::mode(mode).is_some() {
        return mode.to_string();
    }
    if let Some(v) = variant(mode) {
        return mount_mode(v.base);
    }
    match crate::planted::by_name(mode) {
        Some(p) if !is_ffs(mode) => mount_mode(p.base),
        _ => (cairn_fstypes::ffs().modes)()[0].name.to_string(),
    }
}

/// Every registered mode (the ones `cairn crash run` checks by default).
pub fn registered() -> Vec<&'static str> {
    cairn_fstypes::modes().iter().map(|m| m.name()).collect()
}

/// The strategy for `mode`: a registered one, or a planted bug. `None` for a mode with a
/// log device too: its strategy needs the devices ([`strategy_with_log`]).
pub fn strategy_for(mode: &str) -> Option<Box<dyn Strategy>> {
    if needs_log_device(mode) {
        return None;
    }
    if let Some(p) = crate::planted::journal_by_name(mode) {
        return Some(p.strategy());
    }
    match crate::planted::by_name(mode) {
        Some(p) => p.strategy(),
        None => strategy::by_name(mode),
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
            assert!(known(m));
            assert_eq!(strategy_for(m).is_some(), is_ffs(m), "{m}");
        }
        assert_eq!(strategy_for(DIRENT_FIRST).unwrap().name(), DIRENT_FIRST);
        assert_eq!(strategy_for(LAZY_RETURN).unwrap().name(), LAZY_RETURN);
    }

    /// journal-2sync and journal-2async hold the promises of their base mode, recover with
    /// the journal, record a log device and no log area.
    #[test]
    fn log_device_variants_carry_their_base_modes_expectations() {
        for v in variants().iter().filter(|v| v.log == LogPlacement::Device) {
            let e = expectation(v.name).unwrap();
            let b = expectation(v.base).unwrap();
            assert_eq!(e.mode, v.name);
            assert_eq!(
                (e.promises, e.corrupt, e.leak, e.interrupted_rename),
                (b.promises, b.corrupt, b.leak, b.interrupted_rename)
            );
            assert!(e.recovery.is_some() && known(v.name) && is_ffs(v.name));
            assert!(needs_log_device(v.name) && !needs_log_area(v.name));
            assert_eq!(journal_commit(v.name), journal_commit(v.base));
            assert!(strategy_for(v.name).is_none());
            let mem =
                |n| -> Arc<dyn BlockDevice> { Arc::new(cairn_blockdev::MemDevice::new(4096, n)) };
            assert_eq!(
                strategy_with_log(v.name, mem(16), mem(16)).unwrap().name(),
                v.name
            );
        }
        // The benchmarks' names for the same systems (cairn-journal-2sync, -2async).
        assert!(
            expectation("journal-2sync")
                .unwrap()
                .promises
                .metadata_on_return
        );
        assert!(
            !expectation("journal-2async")
                .unwrap()
                .promises
                .metadata_on_return
        );
        assert_eq!(journal_commit("journal-2async"), Commit::Async);
        assert!(
            !needs_log_device("journal") && strategy_with_log("journal", mem0(), mem0()).is_none()
        );
    }

    fn mem0() -> Arc<dyn BlockDevice> {
        Arc::new(cairn_blockdev::MemDevice::new(4096, 16))
    }

    /// The two baselines keep the promises the papers give them (000 §5, Table 3).
    #[test]
    fn sync_and_async_declare_the_papers_promises() {
        let s = expectation("sync").unwrap();
        assert!(s.promises.metadata_on_return && s.promises.fsync_data_first);
        assert_eq!(
            (s.corrupt, s.leak, s.interrupted_rename),
            (Allow::Forbidden, Allow::Allowed, Allow::Allowed)
        );
        let a = expectation("async").unwrap();
        assert!(!a.promises.metadata_on_return && a.promises.fsync_data_first);
        assert_eq!(a.corrupt, Allow::Demonstrated);
        assert!(expectation("turbo").is_none());
    }
}
