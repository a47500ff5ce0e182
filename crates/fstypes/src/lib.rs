//! cairn-fstypes: the one registry of cairn's on-disk formats and their metadata-update
//! modes.
//!
//! Every tool that has to know "which formats and modes exist" asks here and nowhere else:
//! `cairn mkfs --format`, `cairn mount` (which format an image holds, which mode options it
//! takes), `cairn fsck` and `cairn inspect`, `cairn modes` (and `--json`, which the
//! benchmark reads without linking cairn's crates), the crash harness (every mode and what
//! it promises) and the real-mount test suites (every mode gets every suite). A second
//! format, or a new mode of an existing one, is one entry in its own crate plus one line
//! in [`types`]; none of those tools change.
//!
//! Layering: this crate sits above the formats and the checker (it has to construct mounts
//! and run checks) and below the command and the tools. The vocabulary of guarantees is in
//! `cairn_vfs::modes`, so a format can declare its modes without depending on this crate.

use std::path::Path;
use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_blockdev::disk::DiskOptions;

use cairn_fsck::{CheckOptions, FsckError, Report};
use cairn_vfs::modes::{AfterCrash, Facts, LogPlacement, ModeSpec, Recovery};
use cairn_vfs::options::OptionSpec;
use cairn_vfs::{Errno, FileSystem, FsError};

/// Mount options a format understands, as `(key, value)` pairs from `-o` (the FUSE
/// adapter's own options already taken out). `mode=` is among them.
pub type Options = [(String, Option<String>)];

/// Mounts an image with the format's options, read-only or not.
pub type MountFn = fn(&Path, &Options, bool) -> Result<Arc<dyn FileSystem>, FsError>;

/// An on-disk format.
pub struct FsType {
    /// `cairn mkfs --format NAME`.
    pub name: &'static str,
    pub description: &'static str,
    /// How many leading bytes [`FsType::probe`] needs.
    pub probe_bytes: usize,
    /// Whether an image's leading bytes hold this format (its magic number).
    pub probe: fn(&[u8]) -> bool,
    /// The metadata-update modes, the default first.
    pub modes: fn() -> Vec<ModeSpec>,
    /// The format's own mount options (each mode lists its own), for `cairn help mount`;
    /// [`DISK`] applies to every format.
    pub options: &'static [OptionSpec],
    /// Checks one mount option on its own: a key the format (or one of its modes) parses,
    /// with a value it accepts where that does not depend on the other options. The command
    /// uses it to drop bad options one by one under `mount -s`.
    pub check_option: fn(&str, Option<&str>) -> Result<(), String>,
    /// Checks the mount options as a whole (unknown keys, bad values, a mode's own options
    /// against the mode chosen, in any order) without mounting: the command does this
    /// before it daemonizes, so a typo is reported at once.
    pub check_options: fn(&Options, read_only: bool) -> Result<(), String>,
    /// Creates a file system on an image file or device.
    pub mkfs: fn(&Path, &MkfsArgs) -> Result<(), FsError>,
    /// Mounts the image (taking its lock: see `cairn_blockdev::lock`).
    pub mount: MountFn,
    /// Checks (and with `repair`, repairs) the image, as `cairn fsck`.
    pub check: fn(&Path, CheckOptions) -> Result<Report, FsckError>,
    /// The same on a block device, for tools that build images in memory (the crash
    /// harness records a format through these, and checks every crash state with them).
    pub device: DeviceOps,
    /// `cairn inspect IMG WHAT…` for this format; `None`: the FFS inspector of crates/fsck.
    pub inspect: Option<InspectFn>,
    /// Every state a crash leaves is, after the mount's own recovery, the file system as
    /// some prefix of the calls left it, no shorter than the calls returned before the
    /// last returned fsync or sync (a single log, replayed up to its last committed flush,
    /// where an fsync commits everything before it: 004 §4.2). The crash harness holds a
    /// format that says so to it.
    pub crash_prefix: bool,
}

/// Mounts a device with the format's options, as [`DeviceMount`] says.
pub type DeviceMountFn =
    fn(Arc<dyn BlockDevice>, &Options, DeviceMount) -> Result<Arc<dyn FileSystem>, FsError>;

/// Shows one structure of an image as text (`cairn inspect`).
pub type InspectFn = fn(&Path, &[String]) -> Result<String, cairn_fsck::inspect::InspectError>;

/// How [`DeviceOps::mount`] mounts.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceMount {
    pub read_only: bool,
    /// Run the format's background writers (syncer, cleaner, checkpoint timer). A
    /// recording turns them off: their writes would land at time-dependent points.
    pub background: bool,
}

/// A format on a block device rather than an image path.
pub struct DeviceOps {
    /// Makes a file system on `dev` (`MkfsArgs::size`, `force` and `sparse` are ignored:
    /// the device is the size).
    pub mkfs: fn(Arc<dyn BlockDevice>, &MkfsArgs) -> Result<(), FsError>,
    /// Mounts `dev` with the format's options (`mode=` among them).
    pub mount: DeviceMountFn,
    /// Checks `dev` without changing it (findings classed as corruption or leak), after
    /// whatever the format's read-only mount recovers in memory.
    pub check: fn(Arc<dyn BlockDevice>) -> Result<Report, FsckError>,
}

/// What `cairn mkfs` was asked, for any format.
#[derive(Clone, Debug, Default)]
pub struct MkfsArgs {
    pub size: Option<u64>,
    pub block_size: Option<u32>,
    pub inodes: Option<u64>,
    pub label: String,
    pub force: bool,
    pub sparse: bool,
    /// Bytes of a journal log area (`--journal-size`), taken from the end of the size;
    /// `None`: the format's default (FFS: about 1%), `Some(0)`: none.
    pub journal_size: Option<u64>,
    /// Bytes per segment (log-structured formats; others refuse it).
    pub segment_size: Option<u64>,
}

/// Every format this build knows, the default (`mkfs` without `--format`) first.
pub fn types() -> &'static [&'static FsType] {
    static TYPES: [&FsType; 2] = [&FFS, &LFS];
    &TYPES
}

/// Every format this build can make, mount and check: [`types`] and any format not yet in
/// the default iteration (none at present: a new format sits here until the real-mount
/// suites, the crash campaign and the benchmark pass on it). `mkfs --format`, mount's
/// probe, fsck and inspect look here; the tools that run every mode (`cairn modes`, the
/// crash harness, the test suites, the benchmark) iterate [`types`] only.
pub fn all_types() -> &'static [&'static FsType] {
    types()
}

/// The FFS-style format: for the tools that drive its engine through its strategies (the
/// crash harness records FFS modes, planted bugs among them, that way).
pub fn ffs() -> &'static FsType {
    &FFS
}

/// The format called `name`.
pub fn by_name(name: &str) -> Option<&'static FsType> {
    all_types().iter().copied().find(|t| t.name == name)
}

