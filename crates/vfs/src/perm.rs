//! Who is calling, and the POSIX permission rules.
//!
//! The rules are pure functions over an inode's [`Owner`] (mode and ids), so every file
//! system of cairn applies the same policy: FFS's engine and the log-structured format call
//! these, never a copy of them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::acl::{self, Acl};
use crate::fileattr;
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

    /// The caller's supplementary groups (looked up once per call of this; empty when
    /// they cannot be known).
    pub fn groups(&self) -> Vec<u32> {
        match &self.groups {
            Some(g) => g.clone(),
            None => proc_groups(self.pid).unwrap_or_default(),
        }
    }

    /// Checks `want` (a mask of [`Access`] bits) against an inode's mode and owner, with
    /// root's bypass: root may read and write anything, and execute anything that has at
    /// least one execute bit (or is a directory). No ACL and no inode flags: see
    /// [`Ctx::permission`].
    pub fn check(&self, mode: u32, uid: u32, gid: u32, want: Access) -> Result<()> {
        let o = Owner {
            mode,
            uid,
            gid,
            flags: 0,
        };
        self.permission(o, None, want)
    }

    /// Linux's `inode_permission` for an inode of a file system that stores ACLs: writing
    /// an immutable inode is EPERM for everyone; then `generic_permission` — the owner is
    /// judged by the mode's owner bits; anyone else by the access ACL `acl` when there is
    /// one and its mask (the mode's group bits) grants anything, otherwise by the group or
    /// other bits; root may read and write anything and execute anything with an execute
    /// bit, or search any directory.
    pub fn permission(&self, o: Owner, acl: Option<&Acl>, want: Access) -> Result<()> {
        if want.0 == 0 {
            return Ok(());
        }
        if want.0 & Access::W.0 != 0 && o.flags & fileattr::IMMUTABLE != 0 {
            return Err(Errno::EPERM.into());
        }
        let r = self.dac(o, acl, want);
        if r.is_ok() || !self.is_root() {
            return r;
        }
        if want.0 & Access::X.0 != 0 && !o.is_dir() && o.mode & 0o111 == 0 {
            return Err(FsError::Errno(Errno::EACCES));
        }
        Ok(())
    }

    /// `acl_permission_check`: the discretionary rules without root's bypass.
    fn dac(&self, o: Owner, acl: Option<&Acl>, want: Access) -> Result<()> {
        let bits = if self.uid == o.uid {
            (o.mode >> 6) & 7
        } else if let Some(acl) = acl.filter(|_| o.mode & 0o070 != 0) {
            return acl.permission(self, o.uid, o.gid, want);
        } else if self.in_group(o.gid) {
            (o.mode >> 3) & 7
        } else {
            o.mode & 7
        };
        if want.0 & !bits & 7 == 0 {
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

/// The kernel's `__FMODE_EXEC` open flag: the file is opened to be executed.
pub const FMODE_EXEC: i32 = 0x20;

/// An access(2) mask: R=4, W=2, X=1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    pub const NONE: Access = Access(0);
    pub const R: Access = Access(4);
    pub const W: Access = Access(2);
    pub const X: Access = Access(1);
    pub const WX: Access = Access(3);

    /// The access an open(2) with these flags needs. An open for execve (the kernel's
    /// `__FMODE_EXEC`, which FUSE passes on in OPEN's flags) needs execute permission, and
    /// not read — a program of mode 0111 runs (`do_open_execat` asks for MAY_EXEC alone;
    /// fstests' generic/126): without `default_permissions` the kernel itself only asks
    /// that some execute bit be set.
    pub fn for_open_flags(flags: i32) -> Access {
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

/// The mode, ids and inode flags of an inode: what the permission rules look at (with its
/// access ACL, which is passed beside it where a rule needs it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Inode flags ([`fileattr`]): immutable and append-only restrict what may change.
    pub flags: u32,
}

impl Owner {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

impl Ctx {
    /// [`Ctx::permission`] against `o` without an ACL.
    pub fn check_owner(&self, o: Owner, want: Access) -> Result<()> {
        self.permission(o, None, want)
    }

    /// The caller owns `o`, or is root.
    pub fn owns(&self, o: Owner) -> bool {
        self.is_root() || self.uid == o.uid
    }
}

/// A node `mknod` may make: its kind, its mode (the type bits and the permission bits
/// asked for, umask not applied) and its device number (zero unless a device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mknod {
    pub kind: crate::FileKind,
    pub mode: u32,
    pub rdev: u32,
}

/// Why `mknod` refuses its arguments. Every format answers alike (Linux's `may_mknod` and
/// `vfs_mknod`); the message names the call that makes such a node, or what is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MknodError {
    /// `S_IFDIR`: EPERM, as Linux answers.
    Directory,
    /// A symlink or a type that is none (the `S_IFMT` bits given): EINVAL.
    NotANode(u32),
    /// A character or block device asked for without root (CAP_MKNOD): EPERM.
    DeviceNeedsRoot,
}

impl MknodError {
    pub fn errno(self) -> Errno {
        match self {
            MknodError::Directory | MknodError::DeviceNeedsRoot => Errno::EPERM,
            MknodError::NotANode(_) => Errno::EINVAL,
        }
    }
}

impl std::fmt::Display for MknodError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MknodError::Directory => write!(f, "mknod cannot make a directory: use mkdir"),
            MknodError::NotANode(t) if *t == libc::S_IFLNK => {
                write!(f, "mknod cannot make a symbolic link: use symlink")
            }
            MknodError::NotANode(t) => write!(
                f,
                "mknod of file type {t:#o}: it makes a regular file, FIFO, socket or device"
            ),
            MknodError::DeviceNeedsRoot => {
                write!(f, "a device node needs root (CAP_MKNOD): make it as root")
            }
        }
    }
}

