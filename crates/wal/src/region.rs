//! Where the log lives on its device, and the LSN → device-block mapping.

use std::io;

use cairn_blockdev::BlockDevice;

use crate::error::WalError;
use crate::format::{MIN_DATA_BLOCKS, SB_BLOCKS};

/// A run of blocks of a device that holds a log: the whole device (`Region::whole`), or a
/// reserved area of another device (a file system's preallocated log area, LFFS-file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Region {
    /// The region's first block, in the device's blocks.
    pub first_block: u64,
    /// Blocks in the region, the two superblock blocks included.
    pub blocks: u64,
}

impl Region {
    /// The whole device.
    pub fn whole(dev: &dyn BlockDevice) -> Region {
        Region {
            first_block: 0,
            blocks: dev.num_blocks(),
        }
    }

    /// The smallest region a log fits in.
    pub const MIN_BLOCKS: u64 = SB_BLOCKS + MIN_DATA_BLOCKS;
}

/// The log's geometry on its device: the mapping every read and write goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub bs: u64,
    pub region: Region,
    /// Bytes of the data area.
    pub capacity: u64,
}

impl Geometry {
    /// Checks that `region` lies on `dev` and can hold a log.
    pub fn new(dev: &dyn BlockDevice, region: Region) -> Result<Geometry, WalError> {
        let bs = u64::from(dev.block_size());
        let end = region.first_block.checked_add(region.blocks);
        if end.is_none_or(|e| e > dev.num_blocks()) {
            return Err(WalError::Region(format!(
                "blocks {}..+{} do not lie on a device of {} blocks",
                region.first_block,
                region.blocks,
                dev.num_blocks()
            )));
        }
        if region.blocks < Region::MIN_BLOCKS {
            return Err(WalError::TooSmall {
                bytes: region.blocks * bs,
                min: Region::MIN_BLOCKS * bs,
            });
        }
        let capacity = (region.blocks - SB_BLOCKS)
            .checked_mul(bs)
            .filter(|&c| c <= 1 << 60)
            .ok_or_else(|| WalError::Region(format!("{} blocks is too large", region.blocks)))?;
        Ok(Geometry {
            bs,
            region,
            capacity,
        })
    }

    /// The device block holding superblock copy `copy` (0 or 1).
    pub fn sb_block(&self, copy: u64) -> u64 {
        self.region.first_block + copy
    }

    pub fn down(&self, lsn: u64) -> u64 {
        lsn - lsn % self.bs
    }

    pub fn up(&self, lsn: u64) -> u64 {
        lsn.next_multiple_of(self.bs)
    }

    /// Bytes of the data area that the live log `[checkpoint, end)` makes unavailable: the
    /// log is written in whole blocks, so the checkpoint's block and the tail block count
    /// whole (the tail block is rewritten, the checkpoint's block must not be).
    pub fn span(&self, checkpoint: u64, end: u64) -> u64 {
        self.up(end) - self.down(checkpoint)
    }

    /// The device pieces of the LSN range `[lsn, lsn + len)`, which must start on a block
    /// boundary and span whole blocks, at most one lap: `(device block, bytes)`, two pieces
    /// when the range crosses the end of the data area.
    pub fn pieces(&self, lsn: u64, len: u64) -> [(u64, u64); 2] {
        let len = len.min(self.capacity);
        let off = lsn % self.capacity;
        let first = len.min(self.capacity - off);
        let data0 = self.region.first_block + SB_BLOCKS;
        [(data0 + off / self.bs, first), (data0, len - first)]
    }

    /// Reads the LSN range `[lsn, lsn + len)` (any alignment, at most one lap) from `dev`.
    pub fn read(&self, dev: &dyn BlockDevice, lsn: u64, len: u64) -> io::Result<Vec<u8>> {
        let start = self.down(lsn);
        let end = self.up(lsn.saturating_add(len));
        if end - start > self.capacity {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a read of {len} bytes at LSN {lsn} is longer than the log"),
            ));
        }
        let mut buf = vec![0u8; (end - start) as usize];
        let mut at = 0usize;
        for (block, bytes) in self.pieces(start, end - start) {
            if bytes == 0 {
                continue;
            }
            dev.read_blocks(block, &mut buf[at..at + bytes as usize])?;
            at += bytes as usize;
        }
        let skip = (lsn - start) as usize;
        buf.drain(..skip);
        buf.truncate(len as usize);
        Ok(buf)
    }

    /// Writes whole blocks `data` at the block-aligned LSN `lsn`; returns the device writes
    /// issued.
    pub fn write(&self, dev: &dyn BlockDevice, lsn: u64, data: &[u8]) -> io::Result<u64> {
        let len = data.len() as u64;
        if len > self.capacity || !lsn.is_multiple_of(self.bs) || !len.is_multiple_of(self.bs) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a write of {len} bytes at LSN {lsn} is not whole blocks within one lap"),
            ));
        }
        let mut at = 0usize;
        let mut writes = 0;
        for (block, bytes) in self.pieces(lsn, data.len() as u64) {
            if bytes == 0 {
                continue;
            }
            dev.write_blocks(block, &data[at..at + bytes as usize])?;
            at += bytes as usize;
            writes += 1;
        }
        Ok(writes)
    }
}

