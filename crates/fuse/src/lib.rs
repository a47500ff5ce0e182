//! cairn-fuse: serves any [`cairn_vfs::FileSystem`] through the Linux FUSE kernel module.
//!
//! This is the only crate that imports the FUSE binding (fuser). The file systems know
//! nothing of FUSE; this crate maps the kernel's requests onto the vfs contract, every vfs
//! error onto its errno, and turns on the kernel features that cut round trips: entry,
//! attribute and negative-entry caching with the TTLs the file system's
//! [`cairn_vfs::KernelCachePolicy`] allows, the writeback cache when the policy allows it,
//! 1 MiB writes, readdirplus, parallel directory operations, cached symlinks and listings.
//!
//! Two transports carry the requests (`-o transport=`, see [`Transport`]): the binding's
//! threads reading /dev/fuse, and FUSE over io_uring ([`uring`](crate) module), which
//! serves each request on the CPU that issued it with one system call per round trip.
//! Both feed the same handlers (`adapter`), so every file system runs over either unchanged.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # fn demo(fs: Arc<dyn cairn_vfs::FileSystem>) -> std::io::Result<()> {
//! let opts = cairn_fuse::FuseOptions { fsname: "disk.img".into(), ..Default::default() };
//! cairn_fuse::serve(fs, std::path::Path::new("/mnt"), &opts)?; // until unmounted
//! # Ok(()) }
//! ```

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use cairn_vfs::FileSystem;
use cairn_vfs::options::OptionSpec;

mod adapter;
mod counters;
mod dev;
pub mod memfs;
mod mount;
mod reply;
mod uring;

pub use counters::{Op, RequestCounts, TransportReport};
pub use mount::Unmounter;

use adapter::{Adapter, DestroyResult};
use dev::DevFs;
use uring::{Handoff, Offer};

/// How requests travel between the kernel and the daemon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// io_uring when the kernel offers it (`enable_uring` module parameter on, Linux 6.14+)
    /// and it can be set up, otherwise /dev/fuse, saying why in the log.
    #[default]
    Auto,
    /// io_uring, asked for by name: where the kernel refuses it the mount still comes up
    /// over /dev/fuse (a file system that does not mount is worse than a slower one), but
    /// the one log line saying why is a warning, and [`RequestCounts::transport`] (`cairn
    /// stats`) shows `active: dev`, so whoever measures or depends on io_uring can check
    /// what they got rather than be silently given the other transport.
    Uring,
    /// The /dev/fuse threads (`threads=N`).
    Dev,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Uring => "uring",
            Transport::Dev => "dev",
        }
    }
}

/// The kernel switch for FUSE over io_uring (`echo Y > ` it, as root, to enable).
pub const URING_PARAMETER: &str = uring::ENABLE_PARAM;

/// When the kernel should use READDIRPLUS (entries with attributes, counted as lookups)
/// instead of READDIR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaddirPlus {
    Off,
    /// Every listing.
    Always,
    /// The kernel's heuristic: plus for the first listing and when the entries get looked
    /// up (`ls -l`), plain otherwise.
    Auto,
}

