//! Recovery time against what was written since the last checkpoint: a journal's replay is
//! "proportional to the log since the last checkpoint" (001 §5.3), LFS's roll-forward to the
//! data written since its checkpoint (004 §4.2, Table III: 1, 10 and 50 MB of 1, 10 and
//! 100 KB files), while the full scan `cairn fsck` does — what cairn-sync needs after any
//! crash — grows with what is on the disk, whatever was written last.
//!
//! Each point: the checkpoint is held back with mount options the modes already have (a
//! journal whose syncer never runs writes no metadata home, so its checkpoint cannot pass
//! the first change after it: `syncer=`; LFS's `checkpoint_interval=` and `checkpoint_mb=`),
//! metadata and data are written until the log holds the point's amount since the
//! checkpoint, one fsync makes the log durable (a `journal-async` log reaches the disk only
//! through forces), the FUSE daemon is killed (SIGKILL, as the `recovery` workload does), and
//! then are timed: the recovery (the mount, replay or roll-forward, until the root answers;
//! `cairn fsck -y` first for a mode that needs it) and a full read-only `cairn fsck` of the
//! same image. What the recovery replayed comes from the recovering daemon itself: the
//! journal's replay line in its log, LFS's roll-forward counters in `cairn stats`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::recovery::{timed, write_file};
use super::{PhaseResult, Stage, fmt_bytes_human, fmt_size};
use crate::counters::Counters;
use crate::plot::{self, Figures};
use crate::registry::{Commit, Facts, Family, Recovery};
use crate::results::{Meta, Record, Stat};

/// The workload's name.
pub const NAME: &str = "recovery-sweep";

/// Whether the sweep runs on a mode with `facts`: the modes whose recovery reads a log (the
/// journal's sync and async commit, LFS's roll-forward; group commit recovers as sync
/// does), and FFS's synchronous mode, whose recovery is the full scan (the comparison).
pub fn runs_on(facts: &Facts) -> bool {
    match facts.recovery {
        Recovery::LogReplay | Recovery::RollForward => facts.commit != Commit::Group,
        Recovery::None => facts.family == Family::Ffs && facts.commit == Commit::Sync,
    }
}

/// `cairn stats --json` keys (flattened by `Counters`).
const WAL_LAG: &str = "fs.strategy.wal.checkpoint_lag";
const WAL_CAPACITY: &str = "fs.strategy.wal.capacity";
const LFS_LOG_BLOCKS: &str = "fs.lfs.log_blocks";
const LFS_CHECKPOINTS: &str = "fs.lfs.checkpoints";
const LFS_PARTIALS: &str = "fs.lfs.rolled_forward_partials";
const LFS_INODES: &str = "fs.lfs.rolled_forward_inodes";
const LFS_BLOCK: u64 = 4096;

/// A journal's points stop at this fraction of its log area: past 3/4 full the journal
/// checkpoints by itself (the log service's low-water mark), which a point must not meet.
const LOG_FILL_BOUND: f64 = 0.6;

/// What the daemon's log says a journal replay did (`journal: replayed N operations ...`).
const REPLAY_MARK: &str = "journal: replayed ";

/// Far longer than any run: the checkpoint timer and the syncer never fire during a point.
const HOLD_SECS: u64 = 86_400;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Journal (and sync, for comparison): the log since the checkpoint at the crash, in
    /// bytes (sync: the file data written). Points past [`LOG_FILL_BOUND`] of the log area
    /// are replaced by that bound.
    pub log_points: Vec<u64>,
    /// Journal: the data file written in each new directory (a mkdir and a file per step).
    pub file_size: u64,
    /// LFS (004 Table III): file sizes ...
    pub lfs_file_sizes: Vec<u64>,
    /// ... and file data written since the checkpoint, for each size.
    pub lfs_points: Vec<u64>,
    /// Files per directory in the LFS fill.
    pub per_dir: u64,
}

/// `b` × `scale`, whole 4 KiB blocks, 0 staying 0 and nothing else below one block.
fn scaled_bytes(b: u64, scale: f64) -> u64 {
    if b == 0 {
        return 0;
    }
    let v = (b as f64 * scale.max(0.0)).round() as u64;
    (v / 4096 * 4096).max(4096)
}

fn dedup_sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v.dedup();
    v
}

