//! Extended attributes, POSIX ACLs and inode flags: a file's live on its branch; a
//! directory's are kept on every copy (set and removed on all, read from the first). Every
//! host call has its branch's deadline; no index lock is held across one.
//!
//! **ACLs** are the host file system's: the layer stores `system.posix_acl_access` and
//! `_default` on the branch, whose file system validates them, derives the mode from them
//! and does the inheritance at creation (`fs::host_make`). A mount keeps them only when
//! every branch's file system does (`Inner::acls`, FUSE_POSIX_ACL): then the kernel checks
//! them, and so do the layer's own checks (`Inner::permit`); otherwise setting one is
//! EOPNOTSUPP, so that no ACL is stored that nobody enforces. What the host cannot know
//! because the daemon calls it as root is done here: a caller outside the file's group who
//! sets an access ACL loses setgid (`posix_acl_update_mode`).
//!
//! **Inode flags** (`chattr`): the host's `FS_IOC_GETFLAGS`/`SETFLAGS` on the branch file,
//! judged first by [`cairn_vfs::fileattr::set_flags`] (the daemon is root; the caller may
//! not be). The host then enforces immutable and append-only on every call the layer makes
//! for a caller. Flags of the host's own (ext4's extents flag…) are kept and never shown.
//! A migration carries them (`migrate`): the restricting ones are put on the copy only
//! after its names are in place, and taken off the source just before its names go.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use cairn_vfs::acl::{self, Acl};
use cairn_vfs::fileattr;
use cairn_vfs::perm::Owner;
use cairn_vfs::{Ctx, Ino, Result};

use crate::config::ErrorMode;
use crate::fs::{Inner, err, ioerr};
use crate::sys;

/// What a copy of an object carries besides its data, mode, owner and times: its extended
/// attributes (the ACLs among them) and its inode flags (the ones cairn shows).
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub xattrs: Vec<(OsString, Vec<u8>)>,
    pub flags: u32,
}

impl Meta {
    /// Reads them from `name` in `dir` (from `dir` itself when None), on its branch.
    pub fn read(dir: &OwnedFd, name: Option<&OsStr>) -> io::Result<Meta> {
        let list = match sys::listxattr(dir.as_fd(), name) {
            Ok(l) => l,
            Err(e) if unsupported(&e) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut xattrs = Vec::new();
        for a in list.split(|&c| c == 0).filter(|a| !a.is_empty()) {
            let a = OsStr::from_bytes(a).to_os_string();
            match sys::getxattr(dir.as_fd(), name, &a) {
                Ok(v) => xattrs.push((a, v)),
                // Removed between the list and the read.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Meta {
            xattrs,
            flags: flags_at(dir, name)? & fileattr::SUPPORTED,
        })
    }

    /// Writes the extended attributes to `name` in `dir`. Any that cannot be written is an
    /// error: a copy must not silently lose an ACL (rights the union does not grant, or an
    /// inheritance that no longer happens).
    pub fn apply(&self, dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
        for (a, v) in &self.xattrs {
            sys::setxattr(dir.as_fd(), Some(name), a, v, 0).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("extended attribute {}: {e}", a.to_string_lossy()),
                )
            })?;
        }
        Ok(())
    }

    /// Sets the flags on `name` in `dir` (all of them: call it once the object is
    /// complete and named — an immutable or append-only copy can be neither renamed nor
    /// linked).
    pub fn apply_flags(&self, dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
        set_flags_at(dir, Some(name), self.flags)
    }

    /// The flags that stop a rename, link or unlink (immutable, append-only): set on a
    /// copy only once its names are in place.
    pub fn restricting(&self) -> u32 {
        self.flags & fileattr::RESTRICTING
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOTTY))
}

