//! One branch: a host directory the layer places files in.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::rules::BranchId;
use crate::sys;

/// The hidden metadata directory at the root of every branch: the index (on the index
/// branch), in-flight migration records and temporary copies. Never visible in the mount.
pub const META: &str = ".umbrella";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Active,
    /// Configured but not answering (its directory vanished, I/O errors). Its rules are
    /// inactive; merged operations fail (`or`) or skip it (`and`).
    Failed,
    /// Taken out with `branch remove`: not part of the union until added again.
    Removed,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Failed => "failed",
            State::Removed => "removed",
        }
    }
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
    /// (when, free bytes, total bytes): statvfs is a syscall per placement otherwise.
    space: Mutex<Option<(Instant, u64, u64)>>,
    dirs: Mutex<HashMap<Vec<u8>, DirFd>>,
}

/// A shared directory descriptor.
pub type DirFd = Arc<OwnedFd>;

/// How long a free-space reading is trusted for placement. A stale reading only costs an
/// ENOSPC on write, which overflow then handles.
const SPACE_TTL: Duration = Duration::from_millis(200);

impl Branch {
    pub fn open(id: BranchId, name: &str, path: PathBuf) -> io::Result<Branch> {
        let root = sys::open_root(&path)?;
        let st = sys::fstat(root.as_fd())?;
        Ok(Branch {
            id,
            name: name.to_string(),
            path: RwLock::new(path),
            root: RwLock::new(Arc::new(root)),
            dev: AtomicU64::new(st.st_dev),
            state: AtomicU8::new(0),
            space: Mutex::new(None),
            dirs: Mutex::new(HashMap::new()),
        })
    }

    pub fn state(&self) -> State {
        match self.state.load(Ordering::Acquire) {
            0 => State::Active,
            1 => State::Failed,
            _ => State::Removed,
        }
    }

    pub fn set_state(&self, s: State) {
        let v = match s {
            State::Active => 0,
            State::Failed => 1,
            State::Removed => 2,
        };
        self.state.store(v, Ordering::Release);
    }

    pub fn active(&self) -> bool {
        self.state() == State::Active
    }

    pub fn dev(&self) -> u64 {
        self.dev.load(Ordering::Relaxed)
    }

    pub fn root(&self) -> Arc<OwnedFd> {
        self.root.read().clone()
    }

    /// Re-opens the root by path (the directory came back, or the branch was re-added with
    /// a new path).
    pub fn reopen(&self, path: Option<PathBuf>) -> io::Result<()> {
        let p = path.unwrap_or_else(|| self.path.read().clone());
        let root = sys::open_root(&p)?;
        let st = sys::fstat(root.as_fd())?;
        self.dev.store(st.st_dev, Ordering::Relaxed);
        *self.root.write() = Arc::new(root);
        *self.path.write() = p;
        *self.space.lock() = None;
        self.forget_dirs();
        Ok(())
    }

    /// Is the root still the directory we opened, and is it still linked?
    pub fn healthy(&self) -> bool {
        let root = self.root();
        let Ok(st) = sys::fstat(root.as_fd()) else {
            return false;
        };
        if st.st_nlink == 0 {
            return false;
        }
        match std::fs::metadata(&*self.path.read()) {
            Ok(m) => {
                use std::os::unix::fs::MetadataExt;
                m.ino() == st.st_ino && m.dev() == st.st_dev
            }
            Err(_) => false,
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
        let fd = Arc::new(sys::open_dir_beneath(root.as_fd(), rel)?);
        let mut c = self.dirs.lock();
        if c.len() >= 16384 {
            c.clear();
        }
        c.insert(rel.to_vec(), fd.clone());
        Ok(fd)
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
        let root = self.root();
        let v = sys::fstatvfs(root.as_fd()).ok()?;
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
