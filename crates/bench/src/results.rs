//! What a run leaves on disk: one JSON record per target × workload × repetition (each
//! phase's [`PhaseResult`]), the run's [`Meta`], and the statistics every table takes of
//! them. It sits above `target` and below `workload`: a workload returns phase results, a
//! table reads records, and neither needs the other to say what a result is.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::counters::Counters;
use crate::units::fmt_size;

/// One timed phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseResult {
    pub phase: String,
    /// Operations done (files, transactions or MiB, see `unit`).
    pub ops: f64,
    pub unit: String,
    pub secs: f64,
    /// `ops / secs`.
    pub rate: f64,
    /// Counter deltas over the phase, if the target has counters.
    pub counters: Option<Counters>,
    /// The swept parameter this phase belongs to, if the workload sweeps one (micro: file
    /// size in bytes; SDET: script concurrency). Tables and plots group by it.
    #[serde(default)]
    pub param: Option<f64>,
    #[serde(default)]
    pub extra: serde_json::Value,
    /// How the phase was made cold, where a cold phase here means something a reader could
    /// not assume ([`crate::workload::Stage::cold_by`]: the FUSE floor's kernel caches
    /// dropped under a live daemon); None for a phase measured warm or made cold as every
    /// cache between reader and device emptied. Tables and the page say it beside the number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold: Option<String>,
}

impl PhaseResult {
    /// The phase's name in tables: the phase plus its swept parameter, if any
    /// ("create 64K", "scripts N=4").
    pub fn label(&self) -> String {
        match self.param {
            None => self.phase.clone(),
            // A concurrency sweep: SDET's scripts, group-create's threads.
            Some(n)
                if self.unit == "scripts"
                    || self.extra.get("threads").and_then(|t| t.as_f64()) == Some(n) =>
            {
                format!("{} N={n}", self.phase)
            }
            Some(b) => format!("{} {}", self.phase, fmt_size(b)),
        }
    }

    /// The share of the phase a modeled disk was busy (the busier one, when a journal's log
    /// has a disk of its own): 004 §5.1's "disk busy". None off the model.
    pub fn disk_busy(&self) -> Option<f64> {
        let ns = self.counters.as_ref()?.disk_busy_ns_max()?;
        (self.secs > 0.0).then(|| ns / 1e9 / self.secs)
    }

    /// Counter per operation, e.g. device flushes per create+unlink pair.
    pub fn per_op(&self, f: impl Fn(&Counters) -> Option<f64>) -> Option<f64> {
        let c = self.counters.as_ref()?;
        (self.ops > 0.0)
            .then(|| f(c))
            .flatten()
            .map(|v| v / self.ops)
    }
}

/// The device's raw flush rate, measured the way a file system's flush costs: 4 KiB written
/// and `fdatasync`ed in a loop, on a file in `dir` (put it on the disk the images live on).
/// `overwrite` rewrites blocks already allocated (a pure device cache flush); `append` grows a
/// file, so the host file system must also commit its own metadata each time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FlushRate {
    pub overwrite_per_sec: f64,
    pub append_per_sec: f64,
    /// Upper bound on iterations per variant (each also stops after its time budget).
    pub max_iterations: u64,
    pub dir: PathBuf,
    pub host_fs: String,
}

/// One target × workload × repetition.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub target: String,
    pub workload: String,
    pub description: String,
    pub rep: u32,
    /// The error that stopped this repetition, if any (then `phases` is empty).
    pub error: Option<String>,
    pub phases: Vec<PhaseResult>,
    /// Facts about the mount, e.g. the FUSE daemon's CPU placement.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The machine's 1-minute load average when the repetition started (None in runs made
    /// before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_avg: Option<f64>,
    /// Phases (or the whole workload) that ran unmeasured or not at all on this target, and
    /// why: the FUSE floor's cold reads. Tables say "not measured: WHY" where their number
    /// would be.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
}

