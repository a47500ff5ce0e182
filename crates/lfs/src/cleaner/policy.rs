//! Segment-cleaning policy (004 §3.4–3.6): *when* the cleaner runs, *which* segments it
//! cleans and *how* it groups the live blocks it writes back.
//!
//! Everything here is pure: it reads a [`UsageTable`] (each segment's live bytes and the
//! modification time of its youngest block, 004 §3.6) and returns decisions. The cleaning
//! simulator (`crate::sim`, 004 §3.5) and the file system's cleaner call the same functions,
//! so the policies measured in the simulator are the policies the file system runs.
//!
//! The four questions of 004 §3.4 and where each is answered:
//!
//! 1. *When* does the cleaner run? [`Thresholds`]: it starts when fewer than `start_below`
//!    segments are clean and stops once `stop_at` are (Sprite LFS: "a few tens" and 50–100).
//! 2. *How many* segments at a time? [`plan`]: as many, in the policy's order, as it takes to
//!    bring the clean count back to `stop_at`.
//! 3. *Which* segments? [`Selection`]: greedy (least utilized) or cost-benefit
//!    (highest `(1−u)·age / (1+u)`), ranked by [`rank`].
//! 4. *How* are live blocks grouped? [`Grouping`]: in the order they were found, or sorted
//!    by age ([`age_sort`]) so that blocks of similar age share output segments.

use std::cmp::Ordering;

use serde::Serialize;

/// The state of one segment, as the cleaner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SegmentState {
    /// Holds nothing live; the log may be written into it.
    Clean,
    /// Being written (the log head) or otherwise unavailable to the cleaner.
    Active,
    /// Written and closed: a candidate for cleaning.
    Dirty,
}

/// One row of the segment usage table (004 §3.6, Table I).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct SegmentUsage {
    pub state: SegmentState,
    /// Bytes of the segment still live (decremented when blocks are overwritten or deleted).
    pub live_bytes: u64,
    /// The most recent modification time of any block written into the segment (004 §3.6).
    /// Any monotonic clock works (seconds, a write counter): only differences are used. Not
    /// lowered when blocks die, as in Sprite LFS.
    pub youngest: u64,
}

/// What the policies read: the segment usage table. The simulator's disk implements it over
/// plain arrays; the file system implements it over its in-memory copy of the table.
pub trait UsageTable {
    /// Number of segments; segments are numbered `0..segment_count()`.
    fn segment_count(&self) -> u32;
    /// Size of every segment in bytes (the denominator of utilization).
    fn segment_bytes(&self) -> u64;
    /// The row of `segment` (`segment < segment_count()`).
    fn usage(&self, segment: u32) -> SegmentUsage;
}

/// A usage table held as a vector of rows: for tests, tools and small callers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageVec {
    pub segment_bytes: u64,
    pub rows: Vec<SegmentUsage>,
}

impl UsageTable for UsageVec {
    fn segment_count(&self) -> u32 {
        u32::try_from(self.rows.len()).unwrap_or(u32::MAX)
    }

    fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    fn usage(&self, segment: u32) -> SegmentUsage {
        self.rows[segment as usize]
    }
}

/// Utilization `u` of a segment: the fraction of its bytes still live, in `[0, 1]`. A table
/// with zero-sized segments has utilization 0 everywhere rather than NaN.
pub fn utilization(live_bytes: u64, segment_bytes: u64) -> f64 {
    if segment_bytes == 0 {
        return 0.0;
    }
    (live_bytes as f64 / segment_bytes as f64).clamp(0.0, 1.0)
}

/// The cost-benefit ratio of 004 §3.5: `(1−u)·age / (1+u)`. The benefit is the free space
/// reclaimed (`1−u`) times how long it is likely to stay free (estimated by the age of the
/// segment's youngest block); the cost is reading the segment (1) and writing back its live
/// data (`u`).
pub fn cost_benefit(u: f64, age: u64) -> f64 {
    (1.0 - u) * age as f64 / (1.0 + u)
}

