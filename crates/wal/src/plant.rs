//! Planted bugs: each switches off one guarantee of the log, so the tests can show that the
//! crash test and the unit tests fail without it (the crash harness's planted-bug catalogue,
//! docs/CRASH.md, in miniature). They exist only in test builds: outside `cfg(test)`,
//! [`on`] is a constant `false` the compiler removes with the code it guards.
//!
//! A plant is switched on per thread, so tests running in parallel do not see each other's.
//! The log's I/O runs on the thread that calls it (the group-commit leader is a caller), so a
//! single-threaded workload sees its own plant everywhere.

/// One planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Plant {
    /// Recovery accepts a record whose checksum fails (a torn record becomes log content).
    SkipChecksum,
    /// Recovery skips a bad record and keeps scanning (records after a torn one come back).
    ScanPastBad,
    /// Recovery ignores epochs (ghosts of an earlier open come back).
    NoEpochCheck,
    /// Recovery ignores where the current epoch starts and only demands epochs that do not
    /// decrease (a record completed from an old one's fragments comes back).
    NoEpochStart,
    /// A read-write open reuses the previous epoch instead of starting a new one.
    NoEpochBump,
    /// `append` ignores the checkpoint: new records overwrite unreleased ones.
    ReuseUnreleased,
    /// `force` writes the log but does not flush the device before returning.
    ForceWithoutFlush,
    /// `set_checkpoint` releases space without flushing its superblock first.
    CheckpointWithoutFlush,
    /// Every superblock write goes to copy 0: a damaged sector loses the only copy.
    OneSuperblockCopy,
}

#[cfg(test)]
thread_local! {
    static ON: std::cell::Cell<Option<Plant>> = const { std::cell::Cell::new(None) };
}

/// Whether `p` is switched on for this thread.
#[cfg(test)]
pub(crate) fn on(p: Plant) -> bool {
    ON.with(|c| c.get() == Some(p))
}

/// Switches `p` on for this thread (`None`: every plant off).
#[cfg(test)]
pub(crate) fn set(p: Option<Plant>) {
    ON.with(|c| c.set(p));
}

/// Outside tests no plant exists.
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn on(_: Plant) -> bool {
    false
}
