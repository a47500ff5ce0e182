//! Which disk states a power failure could leave, given a recording.
//!
//! The device model (DESIGN.md, "Assumptions about the device"): a write is not durable until
//! a later flush returns; the writes between two flushes (an *epoch*) may reach the media in
//! any order, or not at all; a block write lands whole unless the harness is asked for torn
//! writes, when any subset of its 512-byte sectors may land. So a crash in epoch `e` leaves
//! every earlier epoch durable plus any subset of `e`'s writes, applied in issue order (a
//! block written twice in one epoch ends up old, first or second version). Nothing of epoch
//! `e + 1` can be on the media without all of `e`: flushes are never crossed.
//!
//! **Two devices** (a journal's log on its own device: [`crate::record`]): one global
//! sequence of events, each write and flush tagged by its device. A flush makes only its own
//! device's earlier writes durable. An epoch still runs from one flush (of either device) to
//! the next, and a crash in it is judged at its end; what may or may not have landed there —
//! the epoch's *window* ([`Epoch::writes`]) — is, on each device, every write since that
//! device's last flush, however many flushes of the other device came since. With one
//! device the window is the epoch's own writes, as above. So a log write followed by a
//! flush of the file system's device and a home write leaves a state with the home block
//! and without the log record: write-ahead holds only if the log device was flushed in
//! between, which is exactly what the harness checks.
//!
//! The full subset of an epoch that ends in a flush is the same image as the empty subset of
//! the next epoch when the flush settles its whole window (always with one device), which
//! is checked with the later (stricter) crash point, so it is skipped.
//!
//! Every epoch starts with the systematic edge cases CrashMonkey-style tools use: nothing,
//! each single write missing, only the first `k`, only the last `k`, each write alone. Then
//! an epoch with few writes gets every other subset, a larger one a seeded random sample;
//! a budget too small for all of them keeps the edge cases.

use std::collections::HashSet;

use crate::record::{Event, Recording};
pub use crate::repro::{CrashState, Torn};

/// From one flush to the next, of either device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    /// Event index of the epoch's first event (the one after the previous flush).
    pub start: usize,
    /// Event indices of the writes a crash at the epoch's end may have kept or lost, in
    /// issue order: on each device, every write since that device's last flush (one
    /// device: the epoch's own writes).
    pub writes: Vec<usize>,
    /// Event index of the flush that ends it; `None` for the tail of the recording.
    pub flush: Option<usize>,
    /// The writes that flush makes durable (its device's part of `writes`): every later
    /// epoch's image has them.
    pub settled: Vec<usize>,
    /// Indices into `writes` where a device write begins after the first (a multi-block
    /// write is one device write split into block events: an LFS partial segment, a
    /// journal's log append): the crash states that keep exactly the device writes before
    /// one of these come first.
    pub boundaries: Vec<u32>,
}

/// Splits the events from `rec.header.start` on into epochs. There is always at least one
/// epoch, and one after every flush (possibly empty).
pub fn epochs(rec: &Recording) -> Vec<Epoch> {
    let mut out = Vec::new();
    // Writes since the last flush, per device (0: the file system's, 1: the log's).
    let mut pending: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    let mut start = rec.header.start;
    for (i, ev) in rec.events.iter().enumerate().skip(rec.header.start) {
        let dev = match ev {
            Event::Write { block, .. } => {
                pending[usize::from(rec.header.on_log_device(*block))].push(i);
                continue;
            }
            Event::Flush => 0,
            Event::LogFlush => 1,
            _ => continue,
        };
        let writes = window(&pending);
        out.push(Epoch {
            start,
            boundaries: boundaries(rec, &writes),
            writes,
            flush: Some(i),
            settled: std::mem::take(&mut pending[dev]),
        });
        start = i + 1;
    }
    let writes = window(&pending);
    out.push(Epoch {
        start,
        boundaries: boundaries(rec, &writes),
        writes,
        flush: None,
        settled: Vec::new(),
    });
    out
}

