//! docs/BENCHMARKS.md, the current-results page: one run of every mode and peer on this
//! machine's device, and the runs of the papers' tables on models of the papers' disks, each
//! rendered in full from its archived records, so the page cannot say what the data does not.
//!
//! The page is a function of the archives in `bench/current/` beside it (`run.json.gz`: the
//! run on this machine's device, pinned; `unpinned-WORKLOADS.json.gz`: an unpinned run of
//! it each; `disk-MODEL-WORKLOADS.json.gz`: a `--device` run each; every
//! archive a run's meta.json and every record, compact), of the notes written beside a disk
//! run's archive (`disk-….md`: what its counts say, which no code can), and of this code; a
//! test renders it again and compares.
//! Investigations, one-off runs and their explanations are history (docs/bench/history.md),
//! which the page links to and never repeats.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde::{Deserialize, Serialize};

use crate::plot::Figures;
use crate::results::{Meta, Record, Stat};
use crate::tables::{per_rep, rate_of, total_rate};
use crate::units::fmt_rate;

mod kernel;

/// The folder beside the page that holds its archive and plots, as the page links it.
pub const CURRENT: &str = "bench/current/";
/// The archive's file name inside [`CURRENT`] of the run on this machine's device.
pub const ARCHIVE: &str = "run.json.gz";
/// How the archive of a run on a disk model (`--device`) is named inside [`CURRENT`].
const DISK_PREFIX: &str = "disk-";
/// How the archive of an unpinned run on this machine's device is named inside [`CURRENT`]:
/// it stands beside the pinned one, for the targets a pinned run cannot judge (two clients
/// take turns on one CPU) and for how far from the pinned numbers the unpinned ones are.
const UNPINNED_PREFIX: &str = "unpinned-";
/// The kernel file system every row is compared with first.
pub const KERNEL_REFERENCE: &str = "ext4";

/// A run as one file: what `cairn bench run` leaves in a directory, compact.
#[derive(Serialize, Deserialize)]
struct Archive {
    meta: Meta,
    records: Vec<Record>,
}

/// Reads a run: a run directory (meta.json and rec-*.json) or an archive (`*.json.gz`).
pub fn load(path: &Path) -> Result<(Meta, Vec<Record>)> {
    if path.is_dir() {
        return crate::results::load(path);
    }
    let mut text = String::new();
    GzDecoder::new(BufReader::new(
        File::open(path).with_context(|| format!("opening {}", path.display()))?,
    ))
    .read_to_string(&mut text)
    .with_context(|| format!("{}: not a gzip'd run archive", path.display()))?;
    let a: Archive = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a run archive", path.display()))?;
    Ok((a.meta, a.records))
}

fn write_archive(path: &Path, meta: &Meta, records: &[Record]) -> Result<()> {
    let a = Archive {
        meta: meta.clone(),
        records: records.to_vec(),
    };
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut z = GzEncoder::new(BufWriter::new(f), Compression::best());
    serde_json::to_writer(&mut z, &a)?;
    z.finish()?.flush()?;
    Ok(())
}

/// One column of the summary (and one number of issue 23's targets, [`kernel`]): a phase of
/// a workload, and how its rate reads.
struct Headline {
    name: &'static str,
    workload: &'static str,
    rate: Rate,
    unit: &'static str,
}

/// Which of a record's phases a [`Headline`]'s rate is.
#[derive(Clone, Copy)]
enum Rate {
    /// One phase, by its label (`PhaseResult::label`).
    Phase(&'static str),
    /// Consecutive phases as one: 1 / their summed seconds (the papers' "total" column).
    Total(&'static [&'static str]),
}

impl Rate {
    /// The phase labels the rate is made of (what a skipped phase is matched against).
    fn labels(self) -> Vec<&'static str> {
        match self {
            Rate::Phase(l) => vec![l],
            Rate::Total(ls) => ls.to_vec(),
        }
    }
}

