//! `cairn inspect` on an LFS image: one structure at a time, as text.
//!
//! `superblock`, `checkpoint` (both regions, which one a mount chooses), `segment N` (its
//! usage entry and every partial segment its summaries describe), `imap` (the inodes in
//! use), `inode N` and `dir PATH` (after the roll-forward a read-only mount does, in
//! memory: what a mount would show). Reads only; a hostile image gives an error line, never
//! a panic.

use std::fmt::Write as _;
use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_vfs::{Ctx, FileSystem, FsError};

use crate::engine::{Lfs, MountOptions, ROOT_INO};
use crate::format::BLOCK_SIZE;
use crate::format::checkpoint::{self, Checkpoint};
use crate::format::summary::Summary;
use crate::format::superblock::Superblock;

/// Why nothing was shown.
#[derive(Debug)]
pub enum InspectError {
    /// The image cannot be opened or is not a usable LFS image.
    Open(FsError),
    /// A request the inspector does not understand.
    Usage(String),
    /// The thing asked for is not there (an inode not in use, a missing path).
    NotFound(String),
}

impl std::fmt::Display for InspectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InspectError::Open(e) => write!(f, "{e}"),
            InspectError::Usage(m) | InspectError::NotFound(m) => f.write_str(m),
        }
    }
}

const USAGE: &str = "what to show: superblock | checkpoint | segment N | imap | inode N | dir PATH";

/// Inspects the image at `path` (opened read-only, with a shared lock).
pub fn inspect_path(path: &std::path::Path, what: &[String]) -> Result<String, InspectError> {
    let dev = cairn_blockdev::FileDevice::open(path, BLOCK_SIZE as u32, true)
        .map_err(|e| InspectError::Open(e.into()))?;
    inspect_device(Arc::new(dev), what)
}

pub fn inspect_device(dev: Arc<dyn BlockDevice>, what: &[String]) -> Result<String, InspectError> {
    let words: Vec<&str> = what.iter().map(String::as_str).collect();
    let num = |w: Option<&&str>| -> Result<u64, InspectError> {
        w.and_then(|s| s.parse().ok())
            .ok_or_else(|| InspectError::Usage(USAGE.into()))
    };
    let sb = read_sb(&dev)?;
    match words.as_slice() {
        [] | ["superblock"] => Ok(show_sb(&sb)),
        ["checkpoint"] => show_checkpoints(&dev, &sb),
        ["segment", rest @ ..] if rest.len() == 1 => show_segment(&dev, &sb, num(rest.first())?),
        ["imap"] => show_imap(&dev),
        ["inode", rest @ ..] if rest.len() == 1 => show_inode(&dev, num(rest.first())?),
        ["dir", path] => show_dir(&dev, path),
        ["dir"] => show_dir(&dev, "/"),
        _ => Err(InspectError::Usage(USAGE.into())),
    }
}

fn read_sb(dev: &Arc<dyn BlockDevice>) -> Result<Superblock, InspectError> {
    if dev.block_size() as usize != BLOCK_SIZE {
        return Err(InspectError::Usage(format!(
            "device block size {} (LFS uses {BLOCK_SIZE})",
            dev.block_size()
        )));
    }
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_blocks(0, &mut b)
        .map_err(|e| InspectError::Open(e.into()))?;
    Superblock::decode(&b, dev.num_blocks()).map_err(|e| InspectError::Open(FsError::Corrupt(e.0)))
}

fn show_sb(sb: &Superblock) -> String {
    format!(
        "superblock (block 0)\n  format version   {}\n  label            '{}'\n  blocks           {} of {BLOCK_SIZE} bytes\n  segments         {} of {} blocks ({} KiB), from block {}\n  checkpoint       2 regions of {} block(s), at blocks {} and {}\n  inodes           at most {} (inode map: {} block(s))\n  usage table      {} block(s)\n  created          {} ns\n",
        sb.version,
        sb.label,
        sb.total_blocks,
        sb.segments,
        sb.segment_blocks,
        sb.segment_blocks as usize * BLOCK_SIZE / 1024,
        sb.first_segment,
        sb.cp_blocks,
        sb.cp_start(0),
        sb.cp_start(1),
        sb.max_inodes,
        sb.imap_blocks,
        sb.usage_blocks,
        sb.created,
    )
}

fn read_cp(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    slot: usize,
) -> crate::format::FResult<Checkpoint> {
    let mut r = vec![0u8; sb.cp_blocks as usize * BLOCK_SIZE];
    if dev.read_blocks(sb.cp_start(slot), &mut r).is_err() {
        return Err(crate::format::FormatError("read error".into()));
    }
    Checkpoint::decode(&r, sb)
}

