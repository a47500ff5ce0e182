//! The directory operation log (004 §4.2): one record per create, link, rename and unlink,
//! written in the log before the directory blocks and inodes the operation changed.
//!
//! ```text
//! block header (16 bytes)
//!   0  magic    u32  "LFDL"
//!   4  count    u32  records in the block
//!   8  crc      u32  CRC32C of the whole block with this field zero
//!  12  reserved u32
//! records from byte 16, packed:
//!   0  op       u8   1 create, 2 link, 3 unlink, 4 rename (one record per side: the
//!                    removal from the old directory is an unlink record flagged RENAME)
//!   1  namelen  u8
//!   2  flags    u16  bit 0: half of a rename
//!   4  nlink    u32  the inode's link count after the operation
//!   8  dir      u64  directory inode
//!  16  ino      u64  inode the entry names
//!  24  name     namelen bytes
//! ```

use super::*;

pub const MAGIC: u32 = u32::from_le_bytes(*b"LFDL");
const HDR: usize = 16;
const REC: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create = 1,
    Link = 2,
    Unlink = 3,
    Rename = 4,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub op: Op,
    pub rename_half: bool,
    pub nlink: u32,
    pub dir: u64,
    pub ino: u64,
    pub name: Vec<u8>,
}

impl Record {
    pub fn size(&self) -> usize {
        REC + self.name.len()
    }
}

/// Packs records into as many blocks as they need.
pub fn encode(records: &[Record]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < records.len() {
        let mut b = vec![0u8; BLOCK_SIZE];
        put_u32(&mut b, 0, MAGIC);
        let mut off = HDR;
        let mut n = 0u32;
        while i < records.len() && off + records[i].size() <= BLOCK_SIZE {
            let r = &records[i];
            let len = r.name.len().min(255);
            b[off] = r.op as u8;
            b[off + 1] = len as u8;
            put_u16(&mut b, off + 2, r.rename_half as u16);
            put_u32(&mut b, off + 4, r.nlink);
            put_u64(&mut b, off + 8, r.dir);
            put_u64(&mut b, off + 16, r.ino);
            b[off + REC..off + REC + len].copy_from_slice(&r.name[..len]);
            off += REC + len;
            n += 1;
            i += 1;
        }
        put_u32(&mut b, 4, n);
        let c = crc(&b);
        put_u32(&mut b, 8, c);
        out.push(b);
    }
    out
}

pub fn decode(b: &[u8]) -> FResult<Vec<Record>> {
    need(b, BLOCK_SIZE, "directory operation log")?;
    if get_u32(b, 0) != MAGIC {
        return corrupt("directory operation log: bad magic");
    }
    let mut copy = b[..BLOCK_SIZE].to_vec();
    put_u32(&mut copy, 8, 0);
    if crc(&copy) != get_u32(b, 8) {
        return corrupt("directory operation log: checksum mismatch");
    }
    let n = get_u32(b, 4) as usize;
    let mut off = HDR;
    let mut v = Vec::new();
    for i in 0..n {
        if off + REC > BLOCK_SIZE {
            return corrupt(format!("directory operation log: record {i} out of bounds"));
        }
        let len = b[off + 1] as usize;
        if off + REC + len > BLOCK_SIZE {
            return corrupt(format!("directory operation log: record {i} out of bounds"));
        }
        let op = match b[off] {
            1 => Op::Create,
            2 => Op::Link,
            3 => Op::Unlink,
            4 => Op::Rename,
            o => return corrupt(format!("directory operation log: op {o}")),
        };
        v.push(Record {
            op,
            rename_half: get_u16(b, off + 2) & 1 != 0,
            nlink: get_u32(b, off + 4),
            dir: get_u64(b, off + 8),
            ino: get_u64(b, off + 16),
            name: b[off + REC..off + REC + len].to_vec(),
        });
        off += REC + len;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_spans_blocks_and_hostile() {
        let recs: Vec<Record> = (0..40)
            .map(|i| Record {
                op: if i % 2 == 0 { Op::Create } else { Op::Rename },
                rename_half: i % 3 == 0,
                nlink: i,
                dir: 2,
                ino: 100 + i as u64,
                name: vec![b'a' + (i % 26) as u8; 200],
            })
            .collect();
        let blocks = encode(&recs);
        assert!(blocks.len() > 1);
        let back: Vec<Record> = blocks.iter().flat_map(|b| decode(b).unwrap()).collect();
        assert_eq!(back, recs);
        let mut c = blocks[0].clone();
        put_u32(&mut c, 4, 1000);
        assert!(decode(&c).is_err());
        assert!(decode(&blocks[0][..50]).is_err());
    }
}