const CREATE_UNLINK: Headline = Headline {
    name: "create+unlink",
    workload: "create-unlink",
    rate: Rate::Phase("create+unlink"),
    unit: "files/s",
};
const SMALL_CREATE: Headline = Headline {
    name: "small-file create",
    workload: "smallfile",
    rate: Rate::Phase("create"),
    unit: "files/s",
};
const SMALL_READ: Headline = Headline {
    name: "small-file read",
    workload: "smallfile",
    rate: Rate::Phase("read"),
    unit: "files/s",
};
const SMALL_DELETE: Headline = Headline {
    name: "small-file delete",
    workload: "smallfile",
    rate: Rate::Phase("delete"),
    unit: "files/s",
};
const POSTMARK: Headline = Headline {
    name: "PostMark",
    workload: "postmark",
    rate: Rate::Phase("run"),
    unit: "tx/s",
};
const SEQ_WRITE: Headline = Headline {
    name: "seq. write",
    workload: "largefile",
    rate: Rate::Phase("seq-write"),
    unit: "MiB/s",
};
const SEQ_READ: Headline = Headline {
    name: "seq. read",
    workload: "largefile",
    rate: Rate::Phase("seq-read"),
    unit: "MiB/s",
};
const RAND_WRITE: Headline = Headline {
    name: "random 4K write",
    workload: "largefile",
    rate: Rate::Phase("rand-write"),
    unit: "MiB/s",
};

/// What the summary shows: the metadata tables of 000 and 002, PostMark, and 004's data paths.
/// Everything else is in its own section below the summary.
const HEADLINES: &[Headline] = &[
    CREATE_UNLINK,
    SMALL_CREATE,
    SMALL_READ,
    SMALL_DELETE,
    POSTMARK,
    SEQ_WRITE,
    SEQ_READ,
    RAND_WRITE,
];

fn median(records: &[Record], h: &Headline, target: &str) -> Option<Stat> {
    match h.rate {
        Rate::Phase(l) => per_rep(records, h.workload, target, &rate_of(l)),
        Rate::Total(ls) => per_rep(records, h.workload, target, &total_rate(ls)),
    }
}

/// The summary rows: every target of the run on this machine's device, in the run's order,
/// but not the same mode again on a loop device (its own sections show it).
fn summary_targets(meta: &Meta) -> Vec<&str> {
    meta.targets
        .iter()
        .map(String::as_str)
        .filter(|t| !t.contains('@') && crate::target::split_disk(t).1.is_none())
        .collect()
}

/// The one-screen table: each target's median ÷ ext4's and ÷ the baseline's, same run.
fn summary(s: &mut String, meta: &Meta, records: &[Record]) {
    let base = meta.baseline.as_str();
    let cols: Vec<&Headline> = HEADLINES
        .iter()
        .filter(|h| meta.targets.iter().any(|t| median(records, h, t).is_some()))
        .collect();
    let _ = writeln!(
        s,
        "Each cell: the target's median ÷ `{KERNEL_REFERENCE}`'s, then ÷ `{base}`'s, measured in the same run (> 1 is faster). The first row is `{KERNEL_REFERENCE}`'s own median rate. — : not run on that target (each paper's workloads run on the targets it compared).\n"
    );
    let _ = writeln!(
        s,
        "| target | {} |",
        cols.iter().map(|h| h.name).collect::<Vec<_>>().join(" | ")
    );
    let _ = writeln!(s, "|---|{}", "--:|".repeat(cols.len()));
    let abs: Vec<String> = cols
        .iter()
        .map(|h| {
            median(records, h, KERNEL_REFERENCE)
                .map(|st| format!("{} {}", fmt_rate(st.median), h.unit))
                .unwrap_or_else(|| "—".into())
        })
        .collect();
    let _ = writeln!(s, "| *{KERNEL_REFERENCE}, rate* | {} |", abs.join(" | "));
    let mut elsewhere = Vec::new();
    for t in summary_targets(meta) {
        if !cols.iter().any(|h| median(records, h, t).is_some()) {
            elsewhere.push(t);
            continue;
        }
        let cells: Vec<String> = cols
            .iter()
            .map(|h| {
                let Some(v) = median(records, h, t) else {
                    return "—".into();
                };
                let ratio = |to: &str| {
                    median(records, h, to)
                        .filter(|b| b.median > 0.0)
                        .map(|b| fmt_ratio(v.median / b.median))
                        .unwrap_or_else(|| "—".into())
                };
                format!("{} · {}", ratio(KERNEL_REFERENCE), ratio(base))
            })
            .collect();
        let _ = writeln!(s, "| {t} | {} |", cells.join(" | "));
    }
    for t in elsewhere {
        let mut ran: Vec<&str> = records
            .iter()
            .filter(|r| r.target == t)
            .map(|r| r.workload.as_str())
            .collect();
        ran.dedup();
        let _ = writeln!(
            s,
            "\n`{t}` ran none of these; its numbers are in the sections of: {}.",
            if ran.is_empty() {
                "none".to_string()
            } else {
                ran.join(", ")
            }
        );
    }
}

