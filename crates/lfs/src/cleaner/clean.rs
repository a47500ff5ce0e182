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
//! same `plan` and `Grouping::arrange` the simulator runs. The rules for when it runs are
//! here too: below `clean_start` clean segments after an operation and at the syncer's
//! ticks ([`State::clean_if_low`]), and in the foreground when a write finds no room
//! ([`State::ensure_space`]). A pass ends with a checkpoint
//! (flushing the moved inodes and indirect blocks); the victims, now without live bytes,
//! become clean once it is durable.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::MutexGuard;

use cairn_blockdev::BlockDevice;
use cairn_vfs::{Errno, Result};
use rustc_hash::{FxHashMap as HashMap, FxHashSet};

use crate::cleaner::policy::{self, Policy, SegmentState, SegmentUsage, Thresholds, UsageTable};
use crate::engine::{
    BS, CheckpointWrite, Lfs, RESERVE_SEGMENTS, State, corrupt, slot_of, slot_parent,
};
use crate::format::BLOCK_SIZE;
use crate::format::inode;
use crate::format::summary::{self, Entry, Kind, Summary};
use crate::format::superblock::Superblock;
use crate::format::tables;

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
    /// Victims read under the engine's lock: every victim of a pass in the foreground; of
    /// a background pass, those the segments it read without the lock missed.
    pub segments_read_under_lock: u64,
    /// Live blocks written back (data, indirect, xattr; inodes and tables are rewritten by
    /// the checkpoint that ends the pass).
    pub blocks_moved: u64,
    /// Passes of the greedy policy run because the mount's policy found nothing worth
    /// cleaning.
    pub greedy_fallbacks: u64,
    /// Passes refused: the victims would not give back a segment more than they fill.
    pub refused: u64,
    /// Background passes whose moves ran in slices, calls between (the rest ran in one
    /// hold: too few clean segments to reserve their room).
    pub split_passes: u64,
    /// The longest hold of the engine's lock by a background pass, in microseconds of
    /// wall time, by what it did: loading the inodes its victims name, choosing victims
    /// and finding their live blocks (and reserving their room), moving a slice of them,
    /// preparing its checkpoint; and a pass that could not reserve its room, in one hold
    /// from its choice to its checkpoint's preparation (counted apart: it is the longest).
    pub longest_load_hold_us: u64,
    pub longest_choose_hold_us: u64,
    /// Of a background pass choosing its victims over several holds, the longest of those
    /// reading them (`CHOOSE_SLICE` per hold); the last hold, which checks again what they
    /// found and reserves the room, is `longest_choose_hold_us`.
    pub longest_collect_hold_us: u64,
    pub longest_move_hold_us: u64,
    pub longest_checkpoint_hold_us: u64,
    pub longest_whole_hold_us: u64,
    /// Of the hold choosing the victims, the longest spent flushing what calls buffered
    /// since the pass's own flush hold (the rest is the liveness checks and the room
    /// count).
    pub longest_choose_flush_us: u64,
    /// The pass's flush of what calls buffered, in a hold of its own before it reads its
    /// victims (the hold that picks them).
    pub longest_first_flush_hold_us: u64,
    /// The flush after a pass's moves: what calls buffered since its last slice, and
    /// whatever inode the slices could not write ahead (a call buffered data for it).
    pub longest_moves_flush_hold_us: u64,
    /// The most log blocks that flush wrote in one pass (each slice writes the inodes and
    /// indirect blocks of the files it moved last, so this is what came since).
    pub most_moves_flush_blocks: u64,
    /// Inodes the slices of the moves wrote ahead of that flush.
    pub inodes_written_by_slices: u64,
    /// The longest hold writing inode map blocks ahead of a pass's checkpoint
    /// (`IMAP_AHEAD_SLICE` per hold), and the blocks so written.
    pub longest_imap_ahead_hold_us: u64,
    pub imap_blocks_ahead: u64,
    /// Calls that waited for a background pass to give room back (`Lfs::write_as`: the
    /// throttle, or room a pass reserved), the longest such wait and their sum: stalls of
    /// calls that no lock hold shows.
    pub room_waits: u64,
    pub longest_room_wait_us: u64,
    pub room_wait_us: u64,
}

/// Which lock hold of a background pass a time is for (`CleanerStats`).
#[derive(Clone, Copy)]
enum Hold {
    Load,
    Choose,
    Collect,
    Move,
    Checkpoint,
    Whole,
    ChooseFlush,
    FirstFlush,
    MovesFlush,
    ImapAhead,
}

impl CleanerStats {
    /// A call waited for room since `since` (`Lfs::write_as`).
    pub(crate) fn waited_for_room(&mut self, since: std::time::Instant) {
        let us = since.elapsed().as_micros().min(u64::MAX as u128) as u64;
        self.room_waits += 1;
        self.room_wait_us = self.room_wait_us.saturating_add(us);
        self.longest_room_wait_us = self.longest_room_wait_us.max(us);
    }

    fn held(&mut self, hold: Hold, since: std::time::Instant) {
        let us = since.elapsed().as_micros().min(u64::MAX as u128) as u64;
        let m = match hold {
            Hold::Load => &mut self.longest_load_hold_us,
            Hold::Choose => &mut self.longest_choose_hold_us,
            Hold::Collect => &mut self.longest_collect_hold_us,
            Hold::Move => &mut self.longest_move_hold_us,
            Hold::Checkpoint => &mut self.longest_checkpoint_hold_us,
            Hold::Whole => &mut self.longest_whole_hold_us,
            Hold::ChooseFlush => &mut self.longest_choose_flush_us,
            Hold::FirstFlush => &mut self.longest_first_flush_hold_us,
            Hold::MovesFlush => &mut self.longest_moves_flush_hold_us,
            Hold::ImapAhead => &mut self.longest_imap_ahead_hold_us,
        };
        *m = (*m).max(us);
    }
}

/// Writes the partial segments a pass's hold sealed without waking the log writer
/// (`LogWriter::quiet`), on the pass's own thread once the hold is over. Woken at the end
/// of a hold instead, the writer (at the calls' priority) often ran only once the pass had
/// taken the lock again, and its hashing and device writes stretched that next hold
/// (docs/bench/history.md); here they run at the pass's lowered priority, with no lock
/// held, calls preempting them. The writes stay in seal order (`Sequencer::drain` takes the
/// writer token). A failed write is the log's: the next hold's `check_log_ok` reports it.
fn write_sealed(q: &Option<Arc<crate::sequencer::Sequencer>>) {
    if let Some(q) = q
        && let Err(e) = q.drain()
    {
        ::log::debug!("lfs cleaner: {e}");
    }
}

/// Runs `f` on `st` with the partial segments it seals left for [`write_sealed`].
fn quietly<T>(st: &mut State, f: impl FnOnce(&mut State) -> T) -> T {
    st.log.quiet = true;
    let r = f(st);
    st.log.quiet = false;
    r
}

/// A segment's partial segments: each summary with its blocks.
pub(crate) type Scan = Vec<(Summary, Vec<u8>)>;

/// Victims read before the pass took the lock (`Lfs::clean_step`), by segment.
pub(crate) type Prescans = HashMap<u32, Scan>;

/// The partial segments of segment `seg`, as written (summary checksum, position and data
/// checksum checked; the first that fails ends the segment). Needs nothing the engine's
/// lock guards: the background pass reads its victims without it, pinned (`readgate.rs`).
pub(crate) fn scan_segment(sb: &Superblock, dev: &Arc<dyn BlockDevice>, seg: u32) -> Scan {
    let mut out = Vec::new();
    let mut off = 0u32;
    while off + 2 <= sb.segment_blocks {
        let mut b = vec![0u8; BLOCK_SIZE];
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
        let mut data = vec![0u8; s.entries.len() * BLOCK_SIZE];
        if dev
            .read_blocks(sb.seg_start(seg) + off as u64 + 1, &mut data)
            .is_err()
            || !s.holds(&data)
        {
            break;
        }
        off += 1 + s.entries.len() as u32;
        let skip = s.skip_rest();
        out.push((s, data));
        if skip {
            break;
        }
    }
    out
}

/// A live data block found in a victim.
pub(crate) struct Moved {
    ino: u64,
    /// The inode's version the summary named (re-checked when the block is moved).
    version: u32,
    lbn: u64,
    addr: u64,
    mtime: u64,
    data: Vec<u8>,
}

impl State {
    /// The partial segments of segment `seg`, as written (see [`scan_segment`]).
    pub(crate) fn scan_segment(&mut self, seg: u32) -> Scan {
        scan_segment(&self.sb, &self.dev, seg)
    }

    fn version_of(&self, ino: u64) -> Option<u32> {
        let e = self.imap.get(ino)?;
        match self.nodes.get(&ino) {
            Some(n) => Some(n.inode.version),
            None if e.addr != 0 => Some(e.version),
            None => None,
        }
    }

