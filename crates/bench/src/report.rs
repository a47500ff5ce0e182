//! Results on disk (one JSON record per target × workload × repetition, plus the run's
//! metadata) and the Markdown tables made from them.
//!
//! The machine is shared and noisy, so a rate is only ever compared with a baseline measured in
//! the same run: tables give min/median/max over repetitions and the ratio of medians to the
//! baseline, next to the I/O counts per operation, which do not depend on the noise.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::counters::Counters;
pub use crate::results::{Meta, Record, Stat, baseline_for, load, write_json};
use crate::units::fmt_opt;
pub use crate::units::{fmt_bytes, fmt_factor, fmt_rate};
use crate::workload::PhaseResult;

/// One table row: a target's results for one phase of one workload.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub workload: String,
    pub phase: String,
    pub unit: String,
    pub target: String,
    pub rate: Option<Stat>,
    /// Median rate divided by the baseline's median rate for the same phase.
    pub vs_baseline: Option<f64>,
    pub device_reads_per_op: Option<f64>,
    pub device_writes_per_op: Option<f64>,
    pub device_flushes_per_op: Option<f64>,
    pub device_read_bytes_per_op: Option<f64>,
    pub device_write_bytes_per_op: Option<f64>,
    pub fuse_requests_per_op: Option<f64>,
    /// A journal's own log device (`log=dev:PATH`): its writes and flushes per operation,
    /// apart from the file system device's above (None when the log is in the image).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_device_writes_per_op: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_device_flushes_per_op: Option<f64>,
    /// On a disk model: the share of the phase the model's mechanism was busy (004 §5.1),
    /// and its seeks and rotations waited per operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_busy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_seeks_per_op: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_rotations_per_op: Option<f64>,
    pub failed_reps: usize,
    /// Why there is no number, when there is none.
    pub missing: Option<String>,
}

fn median_of(phases: &[&PhaseResult], f: fn(&Counters) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = phases.iter().filter_map(|p| p.per_op(f)).collect();
    Stat::of(&v).map(|s| s.median)
}

/// Summarizes the records into rows, in the run's workload and target order.
pub fn summarize(meta: &Meta, records: &[Record]) -> Vec<Row> {
    let mut rows = Vec::new();
    for w in &meta.workloads {
        // Phases in the order the workload runs them, from any record that has them.
        let mut phases: Vec<(String, String)> = Vec::new();
        for r in records.iter().filter(|r| &r.workload == w) {
            for p in &r.phases {
                let l = p.label();
                if !phases.iter().any(|(n, _)| n == &l) {
                    phases.push((l, p.unit.clone()));
                }
            }
        }
        if phases.is_empty() {
            phases.push(("—".into(), String::new()));
        }
        for (phase, unit) in &phases {
            let per_target =
                |t: &str| -> (Vec<&PhaseResult>, usize, Option<String>, Option<String>) {
                    let recs: Vec<&Record> = records
                        .iter()
                        .filter(|r| &r.workload == w && r.target == t)
                        .collect();
                    let ok: Vec<&PhaseResult> = recs
                        .iter()
                        .flat_map(|r| r.phases.iter().filter(|p| &p.label() == phase))
                        .collect();
                    let failed = recs.iter().filter(|r| r.error.is_some()).count();
                    let err = recs.iter().find_map(|r| r.error.clone());
                    let skipped = recs
                        .iter()
                        .flat_map(|r| &r.skipped)
                        .find(|s| s.covers(phase))
                        .map(|s| s.why.clone());
                    (ok, failed, err, skipped)
                };
            let base_of = |t: &str| {
                Stat::of(
                    &per_target(&baseline_for(meta, t))
                        .0
                        .iter()
                        .map(|p| p.rate)
                        .collect::<Vec<_>>(),
                )
            };
            for t in &meta.targets {
                let base = base_of(t);
                let (ok, failed_reps, err, skipped) = per_target(t);
                let rate = Stat::of(&ok.iter().map(|p| p.rate).collect::<Vec<_>>());
                let missing = if rate.is_some() {
                    None
                } else if let Some(why) = meta.skipped.get(t).or(skipped.as_ref()) {
                    Some(format!("not measured: {why}"))
                } else {
                    Some(
                        err.map(|e| format!("failed: {e}"))
                            .unwrap_or_else(|| "not run".into()),
                    )
                };
                rows.push(Row {
                    workload: w.clone(),
                    phase: phase.clone(),
                    unit: unit.clone(),
                    target: t.clone(),
                    vs_baseline: match (&rate, &base) {
                        (Some(r), Some(b)) if b.median > 0.0 => Some(r.median / b.median),
                        _ => None,
                    },
                    rate,
                    device_reads_per_op: median_of(&ok, Counters::device_reads),
                    device_writes_per_op: median_of(&ok, Counters::device_writes),
                    device_flushes_per_op: median_of(&ok, Counters::device_flushes),
                    device_read_bytes_per_op: median_of(&ok, Counters::device_read_bytes),
                    device_write_bytes_per_op: median_of(&ok, Counters::device_write_bytes),
                    fuse_requests_per_op: median_of(&ok, Counters::fuse_requests),
                    log_device_writes_per_op: median_of(&ok, Counters::log_device_writes),
                    log_device_flushes_per_op: median_of(&ok, Counters::log_device_flushes),
                    disk_busy: Stat::of(
                        &ok.iter().filter_map(|p| p.disk_busy()).collect::<Vec<_>>(),
                    )
                    .map(|s| s.median),
                    disk_seeks_per_op: median_of(&ok, Counters::disk_seeks),
                    disk_rotations_per_op: median_of(&ok, Counters::disk_rotations),
                    failed_reps,
                    missing,
                });
            }
        }
    }
    rows
}