/// How to mount. The defaults are what `cairn mount` uses.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// The mount's source in /proc/self/mountinfo (the image path).
    pub fsname: String,
    /// The mount type becomes `fuse.<subtype>`.
    pub subtype: String,
    /// How requests travel (`transport=auto|uring|dev`).
    pub transport: Transport,
    /// io_uring ring entries per queue (`uring_depth=N`, 1 to 16), each served by a thread
    /// of its own: how many requests issued on one CPU the server works on at once.
    pub uring_depth: usize,
    /// Threads reading /dev/fuse, each with its own descriptor when `clone_fd`. With the
    /// io_uring transport they serve only forgets and interrupts.
    pub threads: usize,
    pub clone_fd: bool,
    /// Let users other than the mounter in (the permission checks still apply).
    pub allow_other: bool,
    /// Let the kernel check permissions from the attributes too, saving ACCESS requests.
    pub default_permissions: bool,
    pub read_only: bool,
    pub suid: bool,
    pub dev: bool,
    pub exec: bool,
    pub noatime: bool,
    /// When the file system updates access times (`relatime`, `strictatime`, `noatime`).
    pub atime: cairn_vfs::Atime,
    /// Largest WRITE (and readahead) the kernel may send, in bytes.
    pub max_write: u32,
    /// The kernel's writeback cache: `None` as the file system's policy has it by default,
    /// `Some(true)` asked for (refused where the policy never allows it), `Some(false)` off.
    pub writeback_cache: Option<bool>,
    pub readdirplus: ReaddirPlus,
    /// Pass O_TRUNC to open instead of a separate SETATTR (the vfs contract's `open`
    /// handles O_TRUNC).
    pub atomic_o_trunc: bool,
    /// Let the kernel read and write host files directly (FUSE passthrough, Linux 6.9+,
    /// needs CAP_SYS_ADMIN) when the file system offers a backing descriptor for an open.
    /// Unavailable with the writeback cache: the kernel grants one or the other.
    pub passthrough: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            fsname: String::new(),
            subtype: "cairn".into(),
            transport: Transport::Auto,
            uring_depth: uring::DEFAULT_DEPTH,
            threads: 2,
            clone_fd: true,
            allow_other: true,
            default_permissions: true,
            read_only: false,
            suid: false,
            dev: false,
            exec: true,
            noatime: false,
            atime: cairn_vfs::Atime::Relative,
            max_write: 1 << 20,
            writeback_cache: None,
            readdirplus: ReaddirPlus::Auto,
            atomic_o_trunc: true,
            passthrough: true,
        }
    }
}

/// The FUSE adapter's mount options, as `cairn help mount` shows them; [`FuseOptions::set`]
/// parses each (a test holds the two together, defaults included).
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        key: "transport",
        values: "auto|uring|dev",
        default: "auto",
        help: "how FUSE requests travel: uring is FUSE over io_uring (one queue per CPU, Linux 6.14+ with /sys/module/fuse/parameters/enable_uring = Y), dev the /dev/fuse threads; auto takes io_uring when the kernel offers it, and where it does not the log says why (`cairn stats` shows fuse.transport.active)",
    },
    OptionSpec {
        key: "uring_depth",
        values: "N",
        default: "2",
        help: "io_uring ring entries (and serving threads) per queue, 1 to 16: how many requests issued on one CPU are served at once",
    },
    OptionSpec {
        key: "threads",
        values: "N",
        default: "2",
        help: "/dev/fuse request threads, 1 to 64 (with io_uring they serve only forgets and interrupts)",
    },
    OptionSpec {
        key: "clone_fd",
        values: "yes|no",
        default: "yes",
        help: "each /dev/fuse thread reads its own descriptor",
    },
    OptionSpec {
        key: "allow_other",
        values: "yes|no",
        default: "yes",
        help: "let users other than the mounter in (permission checks still apply); noallow_other turns it off",
    },
    OptionSpec {
        key: "default_permissions",
        values: "yes|no",
        default: "yes",
        help: "the kernel checks permissions from the attributes too, saving ACCESS requests; nodefault_permissions turns it off",
    },
    OptionSpec {
        key: "writeback_cache",
        values: "yes|no",
        default: "",
        help: "off unless asked for, and refused in modes that make every call durable on return: the kernel's page cache buffers write(2), so small writes are faster, but a write that finds the disk full fails at fsync or close instead of at write(2) (docs/FUSE.md)",
    },
    OptionSpec {
        key: "readdirplus",
        values: "auto|yes|no",
        default: "auto",
        help: "READDIRPLUS: attributes with directory entries",
    },
    OptionSpec {
        key: "max_write",
        values: "SIZE",
        default: "1M",
        help: "largest WRITE (and read-ahead) the kernel may send, 4K to 16M",
    },
    OptionSpec {
        key: "atomic_o_trunc",
        values: "yes|no",
        default: "yes",
        help: "O_TRUNC travels with OPEN instead of a separate SETATTR",
    },
    OptionSpec {
        key: "passthrough",
        values: "yes|no",
        default: "yes",
        help: "let the kernel do the I/O of a file the file system hands over (FUSE passthrough; the umbrella layer does for files that cannot overflow, ffs and lfs never do)",
    },
    OptionSpec {
        key: "suid",
        values: "",
        default: "",
        help: "honour set-user-ID bits (nosuid, the default, ignores them)",
    },
    OptionSpec {
        key: "dev",
        values: "",
        default: "",
        help: "honour device files (nodev, the default, refuses them)",
    },
    OptionSpec {
        key: "noexec",
        values: "",
        default: "",
        help: "refuse to execute files (exec, the default, allows it)",
    },
    OptionSpec {
        key: "noatime",
        values: "",
        default: "",
        help: "never update access times (relatime, the default, updates them once a day or after a change; strictatime on every read)",
    },
    OptionSpec {
        key: "fsname",
        values: "NAME",
        default: "",
        help: "the source shown in /proc/mounts (by default the image's path)",
    },
    OptionSpec {
        key: "subtype",
        values: "NAME",
        default: "cairn",
        help: "the type shown as fuse.NAME",
    },
];

