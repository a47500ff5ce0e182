//! "Against the kernel": issue 23's targets ("Closer to the kernel") judged on the page's run,
//! right after the summary. The issue is done when its targets are on the page "with the
//! targets met, or with the measured reason where a target is beyond what FUSE on this kernel
//! allows"; the measured reason is the FUSE floor (`fuse-floor`: an in-memory file system
//! that does no work, behind the same FUSE adapter as cairn's modes). When even the floor is
//! below a target, no file system behind this adapter can meet it on this kernel.
//!
//! The targets are one table, [`GOALS`]; every number is a median of the run's repetitions
//! taken as the summary takes it ([`median`] of a [`Headline`]), and a metric the run cannot
//! judge (no numbers, a pinned run, a file set that fit the cache) is listed as not in this
//! run with why, never shown as 0.

use std::fmt::Write as _;

use super::{
    CREATE_UNLINK, Headline, KERNEL_REFERENCE, POSTMARK, RAND_WRITE, Rate, SEQ_READ, SEQ_WRITE,
    SMALL_CREATE, SMALL_DELETE, fmt_ratio, median, summary_targets,
};
use crate::report::group_under;
use crate::results::{Meta, Record};
use crate::tables::per_rep;
use crate::target::{FLOOR, Kind, TargetSpec};

/// The mode issue 23 states its targets for; the others are measured against it.
const MODE: &str = "cairn-async";

/// How a goal's number is taken of one target.
enum Measure {
    /// The target's median ÷ `ext4`'s on the same phase in the same run (the summary's first
    /// ratio).
    Kernel(Headline),
    /// The target's own median of `num` ÷ its own of `den`.
    Own { num: Headline, den: Headline },
}

/// Which modes a goal holds to its threshold, and how.
enum Modes {
    /// [`MODE`] alone.
    Alone,
    /// [`MODE`] on the threshold, and each of `others` at least `of` × [`MODE`]'s rate on
    /// the same phase (the floor says nothing of these: they share its FUSE).
    Beside {
        others: &'static [&'static str],
        of: f64,
    },
    /// Every cairn mode of the run, each on its own number against the threshold.
    Every,
}

/// One of issue 23's targets.
struct Goal {
    /// The metric, as the issue names it.
    metric: &'static str,
    measure: Measure,
    /// The least the number may be.
    at_least: f64,
    modes: Modes,
    /// Stated for a run whose benchmark and daemons may use every CPU: a pinned run's number
    /// says nothing of it (two clients on one CPU take turns).
    unpinned: bool,
    /// About a working set larger than the cache: a mode's number counts only where its
    /// buffer cache evicted during the measured phase (a run at a small scale fits it, and its
    /// ratio would be an in-cache one under this name).
    evicting: bool,
}

/// The asynchronous modes the metadata targets hold to cairn-async's rate.
const ASYNC_PEERS: Modes = Modes::Beside {
    others: &["cairn-softdep", "cairn-journal-async", "cairn-lfs"],
    of: 0.9,
};

/// Netnews as 000 Table 6's "total": unbatch and expire as one.
const NETNEWS: Headline = Headline {
    name: "Netnews",
    workload: "netnews",
    rate: Rate::Total(crate::tables::NETNEWS_PHASES),
    unit: "files/s",
};

/// Group-create at `n` threads, each in a directory of its own (the phase's label,
/// `PhaseResult::label`, of `groupcreate::PHASE` at `n` threads).
const fn clients(name: &'static str, label: &'static str) -> Headline {
    Headline {
        name,
        workload: crate::workload::groupcreate::NAME,
        rate: Rate::Phase(label),
        unit: "files/s",
    }
}

/// Issue 23's targets, in the order.
const GOALS: &[Goal] = &[
    Goal {
        metric: "create+unlink (0-length)",
        measure: Measure::Kernel(CREATE_UNLINK),
        at_least: 0.5,
        modes: ASYNC_PEERS,
        unpinned: false,
        evicting: false,
    },
    Goal {
        metric: "small-file create",
        measure: Measure::Kernel(SMALL_CREATE),
        at_least: 0.5,
        modes: ASYNC_PEERS,
        unpinned: false,
        evicting: false,
    },
    Goal {
        metric: "small-file delete",
        measure: Measure::Kernel(SMALL_DELETE),
        at_least: 0.5,
        modes: ASYNC_PEERS,
        unpinned: false,
        evicting: false,
    },
    Goal {
        metric: "PostMark",
        measure: Measure::Kernel(POSTMARK),
        at_least: 0.5,
        modes: ASYNC_PEERS,
        unpinned: false,
        evicting: false,
    },
    Goal {
        metric: "Netnews (unbatch + expire)",
        measure: Measure::Kernel(NETNEWS),
        at_least: 0.5,
        modes: ASYNC_PEERS,
        unpinned: false,
        evicting: false,
    },
    Goal {
        metric: "sequential write",
        measure: Measure::Kernel(SEQ_WRITE),
        at_least: 0.8,
        modes: Modes::Alone,
        unpinned: false,
        evicting: false,
    },
    Goal {
        metric: "sequential read (cold)",
        measure: Measure::Kernel(SEQ_READ),
        at_least: 0.8,
        modes: Modes::Alone,
        unpinned: false,
        evicting: false,
    },
    Goal {
        metric: "random 4 KiB writes",
        measure: Measure::Kernel(RAND_WRITE),
        at_least: 0.5,
        modes: Modes::Alone,
        unpinned: false,
        evicting: false,
    },
    Goal {
        metric: "two clients, separate directories",
        measure: Measure::Own {
            num: clients("N=2", "create N=2"),
            den: clients("N=1", "create N=1"),
        },
        at_least: 1.8,
        modes: Modes::Alone,
        unpinned: true,
        evicting: false,
    },
    Goal {
        metric: "working set 2× the cache",
        measure: Measure::Own {
            num: Headline {
                name: "postmark-large",
                workload: "postmark-large",
                rate: Rate::Phase("run"),
                unit: "tx/s",
            },
            den: POSTMARK,
        },
        at_least: 0.5,
        modes: Modes::Every,
        unpinned: false,
        evicting: true,
    },
];

