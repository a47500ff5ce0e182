//! Recovery of interrupted moves at mount, before the index is built.
//!
//! A move record (see `record`) stays on the target branch only when its move was cut
//! short: the daemon was killed or the machine stopped inside it, or the commit could not
//! remove a source name. Recovery looks at what the branches hold under every recorded
//! name and *trusts nothing it cannot verify*: it deletes or links only objects whose
//! identity (device, inode number, and where it matters size and mtime) is the recorded
//! one, and when what it finds does not fit one of the states a move passes through, it
//! keeps every copy and says so (a warning naming the host paths, and `status`).
//!
//! Per name P of the record, the target holds at P the copy, nothing, or another object;
//! the source holds the source unchanged, the source changed (same object, other size or
//! mtime), nothing, or another object. The decision ([`plan`]):
//!
//! | found | phase | action |
//! |---|---|---|
//! | the copy is at no name | placing | roll back: delete the temporary; the source is whole |
//! | source names all unchanged or gone | any | finish: below |
//! | a source name changed, or another object at a source name | any | keep both: below |
//!
//! Finishing: a source name whose target name holds the copy is removed; one whose target
//! name is empty gets the copy linked there first, but only while no source name has been
//! removed yet (the move died before its unlinks, so nothing since can have removed the
//! target name on purpose) — in the committed phase the union already showed the target,
//! so the source name is stale and is removed. A source name whose target name holds
//! another object is kept aside (below), never removed.
//!
//! Keeping both: where the source and the target both hold an object under one name, the
//! one the union did not show (the target's while placing, the source's once committed) is
//! moved, by link and unlink on its own branch, to `.umbrella/kept/SEQ/P`; names held by
//! one object only are left alone. Nothing is deleted.
//!
//! A version 1 record (no identities) changes nothing: its temporary is emptied with the
//! rest of `tmp/` and the full scan that follows any recovery resolves duplicate names.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cairn_vfs::fileattr;
use log::{info, warn};

use crate::branch::Branch;
use crate::fs::Inner;
use crate::record::{Ident, MoveRecord, Phase};
use crate::sys;

/// What the target branch holds under a recorded name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtTarget {
    Absent,
    Copy,
    Other,
}

/// What the source branch holds under a recorded name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtSource {
    Absent,
    Unchanged,
    Changed,
    Other,
}

/// One step of a recovery, for the name at this index of the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Link the copy at the name on the target (from another name holding it).
    LinkCopy(usize),
    /// Remove the source's name (re-verified unchanged just before).
    UnlinkSource(usize),
    /// Move the target's object at this name to `.umbrella/kept/` on the target.
    KeepTarget(usize),
    /// Move the source's object at this name to `.umbrella/kept/` on the source.
    KeepSource(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    RollBack,
    Finish(Vec<Act>),
    KeepBoth(Vec<Act>),
}

/// The decision table of the module comment, over what was found under each name.
pub fn plan(phase: Phase, found: &[(AtTarget, AtSource)]) -> Plan {
    let placed = found.iter().any(|(t, _)| *t == AtTarget::Copy);
    if !placed && phase == Phase::Placing {
        return Plan::RollBack;
    }
    let doubt = found
        .iter()
        .any(|(_, s)| matches!(s, AtSource::Changed | AtSource::Other));
    let both_present = |t: AtTarget, s: AtSource| t != AtTarget::Absent && s != AtSource::Absent;
    let aside = |i: usize| match phase {
        Phase::Placing => Act::KeepTarget(i),
        Phase::Committed => Act::KeepSource(i),
    };
    if doubt {
        let acts = found
            .iter()
            .enumerate()
            .filter(|(_, (t, s))| both_present(*t, *s))
            .map(|(i, _)| aside(i))
            .collect();
        return Plan::KeepBoth(acts);
    }
    // Every source name is unchanged or gone. Before any source name was removed, a target
    // name not yet made is made now; once removals began every target name existed.
    let unlinking_began = found.iter().any(|(_, s)| *s == AtSource::Absent);
    let mut acts = Vec::new();
    let mut kept = false;
    for (i, (t, s)) in found.iter().enumerate() {
        if *s != AtSource::Unchanged {
            continue;
        }
        match (t, phase) {
            (AtTarget::Copy, _) | (AtTarget::Absent, Phase::Committed) => {
                acts.push(Act::UnlinkSource(i));
            }
            (AtTarget::Absent, Phase::Placing) if !unlinking_began => {
                acts.push(Act::LinkCopy(i));
                acts.push(Act::UnlinkSource(i));
            }
            // The source is the only holder of this name: it stays.
            (AtTarget::Absent, Phase::Placing) => {}
            (AtTarget::Other, _) => {
                kept = true;
                acts.push(aside(i));
            }
        }
    }
    if kept {
        Plan::KeepBoth(acts)
    } else {
        Plan::Finish(acts)
    }
}

