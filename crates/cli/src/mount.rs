//! `cairn mount`: open an image, mount it over FUSE, serve it as a daemon.
//!
//! The command forks before anything else runs (no thread may exist at fork time). The
//! child becomes the daemon: it starts a new session, opens the image, mounts, creates the
//! runtime record and control socket, and only then writes "OK" into a pipe; the parent
//! waits on that pipe and exits 0, so when `cairn mount` returns the mount is live and in
//! /proc/self/mountinfo. Any failure before that point travels up the pipe as one line
//! that the parent prints, exiting 1.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use cairn_fstypes::FsType;
use cairn_fuse::{FuseOptions, Server, Unmounter};
use cairn_vfs::{FileSystem, FsError};
use log::{error, info, warn};
use nix::sys::signal::{SigSet, Signal};
use serde_json::json;

use crate::{control, runtime};

/// `-o record=PATH`: the mount recorded for the crash harness (part of mounting).
mod record;

#[derive(clap::Args, Debug)]
#[command(after_help = crate::mount_help::text())]
pub struct Args {
    /// Mount options, comma-separated (see below)
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Stay in the foreground and log to stderr
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Drop unknown options with a warning instead of failing (mount -s)
    #[arg(long, hide = true)]
    pub sloppy: bool,
    /// Serve an empty in-memory file system instead of an image (a testing aid; IMAGE is
    /// only a label)
    #[arg(long, hide = true)]
    pub memory: bool,
    /// The image file or block device
    pub image: PathBuf,
    /// Where to mount it
    pub mountpoint: PathBuf,
}

/// What `-o` asked of each layer.
#[derive(Debug)]
pub struct Plan {
    /// The image's format (probed before the options are parsed: each format checks its
    /// own options).
    pub fs: &'static FsType,
    /// The format's options (`mode=`, `cache=`, `syncer=`, ...), checked by the format.
    pub fs_options: Vec<(String, Option<String>)>,
    pub read_only: bool,
    pub fuse: FuseOptions,
    pub log: Option<PathBuf>,
    pub record: Option<PathBuf>,
}

impl Plan {
    /// The metadata-update mode asked for, or the format's default.
    pub fn mode(&self) -> String {
        self.fs_options
            .iter()
            .rev()
            .find(|(k, _)| k == "mode")
            .and_then(|(_, v)| v.clone())
            .or_else(|| (self.fs.modes)().first().map(|m| m.name.to_string()))
            .unwrap_or_default()
    }
}

/// Options mount(8) and fstab use that mean nothing to cairn (`cairn mount` and `cairn
/// umbrella mount` both skip them).
pub(crate) fn ignored(key: &str) -> bool {
    matches!(
        key,
        "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "nofail"
            | "_netdev"
            | "comment"
            | "loop"
            | "nodiratime"
            | "diratime"
            | "lazytime"
            | "nolazytime"
            | "silent"
            | "loud"
    ) || key.starts_with("x-")
}

pub fn parse_options(list: &[String], sloppy: bool, fs: &'static FsType) -> Result<Plan> {
    let mut plan = Plan {
        fs,
        fs_options: Vec::new(),
        read_only: false,
        fuse: FuseOptions::default(),
        log: None,
        record: None,
    };
    for item in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        if ignored(key) {
            continue;
        }
        match key {
            "ro" | "rw" => {
                plan.fuse.read_only = key == "ro";
                plan.read_only = key == "ro";
                continue;
            }
            // fstab's generic sync/async flags pick the matching metadata-update mode.
            "sync" | "async" if value.is_none() => {
                plan.fs_options
                    .push(("mode".to_string(), Some(key.to_string())));
                continue;
            }
            "logfile" => {
                plan.log = Some(
                    value
                        .ok_or_else(|| anyhow!("option 'logfile' needs a path"))?
                        .into(),
                );
                continue;
            }
            // The daemon's log used to be `log=PATH`; a mode may now take `log=` itself (a
            // journal's `log=file|dev:PATH`). An absolute path can only be the old meaning.
            "log" if value.is_some_and(|v| v.starts_with('/')) => {
                eprintln!("cairn: mount option 'log=PATH' is deprecated: use 'logfile=PATH'");
                plan.log = value.map(PathBuf::from);
                continue;
            }
            "record" => {
                plan.record = Some(
                    value
                        .ok_or_else(|| anyhow!("option 'record' needs a path"))?
                        .into(),
                );
                continue;
            }
            _ => {}
        }
        if plan.fuse.set(key, value).map_err(|e| anyhow!(e))? {
            continue;
        }
        match (fs.check_option)(key, value) {
            Ok(()) => plan
                .fs_options
                .push((key.to_string(), value.map(str::to_string))),
            Err(e) if sloppy => eprintln!("cairn: ignoring option '{item}': {e}"),
            Err(e) => bail!("{e}"),
        }
    }
    // As a whole: a mode's own options against the mode chosen, in whatever order.
    (fs.check_options)(&plan.fs_options, plan.read_only).map_err(|e| anyhow!(e))?;
    Ok(plan)
}

