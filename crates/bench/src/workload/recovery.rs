//! Recovery time (002 §5 Table III, 004 §5.3 Table III): after a crash with recent activity,
//! how long until the file system is mounted and usable again, and how long a full consistency
//! check takes — once on a nearly empty file system and once on a nearly full one, because a
//! scan-based recovery (FFS fsck) grows with what is on disk while a log replay or a soft
//! updates mount does not.
//!
//! The crash is a SIGKILL of a FUSE daemon or FS_IOC_SHUTDOWN of a kernel file system (see
//! `Mounted::crash`); recovery is what the target's administrator must run (`Mounted::recover`).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use super::{PhaseResult, Stage, scaled_count};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Files created right before the crash (the "recent activity"), 4 KiB each, no fsync.
    pub recent_files: u64,
    /// Small files in the nearly-full state (they give a scan inodes and directories to walk).
    pub fill_files: u64,
    pub fill_file_size: u64,
    /// Files per directory in the fill.
    pub per_dir: u64,
    /// Fraction of the file system's capacity in use before the second crash; what the small
    /// files leave is filled with large files.
    pub fill_fraction: f64,
    pub large_file_size: u64,
}

impl Config {
    pub fn paper() -> Config {
        Config::scaled(1.0)
    }

    pub fn scaled(scale: f64) -> Config {
        Config {
            recent_files: scaled_count(1000, scale, 20),
            fill_files: scaled_count(50_000, scale, 200),
            fill_file_size: 16 << 10,
            per_dir: 100,
            fill_fraction: 0.85,
            large_file_size: 64 << 20,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "crash (SIGKILL of the FUSE daemon / FS_IOC_SHUTDOWN of a kernel fs) after {} new 4 KiB files, then the target's recovery procedure until the root answers ('recover'), then a full read-only check ('fsck'); on an empty file system and after filling {:.0}% of it ({} files of {} KiB plus {} MiB files); times in s",
            self.recent_files,
            self.fill_fraction * 100.0,
            self.fill_files,
            self.fill_file_size >> 10,
            self.large_file_size >> 20
        )
    }
}

pub(super) fn write_file(path: &Path, len: u64, tag: u64) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    let mut buf = vec![(tag % 251) as u8; (len.min(1 << 20)) as usize];
    let mut left = len;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        buf[..8.min(k)].copy_from_slice(&tag.to_le_bytes()[..8.min(k)]);
        f.write_all(&buf[..k])
            .with_context(|| format!("write {}", path.display()))?;
        left -= k as u64;
    }
    Ok(())
}

/// Recent activity the crash interrupts: new files that may or may not survive.
fn recent_activity(dir: &Path, round: &str, n: u64) -> Result<()> {
    let d = dir.join(format!("recent-{round}"));
    fs::create_dir_all(&d)?;
    for i in 0..n {
        write_file(&d.join(format!("r{i:06}")), 4096, i)?;
    }
    Ok(())
}

/// Fills the file system: `cfg.fill_files` small files, then large files until
/// `cfg.fill_fraction` of the capacity is used (stopping quietly at ENOSPC).
fn fill(stage: &mut dyn Stage, cfg: &Config) -> Result<(u64, u64)> {
    let dir = stage.dir().join("fill");
    let mut files = 0;
    let mut bytes = 0;
    for i in 0..cfg.fill_files {
        let d = dir.join(format!("d{:05}", i / cfg.per_dir.max(1)));
        if i % cfg.per_dir.max(1) == 0 {
            fs::create_dir_all(&d)?;
        }
        write_file(&d.join(format!("f{i:07}")), cfg.fill_file_size, i)?;
        files += 1;
        bytes += cfg.fill_file_size;
    }
    let big = dir.join("large");
    fs::create_dir_all(&big)?;
    let mut k = 0u64;
    loop {
        let (free, total) = stage.space()?;
        let used = total.saturating_sub(free) as f64;
        if used >= cfg.fill_fraction * total as f64 || free < 2 * cfg.large_file_size {
            break;
        }
        match write_file(&big.join(format!("L{k:05}")), cfg.large_file_size, k) {
            Ok(()) => {}
            Err(e) if format!("{e:#}").contains("No space left") => break,
            Err(e) => return Err(e),
        }
        files += 1;
        bytes += cfg.large_file_size;
        k += 1;
    }
    Ok((files, bytes))
}

pub(super) fn timed(
    phase: &str,
    f: impl FnOnce() -> Result<serde_json::Value>,
) -> Result<PhaseResult> {
    let t0 = Instant::now();
    let extra = f()?;
    let secs = t0.elapsed().as_secs_f64();
    Ok(PhaseResult {
        phase: phase.into(),
        ops: 1.0,
        unit: "s".into(),
        secs,
        rate: 1.0 / secs.max(1e-9),
        // Counters come from the mounted file system, which does not exist across a crash.
        counters: None,
        param: None,
        extra,
        cold: None,
    })
}

/// One crash-and-recover round on the file system as it is now: `<state> recover`, then
/// `<state> fsck`.
fn round(stage: &mut dyn Stage, cfg: &Config, state: &str) -> Result<Vec<PhaseResult>> {
    recent_activity(&stage.dir(), state, cfg.recent_files)?;
    stage.crash()?;
    let recover = timed(&format!("{state} recover"), || {
        let procedure = stage.recover()?;
        Ok(serde_json::json!({ "procedure": procedure }))
    })?;
    let fsck = timed(&format!("{state} fsck"), || {
        stage.fsck()?;
        Ok(serde_json::Value::Null)
    })?;
    Ok(vec![recover, fsck])
}

pub fn run(stage: &mut dyn Stage, cfg: &Config) -> Result<Vec<PhaseResult>> {
    ensure!(cfg.per_dir > 0, "recovery: per_dir must be positive");
    let mut out = round(stage, cfg, "empty")?;
    let t0 = Instant::now();
    let (files, bytes) = fill(stage, cfg)?;
    let (free, total) = stage.space()?;
    let fill_secs = t0.elapsed().as_secs_f64();
    let mut full = round(stage, cfg, "full")?;
    for p in &mut full {
        p.extra = serde_json::json!({
            "procedure": p.extra.get("procedure").cloned().unwrap_or_default(),
            "fill_files": files,
            "fill_bytes": bytes,
            "used_fraction": 1.0 - free as f64 / total.max(1) as f64,
            "fill_secs": fill_secs,
        });
    }
    out.extend(full);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_counts() {
        let p = Config::paper();
        assert_eq!(p.recent_files, 1000);
        assert_eq!(p.fill_files, 50_000);
        assert_eq!(Config::scaled(1.0), p);
        let q = Config::scaled(0.001);
        assert_eq!(q.recent_files, 20);
        assert_eq!(q.fill_files, 200);
        assert!(q.describe().contains("20 new 4 KiB files"));
    }

    #[test]
    fn a_plain_directory_cannot_crash() {
        let d = tempfile::tempdir().unwrap();
        let mut st = super::super::PlainDir::new(d.path());
        let e = run(&mut st, &Config::scaled(0.001)).unwrap_err();
        assert!(format!("{e:#}").contains("crash"), "{e:#}");
    }

    #[test]
    fn write_file_writes_exact_lengths() {
        let d = tempfile::tempdir().unwrap();
        for (i, len) in [0u64, 5, 4096, (1 << 20) + 3].into_iter().enumerate() {
            let p = d.path().join(format!("f{i}"));
            write_file(&p, len, 7).unwrap();
            assert_eq!(fs::metadata(&p).unwrap().len(), len);
        }
        assert!(write_file(&d.path().join("f0"), 1, 1).is_err());
    }
}
