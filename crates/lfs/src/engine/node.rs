//! An inode in memory ([`Node`]): the inode, its block map once loaded, the addresses of its
//! indirect blocks by slot and which of them the next flush rewrites, its extended
//! attributes, its opens and its read-ahead window; with the codecs of the indirect and
//! xattr blocks.
//!
//! Invariants of a node:
//! - `map` (once loaded) is the file's logical block -> log address, and `inode.direct`
//!   holds its first NDIRECT entries; `inode.blocks` counts the mapped blocks plus the
//!   indirect and xattr blocks written;
//! - every slot whose block no longer matches `map` (and every slot above it) is in
//!   `dirty_slots` until the next flush rewrites it, children before parents;
//! - `xattr_dirty` is set while `xattrs` differs from the block at `inode.xattr`.

use std::collections::{BTreeMap, BTreeSet};

use cairn_vfs::Result;

use super::corrupt;
use crate::format::inode::{Inode, NDIRECT, PTRS};
use crate::format::{BLOCK_SIZE, get_u64};

/// Sequential-access detection and the read-ahead window of one inode (as FFS's cluster
/// read-ahead and Linux's on-demand read-ahead do it). A read that starts where the last
/// one ended is sequential: the window doubles (from twice the request, up to the mount's
/// maximum) and, once the reader has used up half of what was read ahead, the next window
/// is read. Any other read resets it, so random reads cost one block each and read nothing
/// they did not ask for. A file written sequentially lies in one run of the log per
/// partial segment, so a window is a few large device reads.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReadAhead {
    /// The block after the last read's end (0 before any read: a read from the start of
    /// the file counts as sequential).
    next: u64,
    /// Current window in blocks (0: not sequential).
    window: u64,
    /// First block not yet read ahead.
    end: u64,
}

impl ReadAhead {
    /// Notes a read of blocks `first..first + n`; returns the blocks to read ahead
    /// (`start, count`), if any.
    pub fn plan(&mut self, first: u64, n: u64, max: u64) -> Option<(u64, u64)> {
        let seq = first == self.next;
        let done = first.saturating_add(n);
        self.next = done;
        if !seq || max == 0 || n == 0 {
            self.window = 0;
            self.end = 0;
            return None;
        }
        self.window = if self.window == 0 {
            n.saturating_mul(2).max(8)
        } else {
            self.window.saturating_mul(2)
        }
        .min(max);
        let from = self.end.max(done);
        // Still half a window ahead of the reader: the next window waits, so each device
        // read is a large one rather than one request's worth past the last window.
        if from >= done.saturating_add(self.window / 2) {
            return None;
        }
        let to = done.saturating_add(self.window);
        self.end = to;
        Some((from, to - from))
    }
}

/// An inode in memory.
pub(crate) struct Node {
    pub inode: Inode,
    /// The block map, once loaded: logical block -> address.
    pub map: Option<BTreeMap<u64, u64>>,
    /// Addresses of the indirect blocks by slot (0 single, 1 double, 2+i children).
    pub ind: BTreeMap<u64, u64>,
    /// Slots whose indirect block must be rewritten at the next flush.
    pub dirty_slots: BTreeSet<u64>,
    pub xattrs: Option<BTreeMap<Vec<u8>, Vec<u8>>>,
    pub xattr_dirty: bool,
    pub opens: u32,
    pub ra: ReadAhead,
    /// Made by O_TMPFILE without O_EXCL and not linked since (Linux's `I_LINKABLE`): the
    /// one inode with no link that `link` may name. Kept in memory only: after a crash the
    /// inode is an orphan, which the next read-write mount frees.
    pub linkable: bool,
}

impl Node {
    /// Log blocks the next flush writes for this node's attributes (0 unless changed).
    pub fn xattr_log_blocks(&self) -> u64 {
        match (&self.xattrs, self.xattr_dirty) {
            (Some(x), true) => xattr_blocks_needed(x).unwrap_or(XATTR_CHAIN_MAX) as u64,
            _ => 0,
        }
    }

