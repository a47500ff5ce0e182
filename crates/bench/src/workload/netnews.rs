//! The Netnews benchmark of Seltzer et al. (000 §4.3.2), synthetic: a news spool of 2 GB in
//! 520,000 articles over almost 7,000 directories, then "unbatch" (78,000 new articles,
//! 270 MB) and "expire" (91,000 of the oldest articles, 250 MB removed).
//!
//! What makes the workload hard, and what the generator keeps (000 §4.3.2): successive
//! creates and deletes seldom hit the same directory (articles go to the groups round-robin, so
//! consecutive operations are always in different directories), and the metadata does not fit
//! in the cache (the spool is made cold after it is populated).
//!
//! The plan (tree, sizes, which article goes where) is computed apart from the execution so its
//! counts and sizes can be tested at full scale without touching a disk.
//!
//! Article numbering: the spool's articles have global indices 0.. in arrival order; index `i`
//! lives in group `i % G` as article number `i / G + 1`, exactly as a round-robin feed would
//! number them. Unbatch continues the indices; expire removes indices `0..expire_files`, which
//! are the lowest-numbered (oldest) articles of every group.
//!
//! The spool is left in place at the end: the target is discarded after a run, and removing
//! 500,000 files would cost more than the benchmark itself.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::rng::SplitMix64;
use super::{PhaseResult, Stage, measure, measure_cold, scaled_count};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Directories in the spool, hierarchy roots (comp, sci, …) included.
    pub dirs: u64,
    pub initial_files: u64,
    pub initial_bytes: u64,
    pub unbatch_files: u64,
    pub unbatch_bytes: u64,
    /// The oldest `expire_files` articles of the initial spool, holding `expire_bytes` in all.
    pub expire_files: u64,
    pub expire_bytes: u64,
    /// Spread of the log-normal part of article sizes (each size is `MIN_ARTICLE` plus a
    /// log-normal draw scaled so every set's total is exact).
    pub sigma: f64,
    pub seed: u64,
}

/// A bare header; no article is smaller.
const MIN_ARTICLE: u64 = 200;
/// Every `SAMPLE`th article of a set is checked after its phase (prime, so the sample falls in
/// every group rather than in a few).
const SAMPLE: u64 = 97;

impl Config {
    pub fn paper() -> Config {
        Config {
            dirs: 7_000,
            initial_files: 520_000,
            initial_bytes: 2_000_000_000,
            unbatch_files: 78_000,
            unbatch_bytes: 270_000_000,
            expire_files: 91_000,
            expire_bytes: 250_000_000,
            sigma: 0.8,
            seed: 0x5eed_0007,
        }
    }

    /// Counts shrink with `scale`; each set keeps the paper's mean article size (bytes follow
    /// the counts), so scale 0.1 is the paper's spool with a tenth of the groups.
    pub fn scaled(scale: f64) -> Config {
        let p = Config::paper();
        let count = |n: u64, floor: u64| scaled_count(n, scale, floor);
        let bytes =
            |files: u64, pf: u64, pb: u64| (files as f64 * pb as f64 / pf as f64).round() as u64;
        let initial_files = count(p.initial_files, 64);
        let unbatch_files = count(p.unbatch_files, 8);
        let expire_files = count(p.expire_files, 8).min(initial_files / 2);
        Config {
            dirs: count(p.dirs, 12),
            initial_files,
            initial_bytes: bytes(initial_files, p.initial_files, p.initial_bytes),
            unbatch_files,
            unbatch_bytes: bytes(unbatch_files, p.unbatch_files, p.unbatch_bytes),
            expire_files,
            expire_bytes: bytes(expire_files, p.expire_files, p.expire_bytes),
            ..p
        }
    }

    pub fn describe(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        format!(
            "news spool of {} articles ({:.0} MB) in {} directories (populate, then cold cache); unbatch creates {} articles ({:.0} MB), expire removes the {} oldest ({:.0} MB), round-robin over groups; rate in files/s",
            self.initial_files,
            mb(self.initial_bytes),
            self.dirs,
            self.unbatch_files,
            mb(self.unbatch_bytes),
            self.expire_files,
            mb(self.expire_bytes)
        )
    }
}

