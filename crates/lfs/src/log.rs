//! The log writer (004 §3.2): blocks are buffered and written as partial segments — one
//! summary block naming every block, then the blocks — each with **one** device write, at
//! the segment's next free block. When a segment fills, the log moves to the segment the
//! summaries named as `next_seg` (the threaded log: segments need not be adjacent).
//!
//! The writer knows nothing of files: it hands out the address a pushed block will have
//! (so the caller can account for it in the usage table and point inodes at it before the
//! write happens) and asks its caller, through [`Segments`], for a clean segment to go to.

use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::BufferCache;

use crate::format::BLOCK_SIZE;
use crate::format::summary::{self, Entry, FLAG_COMMIT, FLAG_SKIP_REST, MAX_ENTRIES, Summary};
use crate::format::superblock::Superblock;
use crate::sequencer::Sequencer;

/// Where the segments come from.
pub trait Segments {
    /// A clean segment other than `avoid`, marked as in use, or `None` when none is left.
    fn take_clean(&mut self, avoid: &[u32]) -> Option<u32>;
}

/// The log's head and the blocks buffered for the next partial segment.
pub struct LogWriter {
    /// Segment being written.
    pub seg: u32,
    /// Next free block in `seg` (where the next summary goes).
    pub off: u32,
    /// Serial of the next summary.
    pub serial: u64,
    /// The segment the log goes to once `seg` is full (named by every summary in `seg`).
    pub next_seg: u32,
    pending: Vec<(Entry, Vec<u8>)>,
    segment_blocks: u32,
    /// Partial segments and blocks written (for stats and tests).
    pub partials_written: u64,
    pub blocks_written: u64,
    /// Segments the log has moved to (each took a clean segment as the next one).
    pub segments_entered: u64,
    /// The cache the file system reads log blocks through, if any: every block a partial
    /// segment overwrites is dropped from it before the write, so a read never returns a
    /// copy from the segment's life before it was cleaned.
    pub cache: Option<Arc<BufferCache>>,
    /// Where sealed partial segments go, if not straight to the device: the mount's
    /// sequencer writes them without the engine's lock, in order (`sequencer.rs`). `None`
    /// (mkfs, recovery, a mount without background writers: the engine's tests and the
    /// crash harness's recordings) writes each at once, under the lock.
    pub sequencer: Option<Arc<Sequencer>>,
    /// Seal partial segments without waking the sequencer's writer thread: set by a
    /// background pass for its holds of the engine's lock, which writes them itself once
    /// it lets the lock go.
    pub quiet: bool,
}

impl LogWriter {
    pub fn new(seg: u32, off: u32, serial: u64, next_seg: u32, segment_blocks: u32) -> Self {
        LogWriter {
            seg,
            off,
            serial,
            next_seg,
            pending: Vec::new(),
            segment_blocks,
            partials_written: 0,
            blocks_written: 0,
            segments_entered: 0,
            cache: None,
            sequencer: None,
            quiet: false,
        }
    }

    /// Blocks the current partial segment can still take.
    pub fn room(&self) -> usize {
        let left = self.segment_blocks.saturating_sub(self.off + 1) as usize;
        left.min(MAX_ENTRIES).saturating_sub(self.pending.len())
    }

    /// Blocks pushed and not yet written.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// The bytes of block `addr` if it is in a sealed partial segment whose device write
    /// has not completed (`sequencer.rs`): a read must take them from here.
    pub fn in_flight(&self, addr: u64) -> Option<Vec<u8>> {
        self.sequencer.as_ref().and_then(|q| q.block(addr))
    }

    /// Does a sealed partial segment in flight lie in segment `seg`?
    pub fn holds(&self, seg: u32) -> bool {
        self.sequencer.as_ref().is_some_and(|q| q.holds(seg))
    }

    /// Where a device flush that must cover every partial sealed so far waits first.
    pub fn barrier(&self) -> Option<(Arc<Sequencer>, u64)> {
        self.sequencer.as_ref().map(|q| (Arc::clone(q), q.sealed()))
    }

    /// The address the next pushed block gets, writing the current partial out first if it
    /// is full (so this may do I/O and move the log to the next segment).
    pub fn reserve(
        &mut self,
        sb: &Superblock,
        dev: &Arc<dyn BlockDevice>,
        segs: &mut dyn Segments,
    ) -> std::io::Result<u64> {
        if self.room() == 0 {
            self.write_partial(sb, dev, segs, false)?;
        }
        Ok(sb.seg_start(self.seg) + self.off as u64 + 1 + self.pending.len() as u64)
    }

    /// Appends a block; returns its address. `data` is one block.
    pub fn push(
        &mut self,
        sb: &Superblock,
        dev: &Arc<dyn BlockDevice>,
        segs: &mut dyn Segments,
        entry: Entry,
        data: Vec<u8>,
    ) -> std::io::Result<u64> {
        let addr = self.reserve(sb, dev, segs)?;
        debug_assert_eq!(data.len(), BLOCK_SIZE);
        self.pending.push((entry, data));
        Ok(addr)
    }

    /// Replaces the contents of a pushed, not yet written block (the usage table, whose
    /// contents depend on its own addresses).
    pub fn fill(&mut self, sb: &Superblock, addr: u64, data: Vec<u8>) -> bool {
        let base = sb.seg_start(self.seg) + self.off as u64 + 1;
        match addr
            .checked_sub(base)
            .and_then(|i| self.pending.get_mut(i as usize))
        {
            Some(slot) => {
                slot.1 = data;
                true
            }
            None => false,
        }
    }

