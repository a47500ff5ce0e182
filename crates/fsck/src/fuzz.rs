//! Fuzz-target bodies. The cargo-fuzz targets in `fuzz/` call these; so do the seeded
//! tests below, which run on stable in CI. Each body states the property it checks: decoding
//! never panics, what decodes re-encodes to the same value, and fsck on a damaged image
//! terminates and, repairing, converges (a second run is clean).

use std::sync::OnceLock;

use cairn_ffs::format::{DiskInode, INODE_SIZE, Superblock, dir, xattr};

use crate::testimage::Image;
use crate::{CheckOptions, FsckError, check};

/// Superblock decoding: no panic; a decoded superblock has a valid geometry and re-encodes
/// to a block that decodes to the same value.
pub fn superblock(data: &[u8]) {
    let Ok(sb) = Superblock::decode(data) else {
        return;
    };
    let g = sb.geometry().expect("decode validated the geometry");
    assert!(g.total_inodes() > 0 && g.meta_blocks() < g.blocks_per_group + 1);
    let mut b = vec![0u8; 512];
    sb.encode(&mut b);
    assert_eq!(Superblock::decode(&b).expect("re-decode"), sb);
}

/// Inode decoding: the first 8 bytes are the inode number, the rest the 256 bytes.
pub fn inode(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let ino = u64::from_le_bytes(data[..8].try_into().expect("8"));
    let Ok(d) = DiskInode::decode(ino, &data[8..]) else {
        return;
    };
    let _ = d.root_pointers().count();
    let mut b = [0u8; INODE_SIZE];
    d.encode(ino, &mut b);
    let back = DiskInode::decode(ino, &b).expect("re-decode");
    // A free inode keeps only its generation; anything else must round-trip exactly.
    if d.is_free() {
        assert!(back.is_free() && back.generation == d.generation);
    } else {
        assert_eq!(back, d);
    }
}

/// Directory block parsing and editing: no panic, no infinite walk; edits of a valid chunk
/// keep it valid and keep other entries where they were.
pub fn dir_block(data: &[u8]) {
    let n = data.len() / dir::DIR_CHUNK * dir::DIR_CHUNK;
    let mut b = data[..n.min(8 * dir::DIR_CHUNK)].to_vec();
    let records = dir::records(&b).take(b.len()).count();
    assert!(records <= b.len() / 8 + 1);
    let _ = dir::entries(&b).count();
    if b.is_empty() || dir::validate(&b).is_err() {
        return;
    }
    let before: Vec<(usize, u32)> = dir::entries(&b).flatten().map(|e| (e.off, e.ino)).collect();
    let name = data.get(..(data.len() % 40).max(1)).unwrap_or(b"x");
    if let Ok(Some(off)) = dir::insert(&mut b, 0, 77, 8, name) {
        dir::validate(&b).expect("insert keeps the block valid");
        for (o, i) in &before {
            assert!(
                dir::entries(&b)
                    .flatten()
                    .any(|e| e.off == *o && e.ino == *i),
                "entry moved"
            );
        }
        dir::remove(&mut b, off).expect("remove what was inserted");
        dir::validate(&b).expect("remove keeps the block valid");
    }
}

/// Extended-attribute block decoding: no panic; what decodes re-encodes identically.
pub fn xattr_block(data: &[u8]) {
    let Ok(attrs) = xattr::decode(data) else {
        return;
    };
    let mut b = vec![0u8; data.len().max(16)];
    if xattr::encode(&attrs, &mut b) {
        assert_eq!(xattr::decode(&b).expect("re-decode"), attrs);
    }
}

