//! The unified namespace: [`Umbrella`] implements [`cairn_vfs::FileSystem`] over the
//! branches.
//!
//! **No lock of the index or the node table is held across a host call.** A branch can stop
//! answering (a network file system whose server hung): its calls then take up to the
//! branch's deadline (`exec`), and whatever waits for a lock held across one waits as long.
//! So the index (`ns`) and the node table (`nodes`) are memory only, held for a few
//! comparisons; what keeps a namespace change and its host calls together is a lock of the
//! *directories* it changes, which only other changes of those directories wait for.
//!
//! Locking, outermost first (every path takes them in this order, so none deadlocks):
//! 1. a file's `mig` mutex: held by a migration for its whole length, and briefly by open,
//!    unlink and setattr, so a file is never opened, unlinked or changed while it is being
//!    copied;
//! 2. a handle's descriptor lock, *write* side: held by the migration of an open file
//!    (overflow) from before it takes the source's identity to the end, so no write lands
//!    on the source after the copy;
//! 3. `shape`: shared by every operation that resolves host paths of union directories,
//!    exclusive for the ones that change such paths (a directory rename, a branch rescan
//!    merging into the index). Held across host calls: a directory rename on a branch that
//!    hangs holds the namespace for one deadline, after which the branch is stalled and
//!    answers at once;
//! 4. directory locks (`lock_dirs`, striped by inode number, always taken together in
//!    stripe order): a namespace change of a directory's entries (create, mkdir, link,
//!    unlink, rmdir, rename, a migration's commit) holds its parents' locks from its checks
//!    to its index update, across its host calls, so no other change of those directories
//!    runs in between — as the kernel's directory lock does for one mount;
//! 5. `ns` (the location index): memory only;
//! 6. `nodes` (file nodes and the inode map): memory only;
//! 7. a handle's descriptor lock, *read* side, for I/O (held across the call, with its
//!    deadline). It is only tried (`try_read`) by attribute reads that run while a
//!    migration may hold the write side.
//!
//! Inode numbers: the root is 1, directories get a number when they enter the index, files
//! one per host object `(st_dev, st_ino)`, kept for the life of the mount (a migration
//! moves the host object but keeps our number).

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use cairn_vfs::{
    Access, Attr, Ctx, DirEntry, Errno, FallocMode, Fh, FileKind, FileSystem, FsError, Ino,
    KernelCachePolicy, RenameFlags, Result, SetAttr, SetTime, StatFs, fileattr, perm,
};
use log::{debug, info, warn};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::branch::{Branch, DirFd, META, State, Tuning};
use crate::config::{Config, ErrorMode};
use crate::migrate::Room;
use crate::ns::{Dir, Entry, ROOT, Tree};
use crate::rules::{Amount, BranchId, BranchView, Decision, Facts, RuleRef, RuleSet};
use crate::sys::{self, TimeSet};

pub(crate) fn err(e: i32) -> FsError {
    FsError::Errno(Errno(e))
}

pub(crate) fn ioerr(e: io::Error) -> FsError {
    FsError::Errno(Errno(sys::errno(&e)))
}

/// A live file node: what the kernel or an open handle refers to.
pub(crate) struct FileNode {
    /// Known names: (directory ino, name). Several for hard links; empty once unlinked.
    pub names: Vec<(Ino, OsString)>,
    pub branch: BranchId,
    pub key: (u64, u64),
    pub nlookup: u64,
    pub open: u32,
    pub mig: Arc<Mutex<()>>,
    pub handles: Vec<Weak<Handle>>,
}

pub(crate) struct Nodes {
    pub files: HashMap<Ino, FileNode>,
    pub keymap: HashMap<(u64, u64), Ino>,
}

pub(crate) struct Handle {
    pub ino: Ino,
    pub flags: i32,
    /// Who opened it, as the privilege rule needs it: `perm::handle_flags` of the opener
    /// (`O_KILL_PRIVILEGES`, `O_KILL_SGID`), kept apart from `flags`, which reopen the
    /// branch file when it moves.
    pub kill: i32,
    /// The file's restricting flags (`fileattr::RESTRICTING`) as set through this mount
    /// while the handle is open. The branch refuses a new open for writing of an immutable
    /// or append-only file, but not a write, truncation or copy through a descriptor opened
    /// before (tmpfs, like most file systems, checks the flags at open only; ext4 checks
    /// them on every change), so the layer refuses those itself (generic/553).
    pub restrict: AtomicU32,
    pub fd: RwLock<HostFd>,
}

/// An open host file and the branch it is on (a migration of an open file swaps both).
pub(crate) struct HostFd {
    pub fd: Arc<OwnedFd>,
    pub branch: Arc<Branch>,
}

impl Handle {
    /// Runs `f` on the handle's host file with its branch's deadline, holding the read side
    /// of the descriptor lock (a migration of the file waits until the call is over).
    pub fn io<T: Send + 'static>(
        &self,
        f: impl FnOnce(&OwnedFd) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let g = self.fd.read();
        let fd = g.fd.clone();
        g.branch.run(move || f(&fd))
    }

    /// [`Handle::io`] when no migration holds the write side now; None otherwise.
    pub fn try_io<T: Send + 'static>(
        &self,
        f: impl FnOnce(&OwnedFd) -> io::Result<T> + Send + 'static,
    ) -> Option<io::Result<T>> {
        let g = self.fd.try_read()?;
        let fd = g.fd.clone();
        Some(g.branch.run(move || f(&fd)))
    }

    /// Refuses (EPERM) a change of the file's data through this handle while the file is
    /// immutable, or append-only unless the change only `appends` (a write through an
    /// O_APPEND handle, an fallocate that keeps the size) — the kernel's rules.
    fn may_change(&self, appends: bool) -> Result<()> {
        let f = self.restrict.load(Ordering::Relaxed);
        if f & fileattr::IMMUTABLE != 0 || (f & fileattr::APPEND != 0 && !appends) {
            return Err(err(libc::EPERM));
        }
        Ok(())
    }

    /// Before a change of the file's data through this handle (a write, any fallocate):
    /// clears what the kernel's FUSE client leaves to us. The client itself clears setuid,
    /// and setgid with group-execute, by a SETATTR as the writer (`fuse_setattr` without
    /// FUSE_HANDLE_KILLPRIV), on every path including passthrough; it never clears setgid
    /// without group-execute, which `setattr_should_drop_sgid` drops when the writer is
    /// outside the file's group. So only such a handle (`O_KILL_SGID`) costs an fstat here;
    /// the branch file system would not do it, since the daemon writes with CAP_FSETID.
    /// Returns whether the mode changed (the kernel's cached attributes are then stale).
    fn remove_privs(&self) -> io::Result<bool> {
        if self.kill & perm::O_KILL_SGID == 0 {
            return Ok(false);
        }
        let kill = self.kill;
        self.io(move |fd| {
            let st = sys::fstat(fd.as_fd())?;
            let m = perm::mode_after_data_change(kill, st.st_mode);
            if m == st.st_mode {
                return Ok(false);
            }
            sys::fchmod(fd.as_fd(), m & 0o7777).map(|()| true)
        })
    }
}

struct Listing {
    entries: Vec<(OsString, Ino, FileKind)>,
}

enum Open {
    File(Arc<Handle>),
    Dir(OpenDir),
}

/// An open directory: its listing, taken at the first read, and its first copy as it was
/// at open. A directory removed while open (rmdir, or a rename over it) leaves the index,
/// yet `fstat` of the descriptor must still answer — with no links, as a kernel file
/// system does (generic/035): the copy held here is what answers then.
struct OpenDir {
    ino: Ino,
    listing: Arc<Mutex<Option<Listing>>>,
    copy: Option<(Arc<Branch>, DirFd)>,
}

/// The policy in force (replaced whole by reload).
pub(crate) struct Policy {
    pub rules: RuleSet,
    pub errors: ErrorMode,
    pub min_free: Amount,
    pub passthrough_headroom: Option<Amount>,
    pub enforce_rate: Option<u64>,
    pub enforce_interval: Option<Duration>,
    pub index_branch: BranchId,
}

/// How many file moves are under way, and a wake-up when the last ends.
#[derive(Default)]
pub(crate) struct MovesUnderWay {
    n: Mutex<u64>,
    ended: Condvar,
}

/// One move under way, counted until dropped (a move that fails or panics still ends).
pub(crate) struct MoveUnderWay<'a>(&'a MovesUnderWay);

impl MovesUnderWay {
    pub(crate) fn begin(&self) -> MoveUnderWay<'_> {
        *self.n.lock() += 1;
        MoveUnderWay(self)
    }

    /// Returns once no move is under way, or after `limit`.
    fn wait_idle(&self, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        let mut n = self.n.lock();
        while *n > 0 {
            if self.ended.wait_until(&mut n, deadline).timed_out() {
                break;
            }
        }
    }
}

