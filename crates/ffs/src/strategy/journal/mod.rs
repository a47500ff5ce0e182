//! `journal`: write-ahead logging of metadata (the journaling paper, 001 §3.2, §5, §6; the
//! LFFS of 000). Every call's metadata changes are logged as one redo operation at the
//! call's end, and a block reaches its home location only after the log records
//! describing it are durable (write-ahead). A crash is repaired by replaying the complete
//! operations logged since the last checkpoint (`recover`, before anything else is read).
//!
//! # What each fact does
//!
//! | fact | journal |
//! |---|---|
//! | `inomapdep`, `blkmapdep` | the bitmap and descriptor join the call's buffers; a new block's image is forgotten (logged whole) |
//! | `allocdirect`/`allocindir` | the new metadata block and the indirect block join |
//! | `update_inodeblock`, `change_linkcnt`, `attr_change` | the inode block (and xattr block) join |
//! | `directory_add`/`_remove`/`_change` | the entry's block (and a new directory's first block) join; drops apply now |
//! | `freeblocks` | the inode and cleared indirect blocks join; the freed blocks are released at once, held from reuse until the call is durable, and revoked in the log; their group blocks join; a shrunk file's zeroed tail block waits for the call's END record |
//! | `freefile` | the inode bit is released at once; its group blocks join |
//! | `end_op` | one operation: every joined buffer's bytes that differ from its last logged image, the revokes, the orphan entries, an END record; data first, then forced for `commit=sync` |
//! | `after_op` | `commit=group`: the call's END record forced, with the engine's lock released (concurrent calls share the flush) |
//!
//! Frees are released inside the call that frees, so the bitmap change is logged with it,
//! and the freed blocks are held from the allocator until the call's END record is durable
//! (`Tx::release_held`; the journal opens the hold after the force that makes it so, ext3/4's
//! way): a freed block's next contents may be a file's data, which is never logged and must
//! not land while the free could be lost. No call is forced for its frees.
//!
//! # Ordered data
//!
//! No log record reaches the disk except through a force (the log's write-behind is off),
//! and every force that can make pointers to data durable writes and flushes the dirty data
//! first (`Inner::ordered_sync`, and `end_op`'s own force): durable pointers never expose
//! data that is not (ext3/4's `data=ordered`).
//!
//! # Checkpoints
//!
//! Every second (`background`) the checkpoint moves to the oldest LSN a dirty buffer still
//! needs (its low LSN), after a flush of the file system's device makes every completed
//! home write durable. When the log runs low (a quarter left), the next call first writes
//! every dirty buffer home and checkpoints to the end (`begin_op`, before it changes
//! anything): a full log slows a writer, never fails it.
//!
//! docs/DESIGN.md ("The journal") has the argument, docs/FORMAT.md the record bytes.

mod record;
mod replay;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use cairn_blockdev::{BlockDevice, FileDevice};
use cairn_bufcache::{Buf, BufRef, BufferCache, Pressure, WriteHooks};
use cairn_vfs::modes::{
    AfterCrash, Allowed, Commit as VfsCommit, Facts, Family, Guarantees, LogPlacement, OptionSpec,
    Recovery,
};
use cairn_vfs::{Errno, FsError, Result};
use cairn_wal::{GroupWait, Lsn, Options as WalOptions, Region, Wal, WalError};
use parking_lot::{Mutex, RwLock};

use super::{
    AllocDirect, AllocIndir, Apply, AttrChange, Blk, BlkMapDep, DirAdd, DirChange, DirRemove,
    Engine, FreeBlocks, FreeFile, FsyncReq, Hold, Ino, InoMapDep, LinkChange, ModeInfo, OpKind,
    OpState, Release, Strategy, SyncWhy, Tx,
};
use crate::format::superblock::Geometry;
use crate::format::superblock::STATE_MOUNTED;
use crate::format::{Superblock, kind};

pub use record::{Chunk, Entry};
pub use replay::{ReplayStats, ReplayView, Replayed, replay};

/// When a call's log records are forced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// At the end of every call that is a durability point: one log force per call (001
    /// §3.2's "-sync" systems).
    Sync,
    /// As `Sync`, but forced after the engine's lock is released (`after_op`), through the
    /// log's group commit: calls ending together share a flush.
    Group,
    /// On fsync, a whole-file-system sync (`cairn sync`, `sync MNT`: `FileSystem::sync_all`;
    /// sync(2) and syncfs(2) never reach a FUSE daemon), unmount and every `commit_interval`
    /// (default
    /// [`DEFAULT_COMMIT_INTERVAL`]) only: integrity without durability (001's "-async").
    Async,
}

/// Where the log lives.
#[derive(Clone)]
pub enum LogSpec {
    /// `log=file` (the default): the log area after the file system's last group, made by
    /// `cairn mkfs --journal-size N` (superblock `journal_first`, `journal_blocks`).
    File,
    /// `log=dev:PATH`: a log made by `cairn wal mkfs` on its own image or device.
    Dev(PathBuf),
    /// An already open device holding a log (tests, the crash harness).
    Device(Arc<dyn BlockDevice>),
}

/// How often `commit=async` commits by default: ext4's (jbd2's) default, the bound on
/// what a crash may take back. Committing every second wrote dirty data home every second
/// (ordered data precedes the commit that names it), which cost PostMark a fifth of its
/// speed against async (0.79× at 1 s, 0.92× at 5 s: docs/bench/history.md).
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(5);

/// The smallest log the journal accepts: room for many operations between checkpoints.
pub const MIN_LOG_BYTES: u64 = 256 << 10;

/// Records are at most this large (an operation spans several when it must).
const MAX_RECORD: usize = 256 << 10;

/// Clean buffers' last logged images kept beyond this many are dropped at a checkpoint
/// (their next change is logged whole).
const SHADOW_CAP: usize = 4096;

/// The mode as the registry lists it.
pub(super) const MODE: ModeInfo = ModeInfo {
    name: "journal",
    description: "write-ahead log of metadata (LFFS): calls redo-logged as whole operations, replayed at mount",
    guarantees: Guarantees {
        metadata_on_return: true,
        fsync_data_first: true,
        // Ordered data (DESIGN.md): a call's data is written and flushed before the records
        // that make its pointers or size durable, and a freed block is revoked in the log
        // and held from the allocator until its free is durable, so no recovery puts a
        // logged image over data a returned call wrote. commit=async's timer leaves a gap
        // (DESIGN.md): journal-async does not promise it.
        no_stale_data: true,
        names_kept: true,
        corrupt: Allowed::Never,
        leak: Allowed::Never,
        interrupted_rename: Allowed::Never,
        after_crash: AfterCrash::Recover,
        basis: "001 §5.3: recovery replays complete operations; 001 §6: rename atomic; commit=sync/group durable on return (commit=async: only fsync); ordered data: no pointer or size durable before its data, no freed block's logged image replayed over its next owner (revoke)",
    },
    facts: Facts {
        family: Family::Journal,
        commit: VfsCommit::Sync,
        recovery: Recovery::LogReplay,
        log: LogPlacement::Area,
    },
    options: &[LOG, LOG_DISK, COMMIT, COMMIT_INTERVAL],
    make: |o| Ok(Box::new(Journal::from_options(o)?)),
};

const LOG: OptionSpec = OptionSpec {
    key: "log",
    values: "file|dev:PATH",
    default: "file",
    help: "where the log lives: the image's log area, which `cairn mkfs --journal-size` makes (file), or a log `cairn wal mkfs PATH` made (dev:PATH)",
};

const LOG_DISK: OptionSpec = OptionSpec {
    key: "log_disk",
    values: "MODEL[:opt...]",
    default: "",
    help: "log=dev:PATH: the log's device under a model of a mechanical disk, as disk= for the image (docs/DISKS.md)",
};

const COMMIT: OptionSpec = OptionSpec {
    key: "commit",
    values: "sync|group|async",
    default: "sync",
    help: "when calls are durable: on return (sync, group: shared flushes) or on fsync and every commit_interval (async)",
};

const COMMIT_INTERVAL: OptionSpec = OptionSpec {
    key: "commit_interval",
    values: "SECS",
    default: "5",
    help: "commit=async: seconds between commits, what a crash may take back at most (1 to 300; ext4's default too)",
};

/// The options of `journal-async` (its commit is fixed) and `journal-group` (no timer).
const ASYNC_OPTIONS: &[OptionSpec] = &[LOG, LOG_DISK, COMMIT_INTERVAL];
const GROUP_OPTIONS: &[OptionSpec] = &[LOG, LOG_DISK];