/// An extended-attribute chain (`xattr::read_chain`): `data` cut into blocks of 4 KiB read
/// as inode 7's chain from its first; no panic, a bounded walk, and what decodes re-encodes
/// over the same blocks to a chain that reads back equal.
pub fn xattr_chain(data: &[u8]) {
    const BS: usize = 4096;
    let blocks: Vec<&[u8]> = data.chunks(BS).collect();
    if blocks.is_empty() {
        return;
    }
    let mut reads = 0;
    let r = xattr::read_chain(7, 1, |b| {
        reads += 1;
        assert!(reads <= xattr::CHAIN_MAX, "unbounded walk");
        let i = b.wrapping_sub(1) as usize;
        let mut full = vec![0u8; BS];
        let src = blocks
            .get(i)
            .ok_or_else(|| cairn_ffs::format::FormatError(format!("no block {b}")))?;
        full[..src.len()].copy_from_slice(src);
        Ok(full)
    });
    let Ok(c) = r else {
        return;
    };
    let images = xattr::encode_chain(&c.attrs, 7, &c.blocks, BS).expect("fits where it was");
    let again = xattr::read_chain(7, c.blocks[0], |b| {
        let i = c
            .blocks
            .iter()
            .position(|&x| x == b)
            .expect("a block of the chain");
        Ok(images[i].clone())
    })
    .expect("re-decode");
    assert_eq!(again.attrs, c.attrs);
}

/// POSIX ACL decoding (`cairn_vfs::acl`): no panic; a value that decodes re-encodes to its
/// canonical form, which decodes to the same ACL; the rules (mode, chmod, inheritance, the
/// permission check, fsck's audit) run on it without panicking, and their results are ACLs
/// that still decode.
pub fn posix_acl(data: &[u8]) {
    use cairn_vfs::acl::{Acl, audit};
    use cairn_vfs::{Access, Ctx};
    let _ = audit(libc::S_IFREG | 0o640, |_| Some(data));
    let Ok(Some(a)) = Acl::decode(data) else {
        return;
    };
    let enc = a.encode();
    assert_eq!(Acl::decode(&enc).expect("re-decode"), Some(a.clone()));
    let (mode, _) = a.equiv_mode(libc::S_IFREG | 0o7777);
    assert_eq!(mode & 0o7000, 0o7000, "only permission bits change");
    let mut b = a.clone();
    b.chmod(0o751);
    assert!(Acl::decode(&b.encode()).expect("after chmod").is_some());
    let mut m = libc::S_IFDIR | 0o777;
    let mut c = a.clone();
    c.create_masq(&mut m);
    assert!(
        Acl::decode(&c.encode())
            .expect("after inheritance")
            .is_some()
    );
    let mut who = Ctx::user(1000, 100);
    who.groups = Some(vec![1, 2, 3]);
    let _ = a.permission(&who, 0, 100, Access::R | Access::W);
}

fn base() -> &'static Image {
    static BASE: OnceLock<Image> = OnceLock::new();
    BASE.get_or_init(Image::populated)
}