/// One directory of the spool.
#[derive(Clone, Debug)]
pub struct Dir {
    /// Relative to the spool, `/`-separated ("comp/lang/c").
    pub path: String,
    pub subdirs: u64,
}

/// Everything the run does, decided before it starts.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Parents before children. The first `roots` are hierarchy roots holding no articles;
    /// every later one is a newsgroup.
    pub dirs: Vec<Dir>,
    pub roots: usize,
    /// Sizes of the initial spool's articles by global index; `..expire_files` is the set
    /// expire removes.
    pub initial: Vec<u32>,
    /// Sizes of the unbatched articles (global indices `initial.len()..`).
    pub unbatch: Vec<u32>,
    pub expire_files: u64,
}

const ROOTS: &[&str] = &["comp", "sci", "rec", "alt", "soc", "talk", "misc", "news"];
const WORDS: &[&str] = &[
    "lang",
    "os",
    "sys",
    "unix",
    "c",
    "misc",
    "announce",
    "answers",
    "databases",
    "graphics",
    "protocols",
    "arch",
    "mail",
    "sources",
    "std",
    "windows",
    "games",
    "music",
    "arts",
    "sport",
    "physics",
    "math",
    "bio",
    "chem",
    "crypt",
    "tech",
    "hardware",
    "software",
    "admin",
    "questions",
    "help",
    "moderated",
    "d",
    "networks",
    "security",
    "linux",
    "bsd",
    "editors",
    "compilers",
    "theory",
    "ai",
    "lisp",
    "perl",
    "tcl",
    "periphs",
    "mac",
    "ibm",
    "pc",
    "sun",
    "hp",
    "org",
    "fan",
    "books",
    "food",
    "autos",
    "travel",
    "humor",
    "politics",
    "history",
    "culture",
];

impl Plan {
    pub fn new(cfg: &Config) -> Result<Plan> {
        ensure!(
            cfg.dirs >= 2,
            "netnews: need at least 2 directories, got {}",
            cfg.dirs
        );
        ensure!(
            cfg.dirs <= 10_000_000 && cfg.initial_files + cfg.unbatch_files <= 1 << 32,
            "netnews: spool too large"
        );
        ensure!(
            cfg.expire_files <= cfg.initial_files && cfg.expire_bytes <= cfg.initial_bytes,
            "netnews: expire ({} files, {} B) exceeds the initial spool ({} files, {} B)",
            cfg.expire_files,
            cfg.expire_bytes,
            cfg.initial_files,
            cfg.initial_bytes
        );
        ensure!(
            cfg.sigma.is_finite() && (0.0..=3.0).contains(&cfg.sigma),
            "netnews: sigma {} outside 0..=3",
            cfg.sigma
        );
        let mut rng = SplitMix64::new(cfg.seed);
        let (dirs, roots) = tree(cfg.dirs as usize, &mut rng);
        // The expired set is drawn apart from the rest of the spool so its total is the paper's
        // (its articles are smaller than the spool's average: 2.7 KB against 3.8 KB).
        let mut initial = sizes(
            &mut rng,
            cfg.expire_files,
            cfg.expire_bytes,
            cfg.sigma,
            "expired",
        )?;
        initial.extend(sizes(
            &mut rng,
            cfg.initial_files - cfg.expire_files,
            cfg.initial_bytes - cfg.expire_bytes,
            cfg.sigma,
            "kept",
        )?);
        let unbatch = sizes(
            &mut rng,
            cfg.unbatch_files,
            cfg.unbatch_bytes,
            cfg.sigma,
            "unbatched",
        )?;
        Ok(Plan {
            dirs,
            roots,
            initial,
            unbatch,
            expire_files: cfg.expire_files,
        })
    }

    pub fn groups(&self) -> u64 {
        (self.dirs.len() - self.roots) as u64
    }

    /// Group directory (index into `dirs`) and article number of global index `i`.
    pub fn place(&self, i: u64) -> (usize, u64) {
        let g = self.groups();
        (self.roots + (i % g) as usize, i / g + 1)
    }

