//! cairn-fstests: helpers for the integration suites in `tests/`.
//!
//! Every suite runs against a [`Target`]: a directory on which the POSIX behaviour under test
//! is observed. [`Target::host_dir`] is a temporary directory on the host file system (the
//! reference the suites are validated against); [`Target::cairn`] is a freshly made cairn
//! image mounted through FUSE in one metadata-update mode. A suite that passes on the host
//! and fails on cairn has found a cairn bug; a suite that fails on the host is itself wrong.
//!
//! Environment (see also the crate README section in each suite's header):
//! - `CAIRN_BIN`: the `cairn` binary. Otherwise the `cairn` built beside the test binary
//!   (same target directory and profile, wherever `CARGO_TARGET_DIR` points), then
//!   `$CARGO_TARGET_DIR` or `target/` `{debug,release}/cairn`; if none exists,
//!   `cargo build -p cairn-cli` is run once.
//! - `CAIRN_TEST_MODES`: comma-separated modes to mount (default: every mode `cairn modes`
//!   lists).
//! - `CAIRN_TEST_HOST_ONLY=1`: run the suites against host directories only.
//! - `CAIRN_TEST_HEAVY=1`: also run the heavy parts (the zlib build in `persistence`).
//! - `CAIRN_MOUNT_OPTS`: extra `-o` options appended to every `cairn mount`.
//! - `CAIRN_TEST_TRANSPORTS`: comma-separated FUSE transports (`dev`, `uring`) every cairn
//!   target is mounted over. By default both, when the kernel has FUSE over io_uring: the
//!   suites then turn its `enable_uring` parameter on (as root; it only changes what new
//!   mounts are offered) and skip io_uring with a message where they cannot. Which suites
//!   cover what, to keep CI time in check: the POSIX suite, the differential test and the
//!   transport suite mount every mode over every transport ([`Target::all`]); the persistence
//!   tests, the slowest, mount every mode once, the transports in turn
//!   ([`Target::all_once`]); kill -9 rounds and single targets take the transports in turn.
//!   An io_uring mount is checked to be served over io_uring (`cairn stats`), and holds
//!   [`URING_PARAMETER_LOCK`] shared while it mounts, so a test that turns the parameter
//!   off ([`ParamOff`]) cannot make it fall back unnoticed.
//!
//! When cairn is not usable (mkfs or mount fails) the suites fail with the command's output:
//! they never pass silently.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub mod sys;
pub mod tree;
pub mod user;
pub mod workdir;

pub use workdir::Workdir;

/// Prints a line tagged with the suite's context; the test harness shows it on failure (and
/// always with `--nocapture`), so a failing run says what it was checking.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        println!("[fstests] {}", format_args!($($arg)*))
    };
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// True when `CAIRN_TEST_HOST_ONLY=1`: the suites validate themselves against host directories.
pub fn host_only() -> bool {
    std::env::var("CAIRN_TEST_HOST_ONLY").is_ok_and(|v| v == "1")
}

/// True when `CAIRN_TEST_HEAVY=1`.
pub fn heavy() -> bool {
    std::env::var("CAIRN_TEST_HEAVY").is_ok_and(|v| v == "1")
}

/// The modes to test, from `CAIRN_TEST_MODES`; by default every mode the binary lists in
/// `cairn modes`, so a new mode gets every suite without an edit here.
pub fn modes() -> Vec<String> {
    if let Ok(s) = std::env::var("CAIRN_TEST_MODES") {
        return s
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect();
    }
    listed().iter().map(|m| m.mode.clone()).collect()
}

/// One mode as `cairn modes --json` describes it.
#[derive(Clone, Debug)]
pub struct Listed {
    pub mode: String,
    /// Its on-disk format (`ffs`, `lfs`): what `mkfs --format` makes for it.
    pub format: String,
    /// Every metadata call durable when it returns (`metadata_on_return`).
    pub durable: bool,
    /// Its design (`facts.family`: `ffs`, `soft_updates`, `journal`, `log_structured`).
    pub family: String,
    /// When a call's metadata is durable (`facts.commit`: `sync`, `group`, `async`).
    pub commit: String,
    /// What a crash asks for before the next mount (`fsck`, `mount`, `recover`).
    pub after_crash: String,
    /// The mode's own options (`options[].key`).
    pub options: Vec<String>,
}