/// fsck on the populated test image patched by the fuzz bytes: each 3-byte group is
/// (block index into the blocks the image uses, low byte of offset, value); a 4th byte
/// from the next group selects the offset's high bits. Check must not panic; repair must
/// leave an image a second check finds clean.
pub fn fsck_image(data: &[u8]) {
    let img = base();
    let used: &[u64] = {
        static USED: OnceLock<Vec<u64>> = OnceLock::new();
        USED.get_or_init(|| {
            (0..img.g.total_blocks)
                .filter(|&b| img.block_used(b))
                .collect()
        })
    };
    let mut bytes = img.bytes.clone();
    let bs = img.bs();
    for p in data.chunks_exact(4) {
        let blk = used[p[0] as usize % used.len()] as usize;
        let off = (u16::from_le_bytes([p[1], p[2]]) as usize) % bs;
        bytes[blk * bs + off] = p[3];
    }
    let dev = cairn_blockdev::MemDevice::from_bytes(4096, bytes);
    match check(&dev, CheckOptions::default()) {
        Ok(_) | Err(FsckError::NotCairn(_)) | Err(FsckError::Unusable(_)) => {}
        Err(e) => panic!("operational error on a memory device: {e}"),
    }
    let Ok(first) = check(
        &dev,
        CheckOptions {
            repair: true,
            progress: None,
            ..Default::default()
        },
    ) else {
        return;
    };
    let again = check(&dev, CheckOptions::default()).expect("repaired image opens");
    assert!(
        again.is_clean(),
        "second run not clean:\n{}\nfirst run:\n{}",
        again
            .findings
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        first
            .findings
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

#[cfg(test)]
mod tests {
    //! The fuzz bodies on seeded random and mutated inputs (stable toolchain; CI runs these).
    use rand::{Rng, RngCore, SeedableRng};

    use super::*;

    fn seed(name: &str) -> u64 {
        let s = std::env::var("CAIRN_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        println!("{name}: seed {s} (CAIRN_FUZZ_SEED to replay)");
        s
    }

    /// Valid encodings, then each mutated a few bytes at a time.
    fn mutate(rng: &mut impl Rng, valid: &[u8], n: usize, body: impl Fn(&[u8])) {
        body(valid);
        for _ in 0..n {
            let mut v = valid.to_vec();
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..v.len());
                v[i] = rng.random();
            }
            body(&v);
            let mut junk = vec![0u8; rng.random_range(0..valid.len() + 64)];
            rng.fill_bytes(&mut junk);
            body(&junk);
        }
    }

    #[test]
    fn superblock_fuzz() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed("superblock"));
        let img = base();
        mutate(&mut rng, &img.block(0)[..512], 3000, superblock);
    }

    #[test]
    fn inode_fuzz() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed("inode"));
        let img = base();
        for ino in [2u64, 5, 7, 11] {
            let (blk, off) = img.g.inode_location(ino);
            let mut v = ino.to_le_bytes().to_vec();
            v.extend_from_slice(&img.block(blk)[off..off + INODE_SIZE]);
            // Keep the inode number intact so mutations exercise more than the checksum.
            mutate(&mut rng, &v, 1000, |d| {
                let mut d = d.to_vec();
                if d.len() >= 8 {
                    d[..8].copy_from_slice(&ino.to_le_bytes());
                }
                inode(&d);
            });
        }
    }

    #[test]
    fn dir_block_fuzz() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed("dir"));
        let img = base();
        let a = img.lookup(2, b"a").unwrap();
        let p = img.inode(a).direct[0];
        mutate(&mut rng, img.block(p), 3000, dir_block);
    }

    #[test]
    fn xattr_fuzz() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed("xattr"));
        let img = base();
        let a = img.lookup(2, b"a").unwrap();
        let small = img.lookup(a, b"small").unwrap();
        let x = img.inode(small).xattr;
        mutate(&mut rng, &img.block(x)[..256], 3000, xattr_block);
    }

    #[test]
    fn xattr_chain_fuzz() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed("xattr_chain"));
        let attrs: Vec<(Vec<u8>, Vec<u8>)> = (0..300)
            .map(|i| (format!("user.a{i}").into_bytes(), vec![i as u8; 20]))
            .collect();
        let n = xattr::blocks_needed(&attrs, 4096).unwrap();
        let blks: Vec<u64> = (1..=n as u64).collect();
        let valid: Vec<u8> = xattr::encode_chain(&attrs, 7, &blks, 4096)
            .unwrap()
            .concat();
        mutate(&mut rng, &valid, 300, xattr_chain);
    }

    #[test]
    fn posix_acl_fuzz() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed("posix_acl"));
        let valid = cairn_vfs::acl::encode_raw(&[
            (1, 6, u32::MAX),
            (2, 7, 1000),
            (4, 4, u32::MAX),
            (8, 5, 50),
            (0x10, 6, u32::MAX),
            (0x20, 0, u32::MAX),
        ]);
        assert!(cairn_vfs::acl::Acl::decode(&valid).unwrap().is_some());
        mutate(&mut rng, &valid, 5000, posix_acl);
    }

    #[test]
    fn fsck_image_fuzz() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed("fsck_image"));
        for _ in 0..60 {
            let mut d = vec![0u8; 4 * rng.random_range(1..20)];
            rng.fill_bytes(&mut d);
            fsck_image(&d);
        }
    }
}
