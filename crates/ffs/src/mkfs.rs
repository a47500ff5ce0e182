//! Creating a file system.

use std::path::Path;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, FileDevice};
use cairn_vfs::FsError;

use crate::MkfsOptions;
use crate::format::{
    DiskInode, FORMAT_VERSION, Geometry, GroupDesc, INODE_SIZE, LOST_FOUND_INO, ROOT_INO,
    Superblock, bitmap, dir, superblock::STATE_CLEAN,
};
use crate::inode::now_ns;

/// Creates a file system on `path`: an image file (created sparse, or resized to `size`) or
/// a block device (`size` at most the device's).
pub fn mkfs(path: &Path, opts: &MkfsOptions) -> Result<(), FsError> {
    let bs = opts.block_size;
    let meta = std::fs::metadata(path).ok();
    let is_blockdev = meta.as_ref().is_some_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    });
    let dev: Arc<dyn BlockDevice> = if is_blockdev {
        Arc::new(FileDevice::open(path, bs, false)?)
    } else {
        let size = match (opts.size, &meta) {
            (Some(s), _) => s,
            (None, Some(m)) if m.len() > 0 => m.len(),
            _ => {
                return Err(FsError::Corrupt(
                    "no --size given and the image does not exist".into(),
                ));
            }
        };
        Arc::new(FileDevice::create(path, bs, size)?)
    };
    mkfs_device(dev.as_ref(), opts)
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
    };
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
