//! Superblock, geometry and group descriptors.
//!
//! Layout of the device (block size B, `bpg` blocks per group):
//! group g occupies blocks `[g*bpg, (g+1)*bpg)` (the last group may be shorter) and starts with
//!   +0 superblock copy (group 0: the primary)
//!   +1 group descriptor
//!   +2 block bitmap (bit i = block g*bpg+i in use)
//!   +3 inode bitmap (bit i = inode g*ipg+i in use)
//!   +4 inode table, `ipg * 256 / B` blocks
//!   then data blocks.

use super::*;

pub const SB_MAGIC: [u8; 8] = *b"CAIRNFFS";
pub const GD_MAGIC: [u8; 4] = *b"CGRP";
/// Bytes of a block that the superblock / descriptor occupy (the rest of the block is zero).
pub const SB_BYTES: usize = 512;

/// Whether `b` starts with a cairn FFS superblock's magic: the test that tells "not a cairn
/// file system" apart from "a damaged one".
pub fn has_magic(b: &[u8]) -> bool {
    b.len() >= SB_MAGIC.len() && b[..SB_MAGIC.len()] == SB_MAGIC
}

/// Superblock state values.
pub const STATE_CLEAN: u32 = 0;
pub const STATE_MOUNTED: u32 = 1;
pub const STATE_ERRORS: u32 = 2;

/// `feature_compat`: the device holds a journal log area after the last group
/// (`journal_first`, `journal_blocks`). Compatible: a reader that ignores it never touches
/// those blocks, and a journaled mount that crashed leaves `state` mounted, which such a
/// reader refuses until fsck (or the journal) has run.
pub const FEATURE_COMPAT_JOURNAL: u32 = 1;

/// `feature_incompat`: an inode's extended attributes may span a chain of blocks
/// (`xattr::CHAIN_MAGIC`, docs/FORMAT.md). Incompatible: a reader that knows only the
/// one-block form would read the chain's head as damage. Set the first time an inode's
/// attributes outgrow one block (mkfs does not set it: an image that never needs a chain
/// stays readable by a cairn from before chains).
pub const FEATURE_INCOMPAT_XATTR_CHAIN: u32 = 1;
/// Every `feature_incompat` bit this build reads.
pub const FEATURE_INCOMPAT_KNOWN: u32 = FEATURE_INCOMPAT_XATTR_CHAIN;

/// The superblock. Dynamic fields (free counts, state, times) are exact in the primary copy
/// only after a clean unmount; the group descriptors are authoritative while mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    // 0   magic "CAIRNFFS"           [u8; 8]
    // 8   version                    u32
    pub version: u32,
    // 12  block_size                 u32
    pub block_size: u32,
    // 16  total_blocks               u64
    pub total_blocks: u64,
    // 24  blocks_per_group           u32
    pub blocks_per_group: u32,
    // 28  inodes_per_group           u32
    pub inodes_per_group: u32,
    // 32  group_count                u32
    pub group_count: u32,
    // 36  inode_size                 u32 (always 256)
    pub inode_size: u32,
    // 40  free_blocks                u64
    pub free_blocks: u64,
    // 48  free_inodes                u64
    pub free_inodes: u64,
    // 56  root_ino                   u64
    pub root_ino: u64,
    // 64  created_ns                 i64
    pub created_ns: i64,
    // 72  mounted_ns                 i64
    pub mounted_ns: i64,
    // 80  written_ns                 i64
    pub written_ns: i64,
    // 88  state                      u32 (0 clean, 1 mounted, 2 errors)
    pub state: u32,
    // 92  mount_count                u32
    pub mount_count: u32,
    // 96  uuid                       [u8; 16]
    pub uuid: [u8; 16],
    // 112 label                      [u8; 64], NUL-padded UTF-8
    pub label: String,
    // 176 last_mode                  [u8; 16], NUL-padded ("sync", "async", ...)
    pub last_mode: String,
    // 192 feature_compat             u32
    pub feature_compat: u32,
    // 196 feature_incompat           u32 (a reader refuses unknown bits)
    pub feature_incompat: u32,
    // 200 feature_ro_compat          u32 (unknown bits: mount read-only only)
    pub feature_ro_compat: u32,
    // 204 reserved                   u32
    // 208 dirs                       u64
    pub dirs: u64,
    // 216 journal_first              u64 (FEATURE_COMPAT_JOURNAL: first block of the log area)
    pub journal_first: u64,
    // 224 journal_blocks             u64 (FEATURE_COMPAT_JOURNAL: blocks of the log area)
    pub journal_blocks: u64,
    // 232 reserved up to 508
    // 508 crc32c of bytes 0..508     u32
}

