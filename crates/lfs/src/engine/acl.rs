//! POSIX ACLs, inode flags and the fallocate range operations of the log-structured format.
//!
//! The rules are `cairn_vfs`'s (`perm`, `acl`, `fileattr`, `falloc`), as in the FFS
//! format; this module finds their inputs in the in-memory state. ACLs are extended
//! attributes (the node's xattr map, written as the inode's xattr block at the next
//! flush), flags the inode record's `flags` word.
//!
//! Crash safety needs nothing of its own here: a call changes the in-memory state only,
//! whole (everything that can fail is checked first), and a flush puts the xattr block and
//! the inode record carrying the mode in one committed unit of the log, which roll-forward
//! applies whole or not at all (004 §4.2). So an access ACL and the mode computed from it,
//! like any two changes of one call, are on disk together or not at all.

use std::collections::BTreeMap;

use cairn_vfs::acl::{self, Acl};
use cairn_vfs::falloc::Falloc;
use cairn_vfs::{Access, Ctx, Result};

use super::ops::owner;
use crate::format::summary::{Entry, Kind};

use super::{
    BS, State, corrupt, encode_xattr_blocks, now, read_xattr_chain, set_chain_next,
    xattr_blocks_needed,
};
use crate::format::BLOCK_SIZE;
use crate::format::inode::{self, Inode};
use cairn_vfs::Errno;

/// A node's extended attributes: name to value.
type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// The ACL of kind `kind` among `x`, decoded; a stored value that is not a valid ACL is
/// corruption (named by `cairn_vfs::acl::find`, as in the FFS format).
pub(crate) fn find_acl(ino: u64, x: &Xattrs, kind: acl::Kind) -> Result<Option<Acl>> {
    acl::find(ino, x, kind).map_err(|e| corrupt(e.to_string()))
}

impl State {
    /// The ACL of kind `kind` of inode `ino` (its xattr block read on first use only if
    /// it has one).
    pub(crate) fn acl_of(&mut self, ino: u64, kind: acl::Kind) -> Result<Option<Acl>> {
        let n = self.node(ino)?;
        if n.xattrs.is_none() && n.inode.xattr == 0 {
            return Ok(None);
        }
        find_acl(ino, self.load_xattrs(ino)?, kind)
    }

    /// `perm`'s check against inode `ino` with its access ACL and flags; returns the inode.
    pub(crate) fn may(&mut self, ctx: &Ctx, ino: u64, want: Access) -> Result<Inode> {
        let n = self.node(ino)?.inode.clone();
        if want.0 != 0 {
            let a = self.acl_of(ino, acl::Kind::Access)?;
            ctx.permission(owner(&n), a.as_ref(), want)?;
        }
        Ok(n)
    }

    /// `perm::may_delete` for the entry naming `victim` in directory `dir`.
    pub(crate) fn may_delete(&mut self, ctx: &Ctx, dir: u64, victim: &Inode) -> Result<()> {
        let d = self.node(dir)?.inode.clone();
        let a = self.acl_of(dir, acl::Kind::Access)?;
        cairn_vfs::perm::may_delete(ctx, owner(&d), a.as_ref(), owner(victim))
    }

    /// A new inode's mode and inherited ACLs in directory `parent` (see the FFS format's
    /// `Ffs::inherit`: `posix_acl_create`).
    pub(crate) fn inherit(&mut self, parent: u64, mode: u32, umask: u32) -> Result<(u32, Xattrs)> {
        let default = if mode & libc::S_IFMT == libc::S_IFLNK {
            None
        } else {
            self.acl_of(parent, acl::Kind::Default)?
        };
        let i = acl::inherit(default.as_ref(), mode, umask);
        Ok((i.mode, i.xattrs().into_iter().collect()))
    }

    /// Sets (`value` Some) or removes an ACL of `ino` (the caller checked the right to):
    /// an access ACL sets the mode's permission bits, S_ISGID goes unless the caller is
    /// root or in the group, and one the mode says entirely is not stored
    /// (`posix_acl_update_mode`); a header without entries, or a removal of none, removes
    /// it without error.
    pub(crate) fn set_acl(
        &mut self,
        ctx: &Ctx,
        ino: u64,
        kind: acl::Kind,
        value: Option<&[u8]>,
    ) -> Result<()> {
        let acl = match value {
            Some(v) => Acl::decode(v)?,
            None => None,
        };
        let cur = self.node(ino)?.inode.clone();
        let mut next = self.load_xattrs(ino)?.clone();
        let mut mode = cur.mode;
        match (kind, &acl) {
            (acl::Kind::Access, Some(a)) => {
                let (m, store) = acl::update_mode(ctx, a, cur.mode, cur.gid);
                mode = m;
                acl::put(&mut next, kind, store.then_some(a));
            }
            _ => acl::put(&mut next, kind, acl.as_ref()),
        }
        self.replace_xattrs(ino, next, Some(mode), value.is_some())
    }

