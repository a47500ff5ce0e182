//! The segment summary (004 §3.2–3.3): the first block of every partial segment (one log
//! write), naming every block that follows it — which file, which version of the inode
//! number, which logical block — so the cleaner can tell live blocks from dead ones and
//! roll-forward can find what was written after the last checkpoint.
//!
//! ```text
//!   0  magic      u32  "LFSS"
//!   4  crc        u32  CRC32C of this block with this field zero
//!   8  serial     u64  log serial: +1 per partial segment (a stale summary left in a
//!                      reused segment carries an older serial and ends roll-forward)
//!  16  data_crc   u32  version 1 only: CRC32C of the `count` blocks that follow; 0 in a
//!                      summary flagged HASH (see below: it can pass a stale block)
//!  20  count      u32  blocks after the summary (at most 168)
//!  24  next_seg   u32  the segment the log goes to once this one is full (threaded log)
//!  28  flags      u32  bit 0 COMMIT: last partial of a flush; roll-forward applies
//!                      partial segments only up to a COMMIT (see DESIGN.md);
//!                      bit 1 SKIP_REST: the log goes on at the start of next_seg;
//!                      bit 2 HASH: the blocks are checked by data_hash, not data_crc
//!                      (every summary of a version 2 image has it)
//!  32  time_ns    u64  write time
//!  40  seg        u32  this partial's segment (a copy at a wrong place is refused)
//!  44  off        u32  this partial's first block (the summary) in the segment
//!  48  data_hash  u64  HASH: XXH3-64 of serial, seg, off (little-endian u64, u32, u32)
//!                      and then the `count` blocks; version 1: reserved, 0
//!  56  reserved   [u8; 8]
//!  64  entries    24 bytes each, one per block, in log order:
//!        0 kind     u8   1 data, 2 indirect, 3 inode block, 4 inode map, 5 usage table,
//!                        6 directory operation log, 7 xattr
//!        1 reserved [u8; 3]
//!        4 version  u32  the inode number's version when the block was written
//!        8 ino      u64  inode number (0 for table and log blocks)
//!       16 lbn      u64  logical block (data), indirect slot, or table block index
//! ```
//!
//! **Why a hash and not a CRC over the blocks** (docs/FORMAT.md, "Partial segment"). CRC32C
//! is linear, and each 256-byte inode record ends with the CRC32C of its first 252 bytes:
//! a CRC register run over such a record ends in a state that does not depend on the
//! record's contents. Version 1's `data_crc` over the blocks concatenated therefore took the
//! same value for every inode block whose 16 slots are valid records, whatever the records
//! held — after a torn write into a reused segment, the stale inode block of the segment's
//! previous life passed the check and roll-forward applied stale inodes. Seeding the CRC
//! with the serial and address moves the register but not that cancellation; a CRC32C per
//! block in the summary has it too. XXH3 is not linear, so no structure inside a block can
//! cancel out, and hashing the serial and place first binds the blocks to this partial:
//! a block of any other partial — this segment's previous life, or an earlier partial of
//! the same flush — fails it unless the 64-bit hashes collide.

use super::*;

pub const MAGIC: u32 = u32::from_le_bytes(*b"LFSS");
pub const FLAG_COMMIT: u32 = 1;
/// The log continues at the start of `next_seg`: the rest of this segment is unused.
pub const FLAG_SKIP_REST: u32 = 2;
/// The blocks are checked by `data_hash` (written by every summary since format version 2).
pub const FLAG_HASH: u32 = 4;
const HDR: usize = 64;
const ENTRY: usize = 24;
/// Most blocks one summary names.
pub const MAX_ENTRIES: usize = (BLOCK_SIZE - HDR) / ENTRY;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Data = 1,
    /// lbn: 0 = the single indirect block, 1 = the double indirect block, 2 + i = the i-th
    /// indirect block under the double indirect one.
    Indirect = 2,
    Inode = 3,
    Imap = 4,
    Usage = 5,
    DirLog = 6,
    Xattr = 7,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Indirect,
            3 => Kind::Inode,
            4 => Kind::Imap,
            5 => Kind::Usage,
            6 => Kind::DirLog,
            7 => Kind::Xattr,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub version: u32,
    pub ino: u64,
    pub lbn: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub serial: u64,
    /// Version 1's check of the blocks (a summary without [`FLAG_HASH`]).
    pub data_crc: u32,
    /// The check of the blocks of a summary flagged [`FLAG_HASH`] ([`data_hash`]).
    pub data_hash: u64,
    pub next_seg: u32,
    pub flags: u32,
    pub time_ns: u64,
    pub seg: u32,
    pub off: u32,
    pub entries: Vec<Entry>,
}

