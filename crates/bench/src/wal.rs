//! `cairn wal bench`: forced appends per second with 1..N concurrent forcers against the
//! device's raw flush rate measured in the same run (001 §4's group commit). The command
//! line opens and checks the log; this is the measurement.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use cairn_blockdev::{BlockDevice, FileDevice};
use cairn_wal::format;
use cairn_wal::{FormatOptions, GroupWait, Options, Region, Wal, WalError};

/// One row of the benchmark.
struct Row {
    threads: usize,
    /// The raw flush rate measured right before the row.
    raw: f64,
    wait: &'static str,
    appends_per_sec: f64,
    flushes_per_sec: f64,
    appends_per_flush: f64,
    p50_us: u64,
    p99_us: u64,
    stats: cairn_wal::WalStats,
}

/// What to measure: the thread counts, the group-commit waits, the payload and the time per
/// row — checked before anything is opened.
pub struct Plan {
    threads: Vec<usize>,
    waits: Vec<(&'static str, GroupWait)>,
    record: usize,
    secs: f64,
}

impl Plan {
    /// `threads`: a comma-separated list of positive counts; `group_wait`: `auto`, `off`,
    /// `both` or microseconds; `secs`: a positive duration per row.
    pub fn parse(threads: &str, group_wait: &str, secs: f64, record: usize) -> Result<Plan> {
        let threads: Vec<usize> = threads
            .split(',')
            .map(|t| t.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|_| anyhow!("--threads takes a comma-separated list of numbers"))?;
        if threads.is_empty() || threads.contains(&0) || !secs.is_finite() || secs <= 0.0 {
            bail!("--threads needs positive counts and --secs a positive duration");
        }
        let waits: Vec<(&'static str, GroupWait)> = match group_wait {
            "both" => vec![("auto", GroupWait::default()), ("off", GroupWait::Off)],
            "auto" => vec![("auto", GroupWait::default())],
            "off" => vec![("off", GroupWait::Off)],
            us => {
                let us: u64 = us
                    .parse()
                    .map_err(|_| anyhow!("--group-wait takes auto, off, both or microseconds"))?;
                vec![("fixed", GroupWait::Fixed(Duration::from_micros(us)))]
            }
        };
        Ok(Plan {
            threads,
            waits,
            record,
            secs,
        })
    }

    /// Runs the plan on the log `dev` (opened exclusively from `path`, known to hold a log:
    /// it is reformatted before every row) and prints the table, or one JSON object.
    pub fn run(self, dev: Arc<FileDevice>, path: &Path, json: bool) -> Result<i32> {
        let Plan {
            threads,
            waits,
            record,
            secs,
        } = self;
        let region = Region::whole(&*dev);
        // The device's flush time moves with whatever else the machine is doing, so each row
        // measures its own raw flush rate in slices between its own (see `SLICES`).
        let mut rows = Vec::new();
        for &t in &threads {
            for &(name, gw) in &waits {
                Wal::format(&*dev, region, &FormatOptions::default())?;
                rows.push(measure(dev.clone(), region, t, name, gw, record, secs)?);
                if !json {
                    eprint!(".");
                }
            }
        }
        if !json {
            eprintln!();
        }
        let cpus = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("Cpus_allowed_list:")
                        .map(|v| v.trim().to_string())
                })
            })
            .unwrap_or_default();
        if json {
            let v = serde_json::json!({
                "path": path.display().to_string(),
                "block_size": dev.block_size(),
                "capacity": (region.blocks - format::SB_BLOCKS) * u64::from(dev.block_size()),
                "record_bytes": record,
                "secs": secs,
                "cpus": cpus,
                "rows": rows.iter().map(|r| serde_json::json!({
                    "threads": r.threads,
                    "group_wait": r.wait,
                    "raw_flushes_per_sec": r.raw,
                    "forced_appends_per_sec": r.appends_per_sec,
                    "ratio_to_raw": r.appends_per_sec / r.raw,
                    "flushes_per_sec": r.flushes_per_sec,
                    "appends_per_flush": r.appends_per_flush,
                    "p50_us": r.p50_us,
                    "p99_us": r.p99_us,
                    "stats": serde_json::to_value(&r.stats).unwrap_or_default(),
                })).collect::<Vec<_>>(),
            });
            println!("{v}");
            return Ok(0);
        }
        println!(
            "log {} ({} KiB of log, {}-byte blocks), {record}-byte records, {secs} s per row, CPUs {cpus}",
            path.display(),
            ((region.blocks - format::SB_BLOCKS) * u64::from(dev.block_size())) >> 10,
            dev.block_size()
        );
        println!(
            "raw flush rate: one block written and flushed in a loop on the same device, in {SLICES} \
             slices alternating with each row's own (a third of its time)"
        );
        println!(
            "| threads | group wait | raw flushes/s | forced appends/s | × raw | log flushes/s | appends per flush | p50 ms | p99 ms |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in &rows {
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} |",
                r.threads,
                r.wait,
                r.raw,
                r.appends_per_sec,
                r.appends_per_sec / r.raw,
                r.flushes_per_sec,
                r.appends_per_flush,
                r.p50_us as f64 / 1000.0,
                r.p99_us as f64 / 1000.0
            );
        }
        Ok(0)
    }
}

