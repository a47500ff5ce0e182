//! The inode map and the segment usage table (004 §3.1, §3.6): arrays cut into blocks that
//! are written to the log; the checkpoint region names every block. Both block kinds share
//! one header so a block read from a wrong address is refused, not misread.
//!
//! ```text
//! header (16 bytes)
//!   0  magic   u32  "LFIM" (inode map) or "LFSU" (usage table)
//!   4  index   u32  which block of the table this is
//!   8  crc     u32  CRC32C of the whole block with this field zero
//!  12  reserved u32 zero
//! 255 entries of 16 bytes from byte 16
//!
//! inode map entry (inode number = index·255 + i)
//!   0  addr     u64  block of the inode block holding the inode's newest copy; 0 = free
//!   8  version  u32  bumped when the inode number is freed (004 §3.3: inode number and
//!                    version form the uid that summaries record)
//!  12  reserved u32
//!
//! usage-table entry (segment = index·255 + i)
//!   0  live_bytes u32  bytes still live in the segment
//!   4  flags      u32  bit 0: dirty (written since it was last clean)
//!   8  youngest   u64  when a block was last written into it (ms since the epoch)
//! ```

use super::*;

pub const IMAP_MAGIC: u32 = u32::from_le_bytes(*b"LFIM");
pub const USAGE_MAGIC: u32 = u32::from_le_bytes(*b"LFSU");
/// Entries per table block.
pub const PER_BLOCK: usize = 255;
const HDR: usize = 16;
const ENTRY: usize = 16;

pub fn imap_blocks_for(max_inodes: u32) -> u32 {
    (max_inodes as usize).div_ceil(PER_BLOCK) as u32
}
pub fn usage_blocks_for(segments: u32) -> u32 {
    (segments as usize).div_ceil(PER_BLOCK) as u32
}

/// One inode-map entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImapEntry {
    pub addr: u64,
    pub version: u32,
}

/// One segment-usage entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageEntry {
    pub live_bytes: u32,
    pub dirty: bool,
    pub youngest: u64,
}

fn encode_block(magic: u32, index: u32, fill: impl Fn(&mut [u8], usize)) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    put_u32(&mut b, 0, magic);
    put_u32(&mut b, 4, index);
    for i in 0..PER_BLOCK {
        fill(&mut b[HDR + i * ENTRY..HDR + (i + 1) * ENTRY], i);
    }
    let c = crc(&b);
    put_u32(&mut b, 8, c);
    b
}

fn check_block(b: &[u8], magic: u32, index: u32, what: &str) -> FResult<()> {
    need(b, BLOCK_SIZE, what)?;
    if get_u32(b, 0) != magic {
        return corrupt(format!("{what} block {index}: bad magic"));
    }
    if get_u32(b, 4) != index {
        return corrupt(format!(
            "{what} block {index}: holds block {} of the table",
            get_u32(b, 4)
        ));
    }
    let mut copy = b[..BLOCK_SIZE].to_vec();
    put_u32(&mut copy, 8, 0);
    if crc(&copy) != get_u32(b, 8) {
        return corrupt(format!("{what} block {index}: checksum mismatch"));
    }
    Ok(())
}

/// Encodes block `index` of the inode map from the whole map (missing entries are free).
pub fn encode_imap(index: u32, map: &[ImapEntry]) -> Vec<u8> {
    encode_block(IMAP_MAGIC, index, |e, i| {
        let ent = map
            .get(index as usize * PER_BLOCK + i)
            .copied()
            .unwrap_or_default();
        put_u64(e, 0, ent.addr);
        put_u32(e, 8, ent.version);
    })
}

/// Decodes block `index` of the inode map into its 255 entries.
pub fn decode_imap(b: &[u8], index: u32) -> FResult<Vec<ImapEntry>> {
    check_block(b, IMAP_MAGIC, index, "inode map")?;
    Ok((0..PER_BLOCK)
        .map(|i| {
            let o = HDR + i * ENTRY;
            ImapEntry {
                addr: get_u64(b, o),
                version: get_u32(b, o + 8),
            }
        })
        .collect())
}

pub fn encode_usage(index: u32, table: &[UsageEntry]) -> Vec<u8> {
    encode_block(USAGE_MAGIC, index, |e, i| {
        let ent = table
            .get(index as usize * PER_BLOCK + i)
            .copied()
            .unwrap_or_default();
        put_u32(e, 0, ent.live_bytes);
        put_u32(e, 4, ent.dirty as u32);
        put_u64(e, 8, ent.youngest);
    })
}

pub fn decode_usage(b: &[u8], index: u32) -> FResult<Vec<UsageEntry>> {
    check_block(b, USAGE_MAGIC, index, "segment usage table")?;
    Ok((0..PER_BLOCK)
        .map(|i| {
            let o = HDR + i * ENTRY;
            UsageEntry {
                live_bytes: get_u32(b, o),
                dirty: get_u32(b, o + 4) & 1 != 0,
                youngest: get_u64(b, o + 8),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refusals() {
        let map: Vec<ImapEntry> = (0..600)
            .map(|i| ImapEntry {
                addr: i * 3,
                version: i as u32 + 1,
            })
            .collect();
        let b = encode_imap(2, &map);
        let got = decode_imap(&b, 2).unwrap();
        assert_eq!(&got[..90], &map[510..600]);
        assert_eq!(got[90], ImapEntry::default());
        assert!(decode_imap(&b, 1).is_err(), "wrong index");
        assert!(decode_usage(&b, 2).is_err(), "wrong kind");
        let mut c = b.clone();
        c[100] ^= 4;
        assert!(decode_imap(&c, 2).is_err(), "flipped bit");
        assert!(decode_imap(&b[..100], 2).is_err(), "short");
        let table = vec![
            UsageEntry {
                live_bytes: 4096,
                dirty: true,
                youngest: 99,
            };
            3
        ];
        assert_eq!(
            &decode_usage(&encode_usage(0, &table), 0).unwrap()[..3],
            &table[..]
        );
        assert_eq!(imap_blocks_for(255), 1);
        assert_eq!(imap_blocks_for(256), 2);
    }
}