fn put_str(b: &mut [u8], off: usize, len: usize, s: &str) {
    let bytes = s.as_bytes();
    let n = bytes.len().min(len);
    b[off..off + len].fill(0);
    b[off..off + n].copy_from_slice(&bytes[..n]);
}

fn get_str(b: &[u8], off: usize, len: usize) -> String {
    let raw = &b[off..off + len];
    let end = raw.iter().position(|&c| c == 0).unwrap_or(len);
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

impl Superblock {
    pub fn encode(&self, b: &mut [u8]) {
        b[..SB_BYTES].fill(0);
        b[0..8].copy_from_slice(&SB_MAGIC);
        put_u32(b, 8, self.version);
        put_u32(b, 12, self.block_size);
        put_u64(b, 16, self.total_blocks);
        put_u32(b, 24, self.blocks_per_group);
        put_u32(b, 28, self.inodes_per_group);
        put_u32(b, 32, self.group_count);
        put_u32(b, 36, self.inode_size);
        put_u64(b, 40, self.free_blocks);
        put_u64(b, 48, self.free_inodes);
        put_u64(b, 56, self.root_ino);
        put_i64(b, 64, self.created_ns);
        put_i64(b, 72, self.mounted_ns);
        put_i64(b, 80, self.written_ns);
        put_u32(b, 88, self.state);
        put_u32(b, 92, self.mount_count);
        b[96..112].copy_from_slice(&self.uuid);
        put_str(b, 112, 64, &self.label);
        put_str(b, 176, 16, &self.last_mode);
        put_u32(b, 192, self.feature_compat);
        put_u32(b, 196, self.feature_incompat);
        put_u32(b, 200, self.feature_ro_compat);
        put_u64(b, 208, self.dirs);
        put_u64(b, 216, self.journal_first);
        put_u64(b, 224, self.journal_blocks);
        let c = crc(&b[..508]);
        put_u32(b, 508, c);
    }

    /// Decodes and validates a superblock. Checks, in order: length, magic, version,
    /// checksum, then geometry (so the message names the most basic problem).
    pub fn decode(b: &[u8]) -> FResult<Superblock> {
        if b.len() < SB_BYTES {
            return corrupt(format!(
                "image too small to hold a superblock ({} bytes)",
                b.len()
            ));
        }
        if b[0..8] != SB_MAGIC {
            return corrupt("bad magic (not a cairn file system)");
        }
        let version = get_u32(b, 8);
        if version > FORMAT_VERSION {
            return corrupt(format!(
                "format version {version} is newer than this cairn supports ({FORMAT_VERSION})"
            ));
        }
        if version == 0 {
            return corrupt("format version 0 is invalid");
        }
        if crc(&b[..508]) != get_u32(b, 508) {
            return corrupt("superblock checksum mismatch");
        }
        let sb = Superblock {
            version,
            block_size: get_u32(b, 12),
            total_blocks: get_u64(b, 16),
            blocks_per_group: get_u32(b, 24),
            inodes_per_group: get_u32(b, 28),
            group_count: get_u32(b, 32),
            inode_size: get_u32(b, 36),
            free_blocks: get_u64(b, 40),
            free_inodes: get_u64(b, 48),
            root_ino: get_u64(b, 56),
            created_ns: get_i64(b, 64),
            mounted_ns: get_i64(b, 72),
            written_ns: get_i64(b, 80),
            state: get_u32(b, 88),
            mount_count: get_u32(b, 92),
            uuid: b[96..112].try_into().expect("16 bytes"),
            label: get_str(b, 112, 64),
            last_mode: get_str(b, 176, 16),
            feature_compat: get_u32(b, 192),
            feature_incompat: get_u32(b, 196),
            feature_ro_compat: get_u32(b, 200),
            dirs: get_u64(b, 208),
            journal_first: get_u64(b, 216),
            journal_blocks: get_u64(b, 224),
        };
        sb.geometry()?;
        sb.journal_area()?;
        if sb.feature_incompat & !FEATURE_INCOMPAT_KNOWN != 0 {
            return corrupt(format!(
                "unknown incompatible features {:#x}",
                sb.feature_incompat & !FEATURE_INCOMPAT_KNOWN
            ));
        }
        Ok(sb)
    }

    /// The log area of `mode=journal,log=file` (first block, blocks): the blocks after the
    /// last group, outside every group, so nothing else ever allocates or checks them. None
    /// without [`FEATURE_COMPAT_JOURNAL`]; the fields must then be 0.
    pub fn journal_area(&self) -> FResult<Option<(u64, u64)>> {
        if self.feature_compat & FEATURE_COMPAT_JOURNAL == 0 {
            if self.journal_first != 0 || self.journal_blocks != 0 {
                return corrupt("journal area fields set without the journal feature");
            }
            return Ok(None);
        }
        if self.journal_first < self.total_blocks
            || self.journal_blocks == 0
            || self
                .journal_first
                .checked_add(self.journal_blocks)
                .is_none()
        {
            return corrupt(format!(
                "bad journal area: blocks {}..+{} (the file system ends at {})",
                self.journal_first, self.journal_blocks, self.total_blocks
            ));
        }
        Ok(Some((self.journal_first, self.journal_blocks)))
    }

    /// Validates the geometry fields and derives the layout.
    pub fn geometry(&self) -> FResult<Geometry> {
        let bs = self.block_size;
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) || !bs.is_power_of_two() {
            return corrupt(format!("bad block size {bs}"));
        }
        if self.inode_size != INODE_SIZE as u32 {
            return corrupt(format!("bad inode size {}", self.inode_size));
        }
        let bits = bs as u64 * 8;
        let bpg = self.blocks_per_group as u64;
        let ipg = self.inodes_per_group as u64;
        let ipb = bs as u64 / INODE_SIZE as u64;
        if bpg == 0 || bpg > bits || ipg == 0 || ipg > bits || !ipg.is_multiple_of(ipb) {
            return corrupt(format!(
                "bad group geometry (blocks/group {bpg}, inodes/group {ipg})"
            ));
        }
        let itb = ipg / ipb;
        if 4 + itb + 1 > bpg {
            return corrupt("inode table does not fit in a group");
        }
        let groups = self.group_count as u64;
        if groups == 0
            || self.total_blocks <= (groups - 1) * bpg
            || self.total_blocks > groups * bpg
        {
            return corrupt(format!(
                "group count {groups} does not match {} blocks of {bpg} per group",
                self.total_blocks
            ));
        }
        let last_len = self.total_blocks - (groups - 1) * bpg;
        if last_len < 4 + itb + 1 {
            return corrupt("last group too small for its metadata");
        }
        if self.root_ino != ROOT_INO {
            return corrupt(format!("bad root inode number {}", self.root_ino));
        }
        Ok(Geometry {
            block_size: bs,
            total_blocks: self.total_blocks,
            blocks_per_group: bpg,
            inodes_per_group: ipg,
            group_count: groups,
            inode_table_blocks: itb,
        })
    }
}

