//! Failed operations change nothing.
//!
//! Every mutating operation runs inside an *undo scope* ([`Ffs::atomically`]), its
//! durability point (`op_done`) included. If it returns an error — no space, a device
//! error, corruption found halfway — everything it changed is taken back before the error
//! reaches the caller, so the image and the in-core state are exactly as before the call:
//!
//! - **Buffers** (bitmaps, descriptors, inodes, directories, indirect blocks, data in the
//!   cache): the buffer cache's undo scope (`cairn_bufcache`, "Undo") restores each one's
//!   bytes, drops the buffers the operation created and puts back the ones it invalidated.
//!   In `sync` mode the operation may already have written some of its steps; the cache
//!   writes them back in reverse step order, a flush after each, so every state the device
//!   passes through is one a crash during the operation's own steps could have left (at
//!   worst a leak, by the ordering rules of 002 §3), and when the rollback is done the
//!   device holds the image from before the operation.
//! - **In-core state** kept beside the buffers, restored here from what the operation
//!   touched first: in-core inodes (saved on their first [`Ffs::iget`] in the scope, which
//!   is the only way to change one), group summaries (saved on their first change,
//!   [`State::group_mut`]), the free counts, the handles opened, the orphan set
//!   (recomputed for every restored inode). Directory indexes the operation changed are
//!   dropped and rebuilt from the restored blocks on next use.
//!
//! Invariant, at every operation boundary: each in-core inode equals its encoding in its
//! inode-table buffer, each group summary equals its descriptor buffer, the free counts are
//! the sums of the summaries, the orphan set is the in-core inodes without a link, and each
//! directory index describes its directory's blocks. The undo restores the buffers and this
//! state together, so the invariant holds after a failed operation as after a successful
//! one. [`Ffs::self_check`] verifies it.
//!
//! Not taken back: statistics, and file data a stream sent to the device over blocks the
//! file already owned in the run whose device write failed (see `do_write`: a write's
//! last point of failure comes before its data moves; a failure in a later run makes it a
//! short write).
//!
//! Preflight checks ([`Ffs::reserve`]) refuse an operation that would run out of space or
//! inodes before it changes anything, so the common ENOSPC costs no rollback at all.
//!
//! This module and the cache's undo are all there is to it: code that changes state goes
//! through `iget`, `group_mut`, `Buf::write`/`write_range` and the `dir_*` functions as it
//! would anyway, and nothing compensates for failures at call sites.

use cairn_vfs::{Errno, FsError, Result};

use crate::format::GroupDesc;
use crate::inode::InCore;
use crate::{Ffs, State};

/// The in-core half of an open undo scope.
#[derive(Default)]
pub(crate) struct Undo {
    /// The scope's number (0: no scope open). In-core inodes carry the number of the scope
    /// that last saved them, so the first touch in a scope is one comparison.
    pub scope: u64,
    last_scope: u64,
    /// Every inode touched in the scope, with its in-core state before (None: not in core).
    pub inodes: Vec<(u64, Option<InCore>)>,
    /// Every group summary changed, as it was before.
    pub groups: Vec<(usize, GroupDesc)>,
    /// Directories whose index the scope changed or built.
    pub dirs: Vec<u64>,
    free_blocks: u64,
    free_inodes: u64,
    next_fh: u64,
    data_allocs_pending: bool,
}

impl Undo {
    pub fn active(&self) -> bool {
        self.scope != 0
    }

    /// Saves `ic` (inode `ino`) if this is the scope's first touch of it.
    pub fn touch_inode(&mut self, ino: u64, ic: &mut InCore) {
        if self.scope != 0 && ic.undo_scope != self.scope {
            ic.undo_scope = self.scope;
            self.inodes.push((ino, Some(ic.clone())));
        }
    }

    /// Inode `ino` came into core during the scope (loaded or created).
    pub fn new_inode(&mut self, ino: u64, ic: &mut InCore) {
        if self.scope != 0 {
            ic.undo_scope = self.scope;
            self.inodes.push((ino, None));
        }
    }

    pub fn touch_dir(&mut self, dino: u64) {
        if self.scope != 0 && self.dirs.last() != Some(&dino) {
            self.dirs.push(dino);
        }
    }
}

impl State {
    /// Group `g`'s summary, for changing it: saved first if an undo scope is open.
    pub(crate) fn group_mut(&mut self, g: u64) -> &mut GroupDesc {
        let g = g as usize;
        if self.undo.active() && !self.undo.groups.iter().any(|(i, _)| *i == g) {
            self.undo.groups.push((g, self.groups[g].clone()));
        }
        &mut self.groups[g]
    }
}

impl Ffs {
    /// Runs `f` so that an error leaves everything as before it (see the module
    /// documentation). `f` must not open a scope itself.
    pub(crate) fn atomically<T>(
        &self,
        st: &mut State,
        f: impl FnOnce(&mut State) -> Result<T>,
    ) -> Result<T> {
        // Fails only while an earlier rollback's device writes are still refused: nothing
        // may change before the image is back.
        self.cache.begin_undo().map_err(FsError::Io)?;
        st.undo.last_scope += 1;
        st.undo.scope = st.undo.last_scope;
        st.undo.free_blocks = st.free_blocks;
        st.undo.free_inodes = st.free_inodes;
        st.undo.next_fh = st.next_fh;
        st.undo.data_allocs_pending = self
            .io
            .data_allocs_pending
            .load(std::sync::atomic::Ordering::Acquire);
        let r = f(st);
        match &r {
            Ok(_) => {
                self.cache.commit_undo();
                st.undo.scope = 0;
                st.undo.inodes.clear();
                st.undo.groups.clear();
                st.undo.dirs.clear();
            }
            Err(e) => self.rollback(st, e),
        }
        r
    }