    /// A node whose every part is in memory (a new inode: nothing to load).
    pub fn fresh(inode: Inode) -> Node {
        Node {
            inode,
            map: Some(BTreeMap::new()),
            ind: BTreeMap::new(),
            dirty_slots: BTreeSet::new(),
            xattrs: Some(BTreeMap::new()),
            xattr_dirty: false,
            opens: 0,
            ra: ReadAhead::default(),
            linkable: false,
        }
    }
}

// Indirect blocks are named by *slots* (the summary's `lbn` for an indirect block):
//   0                      the single indirect block       (leaf: blocks 12..524)
//   1                      the double indirect block       (names slots 2..514)
//   2 + i                  its i-th child                  (leaf)
//   T_TOP                  the triple indirect block       (names T_MID + j)
//   T_MID + j              its j-th child                  (names T_LEAF + 512j ..)
//   T_LEAF + k             the k-th leaf under it          (leaf)
pub(crate) const T_TOP: u64 = 1 << 40;
const T_MID: u64 = T_TOP + 1;
const T_LEAF: u64 = 1 << 41;
pub(crate) const D_FIRST: u64 = NDIRECT as u64 + PTRS;
const T_FIRST: u64 = D_FIRST + PTRS * PTRS;

/// The leaf slot holding logical block `lbn`'s address (None for a direct block).
pub(crate) fn slot_of(lbn: u64) -> Option<u64> {
    if lbn < NDIRECT as u64 {
        None
    } else if lbn < D_FIRST {
        Some(0)
    } else if lbn < T_FIRST {
        Some(2 + (lbn - D_FIRST) / PTRS)
    } else {
        Some(T_LEAF + (lbn - T_FIRST) / PTRS)
    }
}

/// The slot whose block names slot `s`, if any (the inode names the roots).
pub(crate) fn slot_parent(s: u64) -> Option<u64> {
    if (2..2 + PTRS).contains(&s) {
        Some(1)
    } else if (T_MID..T_MID + PTRS).contains(&s) {
        Some(T_TOP)
    } else if s >= T_LEAF {
        Some(T_MID + (s - T_LEAF) / PTRS)
    } else {
        None
    }
}

/// Height above the leaves: leaves 0, the double block and triple's children 1, triple 2.
pub(crate) fn slot_level(s: u64) -> u8 {
    match s {
        1 => 1,
        T_TOP => 2,
        _ if (T_MID..T_MID + PTRS).contains(&s) => 1,
        _ => 0,
    }
}

/// For a leaf, the logical blocks it maps; for an inner slot, the child slots it names.
pub(crate) fn slot_range(s: u64) -> (u64, u64) {
    let (first, i) = match s {
        0 => (NDIRECT as u64, 0),
        1 => return (2, 2 + PTRS),
        T_TOP => return (T_MID, T_MID + PTRS),
        _ if (T_MID..T_MID + PTRS).contains(&s) => {
            let j = s - T_MID;
            return (T_LEAF + j * PTRS, T_LEAF + (j + 1) * PTRS);
        }
        _ if s >= T_LEAF => (T_FIRST, s - T_LEAF),
        _ => (D_FIRST, s - 2),
    };
    (first + i * PTRS, first + (i + 1) * PTRS)
}

