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
use cairn_ffs::strategy::journal::Commit;
use cairn_ffs::strategy::{self, Strategy};
use cairn_vfs::modes::{Facts, LogPlacement};

use crate::declared;
pub use crate::declared::{
    Allow, Expectation, MountOption, Recovery, Variant, journal_on, log_device_variant, registered,
    variant, variants,
};

/// The facts of `mode`: a registered mode or variant, an FFS mode built but not listed, or
/// a planted bug (its base's).
pub fn facts(mode: &str) -> Option<Facts> {
    declared::facts(mode)
        .or_else(|| facts(crate::planted::journal_by_name(mode)?.base))
        .or_else(|| facts(crate::planted::by_name(mode)?.base))
}

/// Whether a recording of `mode` has a second device for the journal's log (a log-device
/// variant or a planted bug claiming one's guarantees).
pub fn needs_log_device(mode: &str) -> bool {
    facts(mode).is_some_and(|f| f.log == LogPlacement::Device)
}

/// The commit policy of a journal mode (registered, a log-device variant of one, or a
/// planted bug claiming one's guarantees), as its declaration says.
pub fn journal_commit(mode: &str) -> Commit {
    declared::commit_of(facts(mode))
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

/// Whether a recording of `mode` needs an image with a journal log area (`log=file`).
pub fn needs_log_area(mode: &str) -> bool {
    facts(mode).is_some_and(|f| f.log == LogPlacement::Area)
}

/// The planted bug writing a new name before its inode (see [`crate::planted`]).
pub const DIRENT_FIRST: &str = "dirent-first";
/// The planted bug whose calls return before their last step is flushed.
pub const LAZY_RETURN: &str = "lazy-return";

/// Every mode's expectation, planted bugs included (each claims its base mode's). `None`
/// for a name that is neither a registered mode nor a planted bug.
pub fn expectation(mode: &str) -> Option<Expectation> {
    if let Some(e) = declared::expectation(mode) {
        return Some(e);
    }
    if let Some(p) = crate::planted::journal_by_name(mode) {
        return p.expectation();
    }
    crate::planted::by_name(mode).and_then(|p| p.expectation())
}

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
