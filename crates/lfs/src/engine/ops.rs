//! The `FileSystem` operations. Each checks everything it can before it changes anything,
//! so a refused call leaves the state as it was; changes are made in memory and reach the
//! log at the next flush. Permission rules are `cairn_vfs::perm`'s, directory blocks are
//! `cairn_dir`'s — the same as the FFS format's.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use cairn_dir::block;
use cairn_vfs::perm::{self, LINK_MAX, XattrOp};
use cairn_vfs::{
    Access, Attr, Ctx, DirEntry, Errno, FallocMode, Fh, FileKind, FileSystem, Ino,
    KernelCachePolicy, Owner, RenameFlags, Result, SetAttr, SetTime, StatFs,
};

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::{
    BS, Lfs, Node, ROOT_INO, State, corrupt, from_time, now, owned_blocks, read_xattr_chain,
    to_time,
};
use crate::format::BLOCK_SIZE;
use crate::format::dirlog::{Op, Record};
use crate::format::inode::{self, Inode, Time};
use crate::format::tables::ImapEntry;
use cairn_dir::DirIndex;

const CHUNKS: usize = BLOCK_SIZE / block::DIR_CHUNK;
/// The largest extended-attribute value (XATTR_SIZE_MAX).
const XATTR_SIZE_MAX: usize = 65_536;

/// The mode, ids and flags of an inode, as the permission rules see them.
pub(crate) fn owner(n: &Inode) -> Owner {
    Owner {
        mode: n.mode,
        uid: n.uid,
        gid: n.gid,
        flags: n.flags,
    }
}

fn is_dir(n: &Inode) -> bool {
    n.mode & libc::S_IFMT == libc::S_IFDIR
}

fn dtype(mode: u32) -> u8 {
    ((mode & libc::S_IFMT) >> 12) as u8
}

pub(crate) fn attr_of(n: &Inode) -> Attr {
    Attr {
        ino: n.ino,
        generation: n.version as u64,
        size: n.size,
        blocks: n.blocks * (BS / 512),
        atime: from_time(n.atime),
        mtime: from_time(n.mtime),
        ctime: from_time(n.ctime),
        crtime: from_time(n.crtime),
        kind: FileKind::from_mode(n.mode).unwrap_or(FileKind::RegularFile),
        perm: (n.mode & 0o7777) as u16,
        nlink: n.nlink,
        uid: n.uid,
        gid: n.gid,
        rdev: n.rdev,
        blksize: BLOCK_SIZE as u32,
        flags: 0,
    }
}

impl State {
    /// `stat` of `ino`: blocks buffered but not yet in the log count as allocated.
    pub(crate) fn attr(&mut self, ino: u64) -> Result<Attr> {
        self.map(ino)?;
        let pending = self
            .dirty
            .blocks_of(ino)
            .filter(|l| {
                self.nodes
                    .get(&ino)
                    .and_then(|n| n.map.as_ref())
                    .is_none_or(|m| !m.contains_key(l))
            })
            .count() as u64;
        let mut a = attr_of(&self.node(ino)?.inode);
        a.blocks += pending * (BS / 512);
        Ok(a)
    }

    fn inode(&mut self, ino: u64) -> Result<&mut Inode> {
        Ok(&mut self.node(ino)?.inode)
    }

    /// The directory `ino`, with the caller allowed `want` on it (its ACL and flags
    /// included).
    fn dir_checked(&mut self, ctx: &Ctx, ino: u64, want: Access) -> Result<Inode> {
        let n = self.inode(ino)?.clone();
        if !is_dir(&n) {
            return Err(Errno::ENOTDIR.into());
        }
        self.may(ctx, ino, want)
    }

    /// The name index of directory `ino`, built from its blocks on first use.
    pub(crate) fn dir_index(&mut self, ino: u64) -> Result<&mut DirIndex> {
        if !self.dirs.contains(ino) {
            let size = self.inode(ino)?.size;
            let nblocks = size / BS;
            let mut idx = DirIndex::new(0);
            for lbn in 0..nblocks {
                let b = self.read_file_block(ino, lbn)?;
                idx.add_block(lbn, &b)
                    .map_err(|e| corrupt(format!("directory {ino}: {e}")))?;
                idx.nblocks += 1;
            }
            let idx = idx
                .finish()
                .map_err(|e| corrupt(format!("directory {ino}: {e}")))?;
            self.dirs.insert(ino, idx);
        }
        self.dirs.get_mut(ino).ok_or(Errno::EIO.into())
    }

    fn dir_get(&mut self, dir: u64, name: &[u8]) -> Result<Option<cairn_dir::Slot>> {
        let idx = self.dir_index(dir)?;
        Ok(match name {
            b"." => Some(cairn_dir::Slot {
                ino: dir,
                dtype: libc::DT_DIR,
                lbn: 0,
                off: 0,
            }),
            b".." => Some(idx.dotdot),
            n => idx.names.get(n).copied(),
        })
    }

    fn dir_add(&mut self, dir: u64, name: &[u8], ino: u64, dt: u8) -> Result<()> {
        let place = self.dir_index(dir)?.place(name.len());
        let (lbn, chunk, mut b, grew) = match place {
            Some(c) => {
                let lbn = (c / CHUNKS) as u64;
                (lbn, c, self.read_file_block(dir, lbn)?, false)
            }
            None => {
                let lbn = self.dir_index(dir)?.nblocks;
                let mut b = vec![0u8; BLOCK_SIZE];
                block::init_empty(&mut b);
                (lbn, lbn as usize * CHUNKS, b, true)
            }
        };
        let in_chunk = chunk % CHUNKS;
        let off = block::insert(&mut b, in_chunk, ino, dt, name)
            .map_err(corrupt)?
            .ok_or_else(|| corrupt("directory index promised room the block lacks"))?;
        let free = block::chunk_free(&b, in_chunk) as u16;
        self.write_file_block(dir, lbn, b);
        let idx = self.dir_index(dir)?;
        if grew {
            idx.grew(CHUNKS);
        }
        idx.free.set(chunk, free);
        idx.names.insert(
            name.into(),
            cairn_dir::Slot {
                ino,
                dtype: dt,
                lbn,
                off,
            },
        );
        if grew {
            let n = self.inode(dir)?;
            n.size += BS;
        }
        Ok(())
    }

