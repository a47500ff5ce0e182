//! `cairn inspect`: the format, shown structure by structure with field names and byte
//! offsets (the same tables as docs/FORMAT.md), read straight from the device.
//!
//! Every view tolerates damage: a structure that fails to decode is shown raw with the
//! codec's message, so the tool is as useful on a broken image as on a good one.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_ffs::format::superblock::{GroupDesc, SB_BYTES};
use cairn_ffs::format::{
    DIR_CHUNK, DiskInode, Geometry, INODE_SIZE, NDIRECT, ROOT_INO, Superblock, bitmap, dir, xattr,
};

use crate::FsckError;
use crate::disk::{Disk, locate};

/// Why a view could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Open(#[from] FsckError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    NotFound(String),
}

impl From<std::io::Error> for InspectError {
    fn from(e: std::io::Error) -> Self {
        InspectError::Open(FsckError::Io(e))
    }
}

type Result<T> = std::result::Result<T, InspectError>;

/// An opened image.
pub struct Inspector {
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    g: Geometry,
    backup: Option<(u64, String)>,
    /// Set when the image is mounted read-write: what is shown may be changing under us.
    pub live: Option<String>,
}

/// What `cairn inspect IMAGE [WHAT...]` accepts.
pub const USAGE: &str = "superblock | group N | inode N | dir PATH | block N";

impl Inspector {
    /// Opens an image or device read-only. Inspecting never writes, so an image a
    /// read-write mount holds is still shown, with [`Inspector::live`] saying so.
    pub fn open(path: &Path) -> Result<Inspector> {
        match crate::open(path, true, cairn_blockdev::Lock::Shared) {
            Ok(dev) => Inspector::from_device(dev),
            Err(FsckError::Busy(msg)) => {
                let mut i =
                    Inspector::from_device(crate::open(path, true, cairn_blockdev::Lock::None)?)?;
                i.live = Some(format!("{msg}; what is shown may be stale"));
                Ok(i)
            }
            Err(e) => Err(e.into()),
        }
    }

