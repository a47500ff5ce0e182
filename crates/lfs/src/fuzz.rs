//! Fuzz-target bodies for the LFS decoders (issue 13, "Bad input"). The cargo-fuzz targets
//! `lfs_*` in `fuzz/` call these; the seeded tests below run the same bodies on stable in
//! CI. Every body's property: decoding never panics, and what decodes re-encodes to bytes
//! that decode to the same value. Checksummed blocks get their checksum fixed up first, so
//! the fuzzer reaches the field checks behind it instead of stopping at the CRC.

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};

use crate::format::superblock::Superblock;
use crate::format::{BLOCK_SIZE, checkpoint, crc, dirlog, inode, put_u32, summary, tables};
use crate::mkfs::{MkfsOptions, geometry};

/// Every body on the same input.
pub fn all(data: &[u8]) {
    superblock(data);
    checkpoint(data);
    summary(data);
    tables(data);
    inode_block(data);
    dirlog(data);
    image(data);
}

/// A block of `data` (zero-padded or cut to one block).
fn block(data: &[u8]) -> Vec<u8> {
    let mut b = data[..data.len().min(BLOCK_SIZE)].to_vec();
    b.resize(BLOCK_SIZE, 0);
    b
}

/// The geometry every body decodes against: 8 MiB of 64 KiB segments.
fn geo() -> Superblock {
    geometry(
        2048,
        &MkfsOptions {
            segment_size: 64 << 10,
            ..Default::default()
        },
    )
    .expect("a valid geometry")
}

/// Superblock: no panic; a decoded one re-encodes to itself and its regions lie inside the
/// device.
pub fn superblock(data: &[u8]) {
    let mut b = block(data);
    let _ = Superblock::decode(&b, 2048);
    // Its CRC32C covers bytes 0..124 and sits at 124.
    let c = crc(&b[..124]);
    put_u32(&mut b, 124, c);
    let Ok(sb) = Superblock::decode(&b, 2048) else {
        return;
    };
    assert!(sb.total_blocks <= 2048);
    assert_eq!(
        Superblock::decode(&sb.encode(), 2048).expect("re-decode"),
        sb
    );
}

/// Checkpoint region (CRC in its last 4 bytes, fixed up): no panic; a decoded one
/// re-encodes to itself; `choose` of it and garbage picks it.
pub fn checkpoint(data: &[u8]) {
    let sb = geo();
    let len = sb.cp_blocks as usize * BLOCK_SIZE;
    let mut b = data[..data.len().min(len)].to_vec();
    b.resize(len, 0);
    let _ = checkpoint::Checkpoint::decode(&b, &sb);
    let c = crc(&b[..len - 4]);
    put_u32(&mut b, len - 4, c);
    let Ok(cp) = checkpoint::Checkpoint::decode(&b, &sb) else {
        return;
    };
    let back = checkpoint::Checkpoint::decode(&cp.encode(sb.cp_blocks), &sb).expect("re-decode");
    assert_eq!(back, cp);
    let (slot, chosen) = checkpoint::choose(
        Ok(cp.clone()),
        checkpoint::Checkpoint::decode(&[0u8; 8], &sb),
    )
    .expect("one valid region");
    assert_eq!((slot, chosen), (0, cp));
}

/// Segment summary (CRC at byte 4 over the block with it zero, fixed up): no panic; a
/// decoded one re-encodes to itself.
pub fn summary(data: &[u8]) {
    let sb = geo();
    let mut b = block(data);
    let _ = summary::Summary::decode(&b, sb.segment_blocks, sb.segments);
    put_u32(&mut b, 4, 0);
    let c = crc(&b);
    put_u32(&mut b, 4, c);
    let Ok(s) = summary::Summary::decode(&b, sb.segment_blocks, sb.segments) else {
        return;
    };
    let back =
        summary::Summary::decode(&s.encode(), sb.segment_blocks, sb.segments).expect("re-decode");
    assert_eq!(back, s);
}

/// Inode map and usage table blocks (CRC at byte 8, fixed up): no panic; round trips.
pub fn tables(data: &[u8]) {
    let mut b = block(data);
    let _ = tables::decode_imap(&b, 0);
    put_u32(&mut b, 8, 0);
    let c = crc(&b);
    put_u32(&mut b, 8, c);
    let index = u32::from(data.first().copied().unwrap_or(0) & 3);
    if let Ok(map) = tables::decode_imap(&b, index) {
        let mut whole =
            vec![tables::ImapEntry::default(); tables::PER_BLOCK * (index as usize + 1)];
        whole[index as usize * tables::PER_BLOCK..].copy_from_slice(&map);
        let back = tables::decode_imap(&tables::encode_imap(index, &whole), index);
        assert_eq!(back.expect("re-decode"), map);
    }
    if let Ok(usage) = tables::decode_usage(&b, index) {
        let mut whole =
            vec![tables::UsageEntry::default(); tables::PER_BLOCK * (index as usize + 1)];
        whole[index as usize * tables::PER_BLOCK..].copy_from_slice(&usage);
        let back = tables::decode_usage(&tables::encode_usage(index, &whole), index);
        assert_eq!(back.expect("re-decode"), usage);
    }
}

/// Inode block: no panic; the decoded inodes re-encode to a block that decodes the same.
pub fn inode_block(data: &[u8]) {
    let b = block(data);
    let Ok(inodes) = inode::decode_block(&b) else {
        return;
    };
    let refs: Vec<&inode::Inode> = inodes.iter().collect();
    let back = inode::decode_block(&inode::encode_block(&refs)).expect("re-decode");
    assert_eq!(back, inodes);
}