/// A commit as the run header shows it: 12 hex digits of a full hash, "+ uncommitted changes"
/// when the tree was dirty at build time, "unknown" when the build could not tell.
fn fmt_commit(commit: Option<&str>, dirty: Option<bool>) -> String {
    let Some(c) = commit else {
        return "unknown".into();
    };
    let short = match c.get(..12) {
        Some(p) if c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit()) => p,
        _ => c,
    };
    match dirty {
        Some(true) => format!("{short} + uncommitted changes"),
        _ => short.to_string(),
    }
}

fn fmt_per_op(v: f64) -> String {
    match v.abs() {
        a if a == 0.0 || a >= 0.01 => format!("{v:.2}"),
        a if a >= 0.0001 => format!("{v:.4}"),
        _ => "<0.0001".into(),
    }
}

/// How one phase's result reads in a progress line: "1,230 files/s", "12.3 s".
pub fn fmt_phase_value(p: &PhaseResult) -> String {
    match p.unit.as_str() {
        "s" => format!("{:.2} s", p.secs),
        "scripts" => format!("{} scripts/h", fmt_rate(p.rate * 3600.0)),
        u => format!("{} {u}/s", fmt_rate(p.rate)),
    }
}

/// Writes a run directory's summary (summary.md, summary.json, the plots) from its records and
/// returns the Markdown: the papers' tables first, then every phase's numbers and counters.
pub fn render(dir: &Path, meta: &Meta, records: &[Record]) -> Result<String> {
    let rows = summarize(meta, records);
    let papers = crate::tables::render(&crate::plot::Figures::beside(dir), meta, records)?;
    let detail = phase_tables(meta, records, &rows);
    let md = format!(
        "{}{papers}\n## Every phase, with counters\n\n{}",
        header(meta, records),
        detail.strip_prefix('\n').unwrap_or(&detail)
    );
    write_json(&dir.join("summary.json"), &rows)?;
    fs::write(dir.join("summary.md"), &md)
        .with_context(|| format!("writing {}", dir.join("summary.md").display()))?;
    Ok(md)
}