/// The positions in `writes` (event indices), after the first, where a device write begins
/// next to a multi-block one (it is one, or one ends just before it). Boundaries between
/// single-block writes are the "first k" edge cases already.
fn boundaries(rec: &Recording, writes: &[usize]) -> Vec<u32> {
    let cont = |k: usize| {
        writes
            .get(k)
            .is_some_and(|&i| matches!(rec.events[i], Event::Write { cont: true, .. }))
    };
    (1..writes.len())
        .filter(|&k| !cont(k) && (cont(k - 1) || cont(k + 1)))
        .map(|k| k as u32)
        .collect()
}

/// Both devices' pending writes, in issue order.
fn window(pending: &[Vec<usize>; 2]) -> Vec<usize> {
    let mut w: Vec<usize> = pending.iter().flatten().copied().collect();
    w.sort_unstable();
    w
}

impl CrashState {
    /// A short description for reports: `epoch 12: 3/5 writes [0,2,4], write 2 torn (sectors 0-3)`.
    pub fn describe(&self, epochs: &[Epoch]) -> String {
        let n = epochs.get(self.epoch).map_or(0, |e| e.writes.len());
        let mut s = format!(
            "epoch {}: {}/{} writes {:?}",
            self.epoch,
            self.kept.len(),
            n,
            self.kept
        );
        if let Some(t) = &self.torn {
            s.push_str(&format!(
                ", write {} torn (sectors {:?})",
                t.write, t.sectors
            ));
        }
        if self.at_end {
            s.push_str(", after the last operation returned");
        }
        s
    }
}

/// The moment of the crash, as an event index: events before it had happened. A state is
/// possible at any moment from its last kept write until the epoch's flush completes, and
/// the oracle judges it at the *latest* of them: the image is the same, and every
/// operation that had returned by then must be durable. (Judging at the earliest moment
/// would forgive a call that returned before its last write was flushed: the crash may come
/// right after the return, before any later write.) Nothing is lost by not judging earlier
/// moments: an effect in the image comes from a write that was issued, so its operation had
/// begun, and it is either returned or in flight at the later moment.
pub fn crash_point(epochs: &[Epoch], st: &CrashState, total_events: usize) -> usize {
    if st.at_end {
        return total_events;
    }
    epochs[st.epoch].flush.unwrap_or(total_events)
}

/// Options of [`generate`].
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// How many states to produce (fewer when the recording has fewer distinct states).
    pub states: usize,
    pub seed: u64,
    /// Also produce states with one torn block write.
    pub torn: bool,
    /// Sectors per block (block size / 512), for torn writes.
    pub sectors: u32,
    /// Epochs with at most this many writes get every subset.
    pub exhaustive_writes: u32,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            states: 1000,
            seed: 1,
            torn: true,
            sectors: 8,
            exhaustive_writes: 10,
        }
    }
}

/// A small deterministic generator (SplitMix64): campaigns must replay from a seed on any
/// build, whatever the version of an external crate.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// Whether the epoch's full subset is skipped: it ends in a flush that settles its whole
/// window, so the full subset is the next epoch's empty state (see the module doc).
fn skips_full(ep: &Epoch) -> bool {
    ep.flush.is_some() && !ep.writes.is_empty() && ep.settled.len() == ep.writes.len()
}

/// How many distinct untorn states epoch `e` has (saturating).
fn capacity(epochs: &[Epoch], e: usize) -> u64 {
    let n = epochs[e].writes.len() as u32;
    let all = if n >= 63 { u64::MAX / 2 } else { 1u64 << n };
    // The full subset of a flushed epoch is the next epoch's empty state.
    if skips_full(&epochs[e]) { all - 1 } else { all }
}

