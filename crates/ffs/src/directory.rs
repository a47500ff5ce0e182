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
//!
//! Held bytes: a chunk's free space in the index leaves out the bytes the strategy still
//! writes a removed entry into ([`Strategy::held_dir_bytes`]: soft updates' put-back old
//! names), so a new entry is placed elsewhere and never has to wait for that removal.
//! Invariant: no entry is ever placed over bytes the strategy holds — `dir_add` checks the
//! block it places in against the strategy's holds as they are at that moment (holds grow
//! only inside a call that removes an entry, under the engine's lock, so none can appear
//! between that check and the insert); the index's own copy of the holds may be larger
//! than the strategy's (bytes given back and not yet taken) but then only wastes space
//! until `dir_take_given_back` returns them.
//!
//! [`Strategy::held_dir_bytes`]: crate::strategy::Strategy::held_dir_bytes

use std::collections::HashMap;

use cairn_bufcache::BufRef;
use cairn_dir::{DirIndex, Slot};
use cairn_vfs::{Errno, Result};

use crate::format::{DIR_CHUNK, dir, kind};
use crate::strategy::{Apply, BlockKind, DirAdd, DirChange, DirRemove};
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
            let idx = self.build_dir_index(st, dino, d.size / bs, &|a| self.held_bytes(a))?;
            // Built from blocks the open scope may have changed: a rollback drops it.
            st.dirs.insert(dino, idx);
        }
        Ok(st.dirs.get_mut(dino).expect("just inserted"))
    }

    /// The index of directory `dino` of `nblocks` blocks, read from its blocks, with
    /// `held(addr)` the held bytes of the block at `addr`.
    pub(crate) fn build_dir_index(
        &self,
        st: &mut State,
        dino: u64,
        nblocks: u64,
        held: &dyn Fn(u64) -> Vec<(usize, usize)>,
    ) -> Result<DirIndex> {
        let mut idx = DirIndex::new(nblocks);
        for lbn in 0..nblocks {
            let b = self.dir_block(st, dino, lbn)?;
            let addr = b.blkno();
            idx.add_block_held(lbn, addr, &b.read(), held(addr))
                .map_err(|e| corrupt_err(format!("directory {dino}: {e}")))?;
        }
        idx.finish()
            .map_err(|e| corrupt_err(format!("directory {dino}: {e}")))
    }

    /// The bytes of the directory block at `addr` the strategy holds, ascending.
    pub(crate) fn held_bytes(&self, addr: u64) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = self
            .strategy
            .held_dir_bytes(addr)
            .into_iter()
            .map(|(o, l)| (o as usize, l as usize))
            .collect();
        v.sort_unstable();
        v
    }

    /// Gives back to the indexes the bytes the strategy no longer holds.
    fn dir_take_given_back(&self, st: &mut State) -> Result<()> {
        for (dino, addr) in self.strategy.dir_bytes_given_back() {
            let Some(lbn) = st
                .dirs
                .get(dino)
                .and_then(|i| i.held.get(&addr))
                .map(|h| h.lbn)
            else {
                continue;
            };
            let b = self.bread(addr, kind::DIRECTORY)?;
            self.dir_rehold(st, dino, lbn, &b);
        }
        Ok(())
    }

    /// Sets the held bytes of block `lbn` (buffer `b`) in the index of `dino` to the
    /// strategy's as they are now, and the free bytes of its chunks to match. Whether they
    /// changed. (No undo note: the index still describes the block as it is, whatever a
    /// rollback of the call does to the holds — `dir_add` checks them again.)
    fn dir_rehold(&self, st: &mut State, dino: u64, lbn: u64, b: &BufRef) -> bool {
        let addr = b.blkno();
        let now = self.held_bytes(addr);
        let Some(idx) = st.dirs.get_mut(dino) else {
            return false;
        };
        if idx.held_in(addr) == now.as_slice() {
            return false;
        }
        idx.set_held(addr, lbn, now);
        idx.refree_block(lbn, addr, &b.read());
        true
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
        self.dir_take_given_back(st)?;
        let idx = self.dir_index(st, dino)?;
        if idx.place(name.len()).is_some() {
            return Ok(0);
        }
        let nblocks = idx.nblocks;
        self.blocks_to_map(st, dino, nblocks)
    }

    /// Adds `name -> ino` to directory `dino` and declares it (`DirAdd`; `new_inode`: the
    /// call allocated `ino`; `mkdir_body`: its first block, for a new directory). Grows the
    /// directory if no chunk has room: the new block is declared, initialized empty, before
    /// the entry is placed in it, and the directory's inode is re-encoded with its new size.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dir_add(
        &self,
        st: &mut State,
        dino: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
        new_inode: bool,
        mkdir_body: Option<&BufRef>,
    ) -> Result<()> {
        let chunks_per_block = self.vol.geo.bs() / DIR_CHUNK;
        st.dirs.touch(dino);
        self.dir_take_given_back(st)?;
        let need = dir::rec_size(name.len());
        let (chunk, lbn, b) = loop {
            let found = self.dir_index(st, dino)?.place(name.len());
            let chunk = match found {
                Some(c) => c,
                None => self.dir_grow(st, dino)?,
            };
            let lbn = (chunk / chunks_per_block) as u64;
            let b = self.dir_block(st, dino, lbn)?;
            // The invariant (module documentation): the block's holds as the strategy has
            // them now. Only a hold the index did not know of can take the room it found
            // (a rollback of a failed call may bring one back); then look again.
            if !self.dir_rehold(st, dino, lbn, &b)
                || self.dir_index(st, dino)?.free.get(chunk) as usize >= need
            {
                break (chunk, lbn, b);
            }
        };
        let c_in_block = chunk % chunks_per_block;
        let base = c_in_block * DIR_CHUNK;
        // The held bytes of this chunk, in the chunk's own offsets.
        let held: Vec<(usize, usize)> = self
            .dir_index(st, dino)?
            .held_in(b.blkno())
            .iter()
            .filter(|(o, _)| (base..base + DIR_CHUNK).contains(o))
            .map(|&(o, l)| (o - base, l))
            .collect();
        // An entry never leaves its 512-byte chunk: only the chunk changes (and is saved).
        let (off, free) = {
            let mut data = b.write_range(base, DIR_CHUNK);
            let off = dir::insert_except(&mut data, 0, ino, dtype, name, &held)
                .map_err(|e| corrupt_err(format!("directory {dino}: {}", e.0)))?
                .ok_or_else(|| {
                    corrupt_err(format!("directory {dino}: free-space index out of date"))
                })?;
            (base + off, dir::chunk_free_except(&data, 0, &held) as u16)
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
        let f = DirAdd {
            dir: dino,
            buf: &b,
            offset: off as u32,
            ino,
            name,
            dtype,
            new_inode,
            mkdir_body,
        };
        self.fact(st, |s, tx| s.setup_directory_add(tx, &f))
    }

    /// Adds an empty block to directory `dino` (declared through the block map, initialized
    /// before its pointer) and returns the first new chunk. The strategy orders the block
    /// and the indirect blocks pointing to it before the new size: a directory must never
    /// have a hole.
    fn dir_grow(&self, st: &mut State, dino: u64) -> Result<usize> {
        st.dirs.touch(dino);
        let nblocks = self.dir_index(st, dino)?.nblocks;
        self.bmap_alloc(
            st,
            dino,
            nblocks,
            BlockKind::Directory,
            Some(&|b: &mut [u8]| dir::init_empty(b)),
        )?;
        let bs = self.vol.geo.block_size as u64;
        self.iget(st, dino)?.d.size = (nblocks + 1) * bs;
        self.store(st, dino)?;
        let per = self.vol.geo.bs() / DIR_CHUNK;
        self.dir_index(st, dino)?.grew(per);
        Ok(nblocks as usize * per)
    }

    /// Removes `name` from `dino` and declares it (`DirRemove`; `rmdir`: the entry names
    /// a directory). Returns the removed entry and whether the on-disk link counts it
    /// accounted for may drop now.
    pub(crate) fn dir_remove(
        &self,
        st: &mut State,
        dino: u64,
        name: &[u8],
        rmdir: bool,
    ) -> Result<(Slot, Apply)> {
        st.dirs.touch(dino);
        let slot = self
            .dir_index(st, dino)?
            .names
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)?;
        let b = self.dir_block(st, dino, slot.lbn)?;
        let c_in_block = slot.off / DIR_CHUNK;
        {
            let mut data = b.write_range(c_in_block * DIR_CHUNK, DIR_CHUNK);
            dir::remove(&mut data, slot.off % DIR_CHUNK)
                .map_err(|e| corrupt_err(format!("directory {dino}: {}", e.0)))?;
        }
        self.vol.cache.mark_dirty(&b);
        let idx = self.dir_index(st, dino)?;
        idx.names.remove(name);
        let f = DirRemove {
            dir: dino,
            buf: &b,
            offset: slot.off as u32,
            ino: slot.ino,
            name,
            rmdir,
        };
        let apply = self.fact(st, |s, tx| s.setup_directory_remove(tx, &f))?;
        // The removed entry's bytes are free now, unless the strategy holds them (it
        // writes the entry back until its removal may reach disk): the block's free space
        // from its contents and its holds as they are after the fact.
        if !self.dir_rehold(st, dino, slot.lbn, &b) {
            let idx = self.dir_index(st, dino)?;
            idx.refree_chunk(slot.lbn, b.blkno(), c_in_block, &b.read());
        }
        Ok((slot, apply))
    }

    /// Re-points an existing entry (`name`, or `..` when name is `..`) to another inode and
    /// declares it (`DirChange`). Returns whether the on-disk link counts the old target
    /// loses may drop now.
    pub(crate) fn dir_repoint(
        &self,
        st: &mut State,
        dino: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
    ) -> Result<Apply> {
        self.repoint(st, dino, name, ino, dtype, false)
    }

    /// A rename's old `name` in `dino` re-pointed to the whiteout `wh` the call made
    /// (RENAME_WHITEOUT): one entry write takes the name from the moved inode and gives it
    /// to the whiteout, so no state has the old name missing. Declared as a `DirChange`
    /// flagged `whiteout` (the moved inode loses one name, nothing else: a directory keeps
    /// its `.`, its `..` moves on its own). Returns whether that drop may apply now.
    pub(crate) fn dir_whiteout(
        &self,
        st: &mut State,
        dino: u64,
        name: &[u8],
        wh: u64,
    ) -> Result<Apply> {
        self.repoint(st, dino, name, wh, libc::DT_CHR, true)
    }

    fn repoint(
        &self,
        st: &mut State,
        dino: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
        whiteout: bool,
    ) -> Result<Apply> {
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
        let f = DirChange {
            dir: dino,
            buf: &b,
            offset: slot.off as u32,
            old_ino: slot.ino,
            new_ino: ino,
            dtype,
            old_dtype: slot.dtype,
            name,
            old_is_dir: slot.dtype == libc::DT_DIR && !whiteout,
            dotdot: name == b"..",
            whiteout,
        };
        self.fact(st, |s, tx| s.setup_directory_change(tx, &f))
    }
}
