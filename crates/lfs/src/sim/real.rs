//! The simulator's experiment on the real file system (004 §3.5 against §5): a disk of
//! one-block files, hot-and-cold overwrites, the engine's own cleaner — and the simulator run
//! on the same geometry, utilization, thresholds and policy, so the two write costs can be
//! compared (issue 13: "measured write cost within 20% of the simulator's").
//!
//! The file system runs on a memory device with the logical clock (segment ages count log
//! blocks, as the simulator's count writes), so a run is the same on every machine. Its
//! utilization is what the usage table says is live (file data and inodes) over the log's
//! capacity, measured after the files are written; the simulator is given that figure.
//! Write cost is 004 eq. (1) in blocks, `(new data + blocks the cleaner read + live data
//! blocks it wrote back) / new data`, over the measured part of the run only; the cost of the
//! metadata the log writes besides (summaries, inodes, the inode map and usage table at each
//! checkpoint) is reported apart, as `all_in`: every block the log wrote plus the cleaner's
//! reads, over new data.

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_vfs::{Ctx, FileSystem};
use serde::Serialize;

use super::SimError;
use super::access::Access;
use super::disk::{CleanerConfig, Geometry, SegmentAge};
use super::run::{RunSpec, Schedule, run};
use crate::cleaner::policy::Policy;
use crate::engine::{Lfs, MountOptions, ROOT_INO};
use crate::format::BLOCK_SIZE;
use crate::mkfs::{MkfsOptions, mkfs_device};

/// One comparison's setup.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RealSpec {
    /// Device size in 4 KiB blocks.
    pub blocks: u64,
    pub segment_size: u64,
    /// Fraction of the log's capacity the files' data fill (metadata comes on top).
    pub data_fraction: f64,
    pub policy: Policy,
    /// The cleaner's thresholds (`clean_start=`, `clean_stop=`; `None`: the mount's default).
    pub clean_start: Option<u32>,
    pub clean_stop: Option<u32>,
    /// Overwrites before measuring, and measured, in multiples of the log's capacity.
    pub warmup_epochs: f64,
    pub measure_epochs: f64,
    pub seed: u64,
}

/// What the file system did, and what the simulator predicts for the same setup.
#[derive(Debug, Clone, Serialize)]
pub struct RealResult {
    pub spec: RealSpec,
    pub files: u64,
    pub segments: u32,
    pub segment_blocks: u32,
    /// Live bytes over the log's capacity once the files are written.
    pub utilization: f64,
    pub clean_start: u32,
    pub clean_stop: u32,
    pub write_cost: f64,
    pub all_in: f64,
    /// Mean utilization of the segments cleaned (live data blocks moved / blocks read).
    pub cleaned_utilization: f64,
    pub segments_cleaned: u64,
    pub passes: u64,
    pub greedy_fallbacks: u64,
    pub refused: u64,
    pub sim_write_cost: f64,
    pub sim_cleaned_utilization: f64,
}

fn fail(e: impl std::fmt::Display) -> SimError {
    SimError::Config(format!("real file system: {e}"))
}

/// 004's write cost in its own terms, "the average amount of time the disk is busy per byte
/// of new data written ... expressed as a multiple of the time that would be required if
/// ... the data could be written at its full bandwidth with no seek time or rotational
/// latency" (§3.4), measured on a disk model over the same window as [`RealResult`]'s.
#[derive(Debug, Clone, Serialize)]
pub struct DiskCost {
    pub model: String,
    /// Seconds the disk's mechanism was busy (the log's writes, the cleaner's reads).
    pub busy_secs: f64,
    /// Seconds the new data would take at the disk's full (outer-zone) media rate.
    pub new_data_secs: f64,
    /// `busy_secs / new_data_secs`.
    pub write_cost: f64,
    /// The share of the disk's bandwidth left for new data: `1 / write_cost` (004's abstract:
    /// "about 65–75% of a disk's raw bandwidth").
    pub new_data_share: f64,
    pub seeks: u64,
    pub rotations: f64,
}

