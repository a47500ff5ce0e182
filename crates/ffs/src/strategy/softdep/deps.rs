//! The dependency records of soft updates and their bookkeeping (002 §3; FreeBSD's
//! `softdep.h`). Every record says what it rolls back while it is unsatisfied and what it
//! waits for; docs/DESIGN.md ("Soft updates") documents when each is attached and freed.
//!
//! A record waits for [`Cond`]s: a block (or one inode's slot, or one entry of a directory
//! block) written *durably* — written, then a device flush — by a write that began after
//! the record was made. The write's image was copied before the write's sequence number was
//! taken, and no call changes a buffer while a soft-updates write is under way (the gate in
//! `mod.rs`), so a write numbered above a record always carries the change the record is
//! about.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::super::{BlockKind, InodePtr, Release};
use super::{Blk, Ino};

/// What a record waits for: a block written after `seq` (any write of it: bitmaps, group
/// descriptors, a new block's contents, a directory block carrying a removal), one inode
/// written after `seq` with nothing of it rolled back, or one directory entry written after
/// `seq` without being rolled back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cond {
    Block(Blk, u64),
    Inode { ino: Ino, blk: Blk, seq: u64 },
    Entry { blk: Blk, off: u32, seq: u64 },
}

impl Cond {
    pub fn blk(&self) -> Blk {
        match *self {
            Cond::Block(b, _) => b,
            Cond::Inode { blk, .. } | Cond::Entry { blk, .. } => blk,
        }
    }

    /// Whether the durable write `w` satisfies this condition.
    pub fn met_by(&self, w: &Written) -> bool {
        match *self {
            Cond::Block(b, s) => b == w.blk && w.seq > s,
            Cond::Inode { ino, blk, seq } => {
                blk == w.blk && w.seq > seq && !w.rolled_inodes.contains(&ino)
            }
            Cond::Entry { blk, off, seq } => {
                blk == w.blk && w.seq > seq && !w.rolled_offs.contains(&off)
            }
        }
    }
}

/// One device write of a block as soft updates saw it in `before_write`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Written {
    pub blk: Blk,
    pub seq: u64,
    /// Inodes of an inode block written rolled back (freed or with pointers undone).
    pub rolled_inodes: Vec<Ino>,
    /// Entries of a directory block written rolled back.
    pub rolled_offs: Vec<u32>,
}

/// Where an allocation's pointer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PtrAt {
    /// In inode `ino` (its table block `iblk`).
    Inode { ptr: InodePtr, iblk: Blk },
    /// In slot `slot` of indirect block `holder`; `iblk` is the owner inode's table block.
    Indir { holder: Blk, slot: u32, iblk: Blk },
}

/// Work a record does once its conditions hold (FreeBSD's worklist items).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// `handle_workitem_remove`: the removal is on disk, the on-disk count may drop.
    Drop(Ino, u32),
    /// `handle_workitem_freeblocks` / `_freefile`: nothing on disk points there any more.
    Release(Release),
}

#[derive(Clone, Debug)]
pub(crate) enum What {
    /// inodedep's DEPCOMPLETE (FreeBSD `inomapdep`): until the inode's bitmap and group
    /// descriptor are on disk, the inode is written as a free one.
    InoMap { ino: Ino, iblk: Blk },
    /// `allocdirect` / `allocindir`: until the new block's bitmap and its contents are on
    /// disk, the pointer is written as its old value and the inode's size as the size that
    /// covers only pointers already safe (`cut`: the first logical block no longer
    /// covered). An indirect pointer, once safe, stays `applied` until the indirect block
    /// carrying it is written: only then may the inode's size cover it.
    Alloc {
        ino: Ino,
        at: PtrAt,
        cut: Option<u64>,
        new_blk: Blk,
        old_blk: Blk,
        #[allow(dead_code)]
        kind: BlockKind,
        applied: bool,
    },
    /// `diradd` (`old: None`) or `dirchange`-style `diradd` with DIRCHG (`old: Some`):
    /// until the named inode (and any link count raised for it) is on disk, the entry is
    /// written as free space, or as naming its old inode.
    Entry {
        dir: Ino,
        blk: Blk,
        off: u32,
        target: Ino,
        old: Option<(u32, u8)>,
        /// The entry may go to disk as it is (what it waited for is on disk), and no
        /// longer rolls back; kept until its block is written, so entries added to the
        /// directory it names still wait for it.
        applied: bool,
    },
    /// A size raised over blocks the file already had (a write past the end into its
    /// last block, or one that fills earlier holes' neighbours): until the data written
    /// there is on disk, the inode's size is written as `safe`, the size on disk before
    /// (FreeBSD keeps the old size in the inode until the data is written, the same
    /// guarantee: no byte within the size on disk that the file never had).
    Size { ino: Ino, iblk: Blk, safe: u64 },
    /// A worklist item: `dirrem`, `freeblks`, `freefile`.
    Work(Action),
}

