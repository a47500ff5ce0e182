//! The workloads: the papers' benchmarks (one module each for the larger ones) and the core
//! benchmark's create-unlink, smallfile, PostMark and seq here. Each runs in a `Stage` (a
//! directory plus counters, cold-cache and crash hooks) and reports one result per phase, with
//! the I/O counters' delta over exactly that phase.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use crate::counters::{Counters, Source};
pub use crate::results::{FlushRate, PhaseResult, Skipped};
use crate::sys;
pub use crate::units::fmt_size;

pub mod fsstress;
pub mod groupcreate;
pub mod largefile;
pub mod micro;
pub mod netnews;
pub mod recovery;
pub mod recovery_sweep;
pub mod rename;
mod rng;
pub mod sdet;
pub mod ssh;

/// What a workload needs from the file system it runs on.
pub trait Stage {
    /// Directory to work in; exists and is empty.
    fn dir(&self) -> PathBuf;
    /// Cumulative I/O counters, when the target has any.
    fn counters(&self) -> Result<Option<Counters>>;
    /// Makes the next reads come from the device rather than any cache (or, where
    /// [`Stage::cold_by`] says, from past the kernel's caches). A phase that must start cold
    /// goes through [`measure_cold`], which asks [`Stage::no_cold`] first.
    fn make_cold(&mut self) -> Result<()>;
    /// Why the next reads cannot be made cold here, if they cannot. A stage that answers Some
    /// keeps what [`Stage::skip`] is given: it is the only trace of the phases it could not
    /// measure.
    fn no_cold(&self) -> Option<&'static str> {
        None
    }
    /// How [`Stage::make_cold`] makes the next reads cold where that is not every cache
    /// between the reader and the device emptied, if so (the FUSE floor: the kernel's caches
    /// dropped under its live daemon, `TargetSpec::cold_by`). [`measure_cold`] records it on
    /// the phase, so its number is never read as a device's.
    fn cold_by(&self) -> Option<&'static str> {
        None
    }
    /// Records a phase that ran but was not measured, and why.
    fn skip(&mut self, skipped: Skipped) {
        let _ = skipped;
    }
    /// Crashes the file system with whatever it has in memory (recovery workload).
    fn crash(&mut self) -> Result<()> {
        bail!("this stage cannot crash: recovery needs a target the harness mounted")
    }
    /// Brings a crashed file system back until it is usable; returns the procedure used.
    fn recover(&mut self) -> Result<String> {
        bail!("this stage cannot recover")
    }
    /// Full read-only consistency check (unmounts and remounts); the check's own report
    /// (`cairn fsck --json`), when it gives one.
    fn fsck(&mut self) -> Result<Option<serde_json::Value>> {
        bail!("this stage has no fsck")
    }
    /// Adds mount options (`key=value,...`) to every later mount of the file system and
    /// remounts it with them (the recovery sweep holds a checkpoint back).
    fn remount_with(&mut self, opts: &str) -> Result<()> {
        let _ = opts;
        bail!("this stage cannot be remounted with other options")
    }
    /// Whether a workload may size the file system's buffer cache (`cache=`, through
    /// [`Stage::remount_with`]): a cairn target with an image whose run named no cache.
    fn sizes_cache(&self) -> bool {
        false
    }
    /// The file system daemon's log, if it has one (what a recovering mount reported).
    fn daemon_log(&self) -> Option<PathBuf> {
        None
    }
    /// Free and total bytes of the file system holding `dir()` (what `df` reports).
    fn space(&self) -> Result<(u64, u64)> {
        let st = nix::sys::statvfs::statvfs(&self.dir()).context("statvfs")?;
        let f = st.fragment_size();
        Ok((st.blocks_available() * f, st.blocks() * f))
    }
}

impl Stage for crate::target::Mounted {
    fn dir(&self) -> PathBuf {
        crate::target::Mounted::dir(self)
    }
    fn counters(&self) -> Result<Option<Counters>> {
        crate::target::Mounted::counters(self)
    }
    fn make_cold(&mut self) -> Result<()> {
        crate::target::Mounted::make_cold(self)
    }
    fn cold_by(&self) -> Option<&'static str> {
        self.spec.cold_by()
    }
    fn skip(&mut self, skipped: Skipped) {
        self.skipped.push(skipped);
    }
    fn crash(&mut self) -> Result<()> {
        crate::target::Mounted::crash(self)
    }
    fn recover(&mut self) -> Result<String> {
        crate::target::Mounted::recover(self)
    }
    fn fsck(&mut self) -> Result<Option<serde_json::Value>> {
        crate::target::Mounted::fsck(self)
    }
    fn remount_with(&mut self, opts: &str) -> Result<()> {
        self.set_extra_options(opts)?;
        // Unmounts, drops the caches, mounts with the options.
        crate::target::Mounted::make_cold(self)
    }
    fn daemon_log(&self) -> Option<PathBuf> {
        Some(crate::target::Mounted::daemon_log(self))
    }
    fn sizes_cache(&self) -> bool {
        crate::target::Mounted::sizes_cache(self)
    }
}

/// An existing directory (e.g. on a mount made by hand, as `make demo` does). Counters come
/// from `source` if given; making it cold drops the kernel's caches when `drop_caches` is set.
pub struct PlainDir {
    pub dir: PathBuf,
    pub source: Option<Source>,
    pub drop_caches: bool,
}

impl PlainDir {
    /// A directory with no counters whose "cold cache" is a no-op (tests, dry runs).
    pub fn new(dir: &Path) -> PlainDir {
        PlainDir {
            dir: dir.to_path_buf(),
            source: None,
            drop_caches: false,
        }
    }
}