/// Which segments to clean (004 §3.4 question 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Selection {
    /// The least-utilized segments first (004 §3.5, "LFS uniform" in Fig. 4).
    Greedy,
    /// The highest `(1−u)·age / (1+u)` first (004 §3.5, Figs. 6–7): free space in old (cold)
    /// segments is worth more because it stays free longer.
    CostBenefit,
}

impl Selection {
    pub fn name(self) -> &'static str {
        match self {
            Selection::Greedy => "greedy",
            Selection::CostBenefit => "cost-benefit",
        }
    }
}

/// How live blocks are ordered when written back (004 §3.4 question 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Grouping {
    /// In the order they were found in the segments cleaned (the paper's "LFS uniform").
    InOrder,
    /// Sorted by modification time, oldest first ("age sort"), so that cold blocks end up in
    /// segments of their own (004 §3.4, §3.5).
    AgeSort,
}

impl Grouping {
    /// Puts `blocks` in the order this grouping writes them; `mtime` gives a block's last
    /// modification time. The rewrite step of both the simulator and the file system's
    /// cleaner calls this on the live blocks of one cleaning pass.
    pub fn arrange<T>(self, blocks: &mut [T], mtime: impl FnMut(&T) -> u64) {
        match self {
            Grouping::InOrder => {}
            Grouping::AgeSort => age_sort(blocks, mtime),
        }
    }
}

/// Age sort (004 §3.4): orders blocks by last modification time, oldest first. The sort is
/// stable, so blocks of equal age keep the order in which they were found.
pub fn age_sort<T>(blocks: &mut [T], mut mtime: impl FnMut(&T) -> u64) {
    blocks.sort_by_key(|b| mtime(b));
}

/// A cleaning policy: which segments, and how their live blocks are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Policy {
    pub selection: Selection,
    pub grouping: Grouping,
}

impl Policy {
    pub const GREEDY: Policy = Policy {
        selection: Selection::Greedy,
        grouping: Grouping::InOrder,
    };
    pub const GREEDY_AGE_SORT: Policy = Policy {
        selection: Selection::Greedy,
        grouping: Grouping::AgeSort,
    };
    /// The policy Sprite LFS adopted (004 §3.5): cost-benefit selection with age sort.
    pub const COST_BENEFIT: Policy = Policy {
        selection: Selection::CostBenefit,
        grouping: Grouping::AgeSort,
    };
    pub const COST_BENEFIT_IN_ORDER: Policy = Policy {
        selection: Selection::CostBenefit,
        grouping: Grouping::InOrder,
    };

    /// `greedy`, `greedy+age-sort`, `cost-benefit+age-sort`, `cost-benefit`: the names
    /// [`Policy::parse`] accepts.
    pub fn name(self) -> String {
        match self.grouping {
            Grouping::InOrder => self.selection.name().to_string(),
            Grouping::AgeSort => format!("{}+age-sort", self.selection.name()),
        }
    }

    /// Parses a name written by [`Policy::name`]; `None` for anything else.
    pub fn parse(s: &str) -> Option<Policy> {
        let (sel, grouping) = match s.strip_suffix("+age-sort") {
            Some(sel) => (sel, Grouping::AgeSort),
            None => (s, Grouping::InOrder),
        };
        let selection = match sel {
            "greedy" => Selection::Greedy,
            "cost-benefit" => Selection::CostBenefit,
            _ => return None,
        };
        Some(Policy {
            selection,
            grouping,
        })
    }
}

/// When the cleaner runs (004 §3.4 question 1): it starts when fewer than `start_below`
/// segments are clean and cleans until at least `stop_at` are. The simulator of 004 §3.5
/// runs "until all clean segments are exhausted" (`start_below = 1`); Sprite LFS starts below
/// "a few tens" and stops at "50–100".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Thresholds {
    start_below: u32,
    stop_at: u32,
}

/// Thresholds that cannot work: the cleaner would never start, or would stop before it
/// started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cleaning thresholds: need 1 <= start ({start_below}) <= stop ({stop_at}): the cleaner starts \
     when fewer than `start` segments are clean and cleans until `stop` are"
)]
pub struct ThresholdError {
    pub start_below: u32,
    pub stop_at: u32,
}

