//! The file-system contract of cairn.
//!
//! Every file system in cairn (the FFS-style format in each of its consistency modes, later
//! the log-structured format and the policy layer) implements [`FileSystem`]. The FUSE adapter
//! is the only consumer that talks to the kernel; tests and tools can drive a file system
//! through this trait directly, without a mount, exactly as mountpoint-s3 separates its
//! file-system crate from its FUSE glue.
//!
//! The contract is inode-number based, like the FUSE low-level API, because that is what the
//! kernel hands us and what lets a file system avoid path resolution on every call. Every
//! error carries its errno (see [`FsError::errno`]).
//!
//! Permission checks are the file system's job (owner/group/other, POSIX ACLs, sticky
//! directories, immutable and append-only inodes, root's bypass: [`perm`], [`acl`],
//! [`fileattr`]): the FUSE adapter may additionally let the kernel check with
//! `default_permissions`, but a file system driven directly must still be safe.

use std::ffi::OsStr;
use std::time::SystemTime;

pub mod acl;
mod error;
pub mod falloc;
pub mod fileattr;
pub mod modes;
pub mod options;
pub mod perm;
pub mod sched;
pub mod size;
pub mod time;

pub use time::{TIME_MAX_SECS, TIME_MIN_SECS, clamp_time};

pub use error::{Errno, FsError, Result};
pub use perm::{Access, Ctx, Owner};
pub use perm::{LINK_MAX, NAME_MAX};
pub use size::parse_size;

/// An inode number as the file system knows it. The FUSE adapter maps the kernel's root (1)
/// to [`FileSystem::root_ino`].
pub type Ino = u64;
/// An open-file or open-directory handle returned by open/create/opendir.
pub type Fh = u64;

/// What kind of object an inode is. The numeric values are the `S_IFMT` bits >> 12, which is
/// also how the FFS format stores them in directory entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FileKind {
    Fifo,
    CharDevice,
    Directory,
    BlockDevice,
    RegularFile,
    Symlink,
    Socket,
}

impl FileKind {
    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::BlockDevice => libc::S_IFBLK,
            FileKind::RegularFile => libc::S_IFREG,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Socket => libc::S_IFSOCK,
        }
    }

    /// The kind named by the `S_IFMT` bits of `mode`, if any.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFDIR => FileKind::Directory,
            libc::S_IFBLK => FileKind::BlockDevice,
            libc::S_IFREG => FileKind::RegularFile,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFSOCK => FileKind::Socket,
            _ => return None,
        })
    }

    /// The `d_type` value (`DT_*`) for directory listings.
    pub fn dtype(self) -> u8 {
        (self.mode_bits() >> 12) as u8
    }

    pub fn from_dtype(t: u8) -> Option<FileKind> {
        Self::from_mode((t as u32) << 12)
    }
}

/// Attributes of an inode, as `stat` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    /// Generation number: distinguishes reuses of the same inode number.
    pub generation: u64,
    pub size: u64,
    /// Space allocated, in 512-byte units (as `st_blocks`).
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (mode & 0o7777).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// Preferred I/O size (`st_blksize`).
    pub blksize: u32,
    pub flags: u32,
}

/// A time to set with setattr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The fields setattr changes; `None` leaves a field alone. Which timestamps change as a
/// side effect (ctime on every change, mtime on truncate) is the file system's job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<SystemTime>,
    /// The handle the change was made through, if any (ftruncate): permission to truncate
    /// was checked at open time.
    pub fh: Option<Fh>,
}

impl SetAttr {
    /// The same change with every time it sets brought into the range cairn keeps
    /// ([`clamp_time`]).
    pub fn with_times_clamped(self) -> SetAttr {
        let at = |t: Option<SetTime>| match t {
            Some(SetTime::At(t)) => Some(SetTime::At(clamp_time(t))),
            t => t,
        };
        SetAttr {
            atime: at(self.atime),
            mtime: at(self.mtime),
            ctime: self.ctime.map(clamp_time),
            ..self
        }
    }
}