fn split(rel: &[u8]) -> (&[u8], &OsStr) {
    match rel.iter().rposition(|&c| c == b'/') {
        Some(i) => (&rel[..i], OsStr::from_bytes(&rel[i + 1..])),
        None => (b"", OsStr::from_bytes(rel)),
    }
}

fn stat_at(b: &Branch, rel: &[u8]) -> Option<sys::Stat> {
    let (d, n) = split(rel);
    b.dir(d).and_then(|fd| sys::fstatat(fd.as_fd(), n)).ok()
}

fn fsync_dir(fd: &OwnedFd) {
    if let Ok(real) = sys::reopen_dir(fd.as_fd()) {
        let _ = sys::fsync(real.as_fd(), false);
    }
}

fn show(b: &Branch, rel: &[u8]) -> String {
    b.path
        .read()
        .join(OsStr::from_bytes(rel))
        .display()
        .to_string()
}

fn list(dir: &OwnedFd) -> Vec<OsString> {
    sys::reopen_dir(dir.as_fd())
        .and_then(sys::read_dir)
        .map(|v| v.into_iter().map(|e| OsString::from_vec(e.name)).collect())
        .unwrap_or_default()
}

/// Creates `rel` (and its parents) on `b` if missing, with the mode and owner of the copy
/// on `model` when there is one.
fn mkdir_p(b: &Branch, rel: &[u8], model: &Branch) -> std::io::Result<crate::branch::DirFd> {
    if rel.is_empty() {
        return b.dir(b"");
    }
    if let Ok(fd) = b.dir(rel) {
        return Ok(fd);
    }
    let (parent, name) = split(rel);
    let pfd = mkdir_p(b, parent, model)?;
    let st = model
        .dir(parent)
        .ok()
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

/// Where recovery put copies it kept: `.umbrella/kept/` on each branch.
pub const KEPT: &str = "kept";

/// One record being recovered.
struct Case<'a> {
    rec: &'a MoveRecord,
    seq: &'a OsStr,
    src: &'a Branch,
    dst: &'a Branch,
    source: Ident,
    copy: Ident,
}

