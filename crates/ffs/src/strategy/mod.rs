//! Metadata-update strategies: the one interface every consistency discipline implements.
//!
//! The file-system code never asks which mode it runs in. It tells the strategy *facts*:
//! what changed, in FreeBSD's families (`softdep_setup_*`, see [`facts`]), each naming the
//! structure that changed and the buffer the change is in. The Soft Updates paper's
//! ordering rules (002 §3; 000/001 §2) are stated over those facts:
//!
//! 1. Never point to a structure before it has been initialized: an inode
//!    ([`InoMapDep`], then its first `update_inodeblock`) reaches disk before the entry
//!    naming it ([`DirAdd`]); a bitmap ([`BlkMapDep`]) and a new block's contents before
//!    the pointer to it ([`AllocDirect`], [`AllocIndir`]).
//! 2. Never reuse a resource before nullifying all previous pointers to it: an entry's
//!    removal ([`DirRemove`]) before the link count drops ([`LinkChange`]), cleared
//!    pointers ([`FreeBlocks`]) before the bitmap frees the blocks — which is why the
//!    *strategy* releases freed bits ([`Tx::release`]), when its order allows.
//! 3. Never reset the last pointer to a live resource before the new pointer has been set:
//!    rename's new name ([`DirAdd`] or [`DirChange`]) before the old one goes.
//!
//! `sync` writes each step at once behind a barrier; `async` (`Delayed`) only releases what
//! is freed. Soft updates attaches dependencies to the named buffers and rolls them back in
//! the buffer cache's `before_write`; a journal logs each fact as a record. See
//! docs/DESIGN.md for the table of what each mode does with each fact.

mod delayed;
pub mod facts;
mod io;
pub mod journal;
pub mod softdep;
mod sync;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::{BufRef, Pressure, WriteHooks};
use cairn_vfs::Result;
use cairn_vfs::modes::{
    AfterCrash, Allowed, Commit, Facts, Family, Guarantees, LogPlacement, ModeSpec, OptionSpec,
    Recovery,
};

use crate::format::Superblock;

pub use delayed::Delayed;
pub use facts::*;
pub use io::Io;
pub use sync::{Ordered, StepWriter, Sync};

/// A strategy's private state for one call: made by `begin_op`, reachable from every fact
/// of the call through [`Tx::state`], handed back to `end_op` (a journal: the call's log
/// records). `None` for a strategy that keeps none.
pub type OpState = Option<Box<dyn Any + Send>>;

/// One call in progress, as a fact sees it.
pub struct Tx<'a> {
    pub kind: OpKind,
    pub io: &'a Io,
    pub(crate) state: &'a mut OpState,
    pub(crate) released: &'a mut Vec<Release>,
    pub(crate) holds: &'a mut Vec<(Vec<Blk>, Hold)>,
}

/// A gate on freed blocks: the allocator does not hand them out again until the strategy
/// opens it (a journal: once the log records of the free are durable). Cloned between the
/// strategy, which opens it, and the allocator, which looks at it when it allocates.
#[derive(Clone, Default)]
pub struct Hold(Arc<std::sync::atomic::AtomicBool>);

impl Hold {
    pub fn new() -> Hold {
        Hold::default()
    }

    /// The held blocks may be reused from now on.
    pub fn open(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    pub fn is_open(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hold(open: {})", self.is_open())
    }
}

impl Tx<'_> {
    /// The strategy's state for this call, if `begin_op` made one of type `T`.
    pub fn state<T: 'static>(&mut self) -> Option<&mut T> {
        self.state.as_mut()?.downcast_mut()
    }

    /// Releases bits to the allocator: the engine clears them as soon as the fact that
    /// called this returns, inside the call. A strategy calls it for what a `FreeBlocks` or
    /// `FreeFile` named once its ordering allows (sync: after the cleared pointers were
    /// written; async: at once).
    pub fn release(&mut self, r: Release) {
        self.released.push(r);
    }

    /// Releases `blocks` as [`Release::Blocks`] — their bits cleared now, in this call —
    /// and keeps them from being allocated again until `until` opens: for a strategy whose
    /// free is made in the call but not yet durable when the call ends (a journal in
    /// `commit=async`: the block's next contents, data that is never logged, must not land
    /// while the free could still be lost). ext3/4 keep such blocks out of the allocator
    /// until the transaction commits the same way. Undone with the call if it fails.
    pub fn release_held(&mut self, blocks: Vec<Blk>, until: Hold) {
        self.released.push(Release::Blocks(blocks.clone()));
        self.holds.push((blocks, until));
    }
}

