//! Crash states of the log, in the manner of `crates/crash` (docs/CRASH.md), self-contained.
//!
//! A seeded workload of appends, forces, checkpoints and reads runs on a memory device whose
//! trace keeps every write's bytes. The trace is cut into *epochs* at its flushes. A crash in
//! epoch `e` leaves every earlier epoch's writes and any subset of `e`'s, applied in issue
//! order (docs/DESIGN.md, "Assumptions about the device"); one of them may be *torn* (only
//! some of its 512-byte sectors landed), and a superblock write may leave its sector
//! *garbled* (neither old nor new — stronger than the device model, and what the two
//! alternating superblock copies are for). Every epoch is crashed: all subsets of a small
//! epoch, the edge cases and a seeded sample of a large one, torn variants of each write.
//!
//! Each state is opened and must recover:
//! - a checkpoint some `set_checkpoint` call had begun (or the initial one), no older than
//!   the newest that had returned;
//! - from it, a prefix of the records appended since, byte for byte (nothing after a record
//!   that did not land: a prefix has no holes);
//! - containing every record a returned `force` covered.
//!
//! Some states are then opened read-write and run a second workload, whose own crash states
//! are checked against "what the first open recovered, then what the second appended": the
//! records a crashed open left beyond its recovered end (ghosts) must never reappear.

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice, TraceOp, VecTrace};

use super::{Rng, seed};
use crate::plant::{self, Plant};
use crate::{FormatOptions, GroupWait, Lsn, Options, Region, Wal, WalError};

/// One campaign's shape.
#[derive(Clone, Copy, Debug)]
struct Shape {
    bs: u32,
    data_blocks: u64,
    /// Record payload sizes: `Mixed` (a byte to over two blocks) or `Uniform` (one size, so a
    /// later open's records line up with an earlier open's: ghosts sit exactly where the scan
    /// looks).
    uniform: bool,
    ops: usize,
    ops_later: usize,
    /// Crash states of the first workload that run a second one.
    continuations: usize,
}

const MIXED: Shape = Shape {
    bs: 4096,
    data_blocks: 10,
    uniform: false,
    ops: 240,
    ops_later: 30,
    continuations: 40,
};

const UNIFORM: Shape = Shape {
    bs: 4096,
    data_blocks: 8,
    uniform: true,
    ops: 120,
    ops_later: 40,
    continuations: 40,
};

/// What the client knows: records appended (LSN order), forces and checkpoints with the trace
/// positions at which they began and returned.
#[derive(Clone, Debug, Default)]
struct History {
    appended: Vec<(u64, Vec<u8>)>,
    /// (trace length at return, LSN): every record up to LSN durable from then on.
    forced: Vec<(usize, u64)>,
    /// (trace length at the call, trace length at return if it returned, LSN).
    checkpoints: Vec<(usize, Option<usize>, u64)>,
    initial_checkpoint: u64,
}

#[derive(Clone, Debug)]
struct CrashState {
    kept: Vec<usize>,
    /// (index into `kept`, landed sectors as a bit mask).
    torn: Option<(usize, u64)>,
    /// Index into `kept` of a superblock write whose first sector is garbage.
    garbled: Option<usize>,
}

struct Epoch {
    /// Indices into the trace of its writes.
    writes: Vec<usize>,
    /// The trace index of the flush ending it (the crash point), or the trace's length.
    end: usize,
}

/// Records as (LSN, payload).
type Records = Vec<(u64, Vec<u8>)>;

type Trace = Vec<(cairn_blockdev::TraceEvent, Option<Vec<u8>>)>;

fn epochs(trace: &Trace, from: usize) -> Vec<Epoch> {
    let mut out = Vec::new();
    let mut writes = Vec::new();
    for (i, (ev, _)) in trace.iter().enumerate().skip(from) {
        match ev.op {
            TraceOp::Write => writes.push(i),
            TraceOp::Flush => out.push(Epoch {
                writes: std::mem::take(&mut writes),
                end: i,
            }),
            TraceOp::Read => {}
            TraceOp::Zero => panic!("the log never issues a zero-range write"),
        }
    }
    out.push(Epoch {
        writes,
        end: trace.len(),
    });
    out
}

