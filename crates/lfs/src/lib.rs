//! cairn's log-structured file system, after Sprite LFS (Rosenblum & Ousterhout, *The Design
//! and Implementation of a Log-Structured File System*, ACM TOCS 10(1), 1992 — paper 004).
//!
//! - [`format`]: the on-disk structures of 004 Table I, byte by byte (docs/FORMAT.md);
//! - [`mkfs()`], [`Lfs::mount`] and the engine implementing `cairn_vfs::FileSystem`:
//!   everything (data, directories, inodes, inode map, usage table) is buffered and written
//!   sequentially in the log, a checkpoint every 30 s, after a configurable amount of data
//!   and at unmount, roll-forward from the last checkpoint at mount (004 §4), and the
//!   segment cleaner's mechanism (004 §3.3), which plans through [`cleaner::policy`];
//! - [`check`]: the consistency check `cairn fsck` runs on LFS images;
//! - [`cleaner::policy`]: the segment-cleaning policies of 004 §3.4–3.6 — greedy and
//!   cost-benefit selection over a segment usage table, age sort of the live blocks, start
//!   and stop thresholds on clean segments — as pure functions over a small trait;
//! - [`sim`]: the cleaning simulator of 004 §3.5 (a disk of 4 KiB files overwritten under
//!   uniform or hot-and-cold access) and the experiments behind the paper's Figs. 3–7,
//!   driven by `cairn lfs sim`.

pub mod check;
pub mod cleaner;
mod engine;
pub mod format;
pub mod fuzz;
pub mod inspect;
mod log;
mod mkfs;
pub mod sim;

#[cfg(any(test, feature = "planted"))]
pub use engine::Planted;
pub use engine::{Lfs, MountOptions};
pub use mkfs::{MkfsOptions, mkfs, mkfs_device};
