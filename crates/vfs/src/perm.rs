//! Who is calling, and the POSIX permission rules.
//!
//! The rules are pure functions over an inode's [`Owner`] (mode and ids), so every file
//! system of cairn applies the same policy: FFS's engine and the log-structured format call
//! these, never a copy of them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::{Errno, FsError, Result, SetTime};

/// Longest file name (bytes).
pub const NAME_MAX: usize = 255;
/// Most links to one inode (and subdirectories of one directory).
pub const LINK_MAX: u32 = 65_000;

/// The caller of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Supplementary groups, when the caller knows them. `None` means "look them up from
    /// /proc/PID/status if a check needs them" (only checks that fail on uid and primary gid
    /// pay for the lookup).
    pub groups: Option<Vec<u32>>,
}

impl Ctx {
    pub fn root() -> Ctx {
        Ctx {
            uid: 0,
            gid: 0,
            pid: 0,
            groups: Some(Vec::new()),
        }
    }

    pub fn user(uid: u32, gid: u32) -> Ctx {
        Ctx {
            uid,
            gid,
            pid: 0,
            groups: Some(Vec::new()),
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Is the caller a member of `gid` (primary or supplementary)?
    pub fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        match &self.groups {
            Some(g) => g.contains(&gid),
            None => proc_groups(self.pid).is_some_and(|g| g.contains(&gid)),
        }
    }

    /// Checks `want` (a mask of [`Access`] bits) against an inode's mode and owner, with
    /// root's bypass: root may read and write anything, and execute anything that has at
    /// least one execute bit (or is a directory).
    pub fn check(&self, mode: u32, uid: u32, gid: u32, want: Access) -> Result<()> {
        if want.0 == 0 {
            return Ok(());
        }
        if self.is_root() {
            let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
            if want.0 & Access::X.0 != 0 && !is_dir && mode & 0o111 == 0 {
                return Err(FsError::Errno(Errno::EACCES));
            }
            return Ok(());
        }
        let bits = if self.uid == uid {
            (mode >> 6) & 7
        } else if self.in_group(gid) {
            (mode >> 3) & 7
        } else {
            mode & 7
        };
        if want.0 & !bits == 0 {
            Ok(())
        } else {
            Err(FsError::Errno(Errno::EACCES))
        }
    }
}

fn proc_groups(pid: u32) -> Option<Vec<u32>> {
    if pid == 0 {
        return None;
    }
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("Groups:"))?;
    Some(
        line["Groups:".len()..]
            .split_whitespace()
            .filter_map(|g| g.parse().ok())
            .collect(),
    )
}

/// An access(2) mask: R=4, W=2, X=1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    pub const NONE: Access = Access(0);
    pub const R: Access = Access(4);
    pub const W: Access = Access(2);
    pub const X: Access = Access(1);
    pub const WX: Access = Access(3);

    /// The access an open(2) with these flags needs. The open execve(2) makes carries
    /// `__FMODE_EXEC` (0x20, passed in FUSE's open flags): it needs execute permission,
    /// not read — a program of mode 0111 runs (fstests' generic/126).
    pub fn for_open_flags(flags: i32) -> Access {
        const FMODE_EXEC: i32 = 0x20;
        if flags & FMODE_EXEC != 0 && flags & libc::O_ACCMODE == libc::O_RDONLY {
            return Access::X;
        }
        let mut a = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => Access::R.0,
            libc::O_WRONLY => Access::W.0,
            _ => Access::R.0 | Access::W.0,
        };
        if flags & libc::O_TRUNC != 0 {
            a |= Access::W.0;
        }
        Access(a)
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// The mode and ids of an inode: what the permission rules look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

impl Ctx {
    /// [`Ctx::check`] against `o`.
    pub fn check_owner(&self, o: Owner, want: Access) -> Result<()> {
        self.check(o.mode, o.uid, o.gid, want)
    }

    /// The caller owns `o`, or is root.
    pub fn owns(&self, o: Owner) -> bool {
        self.is_root() || self.uid == o.uid
    }
}