/// The crash states of one epoch.
fn states_of(ep: &Epoch, trace: &Trace, shape: Shape, rng: &mut Rng) -> Vec<CrashState> {
    let n = ep.writes.len();
    let st = |kept: Vec<usize>| CrashState {
        kept,
        torn: None,
        garbled: None,
    };
    let mut subsets: Vec<Vec<usize>> = Vec::new();
    if n <= 5 {
        for mask in 0..1u64 << n {
            subsets.push((0..n).filter(|&i| mask >> i & 1 == 1).collect());
        }
    } else {
        subsets.push(Vec::new());
        subsets.push((0..n).collect());
        for i in 0..n {
            subsets.push((0..n).filter(|&j| j != i).collect());
            subsets.push(vec![i]);
            subsets.push((0..i).collect());
        }
        for _ in 0..24 {
            subsets.push((0..n).filter(|_| rng.chance(1, 2)).collect());
        }
    }
    let mut out: Vec<CrashState> = subsets.into_iter().map(st).collect();
    // Torn: the writes before it (or a random subset of them) landed, it landed in part.
    for w in 0..n {
        let (ev, _) = &trace[ep.writes[w]];
        let sectors = u64::from(ev.blocks) * u64::from(shape.bs) / 512;
        if sectors < 2 {
            continue;
        }
        let full = if sectors >= 64 {
            u64::MAX
        } else {
            (1 << sectors) - 1
        };
        let mut masks: Vec<u64> = (1..sectors.min(9)).map(|k| (1 << k) - 1).collect();
        masks.push(full & !1); // all but the first sector
        for _ in 0..4 {
            masks.push(rng.next_u64() & full);
        }
        for m in masks {
            if m == 0 || m == full {
                continue;
            }
            let mut kept: Vec<usize> = (0..w).collect();
            if rng.chance(1, 3) {
                kept.retain(|_| rng.chance(1, 2));
            }
            kept.push(w);
            let at = kept.len() - 1;
            out.push(CrashState {
                torn: Some((at, m)),
                ..st(kept)
            });
        }
    }
    out
}

fn apply(img: &mut [u8], bs: u32, block: u64, data: &[u8], sectors: Option<u64>) {
    let off = (block * u64::from(bs)) as usize;
    for (s, chunk) in data.chunks(512).enumerate() {
        if sectors.is_none_or(|m| s >= 64 || m >> s & 1 == 1) {
            img[off + s * 512..off + s * 512 + chunk.len()].copy_from_slice(chunk);
        }
    }
}

/// The image of a crash state over `durable` (every earlier epoch applied).
fn image(
    durable: &[u8],
    st: &CrashState,
    ep: &Epoch,
    trace: &Trace,
    shape: Shape,
    rng: &mut Rng,
) -> Vec<u8> {
    let mut img = durable.to_vec();
    for (k, &w) in st.kept.iter().enumerate() {
        let (ev, data) = &trace[ep.writes[w]];
        let data = data.as_deref().expect("trace keeps data");
        let sectors = st.torn.filter(|t| t.0 == k).map(|t| t.1);
        apply(&mut img, shape.bs, ev.block, data, sectors);
        if st.garbled == Some(k) {
            let off = (ev.block * u64::from(shape.bs)) as usize;
            for b in &mut img[off..off + 512] {
                *b = rng.next_u64() as u8;
            }
        }
    }
    img
}

