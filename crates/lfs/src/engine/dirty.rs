//! What changed in memory since the last flush: the next flush writes exactly this (004
//! §4.1). Data blocks by (inode, logical block), the inodes to write, the inode numbers
//! freed (written as free records so roll-forward frees them too) and the directory
//! operation log's records.
//!
//! Invariants:
//! - an inode with a buffered data block is among the dirty inodes (its block map and
//!   size reach the log with the block);
//! - a freed inode has no buffered blocks and is not a dirty inode; allocating the
//!   number again takes it off the freed list;
//! - `since` is set from the first change after a flush until the next flush takes the
//!   set: the syncer flushes what is older than `flush_age`;
//! - a dirty inode whose node has indirect blocks or an xattr list to rewrite is among the
//!   `meta` inodes (a superset: an inode stays there until the flush), so that counting
//!   what the flush writes for them (`State::buffered_blocks`, on every write) looks at
//!   those few, not at every dirty inode;
//! - while a watch is on ([`DirtySet::watch`]), every inode this set is told changed — its
//!   data, its attributes or block map, its number freed or taken again — is among the
//!   `watched` ones. Every change to an inode's state must reach the log, so it passes
//!   through here: what a background cleaning choice over several holds relies on to
//!   check again only the inodes calls changed between them (`State::recheck_watched`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use rustc_hash::FxHashSet;

use crate::format::dirlog::Record;

#[derive(Default)]
pub(crate) struct DirtySet {
    data: BTreeMap<(u64, u64), Vec<u8>>,
    inodes: BTreeSet<u64>,
    freed: BTreeMap<u64, u32>,
    dirlog: Vec<Record>,
    /// Bytes the directory operation log's records take encoded.
    dirlog_bytes: u64,
    /// Inodes that may have indirect blocks or an xattr list to rewrite (see above).
    meta: BTreeSet<u64>,
    since: Option<Instant>,
    /// Inodes changed since the watch began (see the invariants above).
    watched: Option<FxHashSet<u64>>,
}

/// One flush's worth of changes, taken from the set ([`DirtySet::take`]).
pub(crate) struct Pending {
    pub dirlog: Vec<Record>,
    pub data: BTreeMap<(u64, u64), Vec<u8>>,
    pub inodes: Vec<u64>,
    /// Inode numbers freed, with the version each takes next.
    pub freed: BTreeMap<u64, u32>,
}

impl DirtySet {
    fn touch(&mut self) {
        if self.since.is_none() {
            self.since = Some(Instant::now());
        }
    }

    fn note(&mut self, ino: u64) {
        if let Some(w) = &mut self.watched {
            w.insert(ino);
        }
    }

    /// Starts watching which inodes change (again, if a watch was on), counting those
    /// changed and not yet flushed as changed.
    pub fn watch(&mut self) {
        let mut w: FxHashSet<u64> = self.inodes.iter().copied().collect();
        w.extend(self.data.keys().map(|&(i, _)| i));
        w.extend(self.freed.keys().copied());
        w.extend(self.meta.iter().copied());
        self.watched = Some(w);
    }

    /// Ends the watch: the inodes changed since it began (`None` if none was on).
    pub fn take_watched(&mut self) -> Option<FxHashSet<u64>> {
        self.watched.take()
    }

    /// Block `lbn` of `ino`, if buffered.
    pub fn block(&self, ino: u64, lbn: u64) -> Option<&Vec<u8>> {
        self.data.get(&(ino, lbn))
    }

    pub fn has_block(&self, ino: u64, lbn: u64) -> bool {
        self.data.contains_key(&(ino, lbn))
    }

    /// Is any block of `ino` in `first..end` buffered?
    pub fn any_in(&self, ino: u64, first: u64, end: u64) -> bool {
        first < end && self.data.range((ino, first)..(ino, end)).next().is_some()
    }