/// How a mode's device I/O relates to the engine's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoModel {
    /// The engine holds its lock across the mode's writes and flushes (its syncer, memory
    /// pressure, fsync, sync(2), streams): no other call can put half an operation between a
    /// step and its barrier. `sync`'s honest cost, as FFS holds the vnode locks of a call.
    Serialized,
    /// No engine lock is held across a device write or flush: the syncer and background
    /// work never stall calls (FreeBSD never holds its soft-updates lock across I/O). The
    /// engine calls `sync`, `fsync`, `unmount` and `write_stream` without its lock, so they
    /// overlap other calls (and each other); facts still run under it and must do no
    /// device I/O. A write is then two calls, its stream's device writes between them.
    Concurrent,
}

/// Why the engine asks a strategy to write back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncWhy {
    /// The syncer's interval (FFS's 30-second update daemon): write, no flush needed.
    Periodic,
    /// Dirty buffers passed half the cache budget: write, no flush needed.
    Pressure,
    /// sync(2): everything durable when this returns.
    All,
    /// Unmount: everything durable, nothing left pending.
    Unmount,
}

impl SyncWhy {
    /// Whether the write-back must end durable (a flush).
    pub fn durable(self) -> bool {
        matches!(self, SyncWhy::All | SyncWhy::Unmount)
    }
}

/// fsync(2) of one file.
pub struct FsyncReq<'a> {
    pub ino: Ino,
    pub datasync: bool,
    /// The file's dirty cached data and indirect blocks.
    pub blocks: &'a [BufRef],
}

/// The engine as a strategy sees it outside a call: from its life-cycle methods, its
/// background work and its worker. Implemented by `Ffs`.
///
/// `release` and `apply_link_drop` take the engine's lock: never call them from a fact, nor
/// from a method the engine calls with its lock held (every method in `Serialized` mode).
pub trait Engine: Send + std::marker::Sync {
    fn io(&self) -> &Io;
    /// The allocator callback outside a call: clears the bits `r` names (invalidating freed
    /// blocks' buffers first), as one call of its own (soft updates'
    /// `handle_workitem_freeblocks`, after the pointer-clearing write completed).
    fn release(&self, r: Release) -> Result<()>;
    /// Lowers inode `ino`'s on-disk link count by `n` — a drop a removal deferred
    /// (`Apply::Deferred`), now that the removal is on disk (soft updates'
    /// `handle_workitem_remove`) — and frees the inode if nothing refers to it any more.
    fn apply_link_drop(&self, ino: Ino, n: u32) -> Result<()>;
}

/// The write hooks `sync` and `async` install: nothing per write, and no dirty buffer is ever
/// written by eviction (the engine writes back in the mode's order before the cache must).
pub struct DeferEviction;

impl WriteHooks for DeferEviction {
    fn on_pressure(&self) -> Pressure {
        Pressure::Defer
    }
}

/// A metadata-update discipline. See the module documentation for the rules the facts
/// stand for. The engine calls, for every call that changes metadata: `begin_op`, then the
/// facts in the order the changes were made (§2.2 of the design), then `end_op`, all under
/// its lock and inside the call's undo scope, so a failed call is taken back whole.
///
/// Facts with a default body carry no obligation. `setup_freeblocks` and `setup_freefile`
/// must eventually `release` what they name (or space leaks until fsck), and the removal
/// facts must say when the on-disk link count may drop.
pub trait Strategy: Send + std::marker::Sync {
    fn name(&self) -> &'static str;