impl Stage for PlainDir {
    fn dir(&self) -> PathBuf {
        self.dir.clone()
    }
    fn counters(&self) -> Result<Option<Counters>> {
        self.source.as_ref().map(Source::read).transpose()
    }
    fn make_cold(&mut self) -> Result<()> {
        if self.drop_caches {
            sys::drop_caches()
        } else {
            Ok(())
        }
    }
}

/// `n` × `scale`, rounded, but never below `floor`: how every workload shrinks its counts
/// (a hostile or tiny scale still leaves a run that measures something).
pub fn scaled_count(n: u64, scale: f64, floor: u64) -> u64 {
    ((n as f64 * scale).round() as u64).max(floor)
}

/// A byte count for a workload's description: whole KiB or MiB when exact ("96 KiB",
/// "128 MiB"), else two decimals ("1.28 MiB"), never a float's full expansion.
pub fn fmt_bytes_human(b: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    match b {
        b if b >= MIB && b.is_multiple_of(MIB) => format!("{} MiB", b / MIB),
        b if b.is_multiple_of(KIB) && b < MIB => format!("{} KiB", b / KIB),
        b if b >= MIB => format!("{:.2} MiB", b as f64 / MIB as f64),
        b => format!("{:.2} KiB", b as f64 / KIB as f64),
    }
}

/// Runs `f` as one timed phase of `ops` operations, with the counters' delta over exactly it.
pub fn measure(
    stage: &dyn Stage,
    phase: &str,
    ops: f64,
    unit: &str,
    f: impl FnOnce() -> Result<serde_json::Value>,
) -> Result<PhaseResult> {
    let before = stage.counters()?;
    let t0 = Instant::now();
    let extra = f()?;
    let secs = t0.elapsed().as_secs_f64();
    let after = stage.counters()?;
    let counters = match (before, after) {
        (Some(b), Some(a)) => Some(b.delta(&a)),
        _ => None,
    };
    Ok(PhaseResult {
        phase: phase.into(),
        ops,
        unit: unit.into(),
        secs,
        rate: ops / secs.max(1e-9),
        counters,
        param: None,
        extra,
        cold: None,
    })
}

/// A phase that must start cold: makes the next reads cold and measures `f` as the phase
/// (`param`: its swept parameter, as [`PhaseResult::param`]), recording on it how it was made
/// cold where the stage says ([`Stage::cold_by`]). On a stage that cannot be made cold
/// ([`Stage::no_cold`]) `f` still runs, so later phases find what it leaves (micro's read
/// needs create's files) and the caches as they would be, but its time is not a result: the
/// phase is recorded as skipped with the reason, and None returned. A warm read under a cold
/// read's name would be a wrong number no table could tell from a right one.
pub fn measure_cold(
    stage: &mut dyn Stage,
    phase: &str,
    param: Option<f64>,
    ops: f64,
    unit: &str,
    f: impl FnOnce() -> Result<serde_json::Value>,
) -> Result<Option<PhaseResult>> {
    let no_cold = stage.no_cold();
    if no_cold.is_none() {
        stage.make_cold()?;
    }
    let mut r = measure(stage, phase, ops, unit, f)?;
    r.param = param;
    match no_cold {
        None => {
            r.cold = stage.cold_by().map(str::to_string);
            Ok(Some(r))
        }
        Some(why) => {
            stage.skip(Skipped {
                phase: Some(r.label()),
                why: format!("cannot start cold: {why}"),
            });
            Ok(None)
        }
    }
}

/// PostMark's configuration (the commands fed to Debian's `postmark` on standard input).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PostmarkConfig {
    pub files: u64,
    pub min_size: u64,
    pub max_size: u64,
    pub transactions: u64,
    /// 0 = every file in one directory (PostMark's default).
    pub subdirs: u64,
    /// Read and write request size (PostMark's default and the papers': 512 B).
    pub block: u64,
    /// stdio buffering (PostMark's default); 003 §4.3 turned it off.
    pub buffered: bool,
    pub seed: u64,
    /// A file set this many times cairn's buffer cache: a cairn target with an image runs
    /// with its cache set to the file set's mean size ÷ this ([`Workload::set_stage`]), so the
    /// set is larger than the cache at every `--scale` (at 0.1 it would fit the default).
    pub set_over_cache: Option<u64>,
}

impl PostmarkConfig {
    /// 000/001 §4.3.4: PostMark's defaults — 10,000 files of 512 B–16 KiB, 20,000
    /// transactions, 512-byte blocks.
    pub fn seltzer() -> PostmarkConfig {
        PostmarkConfig {
            files: 10_000,
            min_size: 512,
            max_size: 16 << 10,
            transactions: 20_000,
            subdirs: 0,
            block: 512,
            buffered: true,
            seed: 42,
            set_over_cache: None,
        }
    }

    /// 003 §4.3: 12,500 files of 8–64 KiB in 200 subdirectories, 25,000 transactions, 512-byte
    /// blocks, unbuffered I/O.
    pub fn umbrella() -> PostmarkConfig {
        PostmarkConfig {
            files: 12_500,
            min_size: 8 << 10,
            max_size: 64 << 10,
            transactions: 25_000,
            subdirs: 200,
            block: 512,
            buffered: false,
            seed: 42,
            set_over_cache: None,
        }
    }

    /// The Seltzer configuration with a file set (50,000 files, ~400 MB) twice cairn's buffer
    /// cache, so metadata and data are evicted and re-read during the transactions (the
    /// regime of 000 §5.2.2's news server, where soft updates' rollbacks cost writes).
    pub fn large() -> PostmarkConfig {
        PostmarkConfig {
            files: 50_000,
            transactions: 50_000,
            set_over_cache: Some(2),
            ..PostmarkConfig::seltzer()
        }
    }

    /// The file set's expected size: its files at their mean size.
    pub fn set_bytes(&self) -> u64 {
        self.files * (self.min_size + self.max_size) / 2
    }