#[derive(Clone, Debug)]
pub(crate) struct Rec {
    pub id: u64,
    pub what: What,
    pub waits: Vec<Cond>,
}

impl Rec {
    /// The blocks whose writes this record rolls back something in.
    fn rollback_blocks(&self) -> Vec<Blk> {
        match &self.what {
            What::InoMap { iblk, .. } => vec![*iblk],
            What::Alloc { at, .. } => match *at {
                PtrAt::Inode { iblk, .. } => vec![iblk],
                PtrAt::Indir { holder, iblk, .. } => vec![holder, iblk],
            },
            What::Entry { blk, .. } => vec![*blk],
            What::Size { iblk, .. } => vec![*iblk],
            What::Work(_) => vec![],
        }
    }
}

/// What a call in progress changed, to take it back if the call fails (the engine's undo
/// restores the buffers; this restores the records that describe them).
#[derive(Default)]
pub(crate) struct OpLog {
    /// Records made before the call that it removed or changed: put back as they were.
    pub saved: Vec<Rec>,
    /// Ids of records the call made.
    pub made: Vec<u64>,
    /// Work queued as ready by the call.
    pub ready_len: usize,
    /// Inodes whose link count the call raised: an entry the call adds waits for them.
    pub raised: Vec<Ino>,
    /// Entries the call added or changed (rename forces them before the old name goes).
    pub entries: Vec<u64>,
    pub nesting: u32,
}

/// Every record, indexed.
#[derive(Default)]
pub(crate) struct Deps {
    pub seq: u64,
    next_id: u64,
    pub recs: HashMap<u64, Rec>,
    // Indexes: ordered, so every walk over them (and so the order of writes and of the
    // worklist) is the same on every run — crash recordings are compared by seed.
    pub by_block: BTreeMap<Blk, BTreeSet<u64>>,
    waiting: BTreeMap<Blk, BTreeSet<u64>>,
    pub alloc_by_ino: BTreeMap<Ino, BTreeSet<u64>>,
    /// Allocation records by (inode, new block): whether a block of a file is one it was
    /// given since its last write-back, in O(1) (a size raised by a streaming write asks it
    /// of every block it covers; scanning `alloc_by_ino` made that quadratic in the file).
    pub alloc_new: HashMap<(Ino, Blk), u32>,
    pub inomap: HashMap<Ino, u64>,
    pub entries: HashMap<(Blk, u32), u64>,
    /// Directory blocks that had entries removed, by directory, until the directory itself
    /// is removed (its removal must not reach disk before theirs).
    pub removed_in: HashMap<Ino, Vec<Blk>>,
    /// Each inode's size as last encoded (to see a size raised).
    pub enc_size: HashMap<Ino, u64>,
    /// Size holds by inode.
    pub sizes: BTreeMap<Ino, BTreeSet<u64>>,
    /// Pending entries by the inode they name.
    naming: BTreeMap<Ino, BTreeSet<u64>>,
    /// Bitmap and descriptor of each block allocated, until the pointer to it is declared.
    pub blkmap: HashMap<Blk, [Blk; 2]>,
    /// Writes between `before_write` and `after_write`.
    pub inflight: HashMap<Blk, Written>,
    /// Writes completed and not yet flushed.
    pub unflushed: Vec<Written>,
    pub ready: VecDeque<Action>,
    /// Worklist items taken off `ready` and being applied through the engine (a background
    /// check must see them held until the engine has them: `background_check_holds`).
    pub running: Vec<Action>,
    pub op: Option<OpLog>,
    /// Highest number of records at once (for `stats`).
    pub peak: usize,
}

