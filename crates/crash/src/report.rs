//! Results: per mode × workload counts, JSON, the Markdown summary for docs/CRASH.md, and
//! reproducer metadata.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::modes::{Allow, Expectation};
pub use crate::repro::Repro;
use crate::repro::StateClass;

/// The first unexpected state of a mode × workload: the states are checked epoch by epoch,
/// so it is the one reached by the shortest prefix of the workload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstFailure {
    pub workload: String,
    pub epoch: usize,
    /// States of this mode × workload checked before it.
    pub checked_before: u64,
    /// The state (`epoch E: k/n writes [...]`), its class and crash point.
    pub state: String,
    /// The first broken promises and corruption findings.
    pub what: Vec<String>,
    /// The shortest prefix of the workload's calls that reproduces it (calls in flight
    /// marked), and how many calls the workload made in all.
    pub prefix: Vec<String>,
    pub calls: usize,
}

impl FirstFailure {
    /// One paragraph for a verdict.
    pub fn describe(&self) -> String {
        format!(
            "first failure in workload {} at epoch {} ({} state(s) checked before it): {}: {}; shortest reproducing prefix ({} of {} calls): {}",
            self.workload,
            self.epoch,
            self.checked_before,
            self.state,
            self.what.join("; "),
            self.prefix.len(),
            self.calls,
            self.prefix.join(", ")
        )
    }
}

/// Counts for one mode × workload.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CellResult {
    pub mode: String,
    pub workload: String,
    pub states: u64,
    pub clean: u64,
    pub leak_only: u64,
    pub interrupted_rename: u64,
    pub corrupt: u64,
    /// States with at least one broken durability promise.
    pub durability_violations: u64,
    /// States where a file holds another file's (or never-written) data.
    pub stale: u64,
    /// States the mode's expectations forbid.
    pub unexpected: u64,
    /// Whether the workload is one of the scripted set (where weaknesses must show).
    #[serde(default)]
    pub scripted: bool,
    pub seconds: f64,
    /// The first few unexpected states, described.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// The first unexpected state in check order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<FirstFailure>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reproducers: Vec<String>,
}

impl CellResult {
    pub fn add(&mut self, class: StateClass, violation: bool, stale: bool, unexpected: bool) {
        self.states += 1;
        match class {
            StateClass::Clean => self.clean += 1,
            StateClass::LeakOnly => self.leak_only += 1,
            StateClass::InterruptedRename => self.interrupted_rename += 1,
            StateClass::Corrupt => self.corrupt += 1,
        }
        self.durability_violations += violation as u64;
        self.stale += stale as u64;
        self.unexpected += unexpected as u64;
    }

    fn merge(&mut self, o: &CellResult) {
        self.states += o.states;
        self.clean += o.clean;
        self.leak_only += o.leak_only;
        self.interrupted_rename += o.interrupted_rename;
        self.corrupt += o.corrupt;
        self.durability_violations += o.durability_violations;
        self.stale += o.stale;
        self.unexpected += o.unexpected;
        self.seconds += o.seconds;
    }
}

/// Per-mode totals, in the order the modes first appear.
pub fn totals(cells: &[CellResult]) -> Vec<CellResult> {
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<String, CellResult> = BTreeMap::new();
    for c in cells {
        if !by.contains_key(&c.mode) {
            order.push(c.mode.clone());
        }
        let t = by.entry(c.mode.clone()).or_insert_with(|| CellResult {
            mode: c.mode.clone(),
            workload: "all".into(),
            ..Default::default()
        });
        t.merge(c);
    }
    order.into_iter().filter_map(|m| by.remove(&m)).collect()
}

fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        "–".into()
    } else {
        format!("{:.1}%", n as f64 * 100.0 / of as f64)
    }
}

