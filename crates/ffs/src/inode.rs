//! In-core inodes, the block map (direct and indirect pointers) and truncation.

use cairn_bufcache::BufRef;
use cairn_vfs::{Attr, Errno, FileKind, Result};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::format::{DiskInode, NDIRECT, get_u64, kind, put_u64};
use crate::{Ffs, State, corrupt_err};

/// An inode in memory: its disk form plus the references that keep it alive.
#[derive(Clone)]
pub(crate) struct InCore {
    pub d: DiskInode,
    /// Lookups the kernel holds (FUSE lookup count).
    pub nlookup: u64,
    /// Open handles.
    pub nopen: u32,
    /// The undo scope that last saved this inode (see `undo`).
    pub undo_scope: u64,
}

impl InCore {
    pub fn new(d: DiskInode) -> InCore {
        InCore {
            d,
            nlookup: 0,
            nopen: 0,
            undo_scope: 0,
        }
    }
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

pub(crate) fn ns_to_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_nanos(ns.unsigned_abs()))
            .unwrap_or(UNIX_EPOCH)
    }
}

pub(crate) fn time_to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

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
    pub(crate) fn attr_of(&self, ino: u64, d: &DiskInode) -> Attr {
        Attr {
            ino,
            generation: d.generation as u64,
            size: d.size,
            blocks: d.blocks * (self.geo.block_size as u64 / 512),
            atime: ns_to_time(d.atime),
            mtime: ns_to_time(d.mtime),
            ctime: ns_to_time(d.ctime),
            crtime: ns_to_time(d.btime),
            kind: FileKind::from_mode(d.mode).unwrap_or(FileKind::RegularFile),
            perm: (d.mode & 0o7777) as u16,
            nlink: d.nlink,
            uid: d.uid,
            gid: d.gid,
            rdev: d.rdev,
            blksize: self.geo.block_size,
            flags: 0,
        }
    }

    /// Reads an inode from its table block (no in-core caching).
    pub(crate) fn read_disk_inode(&self, ino: u64) -> Result<DiskInode> {
        if !self.geo.valid_ino(ino) {
            return Err(Errno::ENOENT.into());
        }
        let (blk, off) = self.geo.inode_location(ino);
        let b = self.bread(blk, kind::INODE)?;
        let d = DiskInode::decode(ino, &b.read()[off..off + 256]).map_err(|e| corrupt_err(e.0))?;
        Ok(d)
    }

    /// The in-core inode `ino`, loading it. A free inode is ENOENT (stale handle).
    ///
    /// This is the only way to change an in-core inode: inside an undo scope it saves the
    /// inode on its first touch, so a failed operation can put it back (see `undo`).
    pub(crate) fn iget<'a>(&self, st: &'a mut State, ino: u64) -> Result<&'a mut InCore> {
        let State { inodes, undo, .. } = st;
        match inodes.entry(ino) {
            std::collections::hash_map::Entry::Vacant(e) => {
                let d = self.read_disk_inode(ino)?;
                if d.is_free() {
                    return Err(Errno::ENOENT.into());
                }
                self.validate_pointers(ino, &d)?;
                let ic = e.insert(InCore::new(d));
                undo.new_inode(ino, ic);
                Ok(ic)
            }
            std::collections::hash_map::Entry::Occupied(e) => {
                let ic = e.into_mut();
                undo.touch_inode(ino, ic);
                Ok(ic)
            }
        }
    }

    /// Puts a new inode in core (inode allocation), recording it in the undo scope.
    pub(crate) fn iinsert(&self, st: &mut State, ino: u64, d: DiskInode) {
        let State { inodes, undo, .. } = st;
        match inodes.entry(ino) {
            std::collections::hash_map::Entry::Occupied(e) => {
                // Not expected (a free inode is never in core), but keep it restorable.
                let ic = e.into_mut();
                undo.touch_inode(ino, ic);
                let saved_in = ic.undo_scope;
                *ic = InCore::new(d);
                ic.undo_scope = saved_in;
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                let ic = e.insert(InCore::new(d));
                undo.new_inode(ino, ic);
            }
        }
    }

    fn validate_pointers(&self, ino: u64, d: &DiskInode) -> Result<()> {
        for p in d.root_pointers().chain((d.xattr != 0).then_some(d.xattr)) {
            if !self.geo.is_data_block(p) {
                return Err(corrupt_err(format!(
                    "inode {ino}: block pointer {p} out of range"
                )));
            }
        }
        Ok(())
    }

    /// Encodes the in-core inode into its table block and marks it dirty; returns the block.
    pub(crate) fn iput(&self, st: &State, ino: u64) -> Result<BufRef> {
        let ic = st
            .inodes
            .get(&ino)
            .ok_or_else(|| corrupt_err(format!("inode {ino} not in core")))?;
        self.write_disk_inode(ino, &ic.d)
    }

    pub(crate) fn write_disk_inode(&self, ino: u64, d: &DiskInode) -> Result<BufRef> {
        let (blk, off) = self.geo.inode_location(ino);
        let b = self.bread(blk, kind::INODE)?;
        d.encode(ino, &mut b.write_range(off, 256));
        self.cache.mark_dirty(&b);
        Ok(b)
    }

    fn read_ptr(&self, blk: u64, idx: u64) -> Result<u64> {
        let b = self.bread(blk, kind::INDIRECT)?;
        let p = get_u64(&b.read(), (idx * 8) as usize);
        if p != 0 && !self.geo.is_data_block(p) {
            return Err(corrupt_err(format!(
                "indirect block {blk}: pointer {p} out of range"
            )));
        }
        Ok(p)
    }

    /// Maps logical block `lbn` of `ino` to a device block; 0 for a hole.
    pub(crate) fn bmap(&self, st: &mut State, ino: u64, lbn: u64) -> Result<u64> {
        let ppb = self.geo.ptrs_per_block();
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
        let ppb = self.geo.ptrs_per_block();
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
        let ppb = self.geo.ptrs_per_block();
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
            cur = self.alloc_block(st, pref, ino)?;
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
                self.cache.mark_dirty(&nb);
                self.init_indirect(&nb)?;
                changed.push(nb);
            }
        }
        for (depth, &idx) in path[1..=level].iter().enumerate() {
            let ib = self.bread(cur, kind::INDIRECT)?;
            let mut next = get_u64(&ib.read(), (idx * 8) as usize);
            if next != 0 && !self.geo.is_data_block(next) {
                return Err(corrupt_err(format!(
                    "indirect block {cur}: pointer {next} out of range"
                )));
            }
            if next == 0 {
                next = self.alloc_block(st, pref, ino)?;
                fresh = true;
                self.iget(st, ino)?.d.blocks += 1;
                put_u64(&mut ib.write_range((idx * 8) as usize, 8), 0, next);
                self.cache.mark_dirty(&ib);
                if !changed.iter().any(|b: &BufRef| b.blkno() == ib.blkno()) {
                    changed.push(ib);
                }
                if depth + 1 < level {
                    let nb = self.bnew(next, kind::INDIRECT);
                    self.cache.mark_dirty(&nb);
                    self.init_indirect(&nb)?;
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
    fn init_indirect(&self, b: &BufRef) -> Result<()> {
        let g = self.group_bufs(self.geo.group_of_block(b.blkno()), false)?;
        self.strategy.setup_block_init(&self.io, &[b, &g[0], &g[1]])
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
        if !self.geo.is_data_block(blk) {
            return Err(corrupt_err(format!("indirect pointer {blk} out of range")));
        }
        out.push(blk);
        let b = self.bread(blk, kind::INDIRECT)?;
        let ptrs: Vec<u64> = {
            let data = b.read();
            (0..self.geo.ptrs_per_block() as usize)
                .map(|i| get_u64(&data, i * 8))
                .filter(|&p| p != 0)
                .collect()
        };
        for p in ptrs {
            if level == 1 {
                if !self.geo.is_data_block(p) {
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
        let ppb = self.geo.ptrs_per_block();
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
        if !self.geo.is_data_block(old) {
            return Err(corrupt_err(format!(
                "indirect block {cur}: pointer {old} out of range"
            )));
        }
        put_u64(&mut b.write_range(off, 8), 0, 0);
        self.cache.mark_dirty(&b);
        Ok(Some((old, Some(b))))
    }

    /// Frees every block of `ino` at logical block `from` and beyond (and indirect blocks
    /// left empty). Pointers are cleared first and written through `setup_freeblocks`; the
    /// bitmap is released only afterwards (rule 2).
    pub(crate) fn truncate_blocks(&self, st: &mut State, ino: u64, from: u64) -> Result<()> {
        let ppb = self.geo.ptrs_per_block();
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
            self.free_block(st, b)?;
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
        if !self.geo.is_data_block(blk) {
            return Err(corrupt_err(format!("indirect pointer {blk} out of range")));
        }
        let ppb = self.geo.ptrs_per_block();
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
                if !self.geo.is_data_block(p) {
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
            self.cache.mark_dirty(&b);
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

    #[test]
    fn time_roundtrip() {
        for ns in [0i64, 1, 1_700_000_000_123_456_789, -5_000_000_001] {
            assert_eq!(time_to_ns(ns_to_time(ns)), ns);
        }
    }
}
