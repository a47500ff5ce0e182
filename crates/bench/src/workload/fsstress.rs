//! fsstress (xfstests' `ltp/fsstress`) as a benchmark (issue 23): a fixed seed's mix of
//! creates, writes, truncates, renames, links, directory operations, fsync and fdatasync from
//! several processes at once — the mixed workload on which soft updates once made about one
//! device flush per FUSE request. The rate is fsstress operations per second over the whole
//! run; the evidence is the counters per operation (device flushes, FUSE requests, and on
//! soft updates its flushes by cause, `fs.strategy.flushes.*`).
//!
//! fsstress is not reimplemented: its operation mix *is* the benchmark. The binary comes from
//! `FSSTRESS` (a path), else from the fstests build `make fstests` keeps under
//! [`FSTESTS_CACHE`]; without either the workload says how to get one.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::{PhaseResult, Stage, measure, scaled_count};

/// The workload's name.
pub const NAME: &str = "fsstress";
/// Its one timed phase.
pub const PHASE: &str = "run";
/// Where `make fstests` (scripts/fstests/run.sh) unpacks and builds the suite.
pub const FSTESTS_CACHE: &str = "/var/cache/cairn-fstests";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// `-s`: the seed, so every run does the same operations.
    pub seed: u64,
    /// `-n`: operations per process.
    pub ops: u64,
    /// `-p`: processes.
    pub procs: u64,
}

impl Config {
    /// Issue 23's run at scale 1: `-s 7 -n 3000 -p 4`.
    pub fn scaled(scale: f64) -> Config {
        Config {
            seed: 7,
            ops: scaled_count(3000, scale, 50),
            procs: 4,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "xfstests' fsstress -s {} -n {} -p {} (a fixed mix of creates, writes, truncates, renames, links, directory operations, fsync) in an empty directory; rate in fsstress operations/s over the whole run, device flushes and FUSE requests per operation",
            self.seed, self.ops, self.procs
        )
    }

    /// The arguments after the binary.
    fn args(&self, dir: &Path) -> Vec<String> {
        vec![
            "-s".into(),
            self.seed.to_string(),
            "-n".into(),
            self.ops.to_string(),
            "-p".into(),
            self.procs.to_string(),
            "-d".into(),
            dir.display().to_string(),
        ]
    }
}

/// The fsstress binary: `FSSTRESS`, else the newest fstests build under `cache`.
pub fn find(env: Option<&str>, cache: &Path) -> Result<PathBuf> {
    if let Some(p) = env.filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("FSSTRESS={} is not a file", p.display());
        }
        return Ok(p);
    }
    let newest = std::fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("ltp").join("fsstress"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .max();
    match newest {
        Some((_, p)) => Ok(p),
        None => bail!(
            "no fsstress: set FSSTRESS to xfstests' ltp/fsstress, or run `make fstests` once (it builds the suite under {})",
            cache.display()
        ),
    }
}

fn binary() -> Result<PathBuf> {
    find(
        std::env::var("FSSTRESS").ok().as_deref(),
        Path::new(FSTESTS_CACHE),
    )
}

/// Checked once before the first repetition, so a missing binary is one message, not an error
/// per record.
pub fn prepare() -> Result<()> {
    binary().map(|_| ())
}

pub fn run(stage: &mut dyn Stage, c: &Config) -> Result<Vec<PhaseResult>> {
    let bin = binary()?;
    let dir = stage.dir().join("fsstress");
    std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    let ops = (c.ops * c.procs) as f64;
    let phase = measure(stage, PHASE, ops, "ops", || {
        let out = Command::new(&bin)
            .args(c.args(&dir))
            .output()
            .with_context(|| format!("run {}", bin.display()))?;
        if !out.status.success() {
            bail!(
                "{} {}: {}; {}",
                bin.display(),
                c.args(&dir).join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(serde_json::json!({ "fsstress": bin.display().to_string() }))
    })?;
    Ok(vec![phase])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_one_is_the_issues_run() {
        let c = Config::scaled(1.0);
        assert_eq!((c.seed, c.ops, c.procs), (7, 3000, 4));
        assert_eq!(c.args(Path::new("/d")).join(" "), "-s 7 -n 3000 -p 4 -d /d");
    }

    #[test]
    fn the_binary_comes_from_the_variable_then_the_newest_build() {
        let d = tempfile::tempdir().unwrap();
        let err = find(None, d.path()).unwrap_err().to_string();
        assert!(err.contains("make fstests"), "{err}");
        for (name, age) in [("old", 100), ("new", 0)] {
            let ltp = d.path().join(name).join("ltp");
            std::fs::create_dir_all(&ltp).unwrap();
            let f = std::fs::File::create(ltp.join("fsstress")).unwrap();
            let t = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            f.set_modified(t).unwrap();
        }
        let got = find(None, d.path()).unwrap();
        assert!(got.starts_with(d.path().join("new")), "{}", got.display());
        let explicit = d.path().join("old/ltp/fsstress");
        let got = find(Some(explicit.to_str().unwrap()), d.path()).unwrap();
        assert_eq!(got, explicit);
        assert!(find(Some("/nonexistent/fsstress"), d.path()).is_err());
    }
}
