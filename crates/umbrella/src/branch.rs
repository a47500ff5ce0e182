//! One branch: a host directory the layer places files in.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use log::warn;

use parking_lot::{Mutex, RwLock};

use crate::exec::{CallError, Exec};
use crate::rules::BranchId;
use crate::sys;

/// The hidden metadata directory at the root of every branch: the index (on the index
/// branch), in-flight migration records and temporary copies. Never visible in the mount.
pub const META: &str = ".umbrella";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Active,
    /// A host call or a probe missed the branch's deadline: the server stopped answering
    /// (or answers slower than `branch_timeout`). Treated as failed — its rules inactive,
    /// its files hidden (`and`) or EIO (`or`), merged operations leave it out (`and`) or
    /// fail (`or`) — and its calls answer at once instead of queueing behind the stuck
    /// ones. Active again when a probe answers in time.
    Stalled,
    /// Answering, but not as the branch: its directory vanished or was replaced, the
    /// transport is gone (ENOTCONN: a FUSE server died), a probe failed. Active again when a
    /// probe (which re-opens the directory by path) succeeds.
    Failed,
    /// Taken out with `branch remove`: not part of the union until added again.
    Removed,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Stalled => "stalled",
            State::Failed => "failed",
            State::Removed => "removed",
        }
    }

    fn code(self) -> u8 {
        match self {
            State::Active => 0,
            State::Stalled => 1,
            State::Failed => 2,
            State::Removed => 3,
        }
    }

    fn of(code: u8) -> State {
        match code {
            0 => State::Active,
            1 => State::Stalled,
            2 => State::Failed,
            _ => State::Removed,
        }
    }

    /// Not answering as a branch (stalled or failed): gone for routing, back by itself.
    pub fn down(self) -> bool {
        matches!(self, State::Stalled | State::Failed)
    }
}

/// Why a branch whose file system lost its server is failed: the one reason, whether a call
/// or a probe found it.
const LOST_SERVER: &str = "ENOTCONN: the branch's file system lost its server";

/// Did a host call fail because the branch's file system lost its server: ENOTCONN, or
/// ECONNABORTED (a FUSE connection aborted under the call)?
fn lost_server(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED))
}

/// A failed probe step's reason: [`LOST_SERVER`] when the server is gone (as a call's
/// failure says it), else the step and the error.
fn probe_why(step: &str, e: io::Error) -> String {
    if lost_server(&e) {
        LOST_SERVER.into()
    } else {
        format!("{step}: {e}")
    }
}

/// Why a branch is in its state, and since when (`status`).
#[derive(Clone, Debug)]
pub struct Health {
    pub reason: String,
    pub since: SystemTime,
}

/// Errors a branch's host calls answered, by kind (`status`): what distinguishes a dead
/// server (ENOTCONN), a server that lost our handles (ESTALE), a failing device (EIO) and
/// one that stopped answering (timeouts).
#[derive(Default)]
pub struct Errors {
    pub timeouts: AtomicU64,
    pub unavailable: AtomicU64,
    pub enotconn: AtomicU64,
    pub estale: AtomicU64,
    pub eio: AtomicU64,
}

pub struct Branch {
    pub id: BranchId,
    pub name: String,
    pub path: RwLock<PathBuf>,
    /// The root descriptor every path is resolved from. Replaced when the branch comes back
    /// after a failure or is re-added.
    root: RwLock<Arc<OwnedFd>>,
    dev: AtomicU64,
    state: AtomicU8,
    health: Mutex<Health>,
    pub errors: Errors,
    /// Host calls with deadlines (see `exec`).
    pub exec: Exec,
    /// Set when a call that changes the branch was abandoned at its deadline, or the
    /// branch was down while the union changed: its part of the index is re-read from it
    /// when it is back (`resync`).
    pub needs_resync: AtomicBool,
    /// A probe is on a worker now (at most one per branch: a stuck probe is not repeated).
    probing: Arc<AtomicBool>,
    /// The mount's branch epoch (`fs::Inner::epoch`), bumped at every change of state.
    epoch: Arc<AtomicU64>,
    /// (when, free bytes, total bytes): statvfs is a syscall per placement otherwise.
    space: Mutex<Option<(Instant, u64, u64)>>,
    /// Whether the host file system keeps POSIX ACLs ([`ACLS_UNKNOWN`], `_YES`, `_NO`): asked
    /// at open and by every probe.
    acls: Arc<AtomicU8>,
    dirs: Mutex<HashMap<Vec<u8>, DirFd>>,
}