/// The modes of [`modes`] (`CAIRN_TEST_MODES`, or every mode the binary lists), with what
/// `cairn modes --json` says of each.
pub fn mode_list() -> Vec<Listed> {
    let wanted = modes();
    listed()
        .iter()
        .filter(|m| wanted.contains(&m.mode))
        .cloned()
        .collect()
}

/// What the binary lists, asked once per test process.
fn listed() -> &'static [Listed] {
    static LISTED: std::sync::OnceLock<Vec<Listed>> = std::sync::OnceLock::new();
    LISTED.get_or_init(|| {
        let out = Command::new(cairn_bin())
            .args(["modes", "--json"])
            .output()
            .expect("run cairn modes --json");
        assert!(out.status.success(), "cairn modes --json failed");
        let listed: Vec<Listed> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| {
                Some(Listed {
                    mode: v["mode"].as_str()?.to_string(),
                    format: v["type"].as_str().unwrap_or("ffs").to_string(),
                    durable: v["guarantees"]["metadata_on_return"] == serde_json::Value::Bool(true),
                    family: v["facts"]["family"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    commit: v["facts"]["commit"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    after_crash: v["after_crash"].as_str().unwrap_or("mount").to_string(),
                    options: v["options"]
                        .as_array()
                        .map(|o| {
                            o.iter()
                                .filter_map(|o| o["key"].as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                })
            })
            .collect();
        assert!(!listed.is_empty(), "cairn modes listed nothing");
        listed
    })
}

/// The on-disk format mode `mode` runs on (`ffs` for a mode the binary does not list).
pub fn format_of(mode: &str) -> String {
    listed()
        .iter()
        .find(|m| m.mode == mode)
        .map_or_else(|| "ffs".to_string(), |m| m.format.clone())
}

/// The listed modes of design `family` (`cairn modes --json`, `facts.family`: `ffs`,
/// `soft_updates`, `journal`, `log_structured`), in listing order.
pub fn modes_of_family(family: &str) -> Vec<String> {
    listed()
        .iter()
        .filter(|m| m.family == family)
        .map(|m| m.mode.clone())
        .collect()
}

/// Whether mode `mode` is log-structured (`facts.family`), as the binary lists it.
pub fn is_log_structured(mode: &str) -> bool {
    listed()
        .iter()
        .any(|m| m.mode == mode && m.family == "log_structured")
}

/// The modes of [`modes`] that promise every metadata call durable when it returns (`cairn
/// modes --json`: `metadata_on_return`), in the same order: the ones a kill -9 test can
/// hold to "every returned call is there".
pub fn durable_modes() -> Vec<String> {
    modes()
        .into_iter()
        .filter(|m| listed().iter().any(|l| &l.mode == m && l.durable))
        .collect()
}

/// The FUSE transports every cairn target is mounted over, from `CAIRN_TEST_TRANSPORTS`;
/// by default `dev` and, where the kernel has FUSE over io_uring, `uring` (its
/// `enable_uring` parameter is turned on for the run if it is off and we are root).
pub fn transports() -> Vec<String> {
    if let Ok(s) = std::env::var("CAIRN_TEST_TRANSPORTS") {
        return s
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect();
    }
    static LISTED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LISTED
        .get_or_init(|| {
            let mut v = vec!["dev".to_string()];
            match uring_usable() {
                Ok(()) => v.push("uring".into()),
                Err(why) => say!("NOTE: not testing FUSE over io_uring: {why}"),
            }
            v
        })
        .clone()
}

/// The kernel switch for FUSE over io_uring.
pub const URING_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether io_uring mounts can be made, turning the kernel parameter on if need be.
pub fn uring_usable() -> Result<(), String> {
    // Not while a test holds it off on purpose.
    let _lock = uring_parameter_lock(false);
    match fs::read_to_string(URING_PARAMETER) {
        Ok(v) if v.trim() == "Y" => Ok(()),
        Ok(_) if nix::unistd::geteuid().is_root() => fs::write(URING_PARAMETER, "Y")
            .map_err(|e| format!("cannot turn on {URING_PARAMETER}: {e}")),
        Ok(_) => Err(format!(
            "{URING_PARAMETER} is off and only root may turn it on"
        )),
        Err(e) => Err(format!("this kernel has no FUSE over io_uring ({e})")),
    }
}

/// Who may change [`URING_PARAMETER`] while whose io_uring mounts are made: the parameter
/// matters only at a mount's INIT, so an io_uring mount holds this lock shared for the
/// length of its `cairn mount`, and a test that needs the parameter off ([`ParamOff`])
/// holds it exclusively while it is off. A file lock, so test binaries of separate
/// processes (and crates) that use it stay out of each other's way.
pub const URING_PARAMETER_LOCK: &str = "/tmp/cairn-enable-uring.lock";

/// Takes [`URING_PARAMETER_LOCK`], shared or exclusive; released when dropped. `None`
/// when the lock file cannot be made (then nothing is serialized; said once).
pub fn uring_parameter_lock(exclusive: bool) -> Option<nix::fcntl::Flock<fs::File>> {
    use nix::fcntl::{Flock, FlockArg};
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(URING_PARAMETER_LOCK)
        .map_err(|e| say!("NOTE: no lock {URING_PARAMETER_LOCK}: {e}"))
        .ok()?;
    let how = if exclusive {
        FlockArg::LockExclusive
    } else {
        FlockArg::LockShared
    };
    Flock::lock(f, how)
        .map_err(|(_, e)| say!("NOTE: cannot lock {URING_PARAMETER_LOCK}: {e}"))
        .ok()
}

/// Turns [`URING_PARAMETER`] off for the life of the guard, holding
/// [`URING_PARAMETER_LOCK`] exclusively (no io_uring mount of a suite using the lock is
/// made meanwhile), and puts back what it was.
pub struct ParamOff {
    before: String,
    _lock: Option<nix::fcntl::Flock<fs::File>>,
}

impl ParamOff {
    pub fn new() -> io::Result<ParamOff> {
        let lock = uring_parameter_lock(true);
        let before = fs::read_to_string(URING_PARAMETER)?.trim().to_string();
        fs::write(URING_PARAMETER, "N")?;
        Ok(ParamOff {
            before,
            _lock: lock,
        })
    }
}

impl Drop for ParamOff {
    fn drop(&mut self) {
        if let Err(e) = fs::write(URING_PARAMETER, &self.before) {
            say!(
                "WARNING: cannot put {URING_PARAMETER} back to {}: {e}",
                self.before
            );
        }
    }
}

/// The transport for a target made on its own (not by [`Target::all`]): the transports in
/// turn, so a suite that makes several single targets (rounds of a crash test) covers each.
fn next_transport() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let t = transports();
    let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    t.get(i % t.len().max(1))
        .cloned()
        .unwrap_or_else(|| "dev".into())
}

static BIN: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Locates the `cairn` binary, building it once if needed.
///
/// A nested `cargo build` while `cargo test` runs is safe: cargo releases the build-directory
/// lock before it runs test binaries. CI builds the binary first anyway (`make test`).
pub fn cairn_bin() -> PathBuf {
    let mut guard = BIN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = guard.as_ref() {
        return p.clone();
    }
    let found = if let Some(p) = std::env::var_os("CAIRN_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "CAIRN_BIN={} is not a file", p.display());
        p
    } else {
        let root = workspace_root();
        // The test binary runs from <target>/<profile>/deps/: its profile directory holds
        // the `cairn` of the same build wherever CARGO_TARGET_DIR put it.
        let beside = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent()?.parent().map(|p| p.join("cairn")));
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let candidates: Vec<PathBuf> = beside
            .into_iter()
            .chain([target.join("debug/cairn"), target.join("release/cairn")])
            .collect();
        match candidates.iter().find(|p| p.is_file()) {
            Some(p) => p.clone(),
            None => {
                say!("cairn binary not found; running `cargo build -p cairn-cli`");
                let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                    .args(["build", "-p", "cairn-cli"])
                    .current_dir(&root)
                    .status()
                    .expect("run cargo build -p cairn-cli");
                assert!(st.success(), "cargo build -p cairn-cli failed ({st})");
                candidates[0].clone()
            }
        }
    };
    *guard = Some(found.clone());
    found
}

/// Runs a command, returning its output; never panics on a nonzero exit.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The result of `cairn fsck`.
#[derive(Debug, Clone)]
pub struct Fsck {
    /// The exit code (e2fsck classes: 0 clean, 1 fixed, 4 errors left, 8 operational error).
    pub code: i32,
    pub output: String,
}

enum Kind {
    Host {
        tmpfs: bool,
    },
    Cairn {
        bin: PathBuf,
        mode: String,
        /// The FUSE transport (`-o transport=`), one of [`transports`].
        transport: String,
        /// More `-o` options of this target (before `CAIRN_MOUNT_OPTS`).
        options: String,
        image: PathBuf,
        mounted: bool,
    },
}

/// A directory under test. Dropping it unmounts (cairn, tmpfs) and removes the temp files.
pub struct Target {
    kind: Kind,
    /// The directory the suites work in (a mount point for cairn).
    root: PathBuf,
    _dir: tempfile::TempDir,
}

/// A temp dir that other users can traverse (permission tests run as unprivileged users).
fn open_tempdir(prefix: &str) -> tempfile::TempDir {
    let base = std::env::var_os("CAIRN_TEST_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .expect("tempdir");
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).expect("chmod tempdir");
    d
}

impl Target {
    /// A temporary directory on the host file system: the reference behaviour.
    pub fn host_dir() -> Target {
        let d = open_tempdir("cairn-host-");
        let root = d.path().join("root");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        Target {
            kind: Kind::Host { tmpfs: false },
            root,
            _dir: d,
        }
    }

    /// A small tmpfs (`size` like "16M", optional inode limit): the host reference for
    /// running out of space and inodes.
    pub fn host_tmpfs(size: &str, inodes: Option<u64>) -> Target {
        let d = open_tempdir("cairn-tmpfs-");
        let root = d.path().join("root");
        fs::create_dir(&root).unwrap();
        let mut opts = format!("size={size},mode=0755");
        if let Some(n) = inodes {
            opts.push_str(&format!(",nr_inodes={n}"));
        }
        let o = run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
            .arg(&root));
        assert!(o.status.success(), "mounting tmpfs failed: {}", show(&o));
        Target {
            kind: Kind::Host { tmpfs: true },
            root,
            _dir: d,
        }
    }

    /// A fresh 512 MiB cairn image mounted in `mode` (over the next transport in turn).
    pub fn cairn(mode: &str) -> Target {
        Self::cairn_sized(mode, "512M", &[])
    }

    /// A fresh cairn image of `size` (e.g. "16M") with extra mkfs arguments, mounted in `mode`
    /// over the next transport in turn. Panics with the command's output when cairn cannot
    /// make or mount it.
    pub fn cairn_sized(mode: &str, size: &str, mkfs_args: &[&str]) -> Target {
        Self::cairn_via(mode, &next_transport(), size, mkfs_args)
    }

    /// A fresh cairn image of `size` mounted in `mode` over `transport` (`dev`, `uring`).
    pub fn cairn_via(mode: &str, transport: &str, size: &str, mkfs_args: &[&str]) -> Target {
        Self::cairn_with(mode, transport, size, mkfs_args, "")
    }

    /// [`Target::cairn_via`] with more mount options (`-o`, comma-separated).
    pub fn cairn_with(
        mode: &str,
        transport: &str,
        size: &str,
        mkfs_args: &[&str],
        options: &str,
    ) -> Target {
        if mode == UMBRELLA {
            return Self::umbrella_via(transport, size);
        }
        let bin = cairn_bin();
        let d = open_tempdir("cairn-fs-");
        let image = d.path().join("image");
        let root = d.path().join("mnt");
        fs::create_dir(&root).unwrap();
        // Each mode's image is made in the mode's own format (`type` in `cairn modes
        // --json`).
        let o = run(Command::new(&bin)
            .arg("mkfs")
            .arg(&image)
            .args(["--size", size])
            .args(["--format", &format_of(mode)])
            .args(mkfs_args));
        assert!(
            o.status.success(),
            "`cairn mkfs {} --size {size}` failed — cairn is not usable yet (set CAIRN_TEST_HOST_ONLY=1 to \
             validate the suites on the host only):\n{}",
            image.display(),
            show(&o)
        );
        let mut t = Target {
            kind: Kind::Cairn {
                bin,
                mode: mode.to_string(),
                transport: transport.to_string(),
                options: options.to_string(),
                image,
                mounted: false,
            },
            root,
            _dir: d,
        };
        t.mount();
        t
    }

    /// The targets a suite runs on: host only with `CAIRN_TEST_HOST_ONLY=1`, otherwise one
    /// cairn mount per mode of [`modes`] and transport of [`transports`].
    pub fn all() -> Vec<Target> {
        if host_only() {
            vec![Target::host_dir()]
        } else {
            Self::all_sized("512M")
        }
    }

    /// For the slowest suites: like [`Target::all`] but every mode over one transport,
    /// taken in turn from [`transports`] (the first mode over the first one, and so on, the
    /// turn going on from call to call), so both transports are covered without doubling
    /// the suite's time.
    pub fn all_once() -> Vec<Target> {
        if host_only() {
            vec![Target::host_dir()]
        } else {
            modes()
                .iter()
                .map(|m| Target::cairn_via(m, &next_transport(), "512M", &[]))
                .collect()
        }
    }

    fn all_sized(size: &str) -> Vec<Target> {
        let mut v = Vec::new();
        for m in modes() {
            for t in transports() {
                v.push(Target::cairn_via(&m, &t, size, &[]));
            }
        }
        v
    }

    /// Like [`Target::all`] but small file systems of `size` bytes-with-unit ("16M"), used to
    /// run out of space: tmpfs on the host.
    pub fn all_small(size: &str, host_inodes: Option<u64>) -> Vec<Target> {
        if host_only() {
            vec![Target::host_tmpfs(size, host_inodes)]
        } else {
            Self::all_sized(size)
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `root/rel`.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.root.join(rel)
    }

    /// "host", "tmpfs" or "cairn:<mode>".
    pub fn name(&self) -> String {
        match &self.kind {
            Kind::Host { tmpfs: false } => "host".into(),
            Kind::Host { tmpfs: true } => "tmpfs".into(),
            Kind::Cairn {
                mode, transport, ..
            } => format!("cairn:{mode}+{transport}"),
        }
    }

    pub fn is_cairn(&self) -> bool {
        matches!(self.kind, Kind::Cairn { .. })
    }

    pub fn mode(&self) -> Option<&str> {
        match &self.kind {
            Kind::Cairn { mode, .. } => Some(mode),
            Kind::Host { .. } => None,
        }
    }

    /// The image file of a cairn target.
    pub fn image(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Cairn { image, .. } => Some(image),
            Kind::Host { .. } => None,
        }
    }

    /// Mounts a cairn target (no-op on the host).
    pub fn mount(&mut self) {
        let root = self.root.clone();
        if let Kind::Cairn {
            bin,
            mode,
            transport,
            options,
            image,
            mounted,
        } = &mut self.kind
        {
            if *mounted {
                return;
            }
            // CAIRN_MOUNT_OPTS comes last, so it can override the transport too.
            let mut extra = format!("transport={transport}");
            if !options.is_empty() {
                extra.push(',');
                extra.push_str(options);
            }
            let more = std::env::var("CAIRN_MOUNT_OPTS").unwrap_or_default();
            if !more.is_empty() {
                extra.push(',');
                extra.push_str(&more);
            }
            let opts = format!("mode={mode},{extra}");
            // The kernel parameter must stay as it is until INIT is done.
            let lock = (transport == "uring").then(|| uring_parameter_lock(false));
            let o = if mode == UMBRELLA {
                // `image` is the umbrella configuration file.
                let mut c = Command::new(&*bin);
                c.arg("umbrella");
                c.args(["-o", &extra]);
                run(c.arg(&*image).arg(&root))
            } else {
                run(Command::new(&*bin)
                    .args(["mount", "-o", &opts])
                    .arg(&*image)
                    .arg(&root))
            };
            assert!(
                o.status.success(),
                "`cairn mount -o {opts} {} {}` failed:\n{}",
                image.display(),
                root.display(),
                show(&o)
            );
            drop(lock);
            *mounted = true;
            assert!(
                is_mountpoint(&root),
                "cairn mount returned but {} is not a mount point",
                root.display()
            );
            // A mount asked for io_uring falls back to /dev/fuse where the kernel refuses:
            // a suite meant to run over io_uring must not pass over the other transport.
            if transport == "uring" {
                let o = run(Command::new(&*bin).args(["stats", "--json"]).arg(&root));
                let stats = String::from_utf8_lossy(&o.stdout);
                assert!(
                    stats.contains("\"active\":\"uring\""),
                    "{} asked for transport=uring but is not served over io_uring:\n{}",
                    root.display(),
                    show(&o)
                );
            }
        }
    }

    /// Unmounts a cairn target cleanly (`cairn umount` waits for the daemon to exit).
    pub fn unmount(&mut self) {
        let root = self.root.clone();
        if let Kind::Cairn { bin, mounted, .. } = &mut self.kind {
            if !*mounted {
                return;
            }
            let o = run(Command::new(&*bin).arg("umount").arg(&root));
            *mounted = false;
            assert!(
                o.status.success(),
                "`cairn umount {}` failed:\n{}",
                root.display(),
                show(&o)
            );
            assert!(
                !is_mountpoint(&root),
                "cairn umount returned but {} is still mounted",
                root.display()
            );
        }
    }

    /// Unmounts and mounts again (no-op on the host).
    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// Runs `cairn fsck IMAGE [args]` on the unmounted image. Host targets report clean.
    pub fn fsck(&self, args: &[&str]) -> Fsck {
        match &self.kind {
            Kind::Host { .. } => Fsck {
                code: 0,
                output: "(host directory: no fsck)".into(),
            },
            Kind::Cairn { mode, .. } if mode == UMBRELLA => Fsck {
                code: 0,
                output: "(umbrella over host directories: no fsck)".into(),
            },
            Kind::Cairn {
                bin,
                image,
                mounted,
                ..
            } => {
                assert!(!*mounted, "fsck on a mounted image");
                let o = run(Command::new(bin).arg("fsck").args(args).arg(image));
                let output = format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                Fsck {
                    code: o.status.code().unwrap_or(-1),
                    output,
                }
            }
        }
    }

    /// Unmounts, asserts `cairn fsck` exits 0 and mounts again (a no-op on the host).
    pub fn assert_fsck_clean_and_remount(&mut self, what: &str) {
        if !self.is_cairn() {
            return;
        }
        self.unmount();
        let f = self.fsck(&[]);
        say!("{}: fsck after {what}: exit {}", self.name(), f.code);
        assert_eq!(
            f.code,
            0,
            "{}: fsck after {what} is not clean:\n{}",
            self.name(),
            f.output
        );
        self.mount();
    }

    /// The pid of the daemon serving a mounted cairn target: from `/run/cairn/*.pid` (the
    /// file whose process names our image or mount point), else by scanning /proc.
    pub fn daemon_pid(&self) -> Option<i32> {
        let image = self.image()?.as_os_str().as_bytes().to_vec();
        let mnt = self.root.as_os_str().as_bytes().to_vec();
        let names_us = |pid: i32| -> bool {
            let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            args.iter()
                .any(|a| *a == image.as_slice() || *a == mnt.as_slice())
                && args
                    .iter()
                    .any(|a| a.ends_with(b"cairn") || a.ends_with(b"mount.cairn"))
        };
        if let Ok(rd) = fs::read_dir("/run/cairn") {
            for e in rd.flatten() {
                // The record's first line is the pid (the rest name the image and mount).
                let pid = fs::read_to_string(e.path())
                    .ok()
                    .and_then(|s| s.lines().next()?.trim().parse::<i32>().ok());
                if let Some(pid) = pid.filter(|&p| names_us(p)) {
                    return Some(pid);
                }
            }
        }
        let me = std::process::id() as i32;
        fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| pid != me)
            .find(|&pid| names_us(pid))
    }

    /// Kills the daemon with SIGKILL and detaches the dead mount (`fusermount3 -u -z`, then
    /// `umount -l`). Afterwards the target counts as unmounted.
    pub fn kill_daemon(&mut self) -> i32 {
        let pid = self
            .daemon_pid()
            .unwrap_or_else(|| panic!("{}: cannot find the daemon pid", self.name()));
        say!("{}: SIGKILL to daemon pid {pid}", self.name());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill -9 daemon");
        wait_gone(pid as u32, Duration::from_secs(10));
        let root = self.root.clone();
        let o = run(Command::new("fusermount3").args(["-u", "-z"]).arg(&root));
        if !o.status.success() {
            let _ = run(Command::new("umount").arg("-l").arg(&root));
        }
        if let Kind::Cairn { mounted, .. } = &mut self.kind {
            *mounted = false;
        }
        pid
    }

    /// statvfs of the root.
    pub fn statfs(&self) -> nix::sys::statvfs::Statvfs {
        nix::sys::statvfs::statvfs(&self.root).expect("statvfs")
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        match &mut self.kind {
            Kind::Host { tmpfs: true } => {
                let _ = Command::new("umount").arg(&self.root).output();
            }
            Kind::Host { tmpfs: false } => {}
            Kind::Cairn { bin, mounted, .. } => {
                if *mounted {
                    let ok = Command::new(&*bin)
                        .arg("umount")
                        .arg(&self.root)
                        .output()
                        .is_ok_and(|o| o.status.success());
                    if !ok {
                        let _ = Command::new("fusermount3")
                            .args(["-u", "-z"])
                            .arg(&self.root)
                            .output();
                        let _ = Command::new("umount").arg("-l").arg(&self.root).output();
                    }
                }
                // Branches of an umbrella target may be small tmpfs mounts.
                umount_below(self._dir.path());
            }
        }
    }
}