    pub fn from_device(dev: Arc<dyn BlockDevice>) -> Result<Inspector> {
        let loc = locate(&Disk::new(&*dev))?;
        Ok(Inspector {
            dev,
            sb: loc.sb,
            g: loc.geo,
            backup: loc.backup,
            live: None,
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.g
    }

    /// Runs the view named by `args` (empty = the superblock).
    pub fn run(&self, args: &[String]) -> Result<String> {
        let num = |what: &str| -> Result<u64> {
            let s = args
                .get(1)
                .ok_or_else(|| InspectError::Usage(format!("'{what}' needs a number")))?;
            s.parse()
                .map_err(|_| InspectError::Usage(format!("'{s}' is not a number")))
        };
        match args.first().map(String::as_str) {
            None | Some("superblock") | Some("sb") => Ok(self.superblock()),
            Some("group") => self.group(num("group")?),
            Some("inode") => self.inode(num("inode")?),
            Some("block") => self.block(num("block")?),
            Some("dir") => self.dir(args.get(1).map_or("/", String::as_str)),
            Some(other) => Err(InspectError::Usage(format!(
                "unknown view '{other}' (known: {USAGE})"
            ))),
        }
    }

    fn read_block(&self, b: u64) -> Result<Vec<u8>> {
        if b >= self.g.total_blocks {
            return Err(InspectError::NotFound(format!(
                "block {b} is beyond the file system ({} blocks)",
                self.g.total_blocks
            )));
        }
        let mut buf = vec![0u8; self.g.bs()];
        Disk::new(&*self.dev).read(b * self.g.block_size as u64, &mut buf)?;
        Ok(buf)
    }

    // ---------------------------------------------------------------------------------

    /// The superblock with every field at its offset, and the geometry derived from it.
    pub fn superblock(&self) -> String {
        let sb = &self.sb;
        let g = &self.g;
        let mut o = String::new();
        match &self.backup {
            None => {
                let _ = writeln!(
                    o,
                    "superblock (primary, block 0; a copy starts every group)"
                );
            }
            Some((grp, why)) => {
                let _ = writeln!(
                    o,
                    "superblock: PRIMARY UNUSABLE ({why}); showing the copy in group {grp}"
                );
            }
        }
        let raw = self
            .read_block(g.sb_block(self.backup.as_ref().map_or(0, |b| b.0)))
            .unwrap_or_default();
        let crc_stored = raw
            .get(508..512)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or_default()));
        let state = match sb.state {
            0 => "clean",
            1 => "mounted (not cleanly unmounted)",
            2 => "errors",
            _ => "unknown",
        };
        let rows: Vec<(usize, usize, &str, String)> = vec![
            (0, 8, "magic", "\"CAIRNFFS\"".into()),
            (8, 4, "version", sb.version.to_string()),
            (12, 4, "block_size", sb.block_size.to_string()),
            (16, 8, "total_blocks", sb.total_blocks.to_string()),
            (24, 4, "blocks_per_group", sb.blocks_per_group.to_string()),
            (28, 4, "inodes_per_group", sb.inodes_per_group.to_string()),
            (32, 4, "group_count", sb.group_count.to_string()),
            (36, 4, "inode_size", sb.inode_size.to_string()),
            (40, 8, "free_blocks", sb.free_blocks.to_string()),
            (48, 8, "free_inodes", sb.free_inodes.to_string()),
            (56, 8, "root_ino", sb.root_ino.to_string()),
            (64, 8, "created_ns", time(sb.created_ns)),
            (72, 8, "mounted_ns", time(sb.mounted_ns)),
            (80, 8, "written_ns", time(sb.written_ns)),
            (88, 4, "state", format!("{} ({state})", sb.state)),
            (92, 4, "mount_count", sb.mount_count.to_string()),
            (96, 16, "uuid", hex(&sb.uuid)),
            (112, 64, "label", format!("{:?}", sb.label)),
            (176, 16, "last_mode", format!("{:?}", sb.last_mode)),
            (
                192,
                4,
                "feature_compat",
                format!("{:#x}", sb.feature_compat),
            ),
            (
                196,
                4,
                "feature_incompat",
                format!("{:#x}", sb.feature_incompat),
            ),
            (
                200,
                4,
                "feature_ro_compat",
                format!("{:#x}", sb.feature_ro_compat),
            ),
            (208, 8, "dirs", sb.dirs.to_string()),
            (508, 4, "crc32c(0..508)", format!("{crc_stored:#010x} (ok)")),
        ];
        table(&mut o, &rows);
        let _ = writeln!(o, "\ngeometry (derived)");
        let _ = writeln!(o, "  groups                 {}", g.group_count);
        let _ = writeln!(
            o,
            "  blocks per group       {} (last group: {})",
            g.blocks_per_group,
            g.group_len(g.group_count - 1)
        );
        let _ = writeln!(
            o,
            "  inodes per group       {} ({} per block)",
            g.inodes_per_group,
            g.inodes_per_block()
        );
        let _ = writeln!(
            o,
            "  inode table blocks     {} per group",
            g.inode_table_blocks
        );
        let _ = writeln!(
            o,
            "  metadata blocks        {} per group (sb copy, descriptor, 2 bitmaps, inode table)",
            g.meta_blocks()
        );
        let _ = writeln!(o, "  total inodes           {}", g.total_inodes());
        let _ = writeln!(o, "  pointers per indirect  {}", g.ptrs_per_block());
        let _ = writeln!(o, "  largest file           {} bytes", g.max_file_size());
        let _ = writeln!(
            o,
            "  size                   {} bytes ({} used, {} free blocks)",
            g.total_blocks * g.block_size as u64,
            g.total_blocks - sb.free_blocks.min(g.total_blocks),
            sb.free_blocks
        );
        o
    }

