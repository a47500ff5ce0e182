//! The segment cleaner's mechanism (004 §3.3): read a segment's summaries, keep the blocks
//! still live, write them back at the log head, and let a checkpoint free the segment.
//!
//! Liveness by summary entry (004 §3.3, the uid check first):
//! - data block `(ino, version, lbn)` at A: the inode number still has that version and its
//!   block map points `lbn` at A;
//! - indirect block of slot `s`: the inode names A for slot `s`; xattr block likewise;
//! - inode block: each record whose inode the inode map places at A;
//! - inode map / usage table block: the table's current block (rewritten at the checkpoint
//!   that ends every pass anyway);
//! - summaries and the directory operation log are never live.
//!
//! Which segments and in what order the live data goes back is `cleaner::policy`'s: the
//! same `plan` and `Grouping::arrange` the simulator runs. A pass ends with a checkpoint
//! (flushing the moved inodes and indirect blocks); the victims, now without live bytes,
//! become clean once it is durable.

use super::*;
use crate::cleaner::policy::{self, Policy, SegmentState, SegmentUsage, Thresholds, UsageTable};
use crate::format::summary::Summary;

/// The engine's usage table as the policies read it.
struct View<'a>(&'a State);

impl UsageTable for View<'_> {
    fn segment_count(&self) -> u32 {
        self.0.sb.segments
    }
    fn segment_bytes(&self) -> u64 {
        self.0.sb.segment_blocks as u64 * BS
    }
    fn usage(&self, s: u32) -> SegmentUsage {
        let u = self.0.usage[s as usize];
        let state = if !u.dirty {
            SegmentState::Clean
        } else if s == self.0.log.seg || s == self.0.log.next_seg {
            SegmentState::Active
        } else {
            SegmentState::Dirty
        };
        SegmentUsage {
            state,
            live_bytes: u.live_bytes as u64,
            youngest: u.youngest,
        }
    }
}

/// Counters of the cleaner (for `cairn stats` and the write cost).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CleanerStats {
    pub passes: u64,
    pub segments_cleaned: u64,
    pub empty_segments_cleaned: u64,
    /// Blocks read from victims (whole segments up to their last summary).
    pub blocks_read: u64,
    /// Live blocks written back (data, indirect, xattr; inodes and tables are rewritten by
    /// the checkpoint that ends the pass).
    pub blocks_moved: u64,
    /// Passes of the greedy policy run because the mount's policy found nothing worth
    /// cleaning.
    pub greedy_fallbacks: u64,
    /// Passes refused: the victims would not give back a segment more than they fill.
    pub refused: u64,
}

/// A live data block found in a victim.
struct Moved {
    ino: u64,
    lbn: u64,
    addr: u64,
    mtime: u64,
    data: Vec<u8>,
}

impl State {
    /// The partial segments of segment `seg`, as written (summary checksum, position and
    /// data checksum checked; the first that fails ends the segment).
    fn scan_segment(&mut self, seg: u32) -> Vec<(Summary, Vec<u8>)> {
        let mut out = Vec::new();
        let mut off = 0u32;
        while off + 2 <= self.sb.segment_blocks {
            let mut b = vec![0u8; BLOCK_SIZE];
            if self
                .dev
                .read_blocks(self.sb.seg_start(seg) + off as u64, &mut b)
                .is_err()
            {
                break;
            }
            let Ok(s) = Summary::decode(&b, self.sb.segment_blocks, self.sb.segments) else {
                break;
            };
            if s.seg != seg || s.off != off {
                break;
            }
            let mut data = vec![0u8; s.entries.len() * BLOCK_SIZE];
            if self
                .dev
                .read_blocks(self.sb.seg_start(seg) + off as u64 + 1, &mut data)
                .is_err()
                || crate::format::crc(&data) != s.data_crc
            {
                break;
            }
            self.cleaner.blocks_read += 1 + s.entries.len() as u64;
            off += 1 + s.entries.len() as u32;
            let skip = s.skip_rest();
            out.push((s, data));
            if skip {
                break;
            }
        }
        out
    }

    fn version_of(&self, ino: u64) -> Option<u32> {
        let e = self.imap.get(ino as usize)?;
        match self.nodes.get(&ino) {
            Some(n) => Some(n.inode.version),
            None if e.addr != 0 => Some(e.version),
            None => None,
        }
    }