impl std::error::Error for MknodError {}

impl From<MknodError> for FsError {
    fn from(e: MknodError) -> FsError {
        FsError::Refused(e.errno(), e.to_string())
    }
}

/// `mknod`'s arguments checked: no type bits make a regular file (as Linux does); a
/// directory, a symlink or an unknown type is refused, a device without root too; the mode
/// keeps the type and the permission bits; the device number is kept for a device only.
pub fn mknod(ctx: &Ctx, mode: u32, rdev: u32) -> std::result::Result<Mknod, MknodError> {
    use crate::FileKind;
    let kind = match mode & libc::S_IFMT {
        0 => FileKind::RegularFile,
        libc::S_IFDIR => return Err(MknodError::Directory),
        t => match FileKind::from_mode(t) {
            Some(k) if k != FileKind::Symlink => k,
            _ => return Err(MknodError::NotANode(t)),
        },
    };
    let device = matches!(kind, FileKind::CharDevice | FileKind::BlockDevice);
    if device && !ctx.is_root() {
        return Err(MknodError::DeviceNeedsRoot);
    }
    Ok(Mknod {
        kind,
        mode: kind.mode_bits() | (mode & 0o7777),
        rdev: if device { rdev } else { 0 },
    })
}

/// `do_renameat2`'s checks of its flags, before any lookup: EXCHANGE with NOREPLACE or
/// WHITEOUT is EINVAL (for callers that built the flags themselves), a whiteout without
/// CAP_MKNOD is EPERM. Returns the whiteout to make, if any.
pub fn rename_flags(ctx: &Ctx, flags: crate::RenameFlags) -> Result<Option<Mknod>> {
    if flags.exchange && (flags.noreplace || flags.whiteout) {
        return Err(Errno::EINVAL.into());
    }
    Ok(if flags.whiteout {
        Some(whiteout(ctx)?)
    } else {
        None
    })
}