    /// A group: its layout, its descriptor, and what its bitmaps say.
    pub fn group(&self, grp: u64) -> Result<String> {
        let g = &self.g;
        if grp >= g.group_count {
            return Err(InspectError::NotFound(format!(
                "no group {grp} (the file system has {})",
                g.group_count
            )));
        }
        let mut o = String::new();
        let s = g.group_start(grp);
        let len = g.group_len(grp);
        let _ = writeln!(
            o,
            "group {grp}: blocks {s}..{} ({len} blocks), inodes {}..{}",
            s + len - 1,
            grp * g.inodes_per_group,
            (grp + 1) * g.inodes_per_group - 1
        );
        let _ = writeln!(
            o,
            "  block {:>8}  superblock copy{}",
            g.sb_block(grp),
            if grp == 0 { " (primary)" } else { "" }
        );
        let _ = writeln!(o, "  block {:>8}  group descriptor", g.desc_block(grp));
        let _ = writeln!(o, "  block {:>8}  block bitmap", g.block_bitmap(grp));
        let _ = writeln!(o, "  block {:>8}  inode bitmap", g.inode_bitmap(grp));
        let _ = writeln!(
            o,
            "  blocks {}..{}  inode table ({} blocks)",
            g.inode_table(grp),
            g.first_data(grp) - 1,
            g.inode_table_blocks
        );
        let _ = writeln!(o, "  blocks {}..{}  data", g.first_data(grp), s + len - 1);
        let raw = self.read_block(g.desc_block(grp))?;
        let _ = writeln!(o, "\ndescriptor");
        match GroupDesc::decode(&raw, grp) {
            Ok(d) => table(
                &mut o,
                &[
                    (0, 4, "magic", "\"CGRP\"".into()),
                    (
                        4,
                        4,
                        "version",
                        u32::from_le_bytes(raw[4..8].try_into().unwrap_or_default()).to_string(),
                    ),
                    (8, 4, "group", d.group.to_string()),
                    (12, 4, "free_blocks", d.free_blocks.to_string()),
                    (16, 4, "free_inodes", d.free_inodes.to_string()),
                    (20, 4, "dirs", d.dirs.to_string()),
                    (508, 4, "crc32c(0..508)", "ok".into()),
                ],
            ),
            Err(e) => {
                let _ = writeln!(o, "  DAMAGED: {}", e.0);
                hexdump(&mut o, &raw[..SB_BYTES.min(raw.len())], 0);
            }
        }
        let bm = self.read_block(g.block_bitmap(grp))?;
        let used: Vec<u64> = (0..len)
            .filter(|&i| bitmap::get(&bm, i as usize))
            .map(|i| s + i)
            .collect();
        let _ = writeln!(o, "\nblock bitmap: {} of {len} in use", used.len());
        let _ = writeln!(o, "  in use: {}", ranges(&used, 40));
        let im = self.read_block(g.inode_bitmap(grp))?;
        let iused: Vec<u64> = (0..g.inodes_per_group)
            .filter(|&i| bitmap::get(&im, i as usize))
            .map(|i| grp * g.inodes_per_group + i)
            .collect();
        let _ = writeln!(
            o,
            "inode bitmap: {} of {} in use",
            iused.len(),
            g.inodes_per_group
        );
        let _ = writeln!(o, "  in use: {}", ranges(&iused, 40));
        Ok(o)
    }

    fn read_inode(&self, ino: u64) -> Result<(u64, usize, Vec<u8>)> {
        if ino >= self.g.total_inodes() {
            return Err(InspectError::NotFound(format!(
                "no inode {ino} (the file system has {})",
                self.g.total_inodes()
            )));
        }
        let (blk, off) = self.g.inode_location(ino);
        let b = self.read_block(blk)?;
        Ok((blk, off, b[off..off + INODE_SIZE].to_vec()))
    }

