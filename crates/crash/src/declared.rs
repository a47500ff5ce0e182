//! What the registry declares about each mode's crashes, read for the campaign: a mode's
//! [`Expectation`] (its declared guarantees), its recovery, its commit policy and where its
//! journal keeps the log — for the registered modes, their variants and the FFS modes
//! built but not yet listed. Nothing here knows the planted bugs: they sit on the floor
//! above and claim a base mode's declaration from here; [`crate::modes`] looks up any name,
//! planted or not.

use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_ffs::strategy::journal::{Commit, Journal, LogSpec};

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

/// The log-device variant called `name`.
pub fn log_device_variant(name: &str) -> Option<&'static Variant> {
    variant(name).filter(|v| v.log == LogPlacement::Device)
}

/// The recovery the harness runs before fsck, read off the mode's declaration: a mode
/// whose recovery is its log's replay is recovered by a read-write mount, because cairn's
/// fsck reads the device as it is. A mode that rolls forward does so in its own check and
/// read-only mount (LFS, in memory).
fn recovery_of(spec: &ModeSpec) -> Option<Recovery> {
    (spec.facts.recovery == cairn_vfs::modes::Recovery::LogReplay)
        .then_some(recover_journal as Recovery)
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

/// The facts of a registered mode or variant, or of an FFS mode built but not listed.
pub fn facts(mode: &str) -> Option<Facts> {
    cairn_fstypes::facts_of(mode).or_else(|| cairn_ffs::strategy::candidate(mode).map(|m| m.facts))
}

/// The commit policy of a journal mode (registered or a log-device variant of one), as its
/// declaration says.
pub fn journal_commit(mode: &str) -> Commit {
    commit_of(facts(mode))
}

/// The journal's commit policy for a mode's facts (a mode without a commit policy commits
/// synchronously: the policy plays no part in its recording).
pub(crate) fn commit_of(facts: Option<Facts>) -> Commit {
    match facts.map(|f| f.commit) {
        Some(VfsCommit::Async) => Commit::Async,
        Some(VfsCommit::Group) => Commit::Group,
        Some(VfsCommit::Sync) | None => Commit::Sync,
    }
}

/// The expectation of a registered mode, an FFS mode not yet listed or a variant (its
/// base's promises and recovery, which takes the log device's state for a log-device
/// variant). `None` for any other name.
pub fn expectation(mode: &str) -> Option<Expectation> {
    if let Some(m) = cairn_fstypes::mode(mode) {
        return Some(Expectation::declared(&m.spec, m.fs));
    }
    // FFS modes built and tested but not yet listed are checked by name.
    if let Some(m) = cairn_ffs::strategy::candidate(mode) {
        return Some(Expectation::declared(&m.spec(), cairn_fstypes::ffs()));
    }
    let v = variant(mode)?;
    let mut e = expectation(v.base)?;
    e.mode = v.name.to_string();
    Some(e)
}

pub use cairn_fstypes::MountOption;

/// Every registered mode (the ones `cairn crash run` checks by default).
pub fn registered() -> Vec<&'static str> {
    cairn_fstypes::modes().iter().map(|m| m.name()).collect()
}
