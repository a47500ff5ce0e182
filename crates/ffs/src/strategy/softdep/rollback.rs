//! Undo at write time (002 §3.2): the unsafe changes of a block are rolled back in the
//! private image the buffer cache hands to `before_write`. The buffer itself is never
//! touched, so readers never see a rolled-back byte and nothing needs rolling forward: the
//! buffer stays dirty and its next write carries what has become safe.

use std::collections::BTreeMap;

use super::deps::{Deps, PtrAt, What, Written};
use super::{Blk, Ino};
use crate::format::{DiskInode, Geometry, INODE_SIZE, dir, get_u64, kind, put_u64};
use crate::strategy::{BlockKind, InodePtr};

/// What a rollback did to one image.
#[derive(Default)]
pub(crate) struct Rolled {
    pub written: Written,
    /// Changes undone (pointers, sizes, inodes, entries).
    pub count: u64,
}

/// Which removed entries `roll_back` puts back: all of them, unless a planted bug says
/// otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PutBack {
    All,
    /// Planted bug: only names of directories (a file's rename no longer keeps rule 3).
    Directories,
    /// Planted bug: none.
    Nothing,
}

impl PutBack {
    fn keeps(self, dtype: u8) -> bool {
        match self {
            PutBack::All => true,
            PutBack::Directories => dtype == libc::DT_DIR,
            PutBack::Nothing => false,
        }
    }
}

/// Rolls back in `image` (block `blk`, buffer kind `k`) everything the records say is not
/// yet safe. An error means the image could not be made safe: the write must not happen.
/// `put_back` other than `All` is a planted bug: removed entries that must stay are not put
/// back.
pub(crate) fn roll_back(
    d: &Deps,
    geo: &Geometry,
    blk: Blk,
    k: u8,
    image: &mut [u8],
    put_back: PutBack,
) -> std::io::Result<Rolled> {
    let mut out = Rolled::default();
    out.written.blk = blk;
    let ids = super::deps::ids_at(&d.by_block, &blk);
    if ids.is_empty() {
        return Ok(out);
    }
    let ids = &ids[..];
    match k {
        kind::INODE => inode_block(d, geo, blk, ids, image, &mut out),
        kind::INDIRECT => {
            for id in ids {
                if let Some(What::Alloc {
                    at: PtrAt::Indir { holder, slot, .. },
                    old_blk,
                    applied: false,
                    ..
                }) = d.recs.get(id).map(|r| &r.what)
                    && *holder == blk
                {
                    let at = *slot as usize * 8;
                    if at + 8 <= image.len() && get_u64(image, at) != *old_blk {
                        put_u64(image, at, *old_blk);
                        out.count += 1;
                    }
                }
            }
            Ok(out)
        }
        kind::DIRECTORY => directory_block(d, blk, ids, image, out, put_back),
        _ => Ok(out),
    }
}

/// An entry to roll back: offset, what it showed before (`None`: free space), what it names.
type EntryRollback = (u32, Option<(u32, u8)>, Ino);

/// A directory block: entries not yet safe written as what they replaced (free space, or
/// the inode they named before), then removed entries that must stay on disk written back
/// as they were (no entry lies over their bytes: one added there waits for the removal).
fn directory_block(
    d: &Deps,
    blk: Blk,
    ids: &[u64],
    image: &mut [u8],
    mut out: Rolled,
    put_back: PutBack,
) -> std::io::Result<Rolled> {
    let mut removed: Vec<(u32, Ino, u8, &[u8])> = ids
        .iter()
        .filter_map(|id| match d.recs.get(id).map(|r| &r.what) {
            Some(What::Removed {
                blk: b,
                off,
                ino,
                dtype,
                name,
                ..
            }) if *b == blk && put_back.keeps(*dtype) => Some((*off, *ino, *dtype, &name[..])),
            _ => None,
        })
        .collect();
    let mut ents: Vec<EntryRollback> = ids
        .iter()
        .filter_map(|id| match d.recs.get(id).map(|r| &r.what) {
            Some(What::Entry {
                blk: b,
                off,
                old,
                target,
                applied: false,
                ..
            }) if *b == blk => Some((*off, *old, *target)),
            _ => None,
        })
        .collect();
    // Highest offset first: an entry merged into its predecessor may itself be merged into
    // its own predecessor next.
    ents.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (off, old, target) in ents {
        let o = off as usize;
        if o + 8 > image.len() {
            return Err(bad(format!("entry rollback at {off} outside block {blk}")));
        }
        let cur = u32::from_le_bytes([image[o], image[o + 1], image[o + 2], image[o + 3]]);
        if cur as u64 != target {
            return Err(bad(format!(
                "block {blk}: entry at {off} names {cur}, its record {target}"
            )));
        }
        match old {
            None => dir::remove(image, o).map_err(|e| bad(e.0))?,
            Some((ino, dtype)) => dir::set_ino(image, o, ino as u64, dtype),
        }
        out.written.rolled_offs.push(off);
        out.count += 1;
    }
    removed.sort_by_key(|r| r.0);
    for (off, ino, dtype, name) in removed {
        put_entry_back(image, off as usize, ino, dtype, name)
            .map_err(|m| bad(format!("block {blk}: removed entry at {off}: {m}")))?;
        out.written.restored_offs.push(off);
        out.count += 1;
    }
    Ok(out)
}

