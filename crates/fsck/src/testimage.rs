//! A small, self-contained image builder over the format codecs, for tests and fuzz targets.
//!
//! It writes images the way the engine does (same layout, same codecs) without depending on
//! the engine, so fsck's tests pin down the *format*, and every block and inode number a
//! test corrupts is known. Not a file system: no permission checks, no crash ordering.

use cairn_ffs::format::superblock::{GroupDesc, STATE_CLEAN};
use cairn_ffs::format::{
    DiskInode, FAST_SYMLINK_MAX, Geometry, INODE_SIZE, LOST_FOUND_INO, NDIRECT, ROOT_INO,
    Superblock, bitmap, dir, xattr,
};

/// An image held in memory.
pub struct Image {
    pub bytes: Vec<u8>,
    pub g: Geometry,
    pub sb: Superblock,
}

impl Image {
    /// A fresh file system: root (2) and lost+found (3), inodes 0 and 1 reserved.
    pub fn mkfs(block_size: u32, total_blocks: u64, blocks_per_group: u64, inodes: u64) -> Image {
        let g = Geometry::for_mkfs(
            block_size,
            total_blocks,
            Some(inodes),
            Some(blocks_per_group),
        )
        .expect("test geometry");
        let sb = Superblock {
            version: cairn_ffs::format::FORMAT_VERSION,
            block_size,
            total_blocks: g.total_blocks,
            blocks_per_group: g.blocks_per_group as u32,
            inodes_per_group: g.inodes_per_group as u32,
            group_count: g.group_count as u32,
            inode_size: INODE_SIZE as u32,
            free_blocks: 0,
            free_inodes: 0,
            root_ino: ROOT_INO,
            created_ns: 1,
            mounted_ns: 0,
            written_ns: 1,
            state: STATE_CLEAN,
            mount_count: 0,
            uuid: [0x5a; 16],
            label: "test".into(),
            last_mode: String::new(),
            feature_compat: 0,
            feature_incompat: 0,
            feature_ro_compat: 0,
            dirs: 0,
            journal_first: 0,
            journal_blocks: 0,
        };
        let mut img = Image {
            bytes: vec![0; (g.total_blocks * block_size as u64) as usize],
            g,
            sb,
        };
        for grp in 0..g.group_count {
            for b in g.group_start(grp)..g.first_data(grp) {
                img.set_block_used(b, true);
            }
        }
        for ino in 0..ROOT_INO {
            img.set_inode_used(ino, true);
        }
        img.set_inode_used(ROOT_INO, true);
        img.init_dir(ROOT_INO, ROOT_INO, 0o755);
        img.set_inode_used(LOST_FOUND_INO, true);
        img.init_dir(LOST_FOUND_INO, ROOT_INO, 0o700);
        img.add_entry(ROOT_INO, b"lost+found", LOST_FOUND_INO);
        img.bump_nlink(ROOT_INO, 1);
        img.finish();
        img
    }

    /// The default small test image: 4 KiB blocks, 3 groups of 256 blocks, 64 inodes each.
    pub fn small() -> Image {
        Image::mkfs(4096, 768, 256, 192)
    }

    /// A small image with a bit of everything: nested directories, small and large files
    /// (through the double-indirect range), a hard link, fast and slow symlinks, a fifo,
    /// a device node and an extended-attribute block.
    pub fn populated() -> Image {
        let mut img = Image::small();
        let a = img.mkdir(ROOT_INO, b"a");
        let b = img.mkdir(a, b"b");
        let _c = img.mkdir(ROOT_INO, b"c");
        let f = img.create(a, b"small", &pattern(1, 100));
        img.create(b, b"medium", &pattern(2, 5 * 4096 + 17));
        img.create(ROOT_INO, b"big", &pattern(3, (NDIRECT + 520) * 4096 + 5));
        img.link(b, b"hardlink", f);
        img.symlink(ROOT_INO, b"fast", b"a/small");
        img.symlink(a, b"slow", &[b'x'; 200]);
        img.mknod(ROOT_INO, b"fifo", libc::S_IFIFO | 0o644, 0);
        img.mknod(b, b"null", libc::S_IFCHR | 0o666, 0x103);
        img.set_xattrs(f, &[(b"user.k".to_vec(), b"v".to_vec())]);
        img.finish();
        img
    }

    pub fn bs(&self) -> usize {
        self.g.bs()
    }

