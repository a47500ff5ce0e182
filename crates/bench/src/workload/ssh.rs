//! The SSH build benchmark (000 §4.3.1, results §5.2.1 Table 5): unpack, configure and build a
//! real, medium-sized C package, each phase timed on its own. The paper used ssh 1.2.26; we use
//! the upstream OpenSSH tarball of Debian's `openssh` source package, fetched once into a local
//! cache so that no run depends on the network and every target unpacks the same bytes.
//!
//! The three phases run back to back with no cache drop between them: the paper runs config
//! and build "with the file system cache warmed by the previous phases". Unpack is metadata
//! heavy (hundreds of files of mixed sizes), config compiles and runs many tiny test programs,
//! build is CPU bound, so the spread between file systems shrinks phase by phase.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};

use super::{PhaseResult, Stage, measure};

/// Where the source tarball is kept between runs (`$CAIRN_BENCH_CACHE/openssh` when that is
/// set: `make test` keeps it in its scratch directory, so the suite leaves nothing behind).
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/cairn-bench/openssh";

fn cache_dir() -> PathBuf {
    match std::env::var_os("CAIRN_BENCH_CACHE") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("openssh"),
        _ => PathBuf::from(DEFAULT_CACHE_DIR),
    }
}

/// The make target of a scaled run: OpenSSH's portability library, a few dozen files compiled
/// against the generated config.h (about a tenth of the full build), so a quick run still
/// exercises configure's output.
pub const SCALED_TARGET: &str = "openbsd-compat/libopenbsd-compat.a";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Directory holding `<package>_*.orig.tar.gz`; filled by `apt-get source` when empty.
    pub cache_dir: PathBuf,
    /// Debian source package whose upstream tarball is built.
    pub package: String,
    /// Arguments to `./configure`. Optional features whose libraries may or may not be
    /// installed are switched off explicitly, so every machine configures the same build.
    pub configure_args: Vec<String>,
    /// Make target; `None` builds the default target (`all`: ssh, sshd and the tools).
    pub make_target: Option<String>,
    /// File (relative to the source tree) that must exist after the build.
    pub expect_output: String,
    /// `make -j`; 1 matches the paper's single-CPU machines.
    pub jobs: u32,
}

impl Config {
    pub fn paper() -> Config {
        Config {
            cache_dir: cache_dir(),
            package: "openssh".into(),
            configure_args: [
                "--without-pam",
                "--without-selinux",
                "--without-kerberos5",
                "--without-libedit",
                "--without-ldns",
                "--without-security-key-builtin",
            ]
            .map(String::from)
            .to_vec(),
            make_target: None,
            expect_output: "ssh".into(),
            jobs: 1,
        }
    }

    /// Unpack and configure cannot shrink without changing what they measure, so a scaled run
    /// keeps them whole and builds only [`SCALED_TARGET`].
    pub fn scaled(scale: f64) -> Config {
        let mut c = Config::paper();
        if scale < 1.0 {
            c.make_target = Some(SCALED_TARGET.into());
            c.expect_output = SCALED_TARGET.into();
        }
        c
    }

    pub fn describe(&self) -> String {
        format!(
            "{} build (Debian upstream tarball): unpack (tar xzf), config (./configure {}), build (make -j{} {}), consecutive with a warm cache; elapsed seconds per phase",
            self.package,
            self.configure_args.join(" "),
            self.jobs,
            self.make_target.as_deref().unwrap_or("all"),
        )
    }
}

/// Makes sure the source tarball is in the cache directory, fetching it if it is not, and
/// returns its path. Runs outside every timed phase.
pub fn prepare(cfg: &Config) -> Result<PathBuf> {
    if let Some(t) = find_tarball(&cfg.cache_dir, &cfg.package)? {
        return Ok(t);
    }
    fs::create_dir_all(&cfg.cache_dir)
        .with_context(|| format!("create {}", cfg.cache_dir.display()))?;
    // Fetch into a private directory and move the tarball in last, so a fetch cut short never
    // leaves a partial tarball where the next run would take it for a good one.
    let tmp = cfg.cache_dir.join(format!(".fetch-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let fetched = fetch(&tmp, &cfg.package).and_then(|()| {
        let t = find_tarball(&tmp, &cfg.package)?.with_context(|| {
            format!(
                "apt-get source {} left no {}_*.orig.tar.gz",
                cfg.package, cfg.package
            )
        })?;
        let dest = cfg.cache_dir.join(t.file_name().expect("a file"));
        fs::rename(&t, &dest).with_context(|| format!("move {} into cache", t.display()))?;
        Ok(dest)
    });
    let _ = fs::remove_dir_all(&tmp);
    fetched
}

