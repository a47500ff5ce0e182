//! FFS-style directory blocks (Sprite LFS keeps FFS's directory format, 004 §4, so both of
//! cairn's formats use this codec).
//!
//! A directory block is a sequence of 512-byte chunks (FFS's DIRBLKSIZ). Entries never
//! cross a chunk boundary, so that one entry's update is a single sector write: a torn
//! block write can lose an entry update but never leave half of one.
//!
//! Entry (variable length, 8-byte aligned):
//!   0 ino      u32 (0 = unused record)
//!   4 reclen   u16 (bytes to the next entry; the chunk's last entry reaches its end)
//!   6 type     u8  (d_type: S_IFMT >> 12)
//!   7 namelen  u8
//!   8 name     namelen bytes, no NUL
//! A chunk with no names is one unused record of reclen 512.
//!
//! Inserting splits the slack off an existing record and never moves an existing entry, and
//! removing merges a record into its predecessor: an entry's offset is stable for its whole
//! life, which is what makes readdir cookies (byte offsets) stable under concurrent
//! create/unlink.

use crate::{FResult, FormatError, corrupt};

fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub const DIR_CHUNK: usize = 512;
const HDR: usize = 8;

/// Bytes a record for a name of `namelen` bytes needs.
pub fn rec_size(namelen: usize) -> usize {
    (HDR + namelen).div_ceil(8) * 8
}

/// One record of a directory block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEntryRef<'a> {
    /// Byte offset of the record in the block.
    pub off: usize,
    pub ino: u32,
    pub reclen: usize,
    pub dtype: u8,
    pub name: &'a [u8],
}

impl DirEntryRef<'_> {
    /// Unused bytes at the end of this record that an insert could take.
    pub fn slack(&self) -> usize {
        if self.ino == 0 {
            self.reclen
        } else {
            self.reclen - rec_size(self.name.len())
        }
    }
}

/// Formats an empty directory block.
pub fn init_empty(b: &mut [u8]) {
    b.fill(0);
    for c in (0..b.len()).step_by(DIR_CHUNK) {
        put_u16(b, c + 4, DIR_CHUNK as u16);
    }
}

/// Formats the first block of a new directory with `.` and `..`.
pub fn init_first(b: &mut [u8], self_ino: u64, parent_ino: u64) {
    init_empty(b);
    write_rec(b, 0, self_ino as u32, 16, libc::DT_DIR, b".");
    write_rec(
        b,
        16,
        parent_ino as u32,
        DIR_CHUNK - 16,
        libc::DT_DIR,
        b"..",
    );
}

fn write_rec(b: &mut [u8], off: usize, ino: u32, reclen: usize, dtype: u8, name: &[u8]) {
    put_u32(b, off, ino);
    put_u16(b, off + 4, reclen as u16);
    b[off + 6] = dtype;
    b[off + 7] = name.len() as u8;
    b[off + HDR..off + HDR + name.len()].copy_from_slice(name);
}

fn parse_at(b: &[u8], off: usize) -> FResult<DirEntryRef<'_>> {
    let chunk_end = (off / DIR_CHUNK + 1) * DIR_CHUNK;
    if off + HDR > b.len() || !off.is_multiple_of(8) {
        return corrupt(format!("directory record at {off} out of bounds"));
    }
    let ino = get_u32(b, off);
    let reclen = get_u16(b, off + 4) as usize;
    let namelen = b[off + 7] as usize;
    if reclen < HDR || !reclen.is_multiple_of(8) || off + reclen > chunk_end {
        return corrupt(format!(
            "directory record at {off}: bad record length {reclen}"
        ));
    }
    if ino != 0 && (namelen == 0 || HDR + namelen > reclen) {
        return corrupt(format!(
            "directory record at {off}: bad name length {namelen}"
        ));
    }
    let nl = if ino == 0 { 0 } else { namelen };
    Ok(DirEntryRef {
        off,
        ino,
        reclen,
        dtype: b[off + 6],
        name: &b[off + HDR..off + HDR + nl],
    })
}