    pub fn block(&self, b: u64) -> &[u8] {
        let bs = self.bs();
        &self.bytes[b as usize * bs..(b as usize + 1) * bs]
    }
    pub fn block_mut(&mut self, b: u64) -> &mut [u8] {
        let bs = self.bs();
        &mut self.bytes[b as usize * bs..(b as usize + 1) * bs]
    }

    pub fn inode(&self, ino: u64) -> DiskInode {
        let (blk, off) = self.g.inode_location(ino);
        DiskInode::decode(ino, &self.block(blk)[off..off + INODE_SIZE]).expect("test inode")
    }
    pub fn put_inode(&mut self, ino: u64, d: &DiskInode) {
        let (blk, off) = self.g.inode_location(ino);
        d.encode(ino, &mut self.block_mut(blk)[off..off + INODE_SIZE]);
    }
    /// The 256 raw bytes of an inode.
    pub fn inode_raw_mut(&mut self, ino: u64) -> &mut [u8] {
        let (blk, off) = self.g.inode_location(ino);
        &mut self.block_mut(blk)[off..off + INODE_SIZE]
    }

    pub fn set_block_used(&mut self, b: u64, v: bool) {
        let grp = self.g.group_of_block(b);
        let bm = self.g.block_bitmap(grp);
        let i = (b - self.g.group_start(grp)) as usize;
        bitmap::set(self.block_mut(bm), i, v);
    }
    pub fn block_used(&self, b: u64) -> bool {
        let grp = self.g.group_of_block(b);
        bitmap::get(
            self.block(self.g.block_bitmap(grp)),
            (b - self.g.group_start(grp)) as usize,
        )
    }
    pub fn set_inode_used(&mut self, ino: u64, v: bool) {
        let grp = self.g.group_of_ino(ino);
        let bm = self.g.inode_bitmap(grp);
        let i = (ino % self.g.inodes_per_group) as usize;
        bitmap::set(self.block_mut(bm), i, v);
    }
    pub fn inode_used(&self, ino: u64) -> bool {
        let grp = self.g.group_of_ino(ino);
        bitmap::get(
            self.block(self.g.inode_bitmap(grp)),
            (ino % self.g.inodes_per_group) as usize,
        )
    }

    pub fn alloc_block(&mut self) -> u64 {
        let b = (0..self.g.total_blocks)
            .find(|&b| self.g.is_data_block(b) && !self.block_used(b))
            .expect("test image full");
        self.set_block_used(b, true);
        self.block_mut(b).fill(0);
        b
    }
    pub fn alloc_inode(&mut self) -> u64 {
        let ino = (ROOT_INO..self.g.total_inodes())
            .find(|&i| !self.inode_used(i))
            .expect("no inodes");
        self.set_inode_used(ino, true);
        ino
    }

    fn init_dir(&mut self, ino: u64, parent: u64, perm: u32) {
        let b = self.alloc_block();
        dir::init_first(self.block_mut(b), ino, parent);
        let mut d = DiskInode {
            mode: libc::S_IFDIR | perm,
            nlink: 2,
            size: self.bs() as u64,
            blocks: 1,
            ..Default::default()
        };
        d.direct[0] = b;
        self.put_inode(ino, &d);
    }

    fn bump_nlink(&mut self, ino: u64, by: i32) {
        let mut d = self.inode(ino);
        d.nlink = d.nlink.wrapping_add_signed(by);
        self.put_inode(ino, &d);
    }

    /// The physical block of a file's logical block (0 = hole).
    pub fn bmap(&self, ino: u64, lblk: u64) -> u64 {
        let d = self.inode(ino);
        let ppb = self.g.ptrs_per_block();
        if lblk < NDIRECT as u64 {
            return d.direct[lblk as usize];
        }
        let mut rel = lblk - NDIRECT as u64;
        let mut span = 1;
        for level in 1..=3u32 {
            span *= ppb;
            if rel < span {
                let mut p = d.indirect[level as usize - 1];
                let mut s = span;
                for _ in 0..level {
                    if p == 0 {
                        return 0;
                    }
                    s /= ppb;
                    let i = (rel / s) as usize;
                    rel %= s;
                    p = u64::from_le_bytes(self.block(p)[i * 8..i * 8 + 8].try_into().unwrap());
                }
                return p;
            }
            rel -= span;
        }
        0
    }

