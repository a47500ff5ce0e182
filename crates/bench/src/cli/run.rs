//! `cairn bench run`, in the order a run goes: where it runs ([`Scratch`]), what it runs
//! ([`Plan`]: targets, workloads, sizes, repetitions), what it records about the machine
//! ([`run_meta`]), the runs themselves ([`run_all`]), and the report.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use super::{
    DEVICE_SCALE, DEVICE_WORKLOADS, RunArgs, all_targets, build_commit, cairn_unusable,
    enable_fuse_uring, find_cairn, in_default_set, list, run_one, tool_version, unavailable,
    with_device,
};
use crate::registry::Listing;
use crate::report::{self, Meta, Record};
use crate::scratch::{self, ScratchDir};
use crate::sys;
use crate::target::{Env, TargetSpec};
use crate::workload::{self, Params, Workload};

pub(super) fn cmd_run(a: RunArgs) -> Result<i32> {
    if !nix::unistd::geteuid().is_root() {
        bail!("`run` mounts file systems and sets up loop devices: run it as root");
    }
    let cpus_wanted = parse_cpus(&a.cpu)?;
    let cpus = sys::set_cpus(cpus_wanted.as_deref())?;
    let scratch = Scratch::take(&a.scratch)?;
    let disk = a
        .device
        .as_deref()
        .map(|m| cairn_blockdev::disk::DiskOptions::parse(m).map_err(|e| anyhow::anyhow!(e)))
        .transpose()?;
    let requested = image_size(&a);
    if let Some(free) = sys::free_bytes(&scratch.parent).filter(|f| *f < requested) {
        eprintln!(
            "cairn-bench: images of {} are larger than the {} free in {}: they are sparse, and a workload that filled one would fail with ENOSPC from the host",
            report::fmt_bytes(requested),
            report::fmt_bytes(free),
            scratch.parent.display()
        );
    }
    let env = Env {
        scratch: scratch.dir.path().to_path_buf(),
        image_size: fit_disk(requested, disk.as_ref().map(|d| d.spec.capacity())),
        cairn: find_cairn(a.cairn.clone()),
        fuse_concurrency: None,
        mount_options: a.mount_options.trim_matches(',').to_string(),
    };
    let listing = Listing::of(&env.cairn);
    let plan = Plan::of(&a, &listing, disk.is_some())?;
    enable_fuse_uring(&plan.targets);

    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let started = sys::utc_stamp(now);
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("results").join(&started));
    fs::create_dir_all(&out).with_context(|| format!("mkdir {}", out.display()))?;

    let mut meta = run_meta(
        &a,
        &plan,
        &env,
        &scratch,
        started,
        cpus,
        cpus_wanted.is_some(),
    );
    if !a.no_flush_rate {
        let mut fr = workload::flush_rate(scratch.dir.path(), 20_000, 3.0)?;
        // Measured in this run's own directory, which is gone after the run: the record names
        // the directory the user chose, on the same file system.
        fr.dir = scratch.parent.clone();
        eprintln!(
            "cairn-bench: raw flush rate on {}: overwrite {}/s, append {}/s",
            fr.host_fs,
            report::fmt_rate(fr.overwrite_per_sec),
            report::fmt_rate(fr.append_per_sec)
        );
        meta.flush_rate = Some(fr);
    }
    report::write_json(&out.join("meta.json"), &meta)?;

    for w in &plan.workloads {
        w.prepare()
            .with_context(|| format!("preparing {}", w.name()))?;
    }
    let t_run = Instant::now();
    let (records, failures) = run_all(&plan, &meta, &env, &out, a.no_progress)?;
    report::render(&out, &meta, &records)?;
    print!(
        "{}",
        report::terminal_summary(&out, &meta, &records, t_run.elapsed().as_secs_f64())
    );
    // Everything worth keeping is in `out` now; the images and mount points go (an error here
    // still leaves the results complete).
    scratch.dir.remove()?;
    Ok(if failures > 0 { 1 } else { 0 })
}

/// `--cpu`: a comma-separated list of CPUs to pin to, or `none`.
fn parse_cpus(arg: &str) -> Result<Option<Vec<usize>>> {
    if arg == "none" {
        return Ok(None);
    }
    let cpus = arg
        .split(',')
        .map(|c| {
            c.trim()
                .parse::<usize>()
                .with_context(|| format!("bad --cpu '{arg}'"))
        })
        .collect::<Result<_>>()?;
    Ok(Some(cpus))
}