impl Drop for MoveUnderWay<'_> {
    fn drop(&mut self) {
        let mut n = self.0.n.lock();
        *n -= 1;
        if *n == 0 {
            self.0.ended.notify_all();
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub migrations_done: AtomicU64,
    /// Moves that failed and were rolled back (the file stays where it was).
    pub migrations_failed: AtomicU64,
    /// Moves rolled back because the file changed under the copy (tried again).
    pub migrations_abandoned: AtomicU64,
    /// Moves whose record could not be removed (see `migrate`): finished by the next
    /// mount's recovery.
    pub unfinished: AtomicU64,
    pub migrated_bytes: AtomicU64,
    pub overflows: AtomicU64,
    pub conflicts: AtomicU64,
    /// Move records resolved by recovery at mount.
    pub recovered: AtomicU64,
    /// Objects recovery kept aside in `.umbrella/kept/` because it could not tell which
    /// copy was right.
    pub kept: AtomicU64,
}

pub(crate) struct Inner {
    pub branches: RwLock<Vec<Arc<Branch>>>,
    /// See the module comment (lock 3).
    pub shape: RwLock<()>,
    /// See the module comment (lock 4): stripes, by directory inode number.
    dirlocks: Vec<Mutex<()>>,
    pub policy: RwLock<Arc<Policy>>,
    pub hits: Mutex<HashMap<RuleRef, u64>>,
    pub ns: RwLock<Tree>,
    pub nodes: Mutex<Nodes>,
    next_ino: AtomicU64,
    open: Mutex<HashMap<Fh, Open>>,
    next_fh: AtomicU64,
    pub counters: Counters,
    /// Files waiting for the migration worker.
    pub pending: Mutex<HashSet<Ino>>,
    pub pending_cv: Condvar,
    /// Moves under way (`move_file`, whoever runs it): a call that found no branch with
    /// room waits for them (`Inner::overflowing`), since each frees its source's room when
    /// it ends.
    pub moves: MovesUnderWay,
    pub work_tx: Mutex<Option<std::sync::mpsc::Sender<Ino>>>,
    pub stopping: AtomicBool,
    pub config_path: Mutex<Option<std::path::PathBuf>>,
    pub enforce: Mutex<Option<Arc<crate::enforce::Job>>>,
    /// Bumped whenever a branch joins, leaves or fails. Added (in nanoseconds) to the
    /// mtime reported for directories: the kernel keeps directory listings cached until a
    /// directory's mtime changes, and a branch change alters listings without touching any
    /// host directory. Zero (exact times) on a mount whose branches never changed.
    pub epoch: Arc<AtomicU64>,
    pub failpoints: crate::failpoint::Failpoints,
    /// Per-branch tuning from the configuration, by branch name (reload changes it).
    pub tuning: Mutex<HashMap<String, Tuning>>,
    /// Names kept twice by a returning branch's resync (`disconnected`), for `status`.
    pub conflict_list: Mutex<Vec<String>>,
    /// The mount keeps and enforces POSIX ACLs: every branch's file system keeps them
    /// (decided at mount; a branch that cannot keep them does not join such a mount).
    pub acls: bool,
    /// The mount's access-time rule (`noatime`, `relatime`, `strictatime`; set at mount,
    /// [`FileSystem::set_atime`]): the layer applies it at open on top of the branch's
    /// own (`Inner::atime_due`).
    pub atime: Mutex<cairn_vfs::Atime>,
}

/// How many times a write or fallocate that found its branch full looks again for room
/// (`Inner::overflowing`): enough for two files racing for one branch (one moves, the other
/// retries where it is or moves after it), bounded so that a full union answers ENOSPC soon.
const OVERFLOW_TRIES: u32 = 4;

/// The pause before a second look for room, doubled for each later one (10 + 20 + 40 ms at
/// most in all): a concurrent fallocate's transient fill or a concurrent move is over by then.
const OVERFLOW_PAUSE: Duration = Duration::from_millis(10);

/// How long a call that found no branch with room waits, before its next look, for moves
/// under way to end (a concurrent file moving off the branch this one needs: an 80 MiB
/// copy on a loaded machine takes longer than the pauses). Bounded, so that moves that
/// never stop (enforce on a busy mount) delay an ENOSPC by at most this per look.
const OVERFLOW_WAIT: Duration = Duration::from_secs(2);

/// How long a directory's attributes wait for further copies once one has answered.
const ATTR_GRACE: Duration = Duration::from_millis(250);

/// Directory lock stripes: enough that unrelated directories rarely share one.
const DIR_STRIPES: usize = 64;

/// The policy layer as a file system.
pub struct Umbrella {
    pub(crate) inner: Arc<Inner>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

const KEEP_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_TRUNC
    | libc::O_SYNC
    | libc::O_DSYNC
    | libc::O_NOATIME
    | libc::O_LARGEFILE
    | libc::O_NONBLOCK;

impl BranchView for Inner {
    fn active(&self, b: BranchId) -> bool {
        self.branches.read().get(b).is_some_and(|x| x.active())
    }
    fn space(&self, b: BranchId) -> Option<(u64, u64)> {
        let br = self.branches.read().get(b).cloned()?;
        br.space()
    }
}

pub(crate) fn now() -> SystemTime {
    SystemTime::now()
}

impl Umbrella {
    /// Opens the branches of `cfg`, recovers interrupted migrations, loads or rebuilds the
    /// index and starts the migration worker and the health checker.
    pub fn mount(cfg: &Config) -> std::result::Result<Umbrella, String> {
        if cfg.branches.len() > 64 {
            return Err("at most 64 branches".into());
        }
        // Modes and owners are set explicitly on every object we create.
        sys::umask(0);
        let epoch = Arc::new(AtomicU64::new(0));
        let mut branches = Vec::new();
        let mut tuning = HashMap::new();
        for (i, b) in cfg.branches.iter().enumerate() {
            let t = Tuning {
                timeout: b.timeout,
                isolate: b.isolate,
            };
            tuning.insert(b.name.clone(), t);
            let br = Branch::open(i, &b.name, b.path.clone(), t, epoch.clone(), b.answered)
                .map_err(|e| format!("branch '{}' ({}): {e}", b.name, b.path.display()))?;
            if !br.active() {
                warn!(
                    "branch '{}' ({}): {}; mounting without it",
                    b.name,
                    b.path.display(),
                    br.health().reason
                );
            }
            branches.push(Arc::new(br));
        }
        // ACLs are kept and enforced when every branch that answered keeps them (one that
        // did not answer yet is checked when it does: `probe_branch`).
        let acls = branches.iter().all(|b| b.acl_support() != Some(false))
            && branches.iter().any(|b| b.acl_support() == Some(true));
        let policy = Policy {
            rules: cfg.rules.clone(),
            errors: cfg.errors,
            min_free: cfg.min_free,
            passthrough_headroom: cfg.passthrough_headroom,
            enforce_rate: cfg.enforce_rate,
            enforce_interval: cfg.enforce_interval,
            index_branch: cfg.index,
        };
        let inner = Arc::new(Inner {
            branches: RwLock::new(branches),
            shape: RwLock::new(()),
            dirlocks: (0..DIR_STRIPES).map(|_| Mutex::new(())).collect(),
            policy: RwLock::new(Arc::new(policy)),
            hits: Mutex::new(HashMap::new()),
            ns: RwLock::new(Tree::new(0)),
            nodes: Mutex::new(Nodes {
                files: HashMap::new(),
                keymap: HashMap::new(),
            }),
            next_ino: AtomicU64::new(ROOT + 1),
            open: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            counters: Counters::default(),
            pending: Mutex::new(HashSet::new()),
            pending_cv: Condvar::new(),
            moves: MovesUnderWay::default(),
            work_tx: Mutex::new(None),
            stopping: AtomicBool::new(false),
            config_path: Mutex::new(Some(cfg.source.clone())),
            enforce: Mutex::new(None),
            epoch,
            failpoints: Default::default(),
            tuning: Mutex::new(tuning),
            conflict_list: Mutex::new(Vec::new()),
            acls,
            atime: Mutex::new(cairn_vfs::Atime::default()),
        });
        // Any record means the saved index may not describe the branches any more.
        let recovered = inner.recover_moves();
        inner.load_or_scan(recovered.records > 0);
        let fs = Umbrella {
            inner,
            threads: Mutex::new(Vec::new()),
        };
        fs.start_threads();
        Ok(fs)
    }

    fn start_threads(&self) {
        let (tx, rx) = std::sync::mpsc::channel::<Ino>();
        *self.inner.work_tx.lock() = Some(tx);
        let weak = Arc::downgrade(&self.inner);
        let w = std::thread::Builder::new()
            .name("umbrella-migrate".into())
            .spawn(move || {
                // Moves rolled back because the file changed under the copy are tried
                // again, a few times (a file renamed right after its close still moves).
                let mut retries: HashMap<Ino, u32> = HashMap::new();
                while let Ok(ino) = rx.recv() {
                    let Some(inner) = weak.upgrade() else { break };
                    if inner.stopping.load(Ordering::Acquire) {
                        inner.pending.lock().clear();
                        inner.pending_cv.notify_all();
                        break;
                    }
                    let outcome = inner.check_and_move(ino);
                    let again = outcome == crate::migrate::Outcome::Changed && {
                        let n = retries.entry(ino).or_insert(0);
                        *n += 1;
                        *n <= 3
                    };
                    // A retry stays pending throughout: `quiesce` (unmount, branch removal)
                    // must not see an empty queue between two attempts.
                    let requeued = again
                        && inner
                            .work_tx
                            .lock()
                            .as_ref()
                            .is_some_and(|tx| tx.send(ino).is_ok());
                    if !requeued {
                        retries.remove(&ino);
                        inner.pending.lock().remove(&ino);
                    }
                    {
                        let mut nodes = inner.nodes.lock();
                        inner.maybe_drop(&mut nodes, ino);
                    }
                    inner.pending_cv.notify_all();
                }
            })
            .expect("spawn migration worker");
        let weak = Arc::downgrade(&self.inner);
        let h = std::thread::Builder::new()
            .name("umbrella-health".into())
            .spawn(move || {
                let mut last_enforce = std::time::Instant::now();
                loop {
                    std::thread::sleep(Duration::from_millis(500));
                    let Some(inner) = weak.upgrade() else { break };
                    if inner.stopping.load(Ordering::Acquire) {
                        break;
                    }
                    inner.check_health();
                    let interval = inner.policy.read().enforce_interval;
                    if let Some(iv) = interval
                        && last_enforce.elapsed() >= iv
                    {
                        last_enforce = std::time::Instant::now();
                        let _ = inner.start_enforce(None);
                    }
                }
            })
            .expect("spawn health checker");
        self.threads.lock().extend([w, h]);
    }

    /// Waits until no migration is queued (tests, `enforce`).
    pub fn quiesce(&self) {
        self.inner.quiesce();
    }

    /// Sets (or clears) the action run at each migration failpoint of this mount
    /// ([`crate::FAILPOINTS`]); for tests.
    #[doc(hidden)]
    pub fn set_failpoint_hook(&self, hook: Option<crate::FailpointHook>) {
        self.inner.failpoints.set(hook);
    }

    /// A control-socket command (`status`, `where PATH`, `reload [CONFIG]`, `enforce`,
    /// `enforce-status`, `branch-list`, `branch-add NAME PATH`, `branch-remove NAME`).
    pub fn command(&self, cmd: &str, args: &[&str]) -> serde_json::Value {
        crate::admin::command(&self.inner, cmd, args)
    }
}

impl Drop for Umbrella {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::Release);
        *self.inner.work_tx.lock() = None;
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

impl Inner {
    pub fn alloc_ino(&self) -> Ino {
        self.next_ino.fetch_add(1, Ordering::Relaxed)
    }

    pub fn branch(&self, b: BranchId) -> Result<Arc<Branch>> {
        self.branches
            .read()
            .get(b)
            .cloned()
            .ok_or_else(|| err(libc::EIO))
    }

    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().clone()
    }

    pub fn branch_names(&self) -> Vec<String> {
        self.branches
            .read()
            .iter()
            .map(|b| b.name.clone())
            .collect()
    }

    pub fn quiesce(&self) {
        let mut p = self.pending.lock();
        while !p.is_empty() {
            self.pending_cv.wait_for(&mut p, Duration::from_millis(100));
        }
    }

    /// Can this branch serve a file of a name in the union now? Files on removed branches
    /// are hidden; on stalled or failed branches they are hidden under `and` and give EIO
    /// under `or`.
    fn file_visible(&self, b: BranchId) -> Result<bool> {
        let st = self.branches.read().get(b).map(|x| x.state());
        match st {
            Some(State::Active) => Ok(true),
            Some(s) if s.down() && self.policy().errors == ErrorMode::Or => Err(err(libc::EIO)),
            _ => Ok(false),
        }
    }

    pub(crate) fn visible_entry(&self, dir: &Dir, name: &OsStr) -> Result<Option<Entry>> {
        match dir.children.get(name) {
            None => Ok(None),
            Some(Entry::Dir(i)) => Ok(Some(Entry::Dir(*i))),
            Some(Entry::File(b)) => Ok(if self.file_visible(*b)? {
                Some(Entry::File(*b))
            } else {
                None
            }),
        }
    }

    /// Active branches holding a copy of a directory, in id order.
    pub(crate) fn dir_branches(&self, d: &Dir) -> Vec<Arc<Branch>> {
        self.branches
            .read()
            .iter()
            .filter(|b| d.mask & (1u64 << b.id) != 0 && b.active())
            .cloned()
            .collect()
    }

    /// Under `or`, a stalled or failed branch holding a copy of this directory fails merged
    /// operations.
    pub(crate) fn merged_check(&self, d: &Dir) -> Result<()> {
        if self.policy().errors == ErrorMode::And {
            return Ok(());
        }
        let down = self
            .branches
            .read()
            .iter()
            .any(|b| d.mask & (1u64 << b.id) != 0 && b.state().down());
        if down { Err(err(libc::EIO)) } else { Ok(()) }
    }

    /// Takes the directory locks of `inos` (module comment, lock 4), in stripe order.
    pub(crate) fn lock_dirs(&self, inos: &[Ino]) -> Vec<parking_lot::MutexGuard<'_, ()>> {
        let mut k: Vec<usize> = inos.iter().map(|i| *i as usize % DIR_STRIPES).collect();
        k.sort_unstable();
        k.dedup();
        k.into_iter().map(|k| self.dirlocks[k].lock()).collect()
    }

    /// A directory's attributes: mode and owner from the first copy, times the newest of
    /// all copies. The copies are stat'ed on every branch at once, each call with its
    /// branch's deadline, and no lock is held meanwhile: a copy on a branch that does not
    /// answer in time is left out (and the branch stalled).
    ///
    /// A *suspect* branch — one with a call already running past [`ATTR_GRACE`]
    /// ([`Branch::suspect`]) — is asked only when no other copy answers: another caller is
    /// already waiting on it, so this one would only wait out its own grace for the same
    /// server (on a hung network branch, every path walk through a merged directory did,
    /// until the first deadline ended and marked the branch stalled).
    pub fn dir_attr(&self, ino: Ino) -> Result<Attr> {
        let (rel, branches, nsubdirs) = {
            let ns = self.ns.read();
            let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
            (ns.rel(ino), self.dir_branches(d), d.nsubdirs)
        };
        let (prompt, suspect): (Vec<_>, Vec<_>) =
            branches.into_iter().partition(|b| !b.suspect(ATTR_GRACE));
        let stat = |b: &Arc<Branch>| {
            let (bb, rel) = (b.clone(), rel.clone());
            b.start(move || bb.dir_here(&rel).and_then(|fd| sys::fstat(fd.as_fd())))
        };
        let started: Vec<_> = prompt.iter().map(stat).collect();
        let mut last = err(libc::ENOENT);
        let mut found: Option<Attr> = None;
        let mut absorb = |r: io::Result<sys::Stat>, found: &mut Option<Attr>| match r {
            Ok(st) => {
                let a = sys::attr_from(&st, ino);
                match found {
                    // The first copy gives mode and owner (all copies are kept equal); the
                    // times are the newest of any copy, since a name added on any branch
                    // changes the union directory.
                    Some(f) => {
                        f.mtime = f.mtime.max(a.mtime);
                        f.ctime = f.ctime.max(a.ctime);
                        f.atime = f.atime.max(a.atime);
                    }
                    None => *found = Some(a),
                }
            }
            Err(e) => last = ioerr(e),
        };
        for (b, p) in prompt.iter().zip(started) {
            // Once a copy has answered, another one only adds its times: a copy on a branch
            // slower than [`ATTR_GRACE`] is left out rather than waited for (the kernel asks
            // for the root's attributes on every path walk once they expire).
            let r = match (&found, p) {
                (Some(_), crate::exec::Pending::Queued(slot, deadline)) => {
                    let soon = std::time::Instant::now() + ATTR_GRACE;
                    match crate::exec::Pending::Queued(slot, deadline.min(soon)).wait() {
                        Ok(r) => r,
                        Err(_) => continue,
                    }
                }
                (_, p) => b.finish(p),
            };
            absorb(r, &mut found);
        }
        // Suspect copies only when no other answered: then one is all there is, and it is
        // waited for with the deadline.
        for b in &suspect {
            if found.is_some() {
                break;
            }
            let r = b.finish(stat(b));
            absorb(r, &mut found);
        }
        if let Some(mut a) = found {
            a.nlink = 2 + nsubdirs;
            a.mtime += Duration::from_nanos(self.epoch.load(Ordering::Relaxed));
            let perm = (a.perm, a.uid, a.gid);
            let mut ns = self.ns.write();
            if let Some(d) = ns.dirs.get_mut(&ino) {
                d.perm = Some(perm);
            }
            return Ok(a);
        }
        if ino == ROOT {
            // Every branch gone: still answer for the root so the mount stays usable.
            let t = now();
            return Ok(Attr {
                ino,
                generation: 0,
                size: 0,
                blocks: 0,
                atime: t,
                mtime: t,
                ctime: t,
                crtime: t,
                kind: FileKind::Directory,
                perm: 0o755,
                nlink: 2,
                uid: 0,
                gid: 0,
                rdev: 0,
                blksize: 4096,
                flags: 0,
            });
        }
        Err(last)
    }

    /// Host stat of `name` in the directory `rel` on branch `b`, and the directory's
    /// descriptor there. The caller holds no index lock.
    pub fn stat_in(&self, b: BranchId, rel: &[u8], name: &OsStr) -> Result<(DirFd, sys::Stat)> {
        let br = self.branch(b)?;
        let (bb, rel, n) = (br.clone(), rel.to_vec(), name.to_os_string());
        br.run(move || {
            let pfd = bb.dir_here(&rel)?;
            let st = sys::fstatat(pfd.as_fd(), &n)?;
            Ok((pfd, st))
        })
        .map_err(ioerr)
    }

    /// [`Inner::stat_in`] for a file entry of the index (`dir` resolved to its path first).
    pub fn stat_entry(&self, dir: Ino, name: &OsStr, b: BranchId) -> Result<(DirFd, sys::Stat)> {
        let rel = self.ns.read().rel(dir);
        self.stat_in(b, &rel, name)
    }

    /// The relative path of a directory of the index.
    pub fn rel(&self, dir: Ino) -> Vec<u8> {
        self.ns.read().rel(dir)
    }

    /// Our inode number for a host object, allocating one the first time it is seen.
    pub fn ino_for(&self, nodes: &mut Nodes, key: (u64, u64)) -> Ino {
        if let Some(i) = nodes.keymap.get(&key) {
            return *i;
        }
        let i = self.alloc_ino();
        nodes.keymap.insert(key, i);
        i
    }

    /// Registers a lookup of a file name: the node exists and knows this name.
    pub(crate) fn node_seen(
        &self,
        dir: Ino,
        name: &OsStr,
        b: BranchId,
        st: &sys::Stat,
        lookups: u64,
    ) -> Ino {
        let mut nodes = self.nodes.lock();
        let key = (st.st_dev, st.st_ino);
        let ino = self.ino_for(&mut nodes, key);
        let n = nodes.files.entry(ino).or_insert_with(|| FileNode {
            names: Vec::new(),
            branch: b,
            key,
            nlookup: 0,
            open: 0,
            mig: Arc::new(Mutex::new(())),
            handles: Vec::new(),
        });
        n.branch = b;
        n.key = key;
        n.nlookup += lookups;
        if !n.names.iter().any(|(d, nm)| *d == dir && nm == name) {
            n.names.push((dir, name.to_os_string()));
        }
        ino
    }

    /// The visible entry `name` of directory `parent` and the directory's path, read
    /// under a short index lock.
    pub(crate) fn entry_of(&self, parent: Ino, name: &OsStr) -> Result<(Option<Entry>, Vec<u8>)> {
        let ns = self.ns.read();
        let d = ns
            .dirs
            .get(&parent)
            .ok_or_else(|| self.not_dir_or_stale(parent))?;
        if parent == ROOT && name == META {
            return Ok((None, Vec::new()));
        }
        Ok((self.visible_entry(d, name)?, ns.rel(parent)))
    }

    /// Host stat of a file entry, following it when a migration moved it meanwhile (the
    /// index says the new branch once the copy is in place, before the source name goes).
    fn stat_file_entry(
        &self,
        parent: Ino,
        name: &OsStr,
        mut b: BranchId,
        mut rel: Vec<u8>,
    ) -> Result<(BranchId, DirFd, sys::Stat)> {
        for _ in 0..3 {
            match self.stat_in(b, &rel, name) {
                Ok((fd, st)) => return Ok((b, fd, st)),
                Err(e) if e.errno().0 == libc::ENOENT => match self.entry_of(parent, name)? {
                    (Some(Entry::File(c)), r) if c != b || r != rel => {
                        b = c;
                        rel = r;
                    }
                    _ => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
        Err(err(libc::ENOENT))
    }

    fn lookup_in(&self, parent: Ino, name: &OsStr, count: bool) -> Result<Attr> {
        if name.len() > 255 {
            return Err(err(libc::ENAMETOOLONG));
        }
        let (e, rel) = self.entry_of(parent, name)?;
        match e {
            None => Err(err(libc::ENOENT)),
            Some(Entry::Dir(i)) => self.dir_attr(i),
            Some(Entry::File(b)) => {
                let (b, _, st) = self.stat_file_entry(parent, name, b, rel)?;
                let ino = self.node_seen(parent, name, b, &st, u64::from(count));
                Ok(sys::attr_from(&st, ino))
            }
        }
    }

    fn not_dir_or_stale(&self, ino: Ino) -> FsError {
        if self.nodes.lock().files.contains_key(&ino) {
            err(libc::ENOTDIR)
        } else {
            err(libc::ENOENT)
        }
    }

    /// A file node's branch and one current name.
    pub(crate) fn file_loc(&self, ino: Ino) -> Result<(BranchId, Option<(Ino, OsString)>)> {
        let nodes = self.nodes.lock();
        let n = nodes.files.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
        Ok((n.branch, n.names.first().cloned()))
    }

    /// The migration lock of a file node (module comment, lock 1); None for a directory or
    /// a node nobody refers to.
    pub(crate) fn mig_of(&self, ino: Ino) -> Option<Arc<Mutex<()>>> {
        self.nodes.lock().files.get(&ino).map(|n| n.mig.clone())
    }

    pub(crate) fn any_handle(&self, ino: Ino) -> Option<Arc<Handle>> {
        let nodes = self.nodes.lock();
        nodes
            .files
            .get(&ino)?
            .handles
            .iter()
            .find_map(Weak::upgrade)
    }

    /// The attributes of a file node.
    pub fn file_attr(&self, ino: Ino) -> Result<Attr> {
        // An open file is stat'ed through its descriptor: no path to resolve. Only tried:
        // an overflowing migration may hold it; the path still names the source until that
        // migration commits.
        if let Some(h) = self.any_handle(ino)
            && let Some(Ok(st)) = h.try_io(|fd| sys::fstat(fd.as_fd()))
        {
            return Ok(sys::attr_from(&st, ino));
        }
        let (b, name) = self.file_loc(ino)?;
        if let Some((dir, name)) = name {
            let rel = self.rel(dir);
            match self.stat_file_entry(dir, &name, b, rel) {
                Ok((_, _, st)) => return Ok(sys::attr_from(&st, ino)),
                Err(e) if self.any_handle(ino).is_none() => return Err(e),
                Err(_) => {}
            }
        }
        // Unlinked but open: the descriptor still reaches it. (A migration never holds it:
        // one needs a name to move the file, and one that lost its name rolls back.)
        let h = self.any_handle(ino).ok_or_else(|| err(libc::ENOENT))?;
        let st = h
            .try_io(|fd| sys::fstat(fd.as_fd()))
            .ok_or_else(|| err(libc::EAGAIN))?
            .map_err(ioerr)?;
        Ok(sys::attr_from(&st, ino))
    }

    /// The attributes of a directory gone from the index but still open, from the copy
    /// its open descriptor holds (no links left); None when no open descriptor holds one.
    fn removed_dir_attr(&self, ino: Ino) -> Option<Result<Attr>> {
        if self.ns.read().dirs.contains_key(&ino) {
            return None;
        }
        let (b, fd) = self.open.lock().values().find_map(|o| match o {
            Open::Dir(d) if d.ino == ino => d.copy.clone(),
            _ => None,
        })?;
        let st = b.run(move || sys::fstat(fd.as_fd())).map_err(ioerr);
        Some(st.map(|st| sys::attr_from(&st, ino)))
    }

    fn attr_of(&self, ino: Ino) -> Result<Attr> {
        let is_dir = self.ns.read().dirs.contains_key(&ino);
        if is_dir {
            self.dir_attr(ino)
        } else {
            self.file_attr(ino)
        }
    }

    /// The decision for a file, counting a hit.
    pub fn decide(&self, f: &Facts<'_>, count: bool) -> Decision {
        let p = self.policy();
        let d = p.rules.evaluate(f, self, now());
        if count {
            *self.hits.lock().entry(d.rule).or_insert(0) += 1;
        }
        d
    }

    /// Does branch `b` have room for `need` more bytes above its reserve?
    pub fn has_room(&self, b: BranchId, need: u64) -> bool {
        self.has_room_for(b, need, None)
    }

    /// Does branch `b` have room for `need` more bytes and `extra` (an amount of the branch)
    /// above its reserve?
    fn has_room_for(&self, b: BranchId, need: u64, extra: Option<Amount>) -> bool {
        let Ok(br) = self.branch(b) else { return false };
        let Some((free, total)) = br.space() else {
            return false;
        };
        let of = |a: Amount| match a {
            Amount::Bytes(n) => n,
            Amount::Percent(p) => (total as f64 * p / 100.0) as u64,
        };
        let reserve = of(self.policy().min_free).saturating_add(extra.map_or(0, of));
        // Strictly more than needed: a branch reporting 0 bytes available is full even for
        // an empty file (root could still eat into ext4's reserved blocks, and then every
        // write would overflow).
        free > need.saturating_add(reserve)
    }

    /// The branch a file of `size` bytes should be on, given where it is now. None: stay.
    pub fn target_for(
        &self,
        d: &Decision,
        current: Option<BranchId>,
        size: u64,
    ) -> Option<BranchId> {
        let cands = d.candidates();
        let cur_pos = current.and_then(|c| cands.iter().position(|&x| x == c));
        for (i, &c) in cands.iter().enumerate() {
            if Some(i) == cur_pos {
                return None;
            }
            if self.active(c) && self.has_room(c, size) {
                return Some(c);
            }
        }
        None
    }

    /// Makes sure directory `dir` exists on branch `b`, creating it (and its missing
    /// ancestors) with the mode, owner and times of an existing copy: the lazy directory
    /// creation of issue 3 item 1. Returns an O_PATH descriptor of it.
    ///
    /// The caller holds `shape` shared (no directory is renamed meanwhile) and no index
    /// lock: the host calls run first, then the copies made are added to the index. Two
    /// callers making the same copy both succeed (EEXIST is success).
    pub fn ensure_dir(&self, dir: Ino, b: BranchId) -> Result<DirFd> {
        let br = self.branch(b)?;
        // The chain of ancestors without a copy on `b`, nearest the root first, with the
        // mode, owner and times each copy should get.
        let mut missing: Vec<(Ino, Vec<u8>, OsString)> = Vec::new();
        let (rel, has) = {
            let ns = self.ns.read();
            let has = ns.dirs.get(&dir).ok_or_else(|| err(libc::ENOENT))?.mask & (1u64 << b) != 0;
            let mut cur = dir;
            if !has {
                while cur != ROOT {
                    let d = ns.dirs.get(&cur).ok_or_else(|| err(libc::ENOENT))?;
                    if d.mask & (1u64 << b) != 0 {
                        break;
                    }
                    missing.push((cur, ns.rel(d.parent), d.name.clone()));
                    cur = d.parent;
                }
            }
            (ns.rel(dir), has)
        };
        if has {
            match br.dir(&rel) {
                Ok(fd) => return Ok(fd),
                // The index thought it was there (someone removed it behind our back):
                // recreate it below.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && dir != ROOT => {
                    let ns = self.ns.read();
                    let d = &ns.dirs[&dir];
                    missing.push((dir, ns.rel(d.parent), d.name.clone()));
                }
                Err(e) => return Err(ioerr(e)),
            }
        }
        if dir == ROOT {
            return br.dir(b"").map_err(ioerr);
        }
        missing.reverse();
        for (d, prel, name) in &missing {
            let model = self.dir_attr(*d).ok();
            let mode = model.map_or(0o755, |a| a.perm as u32);
            // Its extended attributes (ACLs among them: a default ACL must be inherited
            // whichever copy a new file lands in) and inode flags, as a copy holds them.
            let meta = self.dir_meta(*d).unwrap_or_default();
            let (bb, prel2, name2) = (br.clone(), prel.clone(), name.clone());
            br.run(move || {
                let pfd = bb.dir_here(&prel2)?;
                // A lazily made copy is not a change of the union parent: keep its times.
                let ptimes = sys::fstat(pfd.as_fd()).ok();
                match sys::mkdirat(pfd.as_fd(), &name2, mode) {
                    Ok(()) => {
                        if let Some(pt) = ptimes {
                            let a = sys::attr_from(&pt, 0);
                            let _ = sys::utimensat(
                                pfd.as_fd(),
                                OsStr::new("."),
                                TimeSet::At(a.atime),
                                TimeSet::At(a.mtime),
                            );
                        }
                        if let Some(a) = model {
                            let _ = sys::fchownat(pfd.as_fd(), &name2, Some(a.uid), Some(a.gid));
                            // chown clears setgid on some file systems; put the mode back.
                            let _ = sys::fchmodat(pfd.as_fd(), &name2, mode);
                        }
                        // A copy without its ACLs would hand out rights the union does not
                        // grant, or not inherit: undone rather than kept.
                        if let Err(e) = meta.apply(&pfd, &name2) {
                            let _ = sys::unlinkat(pfd.as_fd(), &name2, true);
                            return Err(e);
                        }
                        if let Some(a) = model {
                            let _ = sys::utimensat(
                                pfd.as_fd(),
                                &name2,
                                TimeSet::At(a.atime),
                                TimeSet::At(a.mtime),
                            );
                        }
                        if let Err(e) = meta.apply_flags(&pfd, &name2) {
                            warn!("inode flags of a new directory copy: {e}");
                        }
                        Ok(())
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
                    Err(e) => Err(e),
                }
            })
            .map_err(ioerr)?;
            let mut ns = self.ns.write();
            if let Some(x) = ns.dirs.get_mut(d) {
                x.mask |= 1u64 << b;
            }
        }
        br.dir(&rel).map_err(ioerr)
    }

    /// The extended attributes and inode flags of a directory, read from its first copy
    /// (all copies are kept equal), with that branch's deadline.
    pub(crate) fn dir_meta(&self, d: Ino) -> Result<crate::xattr::Meta> {
        let (rel, b) = {
            let ns = self.ns.read();
            let dd = ns.dirs.get(&d).ok_or_else(|| err(libc::ENOENT))?;
            (ns.rel(d), self.dir_branches(dd).into_iter().next())
        };
        let b = b.ok_or_else(|| err(libc::EIO))?;
        let bb = b.clone();
        b.run(move || crate::xattr::Meta::read(&*bb.dir_here(&rel)?, None))
            .map_err(ioerr)
    }

    /// The parent's mode and owner for a permission check: from the index when a getattr
    /// already read them (no host call), otherwise from the copies.
    pub(crate) fn check_parent_write(&self, ctx: &Ctx, parent: Ino) -> Result<Attr> {
        let cached = self.ns.read().dirs.get(&parent).and_then(|d| d.perm);
        let pa = match cached {
            Some((perm, uid, gid)) => Attr {
                perm,
                uid,
                gid,
                kind: FileKind::Directory,
                ..sys::attr_from(&sys::zero_stat(), parent)
            },
            None => self.dir_attr(parent)?,
        };
        self.permit(ctx, parent, &pa, Access::WX)?;
        Ok(pa)
    }

    /// Forgets the mode and owner of a directory kept for permission checks (an ACL set on
    /// it changed its mode); the next getattr reads them again.
    pub(crate) fn forget_dir_perm(&self, ino: Ino) {
        if let Some(d) = self.ns.write().dirs.get_mut(&ino) {
            d.perm = None;
        }
    }

    /// Whether a permission check of `ctx` on an object owned by `uid` with permission bits
    /// `perm` can depend on its access ACL: the mount keeps ACLs, the caller is neither
    /// root nor the owner, and the group class grants something (`acl_permission_check`
    /// reads the ACL only then; root's bypass does not look at it).
    pub(crate) fn acl_matters(&self, ctx: &Ctx, perm: u32, uid: u32) -> bool {
        self.acls && !ctx.is_root() && ctx.uid != uid && perm & 0o070 != 0
    }

    /// The access ACL of `ino` when a check of `ctx` against `a` can depend on it.
    pub(crate) fn acl_for(&self, ctx: &Ctx, ino: Ino, a: &Attr) -> Option<cairn_vfs::acl::Acl> {
        if self.acl_matters(ctx, a.perm as u32, a.uid) {
            crate::xattr::access_acl(self, ino)
        } else {
            None
        }
    }

    /// `ctx`'s permission `want` on `ino`, whose attributes are `a`: the mode, and the
    /// access ACL where it can matter (read from the branch only then). Inode flags are
    /// the host's to enforce on the calls that follow.
    pub(crate) fn permit(&self, ctx: &Ctx, ino: Ino, a: &Attr, want: Access) -> Result<()> {
        let acl = self.acl_for(ctx, ino, a);
        ctx.permission(owner_of(a), acl.as_ref(), want)
    }

    /// POSIX sticky-directory rule for removing or replacing `victim` in `dir`.
    pub(crate) fn check_sticky(&self, ctx: &Ctx, dir: &Attr, victim: &Attr) -> Result<()> {
        if dir.perm as u32 & libc::S_ISVTX != 0
            && !ctx.is_root()
            && ctx.uid != dir.uid
            && ctx.uid != victim.uid
        {
            return Err(err(libc::EPERM));
        }
        Ok(())
    }

    fn new_gid(ctx: &Ctx, pa: &Attr) -> u32 {
        if pa.perm as u32 & libc::S_ISGID != 0 {
            pa.gid
        } else {
            ctx.gid
        }
    }

    /// Would the rules place this file on a branch that is down now (stalled or failed)?
    /// That branch, if so: the file is placed elsewhere meanwhile and marked to go back
    /// when it returns (003 §6, disconnected operation).
    pub(crate) fn wanted_down(&self, f: &Facts<'_>) -> Option<BranchId> {
        let down: u64 = self
            .branches
            .read()
            .iter()
            .filter(|b| b.state().down())
            .map(|b| 1u64 << b.id)
            .sum();
        if down == 0 {
            return None;
        }
        let p = self.policy();
        let all_up = AllUp { i: self, down };
        let d = p.rules.evaluate(f, &all_up, now());
        d.candidates()
            .first()
            .copied()
            .filter(|&b| down & (1u64 << b) != 0)
    }

    /// Picks the branch for a new object and creates it there, trying the rule's later
    /// branches when a branch is full (overflow). The caller holds `shape` shared and the
    /// parent's directory lock, no index lock. A creation whose answer comes after the
    /// deadline is undone by the worker (the request was answered EIO meanwhile).
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        parent: Ino,
        name: &OsStr,
        facts: &Facts<'_>,
        what: &Make,
        (mode, umask): (u32, u32),
        owner: (u32, u32),
    ) -> Result<(BranchId, Option<OwnedFd>, sys::Stat)> {
        let d = self.decide(facts, true);
        let mut last = err(libc::ENOSPC);
        let cands = d.candidates().to_vec();
        let mode = Mode {
            perm: mode,
            umask,
            acls: self.acls,
        };
        for (i, &b) in cands.iter().enumerate() {
            if !self.active(b) {
                continue;
            }
            // The last candidate is tried even when it looks full: the estimate may be
            // stale, and the branch answers ENOSPC itself if it really is full.
            if i + 1 < cands.len() && !self.has_room(b, facts.size) {
                continue;
            }
            let pfd = match self.ensure_dir(parent, b) {
                Ok(fd) => fd,
                Err(e) if e.errno().0 == libc::ENOSPC => {
                    last = e;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let br = self.branch(b)?;
            let (pfd2, n, w) = (pfd.clone(), name.to_os_string(), what.clone());
            let (pfd3, n3, is_dir) = (pfd, name.to_os_string(), *what == Make::Dir);
            let made = br.run_or_undo(
                move || host_make(&pfd2, &n, &w, mode, owner),
                move |(_, st): (Option<OwnedFd>, sys::Stat)| {
                    if sys::fstatat(pfd3.as_fd(), &n3)
                        .is_ok_and(|now| (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino))
                    {
                        let _ = sys::unlinkat(pfd3.as_fd(), &n3, is_dir);
                    }
                },
            );
            match made {
                Ok((fd, st)) => {
                    if i > 0 {
                        self.counters.overflows.fetch_add(1, Ordering::Relaxed);
                    }
                    br.space_changed();
                    return Ok((b, fd, st));
                }
                Err(e) if matches!(sys::errno(&e), libc::ENOSPC | libc::EDQUOT) => {
                    debug!(
                        "{}: branch {b} full, trying the next",
                        String::from_utf8_lossy(name.as_bytes())
                    );
                    last = err(libc::ENOSPC);
                }
                Err(e) => return Err(ioerr(e)),
            }
        }
        Err(last)
    }

    fn facts_new<'a>(path: &'a [u8], kind: FileKind, perm: u32, uid: u32, gid: u32) -> Facts<'a> {
        let t = now();
        Facts {
            path,
            kind,
            size: 0,
            perm,
            uid,
            gid,
            atime: t,
            mtime: t,
            ctime: t,
            current: None,
        }
    }

    pub(crate) fn check_new_name(&self, parent: Ino, name: &OsStr) -> Result<()> {
        if name.len() > 255 {
            return Err(err(libc::ENAMETOOLONG));
        }
        if name.is_empty() || name == "." || name == ".." || name.as_bytes().contains(&b'/') {
            return Err(err(libc::EINVAL));
        }
        if parent == ROOT && name == META {
            return Err(err(libc::EPERM));
        }
        Ok(())
    }

    /// Creates an object (`what`) named `name` in `parent` and records it. Holds `shape`
    /// shared and the parent's directory lock across the host calls, the index lock only to
    /// check and to record. `perm` is the mode asked for, `umask` the caller's: applied
    /// unless the parent has a default ACL (see [`host_make`]).
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        kind: FileKind,
        mut perm: u32,
        umask: u32,
        what: Make,
    ) -> Result<(Attr, Option<OwnedFd>)> {
        self.check_new_name(parent, name)?;
        let _shape = self.shape.read_recursive();
        let _dl = self.lock_dirs(&[parent]);
        let path = {
            let ns = self.ns.read();
            let d = ns
                .dirs
                .get(&parent)
                .ok_or_else(|| self.not_dir_or_stale(parent))?;
            if self.visible_entry(d, name)?.is_some() {
                return Err(err(libc::EEXIST));
            }
            ns.union_path(parent, name)
        };
        let pa = self.check_parent_write(ctx, parent)?;
        let gid = Self::new_gid(ctx, &pa);
        if kind == FileKind::Directory && pa.perm as u32 & libc::S_ISGID != 0 {
            perm |= libc::S_ISGID;
        }
        // The rules see the mode the umask gives (a default ACL may mask it further; the
        // rules look again at the last close).
        let facts = Self::facts_new(&path, kind, perm & !(umask & 0o777), ctx.uid, gid);
        let (b, fd, st) = self.place(parent, name, &facts, &what, (perm, umask), (ctx.uid, gid))?;
        let away = self.wanted_down(&facts);
        let mut ns = self.ns.write();
        if kind == FileKind::Directory {
            let ino = self.alloc_ino();
            ns.add_dir(parent, name, ino, 1u64 << b);
            if let Some(d) = ns.dirs.get_mut(&ino) {
                d.perm = Some(((st.st_mode & 0o7777) as u16, st.st_uid, st.st_gid));
            }
            drop(ns);
            let mut a = sys::attr_from(&st, ino);
            a.nlink = 2;
            return Ok((a, None));
        }
        let pd = ns.dirs.get_mut(&parent).ok_or_else(|| err(libc::ENOENT))?;
        pd.children.insert(name.to_os_string(), Entry::File(b));
        if let Some(w) = away {
            ns.mark_away(parent, name, w);
        }
        drop(ns);
        let ino = self.node_seen(parent, name, b, &st, 1);
        Ok((sys::attr_from(&st, ino), fd))
    }

    /// `kill`: the opener's `perm::handle_flags` (see [`Handle::kill`]).
    fn new_handle(&self, ino: Ino, flags: i32, kill: i32, fd: OwnedFd, b: BranchId) -> Result<Fh> {
        let branch = self.branch(b)?;
        let h = Arc::new(Handle {
            ino,
            flags,
            kill,
            restrict: AtomicU32::new(0),
            fd: RwLock::new(HostFd {
                fd: Arc::new(fd),
                branch,
            }),
        });
        {
            let mut nodes = self.nodes.lock();
            if let Some(n) = nodes.files.get_mut(&ino) {
                n.open += 1;
                n.handles.retain(|w| w.strong_count() > 0);
                n.handles.push(Arc::downgrade(&h));
            }
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.open.lock().insert(fh, Open::File(h));
        Ok(fh)
    }

    /// The restricting flags of `ino` are now `flags` (set through this mount): every open
    /// handle of it refuses from now on what they forbid ([`Handle::restrict`]).
    pub(crate) fn flags_set(&self, ino: Ino, flags: u32) {
        let nodes = self.nodes.lock();
        let Some(n) = nodes.files.get(&ino) else {
            return;
        };
        for h in n.handles.iter().filter_map(Weak::upgrade) {
            h.restrict
                .store(flags & fileattr::RESTRICTING, Ordering::Relaxed);
        }
    }

    fn handle(&self, fh: Fh) -> Result<Arc<Handle>> {
        match self.open.lock().get(&fh) {
            Some(Open::File(h)) => Ok(h.clone()),
            _ => Err(err(libc::EBADF)),
        }
    }

    /// Drops every branch's directory cache (a directory was renamed or removed).
    pub fn forget_dirs(&self) {
        for b in self.branches.read().iter() {
            b.forget_dirs();
        }
    }

    /// Would the rules move this file now? Evaluated from an open handle's descriptor, so
    /// the common close (nothing to move) costs no path resolution and no hand-off to the
    /// migration worker.
    fn misplaced_via(&self, ino: Ino, h: &Handle) -> bool {
        let Ok(st) = h.io(|fd| sys::fstat(fd.as_fd())) else {
            return true;
        };
        let Ok((b, Some((d, n)))) = self.file_loc(ino) else {
            return false;
        };
        let path = self.ns.read().union_path(d, &n);
        let a = sys::attr_from(&st, ino);
        let f = Facts::of(&path, &a, b);
        let d = self.decide(&f, false);
        self.target_for(&d, Some(b), a.size).is_some()
    }

    /// The branch file of an open handle, for the kernel to read and write directly (FUSE
    /// passthrough), or None when the requests must come through here. Passed-through writes
    /// never reach `write_overflowing`, so a branch filling up would give the application
    /// ENOSPC instead of a move to the next branch: only a file that could not overflow
    /// anyway qualifies (its rule allows one branch, overflow is forbidden, or it already
    /// sits on the rule's last branch), or one whose branch has `passthrough_headroom`
    /// free beyond `min_free` at open, when the configuration trades that for speed. And
    /// only on a branch whose calls run inline: the kernel's own calls on an isolated
    /// branch's file would have no deadline. Migration on
    /// last close is unaffected: release still comes here and reads the size from the
    /// branch file.
    pub(crate) fn backing_fd(&self, ino: Ino, fh: Fh) -> Option<OwnedFd> {
        let h = self.handle(fh).ok()?;
        // A copy, so no handle lock is held while the namespace and nodes are consulted.
        let (fd, isolated) = {
            let g = h.fd.read();
            (g.fd.try_clone().ok()?, g.branch.exec.isolated())
        };
        if isolated {
            return None;
        }
        // The kernel opens the backing file with the program's open flags, not this
        // descriptor's O_NOATIME: passed through, reads move the atime by the branch's
        // own rule. So only where that is no stricter than the mount's (`Inner::atime_due`).
        let v = sys::fstatvfs(fd.as_fd()).ok()?;
        if atime_rank(branch_atime(v.flag)) > atime_rank(*self.atime.lock()) {
            return None;
        }
        let st = sys::fstat(fd.as_fd()).ok()?;
        if sys::kind_of(st.st_mode) != FileKind::RegularFile {
            return None;
        }
        // A setgid file without group-execute loses setgid when someone outside its group
        // writes it; through passthrough nobody would clear it (`Handle::remove_privs`), and
        // this first open decides for every later open of the inode, whoever makes it.
        if st.st_mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID {
            return None;
        }
        let (b, Some((d, n))) = self.file_loc(ino).ok()? else {
            return None;
        };
        let path = self.ns.read().union_path(d, &n);
        let a = sys::attr_from(&st, ino);
        let f = Facts::of(&path, &a, b);
        let dec = self.decide(&f, false);
        let cands = dec.candidates();
        let can_overflow = match cands.iter().position(|&c| c == b) {
            Some(i) => i + 1 < cands.len(),
            None => !cands.is_empty(),
        };
        // A file that may overflow is passed through only with the configured headroom on
        // its branch: its writes then no longer reach `write_overflowing`, so the room is
        // what the file (and everyone else's writes to that branch) may use while it stays
        // open before one of its writes gets ENOSPC instead of a move.
        if can_overflow {
            let headroom = self.policy().passthrough_headroom?;
            if !self.has_room_for(b, a.size, Some(headroom)) {
                return None;
            }
        }
        // The kernel shares one backing file among all opens of the inode while any is
        // passed through, so hand it a read-write descriptor when the host allows one;
        // reopening the open file through /proc reaches exactly this inode, no path walk.
        if h.flags & libc::O_ACCMODE == libc::O_RDWR {
            return Some(fd);
        }
        let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&proc)
        {
            Ok(f) => Some(f.into()),
            Err(_) if h.flags & libc::O_ACCMODE == libc::O_RDONLY => Some(fd),
            Err(_) => None,
        }
    }

    /// Queues a placement check of a file (runs when it is not open).
    pub fn queue_check(&self, ino: Ino) {
        let tx = self.work_tx.lock().clone();
        let Some(tx) = tx else { return };
        if self.pending.lock().insert(ino) && tx.send(ino).is_err() {
            self.pending.lock().remove(&ino);
        }
    }

    /// Drops a node nobody refers to any more (the inode number stays reserved for its host
    /// object while that exists).
    pub(crate) fn maybe_drop(&self, nodes: &mut Nodes, ino: Ino) {
        if let Some(n) = nodes.files.get(&ino)
            && n.nlookup == 0
            && n.open == 0
            && Arc::strong_count(&n.mig) == 1
            // A queued placement check needs the node (its names) to act.
            && !self.pending.lock().contains(&ino)
        {
            nodes.files.remove(&ino);
        }
    }

    fn open_existing(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Fh> {
        let mig = {
            let nodes = self.nodes.lock();
            nodes.files.get(&ino).map(|n| n.mig.clone())
        };
        let Some(mig) = mig else {
            let ns = self.ns.read();
            return Err(if ns.dirs.contains_key(&ino) {
                err(libc::EISDIR)
            } else {
                err(libc::ENOENT)
            });
        };
        // Waits for a migration of this file to finish.
        let _g = mig.lock();
        let _shape = self.shape.read_recursive();
        let (b, name) = self.file_loc(ino)?;
        let (dir, name) = name.ok_or_else(|| err(libc::ENOENT))?;
        // A file on a branch that is down: EIO under `or`; under `and` it is hidden, and
        // ESTALE makes the kernel look the name up again (it may hold the entry from
        // before), so an O_CREAT open makes a new file instead of failing.
        if !self.file_visible(b)? {
            return Err(err(libc::ESTALE));
        }
        let rel = self.rel(dir);
        let (b, pfd, st) = self.stat_file_entry(dir, &name, b, rel)?;
        let want = Access::for_open_flags(flags);
        self.permit(ctx, ino, &sys::attr_from(&st, ino), want)?;
        if sys::kind_of(st.st_mode) == FileKind::Directory {
            return Err(err(libc::EISDIR));
        }
        let br = self.branch(b)?;
        let f = flags & KEEP_FLAGS;
        let due = self.atime_due(&st, f);
        // Every read through the descriptor moves the atime by the branch's rule unless it
        // is O_NOATIME: so it is, but under `strictatime` (every read counts, and the
        // branch's rule is the mount's at best). O_NOATIME is the owner's (or
        // CAP_FOWNER's): a daemon without it on a file it does not own opens without.
        let quiet = *self.atime.lock() != cairn_vfs::Atime::Strict;
        let fd = br
            .run(move || {
                let fd = match quiet {
                    true => sys::openat(pfd.as_fd(), &name, f | libc::O_NOATIME, 0)
                        .or_else(|_| sys::openat(pfd.as_fd(), &name, f, 0))?,
                    false => sys::openat(pfd.as_fd(), &name, f, 0)?,
                };
                if due {
                    // A failed touch is no reason to refuse the open.
                    let _ = sys::touch_atime(fd.as_fd());
                }
                Ok(fd)
            })
            .map_err(ioerr)?;
        let kill = perm::handle_flags(ctx, 0, st.st_gid);
        self.new_handle(ino, flags & KEEP_FLAGS & !libc::O_TRUNC, kill, fd, b)
    }

    /// Whether an open with `flags` of the branch file `st` moves its access time by the
    /// mount's rule. The kernel leaves a FUSE file's atime to the daemon, and the daemon
    /// reads branch files as any program, so without this every read would move the atime
    /// by the *branch's* mount options whatever the layer was mounted with (fstests
    /// generic/003). The layer judges once, at open — passthrough reads never reach it,
    /// and reads the kernel's page cache answers never do — and the branch does the
    /// update: the handle reads through O_NOATIME (but under `strictatime`), and an open
    /// that is due reads a byte at once without it (`sys::touch_atime`), so the branch
    /// moves the atime as a program's read would. Not a futimens: that moves the change
    /// time too, which a read never does. The cost: an open for reading that never reads
    /// still counts as an access. What the branch's rule cannot give — strictatime's
    /// second read on a relatime branch — the layer cannot either
    /// ([`Umbrella::set_atime`] says so at mount).
    fn atime_due(&self, st: &libc::stat, flags: i32) -> bool {
        if flags & libc::O_NOATIME != 0 || flags & libc::O_ACCMODE == libc::O_WRONLY {
            return false;
        }
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        self.atime.lock().updates(
            ns(st.st_atime, st.st_atime_nsec),
            ns(st.st_mtime, st.st_mtime_nsec),
            ns(st.st_ctime, st.st_ctime_nsec),
            now,
        )
    }

    /// One write through a handle: inline on the caller's buffer, or a copy of it on the
    /// branch's worker with its deadline.
    fn write_once(h: &Handle, off: u64, data: &[u8]) -> io::Result<usize> {
        let g = h.fd.read();
        if !g.branch.exec.isolated() {
            return sys::pwrite(g.fd.as_fd(), data, off);
        }
        let (fd, v) = (g.fd.clone(), data.to_vec());
        g.branch.run(move || sys::pwrite(fd.as_fd(), &v, off))
    }

    /// Writes through a handle, moving the file to another branch of its rule when its
    /// branch is full (issue 3 item 3: invisible to the application).
    fn write_overflowing(&self, h: &Arc<Handle>, off: u64, data: &[u8]) -> Result<u32> {
        let end = off.saturating_add(data.len() as u64);
        let n = self.overflowing(
            h,
            |size, _| (size.max(end), data.len() as u64),
            || Self::write_once(h, off, data),
        )?;
        Ok(n as u32)
    }

    /// Runs `op` (a write or fallocate through `h`); when it finds the branch full, makes
    /// room (`overflow`: retry in place if the fill has passed, else move the file) and runs
    /// it again. `need(size, allocated)` gives, from the file's size and allocated bytes
    /// now, its size after the call (what a move needs on its target) and what the call
    /// needs on the file's own branch.
    ///
    /// Bounded: at most `OVERFLOW_TRIES` looks for room, with a short pause before every
    /// look but the first (a concurrent call's transient fill, or its move, passes in
    /// milliseconds), each host call with its branch's deadline; after a look that found no
    /// room, the next also waits (at most `OVERFLOW_WAIT`) for moves under way, which free
    /// room as they end. Two files racing for the same branch cannot ping-pong forever, and
    /// an application whose file fits nowhere gets its ENOSPC after at most the pauses and
    /// those waits. A retry in place that fails again makes the next look move the file
    /// rather than stay (the room it saw was not room for this call). A failed move leaves
    /// the file whole where it was (rolled back, `move_file`), so the next look starts from
    /// the same state.
    pub(crate) fn overflowing<T>(
        &self,
        h: &Arc<Handle>,
        need: impl Fn(u64, u64) -> (u64, u64),
        op: impl Fn() -> io::Result<T>,
    ) -> Result<T> {
        let (mut stay, mut wait_moves) = (true, false);
        for tries in 0..=OVERFLOW_TRIES {
            let e = match op() {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !matches!(sys::errno(&e), libc::ENOSPC | libc::EDQUOT) {
                return Err(ioerr(e));
            }
            if tries == OVERFLOW_TRIES {
                break;
            }
            if tries > 0 {
                std::thread::sleep(OVERFLOW_PAUSE * (1 << (tries - 1)));
            }
            if wait_moves {
                self.moves.wait_idle(OVERFLOW_WAIT);
            }
            let (size, allocated) = h
                .io(|fd| sys::fstat(fd.as_fd()))
                .map(|s| (s.st_size as u64, (s.st_blocks as u64).saturating_mul(512)))
                .unwrap_or((0, 0));
            let (total, here) = need(size, allocated);
            match self.overflow(h.ino, total, stay.then_some(here)) {
                Ok(Room::Here) => (stay, wait_moves) = (false, false),
                Ok(Room::Moved) => (stay, wait_moves) = (true, false),
                // No room anywhere at this moment, or the target filled during the move:
                // look again after the pause and the moves under way.
                Err(e) if matches!(e.errno().0, libc::ENOSPC | libc::EDQUOT | libc::EAGAIN) => {
                    (stay, wait_moves) = (true, true);
                }
                Err(_) => break,
            }
        }
        Err(err(libc::ENOSPC))
    }

    /// One round of health probes, one per branch, in parallel: a branch that does not
    /// answer holds up only its own probe (each waits at most its deadline). A probe that
    /// misses the deadline stalls the branch; one that fails (the directory is gone or
    /// replaced, ENOTCONN…) fails it. A stalled or failed branch whose probe answers —
    /// after re-opening its directory by path, for a server that was restarted — is active
    /// again, and its rules with it; what changed while it was away is then re-read
    /// (`resync`) and files waiting for it go back (`disconnected`).
    pub(crate) fn check_health(self: &Arc<Self>) {
        let branches = self.branches.read().clone();
        std::thread::scope(|sc| {
            for b in &branches {
                if b.state() == State::Removed {
                    continue;
                }
                sc.spawn(move || self.probe_branch(b));
            }
        });
    }

    /// A branch answering but unable to keep the ACLs this mount enforces (one that was
    /// stalled at mount, or a directory replaced by one on another file system): it cannot
    /// serve the union, which would lose or stop enforcing the ACLs of files placed there.
    fn acl_refusal(&self, b: &Branch) -> Option<(State, String)> {
        (self.acls && b.acl_support() == Some(false)).then(|| {
            (
                State::Failed,
                "its file system does not keep POSIX ACLs, which this mount enforces".into(),
            )
        })
    }

    fn probe_branch(self: &Arc<Self>, b: &Arc<Branch>) {
        match b.state() {
            State::Removed => {}
            State::Active => {
                if let Err((st, why)) = b.probe().and_then(|()| match self.acl_refusal(b) {
                    Some(r) => Err(r),
                    None => Ok(()),
                }) && b.set_state_why(st, why.clone())
                {
                    warn!(
                        "branch '{}' ({}): {why}: marked {}",
                        b.name,
                        b.path.read().display(),
                        st.name()
                    );
                    b.needs_resync.store(true, Ordering::Release);
                    self.epoch.fetch_add(1, Ordering::Relaxed);
                }
            }
            State::Stalled | State::Failed => {
                let back = match b.probe() {
                    Ok(()) => true,
                    // A stuck probe is not repeated; anything else may be a server that
                    // was restarted under the same path: open it again.
                    Err((State::Stalled, _)) => false,
                    Err(_) => b.reopen(None).is_ok() && b.probe().is_ok(),
                };
                let back = back
                    && match self.acl_refusal(b) {
                        Some((st, why)) => {
                            if b.set_state_why(st, why.clone()) {
                                warn!("branch '{}': {why}: marked {}", b.name, st.name());
                            }
                            false
                        }
                        None => true,
                    };
                if back && b.set_state_why(State::Active, "answering again") {
                    info!("branch '{}' is back", b.name);
                    self.epoch.fetch_add(1, Ordering::Relaxed);
                    self.branch_returned(b);
                }
            }
        }
    }

    fn setattr_file(&self, ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        let mig = {
            let nodes = self.nodes.lock();
            nodes
                .files
                .get(&ino)
                .map(|n| n.mig.clone())
                .ok_or_else(|| err(libc::ENOENT))?
        };
        let _g = mig.lock();
        let _shape = self.shape.read_recursive();
        let cur = self.file_attr(ino)?;
        let via = set.fh.and_then(|f| self.handle(f).ok());
        let via_writable = via
            .as_ref()
            .is_some_and(|h| h.flags & libc::O_ACCMODE != libc::O_RDONLY);
        let acl = self.acl_for(ctx, ino, &cur);
        check_setattr(ctx, &cur, acl.as_ref(), set, via_writable)?;
        let (b, name) = self.file_loc(ino)?;
        let handle = via.or_else(|| self.any_handle(ino));
        let br = self.branch(b)?;
        let loc = match &name {
            Some((dir, n)) => Some((br.dir(&self.rel(*dir)).map_err(ioerr)?, n.clone())),
            None => None,
        };
        // Every change is one host call on the file's branch, with its deadline: by name
        // when the file has one, through a handle otherwise.
        let by = |f: SetBy| match &loc {
            Some((pfd, n)) => {
                let (pfd, n) = (pfd.clone(), n.clone());
                br.run(move || f(&pfd, Some(&n))).map_err(ioerr)
            }
            None => {
                let h = handle.as_ref().ok_or_else(|| err(libc::ENOENT))?;
                h.io(move |fd| f(fd, None)).map_err(ioerr)
            }
        };
        if let Some(size) = set.size {
            if cur.kind != FileKind::RegularFile {
                return Err(err(libc::EINVAL));
            }
            match &handle {
                Some(h) if h.flags & libc::O_ACCMODE != libc::O_RDONLY => {
                    h.may_change(false)?;
                    h.io(move |fd| sys::ftruncate(fd.as_fd(), size))
                        .map_err(ioerr)?
                }
                _ if loc.is_some() => by(Box::new(move |pfd, n| {
                    let fd = sys::openat(pfd.as_fd(), n.unwrap_or_default(), libc::O_WRONLY, 0)?;
                    sys::ftruncate(fd.as_fd(), size)
                }))?,
                _ => return Err(err(libc::ENOENT)),
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            let (u, g) = (set.uid, set.gid);
            by(Box::new(move |fd, n| match n {
                Some(n) => sys::fchownat(fd.as_fd(), n, u, g),
                None => sys::fchown(fd.as_fd(), u, g),
            }))?;
        }
        let mut mode = set.mode.map(|m| m & 0o7777);
        // A non-root owner changing the group of a file loses setgid, like the kernel does;
        // chown by anyone drops setuid/setgid of a regular file.
        if mode.is_none()
            && (set.uid.is_some() || set.gid.is_some())
            && cur.kind == FileKind::RegularFile
        {
            let m = cur.perm as u32;
            if m & 0o6000 != 0 {
                let keep_sgid = m & 0o010 == 0;
                let nm = m & !(0o4000 | if keep_sgid { 0 } else { 0o2000 });
                if nm != m {
                    mode = Some(nm);
                }
            }
        }
        // A truncation (truncate, ftruncate, open with O_TRUNC: a size here) by a caller
        // without CAP_FSETID clears privileges as a write does. The kernel's client sends
        // the clearing of setuid, and of setgid with group-execute, in this same request;
        // setgid without group-execute is ours to clear when the caller is outside the
        // file's group (see `Handle::remove_privs`).
        if set.size.is_some() && cur.kind == FileKind::RegularFile {
            let m = mode.unwrap_or(cur.perm as u32 & 0o7777);
            let after = perm::mode_after_data_change(
                perm::handle_flags(ctx, 0, cur.gid),
                libc::S_IFREG | m,
            ) & 0o7777;
            if after != m {
                mode = Some(after);
            }
        }
        if let Some(mut m) = mode {
            // A caller outside the file's group cannot set setgid; a change that only
            // clears setuid/setgid (a write's or truncate's, see `check_setattr`) keeps
            // what it does not clear.
            if !ctx.is_root()
                && m & libc::S_ISGID != 0
                && !ctx.in_group(set.gid.unwrap_or(cur.gid))
                && !only_clears_suid_sgid(&cur, m)
            {
                m &= !libc::S_ISGID;
            }
            if cur.kind != FileKind::Symlink {
                by(Box::new(move |fd, n| match n {
                    Some(n) => sys::fchmodat(fd.as_fd(), n, m),
                    None => sys::fchmod(fd.as_fd(), m),
                }))?;
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let (at, mt) = (time_set(set.atime), time_set(set.mtime));
            by(Box::new(move |fd, n| match n {
                Some(n) => sys::utimensat(fd.as_fd(), n, at, mt),
                None => sys::futimens(fd.as_fd(), at, mt),
            }))?;
        }
        let a = self.file_attr(ino)?;
        let open = self.nodes.lock().files.get(&ino).map_or(0, |n| n.open);
        if open == 0
            && (set.size.is_some() || set.mode.is_some() || set.uid.is_some() || set.gid.is_some())
        {
            self.queue_check(ino);
        }
        Ok(a)
    }

    fn setattr_dir(&self, ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        let _shape = self.shape.read_recursive();
        let cur = self.dir_attr(ino)?;
        let acl = self.acl_for(ctx, ino, &cur);
        check_setattr(ctx, &cur, acl.as_ref(), set, false)?;
        if set.size.is_some() {
            return Err(err(libc::EISDIR));
        }
        let (prel, name, branches) = {
            let ns = self.ns.read();
            let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
            self.merged_check(d)?;
            let (prel, name) = if ino == ROOT {
                (Vec::new(), OsString::from("."))
            } else {
                (ns.rel(d.parent), d.name.clone())
            };
            (prel, name, self.dir_branches(d))
        };
        let mut mode = set.mode.map(|m| m & 0o7777);
        if let Some(m) = mode.as_mut()
            && !ctx.is_root()
            && *m & libc::S_ISGID != 0
            && !ctx.in_group(set.gid.unwrap_or(cur.gid))
        {
            *m &= !libc::S_ISGID;
        }
        let (uid, gid) = (set.uid, set.gid);
        let times = (set.atime.is_some() || set.mtime.is_some())
            .then(|| (time_set(set.atime), time_set(set.mtime)));
        // Every copy gets the change, so whichever copy answers getattr later agrees; the
        // copies are changed on all branches at once.
        let started: Vec<_> = branches
            .iter()
            .map(|b| {
                let (bb, prel, name) = (b.clone(), prel.clone(), name.clone());
                b.start(move || {
                    let pfd = bb.dir_here(&prel)?;
                    if uid.is_some() || gid.is_some() {
                        sys::fchownat(pfd.as_fd(), &name, uid, gid)?;
                    }
                    if let Some(m) = mode {
                        sys::fchmodat(pfd.as_fd(), &name, m)?;
                    }
                    if let Some((at, mt)) = times {
                        sys::utimensat(pfd.as_fd(), &name, at, mt)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for (b, p) in branches.iter().zip(started) {
            if let Err(e) = b.finish(p) {
                if self.policy().errors == ErrorMode::Or {
                    return Err(ioerr(e));
                }
                warn!("setattr of a directory copy on '{}': {e}", b.name);
            }
        }
        self.dir_attr(ino)
    }

    /// The merged listing of a directory: every visible name once, directories from any
    /// branch, files only from the branch the index says holds them. The branches are
    /// listed at once, each with its deadline, and no lock is held meanwhile: a branch that
    /// does not answer in time is left out (`and`) or fails the listing (`or`).
    fn list_dir(&self, ino: Ino) -> Result<Listing> {
        let _shape = self.shape.read_recursive();
        let (rel, parent, branches) = {
            let ns = self.ns.read();
            let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
            self.merged_check(d)?;
            (ns.rel(ino), d.parent, self.dir_branches(d))
        };
        let errors = self.policy().errors;
        let started: Vec<_> = branches
            .iter()
            .map(|b| {
                let (bb, rel) = (b.clone(), rel.clone());
                b.start(move || {
                    let p = bb.dir_here(&rel)?;
                    let mut v = sys::read_dir(sys::reopen_dir(p.as_fd())?)?;
                    // Kinds the file system did not give, while we are on the branch.
                    for he in v.iter_mut().filter(|h| h.dtype == libc::DT_UNKNOWN) {
                        if let Ok(st) = sys::fstatat(p.as_fd(), OsStr::from_bytes(&he.name)) {
                            he.dtype = FileKind::from_mode(st.st_mode)
                                .map_or(libc::DT_UNKNOWN, |k| k.dtype());
                        }
                    }
                    Ok(v)
                })
            })
            .collect();
        let mut hosts = Vec::new();
        for (b, p) in branches.iter().zip(started) {
            match b.finish(p) {
                Ok(h) => hosts.push((b.clone(), h)),
                Err(e) if errors == ErrorMode::Or => return Err(ioerr(e)),
                Err(e) => warn!("listing a directory on '{}': {e}", b.name),
            }
        }
        let mut entries = vec![
            (OsString::from("."), ino, FileKind::Directory),
            (OsString::from(".."), parent, FileKind::Directory),
        ];
        let mut seen: HashSet<OsString> = HashSet::new();
        let ns = self.ns.read();
        let Some(d) = ns.dirs.get(&ino) else {
            return Err(err(libc::ENOENT));
        };
        let mut nodes = self.nodes.lock();
        for (b, host) in hosts {
            for he in host {
                let name = OsString::from(OsStr::from_bytes(&he.name));
                if ino == ROOT && name == META {
                    continue;
                }
                match d.children.get(&name) {
                    Some(Entry::Dir(i)) if seen.insert(name.clone()) => {
                        entries.push((name, *i, FileKind::Directory));
                    }
                    Some(Entry::File(fb)) if *fb == b.id && seen.insert(name.clone()) => {
                        let kind = FileKind::from_dtype(he.dtype).unwrap_or(FileKind::RegularFile);
                        let fino = self.ino_for(&mut nodes, (b.dev(), he.ino));
                        entries.push((name, fino, kind));
                    }
                    // Not in the index (written behind our back, or a losing duplicate).
                    _ => {}
                }
            }
        }
        Ok(Listing { entries })
    }
}

/// One attribute change of `setattr_file`: by name (directory, Some(name)) or through a
/// handle's descriptor (None).
type SetBy = Box<dyn FnOnce(&OwnedFd, Option<&OsStr>) -> io::Result<()> + Send>;

/// What `make_node` creates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Make {
    /// A regular file, opened with these flags (O_CREAT | O_EXCL added).
    File(i32),
    /// A device, fifo or socket: `S_IFMT` bits and the device number.
    Node(u32, u64),
    Symlink(Vec<u8>),
    Dir,
}

/// The mode a creation asks for: the requested bits, the caller's umask, and whether the
/// mount keeps ACLs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mode {
    pub perm: u32,
    pub umask: u32,
    pub acls: bool,
}

/// Does the directory `pfd` have a default ACL (its new entries inherit it)?
pub(crate) fn has_default_acl(pfd: &OwnedFd) -> bool {
    let name = OsStr::from_bytes(cairn_vfs::acl::DEFAULT_XATTR);
    sys::getxattr(pfd.as_fd(), None, name).is_ok_and(|v| !v.is_empty())
}

/// The host calls of a creation, on the branch (a worker of an isolated branch): the
/// object, its owner (removed again if root cannot give it its owner), the mode bits chown
/// may have cleared, and its stat.
///
/// The umask: the kernel leaves it to us (FUSE_DONT_MASK) because a parent with a default
/// ACL must not apply it (`posix_acl_create`). The daemon's own umask is 0, so the host
/// file system does the ACL inheritance itself — the mode masked by the default ACL, the
/// new inode's access (and, for a directory, default) ACL — when we pass the mode
/// unmasked; without a default ACL we apply the caller's umask here.
fn host_make(
    pfd: &DirFd,
    name: &OsStr,
    what: &Make,
    mode: Mode,
    (uid, gid): (u32, u32),
) -> io::Result<(Option<OwnedFd>, sys::Stat)> {
    let inherits = mode.acls && !matches!(what, Make::Symlink(_)) && has_default_acl(pfd);
    let perm = if inherits {
        mode.perm
    } else {
        mode.perm & !(mode.umask & 0o777)
    };
    let fd = match what {
        Make::File(flags) => {
            let f = (flags & KEEP_FLAGS & !libc::O_TRUNC) | libc::O_CREAT | libc::O_EXCL;
            Some(sys::openat(pfd.as_fd(), name, f, perm)?)
        }
        Make::Node(fmt, rdev) => {
            sys::mknodat(pfd.as_fd(), name, fmt | perm, *rdev)?;
            None
        }
        Make::Symlink(t) => {
            sys::symlinkat(t, pfd.as_fd(), name)?;
            None
        }
        Make::Dir => {
            sys::mkdirat(pfd.as_fd(), name, perm)?;
            None
        }
    };
    let is_dir = *what == Make::Dir;
    if let Err(e) = sys::fchownat(pfd.as_fd(), name, Some(uid), Some(gid))
        && nix::unistd::geteuid().is_root()
    {
        let _ = sys::unlinkat(pfd.as_fd(), name, is_dir);
        return Err(e);
    }
    let mut st = sys::fstatat(pfd.as_fd(), name)?;
    // chown may have dropped setuid/setgid: put back the bits asked for, keeping the
    // permission bits the creation gave (a default ACL's mask among them; chmod rewrites
    // the ACL's mask from them, so they must be the ones it has).
    let special = perm & 0o7000;
    if !matches!(what, Make::Symlink(_)) && st.st_mode & 0o7000 != special && special != 0 {
        let _ = sys::fchmodat(pfd.as_fd(), name, (st.st_mode & 0o777) | special);
        st = sys::fstatat(pfd.as_fd(), name)?;
    }
    Ok((fd, st))
}

fn time_set(x: Option<SetTime>) -> TimeSet {
    match x {
        None => TimeSet::Omit,
        Some(SetTime::Now) => TimeSet::Now,
        Some(SetTime::At(t)) => TimeSet::At(t),
    }
}

/// The rules' view of the branches with the down ones counted as active: where a file
/// would go if every branch answered (`Inner::wanted_down`).
struct AllUp<'a> {
    i: &'a Inner,
    down: u64,
}

impl BranchView for AllUp<'_> {
    fn active(&self, b: BranchId) -> bool {
        self.down & (1u64 << b) != 0 || self.i.active(b)
    }
    fn space(&self, b: BranchId) -> Option<(u64, u64)> {
        BranchView::space(self.i, b)
    }
}

/// Does mode `m` differ from the file's current mode only by clearing setuid and/or
/// setgid?
fn only_clears_suid_sgid(cur: &Attr, m: u32) -> bool {
    let (old, new) = (cur.perm as u32 & 0o7777, m & 0o7777);
    let cleared = old & !new;
    new != old && new & !old == 0 && cleared & !(libc::S_ISUID | libc::S_ISGID) == 0
}

/// POSIX permission rules for setattr by `ctx`. `via_writable`: the change comes through a
/// handle open for writing (ftruncate; permission was checked at open).
///
/// A mode change is the owner's, with one exception: when a user who may write a regular
/// file writes or truncates it, Linux's FUSE client (without handle_killpriv) clears
/// setuid (and setgid when group-execute is set) by sending the new mode *as that user*,
/// with a truncate in the same request as the size. Such a change — one that only clears
/// setuid and/or setgid — is allowed to anyone who may write the file, as ext4 allows the
/// write that causes it. An explicit chmod by a non-owner never gets here under
/// `default_permissions` (the kernel refuses it first); without it, a writer could clear
/// these bits by chmod too, which a one-byte rewrite would do anyway.
fn check_setattr(
    ctx: &Ctx,
    cur: &Attr,
    acl: Option<&cairn_vfs::acl::Acl>,
    set: &SetAttr,
    via_writable: bool,
) -> Result<()> {
    if ctx.is_root() {
        return Ok(());
    }
    let owner = ctx.uid == cur.uid;
    let may = |want| ctx.permission(owner_of(cur), acl, want);
    if let Some(m) = set.mode
        && !owner
    {
        let may_write = via_writable || may(Access::W).is_ok();
        let kill_priv = cur.kind == FileKind::RegularFile && only_clears_suid_sgid(cur, m);
        if !(kill_priv && may_write) {
            return Err(err(libc::EPERM));
        }
    }
    if let Some(u) = set.uid
        && u != cur.uid
    {
        return Err(err(libc::EPERM));
    }
    if let Some(g) = set.gid
        && g != cur.gid
        && (!owner || !ctx.in_group(g))
    {
        return Err(err(libc::EPERM));
    }
    let explicit = |t: Option<SetTime>| matches!(t, Some(SetTime::At(_)));
    if (explicit(set.atime) || explicit(set.mtime)) && !owner {
        return Err(err(libc::EPERM));
    }
    if (set.atime.is_some() || set.mtime.is_some()) && !owner {
        may(Access::W).map_err(|_| err(libc::EACCES))?;
    }
    if set.size.is_some() && set.fh.is_none() {
        may(Access::W)?;
    }
    Ok(())
}

/// The permission rules' view of an object's attributes (flags are the host's to enforce).
pub(crate) fn owner_of(a: &Attr) -> cairn_vfs::perm::Owner {
    cairn_vfs::perm::Owner {
        mode: a.kind.mode_bits() | a.perm as u32,
        uid: a.uid,
        gid: a.gid,
        flags: 0,
    }
}

impl FileSystem for Umbrella {
    fn root_ino(&self) -> Ino {
        ROOT
    }

    fn cache_policy(&self) -> KernelCachePolicy {
        // Every change goes through this mount, so the kernel may cache; no writeback cache,
        // because ENOSPC must reach us at write time to overflow, and the branch file
        // system keeps the authoritative mtime.
        KernelCachePolicy {
            writeback_cache: cairn_vfs::WritebackCache::Never,
            entry_ttl: Duration::from_secs(1),
            attr_ttl: Duration::from_secs(1),
            negative_ttl: Duration::from_secs(1),
        }
    }

    fn posix_acls(&self) -> bool {
        self.inner.acls
    }

    /// The mount's rule, applied at open ([`Inner::atime_due`]). The branch makes each
    /// update, so a branch whose own rule updates less often than the mount's (a
    /// `relatime` branch under a `strictatime` mount, any rule on a `noatime` branch)
    /// gives the mount its own rule only: said here once per branch, with the way out.
    fn set_atime(&self, policy: cairn_vfs::Atime) {
        *self.inner.atime.lock() = policy;
        for br in self.inner.branches.read().iter() {
            let root = br.root();
            let Ok(v) = br.run_quick(move || sys::fstatvfs(root.as_fd()), Duration::from_secs(1))
            else {
                continue;
            };
            let own = branch_atime(v.flag);
            if atime_rank(own) < atime_rank(policy) {
                warn!(
                    "branch {}: mounted with {own:?} access times, which is all this mount \
                     can give for its files there, not {policy:?}; remount the branch with \
                     a rule at least as strict (`mount -o remount,strictatime`) for the \
                     mount's own",
                    br.name
                );
            } else if atime_rank(own) > atime_rank(policy) {
                info!(
                    "branch {}: mounted with {own:?} access times, stricter than this \
                     mount's {policy:?}: its files are not passed through to the kernel \
                     (their reads would move access times by the branch's rule); remount \
                     the branch with this mount's rule to have both",
                    br.name
                );
            }
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        let i = &self.inner;
        let errors = i.policy().errors;
        let (mut bytes, mut free, mut avail, mut files, mut ffree, mut namelen) =
            (0u128, 0u128, 0u128, 0u64, 0u64, 255u32);
        let branches = i.branches.read().clone();
        let mut started = Vec::new();
        for b in &branches {
            match b.state() {
                State::Removed => continue,
                s if s.down() && errors == ErrorMode::Or => return Err(err(libc::EIO)),
                s if s.down() => continue,
                _ => {}
            }
            let root = b.root();
            started.push((b.clone(), b.start(move || sys::fstatvfs(root.as_fd()))));
        }
        for (b, p) in started {
            let s = match b.finish(p) {
                Ok(s) => s,
                Err(e) if errors == ErrorMode::Or => return Err(ioerr(e)),
                Err(_) => continue,
            };
            bytes += s.blocks as u128 * s.frsize as u128;
            free += s.bfree as u128 * s.frsize as u128;
            avail += s.bavail as u128 * s.frsize as u128;
            files += s.files;
            ffree += s.ffree;
            namelen = namelen.min(s.namemax as u32);
        }
        let bs = 4096u128;
        Ok(StatFs {
            blocks: (bytes / bs) as u64,
            bfree: (free / bs) as u64,
            bavail: (avail / bs) as u64,
            files,
            ffree,
            bsize: bs as u32,
            namelen,
            frsize: bs as u32,
        })
    }

    fn lookup(&self, _ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<Attr> {
        self.inner.lookup_in(parent, name, true)
    }

    fn forget(&self, ino: Ino, nlookup: u64) {
        let mut nodes = self.inner.nodes.lock();
        if let Some(n) = nodes.files.get_mut(&ino) {
            n.nlookup = n.nlookup.saturating_sub(nlookup);
        }
        self.inner.maybe_drop(&mut nodes, ino);
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        // An open file answers from its descriptor (lock order: this may wait for a
        // migration of the file, which holds the write side).
        if let Some(h) = self.inner.any_handle(ino)
            && let Ok(st) = h.io(|fd| sys::fstat(fd.as_fd()))
        {
            return Ok(sys::attr_from(&st, ino));
        }
        match self.inner.attr_of(ino) {
            Err(e) if e.errno() == Errno(libc::ENOENT) => {
                self.inner.removed_dir_attr(ino).unwrap_or(Err(e))
            }
            r => r,
        }
    }

    fn setattr(&self, ctx: &Ctx, ino: Ino, set: SetAttr) -> Result<Attr> {
        let is_dir = self.inner.ns.read().dirs.contains_key(&ino);
        if is_dir {
            self.inner.setattr_dir(ctx, ino, &set)
        } else {
            self.inner.setattr_file(ctx, ino, &set)
        }
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let i = &self.inner;
        let _shape = i.shape.read_recursive();
        let (b, name) = i.file_loc(ino)?;
        let (dir, name) = name.ok_or_else(|| err(libc::ENOENT))?;
        let br = i.branch(b)?;
        let pfd = br.dir(&i.rel(dir)).map_err(ioerr)?;
        br.run(move || sys::readlinkat(pfd.as_fd(), &name))
            .map_err(ioerr)
    }

    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let kind = FileKind::from_mode(mode).ok_or_else(|| err(libc::EINVAL))?;
        if kind == FileKind::Directory || kind == FileKind::Symlink {
            return Err(err(libc::EINVAL));
        }
        let fmt = mode & libc::S_IFMT;
        self.inner
            .make_node(
                ctx,
                parent,
                name,
                kind,
                mode & 0o7777,
                umask,
                Make::Node(fmt, rdev as u64),
            )
            .map(|(a, _)| a)
    }

    fn mkdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr> {
        self.inner
            .make_node(
                ctx,
                parent,
                name,
                FileKind::Directory,
                mode & 0o7777,
                umask,
                Make::Dir,
            )
            .map(|(a, _)| a)
    }

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        let i = &self.inner;
        if parent == ROOT && name == META {
            return Err(err(libc::ENOENT));
        }
        // Wait for a migration of this file in progress: it then sees the name gone and
        // removes its copy before unlink returns, so the space is back when the caller
        // looks (lock order: the file's mig lock first).
        let mig = match i.entry_of(parent, name)? {
            (Some(Entry::File(b)), rel) => i.stat_in(b, &rel, name).ok().and_then(|(_, st)| {
                let nodes = i.nodes.lock();
                let ino = nodes.keymap.get(&(st.st_dev, st.st_ino))?;
                nodes.files.get(ino).map(|n| n.mig.clone())
            }),
            _ => None,
        };
        let _moving = mig.as_ref().map(|m| m.lock());
        let _shape = i.shape.read_recursive();
        let _dl = i.lock_dirs(&[parent]);
        let (b, rel) = match i.entry_of(parent, name)? {
            (None, _) => return Err(err(libc::ENOENT)),
            (Some(Entry::Dir(_)), _) => return Err(err(libc::EISDIR)),
            (Some(Entry::File(b)), rel) => (b, rel),
        };
        let pa = i.check_parent_write(ctx, parent)?;
        let (pfd, st) = i.stat_in(b, &rel, name)?;
        i.check_sticky(ctx, &pa, &sys::attr_from(&st, 0))?;
        let br = i.branch(b)?;
        let n = name.to_os_string();
        br.run(move || sys::unlinkat(pfd.as_fd(), &n, false))
            .map_err(ioerr)?;
        i.ns.write().remove(parent, name);
        br.space_changed();
        let mut nodes = i.nodes.lock();
        let key = (st.st_dev, st.st_ino);
        if let Some(&ino) = nodes.keymap.get(&key) {
            if st.st_nlink <= 1 {
                // The host may reuse the inode number for a new file: it must get a new one
                // of ours too.
                nodes.keymap.remove(&key);
            }
            if let Some(n) = nodes.files.get_mut(&ino) {
                n.names.retain(|(dd, nn)| !(*dd == parent && nn == name));
            }
            i.maybe_drop(&mut nodes, ino);
        }
        Ok(())
    }

    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        let i = &self.inner;
        if name == "." {
            return Err(err(libc::EINVAL));
        }
        if name == ".." {
            return Err(err(libc::ENOTEMPTY));
        }
        let _shape = i.shape.read_recursive();
        let ino = match i.entry_of(parent, name)?.0 {
            None => return Err(err(libc::ENOENT)),
            Some(Entry::File(_)) => return Err(err(libc::ENOTDIR)),
            Some(Entry::Dir(ino)) => ino,
        };
        // The parent's entries and the victim's (nothing is created in it meanwhile).
        let _dl = i.lock_dirs(&[parent, ino]);
        if i.entry_of(parent, name)?.0 != Some(Entry::Dir(ino)) {
            return Err(err(libc::ENOENT));
        }
        let pa = i.check_parent_write(ctx, parent)?;
        let victim = i.dir_attr(ino)?;
        i.check_sticky(ctx, &pa, &victim)?;
        let (prel, branches, empty) = {
            let ns = i.ns.read();
            let dd = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
            i.merged_check(dd)?;
            (ns.rel(parent), i.dir_branches(dd), dd.children.is_empty())
        };
        if !empty {
            // The host refuses an immutable or append-only parent or victim (EPERM) before
            // it looks at the victim's entries (`may_delete` runs before the emptiness
            // check), so a refusal here must not be ENOTEMPTY either (generic/079).
            for d in [parent, ino] {
                if crate::xattr::get_flags(i, d)? & cairn_vfs::fileattr::RESTRICTING != 0 {
                    return Err(err(libc::EPERM));
                }
            }
            return Err(err(libc::ENOTEMPTY));
        }
        let mut failed = None;
        for b in branches {
            let (bb, prel, n) = (b.clone(), prel.clone(), name.to_os_string());
            let r = b.run(move || {
                bb.dir_here(&prel)
                    .and_then(|p| sys::unlinkat(p.as_fd(), &n, true))
            });
            match r {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => {
                    warn!("rmdir of a copy on '{}': {e}", b.name);
                    let stop = sys::errno(&e) == libc::ENOTEMPTY;
                    failed = Some(e);
                    if stop {
                        break;
                    }
                }
            }
        }
        if let Some(e) = failed {
            // Copies already removed are re-created lazily when needed; the index keeps the
            // directory so nothing under it is lost.
            i.forget_dirs();
            return Err(ioerr(e));
        }
        i.ns.write().remove(parent, name);
        i.forget_dirs();
        Ok(())
    }

    fn symlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr, target: &[u8]) -> Result<Attr> {
        self.inner
            .make_node(
                ctx,
                parent,
                name,
                FileKind::Symlink,
                0o777,
                0,
                Make::Symlink(target.to_vec()),
            )
            .map(|(a, _)| a)
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        crate::rename::rename(&self.inner, ctx, parent, name, new_parent, new_name, flags)
    }

    fn link(&self, ctx: &Ctx, ino: Ino, new_parent: Ino, new_name: &OsStr) -> Result<Attr> {
        let i = &self.inner;
        i.check_new_name(new_parent, new_name)?;
        // The file's mig lock: a migration of it gathered its names before this one exists
        // and holds only the locks of *those* names' directories, so without it the link
        // could land on the source between the migration's check and its unlinks, leaving
        // two objects where there was one.
        let mig = i.nodes.lock().files.get(&ino).map(|n| n.mig.clone());
        let _moving = mig.as_ref().map(|m| m.lock());
        let _shape = i.shape.read_recursive();
        let _dl = i.lock_dirs(&[new_parent]);
        {
            let ns = i.ns.read();
            if ns.dirs.contains_key(&ino) {
                return Err(err(libc::EPERM));
            }
            let d = ns
                .dirs
                .get(&new_parent)
                .ok_or_else(|| i.not_dir_or_stale(new_parent))?;
            if i.visible_entry(d, new_name)?.is_some() {
                return Err(err(libc::EEXIST));
            }
        }
        i.check_parent_write(ctx, new_parent)?;
        let (b, name) = i.file_loc(ino)?;
        let (odir, oname) = name.ok_or_else(|| err(libc::ENOENT))?;
        let br = i.branch(b)?;
        let ofd = br.dir(&i.rel(odir)).map_err(ioerr)?;
        // The new name goes on the file's branch, creating the directory there if needed:
        // a link never fails with EXDEV (issue 3 item 3).
        let nfd = i.ensure_dir(new_parent, b)?;
        let nn = new_name.to_os_string();
        let st = br
            .run(move || {
                sys::linkat(ofd.as_fd(), &oname, nfd.as_fd(), &nn)?;
                sys::fstatat(nfd.as_fd(), &nn)
            })
            .map_err(ioerr)?;
        i.ns.write()
            .dirs
            .get_mut(&new_parent)
            .ok_or_else(|| err(libc::ENOENT))?
            .children
            .insert(new_name.to_os_string(), Entry::File(b));
        let ino2 = i.node_seen(new_parent, new_name, b, &st, 1);
        Ok(sys::attr_from(&st, ino2))
    }

    fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Fh> {
        self.inner.open_existing(ctx, ino, flags)
    }

    fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        let i = &self.inner;
        // Under `noatime` no read through the new file's handle moves its atime (the
        // daemon made the file, so O_NOATIME is allowed on it). Under the other rules a
        // new file's first read is due anyway: its atime is its mtime.
        let host_flags = if *i.atime.lock() == cairn_vfs::Atime::Never {
            flags | libc::O_NOATIME
        } else {
            flags
        };
        let r = i.make_node(
            ctx,
            parent,
            name,
            FileKind::RegularFile,
            mode & 0o7777,
            umask,
            Make::File(host_flags),
        );
        match r {
            Ok((a, fd)) => {
                let fd = fd.ok_or_else(|| err(libc::EIO))?;
                let (b, _) = i.file_loc(a.ino)?;
                let kill = perm::handle_flags(ctx, 0, a.gid);
                let fh = i.new_handle(a.ino, flags & KEEP_FLAGS & !libc::O_TRUNC, kill, fd, b)?;
                Ok((a, fh))
            }
            Err(e) if e.errno().0 == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                let a = self.lookup(ctx, parent, name)?;
                let fh = i.open_existing(ctx, a.ino, flags)?;
                Ok((self.getattr(a.ino)?, fh))
            }
            Err(e) => Err(e),
        }
    }

    /// Refused (EOPNOTSUPP): every file of the layer is a name on a branch, which is how
    /// it finds, places, moves and recovers files; an unnamed one would be a node that no
    /// rule, migration or recovery could handle (docs/UMBRELLA.md).
    fn tmpfile(
        &self,
        _ctx: &Ctx,
        _parent: Ino,
        _mode: u32,
        _umask: u32,
        _flags: i32,
    ) -> Result<(Attr, Fh)> {
        Err(err(libc::EOPNOTSUPP))
    }

    fn read(&self, _ino: Ino, fh: Fh, offset: u64, size: u32, buf: &mut Vec<u8>) -> Result<()> {
        let h = self.inner.handle(fh)?;
        let g = h.fd.read();
        if g.branch.exec.isolated() {
            let fd = g.fd.clone();
            let v = g
                .branch
                .run(move || read_full(&fd, offset, size as usize))
                .map_err(ioerr)?;
            *buf = v;
            return Ok(());
        }
        buf.clear();
        buf.resize(size as usize, 0);
        let done = read_into(&g.fd, offset, buf).map_err(ioerr)?;
        buf.truncate(done);
        Ok(())
    }

    fn write(&self, _ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.inner.handle(fh)?;
        h.may_change(h.flags & libc::O_APPEND != 0)?;
        h.remove_privs().map_err(ioerr)?;
        self.inner.write_overflowing(&h, offset, data)
    }

    fn release(&self, ino: Ino, fh: Fh) -> Result<()> {
        let i = &self.inner;
        let h = match i.open.lock().remove(&fh) {
            Some(Open::File(h)) => Some(h),
            _ => None,
        };
        let last = i.nodes.lock().files.get(&ino).is_some_and(|n| n.open == 1);
        let misplaced = match &h {
            Some(h) if last => i.misplaced_via(ino, h),
            _ => false,
        };
        drop(h);
        let now_closed = {
            let mut nodes = i.nodes.lock();
            let r = match nodes.files.get_mut(&ino) {
                Some(n) => {
                    n.open = n.open.saturating_sub(1);
                    n.handles.retain(|w| w.strong_count() > 0);
                    n.open == 0 && !n.names.is_empty()
                }
                None => false,
            };
            i.maybe_drop(&mut nodes, ino);
            r
        };
        if now_closed && misplaced {
            // Migration on last close (§2.2): the worker re-evaluates and moves.
            i.queue_check(ino);
        }
        Ok(())
    }

    fn backing_fd(&self, ino: Ino, fh: Fh) -> Option<OwnedFd> {
        self.inner.backing_fd(ino, fh)
    }

    fn fsync(&self, _ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        let h = self.inner.handle(fh)?;
        h.io(move |fd| sys::fsync(fd.as_fd(), datasync))
            .map_err(ioerr)
    }

    fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<Fh> {
        let i = &self.inner;
        if !i.ns.read().dirs.contains_key(&ino) {
            return Err(i.not_dir_or_stale(ino));
        }
        let a = i.dir_attr(ino)?;
        i.permit(ctx, ino, &a, Access::R)?;
        // The first copy's descriptor (from the branch's cache: dir_attr just used it).
        let copy = {
            let ns = i.ns.read();
            ns.dirs
                .get(&ino)
                .and_then(|d| i.dir_branches(d).into_iter().next())
                .map(|b| (b, ns.rel(ino)))
        }
        .and_then(|(b, rel)| b.dir(&rel).ok().map(|fd| (b, fd)));
        let fh = i.next_fh.fetch_add(1, Ordering::Relaxed);
        let d = OpenDir {
            ino,
            listing: Arc::new(Mutex::new(None)),
            copy,
        };
        i.open.lock().insert(fh, Open::Dir(d));
        Ok(fh)
    }

    fn readdir(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        plus: bool,
        emit: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let i = &self.inner;
        let slot = match i.open.lock().get(&fh) {
            Some(Open::Dir(d)) => d.listing.clone(),
            _ => return Err(err(libc::EBADF)),
        };
        let mut slot = slot.lock();
        if offset == 0 || slot.is_none() {
            *slot = Some(i.list_dir(ino)?);
        }
        let listing = slot.as_ref().expect("listing");
        for (idx, (name, eino, kind)) in listing.entries.iter().enumerate().skip(offset as usize) {
            let attr = if plus && name != "." && name != ".." {
                match i.lookup_in(ino, name, false) {
                    Ok(a) => Some(a),
                    // Gone since the listing was taken, or on a branch that stopped
                    // answering since.
                    Err(_) => continue,
                }
            } else {
                None
            };
            let e = DirEntry {
                ino: attr.map_or(*eino, |a| a.ino),
                next_offset: idx as u64 + 1,
                kind: *kind,
                name,
                attr,
            };
            if !emit(e) {
                break;
            }
            if let Some(a) = attr
                && a.kind != FileKind::Directory
            {
                // The kernel counts a lookup for every entry it accepted.
                let mut nodes = i.nodes.lock();
                if let Some(n) = nodes.files.get_mut(&a.ino) {
                    n.nlookup += 1;
                }
            }
        }
        Ok(())
    }

    fn releasedir(&self, _ino: Ino, fh: Fh) -> Result<()> {
        self.inner.open.lock().remove(&fh);
        Ok(())
    }

    fn fsyncdir(&self, ino: Ino, _fh: Fh, _datasync: bool) -> Result<()> {
        let i = &self.inner;
        let _shape = i.shape.read_recursive();
        let (rel, branches) = {
            let ns = i.ns.read();
            let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
            (ns.rel(ino), i.dir_branches(d))
        };
        for b in branches {
            let (bb, rel) = (b.clone(), rel.clone());
            b.run(move || sys::fsync(bb.open_dir_here(&rel)?.as_fd(), false))
                .map_err(ioerr)?;
        }
        Ok(())
    }

    fn setxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        crate::xattr::set(&self.inner, ctx, ino, name, Some(value), flags)
    }

    fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        crate::xattr::get(&self.inner, ctx, ino, Some(name))
    }

    fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<u8>> {
        crate::xattr::get(&self.inner, ctx, ino, None)
    }

    fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<()> {
        crate::xattr::set(&self.inner, ctx, ino, name, None, 0)
    }

    fn access(&self, ctx: &Ctx, ino: Ino, mask: Access) -> Result<()> {
        let a = self.getattr(ino)?;
        self.inner.permit(ctx, ino, &a, mask)
    }

    fn get_flags(&self, _ctx: &Ctx, ino: Ino) -> Result<u32> {
        crate::xattr::get_flags(&self.inner, ino)
    }

    fn set_flags(&self, ctx: &Ctx, ino: Ino, flags: u32) -> Result<()> {
        crate::xattr::set_flags(&self.inner, ctx, ino, flags)
    }

    fn fallocate(
        &self,
        _ino: Ino,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: FallocMode,
    ) -> Result<()> {
        let h = self.inner.handle(fh)?;
        h.may_change(mode & !libc::FALLOC_FL_KEEP_SIZE == 0)?;
        h.remove_privs().map_err(ioerr)?;
        let end = offset.saturating_add(length);
        let grows = mode & libc::FALLOC_FL_KEEP_SIZE == 0;
        // The file's size after the call, and what the call needs on its branch: the end of
        // the range less what the file already holds (exact for a file without holes).
        let need = |size: u64, allocated: u64| (size.max(end), end.saturating_sub(allocated));
        // A plain allocation whose range clearly does not fit on the file's branch (by its
        // space reading, cached for 200 ms: the usual fallocate that fits makes no statvfs
        // of its own) moves the file first: tried there, tmpfs would take the free pages
        // and give them back only on failing, and a concurrent writer on the branch would
        // meet that transient fill. A failure here is not final: the call then tries in
        // place. A call that needs nothing more never moves the file (even on a full
        // branch).
        if mode == 0
            && let Ok(st) = h.io(|fd| sys::fstat(fd.as_fd()))
        {
            let (total, here) = need(st.st_size as u64, (st.st_blocks as u64).saturating_mul(512));
            if here > 0
                && let Ok((b, _)) = self.inner.file_loc(h.ino)
                && !self.inner.has_room(b, here)
            {
                let _ = self.inner.overflow(h.ino, total, Some(here));
            }
        }
        let op = || h.io(move |fd| sys::fallocate(fd.as_fd(), mode, offset, length));
        if grows {
            self.inner.overflowing(&h, need, op)
        } else {
            op().map_err(ioerr)
        }
    }

    fn lseek(&self, _ino: Ino, fh: Fh, offset: u64, whence: i32) -> Result<u64> {
        let h = self.inner.handle(fh)?;
        h.io(move |fd| sys::lseek(fd.as_fd(), offset, whence))
            .map_err(ioerr)
    }

    fn sync_all(&self) -> Result<()> {
        let branches = self.inner.branches.read().clone();
        for b in branches {
            if b.active() {
                let root = b.root();
                b.run(move || sys::syncfs(root.as_fd())).map_err(ioerr)?;
            }
        }
        Ok(())
    }

    fn destroy(&self) -> Result<()> {
        let i = &self.inner;
        if let Some(j) = i.enforce.lock().clone() {
            j.cancel();
        }
        i.quiesce();
        self.sync_all()?;
        // Without a saved index the next mount scans the branches: slower, not wrong.
        if let Err(e) = i.save_index() {
            warn!("{e}; the next mount rebuilds the index by scanning");
        }
        Ok(())
    }

    fn stats_json(&self) -> String {
        crate::admin::status(&self.inner).to_string()
    }
}