impl FuseOptions {
    /// Applies one `-o key[=value]` option if it belongs to the FUSE layer; `Ok(false)`
    /// means the key is not ours (pass it on to the file system). `ro`/`rw` are not taken
    /// here: both layers need them, so the caller sets [`FuseOptions::read_only`] itself.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<bool, String> {
        let flag = |v: Option<&str>| -> Result<bool, String> {
            match v {
                None | Some("1") | Some("yes") | Some("on") | Some("true") => Ok(true),
                Some("0") | Some("no") | Some("off") | Some("false") => Ok(false),
                Some(o) => Err(format!("option '{key}' takes yes or no, not '{o}'")),
            }
        };
        fn need<'v>(key: &str, v: Option<&'v str>) -> Result<&'v str, String> {
            v.ok_or_else(|| format!("option '{key}' needs a value"))
        }
        match key {
            "threads" => {
                let n: usize = need(key, value)?
                    .parse()
                    .map_err(|_| format!("bad thread count '{}'", value.unwrap_or("")))?;
                if !(1..=64).contains(&n) {
                    return Err("threads must be between 1 and 64".into());
                }
                self.threads = n;
            }
            "transport" => {
                self.transport = match need(key, value)? {
                    "auto" => Transport::Auto,
                    "uring" | "io_uring" => Transport::Uring,
                    "dev" => Transport::Dev,
                    v => return Err(format!("transport takes auto, uring or dev, not '{v}'")),
                }
            }
            "uring_depth" => {
                let v = need(key, value)?;
                let n: usize = v.parse().map_err(|_| format!("bad uring_depth '{v}'"))?;
                if !(1..=uring::MAX_DEPTH).contains(&n) {
                    return Err(format!(
                        "uring_depth must be between 1 and {}",
                        uring::MAX_DEPTH
                    ));
                }
                self.uring_depth = n;
            }
            "clone_fd" => self.clone_fd = flag(value)?,
            "allow_other" => self.allow_other = flag(value)?,
            "noallow_other" => self.allow_other = false,
            "default_permissions" => self.default_permissions = flag(value)?,
            "nodefault_permissions" => self.default_permissions = false,
            "fsname" => self.fsname = need(key, value)?.to_string(),
            "subtype" => self.subtype = need(key, value)?.to_string(),
            "suid" => self.suid = true,
            "nosuid" => self.suid = false,
            "dev" => self.dev = true,
            "nodev" => self.dev = false,
            "exec" => self.exec = true,
            "noexec" => self.exec = false,
            "noatime" => {
                self.noatime = true;
                self.atime = cairn_vfs::Atime::Never;
            }
            // norelatime and nostrictatime: the kernel's default, which is relatime.
            "atime" | "relatime" | "norelatime" | "nostrictatime" => {
                self.noatime = false;
                self.atime = cairn_vfs::Atime::Relative;
            }
            "strictatime" => {
                self.noatime = false;
                self.atime = cairn_vfs::Atime::Strict;
            }
            "max_write" => {
                let v = need(key, value)?;
                let n = cairn_vfs::parse_size(v).map_err(|e| format!("max_write: {e}"))?;
                if !(4096..=(16 << 20)).contains(&n) {
                    return Err("max_write must be between 4K and 16M".into());
                }
                self.max_write = n as u32;
            }
            "writeback_cache" | "writeback" => self.writeback_cache = Some(flag(value)?),
            "no_writeback_cache" => self.writeback_cache = Some(false),
            "readdirplus" => {
                self.readdirplus = match value.unwrap_or("auto") {
                    "auto" => ReaddirPlus::Auto,
                    "yes" | "on" | "always" => ReaddirPlus::Always,
                    "no" | "off" => ReaddirPlus::Off,
                    v => return Err(format!("readdirplus takes auto, yes or no, not '{v}'")),
                }
            }
            "atomic_o_trunc" => self.atomic_o_trunc = flag(value)?,
            "passthrough" => self.passthrough = flag(value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A mounted file system whose requests are not being served yet. Mounting and serving are
/// separate steps so a daemon can report "ready" (the mount is in the namespace and the
/// kernel handshake is done) before it blocks in [`Server::run`].
pub struct Server {
    session: fuser::Session<DevFs>,
    unmounter: Unmounter,
    counts: Arc<RequestCounts>,
    destroyed: DestroyResult,
    mountpoint: PathBuf,
    handoff: Arc<Handoff>,
}

impl Server {
    /// Mounts `fs` at `mountpoint`, completes the FUSE handshake and settles the transport
    /// (logged, and reported by [`RequestCounts::transport`]).
    pub fn mount(
        fs: Arc<dyn FileSystem>,
        mountpoint: &Path,
        opts: &FuseOptions,
    ) -> io::Result<Server> {
        if fs
            .cache_policy()
            .writeback_cache
            .decide(opts.writeback_cache)
            .is_none()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "writeback_cache=yes: this mode makes every write reach the file system before \
                 write(2) returns (each call durable on return, or a layer that acts on a \
                 write's ENOSPC); leave the option out, or use a mode whose calls are durable \
                 on fsync (`cairn modes`)",
            ));
        }
        let counts = Arc::new(RequestCounts::default());
        let destroyed = DestroyResult::default();
        let adapter = Arc::new(Adapter::new(
            fs,
            counts.clone(),
            opts.clone(),
            destroyed.clone(),
        ));
        let handoff = Arc::new(Handoff::default());
        let devfs = DevFs {
            a: adapter.clone(),
            handoff: handoff.clone(),
        };
        let mut config = fuser::Config::default();
        config.n_threads = Some(opts.threads.max(1));
        config.clone_fd = opts.clone_fd;
        config.acl = if opts.allow_other {
            fuser::SessionACL::All
        } else {
            fuser::SessionACL::Owner
        };
        let mountpoint = std::path::absolute(mountpoint)?;

        let (session, unmounter) = match mount::mount_direct(&mountpoint, opts)? {
            Some(dev) => {
                let unmounter = Unmounter::direct(mountpoint.clone(), dev.try_clone()?);
                match fuser::Session::from_fd(devfs, OwnedFd::from(dev), config.acl, config) {
                    Ok(s) => (s, unmounter),
                    Err(e) => {
                        // Do not leave a mount behind that nobody serves.
                        let _ = nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH);
                        return Err(e);
                    }
                }
            }
            None => {
                config.mount_options = fuser_mount_options(opts);
                let mut s = fuser::Session::new(devfs, &mountpoint, &config)?;
                let u = Unmounter::fuser(s.unmount_callable());
                (s, u)
            }
        };
        adapter.set_notifier(session.notifier());
        let report = match start_transport(&session, &adapter, &handoff, opts) {
            Ok(r) => r,
            Err(e) => {
                let _ = unmounter.unmount();
                // The kernel may still hold entries of queues that registered: stop them
                // rather than wait for a connection that dies only once we let go of it.
                if let Some(p) = handoff.take_pool() {
                    p.stop();
                }
                return Err(e);
            }
        };
        if report.requested == "uring" && report.active != "uring" {
            log::warn!("{}", report.line());
        } else {
            log::info!("{}", report.line());
        }
        counts.set_transport(report);
        let bdi = bdi_of(&mountpoint);
        if let Some(bdi) = &bdi {
            raise_read_ahead(bdi, opts.max_write);
        }
        if !opts.read_only {
            limit_dirty(bdi.as_deref(), &*adapter.fs, &counts);
        }
        adapter.fs.set_atime(opts.atime);
        Ok(Server {
            session,
            unmounter,
            counts,
            destroyed,
            mountpoint,
            handoff,
        })
    }

    /// A handle that unmounts from another thread or a signal-handling thread.
    pub fn unmounter(&self) -> Unmounter {
        self.unmounter.clone()
    }

    /// The live request counters.
    pub fn counts(&self) -> Arc<RequestCounts> {
        self.counts.clone()
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Serves requests until the file system is unmounted, then calls the file system's
    /// `destroy` (its final flush). An error means the session broke or the final flush
    /// failed: then data may not be on the device.
    pub fn run(self) -> io::Result<()> {
        let Server {
            session,
            unmounter,
            destroyed,
            handoff,
            ..
        } = self;
        let served = session.run();
        // If the session ended on an error rather than an unmount, the mount would be left
        // dangling (ENOTCONN for everyone); take it down.
        if served.is_err() {
            let _ = unmounter.unmount();
        }
        // Normally the final flush collected the io_uring queues already; a session that
        // failed before it did leaves them here.
        handoff.finish();
        let flushed = destroyed.lock().take();
        served?;
        match flushed {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(io::Error::other(e)),
            None => Err(io::Error::other(
                "the session ended without the final flush",
            )),
        }
    }
}

