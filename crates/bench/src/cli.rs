//! The `cairn bench` command line (also the stand-alone `cairn-bench` binary).
//!
//! `cairn bench run` makes a fresh file system per target and workload (kernel ext4 on a loop
//! device, ext4 `-o sync`, fuse2fs, mergerfs over ext4, cairn in each mode), runs the workload,
//! records rates and I/O counts per operation as JSON under `results/<timestamp>/`, and prints
//! Markdown tables. `cairn-bench workload` runs one workload in an existing directory (what
//! `make demo` uses on a mount it made by hand). See docs/BENCHMARKS.md.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use crate::counters::{Counters, Source};
use crate::report::{self, Meta, Record};
use crate::sys;
use crate::target::{self, Env, Kind, Mounted, TargetSpec};
use crate::workload::{self, Params, PlainDir, Workload};

/// `cairn-bench ...` as a stand-alone binary.
#[derive(Parser)]
#[command(
    name = "cairn-bench",
    version,
    about = "Reproduce the papers' benchmarks on cairn, kernel file systems and FUSE peers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run workloads against fresh file systems of every target; write JSON and Markdown.
    Run(RunArgs),
    /// Run one workload in an existing directory and print its rates (and a cairn mount's
    /// device and FUSE counts per operation with --cairn-stats).
    Workload(WorkloadArgs),
    /// Measure the device's raw flush rate (4 KiB write + fdatasync in a loop) in a directory.
    FlushRate {
        /// Directory on the disk to measure (a file is created and removed there).
        #[arg(long, default_value = "/var/tmp/cairn-bench")]
        dir: PathBuf,
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
    },
    /// Re-render the Markdown tables of an earlier run directory.
    Report { dir: PathBuf },
}

#[derive(Args, Clone)]
pub struct SizeArgs {
    /// Files created and unlinked by create-unlink.
    #[arg(long, default_value_t = 50_000)]
    files: u64,
    /// Files of the smallfile workload.
    #[arg(long, default_value_t = 10_000)]
    small_files: u64,
    /// Size of each smallfile file in bytes.
    #[arg(long, default_value_t = 1024)]
    small_size: usize,
    /// PostMark's initial file count.
    #[arg(long, default_value_t = 10_000)]
    pm_files: u64,
    /// PostMark's transaction count.
    #[arg(long, default_value_t = 20_000)]
    pm_tx: u64,
    /// Size of the sequential file (e.g. 1G, 64M).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    seq_size: u64,
    /// Small sizes for a smoke run (2,000 files, 1,000 small files, PostMark 500/1,000, 64 MiB).
    #[arg(long)]
    quick: bool,
}

impl SizeArgs {
    fn params(&self) -> Params {
        if self.quick {
            return Params {
                create_unlink_files: 2_000,
                small_files: 1_000,
                small_size: self.small_size,
                pm_files: 500,
                pm_transactions: 1_000,
                seq_bytes: 64 << 20,
            };
        }
        Params {
            create_unlink_files: self.files,
            small_files: self.small_files,
            small_size: self.small_size,
            pm_files: self.pm_files,
            pm_transactions: self.pm_tx,
            seq_bytes: self.seq_size,
        }
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// Comma-separated targets: ext4, ext4-sync, fuse2fs, mergerfs, cairn-<mode>, or `all`
    /// (every baseline and cairn in every mode `cairn modes` lists).
    #[arg(long, default_value = "all")]
    targets: String,
    /// Comma-separated workloads: create-unlink, smallfile, postmark, seq, or `all`.
    #[arg(long, default_value = "all")]
    workloads: String,
    /// Repetitions; tables show min/median/max.
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// CPU(s) to pin the benchmark and every FUSE daemon it starts to ("0", "0,1"), or `none`.
    #[arg(long, default_value = "0")]
    cpu: String,
    /// Target whose median rates the others are divided by.
    #[arg(long, default_value = "ext4")]
    baseline: String,
    /// Directory on the local disk (not tmpfs) for images and mount points.
    #[arg(long, default_value = "/var/tmp/cairn-bench")]
    scratch: PathBuf,
    /// Output directory (default results/<UTC timestamp>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Size of every target's image.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    image_size: u64,
    /// The cairn binary (default: `cairn` next to this binary, else on PATH).
    #[arg(long)]
    cairn: Option<String>,
    /// Skip the raw flush-rate measurement.
    #[arg(long)]
    no_flush_rate: bool,
    #[command(flatten)]
    sizes: SizeArgs,
}

#[derive(Args)]
pub struct WorkloadArgs {
    /// create-unlink, smallfile, postmark or seq.
    name: String,
    /// Directory to run in (created if missing; should be empty).
    #[arg(long)]
    dir: PathBuf,
    /// A cairn mount point whose `cairn stats --json` counters to report per operation.
    #[arg(long)]
    cairn_stats: Option<PathBuf>,
    #[arg(long)]
    cairn: Option<String>,
    /// Drop the kernel's caches between phases that read back (needs root).
    #[arg(long)]
    drop_caches: bool,
    /// Print the phase results as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// A word printed before each result line (e.g. the mode).
    #[arg(long, default_value = "")]
    label: String,
    #[command(flatten)]
    sizes: SizeArgs,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.as_bytes().last().map(|c| c.to_ascii_uppercase()) {
        Some(b'K') => (&s[..s.len() - 1], 10),
        Some(b'M') => (&s[..s.len() - 1], 20),
        Some(b'G') => (&s[..s.len() - 1], 30),
        Some(b'T') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size '{s}'"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size '{s}' too large"))
}

