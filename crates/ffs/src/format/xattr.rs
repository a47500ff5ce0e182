//! Extended-attribute blocks. An inode's attributes are one list, stored in one of two forms:
//!
//! A single block (`"CXAT"`), when the list fits one block (the form of every image older
//! than `FEATURE_INCOMPAT_XATTR_CHAIN`):
//!
//!   0  magic "CXAT"  [u8; 4]
//!   4  count         u32
//!   8  used bytes    u32 (header included)
//!   12 crc32c of bytes 16..used  u32
//!   16 entries: name_len u16, reserved u16, value_len u32, name, value, padded to 4 bytes
//!
//! A chain (`"CXA2"`, with `FEATURE_INCOMPAT_XATTR_CHAIN`), when it does not: the list is one
//! byte stream cut into the payloads of up to [`CHAIN_MAX`] blocks, each naming the next:
//!
//!   0  magic "CXA2"  [u8; 4]
//!   4  used bytes    u32 (header included, ≥ 32)
//!   8  next          u64 (the next block of the chain; 0 = the last)
//!   16 owner inode   u64
//!   24 index         u32 (position in the chain, the head 0)
//!   28 crc32c of (bytes 0..28 ‖ bytes 32..used)  u32
//!   32 payload: this block's piece of the stream
//!
//!   stream: count u32, length u32 (bytes of the whole stream), then the entries as above.
//!
//! An entry may cross a block boundary: one value may be as large as the kernel allows
//! (64 KiB), more than a block holds.

use super::*;

pub const XATTR_MAGIC: [u8; 4] = *b"CXAT";
const HDR: usize = 16;

/// Magic of a block of a chain.
pub const CHAIN_MAGIC: [u8; 4] = *b"CXA2";
/// Header bytes of a chain block.
pub const CHAIN_HDR: usize = 32;
/// Most blocks one inode's attribute chain may have: room, with 4 KiB blocks, for the
/// kernel's largest value (64 KiB) beside the rest of a list (fstests assumes 1000
/// attributes of a FUSE file system).
pub const CHAIN_MAX: usize = 32;
/// Bytes before the stream's first entry: count, length.
const STREAM_HDR: usize = 8;

fn entry_size(name: usize, value: usize) -> usize {
    (8 + name + value).div_ceil(4) * 4
}

fn entries_size(attrs: &[(Vec<u8>, Vec<u8>)]) -> usize {
    attrs
        .iter()
        .map(|(n, v)| entry_size(n.len(), v.len()))
        .sum::<usize>()
}

/// Bytes a single block needs to hold these attributes.
pub fn encoded_size(attrs: &[(Vec<u8>, Vec<u8>)]) -> usize {
    HDR + entries_size(attrs)
}

/// Writes the entries into `b` (long enough) from offset `off`; returns the end.
fn put_entries(attrs: &[(Vec<u8>, Vec<u8>)], b: &mut [u8], mut off: usize) -> usize {
    for (n, v) in attrs {
        put_u16(b, off, n.len() as u16);
        put_u32(b, off + 4, v.len() as u32);
        b[off + 8..off + 8 + n.len()].copy_from_slice(n);
        b[off + 8 + n.len()..off + 8 + n.len() + v.len()].copy_from_slice(v);
        off += entry_size(n.len(), v.len());
    }
    off
}

/// Reads `count` entries of `b[off..end]`; `what` names the form in messages.
fn get_entries(
    b: &[u8],
    mut off: usize,
    end: usize,
    count: usize,
    what: &str,
) -> FResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for _ in 0..count {
        if off + 8 > end {
            return corrupt(format!("{what}: entry out of bounds"));
        }
        let nl = get_u16(b, off) as usize;
        let vl = get_u32(b, off + 4) as usize;
        let Some(next) = off.checked_add(entry_size(nl, vl)).filter(|&e| e <= end) else {
            return corrupt(format!("{what}: bad entry"));
        };
        if nl == 0 || nl > MAX_NAME {
            return corrupt(format!("{what}: bad entry"));
        }
        out.push((
            b[off + 8..off + 8 + nl].to_vec(),
            b[off + 8 + nl..off + 8 + nl + vl].to_vec(),
        ));
        off = next;
    }
    Ok(out)
}

