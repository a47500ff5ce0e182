//! POSIX ACLs and inode flags in the FFS engine.
//!
//! An inode's ACLs are extended attributes in its xattr block, in the kernel's binary form
//! (`cairn_vfs::acl`, docs/FORMAT.md); its flags are bits 0–30 of the inode's flags word.
//! The rules (who may set what, what an ACL grants, what a flag forbids) are
//! `cairn_vfs::perm`'s, `acl`'s and `fileattr`'s; this module finds the inputs and makes the
//! changes.
//!
//! **The access ACL and the mode change together.** Setting an access ACL sets the mode's
//! permission bits from it, and chmod of a file with one rewrites the ACL. Were the two to
//! reach disk apart, a crash could leave a mode whose group bits (the ACL's mask) grant the
//! owning group what only named users were given, with no ACL to hold it back. So every
//! change of the access ACL writes the attributes to a *new* block and switches the inode's
//! pointer in the same inode encoding as the mode (`XattrWrite::WithMode`): the inode
//! write is the one atomic step. `sync` writes the new block before the inode (rule 1) and
//! frees the old one after it (rule 2); a journal logs the call's blocks as one operation;
//! soft updates rolls the mode back with the pointer while the new block is not on disk
//! (its `Mode` record, keyed to the xattr pointer's allocation); `async` promises nothing.

use std::sync::Arc;

use cairn_vfs::acl::{self, Acl};
use cairn_vfs::fileattr;
use cairn_vfs::perm;
use cairn_vfs::{Access, Ctx, Errno, Result};

use crate::format::DiskInode;
use crate::inode::now_ns;
use crate::ops::{XattrWrite, owner};
use crate::{Ffs, State, corrupt_err};

/// Extended attributes as the xattr block holds them: (name, value), in order.
pub(crate) type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// The ACL of kind `kind` in `attrs`, decoded (`cairn_vfs::acl::find`); a stored value
/// that is not a valid ACL is corruption (fsck names it and drops it).
pub(crate) fn find_acl(ino: u64, attrs: &Xattrs, kind: acl::Kind) -> Result<Option<Acl>> {
    acl::find(ino, attrs, kind).map_err(|e| corrupt_err(e.to_string()))
}

impl Ffs {
    /// The access ACL of inode `ino`, from its in-core copy or its xattr block.
    pub(crate) fn access_acl(&self, st: &mut State, ino: u64) -> Result<Option<Arc<Acl>>> {
        let ic = self.iget(st, ino)?;
        if ic.d.xattr == 0 {
            return Ok(None);
        }
        if let Some(a) = &ic.acl {
            return Ok(a.clone());
        }
        let d = ic.d.clone();
        let a = find_acl(ino, &self.read_xattrs(ino, &d)?, acl::Kind::Access)?.map(Arc::new);
        self.iget(st, ino)?.acl = Some(a.clone());
        Ok(a)
    }

    /// The permission check of `cairn_vfs::perm` against inode `ino` with its access ACL and
    /// flags; returns the inode.
    pub(crate) fn may(
        &self,
        st: &mut State,
        ctx: &Ctx,
        ino: u64,
        want: Access,
    ) -> Result<DiskInode> {
        let d = self.iget(st, ino)?.d.clone();
        if want.0 != 0 {
            let a = self.deciding_acl(st, ctx, ino, &d)?;
            ctx.permission(owner(&d), a.as_deref(), want)?;
        }
        Ok(d)
    }

    /// The access ACL of inode `ino` (`d`) where it can decide `ctx`'s access, else `None`
    /// without reading it. It decides only for a caller who is neither the owner nor root,
    /// and only while the mask grants anything (`Ctx::permission`), so a damaged attribute
    /// list (fsck's to repair, and what an `async` crash may leave) never hides a file from
    /// its owner or root.
    pub(crate) fn deciding_acl(
        &self,
        st: &mut State,
        ctx: &Ctx,
        ino: u64,
        d: &DiskInode,
    ) -> Result<Option<Arc<Acl>>> {
        if ctx.is_root() || ctx.uid == d.uid || d.mode & 0o070 == 0 {
            return Ok(None);
        }
        self.access_acl(st, ino)
    }

    /// What a new inode of `mode` (type and permission bits, umask not applied) made in
    /// directory `parent` starts with: its mode, and the attributes holding the ACLs it
    /// inherits from the directory's default ACL (`cairn_vfs::acl::inherit`). Symlinks
    /// inherit nothing.
    pub(crate) fn inherit(
        &self,
        st: &mut State,
        parent: u64,
        mode: u32,
        umask: u32,
    ) -> Result<(u32, Xattrs)> {
        let pd = self.iget(st, parent)?.d.clone();
        let default = if pd.xattr == 0 || mode & libc::S_IFMT == libc::S_IFLNK {
            None
        } else {
            find_acl(parent, &self.read_xattrs(parent, &pd)?, acl::Kind::Default)?
        };
        let i = acl::inherit(default.as_ref(), mode, umask);
        Ok((i.mode, i.xattrs()))
    }

