//! cairn-crash: systematic crash-consistency testing of every metadata-update mode.
//!
//! The papers' claims are about what survives a crash (000 Table 3 and §5; 002 §3–4; 004 §4).
//! Instead of hitting a halt button at random points (002 §4), this crate records every block
//! write and flush a workload issues and checks every disk state a power failure could leave
//! (the approach of CrashMonkey/B3 and dm-log-writes, built in):
//!
//! 1. **Recording** ([`record`], [`recfs`]): a [`record::Recorder`] on the device keeps each
//!    block write with its contents and each flush; a [`recfs::RecordingFs`] around the file
//!    system marks each operation (id, kind, path, and the moment it returned). Workloads run
//!    in process ([`workload`]); real programs are recorded with `cairn mount -o record=FILE`.
//!    Every registered format is recorded the same way: an FFS mode through its strategy,
//!    any other format through its registry entry (`cairn_fstypes::DeviceOps`). A journal
//!    with its log on a device of its own (`journal-2sync`, `journal-2async`) is recorded
//!    as two devices into one event stream.
//! 2. **Crash states** ([`states`]): for every flush epoch, every earlier epoch durable plus
//!    a subset of the epoch's writes (all subsets when few, else a seeded sample and the
//!    edge cases), optionally with one torn block write. Each state is an
//!    [`overlay::Overlay`]: the epoch's shared base image plus the kept blocks. With two
//!    devices a flush settles only its own device's writes.
//! 3. **Checks** ([`check`]): the mode's recovery if it has one, fsck in check-only mode
//!    (findings classed as corruption or leak; another format: its own device check, LFS
//!    rolling forward in its read-only mount), a read-only in-process mount walked
//!    completely, and the durability oracle ([`oracle`]) against a model ([`model`]) of what
//!    the returned operations promised.
//! 4. **Expectations** ([`modes`]): one table of what each mode promises; a campaign
//!    ([`campaign`]) fails on anything a mode's entry forbids, and on a weakness a baseline
//!    must demonstrate but did not.
//! 5. **Planted bugs** ([`planted`]): a catalogue of deliberately broken orderings that
//!    claim a mode's guarantees; CI's campaign must catch every one.
//!
//! Floors inside the crate, bottom up (a module imports only from floors below it):
//! `repro` (the vocabulary a recording's header shares with the checks) → `record` →
//! `states`, `model`, `overlay` → `oracle`, `recfs` → `declared` (what the registry declares
//! about each mode's crashes) → `planted` (bugs claiming a declared mode's guarantees) →
//! `modes` (any name, planted or not) → `check`, `workload`, `report` → `campaign`.

pub mod campaign;
pub mod check;
pub mod declared;
pub mod model;
pub mod modes;
pub mod oracle;
pub mod overlay;
pub mod planted;
pub mod recfs;
pub mod record;
pub mod report;
pub mod repro;
pub mod states;
pub mod workload;

use std::path::Path;

pub use campaign::{CampaignOptions, CampaignResult};
pub use check::{Checker, StateClass, StateOutcome};
pub use modes::{Allow, Expectation};
pub use recfs::RecordingFs;
pub use record::{Recorder, Recording};
pub use report::CellResult;
pub use states::CrashState;

/// Why the harness itself could not do its job (as opposed to what it found).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A recording or reproducer that cannot be read.
    #[error("{0}")]
    Format(String),
    /// A workload failed while being recorded.
    #[error("workload {0}")]
    Workload(String),
    /// A mode without declared expectations, an unknown workload.
    #[error("{0}")]
    Config(String),
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
