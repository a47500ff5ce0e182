//! cairn-ffs: the FFS-style on-disk format and its metadata-update strategies.
//!
//! Layout of the crate: [`format`] is the on-disk format (codecs only, no I/O). The
//! engine's pieces are types of their own, each owning its state, its invariant and its
//! half of the undo (see `undo`): `volume` (geometry and block reads), `alloc`
//! (`Allocator`: bitmaps, group summaries, free counts), `inode` (`InodeTable`: in-core
//! inodes and orphans), `directory` (`Directories`: the name indexes, and the entry
//! updates), `handles` (`Handles`: open handles). `bmap` is the block map over them.
//! [`strategy`] holds the metadata-update disciplines behind one interface (facts, the
//! write path and the life cycle); `worker` is the one background thread of a mount (the
//! syncer and the strategy's background work); `ops` implements the
//! [`cairn_vfs::FileSystem`] contract on top; `undo` makes a failed operation change
//! nothing; `mkfs` creates file systems (the one writer outside a strategy); [`bgcheck`]
//! is soft updates' background fsck of the live mount (the epoch rule).
//!
//! Concurrency: one mutex, the engine's lock, guards the in-memory state of a mounted file
//! system ([`State`]: the pieces above and the superblock fields). Requests from several
//! FUSE threads serialize on it; the buffer cache below has its own locks; a per-file lock
//! (`Ffs::ilock`, taken before the engine's) orders a file's data path. Whether the
//! engine's lock is held across device writes and flushes is the strategy's
//! [`strategy::IoModel`]: in `sync` (`Serialized`) it is, as a classic FFS holds the vnode
//! locks of the operation; in `async` (`Concurrent`) it never is, so the syncer, memory
//! pressure, fsync, sync(2) and a write's stream never stall other calls. docs/DESIGN.md,
//! "Locks and device I/O", has the lock order.

pub mod bgcheck;
pub mod format;
pub mod strategy;

mod acl;
mod alloc;
mod bmap;
mod directory;
mod handles;
mod inode;
mod mkfs;
mod ops;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tmpfile_tests;
mod undo;
mod volume;
mod worker;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::{BufRef, BufferCache, CacheConfig};
use cairn_vfs::FsError;
use cairn_vfs::modes::AfterCrash;
use cairn_vfs::options::OptionSpec;
use parking_lot::Mutex;

use crate::alloc::Allocator;
use crate::directory::Directories;
use crate::format::{DiskInode, Geometry, GroupDesc, Superblock, kind, superblock};
use crate::handles::Handles;
use crate::inode::{InCore, InodeTable};
use crate::strategy::{Io, Strategy};
use crate::volume::Volume;
use crate::worker::Worker;

pub use mkfs::{default_journal_size, mkfs, mkfs_device};

pub use strategy::{ModeInfo, modes};

/// Options of `cairn mount -o ...`.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// One of [`modes`]' names.
    pub mode: String,
    /// Options the mode parses itself (a journal's `log=`, `commit=`), in the order given;
    /// checked against the mode when the strategy is made (`strategy::make`).
    pub mode_options: Vec<(String, Option<String>)>,
    /// Buffer-cache budget in bytes.
    pub cache_bytes: u64,
    /// How often the syncer writes dirty buffers; `None` = the mode's default (30 s for async).
    pub syncer_interval: Option<Duration>,
    pub read_only: bool,
    /// Mount read-write although the image was not unmounted cleanly and its last mode
    /// needs fsck after a crash (`-o force`); see `Ffs::mount_device_with_strategy`.
    pub force: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            mode: "sync".into(),
            mode_options: Vec::new(),
            cache_bytes: 256 << 20,
            syncer_interval: None,
            read_only: false,
            force: false,
        }
    }
}