/// The whiteout renameat2(RENAME_WHITEOUT) leaves at the old name: a character device 0/0
/// with no permission bits, which only someone with CAP_MKNOD (root) may make — the same
/// refusal as `mknod` of a device (EPERM). Its owner is the caller's, as `new_inode_owner`
/// gives any new inode.
pub fn whiteout(ctx: &Ctx) -> std::result::Result<Mknod, MknodError> {
    mknod(ctx, crate::WHITEOUT_MODE, 0)
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

/// An open flag outside open(2)'s own (bit 29) a file system sets on a handle opened by a
/// caller without CAP_FSETID (not root): a write through it kills the file's privileges
/// ([`mode_after_data_change`]).
pub const O_KILL_PRIVILEGES: i32 = 1 << 29;

/// With [`O_KILL_PRIVILEGES`] (bit 28): the opener is outside the file's group, so setgid
/// goes even without group-execute (the kernel's `setattr_should_drop_sgid`:
/// generic/683-685).
pub const O_KILL_SGID: i32 = 1 << 28;

/// The flags a file system keeps for a handle `ctx` opens with `flags` on a file of group
/// `gid` (see [`O_KILL_PRIVILEGES`], [`O_KILL_SGID`]).
pub fn handle_flags(ctx: &Ctx, flags: i32, gid: u32) -> i32 {
    if ctx.is_root() {
        flags
    } else if ctx.in_group(gid) {
        flags | O_KILL_PRIVILEGES
    } else {
        flags | O_KILL_PRIVILEGES | O_KILL_SGID
    }
}

/// The mode after a change of a file's data (a write, any fallocate) through a handle
/// opened with `handle_flags` ([`handle_flags`]): as it was when its opener had
/// CAP_FSETID; else setuid goes, and setgid with group-execute or when the opener is
/// outside the file's group (`file_remove_privs`; generic/683 to 687). Every format's
/// write and fallocate apply it.
pub fn mode_after_data_change(handle_flags: i32, mode: u32) -> u32 {
    if handle_flags & O_KILL_PRIVILEGES == 0 {
        return mode;
    }
    let m = kill_privileges(mode);
    if handle_flags & O_KILL_SGID != 0 && m & libc::S_IFMT == libc::S_IFREG {
        m & !libc::S_ISGID
    } else {
        m
    }
}

/// The mode of a regular file after someone without CAP_FSETID wrote or truncated it:
/// S_ISUID goes, and S_ISGID when group-execute is set (Linux's `should_remove_suid`; a
/// setgid bit without group-execute is a mandatory-locking mark, kept). The file systems
/// do this themselves — FUSE_HANDLE_KILLPRIV: the kernel then sends no mode change of its
/// own, and a chmod from someone other than the owner is always a real one (EPERM).
pub fn kill_privileges(mode: u32) -> u32 {
    if mode & libc::S_IFMT != libc::S_IFREG {
        return mode;
    }
    let mut m = mode & !libc::S_ISUID;
    if m & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    m
}

/// chmod: the new `st_mode` of `cur` asked to take permission bits `mode`. Only the owner
/// (or root) may (EPERM), and not on an immutable or append-only inode (EPERM); a non-root
/// owner outside the group loses S_ISGID, on a directory too (`setattr_prepare`).
pub fn chmod(ctx: &Ctx, cur: Owner, mode: u32) -> Result<u32> {
    let mut m = mode & 0o7777;
    if cur.flags & fileattr::RESTRICTING != 0 || !ctx.owns(cur) {
        return Err(Errno::EPERM.into());
    }
    if !ctx.is_root() && !ctx.in_group(cur.gid) {
        m &= !libc::S_ISGID;
    }
    Ok((cur.mode & libc::S_IFMT) | m)
}

/// chown: `cur` (whose mode may already carry a chmod of the same request) with new ids.
/// Only root may change the owner; the owner may change the group to one it is in. A chown
/// of a non-directory clears S_ISUID, and S_ISGID when group-execute is set, even when it
/// gives the ids it has (Linux's `chown_common`; fstests generic/193's `chown root` of a
/// root-owned file). An immutable or append-only inode keeps its ids (EPERM).
pub fn chown(ctx: &Ctx, cur: Owner, uid: Option<u32>, gid: Option<u32>) -> Result<Owner> {
    if cur.flags & fileattr::RESTRICTING != 0 {
        return Err(Errno::EPERM.into());
    }
    if uid.is_none() && gid.is_none() {
        return Ok(cur);
    }
    let uid = uid.unwrap_or(cur.uid);
    let gid = gid.unwrap_or(cur.gid);
    if !ctx.is_root()
        && (uid != cur.uid || ctx.uid != cur.uid || (gid != cur.gid && !ctx.in_group(gid)))
    {
        return Err(Errno::EPERM.into());
    }
    let mut mode = cur.mode;
    if !cur.is_dir() {
        mode &= !libc::S_ISUID;
        if mode & libc::S_IXGRP != 0 {
            mode &= !libc::S_ISGID;
        }
    }
    Ok(Owner {
        mode,
        uid,
        gid,
        flags: cur.flags,
    })
}

/// utimens: setting a time to now needs ownership or write permission (EACCES; `acl`: the
/// access ACL), and is EPERM on an immutable inode; to a given time, ownership (EPERM), and
/// neither immutable nor append-only.
pub fn may_set_time(ctx: &Ctx, cur: Owner, acl: Option<&Acl>, t: &SetTime) -> Result<()> {
    match t {
        SetTime::Now if cur.flags & fileattr::IMMUTABLE != 0 => Err(Errno::EPERM.into()),
        SetTime::Now if !ctx.owns(cur) && ctx.permission(cur, acl, Access::W).is_err() => {
            Err(Errno::EACCES.into())
        }
        SetTime::At(_) if cur.flags & fileattr::RESTRICTING != 0 || !ctx.owns(cur) => {
            Err(Errno::EPERM.into())
        }
        _ => Ok(()),
    }
}

/// A change of the size (truncate, ftruncate, open with O_TRUNC): EPERM on an append-only
/// or immutable inode; without a handle opened for writing (`by_handle`), write permission
/// (`acl`: the access ACL).
pub fn may_truncate(ctx: &Ctx, cur: Owner, acl: Option<&Acl>, by_handle: bool) -> Result<()> {
    if cur.flags & fileattr::RESTRICTING != 0 {
        return Err(Errno::EPERM.into());
    }
    if by_handle {
        return Ok(());
    }
    ctx.permission(cur, acl, Access::W)
}

/// What a caller does with an extended attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrOp {
    Get,
    Set,
    Remove,
}