/// The inode flags of `name` in `dir` (of `dir` when None), all of the host's; 0 for what
/// has none (symlinks, devices) or a file system that keeps none.
pub fn flags_at(dir: &OwnedFd, name: Option<&OsStr>) -> io::Result<u32> {
    match sys::open_for_flags(dir.as_fd(), name)? {
        None => Ok(0),
        Some(fd) => match sys::get_flags(fd.as_fd()) {
            Ok(f) => Ok(f),
            Err(e) if unsupported(&e) || e.raw_os_error() == Some(libc::EINVAL) => Ok(0),
            Err(e) => Err(e),
        },
    }
}

/// Replaces the flags cairn shows ([`fileattr::SUPPORTED`]) of `name` in `dir` by
/// `flags`, keeping the host's own; nothing is written when they are already so.
pub fn set_flags_at(dir: &OwnedFd, name: Option<&OsStr>, flags: u32) -> io::Result<()> {
    let Some(fd) = sys::open_for_flags(dir.as_fd(), name)? else {
        return Ok(());
    };
    let cur = match sys::get_flags(fd.as_fd()) {
        Ok(f) => f,
        Err(e) if unsupported(&e) && flags == 0 => return Ok(()),
        Err(e) => return Err(e),
    };
    let want = (cur & !fileattr::SUPPORTED) | (flags & fileattr::SUPPORTED);
    if want == cur {
        return Ok(());
    }
    sys::set_flags(fd.as_fd(), want)
}

fn is_acl(name: &OsStr) -> Option<acl::Kind> {
    acl::Kind::of_xattr(name.as_bytes())
}

pub fn get(i: &Inner, _ctx: &Ctx, ino: Ino, name: Option<&OsStr>) -> Result<Vec<u8>> {
    let r = get_raw(i, ino, name);
    // The kernel reads the ACLs for its permission checks and turns any error but ENODATA
    // into the check's result: "no ACL" it must be wherever the host has none to give.
    match r {
        Err(e) if i.acls && e.errno().0 == libc::EOPNOTSUPP && name.and_then(is_acl).is_some() => {
            Err(err(libc::ENODATA))
        }
        r => r,
    }
}

fn get_raw(i: &Inner, ino: Ino, name: Option<&OsStr>) -> Result<Vec<u8>> {
    let attr = name.map(OsStr::to_os_string);
    // The kernel asks for security.capability before every write(2) (file_remove_privs);
    // the file is open then, and its descriptor answers without resolving a path. Asked
    // first: an overflowing migration of the file holds the descriptor (the lock order in
    // `fs`).
    if let (Some(n), Some(h)) = (attr.clone(), i.any_handle(ino)) {
        return h
            .io(move |fd| sys::fgetxattr(fd.as_fd(), &n))
            .map_err(ioerr);
    }
    let _shape = i.shape.read_recursive();
    let dir = {
        let ns = i.ns.read();
        ns.dirs
            .get(&ino)
            .map(|d| (ns.rel(ino), i.dir_branches(d).into_iter().next()))
    };
    if let Some((rel, b)) = dir {
        let b = b.ok_or_else(|| err(libc::EIO))?;
        let bb = b.clone();
        return b
            .run(move || {
                let fd = bb.dir_here(&rel)?;
                match &attr {
                    Some(n) => sys::getxattr(fd.as_fd(), None, n),
                    None => sys::listxattr(fd.as_fd(), None),
                }
            })
            .map_err(ioerr);
    }
    let (b, loc) = i.file_loc(ino)?;
    let (dir, fname) = loc.ok_or_else(|| err(libc::ENOENT))?;
    let br = i.branch(b)?;
    let pfd = br.dir(&i.rel(dir)).map_err(ioerr)?;
    br.run(move || match &attr {
        Some(n) => sys::getxattr(pfd.as_fd(), Some(&fname), n),
        None => sys::listxattr(pfd.as_fd(), Some(&fname)),
    })
    .map_err(ioerr)
}