/// The disk model's busy time between two of its counter readings, over what `new` data
/// blocks would take at its full media rate (None on a device that is not a model).
fn disk_cost(
    d0: Option<cairn_blockdev::disk::DiskStats>,
    d1: Option<cairn_blockdev::disk::DiskStats>,
    new: f64,
) -> Option<DiskCost> {
    d0.zip(d1).and_then(|(a, b)| {
        let spec = cairn_blockdev::disk::by_name(&b.model)?;
        let busy_secs = (b.busy_ns - a.busy_ns) as f64 / 1e9;
        let new_data_secs = new * BLOCK_SIZE as f64 / spec.outer_rate();
        Some(DiskCost {
            model: b.model.clone(),
            busy_secs,
            new_data_secs,
            write_cost: busy_secs / new_data_secs,
            new_data_share: new_data_secs / busy_secs.max(f64::MIN_POSITIVE),
            seeks: b.seeks - a.seeks,
            rotations: b.rotations - a.rotations,
        })
    })
}

/// A fresh file system on `dev` for one experiment: `spec`'s segments, room for `inodes`
/// inodes, no syncer, `spec`'s cleaner and thresholds, the logical clock.
fn fresh(spec: &RealSpec, dev: &Arc<dyn BlockDevice>, inodes: u64) -> Result<Arc<Lfs>, SimError> {
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size: spec.segment_size,
            inodes: Some(inodes),
            ..Default::default()
        },
    )
    .map_err(fail)?;
    let o = MountOptions {
        syncer: false,
        cleaner: spec.policy,
        clean_start: spec.clean_start,
        clean_stop: spec.clean_stop,
        logical_clock: true,
        ..Default::default()
    };
    Lfs::mount_device(dev.clone(), &o).map_err(fail)
}

/// Live bytes over the log's `capacity` blocks, as the usage table has them.
fn live_share(fs: &Lfs, capacity: u64) -> f64 {
    let st = fs.st.lock();
    st.usage.iter().map(|u| u.live_bytes as u64).sum::<u64>() as f64
        / (capacity * BLOCK_SIZE as u64) as f64
}

/// A xorshift stream seeded with `x` (not 0): the experiments' draws, the same everywhere.
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Runs `spec` on the real file system and the simulator.
pub fn compare(spec: &RealSpec) -> Result<RealResult, SimError> {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, spec.blocks));
    Ok(compare_on(spec, dev)?.0)
}

