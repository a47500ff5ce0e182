//! The on-disk format, byte for byte. docs/FORMAT.md is the same text as tables; the offset
//! comments here mirror it. Everything is little-endian.
//!
//! Codecs in this module never panic on hostile bytes: decoding returns
//! [`FormatError`] naming what is wrong.

/// Directory blocks: the codec both of cairn's formats share (`cairn_dir::block`).
pub use cairn_dir::block as dir;
pub mod inode;
pub mod superblock;
pub mod xattr;

pub use dir::{DIR_CHUNK, DirEntryRef};
pub use inode::{DiskInode, FAST_SYMLINK_MAX, INODE_SIZE, NDIRECT};
pub use superblock::{Geometry, GroupDesc, Superblock};

/// Why a structure could not be decoded. The message is one line naming the problem.
pub use cairn_dir::{FResult, FormatError};

pub(crate) fn corrupt<T>(msg: impl Into<String>) -> FResult<T> {
    Err(FormatError(msg.into()))
}

/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
/// Smallest and largest block sizes (bytes).
pub const MIN_BLOCK_SIZE: u32 = 4096;
pub const MAX_BLOCK_SIZE: u32 = 65536;
/// Inode number of the root directory (0 means "no inode", 1 is reserved, as in FFS).
pub const ROOT_INO: u64 = 2;
/// Inode number mkfs gives lost+found.
pub const LOST_FOUND_INO: u64 = 3;
/// The first inode number ordinary allocation may hand out.
pub const FIRST_FREE_INO: u64 = 3;
/// Longest file name.
pub const MAX_NAME: usize = 255;

/// Buffer kinds (the cache's `Buf::kind` tag), so strategies and counters can tell metadata
/// classes apart.
pub mod kind {
    pub const DATA: u8 = 0;
    pub const SUPERBLOCK: u8 = 1;
    /// Group descriptor and bitmaps.
    pub const GROUP: u8 = 2;
    pub const INODE: u8 = 3;
    pub const DIRECTORY: u8 = 4;
    pub const INDIRECT: u8 = 5;
    pub const XATTR: u8 = 6;
}

pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}
pub(crate) fn get_i64(b: &[u8], off: usize) -> i64 {
    get_u64(b, off) as i64
}
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_i64(b: &mut [u8], off: usize, v: i64) {
    put_u64(b, off, v as u64)
}

/// Bitmap helpers over a block of bits (bit i of byte i/8, LSB first).
pub mod bitmap {
    pub fn get(map: &[u8], i: usize) -> bool {
        map.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
    }
    pub fn set(map: &mut [u8], i: usize, v: bool) {
        if let Some(b) = map.get_mut(i / 8) {
            if v {
                *b |= 1 << (i % 8)
            } else {
                *b &= !(1 << (i % 8))
            }
        }
    }
    /// First clear bit in `[from, limit)`, scanning a word at a time, then wrapping to
    /// `[0, from)`.
    pub fn find_clear(map: &[u8], from: usize, limit: usize) -> Option<usize> {
        let limit = limit.min(map.len() * 8);
        let from = if from >= limit { 0 } else { from };
        scan(map, from, limit).or_else(|| scan(map, 0, from))
    }
    fn scan(map: &[u8], mut i: usize, end: usize) -> Option<usize> {
        while i < end {
            if i.is_multiple_of(64) && i + 64 <= end {
                let w = u64::from_le_bytes(map[i / 8..i / 8 + 8].try_into().expect("8 bytes"));
                if w == u64::MAX {
                    i += 64;
                    continue;
                }
                return Some(i + (!w).trailing_zeros() as usize);
            }
            if !get(map, i) {
                return Some(i);
            }
            i += 1;
        }
        None
    }
    /// Bits set among the first `limit` (whole bytes by popcount, the tail bit by bit).
    pub fn count_set(map: &[u8], limit: usize) -> usize {
        let limit = limit.min(map.len() * 8);
        let full = limit / 8;
        let whole: usize = map[..full].iter().map(|b| b.count_ones() as usize).sum();
        whole + (full * 8..limit).filter(|&i| get(map, i)).count()
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        #[test]
        fn find_and_wrap() {
            let mut m = vec![0xffu8; 32];
            assert_eq!(find_clear(&m, 0, 256), None);
            set(&mut m, 200, false);
            assert_eq!(find_clear(&m, 0, 256), Some(200));
            assert_eq!(find_clear(&m, 201, 256), Some(200));
            assert_eq!(find_clear(&m, 0, 199), None);
            set(&mut m, 3, false);
            assert_eq!(find_clear(&m, 100, 256), Some(200));
            assert_eq!(find_clear(&m, 201, 256), Some(3));
            assert_eq!(count_set(&m, 256), 254);
        }
    }
}

/// CRC32C of `data`, the checksum of every checksummed structure.
pub fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}
