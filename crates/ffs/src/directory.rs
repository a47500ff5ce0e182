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
            let nblocks = d.size / bs;
            let mut idx = DirIndex::new(nblocks);
            for lbn in 0..nblocks {
                let b = self.dir_block(st, dino, lbn)?;
                idx.add_block(lbn, &b.read())
                    .map_err(|e| corrupt_err(format!("directory {dino}: {e}")))?;
            }
            let idx = idx
                .finish()
                .map_err(|e| corrupt_err(format!("directory {dino}: {e}")))?;
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
        let found = self.dir_index(st, dino)?.place(name.len());
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
        let f = DirRemove {
            dir: dino,
            buf: &b,
            offset: slot.off as u32,
            ino: slot.ino,
            name,
            rmdir,
        };
        let apply = self.fact(st, |s, tx| s.setup_directory_remove(tx, &f))?;
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
            name,
            old_is_dir: slot.dtype == libc::DT_DIR,
            dotdot: name == b"..",
        };
        self.fact(st, |s, tx| s.setup_directory_change(tx, &f))
    }
}
