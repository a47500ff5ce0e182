//! What a metadata-update mode promises about a crash: the vocabulary every on-disk format
//! declares its modes in, and every tool reads them back in.
//!
//! A format crate (ffs, later lfs) lists its modes as [`ModeSpec`]s; the registry of file
//! system types (`cairn-fstypes`) gathers them; `cairn modes` prints them, the crash harness
//! turns each mode's [`Guarantees`] into the expectations its campaign enforces, and the
//! benchmark reads [`AfterCrash`] to know how to recover a target after a crash. A new mode
//! is one `ModeSpec` in its format crate and nothing else.

use serde::{Deserialize, Serialize};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

pub use crate::options::OptionSpec;

/// The design a mode belongs to (001 §2's classes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// FFS's own disciplines: ordered synchronous writes (sync) or none at all (async).
    Ffs,
    /// Soft updates: delayed writes ordered by per-pointer dependencies (002).
    SoftUpdates,
    /// A write-ahead log of metadata beside the home locations (001 §5).
    Journal,
    /// The file system is the log (004).
    LogStructured,
}

/// When a call's metadata is made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Commit {
    /// Before the call returns, by its own writes or log force.
    Sync,
    /// Before the call returns, by a log force concurrent calls share.
    Group,
    /// Later: on fsync, sync(2) or a timer.
    Async,
}

/// What runs after a crash before the image is checked or used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recovery {
    /// Nothing of the mode's own: the checker (fsck, or a background one) finds what is
    /// left.
    None,
    /// The log is replayed by a read-write mount, which writes the home locations; the
    /// checker reads the device as it is, so a check after a crash replays first.
    LogReplay,
    /// Roll-forward from the last checkpoint, done by every mount (in memory when read-only)
    /// and by the format's own check: nothing runs before a check.
    RollForward,
}

/// Where a mode keeps its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogPlacement {
    /// No log.
    None,
    /// In the image's log area (`cairn mkfs --journal-size`): `log=file`.
    Area,
    /// On a device of its own (`log=dev:PATH`): the registry's log-device variants.
    Device,
    /// The whole file system is the log.
    Whole,
}

/// A mode's facts beside its promises: what the tools need to record, run and recover it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    pub family: Family,
    pub commit: Commit,
    pub recovery: Recovery,
    /// Where the log is unless a mount option moves it.
    pub log: LogPlacement,
}

impl Facts {
    /// Whether the facts agree with each other and with the promises; a one-line reason
    /// where they do not. Every registered mode and variant must pass (the registry's tests).
    pub fn check(&self, g: &Guarantees) -> Result<(), String> {
        let f = self;
        let logged = !matches!(f.log, LogPlacement::None);
        let rules: [(bool, &str); 8] = [
            (
                (f.family == Family::Journal)
                    == matches!(f.log, LogPlacement::Area | LogPlacement::Device),
                "a journal, and only a journal, keeps a log beside the file system",
            ),
            (
                (f.family == Family::LogStructured) == (f.log == LogPlacement::Whole),
                "a log-structured mode, and only one, is its own log",
            ),
            (
                (f.recovery == Recovery::LogReplay) == (f.family == Family::Journal),
                "a journal's recovery is its log's replay, and only a journal's",
            ),
            (
                (f.recovery == Recovery::RollForward) == (f.family == Family::LogStructured),
                "a log-structured mode's recovery is roll-forward, and only its",
            ),
            (
                (f.recovery != Recovery::None) == logged,
                "a mode with a log recovers from it; one without has no recovery of its own",
            ),
            (
                (g.after_crash == AfterCrash::Recover) == (f.recovery != Recovery::None),
                "after_crash: recover exactly when the mode has a recovery",
            ),
            (
                g.metadata_on_return == (f.commit != Commit::Async),
                "metadata durable on return exactly when the commit is sync or group",
            ),
            (
                f.commit != Commit::Group || logged,
                "group commit shares log forces: it needs a log",
            ),
        ];
        match rules.iter().find(|(ok, _)| !ok) {
            Some((_, why)) => Err((*why).to_string()),
            None => Ok(()),
        }
    }
}