/// Runs one bench command and returns the process exit code (errors are printed).
pub fn main_with(cmd: Cmd) -> i32 {
    let res = match cmd {
        Cmd::Run(a) => cmd_run(a),
        Cmd::Workload(a) => cmd_workload(a),
        Cmd::FlushRate { dir, secs } => workload::flush_rate(&dir, u64::MAX, secs).map(|r| {
            println!(
                "raw flush rate on {} ({}): overwrite {}/s, append {}/s",
                r.dir.display(),
                r.host_fs,
                report::fmt_rate(r.overwrite_per_sec),
                report::fmt_rate(r.append_per_sec)
            );
            0
        }),
        Cmd::Report { dir } => report::load(&dir).map(|(m, r)| {
            print!("{}", report::markdown(&m, &r));
            0
        }),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cairn bench: {e:#}");
            2
        }
    }
}

/// The cairn binary to use: explicit, else the one built beside this binary, else PATH.
fn find_cairn(explicit: Option<String>) -> String {
    explicit.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("cairn")))
            .filter(|p| p.is_file())
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "cairn".into())
    })
}

/// The metadata-update modes the cairn build knows, from `cairn modes` (first word of each
/// line); `sync` and `async` when the command is not there yet.
fn cairn_modes(cairn: &str) -> Vec<String> {
    let parsed = sys::run(Command::new(cairn).arg("modes"))
        .ok()
        .map(|out| parse_modes(&out))
        .unwrap_or_default();
    if parsed.is_empty() {
        vec!["sync".into(), "async".into()]
    } else {
        parsed
    }
}

fn parse_modes(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|w| w.trim_end_matches(':'))
        .filter(|w| {
            !w.is_empty()
                && !w.eq_ignore_ascii_case("mode")
                && !w.eq_ignore_ascii_case("modes")
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        })
        .map(str::to_string)
        .collect()
}

/// Why a target cannot run here, if it cannot.
fn unavailable(spec: &TargetSpec, env: &Env) -> Option<String> {
    if let Some(t) = spec.tools().iter().find(|t| !sys::have_tool(t)) {
        return Some(format!("`{t}` not installed (scripts/install-deps.sh)"));
    }
    if let Kind::Cairn { .. } = spec.kind {
        if !sys::have_tool(&env.cairn) {
            return Some(format!(
                "cairn binary `{}` not found (cargo build --release -p cairn-cli)",
                env.cairn
            ));
        }
        // A tiny mkfs tells whether this build of cairn can make file systems at all.
        let probe = env.scratch.join("probe.img");
        let r = sys::run(
            Command::new(&env.cairn)
                .arg("mkfs")
                .arg(&probe)
                .arg("--size")
                .arg("64M"),
        );
        let _ = fs::remove_file(&probe);
        if let Err(e) = r {
            let msg = format!("{e:#}");
            return Some(format!(
                "`cairn mkfs` fails: {}",
                msg.lines().last().unwrap_or("").trim()
            ));
        }
    }
    None
}