const ACLS_UNKNOWN: u8 = 0;
const ACLS_YES: u8 = 1;
const ACLS_NO: u8 = 2;

/// Does the file system of `root` keep POSIX ACLs? Reading the access ACL of the root
/// answers ENODATA (or the ACL) where it does and EOPNOTSUPP where it does not; None:
/// it did not say.
fn acl_support(root: &OwnedFd) -> Option<bool> {
    let name = OsStr::from_bytes(cairn_vfs::acl::ACCESS_XATTR);
    match sys::getxattr(root.as_fd(), None, name) {
        Ok(_) => Some(true),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENODATA) => Some(true),
            Some(libc::EOPNOTSUPP) => Some(false),
            _ => None,
        },
    }
}

fn acls_code(a: Option<bool>) -> u8 {
    match a {
        None => ACLS_UNKNOWN,
        Some(true) => ACLS_YES,
        Some(false) => ACLS_NO,
    }
}

/// A shared directory descriptor.
pub type DirFd = Arc<OwnedFd>;

/// How long a free-space reading is trusted for placement. A stale reading only costs an
/// ENOSPC on write, which overflow then handles.
const SPACE_TTL: Duration = Duration::from_millis(200);

/// The per-branch part of the configuration that the layer applies.
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    pub timeout: Duration,
    /// None: decided from the host file system's type (`exec::is_local_fs`).
    pub isolate: Option<bool>,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            timeout: crate::exec::DEFAULT_TIMEOUT,
            isolate: None,
        }
    }
}