/// Refuses a mode option that `mode` does not take (one of another journal mode's).
fn only_options(
    mode: &str,
    allowed: &[OptionSpec],
    opts: &[(String, Option<String>)],
) -> std::result::Result<(), String> {
    match opts
        .iter()
        .find(|(k, _)| !allowed.iter().any(|a| a.key == k))
    {
        Some((k, _)) => Err(format!(
            "mount option '{k}' is not an option of mode {mode}"
        )),
        None => Ok(()),
    }
}

/// `commit=async` as a mode of its own, because it promises less: integrity after a crash,
/// durability only for what fsync, `cairn sync` (or `sync MNT`) or the commit timer (every
/// `commit_interval`) made durable (001's
/// "-async"). The crash harness holds each to its own promise.
pub(super) const MODE_ASYNC: ModeInfo = ModeInfo {
    name: "journal-async",
    description: "journal with commit=async: calls logged as whole operations, the log forced on fsync, `cairn sync MNT` and every commit_interval",
    guarantees: Guarantees {
        metadata_on_return: false,
        fsync_data_first: true,
        no_stale_data: false,
        names_kept: true,
        corrupt: Allowed::Never,
        leak: Allowed::Never,
        interrupted_rename: Allowed::Never,
        after_crash: AfterCrash::Recover,
        basis: "001 §3.2: an asynchronous log gives integrity without durability; 001 §5.3: recovery replays complete operations; 001 §6: rename atomic",
    },
    facts: Facts {
        family: Family::Journal,
        commit: VfsCommit::Async,
        recovery: Recovery::LogReplay,
        log: LogPlacement::Area,
    },
    options: ASYNC_OPTIONS,
    make: |o| {
        only_options("journal-async", ASYNC_OPTIONS, o)?;
        let mut j = Journal::from_options(o)?;
        j.commit = Commit::Async;
        j.name = "journal-async";
        Ok(Box::new(j))
    },
};

/// `commit=group` as a mode of its own: the same promise as `journal` (every call durable
/// when it returns), with the force made after the engine's lock is released so that calls
/// from many threads share log flushes (001 §3.2 names group commit and leaves it out).
/// Listed so that every tool that iterates the modes — the crash campaign, the real-mount
/// suites, the benchmarks — holds group commit to that promise too.
pub(super) const MODE_GROUP: ModeInfo = ModeInfo {
    name: "journal-group",
    description: "journal with commit=group: every call durable on return, concurrent calls share log flushes",
    guarantees: MODE.guarantees,
    facts: Facts {
        family: Family::Journal,
        commit: VfsCommit::Group,
        recovery: Recovery::LogReplay,
        log: LogPlacement::Area,
    },
    options: GROUP_OPTIONS,
    make: |o| {
        only_options("journal-group", GROUP_OPTIONS, o)?;
        let mut j = Journal::from_options(o)?;
        j.commit = Commit::Group;
        j.name = "journal-group";
        Ok(Box::new(j))
    },
};

/// Whether `mode`, as a superblock records it (`last_mode`), is a registered mode whose
/// recovery is its log's replay: read off the registry's facts, by the exact name a
/// journaled mount records (`Strategy::recorded_mode`), never by a prefix.
pub fn replays_log(mode: &str) -> bool {
    super::modes()
        .iter()
        .any(|m| m.name == mode && m.facts.recovery == Recovery::LogReplay)
}

/// Whether the log describes the file system of `sb`: a journaled mount is what ended
/// uncleanly. A journaled unmount empties the log, so records left behind a clean
/// superblock, or behind a crash in another mode, are older than what another mode (after
/// fsck or -o force) has written since — replaying them would undo it.
pub fn needs_replay(sb: &Superblock) -> bool {
    sb.state == STATE_MOUNTED && replays_log(&sb.last_mode)
}

/// The read-only view of a mode without a log (`mode`) of `sb`'s image: when a journaled
/// mount left the image uncleanly, its log area's operations replayed in memory, as the
/// journal's own read-only mount shows them (without them the mount would show, silently,
/// a file system missing calls the log made durable, or half of one). A log on another
/// device cannot be read from here: refused, naming the ways out.
pub fn foreign_read_only_view(
    mode: &str,
    dev: Arc<dyn BlockDevice>,
    sb: &Superblock,
) -> Result<Arc<dyn BlockDevice>> {
    if !needs_replay(sb) {
        return Ok(dev);
    }
    if sb.journal_area().ok().flatten().is_none() {
        return Err(refused(format!(
            "left mounted in mode '{}' with its log on another device, which a read-only mount \
             in mode {mode} cannot replay: mount it read-write in that mode (log=dev:PATH) to \
             replay the log, or read-only in that mode",
            sb.last_mode
        )));
    }
    log::warn!(
        "journal: left mounted in mode '{}': its log is replayed in memory for this read-only \
         mount in mode {mode}; a read-write mount in that mode, or `cairn fsck -y`, replays it \
         onto the disk",
        sb.last_mode
    );
    Journal::new(LogSpec::File, Commit::Sync).read_only_view(dev, sb)
}

/// `cairn fsck` without `-y` on a file system a journaled mount left uncleanly: `dev` (opened
/// with the file system's block size) as the replay of its log area would leave it, with
/// what that replay does — without writing anything. `None` when there is nothing to
/// replay. A log area that is missing, damaged or another file system's is an error naming
/// it (the caller checks the image as it is and says so).
pub fn replay_view(dev: Arc<dyn BlockDevice>) -> Result<Option<(Arc<ReplayView>, ReplayStats)>> {
    let mut head = vec![0u8; dev.block_size() as usize];
    dev.read_blocks(0, &mut head)?;
    let sb = Superblock::decode(&head).map_err(|e| FsError::Corrupt(e.0))?;
    let j = Journal::new(LogSpec::File, Commit::Sync);
    let records = j.pending_records(dev.as_ref(), &sb)?;
    if records.is_empty() {
        return Ok(None);
    }
    let view = Arc::new(ReplayView::new(dev));
    let Replayed { stats, .. } = replay(view.as_ref(), records)
        .map_err(|e| FsError::Corrupt(format!("journal log area: {e}")))?;
    Ok(Some((view, stats)))
}

thread_local! {
    /// `commit=group`: the END record the call on this thread logged and `after_op` forces
    /// once the engine's lock is released (the journal's `Inner` it belongs to, the LSN).
    static DEFERRED: std::cell::Cell<Option<(usize, u64)>> = const { std::cell::Cell::new(None) };
}

/// The journal strategy.
pub struct Journal {
    name: &'static str,
    commit: Commit,
    /// `commit=async`: time between commits.
    commit_every: Duration,
    /// When the timer last committed.
    last_commit: Mutex<std::time::Instant>,
    log: LogSpec,
    /// `log_disk=`: the log's own device under a model of a mechanical disk.
    log_disk: Option<cairn_blockdev::disk::DiskOptions>,
    inner: Arc<Inner>,
    /// A planted bug for the tests: blocks are written home without forcing the log first
    /// (neither by `sync` nor by `before_write`).
    #[cfg(test)]
    pub(crate) plant_home_first: bool,
}

/// What the strategy and its write hooks share.
struct Inner {
    /// The log, open from `recover` on.
    wal: RwLock<Option<Arc<Wal>>>,
    geo: RwLock<Option<Geometry>>,
    /// The mount's cache (weak: the cache holds these hooks).
    cache: RwLock<Weak<BufferCache>>,
    /// Appending and noting LSNs happen under this lock, and a checkpoint computes its
    /// target under it, so no record is released between its append and the buffers
    /// learning its LSN.
    log: Mutex<LogState>,
    /// Orphans the replay found: freed by `mount`, once the engine runs.
    recovered_orphans: Mutex<Vec<Ino>>,
    /// log=file: the log area, replayed by `recover`, opened by `mount`.
    pending_region: Mutex<Option<Region>>,
    /// A call that wrote data was logged and not forced: the next force writes dirty data
    /// first (ordered data).
    data_dirty: AtomicBool,
    /// A read-only mount: no log is open and nothing is logged (what a call changes in
    /// memory there, a read's atime, is never written).
    read_only: AtomicBool,
    /// Frees not yet durable: the END record of the operation that freed the blocks, and
    /// the hold keeping them from the allocator until that record is durable (in LSN
    /// order: `open_holds` opens them as forces make them durable).
    holds: Mutex<VecDeque<(u64, Hold)>>,
    /// The last call's emptied [`JOp`], for the next (`Spent`).
    spare_op: Mutex<Option<JOp>>,
    /// A planted bug for the tests: freed blocks may be reused at once (the hold opens at
    /// the call's end), before the free is durable.
    #[cfg(any(test, feature = "planted"))]
    plant_reuse: AtomicBool,
    /// A planted bug for the tests: commit=group's `after_op` returns without forcing the
    /// call's END record, so a call returns before it is durable.
    #[cfg(any(test, feature = "planted"))]
    plant_no_group_force: AtomicBool,
    /// A planted bug for the tests: recovery replays updates a later REVOKE record freed.
    #[cfg(any(test, feature = "planted"))]
    plant_ignore_revoke: AtomicBool,
}