/// Writes a removed entry back at `off` of directory block image `b`, into the free bytes
/// it was merged into (the slack of the record now covering it, or the unused first record
/// of its chunk). Entries never move in this format, and an entry added over those bytes
/// waits for the removal to be on disk (so is rolled back here), so they are free.
pub(crate) fn put_entry_back(
    b: &mut [u8],
    off: usize,
    ino: Ino,
    dtype: u8,
    name: &[u8],
) -> Result<(), String> {
    let s = off / dir::DIR_CHUNK * dir::DIR_CHUNK;
    let need = dir::rec_size(name.len());
    let chunk = b.get(s..s + dir::DIR_CHUNK).ok_or("outside the block")?;
    let mut cover = None;
    for r in dir::records(chunk) {
        let e = r.map_err(|e| e.0)?;
        let eo = s + e.off;
        if eo <= off && off < eo + e.reclen {
            cover = Some((eo, e.ino, e.reclen, e.name.len()));
            break;
        }
    }
    let (eo, eino, reclen, namelen) = cover.ok_or("no record covers it")?;
    let end = eo + reclen;
    if off + need > end {
        return Err(format!("only {} free bytes there", end - off));
    }
    let put = |b: &mut [u8], at: usize, reclen: usize| {
        b[at..at + 4].copy_from_slice(&(ino as u32).to_le_bytes());
        b[at + 4..at + 6].copy_from_slice(&(reclen as u16).to_le_bytes());
        b[at + 6] = dtype;
        b[at + 7] = name.len() as u8;
        b[at + 8..at + 8 + name.len()].copy_from_slice(name);
    };
    if eo == off {
        if eino != 0 {
            return Err(format!("entry {eino} lies there"));
        }
        put(b, off, reclen);
        return Ok(());
    }
    let used = if eino == 0 { 8 } else { dir::rec_size(namelen) };
    if off < eo + used {
        return Err(format!("entry {eino} at {eo} reaches over it"));
    }
    b[eo + 4..eo + 6].copy_from_slice(&((off - eo) as u16).to_le_bytes());
    put(b, off, end - off);
    Ok(())
}

fn bad(m: String) -> std::io::Error {
    std::io::Error::other(format!("soft updates: {m}"))
}

/// The first logical block the subtree under an indirect pointer maps (for the size cut).
pub(crate) fn tree_base(geo: &Geometry, level: u8) -> u64 {
    let ppb = (geo.block_size / 8) as u64;
    let nd = crate::format::NDIRECT as u64;
    match level {
        1 => nd,
        2 => nd + ppb,
        _ => nd + ppb + ppb * ppb,
    }
}