/// What `cairn bench run` prints when it is done: how many runs failed, a few lines per paper
/// table with its headline numbers (ratios to the baseline, or seconds), and where the files
/// are. The full tables are in summary.md.
pub fn terminal_summary(out: &Path, meta: &Meta, records: &[Record], secs: f64) -> String {
    const WIDTH: usize = 100;
    let mut s = String::new();
    let failed: Vec<String> = records
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| format!("{} on {}", r.workload, r.target))
        .collect();
    let _ = writeln!(
        s,
        "cairn bench: {} run(s), {} failed, in {}; ratios are to {} in this run (> 1 = faster)",
        records.len(),
        failed.len(),
        fmt_duration(secs),
        meta.baseline
    );
    for h in crate::tables::headlines(meta, records) {
        let what = if h.ratios {
            h.columns.join("/")
        } else {
            format!("{} ({})", h.columns.join("/"), h.unit)
        };
        match h.see {
            Some(see) => {
                let _ = writeln!(s, "  {}: {see}", h.title);
                continue;
            }
            None => {
                let _ = writeln!(s, "  {}, {what}:", h.title);
            }
        }
        if h.rows.is_empty() {
            let why = if h.baseline_measured {
                "no target but the baseline has numbers"
            } else {
                "no numbers for the baseline, so no ratios"
            };
            let _ = writeln!(s, "    {why}");
            continue;
        }
        let items = h.rows.iter().map(|(t, vals)| {
            let v: Vec<String> = vals
                .iter()
                .map(|v| fmt_opt(*v, |x| format!("{x:.2}")))
                .collect();
            format!("{t} {}", v.join("/"))
        });
        let mut line = String::new();
        for item in items {
            if !line.is_empty() && 4 + line.chars().count() + 2 + item.chars().count() > WIDTH {
                let _ = writeln!(s, "    {line}");
                line.clear();
            }
            if !line.is_empty() {
                line.push_str("  ");
            }
            line.push_str(&item);
        }
        let _ = writeln!(s, "    {line}");
    }
    if !failed.is_empty() {
        let mut list: Vec<String> = failed.iter().take(8).cloned().collect();
        if failed.len() > list.len() {
            list.push(format!("{} more", failed.len() - list.len()));
        }
        let _ = writeln!(s, "  failed: {} (errors in summary.md)", list.join(", "));
    }
    let _ = writeln!(
        s,
        "results in {}: summary.md (every table, every phase), summary.json, meta.json and rec-*.json (raw), *.png (plots)",
        out.display()
    );
    s
}

/// "42 s", "12 min 5 s", "1 h 6 min".
fn fmt_duration(secs: f64) -> String {
    let t = secs.max(0.0).round() as u64;
    match t {
        t if t < 120 => format!("{t} s"),
        t if t < 3600 => format!("{} min {} s", t / 60, t % 60),
        t => format!("{} h {} min", t / 3600, t / 60 % 60),
    }
}

/// The Markdown report: a header with the run's conditions, the device's flush rate, then one
/// table per workload.
pub fn markdown(meta: &Meta, records: &[Record]) -> String {
    header(meta, records) + &phase_tables(meta, records, &summarize(meta, records))
}

/// The range of the 1-minute load average over a run's repetitions.
fn load_range(records: &[Record]) -> Option<String> {
    let v: Vec<f64> = records.iter().filter_map(|r| r.load_avg).collect();
    let st = Stat::of(&v)?;
    Some(format!(
        "{:.1}–{:.1} (median {:.1})",
        st.min, st.max, st.median
    ))
}

/// The targets whose cold phases were made cold their own way (`PhaseResult::cold`: the
/// FUSE floor's kernel caches dropped under its daemon), in the run's order, per way: said
/// once in the conditions, so none of their cold numbers reads as a device's.
fn made_cold_otherwise<'a>(meta: &'a Meta, records: &[Record]) -> Vec<(String, Vec<&'a str>)> {
    let mut out: Vec<(String, Vec<&str>)> = Vec::new();
    for t in &meta.targets {
        let ways = records
            .iter()
            .filter(|r| &r.target == t)
            .flat_map(|r| &r.phases)
            .filter_map(|p| p.cold.as_deref());
        for how in ways {
            group_under(&mut out, how, t.as_str());
        }
    }
    out
}

/// Adds `item` to the group of `key` in `groups` (a new group, in the order keys first
/// came, if none), unless it is already that group's last: the reasons a page or a
/// conditions list names once, each with what it applies to.
pub(crate) fn group_under<T: PartialEq>(groups: &mut Vec<(String, Vec<T>)>, key: &str, item: T) {
    match groups.iter_mut().find(|(k, _)| k == key) {
        Some((_, items)) if items.last() == Some(&item) => {}
        Some((_, items)) => items.push(item),
        None => groups.push((key.to_string(), vec![item])),
    }
}

/// The run's conditions: machine, placement, repetitions, tools, command, flush rate.
pub(crate) fn header(meta: &Meta, records: &[Record]) -> String {
    header_at("##", meta, records)
}

