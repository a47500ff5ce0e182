//! Failed operations change nothing.
//!
//! Every mutating operation runs inside an *undo scope* ([`Ffs::atomically`]), its
//! durability point (the strategy's `end_op`) included. If it returns an error — no space, a device
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
//! - **In-core state** kept beside the buffers, each piece by the type that owns it:
//!   in-core inodes (`InodeTable`: saved on their first touch in the scope, the only way to
//!   change one; the orphan set recomputed for every restored inode), group summaries and
//!   free counts (`Allocator`: saved on their first change), the handles opened (`Handles`),
//!   and the directory indexes the operation changed (`Directories`: dropped and rebuilt
//!   from the restored blocks on next use). [`Ffs::atomically`] opens and closes the
//!   scope in all of them at once.
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
//! Preflight checks ((`Allocator::reserve`)) refuse an operation that would run out of space or
//! inodes before it changes anything, so the common ENOSPC costs no rollback at all.
//!
//! This module, the cache's undo and each type's half are all there is to it: code that
//! changes state goes through the types' methods and `Buf::write`/`write_range` as it would
//! anyway, and nothing compensates for failures at call sites.

use cairn_vfs::{FsError, Result};

use crate::{Ffs, State};

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
        self.vol.cache.begin_undo().map_err(FsError::Io)?;
        st.alloc.begin_undo();
        st.inodes.begin_undo();
        st.dirs.begin_undo();
        st.handles.begin_undo();
        let r = f(st);
        match &r {
            Ok(_) => {
                self.vol.cache.commit_undo();
                st.alloc.commit_undo();
                st.inodes.commit_undo();
                st.dirs.commit_undo();
                st.handles.commit_undo();
            }
            Err(e) => self.rollback(st, e),
        }
        r
    }

    fn rollback(&self, st: &mut State, cause: &FsError) {
        if let Err(e) = self.vol.cache.rollback_undo() {
            log::error!(
                "taking back a failed operation ({cause}): the device refused the rollback \
                 ({e}); it is retried before any other write"
            );
        }
        st.inodes.rollback_undo();
        st.alloc.rollback_undo();
        st.dirs.rollback_undo();
        st.handles.rollback_undo();
        if let Some(op) = st.op.as_mut() {
            // Releases taken back with the free that declared them.
            op.released.clear();
        }
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
        st.alloc.check(&self.vol)?;
        st.inodes.check(&self.vol, &st.handles.per_inode())?;
        for dino in st.dirs.indexed() {
            let Some(old) = st.dirs.remove(dino) else {
                continue;
            };
            // Rebuilt with the index's own holds (the strategy may have given some back
            // since: a write-back runs beside this check); the strategy's holds must be
            // among them (none appears outside a call).
            let fresh = self
                .iget(st, dino)
                .map(|i| i.d.size / self.vol.geo.block_size as u64)
                .and_then(|n| self.build_dir_index(st, dino, n, &|a| old.held_in(a).to_vec()))
                .map_err(|e| e.to_string());
            let same = match &fresh {
                Ok(f) => {
                    f.names == old.names
                        && f.dotdot == old.dotdot
                        && f.nblocks == old.nblocks
                        && f.free.values().eq(old.free.values())
                        && f.held == old.held
                }
                Err(_) => false,
            };
            let unknown = (0..old.nblocks).any(|lbn| {
                self.bmap(st, dino, lbn).is_ok_and(|a| {
                    self.held_bytes(a)
                        .iter()
                        .any(|h| !old.held_in(a).contains(h))
                })
            });
            st.dirs.restore(dino, old);
            if !same {
                return Err(format!("directory {dino}: index differs from its blocks"));
            }
            if unknown {
                return Err(format!(
                    "directory {dino}: the strategy holds bytes its index does not"
                ));
            }
        }
        Ok(())
    }
}