/// `-o remount,...` (mount(8) passes it to the helper): the mount's flags change in place —
/// read-only or read-write, nosuid, nodev, noexec, noatime — through mount(2) with
/// MS_REMOUNT, which a FUSE superblock accepts (the kernel syncs it first); the daemon and
/// its file system go on as they were. Every other option is ignored, as the kernel's FUSE
/// ignores them on a remount. Shared by `cairn mount` and `cairn umbrella`.
pub(crate) fn remount(mountpoint: &Path, options: &[String]) -> Result<i32> {
    use nix::mount::MsFlags;
    let mp = mountpoint
        .canonicalize()
        .with_context(|| format!("bad mount point {}", mountpoint.display()))?;
    // The flags the mount has now, changed by the options given (MS_REMOUNT sets them all;
    // with no atime flag the kernel picks relatime, so strictatime must be carried over).
    let now = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .rev()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.get(4).is_some_and(|m| Path::new(m) == mp))
        .and_then(|f| f.get(5).map(|o| o.to_string()))
        .unwrap_or_default();
    let mut flags = MsFlags::MS_REMOUNT;
    for o in now
        .split(',')
        .chain(options.iter().flat_map(|s| s.split(',')))
    {
        let (on, f) = match o {
            "ro" => (true, MsFlags::MS_RDONLY),
            "nosuid" => (true, MsFlags::MS_NOSUID),
            "nodev" => (true, MsFlags::MS_NODEV),
            "noexec" => (true, MsFlags::MS_NOEXEC),
            "noatime" => (true, MsFlags::MS_NOATIME),
            "nodiratime" => (true, MsFlags::MS_NODIRATIME),
            "strictatime" => (true, MsFlags::MS_STRICTATIME),
            "atime" => (false, MsFlags::MS_NOATIME),
            "diratime" => (false, MsFlags::MS_NODIRATIME),
            "rw" => (false, MsFlags::MS_RDONLY),
            "suid" => (false, MsFlags::MS_NOSUID),
            "dev" => (false, MsFlags::MS_NODEV),
            "exec" => (false, MsFlags::MS_NOEXEC),
            _ => continue,
        };
        flags.set(f, on);
    }
    let none: Option<&str> = None;
    nix::mount::mount(none, &mp, none, flags, none)
        .with_context(|| format!("cannot remount {}", mountpoint.display()))?;
    Ok(0)
}

/// Is `-o remount` among `options`?
pub(crate) fn is_remount(options: &[String]) -> bool {
    options
        .iter()
        .flat_map(|s| s.split(','))
        .any(|o| o == "remount")
}

pub fn run(args: Args) -> Result<i32> {
    if is_remount(&args.options) {
        return remount(&args.mountpoint, &args.options);
    }
    // The format decides which options exist: find it first (the default one for the
    // in-memory test backend, which has no image).
    let fs = if args.memory {
        cairn_fstypes::types()[0]
    } else {
        cairn_fstypes::probe_path(&args.image).map_err(|e| match e {
            FsError::Refused(_, msg) => anyhow!("cannot mount {msg}"),
            e => anyhow!("cannot mount {}: {e}", args.image.display()),
        })?
    };
    let mut plan = parse_options(&args.options, args.sloppy, fs)?;
    // The daemon works from `/`: resolve relative paths against the caller's directory now.
    for p in [&mut plan.log, &mut plan.record].into_iter().flatten() {
        *p = std::path::absolute(&*p).with_context(|| format!("bad path {}", p.display()))?;
    }
    let shown = args.image.display().to_string();
    let image = if args.memory {
        args.image.clone()
    } else {
        args.image
            .canonicalize()
            .with_context(|| format!("cannot mount {shown}"))?
    };
    let mountpoint = args
        .mountpoint
        .canonicalize()
        .with_context(|| format!("bad mount point {}", args.mountpoint.display()))?;
    if !mountpoint.is_dir() {
        bail!(
            "bad mount point {}: not a directory",
            args.mountpoint.display()
        );
    }
    if plan.fuse.fsname.is_empty() {
        plan.fuse.fsname = image.display().to_string();
    }
    // A second mount point of an image a live daemon serves: the same daemon serves it.
    if !args.memory
        && let Some(daemon) = runtime::serving(&image)
    {
        let asked_mode = plan.fs_options.iter().any(|(k, _)| k == "mode");
        let mode = asked_mode.then(|| plan.mode());
        let second = Second {
            read_only: plan.read_only,
            fuse: &plan.fuse,
            mode: mode.as_deref(),
        };
        second_mount_point(&daemon, &second, &shown, &mountpoint)?;
        return Ok(0);
    }
    let job = Job {
        plan,
        image,
        shown,
        mountpoint,
        memory: args.memory,
    };
    if args.foreground {
        init_log(None);
        let daemon = job.start()?;
        return Ok(daemon.serve());
    }
    daemonize(job)
}

