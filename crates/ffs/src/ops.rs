//! The file-system operations: the [`FileSystem`] contract on top of the engine.
//!
//! Every mutating operation runs under the state lock as one call the strategy is told
//! about (`begin_op`, the facts in the order the changes are made, `end_op`: see
//! `strategy`), all inside an undo scope: if any of it fails, the operation changes nothing
//! (see `undo`). The one exception is a write in a `Concurrent` mode: two calls, with its
//! stream's device writes between them under the file's own lock only (see `write`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use cairn_blockdev::CounterSnapshot;
use cairn_bufcache::BufRef;
use cairn_vfs::falloc::Falloc;
use cairn_vfs::perm::{self, LINK_MAX, XattrOp};
use cairn_vfs::{
    Access, Attr, Ctx, DirEntry, Errno, FallocMode, Fh, FileKind, FileSystem, FsError, Ino,
    KernelCachePolicy, Owner, RenameFlags, Result, SetAttr, SetTime, StatFs,
};

use crate::format::{
    DiskInode, FAST_SYMLINK_MAX, FormatError, MAX_NAME, ROOT_INO, dir, kind, put_u64, xattr,
};
use crate::inode::{now_ns, time_to_ns};
use crate::strategy::{
    AclMode, AllocDirect, Apply, AttrChange, BlockKind, DataZeroed, FreeBlocks, FsyncReq,
    InoMapDep, InodePtr, IoModel, LinkChange, LinkWhy, OpKind, SyncWhy,
};
use crate::{Ffs, State, corrupt_err};

/// A write request at least this long is a stream: its whole blocks go straight to the
/// device (see `do_write`).
const STREAM_BYTES: u64 = 256 << 10;
/// An fallocate that allocates at least this many bytes gives its new blocks their zeros on
/// the device (`BufferCache::zero_uncached`, then a flush) rather than a buffer of zeros
/// each: below it, a flush costs more than the buffers.
const ZERO_ON_DEVICE_BYTES: u64 = 256 << 10;
/// Largest single device write of a stream (1 MiB of 4 KiB blocks).
const STREAM_RUN_BLOCKS: usize = 256;
const XATTR_SIZE_MAX: usize = 65_536;

/// What `Ffs::new_inode` makes: the type and permission bits asked for (before the umask),
/// the directory it will be named in, and the blocks that name needs (for the preflight).
struct NewInode<'a> {
    parent: u64,
    mode: u32,
    umask: u32,
    rdev: u32,
    link_target: Option<&'a [u8]>,
    name_blocks: u64,
}

/// A write request as its first pass mapped it (`write_map`).
struct WritePlan {
    offset: u64,
    pieces: Vec<Piece>,
    /// Indirect blocks the first pass allocated, parents first.
    grown: Vec<crate::bmap::Grown>,
    /// The inode's block, held so the final inode update needs no device read.
    _inode_block: BufRef,
}

/// One block of a write request, as pass 1 of `write_map` mapped it.
struct Piece {
    lbn: u64,
    /// The device block.
    p: u64,
    /// Allocated by this request.
    fresh: bool,
    in_blk: usize,
    n: usize,
    /// Offset in the request's data.
    doff: usize,
    target: Target,
}

/// Where a piece's bytes go.
enum Target {
    /// Into this cached buffer (it holds the block's other bytes).
    Cached(BufRef),
    /// Into a new buffer: the block is new or entirely overwritten.
    New,
    /// Straight to the device, in a run (a stream's whole, uncached blocks).
    Direct,
}

/// Where the bytes `at..at + len` of a read's reply come from (`read_plan`).
enum ReadPiece {
    /// A hole.
    Zeros { at: usize, len: usize },
    /// A cached block, from byte `in_blk` on.
    Cached {
        at: usize,
        len: usize,
        in_blk: usize,
        b: BufRef,
    },
    /// `blocks` device-contiguous uncached blocks from `blk`, from byte `in_blk` of the
    /// first on: one device read.
    Device {
        at: usize,
        len: usize,
        in_blk: usize,
        blk: u64,
        blocks: u64,
    },
}

/// The mode, ids and flags of an inode, as the permission rules see them.
pub(crate) fn owner(d: &DiskInode) -> Owner {
    Owner {
        mode: d.mode,
        uid: d.uid,
        gid: d.gid,
        flags: d.flags,
    }
}

/// How a change of an inode's extended attributes reaches disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum XattrWrite {
    /// The block is rewritten in place: nothing else of the inode depends on it.
    InPlace,
    /// The access ACL changes with the mode: the attributes go to a new block, which the
    /// inode switches to in the same encoding as its mode (`old_mode`: the mode before), so
    /// the two reach disk together in every mode (see `acl`).
    WithMode { old_mode: u32 },
}

fn dtype_of(mode: u32) -> u8 {
    ((mode & libc::S_IFMT) >> 12) as u8
}

impl Ffs {
    /// Runs one operation under the lock, attributing device writes and flushes to it.
    /// `kind`: the call the strategy is told about (`None`: nothing on disk changes). A
    /// call that changes metadata either completes, durability point included, or changes
    /// nothing (see `undo`, `Ffs::in_op`).
    fn op<T>(
        &self,
        name: &'static str,
        kind: Option<OpKind>,
        f: impl FnMut(&mut State) -> Result<T>,
    ) -> Result<T> {
        self.counted(name, || self.locked_op(kind, f))
    }

    /// Runs `f` (one application call) and charges `name` with every write and flush the
    /// device made meanwhile, for `cairn stats`: exact when calls do not overlap. Calls
    /// that overlap are each charged what the device did while they ran — shared writes
    /// and flushes counted once per call, so the sums then exceed the device's own totals
    /// (measured: 278,562 flushes charged to writes against 138,493 made, with two FUSE
    /// threads; docs/CONFORMANCE.md). Per-call figures of a concurrent run are read
    /// against the device's totals, never added up.
    fn counted<T>(&self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let before: CounterSnapshot = self.dev.counters().snapshot();
        let r = f();
        let d = self.dev.counters().snapshot().delta(&before);
        {
            let mut stats = self.stats.lock();
            let s = stats.entry(name).or_default();
            s.calls += 1;
            s.device_writes += d.writes;
            s.device_flushes += d.flushes;
        }
        self.ops_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        r
    }

    /// Runs `f` under the engine's lock, as one call of `kind` when it has one (see
    /// `Ffs::in_op`); after a call that changed metadata, relieves memory pressure with the
    /// lock released.
    ///
    /// A call that runs out of space while the mode still holds frees back (soft updates'
    /// worklist: blocks and inodes released only once the pointers to them are cleared on
    /// disk, rule 2) first has those frees made — a full sync with the lock released — and
    /// is run once more: a `rm -rf` followed by a create must not see ENOSPC for space that
    /// is merely on its way back (FreeBSD's softdep_request_cleanup). A failed call changed
    /// nothing (undo scopes), so running it again is safe.
    fn locked_op<T>(
        &self,
        kind: Option<OpKind>,
        mut f: impl FnMut(&mut State) -> Result<T>,
    ) -> Result<T> {
        let mutating = kind.is_some_and(|k| k != OpKind::Read);
        if mutating && self.read_only {
            return Err(Errno::EROFS.into());
        }
        let mut retried = false;
        let r = loop {
            let r = {
                let mut st = self.st.lock();
                match kind {
                    Some(k) => self.in_op(&mut st, k, &mut f),
                    None => f(&mut st),
                }
            };
            let out_of_space = matches!(&r, Err(e) if e.errno() == Errno::ENOSPC);
            if !mutating
                || retried
                || !out_of_space
                || !self.make_held_frees("for a call out of space")
            {
                break r;
            }
            retried = true;
        };
        // The call's last step, with the engine's lock released: a journal forces the
        // call's log records here (commit=group), so calls ending together share a flush.
        let r = match self.strategy.after_op() {
            Err(e) if r.is_ok() => Err(e),
            _ => r,
        };
        if mutating {
            self.relieve_memory_pressure();
            if let Err(e) = self.strategy.relieve(self) {
                log::error!("the mode's memory bound: {e}");
            }
        }
        r
    }

