//! Renames across directories (issue 23): create a small file in one directory, write it,
//! close it and rename it into another; every other file is renamed back. A rename is what
//! soft updates' rule 3 (002 §2: "never reset the old pointer to a live resource before the
//! new pointer has been set") orders: the new name must reach disk before the old one's
//! removal may. The paper does that with dependencies — a few ordered writes batched by the
//! syncer — and the device flushes per file are the evidence that a mode does (a synchronous
//! chain costs flushes per rename; a dependency costs none until write-back).
//!
//! The phase leaves every file in place; they are removed afterwards, outside the timing, so
//! the directory ends empty as every metadata workload leaves it.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{PhaseResult, Stage, measure, scaled_count};

/// The workload's name.
pub const NAME: &str = "rename";
/// Its one timed phase.
pub const PHASE: &str = "create+rename";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Files created, each renamed once (the odd ones twice: there and back).
    pub files: u64,
    /// Bytes written to each file before its rename.
    pub size: usize,
}

impl Config {
    /// 10,000 files of 3 KB at scale 1 (the issue measured 2,000, scale 0.2).
    pub fn scaled(scale: f64) -> Config {
        Config {
            files: scaled_count(10_000, scale, 100),
            size: 3000,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} files of {} B: each created and written in a/, closed, renamed to b/ (every other one renamed back to a/); rate in files/s, device flushes per file",
            self.files, self.size
        )
    }
}

pub fn run(stage: &mut dyn Stage, c: &Config) -> Result<Vec<PhaseResult>> {
    let dir = stage.dir();
    let (a, b) = (dir.join("a"), dir.join("b"));
    for d in [&a, &b] {
        fs::create_dir(d).with_context(|| format!("mkdir {}", d.display()))?;
    }
    let phase = measure(stage, PHASE, c.files as f64, "files", || {
        create_and_rename(&a, &b, c)
    })?;
    for d in [&a, &b] {
        fs::remove_dir_all(d).with_context(|| format!("remove {}", d.display()))?;
    }
    Ok(vec![phase])
}

fn create_and_rename(a: &Path, b: &Path, c: &Config) -> Result<serde_json::Value> {
    let data: Vec<u8> = (0..c.size).map(|k| (k % 251) as u8).collect();
    for i in 0..c.files {
        let name = format!("r{i:07}");
        let (pa, pb) = (a.join(&name), b.join(&name));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&pa)
            .with_context(|| format!("create {}", pa.display()))?;
        f.write_all(&data)
            .with_context(|| format!("write {}", pa.display()))?;
        drop(f);
        fs::rename(&pa, &pb).with_context(|| format!("rename {}", pa.display()))?;
        if i % 2 == 1 {
            fs::rename(&pb, &pa).with_context(|| format!("rename {} back", pb.display()))?;
        }
    }
    Ok(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PlainDir;

    #[test]
    fn renames_every_file_and_leaves_the_directory_empty() {
        let d = tempfile::tempdir().unwrap();
        let mut st = PlainDir::new(d.path());
        let c = Config {
            files: 51,
            size: 3000,
        };
        let r = run(&mut st, &c).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].phase, PHASE);
        assert_eq!(r[0].ops, 51.0);
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_odd_files_come_back() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        create_and_rename(&a, &b, &Config { files: 4, size: 10 }).unwrap();
        let names = |p: &Path| {
            let mut v: Vec<String> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&a), ["r0000001", "r0000003"]);
        assert_eq!(names(&b), ["r0000000", "r0000002"]);
        assert_eq!(fs::read(a.join("r0000001")).unwrap().len(), 10);
    }
}