/// After INIT: starts the io_uring queues if INIT asked for them, and decides what serves
/// the mount: io_uring when its queues started, else /dev/fuse with the reason (whatever
/// was asked). An error means the mount must not stay.
fn start_transport(
    session: &fuser::Session<DevFs>,
    adapter: &Arc<Adapter>,
    handoff: &Arc<Handoff>,
    opts: &FuseOptions,
) -> io::Result<TransportReport> {
    let mut report = TransportReport {
        requested: opts.transport.name(),
        active: "dev",
        queues: 0,
        depth: 0,
        reason: None,
    };
    let why = match handoff.take_offer() {
        None => {
            if opts.transport == Transport::Dev {
                return Ok(report);
            }
            "INIT did not settle io_uring".to_string()
        }
        Some(Offer::Refused(why)) => why,
        Some(Offer::Prepared(p)) => {
            let (queues, depth) = (p.queues(), p.depth());
            use std::os::fd::AsFd;
            let dev = Arc::new(std::fs::File::from(session.as_fd().try_clone_to_owned()?));
            handoff.set_dev(dev.clone());
            let (pool, started) = p.start(adapter.clone(), dev);
            handoff.set_pool(pool);
            match started {
                Ok(()) => {
                    report.active = "uring";
                    report.queues = queues;
                    report.depth = depth;
                    return Ok(report);
                }
                Err(why) => why,
            }
        }
    };
    report.reason = Some(if opts.transport == Transport::Uring {
        format!("transport=uring, but FUSE over io_uring is unavailable: {why}")
    } else {
        why
    });
    Ok(report)
}

