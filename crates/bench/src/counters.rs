//! I/O counters taken before and after each phase. Counts are the benchmark's stable evidence:
//! seconds on a shared 2-core machine are noisy, but "2.0 device flushes per create" is not.
//!
//! Two sources: a cairn mount reports its own counters (`cairn stats MNT --json`: device
//! reads/writes/flushes, FUSE requests per opcode); a kernel file system on a loop device is
//! counted by the block layer (`/sys/block/loopN/stat`). Both are flattened to
//! `dotted.path -> number` so that deltas and per-operation figures need no schema.
//!
//! A journal with its log on a device of its own (`log=dev:PATH`, 001's LFFS-wafs-2*) does
//! I/O that the file system's device counters do not see: the log service counts its own
//! writes and flushes (`fs.strategy.wal` in `cairn stats`), and when `fs.strategy.log` says
//! the log is on another device those become the `log_device.*` counters, reported beside
//! the file system device's. With the log inside the image (`log=file`) its I/O already is
//! part of `fs.device`, and no `log_device.*` counters exist, so nothing is counted twice.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::sys;

/// Prefix of the counters of a journal's own log device.
pub const LOG_DEVICE: &str = "log_device";

/// Flattened numeric counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters(pub BTreeMap<String, f64>);

impl Counters {
    /// Flattens every numeric leaf of a JSON document to `a.b.c` keys (array items by index).
    pub fn from_json(v: &serde_json::Value) -> Counters {
        fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, f64>) {
            let key = |k: &str| {
                if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}.{k}")
                }
            };
            match v {
                serde_json::Value::Number(n) => {
                    if let Some(f) = n.as_f64() {
                        out.insert(prefix.to_string(), f);
                    }
                }
                serde_json::Value::Object(m) => m.iter().for_each(|(k, v)| walk(&key(k), v, out)),
                serde_json::Value::Array(a) => a
                    .iter()
                    .enumerate()
                    .for_each(|(i, v)| walk(&key(&i.to_string()), v, out)),
                _ => {}
            }
        }
        let mut out = BTreeMap::new();
        walk("", v, &mut out);
        Counters(out)
    }

    /// `after - self` for every key present in `after` (a key that appeared counts from 0).
    pub fn delta(&self, after: &Counters) -> Counters {
        Counters(
            after
                .0
                .iter()
                .map(|(k, v)| (k.clone(), v - self.0.get(k).copied().unwrap_or(0.0)))
                .collect(),
        )
    }

    /// The first key, in preference order, that is present.
    fn first(&self, keys: &[&str]) -> Option<f64> {
        keys.iter().find_map(|k| self.0.get(*k).copied())
    }

    /// A `cairn stats --json` document, flattened, plus the `log_device.*` counters when the
    /// journal's log is on a device of its own (see the module doc).
    pub fn from_cairn_stats(v: &serde_json::Value) -> Counters {
        let mut c = Counters::from_json(v);
        let strategy = &v["fs"]["strategy"];
        let own_device = strategy["log"]
            .as_str()
            .is_some_and(|l| l.starts_with("dev:") || l == "device");
        if own_device {
            for key in ["writes", "flushes", "bytes_written"] {
                if let Some(n) = strategy["wal"][key].as_f64() {
                    c.0.insert(format!("{LOG_DEVICE}.{key}"), n);
                }
            }
        }
        c
    }

    /// Writes to the journal's own log device (none when the log is in the file system's
    /// device, or there is no journal).
    pub fn log_device_writes(&self) -> Option<f64> {
        self.0.get(&format!("{LOG_DEVICE}.writes")).copied()
    }

    /// Flushes of the journal's own log device (see [`Counters::log_device_writes`]).
    pub fn log_device_flushes(&self) -> Option<f64> {
        self.0.get(&format!("{LOG_DEVICE}.flushes")).copied()
    }

    /// Device write requests (not bytes).
    pub fn device_writes(&self) -> Option<f64> {
        self.first(&[
            "fs.device.writes",
            "device.writes",
            "device.write_ops",
            "dev.writes",
            "writes",
        ])
        .or_else(|| {
            self.find_leaf(|segs| {
                segs.last() == Some(&"writes") && segs.iter().any(|s| s.contains("dev"))
            })
        })
    }

    /// Device flushes (durability barriers).
    pub fn device_flushes(&self) -> Option<f64> {
        self.first(&[
            "fs.device.flushes",
            "device.flushes",
            "dev.flushes",
            "flushes",
        ])
        .or_else(|| {
            self.find_leaf(|segs| {
                segs.last() == Some(&"flushes") && segs.iter().any(|s| s.contains("dev"))
            })
        })
    }

    /// Blocks the buffer cache evicted (`cairn stats`: `fs.cache.evictions`); None for a
    /// target without cairn's buffer cache (the kernel's file systems, the FUSE floor).
    pub fn cache_evictions(&self) -> Option<f64> {
        self.0.get("fs.cache.evictions").copied()
    }

    pub fn device_reads(&self) -> Option<f64> {
        self.first(&[
            "fs.device.reads",
            "device.reads",
            "device.read_ops",
            "dev.reads",
            "reads",
        ])
        .or_else(|| {
            self.find_leaf(|segs| {
                segs.last() == Some(&"reads") && segs.iter().any(|s| s.contains("dev"))
            })
        })
    }

    /// FUSE requests the kernel sent, all opcodes together. Prefers an explicit total; else sums
    /// the per-opcode counts found under a `fuse…` object (skipping byte and time figures).
    pub fn fuse_requests(&self) -> Option<f64> {
        if let Some(t) = self.first(&[
            "fuse.total",
            "fuse.requests.total",
            "fuse_requests.total",
            "fuse.requests_total",
        ]) {
            return Some(t);
        }
        let mut sum = None;
        for (k, v) in &self.0 {
            let segs: Vec<&str> = k.split('.').collect();
            let under_fuse = segs.len() >= 2 && segs[0].starts_with("fuse");
            let last = *segs.last().unwrap_or(&"");
            let is_count = !["bytes", "ns", "us", "time", "latency", "total"]
                .iter()
                .any(|w| last.contains(w));
            if under_fuse && is_count {
                *sum.get_or_insert(0.0) += v;
            }
        }
        sum
    }

    /// Bytes written to the device.
    pub fn device_write_bytes(&self) -> Option<f64> {
        self.first(&["fs.device.bytes_written", "device.write_bytes"])
    }

    /// Bytes read from the device.
    pub fn device_read_bytes(&self) -> Option<f64> {
        self.first(&["fs.device.bytes_read", "device.read_bytes"])
    }

    /// Nanoseconds the file system's modeled disk was busy (`cairn stats`' `fs.disk`; a
    /// journal's own log disk is `fs.strategy.log_disk`: see [`Counters::disk_busy_ns_max`]).
    pub fn disk_busy_ns(&self) -> Option<f64> {
        self.0.get("fs.disk.busy_ns").copied()
    }

    /// The busy time of whichever modeled disk was busier: the file system's or the
    /// journal's own log disk (a two-disk system is as busy as its busier disk).
    pub fn disk_busy_ns_max(&self) -> Option<f64> {
        let fs = self.disk_busy_ns()?;
        Some(fs.max(self.log_disk("busy_ns").unwrap_or(0.0)))
    }

    /// Requests that moved the arm, on every modeled disk (the file system's and a journal's
    /// own log disk).
    pub fn disk_seeks(&self) -> Option<f64> {
        Some(self.0.get("fs.disk.seeks").copied()? + self.log_disk("seeks").unwrap_or(0.0))
    }

    /// Revolutions waited for sectors to come round, on every modeled disk.
    pub fn disk_rotations(&self) -> Option<f64> {
        Some(self.0.get("fs.disk.rotations").copied()? + self.log_disk("rotations").unwrap_or(0.0))
    }

    /// A counter of a journal's own log disk.
    fn log_disk(&self, key: &str) -> Option<f64> {
        self.0.get(&format!("fs.strategy.log_disk.{key}")).copied()
    }

    /// Milliseconds the block device was busy (requests in flight), when it is one.
    pub fn busy_ms(&self) -> Option<f64> {
        self.first(&["device.busy_ms", "block.device.busy_ms"])
    }

    /// The first counter whose key satisfies `pred`, never a `log_device.*` one: the log
    /// device is not the file system's device (its name only happens to contain "dev").
    fn find_leaf(&self, pred: impl Fn(&[&str]) -> bool) -> Option<f64> {
        self.0.iter().find_map(|(k, v)| {
            let segs: Vec<&str> = k.split('.').collect();
            (segs.first() != Some(&LOG_DEVICE) && pred(&segs)).then_some(*v)
        })
    }
}

