//! Moving a file between branches, atomically from the user's view.
//!
//! The protocol, for a file with names P1..Pn on branch S moving to branch D, one function
//! per step (the failpoint reached after each is in quotes, see `failpoint`):
//! 1. [`Inner::gather`], under the namespace read lock: the names, their paths, the
//!    source's stat (its *identity*: device, inode, size, mtime) and an open descriptor
//!    of it, so a later rename of its directory cannot make the copy read something else
//!    ("gathered");
//! 2. [`Staged::copy_from`]: data, xattrs, owner, mode and times go to
//!    `D/.umbrella/tmp/SEQ`, which is fsynced ("copied");
//! 3. [`Staged::write_record`]: the move record (`record`: both branches, the temporary,
//!    every name, the source's and the copy's identities) is written and fsynced on D
//!    ("recorded"); from here on a crash is resolved by recovery (`recover`);
//! 4. [`Inner::commit`], under the namespace write lock: [`Inner::still_same`] checks that
//!    nothing changed since step 1 (the names, their paths, the object under each, its
//!    size and mtime, both branches active) — otherwise the move is rolled back and the
//!    caller may try again; [`Inner::place_names`] renames the temporary to P1 on D
//!    (`RENAME_NOREPLACE`; "renamed"), links P2..Pn, fsyncs D's directories ("linked");
//!    open handles are re-opened on the copy; [`Inner::remove_source_names`] removes
//!    P1..Pn from S ("unlinked-one" after the first) and fsyncs S's directories; the
//!    index and the file node now say D ("unlinked"), and the record is removed.
//!
//! **No exit leaves a record behind.** Steps 2–4 work on a [`Staged`] move: dropping it
//! before the commit completes (an error, an early return, a panic) removes the names it
//! made on D, the temporary and the record, under the namespace lock when the commit holds
//! it. The one exit that keeps its record is a commit that put the copy in place but could
//! not remove a source name (the source branch refused): the record is rewritten in its
//! *committed* phase, `status` counts it under `unfinished`, and the next mount's recovery
//! removes the stale source names after verifying them.
//!
//! A file is moved only while nobody has it open (its `mig` lock keeps opens and setattr
//! out), except when a write overflows: then every handle's descriptor is held exclusively
//! from before step 1 to the end (writers wait), the new descriptors are opened on the
//! copy before any source name is removed, and swapped in at the end.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_vfs::{FileKind, Ino, Result};
use log::{info, warn};
use parking_lot::RwLockWriteGuard;

use crate::branch::{Branch, DirFd};
use crate::fs::{Handle, Inner, err, ioerr, now};
use crate::ns::{Entry, Tree};
use crate::record::{Ident, MoveRecord, Phase};
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

fn fsync_dir(fd: &OwnedFd) -> std::io::Result<()> {
    let real = sys::openat(
        fd.as_fd(),
        OsStr::new("."),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )?;
    sys::fsync(real.as_fd(), false)
}

/// The path of `dir/name` relative to a branch root, as a record stores it.
fn rel_path(ns: &Tree, dir: Ino, name: &OsStr) -> Vec<u8> {
    let mut r = ns.rel(dir);
    if !r.is_empty() {
        r.push(b'/');
    }
    r.extend_from_slice(name.as_bytes());
    r
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

/// How a placement check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The rules keep the file where it is (or it is open, or gone).
    Stayed,
    /// Moved; the bytes copied.
    Moved(u64),
    /// The file changed while it was being copied (renamed, linked, written behind our
    /// back): the move was rolled back and may be tried again.
    Changed,
    /// The move failed and was rolled back (counted in `status`).
    Failed,
}

/// What a move copies, taken under the namespace read lock (step 1).
struct Source {
    branch: Arc<Branch>,
    names: Vec<(Ino, OsString)>,
    /// The names' paths relative to the branch roots, as the record stores them.
    rels: Vec<Vec<u8>>,
    st: sys::Stat,
    /// The directory of the first name (an O_PATH descriptor: it follows the directory
    /// through renames) and that name.
    dir: DirFd,
    name: OsString,
    body: Body,
}