/// Mounts `image`, which the daemon of `daemon` already serves, at `mountpoint` too, as a
/// kernel file system mounts one device at two places: one file system, one cache, one
/// daemon — a bind mount of the daemon's mount, with this mount's own flags (ro, nosuid,
/// nodev, noexec, noatime). Two daemons can never write one image (the image lock refuses
/// the second), and two FUSE connections to one file system would each keep a kernel cache
/// the other's changes never invalidate. Refused when the mode asked for is not the one
/// the daemon runs, or read-write is asked of a read-only mount. Shared by `cairn mount` and
/// `cairn umbrella` (whose "image" is its configuration file).
pub(crate) fn second_mount_point(
    daemon: &runtime::RecordInfo,
    want: &Second<'_>,
    shown: &str,
    mountpoint: &Path,
) -> Result<()> {
    use nix::mount::MsFlags;
    let (Some(first), Some(conn), Some(pid)) = (
        daemon.mountpoint.as_deref(),
        daemon.conn.as_ref(),
        daemon.pid,
    ) else {
        bail!("cannot mount {shown}: its cairn daemon's record is incomplete");
    };
    let stats = control::request(&runtime::paths(first).sock, "stats")
        .with_context(|| format!("cannot mount {shown}: asking its daemon (pid {pid})"))?;
    let mode = stats["daemon"]["mode"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let daemon_ro = stats["daemon"]["read_only"].as_bool().unwrap_or(false);
    let mounts = runtime::fuse_mounts_of(conn);
    if mounts.iter().any(|m| m == mountpoint) {
        bail!(
            "{} is already served by a cairn daemon (pid {pid})",
            mountpoint.display()
        );
    }
    let source = mounts
        .into_iter()
        .next()
        .unwrap_or_else(|| first.to_path_buf());
    let held = format!(
        "{shown} is in use by the cairn mount on {} ({}, pid {pid}) in mode {mode}",
        source.display(),
        if daemon_ro { "read-only" } else { "read-write" }
    );
    if want.mode.is_some_and(|m| m != mode) {
        bail!(
            "{held}: a second mount point of it is served by the same daemon, in its mode \
             (-o mode={mode})"
        );
    }
    if daemon_ro && !want.read_only {
        bail!("{held}: a second mount point of it can only be read-only too (-o ro)");
    }
    let none: Option<&str> = None;
    bind_as_a_new_mount(&source, mountpoint)
        .with_context(|| format!("cannot mount {shown} on {}", mountpoint.display()))?;
    let o = want.fuse;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND;
    for (on, f) in [
        (want.read_only, MsFlags::MS_RDONLY),
        (!o.suid, MsFlags::MS_NOSUID),
        (!o.dev, MsFlags::MS_NODEV),
        (!o.exec, MsFlags::MS_NOEXEC),
        (o.noatime, MsFlags::MS_NOATIME),
    ] {
        if on {
            flags |= f;
        }
    }
    if let Err(e) = nix::mount::mount(none, mountpoint, none, flags, none) {
        let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
        bail!("cannot mount {shown} on {}: {e}", mountpoint.display());
    }
    info!(
        "{} is a second mount point of {shown}, served by pid {pid}",
        mountpoint.display()
    );
    Ok(())
}

/// Mounts the file system of mount `source` at `target` as mounting it anew would: a copy
/// of the mount that shares no propagation with `source`. A plain bind mount (MS_BIND) of
/// a shared mount joins its peer group, so every mount made later under the one appears
/// under the other too (generic/409–411 mount the scratch device under its own first
/// mount point, then mounts under each). So: a detached copy (open_tree), made private
/// there (mount_setattr), then attached (move_mount), which gives it a peer group of its
/// own where `target`'s mount is shared, as the kernel does for a new mount. Without the
/// new mount API (Linux before 5.12), a plain bind mount.
fn bind_as_a_new_mount(source: &Path, target: &Path) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    /// `struct mount_attr` (linux/mount.h).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let c =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (src, dst, empty) = (c(source)?, c(target)?, c(Path::new(""))?);
    let ok = |r: libc::c_long| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    #[allow(unsafe_code)]
    // SAFETY: each call gets NUL-terminated strings and a live `MountAttr` of the size it is
    // told; the descriptor open_tree returns is owned by `tree` and nothing else.
    let r = (|| unsafe {
        let fd = ok(libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        ))?;
        let tree = OwnedFd::from_raw_fd(fd as i32);
        let attr = MountAttr {
            attr_set: 0,
            attr_clr: 0,
            propagation: libc::MS_PRIVATE,
            userns_fd: 0,
        };
        ok(libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ))?;
        ok(libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        ))
        .map(drop)
    })();
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            let none: Option<&str> = None;
            nix::mount::mount(
                Some(source),
                target,
                none,
                nix::mount::MsFlags::MS_BIND,
                none,
            )
            .map_err(std::io::Error::from)
        }
        r => r,
    }
}