    /// Frees the mode still holds back (soft updates' worklist, rule 2: an `rm`'s blocks
    /// return only once its removal is on disk) are room on its way: whoever is short of
    /// room has them made — a full sync, with the engine's lock released — and looks again.
    /// Returns whether looking again can help: false when none are pending or the sync
    /// failed (logged, saying `for_what`).
    fn make_held_frees(&self, for_what: &str) -> bool {
        if !self.strategy.has_pending_frees() {
            return false;
        }
        match self.sync_as(SyncWhy::All) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("making pending frees {for_what}: {e}");
                false
            }
        }
    }

    /// Keeps dirty buffers under half the cache budget by writing back in the mode's order
    /// (the cache itself never writes a dirty buffer: `DeferEviction`). The calling thread
    /// does it, throttling the writer that dirtied the cache; in a `Concurrent` mode without
    /// the engine's lock, so other calls go on meanwhile.
    fn relieve_memory_pressure(&self) {
        let dirty_bytes = self.vol.cache.dirty_count() as u64 * self.vol.geo.block_size as u64;
        if dirty_bytes > self.vol.cache.config().budget_bytes / 2
            && let Err(e) = self.sync_as(SyncWhy::Pressure)
        {
            log::error!("write-back under memory pressure failed: {e}");
        }
    }

    fn dir_inode(&self, st: &mut State, ino: u64) -> Result<DiskInode> {
        let d = self.iget(st, ino)?.d.clone();
        if !d.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        Ok(d)
    }

    /// Search permission on a directory (its ACL included).
    fn dir_for_lookup(&self, st: &mut State, ctx: &Ctx, ino: u64) -> Result<DiskInode> {
        self.dir_inode(st, ino)?;
        self.may(st, ctx, ino, Access::X)
    }

    /// A directory that still exists (not removed), searchable by the caller: where an
    /// entry will be removed (the write permission is `may_delete`'s).
    fn dir_for_remove(&self, st: &mut State, ctx: &Ctx, ino: u64) -> Result<DiskInode> {
        self.dir_inode(st, ino)?;
        if self.iget(st, ino)?.effnlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        self.may(st, ctx, ino, Access::X)
    }

    /// Write+search permission on a directory that still exists (not removed): where an
    /// entry will be added (an immutable directory refuses with EPERM).
    fn dir_for_change(&self, st: &mut State, ctx: &Ctx, ino: u64) -> Result<DiskInode> {
        self.dir_inode(st, ino)?;
        if self.iget(st, ino)?.effnlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        self.may(st, ctx, ino, Access::WX)
    }

    fn touch_dir(&self, st: &mut State, dino: u64) -> Result<BufRef> {
        let now = now_ns();
        let ic = self.iget(st, dino)?;
        ic.d.mtime = now;
        ic.d.ctime = now;
        self.store(st, dino)
    }

    /// A new reference to `ino` will exist (a name, or a directory's `..`): its link count
    /// goes up on disk first (count ≥ references), and the strategy is told why.
    fn raise_link(&self, st: &mut State, ino: u64, why: LinkWhy) -> Result<()> {
        let ic = self.iget(st, ino)?;
        let before = ic.d.nlink;
        ic.d.nlink += 1;
        ic.effnlink += 1;
        let after = ic.d.nlink;
        let b = self.store(st, ino)?;
        let f = LinkChange {
            ino,
            inode_buf: &b,
            before,
            after,
            why,
        };
        self.fact(st, |s, tx| s.change_linkcnt(tx, &f))
    }

    /// `n` references to `ino` went (their removal was declared; `apply` is what the
    /// strategy said): the namespace count drops now, the on-disk count now or when the
    /// strategy lowers it later (rule 2: after the removal is on disk).
    fn drop_link(&self, st: &mut State, ino: u64, n: u32, apply: Apply) -> Result<()> {
        let ic = self.iget(st, ino)?;
        ic.effnlink = ic.effnlink.saturating_sub(n);
        if ic.effnlink == 0 {
            st.inodes.add_orphan(ino);
        }
        let ic = self.iget(st, ino)?;
        let before = ic.d.nlink;
        if apply == Apply::Now {
            ic.d.nlink = ic.d.nlink.saturating_sub(n);
        }
        let after = ic.d.nlink;
        let b = self.store(st, ino)?;
        if after != before {
            let f = LinkChange {
                ino,
                inode_buf: &b,
                before,
                after,
                why: LinkWhy::Drop,
            };
            self.fact(st, |s, tx| s.change_linkcnt(tx, &f))?;
        }
        Ok(())
    }

    /// Creates an inode of any type named `name` in `parent`: `mode` is its type and the
    /// permission bits asked for, before the umask (which applies unless the directory has
    /// a default ACL to inherit: `Ffs::inherit`). Returns its number.
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        st: &mut State,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        link_target: Option<&[u8]>,
    ) -> Result<u64> {
        let name = perm::check_name(name)?;
        self.dir_for_change(st, ctx, parent)?;
        if perm::is_dot(name) || self.dir_lookup(st, parent, name)?.is_some() {
            return Err(Errno::EEXIST.into());
        }
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        if is_dir && self.iget(st, parent)?.effnlink >= LINK_MAX {
            return Err(Errno::EMLINK.into());
        }
        let name_blocks = self.dir_add_blocks(st, parent, name)?;
        let (ino, body) = self.new_inode(
            st,
            ctx,
            NewInode {
                parent,
                mode,
                umask,
                rdev,
                link_target,
                name_blocks,
            },
        )?;
        // Now the name. (If anything fails from here on, the operation's undo scope takes
        // back the inode, its block and the parent's link count.)
        self.touch_dir(st, parent)?;
        let mode = self.iget(st, ino)?.d.mode;
        self.dir_add(st, parent, name, ino, dtype_of(mode), true, body.as_ref())?;
        if is_dir {
            self.dir_index(st, ino)?;
        }
        Ok(ino)
    }

    /// A new inode for `make_node` or a rename's whiteout, not yet named: allocated,
    /// initialized (a directory's or slow symlink's first block, inherited ACLs) and
    /// encoded — rule 1: on disk before any entry names it. Returns its number and, for a
    /// directory, its first block (the entry's `mkdir_body`).
    fn new_inode(&self, st: &mut State, ctx: &Ctx, n: NewInode) -> Result<(u64, Option<BufRef>)> {
        let (parent, mode, umask, rdev) = (n.parent, n.mode, n.umask, n.rdev);
        let (link_target, name_blocks) = (n.link_target, n.name_blocks);
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        let pd = self.iget(st, parent)?.d.clone();
        let (mode, inherited) = self.inherit(st, parent, mode, umask)?;
        let (mode, gid) = perm::new_inode_owner(ctx, owner(&pd), mode);
        // Preflight: the inode, the first block of a directory or slow symlink, an xattr
        // block for inherited ACLs, and what the name needs if the parent must grow, or
        // ENOSPC before anything changes.
        let slow_link = link_target.is_some_and(|t| t.len() > FAST_SYMLINK_MAX);
        let blocks =
            u64::from(is_dir || slow_link) + u64::from(!inherited.is_empty()) + name_blocks;
        st.alloc.reserve(1, blocks)?;
        let (ino, old_generation, cg) = st.alloc.alloc_inode(&self.vol, parent, is_dir)?;
        let f = InoMapDep {
            ino,
            is_dir,
            bitmap: &cg.bitmap,
            desc: &cg.desc,
        };
        self.fact(st, |s, tx| s.setup_inomapdep(tx, &f))?;
        let now = now_ns();
        let mut d = DiskInode {
            mode,
            nlink: if is_dir { 2 } else { 1 },
            uid: ctx.uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            generation: old_generation.wrapping_add(1),
            rdev,
            ..Default::default()
        };
        if let Some(t) = link_target {
            d.size = t.len() as u64;
            if t.len() <= FAST_SYMLINK_MAX {
                d.fast_link = Some(t.to_vec());
            }
        }
        self.iinsert(st, ino, d);
        let mut body = None;
        if is_dir || slow_link {
            // A new directory's ".." is a reference to the parent: its raised link count
            // goes to disk with the new directory's first block (MKDIR_PARENT), before the
            // entry makes it count. The first block is initialized before the inode points
            // to it (rule 1).
            if is_dir {
                self.raise_link(st, parent, LinkWhy::DotDot)?;
            }
            let (kind, init): (BlockKind, crate::bmap::Init) = match link_target {
                Some(t) => (BlockKind::Symlink, &move |b: &mut [u8]| {
                    b[..t.len()].copy_from_slice(t)
                }),
                None => (BlockKind::Directory, &move |b: &mut [u8]| {
                    dir::init_first(b, ino, parent)
                }),
            };
            let (_, _, b) = self.bmap_alloc(st, ino, 0, kind, Some(init))?;
            if is_dir {
                self.iget(st, ino)?.d.size = self.vol.geo.block_size as u64;
                body = b;
            }
        }
        // The inode's first encoding (rule 1: on disk before any entry names it).
        self.store(st, ino)?;
        if !inherited.is_empty() {
            // Its inherited ACLs, still before the name: nothing names the inode until its
            // encoding with the xattr block's pointer is on disk.
            self.write_xattrs(st, ino, &inherited, XattrWrite::InPlace)?;
        }
        Ok((ino, body))
    }

    fn entry_attr(&self, st: &mut State, ino: u64) -> Result<Attr> {
        self.iget(st, ino)?.nlookup += 1;
        self.attr(st, ino)
    }

    /// Frees an inode with no links (neither in the namespace nor on disk), no open
    /// handles and no kernel references: one encoding clears the pointers and the inode
    /// (rule 2), and the strategy releases the blocks and the inode when its order allows.
    /// An inode still referenced waits in the orphan set.
    pub(crate) fn reclaim(&self, st: &mut State, ino: u64) -> Result<()> {
        let Some(ic) = st.inodes.loaded(ino) else {
            return Ok(());
        };
        if ic.effnlink > 0 {
            return Ok(());
        }
        if ic.nopen > 0 || ic.nlookup > 0 || ic.d.nlink > 0 || ic.writing > 0 {
            // Referenced, or its on-disk count still waits for the strategy (a deferred
            // drop), or a write is between its passes: freed when the last of these goes.
            st.inodes.add_orphan(ino);
            return Ok(());
        }
        st.inodes.remove_orphan(ino);
        self.truncate_blocks(st, ino, 0, true)?;
        st.inodes.remove(ino);
        st.dirs.remove(ino);
        Ok(())
    }

    /// Zeroes the bytes of `ino`'s block holding offset `size` from there to its end: a
    /// growth's new bytes must read as zero, and so must a shrink's dropped ones if the
    /// file grows again. `shrink`: the strategy is told first (`before_tail_zeroed`).
    fn zero_tail(&self, st: &mut State, ino: u64, size: u64, shrink: bool) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        if size.is_multiple_of(bs) {
            return Ok(());
        }
        let p = self.bmap(st, ino, size / bs)?;
        if p != 0 {
            let b = self.bread(p, kind::DATA)?;
            if shrink {
                self.fact(st, |s, tx| s.before_tail_zeroed(tx, ino, &b))?;
            }
            let at = (size % bs) as usize;
            b.write_range(at, bs as usize - at).fill(0);
            self.vol.cache.mark_dirty(&b);
        }
        Ok(())
    }

    fn set_size(&self, st: &mut State, ino: u64, size: u64) -> Result<()> {
        if size > self.max_file_size {
            return Err(Errno::EFBIG.into());
        }
        let old = self.iget(st, ino)?.d.size;
        let bs = self.vol.geo.block_size as u64;
        if size < old {
            self.zero_tail(st, ino, size, true)?;
            self.iget(st, ino)?.d.size = size;
            self.truncate_blocks(st, ino, size.div_ceil(bs), false)?;
        } else {
            // Growing: bytes past the old end in its last block must read as zero.
            self.zero_tail(st, ino, old, false)?;
            self.iget(st, ino)?.d.size = size;
        }
        Ok(())
    }

    fn handle(&self, st: &State, fh: Fh) -> Result<(u64, i32)> {
        st.handles.get(fh)
    }

    fn new_handle(&self, st: &mut State, ino: u64, flags: i32) -> Fh {
        let fh = st.handles.open(ino, flags);
        if let Some(ic) = st.inodes.loaded_mut(ino) {
            ic.nopen += 1;
        }
        fh
    }

    pub(crate) fn read_xattrs(&self, ino: u64, d: &DiskInode) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if d.xattr == 0 {
            return Ok(Vec::new());
        }
        Ok(self.xattr_chain(ino, d.xattr)?.attrs)
    }

    /// Inode `ino`'s attribute list and blocks, from head block `head` (a single block or
    /// a chain, `xattr::read_chain`).
    pub(crate) fn xattr_chain(&self, ino: u64, head: u64) -> Result<xattr::Chain> {
        let mut io_err = None;
        let r = xattr::read_chain(ino, head, |blk| {
            if !self.vol.geo.is_data_block(blk) {
                return Err(FormatError(format!(
                    "inode {ino}: extended-attribute block {blk} out of range"
                )));
            }
            match self.bread(blk, kind::XATTR) {
                Ok(b) => Ok(b.read().to_vec()),
                Err(e) => {
                    let msg = e.to_string();
                    io_err = Some(e);
                    Err(FormatError(msg))
                }
            }
        });
        match (r, io_err) {
            (Ok(c), _) => Ok(c),
            (Err(_), Some(e)) => Err(e),
            (Err(e), None) => Err(corrupt_err(format!("inode {ino}: {}", e.0))),
        }
    }

    /// Writes inode `ino`'s extended attributes (all of them, `attrs`), with its change time,
    /// as one change of the call in progress; `how` says whether the block is rewritten in
    /// place or replaced together with the mode the in-core inode already carries.
    ///
    /// A list that fits one block keeps the single-block form (rewritten in place, as
    /// always). One that needs a chain, or was one, is written whole to new blocks and the
    /// inode's pointer switched to their head (one inode write, so a crash finds the old
    /// list or the new one, never a mix); the old blocks are freed after the pointer
    /// (rule 2), and the strategy sees every new block as the pointer's (rule 1).
    pub(crate) fn write_xattrs(
        &self,
        st: &mut State,
        ino: u64,
        attrs: &[(Vec<u8>, Vec<u8>)],
        how: XattrWrite,
    ) -> Result<()> {
        let old = self.iget(st, ino)?.d.xattr;
        // The in-core ACL is read again from what this writes.
        self.iget(st, ino)?.acl = None;
        let acl_mode = |blk: u64| match how {
            XattrWrite::InPlace => None,
            XattrWrite::WithMode { old_mode } => Some(AclMode {
                old_mode,
                xattr_blk: blk,
            }),
        };
        let old_blocks = if old == 0 {
            Vec::new()
        } else {
            self.xattr_chain(ino, old)?.blocks
        };
        if attrs.is_empty() {
            let ic = self.iget(st, ino)?;
            ic.d.ctime = now_ns();
            if old != 0 {
                // The pointer goes in the same encoding as the mode: one step.
                ic.d.xattr = 0;
                ic.d.blocks -= old_blocks.len() as u64;
                let ib = self.store(st, ino)?;
                return self.free_xattr_blocks(st, ino, &ib, &old_blocks);
            }
            return self.store_attrs(st, ino, &[], None).map(drop);
        }
        let bs = self.vol.geo.bs();
        let n = xattr::blocks_needed(attrs, bs).ok_or(Errno::ENOSPC)?;
        if n > 1 || old_blocks.len() > 1 {
            return self.write_xattr_chain(st, ino, attrs, n, &old_blocks, acl_mode);
        }
        let replace = old != 0 && how != XattrWrite::InPlace;
        let b = if old == 0 || replace {
            // A new block: its bit, then its contents, then the pointer to it (rule 1).
            st.alloc.reserve(0, 1)?;
            let blk = self.alloc_block_for(st, 0, ino)?;
            let b = self.bnew(blk, kind::XATTR);
            xattr::encode(attrs, &mut b.write());
            self.vol.cache.mark_dirty(&b);
            let ic = self.iget(st, ino)?;
            ic.d.xattr = blk;
            if old == 0 {
                ic.d.blocks += 1;
            }
            let f = AllocDirect {
                ino,
                ptr: InodePtr::Xattr,
                lbn: 0,
                new_blk: blk,
                old_blk: old,
                new_size: self.vol.geo.block_size,
                old_size: if old == 0 { 0 } else { self.vol.geo.block_size },
                kind: BlockKind::Xattr,
                new_buf: Some(&b),
                chain: &[],
            };
            self.fact(st, |s, tx| s.setup_allocdirect(tx, &f))?;
            b
        } else {
            let b = self.bread(old, kind::XATTR)?;
            xattr::encode(attrs, &mut b.write());
            self.vol.cache.mark_dirty(&b);
            b
        };
        self.iget(st, ino)?.d.ctime = now_ns();
        let ib = self.store_attrs(st, ino, std::slice::from_ref(&b), acl_mode(b.blkno()))?;
        if replace {
            self.free_xattr_blocks(st, ino, &ib, &old_blocks)?;
        }
        Ok(())
    }

    /// `write_xattrs` of a list in `n` blocks where a chain is involved (the new list's or
    /// the old one's, `old_blocks`): all of it to new blocks, then the pointer.
    fn write_xattr_chain(
        &self,
        st: &mut State,
        ino: u64,
        attrs: &[(Vec<u8>, Vec<u8>)],
        n: usize,
        old_blocks: &[u64],
        acl_mode: impl Fn(u64) -> Option<AclMode>,
    ) -> Result<()> {
        if n > 1 {
            self.want_xattr_chain(st)?;
        }
        st.alloc.reserve(0, n as u64)?;
        let mut blks = Vec::with_capacity(n);
        for _ in 0..n {
            let pref = blks.last().copied().unwrap_or(0);
            blks.push(self.alloc_block_for(st, pref, ino)?);
        }
        let bs = self.vol.geo.bs();
        let images = xattr::encode_chain(attrs, ino, &blks, bs).ok_or(Errno::ENOSPC)?;
        let bufs: Vec<BufRef> = blks
            .iter()
            .zip(images)
            .map(|(&blk, image)| {
                let b = self.bnew(blk, kind::XATTR);
                b.write().copy_from_slice(&image);
                self.vol.cache.mark_dirty(&b);
                b
            })
            .collect();
        let old = old_blocks.first().copied().unwrap_or(0);
        let ic = self.iget(st, ino)?;
        ic.d.xattr = blks[0];
        ic.d.blocks = ic.d.blocks + n as u64 - old_blocks.len() as u64;
        let f = AllocDirect {
            ino,
            ptr: InodePtr::Xattr,
            lbn: 0,
            new_blk: blks[0],
            old_blk: old,
            new_size: self.vol.geo.block_size * n as u32,
            old_size: self.vol.geo.block_size * old_blocks.len() as u32,
            kind: BlockKind::Xattr,
            new_buf: Some(&bufs[0]),
            chain: &bufs[1..],
        };
        self.fact(st, |s, tx| s.setup_allocdirect(tx, &f))?;
        self.iget(st, ino)?.d.ctime = now_ns();
        let ib = self.store_attrs(st, ino, &bufs, acl_mode(blks[0]))?;
        if !old_blocks.is_empty() {
            self.free_xattr_blocks(st, ino, &ib, old_blocks)?;
        }
        Ok(())
    }

    /// The image may hold attribute chains from now on: an image made before them gets
    /// `FEATURE_INCOMPAT_XATTR_CHAIN` here, written durably before any chain can be on
    /// disk (a cairn that does not know chains then refuses the image instead of reading a
    /// chain's head as damage).
    fn want_xattr_chain(&self, st: &mut State) -> Result<()> {
        use crate::format::superblock::FEATURE_INCOMPAT_XATTR_CHAIN as CHAIN;
        if st.sb.feature_incompat & CHAIN != 0 {
            return Ok(());
        }
        if self.read_only {
            return Err(Errno::EROFS.into());
        }
        st.sb.feature_incompat |= CHAIN;
        let b = self.bread(0, kind::SUPERBLOCK)?;
        st.sb.encode(&mut b.write());
        self.vol.cache.mark_dirty(&b);
        log::info!("extended-attribute chains enabled on this image (feature_incompat {CHAIN:#x})");
        self.strategy.write_superblock(self, &b)
    }

    /// Inode `ino`, encoded in `ib`, no longer points to xattr blocks `old`: freed once no
    /// pointer to them can be on disk (rule 2).
    fn free_xattr_blocks(&self, st: &mut State, ino: u64, ib: &BufRef, old: &[u64]) -> Result<()> {
        let f = FreeBlocks {
            ino,
            inode_buf: ib,
            from_lbn: 0,
            freed: old,
            holders: &[],
            whole_file: false,
        };
        self.fact(st, |s, tx| s.setup_freeblocks(tx, &f))
    }

    /// Is `anc` an ancestor of (or equal to) directory `dino`? Walks `..` up to the root.
    fn is_ancestor(&self, st: &mut State, anc: u64, mut dino: u64) -> Result<bool> {
        for _ in 0..100_000 {
            if dino == anc {
                return Ok(true);
            }
            if dino == ROOT_INO {
                return Ok(false);
            }
            dino = self.dir_index(st, dino)?.dotdot.ino;
        }
        Err(corrupt_err("directory tree has a cycle"))
    }

    #[allow(clippy::too_many_arguments)]
    fn do_rename(
        &self,
        st: &mut State,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        np: u64,
        nname: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        let name = perm::check_name(name)?;
        let nname = perm::check_name(nname)?;
        if perm::is_dot(name) || perm::is_dot(nname) {
            return Err(Errno::EINVAL.into());
        }
        let whiteout = perm::rename_flags(ctx, flags)?;
        // vfs_rename's checks: the source may be removed from its directory; the target,
        // if any, from its own, else a name may be added there.
        self.dir_for_remove(st, ctx, parent)?;
        self.dir_for_remove(st, ctx, np)?;
        let src = self.dir_lookup(st, parent, name)?.ok_or(Errno::ENOENT)?;
        let sd = self.iget(st, src.ino)?.d.clone();
        self.may_delete(st, ctx, parent, &sd)?;
        let dst = self.dir_lookup(st, np, nname)?;
        let dd = match dst {
            Some(s) => Some(self.iget(st, s.ino)?.d.clone()),
            None => None,
        };
        match &dd {
            Some(dd) => self.may_delete(st, ctx, np, dd)?,
            None => {
                self.may(st, ctx, np, Access::WX)?;
            }
        }
        if flags.exchange {
            let (Some(dst), Some(dd)) = (dst, dd) else {
                return Err(Errno::ENOENT.into());
            };
            return self.do_exchange(st, ctx, parent, name, src, &sd, np, nname, dst, &dd);
        }
        if let Some(dslot) = dst {
            if flags.noreplace {
                return Err(Errno::EEXIST.into());
            }
            if dslot.ino == src.ino {
                return Ok(());
            }
        }
        let src_dir = sd.is_dir();
        if src_dir {
            if np != parent && self.is_ancestor(st, src.ino, np)? {
                return Err(Errno::EINVAL.into());
            }
            if np != parent {
                // Moving a directory rewrites its "..": needs write access to it.
                self.may(st, ctx, src.ino, Access::W)?;
            }
        }
        if let (Some(dslot), Some(dd)) = (dst, &dd) {
            if src_dir && !dd.is_dir() {
                return Err(Errno::ENOTDIR.into());
            }
            if !src_dir && dd.is_dir() {
                return Err(Errno::EISDIR.into());
            }
            if dd.is_dir() {
                if !self.dir_index(st, dslot.ino)?.is_empty() {
                    return Err(Errno::ENOTEMPTY.into());
                }
                if self.is_ancestor(st, dslot.ino, parent)? {
                    return Err(Errno::ENOTEMPTY.into());
                }
            }
        } else if src_dir && np != parent && self.iget(st, np)?.effnlink >= LINK_MAX {
            return Err(Errno::EMLINK.into());
        }
        let name_blocks = match dst {
            None => self.dir_add_blocks(st, np, nname)?,
            Some(_) => 0,
        };
        st.alloc
            .reserve(u64::from(whiteout.is_some()), name_blocks)?;
        // 0. RENAME_WHITEOUT: the whiteout's inode, owned by the caller, not yet named
        //    (rule 1: on disk before the old name names it, as mknod's is).
        let wh = match whiteout {
            Some(m) => {
                let n = NewInode {
                    parent,
                    mode: m.mode,
                    umask: 0,
                    rdev: m.rdev,
                    link_target: None,
                    name_blocks,
                };
                Some(self.new_inode(st, ctx, n)?.0)
            }
            None => None,
        };
        let now = now_ns();
        let moves_dir = src_dir && np != parent;
        // 1. Link count up before the second name exists (link count >= references).
        self.iget(st, src.ino)?.d.ctime = now;
        self.raise_link(st, src.ino, LinkWhy::RenameHold)?;
        // 2. The new name (rule 3: before the old one goes). A moved directory's ".." will
        //    name the new parent: its count goes up with the new name.
        if moves_dir {
            self.raise_link(st, np, LinkWhy::DotDot)?;
        }
        self.touch_dir(st, np)?;
        let replaced = match dst {
            Some(_) => Some(self.dir_repoint(st, np, nname, src.ino, src.dtype)?),
            None => {
                self.dir_add(st, np, nname, src.ino, src.dtype, false, None)?;
                None
            }
        };
        // 3. A moved directory's ".." names the new parent, then the old name goes. A
        //    directory rename is not atomic without a log (001 §3.4): until this step the
        //    directory has two names. With ".." rewritten first, every crash state keeps
        //    one name that agrees with "..", which fsck resolves as a leak (keeping that
        //    name); removing the old name first would leave ".." naming a parent that no
        //    longer holds the directory.
        let dotdot = if moves_dir {
            Some(self.dir_repoint(st, src.ino, b"..", np, libc::DT_DIR)?)
        } else {
            None
        };
        //    With RENAME_WHITEOUT the old name is not removed but re-pointed to the
        //    whiteout: one entry write, after the new name (rule 3), so every state shows
        //    the old name naming the moved inode or the whiteout, never nothing.
        self.touch_dir(st, parent)?;
        let removed = match wh {
            Some(wh) => self.dir_whiteout(st, parent, name, wh)?,
            None => self.dir_remove(st, parent, name, false)?.1,
        };
        // 4. Link counts down: the moved inode back to its count, a moved directory's old
        //    parent loses the ".." reference, a replaced inode loses its name (a replaced
        //    directory its "." too, and the new parent its "..").
        self.drop_link(st, src.ino, 1, removed)?;
        if let Some(apply) = dotdot {
            self.drop_link(st, parent, 1, apply)?;
        }
        if let (Some(dslot), Some(dd), Some(apply)) = (dst, &dd, replaced) {
            self.iget(st, dslot.ino)?.d.ctime = now;
            if dd.is_dir() {
                let n = self.iget(st, dslot.ino)?.effnlink;
                self.drop_link(st, dslot.ino, n, apply)?;
                self.drop_link(st, np, 1, apply)?;
            } else {
                self.drop_link(st, dslot.ino, 1, apply)?;
            }
            self.reclaim(st, dslot.ino)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn do_exchange(
        &self,
        st: &mut State,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        src: cairn_dir::Slot,
        sd: &DiskInode,
        np: u64,
        nname: &[u8],
        dst: cairn_dir::Slot,
        dd: &DiskInode,
    ) -> Result<()> {
        if src.ino == dst.ino {
            return Ok(());
        }
        if parent != np {
            if sd.is_dir() && self.is_ancestor(st, src.ino, np)?
                || dd.is_dir() && self.is_ancestor(st, dst.ino, parent)?
            {
                return Err(Errno::EINVAL.into());
            }
            for (ino, d) in [(src.ino, sd), (dst.ino, dd)] {
                if d.is_dir() {
                    self.may(st, ctx, ino, Access::W)?;
                }
            }
        }
        let now = now_ns();
        // Both names keep existing throughout; each entry is re-pointed in place (the
        // strategy sees an exchange as one call: sync writes it as one step).
        let _ = self.dir_repoint(st, np, nname, src.ino, src.dtype)?;
        let _ = self.dir_repoint(st, parent, name, dst.ino, dst.dtype)?;
        // A directory that moves to the other parent: the new parent's count goes up for
        // its "..", the ".." changes, the old parent's count goes down.
        if parent != np {
            for (moved, is_dir, from, to) in [
                (src.ino, sd.is_dir(), parent, np),
                (dst.ino, dd.is_dir(), np, parent),
            ] {
                if is_dir {
                    self.raise_link(st, to, LinkWhy::DotDot)?;
                    let apply = self.dir_repoint(st, moved, b"..", to, libc::DT_DIR)?;
                    self.drop_link(st, from, 1, apply)?;
                }
            }
        }
        for ino in [src.ino, dst.ino] {
            self.iget(st, ino)?.d.ctime = now;
            self.store(st, ino)?;
        }
        self.touch_dir(st, parent)?;
        if np != parent {
            self.touch_dir(st, np)?;
        }
        Ok(())
    }

    /// A read's first pass: checks it, sets the reply's length in `buf` and says where
    /// each byte comes from (`ReadPiece`), in order; updates atime (the mount's policy).
    /// Does no device I/O for file data: the pieces that need it are read by `fill_read`,
    /// which a `Concurrent` mode runs without the engine's lock. Cached blocks are taken by
    /// reference here, so a buffer evicted meanwhile is still read from memory (it may be
    /// newer than the device).
    ///
    /// `buf` keeps its old bytes: every byte of the reply is written by `fill_read` (a
    /// hole's as zeros) before the call returns `Ok`, so only its growth is zeroed — the
    /// zeroing of a 1 MiB buffer per request was a measurable share of a cold sequential
    /// read's CPU. Nothing reaches the caller from a failed read (the adapter answers with
    /// the error alone).
    fn read_plan(
        &self,
        st: &mut State,
        ino: u64,
        offset: u64,
        size: u32,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<ReadPiece>> {
        let d = self.iget(st, ino)?.d.clone();
        if d.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        if offset >= d.size {
            buf.clear();
            return Ok(Vec::new());
        }
        let end = (offset + size as u64).min(d.size);
        let bs = self.vol.geo.block_size as u64;
        buf.resize((end - offset) as usize, 0);
        let mut pieces = Vec::new();
        let mut pos = offset;
        while pos < end {
            let lbn = pos / bs;
            let in_blk = (pos % bs) as usize;
            let p = self.bmap(st, ino, lbn)?;
            // Gather a run of device-contiguous, uncached blocks: one device read.
            let cached = if p != 0 {
                self.vol.cache.lookup(p)
            } else {
                None
            };
            let mut run = 1u64;
            if p != 0 && cached.is_none() {
                while (lbn + run) * bs < end && run < 256 {
                    let q = self.bmap(st, ino, lbn + run)?;
                    if q != p + run || self.vol.cache.lookup(q).is_some() {
                        break;
                    }
                    run += 1;
                }
            }
            let chunk_end = ((lbn + run) * bs).min(end);
            let at = (pos - offset) as usize;
            let len = (chunk_end - pos) as usize;
            pieces.push(match (p, cached) {
                (0, _) => ReadPiece::Zeros { at, len },
                (_, Some(b)) => ReadPiece::Cached { at, len, in_blk, b },
                (_, None) => ReadPiece::Device {
                    at,
                    len,
                    in_blk,
                    blk: p,
                    blocks: run,
                },
            });
            pos = chunk_end;
        }
        // The mount's atime option (relatime by default).
        let now = now_ns();
        let policy = *self.atime.lock();
        let ic = self.iget(st, ino)?;
        let (a, m, c) = (ic.d.atime as i128, ic.d.mtime as i128, ic.d.ctime as i128);
        if policy.updates(a, m, c, now as i128) && ic.d.flags & cairn_vfs::fileattr::NOATIME == 0 {
            ic.d.atime = now;
            self.store(st, ino)?;
        }
        Ok(pieces)
    }

    /// A read's second pass: fills `buf` (sized by `read_plan`) from its pieces. Needs no
    /// engine lock; the caller holds the file's lock (no write or truncate of it changes a
    /// block meanwhile) and, without the engine's lock, a hold on the inode (nothing frees
    /// its blocks: see `InCore::writing`), so every block named is still the file's and
    /// no newer copy of an uncached one can appear in the cache (only the file's own
    /// writes make one).
    fn fill_read(&self, pieces: &[ReadPiece], buf: &mut [u8]) -> Result<()> {
        let bs = self.vol.geo.bs();
        for pc in pieces {
            match pc {
                ReadPiece::Zeros { at, len } => buf[*at..at + len].fill(0),
                ReadPiece::Cached { at, len, in_blk, b } => {
                    buf[*at..at + len].copy_from_slice(&b.read()[*in_blk..in_blk + len]);
                }
                ReadPiece::Device {
                    at,
                    len,
                    in_blk,
                    blk,
                    blocks,
                } => {
                    let dst = &mut buf[*at..at + len];
                    if *in_blk == 0 && *len == *blocks as usize * bs {
                        self.dev.read_blocks(*blk, dst)?;
                    } else if *blocks > 1 {
                        let mut tmp = vec![0u8; *blocks as usize * bs];
                        self.dev.read_blocks(*blk, &mut tmp)?;
                        dst.copy_from_slice(&tmp[*in_blk..in_blk + len]);
                    } else {
                        // Part of one block: cached, so that small reads of it in a row
                        // cost one device read.
                        let b = self.bread(*blk, kind::DATA)?;
                        dst.copy_from_slice(&b.read()[*in_blk..in_blk + len]);
                    }
                }
            }
        }
        Ok(())
    }

    /// A write's first pass: maps every block of the request (allocating) and reads the
    /// blocks that keep part of their old contents. Everything that can fail except a
    /// stream's device writes happens here, and the undo takes all of it back; nothing of
    /// the file's contents changes. Ends at the call's last point of failure: the steps it
    /// wrote in `sync` mode (new indirect blocks) are made durable now (`commit_point`)
    /// rather than at the end of the call, so that nothing after it can fail.
    fn write_map(
        &self,
        st: &mut State,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<WritePlan>> {
        let d = self.iget(st, ino)?.d.clone();
        if d.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        if data.is_empty() {
            return Ok(None);
        }
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > self.max_file_size {
            return Err(Errno::EFBIG.into());
        }
        if offset > d.size {
            self.zero_tail(st, ino, d.size, false)?;
        }
        let bs = self.vol.geo.block_size as u64;
        // Streaming writes (a request of at least STREAM_BYTES) bypass the buffer cache for
        // whole blocks nobody has cached: the request's bytes go to the device in one write
        // per run of contiguous blocks, with no copy (FFS's write-behind clustering). Small
        // writes stay delayed in the cache, so a short-lived file never reaches the device,
        // the delayed-write advantage the papers measure. Data is never ordered against
        // metadata in these modes, and a block written here reaches the device before any
        // pointer to it can.
        let streaming = data.len() as u64 >= STREAM_BYTES;
        // Held until the inode is written at the end, so that write cannot need a device
        // read once data has gone straight to the device (see pass 2).
        let (iblk, _) = self.vol.geo.inode_location(ino);
        let inode_block = match self.vol.cache.lookup(iblk) {
            Some(b) => b,
            None => self.bread(iblk, kind::INODE)?,
        };
        let mut pieces: Vec<Piece> = Vec::new();
        let mut grown = Vec::new();
        let mut pos = offset;
        while pos < end {
            let lbn = pos / bs;
            let in_blk = (pos % bs) as usize;
            let n = ((bs as usize) - in_blk).min((end - pos) as usize);
            // Preflight: a block whose data and indirect blocks cannot all be allocated is
            // not started (a short write, or ENOSPC for the first), so no half-built
            // pointer path is left behind. Only near a full file system is it worth a walk.
            if st.alloc.usable_blocks() < crate::bmap::MAX_MAP_BLOCKS
                && st.alloc.usable_blocks() < self.blocks_to_map(st, ino, lbn)?
            {
                if pos > offset {
                    break;
                }
                return Err(Errno::ENOSPC.into());
            }
            let mapped = self.bmap_alloc_tracked(st, ino, lbn, BlockKind::Data, None, &mut grown);
            let (p, fresh, _) = match mapped {
                Ok(v) => v,
                Err(e) if pos > offset && e.errno() == Errno::ENOSPC => break,
                Err(e) => return Err(e),
            };
            let whole = n == bs as usize;
            let target = match self.vol.cache.lookup(p) {
                // A new block's cached buffer (if any) is zeroed in place by `bnew`.
                Some(_) if fresh => Target::New,
                Some(b) => Target::Cached(b),
                None if streaming && whole => Target::Direct,
                None if fresh || whole => Target::New,
                None => Target::Cached(self.bread(p, kind::DATA)?),
            };
            pieces.push(Piece {
                lbn,
                p,
                fresh,
                in_blk,
                n,
                doff: (pos - offset) as usize,
                target,
            });
            pos += n as u64;
        }
        // The last point of failure (see above): pass 2 changes file contents without
        // before-images (a stream's direct writes replace bytes the undo has no copy of;
        // cache copies are not saved, to keep overwrites cheap), and the inode update at
        // the end uses the held inode block.
        let concurrent = self.strategy.io_model() == IoModel::Concurrent;
        if concurrent {
            // This pass is a call of its own: at its end the in-core inode must equal its
            // buffer (the invariant `undo` keeps), with the pointers it set.
            self.store(st, ino)?;
        }
        self.fact(st, |s, tx| s.commit_point(tx))?;
        if concurrent {
            // Held until the last pass: nothing frees the inode or its blocks meanwhile
            // (`reclaim`), nor drops it from core (`forget`). Cannot fail: it is in core.
            self.iget(st, ino)?.writing += 1;
        }
        Ok(Some(WritePlan {
            offset,
            pieces,
            grown,
            _inode_block: inode_block,
        }))
    }

    /// A write's second pass, device half: the runs of direct blocks, in request order, each
    /// one device write through the strategy (`write_stream`). Stops at the first run that
    /// fails: the bytes before it reached the file, the rest did not. Takes no engine lock
    /// (a `Concurrent` mode calls it without one; the file's own lock keeps other calls on
    /// it out).
    fn write_streams(&self, ino: u64, plan: &WritePlan, data: &[u8]) -> Option<(FsError, u64)> {
        let bs = self.vol.geo.bs();
        let mut run: Option<(u64, usize, usize)> = None; // (first block, data offset, blocks)
        let flush = |(blk, off, k): (u64, usize, usize)| {
            self.strategy
                .write_stream(&self.io, ino, blk, &data[off..off + k * bs])
                .map_err(|e| (e, plan.offset + off as u64))
        };
        for pc in &plan.pieces {
            let Target::Direct = pc.target else {
                continue;
            };
            match &mut run {
                // A run is contiguous on the device and in the request.
                Some((b0, off0, k))
                    if *b0 + *k as u64 == pc.p
                        && *off0 + *k * bs == pc.doff
                        && *k < STREAM_RUN_BLOCKS =>
                {
                    *k += 1;
                }
                _ => {
                    if let Some(r) = run.replace((pc.p, pc.doff, 1))
                        && let Err(f) = flush(r)
                    {
                        return Some(f);
                    }
                }
            }
        }
        run.and_then(|r| flush(r).err())
    }

    /// A write's second pass, memory half, and its end: copies the cached pieces before
    /// the failure point into the cache (cannot fail: after the last point of failure, no
    /// before-image needed), then the size and times. If a run's device write failed after
    /// earlier bytes reached the file, the call is a short write of those bytes (write(2) on
    /// Linux does the same); the blocks this request allocated past them stay allocated,
    /// zeroed, past the end of the file (as after fallocate with FALLOC_FL_KEEP_SIZE). If
    /// nothing reached the file, the error fails the call: inside the call's undo scope
    /// (`Serialized`) the undo takes everything back; after it (`Concurrent`, `unalloc`),
    /// the blocks the first pass allocated are freed again, so a failed write still changes
    /// nothing.
    fn write_finish(
        &self,
        st: &mut State,
        ino: u64,
        plan: &WritePlan,
        data: &[u8],
        failed: Option<(FsError, u64)>,
        unalloc: bool,
    ) -> Result<Result<u32>> {
        let offset = plan.offset;
        let bs = self.vol.geo.block_size as u64;
        let upto = failed.as_ref().map_or(u64::MAX, |(_, at)| *at);
        if let Some((e, at)) = failed {
            if at == offset {
                if unalloc {
                    self.unalloc_write(st, ino, plan)?;
                    return Ok(Err(e));
                }
                return Err(e);
            }
            log::warn!("write to inode {ino} cut short at byte {at}: {e}");
        }
        let mut done = offset;
        for pc in &plan.pieces {
            let pc_end = offset + (pc.doff + pc.n) as u64;
            if pc_end > upto {
                break;
            }
            match &pc.target {
                Target::Direct => {}
                Target::Cached(b) => {
                    b.set_kind(kind::DATA);
                    b.write_untracked()[pc.in_blk..pc.in_blk + pc.n]
                        .copy_from_slice(&data[pc.doff..pc.doff + pc.n]);
                    self.vol.cache.mark_dirty(b);
                }
                Target::New => {
                    let b = self.bnew(pc.p, kind::DATA);
                    b.write_untracked()[pc.in_blk..pc.in_blk + pc.n]
                        .copy_from_slice(&data[pc.doff..pc.doff + pc.n]);
                    self.vol.cache.mark_dirty(&b);
                }
            }
            done = pc_end;
        }
        if upto != u64::MAX {
            // Blocks this request allocated from the failed run on hold stale bytes (or
            // part of the run): zero them, in memory, which cannot fail.
            for pc in plan
                .pieces
                .iter()
                .filter(|pc| pc.fresh && pc.lbn * bs >= upto)
            {
                let b = self.bnew(pc.p, kind::DATA);
                self.vol.cache.mark_dirty(&b);
            }
        }
        let now = now_ns();
        let ic = self.iget(st, ino)?;
        ic.d.size = ic.d.size.max(done);
        ic.d.mtime = now;
        ic.d.ctime = now;
        self.store(st, ino)?;
        Ok(Ok((done - offset) as u32))
    }

    /// Drops the hold a write's first pass (or a read's, `Ffs::read`) took on inode `ino`
    /// (`InCore::writing`) once its last pass is done, whatever its outcome; then does what a `forget` or `release`
    /// skipped meanwhile: frees the inode if nothing else refers to it and it has no name
    /// left, drops it from core if nothing refers to it.
    fn end_write(&self, ino: u64) {
        let r = self.locked_op(None, |st| {
            let Some(ic) = st.inodes.loaded_mut(ino) else {
                return Ok(());
            };
            ic.writing = ic.writing.saturating_sub(1);
            if ic.writing > 0 || ic.nopen > 0 || ic.nlookup > 0 {
                return Ok(());
            }
            if ic.effnlink == 0 {
                return self.in_op(st, OpKind::Reclaim, |st| self.reclaim(st, ino));
            }
            if ic.may_leave_core() {
                st.inodes.remove(ino);
            }
            Ok(())
        });
        if let Err(e) = r {
            log::error!("ending a write of inode {ino}: {e}");
        }
    }

    /// Takes back the blocks a write's first pass allocated, after that pass was committed
    /// and nothing reached the file (a `Concurrent` mode's failed stream): the new data
    /// blocks' pointers are cleared, then the indirect blocks the pass added (deepest
    /// first: they point to nothing else), and the strategy releases them as for any free.
    fn unalloc_write(&self, st: &mut State, ino: u64, plan: &WritePlan) -> Result<()> {
        let mut freed = Vec::new();
        let mut holders: Vec<BufRef> = Vec::new();
        let mut hold = |h: BufRef| {
            if !holders.iter().any(|x| x.blkno() == h.blkno()) {
                holders.push(h);
            }
        };
        for pc in plan.pieces.iter().filter(|pc| pc.fresh) {
            if let Some((old, holder)) = self.bunmap(st, ino, pc.lbn)? {
                freed.push(old);
                if let Some(h) = holder {
                    hold(h);
                }
            }
        }
        for g in plan.grown.iter().rev() {
            match g.holder {
                None => self.iget(st, ino)?.d.indirect[g.slot] = 0,
                Some(h) => {
                    let b = self.bread(h, kind::INDIRECT)?;
                    put_u64(&mut b.write_range(g.slot * 8, 8), 0, 0);
                    self.vol.cache.mark_dirty(&b);
                    hold(b);
                }
            }
            freed.push(g.blk);
        }
        holders.retain(|h| !freed.contains(&h.blkno()));
        let ic = self.iget(st, ino)?;
        ic.d.blocks = ic.d.blocks.saturating_sub(freed.len() as u64);
        let ib = self.store(st, ino)?;
        let from = plan.pieces.first().map_or(0, |pc| pc.lbn);
        let f = FreeBlocks {
            ino,
            inode_buf: &ib,
            from_lbn: from,
            freed: &freed,
            holders: &holders,
            whole_file: false,
        };
        self.fact(st, |s, tx| s.setup_freeblocks(tx, &f))
    }

    fn do_setattr(&self, st: &mut State, ctx: &Ctx, ino: u64, set: SetAttr) -> Result<Attr> {
        let d = self.iget(st, ino)?.d.clone();
        let cur = owner(&d);
        let acl = self.access_acl(st, ino)?;
        let mut n = d.clone();
        let now = now_ns();
        if let Some(mode) = set.mode {
            n.mode = perm::chmod(ctx, cur, mode)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            let o = perm::chown(
                ctx,
                Owner {
                    mode: n.mode,
                    ..cur
                },
                set.uid,
                set.gid,
            )?;
            (n.mode, n.uid, n.gid) = (o.mode, o.uid, o.gid);
        }
        for (t, field) in [(set.atime, 0), (set.mtime, 1)] {
            let Some(t) = t else { continue };
            perm::may_set_time(ctx, cur, acl.as_deref(), &t)?;
            let v = match t {
                SetTime::Now => now,
                SetTime::At(t) => time_to_ns(t),
            };
            if field == 0 { n.atime = v } else { n.mtime = v }
        }
        if set.size.is_some() {
            if d.is_dir() {
                return Err(Errno::EISDIR.into());
            }
            if !d.is_reg() {
                return Err(Errno::EINVAL.into());
            }
            perm::may_truncate(ctx, cur, acl.as_deref(), set.fh.is_some())?;
            if !ctx.is_root() {
                n.mode = perm::kill_privileges(n.mode);
            }
        }
        if let Some(c) = set.ctime {
            n.ctime = time_to_ns(c);
        } else {
            n.ctime = now;
        }
        {
            let ic = self.iget(st, ino)?;
            ic.d.mode = n.mode;
            ic.d.uid = n.uid;
            ic.d.gid = n.gid;
            ic.d.atime = n.atime;
            ic.d.mtime = n.mtime;
            ic.d.ctime = n.ctime;
        }
        if let Some(size) = set.size {
            self.set_size(st, ino, size)?;
            let ic = self.iget(st, ino)?;
            if set.mtime.is_none() {
                ic.d.mtime = now;
            }
        }
        // A new mode rewrites the access ACL, if there is one, in the same inode encoding.
        if n.mode & 0o777 != d.mode & 0o777 && self.chmod_acl(st, ino, d.mode)? {
            return self.attr(st, ino);
        }
        self.store_attrs(st, ino, &[], None)?;
        self.attr(st, ino)
    }

    /// fallocate(2): `cairn_vfs::falloc`'s rules, then the operation, all inside the call's
    /// undo scope (an allocation that fails halfway takes everything back). Data changes
    /// go through the cache like a write's, pointer changes are declared like a write's
    /// allocations and a truncation's frees, so each mode orders them as it orders those.
    fn do_fallocate(
        &self,
        st: &mut State,
        ino: u64,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: FallocMode,
    ) -> Result<()> {
        let op = Falloc::decode(mode)?;
        let handle_flags = if fh != 0 { self.handle(st, fh)?.1 } else { 0 };
        let d = self.iget(st, ino)?.d.clone();
        let bs = self.vol.geo.block_size as u64;
        op.check(owner(&d), d.size, offset, length, bs, self.max_file_size)?;
        let end = offset + length;
        if let Falloc::Allocate { .. } | Falloc::ZeroRange { .. } = op {
            // Preflight: the range's blocks and the indirect blocks that must point to them,
            // less what the file has already (its own count bounds how many of them it
            // holds), are needed at least. A request that cannot fit is refused before a
            // block is zeroed: allocating block by block to the last one and rolling back
            // holds a buffer per block until the call ends (minutes and gigabytes for
            // generic/213's twice-the-disk).
            let range = end.div_ceil(bs) - offset / bs;
            let least = range + self.vol.geo.min_indirect_blocks(range);
            st.alloc.reserve(0, least.saturating_sub(d.blocks))?;
        }
        let grow = |st: &mut State, keep_size: bool| -> Result<()> {
            if !keep_size && end > d.size {
                self.zero_tail(st, ino, d.size, false)?;
                self.iget(st, ino)?.d.size = end;
            }
            Ok(())
        };
        let mut data_changed = true;
        match op {
            Falloc::Allocate { keep_size } => {
                self.alloc_zeroed(st, ino, offset / bs, end.div_ceil(bs))?;
                grow(st, keep_size)?;
                data_changed = false;
            }
            Falloc::PunchHole => self.punch_range(st, ino, offset, end.min(d.size))?,
            Falloc::ZeroRange { keep_size } => {
                // Every block the range touches is allocated (as by mode 0), and the range's
                // bytes in it zeroed.
                for (lbn, p) in self.alloc_zeroed(st, ino, offset / bs, end.div_ceil(bs))? {
                    let lo = offset.max(lbn * bs) - lbn * bs;
                    let hi = end.min((lbn + 1) * bs) - lbn * bs;
                    let b = self.bread(p, kind::DATA)?;
                    b.write_range(lo as usize, (hi - lo) as usize).fill(0);
                    self.vol.cache.mark_dirty(&b);
                }
                grow(st, keep_size)?;
            }
            Falloc::CollapseRange => self.collapse_range(st, ino, offset / bs, length / bs)?,
            Falloc::InsertRange => self.insert_range(st, ino, offset / bs, length / bs)?,
        }
        let now = now_ns();
        let ic = self.iget(st, ino)?;
        ic.d.ctime = now;
        if data_changed {
            ic.d.mtime = now;
        }
        ic.d.mode = perm::mode_after_data_change(handle_flags, ic.d.mode);
        // Like a write's inode update: delayed in every mode (sync orders the allocations
        // and frees above, not the size and times).
        self.store(st, ino)?;
        Ok(())
    }

    /// Maps logical blocks `from..to` of `ino`, each new block zeroed; returns the blocks
    /// that were mapped already (their bytes as they were), as `(lbn, block)`.
    ///
    /// A large range (at least [`ZERO_ON_DEVICE_BYTES`]) makes no buffer for its new blocks:
    /// once every block is mapped, their runs are zeroed on the device with one zero-range
    /// request each and a flush (the strategy's `write_zeros`), and the strategy is told that their initial contents are
    /// durable (`DataZeroed`). A buffer per block — all of them held by the call's undo
    /// scope until it ends — made a fallocate of 1 GiB cost 1 GiB of memory and then 1 GiB
    /// of writes. The order is rule 1's: the pointers to the new blocks are in buffers that
    /// no write takes before the zeros are flushed (`sync` writes a new indirect block
    /// while it is still empty and data pointers only at a later write-back; a journal logs
    /// them at the call's end, after a flush; soft updates holds write passes out of a
    /// call and rolls the pointers back until `DataZeroed`), so the zeros are durable
    /// before any pointer to them can be. A new block that is cached (its buffer
    /// outlived a free) is zeroed in its buffer, as a small range's are.
    fn alloc_zeroed(
        &self,
        st: &mut State,
        ino: u64,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, u64)>> {
        let bs = self.vol.geo.block_size as u64;
        let on_device = to.saturating_sub(from).saturating_mul(bs) >= ZERO_ON_DEVICE_BYTES;
        let mut mapped = Vec::new();
        // Runs of new blocks contiguous on the device: (first block, count).
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for lbn in from..to {
            let (p, fresh, _) = self.bmap_alloc(st, ino, lbn, BlockKind::Data, None)?;
            if !fresh {
                mapped.push((lbn, p));
            } else if on_device && self.vol.cache.lookup(p).is_none() {
                match runs.last_mut() {
                    Some((first, n)) if *first + *n == p => *n += 1,
                    _ => runs.push((p, 1)),
                }
            } else {
                let b = self.bnew(p, kind::DATA);
                self.vol.cache.mark_dirty(&b);
            }
        }
        if runs.is_empty() {
            return Ok(mapped);
        }
        self.strategy.write_zeros(&self.io, ino, &runs)?;
        for &(first, count) in &runs {
            let f = DataZeroed { ino, first, count };
            self.fact(st, |s, tx| s.setup_data_zeroed(tx, &f))?;
        }
        Ok(mapped)
    }

    /// Stores inode `ino` and declares its attributes changed (`extra`: the xattr blocks it
    /// rewrote; `acl_mode`: its mode changed with its access ACL); returns the inode block.
    pub(crate) fn store_attrs(
        &self,
        st: &mut State,
        ino: u64,
        extra: &[BufRef],
        acl_mode: Option<AclMode>,
    ) -> Result<BufRef> {
        let b = self.store(st, ino)?;
        let f = AttrChange {
            ino,
            inode_buf: &b,
            extra,
            acl_mode,
        };
        self.fact(st, |s, tx| s.setup_attr_change(tx, &f))?;
        Ok(b)
    }

    /// Bytes `from..to` of `ino` read as zeros: whole blocks are unmapped and freed (one
    /// `FreeBlocks`), partial ones zeroed in place.
    fn punch_range(&self, st: &mut State, ino: u64, from: u64, to: u64) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        let mut pos = from;
        let mut freed = Vec::new();
        let mut changed: Vec<BufRef> = Vec::new();
        while pos < to {
            let lbn = pos / bs;
            let in_blk = pos % bs;
            let n = (bs - in_blk).min(to - pos);
            if n == bs {
                if let Some((old, holder)) = self.bunmap(st, ino, lbn)? {
                    freed.push(old);
                    if let Some(h) = holder
                        && !changed.iter().any(|b| b.blkno() == h.blkno())
                    {
                        changed.push(h);
                    }
                }
            } else {
                let p = self.bmap(st, ino, lbn)?;
                if p != 0 {
                    let b = self.bread(p, kind::DATA)?;
                    b.write_range(in_blk as usize, n as usize).fill(0);
                    self.vol.cache.mark_dirty(&b);
                }
            }
            pos += n;
        }
        if freed.is_empty() && changed.is_empty() {
            return Ok(());
        }
        self.iget(st, ino)?.d.blocks -= freed.len() as u64;
        let ib = self.store(st, ino)?;
        let f = FreeBlocks {
            ino,
            inode_buf: &ib,
            from_lbn: from / bs,
            freed: &freed,
            holders: &changed,
            whole_file: false,
        };
        self.fact(st, |s, tx| s.setup_freeblocks(tx, &f))
    }

    /// Logical block `from`'s contents copied into logical block `to` of `ino` (a hole
    /// copies as a hole: `to` is freed), through the cache with before-images, like a
    /// write of the whole block.
    fn copy_block(&self, st: &mut State, ino: u64, from: u64, to: u64) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        let src = self.bmap(st, ino, from)?;
        if src == 0 {
            return self.punch_range(st, ino, to * bs, (to + 1) * bs);
        }
        let bytes = self.bread(src, kind::DATA)?.read().clone();
        let (dst, fresh, _) = self.bmap_alloc(st, ino, to, BlockKind::Data, None)?;
        let b = if fresh {
            self.bnew(dst, kind::DATA)
        } else {
            self.bread(dst, kind::DATA)?
        };
        b.write_range(0, bytes.len()).copy_from_slice(&bytes);
        self.vol.cache.mark_dirty(&b);
        Ok(())
    }

    /// COLLAPSE_RANGE of `n` blocks at block `at`: every block after the range moves down
    /// by `n` (copied block by block, lowest first), then the file is cut `n` blocks
    /// shorter. The copies are writes and the cut a truncation, declared as such: a crash
    /// midway leaves a consistent file system whose file is partly shifted, as a crash
    /// during a rewrite of the file's tail would (only a failure is all-or-nothing, by the
    /// call's undo scope).
    fn collapse_range(&self, st: &mut State, ino: u64, at: u64, n: u64) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        let size = self.iget(st, ino)?.d.size;
        let last = size.div_ceil(bs);
        for t in at..last - n {
            self.copy_block(st, ino, t + n, t)?;
        }
        self.set_size(st, ino, size - n * bs)
    }

    /// INSERT_RANGE of `n` blocks at block `at`: every block from `at` on moves up by `n`
    /// (copied block by block, highest first, so no source is overwritten before it is
    /// read), the range becomes a hole and the file `n` blocks longer. Crash behaviour as
    /// for [`Ffs::collapse_range`].
    fn insert_range(&self, st: &mut State, ino: u64, at: u64, n: u64) -> Result<()> {
        let bs = self.vol.geo.block_size as u64;
        let size = self.iget(st, ino)?.d.size;
        let last = size.div_ceil(bs);
        self.iget(st, ino)?.d.size = size + n * bs;
        for t in (at..last).rev() {
            self.copy_block(st, ino, t, t + n)?;
        }
        self.punch_range(st, ino, at * bs, (at + n) * bs)
    }
}

