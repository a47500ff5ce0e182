//! The vocabulary a recording's header shares with the checks: a crash state (which writes
//! of which epoch reached the media), the class of what was found in it, and the
//! reproduction a recording of one failure carries ([`Repro`]).
//!
//! It sits on the lowest floor, below [`crate::record`] (whose header stores a [`Repro`]),
//! so that the recording format does not depend on the checks or the report that
//! interpret it. The behaviour lives above: [`crate::states`] cuts and describes states,
//! [`crate::check`] classes them, [`crate::report`] summarizes them.

use serde::{Deserialize, Serialize};

/// A write that tore: only some of its 512-byte sectors landed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Torn {
    /// Index into the epoch's writes (one of the kept ones).
    pub write: u32,
    /// The sectors of the block that landed, ascending.
    pub sectors: Vec<u16>,
}

/// One crash state: epochs before `epoch` durable, plus the `kept` writes of `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CrashState {
    pub epoch: usize,
    /// Indices into the epoch's writes that reached the media, ascending.
    pub kept: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torn: Option<Torn>,
    /// The crash came after the whole recording (every operation had returned).
    #[serde(default)]
    pub at_end: bool,
}

/// What fsck and the walk found in a state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateClass {
    Clean,
    /// Only leaks: allocated but unreferenced blocks or inodes, link counts too high.
    LeakOnly,
    /// A directory caught between the flushes of its rename: both names on disk, or the
    /// new one with `..` still naming the old parent. fsck repairs it. Only while a
    /// directory rename was in flight at the crash point (see docs/CRASH.md).
    InterruptedRename,
    /// Anything else fsck calls corruption, a walk that fails, or a state that cannot be
    /// mounted.
    Corrupt,
}

/// Stored in a reproducer's header: the state, and what was found in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repro {
    pub state: CrashState,
    pub seed: u64,
    pub class: StateClass,
    #[serde(default)]
    pub findings: Vec<String>,
    #[serde(default)]
    pub violations: Vec<String>,
    /// The last operation that had returned and those in flight.
    #[serde(default)]
    pub point: String,
    /// The shortest prefix of the workload's calls that reaches the state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefix: Vec<String>,
}