/// A ratio as the summary prints it: two decimals, or two significant digits below 0.1 (a
/// synchronous mode's 0.004 must not read as 0).
fn fmt_ratio(v: f64) -> String {
    if v >= 0.095 || v == 0.0 {
        format!("{v:.2}")
    } else {
        let decimals = (1 - v.log10().floor() as i32).clamp(2, 8) as usize;
        format!("{v:.decimals$}")
    }
}

/// The archive's name in [`CURRENT`]: [`ARCHIVE`] for the pinned run on this machine's
/// device, and for an unpinned run or a disk-model run one per workload list (and model) —
/// publishing a newer run of the same tables replaces the older, a run of other tables
/// stands beside it.
fn archive_name(meta: &Meta) -> String {
    let clean = |t: &str| -> String {
        t.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let workloads: Vec<String> = meta.workloads.iter().map(|w| clean(w)).collect();
    match &meta.device {
        Some(model) => format!(
            "{DISK_PREFIX}{}-{}.json.gz",
            clean(model),
            workloads.join("+")
        ),
        None if !meta.pinned => format!("{UNPINNED_PREFIX}{}.json.gz", workloads.join("+")),
        None => ARCHIVE.to_string(),
    }
}

/// One archived run of the page.
pub struct Run {
    pub meta: Meta,
    pub records: Vec<Record>,
    /// What the run's counts say, written beside its archive (`STEM.md`), if anyone did.
    notes: Option<String>,
}

impl Run {
    /// The titles of the papers' tables its workloads fill, `; `-joined.
    fn titles(&self) -> String {
        let titles: Vec<&str> = self
            .meta
            .workloads
            .iter()
            .map(|w| crate::tables::title(w))
            .filter(|t| !t.is_empty())
            .collect();
        titles.join("; ")
    }
}

/// Everything the page is made of: the pinned run on this machine's device and, in file-name
/// order, the unpinned runs beside it and the runs on disk models.
pub struct Current {
    pub main: Run,
    pub unpinned: Vec<Run>,
    pub disks: Vec<Run>,
}

/// Reads the page's folder ([`CURRENT`]).
pub fn load_current(dir: &Path) -> Result<Current> {
    let run = |path: &Path| -> Result<Run> {
        let (meta, records) = load(path)?;
        let notes_path = path.with_file_name(
            path.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json.gz"))
                .map(|stem| format!("{stem}.md"))
                .unwrap_or_default(),
        );
        let notes = match fs::read_to_string(&notes_path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("reading {}", notes_path.display())),
        };
        Ok(Run {
            meta,
            records,
            notes,
        })
    };
    let main_path = dir.join(ARCHIVE);
    if !main_path.exists() {
        return Err(anyhow!(
            "{}: no pinned run on this machine's device to make the page from: publish one first (`cairn bench report results/<run> --page PAGE`, a run with --cpu and without --device)",
            main_path.display()
        ));
    }
    let main = run(&main_path)?;
    let mut names: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_str().is_some_and(|n| n.ends_with(".json.gz")))
        .collect();
    names.sort();
    let with = |prefix: &str| -> Result<Vec<Run>> {
        names
            .iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .map(|p| run(p))
            .collect()
    };
    Ok(Current {
        main,
        unpinned: with(UNPINNED_PREFIX)?,
        disks: with(DISK_PREFIX)?,
    })
}