/// [`compare`] on a device of the caller's (a disk model: then also the write cost in disk
/// time).
pub fn compare_on(
    spec: &RealSpec,
    dev: Arc<dyn BlockDevice>,
) -> Result<(RealResult, Option<DiskCost>), SimError> {
    let files_guess = (spec.data_fraction * spec.blocks as f64) as u64;
    let fs = fresh(spec, &dev, files_guess + 64)?;
    let (segments, seg_blocks, th) = {
        let st = fs.st.lock();
        (st.sb.segments, st.sb.segment_blocks, st.thresholds)
    };
    let capacity = segments as u64 * seg_blocks as u64;
    let files = (spec.data_fraction * capacity as f64) as u64;
    let c = Ctx::root();
    let block = vec![0x5au8; BLOCK_SIZE];
    let mut inos = Vec::with_capacity(files as usize);
    for i in 0..files {
        let (a, fh) = fs
            .create(
                &c,
                ROOT_INO,
                std::ffi::OsStr::new(&format!("f{i}")),
                0o644,
                0,
                0,
            )
            .map_err(fail)?;
        fs.write(a.ino, fh, 0, &block).map_err(fail)?;
        fs.release(a.ino, fh).map_err(fail)?;
        inos.push(a.ino);
    }
    fs.checkpoint().map_err(fail)?;
    let utilization = live_share(&fs, capacity);
    // Hot-and-cold as the simulator draws it: 10% of the files get 90% of the writes.
    let mut next = xorshift(spec.seed | 1);
    let hot = (files / 10).max(1);
    let mut overwrite = |n: u64| -> Result<(), SimError> {
        for _ in 0..n {
            let r = next();
            let f = if r % 10 < 9 {
                (r >> 8) % hot
            } else {
                hot + (r >> 8) % (files - hot).max(1)
            };
            let ino = inos[f as usize];
            let fh = fs.open(&c, ino, libc::O_RDWR).map_err(fail)?;
            fs.write(ino, fh, 0, &block).map_err(fail)?;
            fs.release(ino, fh).map_err(fail)?;
        }
        Ok(())
    };
    overwrite((spec.warmup_epochs * capacity as f64) as u64)?;
    let (cs0, ls0) = (fs.cleaner_stats(), fs.lfs_stats());
    let d0 = dev.disk_stats();
    overwrite((spec.measure_epochs * capacity as f64) as u64)?;
    let (cs1, ls1) = (fs.cleaner_stats(), fs.lfs_stats());
    let d1 = dev.disk_stats();
    let new = (ls1.new_data_blocks - ls0.new_data_blocks).max(1) as f64;
    let read = (cs1.blocks_read - cs0.blocks_read) as f64;
    let moved = (cs1.blocks_moved - cs0.blocks_moved) as f64;
    let logged = (ls1.log_blocks - ls0.log_blocks) as f64;
    fs.destroy().map_err(fail)?;

    let sim = run(
        &RunSpec {
            geometry: Geometry {
                segments,
                blocks_per_segment: seg_blocks,
            },
            utilization,
            access: Access::HOT_COLD,
            cleaner: CleanerConfig {
                policy: spec.policy,
                thresholds: th,
                age: SegmentAge::LastWrite,
            },
            schedule: Schedule {
                min_warmup_epochs: 4,
                max_warmup_epochs: 20,
                window_epochs: 2,
                tolerance: 0.02,
                measure_epochs: 8,
            },
            seed: spec.seed,
        },
        false,
    )?;
    let disk = disk_cost(d0, d1, new);
    let result = RealResult {
        spec: *spec,
        files,
        segments,
        segment_blocks: seg_blocks,
        utilization,
        clean_start: th.start_below(),
        clean_stop: th.stop_at(),
        write_cost: (new + read + moved) / new,
        all_in: (logged + read) / new,
        cleaned_utilization: if read > 0.0 { moved / read } else { 0.0 },
        segments_cleaned: cs1.segments_cleaned - cs0.segments_cleaned,
        passes: cs1.passes - cs0.passes,
        greedy_fallbacks: cs1.greedy_fallbacks - cs0.greedy_fallbacks,
        refused: cs1.refused - cs0.refused,
        sim_write_cost: sim.write_cost,
        sim_cleaned_utilization: sim.cleaned_utilization,
    };
    Ok((result, disk))
}

/// 004 §5.2's production file systems against the simulator's overwrites: files are created
/// whole and deleted whole, most of them soon after they were written — "the files written
/// together tend to be deleted together" — and most bytes are in the few large files, so the
/// blocks of a segment die together and the cleaner finds many segments empty (Table II:
/// more than half of those cleaned). Each step deletes one file and creates another, so the
/// live data stay near `spec.data_fraction` of the log. A file is short-lived with
/// probability `short_lived`: the short-lived die in the order they were written once more
/// than a tenth of the files are short-lived ones; otherwise a step deletes a long-lived file
/// at random.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Churn {
    /// A small file's size is uniform in 1..=small_blocks blocks.
    pub small_blocks: u64,
    /// A large file's size is uniform in 1..=large_blocks blocks.
    pub large_blocks: u64,
    /// Share of the files that are large.
    pub large_share: f64,
    /// Share of the files that are short-lived.
    pub short_lived: f64,
}

/// What the churn run measured (the write-cost window as in [`RealResult`]).
#[derive(Debug, Clone, Serialize)]
pub struct ChurnResult {
    pub spec: RealSpec,
    pub churn: Churn,
    pub files: u64,
    pub utilization: f64,
    pub write_cost: f64,
    pub all_in: f64,
    pub cleaned_utilization: f64,
    /// Segments the cleaner took (read, or empty when it took them).
    pub segments_cleaned: u64,
    /// Segments that became clean: those the cleaner read and those found empty (by the
    /// cleaner or by a checkpoint, which releases empty segments without a pass) — 004
    /// Table II's "segments cleaned".
    pub segments_freed: u64,
    /// Of `segments_freed`, those with no live byte left: Table II's "empty".
    pub segments_freed_empty: u64,
}

