//! The inode map (004 §3.1): for every inode number, where its newest copy lies in the log
//! and the version the number has now (bumped at every free, so the cleaner can tell a
//! block of a file deleted since from one of the file now holding the number).
//!
//! Invariants:
//! - an entry changed since its block of the map was last written is in `dirty` until a
//!   checkpoint writes that block again (`take_dirty`, `moved_block`): a checkpoint never
//!   names a map block older than the entries the log already relies on;
//! - `addrs[i]` is where block `i` of the map was last written; the usage table counts
//!   one block live there (the caller's accounting, `State::kill` on the old address).

use std::collections::BTreeSet;

use crate::format::tables::{self, ImapEntry};

pub(crate) struct InodeMap {
    entries: Vec<ImapEntry>,
    addrs: Vec<u64>,
    dirty: BTreeSet<u32>,
    /// Where the search for a free inode number starts (the checkpoint keeps it, so
    /// numbers are not reused sooner than they must be).
    next_ino: u32,
}

/// The block of the map holding inode `ino`'s entry.
pub(crate) fn block_of(ino: u64) -> u32 {
    (ino / tables::PER_BLOCK as u64) as u32
}

impl InodeMap {
    pub fn new(entries: Vec<ImapEntry>, addrs: Vec<u64>, next_ino: u32) -> InodeMap {
        InodeMap {
            entries,
            addrs,
            dirty: BTreeSet::new(),
            next_ino,
        }
    }

    /// Inode `ino`'s entry (`None` beyond the map).
    pub fn get(&self, ino: u64) -> Option<ImapEntry> {
        self.entries.get(ino as usize).copied()
    }

    /// Where inode `ino` lies in the log (0: free, or beyond the map).
    pub fn addr(&self, ino: u64) -> u64 {
        self.get(ino).map_or(0, |e| e.addr)
    }

    /// Changes inode `ino`'s entry and marks its block for the next checkpoint. Nothing
    /// beyond the map (the callers check the number against the superblock first).
    pub fn set(&mut self, ino: u64, e: ImapEntry) {
        if let Some(slot) = self.entries.get_mut(ino as usize) {
            *slot = e;
            self.dirty.insert(block_of(ino));
        }
    }

    /// Every entry, by inode number.
    pub fn entries(&self) -> impl Iterator<Item = &ImapEntry> {
        self.entries.iter()
    }

    /// Inode numbers with a copy in the log.
    pub fn in_use(&self) -> u64 {
        self.entries.iter().filter(|e| e.addr != 0).count() as u64
    }

    /// A free inode number above `reserved` below `max` that `taken` does not claim (a
    /// number allocated but not yet written), from where the last search ended; with the
    /// version it takes.
    pub fn alloc(
        &mut self,
        max: u64,
        reserved: u64,
        taken: impl Fn(u64) -> bool,
    ) -> Option<(u64, u32)> {
        for i in 0..max {
            let cand = (self.next_ino as u64 + i) % max;
            if cand <= reserved {
                continue;
            }
            let e = self.get(cand)?;
            if e.addr == 0 && !taken(cand) {
                self.next_ino = (cand + 1) as u32;
                return Some((cand, e.version.max(1)));
            }
        }
        None
    }

    pub fn next_ino(&self) -> u32 {
        self.next_ino
    }

    /// Where each block of the map was last written (what a checkpoint names).
    pub fn block_addrs(&self) -> &[u64] {
        &self.addrs
    }

    /// Blocks whose entries changed since they were written.
    pub fn dirty_blocks(&self) -> &BTreeSet<u32> {
        &self.dirty
    }

    /// Block `i` must be written again (the cleaner found it live in a victim).
    pub fn mark_block_dirty(&mut self, i: u32) {
        if (i as usize) < self.addrs.len() {
            self.dirty.insert(i);
        }
    }

    /// The dirty blocks, for the checkpoint to write (each then through `moved_block`).
    pub fn take_dirty(&mut self) -> BTreeSet<u32> {
        std::mem::take(&mut self.dirty)
    }

    /// Block `i` is being written as it is now (ahead of a checkpoint): no longer dirty,
    /// until an entry of it changes again.
    pub fn written_block(&mut self, i: u32) {
        self.dirty.remove(&i);
    }

    /// Block `i` as the log stores it.
    pub fn encode_block(&self, i: u32) -> Vec<u8> {
        tables::encode_imap(i, &self.entries)
    }

    /// Block `i` was written at `addr`; returns where it was before (now dead).
    pub fn moved_block(&mut self, i: u32, addr: u64) -> u64 {
        match self.addrs.get_mut(i as usize) {
            Some(a) => std::mem::replace(a, addr),
            None => 0,
        }
    }
}