/// Encodes a single block; the caller checks [`encoded_size`] fits first (returns false if
/// not).
pub fn encode(attrs: &[(Vec<u8>, Vec<u8>)], b: &mut [u8]) -> bool {
    if encoded_size(attrs) > b.len() {
        return false;
    }
    b.fill(0);
    b[0..4].copy_from_slice(&XATTR_MAGIC);
    put_u32(b, 4, attrs.len() as u32);
    let off = put_entries(attrs, b, HDR);
    put_u32(b, 8, off as u32);
    let c = crc(&b[HDR..off]);
    put_u32(b, 12, c);
    true
}

/// Decodes a single block.
pub fn decode(b: &[u8]) -> FResult<Vec<(Vec<u8>, Vec<u8>)>> {
    if b.len() < HDR || b[0..4] != XATTR_MAGIC {
        return corrupt("extended-attribute block: bad magic");
    }
    let count = get_u32(b, 4) as usize;
    let used = get_u32(b, 8) as usize;
    if used < HDR || used > b.len() {
        return corrupt("extended-attribute block: bad length");
    }
    if crc(&b[HDR..used]) != get_u32(b, 12) {
        return corrupt("extended-attribute block: checksum mismatch");
    }
    get_entries(b, HDR, used, count, "extended-attribute block")
}

/// The blocks inode attributes `attrs` need in block size `bs`: 1 (a single block, or
/// none when empty), more (a chain), or `None` when even [`CHAIN_MAX`] blocks cannot hold
/// them.
pub fn blocks_needed(attrs: &[(Vec<u8>, Vec<u8>)], bs: usize) -> Option<usize> {
    if encoded_size(attrs) <= bs {
        return Some(1);
    }
    let n = (STREAM_HDR + entries_size(attrs)).div_ceil(bs - CHAIN_HDR);
    (n <= CHAIN_MAX).then_some(n)
}

/// Encodes `attrs` of inode `ino` as the chain of blocks `blks` (in order; `blks.len()` ≥
/// [`blocks_needed`]; blocks past what the stream needs carry an empty payload): one image
/// of `bs` bytes per block. One block whose list fits is a single block. `None` when they
/// do not fit.
pub fn encode_chain(
    attrs: &[(Vec<u8>, Vec<u8>)],
    ino: u64,
    blks: &[u64],
    bs: usize,
) -> Option<Vec<Vec<u8>>> {
    if blks.len() == 1 {
        let mut b = vec![0u8; bs];
        return encode(attrs, &mut b).then_some(vec![b]);
    }
    let len = STREAM_HDR + entries_size(attrs);
    let room = bs - CHAIN_HDR;
    if blks.is_empty() || blks.len() > CHAIN_MAX || len > room * blks.len() {
        return None;
    }
    let mut stream = vec![0u8; len];
    put_u32(&mut stream, 0, attrs.len() as u32);
    put_u32(&mut stream, 4, len as u32);
    put_entries(attrs, &mut stream, STREAM_HDR);
    let mut pieces = stream.chunks(room);
    let images = blks
        .iter()
        .enumerate()
        .map(|(i, _)| {
            let piece = pieces.next().unwrap_or(&[]);
            let next = blks.get(i + 1).copied().unwrap_or(0);
            chain_block(ino, i as u32, next, piece, bs)
        })
        .collect();
    Some(images)
}

/// One chain block's image.
fn chain_block(ino: u64, index: u32, next: u64, piece: &[u8], bs: usize) -> Vec<u8> {
    let mut b = vec![0u8; bs];
    let used = CHAIN_HDR + piece.len();
    b[0..4].copy_from_slice(&CHAIN_MAGIC);
    put_u32(&mut b, 4, used as u32);
    put_u64(&mut b, 8, next);
    put_u64(&mut b, 16, ino);
    put_u32(&mut b, 24, index);
    b[CHAIN_HDR..used].copy_from_slice(piece);
    let c = chain_crc(&b, used);
    put_u32(&mut b, 28, c);
    b
}

fn chain_crc(b: &[u8], used: usize) -> u32 {
    let mut h = crc32c::crc32c(&b[0..28]);
    h = crc32c::crc32c_append(h, &b[CHAIN_HDR..used]);
    h
}

/// A chain block's checked header: the next block and this block's piece of the stream.
pub struct Link<'a> {
    pub next: u64,
    pub piece: &'a [u8],
}