    /// Sets (`value` Some) or removes an ACL of inode `ino` (`setxattr`/`removexattr` of
    /// `system.posix_acl_access` or `_default`), in the call in progress. The caller's
    /// right to (`perm::xattr_access`) is checked by the caller.
    ///
    /// An access ACL sets the mode's permission bits (and S_ISGID goes unless the caller is
    /// root or in the file's group: `posix_acl_update_mode`); one the mode says entirely is
    /// not stored. A header without entries removes the ACL, and removing one that is not
    /// there is no error (ext4's answer; the kernel sends an ACL removal as a removexattr).
    pub(crate) fn set_acl(
        &self,
        st: &mut State,
        ctx: &Ctx,
        ino: u64,
        kind: acl::Kind,
        value: Option<&[u8]>,
    ) -> Result<()> {
        let acl = match value {
            Some(v) => Acl::decode(v)?,
            None => None,
        };
        let d = self.iget(st, ino)?.d.clone();
        let mut attrs = self.read_xattrs(ino, &d)?;
        let before = attrs.clone();
        let mut mode = d.mode;
        match (kind, &acl) {
            (acl::Kind::Access, Some(a)) => {
                let (m, store) = acl::update_mode(ctx, a, d.mode, d.gid);
                mode = m;
                acl::put(&mut attrs, kind, store.then_some(a));
            }
            _ => acl::put(&mut attrs, kind, acl.as_ref()),
        }
        if attrs == before && mode == d.mode {
            // Nothing stored changes (an equivalent ACL where none was, a removal of none):
            // only the change time, as the kernel's setxattr would.
            if value.is_some() {
                self.touch_ctime(st, ino)?;
            }
            return Ok(());
        }
        let how = if kind == acl::Kind::Access {
            XattrWrite::WithMode { old_mode: d.mode }
        } else {
            XattrWrite::InPlace
        };
        self.iget(st, ino)?.d.mode = mode;
        self.write_xattrs(st, ino, &attrs, how)
    }

    /// chmod of an inode with an access ACL: the ACL's owner, mask (or group) and other
    /// entries take the new permission bits (`posix_acl_chmod`), written with the mode (the
    /// in-core inode already has it). `old_mode`: the mode before. Returns whether there
    /// was an ACL to rewrite (then the inode is stored and declared here).
    pub(crate) fn chmod_acl(&self, st: &mut State, ino: u64, old_mode: u32) -> Result<bool> {
        let Some(a) = self.access_acl(st, ino)? else {
            return Ok(false);
        };
        let d = self.iget(st, ino)?.d.clone();
        let mut next = (*a).clone();
        next.chmod(d.mode);
        if next == *a {
            return Ok(false);
        }
        let mut attrs = self.read_xattrs(ino, &d)?;
        acl::put(&mut attrs, acl::Kind::Access, Some(&next));
        self.write_xattrs(st, ino, &attrs, XattrWrite::WithMode { old_mode })?;
        Ok(true)
    }

    /// Stores inode `ino` with a new change time and declares it.
    pub(crate) fn touch_ctime(&self, st: &mut State, ino: u64) -> Result<()> {
        self.iget(st, ino)?.d.ctime = now_ns();
        self.store_attrs(st, ino, &[], None).map(drop)
    }

    /// `FS_IOC_SETFLAGS` of inode `ino` in the call in progress.
    pub(crate) fn set_inode_flags(
        &self,
        st: &mut State,
        ctx: &Ctx,
        ino: u64,
        flags: u32,
    ) -> Result<()> {
        let d = self.iget(st, ino)?.d.clone();
        let flags = fileattr::set_flags(ctx, owner(&d), flags)?;
        if flags == d.flags {
            return Ok(());
        }
        self.iget(st, ino)?.d.flags = flags;
        self.touch_ctime(st, ino)
    }
}

/// The refusals the inode flags add to a data change (write, fallocate): none on an
/// immutable inode (EPERM); on an append-only one only what keeps the bytes already there.
pub(crate) fn may_change_data(d: &DiskInode, keeps_bytes: bool) -> Result<()> {
    if d.flags & fileattr::IMMUTABLE != 0 || (d.flags & fileattr::APPEND != 0 && !keeps_bytes) {
        return Err(Errno::EPERM.into());
    }
    Ok(())
}

/// `perm::may_delete` for the entry naming `victim` in directory `dir`, with the
/// directory's access ACL.
impl Ffs {
    pub(crate) fn may_delete(
        &self,
        st: &mut State,
        ctx: &Ctx,
        dir: u64,
        victim: &DiskInode,
    ) -> Result<()> {
        let dd = self.iget(st, dir)?.d.clone();
        let a = self.deciding_acl(st, ctx, dir, &dd)?;
        perm::may_delete(ctx, owner(&dd), a.as_deref(), owner(victim))
    }
}
