//! Inodes (004 §3.1: "identical to those used in Unix FFS", but written to the log). An
//! inode block holds 16 records of 256 bytes; a record with inode number 0 is unused. The
//! inode map says which block holds an inode's newest copy; older copies in other blocks
//! are dead.
//!
//! ```text
//!   0  ino        u64
//!   8  version    u32  the inode map's version when written
//!  12  mode       u32  S_IFMT and permission bits
//!  16  uid        u32
//!  20  gid        u32
//!  24  nlink      u32
//!  28  flags      u32
//!  32  size       u64  bytes
//!  40  blocks     u64  blocks in the log owned by the file (data, indirect, xattr)
//!  48  atime_s    i64
//!  56  mtime_s    i64
//!  64  ctime_s    i64
//!  72  crtime_s   i64
//!  80  atime_ns   u32
//!  84  mtime_ns   u32
//!  88  ctime_ns   u32
//!  92  crtime_ns  u32
//!  96  rdev       u32
//! 100  reserved   u32
//! 104  direct     u64 × 12  blocks 0..12
//! 200  indirect   u64       a block of 512 addresses: blocks 12..524
//! 208  dindirect  u64       512 addresses of indirect blocks: blocks 524..262668
//! 216  xattr      u64       the extended-attribute block, 0 = none
//! 224  tindirect  u64       512 addresses of blocks like the double indirect one:
//!                           blocks 262668..134480396 (~513 GiB)
//! 232  reserved   [u8; 20]
//! 252  crc        u32  CRC32C of bytes 0..252
//! ```

use super::*;

pub const INODE_SIZE: usize = 256;
pub const PER_BLOCK: usize = BLOCK_SIZE / INODE_SIZE;
pub const NDIRECT: usize = 12;
/// Addresses per indirect block.
pub const PTRS: u64 = (BLOCK_SIZE / 8) as u64;
/// Logical blocks a file may have.
pub const MAX_BLOCKS: u64 = NDIRECT as u64 + PTRS + PTRS * PTRS + PTRS * PTRS * PTRS;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Inode {
    pub ino: u64,
    pub version: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub flags: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub crtime: Time,
    pub rdev: u32,
    pub direct: [u64; NDIRECT],
    pub indirect: u64,
    pub dindirect: u64,
    pub xattr: u64,
    pub tindirect: u64,
}

impl Inode {
    pub fn encode_into(&self, b: &mut [u8]) {
        b[..INODE_SIZE].fill(0);
        put_u64(b, 0, self.ino);
        put_u32(b, 8, self.version);
        put_u32(b, 12, self.mode);
        put_u32(b, 16, self.uid);
        put_u32(b, 20, self.gid);
        put_u32(b, 24, self.nlink);
        put_u32(b, 28, self.flags);
        put_u64(b, 32, self.size);
        put_u64(b, 40, self.blocks);
        for (i, t) in [self.atime, self.mtime, self.ctime, self.crtime]
            .iter()
            .enumerate()
        {
            put_u64(b, 48 + 8 * i, t.sec as u64);
            put_u32(b, 80 + 4 * i, t.nsec);
        }
        put_u32(b, 96, self.rdev);
        for (i, a) in self.direct.iter().enumerate() {
            put_u64(b, 104 + 8 * i, *a);
        }
        put_u64(b, 200, self.indirect);
        put_u64(b, 208, self.dindirect);
        put_u64(b, 216, self.xattr);
        put_u64(b, 224, self.tindirect);
        let c = crc(&b[..252]);
        put_u32(b, 252, c);
    }

    /// Decodes one 256-byte record; `Ok(None)` for an unused record.
    pub fn decode(b: &[u8]) -> FResult<Option<Inode>> {
        need(b, INODE_SIZE, "inode")?;
        let ino = get_u64(b, 0);
        if ino == 0 {
            return Ok(None);
        }
        if get_u32(b, 252) != crc(&b[..252]) {
            return corrupt(format!("inode {ino}: checksum mismatch"));
        }
        let t = |i: usize| Time {
            sec: get_u64(b, 48 + 8 * i) as i64,
            nsec: get_u32(b, 80 + 4 * i).min(999_999_999),
        };
        let mut direct = [0u64; NDIRECT];
        for (i, d) in direct.iter_mut().enumerate() {
            *d = get_u64(b, 104 + 8 * i);
        }
        Ok(Some(Inode {
            ino,
            version: get_u32(b, 8),
            mode: get_u32(b, 12),
            uid: get_u32(b, 16),
            gid: get_u32(b, 20),
            nlink: get_u32(b, 24),
            flags: get_u32(b, 28),
            size: get_u64(b, 32),
            blocks: get_u64(b, 40),
            atime: t(0),
            mtime: t(1),
            ctime: t(2),
            crtime: t(3),
            rdev: get_u32(b, 96),
            direct,
            indirect: get_u64(b, 200),
            dindirect: get_u64(b, 208),
            xattr: get_u64(b, 216),
            tindirect: get_u64(b, 224),
        }))
    }
}

/// Encodes an inode block from up to 16 inodes.
pub fn encode_block(inodes: &[&Inode]) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    for (i, ino) in inodes.iter().take(PER_BLOCK).enumerate() {
        ino.encode_into(&mut b[i * INODE_SIZE..(i + 1) * INODE_SIZE]);
    }
    b
}

/// Finds inode `ino` in an inode block.
pub fn find_in_block(b: &[u8], ino: u64) -> FResult<Option<Inode>> {
    need(b, BLOCK_SIZE, "inode block")?;
    for i in 0..PER_BLOCK {
        let r = &b[i * INODE_SIZE..(i + 1) * INODE_SIZE];
        if get_u64(r, 0) == ino {
            return Inode::decode(r);
        }
    }
    Ok(None)
}

/// Every used record of an inode block (roll-forward, cleaner, check).
pub fn decode_block(b: &[u8]) -> FResult<Vec<Inode>> {
    need(b, BLOCK_SIZE, "inode block")?;
    let mut v = Vec::new();
    for i in 0..PER_BLOCK {
        if let Some(n) = Inode::decode(&b[i * INODE_SIZE..(i + 1) * INODE_SIZE])? {
            v.push(n);
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile() {
        let n = Inode {
            ino: 7,
            version: 2,
            mode: 0o100644,
            nlink: 1,
            size: 5000,
            blocks: 2,
            mtime: Time { sec: -5, nsec: 9 },
            direct: [1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 12],
            indirect: 99,
            ..Default::default()
        };
        let m = Inode {
            ino: 8,
            ..n.clone()
        };
        let b = encode_block(&[&n, &m]);
        assert_eq!(find_in_block(&b, 8).unwrap().unwrap(), m);
        assert_eq!(find_in_block(&b, 9).unwrap(), None);
        assert_eq!(decode_block(&b).unwrap(), vec![n.clone(), m]);
        let mut c = b.clone();
        c[40] ^= 1;
        assert!(find_in_block(&c, 7).is_err());
        assert!(decode_block(&b[..300]).is_err());
    }
}
