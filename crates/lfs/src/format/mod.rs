//! The on-disk format of cairn's log-structured file system, version 2 (docs/FORMAT.md, "The
//! cairn LFS on-disk format"). Codecs only, no I/O: every `decode` checks bounds, magic and
//! checksum and returns [`FormatError`] (one line) on hostile bytes; nothing here panics.
//!
//! The structures are 004's Table I:
//!
//! | structure | where | module |
//! | --- | --- | --- |
//! | superblock | block 0 (fixed) | [`superblock`] |
//! | checkpoint region ×2 | fixed, after the superblock | [`checkpoint`] |
//! | segment summary | first block of each partial segment (log) | [`summary`] |
//! | inode | inode blocks in the log | [`inode`] |
//! | inode map | blocks in the log, named by the checkpoint | [`tables`] |
//! | segment usage table | blocks in the log, named by the checkpoint | [`tables`] |
//! | directory operation log | blocks in the log | [`dirlog`] |
//! | directory blocks | file data of directories | `cairn_dir::block` (shared with FFS) |

pub mod checkpoint;
pub mod dirlog;
pub mod inode;
pub mod summary;
pub mod superblock;
pub mod tables;

pub use cairn_dir::{FResult, FormatError};

/// The only block size.
pub const BLOCK_SIZE: usize = 4096;
/// Block addresses are absolute block numbers on the device; 0 (the superblock) never
/// names a block of the log, so 0 means "none".
pub const NO_BLOCK: u64 = 0;

pub(crate) fn corrupt<T>(msg: impl Into<String>) -> FResult<T> {
    Err(FormatError(msg.into()))
}

pub(crate) fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

// Little-endian field access. Callers check the buffer length once (every structure has a
// fixed size checked at the top of its decoder), so these index within bounds.
pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap_or([0; 4]))
}
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap_or([0; 8]))
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

/// Checks that `b` is at least `len` bytes, naming the structure otherwise.
pub(crate) fn need(b: &[u8], len: usize, what: &str) -> FResult<()> {
    if b.len() < len {
        return corrupt(format!("{what}: {} bytes, need {len}", b.len()));
    }
    Ok(())
}

#[cfg(test)]
mod fuzz {
    //! Every decoder on arbitrary bytes, and on valid blocks with arbitrary bytes flipped:
    //! an error or a value, never a panic.
    use super::*;
    use proptest::prelude::*;

    fn all_decoders(b: &[u8]) {
        let _ = superblock::Superblock::decode(b, u64::MAX);
        let _ = summary::Summary::decode(b, 128, 1000);
        let _ = tables::decode_imap(b, 0);
        let _ = tables::decode_usage(b, 0);
        let _ = inode::decode_block(b);
        let _ = inode::find_in_block(b, 3);
        let _ = dirlog::decode(b);
        let imap_blocks = tables::imap_blocks_for(1000);
        let usage_blocks = tables::usage_blocks_for(10);
        let cp_blocks = checkpoint::region_blocks(imap_blocks, usage_blocks);
        let sb = superblock::Superblock {
            version: superblock::VERSION,
            total_blocks: 1 + 2 * cp_blocks as u64 + 1280,
            segment_blocks: 128,
            segments: 10,
            first_segment: 1 + 2 * cp_blocks as u64,
            cp_blocks,
            max_inodes: 1000,
            imap_blocks,
            usage_blocks,
            created: 0,
            label: String::new(),
        };
        let _ = checkpoint::Checkpoint::decode(b, &sb);
    }

    /// A valid block of each kind, with magic and checksum right, to mutate.
    fn valid_blocks() -> Vec<Vec<u8>> {
        let s = summary::Summary {
            serial: 1,
            data_crc: 0,
            data_hash: 0,
            next_seg: 1,
            flags: 0,
            time_ns: 0,
            seg: 0,
            off: 0,
            entries: vec![
                summary::Entry {
                    kind: summary::Kind::Data,
                    version: 1,
                    ino: 3,
                    lbn: 0
                };
                20
            ],
        };
        let n = inode::Inode {
            ino: 3,
            mode: 0o100644,
            ..Default::default()
        };
        vec![
            s.encode(),
            tables::encode_imap(0, &[]),
            tables::encode_usage(0, &[]),
            inode::encode_block(&[&n]),
            dirlog::encode(&[dirlog::Record {
                op: dirlog::Op::Create,
                rename_half: false,
                nlink: 1,
                dir: 2,
                ino: 3,
                name: b"x".to_vec(),
            }])
            .remove(0),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..9000)) {
            all_decoders(&b);
        }

        #[test]
        fn mutated_valid_blocks(which in 0usize..5, flips in proptest::collection::vec((0usize..4096, any::<u8>()), 1..8)) {
            let mut b = valid_blocks().remove(which);
            for (at, v) in flips {
                b[at] = v;
            }
            all_decoders(&b);
        }
    }
}