    /// Finds the live blocks of the partial segments `scan` (one victim's, from
    /// [`State::scan_segment`]) and notes in `w` what the pass must write for them, without
    /// changing anything: data blocks to move (in the policy's order, later), and the
    /// indirect blocks, xattr blocks, inodes and inode map blocks to rewrite.
    pub(crate) fn collect_live(&mut self, scan: &[(Summary, Vec<u8>)], w: &mut Work) -> Result<()> {
        for (s, data) in scan {
            let base = self.sb.seg_start(s.seg) + s.off as u64 + 1;
            for (i, e) in s.entries.iter().enumerate() {
                let addr = base + i as u64;
                let blk = &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                match e.kind {
                    Kind::Data => {
                        #[cfg(any(test, feature = "planted"))]
                        let trust = self.planted == crate::engine::Planted::NoRevalidation;
                        #[cfg(not(any(test, feature = "planted")))]
                        let trust = false;
                        if self.version_of(e.ino) != Some(e.version)
                            || self.dirty.has_block(e.ino, e.lbn)
                            || (!trust && self.map(e.ino)?.get(&e.lbn) != Some(&addr))
                        {
                            continue;
                        }
                        self.map(e.ino)?;
                        // Nanoseconds: in milliseconds many blocks tie, and the order of
                        // ties would depend on how fast the workload ran.
                        let t = self.node(e.ino)?.inode.mtime;
                        let mtime = (t.sec.max(0) as u64)
                            .saturating_mul(1_000_000_000)
                            .saturating_add(t.nsec as u64);
                        // The new address goes into the indirect block naming it, and
                        // into every block above that one.
                        w.slot_chain(e.ino, slot_of(e.lbn));
                        w.add_inode(e.ino);
                        w.moved.push(Moved {
                            ino: e.ino,
                            version: e.version,
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
                            // Rewritten elsewhere, the block's parent must name the new
                            // copy: the parent is rewritten too (up to the inode).
                            w.slot_chain(e.ino, Some(e.lbn));
                            w.add_inode(e.ino);
                            w.found.push(Found::Indirect {
                                ino: e.ino,
                                version: e.version,
                                slot: e.lbn,
                                addr,
                            });
                        } else if e.kind == Kind::Xattr && self.xattr_live(e.ino, addr)? {
                            // Any block of the list moves the whole list (a chain's blocks
                            // name each other).
                            let x = self.load_xattrs(e.ino)?.clone();
                            w.xattrs.push((e.ino, x));
                            w.add_inode(e.ino);
                            w.found.push(Found::Xattr {
                                ino: e.ino,
                                version: e.version,
                                addr,
                            });
                        }
                    }
                    Kind::Inode => {
                        for r in inode::decode_block(blk).map_err(corrupt)? {
                            let live = self.imap.addr(r.ino) == addr;
                            if live && r.mode != 0 {
                                self.node(r.ino)?;
                                w.add_inode(r.ino);
                                w.found.push(Found::Inode { ino: r.ino, addr });
                            }
                        }
                    }
                    Kind::Imap => {
                        if self.imap.block_addrs().get(e.lbn as usize) == Some(&addr) {
                            w.imap.insert(e.lbn as u32);
                            w.found.push(Found::Imap {
                                lbn: e.lbn as u32,
                                addr,
                            });
                        }
                    }
                    // Every checkpoint rewrites the whole usage table; the log is dead.
                    Kind::Usage | Kind::DirLog => {}
                }
            }
        }
        Ok(())
    }

    /// Blocks of payload (no summaries) the pass writes for `a` and `b` together before
    /// the usage table: the moved data, the indirect and xattr blocks, the inodes 16 to a
    /// block, and the inode map blocks (those already dirty and those of every inode
    /// rewritten). An upper bound: an indirect block left with no pointer is not written.
    ///
    /// Called for every candidate victim with `a` the victims taken so far, so it costs
    /// what `b` holds and the few inode map blocks, never `a`'s inodes: counting their map
    /// blocks again for each candidate was half a choosing hold's time (a profile of the
    /// overwrite benchmark: thousands of inodes, tens of candidates).
    fn work_blocks(&self, a: &Work, b: &Work) -> u64 {
        let slots = a.slots.len() + b.slots.iter().filter(|s| !a.slots.contains(s)).count();
        let inodes = a.inodes.len() + b.inodes.iter().filter(|i| !a.inodes.contains(i)).count();
        let dirty = self.imap.dirty_blocks();
        let mut imap: BTreeSet<u32> = a.imap_blocks().filter(|i| !dirty.contains(i)).collect();
        imap.extend(b.imap_blocks().filter(|i| !dirty.contains(i)));
        // `inode_imap` is every inode's map block (an inode added another way would be
        // counted without it).
        debug_assert!([a, b].iter().all(|w| {
            w.inodes.iter().all(|&i| {
                w.inode_imap
                    .contains(&((i / tables::PER_BLOCK as u64) as u32))
            })
        }));
        (a.moved.len() + b.moved.len() + slots + a.xattrs.len() + b.xattrs.len()) as u64
            + (inodes as u64).div_ceil(inode::PER_BLOCK as u64)
            + (dirty.len() + imap.len()) as u64
    }

    /// The clean segments a background pass reserves before calls run between its slices
    /// (`State::pass_reserve`), for `payload` blocks written in `slices` slices: the segments its writes enter, with two blocks more per slice (each slice
    /// closes the partial segment the pass was filling, a summary, and writes the inodes
    /// of the files it moved last in a block of inodes of its own, which `payload`'s
    /// count of 16 to a block may not have counted), two for the flush before its
    /// checkpoint (its summary, and its block of the inodes the slices could not write)
    /// and a block more, and a segment more (calls' data may leave the log at the start
    /// of a segment the count began in the middle of). One count for the reservation and
    /// its shrinking as the slices go. An inode a call dirties again after its slice wrote
    /// it is written again by the next flush: that is the call's to count (its admission,
    /// `State::space_left`, counts every dirty inode), as the data it buffered with it.
    pub(crate) fn slice_reserve(&self, payload: u64, slices: u64) -> u32 {
        // The summary of the flush before the checkpoint too (`Lfs::clean_pass_unlocked`).
        self.pass_log(payload + 2 * slices + 3).1 as u32 + 1
    }

    /// What a pass writing `payload` blocks before the usage table does to the log, found
    /// by running the log writer's rules (`log.rs`) on counts alone from where the head is:
    /// `(blocks, segments)` — the log blocks it takes (payload, summaries, the end of a
    /// segment skipped) and the segments it enters, each of which takes a clean segment
    /// as the log's next one. The pass pushes the payload (a partial segment written
    /// whenever the current one is full: at the segment's end or at `MAX_ENTRIES`), makes
    /// room for the whole usage table in one partial segment (writing what is pending, and
    /// ending the segment early if the rest is still too small), pushes the table and
    /// writes the commit. Exact, not an estimate: with small segments the few blocks a
    /// formula would add to be safe are what decides whether a pass pays for itself.
    pub(crate) fn pass_log(&self, payload: u64) -> (u64, u64) {
        let seg = self.sb.segment_blocks as u64;
        let max = summary::MAX_ENTRIES as u64;
        let nu = self.usage.block_addrs().len() as u64;
        let mut off = self.log.off as u64;
        let mut pending = self.log.pending_len() as u64;
        let (mut blocks, mut entered) = (0u64, 0u64);
        let room =
            |off: u64, pending: u64| seg.saturating_sub(off + 1).min(max).saturating_sub(pending);
        // One partial segment of `n` blocks (`LogWriter::write`).
        let mut write = |off: &mut u64, n: u64, skip: bool| {
            blocks += n + 1;
            *off += n + 1;
            if *off + 2 > seg || skip {
                blocks += seg.saturating_sub(*off);
                *off = 0;
                entered += 1;
            }
        };
        let mut left = payload;
        while left > 0 {
            let r = room(off, pending);
            if r == 0 {
                write(&mut off, pending, false);
                pending = 0;
                continue;
            }
            let k = r.min(left);
            pending += k;
            left -= k;
        }
        if room(off, pending) < nu {
            if pending > 0 {
                write(&mut off, pending, false);
                pending = 0;
            }
            if room(off, pending) < nu {
                write(&mut off, 0, true);
            }
        }
        // The table fits the partial segment now (it is never larger than one).
        write(&mut off, pending + nu, false);
        (blocks, entered)
    }

    /// One cleaning pass: plans with `policy` towards `th`, moves the victims' live blocks
    /// to the log head (data in the policy's grouping), and checkpoints. Returns the
    /// segments cleaned.
    pub fn clean_pass(&mut self, policy: Policy, th: Thresholds) -> Result<u32> {
        self.check_log_ok()?;
        let r = self.clean_pass_inner(policy, th, Gain::Segment);
        self.note_log_result(r)
    }

    /// The foreground cleaner's last resort, once no pass gives back a whole segment: a
    /// greedy pass that gives back any room at all (its victims hold more blocks than it
    /// writes). Near a full disk each such pass moves the log's head on by a few blocks
    /// without changing the clean count, at a high write cost (004 §3.4, Fig. 3); enough
    /// of them bring a segment back. Returns the segments cleaned.
    pub fn clean_pass_any_gain(&mut self, th: Thresholds) -> Result<u32> {
        self.check_log_ok()?;
        let r = self.clean_pass_inner(Policy::GREEDY, th, Gain::Blocks);
        self.note_log_result(r)
    }

    fn clean_pass_inner(&mut self, policy: Policy, th: Thresholds, need: Gain) -> Result<u32> {
        let Some(mut pass) = self.clean_pass_prepare(policy, th, need, &mut Prescans::default())?
        else {
            return Ok(0);
        };
        if let Some(w) = pass.cp.take() {
            w.write(&self.dev)?;
            self.checkpoint_finish(w);
        }
        Ok(self.pass_done(&pass.victims))
    }

    /// A pass up to its checkpoint's device flushes, in one hold of the lock: victims
    /// chosen ([`State::clean_pass_choose`]), their live blocks moved to the log head, and
    /// the checkpoint prepared. `None` when no pass pays for itself.
    pub(crate) fn clean_pass_prepare(
        &mut self,
        policy: Policy,
        th: Thresholds,
        need: Gain,
        prescans: &mut Prescans,
    ) -> Result<Option<Pass>> {
        let Some(c) = self.clean_pass_choose(policy, th, need, Room::Whole, prescans)? else {
            return Ok(None);
        };
        // What the room rule counted is what the pass writes (checked in tests, where a
        // wrong count would otherwise show only as a rare failed log write).
        let predicted = self.pass_log(c.payload);
        let (seg0, off0, entered0) = (self.log.seg, self.log.off, self.log.segments_entered);
        let written0 = self.log.blocks_written;
        let mut moved = self.apply_marks(policy, c.work)?.into_iter();
        self.move_live(&mut moved, usize::MAX)?;
        let cp = self.checkpoint_prepare()?;
        let entered = self.log.segments_entered - entered0;
        debug_assert!(
            entered <= predicted.1,
            "pass entered {entered} segments, counted {predicted:?} (from {seg0}:{off0})"
        );
        debug_assert!(
            self.log.blocks_written - written0 <= predicted.0,
            "pass wrote {} blocks, counted {predicted:?}",
            self.log.blocks_written - written0
        );
        Ok(Some(Pass {
            victims: c.victims,
            cp,
        }))
    }

    /// A pass's choice: what is buffered flushed first, victims chosen (read from
    /// `prescans` when the caller read them without the lock, from the device here
    /// otherwise) and their live blocks found against the state now — a block is live only
    /// if the inode map or its file's pointer still names its address, so whatever calls
    /// overwrote while the victims were read is dropped — within the room rule. Nothing
    /// is moved yet. `None` when no pass pays for itself. In one hold: the foreground's
    /// choice (a background pass takes its victims a few per hold, `Lfs::choose_sliced`).
    pub(crate) fn clean_pass_choose(
        &mut self,
        policy: Policy,
        th: Thresholds,
        need: Gain,
        room: Room,
        prescans: &mut Prescans,
    ) -> Result<Option<Chosen>> {
        let mut c = self.choose_begin(policy, th, need, room)?;
        self.choose_step(&mut c, prescans, usize::MAX, &[])?;
        Ok(self.choose_end(c))
    }

    /// A choice begun: what is buffered flushed (the checkpoint ending the pass would write
    /// it anyway, and the room counted is then the pass's own), the candidates ranked.
    pub(crate) fn choose_begin(
        &mut self,
        policy: Policy,
        th: Thresholds,
        need: Gain,
        room: Room,
    ) -> Result<Choosing> {
        self.settle_checkpoint()?;
        let t = Instant::now();
        self.flush_inner()?;
        self.cleaner.held(Hold::ChooseFlush, t);
        let now_s = self.clock();
        let head_free = (self.sb.segment_blocks - self.log.off) as u64 * BS;
        let plan = policy::plan(&View(self), policy.selection, now_s, th, head_free);
        let planned = plan.victims.len();
        let mut cands = plan.victims;
        // The plan's victims first; then, while the pass would not pay for itself, more
        // segments, the least utilized first (004 §3.3: the cleaner "reads a number of
        // segments into memory, identifies the live data, and writes the live data back
        // to a smaller number of clean segments"). What a pass writes besides the live
        // data — an indirect block and an inode per file touched, the inode map and usage
        // table blocks, the summaries — is shared by all its victims: with small segments
        // nearly full no single victim frees more than that costs, several together do.
        // The least utilized, as greedy takes them, whatever the policy: they are what
        // makes the pass pay.
        cands.extend(policy::rank(&View(self), policy::Selection::Greedy, now_s));
        Ok(Choosing {
            cands,
            planned,
            next: 0,
            need,
            room,
            victims: Vec::new(),
            work: Work::default(),
            misfits: 0,
            blocks_read: 0,
            done: false,
        })
    }

    /// The room a pass may fill now, in clean segments: those a background pass between
    /// its holds has reserved are not this pass's.
    fn pass_room(&self, room: Room) -> u64 {
        let clean = self.clean_segments().saturating_sub(self.pass_reserve) as u64;
        match room {
            Room::Whole => clean,
            // Below the standing reserve, all there is (never more than the whole room).
            Room::Shared => {
                let kept = RESERVE_SEGMENTS as u64;
                clean.min(kept) + clean.saturating_sub(kept) / 2
            }
        }
    }

    /// Does a pass writing `work` for `victims` give back more than it fills, or does it
    /// only move data around (every candidate full of live blocks)? A segment more than it
    /// enters, or in the last resort any blocks more than it writes. Never fewer clean
    /// segments than before either way: the log enters at most as many segments as it
    /// frees.
    fn pass_gains(&self, need: Gain, victims: &[u32], work: &Work) -> bool {
        let seg_blocks = self.sb.segment_blocks as u64;
        let (total, entered) = self.pass_log(self.work_blocks(work, &Work::default()));
        let v = victims.len() as u64;
        !victims.is_empty()
            && match need {
                Gain::Segment => v > entered,
                Gain::Blocks => v * seg_blocks > total && v >= entered,
            }
    }

    /// Takes candidates of `c` until the pass pays or none is left, reading (finding the
    /// live blocks of) at most `budget` of them: one hold of a choice. `own` are segments
    /// the pass itself pins (its reads before the lock), which do not stop it taking them.
    pub(crate) fn choose_step(
        &mut self,
        c: &mut Choosing,
        prescans: &mut Prescans,
        budget: usize,
        own: &[u32],
    ) -> Result<usize> {
        // The room rule. A victim becomes clean only once the checkpoint ending the pass
        // is durable, so everything the pass writes — the live blocks, the indirect blocks
        // and inodes that name their new addresses, the inode map and usage table blocks,
        // the summaries — must fit in what the log can still enter: the rest of its head
        // and the clean segments, each segment it enters taking one (`pass_log`). Each
        // victim is read and its live blocks counted exactly before it is taken; one that
        // would not fit is left and the next one tried, so a nearly full first choice does
        // not hide emptier ones behind it. Counted against the state of this hold; a
        // choice over several holds counts again at its end (`State::choose_commit`).
        let clean = self.pass_room(c.room);
        let fits = |st: &State, payload: u64| st.pass_log(payload).1 <= clean;
        let mut read = 0;
        while c.next < c.cands.len() {
            if read >= budget {
                return Ok(read);
            }
            let (i, v) = (c.next, c.cands[c.next]);
            if i >= c.planned {
                if self.pass_gains(c.need, &c.victims, &c.work) || c.misfits >= MAX_MISFITS {
                    break;
                }
                if c.victims.contains(&v) {
                    c.next += 1;
                    continue;
                }
            }
            c.next += 1;
            // A segment a read outside the lock holds cannot turn clean at this pass's
            // checkpoint (`readgate.rs`); the room rule counts on every victim doing so.
            // The pass's own pin is no such read.
            if self.read_holds(v, own.contains(&v) as u32) {
                continue;
            }
            // A segment clean by now (a checkpoint between the holds of a background
            // choice released it) or being written is no victim.
            let u = self.usage[v as usize];
            if !u.dirty || v == self.log.seg || v == self.log.next_seg {
                continue;
            }
            let live = u.live_bytes as u64;
            if live == 0 {
                c.victims.push(v);
                continue;
            }
            // Live bytes alone (inodes count 256 each) already too many: not read.
            if !fits(
                self,
                self.work_blocks(&c.work, &Work::default()) + live / BS,
            ) {
                c.misfits += (i >= c.planned) as u32;
                continue;
            }
            let scan = match prescans.remove(&v) {
                Some(scan) => scan,
                None => {
                    self.cleaner.segments_read_under_lock += 1;
                    self.scan_segment(v)
                }
            };
            read += 1;
            let mut w = Work::default();
            self.collect_live(&scan, &mut w)?;
            if !fits(self, self.work_blocks(&c.work, &w)) {
                c.misfits += (i >= c.planned) as u32;
                continue;
            }
            c.work.merge(w);
            c.blocks_read += scan
                .iter()
                .map(|(s, _)| 1 + s.entries.len() as u64)
                .sum::<u64>();
            c.victims.push(v);
        }
        c.done = true;
        Ok(read)
    }

    /// The end of a choice: `None` (counted refused) when the victims taken do not pay.
    pub(crate) fn choose_end(&mut self, c: Choosing) -> Option<Chosen> {
        if !self.pass_gains(c.need, &c.victims, &c.work) {
            self.cleaner.refused += 1;
            return None;
        }
        for &v in &c.victims {
            if self.usage[v as usize].live_bytes == 0 {
                self.cleaner.empty_segments_cleaned += 1;
            }
        }
        self.cleaner.blocks_read += c.blocks_read;
        let payload = self.work_blocks(&c.work, &Work::default());
        Some(Chosen {
            victims: c.victims,
            work: c.work,
            payload,
        })
    }

    /// The last hold of a choice made over several: calls ran between its holds, so what
    /// they buffered is flushed (the room counted is then the pass's own again), what the
    /// victims were found to hold is checked again against the state now
    /// ([`State::recheck`]: a file deleted, rewritten or truncated meanwhile no longer
    /// holds them), and the room rule and the gain are counted again — calls took clean
    /// segments meanwhile. `None` (refused) when the pass no longer fits or pays.
    pub(crate) fn choose_commit(&mut self, mut c: Choosing) -> Result<Option<Chosen>> {
        let t = Instant::now();
        self.flush_inner()?;
        self.cleaner.held(Hold::ChooseFlush, t);
        let changed = self.dirty.take_watched();
        #[cfg(any(test, feature = "planted"))]
        let changed = if self.planted == crate::engine::Planted::ChoiceWatchBlind {
            changed.map(|_| Default::default())
        } else {
            changed
        };
        let w = std::mem::take(&mut c.work);
        c.work = match changed {
            Some(changed) => self.recheck_watched(w, &c.victims, &changed)?,
            None => self.recheck(w, &c.victims)?,
        };
        let clean = self.pass_room(c.room);
        let fits =
            |st: &State, w: &Work| st.pass_log(st.work_blocks(w, &Work::default())).1 <= clean;
        // Calls took clean segments meanwhile: the victims taken last go back, one by one,
        // until the rest fit (giving the whole pass up wasted its reads and its choice, and
        // the next pass read them again: a pass in twelve on the overwrite benchmark).
        while !fits(self, &c.work) && c.victims.len() > 1 {
            c.victims.pop();
            c.work = self.recheck(std::mem::take(&mut c.work), &c.victims)?;
        }
        let fits = fits(self, &c.work);
        // A victim released meanwhile would be counted as cleaned by this pass; none is
        // (the pass pins its victims between its holds), but a victim the log now writes
        // would be no victim at all.
        let sound = c
            .victims
            .iter()
            .all(|&v| self.usage[v as usize].dirty && v != self.log.seg && v != self.log.next_seg);
        if !fits || !sound {
            self.cleaner.refused += 1;
            return Ok(None);
        }
        Ok(self.choose_end(c))
    }

    /// What `w` found live, as it is now: each block found live in an earlier hold is kept
    /// only if what named it then names it still — the data block's file has the same
    /// version, its block map points the block's `lbn` at its address and nothing newer
    /// is buffered; the indirect block's file has the same version and names it for its
    /// slot; the xattr block's file has the same version and names it (its list loaded
    /// again, as it is now); the inode map places the inode record's inode at its
    /// address; the inode map block is the table's current one. The marks
    /// ([`State::apply_marks`]) are derived again from what is kept, so a file deleted or
    /// rewritten meanwhile is neither marked dirty (which would write a deleted inode
    /// back) nor counted. What lies outside `victims` is dropped too (victims given back).
    pub(crate) fn recheck(&mut self, w: Work, victims: &[u32]) -> Result<Work> {
        #[cfg(any(test, feature = "planted"))]
        if self.planted == crate::engine::Planted::NoChoiceRecheck {
            return Ok(w);
        }
        let mut out = Work::default();
        let sb = self.sb.clone();
        let taken = |addr: u64| sb.seg_of(addr).is_some_and(|s| victims.contains(&s));
        for m in w.moved {
            if !taken(m.addr)
                || self.version_of(m.ino) != Some(m.version)
                || self.dirty.has_block(m.ino, m.lbn)
                || self.map(m.ino)?.get(&m.lbn) != Some(&m.addr)
            {
                continue;
            }
            out.slot_chain(m.ino, slot_of(m.lbn));
            out.add_inode(m.ino);
            out.moved.push(m);
        }
        for f in w.found {
            if !taken(f.addr()) {
                continue;
            }
            match f {
                Found::Indirect {
                    ino,
                    version,
                    slot,
                    addr,
                } => {
                    if self.version_of(ino) != Some(version) {
                        continue;
                    }
                    self.map(ino)?;
                    if self.node(ino)?.ind.get(&slot) == Some(&addr) {
                        out.slot_chain(ino, Some(slot));
                        out.add_inode(ino);
                        out.found.push(f);
                    }
                }
                Found::Xattr { ino, version, addr } => {
                    if self.version_of(ino) != Some(version) || !self.xattr_live(ino, addr)? {
                        continue;
                    }
                    let x = self.load_xattrs(ino)?.clone();
                    out.xattrs.push((ino, x));
                    out.add_inode(ino);
                    out.found.push(f);
                }
                Found::Inode { ino, addr } => {
                    if self.imap.addr(ino) == addr {
                        self.node(ino)?;
                        out.add_inode(ino);
                        out.found.push(f);
                    }
                }
                Found::Imap { lbn, addr } => {
                    if self.imap.block_addrs().get(lbn as usize) == Some(&addr) {
                        out.imap.insert(lbn);
                        out.found.push(f);
                    }
                }
            }
        }
        Ok(out)
    }

    /// [`State::recheck`] of the items of `w` whose inode calls changed since the choice
    /// began (`changed`, the dirty set's watch), and of every inode map block found; the
    /// rest is kept as found. Sound because what makes an item live is its own inode's
    /// state — version, block map and pointers, inode map entry, buffered blocks, xattr
    /// list — and every change to that state passes through the dirty set, which the
    /// watch records (`dirty.rs`); the inode map blocks' places change at checkpoints, so
    /// those are all checked again. The victims must be those the items were found in
    /// (none given back yet). On the overwrite benchmark the choice finds a few thousand
    /// items and the calls between its holds change a few tens of files: checking every
    /// item again was most of the choice's last hold, every call waiting for it.
    ///
    /// The kept items' marks stay as found; those of an inode changed are derived again
    /// from what the re-check keeps. The inode map blocks of the inodes rewritten
    /// (`inode_imap`) stay a superset: they only count the pass's writes, from above.
    pub(crate) fn recheck_watched(
        &mut self,
        w: Work,
        victims: &[u32],
        changed: &FxHashSet<u64>,
    ) -> Result<Work> {
        #[cfg(any(test, feature = "planted"))]
        if self.planted == crate::engine::Planted::NoChoiceRecheck {
            return Ok(w);
        }
        let Work {
            moved,
            slots,
            xattrs,
            mut inodes,
            imap: _,
            inode_imap,
            found,
        } = w;
        let (moved_again, moved_kept): (Vec<Moved>, Vec<Moved>) =
            moved.into_iter().partition(|m| changed.contains(&m.ino));
        let (found_again, found_kept): (Vec<Found>, Vec<Found>) = found
            .into_iter()
            .partition(|f| f.ino().is_none_or(|i| changed.contains(&i)));
        let again = Work {
            moved: moved_again,
            found: found_again,
            ..Work::default()
        };
        let again = self.recheck(again, victims)?;
        inodes.retain(|i| !changed.contains(i));
        let mut out = Work {
            moved: moved_kept,
            slots: slots
                .into_iter()
                .filter(|(i, _)| !changed.contains(i))
                .collect(),
            xattrs: xattrs
                .into_iter()
                .filter(|(i, _)| !changed.contains(i))
                .collect(),
            inodes,
            imap: BTreeSet::new(),
            inode_imap,
            found: found_kept,
        };
        out.merge(again);
        Ok(out)
    }

    /// Counts a pass whose checkpoint is durable: returns its victims now clean.
    pub(crate) fn pass_done(&mut self, victims: &[u32]) -> u32 {
        let cleaned = victims
            .iter()
            .filter(|&&v| !self.usage[v as usize].dirty)
            .count() as u32;
        self.pass_frees = 0;
        self.cleaner.passes += 1;
        self.cleaner.segments_cleaned += cleaned as u64;
        cleaned
    }

    /// The segments a pass with `policy` would read first (the plan's victims, then the
    /// least utilized), none the log is writing: what the background pass reads before it
    /// takes the lock for the pass itself.
    pub(crate) fn pass_candidates(&self, policy: Policy, th: Thresholds, extra: usize) -> Vec<u32> {
        let now_s = self.clock();
        let head_free = (self.sb.segment_blocks - self.log.off) as u64 * BS;
        let plan = policy::plan(&View(self), policy.selection, now_s, th, head_free);
        let mut out = plan.victims;
        let more = policy::rank(&View(self), policy::Selection::Greedy, now_s);
        let planned = out.len();
        for v in more {
            if out.len() >= planned + extra {
                break;
            }
            if !out.contains(&v) {
                out.push(v);
            }
        }
        let (head, next) = (self.log.seg, self.log.next_seg);
        out.retain(|&v| {
            v != head
                && v != next
                && !self.write_holds(v)
                && self
                    .usage
                    .get(v as usize)
                    .is_some_and(|u| u.dirty && u.live_bytes > 0)
        });
        out
    }

    /// Marks what `w` found live besides data blocks for the checkpoint (or an earlier
    /// flush) to rewrite, and returns its data blocks in the policy's grouping, to be moved
    /// ([`State::move_live`]). Called in the hold that found them, or that checked them
    /// again ([`State::recheck`]): nothing changed since.
    fn apply_marks(&mut self, policy: Policy, w: Work) -> Result<Vec<Moved>> {
        let Work {
            mut moved,
            slots,
            xattrs,
            inodes,
            imap,
            inode_imap: _,
            found: _,
        } = w;
        // Their inodes are among `inodes` (`collect_live`), dirtied below.
        for (ino, s) in slots {
            self.node(ino)?.dirty_slots.insert(s);
            self.dirty.note_meta(ino);
        }
        for (ino, x) in xattrs {
            let n = self.node(ino)?;
            n.xattrs.get_or_insert(x);
            n.xattr_dirty = true;
            self.dirty.note_meta(ino);
        }
        for ino in inodes {
            self.mark_dirty(ino);
        }
        for i in imap {
            self.imap.mark_block_dirty(i);
        }
        // What was just marked is counted before any flush (checked in tests: the sum
        // over the meta inodes against every dirty inode's).
        #[cfg(debug_assertions)]
        self.buffered_blocks(true);
        policy.grouping.arrange(&mut moved, |m| m.mtime);
        Ok(moved)
    }

    /// Moves up to `n` of the live data blocks `moved` (from [`State::apply_marks`]) to the
    /// log head, each re-checked first: with calls run since it was found live (a pass
    /// moving in slices, `Lfs::clean_pass_unlocked`), a block the file no longer points
    /// at — overwritten, buffered anew, truncated, the file deleted — is dropped, as a
    /// block overwritten while the victims were read is by `collect_live`.
    fn move_live(&mut self, moved: &mut impl Iterator<Item = Moved>, n: usize) -> Result<()> {
        #[cfg(any(test, feature = "planted"))]
        let planted = self.planted == crate::engine::Planted::NoRevalidation;
        #[cfg(not(any(test, feature = "planted")))]
        let planted = false;
        for m in moved.by_ref().take(n) {
            if !planted
                && (self.version_of(m.ino) != Some(m.version)
                    || self.dirty.has_block(m.ino, m.lbn)
                    || self.map(m.ino)?.get(&m.lbn) != Some(&m.addr))
            {
                continue;
            }
            let e = Entry {
                kind: Kind::Data,
                version: m.version,
                ino: m.ino,
                lbn: m.lbn,
            };
            let addr = self.push(e, m.data, BLOCK_SIZE as u32)?;
            let old = self.set_map(m.ino, m.lbn, addr)?;
            debug_assert!(old == m.addr || planted, "moved {} over {old}", m.addr);
            self.kill(old, BLOCK_SIZE as u32);
            self.mark_dirty(m.ino);
            self.cleaner.blocks_moved += 1;
        }
        Ok(())
    }
}

/// The background cleaner: each pass reads its victims without the engine's lock, and
/// makes its checkpoint's device writes without it.
impl Lfs {
    /// One pass of a background cleaning run (started below `clean_start`, going on until
    /// `clean_stop` segments are clean): whether the run goes on. The lock is held in
    /// short holds, never across a device read or flush (`Lfs::clean_pass_unlocked`): to
    /// flush what calls buffered and choose and pin the segments to read
    /// (`pass_candidates`); after reading them, to load the inodes they name, a few per
    /// hold; to choose the victims, find their live blocks and reserve the pass's room; to
    /// move the live blocks a slice per hold; to flush what the moves dirtied; to prepare
    /// the checkpoint; after its device flushes and region, to record it and release the
    /// victims.
    pub(crate) fn clean_step(&self) -> Result<bool> {
        let (policy, th) = {
            let st = self.st.lock();
            if st.thresholds.satisfied(st.clean_ahead()) {
                return Ok(false);
            }
            (st.policy, st.thresholds)
        };
        let mut n = self.clean_pass_unlocked(policy, th)?;
        if n.is_none() && policy.selection != crate::cleaner::policy::Selection::Greedy {
            self.st.lock().cleaner.greedy_fallbacks += 1;
            n = self.clean_pass_unlocked(Policy::GREEDY, th)?;
        }
        let st = self.st.lock();
        Ok(n.unwrap_or(0) > 0 && !st.thresholds.satisfied(st.clean_ahead()))
    }

