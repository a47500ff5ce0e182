//! The unified namespace: [`Umbrella`] implements [`cairn_vfs::FileSystem`] over the
//! branches.
//!
//! Locking, outermost first (every path takes them in this order, so none deadlocks):
//! 1. a file's `mig` mutex: held by a migration for its whole length, and briefly by open,
//!    unlink and setattr, so a file is never opened, unlinked or changed while it is being
//!    copied;
//! 2. a handle's descriptor lock, *write* side: held by the migration of an open file
//!    (overflow) from before it takes the source's identity to the end, so no write lands
//!    on the source after the copy;
//! 3. `ns` (the location index): read for lookups and attribute reads, write for every
//!    namespace change and for a migration's commit; host calls that change names run
//!    under the write lock, so the index and the branches change together;
//! 4. `nodes` (file nodes and the inode map): short critical sections only;
//! 5. a handle's descriptor lock, *read* side, for I/O. Under `ns` it is only tried
//!    (`try_read`), unless the file's `mig` is held: a migration holding the write side
//!    waits for `ns`, so blocking on it there would deadlock.
//!
//! Inode numbers: the root is 1, directories get a number when they enter the index, files
//! one per host object `(st_dev, st_ino)`, kept for the life of the mount (a migration
//! moves the host object but keeps our number).

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use cairn_vfs::{
    Access, Attr, Ctx, DirEntry, Errno, FallocMode, Fh, FileKind, FileSystem, FsError, Ino,
    KernelCachePolicy, RenameFlags, Result, SetAttr, SetTime, StatFs,
};
use log::{debug, info, warn};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::branch::{Branch, DirFd, META, State};
use crate::config::{Config, ErrorMode};
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
    pub fd: RwLock<OwnedFd>,
}

struct Listing {
    entries: Vec<(OsString, Ino, FileKind)>,
}

enum Open {
    File(Arc<Handle>),
    Dir(Arc<Mutex<Option<Listing>>>),
}

