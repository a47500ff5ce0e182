//! The in-memory name index of a directory: O(1) lookup by name and O(log chunks) search
//! for a chunk with room, so a directory of a million entries costs no linear scan (FFS
//! scans; cairn indexes each directory once, on first use).

use std::collections::HashMap;

use crate::block::{self, DIR_CHUNK};
use crate::{FResult, FormatError};

/// Where an entry lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub ino: u64,
    pub dtype: u8,
    /// Logical block of the directory and byte offset inside it.
    pub lbn: u64,
    pub off: usize,
}

/// The name index of one directory.
///
/// Invariant (kept by the format that owns the directory): `names` holds every used entry
/// of the directory's blocks except `.` and `..`, `dotdot` is its `..` entry, and `free`
/// has one value per 512-byte chunk, its free bytes outside the bytes `held` in its block
/// ([`block::chunk_free_except`]).
pub struct DirIndex {
    pub names: HashMap<Box<[u8]>, Slot>,
    /// The `..` entry (always in chunk 0 of block 0).
    pub dotdot: Slot,
    pub free: MaxTree,
    pub nblocks: u64,
    /// Bytes no insert may take, by the address of their block (see [`block::Held`]): a
    /// block with none has no key. The format keeps them a superset of what its writes
    /// still need, and gives them back when they are no longer needed.
    pub held: HashMap<u64, HeldBytes>,
}

/// The held bytes of one directory block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBytes {
    /// The block's logical number in its directory.
    pub lbn: u64,
    /// `(offset in the block, length)`, ascending.
    pub ranges: Vec<(usize, usize)>,
}

impl DirIndex {
    /// Starts the index of a directory of `nblocks` blocks: hand it every block, in order,
    /// with [`DirIndex::add_block`], then call [`DirIndex::finish`].
    pub fn new(nblocks: u64) -> DirIndex {
        DirIndex {
            names: HashMap::new(),
            dotdot: Slot {
                ino: 0,
                dtype: 0,
                lbn: 0,
                off: 0,
            },
            free: MaxTree::new(),
            nblocks,
            held: HashMap::new(),
        }
    }

    /// The index, once every block was added: a directory without `..` is refused.
    pub fn finish(self) -> FResult<DirIndex> {
        if self.dotdot.ino == 0 {
            return Err(FormatError("no '..' entry".into()));
        }
        Ok(self)
    }

    /// Indexes block `lbn` of the directory. A record the codec refuses is a
    /// [`FormatError`] naming the block.
    pub fn add_block(&mut self, lbn: u64, data: &[u8]) -> FResult<()> {
        self.add_block_held(lbn, 0, data, Vec::new())
    }

    /// [`DirIndex::add_block`] of block `lbn` at address `addr`, whose `held` bytes
    /// (`(offset in the block, length)`) no insert may take.
    pub fn add_block_held(
        &mut self,
        lbn: u64,
        addr: u64,
        data: &[u8],
        held: Vec<(usize, usize)>,
    ) -> FResult<()> {
        for r in block::records(data) {
            let e = r.map_err(|e| FormatError(format!("block {lbn}: {}", e.0)))?;
            if e.ino == 0 {
                continue;
            }
            let slot = Slot {
                ino: e.ino as u64,
                dtype: e.dtype,
                lbn,
                off: e.off,
            };
            match e.name {
                b"." => {}
                b".." => self.dotdot = slot,
                n => {
                    self.names.insert(n.into(), slot);
                }
            }
        }
        for c in 0..(data.len() / DIR_CHUNK) {
            self.free
                .push(block::chunk_free_except(data, c, &held) as u16);
        }
        self.set_held(addr, lbn, held);
        Ok(())
    }

    /// The held bytes of the block at `addr` (empty: none).
    pub fn held_in(&self, addr: u64) -> &[(usize, usize)] {
        self.held.get(&addr).map_or(&[], |h| &h.ranges)
    }

    /// Block `lbn` at `addr` holds `ranges` from now on (empty: none). The caller sets the
    /// free bytes of its chunks to match ([`DirIndex::refree_block`]).
    pub fn set_held(&mut self, addr: u64, lbn: u64, mut ranges: Vec<(usize, usize)>) {
        if ranges.is_empty() {
            self.held.remove(&addr);
        } else {
            ranges.sort_unstable();
            self.held.insert(addr, HeldBytes { lbn, ranges });
        }
    }