    /// The mode a read-write mount records in the superblock (`last_mode`): the registered
    /// mode whose recovery the next mount or fsck after a crash must run. The strategy's
    /// own name, except for a strategy under another name (a planted journal of the crash
    /// harness is recorded as the journal mode it claims to be).
    fn recorded_mode(&self) -> &'static str {
        self.name()
    }

    /// When a call's metadata is made durable, as the registry says of the mode this strategy
    /// was made for (a journal's `commit=` option changes it). What the kernel may cache on
    /// top of the file system follows from it (`KernelCachePolicy::for_commit`).
    fn commit_policy(&self) -> Commit;

    /// How often the syncer writes dirty buffers by default.
    fn syncer_interval(&self) -> Duration;

    /// Whether the mode holds frees back that a sync would make (soft updates' worklist; a
    /// journal's blocks held from reuse until the log is forced, `Tx::release_held`). A call
    /// that fails with ENOSPC while this is true makes them (`sync(All)`, with the engine's
    /// lock only in a `Serialized` mode) and runs once more.
    fn has_pending_frees(&self) -> bool {
        false
    }

    /// Whether a background check may run on a live mount in this mode, and what it must
    /// leave alone: the blocks and inodes the mode will still release and the inodes whose
    /// on-disk count it will still lower (soft updates' worklist). `None` (the default):
    /// the mode does not allow one (see `bgcheck`). Called with the engine's lock held.
    fn background_check_holds(&self) -> Option<crate::bgcheck::Held> {
        None
    }

    /// Whether the engine may do this mode's device I/O without holding its lock.
    fn io_model(&self) -> IoModel {
        IoModel::Serialized
    }

    /// After every call that changed metadata, on the calling thread with the engine's lock
    /// released: the mode brings the memory it holds back under its bound (soft updates at
    /// `max_softdeps`: completes records and runs the worklist), throttling the writer that
    /// grew it rather than letting a background thread fall behind without limit.
    fn relieve(&self, e: &dyn Engine) -> Result<()> {
        let _ = e;
        Ok(())
    }

    // ---- life cycle -----------------------------------------------------------------

    /// The buffer cache's write hooks for this mode (soft updates: roll back in
    /// `before_write`, roll forward in `after_write`; a journal: force the log). Installed
    /// when the cache is made, before anything is read.
    fn write_hooks(&self) -> Arc<dyn WriteHooks> {
        Arc::new(DeferEviction)
    }

    /// Every mount, read-only ones included, before anything beyond the superblock is read:
    /// what the mode needs to know of the image to read and write it (soft updates: the
    /// geometry its rollbacks use to find inodes in their blocks). Must not write.
    fn attach(&self, sb: &Superblock) -> Result<()> {
        let _ = sb;
        Ok(())
    }

    /// Before the engine reads anything beyond the superblock (a journal replays its log
    /// here). The registry's recovery, fsck and the crash harness call the same function.
    fn recover(&self, dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
        let _ = (dev, sb);
        Ok(())
    }

    /// A read-only mount, instead of `recover` (nothing may be written): the device the
    /// engine reads through. A journal whose log holds operations not yet replayed shows
    /// them replayed in memory. So does any other mode's read-only mount of an image a
    /// journaled mount left uncleanly (`journal::foreign_read_only_view`): its home
    /// locations alone may show half an operation, or none of the calls its log made
    /// durable; other images are read as they are.
    fn read_only_view(
        &self,
        dev: Arc<dyn BlockDevice>,
        sb: &Superblock,
    ) -> Result<Arc<dyn BlockDevice>> {
        journal::foreign_read_only_view(self.name(), dev, sb)
    }

    /// The file system is mounted read-write (start what the mode needs).
    fn mount(&self, e: &dyn Engine) -> Result<()> {
        let _ = e;
        Ok(())
    }

    /// How often the engine's worker runs `background` (`None`: never).
    fn background_interval(&self) -> Option<Duration> {
        None
    }

    /// Deferred work, on the engine's worker, outside any call (soft updates' worklist:
    /// frees and link-count drops whose dependencies are on disk). Returns whether more is
    /// ready; the worker calls again within its time slice.
    fn background(&self, e: &dyn Engine) -> Result<bool> {
        let _ = e;
        Ok(false)
    }

    /// Writes back dirty buffers in the mode's order (`why.durable()`: ending with
    /// everything on disk).
    fn sync(&self, e: &dyn Engine, why: SyncWhy) -> Result<()>;

    /// Unmount: everything durable and nothing pending when this returns (the engine then
    /// writes the clean superblock through `write_superblock`).
    fn unmount(&self, e: &dyn Engine) -> Result<()> {
        self.sync(e, SyncWhy::Unmount)
    }

    /// Writes the superblock (marked dirty, contents final) durably: at mount (state
    /// MOUNTED) and unmount (CLEAN).
    fn write_superblock(&self, e: &dyn Engine, buf: &BufRef) -> Result<()> {
        e.io().write_durable(&[buf])
    }

    /// Writes file data straight to the device (a stream: whole blocks nobody has cached,
    /// `blk` onwards, of inode `ino`), bypassing the cache.
    fn write_stream(&self, io: &Io, ino: Ino, blk: Blk, data: &[u8]) -> Result<()> {
        let _ = ino;
        io.write_stream(blk, data)
    }

    /// Gives new data blocks of inode `ino` their zeros on the device, durably: one
    /// zero-range request per run `(first block, count)`, then a flush (a large fallocate,
    /// inside its call, before it declares `DataZeroed`).
    fn write_zeros(&self, io: &Io, ino: Ino, runs: &[(Blk, u64)]) -> Result<()> {
        let _ = ino;
        io.write_zeros(runs)
    }

    // ---- per call -------------------------------------------------------------------

    /// A call of `kind` begins.
    fn begin_op(&self, kind: OpKind) -> Result<OpState> {
        let _ = kind;
        Ok(None)
    }

    /// The call has done everything that can fail; what it changed so far must reach the
    /// mode's durability now (sync: a barrier), because what follows changes file contents
    /// without a before-image (a write's second pass).
    fn commit_point(&self, tx: &mut Tx) -> Result<()> {
        let _ = tx;
        Ok(())
    }

    /// The call ends: `ok` false when it failed and everything it changed was taken back.
    /// For a durable kind this is the point where the mode's promise holds.
    fn end_op(&self, tx: &mut Tx, ok: bool) -> Result<()> {
        let _ = (tx, ok);
        Ok(())
    }

    /// After a call, on its thread, with the engine's lock released and before the call
    /// returns: what makes it durable without holding other calls back (a journal's
    /// `commit=group` forces here what `end_op` logged, so that calls ending together
    /// share one log flush). An error fails the call, whose changes stay made (as a failed
    /// fsync leaves them).
    fn after_op(&self) -> Result<()> {
        Ok(())
    }

    // ---- facts ----------------------------------------------------------------------

    fn setup_inomapdep(&self, tx: &mut Tx, f: &InoMapDep) -> Result<()> {
        let _ = (tx, f);
        Ok(())
    }
    fn setup_blkmapdep(&self, tx: &mut Tx, f: &BlkMapDep) -> Result<()> {
        let _ = (tx, f);
        Ok(())
    }
    fn setup_allocdirect(&self, tx: &mut Tx, f: &AllocDirect) -> Result<()> {
        let _ = (tx, f);
        Ok(())
    }
    fn setup_allocindir(&self, tx: &mut Tx, f: &AllocIndir) -> Result<()> {
        let _ = (tx, f);
        Ok(())
    }
    /// New data blocks' zeros are durable on the device ([`DataZeroed`]). A mode that
    /// orders data before the pointers to it by waiting for each block's own write (soft
    /// updates) counts this as that write; the others need nothing: their pointers reach
    /// disk at the call's end or later, after the flush that made the zeros durable.
    fn setup_data_zeroed(&self, tx: &mut Tx, f: &DataZeroed) -> Result<()> {
        let _ = (tx, f);
        Ok(())
    }
    /// A shrink of file `ino` to within a block is about to zero that block's tail in
    /// `buf` (the block's data before the new end stays). Called before the bytes change,
    /// so a mode that must get the block's present image to disk first — a journal, whose
    /// zeroed tail has to follow the shrink's records while the data before it has to
    /// precede the records of the write that allocated the block — can write it here.
    fn before_tail_zeroed(&self, tx: &mut Tx, ino: Ino, buf: &BufRef) -> Result<()> {
        let _ = (tx, ino, buf);
        Ok(())
    }
    /// Inode `ino` was encoded into `buf` (FreeBSD: `softdep_update_inodeblock`); `was` is
    /// the size its slot held before (the size on disk when nothing encoded the inode since
    /// its block was read: a mode asking whether a size was raised need not read the device).
    fn update_inodeblock(&self, tx: &mut Tx, ino: Ino, buf: &BufRef, was: u64) -> Result<()> {
        let _ = (tx, ino, buf, was);
        Ok(())
    }
    fn setup_directory_add(&self, tx: &mut Tx, f: &DirAdd) -> Result<()> {
        let _ = (tx, f);
        Ok(())
    }
    fn setup_directory_remove(&self, tx: &mut Tx, f: &DirRemove) -> Result<Apply>;
    fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> Result<Apply>;
    fn change_linkcnt(&self, tx: &mut Tx, f: &LinkChange) -> Result<()> {
        let _ = (tx, f);
        Ok(())
    }
    fn setup_freeblocks(&self, tx: &mut Tx, f: &FreeBlocks) -> Result<()>;
    fn setup_freefile(&self, tx: &mut Tx, f: &FreeFile) -> Result<()>;
    fn setup_attr_change(&self, tx: &mut Tx, f: &AttrChange) -> Result<()> {
        let _ = (tx, f);
        Ok(())
    }

    /// The bytes of directory block `blk` that the mode's writes may still show an entry
    /// in that its buffer no longer has, as `(offset in the block, length)`: no new entry
    /// may be placed over them until the mode gives them back (soft updates writes a
    /// rename's old name, and a removed directory's name, back into the bytes its removal
    /// merged away, until that removal may reach disk). The engine's directory index keeps
    /// them out of its free space (`cairn_dir::block::Held`). Called with the engine's lock
    /// held; a block's held bytes grow only inside a call that removes an entry from it,
    /// and shrink at any time (reported by [`Strategy::dir_bytes_given_back`]).
    fn held_dir_bytes(&self, blk: Blk) -> Vec<(u32, u32)> {
        let _ = blk;
        Vec::new()
    }

    /// The (directory, block) pairs whose held bytes shrank since the last call, ascending:
    /// the engine gives those bytes back to its index.
    fn dir_bytes_given_back(&self) -> Vec<(Ino, Blk)> {
        Vec::new()
    }

    // ---- outside calls ---------------------------------------------------------------

    /// fsync(2) of one file: when this returns, the file's data and the metadata needed to
    /// find it are durable. While it is in flight, data reaches disk before the pointers to
    /// it (the crash harness holds every mode to this).
    fn fsync(&self, e: &dyn Engine, f: &FsyncReq) -> Result<()> {
        e.io().fsync_file(f.blocks)
    }

    /// The mode's own counters for `cairn stats` (soft updates: dependencies, rollbacks).
    fn stats(&self) -> Option<serde_json::Value> {
        None
    }
}