/// Iterates over every record (used or not) of the chunks of `b`, stopping at the first
/// malformed one with an error.
pub fn records(b: &[u8]) -> impl Iterator<Item = FResult<DirEntryRef<'_>>> {
    let mut off = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || off >= b.len() || !b.len().is_multiple_of(DIR_CHUNK) {
            if !failed && off == 0 && !b.len().is_multiple_of(DIR_CHUNK) {
                failed = true;
                return Some(corrupt("directory block size not a multiple of 512"));
            }
            return None;
        }
        match parse_at(b, off) {
            Ok(e) => {
                off += e.reclen;
                Some(Ok(e))
            }
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    })
}

/// The used entries of `b`.
pub fn entries(b: &[u8]) -> impl Iterator<Item = FResult<DirEntryRef<'_>>> {
    records(b).filter(|r| r.as_ref().map_or(true, |e| e.ino != 0))
}

/// Checks every record of the block.
pub fn validate(b: &[u8]) -> FResult<()> {
    records(b).try_for_each(|r| r.map(|_| ()))
}

/// The largest insert chunk `c` of `b` can take (0 if malformed).
pub fn chunk_free(b: &[u8], c: usize) -> usize {
    chunk_free_except(b, c, &[])
}

/// Bytes of a directory block no insert may take: `(offset, length)` in the same terms as
/// the block (or chunk) slice they go with.
///
/// A format whose writes may still show an entry that is gone from the buffer holds that
/// entry's bytes: soft updates writes a rename's old name back into the bytes its removal
/// merged into its neighbour until the new name is on disk, and an entry placed over them
/// could reach disk only by waiting for that removal (`docs/DESIGN.md`, "Removed names
/// hold their bytes"). An insert that skips them places the entry elsewhere in the chunk
/// (before or after them: a record's free bytes may lie on both sides of a held range,
/// which stays inside some record's slack) and nothing waits.
pub type Held = [(usize, usize)];

/// The runs of free bytes record `e` offers an insert, as `(start, end)` offsets of the
/// slice whose chunk begins at `base`, less the `held` bytes; ascending.
fn free_runs(base: usize, e: &DirEntryRef<'_>, held: &Held) -> Vec<(usize, usize)> {
    let start = base + e.off + (e.reclen - e.slack());
    let end = base + e.off + e.reclen;
    let mut runs = vec![(start, end)];
    for &(h, len) in held {
        let (hs, he) = (h, h + len);
        if he <= start || hs >= end {
            continue;
        }
        runs = runs
            .into_iter()
            .flat_map(|(a, z)| {
                if he <= a || hs >= z {
                    vec![(a, z)]
                } else {
                    [(a, hs.max(a)), (he.min(z), z)]
                        .into_iter()
                        .filter(|(x, y)| y > x)
                        .collect()
                }
            })
            .collect();
    }
    runs
}

/// [`chunk_free`] with the `held` bytes taken by nothing: the largest record an insert
/// that skips them ([`insert_except`]) can place in chunk `c`.
pub fn chunk_free_except(b: &[u8], c: usize, held: &Held) -> usize {
    let s = c * DIR_CHUNK;
    match b.get(s..s + DIR_CHUNK) {
        Some(chunk) => records(chunk)
            .map(|r| {
                r.map_or(0, |e| {
                    if held.is_empty() {
                        e.slack()
                    } else {
                        free_runs(s, &e, held)
                            .into_iter()
                            .map(|(a, z)| z - a)
                            .max()
                            .unwrap_or(0)
                    }
                })
            })
            .max()
            .unwrap_or(0),
        None => 0,
    }
}

/// Inserts a name into chunk `c`; returns the new entry's offset, or `None` if the chunk
/// has no record with enough slack. Existing entries do not move.
pub fn insert(b: &mut [u8], c: usize, ino: u64, dtype: u8, name: &[u8]) -> FResult<Option<usize>> {
    insert_except(b, c, ino, dtype, name, &[])
}

