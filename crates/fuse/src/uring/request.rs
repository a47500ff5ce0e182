//! Decoding one request from a ring entry and calling the adapter's handler for it.
//!
//! The kernel is trusted to be the kernel, but its bytes are still input: every length is
//! checked against the buffer it claims to describe, a structure shorter than its opcode
//! needs or a name without its terminating NUL is answered EINVAL (never a panic, never a
//! read past the data), and an opcode this transport does not serve is ENOSYS.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_vfs::{Ctx, SetAttr, SetTime};
use fuser::Errno;

use super::abi::{self, InHeader};
use super::reply::{Answer, RingReply, Sink};
use crate::adapter::{Adapter, caller};
use crate::counters::Op;
use crate::reply::Reply;

/// Requests whose arguments after the first live in the payload buffer (names, written
/// data, xattr values): their replies are staged elsewhere until the arguments are used.
fn input_in_payload(opcode: u32) -> bool {
    use abi::*;
    matches!(
        opcode,
        LOOKUP
            | SYMLINK
            | MKNOD
            | MKDIR
            | UNLINK
            | RMDIR
            | RENAME
            | RENAME2
            | LINK
            | WRITE
            | SETXATTR
            | GETXATTR
            | REMOVEXATTR
            | CREATE
            | TMPFILE
            | IOCTL
    )
}

/// Serves the request in an entry: `arg0` is the per-opcode structure (a copy of the
/// entry's `op_in`, already cut to its length), `payload[..payload_sz]` the remaining
/// arguments; the reply body is left at the front of `payload`. Returns the out header's
/// error (0 or negative) and the body's length.
pub(crate) fn serve(
    a: &Adapter,
    h: &InHeader,
    arg0: &[u8],
    payload: &mut [u8],
    payload_sz: usize,
    scratch: &mut Vec<u8>,
    dev: &Arc<std::fs::File>,
) -> (i32, usize) {
    let payload_sz = payload_sz.min(payload.len());
    if input_in_payload(h.opcode) {
        scratch.clear();
        let cap = payload.len();
        let (err, len) = {
            let mut ans = Answer::new(Sink::Staged(scratch, cap), dev);
            handle(a, h, arg0, &payload[..payload_sz], &mut ans);
            ans.result()
        };
        // The arguments are no longer borrowed: the body can take their place.
        let len = len.min(scratch.len());
        payload[..len].copy_from_slice(&scratch[..len]);
        (err, len)
    } else {
        let mut ans = Answer::new(Sink::Direct(payload), dev);
        handle(a, h, arg0, &[], &mut ans);
        ans.result()
    }
}

/// The bytes before the first NUL, and what follows it; `None` without a NUL.
fn cstr(b: &[u8]) -> Option<(&OsStr, &[u8])> {
    let n = b.iter().position(|&c| c == 0)?;
    Some((OsStr::from_bytes(&b[..n]), &b[n + 1..]))
}

/// (seconds, nanoseconds) from a setattr request into a time, `None` if out of range.
fn time_in(secs: u64, nsecs: u32) -> Option<SystemTime> {
    if nsecs >= 1_000_000_000 {
        return None;
    }
    let secs = secs as i64;
    if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(secs as u64, nsecs))
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(secs.unsigned_abs()))?
            .checked_add(Duration::from_nanos(u64::from(nsecs)))
    }
}

fn setattr_in(s: &abi::SetattrIn) -> Option<SetAttr> {
    use abi::*;
    let has = |bit: u32| s.valid & bit != 0;
    let time = |set: u32, now: u32, secs: u64, nsecs: u32| -> Option<Option<SetTime>> {
        Some(if has(now) {
            Some(SetTime::Now)
        } else if has(set) {
            Some(SetTime::At(time_in(secs, nsecs)?))
        } else {
            None
        })
    };
    Some(SetAttr {
        mode: has(FATTR_MODE).then_some(s.mode),
        uid: has(FATTR_UID).then_some(s.uid),
        gid: has(FATTR_GID).then_some(s.gid),
        size: has(FATTR_SIZE).then_some(s.size),
        atime: time(FATTR_ATIME, FATTR_ATIME_NOW, s.atime, s.atimensec)?,
        mtime: time(FATTR_MTIME, FATTR_MTIME_NOW, s.mtime, s.mtimensec)?,
        ctime: if has(FATTR_CTIME) {
            Some(time_in(s.ctime, s.ctimensec)?)
        } else {
            None
        },
        fh: has(FATTR_FH).then_some(s.fh),
    })
}

/// Answers EINVAL to a malformed request, counted as an error of `op`.
fn malformed(a: &Adapter, op: Op, r: RingReply<'_, '_>) {
    log::warn!(
        "malformed {} request from the kernel; answered EINVAL",
        op.name()
    );
    a.counts.request(op);
    a.counts.error(op);
    r.error(Errno::EINVAL);
}

