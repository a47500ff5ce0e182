//! Inode and block allocation, FFS style (McKusick et al., "A Fast File System for UNIX"):
//! a file's inode goes in its directory's group, a new directory goes to a group with
//! above-average free inodes and the fewest directories (spreading the tree), and a file's
//! blocks follow the previous block of the file so reads are sequential.

use cairn_bufcache::BufRef;
use cairn_vfs::{Errno, FsError, Result};

use crate::format::{bitmap, kind, superblock};
use crate::{Ffs, State, corrupt_err};

/// Sets bit `i` of a bitmap block, saving (in an undo scope) only the byte it changes.
fn set_bit(b: &BufRef, i: usize, v: bool) {
    bitmap::set(&mut b.write_range(i / 8, 1), i % 8, v);
}

impl Ffs {
    /// The group descriptor and one bitmap of group `g`, for a step's buffer list.
    pub(crate) fn group_bufs(&self, g: u64, inode_map: bool) -> Result<[BufRef; 2]> {
        let d = self.bread(self.geo.desc_block(g), kind::GROUP)?;
        let m = if inode_map {
            self.geo.inode_bitmap(g)
        } else {
            self.geo.block_bitmap(g)
        };
        Ok([d, self.bread(m, kind::GROUP)?])
    }

    fn store_desc(&self, st: &State, g: u64) -> Result<()> {
        let b = self.bread(self.geo.desc_block(g), kind::GROUP)?;
        st.groups[g as usize].encode(&mut b.write_range(0, superblock::SB_BYTES));
        self.cache.mark_dirty(&b);
        Ok(())
    }

    /// Allocates an inode near `parent` (or spread out, for a directory). Returns the inode
    /// number, its previous generation and the group buffers changed.
    ///
    /// An inode whose bit is clear but whose table slot is in use (a crash left the inode
    /// written but not its bitmap, and no fsck ran) is skipped and its bit set: reusing it
    /// could hand out an inode some directory still names. fsck reclaims it if it is a leak.
    pub(crate) fn alloc_inode(
        &self,
        st: &mut State,
        parent: u64,
        dir: bool,
    ) -> Result<(u64, u32, [BufRef; 2])> {
        let n = self.geo.group_count;
        let pg = self.geo.group_of_ino(parent).min(n - 1);
        let start = if dir {
            let total_free: u64 = st.groups.iter().map(|g| g.free_inodes as u64).sum();
            let avg = total_free / n;
            (0..n)
                .map(|i| (pg + i) % n)
                .filter(|&g| st.groups[g as usize].free_inodes as u64 >= avg.max(1))
                .min_by_key(|&g| st.groups[g as usize].dirs)
                .unwrap_or(pg)
        } else {
            pg
        };
        for i in 0..n {
            let g = (start + i) % n;
            let ipg = self.geo.inodes_per_group as usize;
            while st.groups[g as usize].free_inodes > 0 {
                let bufs = self.group_bufs(g, true)?;
                let Some(idx) = bitmap::find_clear(&bufs[1].read(), 0, ipg) else {
                    // The summary said free but the bitmap is full: trust the bitmap.
                    st.group_mut(g).free_inodes = 0;
                    break;
                };
                set_bit(&bufs[1], idx, true);
                self.cache.mark_dirty(&bufs[1]);
                st.group_mut(g).free_inodes -= 1;
                st.free_inodes = st.free_inodes.saturating_sub(1);
                let ino = g * self.geo.inodes_per_group + idx as u64;
                let old = if ino < crate::format::ROOT_INO {
                    None
                } else {
                    match self.read_disk_inode(ino) {
                        Ok(d) => Some(d),
                        // The device failed, not the slot: fail the operation (its undo
                        // clears the bit again) rather than leak a good inode.
                        Err(e @ FsError::Io(_)) => return Err(e),
                        Err(_) => None,
                    }
                };
                match old {
                    Some(old) if old.is_free() => {
                        if dir {
                            st.group_mut(g).dirs += 1;
                        }
                        self.store_desc(st, g)?;
                        return Ok((ino, old.generation, bufs));
                    }
                    _ => {
                        log::warn!(
                            "inode {ino} is marked free but its slot is in use or unreadable: skipped (run cairn fsck)"
                        );
                        self.store_desc(st, g)?;
                    }
                }
            }
        }
        Err(Errno::ENOSPC.into())
    }

