//! cairn bench: the papers' evaluations (000/001 §4–5, 002 §4, 003 §4, 004 §5) run on real
//! file systems — cairn in every mode, kernel ext4/ext2/xfs, fuse2fs, a FUSE passthrough and
//! mergerfs — with raw JSON per run, Markdown tables normalized as the papers normalize, the
//! papers' published numbers beside ours, and PNG plots. See docs/BENCHMARKS.md.
//!
//! Layers inside the crate, bottom up: `sys` (processes, mounts, CPU placement) and `counters`
//! (device and FUSE counts) → `scratch` (a locked directory of its own per run) → `target` (a
//! fresh file system per target, workload and repetition) → `workload` (what runs in
//! it) → `report`/`published`/`plot` (what the numbers mean; `device`: the papers' tables
//! on a disk model beside this machine's device) → `cli`.

pub mod cli;
pub mod counters;
pub mod device;
pub mod plot;
pub mod published;
pub mod registry;
pub mod report;
pub mod scratch;
pub mod sys;
pub mod tables;
pub mod target;
pub mod workload;

pub use cli::{Cli, Cmd, main_with};
