//! An SDET-like benchmark (000 §4.3.3, results §5.2.3 Figure 5). SPEC's SDET ran concurrent
//! scripts of user commands "designed to emulate a typical software-development environment
//! (e.g., editing, compiling, and various UNIX utilities)", generated from a predetermined mix
//! [Gaede81]; its metric is scripts/hour as a function of the script concurrency. SDET itself is
//! long withdrawn, so the scripts here are generated the same way: each is a fixed, seeded
//! sequence of shell commands (sed edits, cc, ls, grep, cat, wc, cp, mv, rm, mkdir) over a small
//! source tree the script creates for itself and removes at its end.
//!
//! The generator keeps a model of the tree, so every command names files that exist and the
//! script can end by checking that the tree holds exactly the entries the model predicts: a file
//! system that lost a rename or an unlink fails the run instead of producing a number.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::rng::SplitMix64;
use super::{PhaseResult, Stage, measure, scaled_count};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Script concurrencies swept, one phase each (the paper's Figure 5 x axis).
    pub concurrency: Vec<u32>,
    /// Commands of the mix per script (the tree's creation and the final check come on top).
    pub commands: u32,
    /// Script runs per concurrency level, split evenly over the N concurrent slots (each slot
    /// runs its script at least once), so every level does about the same work.
    pub scripts: u32,
    /// Small C programs in each script's initial tree.
    pub c_files: u32,
    /// Text files in each script's initial tree.
    pub text_files: u32,
    /// Script i (0-based slot) is generated from `seed + i`.
    pub seed: u64,
}

const PAPER_COMMANDS: u32 = 150;
const PAPER_SCRIPTS: u32 = 16;

impl Config {
    pub fn paper() -> Config {
        Config {
            concurrency: vec![1, 2, 4, 8],
            commands: PAPER_COMMANDS,
            scripts: PAPER_SCRIPTS,
            c_files: 6,
            text_files: 8,
            seed: 42,
        }
    }

    /// Fewer commands per script and fewer runs; the tree and the concurrency sweep stay, since
    /// the sweep is the result and the tree is already small.
    pub fn scaled(scale: f64) -> Config {
        let s = |v: u32, min: u32| {
            u32::try_from(scaled_count(u64::from(v), scale, u64::from(min))).unwrap_or(u32::MAX)
        };
        Config {
            commands: s(PAPER_COMMANDS, 20),
            scripts: s(PAPER_SCRIPTS, 1),
            ..Config::paper()
        }
    }

    pub fn describe(&self) -> String {
        let n: Vec<String> = self.concurrency.iter().map(u32::to_string).collect();
        format!(
            "SDET-like: N = {} concurrent /bin/sh scripts of {} seeded commands (sed edit, cc, ls, grep, cat, wc, cp, mv, rm, mkdir) on a private tree of {} C + {} text files; {} script runs per N; rate in scripts/hour",
            n.join(", "),
            self.commands,
            self.c_files,
            self.text_files,
            self.scripts,
        )
    }

    /// Sequential runs of its script by each of `n` slots.
    pub fn reps_per_slot(&self, n: u32) -> u32 {
        self.scripts.div_ceil(n.max(1)).max(1)
    }
}

/// The commands of the mix, with their weights in percent: a development environment's mix is
/// mostly looking at and shuffling files, with edits and compiles the costly minority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Op {
    Edit,
    Cc,
    Ls,
    Grep,
    Cat,
    Wc,
    Cp,
    Mv,
    Rm,
    Mkdir,
}

pub const MIX: [(Op, u32); 10] = [
    (Op::Edit, 16),
    (Op::Cc, 8),
    (Op::Ls, 12),
    (Op::Grep, 12),
    (Op::Cat, 12),
    (Op::Wc, 9),
    (Op::Cp, 10),
    (Op::Mv, 8),
    (Op::Rm, 8),
    (Op::Mkdir, 5),
];

/// A generated script and what it is known to do.
#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    pub text: String,
    /// Commands of each kind actually emitted, in `MIX` order.
    pub counts: [u32; MIX.len()],
    /// Entries `find .` lists in the tree just before the script removes it.
    pub entries: u64,
}

impl Script {
    pub fn count(&self, op: Op) -> u32 {
        MIX.iter()
            .position(|&(o, _)| o == op)
            .map_or(0, |i| self.counts[i])
    }
}