fn fetch(dir: &Path, package: &str) -> Result<()> {
    let source = || {
        let mut c = Command::new("apt-get");
        c.args(["source", "--download-only", "-qq", package])
            .current_dir(dir);
        c
    };
    if crate::sys::run(&mut source()).is_ok() {
        return Ok(());
    }
    // The usual cause is stale package lists (the version they name is gone from the mirror).
    crate::sys::run(Command::new("apt-get").args(["update", "-qq"]))
        .context("apt-get update (to fetch the ssh build's source)")?;
    crate::sys::run(&mut source()).with_context(|| {
        format!("apt-get source {package} (needs deb-src entries: run scripts/install-deps.sh)")
    })?;
    Ok(())
}

/// The newest (by name) upstream tarball of `package` in `dir`, if any.
fn find_tarball(dir: &Path, package: &str) -> Result<Option<PathBuf>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("read {}", dir.display())),
    };
    let prefix = format!("{package}_");
    let mut found: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(OsStr::to_str).is_some_and(|n| {
                n.starts_with(&prefix) && n.ends_with(".orig.tar.gz") && p.is_file()
            })
        })
        .collect();
    found.sort();
    Ok(found.pop())
}

pub fn run(stage: &mut dyn Stage, cfg: &Config) -> Result<Vec<PhaseResult>> {
    ensure!(cfg.jobs >= 1, "ssh: make -j must be at least 1");
    let tarball = prepare(cfg)?;
    let dir = stage.dir();
    let not_empty = fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .next()
        .is_some();
    ensure!(
        !not_empty,
        "ssh: {} is not empty; the build needs a fresh directory",
        dir.display()
    );

    let unpack = measure(stage, "unpack", 1.0, "s", || {
        crate::sys::run(
            Command::new("tar")
                .arg("xzf")
                .arg(&tarball)
                .current_dir(&dir),
        )?;
        Ok(serde_json::Value::Null)
    })?;
    // Found outside the timed phase: the walk would otherwise be charged to unpack.
    let src = source_root(&dir)?;
    let (files, bytes) = tree_size(&src)?;
    let unpack = PhaseResult {
        extra: serde_json::json!({
            "tarball": tarball.file_name().and_then(OsStr::to_str),
            "files": files,
            "bytes": bytes,
        }),
        ..unpack
    };

    let config = measure(stage, "config", 1.0, "s", || {
        tool(Command::new("./configure").args(&cfg.configure_args), &src)?;
        Ok(serde_json::json!({ "args": cfg.configure_args }))
    })?;
    for f in ["Makefile", "config.h"] {
        ensure!(
            src.join(f).is_file(),
            "ssh config: configure exited 0 but wrote no {f}"
        );
    }

    let build = measure(stage, "build", 1.0, "s", || {
        let mut make = Command::new("make");
        make.arg(format!("-j{}", cfg.jobs));
        make.args(&cfg.make_target);
        tool(&mut make, &src)?;
        Ok(serde_json::json!({
            "target": cfg.make_target.as_deref().unwrap_or("all"),
            "jobs": cfg.jobs,
        }))
    })?;
    let out = src.join(&cfg.expect_output);
    let len = fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    ensure!(
        len > 0,
        "ssh build: make exited 0 but {} is missing or empty",
        out.display()
    );
    Ok(vec![unpack, config, build])
}

/// Runs a build tool in `src` with an environment that cannot change what gets built: the
/// caller's compiler flags or a parent make's jobserver (MAKEFLAGS) would make targets differ.
fn tool(cmd: &mut Command, src: &Path) -> Result<()> {
    for v in [
        "MAKEFLAGS",
        "MFLAGS",
        "MAKELEVEL",
        "CC",
        "CFLAGS",
        "CPPFLAGS",
        "LDFLAGS",
        "LIBS",
    ] {
        cmd.env_remove(v);
    }
    let out = cmd
        .env("LC_ALL", "C")
        .current_dir(src)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        // configure explains itself in config.log; make in its last lines of stderr.
        let tail = |b: &[u8]| {
            let s = String::from_utf8_lossy(b);
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        bail!(
            "{cmd:?} in {} failed ({}):\n{}\n{}",
            src.display(),
            out.status,
            tail(&out.stdout),
            tail(&out.stderr)
        );
    }
    Ok(())
}

