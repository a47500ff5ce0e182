//! The block map: where each logical block of a file lives (12 direct pointers, single,
//! double and triple indirect blocks), allocation along a path, hole punching, and
//! truncation that clears pointers before it frees (rule 2).

use cairn_bufcache::BufRef;
use cairn_vfs::{Errno, Result};

use crate::format::{DiskInode, NDIRECT, get_u64, kind, put_u64};
use crate::strategy::{
    AllocDirect, AllocIndir, BlkMapDep, BlockKind, FreeBlocks, FreeFile, InodePtr,
};
use crate::{Ffs, State, corrupt_err};

/// An indirect block a mapping allocated, and where the pointer to it is: the inode's root
/// `slot` (`holder` None) or slot `slot` of indirect block `holder`.
pub(crate) struct Grown {
    pub blk: u64,
    pub holder: Option<u64>,
    pub slot: usize,
}

/// Fills a new metadata block before the pointer to it is declared.
pub(crate) type Init<'a> = &'a dyn Fn(&mut [u8]);

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

    /// Maps `lbn`, allocating the leaf block (of `leaf` kind) and any missing indirect
    /// blocks, and declares each allocation: `BlkMapDep` for the bit, then `AllocDirect` or
    /// `AllocIndir` for the pointer (soft updates' `softdep_setup_allocdirect`/`_allocindir`).
    /// A new indirect block is zeroed, and a metadata leaf filled by `init`, *before* its
    /// pointer is declared: a strategy that writes or tracks the block sees it initialized
    /// (rule 1). Returns the block, whether it is new, and a metadata leaf's new buffer.
    pub(crate) fn bmap_alloc(
        &self,
        st: &mut State,
        ino: u64,
        lbn: u64,
        leaf: BlockKind,
        init: Option<Init>,
    ) -> Result<(u64, bool, Option<BufRef>)> {
        self.bmap_alloc_tracked(st, ino, lbn, leaf, init, &mut Vec::new())
    }

    /// [`Ffs::bmap_alloc`], noting in `grown` each indirect block it allocated and where
    /// the pointer to it is (so a write whose data never reached the file can take them
    /// back after its first pass was committed).
    pub(crate) fn bmap_alloc_tracked(
        &self,
        st: &mut State,
        ino: u64,
        lbn: u64,
        leaf: BlockKind,
        init: Option<Init>,
        grown: &mut Vec<Grown>,
    ) -> Result<(u64, bool, Option<BufRef>)> {
        let ppb = self.vol.geo.ptrs_per_block();
        let Some((level, path)) = tree_path(lbn, ppb) else {
            return Err(Errno::EFBIG.into());
        };
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
        let mut leaf_buf = None;
        if cur == 0 {
            cur = self.alloc_block_for(st, pref, ino)?;
            fresh = true;
            let ic = self.iget(st, ino)?;
            ic.d.blocks += 1;
            let ptr = if level == 0 {
                ic.d.direct[path[0] as usize] = cur;
                InodePtr::Direct(path[0] as u8)
            } else {
                ic.d.indirect[path[0] as usize] = cur;
                InodePtr::Indirect(level as u8)
            };
            let kind = if level == 0 {
                leaf
            } else {
                grown.push(Grown {
                    blk: cur,
                    holder: None,
                    slot: path[0] as usize,
                });
                BlockKind::Indirect
            };
            let nb = self.init_block(cur, kind, init);
            let f = AllocDirect {
                ino,
                ptr,
                lbn,
                new_blk: cur,
                old_blk: 0,
                new_size: self.vol.geo.block_size,
                old_size: 0,
                kind,
                new_buf: nb.as_ref(),
                chain: &[],
            };
            self.fact(st, |s, tx| s.setup_allocdirect(tx, &f))?;
            leaf_buf = nb;
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
                next = self.alloc_block_for(st, pref, ino)?;
                fresh = true;
                self.iget(st, ino)?.d.blocks += 1;
                let kind = if depth + 1 < level {
                    grown.push(Grown {
                        blk: next,
                        holder: Some(cur),
                        slot: idx as usize,
                    });
                    BlockKind::Indirect
                } else {
                    leaf
                };
                let nb = self.init_block(next, kind, init);
                put_u64(&mut ib.write_range((idx * 8) as usize, 8), 0, next);
                self.vol.cache.mark_dirty(&ib);
                let f = AllocIndir {
                    ino,
                    indir: &ib,
                    slot: idx as u32,
                    lbn,
                    new_blk: next,
                    old_blk: 0,
                    kind,
                    new_buf: nb.as_ref(),
                };
                self.fact(st, |s, tx| s.setup_allocindir(tx, &f))?;
                leaf_buf = nb;
            } else {
                fresh = false;
                leaf_buf = None;
            }
            cur = next;
        }
        Ok((cur, fresh, leaf_buf.filter(|_| leaf.is_metadata())))
    }

    /// Allocates a block for `ino` and declares its bit (`BlkMapDep`).
    pub(crate) fn alloc_block_for(&self, st: &mut State, pref: u64, ino: u64) -> Result<u64> {
        let (blk, g) = st.alloc.alloc_block(&self.vol, pref, ino)?;
        let f = BlkMapDep {
            blk,
            ino,
            bitmap: &g.bitmap,
            desc: &g.desc,
        };
        self.fact(st, |s, tx| s.setup_blkmapdep(tx, &f))?;
        Ok(blk)
    }

    /// The buffer of a block just allocated, initialized: an indirect block zeroed (rule
    /// 1: a crash must never leave a pointer to a block holding stale pointers from its
    /// previous life), a metadata leaf filled by `init`. Data gets none (its bytes come
    /// later, through the cache or as a stream).
    fn init_block(&self, blk: u64, kind: BlockKind, init: Option<Init>) -> Option<BufRef> {
        let tag = match kind {
            BlockKind::Data => return None,
            BlockKind::Indirect => kind::INDIRECT,
            BlockKind::Directory => kind::DIRECTORY,
            BlockKind::Symlink => kind::DATA,
            BlockKind::Xattr => kind::XATTR,
        };
        let b = self.bnew(blk, tag);
        if kind != BlockKind::Indirect
            && let Some(init) = init
        {
            init(&mut b.write());
        }
        self.vol.cache.mark_dirty(&b);
        Some(b)
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
    /// left empty). The pointers are cleared and the inode re-encoded first; `FreeBlocks`
    /// then names what was freed, and the strategy releases the bits when its order allows
    /// (rule 2). With `free_inode` (the inode is freed: `from` is 0), the xattr block goes
    /// too, the same encoding is the zeroed inode (generation kept, so a stale handle never
    /// matches its next life), and `FreeFile` follows.
    pub(crate) fn truncate_blocks(
        &self,
        st: &mut State,
        ino: u64,
        from: u64,
        free_inode: bool,
    ) -> Result<()> {
        let ppb = self.vol.geo.ptrs_per_block();
        let mut to_free = Vec::new();
        let mut changed: Vec<BufRef> = Vec::new();
        let mut d = self.iget(st, ino)?.d.clone();
        if free_inode {
            // A fast symlink keeps its target in the pointer area: nothing to walk.
            d.fast_link = None;
        } else if d.fast_link.is_some() {
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
        if free_inode && d.xattr != 0 {
            // Every block of the attribute list; of a damaged chain, the blocks up to the
            // damage (fsck reclaims the rest as a leak) rather than an inode never freed.
            match self.xattr_chain(ino, d.xattr) {
                Ok(c) => to_free.extend(c.blocks),
                Err(e) => {
                    log::error!("inode {ino}: freeing its extended attributes: {e}");
                    to_free.push(d.xattr);
                }
            }
        }
        let freed_file = free_inode.then(|| FreeFile {
            ino,
            generation: d.generation,
            is_dir: d.is_dir(),
        });
        if free_inode {
            d = DiskInode {
                generation: d.generation,
                ..Default::default()
            };
        }
        self.iget(st, ino)?.d = d;
        let ib = self.store(st, ino)?;
        changed.retain(|b| !to_free.contains(&b.blkno()));
        let f = FreeBlocks {
            ino,
            inode_buf: &ib,
            from_lbn: from,
            freed: &to_free,
            holders: &changed,
            whole_file: free_inode,
        };
        self.fact(st, |s, tx| s.setup_freeblocks(tx, &f))?;
        if let Some(f) = freed_file {
            self.fact(st, |s, tx| s.setup_freefile(tx, &f))?;
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