impl Deps {
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub fn insert(&mut self, what: What, waits: Vec<Cond>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let rec = Rec { id, what, waits };
        if let Some(op) = self.op.as_mut() {
            op.made.push(id);
            if matches!(rec.what, What::Entry { .. }) {
                op.entries.push(id);
            }
        }
        if rec.waits.is_empty() {
            // Nothing to wait for: done at once.
            self.index(&rec);
            self.recs.insert(id, rec);
            self.complete(id);
            return id;
        }
        self.index(&rec);
        self.recs.insert(id, rec);
        self.peak = self.peak.max(self.recs.len());
        id
    }

    fn index(&mut self, rec: &Rec) {
        for b in rec.rollback_blocks() {
            self.by_block.entry(b).or_default().insert(rec.id);
        }
        for c in &rec.waits {
            self.waiting.entry(c.blk()).or_default().insert(rec.id);
        }
        match &rec.what {
            What::InoMap { ino, .. } => {
                self.inomap.insert(*ino, rec.id);
            }
            What::Alloc { ino, new_blk, .. } => {
                self.alloc_by_ino.entry(*ino).or_default().insert(rec.id);
                *self.alloc_new.entry((*ino, *new_blk)).or_default() += 1;
            }
            What::Size { ino, .. } => {
                self.sizes.entry(*ino).or_default().insert(rec.id);
            }
            What::Entry {
                blk, off, target, ..
            } => {
                self.entries.insert((*blk, *off), rec.id);
                self.naming.entry(*target).or_default().insert(rec.id);
            }
            What::Work(_) => {}
        }
    }

    fn unindex(&mut self, rec: &Rec) {
        fn drop_id<K: Ord>(m: &mut BTreeMap<K, BTreeSet<u64>>, k: K, id: u64) {
            if let Some(v) = m.get_mut(&k) {
                v.remove(&id);
                if v.is_empty() {
                    m.remove(&k);
                }
            }
        }
        for b in rec.rollback_blocks() {
            drop_id(&mut self.by_block, b, rec.id);
        }
        for c in &rec.waits {
            drop_id(&mut self.waiting, c.blk(), rec.id);
        }
        match &rec.what {
            What::InoMap { ino, .. } => {
                if self.inomap.get(ino) == Some(&rec.id) {
                    self.inomap.remove(ino);
                }
            }
            What::Alloc { ino, new_blk, .. } => {
                drop_id(&mut self.alloc_by_ino, *ino, rec.id);
                if let Some(n) = self.alloc_new.get_mut(&(*ino, *new_blk)) {
                    *n -= 1;
                    if *n == 0 {
                        self.alloc_new.remove(&(*ino, *new_blk));
                    }
                }
            }
            What::Size { ino, .. } => drop_id(&mut self.sizes, *ino, rec.id),
            What::Entry {
                blk, off, target, ..
            } => {
                if self.entries.get(&(*blk, *off)) == Some(&rec.id) {
                    self.entries.remove(&(*blk, *off));
                }
                drop_id(&mut self.naming, *target, rec.id);
            }
            What::Work(_) => {}
        }
    }

    /// Saves record `id` as it is before the call in progress changes or removes it.
    fn save(&mut self, id: u64) {
        let Some(op) = self.op.as_mut() else { return };
        if op.made.contains(&id) || op.saved.iter().any(|r| r.id == id) {
            return;
        }
        if let Some(r) = self.recs.get(&id) {
            op.saved.push(r.clone());
        }
    }

    /// Removes record `id` (cancelled or satisfied).
    pub fn remove(&mut self, id: u64) -> Option<Rec> {
        self.save(id);
        let rec = self.recs.remove(&id)?;
        self.unindex(&rec);
        Some(rec)
    }

    /// Replaces record `id`'s conditions and contents.
    pub fn update(&mut self, id: u64, f: impl FnOnce(&mut Rec)) {
        self.save(id);
        let Some(mut rec) = self.recs.remove(&id) else {
            return;
        };
        self.unindex(&rec);
        f(&mut rec);
        self.index(&rec);
        self.recs.insert(id, rec);
    }

