//! The paper's experiments (004 §3.5, Figs. 4–7) as one suite of runs, plus the ablations
//! that explain them: degree of locality, segments cleaned per pass, and what a segment's age
//! is measured from.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

use super::SimError;
use super::access::Access;
use super::disk::{CleanerConfig, Geometry, SegmentAge};
use super::run::{self, RunResult, RunSpec, Schedule};
use crate::cleaner::policy::{Policy, Thresholds};

/// The parameters of a suite: the disk, the cleaner's thresholds, how long runs last, which
/// utilizations are swept.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suite {
    /// `full` or `quick`.
    pub name: String,
    pub geometry: Geometry,
    pub thresholds: Thresholds,
    pub age: SegmentAge,
    pub schedule: Schedule,
    /// The x axis of Figs. 4 and 7.
    pub utilizations: Vec<f64>,
    /// Where the distributions of Figs. 5 and 6 are taken (75% in the paper).
    pub distribution_at: f64,
    /// Bins of the reported distributions over `[0, 1]`.
    pub bins: usize,
    /// Locality ablation at `distribution_at` (004 §3.5: "We tried varying the degree of
    /// locality (e.g., 95% of accesses to 5% of data)").
    pub localities: Vec<Access>,
    /// Stop thresholds of the batch ablation at `distribution_at` (004 §3.4 question 2, and
    /// §5.2: "we have not yet carefully analyzed the policy issue of how many segments to
    /// clean at a time").
    pub batch_stops: Vec<u32>,
    /// Utilizations of the segment-age ablation (cost-benefit under both [`SegmentAge`]s).
    pub age_utilizations: Vec<f64>,
}

impl Suite {
    /// The run behind docs/bench/history.md: a 1 GiB disk of 1 MiB segments (Sprite LFS's
    /// segment size in 004 §5.1: 256 blocks of 4 KiB), utilization 10%–90% in steps of 5%.
    pub fn full() -> Suite {
        Suite {
            name: "full".into(),
            geometry: Geometry {
                segments: 1024,
                blocks_per_segment: 256,
            },
            thresholds: paper_thresholds(),
            age: SegmentAge::LastWrite,
            schedule: Schedule {
                min_warmup_epochs: 10,
                max_warmup_epochs: 100,
                window_epochs: 5,
                tolerance: 0.01,
                measure_epochs: 20,
            },
            utilizations: (2..=18).map(|k| f64::from(k) * 0.05).collect(),
            distribution_at: 0.75,
            bins: 32,
            localities: localities(),
            batch_stops: vec![2, 8, 32],
            age_utilizations: vec![0.75, 0.9],
        }
    }

    /// Seconds, not minutes: 128 segments of 64 blocks (32 MiB), fewer points and epochs.
    /// What CI runs; the paper's shapes already show.
    pub fn quick() -> Suite {
        Suite {
            name: "quick".into(),
            geometry: Geometry {
                segments: 128,
                blocks_per_segment: 64,
            },
            thresholds: paper_thresholds(),
            age: SegmentAge::LastWrite,
            schedule: Schedule {
                min_warmup_epochs: 8,
                max_warmup_epochs: 40,
                window_epochs: 4,
                tolerance: 0.02,
                measure_epochs: 10,
            },
            utilizations: vec![0.1, 0.2, 0.4, 0.6, 0.75, 0.85, 0.9],
            distribution_at: 0.75,
            bins: 32,
            localities: localities(),
            batch_stops: vec![2, 8, 24],
            age_utilizations: vec![0.75, 0.9],
        }
    }

    fn cleaner(&self, policy: Policy) -> CleanerConfig {
        CleanerConfig {
            policy,
            thresholds: self.thresholds,
            age: self.age,
        }
    }

    fn spec(&self, seed: u64, access: Access, cleaner: CleanerConfig, u: f64) -> RunSpec {
        RunSpec {
            geometry: self.geometry,
            utilization: u,
            access,
            cleaner,
            schedule: self.schedule,
            seed: RunSpec::seed_for(seed, access, u),
        }
    }
}

/// The simulator of 004 §3.5 "runs until all clean segments are exhausted, then simulates
/// the actions of a cleaner until a threshold number of clean segments is available again":
/// start below 1 clean segment; stop at 2, a small threshold (the paper gives none). The
/// batch ablation shows why small: the more segments a pass cleans, the better greedy does
/// under hot-and-cold, and the paper's Fig. 4 result disappears.
fn paper_thresholds() -> Thresholds {
    Thresholds::new(1, 2).unwrap_or_else(|_| unreachable!("1 <= 1 <= 2"))
}

fn localities() -> Vec<Access> {
    vec![
        Access::HotCold {
            hot_files: 0.2,
            hot_writes: 0.8,
        },
        Access::HOT_COLD,
        Access::HotCold {
            hot_files: 0.05,
            hot_writes: 0.95,
        },
    ]
}

/// One curve of Figs. 4 and 7: an access pattern and a policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CurveSpec {
    pub key: &'static str,
    pub label: &'static str,
    pub access: Access,
    pub policy: Policy,
    /// Which of the paper's curves this is, if any.
    pub paper: Option<&'static str>,
}