impl Measure {
    /// The number for `target`, None when a median it divides is missing.
    fn of(&self, records: &[Record], target: &str) -> Option<f64> {
        let (num, den) = match self {
            Measure::Kernel(h) => (
                median(records, h, target)?,
                median(records, h, KERNEL_REFERENCE)?,
            ),
            Measure::Own { num, den } => {
                (median(records, num, target)?, median(records, den, target)?)
            }
        };
        (den.median > 0.0).then(|| num.median / den.median)
    }

    fn headlines(&self) -> Vec<&Headline> {
        match self {
            Measure::Kernel(h) => vec![h],
            Measure::Own { num, den } => vec![num, den],
        }
    }

    /// The phase the number is of (its numerator).
    fn measured(&self) -> &Headline {
        match self {
            Measure::Kernel(h) | Measure::Own { num: h, .. } => h,
        }
    }

    /// The targets whose medians the number divides.
    fn needs<'a>(&self, target: &'a str) -> Vec<&'a str> {
        match self {
            Measure::Kernel(_) => vec![target, KERNEL_REFERENCE],
            Measure::Own { .. } => vec![target],
        }
    }
}

/// A target's number for a goal, or why it has none.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Number {
    Is(f64),
    /// The run has no median for it.
    Missing,
    /// Measured, but its buffer cache evicted nothing: the working set the goal is about
    /// was not larger than the cache on this run.
    InCache,
}

/// Whether `target`'s buffer cache evicted blocks during `h`'s phase (in the median
/// repetition), or it has no cache whose evictions are counted.
fn evicted(records: &[Record], h: &Headline, target: &str) -> bool {
    let labels = h.rate.labels();
    let evictions = per_rep(records, h.workload, target, &|r: &Record| {
        r.phases
            .iter()
            .filter(|p| labels.contains(&p.label().as_str()))
            .filter_map(|p| p.counters.as_ref()?.cache_evictions())
            .reduce(|a, b| a + b)
    });
    evictions.is_none_or(|e| e.median > 0.0)
}

impl Goal {
    fn number(&self, records: &[Record], target: &str) -> Number {
        match self.measure.of(records, target) {
            None => Number::Missing,
            Some(_) if self.evicting && !evicted(records, self.measure.measured(), target) => {
                Number::InCache
            }
            Some(v) => Number::Is(v),
        }
    }

    /// The target as the table states it.
    fn says(&self) -> String {
        let mut s = match &self.measure {
            Measure::Kernel(_) => format!("÷ {KERNEL_REFERENCE} ≥ {}", self.at_least),
            Measure::Own { num, den } => format!("{} ÷ {} ≥ {}", num.name, den.name, self.at_least),
        };
        match &self.modes {
            Modes::Alone => {}
            Modes::Beside { others, of } => {
                let _ = write!(s, "; {} each ≥ {of} × {MODE}", others.join(", "));
            }
            Modes::Every => s.push_str(", every mode"),
        }
        if self.unpinned {
            s.push_str(", unpinned run");
        }
        s
    }

    /// Why the run has no row for this goal, if it has none.
    fn absent(&self, meta: &Meta, records: &[Record]) -> Option<String> {
        if self.unpinned && meta.pinned {
            let cpus: Vec<String> = meta.cpus.iter().map(usize::to_string).collect();
            return Some(format!(
                "a target for an unpinned run; this one ran pinned to CPU(s) {}",
                cpus.join(", ")
            ));
        }
        match self.number(records, MODE) {
            Number::Is(_) => None,
            Number::InCache => Some(format!(
                "`{MODE}`'s cache evicted nothing during {}: its file set fit the cache",
                self.measure.measured().workload
            )),
            Number::Missing => {
                let lacking: Vec<String> = self
                    .measure
                    .needs(MODE)
                    .into_iter()
                    .flat_map(|t| {
                        self.measure
                            .headlines()
                            .into_iter()
                            .filter(move |h| median(records, h, t).is_none())
                            .map(move |h| format!("`{t}` on {}", h.workload))
                    })
                    .collect();
                Some(if lacking.is_empty() {
                    format!("`{MODE}`'s number divides by 0")
                } else {
                    format!("no numbers for {}", lacking.join(", "))
                })
            }
        }
    }
}

