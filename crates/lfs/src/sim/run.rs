//! One simulation run to steady state (004 §3.5: "In each run the simulator was allowed to
//! run until the write cost stabilized and all cold-start variance had been removed").

use serde::Serialize;

use super::SimError;
use super::access::{Access, Sampler};
use super::disk::{CleanerConfig, Counters, Disk, Geometry};
use super::rng::{self, Rng};

/// How long a run lasts, in *epochs*: one epoch is one disk's capacity of new data
/// (`segments × blocks_per_segment` overwrites), so the log passes over the whole disk about
/// `1 / (1 − u_cleaned)` times per epoch whatever the utilization.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Schedule {
    /// Warm-up lasts at least this many epochs...
    pub min_warmup_epochs: u32,
    /// ...and at most this many; a run that has not settled by then says so
    /// ([`RunResult::steady`]).
    pub max_warmup_epochs: u32,
    /// Steady state: the write costs of the last two windows of this many epochs differ by
    /// at most `tolerance` (relative).
    pub window_epochs: u32,
    pub tolerance: f64,
    /// Epochs measured after warm-up; every number reported comes from these alone.
    pub measure_epochs: u32,
}

/// One run: a disk, a utilization, an access pattern and a policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RunSpec {
    pub geometry: Geometry,
    /// Overall disk capacity utilization: live data / disk capacity (the x axis of Figs. 4
    /// and 7). The disk holds `round(utilization × blocks)` files.
    pub utilization: f64,
    pub access: Access,
    pub cleaner: CleanerConfig,
    pub schedule: Schedule,
    /// The seed of this run's random numbers.
    pub seed: u64,
}

impl RunSpec {
    /// The seed for `access` at `utilization` under the user's `seed`: the policy is left out
    /// on purpose, so every policy sees the same random numbers at the same point.
    pub fn seed_for(seed: u64, access: Access, utilization: f64) -> u64 {
        rng::derive(seed, &[access.id(), (utilization * 1e6).round() as u64])
    }

    pub fn files(&self) -> u32 {
        let n = (self.utilization * self.geometry.blocks() as f64).round();
        if n.is_finite() && n >= 0.0 {
            n.min(f64::from(u32::MAX)) as u32
        } else {
            0
        }
    }
}

/// What a run measured (over the measurement epochs only).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    pub spec: RunSpec,
    pub files: u32,
    /// Write cost (004 eq. 1) over the measurement.
    pub write_cost: f64,
    /// Mean utilization of the non-empty segments cleaned (Table II's "u avg").
    pub cleaned_utilization: f64,
    /// Fraction of the segments cleaned that were empty.
    pub empty_fraction: f64,
    pub counters: Counters,
    pub warmup_epochs: u32,
    /// Whether warm-up ended because the write cost had settled (not at the cap).
    pub steady: bool,
    /// Histograms by live blocks (index `k` = `k` live blocks of `blocks_per_segment`),
    /// kept only when asked for: every dirty segment at each cleaning start (Figs. 5–6), and
    /// the segments cleaned.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub at_cleaning: Vec<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cleaned: Vec<u64>,
}

