//! The allocator: inode and block bitmaps, group summaries and free counts, FFS style
//! (McKusick et al., "A Fast File System for UNIX"): a file's inode goes in its directory's
//! group, a new directory goes to a group with above-average free inodes and the fewest
//! directories (spreading the tree), and a file's blocks follow the previous block of the
//! file so reads are sequential.
//!
//! The allocator owns the group summaries (`GroupDesc`, one per group, mirrored in the
//! group's descriptor block) and the file system's free counts. Invariant, at every
//! operation boundary: each summary equals its descriptor buffer and the free counts are
//! the sums of the summaries (`Allocator::check`). Inside an undo scope it saves each
//! summary on its first change and the free counts at the start, so a failed operation's
//! rollback restores them together with the bitmap and descriptor buffers (see `undo`).
//!
//! **Held blocks.** A strategy may free blocks whose next use must wait (a journal: until
//! the log records of the free are durable, since the block's next contents — data, never
//! logged — must not land while the free could still be lost): their bits are cleared and
//! counted free at once, in the call that frees them, but `alloc_block` skips them until
//! their [`Hold`] opens (jbd2 keeps such blocks out of ext4's in-memory buddy bitmaps the
//! same way until the commit). `reserve` does not count them, so a call that needs them
//! fails with ENOSPC before it changes anything, and the engine makes the mode's pending
//! frees (`Strategy::has_pending_frees`) and runs it again.
//!
//! **The write-back reserve.** The kernel may hold dirty pages of shared mappings it has
//! already told a program were written; their write-back must find room. So every
//! allocation but one made for such a write-back (`dip_into_reserve`, set for the length
//! of `FileSystem::write_back`) leaves `writeback_reserve` blocks free: the call that
//! asks for the last of the room fails with ENOSPC before it changes anything, and `df`
//! does not count the reserve as available (docs/DESIGN.md, "A full disk").

use std::collections::{HashMap, VecDeque};

use cairn_bufcache::BufRef;
use cairn_vfs::{Errno, FsError, Result};

use crate::corrupt_err;
use crate::format::{GroupDesc, bitmap, kind, superblock};
use crate::strategy::Hold;
use crate::volume::Volume;

/// Sets bit `i` of a bitmap block, saving (in an undo scope) only the byte it changes.
fn set_bit(b: &BufRef, i: usize, v: bool) {
    bitmap::set(&mut b.write_range(i / 8, 1), i % 8, v);
}

/// Where an allocation was recorded: the group's descriptor block and the bitmap block
/// holding its bit (FreeBSD's `bmsafemap` is keyed by the same cylinder-group buffer).
pub(crate) struct Groups {
    pub desc: BufRef,
    pub bitmap: BufRef,
}

pub(crate) struct Allocator {
    groups: Vec<GroupDesc>,
    free_blocks: u64,
    free_inodes: u64,
    held: Held,
    undo: AllocUndo,
    /// Blocks that only a write-back of already-accepted pages may take (module
    /// documentation, "The write-back reserve").
    writeback_reserve: u64,
    /// Set for the length of such a write-back.
    pub dip_into_reserve: bool,
}

/// Freed blocks not to be handed out yet (module documentation, "Held blocks"). Each block
/// is in at most one hold: it cannot be allocated, hence not freed again, while held.
#[derive(Default)]
struct Held {
    /// In the order they were made; a hold is released once it and every hold before it
    /// are open (strategies open them in that order: a journal's log is forced in order).
    queue: VecDeque<(Hold, Vec<(u64, usize)>)>,
    /// Per group, a bitmap of its held blocks (bit = block - group start, as in the
    /// group's block bitmap) and their number.
    groups: HashMap<u64, (Vec<u8>, u32)>,
    /// Blocks held in all.
    count: u64,
    /// Bytes of a group's bitmap (the block size).
    map_bytes: usize,
}

