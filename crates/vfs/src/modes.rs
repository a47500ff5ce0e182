//! What a metadata-update mode promises about a crash: the vocabulary every on-disk format
//! declares its modes in, and every tool reads them back in.
//!
//! A format crate (ffs, later lfs) lists its modes as [`ModeSpec`]s; the registry of file
//! system types (`cairn-fstypes`) gathers them; `cairn modes` prints them, the crash harness
//! turns each mode's [`Guarantees`] into the expectations its campaign enforces, and the
//! benchmark reads [`AfterCrash`] to know how to recover a target after a crash. A new mode
//! is one `ModeSpec` in its format crate and nothing else.

use serde::Serialize;

/// Whether an outcome of a crash may occur in a mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Allowed {
    /// Never: any occurrence is a bug in the mode.
    Never,
    /// May occur (and is repaired by what [`AfterCrash`] says).
    May,
    /// The mode's known weakness: a crash campaign must show it at least once, so a baseline
    /// cannot look better than it is.
    Shown,
}

/// What must happen after a crash before the file system is usable again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterCrash {
    /// A full check and repair (`cairn fsck -y`) before mounting: FFS sync and async.
    Fsck,
    /// Mount at once; what is left (leaks) is reclaimed later or in the background: soft
    /// updates (002 §4).
    Mount,
    /// The mount itself recovers (log replay, roll-forward): journaling, LFS.
    Recover,
}

/// A mode's promises about the states a crash can leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Guarantees {
    /// Every metadata call is durable when it returns (FFS sync, a synchronous log).
    pub metadata_on_return: bool,
    /// fsync writes a file's data before the pointers to it.
    pub fsync_data_first: bool,
    /// No file ever shows data it was not given (soft updates: 000 §5): no piece of a
    /// file is another file's bytes, bytes never written as its data (a metadata image a
    /// recovery put back over it), or zeros where it was written.
    pub no_stale_data: bool,
    /// An inode that had a durable name and is never unlinked keeps a name: no crash, and
    /// no rename in flight, leaves it in no directory (002 §3 rule 3: never reset the old
    /// pointer to a resource before the new one is set; a log makes the rename atomic).
    /// A name is durable once a sync(2) returned after it was made, an fsync of the
    /// file returned while every directory above it was durable, or — where metadata is
    /// durable on return — the call that made it returned.
    pub names_kept: bool,
    /// Inconsistencies fsck must repair (dangling entries, doubly used blocks, ...).
    pub corrupt: Allowed,
    /// Blocks or inodes marked in use that nothing references.
    pub leak: Allowed,
    /// A directory rename caught between its steps (two names, or a stale `..`).
    pub interrupted_rename: Allowed,
    pub after_crash: AfterCrash,
    /// Where the promise comes from (paper and section).
    pub basis: &'static str,
}

/// A mount option a mode parses itself (e.g. a journal's `log=file|dev:PATH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ModeOption {
    pub key: &'static str,
    /// The values it takes, as help text shows them (`file|dev:PATH`).
    pub values: &'static str,
    pub help: &'static str,
}

/// One metadata-update mode of a format, chosen at mount time with `-o mode=NAME`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModeSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub guarantees: Guarantees,
    /// The mount options this mode parses itself; the format hands them over without
    /// knowing them, so a mode with options plugs in without edits in the tools.
    pub options: &'static [ModeOption],
}