/// A read-ahead window over the data area, for sequential scans (recovery, `cairn wal dump`):
/// one device read per [`Window::CHUNK`] bytes instead of two per record.
pub(crate) struct Window<'a> {
    dev: &'a dyn BlockDevice,
    geo: Geometry,
    start: u64,
    data: Vec<u8>,
}

impl<'a> Window<'a> {
    const CHUNK: u64 = 256 << 10;

    pub fn new(dev: &'a dyn BlockDevice, geo: Geometry) -> Window<'a> {
        Window {
            dev,
            geo,
            start: 0,
            data: Vec::new(),
        }
    }

    /// The bytes `[lsn, lsn + len)` (`len` at most the capacity).
    pub fn get(&mut self, lsn: u64, len: u64) -> io::Result<&[u8]> {
        let have = lsn >= self.start && lsn + len <= self.start + self.data.len() as u64;
        if !have {
            let start = self.geo.down(lsn);
            let want = self.geo.up(lsn + len).max(start + Self::CHUNK);
            let want = want.min(start + self.geo.capacity) - start;
            if lsn + len > start + want {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a read of {len} bytes at LSN {lsn} is longer than the log"),
                ));
            }
            self.data = self.geo.read(self.dev, start, want)?;
            self.start = start;
        }
        let off = (lsn - self.start) as usize;
        Ok(&self.data[off..off + len as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_blockdev::MemDevice;

    #[test]
    fn regions_must_lie_on_the_device_and_hold_a_log() {
        let d = MemDevice::new(512, 100);
        assert!(matches!(
            Geometry::new(
                &d,
                Region {
                    first_block: 90,
                    blocks: 11
                }
            ),
            Err(WalError::Region(_))
        ));
        assert!(matches!(
            Geometry::new(
                &d,
                Region {
                    first_block: u64::MAX,
                    blocks: 11
                }
            ),
            Err(WalError::Region(_))
        ));
        assert!(matches!(
            Geometry::new(
                &d,
                Region {
                    first_block: 0,
                    blocks: 9
                }
            ),
            Err(WalError::TooSmall { .. })
        ));
        let g = Geometry::new(
            &d,
            Region {
                first_block: 10,
                blocks: 12,
            },
        )
        .unwrap();
        assert_eq!(g.capacity, 10 * 512);
        assert_eq!(g.sb_block(1), 11);
    }

    #[test]
    fn pieces_split_at_the_wrap_point() {
        let d = MemDevice::new(512, 100);
        let g = Geometry::new(
            &d,
            Region {
                first_block: 10,
                blocks: 12,
            },
        )
        .unwrap();
        let c = g.capacity;
        // Data area = device blocks 12..22.
        assert_eq!(g.pieces(c, 1024), [(12, 1024), (12, 0)]);
        assert_eq!(g.pieces(c + 9 * 512, 1024), [(21, 512), (12, 512)]);
        assert_eq!(g.pieces(3 * c + 512, c), [(13, c - 512), (12, 512)]);
    }

    #[test]
    fn reads_and_writes_wrap_and_window_reads_ahead() {
        let d = MemDevice::new(512, 12);
        let g = Geometry::new(&d, Region::whole(&d)).unwrap();
        let c = g.capacity;
        let data: Vec<u8> = (0..1536).map(|i| (i % 251) as u8).collect();
        assert_eq!(g.write(&d, 2 * c + 9 * 512, &data).unwrap(), 2);
        assert_eq!(
            g.read(&d, 2 * c + 9 * 512 + 7, 1000).unwrap(),
            &data[7..1007]
        );
        let mut w = Window::new(&d, g);
        assert_eq!(w.get(2 * c + 9 * 512 + 500, 30).unwrap(), &data[500..530]);
        let reads = d.counters().snapshot().reads;
        assert_eq!(w.get(2 * c + 9 * 512 + 530, 600).unwrap(), &data[530..1130]);
        assert_eq!(
            d.counters().snapshot().reads,
            reads,
            "served from the window"
        );
    }
}