/// Generates up to `opts.states` distinct crash states, spread over the epochs: every epoch
/// gets an equal share, and what a small epoch cannot use goes to the larger ones. One state
/// after the last operation returned is always included.
pub fn generate(epochs: &[Epoch], opts: &GenOptions) -> Vec<CrashState> {
    let mut rng = Rng::new(opts.seed);
    let last = epochs.len() - 1;
    let mut out = vec![CrashState {
        epoch: last,
        kept: (0..epochs[last].writes.len() as u32).collect(),
        torn: None,
        at_end: true,
    }];
    let budget = opts.states.saturating_sub(1) as u64;
    let torn_ok = opts.torn && opts.sectors > 1;
    // Torn variants: up to 4 per write (two systematic, two random masks).
    let cap: Vec<u64> = (0..epochs.len())
        .map(|e| {
            let n = epochs[e].writes.len() as u64;
            capacity(epochs, e).saturating_add(if torn_ok { 4 * n } else { 0 })
        })
        .collect();
    let share = water_fill(&cap, budget);
    for (e, &want) in share.iter().enumerate() {
        if want > 0 {
            epoch_states(epochs, e, want as usize, opts, torn_ok, &mut rng, &mut out);
        }
    }
    out
}

/// Splits `budget` over bins of the given capacities as evenly as the capacities allow.
pub(crate) fn water_fill(cap: &[u64], budget: u64) -> Vec<u64> {
    let mut share = vec![0u64; cap.len()];
    let mut left = budget;
    let mut open: Vec<usize> = (0..cap.len()).filter(|&i| cap[i] > 0).collect();
    while left > 0 && !open.is_empty() {
        let each = (left / open.len() as u64).max(1);
        let mut next = Vec::new();
        for &i in &open {
            if left == 0 {
                break;
            }
            let give = each.min(cap[i] - share[i]).min(left);
            share[i] += give;
            left -= give;
            if share[i] < cap[i] {
                next.push(i);
            }
        }
        open = next;
    }
    share
}

