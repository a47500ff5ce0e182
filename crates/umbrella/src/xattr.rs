//! Extended attributes: a file's live on its branch; a directory's are kept on every copy
//! (set and removed on all, read from the first).

use std::ffi::OsStr;
use std::os::fd::AsFd;

use cairn_vfs::{Ctx, Ino, Result};

use crate::config::ErrorMode;
use crate::fs::{Inner, err, ioerr};
use crate::sys;

pub fn get(i: &Inner, _ctx: &Ctx, ino: Ino, name: Option<&OsStr>) -> Result<Vec<u8>> {
    // The kernel asks for security.capability before every write(2) (file_remove_privs);
    // the file is open then, and its descriptor answers without resolving a path. Asked
    // before `ns` is taken: an overflowing migration of the file holds the descriptor and
    // waits for `ns` (the lock order in `fs`).
    if let (Some(n), Some(h)) = (name, i.any_handle(ino)) {
        return sys::fgetxattr(h.fd.read().as_fd(), n).map_err(ioerr);
    }
    let ns = i.ns.read();
    if let Some(d) = ns.dirs.get(&ino) {
        let rel = ns.rel(ino);
        let b = i
            .dir_branches(d)
            .into_iter()
            .next()
            .ok_or_else(|| err(libc::EIO))?;
        let fd = b.dir(&rel).map_err(ioerr)?;
        return match name {
            Some(n) => sys::getxattr(fd.as_fd(), None, n),
            None => sys::listxattr(fd.as_fd(), None),
        }
        .map_err(ioerr);
    }
    let (b, loc) = i.file_loc(ino)?;
    let (dir, fname) = loc.ok_or_else(|| err(libc::ENOENT))?;
    let br = i.branch(b)?;
    let pfd = br.dir(&ns.rel(dir)).map_err(ioerr)?;
    match name {
        Some(n) => sys::getxattr(pfd.as_fd(), Some(&fname), n),
        None => sys::listxattr(pfd.as_fd(), Some(&fname)),
    }
    .map_err(ioerr)
}

/// Sets (`value` Some) or removes (None) an attribute.
pub fn set(
    i: &Inner,
    _ctx: &Ctx,
    ino: Ino,
    name: &OsStr,
    value: Option<&[u8]>,
    flags: i32,
) -> Result<()> {
    let ns = i.ns.read();
    if let Some(d) = ns.dirs.get(&ino) {
        i.merged_check(d)?;
        let rel = ns.rel(ino);
        for (k, b) in i.dir_branches(d).into_iter().enumerate() {
            // CREATE/REPLACE are decided by the first copy; the others follow it.
            let f = if k == 0 { flags } else { 0 };
            let r = b.dir(&rel).and_then(|fd| match value {
                Some(v) => sys::setxattr(fd.as_fd(), None, name, v, f),
                None => sys::removexattr(fd.as_fd(), None, name),
            });
            match r {
                Ok(()) => {}
                Err(e) if k == 0 => return Err(ioerr(e)),
                Err(e) if value.is_none() && e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) if i.policy().errors == ErrorMode::Or => return Err(ioerr(e)),
                Err(e) => log::warn!("xattr on a directory copy on '{}': {e}", b.name),
            }
        }
        return Ok(());
    }
    let (b, loc) = i.file_loc(ino)?;
    let (dir, fname) = loc.ok_or_else(|| err(libc::ENOENT))?;
    let br = i.branch(b)?;
    let pfd = br.dir(&ns.rel(dir)).map_err(ioerr)?;
    match value {
        Some(v) => sys::setxattr(pfd.as_fd(), Some(&fname), name, v, flags),
        None => sys::removexattr(pfd.as_fd(), Some(&fname), name),
    }
    .map_err(ioerr)
}
