//! A branch that comes back: disconnected operation (003 §6).
//!
//! While a branch is down (stalled or failed), the union goes on without it: its rules are
//! inactive, new files and files whose rules want it are placed on the next branch with
//! room and *marked to go back* (`ns::Tree::away`), its own files are hidden (`and`) or
//! EIO (`or`). When a probe finds it answering again ([`Inner::branch_returned`], on a
//! thread of its own so the health checker goes on):
//!
//! 1. **resync** — when a call on it was abandoned at its deadline (it may have completed
//!    after the answer), or it was down while the union changed: its part of the index is
//!    read again from the branch (a scan, each directory one call with the deadline, no
//!    lock held), then merged under `shape` held exclusively: names it holds that the index
//!    does not know are added; index entries naming it that it no longer holds are dropped
//!    (each verified by a host stat first); and **a name held by it and by another branch
//!    is never resolved by overwriting or hiding one**: the returning branch's copy is
//!    renamed, on its own branch, to `NAME.conflict-BRANCH-TIME` beside the other, both
//!    are visible, and both paths are logged and listed by `status` (`conflicts`);
//! 2. **send back** — every file marked to go back to it is queued for the migration
//!    worker, which re-evaluates the rules (the branch's rules are active again) and moves
//!    it with the crash-safe move protocol (`migrate`); the mark goes when the file is on
//!    the branch it wanted.
//!
//! The marks are kept in memory and saved with the index at a clean unmount; after a crash
//! the index is rebuilt by a scan and the marks are gone: the periodic enforcer
//! (`enforce_interval`) then moves what the rules want moved.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cairn_vfs::{FileKind, Ino};
use log::{info, warn};

use crate::branch::{Branch, META};
use crate::fs::Inner;
use crate::ns::{Entry, ROOT};
use crate::sys;

/// What a scan of one branch found: directories and files by relative path.
#[derive(Default)]
struct Found {
    dirs: Vec<Vec<u8>>,
    files: HashSet<Vec<u8>>,
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = rel.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn split(path: &[u8]) -> (&[u8], &OsStr) {
    match path.iter().rposition(|&c| c == b'/') {
        Some(i) => (&path[..i], OsStr::from_bytes(&path[i + 1..])),
        None => (b"", OsStr::from_bytes(path)),
    }
}

/// A scanned path's parent directory in the index (through `by_path`, the directories
/// merged so far), its last component, and what the index holds under that name.
fn locate<'p>(
    ns: &crate::ns::Tree,
    by_path: &HashMap<Vec<u8>, Ino>,
    path: &'p [u8],
) -> Option<(Ino, &'p OsStr, Option<Entry>)> {
    let (prel, name) = split(path);
    let parent = *by_path.get(prel)?;
    let existing = ns
        .dirs
        .get(&parent)
        .and_then(|d| d.children.get(name))
        .copied();
    Some((parent, name, existing))
}

/// A conflict name: `NAME.conflict-BRANCH-YYYYMMDDTHHMMSS[-N]`.
fn conflict_name(name: &OsStr, branch: &str, n: u32) -> OsString {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut s = name.to_os_string();
    s.push(format!(".conflict-{branch}-{}", stamp(t)));
    if n > 0 {
        s.push(format!("-{n}"));
    }
    s
}

