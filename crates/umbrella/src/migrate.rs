//! Moving a file between branches, atomically from the user's view (issue 3 item 3).
//!
//! The protocol, for a file with names P1..Pn on branch S moving to branch D:
//! 1. a move record (`D/.umbrella/moves/SEQ`: source, target, names) is written and
//!    fsynced — from here on a crash is resolved by recovery;
//! 2. the data, mode, owner, times and xattrs are copied to `D/.umbrella/tmp/SEQ`, which is
//!    fsynced;
//! 3. under the namespace lock: the temporary is renamed to P1 on D (creating directories
//!    on D as needed), P2..Pn are linked to it, D's directories are fsynced;
//! 4. P1..Pn are removed from S and S's directories fsynced; the index now says D;
//! 5. the record is removed.
//!
//! Recovery at mount, per record: if P1 exists on D, step 3 completed (the temporary was
//! complete before the rename), so the move is finished (missing links made, source names
//! removed); otherwise it is rolled back (the temporary is deleted, the source is intact).
//! Either way exactly one complete copy stays visible.
//!
//! A file is moved only while nobody has it open (its `mig` lock keeps opens out), except
//! when a write overflows: then every handle's descriptor is held exclusively during the
//! copy and re-pointed at the new copy afterwards.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_vfs::{FileKind, Ino, Result};
use log::{info, warn};
use parking_lot::RwLockWriteGuard;

use crate::branch::{Branch, DirFd};
use crate::fs::{Handle, Inner, err, ioerr, now};
use crate::ns::{Entry, Tree};
use crate::rules::{BranchId, Facts};
use crate::sys::{self, TimeSet};

static SEQ: AtomicU64 = AtomicU64::new(0);

fn new_seq() -> String {
    let t = now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{t:016x}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A move record (see the module comment). Layout, little-endian: magic `UMBRMOVE`,
/// u16+bytes source branch name, u16+bytes target branch name, u16+bytes temporary name,
/// u32 name count, count × (u32+bytes relative path), u32 crc32c of all before.
#[derive(Debug, PartialEq, Eq)]
pub struct MoveRecord {
    pub src: String,
    pub dst: String,
    pub tmp: String,
    pub paths: Vec<Vec<u8>>,
}

impl MoveRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = b"UMBRMOVE".to_vec();
        for s in [&self.src, &self.dst, &self.tmp] {
            v.extend_from_slice(&(s.len() as u16).to_le_bytes());
            v.extend_from_slice(s.as_bytes());
        }
        v.extend_from_slice(&(self.paths.len() as u32).to_le_bytes());
        for p in &self.paths {
            v.extend_from_slice(&(p.len() as u32).to_le_bytes());
            v.extend_from_slice(p);
        }
        let c = crc32c::crc32c(&v);
        v.extend_from_slice(&c.to_le_bytes());
        v
    }

    pub fn decode(d: &[u8]) -> Option<MoveRecord> {
        if d.len() < 12 {
            return None;
        }
        let (body, crc) = d.split_at(d.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?)
            || !body.starts_with(b"UMBRMOVE")
        {
            return None;
        }
        let mut at = 8;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = body.get(at..at + n)?;
            at += n;
            Some(s)
        };
        let mut strs = Vec::new();
        for _ in 0..3 {
            let l = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
            strs.push(String::from_utf8(take(l)?.to_vec()).ok()?);
        }
        let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let mut paths = Vec::new();
        for _ in 0..n {
            let l = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            paths.push(take(l)?.to_vec());
        }
        let tmp = strs.pop()?;
        let dst = strs.pop()?;
        let src = strs.pop()?;
        Some(MoveRecord {
            src,
            dst,
            tmp,
            paths,
        })
    }
}

fn split(rel: &[u8]) -> (&[u8], &OsStr) {
    match rel.iter().rposition(|&c| c == b'/') {
        Some(i) => (&rel[..i], OsStr::from_bytes(&rel[i + 1..])),
        None => (b"", OsStr::from_bytes(rel)),
    }
}

fn fsync_dir(fd: &OwnedFd) -> std::io::Result<()> {
    let real = sys::openat(
        fd.as_fd(),
        OsStr::new("."),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )?;
    sys::fsync(real.as_fd(), false)
}