/// The mode name that makes a cairn target an umbrella mount (`CAIRN_TEST_MODES=umbrella`):
/// three branch directories under rules that move files often (by size, by permissions,
/// by path), so the suites also exercise migration.
pub const UMBRELLA: &str = "umbrella";

/// The umbrella configuration of the test targets (branches b1, b2, b3).
pub const UMBRELLA_CONFIG: &str = r#"
[umbrella]
errors = "or"
default = ["b1", "b2", "b3"]

[[branch]]
name = "b1"
path = "b1"
[[branch]]
name = "b2"
path = "b2"
[[branch]]
name = "b3"
path = "b3"

[[rule]]
name = "larger than 4K"
size = "> 4K"
branches = ["b2", "b3", "b1"]

[[rule]]
name = "read-only"
access = "read-only"
branches = ["b3", "b1", "b2"]

[[rule]]
name = "paths"
namespace = [
  { match = "/*/sub*", branches = ["b3", "b2", "b1"] },
  { match = "/*.dat", branches = ["b2", "b1", "b3"] },
]
"#;

impl Target {
    /// An umbrella mount over three branch directories. Sizes below 256M make each branch
    /// a tmpfs of a third of `size` (so ENOSPC tests fill the union); larger ones use
    /// plain directories on the host file system.
    pub fn umbrella_sized(size: &str) -> Target {
        Self::umbrella_via(&next_transport(), size)
    }