/// The run's own directory under `--scratch` (on a local disk, never tmpfs), taken after the
/// directories of runs that died are cleaned up.
struct Scratch {
    /// The directory the user chose.
    parent: PathBuf,
    /// The file system it is on (`stat -f`'s name).
    fs_type: String,
    dir: ScratchDir,
}

impl Scratch {
    fn take(parent: &Path) -> Result<Scratch> {
        let parent = sys::ensure_dir(parent)?;
        let fs_type = sys::fs_type_of(&parent)?;
        if fs_type == "tmpfs" {
            bail!(
                "{} is on tmpfs: images must be on the local disk (--scratch)",
                parent.display()
            );
        }
        let cleaned = scratch::cleanup_dead_runs(&parent)?;
        for d in &cleaned.removed {
            eprintln!(
                "cairn-bench: removed {} (left by a run that died)",
                d.display()
            );
        }
        for (d, why) in &cleaned.kept {
            eprintln!("cairn-bench: cannot remove {}: {why}", d.display());
        }
        if !cleaned.live.is_empty() {
            eprintln!(
                "cairn-bench: {} other run(s) in progress in {} (left alone; they compete for the disk and CPU)",
                cleaned.live.len(),
                parent.display()
            );
        }
        let dir = ScratchDir::create(&parent)?;
        Ok(Scratch {
            parent,
            fs_type,
            dir,
        })
    }
}

/// Every target's image size: `--image-size`, else the suite's — but 16 GiB for the full
/// news spool, which holds 520,000 articles (2 GB): at mkfs's default of one inode per
/// 16 KiB, only an image of 16 GiB has enough inodes for it on every target.
fn image_size(a: &RunArgs) -> u64 {
    a.image_size.unwrap_or(if a.sizes.netnews_full {
        16 << 30
    } else {
        a.suite.image_size()
    })
}

/// On a disk model of `capacity` bytes every image fits the disk, the ones on this device
/// too (whole MiB): a pair compares the same file system.
fn fit_disk(image_size: u64, capacity: Option<u64>) -> u64 {
    match capacity {
        Some(c) => image_size.min(c / (1 << 20) * (1 << 20)),
        None => image_size,
    }
}

/// What a run runs: its targets and workloads, their sizes and repetitions.
struct Plan {
    targets: Vec<TargetSpec>,
    workloads: Vec<Workload>,
    params: Params,
    /// `--targets all`: each workload runs on its default set only (`in_default_set`).
    all: bool,
    /// `--reps`, else the suite's per workload.
    reps: Option<u32>,
    suite: super::Suite,
}

impl Plan {
    /// The plan `a` names, with the modes `listing` says the cairn binary has; `on_disk`: a
    /// run on a disk model (`--device`), whose defaults are the papers' disk tables.
    fn of(a: &RunArgs, listing: &Listing, on_disk: bool) -> Result<Plan> {
        let params = if on_disk {
            a.sizes.params_at(DEVICE_SCALE)
        } else {
            a.sizes.params(a.suite)
        };
        let all = a.targets == "all";
        let mut names = list(&a.targets, all_targets(listing));
        if let Some(model) = &a.device {
            names = with_device(names, all, listing, model);
        }
        let targets = names
            .iter()
            .map(|t| TargetSpec::parse_with(t, listing))
            .collect::<Result<_>>()?;
        let default_workloads = if on_disk {
            DEVICE_WORKLOADS.iter().map(|w| w.to_string()).collect()
        } else {
            a.suite.workloads()
        };
        let workloads = list(&a.workloads, default_workloads)
            .iter()
            .map(|w| Workload::named(w, &params))
            .collect::<Result<_>>()?;
        Ok(Plan {
            targets,
            workloads,
            params,
            all,
            reps: a.reps,
            suite: a.suite,
        })
    }

    /// Repetitions of workload `w` (at least one).
    fn reps_of(&self, w: &str) -> u32 {
        self.reps.unwrap_or(self.suite.reps(w, &self.params)).max(1)
    }

    /// The most repetitions any workload runs.
    fn reps(&self) -> u32 {
        self.workloads
            .iter()
            .map(|w| self.reps_of(w.name()))
            .max()
            .unwrap_or(1)
    }

    /// Whether `w` runs on `t` in this plan.
    fn runs_on(&self, w: &Workload, t: &TargetSpec) -> bool {
        w.applies_to(t) && (!self.all || in_default_set(w.name(), &t.kind))
    }
}