    /// Makes room for `n` blocks in one partial segment (n <= what an empty segment's
    /// partial takes): writes what is pending, and if the rest of the segment is still too
    /// small, ends the segment early with a SKIP_REST summary.
    pub fn ensure_room(
        &mut self,
        sb: &Superblock,
        dev: &Arc<dyn BlockDevice>,
        segs: &mut dyn Segments,
        n: usize,
    ) -> std::io::Result<()> {
        if self.room() >= n {
            return Ok(());
        }
        self.write_partial(sb, dev, segs, false)?;
        if self.room() < n {
            self.write(sb, dev, segs, FLAG_SKIP_REST)?;
        }
        Ok(())
    }

    /// Writes the pending blocks as one partial segment: summary then blocks, one device
    /// write. `commit` marks the end of a flush (roll-forward applies partial segments only
    /// up to a commit). Moves to the next segment when this one is full.
    pub fn write_partial(
        &mut self,
        sb: &Superblock,
        dev: &Arc<dyn BlockDevice>,
        segs: &mut dyn Segments,
        commit: bool,
    ) -> std::io::Result<()> {
        if self.pending.is_empty() && !commit {
            return Ok(());
        }
        self.write(sb, dev, segs, if commit { FLAG_COMMIT } else { 0 })
    }

    fn write(
        &mut self,
        sb: &Superblock,
        dev: &Arc<dyn BlockDevice>,
        segs: &mut dyn Segments,
        flags: u32,
    ) -> std::io::Result<()> {
        let n = self.pending.len();
        let summary = Summary {
            serial: self.serial,
            data_crc: 0,
            data_hash: 0,
            next_seg: self.next_seg,
            flags,
            time_ns: now_ns(),
            seg: self.seg,
            off: self.off,
            entries: self.pending.iter().map(|(e, _)| *e).collect(),
        };
        let at = sb.seg_start(self.seg) + self.off as u64;
        let partial = Partial {
            at,
            seg: self.seg,
            summary,
            blocks: std::mem::take(&mut self.pending),
        };
        // Cached copies of the segment's earlier life go now, under the lock: no read asks
        // the device for these blocks until their write is done (a read finds them in the
        // sequencer meanwhile), so none comes back into the cache stale.
        if let Some(c) = &self.cache {
            for b in at..at + n as u64 + 1 {
                c.invalidate(b);
            }
        }
        // With a sequencer the partial is handed over as it is — its blocks moved, not
        // copied — and assembled and hashed by its writer, without the lock.
        match &self.sequencer {
            Some(q) => {
                q.submit(partial, !self.quiet);
            }
            None => dev.write_blocks(at, &partial.bytes())?,
        }
        self.partials_written += 1;
        self.blocks_written += n as u64 + 1;
        self.serial += 1;
        self.off += n as u32 + 1;
        // A segment with no room for a summary and one block is full: go on at once, so a
        // checkpoint never records a position at the end of a segment.
        if self.off + 2 > self.segment_blocks || flags & FLAG_SKIP_REST != 0 {
            self.seg = self.next_seg;
            self.off = 0;
            self.segments_entered += 1;
            self.next_seg = segs.take_clean(&[self.seg]).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::StorageFull, "log: no clean segment")
            })?;
        }
        Ok(())
    }
}

/// A partial segment as the log writer closed it: its place, its summary not yet sealed
/// (the hash is over the blocks), and its blocks.
pub struct Partial {
    /// Its first block (the summary) and its segment.
    pub at: u64,
    pub seg: u32,
    summary: Summary,
    blocks: Vec<(Entry, Vec<u8>)>,
}

impl Partial {
    /// Blocks, the summary included.
    pub fn len(&self) -> usize {
        self.blocks.len() + 1
    }

    /// The device write: the summary sealed over the blocks, then the blocks.
    pub fn bytes(&self) -> Vec<u8> {
        let mut buf = vec![0u8; self.len() * BLOCK_SIZE];
        for (i, (_, d)) in self.blocks.iter().enumerate() {
            buf[(i + 1) * BLOCK_SIZE..(i + 2) * BLOCK_SIZE].copy_from_slice(d);
        }
        let mut s = self.summary.clone();
        s.seal(&buf[BLOCK_SIZE..]);
        buf[..BLOCK_SIZE].copy_from_slice(&s.encode());
        buf
    }

    /// Block `i` of the write (0: the summary).
    pub fn block(&self, i: usize) -> Option<Vec<u8>> {
        match i {
            0 => Some(self.bytes()[..BLOCK_SIZE].to_vec()),
            i => self.blocks.get(i - 1).map(|(_, d)| d.clone()),
        }
    }
}

pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Reads and validates the partial segment at `seg:off` expecting `serial`: its summary
/// and its blocks, or `None` where the log ends (no summary, a stale one, a torn write).
/// In a version 2 image only a summary whose blocks are checked by the hash counts (the
/// CRC of version 1 passes a stale inode block: `summary`); a version 1 image, read-only,
/// is read with the check each summary names.
pub fn read_partial(
    sb: &Superblock,
    dev: &Arc<dyn BlockDevice>,
    seg: u32,
    off: u32,
    serial: u64,
) -> Option<(Summary, Vec<u8>)> {
    if off + 2 > sb.segment_blocks {
        return None;
    }
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_blocks(sb.seg_start(seg) + off as u64, &mut b)
        .ok()?;
    let s = summary::Summary::decode(&b, sb.segment_blocks, sb.segments).ok()?;
    if s.serial != serial || s.seg != seg || s.off != off || (sb.version >= 2 && !s.hashed()) {
        return None;
    }
    let mut data = vec![0u8; s.entries.len() * BLOCK_SIZE];
    dev.read_blocks(sb.seg_start(seg) + off as u64 + 1, &mut data)
        .ok()?;
    s.holds(&data).then_some((s, data))
}
