//! The papers' tables on a disk model, beside the same targets on this machine's device
//! (`cairn bench run --device MODEL`): one table per paper table, with the published
//! ratio, cairn's ratio on the model, and cairn's ratio on this device in three columns,
//! then the model's evidence for the ratio — the disk's busy share (004 §5.1), seeks,
//! rotations, writes and flushes per operation — so that a ratio that misses can be
//! explained by its counts.

use std::fmt::Write as _;

use crate::counters::Counters;
use crate::published::{self, Published};
use crate::results::{Meta, Record, Stat};
use crate::target::on_disk;
use crate::workload::{PhaseResult, groupcreate};

/// How far a reproduced ratio may be from the published one and still count as met.
const TOLERANCE: f64 = 0.25;

/// One row of a three-column table: a published system (or phase) and the pair of targets
/// whose ratio stands for it.
struct Line {
    name: String,
    /// The published value as printed, and as a number when it is one.
    paper: String,
    paper_value: Option<f64>,
    workload: &'static str,
    /// The phase measured, by its label.
    label: String,
    target: &'static str,
    base: &'static str,
}

/// The phases of `target` labelled `label`, over its repetitions.
fn phases<'a>(records: &'a [Record], w: &str, target: &str, label: &str) -> Vec<&'a PhaseResult> {
    records
        .iter()
        .filter(|r| r.workload == w && r.target == target && r.error.is_none())
        .flat_map(|r| r.phases.iter().filter(|p| p.label() == label))
        .collect()
}

fn median(v: Vec<f64>) -> Option<f64> {
    Stat::of(&v).map(|s| s.median)
}

fn rate(records: &[Record], w: &str, target: &str, label: &str) -> Option<f64> {
    median(
        phases(records, w, target, label)
            .iter()
            .map(|p| p.rate)
            .collect(),
    )
}

fn ratio(records: &[Record], w: &str, target: &str, base: &str, label: &str) -> Option<f64> {
    let (t, b) = (
        rate(records, w, target, label)?,
        rate(records, w, base, label)?,
    );
    (b > 0.0).then(|| t / b)
}

fn per_op(
    records: &[Record],
    w: &str,
    target: &str,
    label: &str,
    f: fn(&Counters) -> Option<f64>,
) -> Option<f64> {
    median(
        phases(records, w, target, label)
            .iter()
            .filter_map(|p| p.per_op(f))
            .collect(),
    )
}

fn busy(records: &[Record], w: &str, target: &str, label: &str) -> Option<f64> {
    median(
        phases(records, w, target, label)
            .iter()
            .filter_map(|p| p.disk_busy())
            .collect(),
    )
}

/// Every flush a call caused: the file system's device and a journal's own log device. On
/// the model, the model's count (`fs.disk.flushes`): a flush kept from the host
/// (`nohostflush`) reaches no device counter in builds before the model counted it there.
fn all_flushes(c: &Counters) -> Option<f64> {
    let fs =
        c.0.get("fs.disk.flushes")
            .copied()
            .or_else(|| c.device_flushes())?;
    Some(fs + c.log_device_flushes().unwrap_or(0.0))
}

fn all_writes(c: &Counters) -> Option<f64> {
    Some(c.device_writes()? + c.log_device_writes().unwrap_or(0.0))
}

fn fmt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "—".into())
}

/// A ratio to three significant figures (0.0051, 0.018, 0.81, 1.11).
fn fmt_ratio(v: f64) -> String {
    match v.abs() {
        a if a >= 0.1 || a == 0.0 => format!("{v:.2}"),
        a if a >= 0.01 => format!("{v:.3}"),
        _ => format!("{v:.4}"),
    }
}

/// Whether the model's ratio is within [`TOLERANCE`] of the published one.
fn verdict(paper: Option<f64>, model: Option<f64>) -> String {
    match (paper, model) {
        (Some(p), Some(m)) if p > 0.0 => {
            let off = m / p - 1.0;
            if off.abs() <= TOLERANCE {
                "yes".into()
            } else {
                format!("no ({:+.0}%)", off * 100.0)
            }
        }
        _ => "—".into(),
    }
}

