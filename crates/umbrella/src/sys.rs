//! Host system calls relative to directory descriptors.
//!
//! Every path the layer touches is resolved from a branch's root descriptor: directories
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, final components with the `*at`
//! calls and `AT_SYMLINK_NOFOLLOW`/`O_NOFOLLOW`. So a name with `..`, a symlink planted in a
//! branch or a rename racing with us can never make the layer read, write or create
//! anything outside the branch directories (issue 3, item 8).
//!
//! This is the one module with `unsafe`: thin wrappers over libc calls whose only
//! obligations are valid NUL-terminated strings, valid descriptors and correctly sized
//! buffers, each stated at the call.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_vfs::{Attr, FileKind};

/// A branch file's attributes: stat(2)'s fields, and its birth time where the branch keeps
/// one. The layer reports the birth time it is given (FUSE_STATX carries it), so it must be
/// the branch's own: a stand-in such as the change time runs ahead of the access and
/// modification times as soon as anything (a chown after mknod, a link) changes the inode,
/// and statx then shows a file born after it was last written (fstests generic/423).
#[derive(Clone, Copy)]
pub struct Stat {
    st: libc::stat,
    /// `stx_btime` (seconds, nanoseconds) when the branch reported STATX_BTIME.
    pub btime: Option<(i64, i64)>,
}

impl std::ops::Deref for Stat {
    type Target = libc::stat;
    fn deref(&self) -> &libc::stat {
        &self.st
    }
}

impl std::ops::DerefMut for Stat {
    fn deref_mut(&mut self) -> &mut libc::stat {
        &mut self.st
    }
}