    /// The logical blocks of `ino` buffered.
    pub fn blocks_of(&self, ino: u64) -> impl Iterator<Item = u64> + '_ {
        self.data
            .range((ino, 0)..=(ino, u64::MAX))
            .map(|(&(_, l), _)| l)
    }

    /// Inodes to write at the next flush.
    pub fn inodes(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.inodes.iter().copied()
    }

    /// Log blocks the directory operation log's records take at the next flush, from
    /// above: a record never fills more than half a block, so no block is left less than
    /// half full.
    pub fn dirlog_blocks(&self) -> u64 {
        self.dirlog_bytes
            .div_ceil(crate::format::BLOCK_SIZE as u64 / 2)
    }

    /// Inode numbers freed since the last flush (each a free record in it).
    pub fn freed_count(&self) -> usize {
        self.freed.len()
    }

    /// Data blocks buffered, all files.
    pub fn data_blocks(&self) -> u64 {
        self.data.len() as u64
    }

    /// Replaces block `lbn` of `ino` (written at the next flush with the inode).
    pub fn write_block(&mut self, ino: u64, lbn: u64, data: Vec<u8>) {
        self.touch();
        self.note(ino);
        self.data.insert((ino, lbn), data);
        self.inodes.insert(ino);
    }

    /// Inode `ino` changed.
    pub fn mark_inode(&mut self, ino: u64) {
        self.touch();
        self.note(ino);
        self.inodes.insert(ino);
    }

    /// Is inode `ino` to be written at the next flush?
    pub fn is_inode_dirty(&self, ino: u64) -> bool {
        self.inodes.contains(&ino)
    }

    /// Inode `ino` was written ahead of the next flush (`State::write_inodes_ahead`): no
    /// longer dirty. Never one with a buffered block (the first invariant above).
    pub fn inode_written(&mut self, ino: u64) {
        debug_assert!(
            !self.any_in(ino, 0, u64::MAX),
            "inode {ino} written ahead of its buffered data"
        );
        self.inodes.remove(&ino);
        if self.is_empty() {
            self.since = None;
        }
    }

    /// Inode `ino` changed, and an indirect block or its xattr list with it.
    pub fn mark_meta(&mut self, ino: u64) {
        self.mark_inode(ino);
        self.note_meta(ino);
    }

    /// Inode `ino` has an indirect block or its xattr list to rewrite, whether or not it
    /// is dirty yet (a block map changed under a flush, which rewrites it in the same flush,
    /// leaves it here until the next: a superset is harmless).
    pub fn note_meta(&mut self, ino: u64) {
        self.note(ino);
        self.meta.insert(ino);
    }

    /// Dirty inodes that may have indirect blocks or an xattr list to rewrite.
    pub fn meta_inodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.meta
            .iter()
            .copied()
            .filter(|i| self.inodes.contains(i))
    }

    /// Drops the buffered block `lbn` of `ino` (it became a hole).
    pub fn drop_block(&mut self, ino: u64, lbn: u64) {
        self.note(ino);
        self.data.remove(&(ino, lbn));
    }

    /// Drops the buffered blocks of `ino` from `keep` on (a truncate).
    pub fn drop_blocks_from(&mut self, ino: u64, keep: u64) {
        self.note(ino);
        let keys: Vec<(u64, u64)> = self
            .data
            .range((ino, keep)..=(ino, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            self.data.remove(&k);
        }
    }

    /// Inode `ino` was freed; its number takes `version` next.
    pub fn freed(&mut self, ino: u64, version: u32) {
        self.drop_blocks_from(ino, 0);
        self.note(ino);
        self.inodes.remove(&ino);
        self.freed.insert(ino, version);
        self.touch();
    }

    /// Number `ino` was allocated again: no free record for it.
    pub fn reused(&mut self, ino: u64) {
        self.note(ino);
        self.freed.remove(&ino);
    }

    /// A record of the directory operation log (written first in the next flush).
    pub fn log_record(&mut self, r: Record) {
        self.dirlog_bytes += r.size() as u64;
        self.dirlog.push(r);
    }

    /// Nothing to flush?
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
            && self.inodes.is_empty()
            && self.freed.is_empty()
            && self.dirlog.is_empty()
    }

    /// When the oldest change not yet flushed was made.
    pub fn since(&self) -> Option<Instant> {
        self.since
    }

    /// Everything, for a flush; the set is empty after.
    pub fn take(&mut self) -> Pending {
        self.since = None;
        self.dirlog_bytes = 0;
        self.meta.clear();
        Pending {
            dirlog: std::mem::take(&mut self.dirlog),
            data: std::mem::take(&mut self.data),
            inodes: std::mem::take(&mut self.inodes).into_iter().collect(),
            freed: std::mem::take(&mut self.freed),
        }
    }
}