    /// The cache option that makes the file set [`PostmarkConfig::set_over_cache`] times the
    /// cache (at least 1 MiB: below it a run measures little but the cache's thrashing).
    pub fn cache_option(&self) -> Option<String> {
        let k = self.set_over_cache?;
        let bytes = (self.set_bytes() / k.max(1)).max(1 << 20);
        Some(format!("cache={}K", bytes.div_ceil(1024)))
    }

    pub fn scaled(&self, scale: f64) -> PostmarkConfig {
        let n = |x: u64, min: u64| scaled_count(x, scale, min);
        PostmarkConfig {
            files: n(self.files, 50),
            transactions: n(self.transactions, 100),
            subdirs: if self.subdirs == 0 {
                0
            } else {
                n(self.subdirs, 2)
            },
            ..self.clone()
        }
    }

    /// The commands PostMark reads from standard input.
    pub fn script(&self, dir: &Path) -> String {
        let mut s = format!(
            "set location {}\nset number {}\nset size {} {}\nset transactions {}\nset read {}\nset write {}\nset buffering {}\nset seed {}\n",
            dir.display(),
            self.files,
            self.min_size,
            self.max_size,
            self.transactions,
            self.block,
            self.block,
            self.buffered,
            self.seed
        );
        if self.subdirs > 0 {
            s += &format!("set subdirectories {}\n", self.subdirs);
        }
        s + "run\nquit\n"
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "workload", rename_all = "kebab-case")]
pub enum Workload {
    /// Create and immediately unlink `files` 0-length files in one directory (000 Table 4:
    /// metadata operations only, no data).
    CreateUnlink { files: u64 },
    /// Create `files` files of `size` bytes in one directory, read them back cold, delete them
    /// (004 Fig. 8).
    Smallfile { files: u64, size: usize },
    /// Debian's `postmark` in one of three configurations (`variant`).
    Postmark {
        variant: String,
        #[serde(flatten)]
        cfg: PostmarkConfig,
    },
    /// Write a file of `bytes` sequentially in `chunk`-sized writes and fsync it, then read it
    /// back cold (the core benchmark's bandwidth check; not a paper workload).
    Seq { bytes: u64, chunk: usize },
    /// 000 §4.2 microbenchmarks over file sizes (Figures 1–4).
    Micro(micro::Config),
    /// 004 Fig. 9.
    Largefile(largefile::Config),
    /// 000 §4.3.2.
    Netnews(netnews::Config),
    /// 000 §4.3.1.
    Ssh(ssh::Config),
    /// 000 §4.3.3 (Figure 5).
    Sdet(sdet::Config),
    /// 002 Table III, 004 Table III.
    Recovery(recovery::Config),
    /// Issue 12's group commit: concurrent creates, 1–32 threads.
    GroupCreate(groupcreate::Config),
    /// Recovery time against the log since the checkpoint (001 §5.3, 004 Table III).
    RecoverySweep(recovery_sweep::Config),
    /// Issue 23: small files created and renamed across directories.
    Rename(rename::Config),
    /// Issue 23: xfstests' fsstress with a fixed seed (the binary is not ours).
    Fsstress(fsstress::Config),
}

/// Every workload, in the order a suite runs them (cheap ones first, so a broken target shows
/// early).
pub const NAMES: &[&str] = &[
    "create-unlink",
    "smallfile",
    rename::NAME,
    "largefile",
    "micro",
    "postmark",
    "postmark-umbrella",
    "postmark-large",
    "ssh",
    "netnews",
    "sdet",
    "recovery",
    groupcreate::NAME,
    "recovery-sweep",
    fsstress::NAME,
    "seq",
];

/// Sizes of every workload: `scale` multiplies the papers' counts and sizes (1.0 = the paper);
/// the netnews spool has its own factor because the default is 1/10 of the paper's.
/// The explicit fields are the core benchmark's knobs (`cairn bench workload`).
#[derive(Clone, Debug)]
pub struct Params {
    pub scale: f64,
    pub netnews_scale: f64,
    pub create_unlink_files: u64,
    pub small_files: u64,
    pub small_size: usize,
    pub seq_bytes: u64,
}

impl Params {
    pub fn scaled(scale: f64, netnews_scale: f64) -> Params {
        let n = |x: u64, min: u64| scaled_count(x, scale, min);
        Params {
            scale,
            netnews_scale,
            create_unlink_files: n(50_000, 100),
            small_files: n(10_000, 100),
            small_size: 1024,
            seq_bytes: n(1 << 30, 1 << 20),
        }
    }
}

impl Workload {
    pub fn named(name: &str, p: &Params) -> Result<Workload> {
        let pm = |variant: &str, cfg: PostmarkConfig| Workload::Postmark {
            variant: variant.into(),
            cfg: cfg.scaled(p.scale),
        };
        Ok(match name {
            "create-unlink" | "create-delete" => Workload::CreateUnlink {
                files: p.create_unlink_files,
            },
            "smallfile" => Workload::Smallfile {
                files: p.small_files,
                size: p.small_size,
            },
            "postmark" | "postmark-seltzer" => pm("postmark", PostmarkConfig::seltzer()),
            "postmark-umbrella" => pm(name, PostmarkConfig::umbrella()),
            "postmark-large" => pm(name, PostmarkConfig::large()),
            "seq" => Workload::Seq {
                bytes: p.seq_bytes,
                chunk: 1 << 20,
            },
            "micro" => Workload::Micro(micro::Config::scaled(p.scale)),
            "largefile" => Workload::Largefile(largefile::Config::scaled(p.scale)),
            "netnews" => Workload::Netnews(netnews::Config::scaled(p.scale * p.netnews_scale)),
            "ssh" => Workload::Ssh(ssh::Config::scaled(p.scale)),
            "sdet" => Workload::Sdet(sdet::Config::scaled(p.scale)),
            "recovery" => Workload::Recovery(recovery::Config::scaled(p.scale)),
            groupcreate::NAME => Workload::GroupCreate(groupcreate::Config::scaled(p.scale)),
            "recovery-sweep" => Workload::RecoverySweep(recovery_sweep::Config::scaled(p.scale)),
            rename::NAME => Workload::Rename(rename::Config::scaled(p.scale)),
            fsstress::NAME => Workload::Fsstress(fsstress::Config::scaled(p.scale)),
            n => bail!("unknown workload '{n}' (known: {})", NAMES.join(", ")),
        })
    }