/// statx(2) of `name` under `dir` (or of `dir` itself with AT_EMPTY_PATH and ""), as a
/// [`Stat`]: one call for stat's fields and the birth time.
fn statx(dir: BorrowedFd<'_>, name: &std::ffi::CStr, flags: libc::c_int) -> io::Result<Stat> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut x: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated name and a statx buffer of the right type.
    cvt(unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::AT_STATX_SYNC_AS_STAT,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut x,
        )
    })?;
    let mut st = zero_stat();
    st.st_dev = libc::makedev(x.stx_dev_major, x.stx_dev_minor);
    st.st_ino = x.stx_ino;
    st.st_mode = x.stx_mode as libc::mode_t;
    st.st_nlink = x.stx_nlink as libc::nlink_t;
    st.st_uid = x.stx_uid;
    st.st_gid = x.stx_gid;
    st.st_rdev = libc::makedev(x.stx_rdev_major, x.stx_rdev_minor);
    st.st_size = x.stx_size as libc::off_t;
    st.st_blksize = x.stx_blksize as libc::blksize_t;
    st.st_blocks = x.stx_blocks as libc::blkcnt_t;
    st.st_atime = x.stx_atime.tv_sec;
    st.st_atime_nsec = x.stx_atime.tv_nsec as i64;
    st.st_mtime = x.stx_mtime.tv_sec;
    st.st_mtime_nsec = x.stx_mtime.tv_nsec as i64;
    st.st_ctime = x.stx_ctime.tv_sec;
    st.st_ctime_nsec = x.stx_ctime.tv_nsec as i64;
    if x.stx_mask & libc::STATX_BTIME != 0 {
        st.btime = Some((x.stx_btime.tv_sec, x.stx_btime.tv_nsec as i64));
    }
    Ok(st)
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_l(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_s(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A name or relative path as a C string. Names from the kernel never hold NUL; a path
/// that does is refused with EINVAL rather than truncated.
pub fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Opens the directory `rel` (relative, `/`-separated, empty for the root itself) beneath
/// `root` without following any symlink and without leaving `root`.
pub fn open_dir_beneath(root: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    let path = if rel.is_empty() {
        cstr(b".")?
    } else {
        cstr(rel)?
    };
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `path` is NUL-terminated, `how` is a zero-initialised open_how of the size
    // passed; the kernel returns a new descriptor we take ownership of.
    let fd = cvt_l(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    })?;
    // SAFETY: a fresh descriptor returned by openat2.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Opens a directory by absolute path (branch roots), following nothing at the end.
pub fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    let p = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: NUL-terminated path; new descriptor owned below.
    let fd = cvt(unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn openat(dir: BorrowedFd<'_>, name: &OsStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let n = cstr(name.as_bytes())?;
    // SAFETY: NUL-terminated name, valid dir fd; mode is passed as the variadic argument.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            n.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A real (readable) directory descriptor for a directory beneath `root`.
pub fn open_dir_read(root: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    let p = open_dir_beneath(root, rel)?;
    reopen_dir(p.as_fd_b())
}

/// A readable descriptor of the directory `dir` refers to (an O_PATH one can be neither
/// listed nor fsynced).
pub fn reopen_dir(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    openat(dir, OsStr::new("."), libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

pub trait AsFdB {
    fn as_fd_b(&self) -> BorrowedFd<'_>;
}
impl AsFdB for OwnedFd {
    fn as_fd_b(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.as_fd()
    }
}

pub fn fstatat(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Stat> {
    let n = cstr(name.as_bytes())?;
    statx(dir, &n, libc::AT_SYMLINK_NOFOLLOW)
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    // AT_EMPTY_PATH with "" stats the descriptor itself (works on O_PATH fds too).
    statx(fd, c"", libc::AT_EMPTY_PATH)
}

pub fn mkdirat(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let n = cstr(name.as_bytes())?;
    // SAFETY: NUL-terminated name.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), n.as_ptr(), mode as libc::mode_t) }).map(drop)
}

pub fn unlinkat(dir: BorrowedFd<'_>, name: &OsStr, rmdir: bool) -> io::Result<()> {
    let n = cstr(name.as_bytes())?;
    let flags = if rmdir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: NUL-terminated name.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), n.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(
    d1: BorrowedFd<'_>,
    n1: &OsStr,
    d2: BorrowedFd<'_>,
    n2: &OsStr,
    flags: u32,
) -> io::Result<()> {
    let a = cstr(n1.as_bytes())?;
    let b = cstr(n2.as_bytes())?;
    // SAFETY: NUL-terminated names, valid descriptors.
    cvt(unsafe {
        libc::renameat2(
            d1.as_raw_fd(),
            a.as_ptr(),
            d2.as_raw_fd(),
            b.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// rename that never replaces: `RENAME_NOREPLACE`, or — where the file system does not
/// take the flag (EINVAL: GlusterFS's and other FUSE clients, NFS before 4.1) — a hard link
/// to the new name (which fails with EEXIST if it exists: the same promise) and the removal
/// of the old one. Between the two both names exist; a crash there leaves the object under
/// both, which the move protocol's recovery resolves by identity (`recover`).
pub fn rename_noreplace(
    d1: BorrowedFd<'_>,
    n1: &OsStr,
    d2: BorrowedFd<'_>,
    n2: &OsStr,
) -> io::Result<()> {
    match renameat2(d1, n1, d2, n2, libc::RENAME_NOREPLACE) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            linkat(d1, n1, d2, n2)?;
            unlinkat(d1, n1, false)
        }
        r => r,
    }
}

pub fn linkat(d1: BorrowedFd<'_>, n1: &OsStr, d2: BorrowedFd<'_>, n2: &OsStr) -> io::Result<()> {
    let a = cstr(n1.as_bytes())?;
    let b = cstr(n2.as_bytes())?;
    // SAFETY: NUL-terminated names; flags 0 never follows a symlink source.
    cvt(unsafe { libc::linkat(d1.as_raw_fd(), a.as_ptr(), d2.as_raw_fd(), b.as_ptr(), 0) })
        .map(drop)
}

pub fn symlinkat(target: &[u8], dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let t = cstr(target)?;
    let n = cstr(name.as_bytes())?;
    // SAFETY: NUL-terminated strings.
    cvt(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), n.as_ptr()) }).map(drop)
}

pub fn mknodat(dir: BorrowedFd<'_>, name: &OsStr, mode: u32, rdev: u64) -> io::Result<()> {
    let n = cstr(name.as_bytes())?;
    // SAFETY: NUL-terminated name.
    cvt(unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            n.as_ptr(),
            mode as libc::mode_t,
            rdev as libc::dev_t,
        )
    })
    .map(drop)
}

pub fn readlinkat(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Vec<u8>> {
    let n = cstr(name.as_bytes())?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the buffer is valid for buf.len() bytes.
    let len = cvt_s(unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(len);
    Ok(buf)
}

pub fn fchownat(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    uid: Option<u32>,
    gid: Option<u32>,
) -> io::Result<()> {
    let n = cstr(name.as_bytes())?;
    let u = uid.unwrap_or(u32::MAX);
    let g = gid.unwrap_or(u32::MAX);
    // SAFETY: NUL-terminated name; -1 leaves an id unchanged.
    cvt(unsafe { libc::fchownat(dir.as_raw_fd(), n.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW) })
        .map(drop)
}

pub fn fchown(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    // SAFETY: valid descriptor; -1 leaves an id unchanged.
    cvt(unsafe {
        libc::fchown(
            fd.as_raw_fd(),
            uid.unwrap_or(u32::MAX),
            gid.unwrap_or(u32::MAX),
        )
    })
    .map(drop)
}

/// chmod of `name` in `dir` without following a final symlink (fchmodat2, Linux 6.6).
pub fn fchmodat(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let n = cstr(name.as_bytes())?;
    // SAFETY: NUL-terminated name; 452 is fchmodat2 on every Linux architecture.
    let r = unsafe {
        libc::syscall(
            452,
            dir.as_raw_fd(),
            n.as_ptr(),
            mode as libc::mode_t,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match cvt_l(r) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            // An old kernel: the caller has just checked the name is not a symlink.
            // SAFETY: as above.
            cvt(unsafe { libc::fchmodat(dir.as_raw_fd(), n.as_ptr(), mode as libc::mode_t, 0) })
                .map(drop)
        }
        Err(e) => Err(e),
    }
}

pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: valid descriptor.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) }).map(drop)
}

/// A timestamp for utimensat: None leaves it alone.
#[derive(Clone, Copy, Debug)]
pub enum TimeSet {
    Omit,
    Now,
    At(SystemTime),
}

fn ts(t: TimeSet) -> libc::timespec {
    match t {
        TimeSet::Omit => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        TimeSet::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        TimeSet::At(t) => {
            let (s, n) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
                Err(e) => {
                    let d = e.duration();
                    let (s, n) = (-(d.as_secs() as i64), d.subsec_nanos() as i64);
                    if n == 0 {
                        (s, 0)
                    } else {
                        (s - 1, 1_000_000_000 - n)
                    }
                }
            };
            libc::timespec {
                tv_sec: s,
                tv_nsec: n,
            }
        }
    }
}

pub fn utimensat(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    atime: TimeSet,
    mtime: TimeSet,
) -> io::Result<()> {
    let n = cstr(name.as_bytes())?;
    let t = [ts(atime), ts(mtime)];
    // SAFETY: NUL-terminated name, array of two timespecs.
    cvt(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            n.as_ptr(),
            t.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn futimens(fd: BorrowedFd<'_>, atime: TimeSet, mtime: TimeSet) -> io::Result<()> {
    let t = [ts(atime), ts(mtime)];
    // SAFETY: valid descriptor, array of two timespecs.
    cvt(unsafe { libc::futimens(fd.as_raw_fd(), t.as_ptr()) }).map(drop)
}

pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: valid descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(drop)
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    cvt_s(unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            off as i64,
        )
    })
}