fn handle(a: &Adapter, h: &InHeader, arg0: &[u8], input: &[u8], ans: &mut Answer<'_>) {
    use abi::*;
    let c: Ctx = caller(h.uid, h.gid, h.pid);
    let ino = h.nodeid;
    // Directory entries must fit the kernel's buffer, not only ours.
    let limit = match h.opcode {
        READDIR | READDIRPLUS => read::<ReadIn>(arg0).map_or(0, |x| x.size as usize),
        _ => usize::MAX,
    };
    let r = RingReply::with_limit(ans, limit);
    // A request's first argument as the structure `T`, or an EINVAL answer.
    macro_rules! arg {
        ($t:ty, $op:expr) => {
            match read::<$t>(arg0) {
                Some(v) => v,
                None => return malformed(a, $op, r),
            }
        };
    }
    macro_rules! name {
        ($bytes:expr, $op:expr) => {
            match cstr($bytes) {
                Some(v) => v,
                None => return malformed(a, $op, r),
            }
        };
    }
    match h.opcode {
        LOOKUP => {
            let (name, _) = name!(input, Op::Lookup);
            a.lookup(&c, ino, name, r)
        }
        GETATTR => a.getattr(ino, r),
        STATX => a.statx(&c, ino, r),
        SETATTR => {
            let s = arg!(SetattrIn, Op::Setattr);
            match setattr_in(&s) {
                Some(set) => a.setattr(&c, ino, set, r),
                None => malformed(a, Op::Setattr, r),
            }
        }
        READLINK => a.readlink(ino, r),
        SYMLINK => {
            let (name, rest) = name!(input, Op::Symlink);
            let (target, _) = name!(rest, Op::Symlink);
            a.symlink(&c, ino, name, target.as_bytes(), r)
        }
        MKNOD => {
            let m = arg!(MknodIn, Op::Mknod);
            let (name, _) = name!(input, Op::Mknod);
            a.mknod(&c, ino, name, m.mode, m.umask, m.rdev, r)
        }
        MKDIR => {
            let m = arg!(MkdirIn, Op::Mkdir);
            let (name, _) = name!(input, Op::Mkdir);
            a.mkdir(&c, ino, name, m.mode, m.umask, r)
        }
        UNLINK => {
            let (name, _) = name!(input, Op::Unlink);
            a.unlink(&c, ino, name, r)
        }
        RMDIR => {
            let (name, _) = name!(input, Op::Rmdir);
            a.rmdir(&c, ino, name, r)
        }
        RENAME | RENAME2 => {
            let (newdir, flags) = if h.opcode == RENAME {
                (arg!(RenameIn, Op::Rename).newdir, 0)
            } else {
                let x = arg!(Rename2In, Op::Rename);
                (x.newdir, x.flags)
            };
            let (old, rest) = name!(input, Op::Rename);
            let (new, _) = name!(rest, Op::Rename);
            a.rename(&c, ino, old, newdir, new, flags, r)
        }
        LINK => {
            let l = arg!(LinkIn, Op::Link);
            let (name, _) = name!(input, Op::Link);
            a.link(&c, l.oldnodeid, ino, name, r)
        }
        OPEN => {
            let o = arg!(OpenIn, Op::Open);
            a.open(&c, ino, o.flags as i32, r)
        }
        READ => {
            let x = arg!(ReadIn, Op::Read);
            a.read(ino, x.fh, x.offset, x.size, r)
        }
        WRITE => {
            let w = arg!(WriteIn, Op::Write);
            match input.get(..w.size as usize) {
                Some(data) => {
                    let cached = w.write_flags & super::abi::FUSE_WRITE_CACHE != 0;
                    a.write(ino, w.fh, w.offset, data, cached, r)
                }
                None => malformed(a, Op::Write, r),
            }
        }
        STATFS => a.statfs(r),
        RELEASE => {
            let x = arg!(ReleaseIn, Op::Release);
            a.release(ino, x.fh, r)
        }
        FSYNC => {
            let x = arg!(FsyncIn, Op::Fsync);
            a.fsync(ino, x.fh, x.fsync_flags & FSYNC_FDATASYNC != 0, r)
        }
        SETXATTR => {
            let x = arg!(SetxattrIn, Op::Setxattr);
            let (name, rest) = name!(input, Op::Setxattr);
            match rest.get(..x.size as usize) {
                Some(value) => a.setxattr(&c, ino, name, value, x.flags as i32, r),
                None => malformed(a, Op::Setxattr, r),
            }
        }
        GETXATTR => {
            let x = arg!(GetxattrIn, Op::Getxattr);
            let (name, _) = name!(input, Op::Getxattr);
            a.getxattr(&c, ino, name, x.size, r)
        }
        LISTXATTR => {
            let x = arg!(GetxattrIn, Op::Listxattr);
            a.listxattr(&c, ino, x.size, r)
        }
        REMOVEXATTR => {
            let (name, _) = name!(input, Op::Removexattr);
            a.removexattr(&c, ino, name, r)
        }
        FLUSH => {
            let x = arg!(FlushIn, Op::Flush);
            a.flush(ino, x.fh, r)
        }
        OPENDIR => a.opendir(&c, ino, r),
        READDIR | READDIRPLUS => {
            let op = if h.opcode == READDIR {
                Op::Readdir
            } else {
                Op::Readdirplus
            };
            let x = arg!(ReadIn, op);
            if op == Op::Readdir {
                a.readdir(ino, x.fh, x.offset, r)
            } else {
                a.readdirplus(ino, x.fh, x.offset, r)
            }
        }
        RELEASEDIR => {
            let x = arg!(ReleaseIn, Op::Releasedir);
            a.releasedir(ino, x.fh, r)
        }
        FSYNCDIR => {
            let x = arg!(FsyncIn, Op::Fsyncdir);
            a.fsyncdir(ino, x.fh, x.fsync_flags & FSYNC_FDATASYNC != 0, r)
        }
        ACCESS => {
            let x = arg!(AccessIn, Op::Access);
            a.access(&c, ino, x.mask as i32, r)
        }
        CREATE => {
            let x = arg!(CreateIn, Op::Create);
            let (name, _) = name!(input, Op::Create);
            a.create(&c, ino, name, x.mode, x.umask, x.flags as i32, r)
        }
        TMPFILE => {
            // The same arguments as CREATE; the name the kernel adds ("/") is not used.
            let x = arg!(CreateIn, Op::Tmpfile);
            a.tmpfile(&c, ino, x.mode, x.umask, x.flags as i32, r)
        }
        GETLK => a.unsupported(Op::Getlk, Errno::ENOSYS, r),
        SETLK | SETLKW => a.unsupported(Op::Setlk, Errno::ENOSYS, r),
        BMAP => a.unsupported(Op::Bmap, Errno::ENOSYS, r),
        IOCTL => {
            let x = arg!(IoctlIn, Op::Ioctl);
            match input.get(..x.in_size as usize) {
                Some(data) => a.ioctl(&c, ino, x.cmd, data, x.out_size, r),
                None => malformed(a, Op::Ioctl, r),
            }
        }
        POLL => a.unsupported(Op::Poll, Errno::ENOSYS, r),
        COPY_FILE_RANGE => a.unsupported(Op::CopyFileRange, Errno::ENOSYS, r),
        FALLOCATE => {
            let x = arg!(FallocateIn, Op::Fallocate);
            a.fallocate(ino, x.fh, x.offset, x.length, x.mode as i32, r)
        }
        LSEEK => {
            let x = arg!(LseekIn, Op::Lseek);
            a.lseek(ino, x.fh, x.offset as i64, x.whence as i32, r)
        }
        FORGET | BATCH_FORGET => {
            // The kernel sends forgets over /dev/fuse only (they need no answer, and the
            // ring has no way to give one back without a reply); one arriving here is
            // answered like any unknown request rather than trusted.
            log::warn!("a forget arrived over io_uring; answered ENOSYS");
            r.error(Errno::ENOSYS)
        }
        other => {
            log::debug!("opcode {other} is not served over io_uring; answered ENOSYS");
            r.error(Errno::ENOSYS)
        }
    }
}