/// Raw and log measurements alternate in this many slices per row, so that both see the same
/// machine: on a shared virtual machine a flush takes 0.1 ms one second and 4 ms the next.
const SLICES: u32 = 6;

/// The device's raw flush rate: one block written and flushed, over and over, for `secs` —
/// what a force costs at least. Returns (flushes, seconds). The block is the region's last:
/// the benchmark's log may be using it, but it never reads back what it wrote and its records
/// are thrown away.
fn raw_flushes(dev: &dyn BlockDevice, region: Region, secs: f64) -> Result<(u64, f64)> {
    let block = vec![0u8; dev.block_size() as usize];
    let at = region.first_block + region.blocks - 1;
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        dev.write_blocks(at, &block)?;
        dev.flush()?;
        n += 1;
    }
    Ok((n, t0.elapsed().as_secs_f64()))
}

/// `threads` threads, each appending a record and forcing it, over and over, for `secs` in
/// all, in slices alternating with raw flush measurements. A full log is checkpointed to its
/// durable end (the records are never needed again), as a client would.
fn measure(
    dev: Arc<FileDevice>,
    region: Region,
    threads: usize,
    wait: &'static str,
    gw: GroupWait,
    record: usize,
    secs: f64,
) -> Result<Row> {
    let opts = Options {
        group_wait: gw,
        ..Default::default()
    };
    let d: Arc<dyn BlockDevice> = dev.clone();
    let wal = Arc::new(Wal::open_with(d, region, opts)?);
    let payload = vec![0x5au8; record];
    let before = wal.stats();
    let (mut raw_n, mut raw_secs, mut log_secs) = (0u64, 0.0, 0.0);
    let mut all: Vec<u32> = Vec::new();
    for _ in 0..SLICES {
        let (n, t) = raw_flushes(&*dev, region, secs / 3.0 / f64::from(SLICES))?;
        raw_n += n;
        raw_secs += t;
        let t0 = Instant::now();
        all.extend(forcing(&wal, threads, &payload, secs / f64::from(SLICES))?);
        log_secs += t0.elapsed().as_secs_f64();
    }
    let after = wal.stats();
    all.sort_unstable();
    let pct = |p: f64| -> u64 {
        if all.is_empty() {
            0
        } else {
            u64::from(all[((all.len() - 1) as f64 * p) as usize])
        }
    };
    let n = all.len() as f64;
    let flushes = (after.flushes - before.flushes) as f64;
    Ok(Row {
        threads,
        raw: raw_n as f64 / raw_secs,
        wait,
        appends_per_sec: n / log_secs,
        flushes_per_sec: flushes / log_secs,
        appends_per_flush: if flushes > 0.0 { n / flushes } else { 0.0 },
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        stats: after,
    })
}

/// One slice: the forcing threads for `secs`; every forced append's latency in microseconds.
fn forcing(wal: &Arc<Wal>, threads: usize, payload: &[u8], secs: f64) -> Result<Vec<u32>> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let lat: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || -> Result<Vec<u32>, WalError> {
                    let mut lat = Vec::new();
                    while Instant::now() < deadline {
                        let t = Instant::now();
                        let lsn = loop {
                            match wal.append(payload) {
                                Ok(l) => break l,
                                Err(WalError::Full { .. }) => {
                                    match wal.set_checkpoint(wal.durable()) {
                                        Ok(()) | Err(WalError::Released { .. }) => {}
                                        Err(e) => return Err(e),
                                    }
                                }
                                Err(e) => return Err(e),
                            }
                        };
                        wal.force(lsn)?;
                        lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow!("a forcing thread panicked"))?
                    .map_err(|e| anyhow!(e))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(lat.into_iter().flatten().collect())
}
