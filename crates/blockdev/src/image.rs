//! Making a file system on an image file or a block device: the one way every format's
//! mkfs opens its target, so that each refuses the same things in the same order and
//! leaves nothing behind when it fails.
//!
//! Nothing is changed until every refusal has been considered, in this order: no size for
//! a new or empty image; a size the format cannot hold (its own check, which names the
//! minimum); an image someone holds (a mount, a running fsck: always refused, see
//! [`crate::lock`]); existing contents (the format's own file system, a foreign signature,
//! any non-zero byte at the start: refused unless forced); an image file larger than the
//! host's free space (refused unless sparse). An image file this call created is removed
//! again if it fails.

use std::fmt;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

use crate::{FileDevice, Lock};

/// What mkfs asks of its target.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Bytes; `None`: the existing image's size, or the whole block device.
    pub size: Option<u64>,
    pub block_size: u32,
    /// Overwrite whatever the image holds (one in use is refused regardless).
    pub force: bool,
    /// Allow an image file larger than its host's free space.
    pub sparse: bool,
}

/// Why mkfs did not make a file system; `E` is the format's own error (its size check and
/// its writing).
#[derive(Debug)]
pub enum MkfsError<E> {
    /// No size given and the image does not exist or is empty.
    NoSize,
    /// Another program holds the image (the lock's message names it).
    InUse(io::Error),
    /// The image holds something (`what`) and the call was not forced.
    Holds {
        path: PathBuf,
        what: String,
    },
    /// Growing the image needs more than its host has free, and it was not to be sparse.
    HostFull {
        path: PathBuf,
        need: u64,
        free: u64,
    },
    Io(io::Error),
    /// The format refused the size, or failed to write.
    Format(E),
}

impl<E> MkfsError<E> {
    /// The errno a refusal is reported with (`None`: the format's own error or I/O).
    pub fn errno(&self) -> Option<i32> {
        match self {
            MkfsError::NoSize => Some(libc::EINVAL),
            MkfsError::InUse(_) => Some(libc::EBUSY),
            MkfsError::Holds { .. } => Some(libc::EEXIST),
            MkfsError::HostFull { .. } => Some(libc::ENOSPC),
            MkfsError::Io(_) | MkfsError::Format(_) => None,
        }
    }

    /// The format's own error as it is; a refusal (its errno and its one line) and an I/O
    /// error made into the format's error type by `refused` and `io`.
    pub fn into_error(
        self,
        refused: impl FnOnce(i32, String) -> E,
        io: impl FnOnce(io::Error) -> E,
    ) -> E
    where
        E: fmt::Display,
    {
        match (self.errno(), self) {
            (_, MkfsError::Format(e)) => e,
            (_, MkfsError::Io(e)) => io(e),
            (errno, e) => refused(errno.unwrap_or(libc::EINVAL), e.to_string()),
        }
    }
}

impl<E: fmt::Display> fmt::Display for MkfsError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MkfsError::NoSize => {
                write!(
                    f,
                    "no --size given and the image does not exist (or is empty)"
                )
            }
            MkfsError::InUse(e) | MkfsError::Io(e) => write!(f, "{e}"),
            MkfsError::Holds { path, what } => write!(
                f,
                "{} already holds {what}; use --force (-F) to overwrite it",
                path.display()
            ),
            MkfsError::HostFull { path, need, free } => write!(
                f,
                "{} needs {} MiB more but its file system has only {} MiB free; use --sparse to \
                 create it anyway (a sparse image: writes may later fail when the host fills up)",
                path.display(),
                need >> 20,
                free >> 20
            ),
            MkfsError::Format(e) => write!(f, "{e}"),
        }
    }
}

/// Makes a file system on `path` as `target` says: `check_size` refuses a size the format
/// cannot hold, `describe` says what the first [`crate::contents::PROBE_BYTES`] of an
/// existing image hold (its own file system first, then
/// [`crate::contents::describe`]), and `write` makes the file system on the device.
pub fn make<E>(
    path: &Path,
    target: &Target,
    check_size: impl FnOnce(u64) -> Result<(), E>,
    describe: impl FnOnce(&[u8]) -> Option<String>,
    write: impl FnOnce(FileDevice) -> Result<(), E>,
) -> Result<(), MkfsError<E>> {
    let meta = std::fs::metadata(path).ok();
    let is_blockdev = meta
        .as_ref()
        .is_some_and(|m| m.file_type().is_block_device());
    let size = match (target.size, &meta) {
        (Some(s), _) => Some(s),
        _ if is_blockdev => None,
        (None, Some(m)) if m.len() > 0 => Some(m.len()),
        _ => return Err(MkfsError::NoSize),
    };
    if let Some(s) = size {
        check_size(s).map_err(MkfsError::Format)?;
    }
    let created = meta.is_none();
    let r = make_locked(path, target, is_blockdev, size, describe, write);
    if r.is_err() && created {
        // Leave nothing behind: the file did not exist before this call.
        let _ = std::fs::remove_file(path);
    }
    r
}