/// The workloads' generator with the picks a script generator needs. `below` reduces by
/// modulo (not the generator's own multiply-shift): the pinned command mix of seed 42 in the
/// tests depends on it.
struct Rng(SplitMix64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n.max(1) as u64) as usize
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// Words of the text files. None contains "cairn", the marker every text file's first line
/// carries and no edit touches, so `grep cairn` always matches.
const WORDS: [&str; 24] = [
    "alpha", "bravo", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
    "lima", "mike", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
    "whiskey", "xray", "yankee", "zulu",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    C,
    Text,
}

/// Each kind keeps at least this many files, so every command always has something to act on.
const MIN_PER_KIND: usize = 2;

/// The generator's picture of the script's tree, relative to the tree's root.
struct Tree {
    /// Directories new files may go to (not bin/ or include/).
    dirs: Vec<String>,
    files: Vec<(String, Kind)>,
    bins: BTreeSet<String>,
    /// Directories in total, including bin/ and include/.
    ndirs: u64,
    next: u32,
}

impl Tree {
    fn fresh(&mut self, rng: &mut Rng, kind: Kind) -> String {
        self.next += 1;
        let dir = rng.pick(&self.dirs).clone();
        match kind {
            Kind::C => format!("{dir}/p{}.c", self.next),
            Kind::Text => format!("{dir}/n{}.txt", self.next),
        }
    }
    fn of_kind(&self, kind: Kind) -> Vec<usize> {
        (0..self.files.len())
            .filter(|&i| self.files[i].1 == kind)
            .collect()
    }
    fn any_kind(&self, rng: &mut Rng) -> Kind {
        if rng.below(2) == 0 {
            Kind::C
        } else {
            Kind::Text
        }
    }
    /// One to three distinct files of `kind`, space-separated.
    fn some(&self, rng: &mut Rng, kind: Kind) -> String {
        let mut idx = self.of_kind(kind);
        let k = rng.range(1, 3.min(idx.len()));
        let mut out = Vec::with_capacity(k);
        for _ in 0..k {
            let i = idx.swap_remove(rng.below(idx.len()));
            out.push(self.files[i].0.clone());
        }
        out.join(" ")
    }
}

fn stem(path: &str) -> &str {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.strip_suffix(".c").unwrap_or(base)
}

fn c_source(rng: &mut Rng, name: &str) -> String {
    let n = rng.range(40, 200);
    let mut table = String::new();
    for i in 0..n {
        let sep = if i % 12 == 11 { ",\n    " } else { ", " };
        write!(table, "{}{sep}", rng.below(100_000)).expect("string");
    }
    format!(
        "/* {name}: cairn sdet test program */\n#include <stdio.h>\n#include \"defs.h\"\n#define SCALE {scale}\n\nstatic const long table[] = {{\n    {table}\n}};\n\nstatic long sum(void)\n{{\n    long s = 0;\n    for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++)\n        s += table[i] % MODULUS;\n    return s;\n}}\n\nint main(void)\n{{\n    printf(\"%ld\\n\", sum() * SCALE + BIAS);\n    return 0;\n}}\n",
        scale = rng.range(1, 99),
    )
}

fn text_body(rng: &mut Rng, name: &str) -> String {
    let mut s = format!("cairn sdet notes: {name}\n");
    for _ in 0..rng.range(20, 100) {
        let words: Vec<&str> = (0..rng.range(6, 12)).map(|_| *rng.pick(&WORDS)).collect();
        s.push_str(&words.join(" "));
        s.push('\n');
    }
    s
}