/// [`insert`] that places the entry over none of the `held` bytes: at the start of the
/// first run of free bytes, outside them, that fits it. The record whose slack holds that
/// run ends where the new entry begins (its slack keeps any held bytes before it), and the
/// new entry's record reaches the end of the old one (its slack keeps any held bytes after
/// it).
pub fn insert_except(
    b: &mut [u8],
    c: usize,
    ino: u64,
    dtype: u8,
    name: &[u8],
    held: &Held,
) -> FResult<Option<usize>> {
    let need = rec_size(name.len());
    let s = c * DIR_CHUNK;
    let chunk = b
        .get(s..s + DIR_CHUNK)
        .ok_or_else(|| FormatError("chunk out of range".into()))?;
    let mut found = None;
    for r in records(chunk) {
        let e = r?;
        if e.slack() < need {
            continue;
        }
        if let Some(&(at, _)) = free_runs(s, &e, held).iter().find(|(a, z)| z - a >= need) {
            found = Some((s + e.off, e.reclen, at));
            break;
        }
    }
    let Some((off, reclen, at)) = found else {
        return Ok(None);
    };
    let end = off + reclen;
    if at > off {
        // The record before keeps its name (or stays unused) and ends at the new entry.
        put_u16(b, off + 4, (at - off) as u16);
    }
    write_rec(b, at, ino as u32, end - at, dtype, name);
    Ok(Some(at))
}

/// Removes the entry at `off`: merged into the previous record of its chunk, or marked
/// unused if it is the chunk's first.
pub fn remove(b: &mut [u8], off: usize) -> FResult<()> {
    let s = off / DIR_CHUNK * DIR_CHUNK;
    let chunk = b
        .get(s..s + DIR_CHUNK)
        .ok_or_else(|| FormatError("chunk out of range".into()))?;
    let mut prev: Option<usize> = None;
    let mut hit = None;
    for r in records(chunk) {
        let e = r?;
        if s + e.off == off {
            hit = Some(e.reclen);
            break;
        }
        prev = Some(s + e.off);
    }
    let Some(reclen) = hit else {
        return corrupt(format!("no directory entry at offset {off}"));
    };
    if let Some(p) = prev {
        let plen = get_u16(b, p + 4) as usize;
        put_u16(b, p + 4, (plen + reclen) as u16);
    } else {
        put_u32(b, off, 0);
        b[off + 7] = 0;
    }
    Ok(())
}