    /// An inode: location, every field at its offset, and its block map as a tree.
    pub fn inode(&self, ino: u64) -> Result<String> {
        let (blk, off, raw) = self.read_inode(ino)?;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "inode {ino}: group {}, block {blk}, byte {off} of the block",
            self.g.group_of_ino(ino)
        );
        if ino < ROOT_INO {
            let _ = writeln!(o, "  (reserved inode number)");
        }
        let d = match DiskInode::decode(ino, &raw) {
            Ok(d) => d,
            Err(e) => {
                let _ = writeln!(o, "  DAMAGED: {}", e.0);
                hexdump(&mut o, &raw, 0);
                return Ok(o);
            }
        };
        if d.is_free() {
            let _ = writeln!(o, "  free (generation {})", d.generation);
            return Ok(o);
        }
        let raw_flags = u32::from_le_bytes(raw[64..68].try_into().unwrap_or_default());
        let rows: Vec<(usize, usize, &str, String)> = vec![
            (
                0,
                4,
                "mode",
                format!("{:#o} ({})", d.mode, kind_name(d.mode)),
            ),
            (4, 4, "nlink", d.nlink.to_string()),
            (8, 4, "uid", d.uid.to_string()),
            (12, 4, "gid", d.gid.to_string()),
            (16, 8, "size", d.size.to_string()),
            (
                24,
                8,
                "blocks",
                format!("{} (data, indirect and xattr)", d.blocks),
            ),
            (32, 8, "atime", time(d.atime)),
            (40, 8, "mtime", time(d.mtime)),
            (48, 8, "ctime", time(d.ctime)),
            (56, 8, "btime", time(d.btime)),
            (
                64,
                4,
                "flags",
                format!(
                    "{raw_flags:#x}{}",
                    if d.fast_link.is_some() {
                        " (INLINE: fast symlink)"
                    } else {
                        ""
                    }
                ),
            ),
            (68, 4, "generation", d.generation.to_string()),
            (
                72,
                4,
                "rdev",
                format!("{:#x} ({}:{})", d.rdev, d.rdev >> 8, d.rdev & 0xff),
            ),
            (200, 8, "xattr block", d.xattr.to_string()),
            (252, 4, "crc32c(ino ++ 0..252)", "ok".into()),
        ];
        table(&mut o, &rows);
        if let Some(t) = &d.fast_link {
            let _ = writeln!(
                o,
                "\n  80..200  fast symlink target: {:?}",
                String::from_utf8_lossy(t)
            );
        } else {
            let _ = writeln!(
                o,
                "\nblock map (80: direct[12], 176: single, 184: double, 192: triple indirect)"
            );
            self.block_map(&mut o, &d)?;
        }
        if d.xattr != 0 {
            let _ = writeln!(o, "\nextended attributes (block {})", d.xattr);
            let r = xattr::read_chain(ino, d.xattr, |b| {
                self.read_block(b)
                    .map_err(|e| cairn_ffs::format::FormatError(format!("unreadable: {e}")))
            });
            match r {
                Ok(c) => {
                    if c.blocks.len() > 1 {
                        let _ = writeln!(o, "  chain of {} blocks: {:?}", c.blocks.len(), c.blocks);
                    }
                    for (n, v) in c.attrs {
                        let _ = writeln!(
                            o,
                            "  {} = {:?}",
                            String::from_utf8_lossy(&n),
                            String::from_utf8_lossy(&v)
                        );
                    }
                }
                Err(e) => {
                    let _ = writeln!(o, "  DAMAGED: {}", e.0);
                }
            }
        }
        if d.is_symlink()
            && d.fast_link.is_none()
            && d.direct[0] != 0
            && let Ok(b) = self.read_block(d.direct[0])
        {
            let n = (d.size as usize).min(b.len());
            let _ = writeln!(
                o,
                "\nslow symlink target: {:?}",
                String::from_utf8_lossy(&b[..n])
            );
        }
        Ok(o)
    }

    /// The direct pointers, then each indirect tree with its mapped runs.
    fn block_map(&self, o: &mut String, d: &DiskInode) -> Result<()> {
        let mut runs = Runs::default();
        for (i, &p) in d.direct.iter().enumerate() {
            if p != 0 {
                let _ = writeln!(
                    o,
                    "  direct[{i:>2}]  lblk {i:<10} -> block {p}{}",
                    self.ptr_note(p)
                );
            }
        }
        let ppb = self.g.ptrs_per_block();
        let mut base = NDIRECT as u64;
        let mut span = 1u64;
        let names = ["single", "double", "triple"];
        for level in 1..=3u32 {
            span = span.saturating_mul(ppb);
            let p = d.indirect[level as usize - 1];
            if p != 0 {
                let _ = writeln!(
                    o,
                    "  {} indirect -> block {p}{} (lblk {base}..{})",
                    names[level as usize - 1],
                    self.ptr_note(p),
                    base.saturating_add(span) - 1
                );
                let mut budget = 10_000u64;
                self.tree(o, p, level, base, 2, &mut runs, &mut budget)?;
            }
            base = base.saturating_add(span);
        }
        if !runs.0.is_empty() {
            let _ = writeln!(
                o,
                "  data mapped through indirect blocks (lblk -> block runs):"
            );
            for (i, (l, p, n)) in runs.0.iter().enumerate() {
                if i == 64 {
                    let _ = writeln!(o, "    ... {} more runs", runs.0.len() - 64);
                    break;
                }
                let _ = writeln!(
                    o,
                    "    lblk {l}..{} -> blocks {p}..{}",
                    l + n - 1,
                    p + n - 1
                );
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn tree(
        &self,
        o: &mut String,
        p: u64,
        level: u32,
        base: u64,
        indent: usize,
        runs: &mut Runs,
        budget: &mut u64,
    ) -> Result<()> {
        if !self.g.is_data_block(p) || *budget == 0 {
            return Ok(());
        }
        *budget -= 1;
        let b = self.read_block(p)?;
        let ppb = self.g.ptrs_per_block();
        let span = ppb.saturating_pow(level - 1);
        let live = (0..ppb as usize)
            .filter(|&j| b[j * 8..j * 8 + 8] != [0; 8])
            .count();
        if level > 1 {
            let _ = writeln!(
                o,
                "{:indent$}block {p}: {live} of {ppb} pointers set",
                "",
                indent = indent * 2
            );
        }
        for j in 0..ppb as usize {
            let q = u64::from_le_bytes(b[j * 8..j * 8 + 8].try_into().unwrap_or_default());
            if q == 0 {
                continue;
            }
            let lblk = base.saturating_add(j as u64 * span);
            if level == 1 {
                runs.push(lblk, q);
            } else {
                let _ = writeln!(
                    o,
                    "{:indent$}[{j}] -> block {q}{} (lblk {lblk}..)",
                    "",
                    self.ptr_note(q),
                    indent = indent * 2 + 2
                );
                self.tree(o, q, level - 1, lblk, indent + 2, runs, budget)?;
            }
        }
        Ok(())
    }

    fn ptr_note(&self, p: u64) -> &'static str {
        if p >= self.g.total_blocks {
            " (OUT OF RANGE)"
        } else if !self.g.is_data_block(p) {
            " (INSIDE GROUP METADATA)"
        } else {
            ""
        }
    }

    /// Resolves `path` from the root and shows the directory's records chunk by chunk
    /// (or the inode, when the path names something else).
    pub fn dir(&self, path: &str) -> Result<String> {
        let mut ino = ROOT_INO;
        let mut trail = vec![("/".to_string(), ROOT_INO)];
        for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            let d = self.dir_inode(ino)?;
            let next = self.lookup(ino, &d, comp.as_bytes())?.ok_or_else(|| {
                InspectError::NotFound(format!("'{comp}' not found in directory {ino}"))
            })?;
            ino = next;
            trail.push((comp.to_string(), ino));
        }
        let mut o = String::new();
        let _ = writeln!(
            o,
            "path: {}",
            trail
                .iter()
                .map(|(n, i)| format!("{n} ({i})"))
                .collect::<Vec<_>>()
                .join(" -> ")
        );
        let (_, _, raw) = self.read_inode(ino)?;
        let d = DiskInode::decode(ino, &raw).map_err(|e| InspectError::NotFound(e.0))?;
        if !d.is_dir() {
            let _ = writeln!(o, "not a directory; its inode:\n");
            o.push_str(&self.inode(ino)?);
            return Ok(o);
        }
        let bs = self.g.block_size as u64;
        let _ = writeln!(
            o,
            "directory inode {ino}: size {} ({} blocks), nlink {}",
            d.size,
            d.size / bs,
            d.nlink
        );
        let _ = writeln!(
            o,
            "records: offset in block, ino (u32 @0), reclen (u16 @4), type (u8 @6), namelen (u8 @7), name (@8)"
        );
        for lblk in 0..(d.size / bs).min(1 << 20) {
            let p = self.bmap(&d, lblk)?;
            if p == 0 {
                let _ = writeln!(o, "\nblock {lblk}: HOLE");
                continue;
            }
            let _ = writeln!(o, "\nblock {lblk} (block {p})");
            let b = self.read_block(p)?;
            let mut empty_from: Option<usize> = None;
            let nchunks = b.len() / DIR_CHUNK;
            for c in 0..=nchunks {
                let recs: Vec<_> = if c < nchunks {
                    dir::records(&b[c * DIR_CHUNK..(c + 1) * DIR_CHUNK]).collect()
                } else {
                    vec![]
                };
                let all_free = recs.len() == 1
                    && recs[0]
                        .as_ref()
                        .is_ok_and(|e| e.ino == 0 && e.reclen == DIR_CHUNK);
                if all_free {
                    empty_from.get_or_insert(c);
                    continue;
                }
                if let Some(f) = empty_from.take() {
                    if f + 1 == c {
                        let _ = writeln!(o, "  chunk {f}: empty");
                    } else {
                        let _ = writeln!(o, "  chunks {f}..{}: empty", c - 1);
                    }
                }
                if c == nchunks {
                    break;
                }
                let _ = writeln!(
                    o,
                    "  chunk {c} (bytes {}..{})",
                    c * DIR_CHUNK,
                    (c + 1) * DIR_CHUNK
                );
                for r in recs {
                    match r {
                        Ok(e) if e.ino == 0 => {
                            let _ = writeln!(
                                o,
                                "    {:>5}  unused record, reclen {}",
                                c * DIR_CHUNK + e.off,
                                e.reclen
                            );
                        }
                        Ok(e) => {
                            let _ = writeln!(
                                o,
                                "    {:>5}  ino {:<8} reclen {:<4} type {:<2} ({:<7}) namelen {:<3} {:?}",
                                c * DIR_CHUNK + e.off,
                                e.ino,
                                e.reclen,
                                e.dtype,
                                kind_name((e.dtype as u32) << 12),
                                e.name.len(),
                                String::from_utf8_lossy(e.name)
                            );
                        }
                        Err(e) => {
                            let _ = writeln!(o, "    DAMAGED: {}", e.0);
                        }
                    }
                }
            }
        }
        Ok(o)
    }

    fn dir_inode(&self, ino: u64) -> Result<DiskInode> {
        let (_, _, raw) = self.read_inode(ino)?;
        let d = DiskInode::decode(ino, &raw).map_err(|e| InspectError::NotFound(e.0))?;
        if !d.is_dir() {
            return Err(InspectError::NotFound(format!(
                "inode {ino} is not a directory"
            )));
        }
        Ok(d)
    }

    fn lookup(&self, _ino: u64, d: &DiskInode, name: &[u8]) -> Result<Option<u64>> {
        let bs = self.g.block_size as u64;
        for lblk in 0..(d.size / bs).min(1 << 20) {
            let p = self.bmap(d, lblk)?;
            if p == 0 {
                continue;
            }
            let b = self.read_block(p)?;
            for c in 0..b.len() / DIR_CHUNK {
                for e in dir::entries(&b[c * DIR_CHUNK..(c + 1) * DIR_CHUNK]).map_while(|r| r.ok())
                {
                    if e.name == name {
                        return Ok(Some(e.ino as u64));
                    }
                }
            }
        }
        Ok(None)
    }

    /// The physical block of `lblk` (0 for a hole or a bad pointer).
    fn bmap(&self, d: &DiskInode, lblk: u64) -> Result<u64> {
        if lblk < NDIRECT as u64 {
            let p = d.direct[lblk as usize];
            return Ok(if self.g.is_data_block(p) { p } else { 0 });
        }
        let ppb = self.g.ptrs_per_block();
        let mut rel = lblk - NDIRECT as u64;
        let mut span = 1u64;
        for level in 1..=3u32 {
            span = span.saturating_mul(ppb);
            if rel < span {
                let mut p = d.indirect[level as usize - 1];
                let mut s = span;
                for _ in 0..level {
                    if !self.g.is_data_block(p) {
                        return Ok(0);
                    }
                    s /= ppb;
                    let i = (rel / s) as usize;
                    rel %= s;
                    let b = self.read_block(p)?;
                    p = u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default());
                }
                return Ok(if self.g.is_data_block(p) { p } else { 0 });
            }
            rel -= span;
        }
        Ok(0)
    }

    /// What block `b` is, and its first bytes.
    pub fn block(&self, b: u64) -> Result<String> {
        let raw = self.read_block(b)?;
        let g = &self.g;
        let grp = g.group_of_block(b);
        let rel = b - g.group_start(grp);
        let what = match rel {
            0 => format!("superblock {}", if grp == 0 { "(primary)" } else { "copy" }),
            1 => "group descriptor".into(),
            2 => "block bitmap".into(),
            3 => "inode bitmap".into(),
            r if r < 4 + g.inode_table_blocks => {
                let first = grp * g.inodes_per_group + (r - 4) * g.inodes_per_block();
                format!(
                    "inode table (inodes {first}..{})",
                    first + g.inodes_per_block() - 1
                )
            }
            _ => {
                let bm = self.read_block(g.block_bitmap(grp))?;
                let used = bitmap::get(&bm, rel as usize);
                format!(
                    "data block ({} in the bitmap)",
                    if used { "in use" } else { "free" }
                )
            }
        };
        let mut o = String::new();
        let _ = writeln!(
            o,
            "block {b}: group {grp}, block {rel} of the group: {what}"
        );
        let shown = raw.len().min(1024);
        hexdump(&mut o, &raw[..shown], b * g.block_size as u64);
        if shown < raw.len() {
            let rest_zero = raw[shown..].iter().all(|&x| x == 0);
            let _ = writeln!(
                o,
                "... {} more bytes{}",
                raw.len() - shown,
                if rest_zero { " (all zero)" } else { "" }
            );
        }
        Ok(o)
    }
}