/// The policy in force (replaced whole by reload).
pub(crate) struct Policy {
    pub rules: RuleSet,
    pub errors: ErrorMode,
    pub min_free: Amount,
    pub enforce_rate: Option<u64>,
    pub enforce_interval: Option<Duration>,
    pub index_branch: BranchId,
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
    pub work_tx: Mutex<Option<std::sync::mpsc::Sender<Ino>>>,
    pub stopping: AtomicBool,
    pub config_path: Mutex<Option<std::path::PathBuf>>,
    pub enforce: Mutex<Option<Arc<crate::enforce::Job>>>,
    /// Bumped whenever a branch joins, leaves or fails. Added (in nanoseconds) to the
    /// mtime reported for directories: the kernel keeps directory listings cached until a
    /// directory's mtime changes, and a branch change alters listings without touching any
    /// host directory. Zero (exact times) on a mount whose branches never changed.
    pub epoch: AtomicU64,
    pub failpoints: crate::failpoint::Failpoints,
}

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
        let mut branches = Vec::new();
        for (i, b) in cfg.branches.iter().enumerate() {
            let br = Branch::open(i, &b.name, b.path.clone())
                .map_err(|e| format!("branch '{}' ({}): {e}", b.name, b.path.display()))?;
            branches.push(Arc::new(br));
        }
        let policy = Policy {
            rules: cfg.rules.clone(),
            errors: cfg.errors,
            min_free: cfg.min_free,
            enforce_rate: cfg.enforce_rate,
            enforce_interval: cfg.enforce_interval,
            index_branch: cfg.index,
        };
        let inner = Arc::new(Inner {
            branches: RwLock::new(branches),
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
            work_tx: Mutex::new(None),
            stopping: AtomicBool::new(false),
            config_path: Mutex::new(Some(cfg.source.clone())),
            enforce: Mutex::new(None),
            epoch: AtomicU64::new(0),
            failpoints: Default::default(),
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
    /// are hidden; on failed branches they are hidden under `and` and give EIO under `or`.
    fn file_visible(&self, b: BranchId) -> Result<bool> {
        let st = self.branches.read().get(b).map(|x| x.state());
        match st {
            Some(State::Active) => Ok(true),
            Some(State::Failed) if self.policy().errors == ErrorMode::Or => Err(err(libc::EIO)),
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

    /// Under `or`, a failed branch holding a copy of this directory fails merged operations.
    pub(crate) fn merged_check(&self, d: &Dir) -> Result<()> {
        if self.policy().errors == ErrorMode::And {
            return Ok(());
        }
        let failed = self
            .branches
            .read()
            .iter()
            .any(|b| d.mask & (1u64 << b.id) != 0 && b.state() == State::Failed);
        if failed { Err(err(libc::EIO)) } else { Ok(()) }
    }

    pub fn dir_attr(&self, ns: &Tree, ino: Ino) -> Result<Attr> {
        let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
        let rel = ns.rel(ino);
        let mut last = err(libc::ENOENT);
        let mut found: Option<Attr> = None;
        for b in self.dir_branches(d) {
            match b.dir(&rel).and_then(|fd| sys::fstat(fd.as_fd())) {
                Ok(st) => {
                    let a = sys::attr_from(&st, ino);
                    match &mut found {
                        // The first copy gives mode and owner (all copies are kept equal);
                        // the times are the newest of any copy, since a name added on any
                        // branch changes the union directory.
                        Some(f) => {
                            f.mtime = f.mtime.max(a.mtime);
                            f.ctime = f.ctime.max(a.ctime);
                            f.atime = f.atime.max(a.atime);
                        }
                        None => found = Some(a),
                    }
                }
                Err(e) => last = ioerr(e),
            }
        }
        if let Some(mut a) = found {
            a.nlink = 2 + d.nsubdirs;
            a.mtime += Duration::from_nanos(self.epoch.load(Ordering::Relaxed));
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

    /// Host stat of a file entry, and the parent descriptor on its branch.
    pub fn stat_entry(
        &self,
        ns: &Tree,
        dir: Ino,
        name: &OsStr,
        b: BranchId,
    ) -> Result<(DirFd, sys::Stat)> {
        let br = self.branch(b)?;
        let pfd = br.dir(&ns.rel(dir)).map_err(ioerr)?;
        let st = sys::fstatat(pfd.as_fd(), name).map_err(ioerr)?;
        Ok((pfd, st))
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

    fn lookup_in(&self, ns: &Tree, parent: Ino, name: &OsStr, count: bool) -> Result<Attr> {
        if name.len() > 255 {
            return Err(err(libc::ENAMETOOLONG));
        }
        let d = ns
            .dirs
            .get(&parent)
            .ok_or_else(|| self.not_dir_or_stale(parent))?;
        if parent == ROOT && name == META {
            return Err(err(libc::ENOENT));
        }
        match self.visible_entry(d, name)? {
            None => Err(err(libc::ENOENT)),
            Some(Entry::Dir(i)) => self.dir_attr(ns, i),
            Some(Entry::File(b)) => {
                let (_, st) = self.stat_entry(ns, parent, name, b)?;
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

    /// A file node's branch and one current name, under the caller's `ns` lock.
    pub(crate) fn file_loc(&self, ino: Ino) -> Result<(BranchId, Option<(Ino, OsString)>)> {
        let nodes = self.nodes.lock();
        let n = nodes.files.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
        Ok((n.branch, n.names.first().cloned()))
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

    /// The attributes of a file node, under the caller's `ns` lock.
    pub fn file_attr(&self, ns: &Tree, ino: Ino) -> Result<Attr> {
        // An open file is stat'ed through its descriptor: no path to resolve. Only tried:
        // an overflowing migration holds it while it waits for `ns` (lock order, above);
        // the path still names the source until that migration commits.
        if let Some(h) = self.any_handle(ino)
            && let Some(fd) = h.fd.try_read()
            && let Ok(st) = sys::fstat(fd.as_fd())
        {
            return Ok(sys::attr_from(&st, ino));
        }
        let (b, name) = self.file_loc(ino)?;
        if let Some((dir, name)) = name {
            match self.stat_entry(ns, dir, &name, b) {
                Ok((_, st)) => return Ok(sys::attr_from(&st, ino)),
                Err(e) if self.any_handle(ino).is_none() => return Err(e),
                Err(_) => {}
            }
        }
        // Unlinked but open: the descriptor still reaches it. (A migration never holds it:
        // one needs a name to move the file, and one that lost its name rolls back.)
        let h = self.any_handle(ino).ok_or_else(|| err(libc::ENOENT))?;
        let fd = h.fd.try_read().ok_or_else(|| err(libc::EAGAIN))?;
        let st = sys::fstat(fd.as_fd()).map_err(ioerr)?;
        Ok(sys::attr_from(&st, ino))
    }

    fn attr_of(&self, ns: &Tree, ino: Ino) -> Result<Attr> {
        if ns.dirs.contains_key(&ino) {
            self.dir_attr(ns, ino)
        } else {
            self.file_attr(ns, ino)
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
        let Ok(br) = self.branch(b) else { return false };
        let Some((free, total)) = br.space() else {
            return false;
        };
        let reserve = match self.policy().min_free {
            Amount::Bytes(n) => n,
            Amount::Percent(p) => (total as f64 * p / 100.0) as u64,
        };
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
    pub fn ensure_dir(&self, ns: &mut Tree, dir: Ino, b: BranchId) -> Result<DirFd> {
        let br = self.branch(b)?;
        let has = ns.dirs.get(&dir).ok_or_else(|| err(libc::ENOENT))?.mask & (1u64 << b) != 0;
        let rel = ns.rel(dir);
        if has {
            match br.dir(&rel) {
                Ok(fd) => return Ok(fd),
                // The index thought it was there (someone removed it behind our back):
                // recreate it below.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && dir != ROOT => {}
                Err(e) => return Err(ioerr(e)),
            }
        }
        if dir == ROOT {
            return br.dir(b"").map_err(ioerr);
        }
        let (parent, name) = {
            let d = &ns.dirs[&dir];
            (d.parent, d.name.clone())
        };
        let model = self.dir_attr(ns, dir).ok();
        let pfd = self.ensure_dir(ns, parent, b)?;
        let mode = model.map_or(0o755, |a| a.perm as u32);
        // A lazily made copy is not a change of the union parent: keep its times.
        let ptimes = sys::fstat(pfd.as_fd()).ok();
        match sys::mkdirat(pfd.as_fd(), &name, mode) {
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
                    let _ = sys::fchownat(pfd.as_fd(), &name, Some(a.uid), Some(a.gid));
                    // chown clears setgid on some file systems; put the mode back.
                    let _ = sys::fchmodat(pfd.as_fd(), &name, mode);
                    let _ = sys::utimensat(
                        pfd.as_fd(),
                        &name,
                        TimeSet::At(a.atime),
                        TimeSet::At(a.mtime),
                    );
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(ioerr(e)),
        }
        if let Some(d) = ns.dirs.get_mut(&dir) {
            d.mask |= 1u64 << b;
        }
        let mut child = rel.clone();
        if child.is_empty() {
            child = b".".to_vec();
        }
        br.dir(&child).map_err(ioerr)
    }

    pub(crate) fn check_parent_write(&self, ctx: &Ctx, ns: &Tree, parent: Ino) -> Result<Attr> {
        let pa = self.dir_attr(ns, parent)?;
        ctx.check(pa.perm as u32 | libc::S_IFDIR, pa.uid, pa.gid, Access::WX)?;
        Ok(pa)
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

    /// Picks the branch for a new object and creates it there with `make`, trying the
    /// rule's later branches when a branch is full (overflow).
    fn place<T>(
        &self,
        ns: &mut Tree,
        parent: Ino,
        name: &OsStr,
        facts: &Facts<'_>,
        mut make: impl FnMut(&DirFd) -> io::Result<T>,
    ) -> Result<(BranchId, T)> {
        let d = self.decide(facts, true);
        let mut last = err(libc::ENOSPC);
        let cands = d.candidates().to_vec();
        for (i, &b) in cands.iter().enumerate() {
            if !self.active(b) {
                continue;
            }
            // The last candidate is tried even when it looks full: the estimate may be
            // stale, and the branch answers ENOSPC itself if it really is full.
            if i + 1 < cands.len() && !self.has_room(b, facts.size) {
                continue;
            }
            let pfd = match self.ensure_dir(ns, parent, b) {
                Ok(fd) => fd,
                Err(e) if e.errno().0 == libc::ENOSPC => {
                    last = e;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match make(&pfd) {
                Ok(t) => {
                    if i > 0 {
                        self.counters.overflows.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Ok(br) = self.branch(b) {
                        br.space_changed();
                    }
                    return Ok((b, t));
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

    /// Creates a non-directory object by `make` (in the chosen branch's parent directory)
    /// and records it.
    fn make_node(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        kind: FileKind,
        perm: u32,
        make: &mut dyn FnMut(&DirFd, u32) -> io::Result<Option<OwnedFd>>,
    ) -> Result<(Attr, Option<OwnedFd>)> {
        self.check_new_name(parent, name)?;
        let mut ns = self.ns.write();
        let d = ns
            .dirs
            .get(&parent)
            .ok_or_else(|| self.not_dir_or_stale(parent))?;
        if self.visible_entry(d, name)?.is_some() {
            return Err(err(libc::EEXIST));
        }
        let pa = self.check_parent_write(ctx, &ns, parent)?;
        let gid = Self::new_gid(ctx, &pa);
        let path = ns.union_path(parent, name);
        let facts = Self::facts_new(&path, kind, perm, ctx.uid, gid);
        let (b, fd) = self.place(&mut ns, parent, name, &facts, |pfd| {
            let fd = make(pfd, perm)?;
            let owner = if kind == FileKind::Directory {
                None
            } else {
                Some(())
            };
            let _ = owner;
            if let Err(e) = sys::fchownat(pfd.as_fd(), name, Some(ctx.uid), Some(gid))
                && nix::unistd::geteuid().is_root()
            {
                let _ = sys::unlinkat(pfd.as_fd(), name, false);
                return Err(e);
            }
            // chown may have dropped setuid/setgid bits; restore the requested mode.
            if kind != FileKind::Symlink && perm & 0o6000 != 0 {
                let _ = sys::fchmodat(pfd.as_fd(), name, perm);
            }
            let st = sys::fstatat(pfd.as_fd(), name)?;
            Ok((fd, st))
        })?;
        let (fd, st) = fd;
        ns.dirs
            .get_mut(&parent)
            .expect("parent")
            .children
            .insert(name.to_os_string(), Entry::File(b));
        let ino = self.node_seen(parent, name, b, &st, 1);
        Ok((sys::attr_from(&st, ino), fd))
    }

    fn new_handle(&self, ino: Ino, flags: i32, fd: OwnedFd) -> Fh {
        let h = Arc::new(Handle {
            ino,
            flags,
            fd: RwLock::new(fd),
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
        fh
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
        let Ok(st) = sys::fstat(h.fd.read().as_fd()) else {
            return true;
        };
        let ns = self.ns.read();
        let Ok((b, Some((d, n)))) = self.file_loc(ino) else {
            return false;
        };
        let path = ns.union_path(d, &n);
        drop(ns);
        let a = sys::attr_from(&st, ino);
        let f = Facts::of(&path, &a, b);
        let d = self.decide(&f, false);
        self.target_for(&d, Some(b), a.size).is_some()
    }

    /// The branch file of an open handle, for the kernel to read and write directly (FUSE
    /// passthrough), or None when the writes must come through here. Passed-through writes
    /// never reach `write_overflowing`, so a branch filling up would give the application
    /// ENOSPC instead of a move to the next branch: only a file that could not overflow
    /// anyway qualifies (its rule allows one branch, overflow is forbidden, or it already
    /// sits on the rule's last branch). Migration on last close is unaffected: release
    /// still comes here and reads the size from the branch file.
    pub(crate) fn backing_fd(&self, ino: Ino, fh: Fh) -> Option<OwnedFd> {
        let h = self.handle(fh).ok()?;
        // A copy, so no handle lock is held while the namespace and nodes are consulted.
        let fd = h.fd.read().try_clone().ok()?;
        let st = sys::fstat(fd.as_fd()).ok()?;
        if sys::kind_of(st.st_mode) != FileKind::RegularFile {
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
        if can_overflow {
            return None;
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
        let ns = self.ns.read();
        let (b, name) = self.file_loc(ino)?;
        let (dir, name) = name.ok_or_else(|| err(libc::ENOENT))?;
        let (pfd, st) = self.stat_entry(&ns, dir, &name, b)?;
        let want = Access::for_open_flags(flags);
        ctx.check(st.st_mode, st.st_uid, st.st_gid, want)?;
        if sys::kind_of(st.st_mode) == FileKind::Directory {
            return Err(err(libc::EISDIR));
        }
        let fd = sys::openat(pfd.as_fd(), &name, flags & KEEP_FLAGS, 0).map_err(ioerr)?;
        drop(ns);
        Ok(self.new_handle(ino, flags & KEEP_FLAGS & !libc::O_TRUNC, fd))
    }

    /// Writes through a handle, moving the file to the rule's next branch when its branch
    /// is full (issue 3 item 3: invisible to the application).
    fn write_overflowing(&self, h: &Arc<Handle>, off: u64, data: &[u8]) -> Result<u32> {
        let mut moved = false;
        loop {
            let r = {
                let fd = h.fd.read();
                sys::pwrite(fd.as_fd(), data, off)
            };
            match r {
                Ok(n) => return Ok(n as u32),
                Err(e) if !moved && matches!(sys::errno(&e), libc::ENOSPC | libc::EDQUOT) => {
                    moved = true;
                    let size = {
                        let fd = h.fd.read();
                        sys::fstat(fd.as_fd())
                            .map(|s| s.st_size as u64)
                            .unwrap_or(0)
                    };
                    let need = size.max(off + data.len() as u64);
                    self.overflow(h.ino, need).map_err(|_| err(libc::ENOSPC))?;
                }
                Err(e) => return Err(ioerr(e)),
            }
        }
    }

    fn check_health(&self) {
        let branches = self.branches.read().clone();
        for b in branches {
            match b.state() {
                State::Removed => {}
                State::Active => {
                    if !b.healthy() {
                        warn!(
                            "branch '{}' ({}) stopped answering: marked failed",
                            b.name,
                            b.path.read().display()
                        );
                        b.set_state(State::Failed);
                        self.epoch.fetch_add(1, Ordering::Relaxed);
                    }
                }
                State::Failed => {
                    if b.healthy() || (b.reopen(None).is_ok() && b.healthy()) {
                        info!("branch '{}' is back", b.name);
                        b.set_state(State::Active);
                        self.epoch.fetch_add(1, Ordering::Relaxed);
                    }
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
        let ns = self.ns.read();
        let cur = self.file_attr(&ns, ino)?;
        let via = set.fh.and_then(|f| self.handle(f).ok());
        let via_writable = via
            .as_ref()
            .is_some_and(|h| h.flags & libc::O_ACCMODE != libc::O_RDONLY);
        check_setattr(ctx, &cur, set, via_writable)?;
        let (b, name) = self.file_loc(ino)?;
        let handle = via.or_else(|| self.any_handle(ino));
        let loc = match &name {
            Some((dir, n)) => {
                let br = self.branch(b)?;
                Some((br.dir(&ns.rel(*dir)).map_err(ioerr)?, n.clone()))
            }
            None => None,
        };
        if let Some(size) = set.size {
            if cur.kind != FileKind::RegularFile {
                return Err(err(libc::EINVAL));
            }
            match (&handle, &loc) {
                (Some(h), _) if h.flags & libc::O_ACCMODE != libc::O_RDONLY => {
                    sys::ftruncate(h.fd.read().as_fd(), size).map_err(ioerr)?
                }
                (_, Some((pfd, n))) => {
                    let fd = sys::openat(pfd.as_fd(), n, libc::O_WRONLY, 0).map_err(ioerr)?;
                    sys::ftruncate(fd.as_fd(), size).map_err(ioerr)?;
                }
                _ => return Err(err(libc::ENOENT)),
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            match &loc {
                Some((pfd, n)) => sys::fchownat(pfd.as_fd(), n, set.uid, set.gid).map_err(ioerr)?,
                None => {
                    let h = handle.as_ref().ok_or_else(|| err(libc::ENOENT))?;
                    sys::fchown(h.fd.read().as_fd(), set.uid, set.gid).map_err(ioerr)?
                }
            }
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
                match &loc {
                    Some((pfd, n)) => sys::fchmodat(pfd.as_fd(), n, m).map_err(ioerr)?,
                    None => {
                        let h = handle.as_ref().ok_or_else(|| err(libc::ENOENT))?;
                        sys::fchmod(h.fd.read().as_fd(), m).map_err(ioerr)?
                    }
                }
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let t = |x: Option<SetTime>| match x {
                None => TimeSet::Omit,
                Some(SetTime::Now) => TimeSet::Now,
                Some(SetTime::At(t)) => TimeSet::At(t),
            };
            match &loc {
                Some((pfd, n)) => {
                    sys::utimensat(pfd.as_fd(), n, t(set.atime), t(set.mtime)).map_err(ioerr)?
                }
                None => {
                    let h = handle.as_ref().ok_or_else(|| err(libc::ENOENT))?;
                    sys::futimens(h.fd.read().as_fd(), t(set.atime), t(set.mtime)).map_err(ioerr)?
                }
            }
        }
        let a = self.file_attr(&ns, ino)?;
        drop(ns);
        let open = self.nodes.lock().files.get(&ino).map_or(0, |n| n.open);
        if open == 0
            && (set.size.is_some() || set.mode.is_some() || set.uid.is_some() || set.gid.is_some())
        {
            self.queue_check(ino);
        }
        Ok(a)
    }

    fn setattr_dir(&self, ctx: &Ctx, ino: Ino, set: &SetAttr) -> Result<Attr> {
        let ns = self.ns.read();
        let cur = self.dir_attr(&ns, ino)?;
        check_setattr(ctx, &cur, set, false)?;
        if set.size.is_some() {
            return Err(err(libc::EISDIR));
        }
        let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
        self.merged_check(d)?;
        let rel = ns.rel(ino);
        let (prel, name) = if ino == ROOT {
            (Vec::new(), OsString::from("."))
        } else {
            (ns.rel(d.parent), d.name.clone())
        };
        let _ = rel;
        let mut mode = set.mode.map(|m| m & 0o7777);
        if let Some(m) = mode.as_mut()
            && !ctx.is_root()
            && *m & libc::S_ISGID != 0
            && !ctx.in_group(set.gid.unwrap_or(cur.gid))
        {
            *m &= !libc::S_ISGID;
        }
        // Every copy gets the change, so whichever copy answers getattr later agrees.
        for b in self.dir_branches(d) {
            let r = (|| -> io::Result<()> {
                let pfd = b.dir(&prel)?;
                if set.uid.is_some() || set.gid.is_some() {
                    sys::fchownat(pfd.as_fd(), &name, set.uid, set.gid)?;
                }
                if let Some(m) = mode {
                    sys::fchmodat(pfd.as_fd(), &name, m)?;
                }
                if set.atime.is_some() || set.mtime.is_some() {
                    let t = |x: Option<SetTime>| match x {
                        None => TimeSet::Omit,
                        Some(SetTime::Now) => TimeSet::Now,
                        Some(SetTime::At(t)) => TimeSet::At(t),
                    };
                    sys::utimensat(pfd.as_fd(), &name, t(set.atime), t(set.mtime))?;
                }
                Ok(())
            })();
            if let Err(e) = r {
                if self.policy().errors == ErrorMode::Or {
                    return Err(ioerr(e));
                }
                warn!("setattr of a directory copy on '{}': {e}", b.name);
            }
        }
        self.dir_attr(&ns, ino)
    }

    /// The merged listing of a directory: every visible name once, directories from any
    /// branch, files only from the branch the index says holds them.
    fn list_dir(&self, ino: Ino) -> Result<Listing> {
        let ns = self.ns.read();
        let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
        self.merged_check(d)?;
        let rel = ns.rel(ino);
        let parent = d.parent;
        let mut entries = vec![
            (OsString::from("."), ino, FileKind::Directory),
            (OsString::from(".."), parent, FileKind::Directory),
        ];
        let mut seen: HashSet<OsString> = HashSet::new();
        let errors = self.policy().errors;
        for b in self.dir_branches(d) {
            let listed = b
                .dir(&rel)
                .and_then(|p| {
                    sys::openat(
                        p.as_fd(),
                        OsStr::new("."),
                        libc::O_RDONLY | libc::O_DIRECTORY,
                        0,
                    )
                })
                .and_then(sys::read_dir);
            let host = match listed {
                Ok(h) => h,
                Err(e) if errors == ErrorMode::Or => return Err(ioerr(e)),
                Err(e) => {
                    warn!("listing a directory on '{}': {e}", b.name);
                    continue;
                }
            };
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
                        let kind = match FileKind::from_dtype(he.dtype) {
                            Some(k) => k,
                            None => b
                                .dir(&rel)
                                .and_then(|p| sys::fstatat(p.as_fd(), &name))
                                .map(|s| sys::kind_of(s.st_mode))
                                .unwrap_or(FileKind::RegularFile),
                        };
                        let fino = {
                            let mut nodes = self.nodes.lock();
                            self.ino_for(&mut nodes, (b.dev(), he.ino))
                        };
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
fn check_setattr(ctx: &Ctx, cur: &Attr, set: &SetAttr, via_writable: bool) -> Result<()> {
    if ctx.is_root() {
        return Ok(());
    }
    let owner = ctx.uid == cur.uid;
    if let Some(m) = set.mode
        && !owner
    {
        let may_write = via_writable
            || ctx
                .check(
                    cur.kind.mode_bits() | cur.perm as u32,
                    cur.uid,
                    cur.gid,
                    Access::W,
                )
                .is_ok();
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
        ctx.check(
            cur.kind.mode_bits() | cur.perm as u32,
            cur.uid,
            cur.gid,
            Access::W,
        )
        .map_err(|_| err(libc::EACCES))?;
    }
    if set.size.is_some() && set.fh.is_none() {
        ctx.check(
            cur.kind.mode_bits() | cur.perm as u32,
            cur.uid,
            cur.gid,
            Access::W,
        )?;
    }
    Ok(())
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
            writeback_cache: false,
            entry_ttl: Duration::from_secs(1),
            attr_ttl: Duration::from_secs(1),
            negative_ttl: Duration::from_secs(1),
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        let i = &self.inner;
        let errors = i.policy().errors;
        let (mut bytes, mut free, mut avail, mut files, mut ffree, mut namelen) =
            (0u128, 0u128, 0u128, 0u64, 0u64, 255u32);
        for b in i.branches.read().iter() {
            match b.state() {
                State::Removed => continue,
                State::Failed if errors == ErrorMode::Or => return Err(err(libc::EIO)),
                State::Failed => continue,
                State::Active => {}
            }
            let s = match sys::fstatvfs(b.root().as_fd()) {
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

    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<Attr> {
        let _ = ctx;
        let ns = self.inner.ns.read();
        self.inner.lookup_in(&ns, parent, name, true)
    }

    fn forget(&self, ino: Ino, nlookup: u64) {
        let mut nodes = self.inner.nodes.lock();
        if let Some(n) = nodes.files.get_mut(&ino) {
            n.nlookup = n.nlookup.saturating_sub(nlookup);
        }
        self.inner.maybe_drop(&mut nodes, ino);
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        // An open file answers from its descriptor, before `ns` (lock order: this may wait
        // for a migration of the file, which needs `ns` to finish).
        if let Some(h) = self.inner.any_handle(ino)
            && let Ok(st) = sys::fstat(h.fd.read().as_fd())
        {
            return Ok(sys::attr_from(&st, ino));
        }
        let ns = self.inner.ns.read();
        self.inner.attr_of(&ns, ino)
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
        let ns = self.inner.ns.read();
        let (b, name) = self.inner.file_loc(ino)?;
        let (dir, name) = name.ok_or_else(|| err(libc::ENOENT))?;
        let br = self.inner.branch(b)?;
        let pfd = br.dir(&ns.rel(dir)).map_err(ioerr)?;
        sys::readlinkat(pfd.as_fd(), &name).map_err(ioerr)
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
        let perm = mode & 0o7777 & !umask;
        let fmt = mode & libc::S_IFMT;
        self.inner
            .make_node(ctx, parent, name, kind, perm, &mut |pfd, perm| {
                sys::mknodat(pfd.as_fd(), name, fmt | perm, rdev as u64).map(|()| None)
            })
            .map(|(a, _)| a)
    }

    fn mkdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr> {
        let i = &self.inner;
        i.check_new_name(parent, name)?;
        let mut ns = i.ns.write();
        let d = ns
            .dirs
            .get(&parent)
            .ok_or_else(|| i.not_dir_or_stale(parent))?;
        if i.visible_entry(d, name)?.is_some() {
            return Err(err(libc::EEXIST));
        }
        let pa = i.check_parent_write(ctx, &ns, parent)?;
        let gid = Inner::new_gid(ctx, &pa);
        let mut perm = mode & 0o7777 & !umask;
        if pa.perm as u32 & libc::S_ISGID != 0 {
            perm |= libc::S_ISGID;
        }
        let path = ns.union_path(parent, name);
        let facts = Inner::facts_new(&path, FileKind::Directory, perm, ctx.uid, gid);
        let (b, ()) = i.place(&mut ns, parent, name, &facts, |pfd| {
            sys::mkdirat(pfd.as_fd(), name, perm)?;
            if let Err(e) = sys::fchownat(pfd.as_fd(), name, Some(ctx.uid), Some(gid))
                && nix::unistd::geteuid().is_root()
            {
                let _ = sys::unlinkat(pfd.as_fd(), name, true);
                return Err(e);
            }
            if perm & 0o7000 != 0 {
                let _ = sys::fchmodat(pfd.as_fd(), name, perm);
            }
            Ok(())
        })?;
        let ino = i.alloc_ino();
        ns.add_dir(parent, name, ino, 1u64 << b);
        i.dir_attr(&ns, ino)
    }

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        let i = &self.inner;
        // Wait for a migration of this file in progress: it then sees the name gone and
        // removes its copy before unlink returns, so the space is back when the caller
        // looks (lock order: the file's mig lock before the namespace lock).
        let mig = {
            let ns = i.ns.read();
            match ns.dirs.get(&parent).and_then(|d| d.children.get(name)) {
                Some(Entry::File(b)) => {
                    i.stat_entry(&ns, parent, name, *b)
                        .ok()
                        .and_then(|(_, st)| {
                            let nodes = i.nodes.lock();
                            let ino = nodes.keymap.get(&(st.st_dev, st.st_ino))?;
                            nodes.files.get(ino).map(|n| n.mig.clone())
                        })
                }
                _ => None,
            }
        };
        let _moving = mig.as_ref().map(|m| m.lock());
        let mut ns = i.ns.write();
        let d = ns
            .dirs
            .get(&parent)
            .ok_or_else(|| i.not_dir_or_stale(parent))?;
        if parent == ROOT && name == META {
            return Err(err(libc::ENOENT));
        }
        let b = match i.visible_entry(d, name)? {
            None => return Err(err(libc::ENOENT)),
            Some(Entry::Dir(_)) => return Err(err(libc::EISDIR)),
            Some(Entry::File(b)) => b,
        };
        let pa = i.check_parent_write(ctx, &ns, parent)?;
        let (pfd, st) = i.stat_entry(&ns, parent, name, b)?;
        i.check_sticky(ctx, &pa, &sys::attr_from(&st, 0))?;
        sys::unlinkat(pfd.as_fd(), name, false).map_err(ioerr)?;
        ns.remove(parent, name);
        if let Ok(br) = i.branch(b) {
            br.space_changed();
        }
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
        let mut ns = i.ns.write();
        let d = ns
            .dirs
            .get(&parent)
            .ok_or_else(|| i.not_dir_or_stale(parent))?;
        let ino = match i.visible_entry(d, name)? {
            None => return Err(err(libc::ENOENT)),
            Some(Entry::File(_)) => return Err(err(libc::ENOTDIR)),
            Some(Entry::Dir(ino)) => ino,
        };
        let pa = i.check_parent_write(ctx, &ns, parent)?;
        let victim = i.dir_attr(&ns, ino)?;
        i.check_sticky(ctx, &pa, &victim)?;
        let dd = &ns.dirs[&ino];
        i.merged_check(dd)?;
        if !dd.children.is_empty() {
            return Err(err(libc::ENOTEMPTY));
        }
        let prel = ns.rel(parent);
        let mut failed = None;
        for b in i.dir_branches(dd) {
            let r = b
                .dir(&prel)
                .and_then(|p| sys::unlinkat(p.as_fd(), name, true));
            match r {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => {
                    warn!("rmdir of a copy on '{}': {e}", b.name);
                    failed = Some(e);
                    if sys::errno(failed.as_ref().expect("set")) == libc::ENOTEMPTY {
                        break;
                    }
                }
            }
        }
        if let Some(e) = failed {
            i.forget_dirs();
            // Copies already removed are re-created lazily when needed; the index keeps the
            // directory so nothing under it is lost.
            if let Some(dd) = ns.dirs.get_mut(&ino) {
                let live: u64 = i.dir_branches(dd).iter().map(|b| 1u64 << b.id).sum();
                let _ = live;
            }
            return Err(ioerr(e));
        }
        ns.remove(parent, name);
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
                &mut |pfd, _| sys::symlinkat(target, pfd.as_fd(), name).map(|()| None),
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
        let mut ns = i.ns.write();
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
        i.check_parent_write(ctx, &ns, new_parent)?;
        let (b, name) = i.file_loc(ino)?;
        let (odir, oname) = name.ok_or_else(|| err(libc::ENOENT))?;
        let br = i.branch(b)?;
        let ofd = br.dir(&ns.rel(odir)).map_err(ioerr)?;
        // The new name goes on the file's branch, creating the directory there if needed:
        // a link never fails with EXDEV (issue 3 item 3).
        let nfd = i.ensure_dir(&mut ns, new_parent, b)?;
        sys::linkat(ofd.as_fd(), &oname, nfd.as_fd(), new_name).map_err(ioerr)?;
        ns.dirs
            .get_mut(&new_parent)
            .expect("parent")
            .children
            .insert(new_name.to_os_string(), Entry::File(b));
        let st = sys::fstatat(nfd.as_fd(), new_name).map_err(ioerr)?;
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
        let perm = mode & 0o7777 & !umask;
        let r = i.make_node(
            ctx,
            parent,
            name,
            FileKind::RegularFile,
            perm,
            &mut |pfd, perm| {
                let f = (flags & KEEP_FLAGS & !libc::O_TRUNC) | libc::O_CREAT | libc::O_EXCL;
                sys::openat(pfd.as_fd(), name, f, perm).map(Some)
            },
        );
        match r {
            Ok((a, fd)) => {
                let fd = fd.ok_or_else(|| err(libc::EIO))?;
                let fh = i.new_handle(a.ino, flags & KEEP_FLAGS & !libc::O_TRUNC, fd);
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

    fn read(&self, _ino: Ino, fh: Fh, offset: u64, size: u32, buf: &mut Vec<u8>) -> Result<()> {
        let h = self.inner.handle(fh)?;
        buf.clear();
        buf.resize(size as usize, 0);
        let fd = h.fd.read();
        let mut done = 0usize;
        while done < buf.len() {
            match sys::pread(fd.as_fd(), &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ioerr(e)),
            }
        }
        buf.truncate(done);
        Ok(())
    }

    fn write(&self, _ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        let h = self.inner.handle(fh)?;
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
        let fd = h.fd.read();
        sys::fsync(fd.as_fd(), datasync).map_err(ioerr)
    }

    fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<Fh> {
        let i = &self.inner;
        {
            let ns = i.ns.read();
            if !ns.dirs.contains_key(&ino) {
                return Err(i.not_dir_or_stale(ino));
            }
            let a = i.dir_attr(&ns, ino)?;
            ctx.check(libc::S_IFDIR | a.perm as u32, a.uid, a.gid, Access::R)?;
        }
        let fh = i.next_fh.fetch_add(1, Ordering::Relaxed);
        i.open
            .lock()
            .insert(fh, Open::Dir(Arc::new(Mutex::new(None))));
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
            Some(Open::Dir(s)) => s.clone(),
            _ => return Err(err(libc::EBADF)),
        };
        let mut slot = slot.lock();
        if offset == 0 || slot.is_none() {
            *slot = Some(i.list_dir(ino)?);
        }
        let listing = slot.as_ref().expect("listing");
        for (idx, (name, eino, kind)) in listing.entries.iter().enumerate().skip(offset as usize) {
            let attr = if plus && name != "." && name != ".." {
                let ns = i.ns.read();
                match i.lookup_in(&ns, ino, name, false) {
                    Ok(a) => Some(a),
                    // Gone since the listing was taken.
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
        let ns = i.ns.read();
        let d = ns.dirs.get(&ino).ok_or_else(|| err(libc::ENOENT))?;
        let rel = ns.rel(ino);
        for b in i.dir_branches(d) {
            let fd = b
                .dir(&rel)
                .and_then(|p| {
                    sys::openat(
                        p.as_fd(),
                        OsStr::new("."),
                        libc::O_RDONLY | libc::O_DIRECTORY,
                        0,
                    )
                })
                .map_err(ioerr)?;
            sys::fsync(fd.as_fd(), false).map_err(ioerr)?;
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
        ctx.check(a.kind.mode_bits() | a.perm as u32, a.uid, a.gid, mask)
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
        let r = {
            let fd = h.fd.read();
            sys::fallocate(fd.as_fd(), mode, offset, length)
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) if sys::errno(&e) == libc::ENOSPC && mode & libc::FALLOC_FL_KEEP_SIZE == 0 => {
                let need = offset.saturating_add(length);
                self.inner
                    .overflow(h.ino, need)
                    .map_err(|_| err(libc::ENOSPC))?;
                let fd = h.fd.read();
                sys::fallocate(fd.as_fd(), mode, offset, length).map_err(ioerr)
            }
            Err(e) => Err(ioerr(e)),
        }
    }

    fn lseek(&self, _ino: Ino, fh: Fh, offset: u64, whence: i32) -> Result<u64> {
        let h = self.inner.handle(fh)?;
        let fd = h.fd.read();
        sys::lseek(fd.as_fd(), offset, whence).map_err(ioerr)
    }

    fn sync_all(&self) -> Result<()> {
        for b in self.inner.branches.read().iter() {
            if b.active() {
                sys::syncfs(b.root().as_fd()).map_err(ioerr)?;
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
                check_setattr(&writer, &f, &chmod(m), false).is_ok(),
                "{m:o}"
            );
        }
        // With a size, as a truncate sends it.
        let trunc = SetAttr {
            size: Some(3),
            ..chmod(0o2666)
        };
        assert!(check_setattr(&writer, &f, &trunc, false).is_ok());
        // Anything else stays the owner's.
        for m in [0o6666 | 0o1000, 0o6644, 0o6766, 0o6666, 0o2667] {
            assert!(
                check_setattr(&writer, &f, &chmod(m), false).is_err(),
                "{m:o}"
            );
        }
        // Only for someone who may write the file (or writes through a writable handle).
        let ro = file(0o6644, 10, 10);
        assert!(check_setattr(&writer, &ro, &chmod(0o2644), false).is_err());
        assert!(check_setattr(&writer, &ro, &chmod(0o2644), true).is_ok());
        // Only for regular files.
        let mut d = file(0o2777, 10, 10);
        d.kind = FileKind::Directory;
        assert!(check_setattr(&writer, &d, &chmod(0o0777), false).is_err());
    }
}
