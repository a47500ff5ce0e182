//! Hand-made corruptions of every class the checker knows: each must be detected with the
//! right class, repaired, and a second run must be clean.

use cairn_ffs::format::{DiskInode, NDIRECT, ROOT_INO, bitmap, dir};
use rand::{Rng, RngCore, SeedableRng};

use crate::testimage::{Image, pattern};
use crate::*;

fn run(bytes: &[u8], repair: bool) -> (Report, Vec<u8>) {
    let dev = cairn_blockdev::MemDevice::from_bytes(4096, bytes.to_vec());
    let r = check(
        &dev,
        CheckOptions {
            repair,
            progress: None,
            ..Default::default()
        },
    )
    .expect("check runs");
    (r, dev.to_bytes())
}

fn img_of(bytes: Vec<u8>) -> Image {
    let base = Image::populated();
    Image {
        bytes,
        g: base.g,
        sb: base.sb,
    }
}

/// Detect (with `class` and a message containing `needle`), repair, re-check clean.
/// Returns the repaired image.
fn case(img: &Image, class: Class, needle: &str) -> Image {
    let (r, untouched) = run(&img.bytes, false);
    assert_eq!(
        untouched, img.bytes,
        "check without repair wrote to the device"
    );
    assert!(
        r.findings
            .iter()
            .any(|f| f.class == class && f.message.contains(needle)),
        "expected {class:?} containing {needle:?}, got:\n{}",
        r.findings
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(r.exit_code(), 4);
    let (r, repaired) = run(&img.bytes, true);
    assert!(
        r.unfixed().next().is_none(),
        "unfixed: {:#?}",
        r.unfixed().collect::<Vec<_>>()
    );
    assert_eq!(r.exit_code(), 1);
    let (r2, _) = run(&repaired, false);
    assert!(
        r2.is_clean(),
        "second run not clean after repairing {needle:?}:\n{}\nfirst run:\n{}",
        r2.findings
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        r.findings
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    img_of(repaired)
}

/// Like [`case`], and every finding must be a leak.
fn leak_case(img: &Image, needle: &str) -> Image {
    let (r, _) = run(&img.bytes, false);
    assert!(r.corruptions().next().is_none(), "{:#?}", r.findings);
    case(img, Class::Leak, needle)
}

struct Names {
    a: u64,
    b: u64,
    small: u64,
    medium: u64,
    big: u64,
    fast: u64,
    slow: u64,
    fifo: u64,
}

fn names(img: &Image) -> Names {
    let a = img.lookup(ROOT_INO, b"a").unwrap();
    let b = img.lookup(a, b"b").unwrap();
    Names {
        a,
        b,
        small: img.lookup(a, b"small").unwrap(),
        medium: img.lookup(b, b"medium").unwrap(),
        big: img.lookup(ROOT_INO, b"big").unwrap(),
        fast: img.lookup(ROOT_INO, b"fast").unwrap(),
        slow: img.lookup(a, b"slow").unwrap(),
        fifo: img.lookup(ROOT_INO, b"fifo").unwrap(),
    }
}

fn edit_inode(img: &mut Image, ino: u64, f: impl FnOnce(&mut DiskInode)) {
    let mut d = img.inode(ino);
    f(&mut d);
    img.put_inode(ino, &d);
}

fn set_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn fresh_and_populated_images_are_clean() {
    for img in [
        Image::small(),
        Image::populated(),
        Image::mkfs(65536, 64, 32, 64),
    ] {
        let (r, _) = run(&img.bytes, false);
        assert!(r.is_clean(), "{:#?}", r.findings);
        assert_eq!(r.exit_code(), 0);
    }
    let img = Image::populated();
    let (r, _) = run(&img.bytes, false);
    assert_eq!(
        (
            r.stats.dirs,
            r.stats.files,
            r.stats.symlinks,
            r.stats.specials
        ),
        (5, 3, 2, 2)
    );
    // Repair of a clean image changes nothing.
    let (r, after) = run(&img.bytes, true);
    assert_eq!(r.exit_code(), 0);
    assert_eq!(after, img.bytes);
}

// ---- superblock and descriptors -------------------------------------------------------

#[test]
fn damaged_primary_superblock_uses_backup() {
    let mut img = Image::populated();
    img.block_mut(0)[40] ^= 0xff; // free_blocks: checksum now wrong
    let fixed = case(&img, Class::Corruption, "using the backup in group 1");
    assert_eq!(fixed.block(0)[..512], Image::populated().block(0)[..512]);
    // With the magic gone too, the backup is still found from the default geometry scan.
    let mut img = Image::populated();
    img.block_mut(0)[..512].fill(0);
    let (r, _) = run(&img.bytes, false);
    assert_eq!(r.backup_superblock, Some(1));
    case(&img, Class::Corruption, "primary superblock unusable");
}

#[test]
fn not_cairn_and_unusable_are_operational_errors() {
    let dev = cairn_blockdev::MemDevice::new(4096, 64);
    let e = check(&dev, CheckOptions::default()).unwrap_err();
    assert!(matches!(e, FsckError::NotCairn(_)), "{e}");
    assert_eq!(e.exit_code(), 8);
    // A single-group file system has no backup: a damaged primary is fatal.
    let mut img = Image::mkfs(4096, 200, 256, 64);
    img.block_mut(0)[20] ^= 1;
    let dev = img.device();
    assert!(matches!(
        check(&dev, CheckOptions::default()),
        Err(FsckError::Unusable(_))
    ));
    // Truncated image.
    let img = Image::populated();
    let dev = cairn_blockdev::MemDevice::from_bytes(4096, img.bytes[..4096 * 300].to_vec());
    let e = check(&dev, CheckOptions::default()).unwrap_err();
    assert!(e.to_string().contains("larger than the device"), "{e}");
}

#[test]
fn bad_group_descriptor() {
    let mut img = Image::populated();
    let b = img.g.desc_block(1);
    img.block_mut(b)[12] ^= 1;
    case(&img, Class::Corruption, "descriptor checksum mismatch");
}

#[test]
fn bad_backup_superblock() {
    let mut img = Image::populated();
    let b = img.g.sb_block(2);
    img.block_mut(b)[16] ^= 1;
    case(&img, Class::Corruption, "group 2: backup superblock");
}

// ---- inodes -----------------------------------------------------------------------------

#[test]
fn inode_checksum_mismatch_keeps_the_file() {
    let mut img = Image::populated();
    let n = names(&img);
    img.inode_raw_mut(n.medium)[40] ^= 0x55; // mtime
    let fixed = case(&img, Class::Corruption, "checksum mismatch");
    assert_eq!(fixed.read_file(n.medium), pattern(2, 5 * 4096 + 17));
}

#[test]
fn bad_file_type_clears_inode_and_entries() {
    let mut img = Image::populated();
    let n = names(&img);
    edit_inode(&mut img, n.fifo, |d| d.mode = 0o170644);
    let fixed = case(&img, Class::Corruption, "bad file type");
    assert!(fixed.lookup(ROOT_INO, b"fifo").is_none());
}

#[test]
fn pointer_out_of_range() {
    let mut img = Image::populated();
    let n = names(&img);
    let t = img.g.total_blocks;
    edit_inode(&mut img, n.medium, |d| d.direct[2] = t + 5);
    case(
        &img,
        Class::Corruption,
        "out of range or into group metadata",
    );
}

#[test]
fn pointer_into_group_metadata() {
    let mut img = Image::populated();
    let n = names(&img);
    let itab = img.g.inode_table(1);
    edit_inode(&mut img, n.medium, |d| d.direct[1] = itab);
    case(
        &img,
        Class::Corruption,
        "out of range or into group metadata",
    );
}

#[test]
fn bad_pointer_inside_indirect_block() {
    let mut img = Image::populated();
    let n = names(&img);
    let ind = img.inode(n.big).indirect[0];
    img.block_mut(ind)[8 * 7..8 * 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let fixed = case(&img, Class::Corruption, "out of range");
    // Everything else of the file survives.
    let want = pattern(3, (12 + 520) * 4096 + 5);
    let got = fixed.read_file(n.big);
    assert_eq!(got[..(12 + 7) * 4096], want[..(12 + 7) * 4096]);
    assert_eq!(got[(12 + 8) * 4096..], want[(12 + 8) * 4096..]);
}

#[test]
fn block_claimed_twice() {
    let mut img = Image::populated();
    let n = names(&img);
    let shared = img.inode(n.small).direct[0];
    // `medium` (created later, higher inode number) also claims small's block.
    edit_inode(&mut img, n.medium, |d| d.direct[3] = shared);
    let fixed = case(&img, Class::Corruption, "already claimed");
    assert_eq!(fixed.read_file(n.small), pattern(1, 100));
    assert_eq!(fixed.inode(n.small).direct[0], shared);
}

#[test]
fn blocks_beyond_eof() {
    // A regular file may own blocks past its size (fallocate with KEEP_SIZE): not a finding.
    let mut img = Image::populated();
    let n = names(&img);
    edit_inode(&mut img, n.medium, |d| d.size = 4096 + 1);
    edit_inode(&mut img, n.big, |d| d.size = 3 * 4096);
    let (r, _) = run(&img.bytes, false);
    assert!(r.is_clean(), "{:#?}", r.findings);
    // A slow symlink owns exactly one block.
    let extra = img.alloc_block();
    edit_inode(&mut img, n.slow, |d| {
        d.direct[1] = extra;
        d.blocks += 1;
    });
    let fixed = case(&img, Class::Corruption, "beyond its first");
    assert_eq!(fixed.inode(n.slow).blocks, 1);
    assert!(!fixed.block_used(extra));
}

#[test]
fn wrong_block_count() {
    let mut img = Image::populated();
    let n = names(&img);
    edit_inode(&mut img, n.big, |d| d.blocks += 3);
    case(&img, Class::Leak, "block count");
    // An indirect block that reached disk before the inode counting its new pointers (the
    // order of fsync and of soft updates: data, index blocks, inode), whether they fill a
    // hole or lie past the end: the count lags by blocks an index block names, a leak.
    let mut img = Image::populated();
    edit_inode(&mut img, n.big, |d| d.blocks -= 1);
    case(&img, Class::Leak, "block count");
    let mut img = Image::populated();
    edit_inode(&mut img, n.big, |d| {
        d.size = (NDIRECT as u64 + 518) * 4096;
        d.blocks -= 3;
    });
    case(&img, Class::Leak, "block count");
    // Below the blocks the inode names itself (its direct pointers and its index blocks,
    // written in the same block as the count): corruption.
    let mut img = Image::populated();
    edit_inode(&mut img, n.big, |d| d.blocks = NDIRECT as u64);
    case(&img, Class::Corruption, "block count");
}

#[test]
fn special_file_with_blocks_and_bad_symlink() {
    let mut img = Image::populated();
    let n = names(&img);
    let blk = img.alloc_block();
    edit_inode(&mut img, n.fifo, |d| d.direct[0] = blk);
    case(
        &img,
        Class::Corruption,
        "special file or fast symlink has block pointers",
    );
    let mut img = Image::populated();
    edit_inode(&mut img, n.slow, |d| d.size = 9000);
    case(&img, Class::Corruption, "symlink of bad length");
    let mut img = Image::populated();
    // An inline target on a non-symlink: the codec refuses it.
    let raw = img.inode_raw_mut(n.small);
    raw[67] |= 0x80;
    let c = crate::check::inode_crc(n.small, raw);
    raw[252..256].copy_from_slice(&c.to_le_bytes());
    case(&img, Class::Corruption, "inline data");
    let _ = n.fast;
}

#[test]
fn bad_xattr_block() {
    let mut img = Image::populated();
    let n = names(&img);
    let x = img.inode(n.small).xattr;
    img.block_mut(x)[20] ^= 1;
    let fixed = case(&img, Class::Corruption, "extended-attribute block");
    assert_eq!(fixed.inode(n.small).xattr, 0);
}

/// A file of `populated()` with 400 attributes in a chain; returns (image, inode, blocks).
fn chained() -> (Image, u64, Vec<u64>) {
    let mut img = Image::populated();
    let n = names(&img);
    let attrs: Vec<(Vec<u8>, Vec<u8>)> = (0..400)
        .map(|i| {
            (
                format!("user.attribute_{i}").into_bytes(),
                format!("value_{i}").into_bytes(),
            )
        })
        .collect();
    let mut d = img.inode(n.medium);
    d.xattr = 0;
    img.put_inode(n.medium, &d);
    let blocks = img.set_xattr_chain(n.medium, &attrs);
    img.finish();
    (img, n.medium, blocks)
}

/// Rewrites chain block `b` of inode `ino` (position `index`) with its `next` set to `next`,
/// checksum recomputed: a well-formed block pointing somewhere it must not.
fn relink(img: &mut Image, b: u64, next: u64) {
    let blk = img.block_mut(b);
    blk[8..16].copy_from_slice(&next.to_le_bytes());
    let used = u32::from_le_bytes(blk[4..8].try_into().unwrap()) as usize;
    let mut h = crc32c::crc32c(&blk[0..28]);
    h = crc32c::crc32c_append(h, &blk[32..used]);
    blk[28..32].copy_from_slice(&h.to_le_bytes());
}

#[test]
fn a_chain_of_attribute_blocks_is_clean() {
    let (img, ino, blocks) = chained();
    assert!(blocks.len() > 1);
    let (r, _) = run(&img.bytes, false);
    assert!(r.is_clean(), "{:?}", r.findings);
    // Without the feature bit, the chain is damage the repair resolves by setting it.
    let mut img = img;
    img.sb.feature_incompat = 0;
    img.write_superblocks();
    let fixed = case(&img, Class::Corruption, "without the chain feature");
    assert_eq!(fixed.inode(ino).xattr, blocks[0]);
}

#[test]
fn a_damaged_chain_block_drops_the_list_and_frees_its_blocks() {
    let (mut img, ino, blocks) = chained();
    img.block_mut(blocks[2])[100] ^= 1;
    let fixed = case(&img, Class::Corruption, "chain block 2: checksum mismatch");
    assert_eq!(fixed.inode(ino).xattr, 0);
    for b in blocks {
        assert!(
            !fixed.block_used(b),
            "block {b} of the dropped chain still in use"
        );
    }
}

#[test]
fn a_chain_cycle_is_found() {
    let (mut img, ino, blocks) = chained();
    let last = *blocks.last().unwrap();
    relink(&mut img, last, blocks[1]);
    let fixed = case(&img, Class::Corruption, "cycle");
    assert_eq!(fixed.inode(ino).xattr, 0);
}

#[test]
fn a_chain_block_claimed_twice_is_found() {
    let (mut img, _, blocks) = chained();
    // Another file's data block named as the chain's next: claimed by two pointers.
    let n = names(&img);
    let data = img.inode(n.small).direct[0];
    assert_ne!(data, 0);
    relink(&mut img, blocks[0], data);
    let fixed = case(&img, Class::Corruption, "already claimed");
    // The data block stays with its file.
    assert_eq!(fixed.inode(n.small).direct[0], data);
}

#[test]
fn a_chain_longer_than_the_bound_is_found() {
    let (mut img, ino, blocks) = chained();
    // Extend the chain with empty blocks until it is one past the bound.
    let mut prev = *blocks.last().unwrap();
    let mut index = blocks.len() as u32;
    while index as usize <= cairn_ffs::format::xattr::CHAIN_MAX {
        let b = img.alloc_block();
        let bs = img.bs();
        let blk = img.block_mut(b);
        blk.fill(0);
        blk[0..4].copy_from_slice(b"CXA2");
        blk[4..8].copy_from_slice(&32u32.to_le_bytes());
        blk[16..24].copy_from_slice(&ino.to_le_bytes());
        blk[24..28].copy_from_slice(&index.to_le_bytes());
        assert!(bs >= 32);
        relink(&mut img, b, 0);
        relink(&mut img, prev, b);
        prev = b;
        index += 1;
    }
    let mut d = img.inode(ino);
    d.blocks += u64::from(index) - blocks.len() as u64;
    img.put_inode(ino, &d);
    img.finish();
    case(&img, Class::Corruption, "longer than");
}

#[test]
fn free_inode_with_stale_contents() {
    let mut img = Image::populated();
    let ino = 40;
    assert!(!img.inode_used(ino));
    let raw = img.inode_raw_mut(ino);
    raw[100] = 7;
    let c = crate::check::inode_crc(ino, raw);
    raw[252..256].copy_from_slice(&c.to_le_bytes());
    case(&img, Class::Corruption, "stale contents");
}

#[test]
fn root_not_a_directory() {
    let mut img = Image::populated();
    edit_inode(&mut img, ROOT_INO, |d| d.mode = libc::S_IFREG | 0o644);
    let fixed = case(&img, Class::Corruption, "root inode is not a directory");
    // Every directory that hung off the old root is now in the new lost+found.
    let lf = fixed.lookup(ROOT_INO, b"lost+found").unwrap();
    let n = names(&Image::populated());
    assert_eq!(fixed.lookup(lf, format!("#{}", n.a).as_bytes()), Some(n.a));
    assert!(fixed.lookup(n.a, b"small").is_some());
}

// ---- directories ------------------------------------------------------------------------

#[test]
fn bad_directory_record() {
    let mut img = Image::populated();
    let n = names(&img);
    let (p, off) = img.find_entry(n.b, b"medium").unwrap();
    img.block_mut(p)[off + 4..off + 6].copy_from_slice(&3u16.to_le_bytes());
    let fixed = case(&img, Class::Corruption, "bad record length");
    // medium's inode was not lost: it went to lost+found.
    let lf = fixed.lookup(ROOT_INO, b"lost+found").unwrap();
    assert_eq!(
        fixed.lookup(lf, format!("#{}", n.medium).as_bytes()),
        Some(n.medium)
    );
}

#[test]
fn directory_size_not_block_multiple() {
    let mut img = Image::populated();
    let n = names(&img);
    edit_inode(&mut img, n.a, |d| d.size = 100);
    case(&img, Class::Corruption, "does not match its blocks");
}

#[test]
fn directory_hole() {
    let mut img = Image::populated();
    let n = names(&img);
    let blk = img.alloc_block();
    dir::init_empty(img.block_mut(blk));
    edit_inode(&mut img, n.b, |d| {
        d.direct[3] = blk;
        d.size = 4 * 4096;
        d.blocks += 1;
    });
    case(&img, Class::Corruption, "has 2 holes (first at block 1)");
    // A size running past the last block is cut back, not walked.
    let mut img = Image::populated();
    edit_inode(&mut img, n.b, |d| d.size = 1 << 60);
    case(&img, Class::Corruption, "does not match its blocks");
    // No block at all.
    let mut img = Image::populated();
    edit_inode(&mut img, n.b, |d| {
        d.direct[0] = 0;
        d.blocks = 0;
    });
    case(&img, Class::Corruption, "has no first block");
}

#[test]
fn dot_and_dotdot() {
    let n = names(&Image::populated());
    // '.' naming another inode.
    let mut img = Image::populated();
    let p = img.inode(n.b).direct[0];
    set_u32(img.block_mut(p), 0, n.a as u32);
    case(&img, Class::Corruption, "'.' names inode");
    // '.' renamed: first chunk rebuilt, the entries kept.
    let mut img = Image::populated();
    img.block_mut(p)[8] = b'x';
    let fixed = case(&img, Class::Corruption, "missing or misplaced");
    assert_eq!(fixed.lookup(n.b, b"medium"), Some(n.medium));
    // '..' naming the wrong directory.
    let mut img = Image::populated();
    set_u32(img.block_mut(p), 16, ROOT_INO as u32);
    let fixed = case(&img, Class::Corruption, "'..' names 2 but its parent is");
    assert_eq!(fixed.lookup(n.b, b".."), Some(n.a));
    // Typed: the crash harness tells a rename's footprint by its kind, not its words.
    let (r, _) = run(&img.bytes, false);
    assert!(
        r.findings
            .iter()
            .any(|f| f.kind == crate::Kind::StaleDotDot)
    );
}

#[test]
fn entry_naming_free_or_invalid_inode() {
    let n = names(&Image::populated());
    let mut img = Image::populated();
    let (p, off) = img.find_entry(n.a, b"small").unwrap();
    set_u32(img.block_mut(p), off, 50); // a free inode
    case(&img, Class::Corruption, "free inode 50");
    let mut img = Image::populated();
    set_u32(img.block_mut(p), off, 1_000_000);
    case(&img, Class::Corruption, "invalid inode number");
    let mut img = Image::populated();
    set_u32(img.block_mut(p), off, 1);
    case(&img, Class::Corruption, "invalid inode number 1");
}

#[test]
fn wrong_dtype() {
    let mut img = Image::populated();
    let n = names(&img);
    let (p, off) = img.find_entry(n.a, b"small").unwrap();
    img.block_mut(p)[off + 6] = libc::DT_DIR;
    case(&img, Class::Corruption, "has file type 4");
}

#[test]
fn duplicate_and_stray_names() {
    let n = names(&Image::populated());
    let mut img = Image::populated();
    img.add_entry(n.a, b"small", n.medium);
    edit_inode(&mut img, n.medium, |d| d.nlink += 1);
    case(&img, Class::Corruption, "duplicate name");
    let mut img = Image::populated();
    img.add_entry(n.a, b"..", n.medium);
    case(&img, Class::Corruption, "stray");
    let mut img = Image::populated();
    img.add_entry(n.a, b"x/y", n.medium);
    case(&img, Class::Corruption, "'/'");
}

// ---- connectivity -----------------------------------------------------------------------

#[test]
fn unreachable_directory_is_reconnected() {
    let mut img = Image::populated();
    let n = names(&img);
    let (p, off) = img.find_entry(n.a, b"b").unwrap();
    dir::remove(img.block_mut(p), off).unwrap();
    let fixed = case(&img, Class::Corruption, "unreachable directory");
    let lf = fixed.lookup(ROOT_INO, b"lost+found").unwrap();
    assert_eq!(fixed.lookup(lf, format!("#{}", n.b).as_bytes()), Some(n.b));
    assert_eq!(fixed.lookup(n.b, b".."), Some(lf));
    assert_eq!(fixed.read_file(n.medium), pattern(2, 5 * 4096 + 17));
}

#[test]
fn directory_cycle() {
    let mut img = Image::populated();
    let n = names(&img);
    // a is removed from the root and named from inside its own child b: a -> b -> a.
    let (p, off) = img.find_entry(ROOT_INO, b"a").unwrap();
    dir::remove(img.block_mut(p), off).unwrap();
    img.add_entry(n.b, b"loop", n.a);
    case(&img, Class::Corruption, "directory cycle");
}

#[test]
fn second_name_for_directory() {
    let n = names(&Image::populated());
    // A second name whose directory is not the one '..' names: the leftover of an
    // interrupted rename is a leak, and the name agreeing with '..' is kept.
    let mut img = Image::populated();
    img.add_entry(ROOT_INO, b"again", n.b);
    let fixed = case(&img, Class::Leak, "second name");
    assert_eq!(fixed.lookup(n.a, b"b"), Some(n.b));
    let (r, _) = run(&img.bytes, false);
    let kinds: Vec<crate::Kind> = r.findings.iter().map(|f| f.kind).collect();
    assert!(
        kinds.contains(&crate::Kind::SecondDirectoryName),
        "{kinds:?}"
    );
    assert!(fixed.lookup(ROOT_INO, b"again").is_none());
    // A name for the root directory is always damage.
    let mut img = Image::populated();
    img.add_entry(n.a, b"up", ROOT_INO);
    case(&img, Class::Corruption, "naming the root");
}

#[test]
fn missing_lost_found_is_created_when_needed() {
    let mut img = Image::populated();
    let n = names(&img);
    let lf = img.lookup(ROOT_INO, b"lost+found").unwrap();
    let (p, off) = img.find_entry(ROOT_INO, b"lost+found").unwrap();
    dir::remove(img.block_mut(p), off).unwrap();
    let lfblk = img.inode(lf).direct[0];
    img.set_block_used(lfblk, false);
    edit_inode(&mut img, lf, |d| *d = DiskInode::default());
    img.set_inode_used(lf, false);
    edit_inode(&mut img, ROOT_INO, |d| d.nlink -= 1);
    img.finish();
    // Without anything to reconnect, no lost+found is needed (as FFS fsck).
    let (r, _) = run(&img.bytes, false);
    assert!(r.is_clean(), "{:#?}", r.findings);
    let (p, off) = img.find_entry(n.b, b"medium").unwrap();
    dir::remove(img.block_mut(p), off).unwrap();
    let fixed = case(&img, Class::Leak, "unreferenced inode");
    let lf = fixed.lookup(ROOT_INO, b"lost+found").unwrap();
    assert_eq!(
        fixed.lookup(lf, format!("#{}", n.medium).as_bytes()),
        Some(n.medium)
    );
    assert_eq!(fixed.read_file(n.medium), pattern(2, 5 * 4096 + 17));
}

// ---- link counts -----------------------------------------------------------------------

#[test]
fn link_counts() {
    let n = names(&Image::populated());
    let mut img = Image::populated();
    edit_inode(&mut img, n.small, |d| d.nlink = 1); // two names
    case(&img, Class::Corruption, "link count 1 should be 2");
    let mut img = Image::populated();
    edit_inode(&mut img, n.medium, |d| d.nlink = 3);
    leak_case(&img, "link count 3 should be 1");
    let mut img = Image::populated();
    edit_inode(&mut img, n.a, |d| d.nlink = 2); // a has a subdirectory
    case(&img, Class::Corruption, "link count 2 should be 3");
    let mut img = Image::populated();
    edit_inode(&mut img, ROOT_INO, |d| d.nlink = 9);
    leak_case(&img, "link count 9 should be");
}

// ---- what a crash in sync mode may leave: leaks only ---------------------------------------

#[test]
fn crash_leftovers_are_leaks() {
    // An allocated, unreferenced inode with nlink 0 (unlinked while open): freed.
    let mut img = Image::populated();
    let ino = img.alloc_inode();
    let blk = img.alloc_block();
    let mut d = DiskInode {
        mode: libc::S_IFREG | 0o600,
        nlink: 0,
        size: 10,
        blocks: 1,
        ..Default::default()
    };
    d.direct[0] = blk;
    img.put_inode(ino, &d);
    img.finish();
    let fixed = leak_case(&img, "link count 0; freed");
    assert!(!fixed.inode_used(ino) && !fixed.block_used(blk));
    // An initialized inode whose entry never reached the disk (create interrupted).
    let mut img = Image::populated();
    let ino = img.alloc_inode();
    img.put_inode(
        ino,
        &DiskInode {
            mode: libc::S_IFREG | 0o600,
            nlink: 1,
            ..Default::default()
        },
    );
    img.finish();
    leak_case(&img, "unreferenced inode");
    // mkdir interrupted before the name: an empty unreferenced directory.
    let mut img = Image::populated();
    let n = names(&img);
    let ino = img.alloc_inode();
    let blk = img.alloc_block();
    dir::init_first(img.block_mut(blk), ino, n.a);
    let mut d = DiskInode {
        mode: libc::S_IFDIR | 0o755,
        nlink: 2,
        size: 4096,
        blocks: 1,
        ..Default::default()
    };
    d.direct[0] = blk;
    img.put_inode(ino, &d);
    edit_inode(&mut img, n.a, |d| d.nlink += 1);
    img.finish();
    leak_case(&img, "unreferenced empty directory");
    // Blocks and inodes allocated in the bitmaps but used by nothing, and summaries off.
    let mut img = Image::populated();
    let b = img.alloc_block();
    img.set_inode_used(45, true);
    let _ = b;
    leak_case(&img, "blocks marked in use but unused");
    let mut img = Image::populated();
    img.set_inode_used(45, true);
    img.finish();
    leak_case(&img, "inodes marked in use but free");
    let mut img = Image::populated();
    img.sb.free_blocks += 10;
    img.write_superblocks();
    leak_case(&img, "superblock summary");
}

#[test]
fn in_use_but_marked_free() {
    let n = names(&Image::populated());
    let mut img = Image::populated();
    let blk = img.inode(n.medium).direct[0];
    img.set_block_used(blk, false);
    case(&img, Class::Corruption, "blocks in use but marked free");
    let mut img = Image::populated();
    img.set_inode_used(n.medium, false);
    case(&img, Class::Corruption, "inodes in use but marked free");
    let mut img = Image::populated();
    img.set_inode_used(1, false);
    case(&img, Class::Corruption, "inodes in use but marked free");
}

#[test]
fn progress_reports_every_pass() {
    let img = Image::populated();
    let dev = img.device();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let opts = CheckOptions {
        repair: false,
        progress: Some(Box::new(move |p: &Progress| {
            s2.lock().unwrap().push(p.pass)
        })),
        ..Default::default()
    };
    check(&dev, opts).unwrap();
    let seen = seen.lock().unwrap();
    for p in [
        Pass::Inodes,
        Pass::Directories,
        Pass::Connectivity,
        Pass::LinkCounts,
        Pass::Bitmaps,
    ] {
        assert!(seen.contains(&p), "{p:?}");
    }
}

// ---- hostile images ------------------------------------------------------------------------

/// Flips random bytes (mostly in metadata, where they matter), then: check must terminate
/// without panicking, repair must leave an image a second check finds clean.
#[test]
fn random_byte_flips_then_repair_is_clean() {
    let base = Image::populated();
    let seed0: u64 = std::env::var("CAIRN_FSCK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let iters: u64 = std::env::var("CAIRN_FSCK_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150);
    println!(
        "random_byte_flips seed {seed0} (CAIRN_FSCK_SEED to replay, CAIRN_FSCK_ITERS for more)"
    );
    let g = base.g;
    // The metadata blocks plus every block the image uses (directories, indirect blocks).
    let hot: Vec<u64> = (0..g.total_blocks)
        .filter(|&b| base.block_used(b))
        .collect();
    for it in 0..iters {
        let seed = seed0.wrapping_add(it);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut bytes = base.bytes.clone();
        let flips = rng.random_range(1..=24);
        for _ in 0..flips {
            let blk = hot[rng.random_range(0..hot.len())];
            let off = blk as usize * 4096 + rng.random_range(0..4096);
            bytes[off] ^= 1 << rng.random_range(0..8);
        }
        // Sometimes a whole block of garbage (a misdirected or torn write).
        if rng.random_range(0..4) == 0 {
            let blk = hot[rng.random_range(0..hot.len())] as usize;
            rng.fill_bytes(&mut bytes[blk * 4096..(blk + 1) * 4096]);
        }
        let (r, _) = match std::panic::catch_unwind(|| run(&bytes, false)) {
            Ok(x) => x,
            Err(_) => panic!("check panicked, seed {seed}"),
        };
        let _ = r;
        let dev = cairn_blockdev::MemDevice::from_bytes(4096, bytes.clone());
        match check(
            &dev,
            CheckOptions {
                repair: true,
                progress: None,
                ..Default::default()
            },
        ) {
            Ok(r) => {
                let (r2, _) = run(&dev.to_bytes(), false);
                assert!(
                    r2.is_clean(),
                    "seed {seed}: second run not clean:\n{}\nfirst run:\n{}",
                    r2.findings
                        .iter()
                        .map(|f| f.to_string())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    r.findings
                        .iter()
                        .map(|f| f.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
            // Both superblock copies of group 0/1 hit: nothing to repair from.
            Err(FsckError::Unusable(_)) | Err(FsckError::NotCairn(_)) => {}
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}

#[test]
fn bitmap_helper_agrees() {
    // The in-memory image's view of bitmaps matches the codec helper (guards the builder).
    let img = Image::populated();
    assert!(bitmap::get(img.block(img.g.inode_bitmap(0)), 2));
}

/// A crash between writing a new inode and its bitmap (one `sync` step writes both, in any
/// order) leaves an in-use inode no entry names with a clear bit: a leak, because nothing
/// depends on it. The same clear bit under a named inode stays corruption (above).
#[test]
fn unreferenced_inode_marked_free_is_a_leak() {
    let n = names(&Image::populated());
    let mut img = Image::populated();
    let (p, off) = img.find_entry(n.b, b"medium").unwrap();
    dir::remove(img.block_mut(p), off).unwrap();
    img.set_inode_used(n.medium, false);
    img.finish();
    let (r, _) = run(&img.bytes, false);
    assert!(r.corruptions().next().is_none(), "{:#?}", r.findings);
    assert!(
        r.leaks().any(|f| f
            .message
            .contains("unreferenced inodes in use but marked free")),
        "{:#?}",
        r.findings
    );
    let fixed = case(&img, Class::Leak, "unreferenced inode");
    assert!(fixed.inode_used(n.medium));
}

/// A superblock marked "mounted" carries a stale summary by design (the engine writes it at
/// unmount): no finding, but repair still rewrites it.
#[test]
fn stale_summary_of_a_mounted_file_system_is_not_a_finding() {
    let mut img = Image::populated();
    img.sb.free_blocks += 10;
    img.sb.state = cairn_ffs::format::superblock::STATE_MOUNTED;
    img.write_superblocks();
    let (r, _) = run(&img.bytes, false);
    assert!(r.is_clean(), "{:#?}", r.findings);
    let mut clean = Image::populated();
    clean.sb.free_blocks += 10;
    clean.write_superblocks();
    let (r, _) = run(&clean.bytes, false);
    assert!(
        r.leaks().any(|f| f.message.contains("superblock summary")),
        "{:#?}",
        r.findings
    );
}

/// The binary form of an ACL from (tag, perm, id) triples.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    cairn_vfs::acl::encode_raw(entries)
}

/// POSIX ACLs among the extended attributes: a value that is no valid ACL, a default ACL on
/// a file and an ACL on a symlink are dropped (the other attributes kept); a mode that
/// disagrees with its access ACL is set from it; unknown inode flags are cleared.
#[test]
fn posix_acls_and_inode_flags() {
    let access = b"system.posix_acl_access".to_vec();
    let default = b"system.posix_acl_default".to_vec();
    let named = acl(&[
        (1, 6, u32::MAX),
        (2, 7, 1000),
        (4, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 0, u32::MAX),
    ]);
    let attrs_of = |img: &Image, ino: u64| {
        let x = img.inode(ino).xattr;
        cairn_ffs::format::xattr::decode(img.block(x)).unwrap()
    };
    for (what, attrs, needle) in [
        (
            "ragged",
            vec![(access.clone(), vec![2, 0, 0, 0, 1])],
            "posix_acl_access",
        ),
        (
            "default on a file",
            vec![(default.clone(), named.clone())],
            "non-directory",
        ),
    ] {
        let mut img = Image::populated();
        let f = img.create(ROOT_INO, what.as_bytes(), b"x");
        let mut all = vec![(b"user.keep".to_vec(), b"1".to_vec())];
        all.extend(attrs);
        img.set_xattrs(f, &all);
        img.finish();
        let fixed = case(&img, Class::Corruption, needle);
        assert_eq!(
            attrs_of(&fixed, f),
            vec![(b"user.keep".to_vec(), b"1".to_vec())],
            "{what}: dropped, the rest kept"
        );
    }
    // The mode written without its ACL (0640 where the mask says 0660).
    let mut img = Image::populated();
    let f = img.create(ROOT_INO, b"torn", b"x");
    let mut d = img.inode(f);
    d.mode = libc::S_IFREG | 0o640;
    img.put_inode(f, &d);
    img.set_xattrs(f, &[(access.clone(), named.clone())]);
    img.finish();
    let fixed = case(&img, Class::Corruption, "disagrees with its access ACL");
    assert_eq!(fixed.inode(f).mode, libc::S_IFREG | 0o660);
    assert_eq!(attrs_of(&fixed, f), vec![(access, named)]);
    // Flags nobody sets.
    let mut img = Image::populated();
    let f = img.create(ROOT_INO, b"flagged", b"x");
    let mut d = img.inode(f);
    d.flags = 0x10 | 0x0100_0000;
    img.put_inode(f, &d);
    img.finish();
    let fixed = case(&img, Class::Corruption, "unknown inode flags");
    assert_eq!(
        fixed.inode(f).flags,
        0x10,
        "immutable kept, the unknown bit cleared"
    );
}
