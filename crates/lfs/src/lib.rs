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
mod sequencer;
pub mod sim;

#[cfg(any(test, feature = "planted"))]
pub use engine::Planted;
pub use engine::{INLINE_BACKGROUND_KEY, INLINE_PASSES, Lfs, MountOptions};
pub use mkfs::{MkfsOptions, mkfs, mkfs_device};

use cairn_vfs::options::OptionSpec;

/// The format's mount options, as `cairn help mount` shows them: [`MountOptions::set`]
/// parses each (the tests hold the two together, and the defaults to
/// `MountOptions::default()`).
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        key: "mode",
        values: "lfs",
        default: "lfs",
        help: "the format's only mode",
    },
    OptionSpec {
        key: "cache",
        values: "SIZE",
        default: "256M",
        help: "bytes of log blocks kept for reads (K, M, G suffixes; at least 4K)",
    },
    OptionSpec {
        key: "checkpoint_interval",
        values: "SECS",
        default: "30",
        help: "seconds between checkpoints: roll-forward at mount reads the log written since the last one",
    },
    OptionSpec {
        key: "checkpoint_mb",
        values: "MiB",
        default: "64",
        help: "a checkpoint also after this much log written",
    },
    OptionSpec {
        key: "cleaner",
        values: "greedy|greedy+age-sort|cost-benefit|cost-benefit+age-sort",
        default: "cost-benefit+age-sort",
        help: "the segment cleaner's policy (004 §3.4–3.6): which segments to clean, and whether live blocks are sorted by age",
    },
    OptionSpec {
        key: "clean_start",
        values: "SEGMENTS",
        default: "",
        help: "the cleaner starts when fewer segments are clean; by default a tenth of the segments, 2 to 20 (a fiftieth, up to 100, beyond 1,000 segments)",
    },
    OptionSpec {
        key: "clean_stop",
        values: "SEGMENTS",
        default: "",
        help: "the cleaner stops once this many are clean; by default the start plus a fiftieth of the segments (2 to 100)",
    },
    OptionSpec {
        key: "readahead_kb",
        values: "KiB",
        default: "0",
        help: "the engine's own read-ahead window (0: off; the kernel's read-ahead already sends large reads)",
    },
];

#[cfg(test)]
mod options_tests {
    use super::*;

    /// Every listed option parses with its default, and the defaults are the engine's.
    #[test]
    fn the_listed_options_are_the_parsed_ones() {
        let mut set = MountOptions::default();
        for o in OPTIONS {
            let v = (!o.default.is_empty()).then_some(o.default);
            let v = v.or(match o.values {
                "SEGMENTS" => Some("4"),
                _ => None,
            });
            set.set(o.key, v)
                .unwrap_or_else(|e| panic!("listed option {}: {e}", o.key));
        }
        let d = MountOptions::default();
        assert_eq!(set.cache_bytes, d.cache_bytes);
        assert_eq!(set.checkpoint_interval, d.checkpoint_interval);
        assert_eq!(set.checkpoint_bytes, d.checkpoint_bytes);
        assert_eq!(set.cleaner, d.cleaner);
        assert_eq!(set.readahead_blocks, d.readahead_blocks);
        assert!(MountOptions::default().set("no_such_option", None).is_err());
    }

    /// Sizes go through the shared parser (`cairn_vfs::parse_size`).
    #[test]
    fn cache_sizes_use_the_shared_parser() {
        let mut o = MountOptions::default();
        o.set("cache", Some("1.5M")).unwrap();
        assert_eq!(o.cache_bytes, 3 << 19);
        o.set("cache", Some("64KiB")).unwrap();
        assert_eq!(o.cache_bytes, 64 << 10);
        assert!(o.set("cache", Some("3")).is_err());
        assert!(o.set("cache", Some("lots")).is_err());
        assert!(o.set("cache", None).is_err());
    }
}