enum Body {
    /// A regular file, opened when its identity was taken.
    Data(OwnedFd),
    /// A symlink's target.
    Link(Vec<u8>),
    /// A device, fifo or socket (mode and rdev are in the stat).
    Node,
}

impl Source {
    fn id(&self) -> BranchId {
        self.branch.id
    }

    fn ident(&self) -> Ident {
        Ident::of(&self.st)
    }

    fn key(&self) -> (u64, u64) {
        (self.st.st_dev, self.st.st_ino)
    }
}

/// A move under way on its target branch: the temporary copy, then the record, then the
/// names made from the copy. Until [`Staged::close`] it is undone when dropped, so that no
/// exit — an error, an early return, a panic — leaves a copy, a name or a record behind.
struct Staged<'a> {
    inner: &'a Inner,
    dst: Arc<Branch>,
    tmpdir: OwnedFd,
    moves: OwnedFd,
    seq: String,
    /// The temporary's identity once it is complete.
    copy: Option<Ident>,
    /// The record as written, once it is durable.
    record: Option<MoveRecord>,
    /// Names made on the target from the copy (directory, name), in order.
    placed: Vec<(DirFd, OsString)>,
    open: bool,
}

impl<'a> Staged<'a> {
    fn new(inner: &'a Inner, dst: Arc<Branch>) -> Result<Staged<'a>> {
        let tmpdir = dst.meta_dir(Some("tmp")).map_err(ioerr)?;
        let moves = dst.meta_dir(Some("moves")).map_err(ioerr)?;
        Ok(Staged {
            inner,
            dst,
            tmpdir,
            moves,
            seq: new_seq(),
            copy: None,
            record: None,
            placed: Vec::new(),
            open: true,
        })
    }

    fn tmpname(&self) -> &OsStr {
        OsStr::new(&self.seq)
    }

    /// Step 2: the complete, fsynced copy in `tmp/SEQ`. Returns the bytes copied.
    fn copy_from(&mut self, src: &Source) -> std::io::Result<u64> {
        let (tmpdir, tmp) = (&self.tmpdir, OsStr::new(&self.seq));
        let st = &src.st;
        let mut bytes = 0;
        match &src.body {
            Body::Data(from) => {
                let to = sys::openat(
                    tmpdir.as_fd(),
                    tmp,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                    0o600,
                )?;
                bytes = copy_data(from, &to)?;
                sys::fsync(to.as_fd(), false)?;
            }
            Body::Link(t) => sys::symlinkat(t, tmpdir.as_fd(), tmp)?,
            Body::Node => sys::mknodat(tmpdir.as_fd(), tmp, st.st_mode, st.st_rdev)?,
        }
        copy_xattrs(&src.dir, &src.name, tmpdir, tmp);
        sys::fchownat(tmpdir.as_fd(), tmp, Some(st.st_uid), Some(st.st_gid))?;
        if sys::kind_of(st.st_mode) != FileKind::Symlink {
            // After chown, which may clear setuid/setgid.
            sys::fchmodat(tmpdir.as_fd(), tmp, st.st_mode & 0o7777)?;
        }
        let at = sys::attr_from(st, 0);
        sys::utimensat(
            tmpdir.as_fd(),
            tmp,
            TimeSet::At(at.atime),
            TimeSet::At(at.mtime),
        )?;
        fsync_dir(tmpdir)?;
        self.copy = Some(Ident::of(&sys::fstatat(tmpdir.as_fd(), tmp)?));
        Ok(bytes)
    }

    /// Step 3: the record, durable before anything of the move is visible on the target.
    fn write_record(&mut self, src: &Source) -> std::io::Result<()> {
        let copy = self
            .copy
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let rec = MoveRecord {
            phase: Phase::Placing,
            src: src.branch.name.clone(),
            dst: self.dst.name.clone(),
            tmp: self.seq.clone(),
            ids: Some((src.ident(), copy)),
            paths: src.rels.clone(),
        };
        // Set first: a half-written record is removed by the roll-back too.
        self.record = Some(rec.clone());
        self.write_record_file(&rec)
    }

    fn write_record_file(&self, rec: &MoveRecord) -> std::io::Result<()> {
        let fd = sys::openat(
            self.moves.as_fd(),
            self.tmpname(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o600,
        )?;
        let mut f = std::fs::File::from(fd);
        f.write_all(&rec.encode())?;
        f.sync_all()?;
        fsync_dir(&self.moves)
    }

    /// Is this (directory, name) on the target our copy?
    fn holds_copy(&self, dir: &DirFd, name: &OsStr) -> bool {
        self.copy
            .is_some_and(|c| sys::fstatat(dir.as_fd(), name).is_ok_and(|st| c.is_object(&st)))
    }

    /// Undoes the move: the names made on the target (only where they still are the copy),
    /// the temporary, the record. The source was never touched before the commit, so this
    /// leaves the file exactly as it was.
    fn roll_back(&mut self) {
        if !self.open {
            return;
        }
        self.open = false;
        for (dir, name) in self.placed.iter().rev() {
            if self.holds_copy(dir, name) {
                let _ = sys::unlinkat(dir.as_fd(), name, false);
            }
        }
        for (dir, _) in &self.placed {
            let _ = fsync_dir(dir);
        }
        let _ = sys::unlinkat(self.tmpdir.as_fd(), self.tmpname(), false);
        if self.record.is_some() {
            let gone = sys::unlinkat(self.moves.as_fd(), self.tmpname(), false);
            let synced = fsync_dir(&self.moves);
            if let Err(e) = gone.and(synced) {
                // Recovery verifies identities, so a record left here is harmless, but it is
                // counted: a record must never outlive its move unnoticed.
                self.inner
                    .counters
                    .unfinished
                    .fetch_add(1, Ordering::Relaxed);
                warn!(
                    "migration rolled back, but its record {} on '{}' could not be removed: {e}",
                    self.seq, self.dst.name
                );
            }
        }
    }

    /// The commit ended. `complete`: every source name is gone, so the record goes (its
    /// directory is fsynced by [`Staged::sync`], outside the namespace lock). Otherwise the
    /// record is rewritten in its committed phase for recovery to finish the removals.
    fn close(&mut self, complete: bool) {
        self.open = false;
        if complete {
            let _ = sys::unlinkat(self.moves.as_fd(), self.tmpname(), false);
            return;
        }
        self.inner
            .counters
            .unfinished
            .fetch_add(1, Ordering::Relaxed);
        if let Some(rec) = &self.record {
            let rec = MoveRecord {
                phase: Phase::Committed,
                ..rec.clone()
            };
            if let Err(e) = self.write_record_file(&rec) {
                warn!("migration: marking record {} committed: {e}", self.seq);
            }
        }
    }

    fn sync(&self) {
        let _ = fsync_dir(&self.moves);
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        self.roll_back();
    }
}

/// Times of directory copies touched by a move, put back after it: a migration is not a
/// change of the union directory, so its mtime (the newest copy's) must not move.
struct DirTimes(Vec<(DirFd, sys::Stat)>);

impl DirTimes {
    fn restore(&self) {
        for (fd, st) in &self.0 {
            let a = sys::attr_from(st, 0);
            let _ = sys::utimensat(
                fd.as_fd(),
                OsStr::new("."),
                TimeSet::At(a.atime),
                TimeSet::At(a.mtime),
            );
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

    /// Step 1 (see the module comment). EBUSY: the file has links outside the union.
    fn gather(&self, ino: Ino) -> Result<Source> {
        let ns = self.ns.read();
        let (src, first) = self.file_loc(ino)?;
        let (d0, n0) = first.ok_or_else(|| err(libc::ENOENT))?;
        let (dir, st) = self.stat_entry(&ns, d0, &n0, src)?;
        let key = (st.st_dev, st.st_ino);
        let mut names: Vec<(Ino, OsString)> = self
            .nodes
            .lock()
            .files
            .get(&ino)
            .map(|n| n.names.clone())
            .unwrap_or_default();
        if (names.len() as u64) < st.st_nlink {
            names = self.all_names(&ns, src, key);
        }
        if (names.len() as u64) != st.st_nlink || names.is_empty() {
            // A link the union cannot see (outside it): moving would break it.
            warn!(
                "not moving a file with {} links of which {} are in the union",
                st.st_nlink,
                names.len()
            );
            return Err(err(libc::EBUSY));
        }
        // The first name must come first: the copy is renamed to it.
        if let Some(k) = names.iter().position(|(d, n)| *d == d0 && *n == n0) {
            names.swap(0, k);
        }
        let rels = names.iter().map(|(d, n)| rel_path(&ns, *d, n)).collect();
        let body = match sys::kind_of(st.st_mode) {
            FileKind::RegularFile => {
                let fd = sys::openat(dir.as_fd(), &n0, libc::O_RDONLY | libc::O_NOATIME, 0)
                    .or_else(|_| sys::openat(dir.as_fd(), &n0, libc::O_RDONLY, 0))
                    .map_err(ioerr)?;
                let now = sys::fstat(fd.as_fd()).map_err(ioerr)?;
                if (now.st_dev, now.st_ino) != key {
                    return Err(err(libc::EAGAIN));
                }
                Body::Data(fd)
            }
            FileKind::Symlink => Body::Link(sys::readlinkat(dir.as_fd(), &n0).map_err(ioerr)?),
            _ => Body::Node,
        };
        Ok(Source {
            branch: self.branch(src)?,
            names,
            rels,
            st,
            dir,
            name: n0,
            body,
        })
    }

    /// Moves file `ino` to branch `dst`, counting the outcome in `status`. The caller holds
    /// the file's `mig` lock; `handles` are its open handles (empty unless overflowing).
    /// Returns the bytes copied.
    pub(crate) fn move_file(
        &self,
        ino: Ino,
        dst: BranchId,
        handles: &[Arc<Handle>],
    ) -> Result<u64> {
        let r = self.try_move(ino, dst, handles);
        let c = &self.counters;
        match &r {
            Ok(Some(bytes)) => {
                c.migrations_done.fetch_add(1, Ordering::Relaxed);
                c.migrated_bytes.fetch_add(*bytes, Ordering::Relaxed);
            }
            Ok(None) => {}
            Err(e) if e.errno().0 == libc::EAGAIN => {
                c.migrations_abandoned.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                c.migrations_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        r.map(Option::unwrap_or_default)
    }

    /// The steps of the module comment. Ok(None): the file already is on `dst`.
    fn try_move(&self, ino: Ino, dst: BranchId, handles: &[Arc<Handle>]) -> Result<Option<u64>> {
        // Writers through any open handle wait until the move is over; taken before the
        // source's identity so that it cannot change under the copy.
        let mut guards: Vec<RwLockWriteGuard<'_, OwnedFd>> =
            handles.iter().map(|h| h.fd.write()).collect();
        let src = self.gather(ino)?;
        if src.id() == dst {
            return Ok(None);
        }
        self.failpoints.hit("gathered");
        let mut staged = Staged::new(self, self.branch(dst)?)?;
        let bytes = staged.copy_from(&src).map_err(ioerr)?;
        self.failpoints.hit("copied");
        staged.write_record(&src).map_err(ioerr)?;
        self.failpoints.hit("recorded");
        self.commit(ino, &src, &mut staged, handles, &mut guards)?;
        staged.sync();
        src.branch.space_changed();
        staged.dst.space_changed();
        Ok(Some(bytes))
    }

    /// Step 4, under the namespace write lock. Any error before the first source name is
    /// removed rolls the move back, still under the lock (so no operation sees a name of
    /// the copy on the target that the index does not know).
    fn commit(
        &self,
        ino: Ino,
        src: &Source,
        staged: &mut Staged<'_>,
        handles: &[Arc<Handle>],
        guards: &mut [RwLockWriteGuard<'_, OwnedFd>],
    ) -> Result<()> {
        let mut ns = self.ns.write();
        let dst = staged.dst.id;
        let placed = self.still_same(&ns, ino, src, dst).and_then(|()| {
            let times = self.dir_times(&mut ns, src, dst);
            let dfds = self.place_names(&mut ns, src, staged)?;
            let fds = reopen_handles(&dfds[0], &src.names[0].1, handles)?;
            Ok((times, dfds, fds))
        });
        let (times, dfds, fds) = match placed {
            Ok(x) => x,
            Err(e) => {
                staged.roll_back();
                return Err(e);
            }
        };
        self.failpoints.hit("linked");
        let complete = self.remove_source_names(&ns, src);
        times.restore();
        let nst = sys::fstatat(dfds[0].as_fd(), &src.names[0].1).map_err(ioerr);
        self.point_index_at(&mut ns, ino, src, dst, nst.as_ref().ok());
        for (g, fd) in guards.iter_mut().zip(fds) {
            **g = fd;
        }
        self.failpoints.hit("unlinked");
        staged.close(complete);
        drop(ns);
        if !complete {
            warn!(
                "moving {} to '{}': a source name on '{}' could not be removed; the record \
                 stays for the next mount's recovery",
                String::from_utf8_lossy(&src.rels[0]),
                staged.dst.name,
                src.branch.name
            );
        }
        Ok(())
    }

    /// Nothing changed since step 1: the file is still on the source with the same names
    /// at the same paths (a renamed directory changes them), the same object under every
    /// name with the same size and mtime and no other link, and both branches are active.
    /// EAGAIN otherwise.
    fn still_same(&self, ns: &Tree, ino: Ino, src: &Source, dst: BranchId) -> Result<()> {
        let on_src = self
            .nodes
            .lock()
            .files
            .get(&ino)
            .is_some_and(|n| n.branch == src.id());
        let active = src.branch.active() && self.branch(dst).is_ok_and(|b| b.active());
        let id = src.ident();
        let nlink = src.names.len() as u64;
        let same = src.names.iter().zip(&src.rels).all(|((d, n), rel)| {
            ns.dirs.get(d).and_then(|dd| dd.children.get(n)) == Some(&Entry::File(src.id()))
                && rel_path(ns, *d, n) == *rel
                && self
                    .stat_entry(ns, *d, n, src.id())
                    .is_ok_and(|(_, s)| id.is_unchanged(&s) && s.st_nlink == nlink)
        });
        if on_src && active && same {
            Ok(())
        } else {
            Err(err(libc::EAGAIN))
        }
    }

    /// The times of every directory copy the move touches (creating the target's copies).
    fn dir_times(&self, ns: &mut Tree, src: &Source, dst: BranchId) -> DirTimes {
        let mut saved = Vec::new();
        for (d, _) in &src.names {
            let copies = [
                self.ensure_dir(ns, *d, dst).ok(),
                src.branch.dir(&ns.rel(*d)).ok(),
            ];
            for fd in copies.into_iter().flatten() {
                if let Ok(st) = sys::fstat(fd.as_fd()) {
                    saved.push((fd, st));
                }
            }
        }
        DirTimes(saved)
    }

    /// Renames the temporary to the first name on the target, links the others, fsyncs the
    /// target's directories. Returns the target directories, in name order.
    fn place_names(
        &self,
        ns: &mut Tree,
        src: &Source,
        staged: &mut Staged<'_>,
    ) -> Result<Vec<DirFd>> {
        let dst = staged.dst.id;
        let mut dfds: Vec<DirFd> = Vec::new();
        for (k, (d, n)) in src.names.iter().enumerate() {
            let nfd = self.ensure_dir(ns, *d, dst)?;
            if k == 0 {
                sys::renameat2(
                    staged.tmpdir.as_fd(),
                    staged.tmpname(),
                    nfd.as_fd(),
                    n,
                    libc::RENAME_NOREPLACE,
                )
                .map_err(ioerr)?;
            } else {
                sys::linkat(dfds[0].as_fd(), &src.names[0].1, nfd.as_fd(), n).map_err(ioerr)?;
            }
            staged.placed.push((nfd.clone(), n.clone()));
            dfds.push(nfd);
            if k == 0 {
                self.failpoints.hit("renamed");
            }
        }
        for fd in &dfds {
            fsync_dir(fd).map_err(ioerr)?;
        }
        Ok(dfds)
    }

    /// Removes the names from the source (each only if it still is the source object) and
    /// fsyncs its directories. False if any name stays.
    fn remove_source_names(&self, ns: &Tree, src: &Source) -> bool {
        let mut complete = true;
        let mut sfds = Vec::new();
        for (k, (d, n)) in src.names.iter().enumerate() {
            let r = src.branch.dir(&ns.rel(*d)).and_then(|fd| {
                let st = sys::fstatat(fd.as_fd(), n)?;
                if (st.st_dev, st.st_ino) != src.key() {
                    return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
                }
                sys::unlinkat(fd.as_fd(), n, false).map(|()| fd)
            });
            match r {
                Ok(fd) => sfds.push(fd),
                Err(e) => {
                    complete = false;
                    warn!(
                        "migration: removing the source name {n:?} on '{}': {e}",
                        src.branch.name
                    );
                }
            }
            if k == 0 {
                self.failpoints.hit("unlinked-one");
            }
        }
        for fd in &sfds {
            if let Err(e) = fsync_dir(fd) {
                complete = false;
                warn!("migration: fsync of a source directory: {e}");
            }
        }
        complete
    }

    /// The index and the file node now say `dst` (same inode number of ours).
    fn point_index_at(
        &self,
        ns: &mut Tree,
        ino: Ino,
        src: &Source,
        dst: BranchId,
        new: Option<&sys::Stat>,
    ) {
        for (d, n) in &src.names {
            if let Some(dd) = ns.dirs.get_mut(d) {
                dd.children.insert(n.clone(), Entry::File(dst));
            }
        }
        let mut nodes = self.nodes.lock();
        nodes.keymap.remove(&src.key());
        if let Some(st) = new {
            nodes.keymap.insert((st.st_dev, st.st_ino), ino);
        }
        if let Some(n) = nodes.files.get_mut(&ino) {
            n.branch = dst;
            if let Some(st) = new {
                n.key = (st.st_dev, st.st_ino);
            }
            n.names = src.names.clone();
        }
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
    /// branch.
    pub(crate) fn check_and_move(&self, ino: Ino) -> Outcome {
        let Some(mig) = self.nodes.lock().files.get(&ino).map(|n| n.mig.clone()) else {
            return Outcome::Stayed;
        };
        let r = {
            let _g = mig.lock();
            self.check_and_move_locked(ino)
        };
        drop(mig);
        let mut nodes = self.nodes.lock();
        self.maybe_drop(&mut nodes, ino);
        r
    }

    fn check_and_move_locked(&self, ino: Ino) -> Outcome {
        if self.nodes.lock().files.get(&ino).is_none_or(|n| n.open > 0) {
            return Outcome::Stayed;
        }
        let Ok((b, path, st)) = self.facts_now(ino) else {
            return Outcome::Stayed;
        };
        let a = sys::attr_from(&st, ino);
        let d = self.decide(&Facts::of(&path, &a, b), false);
        let Some(t) = self.target_for(&d, Some(b), a.size) else {
            return Outcome::Stayed;
        };
        let shown = String::from_utf8_lossy(&path);
        match self.move_file(ino, t, &[]) {
            Ok(n) => {
                *self.hits.lock().entry(d.rule).or_insert(0) += 1;
                Outcome::Moved(n)
            }
            Err(e) if matches!(e.errno().0, libc::EAGAIN | libc::ENOENT) => {
                // The file changed under the copy (renamed, linked, removed): rolled back,
                // not a failure; the worker looks again.
                log::debug!("move of {shown} abandoned: {e}");
                Outcome::Changed
            }
            Err(e) => {
                warn!("moving {shown} to branch {t}: {e}");
                Outcome::Failed
            }
        }
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
}

/// Descriptors on the copy for every open handle, opened before any source name is removed
/// so a failure still rolls back with the source whole.
fn reopen_handles(dir: &DirFd, name: &OsStr, handles: &[Arc<Handle>]) -> Result<Vec<OwnedFd>> {
    handles
        .iter()
        .map(|h| {
            let flags = h.flags & !(libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL);
            sys::openat(dir.as_fd(), name, flags, 0).map_err(ioerr)
        })
        .collect()
}