fn epoch_states(
    epochs: &[Epoch],
    e: usize,
    want: usize,
    opts: &GenOptions,
    torn_ok: bool,
    rng: &mut Rng,
    out: &mut Vec<CrashState>,
) {
    let ep = &epochs[e];
    let n = ep.writes.len() as u32;
    let skip_full = skips_full(ep);
    let torn_want = if torn_ok && n > 0 {
        (want / 8).max(1).min(4 * n as usize)
    } else {
        0
    };
    let plain_want = want - torn_want;
    let mut seen: HashSet<Vec<u32>> = HashSet::new();
    let mut plain = Vec::new();
    let mut push = |kept: Vec<u32>, plain: &mut Vec<Vec<u32>>| {
        let full = kept.len() as u32 == n;
        if plain.len() < plain_want && !(skip_full && full) && seen.insert(kept.clone()) {
            plain.push(kept);
        }
    };
    // The in-order crash at each boundary between device writes first: every device write
    // before it whole, nothing after — where a log written in several pieces (an LFS flush
    // in several partial segments, only the last flagged COMMIT) is cut between them.
    // Without them a large epoch's budget rarely lands on one.
    push(Vec::new(), &mut plain);
    for &k in &ep.boundaries {
        push((0..k).collect(), &mut plain);
    }
    // Edge cases next, interleaved so a small budget still gets some of each kind: a
    // write alone or a write missing is where a misordered step shows (an entry without
    // its inode, a bitmap without the cleared pointer), whatever its place in the epoch.
    for k in 0..n {
        push((0..k).collect(), &mut plain); // only the first k
        push((0..n).filter(|&i| i != k).collect(), &mut plain); // write k missing
        push((n - k..n).collect(), &mut plain); // only the last k
        push(vec![k], &mut plain); // write k alone
        if plain.len() >= plain_want {
            break;
        }
    }
    if n <= opts.exhaustive_writes.min(20) {
        for mask in 0u32..(1u32 << n) {
            push(
                (0..n).filter(|i| mask & (1 << i) != 0).collect(),
                &mut plain,
            );
        }
    } else {
        let mut tries = 0;
        while plain.len() < plain_want && tries < plain_want * 20 {
            tries += 1;
            // A random density per state: sparse and dense subsets both get sampled.
            let p = rng.below(1000) + 1;
            push((0..n).filter(|_| rng.below(1001) < p).collect(), &mut plain);
        }
    }
    for kept in plain {
        out.push(CrashState {
            epoch: e,
            kept,
            torn: None,
            at_end: false,
        });
    }
    // Torn writes: the in-order crash in the middle of write k (everything before it
    // landed, k partly), with the first or the second half of its sectors, then random
    // subsets with a random kept write torn at a random sector mask.
    let secs = opts.sectors.min(u16::MAX as u32) as u16;
    let mut torn_seen = HashSet::new();
    let mut made = 0;
    let mut k = 0u32;
    let mut tries = 0;
    while made < torn_want && tries < torn_want * 20 {
        tries += 1;
        let (kept, write, sectors) = if k < n && made < torn_want / 2 + 1 {
            let half = secs / 2;
            let sectors: Vec<u16> = if k.is_multiple_of(2) {
                (0..half).collect()
            } else {
                (half..secs).collect()
            };
            k += 1;
            ((0..k).collect::<Vec<u32>>(), k - 1, sectors)
        } else {
            let mut kept: Vec<u32> = (0..n).filter(|_| rng.chance(1, 2)).collect();
            if kept.is_empty() {
                kept.push(rng.below(n as u64) as u32);
            }
            let write = kept[rng.below(kept.len() as u64) as usize];
            let mut sectors: Vec<u16> = (0..secs).filter(|_| rng.chance(1, 2)).collect();
            if sectors.is_empty() {
                sectors.push(0);
            }
            if sectors.len() == secs as usize {
                sectors.pop();
            }
            (kept, write, sectors)
        };
        let t = Torn { write, sectors };
        if torn_seen.insert((kept.clone(), t.clone())) {
            out.push(CrashState {
                epoch: e,
                kept,
                torn: Some(t),
                at_end: false,
            });
            made += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Base, BlockData, FORMAT, Header};

    fn rec(events: Vec<Event>, start: usize) -> Recording {
        Recording {
            header: Header {
                recording: FORMAT,
                block_size: 4096,
                num_blocks: 64,
                base: Base::Zero,
                mode: "sync".into(),
                workload: "t".into(),
                start,
                tagged: false,
                log_blocks: 0,
                repro: None,
            },
            events,
        }
    }

    fn w(b: u64) -> Event {
        Event::Write {
            block: b,
            data: BlockData::Zero,
            cont: false,
        }
    }

    #[test]
    fn epochs_split_at_flushes_and_skip_the_prefix() {
        let r = rec(vec![w(0), Event::Flush, w(1), w(2), Event::Flush, w(3)], 2);
        let e = epochs(&r);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].writes, vec![2, 3]);
        assert_eq!((e[0].start, e[0].flush), (2, Some(4)));
        assert_eq!(e[1].writes, vec![5]);
        assert_eq!((e[1].start, e[1].flush), (5, None));
        let r = rec(vec![w(0), Event::Flush], 0);
        let e = epochs(&r);
        assert_eq!(e.len(), 2);
        assert!(e[1].writes.is_empty());
    }

    #[test]
    fn small_epochs_get_every_subset_but_not_the_duplicate_full_one() {
        let r = rec(vec![w(1), w(2), w(3), Event::Flush, w(4), w(5)], 0);
        let e = epochs(&r);
        let st = generate(
            &e,
            &GenOptions {
                states: 1000,
                torn: false,
                ..Default::default()
            },
        );
        let of = |ep: usize| -> HashSet<Vec<u32>> {
            st.iter()
                .filter(|s| s.epoch == ep && !s.at_end)
                .map(|s| s.kept.clone())
                .collect()
        };
        // Epoch 0: 2^3 subsets minus the full one (it equals epoch 1's empty state).
        assert_eq!(of(0).len(), 7);
        assert!(!of(0).contains(&vec![0, 1, 2]));
        // The unflushed tail keeps its full subset.
        assert_eq!(of(1).len(), 4);
        assert!(of(1).contains(&vec![0, 1]));
        assert_eq!(st.iter().filter(|s| s.at_end).count(), 1);
        // Distinct states only.
        let all: HashSet<_> = st.iter().collect();
        assert_eq!(all.len(), st.len());
    }

    #[test]
    fn large_epochs_are_sampled_with_edge_cases_within_budget() {
        let mut ev: Vec<Event> = (0..40).map(w).collect();
        ev.push(Event::Flush);
        let r = rec(ev, 0);
        let e = epochs(&r);
        let st = generate(
            &e,
            &GenOptions {
                states: 300,
                torn: false,
                ..Default::default()
            },
        );
        assert_eq!(st.len(), 300);
        let kept: HashSet<Vec<u32>> = st
            .iter()
            .filter(|s| !s.at_end)
            .map(|s| s.kept.clone())
            .collect();
        assert!(kept.contains(&vec![]));
        assert!(
            kept.contains(&(0..39).collect::<Vec<u32>>()),
            "write 39 missing"
        );
        assert!(
            kept.contains(&(1..40).collect::<Vec<u32>>()),
            "write 0 missing"
        );
        assert!(kept.contains(&vec![0, 1, 2]), "first 3");
        assert!(kept.contains(&vec![37, 38, 39]), "last 3");
        // Every kept index is a write of that epoch, and a flushed epoch never shows all.
        for s in st.iter().filter(|s| !s.at_end) {
            assert!(s.kept.iter().all(|&k| k < 40));
            assert!(s.kept.windows(2).all(|p| p[0] < p[1]));
            assert_ne!(s.kept.len(), 40);
        }
        // Deterministic in the seed.
        let again = generate(
            &e,
            &GenOptions {
                states: 300,
                torn: false,
                ..Default::default()
            },
        );
        assert_eq!(st, again);
    }

    /// A large epoch made of device writes of several blocks (an LFS flush in partial
    /// segments): the in-order crash at every boundary between them is among its states,
    /// however small its budget, before the other edge cases.
    #[test]
    fn every_boundary_between_multi_block_writes_is_a_crash_state() {
        // Four device writes of 10 blocks, then single blocks.
        let mut ev = Vec::new();
        for part in 0..4u64 {
            for b in 0..10 {
                ev.push(Event::Write {
                    block: 100 + part * 10 + b,
                    data: BlockData::Zero,
                    cont: b > 0,
                });
            }
        }
        ev.extend((0..5).map(w));
        ev.push(Event::Flush);
        let e = epochs(&rec(ev, 0));
        assert_eq!(e[0].boundaries, vec![10, 20, 30, 40]);
        let st = generate(
            &e,
            &GenOptions {
                states: 8,
                torn: false,
                ..Default::default()
            },
        );
        let kept: HashSet<Vec<u32>> = st.iter().map(|s| s.kept.clone()).collect();
        for k in [10, 20, 30, 40] {
            assert!(kept.contains(&(0..k).collect::<Vec<u32>>()), "cut at {k}");
        }
        // Single-block writes are no boundaries of their own.
        let e = epochs(&rec(vec![w(1), w(2), w(3), Event::Flush], 0));
        assert!(e[0].boundaries.is_empty());
    }

    #[test]
    fn reorder_never_crosses_a_flush() {
        // A state is (epoch, subset of that epoch): by construction it can hold no write of
        // a later epoch without all of the earlier ones. Its crash point is the epoch's
        // flush (the latest moment the state is possible), never beyond it.
        let r = rec(vec![w(1), Event::Flush, w(2), w(3), Event::Flush, w(4)], 0);
        let e = epochs(&r);
        let st = generate(&e, &GenOptions::default());
        for s in &st {
            let cp = crash_point(&e, s, r.events.len());
            if s.at_end {
                assert_eq!(cp, 6);
                continue;
            }
            let ep = &e[s.epoch];
            for &k in &s.kept {
                assert!(
                    ep.writes[k as usize] < cp,
                    "kept write after the crash point"
                );
            }
            assert_eq!(cp, ep.flush.unwrap_or(6));
        }
        let at = |epoch, kept: Vec<u32>| {
            crash_point(
                &e,
                &CrashState {
                    epoch,
                    kept,
                    torn: None,
                    at_end: false,
                },
                6,
            )
        };
        assert_eq!(at(1, vec![]), 4);
        assert_eq!(at(1, vec![0]), 4);
        assert_eq!(at(2, vec![]), 6);
    }

    #[test]
    fn torn_states_tear_a_kept_write_partially() {
        let r = rec(vec![w(1), w(2), w(3), Event::Flush], 0);
        let e = epochs(&r);
        let st = generate(
            &e,
            &GenOptions {
                states: 100,
                torn: true,
                sectors: 8,
                ..Default::default()
            },
        );
        let torn: Vec<_> = st.iter().filter(|s| s.torn.is_some()).collect();
        assert!(!torn.is_empty());
        for s in torn {
            let t = s.torn.as_ref().unwrap();
            assert!(s.kept.contains(&t.write));
            assert!(!t.sectors.is_empty() && t.sectors.len() < 8);
            assert!(t.sectors.iter().all(|&x| x < 8));
        }
        // The in-order tear of the first write: nothing before it, half of it.
        assert!(st.iter().any(|s| s.kept == vec![0]
            && s.torn
                == Some(Torn {
                    write: 0,
                    sectors: vec![0, 1, 2, 3]
                })));
    }

    /// The event indices of the writes on the media in state `s`.
    fn landed(e: &[Epoch], s: &CrashState) -> HashSet<usize> {
        let mut out: HashSet<usize> = e[..s.epoch]
            .iter()
            .flat_map(|x| x.settled.clone())
            .collect();
        out.extend(s.kept.iter().map(|&k| e[s.epoch].writes[k as usize]));
        out
    }

    /// Two devices: blocks 0..64 the file system's, 64.. the log's (`log_blocks`).
    fn two(events: Vec<Event>) -> Recording {
        let mut r = rec(events, 0);
        r.header.log_blocks = 16;
        r
    }

    #[test]
    fn a_flush_settles_only_its_own_device() {
        // A log record (event 0), a flush of the file system's device, a home block (2):
        // write-ahead broken. The log write stays pending across the other device's flush.
        let r = two(vec![w(64), Event::Flush, w(5), Event::Flush]);
        let e = epochs(&r);
        assert_eq!(e.len(), 3);
        assert_eq!(
            (e[0].writes.clone(), e[0].settled.clone()),
            (vec![0], vec![])
        );
        assert_eq!(
            (e[1].writes.clone(), e[1].settled.clone()),
            (vec![0, 2], vec![2])
        );
        assert_eq!(
            (e[2].writes.clone(), e[2].settled.clone()),
            (vec![0], vec![])
        );
        let opts = GenOptions {
            states: 1000,
            torn: false,
            ..Default::default()
        };
        let st = generate(&e, &opts);
        // The state the journal must never leave: the home block without its log record.
        assert!(
            st.iter().any(|s| {
                let l = landed(&e, s);
                l.contains(&2) && !l.contains(&0)
            }),
            "{st:?}"
        );
        // A window the flush does not settle keeps its full subset (it is no later
        // epoch's empty state).
        assert!(st.iter().any(|s| s.epoch == 1 && s.kept == vec![0, 1]));
        // Write-ahead kept (the log device flushed before the home write): no state has
        // the home block without the log record, and the log's flush settles only it.
        let r = two(vec![w(64), Event::LogFlush, w(5), Event::Flush]);
        let e = epochs(&r);
        assert_eq!(e[0].settled, vec![0]);
        assert_eq!(e[1].writes, vec![2]);
        for s in generate(&e, &opts) {
            let l = landed(&e, &s);
            assert!(!l.contains(&2) || l.contains(&0), "{s:?}");
        }
    }

    #[test]
    fn water_fill_gives_small_bins_all_and_the_rest_to_big_ones() {
        assert_eq!(water_fill(&[1, 100, 3], 30), vec![1, 26, 3]);
        assert_eq!(water_fill(&[2, 2], 100), vec![2, 2]);
        assert_eq!(water_fill(&[0, 5], 3), vec![0, 3]);
    }
}