/// UTC `YYYYMMDDTHHMMSS` of a Unix time (civil-from-days, no time zone database needed).
fn stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl Inner {
    /// A stalled or failed branch answers again (called by the health checker). The work
    /// runs on a thread of its own: a resync scans the branch.
    pub(crate) fn branch_returned(self: &Arc<Self>, b: &Arc<Branch>) {
        b.forget_dirs();
        b.space_changed();
        let (inner, br) = (self.clone(), b.clone());
        let spawned = std::thread::Builder::new()
            .name("umbrella-return".into())
            .spawn(move || {
                if br.needs_resync.swap(false, Ordering::AcqRel)
                    && let Err(e) = inner.resync(&br)
                {
                    warn!("branch '{}': re-reading it after its return: {e}", br.name);
                    br.needs_resync.store(true, Ordering::Release);
                    return;
                }
                inner.send_back(&br);
            });
        if let Err(e) = spawned {
            warn!("branch '{}': no thread to re-read it: {e}", b.name);
        }
    }

    /// Every directory and file on branch `b` (step 1 of the module comment). Each
    /// directory is one host call with the branch's deadline; an error stops the scan (the
    /// branch went away again).
    fn scan_for_resync(&self, b: &Arc<Branch>) -> std::io::Result<Found> {
        let mut found = Found::default();
        let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
        while let Some(rel) = stack.pop() {
            let (bb, r) = (b.clone(), rel.clone());
            let entries = b.run(move || {
                let root = bb.root();
                let list = sys::open_dir_read(root.as_fd(), &r).and_then(sys::read_dir)?;
                let pfd = sys::open_dir_beneath(root.as_fd(), &r)?;
                let mut out = Vec::new();
                for he in list {
                    if r.is_empty() && he.name == META.as_bytes() {
                        continue;
                    }
                    let kind = match FileKind::from_dtype(he.dtype) {
                        Some(k) => k,
                        None => match sys::fstatat(pfd.as_fd(), OsStr::from_bytes(&he.name)) {
                            Ok(st) => sys::kind_of(st.st_mode),
                            Err(_) => continue,
                        },
                    };
                    out.push((he.name, kind == FileKind::Directory));
                }
                Ok(out)
            })?;
            for (name, is_dir) in entries {
                let p = join(&rel, &name);
                if is_dir {
                    found.dirs.push(p.clone());
                    stack.push(p);
                } else {
                    found.files.insert(p);
                }
            }
        }
        Ok(found)
    }

    /// Re-reads branch `b`'s part of the index (step 1 of the module comment).
    pub(crate) fn resync(&self, b: &Arc<Branch>) -> std::io::Result<()> {
        let found = self.scan_for_resync(b)?;
        let bit = 1u64 << b.id;
        // Held exclusively from here: no other operation resolves or changes names while
        // the index is merged, so the verifications below stay true.
        let _shape = self.shape.write();
        // Index entries on `b` that the scan did not see: verify each on the branch.
        let stale: Vec<(Ino, OsString, Vec<u8>)> = {
            let ns = self.ns.read();
            ns.files()
                .into_iter()
                .filter(|(d, n, fb)| {
                    *fb == b.id && !found.files.contains(&join(&ns.rel(*d), n.as_bytes()))
                })
                .map(|(d, n, _)| (d, n, ns.rel(d)))
                .collect()
        };
        let mut gone = Vec::new();
        for (d, n, rel) in stale {
            let (bb, nn) = (b.clone(), n.clone());
            let r = b.run(move || {
                bb.dir_here(&rel)
                    .and_then(|fd| sys::fstatat(fd.as_fd(), &nn))
            });
            match r {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => gone.push((d, n)),
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
        // Directories first (parents before children: the scan pushes them in that order).
        let mut conflicts: Vec<(Vec<u8>, OsString)> = Vec::new();
        let mut added = 0usize;
        {
            let mut ns = self.ns.write();
            let mut by_path: HashMap<Vec<u8>, Ino> = HashMap::new();
            by_path.insert(Vec::new(), ROOT);
            if let Some(r) = ns.dirs.get_mut(&ROOT) {
                r.mask |= bit;
            }
            let mut dirs = found.dirs.clone();
            dirs.sort_by_key(|p| p.iter().filter(|&&c| c == b'/').count());
            for p in &dirs {
                let Some((parent, name, existing)) = locate(&ns, &by_path, p) else {
                    continue;
                };
                match existing {
                    Some(Entry::Dir(i)) => {
                        if let Some(d) = ns.dirs.get_mut(&i) {
                            d.mask |= bit;
                        }
                        by_path.insert(p.clone(), i);
                    }
                    None => {
                        let i = self.alloc_ino();
                        ns.add_dir(parent, name, i, bit);
                        by_path.insert(p.clone(), i);
                        added += 1;
                    }
                    Some(Entry::File(c)) => {
                        // A directory here, a file there: the union cannot show both under
                        // one name. The directory stays on its branch, hidden, and is
                        // reported (never removed).
                        warn!(
                            "branch '{}': {} is a directory there and a file on branch {c}; \
                             the directory stays hidden until one is renamed",
                            b.name,
                            String::from_utf8_lossy(p)
                        );
                        self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                        self.conflict_list.lock().push(format!(
                            "/{} (a directory on '{}', a file elsewhere)",
                            String::from_utf8_lossy(p),
                            b.name
                        ));
                    }
                }
            }
            for p in &found.files {
                let Some((parent, name, existing)) = locate(&ns, &by_path, p) else {
                    continue;
                };
                match existing {
                    None => {
                        if let Some(d) = ns.dirs.get_mut(&parent) {
                            d.children.insert(name.to_os_string(), Entry::File(b.id));
                            added += 1;
                        }
                    }
                    Some(Entry::File(c)) if c == b.id => {}
                    Some(_) => conflicts.push((split(p).0.to_vec(), name.to_os_string())),
                }
            }
            for (d, n) in &gone {
                if ns.dirs.get(d).and_then(|x| x.children.get(n)) == Some(&Entry::File(b.id)) {
                    ns.remove(*d, n);
                }
            }
        }
        // Both kept: the returning branch's copy gets a conflict name on its own branch.
        for (prel, name) in conflicts {
            let mut k = 0;
            let renamed = loop {
                let cname = conflict_name(&name, &b.name, k);
                let (bb, r, n1, n2) = (b.clone(), prel.clone(), name.clone(), cname.clone());
                let res = b.run(move || {
                    let fd = bb.dir_here(&r)?;
                    sys::rename_noreplace(fd.as_fd(), &n1, fd.as_fd(), &n2)
                });
                match res {
                    Ok(()) => break Some(cname),
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) && k < 100 => k += 1,
                    Err(e) => {
                        warn!(
                            "branch '{}': keeping both copies of /{}: {e}",
                            b.name,
                            String::from_utf8_lossy(&join(&prel, name.as_bytes()))
                        );
                        break None;
                    }
                }
            };
            let path = join(&prel, name.as_bytes());
            self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
            let Some(cname) = renamed else {
                self.conflict_list.lock().push(format!(
                    "/{} (also on '{}', not renamed: see the log)",
                    String::from_utf8_lossy(&path),
                    b.name
                ));
                continue;
            };
            let cpath = join(&prel, cname.as_bytes());
            warn!(
                "branch '{}': /{} changed both there and in the union while it was away: \
                 both kept, its copy is now /{}",
                b.name,
                String::from_utf8_lossy(&path),
                String::from_utf8_lossy(&cpath)
            );
            self.conflict_list.lock().push(format!(
                "/{} and /{} (the copy from '{}')",
                String::from_utf8_lossy(&path),
                String::from_utf8_lossy(&cpath),
                b.name
            ));
            let mut ns = self.ns.write();
            let parent = {
                let mut cur = ROOT;
                let mut ok = true;
                for part in prel.split(|&c| c == b'/').filter(|p| !p.is_empty()) {
                    match ns
                        .dirs
                        .get(&cur)
                        .and_then(|d| d.children.get(OsStr::from_bytes(part)))
                    {
                        Some(Entry::Dir(i)) => cur = *i,
                        _ => {
                            ok = false;
                            break;
                        }
                    }
                }
                ok.then_some(cur)
            };
            if let Some(p) = parent
                && let Some(d) = ns.dirs.get_mut(&p)
            {
                d.children.insert(cname, Entry::File(b.id));
            }
        }
        self.forget_dirs();
        self.epoch.fetch_add(1, Ordering::Relaxed);
        info!(
            "branch '{}' re-read: {added} names added, {} gone",
            b.name,
            gone.len()
        );
        Ok(())
    }

    /// Queues every file marked to go back to `b` (step 2 of the module comment).
    pub(crate) fn send_back(&self, b: &Arc<Branch>) {
        let marked: Vec<(Ino, OsString, usize, Vec<u8>)> = {
            let ns = self.ns.read();
            ns.away
                .iter()
                .filter(|(_, w)| **w == b.id)
                .filter_map(|((d, n), _)| match ns.dirs.get(d)?.children.get(n)? {
                    Entry::File(c) => Some((*d, n.clone(), *c, ns.rel(*d))),
                    Entry::Dir(_) => None,
                })
                .collect()
        };
        if marked.is_empty() {
            return;
        }
        info!(
            "branch '{}' is back: {} files go back to it",
            b.name,
            marked.len()
        );
        for (d, n, c, rel) in marked {
            if let Ok((_, st)) = self.stat_in(c, &rel, &n) {
                let ino = self.node_for_enforce(d, &n, c, &st);
                self.queue_check(ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_names_carry_the_branch_and_the_time() {
        assert_eq!(stamp(0), "19700101T000000");
        assert_eq!(stamp(951_782_400 + 3_661), "20000229T010101");
        let n = conflict_name(OsStr::new("a.txt"), "net", 2);
        let s = n.to_string_lossy();
        assert!(
            s.starts_with("a.txt.conflict-net-") && s.ends_with("-2"),
            "{s}"
        );
    }

    #[test]
    fn paths_split_and_join() {
        assert_eq!(split(b"a/b/c"), (&b"a/b"[..], OsStr::new("c")));
        assert_eq!(split(b"c"), (&b""[..], OsStr::new("c")));
        assert_eq!(join(b"", b"x"), b"x");
        assert_eq!(join(b"a", b"x"), b"a/x");
    }
}