    /// [`Target::umbrella_sized`] over `transport`.
    pub fn umbrella_via(transport: &str, size: &str) -> Target {
        let bin = cairn_bin();
        let d = open_tempdir("cairn-umbrella-");
        let root = d.path().join("mnt");
        fs::create_dir(&root).unwrap();
        let bytes = parse_size(size).unwrap_or(512 << 20);
        for b in ["b1", "b2", "b3"] {
            let p = d.path().join(b);
            fs::create_dir(&p).unwrap();
            if bytes < (256 << 20) {
                let each = (bytes / 3 / 4096 * 4096).max(1 << 20);
                let o = run(Command::new("mount")
                    .args([
                        "-t",
                        "tmpfs",
                        "-o",
                        &format!("size={each},nr_inodes=2000,mode=0755"),
                        "tmpfs",
                    ])
                    .arg(&p));
                assert!(
                    o.status.success(),
                    "mounting a tmpfs branch failed: {}",
                    show(&o)
                );
            }
        }
        let config = d.path().join("umbrella.toml");
        fs::write(&config, UMBRELLA_CONFIG).unwrap();
        let mut t = Target {
            kind: Kind::Cairn {
                bin,
                mode: UMBRELLA.to_string(),
                transport: transport.to_string(),
                options: String::new(),
                image: config,
                mounted: false,
            },
            root,
            _dir: d,
        };
        t.mount();
        t
    }