/// Script for one slot. It takes its tree's path as `$1`, creates it, runs the mix, checks the
/// tree against the model and removes it, so it can run again at the same path.
pub fn generate(cfg: &Config, seed: u64) -> Script {
    let mut rng = Rng(SplitMix64::new(seed));
    let mut s = format!(
        "#!/bin/sh\n# cairn bench SDET-like script, seed {seed}, {} commands (generated).\nset -e\nmkdir \"$1\"\ncd \"$1\"\nmkdir src doc include bin\ncat > include/defs.h <<'EOF'\n#define BIAS {}\n#define MODULUS 977\nEOF\n",
        cfg.commands,
        rng.range(0, 999)
    );
    let mut t = Tree {
        dirs: vec!["src".into(), "doc".into()],
        files: Vec::new(),
        bins: BTreeSet::new(),
        ndirs: 4,
        next: 0,
    };
    let heredoc = |s: &mut String, path: &str, body: &str| {
        write!(s, "cat > {path} <<'EOF'\n{body}EOF\n").expect("string");
    };
    let (nc, nt) = (
        cfg.c_files.max(MIN_PER_KIND as u32),
        cfg.text_files.max(MIN_PER_KIND as u32),
    );
    for i in 0..nc {
        let p = format!("src/p{i}.c");
        heredoc(&mut s, &p, &c_source(&mut rng, &p));
        t.files.push((p, Kind::C));
    }
    for i in 0..nt {
        let p = format!("doc/n{i}.txt");
        heredoc(&mut s, &p, &text_body(&mut rng, &p));
        t.files.push((p, Kind::Text));
    }
    t.next = nc.max(nt);

    let total: u32 = MIX.iter().map(|&(_, w)| w).sum();
    let mut counts = [0u32; MIX.len()];
    for _ in 0..cfg.commands {
        let mut r = rng.below(total as usize) as u32;
        let mut op = MIX[0].0;
        for &(o, w) in &MIX {
            if r < w {
                op = o;
                break;
            }
            r -= w;
        }
        let (op, line) = command(&mut rng, &mut t, op);
        s.push_str(&line);
        s.push('\n');
        let i = MIX.iter().position(|&(o, _)| o == op).expect("in MIX");
        counts[i] += 1;
    }
    // ".", every directory, defs.h, the files and the binaries.
    let entries = 1 + t.ndirs + 1 + t.files.len() as u64 + t.bins.len() as u64;
    write!(
        s,
        "n=$(find . | wc -l)\n[ \"$n\" -eq {entries} ] || {{ echo \"sdet: expected {entries} entries in $1, found $n\" >&2; exit 1; }}\ncd /\nrm -rf \"$1\"\n"
    )
    .expect("string");
    Script {
        text: s,
        counts,
        entries,
    }
}

/// One command of kind `op` against the model, which it updates. Returns the kind actually
/// emitted: an `rm` with nothing removable becomes an `ls`.
fn command(rng: &mut Rng, t: &mut Tree, op: Op) -> (Op, String) {
    match op {
        Op::Edit => {
            let (path, kind) = rng.pick(&t.files).clone();
            let line = match kind {
                Kind::C if rng.below(8) == 0 => format!(
                    "sed -i 's/^#define BIAS .*/#define BIAS {}/' include/defs.h",
                    rng.range(0, 999)
                ),
                Kind::C => format!(
                    "sed -i 's/^#define SCALE .*/#define SCALE {}/' {path}",
                    rng.range(1, 99)
                ),
                Kind::Text => format!(
                    "sed -i 's/{}/{}/g' {path}",
                    rng.pick(&WORDS),
                    rng.pick(&WORDS)
                ),
            };
            (op, line)
        }
        Op::Cc => {
            let i = *rng.pick(&t.of_kind(Kind::C));
            let path = t.files[i].0.clone();
            let bin = stem(&path).to_string();
            let line = format!("cc -O -Iinclude -o bin/{bin} {path}");
            t.bins.insert(bin);
            (op, line)
        }
        Op::Ls => {
            let line = match rng.below(4) {
                0 => "ls -R".to_string(),
                1 => "ls -l bin".to_string(),
                _ => format!("ls -la {}", rng.pick(&t.dirs)),
            };
            (op, line)
        }
        Op::Grep => {
            let line = match rng.below(4) {
                0 => format!("grep -n main {}", t.some(rng, Kind::C)),
                1 => format!("grep -c cairn {}", t.some(rng, Kind::Text)),
                // May match nothing (status 1); only status 2, an error, must stop the script.
                2 => format!(
                    "grep -n {} {} || [ $? -eq 1 ]",
                    rng.pick(&WORDS),
                    t.some(rng, Kind::Text)
                ),
                _ => format!(
                    "grep -rl {} {} || [ $? -eq 1 ]",
                    rng.pick(&WORDS),
                    rng.pick(&t.dirs)
                ),
            };
            (op, line)
        }
        Op::Cat => {
            let kind = t.any_kind(rng);
            let line = if kind == Kind::Text && rng.below(2) == 0 {
                // Concatenation keeps the "cairn" first line: a new text file like any other.
                let srcs = t.some(rng, Kind::Text);
                let dst = t.fresh(rng, Kind::Text);
                let l = format!("cat {srcs} > {dst}");
                t.files.push((dst, Kind::Text));
                l
            } else {
                format!("cat {}", t.some(rng, kind))
            };
            (op, line)
        }
        Op::Wc => {
            let flag = *rng.pick(&["-l", "-w", "-c"]);
            let kind = t.any_kind(rng);
            (op, format!("wc {flag} {}", t.some(rng, kind)))
        }
        Op::Cp => {
            let i = rng.below(t.files.len());
            let (src, kind) = t.files[i].clone();
            let dst = t.fresh(rng, kind);
            let line = format!("cp {src} {dst}");
            t.files.push((dst, kind));
            (op, line)
        }
        Op::Mv => {
            let i = rng.below(t.files.len());
            let kind = t.files[i].1;
            let dst = t.fresh(rng, kind);
            let line = format!("mv {} {dst}", t.files[i].0);
            t.files[i].0 = dst;
            (op, line)
        }
        Op::Rm => {
            let removable: Vec<usize> = [Kind::C, Kind::Text]
                .into_iter()
                .map(|k| t.of_kind(k))
                .filter(|v| v.len() > MIN_PER_KIND)
                .flatten()
                .collect();
            if removable.is_empty() {
                return command(rng, t, Op::Ls);
            }
            let i = *rng.pick(&removable);
            let (path, _) = t.files.remove(i);
            (op, format!("rm {path}"))
        }
        Op::Mkdir => {
            t.next += 1;
            let d = format!("{}/d{}", rng.pick(&t.dirs), t.next);
            let line = format!("mkdir {d}");
            t.dirs.push(d);
            t.ndirs += 1;
            (op, line)
        }
    }
}

