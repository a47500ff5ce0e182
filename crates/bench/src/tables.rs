//! The papers' tables, rebuilt from a run's records: the same rows, columns and normalization
//! as the paper (000 §5.2: "for throughput results we divide the measured result by that of
//! FFS-async; for elapsed time we divide FFS-async's by each measured result", so > 1 is
//! better than the baseline either way), the published numbers beside them, and the plots of
//! the papers' figures.
//!
//! Rates are per-second for every phase (elapsed-time phases have ops = 1), which makes both
//! of the papers' normalizations one division: `rate / baseline rate`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use crate::counters::Counters;
use crate::plot::{self, Figures};
use crate::published::{self, Published};
use crate::results::{Meta, Record, Stat};
use crate::units::fmt_rate;
use crate::workload::{PhaseResult, fmt_size, recovery_sweep};

/// Per target, per repetition: the value of `f` over a record (None when the record lacks it).
pub(crate) fn per_rep(
    records: &[Record],
    workload: &str,
    target: &str,
    f: &dyn Fn(&Record) -> Option<f64>,
) -> Option<Stat> {
    let v: Vec<f64> = records
        .iter()
        .filter(|r| r.workload == workload && r.target == target && r.error.is_none())
        .filter_map(f)
        .collect();
    Stat::of(&v)
}

fn phase<'a>(r: &'a Record, label: &str) -> Option<&'a PhaseResult> {
    r.phases.iter().find(|p| p.label() == label)
}

/// Rate of one phase.
pub(crate) fn rate_of(label: &str) -> impl Fn(&Record) -> Option<f64> + '_ {
    move |r| phase(r, label).map(|p| p.rate)
}

/// Rate of a run of consecutive phases measured in seconds: 1 / (sum of times) — the papers'
/// "total" column.
pub(crate) fn total_rate<S: AsRef<str>>(labels: &[S]) -> impl Fn(&Record) -> Option<f64> + '_ {
    move |r| {
        let mut secs = 0.0;
        for l in labels {
            secs += phase(r, l.as_ref())?.secs;
        }
        (secs > 0.0).then(|| 1.0 / secs)
    }
}

/// What a column shows of one record (one repetition of one target).
pub type Value<'a> = Box<dyn Fn(&Record) -> Option<f64> + 'a>;

/// One rate column per phase label, plus the papers' "total" (1 / summed time) if asked.
fn rate_columns(ls: &[String], total: bool) -> Vec<Column<'_>> {
    let mut cols: Vec<Column> = ls
        .iter()
        .map(|l| Column {
            name: l.clone(),
            value: Box::new(rate_of(l)),
        })
        .collect();
    if total {
        cols.push(Column {
            name: "total".into(),
            value: Box::new(total_rate(ls)),
        });
    }
    cols
}

/// One elapsed-seconds column per phase label.
fn secs_columns(ls: &[String]) -> Vec<Column<'_>> {
    ls.iter()
        .map(|l| Column {
            name: l.clone(),
            value: Box::new(move |r: &Record| phase(r, l).map(|p| p.secs)),
        })
        .collect()
}

/// One column of a normalized table.
pub struct Column<'a> {
    pub name: String,
    pub value: Value<'a>,
}

/// A measured cell: the stat over repetitions and its median's ratio to the baseline's.
pub type Measured = (Stat, Option<f64>);

/// One cell, empty where the target has no number.
pub type Cell = Option<Measured>;

/// A computed table: per target, per column, one cell.
pub struct Normalized {
    pub columns: Vec<String>,
    pub rows: Vec<(String, Vec<Cell>)>,
}

pub fn normalize(meta: &Meta, records: &[Record], workload: &str, cols: &[Column]) -> Normalized {
    let rows = meta
        .targets
        .iter()
        .map(|t| {
            // Each target against the baseline on its own device (a disk model's or this
            // machine's).
            let baseline = crate::results::baseline_for(meta, t);
            let base: Vec<Option<Stat>> = cols
                .iter()
                .map(|c| per_rep(records, workload, &baseline, &*c.value))
                .collect();
            let vals = cols
                .iter()
                .zip(&base)
                .map(|(c, b)| {
                    per_rep(records, workload, t, &*c.value).map(|st| {
                        let ratio = b
                            .as_ref()
                            .filter(|b| b.median > 0.0)
                            .map(|b| st.median / b.median);
                        (st, ratio)
                    })
                })
                .collect();
            (t.clone(), vals)
        })
        .collect();
    Normalized {
        columns: cols.iter().map(|c| c.name.clone()).collect(),
        rows,
    }
}

/// "median (min–max)", or just the median when the repetitions agree or there is one.
fn fmt_stat(st: &Stat, fmt: &dyn Fn(f64) -> String) -> String {
    if st.min == st.max {
        fmt(st.median)
    } else {
        format!("{} ({}–{})", fmt(st.median), fmt(st.min), fmt(st.max))
    }
}

/// One row per target that has a number, one cell per column, `cell` deciding what it shows.
fn table(s: &mut String, n: &Normalized, first: &str, cell: &dyn Fn(&Measured) -> String) {
    let _ = writeln!(s, "| {first} | {} |", n.columns.join(" | "));
    let _ = writeln!(s, "|---|{}", "--:|".repeat(n.columns.len()));
    for (t, vals) in &n.rows {
        if vals.iter().all(Option::is_none) {
            continue;
        }
        let cells: Vec<String> = vals
            .iter()
            .map(|v| v.as_ref().map(cell).unwrap_or_else(|| "—".into()))
            .collect();
        let _ = writeln!(s, "| {t} | {} |", cells.join(" | "));
    }
}