    /// Makes `next` the xattrs of `ino` (and `mode` its mode), refusing with ENOSPC
    /// before any change when they do not fit a block. `touch`: change the ctime even if
    /// nothing else changes.
    pub(crate) fn replace_xattrs(
        &mut self,
        ino: u64,
        next: Xattrs,
        mode: Option<u32>,
        touch: bool,
    ) -> Result<()> {
        if xattr_blocks_needed(&next).is_none() {
            return Err(Errno::ENOSPC.into());
        }
        let same = self.load_xattrs(ino)? == &next;
        let node = self.node(ino)?;
        let mode_changed = mode.is_some_and(|m| m != node.inode.mode);
        if same && !mode_changed && !touch {
            return Ok(());
        }
        if !same {
            node.xattrs = Some(next);
            node.xattr_dirty = true;
        }
        if let Some(m) = mode {
            node.inode.mode = m;
        }
        node.inode.ctime = now();
        self.mark_meta_dirty(ino);
        Ok(())
    }

    /// The flush's part for `ino`'s attributes when they changed: the whole list to the log
    /// (a single block, or a chain written last block first, so each block names the
    /// address its successor already has), the inode pointed at its head, the old blocks
    /// dead. The inode record follows in the same flush, which roll-forward applies whole.
    pub(crate) fn write_xattr_blocks(&mut self, ino: u64) -> Result<()> {
        let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        if !n.xattr_dirty {
            return Ok(());
        }
        n.xattr_dirty = false;
        let x = n.xattrs.clone().unwrap_or_default();
        let version = n.inode.version;
        let old_head = n.inode.xattr;
        let old = if old_head == 0 {
            Vec::new()
        } else {
            read_xattr_chain(old_head, |a| self.read_block(a))?.1
        };
        let mut blocks = encode_xattr_blocks(&x);
        if blocks.is_empty() && !x.is_empty() {
            return Err(corrupt(format!(
                "inode {ino}: attributes past what a chain holds"
            )));
        }
        let mut next = 0;
        for (i, mut b) in blocks.drain(..).enumerate().rev() {
            if next != 0 {
                set_chain_next(&mut b, next);
            }
            let e = Entry {
                kind: Kind::Xattr,
                version,
                ino,
                lbn: i as u64,
            };
            next = self.push(e, b, BLOCK_SIZE as u32)?;
        }
        let count = xattr_blocks_needed(&x).unwrap_or(0) as u64;
        let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        n.inode.xattr = next;
        n.inode.blocks = (n.inode.blocks + count).saturating_sub(old.len() as u64);
        for a in old {
            self.kill(a, BLOCK_SIZE as u32);
        }
        Ok(())
    }

    /// Whether log block `addr` holds part of `ino`'s attributes as the inode names them
    /// (the cleaner's liveness test of an xattr block: the head or any block of its chain).
    pub(crate) fn xattr_live(&mut self, ino: u64, addr: u64) -> Result<bool> {
        let head = self.node(ino)?.inode.xattr;
        if head == 0 || head == addr {
            return Ok(head != 0);
        }
        Ok(read_xattr_chain(head, |a| self.read_block(a))?
            .1
            .contains(&addr))
    }

    /// chmod of `ino`, whose mode is already the new one: its access ACL (if any) takes
    /// the new permission bits (`posix_acl_chmod`).
    pub(crate) fn chmod_acl(&mut self, ino: u64) -> Result<()> {
        let Some(mut a) = self.acl_of(ino, acl::Kind::Access)? else {
            return Ok(());
        };
        let mode = self.node(ino)?.inode.mode;
        a.chmod(mode);
        let mut next = self.load_xattrs(ino)?.clone();
        acl::put(&mut next, acl::Kind::Access, Some(&a));
        self.replace_xattrs(ino, next, None, false)
    }

    /// `FS_IOC_SETFLAGS`.
    pub(crate) fn set_flags(&mut self, ctx: &Ctx, ino: u64, flags: u32) -> Result<()> {
        let cur = self.node(ino)?.inode.clone();
        let flags = cairn_vfs::fileattr::set_flags(ctx, owner(&cur), flags)?;
        if flags != cur.flags {
            let n = self.inode_mut(ino)?;
            n.flags = flags;
            n.ctime = now();
            self.mark_dirty(ino);
        }
        Ok(())
    }

    fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode> {
        Ok(&mut self.node(ino)?.inode)
    }