impl Held {
    /// Marks (`on`) or unmarks the blocks `at` (group, bit in the group) as held.
    fn mark(&mut self, at: &[(u64, usize)], on: bool) {
        for &(g, bit) in at {
            let bytes = self.map_bytes;
            let (map, n) = match self.groups.get_mut(&g) {
                Some(e) => e,
                // Nothing held in the group: nothing to unmark.
                None if !on => continue,
                None => self.groups.entry(g).or_insert_with(|| (vec![0; bytes], 0)),
            };
            if bit / 8 >= map.len() || bitmap::get(map, bit) == on {
                continue;
            }
            bitmap::set(map, bit, on);
            if on {
                *n += 1;
                self.count += 1;
            } else {
                *n -= 1;
                self.count -= 1;
                if *n == 0 {
                    self.groups.remove(&g);
                }
            }
        }
    }

    /// Lets go of the holds that are open, oldest first.
    fn settle(&mut self) {
        while self.queue.front().is_some_and(|(h, _)| h.is_open()) {
            if let Some((_, at)) = self.queue.pop_front() {
                self.mark(&at, false);
            }
        }
    }
}

/// The allocator's half of an open undo scope.
#[derive(Default)]
struct AllocUndo {
    active: bool,
    /// Every summary changed in the scope, as it was before.
    groups: Vec<(usize, GroupDesc)>,
    free_blocks: u64,
    free_inodes: u64,
    /// Holds made in the scope (the newest ones): a failed call's frees are taken back, so
    /// are their holds.
    holds: usize,
}

impl Allocator {
    /// The allocator of a mounted file system whose summaries were read from the
    /// descriptor blocks.
    pub fn new(groups: Vec<GroupDesc>) -> Allocator {
        let free_blocks = groups.iter().map(|g| g.free_blocks as u64).sum();
        let free_inodes = groups.iter().map(|g| g.free_inodes as u64).sum();
        Allocator {
            groups,
            free_blocks,
            free_inodes,
            held: Held::default(),
            undo: AllocUndo::default(),
            writeback_reserve: 0,
            dip_into_reserve: false,
        }
    }

    /// Keeps `blocks`, just freed (`free_block`), from being handed out until `until` opens.
    pub fn hold(&mut self, vol: &Volume, blocks: Vec<u64>, until: Hold) {
        if until.is_open() || blocks.is_empty() {
            return;
        }
        let at: Vec<(u64, usize)> = blocks
            .iter()
            .map(|&b| {
                let g = vol.geo.group_of_block(b);
                (g, (b - vol.geo.group_start(g)) as usize)
            })
            .collect();
        self.held.map_bytes = vol.geo.block_size as usize;
        self.held.mark(&at, true);
        self.held.queue.push_back((until, at));
        if self.undo.active {
            self.undo.holds += 1;
        }
    }