/// The whole page. Plots are drawn into `figures.dir` and linked under [`CURRENT`].
pub fn render(figures: &Figures, current: &Current) -> Result<String> {
    let (meta, records) = (&current.main.meta, &current.main.records[..]);
    let mut s = String::new();
    let _ = writeln!(s, "# cairn benchmarks: current results\n");
    let _ = writeln!(
        s,
        "<!-- Generated by `cairn bench report docs/{} --page docs/BENCHMARKS.md` from the runs archived there (and the notes beside a disk run's archive); a test keeps this page equal to that output. Change crates/bench/src/page.rs, publish a new run, or edit a note, never this text. -->\n",
        CURRENT.trim_end_matches('/')
    );
    let failed = records.iter().filter(|r| r.error.is_some()).count();
    let disks = if current.disks.is_empty() {
        String::new()
    } else {
        format!(
            "; the papers' tables on models of the papers' disks from {} further run(s), [below](#the-papers-disks)",
            current.disks.len()
        )
    };
    let _ = writeln!(
        s,
        "How fast each cairn mode is against the kernel's file systems and the FUSE peers: one run of `cairn bench` ({} on {}, {} repetitions, {} failed), every number of the summary and the papers' tables from it{disks}. What each mode promises after a crash is in the [README](../README.md); how to run the benchmark and what each counter means in [bench/how-to-run.md](bench/how-to-run.md); earlier runs, investigations and the explanations of these numbers in the [history](bench/history.md).",
        started_date(&meta.started),
        meta.cpu_model,
        records.len(),
        failed,
    );
    let _ = writeln!(s, "\n## Summary\n");
    summary(&mut s, meta, records);
    let _ = writeln!(s);
    kernel::section(&mut s, current);
    let _ = writeln!(s);
    s.push_str(&crate::report::header(meta, records));
    s.push_str(&crate::tables::render(figures, meta, records)?);
    unpinned(&mut s, &current.unpinned);
    papers_disks(&mut s, &current.disks);
    not_in_this_run(&mut s, current);
    let mut commands = meta.command.clone();
    for d in current.unpinned.iter().chain(&current.disks) {
        commands.push('\n');
        commands.push_str(&d.meta.command);
    }
    let _ = writeln!(
        s,
        "\n## Reproducing this page\n\nEach run's command, then its publication (an unpinned run, or a run on a disk model, is archived beside the pinned run; a newer one of the same tables, on the same model, replaces the older):\n\n```sh\ncargo build --release -p cairn-cli\n{commands}\ntarget/release/cairn bench report results/<each run> --page docs/BENCHMARKS.md   # archives it in docs/{CURRENT}\n```",
    );
    Ok(s)
}

/// The unpinned runs beside the pinned one: per run, its conditions and its summary rows;
/// the targets judged on it are in the "Against the kernel" section.
fn unpinned(s: &mut String, runs: &[Run]) {
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n## Unpinned\n\nThe benchmark and the daemons free to use every CPU (each run's machine is in its conditions below; its numbers are held to the pinned run's only when it is the same machine); issue 23's targets for an unpinned run, and how far from the pinned numbers these are, are judged on it [above](#against-the-kernel-issue-23s-targets). Each cell as in the summary: ÷ `{KERNEL_REFERENCE}`, then ÷ the baseline, in the same run.\n"
    );
    for r in runs {
        s.push_str(&crate::report::header_at("###", &r.meta, &r.records));
        let _ = writeln!(s, "- tables: {}\n", r.titles());
        summary(s, &r.meta, &r.records);
    }
}

/// The runs on disk models: per run, its conditions, the three-column tables (paper / model /
/// this device) and what its counts say.
fn papers_disks(s: &mut String, disks: &[Run]) {
    if disks.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n## The papers' disks\n\nThe papers measured on the disks of their day, where a synchronous write waits for a seek and a rotation; this machine's device answers a flush in about 0.1 ms. Each run below mounts every cairn target twice — on a model of the paper's disk (`-o disk=MODEL`: seek curve, rotation, zones, no write cache, real time; [DISKS.md](DISKS.md)) and on this machine's device — and puts the published ratio, cairn's on the model and cairn's on this device side by side, with the model's counts per operation that explain a ratio off the paper's. 002's measurements on its Quantum Viking (preset `viking`) have no numbers in the copy cairn follows (its tables are stripped), so no table here compares with them; 004 §5.2's write cost under cleaning is measured by the engine on the Wren IV model, a test of cairn-lfs ([history](bench/history.md))."
    );
    for d in disks {
        let model = d.meta.device.as_deref().unwrap_or("?");
        let _ = writeln!(s, "\n## On `{model}`: {}\n", d.titles());
        s.push_str(&crate::report::header_at("###", &d.meta, &d.records));
        crate::device::body(s, model, &d.records);
        if let Some(n) = &d.notes {
            let _ = writeln!(s, "\n{}", n.trim_end());
        }
    }
}