    /// Articles of global indices `0..n` that land in group directory `d`.
    fn per_group(&self, n: u64, d: usize) -> u64 {
        let g = (d - self.roots) as u64;
        if g >= n {
            0
        } else {
            (n - g).div_ceil(self.groups())
        }
    }

    fn size_of(&self, i: u64) -> u64 {
        let n = self.initial.len() as u64;
        u64::from(if i < n {
            self.initial[i as usize]
        } else {
            self.unbatch[(i - n) as usize]
        })
    }

    pub fn bytes(sizes: &[u32]) -> u64 {
        sizes.iter().map(|&s| u64::from(s)).sum()
    }
}

/// A spool-shaped tree of `n` directories: up to 8 hierarchy roots, then breadth-first
/// subgroups, 1–12 per group (comp → comp/lang → comp/lang/c …).
fn tree(n: usize, rng: &mut SplitMix64) -> (Vec<Dir>, usize) {
    let roots = (n / 20).clamp(1, ROOTS.len());
    let mut dirs: Vec<Dir> = ROOTS[..roots]
        .iter()
        .map(|r| Dir {
            path: (*r).into(),
            subdirs: 0,
        })
        .collect();
    let mut next = 0;
    while dirs.len() < n {
        let fanout = (1 + rng.below(12) as usize).min(n - dirs.len());
        let start = rng.below(WORDS.len() as u64) as usize;
        for k in 0..fanout {
            let word = WORDS[(start + k) % WORDS.len()];
            let round = k / WORDS.len();
            let name = if round == 0 {
                word.to_string()
            } else {
                format!("{word}{round}")
            };
            let path = format!("{}/{name}", dirs[next].path);
            dirs.push(Dir { path, subdirs: 0 });
        }
        dirs[next].subdirs = fanout as u64;
        next += 1;
    }
    (dirs, roots)
}

/// `n` article sizes summing to exactly `total`: `MIN_ARTICLE` plus a log-normal draw, scaled,
/// with the rounding remainder spread one byte at a time.
fn sizes(rng: &mut SplitMix64, n: u64, total: u64, sigma: f64, what: &str) -> Result<Vec<u32>> {
    if n == 0 {
        ensure!(total == 0, "netnews: {total} B for no {what} articles");
        return Ok(Vec::new());
    }
    ensure!(
        total >= n * MIN_ARTICLE,
        "netnews: {total} B is too little for {n} {what} articles of at least {MIN_ARTICLE} B"
    );
    let draws: Vec<f64> = (0..n).map(|_| (sigma * rng.normal()).exp()).collect();
    let sum: f64 = draws.iter().sum();
    let spare = (total - n * MIN_ARTICLE) as f64;
    let mut out = Vec::with_capacity(n as usize);
    for x in draws {
        let s = MIN_ARTICLE + (x / sum * spare).floor() as u64;
        ensure!(
            s <= u64::from(u32::MAX),
            "netnews: a {what} article of {s} B"
        );
        out.push(s as u32);
    }
    let mut rest = total.saturating_sub(Plan::bytes(&out));
    // Floors only ever round down, so the remainder is below n (float error aside).
    let mut k = 0;
    while rest > 0 {
        out[k % n as usize] += 1;
        rest -= 1;
        k += 1;
    }
    let got = Plan::bytes(&out);
    if got != total {
        bail!("netnews: {what} sizes sum to {got} B, not {total} B");
    }
    Ok(out)
}

/// Contents of article `i`: a header naming its group, then filler.
fn article(buf: &mut Vec<u8>, filler: &[u8], group: &str, i: u64, size: usize) {
    buf.clear();
    let _ = write!(
        buf,
        "Newsgroups: {}\nMessage-ID: <{i}@spool.cairn>\n\n",
        group.replace('/', ".")
    );
    if buf.len() >= size {
        buf.truncate(size);
    } else {
        let need = size - buf.len();
        buf.extend_from_slice(&filler[..need]);
    }
}

struct Spool<'a> {
    root: PathBuf,
    plan: &'a Plan,
    filler: Vec<u8>,
}

