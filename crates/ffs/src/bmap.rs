//! The block map: where each logical block of a file lives (12 direct pointers, single,
//! double and triple indirect blocks), allocation along a path, hole punching, and
//! truncation that clears pointers before it frees (rule 2).

use cairn_bufcache::BufRef;
use cairn_vfs::{Errno, Result};

use crate::format::{DiskInode, NDIRECT, get_u64, kind, put_u64};
use crate::{Ffs, State, corrupt_err};

/// Most blocks mapping one logical block can allocate: a triple-indirect path and the data.
pub(crate) const MAX_MAP_BLOCKS: u64 = 4;

/// Where logical block `lbn` sits in the pointer tree: the level (0 direct, 1..=3
/// indirect) and the index at each level from the root.
pub(crate) fn tree_path(lbn: u64, ppb: u64) -> Option<(usize, [u64; 4])> {
    let mut l = lbn;
    if l < NDIRECT as u64 {
        return Some((0, [l, 0, 0, 0]));
    }
    l -= NDIRECT as u64;
    if l < ppb {
        return Some((1, [0, l, 0, 0]));
    }
    l -= ppb;
    if l < ppb * ppb {
        return Some((2, [1, l / ppb, l % ppb, 0]));
    }
    l -= ppb * ppb;
    if l < ppb * ppb * ppb {
        return Some((3, [2, l / (ppb * ppb), (l / ppb) % ppb, l % ppb]));
    }
    None
}

impl Ffs {
    fn read_ptr(&self, blk: u64, idx: u64) -> Result<u64> {
        let b = self.bread(blk, kind::INDIRECT)?;
        let p = get_u64(&b.read(), (idx * 8) as usize);
        if p != 0 && !self.vol.geo.is_data_block(p) {
            return Err(corrupt_err(format!(
                "indirect block {blk}: pointer {p} out of range"
            )));
        }
        Ok(p)
    }

    /// Maps logical block `lbn` of `ino` to a device block; 0 for a hole.
    pub(crate) fn bmap(&self, st: &mut State, ino: u64, lbn: u64) -> Result<u64> {
        let ppb = self.vol.geo.ptrs_per_block();
        let Some((level, path)) = tree_path(lbn, ppb) else {
            return Ok(0);
        };
        let d = &self.iget(st, ino)?.d;
        if d.fast_link.is_some() {
            return Ok(0);
        }
        let mut p = if level == 0 {
            d.direct[path[0] as usize]
        } else {
            d.indirect[path[0] as usize]
        };
        for &idx in &path[1..=level] {
            if p == 0 {
                return Ok(0);
            }
            p = self.read_ptr(p, idx)?;
        }
        Ok(p)
    }

    /// How many blocks `bmap_alloc(ino, lbn)` would allocate: the data block and the missing
    /// indirect blocks on its path (0 if mapped; at most [`MAX_MAP_BLOCKS`]).
    pub(crate) fn blocks_to_map(&self, st: &mut State, ino: u64, lbn: u64) -> Result<u64> {
        let ppb = self.vol.geo.ptrs_per_block();
        let Some((level, path)) = tree_path(lbn, ppb) else {
            return Err(Errno::EFBIG.into());
        };
        let d = &self.iget(st, ino)?.d;
        let mut p = if level == 0 {
            d.direct[path[0] as usize]
        } else {
            d.indirect[path[0] as usize]
        };
        if p == 0 {
            return Ok(level as u64 + 1);
        }
        for (depth, &idx) in path[1..=level].iter().enumerate() {
            p = self.read_ptr(p, idx)?;
            if p == 0 {
                return Ok((level - depth) as u64);
            }
        }
        Ok(0)
    }