pub fn run(stage: &mut dyn Stage, cfg: &Config) -> Result<Vec<PhaseResult>> {
    ensure!(
        !cfg.concurrency.is_empty() && cfg.concurrency.iter().all(|&n| n >= 1),
        "sdet: concurrency levels must be >= 1 (got {:?})",
        cfg.concurrency
    );
    ensure!(
        cfg.commands >= 1,
        "sdet: a script needs at least one command"
    );
    let dir = stage.dir();
    let scripts_dir = dir.join("scripts");
    fs::create_dir(&scripts_dir).with_context(|| format!("create {}", scripts_dir.display()))?;
    let slots = *cfg.concurrency.iter().max().expect("non-empty");
    let mut scripts = Vec::with_capacity(slots as usize);
    for i in 0..slots {
        let p = scripts_dir.join(format!("s{i}.sh"));
        fs::write(&p, generate(cfg, cfg.seed + u64::from(i)).text)
            .with_context(|| format!("write {}", p.display()))?;
        scripts.push(p);
    }

    let mut out = Vec::with_capacity(cfg.concurrency.len());
    for &n in &cfg.concurrency {
        let work = dir.join(format!("n{n}"));
        fs::create_dir(&work).with_context(|| format!("create {}", work.display()))?;
        let reps = cfg.reps_per_slot(n);
        let mut r = measure(stage, "scripts", f64::from(n * reps), "scripts", || {
            run_slots(&scripts[..n as usize], &work, reps)?;
            Ok(serde_json::json!({
                "concurrency": n,
                "runs_per_slot": reps,
                "commands_per_script": cfg.commands,
            }))
        })?;
        r.param = Some(f64::from(n));
        let left = fs::read_dir(&work)?.count();
        ensure!(
            left == 0,
            "sdet N={n}: {left} script trees left in {}",
            work.display()
        );
        // Each level starts from a clean directory, as a fresh SDET run would.
        fs::remove_dir_all(&work).with_context(|| format!("remove {}", work.display()))?;
        out.push(r);
    }
    Ok(out)
}