/// rename(2) / renameat2(2) flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
    /// RENAME_WHITEOUT: the old name is left naming a new whiteout (a character device
    /// 0/0, [`WHITEOUT_MODE`], owned by the caller) in the same atomic step — what overlay
    /// file systems leave where a lower file was. Needs CAP_MKNOD ([`perm::whiteout`]). A
    /// file system that does not make whiteouts says so in
    /// [`FileSystem::supports_whiteout`] and is never handed this flag by the adapter.
    pub whiteout: bool,
}

/// A whiteout's mode: a character device with no permission bits (the kernel's
/// `S_IFCHR | WHITEOUT_MODE`); its device number is 0/0 (`WHITEOUT_DEV`).
pub const WHITEOUT_MODE: u32 = libc::S_IFCHR;

impl RenameFlags {
    /// Decodes the `RENAME_*` bits as `do_renameat2` does: unknown bits are EINVAL, and so
    /// are NOREPLACE or WHITEOUT with EXCHANGE (an exchange removes no name to leave a
    /// whiteout at, and replaces by definition). WHITEOUT with NOREPLACE is allowed.
    pub fn from_bits(bits: u32) -> Result<RenameFlags> {
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if bits & !known != 0 {
            return Err(FsError::Errno(Errno::EINVAL));
        }
        let f = RenameFlags {
            noreplace: bits & libc::RENAME_NOREPLACE != 0,
            exchange: bits & libc::RENAME_EXCHANGE != 0,
            whiteout: bits & libc::RENAME_WHITEOUT != 0,
        };
        if f.exchange && (f.noreplace || f.whiteout) {
            return Err(FsError::Errno(Errno::EINVAL));
        }
        Ok(f)
    }
}

/// One directory entry handed to a readdir callback.
#[derive(Clone, Debug)]
pub struct DirEntry<'a> {
    pub ino: Ino,
    /// The cookie that resumes the listing *after* this entry.
    pub next_offset: u64,
    pub kind: FileKind,
    pub name: &'a OsStr,
    /// Filled for readdirplus.
    pub attr: Option<Attr>,
}

/// `statfs` results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// What the FUSE adapter may let the kernel cache for this file system, chosen by the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelCachePolicy {
    /// Whether the kernel may buffer writes in its page cache (FUSE writeback cache).
    pub writeback_cache: WritebackCache,
    /// How long the kernel may trust entries and attributes it was given.
    pub entry_ttl: std::time::Duration,
    pub attr_ttl: std::time::Duration,
    /// How long the kernel may remember that a name does not exist.
    pub negative_ttl: std::time::Duration,
}

/// Whether the kernel may buffer write(2) in its page cache (the FUSE writeback cache) before
/// the file system sees it.
///
/// The cost of the cache is where a failure surfaces: a write the kernel accepted into its
/// cache reaches the file system later, so an ENOSPC or EFBIG it meets is reported at fsync,
/// msync or close (and in the daemon's log), not by the write(2) that was told "written".
/// The full-disk reserve (`FileSystem::set_writeback_reserve`) keeps room for everything the
/// kernel holds dirty when the disk fills and gives opens made on a nearly full disk
/// FOPEN_DIRECT_IO, so that loss needs a file opened while there was room and written past
/// the reserve after the disk filled (docs/DESIGN.md, "A full disk").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritebackCache {
    /// Never: every write must reach the file system before write(2) returns — a mode that
    /// makes each call durable when it returns, or a layer that must see a write's ENOSPC to
    /// act on it.
    Never,
    /// Only when the mount asks for it (`-o writeback_cache=yes`): the mode's promise
    /// allows it (calls are durable on fsync), but by default write(2) itself reports ENOSPC,
    /// as on a kernel file system.
    OnRequest,
    /// Unless the mount turns it off.
    Default,
}