/// Access to extended attribute `name` of `cur` (`acl`: the access ACL). Nothing may be
/// set or removed on an immutable or append-only inode (EPERM). `user.` follows the file's
/// permissions and exists only on regular files and directories; `trusted.` is root's;
/// `security.` may be read by anyone and written by the owner or root; the POSIX ACLs
/// (`system.posix_acl_access` and `_default`) may be read by anyone and set by the owner or
/// root, not on a symlink (EOPNOTSUPP), a default ACL only on a directory (EACCES; removing
/// one from anything else is a no-op, `Ok(false)`); other namespaces are not supported.
/// `Ok(true)`: go ahead.
pub fn xattr_access(
    ctx: &Ctx,
    cur: Owner,
    acl: Option<&Acl>,
    name: &[u8],
    op: XattrOp,
) -> Result<bool> {
    if name.len() > NAME_MAX || name.is_empty() {
        return Err(Errno::ERANGE.into());
    }
    let write = op != XattrOp::Get;
    if write && cur.flags & fileattr::RESTRICTING != 0 {
        return Err(Errno::EPERM.into());
    }
    if name.starts_with(b"user.") {
        let t = cur.mode & libc::S_IFMT;
        if t != libc::S_IFREG && t != libc::S_IFDIR {
            return Err(if write { Errno::EPERM } else { Errno::ENODATA }.into());
        }
        ctx.permission(cur, acl, if write { Access::W } else { Access::R })?;
    } else if name.starts_with(b"trusted.") {
        if !ctx.is_root() {
            return Err(Errno::EPERM.into());
        }
    } else if name == b"security.capability" && op == XattrOp::Remove && !ctx.owns(cur) {
        // The kernel removes a file's capabilities itself when someone writes, truncates or
        // fallocates it (`file_remove_privs` -> `cap_inode_killpriv`), as that caller and
        // without removexattr(2)'s checks (which it makes before a removexattr(2) reaches
        // the file system: CAP_SETFCAP). A writer who does not own the file must get it
        // (generic/688: fallocate by a non-owner was refused with EPERM).
        ctx.permission(cur, acl, Access::W)?;
    } else if name.starts_with(b"security.") {
        if write && !ctx.owns(cur) {
            return Err(Errno::EPERM.into());
        }
    } else if let Some(kind) = acl::Kind::of_xattr(name) {
        if cur.mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(Errno::EOPNOTSUPP.into());
        }
        if !write {
            return Ok(true);
        }
        if kind == acl::Kind::Default && !cur.is_dir() {
            return match op {
                XattrOp::Remove => Ok(false),
                _ => Err(Errno::EACCES.into()),
            };
        }
        if !ctx.owns(cur) {
            return Err(Errno::EPERM.into());
        }
    } else {
        return Err(Errno::EOPNOTSUPP.into());
    }
    Ok(true)
}

