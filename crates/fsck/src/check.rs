//! The passes. See the crate documentation for their order and the finding classes.
//!
//! The in-memory state always describes the file system *as repaired*: when a pointer is
//! found bad it is dropped from the model whether or not we are repairing, so later passes
//! reason about the same file system a repair would produce. Only the writes depend on
//! `repair`. That is what makes "a second run after repair is clean" hold: the second run
//! sees on disk exactly the model the first run ended with.

use std::collections::{HashMap, HashSet};
use std::io;

use cairn_blockdev::BlockDevice;
use cairn_ffs::format::superblock::{GroupDesc, STATE_CLEAN};
use cairn_ffs::format::{
    DIR_CHUNK, DiskInode, Geometry, INODE_SIZE, LOST_FOUND_INO, NDIRECT, ROOT_INO, Superblock,
    bitmap, dir, xattr,
};
use cairn_vfs::{acl, fileattr};

use crate::disk::{Disk, locate};
use crate::{CheckOptions, Class, Finding, FsckError, Kind, Pass, Progress, Report, Stats};

type Result<T> = std::result::Result<T, FsckError>;

const KIND_MASK: u8 = 0x0f;
/// The directory has entries besides `.` and `..`.
const F_NONEMPTY: u8 = 0x10;
/// Pass 3: reachable from the root.
const F_REACH: u8 = 0x20;
/// Pass 3: on the parent chain being followed.
const F_INPROG: u8 = 0x40;

const K_DIR: u8 = (libc::S_IFDIR >> 12) as u8;
const K_REG: u8 = (libc::S_IFREG >> 12) as u8;
const K_LNK: u8 = (libc::S_IFLNK >> 12) as u8;
/// Longest symlink target (PATH_MAX without the NUL).
const MAX_SYMLINK: u64 = 4095;

/// One bit per block: the blocks the file system really uses.
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: u64) -> Bits {
        Bits(vec![0; n.div_ceil(64) as usize])
    }
    fn get(&self, i: u64) -> bool {
        self.0
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    fn set(&mut self, i: u64, v: bool) {
        if let Some(w) = self.0.get_mut((i / 64) as usize) {
            if v {
                *w |= 1 << (i % 64)
            } else {
                *w &= !(1 << (i % 64))
            }
        }
    }
}

/// Where a directory entry lives: the block and the record's offset in it.
#[derive(Clone, Copy, Debug)]
struct Loc {
    pblk: u64,
    off: usize,
}

/// A name in directory `parent` for directory `child`.
#[derive(Clone, Copy, Debug)]
struct DirLink {
    child: u64,
    parent: u64,
    at: Loc,
}

/// A directory's `..` record: its target (0 when the record was rebuilt by this run and the
/// parent is not known yet) and where it is.
#[derive(Clone, Copy, Debug)]
struct DotDot {
    target: u64,
    at: Loc,
}

struct Checker<'a> {
    disk: Disk<'a>,
    repair: bool,
    progress: Option<crate::ProgressFn>,
    sb: Superblock,
    g: Geometry,
    bs: usize,
    findings: Vec<Finding>,
    /// Descriptors that failed to decode (rewritten in pass 5).
    bad_desc: Vec<bool>,
    descs: Vec<GroupDesc>,
    used: Bits,
    /// Per inode: file kind (S_IFMT >> 12, 0 = free) and the F_* flags.
    istate: Vec<u8>,
    nlink: Vec<u32>,
    /// Entries naming the inode (non-directories); subdirectories (directories).
    refs: Vec<u32>,
    /// (directory, logical block, physical block) of every directory block.
    dblist: Vec<(u64, u64, u64)>,
    dsize: HashMap<u64, u64>,
    dotdot: HashMap<u64, DotDot>,
    links: Vec<DirLink>,
    /// The chosen name of every directory but the root: its parent and the entry.
    parent: HashMap<u64, DirLink>,
    /// The inode root's "lost+found" entry names, if any.
    lf_entry: Option<u64>,
    lf: Option<u64>,
    lf_failed: bool,
    rotor: u64,
    /// Inodes no directory named (found in passes 3 and 4): if their bitmap bit is clear,
    /// the crash came between writing the inode and its bitmap, and nothing depends on it.
    unreferenced_inodes: std::collections::HashSet<u64>,
}

pub(crate) fn run(dev: &dyn BlockDevice, opts: CheckOptions) -> Result<Report> {
    let disk = Disk::new(dev);
    let loc = locate(&disk)?;
    let g = loc.geo;
    let ninodes = g.total_inodes() as usize;
    let mut c = Checker {
        disk,
        repair: opts.repair,
        progress: opts.progress,
        sb: loc.sb,
        g,
        bs: g.bs(),
        findings: Vec::new(),
        bad_desc: vec![false; g.group_count as usize],
        descs: vec![GroupDesc::default(); g.group_count as usize],
        used: Bits::new(g.total_blocks),
        istate: vec![0; ninodes],
        nlink: vec![0; ninodes],
        refs: vec![0; ninodes],
        dblist: Vec::new(),
        dsize: HashMap::new(),
        dotdot: HashMap::new(),
        links: Vec::new(),
        parent: HashMap::new(),
        lf_entry: None,
        lf: None,
        lf_failed: false,
        rotor: 0,
        unreferenced_inodes: Default::default(),
    };
    let mut backup_group = None;
    if let Some((grp, why)) = loc.backup {
        backup_group = Some(grp);
        let fixed = c.repair;
        c.note(
            Class::Corruption,
            Pass::Superblock,
            fixed,
            format!("primary superblock unusable ({why}); using the backup in group {grp}"),
        );
    }
    c.pass0()?;
    c.pass1()?;
    c.pass2()?;
    c.pass3()?;
    c.pass4()?;
    c.pass5(backup_group.is_some())?;
    if c.repair {
        c.disk.flush()?;
    }
    let stats = c.stats();
    let fixed = c.findings.iter().filter(|f| f.fixed).count();
    Ok(Report {
        findings: c.findings,
        fixed,
        stats,
        backup_superblock: backup_group,
        repaired: c.repair,
    })
}