/// One three-column table with the model's evidence.
fn table(s: &mut String, records: &[Record], model: &str, first: &str, lines: &[Line]) {
    let _ = writeln!(
        s,
        "| {first} | target (÷ its baseline) | paper | model | this device | model within ±25% | model: disk busy | seeks/op | rotations/op | writes/op | flushes/op | this device: flushes/op |"
    );
    let _ = writeln!(s, "|---|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|");
    for l in lines {
        let on = on_disk(l.target, model);
        let m = ratio(records, l.workload, &on, &on_disk(l.base, model), &l.label);
        let d = ratio(records, l.workload, l.target, l.base, &l.label);
        let c = |f| per_op(records, l.workload, &on, &l.label, f);
        let base = if l.target == l.base {
            "baseline".to_string()
        } else {
            format!("÷ {}", l.base)
        };
        let _ = writeln!(
            s,
            "| {} | {} {base} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            l.name,
            l.target,
            l.paper,
            fmt(m, fmt_ratio),
            fmt(d, fmt_ratio),
            verdict(l.paper_value, m),
            fmt(busy(records, l.workload, &on, &l.label), |v| format!(
                "{:.0}%",
                v * 100.0
            )),
            fmt(c(Counters::disk_seeks), |v| format!("{v:.2}")),
            fmt(c(Counters::disk_rotations), |v| format!("{v:.2}")),
            fmt(c(all_writes), |v| format!("{v:.2}")),
            fmt(c(all_flushes), |v| format!("{v:.2}")),
            fmt(
                per_op(records, l.workload, l.target, &l.label, all_flushes),
                |v| format!("{v:.2}")
            ),
        );
    }
}

/// Lines for a published table of systems in one phase: its ratios to FFS-async (computed
/// from the printed rates when `rates`, else printed as ratios).
fn system_lines(p: &Published, workload: &'static str, label: &str, rates: bool) -> Vec<Line> {
    let base_value = p
        .rows
        .iter()
        .find(|(sys, _)| *sys == "FFS-async")
        .and_then(|(_, v)| v[0].parse::<f64>().ok());
    let mut lines: Vec<Line> = Vec::new();
    if !rates {
        lines.push(Line {
            name: "FFS-async".into(),
            paper: "1.00".into(),
            paper_value: Some(1.0),
            workload,
            label: label.into(),
            target: "cairn-async",
            base: "cairn-async",
        });
    }
    for (sys, vals) in p.rows {
        let Some(target) = published::primary(sys) else {
            continue;
        };
        let printed = vals[0].parse::<f64>().ok();
        let value = match (rates, printed, base_value) {
            (true, Some(v), Some(b)) => Some(v / b),
            (false, v, _) => v,
            _ => None,
        };
        lines.push(Line {
            name: sys.to_string(),
            paper: fmt(value, |v| {
                format!("{v:.4}").trim_end_matches('0').to_string()
            }),
            paper_value: value,
            workload,
            label: label.into(),
            target,
            base: "cairn-async",
        });
    }
    lines
}

/// Labels of a workload's phases, in run order.
fn labels(records: &[Record], w: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in records.iter().filter(|r| r.workload == w) {
        for p in &r.phases {
            if !out.contains(&p.label()) {
                out.push(p.label());
            }
        }
    }
    out
}

fn ran(records: &[Record], w: &str) -> bool {
    records
        .iter()
        .any(|r| r.workload == w && r.error.is_none() && !r.phases.is_empty())
}

/// The section of summary.md for a run with `--device`.
pub fn render(s: &mut String, meta: &Meta, records: &[Record]) {
    let Some(model) = meta.device.as_deref() else {
        return;
    };
    let _ = writeln!(
        s,
        "\n## The papers' tables on `{model}` beside this machine's device"
    );
    body(s, model, records);
}

