//! Inode flags, the file attributes `chattr` sets and `lsattr` shows (`FS_IOC_GETFLAGS` /
//! `FS_IOC_SETFLAGS`, and their `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` form).
//!
//! cairn keeps the flags in each inode and enforces the two that restrict access
//! itself, because the kernel does not know them for a FUSE inode (it never sets
//! `S_IMMUTABLE` or `S_APPEND` on one, so none of the VFS's own refusals happen):
//!
//! - **immutable** (`i`): no change at all — no write, truncation, chmod, chown or time
//!   change, no extended attribute or ACL set or removed, no new link; the inode cannot be
//!   removed or renamed, and in an immutable directory no entry can be added, removed or
//!   renamed. Every such refusal is EPERM, root's included.
//! - **append-only** (`a`): opened for writing only with O_APPEND and never with O_TRUNC;
//!   no truncation, chmod, chown, explicit time, extended attribute or ACL change, no link,
//!   no removal or rename; in an append-only directory entries can be added but not removed.
//!
//! `nodump` (`d`) and `noatime` (`A`) are kept and shown; noatime also stops access-time
//! updates. Any other flag is EOPNOTSUPP. Only the owner (or root) may change the flags,
//! only root (CAP_LINUX_IMMUTABLE) may set or clear immutable and append-only, and while an
//! inode is immutable nothing but that flag may change — ext4's rules.

use crate::perm::{Ctx, Owner};
use crate::{Errno, Result};

/// `FS_SYNC_FL` (not supported: refused).
pub const SYNC: u32 = 0x0000_0008;
/// `FS_IMMUTABLE_FL`.
pub const IMMUTABLE: u32 = 0x0000_0010;
/// `FS_APPEND_FL`.
pub const APPEND: u32 = 0x0000_0020;
/// `FS_NODUMP_FL`.
pub const NODUMP: u32 = 0x0000_0040;
/// `FS_NOATIME_FL`.
pub const NOATIME: u32 = 0x0000_0080;
/// The flags cairn stores; every other bit of a SETFLAGS request is EOPNOTSUPP.
pub const SUPPORTED: u32 = IMMUTABLE | APPEND | NODUMP | NOATIME;

/// `FS_XFLAG_*` of `struct fsxattr`, the same flags in the form xfs_io uses.
const XFLAG_IMMUTABLE: u32 = 0x0000_0008;
const XFLAG_APPEND: u32 = 0x0000_0010;
const XFLAG_NOATIME: u32 = 0x0000_0040;
const XFLAG_NODUMP: u32 = 0x0000_0080;
const XFLAGS: [(u32, u32); 4] = [
    (IMMUTABLE, XFLAG_IMMUTABLE),
    (APPEND, XFLAG_APPEND),
    (NOATIME, XFLAG_NOATIME),
    (NODUMP, XFLAG_NODUMP),
];

/// The flags that stop a change of the inode's contents or attributes.
pub const RESTRICTING: u32 = IMMUTABLE | APPEND;

/// The flags an inode whose flags are `o.flags` gets when `ctx` asks for `want`
/// (`FS_IOC_SETFLAGS`), or why not: EPERM for a caller who does not own the inode, for
/// changing immutable or append-only without being root, or for changing anything else of
/// an immutable inode; EOPNOTSUPP for a flag cairn does not keep.
pub fn set_flags(ctx: &Ctx, o: Owner, want: u32) -> Result<u32> {
    if !ctx.owns(o) {
        return Err(Errno::EPERM.into());
    }
    if (want ^ o.flags) & RESTRICTING != 0 && !ctx.is_root() {
        return Err(Errno::EPERM.into());
    }
    if want & !SUPPORTED != 0 {
        return Err(Errno::EOPNOTSUPP.into());
    }
    if o.flags & IMMUTABLE != 0 && want & IMMUTABLE != 0 && want != o.flags {
        return Err(Errno::EPERM.into());
    }
    Ok(want)
}

/// The flags as `fsx_xflags`.
pub fn to_xflags(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .fold(0, |x, (_, xf)| x | xf)
}

/// The flags `fsx_xflags` asks for; EOPNOTSUPP for an xflag cairn does not keep.
pub fn from_xflags(xflags: u32) -> Result<u32> {
    let known = XFLAGS.iter().fold(0, |x, (_, xf)| x | xf);
    if xflags & !known != 0 {
        return Err(Errno::EOPNOTSUPP.into());
    }
    Ok(XFLAGS
        .iter()
        .filter(|(_, xf)| xflags & xf != 0)
        .fold(0, |f, (fl, _)| f | fl))
}

