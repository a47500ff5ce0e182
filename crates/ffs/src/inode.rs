//! In-core inodes and the inode table that holds them.
//!
//! An inode is in core while anything refers to it: the kernel (lookup count), an open
//! handle, or the operation using it. The table is the only way to reach one for a change
//! ([`InodeTable::get`]), which is what lets an undo scope save each inode on its first
//! touch and put it back on a rollback (see `undo`).
//!
//! Invariant, at every operation boundary: each in-core inode equals its encoding in its
//! inode-table buffer (every change is followed by [`InodeTable::store`] before the
//! operation ends), and the orphan set is exactly the in-core inodes with no link.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use cairn_bufcache::BufRef;
use cairn_vfs::acl::Acl;
use cairn_vfs::{Attr, Errno, FileKind, Result};

use crate::corrupt_err;
use crate::format::{DiskInode, Geometry};
use crate::volume::Volume;

/// An inode in memory: its disk form plus the references that keep it alive.
///
/// Attached when: loaded by [`InodeTable::get`] or made by [`InodeTable::insert`] (inode
/// allocation). Freed when: nothing refers to it any more (the kernel forgot it, no handle
/// is open) and it is not an orphan, or when an unlinked inode is reclaimed.
#[derive(Clone)]
pub(crate) struct InCore {
    /// The inode as it is (or will be) encoded on disk: `d.nlink` is the on-disk link count.
    pub d: DiskInode,
    /// The link count the namespace sees (FreeBSD's `i_effnlink`): the names that exist
    /// now. It drops with each removal at once; `d.nlink` drops when the strategy says the
    /// removal may be on disk first (`Apply`), so `effnlink <= d.nlink` always, and the two
    /// differ only while a mode defers drops (soft updates). stat(2) shows this one.
    pub effnlink: u32,
    /// Lookups the kernel holds (FUSE lookup count).
    pub nlookup: u64,
    /// Open handles.
    pub nopen: u32,
    /// Writes between their passes (a `Concurrent` mode's write releases the engine's lock
    /// while its data goes to the device), and reads whose device reads run without that
    /// lock: like a handle, each keeps the inode in core and its blocks allocated until the
    /// call's last pass is done.
    pub writing: u32,
    /// The undo scope that last saved this inode (see `undo`).
    pub undo_scope: u64,
    /// The access ACL, decoded from the extended-attribute block on the first permission
    /// check that needs it (`None`: not read yet; `Some(None)`: the inode has none). Every
    /// change of the block drops it (`Ffs::write_xattrs`), and an undo puts back the
    /// in-core inode whole, so it always says what the block says.
    pub acl: Option<Option<Arc<Acl>>>,
    /// Made by O_TMPFILE without O_EXCL and not linked since (Linux's `I_LINKABLE`): the
    /// one inode with no link that `link` may name. Never on disk: after a crash the inode
    /// is an orphan, and recovery frees it.
    pub linkable: bool,
}

impl InCore {
    pub fn new(d: DiskInode) -> InCore {
        InCore {
            effnlink: d.nlink,
            d,
            nlookup: 0,
            nopen: 0,
            writing: 0,
            undo_scope: 0,
            acl: None,
            linkable: false,
        }
    }

    /// Whether the inode may leave memory: nothing refers to it (no lookup, handle or
    /// write in flight), it is not a directory (their indexes stay), and no drop of its
    /// on-disk count is deferred — reloaded, it would take the on-disk count as the names it
    /// has and the drop, clamped to those, would be lost (a link count left high). An
    /// unlinked inode is reclaimed instead, not dropped.
    pub fn may_leave_core(&self) -> bool {
        self.nlookup == 0
            && self.nopen == 0
            && self.writing == 0
            && self.effnlink == self.d.nlink
            && !self.d.is_dir()
    }
}

/// Every inode in core, and the orphans among them.
#[derive(Default)]
pub(crate) struct InodeTable {
    map: HashMap<u64, InCore>,
    /// Unlinked inodes still referenced (open, or not yet forgotten by the kernel). An
    /// ordered set: nothing on the write path may depend on hash order.
    orphans: BTreeSet<u64>,
    undo: InodeUndo,
}

/// The inode table's half of an open undo scope.
#[derive(Default)]
struct InodeUndo {
    /// The scope's number (0: no scope open). In-core inodes carry the number of the scope
    /// that last saved them, so the first touch in a scope is one comparison.
    scope: u64,
    last_scope: u64,
    /// Every inode touched in the scope, with its in-core state before (None: not in core).
    saved: Vec<(u64, Option<InCore>)>,
}