impl Ffs {
    /// `write(2)` (`back`: false) or the kernel's write-back of pages it already accepted
    /// (`back`: true, which may use the write-back reserve).
    fn write_as(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8], back: bool) -> Result<u32> {
        let _il = self.ilock(ino).write();
        let map = |st: &mut State| -> Result<Option<WritePlan>> {
            let flags = if fh != 0 {
                self.handle(st, fh)?.1
            } else {
                libc::O_RDWR
            };
            if flags & libc::O_ACCMODE == libc::O_RDONLY {
                return Err(Errno::EBADF.into());
            }
            // A file made immutable since it was opened takes no more writes.
            crate::acl::may_change_data(&self.iget(st, ino)?.d, true)?;
            if !data.is_empty() {
                // Written by someone without CAP_FSETID: setuid and setgid may go
                // (FUSE_HANDLE_KILLPRIV).
                let ic = self.iget(st, ino)?;
                ic.d.mode = perm::mode_after_data_change(flags, ic.d.mode);
            }
            let off = if perm::appends(flags) {
                self.iget(st, ino)?.d.size
            } else {
                offset
            };
            // A write-back may take the reserve held for it (`alloc`), for this call only.
            st.alloc.dip_into_reserve = back;
            let r = self.write_map(st, ino, off, data);
            st.alloc.dip_into_reserve = false;
            r
        };
        match self.strategy.io_model() {
            IoModel::Serialized => self.op("write", Some(OpKind::Write), |st| {
                let Some(plan) = map(st)? else {
                    return Ok(0);
                };
                let failed = self.write_streams(ino, &plan, data);
                self.write_finish(st, ino, &plan, data, failed, false)?
            }),
            IoModel::Concurrent => self.counted("write", || {
                let Some(plan) = self.locked_op(Some(OpKind::Write), map)? else {
                    return Ok(0);
                };
                let mut failed = self.write_streams(ino, &plan, data);
                // The finishing call allocates nothing, so it never runs twice; should it,
                // the stream's failure has been reported by the first run.
                let r = self.locked_op(Some(OpKind::Write), |st| {
                    self.write_finish(st, ino, &plan, data, failed.take(), true)
                });
                self.end_write(ino);
                r?
            }),
        }
    }
}