impl Thresholds {
    pub fn new(start_below: u32, stop_at: u32) -> Result<Thresholds, ThresholdError> {
        if start_below == 0 || start_below > stop_at {
            return Err(ThresholdError {
                start_below,
                stop_at,
            });
        }
        Ok(Thresholds {
            start_below,
            stop_at,
        })
    }

    pub fn start_below(self) -> u32 {
        self.start_below
    }

    pub fn stop_at(self) -> u32 {
        self.stop_at
    }

    /// Whether a cleaner that is idle should start, with `clean` segments clean.
    pub fn should_start(self, clean: u32) -> bool {
        clean < self.start_below
    }

    /// Whether a running cleaner has done enough, with `clean` segments clean.
    pub fn satisfied(self, clean: u32) -> bool {
        clean >= self.stop_at
    }
}

/// Candidate segments (the dirty ones), best first under `selection` at time `now`.
///
/// Both policies put *empty* dirty segments first (lowest number first): an empty segment
/// costs nothing to clean — it need not be read (004 §3.4, after eq. 1) and "can be reused
/// without cleaning" (§3.6) — so its benefit/cost is unbounded, whatever its age.
///
/// Ties are broken deterministically, so a replayed workload cleans the same segments:
/// greedy by segment number; cost-benefit by lower utilization, then segment number.
pub fn rank<T: UsageTable + ?Sized>(table: &T, selection: Selection, now: u64) -> Vec<u32> {
    let seg_bytes = table.segment_bytes();
    let mut cands: Vec<(f64, u64, u32)> = (0..table.segment_count())
        .filter_map(|s| {
            let row = table.usage(s);
            (row.state == SegmentState::Dirty).then(|| {
                let live = row.live_bytes.min(seg_bytes);
                let score = match selection {
                    // Greedy orders by live bytes alone; the score is unused.
                    Selection::Greedy => 0.0,
                    Selection::CostBenefit => cost_benefit(
                        utilization(live, seg_bytes),
                        now.saturating_sub(row.youngest),
                    ),
                };
                (score, live, s)
            })
        })
        .collect();
    let order = |a: &(f64, u64, u32), b: &(f64, u64, u32)| -> Ordering {
        let by_policy = || match selection {
            Selection::Greedy => a.1.cmp(&b.1),
            // Higher score first; then the cheaper (less live) segment.
            Selection::CostBenefit => b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)),
        };
        match (a.1 == 0, b.1 == 0) {
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            // Empty segments among themselves: by number.
            (true, true) => a.2.cmp(&b.2),
            (false, false) => by_policy().then(a.2.cmp(&b.2)),
        }
    };
    // The comparison is a total order (segment numbers are distinct), so an unstable sort is
    // deterministic.
    cands.sort_unstable_by(order);
    cands.into_iter().map(|c| c.2).collect()
}

/// One cleaning pass, decided: the segments to clean, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Segments to clean, best first.
    pub victims: Vec<u32>,
    /// Live bytes in the victims: what the pass reads as live and writes back.
    pub live_bytes: u64,
    /// Clean segments before the pass.
    pub clean_before: u32,
    /// Clean segments after the pass, projected: `clean_before + victims − segments the live
    /// data fills` (after the `head_free_bytes` still open in the log head).
    pub clean_after: u32,
}

impl Plan {
    /// Whether the pass brings the clean count up to the stop threshold. Not reaching it means
    /// the disk holds too little reclaimable space for the thresholds.
    pub fn reaches(&self, thresholds: Thresholds) -> bool {
        thresholds.satisfied(self.clean_after)
    }
}

