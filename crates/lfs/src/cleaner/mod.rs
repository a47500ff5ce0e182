//! The segment cleaner (004 §3.3–3.6): [`policy`] — which segments to clean, when, and how
//! live blocks are grouped, as pure functions the simulator runs too — and `clean`, the
//! mechanism on the mounted engine: reading segments through their summary blocks,
//! checking liveness against the inode map, rewriting the live blocks at the log head, and
//! the thresholds that start and stop it.

pub(crate) mod clean;
pub mod policy;

pub use clean::CleanerStats;

pub use policy::{
    Grouping, Plan, Policy, SegmentState, SegmentUsage, Selection, ThresholdError, Thresholds,
    UsageTable, UsageVec,
};