fn write_file_durable(dir: &OwnedFd, name: &str, data: &[u8]) -> std::io::Result<()> {
    let fd = sys::openat(
        dir.as_fd(),
        OsStr::new(name),
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o600,
    )?;
    let mut f = std::fs::File::from(fd);
    f.write_all(data)?;
    f.sync_all()?;
    fsync_dir(dir)
}

fn read_file(dir: &OwnedFd, name: &OsStr) -> std::io::Result<Vec<u8>> {
    let fd = sys::openat(dir.as_fd(), name, libc::O_RDONLY, 0)?;
    let mut v = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut v)?;
    Ok(v)
}

/// Creates `rel` (and its parents) on `b` if missing, with the mode and owner of the copy
/// on `model` when there is one. Used by recovery, before the index exists.
fn mkdir_p(b: &Branch, rel: &[u8], model: Option<&Branch>) -> std::io::Result<DirFd> {
    if rel.is_empty() {
        return b.dir(b"");
    }
    if let Ok(fd) = b.dir(rel) {
        return Ok(fd);
    }
    let (parent, name) = split(rel);
    let pfd = mkdir_p(b, parent, model)?;
    let st = model
        .and_then(|m| m.dir(parent).ok())
        .and_then(|fd| sys::fstatat(fd.as_fd(), name).ok());
    let mode = st.map_or(0o755, |s| s.st_mode & 0o7777);
    match sys::mkdirat(pfd.as_fd(), name, mode) {
        Ok(()) => {
            if let Some(s) = st {
                let _ = sys::fchownat(pfd.as_fd(), name, Some(s.st_uid), Some(s.st_gid));
                let _ = sys::fchmodat(pfd.as_fd(), name, mode);
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e),
    }
    b.dir(rel)
}

/// Copies the data of a regular file; kernel copy first, read/write when the kernel
/// cannot copy across these file systems.
fn copy_data(from: &OwnedFd, to: &OwnedFd) -> std::io::Result<u64> {
    let (mut oi, mut oo) = (0i64, 0i64);
    let mut total = 0u64;
    loop {
        match sys::copy_file_range(from.as_fd(), &mut oi, to.as_fd(), &mut oo, 1 << 30) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e)
                if matches!(
                    sys::errno(&e),
                    libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP
                ) && total == 0 =>
            {
                break;
            }
            Err(e) => return Err(e),
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = sys::pread(from.as_fd(), &mut buf, off)?;
        if n == 0 {
            return Ok(off);
        }
        let mut w = 0;
        while w < n {
            w += sys::pwrite(to.as_fd(), &buf[w..n], off + w as u64)?;
        }
        off += n as u64;
    }
}

fn copy_xattrs(sdir: &OwnedFd, sname: &OsStr, ddir: &OwnedFd, dname: &OsStr) {
    let Ok(list) = sys::listxattr(sdir.as_fd(), Some(sname)) else {
        return;
    };
    for a in list.split(|&c| c == 0).filter(|a| !a.is_empty()) {
        let a = OsStr::from_bytes(a);
        if let Ok(v) = sys::getxattr(sdir.as_fd(), Some(sname), a)
            && let Err(e) = sys::setxattr(ddir.as_fd(), Some(dname), a, &v, 0)
        {
            warn!("migration: xattr {a:?} not copied: {e}");
        }
    }
}

impl Inner {
    /// Every (dir, name) of the index naming host object `key` on branch `b`.
    fn all_names(&self, ns: &Tree, b: BranchId, key: (u64, u64)) -> Vec<(Ino, OsString)> {
        let mut out = Vec::new();
        for (d, n, fb) in ns.files() {
            if fb != b {
                continue;
            }
            if let Ok((_, st)) = self.stat_entry(ns, d, &n, b)
                && (st.st_dev, st.st_ino) == key
            {
                out.push((d, n));
            }
        }
        out
    }