impl FileSystem for Ffs {
    fn root_ino(&self) -> Ino {
        ROOT_INO
    }

    fn posix_acls(&self) -> bool {
        true
    }

    fn kills_privileges(&self) -> bool {
        true
    }

    fn cache_policy(&self) -> KernelCachePolicy {
        KernelCachePolicy::for_commit(self.strategy.commit_policy())
    }

    fn statfs(&self) -> Result<StatFs> {
        let st = self.st.lock();
        let meta = self.vol.geo.group_count * self.vol.geo.meta_blocks();
        // An unlinked inode nobody has open is free space already; only the kernel's
        // lookup reference (dropped by a forget that may still be in flight) keeps it.
        let (ob, oi) = st.inodes.orphan_space();
        // The write-back reserve is no room for new data, root's included (`alloc`).
        let bfree = (st.alloc.free_blocks() + ob).saturating_sub(st.alloc.writeback_reserve());
        let ffree = st.alloc.free_inodes() + oi;
        // Available: the data one file can still be given, its indirect blocks counted
        // out of the free ones (fewer than one in 512), so that `df` never shows room a
        // write or fallocate cannot have (generic/103 fallocates all of it but 512 KiB).
        let bavail = bfree - self.vol.geo.indirect_blocks_for(bfree);
        Ok(StatFs {
            blocks: self.vol.geo.total_blocks - meta,
            bfree,
            bavail,
            files: self.vol.geo.total_inodes() - 2,
            ffree,
            bsize: self.vol.geo.block_size,
            namelen: MAX_NAME as u32,
            frsize: self.vol.geo.block_size,
        })
    }

    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<Attr> {
        self.op("lookup", None, |st| {
            let n = name.as_bytes();
            if n.len() > MAX_NAME {
                return Err(Errno::ENAMETOOLONG.into());
            }
            self.dir_for_lookup(st, ctx, parent)?;
            let slot = self.dir_lookup(st, parent, n)?.ok_or(Errno::ENOENT)?;
            self.entry_attr(st, slot.ino)
        })
    }

