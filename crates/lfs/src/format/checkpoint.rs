//! The two checkpoint regions (004 §4.1): fixed places after the superblock, written
//! alternately. Each names every block of the inode map and the usage table and the place
//! in the log where roll-forward starts. A region is written with one device write after
//! everything it names is durable; its checksum covers the whole region, so a torn write
//! leaves it invalid and mount uses the other (the newer *valid* one of the two by serial).
//!
//! ```text
//! region of cp_blocks blocks
//!   0  magic        u32  "LFCP"
//!   4  version      u32  2 (1 is read too: no orphan list, bytes 52..64 reserved)
//!   8  serial       u64  checkpoint number, +1 each checkpoint (the newer valid one wins)
//!  16  time_ns      u64  when it was written (nanoseconds since the epoch)
//!  24  log_seg      u32  segment where the log continues
//!  28  log_off      u32  block in that segment where the next partial segment starts
//!  32  log_serial   u64  serial the next partial segment's summary carries
//!  40  imap_blocks  u32
//!  44  usage_blocks u32
//!  48  next_ino     u32  where the search for a free inode number starts
//!  52  orphans      u32  inode numbers in the orphan list (version 2)
//!  56  reserved     [u8; 8]
//!  64  addresses    u64 × (imap_blocks + usage_blocks): inode map blocks, then usage blocks
//!  ..  orphan list  u64 × orphans: inodes with no link still open when the checkpoint was
//!                   written (a mount frees those roll-forward does not give a link back)
//!  ... zero
//!  len-4 crc        u32  CRC32C of bytes 0..len-4 (the last bytes: 004 §4.1 puts the
//!                        time in the last block so a torn write never looks complete)
//! ```

use super::*;

pub const MAGIC: u32 = u32::from_le_bytes(*b"LFCP");
pub const VERSION: u32 = 2;
const HDR: usize = 64;

/// Inode numbers the orphan list of a region of `cp_blocks` blocks naming `tables` table
/// blocks can hold (what is left of the region before its checksum).
pub fn orphan_room(cp_blocks: u32, tables: u32) -> usize {
    (cp_blocks as usize * BLOCK_SIZE).saturating_sub(HDR + 8 * tables as usize + 4) / 8
}

/// Blocks a region needs to name `imap` + `usage` table blocks.
pub fn region_blocks(imap: u32, usage: u32) -> u32 {
    (HDR + 8 * (imap as usize + usage as usize) + 4).div_ceil(BLOCK_SIZE) as u32
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub serial: u64,
    pub time_ns: u64,
    pub log_seg: u32,
    pub log_off: u32,
    pub log_serial: u64,
    pub next_ino: u32,
    pub imap_addrs: Vec<u64>,
    pub usage_addrs: Vec<u64>,
    /// Inodes with no link that were open (at most [`orphan_room`]; the encoder drops the
    /// rest, which only `cairn fsck -y` then frees after a crash).
    pub orphans: Vec<u64>,
}

impl Checkpoint {
    /// The region's bytes: `cp_blocks` blocks.
    pub fn encode(&self, cp_blocks: u32) -> Vec<u8> {
        let len = cp_blocks as usize * BLOCK_SIZE;
        let mut b = vec![0u8; len];
        put_u32(&mut b, 0, MAGIC);
        put_u32(&mut b, 4, VERSION);
        put_u64(&mut b, 8, self.serial);
        put_u64(&mut b, 16, self.time_ns);
        put_u32(&mut b, 24, self.log_seg);
        put_u32(&mut b, 28, self.log_off);
        put_u64(&mut b, 32, self.log_serial);
        put_u32(&mut b, 40, self.imap_addrs.len() as u32);
        put_u32(&mut b, 44, self.usage_addrs.len() as u32);
        put_u32(&mut b, 48, self.next_ino);
        let tables = self.imap_addrs.len() + self.usage_addrs.len();
        let orphans = &self.orphans[..self
            .orphans
            .len()
            .min(orphan_room(cp_blocks, tables as u32))];
        put_u32(&mut b, 52, orphans.len() as u32);
        for (i, a) in self
            .imap_addrs
            .iter()
            .chain(&self.usage_addrs)
            .chain(orphans)
            .enumerate()
        {
            put_u64(&mut b, HDR + 8 * i, *a);
        }
        let c = crc(&b[..len - 4]);
        put_u32(&mut b, len - 4, c);
        b
    }