impl Branch {
    /// Opens the branch's root. The open itself runs on a worker with the deadline: a
    /// branch whose server does not answer at mount starts `stalled` instead of hanging
    /// the mount. `answered`: the path answered when the configuration was loaded; when it
    /// did not, the branch starts stalled without another wait.
    pub fn open(
        id: BranchId,
        name: &str,
        path: PathBuf,
        tune: Tuning,
        epoch: Arc<AtomicU64>,
        answered: bool,
    ) -> io::Result<Branch> {
        let exec = Exec::new(name, true, tune.timeout);
        let p = path.clone();
        let opened = if answered {
            exec.probe(
                move || -> io::Result<(OwnedFd, sys::Stat, i64, Option<bool>)> {
                    let root = sys::open_root(&p)?;
                    let st = sys::fstat(root.as_fd())?;
                    let ft = sys::fstatfs_type(root.as_fd())?;
                    let acls = acl_support(&root);
                    Ok((root, st, ft, acls))
                },
                tune.timeout,
            )
        } else {
            Err(CallError::Timeout)
        };
        let (root, dev, isolated, state, reason, acls) = match opened {
            Ok(Ok((root, st, ft, acls))) => (
                root,
                st.st_dev,
                tune.isolate.unwrap_or(!crate::exec::is_local_fs(ft)),
                State::Active,
                "mounted".to_string(),
                acls,
            ),
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                // A placeholder root until a probe opens the real one.
                let root = sys::open_root(std::path::Path::new("/"))?;
                (
                    root,
                    0,
                    tune.isolate.unwrap_or(true),
                    State::Stalled,
                    if answered {
                        format!("no answer within {:?} at mount", tune.timeout)
                    } else {
                        format!(
                            "its path did not answer within {:?} when the configuration was loaded",
                            tune.timeout
                        )
                    },
                    None,
                )
            }
        };
        exec.set_isolated(isolated);
        let b = Branch {
            id,
            name: name.to_string(),
            path: RwLock::new(path),
            root: RwLock::new(Arc::new(root)),
            dev: AtomicU64::new(dev),
            state: AtomicU8::new(state.code()),
            health: Mutex::new(Health {
                reason,
                since: SystemTime::now(),
            }),
            errors: Errors::default(),
            exec,
            needs_resync: AtomicBool::new(state != State::Active),
            probing: Arc::new(AtomicBool::new(false)),
            epoch,
            space: Mutex::new(None),
            acls: Arc::new(AtomicU8::new(acls_code(acls))),
            dirs: Mutex::new(HashMap::new()),
        };
        Ok(b)
    }

    pub fn state(&self) -> State {
        State::of(self.state.load(Ordering::Acquire))
    }

    pub fn health(&self) -> Health {
        self.health.lock().clone()
    }

    /// Moves the branch to `s` (with why); false if it was already there.
    pub fn set_state_why(&self, s: State, reason: impl Into<String>) -> bool {
        let mut h = self.health.lock();
        let old = self.state();
        if old == s {
            return false;
        }
        self.state.store(s.code(), Ordering::Release);
        *h = Health {
            reason: reason.into(),
            since: SystemTime::now(),
        };
        true
    }

    pub fn set_state(&self, s: State) {
        let why = match s {
            State::Active => "added",
            State::Removed => "removed by command",
            State::Stalled => "stalled",
            State::Failed => "failed",
        };
        self.set_state_why(s, why);
    }

    pub fn active(&self) -> bool {
        self.state() == State::Active
    }

    /// Whether the branch's file system keeps POSIX ACLs; None until it has answered.
    pub fn acl_support(&self) -> Option<bool> {
        match self.acls.load(Ordering::Relaxed) {
            ACLS_YES => Some(true),
            ACLS_NO => Some(false),
            _ => None,
        }
    }

    pub fn dev(&self) -> u64 {
        self.dev.load(Ordering::Relaxed)
    }

    pub fn root(&self) -> Arc<OwnedFd> {
        self.root.read().clone()
    }

    /// A host call of this branch, with its deadline (see `exec`). A branch that is
    /// stalled answers EIO at once: its workers are stuck or about to be, and a caller must
    /// not queue behind them. Errors are counted by kind; ENOTCONN (the transport is gone:
    /// a FUSE server died) fails the branch at once.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        if self.state() == State::Stalled {
            self.errors.unavailable.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let r = self.exec.run(f);
        self.note(r)
    }

    /// Whether a call on this branch has been running for longer than `grace`: someone is
    /// already waiting on it (or gave up on it), and the branch may be hanging without being
    /// marked `stalled` yet — that happens only when a call's whole deadline has passed. A
    /// merged operation that can answer from other copies does not wait for a suspect
    /// branch (`Inner::dir_attr`): without this, every such call made during the first
    /// deadline would wait its own grace for the same hung server. Inline branches are
    /// never suspect (their calls are not waited for apart from running them).
    pub fn suspect(&self, grace: Duration) -> bool {
        self.exec.isolated() && self.exec.oldest_call() > grace
    }

    /// A host call for a status request: inline on a branch whose calls run inline, else on
    /// a worker with at most `limit` (a status answers in well under a second, whatever the
    /// branches do). Missing the limit says nothing about the branch's health.
    pub fn run_quick<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
        limit: Duration,
    ) -> io::Result<T> {
        if self.state().down() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if !self.exec.isolated() {
            return f();
        }
        crate::exec::flat(self.exec.probe(f, limit.min(self.exec.timeout())))
    }

    /// [`Branch::run`] whose result is undone when it comes after the deadline.
    pub fn run_or_undo<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
        undo: impl FnOnce(T) + Send + 'static,
    ) -> io::Result<T> {
        if self.state() == State::Stalled {
            self.errors.unavailable.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let r = self.exec.run_or_undo(f, move |r: io::Result<T>| {
            if let Ok(v) = r {
                undo(v);
            }
        });
        self.note(r)
    }

    /// Starts a call that the caller waits for later with [`Branch::finish`] (merged
    /// operations start one on every branch first).
    pub fn start<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> crate::exec::Pending<io::Result<T>> {
        if self.state() == State::Stalled {
            self.errors.unavailable.fetch_add(1, Ordering::Relaxed);
            return crate::exec::Pending::Failed(CallError::Unavailable);
        }
        self.exec.start(f)
    }

    pub fn finish<T>(&self, p: crate::exec::Pending<io::Result<T>>) -> io::Result<T> {
        self.note(p.wait())
    }

    /// Counts an answer and applies what it says about the branch's health.
    pub fn note<T>(&self, r: Result<io::Result<T>, CallError>) -> io::Result<T> {
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                match e.raw_os_error() {
                    _ if lost_server(&e) => {
                        self.errors.enotconn.fetch_add(1, Ordering::Relaxed);
                        if self.set_state_why(State::Failed, LOST_SERVER) {
                            warn!(
                                "branch '{}': transport not connected: marked failed",
                                self.name
                            );
                            self.needs_resync.store(true, Ordering::Release);
                            self.epoch.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Some(libc::ESTALE) => {
                        self.errors.estale.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(libc::EIO) => {
                        self.errors.eio.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
                Err(e)
            }
            Err(CallError::Timeout) => {
                self.errors.timeouts.fetch_add(1, Ordering::Relaxed);
                self.stalled(&format!(
                    "a host call took longer than {:?} (branch_timeout)",
                    self.exec.timeout()
                ));
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            Err(CallError::Unavailable) => {
                self.errors.unavailable.fetch_add(1, Ordering::Relaxed);
                self.stalled("every worker is stuck on a host call");
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }

    /// Marks the branch stalled (from active), with why.
    pub fn stalled(&self, why: &str) {
        if self.state() == State::Active && self.set_state_why(State::Stalled, why) {
            warn!(
                "branch '{}' ({}): {why}: marked stalled",
                self.name,
                self.path.read().display()
            );
            // Calls abandoned at the deadline may still change the branch when it answers.
            self.needs_resync.store(true, Ordering::Release);
            self.epoch.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Re-opens the root by path (the directory came back, or the branch was re-added with
    /// a new path), on a worker with the deadline.
    pub fn reopen(&self, path: Option<PathBuf>) -> io::Result<()> {
        let p = path.unwrap_or_else(|| self.path.read().clone());
        let q = p.clone();
        let r = self.exec.probe(
            move || -> io::Result<(OwnedFd, sys::Stat)> {
                let root = sys::open_root(&q)?;
                let st = sys::fstat(root.as_fd())?;
                Ok((root, st))
            },
            self.exec.timeout(),
        );
        let (root, st) = crate::exec::flat(r)?;
        self.dev.store(st.st_dev, Ordering::Relaxed);
        *self.root.write() = Arc::new(root);
        *self.path.write() = p;
        *self.space.lock() = None;
        self.forget_dirs();
        Ok(())
    }

    /// One health probe (background, on a worker, with the deadline): is the root still
    /// the directory we opened, still linked, reachable by its path, and how much room is
    /// there. Err: the state it shows (stalled: no answer in time; failed: a wrong one)
    /// and why. A probe still stuck from last time counts as a missed deadline.
    pub fn probe(&self) -> Result<(), (State, String)> {
        if self.probing.swap(true, Ordering::AcqRel) {
            return Err((State::Stalled, "the last probe has not answered yet".into()));
        }
        let root = self.root();
        let path = self.path.read().clone();
        let probing = self.probing.clone();
        let acls = self.acls.clone();
        let timeout = self.exec.timeout();
        let r = self.exec.probe(
            move || -> Result<(u64, u64), String> {
                let out = (|| {
                    let st =
                        sys::fstat(root.as_fd()).map_err(|e| probe_why("stat of the root", e))?;
                    if st.st_nlink == 0 {
                        return Err("the branch directory was removed".to_string());
                    }
                    let p = std::fs::metadata(&path)
                        .map_err(|e| probe_why(&path.display().to_string(), e))?;
                    use std::os::unix::fs::MetadataExt;
                    if p.ino() != st.st_ino || p.dev() != st.st_dev {
                        return Err(format!("{} is another directory now", path.display()));
                    }
                    let v = sys::fstatvfs(root.as_fd()).map_err(|e| probe_why("statvfs", e))?;
                    if let Some(a) = acl_support(&root) {
                        acls.store(acls_code(Some(a)), Ordering::Relaxed);
                    }
                    Ok((
                        v.bavail.saturating_mul(v.frsize),
                        v.blocks.saturating_mul(v.frsize),
                    ))
                })();
                // Cleared when the probe's call returns, whenever that is: a stuck probe is
                // not repeated.
                probing.store(false, Ordering::Release);
                out
            },
            timeout,
        );
        match r {
            Ok(out) => {
                let (free, total) = out.map_err(|e| (State::Failed, e))?;
                *self.space.lock() = Some((Instant::now(), free, total));
                Ok(())
            }
            Err(e) => {
                if e == CallError::Unavailable {
                    self.probing.store(false, Ordering::Release);
                }
                self.errors.timeouts.fetch_add(1, Ordering::Relaxed);
                Err((
                    State::Stalled,
                    match e {
                        CallError::Timeout => {
                            format!("a probe took longer than {timeout:?} (branch_timeout)")
                        }
                        CallError::Unavailable => "every worker is stuck on a host call".into(),
                    },
                ))
            }
        }
    }

    /// The directory `rel` beneath the root (an O_PATH descriptor), from a cache: resolving
    /// a path beneath the root is the most frequent host call of the layer. The cache is
    /// keyed by path, so it is dropped whenever a directory is renamed or removed.
    pub fn dir(&self, rel: &[u8]) -> io::Result<DirFd> {
        if let Some(fd) = self.dirs.lock().get(rel) {
            return Ok(fd.clone());
        }
        let root = self.root();
        let r = rel.to_vec();
        let fd = Arc::new(self.run(move || sys::open_dir_beneath(root.as_fd(), &r))?);
        self.cache_dir(rel, &fd);
        Ok(fd)
    }

    /// [`Branch::dir`] for code already running on the branch (inside [`Branch::run`]): a
    /// cache miss opens the directory here, without another hand-off.
    pub fn dir_here(&self, rel: &[u8]) -> io::Result<DirFd> {
        if let Some(fd) = self.dirs.lock().get(rel) {
            return Ok(fd.clone());
        }
        let root = self.root();
        let fd = Arc::new(sys::open_dir_beneath(root.as_fd(), rel)?);
        self.cache_dir(rel, &fd);
        Ok(fd)
    }

    /// A readable descriptor of the directory `rel` (to list or fsync it), for code
    /// already running on the branch.
    pub fn open_dir_here(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        sys::reopen_dir(self.dir_here(rel)?.as_fd())
    }

    fn cache_dir(&self, rel: &[u8], fd: &DirFd) {
        let mut c = self.dirs.lock();
        if c.len() >= 16384 {
            c.clear();
        }
        c.insert(rel.to_vec(), fd.clone());
    }

    /// Drops the directory cache (a directory was renamed or removed).
    pub fn forget_dirs(&self) {
        self.dirs.lock().clear();
    }

    /// (free bytes, total bytes), cached briefly.
    pub fn space(&self) -> Option<(u64, u64)> {
        let mut s = self.space.lock();
        if let Some((t, f, tot)) = *s
            && t.elapsed() < SPACE_TTL
        {
            return Some((f, tot));
        }
        if self.state().down() {
            return None;
        }
        let root = self.root();
        let v = self.run(move || sys::fstatvfs(root.as_fd())).ok()?;
        let free = v.bavail.saturating_mul(v.frsize);
        let total = v.blocks.saturating_mul(v.frsize);
        *s = Some((Instant::now(), free, total));
        Some((free, total))
    }

    /// Forget the cached space reading (after an ENOSPC, a migration).
    pub fn space_changed(&self) {
        *self.space.lock() = None;
    }

    /// The metadata directory (created if missing) beneath the root, and a subdirectory.
    pub fn meta_dir(&self, sub: Option<&str>) -> io::Result<OwnedFd> {
        let root = self.root();
        let sub = sub.map(str::to_string);
        self.run(move || meta_dir_at(&root, sub.as_deref()))
    }

    /// Cached space reading only (status: never a host call).
    pub fn space_cached(&self) -> Option<(u64, u64)> {
        self.space.lock().map(|(_, f, t)| (f, t))
    }
}

fn meta_dir_at(root: &OwnedFd, sub: Option<&str>) -> io::Result<OwnedFd> {
    {
        match sys::mkdirat(root.as_fd(), OsStr::new(META), 0o700) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
        let meta = sys::open_dir_beneath(root.as_fd(), META.as_bytes())?;
        let Some(sub) = sub else {
            return Ok(meta);
        };
        match sys::mkdirat(meta.as_fd(), OsStr::new(sub), 0o700) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
        sys::open_dir_beneath(meta.as_fd(), sub.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server gone is one reason whichever way the probe learns it: ENOTCONN, or the
    /// ECONNABORTED a FUSE connection aborted under the call answers (a killed server's
    /// branch once showed "Software caused connection abort", which names neither).
    #[test]
    fn a_lost_server_is_one_reason_whatever_errno_says_it() {
        for errno in [libc::ENOTCONN, libc::ECONNABORTED] {
            let why = probe_why("statvfs", io::Error::from_raw_os_error(errno));
            assert_eq!(why, LOST_SERVER, "errno {errno}");
        }
        let why = probe_why("statvfs", io::Error::from_raw_os_error(libc::EIO));
        assert!(why.starts_with("statvfs: "), "{why}");
    }
}