impl Checker<'_> {
    // ---------------------------------------------------------------------------------
    // Helpers

    /// Records a finding. `fixable` is whether this run's repair corrects it; it is only
    /// reported fixed when repairing.
    fn note(&mut self, class: Class, pass: Pass, fixable: bool, message: String) {
        self.note_kind(class, pass, Kind::Other, fixable, message);
    }
    /// [`Checker::note`] of a finding a tool tells apart by its [`Kind`].
    fn note_kind(&mut self, class: Class, pass: Pass, kind: Kind, fixable: bool, message: String) {
        let fixed = fixable && self.repair;
        self.findings.push(Finding {
            class,
            pass,
            kind,
            message,
            fixed,
        });
    }
    /// The last finding's repair could not be completed after all (no space).
    fn unfix_last(&mut self) {
        if let Some(f) = self.findings.last_mut() {
            f.fixed = false;
            f.message.push_str(" (failed: lost+found cannot grow)");
        }
    }
    fn corrupt(&mut self, pass: Pass, msg: String) {
        self.note(Class::Corruption, pass, true, msg);
    }
    fn leak(&mut self, pass: Pass, msg: String) {
        self.note(Class::Leak, pass, true, msg);
    }

    fn tick(&mut self, pass: Pass, done: u64, total: u64) {
        if let Some(p) = self.progress.as_mut() {
            p(&Progress { pass, done, total });
        }
    }

    fn read_block(&self, b: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; self.bs];
        self.read_into(b, &mut buf)?;
        Ok(buf)
    }
    fn read_into(&self, b: u64, buf: &mut [u8]) -> Result<()> {
        if b.saturating_add((buf.len() / self.bs) as u64) > self.g.total_blocks {
            return Err(FsckError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("internal: read of block {b} beyond the file system"),
            )));
        }
        self.disk.read(b * self.bs as u64, buf)?;
        Ok(())
    }
    /// Writes a block when repairing; a no-op when only checking.
    fn write_block(&self, b: u64, buf: &[u8]) -> Result<()> {
        if self.repair && b < self.g.total_blocks {
            self.disk.write(b * self.bs as u64, buf)?;
        }
        Ok(())
    }

    fn read_inode_raw(&self, ino: u64) -> Result<[u8; INODE_SIZE]> {
        let (blk, off) = self.g.inode_location(ino);
        let mut raw = [0u8; INODE_SIZE];
        self.disk
            .read(blk * self.bs as u64 + off as u64, &mut raw)?;
        Ok(raw)
    }
    /// The POSIX ACLs among inode `ino`'s extended attributes (`cairn_vfs::acl::audit`):
    /// a value that is no valid ACL, a default ACL on a non-directory or any ACL on a
    /// symlink is dropped (the block rewritten without it), a mode that disagrees with its
    /// access ACL set from it. Returns whether `d` changed.
    fn acls(
        &mut self,
        ino: u64,
        d: &mut DiskInode,
        mut attrs: Vec<(Vec<u8>, Vec<u8>)>,
        blocks: &[u64],
    ) -> Result<bool> {
        let a = acl::audit(d.mode, |k| {
            attrs
                .iter()
                .find(|(n, _)| n.as_slice() == k.xattr())
                .map(|(_, v)| v.as_slice())
        });
        for p in &a.problems {
            self.corrupt(Pass::Inodes, format!("inode {ino}: {p}"));
        }
        if !a.drop.is_empty() {
            attrs.retain(|(n, _)| !a.drop.iter().any(|k| k.xattr() == n.as_slice()));
            // Fewer attributes fit the same blocks (a chain's last ones may go empty).
            if let Some(images) = xattr::encode_chain(&attrs, ino, blocks, self.bs) {
                for (&b, image) in blocks.iter().zip(images) {
                    self.write_block(b, &image)?;
                }
            }
        }
        let changed = a.mode != d.mode;
        d.mode = a.mode;
        Ok(changed)
    }

    /// Inode `ino`'s extended attributes, from the block its inode names: a single block or
    /// a chain (`xattr::read_chain`: magic, checksum, owner and position of each block, at
    /// most `xattr::CHAIN_MAX` blocks, no cycle, a stream that decodes), every block in range
    /// and claimed by no other pointer. `None`: damaged, reported and dropped (its blocks
    /// unclaimed again).
    #[allow(clippy::type_complexity)]
    fn xattrs(
        &mut self,
        ino: u64,
        head: u64,
    ) -> Result<Option<(Vec<(Vec<u8>, Vec<u8>)>, Vec<u64>)>> {
        let mut claimed = Vec::new();
        let mut io_err = None;
        let r = xattr::read_chain(ino, head, |b| {
            if let Err(why) = self.claim(b) {
                return Err(cairn_ffs::format::FormatError(format!(
                    "extended-attribute block {b} {why}"
                )));
            }
            claimed.push(b);
            self.read_block(b).map_err(|e| {
                let msg = e.to_string();
                io_err = Some(e);
                cairn_ffs::format::FormatError(msg)
            })
        });
        if let Some(e) = io_err {
            return Err(e);
        }
        match r {
            Ok(c) => {
                let feature = cairn_ffs::format::superblock::FEATURE_INCOMPAT_XATTR_CHAIN;
                if c.blocks.len() > 1 && self.sb.feature_incompat & feature == 0 {
                    self.corrupt(
                        Pass::Inodes,
                        format!(
                            "inode {ino}: extended-attribute chain on an image without the chain feature; feature set"
                        ),
                    );
                    self.sb.feature_incompat |= feature;
                    let mut buf = vec![0u8; self.bs];
                    self.sb.encode(&mut buf);
                    self.write_block(0, &buf)?;
                }
                Ok(Some((c.attrs, c.blocks)))
            }
            Err(e) => {
                for b in claimed {
                    self.used.set(b, false);
                }
                self.corrupt(Pass::Inodes, format!("inode {ino}: {}; dropped", e.0));
                Ok(None)
            }
        }
    }

    fn put_inode(&self, ino: u64, d: &DiskInode) -> Result<()> {
        if self.repair {
            let mut raw = [0u8; INODE_SIZE];
            d.encode(ino, &mut raw);
            let (blk, off) = self.g.inode_location(ino);
            self.disk.write(blk * self.bs as u64 + off as u64, &raw)?;
        }
        Ok(())
    }
    /// The inode as it is on disk after this run's repairs (decoding with the checksum
    /// recomputed, since a damaged checksum was already reported).
    fn get_inode(&self, ino: u64) -> Result<Option<DiskInode>> {
        let mut raw = self.read_inode_raw(ino)?;
        let c = inode_crc(ino, &raw);
        raw[252..256].copy_from_slice(&c.to_le_bytes());
        Ok(DiskInode::decode(ino, &raw).ok())
    }
    fn clear_inode(&mut self, ino: u64, generation: u32) -> Result<()> {
        let d = DiskInode {
            generation,
            ..Default::default()
        };
        self.put_inode(ino, &d)?;
        if let Some(s) = self.istate.get_mut(ino as usize) {
            *s = 0;
        }
        Ok(())
    }

    fn kind(&self, ino: u64) -> u8 {
        self.istate.get(ino as usize).map_or(0, |s| s & KIND_MASK)
    }
    fn flag(&self, ino: u64, f: u8) -> bool {
        self.istate.get(ino as usize).is_some_and(|s| s & f != 0)
    }
    fn set_flag(&mut self, ino: u64, f: u8, v: bool) {
        if let Some(s) = self.istate.get_mut(ino as usize) {
            if v { *s |= f } else { *s &= !f }
        }
    }

    /// Claims a data block for an inode: it must be in range, outside group metadata and
    /// not already claimed.
    fn claim(&mut self, p: u64) -> std::result::Result<(), Unclaimable> {
        if !self.g.is_data_block(p) {
            return Err(if p >= self.g.total_blocks {
                Unclaimable::OutOfRange
            } else {
                Unclaimable::GroupMetadata
            });
        }
        if self.used.get(p) {
            return Err(Unclaimable::Claimed);
        }
        self.used.set(p, true);
        Ok(())
    }

    /// A free data block, preferring ones after `near` (FFS's rotor-less first fit).
    /// The scan resumes where the last one stopped (a rotor), so many allocations in one
    /// run stay linear in the device size.
    fn alloc_block(&mut self, near: u64) -> Option<u64> {
        let t = self.g.total_blocks;
        let start = if self.rotor == 0 { near } else { self.rotor }.min(t);
        let b = (start..t)
            .chain(0..start)
            .find(|&b| self.g.is_data_block(b) && !self.used.get(b))?;
        self.used.set(b, true);
        self.rotor = b + 1;
        Some(b)
    }

    fn alloc_inode(&mut self) -> Option<u64> {
        let n = self.g.total_inodes();
        (LOST_FOUND_INO..n).find(|&i| self.kind(i) == 0)
    }

    // ---------------------------------------------------------------------------------
    // Pass 0: superblock copies and group descriptors

    fn pass0(&mut self) -> Result<()> {
        let groups = self.g.group_count;
        let mut buf = vec![0u8; self.bs];
        for grp in 0..groups {
            self.read_into(self.g.desc_block(grp), &mut buf)?;
            match GroupDesc::decode(&buf, grp) {
                Ok(d) => self.descs[grp as usize] = d,
                Err(e) => {
                    self.bad_desc[grp as usize] = true;
                    self.corrupt(Pass::Superblock, e.0);
                }
            }
            if grp > 0 {
                self.read_into(self.g.sb_block(grp), &mut buf)?;
                let ok = match Superblock::decode(&buf) {
                    Ok(copy) => same_geometry(&copy, &self.sb),
                    Err(_) => false,
                };
                if !ok {
                    self.corrupt(
                        Pass::Superblock,
                        format!("group {grp}: backup superblock damaged or different"),
                    );
                    if self.repair {
                        let sb = self.sb.clone();
                        sb.encode(&mut buf);
                        buf[cairn_ffs::format::superblock::SB_BYTES..].fill(0);
                        self.write_block(self.g.sb_block(grp), &buf)?;
                    }
                }
            }
            // Group metadata is in use by definition.
            for b in self.g.group_start(grp)..self.g.first_data(grp).min(self.g.total_blocks) {
                self.used.set(b, true);
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------
    // Pass 1: inodes

    fn pass1(&mut self) -> Result<()> {
        let ipg = self.g.inodes_per_group;
        let ipb = self.g.inodes_per_block();
        let total = self.g.total_inodes();
        // Inodes whose checksum is wrong are examined after all the others, so that in a
        // conflict over a block the inode we can trust keeps it.
        let mut suspects = Vec::new();
        const RUN: u64 = 16;
        let mut table = vec![0u8; RUN as usize * self.bs];
        for grp in 0..self.g.group_count {
            self.tick(Pass::Inodes, grp * ipg, total);
            let mut tb = 0;
            while tb < self.g.inode_table_blocks {
                let n = RUN.min(self.g.inode_table_blocks - tb);
                let buf = &mut table[..(n as usize) * self.bs];
                self.read_into(self.g.inode_table(grp) + tb, buf)?;
                for i in 0..n * ipb {
                    let ino = grp * ipg + tb * ipb + i;
                    if ino < ROOT_INO {
                        continue;
                    }
                    let raw: [u8; INODE_SIZE] = table
                        [(i as usize) * INODE_SIZE..(i as usize + 1) * INODE_SIZE]
                        .try_into()
                        .expect("256 bytes");
                    if u32::from_le_bytes(raw[252..256].try_into().expect("4"))
                        != inode_crc(ino, &raw)
                    {
                        if raw.iter().all(|&b| b == 0) {
                            continue; // never-written table space: a free inode
                        }
                        suspects.push(ino);
                        continue;
                    }
                    self.inode(ino, raw, false)?;
                }
                tb += n;
            }
        }
        for ino in suspects {
            let raw = self.read_inode_raw(ino)?;
            self.inode(ino, raw, true)?;
        }
        self.tick(Pass::Inodes, total, total);
        Ok(())
    }

    /// Examines one inode; `bad_crc` when its checksum did not match.
    fn inode(&mut self, ino: u64, mut raw: [u8; INODE_SIZE], bad_crc: bool) -> Result<()> {
        let generation = u32::from_le_bytes(raw[68..72].try_into().expect("4"));
        if bad_crc {
            let c = inode_crc(ino, &raw);
            raw[252..256].copy_from_slice(&c.to_le_bytes());
        }
        let mut d = match DiskInode::decode(ino, &raw) {
            Ok(d) => d,
            Err(e) => {
                let why = if bad_crc {
                    "checksum mismatch and "
                } else {
                    ""
                };
                self.corrupt(
                    Pass::Inodes,
                    format!("inode {ino}: {why}{}; cleared", strip_ino(&e.0)),
                );
                return self.clear_inode(ino, generation);
            }
        };
        if d.is_free() {
            let stale = raw[..68].iter().chain(&raw[72..252]).any(|&b| b != 0);
            if bad_crc || stale {
                self.corrupt(
                    Pass::Inodes,
                    format!("free inode {ino} has stale contents; zeroed"),
                );
                self.clear_inode(ino, generation)?;
            }
            return Ok(());
        }
        if bad_crc {
            self.corrupt(
                Pass::Inodes,
                format!("inode {ino}: checksum mismatch; fields kept where valid"),
            );
        }
        let kind = ((d.mode & libc::S_IFMT) >> 12) as u8;
        if ino == ROOT_INO && kind != K_DIR {
            self.corrupt(
                Pass::Inodes,
                format!("root inode is not a directory (mode {:o}); cleared", d.mode),
            );
            return self.clear_inode(ino, generation);
        }
        if kind == K_LNK {
            let bad_len = d.size == 0
                || d.size > MAX_SYMLINK
                || (d.fast_link.is_none() && d.size > self.bs as u64);
            if bad_len {
                self.corrupt(
                    Pass::Inodes,
                    format!("inode {ino}: symlink of bad length {}; cleared", d.size),
                );
                return self.clear_inode(ino, generation);
            }
        }
        let mut changed = bad_crc;
        let mut walk = Walk {
            ino,
            kind,
            count: 0,
            last: None,
            bad: 0,
            beyond: 0,
            dups: 0,
            eof: if kind == K_REG {
                d.size.div_ceil(self.bs as u64)
            } else {
                u64::MAX
            },
            past_eof: 0,
            under_index: 0,
        };
        let has_tree = matches!(kind, K_DIR | K_REG) || (kind == K_LNK && d.fast_link.is_none());
        if has_tree {
            for i in 0..NDIRECT {
                let p = d.direct[i];
                if p != 0 && !self.data_ptr(&mut walk, p, i as u64) {
                    d.direct[i] = 0;
                    changed = true;
                }
            }
            let ppb = self.g.ptrs_per_block();
            let mut base = NDIRECT as u64;
            let mut span = 1u64;
            for level in 1..=3u32 {
                span = span.saturating_mul(ppb);
                let p = d.indirect[level as usize - 1];
                let before = walk.count;
                if p != 0 {
                    if self.indirect(&mut walk, p, level, base)? {
                        // What the index block points to (not the block itself, which the
                        // inode names beside its count).
                        walk.under_index += walk.count.saturating_sub(before + 1);
                    } else {
                        d.indirect[level as usize - 1] = 0;
                        changed = true;
                    }
                }
                base = base.saturating_add(span);
            }
        } else if d.root_pointers().next().is_some() {
            self.corrupt(
                Pass::Inodes,
                format!("inode {ino}: special file or fast symlink has block pointers; dropped"),
            );
            d.direct = [0; NDIRECT];
            d.indirect = [0; 3];
            changed = true;
        }
        if walk.bad > 0 {
            self.corrupt(
                Pass::Inodes,
                format!(
                    "inode {ino}: {} block pointers out of range or into group metadata; dropped",
                    walk.bad
                ),
            );
        }
        if walk.dups > 0 {
            self.corrupt(
                Pass::Inodes,
                format!(
                    "inode {ino}: {} blocks already claimed by another file; dropped",
                    walk.dups
                ),
            );
        }
        if walk.beyond > 0 {
            self.corrupt(
                Pass::Inodes,
                format!(
                    "inode {ino}: symlink maps {} blocks beyond its first; freed",
                    walk.beyond
                ),
            );
        }
        if d.xattr != 0 {
            match self.xattrs(ino, d.xattr)? {
                Some((attrs, blocks)) => {
                    changed |= self.acls(ino, &mut d, attrs, &blocks)?;
                    walk.count += blocks.len() as u64;
                }
                None => {
                    d.xattr = 0;
                    changed = true;
                }
            }
        }
        let unknown = d.flags & !fileattr::SUPPORTED;
        if unknown != 0 {
            self.corrupt(
                Pass::Inodes,
                format!("inode {ino}: unknown inode flags {unknown:#x}; cleared"),
            );
            d.flags &= fileattr::SUPPORTED;
            changed = true;
        }
        if kind == K_REG && d.size > self.g.max_file_size() {
            let new = walk.last.map_or(0, |l| (l + 1) * self.bs as u64);
            self.corrupt(
                Pass::Inodes,
                format!(
                    "inode {ino}: size {} beyond the largest file; set to {new}",
                    d.size
                ),
            );
            d.size = new;
            changed = true;
        }
        if kind == K_DIR {
            let bs = self.bs as u64;
            let need = walk.last.map_or(bs, |l| (l + 1) * bs).max(bs);
            // The size must end exactly after the last block: a larger size would be a
            // run of holes (and, hostile, a walk of 2^52 blocks), a smaller one hides entries.
            if d.size != need {
                let new = need;
                self.corrupt(
                    Pass::Inodes,
                    format!(
                        "directory {ino}: size {} does not match its blocks; set to {new}",
                        d.size
                    ),
                );
                d.size = new;
                changed = true;
            }
            self.dsize.insert(ino, d.size);
        }
        if d.blocks != walk.count {
            // A count above the blocks found is what a crash leaves when the inode reached
            // disk before the indirect block holding its newest pointers: the blocks are
            // allocated but unreferenced (a leak, reclaimed in pass 5). A count below them by
            // no more than the blocks the inode's index blocks point to (or the blocks past
            // the end of a regular file) is the other order, the one fsync and soft updates
            // use (data, then indirect blocks, then the inode): an indirect block reached
            // disk with pointers to new data — past the end, or filling a hole — before the
            // inode whose count covers them; the blocks are allocated and referenced, only
            // the count lags (FFS fsck corrects it in preen mode, and FreeBSD's background
            // fsck adjusts it). A count below the blocks the inode itself names (its direct
            // pointers and index blocks, written with the count) is corruption.
            let lagging = d.blocks < walk.count
                && walk.count - d.blocks <= walk.past_eof.max(walk.under_index);
            let class = if d.blocks > walk.count || lagging {
                Class::Leak
            } else {
                Class::Corruption
            };
            self.note(
                class,
                Pass::Inodes,
                true,
                format!(
                    "inode {ino}: block count {} should be {}",
                    d.blocks, walk.count
                ),
            );
            d.blocks = walk.count;
            changed = true;
        }
        if changed {
            self.put_inode(ino, &d)?;
        }
        self.istate[ino as usize] = kind;
        self.nlink[ino as usize] = d.nlink;
        Ok(())
    }

    /// A data pointer at logical block `lblk`; false if it must be dropped.
    fn data_ptr(&mut self, w: &mut Walk, p: u64, lblk: u64) -> bool {
        // A regular file may own blocks past its size: fallocate(FALLOC_FL_KEEP_SIZE)
        // preallocates them, and the engine zeroes them when it hands them out. A slow
        // symlink owns exactly its first block.
        let beyond = w.kind == K_LNK && lblk > 0;
        if beyond && self.g.is_data_block(p) && !self.used.get(p) {
            w.beyond += 1;
            return false;
        }
        match self.claim(p) {
            Ok(()) => {
                w.count += 1;
                w.past_eof += (lblk >= w.eof) as u64;
                w.last = Some(w.last.map_or(lblk, |l| l.max(lblk)));
                if w.kind == K_DIR {
                    self.dblist.push((w.ino, lblk, p));
                }
                true
            }
            Err(_) if beyond => {
                w.beyond += 1;
                false
            }
            Err(Unclaimable::Claimed) => {
                w.dups += 1;
                false
            }
            Err(_) => {
                w.bad += 1;
                false
            }
        }
    }

    /// An indirect block of `level` mapping logical blocks from `base`; false if the
    /// pointer to it must be dropped.
    fn indirect(&mut self, w: &mut Walk, p: u64, level: u32, base: u64) -> Result<bool> {
        if let Err(why) = self.claim(p) {
            match why {
                Unclaimable::Claimed => w.dups += 1,
                Unclaimable::OutOfRange | Unclaimable::GroupMetadata => w.bad += 1,
            }
            return Ok(false);
        }
        if w.kind == K_LNK {
            // The whole subtree lies beyond a symlink's one block: release it.
            self.used.set(p, false);
            w.beyond += 1;
            return Ok(false);
        }
        w.count += 1;
        w.past_eof += (base >= w.eof) as u64;
        let mut blk = self.read_block(p)?;
        let ppb = self.g.ptrs_per_block();
        let span = ppb.saturating_pow(level - 1);
        let mut dirty = false;
        let mut live = 0;
        for j in 0..ppb as usize {
            let q = u64::from_le_bytes(blk[j * 8..j * 8 + 8].try_into().expect("8"));
            if q == 0 {
                continue;
            }
            let lblk = base.saturating_add((j as u64).saturating_mul(span));
            let keep = if level == 1 {
                self.data_ptr(w, q, lblk)
            } else {
                self.indirect(w, q, level - 1, lblk)?
            };
            if keep {
                live += 1;
            } else {
                blk[j * 8..j * 8 + 8].fill(0);
                dirty = true;
            }
        }
        if dirty && live == 0 {
            // Everything under it was dropped: free the index block too.
            self.used.set(p, false);
            w.count -= 1;
            return Ok(false);
        }
        if dirty {
            self.write_block(p, &blk)?;
        }
        Ok(true)
    }

    // ---------------------------------------------------------------------------------
    // Pass 2: directory blocks

    fn pass2(&mut self) -> Result<()> {
        let mut dblist = std::mem::take(&mut self.dblist);
        dblist.sort_unstable();
        let dirs: Vec<u64> = (0..self.g.total_inodes())
            .filter(|&i| self.kind(i) == K_DIR)
            .collect();
        let total = dirs.len() as u64;
        let mut cur = 0usize;
        for (n, &ino) in dirs.iter().enumerate() {
            if n % 256 == 0 {
                self.tick(Pass::Directories, n as u64, total);
            }
            let start = cur;
            while cur < dblist.len() && dblist[cur].0 < ino {
                cur += 1;
            }
            let from = cur.max(start);
            while cur < dblist.len() && dblist[cur].0 == ino {
                cur += 1;
            }
            let blocks: Vec<(u64, u64)> =
                dblist[from..cur].iter().map(|&(_, l, p)| (l, p)).collect();
            self.directory(ino, &blocks)?;
        }
        self.tick(Pass::Directories, total, total);
        Ok(())
    }

    fn directory(&mut self, ino: u64, blocks: &[(u64, u64)]) -> Result<()> {
        let bs = self.bs as u64;
        let nblocks = self.dsize.get(&ino).copied().unwrap_or(bs) / bs;
        let mut names: HashSet<Vec<u8>> = HashSet::new();
        let mut next = 0usize;
        // (count, first, all filled): one finding per directory, however many holes.
        let mut holes = (0u64, None::<u64>, true);
        for lblk in 0..nblocks {
            let pblk = if next < blocks.len() && blocks[next].0 == lblk {
                next += 1;
                blocks[next - 1].1
            } else {
                // A hole inside a directory: readers would find no valid records there.
                let fill = if self.repair {
                    self.fill_dir_hole(ino, lblk)?
                } else {
                    None
                };
                holes.0 += 1;
                holes.1.get_or_insert(lblk);
                holes.2 &= fill.is_some();
                match fill {
                    Some(p) => p,
                    None => continue,
                }
            };
            let mut buf = self.read_block(pblk)?;
            let mut dirty = false;
            for c in 0..self.bs / DIR_CHUNK {
                dirty |= self.fix_chunk(ino, lblk, &mut buf[c * DIR_CHUNK..(c + 1) * DIR_CHUNK], c);
            }
            if lblk == 0 {
                dirty |= self.dots(ino, pblk, &mut buf);
            }
            dirty |= self.entries(ino, lblk, pblk, &mut buf, &mut names);
            if dirty {
                self.write_block(pblk, &buf)?;
            }
        }
        if let (n, Some(first), filled) = holes {
            let what = if first == 0 {
                "has no first block".to_string()
            } else {
                format!("has {n} holes (first at block {first})")
            };
            self.note(
                Class::Corruption,
                Pass::Directories,
                filled,
                format!("directory {ino} {what}; filled with empty blocks"),
            );
        }
        Ok(())
    }

    /// Cuts a chunk at its first malformed record (the records before it are kept, the
    /// slack they leave is given to the last good one). Returns whether it changed.
    fn fix_chunk(&mut self, ino: u64, lblk: u64, chunk: &mut [u8], c: usize) -> bool {
        let mut last_good: Option<usize> = None;
        let mut err = None;
        for r in dir::records(chunk) {
            match r {
                Ok(e) => last_good = Some(e.off),
                Err(e) => {
                    err = Some(e.0);
                    break;
                }
            }
        }
        let Some(msg) = err else { return false };
        self.corrupt(
            Pass::Directories,
            format!("directory {ino} block {lblk} chunk {c}: {msg}; records from there to the end of the chunk dropped"),
        );
        match last_good {
            Some(off) => {
                chunk[off + 4..off + 6].copy_from_slice(&((DIR_CHUNK - off) as u16).to_le_bytes())
            }
            None => {
                chunk.fill(0);
                chunk[4..6].copy_from_slice(&(DIR_CHUNK as u16).to_le_bytes());
            }
        }
        true
    }

    /// Checks `.` and `..` at the start of a directory's first block (rebuilding the first
    /// chunk around them when they are missing or out of place).
    fn dots(&mut self, ino: u64, pblk: u64, buf: &mut [u8]) -> bool {
        let recs: Vec<(usize, u32, u8, Vec<u8>)> = dir::records(&buf[..DIR_CHUNK])
            .filter_map(|r| r.ok())
            .map(|e| (e.off, e.ino, e.dtype, e.name.to_vec()))
            .collect();
        let dt = K_DIR;
        let dot_ok = recs.first().is_some_and(|r| r.1 != 0 && r.3 == b".");
        let dd_ok = recs.get(1).is_some_and(|r| r.1 != 0 && r.3 == b"..");
        let mut dirty = false;
        if dot_ok && dd_ok {
            let (doff, dino, ddt, _) = recs[0].clone();
            if dino as u64 != ino || ddt != dt {
                self.corrupt(
                    Pass::Directories,
                    format!("directory {ino}: '.' names inode {dino}; set to {ino}"),
                );
                dir::set_ino(buf, doff, ino, dt);
                dirty = true;
            }
            let (off, target, tdt, _) = recs[1].clone();
            if tdt != dt {
                self.corrupt(
                    Pass::Directories,
                    format!("directory {ino}: '..' has file type {tdt}; set to directory"),
                );
                dir::set_ino(buf, off, target as u64, dt);
                dirty = true;
            }
            self.dotdot.insert(
                ino,
                DotDot {
                    target: target as u64,
                    at: Loc { pblk, off },
                },
            );
            return dirty;
        }
        self.corrupt(
            Pass::Directories,
            format!("directory {ino}: '.' or '..' missing or misplaced; first chunk rebuilt"),
        );
        let old_dd = recs
            .iter()
            .find(|r| r.1 != 0 && r.3 == b"..")
            .map(|r| r.1 as u64);
        let others: Vec<(u32, u8, Vec<u8>)> = recs
            .iter()
            .filter(|r| r.1 != 0 && r.3 != b"." && r.3 != b"..")
            .map(|r| (r.1, r.2, r.3.clone()))
            .collect();
        let mut first = vec![0u8; self.bs];
        dir::init_first(&mut first, ino, old_dd.unwrap_or(ROOT_INO));
        buf[..DIR_CHUNK].copy_from_slice(&first[..DIR_CHUNK]);
        for (eino, edt, name) in others {
            // Entries that no longer fit in the first chunk move to another chunk of the
            // block; failing that they are left out and pass 4 reconnects their inodes.
            for c in 0..self.bs / DIR_CHUNK {
                if matches!(dir::insert(buf, c, eino as u64, edt, &name), Ok(Some(_))) {
                    break;
                }
            }
        }
        // A `..` we had to invent is set to the real parent by pass 3 without a second report.
        self.dotdot.insert(
            ino,
            DotDot {
                target: old_dd.unwrap_or(0),
                at: Loc { pblk, off: 16 },
            },
        );
        true
    }

    /// Checks every entry of a directory block except `.` and `..` of the first block.
    fn entries(
        &mut self,
        ino: u64,
        lblk: u64,
        pblk: u64,
        buf: &mut [u8],
        names: &mut HashSet<Vec<u8>>,
    ) -> bool {
        struct E {
            off: usize,
            ino: u64,
            dtype: u8,
            name: Vec<u8>,
        }
        let mut list = Vec::new();
        for c in 0..self.bs / DIR_CHUNK {
            let s = c * DIR_CHUNK;
            for (i, r) in dir::records(&buf[s..s + DIR_CHUNK]).enumerate() {
                let Ok(e) = r else { break };
                if e.ino == 0 || (lblk == 0 && c == 0 && i < 2) {
                    continue;
                }
                list.push(E {
                    off: s + e.off,
                    ino: e.ino as u64,
                    dtype: e.dtype,
                    name: e.name.to_vec(),
                });
            }
        }
        let mut dirty = false;
        let mut remove = Vec::new();
        for e in list {
            let shown = String::from_utf8_lossy(&e.name).into_owned();
            let problem = if e.name == b"." || e.name == b".." {
                Some("a stray '.' or '..' entry".to_string())
            } else if e.name.iter().any(|&b| b == b'/' || b == 0) {
                Some("a name containing '/' or NUL".to_string())
            } else if !self.g.valid_ino(e.ino) {
                Some(format!("an invalid inode number {}", e.ino))
            } else if self.kind(e.ino) == 0 {
                Some(format!("free inode {}", e.ino))
            } else if names.contains(&e.name) {
                Some("a duplicate name".to_string())
            } else {
                None
            };
            if let Some(p) = problem {
                self.corrupt(
                    Pass::Directories,
                    format!("directory {ino}: entry '{shown}' has {p}; removed"),
                );
                remove.push(e.off);
                continue;
            }
            names.insert(e.name.clone());
            self.set_flag(ino, F_NONEMPTY, true);
            let k = self.kind(e.ino);
            if e.dtype != k {
                self.corrupt(
                    Pass::Directories,
                    format!("directory {ino}: entry '{shown}' has file type {} but inode {} has type {k}; fixed", e.dtype, e.ino),
                );
                dir::set_ino(buf, e.off, e.ino, k);
                dirty = true;
            }
            if k == K_DIR {
                self.links.push(DirLink {
                    child: e.ino,
                    parent: ino,
                    at: Loc { pblk, off: e.off },
                });
            } else {
                self.refs[e.ino as usize] = self.refs[e.ino as usize].saturating_add(1);
            }
            if ino == ROOT_INO && e.name == b"lost+found" {
                self.lf_entry = Some(e.ino);
            }
        }
        for off in remove {
            // Removing merges the record into its predecessor; offsets of the others hold.
            let _ = dir::remove(buf, off);
            dirty = true;
        }
        dirty
    }

    /// Gives a directory an empty block at `lblk` (the first block gets `.` and `..`).
    fn fill_dir_hole(&mut self, ino: u64, lblk: u64) -> Result<Option<u64>> {
        let Some(mut d) = self.get_inode(ino)? else {
            return Ok(None);
        };
        let Some(p) = self.alloc_block(self.g.first_data(self.g.group_of_ino(ino))) else {
            return Ok(None);
        };
        let mut b = vec![0u8; self.bs];
        if lblk == 0 {
            dir::init_first(&mut b, ino, ROOT_INO);
            self.dotdot.insert(
                ino,
                DotDot {
                    target: 0,
                    at: Loc { pblk: p, off: 16 },
                },
            );
        } else {
            dir::init_empty(&mut b);
        }
        self.write_block(p, &b)?;
        match self.bmap_set(ino, &mut d, lblk, p)? {
            Some(extra) => {
                d.blocks += 1 + extra;
                d.size = d.size.max((lblk + 1) * self.bs as u64);
                self.put_inode(ino, &d)?;
                Ok(Some(p))
            }
            None => {
                self.used.set(p, false);
                Ok(None)
            }
        }
    }

    // ---------------------------------------------------------------------------------
    // Block-map edits (repair only)

    /// The physical block of logical block `lblk` (0 for a hole).
    fn bmap_get(&self, d: &DiskInode, lblk: u64) -> Result<u64> {
        let Some((root, path)) = self.bmap_path(lblk) else {
            return Ok(0);
        };
        let mut p = if root < NDIRECT {
            d.direct[root]
        } else {
            d.indirect[root - NDIRECT]
        };
        for idx in path {
            if p == 0 || !self.g.is_data_block(p) {
                return Ok(0);
            }
            let b = self.read_block(p)?;
            p = u64::from_le_bytes(b[idx * 8..idx * 8 + 8].try_into().expect("8"));
        }
        Ok(if self.g.is_data_block(p) { p } else { 0 })
    }

    /// Which root pointer (0..12 direct, 12..15 indirect) and which indexes lead to `lblk`.
    fn bmap_path(&self, lblk: u64) -> Option<(usize, Vec<usize>)> {
        if lblk < NDIRECT as u64 {
            return Some((lblk as usize, vec![]));
        }
        let ppb = self.g.ptrs_per_block();
        let mut rel = lblk - NDIRECT as u64;
        let mut span = 1u64;
        for level in 1..=3usize {
            span = span.checked_mul(ppb)?;
            if rel < span {
                let mut idx = Vec::with_capacity(level);
                let mut s = span;
                for _ in 0..level {
                    s /= ppb;
                    idx.push((rel / s) as usize);
                    rel %= s;
                }
                return Some((NDIRECT + level - 1, idx));
            }
            rel -= span;
        }
        None
    }

    /// Maps `lblk` to `p`, allocating index blocks on the way. Returns how many index
    /// blocks were allocated, or `None` if space ran out. Writes only when repairing.
    fn bmap_set(&mut self, ino: u64, d: &mut DiskInode, lblk: u64, p: u64) -> Result<Option<u64>> {
        let Some((root, path)) = self.bmap_path(lblk) else {
            return Ok(None);
        };
        let near = self.g.first_data(self.g.group_of_ino(ino));
        let mut extra = 0;
        if path.is_empty() {
            d.direct[root] = p;
            return Ok(Some(0));
        }
        let slot = &mut d.indirect[root - NDIRECT];
        if *slot == 0 {
            let Some(n) = self.alloc_block(near) else {
                return Ok(None);
            };
            self.write_block(n, &vec![0u8; self.bs])?;
            *slot = n;
            extra += 1;
        }
        let mut cur = d.indirect[root - NDIRECT];
        for (depth, &idx) in path.iter().enumerate() {
            let mut b = self.read_block(cur)?;
            if depth + 1 == path.len() {
                b[idx * 8..idx * 8 + 8].copy_from_slice(&p.to_le_bytes());
                self.write_block(cur, &b)?;
                break;
            }
            let mut nxt = u64::from_le_bytes(b[idx * 8..idx * 8 + 8].try_into().expect("8"));
            if nxt == 0 {
                let Some(n) = self.alloc_block(near) else {
                    return Ok(None);
                };
                self.write_block(n, &vec![0u8; self.bs])?;
                b[idx * 8..idx * 8 + 8].copy_from_slice(&n.to_le_bytes());
                self.write_block(cur, &b)?;
                nxt = n;
                extra += 1;
            }
            cur = nxt;
        }
        Ok(Some(extra))
    }

    /// Adds an entry to directory `dirino`, growing it by a block when it is full.
    fn add_entry(&mut self, dirino: u64, name: &[u8], ino: u64, dtype: u8) -> Result<bool> {
        let Some(mut d) = self.get_inode(dirino)? else {
            return Ok(false);
        };
        if !d.is_dir() {
            return Ok(false);
        }
        let bs = self.bs as u64;
        let nblocks = d.size / bs;
        for lblk in 0..nblocks {
            let p = self.bmap_get(&d, lblk)?;
            if p == 0 {
                continue;
            }
            let mut b = self.read_block(p)?;
            if dir::validate(&b).is_err() {
                continue;
            }
            for c in 0..self.bs / DIR_CHUNK {
                if let Ok(Some(_)) = dir::insert(&mut b, c, ino, dtype, name) {
                    self.write_block(p, &b)?;
                    return Ok(true);
                }
            }
        }
        let Some(p) = self.alloc_block(self.g.first_data(self.g.group_of_ino(dirino))) else {
            return Ok(false);
        };
        let mut b = vec![0u8; self.bs];
        dir::init_empty(&mut b);
        let _ = dir::insert(&mut b, 0, ino, dtype, name);
        self.write_block(p, &b)?;
        match self.bmap_set(dirino, &mut d, nblocks, p)? {
            Some(extra) => {
                d.blocks += 1 + extra;
                d.size = (nblocks + 1) * bs;
                self.put_inode(dirino, &d)?;
                Ok(true)
            }
            None => {
                self.used.set(p, false);
                Ok(false)
            }
        }
    }

    /// Releases every block of an inode (re-reading its block map as repaired).
    fn release_blocks(&mut self, ino: u64, d: &DiskInode) -> Result<()> {
        if d.xattr != 0 && self.g.is_data_block(d.xattr) {
            // The list's blocks as pass 1 claimed them (only a list that read whole was
            // kept; of anything else, the head).
            let blocks = xattr::read_chain(ino, d.xattr, |b| {
                if !self.g.is_data_block(b) {
                    return Err(cairn_ffs::format::FormatError(String::new()));
                }
                self.read_block(b)
                    .map_err(|e| cairn_ffs::format::FormatError(e.to_string()))
            })
            .map_or_else(|_| vec![d.xattr], |c| c.blocks);
            for b in blocks {
                self.used.set(b, false);
            }
        }
        if d.fast_link.is_some() {
            return Ok(());
        }
        for &p in &d.direct {
            if self.g.is_data_block(p) {
                self.used.set(p, false);
            }
        }
        for (i, &p) in d.indirect.iter().enumerate() {
            self.release_tree(p, i as u32 + 1)?;
        }
        Ok(())
    }
    fn release_tree(&mut self, p: u64, level: u32) -> Result<()> {
        if !self.g.is_data_block(p) || !self.used.get(p) {
            return Ok(());
        }
        let b = self.read_block(p)?;
        self.used.set(p, false);
        for j in 0..self.g.ptrs_per_block() as usize {
            let q = u64::from_le_bytes(b[j * 8..j * 8 + 8].try_into().expect("8"));
            if level == 1 {
                if self.g.is_data_block(q) {
                    self.used.set(q, false);
                }
            } else {
                self.release_tree(q, level - 1)?;
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------
    // Pass 3: connectivity

    fn pass3(&mut self) -> Result<()> {
        if self.kind(ROOT_INO) != K_DIR {
            let ok = self.repair && self.make_root()?;
            self.note(
                Class::Corruption,
                Pass::Connectivity,
                ok,
                "root directory missing; a new empty root was created".into(),
            );
            if !ok {
                return Ok(());
            }
        }
        self.choose_parents()?;
        if let Some(lf) = self.lf_entry
            && self.kind(lf) == K_DIR
            && self.parent.get(&lf).is_some_and(|l| l.parent == ROOT_INO)
        {
            self.lf = Some(lf);
        }
        let dirs: Vec<u64> = (0..self.g.total_inodes())
            .filter(|&i| self.kind(i) == K_DIR)
            .collect();
        self.set_flag(ROOT_INO, F_REACH, true);
        let total = dirs.len() as u64;
        for (n, &d) in dirs.iter().enumerate() {
            if n % 256 == 0 {
                self.tick(Pass::Connectivity, n as u64, total);
            }
            self.connect(d)?;
        }
        // `..` of every directory names its parent.
        for &d in &dirs {
            if self.kind(d) != K_DIR {
                continue;
            }
            let want = if d == ROOT_INO {
                ROOT_INO
            } else {
                match self.parent.get(&d) {
                    Some(l) => l.parent,
                    None => continue,
                }
            };
            let Some(dd) = self.dotdot.get(&d).copied() else {
                continue;
            };
            if dd.target != want {
                if dd.target != 0 {
                    self.note_kind(
                        Class::Corruption,
                        Pass::Connectivity,
                        Kind::StaleDotDot,
                        true,
                        format!(
                            "directory {d}: '..' names {} but its parent is {want}; fixed",
                            dd.target
                        ),
                    );
                }
                self.set_entry(dd.at, want, K_DIR)?;
                self.dotdot.insert(
                    d,
                    DotDot {
                        target: want,
                        at: dd.at,
                    },
                );
            }
        }
        self.tick(Pass::Connectivity, total, total);
        Ok(())
    }

    /// Picks each directory's one name: the entry in the directory its `..` names if there
    /// is one, else the first found. Other names are removed.
    fn choose_parents(&mut self) -> Result<()> {
        let links = std::mem::take(&mut self.links);
        for l in &links {
            if l.child == ROOT_INO {
                self.corrupt(
                    Pass::Connectivity,
                    format!(
                        "directory {}: entry naming the root directory; removed",
                        l.parent
                    ),
                );
                self.remove_entry(l.at)?;
                continue;
            }
            let dd = self.dotdot.get(&l.child).map_or(0, |d| d.target);
            match self.parent.get(&l.child).copied() {
                None => {
                    self.parent.insert(l.child, *l);
                }
                Some(prev) => {
                    // A rename interrupted between adding the new name and removing the old
                    // leaves two names, one agreeing with `..`: that is a leak, not damage.
                    let (keep, drop) = if l.parent == dd && prev.parent != dd {
                        (*l, prev)
                    } else {
                        (prev, *l)
                    };
                    let class = if keep.parent == dd {
                        Class::Leak
                    } else {
                        Class::Corruption
                    };
                    self.note_kind(
                        class,
                        Pass::Connectivity,
                        Kind::SecondDirectoryName,
                        true,
                        format!(
                            "directory {} has a second name in directory {}; removed",
                            l.child, drop.parent
                        ),
                    );
                    self.remove_entry(drop.at)?;
                    self.parent.insert(l.child, keep);
                }
            }
        }
        Ok(())
    }

    /// Follows `d`'s parent chain to the root; a chain that ends nowhere or loops is
    /// reconnected to lost+found at its top.
    fn connect(&mut self, d: u64) -> Result<()> {
        let mut path = Vec::new();
        let mut cur = d;
        let mut steps = 0u64;
        loop {
            steps += 1;
            if self.flag(cur, F_REACH)
                || self.kind(cur) != K_DIR
                || steps > self.g.total_inodes() + 1
            {
                break;
            }
            if self.flag(cur, F_INPROG) {
                let ok = self.repair && self.can_reconnect()?;
                self.note(
                    Class::Corruption,
                    Pass::Connectivity,
                    ok,
                    format!(
                        "directory {cur} is part of a directory cycle; reconnected to lost+found"
                    ),
                );
                if ok {
                    if let Some(l) = self.parent.remove(&cur) {
                        self.remove_entry(l.at)?;
                    }
                    if !self.reconnect_dir(cur)? {
                        self.unfix_last();
                    }
                }
                break;
            }
            self.set_flag(cur, F_INPROG, true);
            path.push(cur);
            match self.parent.get(&cur) {
                Some(l) => cur = l.parent,
                None => {
                    self.orphan_dir(cur)?;
                    break;
                }
            }
        }
        for p in path {
            self.set_flag(p, F_INPROG, false);
            self.set_flag(p, F_REACH, true);
        }
        Ok(())
    }

    /// A directory no entry names.
    fn orphan_dir(&mut self, d: u64) -> Result<()> {
        let empty = !self.flag(d, F_NONEMPTY);
        if empty {
            self.unreferenced_inodes.insert(d);
        }
        if empty && self.nlink[d as usize] == 0 {
            // An rmdir interrupted after the name went: finish it.
            self.leak(
                Pass::Connectivity,
                format!("unreferenced empty directory {d} with link count 0; freed"),
            );
            if self.repair
                && let Some(di) = self.get_inode(d)?
            {
                self.release_blocks(d, &di)?;
                self.clear_inode(d, di.generation)?;
            }
            return Ok(());
        }
        let class = if empty {
            Class::Leak
        } else {
            Class::Corruption
        };
        let msg = if empty {
            format!("unreferenced empty directory {d}; reconnected to lost+found")
        } else {
            format!("unreachable directory {d}; reconnected to lost+found")
        };
        let ok = self.repair && self.can_reconnect()?;
        self.note(class, Pass::Connectivity, ok, msg);
        if ok && !self.reconnect_dir(d)? {
            self.unfix_last();
        }
        Ok(())
    }

    fn can_reconnect(&mut self) -> Result<bool> {
        Ok(self.lost_found()?.is_some())
    }

    fn reconnect_dir(&mut self, d: u64) -> Result<bool> {
        let Some(lf) = self.lost_found()? else {
            return Ok(false);
        };
        let name = format!("#{d}");
        if self.add_entry(lf, name.as_bytes(), d, K_DIR)? {
            // The entry's location is only needed to remove it again, which cannot happen now.
            self.parent.insert(
                d,
                DirLink {
                    child: d,
                    parent: lf,
                    at: Loc { pblk: 0, off: 0 },
                },
            );
            // Moving the directory is the repair: its `..` and lost+found's link count follow
            // silently, so pass 3 and 4 do not report our own change as new damage.
            if let Some(dd) = self.dotdot.get(&d).copied() {
                self.set_entry(dd.at, lf, K_DIR)?;
                self.dotdot.insert(
                    d,
                    DotDot {
                        target: lf,
                        at: dd.at,
                    },
                );
            }
            let n = self.nlink[lf as usize].saturating_add(1);
            self.set_nlink(lf, n)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// lost+found, created under the root if missing (FFS fsck creates it only when it is
    /// needed, so a file system without one is not an error).
    fn lost_found(&mut self) -> Result<Option<u64>> {
        if let Some(lf) = self.lf {
            return Ok(Some(lf));
        }
        if !self.repair || self.lf_failed {
            return Ok(None);
        }
        if self.lf_entry.is_some() {
            // The name is taken by something that is not a usable directory.
            self.lf_failed = true;
            self.note(
                Class::Corruption,
                Pass::Connectivity,
                false,
                "root entry 'lost+found' is not a directory; cannot reconnect".into(),
            );
            return Ok(None);
        }
        let made = self.make_lost_found()?;
        if made.is_none() {
            self.lf_failed = true;
            self.note(
                Class::Corruption,
                Pass::Connectivity,
                false,
                "cannot create lost+found (no space)".into(),
            );
        }
        self.lf = made;
        Ok(made)
    }

    fn make_lost_found(&mut self) -> Result<Option<u64>> {
        let Some(ino) = self.alloc_inode() else {
            return Ok(None);
        };
        let Some(p) = self.alloc_block(self.g.first_data(self.g.group_of_ino(ino))) else {
            return Ok(None);
        };
        let mut b = vec![0u8; self.bs];
        dir::init_first(&mut b, ino, ROOT_INO);
        self.write_block(p, &b)?;
        let old_gen = self.get_inode(ino)?.map_or(0, |d| d.generation);
        let mut d = new_dir(0o700, self.bs as u64, p);
        d.generation = old_gen.wrapping_add(1);
        self.put_inode(ino, &d)?;
        self.istate[ino as usize] = K_DIR | F_REACH;
        self.nlink[ino as usize] = 2;
        if !self.add_entry(ROOT_INO, b"lost+found", ino, K_DIR)? {
            self.used.set(p, false);
            self.clear_inode(ino, d.generation)?;
            return Ok(None);
        }
        self.parent.insert(
            ino,
            DirLink {
                child: ino,
                parent: ROOT_INO,
                at: Loc { pblk: 0, off: 0 },
            },
        );
        self.dotdot.insert(
            ino,
            DotDot {
                target: ROOT_INO,
                at: Loc { pblk: p, off: 16 },
            },
        );
        let n = self.nlink[ROOT_INO as usize].saturating_add(1);
        self.set_nlink(ROOT_INO, n)?;
        self.note(
            Class::Corruption,
            Pass::Connectivity,
            true,
            format!("lost+found missing; created as inode {ino}"),
        );
        Ok(Some(ino))
    }

    fn make_root(&mut self) -> Result<bool> {
        let Some(p) = self.alloc_block(self.g.first_data(0)) else {
            return Ok(false);
        };
        let mut b = vec![0u8; self.bs];
        dir::init_first(&mut b, ROOT_INO, ROOT_INO);
        self.write_block(p, &b)?;
        let old_gen = self.get_inode(ROOT_INO)?.map_or(0, |d| d.generation);
        let mut d = new_dir(0o755, self.bs as u64, p);
        d.generation = old_gen.wrapping_add(1);
        self.put_inode(ROOT_INO, &d)?;
        self.istate[ROOT_INO as usize] = K_DIR;
        self.nlink[ROOT_INO as usize] = 2;
        self.dotdot.insert(
            ROOT_INO,
            DotDot {
                target: ROOT_INO,
                at: Loc { pblk: p, off: 16 },
            },
        );
        Ok(true)
    }

    fn remove_entry(&mut self, at: Loc) -> Result<()> {
        if !self.repair || at.pblk == 0 {
            return Ok(());
        }
        let mut b = self.read_block(at.pblk)?;
        if dir::remove(&mut b, at.off).is_ok() {
            self.write_block(at.pblk, &b)?;
        }
        Ok(())
    }

    fn set_entry(&mut self, at: Loc, ino: u64, dtype: u8) -> Result<()> {
        if !self.repair || at.pblk == 0 {
            return Ok(());
        }
        let mut b = self.read_block(at.pblk)?;
        if at.off + 8 <= b.len() {
            dir::set_ino(&mut b, at.off, ino, dtype);
            self.write_block(at.pblk, &b)?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------
    // Pass 4: link counts

    fn pass4(&mut self) -> Result<()> {
        for l in self.parent.values() {
            let p = l.parent as usize;
            self.refs[p] = self.refs[p].saturating_add(1);
        }
        let total = self.g.total_inodes();
        for ino in ROOT_INO..total {
            if ino % 4096 == 0 {
                self.tick(Pass::LinkCounts, ino, total);
            }
            let k = self.kind(ino);
            if k == 0 {
                continue;
            }
            let have = self.nlink[ino as usize];
            let want = if k == K_DIR {
                if ino != ROOT_INO && !self.parent.contains_key(&ino) {
                    continue; // left unreachable (check only): reported by pass 3
                }
                2u32.saturating_add(self.refs[ino as usize])
            } else {
                let r = self.refs[ino as usize];
                if r == 0 {
                    self.unreferenced(ino, have)?;
                    continue;
                }
                r
            };
            if have != want {
                let class = if have > want {
                    Class::Leak
                } else {
                    Class::Corruption
                };
                self.note(
                    class,
                    Pass::LinkCounts,
                    true,
                    format!("inode {ino}: link count {have} should be {want}"),
                );
                self.set_nlink(ino, want)?;
            }
        }
        self.tick(Pass::LinkCounts, total, total);
        Ok(())
    }

    fn set_nlink(&mut self, ino: u64, n: u32) -> Result<()> {
        self.nlink[ino as usize] = n;
        if self.repair
            && let Some(mut d) = self.get_inode(ino)?
        {
            d.nlink = n;
            self.put_inode(ino, &d)?;
        }
        Ok(())
    }

    /// An in-use inode that no directory names: an unlinked-but-open file at the crash
    /// (link count 0) is freed; anything else goes to lost+found.
    fn unreferenced(&mut self, ino: u64, nlink: u32) -> Result<()> {
        self.unreferenced_inodes.insert(ino);
        if nlink == 0 {
            self.leak(
                Pass::LinkCounts,
                format!("unreferenced inode {ino} with link count 0; freed"),
            );
            if self.repair
                && let Some(d) = self.get_inode(ino)?
            {
                self.release_blocks(ino, &d)?;
                self.clear_inode(ino, d.generation)?;
            }
            return Ok(());
        }
        let ok = self.repair && self.can_reconnect()?;
        self.note(
            Class::Leak,
            Pass::LinkCounts,
            ok,
            format!(
                "unreferenced inode {ino} (link count {nlink}); reconnected to lost+found as #{ino}"
            ),
        );
        if ok {
            let lf = self.lf.unwrap_or(LOST_FOUND_INO);
            let name = format!("#{ino}");
            let k = self.kind(ino);
            if self.add_entry(lf, name.as_bytes(), ino, k)? {
                self.refs[ino as usize] = 1;
                if nlink != 1 {
                    self.set_nlink(ino, 1)?;
                }
            } else {
                self.unfix_last();
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------
    // Pass 5: bitmaps and summaries

    fn pass5(&mut self, primary_bad: bool) -> Result<()> {
        let g = self.g;
        let (mut free_b, mut free_i, mut dirs) = (0u64, 0u64, 0u64);
        let mut buf = vec![0u8; self.bs];
        for grp in 0..g.group_count {
            self.tick(Pass::Bitmaps, grp, g.group_count);
            let start = g.group_start(grp);
            let len = g.group_len(grp);
            // Blocks.
            self.read_into(g.block_bitmap(grp), &mut buf)?;
            let (mut leaked, mut lost, mut first) = (0u64, 0u64, None);
            let mut used_here = 0u64;
            for i in 0..len {
                let real = self.used.get(start + i);
                let disk = bitmap::get(&buf, i as usize);
                used_here += real as u64;
                if real != disk {
                    first.get_or_insert(start + i);
                    if disk {
                        leaked += 1
                    } else {
                        lost += 1
                    }
                    bitmap::set(&mut buf, i as usize, real);
                }
            }
            if lost > 0 {
                self.corrupt(
                    Pass::Bitmaps,
                    format!(
                        "group {grp}: {lost} blocks in use but marked free (first {})",
                        first.unwrap_or(0)
                    ),
                );
            }
            if leaked > 0 {
                self.leak(
                    Pass::Bitmaps,
                    format!("group {grp}: {leaked} blocks marked in use but unused; freed"),
                );
            }
            if lost + leaked > 0 {
                self.write_block(g.block_bitmap(grp), &buf)?;
            }
            // Inodes.
            self.read_into(g.inode_bitmap(grp), &mut buf)?;
            let (mut leaked, mut lost, mut first) = (0u64, 0u64, None);
            let (mut lost_unref, mut first_unref) = (0u64, None);
            let (mut iused, mut gdirs) = (0u64, 0u64);
            for i in 0..g.inodes_per_group {
                let ino = grp * g.inodes_per_group + i;
                let k = self.kind(ino);
                let real = ino < ROOT_INO || k != 0;
                let disk = bitmap::get(&buf, i as usize);
                iused += real as u64;
                gdirs += (k == K_DIR) as u64;
                if real != disk {
                    if disk {
                        first.get_or_insert(ino);
                        leaked += 1
                    } else if self.unreferenced_inodes.contains(&ino) {
                        first_unref.get_or_insert(ino);
                        lost_unref += 1
                    } else {
                        first.get_or_insert(ino);
                        lost += 1
                    }
                    bitmap::set(&mut buf, i as usize, real);
                }
            }
            if lost > 0 {
                self.corrupt(
                    Pass::Bitmaps,
                    format!(
                        "group {grp}: {lost} inodes in use but marked free (first {})",
                        first.unwrap_or(0)
                    ),
                );
            }
            if lost_unref > 0 {
                self.leak(
                    Pass::Bitmaps,
                    format!(
                        "group {grp}: {lost_unref} unreferenced inodes in use but marked free (first {})",
                        first_unref.unwrap_or(0)
                    ),
                );
            }
            if leaked > 0 {
                self.leak(
                    Pass::Bitmaps,
                    format!("group {grp}: {leaked} inodes marked in use but free; freed"),
                );
            }
            if lost + lost_unref + leaked > 0 {
                self.write_block(g.inode_bitmap(grp), &buf)?;
            }
            let want = GroupDesc {
                group: grp as u32,
                free_blocks: (len - used_here) as u32,
                free_inodes: (g.inodes_per_group - iused) as u32,
                dirs: gdirs as u32,
            };
            let bad = self.bad_desc[grp as usize];
            let have = &self.descs[grp as usize];
            if !bad && *have != want {
                let msg = format!(
                    "group {grp}: summary (free blocks {}, free inodes {}, dirs {}) should be ({}, {}, {})",
                    have.free_blocks,
                    have.free_inodes,
                    have.dirs,
                    want.free_blocks,
                    want.free_inodes,
                    want.dirs
                );
                self.leak(Pass::Bitmaps, msg);
            }
            if bad || self.descs[grp as usize] != want {
                buf.fill(0);
                want.encode(&mut buf);
                self.write_block(g.desc_block(grp), &buf)?;
            }
            free_b += want.free_blocks as u64;
            free_i += want.free_inodes as u64;
            dirs += gdirs;
        }
        let sb = &self.sb;
        // While mounted the engine keeps the summary in the group descriptors and writes the
        // superblock's copy only at unmount (FORMAT.md): a stale summary in a superblock
        // marked "mounted" is the normal state of a crashed file system, not a finding.
        let stale_by_design = sb.state == cairn_ffs::format::superblock::STATE_MOUNTED;
        if !stale_by_design
            && (sb.free_blocks != free_b || sb.free_inodes != free_i || sb.dirs != dirs)
        {
            let msg = format!(
                "superblock summary (free blocks {}, free inodes {}, dirs {}) should be ({free_b}, {free_i}, {dirs})",
                sb.free_blocks, sb.free_inodes, sb.dirs
            );
            self.leak(Pass::Bitmaps, msg);
        }
        let all_fixed = self.findings.iter().all(|f| f.fixed);
        let mut sb = self.sb.clone();
        sb.free_blocks = free_b;
        sb.free_inodes = free_i;
        sb.dirs = dirs;
        if all_fixed {
            sb.state = STATE_CLEAN;
        }
        if self.repair && (sb != self.sb || primary_bad) {
            buf.fill(0);
            sb.encode(&mut buf);
            self.write_block(0, &buf)?;
            self.sb = sb;
        }
        self.tick(Pass::Bitmaps, g.group_count, g.group_count);
        Ok(())
    }

    fn stats(&self) -> Stats {
        let mut s = Stats {
            block_size: self.g.block_size,
            groups: self.g.group_count,
            blocks_total: self.g.total_blocks,
            blocks_used: self.used.0.iter().map(|w| w.count_ones() as u64).sum(),
            inodes_total: self.g.total_inodes(),
            ..Default::default()
        };
        for &st in &self.istate {
            match st & KIND_MASK {
                0 => continue,
                K_DIR => s.dirs += 1,
                K_REG => s.files += 1,
                K_LNK => s.symlinks += 1,
                _ => s.specials += 1,
            }
            s.inodes_used += 1;
        }
        s
    }
}

/// Per-inode tallies of the block-map walk.
struct Walk {
    ino: u64,
    kind: u8,
    /// Blocks kept (data and index).
    count: u64,
    /// Highest logical data block kept.
    last: Option<u64>,
    bad: u64,
    beyond: u64,
    dups: u64,
    /// A regular file's first logical block past its size (`u64::MAX` otherwise).
    eof: u64,
    /// Blocks kept that lie wholly past that end (data blocks, and index blocks whose whole
    /// range does).
    past_eof: u64,
    /// Blocks kept that the inode's index blocks point to (below its own pointers).
    under_index: u64,
}

/// Why a block pointer cannot be claimed for the inode being walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unclaimable {
    OutOfRange,
    GroupMetadata,
    /// Claimed already, by another inode or another pointer (a duplicate).
    Claimed,
}

impl std::fmt::Display for Unclaimable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unclaimable::OutOfRange => "out of range",
            Unclaimable::GroupMetadata => "inside group metadata",
            Unclaimable::Claimed => "already claimed by another inode or another pointer",
        })
    }
}

fn new_dir(perm: u32, size: u64, block: u64) -> DiskInode {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let mut d = DiskInode {
        mode: libc::S_IFDIR | perm,
        nlink: 2,
        size,
        blocks: 1,
        atime: now,
        mtime: now,
        ctime: now,
        btime: now,
        ..Default::default()
    };
    d.direct[0] = block;
    d
}

fn same_geometry(a: &Superblock, b: &Superblock) -> bool {
    a.version == b.version
        && a.block_size == b.block_size
        && a.total_blocks == b.total_blocks
        && a.blocks_per_group == b.blocks_per_group
        && a.inodes_per_group == b.inodes_per_group
        && a.group_count == b.group_count
        && a.uuid == b.uuid
}

pub(crate) fn inode_crc(ino: u64, raw: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&ino.to_le_bytes()), &raw[..252])
}

/// The codec prefixes its messages with "inode N: "; we add our own.
fn strip_ino(msg: &str) -> &str {
    match msg.split_once(": ") {
        Some((head, rest)) if head.starts_with("inode ") => rest,
        _ => msg,
    }
}