/// Runs script i in slot i, `reps` times in a row, all slots at once; fails with the first
/// failing script's exit status and stderr.
fn run_slots(scripts: &[PathBuf], work: &Path, reps: u32) -> Result<()> {
    let results: Vec<Result<()>> = std::thread::scope(|sc| {
        let handles: Vec<_> = scripts
            .iter()
            .enumerate()
            .map(|(i, script)| {
                let tree = work.join(format!("s{i}"));
                sc.spawn(move || -> Result<()> {
                    for rep in 0..reps {
                        run_script(script, &tree)
                            .with_context(|| format!("sdet slot {i}, run {rep}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("sdet: a slot thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

fn run_script(script: &Path, tree: &Path) -> Result<()> {
    let mut child = Command::new("/bin/sh")
        .arg(script)
        .arg(tree)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start /bin/sh {}", script.display()))?;
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut err)?;
    let status = child.wait()?;
    if !status.success() {
        let lines: Vec<&str> = err.lines().collect();
        bail!(
            "{} {} failed ({status}): {}",
            script.display(),
            tree.display(),
            lines[lines.len().saturating_sub(10)..].join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PlainDir;

    #[test]
    fn generator_is_deterministic_per_seed() {
        let cfg = Config::paper();
        let a = generate(&cfg, 7);
        assert_eq!(a, generate(&cfg, 7));
        assert_ne!(a.text, generate(&cfg, 8).text);
        assert_eq!(a.counts.iter().sum::<u32>(), cfg.commands);
        // Every kind of command appears in a paper-length script, roughly at its weight.
        for &(op, w) in &MIX {
            let c = a.count(op);
            assert!(c > 0, "{op:?} missing");
            assert!(
                (c as f64) < 2.5 * f64::from(w) / 100.0 * f64::from(cfg.commands) + 3.0,
                "{op:?}: {c}"
            );
        }
        assert!(a.text.starts_with("#!/bin/sh\n"));
        assert!(a.text.contains("\nset -e\n"));
        assert_eq!(a.text.matches("\ncc -O ").count() as u32, a.count(Op::Cc));
        assert_eq!(
            a.text.matches("\nmkdir doc/").count() + a.text.matches("\nmkdir src/").count(),
            a.count(Op::Mkdir) as usize
        );
    }

    #[test]
    fn fixed_seed_gives_fixed_mix() {
        // Pinned so that a change to the generator, which changes the work every target does and
        // so the comparability of results across versions, is a deliberate one.
        let a = generate(&Config::paper(), 42);
        assert_eq!(a.counts, [32, 10, 13, 20, 20, 8, 16, 14, 13, 4]);
        assert_eq!(a.entries, 39);
    }

    #[test]
    fn scaled_shrinks_commands_and_runs_but_keeps_the_sweep() {
        let p = Config::paper();
        assert_eq!(Config::scaled(1.0), p);
        assert_eq!(p.concurrency, [1, 2, 4, 8]);
        let h = Config::scaled(0.5);
        assert_eq!((h.commands, h.scripts), (75, 8));
        let q = Config::scaled(0.001);
        assert_eq!((q.commands, q.scripts), (20, 1));
        assert_eq!(q.concurrency, p.concurrency);
        assert_eq!(generate(&q, 1).counts.iter().sum::<u32>(), 20);
        assert_eq!(p.reps_per_slot(1), 16);
        assert_eq!(p.reps_per_slot(8), 2);
        assert_eq!(p.reps_per_slot(3), 6);
        assert_eq!(q.reps_per_slot(8), 1);
        assert!(p.describe().contains("N = 1, 2, 4, 8"));
    }

    #[test]
    fn rm_never_drops_a_kind_below_its_minimum() {
        let cfg = Config {
            c_files: 2,
            text_files: 2,
            commands: 400,
            ..Config::paper()
        };
        for seed in 0..20 {
            let s = generate(&cfg, seed);
            assert_eq!(s.counts.iter().sum::<u32>(), 400);
        }
    }

    fn have_cc() -> bool {
        let ok = crate::sys::have_tool("cc") && Path::new("/bin/sh").exists();
        if !ok {
            eprintln!("sdet: no cc or /bin/sh; skipping (run scripts/install-deps.sh)");
        }
        ok
    }

    #[test]
    fn generated_scripts_run_clean_and_match_the_model() {
        if !have_cc() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let cfg = Config::paper();
        for seed in [0, 1, 42, 1000] {
            let p = d.path().join(format!("s{seed}.sh"));
            fs::write(&p, generate(&cfg, seed).text).unwrap();
            let tree = d.path().join(format!("t{seed}"));
            run_script(&p, &tree).unwrap();
            assert!(!tree.exists(), "the script removes its tree");
        }
    }

    #[test]
    fn a_failing_script_reports_its_stderr() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bad.sh");
        fs::write(&p, "set -e\necho boom >&2\nfalse\necho never >&2\n").unwrap();
        let e = run_slots(&[p], d.path(), 1).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("boom") && !msg.contains("never"), "{msg}");
        assert!(msg.contains("slot 0"), "{msg}");
    }

    #[test]
    fn tiny_sweep_runs_end_to_end() {
        if !have_cc() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let mut st = PlainDir {
            dir: d.path().to_path_buf(),
            source: None,
            drop_caches: false,
        };
        let cfg = Config {
            concurrency: vec![1, 2],
            scripts: 2,
            ..Config::scaled(0.001)
        };
        let r = run(&mut st, &cfg).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            r.iter().map(|p| (p.param, p.ops)).collect::<Vec<_>>(),
            [(Some(1.0), 2.0), (Some(2.0), 2.0)]
        );
        assert!(
            r.iter()
                .all(|p| p.phase == "scripts" && p.unit == "scripts" && p.rate > 0.0)
        );
        // Only the scripts remain; every level's work directory was cleaned.
        let left: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["scripts"]);
    }
}