    /// Maps `lblk` of inode `d` to a new block, allocating index blocks; returns the block.
    fn map_new(&mut self, d: &mut DiskInode, lblk: u64) -> u64 {
        let ppb = self.g.ptrs_per_block();
        let b = self.alloc_block();
        d.blocks += 1;
        if lblk < NDIRECT as u64 {
            d.direct[lblk as usize] = b;
            return b;
        }
        let mut rel = lblk - NDIRECT as u64;
        let mut span = 1;
        for level in 1..=3u32 {
            span *= ppb;
            if rel < span {
                if d.indirect[level as usize - 1] == 0 {
                    d.indirect[level as usize - 1] = self.alloc_block();
                    d.blocks += 1;
                }
                let mut p = d.indirect[level as usize - 1];
                let mut s = span;
                for depth in 0..level {
                    s /= ppb;
                    let i = (rel / s) as usize;
                    rel %= s;
                    if depth + 1 == level {
                        self.block_mut(p)[i * 8..i * 8 + 8].copy_from_slice(&b.to_le_bytes());
                    } else {
                        let mut q =
                            u64::from_le_bytes(self.block(p)[i * 8..i * 8 + 8].try_into().unwrap());
                        if q == 0 {
                            q = self.alloc_block();
                            d.blocks += 1;
                            self.block_mut(p)[i * 8..i * 8 + 8].copy_from_slice(&q.to_le_bytes());
                        }
                        p = q;
                    }
                }
                return b;
            }
            rel -= span;
        }
        panic!("logical block {lblk} beyond the triple-indirect range");
    }

    /// Adds a name to a directory (growing it by a block when full).
    pub fn add_entry(&mut self, dirino: u64, name: &[u8], ino: u64) {
        let k = (self.inode(ino).mode >> 12) as u8;
        let mut d = self.inode(dirino);
        let bs = self.bs() as u64;
        for lblk in 0..d.size / bs {
            let p = self.bmap(dirino, lblk);
            for c in 0..self.bs() / dir::DIR_CHUNK {
                if dir::insert(self.block_mut(p), c, ino, k, name)
                    .unwrap()
                    .is_some()
                {
                    return;
                }
            }
        }
        let lblk = d.size / bs;
        let p = self.map_new(&mut d, lblk);
        dir::init_empty(self.block_mut(p));
        dir::insert(self.block_mut(p), 0, ino, k, name)
            .unwrap()
            .unwrap();
        d.size += bs;
        self.put_inode(dirino, &d);
    }

    /// Where the entry `name` of directory `dirino` is: (block, offset).
    pub fn find_entry(&self, dirino: u64, name: &[u8]) -> Option<(u64, usize)> {
        let d = self.inode(dirino);
        for lblk in 0..d.size / self.bs() as u64 {
            let p = self.bmap(dirino, lblk);
            for e in dir::entries(self.block(p)).flatten() {
                if e.name == name {
                    return Some((p, e.off));
                }
            }
        }
        None
    }

    pub fn lookup(&self, dirino: u64, name: &[u8]) -> Option<u64> {
        self.find_entry(dirino, name).map(|(p, off)| {
            u32::from_le_bytes(self.block(p)[off..off + 4].try_into().unwrap()) as u64
        })
    }

    pub fn mkdir(&mut self, parent: u64, name: &[u8]) -> u64 {
        let ino = self.alloc_inode();
        self.init_dir(ino, parent, 0o755);
        self.add_entry(parent, name, ino);
        self.bump_nlink(parent, 1);
        ino
    }

    pub fn create(&mut self, parent: u64, name: &[u8], data: &[u8]) -> u64 {
        let ino = self.alloc_inode();
        let mut d = DiskInode {
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            size: data.len() as u64,
            ..Default::default()
        };
        let bs = self.bs();
        for (lblk, chunk) in data.chunks(bs).enumerate() {
            let b = self.map_new(&mut d, lblk as u64);
            self.block_mut(b)[..chunk.len()].copy_from_slice(chunk);
        }
        self.put_inode(ino, &d);
        self.add_entry(parent, name, ino);
        ino
    }

    /// Reads a regular file's contents through its block map.
    pub fn read_file(&self, ino: u64) -> Vec<u8> {
        let d = self.inode(ino);
        let bs = self.bs() as u64;
        let mut out = Vec::with_capacity(d.size as usize);
        for lblk in 0..d.size.div_ceil(bs) {
            let p = self.bmap(ino, lblk);
            let n = (d.size - lblk * bs).min(bs) as usize;
            if p == 0 {
                out.extend(std::iter::repeat_n(0u8, n));
            } else {
                out.extend_from_slice(&self.block(p)[..n]);
            }
        }
        out
    }