fn inode_block(
    d: &Deps,
    geo: &Geometry,
    blk: Blk,
    ids: &[u64],
    image: &mut [u8],
    out: &mut Rolled,
) -> std::io::Result<Rolled> {
    // Records per inode of this block.
    let mut per: BTreeMap<Ino, Vec<&What>> = BTreeMap::new();
    for id in ids {
        let Some(r) = d.recs.get(id) else { continue };
        let ino = match &r.what {
            What::InoMap { ino, iblk } if *iblk == blk => *ino,
            What::Size { ino, iblk, .. } | What::Mode { ino, iblk, .. } if *iblk == blk => *ino,
            What::Alloc { ino, at, .. } => match at {
                PtrAt::Inode { iblk, .. } | PtrAt::Indir { iblk, .. } if *iblk == blk => *ino,
                _ => continue,
            },
            _ => continue,
        };
        per.entry(ino).or_default().push(&r.what);
    }
    let bs = geo.block_size as u64;
    for (ino, whats) in per {
        let (b, off) = geo.inode_location(ino);
        if b != blk || off + INODE_SIZE > image.len() {
            continue;
        }
        let slot = &mut image[off..off + INODE_SIZE];
        let Ok(mut di) = DiskInode::decode(ino, slot) else {
            return Err(bad(format!("inode {ino} undecodable in its own buffer")));
        };
        let before = di.clone();
        // A new directory without its first block, or a slow symlink without its target
        // block, is no valid inode (fsck: a directory's size ends at its last block): until
        // that block is safe the inode is written as the free one it was. Nothing names it
        // before (its entries wait for it whole).
        let first_pending = whats.iter().any(|w| {
            matches!(
                w,
                What::Alloc {
                    cut: Some(0),
                    applied: false,
                    at: PtrAt::Inode { .. },
                    ..
                }
            )
        });
        let free = whats.iter().any(|w| matches!(w, What::InoMap { .. }))
            || ((di.is_symlink() || di.is_dir()) && first_pending);
        if free {
            // Not yet allowed on disk: written as the free inode it was.
            di = DiskInode {
                generation: di.generation,
                ..Default::default()
            };
        } else if di.fast_link.is_none() {
            let mut cut: Option<u64> = None;
            for w in &whats {
                let What::Alloc {
                    at,
                    cut: c,
                    old_blk,
                    blocks_back,
                    applied,
                    ..
                } = w
                else {
                    continue;
                };
                if let PtrAt::Inode { ptr, .. } = at
                    && !applied
                {
                    match *ptr {
                        InodePtr::Direct(i) => di.direct[i as usize] = *old_blk,
                        InodePtr::Indirect(l) => {
                            di.indirect[(l as usize).saturating_sub(1)] = *old_blk
                        }
                        InodePtr::Xattr => {
                            // The count goes back with the list it counts: a shorter
                            // chain's count beside the longer old chain would be damage.
                            di.xattr = *old_blk;
                            di.blocks = di.blocks.saturating_add_signed(*blocks_back);
                        }
                    }
                }
                if let Some(c) = c {
                    cut = Some(cut.map_or(*c, |x: u64| x.min(*c)));
                }
            }
            for w in &whats {
                if let What::Size { safe, .. } = w
                    && di.is_reg()
                    && di.size > *safe
                {
                    di.size = *safe;
                }
                // The mode goes back with the xattr pointer (one `Mode` record per inode).
                if let What::Mode { safe, .. } = w {
                    di.mode = *safe;
                }
            }
            if let Some(c) = cut
                && (di.is_reg() || di.is_dir())
            {
                let safe = c.saturating_mul(bs);
                if di.size > safe {
                    di.size = safe;
                }
                if di.is_dir() {
                    // A directory's size must end at its last block: pointers past the cut
                    // go too (their blocks leak until fsck, never a hole in a directory).
                    for (i, p) in di.direct.iter_mut().enumerate() {
                        if i as u64 >= c {
                            *p = 0;
                        }
                    }
                    for l in 1..=3u8 {
                        if tree_base(geo, l) >= c {
                            di.indirect[l as usize - 1] = 0;
                        }
                    }
                }
            }
        }
        if di != before {
            di.encode(ino, slot);
            out.written.rolled_inodes.push(ino);
            out.count += 1;
        }
    }
    Ok(std::mem::take(out))
}

/// The logical block from which an allocation's pointer, while unsafe, must not be
/// covered by the inode's size (`None`: it does not bear on the size).
pub(crate) fn cut_of(
    geo: &Geometry,
    kind: BlockKind,
    ptr: Option<InodePtr>,
    lbn: u64,
) -> Option<u64> {
    match (kind, ptr) {
        (BlockKind::Xattr, _) | (_, Some(InodePtr::Xattr)) => None,
        (BlockKind::Indirect, Some(InodePtr::Indirect(l))) => Some(tree_base(geo, l)),
        // An indirect block below the root: its subtree starts at or after its tree's
        // base; the tree's base is the safe (smaller) cut.
        (BlockKind::Indirect, _) => Some(
            (1..=3u8)
                .rev()
                .map(|l| tree_base(geo, l))
                .find(|b| *b <= lbn)
                .unwrap_or(lbn),
        ),
        _ => Some(lbn),
    }
}