/// The floor's number for a goal, when the run has the floor.
enum Floor {
    Reaches(f64),
    /// It ran but could not measure a phase the number needs (a cold read), and why.
    NotMeasured(String),
    /// It ran, but not this.
    NotRun,
}

fn floor(goal: &Goal, records: &[Record]) -> Floor {
    if let Number::Is(v) = goal.number(records, FLOOR) {
        return Floor::Reaches(v);
    }
    let why = goal.measure.headlines().into_iter().find_map(|h| {
        records
            .iter()
            .filter(|r| r.target == FLOOR && r.workload == h.workload)
            .flat_map(|r| &r.skipped)
            .find(|s| h.rate.labels().iter().any(|l| s.covers(l)))
            .map(|s| s.why.clone())
    });
    why.map_or(Floor::NotRun, Floor::NotMeasured)
}

/// How the floor's phases behind a goal's number were made cold, where they say
/// (`PhaseResult::cold`: the kernel's caches dropped under its daemon, which an unmount would
/// empty): its cold number is then FUSE's for a read that misses the kernel's caches, not a
/// device's, and the page says so beside it. None for a goal with no cold phase, and for a
/// run made before the floor could be made cold (its cold phases were not measured).
fn floor_cold(goal: &Goal, records: &[Record]) -> Option<String> {
    goal.measure.headlines().into_iter().find_map(|h| {
        let labels = h.rate.labels();
        records
            .iter()
            .filter(|r| r.target == FLOOR && r.workload == h.workload)
            .flat_map(|r| &r.phases)
            .filter(|p| labels.contains(&p.label().as_str()))
            .find_map(|p| p.cold.clone())
    })
}

/// The other modes' numbers a goal speaks of, in its order (every cairn mode of the run but
/// [`MODE`], in the run's order, for [`Modes::Every`]): ÷ [`MODE`]'s rate for
/// [`Modes::Beside`], their own [`Goal::number`] for [`Modes::Every`].
fn others<'a>(goal: &Goal, meta: &'a Meta, records: &[Record]) -> Vec<(&'a str, Number)> {
    match &goal.modes {
        Modes::Alone => Vec::new(),
        Modes::Beside { others, .. } => {
            let h = goal.measure.measured();
            let base = median(records, h, MODE).filter(|b| b.median > 0.0);
            others
                .iter()
                .map(|t| {
                    let v = median(records, h, t)
                        .zip(base.as_ref())
                        .map_or(Number::Missing, |(v, b)| Number::Is(v.median / b.median));
                    (*t, v)
                })
                .collect()
        }
        Modes::Every => summary_targets(meta)
            .into_iter()
            .filter(|t| *t != MODE)
            .filter(|t| TargetSpec::parse(t).is_ok_and(|s| matches!(s.kind, Kind::Cairn { .. })))
            .map(|t| (t, goal.number(records, t)))
            .collect(),
    }
}

/// "met"; else what falls short — with the floor's number as the measured reason where even
/// the floor is below the threshold ("beyond FUSE") — and which modes the goal speaks of
/// have no number here.
fn verdict(goal: &Goal, value: f64, others: &[(&str, Number)], floor: &Floor) -> String {
    let th = goal.at_least;
    let every = matches!(goal.modes, Modes::Every);
    let names = |keep: &dyn Fn(Number) -> bool| -> Vec<&str> {
        others
            .iter()
            .filter(|(_, n)| keep(*n))
            .map(|(t, _)| *t)
            .collect()
    };
    // Below the threshold on their own numbers: what the floor, measured the same way, can
    // explain. The modes held to a share of cairn-async's rate share its FUSE: the floor
    // says nothing of them.
    let mut short: Vec<&str> = Vec::new();
    if value < th {
        short.push(MODE);
    }
    if every {
        short.extend(names(&|n| matches!(n, Number::Is(v) if v < th)));
    }
    let mut parts: Vec<String> = Vec::new();
    let mut plain_not_met = false;
    if !short.is_empty() {
        parts.push(match floor {
            Floor::Reaches(f) if *f < th => {
                format!("beyond FUSE: the floor reaches {}", fmt_ratio(*f))
            }
            _ if every => format!("not met: {} < {th}", short.join(", ")),
            _ => {
                plain_not_met = true;
                "not met".to_string()
            }
        });
    }
    if let Modes::Beside { of, .. } = goal.modes {
        let behind = names(&|n| matches!(n, Number::Is(v) if v < of));
        if !behind.is_empty() {
            let b = format!("{} < {of} × {MODE}", behind.join(", "));
            parts.push(if plain_not_met {
                b
            } else {
                format!("not met: {b}")
            });
        }
    }
    if parts.is_empty() {
        parts.push("met".to_string());
    }
    for (why, kind) in [
        ("not in this run", Number::Missing),
        ("its file set fit the cache", Number::InCache),
    ] {
        let n = names(&|n| n == kind);
        if !n.is_empty() {
            parts.push(format!("{}: {why}", n.join(", ")));
        }
    }
    parts.join("; ")
}

