//! Building the index: load the persisted one when the last unmount was clean, otherwise
//! scan every branch (see `ns` for the format and the clean marker).

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use cairn_vfs::FileKind;
use log::{info, warn};

use crate::branch::{Branch, META};
use crate::fs::Inner;
use crate::ns::{Entry, ROOT, Tree};
use crate::sys;

const INDEX: &str = "index";
const CLEAN: &str = "clean";

impl Inner {
    /// `rescan`: ignore a saved index (recovery changed the branches since it was saved).
    pub(crate) fn load_or_scan(&self, rescan: bool) {
        let names = self.branch_names();
        let ib = self.branch(self.policy().index_branch).ok();
        let mut loaded = None;
        if let Some(ib) = &ib
            && let Ok(meta) = ib.meta_dir(None)
        {
            if !rescan && sys::fstatat(meta.as_fd(), OsStr::new(CLEAN)).is_ok() {
                let data = sys::openat(meta.as_fd(), OsStr::new(INDEX), libc::O_RDONLY, 0)
                    .and_then(|fd| {
                        let mut v = Vec::new();
                        std::fs::File::from(fd).read_to_end(&mut v).map(|_| v)
                    });
                if let Ok(d) = data {
                    loaded = Tree::decode(&d, &names, &mut || self.alloc_ino());
                    if loaded.is_none() {
                        warn!("the saved index does not match the branches: rebuilding it");
                    }
                }
            }
            // From now on the saved index is stale until the next clean unmount; it is only
            // trusted with the marker, so drop both (the file's space goes back too).
            let _ = sys::unlinkat(meta.as_fd(), OsStr::new(CLEAN), false);
            let _ = sys::unlinkat(meta.as_fd(), OsStr::new(INDEX), false);
            if let Ok(real) = sys::reopen_dir(meta.as_fd()) {
                let _ = sys::fsync(real.as_fd(), false);
            }
        }
        let tree = match loaded {
            Some(t) => {
                info!("index loaded ({} directories)", t.dirs.len());
                t
            }
            None => {
                let mut t = Tree::new(0);
                let branches = self.branches.read().clone();
                for b in branches.iter().filter(|b| b.active()) {
                    self.scan_branch(&mut t, b);
                }
                info!(
                    "index rebuilt by scanning {} branches ({} directories)",
                    branches.len(),
                    t.dirs.len()
                );
                t
            }
        };
        *self.ns.write() = tree;
    }

    /// Adds everything on branch `b` to `tree`. A name held by two branches (a crash in
    /// an operation that is not journaled, or files written behind our back) keeps the
    /// newer file; a directory beats a file.
    pub(crate) fn scan_branch(&self, tree: &mut Tree, b: &Branch) {
        let bit = 1u64 << b.id;
        if let Some(r) = tree.dirs.get_mut(&ROOT) {
            r.mask |= bit;
        }
        let mut stack: Vec<(u64, Vec<u8>)> = vec![(ROOT, Vec::new())];
        while let Some((dir, rel)) = stack.pop() {
            // One host call per directory, with the branch's deadline: the listing and the
            // kinds the file system did not give.
            let (root, r) = (b.root(), rel.clone());
            let listed = b.run(move || {
                let mut v = sys::open_dir_read(root.as_fd(), &r).and_then(sys::read_dir)?;
                let pfd = sys::open_dir_beneath(root.as_fd(), &r)?;
                for he in v.iter_mut().filter(|h| h.dtype == libc::DT_UNKNOWN) {
                    if let Ok(st) = sys::fstatat(pfd.as_fd(), OsStr::from_bytes(&he.name)) {
                        he.dtype =
                            FileKind::from_mode(st.st_mode).map_or(libc::DT_UNKNOWN, |k| k.dtype());
                    }
                }
                Ok(v)
            });
            let entries = match listed {
                Ok(e) => e,
                Err(e) => {
                    warn!(
                        "scan of '{}': {}: {e}",
                        b.name,
                        String::from_utf8_lossy(&rel)
                    );
                    continue;
                }
            };
            for he in entries {
                let name = OsString::from(OsStr::from_bytes(&he.name));
                if rel.is_empty() && name == META {
                    continue;
                }
                let Some(kind) = FileKind::from_dtype(he.dtype) else {
                    continue;
                };
                let mut crel = rel.clone();
                if !crel.is_empty() {
                    crel.push(b'/');
                }
                crel.extend_from_slice(&he.name);
                let existing = tree
                    .dirs
                    .get(&dir)
                    .and_then(|d| d.children.get(&name))
                    .copied();
                if kind == FileKind::Directory {
                    match existing {
                        Some(Entry::Dir(i)) => {
                            if let Some(d) = tree.dirs.get_mut(&i) {
                                d.mask |= bit;
                            }
                            stack.push((i, crel));
                        }
                        other => {
                            if let Some(Entry::File(c)) = other {
                                warn!(
                                    "scan: {} is a directory on '{}' and a file on branch {c}: the directory wins",
                                    String::from_utf8_lossy(&crel),
                                    b.name
                                );
                                self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                                tree.remove(dir, &name);
                            }
                            let i = self.alloc_ino();
                            tree.add_dir(dir, &name, i, bit);
                            stack.push((i, crel));
                        }
                    }
                } else {
                    match existing {
                        None => {
                            if let Some(d) = tree.dirs.get_mut(&dir) {
                                d.children.insert(name, Entry::File(b.id));
                            }
                        }
                        Some(Entry::File(c)) if c != b.id => {
                            self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                            let mine = self.stat_in(b.id, &rel, &name).ok().map(|x| x.1);
                            let theirs = self.stat_in(c, &rel, &name).ok().map(|x| x.1);
                            let newer = match (mine, theirs) {
                                (Some(m), Some(t)) => {
                                    (m.st_mtime, m.st_mtime_nsec) > (t.st_mtime, t.st_mtime_nsec)
                                }
                                (Some(_), None) => true,
                                _ => false,
                            };
                            warn!(
                                "scan: {} exists on '{}' and on branch {c}: keeping the {} copy",
                                String::from_utf8_lossy(&crel),
                                b.name,
                                if newer {
                                    "first (newer)"
                                } else {
                                    "other (newer)"
                                }
                            );
                            if newer && let Some(d) = tree.dirs.get_mut(&dir) {
                                d.children.insert(name, Entry::File(b.id));
                            }
                        }
                        Some(_) => {}
                    }
                }
            }
        }
    }