/// Package versions say exactly what ran; `--version` output of each tool varies in shape.
fn tool_versions(cairn: &str) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::new();
    for pkg in [
        "e2fsprogs",
        "fuse2fs",
        "mergerfs",
        "postmark",
        "fuse3",
        "xfsprogs",
        "gcc",
    ] {
        if let Ok(v) = sys::run(Command::new("dpkg-query").args(["-W", "-f", "${Version}", pkg])) {
            versions.insert(pkg.to_string(), v.trim().to_string());
        }
    }
    if let Some(v) = tool_version(cairn, &["--version"]) {
        // `cairn --version` prints "cairn 0.1.0"; the table already names the tool.
        let v = v.strip_prefix("cairn ").map(str::to_string).unwrap_or(v);
        versions.insert("cairn".to_string(), v);
    }
    versions
}

/// The run's metadata (meta.json), the targets that cannot run here among it as skipped.
fn run_meta(
    a: &RunArgs,
    plan: &Plan,
    env: &Env,
    scratch: &Scratch,
    started: String,
    cpus: Vec<usize>,
    pinned: bool,
) -> Meta {
    let cairn_problem = cairn_unusable(env);
    let mut skipped = BTreeMap::new();
    for t in &plan.targets {
        if let Some(why) = unavailable(t, &cairn_problem) {
            eprintln!("cairn-bench: skipping {t}: {why}");
            skipped.insert(t.name.clone(), why);
        }
    }
    let (commit, dirty) = build_commit();
    Meta {
        started,
        kernel: sys::kernel_release(),
        cpu_model: sys::cpu_model(),
        cpus,
        pinned,
        reps: plan.reps(),
        reps_per_workload: plan
            .workloads
            .iter()
            .map(|w| (w.name().to_string(), plan.reps_of(w.name())))
            .collect(),
        image_size: env.image_size,
        suite: format!("{:?}", a.suite).to_lowercase(),
        scale: plan.params.scale,
        netnews_scale: plan.params.netnews_scale,
        commit,
        dirty,
        scratch: scratch.parent.display().to_string(),
        scratch_fs: scratch.fs_type.clone(),
        baseline: a.baseline.clone(),
        targets: plan.targets.iter().map(|t| t.name.clone()).collect(),
        workloads: plan
            .workloads
            .iter()
            .map(|w| w.name().to_string())
            .collect(),
        skipped,
        flush_rate: None,
        tool_versions: tool_versions(&env.cairn),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        device: a.device.clone(),
        online_cpus: sys::online_cpus(),
    }
}