    pub fn name(&self) -> &str {
        match self {
            Workload::CreateUnlink { .. } => "create-unlink",
            Workload::Smallfile { .. } => "smallfile",
            Workload::Postmark { variant, .. } => variant,
            Workload::Seq { .. } => "seq",
            Workload::Micro(_) => "micro",
            Workload::Largefile(_) => "largefile",
            Workload::Netnews(_) => "netnews",
            Workload::Ssh(_) => "ssh",
            Workload::Sdet(_) => "sdet",
            Workload::Recovery(_) => "recovery",
            Workload::GroupCreate(_) => groupcreate::NAME,
            Workload::RecoverySweep(_) => "recovery-sweep",
            Workload::Rename(_) => rename::NAME,
            Workload::Fsstress(_) => fsstress::NAME,
        }
    }

    /// Whether the workload can run on this target at all (crash recovery is a property of a
    /// file system, not of a FUSE layer stacked over ext4).
    pub fn applies_to(&self, t: &crate::target::TargetSpec) -> bool {
        use crate::target::Kind;
        match (self, &t.kind) {
            (Workload::Recovery(_), Kind::Mergerfs | Kind::Passthrough) => false,
            (Workload::RecoverySweep(_), Kind::Cairn { facts: Some(f), .. }) => {
                recovery_sweep::runs_on(f)
            }
            (Workload::RecoverySweep(_), _) => false,
            _ => true,
        }
    }

    /// Why the workload cannot run on `t` at all, if it cannot: it crashes the file system
    /// and times its recovery, and `t` has nothing that outlives a crash
    /// ([`crate::target::TargetSpec::volatile`]). The runner records the reason in place of
    /// a result rather than time the mount of an empty file system as a recovery.
    pub fn unrunnable_on(&self, t: &crate::target::TargetSpec) -> Option<String> {
        match self {
            Workload::Recovery(_) | Workload::RecoverySweep(_) => t
                .volatile()
                .map(|why| format!("{} crashes the file system: {why}", self.name())),
            _ => None,
        }
    }

    /// Runs whatever must happen once before the first repetition (downloads).
    pub fn prepare(&self) -> Result<()> {
        match self {
            Workload::Ssh(c) => drop(ssh::prepare(c)?),
            Workload::Fsstress(_) => fsstress::prepare()?,
            _ => {}
        }
        Ok(())
    }

    /// What the workload sets on its stage before it runs: postmark-large a cairn target's
    /// cache to half its file set ([`PostmarkConfig::cache_option`]), unless the run's own
    /// mount options name a cache (the user's choice stands).
    pub fn set_stage(&self, stage: &mut dyn Stage) -> Result<()> {
        if let Workload::Postmark { cfg, .. } = self
            && let Some(opt) = cfg.cache_option()
            && stage.sizes_cache()
        {
            stage.remount_with(&opt)?;
        }
        Ok(())
    }

    /// One line saying what the workload does, for tables.
    pub fn describe(&self) -> String {
        match self {
            Workload::CreateUnlink { files } => {
                format!(
                    "create + unlink of {files} 0-length files in one directory (each unlinked right after its creation); rate in files/s"
                )
            }
            Workload::Smallfile { files, size } => {
                format!(
                    "{files} files of {size} B in one directory: create, read back (cold cache), delete; rate in files/s per phase, device busy fraction"
                )
            }
            Workload::Postmark { cfg, .. } => {
                format!(
                    "PostMark: {} files of {} B–{} KiB{}, {} transactions, {} B blocks, {}; rate in transactions/s over the whole run (creation and deletion included)",
                    cfg.files,
                    cfg.min_size,
                    cfg.max_size / 1024,
                    if cfg.subdirs > 0 {
                        format!(" in {} subdirectories", cfg.subdirs)
                    } else {
                        String::new()
                    },
                    cfg.transactions,
                    cfg.block,
                    if cfg.buffered {
                        "buffered"
                    } else {
                        "unbuffered"
                    }
                ) + &cfg.cache_option().map_or_else(String::new, |o| {
                    format!(
                        "; a cairn target's buffer cache set to 1/{} of the file set ({o})",
                        cfg.set_over_cache.unwrap_or(1)
                    )
                })
            }
            Workload::Seq { bytes, chunk } => format!(
                "sequential write (then fsync) and cold read of a {} MiB file in {} KiB requests; rate in MiB/s",
                bytes >> 20,
                chunk >> 10
            ),
            Workload::Micro(c) => c.describe(),
            Workload::Largefile(c) => c.describe(),
            Workload::Netnews(c) => c.describe(),
            Workload::Ssh(c) => c.describe(),
            Workload::Sdet(c) => c.describe(),
            Workload::Recovery(c) => c.describe(),
            Workload::GroupCreate(c) => c.describe(),
            Workload::RecoverySweep(c) => c.describe(),
            Workload::Rename(c) => c.describe(),
            Workload::Fsstress(c) => c.describe(),
        }
    }