/// The one directory the tarball unpacked to (upstream tarballs hold `<name>-<version>/`).
fn source_root(dir: &Path) -> Result<PathBuf> {
    let mut roots = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let p = e?.path();
        if p.join("configure").is_file() {
            roots.push(p);
        }
    }
    match roots.len() {
        1 => Ok(roots.pop().expect("one")),
        0 => bail!(
            "ssh unpack: no directory with a configure script in {}",
            dir.display()
        ),
        n => bail!(
            "ssh unpack: {n} source trees in {} (stage not empty?)",
            dir.display()
        ),
    }
}

/// Regular files and their total bytes under `dir`, for the record and as unpack's check.
fn tree_size(dir: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                files += 1;
                bytes += e.metadata()?.len();
            }
        }
    }
    Ok((files, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::PlainDir;

    #[test]
    fn scaled_builds_a_smaller_target_and_paper_the_whole_package() {
        let p = Config::paper();
        assert_eq!(Config::scaled(1.0), p);
        assert_eq!(p.make_target, None);
        assert_eq!(p.expect_output, "ssh");
        assert_eq!(p.jobs, 1);
        let q = Config::scaled(0.001);
        assert_eq!(q.make_target.as_deref(), Some(SCALED_TARGET));
        assert_eq!(q.expect_output, SCALED_TARGET);
        assert_eq!(q.configure_args, p.configure_args);
        assert!(q.describe().contains(SCALED_TARGET));
        assert!(p.describe().contains("make -j1 all"));
    }

    #[test]
    fn finds_the_newest_orig_tarball_only() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(find_tarball(d.path(), "openssh").unwrap(), None);
        assert_eq!(
            find_tarball(&d.path().join("missing"), "openssh").unwrap(),
            None
        );
        for n in [
            "openssh_9.2p1.orig.tar.gz",
            "openssh_9.3p1.orig.tar.gz",
            "openssh_9.9p1.orig.tar.gz.asc",
            "openssh_9.9p1-2.debian.tar.xz",
            "opensshx_9.9.orig.tar.gz",
        ] {
            fs::write(d.path().join(n), b"x").unwrap();
        }
        assert_eq!(
            find_tarball(d.path(), "openssh").unwrap(),
            Some(d.path().join("openssh_9.3p1.orig.tar.gz"))
        );
    }

    #[test]
    fn source_root_needs_exactly_one_tree() {
        let d = tempfile::tempdir().unwrap();
        assert!(source_root(d.path()).is_err());
        fs::create_dir(d.path().join("a")).unwrap();
        fs::write(d.path().join("a/configure"), b"").unwrap();
        assert_eq!(source_root(d.path()).unwrap(), d.path().join("a"));
        fs::create_dir(d.path().join("b")).unwrap();
        fs::write(d.path().join("b/configure"), b"").unwrap();
        assert!(source_root(d.path()).is_err());
    }

    /// The real thing at the scaled size: fetch (or reuse the cache), unpack, configure, build
    /// the portability library. Needs apt's deb-src entries (or a filled cache), gcc and make.
    #[test]
    fn scaled_build_runs_end_to_end() {
        if !crate::sys::have_tool("cc") || !crate::sys::have_tool("make") {
            eprintln!("ssh: no cc/make; skipping (run scripts/install-deps.sh)");
            return;
        }
        let cfg = Config::scaled(0.01);
        if let Err(e) = prepare(&cfg) {
            eprintln!("ssh: cannot fetch the source ({e:#}); skipping");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let mut st = PlainDir {
            dir: d.path().to_path_buf(),
            source: None,
            drop_caches: false,
        };
        let r = run(&mut st, &cfg).unwrap();
        assert_eq!(
            r.iter().map(|p| p.phase.as_str()).collect::<Vec<_>>(),
            ["unpack", "config", "build"]
        );
        for p in &r {
            assert_eq!((p.unit.as_str(), p.ops), ("s", 1.0));
            assert!(p.secs > 0.0);
        }
        assert!(r[0].extra["files"].as_u64().unwrap() > 100);
        // A second run on the same, now non-empty, directory must refuse rather than mix trees.
        let again = run(&mut st, &cfg);
        assert!(again.is_err());
    }
}