    /// One pass: `None` if none pays for itself, else the segments it cleaned.
    pub(crate) fn clean_pass_unlocked(
        &self,
        policy: Policy,
        th: Thresholds,
    ) -> Result<Option<u32>> {
        let r = self.clean_pass_unlocked_inner(policy, th);
        if r.is_err() {
            // A pass that failed half-way frees nothing the throttle may count on.
            let mut st = self.st.lock();
            st.pass_reserve = 0;
            st.pass_frees = 0;
        }
        // Writes waiting for room (`Lfs::write_as`) look again.
        let (m, cv) = &self.passes;
        *m.lock() += 1;
        cv.notify_all();
        r
    }

    fn clean_pass_unlocked_inner(&self, policy: Policy, th: Thresholds) -> Result<Option<u32>> {
        // What calls buffered (up to a flush's 8 MiB) goes to the log first, in the hold
        // that picks the segments to read: a flush kills the old copies of every block it
        // writes, and the ranking that picked the victims before it was another one — read
        // before the flush, most victims the choice took were not among those read, and
        // it read them under the lock (10-13 segments, 2-3 ms of a 5 ms hold). The choosing
        // hold then flushes only what came since, so that the room it counts is the pass's
        // own.
        let (segs, pin, sb, dev) = {
            let mut st = self.st.lock();
            let t = Instant::now();
            let r = st.check_log_ok().and_then(|()| st.settle_checkpoint());
            // The partials this hold seals do not wake the log writer: this thread writes
            // them once the hold is over (`write_sealed`), here and after every hold of
            // the pass. At the calls' priority, the writer woken in the hold of this
            // thread (lowered, `yield_to_calls`) took the CPU from it while every call
            // waited for the lock — on the overwrite benchmark's one CPU those holds took
            // 2-10 times their own CPU time.
            let r = r.and_then(|()| quietly(&mut st, State::flush_inner));
            st.note_log_result(r)?;
            let segs = st.pass_candidates(policy, th, PRESCAN_EXTRA);
            let pin = st.gate.pin(segs.clone());
            st.cleaner.held(Hold::FirstFlush, t);
            let out = (segs, pin, st.sb.clone(), Arc::clone(&st.dev));
            let q = st.log.sequencer.clone();
            // Handed to a waiting call, as between the slices of the moves.
            MutexGuard::unlock_fair(st);
            write_sealed(&q);
            out
        };
        let mut pre: Prescans = segs
            .iter()
            .map(|&v| (v, scan_segment(&sb, &dev, v)))
            .collect();
        #[cfg(test)]
        if let Some(h) = &*self.clean_hook.lock() {
            h();
        }
        self.load_named_inodes(&pre)?;
        let room = if self.room_waiters.load(Ordering::Relaxed) > 0 {
            Room::Whole
        } else {
            Room::Shared
        };
        let (mut st, t, c) = self.choose_sliced(policy, th, room, &segs, pin, &mut pre)?;
        let q = st.log.sequencer.clone();
        let Some(c) = c else {
            st.cleaner.held(Hold::Choose, t);
            drop(st);
            write_sealed(&q);
            return Ok(None);
        };
        let (payload, total) = (c.payload, c.work.moved.len());
        let inodes: Vec<u64> = c.work.inodes.iter().copied().collect();
        let victims = c.victims.clone();
        let moved = match st.apply_marks(policy, c.work) {
            Ok(m) => m,
            Err(e) => return st.note_log_result(Err(e)),
        };
        // Which slice writes which inodes ahead (`inodes_by_slice`, over the moves in
        // their order): their number is what the reservation counts.
        let ahead = inodes_by_slice(&moved, inodes);
        let slices = ahead.len() as u64;
        let mut moved = moved.into_iter();
        // The pass's room, reserved before any call runs between its holds (the room
        // rule counted it against the clean segments now): everything it still writes
        // (`State::slice_reserve`).
        let reserve = st.slice_reserve(payload, slices);
        #[cfg(any(test, feature = "planted"))]
        let reserve = if st.planted == crate::engine::Planted::NoPassReserve {
            0
        } else {
            reserve
        };
        if reserve <= st.clean_segments() {
            // Calls run between the slices. The invariant: while they do, the pass's own
            // writes fit in the clean segments it reserved; calls are admitted only beyond
            // them (`State::space_left`), other passes do not count them, and no
            // checkpoint releases a victim before the pass's own (they stay pinned).
            st.pass_reserve = reserve;
            st.pass_frees = victims.len() as u32;
            st.cleaner.split_passes += 1;
            let held = st.gate.pin(victims.clone());
            st.cleaner.held(Hold::Choose, t);
            let mut slice = 0;
            let r = loop {
                // Handed to a call waiting for it, if any: on the one CPU the pass may
                // share with the calls, a plain unlock lets this thread take the lock
                // back before the woken call runs, and the slices would stop calls as
                // one hold did.
                MutexGuard::unlock_fair(st);
                write_sealed(&q);
                #[cfg(test)]
                if let Some(h) = &*self.slice_hook.lock() {
                    h();
                }
                st = self.st.lock();
                let t = Instant::now();
                // The slice's blocks leave the log writer before the lock does: a read
                // planned between two slices finds every block a file points at on the
                // device, in the sequencer or in the cache — never in a partial segment
                // still being filled (the summary this costs is in the reservation). With
                // them go the inodes of the files this slice moved last (and in the first,
                // those rewritten for no data block): written ahead, they leave the flush
                // after the moves only what calls buffered meanwhile.
                let now = ahead.get(slice).map_or(&[][..], Vec::as_slice);
                slice += 1;
                st.log.quiet = true;
                let r = st
                    .check_log_ok()
                    .and_then(|()| st.move_live(&mut moved, MOVE_SLICE))
                    .and_then(|()| {
                        #[cfg(any(test, feature = "planted"))]
                        if st.planted == crate::engine::Planted::NoInodesAhead {
                            return Ok(0);
                        }
                        st.write_inodes_ahead(now)
                    })
                    .and_then(|n| {
                        st.cleaner.inodes_written_by_slices += n;
                        st.close_partial()
                    });
                st.log.quiet = false;
                // What is left to write needs less room: the reservation shrinks with
                // each slice (never grows: the first count allowed for calls moving the
                // head), and writes waiting for room look again.
                let left = payload.saturating_sub((total - moved.len()) as u64);
                let now = st.slice_reserve(left, slices - slice as u64);
                st.pass_reserve = st.pass_reserve.min(now);
                st.cleaner.held(Hold::Move, t);
                if r.is_err() || slice >= ahead.len() {
                    debug_assert!(r.is_err() || moved.len() == 0, "slices left blocks unmoved");
                    break r;
                }
                MutexGuard::unlock_fair(st);
                write_sealed(&q);
                let (m, cv) = &self.passes;
                *m.lock() += 1;
                cv.notify_all();
                st = self.st.lock();
            };
            // What calls buffered meanwhile (and any inode the slices could not write
            // ahead) goes to the log with the last slice, the pass's room still reserved
            // and its victims still held: the checkpoint's hold then writes only what came
            // since, the inode map and the usage table. In one hold, the two were the
            // longest a pass made (3-9 ms on the overwrite benchmark); with every moved
            // inode left to this flush, it still took 7-12 ms.
            let r = r.and_then(|()| {
                let t = Instant::now();
                let b0 = st.log.blocks_written + st.log.pending_len() as u64;
                st.log.quiet = true;
                let r = st.flush_inner();
                st.log.quiet = false;
                let b = (st.log.blocks_written + st.log.pending_len() as u64).saturating_sub(b0);
                st.cleaner.most_moves_flush_blocks = st.cleaner.most_moves_flush_blocks.max(b);
                st.cleaner.held(Hold::MovesFlush, t);
                r
            });
            // Then the inode map blocks dirty now, `IMAP_AHEAD_SLICE` per hold, the pass's
            // room still reserved: the checkpoint's hold writes only those calls dirty
            // again meanwhile (`State::write_imap_ahead`), the usage table and what calls
            // buffered.
            let mut r = r;
            if r.is_ok() {
                MutexGuard::unlock_fair(st);
                write_sealed(&q);
                st = self.st.lock();
                let most = st.imap.block_addrs().len() / IMAP_AHEAD_SLICE + 2;
                for _ in 0..most {
                    let before = st.imap.dirty_blocks().len();
                    if before <= IMAP_AHEAD_SLICE {
                        break;
                    }
                    let t = Instant::now();
                    let w = quietly(&mut st, |st| {
                        st.check_log_ok()
                            .and_then(|()| st.write_imap_ahead(IMAP_AHEAD_SLICE))
                    });
                    st.cleaner.held(Hold::ImapAhead, t);
                    match w {
                        Ok(left) => {
                            st.cleaner.imap_blocks_ahead += before.saturating_sub(left) as u64
                        }
                        Err(e) => {
                            r = Err(e);
                            break;
                        }
                    }
                    MutexGuard::unlock_fair(st);
                    write_sealed(&q);
                    st = self.st.lock();
                }
            }
            st.pass_reserve = 0;
            drop(held);
            st.note_log_result(r)?;
            let t = Instant::now();
            let r = quietly(&mut st, |st| {
                st.settle_checkpoint()
                    .and_then(|()| st.checkpoint_prepare())
            });
            let cp = st.note_log_result(r);
            st.cleaner.held(Hold::Checkpoint, t);
            if let Some(w) = cp? {
                #[cfg(any(test, feature = "planted"))]
                if st.planted == crate::engine::Planted::PassRegionEarly {
                    w.write_region_early(&st.dev)?;
                }
                st = self.write_checkpoint(st, w)?;
            }
            return Ok(Some(st.pass_done(&victims)));
        }
        // Too little room to reserve: in this hold, as a pass in the foreground.
        let r = st
            .move_live(&mut moved, usize::MAX)
            .and_then(|()| st.checkpoint_prepare());
        let cp = st.note_log_result(r);
        st.cleaner.held(Hold::Whole, t);
        if let Some(w) = cp? {
            st = self.write_checkpoint(st, w)?;
        }
        Ok(Some(st.pass_done(&victims)))
    }