    pub fn run(&self, stage: &mut dyn Stage) -> Result<Vec<PhaseResult>> {
        let dir = stage.dir();
        match self {
            &Workload::CreateUnlink { files } => Ok(vec![measure(
                stage,
                "create+unlink",
                files as f64,
                "files",
                || create_unlink(&dir, files),
            )?]),
            &Workload::Smallfile { files, size } => {
                let create = measure(stage, "create", files as f64, "files", || {
                    small_create(&dir, files, size)
                })?;
                let read = measure_cold(stage, "read", None, files as f64, "files", || {
                    small_read(&dir, files, size)
                })?;
                let delete = measure(stage, "delete", files as f64, "files", || {
                    small_delete(&dir, files)
                })?;
                Ok([Some(create), read, Some(delete)]
                    .into_iter()
                    .flatten()
                    .collect())
            }
            Workload::Postmark { cfg, .. } => {
                self.set_stage(stage)?;
                let script = cfg.script(&dir);
                Ok(vec![measure(
                    stage,
                    "run",
                    cfg.transactions as f64,
                    "tx",
                    || run_postmark(&script),
                )?])
            }
            &Workload::Seq { bytes, chunk } => {
                let path = dir.join("seq.dat");
                let mib = bytes as f64 / f64::from(1u32 << 20);
                let write = measure(stage, "write", mib, "MiB", || {
                    seq_write(&path, bytes, chunk)
                })?;
                let read = measure_cold(stage, "read", None, mib, "MiB", || {
                    seq_read(&path, bytes, chunk)
                })?;
                Ok([Some(write), read].into_iter().flatten().collect())
            }
            Workload::Micro(c) => micro::run(stage, c),
            Workload::Largefile(c) => largefile::run(stage, c),
            Workload::Netnews(c) => netnews::run(stage, c),
            Workload::Ssh(c) => ssh::run(stage, c),
            Workload::Sdet(c) => sdet::run(stage, c),
            Workload::Recovery(c) => recovery::run(stage, c),
            Workload::GroupCreate(c) => groupcreate::run(stage, c),
            Workload::RecoverySweep(c) => recovery_sweep::run(stage, c),
            Workload::Rename(c) => rename::run(stage, c),
            Workload::Fsstress(c) => fsstress::run(stage, c),
        }
    }
}

fn name_of(dir: &Path, i: u64) -> PathBuf {
    dir.join(format!("f{i:07}"))
}

/// Creates `p` empty and closes it: O_CREAT|O_EXCL, a fresh inode every time, never a
/// truncate of an old one.
pub(crate) fn create_empty(p: &Path) -> Result<()> {
    drop(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(p)
            .with_context(|| format!("create {}", p.display()))?,
    );
    Ok(())
}

fn create_unlink(dir: &Path, files: u64) -> Result<serde_json::Value> {
    for i in 0..files {
        let p = name_of(dir, i);
        create_empty(&p)?;
        fs::remove_file(&p).with_context(|| format!("unlink {}", p.display()))?;
    }
    Ok(serde_json::Value::Null)
}

/// Content of small file `i`: its index, then a pattern, so a read-back checks identity too.
fn small_content(i: u64, size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size)
        .map(|k| (k as u64).wrapping_mul(31).wrapping_add(i) as u8)
        .collect();
    let tag = i.to_le_bytes();
    let n = tag.len().min(size);
    v[..n].copy_from_slice(&tag[..n]);
    v
}

fn small_create(dir: &Path, files: u64, size: usize) -> Result<serde_json::Value> {
    for i in 0..files {
        let p = name_of(dir, i);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .with_context(|| format!("create {}", p.display()))?;
        f.write_all(&small_content(i, size))
            .with_context(|| format!("write {}", p.display()))?;
    }
    Ok(serde_json::Value::Null)
}

fn small_read(dir: &Path, files: u64, size: usize) -> Result<serde_json::Value> {
    let mut buf = Vec::with_capacity(size + 1);
    for i in 0..files {
        let p = name_of(dir, i);
        buf.clear();
        File::open(&p)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .with_context(|| format!("read {}", p.display()))?;
        ensure!(
            buf == small_content(i, size),
            "{} read back wrong content ({} bytes)",
            p.display(),
            buf.len()
        );
    }
    Ok(serde_json::Value::Null)
}

fn small_delete(dir: &Path, files: u64) -> Result<serde_json::Value> {
    for i in 0..files {
        let p = name_of(dir, i);
        fs::remove_file(&p).with_context(|| format!("unlink {}", p.display()))?;
    }
    Ok(serde_json::Value::Null)
}

fn run_postmark(cfg: &str) -> Result<serde_json::Value> {
    let mut child = Command::new("postmark")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context(
            "cannot start postmark (Debian package `postmark`; run scripts/install-deps.sh)",
        )?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(cfg.as_bytes())?;
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "postmark failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report = parse_postmark(&text)
        .with_context(|| format!("unexpected postmark output: {text:.400}"))?;
    Ok(serde_json::to_value(report)?)
}

/// The figures of PostMark's report that are worth keeping (it reports whole seconds only, so
/// the benchmark's own wall clock gives the rate).
#[derive(Debug, PartialEq, Serialize)]
pub struct PostmarkReport {
    pub total_secs: u64,
    pub transaction_secs: u64,
    pub created: u64,
    pub read: u64,
    pub appended: u64,
    pub deleted: u64,
}

pub fn parse_postmark(text: &str) -> Option<PostmarkReport> {
    let num_before = |needle: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.contains(needle))?;
        line.split_whitespace().next()?.parse().ok()
    };
    Some(PostmarkReport {
        total_secs: num_before("seconds total")?,
        transaction_secs: num_before("seconds of transactions")?,
        created: num_before(" created (")?,
        read: num_before(" read (")?,
        appended: num_before(" appended (")?,
        deleted: num_before(" deleted (")?,
    })
}