/// `STATX_ATTR_*` bits of statx(2) for the flags that have one.
const STATX_ATTRS: [(u32, u64); 3] = [
    (IMMUTABLE, libc::STATX_ATTR_IMMUTABLE as u64),
    (APPEND, libc::STATX_ATTR_APPEND as u64),
    (NODUMP, libc::STATX_ATTR_NODUMP as u64),
];

/// statx(2)'s `stx_attributes` and `stx_attributes_mask` for an inode whose flags are
/// `flags`: the mask names every attribute cairn keeps (set or not), so a program can tell
/// "not immutable" from "cannot say".
pub fn statx_attributes(flags: u32) -> (u64, u64) {
    STATX_ATTRS.iter().fold((0, 0), |(set, mask), &(f, sx)| {
        (if flags & f != 0 { set | sx } else { set }, mask | sx)
    })
}

/// lsattr's letters for the flags cairn keeps, in lsattr's order (`----ia-A--` style is
/// lsattr's; this is the short form: `iadA` letters present, for messages and fsck).
pub fn letters(flags: u32) -> String {
    [
        (IMMUTABLE, 'i'),
        (APPEND, 'a'),
        (NODUMP, 'd'),
        (NOATIME, 'A'),
    ]
    .iter()
    .filter(|(f, _)| flags & f != 0)
    .map(|(_, c)| *c)
    .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn statx_attributes_name_each_kept_flag() {
        use super::*;
        let all =
            (libc::STATX_ATTR_IMMUTABLE | libc::STATX_ATTR_APPEND | libc::STATX_ATTR_NODUMP) as u64;
        assert_eq!(statx_attributes(0), (0, all));
        assert_eq!(
            statx_attributes(APPEND | NOATIME),
            (libc::STATX_ATTR_APPEND as u64, all)
        );
        assert_eq!(statx_attributes(IMMUTABLE | APPEND | NODUMP), (all, all));
    }

    use super::*;

    fn file(uid: u32, flags: u32) -> Owner {
        Owner {
            mode: libc::S_IFREG | 0o644,
            uid,
            gid: uid,
            flags,
        }
    }

    #[test]
    fn who_may_set_what() {
        let owner = Ctx::user(1000, 1000);
        let other = Ctx::user(2000, 2000);
        let root = Ctx::root();
        let f = file(1000, 0);
        assert_eq!(set_flags(&owner, f, NODUMP).unwrap(), NODUMP);
        assert_eq!(
            set_flags(&other, f, NODUMP).unwrap_err().errno(),
            Errno::EPERM
        );
        assert_eq!(
            set_flags(&owner, f, IMMUTABLE).unwrap_err().errno(),
            Errno::EPERM
        );
        assert_eq!(
            set_flags(&root, f, IMMUTABLE | APPEND).unwrap(),
            RESTRICTING
        );
        assert_eq!(
            set_flags(&root, f, SYNC).unwrap_err().errno(),
            Errno::EOPNOTSUPP
        );
        assert_eq!(
            set_flags(&owner, f, 0x0008_0000).unwrap_err().errno(),
            Errno::EOPNOTSUPP,
            "extents: not kept"
        );
        // Immutable: only the flag itself may change, and only by root.
        let i = file(1000, IMMUTABLE);
        assert_eq!(
            set_flags(&root, i, IMMUTABLE | NODUMP).unwrap_err().errno(),
            Errno::EPERM
        );
        assert_eq!(set_flags(&root, i, NODUMP).unwrap(), NODUMP);
        assert_eq!(set_flags(&owner, i, 0).unwrap_err().errno(), Errno::EPERM);
        // Append-only: the owner may change the other flags, not it.
        let a = file(1000, APPEND);
        assert_eq!(
            set_flags(&owner, a, APPEND | NOATIME).unwrap(),
            APPEND | NOATIME
        );
        assert_eq!(set_flags(&owner, a, 0).unwrap_err().errno(), Errno::EPERM);
    }

    #[test]
    fn xflags_round_trip() {
        for f in [0, IMMUTABLE, APPEND | NODUMP, SUPPORTED] {
            assert_eq!(from_xflags(to_xflags(f)).unwrap(), f);
        }
        assert_eq!(to_xflags(IMMUTABLE | APPEND), 0x18);
        assert!(from_xflags(0x20).is_err(), "sync");
        assert_eq!(letters(IMMUTABLE | NOATIME), "iA");
    }
}