/// The Markdown report: the declared expectations, the measured counterpart of 000 Table 3,
/// and the per-workload table.
pub fn markdown(
    cells: &[CellResult],
    expects: &[Expectation],
    verdicts: &[String],
    rate: &str,
) -> String {
    let mut s = String::new();
    let tot = totals(cells);
    let modes: Vec<&str> = tot.iter().map(|t| t.mode.as_str()).collect();
    let exp = |m: &str| expects.iter().find(|e| e.mode == m);

    let _ = writeln!(s, "### Declared expectations\n");
    let _ = writeln!(
        s,
        "| mode | metadata durable on return | fsync: data before pointers | no stale data | corruption | leaks | interrupted rename | durability violations | recovery |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for m in &modes {
        if let Some(e) = exp(m) {
            let yes = |b: bool| if b { "promised" } else { "–" };
            let _ = writeln!(
                s,
                "| {m} | {} | {} | {} | {} | {} | {} | {} | {} |",
                yes(e.promises.metadata_on_return),
                yes(e.promises.fsync_data_first),
                yes(e.promises.no_stale_data),
                e.corrupt.word(),
                e.leak.word(),
                e.interrupted_rename.word(),
                e.durability.word(),
                if e.recovery.is_some() {
                    "yes"
                } else if !crate::modes::is_ffs(&e.mode) {
                    // LFS: the read-only mount rolls forward before the check.
                    "in the mount"
                } else {
                    "fsck only"
                }
            );
        }
    }

    let _ = writeln!(s, "\n### Measured (000 Table 3, with numbers)\n");
    let _ = write!(s, "| property |");
    for m in &modes {
        let _ = write!(s, " {m} |");
    }
    let _ = write!(s, "\n|---|");
    for _ in &modes {
        let _ = write!(s, "---|");
    }
    let _ = writeln!(s);
    let row =
        |s: &mut String, name: &str, f: &dyn Fn(&CellResult, Option<&Expectation>) -> String| {
            let _ = write!(s, "| {name} |");
            for t in &tot {
                let _ = write!(s, " {} |", f(t, exp(&t.mode)));
            }
            let _ = writeln!(s);
        };
    row(&mut s, "crash states checked", &|t, _| t.states.to_string());
    row(&mut s, "clean (fsck finds nothing)", &|t, _| {
        format!("{} ({})", t.clean, pct(t.clean, t.states))
    });
    row(
        &mut s,
        "leaks only: \"no inconsistencies other than unclaimed free space\" (002 §4)",
        &|t, _| format!("{} ({})", t.leak_only, pct(t.leak_only, t.states)),
    );
    row(
        &mut s,
        "interrupted directory rename (fsck repairs; 001 §6)",
        &|t, _| t.interrupted_rename.to_string(),
    );
    row(
        &mut s,
        "corrupt: \"recovery is non-deterministic and may be impossible\" (000 Table 3)",
        &|t, _| format!("{} ({})", t.corrupt, pct(t.corrupt, t.states)),
    );
    row(
        &mut s,
        "durability violations (what the mode promises: sync = every returned call; all = fsync, sync(2))",
        &|t, e| {
            let what = e.map_or("", |e| {
                if e.promises.metadata_on_return {
                    " (metadata + fsync)"
                } else {
                    " (fsync only)"
                }
            });
            format!("{}{what}", t.durability_violations)
        },
    );
    row(
        &mut s,
        "stale data: another file's bytes, or zeros where data was written (\"new data blocks are written before inodes\": Soft Updates only)",
        &|t, e| {
            let note = if e.is_some_and(|e| e.promises.no_stale_data) {
                ""
            } else {
                " (not promised)"
            };
            format!("{}{note}", t.stale)
        },
    );
    row(&mut s, "unexpected (fails the campaign)", &|t, _| {
        t.unexpected.to_string()
    });

    let _ = writeln!(s, "\n### Per workload\n");
    let _ = writeln!(
        s,
        "| mode | workload | states | clean | leak-only | interrupted rename | corrupt | durability violations | stale data | unexpected |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in cells {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
    if !rate.is_empty() {
        let _ = writeln!(s, "\n{rate}");
    }
    let _ = writeln!(s);
    if verdicts.is_empty() {
        let _ = writeln!(s, "**Verdict: every mode delivered what it declares.**");
    } else {
        let _ = writeln!(s, "**Verdict: FAILED**\n");
        for v in verdicts {
            let _ = writeln!(s, "- {v}");
        }
    }
    s
}

/// Checks the totals against the expectations that concern a whole campaign: a weakness
/// marked [`Allow::Demonstrated`] must have shown up in the mode's scripted workloads.
pub fn demonstrated(cells: &[CellResult], e: &Expectation) -> Option<String> {
    let scripted: Vec<&CellResult> = cells
        .iter()
        .filter(|c| c.mode == e.mode && c.scripted)
        .collect();
    if scripted.is_empty() {
        return None;
    }
    let sum = |f: fn(&CellResult) -> u64| scripted.iter().map(|c| f(c)).sum::<u64>();
    let mut missing = Vec::new();
    if e.corrupt == Allow::Demonstrated && sum(|c| c.corrupt) == 0 {
        missing.push("corruption");
    }
    if e.leak == Allow::Demonstrated && sum(|c| c.leak_only) == 0 {
        missing.push("leaks");
    }
    if e.interrupted_rename == Allow::Demonstrated && sum(|c| c.interrupted_rename) == 0 {
        missing.push("interrupted renames");
    }
    if missing.is_empty() {
        None
    } else {
        Some(format!(
            "mode {}: expected {} in its scripted workloads, none found",
            e.mode,
            missing.join(", ")
        ))
    }
}
