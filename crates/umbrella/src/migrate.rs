//! Moving a file between branches, atomically from the user's view.
//!
//! The protocol, for a file with names P1..Pn on branch S moving to branch D, one function
//! per step (the failpoint reached after each is in quotes, see `failpoint`):
//! 1. [`Inner::gather`]: the names, their paths (from the index), the
//!    source's stat (its *identity*: device, inode, size, mtime) and an open descriptor
//!    of it, so a later rename of its directory cannot make the copy read something else
//!    ("gathered");
//! 2. [`Staged::copy_from`]: data, xattrs, owner, mode and times go to
//!    `D/.umbrella/tmp/SEQ`, which is fsynced ("copied");
//! 3. [`Staged::write_record`]: the move record (`record`: both branches, the temporary,
//!    every name, the source's and the copy's identities) is written and fsynced on D
//!    ("recorded"); from here on a crash is resolved by recovery (`recover`);
//! 4. [`Inner::commit`], under the directory locks of every name's directory (the index
//!    lock only to check and to update): [`Inner::still_same`] checks that nothing changed
//!    since step 1 (the names, their paths, the object under each, its size and mtime,
//!    both branches active) — otherwise the move is rolled back and the caller may try
//!    again; [`Inner::place_names`] renames the temporary to P1 on D (no-replace;
//!    "renamed"), links P2..Pn, fsyncs D's directories ("linked"); open handles are
//!    re-opened on the copy; the index and the file node now say D; then
//!    [`Inner::remove_source_names`] removes P1..Pn from S ("unlinked-one" after the
//!    first) and fsyncs S's directories ("unlinked"), and the record is removed.
//!
//! Every host call has its branch's deadline (`exec`): reads on the source's branch,
//! writes on the target's.
//!
//! **No exit leaves a record behind.** Steps 2–4 work on a [`Staged`] move: dropping it
//! before the commit completes (an error, an early return, a panic) removes the names it
//! made on D, the temporary and the record, under the directory locks when the commit
//! holds them. The one exit that keeps its record is a commit that put the copy in place but could
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

use cairn_vfs::{FileKind, Ino, Result, fileattr};
use log::{info, warn};
use parking_lot::RwLockWriteGuard;

use crate::branch::{Branch, DirFd};
use crate::fs::{Handle, HostFd, Inner, err, ioerr, now};
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
    let real = sys::reopen_dir(fd.as_fd())?;
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

/// The data copy when a branch is isolated: pieces read on the source's branch and
/// written on the target's, each call with its own deadline.
fn copy_pieces(
    sb: &Branch,
    from: &Arc<OwnedFd>,
    db: &Branch,
    to: &Arc<OwnedFd>,
) -> std::io::Result<u64> {
    let mut off = 0u64;
    loop {
        let f = from.clone();
        let buf = sb.run(move || {
            let mut v = vec![0u8; PIECE];
            let mut n = 0;
            while n < v.len() {
                match sys::pread(f.as_fd(), &mut v[n..], off + n as u64)? {
                    0 => break,
                    k => n += k,
                }
            }
            v.truncate(n);
            Ok(v)
        })?;
        if buf.is_empty() {
            return Ok(off);
        }
        let len = buf.len() as u64;
        let t = to.clone();
        db.run(move || {
            let mut w = 0;
            while w < buf.len() {
                w += sys::pwrite(t.as_fd(), &buf[w..], off + w as u64)?;
            }
            Ok(())
        })?;
        off += len;
    }
}

/// The piece of file data one host call of a migration moves.
const PIECE: usize = 4 << 20;

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

/// What a move copies (step 1).
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
    Data(Arc<OwnedFd>),
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
    tmpdir: Arc<OwnedFd>,
    moves: Arc<OwnedFd>,
    seq: String,
    /// The temporary's identity once it is complete.
    copy: Option<Ident>,
    /// The record as written, once it is durable.
    record: Option<MoveRecord>,
    /// Names made on the target from the copy (directory, name), in order.
    placed: Vec<(DirFd, OsString)>,
    /// The source's extended attributes and inode flags, once copied.
    meta: crate::xattr::Meta,
    open: bool,
}

