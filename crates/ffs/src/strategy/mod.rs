//! Metadata-update strategies: the one interface every consistency discipline implements.
//!
//! The file-system code never asks which mode it runs in. At each point where the Soft
//! Updates paper's ordering rules apply (002 §3; 000/001 §2), it calls a `setup_*` hook
//! with the buffers the step changed, in the order the rules need them on disk:
//!
//! 1. Never point to a structure before it has been initialized: an inode reaches disk
//!    before the directory entry naming it (`setup_inode_alloc` before
//!    `setup_directory_add`), a bitmap marks a block used before a pointer to it.
//! 2. Never reuse a resource before nullifying all previous pointers to it: the entry goes
//!    (`setup_directory_remove`) before the link count drops (`setup_link_remove`), and an
//!    inode's pointers are cleared on disk (`setup_freeblocks`) before the bitmap frees them.
//! 3. Never reset the last pointer to a live resource before the new pointer has been set:
//!    rename adds the new name (`setup_directory_add`) before removing the old one.
//!
//! The names follow FreeBSD's `softdep_setup_*` family: soft updates will attach
//! dependency records to the buffers in these hooks and enforce the order with rollbacks in
//! the buffer cache's write hooks, and journaling will log the step instead. `sync` writes
//! each step's buffers at once with a device flush as the barrier before the next step;
//! `delayed` (FFS mounted async) only leaves them dirty.

mod delayed;
mod sync;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cairn_bufcache::{Buf, BufRef, BufferCache};
use cairn_vfs::modes::{AfterCrash, Allowed, Guarantees, ModeSpec};
use cairn_vfs::{KernelCachePolicy, Result};

use crate::format::kind;

pub use delayed::Delayed;
pub use sync::Sync;

/// The device-facing side a strategy works with: the cache plus the barrier bookkeeping.
pub struct Io {
    pub cache: Arc<BufferCache>,
    /// Writes have been issued since the last device flush.
    unflushed: AtomicBool,
    /// Blocks were allocated by the data path (file growth) and their bitmaps are not on
    /// disk yet: before an inode or indirect block can be written, the group blocks must
    /// be (rule 1 for block pointers).
    pub data_allocs_pending: AtomicBool,
}

impl Io {
    pub fn new(cache: Arc<BufferCache>) -> Io {
        Io {
            cache,
            unflushed: AtomicBool::new(false),
            data_allocs_pending: AtomicBool::new(false),
        }
    }

    /// Writes `bufs` after everything written before them is durable: the barrier that
    /// separates two ordered steps. Group blocks owed by the data path go first.
    pub fn write_ordered(&self, bufs: &[&BufRef]) -> Result<()> {
        self.ordered(bufs, &[kind::INODE, kind::INDIRECT])
    }

    /// Writes newly initialized blocks after everything written before them is durable.
    /// Unlike [`Io::write_ordered`], a new indirect block does not first need the group
    /// blocks owed by the data path: it holds no pointer to those blocks yet (a new indirect
    /// block is zero; a directory's point only to directory blocks whose bitmaps went first).
    /// An inode block in the step still does: it may hold other files' new pointers.
    pub fn write_initialized(&self, bufs: &[&BufRef]) -> Result<()> {
        self.ordered(bufs, &[kind::INODE])
    }