/// Where a mounted target's counters come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// `cairn stats MNT --json` of a cairn mount, plus the block layer's counters of the loop
    /// device under it (under `block.`), if it sits on one.
    Cairn {
        cairn: String,
        mnt: std::path::PathBuf,
        /// The loop device under the mount, e.g. `/dev/loop3`.
        block: Option<String>,
    },
    /// The block layer's counters for a device, e.g. `/dev/loop3`.
    Block { dev: String },
}

impl Source {
    pub fn read(&self) -> Result<Counters> {
        match self {
            Source::Cairn { cairn, mnt, block } => {
                let out = sys::run(Command::new(cairn).arg("stats").arg(mnt).arg("--json"))?;
                let v: serde_json::Value = serde_json::from_str(&out).with_context(|| {
                    format!("`{cairn} stats --json` printed no JSON: {out:.200}")
                })?;
                let mut c = Counters::from_cairn_stats(&v);
                if let Some(dev) = block {
                    for (k, v) in block_counters(dev)?.0 {
                        c.0.insert(format!("block.{k}"), v);
                    }
                }
                Ok(c)
            }
            Source::Block { dev } => block_counters(dev),
        }
    }
}

/// The block layer's counters of a device, from `/sys/block/<name>/stat`.
fn block_counters(dev: &str) -> Result<Counters> {
    let name = Path::new(dev)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(dev);
    let text = std::fs::read_to_string(format!("/sys/block/{name}/stat"))
        .with_context(|| format!("reading block stats of {dev}"))?;
    parse_block_stat(&text)
}