/// Runs the churn workload on the engine over `dev` (a disk model: then also the write cost
/// in disk time).
pub fn churn_on(
    spec: &RealSpec,
    churn: Churn,
    dev: Arc<dyn BlockDevice>,
) -> Result<(ChurnResult, Option<DiskCost>), SimError> {
    let mean_blocks = (1.0 - churn.large_share) * (1 + churn.small_blocks) as f64 / 2.0
        + churn.large_share * (1 + churn.large_blocks) as f64 / 2.0;
    let files_guess = (spec.data_fraction * spec.blocks as f64 / mean_blocks) as u64;
    let fs = fresh(spec, &dev, 2 * files_guess + 64)?;
    let capacity = {
        let st = fs.st.lock();
        st.sb.segments as u64 * st.sb.segment_blocks as u64
    };
    let c = Ctx::root();
    let block = vec![0x5au8; BLOCK_SIZE * churn.large_blocks.max(churn.small_blocks) as usize];
    // Two streams: the files' draws, and which long-lived file a step deletes.
    let mut next = xorshift(spec.seed | 1);
    let mut pick = xorshift(spec.seed.rotate_left(32) | 1);
    let chance = |r: u64, p: f64| (r % 1_000_000) as f64 / 1e6 < p;
    let mut serial = 0u64;
    // Creates a file of a drawn size; returns its name, its size and whether it is
    // short-lived.
    let mut create = || -> Result<(String, u64, bool), SimError> {
        let large = chance(next(), churn.large_share);
        let n = 1 + next()
            % if large {
                churn.large_blocks
            } else {
                churn.small_blocks
            };
        let short = chance(next(), churn.short_lived);
        let name = format!("f{serial}");
        serial += 1;
        let (a, fh) = fs
            .create(&c, ROOT_INO, std::ffi::OsStr::new(&name), 0o644, 0, 0)
            .map_err(fail)?;
        fs.write(a.ino, fh, 0, &block[..n as usize * BLOCK_SIZE])
            .map_err(fail)?;
        fs.release(a.ino, fh).map_err(fail)?;
        Ok((name, n, short))
    };
    // The short-lived in the order they were written, the long-lived in any order.
    let mut young = std::collections::VecDeque::new();
    let mut old: Vec<String> = Vec::new();
    let place = |young: &mut std::collections::VecDeque<String>,
                 old: &mut Vec<String>,
                 (name, _, short): (String, u64, bool)| {
        if short {
            young.push_back(name);
        } else {
            old.push(name);
        }
    };
    let mut live_blocks = 0u64;
    let target = (spec.data_fraction * capacity as f64) as u64;
    while live_blocks < target {
        let f = create()?;
        live_blocks += f.1;
        place(&mut young, &mut old, f);
    }
    fs.checkpoint().map_err(fail)?;
    let files = (young.len() + old.len()) as u64;
    let utilization = live_share(&fs, capacity);
    let young_max = (files / 10).max(1) as usize;
    // One step: a file deleted whole, a new one written; returns the blocks written.
    let mut step = |young: &mut std::collections::VecDeque<String>,
                    old: &mut Vec<String>|
     -> Result<u64, SimError> {
        let name = if young.len() > young_max || old.is_empty() {
            young.pop_front()
        } else {
            let i = pick() as usize % old.len();
            Some(old.swap_remove(i))
        };
        if let Some(name) = name {
            fs.unlink(&c, ROOT_INO, std::ffi::OsStr::new(&name))
                .map_err(fail)?;
        }
        let f = create()?;
        let n = f.1;
        place(young, old, f);
        Ok(n)
    };
    // Which segments hold log data (dirty) now.
    let dirty = || -> Vec<bool> { fs.st.lock().usage.iter().map(|u| u.dirty).collect() };
    // Steps until `blocks` new blocks are written; returns the segments that became clean
    // between two steps (by the cleaner or, empty, by a checkpoint; one freed and entered
    // again within a step is missed).
    let mut churn_blocks = |blocks: u64, young: &mut _, old: &mut _| -> Result<u64, SimError> {
        let (mut written, mut freed) = (0, 0);
        let mut before = dirty();
        while written < blocks {
            written += step(young, old)?;
            let now = dirty();
            freed += before.iter().zip(&now).filter(|(b, n)| **b && !**n).count() as u64;
            before = now;
        }
        Ok(freed)
    };
    churn_blocks(
        (spec.warmup_epochs * capacity as f64) as u64,
        &mut young,
        &mut old,
    )?;
    let (cs0, ls0) = (fs.cleaner_stats(), fs.lfs_stats());
    let d0 = dev.disk_stats();
    let freed = churn_blocks(
        (spec.measure_epochs * capacity as f64) as u64,
        &mut young,
        &mut old,
    )?;
    let (cs1, ls1) = (fs.cleaner_stats(), fs.lfs_stats());
    let d1 = dev.disk_stats();
    fs.destroy().map_err(fail)?;
    let new = (ls1.new_data_blocks - ls0.new_data_blocks).max(1) as f64;
    let read = (cs1.blocks_read - cs0.blocks_read) as f64;
    let moved = (cs1.blocks_moved - cs0.blocks_moved) as f64;
    let logged = (ls1.log_blocks - ls0.log_blocks) as f64;
    Ok((
        ChurnResult {
            spec: *spec,
            churn,
            files,
            utilization,
            write_cost: (new + read + moved) / new,
            all_in: (logged + read) / new,
            cleaned_utilization: if read > 0.0 { moved / read } else { 0.0 },
            segments_cleaned: cs1.segments_cleaned - cs0.segments_cleaned,
            segments_freed: freed,
            segments_freed_empty: freed.saturating_sub(
                (cs1.segments_cleaned - cs1.empty_segments_cleaned)
                    - (cs0.segments_cleaned - cs0.empty_segments_cleaned),
            ),
        },
        disk_cost(d0, d1, new),
    ))
}

