//! The segment cleaner (004 §3.3–3.6): its policy half — which segments to clean, when,
//! and how live blocks are grouped. The mechanism (reading segments through their summary
//! blocks, checking liveness against the inode map, rewriting) is the engine's
//! (`engine/clean.rs`) and calls [`policy`] exactly as the simulator does.

pub mod policy;

pub use policy::{
    Grouping, Plan, Policy, SegmentState, SegmentUsage, Selection, ThresholdError, Thresholds,
    UsageTable, UsageVec,
};