pub const GREEDY_UNIFORM: &str = "greedy-uniform";
pub const GREEDY_UNIFORM_AGE_SORT: &str = "greedy-uniform-age-sort";
pub const GREEDY_HOT_COLD_AGE_SORT: &str = "greedy-hot-cold-age-sort";
pub const GREEDY_HOT_COLD: &str = "greedy-hot-cold";
pub const COST_BENEFIT_HOT_COLD_AGE_SORT: &str = "cost-benefit-hot-cold-age-sort";
pub const COST_BENEFIT_HOT_COLD: &str = "cost-benefit-hot-cold";

/// The curves, in the order tables and plots show them.
pub fn curves() -> Vec<CurveSpec> {
    vec![
        CurveSpec {
            key: GREEDY_UNIFORM,
            label: "greedy, uniform",
            access: Access::Uniform,
            policy: Policy::GREEDY,
            paper: Some("LFS uniform (Fig. 4)"),
        },
        CurveSpec {
            key: GREEDY_UNIFORM_AGE_SORT,
            label: "greedy + age sort, uniform",
            access: Access::Uniform,
            policy: Policy::GREEDY_AGE_SORT,
            paper: None,
        },
        CurveSpec {
            key: GREEDY_HOT_COLD_AGE_SORT,
            label: "greedy + age sort, hot-and-cold",
            access: Access::HOT_COLD,
            policy: Policy::GREEDY_AGE_SORT,
            paper: Some("LFS hot-and-cold (Figs. 4, 7)"),
        },
        CurveSpec {
            key: GREEDY_HOT_COLD,
            label: "greedy, hot-and-cold",
            access: Access::HOT_COLD,
            policy: Policy::GREEDY,
            paper: None,
        },
        CurveSpec {
            key: COST_BENEFIT_HOT_COLD_AGE_SORT,
            label: "cost-benefit + age sort, hot-and-cold",
            access: Access::HOT_COLD,
            policy: Policy::COST_BENEFIT,
            paper: Some("LFS cost-benefit (Figs. 6, 7)"),
        },
        CurveSpec {
            key: COST_BENEFIT_HOT_COLD,
            label: "cost-benefit, hot-and-cold",
            access: Access::HOT_COLD,
            policy: Policy::COST_BENEFIT_IN_ORDER,
            paper: None,
        },
    ]
}

/// A curve's runs, one per utilization of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Curve {
    pub spec: CurveSpec,
    pub points: Vec<RunResult>,
}

impl Curve {
    /// The run at utilization `u`, if the sweep has it.
    pub fn at(&self, u: f64) -> Option<&RunResult> {
        self.points
            .iter()
            .find(|p| (p.spec.utilization - u).abs() < 1e-9)
    }
}

/// One run of an ablation, with what distinguishes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Variant {
    pub label: String,
    pub result: RunResult,
}

/// Everything a suite measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub seed: u64,
    pub suite: Suite,
    pub curves: Vec<Curve>,
    pub localities: Vec<Variant>,
    pub batches: Vec<Variant>,
    pub ages: Vec<Variant>,
}

impl Report {
    pub fn curve(&self, key: &str) -> Option<&Curve> {
        self.curves.iter().find(|c| c.spec.key == key)
    }
}

/// A finished run, for progress output.
pub struct Progress<'a> {
    pub done: usize,
    pub total: usize,
    pub label: &'a str,
    pub result: &'a RunResult,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    /// The curve's index; its points arrive in utilization order (jobs are in that order).
    Curve(usize),
    Locality,
    Batch,
    Age,
}

struct Job {
    slot: Slot,
    label: String,
    spec: RunSpec,
    histograms: bool,
}

fn jobs(suite: &Suite, curves: &[CurveSpec], seed: u64) -> Result<Vec<Job>, SimError> {
    let mut jobs = Vec::new();
    let at = suite.distribution_at;
    for (ci, c) in curves.iter().enumerate() {
        for &u in &suite.utilizations {
            jobs.push(Job {
                slot: Slot::Curve(ci),
                label: format!("{} at {:.0}%", c.label, u * 100.0),
                spec: suite.spec(seed, c.access, suite.cleaner(c.policy), u),
                histograms: (u - at).abs() < 1e-9,
            });
        }
    }
    for &access in &suite.localities {
        for policy in [Policy::GREEDY_AGE_SORT, Policy::COST_BENEFIT] {
            jobs.push(Job {
                slot: Slot::Locality,
                label: format!("{}, {}", policy.name(), access.name()),
                spec: suite.spec(seed, access, suite.cleaner(policy), at),
                histograms: false,
            });
        }
    }
    for &stop in &suite.batch_stops {
        for (access, policy) in [
            (Access::Uniform, Policy::GREEDY),
            (Access::HOT_COLD, Policy::GREEDY_AGE_SORT),
            (Access::HOT_COLD, Policy::COST_BENEFIT),
        ] {
            let mut cleaner = suite.cleaner(policy);
            cleaner.thresholds = Thresholds::new(suite.thresholds.start_below(), stop)?;
            jobs.push(Job {
                slot: Slot::Batch,
                label: format!(
                    "{}, {}, clean until {stop} clean",
                    policy.name(),
                    access.name()
                ),
                spec: suite.spec(seed, access, cleaner, at),
                histograms: false,
            });
        }
    }
    for &u in &suite.age_utilizations {
        for policy in [Policy::COST_BENEFIT, Policy::COST_BENEFIT_IN_ORDER] {
            for age in [SegmentAge::LastWrite, SegmentAge::YoungestBlock] {
                let mut cleaner = suite.cleaner(policy);
                cleaner.age = age;
                jobs.push(Job {
                    slot: Slot::Age,
                    label: format!(
                        "{}, age from {}, {:.0}%",
                        policy.name(),
                        age.name(),
                        u * 100.0
                    ),
                    spec: suite.spec(seed, Access::HOT_COLD, cleaner, u),
                    histograms: false,
                });
            }
        }
    }
    Ok(jobs)
}