    /// Sets the free bytes of chunk `c` of block `lbn` (contents `data`, at `addr`) from its
    /// contents and its block's held bytes.
    pub fn refree_chunk(&mut self, lbn: u64, addr: u64, c: usize, data: &[u8]) {
        let per = data.len() / DIR_CHUNK;
        let v = block::chunk_free_except(data, c, self.held_in(addr)) as u16;
        self.free.set(lbn as usize * per + c, v);
    }

    /// Sets the free bytes of every chunk of block `lbn` (contents `data`, at `addr`) from
    /// its contents and its held bytes.
    pub fn refree_block(&mut self, lbn: u64, addr: u64, data: &[u8]) {
        let per = data.len() / DIR_CHUNK;
        let held = self.held_in(addr).to_vec();
        for c in 0..per {
            let v = block::chunk_free_except(data, c, &held) as u16;
            self.free.set(lbn as usize * per + c, v);
        }
    }

    /// The directory holds no names but `.` and `..`.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The first chunk with room for a record of a `namelen`-byte name, if any.
    pub fn place(&self, namelen: usize) -> Option<usize> {
        self.free.find(block::rec_size(namelen) as u16)
    }

    /// The directory grew by one block of `chunks` empty chunks.
    pub fn grew(&mut self, chunks: usize) {
        self.nblocks += 1;
        for _ in 0..chunks {
            self.free.push(DIR_CHUNK as u16);
        }
    }
}

/// A segment tree of per-chunk free bytes answering "first chunk with at least n free".
pub struct MaxTree {
    n: usize,
    t: Vec<u16>,
}

impl MaxTree {
    #[allow(clippy::new_without_default)]
    pub fn new() -> MaxTree {
        MaxTree {
            n: 0,
            t: vec![0; 2],
        }
    }
    fn cap(&self) -> usize {
        self.t.len() / 2
    }
    pub fn push(&mut self, v: u16) {
        if self.n == self.cap() {
            let old: Vec<u16> = (0..self.n).map(|i| self.t[self.cap() + i]).collect();
            let cap = (self.cap() * 2).max(1);
            self.t = vec![0; cap * 2];
            for (i, v) in old.into_iter().enumerate() {
                self.t[cap + i] = v;
            }
            for i in (1..cap).rev() {
                self.t[i] = self.t[2 * i].max(self.t[2 * i + 1]);
            }
        }
        self.n += 1;
        self.set(self.n - 1, v);
    }
    pub fn set(&mut self, i: usize, v: u16) {
        let mut p = self.cap() + i;
        self.t[p] = v;
        while p > 1 {
            p /= 2;
            self.t[p] = self.t[2 * p].max(self.t[2 * p + 1]);
        }
    }
    /// The value of index `i` (0 past the end).
    pub fn get(&self, i: usize) -> u16 {
        if i < self.n {
            self.t[self.cap() + i]
        } else {
            0
        }
    }

    /// The per-chunk values, in order.
    pub fn values(&self) -> impl Iterator<Item = u16> + '_ {
        (0..self.n).map(|i| self.t[self.cap() + i])
    }

    /// First index with value >= `need`.
    pub fn find(&self, need: u16) -> Option<usize> {
        if self.n == 0 || self.t[1] < need {
            return None;
        }
        let mut p = 1;
        while p < self.cap() {
            p = if self.t[2 * p] >= need {
                2 * p
            } else {
                2 * p + 1
            };
        }
        let i = p - self.cap();
        (i < self.n).then_some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maxtree_finds_first_fit() {
        let mut t = MaxTree::new();
        for v in [10, 0, 300, 16, 512] {
            t.push(v);
        }
        assert_eq!(t.find(16), Some(2));
        assert_eq!(t.find(400), Some(4));
        assert_eq!(t.find(513), None);
        t.set(2, 0);
        assert_eq!(t.find(16), Some(3));
        for _ in 0..1000 {
            t.push(0);
        }
        assert_eq!(t.find(500), Some(4));
        t.set(1004, 512);
        t.set(4, 0);
        assert_eq!(t.find(500), Some(1004));
    }
}
