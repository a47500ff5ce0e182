//! The simulated disk of 004 §3.5: a log of fixed-size segments holding one-block (4 KiB)
//! files. Overwriting a file appends its new version at the log head and kills the old copy;
//! when clean segments run out, the cleaner picks segments through
//! [`crate::cleaner::policy`] and appends their live blocks at the log head.
//!
//! Plain arrays throughout (a slot per block, a row per segment), nothing allocated per
//! write: a step is a handful of array updates, so the full sweep of Figs. 4–7 runs in
//! minutes. The disk is its own segment usage table ([`UsageTable`]), which is what the
//! policies read — the same trait the file system's usage table will implement.

use serde::Serialize;

use super::SimError;
use crate::cleaner::policy::{self, Policy, SegmentState, SegmentUsage, Thresholds, UsageTable};

/// Bytes per block (and per file): the paper's 4-kbyte files.
pub const BLOCK_BYTES: u64 = 4096;

/// A slot holding no live block.
const NONE: u32 = u32::MAX;

/// Segments and their size in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Geometry {
    pub segments: u32,
    pub blocks_per_segment: u32,
}

impl Geometry {
    /// Blocks on the disk.
    pub fn blocks(&self) -> u64 {
        u64::from(self.segments) * u64::from(self.blocks_per_segment)
    }
}

/// What the disk has done, in blocks. The write cost of 004 eq. (1) is
/// `(new + read + live_written) / new`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Blocks of new data written (one per overwrite).
    pub new_blocks: u64,
    /// Blocks the cleaner read: whole segments, except empty ones, which need no read
    /// (004 §3.4: "If a segment to be cleaned has no live blocks (u = 0) then it need not be
    /// read at all").
    pub read_blocks: u64,
    /// Live blocks the cleaner wrote back.
    pub live_written: u64,
    /// Segments cleaned (empty ones included).
    pub segments_cleaned: u64,
    /// Of those, the ones with no live block.
    pub empty_cleaned: u64,
    /// Cleaning passes (times the cleaner started).
    pub passes: u64,
}

impl Counters {
    /// Write cost (004 §3.4, eq. 1): total blocks moved to and from the disk per block of
    /// new data. 1.0 with no cleaning; `NaN` if no new data was written.
    pub fn write_cost(&self) -> f64 {
        (self.new_blocks + self.read_blocks + self.live_written) as f64 / self.new_blocks as f64
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            new_blocks: self.new_blocks - earlier.new_blocks,
            read_blocks: self.read_blocks - earlier.read_blocks,
            live_written: self.live_written - earlier.live_written,
            segments_cleaned: self.segments_cleaned - earlier.segments_cleaned,
            empty_cleaned: self.empty_cleaned - earlier.empty_cleaned,
            passes: self.passes - earlier.passes,
        }
    }
}

/// What the usage table records as a segment's time (the `youngest` that cost-benefit
/// ages from) when the cleaner writes live blocks into it. New data is stamped with the
/// time it is written under both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SegmentAge {
    /// The time the segment was last written, by new data or by the cleaner: Table I's
    /// "last write time for data in segments" (BSD LFS's `su_lastmod` works this way). A
    /// segment of cold blocks the cleaner just rewrote is young, so it is not cleaned again
    /// until it has had time to lose blocks.
    LastWrite,
    /// The most recent modification time of any block in the segment, blocks keeping their
    /// modification time when the cleaner moves them (004 §3.6's wording; Sprite LFS keeps
    /// one modification time per file). Under age sort the oldest blocks of a pass share a
    /// segment whose age then only grows, so cost-benefit keeps re-cleaning it while it is
    /// nearly full: see the ablation in docs/bench/history.md.
    YoungestBlock,
}

impl SegmentAge {
    pub fn name(self) -> &'static str {
        match self {
            SegmentAge::LastWrite => "last write",
            SegmentAge::YoungestBlock => "youngest block",
        }
    }
}

/// How the disk cleans: the policy ([`Policy`]: selection and grouping), when
/// ([`Thresholds`]) and what a segment's age is measured from ([`SegmentAge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct CleanerConfig {
    pub policy: Policy,
    pub thresholds: Thresholds,
    pub age: SegmentAge,
}

