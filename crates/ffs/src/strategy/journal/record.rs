//! The journal's redo records: the payload of the write-ahead log's records (the log adds
//! the LSN, epoch and checksum around each: crates/wal). docs/FORMAT.md ("The journal's
//! records") has the same tables; the offset comments below mirror it.
//!
//! A call's changes are logged at its end as *physiological byte ranges*: for every
//! metadata buffer the call's facts named, the bytes that differ from the image of that
//! buffer last logged (the whole block when there is no such image: a new block, or one
//! not logged since the journal last dropped its image). One call is one or more
//! consecutive log records sharing an operation number; the last carries the END flag.
//! Recovery replays only operations whose END record it found, so a call is all or nothing.
//!
//! Little-endian, field by field. Decoding never panics: a payload that does not parse is
//! an error naming what is wrong.

/// A journal record payload starts with this.
pub const MAGIC: [u8; 4] = *b"JFFS";
/// The last record of an operation.
pub const FLAG_END: u8 = 1;

// Record header (16 bytes):
// 0   magic "JFFS"            [u8; 4]
// 4   op                      u64   operation number: every record of one call shares it
// 12  flags                   u8    bit 0: END (the call's last record)
// 13  reserved, zero          u8
// 14  entries                 u16   entries that follow
pub const HEADER: usize = 16;

// Entry UPDATE (17 + len bytes):
// 0   tag = 1                 u8
// 1   block                   u64   block of the file system
// 9   offset                  u32   first byte in the block
// 13  len                     u32   bytes that follow
// 17  bytes                   [u8; len]  the block's contents at offset.. after the call
pub const TAG_UPDATE: u8 = 1;
pub const UPDATE_HEADER: usize = 17;

// Entry REVOKE (9 bytes):
// 0   tag = 2                 u8
// 1   block                   u64   freed by this call: earlier updates of it are not replayed
pub const TAG_REVOKE: u8 = 2;
pub const REVOKE_BYTES: usize = 9;

// Entry ORPHAN (9 bytes):
// 0   tag = 3                 u8
// 1   inode                   u64   its link count reached 0 while it may be open: freed at
//                                   the next mount unless an ORPHAN_GONE follows
// Entry ORPHAN_GONE (9 bytes):
// 0   tag = 4                 u8
// 1   inode                   u64   freed (or linked again)
pub const TAG_ORPHAN: u8 = 3;
pub const TAG_ORPHAN_GONE: u8 = 4;

/// Two differing byte runs closer than this are logged as one range: a range header costs
/// 17 bytes, so a gap shorter than that is cheaper to carry than to split on.
const MERGE_GAP: usize = UPDATE_HEADER;

/// One change a record carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Bytes `offset..offset + data.len()` of `block` hold `data` after the operation.
    Update {
        block: u64,
        offset: u32,
        data: Vec<u8>,
    },
    /// `block` was freed: no update of it logged before this entry may be replayed (its
    /// next owner may be a file whose data is never logged).
    Revoke { block: u64 },
    /// Inode `ino`'s link count reached 0; it is freed once nothing holds it open, so a
    /// crash before then leaves it to the next mount (ext4's orphan list, in the log).
    Orphan { ino: u64 },
    /// Inode `ino` is no longer an orphan (freed).
    OrphanGone { ino: u64 },
}

impl Entry {
    fn size(&self) -> usize {
        match self {
            Entry::Update { data, .. } => UPDATE_HEADER + data.len(),
            Entry::Revoke { .. } | Entry::Orphan { .. } | Entry::OrphanGone { .. } => REVOKE_BYTES,
        }
    }
}

/// One log record's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub op: u64,
    pub end: bool,
    pub entries: Vec<Entry>,
}