/// Checks one crash state; returns what it recovered (for a continuation).
fn check(
    img: Vec<u8>,
    shape: Shape,
    region: Region,
    hist: &History,
    crash_point: usize,
) -> Result<(Records, u64), String> {
    let dev = Arc::new(MemDevice::from_bytes(shape.bs, img));
    let w = Wal::open_read_only(dev, region).map_err(|e| format!("the log does not open: {e}"))?;
    let ckpt = w.checkpoint().0;
    let begun = std::iter::once(hist.initial_checkpoint).chain(
        hist.checkpoints
            .iter()
            .filter(|c| c.0 <= crash_point)
            .map(|c| c.2),
    );
    if !begun.clone().any(|c| c == ckpt) {
        return Err(format!("recovered checkpoint {ckpt} was never set"));
    }
    let must = hist
        .checkpoints
        .iter()
        .filter(|c| c.1.is_some_and(|r| r <= crash_point))
        .map(|c| c.2)
        .max()
        .unwrap_or(0)
        .max(hist.initial_checkpoint);
    if ckpt < must {
        return Err(format!(
            "recovered checkpoint {ckpt} is older than {must}, whose set_checkpoint returned"
        ));
    }
    let mut got = Vec::new();
    for r in w.scan(Lsn(ckpt)) {
        let r = r.map_err(|e| format!("a recovered record does not read back: {e}"))?;
        got.push((r.lsn.0, r.data));
    }
    let want: Vec<_> = hist.appended.iter().filter(|r| r.0 >= ckpt).collect();
    for (i, g) in got.iter().enumerate() {
        match want.get(i) {
            Some(&w) if w == g => {}
            Some(w) => {
                return Err(format!(
                    "recovered record {i} is LSN {} ({} bytes), expected LSN {} ({} bytes): not a prefix of the appended records (stop: {})",
                    g.0,
                    g.1.len(),
                    w.0,
                    w.1.len(),
                    w_stop(&got, i)
                ));
            }
            None => {
                return Err(format!(
                    "recovered record {i} at LSN {} was never appended",
                    g.0
                ));
            }
        }
    }
    let forced = hist
        .forced
        .iter()
        .filter(|f| f.0 <= crash_point && f.1 >= ckpt)
        .map(|f| f.1)
        .max();
    if let Some(f) = forced
        && got.last().is_none_or(|g| g.0 < f)
    {
        return Err(format!(
            "record {f} was forced before the crash but recovery stopped at {} ({}, {} records)",
            w.end(),
            w.recovery().stop,
            got.len()
        ));
    }
    Ok((got, ckpt))
}

fn w_stop(got: &[(u64, Vec<u8>)], i: usize) -> String {
    format!("{} records recovered, mismatch at {i}", got.len())
}

fn payload(rng: &mut Rng, shape: Shape, tag: u64) -> Vec<u8> {
    let len = if shape.uniform {
        200
    } else {
        match rng.below(10) {
            0..=3 => rng.below(40),
            4..=6 => 100 + rng.below(500),
            7..=8 => 500 + rng.below(1500),
            _ => 4096 + rng.below(5000),
        }
    } as usize;
    let mut p: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
    for (i, b) in tag.to_le_bytes().iter().enumerate().take(len) {
        p[i] = *b;
    }
    p
}

/// A workload on `w`, recording into `hist` with trace positions from `trace`.
fn workload(
    w: &Wal,
    trace: &VecTrace,
    hist: &mut History,
    rng: &mut Rng,
    shape: Shape,
    ops: usize,
    tag: &mut u64,
) -> Result<(), String> {
    let err = |what: &str, e: WalError| format!("{what}: {e}");
    let checkpoint = |w: &Wal, hist: &mut History, rng: &mut Rng| -> Result<(), String> {
        let ckpt = w.checkpoint().0;
        let live: Vec<u64> = hist
            .appended
            .iter()
            .map(|r| r.0)
            .filter(|&l| l >= ckpt)
            .collect();
        let at = if live.is_empty() || rng.chance(1, 3) {
            w.end().0
        } else {
            live[rng.below(live.len() as u64) as usize]
        };
        let start = trace.len();
        hist.checkpoints.push((start, None, at));
        w.set_checkpoint(Lsn(at))
            .map_err(|e| err("set_checkpoint", e))?;
        let i = hist.checkpoints.len() - 1;
        hist.checkpoints[i].1 = Some(trace.len());
        Ok(())
    };
    // Some workloads checkpoint rarely, so the log fills and appends meet `Full`.
    let rare = rng.chance(1, 2);
    for _ in 0..ops {
        let mut op = rng.below(100);
        if rare && (75..=84).contains(&op) && !rng.chance(1, 10) {
            op = 0;
        }
        match op {
            0..=54 => {
                *tag += 1;
                let p = payload(rng, shape, *tag);
                let lsn = loop {
                    match w.append(&p) {
                        Ok(l) => break l,
                        Err(WalError::Full { .. }) => checkpoint(w, hist, rng)?,
                        Err(e) => return Err(err("append", e)),
                    }
                };
                if hist.appended.last().is_some_and(|r| r.0 >= lsn.0) {
                    return Err(format!("LSN {lsn} is not above the previous one"));
                }
                hist.appended.push((lsn.0, p));
            }
            55..=74 => {
                let Some(&(last, _)) = hist.appended.last() else {
                    continue;
                };
                let ckpt = w.checkpoint().0;
                let live: Vec<u64> = hist
                    .appended
                    .iter()
                    .map(|r| r.0)
                    .filter(|&l| l >= ckpt)
                    .collect();
                let lsn = if live.is_empty() || rng.chance(2, 3) {
                    last
                } else {
                    live[rng.below(live.len() as u64) as usize]
                };
                w.force(Lsn(lsn)).map_err(|e| err("force", e))?;
                hist.forced.push((trace.len(), lsn));
            }
            75..=84 => checkpoint(w, hist, rng)?,
            85..=89 => {
                if let Some(&(last, _)) = hist.appended.last() {
                    w.sync().map_err(|e| err("sync", e))?;
                    hist.forced.push((trace.len(), last));
                }
            }
            _ => {
                let ckpt = w.checkpoint().0;
                let live: Vec<&(u64, Vec<u8>)> =
                    hist.appended.iter().filter(|r| r.0 >= ckpt).collect();
                if live.is_empty() {
                    continue;
                }
                let r = live[rng.below(live.len() as u64) as usize];
                let got = w.read(Lsn(r.0)).map_err(|e| err("read", e))?;
                if got.data != r.1 {
                    return Err(format!("read of LSN {} returned other bytes", r.0));
                }
            }
        }
    }
    Ok(())
}

