//! Workloads and recording them in process.
//!
//! A workload runs against a fresh file system on a memory device whose every write and
//! flush a [`Recorder`] keeps, through a [`RecordingFs`] that marks each operation: mkfs,
//! mount and the workload's setup come first (the crash states start after them, behind a
//! sync), then the operations under test, then unmount. Everything is in process and
//! deterministic in its seed; no FUSE is involved.
//!
//! The scripted set covers each metadata operation alone, the classic dangerous pairs
//! (after 002 Fig. 1 for create+delete sharing an inode block and a directory block), and
//! one workload per ordering class the planted bugs ([`crate::planted`]) belong to, so CI
//! never depends on a random seed to find them; `random-N` are seeded random sequences;
//! `untar` and `build` imitate the metadata pattern of unpacking a source tree and building
//! it (000 §4.3.1's ssh build). Programs run on a real mount are recorded with
//! `cairn mount -o record=FILE` instead.
//!
//! The driver plays the kernel: it sends forget for its lookups after every call (seeded
//! points for the random workloads), so unlinked, replaced and removed inodes are freed
//! during the workload as on a real mount; `unlink-batch` never forgets and keeps the
//! batch-at-unmount path. Everything on the write path is deterministic: the same workload
//! gives the same stream of writes, flushes and operations on every run.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_ffs::{Ffs, MkfsOptions, MountOptions};
use cairn_vfs::{Attr, Ctx, FileSystem, FsError, Ino, SetAttr, SetTime};

use crate::Error;
use crate::oracle::tag_data;
use crate::recfs::RecordingFs;
use crate::record::{Base, FORMAT, Header, Recorder, Recording};
use crate::states::Rng;

/// The device every in-process workload runs on.
#[derive(Clone, Debug)]
pub struct ImageSpec {
    pub bytes: u64,
    pub block_size: u32,
    /// Blocks per allocation group (several groups exercise cross-group allocation).
    pub blocks_per_group: Option<u64>,
}

impl Default for ImageSpec {
    fn default() -> Self {
        ImageSpec {
            bytes: 64 << 20,
            block_size: 4096,
            blocks_per_group: Some(4096),
        }
    }
}

type Script = fn(&mut Driver) -> Result<(), FsError>;

/// What a workload does.
#[derive(Clone, Debug)]
pub enum Body {
    Scripted { setup: Script, run: Script },
    Random { seed: u64, ops: usize },
    Untar { seed: u64 },
    Build { seed: u64 },
}

/// A named workload.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub body: Body,
    /// When the emulated kernel drops its references to inodes.
    pub forget: Forget,
    /// The size of the image it runs on, when not the campaign's ([`ImageSpec::bytes`]): a
    /// small image makes a log-structured format's log wrap round and write segments the
    /// cleaner freed.
    pub image_bytes: Option<u64>,
}

/// When the driver, standing in for the kernel, sends FUSE's forget for the lookups it
/// holds. A real mount frees an unlinked inode when the kernel forgets it, usually right
/// after the call that removed its last name; without forgets every unlinked inode would
/// wait for unmount and be freed there in one batch, a path a real mount rarely takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forget {
    /// After every call (the kernel dropping each dentry as soon as it is unused).
    EachCall,
    /// After a call when a generator seeded with this value says so: references pile up
    /// and an unlinked inode is freed at a later call, or at unmount.
    Seeded(u64),
    /// Never: unlinked inodes are freed in one batch at unmount.
    AtUnmount,
}

impl Workload {
    /// Scripted workloads are the ones whose expectations must be demonstrated.
    pub fn is_scripted(&self) -> bool {
        matches!(self.body, Body::Scripted { .. })
    }
}

/// Drives a file system by path, marking every operation in the recording. It plays the
/// kernel's part: it looks up what it names (the victim of an unlink, rmdir or rename too,
/// as the kernel resolves a dentry before the call), holds those lookup references, and
/// forgets them as its [`Forget`] policy says.
pub struct Driver {
    pub fs: Arc<RecordingFs>,
    ctx: Ctx,
    seq: u32,
    /// Lookup references held, by inode (an ordered map: forgets go out in inode order,
    /// the same on every run).
    refs: BTreeMap<Ino, u64>,
    forget: Forget,
    rng: Rng,
}

fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

impl Driver {
    pub fn new(fs: Arc<RecordingFs>, forget: Forget) -> Driver {
        let seed = match forget {
            Forget::Seeded(s) => s,
            _ => 0,
        };
        Driver {
            fs,
            ctx: Ctx::root(),
            seq: 0,
            refs: BTreeMap::new(),
            forget,
            rng: Rng::new(seed ^ 0x0f0f_7e57_f0f0_7e57),
        }
    }

    /// Counts a reference the file system handed out (an entry reply).
    fn hold(&mut self, a: Attr) -> Attr {
        *self.refs.entry(a.ino).or_default() += 1;
        a
    }

    fn lookup(&mut self, dir: Ino, name: &OsStr) -> Result<Attr, FsError> {
        let a = self.fs.lookup(&self.ctx, dir, name)?;
        Ok(self.hold(a))
    }

    /// The end of a call: forget what the policy says to.
    fn settle(&mut self) {
        let now = match self.forget {
            Forget::EachCall => true,
            Forget::Seeded(_) => self.rng.chance(1, 2),
            Forget::AtUnmount => false,
        };
        if now {
            self.forget_all();
        }
    }

    /// Sends forget for every reference held, in inode order.
    pub fn forget_all(&mut self) {
        for (ino, n) in std::mem::take(&mut self.refs) {
            self.fs.forget(ino, n);
        }
    }

    /// Runs one call of the workload, then settles its references.
    fn call<T>(&mut self, f: impl FnOnce(&mut Driver) -> Result<T, FsError>) -> Result<T, FsError> {
        let r = f(self);
        self.settle();
        r
    }