fn fuser_mount_options(opts: &FuseOptions) -> Vec<fuser::MountOption> {
    use fuser::MountOption as M;
    let mut v = vec![M::FSName(if opts.fsname.is_empty() {
        "cairn".into()
    } else {
        opts.fsname.clone()
    })];
    if !opts.subtype.is_empty() {
        v.push(M::Subtype(opts.subtype.clone()));
    }
    if opts.default_permissions {
        v.push(M::DefaultPermissions);
    }
    v.push(if opts.read_only { M::RO } else { M::RW });
    v.push(if opts.suid { M::Suid } else { M::NoSuid });
    v.push(if opts.dev { M::Dev } else { M::NoDev });
    v.push(if opts.exec { M::Exec } else { M::NoExec });
    if opts.noatime {
        v.push(M::NoAtime);
    }
    v
}

/// Mounts `fs` at `mountpoint` and serves it until it is unmounted (`cairn umount`,
/// `umount`, or an [`Unmounter`]); then calls `fs.destroy()` so everything dirty is flushed.
pub fn serve(fs: Arc<dyn FileSystem>, mountpoint: &Path, opts: &FuseOptions) -> io::Result<()> {
    Server::mount(fs, mountpoint, opts)?.run()
}

/// Mounts and serves on background threads; the mount is ready when this returns.
/// Dropping the handle unmounts and waits for the final flush (tests use this).
pub fn spawn(
    fs: Arc<dyn FileSystem>,
    mountpoint: &Path,
    opts: &FuseOptions,
) -> io::Result<MountHandle> {
    let server = Server::mount(fs, mountpoint, opts)?;
    let unmounter = server.unmounter();
    let counts = server.counts();
    let mountpoint = server.mountpoint().to_path_buf();
    let thread = std::thread::Builder::new()
        .name("cairn-fuse".into())
        .spawn(move || server.run())?;
    Ok(MountHandle {
        unmounter,
        counts,
        mountpoint,
        thread: Some(thread),
    })
}