    fn forget(&self, ino: Ino, nlookup: u64) {
        let r = self.op("forget", None, |st| {
            let Some(ic) = st.inodes.loaded_mut(ino) else {
                return Ok(());
            };
            ic.nlookup = ic.nlookup.saturating_sub(nlookup);
            if ic.nlookup == 0 && ic.nopen == 0 && ic.writing == 0 {
                if ic.effnlink == 0 {
                    if self.read_only {
                        return Ok(());
                    }
                    // Freeing an orphan promises nothing durable (`Reclaim` is no
                    // durability point). Sync's next ordered step's barrier makes the
                    // cleared inode durable before any freed resource can be pointed to
                    // again (rule 2).
                    return self.in_op(st, OpKind::Reclaim, |st| self.reclaim(st, ino));
                } else if ic.may_leave_core() {
                    st.inodes.remove(ino);
                }
            }
            Ok(())
        });
        if let Err(e) = r {
            log::error!("forget of inode {ino} failed: {e}");
        }
    }

    fn stable_numbers(&self) -> bool {
        // An inode number is its slot in the inode table, and `alloc_inode` hands a
        // reused slot the next generation.
        true
    }

    fn lookup_number(&self, ino: Ino) -> Result<Attr> {
        self.op("lookup", None, |st| {
            // A free slot or a number beyond the table: ENOENT from `iget`.
            let ic = self.iget(st, ino).map_err(|e| match e.errno() {
                Errno::ENOENT => Errno::ESTALE.into(),
                _ => e,
            })?;
            // Unlinked but still open (an orphan): no name leads to it any more, and a
            // handle to it is stale, as on ext4.
            if ic.effnlink == 0 {
                return Err(Errno::ESTALE.into());
            }
            self.entry_attr(st, ino)
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.op("getattr", None, |st| self.attr(st, ino))
    }

    fn setattr(&self, ctx: &Ctx, ino: Ino, set: SetAttr) -> Result<Attr> {
        // A size change frees or zeroes the file's blocks: no write of it may be between
        // its passes.
        let _il = set.size.map(|_| self.ilock(ino).write());
        self.op("setattr", Some(OpKind::Setattr), |st| {
            self.do_setattr(st, ctx, ino, set)
        })
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.op("readlink", None, |st| {
            let d = self.iget(st, ino)?.d.clone();
            if !d.is_symlink() {
                return Err(Errno::EINVAL.into());
            }
            if let Some(t) = d.fast_link {
                return Ok(t);
            }
            let p = self.bmap(st, ino, 0)?;
            if p == 0 || d.size as usize > self.vol.geo.bs() {
                return Err(corrupt_err(format!("symlink {ino}: no target block")));
            }
            let b = self.bread(p, kind::DATA)?;
            let t = b.read()[..d.size as usize].to_vec();
            Ok(t)
        })
    }

    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr> {
        self.op("mknod", Some(OpKind::Mknod), |st| {
            let node = perm::mknod(ctx, mode, rdev)?;
            let ino = self.make_node(st, ctx, parent, name, node.mode, umask, node.rdev, None)?;
            self.entry_attr(st, ino)
        })
    }

    fn mkdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr> {
        self.op("mkdir", Some(OpKind::Mkdir), |st| {
            let m = libc::S_IFDIR | (mode & 0o7777);
            let ino = self.make_node(st, ctx, parent, name, m, umask, 0, None)?;
            self.entry_attr(st, ino)
        })
    }

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        self.op("unlink", Some(OpKind::Unlink), |st| {
            let n = perm::check_name(name)?;
            self.dir_for_remove(st, ctx, parent)?;
            if perm::is_dot(n) {
                return Err(Errno::EISDIR.into());
            }
            let slot = self.dir_lookup(st, parent, n)?.ok_or(Errno::ENOENT)?;
            let td = self.iget(st, slot.ino)?.d.clone();
            self.may_delete(st, ctx, parent, &td)?;
            if td.is_dir() {
                return Err(Errno::EISDIR.into());
            }
            self.touch_dir(st, parent)?;
            let (_, apply) = self.dir_remove(st, parent, n, false)?;
            self.iget(st, slot.ino)?.d.ctime = now_ns();
            self.drop_link(st, slot.ino, 1, apply)?;
            self.reclaim(st, slot.ino)
        })
    }

    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        self.op("rmdir", Some(OpKind::Rmdir), |st| {
            let n = perm::check_name(name)?;
            if n == b"." {
                return Err(Errno::EINVAL.into());
            }
            if n == b".." {
                return Err(Errno::ENOTEMPTY.into());
            }
            self.dir_for_remove(st, ctx, parent)?;
            let slot = self.dir_lookup(st, parent, n)?.ok_or(Errno::ENOENT)?;
            let td = self.iget(st, slot.ino)?.d.clone();
            self.may_delete(st, ctx, parent, &td)?;
            if !td.is_dir() {
                return Err(Errno::ENOTDIR.into());
            }
            if !self.dir_index(st, slot.ino)?.is_empty() {
                return Err(Errno::ENOTEMPTY.into());
            }
            // The entry goes first (only its block in the step); then the parent loses the
            // victim's "..", and the victim its name and ".".
            let (_, apply) = self.dir_remove(st, parent, n, true)?;
            self.drop_link(st, parent, 1, apply)?;
            self.touch_dir(st, parent)?;
            self.iget(st, slot.ino)?.d.ctime = now_ns();
            let links = self.iget(st, slot.ino)?.effnlink;
            self.drop_link(st, slot.ino, links, apply)?;
            self.reclaim(st, slot.ino)
        })
    }

