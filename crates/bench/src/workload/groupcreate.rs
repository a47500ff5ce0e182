//! Group commit through a real mount (issue 12, "Performance"; 001 §3.2 notes the paper's
//! log "does not support" group commit): N threads, each creating and closing 0-length files
//! in a directory of its own, for N = 1, 2, 4, … 32. In a mode whose calls are durable on
//! return (`cairn-journal`, commit=sync; `cairn-journal-group`, commit=group) every create
//! waits for a log flush; with group commit the creates that wait at once share one. The
//! curve is files/s against N, with the flushes per create on the file system's device and
//! on the journal's own log device (when it has one) as the evidence, and at each N the
//! ratio of a group-commit target to its commit=sync peer run in the same run.
//!
//! The threads must reach the file system together: the harness mounts every cairn target of
//! this workload with as many FUSE threads and io_uring entries as the largest N
//! (`Env::fuse_concurrency`), the same for every mode, so that the daemon, not the mode,
//! never is what serializes the calls.

use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};

use super::{PhaseResult, Stage, measure, scaled_count};
use crate::counters::Counters;
use crate::plot::{self, Figures};
use crate::results::{Meta, Record, Stat};
use crate::units::{fmt_opt, fmt_rate};

/// The workload's name.
pub const NAME: &str = "group-create";
/// Its one phase, repeated per thread count (the phase's `param`).
pub const PHASE: &str = "create";

/// Group-commit targets and the commit=sync target each is compared with (same log
/// placement, same daemon configuration): the issue's "commit=group ≥ 5× commit=sync with the
/// same 16 threads".
pub const PAIRS: &[(&str, &str)] = &[("cairn-journal-group", "cairn-journal")];

/// The thread count the targets are stated at.
pub const HEADLINE_THREADS: u64 = 16;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Thread counts swept, one phase each.
    pub threads: Vec<u64>,
    /// Files created per thread count, split evenly over its threads (each creates at least
    /// `MIN_PER_THREAD`), so every point does about the same work.
    pub files: u64,
}

/// Below this, a thread's creates are too few to overlap with the others'.
const MIN_PER_THREAD: u64 = 4;

impl Config {
    pub fn scaled(scale: f64) -> Config {
        Config {
            threads: vec![1, 2, 4, 8, 16, 32],
            files: scaled_count(4096, scale, 64),
        }
    }

    /// Files each of `n` threads creates.
    pub fn per_thread(&self, n: u64) -> u64 {
        self.files.div_ceil(n.max(1)).max(MIN_PER_THREAD)
    }

    /// The most threads any point runs: what the daemon must serve at once.
    pub fn max_threads(&self) -> usize {
        self.threads.iter().copied().max().unwrap_or(1) as usize
    }

    pub fn describe(&self) -> String {
        let n: Vec<String> = self.threads.iter().map(u64::to_string).collect();
        format!(
            "N = {} threads, each creating and closing 0-length files (O_CREAT|O_EXCL) in a directory of its own, about {} files per N; cairn daemons serve {} requests at once; rate in files/s, device flushes per create on the file system's device and the journal's own log device",
            n.join(", "),
            self.files,
            self.max_threads()
        )
    }
}

