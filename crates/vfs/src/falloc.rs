//! fallocate(2): which operation a mode asks for, and the errno rules every file system of
//! cairn applies before it does any of it (the kernel's `vfs_fallocate`, and ext4's for
//! the range shifts).
//!
//! Over FUSE the kernel passes only the allocation, PUNCH_HOLE and ZERO_RANGE through
//! (`fs/fuse/file.c` refuses every other mode with EOPNOTSUPP before the file system sees
//! it); COLLAPSE_RANGE and INSERT_RANGE reach a file system driven directly.

use crate::fileattr;
use crate::perm::Owner;
use crate::{Errno, FallocMode, Result};

/// One fallocate(2) operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Falloc {
    /// Mode 0 (or KEEP_SIZE): the range is allocated, reads as before (zeros in holes), and
    /// the size grows to its end unless `keep_size`.
    Allocate { keep_size: bool },
    /// PUNCH_HOLE | KEEP_SIZE: the range reads as zeros and whole blocks in it are freed.
    PunchHole,
    /// ZERO_RANGE: the range reads as zeros and is allocated; the size grows to its end
    /// unless `keep_size`.
    ZeroRange { keep_size: bool },
    /// COLLAPSE_RANGE: the range is removed and what follows moves down; the size shrinks.
    CollapseRange,
    /// INSERT_RANGE: a hole of the range's length opens at its start, what follows moves
    /// up; the size grows.
    InsertRange,
}

impl Falloc {
    /// The operation `mode` asks for: exactly one of them, with KEEP_SIZE where it means
    /// something; every other combination is EOPNOTSUPP (PUNCH_HOLE without KEEP_SIZE,
    /// COLLAPSE or INSERT with it, two operations at once, unknown bits).
    pub fn decode(mode: FallocMode) -> Result<Falloc> {
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        Ok(match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => Falloc::Allocate { keep_size },
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => Falloc::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => Falloc::ZeroRange { keep_size },
            libc::FALLOC_FL_COLLAPSE_RANGE if !keep_size => Falloc::CollapseRange,
            libc::FALLOC_FL_INSERT_RANGE if !keep_size => Falloc::InsertRange,
            _ => return Err(Errno::EOPNOTSUPP.into()),
        })
    }

    /// The checks before any change, in the kernel's order: a zero length is EINVAL; on
    /// an immutable inode nothing, on an append-only one nothing but allocation (EPERM); a
    /// directory is EISDIR, anything else but a regular file ENODEV; a range ending past
    /// `max_size` is EFBIG. The range shifts move whole blocks: an offset or length not a
    /// multiple of `block` is EINVAL, a collapse must end before the end of the file and an
    /// insert start before it (EINVAL), and an insert must not grow the file past
    /// `max_size` (EFBIG).
    pub fn check(
        self,
        o: Owner,
        size: u64,
        offset: u64,
        length: u64,
        block: u64,
        max_size: u64,
    ) -> Result<()> {
        if length == 0 {
            return Err(Errno::EINVAL.into());
        }
        if o.flags & fileattr::IMMUTABLE != 0
            || (o.flags & fileattr::APPEND != 0 && !matches!(self, Falloc::Allocate { .. }))
        {
            return Err(Errno::EPERM.into());
        }
        match o.mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(Errno::EISDIR.into()),
            _ => return Err(Errno(libc::ENODEV).into()),
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        if end > max_size {
            return Err(Errno::EFBIG.into());
        }
        match self {
            Falloc::CollapseRange | Falloc::InsertRange
                if !(offset | length).is_multiple_of(block) =>
            {
                Err(Errno::EINVAL.into())
            }
            Falloc::CollapseRange if end >= size => Err(Errno::EINVAL.into()),
            Falloc::InsertRange if offset >= size => Err(Errno::EINVAL.into()),
            Falloc::InsertRange if size.checked_add(length).is_none_or(|s| s > max_size) => {
                Err(Errno::EFBIG.into())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: i32 = libc::FALLOC_FL_KEEP_SIZE;

    #[test]
    fn modes() {
        assert_eq!(
            Falloc::decode(0).unwrap(),
            Falloc::Allocate { keep_size: false }
        );
        assert_eq!(
            Falloc::decode(libc::FALLOC_FL_PUNCH_HOLE | K).unwrap(),
            Falloc::PunchHole
        );
        assert_eq!(
            Falloc::decode(libc::FALLOC_FL_ZERO_RANGE | K).unwrap(),
            Falloc::ZeroRange { keep_size: true }
        );
        for bad in [
            libc::FALLOC_FL_PUNCH_HOLE,
            libc::FALLOC_FL_COLLAPSE_RANGE | K,
            libc::FALLOC_FL_INSERT_RANGE | K,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE | K,
            0x4, // FALLOC_FL_NO_HIDE_STALE
            0x40,
        ] {
            assert_eq!(
                Falloc::decode(bad).unwrap_err().errno(),
                Errno::EOPNOTSUPP,
                "{bad:#x}"
            );
        }
    }

    #[test]
    fn errno_rules() {
        let f = |flags| Owner {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            flags,
        };
        let e = |op: Falloc, o: Owner, off: u64, len: u64| {
            op.check(o, 8192, off, len, 4096, 1 << 40)
                .err()
                .map(|e| e.errno().0)
        };
        let c = Falloc::CollapseRange;
        let i = Falloc::InsertRange;
        let a = Falloc::Allocate { keep_size: false };
        assert_eq!(e(a, f(0), 0, 0), Some(libc::EINVAL));
        assert_eq!(e(c, f(0), 0, 4096), None);
        assert_eq!(
            e(c, f(0), 4096, 4096),
            Some(libc::EINVAL),
            "reaches the end"
        );
        assert_eq!(e(c, f(0), 1, 4096), Some(libc::EINVAL), "unaligned");
        assert_eq!(e(i, f(0), 4096, 4096), None);
        assert_eq!(e(i, f(0), 8192, 4096), Some(libc::EINVAL), "at the end");
        assert_eq!(e(a, f(fileattr::APPEND), 0, 1), None);
        assert_eq!(
            e(Falloc::PunchHole, f(fileattr::APPEND), 0, 1),
            Some(libc::EPERM)
        );
        assert_eq!(e(a, f(fileattr::IMMUTABLE), 0, 1), Some(libc::EPERM));
        assert_eq!(e(a, f(0), 1 << 40, 1), Some(libc::EFBIG));
        let dir = Owner {
            mode: libc::S_IFDIR | 0o755,
            ..f(0)
        };
        assert_eq!(e(a, dir, 0, 1), Some(libc::EISDIR));
        assert_eq!(
            Falloc::InsertRange
                .check(f(0), 1 << 40, 0, 4096, 4096, 1 << 40)
                .unwrap_err()
                .errno(),
            Errno::EFBIG
        );
    }
}