/// The access ACL of `ino`, for a permission check (None: it has none, or it cannot be
/// read now — the mode then decides alone, as it does for the kernel's own check when the
/// ACL read fails with ENODATA).
pub fn access_acl(i: &Inner, ino: Ino) -> Option<Acl> {
    let name = OsStr::from_bytes(acl::ACCESS_XATTR);
    let v = get_raw(i, ino, Some(name)).ok()?;
    Acl::decode(&v).ok().flatten()
}

/// Sets (`value` Some) or removes (None) an attribute.
pub fn set(
    i: &Inner,
    ctx: &Ctx,
    ino: Ino,
    name: &OsStr,
    value: Option<&[u8]>,
    flags: i32,
) -> Result<()> {
    let kind = is_acl(name);
    if kind.is_some() && !i.acls {
        // Not every branch keeps ACLs: one stored on a branch that does would not be
        // enforced by anyone (the kernel checks ACLs only for a mount that keeps them).
        return Err(err(libc::EOPNOTSUPP));
    }
    // A migration copies the attributes once: one set meanwhile would stay behind on the
    // source (lock order in `fs`: the file's mig lock first).
    let mig = i.mig_of(ino);
    let _moving = mig.as_ref().map(|m| m.lock());
    let _shape = i.shape.read_recursive();
    let (attr, value) = (name.to_os_string(), value.map(<[u8]>::to_vec));
    let drops_sgid = kind == Some(acl::Kind::Access) && value.is_some() && !ctx.is_root();
    let dir = {
        let ns = i.ns.read();
        match ns.dirs.get(&ino) {
            Some(d) => {
                i.merged_check(d)?;
                Some((ns.rel(ino), i.dir_branches(d)))
            }
            None => None,
        }
    };
    if let Some((rel, branches)) = dir {
        for (k, b) in branches.into_iter().enumerate() {
            // CREATE/REPLACE are decided by the first copy; the others follow it.
            let f = if k == 0 { flags } else { 0 };
            let (bb, rel, attr, val) = (b.clone(), rel.clone(), attr.clone(), value.clone());
            let c = ctx.clone();
            let r = b.run(move || {
                let fd = bb.dir_here(&rel)?;
                match &val {
                    Some(v) => sys::setxattr(fd.as_fd(), None, &attr, v, f)?,
                    None => sys::removexattr(fd.as_fd(), None, &attr)?,
                }
                if drops_sgid {
                    kill_sgid(&c, &fd, None)?;
                }
                Ok(())
            });
            match r {
                Ok(()) => {}
                Err(e) if k == 0 => return Err(ioerr(e)),
                Err(e) if value.is_none() && e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) if i.policy().errors == ErrorMode::Or => return Err(ioerr(e)),
                Err(e) => log::warn!("xattr on a directory copy on '{}': {e}", b.name),
            }
        }
        i.forget_dir_perm(ino);
        return Ok(());
    }
    let (b, loc) = i.file_loc(ino)?;
    let (dir, fname) = loc.ok_or_else(|| err(libc::ENOENT))?;
    let br = i.branch(b)?;
    let pfd = br.dir(&i.rel(dir)).map_err(ioerr)?;
    let c = ctx.clone();
    br.run(move || {
        match &value {
            Some(v) => sys::setxattr(pfd.as_fd(), Some(&fname), &attr, v, flags)?,
            None => sys::removexattr(pfd.as_fd(), Some(&fname), &attr)?,
        }
        if drops_sgid {
            kill_sgid(&c, &pfd, Some(&fname))?;
        }
        Ok(())
    })
    .map_err(ioerr)
}

/// After `ctx` (not root) set an access ACL: setgid goes when `ctx` is outside the
/// object's group (`posix_acl_update_mode`), which the host, called by root, keeps.
fn kill_sgid(ctx: &Ctx, dir: &OwnedFd, name: Option<&OsStr>) -> io::Result<()> {
    let st = match name {
        Some(n) => sys::fstatat(dir.as_fd(), n)?,
        None => sys::fstat(dir.as_fd())?,
    };
    if st.st_mode & libc::S_ISGID == 0 || ctx.in_group(st.st_gid) {
        return Ok(());
    }
    let mode = st.st_mode & 0o7777 & !libc::S_ISGID;
    match name {
        Some(n) => sys::fchmodat(dir.as_fd(), n, mode),
        None => sys::fchmodat(dir.as_fd(), OsStr::new("."), mode),
    }
}

