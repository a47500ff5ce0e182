//! Directories: the in-memory name index and the on-disk entry updates.
//!
//! Each directory used is indexed once (every block read) into a hash map from name to the
//! entry's place, plus a max-tree of free space per 512-byte chunk, so lookup, insert and
//! remove cost O(1)/O(log chunks) in a directory of a million entries instead of FFS's
//! linear scan. [`Directories`] holds the indexes of a mounted file system.
//!
//! Invariant, at every operation boundary: each index describes its directory's blocks.
//! Inside an undo scope every directory whose index is built or changed is noted; a
//! rollback drops those indexes, and they are rebuilt from the restored blocks on next use.

use std::collections::HashMap;

use cairn_bufcache::BufRef;
use cairn_vfs::{Errno, Result};

use crate::format::{DIR_CHUNK, dir, kind};
use crate::{Ffs, State, corrupt_err};

/// The directory indexes of a mounted file system.
///
/// An index is attached when a directory is first used (every block read once) and freed
/// when its directory is freed, or by a rollback of a scope that changed it.
#[derive(Default)]
pub(crate) struct Directories {
    map: HashMap<u64, DirIndex>,
    /// Directories whose index the open undo scope built or changed (`None`: no scope).
    touched: Option<Vec<u64>>,
}

impl Directories {
    pub fn get(&self, dino: u64) -> Option<&DirIndex> {
        self.map.get(&dino)
    }

    /// The index of `dino`. A caller about to change it calls [`Directories::touch`] first.
    fn get_mut(&mut self, dino: u64) -> Option<&mut DirIndex> {
        self.map.get_mut(&dino)
    }

    fn insert(&mut self, dino: u64, idx: DirIndex) {
        self.touch(dino);
        self.map.insert(dino, idx);
    }

    /// Drops the index of a directory (freed, or to be rebuilt from its blocks).
    pub fn remove(&mut self, dino: u64) -> Option<DirIndex> {
        self.map.remove(&dino)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn indexed(&self) -> Vec<u64> {
        self.map.keys().copied().collect()
    }

    /// Puts back an index taken out with `remove` (self-check only).
    pub fn restore(&mut self, dino: u64, idx: DirIndex) {
        self.map.insert(dino, idx);
    }

    /// Notes that the open undo scope changes the index of `dino`: a rollback drops it.
    fn touch(&mut self, dino: u64) {
        if let Some(t) = &mut self.touched
            && t.last() != Some(&dino)
        {
            t.push(dino);
        }
    }

    pub fn begin_undo(&mut self) {
        self.touched = Some(Vec::new());
    }

    pub fn commit_undo(&mut self) {
        self.touched = None;
    }

    /// Drops every index the scope built or changed.
    pub fn rollback_undo(&mut self) {
        for d in self.touched.take().unwrap_or_default() {
            self.map.remove(&d);
        }
    }
}

/// Where an entry lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub ino: u64,
    pub dtype: u8,
    /// Logical block of the directory and byte offset inside it.
    pub lbn: u64,
    pub off: usize,
}

pub(crate) struct DirIndex {
    pub names: HashMap<Box<[u8]>, Slot>,
    /// The `..` entry (always in chunk 0 of block 0).
    pub dotdot: Slot,
    pub free: MaxTree,
    pub nblocks: u64,
}

/// A segment tree of per-chunk free bytes answering "first chunk with at least n free".
pub(crate) struct MaxTree {
    n: usize,
    t: Vec<u16>,
}

