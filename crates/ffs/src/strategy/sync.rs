//! `sync`: classic FFS. Each ordered step is written at once, after a device flush that
//! makes the previous step durable (the barrier), and every metadata call ends with a flush,
//! so it is durable when it returns. Costs one flush per ordered step: create = 2 (inode,
//! then entry), remove = 1 (the entry; the lowered link count and the freed inode follow
//! behind the next barrier), rename = 3 (link count up, new name, old name gone), which is
//! the price the papers measure for synchronous metadata (000 §2).
//!
//! The facts of a call are turned into steps by a small accumulator ([`SyncOp`]): what a
//! fact names is written at once when the rules need it on disk before what comes next,
//! and otherwise collected until the step that must carry it:
//!
//! | fact | step |
//! |---|---|
//! | `inomapdep` | remembers the bitmap and descriptor for the inode's first encoding |
//! | `blkmapdep` | remembers them for the pointer to the block |
//! | `allocdirect`/`allocindir`, data | owes the group blocks: before the next inode or indirect block is written, they go first (rule 1 for block pointers) |
//! | `allocdirect`/`allocindir`, metadata | the new block and its group blocks (a new directory's first block: with its parent's raised count); for a directory block under an indirect block, then the indirect blocks holding the new pointers (a directory must never have a hole) |
//! | `update_inodeblock` | a new inode's first encoding: with its bitmap and descriptor. Otherwise collected |
//! | `change_linkcnt` | a raise for link or rename: at once; for `..`: with the next step; a drop: left dirty |
//! | `directory_add`/`_change`/`_remove` | the collected inode blocks and `..` raises with the entry's block (exchange: one step at the end) |
//! | `freeblocks` | the cleared indirect blocks and the inode, then the bits are released |
//! | `freefile` | the bit is released (the zeroed inode went in the `freeblocks` step) |
//! | `attr_change` | the collected inode blocks, the xattr block and the inode |
//! | `end_op` | a flush, if the call is a durability point |

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cairn_bufcache::BufRef;
use cairn_vfs::Result;
use cairn_vfs::modes::Commit;
use parking_lot::Mutex;

use super::{
    AllocDirect, AllocIndir, Apply, AttrChange, Blk, BlkMapDep, BlockKind, DirAdd, DirChange,
    DirRemove, Engine, FreeBlocks, FreeFile, FsyncReq, Ino, InoMapDep, Io, LinkChange, LinkWhy,
    OpKind, OpState, Release, Strategy, SyncWhy, Tx,
};
use crate::format::kind;

/// How a step reaches the device. [`Ordered`] is sync's: a barrier, then the step's
/// buffers. The crash harness plants ordering bugs by writing steps another way.
pub trait StepWriter: Send + std::marker::Sync {
    /// Writes one step's buffers.
    fn step(&self, io: &Io, bufs: &[&BufRef]) -> Result<()>;
    /// Writes the group blocks the data path owes, before a step holding pointers.
    fn groups(&self, io: &Io) -> Result<()>;
    /// The end of a call that is a durability point.
    fn durable(&self, io: &Io) -> Result<()>;
}

/// Sync's steps: a barrier, then the buffers; owed group blocks behind a barrier of their
/// own (they may carry freed bits whose cleared pointers are not yet durable); a flush at
/// the end of a call.
pub struct Ordered;

impl StepWriter for Ordered {
    fn step(&self, io: &Io, bufs: &[&BufRef]) -> Result<()> {
        io.write_step(bufs)
    }
    fn groups(&self, io: &Io) -> Result<()> {
        io.write_groups()
    }
    fn durable(&self, io: &Io) -> Result<()> {
        io.barrier()
    }
}

pub struct Sync {
    steps: Arc<dyn StepWriter>,
    /// Blocks were allocated by the data path (file growth) and their bitmaps are not on
    /// disk yet: before an inode or indirect block can be written, the group blocks must
    /// be (rule 1 for block pointers).
    groups_owed: AtomicBool,
    /// `groups_owed` when the call began: a failed call's rollback may take back group
    /// writes that paid an earlier debt, so the debt comes back with it.
    owed_at_begin: AtomicBool,
    /// The call in progress. Sync calls never overlap: the engine holds its lock from
    /// `begin_op` to `end_op` in this mode.
    op: Mutex<SyncOp>,
}