/// [`header`] under a heading of the given level (`"###"` where the run is one of a page's).
pub(crate) fn header_at(level: &str, meta: &Meta, records: &[Record]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{level} Run {}\n", meta.started);
    let _ = writeln!(s, "- kernel {}, CPU {}", meta.kernel, meta.cpu_model);
    let cpus: Vec<String> = meta.cpus.iter().map(|c| c.to_string()).collect();
    let _ = writeln!(
        s,
        "- CPU placement: benchmark and FUSE daemons {} to CPU(s) {}",
        if meta.pinned {
            "pinned"
        } else {
            "unpinned, allowed"
        },
        cpus.join(",")
    );
    let _ = writeln!(
        s,
        "- {} repetition(s), fresh {} image per workload on {} ({}); ratios are to `{}` in this run",
        if meta.reps_per_workload.values().any(|r| *r != meta.reps) {
            let v: Vec<String> = meta
                .reps_per_workload
                .iter()
                .map(|(w, r)| format!("{w} {r}"))
                .collect();
            format!("up to {} ({})", meta.reps, v.join(", "))
        } else {
            meta.reps.to_string()
        },
        fmt_bytes(meta.image_size),
        meta.scratch,
        meta.scratch_fs,
        meta.baseline
    );
    if !meta.tool_versions.is_empty() {
        let v: Vec<String> = meta
            .tool_versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(s, "- tools: {}", v.join("; "));
    }
    if !meta.suite.is_empty() {
        let _ = writeln!(
            s,
            "- suite `{}`, scale {} (netnews {}), commit {}",
            meta.suite,
            fmt_factor(meta.scale),
            fmt_factor(meta.scale * meta.netnews_scale),
            fmt_commit(meta.commit.as_deref(), meta.dirty)
        );
    }
    if let Some(d) = &meta.device {
        let _ = writeln!(
            s,
            "- disk model: every cairn target `T` ran as `T:{d}` on the model (docs/DISKS.md) and as `T` on this machine's device; each is normalized to the baseline on its own device"
        );
    }
    let _ = writeln!(s, "- command: `{}`", meta.command);
    if let Some(l) = load_range(records) {
        let _ = writeln!(
            s,
            "- machine load (1-minute load average at each repetition's start): {l}{}",
            meta.online_cpus
                .map(|n| format!(" on {n} CPUs"))
                .unwrap_or_default()
        );
    }
    if !meta.skipped.is_empty() {
        let v: Vec<String> = meta
            .skipped
            .iter()
            .map(|(t, why)| format!("{t} ({why})"))
            .collect();
        let _ = writeln!(s, "- not run here: {}", v.join("; "));
    }
    for (how, targets) in made_cold_otherwise(meta, records) {
        let _ = writeln!(s, "- cold phases of {}: {how}", targets.join(", "));
    }
    if let Some(fr) = &meta.flush_rate {
        let _ = writeln!(
            s,
            "\n**Raw device flush rate** (4 KiB write + fdatasync in a loop on {} in {}): overwrite {}/s, append {}/s.",
            fr.host_fs,
            fr.dir.display(),
            fmt_rate(fr.overwrite_per_sec),
            fmt_rate(fr.append_per_sec)
        );
    }
    s
}