/// The format's own mount options (each mode adds its own: [`ModeInfo`]'s `options`). The
/// help is generated from this list, and [`MountOptions::set`] refuses a key that is in no
/// list, so what the help shows and what a mount takes are one list.
pub const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        key: "mode",
        values: "NAME",
        default: "sync",
        help: "the metadata-update mode (the modes are listed above)",
    },
    OptionSpec {
        key: "cache",
        values: "SIZE",
        default: "256M",
        help: "buffer-cache budget (K, M, G suffixes)",
    },
    OptionSpec {
        key: "syncer",
        values: "SECS",
        default: "",
        help: "how often the syncer thread writes dirty buffers; by default the mode's (30 s for async)",
    },
    OptionSpec {
        key: "force",
        values: "",
        default: "",
        help: "mount read-write an image a crash left behind although its last mode needs fsck first (by default refused: run cairn fsck -y)",
    },
];

impl MountOptions {
    /// Applies one `-o key[=value]` option. A key no mode parses is an error naming it; a
    /// mode's own option is kept for the mode ([`MountOptions::check`] checks the set).
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<(), String> {
        let need = |v: Option<&'_ str>| -> Result<String, String> {
            v.map(str::to_string)
                .ok_or_else(|| format!("option '{key}' needs a value"))
        };
        match key {
            "mode" => {
                let v = need(value)?;
                if !modes().iter().any(|m| m.name == v.as_str()) {
                    let names: Vec<_> = modes().iter().map(|m| m.name).collect();
                    return Err(format!("unknown mode '{v}' (known: {})", names.join(", ")));
                }
                self.mode = v;
            }
            "cache" => self.cache_bytes = parse_size(&need(value)?)?,
            "syncer" => {
                let secs: f64 = need(value)?
                    .parse()
                    .map_err(|_| format!("bad syncer interval '{}'", value.unwrap_or("")))?;
                if !(secs.is_finite() && secs > 0.0) {
                    return Err("syncer interval must be > 0 seconds".into());
                }
                self.syncer_interval = Some(Duration::from_secs_f64(secs));
            }
            "ro" => self.read_only = true,
            "force" => self.force = true,
            "rw" => self.read_only = false,
            _ if strategy::is_mode_option(key) => self
                .mode_options
                .push((key.to_string(), value.map(str::to_string))),
            _ => return Err(format!("unknown mount option '{key}'")),
        }
        debug_assert!(
            matches!(key, "ro" | "rw")
                || cairn_vfs::options::find(OPTIONS, key).is_some()
                || strategy::is_mode_option(key),
            "mount option '{key}' is parsed but not listed in OPTIONS"
        );
        Ok(())
    }

    /// Checks the options as a whole: the mode's own options against the mode, whatever
    /// order `-o` gave them in (`log=file,mode=journal` and `mode=journal,log=file` alike).
    pub fn check(&self) -> Result<(), String> {
        strategy::make(&self.mode, &self.mode_options).map(|_| ())
    }
}

pub use cairn_vfs::parse_size;

/// Options of `cairn mkfs`.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Size of the file system in bytes; `None` = the whole device/image as it is.
    pub size: Option<u64>,
    pub block_size: u32,
    /// Number of inodes; `None` = one per 16 KiB.
    pub inodes: Option<u64>,
    pub label: String,
    /// Blocks per group; `None` = 8 × block size (one bitmap block). Smaller groups give
    /// small test images several groups.
    pub blocks_per_group: Option<u64>,
    /// Overwrite an image or device that already holds a file system or other data
    /// (`--force`); a mounted or locked one is refused regardless.
    pub force: bool,
    /// Create an image file larger than the free space of the file system holding it
    /// (`--sparse`): writes into it may later fail with ENOSPC from the host.
    pub sparse: bool,
    /// Bytes of the journal's log area after the last group (`--journal-size`, for
    /// `mode=journal,log=file`); `None` or 0: no log area (`cairn mkfs` passes
    /// [`default_journal_size`] when not told).
    pub journal_size: Option<u64>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            size: None,
            block_size: 4096,
            inodes: None,
            label: String::new(),
            blocks_per_group: None,
            force: false,
            sparse: false,
            journal_size: None,
        }
    }
}