impl WritebackCache {
    /// Whether the cache is on for a mount that asked `asked` (`-o writeback_cache=`, `None`
    /// when not given); `None` when it asked for it where the policy never allows it (the
    /// mount is refused).
    pub fn decide(self, asked: Option<bool>) -> Option<bool> {
        match (self, asked) {
            (WritebackCache::Never, Some(true)) => None,
            (WritebackCache::Default, None | Some(true))
            | (WritebackCache::OnRequest, Some(true)) => Some(true),
            _ => Some(false),
        }
    }
}

impl KernelCachePolicy {
    /// The policy of a format whose calls are made durable as `commit` says, with entries and
    /// attributes trusted for a minute (nothing but this mount changes the image): the
    /// writeback cache on request where a write need not be durable when it returns.
    pub fn for_commit(commit: modes::Commit) -> KernelCachePolicy {
        let minute = std::time::Duration::from_secs(60);
        KernelCachePolicy {
            writeback_cache: match commit {
                modes::Commit::Async => WritebackCache::OnRequest,
                modes::Commit::Sync | modes::Commit::Group => WritebackCache::Never,
            },
            entry_ttl: minute,
            attr_ttl: minute,
            negative_ttl: minute,
        }
    }
}

/// When a read updates a file's access time: the mount's `relatime` (the default),
/// `strictatime` or `noatime`. The kernel leaves a FUSE file system's atime to it (its
/// inodes are `S_NOATIME`), so the file system applies the mount's choice itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Atime {
    /// Only when the access time is not later than the change or modification time, or is
    /// a day old (Linux's relatime).
    #[default]
    Relative,
    /// On every read.
    Strict,
    /// Never.
    Never,
}

impl Atime {
    /// Whether a read at `now` updates an access time of `atime` (nanoseconds since the
    /// epoch, as `mtime` and `ctime`).
    pub fn updates(self, atime: i128, mtime: i128, ctime: i128, now: i128) -> bool {
        const DAY_NS: i128 = 86_400 * 1_000_000_000;
        match self {
            Atime::Never => false,
            Atime::Strict => true,
            Atime::Relative => atime <= mtime || atime <= ctime || now - atime > DAY_NS,
        }
    }
}

/// `fallocate` mode bits (`FALLOC_FL_*`).
pub type FallocMode = i32;

/// The contract. Methods take `&self`: a file system does its own locking, so the FUSE
/// adapter can serve requests from several threads.
pub trait FileSystem: Send + Sync {
    /// The inode number of the root directory.
    fn root_ino(&self) -> Ino;

    /// What the kernel may cache.
    fn cache_policy(&self) -> KernelCachePolicy;

    /// Whether this file system keeps and enforces POSIX ACLs (the `system.posix_acl_*`
    /// attributes, [`acl`]): then the kernel may check them too (FUSE_POSIX_ACL), so its
    /// getxattr of them must answer ENODATA, never EOPNOTSUPP, for an inode without one.
    fn posix_acls(&self) -> bool {
        false
    }

    /// Whether this file system clears setuid and setgid itself when someone without
    /// CAP_FSETID writes or truncates a file (FUSE_HANDLE_KILLPRIV: [`perm::kill_privileges`]),
    /// so the kernel need not send a mode change as the writer for it.
    fn kills_privileges(&self) -> bool {
        false
    }

    fn statfs(&self) -> Result<StatFs>;

    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<Attr>;

    /// The kernel dropped `nlookup` references to `ino`. An unlinked inode's storage may be
    /// freed once both the kernel and every open handle have let go of it.
    fn forget(&self, _ino: Ino, _nlookup: u64) {}

    /// Whether an inode number names one inode for the life of the image, across mounts,
    /// and a reused number comes with a new [`Attr::generation`]: then the kernel may put
    /// numbers in file handles (name_to_handle_at, NFS export) and ask for one back by
    /// number after it forgot the inode (FUSE_EXPORT_SUPPORT, [`FileSystem::lookup_number`]).
    /// A file system whose numbers live in memory only must say false: a handle kept
    /// across a remount would otherwise open whatever file got its number.
    fn stable_numbers(&self) -> bool {
        false
    }