/// A metadata-update discipline that can be chosen at mount time, with what it promises
/// about a crash (the crash harness holds it to exactly this).
#[derive(Clone, Copy, Debug)]
pub struct ModeInfo {
    pub name: &'static str,
    pub description: &'static str,
    pub guarantees: Guarantees,
    /// Its family, commit policy, recovery and log placement.
    pub facts: Facts,
    /// The mount options the mode parses itself (a journal's `log=`, `commit=`).
    pub options: &'static [OptionSpec],
    /// The strategy, from the mode's own options (each `(key, value)` one of `options`);
    /// a one-line error for a bad or unknown one.
    make: MakeStrategy,
}

/// Makes a mode's strategy from the mode's own mount options.
type MakeStrategy =
    fn(&[(String, Option<String>)]) -> std::result::Result<Box<dyn Strategy>, String>;

impl ModeInfo {
    /// The mode as the registry of file-system types lists it.
    pub fn spec(&self) -> ModeSpec {
        ModeSpec {
            name: self.name,
            description: self.description,
            guarantees: self.guarantees,
            facts: self.facts,
            options: self.options,
        }
    }
}

/// A mode that parses no options of its own: any is refused, naming it.
fn no_options(mode: &str, opts: &[(String, Option<String>)]) -> std::result::Result<(), String> {
    match opts.first() {
        Some((k, _)) => Err(format!(
            "mount option '{k}' is not an option of mode {mode}"
        )),
        None => Ok(()),
    }
}

