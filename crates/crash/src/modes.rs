//! Per-mode expectations: what each metadata-update mode promises about a crash, in one
//! table that the campaign checks its measurements against (issue 5 §4).
//!
//! A mode registered in `cairn_ffs::modes()` without an entry here makes the campaign fail:
//! a mode must declare what it guarantees before it can be said to deliver it. Later modes
//! add one line using the constructors below (`soft_updates`, `journaling`, `log_structured`),
//! with their recovery where they have one.
//!
//! The planted bugs of [`crate::planted`] claim their base mode's guarantees: the campaign
//! must show they do not deliver them.

use cairn_blockdev::BlockDevice;
use cairn_ffs::strategy::{self, Strategy};
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
                fsync_data_first: true,
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
                fsync_data_first: true,
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
                fsync_data_first: true,
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
                fsync_data_first: true,
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
                fsync_data_first: true,
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

/// The planted bug writing a new name before its inode (see [`crate::planted`]).
pub const DIRENT_FIRST: &str = "dirent-first";
/// The planted bug whose calls return before their last step is flushed.
pub const LAZY_RETURN: &str = "lazy-return";

/// Every mode's expectation, planted bugs included (each claims its base mode's). `None`
/// for a mode that declared nothing.
pub fn expectation(mode: &str) -> Option<Expectation> {
    match mode {
        "sync" => Some(Expectation::synchronous(mode)),
        "async" => Some(Expectation::unordered(mode)),
        _ => crate::planted::by_name(mode).and_then(|p| p.expectation()),
    }
}

/// Every registered mode (the ones `cairn crash run` checks by default).
pub fn registered() -> Vec<&'static str> {
    cairn_ffs::modes().iter().map(|m| m.name).collect()
}

/// The strategy for `mode`: a registered one, or a planted bug.
pub fn strategy_for(mode: &str) -> Option<Box<dyn Strategy>> {
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
            assert!(strategy_for(m).is_some());
        }
        assert_eq!(strategy_for(DIRENT_FIRST).unwrap().name(), DIRENT_FIRST);
        assert_eq!(strategy_for(LAZY_RETURN).unwrap().name(), LAZY_RETURN);
    }
}
