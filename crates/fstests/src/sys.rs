//! The few system calls the suites need that neither std nor nix wraps: extended attributes
//! with explicit flags and buffer sizes (to observe ERANGE and size probes) and raw
//! `getdents64` with a small buffer (to interleave changes between calls), and file
//! handles (name_to_handle_at, open_by_handle_at).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn cname(n: &str) -> CString {
    CString::new(n).expect("name without NUL")
}

fn check(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// setxattr(2) with `flags` (0, `libc::XATTR_CREATE`, `libc::XATTR_REPLACE`).
pub fn setxattr(path: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: p and n are NUL-terminated and live across the call; value is a valid slice
    // whose length is passed with it.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    check(r as isize).map(drop)
}

/// getxattr(2) with a buffer of exactly `size` bytes; `size == 0` is the size probe and
/// returns an empty vector whose capacity is meaningless — use [`getxattr_size`] for that.
pub fn getxattr_buf(path: &Path, name: &str, size: usize) -> io::Result<Vec<u8>> {
    let (p, n) = (cpath(path), cname(name));
    let mut buf = vec![0u8; size];
    // SAFETY: buf has `size` writable bytes; the kernel writes at most that many.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    let len = check(r)?;
    buf.truncate(len);
    Ok(buf)
}

/// getxattr(2) size probe (size 0): the value's length.
pub fn getxattr_size(path: &Path, name: &str) -> io::Result<usize> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: a null buffer with size 0 is the documented probe; nothing is written.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    check(r)
}

/// getxattr(2) with a probe-sized buffer.
pub fn getxattr(path: &Path, name: &str) -> io::Result<Vec<u8>> {
    let n = getxattr_size(path, name)?;
    getxattr_buf(path, name, n)
}

/// lgetxattr-style listing with a buffer of `size` bytes (0 probes the length).
pub fn listxattr_buf(path: &Path, size: usize) -> io::Result<Vec<u8>> {
    let p = cpath(path);
    let mut buf = vec![0u8; size];
    let ptr = if size == 0 {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    };
    // SAFETY: ptr is null with size 0 (probe) or points at `size` writable bytes.
    let r = unsafe { libc::llistxattr(p.as_ptr(), ptr, size) };
    let len = check(r)?;
    if size == 0 {
        return Ok(vec![0; len]);
    }
    buf.truncate(len);
    Ok(buf)
}

/// The attribute names of `path` (not following a final symlink), sorted.
pub fn listxattr(path: &Path) -> io::Result<Vec<String>> {
    let n = listxattr_buf(path, 0)?.len();
    let raw = if n == 0 {
        Vec::new()
    } else {
        listxattr_buf(path, n)?
    };
    let mut names: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// removexattr(2).
pub fn removexattr(path: &Path, name: &str) -> io::Result<()> {
    let (p, n) = (cpath(path), cname(name));
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let r = unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) };
    check(r as isize).map(drop)
}

/// One record returned by getdents64.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent {
    pub ino: u64,
    pub off: i64,
    pub dtype: u8,
    pub name: Vec<u8>,
}

/// One getdents64(2) call with a `bufsize`-byte buffer; an empty result is end of directory.
pub fn getdents64(fd: BorrowedFd<'_>, bufsize: usize) -> io::Result<Vec<Dirent>> {
    // u64 elements keep the buffer 8-byte aligned, as linux_dirent64 records are.
    let mut buf = vec![0u64; bufsize.div_ceil(8)];
    // SAFETY: the buffer has bufsize writable bytes and the fd is a valid open descriptor.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast::<u8>(),
            bufsize,
        )
    };
    let n = check(r as isize)?;
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).take(n).collect();
    let mut out = Vec::new();
    let mut pos = 0;
    // linux_dirent64: u64 d_ino, i64 d_off, u16 d_reclen, u8 d_type, char d_name[] (NUL-terminated).
    while pos + 19 <= n {
        let ino = u64::from_ne_bytes(bytes[pos..pos + 8].try_into().unwrap());
        let off = i64::from_ne_bytes(bytes[pos + 8..pos + 16].try_into().unwrap());
        let reclen = u16::from_ne_bytes(bytes[pos + 16..pos + 18].try_into().unwrap()) as usize;
        let dtype = bytes[pos + 18];
        if reclen < 19 || pos + reclen > n {
            return Err(io::Error::other(format!(
                "bad dirent record length {reclen} at {pos}"
            )));
        }
        let name_area = &bytes[pos + 19..pos + reclen];
        let end = name_area
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(name_area.len());
        out.push(Dirent {
            ino,
            off,
            dtype,
            name: name_area[..end].to_vec(),
        });
        pos += reclen;
    }
    Ok(out)
}