/// What the call in progress has declared and not yet written.
#[derive(Default)]
struct SyncOp {
    /// Bitmap and descriptor of each inode allocated, until its first encoding is written.
    new_inodes: Vec<(Ino, [BufRef; 2])>,
    /// Bitmap and descriptor of each block allocated, until the pointer to it is declared.
    new_blocks: Vec<(Blk, [BufRef; 2])>,
    /// Inode blocks carrying a link count a `..` will need (mkdir's parent, the new parent
    /// of a moved directory): written with the next step.
    dotdot: Vec<BufRef>,
    /// Inode blocks encoded since the last step.
    updates: Vec<BufRef>,
    /// Indirect blocks that received new pointers along the path being mapped.
    holders: Vec<BufRef>,
    /// exchange: everything, written as one step at the end.
    batch: Vec<BufRef>,
}

fn push_unique(v: &mut Vec<BufRef>, b: &BufRef) {
    if !v.iter().any(|x| Arc::ptr_eq(x, b)) {
        v.push(Arc::clone(b));
    }
}

impl Default for Sync {
    fn default() -> Self {
        Self::new()
    }
}

impl Sync {
    pub fn new() -> Sync {
        Sync::with_steps(Arc::new(Ordered))
    }

    /// Sync with its steps written by `steps` (the crash harness's planted bugs).
    pub fn with_steps(steps: Arc<dyn StepWriter>) -> Sync {
        Sync {
            steps,
            groups_owed: AtomicBool::new(false),
            owed_at_begin: AtomicBool::new(false),
            op: Mutex::new(SyncOp::default()),
        }
    }

    /// Takes the debt of group blocks the data path's allocations left (true: the caller
    /// now owes writing them before any pointer to those blocks).
    pub fn take_groups_owed(&self) -> bool {
        self.groups_owed.swap(false, Ordering::AcqRel)
    }

    /// Writes `bufs` as one step; when any of them holds pointers (`pointer_kinds`), the
    /// group blocks the data path owes go first, behind their own barrier.
    fn step(&self, io: &Io, bufs: &[&BufRef], pointer_kinds: &[u8]) -> Result<()> {
        let has_pointers = bufs.iter().any(|b| pointer_kinds.contains(&b.kind()));
        if has_pointers && self.take_groups_owed() {
            self.steps.groups(io)?;
        }
        self.steps.step(io, bufs)
    }

    /// A step that may hold pointers to data blocks (inodes, indirect blocks).
    fn step_ordered(&self, io: &Io, bufs: &[BufRef]) -> Result<()> {
        let refs: Vec<&BufRef> = bufs.iter().collect();
        self.step(io, &refs, &[kind::INODE, kind::INDIRECT])
    }

    /// A step of newly initialized blocks. Unlike [`Sync::step_ordered`], a new indirect
    /// block does not first need the group blocks owed by the data path: it holds no
    /// pointer to those blocks yet (a new indirect block is zero; a directory's point only
    /// to directory blocks whose bitmaps went first). An inode block in the step still does.
    fn step_initialized(&self, io: &Io, bufs: &[BufRef]) -> Result<()> {
        let refs: Vec<&BufRef> = bufs.iter().collect();
        self.step(io, &refs, &[kind::INODE])
    }

    /// A new block's pointer was declared: for data, the bitmap is owed; for metadata, the
    /// block goes to disk now with its group blocks (and raised `..` counts), and a
    /// directory block's holders after it.
    fn alloc(
        &self,
        tx: &mut Tx,
        ino: Ino,
        blk: Blk,
        kind: BlockKind,
        new_buf: Option<&BufRef>,
        holder: Option<&BufRef>,
    ) -> Result<()> {
        let mut op = self.op.lock();
        let groups = op
            .new_blocks
            .iter()
            .position(|(b, _)| *b == blk)
            .map(|i| op.new_blocks.swap_remove(i).1);
        if let Some(h) = holder {
            push_unique(&mut op.holders, h);
        }
        match kind {
            BlockKind::Data => {
                self.groups_owed.store(true, Ordering::Release);
                op.holders.clear();
                Ok(())
            }
            _ => {
                let mut bufs: Vec<BufRef> = Vec::new();
                // A new directory's first block carries its parent's raised count (the
                // block's ".." is the reference it allows); growing an existing directory
                // does not.
                let mkdir_body =
                    kind == BlockKind::Directory && op.new_inodes.iter().any(|(i, _)| *i == ino);
                if mkdir_body {
                    bufs.append(&mut op.dotdot);
                }
                bufs.extend(new_buf.cloned());
                bufs.extend(groups.into_iter().flatten());
                self.step_initialized(tx.io, &bufs)?;
                if kind == BlockKind::Indirect {
                    return Ok(());
                }
                let holders = std::mem::take(&mut op.holders);
                if kind == BlockKind::Directory && !holders.is_empty() {
                    self.step_initialized(tx.io, &holders)?;
                }
                Ok(())
            }
        }
    }