    /// Inode `ino` found by its number alone (a file handle's): its attributes, counted as
    /// a lookup as [`FileSystem::lookup`] counts one (the kernel forgets it later). ESTALE
    /// for a number that names no inode in use: free, beyond the inode table, or unlinked
    /// (as ext4 answers an unlinked inode's handle); never another inode's attributes.
    ///
    /// The default suits a file system that counts no lookups ([`FileSystem::forget`] does
    /// nothing): one that counts them must count this one too.
    fn lookup_number(&self, ino: Ino) -> Result<Attr> {
        if !self.stable_numbers() {
            return Err(Errno::ESTALE.into());
        }
        match self.getattr(ino) {
            Ok(a) if a.nlink > 0 => Ok(a),
            Ok(_) => Err(Errno::ESTALE.into()),
            Err(e) if e.errno() == Errno::ENOENT => Err(Errno::ESTALE.into()),
            Err(e) => Err(e),
        }
    }

    fn getattr(&self, ino: Ino) -> Result<Attr>;

    fn setattr(&self, ctx: &Ctx, ino: Ino, set: SetAttr) -> Result<Attr>;

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>>;

    /// Creates a non-directory, non-symlink node; `mode` includes the `S_IFMT` bits.
    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr>;

    fn mkdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr>;

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()>;

    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()>;