    /// Moves file `ino` to branch `dst`. The caller holds the file's `mig` lock; `handles`
    /// are its open handles (empty unless overflowing). Returns the bytes copied.
    pub(crate) fn move_file(
        &self,
        ino: Ino,
        dst: BranchId,
        handles: &[Arc<Handle>],
    ) -> Result<u64> {
        // Gather the names and where they are.
        let (src, names, key, st0, rels) = {
            let ns = self.ns.read();
            let (src, first) = self.file_loc(ino)?;
            let (d0, n0) = first.ok_or_else(|| err(libc::ENOENT))?;
            let (_, st0) = self.stat_entry(&ns, d0, &n0, src)?;
            let key = (st0.st_dev, st0.st_ino);
            let mut names: Vec<(Ino, OsString)> = {
                let nodes = self.nodes.lock();
                nodes
                    .files
                    .get(&ino)
                    .map(|n| n.names.clone())
                    .unwrap_or_default()
            };
            if (names.len() as u64) < st0.st_nlink {
                names = self.all_names(&ns, src, key);
            }
            if (names.len() as u64) != st0.st_nlink || names.is_empty() {
                // A link the union cannot see (outside it): moving would break it.
                warn!(
                    "not moving a file with {} links of which {} are in the union",
                    st0.st_nlink,
                    names.len()
                );
                return Err(err(libc::EBUSY));
            }
            let rels: Vec<Vec<u8>> = names
                .iter()
                .map(|(d, n)| {
                    let mut r = ns.rel(*d);
                    if !r.is_empty() {
                        r.push(b'/');
                    }
                    r.extend_from_slice(n.as_bytes());
                    r
                })
                .collect();
            (src, names, key, st0, rels)
        };
        if src == dst {
            return Ok(0);
        }
        let sb = self.branch(src)?;
        let db = self.branch(dst)?;
        let seq = new_seq();
        let rec = MoveRecord {
            src: sb.name.clone(),
            dst: db.name.clone(),
            tmp: seq.clone(),
            paths: rels.clone(),
        };
        // The record goes on the target: the source may be full (overflow).
        let moves = db.meta_dir(Some("moves")).map_err(ioerr)?;
        write_file_durable(&moves, &seq, &rec.encode()).map_err(ioerr)?;
        let tmpdir = db.meta_dir(Some("tmp")).map_err(ioerr)?;
        let tmpname = OsString::from(&seq);
        let cleanup = |e: cairn_vfs::FsError| {
            let _ = sys::unlinkat(tmpdir.as_fd(), &tmpname, false);
            let _ = sys::unlinkat(moves.as_fd(), OsStr::new(&seq), false);
            e
        };
        // Writers through any open handle wait until the move is over.
        let mut guards: Vec<RwLockWriteGuard<'_, OwnedFd>> =
            handles.iter().map(|h| h.fd.write()).collect();
        let kind = sys::kind_of(st0.st_mode);
        let (d0, n0) = (&rels[0], &names[0].1);
        let sdir = sb.dir(split(d0).0).map_err(ioerr)?;
        let copied = (|| -> std::io::Result<u64> {
            let mut bytes = 0;
            match kind {
                FileKind::RegularFile => {
                    let from = sys::openat(sdir.as_fd(), n0, libc::O_RDONLY | libc::O_NOATIME, 0)
                        .or_else(|_| sys::openat(sdir.as_fd(), n0, libc::O_RDONLY, 0))?;
                    let to = sys::openat(
                        tmpdir.as_fd(),
                        &tmpname,
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                        0o600,
                    )?;
                    bytes = copy_data(&from, &to)?;
                    sys::fsync(to.as_fd(), false)?;
                }
                FileKind::Symlink => {
                    let t = sys::readlinkat(sdir.as_fd(), n0)?;
                    sys::symlinkat(&t, tmpdir.as_fd(), &tmpname)?;
                }
                _ => sys::mknodat(tmpdir.as_fd(), &tmpname, st0.st_mode, st0.st_rdev)?,
            }
            copy_xattrs(&sdir, n0, &tmpdir, &tmpname);
            sys::fchownat(tmpdir.as_fd(), &tmpname, Some(st0.st_uid), Some(st0.st_gid))?;
            if kind != FileKind::Symlink {
                sys::fchmodat(tmpdir.as_fd(), &tmpname, st0.st_mode & 0o7777)?;
            }
            let at = sys::attr_from(&st0, 0);
            sys::utimensat(
                tmpdir.as_fd(),
                &tmpname,
                TimeSet::At(at.atime),
                TimeSet::At(at.mtime),
            )?;
            fsync_dir(&tmpdir)?;
            Ok(bytes)
        })();
        let bytes = match copied {
            Ok(b) => b,
            Err(e) => return Err(cleanup(ioerr(e))),
        };
        crate::failpoint::hit("after-copy");

        // Commit, under the namespace lock.
        let mut ns = self.ns.write();
        let still = {
            let nodes = self.nodes.lock();
            nodes.files.get(&ino).is_some_and(|n| n.branch == src)
        } && names.iter().all(|(d, n)| {
            // Same object under every name, and no name added meanwhile (a link made during
            // the copy would be left behind on the source as a separate file).
            ns.dirs.get(d).and_then(|dd| dd.children.get(n)) == Some(&Entry::File(src))
                && self.stat_entry(&ns, *d, n, src).is_ok_and(|(_, s)| {
                    (s.st_dev, s.st_ino) == key && s.st_nlink == names.len() as u64
                })
        });
        if !still {
            drop(ns);
            return Err(cleanup(err(libc::EAGAIN)));
        }
        // The directory times are put back afterwards: a migration does not change the
        // union directory, so its mtime (the newest copy's) must not move.
        let mut saved: Vec<(DirFd, sys::Stat)> = Vec::new();
        for (d, _) in &names {
            let copies = [
                self.ensure_dir(&mut ns, *d, dst).ok(),
                sb.dir(&ns.rel(*d)).ok(),
            ];
            for fd in copies.into_iter().flatten() {
                if let Ok(st) = sys::fstat(fd.as_fd()) {
                    saved.push((fd, st));
                }
            }
        }
        let mut dfds: Vec<DirFd> = Vec::new();
        for (k, (d, n)) in names.iter().enumerate() {
            let nfd = match self.ensure_dir(&mut ns, *d, dst) {
                Ok(fd) => fd,
                Err(e) => {
                    // Undo the names placed so far; the source is untouched.
                    for (j, (_, nn)) in names.iter().enumerate().take(k) {
                        let _ = sys::unlinkat(dfds[j].as_fd_ref(), nn, false);
                    }
                    drop(ns);
                    return Err(cleanup(e));
                }
            };
            let r = if k == 0 {
                sys::renameat2(
                    tmpdir.as_fd(),
                    &tmpname,
                    nfd.as_fd(),
                    n,
                    libc::RENAME_NOREPLACE,
                )
            } else {
                let first: &DirFd = &dfds[0];
                sys::linkat(first.as_fd(), &names[0].1, nfd.as_fd(), n)
            };
            if let Err(e) = r {
                for (j, (_, nn)) in names.iter().enumerate().take(k) {
                    let _ = sys::unlinkat(dfds[j].as_fd_ref(), nn, false);
                }
                drop(ns);
                return Err(cleanup(ioerr(e)));
            }
            if k == 0 {
                crate::failpoint::hit("after-rename");
            }
            dfds.push(nfd);
        }
        for fd in &dfds {
            let _ = fsync_dir(fd);
        }
        crate::failpoint::hit("before-unlink");
        let mut sfds = Vec::new();
        for (d, n) in &names {
            let r = sb
                .dir(&ns.rel(*d))
                .and_then(|fd| sys::unlinkat(fd.as_fd(), n, false).map(|()| fd));
            match r {
                Ok(fd) => sfds.push(fd),
                Err(e) => warn!(
                    "migration: removing the source name {n:?} on '{}': {e}",
                    sb.name
                ),
            }
        }
        for fd in &sfds {
            let _ = fsync_dir(fd);
        }
        for (fd, st) in &saved {
            let a = sys::attr_from(st, 0);
            let _ = sys::utimensat(
                fd.as_fd(),
                OsStr::new("."),
                TimeSet::At(a.atime),
                TimeSet::At(a.mtime),
            );
        }
        for (d, n) in &names {
            if let Some(dd) = ns.dirs.get_mut(d) {
                dd.children.insert(n.clone(), Entry::File(dst));
            }
        }
        let nst = sys::fstatat(dfds[0].as_fd(), &names[0].1).map_err(ioerr)?;
        {
            let mut nodes = self.nodes.lock();
            nodes.keymap.remove(&key);
            nodes.keymap.insert((nst.st_dev, nst.st_ino), ino);
            if let Some(n) = nodes.files.get_mut(&ino) {
                n.branch = dst;
                n.key = (nst.st_dev, nst.st_ino);
                n.names = names.clone();
            }
        }
        for (g, h) in guards.iter_mut().zip(handles) {
            let flags = h.flags & !(libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL);
            match sys::openat(dfds[0].as_fd(), &names[0].1, flags, 0) {
                Ok(fd) => **g = fd,
                Err(e) => warn!("migration: re-opening a handle on the new branch: {e}"),
            }
        }
        drop(guards);
        drop(ns);
        let _ = sys::unlinkat(moves.as_fd(), OsStr::new(&seq), false);
        let _ = fsync_dir(&moves);
        sb.space_changed();
        db.space_changed();
        self.counters
            .migrations_done
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .migrated_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        Ok(bytes)
    }