/// Points the entry at `off` to another inode (rename over an existing name, `..` update).
pub fn set_ino(b: &mut [u8], off: usize, ino: u64, dtype: u8) {
    put_u32(b, off, ino as u32);
    b[off + 6] = dtype;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(b: &[u8]) -> Vec<(usize, u32, Vec<u8>)> {
        entries(b)
            .map(|e| e.unwrap())
            .map(|e| (e.off, e.ino, e.name.to_vec()))
            .collect()
    }

    #[test]
    fn first_block_and_inserts_keep_offsets() {
        let mut b = vec![0u8; 4096];
        init_first(&mut b, 2, 2);
        validate(&b).unwrap();
        assert_eq!(names(&b).len(), 2);
        let a = insert(&mut b, 0, 10, libc::DT_REG, b"alpha")
            .unwrap()
            .unwrap();
        let c = insert(&mut b, 0, 11, libc::DT_REG, b"beta")
            .unwrap()
            .unwrap();
        assert_eq!(a, 32);
        validate(&b).unwrap();
        remove(&mut b, a).unwrap();
        validate(&b).unwrap();
        // beta did not move.
        assert!(
            names(&b)
                .iter()
                .any(|(o, i, n)| *o == c && *i == 11 && n == b"beta")
        );
        // The freed slack is reused.
        let d = insert(&mut b, 0, 12, libc::DT_REG, b"gamma")
            .unwrap()
            .unwrap();
        assert_eq!(d, a);
    }

    #[test]
    fn chunk_fills_up() {
        let mut b = vec![0u8; 4096];
        init_empty(&mut b);
        let name = [b'x'; 255];
        let mut n = 0;
        while insert(&mut b, 3, 5, libc::DT_REG, &name).unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 1);
        assert!(chunk_free(&b, 3) < rec_size(255));
        assert_eq!(chunk_free(&b, 2), DIR_CHUNK);
        validate(&b).unwrap();
        // Remove the first entry of a chunk: marked unused.
        remove(&mut b, 3 * DIR_CHUNK).unwrap();
        assert_eq!(chunk_free(&b, 3), DIR_CHUNK);
    }

    /// Whether `held` lies inside the slack of one record of its chunk (where a format can
    /// write the removed entry back), and no entry's used bytes reach into it.
    fn held_is_in_slack(b: &[u8], h: usize, len: usize) -> bool {
        let s = h / DIR_CHUNK * DIR_CHUNK;
        records(&b[s..s + DIR_CHUNK]).any(|r| {
            let e = r.unwrap();
            let used = e.reclen - e.slack();
            s + e.off + used <= h && h + len <= s + e.off + e.reclen
        })
    }

    /// A removed entry's held bytes are skipped: the next entry of the same size goes after
    /// the next name, not into them (without the hold it goes exactly there, see
    /// `first_block_and_inserts_keep_offsets`), and they stay slack a format can write the
    /// removed entry back into.
    #[test]
    fn an_insert_skips_held_bytes() {
        let mut b = vec![0u8; 4096];
        init_first(&mut b, 2, 2);
        let [a, gone, c] = [(10, &b"alpha"[..]), (11, b"beta"), (12, b"gamma")]
            .map(|(ino, name)| insert(&mut b, 0, ino, libc::DT_REG, name).unwrap().unwrap());
        remove(&mut b, gone).unwrap();
        let held = [(gone, rec_size(4))];
        assert_eq!(chunk_free(&b, 0), DIR_CHUNK - c - rec_size(5));
        assert_eq!(chunk_free_except(&b, 0, &held), DIR_CHUNK - c - rec_size(5));
        let d = insert_except(&mut b, 0, 13, libc::DT_REG, b"delta", &held)
            .unwrap()
            .unwrap();
        assert_eq!(d, c + rec_size(5), "after gamma, not in beta's bytes");
        validate(&b).unwrap();
        assert!(held_is_in_slack(&b, gone, rec_size(4)));
        // The bytes given back: the next insert takes them.
        let e = insert(&mut b, 0, 14, libc::DT_REG, b"echo")
            .unwrap()
            .unwrap();
        assert_eq!(e, gone);
        assert!(a < gone && names(&b).len() == 6);
    }

    /// Free bytes on both sides of held ones: the entry takes those before them when they
    /// fit (its record's slack then keeps the held bytes), else those after (the record
    /// before ends where it begins); an unused first record stays unused.
    #[test]
    fn held_bytes_in_the_middle_of_free_space() {
        let mut b = vec![0u8; 4096];
        init_empty(&mut b);
        // Chunk 1: one unused record of 512; held 64..96.
        let held = [(DIR_CHUNK + 64, 32)];
        assert_eq!(chunk_free_except(&b, 1, &held), DIR_CHUNK - 96);
        let x = insert_except(&mut b, 1, 20, libc::DT_REG, b"x", &held)
            .unwrap()
            .unwrap();
        assert_eq!(x, DIR_CHUNK, "16 bytes fit before the held ones");
        let long = [b'l'; 60]; // a 72-byte record: only after the held bytes
        let y = insert_except(&mut b, 1, 21, libc::DT_REG, &long, &held)
            .unwrap()
            .unwrap();
        assert_eq!(y, DIR_CHUNK + 96);
        validate(&b).unwrap();
        assert!(held_is_in_slack(&b, DIR_CHUNK + 64, 32));
        // Chunk 2: held bytes at the start of an unused record.
        let held = [(2 * DIR_CHUNK, 24)];
        let z = insert_except(&mut b, 2, 22, libc::DT_REG, b"z", &held)
            .unwrap()
            .unwrap();
        assert_eq!(z, 2 * DIR_CHUNK + 24);
        validate(&b).unwrap();
        let first = records(&b[2 * DIR_CHUNK..3 * DIR_CHUNK])
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(
            (first.ino, first.reclen),
            (0, 24),
            "still unused, ending at z"
        );
        assert!(held_is_in_slack(&b, 2 * DIR_CHUNK, 24));
        // Nothing fits outside the held bytes: no room, although the chunk has some.
        let mut c = vec![0u8; DIR_CHUNK];
        init_empty(&mut c);
        let all = [(0, DIR_CHUNK)];
        assert_eq!(chunk_free_except(&c, 0, &all), 0);
        assert_eq!(
            insert_except(&mut c, 0, 5, libc::DT_REG, b"n", &all).unwrap(),
            None
        );
    }

    /// Random inserts, removes and holds on one chunk (seed printed; `CAIRN_DIR_SEED=N`
    /// replays one): an insert that skips held bytes never lands on them, every held
    /// range stays in some record's slack, and the chunk's free bytes say exactly whether
    /// an insert fits.
    #[test]
    fn random_inserts_never_take_held_bytes() {
        let seeds: Vec<u64> = match std::env::var("CAIRN_DIR_SEED") {
            Ok(v) => vec![v.parse().expect("CAIRN_DIR_SEED: a number")],
            Err(_) => (1..=200).collect(),
        };
        for seed in seeds {
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = |n: usize| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % n as u64) as usize
            };
            let mut b = vec![0u8; DIR_CHUNK];
            init_empty(&mut b);
            let mut live: Vec<(usize, usize)> = Vec::new();
            let mut held: Vec<(usize, usize)> = Vec::new();
            for step in 0..400 {
                match rnd(10) {
                    0..=4 => {
                        let name = vec![b'a' + rnd(26) as u8; 1 + rnd(40)];
                        let need = rec_size(name.len());
                        let fits = chunk_free_except(&b, 0, &held) >= need;
                        let got = insert_except(&mut b, 0, 7, libc::DT_REG, &name, &held).unwrap();
                        assert_eq!(got.is_some(), fits, "seed {seed} step {step}");
                        if let Some(at) = got {
                            assert!(
                                held.iter().all(|&(h, l)| at + need <= h || h + l <= at),
                                "seed {seed} step {step}: entry at {at} over held {held:?}"
                            );
                            live.push((at, need));
                        }
                    }
                    5..=7 if !live.is_empty() => {
                        let (at, need) = live.swap_remove(rnd(live.len()));
                        remove(&mut b, at).unwrap();
                        if rnd(2) == 0 {
                            held.push((at, need));
                        }
                    }
                    8 if !held.is_empty() => {
                        held.swap_remove(rnd(held.len()));
                    }
                    _ => {}
                }
                validate(&b).unwrap();
                for &(h, l) in &held {
                    assert!(
                        held_is_in_slack(&b, h, l),
                        "seed {seed} step {step}: held {h}+{l} not in slack"
                    );
                }
            }
        }
    }

    #[test]
    fn hostile_records() {
        let mut b = vec![0u8; 4096];
        init_empty(&mut b);
        put_u16(&mut b, 4, 0);
        assert!(validate(&b).is_err());
        init_empty(&mut b);
        put_u16(&mut b, 4, 1024); // crosses the chunk
        assert!(validate(&b).is_err());
        init_empty(&mut b);
        put_u32(&mut b, 0, 7);
        b[7] = 0; // used entry with empty name
        assert!(validate(&b).is_err());
        assert!(validate(&b[..100]).is_err());
    }
}