/// The three-column tables of a `--device` run on `model`, with what they mean, under a
/// heading its caller writes (summary.md's, or the current-results page's per disk run).
pub fn body(s: &mut String, model: &str, records: &[Record]) {
    let _ = writeln!(
        s,
        "\nEach row: the published ratio, cairn's on the disk model (`T:{model}` ÷ the baseline on the model) and on this machine's device (`T` ÷ the baseline there); then what the model counted per operation of `T:{model}` (busy: the share of the phase the disk's mechanism worked, 004 §5.1; seeks, rotations waited; writes and flushes on every device, a journal's own log device included). A ratio within ±{:.0}% of the paper's counts as reproduced.\n",
        TOLERANCE * 100.0
    );
    if ran(records, "create-unlink") {
        let _ = writeln!(s, "### 0-length create/delete (000 Table 4), ÷ FFS-async\n");
        let lines = system_lines(&published::TABLE4, "create-unlink", "create+unlink", true);
        table(s, records, model, "system", &lines);
        // The table prints rates: beside the ratios, the model's own rates against them.
        let rates: Vec<String> = published::TABLE4
            .rows
            .iter()
            .filter_map(|(sys, v)| {
                let t = on_disk(published::primary(sys)?, model);
                let r = rate(records, "create-unlink", &t, "create+unlink")?;
                Some(format!("{sys} {} ({})", crate::units::fmt_rate(r), v[0]))
            })
            .collect();
        if !rates.is_empty() {
            let _ = writeln!(
                s,
                "\nFiles per second on the model (the paper's in parentheses): {}.",
                rates.join(", ")
            );
        }
    }
    if ran(records, "postmark") {
        let _ = writeln!(s, "\n### PostMark (000 Table 7), ÷ FFS-async\n");
        let lines = system_lines(&published::TABLE7, "postmark", "run", false);
        table(s, records, model, "system", &lines);
    }
    if ran(records, "smallfile") {
        let _ = writeln!(
            s,
            "\n### Small files (004 Fig. 8): Sprite LFS ÷ SunOS\n\n004 §5.1: \"almost ten times as fast as SunOS for the create and delete phases\", faster reading back; in the create phase the disk was 17% busy under Sprite LFS, 85% under SunOS. SunOS's FFS wrote its metadata synchronously: cairn-sync.\n"
        );
        let lines: Vec<Line> = [
            ("create", "≈ 10", Some(10.0)),
            ("read", "> 1", None),
            ("delete", "≈ 10", Some(10.0)),
        ]
        .iter()
        .map(|(ph, paper, v)| Line {
            name: ph.to_string(),
            paper: paper.to_string(),
            paper_value: *v,
            workload: "smallfile",
            label: ph.to_string(),
            target: "cairn-lfs",
            base: "cairn-sync",
        })
        .collect();
        table(s, records, model, "phase", &lines);
        let on = |t: &str| on_disk(t, model);
        let _ = writeln!(
            s,
            "\nDisk busy in the create phase on the model: Sprite LFS (cairn-lfs) {}, SunOS (cairn-sync) {} (paper: 17%, 85%).",
            fmt(
                busy(records, "smallfile", &on("cairn-lfs"), "create"),
                |v| format!("{:.0}%", v * 100.0)
            ),
            fmt(
                busy(records, "smallfile", &on("cairn-sync"), "create"),
                |v| format!("{:.0}%", v * 100.0)
            ),
        );
    }
    if ran(records, "largefile") {
        let _ = writeln!(
            s,
            "\n### Large file (004 Fig. 9): Sprite LFS ÷ SunOS\n\n004 §5.1: LFS writes faster in every write phase, random writes most (\"substantially faster\"); reads equal, except a sequential re-read after random writes, \"substantially lower\".\n"
        );
        let lines: Vec<Line> = labels(records, "largefile")
            .into_iter()
            .map(|l| {
                let paper = if l.contains("reread") || l.contains("re-read") {
                    "< 1"
                } else if l.contains("rand") && l.contains("write") {
                    "several-fold"
                } else if l.contains("write") {
                    "> 1"
                } else {
                    "≈ 1"
                };
                Line {
                    name: l.clone(),
                    paper: paper.into(),
                    paper_value: None,
                    workload: "largefile",
                    label: l,
                    target: "cairn-lfs",
                    base: "cairn-sync",
                }
            })
            .collect();
        table(s, records, model, "phase", &lines);
    }
    let g = groupcreate::NAME;
    if ran(records, g) {
        let _ = writeln!(
            s,
            "\n### Group commit (001 §3.2): commit=group ÷ commit=sync at {} threads\n\nThe target: at least 5× at under 0.3 flushes per create (001 §3.2 names group commit without a number).\n",
            groupcreate::HEADLINE_THREADS
        );
        let label = format!("{} N={}", groupcreate::PHASE, groupcreate::HEADLINE_THREADS);
        let lines: Vec<Line> = groupcreate::PAIRS
            .iter()
            .map(|(group, sync)| Line {
                name: "group commit".into(),
                paper: "≥ 5".into(),
                paper_value: None,
                workload: g,
                label: label.clone(),
                target: group,
                base: sync,
            })
            .collect();
        table(s, records, model, "", &lines);
        for (group, sync) in groupcreate::PAIRS {
            let on = |t: &str| on_disk(t, model);
            let r = ratio(records, g, &on(group), &on(sync), &label);
            let f = per_op(records, g, &on(group), &label, all_flushes);
            let met = matches!((r, f), (Some(r), Some(f)) if r >= 5.0 && f < 0.3);
            let _ = writeln!(
                s,
                "\nOn the model: {group} ÷ {sync} {} at {} flushes per create: {}.",
                fmt(r, |v| format!("{v:.2}×")),
                fmt(f, |v| format!("{v:.3}")),
                if met { "met" } else { "not met" }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A create+unlink phase: `rate` files/s over 100 files; on the model, `busy` of the
    /// phase and `seeks` per file.
    fn phase(rate: f64, model: Option<(f64, f64)>) -> PhaseResult {
        let ops = 100.0;
        let secs = ops / rate;
        let mut stats =
            serde_json::json!({"fs": {"device": {"writes": 7.0 * ops, "flushes": 4.0 * ops}}});
        if let Some((busy, seeks)) = model {
            stats["fs"]["disk"] = serde_json::json!({"busy_ns": busy * secs * 1e9, "seeks": seeks * ops, "rotations": 0.5 * ops});
        }
        PhaseResult {
            phase: "create+unlink".into(),
            ops,
            unit: "files".into(),
            secs,
            rate,
            counters: Some(Counters::from_cairn_stats(&stats)),
            param: None,
            extra: serde_json::Value::Null,
            cold: None,
        }
    }

    #[test]
    fn three_columns_with_the_models_evidence() {
        let rec = |t: &str, p| Record::ran("create-unlink", t, 1, vec![p]);
        let records = vec![
            rec("cairn-async:wren-iv", phase(1000.0, Some((0.2, 0.1)))),
            rec("cairn-sync:wren-iv", phase(8.0, Some((0.9, 2.0)))),
            rec("cairn-async", phase(20000.0, None)),
            rec("cairn-sync", phase(2000.0, None)),
        ];
        let meta = Meta {
            baseline: "cairn-async".into(),
            device: Some("wren-iv".into()),
            ..Default::default()
        };
        let mut s = String::new();
        render(&mut s, &meta, &records);
        // FFS ÷ FFS-async: paper 80.4 / 10782.8 = 0.0075; model 8/1000; device 2000/20000.
        let ffs = s.lines().find(|l| l.starts_with("| FFS |")).unwrap();
        assert!(ffs.contains("| 0.0075 | 0.0080 | 0.10 | yes |"), "{ffs}");
        assert!(
            ffs.contains("| 90% | 2.00 | 0.50 | 7.00 | 4.00 | 4.00 |"),
            "{ffs}"
        );
        let base = s.lines().find(|l| l.starts_with("| FFS-async |")).unwrap();
        assert!(base.contains("cairn-async baseline"), "{base}");
        // Systems without numbers show dashes, not errors.
        let su = s
            .lines()
            .find(|l| l.starts_with("| Soft-Updates |"))
            .unwrap();
        assert!(su.contains("| — | — |"), "{su}");
        // Every table normalizes a target on the model to the baseline on the model.
        let meta = Meta {
            targets: ["cairn-sync:wren-iv", "cairn-sync"]
                .map(String::from)
                .to_vec(),
            workloads: vec!["create-unlink".into()],
            ..meta
        };
        let rows = crate::report::summarize(&meta, &records);
        let vs = |t: &str| rows.iter().find(|r| r.target == t).unwrap().vs_baseline;
        assert_eq!(vs("cairn-sync:wren-iv"), Some(8.0 / 1000.0));
        assert_eq!(vs("cairn-sync"), Some(2000.0 / 20000.0));
        assert_eq!(rows[0].disk_busy, Some(0.9));
        // No device, no section.
        let mut none = String::new();
        render(&mut none, &Meta::default(), &records);
        assert!(none.is_empty());
        assert_eq!(verdict(Some(0.46), Some(0.60)), "no (+30%)");
        assert_eq!(verdict(Some(0.46), Some(0.50)), "yes");
    }
}