/// `may_delete`: whether `ctx` may remove the entry naming `victim` from directory `dir`
/// (unlink, rmdir, a rename's source or the entry it replaces): write and search permission
/// on the directory (`dir_acl`: its access ACL); no removal from an append-only directory,
/// none of an append-only or immutable inode, and the sticky rule (EPERM).
pub fn may_delete(ctx: &Ctx, dir: Owner, dir_acl: Option<&Acl>, victim: Owner) -> Result<()> {
    ctx.permission(dir, dir_acl, Access::WX)?;
    if dir.flags & fileattr::APPEND != 0 || victim.flags & fileattr::RESTRICTING != 0 {
        return Err(Errno::EPERM.into());
    }
    sticky_ok(ctx, dir, victim)
}

/// Whether hard links are protected (`fs.protected_hardlinks`, on unless the sysctl says
/// 0): read once per process, so the rule the kernel applies with `default_permissions` is
/// the one cairn applies without it.
pub fn protected_hardlinks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
            .map(|s| s.trim() != "0")
            .unwrap_or(true)
    })
}

/// Whether `ctx` may make a new name for inode `o` (`acl`: its access ACL), the directory
/// aside: never for an append-only or immutable inode (EPERM); and with protected hard links
/// (`may_linkat`), someone who does not own it only for a regular file without setuid (or
/// setgid with group-execute) that they may read and write (EPERM otherwise).
pub fn may_link(ctx: &Ctx, o: Owner, acl: Option<&Acl>) -> Result<()> {
    if protected_hardlinks() && !ctx.owns(o) {
        let safe = o.mode & libc::S_IFMT == libc::S_IFREG
            && o.mode & libc::S_ISUID == 0
            && o.mode & (libc::S_ISGID | libc::S_IXGRP) != (libc::S_ISGID | libc::S_IXGRP)
            && ctx.permission(o, acl, Access::R | Access::W).is_ok();
        if !safe {
            return Err(Errno::EPERM.into());
        }
    }
    if o.flags & fileattr::RESTRICTING != 0 {
        return Err(Errno::EPERM.into());
    }
    Ok(())
}

/// `may_open`: the access open(2) flags ask for (`acl`: the access ACL); an append-only
/// inode opens for writing only with O_APPEND and never with O_TRUNC, and O_NOATIME is for
/// its owner (EPERM).
pub fn may_open(ctx: &Ctx, o: Owner, acl: Option<&Acl>, flags: i32) -> Result<()> {
    ctx.permission(o, acl, Access::for_open_flags(flags))?;
    if o.flags & fileattr::APPEND != 0
        && ((flags & libc::O_ACCMODE != libc::O_RDONLY && flags & libc::O_APPEND == 0)
            || flags & libc::O_TRUNC != 0)
    {
        return Err(Errno::EPERM.into());
    }
    if flags & libc::O_NOATIME != 0 && !ctx.owns(o) {
        return Err(Errno::EPERM.into());
    }
    Ok(())
}

/// An open flag outside open(2)'s own (bit 30): the caller computes every write's offset
/// itself — the kernel's writeback cache owns the file size and places O_APPEND writes — so
/// the handle's O_APPEND is still checked ([`may_open`]: append-only files) but never moves
/// a write to the end of the file.
pub const O_OFFSETS_FROM_CALLER: i32 = 1 << 30;