/// One point: `n` threads, `k` creates each, started together.
fn create_in_threads(dirs: &[PathBuf], k: u64) -> Result<serde_json::Value> {
    let start = Barrier::new(dirs.len());
    let lat: Vec<Vec<f64>> = std::thread::scope(|sc| {
        let handles: Vec<_> = dirs
            .iter()
            .map(|d| {
                let start = &start;
                sc.spawn(move || -> Result<Vec<f64>> {
                    start.wait();
                    let mut v = Vec::with_capacity(k as usize);
                    for i in 0..k {
                        let p = d.join(format!("f{i:06}"));
                        let t = Instant::now();
                        // Opened and closed: the call a mode makes durable on return.
                        super::create_empty(&p)?;
                        v.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                    Ok(v)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a create thread panicked")))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut all: Vec<f64> = lat.into_iter().flatten().collect();
    all.sort_by(f64::total_cmp);
    let pct = |q: f64| {
        all.get(((all.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
    };
    Ok(serde_json::json!({
        "threads": dirs.len(),
        "files_per_thread": k,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
    }))
}

pub fn run(stage: &mut dyn Stage, c: &Config) -> Result<Vec<PhaseResult>> {
    let root = stage.dir();
    let mut out = Vec::new();
    for &n in &c.threads {
        let n = n.max(1);
        let k = c.per_thread(n);
        // The directories exist before the clock starts: only the creates are measured.
        let dirs: Vec<PathBuf> = (0..n)
            .map(|i| root.join(format!("n{n:02}")).join(format!("t{i:02}")))
            .collect();
        for d in &dirs {
            fs::create_dir_all(d).with_context(|| format!("mkdir {}", d.display()))?;
        }
        let mut r = measure(stage, PHASE, (n * k) as f64, "files", || {
            create_in_threads(&dirs, k)
        })?;
        r.param = Some(n as f64);
        out.push(r);
    }
    Ok(out)
}

/// One target's phases at `n` threads, over its repetitions.
fn points<'a>(records: &'a [Record], target: &str, n: f64) -> Vec<&'a PhaseResult> {
    records
        .iter()
        .filter(|r| r.workload == NAME && r.target == target && r.error.is_none())
        .flat_map(|r| r.phases.iter())
        .filter(|p| p.phase == PHASE && p.param == Some(n))
        .collect()
}

fn median(v: impl Iterator<Item = f64>) -> Option<f64> {
    Stat::of(&v.collect::<Vec<_>>()).map(|s| s.median)
}

/// Median over repetitions of a counter per create.
fn per_create(ps: &[&PhaseResult], f: fn(&Counters) -> Option<f64>) -> Option<f64> {
    median(ps.iter().filter_map(|p| p.per_op(f)))
}

/// Every flush a create caused: the file system device's plus the log device's (when the
/// log has its own; with the log in the image its flushes are among the device's already).
fn flushes_per_create(ps: &[&PhaseResult]) -> Option<f64> {
    median(ps.iter().filter_map(|p| {
        p.per_op(|c| {
            let d = c.device_flushes()?;
            Some(d + c.log_device_flushes().unwrap_or(0.0))
        })
    }))
}

/// The median rate of `target` at `n` threads.
fn rate(records: &[Record], target: &str, n: f64) -> Option<f64> {
    median(points(records, target, n).iter().map(|p| p.rate))
}

/// Group ÷ sync at `n` threads for a group-commit target whose peer ran too.
fn vs_sync(records: &[Record], target: &str, n: f64) -> Option<f64> {
    let (_, peer) = PAIRS.iter().find(|(g, _)| *g == target)?;
    let (g, s) = (rate(records, target, n)?, rate(records, peer, n)?);
    (s > 0.0).then(|| g / s)
}

/// The thread counts any record has, ascending.
fn thread_counts(records: &[Record]) -> Vec<f64> {
    let mut v: Vec<f64> = records
        .iter()
        .filter(|r| r.workload == NAME)
        .flat_map(|r| r.phases.iter().filter_map(|p| p.param))
        .collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// What the terminal shows: the check at 16 threads for each pair that ran, then
/// where the curve is.
pub fn headline(records: &[Record]) -> String {
    let h = HEADLINE_THREADS as f64;
    let mut parts: Vec<String> = PAIRS
        .iter()
        .filter_map(|(g, sync)| {
            let r = vs_sync(records, g, h)?;
            let f = flushes_per_create(&points(records, g, h));
            Some(format!(
                "{HEADLINE_THREADS} threads: {g} ÷ {sync} {r:.2}×, {} flushes/create",
                fmt_opt(f, |v| format!("{v:.3}"))
            ))
        })
        .collect();
    parts.push("per thread count: summary.md and group-create.png".into());
    parts.join("; ")
}

/// The group-create section of summary.md: the curve as a table (files/s, the ratio to the
/// commit=sync peer, flushes and writes per create on each device, latency), the issue's
/// 16-thread check when both sides ran, and the curve as `group-create.png`.
pub fn render(s: &mut String, figures: &Figures, meta: &Meta, records: &[Record]) -> Result<()> {
    let ns = thread_counts(records);
    let _ = writeln!(
        s,
        "Files created per second by N threads at once, each in its own directory; \"÷ sync\" is a group-commit target's rate over its commit=sync peer's at the same N in this run ({}). Flushes and writes per create: the file system's device (\"fs dev\", which holds the log too when it is in the image) and the journal's own log device (\"log dev\", log=dev:PATH only); \"all\" adds them.\n",
        PAIRS
            .iter()
            .map(|(g, s)| format!("{g} ÷ {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        s,
        "| threads | target | files/s | ÷ sync | flushes/create (all) | fs dev flushes/create | log dev flushes/create | fs dev writes/create | log dev writes/create | p50 / p99 ms |"
    );
    let _ = writeln!(s, "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    let mut series = Vec::new();
    for t in &meta.targets {
        let mut se = plot::Series {
            label: t.clone(),
            points: Vec::new(),
            spread: Some(Vec::new()),
        };
        for &n in &ns {
            if let Some(st) = Stat::of(
                &points(records, t, n)
                    .iter()
                    .map(|p| p.rate)
                    .collect::<Vec<_>>(),
            ) {
                se.points.push((n, st.median));
                if let Some(sp) = &mut se.spread {
                    sp.push((n, st.min, st.max));
                }
            }
        }
        if !se.points.is_empty() {
            series.push(se);
        }
    }
    for &n in &ns {
        for t in &meta.targets {
            let ps = points(records, t, n);
            let Some(st) = Stat::of(&ps.iter().map(|p| p.rate).collect::<Vec<_>>()) else {
                continue;
            };
            let lat = |key: &str| median(ps.iter().filter_map(|p| p.extra.get(key)?.as_f64()));
            let per = |f| fmt_opt(per_create(&ps, f), |v| format!("{v:.3}"));
            let spread = if st.min == st.max {
                fmt_rate(st.median)
            } else {
                format!(
                    "{} ({}–{})",
                    fmt_rate(st.median),
                    fmt_rate(st.min),
                    fmt_rate(st.max)
                )
            };
            let _ = writeln!(
                s,
                "| {n} | {t} | {spread} | {} | {} | {} | {} | {} | {} | {} / {} |",
                fmt_opt(vs_sync(records, t, n), |v| format!("{v:.2}")),
                fmt_opt(flushes_per_create(&ps), |v| format!("{v:.3}")),
                per(Counters::device_flushes),
                per(Counters::log_device_flushes),
                per(Counters::device_writes),
                per(Counters::log_device_writes),
                fmt_opt(lat("p50_ms"), |v| format!("{v:.2}")),
                fmt_opt(lat("p99_ms"), |v| format!("{v:.2}")),
            );
        }
    }
    // The check, where this run has both sides of a pair at its thread count.
    let h = HEADLINE_THREADS as f64;
    for (g, sync) in PAIRS {
        if let Some(r) = vs_sync(records, g, h) {
            let f = flushes_per_create(&points(records, g, h));
            let _ = writeln!(
                s,
                "\nAt {HEADLINE_THREADS} threads: {g} ÷ {sync} = **{r:.2}×** (issue 12: ≥ 5×), {} flushes per create (issue 12: < 0.3).",
                fmt_opt(f, |v| format!("{v:.3}"))
            );
        }
    }
    if !series.is_empty() {
        figures.line(
            s,
            "group-create",
            "group-create.png",
            &plot::LinePlot {
                title: "group commit: files/s vs threads creating at once".into(),
                x_label: "threads".into(),
                y_label: "files/s".into(),
                x_log: false,
                y_log: false,
                x_fmt: plot::XFormat::Plain,
                series,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PlainDir;

    #[test]
    fn sizes_scale_and_every_thread_creates_something() {
        let c = Config::scaled(1.0);
        assert_eq!(c.threads, [1, 2, 4, 8, 16, 32]);
        assert_eq!(c.files, 4096);
        assert_eq!(c.per_thread(16), 256);
        assert_eq!(c.per_thread(3), 1366);
        assert_eq!(c.max_threads(), 32);
        let tiny = Config::scaled(0.001);
        assert_eq!(tiny.files, 64);
        assert_eq!(tiny.per_thread(32), MIN_PER_THREAD);
        assert_eq!(tiny.per_thread(0), 64);
    }

    #[test]
    fn runs_in_a_directory_and_creates_every_file() {
        let d = tempfile::tempdir().unwrap();
        let mut st = PlainDir::new(d.path());
        let c = Config {
            threads: vec![1, 4],
            files: 20,
        };
        let r = run(&mut st, &c).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].param, Some(4.0));
        assert_eq!(r[1].ops, 20.0);
        assert_eq!(r[1].label(), "create N=4");
        assert_eq!(r[1].extra["threads"], 4);
        assert!(r[1].extra["p99_ms"].as_f64().unwrap() >= r[1].extra["p50_ms"].as_f64().unwrap());
        let files = |p: &std::path::Path| fs::read_dir(p).unwrap().count();
        assert_eq!(files(&d.path().join("n04")), 4);
        assert_eq!(files(&d.path().join("n04").join("t03")), 5);
        assert_eq!(files(&d.path().join("n01").join("t00")), 20);
        // A create that fails (the file exists) fails the point, not silently.
        assert!(create_in_threads(&[d.path().join("n01").join("t00")], 1).is_err());
    }

    fn phase(n: f64, rate: f64, dev_flushes: f64, log_flushes: Option<f64>) -> PhaseResult {
        let ops = 100.0;
        let mut stats = serde_json::json!({"fs": {"device": {"writes": 2.0 * ops, "flushes": dev_flushes * ops}}});
        if let Some(l) = log_flushes {
            stats["fs"]["strategy"] = serde_json::json!({"log": "dev:/l.img",
                "wal": {"writes": l * ops, "flushes": l * ops}});
        }
        PhaseResult {
            phase: PHASE.into(),
            ops,
            unit: "files".into(),
            secs: ops / rate,
            rate,
            counters: Some(Counters::from_cairn_stats(&stats)),
            param: Some(n),
            extra: serde_json::json!({"threads": n, "p50_ms": 2.0, "p99_ms": 4.5}),
            cold: None,
        }
    }

    fn rec(target: &str, rep: u32, phases: Vec<PhaseResult>) -> Record {
        Record::ran(NAME, target, rep, phases)
    }

    #[test]
    fn the_curve_ratios_and_flushes_per_device_render() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta {
            baseline: "cairn-async".into(),
            targets: vec![
                "cairn-async".into(),
                "cairn-journal".into(),
                "cairn-journal-group".into(),
                "cairn-journal-2sync".into(),
            ],
            workloads: vec![NAME.into()],
            ..Meta::default()
        };
        let records = vec![
            rec(
                "cairn-journal",
                1,
                vec![phase(1.0, 400.0, 1.0, None), phase(16.0, 500.0, 1.0, None)],
            ),
            rec(
                "cairn-journal-group",
                1,
                vec![phase(1.0, 380.0, 1.0, None), phase(16.0, 2800.0, 0.1, None)],
            ),
            rec(
                "cairn-journal-group",
                2,
                vec![phase(1.0, 420.0, 1.0, None), phase(16.0, 3200.0, 0.1, None)],
            ),
            rec(
                "cairn-journal-2sync",
                1,
                vec![phase(16.0, 600.0, 0.02, Some(1.0))],
            ),
        ];
        let mut s = String::new();
        render(&mut s, &Figures::beside(dir.path()), &meta, &records).unwrap();
        assert!(
            s.contains("| 16 | cairn-journal-group | 3,000 (2,800–3,200) | 6.00 | 0.100 | 0.100 | — | 2.000 | — | 2.00 / 4.50 |"),
            "{s}"
        );
        assert!(
            s.contains("| 1 | cairn-journal-group | 400 (380–420) | 1.00 |"),
            "{s}"
        );
        // No peer for these: no ratio. The log device's flushes are its own column, and
        // "all" adds them to the file system device's.
        assert!(
            s.contains("| 16 | cairn-journal | 500 | — | 1.000 | 1.000 | — |"),
            "{s}"
        );
        assert!(
            s.contains(
                "| 16 | cairn-journal-2sync | 600 | — | 1.020 | 0.020 | 1.000 | 2.000 | 1.000 |"
            ),
            "{s}"
        );
        // Targets with no points get no rows; rows go by thread count first.
        assert!(!s.contains("cairn-async"), "{s}");
        assert!(
            s.find("| 1 | cairn-journal |").unwrap() < s.find("| 16 | cairn-journal |").unwrap()
        );
        assert!(
            s.contains("At 16 threads: cairn-journal-group ÷ cairn-journal = **6.00×**"),
            "{s}"
        );
        assert!(s.contains("0.100 flushes per create"), "{s}");
        assert_eq!(
            headline(&records),
            "16 threads: cairn-journal-group ÷ cairn-journal 6.00×, 0.100 flushes/create; per thread count: summary.md and group-create.png"
        );
        assert!(dir.path().join("group-create.png").is_file());
    }

    #[test]
    fn without_the_sync_peer_there_is_no_ratio() {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta {
            targets: vec!["cairn-journal-group".into()],
            workloads: vec![NAME.into()],
            ..Meta::default()
        };
        let records = vec![rec(
            "cairn-journal-group",
            1,
            vec![phase(16.0, 3000.0, 0.1, None)],
        )];
        let mut s = String::new();
        render(&mut s, &Figures::beside(dir.path()), &meta, &records).unwrap();
        assert!(
            s.contains("| 16 | cairn-journal-group | 3,000 | — |"),
            "{s}"
        );
        assert!(!s.contains("At 16 threads"), "{s}");
        assert_eq!(
            headline(&records),
            "per thread count: summary.md and group-create.png"
        );
    }
}