fn show_checkpoints(dev: &Arc<dyn BlockDevice>, sb: &Superblock) -> Result<String, InspectError> {
    let mut out = String::new();
    let (a, b) = (read_cp(dev, sb, 0), read_cp(dev, sb, 1));
    for (slot, cp) in [(0, &a), (1, &b)] {
        let _ = writeln!(
            out,
            "checkpoint region {slot} (block {}):",
            sb.cp_start(slot)
        );
        match cp {
            Err(e) => {
                let _ = writeln!(out, "  invalid: {}", e.0);
            }
            Ok(cp) => {
                let _ = writeln!(
                    out,
                    "  serial {}, written at {} ns\n  log head: segment {} block {}, next summary serial {}\n  next inode number {}\n  inode map blocks ({}): {:?}\n  usage table blocks ({}): {:?}\n  orphans (unlinked while open, freed by the next read-write mount): {:?}",
                    cp.serial,
                    cp.time_ns,
                    cp.log_seg,
                    cp.log_off,
                    cp.log_serial,
                    cp.next_ino,
                    cp.imap_addrs.len(),
                    cp.imap_addrs,
                    cp.usage_addrs.len(),
                    cp.usage_addrs,
                    cp.orphans
                );
            }
        }
    }
    match checkpoint::choose(a, b) {
        Ok((slot, cp)) => {
            let _ = writeln!(
                out,
                "a mount uses region {slot} (serial {}), then rolls forward from segment {} block {}",
                cp.serial, cp.log_seg, cp.log_off
            );
        }
        Err(e) => {
            let _ = writeln!(out, "no valid region: {}", e.0);
        }
    }
    Ok(out)
}

fn mount(dev: &Arc<dyn BlockDevice>) -> Result<Arc<Lfs>, InspectError> {
    let o = MountOptions {
        read_only: true,
        syncer: false,
        ..Default::default()
    };
    Lfs::mount_device(dev.clone(), &o).map_err(InspectError::Open)
}

fn show_segment(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    seg: u64,
) -> Result<String, InspectError> {
    if seg >= sb.segments as u64 {
        return Err(InspectError::NotFound(format!(
            "segment {seg}: the image has {} segments",
            sb.segments
        )));
    }
    let seg = seg as u32;
    let mut out = String::new();
    let fs = mount(dev)?;
    {
        let st = fs.st.lock();
        let u = st.usage[seg as usize];
        let _ = writeln!(
            out,
            "segment {seg} (blocks {}..{}): {}, {} live bytes of {}, youngest block {} ms{}",
            sb.seg_start(seg),
            sb.seg_start(seg) + sb.segment_blocks as u64,
            if u.dirty { "dirty" } else { "clean" },
            u.live_bytes,
            sb.segment_blocks as usize * BLOCK_SIZE,
            u.youngest,
            if seg == st.log.seg {
                " (the log head)"
            } else {
                ""
            }
        );
    }
    // Every summary the segment holds, in order, whatever its serial (an old log may show
    // through after the segment was reused: each partial names the serial it was written
    // with).
    let mut off = 0u32;
    let mut b = vec![0u8; BLOCK_SIZE];
    while off + 2 <= sb.segment_blocks {
        if dev
            .read_blocks(sb.seg_start(seg) + off as u64, &mut b)
            .is_err()
        {
            break;
        }
        let Ok(s) = Summary::decode(&b, sb.segment_blocks, sb.segments) else {
            break;
        };
        if s.seg != seg || s.off != off {
            break;
        }
        let mut kinds: std::collections::BTreeMap<String, u32> = Default::default();
        for e in &s.entries {
            *kinds
                .entry(format!("{:?}", e.kind).to_lowercase())
                .or_default() += 1;
        }
        let _ = writeln!(
            out,
            "  partial at block {off}: serial {}, {} block(s) {:?}{}{}{}, next segment {}",
            s.serial,
            s.entries.len(),
            kinds,
            if s.commit() { ", COMMIT" } else { "" },
            if s.hashed() { "" } else { ", version-1 CRC" },
            if s.skip_rest() { ", rest skipped" } else { "" },
            s.next_seg
        );
        for (i, e) in s.entries.iter().enumerate().take(64) {
            let _ = writeln!(
                out,
                "    block {}: {:?} inode {} version {} lbn {}",
                off + 1 + i as u32,
                e.kind,
                e.ino,
                e.version,
                e.lbn
            );
        }
        if s.entries.len() > 64 {
            let _ = writeln!(out, "    ... {} more", s.entries.len() - 64);
        }
        off += 1 + s.entries.len() as u32;
        if s.skip_rest() {
            break;
        }
    }
    Ok(out)
}