/// The papers' tables no run of the page measured, so that the page says where they are
/// rather than leaving a reader to wonder.
fn not_in_this_run(s: &mut String, current: &Current) {
    let meta = &current.main.meta;
    let missing: Vec<&str> = crate::workload::NAMES
        .iter()
        .filter(|w| !meta.workloads.iter().any(|m| m == *w))
        .map(|w| crate::tables::title(w))
        .filter(|t| !t.is_empty())
        .collect();
    let _ = writeln!(
        s,
        "\n## Not in these runs\n\nMeasured by other runs and tools; their latest numbers, with the commit and conditions they were measured under, are in the [history](bench/history.md):\n"
    );
    for t in missing {
        let _ = writeln!(s, "- {t}");
    }
    let on_models = "The papers' tables on a model of their disks (`cairn bench run --device MODEL`, [DISKS.md](DISKS.md))";
    for t in [
        "Sprite LFS's cleaning simulator (004 Figs. 4–7): `cairn lfs sim`",
        on_models,
        "LFS call latency while the cleaner runs: `crates/lfs/examples/overwrite_latency.rs`",
        "Sprite LFS's write cost under cleaning on the real file system (004 §5.2): the `write_cost_on_the_wren_iv` test of cairn-lfs",
        "The write-ahead log service (001 §5.2): `cairn wal bench`",
        "The umbrella layer's own benchmarks (003 §4: rules' overhead, overflow, oscillation; a branch that hangs, isolation's cost, GlusterFS beside mergerfs): `scripts/bench-umbrella.py`",
    ] {
        if t == on_models && !current.disks.is_empty() {
            continue;
        }
        let _ = writeln!(s, "- {t}");
    }
}

/// "2026-11-28" from a run's start stamp (`20261128T032727Z`); the stamp itself otherwise.
fn started_date(stamp: &str) -> String {
    match (stamp.get(0..4), stamp.get(4..6), stamp.get(6..8)) {
        (Some(y), Some(m), Some(d)) if stamp.len() >= 8 => format!("{y}-{m}-{d}"),
        _ => stamp.to_string(),
    }
}