/// A name for a new or looked-up entry: not too long (ENAMETOOLONG), not empty and without
/// `/` or NUL (EINVAL).
pub fn check_name(name: &OsStr) -> Result<&[u8]> {
    let n = name.as_bytes();
    if n.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG.into());
    }
    if n.is_empty() || n.contains(&b'/') || n.contains(&0) {
        return Err(Errno::EINVAL.into());
    }
    Ok(n)
}

/// `.` or `..`.
pub fn is_dot(n: &[u8]) -> bool {
    n == b"." || n == b".."
}

/// The sticky-directory rule: in a sticky directory only the owner of the entry, the owner
/// of the directory, or root may remove or rename it.
pub fn sticky_ok(ctx: &Ctx, dir: Owner, victim: Owner) -> Result<()> {
    if dir.mode & libc::S_ISVTX != 0
        && !ctx.is_root()
        && ctx.uid != dir.uid
        && ctx.uid != victim.uid
    {
        return Err(Errno::EPERM.into());
    }
    Ok(())
}

/// The mode and group of a new inode of `mode` (type and permission bits, umask applied)
/// made by `ctx` in directory `parent`: a setgid directory gives its group (and, to a new
/// directory, its setgid bit); a non-directory keeps S_ISGID only if the caller is root or
/// in the file's group.
pub fn new_inode_owner(ctx: &Ctx, parent: Owner, mode: u32) -> (u32, u32) {
    let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
    let mut mode = mode;
    let gid = if parent.mode & libc::S_ISGID != 0 {
        if is_dir {
            mode |= libc::S_ISGID;
        }
        parent.gid
    } else {
        ctx.gid
    };
    if !is_dir && mode & libc::S_ISGID != 0 && !ctx.is_root() && !ctx.in_group(gid) {
        mode &= !libc::S_ISGID;
    }
    (mode, gid)
}

/// Whether changing permission bits `old` to `new` only clears S_ISUID and/or S_ISGID.
///
/// A non-owner may make exactly this change to a file it may write: it is how Linux's FUSE
/// client (without `handle_killpriv`) kills privileges when someone who is not the owner
/// writes or truncates a setuid/setgid file — it sends SETATTR with the old mode minus
/// S_ISUID (and minus S_ISGID when group-execute is set), as the writing user, for a
/// truncate in the same request as the new size. Refusing it would make the write fail with
/// EPERM and keep the bits, where ext4 lets the write succeed and clears them.
///
/// Why it is safe: under `default_permissions` (cairn's default) the kernel refuses an
/// explicit chmod(2) by a non-owner itself (`setattr_prepare`: only the owner or
/// CAP_FOWNER may change the mode), so such a request reaching us is the kernel's own
/// privilege kill. Without `default_permissions`, a user who may write the file could also
/// clear the bits with chmod(2) — which only ever removes privilege, and the same user could
/// clear them anyway by writing to the file.
pub fn only_kills_privileges(old: u32, new: u32) -> bool {
    let (old, new) = (old & 0o7777, new & 0o7777);
    let cleared = old & !new;
    new & !old == 0 && cleared != 0 && cleared & !(libc::S_ISUID | libc::S_ISGID) == 0
}

/// chmod: the new `st_mode` of `cur` asked to take permission bits `mode`. The owner (or
/// root) may set any bits, but a non-root owner outside the file's group loses S_ISGID on a
/// non-directory; anyone else only the privilege kill of [`only_kills_privileges`], and only
/// with write permission (EPERM otherwise).
pub fn chmod(ctx: &Ctx, cur: Owner, mode: u32) -> Result<u32> {
    let mut m = mode & 0o7777;
    if !ctx.owns(cur) {
        if !only_kills_privileges(cur.mode, m) || ctx.check_owner(cur, Access::W).is_err() {
            return Err(Errno::EPERM.into());
        }
    } else if !ctx.is_root() && !cur.is_dir() && !ctx.in_group(cur.gid) {
        m &= !libc::S_ISGID;
    }
    Ok((cur.mode & libc::S_IFMT) | m)
}