/// The simulated disk.
#[derive(Debug, Clone)]
pub struct Disk {
    geometry: Geometry,
    bps: u32,
    cleaner: CleanerConfig,
    /// Per slot (segment · bps + offset): the file whose live version it holds, or `NONE`.
    slots: Vec<u32>,
    /// Per file: its live version's slot, and when it was last written.
    file_slot: Vec<u32>,
    file_mtime: Vec<u64>,
    /// The usage table (004 §3.6): live blocks, youngest block's mtime, state.
    seg_live: Vec<u32>,
    seg_youngest: Vec<u64>,
    seg_state: Vec<SegmentState>,
    /// Clean segments, taken from the end.
    clean: Vec<u32>,
    /// The log head and how many of its slots are written.
    head: u32,
    head_fill: u32,
    /// The clock: one tick per overwrite (the initial fill ticks too).
    now: u64,
    cleaning: bool,
    counters: Counters,
    /// Histograms by live blocks (index `0..=bps`): every dirty segment whenever a cleaning
    /// pass starts (004 Figs. 5–6), and every segment cleaned.
    at_cleaning: Vec<u64>,
    cleaned: Vec<u64>,
    /// The live blocks of one cleaning pass, reused from pass to pass.
    scratch: Vec<u32>,
}

impl Disk {
    /// A disk of `geometry` holding `files` one-block files, written once in file order.
    /// Refuses a geometry it cannot index and a disk so full that the cleaner could not
    /// reach `thresholds.stop_at()` clean segments: at most `segments − stop_at − 1`
    /// segments' worth of files (one segment is the log head).
    pub fn new(geometry: Geometry, files: u32, cleaner: CleanerConfig) -> Result<Disk, SimError> {
        let thresholds = cleaner.thresholds;
        let Geometry {
            segments,
            blocks_per_segment: bps,
        } = geometry;
        if segments < 3 || bps == 0 {
            return Err(SimError::Config(format!(
                "a disk needs at least 3 segments of at least 1 block (got {segments} × {bps})"
            )));
        }
        if geometry.blocks() >= u64::from(NONE) {
            return Err(SimError::Config(format!(
                "{} blocks is more than the simulator indexes (< 2^32)",
                geometry.blocks()
            )));
        }
        let room = u64::from(segments.saturating_sub(thresholds.stop_at() + 1)) * u64::from(bps);
        if files == 0 || u64::from(files) > room {
            return Err(SimError::Config(format!(
                "{files} files on {segments} segments of {bps} blocks: need 1..={room} so that \
                 {} segments can be clean besides the log head",
                thresholds.stop_at()
            )));
        }
        let n = geometry.blocks() as usize;
        let mut disk = Disk {
            geometry,
            bps,
            cleaner,
            slots: vec![NONE; n],
            file_slot: vec![NONE; files as usize],
            file_mtime: vec![0; files as usize],
            seg_live: vec![0; segments as usize],
            seg_youngest: vec![0; segments as usize],
            seg_state: vec![SegmentState::Clean; segments as usize],
            // Segment 0 first, then 1, ...: the log starts at the front of the disk.
            clean: (1..segments).rev().collect(),
            head: 0,
            head_fill: 0,
            now: 0,
            cleaning: false,
            counters: Counters::default(),
            at_cleaning: vec![0; bps as usize + 1],
            cleaned: vec![0; bps as usize + 1],
            scratch: Vec::new(),
        };
        disk.seg_state[0] = SegmentState::Active;
        for f in 0..files {
            disk.now += 1;
            disk.file_mtime[f as usize] = disk.now;
            disk.append(f)?;
        }
        // The initial fill is not new data in the measured sense (no overwrite).
        disk.counters = Counters::default();
        disk.reset_histograms();
        Ok(disk)
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn files(&self) -> u32 {
        self.file_slot.len() as u32
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Clean segments (the log head not counted).
    pub fn clean_segments(&self) -> u32 {
        self.clean.len() as u32
    }

    /// The segment currently holding `file`'s live version.
    pub fn segment_of(&self, file: u32) -> Option<u32> {
        let slot = *self.file_slot.get(file as usize)?;
        Some(slot / self.bps)
    }

    /// Live blocks in `segment`.
    pub fn live_blocks(&self, segment: u32) -> u32 {
        self.seg_live.get(segment as usize).copied().unwrap_or(0)
    }

    /// The files with a live block in `segment`, in slot order.
    pub fn files_in(&self, segment: u32) -> impl Iterator<Item = u32> + '_ {
        let s = (segment.min(self.geometry.segments) * self.bps) as usize;
        let e = if segment < self.geometry.segments {
            s + self.bps as usize
        } else {
            s
        };
        self.slots[s..e].iter().copied().filter(|&f| f != NONE)
    }

    /// Dirty segments by live-block count, summed over every cleaning pass since the last
    /// [`Disk::reset_histograms`]: index `k` counts segments with `k` live blocks (of
    /// `blocks_per_segment`). 004 Figs. 5–6 plot this distribution.
    pub fn at_cleaning(&self) -> &[u64] {
        &self.at_cleaning
    }

    /// Cleaned segments by live-block count, as [`Disk::at_cleaning`].
    pub fn cleaned(&self) -> &[u64] {
        &self.cleaned
    }

    pub fn reset_histograms(&mut self) {
        self.at_cleaning.fill(0);
        self.cleaned.fill(0);
    }

    /// One step of the simulation: `file` is overwritten. Its new version goes to the log
    /// head (cleaning first if that uses up the clean segments) and its old copy is dead.
    pub fn overwrite(&mut self, file: u32) -> Result<(), SimError> {
        let Some(&old) = self.file_slot.get(file as usize) else {
            return Err(SimError::Config(format!("no file {file}")));
        };
        self.now += 1;
        self.slots[old as usize] = NONE;
        self.seg_live[(old / self.bps) as usize] -= 1;
        self.file_mtime[file as usize] = self.now;
        self.counters.new_blocks += 1;
        self.append(file)
    }

    /// Writes `file`'s live version at the log head, opening a new head segment when the
    /// current one is full. A loop, not an `if`: opening a segment may run the cleaner, whose
    /// rewrites can fill the new head in turn.
    fn append(&mut self, file: u32) -> Result<(), SimError> {
        while self.head_fill == self.bps {
            self.advance_head()?;
        }
        let slot = self.head * self.bps + self.head_fill;
        self.head_fill += 1;
        self.slots[slot as usize] = file;
        self.file_slot[file as usize] = slot;
        let h = self.head as usize;
        self.seg_live[h] += 1;
        // The segment's time in the usage table (see `SegmentAge`).
        let t = match (self.cleaning, self.cleaner.age) {
            (true, SegmentAge::LastWrite) => self.now,
            _ => self.file_mtime[file as usize],
        };
        self.seg_youngest[h] = self.seg_youngest[h].max(t);
        Ok(())
    }

    /// Closes the full head segment and opens a clean one; if that leaves too few clean
    /// segments, runs the cleaner (not from inside the cleaner: its own writes only consume
    /// segments its plan has already freed).
    fn advance_head(&mut self) -> Result<(), SimError> {
        self.seg_state[self.head as usize] = SegmentState::Dirty;
        let Some(next) = self.clean.pop() else {
            return Err(SimError::NoCleanSegment {
                files: self.files(),
                blocks: self.geometry.blocks(),
            });
        };
        self.head = next;
        self.head_fill = 0;
        self.seg_state[next as usize] = SegmentState::Active;
        self.seg_youngest[next as usize] = 0;
        if !self.cleaning && self.cleaner.thresholds.should_start(self.clean_segments()) {
            self.clean_pass()?;
        }
        Ok(())
    }

    /// One cleaning pass (004 §3.3): plan it with the policy, read the victims (all of each
    /// non-empty one), mark them clean, arrange their live blocks by the policy's grouping
    /// and write them back at the log head.
    fn clean_pass(&mut self) -> Result<(), SimError> {
        self.cleaning = true;
        self.counters.passes += 1;
        for s in 0..self.geometry.segments as usize {
            if self.seg_state[s] == SegmentState::Dirty {
                self.at_cleaning[self.seg_live[s] as usize] += 1;
            }
        }
        let head_free = u64::from(self.bps - self.head_fill) * BLOCK_BYTES;
        let plan = policy::plan(
            &*self,
            self.cleaner.policy.selection,
            self.now,
            self.cleaner.thresholds,
            head_free,
        );
        let mut live = std::mem::take(&mut self.scratch);
        live.clear();
        for &v in &plan.victims {
            let vi = v as usize;
            let n = self.seg_live[vi];
            self.cleaned[n as usize] += 1;
            self.counters.segments_cleaned += 1;
            if n == 0 {
                self.counters.empty_cleaned += 1;
            } else {
                self.counters.read_blocks += u64::from(self.bps);
                let s = vi * self.bps as usize;
                for slot in &mut self.slots[s..s + self.bps as usize] {
                    if *slot != NONE {
                        live.push(*slot);
                        *slot = NONE;
                    }
                }
            }
            self.seg_live[vi] = 0;
            self.seg_youngest[vi] = 0;
            self.seg_state[vi] = SegmentState::Clean;
            self.clean.push(v);
        }
        let mtime = &self.file_mtime;
        self.cleaner
            .policy
            .grouping
            .arrange(&mut live, |&f| mtime[f as usize]);
        let mut result = Ok(());
        for &f in &live {
            self.counters.live_written += 1;
            if let Err(e) = self.append(f) {
                result = Err(e);
                break;
            }
        }
        self.scratch = live;
        self.cleaning = false;
        result
    }
}

/// The disk is its own segment usage table: this is what the policies read.
impl UsageTable for Disk {
    fn segment_count(&self) -> u32 {
        self.geometry.segments
    }