impl InodeUndo {
    /// Saves `ic` (inode `ino`) if this is the scope's first touch of it.
    fn touch(&mut self, ino: u64, ic: &mut InCore) {
        if self.scope != 0 && ic.undo_scope != self.scope {
            ic.undo_scope = self.scope;
            self.saved.push((ino, Some(ic.clone())));
        }
    }

    /// Inode `ino` came into core during the scope (loaded or created).
    fn arrived(&mut self, ino: u64, ic: &mut InCore) {
        if self.scope != 0 {
            ic.undo_scope = self.scope;
            self.saved.push((ino, None));
        }
    }
}

impl InodeTable {
    /// The in-core inode `ino`, loading it, for reading or changing it. A free inode is
    /// ENOENT (a stale handle).
    ///
    /// This is the only way to change an in-core inode: inside an undo scope it saves the
    /// inode on its first touch, so a failed operation can put it back.
    pub fn get(&mut self, vol: &Volume, ino: u64) -> Result<&mut InCore> {
        let InodeTable { map, undo, .. } = self;
        match map.entry(ino) {
            std::collections::hash_map::Entry::Vacant(e) => {
                let d = vol.read_disk_inode(ino)?;
                if d.is_free() {
                    return Err(Errno::ENOENT.into());
                }
                validate_pointers(&vol.geo, ino, &d)?;
                let ic = e.insert(InCore::new(d));
                undo.arrived(ino, ic);
                Ok(ic)
            }
            std::collections::hash_map::Entry::Occupied(e) => {
                let ic = e.into_mut();
                undo.touch(ino, ic);
                Ok(ic)
            }
        }
    }

    /// Inode `ino` if it is in core, for changing it (saved in an open scope like `get`).
    pub fn loaded_mut(&mut self, ino: u64) -> Option<&mut InCore> {
        let InodeTable { map, undo, .. } = self;
        let ic = map.get_mut(&ino)?;
        undo.touch(ino, ic);
        Some(ic)
    }

    /// Inode `ino` if it is in core, read-only.
    pub fn loaded(&self, ino: u64) -> Option<&InCore> {
        self.map.get(&ino)
    }

    /// Puts a newly allocated inode in core, recording it in the undo scope.
    pub fn insert(&mut self, ino: u64, d: DiskInode) {
        let InodeTable { map, undo, .. } = self;
        match map.entry(ino) {
            std::collections::hash_map::Entry::Occupied(e) => {
                // Not expected (a free inode is never in core), but keep it restorable.
                let ic = e.into_mut();
                undo.touch(ino, ic);
                let saved_in = ic.undo_scope;
                *ic = InCore::new(d);
                ic.undo_scope = saved_in;
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                let ic = e.insert(InCore::new(d));
                undo.arrived(ino, ic);
            }
        }
    }

    /// Drops inode `ino` from core (freed, or no longer referenced). In a scope it was
    /// saved by the `get` that reached it, so a rollback brings it back.
    pub fn remove(&mut self, ino: u64) {
        self.map.remove(&ino);
        self.orphans.remove(&ino);
    }

