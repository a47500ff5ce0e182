//! A campaign: every mode × workload recorded, its crash states generated and checked in
//! parallel, the results compared with the modes' expectations, failures saved as
//! reproducers.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::Error;
use crate::check::{Checker, StateOutcome};
use crate::modes::{self, Expectation};
use crate::record::{self, Recording};
use crate::report::{self, CellResult, FirstFailure, Repro};
use crate::states::{self, CrashState, GenOptions};
use crate::workload::{self, ImageSpec, Workload};

/// Options of [`run`].
#[derive(Clone, Debug)]
pub struct CampaignOptions {
    pub modes: Vec<String>,
    pub workloads: Vec<Workload>,
    /// Recordings made with `cairn mount -o record=FILE`, checked as extra workloads in the
    /// mode they were recorded in.
    pub recordings: Vec<PathBuf>,
    /// Total crash states to check, spread over every mode × workload.
    pub states: usize,
    pub seed: u64,
    pub torn: bool,
    pub threads: usize,
    pub image: ImageSpec,
    /// Where to save reproducers of unexpected states (none when `None`).
    pub repro_dir: Option<PathBuf>,
    /// At most this many reproducers per mode × workload.
    pub repros_per_cell: usize,
}

impl Default for CampaignOptions {
    fn default() -> Self {
        CampaignOptions {
            modes: modes::registered().iter().map(|s| s.to_string()).collect(),
            workloads: workload::all(),
            recordings: Vec::new(),
            states: 100_000,
            seed: 1,
            torn: true,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            image: ImageSpec::default(),
            repro_dir: None,
            repros_per_cell: 3,
        }
    }
}

/// Progress of a running campaign.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
    pub unexpected: u64,
}

/// The outcome of a campaign.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CampaignResult {
    pub cells: Vec<CellResult>,
    /// Every way the campaign failed its expectations (empty: passed).
    pub verdicts: Vec<String>,
    pub seconds: f64,
    pub threads: usize,
    pub states: u64,
    /// Crash states checked per second per thread (recording excluded).
    pub states_per_sec_per_thread: f64,
    #[serde(skip)]
    pub expectations: Vec<Expectation>,
}

impl CampaignResult {
    pub fn passed(&self) -> bool {
        self.verdicts.is_empty()
    }

    pub fn markdown(&self) -> String {
        let rate = format!(
            "{} states in {:.1} s on {} thread(s): {:.0} states/s per thread.",
            self.states, self.seconds, self.threads, self.states_per_sec_per_thread
        );
        report::markdown(&self.cells, &self.expectations, &self.verdicts, &rate)
    }
}

struct Job {
    rec: Recording,
    expect: Expectation,
    scripted: bool,
    states: Vec<CrashState>,
    capacity: u64,
}

/// Runs a campaign. `progress` is called from worker threads as states complete.
pub fn run(
    opts: &CampaignOptions,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<CampaignResult, Error> {
    let mut expects = Vec::new();
    for m in &opts.modes {
        let e = modes::expectation(m).ok_or_else(|| {
            Error::Config(format!(
                "mode '{m}' declares no crash expectations (crates/crash/src/modes.rs)"
            ))
        })?;
        if !modes::known(m) {
            return Err(Error::Config(format!("unknown mode '{m}'")));
        }
        expects.push(e);
    }
    let mut jobs = record_jobs(opts, &expects)?;
    spread_states(&mut jobs, opts);
    let total: u64 = jobs.iter().map(|j| j.states.len() as u64).sum();
    let done = AtomicU64::new(0);
    let bad = AtomicU64::new(0);
    let cells: Mutex<Vec<Option<CellResult>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let errors: Mutex<Vec<Error>> = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    let t0 = Instant::now();
    // Largest jobs first, so the last thread does not finish alone on a big one.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(jobs[i].states.len()));
    std::thread::scope(|s| {
        for _ in 0..opts.threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&k) = order.get(i) else { break };
                    let j = &jobs[k];
                    match run_job(j, opts, &done, &bad, total, progress) {
                        Ok(c) => cells.lock().unwrap_or_else(|e| e.into_inner())[k] = Some(c),
                        Err(e) => errors.lock().unwrap_or_else(|e| e.into_inner()).push(e),
                    }
                }
            });
        }
    });
    if let Some(e) = errors
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .next()
    {
        return Err(e);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cells: Vec<CellResult> = cells
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect();
    let mut verdicts = Vec::new();
    for c in &cells {
        if c.unexpected > 0 {
            verdicts.push(format!(
                "mode {} / {}: {} unexpected state(s) of {}{}",
                c.mode,
                c.workload,
                c.unexpected,
                c.states,
                c.first
                    .as_ref()
                    .map_or(String::new(), |f| format!("; {}", f.describe()))
            ));
        }
    }
    for e in &expects {
        if let Some(v) = report::demonstrated(&cells, e) {
            verdicts.push(v);
        }
    }
    let threads = opts.threads.max(1);
    Ok(CampaignResult {
        states: total,
        states_per_sec_per_thread: total as f64 / seconds.max(1e-9) / threads as f64,
        cells,
        verdicts,
        seconds,
        threads,
        expectations: expects,
    })
}