    /// Logical block `lbn` of `ino` becomes a hole.
    fn punch_block(&mut self, ino: u64, lbn: u64) -> Result<()> {
        self.dirty.drop_block(ino, lbn);
        if self.map(ino)?.contains_key(&lbn) {
            let a = self.set_map(ino, lbn, 0)?;
            self.kill(a, BLOCK_SIZE as u32);
        }
        Ok(())
    }

    /// Bytes `from..to` of `ino` read as zeros: whole blocks become holes, partial ones
    /// are rewritten.
    fn zero_bytes(&mut self, ino: u64, from: u64, to: u64, punch: bool) -> Result<()> {
        let mut pos = from;
        while pos < to {
            let lbn = pos / BS;
            let in_blk = (pos % BS) as usize;
            let n = (BLOCK_SIZE - in_blk).min((to - pos) as usize);
            let mapped = self.dirty.has_block(ino, lbn) || self.map(ino)?.contains_key(&lbn);
            if n == BLOCK_SIZE && punch {
                self.punch_block(ino, lbn)?;
            } else if n == BLOCK_SIZE {
                self.write_file_block(ino, lbn, vec![0u8; BLOCK_SIZE]);
            } else if mapped || !punch {
                let mut b = self.read_file_block(ino, lbn)?;
                b[in_blk..in_blk + n].fill(0);
                self.write_file_block(ino, lbn, b);
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// Logical block `from` of `ino` copied to `to` (a hole as a hole). Blocks are
    /// rewritten, never re-pointed: the log's summary names each block's (inode, block),
    /// and the cleaner keeps a block only while the map still points to it under that name.
    fn copy_block(&mut self, ino: u64, from: u64, to: u64) -> Result<()> {
        let mapped = self.dirty.has_block(ino, from) || self.map(ino)?.contains_key(&from);
        if !mapped {
            return self.punch_block(ino, to);
        }
        let b = self.read_file_block(ino, from)?;
        self.write_file_block(ino, to, b);
        Ok(())
    }

    /// fallocate(2) of `ino`: `falloc`'s rules first, room for every block the call may
    /// write (ENOSPC before any change), then the operation in memory.
    pub(crate) fn fallocate(
        &mut self,
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<()> {
        let op = Falloc::decode(mode)?;
        let cur = self.node(ino)?.inode.clone();
        op.check(
            owner(&cur),
            cur.size,
            offset,
            length,
            BS,
            inode::MAX_BLOCKS * BS,
        )?;
        let end = offset + length;
        let size = cur.size;
        // What the call may write: the range (allocate, zero), or the file's blocks after
        // it (collapse, insert), and an indirect block's worth.
        let writes = match op {
            Falloc::PunchHole => 2 * BS,
            Falloc::CollapseRange | Falloc::InsertRange => size.saturating_sub(offset),
            _ => length,
        };
        self.ensure_space(writes.saturating_add(BS))?;
        self.map(ino)?;
        let grow = |st: &mut State, keep_size: bool| -> Result<()> {
            if !keep_size && end > size {
                // Bytes past the old end in its last block read as zeros already (every
                // truncation zeroes them).
                st.inode_mut(ino)?.size = end;
            }
            Ok(())
        };
        let t = now();
        match op {
            Falloc::Allocate { keep_size } => {
                // A log cannot reserve places ahead of time: the range's holes are filled
                // with zero blocks (written at the next flush), so the space is taken now.
                for lbn in offset / BS..end.div_ceil(BS) {
                    if !self.dirty.has_block(ino, lbn) && !self.map(ino)?.contains_key(&lbn) {
                        self.write_file_block(ino, lbn, vec![0u8; BLOCK_SIZE]);
                    }
                }
                grow(self, keep_size)?;
            }
            Falloc::PunchHole => {
                self.zero_bytes(ino, offset, end.min(size), true)?;
                self.inode_mut(ino)?.mtime = t;
            }
            Falloc::ZeroRange { keep_size } => {
                self.zero_bytes(ino, offset, end, false)?;
                grow(self, keep_size)?;
                self.inode_mut(ino)?.mtime = t;
            }
            Falloc::CollapseRange => {
                let (at, n, last) = (offset / BS, length / BS, size.div_ceil(BS));
                for lbn in at..last - n {
                    self.copy_block(ino, lbn + n, lbn)?;
                }
                self.truncate(ino, size - length)?;
            }
            Falloc::InsertRange => {
                let (at, n, last) = (offset / BS, length / BS, size.div_ceil(BS));
                for lbn in (at..last).rev() {
                    self.copy_block(ino, lbn, lbn + n)?;
                }
                for lbn in at..at + n {
                    self.punch_block(ino, lbn)?;
                }
                let node = self.inode_mut(ino)?;
                node.size = size + length;
                node.mtime = t;
            }
        }
        self.inode_mut(ino)?.ctime = t;
        self.mark_dirty(ino);
        Ok(())
    }
}