impl Config {
    pub fn paper() -> Config {
        Config::scaled(1.0)
    }

    pub fn scaled(scale: f64) -> Config {
        const MIB: u64 = 1 << 20;
        Config {
            log_points: dedup_sorted(
                [0, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
                    .iter()
                    .map(|&b| scaled_bytes(b, scale))
                    .collect(),
            ),
            file_size: 4096,
            lfs_file_sizes: vec![1 << 10, 10 << 10, 100 << 10],
            lfs_points: dedup_sorted(
                [MIB, 10 * MIB, 50 * MIB]
                    .iter()
                    .map(|&b| scaled_bytes(b, scale))
                    .collect(),
            ),
            per_dir: 256,
        }
    }

    pub fn describe(&self) -> String {
        let list = |v: &[u64]| {
            v.iter()
                .map(|&b| fmt_bytes_human(b))
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "crash (SIGKILL of the FUSE daemon) with the checkpoint held back, then the recovery until the root answers ('recover') and a full read-only `cairn fsck` of the same image ('fsck'); journal: after {} of log since the checkpoint (a mkdir and a {} file per step; bounded by the log area), lfs (004 Table III): after {} of {} files, sync: after the journal's amounts of file data; times in s",
            list(&self.log_points),
            fmt_bytes_human(self.file_size),
            list(&self.lfs_points),
            list(&self.lfs_file_sizes)
        )
    }
}

/// How the target's recovery works, from what its counters show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recovers {
    /// A write-ahead log (`checkpoint_lag`): replay.
    Journal,
    /// A log-structured file system: roll-forward.
    Lfs,
    /// Anything else: a full scan.
    Scan,
}

fn recovers(c: Option<&Counters>) -> Recovers {
    match c {
        Some(c) if c.0.contains_key(WAL_LAG) => Recovers::Journal,
        Some(c) if c.0.contains_key(LFS_LOG_BLOCKS) => Recovers::Lfs,
        _ => Recovers::Scan,
    }
}

fn counter(c: &Option<Counters>, key: &str) -> Result<u64> {
    c.as_ref()
        .and_then(|c| c.0.get(key))
        .map(|v| *v as u64)
        .with_context(|| format!("the target's counters have no {key}"))
}

/// A journal replay's figures from its line in the daemon's log: operations, updates,
/// revoked updates, records of a cut-short operation dropped, blocks written. The last such
/// line of `text` (a log holds every mount's lines).
pub fn parse_replay(text: &str) -> Option<serde_json::Value> {
    let line = text.lines().rev().find(|l| l.contains(REPLAY_MARK))?;
    let tail = &line[line.find(REPLAY_MARK)? + REPLAY_MARK.len()..];
    let nums: Vec<u64> = tail
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect();
    let [ops, updates, revoked, dropped, blocks] = nums[..] else {
        return None;
    };
    Some(serde_json::json!({
        "ops": ops, "updates": updates, "revoked": revoked,
        "dropped_records": dropped, "blocks": blocks,
    }))
}

/// Length of the daemon's log now (what a recovery adds comes after it).
fn log_len(stage: &dyn Stage) -> u64 {
    stage
        .daemon_log()
        .and_then(|p| fs::metadata(p).ok())
        .map_or(0, |m| m.len())
}

/// What the daemon's log gained since `from`.
fn log_since(stage: &dyn Stage, from: u64) -> String {
    let Some(p) = stage.daemon_log() else {
        return String::new();
    };
    let text = fs::read(p).unwrap_or_default();
    String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default()).into_owned()
}

/// Makes everything written so far durable with one fsync of `file` (a journal forces its
/// whole log, LFS writes everything dirty as one partial segment), without a sync(2), which
/// would write the journal's metadata home and checkpoint.
fn fsync(file: &Path) -> Result<()> {
    File::open(file)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("fsync {}", file.display()))
}