/// A mount served in the background by [`spawn`].
#[derive(Debug)]
pub struct MountHandle {
    unmounter: Unmounter,
    counts: Arc<RequestCounts>,
    mountpoint: PathBuf,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl MountHandle {
    pub fn counts(&self) -> &RequestCounts {
        &self.counts
    }

    pub fn unmounter(&self) -> Unmounter {
        self.unmounter.clone()
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts and waits until the session has ended and the file system is flushed.
    pub fn unmount(mut self) -> io::Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> io::Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.unmounter.unmount()?;
        thread
            .join()
            .map_err(|_| io::Error::other("the FUSE session thread panicked"))?
    }
}

impl Drop for MountHandle {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            log::error!("unmounting {}: {e}", self.mountpoint.display());
        }
    }
}

/// The mount's backing-device directory in sysfs (`/sys/class/bdi/0:45`), found through
/// /proc/self/mountinfo rather than stat(2) on the mount point, which would wait for a
/// request nobody serves yet.
fn bdi_of(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mp = mountpoint.to_str()?;
    let devno = info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(4) == Some(&mp))
            .then(|| f.get(2).map(|s| s.to_string()))
            .flatten()
    })?;
    Some(format!("/sys/class/bdi/{devno}"))
}

/// The kernel proposes its default read-ahead (128 KiB) at FUSE init and a file system may
/// only lower it, so sequential reads arrive in 128 KiB requests. As root we raise the
/// mount's backing-device read-ahead to `max_write` bytes through sysfs, so a sequential
/// read costs one round trip per MiB instead of eight. Best effort: failure changes speed,
/// not behaviour.
fn raise_read_ahead(bdi: &str, bytes: u32) {
    let kb = (bytes / 1024).max(128);
    let path = format!("{bdi}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, kb.to_string()) {
        log::debug!("could not raise read-ahead via {path}: {e}");
    }
}

/// The most dirty page-cache bytes cairn lets the kernel hold for one mount: 1/64 of the
/// file system, between these bounds.
const DIRTY_LIMIT_MIN: u64 = 1 << 20;
const DIRTY_LIMIT_MAX: u64 = 32 << 20;