/// Block-number keyed maps, hashed with FxHash (a multiplication per key): the shadow map
/// is looked up for every buffer of every call, and SipHash showed in the profile of a
/// create (`journal_cpu_cost_on_memory`). Block numbers are not chosen by an adversary.
type BlockMap<V> = rustc_hash::FxHashMap<u64, V>;

#[derive(Default)]
struct LogState {
    /// The image last logged of each block, the diff base of its next change.
    shadows: BlockMap<Shadow>,
    next_op: u64,
    /// Inodes whose link count reached 0 and that are not freed yet (held open): logged,
    /// and logged again at a checkpoint that would release their first record.
    orphans: std::collections::BTreeSet<Ino>,
    /// The LSN of the last operation listing every orphan (0: none).
    orphan_snapshot: u64,
    /// The last operation's payload and diff ranges, reused by the next (`log_op`): logging
    /// a call allocates neither.
    scratch: Vec<u8>,
    payloads: Vec<Vec<u8>>,
    ranges: Vec<(usize, usize)>,
}

struct Shadow {
    image: Vec<u8>,
    buf: Weak<Buf>,
}

/// One call's buffers, gathered from its facts.
#[derive(Default)]
struct JOp {
    bufs: Vec<BufRef>,
    /// Group blocks (bitmaps, descriptors) a release changed.
    groups: Vec<u64>,
    /// Blocks freed: logged as revokes.
    revokes: Vec<u64>,
    /// Blocks newly allocated: their old image is no diff base.
    fresh: Vec<u64>,
    orphan: Vec<Ino>,
    orphan_gone: Vec<Ino>,
    /// Data blocks the call allocated: written before the call is forced (ordered data).
    data: Vec<Blk>,
    /// The hold on the blocks the call freed (one for all of them), opened once the
    /// call's END record is durable.
    hold: Option<Hold>,
    /// A file shrunk to within a block: that block, its tail zeroed (`truncate_tail`).
    tail: Option<BufRef>,
}

/// A call's [`JOp`] while `end_op` logs it, given back to the journal when done (emptied:
/// no buffer stays pinned) so the next call reuses its vectors: a call's bookkeeping then
/// allocates nothing but its box.
struct Spent<'a>(&'a Inner, JOp);

impl std::ops::Deref for Spent<'_> {
    type Target = JOp;
    fn deref(&self) -> &JOp {
        &self.1
    }
}

impl std::ops::DerefMut for Spent<'_> {
    fn deref_mut(&mut self) -> &mut JOp {
        &mut self.1
    }
}

impl Drop for Spent<'_> {
    fn drop(&mut self) {
        let mut op = std::mem::take(&mut self.1);
        op.bufs.clear();
        op.groups.clear();
        op.revokes.clear();
        op.fresh.clear();
        op.orphan.clear();
        op.orphan_gone.clear();
        op.data.clear();
        op.hold = None;
        op.tail = None;
        *self.0.spare_op.lock() = Some(op);
    }
}

