//! The file systems under test and their life cycle: a fresh image per workload, mkfs, mount,
//! "make the next reads cold", counters, unmount.
//!
//! Every target lives on an image file in the scratch directory on the local disk, so they all
//! sit on the same device: kernel ext4 reaches it through a loop device, fuse2fs and cairn
//! through the image file itself, mergerfs through one branch directory on a loop-mounted ext4.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::counters::{Counters, Source};
use crate::registry::{AfterCrash, Facts, Listing};
use crate::scratch;
use crate::sys;

/// mergerfs options (recorded in each record's notes).
pub const MERGERFS_OPTS: &str = "minfreespace=16M";
const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);
/// A FUSE daemon writes its cache back after the kernel detached the mount; a cairn mount in
/// sync mode with a large cache may take a while, but not forever.
const EXIT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Kind {
    /// Kernel ext4 on a loop device (data=ordered journal); `sync` = mounted `-o sync`, the
    /// classic-FFS analogue (every metadata update synchronous).
    Ext4 { sync: bool },
    /// Kernel ext2 on a loop device: no journal, delayed metadata writes (the FFS-async analogue).
    Ext2,
    /// Kernel btrfs on a loop device: the copy-on-write peer of LFS (004's descendants; this
    /// kernel has no f2fs or nilfs2). Defaults: data and metadata copied on write, checksums.
    Btrfs,
    /// Kernel xfs with its log on a second loop device (`logdev=`): the two-disk journaling
    /// analogue (000's LFFS-wafs-2async).
    Xfs,
    /// fuse2fs (e2fsprogs' FUSE ext4) on an image file: the same FUSE tax as cairn.
    Fuse2fs,
    /// mergerfs with one branch: a directory on a loop-mounted ext4.
    Mergerfs,
    /// cairn's umbrella layer with one branch on a loop-mounted ext4, FUSE passthrough on: the
    /// floor any FUSE file system pays.
    Passthrough,
    /// The FUSE floor: `cairn mount --memory`, cairn's FUSE adapter, daemon and transport in
    /// front of `cairn_fuse::memfs`, a file system of a few hash maps that does no I/O. Beside
    /// a cairn mode it separates the engine's cost from FUSE's: what the floor takes for an
    /// operation, any file system behind this adapter takes. `transport` as a cairn target's
    /// (`fuse-floor+uring`, `fuse-floor+dev`), so it can be paired with one. Its files live
    /// only in the daemon's memory ([`TargetSpec::volatile`]).
    Floor {
        #[serde(skip_serializing_if = "Option::is_none")]
        transport: Option<String>,
    },
    /// cairn in one of its metadata-update modes, on an image file or (`loopdev`) on a loop
    /// block device over the same kind of image; `transport` ("uring" or "dev", from a
    /// `+uring`/`+dev` suffix) forces the FUSE transport, None leaves the daemon's `auto`.
    /// `log_device`: a journal mode with its log on a second image file (`log=dev:PATH`, a
    /// log made by `cairn wal mkfs`): 001's LFFS-wafs-2sync/-2async, the targets
    /// `cairn-journal-2sync` and `cairn-journal-2async` (the registry's variants with a log
    /// device). `facts`: what the build lists of the mode (`None` when it does not list it).
    Cairn {
        mode: String,
        loopdev: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        transport: Option<String>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        log_device: bool,
        #[serde(skip)]
        facts: Option<Facts>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TargetSpec {
    pub name: String,
    #[serde(flatten)]
    pub kind: Kind,
    /// A cairn target on a model of a mechanical disk (`TARGET:MODEL`, docs/DISKS.md):
    /// mounted with `-o disk=MODEL` (and `log_disk=MODEL` for a log on its own device: a
    /// second disk of the same model, as the papers' -2 systems had).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
}

/// The name of `target` on the disk model `model` (`cairn-sync:cheetah-10k`).
pub fn on_disk(target: &str, model: &str) -> String {
    format!("{target}:{model}")
}

/// The disk model a target name puts its target on, if any, and the target without it.
pub fn split_disk(name: &str) -> (&str, Option<&str>) {
    match name.split_once(':') {
        Some((t, m)) => (t, Some(m)),
        None => (name, None),
    }
}

impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Size of the log image of a `log_device` target (a journal's log area on a 4 GiB image is
/// about 40 MiB: the same order, so the two placements checkpoint alike).
const JOURNAL_LOG_SIZE: u64 = 64 << 20;

/// Baseline targets every run knows about, in table order (cairn's modes come first).
pub const BASELINES: &[&str] = &[
    "ext4",
    "ext4-sync",
    "ext2",
    "btrfs",
    "xfs-logdev",
    "fuse2fs",
    FLOOR,
    "passthrough",
    "mergerfs",
];

/// The FUSE floor's name ([`Kind::Floor`]).
pub const FLOOR: &str = "fuse-floor";

/// Why a [`TargetSpec::volatile`] target cannot be crashed, recovered or checked: recorded
/// for every workload it skips for that (short: tables cut a reason at 160 characters).
pub const VOLATILE: &str = "its files live only in its daemon's memory (an unmount empties it): no crash, recovery or fsck";

/// How a [`TargetSpec::volatile`] target is made cold ([`TargetSpec::cold_by`]): recorded on
/// every phase it measures cold, and said beside its cold numbers. A cold read's floor is
/// what FUSE allows a read that misses the kernel's caches; the daemon answering it from
/// memory, with no device behind it, is what makes it the floor.
pub const FLOOR_COLD: &str = "the kernel's caches dropped (sync; drop_caches) with no unmount, which would empty it: every read goes through FUSE to a daemon that holds its files in memory, no device I/O";

/// A FUSE transport suffix (`+uring`, `+dev`) split off a target name: the name without it
/// and the transport; an error for any other suffix after `+`.
fn split_transport(n: &str) -> Result<(&str, Option<String>)> {
    match n.rsplit_once('+') {
        Some((b, t @ ("uring" | "dev"))) => Ok((b, Some(t.to_string()))),
        Some(_) => bail!("unknown target '{n}' (a FUSE transport is +uring or +dev)"),
        None => Ok((n, None)),
    }
}

impl TargetSpec {
    /// A target of a build that lists nothing (no facts on its cairn targets).
    pub fn parse(name: &str) -> Result<TargetSpec> {
        TargetSpec::parse_with(name, &Listing::default())
    }

    /// A target of a build that lists `listing`: `cairn-MODE` carries the mode's facts, and
    /// a variant with its log on a device of its own (`cairn-journal-2sync`) is its base
    /// mode with a second image for the log.
    pub fn parse_with(name: &str, listing: &Listing) -> Result<TargetSpec> {
        if let (base, Some(model)) = split_disk(name) {
            cairn_blockdev::disk::DiskOptions::parse(model).map_err(|e| anyhow::anyhow!(e))?;
            let spec = TargetSpec::parse_with(base, listing)?;
            if !matches!(spec.kind, Kind::Cairn { .. }) {
                bail!(
                    "{name}: only cairn targets run on a disk model (the kernel's file systems need a block device)"
                );
            }
            return Ok(TargetSpec {
                name: name.to_string(),
                disk: Some(model.to_string()),
                ..spec
            });
        }
        if let Some(v) = listing.log_device_variants().find(|v| v.target == name) {
            return Ok(TargetSpec {
                name: name.to_string(),
                kind: Kind::Cairn {
                    mode: v.base.clone(),
                    loopdev: false,
                    transport: None,
                    log_device: true,
                    facts: Some(v.facts),
                },
                disk: None,
            });
        }
        let kind = match name {
            "ext4" => Kind::Ext4 { sync: false },
            "ext4-sync" => Kind::Ext4 { sync: true },
            "ext2" => Kind::Ext2,
            "btrfs" => Kind::Btrfs,
            "xfs-logdev" => Kind::Xfs,
            "fuse2fs" => Kind::Fuse2fs,
            "mergerfs" => Kind::Mergerfs,
            "passthrough" => Kind::Passthrough,
            n if split_transport(n).is_ok_and(|(b, _)| b == FLOOR) => Kind::Floor {
                transport: split_transport(n)?.1,
            },
            n => {
                let (base, loopdev) = match n.strip_suffix("@loop") {
                    Some(b) => (b, true),
                    None => (n, false),
                };
                let (base, transport) = split_transport(base)?;
                match base.strip_prefix("cairn-") {
                    Some(mode)
                        if !mode.is_empty()
                            && mode
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
                    {
                        Kind::Cairn {
                            mode: mode.to_string(),
                            loopdev,
                            transport,
                            log_device: false,
                            facts: listing.mode(mode).map(|m| m.facts),
                        }
                    }
                    _ => bail!(
                        "unknown target '{n}' (known: {}, {FLOOR}[+uring|+dev], cairn-<mode>[+uring|+dev][@loop])",
                        BASELINES.join(", ")
                    ),
                }
            }
        };
        Ok(TargetSpec {
            name: name.to_string(),
            kind,
            disk: None,
        })
    }

    /// Tools this target needs on PATH (cairn's path is checked separately).
    pub fn tools(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Ext4 { .. } => &["mkfs.ext4", "losetup", "mount", "umount", "e2fsck"],
            Kind::Ext2 => &["mkfs.ext2", "losetup", "mount", "umount", "e2fsck"],
            Kind::Btrfs => &[
                "mkfs.btrfs",
                "btrfs",
                "xfs_io",
                "losetup",
                "mount",
                "umount",
            ],
            Kind::Xfs => &[
                "mkfs.xfs",
                "xfs_repair",
                "xfs_io",
                "losetup",
                "mount",
                "umount",
            ],
            Kind::Fuse2fs => &["mkfs.ext4", "fuse2fs", "umount", "e2fsck"],
            Kind::Mergerfs => &["mkfs.ext4", "losetup", "mount", "umount", "mergerfs"],
            Kind::Passthrough => &["mkfs.ext4", "losetup", "mount", "umount"],
            Kind::Cairn { loopdev: true, .. } => &["umount", "losetup"],
            Kind::Cairn { .. } | Kind::Floor { .. } => &["umount"],
        }
    }

    /// Whether `cairn mount` serves this target: it takes the cairn targets' mount options
    /// (the run's `--mount-options`, a workload's FUSE concurrency, its transport), answers
    /// `cairn stats` (device and FUSE counters) and needs a working cairn binary.
    pub fn cairn_daemon(&self) -> bool {
        matches!(self.kind, Kind::Cairn { .. } | Kind::Floor { .. })
    }

    /// The FUSE transport the target forces (`+uring`/`+dev`), if it is a cairn daemon's.
    pub fn transport(&self) -> Option<&str> {
        match &self.kind {
            Kind::Cairn { transport, .. } | Kind::Floor { transport } => transport.as_deref(),
            _ => None,
        }
    }

    /// Why the target cannot be crashed, recovered or checked, if it cannot: its files exist
    /// only while its daemon runs. Workloads that crash it are not run on it
    /// (`Workload::unrunnable_on`) and its fsck is refused: the mount of an empty file system
    /// timed as a recovery would be a wrong number under a right name. It is made cold
    /// without an unmount ([`TargetSpec::cold_by`]).
    pub fn volatile(&self) -> Option<&'static str> {
        match self.kind {
            Kind::Floor { .. } => Some(VOLATILE),
            _ => None,
        }
    }

    /// How [`Mounted::make_cold`] makes this target cold where that is not what a cold cache
    /// means elsewhere (every cache between the reader and the device emptied), if so: the
    /// floor's kernel caches are dropped under its live daemon ([`FLOOR_COLD`]). Every phase
    /// measured cold on it carries this (`PhaseResult::cold`), so no table shows its cold
    /// number as a device's.
    pub fn cold_by(&self) -> Option<&'static str> {
        match self.kind {
            Kind::Floor { .. } => Some(FLOOR_COLD),
            _ => None,
        }
    }

    /// The kernel file system this target puts on a loop device, if any: for ext4/ext2/xfs the
    /// file system under test, for mergerfs and the passthrough the ext4 holding their branch.
    fn kernel_fs(&self) -> Option<&'static str> {
        match self.kind {
            Kind::Ext4 { .. } | Kind::Mergerfs | Kind::Passthrough => Some("ext4"),
            Kind::Ext2 => Some("ext2"),
            Kind::Btrfs => Some("btrfs"),
            Kind::Xfs => Some("xfs"),
            Kind::Fuse2fs | Kind::Cairn { .. } | Kind::Floor { .. } => None,
        }
    }

    /// Whether the target lives on an image file this run makes (every one but the floor).
    fn has_image(&self) -> bool {
        !matches!(self.kind, Kind::Floor { .. })
    }

    /// Whether a FUSE layer sits on top of a kernel file system mounted at `lower`.
    fn stacked(&self) -> bool {
        matches!(self.kind, Kind::Mergerfs | Kind::Passthrough)
    }
}