#[derive(Default)]
struct Runs(Vec<(u64, u64, u64)>);

impl Runs {
    fn push(&mut self, lblk: u64, p: u64) {
        if let Some((l, q, n)) = self.0.last_mut()
            && *l + *n == lblk
            && *q + *n == p
        {
            *n += 1;
            return;
        }
        self.0.push((lblk, p, 1));
    }
}

fn table(o: &mut String, rows: &[(usize, usize, &str, String)]) {
    let _ = writeln!(o, "  {:>4} {:>4}  {:<22} value", "off", "size", "field");
    for (off, size, name, v) in rows {
        let _ = writeln!(o, "  {off:>4} {size:>4}  {name:<22} {v}");
    }
}

fn time(ns: i64) -> String {
    if ns == 0 {
        return "0".into();
    }
    format!(
        "{ns} ({}.{:09} s since the epoch)",
        ns.div_euclid(1_000_000_000),
        ns.rem_euclid(1_000_000_000)
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn kind_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "chardev",
        libc::S_IFBLK => "blockdev",
        _ => "?",
    }
}

/// `start..end` runs of consecutive numbers, at most `max` of them.
fn ranges(v: &[u64], max: usize) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        if out.len() == max {
            out.push("...".into());
            break;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

/// Classic 16-byte hex dump; runs of identical lines are shown once, then `*`.
fn hexdump(o: &mut String, b: &[u8], base: u64) {
    let mut prev: Option<&[u8]> = None;
    let mut starred = false;
    for (i, line) in b.chunks(16).enumerate() {
        if prev == Some(line) {
            if !starred {
                let _ = writeln!(o, "*");
                starred = true;
            }
            continue;
        }
        starred = false;
        prev = Some(line);
        let hexs: Vec<String> = line.iter().map(|x| format!("{x:02x}")).collect();
        let text: String = line
            .iter()
            .map(|&c| {
                if (0x20..0x7f).contains(&c) {
                    c as char
                } else {
                    '.'
                }
            })
            .collect();
        let _ = writeln!(
            o,
            "{:08x}  {:<47}  |{text}|",
            base + (i * 16) as u64,
            hexs.join(" ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testimage::Image;

    fn insp(img: &Image) -> Inspector {
        Inspector::from_device(Arc::new(img.device())).unwrap()
    }

    #[test]
    fn every_view_renders() {
        let img = Image::populated();
        let i = insp(&img);
        let sb = i.run(&[]).unwrap();
        assert!(
            sb.contains("blocks_per_group") && sb.contains("256"),
            "{sb}"
        );
        let g = i.run(&["group".into(), "1".into()]).unwrap();
        assert!(g.contains("inode table") && g.contains("descriptor"), "{g}");
        let big = img.lookup(ROOT_INO, b"big").unwrap();
        let ino = i.run(&["inode".into(), big.to_string()]).unwrap();
        assert!(
            ino.contains("double indirect") && ino.contains("lblk 12.."),
            "{ino}"
        );
        let d = i.run(&["dir".into(), "/a/b".into()]).unwrap();
        assert!(d.contains("\"medium\"") && d.contains("\"..\""), "{d}");
        let f = i.run(&["dir".into(), "/fast".into()]).unwrap();
        assert!(f.contains("fast symlink target: \"a/small\""), "{f}");
        let b = i
            .run(&["block".into(), img.g.inode_table(0).to_string()])
            .unwrap();
        assert!(b.contains("inode table (inodes 0..15)"), "{b}");
        assert!(i.run(&["dir".into(), "/nope".into()]).is_err());
        assert!(i.run(&["inode".into(), "99999999".into()]).is_err());
        assert!(i.run(&["block".into(), "x".into()]).is_err());
        assert!(i.run(&["what".into()]).is_err());
    }

    #[test]
    fn damaged_structures_are_shown_not_refused() {
        let mut img = Image::populated();
        let a = img.lookup(ROOT_INO, b"a").unwrap();
        img.inode_raw_mut(a)[40] ^= 1;
        let b = img.g.desc_block(2);
        img.block_mut(b)[12] ^= 1;
        let i = insp(&img);
        assert!(i.inode(a).unwrap().contains("DAMAGED"));
        assert!(i.group(2).unwrap().contains("DAMAGED"));
    }

    #[test]
    fn ranges_compress() {
        assert_eq!(ranges(&[1, 2, 3, 7, 9, 10], 10), "1-3, 7, 9-10");
        assert_eq!(ranges(&[], 10), "none");
        assert_eq!(ranges(&[1, 3, 5], 2), "1, 3, ...");
    }
}
