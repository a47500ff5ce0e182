//! cairn's log-structured file system, after Sprite LFS (Rosenblum & Ousterhout, *The Design
//! and Implementation of a Log-Structured File System*, ACM TOCS 10(1), 1992 — paper 004).
//!
//! What exists now:
//!
//! - [`cleaner::policy`]: the segment-cleaning policies of 004 §3.4–3.6 — greedy and
//!   cost-benefit selection over a segment usage table, age sort of the live blocks, start
//!   and stop thresholds on clean segments — as pure functions over a small trait;
//! - [`sim`]: the cleaning simulator of 004 §3.5 (a disk of 4 KiB files overwritten under
//!   uniform or hot-and-cold access) and the experiments behind the paper's Figs. 3–7,
//!   driven by `cairn lfs sim`.
//!
//! What comes next (issue 13): the on-disk format (segments with summary blocks, inode map,
//! segment usage table, checkpoints), the engine with roll-forward and the directory
//! operation log, and the real cleaner, which ranks, plans and age-sorts through the same
//! [`cleaner::policy`] functions the simulator uses.

pub mod cleaner;
pub mod sim;