/// Plans one cleaning pass (004 §3.3–3.4): takes segments in `selection`'s order until
/// cleaning them would leave at least `thresholds.stop_at()` segments clean, counting the
/// segments their live data will fill when written back at the log head, which has
/// `head_free_bytes` free. If even every candidate is not enough, all are returned and
/// [`Plan::reaches`] says so. With the threshold already met, the plan is empty.
pub fn plan<T: UsageTable + ?Sized>(
    table: &T,
    selection: Selection,
    now: u64,
    thresholds: Thresholds,
    head_free_bytes: u64,
) -> Plan {
    let seg_bytes = table.segment_bytes();
    let clean_before = (0..table.segment_count())
        .filter(|&s| table.usage(s).state == SegmentState::Clean)
        .count();
    let clean_before = u32::try_from(clean_before).unwrap_or(u32::MAX);
    let project = |victims: usize, live: u64| -> u32 {
        let spill = live.saturating_sub(head_free_bytes);
        let filled = if seg_bytes == 0 {
            0
        } else {
            spill.div_ceil(seg_bytes)
        };
        let after = (clean_before as u64 + victims as u64).saturating_sub(filled);
        u32::try_from(after).unwrap_or(u32::MAX)
    };
    let mut victims = Vec::new();
    let mut live_bytes = 0u64;
    if !thresholds.satisfied(clean_before) {
        for s in rank(table, selection, now) {
            victims.push(s);
            live_bytes += table.usage(s).live_bytes.min(seg_bytes);
            if thresholds.satisfied(project(victims.len(), live_bytes)) {
                break;
            }
        }
    }
    Plan {
        clean_after: project(victims.len(), live_bytes),
        victims,
        live_bytes,
        clean_before,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 100;

    fn row(state: SegmentState, live: u64, youngest: u64) -> SegmentUsage {
        SegmentUsage {
            state,
            live_bytes: live,
            youngest,
        }
    }

    fn dirty(live: u64, youngest: u64) -> SegmentUsage {
        row(SegmentState::Dirty, live, youngest)
    }

    fn table(rows: Vec<SegmentUsage>) -> UsageVec {
        UsageVec {
            segment_bytes: SEG,
            rows,
        }
    }

    #[test]
    fn greedy_takes_least_utilized_first() {
        let t = table(vec![dirty(90, 5), dirty(30, 1), dirty(60, 9), dirty(10, 0)]);
        assert_eq!(rank(&t, Selection::Greedy, 100), vec![3, 1, 2, 0]);
    }

    #[test]
    fn greedy_ignores_age() {
        // The oldest segment is the fuller one: greedy still takes the emptier young one.
        let t = table(vec![dirty(50, 0), dirty(40, 999)]);
        assert_eq!(rank(&t, Selection::Greedy, 1000), vec![1, 0]);
    }

    #[test]
    fn cost_benefit_prefers_old_segments_at_higher_utilization() {
        // 004 §3.5: cold segments are cleaned at ~75% utilization, hot ones wait until ~15%.
        // A cold segment at 75% aged 1000: 0.25·1000/1.75 = 142.9. A hot one at 30% aged 10:
        // 0.7·10/1.3 = 5.4. Greedy would take the hot one.
        let t = table(vec![dirty(30, 990), dirty(75, 0)]);
        assert_eq!(rank(&t, Selection::CostBenefit, 1000), vec![1, 0]);
        assert_eq!(rank(&t, Selection::Greedy, 1000), vec![0, 1]);
    }

    #[test]
    fn cost_benefit_score_is_the_papers_formula() {
        assert!((cost_benefit(0.75, 1000) - 0.25 * 1000.0 / 1.75).abs() < 1e-9);
        assert_eq!(cost_benefit(1.0, 1000), 0.0);
        assert_eq!(cost_benefit(0.5, 0), 0.0);
        // Equal age: the emptier segment scores higher, so it is greedy among equals.
        assert!(cost_benefit(0.2, 50) > cost_benefit(0.3, 50));
        let t = table(vec![dirty(30, 7), dirty(20, 7), dirty(90, 7)]);
        assert_eq!(rank(&t, Selection::CostBenefit, 57), vec![1, 0, 2]);
    }

    #[test]
    fn cost_benefit_age_is_now_minus_youngest() {
        // Same utilization: the segment whose youngest block is older wins.
        let t = table(vec![dirty(50, 80), dirty(50, 20), dirty(50, 60)]);
        assert_eq!(rank(&t, Selection::CostBenefit, 100), vec![1, 2, 0]);
        // A youngest time in the future (a clock step back) counts as age 0, not a panic.
        let t = table(vec![dirty(50, 500), dirty(60, 10)]);
        assert_eq!(rank(&t, Selection::CostBenefit, 100), vec![1, 0]);
    }

    #[test]
    fn ties_are_broken_by_segment_number() {
        let t = table(vec![dirty(40, 3), dirty(40, 1), dirty(40, 3)]);
        assert_eq!(rank(&t, Selection::Greedy, 10), vec![0, 1, 2]);
        // Cost-benefit: equal scores (same u, same youngest) go by number too.
        assert_eq!(rank(&t, Selection::CostBenefit, 10), vec![1, 0, 2]);
        let t = table(vec![dirty(40, 3), dirty(40, 3)]);
        assert_eq!(rank(&t, Selection::CostBenefit, 10), vec![0, 1]);
        // Equal scores at different utilization: the cheaper segment first. Both score 0
        // (age 0), so the less live one leads.
        let t = table(vec![dirty(60, 10), dirty(20, 10)]);
        assert_eq!(rank(&t, Selection::CostBenefit, 10), vec![1, 0]);
    }

    #[test]
    fn empty_segments_come_first_for_both_policies() {
        // A young empty segment scores (1-0)·1/(1+0) = 1 under the formula, far below an old
        // 10% segment (0.9·1000/1.1 = 818), yet it costs nothing to clean.
        let t = table(vec![dirty(10, 0), dirty(0, 999), dirty(0, 500)]);
        assert_eq!(rank(&t, Selection::CostBenefit, 1000), vec![1, 2, 0]);
        assert_eq!(rank(&t, Selection::Greedy, 1000), vec![1, 2, 0]);
    }

    #[test]
    fn full_segments_rank_last_and_clean_or_active_never() {
        let t = table(vec![
            dirty(100, 0),
            row(SegmentState::Clean, 0, 0),
            row(SegmentState::Active, 5, 9),
            dirty(50, 0),
        ]);
        assert_eq!(rank(&t, Selection::Greedy, 10), vec![3, 0]);
        // A full segment scores 0 however old: cleaning it reclaims nothing.
        assert_eq!(rank(&t, Selection::CostBenefit, 1_000_000), vec![3, 0]);
        // Live bytes above the segment size (a corrupt row) count as full, not as a wrap.
        let t = table(vec![dirty(u64::MAX, 0), dirty(99, 0)]);
        assert_eq!(rank(&t, Selection::CostBenefit, 10), vec![1, 0]);
        assert_eq!(
            rank(&table(vec![]), Selection::Greedy, 0),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn age_sort_orders_oldest_first_and_is_stable() {
        // (mtime, tag)
        let mut blocks = vec![(5, 'a'), (1, 'b'), (5, 'c'), (0, 'd'), (1, 'e')];
        age_sort(&mut blocks, |b| b.0);
        assert_eq!(
            blocks,
            vec![(0, 'd'), (1, 'b'), (1, 'e'), (5, 'a'), (5, 'c')]
        );
        let mut same = vec![(5, 'a'), (1, 'b')];
        Grouping::InOrder.arrange(&mut same, |b| b.0);
        assert_eq!(same, vec![(5, 'a'), (1, 'b')]);
        Grouping::AgeSort.arrange(&mut same, |b| b.0);
        assert_eq!(same, vec![(1, 'b'), (5, 'a')]);
    }

    #[test]
    fn thresholds_start_and_stop() {
        let t = Thresholds::new(2, 5).unwrap();
        assert!(t.should_start(1));
        assert!(!t.should_start(2));
        assert!(!t.satisfied(4));
        assert!(t.satisfied(5));
        assert!(Thresholds::new(0, 5).is_err());
        assert!(Thresholds::new(6, 5).is_err());
        let e = Thresholds::new(6, 5).unwrap_err().to_string();
        assert!(e.contains("start (6)") && e.contains("stop (5)"), "{e}");
        assert!(Thresholds::new(1, 1).is_ok());
    }

    #[test]
    fn plan_cleans_until_the_stop_threshold_counting_the_rewrite() {
        // 1 clean segment, stop at 3. Greedy order: 2 (u=.2), 3 (u=.4), 0 (u=.5), 1 (u=.9).
        let t = table(vec![
            dirty(50, 0),
            dirty(90, 0),
            dirty(20, 0),
            dirty(40, 0),
            row(SegmentState::Clean, 0, 0),
            row(SegmentState::Active, 0, 0),
        ]);
        let th = Thresholds::new(2, 3).unwrap();
        // Head full: 2 victims (60 live bytes fill 1 segment) → 1+2−1 = 2 clean; 3 victims
        // (110 live → 2 segments) → 1+3−2 = 2; 4 victims (200 → 2) → 3.
        let p = plan(&t, Selection::Greedy, 0, th, 0);
        assert_eq!(p.victims, vec![2, 3, 0, 1]);
        assert_eq!(p.live_bytes, 200);
        assert_eq!((p.clean_before, p.clean_after), (1, 3));
        assert!(p.reaches(th));
        // With 60 bytes free in the log head the first two victims' data fits there: 1+2 = 3.
        let p = plan(&t, Selection::Greedy, 0, th, 60);
        assert_eq!(p.victims, vec![2, 3]);
        assert_eq!(p.clean_after, 3);
    }

    #[test]
    fn plan_is_empty_when_satisfied_and_says_when_it_cannot_reach() {
        let th = Thresholds::new(1, 2).unwrap();
        let t = table(vec![
            row(SegmentState::Clean, 0, 0),
            row(SegmentState::Clean, 0, 0),
            dirty(10, 0),
        ]);
        let p = plan(&t, Selection::CostBenefit, 0, th, 0);
        assert!(p.victims.is_empty());
        assert_eq!(p.clean_after, 2);
        // Only full segments: cleaning all of them gains nothing.
        let t = table(vec![
            dirty(100, 0),
            dirty(100, 0),
            row(SegmentState::Clean, 0, 0),
        ]);
        let p = plan(&t, Selection::Greedy, 0, th, 0);
        assert_eq!(p.victims, vec![0, 1]);
        assert_eq!(p.clean_after, 1);
        assert!(!p.reaches(th));
        // No segments at all.
        let p = plan(&table(vec![]), Selection::Greedy, 0, th, 0);
        assert!(p.victims.is_empty() && !p.reaches(th));
    }

    #[test]
    fn plan_follows_the_policy_order() {
        // Cost-benefit takes the old 75% segment before the young 30% one.
        let t = table(vec![
            dirty(30, 990),
            dirty(75, 0),
            row(SegmentState::Active, 0, 0),
        ]);
        let th = Thresholds::new(1, 1).unwrap();
        // The log head is empty (100 bytes free): one victim's live data fits in it.
        assert_eq!(
            plan(&t, Selection::CostBenefit, 1000, th, SEG).victims,
            vec![1]
        );
        assert_eq!(plan(&t, Selection::Greedy, 1000, th, SEG).victims, vec![0]);
        // With the head full, the first victim's live data fills a segment of its own, so
        // one victim gains nothing and a second is needed.
        assert_eq!(
            plan(&t, Selection::CostBenefit, 1000, th, 0).victims,
            vec![1, 0]
        );
    }

    #[test]
    fn policy_names_round_trip() {
        for p in [
            Policy::GREEDY,
            Policy::GREEDY_AGE_SORT,
            Policy::COST_BENEFIT,
            Policy::COST_BENEFIT_IN_ORDER,
        ] {
            assert_eq!(Policy::parse(&p.name()), Some(p), "{}", p.name());
        }
        assert_eq!(Policy::COST_BENEFIT.name(), "cost-benefit+age-sort");
        assert_eq!(Policy::parse("lru"), None);
        assert_eq!(Policy::parse("+age-sort"), None);
        assert_eq!(Policy::parse(""), None);
    }

    #[test]
    fn utilization_is_bounded() {
        assert_eq!(utilization(50, 100), 0.5);
        assert_eq!(utilization(500, 100), 1.0);
        assert_eq!(utilization(5, 0), 0.0);
    }
}