/// `FS_IOC_GETFLAGS` of `ino`: the flags cairn shows, from the file's branch (a
/// directory's first copy).
pub fn get_flags(i: &Inner, ino: Ino) -> Result<u32> {
    let _shape = i.shape.read_recursive();
    let (br, pfd, name) = locate(i, ino)?;
    br.run(move || flags_at(&pfd, name.as_deref()))
        .map(|f| f & fileattr::SUPPORTED)
        .map_err(ioerr)
}

/// `FS_IOC_SETFLAGS` of `ino` by `ctx`, under ext4's rules ([`fileattr::set_flags`]: the
/// daemon is root on the host, the caller may not be); a directory's copies all get them.
pub fn set_flags(i: &Inner, ctx: &Ctx, ino: Ino, want: u32) -> Result<()> {
    let mig = i.mig_of(ino);
    let _moving = mig.as_ref().map(|m| m.lock());
    let _shape = i.shape.read_recursive();
    let (br, pfd, name) = locate(i, ino)?;
    let (p2, n2) = (pfd.clone(), name.clone());
    let (cur, st) = br
        .run(move || {
            let st = match &n2 {
                Some(n) => sys::fstatat(p2.as_fd(), n)?,
                None => sys::fstat(p2.as_fd())?,
            };
            Ok((flags_at(&p2, n2.as_deref())?, st))
        })
        .map_err(ioerr)?;
    let owner = Owner {
        mode: st.st_mode,
        uid: st.st_uid,
        gid: st.st_gid,
        flags: cur & fileattr::SUPPORTED,
    };
    let flags = fileattr::set_flags(ctx, owner, want)?;
    let is_dir = i.ns.read().dirs.contains_key(&ino);
    if !is_dir {
        br.run(move || set_flags_at(&pfd, name.as_deref(), flags))
            .map_err(ioerr)?;
        i.flags_set(ino, flags);
        return Ok(());
    }
    let (rel, branches) = {
        let ns = i.ns.read();
        let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
        i.merged_check(d)?;
        (ns.rel(ino), i.dir_branches(d))
    };
    for (k, b) in branches.into_iter().enumerate() {
        let (bb, rel) = (b.clone(), rel.clone());
        let r = b.run(move || set_flags_at(&*bb.dir_here(&rel)?, None, flags));
        match r {
            Ok(()) => {}
            Err(e) if k == 0 || i.policy().errors == ErrorMode::Or => return Err(ioerr(e)),
            Err(e) => log::warn!("inode flags of a directory copy on '{}': {e}", b.name),
        }
    }
    Ok(())
}

/// The branch, directory descriptor and name (None: the directory itself) of `ino`'s
/// host object (a directory's first copy).
fn locate(
    i: &Inner,
    ino: Ino,
) -> Result<(
    std::sync::Arc<crate::branch::Branch>,
    crate::branch::DirFd,
    Option<OsString>,
)> {
    let dir = {
        let ns = i.ns.read();
        ns.dirs
            .get(&ino)
            .map(|d| (ns.rel(ino), i.dir_branches(d).into_iter().next()))
    };
    if let Some((rel, b)) = dir {
        let b = b.ok_or_else(|| err(libc::EIO))?;
        let fd = b.dir(&rel).map_err(ioerr)?;
        return Ok((b, fd, None));
    }
    let (b, loc) = i.file_loc(ino)?;
    let (dir, fname) = loc.ok_or_else(|| err(libc::ENOENT))?;
    let br = i.branch(b)?;
    let pfd = br.dir(&i.rel(dir)).map_err(ioerr)?;
    Ok((br, pfd, Some(fname)))
}