/// Decodes block `index` of inode `ino`'s chain.
pub fn decode_link(b: &[u8], ino: u64, index: u32) -> FResult<Link<'_>> {
    if b.len() < CHAIN_HDR || b[0..4] != CHAIN_MAGIC {
        return corrupt(format!("extended-attribute chain block {index}: bad magic"));
    }
    let used = get_u32(b, 4) as usize;
    if used < CHAIN_HDR || used > b.len() {
        return corrupt(format!(
            "extended-attribute chain block {index}: bad length"
        ));
    }
    if chain_crc(b, used) != get_u32(b, 28) {
        return corrupt(format!(
            "extended-attribute chain block {index}: checksum mismatch"
        ));
    }
    if get_u64(b, 16) != ino || get_u32(b, 24) != index {
        return corrupt(format!(
            "extended-attribute chain block {index}: belongs to inode {} at position {}",
            get_u64(b, 16),
            get_u32(b, 24)
        ));
    }
    Ok(Link {
        next: get_u64(b, 8),
        piece: &b[CHAIN_HDR..used],
    })
}

/// Is `b` the head of a chain (else a single block, or damage)?
pub fn is_chain(b: &[u8]) -> bool {
    b.len() >= 4 && b[0..4] == CHAIN_MAGIC
}

/// An inode's attribute list read from its blocks.
pub struct Chain {
    pub attrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Every block of the list, the head first.
    pub blocks: Vec<u64>,
}

/// Reads inode `ino`'s attributes from block `head` on, with `read` fetching a block (and
/// refusing one that cannot hold attributes). Bounded: at most [`CHAIN_MAX`] blocks, no
/// block twice (a cycle).
pub fn read_chain(
    ino: u64,
    head: u64,
    mut read: impl FnMut(u64) -> FResult<Vec<u8>>,
) -> FResult<Chain> {
    let first = read(head)?;
    if !is_chain(&first) {
        return Ok(Chain {
            attrs: decode(&first)?,
            blocks: vec![head],
        });
    }
    let mut blocks = vec![head];
    let mut stream = Vec::new();
    let mut b = first;
    loop {
        let index = blocks.len() as u32 - 1;
        let link = decode_link(&b, ino, index)?;
        stream.extend_from_slice(link.piece);
        let next = link.next;
        if next == 0 {
            break;
        }
        if blocks.contains(&next) {
            return corrupt(format!(
                "extended-attribute chain: block {next} comes twice (a cycle)"
            ));
        }
        if blocks.len() == CHAIN_MAX {
            return corrupt(format!(
                "extended-attribute chain: longer than {CHAIN_MAX} blocks"
            ));
        }
        blocks.push(next);
        b = read(next)?;
    }
    Ok(Chain {
        attrs: decode_stream(&stream)?,
        blocks,
    })
}