/// Runs `spec` to steady state and measures it. `histograms` keeps the utilization
/// histograms in the result.
pub fn run(spec: &RunSpec, histograms: bool) -> Result<RunResult, SimError> {
    let s = spec.schedule;
    if s.window_epochs == 0
        || s.measure_epochs == 0
        || s.min_warmup_epochs > s.max_warmup_epochs
        || !(s.tolerance.is_finite() && s.tolerance >= 0.0)
    {
        return Err(SimError::Config(format!(
            "schedule: need window and measurement of at least one epoch, min <= max warm-up \
             and a tolerance >= 0 (got {s:?})"
        )));
    }
    if !(spec.utilization > 0.0 && spec.utilization < 1.0) {
        return Err(SimError::Config(format!(
            "disk utilization must be in (0, 1), got {}",
            spec.utilization
        )));
    }
    let files = spec.files();
    let mut disk = Disk::new(spec.geometry, files, spec.cleaner)?;
    let mut sampler = Sampler::new(spec.access, files)?;
    let mut rng = Rng::new(spec.seed);
    let epoch = spec.geometry.blocks();
    let mut step = |disk: &mut Disk, epochs: u32| -> Result<Counters, SimError> {
        let before = disk.counters();
        for _ in 0..u64::from(epochs) * epoch {
            disk.overwrite(sampler.next(&mut rng))?;
        }
        Ok(disk.counters().since(&before))
    };

    // Warm-up: windows of `window_epochs` until two in a row agree (after the minimum).
    let mut warmup = 0;
    let mut last: Option<f64> = None;
    let mut steady = false;
    while warmup < s.max_warmup_epochs {
        let n = s.window_epochs.min(s.max_warmup_epochs - warmup);
        let wc = step(&mut disk, n)?.write_cost();
        warmup += n;
        let settled = last.is_some_and(|p| (wc - p).abs() <= s.tolerance * p);
        if settled && warmup >= s.min_warmup_epochs {
            steady = true;
            break;
        }
        last = Some(wc);
    }

    disk.reset_histograms();
    let c = step(&mut disk, s.measure_epochs)?;
    let bps = spec.geometry.blocks_per_segment;
    let cleaned = disk.cleaned();
    let nonempty: u64 = cleaned[1..].iter().sum();
    let live: u64 = cleaned.iter().enumerate().map(|(k, &n)| k as u64 * n).sum();
    Ok(RunResult {
        spec: *spec,
        files,
        write_cost: c.write_cost(),
        cleaned_utilization: if nonempty == 0 {
            0.0
        } else {
            live as f64 / (nonempty as f64 * f64::from(bps))
        },
        empty_fraction: if c.segments_cleaned == 0 {
            0.0
        } else {
            c.empty_cleaned as f64 / c.segments_cleaned as f64
        },
        counters: c,
        warmup_epochs: warmup,
        steady,
        at_cleaning: if histograms {
            disk.at_cleaning().to_vec()
        } else {
            Vec::new()
        },
        cleaned: if histograms {
            disk.cleaned().to_vec()
        } else {
            Vec::new()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cleaner::policy::{Policy, Thresholds};
    use crate::sim::disk::SegmentAge;

    fn spec(u: f64, schedule: Schedule) -> RunSpec {
        RunSpec {
            geometry: Geometry {
                segments: 32,
                blocks_per_segment: 16,
            },
            utilization: u,
            access: Access::HOT_COLD,
            cleaner: CleanerConfig {
                policy: Policy::COST_BENEFIT,
                thresholds: Thresholds::new(1, 2).unwrap(),
                age: SegmentAge::LastWrite,
            },
            schedule,
            seed: 7,
        }
    }

    const SHORT: Schedule = Schedule {
        min_warmup_epochs: 2,
        max_warmup_epochs: 6,
        window_epochs: 2,
        tolerance: 0.05,
        measure_epochs: 2,
    };

    #[test]
    fn a_run_measures_only_after_warm_up() {
        println!("seed {}", spec(0.6, SHORT).seed);
        let r = run(&spec(0.6, SHORT), true).unwrap();
        assert_eq!(r.files, 307);
        // Exactly the measured epochs' worth of new data.
        assert_eq!(r.counters.new_blocks, 2 * 32 * 16);
        assert!(r.write_cost > 1.0 && r.write_cost.is_finite());
        assert!((2..=6).contains(&r.warmup_epochs));
        assert_eq!(r.at_cleaning.len(), 17);
        assert_eq!(r.cleaned.iter().sum::<u64>(), r.counters.segments_cleaned);
        assert!(run(&spec(0.6, SHORT), false).unwrap().cleaned.is_empty());
        // Deterministic.
        assert_eq!(run(&spec(0.6, SHORT), true).unwrap(), r);
    }

    #[test]
    fn bad_runs_are_errors_not_panics() {
        for u in [0.0, 1.0, -0.5, f64::NAN, 0.99] {
            assert!(run(&spec(u, SHORT), false).is_err(), "u = {u}");
        }
        for s in [
            Schedule {
                window_epochs: 0,
                ..SHORT
            },
            Schedule {
                measure_epochs: 0,
                ..SHORT
            },
            Schedule {
                min_warmup_epochs: 9,
                ..SHORT
            },
            Schedule {
                tolerance: f64::NAN,
                ..SHORT
            },
        ] {
            assert!(run(&spec(0.5, s), false).is_err(), "{s:?}");
        }
    }

    #[test]
    fn seeds_depend_on_pattern_and_point_not_policy() {
        let a = RunSpec::seed_for(1, Access::HOT_COLD, 0.75);
        assert_eq!(a, RunSpec::seed_for(1, Access::HOT_COLD, 0.75));
        assert_ne!(a, RunSpec::seed_for(1, Access::Uniform, 0.75));
        assert_ne!(a, RunSpec::seed_for(1, Access::HOT_COLD, 0.8));
        assert_ne!(a, RunSpec::seed_for(2, Access::HOT_COLD, 0.75));
    }
}