/// Writes the page at `page` from its folder [`CURRENT`] beside it, after archiving `source`
/// there: a run directory (meta.json and its records) or an archive (`*.json.gz`) is archived
/// under its name ([`archive_name`]: the device run, or one per disk model and tables); the
/// folder itself only renders the page again. Returns the folder.
pub fn publish(source: &Path, page: &Path) -> Result<PathBuf> {
    let dir = page
        .parent()
        .ok_or_else(|| anyhow!("{}: no folder to put the plots in", page.display()))?
        .join(CURRENT);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let the_folder = source.is_dir() && !source.join("meta.json").exists();
    if !the_folder {
        let (meta, records) = load(source)?;
        let dest = dir.join(archive_name(&meta));
        let same = fs::canonicalize(source).ok() == fs::canonicalize(&dest).ok();
        if !same {
            write_archive(&dest, &meta, &records)?;
        }
    }
    let current = load_current(&dir)?;
    let md = render(
        &Figures {
            dir: &dir,
            href: CURRENT,
        },
        &current,
    )?;
    fs::write(page, md).with_context(|| format!("writing {}", page.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PhaseResult;

    fn rec(workload: &str, target: &str, phase: &str, rate: f64) -> Record {
        let p = PhaseResult {
            phase: phase.into(),
            ops: 1000.0,
            unit: "files".into(),
            secs: 1000.0 / rate,
            rate,
            counters: None,
            param: None,
            extra: serde_json::Value::Null,
            cold: None,
        };
        Record::ran(workload, target, 1, vec![p])
    }

    fn meta() -> Meta {
        Meta {
            started: "20261128T032727Z".into(),
            baseline: "cairn-async".into(),
            targets: vec![
                "cairn-async".into(),
                "cairn-lfs".into(),
                "cairn-lfs@loop".into(),
                "ext4".into(),
            ],
            workloads: vec!["create-unlink".into()],
            pinned: true,
            cpus: vec![0],
            ..Meta::default()
        }
    }

    #[test]
    fn the_summary_divides_by_ext4_and_by_the_baseline_of_the_same_run() {
        let records = vec![
            rec("create-unlink", "cairn-async", "create+unlink", 10_000.0),
            rec("create-unlink", "cairn-lfs", "create+unlink", 9_000.0),
            rec("create-unlink", "cairn-lfs@loop", "create+unlink", 1.0),
            rec("create-unlink", "ext4", "create+unlink", 40_000.0),
        ];
        let mut s = String::new();
        summary(&mut s, &meta(), &records);
        assert!(s.contains("| *ext4, rate* | 40,000 files/s |"), "{s}");
        assert!(s.contains("| cairn-lfs | 0.23 · 0.90 |"), "{s}");
        assert!(s.contains("| cairn-async | 0.25 · 1.00 |"), "{s}");
        assert!(s.contains("| ext4 | 1.00 · 4.00 |"), "{s}");
        // The same mode on a loop device has its own sections, not a summary row.
        assert!(!s.contains("@loop"), "{s}");
        assert_eq!(fmt_ratio(0.0061), "0.0061");
        assert_eq!(fmt_ratio(0.094), "0.094");
        assert_eq!(fmt_ratio(1.234), "1.23");
        let mut t = String::new();
        let current = |disks| Current {
            unpinned: Vec::new(),
            main: Run {
                meta: meta(),
                records: records.clone(),
                notes: None,
            },
            disks,
        };
        not_in_this_run(&mut t, &current(vec![]));
        assert!(t.contains("- SDET"), "{t}");
        assert!(!t.contains("create/delete"), "{t}");
        assert!(t.contains("--device MODEL"), "{t}");
        // With a disk run on the page, the disk models are no longer "elsewhere".
        let mut u = String::new();
        not_in_this_run(&mut u, &current(vec![disk_run()]));
        assert!(!u.contains("--device MODEL"), "{u}");
        // Only the columns some target ran.
        assert!(!s.contains("PostMark"), "{s}");
    }

    fn disk_run() -> Run {
        Run {
            meta: Meta {
                started: "20261128T070000Z".into(),
                baseline: "cairn-async".into(),
                device: Some("cheetah-10k".into()),
                targets: vec!["cairn-async:cheetah-10k".into(), "cairn-async".into()],
                workloads: vec!["create-unlink".into(), "postmark".into()],
                command: "cairn bench run --device cheetah-10k".into(),
                ..Meta::default()
            },
            records: vec![rec(
                "create-unlink",
                "cairn-async:cheetah-10k",
                "create+unlink",
                5_000.0,
            )],
            notes: None,
        }
    }

    /// A page folder with a run on this machine's device and one on a disk model: publishing
    /// a run of the same tables on the same model replaces it, another stands beside it, and
    /// the page shows every disk run with its notes.
    #[test]
    fn disk_model_runs_are_archived_beside_the_device_run_and_rendered_with_their_notes() {
        let d = tempfile::tempdir().unwrap();
        let page = d.path().join("BENCHMARKS.md");
        let folder = d.path().join(CURRENT);
        // No device run yet: the refusal names the way out.
        let lone = d.path().join("lone.json.gz");
        let disk = disk_run();
        write_archive(&lone, &disk.meta, &disk.records).unwrap();
        let e = publish(&lone, &page).unwrap_err();
        assert!(format!("{e:#}").contains("publish one first"), "{e:#}");
        let main = d.path().join("main.json.gz");
        let records = vec![
            rec("create-unlink", "cairn-async", "create+unlink", 10_000.0),
            rec("create-unlink", "ext4", "create+unlink", 40_000.0),
        ];
        write_archive(&main, &meta(), &records).unwrap();
        publish(&main, &page).unwrap();
        assert!(folder.join(ARCHIVE).exists());
        let name = archive_name(&disk.meta);
        assert_eq!(name, "disk-cheetah-10k-create-unlink+postmark.json.gz");
        fs::write(
            folder.join("disk-cheetah-10k-create-unlink+postmark.md"),
            "**What the counts say.** A note.\n",
        )
        .unwrap();
        publish(&lone, &page).unwrap();
        let mut other = disk_run();
        other.meta.workloads = vec!["group-create".into()];
        let other_path = d.path().join("other.json.gz");
        write_archive(&other_path, &other.meta, &other.records).unwrap();
        publish(&other_path, &page).unwrap();
        // The same tables again on the same model: replaced, not added.
        publish(&lone, &page).unwrap();
        let c = load_current(&folder).unwrap();
        assert_eq!(c.disks.len(), 2);
        let md = fs::read_to_string(&page).unwrap();
        assert!(md.contains("## The papers' disks"), "{md}");
        assert!(
            md.contains("## On `cheetah-10k`: 0-length create/delete"),
            "{md}"
        );
        assert!(md.contains("### Run 20261128T070000Z"), "{md}");
        assert!(md.contains("**What the counts say.** A note."), "{md}");
        assert!(md.contains("cairn bench run --device cheetah-10k"), "{md}");
        assert!(md.contains("2 further run(s)"), "{md}");
        // An unpinned run of this machine's device stands beside the pinned one, whose
        // numbers stay the summary's.
        let mut free = meta();
        free.pinned = false;
        free.cpus = vec![0, 1];
        free.workloads = vec!["create-unlink".into(), "group-create".into()];
        let free_path = d.path().join("free.json.gz");
        let free_records = vec![
            rec("create-unlink", "cairn-async", "create+unlink", 8_000.0),
            rec("create-unlink", "ext4", "create+unlink", 40_000.0),
        ];
        write_archive(&free_path, &free, &free_records).unwrap();
        publish(&free_path, &page).unwrap();
        assert!(
            folder
                .join("unpinned-create-unlink+group-create.json.gz")
                .exists()
        );
        let c = load_current(&folder).unwrap();
        assert_eq!((c.unpinned.len(), c.disks.len()), (1, 2));
        assert_eq!(c.main.records[0].phases[0].rate, 10_000.0);
        let md = fs::read_to_string(&page).unwrap();
        assert!(md.contains("## Unpinned\n"), "{md}");
        assert!(md.contains("- tables: 0-length create/delete"), "{md}");
        assert!(md.contains("| cairn-async | 0.20 · 1.00 |"), "{md}");
        assert!(md.contains("| cairn-async | 0.25 · 1.00 |"), "{md}");
        // Rendering the folder again gives the same page.
        publish(&folder, &page).unwrap();
        assert_eq!(fs::read_to_string(&page).unwrap(), md);
    }

    #[test]
    fn an_archive_reads_back_as_the_run_it_was_made_from() {
        let d = tempfile::tempdir().unwrap();
        let records = vec![rec("create-unlink", "ext4", "create+unlink", 40_000.0)];
        let path = d.path().join(ARCHIVE);
        write_archive(&path, &meta(), &records).unwrap();
        let (m, r) = load(&path).unwrap();
        assert_eq!(m.targets, meta().targets);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].phases[0].rate, 40_000.0);
        fs::write(&path, b"not gzip").unwrap();
        let e = load(&path).unwrap_err();
        assert!(
            format!("{e:#}").contains("not a gzip'd run archive"),
            "{e:#}"
        );
    }

    /// docs/BENCHMARKS.md is exactly what its archived run renders: the page cannot drift
    /// from the data, nor from this code, without this test failing.
    #[test]
    fn the_benchmarks_page_is_what_its_archived_run_renders() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        let current = load_current(&docs.join(CURRENT)).unwrap();
        let d = tempfile::tempdir().unwrap();
        let md = render(
            &Figures {
                dir: d.path(),
                href: CURRENT,
            },
            &current,
        )
        .unwrap();
        let page = fs::read_to_string(docs.join("BENCHMARKS.md")).unwrap();
        assert!(
            md == page,
            "docs/BENCHMARKS.md differs from what its runs render: run `cairn bench report docs/{} --page docs/BENCHMARKS.md`",
            CURRENT.trim_end_matches('/')
        );
    }
}