impl MaxTree {
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

impl Ffs {
    /// Builds (once) the index of directory `dino`.
    pub(crate) fn dir_index<'a>(&self, st: &'a mut State, dino: u64) -> Result<&'a mut DirIndex> {
        if st.dirs.get(dino).is_none() {
            let d = self.iget(st, dino)?.d.clone();
            if !d.is_dir() {
                return Err(Errno::ENOTDIR.into());
            }
            let bs = self.vol.geo.block_size as u64;
            if d.size % bs != 0 || d.size == 0 {
                return Err(corrupt_err(format!(
                    "directory {dino}: size {} not a whole number of blocks",
                    d.size
                )));
            }
            let nblocks = d.size / bs;
            let mut idx = DirIndex {
                names: HashMap::new(),
                dotdot: Slot {
                    ino: 0,
                    dtype: 0,
                    lbn: 0,
                    off: 0,
                },
                free: MaxTree::new(),
                nblocks,
            };
            for lbn in 0..nblocks {
                let p = self.bmap(st, dino, lbn)?;
                if p == 0 {
                    return Err(corrupt_err(format!(
                        "directory {dino}: hole at block {lbn}"
                    )));
                }
                let b = self.bread(p, kind::DIRECTORY)?;
                let data = b.read();
                for r in dir::records(&data) {
                    let e = r.map_err(|e| {
                        corrupt_err(format!("directory {dino} block {lbn}: {}", e.0))
                    })?;
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
                        b".." => idx.dotdot = slot,
                        n => {
                            idx.names.insert(n.into(), slot);
                        }
                    }
                }
                for c in 0..(bs as usize / DIR_CHUNK) {
                    idx.free.push(dir::chunk_free(&data, c) as u16);
                }
            }
            if idx.dotdot.ino == 0 {
                return Err(corrupt_err(format!("directory {dino}: no '..' entry")));
            }
            // Built from blocks the open scope may have changed: a rollback drops it.
            st.dirs.insert(dino, idx);
        }
        Ok(st.dirs.get_mut(dino).expect("just inserted"))
    }

    pub(crate) fn dir_lookup(
        &self,
        st: &mut State,
        dino: u64,
        name: &[u8],
    ) -> Result<Option<Slot>> {
        let idx = self.dir_index(st, dino)?;
        Ok(match name {
            b"." => Some(Slot {
                ino: dino,
                dtype: libc::DT_DIR,
                lbn: 0,
                off: 0,
            }),
            b".." => Some(idx.dotdot),
            n => idx.names.get(n).copied(),
        })
    }

    fn dir_block(&self, st: &mut State, dino: u64, lbn: u64) -> Result<BufRef> {
        let p = self.bmap(st, dino, lbn)?;
        if p == 0 {
            return Err(corrupt_err(format!(
                "directory {dino}: hole at block {lbn}"
            )));
        }
        self.bread(p, kind::DIRECTORY)
    }

    /// Blocks that adding `name` to `dino` would allocate: none if a chunk has room, else
    /// the new directory block and the indirect blocks on its path.
    pub(crate) fn dir_add_blocks(&self, st: &mut State, dino: u64, name: &[u8]) -> Result<u64> {
        let need = dir::rec_size(name.len()) as u16;
        let idx = self.dir_index(st, dino)?;
        if idx.free.find(need).is_some() {
            return Ok(0);
        }
        let nblocks = idx.nblocks;
        self.blocks_to_map(st, dino, nblocks)
    }

    /// Adds `name -> ino` to directory `dino`. Grows the directory if no chunk has room
    /// (the new block is made durable as empty through `setup_block_init` before the
    /// entry is placed in it). Returns the block changed; the caller updates the inode.
    pub(crate) fn dir_add(
        &self,
        st: &mut State,
        dino: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
    ) -> Result<BufRef> {
        let need = dir::rec_size(name.len()) as u16;
        let chunks_per_block = self.vol.geo.bs() / DIR_CHUNK;
        st.dirs.touch(dino);
        let found = self.dir_index(st, dino)?.free.find(need);
        let chunk = match found {
            Some(c) => c,
            None => self.dir_grow(st, dino)?,
        };
        let lbn = (chunk / chunks_per_block) as u64;
        let c_in_block = chunk % chunks_per_block;
        let b = self.dir_block(st, dino, lbn)?;
        // An entry never leaves its 512-byte chunk: only the chunk changes (and is saved).
        let (off, free) = {
            let mut data = b.write_range(c_in_block * DIR_CHUNK, DIR_CHUNK);
            let off = dir::insert(&mut data, 0, ino, dtype, name)
                .map_err(|e| corrupt_err(format!("directory {dino}: {}", e.0)))?
                .ok_or_else(|| {
                    corrupt_err(format!("directory {dino}: free-space index out of date"))
                })?;
            (
                c_in_block * DIR_CHUNK + off,
                dir::chunk_free(&data, 0) as u16,
            )
        };
        self.vol.cache.mark_dirty(&b);
        let idx = self.dir_index(st, dino)?;
        idx.free.set(chunk, free);
        idx.names.insert(
            name.into(),
            Slot {
                ino,
                dtype,
                lbn,
                off,
            },
        );
        Ok(b)
    }

    fn dir_grow(&self, st: &mut State, dino: u64) -> Result<usize> {
        st.dirs.touch(dino);
        let nblocks = self.dir_index(st, dino)?.nblocks;
        let (p, _, changed) = self.bmap_alloc(st, dino, nblocks)?;
        let nb = self.bnew(p, kind::DIRECTORY);
        dir::init_empty(&mut nb.write());
        self.vol.cache.mark_dirty(&nb);
        let g = self.vol.geo.group_of_block(p);
        let gb = st.alloc.group_bufs(&self.vol, g, false)?;
        self.strategy
            .setup_block_init(&self.io, &[&nb, &gb.desc, &gb.bitmap])?;
        // Indirect blocks that now point to it follow, before the inode's new size does: a
        // directory must never have a hole.
        if !changed.is_empty() {
            let refs: Vec<&BufRef> = changed.iter().collect();
            self.strategy.setup_block_init(&self.io, &refs)?;
        }
        let bs = self.vol.geo.block_size as u64;
        self.iget(st, dino)?.d.size = (nblocks + 1) * bs;
        let per = self.vol.geo.bs() / DIR_CHUNK;
        let idx = self.dir_index(st, dino)?;
        idx.nblocks += 1;
        for _ in 0..per {
            idx.free.push(DIR_CHUNK as u16);
        }
        Ok(nblocks as usize * per)
    }

    /// Removes `name` from `dino`; returns the block changed.
    pub(crate) fn dir_remove(&self, st: &mut State, dino: u64, name: &[u8]) -> Result<BufRef> {
        st.dirs.touch(dino);
        let slot = self
            .dir_index(st, dino)?
            .names
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)?;
        let b = self.dir_block(st, dino, slot.lbn)?;
        let c_in_block = slot.off / DIR_CHUNK;
        let free = {
            let mut data = b.write_range(c_in_block * DIR_CHUNK, DIR_CHUNK);
            dir::remove(&mut data, slot.off % DIR_CHUNK)
                .map_err(|e| corrupt_err(format!("directory {dino}: {}", e.0)))?;
            dir::chunk_free(&data, 0) as u16
        };
        self.vol.cache.mark_dirty(&b);
        let per = self.vol.geo.bs() / DIR_CHUNK;
        let idx = self.dir_index(st, dino)?;
        idx.free.set(slot.lbn as usize * per + c_in_block, free);
        idx.names.remove(name);
        Ok(b)
    }

    /// Re-points an existing entry (`name`, or `..` when name is `..`) to another inode.
    pub(crate) fn dir_repoint(
        &self,
        st: &mut State,
        dino: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
    ) -> Result<BufRef> {
        st.dirs.touch(dino);
        let slot = self.dir_lookup(st, dino, name)?.ok_or(Errno::ENOENT)?;
        let b = self.dir_block(st, dino, slot.lbn)?;
        dir::set_ino(&mut b.write_range(slot.off, 8), 0, ino, dtype);
        self.vol.cache.mark_dirty(&b);
        let idx = self.dir_index(st, dino)?;
        let new = Slot { ino, dtype, ..slot };
        if name == b".." {
            idx.dotdot = new;
        } else {
            idx.names.insert(name.into(), new);
        }
        Ok(b)
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