    /// A background pass's choice of victims, a few read per hold of the lock
    /// ([`State::choose_step`], `CHOOSE_SLICE`), calls running between: in one hold, finding
    /// the live blocks of 12-17 victims (a quarter of a millisecond each) was the longest
    /// hold of a pass, and the p99 of calls while the cleaner ran. Returns the lock in the
    /// hold that ends the choice, when it began, and the choice: after holds with calls
    /// between, that hold checks what the earlier ones found against the state now and
    /// counts the room rule again ([`State::choose_commit`]). From the reads before the
    /// lock (`pin`) to that hold, the segments read and the victims taken stay pinned: no
    /// checkpoint releases them, so the log cannot write over what was read from them.
    fn choose_sliced(
        &self,
        policy: Policy,
        th: Thresholds,
        room: Room,
        segs: &[u32],
        pin: crate::engine::readgate::Pinned,
        pre: &mut Prescans,
    ) -> Result<(MutexGuard<'_, State>, Instant, Option<Chosen>)> {
        let mut st = self.st.lock();
        let mut t = Instant::now();
        let q = st.log.sequencer.clone();
        // The flushes of this hold and the last seal their partials quietly: the pass
        // writes them after each hold (`write_sealed`).
        let r = quietly(&mut st, |st| {
            st.choose_begin(policy, th, Gain::Segment, room)
        });
        let mut c = st.note_log_result(r)?;
        // From here, which files calls change between the holds (`State::recheck_watched`).
        st.dirty.watch();
        let mut victims_pin = None;
        let mut sliced = false;
        loop {
            let r = st.choose_step(&mut c, pre, CHOOSE_SLICE, segs);
            let read = st.note_log_result(r)?;
            // Chosen in one hold: nothing to check again.
            if c.done && (read == 0 || !sliced) {
                break;
            }
            // Taken before the old pin drops: a victim is never unpinned between holds.
            victims_pin = Some(st.gate.pin(c.victims.clone()));
            st.cleaner.held(Hold::Collect, t);
            MutexGuard::unlock_fair(st);
            write_sealed(&q);
            #[cfg(test)]
            if let Some(h) = &*self.choose_hook.lock() {
                h();
            }
            st = self.st.lock();
            t = Instant::now();
            sliced = true;
            let r = st.check_log_ok();
            st.note_log_result(r)?;
            if c.done {
                break;
            }
        }
        let r = if sliced {
            quietly(&mut st, |st| st.choose_commit(c))
        } else {
            Ok(st.choose_end(c))
        };
        st.dirty.take_watched();
        let c = st.note_log_result(r)?;
        // The room rule holds against the log as it is in the hold that goes on to write
        // (checked in tests: calls between the holds took clean segments).
        debug_assert!(
            c.as_ref()
                .is_none_or(|c| st.pass_log(c.payload).1 <= st.pass_room(room)),
            "a pass chosen over several holds no longer fits its room"
        );
        // The caller pins the victims again if calls run before its checkpoint; a victim
        // pinned at the checkpoint would not be released.
        drop(victims_pin);
        drop(pin);
        Ok((st, t, c))
    }