    fn symlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr, target: &[u8]) -> Result<Attr>;

    /// Whether `rename` honours [`RenameFlags::whiteout`]. A file system that does not is
    /// never handed the flag: the FUSE adapter answers EINVAL, as Linux does for a file
    /// system without whiteouts, so the flag is never ignored into a plain rename.
    fn supports_whiteout(&self) -> bool {
        false
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()>;

    fn link(&self, ctx: &Ctx, ino: Ino, new_parent: Ino, new_name: &OsStr) -> Result<Attr>;

    /// Opens a file; `flags` are the open(2) flags (O_ACCMODE, O_TRUNC, O_APPEND, ...).
    fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Fh>;

    /// Creates and opens a regular file.
    fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)>;

    /// open(2) with O_TMPFILE: creates and opens a regular file in `parent`'s file system
    /// that no name reaches (link count 0), checked and owned as `create` would (write and
    /// search permission on `parent`, its setgid bit and default ACL inherited). The inode
    /// lives while a handle or kernel reference holds it and is freed then, unless a link
    /// named it meanwhile; a crash while it is open leaves nothing behind after recovery.
    /// It may be linked (`link` of a count-0 inode) only if `flags` lacks O_EXCL (Linux's
    /// I_LINKABLE), and only until its first link: any other inode with no link stays
    /// ENOENT to `link`. The attributes returned are the new inode's (link count 0).
    ///
    /// The default is EOPNOTSUPP, which the kernel hands to open(2) as it is: programs
    /// that try O_TMPFILE fall back to a named temporary file on it.
    fn tmpfile(
        &self,
        _ctx: &Ctx,
        _parent: Ino,
        _mode: u32,
        _umask: u32,
        _flags: i32,
    ) -> Result<(Attr, Fh)> {
        Err(FsError::Errno(Errno::EOPNOTSUPP))
    }

    /// Reads up to `size` bytes at `offset` into `buf` (cleared first); short at end of file.
    fn read(&self, ino: Ino, fh: Fh, offset: u64, size: u32, buf: &mut Vec<u8>) -> Result<()>;

    /// Writes `data` at `offset` (at end of file if the handle was opened with O_APPEND);
    /// returns the bytes written.
    fn write(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32>;

    /// close(2) on one descriptor of the handle.
    fn flush(&self, _ino: Ino, _fh: Fh) -> Result<()> {
        Ok(())
    }

    /// The last descriptor of the handle is gone.
    fn release(&self, ino: Ino, fh: Fh) -> Result<()>;

    /// A host descriptor the kernel may read and write directly for this open handle (FUSE
    /// passthrough), bypassing `read`/`write`. Return one only when the handle is a plain
    /// host file whose every byte this file system would otherwise copy unchanged, and no
    /// write needs to be seen here (e.g. to react to ENOSPC). The descriptor should be open
    /// for reading and writing where possible: the kernel shares one backing file among all
    /// opens of an inode while any is passed through, whatever each open's access mode.
    /// `release` (and so anything done on last close) still reaches the file system.
    fn backing_fd(&self, _ino: Ino, _fh: Fh) -> Option<std::os::fd::OwnedFd> {
        None
    }

    /// When this returns, the file's data and the metadata needed to find it are durable.
    fn fsync(&self, ino: Ino, fh: Fh, datasync: bool) -> Result<()>;

    fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<Fh>;

    /// Lists entries starting at the cookie `offset` (0 = beginning; `.` and `..` included).
    /// `emit` returns false when the reply buffer is full; the entry it refused is offered
    /// again at the next call. With `plus`, entries carry attributes and count as lookups.
    fn readdir(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        plus: bool,
        emit: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()>;

    fn releasedir(&self, _ino: Ino, _fh: Fh) -> Result<()> {
        Ok(())
    }

    fn fsyncdir(&self, ino: Ino, fh: Fh, datasync: bool) -> Result<()>;

    fn setxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> Result<()>;

    fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<Vec<u8>>;

    /// Names, each followed by a NUL byte.
    fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<u8>>;

    fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<()>;

    fn access(&self, ctx: &Ctx, ino: Ino, mask: Access) -> Result<()>;

    /// The inode's flags (`FS_IOC_GETFLAGS`, lsattr: [`fileattr`]). The default, for a
    /// file system that keeps none, is ENOTTY, as the kernel answers for one.
    fn get_flags(&self, _ctx: &Ctx, _ino: Ino) -> Result<u32> {
        Err(FsError::Errno(Errno(libc::ENOTTY)))
    }

    /// The inode's attributes with its flags (the answer [`FileSystem::get_flags`] would
    /// give, kept apart: no flags is no error), for statx, which reports both: a file
    /// system that holds them in one inode answers with one look at it. The default asks
    /// for each.
    fn getattr_flags(&self, ctx: &Ctx, ino: Ino) -> Result<(Attr, Result<u32>)> {
        let a = self.getattr(ino)?;
        Ok((a, self.get_flags(ctx, ino)))
    }

    /// Sets the inode's flags (`FS_IOC_SETFLAGS`, chattr) under [`fileattr::set_flags`]'s
    /// rules.
    fn set_flags(&self, _ctx: &Ctx, _ino: Ino, _flags: u32) -> Result<()> {
        Err(FsError::Errno(Errno(libc::ENOTTY)))
    }

    fn fallocate(&self, ino: Ino, fh: Fh, offset: u64, length: u64, mode: FallocMode)
    -> Result<()>;

    /// SEEK_DATA / SEEK_HOLE; the default treats the whole file as data.
    fn lseek(&self, ino: Ino, _fh: Fh, offset: u64, whence: i32) -> Result<u64> {
        let size = self.getattr(ino)?.size;
        if offset >= size {
            return Err(FsError::Errno(Errno::ENXIO));
        }
        match whence {
            libc::SEEK_DATA => Ok(offset),
            libc::SEEK_HOLE => Ok(size),
            _ => Err(FsError::Errno(Errno::EINVAL)),
        }
    }

    /// A write of pages the kernel has already accepted: its write-back of a shared
    /// mapping's dirty pages (FUSE_WRITE_CACHE). The program was told "written" long ago,
    /// so this write may use the room held back for it ([`FileSystem::set_writeback_reserve`]);
    /// if it still fails, the loss reaches the program through msync, fsync and close.
    fn write_back(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        self.write(ino, fh, offset, data)
    }

    /// How many bytes of dirty pages the kernel may hold for this mount at once (its dirty
    /// limit, set by the FUSE adapter): the room every call but [`FileSystem::write_back`]
    /// must leave free, so what the kernel already accepted can always be stored. A full
    /// disk then fails the call that asked for room, with ENOSPC, instead of a write-back
    /// nobody waits for (docs/DESIGN.md, "A full disk").
    fn set_writeback_reserve(&self, bytes: u64) {
        let _ = bytes;
    }

    /// Whether the room beyond the write-back reserve is below the reserve itself: then
    /// the FUSE adapter opens files for writing without the kernel's page cache, so no new
    /// shared mapping can accept pages the file system may not be able to store.
    fn room_is_short(&self) -> bool {
        false
    }

    /// When reads update access times (the mount's atime option; set once, at mount).
    fn set_atime(&self, policy: Atime) {
        let _ = policy;
    }

    /// Writes everything dirty and makes it durable (sync(2), unmount).
    fn sync_all(&self) -> Result<()>;

    /// Final flush before the file system goes away; the default syncs.
    fn destroy(&self) -> Result<()> {
        self.sync_all()
    }

    /// Live counters as JSON text for `cairn stats`.
    fn stats_json(&self) -> String {
        "{}".to_string()
    }

    /// A background check of the mounted file system while calls go on (`cairn fsck
    /// --background`, soft updates' background fsck, 002 §3.3): reclaims what a crash may
    /// leak in a mode that promises nothing worse. `progress(done, total)` is called as it
    /// goes; the answer is a one-object JSON summary. The default (and any mode where a
    /// live check would be unsound) refuses with a one-line reason.
    fn check_background(&self, progress: &(dyn Fn(u64, u64) + Sync)) -> Result<String> {
        let _ = progress;
        Err(FsError::Refused(
            Errno::EOPNOTSUPP,
            "this file system has no background check".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every time a setattr sets (atime, mtime, ctime) is clamped; "now" and the other
    /// fields are left as asked.
    #[test]
    fn a_setattr_s_times_are_clamped() {
        use std::time::{Duration, UNIX_EPOCH};
        let late = UNIX_EPOCH + Duration::from_secs(TIME_MAX_SECS as u64 + 100);
        let early = UNIX_EPOCH - Duration::from_secs(TIME_MIN_SECS.unsigned_abs() + 100);
        let set = SetAttr {
            size: Some(7),
            atime: Some(SetTime::At(late)),
            mtime: Some(SetTime::At(early)),
            ctime: Some(late),
            ..SetAttr::default()
        };
        let c = set.with_times_clamped();
        assert_eq!(c.atime, Some(SetTime::At(clamp_time(late))));
        assert_eq!(c.mtime, Some(SetTime::At(clamp_time(early))));
        assert_eq!(c.ctime, Some(clamp_time(late)));
        assert_ne!(clamp_time(late), late, "the range ends before");
        assert_ne!(clamp_time(early), early, "and starts after");
        assert_eq!(c.size, Some(7));
        let now = SetAttr {
            atime: Some(SetTime::Now),
            ..SetAttr::default()
        };
        assert_eq!(now.with_times_clamped(), now);
    }

    /// `do_renameat2`'s flag rules: WHITEOUT alone or with NOREPLACE; never with EXCHANGE.
    #[test]
    fn rename_flags_decode_as_linux() {
        let (nr, ex, wo) = (
            libc::RENAME_NOREPLACE,
            libc::RENAME_EXCHANGE,
            libc::RENAME_WHITEOUT,
        );
        let f = RenameFlags::from_bits(wo).unwrap();
        assert!(f.whiteout && !f.noreplace && !f.exchange);
        let f = RenameFlags::from_bits(wo | nr).unwrap();
        assert!(f.whiteout && f.noreplace);
        for bad in [wo | ex, nr | ex, wo | nr | ex, 1 << 3] {
            assert!(
                matches!(
                    RenameFlags::from_bits(bad),
                    Err(FsError::Errno(Errno::EINVAL))
                ),
                "{bad:#x}"
            );
        }
        assert!(!RenameFlags::from_bits(0).unwrap().whiteout);
    }
}
