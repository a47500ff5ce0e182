//! The superblock (block 0): static configuration only — the geometry of segments and the
//! two checkpoint regions (004 Table I: "holds static configuration information such as
//! number of segments and segment size"). Written once by mkfs, never by a mount, so it
//! needs no crash protection beyond its checksum.
//!
//! ```text
//!   0  magic           [u8; 8]  "CAIRNLFS"
//!   8  version         u32      2 (1: summaries checked by a CRC, read-only; see below)
//!  12  block_size      u32      4096
//!  16  total_blocks    u64      blocks of the device used by the file system
//!  24  segment_blocks  u32      blocks per segment (128 = 512 KiB)
//!  28  segments        u32      number of segments
//!  32  first_segment   u64      block of segment 0
//!  40  cp_blocks       u32      blocks per checkpoint region
//!  44  max_inodes      u32      inode numbers 1..max_inodes exist
//!  48  imap_blocks     u32      blocks of the inode map
//!  52  usage_blocks    u32      blocks of the segment usage table
//!  56  created         u64      mkfs time, seconds since the epoch
//!  64  label           [u8; 48] NUL-padded UTF-8
//! 112  reserved        [u8; 12] zero
//! 124  crc             u32      CRC32C of bytes 0..124
//! 128..4096                     zero
//! ```
//! Checkpoint region 0 starts at block 1, region 1 at block `1 + cp_blocks`.
//!
//! **Versions.** 2: every segment summary the file system writes carries the hash of its
//! blocks (`summary::FLAG_HASH`), and roll-forward accepts no other. 1 (images made before
//! 2026-11-27): summaries checked by a CRC32C that a stale inode block passes, so such an
//! image is mounted read-only only; `cairn fsck -y` upgrades it (a read-write mount that
//! rolls forward and checkpoints, then this block rewritten with version 2: the version and
//! the checksum are in its first sector, which lands whole).

use super::*;

pub const MAGIC: &[u8; 8] = b"CAIRNLFS";
/// The version mkfs writes.
pub const VERSION: u32 = 2;
/// The oldest version this build reads (read-only: see the module documentation).
pub const OLDEST_VERSION: u32 = 1;
/// Bytes `probe` needs.
pub const SB_BYTES: usize = 128;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// [`VERSION`], or an older one this build reads ([`OLDEST_VERSION`]..).
    pub version: u32,
    pub total_blocks: u64,
    pub segment_blocks: u32,
    pub segments: u32,
    pub first_segment: u64,
    pub cp_blocks: u32,
    pub max_inodes: u32,
    pub imap_blocks: u32,
    pub usage_blocks: u32,
    pub created: u64,
    pub label: String,
}

/// Whether `head` starts with the LFS magic (the registry's probe).
pub fn has_magic(head: &[u8]) -> bool {
    head.len() >= 8 && &head[..8] == MAGIC
}

impl Superblock {
    /// The first block of checkpoint region `slot` (0 or 1).
    pub fn cp_start(&self, slot: usize) -> u64 {
        1 + slot as u64 * self.cp_blocks as u64
    }

    /// The first block of segment `seg`.
    pub fn seg_start(&self, seg: u32) -> u64 {
        self.first_segment + seg as u64 * self.segment_blocks as u64
    }

    /// The segment holding block `addr`, if it is in the log area.
    pub fn seg_of(&self, addr: u64) -> Option<u32> {
        if addr < self.first_segment {
            return None;
        }
        let s = (addr - self.first_segment) / self.segment_blocks as u64;
        (s < self.segments as u64).then_some(s as u32)
    }