/// How much slower than pinned an unpinned number may be: issue 23's "unpinned within 1.2×
/// of pinned".
const UNPINNED_WITHIN: f64 = 1.2;

/// The section of the page's runs: the pinned run's, and the unpinned runs beside it.
pub(super) fn section(s: &mut String, current: &super::Current) {
    let beside: Vec<(&Meta, &[Record])> = current
        .unpinned
        .iter()
        .map(|r| (&r.meta, &r.records[..]))
        .collect();
    judge(s, &current.main.meta, &current.main.records, &beside);
}

/// Whether two runs ran on one machine (its CPU and kernel): a pinned number and an unpinned
/// one are compared only then — on another machine the ratio to `ext4` moves too.
fn same_machine(a: &Meta, b: &Meta) -> bool {
    a.cpu_model == b.cpu_model && a.kernel == b.kernel
}

/// "; unpinned V = R × pinned", for a goal judged on the pinned run (`records`) whose number
/// an unpinned run has too (a metric of the kernel's, where the issue asks the unpinned
/// number to be within [`UNPINNED_WITHIN`] of the pinned one); empty otherwise. Where it is
/// not, and the floor, measured in both runs, is not either, the floor's share is the
/// measured reason: what unpinned costs a file system that does no work behind the same
/// FUSE adapter is FUSE's, not cairn's.
fn against_unpinned(
    goal: &Goal,
    pinned: f64,
    (meta, records): (&Meta, &[Record]),
    beside: &[(&Meta, &[Record])],
) -> String {
    if !matches!(goal.measure, Measure::Kernel(_)) || goal.unpinned {
        return String::new();
    }
    let Some((free, u)) = beside
        .iter()
        .find_map(|&(m, r)| match goal.number(r, MODE) {
            Number::Is(u) if same_machine(meta, m) && !m.pinned => Some((r, u)),
            _ => None,
        })
    else {
        return String::new();
    };
    let share = u / pinned;
    if share >= 1.0 / UNPINNED_WITHIN {
        return format!(
            "; unpinned {} = {} × pinned",
            fmt_ratio(u),
            fmt_ratio(share)
        );
    }
    let floor_share = match (goal.number(records, FLOOR), goal.number(free, FLOOR)) {
        (Number::Is(p), Number::Is(f)) if p > 0.0 => Some(f / p),
        _ => None,
    };
    let why = match floor_share {
        Some(f) if f < 1.0 / UNPINNED_WITHIN => {
            format!("beyond FUSE: the floor's is {} × pinned", fmt_ratio(f))
        }
        _ => format!("not met: more than {UNPINNED_WITHIN}× slower"),
    };
    format!(
        "; unpinned {} = {} × pinned ({why})",
        fmt_ratio(u),
        fmt_ratio(share)
    )
}