impl Case<'_> {
    fn observe(&self) -> Vec<(AtTarget, AtSource)> {
        self.rec
            .paths
            .iter()
            .map(|p| {
                let t = match stat_at(self.dst, p) {
                    None => AtTarget::Absent,
                    Some(st) if self.copy.is_object(&st) => AtTarget::Copy,
                    Some(_) => AtTarget::Other,
                };
                let s = match stat_at(self.src, p) {
                    None => AtSource::Absent,
                    Some(st) if self.source.is_unchanged(&st) => AtSource::Unchanged,
                    Some(st) if self.source.is_object(&st) => AtSource::Changed,
                    Some(_) => AtSource::Other,
                };
                (t, s)
            })
            .collect()
    }

    /// A name of the target holding the copy, to link from.
    fn copy_name(&self) -> Option<&[u8]> {
        self.rec
            .paths
            .iter()
            .find(|p| stat_at(self.dst, p).is_some_and(|st| self.copy.is_object(&st)))
            .map(Vec::as_slice)
    }

    fn link_copy(&self, p: &[u8]) -> std::io::Result<()> {
        let from = self
            .copy_name()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
        let (fd_, fname) = split(from);
        let (td, tname) = split(p);
        let ffd = self.dst.dir(fd_)?;
        let tfd = mkdir_p(self.dst, td, self.src)?;
        sys::linkat(ffd.as_fd(), fname, tfd.as_fd(), tname)?;
        fsync_dir(&tfd);
        Ok(())
    }

    /// Removes the source's name `p` if it still is the unchanged source and the target
    /// holds the copy there (or the union already showed the target).
    fn unlink_source(&self, p: &[u8]) -> std::io::Result<bool> {
        let (d, n) = split(p);
        let fd = self.src.dir(d)?;
        let ok_src = sys::fstatat(fd.as_fd(), n).is_ok_and(|st| self.source.is_unchanged(&st));
        let ok_dst = self.rec.phase == Phase::Committed
            || stat_at(self.dst, p).is_some_and(|st| self.copy.is_object(&st));
        if !(ok_src && ok_dst) {
            return Ok(false);
        }
        // An immutable or append-only source cannot be unlinked: its flags go to the copy
        // first (the move stopped before it handed them over), then off the source.
        let flags = crate::xattr::flags_at(&fd, Some(n)).unwrap_or(0);
        if flags & fileattr::RESTRICTING != 0 {
            if let Some(cp) = self.copy_name() {
                let (cd, cn) = split(cp);
                let cfd = self.dst.dir(cd)?;
                crate::xattr::set_flags_at(&cfd, Some(cn), flags)?;
            }
            crate::xattr::set_flags_at(&fd, Some(n), flags & !fileattr::RESTRICTING)?;
        }
        sys::unlinkat(fd.as_fd(), n, false)?;
        fsync_dir(&fd);
        Ok(true)
    }

    /// Moves whatever `b` holds at `p` to `.umbrella/kept/SEQ/p` on `b` (link, then unlink
    /// the name only if the kept link is the same object).
    fn keep(&self, b: &Branch, p: &[u8]) -> std::io::Result<String> {
        let (d, n) = split(p);
        let fd = b.dir(d)?;
        let st = sys::fstatat(fd.as_fd(), n)?;
        let kept = b.meta_dir(Some(KEPT))?;
        let _ = sys::mkdirat(kept.as_fd(), self.seq, 0o700);
        let base = sys::open_dir_beneath(kept.as_fd(), self.seq.as_bytes())?;
        let mut cur = base;
        let (kd, kn) = split(p);
        for part in kd.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
            let part = OsStr::from_bytes(part);
            let _ = sys::mkdirat(cur.as_fd(), part, 0o700);
            cur = sys::open_dir_beneath(cur.as_fd(), part.as_bytes())?;
        }
        match sys::linkat(fd.as_fd(), n, cur.as_fd(), kn) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
        let same = sys::fstatat(cur.as_fd(), kn)
            .is_ok_and(|k| (k.st_dev, k.st_ino) == (st.st_dev, st.st_ino));
        if !same {
            return Err(std::io::Error::from_raw_os_error(libc::EEXIST));
        }
        fsync_dir(&cur);
        sys::unlinkat(fd.as_fd(), n, false)?;
        fsync_dir(&fd);
        let mut rel = format!("{}/{KEPT}/", crate::branch::META).into_bytes();
        rel.extend_from_slice(self.seq.as_bytes());
        rel.push(b'/');
        rel.extend_from_slice(p);
        Ok(show(b, &rel))
    }

    fn remove_tmp(&self) {
        if let Ok(t) = self.dst.meta_dir(Some("tmp")) {
            let n = OsStr::new(&self.rec.tmp);
            if sys::fstatat(t.as_fd(), n).is_ok_and(|st| self.copy.is_object(&st)) {
                let _ = sys::unlinkat(t.as_fd(), n, false);
            }
        }
    }

    /// Carries out `plan`; returns how many objects were kept aside.
    fn apply(&self, plan: &Plan) -> u64 {
        let what = String::from_utf8_lossy(&self.rec.paths[0]).into_owned();
        let mut kept = 0;
        let acts = match plan {
            Plan::RollBack => {
                self.remove_tmp();
                info!(
                    "recovery: rolled back the move of {what} from '{}' to '{}'",
                    self.src.name, self.dst.name
                );
                return 0;
            }
            Plan::Finish(a) | Plan::KeepBoth(a) => a,
        };
        let mut linked_ok = vec![true; self.rec.paths.len()];
        for act in acts {
            match *act {
                Act::LinkCopy(i) => {
                    if let Err(e) = self.link_copy(&self.rec.paths[i]) {
                        linked_ok[i] = false;
                        warn!(
                            "recovery: linking {} on '{}': {e}; the source name stays",
                            show(self.dst, &self.rec.paths[i]),
                            self.dst.name
                        );
                    }
                }
                Act::UnlinkSource(i) if linked_ok[i] => {
                    match self.unlink_source(&self.rec.paths[i]) {
                        Ok(true) => {}
                        Ok(false) => warn!(
                            "recovery: {} changed while recovering; kept",
                            show(self.src, &self.rec.paths[i])
                        ),
                        Err(e) => warn!(
                            "recovery: removing {}: {e}",
                            show(self.src, &self.rec.paths[i])
                        ),
                    }
                }
                Act::UnlinkSource(_) => {}
                Act::KeepTarget(i) | Act::KeepSource(i) => {
                    let b = if matches!(act, Act::KeepTarget(_)) {
                        self.dst
                    } else {
                        self.src
                    };
                    let p = &self.rec.paths[i];
                    match self.keep(b, p) {
                        Ok(to) => {
                            kept += 1;
                            warn!(
                                "recovery: {} and {} both hold {}; the move record does not say \
                                 which is right, so both are kept: the first is now {to}",
                                show(b, p),
                                show(
                                    if b.id == self.src.id {
                                        self.dst
                                    } else {
                                        self.src
                                    },
                                    p
                                ),
                                String::from_utf8_lossy(p)
                            );
                        }
                        Err(e) => warn!(
                            "recovery: {} and another copy both hold {}; both left in place \
                             ({e})",
                            show(b, p),
                            String::from_utf8_lossy(p)
                        ),
                    }
                }
            }
        }
        self.remove_tmp();
        match plan {
            Plan::Finish(_) => info!(
                "recovery: finished the move of {what} from '{}' to '{}'",
                self.src.name, self.dst.name
            ),
            _ => warn!(
                "recovery: the move of {what} from '{}' to '{}' did not leave the branches in \
                 a state a move passes through; nothing was deleted",
                self.src.name, self.dst.name
            ),
        }
        kept
    }
}