/// `FS_IOC_GETFLAGS` (lsattr's ioctl) on an open file or directory: its inode flags.
pub fn get_flags(fd: BorrowedFd<'_>) -> io::Result<u32> {
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    let mut flags: libc::c_int = 0;
    // SAFETY: the kernel writes one int through the pointer, which points at a live local.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) };
    check(r as isize).map(|_| flags as u32)
}

/// `FS_IOC_SETFLAGS` (chattr's ioctl) on an open file or directory.
pub fn set_flags(fd: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
    let v = flags as libc::c_int;
    // SAFETY: the kernel reads one int through the pointer, which points at a live local.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_SETFLAGS, &v) };
    check(r as isize).map(drop)
}

/// The binary form of a POSIX ACL (`system.posix_acl_*`) from (tag, perm, id) triples:
/// tags 1 user::, 2 user:id, 4 group::, 8 group:id, 0x10 mask, 0x20 other.
pub fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut b = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&perm.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

/// A file handle as name_to_handle_at(2) gives it: the file system's type and opaque bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHandle {
    pub handle_type: i32,
    pub bytes: Vec<u8>,
}

impl FileHandle {
    /// The same handle with its bytes changed by `f` (a forged handle, to see it refused).
    pub fn forged(&self, f: impl FnOnce(&mut Vec<u8>)) -> FileHandle {
        let mut h = self.clone();
        f(&mut h.bytes);
        h
    }
}

/// The largest handle the kernel makes (`MAX_HANDLE_SZ`).
const MAX_HANDLE_SZ: usize = 128;

/// name_to_handle_at(2) of `path` (symlinks not followed); `connectable` asks for a
/// handle that names the parent too (`AT_HANDLE_CONNECTABLE`, Linux 6.13).
pub fn name_to_handle(path: &Path, connectable: bool) -> io::Result<FileHandle> {
    const AT_HANDLE_CONNECTABLE: libc::c_int = 0x002;
    let c = cpath(path);
    // struct file_handle: u32 handle_bytes, i32 handle_type, then the bytes.
    let mut buf = vec![0u32; 2 + MAX_HANDLE_SZ / 4];
    buf[0] = MAX_HANDLE_SZ as u32;
    let mut mount_id: libc::c_int = 0;
    let flags = if connectable {
        AT_HANDLE_CONNECTABLE
    } else {
        0
    };
    // SAFETY: `buf` is a file_handle with room for MAX_HANDLE_SZ bytes, as its first word
    // says; `c` and `mount_id` are live for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c.as_ptr(),
            buf.as_mut_ptr(),
            &mut mount_id,
            flags,
        )
    };
    check(r as isize)?;
    let len = (buf[0] as usize).min(MAX_HANDLE_SZ);
    let bytes: Vec<u8> = buf[2..]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .take(len)
        .collect();
    Ok(FileHandle {
        handle_type: buf[1] as i32,
        bytes,
    })
}

/// open_by_handle_at(2): opens the file `h` names on the file system of `mount_fd` (any
/// descriptor on it). Needs CAP_DAC_READ_SEARCH.
pub fn open_by_handle(
    mount_fd: BorrowedFd<'_>,
    h: &FileHandle,
    flags: i32,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut buf = vec![0u32; 2 + h.bytes.len().div_ceil(4)];
    buf[0] = h.bytes.len() as u32;
    buf[1] = h.handle_type as u32;
    for (i, chunk) in h.bytes.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        buf[2 + i] = u32::from_ne_bytes(w);
    }
    // SAFETY: `buf` is a file_handle whose first word is the length of the bytes after
    // the second.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            buf.as_mut_ptr(),
            flags | libc::O_CLOEXEC,
        )
    };
    // SAFETY: a non-negative result is a new descriptor that nothing else owns.
    check(r as isize).map(|fd| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}