/// One row per goal the pinned run (`meta`, `records`) has numbers for — or, for a goal it
/// cannot judge (one for an unpinned run), the first run `beside` that can, named in the row
/// — then the goals no run can judge and why.
fn judge(s: &mut String, meta: &Meta, records: &[Record], beside: &[(&Meta, &[Record])]) {
    let has_floor = meta.targets.iter().any(|t| t == FLOOR);
    let _ = writeln!(s, "## Against the kernel (issue 23's targets)\n");
    let _ = writeln!(
        s,
        "Issue 23 (\"Closer to the kernel\") asks of `{MODE}` a share of `{KERNEL_REFERENCE}`'s median rate on each metadata and data phase, and of the modes it names a share of `{MODE}`'s; each row is one of its targets, judged on this run's medians as the summary takes them. \"{MODE}\": its number as the target states it; \"other modes\": theirs (÷ `{MODE}` where the target holds them to it)."
    );
    if !beside.is_empty() {
        let _ = write!(
            s,
            "A target this run cannot judge (one for an unpinned run; a working set its cache held) is judged on the [unpinned run](#unpinned) beside it, named in the row. "
        );
        match beside.iter().find(|(m, _)| !same_machine(meta, m)) {
            None => {
                let _ = writeln!(
                    s,
                    "Each ratio to `{KERNEL_REFERENCE}` says that run's number and its share of the pinned one (the issue asks the unpinned within {UNPINNED_WITHIN}× of the pinned, a share of at least {:.2}).",
                    1.0 / UNPINNED_WITHIN
                );
            }
            Some((m, _)) => {
                let _ = writeln!(
                    s,
                    "The unpinned run ran on another machine ({}, kernel {}; this one: {}, kernel {}), so its numbers are not held to this run's: the issue's \"unpinned within {UNPINNED_WITHIN}× of pinned\" needs both on one machine.",
                    m.cpu_model, m.kernel, meta.cpu_model, meta.kernel
                );
            }
        }
    }
    if has_floor {
        let _ = writeln!(
            s,
            "\"{FLOOR}\": the same number of `{FLOOR}` (`cairn mount --memory`: a file system that does no work, behind the same FUSE adapter), what FUSE on this kernel allows; where even it is below the target, the verdict says \"beyond FUSE\" with the floor's number as the measured reason.\n"
        );
    } else {
        let _ = writeln!(
            s,
            "This run has no `{FLOOR}` (a file system that does no work, behind the same FUSE adapter), so a target missed is \"not met\" whatever FUSE allows: only a run with it can show a target beyond what FUSE on this kernel allows.\n"
        );
    }
    let mut rows = Vec::new();
    let mut lacking = Vec::new();
    let mut unmeasured: Vec<(String, Vec<&str>)> = Vec::new();
    let mut made_cold: Vec<(String, Vec<&str>)> = Vec::new();
    for g in GOALS {
        // The run the row is judged on: the pinned one, else the first beside it that can.
        let (run_meta, run_records, from) = match g.absent(meta, records) {
            None => (meta, records, None),
            Some(why) => match beside.iter().find(|(m, r)| g.absent(m, r).is_none()) {
                Some(&(m, r)) => (m, r, Some(m)),
                None => {
                    lacking.push(format!("{} ({why})", g.metric));
                    continue;
                }
            },
        };
        let Number::Is(value) = g.number(run_records, MODE) else {
            continue;
        };
        let others = others(g, run_meta, run_records);
        let fl = if run_meta.targets.iter().any(|t| t == FLOOR) {
            floor(g, run_records)
        } else {
            Floor::NotRun
        };
        let metric = match from {
            None => g.metric.to_string(),
            Some(m) => format!(
                "{} (the unpinned run of {})",
                g.metric,
                super::started_date(&m.started)
            ),
        };
        let mut cells = vec![metric, g.says(), fmt_ratio(value), {
            // The modes without a number are named in the verdict, not shown as a value.
            let shown: Vec<String> = others
                .iter()
                .filter_map(|(t, n)| match n {
                    Number::Is(v) => Some(format!("{t} {}", fmt_ratio(*v))),
                    _ => None,
                })
                .collect();
            if shown.is_empty() {
                "—".to_string()
            } else {
                shown.join(", ")
            }
        }];
        if has_floor {
            cells.push(match &fl {
                Floor::Reaches(f) => {
                    if let Some(how) = floor_cold(g, run_records) {
                        group_under(&mut made_cold, &how, g.metric);
                    }
                    fmt_ratio(*f)
                }
                Floor::NotMeasured(why) => {
                    group_under(&mut unmeasured, why, g.metric);
                    "not measured".to_string()
                }
                Floor::NotRun => "—".to_string(),
            });
        }
        let mut v = verdict(g, value, &others, &fl);
        if from.is_none() {
            v.push_str(&against_unpinned(g, value, (meta, records), beside));
        }
        cells.push(v);
        rows.push(cells);
    }
    if !rows.is_empty() {
        let floor_col = if has_floor {
            format!(" {FLOOR} |")
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "| metric | target | {MODE} | other modes |{floor_col} verdict |"
        );
        let _ = writeln!(
            s,
            "|---|---|--:|---|{}---|",
            if has_floor { "--:|" } else { "" }
        );
        for r in &rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
    }
    for (how, metrics) in &made_cold {
        let _ = writeln!(
            s,
            "\n`{FLOOR}` made cold for {}: {how}.",
            metrics.join(", ")
        );
    }
    for (why, metrics) in &unmeasured {
        let _ = writeln!(
            s,
            "\n`{FLOOR}` not measured on {}: {why}.",
            metrics.join(", ")
        );
    }
    if !lacking.is_empty() {
        let _ = writeln!(s, "\nNot in this run: {}.", lacking.join("; "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::Counters;
    use crate::results::Skipped;
    use crate::workload::PhaseResult;

    fn rec(workload: &str, target: &str, phases: &[(&str, f64)]) -> Record {
        let phases = phases
            .iter()
            .map(|(phase, rate)| PhaseResult {
                phase: phase.to_string(),
                ops: 1000.0,
                unit: "files".into(),
                secs: 1000.0 / rate,
                rate: *rate,
                counters: None,
                param: None,
                extra: serde_json::Value::Null,
                cold: None,
            })
            .collect();
        Record::ran(workload, target, 1, phases)
    }

    fn meta(floor: bool) -> Meta {
        let mut targets: Vec<String> = [
            "cairn-sync",
            "cairn-async",
            "cairn-softdep",
            "cairn-journal-async",
            "cairn-lfs",
            "cairn-lfs@loop",
            "ext4",
        ]
        .map(String::from)
        .to_vec();
        if floor {
            targets.push(FLOOR.into());
        }
        Meta {
            baseline: MODE.into(),
            targets,
            pinned: true,
            cpus: vec![0],
            ..Meta::default()
        }
    }

    /// The floor's phases of `workload` labelled `label`, made cold as the harness makes it.
    fn cold_on_the_floor(v: &mut [Record], workload: &str, label: &str) {
        for p in v
            .iter_mut()
            .filter(|r| r.target == FLOOR && r.workload == workload)
            .flat_map(|r| &mut r.phases)
            .filter(|p| p.phase == label)
        {
            p.cold = Some(crate::target::FLOOR_COLD.into());
        }
    }

    /// One run with each kind of row: create+unlink met; small-file create beyond FUSE (the
    /// floor itself at 0.30 of ext4); small-file delete not met (the floor at 0.80);
    /// PostMark met by cairn-async but not by cairn-lfs (0.50 × cairn-async); Netnews beyond
    /// FUSE (the floor at 0.30, its unbatch made cold under its daemon); sequential read
    /// (cold) beyond FUSE, the floor's read made cold the same way (0.60); the working set
    /// below half the in-cache rate for cairn-sync, and in cairn-journal-async's cache (no
    /// evictions); sequential write and the two clients not in the run.
    fn records() -> Vec<Record> {
        let mut v = Vec::new();
        // (target, create+unlink, smallfile create, smallfile delete, postmark, seq-read)
        for (t, cu, cr, de, pm, sr) in [
            ("ext4", 50_000.0, 50_000.0, 50_000.0, 10_000.0, 800.0),
            (MODE, 30_000.0, 10_000.0, 10_000.0, 6_000.0, 400.0),
            (
                "cairn-softdep",
                29_000.0,
                10_000.0,
                10_000.0,
                6_000.0,
                700.0,
            ),
            (
                "cairn-journal-async",
                30_000.0,
                10_000.0,
                10_000.0,
                6_000.0,
                700.0,
            ),
            ("cairn-lfs", 28_000.0, 10_000.0, 10_000.0, 3_000.0, 700.0),
            // A loop-device run is no mode of its own: never in "every mode".
            ("cairn-lfs@loop", 1.0, 1.0, 1.0, 1.0, 1.0),
            (FLOOR, 45_000.0, 15_000.0, 40_000.0, 9_000.0, 480.0),
        ] {
            v.push(rec("create-unlink", t, &[("create+unlink", cu)]));
            v.push(rec("smallfile", t, &[("create", cr), ("delete", de)]));
            v.push(rec("postmark", t, &[("run", pm)]));
            v.push(rec("largefile", t, &[("seq-read", sr)]));
        }
        // Netnews: unbatch, then expire; cairn-async at 0.12 of ext4, the floor at 0.30.
        for (t, unbatch, expire) in [
            ("ext4", 10_000.0, 20_000.0),
            (MODE, 1_000.0, 4_000.0),
            ("cairn-softdep", 1_000.0, 4_000.0),
            ("cairn-journal-async", 1_000.0, 4_000.0),
            ("cairn-lfs", 1_000.0, 4_000.0),
            (FLOOR, 3_000.0, 6_000.0),
        ] {
            v.push(rec(
                "netnews",
                t,
                &[("populate", 1.0), ("unbatch", unbatch), ("expire", expire)],
            ));
        }
        cold_on_the_floor(&mut v, "netnews", "unbatch");
        cold_on_the_floor(&mut v, "largefile", "seq-read");
        v.push(rec("postmark", "cairn-sync", &[("run", 1_000.0)]));
        // postmark-large with the evictions a larger-than-cache file set causes, but for
        // cairn-journal-async's (its set fit the cache) and the floor's (no cache counted).
        for (t, large, evictions) in [
            (MODE, 4_000.0, Some(500.0)),
            ("cairn-sync", 400.0, Some(500.0)),
            ("cairn-softdep", 3_000.0, Some(500.0)),
            ("cairn-journal-async", 3_000.0, Some(0.0)),
            ("cairn-lfs", 3_000.0, Some(500.0)),
            (FLOOR, 9_000.0, None),
        ] {
            let mut r = rec("postmark-large", t, &[("run", large)]);
            if let Some(e) = evictions {
                let c = Counters([("fs.cache.evictions".to_string(), e)].into());
                r.phases[0].counters = Some(c);
            }
            v.push(r);
        }
        v.push(rec(
            crate::workload::groupcreate::NAME,
            MODE,
            &[("create N=1", 1_000.0), ("create N=2", 1_900.0)],
        ));
        v
    }

    fn row<'a>(s: &'a str, metric: &str) -> Option<&'a str> {
        s.lines().find(|l| l.starts_with(&format!("| {metric} |")))
    }

    #[test]
    fn each_target_is_met_beyond_fuse_not_met_or_not_in_the_run() {
        let mut s = String::new();
        judge(&mut s, &meta(true), &records(), &[]);
        let r = |m: &str| row(&s, m).unwrap_or_else(|| panic!("no {m} row in\n{s}"));
        assert!(
            s.contains("| metric | target | cairn-async | other modes | fuse-floor | verdict |"),
            "{s}"
        );
        assert_eq!(
            r("create+unlink (0-length)"),
            "| create+unlink (0-length) | ÷ ext4 ≥ 0.5; cairn-softdep, cairn-journal-async, cairn-lfs each ≥ 0.9 × cairn-async | 0.60 | cairn-softdep 0.97, cairn-journal-async 1.00, cairn-lfs 0.93 | 0.90 | met |"
        );
        assert!(
            r("small-file create").ends_with("| 0.20 | cairn-softdep 1.00, cairn-journal-async 1.00, cairn-lfs 1.00 | 0.30 | beyond FUSE: the floor reaches 0.30 |"),
            "{s}"
        );
        assert!(
            r("small-file delete").ends_with("| 0.20 | cairn-softdep 1.00, cairn-journal-async 1.00, cairn-lfs 1.00 | 0.80 | not met |"),
            "{s}"
        );
        assert!(
            r("PostMark").ends_with("| 0.60 | cairn-softdep 1.00, cairn-journal-async 1.00, cairn-lfs 0.50 | 0.90 | not met: cairn-lfs < 0.9 × cairn-async |"),
            "{s}"
        );
        assert!(
            r("Netnews (unbatch + expire)").ends_with("| 0.12 | cairn-softdep 1.00, cairn-journal-async 1.00, cairn-lfs 1.00 | 0.30 | beyond FUSE: the floor reaches 0.30 |"),
            "{s}"
        );
        assert!(
            r("sequential read (cold)")
                .ends_with("| 0.50 | — | 0.60 | beyond FUSE: the floor reaches 0.60 |"),
            "{s}"
        );
        // How the floor's cold numbers were made cold, once, naming the rows they stand in.
        assert!(
            s.contains(&format!(
                "\n`fuse-floor` made cold for Netnews (unbatch + expire), sequential read (cold): {}.\n",
                crate::target::FLOOR_COLD
            )),
            "{s}"
        );
        assert_eq!(s.matches("made cold for").count(), 1, "{s}");
        assert!(!s.contains("not measured"), "{s}");
        assert!(
            r("working set 2× the cache").ends_with("| 0.67 | cairn-sync 0.40, cairn-softdep 0.50, cairn-lfs 1.00 | 1.00 | not met: cairn-sync < 0.5; cairn-journal-async: its file set fit the cache |"),
            "{s}"
        );
        // Missing metrics: listed once with why, never a row of zeros.
        for m in [
            "sequential write",
            "random 4 KiB writes",
            "two clients, separate directories",
        ] {
            assert!(row(&s, m).is_none(), "{m} has a row in\n{s}");
        }
        assert!(
            s.contains("Not in this run: sequential write (no numbers for `cairn-async` on largefile, `ext4` on largefile);"),
            "{s}"
        );
        assert!(
            s.contains("two clients, separate directories (a target for an unpinned run; this one ran pinned to CPU(s) 0)"),
            "{s}"
        );
        assert!(!s.contains("| 0.00 |") && !s.contains(" 0 |"), "{s}");
        assert!(!s.contains("@loop"), "{s}");

        // Unpinned, the two clients have their row; without the floor, no column for it and
        // a target missed is not met (nothing measured it as beyond FUSE).
        let mut m = meta(false);
        m.pinned = false;
        let mut t = String::new();
        judge(&mut t, &m, &records(), &[]);
        assert!(
            t.contains("| two clients, separate directories | N=2 ÷ N=1 ≥ 1.8, unpinned run | 1.90 | — | met |"),
            "{t}"
        );
        assert!(
            row(&t, "small-file create").is_some_and(|l| l.ends_with(
                "| 0.20 | cairn-softdep 1.00, cairn-journal-async 1.00, cairn-lfs 1.00 | not met |"
            )),
            "{t}"
        );
        assert!(t.contains("This run has no `fuse-floor`"), "{t}");
        assert!(
            !t.contains("| fuse-floor |") && !t.contains("made cold"),
            "{t}"
        );

        // cairn-async's file set fit its cache: no working-set row, and the reason.
        let mut in_cache = records();
        for r in in_cache
            .iter_mut()
            .filter(|r| r.workload == "postmark-large" && r.target == MODE)
        {
            r.phases[0].counters = Some(Counters([("fs.cache.evictions".to_string(), 0.0)].into()));
        }
        let mut u = String::new();
        judge(&mut u, &m, &in_cache, &[]);
        assert!(row(&u, "working set 2× the cache").is_none(), "{u}");
        assert!(
            u.contains("working set 2× the cache (`cairn-async`'s cache evicted nothing during postmark-large: its file set fit the cache)"),
            "{u}"
        );
    }

    /// A run whose floor could not start cold (a run made before the floor was made cold
    /// under its daemon: an unmount would have emptied it) keeps its reason where the number
    /// would be, and its Netnews, not run on the floor, no floor at all; a cold number with
    /// no word of how it was made cold gets no line saying how.
    #[test]
    fn a_floor_that_could_not_start_cold_says_why_and_gives_no_reason_beyond_fuse() {
        const WHY: &str = "cannot start cold: its files live only in its daemon's memory (an unmount empties it): no cold cache, crash or fsck";
        let mut v: Vec<Record> = records()
            .into_iter()
            .filter(|r| {
                r.target != FLOOR || !matches!(r.workload.as_str(), "largefile" | "netnews")
            })
            .collect();
        let mut r = rec("largefile", FLOOR, &[]);
        r.skipped.push(Skipped {
            phase: Some("seq-read".into()),
            why: WHY.into(),
        });
        v.push(r);
        let mut s = String::new();
        judge(&mut s, &meta(true), &v, &[]);
        let r = |m: &str| row(&s, m).unwrap_or_else(|| panic!("no {m} row in\n{s}"));
        assert!(
            r("sequential read (cold)").ends_with("| 0.50 | — | not measured | not met |"),
            "{s}"
        );
        assert!(
            r("Netnews (unbatch + expire)").ends_with("| — | not met |"),
            "{s}"
        );
        assert!(
            s.contains(&format!(
                "`fuse-floor` not measured on sequential read (cold): {WHY}."
            )),
            "{s}"
        );
        assert!(!s.contains("made cold"), "{s}");

        // Measured, but with no word of how it was made cold: a number, and no such line.
        let mut v = records();
        for p in v.iter_mut().flat_map(|r| &mut r.phases) {
            p.cold = None;
        }
        let mut t = String::new();
        judge(&mut t, &meta(true), &v, &[]);
        assert!(
            row(&t, "sequential read (cold)")
                .is_some_and(|l| l.ends_with("| 0.60 | beyond FUSE: the floor reaches 0.60 |")),
            "{t}"
        );
        assert!(!t.contains("made cold"), "{t}");
    }

    /// An unpinned run beside the pinned one: the two clients, which the pinned run cannot
    /// judge, get their row from it, named; a metric of the kernel's judged pinned says how
    /// far the unpinned number is (issue 23: within 1.2× of pinned), and says "not met"
    /// beyond it. A goal neither run can judge keeps the pinned run's reason.
    #[test]
    fn an_unpinned_run_beside_judges_what_the_pinned_one_cannot() {
        let pinned = meta(true);
        let pinned_records: Vec<Record> = records()
            .into_iter()
            .filter(|r| r.workload != crate::workload::groupcreate::NAME)
            .collect();
        let mut free = meta(false);
        free.pinned = false;
        free.cpus = vec![0, 1];
        free.started = "20261129T210000Z".into();
        let mut free_records: Vec<Record> = records()
            .into_iter()
            .filter(|r| {
                matches!(r.workload.as_str(), "create-unlink" | "smallfile")
                    || r.workload == crate::workload::groupcreate::NAME
            })
            .collect();
        // Unpinned, cairn-async's create+unlink at 0.75 of its pinned rate; small-file
        // create as pinned.
        for r in free_records
            .iter_mut()
            .filter(|r| r.workload == "create-unlink" && r.target == MODE)
        {
            r.phases[0].rate *= 0.75;
        }
        // Small-file delete: cairn-async at 0.75, and the floor at 0.70, of their pinned
        // rates: beyond FUSE.
        for r in free_records
            .iter_mut()
            .filter(|r| r.workload == "smallfile" && (r.target == MODE || r.target == FLOOR))
        {
            let f = if r.target == MODE { 0.75 } else { 0.7 };
            for p in r.phases.iter_mut().filter(|p| p.phase == "delete") {
                p.rate *= f;
            }
        }
        let mut s = String::new();
        judge(&mut s, &pinned, &pinned_records, &[(&free, &free_records)]);
        assert!(
            s.contains("| two clients, separate directories (the unpinned run of 2026-11-29) | N=2 ÷ N=1 ≥ 1.8, unpinned run | 1.90 |"),
            "{s}"
        );
        assert!(
            row(&s, "create+unlink (0-length)").is_some_and(|l| l
                .ends_with("; unpinned 0.45 = 0.75 × pinned (not met: more than 1.2× slower) |")),
            "{s}"
        );
        assert!(
            row(&s, "small-file create")
                .is_some_and(|l| l.ends_with("; unpinned 0.20 = 1.00 × pinned |")),
            "{s}"
        );
        assert!(
            row(&s, "small-file delete")
                .is_some_and(|l| l
                    .ends_with("= 0.75 × pinned (beyond FUSE: the floor's is 0.70 × pinned) |")),
            "{s}"
        );
        assert!(
            !s.contains("two clients, separate directories (a target"),
            "{s}"
        );
        // An unpinned run on another machine still judges the unpinned targets, but its
        // numbers are not held to the pinned run's.
        let mut elsewhere = free.clone();
        elsewhere.cpu_model = "another CPU".into();
        let mut e = String::new();
        judge(
            &mut e,
            &pinned,
            &pinned_records,
            &[(&elsewhere, &free_records)],
        );
        assert!(e.contains("ran on another machine (another CPU"), "{e}");
        assert!(!e.contains("× pinned"), "{e}");
        assert!(
            e.contains("| two clients, separate directories (the unpinned run"),
            "{e}"
        );
        // Without the unpinned run, the pinned run's reason.
        let mut t = String::new();
        judge(&mut t, &pinned, &pinned_records, &[]);
        assert!(
            t.contains("two clients, separate directories (a target for an unpinned run"),
            "{t}"
        );
    }
}