/// The registry: every mode this build knows, in the order tools list them. A new
/// strategy registers here and appears in `cairn modes`, the benchmarks and the crash
/// harness without further changes.
static MODES: &[ModeInfo] = &[
    ModeInfo {
        name: "sync",
        description: "classic FFS: metadata calls durable on return, written in rule order with flushes as barriers",
        // Rules 1-3 by synchronous writes: what a crash leaves is what fsck reclaims; a
        // directory rename is not atomic without a log (001 §6).
        guarantees: Guarantees {
            metadata_on_return: true,
            fsync_data_first: true,
            no_stale_data: false,
            names_kept: true,
            corrupt: Allowed::Never,
            leak: Allowed::May,
            interrupted_rename: Allowed::May,
            after_crash: AfterCrash::Fsck,
            basis: "000 §5: create, delete, rename durable on return; 002 §3: rules 1-3 by synchronous writes; 001 §6: rename not atomic",
        },
        facts: Facts {
            family: Family::Ffs,
            commit: Commit::Sync,
            recovery: Recovery::None,
            log: LogPlacement::None,
        },
        options: &[],
        make: |o| {
            no_options("sync", o)?;
            Ok(Box::new(Sync::new()))
        },
    },
    ModeInfo {
        name: "async",
        description: "FFS mounted async: delayed writes, no ordering (the unsafe upper bound)",
        // No ordering at all: corruption is the expected outcome and must be shown (000
        // Table 3: "recovery is non-deterministic and may be impossible"); only fsync holds.
        guarantees: Guarantees {
            metadata_on_return: false,
            fsync_data_first: true,
            no_stale_data: false,
            names_kept: false,
            corrupt: Allowed::Shown,
            leak: Allowed::May,
            interrupted_rename: Allowed::May,
            after_crash: AfterCrash::Fsck,
            basis: "000 §5 and Table 3: FFS-async makes no guarantee; fsync is honoured in every mode",
        },
        facts: Facts {
            family: Family::Ffs,
            commit: Commit::Async,
            recovery: Recovery::None,
            log: LogPlacement::None,
        },
        options: &[],
        make: |o| {
            no_options("async", o)?;
            Ok(Box::new(Delayed))
        },
    },
    softdep::MODE,
    journal::MODE,
    journal::MODE_ASYNC,
    journal::MODE_GROUP,
];