/// Directory-operation log block: no panic; decoded records re-encode to blocks that
/// decode to the same records.
pub fn dirlog(data: &[u8]) {
    let b = block(data);
    let Ok(recs) = dirlog::decode(&b) else {
        return;
    };
    let back: Vec<dirlog::Record> = dirlog::encode(&recs)
        .iter()
        .flat_map(|blk| dirlog::decode(blk).expect("re-decode"))
        .collect();
    assert_eq!(back, recs);
}

/// A small valid image (a few files, a checkpoint, a committed flush after it).
pub(crate) fn base_image() -> &'static [u8] {
    static IMG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    IMG.get_or_init(|| {
        use cairn_vfs::{Ctx, FileSystem};
        let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 512));
        crate::mkfs_device(
            dev.clone(),
            &MkfsOptions {
                segment_size: 64 << 10,
                ..Default::default()
            },
        )
        .expect("mkfs");
        let o = crate::MountOptions {
            syncer: false,
            ..Default::default()
        };
        let fs = crate::Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &o).expect("mount");
        let c = Ctx::root();
        let root = fs.root_ino();
        let d = fs
            .mkdir(&c, root, std::ffi::OsStr::new("d"), 0o755, 0)
            .expect("mkdir");
        for (i, len) in [10usize, 5000, 70_000].iter().enumerate() {
            let name = format!("f{i}");
            let (a, fh) = fs
                .create(
                    &c,
                    d.ino,
                    std::ffi::OsStr::new(&name),
                    0o644,
                    0,
                    libc::O_RDWR,
                )
                .expect("create");
            fs.write(a.ino, fh, 0, &vec![i as u8 + 1; *len])
                .expect("write");
            fs.release(a.ino, fh).expect("release");
        }
        fs.checkpoint().expect("checkpoint");
        fs.symlink(&c, root, std::ffi::OsStr::new("s"), b"d/f0")
            .expect("symlink");
        fs.fsync(root, 0, false).expect("fsync");
        dev.to_bytes()
    })
}

/// A damaged image: the input is a list of (block, offset, byte) patches (5 bytes each)
/// over the base image. The check and a read-only mount's walk finish without a panic,
/// whatever they find; a repair does too.
pub fn image(data: &[u8]) {
    let mut img = base_image().to_vec();
    let blocks = img.len() / BLOCK_SIZE;
    for p in data.chunks_exact(5).take(64) {
        let blk = u16::from_le_bytes([p[0], p[1]]) as usize % blocks;
        let off = u16::from_le_bytes([p[2], p[3]]) as usize % BLOCK_SIZE;
        img[blk * BLOCK_SIZE + off] ^= p[4].max(1);
    }
    let dev = Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, img));
    let _ = crate::check::check_device(dev.clone() as Arc<dyn BlockDevice>);
    let _ = crate::check::repair_device(dev as Arc<dyn BlockDevice>);
}

#[cfg(test)]
mod tests {
    //! The bodies on seeded mutations of valid encodings and on junk (stable; CI runs these).
    use super::*;

    /// xorshift64*: deterministic in its seed, no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn seed(name: &str) -> Rng {
        let s = std::env::var("CAIRN_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x9E37_79B9_7F4A_7C15);
        println!("{name}: seed {s} (CAIRN_FUZZ_SEED to replay)");
        Rng(s | 1)
    }

    /// The valid encoding, then `n` copies with a few bytes changed, and junk.
    fn mutate(rng: &mut Rng, valid: &[u8], n: usize, body: impl Fn(&[u8])) {
        body(valid);
        for _ in 0..n {
            let mut v = valid.to_vec();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            body(&v);
            let junk: Vec<u8> = (0..rng.below(valid.len() + 64))
                .map(|_| rng.next() as u8)
                .collect();
            body(&junk);
        }
    }

    fn blk(n: usize) -> &'static [u8] {
        &base_image()[n * BLOCK_SIZE..(n + 1) * BLOCK_SIZE]
    }

    #[test]
    fn decoders_survive_mutations_and_junk() {
        let mut rng = seed("lfs decoders");
        let sb = geo();
        mutate(&mut rng, blk(0), 1000, superblock);
        let cp = &base_image()[BLOCK_SIZE..BLOCK_SIZE * (1 + sb.cp_blocks as usize)];
        mutate(&mut rng, cp, 1000, checkpoint);
        // Every block of the image through the block decoders: summaries, inode blocks,
        // directory-log blocks, table blocks, data.
        for n in 0..base_image().len() / BLOCK_SIZE {
            let b = blk(n);
            if b.iter().all(|&x| x == 0) {
                continue;
            }
            mutate(&mut rng, b, 20, |d| {
                summary(d);
                tables(d);
                inode_block(d);
                dirlog(d);
            });
        }
    }

    #[test]
    fn damaged_images_are_checked_without_panic() {
        let mut rng = seed("lfs image");
        image(&[]);
        let blocks = base_image().len() / BLOCK_SIZE;
        // Blocks that hold something: the patches go where they matter.
        let used: Vec<usize> = (0..blocks)
            .filter(|&n| blk(n).iter().any(|&x| x != 0))
            .collect();
        for _ in 0..150 {
            let mut patch = Vec::new();
            for _ in 0..1 + rng.below(6) {
                let b = used[rng.below(used.len())] as u16;
                let o = rng.below(BLOCK_SIZE) as u16;
                patch.extend_from_slice(&b.to_le_bytes());
                patch.extend_from_slice(&o.to_le_bytes());
                patch.push(rng.next() as u8);
            }
            image(&patch);
        }
    }
}