impl Spool<'_> {
    fn path(&self, i: u64) -> PathBuf {
        let (d, num) = self.plan.place(i);
        self.root
            .join(&self.plan.dirs[d].path)
            .join(num.to_string())
    }

    fn create(&self, i: u64, buf: &mut Vec<u8>) -> Result<()> {
        let (d, _) = self.plan.place(i);
        let p = self.path(i);
        article(
            buf,
            &self.filler,
            &self.plan.dirs[d].path,
            i,
            self.plan.size_of(i) as usize,
        );
        // create_new: an article number is never reused, so an existing file is a plan bug.
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .and_then(|mut f| f.write_all(buf))
            .with_context(|| format!("create {}", p.display()))
    }

    fn populate(&self) -> Result<serde_json::Value> {
        fs::create_dir(&self.root).with_context(|| format!("mkdir {}", self.root.display()))?;
        for d in &self.plan.dirs {
            let p = self.root.join(&d.path);
            fs::create_dir(&p).with_context(|| format!("mkdir {}", p.display()))?;
        }
        // Group by group: a restored spool, not the feed's interleaving (that is unbatch's).
        let n = self.plan.initial.len() as u64;
        let g = self.plan.groups();
        let mut buf = Vec::new();
        for first in 0..g.min(n) {
            for i in (first..n).step_by(g as usize) {
                self.create(i, &mut buf)?;
            }
        }
        Ok(json!({
            "files": n,
            "bytes": Plan::bytes(&self.plan.initial),
            "dirs": self.plan.dirs.len(),
            "groups": g,
        }))
    }

    fn unbatch(&self) -> Result<serde_json::Value> {
        let n = self.plan.initial.len() as u64;
        let mut buf = Vec::new();
        for i in n..n + self.plan.unbatch.len() as u64 {
            self.create(i, &mut buf)?;
        }
        Ok(json!({
            "files": self.plan.unbatch.len(),
            "bytes": Plan::bytes(&self.plan.unbatch),
        }))
    }

    fn expire(&self) -> Result<serde_json::Value> {
        for i in 0..self.plan.expire_files {
            let p = self.path(i);
            fs::remove_file(&p).with_context(|| format!("expire {}", p.display()))?;
        }
        Ok(json!({
            "files": self.plan.expire_files,
            "bytes": Plan::bytes(&self.plan.initial[..self.plan.expire_files as usize]),
        }))
    }

    /// Every `SAMPLE`th article of `range` holds exactly its planned contents.
    fn check_present(&self, range: std::ops::Range<u64>) -> Result<()> {
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for i in range.step_by(SAMPLE as usize) {
            let (d, _) = self.plan.place(i);
            let p = self.path(i);
            got.clear();
            File::open(&p)
                .and_then(|mut f| f.read_to_end(&mut got))
                .with_context(|| format!("read {}", p.display()))?;
            let size = self.plan.size_of(i) as usize;
            article(&mut want, &self.filler, &self.plan.dirs[d].path, i, size);
            ensure!(
                got == want,
                "{}: {} bytes read back, {} planned{}",
                p.display(),
                got.len(),
                size,
                if got.len() == size {
                    " (contents differ)"
                } else {
                    ""
                }
            );
        }
        Ok(())
    }

    fn check_absent(&self, range: std::ops::Range<u64>) -> Result<()> {
        for i in range.step_by(SAMPLE as usize) {
            let p = self.path(i);
            match fs::symlink_metadata(&p) {
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("stat {}", p.display())),
                Ok(_) => bail!("{} still exists after expire", p.display()),
            }
        }
        Ok(())
    }

    /// Every directory holds the planned number of articles and subdirectories, given that
    /// global indices `lo..hi` exist (readdir only: no per-file stat).
    fn check_counts(&self, lo: u64, hi: u64) -> Result<()> {
        for (d, dir) in self.plan.dirs.iter().enumerate() {
            let p = self.root.join(&dir.path);
            let (mut files, mut subdirs) = (0u64, 0u64);
            for e in fs::read_dir(&p).with_context(|| format!("readdir {}", p.display()))? {
                let t = e
                    .and_then(|e| e.file_type())
                    .with_context(|| format!("readdir {}", p.display()))?;
                if t.is_dir() {
                    subdirs += 1;
                } else {
                    files += 1;
                }
            }
            let want = if d < self.plan.roots {
                0
            } else {
                self.plan.per_group(hi, d) - self.plan.per_group(lo, d)
            };
            ensure!(
                files == want && subdirs == dir.subdirs,
                "{}: {files} articles and {subdirs} subdirectories, expected {want} and {}",
                p.display(),
                dir.subdirs
            );
        }
        Ok(())
    }
}