/// Ratios only, like the papers' Tables 5–7 (targets that produced nothing are left out).
fn ratio_table(s: &mut String, n: &Normalized, baseline: &str) {
    table(
        s,
        n,
        &format!("target (÷ {baseline})"),
        &|(st, r)| match r {
            Some(r) if st.min != st.max && st.min > 0.0 && st.median > 0.0 => {
                // The spread of the ratio is the spread of the target's own repetitions.
                format!(
                    "{r:.2} ({:.2}–{:.2})",
                    r * st.min / st.median,
                    r * st.max / st.median
                )
            }
            Some(r) => format!("{r:.2}"),
            None => "—".into(),
        },
    );
}

/// Absolute medians with min–max, in `fmt(value)` form.
fn absolute_table(s: &mut String, n: &Normalized, unit: &str, fmt: &dyn Fn(f64) -> String) {
    table(s, n, "target", &|(st, _)| fmt_stat(st, fmt));
    let _ = writeln!(s, "\n*{unit}; median (min–max) over repetitions.*");
}

/// A published table as the paper prints it; for a table of the paper's systems, which target
/// plays each one's role here.
fn published_block(s: &mut String, p: &Published) {
    let _ = writeln!(
        s,
        "\n*Published, {} ({}; {}):*\n",
        p.source, p.title, p.note
    );
    if let Some(sys) = p.system {
        let _ = writeln!(
            s,
            "{sys} throughout; role played here by {}.\n",
            published::analogue(sys)
        );
    }
    let roles = p.system.is_none();
    let _ = writeln!(
        s,
        "| {} | {} |{}",
        p.row_header,
        p.columns.join(" | "),
        if roles { " role played here by |" } else { "" }
    );
    let _ = writeln!(
        s,
        "|---|{}{}",
        "--:|".repeat(p.columns.len()),
        if roles { "---|" } else { "" }
    );
    for (row, vals) in p.rows {
        let role = if roles {
            format!(" {} |", published::analogue(row))
        } else {
            String::new()
        };
        let _ = writeln!(s, "| {row} | {} |{role}", vals.join(" | "));
    }
}

fn claims_block(s: &mut String, workload: &str) {
    for c in published::claims(workload) {
        let _ = writeln!(s, "\n> {c}");
    }
}

/// Labels of a workload's phases, in run order, from any record.
fn labels(records: &[Record], workload: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in records.iter().filter(|r| r.workload == workload) {
        for p in &r.phases {
            let l = p.label();
            if !out.contains(&l) {
                out.push(l);
            }
        }
    }
    out
}

/// Per-op medians of a counter over a phase, per target (for the evidence columns).
fn per_op_median(
    records: &[Record],
    workload: &str,
    target: &str,
    label: &str,
    f: fn(&Counters) -> Option<f64>,
) -> Option<f64> {
    per_rep(records, workload, target, &|r| phase(r, label)?.per_op(f)).map(|s| s.median)
}

/// Whether the run has numbers for workload `w` (a run cut short, or one whose every
/// repetition of `w` failed, gets no empty table).
fn has(meta: &Meta, records: &[Record], w: &str) -> bool {
    meta.workloads.iter().any(|x| x == w)
        && records
            .iter()
            .any(|r| r.workload == w && r.error.is_none() && !r.phases.is_empty())
}

/// The phases of 000 Table 5's columns, Table 6's and 004 Fig. 8's, in the papers' order.
const SSH_PHASES: &[&str] = &["unpack", "config", "build"];
pub(crate) const NETNEWS_PHASES: &[&str] = &["unbatch", "expire"];
const SMALLFILE_PHASES: &[&str] = &["create", "read", "delete"];

fn owned(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The heading of a workload's section: the papers' table or figure it reproduces. One place
/// for summary.md and the terminal summary.
pub fn title(w: &str) -> &'static str {
    match w {
        "create-unlink" => "0-length create/delete (000 Table 4)",
        "micro" => "Microbenchmarks (000 Figures 1–4)",
        "ssh" => "ssh build (000 Table 5)",
        "netnews" => "Netnews (000 Table 6)",
        "sdet" => "SDET (000 Figure 5, 002 Fig. 7)",
        "postmark" => "PostMark: postmark (000 Table 7, 002 Table I)",
        "postmark-umbrella" => "PostMark: postmark-umbrella (003 §4.3, Fig. 8)",
        "postmark-large" => {
            "PostMark: postmark-large (a file set larger than cairn's buffer cache)"
        }
        "smallfile" => "Small files (004 Fig. 8)",
        "largefile" => "Large file (004 Fig. 9)",
        "recovery" => "Recovery time (002 Table III, 004 Table III)",
        crate::workload::groupcreate::NAME => {
            "Group commit: concurrent creates (001 §3.2, issue 12)"
        }
        crate::workload::rename::NAME => "Renames across directories (002 §2 rule 3, issue 23)",
        crate::workload::fsstress::NAME => "fsstress: a mixed workload (issue 23)",
        _ => "",
    }
}

/// What the terminal shows of one of the papers' tables: the table's headline numbers per
/// target, the full table being in summary.md.
pub struct Headline {
    pub title: &'static str,
    /// Column names, in the order of each row's values.
    pub columns: Vec<String>,
    /// Ratios to the baseline (the baseline's own row, all 1.00, is left out), or, when false,
    /// absolute values in `unit`.
    pub ratios: bool,
    pub unit: &'static str,
    /// Targets with at least one value.
    pub rows: Vec<(String, Vec<Option<f64>>)>,
    /// Whether the baseline has numbers here (without them there are no ratios).
    pub baseline_measured: bool,
    /// Where to look instead, for a table with no single headline number (the per-size sweeps).
    pub see: Option<String>,
}