    /// Record `id`'s conditions all hold.
    fn complete(&mut self, id: u64) {
        let Some(rec) = self.recs.get(&id) else {
            return;
        };
        match rec.what.clone() {
            What::Work(a) => {
                self.remove(id);
                self.ready.push_back(a);
                if let Some(op) = self.op.as_mut() {
                    op.ready_len += 1;
                }
            }
            What::Entry {
                blk,
                applied: false,
                ..
            } => {
                let seq = self.seq;
                self.update(id, |r| {
                    if let What::Entry { applied, .. } = &mut r.what {
                        *applied = true;
                    }
                    r.waits = vec![Cond::Block(blk, seq)];
                });
            }
            What::Alloc {
                at: PtrAt::Indir { holder, .. },
                applied: false,
                ..
            } => {
                // The pointer may now be written; the inode's size may cover it only once
                // the indirect block carrying it is on disk.
                let seq = self.seq;
                self.update(id, |r| {
                    if let What::Alloc { applied, .. } = &mut r.what {
                        *applied = true;
                    }
                    r.waits = vec![Cond::Block(holder, seq)];
                });
            }
            _ => {
                self.remove(id);
            }
        }
    }

    /// A write became durable: every condition it meets is dropped, and records left with
    /// none are complete.
    pub fn on_durable(&mut self, w: &Written) {
        for id in self.waiting_on(w.blk) {
            self.drop_conds(id, |c| c.met_by(w));
        }
    }

    /// Drops the conditions of record `id` that `met` says hold; completes it if none is left.
    pub fn drop_conds(&mut self, id: u64, met: impl Fn(&Cond) -> bool) {
        let Some(rec) = self.recs.get(&id) else {
            return;
        };
        if !rec.waits.iter().any(&met) {
            return;
        }
        let left: Vec<Cond> = rec.waits.iter().copied().filter(|c| !met(c)).collect();
        let done = left.is_empty();
        self.update(id, |r| r.waits = left);
        if done {
            self.complete(id);
        }
    }

    /// Whether inode `ino` has records that roll it back (its writes are not whole yet).
    pub fn inode_pending(&self, ino: Ino) -> bool {
        self.inomap.contains_key(&ino)
            || self.alloc_by_ino.contains_key(&ino)
            || self.sizes.contains_key(&ino)
    }

    /// The pending entry records naming inode `ino`.
    pub fn entries_naming(&self, ino: Ino) -> Vec<u64> {
        self.naming
            .get(&ino)
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }

    /// The records waiting on block `blk`.
    pub fn waiting_on(&self, blk: Blk) -> Vec<u64> {
        self.waiting
            .get(&blk)
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }

    /// Every block some record waits on.
    pub fn waited_blocks(&self) -> Vec<Blk> {
        self.waiting.keys().copied().collect()
    }

    /// Whether a write of `blk` is under way or not yet flushed.
    pub fn pending_write(&self, blk: Blk) -> bool {
        self.inflight.contains_key(&blk) || self.unflushed.iter().any(|w| w.blk == blk)
    }

    /// The call in progress failed and the engine took its buffer changes back: so are its
    /// records.
    pub fn undo_op(&mut self, log: OpLog) {
        for id in log.made {
            if let Some(rec) = self.recs.remove(&id) {
                self.unindex(&rec);
            }
        }
        for rec in log.saved {
            if let Some(cur) = self.recs.remove(&rec.id) {
                self.unindex(&cur);
            }
            self.index(&rec);
            self.recs.insert(rec.id, rec);
        }
        for _ in 0..log.ready_len {
            self.ready.pop_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(ino: Ino, new_blk: Blk) -> What {
        What::Alloc {
            ino,
            at: PtrAt::Inode {
                ptr: InodePtr::Direct(0),
                iblk: 40,
            },
            cut: None,
            new_blk,
            old_blk: 0,
            kind: BlockKind::Data,
            applied: false,
        }
    }

    /// The (inode, new block) index follows the records: two records for one block keep
    /// it until both are gone, and another inode's record for the block is another key.
    #[test]
    fn the_allocation_index_follows_its_records() {
        let mut d = Deps::default();
        let a = d.insert(alloc(5, 100), vec![Cond::Block(100, 0)]);
        let b = d.insert(alloc(5, 100), vec![Cond::Block(100, 0)]);
        let c = d.insert(alloc(6, 101), vec![Cond::Block(101, 0)]);
        assert!(d.alloc_new.contains_key(&(5, 100)));
        assert!(!d.alloc_new.contains_key(&(6, 100)));
        d.remove(a);
        assert!(d.alloc_new.contains_key(&(5, 100)));
        d.remove(b);
        assert!(!d.alloc_new.contains_key(&(5, 100)));
        d.update(c, |r| r.waits.clear());
        assert!(d.alloc_new.contains_key(&(6, 101)));
        d.remove(c);
        assert!(d.alloc_new.is_empty());
    }
}