/// Everything the engine's lock protects: the engine's pieces (each its own type, with its
/// own invariant and its own half of the undo) and the superblock fields.
pub(crate) struct State {
    pub sb: Superblock,
    pub alloc: Allocator,
    pub inodes: InodeTable,
    pub dirs: Directories,
    pub handles: Handles,
    /// The call in progress (between the strategy's `begin_op` and `end_op`): facts are
    /// declared only inside one.
    pub op: Option<OpCtx>,
    /// While a background check scans (`bgcheck`): the blocks and inodes every fact and
    /// release since the scan began touched. Only untouched ones may be fixed.
    pub bg: Option<bgcheck::Marks>,
}

/// One call in progress: its kind, the strategy's state for it, and what the strategy has
/// released to the allocator and the engine has not yet cleared.
pub(crate) struct OpCtx {
    pub kind: strategy::OpKind,
    pub state: strategy::OpState,
    pub released: Vec<strategy::Release>,
    /// Blocks among `released` the allocator must not hand out until their hold opens.
    pub holds: Vec<(Vec<u64>, strategy::Hold)>,
}

/// Per-operation-type counts for `cairn stats`.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct OpStat {
    pub calls: u64,
    pub device_writes: u64,
    pub device_flushes: u64,
}

pub(crate) fn corrupt_err(msg: impl Into<String>) -> FsError {
    let m = msg.into();
    log::error!("corruption detected: {m}");
    FsError::Corrupt(m)
}

/// Stripes of the per-file locks (`Ffs::ilocks`): two files share one only by their
/// numbers' remainder, which costs a wait now and then, never a deadlock (a call holds one).
const ILOCK_STRIPES: u64 = 256;

/// A mounted file system. Implements [`cairn_vfs::FileSystem`].
pub struct Ffs {
    pub(crate) vol: Volume,
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) io: Io,
    pub(crate) strategy: Box<dyn Strategy>,
    pub(crate) st: Mutex<State>,
    pub(crate) read_only: bool,
    pub(crate) max_file_size: u64,
    /// The syncer and the strategy's background work (see `worker`).
    pub(crate) worker: Worker,
    /// Per-file locks, striped by inode number: a write holds its file's exclusively from
    /// its first pass to its last (in a `Concurrent` mode the engine's lock is released
    /// in between, while its data goes to the device); reads and fsync hold it shared;
    /// truncation exclusively. Taken before the engine's lock, never after it.
    ilocks: Box<[parking_lot::RwLock<()>]>,
    /// Device counters per operation type (for `cairn stats`).
    pub(crate) stats: Mutex<HashMap<&'static str, OpStat>>,
    unmounted: AtomicBool,
    pub(crate) ops_total: AtomicU64,
    /// When reads update access times (`FileSystem::set_atime`).
    pub(crate) atime: parking_lot::Mutex<cairn_vfs::Atime>,
}

impl Ffs {
    /// Opens and mounts the file system on `path`. A bad image gives an error whose message
    /// is one line naming the problem.
    pub fn mount(path: &Path, opts: &MountOptions) -> Result<Arc<Ffs>, FsError> {
        Self::mount_on(path, opts, None)
    }