fn tool_version(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(80).collect())
}

fn list(arg: &str, all: Vec<String>) -> Vec<String> {
    if arg == "all" {
        all
    } else {
        arg.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

fn cmd_run(a: RunArgs) -> Result<i32> {
    if !nix::unistd::geteuid().is_root() {
        bail!("`run` mounts file systems and sets up loop devices: run it as root");
    }
    let cpus_wanted: Option<Vec<usize>> = match a.cpu.as_str() {
        "none" => None,
        s => Some(
            s.split(',')
                .map(|c| {
                    c.trim()
                        .parse::<usize>()
                        .with_context(|| format!("bad --cpu '{s}'"))
                })
                .collect::<Result<_>>()?,
        ),
    };
    let cpus = sys::set_cpus(cpus_wanted.as_deref())?;
    let scratch = sys::ensure_dir(&a.scratch)?;
    let scratch_fs = sys::fs_type_of(&scratch)?;
    if scratch_fs == "tmpfs" {
        bail!(
            "{} is on tmpfs: images must be on the local disk (--scratch)",
            scratch.display()
        );
    }
    let env = Env {
        scratch: scratch.clone(),
        image_size: a.image_size,
        cairn: find_cairn(a.cairn),
    };
    let params = a.sizes.params();

    let mut all_targets: Vec<String> = cairn_modes(&env.cairn)
        .into_iter()
        .map(|m| format!("cairn-{m}"))
        .collect();
    all_targets.extend(target::BASELINES.iter().map(|s| s.to_string()));
    let targets: Vec<TargetSpec> = list(&a.targets, all_targets)
        .iter()
        .map(|t| TargetSpec::parse(t))
        .collect::<Result<_>>()?;
    let workloads: Vec<Workload> = list(
        &a.workloads,
        workload::NAMES.iter().map(|s| s.to_string()).collect(),
    )
    .iter()
    .map(|w| Workload::named(w, &params))
    .collect::<Result<_>>()?;

    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let started = sys::utc_stamp(now);
    let out = a
        .out
        .unwrap_or_else(|| PathBuf::from("results").join(&started));
    fs::create_dir_all(&out).with_context(|| format!("mkdir {}", out.display()))?;

    let mut skipped = BTreeMap::new();
    for t in &targets {
        if let Some(why) = unavailable(t, &env) {
            eprintln!("cairn-bench: skipping {t}: {why}");
            skipped.insert(t.name.clone(), why);
        }
    }
    // Package versions say exactly what ran; `--version` output of each tool varies in shape.
    let mut tool_versions = BTreeMap::new();
    for pkg in ["e2fsprogs", "fuse2fs", "mergerfs", "postmark", "fuse3"] {
        if let Ok(v) = sys::run(Command::new("dpkg-query").args(["-W", "-f", "${Version}", pkg])) {
            tool_versions.insert(pkg.to_string(), v.trim().to_string());
        }
    }
    if let Some(v) = tool_version(&env.cairn, &["--version"]) {
        tool_versions.insert("cairn".to_string(), v);
    }
    let mut meta = Meta {
        started: started.clone(),
        kernel: sys::kernel_release(),
        cpu_model: sys::cpu_model(),
        cpus,
        pinned: cpus_wanted.is_some(),
        reps: a.reps,
        image_size: a.image_size,
        scratch: scratch.display().to_string(),
        scratch_fs,
        baseline: a.baseline.clone(),
        targets: targets.iter().map(|t| t.name.clone()).collect(),
        workloads: workloads.iter().map(|w| w.name().to_string()).collect(),
        skipped,
        flush_rate: None,
        tool_versions,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    if !a.no_flush_rate {
        let fr = workload::flush_rate(&scratch, 20_000, 3.0)?;
        eprintln!(
            "cairn-bench: raw flush rate on {}: overwrite {}/s, append {}/s",
            fr.host_fs,
            report::fmt_rate(fr.overwrite_per_sec),
            report::fmt_rate(fr.append_per_sec)
        );
        meta.flush_rate = Some(fr);
    }
    report::write_json(&out.join("meta.json"), &meta)?;

    // Repetitions outermost: a burst of noise on the shared machine then hits one repetition of
    // every target rather than every repetition of one.
    let mut seq = 0;
    let mut failures = 0;
    let t_run = Instant::now();
    for rep in 1..=a.reps {
        for w in &workloads {
            for t in targets
                .iter()
                .filter(|t| !meta.skipped.contains_key(&t.name))
            {
                seq += 1;
                let rec = run_one(t, w, rep, &env);
                match &rec.error {
                    Some(e) => {
                        failures += 1;
                        eprintln!("[rep {rep}/{}] {} on {t}: FAILED: {e}", a.reps, w.name());
                    }
                    None => {
                        for p in &rec.phases {
                            eprintln!(
                                "[rep {rep}/{}] {} on {t}: {} {} {}/s in {:.2} s{}",
                                a.reps,
                                w.name(),
                                p.phase,
                                report::fmt_rate(p.rate),
                                p.unit,
                                p.secs,
                                p.per_op(Counters::device_flushes)
                                    .map(|f| format!(", {f:.2} flushes/op"))
                                    .unwrap_or_default()
                            );
                        }
                    }
                }
                report::write_json(
                    &out.join(format!(
                        "rec-{seq:04}-{}-{}-rep{rep}.json",
                        w.name(),
                        t.name
                    )),
                    &rec,
                )?;
            }
        }
    }
    let (meta, records) = report::load(&out)?;
    report::write_json(
        &out.join("summary.json"),
        &report::summarize(&meta, &records),
    )?;
    let md = report::markdown(&meta, &records);
    fs::write(out.join("summary.md"), &md)?;
    println!("{md}");
    eprintln!(
        "cairn-bench: {} record(s), {failures} failed, in {:.0} s; results in {}",
        records.len(),
        t_run.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(if failures > 0 { 1 } else { 0 })
}

/// One target × workload × repetition on a fresh file system; errors end up in the record.
fn run_one(t: &TargetSpec, w: &Workload, rep: u32, env: &Env) -> Record {
    let mut rec = Record {
        target: t.name.clone(),
        workload: w.name().to_string(),
        description: w.describe(),
        rep,
        error: None,
        phases: Vec::new(),
        notes: Vec::new(),
    };
    let res = (|| -> Result<()> {
        let mut m = Mounted::setup(t, env)?;
        let phases = w.run(&mut m);
        rec.notes = m.notes.clone();
        rec.phases = phases?;
        m.teardown()
    })();
    if let Err(e) = res {
        rec.error = Some(format!("{e:#}"));
    }
    rec
}

fn cmd_workload(a: WorkloadArgs) -> Result<i32> {
    let w = Workload::named(&a.name, &a.sizes.params())?;
    let dir = sys::ensure_dir(&a.dir)?;
    let source = a.cairn_stats.map(|mnt| Source::Cairn {
        cairn: find_cairn(a.cairn),
        mnt,
        block: None,
    });
    let mut stage = PlainDir {
        dir,
        source,
        drop_caches: a.drop_caches,
    };
    let phases = w.run(&mut stage)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&phases)?);
        return Ok(0);
    }
    for p in &phases {
        let per = |f: fn(&Counters) -> Option<f64>| {
            p.per_op(f)
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "—".into())
        };
        println!(
            "{}{:<14} {:>9} {}/s  ({} {} in {:.2} s)  device writes/op {}  flushes/op {}  FUSE requests/op {}",
            if a.label.is_empty() {
                String::new()
            } else {
                format!("{:<8}", a.label)
            },
            p.phase,
            report::fmt_rate(p.rate),
            p.unit,
            p.ops,
            p.unit,
            p.secs,
            per(Counters::device_writes),
            per(Counters::device_flushes),
            per(Counters::fuse_requests)
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn modes_from_cairn_output() {
        assert_eq!(
            parse_modes("sync   classic FFS\nasync  delayed writes\n"),
            ["sync", "async"]
        );
        assert_eq!(
            parse_modes("MODE DESCRIPTION\nsync: x\nsoftdep: y\n"),
            ["sync", "softdep"]
        );
        assert!(parse_modes("").is_empty());
    }

    #[test]
    fn explicit_lists_override_all() {
        assert_eq!(list("all", vec!["a".into()]), ["a"]);
        assert_eq!(list("ext4, fuse2fs,", vec![]), ["ext4", "fuse2fs"]);
    }
}