    /// For an umbrella target: the branch directories.
    pub fn umbrella_branches(&self) -> Vec<PathBuf> {
        ["b1", "b2", "b3"]
            .iter()
            .map(|b| self._dir.path().join(b))
            .collect()
    }
}

fn parse_size(s: &str) -> Option<u64> {
    let (n, m) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<u64>().ok()?.checked_mul(m)
}

/// Lazily unmounts everything mounted below `dir` (deepest first).
fn umount_below(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let want = dir.to_string_lossy().replace(' ', "\\040");
    let mut below: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter(|m| m.starts_with(&*want) && m.len() > want.len())
        .collect();
    below.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in below {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(m.replace("\\040", " "))
            .output();
    }
}

/// True if `p` is a mount point (its device differs from its parent's, or /proc/self/mounts
/// lists it).
pub fn is_mountpoint(p: &Path) -> bool {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let want = p.to_string_lossy().replace(' ', "\\040");
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

/// Maps `io::Result` and `nix::Result` to a plain `Result<T, errno>`.
pub trait Errnoish<T> {
    fn errno_result(self) -> Result<T, i32>;
}

impl<T> Errnoish<T> for io::Result<T> {
    fn errno_result(self) -> Result<T, i32> {
        self.map_err(|e| e.raw_os_error().unwrap_or(-1))
    }
}

impl<T> Errnoish<T> for nix::Result<T> {
    fn errno_result(self) -> Result<T, i32> {
        self.map_err(|e| e as i32)
    }
}

impl<T> Errnoish<T> for Result<T, i32> {
    fn errno_result(self) -> Result<T, i32> {
        self
    }
}

/// The symbolic name of an errno, for messages.
pub fn errno_name(e: i32) -> String {
    if e == 0 {
        return "success".into();
    }
    format!("{:?}", nix::errno::Errno::from_raw(e))
}

/// Asserts that `r` failed with `expected`.
#[track_caller]
pub fn expect_err<T: std::fmt::Debug>(r: impl Errnoish<T>, expected: i32, what: &str) {
    match r.errno_result() {
        Err(e) if e == expected => say!("ok: {what} -> {}", errno_name(e)),
        Err(e) => panic!(
            "{what}: expected {} got {}",
            errno_name(expected),
            errno_name(e)
        ),
        Ok(v) => panic!(
            "{what}: expected {} got success ({v:?})",
            errno_name(expected)
        ),
    }
}

/// Asserts that `r` failed with one of `allowed`.
#[track_caller]
pub fn expect_err_in<T: std::fmt::Debug>(r: impl Errnoish<T>, allowed: &[i32], what: &str) -> i32 {
    let names: Vec<String> = allowed.iter().map(|&e| errno_name(e)).collect();
    match r.errno_result() {
        Err(e) if allowed.contains(&e) => {
            say!("ok: {what} -> {}", errno_name(e));
            e
        }
        Err(e) => panic!("{what}: expected one of {names:?} got {}", errno_name(e)),
        Ok(v) => panic!("{what}: expected one of {names:?} got success ({v:?})"),
    }
}

/// Asserts that `r` succeeded and returns its value.
#[track_caller]
pub fn expect_ok<T>(r: impl Errnoish<T>, what: &str) -> T {
    match r.errno_result() {
        Ok(v) => v,
        Err(e) => panic!("{what}: expected success got {}", errno_name(e)),
    }
}

/// `lstat` as a plain result.
pub fn lstat(p: &Path) -> Result<fs::Metadata, i32> {
    fs::symlink_metadata(p).errno_result()
}

/// Name bytes as an OsString.
pub fn os(b: &[u8]) -> OsString {
    OsStr::from_bytes(b).to_os_string()
}

/// Inode number of a path (lstat).
pub fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()))
        .ino()
}

/// Timestamps of a path (lstat) in nanoseconds: (atime, mtime, ctime).
pub fn times(p: &Path) -> (i128, i128, i128) {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    (
        ns(m.atime(), m.atime_nsec()),
        ns(m.mtime(), m.mtime_nsec()),
        ns(m.ctime(), m.ctime_nsec()),
    )
}

/// Waits (at most `timeout`) until process `pid` — not our child, so no waitpid — is gone
/// or a zombie with no thread left: a zombie group leader is not enough, its other threads
/// may still be closing the image and the pid-file lock.
pub fn wait_gone(pid: u32, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        let zombie =
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
        let alone = fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() <= 1);
        if zombie && alone {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A small deterministic pseudo-random byte pattern (content that differs per offset, so a
/// misplaced block shows up).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A 64-bit FNV-1a digest (stable across builds, unlike `DefaultHasher`).
pub fn fnv64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