    /// [`Ffs::mount`] with the image's device under a model of a mechanical disk (`-o
    /// disk=`, docs/DISKS.md), when `disk` names one.
    pub fn mount_on(
        path: &Path,
        opts: &MountOptions,
        disk: Option<&cairn_blockdev::disk::DiskOptions>,
    ) -> Result<Arc<Ffs>, FsError> {
        let head = cairn_blockdev::read_bytes_at(path, 0, superblock::SB_BYTES).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                FsError::Refused(
                    cairn_vfs::Errno::EINVAL,
                    "not a cairn file system (too small to hold a superblock)".into(),
                )
            } else {
                FsError::Corrupt(format!("cannot read superblock: {e}"))
            }
        })?;
        if !superblock::has_magic(&head) {
            return Err(FsError::Refused(
                cairn_vfs::Errno::EINVAL,
                "not a cairn file system (no cairn superblock at its start)".into(),
            ));
        }
        let sb = Superblock::decode(&head).map_err(|e| FsError::Corrupt(e.0))?;
        // The image lock (exclusive for read-write, shared for read-only) is taken here and
        // held for the life of the mount: two mounts of one image would each hand out the
        // same free blocks (see cairn_blockdev::lock).
        let dev = cairn_blockdev::open_path(path, sb.block_size, opts.read_only).map_err(|e| {
            if e.kind() == std::io::ErrorKind::ResourceBusy {
                FsError::Refused(cairn_vfs::Errno::EBUSY, e.to_string())
            } else {
                FsError::Io(e)
            }
        })?;
        let dev = cairn_blockdev::disk::wrap(dev, disk)
            .map_err(|e| FsError::Refused(cairn_vfs::Errno::EINVAL, e.to_string()))?;
        Self::mount_device(dev, opts)
    }

    /// Mounts the file system on an already open device (tests, the crash harness).
    pub fn mount_device(
        dev: Arc<dyn BlockDevice>,
        opts: &MountOptions,
    ) -> Result<Arc<Ffs>, FsError> {
        let strategy = strategy::make(&opts.mode, &opts.mode_options)
            .map_err(|e| FsError::Refused(cairn_vfs::Errno::EINVAL, e))?;
        Self::mount_device_with_strategy(dev, opts, strategy)
    }

    /// Mounts with a strategy that is not in the registry; `opts.mode` is ignored. For
    /// harnesses only: the crash harness plugs in deliberately broken orderings to prove
    /// that its checker catches them.
    pub fn mount_device_with_strategy(
        dev: Arc<dyn BlockDevice>,
        opts: &MountOptions,
        strategy: Box<dyn Strategy>,
    ) -> Result<Arc<Ffs>, FsError> {
        let bs = dev.block_size() as usize;
        let mut head = vec![0u8; bs];
        dev.read_blocks(0, &mut head)?;
        let mut sb = Superblock::decode(&head).map_err(|e| FsError::Corrupt(e.0))?;
        let geo = sb.geometry().map_err(|e| FsError::Corrupt(e.0))?;
        if geo.block_size as usize != bs {
            return Err(FsError::Corrupt(format!(
                "device opened with block size {bs}, superblock says {}",
                geo.block_size
            )));
        }
        if dev.num_blocks() < geo.total_blocks {
            return Err(FsError::Corrupt(format!(
                "image truncated: superblock says {} blocks, device has {}",
                geo.total_blocks,
                dev.num_blocks()
            )));
        }
        // A read-write mount of an image a crash left behind would build on whatever the
        // crash left: in a mode that needs fsck after a crash (sync, async: 000 §5), the
        // bitmaps may disagree with the inodes, and new allocations would double-use blocks.
        // FFS refuses such a mount until fsck has run; so does cairn, unless forced. Modes
        // that recover by themselves (soft updates, a journal) declare so and mount.
        if !opts.read_only && !opts.force && sb.state == superblock::STATE_MOUNTED {
            let last = modes().iter().find(|m| m.name == sb.last_mode);
            if last.is_none_or(|m| m.guarantees.after_crash == AfterCrash::Fsck) {
                return Err(FsError::Refused(
                    cairn_vfs::Errno::EUCLEAN,
                    format!(
                        "not unmounted cleanly (last mounted in mode '{}'): run `cairn fsck -y` \
                         on it first, mount it read-only, or mount with -o force",
                        sb.last_mode
                    ),
                ));
            }
        }
        if sb.feature_ro_compat != 0 && !opts.read_only {
            return Err(FsError::Corrupt(format!(
                "unknown read-only-compatible features {:#x}: mount with -o ro",
                sb.feature_ro_compat
            )));
        }
        strategy.attach(&sb)?;
        let dev = if opts.read_only {
            // Nothing is written: a mode with a log shows its replay in memory.
            strategy.read_only_view(dev, &sb)?
        } else {
            // A mode with a log replays it before anything else is read.
            strategy.recover(dev.as_ref(), &sb)?;
            dev
        };
        // The mode's write hooks are in place before the first block is read: every write
        // the cache will ever issue goes through them.
        let cache = BufferCache::new(
            dev.clone(),
            CacheConfig {
                budget_bytes: opts.cache_bytes,
                syncer_interval: None,
                ..CacheConfig::default()
            },
            strategy.write_hooks(),
        );
        let mut groups = Vec::with_capacity(geo.group_count as usize);
        for g in 0..geo.group_count {
            let b = cache.read(geo.desc_block(g))?;
            b.set_kind(kind::GROUP);
            let d = GroupDesc::decode(&b.read(), g).map_err(|e| FsError::Corrupt(e.0))?;
            if d.free_blocks as u64 > geo.group_len(g)
                || d.free_inodes as u64 > geo.inodes_per_group
            {
                return Err(FsError::Corrupt(format!(
                    "group {g}: free counts exceed the group's size"
                )));
            }
            groups.push(d);
        }
        let syncer_interval = opts
            .syncer_interval
            .unwrap_or_else(|| strategy.syncer_interval());
        let fs = Arc::new(Ffs {
            io: Io::new(cache.clone()),
            vol: Volume { geo, cache },
            dev,
            strategy,
            st: Mutex::new(State {
                sb: sb.clone(),
                alloc: Allocator::new(groups),
                inodes: InodeTable::default(),
                dirs: Directories::default(),
                handles: Handles::default(),
                op: None,
                bg: None,
            }),
            read_only: opts.read_only,
            max_file_size: geo.max_file_size(),
            worker: Worker::idle(),
            ilocks: (0..ILOCK_STRIPES)
                .map(|_| parking_lot::RwLock::new(()))
                .collect(),
            stats: Mutex::new(HashMap::new()),
            unmounted: AtomicBool::new(false),
            ops_total: AtomicU64::new(0),
            atime: parking_lot::Mutex::new(cairn_vfs::Atime::default()),
        });
        {
            // The root must be a readable directory, or nothing works.
            let mut st = fs.st.lock();
            fs.dir_index(&mut st, format::ROOT_INO)
                .map_err(|e| FsError::Corrupt(format!("root directory unusable: {e}")))?;
        }
        if !opts.read_only {
            // Mark the superblock "mounted" so a crash leaves evidence for fsck.
            sb.state = superblock::STATE_MOUNTED;
            sb.mount_count = sb.mount_count.wrapping_add(1);
            sb.mounted_ns = inode::now_ns();
            sb.last_mode = fs.strategy.recorded_mode().to_string();
            fs.st.lock().sb = sb;
            fs.strategy.mount(&*fs)?;
            fs.write_superblock()?;
            fs.worker
                .start(
                    Arc::downgrade(&fs),
                    syncer_interval,
                    fs.strategy.background_interval(),
                )
                .map_err(FsError::Io)?;
        }
        Ok(fs)
    }

    pub(crate) fn bread(&self, blk: u64, k: u8) -> Result<BufRef, FsError> {
        self.vol.bread(blk, k)
    }

    pub(crate) fn bnew(&self, blk: u64, k: u8) -> BufRef {
        self.vol.bnew(blk, k)
    }

    /// The in-core inode `ino`, loading it (see [`InodeTable::get`]).
    pub(crate) fn iget<'a>(&self, st: &'a mut State, ino: u64) -> Result<&'a mut InCore, FsError> {
        st.inodes.get(&self.vol, ino)
    }

    /// Puts a newly allocated inode in core.
    pub(crate) fn iinsert(&self, st: &mut State, ino: u64, d: DiskInode) {
        st.inodes.insert(ino, d)
    }

    /// Encodes inode `ino` into its table block and tells the strategy
    /// (`update_inodeblock`); returns the block.
    pub(crate) fn store(&self, st: &mut State, ino: u64) -> Result<BufRef, FsError> {
        let (b, was) = st.inodes.store(&self.vol, ino)?;
        self.fact(st, |s, tx| s.update_inodeblock(tx, ino, &b, was))?;
        Ok(b)
    }

    /// The attributes of in-core inode `ino`.
    pub(crate) fn attr(&self, st: &mut State, ino: u64) -> Result<cairn_vfs::Attr, FsError> {
        let ic = self.iget(st, ino)?;
        Ok(inode::attr_of(&self.vol.geo, ino, ic))
    }

    /// Declares a fact to the strategy, inside the call in progress; what the strategy
    /// released meanwhile is cleared in the allocator before this returns (rule 2 is the
    /// strategy's to keep: it releases only when its order allows).
    pub(crate) fn fact<R>(
        &self,
        st: &mut State,
        f: impl FnOnce(&dyn Strategy, &mut strategy::Tx) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        let State { op, bg, .. } = st;
        let op = op
            .as_mut()
            .ok_or_else(|| corrupt_err("a fact declared outside any call"))?;
        let mut tx = strategy::Tx {
            kind: op.kind,
            io: &self.io,
            state: &mut op.state,
            released: &mut op.released,
            holds: &mut op.holds,
        };
        let r = match bg {
            // A background check is scanning: the fact marks what it names on its way to
            // the strategy (`bgcheck`, the epoch rule).
            Some(marks) => f(&bgcheck::Marker::new(&*self.strategy, marks), &mut tx)?,
            None => f(&*self.strategy, &mut tx)?,
        };
        self.apply_releases(st)?;
        Ok(r)
    }

    /// Clears in the allocator the bits the strategy released.
    pub(crate) fn apply_releases(&self, st: &mut State) -> Result<(), FsError> {
        let Some(op) = st.op.as_mut() else {
            return Ok(());
        };
        if op.released.is_empty() {
            return Ok(());
        }
        let holds = std::mem::take(&mut op.holds);
        for r in std::mem::take(&mut op.released) {
            if let Some(marks) = st.bg.as_mut() {
                marks.release(&r);
            }
            match r {
                strategy::Release::Blocks(blocks) => {
                    for b in blocks {
                        st.alloc.free_block(&self.vol, b)?;
                    }
                }
                strategy::Release::Inode { ino, is_dir } => {
                    st.alloc.free_inode(&self.vol, ino, is_dir)?;
                }
            }
        }
        // Freed just above, kept from reuse until the strategy opens the hold.
        for (blocks, until) in holds {
            st.alloc.hold(&self.vol, blocks, until);
        }
        Ok(())
    }

    /// Runs `f` as one call of `kind`: the strategy's `begin_op`, the facts `f` declares,
    /// `end_op`; a kind that changes metadata inside an undo scope, its `end_op` included,
    /// so a failure anywhere takes the whole call back (and the strategy is told, with
    /// `end_op(ok: false)`, after the rollback).
    pub(crate) fn in_op<T>(
        &self,
        st: &mut State,
        kind: strategy::OpKind,
        f: impl FnOnce(&mut State) -> Result<T, FsError>,
    ) -> Result<T, FsError> {
        let state = self.strategy.begin_op(kind)?;
        st.op = Some(OpCtx {
            kind,
            state,
            released: Vec::new(),
            holds: Vec::new(),
        });
        let body = |st: &mut State| -> Result<T, FsError> {
            let v = f(st)?;
            self.fact(st, |s, tx| s.end_op(tx, true))?;
            Ok(v)
        };
        let r = if kind == strategy::OpKind::Read {
            body(st)
        } else {
            self.atomically(st, body)
        };
        if r.is_err()
            && let Err(e) = self.fact(st, |s, tx| s.end_op(tx, false))
        {
            log::error!("ending a failed call: {e}");
        }
        st.op = None;
        r
    }

    /// Writes the primary superblock with the current summary counts, through the
    /// strategy (durably).
    fn write_superblock(&self) -> Result<(), FsError> {
        let b = {
            let mut st = self.st.lock();
            st.sb.free_blocks = st.alloc.free_blocks();
            st.sb.free_inodes = st.alloc.free_inodes();
            st.sb.dirs = st.alloc.dirs();
            st.sb.written_ns = inode::now_ns();
            let b = self.bread(0, kind::SUPERBLOCK)?;
            st.sb.encode(&mut b.write());
            b
        };
        self.vol.cache.mark_dirty(&b);
        self.strategy.write_superblock(self, &b)
    }

    /// The lock of file `ino` (see `Ffs::ilocks`).
    pub(crate) fn ilock(&self, ino: u64) -> &parking_lot::RwLock<()> {
        &self.ilocks[(ino % ILOCK_STRIPES) as usize]
    }

    /// Runs `f` with the engine's lock held if the mode's I/O is serialized on it, without
    /// it otherwise (see `IoModel`).
    pub(crate) fn with_io_lock<T>(&self, f: impl FnOnce() -> T) -> T {
        match self.strategy.io_model() {
            strategy::IoModel::Serialized => {
                let _st = self.st.lock();
                f()
            }
            strategy::IoModel::Concurrent => f(),
        }
    }

    /// The strategy's write-back for `why`, under the engine's lock only in a serialized
    /// mode.
    pub(crate) fn sync_as(&self, why: strategy::SyncWhy) -> Result<(), FsError> {
        self.with_io_lock(|| self.strategy.sync(self, why))
    }

    /// Flushes everything, frees unlinked-but-open inodes and marks the superblock clean.
    pub fn unmount(&self) -> Result<(), FsError> {
        if self.unmounted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.worker.stop();
        if self.read_only {
            return Ok(());
        }
        {
            let mut st = self.st.lock();
            // In inode order, not the map's hash order: each free is an ordered write, so
            // the order is part of the device's write stream, which must be the same on
            // every run (crash recordings are compared and replayed by seed).
            for ino in st.inodes.unlinked() {
                if let Some(ic) = st.inodes.loaded_mut(ino) {
                    ic.nopen = 0;
                    ic.nlookup = 0;
                    ic.writing = 0;
                }
                self.in_op(&mut st, strategy::OpKind::Reclaim, |st| {
                    self.reclaim(st, ino)
                })?;
            }
        }
        self.with_io_lock(|| self.strategy.unmount(self))?;
        self.st.lock().sb.state = superblock::STATE_CLEAN;
        self.write_superblock()
    }

    /// The mode this file system is mounted in.
    pub fn mode(&self) -> &'static str {
        self.strategy.name()
    }

    pub fn geometry(&self) -> Geometry {
        self.vol.geo
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// The buffer cache's counters (what `cairn stats` shows as `cache`).
    pub fn cache_stats(&self) -> cairn_bufcache::CacheStats {
        self.vol.cache.stats()
    }
}