/// Derived layout. All block and inode arithmetic goes through here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u32,
    pub total_blocks: u64,
    pub blocks_per_group: u64,
    pub inodes_per_group: u64,
    pub group_count: u64,
    pub inode_table_blocks: u64,
}

impl Geometry {
    pub fn bs(&self) -> usize {
        self.block_size as usize
    }
    pub fn group_start(&self, g: u64) -> u64 {
        g * self.blocks_per_group
    }
    /// Blocks in group g (the last may be short).
    pub fn group_len(&self, g: u64) -> u64 {
        (self.total_blocks - self.group_start(g)).min(self.blocks_per_group)
    }
    pub fn sb_block(&self, g: u64) -> u64 {
        self.group_start(g)
    }
    pub fn desc_block(&self, g: u64) -> u64 {
        self.group_start(g) + 1
    }
    pub fn block_bitmap(&self, g: u64) -> u64 {
        self.group_start(g) + 2
    }
    pub fn inode_bitmap(&self, g: u64) -> u64 {
        self.group_start(g) + 3
    }
    pub fn inode_table(&self, g: u64) -> u64 {
        self.group_start(g) + 4
    }
    /// First block of group g available for data.
    pub fn first_data(&self, g: u64) -> u64 {
        self.inode_table(g) + self.inode_table_blocks
    }
    /// Blocks of metadata at the start of every group.
    pub fn meta_blocks(&self) -> u64 {
        4 + self.inode_table_blocks
    }
    pub fn total_inodes(&self) -> u64 {
        self.group_count * self.inodes_per_group
    }
    pub fn inodes_per_block(&self) -> u64 {
        self.block_size as u64 / INODE_SIZE as u64
    }
    pub fn group_of_block(&self, b: u64) -> u64 {
        b / self.blocks_per_group
    }
    pub fn group_of_ino(&self, ino: u64) -> u64 {
        ino / self.inodes_per_group
    }
    /// Is `ino` a number an inode can have (not 0, not reserved 1, within the tables)?
    pub fn valid_ino(&self, ino: u64) -> bool {
        ino >= ROOT_INO && ino < self.total_inodes()
    }
    /// The block holding inode `ino` and the byte offset inside it.
    pub fn inode_location(&self, ino: u64) -> (u64, usize) {
        let g = self.group_of_ino(ino);
        let idx = ino % self.inodes_per_group;
        let blk = self.inode_table(g) + idx / self.inodes_per_block();
        (blk, ((idx % self.inodes_per_block()) as usize) * INODE_SIZE)
    }
    /// Is `b` a block that may be pointed to by an inode (in range, not group metadata)?
    pub fn is_data_block(&self, b: u64) -> bool {
        if b >= self.total_blocks {
            return false;
        }
        let g = self.group_of_block(b);
        b >= self.first_data(g)
    }
    /// Pointers per indirect block.
    pub fn ptrs_per_block(&self) -> u64 {
        self.block_size as u64 / 8
    }
    /// The indirect blocks a file of `n` data blocks from offset 0 needs: the single,
    /// double and triple trees filled in order, each tree's top block included.
    pub fn indirect_blocks_for(&self, n: u64) -> u64 {
        let p = self.ptrs_per_block();
        let mut left = n.saturating_sub(NDIRECT as u64);
        let mut blocks = 0;
        // (data blocks the tree maps, its index blocks below the top per data block level)
        for level in 1..=3u32 {
            if left == 0 {
                break;
            }
            let span = p.saturating_pow(level);
            let here = left.min(span);
            // The top block, then at each lower level one block per p^k data blocks.
            blocks += 1;
            for k in 1..level {
                blocks += here.div_ceil(p.saturating_pow(k));
            }
            left -= here;
        }
        blocks
    }
    /// A lower bound on the indirect blocks any `n` data blocks of one file need: an
    /// indirect block holds at most `ptrs_per_block` pointers to data, and only the
    /// NDIRECT direct pointers need none.
    pub fn min_indirect_blocks(&self, n: u64) -> u64 {
        n.saturating_sub(NDIRECT as u64)
            .div_ceil(self.ptrs_per_block())
    }
    /// Largest file size the block tree can address (and that fits in i64 offsets).
    pub fn max_file_size(&self) -> u64 {
        let p = self.ptrs_per_block() as u128;
        let blocks = NDIRECT as u128 + p + p * p + p * p * p;
        let bytes = blocks * self.block_size as u128;
        bytes.min(i64::MAX as u128) as u64
    }