impl Chunk {
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(HEADER + self.entries.iter().map(Entry::size).sum::<usize>());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.op.to_le_bytes());
        out.push(if self.end { FLAG_END } else { 0 });
        out.push(0);
        out.extend_from_slice(&(self.entries.len() as u16).to_le_bytes());
        for e in &self.entries {
            match e {
                Entry::Update {
                    block,
                    offset,
                    data,
                } => {
                    out.push(TAG_UPDATE);
                    out.extend_from_slice(&block.to_le_bytes());
                    out.extend_from_slice(&offset.to_le_bytes());
                    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                    out.extend_from_slice(data);
                }
                Entry::Revoke { block } => {
                    out.push(TAG_REVOKE);
                    out.extend_from_slice(&block.to_le_bytes());
                }
                Entry::Orphan { ino } => {
                    out.push(TAG_ORPHAN);
                    out.extend_from_slice(&ino.to_le_bytes());
                }
                Entry::OrphanGone { ino } => {
                    out.push(TAG_ORPHAN_GONE);
                    out.extend_from_slice(&ino.to_le_bytes());
                }
            }
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Chunk, String> {
        if b.len() < HEADER || b[0..4] != MAGIC {
            return Err("not a journal record (bad magic or too short)".into());
        }
        let op = u64::from_le_bytes(b[4..12].try_into().unwrap_or_default());
        let flags = b[12];
        if flags & !FLAG_END != 0 || b[13] != 0 {
            return Err(format!("unknown journal record flags {flags:#x}"));
        }
        let n = u16::from_le_bytes([b[14], b[15]]) as usize;
        let mut entries = Vec::with_capacity(n.min(1024));
        let mut p = HEADER;
        let u64_at = |p: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(p..p + 8)?.try_into().ok()?))
        };
        let u32_at = |p: usize| -> Option<u32> {
            Some(u32::from_le_bytes(b.get(p..p + 4)?.try_into().ok()?))
        };
        for i in 0..n {
            let short = || format!("journal record entry {i} is cut short");
            match b.get(p) {
                Some(&TAG_UPDATE) => {
                    let block = u64_at(p + 1).ok_or_else(short)?;
                    let offset = u32_at(p + 9).ok_or_else(short)?;
                    let len = u32_at(p + 13).ok_or_else(short)? as usize;
                    let start = p + UPDATE_HEADER;
                    let data = b
                        .get(start..start.checked_add(len).ok_or_else(short)?)
                        .ok_or_else(short)?
                        .to_vec();
                    p = start + len;
                    entries.push(Entry::Update {
                        block,
                        offset,
                        data,
                    });
                }
                Some(&tag @ (TAG_REVOKE | TAG_ORPHAN | TAG_ORPHAN_GONE)) => {
                    let v = u64_at(p + 1).ok_or_else(short)?;
                    p += REVOKE_BYTES;
                    entries.push(match tag {
                        TAG_REVOKE => Entry::Revoke { block: v },
                        TAG_ORPHAN => Entry::Orphan { ino: v },
                        _ => Entry::OrphanGone { ino: v },
                    });
                }
                Some(t) => return Err(format!("journal record entry {i} has unknown tag {t}")),
                None => return Err(short()),
            }
        }
        if p != b.len() {
            return Err(format!(
                "journal record has {} bytes after its last entry",
                b.len() - p
            ));
        }
        Ok(Chunk {
            op,
            end: flags & FLAG_END != 0,
            entries,
        })
    }
}

/// The byte ranges of `new` that differ from `old` (all of `new` when there is no `old`,
/// or it has another length), runs closer than [`MERGE_GAP`] merged. (The journal uses
/// [`diff_touched`]; this is its reference form for the tests.)
#[cfg(test)]
pub fn diff(old: Option<&[u8]>, new: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    match old {
        Some(o) => diff_into(o, new, &mut out),
        None => out.push((0, new.len())),
    }
    out
}

/// [`diff`] into `out` (cleared first by the caller), reusing its allocation.
#[cfg(test)]
pub fn diff_into(old: &[u8], new: &[u8], out: &mut Vec<(usize, usize)>) {
    if old.len() != new.len() {
        out.push((0, new.len()));
        return;
    }
    diff_span(old, new, 0, new.len(), out);
}