/// Decodes a chain's stream (its blocks' pieces, in order).
pub fn decode_stream(s: &[u8]) -> FResult<Vec<(Vec<u8>, Vec<u8>)>> {
    if s.len() < STREAM_HDR {
        return corrupt("extended-attribute chain: stream too short");
    }
    let count = get_u32(s, 0) as usize;
    let len = get_u32(s, 4) as usize;
    if len != s.len() {
        return corrupt(format!(
            "extended-attribute chain: {} bytes where its head says {len}",
            s.len()
        ));
    }
    get_entries(s, STREAM_HDR, len, count, "extended-attribute chain")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn many(n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..n)
            .map(|i| {
                (
                    format!("user.attribute_{i}").into_bytes(),
                    format!("value_{i}").into_bytes(),
                )
            })
            .collect()
    }

    /// A chain of images read back through `read_chain` from a map of blocks.
    fn read_images(ino: u64, blks: &[u64], images: &[Vec<u8>]) -> FResult<Chain> {
        read_chain(ino, blks[0], |b| {
            blks.iter()
                .position(|&x| x == b)
                .map(|i| images[i].clone())
                .ok_or_else(|| FormatError(format!("no block {b}")))
        })
    }

    #[test]
    fn roundtrip_and_corruption() {
        let attrs = vec![
            (b"user.a".to_vec(), b"1".to_vec()),
            (b"user.bb".to_vec(), vec![0u8; 300]),
        ];
        let mut b = vec![0u8; 4096];
        assert!(encode(&attrs, &mut b));
        assert_eq!(decode(&b).unwrap(), attrs);
        b[20] ^= 1;
        assert!(decode(&b).is_err());
        let big = vec![(b"user.x".to_vec(), vec![0u8; 5000])];
        assert!(!encode(&big, &mut b));
    }

    /// What: 1000 attributes (fstests generic/020's) and one 64 KiB value each make a chain
    /// that reads back equal, and a list that fits one block stays a single block.
    #[test]
    fn chain_roundtrip() {
        let bs = 4096;
        let small = many(3);
        assert_eq!(blocks_needed(&small, bs), Some(1));
        let one = encode_chain(&small, 7, &[100], bs).unwrap();
        assert!(!is_chain(&one[0]));
        assert_eq!(read_images(7, &[100], &one).unwrap().attrs, small);
        for attrs in [
            many(1000),
            vec![
                (b"user.snrub".to_vec(), b"fish2\n".to_vec()),
                (b"user.long_attr".to_vec(), vec![0u8; 65536]),
            ],
        ] {
            let n = blocks_needed(&attrs, bs).unwrap();
            assert!(n > 1 && n <= CHAIN_MAX, "{n}");
            let blks: Vec<u64> = (0..n as u64).map(|i| 500 - i * 3).collect();
            let images = encode_chain(&attrs, 7, &blks, bs).unwrap();
            assert!(encode_chain(&attrs, 7, &blks[..n - 1], bs).is_none());
            let c = read_images(7, &blks, &images).unwrap();
            assert_eq!(c.attrs, attrs);
            assert_eq!(c.blocks, blks);
            // Spare blocks carry empty pieces and still read back.
            let mut more = blks.clone();
            more.push(9);
            let images = encode_chain(&attrs, 7, &more, bs).unwrap();
            assert_eq!(read_images(7, &more, &images).unwrap().attrs, attrs);
        }
        assert_eq!(blocks_needed(&many(5000), bs), None);
    }

    /// What: every kind of damage to a chain is refused with a message: a flipped payload or
    /// header byte (checksum), a block of another inode or position, a cut chain, a cycle,
    /// a chain longer than the bound.
    #[test]
    fn chain_damage_is_found() {
        let bs = 4096;
        let attrs = many(400);
        let blks = [10, 20, 30, 40];
        let n = blocks_needed(&attrs, bs).unwrap();
        assert_eq!(n, blks.len());
        let good = encode_chain(&attrs, 7, &blks, bs).unwrap();
        let broken = |f: &dyn Fn(&mut Vec<Vec<u8>>)| {
            let mut im = good.clone();
            f(&mut im);
            read_images(7, &blks, &im).err().map(|e| e.0)
        };
        assert!(broken(&|_| {}).is_none());
        assert!(broken(&|im| im[1][100] ^= 1).unwrap().contains("checksum"));
        assert!(broken(&|im| im[2][8] ^= 1).unwrap().contains("checksum"));
        // Another inode's block, or the right inode's block at another position.
        assert!(read_images(8, &blks, &good).is_err());
        let swapped = [
            good[0].clone(),
            good[2].clone(),
            good[1].clone(),
            good[3].clone(),
        ];
        assert!(read_images(7, &blks, &swapped).is_err());
        // Cut after two blocks: the stream is shorter than its head says.
        let cut = encode_chain(&attrs, 7, &blks, bs).unwrap();
        let mut head2 = cut[1].clone();
        put_u64(&mut head2, 8, 0);
        let used = get_u32(&head2, 4) as usize;
        let c = chain_crc(&head2, used);
        put_u32(&mut head2, 28, c);
        let e = read_images(7, &blks, &[cut[0].clone(), head2])
            .err()
            .unwrap()
            .0;
        assert!(e.contains("where its head says"), "{e}");
        // A cycle: the last block names the first again.
        let mut im = good.clone();
        let used = get_u32(&im[3], 4) as usize;
        put_u64(&mut im[3], 8, 10);
        let c = chain_crc(&im[3], used);
        put_u32(&mut im[3], 28, c);
        let e = read_images(7, &blks, &im).err().unwrap().0;
        assert!(e.contains("cycle"), "{e}");
        // Longer than the bound: CHAIN_MAX + 1 blocks with empty pieces.
        let blks: Vec<u64> = (1..=CHAIN_MAX as u64 + 1).collect();
        let im: Vec<Vec<u8>> = blks
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let next = blks.get(i + 1).copied().unwrap_or(0);
                chain_block(7, i as u32, next, &[], bs)
            })
            .collect();
        let e = read_images(7, &blks, &im).err().unwrap().0;
        assert!(e.contains("longer than"), "{e}");
    }
}