/// Every repetition of every workload on every target that can run here, each record
/// written to `out` as it is made. Returns the records and how many failed.
fn run_all(
    plan: &Plan,
    meta: &Meta,
    env: &Env,
    out: &Path,
    no_progress: bool,
) -> Result<(Vec<Record>, usize)> {
    let runnable: Vec<&TargetSpec> = plan
        .targets
        .iter()
        .filter(|t| !meta.skipped.contains_key(&t.name))
        .collect();
    let total: u64 = plan
        .workloads
        .iter()
        .map(|w| {
            runnable.iter().filter(|t| plan.runs_on(w, t)).count() as u64
                * u64::from(plan.reps_of(w.name()))
        })
        .sum();
    let bar = if no_progress {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(total)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} runs (eta {eta}) {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let say = |line: String| {
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
    };

    // Repetitions outermost: a burst of noise on the shared machine then hits one repetition of
    // every target rather than every repetition of one.
    let reps = plan.reps();
    let mut records = Vec::new();
    let mut failures = 0;
    for rep in 1..=reps {
        for w in plan
            .workloads
            .iter()
            .filter(|w| rep <= plan.reps_of(w.name()))
        {
            for t in runnable.iter().filter(|t| plan.runs_on(w, t)) {
                bar.set_message(format!("rep {rep}/{reps}: {} on {t}", w.name()));
                let t0 = Instant::now();
                let rec = run_one(t, w, rep, env);
                bar.inc(1);
                failures += usize::from(rec.error.is_some());
                say(progress_line(&rec, t, reps, t0.elapsed().as_secs_f64()));
                report::write_json(
                    &out.join(format!(
                        "rec-{:04}-{}-{}-rep{rep}.json",
                        records.len() + 1,
                        w.name(),
                        t.name.replace('@', "-")
                    )),
                    &rec,
                )?;
                records.push(rec);
            }
        }
    }
    bar.finish_and_clear();
    Ok((records, failures))
}

/// The line one repetition prints: its phases' results, or why it failed; at most 300
/// characters.
fn progress_line(rec: &Record, t: &TargetSpec, reps: u32, secs: f64) -> String {
    let (rep, w) = (rec.rep, &rec.workload);
    if let Some(e) = &rec.error {
        return format!("[rep {rep}/{reps}] {w} on {t}: FAILED: {e}");
    }
    let phases: Vec<String> = rec
        .phases
        .iter()
        .map(|p| format!("{} {}", p.label(), report::fmt_phase_value(p)))
        .chain(rec.skipped.iter().map(|s| match &s.phase {
            Some(p) => format!("{p} not measured ({})", s.why),
            None => format!("not run ({})", s.why),
        }))
        .collect();
    let line = format!(
        "[rep {rep}/{reps}] {w} on {t} ({secs:.0} s): {}",
        phases.join(", ")
    );
    if line.chars().count() > 300 {
        line.chars().take(297).collect::<String>() + "..."
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Cmd, Suite};
    use super::*;
    use crate::Cli;
    use clap::Parser;

    fn run_args(args: &[&str]) -> RunArgs {
        let argv = ["cairn-bench", "run"].iter().chain(args).copied();
        match Cli::parse_from(argv).cmd {
            Cmd::Run(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn cpus_are_a_list_or_none() {
        assert_eq!(parse_cpus("none").unwrap(), None);
        assert_eq!(parse_cpus("0").unwrap(), Some(vec![0]));
        assert_eq!(parse_cpus("0, 3").unwrap(), Some(vec![0, 3]));
        let e = format!("{:#}", parse_cpus("0,x").unwrap_err());
        assert!(e.starts_with("bad --cpu '0,x'"), "{e}");
    }

    #[test]
    fn image_sizes_follow_the_suite_the_spool_and_the_disk() {
        assert_eq!(image_size(&run_args(&[])), 4 << 30);
        assert_eq!(image_size(&run_args(&["--suite", "quick"])), 1 << 30);
        assert_eq!(image_size(&run_args(&["--netnews-full"])), 16 << 30);
        assert_eq!(
            image_size(&run_args(&["--netnews-full", "--image-size", "2G"])),
            2 << 30
        );
        assert_eq!(fit_disk(4 << 30, None), 4 << 30);
        assert_eq!(fit_disk(4 << 30, Some((1 << 30) + 12345)), 1 << 30);
        assert_eq!(fit_disk(1 << 20, Some(8 << 30)), 1 << 20);
    }

    #[test]
    fn a_plan_names_its_targets_workloads_and_repetitions() {
        let listing = crate::registry::sample();
        let a = run_args(&[
            "--targets",
            "ext4,cairn-sync",
            "--workloads",
            "smallfile,micro",
        ]);
        let plan = Plan::of(&a, &listing, false).unwrap();
        let names: Vec<&str> = plan.targets.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["ext4", "cairn-sync"]);
        assert!(!plan.all);
        // The paper suite repeats the short workloads three times, the sweep once.
        assert_eq!(plan.reps_of("smallfile"), 3);
        assert_eq!(plan.reps_of("micro"), 1);
        assert_eq!(plan.reps(), 3);
        let a = run_args(&["--workloads", "smallfile", "--reps", "0"]);
        let plan = Plan::of(&a, &listing, false).unwrap();
        assert_eq!(plan.reps_of("smallfile"), 1, "at least one repetition");
        assert!(plan.all);
        assert!(Plan::of(&run_args(&["--workloads", "nosuch"]), &listing, false).is_err());
        let _ = Suite::Quick;
    }

    #[test]
    fn progress_lines_say_what_failed_and_stay_short() {
        let t = TargetSpec::parse_with("ext4", &crate::registry::sample()).unwrap();
        let mut rec = Record::ran("smallfile", "ext4", 2, Vec::new());
        rec.error = Some("mount failed".into());
        assert_eq!(
            progress_line(&rec, &t, 3, 1.0),
            "[rep 2/3] smallfile on ext4: FAILED: mount failed"
        );
        rec.error = None;
        let phase = crate::workload::PhaseResult {
            phase: "x".repeat(400),
            ops: 10.0,
            unit: "files".into(),
            secs: 1.0,
            rate: 10.0,
            counters: None,
            param: None,
            extra: serde_json::Value::Null,
            cold: None,
        };
        rec.phases = vec![phase];
        let line = progress_line(&rec, &t, 3, 12.4);
        assert!(
            line.starts_with("[rep 2/3] smallfile on ext4 (12 s): xxx"),
            "{line}"
        );
        assert_eq!(line.chars().count(), 300);
        assert!(line.ends_with("..."));
    }
}
