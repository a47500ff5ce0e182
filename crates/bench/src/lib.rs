//! cairn bench: the papers' evaluations (000/001 §4–5, 002 §4, 003 §4, 004 §5) run on real
//! file systems — cairn in every mode, kernel ext4/ext2/xfs, fuse2fs, a FUSE passthrough and
//! mergerfs — with raw JSON per run, Markdown tables normalized as the papers normalize, the
//! papers' published numbers beside ours, and PNG plots. See docs/BENCHMARKS.md.
//!
//! Floors inside the crate, bottom up (a module imports only from floors below it): `sys`
//! (processes, mounts, CPU placement), `units` (how numbers read), `plot`, `published` →
//! `counters` (device and FUSE counts), `registry` (the modes `cairn modes --json` lists),
//! `scratch` (a locked directory of its own per run) → `target` (a fresh file system per
//! target, workload and repetition) → `results` (what a run leaves on disk) → `workload`
//! (what runs in it) → `device` (the papers' tables on a disk model beside this machine's
//! device) → `tables` → `report` (what the numbers mean) → `page` (docs/BENCHMARKS.md from
//! one archived run) → `cli`.

pub mod cli;
pub mod counters;
pub mod device;
pub mod lfs_sim;
pub mod page;
pub mod plot;
pub mod published;
pub mod registry;
pub mod report;
pub mod results;
pub mod scratch;
pub mod sys;
pub mod tables;
pub mod target;
pub mod units;
pub mod wal;
pub mod workload;

pub use cli::{Cli, Cmd, main_with};