/// Journal fill: a directory and a file in it per step until the log holds `target` bytes
/// since the checkpoint (`Scan`: until `target` bytes of file data are written). Returns
/// (steps, file bytes, the last file written).
fn fill_log(
    stage: &dyn Stage,
    dir: &Path,
    target: u64,
    file_size: u64,
    journal: bool,
) -> Result<(u64, u64, Option<std::path::PathBuf>)> {
    let lag = |st: &dyn Stage| -> Result<u64> { counter(&st.counters()?, WAL_LAG) };
    let start = if journal { lag(stage)? } else { 0 };
    let mut now = start;
    let (mut k, mut next_check, mut bytes) = (0u64, 0u64, 0u64);
    let mut last = None;
    loop {
        if !journal {
            if bytes >= target {
                break;
            }
        } else if k >= next_check {
            let l = lag(stage)?;
            ensure!(
                l >= now,
                "the journal checkpointed during the fill (log since the checkpoint went from {now} to {l} bytes): the checkpoint is not held back"
            );
            now = l;
            if now >= target {
                break;
            }
            // Reading the counters costs a process: check about twice per remaining
            // estimate, at least every 256 steps.
            let per_step = (now - start) / k.max(1);
            let step = match per_step {
                0 => 1,
                p => ((target - now) / p / 2).clamp(1, 256),
            };
            next_check = k + step;
        }
        let d = dir.join(format!("d{k:06}"));
        fs::create_dir_all(&d).with_context(|| format!("mkdir {}", d.display()))?;
        let f = d.join("f");
        write_file(&f, file_size, k)?;
        bytes += file_size;
        last = Some(f);
        k += 1;
    }
    Ok((k, bytes, last))
}

/// LFS fill: `target` bytes of `size`-byte files, `per_dir` to a directory.
fn fill_files(
    dir: &Path,
    target: u64,
    size: u64,
    per_dir: u64,
) -> Result<(u64, u64, Option<std::path::PathBuf>)> {
    let n = target.div_ceil(size.max(1));
    let mut last = None;
    for i in 0..n {
        let d = dir.join(format!("d{:05}", i / per_dir.max(1)));
        if i % per_dir.max(1) == 0 {
            fs::create_dir_all(&d).with_context(|| format!("mkdir {}", d.display()))?;
        }
        let f = d.join(format!("f{i:07}"));
        write_file(&f, size, i)?;
        last = Some(f);
    }
    Ok((n, n * size, last))
}

/// One point: crash, recovery, fsck. `group` names the series ("" or "1K files").
struct Point<'a> {
    group: &'a str,
    param: u64,
    /// Facts of the fill (log since the checkpoint, steps, bytes).
    fill: serde_json::Value,
}

fn crash_and_time(
    stage: &mut dyn Stage,
    how: Recovers,
    p: Point,
    out: &mut Vec<PhaseResult>,
) -> Result<()> {
    let mark = log_len(stage);
    stage.crash()?;
    let name = |what: &str| match p.group {
        "" => what.to_string(),
        g => format!("{what} {g}"),
    };
    let mut recover = timed(&name("recover"), || {
        let procedure = stage.recover()?;
        Ok(serde_json::json!({ "procedure": procedure }))
    })?;
    let replayed = match how {
        Recovers::Journal => parse_replay(&log_since(stage, mark))
            // No line: the replay found no record after the checkpoint.
            .unwrap_or_else(|| serde_json::json!({ "ops": 0, "updates": 0, "blocks": 0 })),
        Recovers::Lfs => {
            let c = stage.counters()?;
            serde_json::json!({
                "partial_segments": counter(&c, LFS_PARTIALS)?,
                "inodes": counter(&c, LFS_INODES)?,
            })
        }
        Recovers::Scan => serde_json::Value::Null,
    };
    let mut fsck = timed(&name("fsck"), || {
        Ok(stage.fsck()?.unwrap_or(serde_json::Value::Null))
    })?;
    // The check must find the recovered image exactly as the mode promises: the journal and
    // LFS leak nothing (000 Table 3), so a leak is as much a failure as a corruption.
    if how != Recovers::Scan {
        let leaks = fsck
            .extra
            .get("leaks")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let clean = fsck.extra.get("clean").and_then(|v| v.as_bool());
        if leaks > 0 || clean == Some(false) {
            bail!(
                "the image recovered after {} since the checkpoint is not clean: {}",
                fmt_bytes_human(p.param),
                fsck.extra
            );
        }
    }
    let fsck_report = std::mem::take(&mut fsck.extra);
    let mut extra = p.fill;
    if let Some(m) = extra.as_object_mut() {
        m.insert("procedure".into(), recover.extra["procedure"].take());
        m.insert("replayed".into(), replayed);
        m.insert(
            "fsck".into(),
            serde_json::json!({
                "clean": fsck_report.get("clean"),
                "leaks": fsck_report.get("leaks"),
                "corruptions": fsck_report.get("corruptions"),
            }),
        );
    }
    for mut ph in [recover, fsck] {
        ph.param = Some(p.param as f64);
        ph.extra = extra.clone();
        out.push(ph);
    }
    Ok(())
}