    fn dir(&mut self, path: &str) -> Result<Ino, FsError> {
        let mut ino = self.fs.root_ino();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            ino = self.lookup(ino, OsStr::new(c))?.ino;
        }
        Ok(ino)
    }

    fn parent(&mut self, path: &str) -> Result<(Ino, OsString), FsError> {
        let (d, n) = split(path);
        Ok((self.dir(d)?, OsString::from(n)))
    }

    /// The parent and name of `path`, with the name looked up as the kernel does before
    /// removing or renaming it (it may not exist: the call then fails on its own).
    fn victim(&mut self, path: &str) -> Result<(Ino, OsString), FsError> {
        let (p, n) = self.parent(path)?;
        let _ = self.lookup(p, &n);
        Ok((p, n))
    }

    pub fn stat(&mut self, path: &str) -> Result<Attr, FsError> {
        let (p, n) = self.parent(path)?;
        self.lookup(p, &n)
    }

    pub fn create(&mut self, path: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (p, n) = d.parent(path)?;
            let (a, fh) =
                d.fs.create(&d.ctx, p, &n, libc::S_IFREG | 0o644, 0o022, libc::O_RDWR)?;
            d.hold(a);
            d.fs.release(a.ino, fh)
        })
    }

    pub fn mkdir(&mut self, path: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (p, n) = d.parent(path)?;
            let a = d.fs.mkdir(&d.ctx, p, &n, 0o755, 0o022)?;
            d.hold(a);
            Ok(())
        })
    }

    pub fn mknod_fifo(&mut self, path: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (p, n) = d.parent(path)?;
            let a = d.fs.mknod(&d.ctx, p, &n, libc::S_IFIFO | 0o644, 0o022, 0)?;
            d.hold(a);
            Ok(())
        })
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (p, n) = d.parent(path)?;
            let a = d.fs.symlink(&d.ctx, p, &n, target.as_bytes())?;
            d.hold(a);
            Ok(())
        })
    }

    pub fn unlink(&mut self, path: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (p, n) = d.victim(path)?;
            d.fs.unlink(&d.ctx, p, &n)
        })
    }

    pub fn rmdir(&mut self, path: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (p, n) = d.victim(path)?;
            d.fs.rmdir(&d.ctx, p, &n)
        })
    }

    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (p, n) = d.victim(from)?;
            let (q, m) = d.victim(to)?;
            d.fs.rename(&d.ctx, p, &n, q, &m, Default::default())
        })
    }

    /// rename(2) with RENAME_WHITEOUT: `from` is left naming a whiteout.
    pub fn rename_whiteout(&mut self, from: &str, to: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (p, n) = d.victim(from)?;
            let (q, m) = d.victim(to)?;
            let flags = cairn_vfs::RenameFlags {
                whiteout: true,
                ..Default::default()
            };
            d.fs.rename(&d.ctx, p, &n, q, &m, flags)
        })
    }

    pub fn link(&mut self, existing: &str, new: &str) -> Result<(), FsError> {
        self.call(|d| {
            let a = d.stat(existing)?;
            let (q, m) = d.parent(new)?;
            let a = d.fs.link(&d.ctx, a.ino, q, &m)?;
            d.hold(a);
            Ok(())
        })
    }

    /// Writes `len` bytes (rounded up to 16) of tagged data at `offset` (rounded down).
    pub fn write(&mut self, path: &str, offset: u64, len: usize) -> Result<(), FsError> {
        self.call(|d| d.write_now(path, offset, len))
    }

    fn write_now(&mut self, path: &str, offset: u64, len: usize) -> Result<(), FsError> {
        let a = self.stat(path)?;
        let offset = offset & !15;
        let len = len.div_ceil(16) * 16;
        let fh = self.fs.open(&self.ctx, a.ino, libc::O_WRONLY)?;
        self.seq += 1;
        let data = tag_data(a.ino, a.generation, self.seq, len);
        // Large writes go in 64 KiB calls, as a program's write(2)s would.
        let mut r = Ok(());
        for (i, c) in data.chunks(64 << 10).enumerate() {
            if let Err(e) = self.fs.write(a.ino, fh, offset + (i << 16) as u64, c) {
                r = Err(e);
                break;
            }
        }
        self.fs.release(a.ino, fh)?;
        r
    }

    /// Appends `len` bytes at the end (rounded up to a 16-byte boundary).
    pub fn append(&mut self, path: &str, len: usize) -> Result<(), FsError> {
        self.call(|d| {
            let size = d.stat(path)?.size;
            d.write_now(path, size.div_ceil(16) * 16, len)
        })
    }

    /// Opens `path` and keeps the handle (a program holding a file open across calls).
    pub fn open_keep(&mut self, path: &str) -> Result<(Ino, cairn_vfs::Fh), FsError> {
        self.call(|d| {
            let a = d.stat(path)?;
            Ok((a.ino, d.fs.open(&d.ctx, a.ino, libc::O_RDWR)?))
        })
    }

    /// open(`dir`, O_TMPFILE | O_RDWR | `extra`): an unnamed file, kept open.
    pub fn tmpfile(&mut self, dir: &str, extra: i32) -> Result<(Attr, cairn_vfs::Fh), FsError> {
        self.call(|d| {
            let p = d.dir(dir)?;
            let (a, fh) =
                d.fs.tmpfile(&d.ctx, p, 0o644, 0o022, libc::O_RDWR | extra)?;
            Ok((d.hold(a), fh))
        })
    }

    /// Writes `len` bytes (a multiple of 16) of tagged data at `offset` through an open
    /// handle (a file that may have no name).
    pub fn write_open(
        &mut self,
        a: &Attr,
        fh: cairn_vfs::Fh,
        offset: u64,
        len: usize,
    ) -> Result<(), FsError> {
        self.call(|d| {
            d.seq += 1;
            let data = tag_data(a.ino, a.generation, d.seq, len);
            d.fs.write(a.ino, fh, offset, &data).map(|_| ())
        })
    }

    /// fsync(2) of an open handle.
    pub fn fsync_open(&mut self, ino: Ino, fh: cairn_vfs::Fh) -> Result<(), FsError> {
        self.call(|d| d.fs.fsync(ino, fh, false))
    }

    /// linkat(2) of an open file (`/proc/self/fd/N`, AT_SYMLINK_FOLLOW) to `new`.
    pub fn link_open(&mut self, ino: Ino, new: &str) -> Result<(), FsError> {
        self.call(|d| {
            let (q, m) = d.parent(new)?;
            let a = d.fs.link(&d.ctx, ino, q, &m)?;
            d.hold(a);
            Ok(())
        })
    }

    /// Closes a handle [`Driver::open_keep`] returned (its last close may free the inode).
    pub fn close(&mut self, ino: Ino, fh: cairn_vfs::Fh) -> Result<(), FsError> {
        self.call(|d| d.fs.release(ino, fh))
    }

    /// fallocate(2) of `len` bytes at `offset`, mode 0 (the file grows; the model only
    /// knows its contents are zeros or its own from then on).
    pub fn fallocate(&mut self, path: &str, offset: u64, len: u64) -> Result<(), FsError> {
        self.call(|d| {
            let a = d.stat(path)?;
            let fh = d.fs.open(&d.ctx, a.ino, libc::O_WRONLY)?;
            let r = d.fs.fallocate(a.ino, fh, offset, len, 0);
            d.fs.release(a.ino, fh)?;
            r
        })
    }

    pub fn fsync(&mut self, path: &str) -> Result<(), FsError> {
        self.call(|d| {
            let a = d.stat(path)?;
            let fh = d.fs.open(&d.ctx, a.ino, libc::O_RDONLY)?;
            let r = d.fs.fsync(a.ino, fh, false);
            d.fs.release(a.ino, fh)?;
            r
        })
    }

    fn setattr(&mut self, path: &str, set: SetAttr) -> Result<(), FsError> {
        self.call(|d| {
            let a = d.stat(path)?;
            d.fs.setattr(&d.ctx, a.ino, set).map(|_| ())
        })
    }

    pub fn truncate(&mut self, path: &str, size: u64) -> Result<(), FsError> {
        let set = SetAttr {
            size: Some(size & !15),
            ..Default::default()
        };
        self.setattr(path, set)
    }

    pub fn chmod(&mut self, path: &str, mode: u32) -> Result<(), FsError> {
        let set = SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        self.setattr(path, set)
    }

    pub fn setxattr(&mut self, path: &str, name: &str, value: &[u8]) -> Result<(), FsError> {
        self.call(|d| {
            let a = d.stat(path)?;
            d.fs.setxattr(&d.ctx, a.ino, OsStr::new(name), value, 0)
        })
    }

    pub fn removexattr(&mut self, path: &str, name: &str) -> Result<(), FsError> {
        self.call(|d| {
            let a = d.stat(path)?;
            d.fs.removexattr(&d.ctx, a.ino, OsStr::new(name))
        })
    }

    pub fn touch(&mut self, path: &str) -> Result<(), FsError> {
        let set = SetAttr {
            mtime: Some(SetTime::Now),
            atime: Some(SetTime::Now),
            ..Default::default()
        };
        self.setattr(path, set)
    }

    /// Reads a whole file (no marker: reads change nothing the oracle compares).
    pub fn read(&mut self, path: &str) -> Result<Vec<u8>, FsError> {
        self.call(|d| {
            let a = d.stat(path)?;
            let fh = d.fs.open(&d.ctx, a.ino, libc::O_RDONLY)?;
            let mut out = Vec::new();
            let r = d.fs.read(a.ino, fh, 0, a.size as u32, &mut out);
            d.fs.release(a.ino, fh)?;
            r.map(|_| out)
        })
    }

    pub fn sync(&mut self) -> Result<(), FsError> {
        self.call(|d| d.fs.sync_all())
    }
}