    fn dir_remove(&mut self, dir: u64, name: &[u8]) -> Result<()> {
        let slot = self.dir_get(dir, name)?.ok_or(Errno::ENOENT)?;
        let mut b = self.read_file_block(dir, slot.lbn)?;
        block::remove(&mut b, slot.off).map_err(corrupt)?;
        let c = slot.off / block::DIR_CHUNK;
        let free = block::chunk_free(&b, c) as u16;
        self.write_file_block(dir, slot.lbn, b);
        let idx = self.dir_index(dir)?;
        idx.names.remove(name);
        idx.free.set(slot.lbn as usize * CHUNKS + c, free);
        Ok(())
    }

    /// Points an existing entry (`..` included) at another inode.
    fn dir_repoint(&mut self, dir: u64, name: &[u8], ino: u64, dt: u8) -> Result<()> {
        let slot = self.dir_get(dir, name)?.ok_or(Errno::ENOENT)?;
        let mut b = self.read_file_block(dir, slot.lbn)?;
        block::set_ino(&mut b, slot.off, ino, dt);
        self.write_file_block(dir, slot.lbn, b);
        let idx = self.dir_index(dir)?;
        let new = cairn_dir::Slot {
            ino,
            dtype: dt,
            ..slot
        };
        if name == b".." {
            idx.dotdot = new;
        } else {
            idx.names.insert(name.into(), new);
        }
        Ok(())
    }

    fn touch_dir(&mut self, dir: u64) -> Result<()> {
        let t = now();
        let n = self.inode(dir)?;
        n.mtime = t;
        n.ctime = t;
        self.mark_dirty(dir);
        Ok(())
    }

    fn log_op(&mut self, op: Op, rename_half: bool, dir: u64, ino: u64, name: &[u8]) {
        let nlink = self.nodes.get(&ino).map_or(0, |n| n.inode.nlink);
        self.dirty.log_record(Record {
            op,
            rename_half,
            nlink,
            dir,
            ino,
            name: name.to_vec(),
        });
    }

    fn alloc_ino(&mut self) -> Result<(u64, u32)> {
        let nodes = &self.nodes;
        let (ino, version) = self
            .imap
            .alloc(self.sb.max_inodes as u64, ROOT_INO, |i| {
                nodes.contains_key(&i)
            })
            .ok_or(Errno::ENOSPC)?;
        self.dirty.reused(ino);
        Ok((ino, version))
    }