/// One table per workload with every phase's rates and counts per operation, then where the
/// counts come from.
fn phase_tables(meta: &Meta, records: &[Record], rows: &[Row]) -> String {
    let mut s = String::new();
    for w in &meta.workloads {
        let desc = records
            .iter()
            .find(|r| &r.workload == w)
            .map(|r| r.description.clone())
            .unwrap_or_default();
        let _ = writeln!(s, "\n### {w}\n\n{desc}.\n");
        // A journal with its log on a device of its own: that device's writes and flushes in
        // columns of their own (the "dev" columns are the file system's device).
        let log_dev = rows
            .iter()
            .any(|r| &r.workload == w && r.log_device_flushes_per_op.is_some());
        let disk = rows
            .iter()
            .any(|r| &r.workload == w && r.disk_busy.is_some());
        let _ = writeln!(
            s,
            "| target | phase | median | min | max | × {} | dev reads/op | dev writes/op | dev KiB written/op | dev flushes/op | FUSE req/op |{}",
            meta.baseline,
            if log_dev {
                " log dev writes/op | log dev flushes/op |"
            } else {
                ""
            }
            .to_string()
                + if disk {
                    " disk busy | disk seeks/op | disk rotations/op |"
                } else {
                    ""
                }
        );
        let _ = writeln!(
            s,
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|{}{}",
            if log_dev { "--:|--:|" } else { "" },
            if disk { "--:|--:|--:|" } else { "" }
        );
        for r in rows.iter().filter(|r| &r.workload == w) {
            let log_cells = if log_dev {
                format!(
                    " {} | {} |",
                    fmt_opt(r.log_device_writes_per_op, fmt_per_op),
                    fmt_opt(r.log_device_flushes_per_op, fmt_per_op)
                )
            } else {
                String::new()
            } + &if disk {
                format!(
                    " {} | {} | {} |",
                    fmt_opt(r.disk_busy, |v| format!("{:.0}%", v * 100.0)),
                    fmt_opt(r.disk_seeks_per_op, fmt_per_op),
                    fmt_opt(r.disk_rotations_per_op, fmt_per_op)
                )
            } else {
                String::new()
            };
            let phase = if r.unit.is_empty() {
                r.phase.clone()
            } else {
                format!("{} ({}/s)", r.phase, r.unit)
            };
            match &r.rate {
                Some(st) => {
                    let failed = if r.failed_reps > 0 {
                        format!(" ({} failed)", r.failed_reps)
                    } else {
                        String::new()
                    };
                    let _ = writeln!(
                        s,
                        "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |{log_cells}",
                        r.target,
                        failed,
                        phase,
                        fmt_rate(st.median),
                        fmt_rate(st.min),
                        fmt_rate(st.max),
                        fmt_opt(r.vs_baseline, |v| format!("{v:.2}")),
                        fmt_opt(r.device_reads_per_op, fmt_per_op),
                        fmt_opt(r.device_writes_per_op, fmt_per_op),
                        fmt_opt(r.device_write_bytes_per_op, |b| fmt_per_op(b / 1024.0)),
                        fmt_opt(r.device_flushes_per_op, fmt_per_op),
                        fmt_opt(r.fuse_requests_per_op, fmt_per_op),
                    );
                }
                None => {
                    let why = r.missing.clone().unwrap_or_default().replace('|', "/");
                    let why: String = why.chars().take(160).collect();
                    let _ = writeln!(
                        s,
                        "| {} | {} | *{}* | | | | | | | | |{}{}",
                        r.target,
                        phase,
                        why,
                        if log_dev { " | |" } else { "" },
                        if disk { " | | |" } else { "" }
                    );
                }
            }
        }
    }
    s.push_str(&breakdowns(meta, records));
    s
}

/// Median over repetitions of `f(phase)` for one target's phase.
fn median_by(
    records: &[Record],
    w: &str,
    t: &str,
    phase: &str,
    f: impl Fn(&PhaseResult) -> Option<f64>,
) -> Option<f64> {
    let v: Vec<f64> = records
        .iter()
        .filter(|r| r.workload == w && r.target == t)
        .flat_map(|r| r.phases.iter().filter(|p| p.label() == phase))
        .filter_map(&f)
        .collect();
    Stat::of(&v).map(|s| s.median)
}