/// What a second mount point asks for: read-only, its FUSE flags (suid, dev, exec,
/// noatime), and the mode when one was named (it must be the daemon's).
pub(crate) struct Second<'a> {
    pub read_only: bool,
    pub fuse: &'a FuseOptions,
    pub mode: Option<&'a str>,
}

struct Job {
    plan: Plan,
    image: PathBuf,
    /// The image as the user typed it, for messages.
    shown: String,
    mountpoint: PathBuf,
    memory: bool,
}

pub(crate) fn init_log(file: Option<&Path>) {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    b.format_timestamp_millis();
    if let Some(p) = file
        && let Ok(f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
    {
        b.target(env_logger::Target::Pipe(Box::new(f)));
    }
    let _ = b.try_init();
}

fn daemonize(job: Job) -> Result<i32> {
    let log = job.log_path();
    fork_daemon(log, move || job.start(), Daemon::serve)
}

/// Forks; the child detaches, logs to `log`, runs `start` (which mounts) and reports
/// readiness up a pipe, then runs `serve`; the parent returns 0 once the child is ready or
/// prints the child's one-line error and returns 1. Shared by `cairn mount` and
/// `cairn umbrella`. Must be called while the process is single-threaded.
pub(crate) fn fork_daemon<D>(
    log: PathBuf,
    start: impl FnOnce() -> Result<D>,
    serve: impl FnOnce(D) -> i32,
) -> Result<i32> {
    use nix::unistd::{ForkResult, fork};
    let (rd, wr) = nix::unistd::pipe()?;
    #[allow(unsafe_code)]
    // SAFETY: the process is single-threaded here (argument parsing only; the logger is
    // initialised in the child), so the child may run arbitrary code after fork.
    let forked = unsafe { fork() }.context("fork")?;
    match forked {
        ForkResult::Parent { child } => {
            drop(wr);
            let mut answer = String::new();
            let _ = std::fs::File::from(rd).read_to_string(&mut answer);
            if answer.starts_with("OK") {
                return Ok(0);
            }
            let _ = nix::sys::wait::waitpid(child, None);
            match answer.strip_prefix("ERR ") {
                Some(msg) => eprintln!("cairn: {}", msg.trim_end()),
                None => eprintln!(
                    "cairn: the mount daemon exited before the mount was ready (see {})",
                    log.display()
                ),
            }
            Ok(1)
        }
        ForkResult::Child => {
            drop(rd);
            std::process::exit(daemon_main(&log, start, serve, wr));
        }
    }
}

impl Job {
    fn log_path(&self) -> PathBuf {
        self.plan
            .log
            .clone()
            .unwrap_or_else(|| runtime::paths(&self.mountpoint).log)
    }

    /// Mounts and starts the helper threads; the mount is live when this returns.
    fn start(self) -> Result<Daemon> {
        // Signals go to the one thread that waits for them; block them before any thread
        // exists so every later thread inherits the mask.
        let mut signals = SigSet::empty();
        for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            signals.add(s);
        }
        signals.thread_block().context("blocking signals")?;

        let mut record = runtime::Record::claim(&self.mountpoint)?;
        // After a plain `umount` of this image elsewhere, its daemon may still be writing
        // back: wait for it rather than fail on the image lock.
        if !self.memory {
            runtime::wait_for_image(&self.image, !self.plan.read_only)?;
        }
        // Bound before the mount appears, served once it is up (see `control::Listener`).
        let listener = control::Listener::bind(&record.paths.sock)
            .map_err(|e| warn!("no control socket: {e:#}"))
            .ok();
        let mut trace = None;
        let fs: Arc<dyn FileSystem> = if self.memory {
            Arc::new(cairn_fuse::memfs::MemFs::default())
        } else {
            if let Some(path) = &self.plan.record {
                let (ffs, rec) = record::mount_recorded(&self.image, &self.plan, path)?;
                let marked = cairn_crash::RecordingFs::new(ffs, rec.clone());
                trace = Some(rec);
                Arc::new(marked)
            } else {
                (self.plan.fs.mount)(&self.image, &self.plan.fs_options, self.plan.read_only)
                    .map_err(|e| anyhow!("cannot mount {}: {e}", self.shown))?
            }
        };
        let server = match Server::mount(fs.clone(), &self.mountpoint, &self.plan.fuse) {
            Ok(s) => s,
            Err(e) => {
                let _ = fs.destroy();
                bail!(
                    "cannot mount {} on {}: {e}",
                    self.shown,
                    self.mountpoint.display()
                );
            }
        };
        record.write_info(&self.image, &self.mountpoint)?;
        let unmounter = server.unmounter();
        let commands = commands(&self, fs.clone(), &server);
        if let Some(l) = listener
            && let Err(e) = l.serve(commands)
        {
            warn!("no control socket: {e:#}");
        }
        let u = unmounter.clone();
        std::thread::Builder::new()
            .name("cairn-signals".into())
            .spawn(move || signal_loop(signals, u))?;
        let transport = server.counts().transport().map(|t| match t.active {
            "uring" => format!("FUSE over io_uring, {} queues", t.queues),
            _ => format!("{} /dev/fuse threads", self.plan.fuse.threads),
        });
        info!(
            "mounted {} on {} (mode {}, {})",
            self.shown,
            self.mountpoint.display(),
            self.plan.mode(),
            transport.unwrap_or_default()
        );
        Ok(Daemon {
            server,
            record,
            trace,
            mountpoint: self.mountpoint,
        })
    }
}