    /// Loads the inodes (with their block maps) of the files the victims' summaries name
    /// and of the inode records they hold, a few per hold of the lock, so that the hold
    /// finding the live blocks reads no inode or indirect block. What it loads is only a
    /// cache: the pass checks every block against the state of that later hold.
    fn load_named_inodes(&self, pre: &Prescans) -> Result<()> {
        let mut inos: Vec<(u64, Option<u32>)> = Vec::new();
        for (s, data) in pre.values().flatten() {
            for (i, e) in s.entries.iter().enumerate() {
                match e.kind {
                    Kind::Data | Kind::Indirect | Kind::Xattr => {
                        inos.push((e.ino, Some(e.version)));
                    }
                    Kind::Inode => {
                        let blk = &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                        for r in inode::decode_block(blk).map_err(corrupt)? {
                            if r.mode != 0 {
                                inos.push((r.ino, None));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        inos.sort_unstable();
        inos.dedup_by_key(|x| x.0);
        for chunk in inos.chunks(LOAD_BATCH) {
            let mut st = self.st.lock();
            let t = Instant::now();
            st.check_log_ok()?;
            for &(ino, version) in chunk {
                if st.nodes.get(&ino).is_some_and(|n| n.map.is_some()) {
                    continue;
                }
                let live = match version {
                    Some(v) => st.version_of(ino) == Some(v),
                    None => st.imap.get(ino).is_some_and(|e| e.addr != 0),
                };
                // A file gone meanwhile is the later hold's to skip; an error reading
                // it, that hold's to report.
                if live {
                    let _ = st.map(ino);
                }
            }
            st.cleaner.held(Hold::Load, t);
            // Handed over fairly, as between the slices of the moves.
            MutexGuard::unlock_fair(st);
        }
        Ok(())
    }
}

/// Live data blocks a background pass moves per hold of the lock, calls running between
/// (each block a liveness re-check and a push: a few µs).
const MOVE_SLICE: usize = if cfg!(test) { 16 } else { 128 };

/// Inodes a slice of a background pass writes ahead beyond those of the files it moved
/// last (`inodes_by_slice`): the first passes of the overwrite benchmark find thousands
/// of live inode records in victims the fill wrote, and in one slice they took 7 ms.
const AHEAD_SLICE: usize = if cfg!(test) { 8 } else { 256 };

/// The inodes a background pass rewrites (`inodes`), by the slice of its moves that
/// writes them ahead of the flush after the moves (`State::write_inodes_ahead`): a file's
/// after the slice that moves its last block, so no later slice of the pass dirties it
/// again (each is written once by the pass, as one flush would); the rest — inodes
/// rewritten for no block moved, their record or an indirect or xattr block found live —
/// `AHEAD_SLICE` per slice from the first, in slices of their own once the moves are
/// done. Slices take `MOVE_SLICE` of `moved` each, in order. Its length is the pass's
/// number of slices.
fn inodes_by_slice(moved: &[Moved], inodes: Vec<u64>) -> Vec<Vec<u64>> {
    let mut last: HashMap<u64, usize> = HashMap::default();
    for (i, m) in moved.iter().enumerate() {
        last.insert(m.ino, i / MOVE_SLICE);
    }
    let mut out = vec![Vec::new(); moved.len().div_ceil(MOVE_SLICE).max(1)];
    let mut rest = Vec::new();
    for ino in inodes {
        match last.get(&ino) {
            Some(&k) => out[k].push(ino),
            None => rest.push(ino),
        }
    }
    for (k, chunk) in rest.chunks(AHEAD_SLICE).enumerate() {
        if k == out.len() {
            out.push(Vec::new());
        }
        out[k].extend_from_slice(chunk);
    }
    out
}

/// Inode map blocks a background pass writes per hold ahead of its checkpoint
/// (`State::write_imap_ahead`): each is encoded and pushed, a few µs.
const IMAP_AHEAD_SLICE: usize = if cfg!(test) { 2 } else { 48 };

/// Victims a background pass reads (finds the live blocks of) per hold of the lock while
/// it chooses, calls running between (each a quarter of a millisecond on the overwrite
/// benchmark's 512 KiB segments).
const CHOOSE_SLICE: usize = if cfg!(test) { 1 } else { 2 };

/// Inodes a background pass loads per hold of the lock (each may read an inode block and
/// the file's indirect blocks).
const LOAD_BATCH: usize = 4;

/// Segments beyond the plan's victims the background pass reads before taking the lock
/// (the pass reads any further ones it needs under the lock).
const PRESCAN_EXTRA: usize = 4;

/// Segments beyond the plan a pass may find too full for the room left before it stops
/// looking (each costs a segment read; on a large disk the ranking is long).
const MAX_MISFITS: u32 = 8;

/// An inode's extended attributes, as the xattr block holds them.
type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// A pass's victims and what it writes for them (`State::clean_pass_choose`): `payload`
/// blocks before the usage table, as the room rule counted them.
pub(crate) struct Chosen {
    victims: Vec<u32>,
    work: Work,
    pub(crate) payload: u64,
}

/// A pass whose checkpoint's device writes are still to be made.
pub(crate) struct Pass {
    victims: Vec<u32>,
    pub(crate) cp: Option<CheckpointWrite>,
}

/// What a cleaning pass must give back to be worth running.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gain {
    /// A clean segment more than before.
    Segment,
    /// Any room: more blocks freed than written.
    Blocks,
}

/// How much of the clean segments a pass may fill.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    /// All of them: a foreground pass (one hold, no call runs until its checkpoint), or a
    /// background pass while calls already wait for room (`Lfs::room_waiters`): they are
    /// served best by the pass that frees the most soonest, in one hold if it cannot
    /// reserve its room.
    Whole,
    /// Half of them beyond the standing reserve: a background pass while no call waits,
    /// so that it reserves its room and runs in slices with the calls writing into the
    /// other half. Chosen to fill every clean segment, the first passes of a run at 80%
    /// utilization wanted 40 segments' room with 20 clean, could not reserve it once calls
    /// had buffered anything, and ran in one hold of 35–60 ms (docs/bench/history.md,
    /// "Where the running p99 came from"). The run cleans to `clean_stop` all
    /// the same, in more passes.
    Shared,
}

/// What one cleaning pass writes: the live data blocks it moves, and the blocks naming
/// live data that it rewrites (by the checkpoint ending the pass).
#[derive(Default)]
pub(crate) struct Work {
    moved: Vec<Moved>,
    /// Indirect blocks `(ino, slot)`, with every slot above each.
    pub(crate) slots: BTreeSet<(u64, u64)>,
    xattrs: Vec<(u64, Xattrs)>,
    inodes: BTreeSet<u64>,
    /// Inode map blocks found live in the victims.
    imap: BTreeSet<u32>,
    /// The inode map blocks naming `inodes` (rewritten with them): kept as they are added
    /// (`add_inode`), so that counting a pass's writes looks at a few hundred map blocks at
    /// most, not at every inode.
    inode_imap: BTreeSet<u32>,
    /// What was found live besides data blocks, with the address that made it so: what a
    /// choice over several holds checks again in its last (`State::recheck`).
    found: Vec<Found>,
}

/// A block other than data found live in a victim, and why (`State::collect_live`).
#[derive(Clone, Copy)]
enum Found {
    /// `ino` (at `version`) names `addr` for indirect slot `slot`.
    Indirect {
        ino: u64,
        version: u32,
        slot: u64,
        addr: u64,
    },
    /// `ino` (at `version`) names `addr` in its xattr chain.
    Xattr { ino: u64, version: u32, addr: u64 },
    /// The inode map places `ino` at `addr`.
    Inode { ino: u64, addr: u64 },
    /// Inode map block `lbn` is at `addr`.
    Imap { lbn: u32, addr: u64 },
}

impl Found {
    /// The inode it was found live for (none for an inode map block).
    fn ino(&self) -> Option<u64> {
        match *self {
            Found::Indirect { ino, .. } | Found::Xattr { ino, .. } | Found::Inode { ino, .. } => {
                Some(ino)
            }
            Found::Imap { .. } => None,
        }
    }

    /// The block found live.
    fn addr(&self) -> u64 {
        match *self {
            Found::Indirect { addr, .. }
            | Found::Xattr { addr, .. }
            | Found::Inode { addr, .. }
            | Found::Imap { addr, .. } => addr,
        }
    }
}

/// A choice of victims under way (`State::choose_begin`, `State::choose_step`): the
/// candidates in order, the next to look at, and what those taken hold.
pub(crate) struct Choosing {
    cands: Vec<u32>,
    /// The plan's victims: the first `planned` of `cands`.
    planned: usize,
    next: usize,
    need: Gain,
    room: Room,
    pub(crate) victims: Vec<u32>,
    work: Work,
    misfits: u32,
    blocks_read: u64,
    /// No candidate left to look at (or the pass pays).
    pub(crate) done: bool,
}

impl Work {
    fn merge(&mut self, w: Work) {
        self.moved.extend(w.moved);
        self.slots.extend(w.slots);
        self.xattrs.extend(w.xattrs);
        self.inodes.extend(w.inodes);
        self.imap.extend(w.imap);
        self.inode_imap.extend(w.inode_imap);
        self.found.extend(w.found);
    }

    /// Inode `ino` is rewritten, and the inode map block naming it with it.
    fn add_inode(&mut self, ino: u64) {
        self.inodes.insert(ino);
        self.inode_imap
            .insert((ino / tables::PER_BLOCK as u64) as u32);
    }

    /// The inode map blocks the work rewrites (some may be in both sets).
    fn imap_blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.imap.iter().chain(&self.inode_imap).copied()
    }

    fn slot_chain(&mut self, ino: u64, mut slot: Option<u64>) {
        while let Some(s) = slot {
            self.slots.insert((ino, s));
            slot = slot_parent(s);
        }
    }
}

/// When the cleaner runs: the start and stop thresholds (004 §3.4), and in the foreground
/// when a write finds no room.
impl State {
    /// The cleaner's start and stop rule (004 §3.4): below `clean_start` clean segments,
    /// clean until `clean_stop` are, at most `passes` passes (the lock is held during a
    /// pass: the background syncer does a few per tick so operations get in between).
    pub fn clean_if_low(&mut self, passes: u32) -> Result<()> {
        if !self.thresholds.should_start(self.clean_segments()) {
            return Ok(());
        }
        for _ in 0..passes {
            if self.thresholds.satisfied(self.clean_segments())
                || (self.clean_pass(self.policy, self.thresholds)? == 0
                    && self.greedy_fallback(self.thresholds)? == 0)
            {
                break;
            }
        }
        Ok(())
    }

    /// Is the background cleaner wanted: fewer than `clean_start` segments clean (004
    /// §3.4), counting as taken those the buffered data will fill ([`State::clean_ahead`])?
    pub fn cleaning_wanted(&self) -> bool {
        self.thresholds.should_start(self.clean_ahead())
    }

    /// Clean segments less those the next flush of the buffered data will take: what the
    /// background cleaner starts and stops on, and what throttles writes while it runs. A
    /// flush writes up to `dirty_limit` at once (8 MiB: 17 segments of 512 KiB, nearly
    /// the 20 `clean_start` leaves on a 256 MiB disk).
    pub fn clean_ahead(&self) -> u32 {
        let seg = (self.sb.segment_blocks as u64).max(1);
        let pending = self.log_blocks(self.dirty.data_blocks()).div_ceil(seg);
        self.clean_segments()
            .saturating_sub(pending.min(u32::MAX as u64) as u32)
    }

    /// Should a write wait for the background cleaner now: a run is under way (or wanted)
    /// and the clean segments the pass in flight leaves, less what the buffered data will
    /// take ([`State::clean_after_pass`]), are below half the start threshold? A pass
    /// needs clean segments to write its victims' live blocks into; writes left to take
    /// them all would leave every pass too little room (the room rule refuses it) and the
    /// disk full of dead blocks.
    pub(crate) fn throttled(&self) -> bool {
        self.background_run_awaited()
            && self.clean_after_pass()
                < (self.thresholds.start_below() / 2).max(RESERVE_SEGMENTS + 2)
    }

    /// [`State::clean_ahead`] as the background pass in flight will leave it: less the
    /// segments its own writes still take (`pass_reserve`, an upper bound), plus the
    /// victims its checkpoint frees (`pass_frees`). What the throttle measures: a pass
    /// writes its victims' live blocks before it frees them, so the clean segments dip by
    /// most of its reservation and come back with more at its end. Measured raw, that dip
    /// alone (7-8 segments of a 9-victim pass on the overwrite benchmark, from 20 clean
    /// to 10 in one pass) crossed the line every few passes, and every write then waited
    /// for the pass's end (17-64 ms) while the cleaner kept up. The pass's room is its
    /// own already (calls are admitted only beyond it, `State::space_left`): the throttle
    /// is for the room the next pass will need, which is what this pass leaves.
    pub(crate) fn clean_after_pass(&self) -> u32 {
        #[cfg(any(test, feature = "planted"))]
        if self.planted == crate::engine::Planted::ThrottleOnRawClean {
            return self.clean_ahead();
        }
        (self.clean_ahead().saturating_sub(self.pass_reserve)).saturating_add(self.pass_frees)
    }

    /// May a call short of room wait for the background cleaner: a run is under way, or
    /// one is wanted and the last did not end having given nothing back (`bg_stuck`)?
    /// A run under way is waited for whatever the last one found: it pins the victims it
    /// reads (`readgate.rs`) — after an `rm`, the segments whose blocks all died — so no
    /// checkpoint beside it frees them and no foreground pass may take them, and a call
    /// that cleaned beside it on the strength of the last run's `bg_stuck` found nothing
    /// and failed with ENOSPC while the room was a pass away.
    fn background_run_awaited(&self) -> bool {
        self.may_wait_for_cleaner && (self.bg_run || (!self.bg_stuck && self.cleaning_wanted()))
    }

    /// The foreground's passes towards `th`, each resort after the one before found
    /// nothing: the mount's policy (cost-benefit may prefer old, nearly full segments),
    /// the least utilized segments, and a pass that gains less than a segment. Returns
    /// the segments cleaned.
    fn clean_passes(&mut self, th: Thresholds) -> Result<u32> {
        let n = self.clean_pass(self.policy, th)?;
        if n > 0 {
            return Ok(n);
        }
        let n = self.greedy_fallback(th)?;
        if n > 0 {
            return Ok(n);
        }
        self.clean_pass_any_gain(th)
    }

    /// A greedy pass after the mount's policy found nothing worth cleaning.
    fn greedy_fallback(&mut self, th: Thresholds) -> Result<u32> {
        if self.policy.selection == crate::cleaner::policy::Selection::Greedy {
            return Ok(0);
        }
        self.cleaner.greedy_fallbacks += 1;
        self.clean_pass(Policy::GREEDY, th)
    }

    /// Makes sure `bytes` more of file data fit — beyond the write-back reserve, unless
    /// this is a write-back — a checkpoint first (which frees segments whose blocks all
    /// died), ENOSPC if they still do not.
    pub fn ensure_space(&mut self, bytes: u64) -> Result<()> {
        let bytes = if self.dip_into_reserve {
            bytes
        } else {
            bytes.saturating_add(self.writeback_reserve)
        };
        if self.throttled() {
            self.cleaner_deferred = true;
            return Err(Errno::ENOSPC.into());
        }
        if self.space_left() >= bytes {
            return Ok(());
        }
        // With a background cleaner running (or about to: fewer than `clean_start` clean),
        // a foreground pass would compete with it — for the same victims, which a
        // background pass holds while it reads them (`readgate.rs`), and with checkpoints
        // whose device flushes run under the lock; so does the checkpoint below, which the
        // background passes write anyway, outside it. A write waits for the background passes
        // instead (`Lfs::write_as`, with a deadline), unless the last run gave nothing
        // back; other calls clean here as before.
        // Short only of what a background pass between its lock holds reserved: the
        // write waits for the pass to end (`Lfs::write_as`) — the room comes back then,
        // with what the pass freed — rather than cleaning beside it.
        if self.pass_reserve > 0 && self.may_wait_for_pass {
            self.cleaner_deferred = true;
            return Err(Errno::ENOSPC.into());
        }
        if self.background_run_awaited() {
            self.cleaner_deferred = true;
            return Err(Errno::ENOSPC.into());
        }
        self.checkpoint()?;
        // Foreground cleaning: a write never fails while cleaning can still make room.
        // Every pass that runs gives back room (`clean.rs`), so the loop ends; its bound
        // only caps the work one call may do near a full disk, where each last-resort pass
        // gains a few blocks.
        let per_seg = (self.sb.segment_blocks as u64 - 2) * BS / 2;
        for _ in 0..4 * self.sb.segments.max(32) {
            if self.space_left() >= bytes {
                return Ok(());
            }
            let clean = self.clean_segments().max(RESERVE_SEGMENTS);
            let want = clean + bytes.div_ceil(per_seg) as u32 + 1;
            let th = Thresholds::new(1, want.min(self.sb.segments)).map_err(corrupt)?;
            if self.clean_passes(th)? > 0 {
                continue;
            }
            // A pass aimed at one segment more: what to fall back on when the room asked
            // for is far off (the write-back reserve is part of it — a third of a small
            // disk): aimed there, the policy plans every dirty segment as a victim, and
            // a pass over all of them writes more than it frees.
            let near = want <= clean + 1;
            #[cfg(any(test, feature = "planted"))]
            let near = near || self.planted == crate::engine::Planted::SizedPassOnly;
            let one = Thresholds::new(1, (clean + 1).min(self.sb.segments)).map_err(corrupt)?;
            if near || self.clean_passes(one)? == 0 {
                break;
            }
        }
        if self.space_left() >= bytes {
            Ok(())
        } else {
            Err(Errno::ENOSPC.into())
        }
    }
}