/// Every mode × workload recorded (on `opts.threads` threads), then the recordings given
/// on the command line: the jobs, each with the states it could yield (`capacity`).
fn record_jobs(opts: &CampaignOptions, expects: &[Expectation]) -> Result<Vec<Job>, Error> {
    // Record everything first: the state budget goes where the states are.
    let specs: Vec<(usize, usize)> = (0..opts.modes.len())
        .flat_map(|m| (0..opts.workloads.len()).map(move |w| (m, w)))
        .collect();
    let recorded: Mutex<Vec<Option<Result<Job, Error>>>> =
        Mutex::new((0..specs.len()).map(|_| None).collect());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..opts.threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(m, w)) = specs.get(i) else { break };
                    let wl = &opts.workloads[w];
                    let r = workload::record(wl, &opts.modes[m], &opts.image).map(|rec| Job {
                        capacity: capacity(&rec, opts.torn),
                        rec,
                        expect: expects[m].clone(),
                        scripted: wl.is_scripted(),
                        states: Vec::new(),
                    });
                    recorded.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                }
            });
        }
    });
    let mut jobs = Vec::new();
    for r in recorded.into_inner().unwrap_or_else(|e| e.into_inner()) {
        jobs.push(r.expect("every job recorded")?);
    }
    for p in &opts.recordings {
        let rec = record::load(p)?;
        let expect = modes::expectation(&rec.header.mode).ok_or_else(|| {
            Error::Config(format!(
                "{}: mode '{}' declares no crash expectations",
                p.display(),
                rec.header.mode
            ))
        })?;
        jobs.push(Job {
            capacity: capacity(&rec, opts.torn),
            rec,
            expect,
            scripted: false,
            states: Vec::new(),
        });
    }
    Ok(jobs)
}

/// Shares `opts.states` among the jobs and generates each one's crash states.
fn spread_states(jobs: &mut [Job], opts: &CampaignOptions) {
    // Spread the budget: every job gets an equal share, small ones give theirs away.
    let caps: Vec<u64> = jobs.iter().map(|j| j.capacity).collect();
    let mut shares = states::water_fill(&caps, opts.states as u64);
    // The capacities are estimates (torn masks and duplicates make an epoch yield fewer
    // states than its share): what a job could not use goes to the jobs that used all of
    // theirs, a few rounds.
    for round in 0..4 {
        for (k, (j, &n)) in jobs.iter_mut().zip(&shares).enumerate() {
            if round > 0 && !j.states.is_empty() {
                continue;
            }
            let ep = states::epochs(&j.rec);
            j.states = states::generate(
                &ep,
                &GenOptions {
                    states: n.max(1) as usize,
                    seed: opts.seed.wrapping_add(k as u64 * 7919),
                    torn: opts.torn,
                    sectors: j.rec.header.block_size / 512,
                    ..Default::default()
                },
            );
        }
        let made: u64 = jobs.iter().map(|j| j.states.len() as u64).sum();
        let short = (opts.states as u64).saturating_sub(made);
        // "Used all of it" within 2%: dedup and torn-mask collisions cost a few states.
        let full: Vec<usize> = (0..jobs.len())
            .filter(|&k| jobs[k].states.len() as u64 >= shares[k] - shares[k] / 50)
            .collect();
        if short == 0 || full.is_empty() || round == 3 {
            break;
        }
        for k in full.iter().copied() {
            shares[k] += short.div_ceil(full.len() as u64);
            // Regenerate this job with its larger share in the next round.
            jobs[k].states.clear();
        }
    }
}

fn capacity(rec: &Recording, torn: bool) -> u64 {
    let ep = states::epochs(rec);
    ep.iter()
        .map(|e| {
            let n = e.writes.len() as u32;
            let sub = if n >= 40 { 1u64 << 40 } else { 1u64 << n };
            sub.saturating_add(if torn { 4 * n as u64 } else { 0 })
        })
        .fold(1u64, |a, b| a.saturating_add(b))
}