/// What every target needs to know about the run.
#[derive(Clone, Debug)]
pub struct Env {
    /// Directory on the local disk that holds images and mount points.
    pub scratch: PathBuf,
    pub image_size: u64,
    /// The `cairn` binary.
    pub cairn: String,
    /// Requests a cairn daemon must serve at once (its FUSE threads and io_uring depth), for a
    /// workload whose threads all wait in the file system together (group-create); None: the
    /// daemon's defaults. Every cairn target of such a workload gets the same, so a
    /// comparison between modes is not one between daemon configurations.
    pub fuse_concurrency: Option<usize>,
    /// Mount options every cairn target adds to its own (`--mount-options`, e.g. `cache=16M`
    /// for a working set larger than the buffer cache); empty: none.
    pub mount_options: String,
}

/// A mounted target, ready for a workload in [`Mounted::dir`]. Dropping it unmounts and
/// releases everything (best effort); [`Mounted::teardown`] does the same and reports errors.
pub struct Mounted {
    pub spec: TargetSpec,
    cairn: String,
    /// `Env::fuse_concurrency`.
    fuse_concurrency: Option<usize>,
    root: PathBuf,
    image: PathBuf,
    /// Where the target is mounted (the FUSE layer's mount for mergerfs and the passthrough).
    mnt: PathBuf,
    /// mergerfs/passthrough: the ext4 mount holding the branch.
    lower_mnt: Option<PathBuf>,
    loopdev: Option<String>,
    /// xfs: the loop device holding the log.
    logdev: Option<String>,
    daemon: Option<u32>,
    mounted: bool,
    /// Options a workload added to a cairn target's `-o` for its later mounts
    /// ([`Mounted::set_extra_options`]), e.g. a checkpoint held back.
    extra_options: String,
    /// `Env::mount_options`: in every mount of a cairn target, before `extra_options`' own.
    base_options: String,
    /// Mount attempts' facts for the record (daemon CPU placement, options).
    pub notes: Vec<String>,
    /// Phases a workload ran here without measuring them, and why (for the record).
    pub skipped: Vec<crate::results::Skipped>,
}