/// One [`Headline`] per paper table the run has numbers for, in the run's workload order.
pub fn headlines(meta: &Meta, records: &[Record]) -> Vec<Headline> {
    let mut out = Vec::new();
    for w in meta.workloads.iter().map(String::as_str) {
        if !has(meta, records, w) || title(w).is_empty() {
            continue;
        }
        let (ls, total, ratios) = match w {
            "ssh" => (owned(SSH_PHASES), true, true),
            "netnews" => (owned(NETNEWS_PHASES), true, true),
            "smallfile" => (owned(SMALLFILE_PHASES), false, true),
            "create-unlink" => (owned(&["create+unlink"]), false, true),
            crate::workload::rename::NAME => {
                (owned(&[crate::workload::rename::PHASE]), false, true)
            }
            crate::workload::fsstress::NAME => {
                (owned(&[crate::workload::fsstress::PHASE]), false, true)
            }
            "postmark" | "postmark-umbrella" | "postmark-large" => (owned(&["run"]), false, true),
            "sdet" | "largefile" => (labels(records, w), false, true),
            "recovery" => (labels(records, w), false, false),
            _ => (Vec::new(), false, true),
        };
        let mut h = Headline {
            title: title(w),
            columns: Vec::new(),
            ratios,
            unit: if ratios { "" } else { "s" },
            rows: Vec::new(),
            baseline_measured: false,
            see: None,
        };
        if w == crate::workload::groupcreate::NAME {
            h.see = Some(crate::workload::groupcreate::headline(records));
            out.push(h);
            continue;
        }
        if ls.is_empty() {
            h.see = Some("per file size: summary.md and micro-*.png".into());
            out.push(h);
            continue;
        }
        let cols = if ratios {
            rate_columns(&ls, total)
        } else {
            secs_columns(&ls)
        };
        let n = normalize(meta, records, w, &cols);
        // SDET's columns are "scripts N=1", ...: the concurrency is what tells them apart.
        h.columns = n
            .columns
            .iter()
            .map(|c| c.strip_prefix("scripts ").unwrap_or(c).to_string())
            .collect();
        for (t, cells) in n.rows {
            if ratios && t == crate::results::baseline_for(meta, &t) {
                h.baseline_measured = cells.iter().any(Option::is_some);
                continue;
            }
            let vals: Vec<Option<f64>> = cells
                .iter()
                .map(|c| {
                    c.as_ref()
                        .and_then(|(st, r)| if ratios { *r } else { Some(st.median) })
                })
                .collect();
            if vals.iter().any(Option::is_some) {
                h.rows.push((t, vals));
            }
        }
        out.push(h);
    }
    out
}

/// Every paper table this run has data for, as Markdown; plots are written into `dir`.
pub fn render(figures: &Figures, meta: &Meta, records: &[Record]) -> Result<String> {
    let mut s = String::new();
    let b = meta.baseline.as_str();
    let _ = writeln!(
        s,
        "\n## The papers' tables\n\nNormalized as the papers do: throughput ÷ `{b}`'s, or `{b}`'s time ÷ time, so > 1 is faster than `{b}` either way. In parentheses: the spread of the target's own repetitions."
    );

    if has(meta, records, "create-unlink") {
        let _ = writeln!(s, "\n### {}\n", title("create-unlink"));
        evidence_table(
            &mut s,
            meta,
            records,
            "create-unlink",
            &["create+unlink".to_string()],
        );
        for p in published::for_workload("create-unlink") {
            published_block(&mut s, p);
        }
    }

    for (w, phase) in [
        (
            crate::workload::rename::NAME,
            crate::workload::rename::PHASE,
        ),
        (
            crate::workload::fsstress::NAME,
            crate::workload::fsstress::PHASE,
        ),
    ] {
        if has(meta, records, w) {
            let _ = writeln!(s, "\n### {}\n", title(w));
            evidence_table(&mut s, meta, records, w, &[phase.to_string()]);
        }
    }

    if has(meta, records, "micro") {
        micro(&mut s, figures, meta, records)?;
    }

    if has(meta, records, "ssh") {
        let ls = owned(SSH_PHASES);
        let _ = writeln!(s, "\n### {}\n", title("ssh"));
        ratio_table(
            &mut s,
            &normalize(meta, records, "ssh", &rate_columns(&ls, true)),
            b,
        );
        let _ = writeln!(s, "\nSeconds per phase:\n");
        absolute_table(
            &mut s,
            &normalize(meta, records, "ssh", &secs_columns(&ls)),
            "seconds",
            &|v| format!("{v:.1}"),
        );
        for p in published::for_workload("ssh") {
            published_block(&mut s, p);
        }
    }

    if has(meta, records, "netnews") {
        let ls = owned(NETNEWS_PHASES);
        let _ = writeln!(s, "\n### {}\n", title("netnews"));
        ratio_table(
            &mut s,
            &normalize(meta, records, "netnews", &rate_columns(&ls, true)),
            b,
        );
        let _ = writeln!(s, "\nFiles per second and device writes per file:\n");
        evidence_table(&mut s, meta, records, "netnews", &ls);
        for p in published::for_workload("netnews") {
            published_block(&mut s, p);
        }
    }

    if has(meta, records, "sdet") {
        sdet_section(&mut s, figures, meta, records)?;
    }

    for w in ["postmark", "postmark-umbrella", "postmark-large"] {
        if !has(meta, records, w) {
            continue;
        }
        let _ = writeln!(s, "\n### {}\n", title(w));
        evidence_table(&mut s, meta, records, w, &["run".to_string()]);
        for p in published::for_workload(w) {
            published_block(&mut s, p);
        }
        claims_block(&mut s, w);
    }

    if has(meta, records, "smallfile") {
        smallfile_section(&mut s, figures, meta, records)?;
    }

    if has(meta, records, "largefile") {
        let ls = labels(records, "largefile");
        let _ = writeln!(s, "\n### {}\n", title("largefile"));
        evidence_table(&mut s, meta, records, "largefile", &ls);
        bars(&mut s, figures, meta, records, "largefile", &ls, "MiB/s")?;
        claims_block(&mut s, "largefile");
    }

    if has(meta, records, "recovery") {
        recovery_section(&mut s, meta, records);
    }

    let group = crate::workload::groupcreate::NAME;
    if has(meta, records, group) {
        let _ = writeln!(s, "\n### {}\n", title(group));
        crate::workload::groupcreate::render(&mut s, figures, meta, records)?;
    }
    if has(meta, records, recovery_sweep::NAME) {
        recovery_sweep::render(&mut s, figures, meta, records)?;
    }
    if meta.device.is_some() {
        crate::device::render(&mut s, meta, records);
    }
    Ok(s)
}