fn make_locked<E>(
    path: &Path,
    target: &Target,
    is_blockdev: bool,
    size: Option<u64>,
    describe: impl FnOnce(&[u8]) -> Option<String>,
    write: impl FnOnce(FileDevice) -> Result<(), E>,
) -> Result<(), MkfsError<E>> {
    // The exclusive lock first: nothing below may look at or change an image that a mount
    // or another tool is using.
    let file = crate::open_locked(path, false, Lock::Exclusive, !is_blockdev).map_err(|e| {
        if e.kind() == io::ErrorKind::ResourceBusy {
            MkfsError::InUse(e)
        } else {
            MkfsError::Io(e)
        }
    })?;
    if !target.force
        && let Some(what) = describe(&head(&file).map_err(MkfsError::Io)?)
    {
        return Err(MkfsError::Holds {
            path: path.to_path_buf(),
            what,
        });
    }
    if !is_blockdev && let Some(size) = size {
        let have = file.metadata().map_err(MkfsError::Io)?.len();
        if size > have && !target.sparse {
            host_space(path, size - have)?;
        }
        file.set_len(size).map_err(MkfsError::Io)?;
    }
    let dev = FileDevice::from_file(file, path, target.block_size, false).map_err(MkfsError::Io)?;
    write(dev).map_err(MkfsError::Format)
}

/// The image's first bytes, as many as it has up to [`crate::contents::PROBE_BYTES`]: what
/// [`crate::contents::describe`] and a format's own signature check read.
pub fn head(file: &std::fs::File) -> io::Result<Vec<u8>> {
    let mut head = vec![0u8; crate::contents::PROBE_BYTES];
    let mut got = 0;
    while got < head.len() {
        match file.read_at(&mut head[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    head.truncate(got);
    Ok(head)
}

/// Refuses to grow an image by more than the host file system has free: the image would be
/// sparse, and the file system inside it would fail with ENOSPC at unexpected moments.
fn host_space<E>(path: &Path, grow: u64) -> Result<(), MkfsError<E>> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(vfs) = nix::sys::statvfs::statvfs(dir) else {
        return Ok(()); // unknown: do not refuse on a guess
    };
    let free = vfs.blocks_available() * vfs.fragment_size();
    if grow > free {
        return Err(MkfsError::HostFull {
            path: path.to_path_buf(),
            need: grow,
            free,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(size: Option<u64>) -> Target {
        Target {
            size,
            block_size: 4096,
            force: false,
            sparse: false,
        }
    }

    /// Each refusal in its order, nothing left behind by a failed call that created the
    /// file, and the format's writer handed the locked, sized device.
    #[test]
    fn refusals_come_in_order_and_leave_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.img");
        let ok = |_: u64| Ok::<(), String>(());
        let none = |_: &[u8]| None;
        let e = make(&p, &target(None), ok, none, |_| Ok(())).unwrap_err();
        assert!(matches!(e, MkfsError::NoSize));
        let e = make(
            &p,
            &target(Some(1 << 20)),
            |_| Err("too small".to_string()),
            none,
            |_| Ok(()),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "too small");
        assert!(!p.exists());
        let e = make(&p, &target(Some(1 << 20)), ok, none, |_| {
            Err("cannot write".into())
        })
        .unwrap_err();
        assert!(matches!(e, MkfsError::Format(_)));
        assert!(!p.exists(), "a failed mkfs removes the file it created");
        make(&p, &target(Some(1 << 20)), ok, none, |d| {
            assert_eq!(crate::BlockDevice::num_blocks(&d), 256);
            Ok(())
        })
        .unwrap();
        std::fs::write(&p, b"notes\n").unwrap();
        let describe = |h: &[u8]| crate::contents::describe(h);
        let e = make(&p, &target(None), ok, describe, |_| Ok(())).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EEXIST));
        assert!(e.to_string().contains("already holds text"), "{e}");
        assert!(p.exists(), "an existing image is left as it was");
        let held = crate::open_locked(&p, true, Lock::Shared, false).unwrap();
        let forced = Target {
            force: true,
            ..target(None)
        };
        let e = make(&p, &forced, ok, describe, |_| Ok(())).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EBUSY));
        drop(held);
        let huge = Target {
            size: Some(1 << 60),
            ..forced
        };
        let e = make(&p, &huge, ok, describe, |_| Ok(())).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOSPC));
        assert!(e.to_string().contains("use --sparse"), "{e}");
    }
}
