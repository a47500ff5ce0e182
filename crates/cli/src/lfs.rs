//! `cairn lfs`: the log-structured file system (crates/lfs). For now `cairn lfs sim`, the
//! cleaning simulator of 004 §3.5: the experiments of Figs. 4–7 as Markdown and JSON tables
//! and PNG plots beside the paper's reference curves, then the same policies on the real
//! file system with the simulator's prediction beside the measured write cost.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use cairn_bench::plot::{self, LinePlot, Series, XFormat};
use cairn_lfs::sim::paper::{self, FFS_IMPROVED, FFS_TODAY, no_variance};
use cairn_lfs::sim::suite::{self, Progress};
use cairn_lfs::sim::{Report, Suite, markdown, real};
use clap::{Args as ClapArgs, Subcommand};

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Run the cleaning simulator of the LFS paper (004 §3.5, Figs. 4-7)
    Sim(SimArgs),
}

#[derive(ClapArgs, Debug)]
struct SimArgs {
    /// A reduced run that finishes in seconds (a smaller disk, fewer points; what CI runs)
    #[arg(long)]
    quick: bool,
    /// Output directory for sim.md, sim.json and the PNG plots
    /// (default results/lfs-sim-<UTC timestamp>)
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seed of the simulated access patterns; the same seed gives the same numbers
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (default: one per CPU)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
}

pub fn run(a: Args) -> Result<i32> {
    match a.cmd {
        Sub::Sim(s) => sim(s),
    }
}

fn sim(a: SimArgs) -> Result<i32> {
    let suite = if a.quick {
        Suite::quick()
    } else {
        Suite::full()
    };
    let threads = a.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |t| t as usize,
    );
    let out = match a.out {
        Some(d) => d,
        None => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            PathBuf::from("results").join(format!("lfs-sim-{}", cairn_bench::sys::utc_stamp(now)))
        }
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    println!(
        "cairn lfs sim: suite {}, seed {}, {} threads, output in {}",
        suite.name,
        a.seed,
        threads,
        out.display()
    );

    let started = Instant::now();
    let progress = |p: &Progress| {
        eprintln!(
            "[{:>3}/{}] {}: write cost {:.2}{}",
            p.done,
            p.total,
            p.label,
            p.result.write_cost,
            if p.result.steady {
                ""
            } else {
                " (not settled)"
            }
        );
    };
    let report = suite::run_suite(&suite, a.seed, threads, &progress)?;
    let real = real_comparison(a.quick, a.seed, threads)?;
    let secs = started.elapsed().as_secs_f64();

    let checks = paper::checks(&report);
    let mut md = markdown::markdown(&report, &command);
    md.push('\n');
    md.push_str(&real::markdown(&real));
    write(&out.join("sim.md"), &md)?;
    let json = serde_json::json!({
        "command": command,
        "seed": a.seed,
        "elapsed_secs": secs,
        "checks": checks,
        "report": report,
        "real": {
            "checks": real::checks(&real),
            "results": real,
        },
    });
    write(&out.join("sim.json"), &serde_json::to_string_pretty(&json)?)?;
    let pngs = plots(&report, &out)?;

    println!("done in {secs:.1} s");
    for c in &checks {
        println!(
            "  {} {} ({}): {}",
            if c.holds { "holds" } else { "FAILS" },
            c.id,
            c.source,
            c.measured
        );
    }
    for c in real::checks(&real) {
        println!("  {c}");
    }
    println!("wrote {}", out.join("sim.md").display());
    println!("wrote {}", out.join("sim.json").display());
    for p in pngs {
        println!("wrote {}", p.display());
    }
    Ok(0)
}