    /// Merges `scanned` (one branch's tree, from [`Inner::scan_branch`] into an empty
    /// tree) into the index: its directories join (mask), its files are added where the
    /// union has no such name; a name the union already has keeps the union's copy and is
    /// counted as a conflict.
    pub(crate) fn merge_scanned(&self, ns: &mut Tree, scanned: Tree, b: &Branch) {
        let bit = 1u64 << b.id;
        if let Some(r) = ns.dirs.get_mut(&ROOT) {
            r.mask |= bit;
        }
        let mut stack = vec![(ROOT, ROOT)];
        while let Some((sd, nd)) = stack.pop() {
            let Some(sdir) = scanned.dirs.get(&sd) else {
                continue;
            };
            for (name, e) in &sdir.children {
                let existing = ns.dirs.get(&nd).and_then(|d| d.children.get(name)).copied();
                match (e, existing) {
                    (Entry::Dir(si), Some(Entry::Dir(ni))) => {
                        if let Some(d) = ns.dirs.get_mut(&ni) {
                            d.mask |= bit;
                        }
                        stack.push((*si, ni));
                    }
                    (Entry::Dir(si), None) => {
                        let ni = self.alloc_ino();
                        ns.add_dir(nd, name, ni, bit);
                        stack.push((*si, ni));
                    }
                    (Entry::File(_), None) => {
                        if let Some(d) = ns.dirs.get_mut(&nd) {
                            d.children.insert(name.clone(), Entry::File(b.id));
                        }
                    }
                    (Entry::File(_), Some(Entry::File(c))) if c == b.id => {}
                    _ => {
                        self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                        warn!(
                            "branch '{}': {:?} is already in the union: the union's copy stays",
                            b.name, name
                        );
                    }
                }
            }
        }
    }

    /// Writes the index and the clean marker (at a clean unmount).
    pub(crate) fn save_index(&self) -> Result<(), String> {
        let names = self.branch_names();
        let data = self.ns.read().encode(&names);
        let ib = self
            .branch(self.policy().index_branch)
            .map_err(|e| e.to_string())?;
        let meta = ib
            .meta_dir(None)
            .map_err(|e| format!("index branch '{}': {e}", ib.name))?;
        let write = move || -> std::io::Result<()> {
            let tmp = OsStr::new("index.tmp");
            let fd = sys::openat(
                meta.as_fd(),
                tmp,
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                0o600,
            )?;
            let mut f = std::fs::File::from(fd);
            f.write_all(&data)?;
            f.sync_all()?;
            sys::renameat2(meta.as_fd(), tmp, meta.as_fd(), OsStr::new(INDEX), 0)?;
            let c = sys::openat(
                meta.as_fd(),
                OsStr::new(CLEAN),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                0o600,
            )?;
            sys::fsync(c.as_fd(), false)?;
            let real = sys::reopen_dir(meta.as_fd())?;
            sys::fsync(real.as_fd(), false)
        };
        ib.run(write)
            .map_err(|e| format!("saving the index on '{}': {e}", ib.name))
    }
}