    /// Maps `lbn`, allocating the data block and any missing indirect blocks. Returns the
    /// block, whether it is new (zero-filled, never written), and the buffers holding the
    /// pointers that changed (inode block excluded: the caller writes the inode).
    pub(crate) fn bmap_alloc(
        &self,
        st: &mut State,
        ino: u64,
        lbn: u64,
    ) -> Result<(u64, bool, Vec<BufRef>)> {
        let ppb = self.vol.geo.ptrs_per_block();
        let Some((level, path)) = tree_path(lbn, ppb) else {
            return Err(Errno::EFBIG.into());
        };
        let mut changed = Vec::new();
        // Allocation preference: the block after the previous logical block's.
        let pref = if lbn > 0 {
            self.bmap(st, ino, lbn - 1)?.saturating_add(1)
        } else {
            0
        };
        let root = {
            let d = &self.iget(st, ino)?.d;
            if level == 0 {
                d.direct[path[0] as usize]
            } else {
                d.indirect[path[0] as usize]
            }
        };
        let mut cur = root;
        let mut fresh = false;
        if cur == 0 {
            cur = st.alloc.alloc_block(&self.vol, pref, ino)?.0;
            fresh = true;
            let ic = self.iget(st, ino)?;
            ic.d.blocks += 1;
            if level == 0 {
                ic.d.direct[path[0] as usize] = cur;
            } else {
                ic.d.indirect[path[0] as usize] = cur;
            }
            if level > 0 {
                let nb = self.bnew(cur, kind::INDIRECT);
                self.vol.cache.mark_dirty(&nb);
                self.init_indirect(st, &nb)?;
                changed.push(nb);
            }
        }
        for (depth, &idx) in path[1..=level].iter().enumerate() {
            let ib = self.bread(cur, kind::INDIRECT)?;
            let mut next = get_u64(&ib.read(), (idx * 8) as usize);
            if next != 0 && !self.vol.geo.is_data_block(next) {
                return Err(corrupt_err(format!(
                    "indirect block {cur}: pointer {next} out of range"
                )));
            }
            if next == 0 {
                next = st.alloc.alloc_block(&self.vol, pref, ino)?.0;
                fresh = true;
                self.iget(st, ino)?.d.blocks += 1;
                put_u64(&mut ib.write_range((idx * 8) as usize, 8), 0, next);
                self.vol.cache.mark_dirty(&ib);
                if !changed.iter().any(|b: &BufRef| b.blkno() == ib.blkno()) {
                    changed.push(ib);
                }
                if depth + 1 < level {
                    let nb = self.bnew(next, kind::INDIRECT);
                    self.vol.cache.mark_dirty(&nb);
                    self.init_indirect(st, &nb)?;
                    changed.push(nb);
                }
            } else {
                fresh = false;
            }
            cur = next;
        }
        Ok((cur, fresh, changed))
    }

    /// A new indirect block reaches disk zeroed, with its bitmap, before anything points
    /// to it (rule 1): otherwise a crash could leave a pointer to a block holding stale
    /// pointers from its previous life.
    fn init_indirect(&self, st: &State, b: &BufRef) -> Result<()> {
        let g = st
            .alloc
            .group_bufs(&self.vol, self.vol.geo.group_of_block(b.blkno()), false)?;
        self.strategy
            .setup_block_init(&self.io, &[b, &g.desc, &g.bitmap])
    }

    /// Every block pointer in the tree of `ino` (data and indirect), walking the indirect
    /// blocks instead of every logical block, so a sparse file of 2^40 bytes costs what its
    /// allocated blocks cost.
    pub(crate) fn file_blocks(&self, st: &mut State, ino: u64) -> Result<Vec<u64>> {
        let d = self.iget(st, ino)?.d.clone();
        let mut out: Vec<u64> = d.direct.iter().copied().filter(|&p| p != 0).collect();
        if d.fast_link.is_some() {
            return Ok(Vec::new());
        }
        for (level, &root) in d.indirect.iter().enumerate() {
            if root != 0 {
                self.walk_tree(root, level + 1, &mut out)?;
            }
        }
        Ok(out)
    }

    fn walk_tree(&self, blk: u64, level: usize, out: &mut Vec<u64>) -> Result<()> {
        if !self.vol.geo.is_data_block(blk) {
            return Err(corrupt_err(format!("indirect pointer {blk} out of range")));
        }
        out.push(blk);
        let b = self.bread(blk, kind::INDIRECT)?;
        let ptrs: Vec<u64> = {
            let data = b.read();
            (0..self.vol.geo.ptrs_per_block() as usize)
                .map(|i| get_u64(&data, i * 8))
                .filter(|&p| p != 0)
                .collect()
        };
        for p in ptrs {
            if level == 1 {
                if !self.vol.geo.is_data_block(p) {
                    return Err(corrupt_err(format!(
                        "indirect block {blk}: pointer {p} out of range"
                    )));
                }
                out.push(p);
            } else {
                self.walk_tree(p, level - 1, out)?;
            }
        }
        Ok(())
    }

    /// Clears the pointer to logical block `lbn` (punching a hole); returns the block it
    /// pointed to and the indirect block holding the pointer (None: the inode holds it).
    /// Indirect blocks left empty stay allocated.
    pub(crate) fn bunmap(
        &self,
        st: &mut State,
        ino: u64,
        lbn: u64,
    ) -> Result<Option<(u64, Option<BufRef>)>> {
        let ppb = self.vol.geo.ptrs_per_block();
        let Some((level, path)) = tree_path(lbn, ppb) else {
            return Ok(None);
        };
        let ic = self.iget(st, ino)?;
        if level == 0 {
            let old = ic.d.direct[path[0] as usize];
            if old == 0 {
                return Ok(None);
            }
            ic.d.direct[path[0] as usize] = 0;
            return Ok(Some((old, None)));
        }
        let mut cur = ic.d.indirect[path[0] as usize];
        for &idx in &path[1..level] {
            if cur == 0 {
                return Ok(None);
            }
            cur = self.read_ptr(cur, idx)?;
        }
        if cur == 0 {
            return Ok(None);
        }
        let b = self.bread(cur, kind::INDIRECT)?;
        let off = (path[level] * 8) as usize;
        let old = get_u64(&b.read(), off);
        if old == 0 {
            return Ok(None);
        }
        if !self.vol.geo.is_data_block(old) {
            return Err(corrupt_err(format!(
                "indirect block {cur}: pointer {old} out of range"
            )));
        }
        put_u64(&mut b.write_range(off, 8), 0, 0);
        self.vol.cache.mark_dirty(&b);
        Ok(Some((old, Some(b))))
    }