/// For targets that report them (cairn): FUSE requests per operation by opcode, and device
/// writes and flushes per call of each file-system operation. These say where a rate comes
/// from: which round trips a workload pays for, and which operation waits for which flush.
fn breakdowns(meta: &Meta, records: &[Record]) -> String {
    let mut s = String::new();
    let mut header = false;
    for w in &meta.workloads {
        for t in &meta.targets {
            let Some(first) = records.iter().find(|r| {
                &r.workload == w && &r.target == t && r.phases.iter().any(|p| p.counters.is_some())
            }) else {
                continue;
            };
            for p in &first.phases {
                let Some(c) = &p.counters else { continue };
                let fuse: Vec<String> =
                    c.0.keys()
                        .filter_map(|k| k.strip_prefix("fuse.requests.").map(|op| (k, op)))
                        .filter_map(|(k, op)| {
                            let v = median_by(records, w, t, &p.label(), |q| {
                                q.per_op(|c| c.0.get(k).copied())
                            })?;
                            (v >= 0.005).then(|| format!("{op} {}", fmt_per_op(v)))
                        })
                        .collect();
                let ops: Vec<String> = c
                    .0
                    .keys()
                    .filter_map(|k| {
                        k.strip_prefix("fs.ops.")
                            .and_then(|r| r.strip_suffix(".calls"))
                    })
                    .filter_map(|op| {
                        let per_call = |what: &str| {
                            let key = format!("fs.ops.{op}.{what}");
                            let calls = format!("fs.ops.{op}.calls");
                            median_by(records, w, t, &p.label(), |q| {
                                let c = q.counters.as_ref()?;
                                let n = *c.0.get(&calls)?;
                                (n > 0.0).then(|| c.0.get(&key).map(|v| v / n)).flatten()
                            })
                        };
                        let (wr, fl) = (per_call("device_writes")?, per_call("device_flushes")?);
                        (wr >= 0.005 || fl >= 0.005)
                            .then(|| format!("{op} {}w/{}f", fmt_per_op(wr), fmt_per_op(fl)))
                    })
                    .collect();
                if fuse.is_empty() && ops.is_empty() {
                    continue;
                }
                if !header {
                    s.push_str("\n### Where the counts come from\n\n");
                    s.push_str(
                        "FUSE requests per operation by opcode, and device writes (w) and flushes (f) per call of \
                         each file-system operation that wrote (medians over repetitions).\n\n",
                    );
                    s.push_str("| workload | phase | target | FUSE requests per op | device writes/flushes per call |\n");
                    s.push_str("|---|---|---|---|---|\n");
                    header = true;
                }
                let _ = writeln!(
                    s,
                    "| {w} | {} | {t} | {} | {} |",
                    p.label(),
                    fuse.join(", "),
                    ops.join(", ")
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, rate: f64, counters: Option<serde_json::Value>) -> PhaseResult {
        PhaseResult {
            phase: name.into(),
            ops: 100.0,
            unit: "files".into(),
            secs: 100.0 / rate,
            rate,
            counters: counters.map(|c| Counters::from_json(&c)),
            param: None,
            extra: serde_json::Value::Null,
            cold: None,
        }
    }

    fn rec(target: &str, rep: u32, rate: f64, c: Option<serde_json::Value>) -> Record {
        Record {
            description: "d".into(),
            ..Record::ran(
                "create-unlink",
                target,
                rep,
                vec![phase("create+unlink", rate, c)],
            )
        }
    }

    #[test]
    fn stat_min_median_max() {
        assert_eq!(
            Stat::of(&[3.0, 1.0, 2.0]),
            Some(Stat {
                min: 1.0,
                median: 2.0,
                max: 3.0,
                n: 3
            })
        );
        assert_eq!(Stat::of(&[4.0, 1.0]).unwrap().median, 2.5);
        assert_eq!(Stat::of(&[]), None);
    }

    #[test]
    fn rates_are_rounded_and_grouped() {
        assert_eq!(fmt_rate(152_345.6), "152,000");
        assert_eq!(fmt_rate(1_234.4), "1,230");
        assert_eq!(fmt_rate(95.34), "95.3");
        assert_eq!(fmt_rate(0.5), "0.50");
        assert_eq!(fmt_rate(f64::NAN), "—");
        assert_eq!(fmt_per_op(2.0), "2.00");
        assert_eq!(fmt_per_op(0.002), "0.0020");
        assert_eq!(fmt_per_op(0.00002), "<0.0001");
        assert_eq!(fmt_per_op(0.0), "0.00");
    }

    #[test]
    fn commits_show_twelve_digits_and_whether_the_tree_was_dirty() {
        let full = "0033bde8684a1771594d2aba14db26b0d4e02625";
        assert_eq!(fmt_commit(Some(full), Some(false)), "0033bde8684a");
        assert_eq!(
            fmt_commit(Some(full), Some(true)),
            "0033bde8684a + uncommitted changes"
        );
        // What older runs recorded (git describe) is shown as it is.
        assert_eq!(
            fmt_commit(Some("6e6445d2463c-dirty"), None),
            "6e6445d2463c-dirty"
        );
        assert_eq!(fmt_commit(None, None), "unknown");
    }

    #[test]
    fn summary_ratios_counts_and_missing_rows() {
        let meta = Meta {
            baseline: "ext4".into(),
            targets: vec![
                "ext4".into(),
                "cairn-sync".into(),
                "cairn-async".into(),
                "fuse2fs".into(),
            ],
            workloads: vec!["create-unlink".into()],
            skipped: [(
                "cairn-async".to_string(),
                "cairn mkfs: not implemented".to_string(),
            )]
            .into(),
            ..Meta::default()
        };
        let dev = |w: u64, f: u64| {
            Some(serde_json::json!({
                "device": {"writes": w, "flushes": f},
                "fuse": {"requests": {"create": 100, "unlink": 100, "mkdir": 0}},
                "fs": {"ops": {"create": {"calls": 100, "device_writes": w, "device_flushes": f}}},
            }))
        };
        let mut failed = rec("fuse2fs", 1, 1.0, None);
        failed.phases.clear();
        failed.error = Some("mount | failed".into());
        let records = vec![
            rec("ext4", 1, 1000.0, None),
            rec("ext4", 2, 3000.0, None),
            rec("ext4", 3, 2000.0, None),
            rec("cairn-sync", 1, 100.0, dev(300, 200)),
            rec("cairn-sync", 2, 300.0, dev(500, 200)),
            failed,
        ];
        let rows = summarize(&meta, &records);
        assert_eq!(rows.len(), 4);
        let cs = &rows[1];
        assert_eq!(cs.rate.as_ref().unwrap().median, 200.0);
        assert_eq!(cs.vs_baseline, Some(0.1));
        assert_eq!(cs.device_writes_per_op, Some(4.0));
        assert_eq!(cs.device_flushes_per_op, Some(2.0));
        assert_eq!(cs.fuse_requests_per_op, Some(2.0));
        assert!(
            rows[2]
                .missing
                .as_deref()
                .unwrap()
                .contains("not implemented")
        );
        assert!(
            rows[3]
                .missing
                .as_deref()
                .unwrap()
                .starts_with("failed: mount")
        );
        let md = markdown(&meta, &records);
        assert!(md.contains("| cairn-sync | create+unlink (files/s) | 200 | 100 | 300 | 0.10 | — | 4.00 | — | 2.00 | 2.00 |"), "{md}");
        assert!(
            md.contains("| fuse2fs | create+unlink (files/s) | *failed: mount / failed* |"),
            "{md}"
        );
        let breakdown = "| create-unlink | create+unlink | cairn-sync | create 1.00, unlink 1.00 | create 4.00w/2.00f |";
        assert!(md.contains(breakdown), "{md}");
        // No journal with a log device in the run: no columns for one.
        assert!(!md.contains("log dev"), "{md}");
    }

    /// A phase a target ran unmeasured (the floor's cold read), or a workload it could not
    /// run, shows the recorded reason where its number would be, not "not run"; the phases
    /// it did measure are in the table as any target's.
    #[test]
    fn skipped_phases_show_their_reason() {
        let meta = Meta {
            baseline: "cairn-async".into(),
            targets: vec!["cairn-async".into(), "fuse-floor".into()],
            workloads: vec!["smallfile".into(), "recovery".into()],
            ..Meta::default()
        };
        let ran = |t: &str, names: &[&str]| {
            let ph = names.iter().map(|n| phase(n, 100.0, None)).collect();
            Record::ran("smallfile", t, 1, ph)
        };
        let mut floor = ran("fuse-floor", &["create", "delete"]);
        floor.skipped.push(crate::results::Skipped {
            phase: Some("read".into()),
            why: "cannot start cold: volatile".into(),
        });
        let mut crash = Record::ran("recovery", "fuse-floor", 1, Vec::new());
        crash.skipped.push(crate::results::Skipped {
            phase: None,
            why: "recovery crashes it".into(),
        });
        let mut async_crash = Record::ran("recovery", "cairn-async", 1, Vec::new());
        async_crash.phases.push(phase("recover", 2.0, None));
        let records = vec![
            ran("cairn-async", &["create", "read", "delete"]),
            floor,
            async_crash,
            crash,
        ];
        let rows = summarize(&meta, &records);
        let row = |w: &str, p: &str| {
            rows.iter()
                .find(|r| r.workload == w && r.phase == p && r.target == "fuse-floor")
                .unwrap()
        };
        assert_eq!(
            row("smallfile", "read").missing.as_deref(),
            Some("not measured: cannot start cold: volatile")
        );
        assert_eq!(row("smallfile", "create").vs_baseline, Some(1.0));
        assert_eq!(row("smallfile", "delete").missing, None);
        assert_eq!(
            row("recovery", "recover").missing.as_deref(),
            Some("not measured: recovery crashes it")
        );
        let md = markdown(&meta, &records);
        assert!(
            md.contains("not measured: cannot start cold: volatile"),
            "{md}"
        );
        assert!(!md.contains("cold phases of"), "{md}");
    }

    /// A target made cold its own way (the floor: the kernel's caches dropped under its
    /// daemon) has its cold read measured as any target's, and the run's conditions say how,
    /// once for all its records; a target made cold the usual way is not named.
    #[test]
    fn the_conditions_say_how_a_target_made_cold_its_own_way_was() {
        let meta = Meta {
            baseline: "cairn-async".into(),
            targets: vec!["cairn-async".into(), "fuse-floor".into()],
            workloads: vec!["smallfile".into()],
            ..Meta::default()
        };
        let ran = |t: &str, rep: u32, cold: Option<&str>| {
            let mut ph: Vec<PhaseResult> = ["create", "read", "delete"]
                .iter()
                .map(|n| phase(n, 100.0, None))
                .collect();
            ph[1].cold = cold.map(str::to_string);
            Record::ran("smallfile", t, rep, ph)
        };
        let how = crate::target::FLOOR_COLD;
        let records = vec![
            ran("cairn-async", 1, None),
            ran("fuse-floor", 1, Some(how)),
            ran("fuse-floor", 2, Some(how)),
        ];
        let rows = summarize(&meta, &records);
        let read = rows
            .iter()
            .find(|r| r.phase == "read" && r.target == "fuse-floor")
            .unwrap();
        assert_eq!(
            (read.missing.as_deref(), read.vs_baseline),
            (None, Some(1.0))
        );
        let md = markdown(&meta, &records);
        assert_eq!(
            md.matches(&format!("\n- cold phases of fuse-floor: {how}\n"))
                .count(),
            1,
            "{md}"
        );
        assert!(!md.contains("cold phases of cairn-async"), "{md}");
    }

    /// A journal with its log on its own device gets that device's writes and flushes per
    /// operation in columns of their own, beside the file system device's; the log in the
    /// image (log=file) has its I/O in the device's columns only.
    #[test]
    fn log_device_columns_beside_the_file_system_devices() {
        let meta = Meta {
            baseline: "cairn-journal".into(),
            targets: vec!["cairn-journal".into(), "cairn-journal-2sync".into()],
            workloads: vec!["create-unlink".into()],
            ..Meta::default()
        };
        let stats = |log: &str, dev_flushes: u64, log_flushes: u64| {
            serde_json::json!({"fs": {
                "device": {"writes": 300, "flushes": dev_flushes},
                "strategy": {"log": log, "wal": {"writes": 100, "flushes": log_flushes}},
            }})
        };
        let with = |t: &str, c: serde_json::Value| {
            let mut r = rec(t, 1, 100.0, None);
            r.phases[0].counters = Some(Counters::from_cairn_stats(&c));
            r
        };
        let records = vec![
            with("cairn-journal", stats("file", 100, 100)),
            with("cairn-journal-2sync", stats("dev:/l.img", 3, 100)),
        ];
        let rows = summarize(&meta, &records);
        assert_eq!(rows[0].log_device_flushes_per_op, None);
        assert_eq!(rows[1].log_device_flushes_per_op, Some(1.0));
        assert_eq!(rows[1].device_flushes_per_op, Some(0.03));
        let md = markdown(&meta, &records);
        assert!(
            md.contains("| FUSE req/op | log dev writes/op | log dev flushes/op |"),
            "{md}"
        );
        assert!(
            md.contains("| cairn-journal | create+unlink (files/s) | 100 | 100 | 100 | 1.00 | — | 3.00 | — | 1.00 | — | — | — |"),
            "{md}"
        );
        assert!(
            md.contains("| cairn-journal-2sync | create+unlink (files/s) | 100 | 100 | 100 | 1.00 | — | 3.00 | — | 0.03 | — | 1.00 | 1.00 |"),
            "{md}"
        );
        // The paper's table (000 Table 4) shows the log device apart too.
        let d = tempfile::tempdir().unwrap();
        let md = render(d.path(), &meta, &records).unwrap();
        assert!(
            md.contains(
                "| dev writes/op | dev flushes/op | log dev writes/op | log dev flushes/op |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| cairn-journal | create+unlink | 100 | 1.00 | 3.00 | 1.00 | — | — |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| cairn-journal-2sync | create+unlink | 100 | 1.00 | 3.00 | 0.03 | 1.00 | 1.00 |"
            ),
            "{md}"
        );
    }

    #[test]
    fn records_round_trip_through_a_run_directory() {
        let d = tempfile::tempdir().unwrap();
        let meta = Meta {
            baseline: "ext4".into(),
            targets: vec!["ext4".into()],
            workloads: vec!["create-unlink".into()],
            ..Meta::default()
        };
        write_json(&d.path().join("meta.json"), &meta).unwrap();
        write_json(&d.path().join("rec-0001.json"), &rec("ext4", 1, 5.0, None)).unwrap();
        write_json(&d.path().join("rec-0002.json"), &rec("ext4", 2, 7.0, None)).unwrap();
        let (m, r) = load(d.path()).unwrap();
        assert_eq!(m.targets, meta.targets);
        assert_eq!(r.len(), 2);
        assert_eq!(summarize(&m, &r)[0].rate.as_ref().unwrap().median, 6.0);
    }
}
