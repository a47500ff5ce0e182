//! Creating a file system.

use std::path::Path;

use cairn_blockdev::{BlockDevice, image};
use cairn_vfs::{Errno, FsError};

use crate::MkfsOptions;
use crate::format::{
    DiskInode, FORMAT_VERSION, Geometry, GroupDesc, INODE_SIZE, LOST_FOUND_INO, ROOT_INO,
    Superblock, bitmap, dir, superblock, superblock::STATE_CLEAN,
};
use crate::inode::now_ns;

/// The log area `cairn mkfs` reserves for `mode=journal,log=file` when `--journal-size` does
/// not say: about 1% of the file system (the size of 001's LFFS-file log), at least the
/// smallest log the journal takes (with room for its two superblocks), at most 128 MiB (a
/// checkpoint every second never needs more); none on a file system under 8 MiB, where
/// the smallest log would be a large share. Like mkfs.ext4's default journal, it is made
/// whatever mode the file system is first mounted in, so any image can be mounted
/// journaled later; `--journal-size 0` makes none.
pub fn default_journal_size(fs_bytes: u64, block_size: u32) -> Option<u64> {
    if fs_bytes < 8 << 20 {
        return None;
    }
    let bs = u64::from(block_size.max(1));
    let min = crate::strategy::journal::MIN_LOG_BYTES + 4 * bs;
    let bytes = (fs_bytes / 100).clamp(min, 128 << 20);
    Some(bytes.div_ceil(bs) * bs)
}

/// Creates a file system on `path`: an image file (created sparse, or resized to `size`) or
/// a block device (`size` at most the device's), opened and checked as every format's mkfs
/// opens its target (`cairn_blockdev::image::make`: the refusals and their order are
/// there; the size check and what an existing image holds are this format's).
pub fn mkfs(path: &Path, opts: &MkfsOptions) -> Result<(), FsError> {
    let target = image::Target {
        size: opts.size,
        block_size: opts.block_size,
        force: opts.force,
        sparse: opts.sparse,
    };
    image::make(
        path,
        &target,
        |s| check_size(opts.block_size, s, opts),
        existing_contents,
        |dev| mkfs_device(&dev, opts),
    )
    .map_err(|e| e.into_error(|n, m| refused(Errno(n), m), FsError::Io))
}

fn refused(e: Errno, msg: String) -> FsError {
    FsError::Refused(e, msg)
}

/// The smallest file system `for_mkfs` accepts with this block size and inode count.
fn min_bytes(block_size: u32, opts: &MkfsOptions) -> Option<u64> {
    (1..=1u64 << 16)
        .find(|&n| Geometry::for_mkfs(block_size, n, opts.inodes, opts.blocks_per_group).is_ok())
        .map(|n| n * block_size as u64)
}

/// Refuses a size that cannot hold a file system, naming the minimum.
fn check_size(bs: u32, size: u64, opts: &MkfsOptions) -> Result<(), FsError> {
    match Geometry::for_mkfs(bs, size / bs as u64, opts.inodes, opts.blocks_per_group) {
        Ok(_) => Ok(()),
        Err(e) => Err(refused(
            Errno::EINVAL,
            match min_bytes(bs, opts) {
                Some(min) if size < min => format!(
                    "size {size} bytes is below the minimum of {min} bytes ({} KiB) for {bs}-byte blocks",
                    min / 1024
                ),
                _ => e.0,
            },
        )),
    }
}

/// What the image already holds, if anything: a cairn file system (with its size and
/// label), a foreign signature, or non-zero bytes.
fn existing_contents(head: &[u8]) -> Option<String> {
    if superblock::has_magic(head) {
        return Some(match Superblock::decode(head) {
            Ok(sb) => {
                // The whole image: the groups and the journal's log area after them.
                let log = sb.journal_area().ok().flatten().map_or(0, |(_, n)| n);
                let mib = ((sb.total_blocks + log) * sb.block_size as u64) >> 20;
                if sb.label.is_empty() {
                    format!("a cairn file system ({mib} MiB)")
                } else {
                    format!("a cairn file system ({mib} MiB, label '{}')", sb.label)
                }
            }
            Err(_) => "a damaged cairn file system".to_string(),
        });
    }
    cairn_blockdev::contents::describe(head)
}