/// A chunk of the sequential file: the chunk's index, then a pattern. The index lets the
/// read-back catch a misplaced block at almost no cost.
fn seq_fill(buf: &mut [u8], idx: u64) {
    buf[..8].copy_from_slice(&idx.to_le_bytes());
}

fn seq_write(path: &Path, bytes: u64, chunk: usize) -> Result<serde_json::Value> {
    let mut buf: Vec<u8> = (0..chunk).map(|k| (k * 7 + 1) as u8).collect();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    let mut left = bytes;
    let mut idx = 0;
    while left > 0 {
        let n = (chunk as u64).min(left) as usize;
        seq_fill(&mut buf, idx);
        f.write_all(&buf[..n])
            .with_context(|| format!("write {}", path.display()))?;
        left -= n as u64;
        idx += 1;
    }
    // The write is done when it is on the device, in every target alike.
    f.sync_all()
        .with_context(|| format!("fsync {}", path.display()))?;
    Ok(serde_json::Value::Null)
}

/// Fills `buf` from `r` unless the end comes first; returns how much it read (short only at
/// the end). A single read(2) may return less than asked for on any file system.
pub fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn seq_read(path: &Path, bytes: u64, chunk: usize) -> Result<serde_json::Value> {
    let mut f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut buf = vec![0u8; chunk];
    let mut total = 0u64;
    let mut idx = 0u64;
    loop {
        let got =
            read_full(&mut f, &mut buf).with_context(|| format!("read {}", path.display()))?;
        if got == 0 {
            break;
        }
        ensure!(
            got < 8 || buf[..8] == idx.to_le_bytes(),
            "{}: chunk {idx} read back wrong",
            path.display()
        );
        total += got as u64;
        idx += 1;
    }
    ensure!(
        total == bytes,
        "{}: read {total} bytes, wrote {bytes}",
        path.display()
    );
    Ok(serde_json::Value::Null)
}