pub fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], off: u64) -> io::Result<usize> {
    let off = i64::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: buf is valid for buf.len() bytes.
    cvt_s(unsafe { libc::pwrite(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), off) })
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: valid descriptor.
    cvt(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid descriptor.
    cvt(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, off: u64, len: u64) -> io::Result<()> {
    let off = i64::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: valid descriptor.
    cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, off, len) }).map(drop)
}

pub fn lseek(fd: BorrowedFd<'_>, off: u64, whence: i32) -> io::Result<u64> {
    let off = i64::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::ENXIO))?;
    // SAFETY: valid descriptor.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), off, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

/// Copies up to `len` bytes between descriptors in the kernel; Ok(0) at end of input.
pub fn copy_file_range(
    from: BorrowedFd<'_>,
    off_in: &mut i64,
    to: BorrowedFd<'_>,
    off_out: &mut i64,
    len: usize,
) -> io::Result<usize> {
    // SAFETY: valid descriptors and offset pointers.
    cvt_s(unsafe {
        libc::copy_file_range(from.as_raw_fd(), off_in, to.as_raw_fd(), off_out, len, 0)
    } as libc::ssize_t)
}

/// Reads one byte of `fd` without O_NOATIME, so the file system moves the file's access
/// time by its own rule as a program's read would (at EOF too: Linux counts the access
/// either way), then restores the descriptor's O_NOATIME if it had it. The flag belongs
/// to the open file description: no read through it runs meanwhile (the layer touches a
/// descriptor only at open, before anyone else has it).
pub fn touch_atime(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid descriptor; F_GETFL and F_SETFL take and return plain flags.
    let fl = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let quiet = fl & libc::O_NOATIME != 0;
    if quiet {
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NOATIME) })?;
    }
    let r = pread(fd, &mut [0u8; 1], 0);
    if quiet {
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl) })?;
    }
    r.map(drop)
}

