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
mod sync;

use std::any::Any;
use std::time::Duration;

use cairn_bufcache::BufRef;
use cairn_vfs::modes::{AfterCrash, Allowed, Guarantees, ModeSpec};
use cairn_vfs::{KernelCachePolicy, Result};

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

    /// What the kernel may cache on top of us in this mode.
    fn cache_policy(&self) -> KernelCachePolicy;

    /// How often the syncer writes dirty buffers by default.
    fn syncer_interval(&self) -> Duration;

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
    /// Inode `ino` was encoded into `buf` (FreeBSD: `softdep_update_inodeblock`).
    fn update_inodeblock(&self, tx: &mut Tx, ino: Ino, buf: &BufRef) -> Result<()> {
        let _ = (tx, ino, buf);
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

    // ---- outside calls ---------------------------------------------------------------

    /// fsync(2) of one file whose dirty cached data and indirect blocks are `blocks`: when
    /// this returns, the file's data and the metadata needed to find it are durable. While
    /// it is in flight, data reaches disk before the pointers to it (the crash harness
    /// holds every mode to this).
    fn fsync(&self, io: &Io, blocks: &[BufRef]) -> Result<()> {
        io.fsync_file(blocks)
    }

    /// Writes every dirty buffer (syncer, memory pressure); `durable` ends with a flush.
    fn write_back(&self, io: &Io, durable: bool) -> Result<()>;
}

/// A metadata-update discipline that can be chosen at mount time, with what it promises
/// about a crash (the crash harness holds it to exactly this).
#[derive(Clone, Copy, Debug)]
pub struct ModeInfo {
    pub name: &'static str,
    pub description: &'static str,
    pub guarantees: Guarantees,
    make: fn() -> Box<dyn Strategy>,
}

impl ModeInfo {
    /// The mode as the registry of file-system types lists it.
    pub fn spec(&self) -> ModeSpec {
        ModeSpec {
            name: self.name,
            description: self.description,
            guarantees: self.guarantees,
        }
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
            corrupt: Allowed::Never,
            leak: Allowed::May,
            interrupted_rename: Allowed::May,
            after_crash: AfterCrash::Fsck,
            basis: "000 §5: create, delete, rename durable on return; 002 §3: rules 1-3 by synchronous writes; 001 §6: rename not atomic",
        },
        make: || Box::new(Sync::new()),
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
            corrupt: Allowed::Shown,
            leak: Allowed::May,
            interrupted_rename: Allowed::May,
            after_crash: AfterCrash::Fsck,
            basis: "000 §5 and Table 3: FFS-async makes no guarantee; fsync is honoured in every mode",
        },
        make: || Box::new(Delayed),
    },
];

pub fn modes() -> &'static [ModeInfo] {
    MODES
}

/// The strategy of the mode called `name`.
pub fn by_name(name: &str) -> Option<Box<dyn Strategy>> {
    MODES.iter().find(|m| m.name == name).map(|m| (m.make)())
}
