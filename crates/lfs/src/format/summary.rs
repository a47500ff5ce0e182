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
//!  16  data_crc   u32  CRC32C of the `count` blocks that follow (a torn write fails it)
//!  20  count      u32  blocks after the summary (at most 168)
//!  24  next_seg   u32  the segment the log goes to once this one is full (threaded log)
//!  28  flags      u32  bit 0 COMMIT: last partial of a flush; roll-forward applies
//!                      partial segments only up to a COMMIT (see DESIGN.md);
//!                      bit 1 SKIP_REST: the log goes on at the start of next_seg
//!  32  time_ns    u64  write time
//!  40  seg        u32  this partial's segment (a copy at a wrong place is refused)
//!  44  off        u32  this partial's first block (the summary) in the segment
//!  48  reserved   [u8; 16]
//!  64  entries    24 bytes each, one per block, in log order:
//!        0 kind     u8   1 data, 2 indirect, 3 inode block, 4 inode map, 5 usage table,
//!                        6 directory operation log, 7 xattr
//!        1 reserved [u8; 3]
//!        4 version  u32  the inode number's version when the block was written
//!        8 ino      u64  inode number (0 for table and log blocks)
//!       16 lbn      u64  logical block (data), indirect slot, or table block index
//! ```

use super::*;

pub const MAGIC: u32 = u32::from_le_bytes(*b"LFSS");
pub const FLAG_COMMIT: u32 = 1;
/// The log continues at the start of `next_seg`: the rest of this segment is unused.
pub const FLAG_SKIP_REST: u32 = 2;
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
    pub data_crc: u32,
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
            next_seg,
            flags: get_u32(b, 28),
            time_ns: get_u64(b, 32),
            seg,
            off,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile() {
        let s = Summary {
            serial: 9,
            data_crc: 0xdead,
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
}