impl Summary {
    pub fn commit(&self) -> bool {
        self.flags & FLAG_COMMIT != 0
    }

    pub fn skip_rest(&self) -> bool {
        self.flags & FLAG_SKIP_REST != 0
    }

    /// Whether the blocks are checked by [`Summary::data_hash`] (format version 2).
    pub fn hashed(&self) -> bool {
        self.flags & FLAG_HASH != 0
    }

    /// Sets the check of `data`, the blocks that follow the summary, in the current form:
    /// [`FLAG_HASH`] and the hash bound to this summary's serial and place (after `serial`,
    /// `seg` and `off` are set).
    pub fn seal(&mut self, data: &[u8]) {
        self.flags |= FLAG_HASH;
        self.data_crc = 0;
        self.data_hash = data_hash(self.serial, self.seg, self.off, data);
    }

    /// Whether `data` is exactly the blocks this summary was written with: by the hash
    /// when the summary is flagged HASH, by version 1's CRC otherwise.
    pub fn holds(&self, data: &[u8]) -> bool {
        if self.hashed() {
            data_hash(self.serial, self.seg, self.off, data) == self.data_hash
        } else {
            crc(data) == self.data_crc
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE];
        put_u32(&mut b, 0, MAGIC);
        put_u64(&mut b, 8, self.serial);
        put_u32(&mut b, 16, self.data_crc);
        put_u32(&mut b, 20, self.entries.len() as u32);
        put_u32(&mut b, 24, self.next_seg);
        put_u32(&mut b, 28, self.flags);
        put_u64(&mut b, 32, self.time_ns);
        put_u32(&mut b, 40, self.seg);
        put_u32(&mut b, 44, self.off);
        put_u64(&mut b, 48, self.data_hash);
        for (i, e) in self.entries.iter().take(MAX_ENTRIES).enumerate() {
            let o = HDR + i * ENTRY;
            b[o] = e.kind as u8;
            put_u32(&mut b, o + 4, e.version);
            put_u64(&mut b, o + 8, e.ino);
            put_u64(&mut b, o + 16, e.lbn);
        }
        let c = crc(&b);
        put_u32(&mut b, 4, c);
        b
    }

    /// Decodes a summary block; `segment_blocks` and `segments` bound what it may claim.
    pub fn decode(b: &[u8], segment_blocks: u32, segments: u32) -> FResult<Summary> {
        need(b, BLOCK_SIZE, "segment summary")?;
        if get_u32(b, 0) != MAGIC {
            return corrupt("segment summary: bad magic");
        }
        let mut copy = b[..BLOCK_SIZE].to_vec();
        put_u32(&mut copy, 4, 0);
        if crc(&copy) != get_u32(b, 4) {
            return corrupt("segment summary: checksum mismatch");
        }
        let count = get_u32(b, 20) as usize;
        let (seg, off) = (get_u32(b, 40), get_u32(b, 44));
        if count > MAX_ENTRIES
            || seg >= segments
            || off as u64 + 1 + count as u64 > segment_blocks as u64
        {
            return corrupt(format!(
                "segment summary: {count} blocks at {seg}:{off} do not fit the segment"
            ));
        }
        let next_seg = get_u32(b, 24);
        if next_seg >= segments {
            return corrupt(format!("segment summary: next segment {next_seg}"));
        }
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let o = HDR + i * ENTRY;
            let Some(kind) = Kind::from_u8(b[o]) else {
                return corrupt(format!("segment summary: entry {i} of kind {}", b[o]));
            };
            entries.push(Entry {
                kind,
                version: get_u32(b, o + 4),
                ino: get_u64(b, o + 8),
                lbn: get_u64(b, o + 16),
            });
        }
        Ok(Summary {
            serial: get_u64(b, 8),
            data_crc: get_u32(b, 16),
            data_hash: get_u64(b, 48),
            next_seg,
            flags: get_u32(b, 28),
            time_ns: get_u64(b, 32),
            seg,
            off,
            entries,
        })
    }
}