    fn symlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr, target: &[u8]) -> Result<Attr> {
        self.op("symlink", Some(OpKind::Symlink), |st| {
            if target.is_empty() {
                return Err(Errno::ENOENT.into());
            }
            if target.len() >= 4096 || target.len() > self.vol.geo.bs() {
                return Err(Errno::ENAMETOOLONG.into());
            }
            let ino = self.make_node(
                st,
                ctx,
                parent,
                name,
                libc::S_IFLNK | 0o777,
                0,
                0,
                Some(target),
            )?;
            self.entry_attr(st, ino)
        })
    }

    /// Every mode: the whiteout is a new inode taking the old name in the rename's own
    /// call, which each strategy orders as a rename plus a mknod.
    fn supports_whiteout(&self) -> bool {
        true
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        np: Ino,
        nname: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        self.op(
            "rename",
            Some(if flags.exchange {
                OpKind::Exchange
            } else {
                OpKind::Rename
            }),
            |st| self.do_rename(st, ctx, parent, name, np, nname, flags),
        )
    }

    fn link(&self, ctx: &Ctx, ino: Ino, np: Ino, nname: &OsStr) -> Result<Attr> {
        self.op("link", Some(OpKind::Link), |st| {
            let n = perm::check_name(nname)?;
            let d = self.iget(st, ino)?.d.clone();
            // may_linkat (protected hard links), then vfs_link's rules.
            let acl = self.access_acl(st, ino)?;
            perm::may_link(ctx, owner(&d), acl.as_deref())?;
            self.dir_for_change(st, ctx, np)?;
            if d.is_dir() {
                return Err(Errno::EPERM.into());
            }
            if perm::is_dot(n) || self.dir_lookup(st, np, n)?.is_some() {
                return Err(Errno::EEXIST.into());
            }
            let (links, linkable) = {
                let ic = self.iget(st, ino)?;
                (ic.effnlink, ic.linkable)
            };
            if links >= LINK_MAX {
                return Err(Errno::EMLINK.into());
            }
            // An inode with no name is linked only if O_TMPFILE made it so (vfs_link).
            if links == 0 && !linkable {
                return Err(Errno::ENOENT.into());
            }
            let blocks = self.dir_add_blocks(st, np, n)?;
            st.alloc.reserve(0, blocks)?;
            // The count goes up on disk before the new name exists (count ≥ references).
            self.iget(st, ino)?.d.ctime = now_ns();
            self.raise_link(st, ino, LinkWhy::Link)?;
            if links == 0 {
                // A tmpfile named: no longer an orphan, and linkable no more (a later
                // unlink makes it an ordinary unlinked-while-open file).
                st.inodes.remove_orphan(ino);
                self.iget(st, ino)?.linkable = false;
            }
            self.touch_dir(st, np)?;
            self.dir_add(st, np, n, ino, dtype_of(d.mode), false, None)?;
            self.entry_attr(st, ino)
        })
    }

    fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Fh> {
        let truncating = flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY;
        let _il = truncating.then(|| self.ilock(ino).write());
        self.op("open", truncating.then_some(OpKind::Truncate), |st| {
            let d = self.iget(st, ino)?.d.clone();
            if d.is_dir() && flags & libc::O_ACCMODE != libc::O_RDONLY {
                return Err(Errno::EISDIR.into());
            }
            if self.read_only && flags & libc::O_ACCMODE != libc::O_RDONLY {
                return Err(Errno::EROFS.into());
            }
            let acl = self.deciding_acl(st, ctx, ino, &d)?;
            perm::may_open(ctx, owner(&d), acl.as_deref(), flags)?;
            if truncating && d.is_reg() && d.size > 0 {
                self.set_size(st, ino, 0)?;
                let now = now_ns();
                let ic = self.iget(st, ino)?;
                ic.d.mtime = now;
                ic.d.ctime = now;
                if !ctx.is_root() {
                    ic.d.mode = perm::kill_privileges(ic.d.mode);
                }
                self.store_attrs(st, ino, &[], None)?;
            }
            Ok(self.new_handle(st, ino, perm::handle_flags(ctx, flags, d.gid)))
        })
    }

    fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        self.op("create", Some(OpKind::Create), |st| {
            let m = libc::S_IFREG | (mode & 0o7777);
            let ino = self.make_node(st, ctx, parent, name, m, umask, 0, None)?;
            let attr = self.entry_attr(st, ino)?;
            let fh = self.new_handle(st, ino, perm::handle_flags(ctx, flags, attr.gid));
            Ok((attr, fh))
        })
    }

    /// A file created and unlinked in one call: to every strategy it is then what a file
    /// unlinked while open is (the journal's orphan record; an unreferenced inode with no
    /// link to fsck and the background check), and it never reaches disk with a link it
    /// does not have. `link` names it with the raise a hard link makes, so each mode orders
    /// the inode before the name as it does for link(2).
    fn tmpfile(
        &self,
        ctx: &Ctx,
        parent: Ino,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        self.op("tmpfile", Some(OpKind::Create), |st| {
            self.dir_for_change(st, ctx, parent)?;
            let n = NewInode {
                parent,
                mode: libc::S_IFREG | (mode & 0o7777),
                umask,
                rdev: 0,
                link_target: None,
                name_blocks: 0,
            };
            let (ino, _) = self.new_inode(st, ctx, n)?;
            self.drop_link(st, ino, 1, Apply::Now)?;
            self.iget(st, ino)?.linkable = flags & libc::O_EXCL == 0;
            let attr = self.entry_attr(st, ino)?;
            let fh = self.new_handle(st, ino, perm::handle_flags(ctx, flags, attr.gid));
            Ok((attr, fh))
        })
    }

    fn read(&self, ino: Ino, fh: Fh, offset: u64, size: u32, buf: &mut Vec<u8>) -> Result<()> {
        // Never between a write's passes: a block mapped but not yet written would show its
        // previous owner's bytes.
        let _il = self.ilock(ino).read();
        let plan = |st: &mut State, buf: &mut Vec<u8>| {
            if fh != 0 {
                self.handle(st, fh)?;
            }
            self.read_plan(st, ino, offset, size, buf)
        };
        match self.strategy.io_model() {
            IoModel::Serialized => self.op("read", Some(OpKind::Read), |st| {
                let pieces = plan(st, buf)?;
                self.fill_read(&pieces, buf)
            }),
            // The device reads go without the engine's lock (as a write's stream does), so
            // calls on other files, and the kernel's next read-ahead request of this one,
            // are not kept waiting behind them: the device then has two reads in flight
            // where it had one. A read that needs no device I/O stays one call.
            IoModel::Concurrent => self.counted("read", || {
                let pieces = self.locked_op(Some(OpKind::Read), |st| {
                    let pieces = plan(st, buf)?;
                    if pieces.iter().any(|p| matches!(p, ReadPiece::Device { .. })) {
                        // Held until the device reads are done (`end_write` drops it).
                        self.iget(st, ino)?.writing += 1;
                        Ok(Some(pieces))
                    } else {
                        self.fill_read(&pieces, buf)?;
                        Ok(None)
                    }
                })?;
                let Some(pieces) = pieces else {
                    return Ok(());
                };
                let r = self.fill_read(&pieces, buf);
                drop(pieces);
                self.end_write(ino);
                r
            }),
        }
    }

    /// A write in two passes (`write_map`, then `write_streams` and `write_finish`), under the
    /// file's own lock. In a `Serialized` mode all of it is one call under the engine's
    /// lock, in one undo scope. In a `Concurrent` mode the first pass is one call, the
    /// stream's device writes go out with no engine lock held, and the second pass is
    /// another call: other files' calls never wait for this file's data to reach the device.
    fn write(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_as(ino, fh, offset, data, false)
    }

    fn write_back(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_as(ino, fh, offset, data, true)
    }

    fn set_writeback_reserve(&self, bytes: u64) {
        // Data blocks, and the indirect blocks mapping them (one per block of pointers).
        let bs = self.vol.geo.block_size as u64;
        let data = bytes.div_ceil(bs);
        let blocks = data + data.div_ceil(bs / 4) + crate::bmap::MAX_MAP_BLOCKS;
        self.st.lock().alloc.set_writeback_reserve(blocks);
    }

    fn set_atime(&self, policy: cairn_vfs::Atime) {
        *self.atime.lock() = policy;
    }

    fn room_is_short(&self) -> bool {
        let short = || {
            let mut st = self.st.lock();
            st.alloc.usable_blocks() < st.alloc.writeback_reserve()
        };
        if !short() {
            return false;
        }
        // Without the held-back frees made, every open after an `rm` on a nearly full disk
        // would get no page cache, and be refused a shared mapping, until the syncer's next
        // round. Only on a nearly full disk with frees pending does an open pay for it.
        if !self.make_held_frees("before an open on a nearly full disk") {
            return true;
        }
        short()
    }

    /// Nothing to do at close(2): writes reach the buffer cache when write() is called (no
    /// kernel writeback cache) and durability is fsync's job. ENOSYS tells the kernel so
    /// once; it then stops sending FLUSH on every close, one round trip less per file.
    fn flush(&self, _ino: Ino, _fh: Fh) -> Result<()> {
        Err(Errno::ENOSYS.into())
    }

    fn release(&self, ino: Ino, fh: Fh) -> Result<()> {
        self.op("release", None, |st| {
            if st.handles.close(fh)
                && let Some(ic) = st.inodes.loaded_mut(ino)
            {
                ic.nopen = ic.nopen.saturating_sub(1);
                if ic.nopen == 0 && ic.effnlink == 0 && !self.read_only {
                    // The handle is gone whatever happens; freeing the inode is all or
                    // nothing (a failure leaves an orphan that unmount frees).
                    self.in_op(st, OpKind::Release, |st| self.reclaim(st, ino))?;
                }
            }
            Ok(())
        })
    }

    /// The file's dirty blocks are collected under the engine's lock; the strategy writes
    /// them (and what finds them) with the lock held only in a `Serialized` mode. Writes of
    /// this file wait for it (its own lock); calls on other files do not.
    fn fsync(&self, ino: Ino, _fh: Fh, datasync: bool) -> Result<()> {
        let _il = self.ilock(ino).read();
        self.counted("fsync", || {
            let data = self.locked_op(None, |st| {
                self.iget(st, ino)?;
                if self.read_only {
                    return Ok(None);
                }
                let data: Vec<BufRef> = self
                    .file_blocks(st, ino)?
                    .into_iter()
                    .filter_map(|b| self.vol.cache.lookup(b))
                    .filter(|b| b.is_dirty() && matches!(b.kind(), kind::DATA | kind::INDIRECT))
                    .collect();
                Ok(Some(data))
            })?;
            let Some(data) = data else {
                return Ok(());
            };
            self.with_io_lock(|| {
                self.strategy.fsync(
                    self,
                    &FsyncReq {
                        ino,
                        datasync,
                        blocks: &data,
                    },
                )
            })
        })
    }

    fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<Fh> {
        self.op("opendir", None, |st| {
            self.dir_inode(st, ino)?;
            self.may(st, ctx, ino, Access::R)?;
            Ok(self.new_handle(st, ino, libc::O_RDONLY))
        })
    }

    fn releasedir(&self, ino: Ino, fh: Fh) -> Result<()> {
        self.release(ino, fh)
    }

    fn readdir(
        &self,
        ino: Ino,
        _fh: Fh,
        offset: u64,
        plus: bool,
        emit: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.op("readdir", None, |st| {
            let d = self.dir_inode(st, ino)?;
            let bs = self.vol.geo.block_size as u64;
            // Cookies are byte offsets + 1 of the entry last returned (0 = start).
            let mut lbn = offset / bs;
            while lbn * bs < d.size {
                let p = self.bmap(st, ino, lbn)?;
                if p == 0 {
                    return Err(corrupt_err(format!("directory {ino}: hole at block {lbn}")));
                }
                let b = self.bread(p, kind::DIRECTORY)?;
                let data = b.read().clone();
                for r in dir::entries(&data) {
                    let e = r.map_err(|e| corrupt_err(format!("directory {ino}: {}", e.0)))?;
                    let pos = lbn * bs + e.off as u64;
                    if pos < offset {
                        continue;
                    }
                    let kind = FileKind::from_dtype(e.dtype).unwrap_or(FileKind::RegularFile);
                    let attr = if plus && !perm::is_dot(e.name) {
                        Some(self.entry_attr(st, e.ino as u64)?)
                    } else {
                        None
                    };
                    let ok = emit(DirEntry {
                        ino: e.ino as u64,
                        next_offset: pos + 1,
                        kind,
                        name: OsStr::from_bytes(e.name),
                        attr,
                    });
                    if !ok {
                        // The refused entry was not handed over: undo its lookup count.
                        if let Some(a) = attr
                            && let Some(ic) = st.inodes.loaded_mut(a.ino)
                        {
                            ic.nlookup = ic.nlookup.saturating_sub(1);
                        }
                        return Ok(());
                    }
                }
                lbn += 1;
            }
            Ok(())
        })
    }

    fn fsyncdir(&self, ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        self.fsync(ino, fh, datasync)
    }

    fn setxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.op("setxattr", Some(OpKind::SetXattr), |st| {
            let n = name.as_bytes();
            let d = self.iget(st, ino)?.d.clone();
            let acl = self.access_acl(st, ino)?;
            perm::xattr_access(ctx, owner(&d), acl.as_deref(), n, XattrOp::Set)?;
            if value.len() > XATTR_SIZE_MAX {
                return Err(Errno::E2BIG.into());
            }
            if let Some(kind) = cairn_vfs::acl::Kind::of_xattr(n) {
                return self.set_acl(st, ctx, ino, kind, Some(value));
            }
            let mut attrs = self.read_xattrs(ino, &d)?;
            let pos = attrs.iter().position(|(k, _)| k.as_slice() == n);
            match (pos, flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE)) {
                (Some(_), libc::XATTR_CREATE) => return Err(Errno::EEXIST.into()),
                (None, libc::XATTR_REPLACE) => return Err(Errno::ENODATA.into()),
                _ => {}
            }
            match pos {
                Some(i) => attrs[i].1 = value.to_vec(),
                None => attrs.push((n.to_vec(), value.to_vec())),
            }
            self.write_xattrs(st, ino, &attrs, XattrWrite::InPlace)
        })
    }

    fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        self.op("getxattr", None, |st| {
            let n = name.as_bytes();
            let d = self.iget(st, ino)?.d.clone();
            let acl = self.access_acl(st, ino)?;
            perm::xattr_access(ctx, owner(&d), acl.as_deref(), n, XattrOp::Get)?;
            let attrs = self.read_xattrs(ino, &d)?;
            attrs
                .into_iter()
                .find(|(k, _)| k.as_slice() == n)
                .map(|(_, v)| v)
                .ok_or_else(|| Errno::ENODATA.into())
        })
    }

    fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<u8>> {
        self.op("listxattr", None, |st| {
            let d = self.iget(st, ino)?.d.clone();
            let mut out = Vec::new();
            for (k, _) in self.read_xattrs(ino, &d)? {
                if k.starts_with(b"trusted.") && !ctx.is_root() {
                    continue;
                }
                out.extend_from_slice(&k);
                out.push(0);
            }
            Ok(out)
        })
    }

    fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<()> {
        self.op("removexattr", Some(OpKind::RemoveXattr), |st| {
            let n = name.as_bytes();
            let d = self.iget(st, ino)?.d.clone();
            let acl = self.access_acl(st, ino)?;
            if !perm::xattr_access(ctx, owner(&d), acl.as_deref(), n, XattrOp::Remove)? {
                return Ok(());
            }
            if let Some(kind) = cairn_vfs::acl::Kind::of_xattr(n) {
                return self.set_acl(st, ctx, ino, kind, None);
            }
            let mut attrs = self.read_xattrs(ino, &d)?;
            let before = attrs.len();
            attrs.retain(|(k, _)| k.as_slice() != n);
            if attrs.len() == before {
                return Err(Errno::ENODATA.into());
            }
            self.write_xattrs(st, ino, &attrs, XattrWrite::InPlace)
        })
    }

    fn access(&self, ctx: &Ctx, ino: Ino, mask: Access) -> Result<()> {
        self.op("access", None, |st| {
            if mask.0 & Access::W.0 != 0 && self.read_only {
                return Err(Errno::EROFS.into());
            }
            self.may(st, ctx, ino, mask).map(|_| ())
        })
    }

    fn get_flags(&self, _ctx: &Ctx, ino: Ino) -> Result<u32> {
        self.op("getflags", None, |st| Ok(self.iget(st, ino)?.d.flags))
    }

    fn getattr_flags(&self, _ctx: &Ctx, ino: Ino) -> Result<(Attr, Result<u32>)> {
        self.op("getattr", None, |st| {
            let a = self.attr(st, ino)?;
            Ok((a, Ok(self.iget(st, ino)?.d.flags)))
        })
    }

    fn set_flags(&self, ctx: &Ctx, ino: Ino, flags: u32) -> Result<()> {
        self.op("setflags", Some(OpKind::Setattr), |st| {
            self.set_inode_flags(st, ctx, ino, flags)
        })
    }

    fn fallocate(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: FallocMode,
    ) -> Result<()> {
        let _il = self.ilock(ino).write();
        self.op("fallocate", Some(OpKind::Fallocate), |st| {
            self.do_fallocate(st, ino, fh, offset, length, mode)
        })
    }

    fn sync_all(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.sync_as(SyncWhy::All)
    }

    fn destroy(&self) -> Result<()> {
        self.unmount()
    }

    fn stats_json(&self) -> String {
        let st = self.st.lock();
        let dev = self.dev.counters().snapshot();
        let v = serde_json::json!({
            "mode": self.strategy.name(),
            "device": dev,
            "disk": self.dev.disk_stats(),
            "cache": self.vol.cache.stats(),
            "ops": *self.stats.lock(),
            "ops_total": self.ops_total.load(std::sync::atomic::Ordering::Relaxed),
            "inodes_in_core": st.inodes.len(),
            "directories_indexed": st.dirs.len(),
            "open_handles": st.handles.len(),
            "free_blocks": st.alloc.free_blocks(),
            "free_inodes": st.alloc.free_inodes(),
            "strategy": self.strategy.stats(),
        });
        v.to_string()
    }

    fn check_background(&self, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<String> {
        let r = self.check_background_report(progress)?;
        serde_json::to_string(&r).map_err(|e| FsError::Corrupt(e.to_string()))
    }
}