/// The comparison `cairn lfs sim` runs: greedy and cost-benefit with age sort, hot-and-cold
/// overwrites, files filling 70% of the log (75% live with their inodes), the default
/// thresholds. The full run uses issue 13's disk (256 MiB of 512 KiB segments, three disks
/// of overwrites to warm up and three measured, as the test that holds the 20% target);
/// `quick` a 64 MiB disk and one disk of each, to stay within seconds.
pub fn suite_specs(quick: bool, seed: u64) -> Vec<RealSpec> {
    let (blocks, warmup, measure) = if quick {
        (16384, 1.0, 1.0)
    } else {
        (TARGET_BLOCKS, 3.0, 3.0)
    };
    [Policy::GREEDY, Policy::COST_BENEFIT]
        .into_iter()
        .map(|policy| RealSpec {
            blocks,
            segment_size: 512 << 10,
            data_fraction: 0.70,
            policy,
            clean_start: None,
            clean_stop: None,
            warmup_epochs: warmup,
            measure_epochs: measure,
            seed,
        })
        .collect()
}

/// The comparison as a Markdown section: one row per policy, the measured write cost beside
/// the simulator's for the same disk, and whether cost-benefit came out below greedy.
pub fn markdown(results: &[RealResult]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## The real file system against the simulator
"
    );
    if let Some(r) = results.first() {
        let _ = writeln!(
            s,
            "The same experiment on cairn's LFS engine (`cairn_lfs::sim::real::compare`): a \
             {} MiB disk of {} segments × {} blocks on a memory device, one-block files \
             filling {:.0}% of the log, hot-and-cold overwrites (10% of the files get 90% of \
             the writes), the engine's own cleaner with thresholds {}/{} and a logical clock \
             (segment ages count log blocks); {} disk(s) of overwrites to warm up, {} measured. \
             The simulator runs the same geometry, utilization, thresholds and policy. Write \
             cost = (new + read + rewritten data blocks) / new blocks; *all in* counts every \
             block the log wrote (summaries, inodes, inode map and usage table) plus the \
             cleaner's reads.\n",
            r.spec.blocks * 4 / 1024,
            r.segments,
            r.segment_blocks,
            r.spec.data_fraction * 100.0,
            r.clean_start,
            r.clean_stop,
            r.spec.warmup_epochs,
            r.spec.measure_epochs,
        );
    }
    let _ = writeln!(
        s,
        "| policy | utilization | write cost | simulator | ratio | all in | cleaned u (fs / sim) | segments cleaned | passes | refused |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in results {
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} / {:.2} | {} | {} | {} |",
            r.spec.policy.name(),
            r.utilization,
            r.write_cost,
            r.sim_write_cost,
            r.write_cost / r.sim_write_cost.max(f64::MIN_POSITIVE),
            r.all_in,
            r.cleaned_utilization,
            r.sim_cleaned_utilization,
            r.segments_cleaned,
            r.passes,
            r.refused,
        );
    }
    for line in checks(results) {
        let _ = writeln!(s, "\n- {line}");
    }
    s
}