/// What a recovery did, for `status` and for the decision to rescan.
#[derive(Default)]
pub struct Recovered {
    pub records: u64,
    pub kept: u64,
}

impl Inner {
    /// Resolves every move record on every branch (see the module comment), then empties
    /// every temporary directory. Returns what it did; any record at all means the saved
    /// index may not describe the branches any more.
    pub(crate) fn recover_moves(&self) -> Recovered {
        let branches = self.branches.read().clone();
        let mut out = Recovered::default();
        for db in &branches {
            let Ok(moves) = db.meta_dir(Some("moves")) else {
                continue;
            };
            for rname in list(&moves) {
                out.records += 1;
                out.kept += self.recover_one(&branches, db, &moves, &rname);
                let _ = sys::unlinkat(moves.as_fd(), &rname, false);
                fsync_dir(&moves);
                self.counters.recovered.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.counters.kept.fetch_add(out.kept, Ordering::Relaxed);
        for b in &branches {
            if let Ok(t) = b.meta_dir(Some("tmp")) {
                for n in list(&t) {
                    let _ = sys::unlinkat(t.as_fd(), &n, false);
                }
            }
        }
        out
    }

    fn recover_one(
        &self,
        branches: &[Arc<Branch>],
        db: &Branch,
        moves: &OwnedFd,
        rname: &OsStr,
    ) -> u64 {
        let data = sys::openat(moves.as_fd(), rname, libc::O_RDONLY, 0).and_then(|fd| {
            use std::io::Read;
            let mut v = Vec::new();
            std::fs::File::from(fd).read_to_end(&mut v).map(|_| v)
        });
        let Some(rec) = data.ok().and_then(|d| MoveRecord::decode(&d)) else {
            warn!(
                "recovery: unreadable move record {rname:?} on '{}': nothing changed",
                db.name
            );
            return 0;
        };
        let src = branches.iter().find(|b| b.name == rec.src);
        let (Some(src), Some((source, copy)), true) = (src, rec.ids, db.name == rec.dst) else {
            warn!(
                "recovery: move record {rname:?} on '{}' ({} -> {}) cannot be verified (an \
                 older record, or an unknown branch): nothing changed",
                db.name, rec.src, rec.dst
            );
            return 0;
        };
        let case = Case {
            rec: &rec,
            seq: rname,
            src,
            dst: db,
            source,
            copy,
        };
        let found = case.observe();
        let p = plan(rec.phase, &found);
        log::debug!("recovery of {rname:?}: {found:?} -> {p:?}");
        case.apply(&p)
    }
}

/// How long `status` waits for one branch's count of records or kept copies.
const STATUS_LIMIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Host paths of what recovery kept, on every branch (for `status`). One host call per
/// branch, with at most [`STATUS_LIMIT`].
pub fn kept_dirs(branches: &[Arc<Branch>]) -> Vec<String> {
    let mut v = Vec::new();
    for b in branches {
        let root = b.root();
        let names = b.run_quick(
            move || {
                let meta = sys::open_dir_beneath(root.as_fd(), crate::branch::META.as_bytes())?;
                let kept = sys::open_dir_beneath(meta.as_fd(), KEPT.as_bytes())?;
                Ok(list(&kept))
            },
            STATUS_LIMIT,
        );
        for n in names.unwrap_or_default() {
            let mut rel = format!("{}/{KEPT}/", crate::branch::META).into_bytes();
            rel.extend_from_slice(n.as_bytes());
            v.push(show(b, &rel));
        }
    }
    v
}

/// Move records present on the branches now (a live move, or one left for recovery). One
/// host call per branch, with at most [`STATUS_LIMIT`].
pub fn records_present(branches: &[Arc<Branch>]) -> usize {
    branches
        .iter()
        .filter_map(|b| {
            let root = b.root();
            b.run_quick(
                move || {
                    let meta = sys::open_dir_beneath(root.as_fd(), crate::branch::META.as_bytes())?;
                    let moves = sys::open_dir_beneath(meta.as_fd(), b"moves")?;
                    Ok(list(&moves).len())
                },
                STATUS_LIMIT,
            )
            .ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::AtSource::{Absent as SA, Changed, Other as SO, Unchanged};
    use super::AtTarget::{Absent as TA, Copy, Other as TO};
    use super::*;

    #[test]
    fn nothing_placed_while_placing_rolls_back() {
        assert_eq!(plan(Phase::Placing, &[(TA, Unchanged)]), Plan::RollBack);
        // The issue-9 case: the target holds *other* objects at the recorded names, the
        // source other objects or nothing. The copy is nowhere: nothing is touched.
        assert_eq!(plan(Phase::Placing, &[(TO, SA), (TA, SO)]), Plan::RollBack);
    }

    #[test]
    fn a_move_cut_after_the_rename_is_finished() {
        // Died between the rename and the second link: link it, then remove both sources.
        assert_eq!(
            plan(Phase::Placing, &[(Copy, Unchanged), (TA, Unchanged)]),
            Plan::Finish(vec![
                Act::UnlinkSource(0),
                Act::LinkCopy(1),
                Act::UnlinkSource(1)
            ])
        );
        // Died between the source unlinks.
        assert_eq!(
            plan(Phase::Placing, &[(Copy, SA), (Copy, Unchanged)]),
            Plan::Finish(vec![Act::UnlinkSource(1)])
        );
        // Everything done but the record's removal.
        assert_eq!(
            plan(Phase::Placing, &[(Copy, SA), (Copy, SA)]),
            Plan::Finish(vec![])
        );
    }

    #[test]
    fn names_removed_after_the_move_are_not_brought_back() {
        // Unlinks began, then a target name vanished: it was removed on purpose (or by a
        // stale record's later life); the remaining source name is the only holder.
        assert_eq!(
            plan(Phase::Placing, &[(Copy, SA), (TA, SA)]),
            Plan::Finish(vec![])
        );
        // Committed: the union showed the target; a leftover source name is stale.
        assert_eq!(
            plan(Phase::Committed, &[(Copy, SA), (TA, Unchanged)]),
            Plan::Finish(vec![Act::UnlinkSource(1)])
        );
        assert_eq!(
            plan(Phase::Committed, &[(TA, Unchanged)]),
            Plan::Finish(vec![Act::UnlinkSource(0)])
        );
    }

    #[test]
    fn doubt_keeps_both_and_deletes_nothing() {
        // The source changed after the copy: neither is deleted; the copy the union did
        // not show goes aside.
        assert_eq!(
            plan(Phase::Placing, &[(Copy, Changed)]),
            Plan::KeepBoth(vec![Act::KeepTarget(0)])
        );
        assert_eq!(
            plan(Phase::Committed, &[(Copy, Changed)]),
            Plan::KeepBoth(vec![Act::KeepSource(0)])
        );
        // Another object at a source name: the names with one holder stay as they are.
        assert_eq!(
            plan(Phase::Placing, &[(Copy, SO), (Copy, SA)]),
            Plan::KeepBoth(vec![Act::KeepTarget(0)])
        );
        // Another object at a target name where the source is unchanged.
        assert_eq!(
            plan(Phase::Placing, &[(Copy, Unchanged), (TO, Unchanged)]),
            Plan::KeepBoth(vec![Act::UnlinkSource(0), Act::KeepTarget(1)])
        );
        for p in [Phase::Placing, Phase::Committed] {
            for t in [TA, Copy, TO] {
                for s in [SA, Unchanged, Changed, SO] {
                    let acts = match plan(p, &[(t, s), (Copy, Unchanged)]) {
                        Plan::RollBack => continue,
                        Plan::Finish(a) | Plan::KeepBoth(a) => a,
                    };
                    for (k, a) in acts.iter().enumerate() {
                        if let Act::UnlinkSource(i) = *a {
                            let (ti, si) = [(t, s), (Copy, Unchanged)][i];
                            assert_eq!(
                                si, Unchanged,
                                "{p:?} {t:?} {s:?}: removed a changed source"
                            );
                            let linked = acts[..k].contains(&Act::LinkCopy(i));
                            assert!(
                                ti == Copy || linked || p == Phase::Committed,
                                "{p:?} {t:?} {s:?}: removed a source whose copy is not in place"
                            );
                        }
                    }
                }
            }
        }
    }
}