/// Whether a write through a handle opened with `flags` goes to the end of the file.
pub fn appends(flags: i32) -> bool {
    flags & libc::O_APPEND != 0 && flags & O_OFFSETS_FROM_CALLER == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_open_needs_execute_permission_not_read() {
        assert_eq!(Access::for_open_flags(libc::O_RDONLY), Access::R);
        assert_eq!(
            Access::for_open_flags(libc::O_RDONLY | FMODE_EXEC),
            Access::X
        );
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
            flags: 0,
        };
        let theirs = Owner {
            mode: libc::S_IFREG | 0o644,
            uid: 2000,
            gid: 0,
            flags: 0,
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
            flags: 0,
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
            flags: 0,
        };
        assert_eq!(chmod(&owner, f, 0o644).unwrap(), libc::S_IFREG | 0o644);
        assert!(
            chmod(&other, f, 0o0777).is_err(),
            "a chmod that only clears setuid is still the owner's"
        );
        assert!(chmod(&other, f, 0o7777).is_err());
        assert_eq!(
            kill_privileges(libc::S_IFREG | 0o6777),
            libc::S_IFREG | 0o777
        );
        assert_eq!(
            kill_privileges(libc::S_IFREG | 0o6767),
            libc::S_IFREG | 0o2767
        );
        assert_eq!(
            kill_privileges(libc::S_IFDIR | 0o2777),
            libc::S_IFDIR | 0o2777
        );
        assert_eq!(handle_flags(&other, 0, other.gid), O_KILL_PRIVILEGES);
        let outside = handle_flags(&other, 0, other.gid + 1);
        assert_eq!(outside, O_KILL_PRIVILEGES | O_KILL_SGID);
        assert_eq!(handle_flags(&Ctx::root(), 0, 12345), 0);
        // Outside the file's group, setgid goes even without group-execute.
        assert_eq!(
            mode_after_data_change(outside, libc::S_IFREG | 0o6666),
            libc::S_IFREG | 0o0666
        );
        assert_eq!(
            mode_after_data_change(O_KILL_PRIVILEGES, libc::S_IFREG | 0o6666),
            libc::S_IFREG | 0o2666
        );
        assert_eq!(
            mode_after_data_change(0, libc::S_IFREG | 0o6777),
            libc::S_IFREG | 0o6777
        );
        assert!(chown(&other, f, None, Some(2000)).is_err());
        let g = chown(&Ctx::root(), f, Some(5), None).unwrap();
        assert_eq!((g.uid, g.mode & 0o7000), (5, 0));
        // The ids it has already: setuid goes all the same (generic/193).
        let s = Owner {
            mode: libc::S_IFREG | 0o6744,
            ..f
        };
        let g = chown(&Ctx::root(), s, Some(s.uid), None).unwrap();
        assert_eq!(
            g.mode & 0o7777,
            0o2744,
            "setgid without group-execute stays"
        );
        assert_eq!(chown(&Ctx::root(), s, None, None).unwrap(), s);
        assert!(
            may_set_time(&other, f, None, &SetTime::Now).is_ok(),
            "writable"
        );
        let ro = Owner {
            mode: libc::S_IFREG | 0o644,
            ..f
        };
        assert_eq!(
            may_set_time(&other, ro, None, &SetTime::Now)
                .unwrap_err()
                .errno(),
            Errno::EACCES
        );
        assert_eq!(
            may_set_time(&other, f, None, &SetTime::At(std::time::UNIX_EPOCH))
                .unwrap_err()
                .errno(),
            Errno::EPERM
        );
        let x = |c: &Ctx, o: Owner, n: &[u8], op| {
            xattr_access(c, o, None, n, op).map_err(|e| e.errno())
        };
        assert!(x(&other, ro, b"user.x", XattrOp::Set).is_err());
        assert!(x(&other, ro, b"user.x", XattrOp::Get).is_ok());
        assert!(x(&other, ro, b"trusted.x", XattrOp::Get).is_err());
        assert_eq!(x(&other, ro, acl::ACCESS_XATTR, XattrOp::Get), Ok(true));
        let e = |c: &Ctx, o: Owner, n: &[u8]| x(c, o, n, XattrOp::Set);
        assert_eq!(
            e(&other, ro, acl::ACCESS_XATTR),
            Err(Errno::EPERM),
            "not the owner"
        );
        assert_eq!(e(&owner, ro, acl::ACCESS_XATTR), Ok(true));
        assert_eq!(
            e(&owner, ro, acl::DEFAULT_XATTR),
            Err(Errno::EACCES),
            "not a directory"
        );
        assert_eq!(
            x(&owner, ro, acl::DEFAULT_XATTR, XattrOp::Remove),
            Ok(false)
        );
        assert_eq!(e(&owner, ro, b"system.other"), Err(Errno::EOPNOTSUPP));
        // A file's capabilities: the kernel removes them for anyone who writes the file
        // (generic/688); nobody else but the owner changes them.
        let cap = b"security.capability";
        let writable = Owner {
            mode: libc::S_IFREG | 0o666,
            ..ro
        };
        assert_eq!(x(&other, writable, cap, XattrOp::Remove), Ok(true));
        assert_eq!(x(&other, ro, cap, XattrOp::Remove), Err(Errno::EACCES));
        assert_eq!(x(&other, writable, cap, XattrOp::Set), Err(Errno::EPERM));
        assert_eq!(
            x(&other, writable, b"security.selinux", XattrOp::Remove),
            Err(Errno::EPERM)
        );
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

    fn own(mode: u32, uid: u32, gid: u32, flags: u32) -> Owner {
        Owner {
            mode,
            uid,
            gid,
            flags,
        }
    }

    fn errno(r: Result<()>) -> Option<i32> {
        r.err().map(|e| e.errno().0)
    }

    #[test]
    fn acl_decides_for_everyone_but_the_owner() {
        // u::rw-, u:1000:rwx, g::r--, m::rw-, o::---
        let mut b = acl::VERSION.to_le_bytes().to_vec();
        for (t, p, id) in [
            (1u16, 6u16, u32::MAX),
            (2, 7, 1000),
            (4, 4, u32::MAX),
            (0x10, 6, u32::MAX),
            (0x20, 0, u32::MAX),
        ] {
            b.extend_from_slice(&t.to_le_bytes());
            b.extend_from_slice(&p.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        let a = Acl::decode(&b).unwrap().unwrap();
        let f = own(libc::S_IFREG | 0o660, 5, 5, 0);
        let bob = Ctx::user(1000, 1000);
        assert_eq!(
            errno(bob.permission(f, Some(&a), Access::W)),
            None,
            "named user"
        );
        assert_eq!(
            errno(bob.permission(f, None, Access::W)),
            Some(libc::EACCES)
        );
        assert_eq!(
            errno(bob.permission(f, Some(&a), Access::X)),
            Some(libc::EACCES),
            "masked"
        );
        // The owner goes by the mode whatever the ACL says.
        let owner = Ctx::user(5, 5);
        assert_eq!(errno(owner.permission(f, Some(&a), Access::W)), None);
        // With the group bits (the mask) empty, the ACL is skipped, as Linux does: a named
        // user then gets the other bits.
        let masked = own(libc::S_IFREG | 0o604, 5, 5, 0);
        assert_eq!(errno(bob.permission(masked, Some(&a), Access::R)), None);
        // Root: read and write anyway, execute only with an x bit.
        let r = Ctx::root();
        assert_eq!(errno(r.permission(f, Some(&a), Access::W)), None);
        assert_eq!(
            errno(r.permission(f, Some(&a), Access::X)),
            Some(libc::EACCES)
        );
    }

    #[test]
    fn immutable_and_append_only() {
        let owner = Ctx::user(1000, 1000);
        let r = Ctx::root();
        let i = own(libc::S_IFREG | 0o666, 1000, 1000, fileattr::IMMUTABLE);
        let a = own(libc::S_IFREG | 0o666, 1000, 1000, fileattr::APPEND);
        // Writing an immutable inode is EPERM even for root; reading is not affected.
        assert_eq!(errno(r.permission(i, None, Access::W)), Some(libc::EPERM));
        assert_eq!(errno(owner.permission(i, None, Access::R)), None);
        assert_eq!(
            errno(may_open(&owner, a, None, libc::O_WRONLY)),
            Some(libc::EPERM)
        );
        assert_eq!(
            errno(may_open(&owner, a, None, libc::O_WRONLY | libc::O_APPEND)),
            None
        );
        let t = libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC;
        assert_eq!(errno(may_open(&r, a, None, t)), Some(libc::EPERM));
        assert_eq!(errno(may_truncate(&r, a, None, true)), Some(libc::EPERM));
        assert_eq!(
            errno(may_truncate(
                &owner,
                own(libc::S_IFREG | 0o644, 1000, 1000, 0),
                None,
                false
            )),
            None
        );
        for o in [i, a] {
            assert!(chmod(&r, o, 0o600).is_err());
            assert!(chown(&r, o, Some(5), None).is_err());
            assert!(may_set_time(&r, o, None, &SetTime::At(std::time::UNIX_EPOCH)).is_err());
            let w = xattr_access(&r, o, None, b"user.x", XattrOp::Set).map(|_| ());
            assert_eq!(errno(w), Some(libc::EPERM));
            assert_eq!(errno(may_link(&r, o, None)), Some(libc::EPERM));
        }
        assert_eq!(
            errno(may_set_time(&owner, a, None, &SetTime::Now)),
            None,
            "touch"
        );
        assert_eq!(
            errno(may_set_time(&owner, i, None, &SetTime::Now)),
            Some(libc::EPERM)
        );
        // Removal: from an append-only directory, or of a restricted inode.
        let d = own(libc::S_IFDIR | 0o777, 0, 0, 0);
        let ad = own(libc::S_IFDIR | 0o777, 0, 0, fileattr::APPEND);
        let plain = own(libc::S_IFREG | 0o644, 1000, 1000, 0);
        assert_eq!(errno(may_delete(&owner, d, None, plain)), None);
        assert_eq!(
            errno(may_delete(&owner, ad, None, plain)),
            Some(libc::EPERM)
        );
        assert_eq!(errno(may_delete(&owner, d, None, i)), Some(libc::EPERM));
        let id = own(libc::S_IFDIR | 0o777, 0, 0, fileattr::IMMUTABLE);
        assert_eq!(errno(may_delete(&r, id, None, plain)), Some(libc::EPERM));
    }

    #[test]
    fn protected_hard_links() {
        if !protected_hardlinks() {
            return;
        }
        let other = Ctx::user(2000, 2000);
        let rw = own(libc::S_IFREG | 0o666, 1000, 1000, 0);
        let ro = own(libc::S_IFREG | 0o644, 1000, 1000, 0);
        let su = own(libc::S_IFREG | 0o4666, 1000, 1000, 0);
        let fifo = own(libc::S_IFIFO | 0o666, 1000, 1000, 0);
        assert_eq!(errno(may_link(&other, rw, None)), None);
        for o in [ro, su, fifo] {
            assert_eq!(errno(may_link(&other, o, None)), Some(libc::EPERM), "{o:?}");
        }
        assert_eq!(
            errno(may_link(&Ctx::user(1000, 1000), ro, None)),
            None,
            "the owner"
        );
    }

    #[test]
    fn supplementary_groups() {
        let mut u = Ctx::user(1000, 1000);
        u.groups = Some(vec![44]);
        assert!(u.check(0o100060, 0, 44, Access::R).is_ok());
        assert!(u.check(0o100060, 0, 45, Access::R).is_err());
    }

    /// One answer for every format: no type is a regular file, a directory EPERM naming
    /// mkdir, a symlink or unknown type EINVAL, a device EPERM without root; the device
    /// number only for a device, the permission bits kept.
    #[test]
    fn mknod_arguments_are_checked_alike() {
        use crate::FileKind;
        let root = Ctx::root();
        let user = Ctx {
            uid: 1000,
            gid: 1000,
            ..Ctx::root()
        };
        let m = mknod(&user, 0o644, 7).unwrap();
        assert_eq!(
            (m.kind, m.mode, m.rdev),
            (FileKind::RegularFile, libc::S_IFREG | 0o644, 0)
        );
        let m = mknod(&user, libc::S_IFIFO | 0o4755, 9).unwrap();
        assert_eq!(
            (m.kind, m.mode, m.rdev),
            (FileKind::Fifo, libc::S_IFIFO | 0o4755, 0)
        );
        let m = mknod(&root, libc::S_IFCHR | 0o600, 0x0103).unwrap();
        assert_eq!((m.kind, m.rdev), (FileKind::CharDevice, 0x0103));
        assert_eq!(
            mknod(&user, libc::S_IFBLK | 0o600, 1),
            Err(MknodError::DeviceNeedsRoot)
        );
        assert_eq!(
            mknod(&root, libc::S_IFDIR | 0o755, 0),
            Err(MknodError::Directory)
        );
        assert_eq!(
            mknod(&root, libc::S_IFLNK | 0o777, 0),
            Err(MknodError::NotANode(libc::S_IFLNK))
        );
        assert_eq!(
            mknod(&root, 0o030000, 0),
            Err(MknodError::NotANode(0o030000))
        );
        for (e, errno, says) in [
            (MknodError::Directory, Errno::EPERM, "use mkdir"),
            (
                MknodError::NotANode(libc::S_IFLNK),
                Errno::EINVAL,
                "use symlink",
            ),
            (MknodError::DeviceNeedsRoot, Errno::EPERM, "as root"),
        ] {
            assert_eq!(FsError::from(e).errno(), errno);
            assert!(e.to_string().contains(says), "{e}");
        }
    }
}