    /// Frees every block of `ino` at logical block `from` and beyond (and indirect blocks
    /// left empty). Pointers are cleared first and written through `setup_freeblocks`; the
    /// bitmap is released only afterwards (rule 2).
    pub(crate) fn truncate_blocks(&self, st: &mut State, ino: u64, from: u64) -> Result<()> {
        let ppb = self.vol.geo.ptrs_per_block();
        let mut to_free = Vec::new();
        let mut changed: Vec<BufRef> = Vec::new();
        let mut d = self.iget(st, ino)?.d.clone();
        if d.fast_link.is_some() {
            return Ok(());
        }
        for i in (from.min(NDIRECT as u64) as usize)..NDIRECT {
            if d.direct[i] != 0 {
                to_free.push(d.direct[i]);
                d.direct[i] = 0;
            }
        }
        let mut base = NDIRECT as u64;
        let mut span = 1u64;
        for level in 0..3 {
            span *= ppb;
            let root = d.indirect[level];
            if root != 0 && from < base + span {
                let first = from.saturating_sub(base);
                if self.free_subtree(
                    root,
                    level + 1,
                    first,
                    span / ppb,
                    &mut to_free,
                    &mut changed,
                )? {
                    to_free.push(root);
                    d.indirect[level] = 0;
                }
            }
            base += span;
        }
        d.blocks = d.blocks.saturating_sub(to_free.len() as u64);
        if st.free_on_truncate == Some(ino) {
            d = DiskInode {
                generation: d.generation,
                ..Default::default()
            };
        }
        self.iget(st, ino)?.d = d;
        let ib = self.iput(st, ino)?;
        changed.retain(|b| !to_free.contains(&b.blkno()));
        let mut refs: Vec<&BufRef> = changed.iter().collect();
        refs.push(&ib);
        self.strategy.setup_freeblocks(&self.io, &refs)?;
        for b in to_free {
            st.alloc.free_block(&self.vol, b)?;
        }
        Ok(())
    }

    /// Clears the pointers of the subtree at `blk` (a `level`-indirect block whose entries
    /// each cover `child_span` blocks) for logical offsets >= `first` within it. Returns
    /// true if the whole block became empty (the caller frees it).
    fn free_subtree(
        &self,
        blk: u64,
        level: usize,
        first: u64,
        child_span: u64,
        to_free: &mut Vec<u64>,
        changed: &mut Vec<BufRef>,
    ) -> Result<bool> {
        if !self.vol.geo.is_data_block(blk) {
            return Err(corrupt_err(format!("indirect pointer {blk} out of range")));
        }
        let ppb = self.vol.geo.ptrs_per_block();
        let b = self.bread(blk, kind::INDIRECT)?;
        let ptrs: Vec<u64> = {
            let data = b.read();
            (0..ppb).map(|i| get_u64(&data, (i * 8) as usize)).collect()
        };
        let mut modified = false;
        for (i, &p) in ptrs.iter().enumerate() {
            let i = i as u64;
            if p == 0 || (i + 1) * child_span <= first {
                continue;
            }
            let release = if level == 1 {
                if !self.vol.geo.is_data_block(p) {
                    return Err(corrupt_err(format!(
                        "indirect block {blk}: pointer {p} out of range"
                    )));
                }
                true
            } else {
                let sub_first = first.saturating_sub(i * child_span);
                self.free_subtree(p, level - 1, sub_first, child_span / ppb, to_free, changed)?
            };
            if release {
                to_free.push(p);
                put_u64(&mut b.write_range((i * 8) as usize, 8), 0, 0);
                modified = true;
            }
        }
        let all_zero = b.read().iter().all(|&x| x == 0);
        if modified {
            self.vol.cache.mark_dirty(&b);
            changed.push(b);
        }
        Ok(all_zero)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_paths_at_the_boundaries() {
        let p = 512;
        assert_eq!(tree_path(0, p), Some((0, [0, 0, 0, 0])));
        assert_eq!(tree_path(11, p), Some((0, [11, 0, 0, 0])));
        assert_eq!(tree_path(12, p), Some((1, [0, 0, 0, 0])));
        assert_eq!(tree_path(12 + 511, p), Some((1, [0, 511, 0, 0])));
        assert_eq!(tree_path(12 + 512, p), Some((2, [1, 0, 0, 0])));
        assert_eq!(
            tree_path(12 + 512 + 512 * 512 - 1, p),
            Some((2, [1, 511, 511, 0]))
        );
        assert_eq!(tree_path(12 + 512 + 512 * 512, p), Some((3, [2, 0, 0, 0])));
        let last = 12 + 512 + 512 * 512 + 512 * 512 * 512 - 1;
        assert_eq!(tree_path(last, p), Some((3, [2, 511, 511, 511])));
        assert_eq!(tree_path(last + 1, p), None);
    }
}