    /// Decodes a region and checks it against the superblock: every address it names lies
    /// in the log, the log position inside a segment.
    pub fn decode(b: &[u8], sb: &superblock::Superblock) -> FResult<Checkpoint> {
        let len = sb.cp_blocks as usize * BLOCK_SIZE;
        need(b, len, "checkpoint region")?;
        if get_u32(b, 0) != MAGIC {
            return corrupt("checkpoint region: bad magic");
        }
        let version = get_u32(b, 4);
        if version != 1 && version != VERSION {
            return corrupt(format!("checkpoint region: version {version}"));
        }
        if get_u32(b, len - 4) != crc(&b[..len - 4]) {
            return corrupt("checkpoint region: checksum mismatch (torn or damaged)");
        }
        let (ni, nu) = (get_u32(b, 40), get_u32(b, 44));
        if ni != sb.imap_blocks || nu != sb.usage_blocks {
            return corrupt(format!(
                "checkpoint region names {ni} inode-map and {nu} usage blocks"
            ));
        }
        let addr = |i: usize| get_u64(b, HDR + 8 * i);
        let imap_addrs: Vec<u64> = (0..ni as usize).map(addr).collect();
        let usage_addrs: Vec<u64> = (ni as usize..(ni + nu) as usize).map(addr).collect();
        if let Some(a) = imap_addrs
            .iter()
            .chain(&usage_addrs)
            .find(|&&a| !sb.in_log(a))
        {
            return corrupt(format!(
                "checkpoint region: table block at {a} outside the log"
            ));
        }
        let n_orphans = if version >= 2 {
            get_u32(b, 52) as usize
        } else {
            0
        };
        if n_orphans > orphan_room(sb.cp_blocks, ni + nu) {
            return corrupt(format!(
                "checkpoint region: {n_orphans} orphans do not fit the region"
            ));
        }
        let orphans: Vec<u64> = ((ni + nu) as usize..(ni + nu) as usize + n_orphans)
            .map(addr)
            .collect();
        if let Some(i) = orphans
            .iter()
            .find(|&&i| i == 0 || i >= u64::from(sb.max_inodes))
        {
            return corrupt(format!(
                "checkpoint region: orphan {i} is not an inode number"
            ));
        }
        let cp = Checkpoint {
            serial: get_u64(b, 8),
            time_ns: get_u64(b, 16),
            log_seg: get_u32(b, 24),
            log_off: get_u32(b, 28),
            log_serial: get_u64(b, 32),
            next_ino: get_u32(b, 48),
            imap_addrs,
            usage_addrs,
            orphans,
        };
        if cp.log_seg >= sb.segments || cp.log_off > sb.segment_blocks {
            return corrupt(format!(
                "checkpoint region: log position {}:{} outside the log",
                cp.log_seg, cp.log_off
            ));
        }
        Ok(cp)
    }
}

