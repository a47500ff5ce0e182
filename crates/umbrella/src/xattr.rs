//! Extended attributes: a file's live on its branch; a directory's are kept on every copy
//! (set and removed on all, read from the first). Every host call has its branch's
//! deadline; no index lock is held across one.

use std::ffi::OsStr;
use std::os::fd::AsFd;

use cairn_vfs::{Ctx, Ino, Result};

use crate::config::ErrorMode;
use crate::fs::{Inner, err, ioerr};
use crate::sys;

pub fn get(i: &Inner, _ctx: &Ctx, ino: Ino, name: Option<&OsStr>) -> Result<Vec<u8>> {
    let attr = name.map(OsStr::to_os_string);
    // The kernel asks for security.capability before every write(2) (file_remove_privs);
    // the file is open then, and its descriptor answers without resolving a path. Asked
    // first: an overflowing migration of the file holds the descriptor (the lock order in
    // `fs`).
    if let (Some(n), Some(h)) = (attr.clone(), i.any_handle(ino)) {
        return h
            .io(move |fd| sys::fgetxattr(fd.as_fd(), &n))
            .map_err(ioerr);
    }
    let _shape = i.shape.read_recursive();
    let dir = {
        let ns = i.ns.read();
        ns.dirs
            .get(&ino)
            .map(|d| (ns.rel(ino), i.dir_branches(d).into_iter().next()))
    };
    if let Some((rel, b)) = dir {
        let b = b.ok_or_else(|| err(libc::EIO))?;
        let bb = b.clone();
        return b
            .run(move || {
                let fd = bb.dir_here(&rel)?;
                match &attr {
                    Some(n) => sys::getxattr(fd.as_fd(), None, n),
                    None => sys::listxattr(fd.as_fd(), None),
                }
            })
            .map_err(ioerr);
    }
    let (b, loc) = i.file_loc(ino)?;
    let (dir, fname) = loc.ok_or_else(|| err(libc::ENOENT))?;
    let br = i.branch(b)?;
    let pfd = br.dir(&i.rel(dir)).map_err(ioerr)?;
    br.run(move || match &attr {
        Some(n) => sys::getxattr(pfd.as_fd(), Some(&fname), n),
        None => sys::listxattr(pfd.as_fd(), Some(&fname)),
    })
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
    let _shape = i.shape.read_recursive();
    let (attr, value) = (name.to_os_string(), value.map(<[u8]>::to_vec));
    let dir = {
        let ns = i.ns.read();
        match ns.dirs.get(&ino) {
            Some(d) => {
                i.merged_check(d)?;
                Some((ns.rel(ino), i.dir_branches(d)))
            }
            None => None,
        }
    };
    if let Some((rel, branches)) = dir {
        for (k, b) in branches.into_iter().enumerate() {
            // CREATE/REPLACE are decided by the first copy; the others follow it.
            let f = if k == 0 { flags } else { 0 };
            let (bb, rel, attr, val) = (b.clone(), rel.clone(), attr.clone(), value.clone());
            let r = b.run(move || {
                let fd = bb.dir_here(&rel)?;
                match &val {
                    Some(v) => sys::setxattr(fd.as_fd(), None, &attr, v, f),
                    None => sys::removexattr(fd.as_fd(), None, &attr),
                }
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
    let pfd = br.dir(&i.rel(dir)).map_err(ioerr)?;
    br.run(move || match &value {
        Some(v) => sys::setxattr(pfd.as_fd(), Some(&fname), &attr, v, flags),
        None => sys::removexattr(pfd.as_fd(), Some(&fname), &attr),
    })
    .map_err(ioerr)
}