impl Drop for Ffs {
    fn drop(&mut self) {
        if !self.unmounted.load(Ordering::Acquire)
            && let Err(e) = self.unmount()
        {
            log::error!("unmount on drop failed: {e}");
        }
    }
}

impl strategy::Engine for Ffs {
    fn io(&self) -> &Io {
        &self.io
    }

    fn release(&self, r: strategy::Release) -> Result<(), FsError> {
        let mut st = self.st.lock();
        self.in_op(&mut st, strategy::OpKind::Background, |st| {
            if let Some(op) = st.op.as_mut() {
                op.released.push(r);
            }
            self.apply_releases(st)
        })
    }

    fn apply_link_drop(&self, ino: u64, n: u32) -> Result<(), FsError> {
        let mut st = self.st.lock();
        self.in_op(&mut st, strategy::OpKind::Background, |st| {
            let ic = self.iget(st, ino)?;
            let before = ic.d.nlink;
            // Never below the names that still exist.
            ic.d.nlink = ic.d.nlink.saturating_sub(n).max(ic.effnlink);
            let after = ic.d.nlink;
            let b = self.store(st, ino)?;
            let f = strategy::LinkChange {
                ino,
                inode_buf: &b,
                before,
                after,
                why: strategy::LinkWhy::Drop,
            };
            self.fact(st, |s, tx| s.change_linkcnt(tx, &f))?;
            self.reclaim(st, ino)
        })
    }
}