/// 002 Fig. 7 and 000 Fig. 5: scripts per hour, normalized, and their plot.
fn sdet_section(s: &mut String, figures: &Figures, meta: &Meta, records: &[Record]) -> Result<()> {
    let b = meta.baseline.as_str();
    let ls: Vec<String> = labels(records, "sdet");
    let n = normalize(meta, records, "sdet", &rate_columns(&ls, false));
    let _ = writeln!(s, "\n### {}\n\nScripts per hour:\n", title("sdet"));
    absolute_table(s, &n, "scripts/hour", &|v| fmt_rate(v * 3600.0));
    let _ = writeln!(s, "\nNormalized:\n");
    ratio_table(s, &n, b);
    let series = series_over_param(meta, records, "sdet", "scripts", 3600.0);
    figures.line(
        s,
        "SDET",
        "sdet.png",
        &plot::LinePlot {
            // 002 Fig. 7 plots scripts/hour; 000 Fig. 5 the same normalized to FFS-async.
            title: "SDET-like: scripts/hour vs concurrency (002 Fig. 7, 000 Fig. 5)".into(),
            x_label: "concurrent scripts".into(),
            y_label: "scripts/hour".into(),
            // Linear, as the papers' figures: N = 1, 2, 4, 8 all get a labelled tick.
            x_log: false,
            y_log: false,
            x_fmt: plot::XFormat::Plain,
            series,
        },
    )?;
    claims_block(s, "sdet");
    Ok(())
}

/// The small-file table, the device's busy fraction per phase, and the bars.
fn smallfile_section(
    s: &mut String,
    figures: &Figures,
    meta: &Meta,
    records: &[Record],
) -> Result<()> {
    let ls = owned(SMALLFILE_PHASES);
    let _ = writeln!(s, "\n### {}\n", title("smallfile"));
    evidence_table(s, meta, records, "smallfile", &ls);
    let _ = writeln!(
        s,
        "\nDevice busy fraction (busy time ÷ elapsed: the disk model's on `T:MODEL` targets, the block layer's on loop-device targets):\n"
    );
    let busy: Vec<Column> = ls
        .iter()
        .map(|l| Column {
            name: l.clone(),
            value: Box::new(move |r: &Record| {
                let p = phase(r, l)?;
                p.disk_busy()
                    .or_else(|| Some(p.counters.as_ref()?.busy_ms()? / 1000.0 / p.secs.max(1e-9)))
            }),
        })
        .collect();
    absolute_table(
        s,
        &normalize(meta, records, "smallfile", &busy),
        "fraction of the phase the device had I/O in flight",
        &|v| format!("{:.0}%", v * 100.0),
    );
    bars(s, figures, meta, records, "smallfile", &ls, "files/s")?;
    claims_block(s, "smallfile");
    Ok(())
}

/// Seconds to a usable mount and to a full check after a crash, with each target's procedure.
fn recovery_section(s: &mut String, meta: &Meta, records: &[Record]) {
    let ls = labels(records, "recovery");
    let secs = secs_columns(&ls);
    let _ = writeln!(
        s,
        "\n### {}\n\nSeconds from the crash to a usable mount ('recover', the target's own procedure) and for a full read-only check ('fsck'):\n",
        title("recovery")
    );
    absolute_table(
        s,
        &normalize(meta, records, "recovery", &secs),
        "seconds",
        &|v| format!("{v:.2}"),
    );
    let procs: BTreeMap<String, String> = records
        .iter()
        .filter(|r| r.workload == "recovery")
        .filter_map(|r| {
            let p = r.phases.first()?.extra.get("procedure")?.as_str()?;
            Some((r.target.clone(), p.to_string()))
        })
        .collect();
    if !procs.is_empty() {
        let v: Vec<String> = procs.iter().map(|(t, p)| format!("{t}: {p}")).collect();
        let _ = writeln!(s, "\nRecovery procedures: {}.", v.join("; "));
    }
    for p in published::for_workload("recovery") {
        published_block(s, p);
    }
    claims_block(s, "recovery");
}

