//! The mounted volume as the engine's types see it: the geometry and the buffer cache, with
//! the block reads every piece needs (each block number checked against the geometry before
//! it is read) and the inode-table codec.

use std::sync::Arc;

use cairn_bufcache::{BufRef, BufferCache};
use cairn_vfs::{Errno, Result};

use crate::corrupt_err;
use crate::format::{DiskInode, Geometry, kind};

/// Inode table blocks read at once on a miss (32 KiB: 128 inodes), aligned within the
/// group's table (`Volume::read_inode_block`).
pub(crate) const INODE_CLUSTER: u64 = 8;

pub(crate) struct Volume {
    pub geo: Geometry,
    pub cache: Arc<BufferCache>,
}

impl Volume {
    /// The buffer of `blk`, tagged `k`. A block beyond the file system is corruption.
    pub fn bread(&self, blk: u64, k: u8) -> Result<BufRef> {
        if blk >= self.geo.total_blocks {
            return Err(corrupt_err(format!(
                "block {blk} beyond the end of the file system"
            )));
        }
        let b = self.cache.read(blk)?;
        b.set_kind(k);
        Ok(b)
    }

    /// A zeroed buffer for a block just allocated (never read from the device).
    pub fn bnew(&self, blk: u64, k: u8) -> BufRef {
        let b = self.cache.get_new(blk);
        b.set_kind(k);
        b
    }

    /// Reads an inode from its table block (no in-core caching).
    pub fn read_disk_inode(&self, ino: u64) -> Result<DiskInode> {
        if !self.geo.valid_ino(ino) {
            return Err(Errno::ENOENT.into());
        }
        let (blk, off) = self.geo.inode_location(ino);
        let b = self.read_inode_block(ino, blk)?;
        let d = DiskInode::decode(ino, &b.read()[off..off + 256]).map_err(|e| corrupt_err(e.0))?;
        Ok(d)
    }

    /// Inode `ino`'s table block `blk`; on a miss, read with the aligned cluster of
    /// [`INODE_CLUSTER`] table blocks around it (within its group's table) in one device
    /// read, as ext4's inode read-ahead and FreeBSD's clustered inode-block reads do. A
    /// workload that touches many cold files (Netnews' unbatch and expire, a `find` over a
    /// tree) otherwise reads one 4 KiB block per 16 inodes, each its own device request.
    /// The cache keeps every block it already holds (a cached block may be newer than the
    /// device) and waits for blocks being written back (`BufferCache::read_around`), so
    /// what it adds is what single reads would have read.
    fn read_inode_block(&self, ino: u64, blk: u64) -> Result<BufRef> {
        let table = self.geo.inode_table(self.geo.group_of_ino(ino));
        let end_of_table = table + self.geo.inode_table_blocks;
        if blk < table || blk >= end_of_table || end_of_table > self.geo.total_blocks {
            return self.bread(blk, kind::INODE);
        }
        let first = table + (blk - table) / INODE_CLUSTER * INODE_CLUSTER;
        let end = (first + INODE_CLUSTER).min(end_of_table);
        let b = self.cache.read_around(blk, first, end - first)?;
        b.set_kind(kind::INODE);
        Ok(b)
    }

    /// Encodes `d` into inode `ino`'s slot and marks the block dirty; returns the block.
    /// Only the slot's 256 bytes are saved in an undo scope.
    /// Encodes `d` into inode `ino`'s slot; the block, and the size the slot held before.
    pub fn write_disk_inode(&self, ino: u64, d: &DiskInode) -> Result<(BufRef, u64)> {
        let (blk, off) = self.geo.inode_location(ino);
        let b = self.bread(blk, kind::INODE)?;
        let was =
            DiskInode::peek_mode_size(b.read().get(off..).unwrap_or(&[])).map_or(0, |(_, s)| s);
        d.encode(ino, &mut b.write_range(off, 256));
        self.cache.mark_dirty(&b);
        Ok((b, was))
    }
}