/// Loads an inode's block map from its direct pointers and indirect blocks.
#[allow(clippy::type_complexity)]
pub(crate) fn load_map(
    inode: &Inode,
    mut read: impl FnMut(u64) -> Result<Vec<u8>>,
) -> Result<(BTreeMap<u64, u64>, BTreeMap<u64, u64>)> {
    let mut map = BTreeMap::new();
    let mut ind = BTreeMap::new();
    for (i, &a) in inode.direct.iter().enumerate() {
        if a != 0 {
            map.insert(i as u64, a);
        }
    }
    // Depth-first from each root the inode names: (slot, address).
    let roots = [
        (0, inode.indirect),
        (1, inode.dindirect),
        (T_TOP, inode.tindirect),
    ];
    let mut stack: Vec<(u64, u64)> = roots.into_iter().filter(|&(_, a)| a != 0).collect();
    while let Some((s, a)) = stack.pop() {
        ind.insert(s, a);
        let b = read(a)?;
        let (lo, _) = slot_range(s);
        for i in 0..PTRS {
            let p = get_u64(&b, (i * 8) as usize);
            if p == 0 {
                continue;
            }
            if slot_level(s) == 0 {
                map.insert(lo + i, p);
            } else {
                stack.push((lo + i, p));
            }
        }
    }
    Ok((map, ind))
}

/// Every log block an inode owns: data, indirect and xattr blocks.
pub(crate) fn owned_blocks(
    inode: &Inode,
    mut read: impl FnMut(u64) -> Result<Vec<u8>>,
) -> Result<Vec<u64>> {
    let (map, ind) = load_map(inode, &mut read)?;
    let mut v: Vec<u64> = map.into_values().chain(ind.into_values()).collect();
    if inode.xattr != 0 {
        v.extend(read_xattr_chain(inode.xattr, read)?.1);
    }
    Ok(v)
}

/// First two bytes of a block of an xattr chain: a count no single block can have (an
/// attribute takes at least 4 bytes of a 4 KiB block).
const CHAIN_MARK: u16 = 0xffff;
/// Header of a chain block: mark u16, index u16, used u32 (payload bytes), next u64.
const CHAIN_HDR: usize = 16;
/// Most blocks an inode's xattr chain may have (ffs's bound: fstests' 1000 attributes, or a
/// 64 KiB value beside the rest).
pub(crate) const XATTR_CHAIN_MAX: usize = 32;
/// Stream header: count u32, length u32.
const STREAM_HDR: usize = 8;

fn stream_size(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
    STREAM_HDR + x.iter().map(|(k, v)| 5 + k.len() + v.len()).sum::<usize>()
}