/// The format whose magic starts `head`.
pub fn probe(head: &[u8]) -> Option<&'static FsType> {
    all_types().iter().copied().find(|t| (t.probe)(head))
}

/// The format of the image at `path`, or a one-line refusal: "not a cairn file system".
pub fn probe_path(path: &Path) -> Result<&'static FsType, FsError> {
    let want = all_types()
        .iter()
        .map(|t| t.probe_bytes)
        .max()
        .unwrap_or(512);
    let head = read_head(path, want)?;
    probe(&head).ok_or_else(|| {
        FsError::Refused(
            Errno::EINVAL,
            format!(
                "{}: not a cairn file system (no {} superblock at its start)",
                path.display(),
                all_types()
                    .iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        )
    })
}

/// Up to `len` leading bytes of a file or device (fewer if it is shorter).
fn read_head(path: &Path, len: usize) -> Result<Vec<u8>, FsError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| {
        FsError::Refused(
            Errno(e.raw_os_error().unwrap_or(Errno::EIO.0)),
            format!("cannot open {}: {e}", path.display()),
        )
    })?;
    let mut head = Vec::with_capacity(len);
    f.take(len as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// One mode of one format, as the tools iterate them.
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    pub fs: &'static FsType,
    pub spec: ModeSpec,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        self.spec.name
    }

    /// The benchmark's and the crash harness's name for a mount in this mode.
    pub fn target(&self) -> String {
        format!("cairn-{}", self.spec.name)
    }

    /// Whether an image left by a crash must be repaired by fsck before it is mounted.
    pub fn needs_fsck_after_crash(&self) -> bool {
        self.spec.guarantees.after_crash == AfterCrash::Fsck
    }

    pub fn facts(&self) -> Facts {
        self.spec.facts
    }

    /// `cairn modes --json`: one object per mode.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": self.fs.name,
            "mode": self.spec.name,
            "target": self.target(),
            "description": self.spec.description,
            "after_crash": self.spec.guarantees.after_crash,
            "mount_options": format!("mode={}", self.spec.name),
            "options": self.spec.options,
            "guarantees": self.spec.guarantees,
            "facts": self.spec.facts,
            // The times a mount keeps, in whole seconds (fstests' timestamp range).
            "time_range": [cairn_vfs::TIME_MIN_SECS, cairn_vfs::TIME_MAX_SECS],
        })
    }
}

/// One `-o key[=value]`.
pub type MountOption = (String, Option<String>);

/// A variant of a registered mode: the same mode and the same promises, on an image made
/// or mounted with options the plain mode's runs seldom reach (a journal with its log on a
/// device of its own, LFS with the cleaner running after most flushes). The crash harness
/// records each (`cairn crash run --modes NAME`) and the benchmark runs the ones with a log
/// device as targets of their own (`cairn-NAME`), both from this list.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub name: &'static str,
    /// The registered mode it runs.
    pub base: &'static str,
    pub description: &'static str,
    /// Where its log lives: [`LogPlacement::Device`] for a second device (`log=dev:PATH`),
    /// otherwise its base's placement.
    pub log: LogPlacement,
    /// mkfs's arguments for its image.
    pub mkfs: fn() -> MkfsArgs,
    /// Mount options beyond `mode=` and `log=`, given the freshly made device.
    pub options: fn(&dyn BlockDevice) -> Vec<MountOption>,
}

impl Variant {
    /// The registered mode it runs (every variant's base is one: the registry's tests).
    pub fn base(&self) -> Option<Mode> {
        mode(self.base)
    }

    /// Its base's facts, with its own log placement.
    pub fn facts(&self) -> Option<Facts> {
        self.base().map(|b| Facts {
            log: self.log,
            ..b.spec.facts
        })
    }

    /// The benchmark's name for it.
    pub fn target(&self) -> String {
        format!("cairn-{}", self.name)
    }

    /// `cairn modes --json`: one object per variant, keyed `variant` (not `mode`: it is no
    /// value of `-o mode=`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "variant": self.name,
            "base": self.base,
            "target": self.target(),
            "description": self.description,
            "facts": self.facts(),
        })
    }
}

fn no_mount_options(_: &dyn BlockDevice) -> Vec<MountOption> {
    Vec::new()
}

/// Every variant, in listing order.
pub fn variants() -> &'static [Variant] {
    static VARIANTS: [Variant; 5] = [
        Variant {
            name: "journal-2sync",
            base: "journal",
            description: "mode journal (commit=sync) with log=dev: its log on a second device (001's LFFS-wafs-2sync)",
            log: LogPlacement::Device,
            mkfs: MkfsArgs::default,
            options: no_mount_options,
        },
        Variant {
            name: "journal-2async",
            base: "journal-async",
            description: "mode journal-async (commit=async) with log=dev: its log on a second device (001's LFFS-wafs-2async)",
            log: LogPlacement::Device,
            mkfs: MkfsArgs::default,
            options: no_mount_options,
        },
        Variant {
            name: "journal-2group",
            base: "journal-group",
            description: "mode journal-group (commit=group) with log=dev: concurrent calls share the log device's flushes",
            log: LogPlacement::Device,
            mkfs: MkfsArgs::default,
            options: no_mount_options,
        },
        Variant {
            name: "lfs-cleaning",
            base: "lfs",
            description: "lfs on 64 KiB segments with the cleaner's thresholds a few segments below the total: the cleaner runs (and checkpoints) after most flushes, so states fall inside cleaning passes (004 §3.3: a crash during cleaning loses nothing)",
            log: LogPlacement::Whole,
            mkfs: || MkfsArgs {
                segment_size: Some(64 << 10),
                label: "crash".into(),
                ..Default::default()
            },
            options: lfs_cleaning_options,
        },
        Variant {
            name: "lfs-background",
            base: "lfs",
            description: "lfs-cleaning with the cleaner's passes run as a mount runs them in the background — several lock holds, the pass's room reserved between them, partial segments written after each hold, the inode map written ahead, the checkpoint's device writes without the lock — on the calling thread after each operation: states fall inside background passes",
            log: LogPlacement::Whole,
            mkfs: || MkfsArgs {
                segment_size: Some(64 << 10),
                label: "crash".into(),
                ..Default::default()
            },
            options: lfs_background_options,
        },
    ];
    &VARIANTS
}

/// The variant called `name`.
pub fn variant(name: &str) -> Option<&'static Variant> {
    variants().iter().find(|v| v.name == name)
}

/// `clean_start` 6 and `clean_stop` 3 segments below the image's segment count.
fn lfs_cleaning_options(dev: &dyn BlockDevice) -> Vec<MountOption> {
    let mut b = vec![0u8; dev.block_size() as usize];
    let segments = dev
        .read_blocks(0, &mut b)
        .ok()
        .and_then(|_| cairn_lfs::format::superblock::Superblock::decode(&b, dev.num_blocks()).ok())
        .map_or(0, |sb| sb.segments);
    if segments < 16 {
        return Vec::new();
    }
    vec![
        ("clean_start".into(), Some((segments - 6).to_string())),
        ("clean_stop".into(), Some((segments - 3).to_string())),
    ]
}