/// [`diff`] into `out` (cleared first by the caller), looking only at the 1/64ths of the block that `touched` names (bit `i`:
/// bytes `i * grain..(i + 1) * grain`, `cairn_bufcache::Buf::take_touched`): the caller
/// knows nothing changed outside them, so the result is the same as [`diff`]'s, and a
/// call that changed one inode of an inode block compares 256 bytes, not 4 KiB (the
/// comparisons of whole blocks were most of the journal's CPU in a create's profile).
pub fn diff_touched(
    old: &[u8],
    new: &[u8],
    touched: u64,
    grain: usize,
    out: &mut Vec<(usize, usize)>,
) {
    if old.len() != new.len() {
        out.push((0, new.len()));
        return;
    }
    let mut m = touched;
    while m != 0 {
        let g0 = m.trailing_zeros() as usize;
        let run = (m >> g0).trailing_ones() as usize;
        let bits = if run >= 64 {
            u64::MAX
        } else {
            (1u64 << run) - 1
        };
        m &= !(bits << g0);
        let lo = g0.saturating_mul(grain).min(new.len());
        let hi = (g0 + run).saturating_mul(grain).min(new.len());
        diff_span(old, new, lo, hi, out);
    }
}

/// The differing runs of `old[lo..hi]` and `new[lo..hi]` (same lengths, `hi <= len`) pushed
/// onto `out`, merged with the last one there when closer than [`MERGE_GAP`].
fn diff_span(old: &[u8], new: &[u8], lo: usize, hi: usize, out: &mut Vec<(usize, usize)>) {
    // Equal 512-byte spans are skipped with one comparison each (a whole block logged
    // against its image: most of it is equal); elsewhere the bytes are compared 8 at a
    // time, and a word that differs contributes the run from its first to its last
    // differing byte — exact, since any gap inside a word is shorter than the merge gap.
    // (A byte-by-byte loop over each differing 64-byte chunk was most of the diff's time in
    // the profile of a create.)
    const SPAN: usize = 512;
    const CHUNK: usize = 64;
    let push = |out: &mut Vec<(usize, usize)>, start: usize, end: usize| match out.last_mut() {
        Some((s, e)) if start - (*s + *e) < MERGE_GAP => *e = end - *s,
        _ => out.push((start, end - start)),
    };
    let mut c = lo;
    while c < hi {
        if c.is_multiple_of(SPAN) && c + SPAN <= hi && old[c..c + SPAN] == new[c..c + SPAN] {
            c += SPAN;
            continue;
        }
        let e = (c + CHUNK).min(hi);
        let (o, n) = (&old[c..e], &new[c..e]);
        let (ow, nw) = (o.chunks_exact(8), n.chunks_exact(8));
        let tail = c + (e - c) / 8 * 8;
        let (orest, nrest) = (ow.remainder(), nw.remainder());
        for (k, (a, b)) in ow.zip(nw).enumerate() {
            let word = |x: &[u8]| u64::from_le_bytes(x.try_into().unwrap_or_default());
            let x = word(a) ^ word(b);
            if x != 0 {
                // Little-endian: the low byte is the first.
                let at = c + 8 * k;
                let first = at + (x.trailing_zeros() / 8) as usize;
                let last = at + 8 - (x.leading_zeros() / 8) as usize;
                push(out, first, last);
            }
        }
        for (k, (a, b)) in orest.iter().zip(nrest).enumerate() {
            if a != b {
                push(out, tail + k, tail + k + 1);
            }
        }
        c = e;
    }
}

/// Splits one operation's entries into record payloads of at most `limit` bytes each (an
/// entry is never split; `limit` must hold the largest), the last flagged END.
pub fn split(op: u64, entries: Vec<Entry>, limit: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut size = HEADER;
    for e in entries {
        if !cur.is_empty() && (size + e.size() > limit || cur.len() == u16::MAX as usize) {
            out.push(
                Chunk {
                    op,
                    end: false,
                    entries: std::mem::take(&mut cur),
                }
                .encode(),
            );
            size = HEADER;
        }
        size += e.size();
        cur.push(e);
    }
    out.push(
        Chunk {
            op,
            end: true,
            entries: cur,
        }
        .encode(),
    );
    out
}