/// The check of a partial segment's blocks (format version 2): XXH3-64 over the summary's
/// serial, segment and offset, then the blocks.
pub fn data_hash(serial: u64, seg: u32, off: u32, data: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&serial.to_le_bytes());
    h.update(&seg.to_le_bytes());
    h.update(&off.to_le_bytes());
    h.update(data);
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile() {
        let s = Summary {
            serial: 9,
            data_crc: 0xdead,
            data_hash: 0xfeed_beef_0bad_cafe,
            next_seg: 3,
            flags: FLAG_COMMIT,
            time_ns: 1,
            seg: 1,
            off: 0,
            entries: (0..127)
                .map(|i| Entry {
                    kind: Kind::Data,
                    version: 1,
                    ino: 5,
                    lbn: i,
                })
                .collect(),
        };
        let b = s.encode();
        assert_eq!(Summary::decode(&b, 128, 4).unwrap(), s);
        // 127 blocks after the summary do not fit a 64-block segment.
        assert!(Summary::decode(&b, 64, 4).is_err());
        assert!(Summary::decode(&b, 128, 1).is_err(), "segment out of range");
        let mut c = b.clone();
        c[70] = 99;
        assert!(Summary::decode(&c, 128, 4).is_err());
        assert!(Summary::decode(&b[..10], 128, 4).is_err());
        assert_eq!(MAX_ENTRIES, 168);
    }

    /// The version-1 bug: a stale inode block passes a CRC32C over the blocks, because each
    /// inode record ends in its own CRC32C. Two inode blocks with different records give
    /// the same CRC after the same first block; the hash tells them apart, and binds the
    /// blocks to the summary's serial and place.
    #[test]
    fn a_stale_inode_block_passes_the_crc_and_fails_the_hash() {
        use crate::format::inode::{self, Inode};
        let block = |seed: u64| {
            let recs: Vec<Inode> = (0..inode::PER_BLOCK as u64)
                .map(|i| Inode {
                    ino: 3 + i,
                    version: seed as u32,
                    mode: 0o100644,
                    nlink: 1,
                    size: seed * 1000 + i,
                    ..Default::default()
                })
                .collect();
            inode::encode_block(&recs.iter().collect::<Vec<_>>())
        };
        let (new, stale) = (block(7), block(1));
        assert_ne!(new, stale);
        let first = vec![0x5au8; BLOCK_SIZE];
        let written = [first.clone(), new].concat();
        let torn = [first, stale].concat();
        // Version 1: the torn partial passes.
        let v1 = Summary {
            serial: 40,
            data_crc: crc(&written),
            data_hash: 0,
            next_seg: 2,
            flags: FLAG_COMMIT,
            time_ns: 0,
            seg: 1,
            off: 9,
            entries: Vec::new(),
        };
        assert!(v1.holds(&written));
        assert!(
            v1.holds(&torn),
            "CRC32C no longer cancels self-checked records?"
        );
        // Version 2: it fails, and the same blocks fail under another serial or place.
        let mut v2 = v1.clone();
        v2.seal(&written);
        assert!(v2.hashed() && v2.commit());
        assert!(v2.holds(&written) && !v2.holds(&torn));
        for (serial, seg, off) in [(41, 1, 9), (40, 2, 9), (40, 1, 10)] {
            let other = Summary {
                serial,
                seg,
                off,
                ..v2.clone()
            };
            assert!(!other.holds(&written), "{serial} {seg}:{off}");
        }
        // The flag and the hash survive encoding.
        let back = Summary::decode(&v2.encode(), 128, 4).unwrap();
        assert_eq!(back, v2);
        assert!(back.holds(&written) && !back.holds(&torn));
    }
}