pub fn flush_rate(dir: &Path, max_iters: u64, max_secs: f64) -> Result<FlushRate> {
    use std::os::unix::fs::FileExt;
    let dir = sys::ensure_dir(dir)?;
    let block = [0x5au8; 4096];
    let path = dir.join("flush-rate.dat");
    let _ = fs::remove_file(&path);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    const SLOTS: u64 = 256;
    for s in 0..SLOTS {
        f.write_at(&block, s * 4096)?;
    }
    f.sync_all()?;
    let timed = |op: &dyn Fn(u64) -> std::io::Result<()>| -> Result<f64> {
        let t0 = Instant::now();
        let mut n = 0;
        while n < max_iters && t0.elapsed().as_secs_f64() < max_secs {
            op(n)?;
            n += 1;
        }
        Ok(n as f64 / t0.elapsed().as_secs_f64())
    };
    let overwrite = timed(&|i| {
        f.write_at(&block, (i % SLOTS) * 4096)?;
        f.sync_data()
    })?;
    let base = SLOTS * 4096;
    let append = timed(&|i| {
        f.write_at(&block, base + i * 4096)?;
        f.sync_data()
    })?;
    drop(f);
    fs::remove_file(&path)?;
    Ok(FlushRate {
        overwrite_per_sec: overwrite,
        append_per_sec: append,
        max_iterations: max_iters,
        host_fs: sys::fs_type_of(&dir).unwrap_or_default(),
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_in_descriptions_are_formatted() {
        assert_eq!(fmt_bytes_human(0), "0 KiB");
        assert_eq!(fmt_bytes_human(96 << 10), "96 KiB");
        assert_eq!(fmt_bytes_human(128 << 20), "128 MiB");
        assert_eq!(fmt_bytes_human(1_342_177), "1.28 MiB");
        assert_eq!(fmt_bytes_human(1_500), "1.46 KiB");
    }

    #[test]
    fn metadata_workloads_run_and_leave_the_directory_empty() {
        let d = tempfile::tempdir().unwrap();
        let mut st = PlainDir::new(d.path());
        let r = Workload::CreateUnlink { files: 200 }.run(&mut st).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].ops, 200.0);
        assert!(r[0].rate > 0.0);
        let r = Workload::Smallfile {
            files: 100,
            size: 1024,
        }
        .run(&mut st)
        .unwrap();
        assert_eq!(
            r.iter().map(|p| p.phase.as_str()).collect::<Vec<_>>(),
            ["create", "read", "delete"]
        );
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
    }

    /// A directory that cannot be made cold (`no_cold`), or one that can, in the usual way or
    /// (`by`) another it says, as the FUSE floor; counts the `make_cold` calls (which it
    /// refuses when volatile) and keeps the skips.
    struct Cold {
        dir: PathBuf,
        volatile: bool,
        by: Option<&'static str>,
        cold_calls: usize,
        skipped: Vec<Skipped>,
    }

    impl Cold {
        fn new(dir: &Path, volatile: bool) -> Cold {
            Cold {
                dir: dir.to_path_buf(),
                volatile,
                by: None,
                cold_calls: 0,
                skipped: Vec::new(),
            }
        }

        fn skipped(&self) -> Vec<&str> {
            self.skipped
                .iter()
                .map(|s| s.phase.as_deref().unwrap_or("*"))
                .collect()
        }
    }

    impl Stage for Cold {
        fn dir(&self) -> PathBuf {
            self.dir.clone()
        }
        fn counters(&self) -> Result<Option<Counters>> {
            Ok(None)
        }
        fn make_cold(&mut self) -> Result<()> {
            self.cold_calls += 1;
            ensure!(!self.volatile, "volatile: cannot be made cold");
            Ok(())
        }
        fn no_cold(&self) -> Option<&'static str> {
            self.volatile.then_some("it forgets")
        }
        fn cold_by(&self) -> Option<&'static str> {
            self.by
        }
        fn skip(&mut self, skipped: Skipped) {
            self.skipped.push(skipped);
        }
    }

    /// A stage that records the options it is remounted with.
    struct Sized {
        may: bool,
        remounts: Vec<String>,
    }

    impl Stage for Sized {
        fn dir(&self) -> PathBuf {
            PathBuf::from("/nonexistent")
        }
        fn counters(&self) -> Result<Option<Counters>> {
            Ok(None)
        }
        fn make_cold(&mut self) -> Result<()> {
            Ok(())
        }
        fn remount_with(&mut self, opts: &str) -> Result<()> {
            self.remounts.push(opts.to_string());
            Ok(())
        }
        fn sizes_cache(&self) -> bool {
            self.may
        }
    }

    /// postmark-large's file set is twice cairn's cache at every scale: the paper suite's
    /// 0.1 (5,000 files, ~42 MB) would fit the default 256 MiB and measure an in-cache rate
    /// under the working-set target's name. A target that may not be sized (a kernel file
    /// system, a run whose options name a cache) keeps its own; plain PostMark is not sized.
    #[test]
    fn postmark_large_sets_the_cache_to_half_its_file_set() {
        let p = Params::scaled(0.1, 1.0);
        let large = Workload::named("postmark-large", &p).unwrap();
        let Workload::Postmark { cfg, .. } = &large else {
            unreachable!()
        };
        assert_eq!(cfg.files, 5_000);
        let mut stage = Sized {
            may: true,
            remounts: Vec::new(),
        };
        large.set_stage(&mut stage).unwrap();
        let half = cfg.set_bytes() / 2;
        assert_eq!(stage.remounts, [format!("cache={}K", half.div_ceil(1024))]);
        assert!(half < 256 << 20 && cfg.set_bytes() >= 2 * half);
        assert!(large.describe().contains("1/2 of the file set"));
        let mut kept = Sized {
            may: false,
            remounts: Vec::new(),
        };
        large.set_stage(&mut kept).unwrap();
        Workload::named("postmark", &p)
            .unwrap()
            .set_stage(&mut stage)
            .unwrap();
        assert!(kept.remounts.is_empty());
        assert_eq!(stage.remounts.len(), 1, "plain PostMark is not sized");
    }

    fn phases(r: &[PhaseResult]) -> Vec<String> {
        r.iter().map(PhaseResult::label).collect()
    }

    /// On a stage that cannot be made cold, every phase that must start cold is run (the
    /// later phases need its effects) but recorded as skipped with the reason, never as a
    /// warm number; the others are measured as usual. A stage that can is made cold as
    /// before.
    #[test]
    fn cold_phases_are_skipped_with_the_reason_where_nothing_can_be_cold() {
        let d = tempfile::tempdir().unwrap();
        let small = Workload::Smallfile {
            files: 20,
            size: 100,
        };
        let mut floor = Cold::new(d.path(), true);
        let r = small.run(&mut floor).unwrap();
        assert_eq!(phases(&r), ["create", "delete"]);
        assert_eq!(floor.skipped(), ["read"]);
        assert_eq!(floor.skipped[0].why, "cannot start cold: it forgets");
        assert_eq!(floor.cold_calls, 0, "never asked to be cold");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);

        let mut floor = Cold::new(d.path(), true);
        let r = Workload::Largefile(largefile::Config::scaled(0.0))
            .run(&mut floor)
            .unwrap();
        assert_eq!(phases(&r), ["seq-write", "rand-write"]);
        assert_eq!(floor.skipped(), ["seq-read", "rand-read", "seq-reread"]);

        // micro: cold before every phase, so every phase is skipped, each under its label.
        let mut floor = Cold::new(d.path(), true);
        let cfg = micro::Config {
            sizes: vec![0, 4096],
            data_bytes: 0,
            min_files: 3,
            per_dir: 2,
        };
        let r = Workload::Micro(cfg).run(&mut floor).unwrap();
        assert!(r.is_empty(), "{:?}", phases(&r));
        assert_eq!(floor.skipped().len(), 8);
        assert_eq!(floor.skipped()[..2], ["create 0", "read 0"]);
        assert_eq!(floor.skipped()[5], "read 4K");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);

        let mut disk = Cold::new(d.path(), false);
        let r = small.run(&mut disk).unwrap();
        assert_eq!(phases(&r), ["create", "read", "delete"]);
        assert_eq!((disk.cold_calls, disk.skipped.len()), (1, 0));
        assert!(
            r.iter().all(|p| p.cold.is_none()),
            "made cold the usual way"
        );
    }

    /// A stage made cold its own way (the FUSE floor: the kernel's caches dropped under its
    /// daemon) is made cold before every phase that must start cold, each of them measured
    /// and saying how, and no other phase says so: smallfile's read, largefile's reads,
    /// netnews' unbatch (the spool populated, then cold; expire follows warm).
    #[test]
    fn cold_phases_say_how_a_stage_made_cold_its_own_way_was() {
        const BY: &str = "kernel caches only";
        let how = |r: &[PhaseResult]| -> Vec<(String, bool)> {
            r.iter()
                .map(|p| (p.label(), p.cold.as_deref() == Some(BY)))
                .collect()
        };
        let d = tempfile::tempdir().unwrap();
        let mut floor = Cold::new(d.path(), false);
        floor.by = Some(BY);
        let r = Workload::Smallfile {
            files: 20,
            size: 100,
        }
        .run(&mut floor)
        .unwrap();
        assert_eq!(
            how(&r),
            [
                ("create".into(), false),
                ("read".into(), true),
                ("delete".into(), false)
            ]
        );
        let r = Workload::Largefile(largefile::Config::scaled(0.0))
            .run(&mut floor)
            .unwrap();
        let cold: Vec<String> = how(&r).into_iter().filter(|p| p.1).map(|p| p.0).collect();
        assert_eq!(cold, ["seq-read", "rand-read", "seq-reread"]);
        assert_eq!(r.len(), 5, "every phase measured");
        let r = Workload::Netnews(netnews::Config::scaled(0.0005))
            .run(&mut floor)
            .unwrap();
        assert_eq!(
            how(&r),
            [
                ("populate".into(), false),
                ("unbatch".into(), true),
                ("expire".into(), false)
            ]
        );
        assert_eq!((floor.cold_calls, floor.skipped.len()), (5, 0));
    }

    /// Workloads that crash the file system are not run on one with nothing to recover
    /// (the floor), and the reason says so; everything else runs there.
    #[test]
    fn crash_workloads_are_unrunnable_on_a_volatile_target() {
        let p = Params::scaled(0.01, 0.1);
        let floor = crate::target::TargetSpec::parse(crate::target::FLOOR).unwrap();
        let cairn = crate::target::TargetSpec::parse("cairn-async").unwrap();
        for n in NAMES {
            let w = Workload::named(n, &p).unwrap();
            let why = w.unrunnable_on(&floor);
            let crashes = matches!(w, Workload::Recovery(_) | Workload::RecoverySweep(_));
            assert_eq!(why.is_some(), crashes, "{n}: {why:?}");
            if let Some(why) = why {
                assert!(why.starts_with(&format!("{n} crashes")), "{why}");
                assert!(why.contains(crate::target::VOLATILE));
            }
            assert!(w.unrunnable_on(&cairn).is_none(), "{n}");
        }
    }

    #[test]
    fn small_read_detects_wrong_content() {
        let d = tempfile::tempdir().unwrap();
        small_create(d.path(), 3, 100).unwrap();
        small_read(d.path(), 3, 100).unwrap();
        fs::write(name_of(d.path(), 1), small_content(2, 100)).unwrap();
        assert!(small_read(d.path(), 3, 100).is_err());
    }

    #[test]
    fn seq_round_trip_and_corruption_is_caught() {
        let d = tempfile::tempdir().unwrap();
        let mut st = PlainDir::new(d.path());
        let r = Workload::Seq {
            bytes: 3 * 65536 + 100,
            chunk: 65536,
        }
        .run(&mut st)
        .unwrap();
        assert_eq!(r.len(), 2);
        let p = d.path().join("seq.dat");
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, &[0xff], 65536).unwrap();
        assert!(seq_read(&p, 3 * 65536 + 100, 65536).is_err());
        assert!(seq_read(&p, 3 * 65536 + 101, 65536).is_err());
    }

    #[test]
    fn per_op_divides_counter_deltas() {
        let c = Counters::from_json(&serde_json::json!({"device": {"writes": 30, "flushes": 10}}));
        let p = PhaseResult {
            phase: "x".into(),
            ops: 10.0,
            unit: "files".into(),
            secs: 1.0,
            rate: 10.0,
            counters: Some(c),
            param: None,
            extra: serde_json::Value::Null,
            cold: None,
        };
        assert_eq!(p.per_op(Counters::device_flushes), Some(1.0));
        assert_eq!(p.per_op(Counters::fuse_requests), None);
    }

    #[test]
    fn postmark_report_parses() {
        let out = "PostMark v1.51 : 8/14/01\npm>Creating files...Done\nTime:\n\t3 seconds total\n\t2 seconds of transactions (10000 per second)\n\nFiles:\n\t192 created (192 per second)\n\t\tCreation alone: 100 files (100 per second)\n\t98 read (98 per second)\n\t102 appended (102 per second)\n\t192 deleted (192 per second)\n";
        let r = parse_postmark(out).unwrap();
        assert_eq!(
            r,
            PostmarkReport {
                total_secs: 3,
                transaction_secs: 2,
                created: 192,
                read: 98,
                appended: 102,
                deleted: 192
            }
        );
        assert!(parse_postmark("garbage").is_none());
        let cfg = PostmarkConfig::seltzer().script(Path::new("/m/b"));
        assert!(cfg.starts_with("set location /m/b\n") && cfg.ends_with("run\nquit\n"));
        assert!(cfg.contains("set number 10000\n") && cfg.contains("set read 512\n"));
        assert!(!cfg.contains("subdirectories"));
        let u = PostmarkConfig::umbrella().script(Path::new("/m"));
        assert!(u.contains("set subdirectories 200\n") && u.contains("set buffering false\n"));
        assert!(u.contains("set size 8192 65536\n") && u.contains("set transactions 25000\n"));
        let q = PostmarkConfig::umbrella().scaled(0.001);
        assert_eq!((q.files, q.transactions, q.subdirs), (50, 100, 2));
    }

    #[test]
    fn postmark_runs_when_installed() {
        if !sys::have_tool("postmark") {
            eprintln!("postmark not installed; skipping");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let mut st = PlainDir::new(d.path());
        let w = Workload::Postmark {
            variant: "postmark".into(),
            cfg: PostmarkConfig {
                files: 50,
                max_size: 4096,
                transactions: 100,
                subdirs: 3,
                ..PostmarkConfig::seltzer()
            },
        };
        let r = w.run(&mut st).unwrap();
        assert_eq!(r[0].extra["created"].as_u64().map(|c| c >= 50), Some(true));
    }

    #[test]
    fn flush_rate_measures_something() {
        let d = tempfile::tempdir().unwrap();
        let r = flush_rate(d.path(), 20, 5.0).unwrap();
        assert!(r.overwrite_per_sec > 0.0 && r.append_per_sec > 0.0);
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