/// The access-time rule a file system mounted with `flag` (statvfs's `f_flag`) applies.
fn branch_atime(flag: u64) -> cairn_vfs::Atime {
    if flag & libc::ST_NOATIME != 0 {
        cairn_vfs::Atime::Never
    } else if flag & libc::ST_RELATIME != 0 {
        cairn_vfs::Atime::Relative
    } else {
        cairn_vfs::Atime::Strict
    }
}

/// Rules by how often they move an access time: each moves it whenever the one before does.
fn atime_rank(a: cairn_vfs::Atime) -> u8 {
    match a {
        cairn_vfs::Atime::Never => 0,
        cairn_vfs::Atime::Relative => 1,
        cairn_vfs::Atime::Strict => 2,
    }
}

/// Reads up to `buf.len()` bytes at `offset`; the count read (short at end of file).
fn read_into(fd: &OwnedFd, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0usize;
    while done < buf.len() {
        match sys::pread(fd.as_fd(), &mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn read_full(fd: &OwnedFd, offset: u64, size: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; size];
    let n = read_into(fd, offset, &mut v)?;
    v.truncate(n);
    Ok(v)
}

/// Returns the config file the mount was started with.
pub(crate) fn config_path(i: &Inner) -> Option<std::path::PathBuf> {
    i.config_path.lock().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(perm: u32, uid: u32, gid: u32) -> Attr {
        let t = SystemTime::UNIX_EPOCH;
        Attr {
            ino: 2,
            generation: 0,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: FileKind::RegularFile,
            perm: perm as u16,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn chmod(m: u32) -> SetAttr {
        SetAttr {
            mode: Some(m),
            ..Default::default()
        }
    }

    /// Issue 9 §6: the mode change a write or truncate sends as a non-owner.
    #[test]
    fn a_writer_may_only_clear_setuid_and_setgid() {
        let writer = Ctx::user(20, 20);
        let f = file(0o6666, 10, 10);
        for m in [0o2666, 0o4666, 0o0666] {
            assert!(
                check_setattr(&writer, &f, None, &chmod(m), false).is_ok(),
                "{m:o}"
            );
        }
        // With a size, as a truncate sends it.
        let trunc = SetAttr {
            size: Some(3),
            ..chmod(0o2666)
        };
        assert!(check_setattr(&writer, &f, None, &trunc, false).is_ok());
        // Anything else stays the owner's.
        for m in [0o6666 | 0o1000, 0o6644, 0o6766, 0o6666, 0o2667] {
            assert!(
                check_setattr(&writer, &f, None, &chmod(m), false).is_err(),
                "{m:o}"
            );
        }
        // Only for someone who may write the file (or writes through a writable handle).
        let ro = file(0o6644, 10, 10);
        assert!(check_setattr(&writer, &ro, None, &chmod(0o2644), false).is_err());
        assert!(check_setattr(&writer, &ro, None, &chmod(0o2644), true).is_ok());
        // Only for regular files.
        let mut d = file(0o2777, 10, 10);
        d.kind = FileKind::Directory;
        assert!(check_setattr(&writer, &d, None, &chmod(0o0777), false).is_err());
    }
}