    /// Encodes the in-core inode into its table block and marks it dirty; returns the block.
    /// Encodes in-core inode `ino` into its block; the block, and the size its slot held
    /// before.
    pub fn store(&self, vol: &Volume, ino: u64) -> Result<(BufRef, u64)> {
        let ic = self
            .map
            .get(&ino)
            .ok_or_else(|| corrupt_err(format!("inode {ino} not in core")))?;
        vol.write_disk_inode(ino, &ic.d)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    // ---- orphans -----------------------------------------------------------------------

    /// Records that unlinked inode `ino` must wait for its last reference.
    pub fn add_orphan(&mut self, ino: u64) {
        self.orphans.insert(ino);
    }

    pub fn remove_orphan(&mut self, ino: u64) {
        self.orphans.remove(&ino);
    }

    /// The orphans nobody has open: free space already, as statfs counts it (only the
    /// kernel's lookup reference, dropped by a forget that may still be in flight, keeps
    /// them). Returns (blocks, inodes).
    pub fn orphan_space(&self) -> (u64, u64) {
        let (mut blocks, mut inodes) = (0, 0);
        for ic in self
            .orphans
            .iter()
            .filter_map(|i| self.map.get(i))
            .filter(|ic| ic.nopen == 0)
        {
            blocks += ic.d.blocks;
            inodes += 1;
        }
        (blocks, inodes)
    }

    /// Every in-core inode without a link, in inode order (unmount frees them: each free
    /// is an ordered write, so the order is part of the device's write stream, which must
    /// be the same on every run).
    pub fn unlinked(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .map
            .iter()
            .filter(|(_, ic)| ic.effnlink == 0)
            .map(|(&i, _)| i)
            .collect();
        v.sort_unstable();
        v
    }

    // ---- undo --------------------------------------------------------------------------

    pub fn begin_undo(&mut self) {
        self.undo.last_scope += 1;
        self.undo.scope = self.undo.last_scope;
    }

    pub fn commit_undo(&mut self) {
        self.undo.scope = 0;
        self.undo.saved.clear();
    }

    /// Puts back every inode the scope touched, newest first, so an inode touched twice
    /// (removed, then loaded again) ends in its state from before the scope; the orphan set
    /// is recomputed for each.
    pub fn rollback_undo(&mut self) {
        self.undo.scope = 0;
        for (ino, before) in std::mem::take(&mut self.undo.saved).into_iter().rev() {
            match before {
                Some(ic) => {
                    self.map.insert(ino, ic);
                }
                None => {
                    self.map.remove(&ino);
                }
            }
            // An unlinked inode kept in core is an orphan: statfs counts it as free, unmount
            // frees it.
            if self.map.get(&ino).is_some_and(|ic| ic.effnlink == 0) {
                self.orphans.insert(ino);
            } else {
                self.orphans.remove(&ino);
            }
        }
    }

    /// The invariant (module documentation), with `opened` the handles per inode. Returns
    /// the first disagreement.
    pub fn check(
        &self,
        vol: &Volume,
        opened: &HashMap<u64, u32>,
    ) -> std::result::Result<(), String> {
        for (&ino, ic) in &self.map {
            let d = vol.read_disk_inode(ino).map_err(|e| e.to_string())?;
            if d != ic.d {
                return Err(format!("inode {ino}: in core {:?}, buffer {d:?}", ic.d));
            }
            if opened.get(&ino).copied().unwrap_or(0) != ic.nopen {
                return Err(format!(
                    "inode {ino}: nopen {} disagrees with the handles",
                    ic.nopen
                ));
            }
            if (ic.effnlink == 0) != self.orphans.contains(&ino) {
                return Err(format!(
                    "inode {ino}: effective link count {} but orphan set says otherwise",
                    ic.effnlink
                ));
            }
            if ic.effnlink > ic.d.nlink {
                return Err(format!(
                    "inode {ino}: effective link count {} above the on-disk {}",
                    ic.effnlink, ic.d.nlink
                ));
            }
        }
        if let Some(ino) = opened.keys().find(|i| !self.map.contains_key(i)) {
            return Err(format!("handle on inode {ino} not in core"));
        }
        if let Some(o) = self.orphans.iter().find(|o| !self.map.contains_key(o)) {
            return Err(format!("orphan {o} not in core"));
        }
        Ok(())
    }
}

fn validate_pointers(geo: &Geometry, ino: u64, d: &DiskInode) -> Result<()> {
    for p in d.root_pointers().chain((d.xattr != 0).then_some(d.xattr)) {
        if !geo.is_data_block(p) {
            return Err(corrupt_err(format!(
                "inode {ino}: block pointer {p} out of range"
            )));
        }
    }
    Ok(())
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub(crate) fn ns_to_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_nanos(ns.unsigned_abs()))
            .unwrap_or(UNIX_EPOCH)
    }
}

pub(crate) fn time_to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

/// The attributes of inode `ino` as the file-system contract reports them.
pub(crate) fn attr_of(geo: &Geometry, ino: u64, ic: &InCore) -> Attr {
    let d = &ic.d;
    Attr {
        ino,
        generation: d.generation as u64,
        size: d.size,
        blocks: d.blocks * (geo.block_size as u64 / 512),
        atime: ns_to_time(d.atime),
        mtime: ns_to_time(d.mtime),
        ctime: ns_to_time(d.ctime),
        crtime: ns_to_time(d.btime),
        kind: FileKind::from_mode(d.mode).unwrap_or(FileKind::RegularFile),
        perm: (d.mode & 0o7777) as u16,
        nlink: ic.effnlink,
        uid: d.uid,
        gid: d.gid,
        rdev: d.rdev,
        blksize: geo.block_size,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_roundtrip() {
        for ns in [0i64, 1, 1_700_000_000_123_456_789, -5_000_000_001] {
            assert_eq!(time_to_ns(ns_to_time(ns)), ns);
        }
    }
}
