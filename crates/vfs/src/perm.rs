//! Who is calling, and the POSIX permission rules.

use crate::{Errno, FsError, Result};

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

    /// The access an open(2) with these flags needs.
    pub fn for_open_flags(flags: i32) -> Access {
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

#[cfg(test)]
mod tests {
    use super::*;

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