    pub fn link(&mut self, parent: u64, name: &[u8], ino: u64) {
        self.add_entry(parent, name, ino);
        self.bump_nlink(ino, 1);
    }

    pub fn symlink(&mut self, parent: u64, name: &[u8], target: &[u8]) -> u64 {
        let ino = self.alloc_inode();
        let mut d = DiskInode {
            mode: libc::S_IFLNK | 0o777,
            nlink: 1,
            size: target.len() as u64,
            ..Default::default()
        };
        if target.len() <= FAST_SYMLINK_MAX {
            d.fast_link = Some(target.to_vec());
        } else {
            let b = self.map_new(&mut d, 0);
            self.block_mut(b)[..target.len()].copy_from_slice(target);
        }
        self.put_inode(ino, &d);
        self.add_entry(parent, name, ino);
        ino
    }

    pub fn mknod(&mut self, parent: u64, name: &[u8], mode: u32, rdev: u32) -> u64 {
        let ino = self.alloc_inode();
        let d = DiskInode {
            mode,
            nlink: 1,
            rdev,
            ..Default::default()
        };
        self.put_inode(ino, &d);
        self.add_entry(parent, name, ino);
        ino
    }

    pub fn set_xattrs(&mut self, ino: u64, attrs: &[(Vec<u8>, Vec<u8>)]) {
        let mut d = self.inode(ino);
        let b = self.alloc_block();
        assert!(xattr::encode(attrs, self.block_mut(b)));
        d.xattr = b;
        d.blocks += 1;
        self.put_inode(ino, &d);
    }

    /// Gives inode `ino` the attributes `attrs` as a chain (they must need one), with the
    /// chain feature set; returns the chain's blocks.
    pub fn set_xattr_chain(&mut self, ino: u64, attrs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u64> {
        let bs = self.sb.block_size as usize;
        let n = xattr::blocks_needed(attrs, bs).expect("fits a chain");
        assert!(n > 1, "needs a chain");
        let blks: Vec<u64> = (0..n).map(|_| self.alloc_block()).collect();
        let images = xattr::encode_chain(attrs, ino, &blks, bs).expect("encodes");
        for (&b, image) in blks.iter().zip(images) {
            self.block_mut(b).copy_from_slice(&image);
        }
        let mut d = self.inode(ino);
        d.xattr = blks[0];
        d.blocks += n as u64;
        self.put_inode(ino, &d);
        self.sb.feature_incompat |= cairn_ffs::format::superblock::FEATURE_INCOMPAT_XATTR_CHAIN;
        blks
    }

    /// Recomputes the summaries (descriptors and superblock) from the bitmaps and writes
    /// the superblock into every group.
    pub fn finish(&mut self) {
        let g = self.g;
        let (mut fb, mut fi, mut dirs) = (0u64, 0u64, 0u64);
        for grp in 0..g.group_count {
            let bm = self.block(g.block_bitmap(grp)).to_vec();
            let im = self.block(g.inode_bitmap(grp)).to_vec();
            let used_b = bitmap::count_set(&bm, g.group_len(grp) as usize) as u64;
            let used_i = bitmap::count_set(&im, g.inodes_per_group as usize) as u64;
            let gdirs = (0..g.inodes_per_group)
                .map(|i| grp * g.inodes_per_group + i)
                .filter(|&ino| ino >= ROOT_INO && self.inode_used(ino) && self.inode(ino).is_dir())
                .count() as u64;
            let d = GroupDesc {
                group: grp as u32,
                free_blocks: (g.group_len(grp) - used_b) as u32,
                free_inodes: (g.inodes_per_group - used_i) as u32,
                dirs: gdirs as u32,
            };
            d.encode(self.block_mut(g.desc_block(grp)));
            fb += d.free_blocks as u64;
            fi += d.free_inodes as u64;
            dirs += gdirs;
        }
        self.sb.free_blocks = fb;
        self.sb.free_inodes = fi;
        self.sb.dirs = dirs;
        self.write_superblocks();
    }

    pub fn write_superblocks(&mut self) {
        let sb = self.sb.clone();
        for grp in 0..self.g.group_count {
            let b = self.g.sb_block(grp);
            sb.encode(self.block_mut(b));
        }
    }

    /// A memory device over a copy of the image.
    pub fn device(&self) -> cairn_blockdev::MemDevice {
        cairn_blockdev::MemDevice::from_bytes(4096, self.bytes.clone())
    }
}

/// Deterministic file contents.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 12) as u8)
        })
        .collect()
}