/// Encodes one operation's entries straight into record payloads, as [`split`] does from
/// [`Entry`] values, without building them: the journal logs every call through this, so a
/// call's bytes are copied once (from the buffer into the payload) before the log takes them.
pub struct Writer {
    op: u64,
    limit: usize,
    done: Vec<Vec<u8>>,
    cur: Vec<u8>,
    entries: u16,
}

impl Writer {
    /// A writer of operation `op`'s payloads of at most `limit` bytes each (`limit` must hold
    /// the largest entry).
    #[cfg(test)]
    pub fn new(op: u64, limit: usize) -> Writer {
        Writer::reusing(op, limit, Vec::new(), Vec::new())
    }

    /// [`Writer::new`] writing its first payload into `buf` and the list of payloads into
    /// `done` (both cleared first): buffers a previous operation left, so that logging a
    /// call allocates nothing for it.
    pub fn reusing(op: u64, limit: usize, mut buf: Vec<u8>, mut done: Vec<Vec<u8>>) -> Writer {
        buf.clear();
        done.clear();
        Self::put_header(&mut buf, op);
        Writer {
            op,
            limit,
            done,
            cur: buf,
            entries: 0,
        }
    }

    fn header(op: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(4096);
        Self::put_header(&mut v, op);
        v
    }