/// Runs `w` in `mode` and returns its recording (see the module documentation).
pub fn record(w: &Workload, mode: &str, spec: &ImageSpec) -> Result<Recording, Error> {
    let sized = ImageSpec {
        bytes: w.image_bytes.unwrap_or(spec.bytes),
        ..spec.clone()
    };
    let spec = &sized;
    let bs = spec.block_size;
    let blocks = spec.bytes / bs as u64;
    let dev = Arc::new(MemDevice::new(bs, blocks));
    let rec = Arc::new(Recorder::new(bs));
    dev.set_trace(Some(rec.clone()));
    // A journal with its log on a device of its own: a second device, recorded into the same
    // stream from its format on (its blocks numbered after the file system's).
    let log = crate::modes::needs_log_device(mode).then(|| {
        let log = Arc::new(MemDevice::new(bs, log_bytes(spec) / u64::from(bs)));
        log.set_trace(Some(rec.second_device(blocks)));
        log
    });
    let fail = |what: &str, e: FsError| Error::Workload(format!("{}: {what}: {e}", w.name));
    let mounted: Arc<dyn FileSystem> = if crate::modes::is_ffs(mode) {
        mount_ffs(&dev, log.as_ref(), mode, spec).map_err(|(what, e)| fail(what, e))?
    } else {
        mount_format(&dev, mode).map_err(|(what, e)| fail(what, e))?
    };
    let fs = Arc::new(RecordingFs::new(mounted.clone(), rec.clone()));
    let mut d = Driver::new(fs.clone(), w.forget);
    match &w.body {
        Body::Scripted { setup, .. } => setup(&mut d).map_err(|e| fail("setup", e))?,
        Body::Build { seed } => build_setup(&mut d, *seed).map_err(|e| fail("setup", e))?,
        _ => {}
    }
    d.sync().map_err(|e| fail("sync after setup", e))?;
    let start = rec.len();
    match &w.body {
        Body::Scripted { run, .. } => run(&mut d).map_err(|e| fail("run", e))?,
        Body::Random { seed, ops } => random(&mut d, *seed, *ops),
        Body::Untar { seed } => untar(&mut d, *seed).map_err(|e| fail("run", e))?,
        Body::Build { seed } => build(&mut d, *seed).map_err(|e| fail("run", e))?,
    }
    fs.record_unmount(|| mounted.destroy())
        .map_err(|e| fail("unmount", e))?;
    dev.set_trace(None);
    if let Some(log) = &log {
        log.set_trace(None);
    }
    drop(d);
    drop(fs);
    drop(mounted);
    Ok(Recording {
        header: Header {
            recording: FORMAT,
            block_size: bs,
            num_blocks: blocks,
            base: Base::Zero,
            mode: mode.into(),
            workload: w.name.clone(),
            start,
            tagged: true,
            log_blocks: log.as_ref().map_or(0, |l| l.num_blocks()),
            repro: None,
        },
        events: rec.events(),
    })
}