pub fn run(stage: &mut dyn Stage, cfg: &Config) -> Result<Vec<PhaseResult>> {
    let plan = Plan::new(cfg)?;
    let longest = plan
        .initial
        .iter()
        .chain(&plan.unbatch)
        .copied()
        .max()
        .unwrap_or(0) as usize;
    let spool = Spool {
        root: stage.dir().join("spool"),
        plan: &plan,
        filler: (0..longest)
            .map(|k| {
                if k % 64 == 63 {
                    b'\n'
                } else {
                    b'a' + (k % 26) as u8
                }
            })
            .collect(),
    };
    let n = plan.initial.len() as u64;
    let u = plan.unbatch.len() as u64;
    let files = |x: u64| x as f64;

    let populate = measure(stage, "populate", files(n), "files", || spool.populate())?;
    spool.check_counts(0, n)?;
    spool.check_present(0..n)?;
    // The paper's spool is far larger than its buffer cache (000 §4.3.2).
    let unbatch = measure_cold(stage, "unbatch", None, files(u), "files", || {
        spool.unbatch()
    })?;
    spool.check_present(n..n + u)?;
    let expire = measure(stage, "expire", files(plan.expire_files), "files", || {
        spool.expire()
    })?;
    spool.check_absent(0..plan.expire_files)?;
    spool.check_present(plan.expire_files..n + u)?;
    spool.check_counts(plan.expire_files, n + u)?;
    Ok([Some(populate), unbatch, Some(expire)]
        .into_iter()
        .flatten()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PlainDir;

    #[test]
    fn paper_plan_has_the_papers_shape() {
        let cfg = Config::paper();
        assert_eq!(cfg, Config::scaled(1.0));
        let p = Plan::new(&cfg).unwrap();
        assert_eq!(p.dirs.len(), 7_000);
        assert_eq!(p.roots, 8);
        assert_eq!(p.initial.len(), 520_000);
        assert_eq!(p.unbatch.len(), 78_000);
        assert_eq!(p.expire_files, 91_000);
        assert_eq!(Plan::bytes(&p.initial), 2_000_000_000);
        assert_eq!(Plan::bytes(&p.unbatch), 270_000_000);
        assert_eq!(Plan::bytes(&p.initial[..91_000]), 250_000_000);
        // Sizes: mostly 1–8 KiB with a tail, none tiny, none huge.
        let all: Vec<u32> = p.initial.iter().chain(&p.unbatch).copied().collect();
        let in_band = all.iter().filter(|&&s| (1024..=8192).contains(&s)).count();
        assert!(in_band as f64 > 0.7 * all.len() as f64, "{in_band}");
        assert!(all.iter().any(|&s| s > 16 * 1024), "no tail");
        assert!(all.iter().all(|&s| (200..1 << 20).contains(&s)));
        // A spool-like tree: a few levels deep, unique paths, every parent listed first.
        let depth = p.dirs.iter().map(|d| d.path.matches('/').count()).max();
        assert!(matches!(depth, Some(3..=6)), "{depth:?}");
        let mut paths: Vec<&str> = p.dirs.iter().map(|d| d.path.as_str()).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), 7_000);
        assert_eq!(p.dirs.iter().map(|d| d.subdirs).sum::<u64>(), 7_000 - 8);
        // Seeded: the same plan every time.
        let q = Plan::new(&cfg).unwrap();
        assert_eq!(
            (p.initial, &p.dirs[6999].path),
            (q.initial, &q.dirs[6999].path)
        );
    }

    #[test]
    fn round_robin_places_successive_articles_in_different_groups() {
        let p = Plan::new(&Config::scaled(0.01)).unwrap();
        let g = p.groups();
        assert_eq!(p.dirs.len(), 70);
        for i in 0..3 * g {
            let (a, na) = p.place(i);
            let (b, nb) = p.place(i + 1);
            assert_ne!(a, b);
            assert!(a >= p.roots);
            assert_eq!(na, i / g + 1);
            assert!(nb == na || nb == na + 1);
        }
        // Expired articles are each group's lowest numbers; unbatch continues the numbering.
        let n = p.initial.len() as u64;
        let d = p.roots + 3;
        assert_eq!(
            (0..n).filter(|&i| p.place(i).0 == d).count() as u64,
            p.per_group(n, d)
        );
        let last_old = (0..n).rev().find(|&i| p.place(i).0 == d).unwrap();
        let first_new = (n..).find(|&i| p.place(i).0 == d).unwrap();
        assert_eq!(p.place(first_new).1, p.place(last_old).1 + 1);
        assert_eq!(p.per_group(0, d), 0);
    }

    #[test]
    fn scaled_keeps_mean_sizes_and_floors() {
        let s = Config::scaled(0.1);
        assert_eq!(
            (s.dirs, s.initial_files, s.unbatch_files, s.expire_files),
            (700, 52_000, 7_800, 9_100)
        );
        assert_eq!(
            (s.initial_bytes, s.unbatch_bytes, s.expire_bytes),
            (200_000_000, 27_000_000, 25_000_000)
        );
        let t = Config::scaled(0.00001);
        assert_eq!(
            (t.dirs, t.initial_files, t.unbatch_files, t.expire_files),
            (12, 64, 8, 8)
        );
        let p = Plan::new(&t).unwrap();
        assert_eq!(p.roots, 1);
        assert_eq!(Plan::bytes(&p.initial), t.initial_bytes);
        assert!(Config::scaled(0.1).describe().contains("52000 articles"));
    }

    #[test]
    fn impossible_configs_are_errors() {
        let mut c = Config::scaled(0.001);
        c.expire_files = c.initial_files + 1;
        assert!(Plan::new(&c).is_err());
        let mut c = Config::scaled(0.001);
        c.unbatch_bytes = c.unbatch_files * 100;
        assert!(Plan::new(&c).is_err());
        let mut c = Config::scaled(0.001);
        c.dirs = 1;
        assert!(Plan::new(&c).is_err());
        let mut c = Config::scaled(0.001);
        c.sigma = f64::NAN;
        assert!(Plan::new(&c).is_err());
        let d = tempfile::tempdir().unwrap();
        assert!(run(&mut PlainDir::new(d.path()), &c).is_err());
    }

    #[test]
    fn runs_end_to_end_and_checks_the_spool() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config::scaled(0.002);
        let r = run(&mut PlainDir::new(d.path()), &cfg).unwrap();
        let names: Vec<_> = r.iter().map(|p| p.phase.as_str()).collect();
        assert_eq!(names, ["populate", "unbatch", "expire"]);
        assert_eq!(r[0].ops, cfg.initial_files as f64);
        assert_eq!(r[1].ops, cfg.unbatch_files as f64);
        assert_eq!(r[2].ops, cfg.expire_files as f64);
        assert_eq!(r[1].extra["bytes"], cfg.unbatch_bytes);
        assert_eq!(r[2].extra["bytes"], cfg.expire_bytes);
        assert!(r.iter().all(|p| p.unit == "files" && p.rate > 0.0));

        // The checks fail on a spool that differs from the plan.
        let plan = Plan::new(&cfg).unwrap();
        let spool = Spool {
            root: d.path().join("spool"),
            plan: &plan,
            filler: vec![b'x'; 1 << 20],
        };
        let n = plan.initial.len() as u64;
        let u = plan.unbatch.len() as u64;
        spool.check_counts(plan.expire_files, n + u).unwrap();
        assert!(spool.check_counts(0, n + u).is_err());
        assert!(spool.check_absent(n..n + u).is_err());
        fs::write(spool.path(0), b"back").unwrap();
        assert!(spool.check_absent(0..plan.expire_files).is_err());
        assert!(spool.check_counts(plan.expire_files, n + u).is_err());
        // Filler differs from the run's: contents are compared, not only sizes.
        assert!(spool.check_present(n..n + u).is_err());
    }
}