/// Does the list fit one block of the single-block form (every value under 64 KiB too)?
fn fits_single(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> bool {
    xattrs_size(x) <= BLOCK_SIZE && x.values().all(|v| v.len() <= u16::MAX as usize)
}

/// Log blocks the list takes: 0 when empty, 1 for a single block, more for a chain; `None`
/// when a chain of [`XATTR_CHAIN_MAX`] blocks cannot hold it.
pub(crate) fn xattr_blocks_needed(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Option<usize> {
    if x.is_empty() {
        return Some(0);
    }
    if fits_single(x) {
        return Some(1);
    }
    let n = stream_size(x).div_ceil(BLOCK_SIZE - CHAIN_HDR);
    (n <= XATTR_CHAIN_MAX).then_some(n)
}

/// The list's blocks, the head first: one single block, or the blocks of a chain with their
/// `next` still 0 (the log writes the last first and sets each predecessor's with
/// [`set_chain_next`]). Empty when the list is, or when it does not fit.
pub(crate) fn encode_xattr_blocks(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<Vec<u8>> {
    match xattr_blocks_needed(x) {
        Some(0) | None => Vec::new(),
        Some(1) => vec![encode_xattrs(x)],
        Some(_) => {
            let mut s = Vec::with_capacity(stream_size(x));
            s.extend_from_slice(&(x.len() as u32).to_le_bytes());
            s.extend_from_slice(&(stream_size(x) as u32).to_le_bytes());
            for (k, v) in x {
                s.push(k.len() as u8);
                s.extend_from_slice(&(v.len() as u32).to_le_bytes());
                s.extend_from_slice(k);
                s.extend_from_slice(v);
            }
            s.chunks(BLOCK_SIZE - CHAIN_HDR)
                .enumerate()
                .map(|(i, piece)| {
                    let mut b = vec![0u8; BLOCK_SIZE];
                    b[0..2].copy_from_slice(&CHAIN_MARK.to_le_bytes());
                    b[2..4].copy_from_slice(&(i as u16).to_le_bytes());
                    b[4..8].copy_from_slice(&(piece.len() as u32).to_le_bytes());
                    b[CHAIN_HDR..CHAIN_HDR + piece.len()].copy_from_slice(piece);
                    b
                })
                .collect()
        }
    }
}

/// Sets a chain block's `next` (the log address of the block after it).
pub(crate) fn set_chain_next(b: &mut [u8], next: u64) {
    b[8..16].copy_from_slice(&next.to_le_bytes());
}

/// An inode's attributes, and the log blocks holding them (the head first).
pub(crate) type XattrChain = (BTreeMap<Vec<u8>, Vec<u8>>, Vec<u64>);

/// An inode's attributes and the log blocks holding them, from its xattr block `head` (a
/// single block or a chain's head). Bounded: at most [`XATTR_CHAIN_MAX`] blocks, none twice.
pub(crate) fn read_xattr_chain(
    head: u64,
    mut read: impl FnMut(u64) -> Result<Vec<u8>>,
) -> Result<XattrChain> {
    let first = read(head)?;
    if first.len() < 2 || u16::from_le_bytes([first[0], first[1]]) != CHAIN_MARK {
        return Ok((decode_xattrs(&first)?, vec![head]));
    }
    let mut blocks = vec![head];
    let mut stream = Vec::new();
    let mut b = first;
    loop {
        let index = blocks.len() - 1;
        if b.len() < CHAIN_HDR
            || u16::from_le_bytes([b[0], b[1]]) != CHAIN_MARK
            || u16::from_le_bytes([b[2], b[3]]) as usize != index
        {
            return Err(corrupt(format!("xattr chain block {index}: bad header")));
        }
        let used = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
        let piece = b
            .get(CHAIN_HDR..CHAIN_HDR.saturating_add(used))
            .ok_or_else(|| corrupt(format!("xattr chain block {index}: bad length")))?;
        stream.extend_from_slice(piece);
        let next = get_u64(&b, 8);
        if next == 0 {
            break;
        }
        if blocks.contains(&next) || blocks.len() == XATTR_CHAIN_MAX {
            return Err(corrupt("xattr chain: a cycle, or longer than its bound"));
        }
        blocks.push(next);
        b = read(next)?;
    }
    Ok((decode_stream(&stream)?, blocks))
}

fn decode_stream(s: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let bad = || corrupt("xattr chain: stream out of bounds");
    let word = |o: usize| -> Result<usize> {
        let w = s.get(o..o + 4).ok_or_else(bad)?;
        Ok(u32::from_le_bytes(w.try_into().expect("4 bytes")) as usize)
    };
    let (count, len) = (word(0)?, word(4)?);
    if len != s.len() {
        return Err(corrupt(format!(
            "xattr chain: {} bytes where its head says {len}",
            s.len()
        )));
    }
    let mut x = BTreeMap::new();
    let mut o = STREAM_HDR;
    for _ in 0..count {
        let kl = *s.get(o).ok_or_else(bad)? as usize;
        let vl = word(o + 1)?;
        let k = s.get(o + 5..o + 5 + kl).ok_or_else(bad)?;
        let end = (o + 5 + kl).checked_add(vl).ok_or_else(bad)?;
        let v = s.get(o + 5 + kl..end).ok_or_else(bad)?;
        x.insert(k.to_vec(), v.to_vec());
        o = end;
    }
    Ok(x)
}

/// Extended attributes of one inode in one block: `count u16`, then per attribute
/// `namelen u8, vallen u16, name, value`.
pub(crate) fn encode_xattrs(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    b[0..2].copy_from_slice(&(x.len() as u16).to_le_bytes());
    let mut o = 2;
    for (k, v) in x {
        b[o] = k.len() as u8;
        b[o + 1..o + 3].copy_from_slice(&(v.len() as u16).to_le_bytes());
        b[o + 3..o + 3 + k.len()].copy_from_slice(k);
        b[o + 3 + k.len()..o + 3 + k.len() + v.len()].copy_from_slice(v);
        o += 3 + k.len() + v.len();
    }
    b
}

pub(crate) fn xattrs_size(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> usize {
    2 + x.iter().map(|(k, v)| 3 + k.len() + v.len()).sum::<usize>()
}

pub(crate) fn decode_xattrs(b: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let bad = || corrupt("xattr block out of bounds");
    let n = u16::from_le_bytes([*b.first().ok_or_else(bad)?, *b.get(1).ok_or_else(bad)?]);
    let mut x = BTreeMap::new();
    let mut o = 2usize;
    for _ in 0..n {
        let hdr = b.get(o..o + 3).ok_or_else(bad)?;
        let (kl, vl) = (
            hdr[0] as usize,
            u16::from_le_bytes([hdr[1], hdr[2]]) as usize,
        );
        let k = b.get(o + 3..o + 3 + kl).ok_or_else(bad)?;
        let v = b.get(o + 3 + kl..o + 3 + kl + vl).ok_or_else(bad)?;
        x.insert(k.to_vec(), v.to_vec());
        o += 3 + kl + vl;
    }
    Ok(x)
}

#[cfg(test)]
mod xattr_chain_tests {
    use super::*;

    fn many(n: usize) -> BTreeMap<Vec<u8>, Vec<u8>> {
        (0..n)
            .map(|i| {
                (
                    format!("user.attribute_{i}").into_bytes(),
                    format!("value_{i}").into_bytes(),
                )
            })
            .collect()
    }

    /// The blocks of `x` as the flush links them, at addresses 100, 101, ...
    fn linked(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<Vec<u8>> {
        let mut blocks = encode_xattr_blocks(x);
        let n = blocks.len();
        for (i, b) in blocks.iter_mut().enumerate() {
            if i + 1 < n {
                set_chain_next(b, 101 + i as u64);
            }
        }
        blocks
    }

    fn read(blocks: &[Vec<u8>]) -> Result<XattrChain> {
        read_xattr_chain(100, |a| {
            blocks
                .get((a - 100) as usize)
                .cloned()
                .ok_or_else(|| corrupt("no such block"))
        })
    }

    /// What: a small list stays one single block (the old form, byte for byte); 1000
    /// attributes and a 64 KiB value make chains that read back equal; damage (a cycle, a
    /// wrong position, a cut chain) and a list past the bound are refused.
    #[test]
    fn chain_roundtrip_and_damage() {
        let small = many(3);
        assert_eq!(encode_xattr_blocks(&small), vec![encode_xattrs(&small)]);
        let mut long = BTreeMap::new();
        long.insert(b"user.snrub".to_vec(), b"fish2\n".to_vec());
        long.insert(b"user.long_attr".to_vec(), vec![0u8; 65536]);
        for x in [many(1000), long] {
            let blocks = linked(&x);
            assert!(blocks.len() > 1 && blocks.len() <= XATTR_CHAIN_MAX);
            let (y, addrs) = read(&blocks).unwrap();
            assert_eq!(y, x);
            assert_eq!(addrs, (100..100 + blocks.len() as u64).collect::<Vec<_>>());
            // A cycle: the last block names the first again.
            let mut cyc = blocks.clone();
            let last = cyc.len() - 1;
            set_chain_next(&mut cyc[last], 100);
            assert!(read(&cyc).is_err());
            // Two blocks swapped: their positions disagree.
            let mut sw = blocks.clone();
            sw.swap(1, 2);
            assert!(read(&sw).is_err());
            // Cut after the head: the stream is shorter than it says.
            let mut cut = blocks.clone();
            set_chain_next(&mut cut[0], 0);
            assert!(read(&cut).is_err());
        }
        assert_eq!(xattr_blocks_needed(&many(5000)), None);
        assert!(encode_xattr_blocks(&many(5000)).is_empty());
    }
}