type MountResult = Result<Arc<dyn FileSystem>, (&'static str, FsError)>;

/// The journal's log: 1% of the image, at least the smallest log (in the image's log area,
/// or on a log device of its own).
fn log_bytes(spec: &ImageSpec) -> u64 {
    (spec.bytes / 100)
        .max(cairn_ffs::strategy::journal::MIN_LOG_BYTES + 4 * u64::from(spec.block_size))
}

/// The log device's uuid: fixed, so the same workload writes the same log bytes every run.
const LOG_UUID: [u8; 16] = *b"cairn-crash-log!";

/// An FFS image on `dev`, mounted through the mode's strategy (a registered mode, one not
/// yet listed, or a planted bug), with no syncer. With `log`, a journal's log device: it is
/// formatted (`cairn wal mkfs`'s format, owned by nobody until the journal's first mount
/// claims it) and handed to the strategy.
fn mount_ffs(
    dev: &Arc<MemDevice>,
    log: Option<&Arc<MemDevice>>,
    mode: &str,
    spec: &ImageSpec,
) -> MountResult {
    let bs = spec.block_size;
    cairn_ffs::mkfs_device(
        dev.as_ref(),
        &MkfsOptions {
            block_size: bs,
            blocks_per_group: spec.blocks_per_group,
            label: "crash".into(),
            // A journal's log area.
            journal_size: crate::modes::needs_log_area(mode).then(|| log_bytes(spec)),
            ..Default::default()
        },
    )
    .map_err(|e| ("mkfs", e))?;
    let unknown = || {
        (
            "mount",
            FsError::Refused(cairn_vfs::Errno::EINVAL, format!("unknown mode '{mode}'")),
        )
    };
    let strategy = match log {
        Some(log) => {
            cairn_wal::Wal::format(
                log.as_ref(),
                cairn_wal::Region::whole(log.as_ref()),
                &cairn_wal::FormatOptions {
                    uuid: Some(LOG_UUID),
                    ..Default::default()
                },
            )
            .map_err(|e| {
                (
                    "wal mkfs",
                    FsError::Io(std::io::Error::other(e.to_string())),
                )
            })?;
            crate::modes::strategy_with_log(
                mode,
                dev.clone() as Arc<dyn BlockDevice>,
                log.clone() as Arc<dyn BlockDevice>,
            )
            .ok_or_else(unknown)?
        }
        None => crate::modes::strategy_for(mode).ok_or_else(unknown)?,
    };
    let opts = MountOptions {
        mode: mode.into(),
        cache_bytes: 64 << 20,
        // No syncer during a workload: its writes would land at a time-dependent point and
        // make recordings differ between runs.
        syncer_interval: Some(std::time::Duration::from_secs(24 * 3600)),
        read_only: false,
        force: false,
        mode_options: Vec::new(),
    };
    let ffs = Ffs::mount_device_with_strategy(dev.clone() as Arc<dyn BlockDevice>, &opts, strategy)
        .map_err(|e| ("mount", e))?;
    Ok(ffs)
}

/// An image of another registered format on `dev`, made and mounted through its registry
/// entry (`cairn_fstypes::DeviceOps`) with no background writers, or through a planted
/// bug's own mount of the format's engine.
fn mount_format(dev: &Arc<MemDevice>, mode: &str) -> MountResult {
    let unknown = || {
        (
            "mount",
            FsError::Refused(cairn_vfs::Errno::EINVAL, format!("unknown mode '{mode}'")),
        )
    };
    let fs_type = crate::modes::format_of(mode).ok_or_else(unknown)?;
    let planted = crate::planted::by_name(mode);
    // A planted bug claiming a variant's guarantees is recorded as that variant is.
    let variant = crate::modes::variant(mode).or_else(|| crate::modes::variant(planted?.base));
    let dev = dev.clone() as Arc<dyn BlockDevice>;
    let args = variant.map_or_else(
        || cairn_fstypes::MkfsArgs {
            label: "crash".into(),
            ..Default::default()
        },
        |v| (v.mkfs)(),
    );
    (fs_type.device.mkfs)(dev.clone(), &args).map_err(|e| ("mkfs", e))?;
    let mut opts = vec![("mode".to_string(), Some(crate::modes::mount_mode(mode)))];
    if let Some(v) = variant {
        opts.extend((v.options)(dev.as_ref()));
    }
    if let Some(p) = planted {
        return p
            .mount(dev, &opts)
            .ok_or_else(unknown)?
            .map_err(|e| ("mount", e));
    }
    (fs_type.device.mount)(
        dev,
        &opts,
        cairn_fstypes::DeviceMount {
            read_only: false,
            background: false,
        },
    )
    .map_err(|e| ("mount", e))
}

fn scripted(name: &str, setup: Script, run: Script) -> Workload {
    Workload {
        name: name.into(),
        body: Body::Scripted { setup, run },
        forget: Forget::EachCall,
        image_bytes: None,
    }
}

/// The image of `log-wrap` and `flush-split`: 6 MiB, so the log of a log-structured
/// format wraps round within a few MiB of writes (`lfs`: 11 segments of 512 KiB;
/// `lfs-cleaning`: 90 of 64 KiB).
pub const SMALL_IMAGE: u64 = 6 << 20;

fn nothing(_: &mut Driver) -> Result<(), FsError> {
    Ok(())
}

/// Every built-in workload: the scripted set, `random-1..=4`, `untar`, `build`.
pub fn all() -> Vec<Workload> {
    let mut v = scripted_set();
    for seed in 1..=4 {
        v.push(Workload {
            name: format!("random-{seed}"),
            body: Body::Random { seed, ops: 60 },
            forget: Forget::Seeded(seed),
            image_bytes: None,
        });
    }
    // Not in the scripted set (whose FFS write order is golden): a file unlinked while a
    // program holds it open, with an fsync of another file while it is: the states after
    // that fsync hold an inode with no name and no link (what the mount or fsck must free).
    v.push(scripted("unlink-open", open_setup, unlink_open));
    // O_TMPFILE: one linked and fsynced (it must be there with its data), one held open
    // while another file is fsynced (an inode with no name and no link, as `unlink-open`
    // leaves, for the mount or fsck to free), and an O_EXCL one, never linkable.
    v.push(scripted(
        "tmpfile",
        |d| d.mkdir("d"),
        tmpfile_link_and_orphan,
    ));
    // Not in the scripted set either (a journal's planted bug, `journal-async-reuse-before-
    // log`, is caught here): a file past its direct blocks, home, is truncated to nothing;
    // a one-block file then shifts the next file's data by one block over the freed ones,
    // so that file's data, fsynced, falls on the truncated file's old indirect block. Until
    // the truncation is durable none of it may land: a crash would bring the truncated file
    // back with another file's bytes as its block pointers.
    v.push(scripted(
        "reuse-indirect",
        |d| {
            d.create("big")?;
            d.write("big", 0, 80 << 10)
        },
        reuse_freed,
    ));
    v.push(Workload {
        name: "untar".into(),
        body: Body::Untar { seed: 7 },
        forget: Forget::EachCall,
        image_bytes: None,
    });
    v.push(Workload {
        name: "build".into(),
        body: Body::Build { seed: 7 },
        forget: Forget::EachCall,
        image_bytes: None,
    });
    v.extend(designed());
    v
}

/// Workloads written to reach what each design can get wrong (outside the scripted set,
/// whose FFS write order is golden; each planted bug of its class names its own):
/// - `log-wrap`: a log-structured log that wraps round and writes segments the cleaner
///   (or a checkpoint) freed, on a small image: a segment released before the checkpoint
///   that empties it is durable can be overwritten while the last durable checkpoint
///   still needs it;
/// - `flush-split`: flushes of many inodes, each written as several partial segments
///   (the log crosses segment ends), so a partial without its flush's COMMIT carries
///   inode blocks: roll-forward must apply whole flushes;
/// - `reuse-logged`: a journal's logged block (an indirect block, written in the run so
///   its image is in the log since the last checkpoint) freed, and reused as the data of
///   a file that is then fsynced: replay must skip the freed block's logged image (its
///   revoke), or it lands over that data;
/// - `fsync-rename`: a file fsynced (its name durable), then renamed across directories
///   (soft updates' rule 3: the new name on disk before the old one's removal);
/// - `xattr-chain`: a file's extended attributes grown past one block into a chain (each
///   change of a chain writes the whole list to new blocks and switches the inode's
///   pointer), a large value, a second file's chain allocated among the first's freed
///   blocks, an fsync, then the list shrunk back to one block: every block of a chain and
///   its bitmap on disk before the pointer, the old chain free only after it.
pub fn designed() -> Vec<Workload> {
    vec![
        scripted(
            "xattr-chain",
            |d| {
                d.create("f")?;
                d.create("g")
            },
            xattr_chain,
        ),
        Workload {
            image_bytes: Some(SMALL_IMAGE),
            ..scripted(
                "log-wrap",
                |d| {
                    d.mkdir("a")?;
                    d.mkdir("b")?;
                    for f in ["a/0", "a/1", "b/2", "b/3"] {
                        d.create(f)?;
                        d.write(f, 0, 128 << 10)?;
                    }
                    Ok(())
                },
                log_wrap,
            )
        },
        Workload {
            image_bytes: Some(SMALL_IMAGE),
            ..scripted("flush-split", |d| d.mkdir("d"), flush_split)
        },
        scripted("reuse-logged", nothing, |d| {
            d.create("big")?;
            d.write("big", 0, 80 << 10)?;
            reuse_freed(d)
        }),
        scripted(
            "fsync-rename",
            |d| {
                d.mkdir("p")?;
                d.mkdir("q")?;
                d.create("q/old")
            },
            |d| {
                d.create("p/f")?;
                d.write("p/f", 0, 8192)?;
                d.fsync("p/f")?;
                d.rename("p/f", "q/f")?;
                d.create("q/g")?;
                d.rename("q/old", "p/old")
            },
        ),
    ]
}

/// `xattr-chain` (see `designed`).
fn xattr_chain(d: &mut Driver) -> Result<(), FsError> {
    for i in 0..240 {
        d.setxattr(
            "f",
            &format!("user.attribute_{i}"),
            format!("value_{i}").as_bytes(),
        )?;
    }
    d.setxattr("g", "user.long", &[7u8; 9000])?;
    d.write("g", 0, 8192)?;
    d.fsync("g")?;
    for i in (0..240).step_by(2) {
        d.removexattr("f", &format!("user.attribute_{i}"))?;
    }
    d.setxattr("g", "user.more", &[9u8; 3000])?;
    for i in (1..240).step_by(2).skip(10) {
        d.removexattr("f", &format!("user.attribute_{i}"))?;
    }
    d.removexattr("g", "user.long")
}

/// `big` (past its direct blocks) truncated to nothing, then a one-block file that shifts
/// the next file's data by one block over the freed ones, so that file's data, fsynced,
/// falls on `big`'s old indirect block (`reuse-indirect`, `reuse-logged`).
fn reuse_freed(d: &mut Driver) -> Result<(), FsError> {
    d.truncate("big", 0)?;
    d.create("small")?;
    d.write("small", 0, 4096)?;
    d.create("other")?;
    d.write("other", 0, 80 << 10)?;
    d.fsync("other")
}

/// `log-wrap`: about 9 MiB of overwrites in 64 KiB writes (one file fsynced in every
/// round), with a file created, renamed and removed in each round, on [`SMALL_IMAGE`].
fn log_wrap(d: &mut Driver) -> Result<(), FsError> {
    let files = ["a/0", "a/1", "b/2", "b/3"];
    for round in 0..36usize {
        for (i, f) in files.iter().enumerate() {
            let off = (((round + i) % 2) as u64) << 16;
            d.write(f, off, 64 << 10)?;
        }
        d.fsync(files[round % files.len()])?;
        let tmp = format!("a/t{round}");
        d.create(&tmp)?;
        d.write(&tmp, 0, 4096)?;
        d.rename(&tmp, &format!("b/t{round}"))?;
        if round >= 2 {
            d.unlink(&format!("b/t{}", round - 2))?;
        }
    }
    Ok(())
}

/// `flush-split`: rounds of creates, chmods and removals of many files in one directory, each round
/// ended by an fsync (one flush: the operation log, the directory's blocks, tens of inodes
/// in several inode blocks), so the log crosses segment ends inside flushes at many
/// places; the file counts vary so the cuts fall in different parts of a flush.
fn flush_split(d: &mut Driver) -> Result<(), FsError> {
    let mut names: Vec<String> = Vec::new();
    let mut made = 0;
    for round in 0..24u32 {
        for _ in 0..(12 + 7 * round % 23) {
            let f = format!("d/f{made}");
            made += 1;
            d.create(&f)?;
            names.push(f);
        }
        for f in names.iter().skip(round as usize % 2).step_by(2) {
            d.chmod(f, 0o600 | (round % 8) << 3)?;
        }
        let last = names[names.len() - 1].clone();
        d.write(&last, 0, 4096 * (1 + round as usize % 4))?;
        d.fsync(&last)?;
        if round % 4 == 3 {
            let k = names.len() - 2;
            let to = format!("d/r{round}");
            d.rename(&names[k], &to)?;
            names[k] = to;
        }
        // At most about 200 files: the image has room for some 380 inodes.
        while names.len() > 180 {
            d.unlink(&names.remove(0))?;
        }
    }
    Ok(())
}

/// Finds workloads by name; `random-S` accepts any seed S and `random-S:N` sets the number
/// of operations.
pub fn by_name(name: &str) -> Option<Workload> {
    if let Some(rest) = name.strip_prefix("random-") {
        let (s, n) = rest.split_once(':').unwrap_or((rest, "60"));
        let seed = s.parse().ok()?;
        return Some(Workload {
            name: name.into(),
            body: Body::Random {
                seed,
                ops: n.parse().ok()?,
            },
            forget: Forget::Seeded(seed),
            image_bytes: None,
        });
    }
    all().into_iter().find(|w| w.name == name)
}

/// The scripted workloads: each metadata operation alone, then the dangerous pairs.
pub fn scripted_set() -> Vec<Workload> {
    vec![
        scripted(
            "create",
            |d| d.mkdir("d"),
            |d| {
                d.create("d/a")?;
                d.create("b")?;
                d.mknod_fifo("d/fifo")
            },
        ),
        scripted("mkdir", nothing, |d| {
            d.mkdir("x")?;
            d.mkdir("x/y")
        }),
        scripted(
            "unlink",
            |d| {
                d.mkdir("d")?;
                d.create("a")?;
                d.write("a", 0, 8192)?;
                d.create("d/b")
            },
            |d| {
                d.unlink("a")?;
                d.unlink("d/b")
            },
        ),
        scripted(
            "rmdir",
            |d| {
                d.mkdir("a")?;
                d.mkdir("a/b")
            },
            |d| {
                d.rmdir("a/b")?;
                d.rmdir("a")
            },
        ),
        scripted(
            "rename-file",
            |d| {
                d.create("a")?;
                d.write("a", 0, 4096)
            },
            |d| d.rename("a", "b"),
        ),
        scripted(
            "link",
            |d| {
                d.mkdir("d")?;
                d.create("a")
            },
            |d| {
                d.link("a", "b")?;
                d.link("a", "d/c")?;
                d.unlink("a")
            },
        ),
        scripted("symlink", nothing, |d| {
            d.symlink("s", "some/target")?;
            d.symlink("long", &"x/".repeat(100))
        }),
        scripted(
            "chmod",
            |d| {
                d.create("a")?;
                d.mkdir("d")
            },
            |d| {
                d.chmod("a", 0o600)?;
                d.chmod("d", 0o700)?;
                d.touch("a")
            },
        ),
        scripted(
            "truncate",
            |d| {
                d.create("a")?;
                d.write("a", 0, 64 << 10)
            },
            |d| {
                d.truncate("a", 4096)?;
                d.truncate("a", 0)
            },
        ),
        scripted("write-fsync", nothing, |d| {
            d.create("a")?;
            d.write("a", 0, 8192)?;
            d.fsync("a")?;
            d.write("a", 8192, 8192)?;
            d.fsync("a")
        }),
        // 002 Fig. 1: a removal and a creation whose inodes share an inode block and whose
        // entries share a directory block (the cyclic dependency).
        scripted(
            "create-delete",
            |d| {
                d.mkdir("d")?;
                for i in 1..=4 {
                    d.create(&format!("d/f{i}"))?;
                }
                Ok(())
            },
            |d| {
                d.unlink("d/f2")?;
                d.create("d/g")?;
                d.unlink("d/f3")?;
                d.create("d/h")
            },
        ),
        scripted(
            "rename-over",
            |d| {
                d.create("a")?;
                d.write("a", 0, 4096)?;
                d.create("b")?;
                d.write("b", 0, 8192)?;
                d.mkdir("x")?;
                d.mkdir("y")
            },
            |d| {
                d.rename("a", "b")?;
                d.rename("x", "y")
            },
        ),
        // RENAME_WHITEOUT: the old name re-pointed to a new whiteout inode in the rename's
        // own call (rule 1 for the whiteout's inode, rule 3 for the moved file's new name),
        // across directories, a rename over a whiteout, and a whiteout removed.
        scripted(
            "rename-whiteout",
            |d| {
                d.mkdir("d")?;
                d.create("a")?;
                d.write("a", 0, 4096)?;
                d.create("b")?;
                d.create("g")
            },
            |d| {
                // A durable name into a directory made in the same epoch: the new name is
                // reachable only once the directory's own name is on disk, which waits for
                // its inode; the old name's whiteout must wait for all of it (rule 3), not
                // only for its own inode (rule 1).
                d.mkdir("f")?;
                d.rename_whiteout("g", "f/g")?;
                d.rename_whiteout("a", "d/a")?;
                d.rename_whiteout("b", "a")?;
                d.unlink("b")?;
                d.rename_whiteout("d/a", "c")?;
                // A name that never reached disk, renamed into a new directory: what keeps
                // the file named on disk is its durable name's record (`a`'s, now naming
                // `b`), which must wait for the names the file moves through.
                d.mkdir("e")?;
                d.rename_whiteout("c", "e/c")
            },
        ),
        // A directory made and renamed within its parent before either name reached disk,
        // then a file in it fsynced: the fsync writes the parent's directory block, whose
        // new name must wait for the parent's raised link count (its `..`), though the
        // rename raised nothing and the mkdir's entry (which waited for it) is gone.
        scripted("mkdir-rename-fsync", nothing, |d| {
            d.mkdir("d")?;
            d.create("d/f")?;
            d.rename("d", "m")?;
            d.create("m/g")?;
            d.write("m/g", 0, 4096)?;
            d.fsync("m/g")
        }),
        scripted(
            "rename-across",
            |d| {
                d.mkdir("p")?;
                d.mkdir("q")?;
                d.mkdir("p/sub")?;
                d.create("p/sub/f")?;
                d.create("p/f")
            },
            |d| {
                d.rename("p/f", "q/f")?;
                d.rename("p/sub", "q/sub")?;
                d.rename("q/sub", "sub")
            },
        ),
        scripted("mkdir-rmdir-chain", nothing, |d| {
            for _ in 0..2 {
                d.mkdir("a")?;
                d.mkdir("a/b")?;
                d.mkdir("a/b/c")?;
                d.mkdir("a/b/c/d")?;
                d.rmdir("a/b/c/d")?;
                d.rmdir("a/b/c")?;
                d.rmdir("a/b")?;
                d.rmdir("a")?;
            }
            Ok(())
        }),
        scripted(
            "append-fsync",
            |d| d.create("log"),
            |d| {
                for _ in 0..6 {
                    d.append("log", 1000)?;
                    d.fsync("log")?;
                }
                Ok(())
            },
        ),
        scripted(
            "truncate-regrow",
            |d| {
                d.create("a")?;
                d.write("a", 0, 48 << 10)
            },
            |d| {
                d.truncate("a", 0)?;
                d.write("a", 0, 48 << 10)?;
                d.truncate("a", 8192)?;
                d.write("a", 16384, 8192)
            },
        ),
        scripted(
            "hardlinks",
            |d| {
                d.mkdir("d")?;
                d.create("a")?;
                d.write("a", 0, 4096)
            },
            |d| {
                d.link("a", "b")?;
                d.link("a", "d/c")?;
                d.unlink("a")?;
                d.rename("b", "e")?;
                d.unlink("d/c")
            },
        ),
        // Rule 2 with reuse: a new file's blocks are allocated (bitmaps owed), then another
        // file, already durable, is truncated; the new file grows into the freed blocks and
        // is fsynced.
        scripted(
            "write-truncate-other",
            |d| {
                d.create("b")?;
                d.write("b", 0, 64 << 10)
            },
            |d| {
                d.create("a")?;
                d.write("a", 0, 16 << 10)?;
                d.truncate("b", 0)?;
                d.write("a", 16 << 10, 32 << 10)?;
                d.fsync("a")
            },
        ),
        // fsync of a file past its direct blocks: its indirect block (the pointers to the
        // data) must reach disk after the data and before the inode.
        scripted(
            "fsync-indirect",
            |d| d.create("a"),
            |d| {
                d.write("a", 0, 96 << 10)?;
                d.fsync("a")?;
                d.write("a", 96 << 10, 16 << 10)?;
                d.fsync("a")
            },
        ),
        // A fallocate large enough that its new blocks are zeroed on the device (no buffer
        // each), over blocks a deleted file's data left: no crash state may show that data
        // in the new file (the zeros are durable before any pointer to them).
        scripted(
            "fallocate-large",
            |d| {
                d.create("old")?;
                d.write("old", 0, 512 << 10)?;
                d.unlink("old")
            },
            |d| {
                d.create("f")?;
                d.fallocate("f", 0, 512 << 10)?;
                d.create("g")
            },
        ),
        // A write's allocations are owed when a directory removal writes inode blocks.
        scripted(
            "write-rmdir",
            |d| {
                d.mkdir("d")?;
                d.create("a")
            },
            |d| {
                d.write("a", 0, 16 << 10)?;
                d.rmdir("d")
            },
        ),
        // Bitmap before pointer: a write allocates, then a chmod of the same file writes its
        // inode (with the new pointers), with no fsync between.
        scripted(
            "write-chmod",
            |d| d.create("a"),
            |d| {
                d.write("a", 0, 16 << 10)?;
                d.chmod("a", 0o600)
            },
        ),
        // Freed-block reuse under fsync: a's blocks are freed and b, fsynced, grows into
        // them: until b's data is on disk, no pointer of b's may be.
        scripted(
            "reuse-fsync",
            |d| {
                d.create("a")?;
                d.write("a", 0, 32 << 10)
            },
            |d| {
                d.unlink("a")?;
                d.create("b")?;
                d.write("b", 0, 32 << 10)?;
                d.fsync("b")
            },
        ),
        // setattr size changes are metadata calls: durable on return in sync (shrink within
        // a block, extend, shrink to zero, extend by a partial block).
        scripted(
            "setattr-size",
            |d| {
                d.create("a")?;
                d.write("a", 0, 64 << 10)
            },
            |d| {
                d.truncate("a", 10_000)?;
                d.truncate("a", 100_000)?;
                d.truncate("a", 0)?;
                d.truncate("a", 5_000)
            },
        ),
        // The batch path: the driver never forgets, so the unlinked and replaced inodes
        // (with data) are all freed at unmount, in inode order.
        Workload {
            forget: Forget::AtUnmount,
            ..scripted(
                "unlink-batch",
                |d| {
                    d.mkdir("d")?;
                    for (f, len) in [("a", 8192), ("b", 4096), ("d/c", 16384), ("e", 4096)] {
                        d.create(f)?;
                        d.write(f, 0, len)?;
                    }
                    Ok(())
                },
                |d| {
                    d.unlink("a")?;
                    d.unlink("d/c")?;
                    d.rename("e", "b")
                },
            )
        },
    ]
}

fn open_setup(d: &mut Driver) -> Result<(), FsError> {
    d.create("a")?;
    d.write("a", 0, 8192)?;
    d.create("b")
}

fn unlink_open(d: &mut Driver) -> Result<(), FsError> {
    let (ino, fh) = d.open_keep("a")?;
    d.unlink("a")?;
    d.write("b", 0, 4096)?;
    d.fsync("b")?;
    d.write("b", 4096, 4096)?;
    d.fsync("b")?;
    d.close(ino, fh)
}

fn tmpfile_link_and_orphan(d: &mut Driver) -> Result<(), FsError> {
    let (t, tfh) = d.tmpfile("d", 0)?;
    d.write_open(&t, tfh, 0, 8192)?;
    d.link_open(t.ino, "d/t")?;
    d.fsync_open(t.ino, tfh)?;
    d.close(t.ino, tfh)?;
    let (u, ufh) = d.tmpfile("d", 0)?;
    d.write_open(&u, ufh, 0, 8192)?;
    d.fsync_open(u.ino, ufh)?;
    d.create("d/b")?;
    d.write("d/b", 0, 4096)?;
    d.fsync("d/b")?;
    d.close(u.ino, ufh)?;
    let (x, xfh) = d.tmpfile("d", libc::O_EXCL)?;
    d.write_open(&x, xfh, 0, 4096)?;
    match d.link_open(x.ino, "d/x") {
        Err(e) if e.errno() == cairn_vfs::Errno::ENOENT => {}
        r => panic!("link of an O_EXCL tmpfile: {r:?}, not ENOENT"),
    }
    d.close(x.ino, xfh)
}

/// A seeded random sequence of operations on a small namespace. Calls may fail (a rename of
/// a directory into itself, rmdir of a non-empty directory): the recording holds their
/// errno and the oracle ignores them.
fn random(d: &mut Driver, seed: u64, ops: usize) {
    let mut rng = Rng::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut files: Vec<String> = Vec::new();
    let mut dirs: Vec<String> = vec![String::new()];
    let mut n = 0u32;
    let pick = |rng: &mut Rng, v: &Vec<String>| -> Option<String> {
        if v.is_empty() {
            None
        } else {
            Some(v[rng.below(v.len() as u64) as usize].clone())
        }
    };
    let join = |d: &str, n: &str| {
        if d.is_empty() {
            n.to_string()
        } else {
            format!("{d}/{n}")
        }
    };
    for _ in 0..ops {
        n += 1;
        let r = rng.below(100);
        let parent = pick(&mut rng, &dirs).unwrap_or_default();
        match r {
            0..=19 => {
                let p = join(&parent, &format!("f{n}"));
                if d.create(&p).is_ok() {
                    files.push(p);
                }
            }
            20..=39 => {
                if let Some(f) = pick(&mut rng, &files) {
                    let len = 16 * (1 + rng.below(1024)) as usize;
                    let _ = if rng.chance(1, 2) {
                        d.append(&f, len)
                    } else {
                        d.write(&f, rng.below(64 << 10), len)
                    };
                }
            }
            40..=47 => {
                let p = join(&parent, &format!("d{n}"));
                if d.mkdir(&p).is_ok() {
                    dirs.push(p);
                }
            }
            48..=57 => {
                if let Some(f) = pick(&mut rng, &files)
                    && d.unlink(&f).is_ok()
                {
                    files.retain(|x| x != &f);
                }
            }
            58..=62 => {
                if dirs.len() > 1 {
                    let i = 1 + rng.below(dirs.len() as u64 - 1) as usize;
                    let victim = dirs[i].clone();
                    if d.rmdir(&victim).is_ok() {
                        dirs.remove(i);
                    }
                }
            }
            63..=72 => {
                // Rename a file (maybe over another) or a directory, across directories.
                if rng.chance(2, 3) {
                    if let Some(f) = pick(&mut rng, &files) {
                        let to = if rng.chance(1, 3) {
                            pick(&mut rng, &files)
                                .unwrap_or_else(|| join(&parent, &format!("r{n}")))
                        } else {
                            join(&parent, &format!("r{n}"))
                        };
                        if to != f && d.rename(&f, &to).is_ok() {
                            files.retain(|x| x != &f && x != &to);
                            files.push(to);
                        }
                    }
                } else if dirs.len() > 1 {
                    let i = 1 + rng.below(dirs.len() as u64 - 1) as usize;
                    let from = dirs[i].clone();
                    let to = join(&parent, &format!("m{n}"));
                    if d.rename(&from, &to).is_ok() {
                        let fix = |p: &mut String| {
                            if crate::model::under(p, &from) {
                                *p = format!("{to}{}", &p[from.len()..]);
                            }
                        };
                        dirs.iter_mut().for_each(fix);
                        files.iter_mut().for_each(fix);
                    }
                }
            }
            73..=77 => {
                if let Some(f) = pick(&mut rng, &files) {
                    let p = join(&parent, &format!("l{n}"));
                    if d.link(&f, &p).is_ok() {
                        files.push(p);
                    }
                }
            }
            78..=81 => {
                let _ = d.symlink(&join(&parent, &format!("s{n}")), &format!("target-{n}"));
            }
            82..=87 => {
                if let Some(f) = pick(&mut rng, &files) {
                    let _ = d.truncate(&f, rng.below(32 << 10));
                }
            }
            88..=91 => {
                if let Some(f) = pick(&mut rng, &files) {
                    let _ = d.chmod(&f, 0o600 | (rng.below(8) as u32) << 3);
                }
            }
            _ => {
                if let Some(f) = pick(&mut rng, &files) {
                    let _ = d.fsync(&f);
                }
            }
        }
    }
}

/// The metadata pattern of unpacking a source tree: directories first, then each file
/// created, written in 10 KiB records, its mode and times set; a few symlinks.
fn untar(d: &mut Driver, seed: u64) -> Result<(), FsError> {
    let mut rng = Rng::new(seed);
    let top = "src-1.0";
    d.mkdir(top)?;
    let subdirs = ["lib", "lib/compat", "include", "doc", "tests", "tests/data"];
    for s in subdirs {
        d.mkdir(&format!("{top}/{s}"))?;
    }
    let mut k = 0;
    for dir in std::iter::once("").chain(subdirs) {
        let count = 3 + rng.below(6);
        for _ in 0..count {
            k += 1;
            let path = if dir.is_empty() {
                format!("{top}/file{k}.c")
            } else {
                format!("{top}/{dir}/file{k}.c")
            };
            d.create(&path)?;
            let size = 16 * (1 + rng.below(1200)) as usize;
            let mut off = 0;
            while off < size {
                let n = (size - off).min(10240);
                d.write(&path, off as u64, n)?;
                off += n;
            }
            d.chmod(&path, if rng.chance(1, 5) { 0o755 } else { 0o644 })?;
            d.touch(&path)?;
        }
    }
    d.symlink(&format!("{top}/README"), "doc/file1.c")?;
    d.symlink(&format!("{top}/lib/current"), "compat")?;
    Ok(())
}

fn build_setup(d: &mut Driver, seed: u64) -> Result<(), FsError> {
    let mut rng = Rng::new(seed ^ 0xb17d);
    d.mkdir("src")?;
    d.mkdir("obj")?;
    d.mkdir("bin")?;
    for i in 0..12 {
        let p = format!("src/m{i}.c");
        d.create(&p)?;
        d.write(&p, 0, 16 * (64 + rng.below(400)) as usize)?;
    }
    Ok(())
}

/// The metadata pattern of `make`: read each source, write the object to a temporary name
/// and rename it into place (over the previous build's), link a binary with fsync, then a
/// partial clean and rebuild.
fn build(d: &mut Driver, seed: u64) -> Result<(), FsError> {
    let mut rng = Rng::new(seed);
    for round in 0..2 {
        for i in 0..12 {
            if round == 1 && i % 3 != 0 {
                continue;
            }
            d.read(&format!("src/m{i}.c"))?;
            let tmp = format!("obj/m{i}.o.tmp");
            d.create(&tmp)?;
            d.write(&tmp, 0, 16 * (100 + rng.below(600)) as usize)?;
            d.rename(&tmp, &format!("obj/m{i}.o"))?;
        }
        d.create("bin/prog.tmp")?;
        d.write("bin/prog.tmp", 0, 96 << 10)?;
        d.fsync("bin/prog.tmp")?;
        d.chmod("bin/prog.tmp", 0o755)?;
        d.rename("bin/prog.tmp", "bin/prog")?;
        if round == 0 {
            for i in (0..12).step_by(3) {
                d.unlink(&format!("obj/m{i}.o"))?;
            }
        }
    }
    Ok(())
}