    fn rollback(&self, st: &mut State, cause: &FsError) {
        if let Err(e) = self.cache.rollback_undo() {
            log::error!(
                "taking back a failed operation ({cause}): the device refused the rollback \
                 ({e}); it is retried before any other write"
            );
        }
        let u = &mut st.undo;
        u.scope = 0;
        let inodes = std::mem::take(&mut u.inodes);
        let groups = std::mem::take(&mut u.groups);
        let dirs = std::mem::take(&mut u.dirs);
        // Newest first, so an inode touched twice (removed, then loaded again) ends in its
        // state from before the scope.
        for (ino, before) in inodes.into_iter().rev() {
            match before {
                Some(ic) => {
                    st.inodes.insert(ino, ic);
                }
                None => {
                    st.inodes.remove(&ino);
                }
            }
            // An unlinked inode kept in core is an orphan: statfs counts it as free, unmount
            // frees it.
            if st.inodes.get(&ino).is_some_and(|ic| ic.d.nlink == 0) {
                st.orphans.insert(ino);
            } else {
                st.orphans.remove(&ino);
            }
        }
        for (g, d) in groups.into_iter().rev() {
            st.groups[g] = d;
        }
        for d in dirs {
            st.dirs.remove(&d);
        }
        st.free_blocks = st.undo.free_blocks;
        st.free_inodes = st.undo.free_inodes;
        for fh in st.undo.next_fh..st.next_fh {
            st.handles.remove(&fh);
        }
        st.next_fh = st.undo.next_fh;
        st.free_on_truncate = None;
        if st.undo.data_allocs_pending {
            self.io
                .data_allocs_pending
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Refuses with ENOSPC, before anything changes, an operation that needs `inodes`
    /// inodes and `blocks` blocks when fewer are free (the preflight that keeps the common
    /// ENOSPC from ever being hit halfway). The summaries are trusted here; should they be
    /// wrong, the allocator still fails cleanly and the undo takes the operation back.
    pub(crate) fn reserve(&self, st: &State, inodes: u64, blocks: u64) -> Result<()> {
        if st.free_inodes < inodes || st.free_blocks < blocks {
            return Err(Errno::ENOSPC.into());
        }
        Ok(())
    }
}

impl Ffs {
    /// Verifies the invariant the undo keeps (module documentation): in-core inodes, group
    /// summaries, free counts, orphans, handles and directory indexes agree with the
    /// buffers. Returns the first disagreement. For tests.
    #[doc(hidden)]
    pub fn self_check(&self) -> std::result::Result<(), String> {
        let mut st = self.st.lock();
        let st = &mut *st;
        let e = |x: FsError| x.to_string();
        let (mut fb, mut fi) = (0u64, 0u64);
        for g in 0..self.geo.group_count {
            let b = self
                .bread(self.geo.desc_block(g), crate::format::kind::GROUP)
                .map_err(e)?;
            let d = GroupDesc::decode(&b.read(), g).map_err(|x| x.0)?;
            if d != st.groups[g as usize] {
                return Err(format!(
                    "group {g}: in core {:?}, buffer {d:?}",
                    st.groups[g as usize]
                ));
            }
            fb += d.free_blocks as u64;
            fi += d.free_inodes as u64;
        }
        if (fb, fi) != (st.free_blocks, st.free_inodes) {
            return Err(format!(
                "free counts in core ({}, {}), sum of the groups ({fb}, {fi})",
                st.free_blocks, st.free_inodes
            ));
        }
        let mut opened: std::collections::HashMap<u64, u32> = Default::default();
        for h in st.handles.values() {
            *opened.entry(h.ino).or_default() += 1;
        }
        for (&ino, ic) in &st.inodes {
            let d = self.read_disk_inode(ino).map_err(e)?;
            if d != ic.d {
                return Err(format!("inode {ino}: in core {:?}, buffer {d:?}", ic.d));
            }
            if opened.get(&ino).copied().unwrap_or(0) != ic.nopen {
                return Err(format!(
                    "inode {ino}: nopen {} disagrees with the handles",
                    ic.nopen
                ));
            }
            if (ic.d.nlink == 0) != st.orphans.contains(&ino) {
                return Err(format!(
                    "inode {ino}: nlink {} but orphan set says otherwise",
                    ic.d.nlink
                ));
            }
        }
        if let Some(h) = st
            .handles
            .values()
            .find(|h| !st.inodes.contains_key(&h.ino))
        {
            return Err(format!("handle on inode {} not in core", h.ino));
        }
        if let Some(o) = st.orphans.iter().find(|o| !st.inodes.contains_key(o)) {
            return Err(format!("orphan {o} not in core"));
        }
        let dirs: Vec<u64> = st.dirs.keys().copied().collect();
        for dino in dirs {
            let Some(old) = st.dirs.remove(&dino) else {
                continue;
            };
            let fresh = self.dir_index(st, dino).map_err(e);
            let same = match &fresh {
                Ok(f) => {
                    f.names == old.names
                        && f.dotdot == old.dotdot
                        && f.nblocks == old.nblocks
                        && f.free.values().eq(old.free.values())
                }
                Err(_) => false,
            };
            st.dirs.insert(dino, old);
            if !same {
                return Err(format!("directory {dino}: index differs from its blocks"));
            }
        }
        Ok(())
    }
}