/// Bounds what the kernel may accept for this mount before the file system has seen it,
/// and has the file system keep room for it (docs/DESIGN.md, "A full disk").
///
/// Pages dirtied through a shared mapping (and, under the writeback cache, every write)
/// are written back later, when the program has long been told "written"; a write-back
/// that finds no room loses data. The kernel throttles a FUSE mount's dirty pages to its
/// backing device's limit (`strict_limit` is on for FUSE): as root the limit is set here
/// (`max_bytes`, Linux 6.2+) and read back, otherwise the kernel's own (1% of the dirty
/// threshold) is read or estimated. The file system then holds back that limit plus the
/// kernel's overshoot — the pages each writer dirties between two checks of the limit;
/// measured 0.4 MiB over limits of 1 and 4 MiB — for write-backs alone.
fn limit_dirty(bdi: Option<&str>, fs: &dyn FileSystem, counts: &RequestCounts) {
    let size = fs
        .statfs()
        .map(|s| s.blocks.saturating_mul(s.frsize as u64))
        .unwrap_or(0);
    let want = (size / 64).clamp(DIRTY_LIMIT_MIN, DIRTY_LIMIT_MAX);
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(format!("{}/{name}", bdi?))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    if let Some(b) = bdi
        && let Err(e) = std::fs::write(format!("{b}/max_bytes"), want.to_string())
    {
        log::debug!("could not set {b}/max_bytes: {e}");
    }
    let limit = read("max_bytes").filter(|&b| b > 0).unwrap_or_else(|| {
        // FUSE's share of the dirty threshold (max_ratio 1%), in pages in /proc/vmstat.
        std::fs::read_to_string("/proc/vmstat")
            .ok()
            .and_then(|v| {
                v.lines()
                    .find_map(|l| l.strip_prefix("nr_dirty_threshold "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
            .map_or(DIRTY_LIMIT_MAX, |pages| pages * 4096 / 100)
    });
    counts.set_dirty_limit(limit);
    let reserve = limit + limit / 2 + (1 << 20);
    fs.set_writeback_reserve(reserve);
    log::info!(
        "dirty page limit {} KiB; {} KiB held back for the kernel's write-back",
        limit >> 10,
        reserve >> 10
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed option is the adapter's, and setting each to its listed default leaves
    /// the options as they were: the list and the parser say the same.
    #[test]
    fn the_listed_options_are_the_parsed_ones() {
        let d = FuseOptions::default();
        let mut o = FuseOptions::default();
        for spec in OPTIONS {
            let v = (!spec.default.is_empty()).then_some(spec.default);
            if spec.values.is_empty() || !spec.default.is_empty() {
                assert_eq!(o.set(spec.key, v), Ok(true), "{}", spec.key);
            }
        }
        // Flags listed are the non-default side: undo them to compare.
        for off in ["nosuid", "nodev", "exec", "relatime"] {
            assert_eq!(o.set(off, None), Ok(true), "{off}");
        }
        assert_eq!(format!("{o:?}"), format!("{d:?}"));
    }

    #[test]
    fn options_split_between_layers() {
        let mut o = FuseOptions::default();
        assert_eq!(o.set("threads", Some("4")), Ok(true));
        assert_eq!(o.threads, 4);
        assert!(o.set("threads", Some("0")).is_err());
        assert!(o.set("threads", None).is_err());
        assert_eq!(o.set("mode", Some("sync")), Ok(false));
        assert_eq!(o.set("cache", Some("1G")), Ok(false));
        assert_eq!(o.set("noexec", None), Ok(true));
        assert!(!o.exec);
        assert_eq!(o.set("max_write", Some("128K")), Ok(true));
        assert_eq!(o.max_write, 128 << 10);
        assert!(o.set("max_write", Some("1")).is_err());
        assert_eq!(o.set("readdirplus", Some("no")), Ok(true));
        assert_eq!(o.readdirplus, ReaddirPlus::Off);
        assert_eq!(o.set("writeback_cache", Some("off")), Ok(true));
        assert_eq!(o.writeback_cache, Some(false));
        assert_eq!(o.set("writeback_cache", None), Ok(true));
        assert_eq!(o.writeback_cache, Some(true));
        assert!(o.set("allow_other", Some("maybe")).is_err());
        assert_eq!(o.transport, Transport::Auto);
        assert_eq!(o.set("transport", Some("uring")), Ok(true));
        assert_eq!(o.transport, Transport::Uring);
        assert_eq!(o.set("transport", Some("dev")), Ok(true));
        assert_eq!(o.transport, Transport::Dev);
        assert!(o.set("transport", Some("carrier-pigeon")).is_err());
        assert!(o.set("transport", None).is_err());
        assert_eq!(o.uring_depth, 2);
        assert_eq!(o.set("uring_depth", Some("4")), Ok(true));
        assert_eq!(o.uring_depth, 4);
        assert!(o.set("uring_depth", Some("0")).is_err());
        assert!(o.set("uring_depth", Some("17")).is_err());
        assert!(o.set("uring_depth", Some("x")).is_err());
        assert!(o.set("uring_depth", None).is_err());
    }
}