/// [`lfs_cleaning_options`] with the background passes run inline
/// (`cairn_lfs::INLINE_BACKGROUND_KEY`): a device mount without background writers
/// (`DeviceMount::background` false, as a recording mounts) has no syncer to run them.
fn lfs_background_options(dev: &dyn BlockDevice) -> Vec<MountOption> {
    let mut o = lfs_cleaning_options(dev);
    o.push((cairn_lfs::INLINE_BACKGROUND_KEY.into(), None));
    o
}

/// The facts of a registered mode or variant.
pub fn facts_of(name: &str) -> Option<Facts> {
    mode(name)
        .map(|m| m.spec.facts)
        .or_else(|| variant(name).and_then(Variant::facts))
}

impl std::fmt::Debug for FsType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsType").field("name", &self.name).finish()
    }
}

/// Every mode of every format, in listing order. Mode names are unique across formats, so
/// `-o mode=NAME` alone names one.
pub fn modes() -> Vec<Mode> {
    types()
        .iter()
        .flat_map(|&fs| (fs.modes)().into_iter().map(move |spec| Mode { fs, spec }))
        .collect()
}

/// The mode called `name`, with its format.
pub fn mode(name: &str) -> Option<Mode> {
    modes().into_iter().find(|m| m.spec.name == name)
}

// ---- a mechanical disk under any format (`-o disk=`) ----------------------------------

/// The mount option every format takes: the image's device under a model of a mechanical
/// disk (`disk=NAME[:opt...]`, docs/DISKS.md). The registry takes it out of the options and
/// wraps the device it opens, so no format has to know the option; a journal's own log
/// device has the journal's `log_disk=`.
const DISK_OPTION: &str = "disk";

/// `disk=MODEL`, which every format takes: the image under a model of a mechanical disk.
pub const DISK: OptionSpec = OptionSpec {
    key: DISK_OPTION,
    values: "MODEL[:opt...]",
    default: "",
    help: "serve the image through a model of a mechanical disk (seek, rotation, transfer, and their options: docs/DISKS.md), to measure as the papers' disks would",
};

/// Mount options as the formats take them, owned.
type OwnedOptions = Vec<(String, Option<String>)>;

/// `disk=`, parsed, and the options without it.
fn split_disk(opts: &Options) -> Result<(Option<DiskOptions>, OwnedOptions), String> {
    let mut disk = None;
    let mut rest = Vec::with_capacity(opts.len());
    for (k, v) in opts {
        if k == DISK_OPTION {
            disk = Some(check_disk(v.as_deref())?);
        } else {
            rest.push((k.clone(), v.clone()));
        }
    }
    Ok((disk, rest))
}

fn check_disk(value: Option<&str>) -> Result<DiskOptions, String> {
    DiskOptions::parse(value.ok_or("option 'disk' needs a disk model (e.g. disk=cheetah-10k)")?)
}

/// `dev` under the disk `disk=` asks for, if any (a device mount: the crash harness's,
/// `cairn mount -o record=`).
fn on_disk(
    dev: Arc<dyn BlockDevice>,
    disk: Option<&DiskOptions>,
) -> Result<Arc<dyn BlockDevice>, FsError> {
    cairn_blockdev::disk::wrap(dev, disk)
        .map_err(|e| FsError::Refused(Errno::EINVAL, e.to_string()))
}

fn refused(e: String) -> FsError {
    FsError::Refused(Errno::EINVAL, e)
}

// ---- the FFS-style format -------------------------------------------------------------

static FFS: FsType = FsType {
    name: "ffs",
    description: "the FFS-style format (cylinder groups, bitmaps, block-mapped inodes): FFS sync and async, soft updates, and journaling with three commit policies",
    probe_bytes: cairn_ffs::format::superblock::SB_BYTES,
    probe: cairn_ffs::format::superblock::has_magic,
    modes: || cairn_ffs::modes().iter().map(|m| m.spec()).collect(),
    options: cairn_ffs::OPTIONS,
    check_option: ffs_check_option,
    check_options: ffs_check_options,
    mkfs: ffs_mkfs,
    mount: ffs_mount,
    check: ffs_check,
    device: DeviceOps {
        mkfs: ffs_mkfs_device,
        mount: ffs_mount_device,
        check: |dev| cairn_fsck::check(&*dev, CheckOptions::default()),
    },
    crash_prefix: false,
    inspect: None,
};

/// The options as the engine takes them, each key known to the format or one of its
/// modes (the mode's own are checked against the mode at mount: `MountOptions::check`).
fn ffs_options(opts: &Options, read_only: bool) -> Result<cairn_ffs::MountOptions, String> {
    let mut o = cairn_ffs::MountOptions {
        read_only,
        ..Default::default()
    };
    for (k, v) in opts {
        o.set(k, v.as_deref())?;
    }
    Ok(o)
}

fn ffs_check_option(key: &str, value: Option<&str>) -> Result<(), String> {
    if key == DISK_OPTION {
        return check_disk(value).map(|_| ());
    }
    cairn_ffs::MountOptions::default().set(key, value)
}

fn ffs_check_options(opts: &Options, read_only: bool) -> Result<(), String> {
    ffs_options(&split_disk(opts)?.1, read_only)?.check()
}

fn ffs_mkfs(path: &Path, a: &MkfsArgs) -> Result<(), FsError> {
    if a.segment_size.is_some() {
        return Err(FsError::Refused(
            Errno::EINVAL,
            "--segment-size is for log-structured formats (--format lfs)".into(),
        ));
    }
    let defaults = cairn_ffs::MkfsOptions::default();
    let block_size = a.block_size.unwrap_or(defaults.block_size);
    // A log area unless told otherwise (`--journal-size 0`: none), so that any image can be
    // mounted in a journal mode: about 1% of the size (cairn_ffs::default_journal_size).
    let journal_size = match a.journal_size {
        Some(j) => Some(j),
        None => a
            .size
            .or_else(|| image_bytes(path))
            .and_then(|b| cairn_ffs::default_journal_size(b, block_size)),
    };
    cairn_ffs::mkfs(
        path,
        &cairn_ffs::MkfsOptions {
            size: a.size,
            block_size,
            inodes: a.inodes,
            label: a.label.clone(),
            force: a.force,
            sparse: a.sparse,
            journal_size,
            ..defaults
        },
    )
}

/// The size of an existing image file or block device (`None`: missing or empty).
fn image_bytes(path: &Path) -> Option<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(SeekFrom::End(0)).ok().filter(|&n| n > 0)
}