pub struct StatVfs {
    pub frsize: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub namemax: u64,
    /// Mount flags (`ST_RDONLY`, `ST_NOATIME`, `ST_RELATIME`, ...).
    pub flag: u64,
}

pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<StatVfs> {
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and buffer.
    cvt(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut s) })?;
    Ok(StatVfs {
        frsize: s.f_frsize.max(1),
        blocks: s.f_blocks,
        bfree: s.f_bfree,
        bavail: s.f_bavail,
        files: s.f_files,
        ffree: s.f_ffree,
        namemax: s.f_namemax,
        flag: s.f_flag,
    })
}

/// The host file system's type (`f_type` of fstatfs: EXT4_SUPER_MAGIC, FUSE_SUPER_MAGIC…).
pub fn fstatfs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and buffer.
    cvt(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut s) })?;
    Ok(s.f_type as i64)
}

/// The `/proc/self/fd/N/name` path through which the path-only xattr calls reach `name`
/// in the directory `dir` without resolving anything but that one component.
fn proc_path(dir: BorrowedFd<'_>, name: Option<&OsStr>) -> io::Result<CString> {
    let mut p = format!("/proc/self/fd/{}", dir.as_raw_fd()).into_bytes();
    if let Some(n) = name {
        p.push(b'/');
        p.extend_from_slice(n.as_bytes());
    }
    cstr(&p)
}

