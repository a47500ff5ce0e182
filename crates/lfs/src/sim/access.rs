//! The simulator's access patterns (004 §3.5): which file each step overwrites.

use serde::Serialize;

use super::SimError;
use super::rng::Rng;

/// Which file each step overwrites.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Access {
    /// "Each file has equal likelihood of being selected in each step."
    Uniform,
    /// "Files are divided into two groups": `hot_files` of the files receive `hot_writes` of
    /// the writes; within a group each file is equally likely. The paper's pattern is 10% /
    /// 90% ([`Access::HOT_COLD`]); it also tried "95% of accesses to 5% of data".
    HotCold { hot_files: f64, hot_writes: f64 },
}

impl Access {
    /// 004 §3.5's hot-and-cold: 10% of the files receive 90% of the writes.
    pub const HOT_COLD: Access = Access::HotCold {
        hot_files: 0.1,
        hot_writes: 0.9,
    };

    /// `uniform`, or `hot-and-cold 90/10` (percent of writes / percent of files).
    pub fn name(&self) -> String {
        match *self {
            Access::Uniform => "uniform".into(),
            Access::HotCold {
                hot_files,
                hot_writes,
            } => format!("hot-and-cold {}/{}", pct(hot_writes), pct(hot_files)),
        }
    }

    /// A stable number for seeding: runs with the same pattern (and utilization) see the same
    /// sequence of random numbers whatever the policy, so policies are compared on the same
    /// writes wherever their disks agree.
    pub(crate) fn id(&self) -> u64 {
        match *self {
            Access::Uniform => 0,
            Access::HotCold {
                hot_files,
                hot_writes,
            } => {
                1 + ((hot_files * 1e4).round() as u64) * 100_000 + (hot_writes * 1e4).round() as u64
            }
        }
    }
}

fn pct(f: f64) -> String {
    let p = f * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{}", p.round() as i64)
    } else {
        format!("{p:.1}")
    }
}

/// Draws file numbers for one disk. Hot files are numbers `0..hot`, cold ones `hot..files`.
#[derive(Debug, Clone)]
pub(crate) struct Sampler {
    hot: u32,
    cold: u32,
    /// A draw below this picks the hot group: `hot_writes · 2^64`.
    hot_below: u64,
}

impl Sampler {
    pub(crate) fn new(access: Access, files: u32) -> Result<Sampler, SimError> {
        if files == 0 {
            return Err(SimError::Config("the disk holds no files".into()));
        }
        match access {
            Access::Uniform => Ok(Sampler {
                hot: files,
                cold: 0,
                hot_below: u64::MAX,
            }),
            Access::HotCold {
                hot_files,
                hot_writes,
            } => {
                let ok = |f: f64| f.is_finite() && f > 0.0 && f < 1.0;
                // A NaN is in no range, so this refuses it too.
                if !(ok(hot_files) && (0.0..=1.0).contains(&hot_writes)) {
                    return Err(SimError::Config(format!(
                        "hot-and-cold access needs 0 < hot files < 1 and 0 <= hot writes <= 1 \
                         (got {hot_files}, {hot_writes})"
                    )));
                }
                let hot = ((files as f64 * hot_files).round() as u32).clamp(1, files);
                if hot == files {
                    return Err(SimError::Config(format!(
                        "hot-and-cold access over {files} files leaves no cold file"
                    )));
                }
                // `as` saturates, so hot_writes = 1 gives u64::MAX (all but 2^-64 of draws).
                let hot_below = (hot_writes * 18_446_744_073_709_551_616.0) as u64;
                Ok(Sampler {
                    hot,
                    cold: files - hot,
                    hot_below,
                })
            }
        }
    }

    /// Number of hot files (all of them under uniform access).
    #[cfg(test)]
    pub(crate) fn hot_files(&self) -> u32 {
        self.hot
    }

    pub(crate) fn next(&mut self, rng: &mut Rng) -> u32 {
        if self.cold == 0 || rng.next_u64() < self.hot_below {
            rng.below(self.hot)
        } else {
            self.hot + rng.below(self.cold)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_and_cold_splits_files_and_writes() {
        let mut s = Sampler::new(Access::HOT_COLD, 1000).unwrap();
        assert_eq!(s.hot_files(), 100);
        let mut rng = Rng::new(3);
        let n = 100_000;
        let hot = (0..n).filter(|_| s.next(&mut rng) < 100).count();
        let share = hot as f64 / n as f64;
        assert!((share - 0.9).abs() < 0.01, "hot share {share}");
        // Every cold file is reachable.
        let mut seen = vec![false; 1000];
        for _ in 0..200_000 {
            seen[s.next(&mut rng) as usize] = true;
        }
        assert!(seen.iter().all(|&b| b));
    }

    #[test]
    fn uniform_covers_every_file_evenly() {
        let mut s = Sampler::new(Access::Uniform, 10).unwrap();
        let mut rng = Rng::new(5);
        let mut c = [0u32; 10];
        for _ in 0..10_000 {
            c[s.next(&mut rng) as usize] += 1;
        }
        assert!(c.iter().all(|&k| (850..1150).contains(&k)), "{c:?}");
    }

    #[test]
    fn bad_patterns_are_errors() {
        for (f, w) in [
            (0.0, 0.9),
            (1.0, 0.9),
            (0.1, 1.5),
            (f64::NAN, 0.5),
            (0.5, -0.1),
        ] {
            let a = Access::HotCold {
                hot_files: f,
                hot_writes: w,
            };
            assert!(Sampler::new(a, 100).is_err(), "{f} {w}");
        }
        assert!(Sampler::new(Access::Uniform, 0).is_err());
        // One file cannot be split into a hot and a cold group.
        assert!(Sampler::new(Access::HOT_COLD, 1).is_err());
        assert_eq!(Access::HOT_COLD.name(), "hot-and-cold 90/10");
        let a = Access::HotCold {
            hot_files: 0.05,
            hot_writes: 0.95,
        };
        assert_eq!(a.name(), "hot-and-cold 95/5");
        assert_ne!(a.id(), Access::HOT_COLD.id());
    }
}