    fn segment_bytes(&self) -> u64 {
        u64::from(self.bps) * BLOCK_BYTES
    }

    fn usage(&self, segment: u32) -> SegmentUsage {
        let s = segment as usize;
        SegmentUsage {
            state: self.seg_state[s],
            live_bytes: u64::from(self.seg_live[s]) * BLOCK_BYTES,
            youngest: self.seg_youngest[s],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn th(start: u32, stop: u32) -> Thresholds {
        Thresholds::new(start, stop).unwrap()
    }

    fn new_disk(g: Geometry, files: u32, policy: Policy, t: Thresholds) -> Result<Disk, SimError> {
        let cleaner = CleanerConfig {
            policy,
            thresholds: t,
            age: SegmentAge::YoungestBlock,
        };
        Disk::new(g, files, cleaner)
    }

    fn geo(segments: u32, bps: u32) -> Geometry {
        Geometry {
            segments,
            blocks_per_segment: bps,
        }
    }

    /// Checks the disk's books: every file's slot names it, live counts match the slots,
    /// the clean list holds exactly the clean segments, and nothing else is free.
    fn check(d: &Disk) {
        let bps = d.bps as usize;
        let mut live = vec![0u32; d.geometry.segments as usize];
        for (slot, &f) in d.slots.iter().enumerate() {
            if f != NONE {
                assert_eq!(d.file_slot[f as usize] as usize, slot, "file {f}");
                live[slot / bps] += 1;
            }
        }
        assert_eq!(live, d.seg_live);
        let mut clean: Vec<u32> = d.clean.clone();
        clean.sort_unstable();
        let expect: Vec<u32> = (0..d.geometry.segments)
            .filter(|&s| d.seg_state[s as usize] == SegmentState::Clean)
            .collect();
        assert_eq!(clean, expect);
        for &c in &clean {
            assert_eq!(d.seg_live[c as usize], 0);
        }
        assert_eq!(d.seg_state[d.head as usize], SegmentState::Active);
        assert_eq!(
            live.iter().map(|&l| l as u64).sum::<u64>(),
            d.files() as u64
        );
    }

    #[test]
    fn initial_fill_writes_the_log_in_order() {
        let d = new_disk(geo(4, 4), 6, Policy::GREEDY, th(1, 1)).unwrap();
        check(&d);
        assert_eq!(d.segment_of(0), Some(0));
        assert_eq!(d.segment_of(5), Some(1));
        assert_eq!(d.live_blocks(0), 4);
        assert_eq!(d.live_blocks(1), 2);
        assert_eq!(d.clean_segments(), 2);
        assert_eq!(d.counters(), Counters::default());
        assert_eq!(d.files_in(1).collect::<Vec<_>>(), vec![4, 5]);
        assert_eq!(d.files_in(99).count(), 0);
        assert_eq!(d.usage(0).youngest, 4);
        assert_eq!(d.usage(1).state, SegmentState::Active);
    }

    /// A disk small enough to follow by hand: 4 segments of 4 blocks, 8 files, greedy,
    /// clean when none is clean, until one is.
    #[test]
    fn hand_computed_write_cost() {
        let mut d = new_disk(geo(4, 4), 8, Policy::GREEDY, th(1, 1)).unwrap();
        // Segments: 0 = [0 1 2 3], 1 = [4 5 6 7] (head, full), 2 and 3 clean.
        // Overwrite 0, 1, 2: the head fills up, so segment 2 opens: [0 1 2 _].
        for f in [0, 1, 2] {
            d.overwrite(f).unwrap();
        }
        check(&d);
        assert_eq!(d.segment_of(0), Some(2));
        assert_eq!((d.live_blocks(0), d.clean_segments()), (1, 1));
        // Overwrite 4, then 5: 4 completes segment 2 = [0 1 2 4]; 5's old copy dies, then its
        // new version opens segment 3, the last clean one, so the cleaner runs. Dirty:
        // 0 (1 live: file 3), 1 (2 live: 6 7), 2 (4 live).
        d.overwrite(4).unwrap();
        d.overwrite(5).unwrap();
        check(&d);
        // Greedy took segment 0 (u = 1/4): read 4 blocks, wrote 1 back (file 3) into head 3
        // ahead of file 5's new version; segment 0 is clean again.
        let c = d.counters();
        assert_eq!(c.passes, 1);
        assert_eq!(c.segments_cleaned, 1);
        assert_eq!(c.read_blocks, 4);
        assert_eq!(c.live_written, 1);
        assert_eq!(c.new_blocks, 5);
        assert_eq!(d.segment_of(3), Some(3));
        assert_eq!(d.segment_of(5), Some(3));
        assert_eq!(d.files_in(3).collect::<Vec<_>>(), vec![3, 5]);
        assert_eq!(d.clean_segments(), 1);
        // (5 new + 4 read + 1 rewritten) / 5 new.
        assert_eq!(c.write_cost(), 2.0);
        // The pass saw three dirty segments with 1, 2 and 4 live blocks and cleaned the first.
        assert_eq!(d.at_cleaning(), &[0, 1, 1, 0, 1]);
        assert_eq!(d.cleaned(), &[0, 1, 0, 0, 0]);
    }

    #[test]
    fn empty_segments_cost_no_read() {
        // Overwrite every file of segment 0: it holds nothing when the cleaner runs.
        let mut d = new_disk(geo(4, 4), 8, Policy::GREEDY, th(1, 1)).unwrap();
        for f in [0, 1, 2, 3, 4] {
            d.overwrite(f).unwrap();
        }
        check(&d);
        let c = d.counters();
        assert_eq!(c.passes, 1);
        assert_eq!((c.segments_cleaned, c.empty_cleaned), (1, 1));
        assert_eq!((c.read_blocks, c.live_written), (0, 0));
        assert_eq!(c.write_cost(), 1.0);
        assert_eq!(d.cleaned(), &[1, 0, 0, 0, 0]);
    }

    /// Age sort changes the order in which one pass writes the live blocks back. On 6
    /// segments of 4 blocks (8 files, clean when none is clean until 3 are), this sequence
    /// leaves, when the last clean segment opens at t=21 (file 1's overwrite):
    /// segment 0 = {0 (t1), 3 (t4)}, 1 = {5 (t6)}, 2 = {} , 3 = {7 (t14), 6 (t16)},
    /// 4 = {2 (t17), 4 (t20)}. Greedy takes 2 (empty), 1, then 0 (3 live blocks fit the empty
    /// head: 0 + 3 − 0 = 3 clean). In order writes 5, 0, 3; age sort 0, 3, 5 — then file 1's
    /// new version.
    #[test]
    fn age_sort_writes_oldest_first() {
        let run = |p: Policy| {
            let mut d = new_disk(geo(6, 4), 8, p, th(1, 3)).unwrap();
            for f in [4, 6, 4, 1, 1, 7, 6, 6, 2, 4, 1, 4, 1] {
                d.overwrite(f).unwrap();
            }
            check(&d);
            d
        };
        let a = run(Policy::GREEDY);
        let b = run(Policy::GREEDY_AGE_SORT);
        assert_eq!(a.files_in(5).collect::<Vec<_>>(), vec![5, 0, 3, 1]);
        assert_eq!(b.files_in(5).collect::<Vec<_>>(), vec![0, 3, 5, 1]);
        for d in [&a, &b] {
            let c = d.counters();
            assert_eq!((c.passes, c.segments_cleaned, c.empty_cleaned), (1, 3, 1));
            assert_eq!((c.new_blocks, c.read_blocks, c.live_written), (13, 8, 3));
            assert_eq!(d.clean_segments(), 3);
            // The head's youngest block is file 1's new version; the rewritten blocks keep
            // their own (older) times.
            assert_eq!(d.usage(5).youngest, 21);
        }
        assert_eq!(b.cleaned(), &[1, 1, 1, 0, 0]);
    }

    /// What a segment filled by the cleaner alone is dated by. This sequence (8 segments of
    /// 3 blocks, 9 files, age sort, clean until 3 are clean) ends with one pass at t=22 that
    /// rewrites files 2, 3 and 6 — last modified by the initial fill at t=3, 4 and 7 — into
    /// segment 7, with nothing else in it.
    #[test]
    fn segment_age_of_cleaner_output() {
        let run = |age| {
            let cleaner = CleanerConfig {
                policy: Policy::GREEDY_AGE_SORT,
                thresholds: th(1, 3),
                age,
            };
            let mut d = Disk::new(geo(8, 3), 9, cleaner).unwrap();
            for f in [4, 7, 4, 5, 1, 4, 0, 1, 0, 4, 8, 0, 4] {
                d.overwrite(f).unwrap();
            }
            check(&d);
            assert_eq!(d.counters().passes, 1);
            assert_eq!(d.files_in(7).collect::<Vec<_>>(), vec![2, 3, 6]);
            assert_eq!(d.now(), 22);
            d.usage(7).youngest
        };
        assert_eq!(run(SegmentAge::LastWrite), 22);
        assert_eq!(run(SegmentAge::YoungestBlock), 7);
    }

    /// "No variance" (004 Fig. 4, eq. 1): if every segment cleaned has utilization u, the
    /// write cost is 2/(1−u). An adversarial access pattern makes that so: each step
    /// overwrites a file of the fullest dirty segment, so no segment drains ahead of the
    /// others. When a pass starts, the log head is empty and the segment just closed is
    /// full; the other `segments − 2` hold (files − bps) / (segments − 2) blocks each on
    /// average — 48 of 64 here — and differ by at most one block.
    #[test]
    fn no_variance_write_cost_is_two_over_one_minus_u() {
        let (segments, bps) = (66u32, 64u32);
        let files = 48 * (segments - 2) + bps;
        let mut d = new_disk(geo(segments, bps), files, Policy::GREEDY, th(1, 1)).unwrap();
        let fullest_file = |d: &Disk| {
            let seg = (0..segments)
                .filter(|&s| d.usage(s).state == SegmentState::Dirty)
                .max_by_key(|&s| (d.live_blocks(s), std::cmp::Reverse(s)))
                .unwrap();
            d.files_in(seg).next().unwrap()
        };
        let epoch = u64::from(segments * bps);
        for _ in 0..10 * epoch {
            d.overwrite(fullest_file(&d)).unwrap();
        }
        let before = d.counters();
        d.reset_histograms();
        for _ in 0..10 * epoch {
            d.overwrite(fullest_file(&d)).unwrap();
        }
        check(&d);
        let levels = |h: &[u64]| -> Vec<usize> { (0..h.len()).filter(|&k| h[k] > 0).collect() };
        // One utilization for every segment cleaned...
        let cleaned = levels(d.cleaned());
        assert_eq!(cleaned.len(), 1, "cleaned at {cleaned:?} live blocks");
        let live = cleaned[0];
        assert!(live.abs_diff(48) <= 1, "cleaned at {live} of 64");
        // ...and for every segment the cleaner chose from, to a block, besides the full one.
        let seen = levels(d.at_cleaning());
        assert!(
            seen.iter().all(|&k| k.abs_diff(48) <= 1 || k == 64),
            "{seen:?}"
        );
        let u = live as f64 / f64::from(bps);
        let expect = 2.0 / (1.0 - u);
        let got = d.counters().since(&before).write_cost();
        assert!(
            (got - expect).abs() / expect < 0.01,
            "write cost {got:.3}, 2/(1-u) = {expect:.3} at u = {u:.3}"
        );
    }

    #[test]
    fn refuses_impossible_disks() {
        let t = th(1, 2);
        assert!(new_disk(geo(2, 4), 1, Policy::GREEDY, t).is_err());
        assert!(new_disk(geo(4, 0), 1, Policy::GREEDY, t).is_err());
        assert!(new_disk(geo(4, 4), 0, Policy::GREEDY, t).is_err());
        // 4 segments, stop at 2, head 1: room for 1 segment of files.
        assert!(new_disk(geo(4, 4), 4, Policy::GREEDY, t).is_ok());
        assert!(new_disk(geo(4, 4), 5, Policy::GREEDY, t).is_err());
        assert!(new_disk(geo(u32::MAX, 2), 1, Policy::GREEDY, t).is_err());
        let mut d = new_disk(geo(4, 4), 4, Policy::GREEDY, t).unwrap();
        assert!(d.overwrite(4).is_err());
    }
}