    /// Facts for the rules about a file as it is now.
    fn facts_now(&self, ino: Ino) -> Result<(BranchId, Vec<u8>, sys::Stat)> {
        let ns = self.ns.read();
        let (b, first) = self.file_loc(ino)?;
        let (d, n) = first.ok_or_else(|| err(libc::ENOENT))?;
        let (_, st) = self.stat_entry(&ns, d, &n, b)?;
        Ok((b, ns.union_path(d, &n), st))
    }

    /// Re-evaluates the rules for a closed file and moves it if they now choose another
    /// branch. Returns the bytes moved.
    pub(crate) fn check_and_move(&self, ino: Ino) -> Option<u64> {
        let mig = self.nodes.lock().files.get(&ino).map(|n| n.mig.clone())?;
        let r = {
            let _g = mig.lock();
            if self.nodes.lock().files.get(&ino).is_none_or(|n| n.open > 0) {
                None
            } else {
                match self.facts_now(ino) {
                    Err(_) => None,
                    Ok((b, path, st)) => {
                        let a = sys::attr_from(&st, ino);
                        let f = Facts::of(&path, &a, b);
                        let d = self.decide(&f, false);
                        match self.target_for(&d, Some(b), a.size) {
                            None => None,
                            Some(t) => match self.move_file(ino, t, &[]) {
                                Ok(n) => {
                                    *self.hits.lock().entry(d.rule).or_insert(0) += 1;
                                    Some(n)
                                }
                                Err(e) if matches!(e.errno().0, libc::EAGAIN | libc::ENOENT) => {
                                    // The file changed under the copy (renamed, linked, removed): not a
                                    // failure; its next close or the enforcer looks again.
                                    log::debug!(
                                        "move of {} abandoned: {e}",
                                        String::from_utf8_lossy(&path)
                                    );
                                    None
                                }
                                Err(e) => {
                                    self.counters
                                        .migrations_failed
                                        .fetch_add(1, Ordering::Relaxed);
                                    warn!(
                                        "moving {} to branch {t}: {e}",
                                        String::from_utf8_lossy(&path)
                                    );
                                    None
                                }
                            },
                        }
                    }
                }
            }
        };
        drop(mig);
        let mut nodes = self.nodes.lock();
        self.maybe_drop(&mut nodes, ino);
        r
    }