/// The per-opcode structure of a request: `in_header.len` covers the header and every
/// argument, `payload_sz` every argument but this first one. `None` when the lengths
/// contradict each other or the structure would not fit the 128-byte `op_in` area.
pub(crate) fn arg0_len(h: &InHeader, payload_sz: u32) -> Option<usize> {
    let args = (h.len as usize).checked_sub(std::mem::size_of::<InHeader>())?;
    let n = args.checked_sub(payload_sz as usize)?;
    (n <= abi::HDR_OP_IN_LEN).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_need_their_nul() {
        assert_eq!(cstr(b"abc\0def\0").unwrap().0, "abc");
        assert_eq!(cstr(b"abc\0def\0").unwrap().1, b"def\0");
        assert!(cstr(b"abc").is_none());
        assert!(cstr(b"").is_none());
    }

    #[test]
    fn first_argument_length_from_the_header() {
        let h = InHeader {
            len: 40 + 8 + 5,
            ..Default::default()
        };
        assert_eq!(arg0_len(&h, 5), Some(8));
        assert_eq!(arg0_len(&h, 100), None);
        let short = InHeader {
            len: 10,
            ..Default::default()
        };
        assert_eq!(arg0_len(&short, 0), None);
        let big = InHeader {
            len: 40 + 200,
            ..Default::default()
        };
        assert_eq!(arg0_len(&big, 0), None);
    }

    #[test]
    fn setattr_times() {
        assert_eq!(time_in(1, 2), Some(UNIX_EPOCH + Duration::new(1, 2)));
        assert_eq!(
            time_in((-2i64) as u64, 750_000_000),
            Some(UNIX_EPOCH - Duration::new(1, 250_000_000))
        );
        assert_eq!(time_in(0, 1_000_000_000), None);
    }
}