impl JOp {
    fn add(&mut self, b: &BufRef) {
        if !self.bufs.iter().any(|x| x.blkno() == b.blkno()) {
            self.bufs.push(Arc::clone(b));
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn refused(msg: String) -> FsError {
    FsError::Refused(Errno::EINVAL, msg)
}

fn wal_err(e: WalError) -> FsError {
    match e {
        WalError::Io(e) => FsError::Io(e),
        e => FsError::Io(std::io::Error::other(format!("journal: {e}"))),
    }
}

/// A whole region of its own device (the copy of a log area).
fn whole(r: Region) -> Region {
    Region {
        first_block: 0,
        blocks: r.blocks,
    }
}

/// The blocks of `region` of `dev`, copied into memory.
fn copy_region(dev: &dyn BlockDevice, region: Region) -> Result<cairn_blockdev::MemDevice> {
    let bs = dev.block_size();
    let mem = cairn_blockdev::MemDevice::new(bs, region.blocks);
    let per = ((1u64 << 20) / u64::from(bs)).max(1);
    let mut buf = Vec::new();
    let mut b = 0;
    while b < region.blocks {
        let n = per.min(region.blocks - b);
        buf.resize((n * u64::from(bs)) as usize, 0);
        dev.read_blocks(region.first_block + b, &mut buf)?;
        mem.write_blocks(b, &buf)?;
        b += n;
    }
    Ok(mem)
}

impl Journal {
    pub fn new(log: LogSpec, commit: Commit) -> Journal {
        Journal {
            name: "journal",
            commit,
            commit_every: DEFAULT_COMMIT_INTERVAL,
            last_commit: Mutex::new(std::time::Instant::now()),
            log,
            log_disk: None,
            inner: Arc::new(Inner {
                wal: RwLock::new(None),
                geo: RwLock::new(None),
                cache: RwLock::new(Weak::new()),
                log: Mutex::new(LogState {
                    next_op: 1,
                    ..LogState::default()
                }),
                recovered_orphans: Mutex::new(Vec::new()),
                pending_region: Mutex::new(None),
                data_dirty: AtomicBool::new(false),
                read_only: AtomicBool::new(false),
                holds: Mutex::new(VecDeque::new()),
                spare_op: Mutex::new(None),
                #[cfg(any(test, feature = "planted"))]
                plant_reuse: AtomicBool::new(false),
                #[cfg(any(test, feature = "planted"))]
                plant_no_group_force: AtomicBool::new(false),
                #[cfg(any(test, feature = "planted"))]
                plant_ignore_revoke: AtomicBool::new(false),
            }),
            #[cfg(test)]
            plant_home_first: false,
        }
    }

    /// The strategy from the mode's own mount options (`log=`, `commit=`).
    pub fn from_options(opts: &[(String, Option<String>)]) -> std::result::Result<Journal, String> {
        let mut log = LogSpec::File;
        let mut commit = Commit::Sync;
        let mut every = DEFAULT_COMMIT_INTERVAL;
        let mut log_disk = None;
        for (k, v) in opts {
            let v = v.as_deref().unwrap_or("");
            match k.as_str() {
                "log_disk" => log_disk = Some(cairn_blockdev::disk::DiskOptions::parse(v)?),
                "log" => {
                    log = match v.strip_prefix("dev:") {
                        Some(p) if !p.is_empty() => LogSpec::Dev(PathBuf::from(p)),
                        _ if v == "file" => LogSpec::File,
                        _ => {
                            return Err(format!(
                                "bad log '{v}' (expected log=file or log=dev:PATH)"
                            ));
                        }
                    }
                }
                "commit" => {
                    commit = match v {
                        "sync" => Commit::Sync,
                        "group" => Commit::Group,
                        "async" => Commit::Async,
                        _ => {
                            return Err(format!(
                                "bad commit '{v}' (expected sync, group or async)"
                            ));
                        }
                    }
                }
                "commit_interval" => {
                    every = match v.parse::<u64>() {
                        Ok(n) if (1..=300).contains(&n) => Duration::from_secs(n),
                        _ => {
                            return Err(format!(
                                "bad commit_interval '{v}' (expected seconds, 1 to 300)"
                            ));
                        }
                    }
                }
                _ => {
                    return Err(format!(
                        "mount option '{k}' is not an option of mode journal"
                    ));
                }
            }
        }
        if log_disk.is_some() && !matches!(log, LogSpec::Dev(_)) {
            return Err(
                "log_disk= models the log's own device: give it one with log=dev:PATH (a log in the image is on the image's disk= already)"
                    .into(),
            );
        }
        let mut j = Journal::new(log, commit);
        j.commit_every = every;
        j.log_disk = log_disk;
        Ok(j)
    }

    pub fn commit(&self) -> Commit {
        self.commit
    }

    /// The same journal under another name (what `stats` and the crash reports call it: a
    /// planted variant of the crash harness).
    pub fn named(mut self, name: &'static str) -> Journal {
        self.name = name;
        self
    }

    /// Plants a bug (the crash harness's `journal-async-reuse-before-log`): blocks a call
    /// frees may be allocated again as soon as the call ends, before its log records — the
    /// free — are durable, so a crash can show the old owner over the new owner's data.
    #[cfg(any(test, feature = "planted"))]
    pub fn plant_reuse_before_log(&self) {
        self.inner.plant_reuse.store(true, AtomicOrdering::Release);
    }

    /// Plants a bug (the crash harness's `journal-group-return-before-force`): with
    /// commit=group, a call returns without the force `after_op` owes it, so what it did is
    /// not durable when it returns.
    #[cfg(any(test, feature = "planted"))]
    pub fn plant_no_group_force(&self) {
        self.inner
            .plant_no_group_force
            .store(true, AtomicOrdering::Release);
    }

    /// Plants a bug (the crash harness's `journal-replay-ignores-revoke`): recovery
    /// replays every logged update, those of blocks a later record revoked too, so a freed
    /// block's last logged image lands over whatever its next owner wrote there.
    #[cfg(any(test, feature = "planted"))]
    pub fn plant_ignore_revoke(&self) {
        self.inner
            .plant_ignore_revoke
            .store(true, AtomicOrdering::Release);
    }

    /// The open log (after `recover`).
    pub fn wal(&self) -> Option<Arc<Wal>> {
        self.inner.wal()
    }

    /// The log's device (`log=dev:PATH` or a device given), opened read-only when asked.
    fn open_log(&self, read_only: bool) -> Result<(Arc<dyn BlockDevice>, String)> {
        match &self.log {
            LogSpec::Device(d) => Ok((Arc::clone(d), "the log device".into())),
            LogSpec::File => Err(refused("log=file has no log device".into())),
            LogSpec::Dev(p) => {
                let name = format!("log device {}", p.display());
                std::fs::metadata(p).map_err(|e| refused(format!("{name}: {e}")))?;
                // The log's block size is in its superblock; an unreadable one opens at 512
                // and the log's own open says what is wrong.
                let bs = cairn_blockdev::read_bytes_at(p, 0, cairn_wal::format::SB_BYTES)
                    .ok()
                    .and_then(|h| cairn_wal::format::Superblock::decode(&h).ok())
                    .map_or(512, |sb| sb.block_size);
                let dev = FileDevice::open(p, bs, read_only).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::ResourceBusy {
                        FsError::Refused(Errno::EBUSY, format!("{name}: {e}"))
                    } else {
                        refused(format!("{name}: {e}"))
                    }
                })?;
                if dev.num_blocks() == 0 {
                    return Err(refused(format!(
                        "{name}: too small to hold a write-ahead log"
                    )));
                }
                let dev = cairn_blockdev::disk::wrap(Arc::new(dev), self.log_disk.as_ref())
                    .map_err(|e| refused(format!("{name}: {e}")))?;
                Ok((dev, name))
            }
        }
    }

    /// The log area of `sb`, checked against `dev`.
    fn file_region(&self, dev: &dyn BlockDevice, sb: &Superblock) -> Result<Region> {
        let area = sb.journal_area().map_err(|e| FsError::Corrupt(e.0))?;
        let Some((first, blocks)) = area else {
            return Err(refused(
                "this file system has no journal log area: make it with `cairn mkfs --journal-size N`, or mount with log=dev:PATH".into(),
            ));
        };
        if first + blocks > dev.num_blocks() {
            return Err(refused(format!(
                "the journal log area (blocks {first}..+{blocks}) runs past the end of the device ({} blocks): truncated image?",
                dev.num_blocks()
            )));
        }
        Ok(Region {
            first_block: first,
            blocks,
        })
    }

    /// Checks the log is big enough and this file system's (taking an unowned one when
    /// `claim`), then replays its complete operations since the checkpoint onto `dev`.
    fn replay_log(
        &self,
        wal: &Wal,
        dev: &dyn BlockDevice,
        sb: &Superblock,
        name: &str,
        claim: bool,
    ) -> Result<()> {
        let records = self.log_records(wal, sb, name, claim)?;
        #[cfg(any(test, feature = "planted"))]
        let revokes = !self.inner.plant_ignore_revoke.load(AtomicOrdering::Acquire);
        #[cfg(not(any(test, feature = "planted")))]
        let revokes = true;
        let Replayed { stats: st, orphans } = replay::replay_with(dev, records, revokes)
            .map_err(|e| FsError::Corrupt(format!("{name}: {e}")))?;
        *self.inner.recovered_orphans.lock() = orphans;
        if st.records > 0 {
            log::info!(
                "journal: replayed {} operations ({} updates, {} revoked, {} records of a cut-short operation dropped) onto {} blocks",
                st.ops,
                st.updates,
                st.revoked,
                st.partial_records,
                st.blocks
            );
        }
        Ok(())
    }

    /// The records a look at the file system that writes nothing must apply (a read-only
    /// mount, `cairn fsck` without `-y`): the log's records since its checkpoint when a
    /// journaled mount ended uncleanly, read without changing the log (none otherwise).
    fn pending_records(
        &self,
        dev: &dyn BlockDevice,
        sb: &Superblock,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        if !needs_replay(sb) {
            return Ok(Vec::new());
        }
        if let LogSpec::File = self.log {
            let region = self.file_region(dev, sb)?;
            let copy = copy_region(dev, region)?;
            let wal = Wal::open_read_only(Arc::new(copy) as Arc<dyn BlockDevice>, whole(region))
                .map_err(|e| refused(format!("journal log area: {e}")))?;
            return self.log_records(&wal, sb, "journal log area", false);
        }
        let (logdev, name) = self.open_log(true)?;
        let region = Region::whole(&*logdev);
        let wal =
            Wal::open_read_only(logdev, region).map_err(|e| refused(format!("{name}: {e}")))?;
        self.log_records(&wal, sb, &name, false)
    }

    /// Checks the log is big enough and this file system's (taking an unowned one when
    /// `claim`), and returns its records since the checkpoint — none when they are stale
    /// (see below) or the log is unowned and not claimed.
    fn log_records(
        &self,
        wal: &Wal,
        sb: &Superblock,
        name: &str,
        claim: bool,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let bs = u64::from(sb.block_size);
        if wal.capacity() < MIN_LOG_BYTES || wal.max_record() < 2 * bs + 64 {
            return Err(refused(format!(
                "{name}: too small: {} KiB of log, the journal needs at least {} KiB",
                wal.capacity() >> 10,
                MIN_LOG_BYTES.max(4 * bs) >> 10
            )));
        }
        let owner = wal.owner();
        if owner == [0; 16] && !claim {
            // Never used by a file system: nothing in it describes this one.
            return Ok(Vec::new());
        }
        if owner == [0; 16] && claim {
            wal.set_owner(sb.uuid)
                .map_err(|e| refused(format!("{name}: {e}")))?;
        } else if owner != sb.uuid {
            // The way out depends on whose mistake it is: a log is one file system's, so
            // this one needs its own, unless the other file system is gone for good.
            let out = match &self.log {
                LogSpec::Dev(p) => format!(
                    "give this file system a log of its own (`cairn wal mkfs NEWPATH`, then \
                     log=dev:NEWPATH), or, if that file system is gone, remake this one with \
                     `cairn wal mkfs -F {}` (its records are lost)",
                    p.display()
                ),
                _ => "give this file system a log of its own (`cairn wal mkfs PATH`, then \
                      log=dev:PATH)"
                    .to_string(),
            };
            return Err(refused(format!(
                "{name} belongs to another file system (owner {}, this one is {}): {out}",
                hex(&owner),
                hex(&sb.uuid)
            )));
        }
        let mut records = Vec::new();
        for r in wal.scan(wal.checkpoint()) {
            let r = r.map_err(|e| refused(format!("{name}: {e}")))?;
            records.push((r.lsn.0, r.data));
        }
        // The log describes the file system only if a journaled mount is what ended
        // uncleanly: a journaled unmount empties it, so records left behind a clean
        // superblock, or behind a crash in another mode, are older than what another mode
        // (after fsck or -o force) has written since — replaying them would undo it.
        if !needs_replay(sb) && !records.is_empty() {
            log::warn!(
                "journal: {name}: {} stale records dropped (the file system was last {} in mode '{}')",
                records.len(),
                if sb.state == STATE_MOUNTED {
                    "left mounted"
                } else {
                    "unmounted cleanly"
                },
                sb.last_mode
            );
            records.clear();
        }
        Ok(records)
    }

    fn wal_options(&self) -> WalOptions {
        WalOptions {
            group_wait: match self.commit {
                Commit::Group => GroupWait::default(),
                Commit::Sync | Commit::Async => GroupWait::Off,
            },
            // No write-behind: a log record that reached the disk unforced would make its
            // pointers durable before their data (see `Inner::ordered_sync`).
            write_behind: Some(0),
            ..WalOptions::default()
        }
    }

    /// Notes the group blocks releasing `r` will change (they join the call).
    fn note_release(&self, tx: &mut Tx, r: &Release) {
        if let (Some(geo), Some(op)) = (*self.inner.geo.read(), tx.state::<JOp>()) {
            match &r {
                Release::Blocks(v) => {
                    for &b in v {
                        let g = geo.group_of_block(b);
                        op.groups.push(geo.desc_block(g));
                        op.groups.push(geo.block_bitmap(g));
                    }
                }
                Release::Inode { ino, .. } => {
                    let g = geo.group_of_ino(*ino);
                    op.groups.push(geo.desc_block(g));
                    op.groups.push(geo.inode_bitmap(g));
                }
            }
            op.groups.sort_unstable();
            op.groups.dedup();
        }
    }

    /// A file shrunk to a size within a block has that block's tail zeroed — a data write
    /// (never logged) that must not land before the shrink is durable, or a crash shows the
    /// old size over zeros where data was (the truncation half done). The block, found
    /// through the cache from the inode just encoded (the call read its path); `None` when
    /// the size is block-aligned or the block is not cached.
    fn truncate_tail(&self, tx: &Tx, f: &FreeBlocks) -> Option<BufRef> {
        let geo = (*self.inner.geo.read())?;
        let bs = u64::from(geo.block_size);
        let (_, off) = geo.inode_location(f.ino);
        let d = {
            let img = f.inode_buf.read();
            crate::format::DiskInode::decode(
                f.ino,
                img.get(off..off + crate::format::inode::INODE_SIZE)?,
            )
            .ok()?
        };
        if d.size.is_multiple_of(bs) {
            return None;
        }
        let (level, path) = crate::bmap::tree_path(d.size / bs, geo.ptrs_per_block())?;
        let mut p = if level == 0 {
            d.direct[path[0] as usize]
        } else {
            d.indirect[path[0] as usize]
        };
        for &i in &path[1..=level] {
            if p == 0 {
                return None;
            }
            let b = tx.io.cache.lookup(p)?;
            let img = b.read();
            let at = (i * 8) as usize;
            p = u64::from_le_bytes(img.get(at..at + 8)?.try_into().ok()?);
        }
        if p == 0 {
            return None;
        }
        tx.io.cache.lookup(p).filter(|b| b.kind() == kind::DATA)
    }

    fn join(tx: &mut Tx, bufs: &[&BufRef]) {
        if let Some(op) = tx.state::<JOp>() {
            for b in bufs {
                op.add(b);
            }
        }
    }
}

impl Inner {
    fn wal(&self) -> Option<Arc<Wal>> {
        self.wal.read().clone()
    }