    /// Blocks freed but held from reuse (counted in `free_blocks`).
    #[cfg(test)]
    pub fn held_blocks(&self) -> u64 {
        self.held.count
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    pub fn free_inodes(&self) -> u64 {
        self.free_inodes
    }

    /// Directories in the file system (the superblock's summary).
    pub fn dirs(&self) -> u64 {
        self.groups.iter().map(|g| g.dirs as u64).sum()
    }

    /// Refuses with ENOSPC, before anything changes, an operation that needs `inodes`
    /// inodes and `blocks` blocks when fewer are free (the preflight that keeps the common
    /// ENOSPC from ever being hit halfway). The summaries are trusted here; should they be
    /// wrong, the allocator still fails cleanly and the undo takes the operation back.
    /// Held blocks are not counted: they cannot be handed out yet.
    pub fn reserve(&mut self, inodes: u64, blocks: u64) -> Result<()> {
        let usable = self.usable_blocks();
        if self.free_inodes < inodes || usable < blocks {
            return Err(Errno::ENOSPC.into());
        }
        Ok(())
    }

    /// Free blocks the current call may take: not the held ones (holds that have opened
    /// are released first), nor the write-back reserve unless the call is a write-back.
    pub fn usable_blocks(&mut self) -> u64 {
        self.held.settle();
        let free = self.free_blocks.saturating_sub(self.held.count);
        if self.dip_into_reserve {
            free
        } else {
            free.saturating_sub(self.writeback_reserve)
        }
    }

    /// Sets the write-back reserve (blocks).
    pub fn set_writeback_reserve(&mut self, blocks: u64) {
        self.writeback_reserve = blocks;
    }

    pub fn writeback_reserve(&self) -> u64 {
        self.writeback_reserve
    }

    /// Group `g`'s summary, for changing it: saved first if an undo scope is open.
    fn group_mut(&mut self, g: u64) -> &mut GroupDesc {
        let g = g as usize;
        if self.undo.active && !self.undo.groups.iter().any(|(i, _)| *i == g) {
            self.undo.groups.push((g, self.groups[g].clone()));
        }
        &mut self.groups[g]
    }

    /// The group descriptor and one bitmap of group `g`.
    pub fn group_bufs(&self, vol: &Volume, g: u64, inode_map: bool) -> Result<Groups> {
        let desc = vol.bread(vol.geo.desc_block(g), kind::GROUP)?;
        let m = if inode_map {
            vol.geo.inode_bitmap(g)
        } else {
            vol.geo.block_bitmap(g)
        };
        Ok(Groups {
            desc,
            bitmap: vol.bread(m, kind::GROUP)?,
        })
    }

    fn store_desc(&self, vol: &Volume, g: u64) -> Result<BufRef> {
        let b = vol.bread(vol.geo.desc_block(g), kind::GROUP)?;
        self.groups[g as usize].encode(&mut b.write_range(0, superblock::SB_BYTES));
        vol.cache.mark_dirty(&b);
        Ok(b)
    }

    /// Allocates an inode near `parent` (or spread out, for a directory). Returns the inode
    /// number, its previous generation and the group buffers changed.
    ///
    /// An inode whose bit is clear but whose table slot is in use (a crash left the inode
    /// written but not its bitmap, and no fsck ran) is skipped and its bit set: reusing it
    /// could hand out an inode some directory still names. fsck reclaims it if it is a leak.
    pub fn alloc_inode(
        &mut self,
        vol: &Volume,
        parent: u64,
        dir: bool,
    ) -> Result<(u64, u32, Groups)> {
        let n = vol.geo.group_count;
        let pg = vol.geo.group_of_ino(parent).min(n - 1);
        let start = if dir {
            let total_free: u64 = self.groups.iter().map(|g| g.free_inodes as u64).sum();
            let avg = total_free / n;
            (0..n)
                .map(|i| (pg + i) % n)
                .filter(|&g| self.groups[g as usize].free_inodes as u64 >= avg.max(1))
                .min_by_key(|&g| self.groups[g as usize].dirs)
                .unwrap_or(pg)
        } else {
            pg
        };
        for i in 0..n {
            let g = (start + i) % n;
            let ipg = vol.geo.inodes_per_group as usize;
            while self.groups[g as usize].free_inodes > 0 {
                let bufs = self.group_bufs(vol, g, true)?;
                let Some(idx) = bitmap::find_clear(&bufs.bitmap.read(), 0, ipg) else {
                    // The summary said free but the bitmap is full: trust the bitmap.
                    self.group_mut(g).free_inodes = 0;
                    break;
                };
                set_bit(&bufs.bitmap, idx, true);
                vol.cache.mark_dirty(&bufs.bitmap);
                self.group_mut(g).free_inodes -= 1;
                self.free_inodes = self.free_inodes.saturating_sub(1);
                let ino = g * vol.geo.inodes_per_group + idx as u64;
                let old = if ino < crate::format::ROOT_INO {
                    None
                } else {
                    match vol.read_disk_inode(ino) {
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
                            self.group_mut(g).dirs += 1;
                        }
                        self.store_desc(vol, g)?;
                        return Ok((ino, old.generation, bufs));
                    }
                    _ => {
                        log::warn!(
                            "inode {ino} is marked free but its slot is in use or unreadable: skipped (run cairn fsck)"
                        );
                        self.store_desc(vol, g)?;
                    }
                }
            }
        }
        Err(Errno::ENOSPC.into())
    }