/// getxattr of `name` in `dir` (or of `dir` itself when `name` is None).
pub fn getxattr(dir: BorrowedFd<'_>, name: Option<&OsStr>, attr: &OsStr) -> io::Result<Vec<u8>> {
    let p = proc_path(dir, name)?;
    let a = cstr(attr.as_bytes())?;
    let call = |buf: &mut [u8]| -> io::Result<usize> {
        // SAFETY: NUL-terminated strings; buf valid for its length (may be 0 to probe). The
        // l-variant does not follow the final component; for the directory itself the
        // magic link must be followed.
        cvt_s(unsafe {
            if name.is_some() {
                libc::lgetxattr(p.as_ptr(), a.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            } else {
                libc::getxattr(p.as_ptr(), a.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            }
        })
    };
    loop {
        let n = call(&mut [])?;
        let mut buf = vec![0u8; n];
        match call(&mut buf) {
            Ok(m) => {
                buf.truncate(m);
                return Ok(buf);
            }
            // The value grew between the calls: ask again.
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// getxattr through an open descriptor (no path resolution at all).
pub fn fgetxattr(fd: BorrowedFd<'_>, attr: &OsStr) -> io::Result<Vec<u8>> {
    let a = cstr(attr.as_bytes())?;
    let call = |buf: &mut [u8]| -> io::Result<usize> {
        // SAFETY: valid descriptor, NUL-terminated name, buf valid for its length.
        cvt_s(unsafe {
            libc::fgetxattr(
                fd.as_raw_fd(),
                a.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })
    };
    loop {
        let n = call(&mut [])?;
        let mut buf = vec![0u8; n];
        match call(&mut buf) {
            Ok(m) => {
                buf.truncate(m);
                return Ok(buf);
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn listxattr(dir: BorrowedFd<'_>, name: Option<&OsStr>) -> io::Result<Vec<u8>> {
    let p = proc_path(dir, name)?;
    let call = |buf: &mut [u8]| -> io::Result<usize> {
        // SAFETY: as in getxattr.
        cvt_s(unsafe {
            if name.is_some() {
                libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            } else {
                libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            }
        })
    };
    loop {
        let n = call(&mut [])?;
        let mut buf = vec![0u8; n];
        match call(&mut buf) {
            Ok(m) => {
                buf.truncate(m);
                return Ok(buf);
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}

pub fn setxattr(
    dir: BorrowedFd<'_>,
    name: Option<&OsStr>,
    attr: &OsStr,
    value: &[u8],
    flags: i32,
) -> io::Result<()> {
    let p = proc_path(dir, name)?;
    let a = cstr(attr.as_bytes())?;
    // SAFETY: NUL-terminated strings, value valid for its length.
    cvt(unsafe {
        if name.is_some() {
            libc::lsetxattr(
                p.as_ptr(),
                a.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        } else {
            libc::setxattr(
                p.as_ptr(),
                a.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        }
    })
    .map(drop)
}

pub fn removexattr(dir: BorrowedFd<'_>, name: Option<&OsStr>, attr: &OsStr) -> io::Result<()> {
    let p = proc_path(dir, name)?;
    let a = cstr(attr.as_bytes())?;
    // SAFETY: NUL-terminated strings.
    cvt(unsafe {
        if name.is_some() {
            libc::lremovexattr(p.as_ptr(), a.as_ptr())
        } else {
            libc::removexattr(p.as_ptr(), a.as_ptr())
        }
    })
    .map(drop)
}

/// What resolving one path found ([`resolve_paths`]).
#[derive(Debug)]
pub enum PathAnswer {
    /// A directory, and its canonical path.
    Dir(Vec<u8>),
    /// Something other than a directory.
    NotDir,
    /// The errno of the failure.
    Failed(i32),
    /// No answer by the deadline.
    NoAnswer,
}

/// Resolves every path of `paths` — is it a directory, and its canonical path — each
/// within its `timeouts` entry counted from now, all at once.
///
/// A path on a file system whose server stopped answering blocks whoever walks it, in the
/// kernel, until the server answers — and a FUSE request already handed to its server
/// (FUSE over io_uring hands them at once) waits uninterruptibly, so even the process's
/// exit waits for it. The walk therefore runs in a process of its own (a grandchild,
/// reparented to init at once, so nobody has to reap it), which reports up a pipe; this
/// process only waits on the pipe, with the deadline, and no thread of it is ever stuck.
/// The walker uses system calls only (it may be forked from a multithreaded daemon) and
/// closes every descriptor but its pipe first (it must not keep a FUSE device alive).
pub fn resolve_paths(paths: &[&std::path::Path], timeouts: &[Duration]) -> Vec<PathAnswer> {
    let start = std::time::Instant::now();
    let mut pending: Vec<Option<(OwnedFd, Vec<u8>)>> = Vec::new();
    let mut out: Vec<Option<PathAnswer>> = Vec::new();
    for p in paths {
        match spawn_walker(p) {
            Ok(fd) => {
                pending.push(Some((fd, Vec::new())));
                out.push(None);
            }
            Err(e) => {
                pending.push(None);
                out.push(Some(PathAnswer::Failed(errno(&e))));
            }
        }
    }
    loop {
        let now = std::time::Instant::now();
        let mut polls: Vec<libc::pollfd> = Vec::new();
        let mut which: Vec<usize> = Vec::new();
        let mut next: Option<Duration> = None;
        for (k, slot) in pending.iter_mut().enumerate() {
            let Some((fd, _)) = slot else { continue };
            let deadline = start + timeouts.get(k).copied().unwrap_or(Duration::ZERO);
            if deadline <= now {
                *slot = None;
                out[k] = Some(PathAnswer::NoAnswer);
                continue;
            }
            let left = deadline - now;
            next = Some(next.map_or(left, |n: Duration| n.min(left)));
            polls.push(libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            which.push(k);
        }
        let Some(next) = next else { break };
        let ms = next.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: `polls` is a valid array of its length.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
        if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
        for (pfd, &k) in polls.iter().zip(&which) {
            if pfd.revents == 0 {
                continue;
            }
            let Some((fd, buf)) = pending[k].as_mut() else {
                continue;
            };
            let mut chunk = [0u8; 4096];
            // SAFETY: valid descriptor and buffer.
            let r = unsafe { libc::read(fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if r > 0 {
                buf.extend_from_slice(&chunk[..r as usize]);
                continue;
            }
            if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // End of file: the walker said all it had to say.
            let answer = match buf.split_first() {
                Some((b'D', path)) => PathAnswer::Dir(path.to_vec()),
                Some((b'N', _)) => PathAnswer::NotDir,
                Some((b'E', e)) if e.len() >= 4 => {
                    PathAnswer::Failed(i32::from_le_bytes([e[0], e[1], e[2], e[3]]))
                }
                _ => PathAnswer::Failed(libc::EIO),
            };
            out[k] = Some(answer);
            pending[k] = None;
        }
    }
    out.into_iter()
        .map(|a| a.unwrap_or(PathAnswer::NoAnswer))
        .collect()
}

/// Forks the walker of `path` (see [`resolve_paths`]); the read end of its pipe.
fn spawn_walker(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str().as_bytes())?;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: a two-int array for pipe2.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: fresh descriptors from pipe2.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only calls fork and _exit, and the grandchild only system calls
    // on memory prepared before the fork (async-signal-safe), so forking a multithreaded
    // process is sound.
    let pid = cvt(unsafe { libc::fork() })?;
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            if libc::fork() == 0 {
                walker(&c, wr.as_raw_fd());
            }
            libc::_exit(0);
        }
    }
    drop(wr);
    let mut status = 0;
    // SAFETY: reaps the child, which exits at once (the grandchild goes to init).
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok(rd)
}

/// The walker: stat, then the canonical path by chdir and getcwd, reported up `w`. System
/// calls only; never returns.
///
/// # Safety
/// Runs in a freshly forked process.
unsafe fn walker(path: &CStr, w: RawFd) -> ! {
    // SAFETY (whole body): system calls on valid buffers in a process of our own.
    unsafe {
        // Nothing of the parent stays open here but the pipe.
        if w > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (w - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (w + 1) as u32, u32::MAX, 0u32);
        let put = |msg: &[u8]| {
            let mut off = 0;
            while off < msg.len() {
                let n = libc::write(w, msg[off..].as_ptr().cast(), msg.len() - off);
                if n <= 0 {
                    break;
                }
                off += n as usize;
            }
        };
        let fail = || {
            let e = *libc::__errno_location();
            let b = e.to_le_bytes();
            put(&[b'E', b[0], b[1], b[2], b[3]]);
            libc::_exit(0)
        };
        let mut st: libc::stat = std::mem::zeroed();
        if libc::stat(path.as_ptr(), &mut st) != 0 {
            fail();
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            put(b"N");
            libc::_exit(0);
        }
        if libc::chdir(path.as_ptr()) != 0 {
            fail();
        }
        let mut buf = [0u8; 4097];
        buf[0] = b'D';
        let n = libc::syscall(libc::SYS_getcwd, buf[1..].as_mut_ptr(), buf.len() - 1);
        if n <= 0 {
            fail();
        }
        // The length counts the terminating NUL.
        put(&buf[..n as usize]);
        libc::_exit(0)
    }
}

/// `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` (`_IOR('f', 1, long)`, `_IOW('f', 2, long)`; the
/// kernel moves an `int`, as chattr passes it).
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;

/// A readable descriptor of `name` in `dir` (of `dir` itself when None) for the inode-flag
/// ioctls, or None when it is neither a regular file nor a directory (an ioctl on a device
/// would reach the device, not the file system; symlinks have no flags). Opened by O_PATH
/// first and reopened through /proc after its type is checked: nothing but that inode is
/// ever opened for real.
pub fn open_for_flags(dir: BorrowedFd<'_>, name: Option<&OsStr>) -> io::Result<Option<OwnedFd>> {
    let path = match name {
        Some(n) => openat(dir, n, libc::O_PATH, 0)?,
        None => openat(dir, OsStr::new("."), libc::O_PATH | libc::O_DIRECTORY, 0)?,
    };
    let st = fstat(path.as_fd_b())?;
    let t = st.st_mode & libc::S_IFMT;
    if t != libc::S_IFREG && t != libc::S_IFDIR {
        return Ok(None);
    }
    let p = proc_path(path.as_fd_b(), None)?;
    // SAFETY: NUL-terminated path; the new descriptor is owned below. O_NONBLOCK: never
    // wait on a lease or a mandatory lock for an attribute call.
    let fd = cvt(unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NOATIME,
        )
    })
    .or_else(|_| {
        // O_NOATIME is the owner's (or root's); fall back without it.
        // SAFETY: as above.
        cvt(unsafe {
            libc::open(
                p.as_ptr(),
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        })
    })?;
    // SAFETY: fresh descriptor.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The inode flags of an open file (`FS_IOC_GETFLAGS`).
pub fn get_flags(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut f: libc::c_int = 0;
    // SAFETY: valid descriptor; the kernel writes one int to the pointer.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_GETFLAGS, &mut f as *mut libc::c_int) })?;
    Ok(f as u32)
}

/// Sets the inode flags of an open file (`FS_IOC_SETFLAGS`).
pub fn set_flags(fd: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    let f = flags as libc::c_int;
    // SAFETY: valid descriptor; the kernel reads one int from the pointer.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_SETFLAGS, &f as *const libc::c_int) }).map(drop)
}

/// One host directory entry.
pub struct HostEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    /// `DT_*`; DT_UNKNOWN (0) when the file system does not say.
    pub dtype: u8,
}

/// Reads every entry of the directory open at `dir` (a readable descriptor), without `.`
/// and `..`.
pub fn read_dir(dir: OwnedFd) -> io::Result<Vec<HostEntry>> {
    // SAFETY: fdopendir takes ownership of the descriptor on success; on failure we still
    // own it and OwnedFd closes it.
    let raw = dir.as_raw_fd();
    let dp = unsafe { libc::fdopendir(raw) };
    if dp.is_null() {
        return Err(io::Error::last_os_error());
    }
    std::mem::forget(dir);
    let mut out = Vec::new();
    let result = loop {
        // readdir signals errors only through errno; clear it first.
        // SAFETY: errno location is thread-local and always valid.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dp is a valid DIR* until closedir below.
        let ent = unsafe { libc::readdir64(dp) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if e.raw_os_error().unwrap_or(0) == 0 {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: readdir returned a valid dirent whose d_name is NUL-terminated.
        let (name, ino, dtype) = unsafe {
            let e = &*ent;
            (
                CStr::from_ptr(e.d_name.as_ptr()).to_bytes().to_vec(),
                e.d_ino,
                e.d_type,
            )
        };
        if name == b"." || name == b".." {
            continue;
        }
        out.push(HostEntry { name, ino, dtype });
    };
    // SAFETY: dp came from fdopendir and is closed exactly once.
    unsafe { libc::closedir(dp) };
    result.map(|()| out)
}

pub fn umask(m: u32) -> u32 {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(m as libc::mode_t) as u32 }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

pub fn kind_of(mode: u32) -> FileKind {
    FileKind::from_mode(mode).unwrap_or(FileKind::RegularFile)
}

/// Host attributes with our inode number.
pub fn attr_from(st: &Stat, ino: u64) -> Attr {
    Attr {
        ino,
        generation: 0,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        // Without the branch's own birth time, the earliest time the inode shows: never
        // after its access or modification time (what statx readers check).
        crtime: match st.btime {
            Some((sec, nsec)) => time(sec, nsec),
            None => time(st.st_ctime, st.st_ctime_nsec).min(time(st.st_mtime, st.st_mtime_nsec)),
        },
        kind: kind_of(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// An all-zero stat (attributes to fill in by hand).
pub fn zero_stat() -> Stat {
    Stat {
        // SAFETY: stat is plain old data; all-zero is a valid value.
        st: unsafe { std::mem::zeroed() },
        btime: None,
    }
}

pub fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}