/// Creates a file system on an open device (the whole device, or `opts.size` of it).
pub fn mkfs_device(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<(), FsError> {
    let bs = dev.block_size();
    if bs != opts.block_size {
        return Err(FsError::Corrupt(format!(
            "device block size {bs} differs from requested {}",
            opts.block_size
        )));
    }
    let mut total = dev.num_blocks();
    if let Some(s) = opts.size {
        total = total.min(s / bs as u64);
    }
    // The journal's log area (`log=file`) takes the last blocks: the groups end before it.
    let journal_blocks = match opts.journal_size {
        None | Some(0) => 0,
        Some(j) => {
            let jb = j.div_ceil(bs as u64);
            if jb < crate::strategy::journal::MIN_LOG_BYTES.div_ceil(bs as u64) + 2 {
                return Err(FsError::Refused(
                    cairn_vfs::Errno::EINVAL,
                    format!(
                        "journal size {j} is below the smallest log ({} KiB)",
                        crate::strategy::journal::MIN_LOG_BYTES >> 10
                    ),
                ));
            }
            if jb >= total / 2 {
                return Err(FsError::Refused(
                    cairn_vfs::Errno::EINVAL,
                    format!("journal size {j} does not leave room for the file system"),
                ));
            }
            jb
        }
    };
    total -= journal_blocks;
    let geo = Geometry::for_mkfs(bs, total, opts.inodes, opts.blocks_per_group)
        .map_err(|e| FsError::Corrupt(e.0))?;
    if opts.label.len() > 63 {
        return Err(FsError::Corrupt("label longer than 63 bytes".into()));
    }
    let bsz = bs as usize;
    let now = now_ns();
    let mut uuid = [0u8; 16];
    let seed = now as u64 ^ (std::process::id() as u64).rotate_left(32);
    for (i, b) in uuid.iter_mut().enumerate() {
        *b = (seed.rotate_left(i as u32 * 8) ^ (i as u64 * 0x9e37_79b9)) as u8;
    }
    // Root and lost+found each get one directory block in group 0.
    let root_blk = geo.first_data(0);
    let lf_blk = root_blk + 1;
    let mut sb = Superblock {
        version: FORMAT_VERSION,
        block_size: bs,
        total_blocks: geo.total_blocks,
        blocks_per_group: geo.blocks_per_group as u32,
        inodes_per_group: geo.inodes_per_group as u32,
        group_count: geo.group_count as u32,
        inode_size: INODE_SIZE as u32,
        free_blocks: 0,
        free_inodes: 0,
        root_ino: ROOT_INO,
        created_ns: now,
        mounted_ns: 0,
        written_ns: now,
        state: STATE_CLEAN,
        mount_count: 0,
        uuid,
        label: opts.label.clone(),
        last_mode: String::new(),
        feature_compat: 0,
        feature_incompat: 0,
        feature_ro_compat: 0,
        dirs: 2,
        journal_first: 0,
        journal_blocks: 0,
    };
    if journal_blocks > 0 {
        sb.feature_compat |= crate::format::superblock::FEATURE_COMPAT_JOURNAL;
        sb.journal_first = geo.total_blocks;
        sb.journal_blocks = journal_blocks;
    }
    let mut zero_table = vec![0u8; bsz * geo.inode_table_blocks as usize];
    let mut free_blocks_total = 0u64;
    let mut free_inodes_total = 0u64;
    let mut descs = Vec::new();
    for g in 0..geo.group_count {
        let len = geo.group_len(g);
        let mut bmap = vec![0u8; bsz];
        for i in 0..geo.meta_blocks() {
            bitmap::set(&mut bmap, i as usize, true);
        }
        let mut imap = vec![0u8; bsz];
        let mut used_inodes = 0;
        let mut dirs = 0;
        if g == 0 {
            bitmap::set(&mut bmap, (root_blk - geo.group_start(0)) as usize, true);
            bitmap::set(&mut bmap, (lf_blk - geo.group_start(0)) as usize, true);
            for i in 0..=LOST_FOUND_INO as usize {
                bitmap::set(&mut imap, i, true);
            }
            used_inodes = LOST_FOUND_INO + 1;
            dirs = 2;
        }
        let used_blocks = bitmap::count_set(&bmap, len as usize) as u64;
        let d = GroupDesc {
            group: g as u32,
            free_blocks: (len - used_blocks) as u32,
            free_inodes: (geo.inodes_per_group - used_inodes) as u32,
            dirs,
        };
        free_blocks_total += d.free_blocks as u64;
        free_inodes_total += d.free_inodes as u64;
        let mut db = vec![0u8; bsz];
        d.encode(&mut db);
        let start = geo.group_start(g);
        dev.write_blocks(start + 1, &db)?;
        dev.write_blocks(start + 2, &bmap)?;
        dev.write_blocks(start + 3, &imap)?;
        // Inode tables must read as zeros; an image file is sparse already, but a reused
        // block device is not.
        if g > 0 || geo.inode_table_blocks > 0 {
            zero_table.fill(0);
            dev.write_blocks(geo.inode_table(g), &zero_table)?;
        }
        descs.push(d);
    }
    // Root and lost+found.
    let mk_dir = |blk: u64, nlink: u32, mode: u32| {
        let mut d = DiskInode {
            mode: libc::S_IFDIR | mode,
            nlink,
            size: bs as u64,
            blocks: 1,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            generation: 1,
            ..Default::default()
        };
        d.direct[0] = blk;
        d
    };
    let root = mk_dir(root_blk, 3, 0o755);
    let lf = mk_dir(lf_blk, 2, 0o700);
    let mut itb = vec![0u8; bsz];
    let (rb, roff) = geo.inode_location(ROOT_INO);
    let (lb, loff) = geo.inode_location(LOST_FOUND_INO);
    debug_assert_eq!(rb, lb);
    root.encode(ROOT_INO, &mut itb[roff..roff + INODE_SIZE]);
    lf.encode(LOST_FOUND_INO, &mut itb[loff..loff + INODE_SIZE]);
    dev.write_blocks(rb, &itb)?;
    let mut db = vec![0u8; bsz];
    dir::init_first(&mut db, ROOT_INO, ROOT_INO);
    dir::insert(&mut db, 0, LOST_FOUND_INO, libc::DT_DIR, b"lost+found")
        .map_err(|e| FsError::Corrupt(e.0))?;
    dev.write_blocks(root_blk, &db)?;
    dir::init_first(&mut db, LOST_FOUND_INO, ROOT_INO);
    dev.write_blocks(lf_blk, &db)?;
    sb.free_blocks = free_blocks_total;
    sb.free_inodes = free_inodes_total;
    if journal_blocks > 0 {
        // An empty log owned by this file system, before the superblock that points to it.
        let region = cairn_wal::Region {
            first_block: sb.journal_first,
            blocks: sb.journal_blocks,
        };
        cairn_wal::Wal::format(
            dev,
            region,
            &cairn_wal::FormatOptions {
                owner: uuid,
                zero: true,
                uuid: None,
            },
        )
        .map_err(|e| FsError::Corrupt(format!("cannot make the journal's log: {e}")))?;
    }
    // Superblock copies: every group's first block; the primary last, after a flush, so
    // a crash during mkfs never leaves a valid-looking primary over unwritten groups.
    let mut sbb = vec![0u8; bsz];
    sb.encode(&mut sbb);
    for g in 1..geo.group_count {
        dev.write_blocks(geo.sb_block(g), &sbb)?;
    }
    dev.flush()?;
    dev.write_blocks(0, &sbb)?;
    dev.flush()?;
    Ok(())
}