/// A phase the target could not measure as the workload means it, or (`phase` None) a
/// workload it could not run at all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// The phase's label (`PhaseResult::label`), None for the whole workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    pub why: String,
}

impl Skipped {
    /// Whether this skip is the reason `label` has no number.
    pub fn covers(&self, label: &str) -> bool {
        self.phase.as_deref().is_none_or(|p| p == label)
    }
}

impl Record {
    /// A repetition that ran `phases` of `workload` on `target` (the tests' records).
    #[cfg(test)]
    pub(crate) fn ran(workload: &str, target: &str, rep: u32, phases: Vec<PhaseResult>) -> Record {
        Record {
            target: target.into(),
            workload: workload.into(),
            description: String::new(),
            rep,
            error: None,
            phases,
            notes: Vec::new(),
            load_avg: None,
            skipped: Vec::new(),
        }
    }
}

/// The run as a whole.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    pub started: String,
    pub kernel: String,
    pub cpu_model: String,
    /// CPUs the benchmark (and so every daemon it starts) may run on; `pinned` = asked for.
    pub cpus: Vec<usize>,
    pub pinned: bool,
    pub reps: u32,
    /// Repetitions each workload ran (the paper suite repeats only the short ones).
    #[serde(default)]
    pub reps_per_workload: BTreeMap<String, u32>,
    pub image_size: u64,
    pub scratch: String,
    pub scratch_fs: String,
    pub baseline: String,
    /// Target order for tables.
    pub targets: Vec<String>,
    /// Workload order for tables.
    pub workloads: Vec<String>,
    /// Targets that were asked for but could not run, with the reason.
    pub skipped: BTreeMap<String, String>,
    pub flush_rate: Option<FlushRate>,
    pub tool_versions: BTreeMap<String, String>,
    pub command: String,
    /// Suite name ("paper", "quick"), scale factor of every workload, netnews' own factor.
    #[serde(default)]
    pub suite: String,
    #[serde(default)]
    pub scale: f64,
    #[serde(default)]
    pub netnews_scale: f64,
    /// The commit of cairn's source the benchmark was built from, when the build knew it
    /// (older runs recorded `git describe` output here).
    #[serde(default)]
    pub commit: Option<String>,
    /// Whether tracked files had uncommitted changes when the benchmark was built.
    #[serde(default)]
    pub dirty: Option<bool>,
    /// `--device MODEL`: cairn's targets ran on this disk model too (`TARGET:MODEL`).
    #[serde(default)]
    pub device: Option<String>,
    /// CPUs the machine has online (a load average means little without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online_cpus: Option<usize>,
}

/// The target `target`'s rates are normalized to: the run's baseline on the same device (a
/// target on a disk model to the baseline on that model).
pub fn baseline_for(meta: &Meta, target: &str) -> String {
    match crate::target::split_disk(target).1 {
        Some(model) => crate::target::on_disk(&meta.baseline, model),
        None => meta.baseline.clone(),
    }
}

pub fn write_json(path: &Path, v: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(v)?;
    fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Reads a run directory back: its meta.json and every record file.
pub fn load(dir: &Path) -> Result<(Meta, Vec<Record>)> {
    let meta: Meta = serde_json::from_str(
        &fs::read_to_string(dir.join("meta.json")).context("reading meta.json")?,
    )?;
    let mut records = Vec::new();
    let mut names: Vec<_> = fs::read_dir(dir)?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for n in names {
        let n = n.to_string_lossy();
        if n.starts_with("rec-") && n.ends_with(".json") {
            let text = fs::read_to_string(dir.join(&*n))?;
            records.push(serde_json::from_str(&text).with_context(|| format!("parsing {n}"))?);
        }
    }
    Ok((meta, records))
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stat {
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub n: usize,
}

impl Stat {
    pub fn of(values: &[f64]) -> Option<Stat> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stat {
            min: v[0],
            median,
            max: v[n - 1],
            n,
        })
    }
}