    /// Clears inode `ino`'s bit (the inode was freed; `dir`: it was a directory).
    pub fn free_inode(&mut self, vol: &Volume, ino: u64, dir: bool) -> Result<Groups> {
        let g = vol.geo.group_of_ino(ino);
        let bufs = self.group_bufs(vol, g, true)?;
        let idx = (ino % vol.geo.inodes_per_group) as usize;
        if !bitmap::get(&bufs.bitmap.read(), idx) {
            return Err(corrupt_err(format!(
                "freeing inode {ino} that is not allocated"
            )));
        }
        set_bit(&bufs.bitmap, idx, false);
        vol.cache.mark_dirty(&bufs.bitmap);
        let gd = self.group_mut(g);
        gd.free_inodes += 1;
        if dir {
            gd.dirs = gd.dirs.saturating_sub(1);
        }
        self.free_inodes += 1;
        self.store_desc(vol, g)?;
        Ok(bufs)
    }

    /// Allocates a block as close after `pref` as possible (`pref` 0: the group of `ino`),
    /// never a held one. Returns the block and the group buffers that recorded it.
    pub fn alloc_block(&mut self, vol: &Volume, pref: u64, ino: u64) -> Result<(u64, Groups)> {
        if self.usable_blocks() == 0 {
            return Err(Errno::ENOSPC.into());
        }
        let n = vol.geo.group_count;
        let (pg, pbit) = if pref != 0 && pref < vol.geo.total_blocks {
            let g = vol.geo.group_of_block(pref);
            (g, pref - vol.geo.group_start(g))
        } else {
            let g = vol.geo.group_of_ino(ino).min(n - 1);
            (g, vol.geo.meta_blocks())
        };
        for i in 0..n {
            let g = (pg + i) % n;
            if self.groups[g as usize].free_blocks == 0 {
                continue;
            }
            let len = vol.geo.group_len(g) as usize;
            let from = if i == 0 {
                pbit as usize
            } else {
                vol.geo.meta_blocks() as usize
            };
            let b = vol.bread(vol.geo.block_bitmap(g), kind::GROUP)?;
            let found = match self.held.groups.get(&g) {
                None => bitmap::find_clear(&b.read(), from, len),
                // The group's bitmap with its held blocks marked used (one pass over a
                // block: cheap beside a search that would skip them one by one).
                Some((mask, _)) => {
                    let mut m = b.read().to_vec();
                    m.iter_mut().zip(mask).for_each(|(x, h)| *x |= h);
                    bitmap::find_clear(&m, from, len)
                }
            };
            let Some(bit) = found else {
                // Nothing usable: the summary is right when only held blocks are free
                // (they come back once their hold opens); otherwise trust the bitmap.
                if !self.held.groups.contains_key(&g) {
                    self.group_mut(g).free_blocks = 0;
                }
                continue;
            };
            set_bit(&b, bit, true);
            vol.cache.mark_dirty(&b);
            self.group_mut(g).free_blocks -= 1;
            self.free_blocks = self.free_blocks.saturating_sub(1);
            let desc = self.store_desc(vol, g)?;
            let blk = vol.geo.group_start(g) + bit as u64;
            if !vol.geo.is_data_block(blk) {
                return Err(corrupt_err(format!(
                    "group {g}: bitmap shows metadata block {blk} free"
                )));
            }
            return Ok((blk, Groups { desc, bitmap: b }));
        }
        Err(Errno::ENOSPC.into())
    }