/// The same policies on the real file system (004 §3.5 against §5; issue 13: "runs the same
/// policies against the real file system with a hot-and-cold workload and compares measured
/// write cost with the simulator's prediction"): one run per policy, side by side when
/// there are threads for it.
fn real_comparison(quick: bool, seed: u64, threads: usize) -> Result<Vec<real::RealResult>> {
    let specs = real::suite_specs(quick, seed);
    let started = Instant::now();
    let results: Vec<Result<real::RealResult, _>> = if threads > 1 {
        std::thread::scope(|sc| {
            let hs: Vec<_> = specs
                .iter()
                .map(|spec| sc.spawn(move || real::compare(spec)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(cairn_lfs::sim::SimError::Config(
                            "real file system: the run panicked".into(),
                        ))
                    })
                })
                .collect()
        })
    } else {
        specs.iter().map(real::compare).collect()
    };
    let mut out = Vec::new();
    for r in results {
        let r = r.context("the real-file-system comparison")?;
        eprintln!(
            "[real] {}: write cost {:.2}, simulator {:.2} ({:.1} s)",
            r.spec.policy.name(),
            r.write_cost,
            r.sim_write_cost,
            started.elapsed().as_secs_f64()
        );
        out.push(r);
    }
    Ok(out)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The figures: write cost against disk utilization with the reference curves (Figs. 4 and
/// 7), and the segment utilization distributions at 75% (Figs. 5 and 6, and the segments
/// cleaned).
fn plots(r: &Report, out: &Path) -> Result<Vec<PathBuf>> {
    let us = &r.suite.utilizations;
    let flat = |label: &str, y: f64| Series {
        label: label.into(),
        points: us.iter().map(|&u| (u, y)).collect(),
        spread: None,
    };
    let refs = || {
        vec![
            flat("FFS today", FFS_TODAY),
            flat("FFS improved", FFS_IMPROVED),
            Series {
                label: "no variance 2/(1-u)".into(),
                points: us.iter().map(|&u| (u, no_variance(u))).collect(),
                spread: None,
            },
        ]
    };
    let curve = |key: &str| {
        r.curve(key).map(|c| Series {
            label: c.spec.label.into(),
            points: c
                .points
                .iter()
                .map(|p| (p.spec.utilization, p.write_cost))
                .collect(),
            spread: None,
        })
    };
    let cost_plot = |title: &str, keys: &[&str]| LinePlot {
        title: title.into(),
        x_label: "disk capacity utilization".into(),
        y_label: "write cost".into(),
        x_log: false,
        y_log: false,
        x_fmt: XFormat::Plain,
        series: refs()
            .into_iter()
            .chain(keys.iter().filter_map(|k| curve(k)))
            .collect(),
    };
    let at = r.suite.distribution_at;
    let dist = |key: &str, cleaned: bool| {
        let c = r.curve(key)?;
        let p = c.at(at)?;
        let levels = if cleaned { &p.cleaned } else { &p.at_cleaning };
        let bins = suite::binned(levels, r.suite.bins);
        Some(Series {
            label: c.spec.label.into(),
            points: bins
                .iter()
                .enumerate()
                .map(|(i, &f)| (suite::bin_centre(i, bins.len()), f))
                .collect(),
            spread: None,
        })
    };
    let dist_plot = |title: String, y: &str, keys: &[&str], cleaned: bool| LinePlot {
        title,
        x_label: "segment utilization".into(),
        y_label: y.into(),
        x_log: false,
        y_log: false,
        x_fmt: XFormat::Plain,
        series: keys.iter().filter_map(|k| dist(k, cleaned)).collect(),
    };
    let pct = at * 100.0;
    let figures = [
        (
            "fig4-write-cost.png",
            cost_plot(
                "LFS simulator: greedy cleaning (004 Fig. 4)",
                &[
                    suite::GREEDY_UNIFORM,
                    suite::GREEDY_UNIFORM_AGE_SORT,
                    suite::GREEDY_HOT_COLD_AGE_SORT,
                    suite::GREEDY_HOT_COLD,
                ],
            ),
        ),
        (
            "fig7-write-cost.png",
            cost_plot(
                "LFS simulator: cost-benefit vs greedy, hot-and-cold (004 Fig. 7)",
                &[
                    suite::GREEDY_HOT_COLD_AGE_SORT,
                    suite::COST_BENEFIT_HOT_COLD_AGE_SORT,
                    suite::COST_BENEFIT_HOT_COLD,
                ],
            ),
        ),
        (
            "fig5-distribution.png",
            dist_plot(
                format!(
                    "Segment utilization at cleaning time, greedy, {pct:.0}% full (004 Fig. 5)"
                ),
                "fraction of segments",
                &[suite::GREEDY_UNIFORM, suite::GREEDY_HOT_COLD_AGE_SORT],
                false,
            ),
        ),
        (
            "fig6-distribution.png",
            dist_plot(
                format!(
                    "Segment utilization at cleaning time, hot-and-cold, {pct:.0}% full (004 Fig. 6)"
                ),
                "fraction of segments",
                &[
                    suite::COST_BENEFIT_HOT_COLD_AGE_SORT,
                    suite::GREEDY_HOT_COLD_AGE_SORT,
                ],
                false,
            ),
        ),
        (
            "cleaned-distribution.png",
            dist_plot(
                format!("Utilization of the segments cleaned, {pct:.0}% full"),
                "fraction of segments cleaned",
                &[
                    suite::GREEDY_UNIFORM,
                    suite::GREEDY_HOT_COLD_AGE_SORT,
                    suite::COST_BENEFIT_HOT_COLD_AGE_SORT,
                ],
                true,
            ),
        ),
    ];
    let mut written = Vec::new();
    for (name, p) in figures {
        let path = out.join(name);
        plot::render_line(&p, &path)?;
        written.push(path);
    }
    Ok(written)
}