/// Size of xfs's external log device (xfs caps a log at 2 GiB; 128 MiB is its default for a
/// file system of a few GiB).
const XFS_LOG_SIZE: u64 = 128 << 20;

impl Mounted {
    /// Makes a fresh file system for `spec` under `env.scratch/<name>` and mounts it.
    pub fn setup(spec: &TargetSpec, env: &Env) -> Result<Mounted> {
        let root = env.scratch.join(spec.name.replace('@', "-"));
        if root.exists() {
            // Left by an earlier repetition of this run whose teardown failed: ours to release.
            scratch::release_under(&root);
            scratch::remove_tree(&root)?;
        }
        let root = sys::ensure_dir(&root)?;
        let image = root.join("fs.img");
        let mnt = sys::ensure_dir(&root.join("mnt"))?;
        let mut m = Mounted {
            spec: spec.clone(),
            cairn: env.cairn.clone(),
            fuse_concurrency: env.fuse_concurrency,
            root: root.clone(),
            image: image.clone(),
            mnt,
            lower_mnt: None,
            loopdev: None,
            logdev: None,
            daemon: None,
            mounted: false,
            extra_options: String::new(),
            base_options: env.mount_options.clone(),
            notes: Vec::new(),
            skipped: Vec::new(),
        };
        if !env.mount_options.is_empty() && spec.cairn_daemon() {
            m.set_extra_options("")?;
        }
        // Larger than the free space only when the run was asked for images the disk cannot
        // hold (--image-size, --netnews-full's 16 GiB): they are sparse, and a workload that
        // filled one would meet ENOSPC from the host, not from the target.
        let beyond_free =
            spec.has_image() && sys::free_bytes(&root).is_some_and(|free| env.image_size > free);
        if spec.has_image() {
            make_sparse(&image, env.image_size)?;
        }
        if spec.kernel_fs().is_some() || matches!(spec.kind, Kind::Cairn { loopdev: true, .. }) {
            m.loopdev = Some(losetup(&image)?);
        }
        match &spec.kind {
            Kind::Cairn {
                loopdev,
                mode,
                log_device,
                ..
            } => {
                if let Some(dev) = m.loopdev.as_deref().filter(|_| *loopdev) {
                    // The loop device was attached to the image made above a moment ago; check
                    // that it still is, so the --force below can only ever cover this run's
                    // own fresh image.
                    let back = sys::loop_backing_file(dev);
                    if back.as_deref() != Some(image.as_path()) {
                        bail!(
                            "{dev} is no longer attached to {} (backing file: {:?}); not formatting it",
                            image.display(),
                            back
                        );
                    }
                }
                // The mode's format (`cairn modes --json`, "type"): lfs is its own format.
                let format = cairn_mode_format(&env.cairn, mode);
                sys::run(
                    Command::new(&env.cairn)
                        .arg("mkfs")
                        .args(cairn_mkfs_flags(*loopdev, beyond_free))
                        .args(format.iter().flat_map(|f| ["--format", f.as_str()]))
                        .arg(m.device()),
                )?;
                if *log_device {
                    // The log on an image file of its own beside the file system's, on the
                    // same disk (a second image: the "second image file"). Written
                    // out in full first, as a disk is: a sparse file would make every log
                    // write allocate, and every flush of it commit the host's own journal.
                    make_filled(&m.log_image(), JOURNAL_LOG_SIZE)?;
                    sys::run(
                        Command::new(&env.cairn)
                            .args(["wal", "mkfs", "--size"])
                            .arg(JOURNAL_LOG_SIZE.to_string())
                            .arg(m.log_image()),
                    )?;
                }
            }
            Kind::Xfs => {
                let log = root.join("log.img");
                make_sparse(&log, XFS_LOG_SIZE)?;
                let logdev = losetup(&log)?;
                sys::run(
                    Command::new("mkfs.xfs")
                        .args(["-q", "-f", "-l"])
                        .arg(format!("logdev={logdev},size={XFS_LOG_SIZE}"))
                        .arg(m.device()),
                )?;
                m.logdev = Some(logdev);
            }
            // Nothing to make: the daemon starts with an empty file system in its memory.
            Kind::Floor { .. } => {}
            Kind::Btrfs => {
                sys::run(
                    Command::new("mkfs.btrfs")
                        .args(["-q", "-f"])
                        .arg(m.device()),
                )?;
            }
            Kind::Ext2 => {
                sys::run(
                    Command::new("mkfs.ext2")
                        .args(["-q", "-F", "-E", "lazy_itable_init=0"])
                        .arg(m.device()),
                )?;
            }
            _ => {
                // lazy_itable_init=0: no background zeroing thread writing while we measure.
                sys::run(
                    Command::new("mkfs.ext4")
                        .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
                        .arg(m.device()),
                )?;
            }
        }
        if spec.stacked() {
            m.lower_mnt = Some(sys::ensure_dir(&root.join("lower"))?);
        }
        m.notes.push(format!("options: {}", m.mount_options()));
        if beyond_free {
            m.notes.push(format!(
                "image ({}) larger than the free space of the scratch file system: sparse",
                crate::units::fmt_bytes(env.image_size)
            ));
        }
        m.mount()?;
        if let Some(lower) = &m.lower_mnt {
            fs::create_dir_all(lower.join("branch"))?;
        }
        m.mount_upper()?;
        fs::create_dir_all(m.dir())?;
        Ok(m)
    }

    /// The image file or the loop device over it, whichever the file system is made on.
    fn device(&self) -> PathBuf {
        self.loopdev
            .as_ref()
            .map(PathBuf::from)
            .unwrap_or_else(|| self.image.clone())
    }

    /// A `log_device` journal's log: an image file beside the file system's.
    fn log_image(&self) -> PathBuf {
        self.root.join("log.img")
    }

    /// The FUSE daemon's log of a cairn target (what its mounts' recoveries report).
    pub fn daemon_log(&self) -> PathBuf {
        self.root.join("daemon.log")
    }

    /// Adds `opts` (`key=value,...`; empty for none) to a cairn target's mount options from
    /// its next mount on, recorded in the notes; other targets refuse (their mounts have no
    /// such options).
    pub fn set_extra_options(&mut self, opts: &str) -> Result<()> {
        if !self.spec.cairn_daemon() {
            bail!(
                "{}: only a cairn target takes extra mount options",
                self.spec.name
            );
        }
        self.extra_options = compose_options(&self.base_options, opts);
        if let Some(o) = self.extra_options.strip_prefix(',') {
            self.notes.push(format!("mounts add: {o}"));
        }
        Ok(())
    }

    /// Whether a workload may set this target's buffer cache (`Stage::sizes_cache`): a cairn
    /// daemon with an image (the floor keeps its files in memory) whose run's own mount
    /// options name no cache.
    pub fn sizes_cache(&self) -> bool {
        self.spec.cairn_daemon()
            && self.spec.has_image()
            && !self
                .base_options
                .split(',')
                .any(|o| o.starts_with("cache="))
    }