#[derive(Default, Debug)]
struct Tally {
    states: u64,
    epochs: u64,
    continuations: u64,
    torn: u64,
    garbled: u64,
    records_recovered: u64,
}

/// One generation: open `base` read-write with a recording, run the workload, check every
/// crash state; some states run the next generation.
#[allow(clippy::too_many_arguments)]
fn generation(
    base: Vec<u8>,
    shape: Shape,
    region: Region,
    mut hist: History,
    rng: &mut Rng,
    depth: u32,
    tally: &mut Tally,
    tag: &mut u64,
) -> Result<(), String> {
    let dev = Arc::new(MemDevice::from_bytes(shape.bs, base.clone()));
    let trace = Arc::new(VecTrace::with_data());
    dev.set_trace(Some(trace.clone()));
    let opts = Options {
        group_wait: GroupWait::Off,
        write_behind: Some(
            [0, u64::from(shape.bs), 2 * u64::from(shape.bs)][rng.below(3) as usize],
        ),
        ..Default::default()
    };
    let w = Wal::open_with(dev.clone(), region, opts).map_err(|e| format!("open: {e}"))?;
    let ops = if depth == 0 {
        shape.ops
    } else {
        shape.ops_later
    };
    let run = workload(&w, &trace, &mut hist, rng, shape, ops, tag);
    drop(w);
    let trace = trace.records();
    let eps = epochs(&trace, 0);
    let mut durable = base;
    let mut candidates = Vec::new();
    for (e, ep) in eps.iter().enumerate() {
        tally.epochs += 1;
        let mut sts = states_of(ep, &trace, shape, rng);
        // Garbled superblock sectors.
        for (k, &wi) in ep.writes.iter().enumerate() {
            let b = trace[wi].0.block;
            if b >= region.first_block && b < region.first_block + 2 {
                let kept: Vec<usize> = (0..=k).collect();
                sts.push(CrashState {
                    garbled: Some(k),
                    torn: None,
                    kept,
                });
            }
        }
        for st in &sts {
            let img = image(&durable, st, ep, &trace, shape, rng);
            tally.states += 1;
            tally.torn += u64::from(st.torn.is_some());
            tally.garbled += u64::from(st.garbled.is_some());
            let (got, ckpt) = check(img.clone(), shape, region, &hist, ep.end).map_err(|m| {
                format!(
                    "depth {depth}, epoch {e}/{} ({} writes), kept {:?}, torn {:?}, garbled {:?}: {m}",
                    eps.len(),
                    ep.writes.len(),
                    st.kept,
                    st.torn,
                    st.garbled
                )
            })?;
            tally.records_recovered += got.len() as u64;
            if depth == 0 {
                candidates.push((img, got, ckpt));
            }
        }
        for &wi in &ep.writes {
            let (ev, data) = &trace[wi];
            apply(
                &mut durable,
                shape.bs,
                ev.block,
                data.as_deref().unwrap_or(&[]),
                None,
            );
        }
    }
    // A workload error is a failure too, reported after the states it left were checked
    // (a planted bug may break the workload's own reads).
    run.map_err(|e| format!("depth {depth}: workload: {e}"))?;
    if depth > 0 {
        return Ok(());
    }
    for _ in 0..shape.continuations.min(candidates.len()) {
        let i = rng.below(candidates.len() as u64) as usize;
        let (img, got, ckpt) = candidates.swap_remove(i);
        let next = History {
            forced: got.last().map(|g| (0, g.0)).into_iter().collect(),
            appended: got,
            checkpoints: Vec::new(),
            initial_checkpoint: ckpt,
        };
        tally.continuations += 1;
        generation(img, shape, region, next, rng, depth + 1, tally, tag)?;
    }
    Ok(())
}