/// `/sys/block/X/stat` (Documentation/block/stat.rst): 17 fields on current kernels; the
/// flush count (field 16) is missing before Linux 5.5, and then flushes are unknown.
pub fn parse_block_stat(text: &str) -> Result<Counters> {
    let f: Vec<f64> = text
        .split_whitespace()
        .map(|x| x.parse::<f64>())
        .collect::<Result<_, _>>()
        .context("bad block stat")?;
    anyhow::ensure!(
        f.len() >= 11,
        "block stat has {} fields, expected at least 11",
        f.len()
    );
    let mut m = BTreeMap::new();
    m.insert("device.reads".into(), f[0]);
    m.insert("device.read_bytes".into(), f[2] * 512.0);
    m.insert("device.writes".into(), f[4]);
    m.insert("device.write_bytes".into(), f[6] * 512.0);
    // io_ticks: milliseconds the device had requests in flight (its busy time, 004 §5.1).
    m.insert("device.busy_ms".into(), f[9]);
    if f.len() >= 17 {
        m.insert("device.flushes".into(), f[15]);
    }
    Ok(Counters(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flatten_and_delta() {
        let a = Counters::from_json(
            &serde_json::json!({"device": {"writes": 10, "flushes": 2}, "fuse": {"create": 1, "unlink": 0}}),
        );
        let b = Counters::from_json(
            &serde_json::json!({"device": {"writes": 25, "flushes": 7}, "fuse": {"create": 11, "unlink": 10, "lookup": 3}, "name": "x"}),
        );
        let d = a.delta(&b);
        assert_eq!(d.device_writes(), Some(15.0));
        assert_eq!(d.device_flushes(), Some(5.0));
        assert_eq!(d.fuse_requests(), Some(23.0));
        assert!(!d.0.contains_key("name"));
    }

    #[test]
    fn fuse_total_preferred_and_bytes_skipped() {
        let c = Counters::from_json(
            &serde_json::json!({"fuse": {"total": 7, "ops": {"write": 3, "write_bytes": 4096}}}),
        );
        assert_eq!(c.fuse_requests(), Some(7.0));
        let c = Counters::from_json(
            &serde_json::json!({"fuse": {"ops": {"write": 3, "write_bytes": 4096, "read_ns": 9}}}),
        );
        assert_eq!(c.fuse_requests(), Some(3.0));
        assert_eq!(Counters::default().fuse_requests(), None);
    }

    #[test]
    fn cairn_stats_shape() {
        let c = Counters::from_json(&serde_json::json!({
            "fs": {"device": {"reads": 3, "writes": 10, "flushes": 1, "bytes_written": 40960}, "cache": {"hit_rate": 0.5}},
            "fuse": {"total": 20, "requests": {"lookup": 4, "create": 16}},
            "daemon": {"uptime_secs": 2.0, "image": "/x.img"},
        }));
        assert_eq!(c.device_reads(), Some(3.0));
        assert_eq!(c.device_writes(), Some(10.0));
        assert_eq!(c.device_flushes(), Some(1.0));
        assert_eq!(c.fuse_requests(), Some(20.0));
    }

    /// The log on a device of its own is counted apart from the file system's device; the
    /// log in the image (log=file) is already in the device's counts and gets no second count.
    #[test]
    fn log_device_counted_only_when_the_log_has_its_own_device() {
        let stats = |log: &str, wal_flushes: u64| {
            serde_json::json!({
                "fs": {
                    "device": {"writes": 10, "flushes": 4},
                    "strategy": {"commit": "sync", "log": log,
                                 "wal": {"writes": 7, "flushes": wal_flushes, "bytes_written": 28672,
                                         "appends": 9, "group_sizes": [1, 0]}},
                },
                "fuse": {"total": 3},
            })
        };
        let before = Counters::from_cairn_stats(&stats("dev:/x/log.img", 2));
        let after = Counters::from_cairn_stats(&stats("dev:/x/log.img", 5));
        assert_eq!(after.log_device_writes(), Some(7.0));
        assert_eq!(after.log_device_flushes(), Some(5.0));
        assert_eq!(after.0["log_device.bytes_written"], 28672.0);
        assert_eq!(before.delta(&after).log_device_flushes(), Some(3.0));
        // The file system's device stays the file system's device.
        assert_eq!(after.device_writes(), Some(10.0));
        assert_eq!(after.device_flushes(), Some(4.0));
        let given = Counters::from_cairn_stats(&stats("device", 1));
        assert_eq!(given.log_device_flushes(), Some(1.0));
        // log=file: the log's writes are among fs.device's already.
        let file = Counters::from_cairn_stats(&stats("file", 5));
        assert_eq!(file.log_device_writes(), None);
        assert_eq!(file.log_device_flushes(), None);
        assert_eq!(file.device_flushes(), Some(4.0));
        // Not a journal: nothing.
        let plain =
            Counters::from_cairn_stats(&serde_json::json!({"fs": {"device": {"writes": 1}}}));
        assert_eq!(plain.log_device_writes(), None);
        // The search for a device counter by shape never takes the log device's.
        let only_log =
            Counters::from_json(&serde_json::json!({"log_device": {"writes": 3, "flushes": 2}}));
        assert_eq!(only_log.device_writes(), None);
        assert_eq!(only_log.device_flushes(), None);
    }

    /// A disk model's counters: the file system's disk, a journal's own log disk added to
    /// seeks and rotations, busy time the busier of the two.
    #[test]
    fn disk_model_counters() {
        let c = Counters::from_cairn_stats(&serde_json::json!({
            "fs": {"disk": {"busy_ns": 7, "seeks": 3, "rotations": 1.5},
                   "strategy": {"log": "dev:/l", "log_disk": {"busy_ns": 9, "seeks": 1, "rotations": 0.5}}},
        }));
        assert_eq!(c.disk_busy_ns(), Some(7.0));
        assert_eq!(c.disk_busy_ns_max(), Some(9.0));
        assert_eq!(c.disk_seeks(), Some(4.0));
        assert_eq!(c.disk_rotations(), Some(2.0));
        let none = Counters::from_json(&serde_json::json!({"fs": {"disk": null}}));
        assert_eq!((none.disk_busy_ns(), none.disk_seeks()), (None, None));
    }

    #[test]
    fn nested_device_keys_are_found() {
        let c = Counters::from_json(
            &serde_json::json!({"devices": {"0": {"writes": 4, "flushes": 1}}}),
        );
        assert_eq!(c.device_writes(), Some(4.0));
        assert_eq!(c.device_flushes(), Some(1.0));
    }

    #[test]
    fn block_stat_fields() {
        let c = parse_block_stat("   58051     7958  4241722    33743    10463    15793  1338648     3183        0     6808    37258     4092       25   236248      293     1028       38\n").unwrap();
        assert_eq!(c.device_reads(), Some(58051.0));
        assert_eq!(c.device_writes(), Some(10463.0));
        assert_eq!(c.device_flushes(), Some(1028.0));
        assert_eq!(c.0["device.write_bytes"], 1338648.0 * 512.0);
        let old = parse_block_stat("1 2 3 4 5 6 7 8 9 10 11").unwrap();
        assert_eq!(old.device_flushes(), None);
        assert!(parse_block_stat("1 2 x").is_err());
    }
}