pub fn run(stage: &mut dyn Stage, cfg: &Config) -> Result<Vec<PhaseResult>> {
    ensure!(cfg.per_dir > 0, "{NAME}: per_dir must be positive");
    ensure!(cfg.file_size > 0, "{NAME}: file_size must be positive");
    let how = recovers(stage.counters()?.as_ref());
    match how {
        Recovers::Journal => stage.remount_with(&format!("syncer={HOLD_SECS}"))?,
        Recovers::Lfs => stage.remount_with(&format!(
            "checkpoint_interval={HOLD_SECS},checkpoint_mb={}",
            1u64 << 20
        ))?,
        Recovers::Scan => {}
    }
    let mut out = Vec::new();
    match how {
        Recovers::Journal | Recovers::Scan => {
            let journal = how == Recovers::Journal;
            let mut points = cfg.log_points.clone();
            if journal {
                let cap = counter(&stage.counters()?, WAL_CAPACITY)?;
                let bound = ((cap as f64 * LOG_FILL_BOUND) as u64) / 4096 * 4096;
                if points.iter().any(|&p| p > bound) {
                    points.retain(|&p| p <= bound);
                    points.push(bound);
                }
            }
            for (i, &target) in points.iter().enumerate() {
                let dir = stage.dir().join(format!("p{i:02}"));
                let (steps, bytes, last) = fill_log(&*stage, &dir, target, cfg.file_size, journal)?;
                if let Some(f) = &last {
                    fsync(f)?;
                }
                let log_bytes = if journal {
                    Some(counter(&stage.counters()?, WAL_LAG)?)
                } else {
                    None
                };
                let fill = serde_json::json!({
                    "log_bytes": log_bytes, "steps": steps, "data_bytes": bytes,
                });
                let p = Point {
                    group: "",
                    param: target,
                    fill,
                };
                crash_and_time(stage, how, p, &mut out)?;
            }
        }
        Recovers::Lfs => {
            for &size in &cfg.lfs_file_sizes {
                let group = format!("{} files", fmt_size(size as f64));
                for (i, &target) in cfg.lfs_points.iter().enumerate() {
                    let dir = stage.dir().join(format!("s{size}-p{i:02}"));
                    let before = stage.counters()?;
                    let (files, bytes, last) = fill_files(&dir, target, size, cfg.per_dir)?;
                    if let Some(f) = &last {
                        fsync(f)?;
                    }
                    let after = stage.counters()?;
                    let cps =
                        counter(&after, LFS_CHECKPOINTS)? - counter(&before, LFS_CHECKPOINTS)?;
                    ensure!(
                        cps == 0,
                        "lfs checkpointed {cps} time(s) during the fill: the checkpoint is not held back"
                    );
                    let blocks =
                        counter(&after, LFS_LOG_BLOCKS)? - counter(&before, LFS_LOG_BLOCKS)?;
                    let fill = serde_json::json!({
                        "log_bytes": blocks * LFS_BLOCK, "steps": files, "data_bytes": bytes,
                        "file_size": size,
                    });
                    let p = Point {
                        group: &group,
                        param: target,
                        fill,
                    };
                    crash_and_time(stage, how, p, &mut out)?;
                }
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Tables and plot.

/// One row of a target's table: a group ("" or "1K files") and an amount, over repetitions.
#[derive(Debug, Default)]
struct Row {
    log_bytes: Vec<f64>,
    recover: Vec<f64>,
    fsck: Vec<f64>,
    replayed: String,
    procedure: String,
    fsck_verdict: String,
}

/// The group of a phase name: what follows "recover " or "fsck ".
fn split_phase(phase: &str) -> Option<(bool, &str)> {
    let (what, rest) = phase.split_once(' ').unwrap_or((phase, ""));
    match what {
        "recover" => Some((true, rest)),
        "fsck" => Some((false, rest)),
        _ => None,
    }
}

fn replayed_text(v: &serde_json::Value) -> String {
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64());
    if let (Some(ops), Some(updates), Some(blocks)) = (n("ops"), n("updates"), n("blocks")) {
        return format!("{ops} ops, {updates} updates, {blocks} blocks");
    }
    if let (Some(p), Some(i)) = (n("partial_segments"), n("inodes")) {
        return format!("{p} partial segments, {i} inodes");
    }
    String::new()
}

fn fsck_text(v: &serde_json::Value) -> String {
    match (
        v.get("clean").and_then(|x| x.as_bool()),
        v.get("leaks").and_then(|x| x.as_u64()),
    ) {
        (Some(true), _) => "clean".into(),
        (_, Some(l)) if l > 0 => format!("{l} leaks"),
        (Some(false), _) => "not clean".into(),
        _ => String::new(),
    }
}

/// A row's key: the group's file size (0 for none: LFS groups by it, smallest first), the
/// group, the amount.
type Key = (u64, String, u64);

/// Per target, its rows keyed by [`Key`], in that order.
fn rows(records: &[Record], target: &str) -> BTreeMap<Key, Row> {
    let mut out: BTreeMap<Key, Row> = BTreeMap::new();
    for r in records
        .iter()
        .filter(|r| r.workload == NAME && r.target == target && r.error.is_none())
    {
        for p in &r.phases {
            let (Some((is_recover, group)), Some(param)) = (split_phase(&p.phase), p.param) else {
                continue;
            };
            let size = p
                .extra
                .get("file_size")
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            let row = out
                .entry((size, group.to_string(), param as u64))
                .or_default();
            if is_recover {
                row.recover.push(p.secs);
                if let Some(l) = p.extra.get("log_bytes").and_then(|v| v.as_f64()) {
                    row.log_bytes.push(l);
                }
                if row.replayed.is_empty() {
                    row.replayed = p
                        .extra
                        .get("replayed")
                        .map(replayed_text)
                        .unwrap_or_default();
                }
                if row.procedure.is_empty() {
                    row.procedure = p.extra["procedure"].as_str().unwrap_or_default().into();
                }
            } else {
                row.fsck.push(p.secs);
                if row.fsck_verdict.is_empty() {
                    row.fsck_verdict = p.extra.get("fsck").map(fsck_text).unwrap_or_default();
                }
            }
        }
    }
    out
}

/// A plot's (x, y) points.
type Points = Vec<(f64, f64)>;

fn sorted(mut pts: Points) -> Points {
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts
}

fn med(v: &[f64]) -> Option<f64> {
    Stat::of(v).map(|s| s.median)
}

fn secs(v: &[f64]) -> String {
    match Stat::of(v) {
        None => "—".into(),
        Some(s) if s.n > 1 => format!("{:.3} ({:.3}–{:.3})", s.median, s.min, s.max),
        Some(s) => format!("{:.3}", s.median),
    }
}

/// The sweep's section: a table per target and one plot of recovery (and fsck) time against
/// the log since the checkpoint, written into `dir`.
pub fn render(s: &mut String, figures: &Figures, meta: &Meta, records: &[Record]) -> Result<()> {
    let _ = writeln!(
        s,
        "\n### Recovery time against the log since the checkpoint (001 §5.3, 004 Table III)\n\nEach row: the checkpoint held back, that much written, SIGKILL; 'recover' is the mount until the root answers (the journal's replay, LFS's roll-forward; cairn-sync: `cairn fsck -y`, mount), 'fsck' a full read-only `cairn fsck` of the same image (what cairn-sync needs after any crash). 'fsck after' is that check's verdict on the recovered image."
    );
    // Two plots: the targets with one series (journal, sync) and those with one per file
    // size (LFS), whose 004 Table III axis reaches far further.
    let mut series = Vec::new();
    let mut grouped = Vec::new();
    for t in &meta.targets {
        let rs = rows(records, t);
        if rs.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "\n#### {t}\n\n| files | written since checkpoint | log since checkpoint | recover (s) | fsck (s) | fsck ÷ recover | replayed | fsck after |\n|---|---:|---:|---:|---:|---:|---|---|"
        );
        // Recovery and the full check per group (LFS: per file size).
        let mut by_group: Vec<(&str, Points, Points)> = Vec::new();
        for ((_, group, param), r) in &rs {
            let log = med(&r.log_bytes);
            let ratio = match (med(&r.fsck), med(&r.recover)) {
                (Some(f), Some(rc)) if rc > 0.0 => format!("{f:.2}×", f = f / rc),
                _ => "—".into(),
            };
            let replayed = if r.replayed.is_empty() {
                r.procedure.clone()
            } else {
                r.replayed.clone()
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                if group.is_empty() { "—" } else { group },
                fmt_bytes_human(*param),
                log.map_or("—".into(), |l| fmt_bytes_human(l as u64)),
                secs(&r.recover),
                secs(&r.fsck),
                ratio,
                replayed,
                if r.fsck_verdict.is_empty() {
                    "—"
                } else {
                    &r.fsck_verdict
                },
            );
            // x: the log actually there at the crash; a scan-recovered target has no log,
            // its x is the data written.
            let x = log.unwrap_or(*param as f64);
            if by_group.last().is_none_or(|(g, _, _)| g != group) {
                by_group.push((group, Vec::new(), Vec::new()));
            }
            if let Some((_, rec, fsck)) = by_group.last_mut() {
                rec.extend(med(&r.recover).map(|v| (x, v)));
                fsck.extend(med(&r.fsck).map(|v| (x, v)));
            }
        }
        for (group, rec, fsck) in by_group {
            let (name, to) = match group {
                "" => (t.clone(), &mut series),
                g => (format!("{t} {g}"), &mut grouped),
            };
            for (what, pts) in [("recover", rec), ("fsck", fsck)] {
                to.push(plot::Series {
                    label: format!("{name} {what}"),
                    points: sorted(pts),
                    spread: None,
                });
            }
        }
    }
    if series.is_empty() && grouped.is_empty() {
        return Ok(());
    }
    let _ = writeln!(
        s,
        "\n*Seconds, median (min–max) over repetitions; 'written since checkpoint' is the point asked for (journal: log bytes; lfs: file data; sync: file data), 'log since checkpoint' what the log held at the crash.*"
    );
    for (file, title, series) in [
        (
            format!("{NAME}.png"),
            "recovery time vs log since the checkpoint (001 §5.3)",
            series,
        ),
        (
            format!("{NAME}-by-file-size.png"),
            "roll-forward time vs log since the checkpoint, per file size (004 Table III)",
            grouped,
        ),
    ] {
        if series.is_empty() {
            continue;
        }
        figures.line(
            s,
            NAME,
            &file,
            &plot::LinePlot {
                title: title.into(),
                x_label: "log since the checkpoint at the crash (sync: data written)".into(),
                y_label: "seconds".into(),
                x_log: false,
                y_log: false,
                x_fmt: plot::XFormat::Bytes,
                series,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_points() {
        let p = Config::paper();
        assert_eq!(p.log_points, [0, 1 << 20, 4 << 20, 16 << 20, 64 << 20]);
        assert_eq!(p.lfs_points, [1 << 20, 10 << 20, 50 << 20]);
        assert_eq!(p.lfs_file_sizes, [1024, 10240, 102400]);
        let q = Config::scaled(0.001);
        // 0 stays, the rest at least one block, no duplicates.
        assert_eq!(q.log_points, [0, 4096, 16384, 65536]);
        assert_eq!(q.lfs_points, [4096, 8192, 49152]);
        assert!(q.describe().contains("0 KiB, 4 KiB, 16 KiB, 64 KiB of log"));
        assert_eq!(Config::scaled(-1.0).lfs_points, [4096]);
    }

    #[test]
    fn replay_line_parses() {
        let log = "[.. INFO  cairn::mount] mounted fs.img\n[2026-11-24T09:31:27.712Z INFO  cairn_ffs::strategy::journal] journal: replayed 301 operations (3277 updates, 0 revoked, 2 records of a cut-short operation dropped) onto 352 blocks\n";
        let v = parse_replay(log).unwrap();
        assert_eq!(v["ops"], 301);
        assert_eq!(v["updates"], 3277);
        assert_eq!(v["dropped_records"], 2);
        assert_eq!(v["blocks"], 352);
        assert_eq!(replayed_text(&v), "301 ops, 3277 updates, 352 blocks");
        assert!(parse_replay("mounted\n").is_none());
        assert!(parse_replay("journal: replayed 3 operations\n").is_none());
    }

    #[test]
    fn plain_directory_fills_then_cannot_crash() {
        let d = tempfile::tempdir().unwrap();
        let (steps, bytes, last) = fill_log(
            &super::super::PlainDir::new(d.path()),
            &d.path().join("p"),
            10_000,
            4096,
            false,
        )
        .unwrap();
        assert_eq!((steps, bytes), (3, 12288));
        assert_eq!(fs::metadata(last.unwrap()).unwrap().len(), 4096);
        let (n, b, _) = fill_files(&d.path().join("l"), 5000, 1024, 2).unwrap();
        assert_eq!((n, b), (5, 5120));
        assert_eq!(fs::read_dir(d.path().join("l")).unwrap().count(), 3);
        // No counters: a scan target; a plain directory cannot crash, and says so.
        let mut st = super::super::PlainDir::new(d.path());
        let e = run(&mut st, &Config::scaled(0.001)).unwrap_err();
        assert!(format!("{e:#}").contains("crash"), "{e:#}");
    }

    /// A file system in a directory that pretends to be an LFS: its counters have the
    /// roll-forward's keys, its crash and recovery do nothing, its check reports `leaks`.
    struct FakeLfs {
        dir: tempfile::TempDir,
        leaks: u64,
        remounted: Option<String>,
    }

    impl Stage for FakeLfs {
        fn dir(&self) -> std::path::PathBuf {
            self.dir.path().to_path_buf()
        }
        fn counters(&self) -> Result<Option<Counters>> {
            Ok(Some(Counters::from_json(
                &serde_json::json!({"fs": {"lfs": {
                    "log_blocks": 9, "checkpoints": 0,
                    "rolled_forward_partials": 1, "rolled_forward_inodes": 2,
                }}}),
            )))
        }
        fn make_cold(&mut self) -> Result<()> {
            Ok(())
        }
        fn crash(&mut self) -> Result<()> {
            Ok(())
        }
        fn recover(&mut self) -> Result<String> {
            Ok("mount".into())
        }
        fn fsck(&mut self) -> Result<Option<serde_json::Value>> {
            Ok(Some(serde_json::json!({
                "clean": self.leaks == 0, "leaks": self.leaks, "corruptions": 0,
            })))
        }
        fn remount_with(&mut self, opts: &str) -> Result<()> {
            self.remounted = Some(opts.to_string());
            Ok(())
        }
    }

    /// The journal and LFS leak nothing after a crash (000 Table 3): a recovered image whose
    /// check finds a leak fails the point, never a quiet row.
    #[test]
    fn a_recovered_image_with_leaks_fails_the_point() {
        let cfg = Config {
            lfs_file_sizes: vec![1024],
            lfs_points: vec![4096],
            ..Config::scaled(0.001)
        };
        let mut clean = FakeLfs {
            dir: tempfile::tempdir().unwrap(),
            leaks: 0,
            remounted: None,
        };
        let r = run(&mut clean, &cfg).unwrap();
        assert!(clean.remounted.unwrap().starts_with("checkpoint_interval="));
        assert_eq!(
            r.iter().map(|p| p.label()).collect::<Vec<_>>(),
            ["recover 1K files 4K", "fsck 1K files 4K"]
        );
        assert_eq!(r[0].extra["replayed"]["inodes"], 2);
        assert_eq!(r[1].extra["fsck"]["clean"], true);
        let mut leaky = FakeLfs {
            dir: tempfile::tempdir().unwrap(),
            leaks: 2,
            remounted: None,
        };
        let e = run(&mut leaky, &cfg).unwrap_err();
        assert!(format!("{e:#}").contains("not clean"), "{e:#}");
    }

    fn phase(name: &str, param: u64, secs: f64, extra: serde_json::Value) -> PhaseResult {
        PhaseResult {
            phase: name.into(),
            ops: 1.0,
            unit: "s".into(),
            secs,
            rate: 1.0 / secs,
            counters: None,
            param: Some(param as f64),
            extra,
            cold: None,
        }
    }

    fn record(target: &str, rep: u32, phases: Vec<PhaseResult>) -> Record {
        Record::ran(NAME, target, rep, phases)
    }

    #[test]
    fn tables_per_target_with_replay_and_verdict() {
        let clean = serde_json::json!({"clean": true, "leaks": 0, "corruptions": 0});
        let j = |log: u64, ops: u64| {
            serde_json::json!({
                "log_bytes": log, "procedure": "mount", "fsck": clean,
                "replayed": {"ops": ops, "updates": ops * 10, "blocks": ops * 2},
            })
        };
        let l = serde_json::json!({
            "log_bytes": 2 << 20, "procedure": "mount", "file_size": 1024,
            "replayed": {"partial_segments": 7, "inodes": 1025},
            "fsck": {"clean": false, "leaks": 3, "corruptions": 0},
        });
        let l10 = serde_json::json!({
            "log_bytes": 1 << 20, "procedure": "mount", "file_size": 10240,
            "replayed": {"partial_segments": 3, "inodes": 100},
        });
        let records = vec![
            record(
                "cairn-journal",
                0,
                vec![
                    phase("recover", 0, 0.05, j(0, 0)),
                    phase("fsck", 0, 0.5, j(0, 0)),
                    phase("recover", 4 << 20, 0.2, j(4 << 20, 900)),
                    phase("fsck", 4 << 20, 0.6, j(4 << 20, 900)),
                ],
            ),
            record(
                "cairn-journal",
                1,
                vec![phase("recover", 4 << 20, 0.4, j(4 << 20, 900))],
            ),
            record(
                "cairn-lfs",
                0,
                vec![
                    phase("recover 10K files", 1 << 20, 0.2, l10),
                    phase("recover 1K files", 1 << 20, 0.1, l.clone()),
                    phase("fsck 1K files", 1 << 20, 0.3, l),
                ],
            ),
            Record {
                error: Some("boom".into()),
                ..record("cairn-sync", 0, vec![phase("recover", 0, 9.0, j(0, 0))])
            },
        ];
        let meta = Meta {
            targets: vec![
                "cairn-journal".into(),
                "cairn-lfs".into(),
                "cairn-sync".into(),
            ],
            workloads: vec![NAME.into()],
            ..Meta::default()
        };
        let d = tempfile::tempdir().unwrap();
        let mut s = String::new();
        render(&mut s, &Figures::beside(d.path()), &meta, &records).unwrap();
        assert!(s.contains("#### cairn-journal\n"), "{s}");
        assert!(
            s.contains("| — | 0 KiB | 0 KiB | 0.050 | 0.500 | 10.00× | 0 ops, 0 updates, 0 blocks | clean |"),
            "{s}"
        );
        // Two repetitions of the 4 MiB point: median (min–max); fsck from the one that has it.
        assert!(
            s.contains("| — | 4 MiB | 4 MiB | 0.300 (0.200–0.400) | 0.600 | 2.00× | 900 ops, 9000 updates, 1800 blocks | clean |"),
            "{s}"
        );
        assert!(
            s.contains("| 1K files | 1 MiB | 2 MiB | 0.100 | 0.300 | 3.00× | 7 partial segments, 1025 inodes | 3 leaks |"),
            "{s}"
        );
        // LFS's groups by file size, smallest first (not as strings: "10K" < "1K").
        let small = s.find("| 1K files |").unwrap();
        assert!(
            s.find("| 10K files | 1 MiB | 1 MiB | 0.200 | — | — |")
                .unwrap()
                > small,
            "{s}"
        );
        // A failed repetition has no row.
        assert!(!s.contains("#### cairn-sync"), "{s}");
        assert!(s.contains("![recovery-sweep](recovery-sweep.png)"));
        assert!(d.path().join("recovery-sweep.png").exists());
        assert!(s.contains("![recovery-sweep](recovery-sweep-by-file-size.png)"));
        assert!(d.path().join("recovery-sweep-by-file-size.png").exists());
        // Nothing to show: no section body, no plot.
        let mut empty = String::new();
        let e = tempfile::tempdir().unwrap();
        render(&mut empty, &Figures::beside(e.path()), &meta, &[]).unwrap();
        assert!(!e.path().join("recovery-sweep.png").exists());
    }
}