/// `cairn fsck` on an FFS image. An image a journaled mount left uncleanly has calls in its
/// log that its home locations may show only in part, and a repair of those would take
/// back calls the log made durable: `-y` first replays the log (the mode's own recovery: a
/// read-write journaled mount, which also frees its orphans) and then checks; a check
/// without `-y` writes nothing, so it checks the image as the replay would leave it (in
/// memory) and says so. The log must be the image's log area: a journal with its log on
/// another device is replayed by mounting it (`mode=journal,log=dev:PATH`).
fn ffs_check(path: &Path, opts: CheckOptions) -> Result<Report, FsckError> {
    use cairn_ffs::format::Superblock;
    let sb = read_head(path, cairn_ffs::format::superblock::SB_BYTES)
        .ok()
        .and_then(|h| Superblock::decode(&h).ok());
    let Some((sb, mode)) = sb.and_then(|sb| log_replay_mode(&sb).map(|m| (sb, m))) else {
        return cairn_fsck::check_path(path, opts);
    };
    if sb.journal_area().ok().flatten().is_none() {
        return check_with_log_elsewhere(path, &sb.last_mode, opts);
    }
    if opts.repair && !opts.force {
        return replay_then_repair(path, mode, opts);
    }
    check_as_replayed(path, sb.block_size, opts)
}

/// The mode whose recovery replays the log a crash left in `sb`'s image: the registered
/// log-replay mode it was last mounted in (`needs_replay` matches it exactly). `None`:
/// nothing to replay.
fn log_replay_mode(sb: &cairn_ffs::format::Superblock) -> Option<&'static str> {
    if !cairn_ffs::strategy::journal::needs_replay(sb) {
        return None;
    }
    mode(&sb.last_mode)
        .filter(|m| m.spec.facts.recovery == Recovery::LogReplay)
        .map(|m| m.spec.name)
}

/// A check of an image whose log is on another device: the log cannot be replayed from
/// here, and a repair would take back calls it made durable.
fn check_with_log_elsewhere(
    path: &Path,
    last_mode: &str,
    opts: CheckOptions,
) -> Result<Report, FsckError> {
    let msg = format!(
        "the file system was left mounted in mode '{last_mode}' with its log on another device: \
         mount it read-write in that mode (log=dev:PATH) to replay the log first"
    );
    if opts.repair {
        return Err(FsckError::Unusable(format!(
            "{msg}; a repair now would take back calls the log made durable"
        )));
    }
    log::warn!("{msg}; checking the file system as it is");
    cairn_fsck::check_path(path, opts)
}

/// `fsck -y`: the mode's own recovery (a read-write mount, which replays the log and frees
/// its orphans), then the check and repair.
fn replay_then_repair(path: &Path, mode: &str, opts: CheckOptions) -> Result<Report, FsckError> {
    let o = cairn_ffs::MountOptions {
        mode: mode.to_string(),
        read_only: false,
        // The crash left the superblock "mounted": the journal recovers it itself.
        force: true,
        ..Default::default()
    };
    match cairn_ffs::Ffs::mount(path, &o).and_then(|fs| fs.unmount()) {
        Ok(()) => log::warn!("replayed the journal's log before the check"),
        Err(FsError::Refused(Errno::EBUSY, m)) => {
            return Err(FsckError::Busy(format!(
                "{m}: refusing to repair a mounted file system (unmount it first)"
            )));
        }
        Err(e) => log::warn!(
            "the journal's log cannot be replayed ({e}): repairing the file system as it is"
        ),
    }
    cairn_fsck::check_path(path, opts)
}

/// A check only: the replay in memory, over the image opened read-only.
fn check_as_replayed(
    path: &Path,
    block_size: u32,
    opts: CheckOptions,
) -> Result<Report, FsckError> {
    let lock = if opts.force {
        cairn_blockdev::Lock::None
    } else {
        cairn_blockdev::Lock::Shared
    };
    let dev = match cairn_blockdev::FileDevice::open_with(path, block_size, true, lock) {
        Ok(d) => Arc::new(d) as Arc<dyn BlockDevice>,
        // The check's own open says what is wrong, in its words.
        Err(_) => return cairn_fsck::check_path(path, opts),
    };
    match cairn_ffs::strategy::journal::replay_view(dev.clone()) {
        Ok(Some((view, st))) => {
            log::warn!(
                "the journal's log holds {} operations not yet replayed: checking the file system \
                 as their replay leaves it (`cairn fsck -y` or a read-write mount replays them)",
                st.ops
            );
            cairn_fsck::check(view.as_ref(), opts)
        }
        Ok(None) => cairn_fsck::check(dev.as_ref(), opts),
        Err(e) => {
            log::warn!("the journal's log cannot be read ({e}): checking the file system as it is");
            cairn_fsck::check(dev.as_ref(), opts)
        }
    }
}

fn ffs_mkfs_device(dev: Arc<dyn BlockDevice>, a: &MkfsArgs) -> Result<(), FsError> {
    let defaults = cairn_ffs::MkfsOptions::default();
    cairn_ffs::mkfs_device(
        &*dev,
        &cairn_ffs::MkfsOptions {
            block_size: dev.block_size(),
            inodes: a.inodes,
            label: a.label.clone(),
            // As `ffs_mkfs`: a log area of about 1% unless told otherwise.
            journal_size: a.journal_size.or_else(|| {
                cairn_ffs::default_journal_size(
                    dev.num_blocks() * dev.block_size() as u64,
                    dev.block_size(),
                )
            }),
            ..defaults
        },
    )
}

fn ffs_mount_device(
    dev: Arc<dyn BlockDevice>,
    opts: &Options,
    how: DeviceMount,
) -> Result<Arc<dyn FileSystem>, FsError> {
    let (disk, opts) = split_disk(opts).map_err(refused)?;
    let dev = on_disk(dev, disk.as_ref())?;
    let mut o = ffs_options(&opts, how.read_only).map_err(refused)?;
    if !how.background {
        // A day: never within a recording.
        o.syncer_interval = Some(std::time::Duration::from_secs(24 * 3600));
    }
    Ok(cairn_ffs::Ffs::mount_device(dev, &o)?)
}

fn ffs_mount(path: &Path, opts: &Options, read_only: bool) -> Result<Arc<dyn FileSystem>, FsError> {
    let (disk, opts) = split_disk(opts).map_err(refused)?;
    let o = ffs_options(&opts, read_only).map_err(refused)?;
    Ok(cairn_ffs::Ffs::mount_on(path, &o, disk.as_ref())?)
}

// ---- the log-structured format (004, Sprite LFS) ---------------------------------------