fn run_job(
    j: &Job,
    opts: &CampaignOptions,
    done: &AtomicU64,
    bad: &AtomicU64,
    total: u64,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<CellResult, Error> {
    let t0 = Instant::now();
    let checker = Checker::new(j.rec.clone(), j.expect.clone())?;
    let mut cell = CellResult {
        mode: j.rec.header.mode.clone(),
        workload: j.rec.header.workload.clone(),
        scripted: j.scripted,
        ..Default::default()
    };
    let mut saved = 0usize;
    let mut save_err = None;
    checker.check_all(&j.states, |st, out| {
        let unexpected = out.unexpected(&j.expect);
        cell.add(
            out.class,
            !out.violations.is_empty(),
            !out.stale.is_empty(),
            unexpected,
        );
        if unexpected {
            bad.fetch_add(1, Ordering::Relaxed);
            if cell.first.is_none() {
                cell.first = Some(first_failure(&checker, st, out, cell.states - 1));
            }
            if cell.failures.len() < 5 {
                cell.failures.push(describe_failure(&checker, st, out));
            }
            if let Some(dir) = &opts.repro_dir
                && saved < opts.repros_per_cell
            {
                saved += 1;
                match save_repro(&checker, st, out, opts.seed, dir, saved) {
                    Ok(p) => cell.reproducers.push(p.display().to_string()),
                    Err(e) => save_err = Some(e),
                }
            }
        }
        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
        if d.is_multiple_of(64) || d == total {
            progress(Progress {
                done: d,
                total,
                unexpected: bad.load(Ordering::Relaxed),
            });
        }
    });
    if let Some(e) = save_err {
        return Err(e);
    }
    cell.seconds = t0.elapsed().as_secs_f64();
    Ok(cell)
}

/// The report of a cell's first unexpected state (`checked_before` states came before it).
pub fn first_failure(
    c: &Checker,
    st: &CrashState,
    out: &StateOutcome,
    checked_before: u64,
) -> FirstFailure {
    FirstFailure {
        workload: c.rec.header.workload.clone(),
        epoch: st.epoch,
        checked_before,
        state: format!(
            "{} [{:?}] ({})",
            st.describe(&c.epochs),
            out.class,
            c.describe_point(out.crash_point)
        ),
        what: out.reasons(&c.expect).into_iter().take(3).collect(),
        prefix: c.op_prefix(out.crash_point),
        calls: c.op_prefix(usize::MAX).len(),
    }
}

/// One line for a failing state: where the crash was, and what was wrong.
pub fn describe_failure(c: &Checker, st: &CrashState, out: &StateOutcome) -> String {
    format!(
        "{} [{:?}] ({}): {}",
        st.describe(&c.epochs),
        out.class,
        c.describe_point(out.crash_point),
        out.reasons(&c.expect)
            .into_iter()
            .take(3)
            .collect::<Vec<_>>()
            .join("; ")
    )
}

/// Saves a reproducer: the recording up to the end of the state's epoch, with the state
/// and what was found in its header. `cairn crash replay FILE` re-checks it.
pub fn save_repro(
    c: &Checker,
    st: &CrashState,
    out: &StateOutcome,
    seed: u64,
    dir: &Path,
    n: usize,
) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut rec = c.rec.clone();
    rec.events.truncate(c.prefix_end(st));
    rec.header.repro = Some(Repro {
        state: st.clone(),
        seed,
        class: out.class,
        findings: out.findings.iter().map(|f| f.line.clone()).collect(),
        violations: out.violations.clone(),
        point: c.describe_point(out.crash_point),
        prefix: c.op_prefix(out.crash_point),
    });
    let name = format!(
        "{}-{}-{n}.jsonl",
        rec.header.mode,
        rec.header.workload.replace(['/', ' '], "_")
    );
    let p = dir.join(name);
    rec.save(&p)?;
    Ok(p)
}

/// Re-checks a reproducer; returns the outcome and whether the mode's expectations still
/// fail on it.
pub fn replay(path: &Path) -> Result<(Checker, CrashState, StateOutcome, bool), Error> {
    let rec = record::load(path)?;
    let Some(repro) = rec.header.repro.clone() else {
        return Err(Error::Format(format!(
            "{}: a recording, not a reproducer (no crash state in its header)",
            path.display()
        )));
    };
    let expect = modes::expectation(&rec.header.mode).ok_or_else(|| {
        Error::Config(format!(
            "mode '{}' declares no crash expectations",
            rec.header.mode
        ))
    })?;
    let c = Checker::new(rec, expect)?;
    let out = c.check_one(&repro.state);
    let failing = out.unexpected(&c.expect);
    Ok((c, repro.state, out, failing))
}
/// States per planted bug in CI's campaign and by default for `cairn crash run --planted`.
pub const CAMPAIGN_STATES: usize = 1200;

/// The campaign that must catch `p`: its mode over the scripted workloads — or over its own
/// workload alone when that is one written for its design (`workload::designed`) — with a
/// fixed seed, so CI and `cairn crash run --planted` check the same states.
pub fn for_planted(p: &crate::planted::Planted, states: Option<usize>) -> CampaignOptions {
    let mut workloads = crate::workload::scripted_set();
    if !workloads.iter().any(|w| w.name == p.workload) {
        // A workload written for one design's class of state (`workload::designed`): the
        // whole budget goes to it, so every epoch gets its cuts between device writes.
        workloads = crate::workload::by_name(p.workload).into_iter().collect();
    }
    CampaignOptions {
        modes: vec![p.name.to_string()],
        workloads,
        states: states.unwrap_or(CAMPAIGN_STATES),
        seed: 1,
        ..Default::default()
    }
}