    fn need_wal(&self) -> Result<Arc<Wal>> {
        self.wal()
            .ok_or_else(|| FsError::Io(std::io::Error::other("journal: the log is not open")))
    }

    /// Forces the log up to `lsn` and gives the allocator back the frees that made durable.
    fn force(&self, lsn: Lsn) -> Result<()> {
        self.need_wal()?.force(lsn).map_err(wal_err)?;
        self.open_holds();
        Ok(())
    }

    /// Blocks freed by the operation whose END record is `lsn` stay held until it is durable.
    fn hold_until(&self, lsn: u64, hold: Hold) {
        #[cfg(any(test, feature = "planted"))]
        if self.plant_reuse.load(AtomicOrdering::Acquire) {
            hold.open();
            return;
        }
        self.holds.lock().push_back((lsn, hold));
        // Already durable (a force by another path since): open now.
        self.open_holds();
    }

    /// Opens the holds of every free whose END record is durable. Called after each force
    /// (and cheap when none is waiting): the allocator looks at the holds when it allocates.
    fn open_holds(&self) {
        let mut q = self.holds.lock();
        if q.is_empty() {
            return;
        }
        let Some(wal) = self.wal() else {
            return;
        };
        let durable = wal.durable().0;
        while q.front().is_some_and(|(lsn, _)| *lsn < durable) {
            if let Some((_, h)) = q.pop_front() {
                h.open();
            }
        }
    }

    /// Whether a data-first pass (ordered data: data before the log force that exposes
    /// it) writes `b`: data, except a block whose change must *follow* a log record not yet
    /// durable (a shrunk file's zeroed tail, `truncate_tail`); that one is written after
    /// the force, by the write-back that follows or the syncer.
    fn data_first(&self, b: &Buf) -> bool {
        if b.kind() != kind::DATA {
            return false;
        }
        let high = b.high_lsn();
        high == 0 || self.wal().is_none_or(|w| high < w.durable().0)
    }

    /// Whether frees wait for a force.
    fn holding(&self) -> bool {
        !self.holds.lock().is_empty()
    }

    /// Logs one operation: the bytes of `bufs` that differ from their last logged image,
    /// then `revokes`, as records ending in END. Returns the END record's LSN (None: nothing
    /// changed). The bytes go from each buffer straight into the record payloads
    /// (`record::Writer`): one copy, then the log's own.
    fn log_op(&self, op: &JOp, bufs: &[BufRef]) -> Result<Option<Lsn>> {
        let (fresh, revokes) = (&op.fresh, &op.revokes);
        let wal = self.wal();
        let limit = wal
            .as_ref()
            .map_or(MAX_RECORD, |w| MAX_RECORD.min(w.max_record() as usize));
        let mut log = self.log.lock();
        for b in fresh {
            log.shadows.remove(b);
        }
        let op_no = log.next_op;
        let (scratch, done) = (
            std::mem::take(&mut log.scratch),
            std::mem::take(&mut log.payloads),
        );
        let mut w = record::Writer::reusing(op_no, limit, scratch, done);
        let mut logged: Vec<&BufRef> = Vec::with_capacity(bufs.len());
        let mut ranges = std::mem::take(&mut log.ranges);
        for b in bufs {
            if b.is_invalidated() || revokes.contains(&b.blkno()) {
                continue;
            }
            let img = b.read();
            // The shadow becomes the image logged now, in place: only the changed ranges
            // are copied (no copy of the block per call). Should the append below fail,
            // the shadows of this call's blocks are dropped (their next change is logged
            // whole), since the call's rollback takes the buffers back.
            ranges.clear();
            // Taken under the read guard: no change can fall between it and the diff.
            // Outside the parts it names the block is as it was at its last log (or the
            // shadow is gone and the block is logged whole).
            let touched = b.take_touched();
            match log.shadows.get_mut(&b.blkno()) {
                Some(sh) => {
                    let grain = Buf::grain_of(img.len());
                    record::diff_touched(&sh.image, &img, touched, grain, &mut ranges);
                    for &(o, l) in &ranges {
                        sh.image[o..o + l].copy_from_slice(&img[o..o + l]);
                    }
                }
                None => {
                    log.shadows.insert(
                        b.blkno(),
                        Shadow {
                            image: img.to_vec(),
                            buf: Arc::downgrade(b),
                        },
                    );
                    ranges.push((0, img.len()));
                }
            }
            if ranges.is_empty() {
                continue;
            }
            for &(o, l) in &ranges {
                w.update(b.blkno(), o as u32, &img[o..o + l]);
            }
            logged.push(b);
        }
        log.ranges = ranges;
        for &r in revokes {
            log.shadows.remove(&r);
            w.revoke(r);
        }
        let added: Vec<Ino> = op
            .orphan
            .iter()
            .copied()
            .filter(|i| !op.orphan_gone.contains(i))
            .collect();
        let gone: Vec<Ino> = op
            .orphan_gone
            .iter()
            .copied()
            .filter(|i| log.orphans.contains(i))
            .collect();
        added.iter().for_each(|&ino| w.orphan(ino));
        gone.iter().for_each(|&ino| w.orphan_gone(ino));
        if w.is_empty() {
            // A call that changed nothing (a read): no log needed (a read-only mount has none).
            (log.scratch, log.payloads) = w.into_parts();
            return Ok(None);
        }
        let wal = match wal {
            Some(w) => w,
            None => self.need_wal()?,
        };
        log.next_op += 1;
        let mut first = None;
        let mut last = Lsn(0);
        let mut payloads = w.finish();
        for payload in &payloads {
            match wal.append(payload) {
                Ok(l) => last = l,
                Err(e) => {
                    for b in &logged {
                        log.shadows.remove(&b.blkno());
                    }
                    return Err(wal_err(e));
                }
            }
            first.get_or_insert(last);
        }
        // The last payload's buffer serves the next call (unless an unusually large one).
        if let Some(p) = payloads.pop().filter(|p| p.capacity() <= 64 << 10) {
            log.scratch = p;
        }
        payloads.clear();
        log.payloads = payloads;
        for b in logged {
            // Low: the operation's first record (what must stay until the block is home);
            // high: its END record (what must be durable before the block is written).
            b.note_lsn(first.unwrap_or(last).0);
            b.note_lsn(last.0);
        }
        log.orphans.extend(added);
        for i in gone {
            log.orphans.remove(&i);
        }
        Ok(Some(last))
    }