    /// A new inode in directory `parent`, named `name` (checked by the caller): `mode` is
    /// its type and the permission bits asked for, before the umask (which applies unless
    /// the directory has a default ACL to inherit).
    fn new_node(
        &mut self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<u64> {
        let ino = self.new_inode(ctx, parent, mode, umask, rdev)?;
        self.log_op(Op::Create, false, parent, ino, name);
        let mode = self.inode(ino)?.mode;
        self.dir_add(parent, name, ino, dtype(mode))?;
        self.touch_dir(parent)?;
        Ok(ino)
    }

    /// A new inode for `new_node` or a rename's whiteout, not yet named: allocated and
    /// initialized (a directory's first block and its parent's raised count, inherited
    /// ACLs). Nothing reaches the log before the call's entries do: the whole call is one
    /// log write.
    fn new_inode(
        &mut self,
        ctx: &Ctx,
        parent: u64,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<u64> {
        let p = self.inode(parent)?.clone();
        let (mode, inherited) = self.inherit(parent, mode, umask)?;
        let (mode, gid) = perm::new_inode_owner(ctx, owner(&p), mode);
        let (ino, version) = self.alloc_ino()?;
        let t = now();
        let dir = mode & libc::S_IFMT == libc::S_IFDIR;
        let inode = Inode {
            ino,
            version,
            mode,
            uid: ctx.uid,
            gid,
            nlink: if dir { 2 } else { 1 },
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            rdev,
            ..Default::default()
        };
        let mut node = Node::fresh(inode);
        // Only an inherited ACL gives the new inode an xattr list to write: counting every
        // new inode among the meta inodes made each later write's admission count walk
        // every file created since the last flush.
        let meta = !inherited.is_empty();
        if meta {
            node.xattrs = Some(inherited);
            node.xattr_dirty = true;
        }
        self.nodes.insert(ino, Box::new(node));
        if meta {
            self.mark_meta_dirty(ino);
        } else {
            self.mark_dirty(ino);
        }
        if dir {
            let mut b = vec![0u8; BLOCK_SIZE];
            block::init_first(&mut b, ino, parent);
            self.write_file_block(ino, 0, b);
            self.inode(ino)?.size = BS;
            self.inode(parent)?.nlink += 1;
        }
        Ok(ino)
    }

    /// Checks that `name` may be created in `parent`.
    fn check_new(&mut self, ctx: &Ctx, parent: u64, name: &OsStr) -> Result<Vec<u8>> {
        let n = perm::check_name(name)?.to_vec();
        self.dir_checked(ctx, parent, Access::WX)?;
        if self.dir_get(parent, &n)?.is_some() {
            return Err(Errno::EEXIST.into());
        }
        if self.inode(parent)?.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        self.ensure_space(2 * BS)?;
        Ok(n)
    }

    /// Frees `ino` once nothing names it and nothing has it open.
    pub(crate) fn maybe_free(&mut self, ino: u64) -> Result<()> {
        let Some(n) = self.nodes.get(&ino) else {
            return Ok(());
        };
        if n.inode.nlink > 0 || n.opens > 0 {
            return Ok(());
        }
        let inode = n.inode.clone();
        let blocks = match n.map.as_ref() {
            Some(m) => {
                let mut v: Vec<u64> = m.values().copied().collect();
                v.extend(n.ind.values().copied());
                if inode.xattr != 0 {
                    v.extend(read_xattr_chain(inode.xattr, |a| self.read_block(a))?.1);
                }
                v
            }
            None => owned_blocks(&inode, |a| self.read_block(a))?,
        };
        for a in blocks {
            self.kill(a, BLOCK_SIZE as u32);
        }
        let e = self.imap.get(ino).ok_or(Errno::ENOENT)?;
        self.kill(e.addr, 256);
        let version = e.version.max(inode.version).wrapping_add(1).max(1);
        self.imap.set(ino, ImapEntry { addr: 0, version });
        self.dirty.freed(ino, version);
        self.nodes.remove(&ino);
        self.dirs.forget(ino);
        Ok(())
    }

    pub(crate) fn truncate(&mut self, ino: u64, size: u64) -> Result<()> {
        let old = self.inode(ino)?.size;
        if size > inode::MAX_BLOCKS * BS {
            return Err(Errno::EFBIG.into());
        }
        if size < old {
            let keep = size.div_ceil(BS);
            self.map(ino)?;
            let gone: Vec<u64> = self.map(ino)?.range(keep..).map(|(&l, _)| l).collect();
            for l in gone {
                let a = self.set_map(ino, l, 0)?;
                self.kill(a, BLOCK_SIZE as u32);
            }
            self.dirty.drop_blocks_from(ino, keep);
            let tail = (size % BS) as usize;
            if tail != 0 {
                let lbn = size / BS;
                let has = self.dirty.has_block(ino, lbn) || self.map(ino)?.contains_key(&lbn);
                if has {
                    let mut b = self.read_file_block(ino, lbn)?;
                    b[tail..].fill(0);
                    self.write_file_block(ino, lbn, b);
                }
            }
        }
        let t = now();
        let n = self.inode(ino)?;
        n.size = size;
        n.mtime = t;
        n.ctime = t;
        self.mark_dirty(ino);
        Ok(())
    }

    pub(crate) fn do_write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        if end > inode::MAX_BLOCKS * BS {
            return Err(Errno::EFBIG.into());
        }
        if data.is_empty() {
            return Ok(0);
        }
        self.ensure_space(data.len() as u64 + BS)?;
        self.map(ino)?;
        let mut pos = offset;
        let mut done = 0usize;
        while done < data.len() {
            let lbn = pos / BS;
            let in_blk = (pos % BS) as usize;
            let n = (BLOCK_SIZE - in_blk).min(data.len() - done);
            let mut b = if n == BLOCK_SIZE {
                vec![0u8; BLOCK_SIZE]
            } else {
                self.read_file_block(ino, lbn)?
            };
            b[in_blk..in_blk + n].copy_from_slice(&data[done..done + n]);
            self.write_file_block(ino, lbn, b);
            pos += n as u64;
            done += n;
        }
        let t = now();
        let node = self.inode(ino)?;
        node.size = node.size.max(end);
        node.mtime = t;
        node.ctime = t;
        Ok(data.len() as u32)
    }

    /// Is `anc` `ino` or one of its ancestors (walking `..`)?
    fn is_ancestor(&mut self, anc: u64, mut ino: u64) -> Result<bool> {
        for _ in 0..100_000 {
            if ino == anc {
                return Ok(true);
            }
            if ino == ROOT_INO {
                return Ok(false);
            }
            let up = self.dir_index(ino)?.dotdot.ino;
            if up == ino {
                return Ok(false);
            }
            ino = up;
        }
        Err(corrupt("directory loop"))
    }

    fn do_rename(
        &mut self,
        ctx: &Ctx,
        parent: u64,
        name: &OsStr,
        np: u64,
        nname: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        let (n, nn) = (perm::check_name(name)?, perm::check_name(nname)?);
        if perm::is_dot(n) || perm::is_dot(nn) {
            return Err(Errno::EINVAL.into());
        }
        let whiteout = perm::rename_flags(ctx, flags)?;
        // vfs_rename's checks: the source may be removed from its directory; the target,
        // if any, from its own, else a name may be added there.
        self.dir_checked(ctx, parent, Access::X)?;
        self.dir_checked(ctx, np, Access::X)?;
        let src = self.dir_get(parent, n)?.ok_or(Errno::ENOENT)?;
        let dst = self.dir_get(np, nn)?;
        let s = self.inode(src.ino)?.clone();
        self.may_delete(ctx, parent, &s)?;
        match dst {
            Some(d) => {
                let di = self.inode(d.ino)?.clone();
                self.may_delete(ctx, np, &di)?;
            }
            None => {
                self.may(ctx, np, Access::WX)?;
            }
        }
        if flags.exchange {
            let d = dst.ok_or(Errno::ENOENT)?;
            if d.ino == src.ino {
                return Ok(());
            }
            let di = self.inode(d.ino)?.clone();
            if parent != np {
                for (x, to) in [(&s, np), (&di, parent)] {
                    if is_dir(x) {
                        if self.is_ancestor(x.ino, to)? {
                            return Err(Errno::EINVAL.into());
                        }
                        self.may(ctx, x.ino, Access::W)?;
                    }
                }
            }
            self.log_op(Op::Rename, true, parent, d.ino, n);
            self.log_op(Op::Rename, true, np, src.ino, nn);
            self.dir_repoint(parent, n, d.ino, dtype(di.mode))?;
            self.dir_repoint(np, nn, src.ino, dtype(s.mode))?;
            if parent != np {
                if is_dir(&s) {
                    self.dir_repoint(src.ino, b"..", np, libc::DT_DIR)?;
                    self.inode(parent)?.nlink -= 1;
                    self.inode(np)?.nlink += 1;
                }
                if is_dir(&di) {
                    self.dir_repoint(d.ino, b"..", parent, libc::DT_DIR)?;
                    self.inode(np)?.nlink -= 1;
                    self.inode(parent)?.nlink += 1;
                }
            }
            let t = now();
            for i in [src.ino, d.ino] {
                self.inode(i)?.ctime = t;
                self.mark_dirty(i);
            }
            self.touch_dir(parent)?;
            self.touch_dir(np)?;
            return Ok(());
        }
        if let Some(d) = dst {
            if flags.noreplace {
                return Err(Errno::EEXIST.into());
            }
            if d.ino == src.ino {
                return Ok(());
            }
            let di = self.inode(d.ino)?.clone();
            match (is_dir(&s), is_dir(&di)) {
                (true, false) => return Err(Errno::ENOTDIR.into()),
                (false, true) => return Err(Errno::EISDIR.into()),
                (true, true) if !self.dir_index(d.ino)?.is_empty() => {
                    return Err(Errno::ENOTEMPTY.into());
                }
                _ => {}
            }
        }
        if is_dir(&s) && parent != np {
            if self.is_ancestor(src.ino, np)? {
                return Err(Errno::EINVAL.into());
            }
            self.may(ctx, src.ino, Access::W)?;
            if dst.is_none() && self.inode(np)?.nlink >= LINK_MAX {
                return Err(Errno::EMLINK.into());
            }
        }
        if dst.is_none() || whiteout.is_some() {
            self.ensure_space(2 * BS)?;
        }
        // RENAME_WHITEOUT: the whiteout's inode (owned by the caller), named below by the
        // old name in place of its removal; the call is one log write, so a crash shows
        // the rename with its whiteout or neither.
        let wh = match whiteout {
            Some(m) => Some(self.new_inode(ctx, parent, m.mode, 0, m.rdev)?),
            None => None,
        };
        // The record first (004 §4.2), then the entries.
        self.log_op(Op::Rename, true, parent, src.ino, n);
        self.log_op(Op::Rename, false, np, src.ino, nn);
        if let Some(wh) = wh {
            self.log_op(Op::Create, false, parent, wh, n);
        }
        let t = now();
        if let Some(d) = dst {
            self.dir_repoint(np, nn, src.ino, dtype(s.mode))?;
            let dn = self.inode(d.ino)?;
            if dn.mode & libc::S_IFMT == libc::S_IFDIR {
                dn.nlink = 0;
                self.inode(np)?.nlink -= 1;
            } else {
                dn.nlink -= 1;
            }
            self.inode(d.ino)?.ctime = t;
            self.mark_dirty(d.ino);
        } else {
            self.dir_add(np, nn, src.ino, dtype(s.mode))?;
        }
        match wh {
            Some(wh) => self.dir_repoint(parent, n, wh, libc::DT_CHR)?,
            None => self.dir_remove(parent, n)?,
        }
        if is_dir(&s) && parent != np {
            self.dir_repoint(src.ino, b"..", np, libc::DT_DIR)?;
            self.inode(parent)?.nlink -= 1;
            self.inode(np)?.nlink += 1;
        }
        self.inode(src.ino)?.ctime = t;
        self.mark_dirty(src.ino);
        self.touch_dir(parent)?;
        self.touch_dir(np)?;
        if let Some(d) = dst {
            self.maybe_free(d.ino)?;
        }
        Ok(())
    }

    pub(crate) fn load_xattrs(&mut self, ino: u64) -> Result<&mut BTreeMap<Vec<u8>, Vec<u8>>> {
        if self.node(ino)?.xattrs.is_none() {
            let a = self.node(ino)?.inode.xattr;
            let x = if a == 0 {
                BTreeMap::new()
            } else {
                read_xattr_chain(a, |b| self.read_block(b))?.0
            };
            self.node(ino)?.xattrs = Some(x);
        }
        Ok(self.node(ino)?.xattrs.as_mut().expect("loaded above"))
    }
}

impl Lfs {
    fn run<T>(&self, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let mut st = self.st.lock();
        let r = f(&mut st);
        let mut wake = false;
        if r.is_ok() {
            match st.maybe_flush(&self.opts) {
                Ok(w) => wake = w,
                Err(e) => ::log::warn!("lfs flush: {e}"),
            }
        }
        let seq = st.log.sequencer.clone();
        drop(st);
        if wake {
            if self.opts.syncer {
                // The background cleaner (`Lfs::clean_in_background`), at once rather than
                // at the syncer's next tick.
                self.stop.1.notify_one();
            } else {
                // No syncer to wake (`background_inline`): its passes, here, the lock let
                // go as the syncer's would find it.
                self.background_inline();
            }
        }
        // A log writer far behind slows the calls (after the lock, so only this one).
        if let Some(q) = seq
            && let Err(e) = q.throttle()
        {
            ::log::warn!("lfs: {e}");
        }
        r
    }