/// LFS's one mode: what a crash leaves after roll-forward (004 §4). The crash harness holds
/// it to this and, through [`FsType::crash_prefix`], to a prefix of the calls: roll-forward
/// applies whole flushes, each written at an operation boundary, and an fsync is one
/// committed flush of everything dirty followed by a device flush. No leaks: a flush carries
/// every inode, block and usage change of the calls before it, and a file unlinked while a
/// program held it open when the system stopped (its inode, with no link, still in the
/// inode map: the crash workload `unlink-open`) is named by the checkpoint's orphan list or
/// found by roll-forward, so the next read-write mount frees it; the check counts it as
/// pending, not as a leak.
const LFS_MODES: [ModeSpec; 1] = [ModeSpec {
    name: "lfs",
    description: "log-structured (Sprite LFS): everything written sequentially in a log of segments; checkpoints and roll-forward",
    guarantees: cairn_vfs::modes::Guarantees {
        metadata_on_return: false,
        fsync_data_first: true,
        no_stale_data: true,
        names_kept: true,
        corrupt: cairn_vfs::modes::Allowed::Never,
        leak: cairn_vfs::modes::Allowed::Never,
        interrupted_rename: cairn_vfs::modes::Allowed::Never,
        after_crash: AfterCrash::Recover,
        basis: "004 §4: checkpoints and roll-forward to the last committed flush; every state a prefix of the calls, every returned fsync durable; no leaks (files unlinked while open are in the checkpoint's orphan list or rolled forward, and the next mount frees them)",
    },
    facts: cairn_vfs::modes::Facts {
        family: cairn_vfs::modes::Family::LogStructured,
        commit: cairn_vfs::modes::Commit::Async,
        recovery: cairn_vfs::modes::Recovery::RollForward,
        log: cairn_vfs::modes::LogPlacement::Whole,
    },
    options: &[],
}];

/// In [`types`]: every real-mount suite, the crash campaign and the benchmark run it.
static LFS: FsType = FsType {
    name: "lfs",
    description: "the log-structured format (Sprite LFS, 004): segments, inode map, usage table, checkpoints, roll-forward",
    probe_bytes: cairn_lfs::format::superblock::SB_BYTES,
    probe: cairn_lfs::format::superblock::has_magic,
    modes: || LFS_MODES.to_vec(),
    options: cairn_lfs::OPTIONS,
    check_option: lfs_check_option,
    check_options: lfs_check_options,
    mkfs: lfs_mkfs,
    mount: lfs_mount,
    check: lfs_check,
    device: DeviceOps {
        mkfs: lfs_mkfs_device,
        mount: lfs_mount_device,
        check: lfs_check_device,
    },
    crash_prefix: true,
    inspect: Some(lfs_inspect),
};

fn lfs_inspect(path: &Path, what: &[String]) -> Result<String, cairn_fsck::inspect::InspectError> {
    use cairn_fsck::inspect::InspectError as E;
    cairn_lfs::inspect::inspect_path(path, what).map_err(|e| match e {
        cairn_lfs::inspect::InspectError::Open(e) => E::Open(lfs_error(e)),
        cairn_lfs::inspect::InspectError::Usage(m) => E::Usage(m),
        cairn_lfs::inspect::InspectError::NotFound(m) => E::NotFound(m),
    })
}

/// The engine's options from `opts`: the `-o` options, and with `device` (a tool's mount
/// of a device, `Variant::options`) the keys only a variant gives
/// (`MountOptions::set_for_device`).
fn lfs_options(
    opts: &Options,
    read_only: bool,
    device: bool,
) -> Result<cairn_lfs::MountOptions, String> {
    let mut o = cairn_lfs::MountOptions {
        read_only,
        ..Default::default()
    };
    for (k, v) in opts {
        if device {
            o.set_for_device(k, v.as_deref())?;
        } else {
            o.set(k, v.as_deref())?;
        }
    }
    Ok(o)
}

fn lfs_check_option(key: &str, value: Option<&str>) -> Result<(), String> {
    if key == DISK_OPTION {
        return check_disk(value).map(|_| ());
    }
    cairn_lfs::MountOptions::default().set(key, value)
}

fn lfs_check_options(opts: &Options, read_only: bool) -> Result<(), String> {
    lfs_options(&split_disk(opts)?.1, read_only, false).map(|_| ())
}

fn lfs_mkfs(path: &Path, a: &MkfsArgs) -> Result<(), FsError> {
    if a.journal_size.is_some() {
        return Err(FsError::Refused(
            Errno::EINVAL,
            "--journal-size is for the FFS format's journal (the lfs format is its own log)".into(),
        ));
    }
    if a.block_size.is_some_and(|b| b != 4096) {
        return Err(FsError::Refused(
            Errno::EINVAL,
            "the lfs format uses 4096-byte blocks".into(),
        ));
    }
    cairn_lfs::mkfs(path, &lfs_mkfs_options(a))
}

fn lfs_mkfs_options(a: &MkfsArgs) -> cairn_lfs::MkfsOptions {
    let d = cairn_lfs::MkfsOptions::default();
    cairn_lfs::MkfsOptions {
        size: a.size,
        segment_size: a.segment_size.unwrap_or(d.segment_size),
        inodes: a.inodes,
        label: a.label.clone(),
        force: a.force,
        sparse: a.sparse,
    }
}

fn lfs_mkfs_device(dev: Arc<dyn BlockDevice>, a: &MkfsArgs) -> Result<(), FsError> {
    cairn_lfs::mkfs_device(dev, &lfs_mkfs_options(a))
}

fn lfs_mount_device(
    dev: Arc<dyn BlockDevice>,
    opts: &Options,
    how: DeviceMount,
) -> Result<Arc<dyn FileSystem>, FsError> {
    let (disk, opts) = split_disk(opts).map_err(refused)?;
    let dev = on_disk(dev, disk.as_ref())?;
    let mut o = lfs_options(&opts, how.read_only, true).map_err(refused)?;
    o.syncer = how.background;
    Ok(cairn_lfs::Lfs::mount_device(dev, &o)?)
}

fn lfs_check_device(dev: Arc<dyn BlockDevice>) -> Result<Report, FsckError> {
    lfs_report(cairn_lfs::check::check_device(dev))
}

fn lfs_mount(path: &Path, opts: &Options, read_only: bool) -> Result<Arc<dyn FileSystem>, FsError> {
    let (disk, opts) = split_disk(opts).map_err(refused)?;
    let o = lfs_options(&opts, read_only, false).map_err(refused)?;
    Ok(cairn_lfs::Lfs::mount_on(path, &o, disk.as_ref())?)
}

