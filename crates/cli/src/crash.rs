//! `cairn crash run|replay|list`: the crash-consistency harness (crates/crash).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use cairn_crash::campaign::{self, CampaignOptions, Progress};
use cairn_crash::{modes, planted, workload};
use clap::{Args as ClapArgs, Subcommand};

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Record workloads in each mode, check every crash state, compare with the expectations
    Run(RunArgs),
    /// Re-check a reproducer saved by `cairn crash run`
    Replay(ReplayArgs),
    /// List the modes (with what they promise), the planted bugs and the workloads
    List,
    /// Run one workload in one mode and save its recording (for inspection or `run --recording`)
    Record(RecordArgs),
}

#[derive(ClapArgs, Debug)]
struct RecordArgs {
    #[arg(long, default_value = "sync")]
    mode: String,
    #[arg(long)]
    workload: String,
    /// The recording file (JSON lines)
    #[arg(long, short)]
    out: PathBuf,
}

#[derive(ClapArgs, Debug)]
struct RunArgs {
    /// Modes to check, comma-separated (default: every registered mode)
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// Workloads, comma-separated (default: all; `random-S` or `random-S:N` for any seed)
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Also check recordings made with `cairn mount -o record=FILE` (repeatable)
    #[arg(long = "recording")]
    recordings: Vec<PathBuf>,
    /// Run the campaign against a planted bug (see `cairn crash list`): exits 1 when it is
    /// caught, 0 when it slips through
    #[arg(long, conflicts_with_all = ["modes", "recordings"])]
    planted: Option<String>,
    /// Crash states to check in total (default 100000; with --planted, CI's budget)
    #[arg(long)]
    states: Option<usize>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (default: one per CPU)
    #[arg(long)]
    threads: Option<usize>,
    /// No torn (partially written) blocks
    #[arg(long)]
    no_torn: bool,
    /// Write the results as JSON
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the Markdown summary (the tables of docs/CRASH.md)
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Where reproducers of unexpected states go
    #[arg(long, default_value = "crash-repros")]
    repro_dir: PathBuf,
}