/// chown: `cur` (whose mode may already carry a chmod of the same request) with new ids.
/// Only root may change the owner; the owner may change the group to one it is in. A
/// change of either id clears S_ISUID on a non-directory, and S_ISGID when group-execute is
/// set.
pub fn chown(ctx: &Ctx, cur: Owner, uid: Option<u32>, gid: Option<u32>) -> Result<Owner> {
    let uid = uid.unwrap_or(cur.uid);
    let gid = gid.unwrap_or(cur.gid);
    if !ctx.is_root()
        && (uid != cur.uid || ctx.uid != cur.uid || (gid != cur.gid && !ctx.in_group(gid)))
    {
        return Err(Errno::EPERM.into());
    }
    let mut mode = cur.mode;
    if (uid != cur.uid || gid != cur.gid) && !cur.is_dir() {
        mode &= !libc::S_ISUID;
        if mode & libc::S_IXGRP != 0 {
            mode &= !libc::S_ISGID;
        }
    }
    Ok(Owner { mode, uid, gid })
}

/// utimens: setting a time to now needs ownership or write permission (EACCES); to a given
/// time, ownership (EPERM).
pub fn may_set_time(ctx: &Ctx, cur: Owner, t: &SetTime) -> Result<()> {
    match t {
        SetTime::Now if !ctx.owns(cur) && ctx.check_owner(cur, Access::W).is_err() => {
            Err(Errno::EACCES.into())
        }
        SetTime::At(_) if !ctx.owns(cur) => Err(Errno::EPERM.into()),
        _ => Ok(()),
    }
}

