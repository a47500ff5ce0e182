//! The cleaning simulator of 004 §3.5, and the experiments behind Figs. 3–7.
//!
//! "The simulator models a file system as a fixed number of 4-kbyte files, with the number
//! chosen to produce a particular overall disk capacity utilization. At each step, the
//! simulator overwrites one of the files with new data" under a uniform or hot-and-cold
//! access pattern; "the overall disk capacity utilization is constant and no read traffic
//! is modeled. The simulator runs until all clean segments are exhausted, then simulates the
//! actions of a cleaner until a threshold number of clean segments is available again."
//!
//! - [`disk`]: the simulated disk — a log of segments, one 4 KiB file per block — and its
//!   cleaner, which selects, orders and rewrites through [`crate::cleaner::policy`];
//! - [`access`]: uniform and hot-and-cold access;
//! - [`run`]: one run to steady state, measured;
//! - [`suite`]: the paper's experiments (every curve of Figs. 4 and 7 over disk utilization
//!   10–90%, the distributions of Figs. 5–6 at 75%) and ablations, in parallel;
//! - [`paper`]: the paper's reference curves and claims, checked against a run;
//! - [`markdown`]: the report `cairn lfs sim` writes.
//!
//! Everything is deterministic given a seed ([`rng`]): the same seed gives the same numbers
//! on every machine and any number of threads.

pub mod access;
pub mod disk;
pub mod markdown;
pub mod paper;
pub mod real;
pub mod rng;
pub mod run;
pub mod suite;

pub use access::Access;
pub use disk::{CleanerConfig, Counters, Disk, Geometry, SegmentAge};
pub use run::{RunResult, RunSpec, Schedule};
pub use suite::{Report, Suite, run_suite};

/// Why a simulation cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Thresholds(#[from] crate::cleaner::policy::ThresholdError),
    #[error("no clean segment left for the log: {files} files on {blocks} blocks")]
    NoCleanSegment { files: u32, blocks: u64 },
}