fn commands(job: &Job, fs: Arc<dyn FileSystem>, server: &Server) -> control::Commands {
    let info = json!({
        "image": job.image.display().to_string(),
        "mountpoint": job.mountpoint.display().to_string(),
        "format": job.plan.fs.name,
        "mode": job.plan.mode(),
        "read_only": job.plan.read_only,
        "fuse_threads": job.plan.fuse.threads,
    });
    let mut c = control::Commands::for_daemon(
        fs.clone(),
        server,
        info,
        "live counters: the file system's, the FUSE requests per opcode, the daemon's",
    );
    c.add_check_background(fs);
    c
}

pub(crate) fn signal_loop(signals: SigSet, unmounter: Unmounter) {
    loop {
        match signals.wait() {
            Ok(Signal::SIGHUP) => info!("SIGHUP ignored"),
            Ok(sig) => {
                info!("{sig}: flushing and unmounting");
                if let Err(e) = unmounter.unmount() {
                    error!("unmount after {sig}: {e}");
                }
            }
            Err(e) => {
                error!("waiting for signals: {e}");
                return;
            }
        }
    }
}

struct Daemon {
    server: Server,
    record: runtime::Record,
    trace: Option<Arc<cairn_crash::Recorder>>,
    mountpoint: PathBuf,
}

impl Daemon {
    /// Serves until unmounted; returns the exit code.
    fn serve(self) -> i32 {
        let Daemon {
            server,
            record,
            trace,
            mountpoint,
        } = self;
        let r = server.run();
        if let Some(t) = trace
            && let Err(e) = t.finish()
        {
            error!("writing the device trace: {e}");
        }
        record.remove();
        match r {
            Ok(()) => {
                info!("{} unmounted; everything flushed", mountpoint.display());
                0
            }
            Err(e) => {
                error!("{}: {e}", mountpoint.display());
                eprintln!("cairn: {}: {e}", mountpoint.display());
                1
            }
        }
    }
}