impl<'a> Staged<'a> {
    fn new(inner: &'a Inner, dst: Arc<Branch>) -> Result<Staged<'a>> {
        let tmpdir = Arc::new(dst.meta_dir(Some("tmp")).map_err(ioerr)?);
        let moves = Arc::new(dst.meta_dir(Some("moves")).map_err(ioerr)?);
        Ok(Staged {
            inner,
            dst,
            tmpdir,
            moves,
            seq: new_seq(),
            copy: None,
            record: None,
            placed: Vec::new(),
            meta: Default::default(),
            open: true,
        })
    }

    fn tmpname(&self) -> &OsStr {
        OsStr::new(&self.seq)
    }

    /// Step 2: the complete, fsynced copy in `tmp/SEQ`. Returns the bytes copied. Every
    /// host call has its branch's deadline: reads on the source's, writes on the target's
    /// (data in pieces of [`PIECE`] bytes, so a large file is not one call).
    fn copy_from(&mut self, src: &Source) -> std::io::Result<u64> {
        let (dst, sb) = (self.dst.clone(), src.branch.clone());
        let (tmpdir, tmp) = (self.tmpdir.clone(), OsString::from(&self.seq));
        let st = src.st;
        let mut bytes = 0;
        match &src.body {
            Body::Data(from) => {
                let (td, tn) = (tmpdir.clone(), tmp.clone());
                let to = Arc::new(dst.run(move || {
                    sys::openat(
                        td.as_fd(),
                        &tn,
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                        0o600,
                    )
                })?);
                bytes = if !dst.exec.isolated() && !sb.exec.isolated() {
                    copy_data(from, &to)?
                } else {
                    copy_pieces(&sb, from, &dst, &to)?
                };
                let to2 = to.clone();
                dst.run(move || sys::fsync(to2.as_fd(), false))?;
            }
            Body::Link(t) => {
                let (td, tn, t) = (tmpdir.clone(), tmp.clone(), t.clone());
                dst.run(move || sys::symlinkat(&t, td.as_fd(), &tn))?
            }
            Body::Node => {
                let (td, tn) = (tmpdir.clone(), tmp.clone());
                dst.run(move || sys::mknodat(td.as_fd(), &tn, st.st_mode, st.st_rdev))?
            }
        }
        // Owner, mode, extended attributes (ACLs among them), times and inode flags: a
        // copy that cannot take one fails the move (it would grant what the source does
        // not, or stop inheriting), which then leaves the file where it is.
        let (sdir, sname) = (src.dir.clone(), src.name.clone());
        let meta = sb.run(move || crate::xattr::Meta::read(&sdir, Some(&sname)))?;
        self.meta = meta.clone();
        let copy = dst.run(move || {
            sys::fchownat(tmpdir.as_fd(), &tmp, Some(st.st_uid), Some(st.st_gid))?;
            if sys::kind_of(st.st_mode) != FileKind::Symlink {
                // After chown, which may clear setuid/setgid.
                sys::fchmodat(tmpdir.as_fd(), &tmp, st.st_mode & 0o7777)?;
            }
            // After chown, which drops security.capability; an access ACL sets the mode's
            // group bits to its mask, which chmod above already gave them.
            meta.apply(&tmpdir, &tmp)?;
            let at = sys::attr_from(&st, 0);
            sys::utimensat(
                tmpdir.as_fd(),
                &tmp,
                TimeSet::At(at.atime),
                TimeSet::At(at.mtime),
            )?;
            // The flags that forbid a rename or a link wait until the copy's names are in
            // place (`Inner::commit`).
            crate::xattr::set_flags_at(&tmpdir, Some(&tmp), meta.flags & !fileattr::RESTRICTING)?;
            fsync_dir(&tmpdir)?;
            sys::fstatat(tmpdir.as_fd(), &tmp)
        })?;
        self.copy = Some(Ident::of(&copy));
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
        let (moves, name, data) = (
            self.moves.clone(),
            self.tmpname().to_os_string(),
            rec.encode(),
        );
        self.dst.run(move || {
            let fd = sys::openat(
                moves.as_fd(),
                &name,
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                0o600,
            )?;
            let mut f = std::fs::File::from(fd);
            f.write_all(&data)?;
            f.sync_all()?;
            fsync_dir(&moves)
        })
    }

    /// Is this (directory, name) on the target our copy?
    fn holds_copy(&self, dir: &DirFd, name: &OsStr) -> bool {
        let Some(c) = self.copy else { return false };
        let (dir, name) = (dir.clone(), name.to_os_string());
        self.dst
            .run(move || sys::fstatat(dir.as_fd(), &name))
            .is_ok_and(|st| c.is_object(&st))
    }

    /// A host call on the target with its deadline, for the roll-back and the commit.
    fn on_dst<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        self.dst.run(f)
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
                let (d, n) = (dir.clone(), name.clone());
                let _ = self.on_dst(move || sys::unlinkat(d.as_fd(), &n, false));
            }
        }
        for (dir, _) in &self.placed {
            let d = dir.clone();
            let _ = self.on_dst(move || fsync_dir(&d));
        }
        let (t, n) = (self.tmpdir.clone(), self.tmpname().to_os_string());
        let _ = self.on_dst(move || sys::unlinkat(t.as_fd(), &n, false));
        if self.record.is_some() {
            let (m, n) = (self.moves.clone(), self.tmpname().to_os_string());
            let r = self.on_dst(move || {
                let gone = sys::unlinkat(m.as_fd(), &n, false);
                let synced = fsync_dir(&m);
                gone.and(synced)
            });
            if let Err(e) = r {
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
    /// directory is fsynced by [`Staged::sync`], outside the directory locks). Otherwise the
    /// record is rewritten in its committed phase for recovery to finish the removals.
    fn close(&mut self, complete: bool) {
        self.open = false;
        if complete {
            let (m, n) = (self.moves.clone(), self.tmpname().to_os_string());
            let _ = self.on_dst(move || sys::unlinkat(m.as_fd(), &n, false));
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
        let m = self.moves.clone();
        let _ = self.on_dst(move || fsync_dir(&m));
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        self.roll_back();
    }
}

/// Times of directory copies touched by a move, put back after it: a migration is not a
/// change of the union directory, so its mtime (the newest copy's) must not move.
struct DirTimes(Vec<(BranchId, DirFd, sys::Stat)>);

impl DirTimes {
    fn restore(&self, a: &Branch, b: &Branch) {
        for (id, fd, st) in &self.0 {
            let br = if *id == a.id { a } else { b };
            let (fd, at) = (fd.clone(), sys::attr_from(st, 0));
            let _ = br.run(move || {
                sys::utimensat(
                    fd.as_fd(),
                    OsStr::new("."),
                    TimeSet::At(at.atime),
                    TimeSet::At(at.mtime),
                )
            });
        }
    }
}

impl Inner {
    /// Every (dir, name) of the index naming host object `key` on branch `b`.
    fn all_names(&self, b: BranchId, key: (u64, u64)) -> Vec<(Ino, OsString)> {
        let files: Vec<(Ino, OsString, Vec<u8>)> = {
            let ns = self.ns.read();
            ns.files()
                .into_iter()
                .filter(|(_, _, fb)| *fb == b)
                .map(|(d, n, _)| (d, n, ns.rel(d)))
                .collect()
        };
        let mut out = Vec::new();
        for (d, n, rel) in files {
            if let Ok((_, st)) = self.stat_in(b, &rel, &n)
                && (st.st_dev, st.st_ino) == key
            {
                out.push((d, n));
            }
        }
        out
    }

    /// Step 1 (see the module comment). EBUSY: the file has links outside the union.
    fn gather(&self, ino: Ino) -> Result<Source> {
        let (src, first) = self.file_loc(ino)?;
        let (d0, n0) = first.ok_or_else(|| err(libc::ENOENT))?;
        let (dir, st) = self.stat_entry(d0, &n0, src)?;
        let key = (st.st_dev, st.st_ino);
        let mut names: Vec<(Ino, OsString)> = self
            .nodes
            .lock()
            .files
            .get(&ino)
            .map(|n| n.names.clone())
            .unwrap_or_default();
        if (names.len() as u64) < st.st_nlink {
            names = self.all_names(src, key);
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
        let rels = {
            let ns = self.ns.read();
            names.iter().map(|(d, n)| rel_path(&ns, *d, n)).collect()
        };
        let branch = self.branch(src)?;
        let (dir2, name2, kind) = (dir.clone(), n0.clone(), sys::kind_of(st.st_mode));
        let body = branch
            .run(move || -> std::io::Result<Option<Body>> {
                let (dir, n0) = (dir2, name2);
                Ok(Some(match kind {
                    FileKind::RegularFile => {
                        let fd = sys::openat(dir.as_fd(), &n0, libc::O_RDONLY | libc::O_NOATIME, 0)
                            .or_else(|_| sys::openat(dir.as_fd(), &n0, libc::O_RDONLY, 0))?;
                        let now = sys::fstat(fd.as_fd())?;
                        if (now.st_dev, now.st_ino) != key {
                            return Ok(None);
                        }
                        Body::Data(Arc::new(fd))
                    }
                    FileKind::Symlink => Body::Link(sys::readlinkat(dir.as_fd(), &n0)?),
                    _ => Body::Node,
                }))
            })
            .map_err(ioerr)?
            .ok_or_else(|| err(libc::EAGAIN))?;
        Ok(Source {
            branch,
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
        let c = &self.counters;
        let r = {
            let _under_way = self.moves.begin();
            self.try_move(ino, dst, handles)
        };
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
        let mut guards: Vec<RwLockWriteGuard<'_, HostFd>> =
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

    /// Step 4, under `shape` (shared) and the directory locks of every name's directory,
    /// so no change of those names runs in between; the index lock is taken only to check
    /// and to point the names at the copy. Any error before the index says the target
    /// rolls the move back, still under the directory locks (so no operation sees a name
    /// of the copy on the target that the index does not know). The index points at the
    /// copy before the source names go: a lookup in between finds the copy.
    fn commit(
        &self,
        ino: Ino,
        src: &Source,
        staged: &mut Staged<'_>,
        handles: &[Arc<Handle>],
        guards: &mut [RwLockWriteGuard<'_, HostFd>],
    ) -> Result<()> {
        let _shape = self.shape.read_recursive();
        let dirs: Vec<Ino> = src.names.iter().map(|(d, _)| *d).collect();
        let _dl = self.lock_dirs(&dirs);
        let dst = staged.dst.id;
        let placed = self.still_same(ino, src, dst).and_then(|()| {
            let times = self.dir_times(src, dst);
            let dfds = self.place_names(src, staged)?;
            let fds = reopen_handles(&staged.dst, &dfds[0], &src.names[0].1, handles)?;
            // Last, so that a roll-back still finds a copy it can unlink: immutable and
            // append-only, which forbid the rename and the links above.
            if staged.meta.restricting() != 0 {
                let (d, n, m) = (dfds[0].clone(), src.names[0].1.clone(), staged.meta.clone());
                staged
                    .on_dst(move || m.apply_flags(&d, &n))
                    .map_err(ioerr)?;
            }
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
        let (d0, n0) = (dfds[0].clone(), src.names[0].1.clone());
        let nst = staged.on_dst(move || sys::fstatat(d0.as_fd(), &n0)).ok();
        self.point_index_at(ino, src, dst, nst.as_ref());
        for (g, fd) in guards.iter_mut().zip(fds) {
            **g = HostFd {
                fd: Arc::new(fd),
                branch: staged.dst.clone(),
            };
        }
        // The source keeps its flags until now; without its restricting ones it can be
        // unlinked (a failure leaves the names, and the record, for recovery, which hands
        // the flags over the same way).
        let restricting = staged.meta.restricting();
        if restricting != 0 {
            let (d, n, f) = (src.dir.clone(), src.name.clone(), staged.meta.flags);
            if let Err(e) = src
                .branch
                .run(move || crate::xattr::set_flags_at(&d, Some(&n), f & !fileattr::RESTRICTING))
            {
                warn!("migration: clearing the source's inode flags: {e}");
            }
        }
        let complete = self.remove_source_names(src);
        times.restore(&src.branch, &staged.dst);
        self.failpoints.hit("unlinked");
        staged.close(complete);
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
    fn still_same(&self, ino: Ino, src: &Source, dst: BranchId) -> Result<()> {
        let on_src = self
            .nodes
            .lock()
            .files
            .get(&ino)
            .is_some_and(|n| n.branch == src.id());
        let active = src.branch.active() && self.branch(dst).is_ok_and(|b| b.active());
        let in_index = {
            let ns = self.ns.read();
            src.names.iter().zip(&src.rels).all(|((d, n), rel)| {
                ns.dirs.get(d).and_then(|dd| dd.children.get(n)) == Some(&Entry::File(src.id()))
                    && rel_path(&ns, *d, n) == *rel
            })
        };
        let id = src.ident();
        let nlink = src.names.len() as u64;
        let same = in_index
            && src.names.iter().all(|(d, n)| {
                self.stat_entry(*d, n, src.id())
                    .is_ok_and(|(_, s)| id.is_unchanged(&s) && s.st_nlink == nlink)
            });
        if on_src && active && same {
            Ok(())
        } else {
            Err(err(libc::EAGAIN))
        }
    }

    /// The times of every directory copy the move touches (creating the target's copies).
    fn dir_times(&self, src: &Source, dst: BranchId) -> DirTimes {
        let mut saved = Vec::new();
        for (d, _) in &src.names {
            let copies = [
                (dst, self.ensure_dir(*d, dst).ok()),
                (src.id(), src.branch.dir(&self.rel(*d)).ok()),
            ];
            for (b, fd) in copies {
                let (Some(fd), Ok(br)) = (fd, self.branch(b)) else {
                    continue;
                };
                let f = fd.clone();
                if let Ok(st) = br.run(move || sys::fstat(f.as_fd())) {
                    saved.push((b, fd, st));
                }
            }
        }
        DirTimes(saved)
    }

    /// Renames the temporary to the first name on the target, links the others, fsyncs the
    /// target's directories. Returns the target directories, in name order.
    fn place_names(&self, src: &Source, staged: &mut Staged<'_>) -> Result<Vec<DirFd>> {
        let dst = staged.dst.id;
        let mut dfds: Vec<DirFd> = Vec::new();
        for (k, (d, n)) in src.names.iter().enumerate() {
            let nfd = self.ensure_dir(*d, dst)?;
            let (nf, nn) = (nfd.clone(), n.clone());
            if k == 0 {
                let (t, tn) = (staged.tmpdir.clone(), staged.tmpname().to_os_string());
                staged
                    .on_dst(move || sys::rename_noreplace(t.as_fd(), &tn, nf.as_fd(), &nn))
                    .map_err(ioerr)?;
            } else {
                let (f0, n0) = (dfds[0].clone(), src.names[0].1.clone());
                staged
                    .on_dst(move || sys::linkat(f0.as_fd(), &n0, nf.as_fd(), &nn))
                    .map_err(ioerr)?;
            }
            staged.placed.push((nfd.clone(), n.clone()));
            dfds.push(nfd);
            if k == 0 {
                self.failpoints.hit("renamed");
            }
        }
        for fd in &dfds {
            let f = fd.clone();
            staged.on_dst(move || fsync_dir(&f)).map_err(ioerr)?;
        }
        Ok(dfds)
    }

    /// Removes the names from the source (each only if it still is the source object) and
    /// fsyncs its directories. False if any name stays.
    fn remove_source_names(&self, src: &Source) -> bool {
        let mut complete = true;
        let mut sfds = Vec::new();
        for (k, (d, n)) in src.names.iter().enumerate() {
            let (bb, rel, nn, key) = (src.branch.clone(), self.rel(*d), n.clone(), src.key());
            let r = src.branch.run(move || {
                let fd = bb.dir_here(&rel)?;
                let st = sys::fstatat(fd.as_fd(), &nn)?;
                if (st.st_dev, st.st_ino) != key {
                    return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
                }
                sys::unlinkat(fd.as_fd(), &nn, false).map(|()| fd)
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
        for fd in sfds {
            if let Err(e) = src.branch.run(move || fsync_dir(&fd)) {
                complete = false;
                warn!("migration: fsync of a source directory: {e}");
            }
        }
        complete
    }

    /// The index and the file node now say `dst` (same inode number of ours); a mark
    /// "placed away from `dst`" is done with.
    fn point_index_at(&self, ino: Ino, src: &Source, dst: BranchId, new: Option<&sys::Stat>) {
        {
            let mut ns = self.ns.write();
            for (d, n) in &src.names {
                if let Some(dd) = ns.dirs.get_mut(d) {
                    dd.children.insert(n.clone(), Entry::File(dst));
                }
                let k = (*d, n.clone());
                if ns.away.get(&k) == Some(&dst) {
                    ns.away.remove(&k);
                }
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
        let (b, first) = self.file_loc(ino)?;
        let (d, n) = first.ok_or_else(|| err(libc::ENOENT))?;
        let (_, st) = self.stat_entry(d, &n, b)?;
        let path = self.ns.read().union_path(d, &n);
        Ok((b, path, st))
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
        let facts = Facts::of(&path, &a, b);
        let d = self.decide(&facts, false);
        // A file whose rules want a branch that is down now stays, marked to go back when
        // it returns (`disconnected`); one whose wanted branch is here needs no mark.
        // A mark is dropped only when the rules want nothing done (a successful move to the
        // wanted branch drops it too).
        let away = self.wanted_down(&facts).filter(|&w| w != b);
        let target = self.target_for(&d, Some(b), a.size);
        if let Ok((_, Some((dir, name)))) = self.file_loc(ino) {
            let mut ns = self.ns.write();
            match away {
                Some(w) => ns.mark_away(dir, &name, w),
                None if target.is_none() => {
                    ns.away.remove(&(dir, name));
                }
                None => {}
            }
        }
        let Some(t) = target else {
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

    /// A write or fallocate found the file's branch full (or, `here` given, may find it so):
    /// make room for it. `need` is the file's size after the call, what a move must find
    /// free on its target; `here` is what the call still needs on the file's own branch
    /// (None: do not stay, a retry there already failed).
    ///
    /// Every candidate's cached space reading is forgotten first: the room was read up to
    /// `SPACE_TTL` ago, and a concurrent file that just moved away or shrank makes a stale
    /// reading miss a branch that has room now. If the file's own branch has room for
    /// `here` now — the fill was transient (a concurrent fallocate holds pages for a moment,
    /// or a concurrent file has just moved away) — the file stays and the caller retries
    /// there. Otherwise it moves to the first of its rule's branches, earlier or later in
    /// the order, with room for `need`. Err(ENOSPC): no branch has room at this moment, or
    /// the target filled during the copy (rolled back, the file whole where it was); the
    /// caller looks again a bounded number of times (`Inner::overflowing`).
    pub(crate) fn overflow(&self, ino: Ino, need: u64, here: Option<u64>) -> Result<Room> {
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
        let a = sys::attr_from(&st, ino);
        let f = Facts {
            size: need,
            ..Facts::of(&path, &a, b)
        };
        let d = self.decide(&f, false);
        for &c in d.candidates().iter().chain([&b]) {
            if let Ok(br) = self.branch(c) {
                br.space_changed();
            }
        }
        if here.is_some_and(|n| self.has_room(b, n)) {
            return Ok(Room::Here);
        }
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
        Ok(Room::Moved)
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

/// Where [`Inner::overflow`] found room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// On the file's own branch (the fill was transient): retry there.
    Here,
    /// The file moved to another branch.
    Moved,
}

/// Descriptors on the copy for every open handle, opened before any source name is removed
/// so a failure still rolls back with the source whole.
fn reopen_handles(
    dst: &Branch,
    dir: &DirFd,
    name: &OsStr,
    handles: &[Arc<Handle>],
) -> Result<Vec<OwnedFd>> {
    handles
        .iter()
        .map(|h| {
            let flags = h.flags & !(libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL);
            let (d, n) = (dir.clone(), name.to_os_string());
            dst.run(move || sys::openat(d.as_fd(), &n, flags, 0))
                .map_err(ioerr)
        })
        .collect()
}
