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

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

use super::super::{BlockKind, InodePtr, Release};
use super::{Blk, Ino};

/// What a record waits for: a block written after `seq` (any write of it: bitmaps, group
/// descriptors, a new block's contents, a directory block carrying a removal), one inode
/// written after `seq` with nothing of it rolled back, one directory entry written after
/// `seq` without being rolled back, or one removal written after `seq` without the removed
/// entry being put back ([`What::Removed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Cond {
    Block(Blk, u64),
    Inode { ino: Ino, blk: Blk, seq: u64 },
    Entry { blk: Blk, off: u32, seq: u64 },
    Removed { blk: Blk, off: u32, seq: u64 },
}

impl Cond {
    pub fn blk(&self) -> Blk {
        match *self {
            Cond::Block(b, _) => b,
            Cond::Inode { blk, .. } | Cond::Entry { blk, .. } | Cond::Removed { blk, .. } => blk,
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
            Cond::Removed { blk, off, seq } => {
                blk == w.blk && w.seq > seq && !w.restored_offs.contains(&off)
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
    /// Removed entries of a directory block written back as they were ([`What::Removed`]).
    pub restored_offs: Vec<u32>,
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
        /// Blocks the inode's count shows more while the pointer is rolled back (an xattr
        /// pointer: the old list's blocks less the new one's; 0 for every other pointer).
        blocks_back: i64,
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
        /// longer rolls back — unless it lies over a removed entry still put back
        /// ([`What::Removed`]); kept until a write carries it, so entries added to the
        /// directory it names still wait for it.
        applied: bool,
    },
    /// A removed entry that must stay on disk a while (FreeBSD's dirrem never rolls back;
    /// this one does, so a rename costs no write in the call): the old name of a rename
    /// until its new names are on disk (rule 3: the new name before the old one goes), or
    /// the name of a directory removed by rmdir until the directory's own removals are (a
    /// directory no name reaches must not still hold names). While it waits, every write
    /// of its block puts the entry back as it was, into the bytes it was merged into: no
    /// entry is added over them (they are held from the directory's free space,
    /// `SoftDep::held_dir_bytes`, and given back when this record goes), nor under its
    /// name in its directory, until its removal is on disk (such an entry waits for that,
    /// and the removal is made durable at once).
    Removed {
        dir: Ino,
        blk: Blk,
        off: u32,
        ino: Ino,
        dtype: u8,
        name: Box<[u8]>,
    },
    /// A size raised over blocks the file already had (a write past the end into its
    /// last block, or one that fills earlier holes' neighbours): until the data written
    /// there is on disk, the inode's size is written as `safe`, the size on disk before
    /// (FreeBSD keeps the old size in the inode until the data is written, the same
    /// guarantee: no byte within the size on disk that the file never had).
    Size { ino: Ino, iblk: Blk, safe: u64 },
    /// The mode changed with the access ACL (`AclMode`): while the xattr pointer's new
    /// block is not on disk (this record waits for what that pointer's `Alloc` waits for),
    /// the inode's mode is written as `safe`, the mode on disk before — so the inode on disk
    /// has either the old ACL and the old mode or the new ones, never a mode without the
    /// ACL it was computed from. One per inode: a later change while one is pending keeps
    /// its `safe` and takes the new pointer's conditions.
    Mode { ino: Ino, iblk: Blk, safe: u32 },
    /// A worklist item: `dirrem`, `freeblks`, `freefile`.
    Work(Action),
    /// Rolls nothing back: what a caller that needs conditions to hold (fsync, a directory
    /// rename) waits for, while it writes what they wait for ([`super::Inner::settle`]).
    Probe,
}

#[derive(Clone, Debug)]
pub(crate) struct Rec {
    pub id: u64,
    pub what: What,
    pub waits: Vec<Cond>,
}

impl Rec {
    /// The blocks whose writes this record rolls back something in (at most two: an
    /// indirect pointer's holder and its inode's block; no allocation, this runs for every
    /// record made and removed).
    fn rollback_blocks(&self) -> impl Iterator<Item = Blk> {
        let (a, b) = match &self.what {
            What::InoMap { iblk, .. } => (Some(*iblk), None),
            What::Alloc { at, .. } => match *at {
                PtrAt::Inode { iblk, .. } => (Some(iblk), None),
                PtrAt::Indir { holder, iblk, .. } => (Some(holder), Some(iblk)),
            },
            What::Entry { blk, .. } | What::Removed { blk, .. } => (Some(*blk), None),
            What::Size { iblk, .. } | What::Mode { iblk, .. } => (Some(*iblk), None),
            What::Work(_) | What::Probe => (None, None),
        };
        a.into_iter().chain(b)
    }
}

/// The ids of the records under one index key; [`Ids::to_vec`] lists them ascending (so
/// every walk over them, and so the order of writes and of the worklist, is the same on
/// every run: crash recordings are compared by seed). Most keys hold one to three ids,
/// where a sorted vector costs one allocation and a `BTreeSet` a tree node and its
/// rebalancing (the index updates were the top of the per-call profile in PostMark); some
/// keys hold thousands (a bitmap or inode block every new file waits on until the syncer
/// writes it, a streamed file's allocations), where a vector's insert and remove would be
/// linear and a tree's cost a walk down it on every record made and removed: past
/// [`Ids::FEW`] a set is hashed, and sorted only when listed (at a write, not per call).
#[derive(Debug)]
pub(crate) enum Ids {
    Few(Vec<u64>),
    Many(FxHashSet<u64>),
}

impl Default for Ids {
    fn default() -> Ids {
        Ids::Few(Vec::new())
    }
}

impl Ids {
    const FEW: usize = 32;

    fn insert(&mut self, id: u64) {
        match self {
            Ids::Few(v) => {
                if let Err(i) = v.binary_search(&id) {
                    if v.len() < Self::FEW {
                        v.insert(i, id);
                    } else {
                        let mut t: FxHashSet<u64> = v.drain(..).collect();
                        t.insert(id);
                        *self = Ids::Many(t);
                    }
                }
            }
            Ids::Many(t) => {
                t.insert(id);
            }
        }
    }

    /// Removes `id`; whether the set is empty now (its key goes).
    fn remove(&mut self, id: u64) -> bool {
        match self {
            Ids::Few(v) => {
                if let Ok(i) = v.binary_search(&id) {
                    v.remove(i);
                }
                v.is_empty()
            }
            Ids::Many(t) => {
                t.remove(&id);
                t.is_empty()
            }
        }
    }

    /// The ids, ascending.
    pub fn to_vec(&self) -> Vec<u64> {
        match self {
            Ids::Few(v) => v.clone(),
            Ids::Many(t) => {
                let mut v: Vec<u64> = t.iter().copied().collect();
                v.sort_unstable();
                v
            }
        }
    }
}

/// A name's index key (a fixed hash: the walk order never depends on it).
fn name_key(name: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    name.hash(&mut h);
    h.finish()
}

/// The ids under key `k` of `m`, ascending.
pub(crate) fn ids_at<K: std::hash::Hash + Eq>(m: &FxHashMap<K, Ids>, k: &K) -> Vec<u64> {
    m.get(k).map(Ids::to_vec).unwrap_or_default()
}

/// An index from a key to the [`Ids`] of the records it names.
trait IdIndex<K> {
    fn add(&mut self, k: K, id: u64);
    fn drop_id(&mut self, k: K, id: u64);
}

impl<K: std::hash::Hash + Eq> IdIndex<K> for FxHashMap<K, Ids> {
    fn add(&mut self, k: K, id: u64) {
        self.entry(k).or_default().insert(id);
    }
    fn drop_id(&mut self, k: K, id: u64) {
        if let Some(v) = self.get_mut(&k)
            && v.remove(id)
        {
            self.remove(&k);
        }
    }
}

/// What a call in progress changed, to take it back if the call fails (the engine's undo
/// restores the buffers; this restores the records that describe them).
#[derive(Default)]
pub(crate) struct OpLog {
    /// Records made before the call that it removed or changed: put back as they were.
    pub saved: Vec<Rec>,
    /// The last id given out before the call began: the records the call made are the ones
    /// numbered above it (ids only grow), so making one costs no bookkeeping here — a
    /// set and a list of them were a hash insert and an allocation per record on every
    /// call (three or four records per create).
    made_after: u64,
    /// The ids of `saved`, as a set (a call that writes — fsync's waves, a directory
    /// rename — may complete thousands of records, each asking).
    saved_ids: FxHashSet<u64>,
    /// Work queued as ready by the call.
    pub ready_len: usize,
    /// Inodes whose link count the call raised: an entry the call adds waits for them.
    pub raised: Vec<Ino>,
    /// Entries the call added or changed (a rename's old name waits for them).
    pub entries: Vec<u64>,
    /// The `..` the call changed (a directory moved to another parent).
    pub dotdot: Option<u64>,
    /// A directory's name the call removed (renamed): where it was.
    pub dir_names_gone: Vec<(Blk, u32)>,
    /// A directory's old name the call gave to a whiteout (RENAME_WHITEOUT): settled as
    /// a removed name is.
    pub dir_whiteout: bool,
    pub nesting: u32,
}

/// Every record, indexed.
#[derive(Default)]
pub(crate) struct Deps {
    pub seq: u64,
    next_id: u64,
    pub recs: FxHashMap<u64, Rec>,
    // Indexes, hashed with a fixed, cheap hasher (the keys are block and inode numbers the
    // allocator chose, not input picked to collide). Every walk over them lists keys and
    // ids sorted (`waited_blocks`, `Ids::to_vec`), so the order of writes and of the
    // worklist is the same on every run — crash recordings are compared by seed.
    pub by_block: FxHashMap<Blk, Ids>,
    waiting: FxHashMap<Blk, Ids>,
    pub alloc_by_ino: FxHashMap<Ino, Ids>,
    /// Allocation records by (inode, new block): whether a block of a file is one it was
    /// given since its last write-back, in O(1) (a size raised by a streaming write asks it
    /// of every block it covers; scanning `alloc_by_ino` made that quadratic in the file).
    pub alloc_new: FxHashMap<(Ino, Blk), u32>,
    pub inomap: FxHashMap<Ino, u64>,
    pub entries: FxHashMap<(Blk, u32), u64>,
    /// Directory blocks that had entries removed, by directory, until the directory itself
    /// is removed (its removal must not reach disk before theirs).
    pub removed_in: FxHashMap<Ino, Vec<Blk>>,
    /// Each inode's size as last encoded (to see a size raised).
    pub enc_size: FxHashMap<Ino, u64>,
    /// Size holds by inode.
    pub sizes: FxHashMap<Ino, Ids>,
    /// The pending `Mode` record of each inode.
    pub modes: FxHashMap<Ino, u64>,
    /// Pending entries by the inode they name.
    naming: FxHashMap<Ino, Ids>,
    /// Removed entries put back, by the inode they name.
    put_back: FxHashMap<Ino, Ids>,
    /// Removed entries put back, by (directory, hash of the name).
    put_back_names: FxHashMap<(Ino, u64), Ids>,
    /// Removed entries put back, by directory block (their bytes are held from new
    /// entries: `SoftDep::held_dir_bytes`).
    put_back_blocks: FxHashMap<Blk, Ids>,
    /// (directory, block) pairs a removed entry put back left since the engine last asked:
    /// their bytes go back to its index (`SoftDep::dir_bytes_given_back`).
    pub given_back: FxHashSet<(Ino, Blk)>,
    /// Bitmap and descriptor of each block allocated, until the pointer to it is declared.
    pub blkmap: FxHashMap<Blk, [Blk; 2]>,
    /// Writes between `before_write` and `after_write`.
    pub inflight: FxHashMap<Blk, Written>,
    /// Writes completed and not yet flushed.
    pub unflushed: Vec<Written>,
    /// The blocks of `unflushed`.
    pub unflushed_blks: FxHashSet<Blk>,
    pub ready: VecDeque<Action>,
    /// Worklist items taken off `ready` and being applied through the engine (a background
    /// check must see them held until the engine has them: `background_check_holds`).
    pub running: Vec<Action>,
    pub op: Option<OpLog>,
    /// Highest number of records at once (for `stats`).
    pub peak: usize,
    /// Records completed so far (a write-back round's measure of progress).
    pub completed: u64,
}

impl Deps {
    /// Starts the log of a call (not nested in another): records made from now on are
    /// the call's.
    pub fn begin_op(&mut self) {
        self.op = Some(OpLog {
            made_after: self.next_id,
            ..OpLog::default()
        });
    }

    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub fn insert(&mut self, what: What, waits: Vec<Cond>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let rec = Rec { id, what, waits };
        if let Some(op) = self.op.as_mut()
            && matches!(rec.what, What::Entry { .. })
        {
            op.entries.push(id);
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
            self.by_block.add(b, rec.id);
        }
        for c in &rec.waits {
            self.waiting.add(c.blk(), rec.id);
        }
        match &rec.what {
            What::InoMap { ino, .. } => {
                self.inomap.insert(*ino, rec.id);
            }
            What::Alloc { ino, new_blk, .. } => {
                self.alloc_by_ino.add(*ino, rec.id);
                *self.alloc_new.entry((*ino, *new_blk)).or_default() += 1;
            }
            What::Size { ino, .. } => {
                self.sizes.add(*ino, rec.id);
            }
            What::Mode { ino, .. } => {
                self.modes.insert(*ino, rec.id);
            }
            What::Entry {
                blk, off, target, ..
            } => {
                self.entries.insert((*blk, *off), rec.id);
                self.naming.add(*target, rec.id);
            }
            What::Removed {
                ino,
                dir,
                name,
                blk,
                ..
            } => {
                self.put_back.add(*ino, rec.id);
                self.put_back_names.add((*dir, name_key(name)), rec.id);
                self.put_back_blocks.add(*blk, rec.id);
            }
            What::Work(_) | What::Probe => {}
        }
    }

    fn unindex(&mut self, rec: &Rec) {
        for b in rec.rollback_blocks() {
            self.by_block.drop_id(b, rec.id);
        }
        for c in &rec.waits {
            self.waiting.drop_id(c.blk(), rec.id);
        }
        match &rec.what {
            What::InoMap { ino, .. } => {
                if self.inomap.get(ino) == Some(&rec.id) {
                    self.inomap.remove(ino);
                }
            }
            What::Alloc { ino, new_blk, .. } => {
                self.alloc_by_ino.drop_id(*ino, rec.id);
                if let Some(n) = self.alloc_new.get_mut(&(*ino, *new_blk)) {
                    *n -= 1;
                    if *n == 0 {
                        self.alloc_new.remove(&(*ino, *new_blk));
                    }
                }
            }
            What::Size { ino, .. } => self.sizes.drop_id(*ino, rec.id),
            What::Mode { ino, .. } => {
                if self.modes.get(ino) == Some(&rec.id) {
                    self.modes.remove(ino);
                }
            }
            What::Entry {
                blk, off, target, ..
            } => {
                if self.entries.get(&(*blk, *off)) == Some(&rec.id) {
                    self.entries.remove(&(*blk, *off));
                }
                self.naming.drop_id(*target, rec.id);
            }
            What::Removed {
                ino,
                dir,
                name,
                blk,
                ..
            } => {
                self.put_back.drop_id(*ino, rec.id);
                self.put_back_names.drop_id((*dir, name_key(name)), rec.id);
                self.put_back_blocks.drop_id(*blk, rec.id);
                self.given_back.insert((*dir, *blk));
            }
            What::Work(_) | What::Probe => {}
        }
    }

    /// Saves record `id` as it is before the call in progress changes or removes it.
    fn save(&mut self, id: u64) {
        let Some(op) = self.op.as_mut() else { return };
        // Made by this call (undone by removal), or saved already.
        if id > op.made_after || !op.saved_ids.insert(id) {
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

    /// Replaces record `id`'s conditions, re-indexing only `waiting` (the one index keyed
    /// by them): the common change — a write met some conditions, or a record became
    /// applied and now waits for its block — must not pay a removal and re-insertion in
    /// every index.
    fn set_waits(&mut self, id: u64, waits: Vec<Cond>) {
        self.save(id);
        let Deps { recs, waiting, .. } = self;
        let Some(rec) = recs.get_mut(&id) else {
            return;
        };
        let old = std::mem::replace(&mut rec.waits, waits);
        // Only the blocks that leave or join the record's conditions change the index (the
        // others are indexed already). A record can wait on thousands of blocks — fsync's
        // work waits on every dirty block of a file — and each write of one of them comes
        // here: comparing the lists pairwise, or re-adding every block each time, made an
        // fsync after n random overwrites cost O(n^2) per write (44 s for 6,400 blocks).
        // The common change, conditions met by a write, goes through `drop_conds` in place;
        // this is for the rest (replaced or added conditions).
        let new = &rec.waits;
        if old.len().saturating_mul(new.len()) <= 64 {
            for c in &old {
                if !new.iter().any(|n| n.blk() == c.blk()) {
                    waiting.drop_id(c.blk(), id);
                }
            }
            for c in new {
                if !old.iter().any(|o| o.blk() == c.blk()) {
                    waiting.add(c.blk(), id);
                }
            }
            return;
        }
        let now: FxHashSet<Blk> = new.iter().map(Cond::blk).collect();
        let before: FxHashSet<Blk> = old.iter().map(Cond::blk).collect();
        for &b in before.difference(&now) {
            waiting.drop_id(b, id);
        }
        for &b in now.difference(&before) {
            waiting.add(b, id);
        }
    }

    /// Record `id`'s conditions all hold.
    fn complete(&mut self, id: u64) {
        self.completed += 1;
        enum Next {
            Ready,
            Apply(Cond),
            Done,
        }
        let seq = self.seq;
        let next = match self.recs.get(&id).map(|r| &r.what) {
            None => return,
            Some(What::Work(_)) => Next::Ready,
            // The entry may now be written; it is kept until a write carries it (not rolled
            // back: it may still be, over a removed entry put back).
            Some(What::Entry {
                blk,
                off,
                applied: false,
                ..
            }) => Next::Apply(Cond::Entry {
                blk: *blk,
                off: *off,
                seq,
            }),
            // The pointer may now be written; the inode's size may cover it only once the
            // indirect block carrying it is on disk.
            Some(What::Alloc {
                at: PtrAt::Indir { holder, .. },
                applied: false,
                ..
            }) => Next::Apply(Cond::Block(*holder, seq)),
            Some(_) => Next::Done,
        };
        match next {
            Next::Ready => {
                if let Some(Rec {
                    what: What::Work(a),
                    ..
                }) = self.remove(id)
                {
                    self.ready.push_back(a);
                    if let Some(op) = self.op.as_mut() {
                        op.ready_len += 1;
                    }
                }
            }
            Next::Apply(cond) => {
                // `applied` is in no index key: flipped in place, after the record is
                // saved for the call's undo.
                self.save(id);
                if let Some(r) = self.recs.get_mut(&id)
                    && let What::Entry { applied, .. } | What::Alloc { applied, .. } = &mut r.what
                {
                    *applied = true;
                }
                self.set_waits(id, vec![cond]);
            }
            Next::Done => {
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
        // In place, with no list built per call: a record may wait on thousands of blocks
        // and each of their writes comes here (see `set_waits`).
        self.save(id);
        let Deps { recs, waiting, .. } = self;
        let Some(rec) = recs.get_mut(&id) else {
            return;
        };
        let mut gone = Vec::new();
        rec.waits.retain(|c| {
            let m = met(c);
            if m {
                gone.push(c.blk());
            }
            !m
        });
        for b in gone {
            if !rec.waits.iter().any(|n| n.blk() == b) {
                waiting.drop_id(b, id);
            }
        }
        if rec.waits.is_empty() {
            self.complete(id);
        }
    }

    /// Replaces the conditions of record `id` that `met` selects by `extra`; completes the
    /// record if none is left.
    pub fn replace_conds(&mut self, id: u64, met: impl Fn(&Cond) -> bool, extra: &[Cond]) {
        let Some(rec) = self.recs.get(&id) else {
            return;
        };
        if !rec.waits.iter().any(&met) {
            return;
        }
        let mut left: Vec<Cond> = rec.waits.iter().copied().filter(|c| !met(c)).collect();
        for c in extra {
            if !left.contains(c) {
                left.push(*c);
            }
        }
        let done = left.is_empty();
        self.set_waits(id, left);
        if done {
            self.complete(id);
        }
    }

    /// Record `id` (an entry) waits for `c` too: an entry already allowed on disk is not
    /// any more (it rolls back again until `c` holds).
    pub fn wait_also(&mut self, id: u64, c: Cond) {
        let Some(rec) = self.recs.get(&id) else {
            return;
        };
        let waits = match rec.what {
            What::Entry { applied: true, .. } => {
                self.save(id);
                if let Some(r) = self.recs.get_mut(&id)
                    && let What::Entry { applied, .. } = &mut r.what
                {
                    *applied = false;
                }
                vec![c]
            }
            _ => {
                let mut w = rec.waits.clone();
                if !w.contains(&c) {
                    w.push(c);
                }
                w
            }
        };
        self.set_waits(id, waits);
    }

    /// Whether inode `ino` has records that roll it back (its writes are not whole yet).
    pub fn inode_pending(&self, ino: Ino) -> bool {
        self.inomap.contains_key(&ino)
            || self.alloc_by_ino.contains_key(&ino)
            || self.sizes.contains_key(&ino)
            || self.modes.contains_key(&ino)
    }

    /// The pending removals of block `blk` ([`What::Removed`]), ascending by id.
    pub fn removed_in_block(&self, blk: Blk) -> Vec<u64> {
        ids_at(&self.put_back_blocks, &blk)
    }

    /// The bytes the pending removals of block `blk` hold: `(offset, length)` of each
    /// removed entry, ascending by id.
    pub fn held_in_block(&self, blk: Blk) -> Vec<(u32, u32)> {
        self.removed_in_block(blk)
            .into_iter()
            .filter_map(|id| match self.recs.get(&id).map(|r| &r.what) {
                Some(What::Removed { off, name, .. }) => {
                    Some((*off, crate::format::dir::rec_size(name.len()) as u32))
                }
                _ => None,
            })
            .collect()
    }

    /// The removals still put back that an entry of `name` at `off..off + len` of block
    /// `blk` in directory `dir` conflicts with: one whose bytes it lies over, or one of the
    /// same name in the same directory (two entries of one name: fsck removes one).
    pub fn put_backs_in_the_way(
        &self,
        dir: Ino,
        blk: Blk,
        off: u32,
        len: usize,
        name: &[u8],
    ) -> Vec<u64> {
        let (a, b) = (off as usize, off as usize + len);
        let mut ids: Vec<u64> = self
            .removed_in_block(blk)
            .into_iter()
            .filter(|id| {
                matches!(self.recs.get(id).map(|r| &r.what), Some(What::Removed { off: o, name, .. })
                    if (*o as usize) < b && a < *o as usize + crate::format::dir::rec_size(name.len()))
            })
            .collect();
        for id in ids_at(&self.put_back_names, &(dir, name_key(name))) {
            if matches!(self.recs.get(&id).map(|r| &r.what), Some(What::Removed { name: n, .. }) if &n[..] == name)
                && !ids.contains(&id)
            {
                ids.push(id);
            }
        }
        ids
    }

    /// Whether a removed entry naming `ino` is still put back at write time: the inode has
    /// that name on disk.
    pub fn named_by_put_back(&self, ino: Ino) -> bool {
        self.put_back.contains_key(&ino)
    }

    /// The entry records among `ids` as conditions: each written (durably, not rolled back)
    /// after now.
    pub fn entry_conds(&self, ids: impl IntoIterator<Item = u64>) -> Vec<Cond> {
        ids.into_iter()
            .filter_map(|id| match self.recs.get(&id).map(|r| &r.what) {
                Some(What::Entry { blk, off, .. }) => Some(Cond::Entry {
                    blk: *blk,
                    off: *off,
                    seq: self.seq,
                }),
                _ => None,
            })
            .collect()
    }

    /// The pending entry records naming inode `ino`.
    pub fn entries_naming(&self, ino: Ino) -> Vec<u64> {
        ids_at(&self.naming, &ino)
    }

    /// The records waiting on block `blk`.
    pub fn waiting_on(&self, blk: Blk) -> Vec<u64> {
        ids_at(&self.waiting, &blk)
    }

    /// The records that roll back something of inode `ino` in its own block: its
    /// allocation (`InoMap`), its pointers (`Alloc`), raised sizes (`Size`) and its mode
    /// (`Mode`).
    pub fn inode_records(&self, ino: Ino) -> Vec<u64> {
        let mut ids = ids_at(&self.alloc_by_ino, &ino);
        ids.extend(self.inomap.get(&ino));
        ids.extend(ids_at(&self.sizes, &ino));
        ids.extend(self.modes.get(&ino));
        ids
    }

    /// Replaces record `id`'s conditions (a `Mode` record taking a newer pointer's).
    pub fn rewait(&mut self, id: u64, waits: Vec<Cond>) {
        if waits.is_empty() {
            self.save(id);
            self.complete(id);
        } else {
            self.set_waits(id, waits);
        }
    }

    /// Every block some record waits on, ascending.
    pub fn waited_blocks(&self) -> Vec<Blk> {
        let mut v: Vec<Blk> = self.waiting.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Whether a write of `blk` is under way or not yet flushed.
    pub fn pending_write(&self, blk: Blk) -> bool {
        self.inflight.contains_key(&blk) || self.unflushed_blks.contains(&blk)
    }

    /// The call in progress failed and the engine took its buffer changes back: so are its
    /// records.
    pub fn undo_op(&mut self, log: OpLog) {
        for id in log.made_after + 1..=self.next_id {
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
            blocks_back: 0,
            kind: BlockKind::Data,
            applied: false,
        }
    }

    /// An id set walks ascending and keeps every id across the change from a vector to a
    /// tree and back to empty (an index losing an id would leave a record no write ever
    /// completes, or roll back a record already gone).
    #[test]
    fn an_id_set_grows_into_a_tree_and_keeps_its_order() {
        let mut ids = Ids::default();
        // Out of order, with a duplicate, past the vector's limit.
        let mut want: Vec<u64> = (0..3 * Ids::FEW as u64).map(|i| (i * 37) % 101).collect();
        for &i in &want {
            ids.insert(i);
        }
        ids.insert(want[0]);
        want.sort_unstable();
        want.dedup();
        assert!(matches!(ids, Ids::Many(_)));
        assert_eq!(ids.to_vec(), want);
        let mut small = Ids::default();
        for &i in want.iter().rev().take(5) {
            small.insert(i);
        }
        assert!(matches!(small, Ids::Few(_)));
        let got = small.to_vec();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
        for (n, &i) in want.iter().enumerate() {
            assert_eq!(ids.remove(i), n + 1 == want.len());
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
        d.set_waits(c, vec![]);
        assert!(d.alloc_new.contains_key(&(6, 101)));
        d.remove(c);
        assert!(d.alloc_new.is_empty());
    }

    /// A failed call's undo takes back exactly what the call did: every record it made
    /// (the ones numbered after the call began, whatever became of them), and every record
    /// made before it that it removed or changed, put back as it was — records made before
    /// the call and left alone stay, and a record it changed twice comes back once, as it
    /// was before the call.
    #[test]
    fn a_failed_calls_undo_takes_back_what_it_made_and_restores_what_it_changed() {
        let mut d = Deps::default();
        let kept = d.insert(alloc(5, 100), vec![Cond::Block(100, 0)]);
        let removed = d.insert(alloc(6, 101), vec![Cond::Block(101, 0)]);
        let changed = d.insert(alloc(7, 102), vec![Cond::Block(102, 0), Cond::Block(9, 0)]);
        d.begin_op();
        let made = d.insert(alloc(8, 103), vec![Cond::Block(103, 0)]);
        let made_and_gone = d.insert(alloc(9, 104), vec![Cond::Block(104, 0)]);
        d.remove(made_and_gone);
        d.remove(removed);
        d.set_waits(changed, vec![Cond::Block(9, 0)]);
        d.set_waits(changed, vec![Cond::Block(10, 0)]);
        let log = d.op.take().expect("the call's log");
        d.undo_op(log);
        let mut ids: Vec<u64> = d.recs.keys().copied().collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![kept, removed, changed]);
        assert!(!d.recs.contains_key(&made));
        assert!(!d.alloc_new.contains_key(&(8, 103)));
        assert!(d.alloc_new.contains_key(&(6, 101)));
        assert_eq!(
            d.recs[&changed].waits,
            vec![Cond::Block(102, 0), Cond::Block(9, 0)]
        );
        assert_eq!(d.waited_blocks(), vec![9, 100, 101, 102]);
    }
}