/// Of the two regions' decodes, the one to use: the valid one with the higher serial.
/// Returns its slot, or the two errors when neither is valid.
pub fn choose(a: FResult<Checkpoint>, b: FResult<Checkpoint>) -> FResult<(usize, Checkpoint)> {
    match (a, b) {
        (Ok(x), Ok(y)) => Ok(if y.serial > x.serial { (1, y) } else { (0, x) }),
        (Ok(x), Err(_)) => Ok((0, x)),
        (Err(_), Ok(y)) => Ok((1, y)),
        (Err(e0), Err(e1)) => corrupt(format!(
            "no valid checkpoint region (region 0: {e0}; region 1: {e1})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::superblock::Superblock;

    fn sb() -> Superblock {
        let imap_blocks = tables::imap_blocks_for(1000);
        let usage_blocks = tables::usage_blocks_for(10);
        let cp_blocks = region_blocks(imap_blocks, usage_blocks);
        Superblock {
            version: superblock::VERSION,
            total_blocks: 1 + 2 * cp_blocks as u64 + 10 * 128,
            segment_blocks: 128,
            segments: 10,
            first_segment: 1 + 2 * cp_blocks as u64,
            cp_blocks,
            max_inodes: 1000,
            imap_blocks,
            usage_blocks,
            created: 0,
            label: String::new(),
        }
    }

    fn cp(serial: u64, sb: &Superblock) -> Checkpoint {
        Checkpoint {
            serial,
            time_ns: 5,
            log_seg: 2,
            log_off: 7,
            log_serial: 40,
            next_ino: 3,
            imap_addrs: (0..sb.imap_blocks as u64)
                .map(|i| sb.first_segment + i)
                .collect(),
            usage_addrs: vec![sb.first_segment + 100],
            orphans: vec![],
        }
    }

    #[test]
    fn the_orphan_list_round_trips_and_is_checked() {
        let sb = sb();
        let mut c = cp(3, &sb);
        c.orphans = vec![5, 999];
        let b = c.encode(sb.cp_blocks);
        assert_eq!(Checkpoint::decode(&b, &sb).unwrap(), c);
        // Not an inode number.
        c.orphans = vec![1000];
        assert!(Checkpoint::decode(&c.encode(sb.cp_blocks), &sb).is_err());
        // More than the region holds: the encoder keeps what fits.
        let room = orphan_room(sb.cp_blocks, sb.imap_blocks + sb.usage_blocks);
        c.orphans = (1..=room as u64 + 10).map(|i| i % 999 + 1).collect();
        let d = Checkpoint::decode(&c.encode(sb.cp_blocks), &sb).unwrap();
        assert_eq!(d.orphans.len(), room);
        // A version 1 region (bytes 52..64 reserved, whatever they hold) has no list.
        let mut v1 = cp(3, &sb).encode(sb.cp_blocks);
        put_u32(&mut v1, 4, 1);
        put_u32(&mut v1, 52, 7);
        let n = v1.len();
        let c1 = crc(&v1[..n - 4]);
        put_u32(&mut v1, n - 4, c1);
        assert!(Checkpoint::decode(&v1, &sb).unwrap().orphans.is_empty());
    }

    #[test]
    fn round_trip_and_torn_region() {
        let sb = sb();
        let c = cp(3, &sb);
        let b = c.encode(sb.cp_blocks);
        assert_eq!(Checkpoint::decode(&b, &sb).unwrap(), c);
        // A torn write: the tail of the region is old (zero) bytes.
        let mut torn = b.clone();
        let n = torn.len();
        torn[n - 8..].fill(0);
        assert!(Checkpoint::decode(&torn, &sb).is_err());
        // An address outside the log is refused even with a good checksum.
        let mut bad = c.clone();
        bad.usage_addrs[0] = 1;
        assert!(Checkpoint::decode(&bad.encode(sb.cp_blocks), &sb).is_err());
        assert!(Checkpoint::decode(&b[..100], &sb).is_err());
    }

    #[test]
    fn the_newer_valid_region_is_chosen() {
        let sb = sb();
        let old = Checkpoint::decode(&cp(3, &sb).encode(sb.cp_blocks), &sb);
        let new = Checkpoint::decode(&cp(4, &sb).encode(sb.cp_blocks), &sb);
        assert_eq!(choose(old.clone(), new.clone()).unwrap().0, 1);
        assert_eq!(choose(new.clone(), old.clone()).unwrap().0, 0);
        let torn = Checkpoint::decode(&[0u8; 8192], &sb);
        assert_eq!(choose(old.clone(), torn.clone()).unwrap().1.serial, 3);
        assert_eq!(choose(torn.clone(), new).unwrap().1.serial, 4);
        assert!(choose(torn.clone(), torn).is_err());
    }
}