    /// The checkpoint the log may move to now: the oldest low LSN of a buffer not yet home,
    /// or the end when there is none. Drops the images of clean buffers beyond the cap.
    fn checkpoint_target(&self, wal: &Wal) -> Result<Lsn> {
        let mut log = self.log.lock();
        let mut min = u64::MAX;
        let over = log.shadows.len() > SHADOW_CAP;
        log.shadows.retain(|_, s| match s.buf.upgrade() {
            None => false,
            Some(b) => {
                let low = b.low_lsn();
                if low != 0 {
                    min = min.min(low);
                }
                !(over && low == 0 && !b.is_dirty())
            }
        });
        let end = wal.end();
        let mut target = if min == u64::MAX {
            end.0
        } else {
            min.min(end.0)
        };
        // The orphans' records must outlive the checkpoint: when it would pass the last
        // list of them, they are listed again (one operation of ORPHAN entries) and the
        // checkpoint stops there.
        if !log.orphans.is_empty() && target > log.orphan_snapshot {
            let entries = log
                .orphans
                .iter()
                .map(|&ino| Entry::Orphan { ino })
                .collect();
            let op = log.next_op;
            log.next_op += 1;
            let limit = MAX_RECORD.min(wal.max_record() as usize);
            let mut first = None;
            let mut last = Lsn(0);
            for payload in record::split(op, entries, limit) {
                last = wal.append(&payload).map_err(wal_err)?;
                first.get_or_insert(last);
            }
            wal.force(last).map_err(wal_err)?;
            let first = first.unwrap_or(last).0;
            log.orphan_snapshot = first;
            target = target.min(first);
        }
        Ok(Lsn(target))
    }

    /// After a replay: the log is emptied, except for the orphans the replay found, which are
    /// logged again first (and forced) and kept behind the new checkpoint — a crash before
    /// `mount` has freed them must still find them (a crash during recovery found this).
    fn restart(&self, wal: &Wal) -> Result<()> {
        let orphans = self.recovered_orphans.lock().clone();
        if orphans.is_empty() {
            return wal.set_checkpoint(wal.end()).map_err(wal_err);
        }
        let mut log = self.log.lock();
        let op = log.next_op;
        log.next_op += 1;
        let entries = orphans.iter().map(|&ino| Entry::Orphan { ino }).collect();
        let limit = MAX_RECORD.min(wal.max_record() as usize);
        let mut first = None;
        let mut last = Lsn(0);
        for payload in record::split(op, entries, limit) {
            last = wal.append(&payload).map_err(wal_err)?;
            first.get_or_insert(last);
        }
        wal.force(last).map_err(wal_err)?;
        let first = first.unwrap_or(last);
        wal.set_checkpoint(first).map_err(wal_err)?;
        log.orphans.extend(orphans);
        log.orphan_snapshot = first.0;
        Ok(())
    }

    /// Moves the checkpoint as far as the buffers allow: a flush of the file system's device
    /// first, so every home write that completed is durable before the records describing
    /// it are released.
    fn advance(&self, cache: &BufferCache) -> Result<()> {
        let Some(wal) = self.wal() else {
            return Ok(());
        };
        let target = self.checkpoint_target(&wal)?;
        if target <= wal.checkpoint() {
            return Ok(());
        }
        cache.flush_device()?;
        wal.set_checkpoint(target).map_err(wal_err)?;
        self.open_holds();
        Ok(())
    }

    /// Everything home and the log emptied: sync the log, write every dirty buffer (the
    /// hooks force nothing more), flush, checkpoint to the end. Only between calls.
    fn checkpoint_full(&self, cache: &BufferCache) -> Result<()> {
        self.ordered_sync(cache)?;
        cache.write_back_all()?;
        cache.flush_device()?;
        self.advance(cache)
    }

    /// Makes every call logged so far durable, data first (ordered data): every dirty data
    /// buffer is written and the device flushed before the log is forced, so no pointer or
    /// size the log makes durable exposes data that is not. The log reaches the disk only
    /// through forces (no write-behind: `wal_options`), so this is the only way pointers
    /// become durable, besides a call's own force in `commit=sync`/`group` (which orders its
    /// data the same way in `end_op`).
    fn ordered_sync(&self, cache: &BufferCache) -> Result<()> {
        let wal = self.need_wal()?;
        if wal.durable() >= wal.end() {
            self.open_holds();
            return Ok(());
        }
        self.data_dirty.store(false, AtomicOrdering::Release);
        cache.write_back_filter(&|b: &Buf| self.data_first(b))?;
        cache.flush_device()?;
        wal.sync().map_err(wal_err)?;
        self.open_holds();
        Ok(())
    }
}

/// The journal's write hooks: write-ahead, and the images of freed blocks forgotten.
struct Hooks {
    inner: Arc<Inner>,
    /// Skip the write-ahead force (the tests' planted bug).
    skip_force: bool,
}

impl WriteHooks for Hooks {
    /// Forces the log up to the buffer's high LSN (000/001 §3: every log record describing
    /// the block is durable before the block is written). The hook contract allows this
    /// I/O: the log's own blocks never pass through the cache.
    fn before_write(&self, buf: &Buf, _image: &mut [u8]) -> std::io::Result<()> {
        let to_io = |e: WalError| match e {
            WalError::Io(e) => e,
            e => std::io::Error::other(format!("journal: {e}")),
        };
        let high = buf.high_lsn();
        if high != 0
            && !self.skip_force
            && let Some(w) = self.inner.wal()
        {
            w.force(Lsn(high)).map_err(to_io)?;
            self.inner.open_holds();
        }
        Ok(())
    }

    fn invalidated(&self, buf: &Buf) {
        self.inner.log.lock().shadows.remove(&buf.blkno());
    }

    /// Never written by eviction: a buffer may hold a call's changes not yet logged (they
    /// are logged at the call's end), which must not reach the disk first.
    fn on_pressure(&self) -> Pressure {
        Pressure::Defer
    }
}

impl Strategy for Journal {
    fn name(&self) -> &'static str {
        self.name
    }