    /// The directory workloads run in (a subdirectory, so lost+found is out of the way).
    pub fn dir(&self) -> PathBuf {
        self.mnt.join("bench")
    }

    /// Where this target's counters come from, if anywhere: cairn's own counters (device and
    /// FUSE), plus the block layer's for a cairn on a loop device (its busy time); the block
    /// layer's for every kernel file system.
    pub fn counter_source(&self) -> Option<Source> {
        match &self.spec.kind {
            Kind::Cairn { .. } => Some(Source::Cairn {
                cairn: self.cairn.clone(),
                mnt: self.mnt.clone(),
                block: self.loopdev.clone(),
            }),
            // The adapter's FUSE counters, and whatever the in-memory file system counts.
            Kind::Floor { .. } => Some(Source::Cairn {
                cairn: self.cairn.clone(),
                mnt: self.mnt.clone(),
                block: None,
            }),
            Kind::Fuse2fs => None,
            _ => self.loopdev.clone().map(|dev| Source::Block { dev }),
        }
    }

    pub fn counters(&self) -> Result<Option<Counters>> {
        self.counter_source().map(|s| s.read()).transpose()
    }

    /// Makes the next reads come from the device: FUSE targets are unmounted (so the daemon
    /// forgets its cache and writes everything back), then every kernel cache is dropped
    /// (including the page cache over the image files), then the target is mounted again.
    /// The floor has no device: its next reads miss the kernel's caches and reach its daemon
    /// ([`TargetSpec::cold_by`]).
    pub fn make_cold(&mut self) -> Result<()> {
        // Only a FUSE daemon holds a cache that drop_caches cannot reach; for mergerfs and the
        // passthrough that is the FUSE layer, while their ext4 is a kernel file system.
        match self.spec.kind {
            Kind::Ext4 { .. } | Kind::Ext2 | Kind::Btrfs | Kind::Xfs => sys::drop_caches(),
            Kind::Mergerfs | Kind::Passthrough => {
                self.unmount_upper()?;
                sys::drop_caches()?;
                self.mount_upper()
            }
            Kind::Fuse2fs | Kind::Cairn { .. } => {
                self.unmount()?;
                sys::drop_caches()?;
                self.mount()
            }
            // No unmount: it would empty the file system. Dropping the kernel's caches (pages,
            // dentries, inodes: the kernel then FORGETs them to the daemon) makes every later
            // lookup and read a FUSE request, which the daemon answers from its maps: what a
            // cold read costs behind this adapter with no device, the floor of a cold read.
            Kind::Floor { .. } => sys::drop_caches(),
        }
    }