fn show_imap(dev: &Arc<dyn BlockDevice>) -> Result<String, InspectError> {
    let fs = mount(dev)?;
    let st = fs.st.lock();
    let mut out = String::from("inode map (after roll-forward): inode -> block, version\n");
    let mut n = 0;
    for (ino, e) in st.imap.iter().enumerate() {
        if e.addr != 0 {
            n += 1;
            let _ = writeln!(out, "  {ino:>8} -> {:>10}  v{}", e.addr, e.version);
        }
    }
    let _ = writeln!(out, "{n} inode(s) in use of {}", st.sb.max_inodes);
    Ok(out)
}

fn show_inode(dev: &Arc<dyn BlockDevice>, ino: u64) -> Result<String, InspectError> {
    let fs = mount(dev)?;
    let st = fs.st.lock();
    let e = st
        .imap
        .get(ino as usize)
        .copied()
        .filter(|e| e.addr != 0)
        .ok_or_else(|| InspectError::NotFound(format!("inode {ino}: not in use")))?;
    let i = st
        .read_inode(ino)
        .map_err(InspectError::Open)?
        .ok_or_else(|| InspectError::NotFound(format!("inode {ino}: not in its block")))?;
    let direct: Vec<u64> = i.direct.iter().copied().filter(|&a| a != 0).collect();
    Ok(format!(
        "inode {ino} (block {}, version {})\n  mode     {:o}\n  owner    {}:{}\n  links    {}\n  size     {}\n  blocks   {}\n  mtime    {}.{:09}\n  direct   {:?}\n  indirect {} / double {} / triple {}\n  xattr    {}\n",
        e.addr,
        i.version,
        i.mode,
        i.uid,
        i.gid,
        i.nlink,
        i.size,
        i.blocks,
        i.mtime.sec,
        i.mtime.nsec,
        direct,
        i.indirect,
        i.dindirect,
        i.tindirect,
        i.xattr
    ))
}

fn show_dir(dev: &Arc<dyn BlockDevice>, path: &str) -> Result<String, InspectError> {
    let fs = mount(dev)?;
    let c = Ctx::root();
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        ino = fs
            .lookup(&c, ino, std::ffi::OsStr::new(part))
            .map_err(|_| InspectError::NotFound(format!("{path}: no such directory")))?
            .ino;
    }
    let mut out = format!("directory {path} (inode {ino}):\n");
    let mut ents = Vec::new();
    fs.readdir(ino, 0, 0, false, &mut |e| {
        ents.push((e.name.to_string_lossy().into_owned(), e.ino, e.kind));
        true
    })
    .map_err(|e| InspectError::NotFound(format!("{path}: {e}")))?;
    for (name, i, kind) in ents {
        let _ = writeln!(out, "  {i:>8}  {kind:?}  {name}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_shows_and_bad_requests_are_refused() {
        let img = crate::fuzz::base_image().to_vec();
        let dev: Arc<dyn BlockDevice> = Arc::new(cairn_blockdev::MemDevice::from_bytes(
            BLOCK_SIZE as u32,
            img,
        ));
        let run = |w: &[&str]| {
            let w: Vec<String> = w.iter().map(|s| s.to_string()).collect();
            inspect_device(dev.clone(), &w)
        };
        assert!(run(&["superblock"]).unwrap().contains("segments"));
        let cp = run(&["checkpoint"]).unwrap();
        assert!(cp.contains("a mount uses region"), "{cp}");
        let seg = run(&["segment", "0"]).unwrap();
        assert!(seg.contains("partial at block 0"), "{seg}");
        let imap = run(&["imap"]).unwrap();
        assert!(imap.contains("inode(s) in use"), "{imap}");
        assert!(run(&["inode", "2"]).unwrap().contains("mode     40755"));
        let d = run(&["dir", "/d"]).unwrap();
        assert!(d.contains("f2"), "{d}");
        assert!(matches!(
            run(&["inode", "999"]),
            Err(InspectError::NotFound(_))
        ));
        assert!(matches!(
            run(&["dir", "/nope"]),
            Err(InspectError::NotFound(_))
        ));
        assert!(matches!(
            run(&["segment", "99999"]),
            Err(InspectError::NotFound(_))
        ));
        assert!(matches!(run(&["frob"]), Err(InspectError::Usage(_))));
        assert!(matches!(run(&["inode", "x"]), Err(InspectError::Usage(_))));
    }
}