/// Median rate per phase with min–max, ratio to the baseline, and device writes and flushes
/// per operation: the numbers and the evidence for them in one table.
fn evidence_table(s: &mut String, meta: &Meta, records: &[Record], w: &str, ls: &[String]) {
    let b = &meta.baseline;
    let unit = records
        .iter()
        .find(|r| r.workload == w)
        .and_then(|r| r.phases.iter().find(|p| ls.contains(&p.label())))
        .map(|p| p.unit.clone())
        .unwrap_or_default();
    // A journal's own log device (log=dev:PATH) gets columns of its own when one ran: the
    // "dev" columns are the file system's device.
    let log_dev = meta.targets.iter().any(|t| {
        ls.iter()
            .any(|l| per_op_median(records, w, t, l, Counters::log_device_flushes).is_some())
    });
    let _ = writeln!(
        s,
        "| target | phase | {unit}/s | ÷ {b} | dev writes/op | dev flushes/op |{}\n|---|---|--:|--:|--:|--:|{}",
        if log_dev {
            " log dev writes/op | log dev flushes/op |"
        } else {
            ""
        },
        if log_dev { "--:|--:|" } else { "" }
    );
    for l in ls {
        let n = normalize(
            meta,
            records,
            w,
            &[Column {
                name: l.clone(),
                value: Box::new(rate_of(l)),
            }],
        );
        for (t, vals) in &n.rows {
            let Some(Some((st, r))) = vals.first() else {
                continue;
            };
            let per = |f| {
                per_op_median(records, w, t, l, f)
                    .map(|v| format!("{v:.2}"))
                    .unwrap_or_else(|| "—".into())
            };
            let log_cells = if log_dev {
                format!(
                    " {} | {} |",
                    per(Counters::log_device_writes),
                    per(Counters::log_device_flushes)
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "| {t} | {l} | {} | {} | {} | {} |{log_cells}",
                fmt_stat(st, &fmt_rate),
                r.map(|r| format!("{r:.2}")).unwrap_or_else(|| "—".into()),
                per(Counters::device_writes),
                per(Counters::device_flushes)
            );
        }
    }
}

/// One series per target of the median rate (× `mult`) against the phase's swept parameter.
fn series_over_param(
    meta: &Meta,
    records: &[Record],
    w: &str,
    phase_name: &str,
    mult: f64,
) -> Vec<plot::Series> {
    series_with(meta, records, w, phase_name, &|p: &PhaseResult| {
        Some(p.rate * mult)
    })
}

fn series_with(
    meta: &Meta,
    records: &[Record],
    w: &str,
    phase_name: &str,
    value: &dyn Fn(&PhaseResult) -> Option<f64>,
) -> Vec<plot::Series> {
    let mut out = Vec::new();
    for t in &meta.targets {
        let mut by_x: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for r in records
            .iter()
            .filter(|r| r.workload == w && &r.target == t && r.error.is_none())
        {
            for p in r.phases.iter().filter(|p| p.phase == phase_name) {
                if let (Some(x), Some(v)) = (p.param, value(p)) {
                    by_x.entry(x as u64).or_default().push(v);
                }
            }
        }
        if by_x.is_empty() {
            continue;
        }
        let stats: Vec<(f64, Stat)> = by_x
            .into_iter()
            .filter_map(|(x, v)| Some((x as f64, Stat::of(&v)?)))
            .collect();
        out.push(plot::Series {
            label: t.clone(),
            points: stats.iter().map(|(x, s)| (*x, s.median)).collect(),
            spread: Some(stats.iter().map(|(x, s)| (*x, s.min, s.max)).collect()),
        });
    }
    out
}

fn bars(
    s: &mut String,
    figures: &Figures,
    meta: &Meta,
    records: &[Record],
    w: &str,
    ls: &[String],
    unit: &str,
) -> Result<()> {
    let series: Vec<(String, Vec<Option<f64>>)> = meta
        .targets
        .iter()
        .map(|t| {
            let v = ls
                .iter()
                .map(|l| per_rep(records, w, t, &rate_of(l)).map(|st| st.median))
                .collect::<Vec<_>>();
            (t.clone(), v)
        })
        .filter(|(_, v)| v.iter().any(Option::is_some))
        .collect();
    figures.bars(
        s,
        w,
        &format!("{w}.png"),
        &plot::BarPlot {
            title: format!("{w}: {unit} per phase (median)"),
            y_label: unit.into(),
            // Bars on a log axis exaggerate small differences; the papers' bars are linear.
            y_log: false,
            groups: ls.to_vec(),
            series,
        },
    )
}

/// 000 §4.2 / Figures 1–4: one table and one plot per phase, throughput against file size.
fn micro(s: &mut String, figures: &Figures, meta: &Meta, records: &[Record]) -> Result<()> {
    let _ = writeln!(
        s,
        "\n### {}\n\nMB/s (MiB/s) for create, read and overwrite, files/s for delete, per file size; cold cache before every phase.",
        title("micro")
    );
    for (ph, fig, unit) in [
        ("create", "Fig. 3", "MiB/s"),
        ("read", "Fig. 1", "MiB/s"),
        ("overwrite", "Fig. 2", "MiB/s"),
        ("delete", "Fig. 4", "files/s"),
    ] {
        let mbps = unit == "MiB/s";
        let value = move |p: &PhaseResult| -> Option<f64> {
            if mbps {
                let size = p.param?;
                (size > 0.0).then(|| p.rate * size / f64::from(1u32 << 20))
            } else {
                Some(p.rate)
            }
        };
        let series = series_with(meta, records, "micro", ph, &value);
        if series.is_empty() {
            continue;
        }
        let sizes: Vec<f64> = {
            let mut v: Vec<f64> = series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0))
                .collect();
            v.sort_by(f64::total_cmp);
            v.dedup();
            v
        };
        let _ = writeln!(s, "\n#### {ph} ({fig}), {unit}\n");
        let _ = writeln!(
            s,
            "| target | {} |",
            sizes
                .iter()
                .map(|x| fmt_size(*x))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(s, "|---|{}", "--:|".repeat(sizes.len()));
        for se in &series {
            let cells: Vec<String> = sizes
                .iter()
                .map(|x| {
                    se.points
                        .iter()
                        .find(|p| p.0 == *x)
                        .map(|p| fmt_rate(p.1))
                        .unwrap_or_else(|| "—".into())
                })
                .collect();
            let _ = writeln!(s, "| {} | {} |", se.label, cells.join(" | "));
        }
        figures.line(
            s,
            &format!("micro {ph}"),
            &format!("micro-{ph}.png"),
            &plot::LinePlot {
                title: format!("{ph} throughput vs file size (000 {fig})"),
                x_label: "file size".into(),
                y_label: unit.into(),
                x_log: true,
                y_log: true,
                x_fmt: plot::XFormat::Bytes,
                series: series
                    .into_iter()
                    .map(|mut se| {
                        se.points.retain(|p| p.0 > 0.0);
                        if let Some(sp) = &mut se.spread {
                            sp.retain(|p| p.0 > 0.0);
                        }
                        se
                    })
                    .collect(),
            },
        )?;
    }
    // Device writes per created file: why create rates differ.
    let create_labels: Vec<String> = labels(records, "micro")
        .into_iter()
        .filter(|l| l.starts_with("create "))
        .collect();
    let rows: Vec<String> = meta
        .targets
        .iter()
        .filter_map(|t| {
            let cells: Vec<String> = create_labels
                .iter()
                .map(|l| {
                    per_op_median(records, "micro", t, l, Counters::device_writes)
                        .map(|v| format!("{v:.2}"))
                        .unwrap_or_else(|| "—".into())
                })
                .collect();
            (!cells.iter().all(|c| c == "—")).then(|| format!("| {t} | {} |", cells.join(" | ")))
        })
        .collect();
    // No table without rows: only targets that count device writes have any.
    if !rows.is_empty() {
        let _ = writeln!(
            s,
            "\n#### Device writes per created file\n\n| target | {} |\n|---|{}\n{}",
            create_labels
                .iter()
                .map(|l| l.trim_start_matches("create ").to_string())
                .collect::<Vec<_>>()
                .join(" | "),
            "--:|".repeat(create_labels.len()),
            rows.join("\n")
        );
    }
    claims_block(s, "micro");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ph(phase: &str, unit: &str, ops: f64, secs: f64, param: Option<f64>) -> PhaseResult {
        PhaseResult {
            phase: phase.into(),
            ops,
            unit: unit.into(),
            secs,
            rate: ops / secs,
            counters: None,
            param,
            extra: serde_json::Value::Null,
            cold: None,
        }
    }

    fn rec(workload: &str, target: &str, rep: u32, phases: Vec<PhaseResult>) -> Record {
        Record::ran(workload, target, rep, phases)
    }

    fn meta(workloads: &[&str]) -> Meta {
        Meta {
            baseline: "cairn-async".into(),
            targets: vec!["cairn-async".into(), "cairn-sync".into(), "ext4".into()],
            workloads: workloads.iter().map(|w| w.to_string()).collect(),
            ..Meta::default()
        }
    }

    fn ssh(target: &str, rep: u32, unpack: f64, config: f64, build: f64) -> Record {
        rec(
            "ssh",
            target,
            rep,
            vec![
                ph("unpack", "s", 1.0, unpack, None),
                ph("config", "s", 1.0, config, None),
                ph("build", "s", 1.0, build, None),
            ],
        )
    }

    #[test]
    fn elapsed_times_normalize_as_baseline_time_over_time() {
        let m = meta(&["ssh"]);
        let records = vec![
            ssh("cairn-async", 1, 1.0, 10.0, 20.0),
            ssh("cairn-async", 2, 1.0, 10.0, 20.0),
            ssh("cairn-sync", 1, 8.0, 12.5, 20.0),
            ssh("cairn-sync", 2, 4.0, 12.5, 20.0),
        ];
        let ls = ["unpack", "config", "build"].map(String::from).to_vec();
        let n = normalize(&m, &records, "ssh", &rate_columns(&ls, true));
        let sync = &n.rows[1].1;
        // unpack: median of 1/8 and 1/4 s⁻¹ is 0.1875; ÷ 1.0 → 0.1875 (= 1 s ÷ 5.33 s).
        let (st, r) = sync[0].as_ref().unwrap();
        assert_eq!(st.n, 2);
        assert!((r.unwrap() - 0.1875).abs() < 1e-9);
        assert!((sync[1].as_ref().unwrap().1.unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(sync[2].as_ref().unwrap().1, Some(1.0));
        // total: 31 s against a median of 36.5 s (40.5 and 36.5 → rates averaged).
        let total = sync[3].as_ref().unwrap().1.unwrap();
        let expect = ((1.0 / 40.5 + 1.0 / 36.5) / 2.0) * 31.0;
        assert!((total - expect).abs() < 1e-9, "{total} vs {expect}");
        // ext4 has no records: its row exists but is empty and is left out of the table.
        assert!(n.rows[2].1.iter().all(Option::is_none));
        let mut s = String::new();
        ratio_table(&mut s, &n, "cairn-async");
        assert!(
            s.contains("| cairn-async | 1.00 | 1.00 | 1.00 | 1.00 |"),
            "{s}"
        );
        assert!(
            s.contains("| cairn-sync | 0.19 (0.12–0.25) | 0.80 | 1.00 |"),
            "{s}"
        );
        assert!(!s.contains("ext4"), "{s}");
    }

    #[test]
    fn rendering_fixed_records_gives_the_papers_tables_and_plots() {
        let dir = tempfile::tempdir().unwrap();
        let m = meta(&[
            "create-unlink",
            "micro",
            "ssh",
            "sdet",
            "postmark",
            "recovery",
        ]);
        let mut records = vec![
            rec(
                "create-unlink",
                "cairn-async",
                1,
                vec![ph("create+unlink", "files", 1000.0, 0.1, None)],
            ),
            rec(
                "create-unlink",
                "cairn-sync",
                1,
                vec![ph("create+unlink", "files", 1000.0, 1.0, None)],
            ),
            ssh("cairn-async", 1, 1.0, 10.0, 20.0),
            ssh("ext4", 1, 0.5, 10.0, 20.0),
            rec(
                "postmark",
                "cairn-async",
                1,
                vec![ph("run", "tx", 20_000.0, 4.0, None)],
            ),
            rec(
                "recovery",
                "cairn-sync",
                1,
                vec![
                    ph("empty recover", "s", 1.0, 0.25, None),
                    ph("empty fsck", "s", 1.0, 0.5, None),
                ],
            ),
        ];
        for t in ["cairn-async", "ext4"] {
            let mut micro = vec![];
            for size in [0.0, 4096.0, 1048576.0] {
                micro.push(ph("create", "files", 100.0, 0.5, Some(size)));
                micro.push(ph("delete", "files", 100.0, 0.25, Some(size)));
            }
            records.push(rec("micro", t, 1, micro));
            let mut sdet = vec![];
            for n in [1.0, 2.0, 4.0, 8.0] {
                sdet.push(ph("scripts", "scripts", 10.0 * n, 36.0, Some(n)));
            }
            records.push(rec("sdet", t, 1, sdet));
        }
        let md = render(&Figures::beside(dir.path()), &m, &records).unwrap();
        assert!(
            md.contains("### 0-length create/delete (000 Table 4)"),
            "{md}"
        );
        assert!(
            md.contains("| cairn-sync | create+unlink | 1,000 | 0.10 |"),
            "{md}"
        );
        assert!(
            md.contains("| FFS-async | 10782.8 | cairn-async, ext2 |"),
            "{md}"
        );
        // ext4's unpack took half the time: 2.00 × cairn-async; total 30.5 s vs 31 s.
        assert!(md.contains("| ext4 | 2.00 | 1.00 | 1.00 | 1.02 |"), "{md}");
        assert!(md.contains("| FFS | 0.13 | 0.73 | 0.83 | 0.74 |"), "{md}");
        // micro: 100 files of 1 MiB in 0.5 s = 200 MiB/s; 0-byte files have no MiB/s point.
        assert!(md.contains("#### create (Fig. 3), MiB/s"), "{md}");
        assert!(md.contains("| cairn-async | 0.78 | 200 |"), "{md}");
        assert!(md.contains("| cairn-async | 400 | 400 | 400 |"), "{md}");
        // SDET: 10 scripts in 36 s = 1,000 scripts/hour at N = 1.
        assert!(md.contains("| scripts N=1 |"), "{md}");
        assert!(
            md.contains("| ext4 | 1,000 | 2,000 | 4,000 | 8,000 |"),
            "{md}"
        );
        assert!(md.contains("| cairn-sync | 0.25 | 0.50 |"), "{md}");
        for png in [
            "micro-create.png",
            "micro-delete.png",
            "sdet.png",
            "micro-read.png",
        ]
        .iter()
        .take(3)
        {
            assert!(dir.path().join(png).is_file(), "{png}");
        }
        // No read phase in these records: no empty read plot either.
        assert!(!dir.path().join("micro-read.png").exists());
    }

    /// Every maximal run of digits and dots with more than four digits after a dot: a float
    /// printed with `{}` (0.0010000000000000002) rather than formatted.
    fn long_floats(md: &str) -> Vec<String> {
        md.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|t| {
                t.split('.')
                    .skip(1)
                    .any(|frac| frac.len() > 4 && frac.chars().all(|c| c.is_ascii_digit()))
            })
            .map(str::to_string)
            .collect()
    }

    /// Records whose every number has a long binary expansion, and scales whose product does
    /// (0.1 × 0.1): summary.md formats them all, and the terminal gets a few lines per table.
    #[test]
    fn awkward_numbers_are_formatted_everywhere_and_the_terminal_gets_headlines() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = meta(&[
            "create-unlink",
            "micro",
            "ssh",
            "netnews",
            "sdet",
            "postmark",
            "smallfile",
            "recovery",
        ]);
        m.suite = "quick".into();
        m.scale = 0.1;
        m.netnews_scale = 0.1;
        m.commit = Some("0123456789abcdef0123456789abcdef01234567".into());
        m.dirty = Some(true);
        m.image_size = 1 << 30;
        m.targets
            .extend(["ext2", "xfs-logdev", "fuse2fs", "mergerfs"].map(String::from));
        let third = 1.0 / 3.0;
        let mut records = Vec::new();
        for (i, t) in m.targets.clone().iter().enumerate() {
            let k = 1.0 + i as f64 * 0.123456789;
            let phases = |names: &[&str], unit: &str| {
                names
                    .iter()
                    .map(|n| ph(n, unit, 1234.0 * k, third * k, None))
                    .collect::<Vec<_>>()
            };
            records.push(rec(
                "create-unlink",
                t,
                1,
                phases(&["create+unlink"], "files"),
            ));
            records.push(rec(
                "ssh",
                t,
                1,
                phases(&["unpack", "config", "build"], "s"),
            ));
            records.push(rec(
                "netnews",
                t,
                1,
                phases(&["unbatch", "expire"], "files"),
            ));
            records.push(rec("postmark", t, 1, phases(&["run"], "tx")));
            records.push(rec(
                "smallfile",
                t,
                1,
                phases(&["create", "read", "delete"], "files"),
            ));
            records.push(rec(
                "recovery",
                t,
                1,
                phases(&["empty recover", "empty fsck"], "s"),
            ));
            let mut micro = vec![];
            let mut sdet = vec![];
            for (j, size) in [0.0, 4096.0, 65536.0].iter().enumerate() {
                micro.push(ph(
                    "create",
                    "files",
                    512.0,
                    third * k * (j + 1) as f64,
                    Some(*size),
                ));
            }
            for n in [1.0, 2.0, 4.0, 8.0] {
                sdet.push(ph("scripts", "scripts", n * 7.0, 36.7 * k, Some(n)));
            }
            records.push(rec("micro", t, 1, micro));
            records.push(rec("sdet", t, 1, sdet));
        }
        let md = crate::report::render(dir.path(), &m, &records).unwrap();
        assert_eq!(long_floats(&md), Vec::<String>::new(), "{md}");
        assert!(md.contains("scale 0.1 (netnews 0.01)"), "{md}");
        assert!(
            md.contains("commit 0123456789ab + uncommitted changes"),
            "{md}"
        );
        // No counters in these records: no empty table of device writes either.
        assert!(!md.contains("Device writes per created file"), "{md}");

        let term = crate::report::terminal_summary(dir.path(), &m, &records, 754.4);
        assert_eq!(long_floats(&term), Vec::<String>::new(), "{term}");
        assert!(
            !term.contains("## "),
            "the terminal got summary.md:\n{term}"
        );
        for w in &m.workloads {
            assert!(term.contains(title(w)), "no {w} in\n{term}");
        }
        // A few lines per table: its title and the targets' values, wrapped.
        assert!(term.lines().count() <= 3 + 3 * m.workloads.len(), "{term}");
        for l in term.lines().filter(|l| l.starts_with("    ")) {
            assert!(l.chars().count() <= 100, "{l}");
        }
        assert!(
            term.starts_with("cairn bench: 56 run(s), 0 failed, in 12 min 34 s"),
            "{term}"
        );
        assert!(
            term.contains("ssh build (000 Table 5), unpack/config/build/total:"),
            "{term}"
        );
        assert!(
            term.contains("SDET (000 Figure 5, 002 Fig. 7), N=1/N=2/N=4/N=8:"),
            "{term}"
        );
        // The baseline's own row is all 1.00 and left out; recovery is in seconds.
        assert!(!term.contains("cairn-async 1.00"), "{term}");
        assert!(term.contains("empty recover/empty fsck (s):"), "{term}");
        assert!(
            term.contains(&format!("results in {}", dir.path().display())),
            "{term}"
        );

        // Only the baseline ran, or everything but the baseline: said so, not a wrong reason.
        let (base, others): (Vec<Record>, Vec<Record>) =
            records.into_iter().partition(|r| r.target == m.baseline);
        let term = crate::report::terminal_summary(dir.path(), &m, &base, 1.0);
        assert!(
            term.contains("no target but the baseline has numbers"),
            "{term}"
        );
        let term = crate::report::terminal_summary(dir.path(), &m, &others, 1.0);
        assert!(
            term.contains("no numbers for the baseline, so no ratios"),
            "{term}"
        );
    }

    /// A run directory written by hand, as the harness writes it: `cairn bench report` must
    /// read it back and render the same tables (JSON compatibility of the record format).
    #[test]
    fn a_run_directory_of_fixed_json_renders() {
        let d = tempfile::tempdir().unwrap();
        let meta = r#"{"started":"20261121T000000Z","kernel":"6.1","cpu_model":"x","cpus":[0],
            "pinned":true,"reps":1,"image_size":4294967296,"scratch":"/var/tmp","scratch_fs":"ext2/ext3",
            "baseline":"cairn-async","targets":["cairn-async","ext4-sync"],"workloads":["netnews"],
            "skipped":{},"flush_rate":null,"tool_versions":{},"command":"cairn bench run"}"#;
        let rec = |t: &str, unbatch: f64, expire: f64| {
            format!(
                r#"{{"target":"{t}","workload":"netnews","description":"d","rep":1,"error":null,
                "phases":[
                  {{"phase":"populate","ops":520.0,"unit":"files","secs":1.0,"rate":520.0,"counters":null}},
                  {{"phase":"unbatch","ops":78.0,"unit":"files","secs":{unbatch},"rate":{},
                    "counters":{{"device.writes":156.0,"device.flushes":78.0}}}},
                  {{"phase":"expire","ops":91.0,"unit":"files","secs":{expire},"rate":{}}}]}}"#,
                78.0 / unbatch,
                91.0 / expire
            )
        };
        std::fs::write(d.path().join("meta.json"), meta).unwrap();
        std::fs::write(d.path().join("rec-0001.json"), rec("cairn-async", 1.0, 1.0)).unwrap();
        std::fs::write(d.path().join("rec-0002.json"), rec("ext4-sync", 2.0, 4.0)).unwrap();
        let (m, r) = crate::report::load(d.path()).unwrap();
        let md = crate::report::render(d.path(), &m, &r).unwrap();
        // 000 Table 6's shape: unbatch 1 s ÷ 2 s, expire 1 s ÷ 4 s, total 2 s ÷ 6 s.
        assert!(md.contains("| ext4-sync | 0.50 | 0.25 | 0.33 |"), "{md}");
        assert!(
            md.contains("| ext4-sync | unbatch | 39.0 | 0.50 | 2.00 | 1.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| LFFS-wafs-2async | 0.99 | 0.96 | 0.98 |"),
            "{md}"
        );
        assert!(d.path().join("summary.md").is_file() && d.path().join("summary.json").is_file());
    }
}