/// `cairn fsck` on an LFS image: the engine's check, in fsck's report. With `-y`, the LFS
/// repair (`cairn_lfs::check::repair_path`): the roll-forward made durable, the usage
/// table and link counts recounted, inodes with no name and no link freed; anything else
/// is left, with one finding saying why the image was not repaired (exit 4).
fn lfs_check(path: &Path, opts: CheckOptions) -> Result<Report, FsckError> {
    if !opts.repair {
        return lfs_report(cairn_lfs::check::check_path(path));
    }
    let r = cairn_lfs::check::repair_path(path).map_err(lfs_error)?;
    let mut rep = lfs_report(Ok(r.before.clone()))?;
    let left: std::collections::HashSet<&str> = r
        .after
        .findings
        .iter()
        .map(|f| f.message.as_str())
        .collect();
    for f in &mut rep.findings {
        f.fixed = !left.contains(f.message.as_str());
    }
    rep.fixed = rep.findings.iter().filter(|f| f.fixed).count();
    rep.repaired = r.wrote;
    if let Some(why) = r.refused {
        rep.findings.push(cairn_fsck::Finding {
            class: cairn_fsck::Class::Corruption,
            pass: cairn_fsck::Pass::Inodes,
            kind: cairn_fsck::Kind::Other,
            message: format!("not repaired: {why}"),
            fixed: false,
        });
    }
    Ok(rep)
}

fn lfs_error(e: FsError) -> FsckError {
    match e {
        FsError::Refused(Errno::EBUSY, m) => FsckError::Busy(m),
        FsError::Refused(_, m) => FsckError::NotCairn(m),
        FsError::Io(e) if e.kind() == std::io::ErrorKind::ResourceBusy => {
            FsckError::Busy(e.to_string())
        }
        FsError::Io(e) => FsckError::Io(e),
        e => FsckError::Unusable(e.to_string()),
    }
}