/// Access to extended attribute `name` of `cur` (`write`: set or remove). `user.` follows
/// the file's permissions and exists only on regular files and directories; `trusted.` is
/// root's; `security.` may be read by anyone and written by the owner or root; `system.`
/// (POSIX ACLs) and other namespaces are not supported.
pub fn xattr_access(ctx: &Ctx, cur: Owner, name: &[u8], write: bool) -> Result<()> {
    if name.len() > NAME_MAX || name.is_empty() {
        return Err(Errno::ERANGE.into());
    }
    if name.starts_with(b"user.") {
        let t = cur.mode & libc::S_IFMT;
        if t != libc::S_IFREG && t != libc::S_IFDIR {
            return Err(if write { Errno::EPERM } else { Errno::ENODATA }.into());
        }
        ctx.check_owner(cur, if write { Access::W } else { Access::R })
    } else if name.starts_with(b"trusted.") {
        if ctx.is_root() {
            Ok(())
        } else {
            Err(Errno::EPERM.into())
        }
    } else if name.starts_with(b"security.") {
        if write && !ctx.is_root() && ctx.uid != cur.uid {
            Err(Errno::EPERM.into())
        } else {
            Ok(())
        }
    } else {
        Err(Errno::EOPNOTSUPP.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_open_needs_execute_permission_not_read() {
        assert_eq!(Access::for_open_flags(libc::O_RDONLY), Access::R);
        assert_eq!(Access::for_open_flags(libc::O_RDONLY | 0x20), Access::X);
        assert_eq!(
            Access::for_open_flags(libc::O_RDWR | libc::O_TRUNC),
            Access(6)
        );
    }

    #[test]
    fn names_and_dots() {
        assert_eq!(check_name(OsStr::new("a")).unwrap(), b"a");
        assert!(check_name(OsStr::new("")).is_err());
        assert!(check_name(OsStr::new("a/b")).is_err());
        assert_eq!(
            check_name(OsStr::new(&"x".repeat(256)))
                .unwrap_err()
                .errno(),
            Errno::ENAMETOOLONG
        );
        assert!(is_dot(b".") && is_dot(b"..") && !is_dot(b"..."));
    }

    #[test]
    fn sticky_and_setgid_inheritance() {
        let u = Ctx::user(1000, 1000);
        let sticky = Owner {
            mode: libc::S_IFDIR | 0o1777,
            uid: 0,
            gid: 0,
        };
        let theirs = Owner {
            mode: libc::S_IFREG | 0o644,
            uid: 2000,
            gid: 0,
        };
        assert!(sticky_ok(&u, sticky, theirs).is_err());
        assert!(
            sticky_ok(
                &u,
                sticky,
                Owner {
                    uid: 1000,
                    ..theirs
                }
            )
            .is_ok()
        );
        let sgid = Owner {
            mode: libc::S_IFDIR | 0o2775,
            uid: 0,
            gid: 44,
        };
        let (m, g) = new_inode_owner(&u, sgid, libc::S_IFDIR | 0o755);
        assert_eq!((m & libc::S_ISGID != 0, g), (true, 44));
        let (m, g) = new_inode_owner(&u, sgid, libc::S_IFREG | 0o2755);
        assert_eq!((m & libc::S_ISGID, g), (0, 44), "not in the group");
    }

    #[test]
    fn chmod_chown_and_times() {
        let owner = Ctx::user(1000, 1000);
        let other = Ctx::user(2000, 2000);
        let f = Owner {
            mode: libc::S_IFREG | 0o6777,
            uid: 1000,
            gid: 1000,
        };
        assert_eq!(chmod(&owner, f, 0o644).unwrap(), libc::S_IFREG | 0o644);
        assert_eq!(chmod(&other, f, 0o0777).unwrap(), libc::S_IFREG | 0o0777);
        assert!(chmod(&other, f, 0o7777).is_err());
        assert!(chown(&other, f, None, Some(2000)).is_err());
        let g = chown(&Ctx::root(), f, Some(5), None).unwrap();
        assert_eq!((g.uid, g.mode & 0o7000), (5, 0));
        assert!(may_set_time(&other, f, &SetTime::Now).is_ok(), "writable");
        let ro = Owner {
            mode: libc::S_IFREG | 0o644,
            ..f
        };
        assert_eq!(
            may_set_time(&other, ro, &SetTime::Now).unwrap_err().errno(),
            Errno::EACCES
        );
        assert_eq!(
            may_set_time(&other, f, &SetTime::At(std::time::UNIX_EPOCH))
                .unwrap_err()
                .errno(),
            Errno::EPERM
        );
        assert!(xattr_access(&other, ro, b"user.x", true).is_err());
        assert!(xattr_access(&other, ro, b"user.x", false).is_ok());
        assert!(xattr_access(&other, ro, b"trusted.x", false).is_err());
        assert!(xattr_access(&other, ro, b"system.posix_acl_access", false).is_err());
    }

    #[test]
    fn owner_group_other() {
        let u = Ctx::user(1000, 1000);
        assert!(u.check(0o100640, 1000, 0, Access::R | Access::W).is_ok());
        assert!(u.check(0o100640, 1000, 0, Access::X).is_err());
        assert!(u.check(0o100640, 0, 1000, Access::R).is_ok());
        assert!(u.check(0o100640, 0, 1000, Access::W).is_err());
        assert!(u.check(0o100604, 0, 0, Access::R).is_ok());
        // Owner bits win even when "other" would allow more.
        assert!(u.check(0o100007, 1000, 0, Access::R).is_err());
    }

    #[test]
    fn root_bypass_but_not_exec_without_any_x() {
        let r = Ctx::root();
        assert!(r.check(0o100000, 5, 5, Access::R | Access::W).is_ok());
        assert!(r.check(0o100000, 5, 5, Access::X).is_err());
        assert!(r.check(0o100001, 5, 5, Access::X).is_ok());
        assert!(r.check(0o040000, 5, 5, Access::X).is_ok());
    }

    #[test]
    fn supplementary_groups() {
        let mut u = Ctx::user(1000, 1000);
        u.groups = Some(vec![44]);
        assert!(u.check(0o100060, 0, 44, Access::R).is_ok());
        assert!(u.check(0o100060, 0, 45, Access::R).is_err());
    }
}
