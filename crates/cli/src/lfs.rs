//! `cairn lfs`: the log-structured file system (crates/lfs). For now `cairn lfs sim`, the
//! cleaning simulator of 004 §3.5: the experiments of Figs. 4–7 as Markdown and JSON tables
//! and PNG plots beside the paper's reference curves, then the same policies on the real
//! file system with the simulator's prediction beside the measured write cost.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use cairn_lfs::sim::paper;
use cairn_lfs::sim::suite::{self, Progress};
use cairn_lfs::sim::{Suite, markdown, real};
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
    let out = a.out.unwrap_or_else(cairn_bench::lfs_sim::default_out);
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
    let pngs = cairn_bench::lfs_sim::plots(&report, &out)?;

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