    /// Computes a geometry for mkfs.
    pub fn for_mkfs(
        block_size: u32,
        total_blocks: u64,
        inodes: Option<u64>,
        bpg: Option<u64>,
    ) -> FResult<Geometry> {
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) || !block_size.is_power_of_two()
        {
            return corrupt(format!(
                "block size must be a power of two from 4096 to 65536, not {block_size}"
            ));
        }
        let bits = block_size as u64 * 8;
        let bpg = bpg.unwrap_or(bits).clamp(64, bits);
        let ipb = block_size as u64 / INODE_SIZE as u64;
        let mut groups = total_blocks.div_ceil(bpg);
        let want_inodes = inodes
            .unwrap_or((total_blocks * block_size as u64) / 16384)
            .max(16);
        let mut ipg = want_inodes.div_ceil(groups.max(1)).div_ceil(ipb) * ipb;
        ipg = ipg.clamp(ipb, bits.min(((bpg - 5) / 2) * ipb).max(ipb) / ipb * ipb);
        let itb = ipg / ipb;
        let mut total = total_blocks;
        // Drop a last group too small to hold its own metadata plus a few data blocks.
        let last_len = total - (groups - 1) * bpg;
        if last_len < 4 + itb + 16 {
            if groups == 1 {
                return corrupt(format!(
                    "{total_blocks} blocks are too few for a file system"
                ));
            }
            groups -= 1;
            total = groups * bpg;
        }
        Ok(Geometry {
            block_size,
            total_blocks: total,
            blocks_per_group: bpg,
            inodes_per_group: ipg,
            group_count: groups,
            inode_table_blocks: itb,
        })
    }
}