/// Disk size (4 KiB blocks) of issue 13's target: "on the real file system at 75%
/// utilization …, measured write cost within 20% of the simulator's".
pub const TARGET_BLOCKS: u64 = 65536;

/// Issue 13's targets on these results, one line each ("holds" or "FAILS" first; "info"
/// for the 20% target on a disk smaller than the target's, where a segment is a larger
/// share of the disk and the engine's passes and the simulator's differ more).
pub fn checks(results: &[RealResult]) -> Vec<String> {
    let mut out = Vec::new();
    for r in results {
        let ratio = r.write_cost / r.sim_write_cost.max(f64::MIN_POSITIVE);
        out.push(format!(
            "{} {}: measured write cost {:.2} is {:.2}× the simulator's {:.2} (target within \
             20% on a {} MiB disk)",
            if r.spec.blocks < TARGET_BLOCKS {
                "info"
            } else if (0.8..1.2).contains(&ratio) {
                "holds"
            } else {
                "FAILS"
            },
            r.spec.policy.name(),
            r.write_cost,
            ratio,
            r.sim_write_cost,
            TARGET_BLOCKS * 4 / 1024
        ));
    }
    let by = |sel| {
        results
            .iter()
            .find(|r| r.spec.policy.selection == sel)
            .map(|r| r.write_cost)
    };
    use crate::cleaner::policy::Selection;
    if let (Some(g), Some(cb)) = (by(Selection::Greedy), by(Selection::CostBenefit)) {
        out.push(format!(
            "{} cost-benefit below greedy on the real file system: {cb:.2} against {g:.2}",
            if cb < g { "holds" } else { "FAILS" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(blocks: u64, policy: &str, th: (Option<u32>, Option<u32>)) -> RealSpec {
        RealSpec {
            blocks,
            segment_size: 512 << 10,
            data_fraction: 0.70,
            policy: Policy::parse(policy).expect("a policy name"),
            clean_start: th.0,
            clean_stop: th.1,
            warmup_epochs: 3.0,
            measure_epochs: 3.0,
            seed: 7,
        }
    }

    fn show(r: &RealResult) -> String {
        format!(
            "{}: u {:.3}, write cost {:.2} (all in {:.2}), cleaned u {:.2}, {} segments in {} passes ({} greedy fallbacks, {} refused); simulator {:.2}, cleaned u {:.2}; thresholds {}/{} of {}",
            r.spec.policy.name(),
            r.utilization,
            r.write_cost,
            r.all_in,
            r.cleaned_utilization,
            r.segments_cleaned,
            r.passes,
            r.greedy_fallbacks,
            r.refused,
            r.sim_write_cost,
            r.sim_cleaned_utilization,
            r.clean_start,
            r.clean_stop,
            r.segments
        )
    }

    /// Issue 13's cleaning target on the real file system: a 256 MiB disk of 512 KiB
    /// segments at 75% utilization, hot-and-cold overwrites, the default thresholds:
    /// cost-benefit with age sort costs less than greedy, and each policy's write cost is
    /// within 20% of what the simulator predicts for the same disk.
    #[test]
    fn cost_benefit_beats_greedy_on_the_real_file_system() {
        let g = compare(&spec(65536, "greedy", (None, None))).unwrap();
        let cb = compare(&spec(65536, "cost-benefit+age-sort", (None, None))).unwrap();
        eprintln!("{}\n{}", show(&g), show(&cb));
        assert!((0.73..0.77).contains(&g.utilization), "{}", show(&g));
        assert!(cb.write_cost < g.write_cost, "{}\n{}", show(&g), show(&cb));
        for r in [&g, &cb] {
            let ratio = r.write_cost / r.sim_write_cost;
            assert!(
                (0.8..1.2).contains(&ratio),
                "{ratio:.2} of the simulator's: {}",
                show(r)
            );
        }
    }

    /// The comparison for other disks, thresholds and policies (run by hand: `BLOCKS=16384
    /// TH=8,16 POLICIES=greedy,cost-benefit cargo test -p cairn-lfs --lib real_explore --
    /// --ignored --nocapture`).
    #[test]
    #[ignore]
    fn real_explore() {
        let var = |k: &str| std::env::var(k).ok();
        let blocks = var("BLOCKS").and_then(|b| b.parse().ok()).unwrap_or(16384);
        let th = var("TH")
            .and_then(|v| {
                v.split_once(',')
                    .map(|(a, b)| (a.parse().ok(), b.parse().ok()))
            })
            .unwrap_or((None, None));
        let policies = var("POLICIES")
            .unwrap_or_else(|| "greedy,greedy+age-sort,cost-benefit,cost-benefit+age-sort".into());
        for p in policies.split(',') {
            eprintln!("{}", show(&compare(&spec(blocks, p, th)).unwrap()));
        }
    }

    /// The 256 MiB disk of 1 MiB segments (as Sprite LFS) on the Wren IV model with a
    /// frozen clock, for `policy` with files filling `fraction` of the log; and DATA and
    /// POLICIES from the environment (the by-hand runs below).
    fn on_wren_iv(policy: &str, fraction: f64) -> (RealSpec, Arc<dyn BlockDevice>) {
        use cairn_blockdev::disk::{Disk, DiskOptions, Time};
        let mut sp = spec(65536, policy, (None, None));
        sp.segment_size = 1 << 20;
        sp.data_fraction = fraction;
        let mut o = DiskOptions::parse("wren-iv").unwrap();
        o.time = Time::Frozen;
        let mem = Arc::new(MemDevice::new(BLOCK_SIZE as u32, sp.blocks));
        (sp, Arc::new(Disk::new(mem, o).unwrap()))
    }

    fn env_num(k: &str, default: f64) -> f64 {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    fn env_policies() -> String {
        std::env::var("POLICIES").unwrap_or_else(|_| "greedy,cost-benefit+age-sort".into())
    }

    fn show_disk(d: &DiskCost) -> String {
        format!(
            "on {}: busy {:.1} s for {:.1} s of new data at full bandwidth: write cost {:.2} in disk time, {:.0}% of the bandwidth for new data; {} seeks, {:.0} rotations",
            d.model,
            d.busy_secs,
            d.new_data_secs,
            d.write_cost,
            d.new_data_share * 100.0,
            d.seeks,
            d.rotations
        )
    }

    /// 004 §5.2 on its own disk: the experiment above on the Wren IV model (the 256 MiB
    /// disk fits its 327 MB; 1 MiB segments, as Sprite LFS), with the write cost in disk
    /// time beside the write cost in blocks (run by hand: `cargo test -p cairn-lfs --lib
    /// write_cost_on_the_wren_iv -- --ignored --nocapture`; POLICIES and DATA as above).
    #[test]
    #[ignore]
    fn write_cost_on_the_wren_iv() {
        for p in env_policies().split(',') {
            let (sp, dev) = on_wren_iv(p, env_num("DATA", 0.70));
            let (r, d) = compare_on(&sp, dev).unwrap();
            eprintln!("{}\n  {}", show(&r), show_disk(&d.unwrap()));
        }
    }

    /// 004 §5.2's production figure on its own disk: whole files created and deleted, the
    /// young dying first (run by hand: `cargo test --release -p cairn-lfs --lib
    /// churn_write_cost_on_the_wren_iv -- --ignored --nocapture`; DATA and POLICIES as above,
    /// SMALLB and LARGEB the largest small and large file in blocks, LARGE the share of large
    /// files, SHORT the share of short-lived ones).
    #[test]
    #[ignore]
    fn churn_write_cost_on_the_wren_iv() {
        let churn = Churn {
            small_blocks: env_num("SMALLB", 4.0) as u64,
            large_blocks: env_num("LARGEB", 512.0) as u64,
            large_share: env_num("LARGE", 0.05),
            short_lived: env_num("SHORT", 0.9),
        };
        for p in env_policies().split(',') {
            let (sp, dev) = on_wren_iv(p, env_num("DATA", 0.70));
            let (r, d) = churn_on(&sp, churn, dev).unwrap();
            eprintln!(
                "{p}: {churn:?}, {} files, u {:.3}, write cost {:.2} (all in {:.2}), cleaned u {:.2}, {} segments freed, {} empty ({:.0}%), {} by the cleaner\n  {}",
                r.files,
                r.utilization,
                r.write_cost,
                r.all_in,
                r.cleaned_utilization,
                r.segments_freed,
                r.segments_freed_empty,
                100.0 * r.segments_freed_empty as f64 / r.segments_freed.max(1) as f64,
                r.segments_cleaned,
                show_disk(&d.unwrap())
            );
        }
    }

    /// Whole-file deletions leave whole segments empty: on a small memory disk the cleaner
    /// reclaims some segments without reading them, and its write cost stays below what
    /// single-block overwrites cost at the same utilization.
    #[test]
    fn whole_file_deletions_leave_empty_segments() {
        let mut sp = spec(8192, "cost-benefit+age-sort", (None, None));
        sp.segment_size = 256 << 10;
        sp.warmup_epochs = 1.0;
        sp.measure_epochs = 1.0;
        let churn = Churn {
            small_blocks: 4,
            large_blocks: 128,
            large_share: 0.05,
            short_lived: 0.9,
        };
        let mem = Arc::new(MemDevice::new(BLOCK_SIZE as u32, sp.blocks));
        let (r, d) = churn_on(&sp, churn, mem).unwrap();
        assert!(d.is_none());
        let over = compare(&sp).unwrap();
        eprintln!(
            "churn: u {:.3}, write cost {:.2}, {} of {} freed empty; overwrites: u {:.3}, write cost {:.2}",
            r.utilization,
            r.write_cost,
            r.segments_freed_empty,
            r.segments_freed,
            over.utilization,
            over.write_cost
        );
        assert!(r.segments_cleaned > 0, "{r:?}");
        assert!(r.segments_freed_empty > 0, "{r:?}");
        assert!(r.write_cost < over.write_cost, "{r:?} against {over:?}");
    }

    /// The section `cairn lfs sim` writes: a row per policy and the checks, which say
    /// FAILS when cost-benefit does not beat greedy or a ratio leaves the 20% band.
    #[test]
    fn markdown_and_checks_report_the_targets() {
        let mut specs = suite_specs(true, 1);
        for s in &mut specs {
            s.blocks = TARGET_BLOCKS;
        }
        let result = |spec: RealSpec, wc: f64, sim: f64| RealResult {
            spec,
            files: 1,
            segments: 127,
            segment_blocks: 128,
            utilization: 0.75,
            clean_start: 12,
            clean_stop: 14,
            write_cost: wc,
            all_in: wc + 1.0,
            cleaned_utilization: 0.5,
            segments_cleaned: 10,
            passes: 2,
            greedy_fallbacks: 0,
            refused: 0,
            sim_write_cost: sim,
            sim_cleaned_utilization: 0.5,
        };
        let good = [result(specs[0], 5.0, 5.1), result(specs[1], 4.0, 3.9)];
        let md = markdown(&good);
        assert!(md.contains("| greedy | 0.750 | 5.00 | 5.10 |"), "{md}");
        assert!(md.contains("| cost-benefit+age-sort |"), "{md}");
        assert!(!md.contains("FAILS"), "{md}");
        let bad = [result(specs[0], 3.0, 3.0), result(specs[1], 4.0, 3.0)];
        let c = checks(&bad);
        assert!(c[1].starts_with("FAILS cost-benefit+age-sort"), "{c:?}");
        assert!(c[2].starts_with("FAILS cost-benefit below greedy"), "{c:?}");
    }
}