    fn run_rw<T>(&self, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        if self.opts.read_only {
            return Err(Errno::EROFS.into());
        }
        self.st.lock().check_log_ok()?;
        self.run(f)
    }
}

impl Lfs {
    /// `write(2)` (`back`: false) or the kernel's write-back of pages it already accepted
    /// (`back`: true, which may use the write-back reserve).
    fn write_as(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8], back: bool) -> Result<u32> {
        self.run_making_room(|st| self.write_locked(st, ino, fh, offset, data, back))
    }

    /// Runs `f` — a call that asks for room (`State::ensure_space`) — as a write short of
    /// room must: while a background cleaning pass runs (or holds the room it reserved
    /// between its lock holds), the call waits for the pass to end and tries again, up to
    /// `CLEANER_WAIT`; then it cleans in the foreground. The one rule for every caller that
    /// needs room — writes, the calls that make a name (create, mkdir, mknod, symlink,
    /// link), an open's question "is the room short?" — so none fails with ENOSPC while a
    /// background pass holds the room it is about to give back (a create right after an
    /// `rm` on a nearly full disk did, under load).
    fn run_making_room<T>(&self, f: impl Fn(&mut State) -> Result<T>) -> Result<T> {
        let deadline = std::time::Instant::now() + CLEANER_WAIT;
        // How long the last wait for a pass took, counted in the next hold.
        let waited = std::cell::Cell::new(None);
        loop {
            let seen = *self.passes.0.lock();
            let wait =
                self.opts.syncer && !self.opts.read_only && std::time::Instant::now() < deadline;
            let deferred = std::cell::Cell::new(false);
            let pass = !self.opts.read_only && std::time::Instant::now() < deadline;
            let r = self.run_rw(|st| {
                if let Some(t) = waited.take() {
                    st.cleaner.waited_for_room(t);
                }
                st.may_wait_for_cleaner = wait;
                st.may_wait_for_pass = pass;
                let r = f(st);
                st.may_wait_for_cleaner = false;
                st.may_wait_for_pass = false;
                deferred.set(std::mem::take(&mut st.cleaner_deferred));
                r
            });
            if !deferred.get() {
                return r;
            }
            // The syncer starts a run now if it is not in one.
            self.stop.1.notify_one();
            let (m, cv) = &self.passes;
            let t = std::time::Instant::now();
            let mut n = m.lock();
            self.room_waiters.fetch_add(1, Ordering::Relaxed);
            while *n == seen {
                if cv.wait_until(&mut n, deadline).timed_out() {
                    break;
                }
            }
            self.room_waiters.fetch_sub(1, Ordering::Relaxed);
            waited.set(Some(t));
        }
    }

    fn write_locked(
        &self,
        st: &mut State,
        ino: Ino,
        fh: Fh,
        offset: u64,
        data: &[u8],
        back: bool,
    ) -> Result<u32> {
        let flags = st.handles.flags(fh).ok_or(Errno::EBADF)?;
        // A file made immutable since it was opened takes no more writes.
        if st.inode(ino)?.flags & cairn_vfs::fileattr::IMMUTABLE != 0 {
            return Err(Errno::EPERM.into());
        }
        let off = if perm::appends(flags) {
            st.inode(ino)?.size
        } else {
            offset
        };
        // A write-back may take the reserve held for it, for this call only.
        st.dip_into_reserve = back;
        let r = st.do_write(ino, off, data);
        st.dip_into_reserve = false;
        let r = r?;
        if r > 0 {
            // Written by someone without CAP_FSETID (FUSE_HANDLE_KILLPRIV).
            let node = st.inode(ino)?;
            node.mode = perm::mode_after_data_change(flags, node.mode);
        }
        st.mark_dirty(ino);
        Ok(r)
    }
}