    fn put_header(v: &mut Vec<u8>, op: u64) {
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&op.to_le_bytes());
        v.extend_from_slice(&[0, 0, 0, 0]); // flags, reserved, entries: set when closed
    }

    /// Room for an entry of `size` bytes in the payload in progress, closing it if full.
    fn room(&mut self, size: usize) {
        if self.entries > 0 && (self.cur.len() + size > self.limit || self.entries == u16::MAX) {
            let next = Self::header(self.op);
            let full = std::mem::replace(&mut self.cur, next);
            self.close(full, false);
        }
        self.entries += 1;
    }

    fn close(&mut self, mut payload: Vec<u8>, end: bool) {
        payload[12] = if end { FLAG_END } else { 0 };
        payload[14..16].copy_from_slice(&self.entries.to_le_bytes());
        self.entries = 0;
        self.done.push(payload);
    }

    /// An UPDATE entry: `data` is `block`'s contents at `offset` after the operation.
    pub fn update(&mut self, block: u64, offset: u32, data: &[u8]) {
        self.room(UPDATE_HEADER + data.len());
        self.cur.push(TAG_UPDATE);
        self.cur.extend_from_slice(&block.to_le_bytes());
        self.cur.extend_from_slice(&offset.to_le_bytes());
        self.cur
            .extend_from_slice(&(data.len() as u32).to_le_bytes());
        self.cur.extend_from_slice(data);
    }

    fn small(&mut self, tag: u8, v: u64) {
        self.room(REVOKE_BYTES);
        self.cur.push(tag);
        self.cur.extend_from_slice(&v.to_le_bytes());
    }

    pub fn revoke(&mut self, block: u64) {
        self.small(TAG_REVOKE, block);
    }

    pub fn orphan(&mut self, ino: u64) {
        self.small(TAG_ORPHAN, ino);
    }

    pub fn orphan_gone(&mut self, ino: u64) {
        self.small(TAG_ORPHAN_GONE, ino);
    }

    /// Entries written so far.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty() && self.entries == 0
    }

    /// The buffers of the payload in progress and of the list, for another writer
    /// (`reusing`).
    pub fn into_parts(self) -> (Vec<u8>, Vec<Vec<u8>>) {
        (self.cur, self.done)
    }

    /// The payloads, the last flagged END.
    pub fn finish(mut self) -> Vec<Vec<u8>> {
        let last = std::mem::take(&mut self.cur);
        self.close(last, true);
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer's payloads are exactly `split`'s, one entry or many records.
    #[test]
    fn the_writer_encodes_as_split_does() {
        let mut entries = sample().entries;
        for i in 0..40u64 {
            entries.push(Entry::Update {
                block: i,
                offset: i as u32 * 3,
                data: vec![i as u8; (i as usize * 37) % 300],
            });
            entries.push(Entry::Revoke { block: i + 1000 });
        }
        for (limit, reuse) in [
            (HEADER + 400, false),
            (1000, true),
            (4096, false),
            (1 << 20, true),
        ] {
            // A reused writer's leftovers (another operation's bytes) leave no trace.
            let mut w = if reuse {
                Writer::reusing(42, limit, vec![9; 77], vec![vec![1, 2, 3]])
            } else {
                Writer::new(42, limit)
            };
            for e in &entries {
                match e {
                    Entry::Update {
                        block,
                        offset,
                        data,
                    } => w.update(*block, *offset, data),
                    Entry::Revoke { block } => w.revoke(*block),
                    Entry::Orphan { ino } => w.orphan(*ino),
                    Entry::OrphanGone { ino } => w.orphan_gone(*ino),
                }
            }
            assert_eq!(
                w.finish(),
                split(42, entries.clone(), limit),
                "limit {limit}"
            );
        }
    }

    fn sample() -> Chunk {
        Chunk {
            op: 0x0102_0304_0506_0708,
            end: true,
            entries: vec![
                Entry::Update {
                    block: 77,
                    offset: 256,
                    data: vec![1, 2, 3],
                },
                Entry::Revoke { block: 9 },
                Entry::Orphan { ino: 12 },
                Entry::OrphanGone { ino: 13 },
                Entry::Update {
                    block: 5,
                    offset: 0,
                    data: vec![],
                },
            ],
        }
    }

    #[test]
    fn encode_decode_round_trip_and_layout() {
        let c = sample();
        let b = c.encode();
        assert_eq!(&b[0..4], b"JFFS");
        assert_eq!(&b[4..12], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(b[12], FLAG_END);
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 5);
        assert_eq!(b[16], TAG_UPDATE);
        assert_eq!(&b[17..25], &77u64.to_le_bytes());
        assert_eq!(&b[25..29], &256u32.to_le_bytes());
        assert_eq!(&b[29..33], &3u32.to_le_bytes());
        assert_eq!(&b[33..36], &[1, 2, 3]);
        assert_eq!(b[36], TAG_REVOKE);
        assert_eq!(b[45], TAG_ORPHAN);
        assert_eq!(&b[46..54], &12u64.to_le_bytes());
        assert_eq!(b[54], TAG_ORPHAN_GONE);
        assert_eq!(
            b.len(),
            HEADER + UPDATE_HEADER + 3 + 3 * REVOKE_BYTES + UPDATE_HEADER
        );
        assert_eq!(Chunk::decode(&b).unwrap(), c);
    }

    #[test]
    fn decode_refuses_every_damaged_payload_without_panicking() {
        let b = sample().encode();
        for cut in 0..b.len() {
            assert!(Chunk::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(Chunk::decode(&extra).is_err());
        let mut tag = b.clone();
        tag[16] = 9;
        assert!(Chunk::decode(&tag).unwrap_err().contains("unknown tag"));
        let mut flags = b.clone();
        flags[12] = 0x80;
        assert!(Chunk::decode(&flags).is_err());
        let mut huge = b.clone();
        huge[29..33].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Chunk::decode(&huge).is_err());
        // Every single-byte change either decodes or is refused; none panics.
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0xff;
            let _ = Chunk::decode(&x);
        }
    }

    #[test]
    fn diff_finds_and_merges_changed_runs() {
        let old = vec![0u8; 4096];
        let mut new = old.clone();
        assert!(diff(Some(&old), &new).is_empty());
        assert_eq!(diff(None, &new), vec![(0, 4096)]);
        new[10] = 1;
        new[20] = 1; // within the merge gap of 10
        new[1000] = 2;
        new[4095] = 3;
        assert_eq!(diff(Some(&old), &new), vec![(10, 11), (1000, 1), (4095, 1)]);
        // Applying the ranges to the old image gives the new one.
        let mut img = old.clone();
        for (o, l) in diff(Some(&old), &new) {
            img[o..o + l].copy_from_slice(&new[o..o + l]);
        }
        assert_eq!(img, new);
    }

    /// The chunked diff gives exactly the ranges of a byte-by-byte one.
    #[test]
    fn diff_matches_a_bytewise_reference() {
        fn reference(old: &[u8], new: &[u8]) -> Vec<(usize, usize)> {
            let mut out: Vec<(usize, usize)> = Vec::new();
            let mut i = 0;
            while i < new.len() {
                if old[i] == new[i] {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < new.len() && old[i] != new[i] {
                    i += 1;
                }
                match out.last_mut() {
                    Some((s, e)) if start - (*s + *e) < MERGE_GAP => *e = i - *s,
                    _ => out.push((start, i - start)),
                }
            }
            out
        }
        let mut x: u64 = 7;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..500 {
            let old: Vec<u8> = (0..4096).map(|_| (rnd() % 3) as u8).collect();
            let mut new = old.clone();
            for _ in 0..(rnd() % 40) {
                let at = (rnd() % 4096) as usize;
                let len = (rnd() % 200) as usize;
                for b in &mut new[at..(at + len).min(4096)] {
                    *b = b.wrapping_add(1 + (rnd() % 2) as u8);
                }
            }
            assert_eq!(diff(Some(&old), &new), reference(&old, &new));
        }
        // A run across a chunk boundary.
        let old = vec![0u8; 256];
        let mut new = old.clone();
        new[60..70].fill(1);
        assert_eq!(diff(Some(&old), &new), vec![(60, 10)]);
    }

    /// Looking only at the touched 1/64ths gives exactly the whole diff whenever every
    /// changed byte lies in one of them (what `Buf::take_touched` promises), whatever else
    /// the mask names; a mask that misses a change misses it (the promise is the caller's).
    #[test]
    fn diff_touched_matches_the_whole_diff_when_the_mask_covers_the_changes() {
        let mut x: u64 = 11;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in [4096usize, 8192, 100] {
            let grain = len.div_ceil(64).max(1);
            for _ in 0..400 {
                let old: Vec<u8> = (0..len).map(|_| (rnd() % 3) as u8).collect();
                let mut new = old.clone();
                let mut mask = 0u64;
                for _ in 0..(rnd() % 12) {
                    let at = (rnd() as usize) % len;
                    let n = 1 + (rnd() as usize) % 300;
                    let end = (at + n).min(len);
                    for (i, b) in new.iter_mut().enumerate().take(end).skip(at) {
                        *b = b.wrapping_add(1);
                        mask |= 1 << (i / grain);
                    }
                }
                let extra = rnd() & rnd() & rnd();
                let mut out = Vec::new();
                diff_touched(&old, &new, mask | extra, grain, &mut out);
                assert_eq!(out, diff(Some(&old), &new), "len {len} mask {mask:#x}");
            }
        }
        let old = vec![0u8; 4096];
        let mut new = old.clone();
        new[5] = 1;
        new[4095] = 1;
        let mut out = Vec::new();
        diff_touched(&old, &new, 1 << 63, 64, &mut out);
        assert_eq!(out, vec![(4095, 1)]);
        out.clear();
        diff_touched(&old, &new[..100], u64::MAX, 64, &mut out);
        assert_eq!(out, vec![(0, 100)], "another length: the whole block");
    }

    #[test]
    fn split_keeps_entries_whole_and_flags_only_the_last() {
        let entries: Vec<Entry> = (0..10)
            .map(|i| Entry::Update {
                block: i,
                offset: 0,
                data: vec![i as u8; 100],
            })
            .collect();
        let recs = split(7, entries.clone(), HEADER + 3 * (UPDATE_HEADER + 100));
        assert_eq!(recs.len(), 4);
        let chunks: Vec<Chunk> = recs.iter().map(|r| Chunk::decode(r).unwrap()).collect();
        assert!(chunks.iter().all(|c| c.op == 7));
        assert_eq!(
            chunks.iter().map(|c| c.end).collect::<Vec<_>>(),
            vec![false, false, false, true]
        );
        let back: Vec<Entry> = chunks.into_iter().flat_map(|c| c.entries).collect();
        assert_eq!(back, entries);
        // No entries: one END record with none.
        assert_eq!(split(1, vec![], 1000).len(), 1);
    }
}