    /// Finds the live blocks of `seg`: data blocks are returned (to be written back in the
    /// policy's order), everything else is marked dirty for the checkpoint to rewrite.
    fn collect_live(&mut self, seg: u32, out: &mut Vec<Moved>) -> Result<()> {
        for (s, data) in self.scan_segment(seg) {
            let base = self.sb.seg_start(s.seg) + s.off as u64 + 1;
            for (i, e) in s.entries.iter().enumerate() {
                let addr = base + i as u64;
                let blk = &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                match e.kind {
                    Kind::Data => {
                        if self.version_of(e.ino) != Some(e.version)
                            || self.dirty_data.contains_key(&(e.ino, e.lbn))
                            || self.map(e.ino)?.get(&e.lbn) != Some(&addr)
                        {
                            continue;
                        }
                        // Nanoseconds: in milliseconds many blocks tie, and the order of
                        // ties would depend on how fast the workload ran.
                        let t = self.node(e.ino)?.inode.mtime;
                        let mtime = (t.sec.max(0) as u64)
                            .saturating_mul(1_000_000_000)
                            .saturating_add(t.nsec as u64);
                        out.push(Moved {
                            ino: e.ino,
                            lbn: e.lbn,
                            addr,
                            mtime,
                            data: blk.to_vec(),
                        });
                    }
                    Kind::Indirect | Kind::Xattr => {
                        if self.version_of(e.ino) != Some(e.version) {
                            continue;
                        }
                        self.map(e.ino)?;
                        let n = self.node(e.ino)?;
                        if e.kind == Kind::Indirect && n.ind.get(&e.lbn) == Some(&addr) {
                            n.dirty_slots.insert(e.lbn);
                            self.mark_dirty(e.ino);
                        } else if e.kind == Kind::Xattr && n.inode.xattr == addr {
                            let x = decode_xattrs(blk)?;
                            let n = self.node(e.ino)?;
                            n.xattrs.get_or_insert(x);
                            n.xattr_dirty = true;
                            self.mark_dirty(e.ino);
                        }
                    }
                    Kind::Inode => {
                        for r in inode::decode_block(blk).map_err(corrupt)? {
                            let live = self
                                .imap
                                .get(r.ino as usize)
                                .is_some_and(|m| m.addr == addr);
                            if live && r.mode != 0 {
                                self.node(r.ino)?;
                                self.mark_dirty(r.ino);
                            }
                        }
                    }
                    Kind::Imap => {
                        if self.imap_addrs.get(e.lbn as usize) == Some(&addr) {
                            self.imap_dirty.insert(e.lbn as u32);
                        }
                    }
                    // Every checkpoint rewrites the whole usage table; the log is dead.
                    Kind::Usage | Kind::DirLog => {}
                }
            }
        }
        Ok(())
    }

    /// One cleaning pass: plans with `policy` towards `th`, moves the victims' live blocks
    /// to the log head (data in the policy's grouping), and checkpoints. Returns the
    /// segments cleaned.
    pub fn clean_pass(&mut self, policy: Policy, th: Thresholds) -> Result<u32> {
        self.check_log_ok()?;
        let r = self.clean_pass_inner(policy, th);
        self.note_log_result(r)
    }

    fn clean_pass_inner(&mut self, policy: Policy, th: Thresholds) -> Result<u32> {
        let now_s = self.clock();
        let head_free = (self.sb.segment_blocks - self.log.off) as u64 * BS;
        let plan = policy::plan(&View(self), policy.selection, now_s, th, head_free);
        // Keep the pass within what the clean segments can take: live data goes back at
        // the head, and the checkpoint needs room too.
        let seg_bytes = self.sb.segment_blocks as u64 * BS;
        let room =
            self.clean_segments().saturating_sub(1) as u64 * seg_bytes * 3 / 4 + head_free / 2;
        let mut victims = Vec::new();
        let mut live = 0u64;
        // The plan's victims in its order, skipping any whose live data would not fit what
        // is left: a nearly full first choice must not hide emptier ones behind it.
        for v in plan.victims {
            let l = self.usage[v as usize].live_bytes as u64;
            if live + l > room {
                continue;
            }
            live += l;
            victims.push(v);
        }
        // A pass must give back at least a segment more than it fills, or it only moves
        // data around (every candidate full of live blocks).
        let gain = (victims.len() as u64 * seg_bytes).saturating_sub(live);
        if victims.is_empty() || gain < seg_bytes {
            self.cleaner.refused += 1;
            return Ok(0);
        }
        let mut moved = Vec::new();
        for &v in &victims {
            if self.usage[v as usize].live_bytes == 0 {
                self.cleaner.empty_segments_cleaned += 1;
                continue;
            }
            self.collect_live(v, &mut moved)?;
        }
        policy.grouping.arrange(&mut moved, |m| m.mtime);
        for m in moved {
            let e = Entry {
                kind: Kind::Data,
                version: self.version_of(m.ino).unwrap_or(0),
                ino: m.ino,
                lbn: m.lbn,
            };
            let addr = self.push(e, m.data, BLOCK_SIZE as u32)?;
            let old = self.set_map(m.ino, m.lbn, addr)?;
            debug_assert_eq!(old, m.addr);
            self.kill(old, BLOCK_SIZE as u32);
            self.mark_dirty(m.ino);
            self.cleaner.blocks_moved += 1;
        }
        self.checkpoint()?;
        let cleaned = victims
            .iter()
            .filter(|&&v| !self.usage[v as usize].dirty)
            .count() as u32;
        self.cleaner.passes += 1;
        self.cleaner.segments_cleaned += cleaned as u64;
        Ok(cleaned)
    }
}