    /// A step carrying an entry's block with the inode blocks encoded since the last step
    /// (and raised `..` counts); exchange collects everything for one step at the end.
    fn entry_step(&self, tx: &mut Tx, buf: &BufRef) -> Result<()> {
        let mut op = self.op.lock();
        if tx.kind == OpKind::Exchange {
            push_unique(&mut op.batch, buf);
            return Ok(());
        }
        let mut bufs = std::mem::take(&mut op.dotdot);
        bufs.append(&mut op.updates);
        bufs.push(Arc::clone(buf));
        drop(op);
        self.step_ordered(tx.io, &bufs)
    }
}

impl Strategy for Sync {
    fn name(&self) -> &'static str {
        "sync"
    }

    /// Every call's metadata by synchronous writes before it returns: the kernel may not
    /// buffer writes either (ENOSPC, EFBIG and mtime are the file system's at write time).
    /// Writes are still delayed in our buffer cache, as in classic FFS.
    fn commit_policy(&self) -> Commit {
        Commit::Sync
    }

    fn syncer_interval(&self) -> Duration {
        Duration::from_secs(30)
    }

    fn begin_op(&self, _kind: OpKind) -> Result<OpState> {
        let mut op = self.op.lock();
        *op = SyncOp::default();
        self.owed_at_begin
            .store(self.groups_owed.load(Ordering::Acquire), Ordering::Release);
        Ok(None)
    }

    fn commit_point(&self, tx: &mut Tx) -> Result<()> {
        tx.io.barrier()
    }

    fn end_op(&self, tx: &mut Tx, ok: bool) -> Result<()> {
        if !ok {
            *self.op.lock() = SyncOp::default();
            if self.owed_at_begin.load(Ordering::Acquire) {
                self.groups_owed.store(true, Ordering::Release);
            }
            return Ok(());
        }
        if tx.kind == OpKind::Exchange {
            let bufs = {
                let mut op = self.op.lock();
                let mut bufs = std::mem::take(&mut op.dotdot);
                bufs.append(&mut op.updates);
                bufs.append(&mut op.batch);
                bufs
            };
            self.step_ordered(tx.io, &bufs)?;
        }
        if tx.kind.durable() {
            self.steps.durable(tx.io)?;
        }
        Ok(())
    }

    fn setup_inomapdep(&self, _tx: &mut Tx, f: &InoMapDep) -> Result<()> {
        let groups = [Arc::clone(f.desc), Arc::clone(f.bitmap)];
        self.op.lock().new_inodes.push((f.ino, groups));
        Ok(())
    }

    fn setup_blkmapdep(&self, _tx: &mut Tx, f: &BlkMapDep) -> Result<()> {
        let groups = [Arc::clone(f.desc), Arc::clone(f.bitmap)];
        self.op.lock().new_blocks.push((f.blk, groups));
        Ok(())
    }

    fn setup_allocdirect(&self, tx: &mut Tx, f: &AllocDirect) -> Result<()> {
        // An xattr chain's further blocks go to disk first, with their group blocks,
        // before the head's step (which makes the pointer's step possible).
        if !f.chain.is_empty() {
            let mut bufs: Vec<BufRef> = f.chain.to_vec();
            let mut op = self.op.lock();
            for b in f.chain {
                if let Some(i) = op.new_blocks.iter().position(|(x, _)| *x == b.blkno()) {
                    bufs.extend(op.new_blocks.swap_remove(i).1);
                }
            }
            drop(op);
            self.step_initialized(tx.io, &bufs)?;
        }
        self.alloc(tx, f.ino, f.new_blk, f.kind, f.new_buf, None)
    }

    fn setup_allocindir(&self, tx: &mut Tx, f: &AllocIndir) -> Result<()> {
        self.alloc(tx, f.ino, f.new_blk, f.kind, f.new_buf, Some(f.indir))
    }

    /// A new inode's first encoding goes with its bitmap and descriptor, at once (rule 1:
    /// before any entry names it; if a crash keeps the inode but not the bit, nothing names
    /// it yet and fsck reclaims it). Other encodings wait for the step that needs them.
    fn update_inodeblock(&self, tx: &mut Tx, ino: Ino, buf: &BufRef, _was: u64) -> Result<()> {
        let mut op = self.op.lock();
        if let Some(i) = op.new_inodes.iter().position(|(i, _)| *i == ino) {
            let (_, groups) = op.new_inodes.swap_remove(i);
            drop(op);
            let [desc, bitmap] = groups;
            return self.step_ordered(tx.io, &[desc, bitmap, Arc::clone(buf)]);
        }
        push_unique(&mut op.updates, buf);
        Ok(())
    }

    fn setup_directory_add(&self, tx: &mut Tx, f: &DirAdd) -> Result<()> {
        self.entry_step(tx, f.buf)
    }

    fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> Result<Apply> {
        self.entry_step(tx, f.buf)?;
        Ok(Apply::Now)
    }

    fn setup_directory_remove(&self, tx: &mut Tx, f: &DirRemove) -> Result<Apply> {
        self.entry_step(tx, f.buf)?;
        Ok(Apply::Now)
    }

    /// A raise for a new name (link, rename) goes to disk at once, before the name exists
    /// (count ≥ references). A raise for a `..` goes with the next step, which is the one
    /// that makes the `..` (mkdir's first block) or comes before it (rename's new name). A
    /// drop is left dirty: the syncer or the next ordered write of the block carries it,
    /// always after the removal it follows is durable (`end_op` flushed it); a crash before
    /// then leaves a count one too high, a leak fsck reclaims, never a lost file.
    fn change_linkcnt(&self, tx: &mut Tx, f: &LinkChange) -> Result<()> {
        if f.after <= f.before {
            return Ok(());
        }
        match f.why {
            LinkWhy::DotDot => {
                push_unique(&mut self.op.lock().dotdot, f.inode_buf);
                Ok(())
            }
            _ => self.step_ordered(tx.io, &[Arc::clone(f.inode_buf)]),
        }
    }

    /// The cleared pointers (indirect blocks, inode) go to disk first; only then are the
    /// bits released (rule 2). The next step's barrier makes them durable before anything
    /// can point to the freed resources again.
    fn setup_freeblocks(&self, tx: &mut Tx, f: &FreeBlocks) -> Result<()> {
        let mut bufs: Vec<BufRef> = f.holders.to_vec();
        bufs.push(Arc::clone(f.inode_buf));
        self.step_ordered(tx.io, &bufs)?;
        if !f.freed.is_empty() {
            tx.release(Release::Blocks(f.freed.to_vec()));
        }
        Ok(())
    }

    fn setup_freefile(&self, tx: &mut Tx, f: &FreeFile) -> Result<()> {
        tx.release(Release::Inode {
            ino: f.ino,
            is_dir: f.is_dir,
        });
        Ok(())
    }

    fn setup_attr_change(&self, tx: &mut Tx, f: &AttrChange) -> Result<()> {
        let mut bufs = std::mem::take(&mut self.op.lock().updates);
        bufs.extend(f.extra.iter().cloned());
        bufs.push(Arc::clone(f.inode_buf));
        self.step_ordered(tx.io, &bufs)
    }

    fn fsync(&self, e: &dyn Engine, f: &FsyncReq) -> Result<()> {
        self.take_groups_owed();
        e.io().fsync_file(f.blocks)
    }

    /// Every dirty buffer in rule order: group blocks, barrier, the rest.
    fn sync(&self, e: &dyn Engine, why: SyncWhy) -> Result<()> {
        self.take_groups_owed();
        e.io().write_back_ordered(why.durable())
    }
}