/// Runs every experiment of `suite` on `threads` threads (at least one). The results do not
/// depend on the number of threads: each run has its own seed.
pub fn run_suite(
    suite: &Suite,
    seed: u64,
    threads: usize,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<Report, SimError> {
    run_suite_with(suite, &curves(), seed, threads, progress)
}

/// [`run_suite`] over other curves than the paper's (tests use it to run deliberately wrong
/// policies under the paper's curve names and check that the paper's claims then fail).
pub fn run_suite_with(
    suite: &Suite,
    curves: &[CurveSpec],
    seed: u64,
    threads: usize,
    progress: &(dyn Fn(&Progress) + Sync),
) -> Result<Report, SimError> {
    let jobs = jobs(suite, curves, seed)?;
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<RunResult, SimError>>>> =
        Mutex::new(vec![None; jobs.len()]);
    // Longest first would balance better, but the order is fine for 2 threads: the sweep
    // interleaves cheap and expensive utilizations.
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let r = run::run(&job.spec, job.histograms);
                    if let Ok(res) = &r {
                        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                        progress(&Progress {
                            done: d,
                            total: jobs.len(),
                            label: &job.label,
                            result: res,
                        });
                    }
                    let failed = r.is_err();
                    if let Ok(mut v) = results.lock() {
                        v[i] = Some(r);
                    }
                    if failed {
                        // Stop handing out work; the error is reported below.
                        next.store(jobs.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| SimError::Config("a simulation thread panicked".into()))?;

    let mut report = Report {
        seed,
        suite: suite.clone(),
        curves: curves
            .iter()
            .map(|&spec| Curve {
                spec,
                points: Vec::new(),
            })
            .collect(),
        localities: Vec::new(),
        batches: Vec::new(),
        ages: Vec::new(),
    };
    for (job, r) in jobs.into_iter().zip(results) {
        let Some(r) = r else {
            // Not run because an earlier run failed; that error comes first in job order.
            continue;
        };
        let result = r?;
        let variant = |result| Variant {
            label: job.label.clone(),
            result,
        };
        match job.slot {
            Slot::Curve(ci) => report.curves[ci].points.push(result),
            Slot::Locality => report.localities.push(variant(result)),
            Slot::Batch => report.batches.push(variant(result)),
            Slot::Age => report.ages.push(variant(result)),
        }
    }
    if report
        .curves
        .iter()
        .any(|c| c.points.len() != suite.utilizations.len())
    {
        return Err(SimError::Config("a simulation run did not finish".into()));
    }
    Ok(report)
}

/// `levels[k]` counts segments with `k` live blocks of `levels.len() − 1`; the result is the
/// fraction of all counted segments in each of `bins` equal bins over utilization `[0, 1]`
/// (a full segment falls in the last bin). All zeros when nothing was counted.
pub fn binned(levels: &[u64], bins: usize) -> Vec<f64> {
    let bins = bins.max(1);
    let mut out = vec![0.0; bins];
    let total: u64 = levels.iter().sum();
    let max = levels.len().saturating_sub(1).max(1);
    if total == 0 {
        return out;
    }
    for (k, &n) in levels.iter().enumerate() {
        out[(k * bins / max).min(bins - 1)] += n as f64 / total as f64;
    }
    out
}

/// The centre of bin `i` of `bins` over `[0, 1]`.
pub fn bin_centre(i: usize, bins: usize) -> f64 {
    (i as f64 + 0.5) / bins.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binned_fractions_sum_to_one() {
        let levels = [1, 0, 2, 0, 1]; // 4 blocks per segment: u = 0, .5, 1
        assert_eq!(binned(&levels, 2), vec![0.25, 0.75]);
        assert_eq!(binned(&levels, 4), vec![0.25, 0.0, 0.5, 0.25]);
        assert_eq!(binned(&[0, 0], 3), vec![0.0; 3]);
        assert_eq!(binned(&[], 0), vec![0.0]);
        assert!((bin_centre(0, 4) - 0.125).abs() < 1e-12);
    }
}