pub fn modes() -> &'static [ModeInfo] {
    MODES
}

/// Modes that are built and tested but not yet listed: every tool iterates [`modes`] (the
/// crash campaign, the real-mount suites, the benchmarks), so a mode joins [`MODES`] only
/// once it passes them. They are reachable by name from tests and the crash harness
/// ([`make`], [`candidate`]), not from `cairn modes` or `-o mode=`. Every mode is listed now.
pub fn unlisted_modes() -> &'static [ModeInfo] {
    &[]
}

/// The unlisted mode called `name` (see [`unlisted_modes`]).
pub fn candidate(name: &str) -> Option<&'static ModeInfo> {
    unlisted_modes().iter().find(|m| m.name == name)
}

/// The strategy of the mode called `name`, with its default options.
pub fn by_name(name: &str) -> Option<Box<dyn Strategy>> {
    make(name, &[]).ok()
}

/// The strategy of mode `name` with the mode's own options `opts`: a one-line error for an
/// unknown mode or a bad option.
pub fn make(
    name: &str,
    opts: &[(String, Option<String>)],
) -> std::result::Result<Box<dyn Strategy>, String> {
    // Unlisted modes are found too: a library mount (tests, the crash harness) may name
    // one; the command's `-o mode=` checks against the listed ones first.
    let m = MODES
        .iter()
        .find(|m| m.name == name)
        .or_else(|| candidate(name))
        .ok_or_else(|| {
            let names: Vec<_> = MODES.iter().map(|m| m.name).collect();
            format!("unknown mode '{name}' (known: {})", names.join(", "))
        })?;
    (m.make)(opts)
}

/// Whether some mode parses mount option `key` itself.
pub fn is_mode_option(key: &str) -> bool {
    MODES.iter().any(|m| m.options.iter().any(|o| o.key == key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strategy's commit policy is the one the registry states for its mode (what the
    /// kernel may cache follows from it): one fact, checked rather than trusted.
    #[test]
    fn every_mode_s_strategy_commits_as_the_registry_says() {
        for m in modes() {
            let s = make(m.name, &[]).unwrap();
            assert_eq!(s.commit_policy(), m.facts.commit, "mode {}", m.name);
        }
    }
}