    /// Whether `addr` is a block inside some segment (a valid log address).
    pub fn in_log(&self, addr: u64) -> bool {
        self.seg_of(addr).is_some()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE];
        b[0..8].copy_from_slice(MAGIC);
        put_u32(&mut b, 8, self.version);
        put_u32(&mut b, 12, BLOCK_SIZE as u32);
        put_u64(&mut b, 16, self.total_blocks);
        put_u32(&mut b, 24, self.segment_blocks);
        put_u32(&mut b, 28, self.segments);
        put_u64(&mut b, 32, self.first_segment);
        put_u32(&mut b, 40, self.cp_blocks);
        put_u32(&mut b, 44, self.max_inodes);
        put_u32(&mut b, 48, self.imap_blocks);
        put_u32(&mut b, 52, self.usage_blocks);
        put_u64(&mut b, 56, self.created);
        let l = self.label.as_bytes();
        let n = l.len().min(48);
        b[64..64 + n].copy_from_slice(&l[..n]);
        let c = crc(&b[..124]);
        put_u32(&mut b, 124, c);
        b
    }

    /// Decodes and validates a superblock: magic, version, checksum and a geometry that
    /// fits the device (`device_blocks`), so later address arithmetic cannot overflow.
    pub fn decode(b: &[u8], device_blocks: u64) -> FResult<Superblock> {
        if !has_magic(b) {
            return corrupt("not an LFS image (no CAIRNLFS magic in block 0)");
        }
        need(b, SB_BYTES, "LFS superblock")?;
        let version = get_u32(b, 8);
        if !(OLDEST_VERSION..=VERSION).contains(&version) {
            return corrupt(format!(
                "LFS format version {version} (this cairn reads versions {OLDEST_VERSION} to {VERSION}: a newer cairn made it)"
            ));
        }
        if get_u32(b, 124) != crc(&b[..124]) {
            return corrupt("LFS superblock checksum mismatch");
        }
        let bs = get_u32(b, 12);
        if bs as usize != BLOCK_SIZE {
            return corrupt(format!(
                "LFS block size {bs} (the format uses {BLOCK_SIZE})"
            ));
        }
        let label_raw = &b[64..112];
        let end = label_raw.iter().position(|&c| c == 0).unwrap_or(48);
        let sb = Superblock {
            version,
            total_blocks: get_u64(b, 16),
            segment_blocks: get_u32(b, 24),
            segments: get_u32(b, 28),
            first_segment: get_u64(b, 32),
            cp_blocks: get_u32(b, 40),
            max_inodes: get_u32(b, 44),
            imap_blocks: get_u32(b, 48),
            usage_blocks: get_u32(b, 52),
            created: get_u64(b, 56),
            label: String::from_utf8_lossy(&label_raw[..end]).into_owned(),
        };
        sb.validate(device_blocks)?;
        Ok(sb)
    }

    /// The geometry rules (also what mkfs must produce).
    pub fn validate(&self, device_blocks: u64) -> FResult<()> {
        if !(8..=1024).contains(&self.segment_blocks) {
            return corrupt(format!(
                "segment of {} blocks (8..=1024 allowed)",
                self.segment_blocks
            ));
        }
        if self.segments < 4 {
            return corrupt(format!("{} segments (at least 4)", self.segments));
        }
        if self.max_inodes < 16 || self.imap_blocks != tables::imap_blocks_for(self.max_inodes) {
            return corrupt(format!(
                "{} inodes in {} inode-map blocks",
                self.max_inodes, self.imap_blocks
            ));
        }
        if self.usage_blocks != tables::usage_blocks_for(self.segments) {
            return corrupt(format!(
                "{} segments in {} usage-table blocks",
                self.segments, self.usage_blocks
            ));
        }
        if self.cp_blocks != checkpoint::region_blocks(self.imap_blocks, self.usage_blocks) {
            return corrupt(format!(
                "checkpoint region of {} blocks does not fit the tables",
                self.cp_blocks
            ));
        }
        if self.first_segment != 1 + 2 * self.cp_blocks as u64 {
            return corrupt(format!("segment 0 at block {}", self.first_segment));
        }
        let end = self
            .first_segment
            .checked_add(self.segments as u64 * self.segment_blocks as u64);
        match end {
            Some(e) if e <= self.total_blocks && self.total_blocks <= device_blocks => Ok(()),
            _ => corrupt(format!(
                "{} segments of {} blocks do not fit {} blocks (device {})",
                self.segments, self.segment_blocks, self.total_blocks, device_blocks
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Superblock {
        let imap_blocks = tables::imap_blocks_for(1000);
        let usage_blocks = tables::usage_blocks_for(10);
        let cp_blocks = checkpoint::region_blocks(imap_blocks, usage_blocks);
        Superblock {
            version: VERSION,
            total_blocks: 1 + 2 * cp_blocks as u64 + 10 * 128,
            segment_blocks: 128,
            segments: 10,
            first_segment: 1 + 2 * cp_blocks as u64,
            cp_blocks,
            max_inodes: 1000,
            imap_blocks,
            usage_blocks,
            created: 7,
            label: "vol".into(),
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let sb = sample();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b, sb.total_blocks).unwrap(), sb);
        // Too small a device.
        assert!(Superblock::decode(&b, sb.total_blocks - 1).is_err());
        // Not LFS at all: the message says so.
        let e = Superblock::decode(&[0u8; 4096], 1 << 20).unwrap_err();
        assert!(e.0.contains("not an LFS image"), "{e}");
        // A flipped bit anywhere in the checked bytes.
        for i in [9, 20, 30, 70, 123] {
            let mut c = b.clone();
            c[i] ^= 1;
            assert!(Superblock::decode(&c, 1 << 30).is_err(), "byte {i}");
        }
        assert!(Superblock::decode(&b[..20], 1 << 30).is_err());
        // Version 1 is read; a version from a newer build is refused, naming it.
        let v1 = Superblock {
            version: 1,
            ..sb.clone()
        };
        assert_eq!(
            Superblock::decode(&v1.encode(), sb.total_blocks).unwrap(),
            v1
        );
        let v3 = Superblock {
            version: 3,
            ..sb.clone()
        };
        let e = Superblock::decode(&v3.encode(), sb.total_blocks).unwrap_err();
        assert!(e.0.contains("version 3") && e.0.contains("newer"), "{e}");
        assert_eq!(sb.seg_of(sb.first_segment + 128), Some(1));
        assert_eq!(sb.seg_of(1), None);
        assert_eq!(sb.seg_of(sb.first_segment + 10 * 128), None);
    }
}