    /// The journal mode of this commit policy, whatever the journal is called: what the
    /// next mount or fsck must replay (`needs_replay` matches it exactly).
    fn recorded_mode(&self) -> &'static str {
        match self.commit {
            Commit::Sync => MODE.name,
            Commit::Async => MODE_ASYNC.name,
            Commit::Group => MODE_GROUP.name,
        }
    }

    fn commit_policy(&self) -> VfsCommit {
        match self.commit {
            Commit::Sync => VfsCommit::Sync,
            Commit::Group => VfsCommit::Group,
            Commit::Async => VfsCommit::Async,
        }
    }

    /// Home writes every 5 s: the checkpoint can only move past what is home, and the log
    /// (about 1% of the file system) should not fill between two of them.
    fn syncer_interval(&self) -> Duration {
        Duration::from_secs(5)
    }

    fn write_hooks(&self) -> Arc<dyn WriteHooks> {
        #[cfg(test)]
        let skip_force = self.plant_home_first;
        #[cfg(not(test))]
        let skip_force = false;
        Arc::new(Hooks {
            inner: Arc::clone(&self.inner),
            skip_force,
        })
    }

    /// Opens the log, replays the complete operations since its checkpoint onto `dev`
    /// (001 §5.3), and checkpoints to the end. A log device that is missing, too small,
    /// not a log, another file system's or corrupt is refused with one line.
    fn recover(&self, dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
        let geo = sb.geometry().map_err(|e| FsError::Corrupt(e.0))?;
        *self.inner.geo.write() = Some(geo);
        if let LogSpec::File = self.log {
            // The log area is on `dev`, which the log service can only use as a shared
            // device once the engine has one (`mount`): the replay reads a copy of the area.
            let region = self.file_region(dev, sb)?;
            let copy = copy_region(dev, region)?;
            let wal = Wal::open_read_only(Arc::new(copy) as Arc<dyn BlockDevice>, whole(region))
                .map_err(|e| refused(format!("journal log area: {e}")))?;
            self.replay_log(&wal, dev, sb, "journal log area", false)?;
            *self.inner.pending_region.lock() = Some(region);
            return Ok(());
        }
        let (logdev, name) = self.open_log(false)?;
        let region = Region::whole(&*logdev);
        let wal = Wal::open_with(logdev, region, self.wal_options())
            .map_err(|e| refused(format!("{name}: {e}")))?;
        self.replay_log(&wal, dev, sb, &name, true)?;
        self.inner.restart(&wal)?;
        *self.inner.wal.write() = Some(Arc::new(wal));
        Ok(())
    }

    /// A read-only mount writes nothing, so it cannot replay onto the disk: when a journaled
    /// mount ended uncleanly, the complete operations of the log are replayed into memory
    /// (a [`ReplayView`] over the device) and the mount shows the file system as a
    /// read-write mount would after its recovery (orphans are left as they are: freeing
    /// them is a change). A log that cannot be read is refused with one line, as at a
    /// read-write mount: the home locations alone may show half an operation.
    fn read_only_view(
        &self,
        dev: Arc<dyn BlockDevice>,
        sb: &Superblock,
    ) -> Result<Arc<dyn BlockDevice>> {
        let geo = sb.geometry().map_err(|e| FsError::Corrupt(e.0))?;
        *self.inner.geo.write() = Some(geo);
        self.inner.read_only.store(true, AtomicOrdering::Release);
        let records = self.pending_records(dev.as_ref(), sb)?;
        if records.is_empty() {
            return Ok(dev);
        }
        let view = ReplayView::new(dev);
        let Replayed { stats, .. } =
            replay(&view, records).map_err(|e| FsError::Corrupt(format!("journal: {e}")))?;
        log::info!(
            "journal: read-only mount: {} logged operations replayed in memory ({} blocks); a read-write mount replays them onto the disk",
            stats.ops,
            view.changed()
        );
        Ok(Arc::new(view))
    }

    /// Frees the orphans the replay found (inodes unlinked while open when the crash came):
    /// each as a call of its own, logged like any other.
    fn mount(&self, e: &dyn Engine) -> Result<()> {
        *self.inner.cache.write() = Arc::downgrade(&e.io().cache);
        if let Some(region) = self.inner.pending_region.lock().take() {
            // log=file: the replay is on disk; the log opens on the shared device (a new
            // epoch) and is emptied.
            let dev = Arc::clone(e.io().cache.device());
            let wal = Wal::open_with(dev, region, self.wal_options())
                .map_err(|e| refused(format!("journal log area: {e}")))?;
            self.inner.restart(&wal)?;
            *self.inner.wal.write() = Some(Arc::new(wal));
        }
        let orphans = std::mem::take(&mut *self.inner.recovered_orphans.lock());
        for ino in orphans {
            if let Err(err) = e.apply_link_drop(ino, 0) {
                log::error!("journal: cannot free orphan inode {ino}: {err}");
            }
        }
        Ok(())
    }

    fn background_interval(&self) -> Option<Duration> {
        Some(Duration::from_secs(1))
    }

    /// The 1-second timer: the checkpoint moves to what the buffers still need; every
    /// `commit_interval`, `commit=async` makes every call so far durable. Only the log and
    /// a device flush: no buffer is written here (a call may be half done; the engine's lock
    /// is not held).
    fn background(&self, e: &dyn Engine) -> Result<bool> {
        let Some(wal) = self.inner.wal() else {
            return Ok(false);
        };
        let _ = wal;
        if self.commit == Commit::Async {
            let due = {
                let mut last = self.last_commit.lock();
                let due = last.elapsed() >= self.commit_every;
                if due {
                    *last = std::time::Instant::now();
                }
                due
            };
            if due {
                self.inner.ordered_sync(&e.io().cache)?;
            }
        }
        self.inner.advance(&e.io().cache)?;
        Ok(false)
    }

    fn sync(&self, e: &dyn Engine, why: SyncWhy) -> Result<()> {
        let io = e.io();
        // Data and the log first, whatever the reason: the metadata written home next would
        // force the log anyway (write-ahead), and its data must precede it.
        #[cfg(test)]
        let skip = self.plant_home_first;
        #[cfg(not(test))]
        let skip = false;
        if !skip {
            self.inner.ordered_sync(&io.cache)?;
        }
        io.write_back_unordered(why.durable())?;
        if why.durable() {
            self.inner.advance(&io.cache)?;
        }
        Ok(())
    }

    /// Before a call changes anything: if the log runs low, everything goes home and the
    /// log is emptied (a forced checkpoint, never a failed call).
    fn begin_op(&self, kind: OpKind) -> Result<OpState> {
        let _ = kind;
        // A force left by a call whose engine path did not reach `after_op` (none does):
        // made now, before this call can build on it.
        if let Some((owner, lsn)) = DEFERRED.take() {
            if owner == Arc::as_ptr(&self.inner) as usize {
                self.inner.force(Lsn(lsn))?;
            } else {
                DEFERRED.set(Some((owner, lsn)));
            }
        }
        if let Some(wal) = self.inner.wal()
            && wal.needs_checkpoint()
            && let Some(cache) = self.inner.cache.read().upgrade()
        {
            self.inner.checkpoint_full(&cache)?;
        }
        let op = self.inner.spare_op.lock().take().unwrap_or_default();
        Ok(Some(Box::new(op)))
    }

    fn end_op(&self, tx: &mut Tx, ok: bool) -> Result<()> {
        let Some(op) = tx.state::<JOp>().map(std::mem::take) else {
            return Ok(());
        };
        let mut op = Spent(&self.inner, op);
        if !ok || self.inner.read_only.load(AtomicOrdering::Acquire) {
            // Everything the call changed was taken back, or will never be written (a
            // read-only mount): nothing to log.
            return Ok(());
        }
        let mut bufs = std::mem::take(&mut op.bufs);
        for g in &op.groups {
            if let Some(b) = tx.io.cache.lookup(*g)
                && !bufs.iter().any(|x| x.blkno() == *g)
            {
                bufs.push(b);
            }
        }
        // A call that freed blocks is not forced for it: the blocks stay out of the
        // allocator until its END record is durable (`setup_freeblocks`, `open_holds`).
        let has_data = !op.data.is_empty() || matches!(tx.kind, OpKind::Write | OpKind::Fallocate);
        let forced = tx.kind.durable() && self.commit != Commit::Async;
        // Ordered data (ext3/4's data=ordered): the data a call wrote (into blocks it
        // allocated, or past the old end of the file) is written and flushed before the
        // pointers and size that expose it become durable, so a returned write never leaves
        // a file showing zeros or a deleted file's bytes, and an fsync in flight never shows
        // its pointers first. Data earlier unforced calls left dirty (`commit=async`) goes
        // too: this force makes their pointers durable as well. It happens *before* the
        // call's records are appended: a force by another call (group commit forces with
        // the engine's lock released) writes every record appended so far, so a record may
        // be appended only once the data it exposes is durable.
        if forced && (has_data || self.inner.data_dirty.swap(false, AtomicOrdering::AcqRel)) {
            let tail = op.tail.as_ref().map(|b| b.blkno());
            tx.io.cache.write_back_filter(&|b: &Buf| {
                self.inner.data_first(b) && Some(b.blkno()) != tail
            })?;
            // Stream writes went to the device directly: the flush covers them too.
            tx.io.cache.flush_device()?;
        }
        let end = self.inner.log_op(&op, &bufs)?;
        op.bufs = bufs; // its capacity, for the next call
        if let (Some(tail), Some(end)) = (op.tail.take(), end) {
            // Written only once the shrink is durable: the write-ahead hook forces the log
            // first, and the data-first passes leave it (`Inner::data_first`).
            tail.note_lsn(end.0);
        }
        if let Some(hold) = op.hold.take() {
            // The freed blocks come back once `end` is durable (a free is always logged:
            // its revokes; should nothing have been, the next force opens the hold).
            let lsn = end.map_or_else(|| self.inner.need_wal().map(|w| w.end().0), |l| Ok(l.0))?;
            self.inner.hold_until(lsn, hold);
        }
        if let Some(end) = end
            && forced
        {
            if self.commit == Commit::Group {
                // Forced by `after_op`, once the engine's lock is released: calls that end
                // meanwhile share its flush.
                DEFERRED.set(Some((Arc::as_ptr(&self.inner) as usize, end.0)));
            } else {
                self.inner.force(end)?;
            }
        } else if has_data {
            self.inner.data_dirty.store(true, AtomicOrdering::Release);
        }
        Ok(())
    }

    /// `commit=group`: the force `end_op` left for after the engine's lock (the log's group
    /// commit lets every forcer arriving while a flush is prepared or runs share it, 001
    /// §3.2 — which the paper's implementation "does not support").
    fn after_op(&self) -> Result<()> {
        if let Some((owner, lsn)) = DEFERRED.take() {
            if owner != Arc::as_ptr(&self.inner) as usize {
                // Another journal's (never: a call runs on one file system); put it back.
                DEFERRED.set(Some((owner, lsn)));
                return Ok(());
            }
            #[cfg(any(test, feature = "planted"))]
            if self
                .inner
                .plant_no_group_force
                .load(AtomicOrdering::Acquire)
            {
                return Ok(());
            }
            self.inner.force(Lsn(lsn))?;
        }
        Ok(())
    }

    fn setup_inomapdep(&self, tx: &mut Tx, f: &InoMapDep) -> Result<()> {
        Self::join(tx, &[f.bitmap, f.desc]);
        Ok(())
    }

    fn setup_blkmapdep(&self, tx: &mut Tx, f: &BlkMapDep) -> Result<()> {
        Self::join(tx, &[f.bitmap, f.desc]);
        if let Some(op) = tx.state::<JOp>() {
            op.fresh.push(f.blk);
        }
        Ok(())
    }

    fn setup_allocdirect(&self, tx: &mut Tx, f: &AllocDirect) -> Result<()> {
        if let Some(b) = f.new_buf {
            Self::join(tx, &[b]);
        }
        // An xattr chain's further blocks: logged as metadata in the same operation.
        for b in f.chain {
            Self::join(tx, &[b]);
        }
        if let Some(op) = tx.state::<JOp>() {
            op.fresh.extend(f.chain.iter().map(|b| b.blkno()));
            op.fresh.push(f.new_blk);
            if !f.kind.is_metadata() {
                op.data.push(f.new_blk);
            }
        }
        Ok(())
    }

    fn setup_allocindir(&self, tx: &mut Tx, f: &AllocIndir) -> Result<()> {
        Self::join(tx, &[f.indir]);
        if let Some(b) = f.new_buf {
            Self::join(tx, &[b]);
        }
        if let Some(op) = tx.state::<JOp>() {
            op.fresh.push(f.new_blk);
            if !f.kind.is_metadata() {
                op.data.push(f.new_blk);
            }
        }
        Ok(())
    }

    fn update_inodeblock(&self, tx: &mut Tx, _ino: Ino, buf: &BufRef, _was: u64) -> Result<()> {
        Self::join(tx, &[buf]);
        Ok(())
    }

    fn setup_directory_add(&self, tx: &mut Tx, f: &DirAdd) -> Result<()> {
        Self::join(tx, &[f.buf]);
        if let Some(b) = f.mkdir_body {
            Self::join(tx, &[b]);
        }
        Ok(())
    }

    fn setup_directory_remove(&self, tx: &mut Tx, f: &DirRemove) -> Result<Apply> {
        Self::join(tx, &[f.buf]);
        Ok(Apply::Now)
    }

    fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> Result<Apply> {
        Self::join(tx, &[f.buf]);
        Ok(Apply::Now)
    }

    /// A count reaching 0 makes the inode an orphan until it is freed: a crash in between
    /// leaves it to the next mount to free. A count leaving 0 (an O_TMPFILE's first link)
    /// makes it an orphan no more.
    fn change_linkcnt(&self, tx: &mut Tx, f: &LinkChange) -> Result<()> {
        Self::join(tx, &[f.inode_buf]);
        if let Some(op) = tx.state::<JOp>() {
            if f.after == 0 && f.before > 0 {
                op.orphan.push(f.ino);
            } else if f.before == 0 && f.after > 0 {
                op.orphan_gone.push(f.ino);
            }
        }
        Ok(())
    }

    /// Before a shrink zeroes its last block's tail, that block's present image goes to
    /// disk if it may be needed there. Two orders meet in this block: its zeroed tail must
    /// follow the shrink's records (`truncate_tail`), and its data before the new end must
    /// precede the records that name the block — in `commit=async`, the write that
    /// allocated it may still be unforced, and then no force can serve both: the one that
    /// makes the shrink durable makes that allocation durable too, and the block, held back
    /// for the shrink, is not on disk (an fsync in flight showed its file's inode over
    /// zeros there). Written now, before any byte changes, the block carries the data the
    /// allocation exposes and nothing the shrink takes away. Only while an unforced call
    /// wrote data (`data_dirty`): otherwise every pointer to the block is durable with its
    /// data already there. A block still waiting for an earlier shrink's records gets them
    /// forced first, data first (`ordered_sync`), as its write-ahead requires.
    fn before_tail_zeroed(&self, tx: &mut Tx, ino: Ino, buf: &BufRef) -> Result<()> {
        let _ = ino;
        if !buf.is_dirty() || !self.inner.data_dirty.load(AtomicOrdering::Acquire) {
            return Ok(());
        }
        if !self.inner.data_first(buf) {
            self.inner.ordered_sync(&tx.io.cache)?;
        }
        tx.io.cache.write_now(&[buf])?;
        Ok(())
    }

    fn setup_freeblocks(&self, tx: &mut Tx, f: &FreeBlocks) -> Result<()> {
        Self::join(tx, &[f.inode_buf]);
        if !f.whole_file
            && let Some(tail) = self.truncate_tail(tx, f)
            && let Some(op) = tx.state::<JOp>()
        {
            op.tail = Some(tail);
        }
        for h in f.holders {
            Self::join(tx, &[h]);
        }
        if !f.freed.is_empty() {
            // Released in this call, so the bitmap change is logged with the cleared
            // pointers (one operation: after a crash both or neither), and held from the
            // allocator until that operation is durable: the blocks' next contents may be
            // data, which is never logged and must not land while the free could still be
            // lost (the block would then still belong to this file). jbd2's way; the call
            // is not forced for it.
            let until = match tx.state::<JOp>() {
                Some(op) => {
                    op.revokes.extend_from_slice(f.freed);
                    op.hold.get_or_insert_with(Hold::new).clone()
                }
                None => Hold::new(),
            };
            self.note_release(tx, &Release::Blocks(f.freed.to_vec()));
            tx.release_held(f.freed.to_vec(), until);
        }
        Ok(())
    }

    fn setup_freefile(&self, tx: &mut Tx, f: &FreeFile) -> Result<()> {
        if let Some(op) = tx.state::<JOp>() {
            op.orphan_gone.push(f.ino);
        }
        // An inode is released at once, unheld: its next use is a create, logged after this
        // call, so it can never be durable without this free.
        let r = Release::Inode {
            ino: f.ino,
            is_dir: f.is_dir,
        };
        self.note_release(tx, &r);
        tx.release(r);
        Ok(())
    }

    fn setup_attr_change(&self, tx: &mut Tx, f: &AttrChange) -> Result<()> {
        Self::join(tx, &[f.inode_buf]);
        for b in f.extra {
            Self::join(tx, &[b]);
        }
        Ok(())
    }

    /// Frees held until a force (`setup_freeblocks`): a call that runs out of space meanwhile
    /// has the engine make them — `sync(All)` forces the log, which opens the holds — and
    /// runs once more, so no call fails for space that is only waiting for the log.
    fn has_pending_frees(&self) -> bool {
        self.inner.holding()
    }

    /// For `cairn stats`: the commit mode, where the log is, and the log service's own
    /// counters (appends and bytes, forces, group sizes, flushes, checkpoint and its lag).
    fn stats(&self) -> Option<serde_json::Value> {
        let log = match &self.log {
            LogSpec::File => "file".to_string(),
            LogSpec::Dev(p) => format!("dev:{}", p.display()),
            LogSpec::Device(_) => "device".to_string(),
        };
        let shadows = self.inner.log.lock().shadows.len();
        Some(serde_json::json!({
            "commit": format!("{:?}", self.commit).to_lowercase(),
            "log": log,
            "read_only": self.inner.read_only.load(AtomicOrdering::Acquire),
            "shadow_images": shadows,
            "held_frees": self.inner.holds.lock().len(),
            "wal": self.inner.wal().map(|w| w.stats()),
            "log_disk": self.inner.wal().and_then(|w| w.device().disk_stats()),
        }))
    }

    /// The file's dirty data first, flushed; then the log forced: the metadata naming the
    /// data (logged when its calls ended) becomes durable only after the data is.
    fn fsync(&self, e: &dyn Engine, f: &FsyncReq) -> Result<()> {
        let io = e.io();
        let data: Vec<&BufRef> = f
            .blocks
            .iter()
            .filter(|b| b.is_dirty() && self.inner.data_first(b))
            .collect();
        if !data.is_empty() {
            io.cache.write_now(&data)?;
        }
        io.cache.flush_device()?;
        // The log force makes every earlier call durable, so their data goes first too.
        self.inner.ordered_sync(&io.cache)?;
        // Blocks that had to follow the log (a shrunk file's last block, its tail zeroed:
        // `truncate_tail`) may go now, and must: they hold the file's data before its end.
        let rest: Vec<&BufRef> = f
            .blocks
            .iter()
            .filter(|b| b.is_dirty() && b.kind() == kind::DATA)
            .collect();
        if !rest.is_empty() {
            io.cache.write_now(&rest)?;
            io.cache.flush_device()?;
        }
        Ok(())
    }
}