/// A group descriptor: the group's summary counts. The bitmaps beside it are authoritative
/// for allocation; these counts are a summary fsck recomputes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupDesc {
    // 0   magic "CGRP"     [u8; 4]
    // 4   version          u32
    // 8   group            u32
    pub group: u32,
    // 12  free_blocks      u32
    pub free_blocks: u32,
    // 16  free_inodes      u32
    pub free_inodes: u32,
    // 20  dirs             u32
    pub dirs: u32,
    // 24  reserved to 508
    // 508 crc32c of 0..508 u32
}

impl GroupDesc {
    pub fn encode(&self, b: &mut [u8]) {
        b[..SB_BYTES].fill(0);
        b[0..4].copy_from_slice(&GD_MAGIC);
        put_u32(b, 4, FORMAT_VERSION);
        put_u32(b, 8, self.group);
        put_u32(b, 12, self.free_blocks);
        put_u32(b, 16, self.free_inodes);
        put_u32(b, 20, self.dirs);
        let c = crc(&b[..508]);
        put_u32(b, 508, c);
    }

    pub fn decode(b: &[u8], expect_group: u64) -> FResult<GroupDesc> {
        if b.len() < SB_BYTES || b[0..4] != GD_MAGIC {
            return corrupt(format!("group {expect_group}: bad descriptor magic"));
        }
        if crc(&b[..508]) != get_u32(b, 508) {
            return corrupt(format!(
                "group {expect_group}: descriptor checksum mismatch"
            ));
        }
        let d = GroupDesc {
            group: get_u32(b, 8),
            free_blocks: get_u32(b, 12),
            free_inodes: get_u32(b, 16),
            dirs: get_u32(b, 20),
        };
        if d.group as u64 != expect_group {
            return corrupt(format!(
                "group {expect_group}: descriptor says group {}",
                d.group
            ));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        let g = Geometry::for_mkfs(4096, 65536, None, None).unwrap();
        Superblock {
            version: 1,
            block_size: 4096,
            total_blocks: g.total_blocks,
            blocks_per_group: g.blocks_per_group as u32,
            inodes_per_group: g.inodes_per_group as u32,
            group_count: g.group_count as u32,
            inode_size: 256,
            free_blocks: 1,
            free_inodes: 2,
            root_ino: 2,
            created_ns: 3,
            mounted_ns: 4,
            written_ns: 5,
            state: 0,
            mount_count: 6,
            uuid: [7; 16],
            label: "lbl".into(),
            last_mode: "sync".into(),
            feature_compat: 0,
            feature_incompat: 0,
            feature_ro_compat: 0,
            journal_first: 0,
            journal_blocks: 0,
            dirs: 9,
        }
    }

    /// The indirect blocks of a file filled from offset 0, at each tree's edges (4 KiB
    /// blocks: 512 pointers each).
    #[test]
    fn indirect_blocks_of_a_file() {
        let g = Geometry::for_mkfs(4096, 65536, None, None).unwrap();
        let (d, p) = (NDIRECT as u64, 512u64);
        for (n, want) in [
            (0, 0),
            (d, 0),
            (d + 1, 1),
            (d + p, 1),
            // The double tree: its top and one single block under it.
            (d + p + 1, 3),
            (d + p + p, 3),
            (d + p + p + 1, 4),
            (d + p + p * p, 2 + p),
            // The triple tree: its top, a double block, a single block.
            (d + p + p * p + 1, 2 + p + 3),
        ] {
            assert_eq!(g.indirect_blocks_for(n), want, "{n} data blocks");
            assert!(
                g.min_indirect_blocks(n) <= want,
                "{n}: the bound is a lower bound"
            );
        }
    }

    #[test]
    fn roundtrip_and_checks() {
        let sb = sample();
        let mut b = vec![0u8; 4096];
        sb.encode(&mut b);
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(Superblock::decode(&bad).unwrap_err().0.contains("magic"));
        let mut bad = b.clone();
        bad[20] ^= 1;
        assert!(Superblock::decode(&bad).unwrap_err().0.contains("checksum"));
        let mut newer = sample();
        newer.version = 2;
        newer.encode(&mut bad);
        assert!(Superblock::decode(&bad).unwrap_err().0.contains("newer"));
        assert!(Superblock::decode(&b[..100]).is_err());
    }

    #[test]
    fn journal_area_fields_need_the_feature_and_lie_after_the_groups() {
        let mut b = vec![0u8; 4096];
        let mut sb = sample();
        assert_eq!(sb.journal_area().unwrap(), None);
        sb.feature_compat = FEATURE_COMPAT_JOURNAL;
        sb.journal_first = sb.total_blocks;
        sb.journal_blocks = 66;
        sb.encode(&mut b);
        assert_eq!(&b[216..224], &sb.total_blocks.to_le_bytes());
        assert_eq!(&b[224..232], &66u64.to_le_bytes());
        let back = Superblock::decode(&b).unwrap();
        assert_eq!(back.journal_area().unwrap(), Some((sb.total_blocks, 66)));
        let mut inside = sb.clone();
        inside.journal_first = sb.total_blocks - 1;
        inside.encode(&mut b);
        assert!(
            Superblock::decode(&b)
                .unwrap_err()
                .0
                .contains("journal area")
        );
        let mut no_flag = sb.clone();
        no_flag.feature_compat = 0;
        no_flag.encode(&mut b);
        assert!(Superblock::decode(&b).unwrap_err().0.contains("journal"));
    }

    #[test]
    fn geometry_layout() {
        let g = Geometry::for_mkfs(4096, 100_000, None, None).unwrap();
        assert_eq!(g.blocks_per_group, 32768);
        assert_eq!(g.group_count, 4);
        assert!(g.inode_location(2).0 == g.inode_table(0));
        let (blk, off) = g.inode_location(g.inodes_per_group + 17);
        assert_eq!(blk, g.inode_table(1) + 1);
        assert_eq!(off, 256);
        assert!(!g.is_data_block(g.inode_table(1)));
        assert!(g.is_data_block(g.first_data(1)));
        assert!(!g.is_data_block(g.total_blocks));
        assert!(g.max_file_size() > 1 << 39);
    }

    #[test]
    fn tiny_last_group_dropped() {
        let g = Geometry::for_mkfs(4096, 32768 + 10, None, None).unwrap();
        assert_eq!(g.group_count, 1);
        assert_eq!(g.total_blocks, 32768);
        assert!(Geometry::for_mkfs(4096, 10, None, None).is_err());
        assert!(Geometry::for_mkfs(3000, 100000, None, None).is_err());
    }
}