    fn ordered(&self, bufs: &[&BufRef], pointer_kinds: &[u8]) -> Result<()> {
        let has_pointers = bufs.iter().any(|b| pointer_kinds.contains(&b.kind()));
        if has_pointers && self.data_allocs_pending.swap(false, Ordering::AcqRel) {
            self.write_groups()?;
        }
        self.barrier()?;
        let dirty: Vec<&BufRef> = bufs.iter().copied().filter(|b| b.is_dirty()).collect();
        if !dirty.is_empty() {
            self.cache.write_now(&dirty)?;
            self.unflushed.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Flushes if anything was written since the last flush.
    pub fn barrier(&self) -> Result<()> {
        if self.unflushed.swap(false, Ordering::AcqRel) {
            self.cache.flush_device()?;
        }
        Ok(())
    }

    /// Writes every dirty group block (bitmaps, descriptors). A barrier comes first: a
    /// group block may carry freed bits whose cleared pointers were written but not yet
    /// flushed (rule 2: the bitmap may free a block only after no pointer to it is on disk).
    fn write_groups(&self) -> Result<()> {
        self.barrier()?;
        self.cache
            .write_back_filter(&|b: &Buf| b.kind() == kind::GROUP)?;
        self.unflushed.store(true, Ordering::Release);
        Ok(())
    }

    /// Writes every dirty buffer in rule order (group blocks, barrier, the rest) and, if
    /// `durable`, flushes at the end.
    pub fn write_back_ordered(&self, durable: bool) -> Result<()> {
        self.data_allocs_pending.store(false, Ordering::Release);
        self.write_groups()?;
        self.barrier()?;
        self.cache.write_back_all()?;
        self.unflushed.store(true, Ordering::Release);
        if durable {
            self.barrier()?;
        }
        Ok(())
    }

    /// fsync of one file whose dirty data and indirect blocks are `blocks`: its data and
    /// the group blocks (bitmaps) that allocated it, a barrier, its indirect blocks (the
    /// pointers to that data) behind a barrier of their own, then every dirty metadata
    /// buffer (inodes, directories: the file's name may not be on disk yet), and a flush.
    /// Other files' data stays in the cache. Every pointer reaches disk after what it points
    /// to — data, then indirect blocks, then the inode — so while the fsync is in flight the
    /// file never shows zeros or another file's blocks within its size on disk (an inode
    /// written with its indirect block in one epoch could land alone: its new size over a
    /// hole), and an fsynced file never shows stale blocks after a crash.
    pub fn fsync_file(&self, blocks: &[BufRef]) -> Result<()> {
        let (data, indirect): (Vec<&BufRef>, Vec<&BufRef>) = blocks
            .iter()
            .filter(|b| b.is_dirty())
            .partition(|b| b.kind() != kind::INDIRECT);
        if !data.is_empty() {
            self.cache.write_now(&data)?;
            self.unflushed.store(true, Ordering::Release);
        }
        self.data_allocs_pending.store(false, Ordering::Release);
        self.write_groups()?;
        if !indirect.is_empty() {
            self.barrier()?;
            self.cache.write_now(&indirect)?;
            self.unflushed.store(true, Ordering::Release);
        }
        self.barrier()?;
        self.cache
            .write_back_filter(&|b: &Buf| b.kind() != kind::DATA)?;
        self.unflushed.store(true, Ordering::Release);
        self.barrier()
    }

    /// Writes every dirty buffer with no ordering at all.
    pub fn write_back_unordered(&self, durable: bool) -> Result<()> {
        self.cache.write_back_all()?;
        self.unflushed.store(true, Ordering::Release);
        if durable {
            self.barrier()?;
        }
        Ok(())
    }
}

/// A metadata-update discipline. See the module documentation for the rules each hook
/// stands for. Every hook receives the buffers the step dirtied.
pub trait Strategy: Send + std::marker::Sync {
    fn name(&self) -> &'static str;

    /// What the kernel may cache on top of us in this mode.
    fn cache_policy(&self) -> KernelCachePolicy;

    /// How often the syncer writes dirty buffers by default.
    fn syncer_interval(&self) -> Duration;

    /// A new inode (and, for directories and slow symlinks, its first block) was allocated
    /// and initialized; bitmaps included. Rule 1: on disk before any entry names it.
    fn setup_inode_alloc(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;

    /// A newly allocated block was initialized (a directory's block, an indirect block, a
    /// slow symlink's target, an xattr block), with the bitmap that allocated it. Rule 1:
    /// on disk before any pointer to it. Sync writes it behind a barrier, as FFS writes a
    /// new indirect or directory block synchronously before linking it.
    fn setup_block_init(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;

    /// A directory entry now names an inode (new entry or an existing entry re-pointed).
    fn setup_directory_add(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;

    /// A directory entry was removed. Rule 2: before the link count it accounted for drops.
    fn setup_directory_remove(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;

    /// A link count was raised, before a new reference to the inode exists (link, rename):
    /// the count must never be lower than the references on disk.
    fn setup_link_add(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;

    /// A link count was lowered after its reference went (unlink, rmdir, rename). Writing it
    /// late is always safe: a count higher than the references is a leak, never a loss.
    fn setup_link_remove(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;

    /// Block pointers were cleared (truncate, free). Rule 2: on disk before the bitmap
    /// frees the blocks (the caller frees them after this returns).
    fn setup_freeblocks(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;

    /// Attributes changed (chmod, chown, times, size growth by setattr).
    fn setup_attr_change(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;

    /// The end of a metadata call: the point where the mode's durability promise holds.
    fn op_done(&self, io: &Io) -> Result<()>;

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
        make: || Box::new(Sync),
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