    /// Simulates a crash with recent activity in memory: a FUSE daemon is killed with SIGKILL
    /// (everything it had not written is lost, as in a power cut of a user-space file system);
    /// a kernel file system is shut down with FS_IOC_SHUTDOWN without flushing its log
    /// (`xfs_io -x -c "shutdown"`, what xfstests uses to simulate a crash), then unmounted.
    /// Afterwards the target is unmounted, every cache is dropped (as a machine crash would)
    /// and [`Mounted::recover`] brings it back.
    pub fn crash(&mut self) -> Result<()> {
        match &self.spec.kind {
            Kind::Fuse2fs | Kind::Cairn { .. } => {
                let pid = self
                    .daemon
                    .take()
                    .or_else(|| sys::find_daemon(&self.mnt))
                    .context("no FUSE daemon to kill")?;
                sys::run(Command::new("kill").args(["-9", &pid.to_string()]))?;
                sys::wait_pid_exit(pid, EXIT_TIMEOUT)?;
                // The kernel keeps the dead connection mounted until someone unmounts it.
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
            Kind::Ext4 { .. } | Kind::Ext2 | Kind::Btrfs | Kind::Xfs => {
                sys::run(
                    Command::new("xfs_io")
                        .args(["-x", "-c", "shutdown"])
                        .arg(&self.mnt),
                )?;
                sys::run(Command::new("umount").arg(&self.mnt))?;
            }
            Kind::Mergerfs | Kind::Passthrough => {
                bail!(
                    "{}: crash recovery is measured on the file systems themselves, not on a layer over ext4",
                    self.spec.name
                )
            }
            Kind::Floor { .. } => bail!("{}: nothing to crash: {VOLATILE}", self.spec.name),
        }
        self.mounted = false;
        // A machine crash takes the page cache with it: recovery reads the device, not the
        // host's cached copy of the image (which would make a full scan look free).
        sys::drop_caches()
    }

    /// What an administrator runs after a crash until the file system is mounted and usable:
    /// journaling file systems replay their log at mount; ext2 and fuse2fs need e2fsck first
    /// (`-p`, the boot-time preen); cairn's sync/async modes need `cairn fsck -y` (001 §3: FFS
    /// must scan everything), modes that declare themselves crash-safe without a scan mount
    /// directly. Ends with a walk of the root directory, so "usable" means it answered.
    pub fn recover(&mut self) -> Result<String> {
        let procedure = match &self.spec.kind {
            Kind::Ext4 { .. } | Kind::Xfs => "mount (log replay)".to_string(),
            // btrfs is consistent at every transaction commit: a mount finds the last
            // committed tree (and replays the fsync log tree), no check needed.
            Kind::Btrfs => "mount (last committed tree, log tree replay)".to_string(),
            Kind::Ext2 | Kind::Fuse2fs => {
                fsck_status(Command::new("e2fsck").arg("-p").arg(self.device()))?;
                "e2fsck -p, mount".to_string()
            }
            Kind::Cairn { mode, .. } => {
                if cairn_mode_needs_fsck(&self.cairn, mode) {
                    fsck_status(
                        Command::new(&self.cairn)
                            .arg("fsck")
                            .arg("-y")
                            .arg(self.device()),
                    )?;
                    "cairn fsck -y, mount".to_string()
                } else {
                    "mount".to_string()
                }
            }
            Kind::Mergerfs | Kind::Passthrough => bail!("no crash recovery for {}", self.spec.name),
            Kind::Floor { .. } => bail!("no crash recovery for {}: {VOLATILE}", self.spec.name),
        };
        self.mount()?;
        fs::read_dir(&self.mnt)
            .with_context(|| format!("{} unusable after recovery", self.spec.name))?
            .count();
        Ok(procedure)
    }

    /// A full, read-only consistency check of the unmounted file system with a cold cache (the
    /// scan an FFS needs after a crash; 002 Table III), then mounts it again. Returns the
    /// check's own report when it gives one (`cairn fsck --json`: its leaks, say).
    pub fn fsck(&mut self) -> Result<Option<serde_json::Value>> {
        // Before the unmount, which would empty it.
        if let Some(why) = self.spec.volatile() {
            bail!("no fsck for {}: {why}", self.spec.name);
        }
        self.unmount()?;
        // Cold, as after a crash: the check reads what is on the device.
        sys::drop_caches()?;
        let report = match &self.spec.kind {
            Kind::Ext4 { .. } | Kind::Ext2 | Kind::Fuse2fs => {
                fsck_status(Command::new("e2fsck").args(["-f", "-n"]).arg(self.device()))?;
                None
            }
            Kind::Btrfs => {
                sys::run(
                    Command::new("btrfs")
                        .args(["check", "--readonly"])
                        .arg(self.device()),
                )?;
                None
            }
            Kind::Xfs => {
                sys::run(
                    Command::new("xfs_repair")
                        .arg("-n")
                        .arg("-l")
                        .arg(self.logdev.as_ref().context("xfs without log device")?)
                        .arg(self.device()),
                )?;
                None
            }
            Kind::Cairn { .. } => Some(cairn_check(&self.cairn, &self.device())?),
            Kind::Mergerfs | Kind::Passthrough | Kind::Floor { .. } => {
                bail!("no fsck for {}", self.spec.name)
            }
        };
        self.mount()?;
        Ok(report)
    }

    /// How the target is mounted, for the record.
    fn mount_options(&self) -> String {
        match &self.spec.kind {
            Kind::Ext4 { sync: true } => "mount -o sync (loop device)".into(),
            Kind::Ext4 { sync: false } => "mount (defaults; loop device)".into(),
            Kind::Ext2 => "mkfs.ext2, mount (defaults; loop device)".into(),
            Kind::Btrfs => "mkfs.btrfs, mount (defaults: CoW, checksums; loop device)".into(),
            Kind::Xfs => format!(
                "mkfs.xfs -l logdev=LOOP2,size={}M; mount -o logdev=LOOP2 (two loop devices)",
                XFS_LOG_SIZE >> 20
            ),
            Kind::Fuse2fs => "fuse2fs -o rw (image file)".into(),
            Kind::Mergerfs => {
                format!("mergerfs -o {MERGERFS_OPTS}, one branch on ext4 (loop device)")
            }
            Kind::Passthrough => {
                "cairn umbrella, one branch on ext4 (loop device), passthrough=yes".into()
            }
            Kind::Floor { transport } => format!(
                "cairn mount --memory -o {} (in-memory file system, no image)",
                floor_options(transport, self.fuse_concurrency).trim_start_matches(',')
            ),
            Kind::Cairn {
                mode,
                loopdev,
                transport,
                log_device,
                ..
            } => format!(
                "cairn mount -o mode={mode}{}{} ({})",
                transport_option(transport)
                    + &concurrency_options(self.fuse_concurrency)
                    + &disk_options(self.spec.disk.as_deref(), *log_device),
                if *log_device {
                    format!(
                        ",log=dev:LOG (a second image file, cairn wal mkfs --size {}M)",
                        JOURNAL_LOG_SIZE >> 20
                    )
                } else {
                    String::new()
                },
                if *loopdev {
                    "loop device"
                } else {
                    "image file"
                }
            ),
        }
    }

    /// Mounts the bottom layer: the kernel file system for the kernel targets, mergerfs and
    /// the passthrough; the FUSE daemon for fuse2fs and cairn.
    fn mount(&mut self) -> Result<()> {
        match &self.spec.kind {
            Kind::Ext4 { .. }
            | Kind::Ext2
            | Kind::Btrfs
            | Kind::Xfs
            | Kind::Mergerfs
            | Kind::Passthrough => {
                let mut c = Command::new("mount");
                if let Some(fstype) = self.spec.kernel_fs() {
                    c.args(["-t", fstype]);
                }
                if matches!(self.spec.kind, Kind::Ext4 { sync: true }) {
                    c.args(["-o", "sync"]);
                }
                if let Some(log) = &self.logdev {
                    c.arg("-o").arg(format!("logdev={log}"));
                }
                let at = self.lower_mnt.clone().unwrap_or_else(|| self.mnt.clone());
                sys::run(c.arg(self.device()).arg(at))?;
            }
            Kind::Fuse2fs => {
                // fuse2fs forks into the background once the mount exists.
                sys::run(
                    Command::new("fuse2fs")
                        .arg(&self.image)
                        .arg(&self.mnt)
                        .args(["-o", "rw"]),
                )?;
                self.after_fuse_mount()?;
            }
            Kind::Cairn {
                mode,
                transport,
                log_device,
                ..
            } => {
                let want_uring = transport.as_deref() == Some("uring");
                // The daemon's log goes beside its image, so a run leaves nothing in the
                // machine's runtime directory.
                let transport =
                    transport_option(transport) + &concurrency_options(self.fuse_concurrency);
                let log = if *log_device {
                    format!(",log=dev:{}", self.log_image().display())
                } else {
                    String::new()
                } + &disk_options(self.spec.disk.as_deref(), *log_device);
                sys::run(
                    Command::new(&self.cairn)
                        .arg("mount")
                        .arg("-o")
                        .arg(format!(
                            "mode={mode}{transport}{log}{},logfile={}",
                            self.extra_options,
                            self.daemon_log().display()
                        ))
                        .arg(self.device())
                        .arg(&self.mnt),
                )?;
                self.after_fuse_mount()?;
                self.check_uring(want_uring)?;
            }
            Kind::Floor { transport } => {
                let want_uring = transport.as_deref() == Some("uring");
                // A cairn mode's adapter options (see `floor_options`).
                let opts = floor_options(transport, self.fuse_concurrency);
                sys::run(
                    Command::new(&self.cairn)
                        .args(["mount", "--memory", "-o"])
                        .arg(format!(
                            "logfile={}{opts}{}",
                            self.daemon_log().display(),
                            self.extra_options
                        ))
                        // Only a label (the mount's fsname).
                        .arg(&self.spec.name)
                        .arg(&self.mnt),
                )?;
                self.after_fuse_mount()?;
                self.check_uring(want_uring)?;
            }
        }
        self.mounted = true;
        Ok(())
    }

    /// A daemon the kernel refuses io_uring mounts over /dev/fuse (and says so): measuring
    /// that under the `+uring` name would be a lie.
    fn check_uring(&mut self, want_uring: bool) -> Result<()> {
        if !want_uring {
            return Ok(());
        }
        let stats = sys::run(
            Command::new(&self.cairn)
                .args(["stats", "--json"])
                .arg(&self.mnt),
        )?;
        if !stats.contains("\"active\":\"uring\"") {
            self.mounted = true;
            bail!(
                "asked for FUSE over io_uring but served over /dev/fuse (see {})",
                self.daemon_log().display()
            );
        }
        Ok(())
    }

    fn mount_upper(&mut self) -> Result<()> {
        let Some(lower) = self.lower_mnt.clone() else {
            return Ok(());
        };
        let branch = lower.join("branch");
        match self.spec.kind {
            Kind::Mergerfs => {
                // Defaults, as a user would mount it, except minfreespace: its 4 GiB default
                // makes every create on a small branch fail with ENOSPC.
                sys::run(
                    Command::new("mergerfs")
                        .args(["-o", MERGERFS_OPTS])
                        .arg(&branch)
                        .arg(&self.mnt),
                )?;
            }
            Kind::Passthrough => {
                let cfg = self.root.join("umbrella.toml");
                fs::write(
                    &cfg,
                    format!(
                        "# One branch, no rules: cairn's FUSE layer at its thinnest.\n[umbrella]\ndefault = [\"ext4\"]\n\n[[branch]]\nname = \"ext4\"\npath = \"{}\"\n",
                        branch.display()
                    ),
                )?;
                sys::run(
                    Command::new(&self.cairn)
                        .arg("umbrella")
                        .arg(&cfg)
                        .arg(&self.mnt),
                )?;
            }
            _ => return Ok(()),
        }
        self.after_fuse_mount()
    }

    fn after_fuse_mount(&mut self) -> Result<()> {
        sys::wait_mounted(&self.mnt, MOUNT_TIMEOUT)?;
        self.daemon = sys::find_daemon(&self.mnt);
        match self.daemon {
            Some(pid) => {
                let cpus = sys::cpus_allowed(pid).unwrap_or_else(|| "?".into());
                let note = format!("daemon pid {pid} cpus {cpus}");
                if !self
                    .notes
                    .iter()
                    .any(|n| n.ends_with(&format!("cpus {cpus}")))
                {
                    self.notes.push(note);
                }
            }
            None => self.notes.push("daemon not found".into()),
        }
        Ok(())
    }

    fn unmount_upper(&mut self) -> Result<()> {
        if self.spec.stacked() && sys::mounted_fstype(&self.mnt).is_some() {
            self.unmount_fuse(&self.mnt.clone())?;
        }
        Ok(())
    }

    fn unmount(&mut self) -> Result<()> {
        if !self.mounted {
            return Ok(());
        }
        match &self.spec.kind {
            Kind::Ext4 { .. } | Kind::Ext2 | Kind::Btrfs | Kind::Xfs => {
                sys::run(Command::new("umount").arg(&self.mnt))?;
            }
            Kind::Mergerfs | Kind::Passthrough => {
                self.unmount_upper()?;
                sys::run(
                    Command::new("umount").arg(self.lower_mnt.as_ref().expect("lower mount")),
                )?;
            }
            Kind::Fuse2fs => self.unmount_fuse(&self.mnt.clone())?,
            Kind::Cairn { .. } | Kind::Floor { .. } => {
                // `cairn umount` returns once the daemon has flushed and exited.
                sys::run(Command::new(&self.cairn).arg("umount").arg(&self.mnt))?;
                if let Some(pid) = self.daemon.take() {
                    sys::wait_pid_exit(pid, EXIT_TIMEOUT)?;
                }
            }
        }
        self.mounted = false;
        Ok(())
    }

    fn unmount_fuse(&mut self, mnt: &Path) -> Result<()> {
        let pid = self.daemon.take().or_else(|| sys::find_daemon(mnt));
        if sys::mounted_fstype(mnt).is_none() {
            // Nothing unmounted it but us: the daemon died (or unmounted itself) mid-run.
            bail!(
                "{} is no longer mounted: its FUSE daemon went away during the workload",
                self.spec.name
            );
        }
        sys::run(Command::new("umount").arg(mnt))?;
        if let Some(pid) = pid {
            sys::wait_pid_exit(pid, EXIT_TIMEOUT)?;
        }
        Ok(())
    }

    /// Unmounts, detaches the loop devices and deletes the images.
    pub fn teardown(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        self.unmount_upper()?;
        self.unmount()?;
        for dev in [self.loopdev.take(), self.logdev.take()]
            .into_iter()
            .flatten()
        {
            sys::run(Command::new("losetup").arg("-d").arg(&dev))?;
        }
        scratch::remove_tree(&self.root)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.root.exists()
            && let Err(e) = self.release()
        {
            eprintln!("cairn bench: cleanup of {} failed: {e:#}", self.spec.name);
            scratch::release_under(&self.root);
        }
    }
}

fn losetup(image: &Path) -> Result<String> {
    Ok(sys::run(
        Command::new("losetup")
            .args(["--find", "--show"])
            .arg(image),
    )?
    .trim()
    .to_string())
}

/// fsck tools exit 1 when they fixed something (e2fsck, cairn fsck alike): success after a crash.
fn fsck_status(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    match out.status.code() {
        Some(0) | Some(1) => Ok(()),
        _ => bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// A read-only `cairn fsck` of `dev` that passes when nothing is corrupt: leaked blocks and
/// inodes are what soft updates leaves after a crash by design (002 §4; they are reclaimed
/// by `cairn fsck --background` or `-y`), so a check that finds only leaks (exit 4, the
/// e2fsck convention for "errors left") is the expected outcome, not a failed run; the
/// report says what was found.
fn cairn_check(cairn: &str, dev: &Path) -> Result<serde_json::Value> {
    let out = Command::new(cairn)
        .arg("fsck")
        .arg("--json")
        .arg(dev)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot start {cairn} fsck"))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "cairn fsck {} ({}): not JSON: {}",
            dev.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    match v["corruptions"].as_u64() {
        Some(0) if matches!(out.status.code(), Some(0 | 1 | 4)) => Ok(v),
        _ => bail!(
            "cairn fsck {} ({}): {} corruption(s), {}",
            dev.display(),
            out.status,
            v["corruptions"],
            v["error"].as_str().unwrap_or("see the image")
        ),
    }
}

/// Whether a cairn mode needs `cairn fsck -y` after a crash, as the mode itself declares
/// (`cairn modes --json`, "after_crash": "fsck"; soft updates, journaling and LFS mount
/// directly: 000 Table 3). Unknown answers mean fsck: the safe procedure.
fn cairn_mode_needs_fsck(cairn: &str, mode: &str) -> bool {
    Listing::of(cairn)
        .mode(mode)
        .is_none_or(|m| m.after_crash == AfterCrash::Fsck)
}

/// The format `mode` belongs to, as `cairn modes --json` lists it; `None` when it is not
/// listed (mkfs's default format then).
fn cairn_mode_format(cairn: &str, mode: &str) -> Option<String> {
    Listing::of(cairn).mode(mode).map(|m| m.format.clone())
}

/// Largest io_uring depth a cairn mount accepts (`uring_depth=`, 1 to 16).
const MAX_URING_DEPTH: usize = 16;
/// Largest FUSE thread count a cairn mount accepts (`threads=`, 1 to 64).
const MAX_FUSE_THREADS: usize = 64;

/// The mount options that let a daemon serve `n` requests at once, whichever transport it
/// takes: `n` /dev/fuse threads, and `n` io_uring entries per queue (the benchmark and its
/// threads are pinned to one CPU, so their requests all arrive on that CPU's queue). Both
/// capped at what `cairn mount` accepts.
fn concurrency_options(n: Option<usize>) -> String {
    n.map(|n| {
        format!(
            ",threads={},uring_depth={}",
            n.clamp(1, MAX_FUSE_THREADS),
            n.clamp(1, MAX_URING_DEPTH)
        )
    })
    .unwrap_or_default()
}

/// The mount options of a target on a disk model: `,disk=MODEL`, and `,log_disk=MODEL` for
/// a journal with its log on a device of its own (a second disk of the same model). Flushes
/// stay the model's (`nohostflush`): the host's fdatasync of the scratch image takes real
/// time the modeled disk would not (docs/DISKS.md), and the image is deleted after the run.
fn disk_options(disk: Option<&str>, log_device: bool) -> String {
    let Some(m) = disk else {
        return String::new();
    };
    let m = format!("{m}:nohostflush");
    if log_device {
        format!(",disk={m},log_disk={m}")
    } else {
        format!(",disk={m}")
    }
}

/// The options a cairn target's mount adds after its mode's: the run's own
/// (`--mount-options`), which stay in every mount, then a workload's (`opts`); each part
/// without its leading comma, the result with one (or empty).
fn compose_options(base: &str, opts: &str) -> String {
    [base, opts]
        .iter()
        .map(|o| o.trim_matches(','))
        .filter(|o| !o.is_empty())
        .map(|o| format!(",{o}"))
        .collect()
}

/// The FUSE floor's mount options (each with its leading comma): the adapter options a cairn
/// target's daemon gets, less the mode and the image's — the same transport, threads and
/// io_uring depth, so the difference is the engine — and the kernel's writeback cache off,
/// as every cairn mode has it unless a mount asks (`KernelCachePolicy::for_commit`: never,
/// or on request), where the in-memory file system's own policy turns it on: with it on the
/// kernel adds a flush and a setattr of the times to each new file (9 requests a
/// create+unlink pair instead of cairn's 7), a cost no cairn mode pays. A run's
/// `--mount-options` come after these and win, for the floor and cairn's modes alike.
fn floor_options(transport: &Option<String>, concurrency: Option<usize>) -> String {
    ",writeback_cache=no".to_string()
        + &transport_option(transport)
        + &concurrency_options(concurrency)
}

/// The `,transport=T` a `+uring`/`+dev` target adds to its mount options (nothing otherwise).
fn transport_option(transport: &Option<String>) -> String {
    transport
        .as_ref()
        .map(|t| format!(",transport={t}"))
        .unwrap_or_default()
}

/// The flags `cairn mkfs` gets for a target: `--force` on a loop device (`cairn mkfs` refuses a
/// device that may hold data unless forced; this one is this run's own, just attached to its
/// fresh image and checked), `--sparse` for an image file this run made larger than the free
/// space on purpose (`cairn mkfs` refuses that unless told the image may stay sparse). Nothing
/// otherwise: mkfs's refusals stay in force wherever the benchmark has no reason to override
/// them.
fn cairn_mkfs_flags(loopdev: bool, beyond_free: bool) -> &'static [&'static str] {
    match (loopdev, beyond_free) {
        (true, _) => &["--force"],
        (false, true) => &["--sparse"],
        (false, false) => &[],
    }
}

/// A new sparse file of `size` bytes; never an existing one (create_new), so a target's mkfs can
/// only ever format an image this run has just made.
/// A new file of `size` bytes of zeros, every block allocated (and on disk: synced).
fn make_filled(path: &Path, size: u64) -> Result<()> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let chunk = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    Ok(())
}

fn make_sparse(image: &Path, size: u64) -> Result<()> {
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(image)
        .with_context(|| format!("creating {}", image.display()))?;
    f.set_len(size)
        .with_context(|| format!("sizing {}", image.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names() {
        assert_eq!(
            TargetSpec::parse("ext4-sync").unwrap().kind,
            Kind::Ext4 { sync: true }
        );
        assert_eq!(
            TargetSpec::parse("cairn-async").unwrap().kind,
            Kind::Cairn {
                mode: "async".into(),
                loopdev: false,
                transport: None,
                log_device: false,
                facts: None,
            }
        );
        assert_eq!(
            TargetSpec::parse("cairn-sync@loop").unwrap().kind,
            Kind::Cairn {
                mode: "sync".into(),
                loopdev: true,
                transport: None,
                log_device: false,
                facts: None,
            }
        );
        assert_eq!(
            TargetSpec::parse("cairn-async+uring").unwrap().kind,
            Kind::Cairn {
                mode: "async".into(),
                loopdev: false,
                transport: Some("uring".into()),
                log_device: false,
                facts: None,
            }
        );
        assert_eq!(
            TargetSpec::parse("cairn-sync+dev@loop").unwrap().kind,
            Kind::Cairn {
                mode: "sync".into(),
                loopdev: true,
                transport: Some("dev".into()),
                log_device: false,
                facts: None,
            }
        );
        let listing = crate::registry::sample();
        let two = |t| TargetSpec::parse_with(t, &listing).unwrap().kind;
        assert_eq!(
            two("cairn-journal-2async"),
            Kind::Cairn {
                mode: "journal-async".into(),
                loopdev: false,
                transport: None,
                log_device: true,
                facts: listing
                    .variant_target("cairn-journal-2async")
                    .map(|v| v.facts),
            }
        );
        assert!(matches!(
            two("cairn-journal-2sync"),
            Kind::Cairn { ref mode, log_device: true, .. } if mode == "journal"
        ));
        // Without the listing, no variant: a mode of that name (which no build has).
        assert!(matches!(
            TargetSpec::parse("cairn-journal-2sync").unwrap().kind,
            Kind::Cairn {
                log_device: false,
                ..
            }
        ));
        assert_eq!(
            TargetSpec::parse("cairn-journal-group").unwrap().kind,
            Kind::Cairn {
                mode: "journal-group".into(),
                loopdev: false,
                transport: None,
                log_device: false,
                facts: None,
            }
        );
        assert!(TargetSpec::parse("cairn-async+pigeon").is_err());
        assert_eq!(TargetSpec::parse("xfs-logdev").unwrap().kind, Kind::Xfs);
        assert!(TargetSpec::parse("cairn-@loop").is_err());
        assert!(TargetSpec::parse("cairn-a/b").is_err());
        assert!(TargetSpec::parse("cairn-").is_err());
        assert_eq!(TargetSpec::parse("btrfs").unwrap().kind, Kind::Btrfs);
        assert!(TargetSpec::parse("zfs").is_err());
        // On a disk model: cairn targets only, known models only.
        let t = TargetSpec::parse_with("cairn-journal-2sync:cheetah-10k", &listing).unwrap();
        assert_eq!(t.disk.as_deref(), Some("cheetah-10k"));
        assert!(matches!(
            t.kind,
            Kind::Cairn {
                log_device: true,
                ..
            }
        ));
        assert_eq!(
            split_disk(&t.name),
            ("cairn-journal-2sync", Some("cheetah-10k"))
        );
        assert_eq!(on_disk("cairn-sync", "wren-iv"), "cairn-sync:wren-iv");
        assert!(TargetSpec::parse("cairn-sync:wren-iv:sstf").is_ok());
        assert!(TargetSpec::parse("ext4:cheetah-10k").is_err());
        assert!(TargetSpec::parse("cairn-sync:floppy").is_err());
        assert_eq!(
            disk_options(Some("wren-iv"), false),
            ",disk=wren-iv:nohostflush"
        );
        assert_eq!(
            disk_options(Some("wren-iv:sstf"), true),
            ",disk=wren-iv:sstf:nohostflush,log_disk=wren-iv:sstf:nohostflush"
        );
        assert_eq!(disk_options(None, true), "");
    }

    /// The floor is named once, takes a cairn target's transport, and says what it is: a
    /// cairn daemon (options, counters) whose files cannot outlive it, made cold without an
    /// unmount, and the only target whose cold says so.
    #[test]
    fn the_fuse_floor_is_a_cairn_daemon_made_cold_without_an_unmount() {
        let floor = TargetSpec::parse(FLOOR).unwrap();
        assert_eq!(floor.kind, Kind::Floor { transport: None });
        assert!(BASELINES.contains(&FLOOR));
        assert_eq!(
            TargetSpec::parse("fuse-floor+uring").unwrap().kind,
            Kind::Floor {
                transport: Some("uring".into())
            }
        );
        assert_eq!(
            TargetSpec::parse("fuse-floor+dev").unwrap().transport(),
            Some("dev")
        );
        for bad in [
            "fuse-floor+pigeon",
            "fuse-floor@loop",
            "fuse-floor:wren-iv",
            "fuse-floors",
        ] {
            assert!(TargetSpec::parse(bad).is_err(), "{bad}");
        }
        assert!(floor.cairn_daemon() && !floor.has_image());
        assert_eq!(floor.volatile(), Some(VOLATILE));
        assert_eq!(floor.cold_by(), Some(FLOOR_COLD));
        assert_eq!(
            TargetSpec::parse("fuse-floor+uring").unwrap().cold_by(),
            Some(FLOOR_COLD)
        );
        assert_eq!(floor.tools(), ["umount"]);
        let async_ = TargetSpec::parse("cairn-async+uring").unwrap();
        assert!(async_.cairn_daemon() && async_.has_image());
        assert_eq!(
            (async_.volatile(), async_.cold_by(), async_.transport()),
            (None, None, Some("uring"))
        );
        for t in ["ext4", "fuse2fs", "passthrough", "cairn-sync@loop"] {
            let spec = TargetSpec::parse(t).unwrap();
            assert!(spec.volatile().is_none() && spec.cold_by().is_none(), "{t}");
        }
        let ext4 = TargetSpec::parse("ext4").unwrap();
        assert!(!ext4.cairn_daemon());
        // Recorded as its kind, with the transport only when forced.
        assert_eq!(
            serde_json::to_value(&floor).unwrap(),
            serde_json::json!({"name": "fuse-floor", "kind": "floor"})
        );
    }

    /// As root, with a cairn binary built beside this test (`cargo build -p cairn-cli`): the
    /// floor mounts `cairn mount --memory`, counts FUSE requests, is made cold without losing
    /// its files (smallfile's read measured, every file looked up again through FUSE, the
    /// phase saying how it was made cold), refuses to be crashed, and leaves nothing mounted.
    #[test]
    fn the_fuse_floor_mounts_counts_and_reads_cold_through_fuse() {
        use crate::workload::{Stage, Workload};
        // target/<profile>/deps/<this test>: the cairn of this profile, else the release one.
        let profile = std::env::current_exe()
            .ok()
            .and_then(|p| Some(p.parent()?.parent()?.to_path_buf()));
        let cairn = profile.and_then(|dir| {
            [dir.join("cairn"), dir.join("../release/cairn")]
                .into_iter()
                .find(|p| p.is_file())
        });
        let (true, Some(cairn)) = (nix::unistd::geteuid().is_root(), cairn) else {
            eprintln!(
                "needs root and a cairn binary beside the test (cargo build -p cairn-cli); skipped"
            );
            return;
        };
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let env = Env {
            scratch: d.path().to_path_buf(),
            image_size: 64 << 20,
            cairn: cairn.display().to_string(),
            fuse_concurrency: None,
            mount_options: String::new(),
        };
        let spec = TargetSpec::parse(FLOOR).unwrap();
        let mut m = Mounted::setup(&spec, &env).unwrap();
        let mnt = m.mnt.clone();
        assert!(!m.image.exists(), "the floor has no image");
        let w = Workload::Smallfile {
            files: 50,
            size: 1024,
        };
        let phases = w.run(&mut m);
        // Made cold with a file in it: the daemon, and so the file, survive it.
        fs::write(m.dir().join("kept"), b"still here").unwrap();
        let daemon = sys::find_daemon(&mnt);
        let cold = m.make_cold();
        let kept = fs::read(m.dir().join("kept"));
        let same_daemon = sys::find_daemon(&mnt) == daemon;
        let crash = Stage::crash(&mut m);
        let skipped = std::mem::take(&mut m.skipped);
        let still_there = m.dir().is_dir();
        m.teardown().unwrap();
        assert!(sys::mounted_fstype(&mnt).is_none(), "left mounted");
        let phases = phases.unwrap();
        let names: Vec<&str> = phases.iter().map(|p| p.phase.as_str()).collect();
        assert_eq!(names, ["create", "read", "delete"]);
        assert!(skipped.is_empty(), "{skipped:?}");
        cold.unwrap();
        assert!(daemon.is_some() && same_daemon, "made cold by a remount");
        assert_eq!(kept.unwrap(), b"still here");
        // The read is the cold one, and says how; the others were not made cold.
        let how: Vec<Option<&str>> = phases.iter().map(|p| p.cold.as_deref()).collect();
        assert_eq!(how, [None, Some(FLOOR_COLD), None]);
        // Cold means past the kernel's caches: every file looked up again, through FUSE (a
        // read right after the creates would find their dentries, cached for a second).
        let lookups = phases[1].per_op(|c| c.0.get("fuse.requests.lookup").copied());
        assert!(
            lookups.is_some_and(|n| n >= 1.0),
            "{:?}",
            phases[1].counters
        );
        // cairn stats answers on the floor: the adapter's requests, a few per file.
        let fuse = phases[0].per_op(crate::counters::Counters::fuse_requests);
        assert!(fuse.is_some_and(|n| n >= 2.0), "{fuse:?}");
        // No round trip per file that cairn's modes do not make: the writeback cache off
        // (no setattr of the times), FLUSH answered ENOSYS once (the kernel stops sending
        // it), as they have them.
        let c = phases[0].counters.as_ref().unwrap();
        let n = |op: &str| c.0.get(op).copied().unwrap_or(0.0);
        assert_eq!(n("fuse.requests.setattr"), 0.0, "{c:?}");
        assert!(n("fuse.requests.flush") <= 1.0, "{c:?}");
        assert!(crash.is_err());
        assert!(still_there, "a refused crash must leave the mount alone");
    }

    #[test]
    fn the_runs_mount_options_stay_when_a_workload_adds_its_own() {
        assert_eq!(compose_options("", ""), "");
        assert_eq!(compose_options("cache=16M", ""), ",cache=16M");
        assert_eq!(compose_options("", ",syncer=600"), ",syncer=600");
        assert_eq!(
            compose_options("cache=16M", "syncer=600"),
            ",cache=16M,syncer=600"
        );
    }

    #[test]
    fn the_floor_mounts_with_a_cairn_modes_adapter_options() {
        assert_eq!(floor_options(&None, None), ",writeback_cache=no");
        assert_eq!(
            floor_options(&Some("uring".into()), Some(8)),
            ",writeback_cache=no,transport=uring,threads=8,uring_depth=8"
        );
    }

    #[test]
    fn mount_options_of_concurrent_workloads() {
        assert_eq!(concurrency_options(None), "");
        assert_eq!(concurrency_options(Some(8)), ",threads=8,uring_depth=8");
        // Capped at what `cairn mount` accepts.
        assert_eq!(concurrency_options(Some(32)), ",threads=32,uring_depth=16");
        assert_eq!(concurrency_options(Some(500)), ",threads=64,uring_depth=16");
        assert_eq!(concurrency_options(Some(0)), ",threads=1,uring_depth=1");
    }

    #[test]
    fn images_are_always_new_and_mkfs_is_forced_only_on_its_own_loop_device() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("fs.img");
        make_sparse(&img, 1 << 20).unwrap();
        assert_eq!(fs::metadata(&img).unwrap().len(), 1 << 20);
        // An image that exists already is never reused, let alone truncated.
        fs::write(&img, "someone's data").unwrap();
        assert!(make_sparse(&img, 1 << 20).is_err());
        assert_eq!(fs::read_to_string(&img).unwrap(), "someone's data");

        assert_eq!(cairn_mkfs_flags(false, false), [] as [&str; 0]);
        assert_eq!(cairn_mkfs_flags(false, true), ["--sparse"]);
        assert_eq!(cairn_mkfs_flags(true, false), ["--force"]);
        assert_eq!(cairn_mkfs_flags(true, true), ["--force"]);
    }
}