/// How long a write short of room waits for background cleaning passes before it cleans
/// in the foreground: each pass takes tens to hundreds of milliseconds.
const CLEANER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl FileSystem for Lfs {
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
        // As FFS's delayed modes: calls are durable at the next checkpoint or fsync, so the
        // kernel may buffer writes when the mount asks; by default they are buffered here,
        // not in the kernel, so ENOSPC is reported by write() itself.
        KernelCachePolicy::for_commit(cairn_vfs::modes::Commit::Async)
    }

    fn statfs(&self) -> Result<StatFs> {
        let st = self.st.lock();
        // Free = what a write can still be admitted for, asked of the admission rule itself
        // (`State::admissible_bytes`): not the blocks that are not live, of which the
        // reserve and the dead blocks no cleaning pass can collect are no room at all (with
        // small segments nearly full, a fifth of the disk; showing it made `df` report room
        // while writes failed with ENOSPC), nor the write-back reserve.
        let total = st.sb.segments as u64 * st.sb.segment_blocks as u64;
        let bfree = (st.admissible_bytes() / BS).min(total);
        let in_use =
            st.imap.in_use() + st.nodes.keys().filter(|&&i| st.imap.addr(i) == 0).count() as u64;
        let files = st.sb.max_inodes as u64 - 3;
        Ok(StatFs {
            blocks: total,
            bfree,
            bavail: bfree,
            files,
            ffree: files.saturating_sub(in_use),
            bsize: BLOCK_SIZE as u32,
            namelen: perm::NAME_MAX as u32,
            frsize: BLOCK_SIZE as u32,
        })
    }

    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<Attr> {
        self.run(|st| {
            let n = name.as_bytes();
            if n.len() > perm::NAME_MAX {
                return Err(Errno::ENAMETOOLONG.into());
            }
            st.dir_checked(ctx, parent, Access::X)?;
            let slot = st.dir_get(parent, n)?.ok_or(Errno::ENOENT)?;
            st.attr(slot.ino)
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.run(|st| st.attr(ino))
    }

    fn stable_numbers(&self) -> bool {
        // The inode map is indexed by number, and a freed number's version is bumped
        // (`maybe_free`), so a reused number has a new generation.
        true
    }

    fn setattr(&self, ctx: &Ctx, ino: Ino, set: SetAttr) -> Result<Attr> {
        self.run_rw(|st| {
            let cur = st.inode(ino)?.clone();
            let acl = st.acl_of(ino, cairn_vfs::acl::Kind::Access)?;
            let acl = acl.as_ref();
            let mut o = owner(&cur);
            if let Some(m) = set.mode {
                o.mode = perm::chmod(ctx, o, m)?;
            }
            if set.uid.is_some() || set.gid.is_some() {
                o = perm::chown(ctx, o, set.uid, set.gid)?;
            }
            if let Some(t) = &set.atime {
                perm::may_set_time(ctx, owner(&cur), acl, t)?;
            }
            if let Some(t) = &set.mtime {
                perm::may_set_time(ctx, owner(&cur), acl, t)?;
            }
            if let Some(size) = set.size {
                if is_dir(&cur) {
                    return Err(Errno::EISDIR.into());
                }
                if cur.mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(Errno::EINVAL.into());
                }
                perm::may_truncate(ctx, owner(&cur), acl, set.fh.is_some())?;
                if !ctx.is_root() {
                    o.mode = perm::kill_privileges(o.mode);
                }
                if size > inode::MAX_BLOCKS * BS {
                    return Err(Errno::EFBIG.into());
                }
                if size != cur.size {
                    st.truncate(ino, size)?;
                } else {
                    let t = now();
                    let n = st.inode(ino)?;
                    n.mtime = t;
                }
            }
            let t = now();
            let at = |s: &SetTime| match s {
                SetTime::Now => t,
                SetTime::At(x) => to_time(*x),
            };
            let n = st.inode(ino)?;
            n.mode = o.mode;
            n.uid = o.uid;
            n.gid = o.gid;
            if let Some(a) = &set.atime {
                n.atime = at(a);
            }
            if let Some(m) = &set.mtime {
                n.mtime = at(m);
            }
            n.ctime = set.ctime.map(to_time).unwrap_or(t);
            st.mark_dirty(ino);
            if o.mode & 0o777 != cur.mode & 0o777 {
                // The access ACL, if any, takes the new permission bits.
                st.chmod_acl(ino)?;
            }
            st.attr(ino)
        })
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.run(|st| {
            let n = st.inode(ino)?.clone();
            if n.mode & libc::S_IFMT != libc::S_IFLNK {
                return Err(Errno::EINVAL.into());
            }
            let mut b = st.read_file_block(ino, 0)?;
            b.truncate((n.size as usize).min(BLOCK_SIZE));
            Ok(b)
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
        self.run_making_room(|st| {
            // The one check both formats share (type 0 is a regular file, rdev kept for
            // devices only, devices made by root only).
            let node = cairn_vfs::perm::mknod(ctx, mode, rdev)?;
            let n = st.check_new(ctx, parent, name)?;
            let ino = st.new_node(ctx, parent, &n, node.mode, umask, node.rdev)?;
            st.attr(ino)
        })
    }

    fn mkdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr> {
        self.run_making_room(|st| {
            let n = st.check_new(ctx, parent, name)?;
            if st.inode(parent)?.nlink >= LINK_MAX {
                return Err(Errno::EMLINK.into());
            }
            let m = libc::S_IFDIR | (mode & 0o7777);
            let ino = st.new_node(ctx, parent, &n, m, umask, 0)?;
            st.attr(ino)
        })
    }

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        self.run_rw(|st| {
            let n = perm::check_name(name)?;
            st.dir_checked(ctx, parent, Access::X)?;
            let slot = st.dir_get(parent, n)?.ok_or(Errno::ENOENT)?;
            let v = st.inode(slot.ino)?.clone();
            st.may_delete(ctx, parent, &v)?;
            if is_dir(&v) {
                return Err(Errno::EISDIR.into());
            }
            let t = now();
            let vn = st.inode(slot.ino)?;
            vn.nlink -= 1;
            vn.ctime = t;
            st.mark_dirty(slot.ino);
            st.log_op(Op::Unlink, false, parent, slot.ino, n);
            st.dir_remove(parent, n)?;
            st.touch_dir(parent)?;
            st.maybe_free(slot.ino)
        })
    }

    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        self.run_rw(|st| {
            let n = perm::check_name(name)?;
            if n == b"." {
                return Err(Errno::EINVAL.into());
            }
            if n == b".." {
                return Err(Errno::ENOTEMPTY.into());
            }
            st.dir_checked(ctx, parent, Access::X)?;
            let slot = st.dir_get(parent, n)?.ok_or(Errno::ENOENT)?;
            let v = st.inode(slot.ino)?.clone();
            st.may_delete(ctx, parent, &v)?;
            if !is_dir(&v) {
                return Err(Errno::ENOTDIR.into());
            }
            if !st.dir_index(slot.ino)?.is_empty() {
                return Err(Errno::ENOTEMPTY.into());
            }
            let vn = st.inode(slot.ino)?;
            vn.nlink = 0;
            vn.ctime = now();
            st.mark_dirty(slot.ino);
            st.log_op(Op::Unlink, false, parent, slot.ino, n);
            st.dir_remove(parent, n)?;
            st.inode(parent)?.nlink -= 1;
            st.touch_dir(parent)?;
            st.maybe_free(slot.ino)
        })
    }

    fn symlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr, target: &[u8]) -> Result<Attr> {
        self.run_making_room(|st| {
            if target.is_empty() || target.len() >= BLOCK_SIZE {
                return Err(if target.is_empty() {
                    Errno::ENOENT
                } else {
                    Errno::ENAMETOOLONG
                }
                .into());
            }
            let n = st.check_new(ctx, parent, name)?;
            let ino = st.new_node(ctx, parent, &n, libc::S_IFLNK | 0o777, 0, 0)?;
            let mut b = vec![0u8; BLOCK_SIZE];
            b[..target.len()].copy_from_slice(target);
            st.write_file_block(ino, 0, b);
            st.inode(ino)?.size = target.len() as u64;
            st.attr(ino)
        })
    }

    /// The whiteout is a new inode taking the old name in the rename's own log write.
    fn supports_whiteout(&self) -> bool {
        true
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        self.run_rw(|st| st.do_rename(ctx, parent, name, new_parent, new_name, flags))
    }

    fn link(&self, ctx: &Ctx, ino: Ino, new_parent: Ino, new_name: &OsStr) -> Result<Attr> {
        self.run_making_room(|st| {
            let v = st.inode(ino)?.clone();
            // may_linkat (protected hard links), then vfs_link's rules.
            let acl = st.acl_of(ino, cairn_vfs::acl::Kind::Access)?;
            perm::may_link(ctx, owner(&v), acl.as_ref())?;
            let n = st.check_new(ctx, new_parent, new_name)?;
            if is_dir(&v) {
                return Err(Errno::EPERM.into());
            }
            if v.nlink >= LINK_MAX {
                return Err(Errno::EMLINK.into());
            }
            // An inode with no name is linked only if O_TMPFILE made it so (vfs_link).
            if v.nlink == 0 && !st.node(ino)?.linkable {
                return Err(Errno::ENOENT.into());
            }
            let vn = st.inode(ino)?;
            vn.nlink += 1;
            vn.ctime = now();
            st.mark_dirty(ino);
            st.log_op(Op::Link, false, new_parent, ino, &n);
            st.dir_add(new_parent, &n, ino, dtype(v.mode))?;
            st.touch_dir(new_parent)?;
            // Named once, a tmpfile is an ordinary file: unlinked again, it stays so.
            st.node(ino)?.linkable = false;
            st.attr(ino)
        })
    }

    fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Fh> {
        self.run(|st| {
            let n = st.inode(ino)?.clone();
            let want = Access::for_open_flags(flags);
            if is_dir(&n) && want.0 & Access::W.0 != 0 {
                return Err(Errno::EISDIR.into());
            }
            if self.opts.read_only && want.0 & Access::W.0 != 0 {
                return Err(Errno::EROFS.into());
            }
            let acl = st.acl_of(ino, cairn_vfs::acl::Kind::Access)?;
            perm::may_open(ctx, owner(&n), acl.as_ref(), flags)?;
            if flags & libc::O_TRUNC != 0 && n.mode & libc::S_IFMT == libc::S_IFREG && n.size > 0 {
                st.truncate(ino, 0)?;
                if !ctx.is_root() {
                    let node = st.inode(ino)?;
                    node.mode = perm::kill_privileges(node.mode);
                }
            }
            st.open_node(ino)?;
            let fh = st.handles.open(ino, perm::handle_flags(ctx, flags, n.gid));
            Ok(fh)
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
        self.run_making_room(|st| {
            let n = st.check_new(ctx, parent, name)?;
            let m = libc::S_IFREG | (mode & 0o7777);
            let ino = st.new_node(ctx, parent, &n, m, umask, 0)?;
            st.open_node(ino)?;
            let gid = st.attr(ino)?.gid;
            let fh = st.handles.open(ino, perm::handle_flags(ctx, flags, gid));
            Ok((st.attr(ino)?, fh))
        })
    }

    /// A new inode with no link, written to the log as any changed inode is: no directory
    /// operation names it, so roll-forward and the checkpoint's orphan list see what they
    /// see of a file unlinked while open, and the next read-write mount frees it after a
    /// crash. `link` names it as a hard link would (its operation record and the inode's
    /// raised count in one log write).
    fn tmpfile(
        &self,
        ctx: &Ctx,
        parent: Ino,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        self.run_making_room(|st| {
            st.dir_checked(ctx, parent, Access::WX)?;
            if st.inode(parent)?.nlink == 0 {
                return Err(Errno::ENOENT.into());
            }
            st.ensure_space(2 * BS)?;
            let ino = st.new_inode(ctx, parent, libc::S_IFREG | (mode & 0o7777), umask, 0)?;
            let node = st.open_node(ino)?;
            node.inode.nlink = 0;
            node.linkable = flags & libc::O_EXCL == 0;
            let gid = node.inode.gid;
            let fh = st.handles.open(ino, perm::handle_flags(ctx, flags, gid));
            Ok((st.attr(ino)?, fh))
        })
    }

    fn read(&self, ino: Ino, _fh: Fh, offset: u64, size: u32, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        // Under the lock: the block addresses, what memory holds, the segments pinned.
        // Without it: the device reads (`ReadPlan`), so a read never waits behind another
        // call's device I/O, nor makes one wait behind its own.
        let planned = self.run(|st| {
            let n = st.inode(ino)?.clone();
            if is_dir(&n) {
                return Err(Errno::EISDIR.into());
            }
            let end = (offset.saturating_add(size as u64)).min(n.size);
            if offset >= end {
                return Ok(None);
            }
            // The whole request at once, so blocks next to each other in the log come in
            // one device read, with the read-ahead window of a sequential reader.
            let (first, last) = (offset / BS, (end - 1) / BS);
            let max = st.readahead_blocks;
            let ahead = st.node(ino)?.ra.plan(first, last - first + 1, max);
            let plan = st.plan_read(ino, first, last - first + 1, ahead)?;
            Ok(Some((plan, first, end, n)))
        })?;
        let Some((plan, first, end, n)) = planned else {
            return Ok(());
        };
        #[cfg(test)]
        if let Some(h) = &*self.read_hook.lock() {
            h();
        }
        let mut b = plan.read()?;
        let from = (offset - first * BS) as usize;
        // The blocks read become the reply (no second copy of the request): only a
        // request that does not start on a block boundary moves its bytes down.
        b.truncate(from + (end - offset) as usize);
        if from > 0 {
            b.drain(..from);
        }
        *buf = b;
        // The mount's atime option (relatime by default); the inode goes out with the
        // next flush, as any change. The lock again only when the time changes.
        let ns = |t: Time| t.sec as i128 * 1_000_000_000 + t.nsec as i128;
        let t = now();
        if !self.opts.read_only
            && self
                .atime
                .lock()
                .updates(ns(n.atime), ns(n.mtime), ns(n.ctime), ns(t))
        {
            self.run(|st| {
                // Freed meanwhile: nothing to stamp.
                if let Some(node) = st.nodes.get_mut(&ino) {
                    node.inode.atime = t;
                    st.mark_dirty(ino);
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn set_atime(&self, policy: cairn_vfs::Atime) {
        *self.atime.lock() = policy;
    }

    fn write(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_as(ino, fh, offset, data, false)
    }

    fn write_back(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_as(ino, fh, offset, data, true)
    }

    fn set_writeback_reserve(&self, bytes: u64) {
        // Every block written costs room in the log (an overwrite too), plus its share of
        // summaries and the inode's indirect blocks.
        self.st.lock().writeback_reserve = bytes + bytes / 8 + 4 * BS;
    }

    fn room_is_short(&self) -> bool {
        let short = {
            let st = self.st.lock();
            st.space_left() < 2 * st.writeback_reserve
        };
        if !short || self.opts.read_only {
            return short;
        }
        // The clean segments alone are short; the room may still be on its way: segments
        // whose blocks all died (an `rm`) are clean once a checkpoint records them so, and
        // dead blocks in partly live ones once a pass cleans them. Ask as a write of the
        // reserve would (`ensure_space`, which adds the reserve itself: twice the reserve
        // in all), checkpointing, waiting for the background cleaner or cleaning: otherwise
        // every open after an `rm` on a nearly full disk would get no page cache, and be
        // refused a shared mapping, until the syncer's next round. Only on a nearly full
        // disk does an open pay for it.
        self.run_making_room(|st| {
            let reserve = st.writeback_reserve;
            st.ensure_space(reserve)
        })
        .is_err()
    }

    /// Nothing to do at close(2): a write is in the engine's memory when `write` returns
    /// (with the kernel writeback cache on, the kernel writes its dirty pages back before
    /// it would send FLUSH, FLUSH or not), durability is fsync's or the syncer's job, and an
    /// unlinked file is freed at release. ENOSYS tells the kernel so once; it then stops
    /// sending FLUSH on every close (`fc->no_flush`), one round trip less per file, as the
    /// FFS engine does.
    fn flush(&self, _ino: Ino, _fh: Fh) -> Result<()> {
        Err(Errno::ENOSYS.into())
    }

    fn release(&self, ino: Ino, fh: Fh) -> Result<()> {
        self.run(|st| {
            st.handles.close(fh);
            st.close_node(ino);
            if self.opts.read_only {
                return Ok(());
            }
            st.maybe_free(ino)
        })
    }

    fn fsync(&self, _ino: Ino, _fh: Fh, _datasync: bool) -> Result<()> {
        if self.opts.read_only {
            return Ok(());
        }
        // One committed flush of everything dirty and a device flush: roll-forward recovers
        // it without a checkpoint (004 §4.2).
        // The flush's partial segments sealed under the lock; their device writes (the
        // sequencer's, `sequencer.rs`) and the device flush without it: a device flush
        // makes every completed write durable.
        // Short of room only while a cleaning pass holds what it reserved, the flush waits
        // for the pass as a write does (`State::room_for_flush`).
        let (dev, barrier) = self.run_making_room(|st| {
            st.flush()?;
            let barrier = st.log.barrier();
            let barrier = barrier.filter(|_| !planted!(st, FlushBeforeLogWrites));
            Ok((std::sync::Arc::clone(&st.dev), barrier))
        })?;
        if let Some((q, upto)) = barrier {
            q.wait(upto)?;
        }
        dev.flush()?;
        Ok(())
    }

    fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<Fh> {
        self.run(|st| {
            st.dir_checked(ctx, ino, Access::R)?;
            let fh = st.handles.number();
            // An open directory outlives its removal (rmdir, or a rename over it), as an
            // open file does: fstat of it still answers, with no link (fstests' generic/035).
            st.open_node(ino)?;
            Ok(fh)
        })
    }

    fn releasedir(&self, ino: Ino, _fh: Fh) -> Result<()> {
        self.run(|st| {
            st.close_node(ino);
            if self.opts.read_only {
                return Ok(());
            }
            st.maybe_free(ino)
        })
    }

    fn readdir(
        &self,
        ino: Ino,
        _fh: Fh,
        offset: u64,
        plus: bool,
        emit: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.run(|st| {
            // Cookies: 1 after `.`, 2 after `..`, 3 + byte position for the others.
            let parent = st.dir_index(ino)?.dotdot.ino;
            for (i, (name, target)) in [(".", ino), ("..", parent)].into_iter().enumerate() {
                if offset <= i as u64 {
                    let attr = if plus { Some(st.attr(target)?) } else { None };
                    let e = DirEntry {
                        ino: target,
                        next_offset: i as u64 + 1,
                        kind: FileKind::Directory,
                        name: OsStr::new(name),
                        attr,
                    };
                    if !emit(e) {
                        return Ok(());
                    }
                }
            }
            let nblocks = st.dir_index(ino)?.nblocks;
            let start = offset.saturating_sub(3) / BS;
            for lbn in start..nblocks {
                let b = st.read_file_block(ino, lbn)?;
                for r in block::entries(&b) {
                    let e = r.map_err(corrupt)?;
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let cookie = 3 + lbn * BS + e.off as u64;
                    if cookie < offset.max(3) {
                        continue;
                    }
                    let attr = if plus {
                        Some(st.attr(e.ino as u64)?)
                    } else {
                        None
                    };
                    let de = DirEntry {
                        ino: e.ino as u64,
                        next_offset: cookie + 1,
                        kind: FileKind::from_dtype(e.dtype).unwrap_or(FileKind::RegularFile),
                        name: OsStr::from_bytes(e.name),
                        attr,
                    };
                    if !emit(de) {
                        return Ok(());
                    }
                }
            }
            Ok(())
        })
    }

    fn fsyncdir(&self, ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        self.fsync(ino, fh, datasync)
    }

    fn setxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.run_rw(|st| {
            let cur = st.inode(ino)?.clone();
            let n = name.as_bytes();
            let acl = st.acl_of(ino, cairn_vfs::acl::Kind::Access)?;
            perm::xattr_access(ctx, owner(&cur), acl.as_ref(), n, XattrOp::Set)?;
            if value.len() > XATTR_SIZE_MAX {
                return Err(Errno::E2BIG.into());
            }
            if let Some(kind) = cairn_vfs::acl::Kind::of_xattr(n) {
                return st.set_acl(ctx, ino, kind, Some(value));
            }
            let x = st.load_xattrs(ino)?;
            let exists = x.contains_key(n);
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(Errno::EEXIST.into());
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(Errno::ENODATA.into());
            }
            let mut next = x.clone();
            next.insert(n.to_vec(), value.to_vec());
            st.replace_xattrs(ino, next, None, true)
        })
    }

    fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        self.run(|st| {
            let cur = st.inode(ino)?.clone();
            let n = name.as_bytes();
            let acl = st.acl_of(ino, cairn_vfs::acl::Kind::Access)?;
            perm::xattr_access(ctx, owner(&cur), acl.as_ref(), n, XattrOp::Get)?;
            st.load_xattrs(ino)?
                .get(n)
                .cloned()
                .ok_or(Errno::ENODATA.into())
        })
    }

    fn listxattr(&self, _ctx: &Ctx, ino: Ino) -> Result<Vec<u8>> {
        self.run(|st| {
            let mut out = Vec::new();
            for k in st.load_xattrs(ino)?.keys() {
                out.extend_from_slice(k);
                out.push(0);
            }
            Ok(out)
        })
    }

    fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<()> {
        self.run_rw(|st| {
            let cur = st.inode(ino)?.clone();
            let n = name.as_bytes();
            let acl = st.acl_of(ino, cairn_vfs::acl::Kind::Access)?;
            if !perm::xattr_access(ctx, owner(&cur), acl.as_ref(), n, XattrOp::Remove)? {
                return Ok(());
            }
            if let Some(kind) = cairn_vfs::acl::Kind::of_xattr(n) {
                return st.set_acl(ctx, ino, kind, None);
            }
            let mut next = st.load_xattrs(ino)?.clone();
            if next.remove(n).is_none() {
                return Err(Errno::ENODATA.into());
            }
            st.replace_xattrs(ino, next, None, true)
        })
    }

    fn access(&self, ctx: &Ctx, ino: Ino, mask: Access) -> Result<()> {
        self.run(|st| st.may(ctx, ino, mask).map(|_| ()))
    }

    fn get_flags(&self, _ctx: &Ctx, ino: Ino) -> Result<u32> {
        self.run(|st| Ok(st.inode(ino)?.flags))
    }

    fn getattr_flags(&self, _ctx: &Ctx, ino: Ino) -> Result<(Attr, Result<u32>)> {
        self.run(|st| Ok((st.attr(ino)?, Ok(st.inode(ino)?.flags))))
    }

    fn set_flags(&self, ctx: &Ctx, ino: Ino, flags: u32) -> Result<()> {
        self.run_rw(|st| st.set_flags(ctx, ino, flags))
    }

    fn fallocate(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: FallocMode,
    ) -> Result<()> {
        self.run_rw(|st| {
            let handle_flags = st.handles.flags(fh).unwrap_or(0);
            st.fallocate(ino, offset, length, mode)?;
            let node = st.inode(ino)?;
            node.mode = perm::mode_after_data_change(handle_flags, node.mode);
            st.mark_dirty(ino);
            Ok(())
        })
    }

    fn sync_all(&self) -> Result<()> {
        self.checkpoint()
    }

    fn destroy(&self) -> Result<()> {
        if self.destroyed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.stop_syncer();
        self.st.lock().checkpoint()
    }

    fn stats_json(&self) -> String {
        let s = self.lfs_stats();
        let st = self.st.lock();
        // Dirty segments by utilization, in tenths (004 Figs. 5, 6 and 10).
        let seg = st.sb.segment_blocks as u64 * BS;
        let mut hist = [0u32; 10];
        for u in st.usage.iter().filter(|u| u.dirty) {
            hist[((u.live_bytes as u64 * 10 / seg) as usize).min(9)] += 1;
        }
        serde_json::json!({
            "format": "lfs",
            "device": st.dev.counters().snapshot(),
            "disk": st.dev.disk_stats(),
            "lfs": s,
            "cleaner": st.cleaner,
            "cleaner_policy": st.policy.name(),
            "write_cost": if s.new_data_blocks == 0 { 1.0 } else {
                (s.new_data_blocks + st.cleaner.blocks_read + st.cleaner.blocks_moved) as f64
                    / s.new_data_blocks as f64
            },
            "segments": st.sb.segments,
            "clean_segments": st.clean_segments(),
            "utilization_histogram": hist,
            "log_head": [st.log.seg, st.log.off],
            "checkpoint_serial": st.cp.serial(),
        })
        .to_string()
    }
}