#[derive(ClapArgs, Debug)]
struct ReplayArgs {
    /// A reproducer file
    file: PathBuf,
    /// Also write the crash state as a plain image (for `cairn fsck` / `cairn inspect`)
    #[arg(long)]
    image: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<i32> {
    match a.cmd {
        Sub::Run(r) => run_campaign(r),
        Sub::Replay(r) => replay(r),
        Sub::Record(r) => {
            let w = workload::by_name(&r.workload)
                .ok_or_else(|| anyhow!("unknown workload '{}'", r.workload))?;
            let rec =
                workload::record(&w, &r.mode, &Default::default()).map_err(|e| anyhow!("{e}"))?;
            rec.save(&r.out).map_err(|e| anyhow!("{e}"))?;
            println!(
                "{} events ({} from the crash start) written to {}",
                rec.events.len(),
                rec.events.len() - rec.header.start,
                r.out.display()
            );
            Ok(0)
        }
        Sub::List => {
            println!("modes:");
            for m in modes::registered() {
                match modes::expectation(m) {
                    Some(e) => println!(
                        "  {m:<8} corruption {}, leaks {}, durability on return: {}  ({})",
                        e.corrupt.word(),
                        e.leak.word(),
                        if e.promises.metadata_on_return {
                            "yes"
                        } else {
                            "no"
                        },
                        e.basis
                    ),
                    None => println!("  {m:<8} NO EXPECTATIONS DECLARED"),
                }
            }
            println!(
                "variants (cairn crash run --modes NAME; a registered mode recorded another way):"
            );
            for v in modes::variants() {
                println!("  {} ({}) — {}", v.name, v.base, v.description);
            }
            println!("planted bugs (cairn crash run --planted NAME: exit 1 = caught):");
            for p in planted::CATALOGUE {
                println!("planted {} — {}", p.name, p.breaks);
            }
            println!(
                "planted journal bugs (cairn crash run --modes NAME: unexpected states = caught):"
            );
            for p in planted::JOURNAL_CATALOGUE {
                println!("planted {} ({}) — {}", p.name, p.base, p.breaks);
            }
            println!("workloads:");
            for w in workload::all() {
                println!(
                    "  {}{}",
                    w.name,
                    if w.is_scripted() {
                        ""
                    } else {
                        " (not scripted)"
                    }
                );
            }
            Ok(0)
        }
    }
}

fn run_campaign(a: RunArgs) -> Result<i32> {
    let mut opts = match &a.planted {
        Some(name) => {
            let p = planted::by_name(name)
                .ok_or_else(|| anyhow!("unknown planted bug '{name}' (see `cairn crash list`)"))?;
            campaign::for_planted(p, a.states)
        }
        None => CampaignOptions {
            states: a.states.unwrap_or(100_000),
            recordings: a.recordings,
            ..Default::default()
        },
    };
    opts.seed = a.seed;
    opts.torn = !a.no_torn;
    opts.repro_dir = Some(a.repro_dir);
    if !a.modes.is_empty() {
        opts.modes = a.modes;
    }
    if let Some(t) = a.threads {
        opts.threads = t.max(1);
    }
    if !a.workloads.is_empty() {
        opts.workloads = a
            .workloads
            .iter()
            .map(|n| {
                workload::by_name(n)
                    .ok_or_else(|| anyhow!("unknown workload '{n}' (see `cairn crash list`)"))
            })
            .collect::<Result<_>>()?;
    } else if !opts.recordings.is_empty() {
        // Only the recordings, unless workloads were asked for too.
        opts.workloads.clear();
    }
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:<24} [{bar:40}] {pos}/{len} states ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_message("recording, then checking");
        Some(b)
    } else {
        None
    };
    let progress = |p: Progress| {
        if let Some(b) = &bar {
            b.set_length(p.total);
            b.set_position(p.done);
            if p.unexpected > 0 {
                b.set_message(format!("{} unexpected", p.unexpected));
            }
        }
    };
    // A crash state may make the engine panic; the harness catches it and reports it as a
    // finding, so the default hook's backtrace on stderr would only garble the progress bar.
    // The engine logs every corruption it meets at error level; in a campaign corruption is
    // the expected finding of thousands of states, reported in the table instead.
    if std::env::var_os("RUST_LOG").is_none() {
        log::set_max_level(log::LevelFilter::Off);
    }
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        log::error!("panic while checking a crash state: {info}")
    }));
    let r = campaign::run(&opts, &progress);
    std::panic::set_hook(prev);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let r = r.map_err(|e| anyhow!("{e}"))?;
    println!(
        "{:<20} {:<18} {:>7} {:>7} {:>9} {:>8} {:>7} {:>10} {:>6} {:>10}",
        "mode",
        "workload",
        "states",
        "clean",
        "leak-only",
        "irename",
        "corrupt",
        "durability",
        "stale",
        "unexpected"
    );
    for c in &r.cells {
        println!(
            "{:<20} {:<18} {:>7} {:>7} {:>9} {:>8} {:>7} {:>10} {:>6} {:>10}",
            c.mode,
            c.workload,
            c.states,
            c.clean,
            c.leak_only,
            c.interrupted_rename,
            c.corrupt,
            c.durability_violations,
            c.stale,
            c.unexpected
        );
    }
    println!(
        "\n{} states in {:.1} s on {} thread(s): {:.0} states/s per thread",
        r.states, r.seconds, r.threads, r.states_per_sec_per_thread
    );
    if let Some(p) = &a.json {
        let text = serde_json::to_string_pretty(&r.cells)?;
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.markdown {
        std::fs::write(p, r.markdown()).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(name) = &a.planted {
        let caught: u64 = r.cells.iter().map(|c| c.unexpected).sum();
        if r.passed() {
            println!("planted {name}: NOT CAUGHT in {} states", r.states);
            return Ok(0);
        }
        println!(
            "planted {name}: caught in {caught} of {} states ({})",
            r.states,
            r.cells
                .iter()
                .filter(|c| c.unexpected > 0)
                .map(|c| format!("{} {}", c.workload, c.unexpected))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if r.passed() {
        println!("every mode delivered what it declares");
        Ok(0)
    } else {
        println!("FAILED:");
        for v in &r.verdicts {
            println!("  {v}");
        }
        let repros: Vec<&String> = r.cells.iter().flat_map(|c| &c.reproducers).collect();
        if !repros.is_empty() {
            println!("reproducers ({}; `cairn crash replay FILE`):", repros.len());
            for p in repros.iter().take(10) {
                println!("  {p}");
            }
        }
        Ok(1)
    }
}

fn replay(a: ReplayArgs) -> Result<i32> {
    let (c, st, out, failing) = campaign::replay(&a.file).map_err(|e| anyhow!("{e}"))?;
    println!(
        "mode {} / workload {}",
        c.rec.header.mode, c.rec.header.workload
    );
    println!("state: {}", st.describe(&c.epochs));
    println!("crash point: {}", c.describe_point(out.crash_point));
    println!("class: {:?}", out.class);
    for f in &out.findings {
        println!("  {f}");
    }
    for v in &out.violations {
        println!("  DURABILITY: {v}");
    }
    for s in &out.stale {
        println!("  STALE: {s}");
    }
    if let Some(img) = &a.image {
        let dev = c.state_device(&st).map_err(|e| anyhow!("{e}"))?;
        std::fs::write(img, dev.to_image())
            .with_context(|| format!("writing {}", img.display()))?;
        println!("state written to {}", img.display());
    }
    if failing {
        println!("still fails the mode's expectations");
        Ok(1)
    } else {
        println!("passes the mode's expectations now");
        Ok(0)
    }
}
