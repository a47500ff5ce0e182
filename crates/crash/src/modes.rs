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
use cairn_ffs::strategy::{self, Strategy};
use serde::Serialize;

use cairn_vfs::modes::{Allowed, ModeSpec};

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
/// It gets the state as a shared device, so it can mount it.
pub type Recovery = fn(Arc<dyn BlockDevice>) -> Result<(), String>;

/// The journal's recovery: a read-write mount (which replays the log and frees the orphans
/// it names) and a clean unmount — what the next mount after a crash does.
fn recover_journal(dev: Arc<dyn BlockDevice>) -> Result<(), String> {
    let fs = cairn_ffs::Ffs::mount_device(
        dev,
        &cairn_ffs::MountOptions {
            mode: "journal".into(),
            cache_bytes: 16 << 20,
            syncer_interval: Some(std::time::Duration::from_secs(24 * 3600)),
            read_only: false,
            // The crash left the superblock "mounted": the journal recovers it itself.
            force: true,
            mode_options: Vec::new(),
        },
    )
    .map_err(|e| e.to_string())?;
    fs.unmount().map_err(|e| e.to_string())
}

/// The recovery of a mode that has one.
fn recovery_for(mode: &str) -> Option<Recovery> {
    matches!(mode, "journal" | "journal-async").then_some(recover_journal as Recovery)
}

/// Whether a recording of `mode` needs an image with a journal log area (`log=file`).
pub fn needs_log_area(mode: &str) -> bool {
    matches!(mode, "journal" | "journal-async") || crate::planted::journal_by_name(mode).is_some()
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
    pub fn declared(spec: &ModeSpec, recovery: Option<Recovery>) -> Expectation {
        let g = &spec.guarantees;
        Expectation {
            mode: spec.name.to_string(),
            promises: Promises {
                metadata_on_return: g.metadata_on_return,
                fsync_data_first: g.fsync_data_first,
                no_stale_data: g.no_stale_data,
            },
            corrupt: Allow::from_declared(g.corrupt),
            leak: Allow::from_declared(g.leak),
            interrupted_rename: Allow::from_declared(g.interrupted_rename),
            durability: Allow::Forbidden,
            recovery,
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
        // A mode whose format has a recovery step (log replay, roll-forward) registers it
        // in `recovery_for`.
        Some(m) => Some(Expectation::declared(&m.spec, recovery_for(mode))),
        None => {
            // FFS modes built and tested but not yet listed (journal, softdep) are checked
            // by name.
            if let Some(m) = cairn_ffs::strategy::candidate(mode) {
                return Some(Expectation::declared(&m.spec(), recovery_for(mode)));
            }
            if let Some(p) = crate::planted::journal_by_name(mode) {
                return p.expectation();
            }
            crate::planted::by_name(mode).and_then(|p| p.expectation())
        }
    }
}

/// Every registered mode (the ones `cairn crash run` checks by default).
pub fn registered() -> Vec<&'static str> {
    cairn_fstypes::modes().iter().map(|m| m.name()).collect()
}

/// The strategy for `mode`: a registered one, or a planted bug.
pub fn strategy_for(mode: &str) -> Option<Box<dyn Strategy>> {
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
            assert!(strategy_for(m).is_some());
        }
        assert_eq!(strategy_for(DIRENT_FIRST).unwrap().name(), DIRENT_FIRST);
        assert_eq!(strategy_for(LAZY_RETURN).unwrap().name(), LAZY_RETURN);
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