    pub(crate) fn free_inode_bit(&self, st: &mut State, ino: u64, dir: bool) -> Result<()> {
        let g = self.geo.group_of_ino(ino);
        let b = self.bread(self.geo.inode_bitmap(g), kind::GROUP)?;
        let idx = (ino % self.geo.inodes_per_group) as usize;
        if !bitmap::get(&b.read(), idx) {
            return Err(corrupt_err(format!(
                "freeing inode {ino} that is not allocated"
            )));
        }
        set_bit(&b, idx, false);
        self.cache.mark_dirty(&b);
        let gd = st.group_mut(g);
        gd.free_inodes += 1;
        if dir {
            gd.dirs = gd.dirs.saturating_sub(1);
        }
        st.free_inodes += 1;
        self.store_desc(st, g)
    }

    /// Allocates a block as close after `pref` as possible (`pref` 0: the group of `ino`).
    pub(crate) fn alloc_block(&self, st: &mut State, pref: u64, ino: u64) -> Result<u64> {
        let n = self.geo.group_count;
        let (pg, pbit) = if pref != 0 && pref < self.geo.total_blocks {
            let g = self.geo.group_of_block(pref);
            (g, pref - self.geo.group_start(g))
        } else {
            let g = self.geo.group_of_ino(ino).min(n - 1);
            (g, self.geo.meta_blocks())
        };
        // Reserve blocks so the last few are never needed for metadata we cannot write.
        for i in 0..n {
            let g = (pg + i) % n;
            if st.groups[g as usize].free_blocks == 0 {
                continue;
            }
            let len = self.geo.group_len(g) as usize;
            let from = if i == 0 {
                pbit as usize
            } else {
                self.geo.meta_blocks() as usize
            };
            let b = self.bread(self.geo.block_bitmap(g), kind::GROUP)?;
            let Some(bit) = bitmap::find_clear(&b.read(), from, len) else {
                st.group_mut(g).free_blocks = 0;
                continue;
            };
            set_bit(&b, bit, true);
            self.cache.mark_dirty(&b);
            st.group_mut(g).free_blocks -= 1;
            st.free_blocks = st.free_blocks.saturating_sub(1);
            self.store_desc(st, g)?;
            let blk = self.geo.group_start(g) + bit as u64;
            if !self.geo.is_data_block(blk) {
                return Err(corrupt_err(format!(
                    "group {g}: bitmap shows metadata block {blk} free"
                )));
            }
            return Ok(blk);
        }
        Err(Errno::ENOSPC.into())
    }

    pub(crate) fn free_block(&self, st: &mut State, blk: u64) -> Result<()> {
        if !self.geo.is_data_block(blk) {
            return Err(corrupt_err(format!(
                "freeing block {blk} outside the data area"
            )));
        }
        let g = self.geo.group_of_block(blk);
        let b = self.bread(self.geo.block_bitmap(g), kind::GROUP)?;
        let bit = (blk - self.geo.group_start(g)) as usize;
        if !bitmap::get(&b.read(), bit) {
            return Err(corrupt_err(format!(
                "freeing block {blk} that is already free"
            )));
        }
        set_bit(&b, bit, false);
        self.cache.mark_dirty(&b);
        // A freed block's cached contents must never be written over its next owner.
        self.cache.invalidate(blk);
        st.group_mut(g).free_blocks += 1;
        st.free_blocks += 1;
        self.store_desc(st, g)
    }
}