/// One metadata-update mode of a format, chosen at mount time with `-o mode=NAME`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModeSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub guarantees: Guarantees,
    pub facts: Facts,
    /// The mount options this mode parses itself; the format hands them over without
    /// knowing them, so a mode with options plugs in without edits in the tools.
    pub options: &'static [OptionSpec],
}

impl ModeSpec {
    /// When a call's metadata is durable, in a few words (help, README, listings).
    pub fn durable_when(&self) -> &'static str {
        match self.facts.commit {
            Commit::Sync => "every call durable when it returns",
            Commit::Group => "every call durable when it returns (concurrent calls share flushes)",
            Commit::Async => "calls durable on fsync, `cairn sync` or the next timed write-back",
        }
    }

    /// What a crash asks before the file system is used again, in a few words.
    pub fn after_crash_needs(&self) -> &'static str {
        match (self.guarantees.after_crash, self.facts.recovery) {
            (AfterCrash::Fsck, _) => "`cairn fsck -y` before mounting",
            (AfterCrash::Mount, _) => {
                "mounts at once (leaks are reclaimed by `cairn fsck --background`)"
            }
            (AfterCrash::Recover, Recovery::LogReplay) => "the mount replays the log",
            (AfterCrash::Recover, _) => "the mount rolls forward from the last checkpoint",
        }
    }

    /// The mode's promise in one line. Derived from the facts and guarantees, so it cannot
    /// say something the crash harness does not hold the mode to.
    pub fn promise(&self) -> String {
        format!(
            "{}; after a crash, {}",
            self.durable_when(),
            self.after_crash_needs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal() -> (Facts, Guarantees) {
        (
            Facts {
                family: Family::Journal,
                commit: Commit::Sync,
                recovery: Recovery::LogReplay,
                log: LogPlacement::Area,
            },
            Guarantees {
                metadata_on_return: true,
                fsync_data_first: true,
                no_stale_data: true,
                names_kept: true,
                corrupt: Allowed::Never,
                leak: Allowed::Never,
                interrupted_rename: Allowed::Never,
                after_crash: AfterCrash::Recover,
                basis: "",
            },
        )
    }

    /// Each rule refuses the declaration that breaks it.
    #[test]
    fn inconsistent_facts_are_refused() {
        let (f, g) = journal();
        assert_eq!(f.check(&g), Ok(()));
        let no_log = Facts {
            log: LogPlacement::None,
            ..f
        };
        assert!(no_log.check(&g).is_err(), "a journal without a log");
        let fsck = Facts {
            recovery: Recovery::None,
            ..f
        };
        assert!(fsck.check(&g).is_err(), "a journal without its replay");
        let lazy = Guarantees {
            metadata_on_return: false,
            ..g
        };
        assert!(f.check(&lazy).is_err(), "commit=sync not durable on return");
        let scan = Guarantees {
            after_crash: AfterCrash::Fsck,
            ..g
        };
        assert!(
            f.check(&scan).is_err(),
            "a replay that is not run after a crash"
        );
        let ffs = Facts {
            family: Family::Ffs,
            commit: Commit::Group,
            recovery: Recovery::None,
            log: LogPlacement::None,
        };
        let ffs_g = Guarantees {
            after_crash: AfterCrash::Fsck,
            ..g
        };
        assert!(ffs.check(&ffs_g).is_err(), "group commit without a log");
        let lfs = Facts {
            family: Family::LogStructured,
            commit: Commit::Async,
            recovery: Recovery::LogReplay,
            log: LogPlacement::Whole,
        };
        let lfs_g = Guarantees {
            metadata_on_return: false,
            ..g
        };
        assert!(lfs.check(&lfs_g).is_err(), "LFS recovering by log replay");
        let lfs = Facts {
            recovery: Recovery::RollForward,
            ..lfs
        };
        assert_eq!(lfs.check(&lfs_g), Ok(()));
    }
}