/// The forked child: becomes the daemon, reports readiness through `ready`.
fn daemon_main<D>(
    log: &Path,
    start: impl FnOnce() -> Result<D>,
    serve: impl FnOnce(D) -> i32,
    ready: OwnedFd,
) -> i32 {
    let mut ready = std::fs::File::from(ready);
    if let Err(e) = detach(log) {
        let _ = writeln!(ready, "ERR cannot daemonize: {e:#}");
        return 1;
    }
    let new_log = !log.exists();
    init_log(Some(log));
    match start() {
        Ok(daemon) => {
            let _ = ready.write_all(b"OK\n");
            drop(ready);
            runtime::prune_logs(&runtime::runtime_dir(), runtime::KEEP_LOGS);
            serve(daemon)
        }
        Err(e) => {
            error!("{e:#}");
            let _ = writeln!(ready, "ERR {}", format!("{e:#}").replace('\n', " "));
            // The caller printed the reason; a log holding only that line is clutter.
            if new_log {
                let _ = std::fs::remove_file(log);
            }
            1
        }
    }
}

/// New session, `/` as the working directory (so the daemon pins no mount), standard
/// streams on /dev/null.
fn detach(log: &Path) -> Result<()> {
    nix::unistd::setsid()?;
    nix::unistd::chdir("/")?;
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    nix::unistd::dup2_stdin(&null)?;
    nix::unistd::dup2_stdout(&null)?;
    nix::unistd::dup2_stderr(&null)?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn plan(s: &str) -> Result<Plan> {
        parse_options(
            &[s.to_string()],
            false,
            cairn_fstypes::by_name("ffs").unwrap(),
        )
    }

    fn opt<'a>(p: &'a Plan, k: &str) -> Option<&'a str> {
        p.fs_options
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| v.as_deref())
    }

    /// The kernel's atime options (mount(8), fstab, fstests' remounts: generic/003 cycles
    /// relatime, nodiratime, noatime, strictatime) are accepted by `cairn mount`.
    pub(crate) const ATIME_OPTIONS: &str = "atime,noatime,relatime,strictatime,norelatime,nostrictatime,diratime,nodiratime,lazytime,nolazytime";

    #[test]
    fn the_kernels_atime_options_are_accepted() {
        for o in ATIME_OPTIONS.split(',') {
            assert!(plan(o).is_ok(), "cairn mount -o {o} refused");
        }
        assert_eq!(
            plan("nodiratime,noatime").unwrap().fuse.atime,
            cairn_vfs::Atime::Never
        );
        assert_eq!(
            plan("noatime,strictatime").unwrap().fuse.atime,
            cairn_vfs::Atime::Strict
        );
    }

    #[test]
    fn options_go_to_the_right_layer() {
        let p = plan(
            "mode=async,cache=64M,threads=3,ro,noexec,defaults,noauto,_netdev,x-systemd.foo=1",
        )
        .unwrap();
        assert_eq!(p.mode(), "async");
        assert_eq!(opt(&p, "cache"), Some("64M"));
        assert!(p.read_only && p.fuse.read_only);
        assert_eq!(p.fuse.threads, 3);
        assert!(!p.fuse.exec);
        let p = plan("sync,logfile=/tmp/x.log,record=/tmp/t").unwrap();
        assert_eq!(p.mode(), "sync");
        assert_eq!(p.log.as_deref(), Some(Path::new("/tmp/x.log")));
        // The old spelling, with an absolute path, still names the daemon's log.
        let p = plan("log=/tmp/y.log").unwrap();
        assert_eq!(p.log.as_deref(), Some(Path::new("/tmp/y.log")));
        // Anything else after log= is a mode's option (none of this build's modes has one).
        let e = plan("log=file").unwrap_err().to_string();
        assert!(e.contains("log"), "{e}");
        assert!(plan("async").unwrap().mode() == "async");
        // Without mode=, the format's default.
        assert_eq!(plan("ro").unwrap().mode(), "sync");
    }

    #[test]
    fn unknown_options_fail_unless_sloppy() {
        let e = plan("frobnicate").unwrap_err().to_string();
        assert!(e.contains("frobnicate"), "{e}");
        assert!(plan("mode=turbo").is_err());
        assert!(plan("cache=lots").is_err());
        assert!(plan("threads=0").is_err());
        let ffs = cairn_fstypes::by_name("ffs").unwrap();
        assert!(
            parse_options(&["frobnicate,mode=async".into()], true, ffs)
                .unwrap()
                .mode()
                == "async"
        );
    }
}