    /// Clears block `blk`'s bit. Its cached buffer is dropped first: a freed block's
    /// contents must never be written over its next owner.
    pub fn free_block(&mut self, vol: &Volume, blk: u64) -> Result<Groups> {
        if !vol.geo.is_data_block(blk) {
            return Err(corrupt_err(format!(
                "freeing block {blk} outside the data area"
            )));
        }
        let g = vol.geo.group_of_block(blk);
        let b = vol.bread(vol.geo.block_bitmap(g), kind::GROUP)?;
        let bit = (blk - vol.geo.group_start(g)) as usize;
        if !bitmap::get(&b.read(), bit) {
            return Err(corrupt_err(format!(
                "freeing block {blk} that is already free"
            )));
        }
        set_bit(&b, bit, false);
        vol.cache.mark_dirty(&b);
        vol.cache.invalidate(blk);
        self.group_mut(g).free_blocks += 1;
        self.free_blocks += 1;
        let desc = self.store_desc(vol, g)?;
        Ok(Groups { desc, bitmap: b })
    }

    /// Group `g`'s summary as it is (free blocks, free inodes, directories).
    pub fn summary(&self, g: u64) -> (u32, u32, u32) {
        let d = &self.groups[g as usize];
        (d.free_blocks, d.free_inodes, d.dirs)
    }

    /// Sets group `g`'s summary to counts a background check recounted from the bitmaps
    /// and inodes (a crash can leave a descriptor that disagrees with its bitmap: a leak,
    /// 002 §4), keeping the file system's totals the sums of the groups.
    pub fn set_summary(
        &mut self,
        vol: &Volume,
        g: u64,
        (free_blocks, free_inodes, dirs): (u32, u32, u32),
    ) -> Result<()> {
        let old = self.summary(g);
        let gd = self.group_mut(g);
        gd.free_blocks = free_blocks;
        gd.free_inodes = free_inodes;
        gd.dirs = dirs;
        self.free_blocks = (self.free_blocks + free_blocks as u64).saturating_sub(old.0 as u64);
        self.free_inodes = (self.free_inodes + free_inodes as u64).saturating_sub(old.1 as u64);
        self.store_desc(vol, g)?;
        Ok(())
    }

    // ---- undo ------------------------------------------------------------------------

    pub fn begin_undo(&mut self) {
        self.undo.active = true;
        self.undo.groups.clear();
        self.undo.free_blocks = self.free_blocks;
        self.undo.free_inodes = self.free_inodes;
        self.undo.holds = 0;
    }

    pub fn commit_undo(&mut self) {
        self.undo.active = false;
        self.undo.groups.clear();
        self.undo.holds = 0;
    }

    /// Puts every summary and the free counts back as they were when the scope began.
    pub fn rollback_undo(&mut self) {
        self.undo.active = false;
        for (g, d) in std::mem::take(&mut self.undo.groups).into_iter().rev() {
            self.groups[g] = d;
        }
        self.free_blocks = self.undo.free_blocks;
        self.free_inodes = self.undo.free_inodes;
        // The scope's holds are the newest (a hold made in a call cannot open before the
        // call ends, so none of them was settled): their blocks are allocated again.
        for _ in 0..std::mem::take(&mut self.undo.holds) {
            if let Some((_, at)) = self.held.queue.pop_back() {
                self.held.mark(&at, false);
            }
        }
    }

    /// The invariant (module documentation): every summary equals its descriptor buffer
    /// and the free counts are their sums. Returns the first disagreement.
    pub fn check(&self, vol: &Volume) -> std::result::Result<(), String> {
        let (mut fb, mut fi) = (0u64, 0u64);
        for g in 0..vol.geo.group_count {
            let b = vol
                .bread(vol.geo.desc_block(g), kind::GROUP)
                .map_err(|e| e.to_string())?;
            let d = GroupDesc::decode(&b.read(), g).map_err(|x| x.0)?;
            if d != self.groups[g as usize] {
                return Err(format!(
                    "group {g}: in core {:?}, buffer {d:?}",
                    self.groups[g as usize]
                ));
            }
            fb += d.free_blocks as u64;
            fi += d.free_inodes as u64;
        }
        if (fb, fi) != (self.free_blocks, self.free_inodes) {
            return Err(format!(
                "free counts in core ({}, {}), sum of the groups ({fb}, {fi})",
                self.free_blocks, self.free_inodes
            ));
        }
        Ok(())
    }
}