/// The engine's check in fsck's report.
fn lfs_report(r: Result<cairn_lfs::check::CheckReport, FsError>) -> Result<Report, FsckError> {
    use cairn_fsck::{Class, Finding, Kind, Pass, Stats};
    let r = r.map_err(lfs_error)?;
    Ok(Report {
        findings: r
            .findings
            .iter()
            .map(|f| Finding {
                class: if f.leak {
                    Class::Leak
                } else {
                    Class::Corruption
                },
                pass: Pass::Inodes,
                kind: Kind::Other,
                message: f.message.clone(),
                fixed: false,
            })
            .collect(),
        fixed: 0,
        stats: Stats {
            block_size: 4096,
            groups: r.segments as u64,
            blocks_total: r.total_blocks,
            blocks_used: r.live_blocks,
            inodes_total: 0,
            inodes_used: r.inodes,
            files: r.files,
            dirs: r.dirs,
            symlinks: r.symlinks,
            specials: r.specials,
        },
        backup_superblock: None,
        repaired: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names_are_unique_and_every_mode_is_found() {
        let all = modes();
        assert!(all.iter().any(|m| m.name() == "sync"));
        assert!(all.iter().any(|m| m.name() == "async"));
        for m in &all {
            assert_eq!(mode(m.name()).unwrap().fs.name, m.fs.name);
            assert_eq!(all.iter().filter(|x| x.name() == m.name()).count(), 1);
        }
        assert!(mode("turbo").is_none());
        assert_eq!(by_name("ffs").unwrap().name, "ffs");
    }

    /// Every registered mode's and variant's facts agree with each other and with its
    /// promises, and a variant runs a registered mode of its format.
    #[test]
    fn every_mode_and_variant_declares_consistent_facts() {
        for m in modes() {
            let f = m.facts();
            f.check(&m.spec.guarantees)
                .unwrap_or_else(|e| panic!("mode {}: {e}", m.name()));
            // A mode whose log lives beside the file system says where (its `log=` option).
            let log_option = m.spec.options.iter().any(|o| o.key == "log");
            assert_eq!(
                log_option,
                matches!(f.log, LogPlacement::Area | LogPlacement::Device),
                "mode {}: a log beside the file system and a log= option go together",
                m.name()
            );
            assert_eq!(
                m.needs_fsck_after_crash(),
                f.recovery == Recovery::None && m.spec.guarantees.after_crash == AfterCrash::Fsck
            );
        }
        for v in variants() {
            let b = v
                .base()
                .unwrap_or_else(|| panic!("variant {}: no mode {}", v.name, v.base));
            assert!(mode(v.name).is_none(), "variant {} shadows a mode", v.name);
            let f = v.facts().unwrap();
            f.check(&b.spec.guarantees)
                .unwrap_or_else(|e| panic!("variant {}: {e}", v.name));
            if v.log == LogPlacement::Device {
                assert!(
                    b.spec.options.iter().any(|o| o.key == "log"),
                    "variant {}: a log device needs a base that takes log=",
                    v.name
                );
            }
            assert_eq!(facts_of(v.name), Some(f));
        }
        assert!(variants().iter().any(|v| v.log == LogPlacement::Device));
    }

    /// `cairn modes --json`: every mode once keyed `mode`, every variant once keyed
    /// `variant`, each with its facts; nothing else.
    #[test]
    fn the_json_listing_is_exactly_the_registry() {
        let lines: Vec<serde_json::Value> = modes()
            .iter()
            .map(Mode::to_json)
            .chain(variants().iter().map(Variant::to_json))
            .collect();
        let listed: Vec<&str> = lines.iter().filter_map(|v| v["mode"].as_str()).collect();
        let names: Vec<&str> = modes().iter().map(|m| m.name()).collect();
        assert_eq!(listed, names);
        let listed: Vec<&str> = lines.iter().filter_map(|v| v["variant"].as_str()).collect();
        let names: Vec<&str> = variants().iter().map(|v| v.name).collect();
        assert_eq!(listed, names);
        for l in &lines {
            assert!(l["facts"]["family"].is_string(), "{l}");
            assert!(l["facts"]["log"].is_string(), "{l}");
        }
    }

    #[test]
    fn probe_names_the_format_or_refuses_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        (FFS.mkfs)(
            &img,
            &MkfsArgs {
                size: Some(8 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(probe_path(&img).unwrap().name, "ffs");
        let other = dir.path().join("zeros");
        std::fs::write(&other, vec![0u8; 4096]).unwrap();
        let e = probe_path(&other).unwrap_err().to_string();
        assert!(e.contains("not a cairn file system"), "{e}");
        assert_eq!(e.lines().count(), 1);
        assert!(probe_path(&dir.path().join("missing")).is_err());
    }

    /// `cairn fsck` of an image a journaled mount left behind: the check alone writes
    /// nothing and judges the image as the replay leaves it (clean, every call there);
    /// `-y` replays first (the image then mounts clean with every call), never "repairs"
    /// the home locations alone, which would take back calls the log made durable. Also:
    /// mkfs makes a log area unless told not to.
    #[test]
    fn fsck_replays_a_journal_first_and_a_check_sees_the_replay() {
        use cairn_vfs::Ctx;
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        let mk = |p: &Path, j: Option<u64>| {
            (FFS.mkfs)(
                p,
                &MkfsArgs {
                    size: Some(16 << 20),
                    journal_size: j,
                    ..Default::default()
                },
            )
            .unwrap()
        };
        mk(&img, None);
        let head = read_head(&img, 4096).unwrap();
        let sb = cairn_ffs::format::Superblock::decode(&head).unwrap();
        assert!(
            sb.journal_area().unwrap().is_some(),
            "mkfs made no log area"
        );
        let none = dir.path().join("none");
        mk(&none, Some(0));
        let sb = cairn_ffs::format::Superblock::decode(&read_head(&none, 4096).unwrap()).unwrap();
        assert!(sb.journal_area().unwrap().is_none());

        let fs = cairn_ffs::Ffs::mount(
            &img,
            &cairn_ffs::MountOptions {
                mode: "journal".into(),
                syncer_interval: Some(std::time::Duration::from_secs(3600)),
                ..Default::default()
            },
        )
        .unwrap();
        let c = Ctx::root();
        for i in 0..20 {
            fs.mkdir(&c, 2, std::ffi::OsStr::new(&format!("d{i}")), 0o755, 0)
                .unwrap();
        }
        // The crash: the mount never unmounts; a copy of the image as it is now.
        let crashed = dir.path().join("crashed");
        std::fs::copy(&img, &crashed).unwrap();
        std::mem::forget(fs);
        let before = std::fs::read(&crashed).unwrap();
        let r = (FFS.check)(&crashed, CheckOptions::default()).unwrap();
        assert!(r.is_clean(), "{:?}", r.findings);
        assert_eq!(r.stats.dirs, 22, "the check did not see the replayed calls");
        assert!(std::fs::read(&crashed).unwrap() == before, "a check wrote");
        let r = (FFS.check)(
            &crashed,
            CheckOptions {
                repair: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(r.is_clean(), "{:?}", r.findings);
        let fs = (FFS.mount)(&crashed, &[], true).unwrap();
        for i in 0..20 {
            fs.lookup(&c, 2, std::ffi::OsStr::new(&format!("d{i}")))
                .unwrap();
        }
        fs.destroy().unwrap();
        let sb =
            cairn_ffs::format::Superblock::decode(&read_head(&crashed, 4096).unwrap()).unwrap();
        assert_eq!(sb.state, cairn_ffs::format::superblock::STATE_CLEAN);
    }

    /// `-o disk=` under every format, by path and by device: the mount's device is the
    /// model's (its stats in `fs.disk`, its time counted), the data path unchanged; a bad
    /// model, an image larger than the disk and `log_disk=` without a log device are
    /// refused in one line.
    #[test]
    fn every_format_mounts_on_a_modeled_disk() {
        use cairn_vfs::Ctx;
        let dir = tempfile::tempdir().unwrap();
        let opt = |v: &[(&str, &str)]| -> Vec<(String, Option<String>)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), Some(v.to_string())))
                .collect()
        };
        for fs_type in types() {
            let img = dir.path().join(fs_type.name);
            (fs_type.mkfs)(
                &img,
                &MkfsArgs {
                    size: Some(64 << 20),
                    ..Default::default()
                },
            )
            .unwrap();
            let o = opt(&[("disk", "wren-iv:virtual")]);
            (fs_type.check_options)(&o, false).unwrap();
            (fs_type.check_option)("disk", Some("wren-iv")).unwrap();
            assert!((fs_type.check_option)("disk", Some("floppy")).is_err());
            let fs = (fs_type.mount)(&img, &o, false).unwrap();
            let c = Ctx::root();
            for i in 0..10 {
                fs.mkdir(&c, 2, std::ffi::OsStr::new(&format!("d{i}")), 0o755, 0)
                    .unwrap();
            }
            fs.sync_all().unwrap();
            let stats: serde_json::Value = serde_json::from_str(&fs.stats_json()).unwrap();
            let disk = &stats["disk"];
            assert_eq!(disk["model"], "wren-iv", "{}: {stats}", fs_type.name);
            assert!(disk["write"]["requests"].as_u64().unwrap() > 0);
            assert!(disk["busy_ns"].as_u64().unwrap() > 0);
            fs.destroy().unwrap();
            drop(fs);
            // Without the option: no model.
            let fs = (fs_type.mount)(&img, &[], true).unwrap();
            let stats: serde_json::Value = serde_json::from_str(&fs.stats_json()).unwrap();
            assert!(stats["disk"].is_null());
            fs.lookup(&c, 2, std::ffi::OsStr::new("d9")).unwrap();
            fs.destroy().unwrap();
            drop(fs);
            // Refusals.
            let e = (fs_type.mount)(&img, &opt(&[("disk", "floppy")]), false)
                .err()
                .unwrap();
            assert!(e.to_string().contains("unknown disk model"), "{e}");
        }
        let big = dir.path().join("big");
        (FFS.mkfs)(
            &big,
            &MkfsArgs {
                size: Some(400 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        let e = (FFS.mount)(&big, &opt(&[("disk", "wren-iv")]), false)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("larger than the modeled disk wren-iv"), "{e}");
        assert_eq!(e.lines().count(), 1);
        // A journal with its log on a device of its own, each on a disk of its own (the -2
        // systems of 000/001): the log's model in `strategy.log_disk`.
        let log = dir.path().join("log");
        {
            let dev = cairn_blockdev::FileDevice::create(&log, 4096, 4 << 20).unwrap();
            let region = cairn_wal::Region {
                first_block: 0,
                blocks: dev.num_blocks(),
            };
            cairn_wal::Wal::format(&dev, region, &Default::default()).unwrap();
        }
        let logdev = format!("dev:{}", log.display());
        let o = opt(&[
            ("mode", "journal"),
            ("log", logdev.as_str()),
            ("disk", "cheetah-10k:virtual"),
            ("log_disk", "cheetah-10k:virtual"),
        ]);
        (FFS.check_options)(&o, false).unwrap();
        let img = dir.path().join("ffs");
        let fs = (FFS.mount)(&img, &o, false).unwrap();
        fs.mkdir(&Ctx::root(), 2, std::ffi::OsStr::new("j"), 0o755, 0)
            .unwrap();
        let stats: serde_json::Value = serde_json::from_str(&fs.stats_json()).unwrap();
        let log_disk = &stats["strategy"]["log_disk"];
        assert_eq!(log_disk["model"], "cheetah-10k", "{stats}");
        assert!(log_disk["flushes"].as_u64().unwrap() > 0, "{stats}");
        assert_eq!(stats["disk"]["model"], "cheetah-10k");
        fs.destroy().unwrap();
        drop(fs);
        let e = (FFS.check_options)(
            &opt(&[("mode", "journal"), ("log_disk", "cheetah-10k")]),
            false,
        )
        .unwrap_err();
        assert!(e.contains("log=dev:PATH"), "{e}");
        assert!(
            (FFS.check_options)(&opt(&[("mode", "async"), ("log_disk", "wren-iv")]), false)
                .is_err()
        );
    }

    #[test]
    fn options_are_checked_before_mounting() {
        let opt = |k: &str, v: Option<&str>| vec![(k.to_string(), v.map(str::to_string))];
        assert!((FFS.check_options)(&opt("mode", Some("async")), false).is_ok());
        let e = (FFS.check_options)(&opt("mode", Some("turbo")), false).unwrap_err();
        assert!(e.contains("turbo"), "{e}");
        assert!((FFS.check_options)(&opt("frobnicate", None), false).is_err());
        assert!((FFS.check_option)("cache", Some("64M")).is_ok());
        assert!((FFS.check_option)("frobnicate", None).is_err());
        // log= is the journal's own option (the daemon's log file is logfile=): taken with
        // mode=journal, refused with a mode that has no such option.
        assert!((FFS.check_option)("log", Some("file")).is_ok());
        let both = |m: &str| {
            vec![
                ("mode".to_string(), Some(m.to_string())),
                ("log".to_string(), Some("file".to_string())),
            ]
        };
        assert!((FFS.check_options)(&both("journal"), false).is_ok());
        assert!((FFS.check_options)(&both("async"), false).is_err());
    }

    /// `cairn fsck -y` on an LFS image a crash left with a file unlinked while open: the
    /// check sees it in use but pending (no finding: the next read-write mount frees it),
    /// and the repair's read-write mount frees it.
    #[test]
    fn lfs_fsck_frees_a_file_unlinked_while_open() {
        use std::ffi::OsStr;
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        let lfs = by_name("lfs").unwrap();
        (lfs.mkfs)(
            &img,
            &MkfsArgs {
                size: Some(16 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        {
            let o = cairn_lfs::MountOptions {
                syncer: false,
                ..Default::default()
            };
            let fs = cairn_lfs::Lfs::mount(&img, &o).unwrap();
            let c = cairn_vfs::Ctx::root();
            let (a, fh) = fs
                .create(&c, fs.root_ino(), OsStr::new("f"), 0o644, 0, libc::O_RDWR)
                .unwrap();
            fs.write(a.ino, fh, 0, &[3u8; 9000]).unwrap();
            fs.unlink(&c, fs.root_ino(), OsStr::new("f")).unwrap();
            fs.fsync(fs.root_ino(), 0, false).unwrap();
            // Dropped without unmounting: the crash.
        }
        // Roll-forward names the inode as an orphan the next read-write mount frees: the
        // check counts it (one file in use) but it is no leak.
        let r = (lfs.check)(&img, CheckOptions::default()).unwrap();
        assert_eq!((r.exit_code(), r.stats.files), (0, 1), "{:?}", r.findings);
        let y = CheckOptions {
            repair: true,
            ..Default::default()
        };
        let r = (lfs.check)(&img, y).unwrap();
        assert!(r.exit_code() <= 1, "{:?}", r.findings);
        let r = (lfs.check)(&img, CheckOptions::default()).unwrap();
        assert!(r.is_clean(), "{:?}", r.findings);
        assert_eq!(r.stats.files, 0, "the repair's mount freed it");
    }

    /// The cleaner's counters after overwriting files on a recording's mount of `variant`
    /// (a device mount without background writers, as the crash harness makes it).
    fn cleaner_after_overwrites(variant: &str) -> serde_json::Value {
        use std::ffi::OsStr;
        let v = super::variant(variant).unwrap();
        let fs_type = by_name("lfs").unwrap();
        let dev: Arc<dyn BlockDevice> = Arc::new(cairn_blockdev::MemDevice::new(4096, 1536));
        (fs_type.device.mkfs)(dev.clone(), &(v.mkfs)()).unwrap();
        let mut opts = vec![("mode".to_string(), Some("lfs".to_string()))];
        opts.extend((v.options)(dev.as_ref()));
        let fs = (fs_type.device.mount)(dev, &opts, DeviceMount::default()).unwrap();
        let c = cairn_vfs::Ctx::root();
        let mut files = Vec::new();
        for i in 0..8 {
            let name = format!("f{i}");
            let (a, fh) = fs
                .create(&c, fs.root_ino(), OsStr::new(&name), 0o644, 0, libc::O_RDWR)
                .unwrap();
            files.push((a.ino, fh));
        }
        for round in 0..40u64 {
            for &(ino, fh) in &files {
                fs.write(ino, fh, (round % 4) * 65536, &[round as u8; 65536])
                    .unwrap();
            }
            fs.fsync(files[0].0, files[0].1, false).unwrap();
        }
        let j: serde_json::Value = serde_json::from_str(&fs.stats_json()).unwrap();
        j["cleaner"].clone()
    }

    /// `lfs-background` records the cleaner's background passes (lock holds with the room
    /// reserved between them, `split_passes`), where `lfs-cleaning`'s mount cleans inside
    /// the operation's hold and never runs one.
    #[test]
    fn lfs_background_runs_the_background_passes() {
        let bg = cleaner_after_overwrites("lfs-background");
        assert!(bg["passes"].as_u64().unwrap() > 0, "{bg}");
        assert!(bg["split_passes"].as_u64().unwrap() > 0, "{bg}");
        let fg = cleaner_after_overwrites("lfs-cleaning");
        assert!(fg["passes"].as_u64().unwrap() > 0, "{fg}");
        assert_eq!(fg["split_passes"].as_u64(), Some(0), "{fg}");
        // Not a `-o` option: a user's mount has its syncer.
        assert!(lfs_check_option(cairn_lfs::INLINE_BACKGROUND_KEY, None).is_err());
    }

    #[test]
    fn lfs_is_registered_probed_checked_and_iterated() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        let lfs = by_name("lfs").unwrap();
        (lfs.mkfs)(
            &img,
            &MkfsArgs {
                size: Some(16 << 20),
                segment_size: Some(1 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(probe_path(&img).unwrap().name, "lfs");
        let fs = (lfs.mount)(&img, &[], false).unwrap();
        assert_eq!(fs.getattr(fs.root_ino()).unwrap().nlink, 2);
        fs.destroy().unwrap();
        drop(fs);
        assert!(
            (lfs.check)(&img, CheckOptions::default())
                .unwrap()
                .is_clean()
        );
        // Options are the format's own: a mode of another format is refused.
        assert!((lfs.check_option)("mode", Some("lfs")).is_ok());
        assert!((lfs.check_option)("mode", Some("async")).is_err());
        // In the default iteration: every suite, the crash campaign and the bench run it.
        assert_eq!(mode("lfs").unwrap().fs.name, "lfs");
        // FFS refuses a segment size.
        let e = (FFS.mkfs)(
            &dir.path().join("f"),
            &MkfsArgs {
                size: Some(16 << 20),
                segment_size: Some(1 << 20),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("segment"), "{e}");
    }
}
