use thiserror::Error;

/// An errno value. Newtype so that the compiler keeps errnos apart from other integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENXIO: Errno = Errno(libc::ENXIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const EMLINK: Errno = Errno(libc::EMLINK);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const ETXTBSY: Errno = Errno(libc::ETXTBSY);
    /// A file handle names an inode that is gone (freed, unlinked, or reused).
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    /// The kernel's EFSCORRUPTED.
    pub const EUCLEAN: Errno = Errno(libc::EUCLEAN);
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

/// Every error a file system returns. Each maps to exactly one errno ([`FsError::errno`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FsError {
    /// A plain POSIX failure (ENOENT, EEXIST, EACCES, ...).
    #[error("{0}")]
    Errno(Errno),
    /// The device failed.
    #[error("device I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The on-disk structures are inconsistent; the message names what is wrong.
    #[error("file system corrupt: {0}")]
    Corrupt(String),
    /// The image or device cannot be used as asked, through no fault of its contents: not
    /// this file system's format, in use by another mount, a newer format version. The
    /// message is the whole one-line explanation.
    #[error("{1}")]
    Refused(Errno, String),
}

impl FsError {
    pub fn errno(&self) -> Errno {
        match self {
            FsError::Errno(e) => *e,
            FsError::Io(e) => Errno(e.raw_os_error().unwrap_or(libc::EIO)),
            FsError::Corrupt(_) => Errno::EUCLEAN,
            FsError::Refused(e, _) => *e,
        }
    }
}

impl From<Errno> for FsError {
    fn from(e: Errno) -> Self {
        FsError::Errno(e)
    }
}

pub type Result<T, E = FsError> = std::result::Result<T, E>;