/// One campaign from a seed: format, run, check. `Err` names the first failing state.
fn campaign(shape: Shape, seed: u64) -> Result<Tally, String> {
    let mut rng = Rng::new(seed);
    let pad = 1 + rng.below(3);
    let dev = MemDevice::new(shape.bs, pad + 2 + shape.data_blocks + 2);
    let region = Region {
        first_block: pad,
        blocks: 2 + shape.data_blocks,
    };
    let fo = FormatOptions {
        uuid: Some(
            rng.next_u64()
                .to_le_bytes()
                .repeat(2)
                .try_into()
                .expect("16"),
        ),
        ..Default::default()
    };
    let sb = Wal::format(&dev, region, &fo).map_err(|e| e.to_string())?;
    let hist = History {
        initial_checkpoint: sb.checkpoint,
        ..Default::default()
    };
    let mut tally = Tally::default();
    let mut tag = seed << 20;
    generation(
        dev.to_bytes(),
        shape,
        region,
        hist,
        &mut rng,
        0,
        &mut tally,
        &mut tag,
    )?;
    Ok(tally)
}

fn run(name: &str, shape: Shape, seeds: u64) {
    let s0 = seed(name);
    for i in 0..seeds {
        let s = s0.wrapping_add(i);
        match campaign(shape, s) {
            Ok(t) => println!("{name}: seed {s}: {t:?}"),
            Err(e) => panic!("{name}: seed {s} (CAIRN_WAL_SEED={s}): {e}"),
        }
    }
}

#[test]
fn crash_states_mixed_sizes() {
    run("crash_states_mixed_sizes", MIXED, 3);
}

#[test]
fn crash_states_uniform_sizes_with_later_opens() {
    run("crash_states_uniform_sizes_with_later_opens", UNIFORM, 3);
}

/// Each planted bug switches off one guarantee; the campaign must find a state that shows it.
/// Fixed seeds: the catalogue is deterministic.
#[test]
fn planted_bugs_are_caught() {
    let plants = [
        (Plant::SkipChecksum, MIXED),
        (Plant::ScanPastBad, MIXED),
        (Plant::ReuseUnreleased, MIXED),
        (Plant::ForceWithoutFlush, MIXED),
        (Plant::CheckpointWithoutFlush, MIXED),
        (Plant::OneSuperblockCopy, MIXED),
        (Plant::NoEpochCheck, UNIFORM),
        (Plant::NoEpochStart, UNIFORM),
        (Plant::NoEpochBump, UNIFORM),
    ];
    let mut missed = Vec::new();
    for (p, shape) in plants {
        plant::set(Some(p));
        // A torn write completing an old record needs a rare alignment: seed 9 is the first
        // to show it for NoEpochStart; every other plant is caught by seed 4.
        let caught = (1..=12).find_map(|s| campaign(shape, s).err().map(|e| (s, e)));
        plant::set(None);
        match caught {
            Some((s, e)) => println!("{p:?}: caught with seed {s}: {e}"),
            None => missed.push(p),
        }
    }
    assert!(missed.is_empty(), "planted bugs not caught: {missed:?}");
}