    /// A write found the file's branch full: move the open file to the rule's next branch
    /// with room for `need` bytes.
    pub(crate) fn overflow(&self, ino: Ino, need: u64) -> Result<()> {
        let mig = self
            .nodes
            .lock()
            .files
            .get(&ino)
            .map(|n| n.mig.clone())
            .ok_or_else(|| err(libc::ENOSPC))?;
        let _g = mig.lock();
        let handles: Vec<Arc<Handle>> = {
            let nodes = self.nodes.lock();
            nodes
                .files
                .get(&ino)
                .map(|n| {
                    n.handles
                        .iter()
                        .filter_map(std::sync::Weak::upgrade)
                        .collect()
                })
                .unwrap_or_default()
        };
        let (b, path, st) = self.facts_now(ino)?;
        if let Ok(br) = self.branch(b) {
            br.space_changed();
        }
        let a = sys::attr_from(&st, ino);
        let f = Facts {
            size: need,
            ..Facts::of(&path, &a, b)
        };
        let d = self.decide(&f, false);
        let target = d
            .candidates()
            .iter()
            .copied()
            .find(|&c| c != b && self.active_pub(c) && self.has_room(c, need));
        let Some(t) = target else {
            return Err(err(libc::ENOSPC));
        };
        info!(
            "{}: branch full, moving to branch {t} (overflow)",
            String::from_utf8_lossy(&path)
        );
        self.move_file(ino, t, &handles)?;
        self.counters.overflows.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn active_pub(&self, b: BranchId) -> bool {
        crate::rules::BranchView::active(self, b)
    }

    /// A file node for a name found by a walk (no kernel lookup counted).
    pub(crate) fn node_for_enforce(
        &self,
        dir: Ino,
        name: &OsStr,
        b: BranchId,
        st: &sys::Stat,
    ) -> Ino {
        self.node_seen(dir, name, b, st, 0)
    }

    /// Finishes or rolls back moves interrupted by a crash (see the module comment), then
    /// empties every temporary directory.
    pub(crate) fn recover_moves(&self) {
        let branches = self.branches.read().clone();
        for sb in &branches {
            let Ok(moves) = sb.meta_dir(Some("moves")) else {
                continue;
            };
            let Ok(list) = sys::openat(
                moves.as_fd(),
                OsStr::new("."),
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            )
            .and_then(sys::read_dir) else {
                continue;
            };
            for ent in list {
                let rname = OsString::from_vec(ent.name.clone());
                let rec = read_file(&moves, &rname)
                    .ok()
                    .and_then(|d| MoveRecord::decode(&d));
                let Some(rec) = rec else {
                    warn!(
                        "recovery: unreadable move record {rname:?} on '{}': removed",
                        sb.name
                    );
                    let _ = sys::unlinkat(moves.as_fd(), &rname, false);
                    continue;
                };
                let (Some(db), Some(sb)) = (
                    branches.iter().find(|b| b.name == rec.dst),
                    branches.iter().find(|b| b.name == rec.src),
                ) else {
                    warn!(
                        "recovery: move between unknown branches '{}' -> '{}' dropped",
                        rec.src, rec.dst
                    );
                    let _ = sys::unlinkat(moves.as_fd(), &rname, false);
                    continue;
                };
                let (d0, n0) = split(&rec.paths[0]);
                let done = db
                    .dir(d0)
                    .and_then(|fd| sys::fstatat(fd.as_fd(), n0))
                    .is_ok();
                if done {
                    let first = db.dir(d0);
                    for p in &rec.paths[1..] {
                        let (d, n) = split(p);
                        if db
                            .dir(d)
                            .and_then(|fd| sys::fstatat(fd.as_fd(), n))
                            .is_err()
                            && let (Ok(f), Ok(nfd)) = (&first, mkdir_p(db, d, Some(sb)))
                            && let Err(e) = sys::linkat(f.as_fd(), n0, nfd.as_fd(), n)
                        {
                            warn!("recovery: relinking {}: {e}", String::from_utf8_lossy(p));
                        }
                    }
                    for p in &rec.paths {
                        let (d, n) = split(p);
                        if let Ok(fd) = sb.dir(d) {
                            let _ = sys::unlinkat(fd.as_fd(), n, false);
                            let _ = fsync_dir(&fd);
                        }
                    }
                    info!(
                        "recovery: finished the move of {} to '{}'",
                        String::from_utf8_lossy(&rec.paths[0]),
                        db.name
                    );
                } else {
                    if let Ok(t) = db.meta_dir(Some("tmp")) {
                        let _ = sys::unlinkat(t.as_fd(), OsStr::new(&rec.tmp), false);
                    }
                    info!(
                        "recovery: rolled back the move of {} to '{}'",
                        String::from_utf8_lossy(&rec.paths[0]),
                        db.name
                    );
                }
                let _ = sys::unlinkat(moves.as_fd(), &rname, false);
                let _ = fsync_dir(&moves);
                self.counters.recovered.fetch_add(1, Ordering::Relaxed);
            }
        }
        for b in &branches {
            let Ok(t) = b.meta_dir(Some("tmp")) else {
                continue;
            };
            if let Ok(list) = sys::openat(
                t.as_fd(),
                OsStr::new("."),
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            )
            .and_then(sys::read_dir)
            {
                for e in list {
                    let _ = sys::unlinkat(t.as_fd(), OsStr::from_bytes(&e.name), false);
                }
            }
        }
    }
}

trait AsFdRef {
    fn as_fd_ref(&self) -> std::os::fd::BorrowedFd<'_>;
}
impl AsFdRef for OwnedFd {
    fn as_fd_ref(&self) -> std::os::fd::BorrowedFd<'_> {
        self.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip() {
        let r = MoveRecord {
            src: "fast".into(),
            dst: "slow".into(),
            tmp: new_seq(),
            paths: vec![b"a/b".to_vec(), b"c".to_vec()],
        };
        let e = r.encode();
        assert_eq!(MoveRecord::decode(&e), Some(r));
        let mut bad = e.clone();
        bad[10] ^= 0x40;
        assert_eq!(MoveRecord::decode(&bad), None);
        assert_eq!(MoveRecord::decode(&e[..e.len() - 2]), None);
    }
}
