//! Small-file overwrite latency with the cleaner idle and running (docs/bench/history.md,
//! "LFS: call latency while the cleaner runs").
//!
//! An image file is made and filled to a utilization (default 80%) with 4 KiB files, then
//! mounted with the background syncer and the default cleaning thresholds (or the mount
//! options given with `-o`, as `cairn mount` takes them), and one thread
//! overwrites files chosen uniformly at random (open, write 4 KiB at offset 0, release),
//! timing every call. The first overwrites find clean segments above the cleaner's start
//! threshold: the cleaner is idle. Once the log has used them up the cleaner runs (in the
//! background syncer and, while it holds the engine, in whatever call needed it), and keeps
//! running as long as the overwrites go on. The two phases are told apart by the cleaner's
//! pass counter, read after each call (outside the timed region): a call that returns after
//! the first pass is the running phase's.
//!
//! Prints one JSON object: per phase the overwrites, their p50/p99/max latency and the
//! throughput, and the ratios the target is stated in (p99 running ÷ idle ≤ 2, throughput
//! running ÷ idle ≥ 0.8). `--series FILE` writes the latency over time (per 100 ms window:
//! overwrites, p50, p99, max, cleaner passes so far, the fewest clean segments, the calls
//! that waited for room so far) as CSV, and `--svg FILE` the same as a
//! plot with the cleaning phase shaded. `--rate N` starts N overwrites a second (open loop)
//! and times each from when it was due: the latency a stall adds to every call waiting
//! behind it. Without it each call starts when the last ends (closed loop: throughput).
//! The calling thread asks for the scheduler slice cairn's FUSE request threads ask for
//! (`cairn_vfs::sched::serve_calls`); `--default-slice` keeps the kernel's default.
//!
//! ```text
//! cargo run --release -p cairn-lfs --example overwrite_latency -- \
//!     --dir /var/tmp --size-mb 256 --util 80 --overwrites 40000 --seed 1 \
//!     --series lat.csv --svg lat.svg [-o clean_start=20,clean_stop=30]
//! ```

use std::ffi::OsStr;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_blockdev::{BlockDevice, FileDevice, MemDevice};
use cairn_lfs::{Lfs, MkfsOptions, MountOptions, mkfs_device};
use cairn_vfs::{Ctx, FileSystem};

const BS: usize = 4096;
const ROOT: u64 = 2;
const FILES_PER_DIR: usize = 500;

struct Args {
    dir: std::path::PathBuf,
    mem: bool,
    size_mb: u64,
    util: u64,
    overwrites: u64,
    seed: u64,
    /// Overwrites started per second (open loop), or 0: each as soon as the last ends.
    rate: u64,
    series: Option<std::path::PathBuf>,
    svg: Option<std::path::PathBuf>,
    /// Mount options of the measured mount (`-o key[=value]`, as `cairn mount` takes them).
    opts: Vec<String>,
    /// The calling thread keeps the kernel's default scheduler slice.
    default_slice: bool,
}

fn args() -> Args {
    let mut a = Args {
        dir: std::env::temp_dir(),
        mem: false,
        size_mb: 256,
        util: 80,
        overwrites: 40_000,
        seed: 1,
        rate: 0,
        series: None,
        svg: None,
        opts: Vec::new(),
        default_slice: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} takes a value"));
        match k.as_str() {
            "--dir" => a.dir = v().into(),
            "--mem" => a.mem = true,
            "--default-slice" => a.default_slice = true,
            "--size-mb" => a.size_mb = v().parse().expect("--size-mb N"),
            "--util" => a.util = v().parse().expect("--util PERCENT"),
            "--overwrites" => a.overwrites = v().parse().expect("--overwrites N"),
            "--seed" => a.seed = v().parse().expect("--seed N"),
            "--rate" => a.rate = v().parse().expect("--rate N"),
            "--series" => a.series = Some(v().into()),
            "--svg" => a.svg = Some(v().into()),
            "-o" => a.opts.push(v()),
            _ => panic!("unknown argument {k}"),
        }
    }
    a
}

/// xorshift64*: the same overwrite sequence for a seed, whatever the machine.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// One timed overwrite.
#[derive(Clone, Copy)]
struct Sample {
    /// Since the measured run began.
    at: Duration,
    lat: Duration,
    /// Cleaner passes completed when the call returned.
    passes: u64,
    /// Clean segments when the call returned, and the calls that had waited for room by
    /// then: what the cleaner kept ahead of the writes, and when it fell behind.
    clean: u32,
    room_waits: u64,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e6
}

fn phase(samples: &[Sample]) -> serde_json::Value {
    let mut l: Vec<Duration> = samples.iter().map(|s| s.lat).collect();
    l.sort_unstable();
    let span = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => (b.at + b.lat).saturating_sub(a.at).as_secs_f64(),
        _ => 0.0,
    };
    serde_json::json!({
        "overwrites": samples.len(),
        "p50_us": pct(&l, 0.50),
        "p99_us": pct(&l, 0.99),
        "p999_us": pct(&l, 0.999),
        "max_us": pct(&l, 1.0),
        "seconds": span,
        "per_second": if span > 0.0 { samples.len() as f64 / span } else { 0.0 },
    })
}

fn main() {
    let a = args();
    let ctx = Ctx::root();
    let blocks = a.size_mb << 20 >> 12;
    let path = a
        .dir
        .join(format!("cairn-lfs-lat-{}.img", std::process::id()));
    let dev: Arc<dyn BlockDevice> = if a.mem {
        Arc::new(MemDevice::new(BS as u32, blocks))
    } else {
        Arc::new(FileDevice::create(&path, BS as u32, blocks * BS as u64).expect("image file"))
    };
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            inodes: Some(blocks),
            ..Default::default()
        },
    )
    .expect("mkfs");

    // Fill: no syncer, the cleaner held back until a tenth is left, so the image starts
    // with its dead blocks where filling left them.
    let fill = MountOptions {
        syncer: false,
        ..Default::default()
    };
    let fs = Lfs::mount_device(dev.clone(), &fill).expect("mount");
    // A 4 KiB file is one data block and a sixteenth of an inode block.
    let nfiles = (blocks * a.util / 100 * 16 / 17) as usize;
    let mut inos = Vec::with_capacity(nfiles);
    let mut buf = vec![0u8; BS];
    let mut dir = ROOT;
    for i in 0..nfiles {
        if i % FILES_PER_DIR == 0 {
            let name = format!("d{}", i / FILES_PER_DIR);
            dir = fs
                .mkdir(&ctx, ROOT, OsStr::new(&name), 0o755, 0)
                .expect("mkdir")
                .ino;
        }
        buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let (attr, fh) = fs
            .create(
                &ctx,
                dir,
                OsStr::new(&format!("f{i}")),
                0o644,
                0,
                libc::O_WRONLY,
            )
            .expect("create");
        fs.write(attr.ino, fh, 0, &buf).expect("fill write");
        fs.release(attr.ino, fh).expect("release");
        inos.push(attr.ino);
    }
    fs.destroy().expect("unmount after fill");
    drop(fs);

    let mut opts = MountOptions::default();
    for o in a.opts.iter().flat_map(|o| o.split(',')) {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o, None),
        };
        opts.set(k, v).unwrap_or_else(|e| panic!("-o {o}: {e}"));
    }
    let fs = Lfs::mount_device(dev.clone(), &opts).expect("mount");
    let stats = |fs: &Lfs| -> serde_json::Value {
        serde_json::from_str(&fs.stats_json()).expect("stats json")
    };
    // The calls run as cairn's FUSE request threads run them: with a call thread's
    // scheduler slice (`cairn_vfs::sched`), so that one woken while the syncer cleans
    // preempts it at once. `--default-slice` leaves the kernel's.
    if !a.default_slice
        && let Err(e) = cairn_vfs::sched::serve_calls()
    {
        eprintln!("the calls keep the default scheduler slice: {e}");
    }
    let before = stats(&fs);
    let mut rng = Rng(a.seed.max(1));
    let mut samples = Vec::with_capacity(a.overwrites as usize);
    let start = Instant::now();
    for k in 0..a.overwrites {
        let ino = inos[rng.below(inos.len() as u64) as usize];
        buf[..8].copy_from_slice(&k.to_le_bytes());
        // Open loop: the call's time counts from when it was due, so a stall delays every
        // call due during it, as it would a server's clients (a closed loop counts one
        // slow call per stall however long it lasts).
        let t = match (k * 1_000_000_000).checked_div(a.rate) {
            Some(ns) => {
                let due = start + Duration::from_nanos(ns);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                due
            }
            None => Instant::now(),
        };
        let fh = fs.open(&ctx, ino, libc::O_WRONLY).expect("open");
        if let Err(e) = fs.write(ino, fh, 0, &buf) {
            panic!("overwrite {k}: {e}; {}", fs.stats_json());
        }
        fs.release(ino, fh).expect("release");
        let lat = t.elapsed();
        let c = fs.cleaner_stats();
        samples.push(Sample {
            at: t - start,
            lat,
            passes: c.passes,
            clean: fs.clean_segments(),
            room_waits: c.room_waits,
        });
    }
    let after = stats(&fs);
    fs.destroy().expect("unmount");
    drop(fs);
    if !a.mem {
        let _ = std::fs::remove_file(&path);
    }

    // Idle: before the cleaner's first pass. Running: from its first pass on.
    let split = samples
        .iter()
        .position(|s| s.passes > 0)
        .unwrap_or(samples.len());
    let (idle, running) = samples.split_at(split);
    let (pi, pr) = (phase(idle), phase(running));
    let ratio = |k: &str| {
        let (i, r) = (pi[k].as_f64().unwrap_or(0.0), pr[k].as_f64().unwrap_or(0.0));
        if i > 0.0 { r / i } else { 0.0 }
    };
    let out = serde_json::json!({
        "size_mb": a.size_mb,
        "utilization_pct": a.util,
        "files": nfiles,
        "device": if a.mem { "memory" } else { "file" },
        "rate_per_second": a.rate,
        "clean_segments_at_start": before["clean_segments"],
        "segments": before["segments"],
        "idle": pi,
        "running": pr,
        "p99_running_over_idle": ratio("p99_us"),
        "throughput_running_over_idle": ratio("per_second"),
        "cleaner": after["cleaner"],
        "write_cost": after["write_cost"],
        "checkpoints": after["lfs"]["checkpoints"],
    });
    println!("{}", serde_json::to_string_pretty(&out).expect("json"));

    let windows = series(&samples, Duration::from_millis(100));
    if let Some(p) = &a.series {
        let mut f = std::fs::File::create(p).expect("series file");
        writeln!(
            f,
            "t_ms,overwrites,p50_us,p99_us,max_us,cleaner_passes,min_clean_segments,room_waits"
        )
        .expect("write");
        for w in &windows {
            writeln!(
                f,
                "{},{},{:.1},{:.1},{:.1},{},{},{}",
                w.t_ms, w.n, w.p50, w.p99, w.max, w.passes, w.min_clean, w.room_waits
            )
            .expect("write");
        }
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, svg(&windows)).expect("svg file");
    }
}

struct Window {
    t_ms: u64,
    n: usize,
    p50: f64,
    p99: f64,
    max: f64,
    passes: u64,
    /// The fewest clean segments a call of the window saw.
    min_clean: u32,
    room_waits: u64,
}

fn series(samples: &[Sample], step: Duration) -> Vec<Window> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < samples.len() {
        let w = (samples[i].at.as_nanos() / step.as_nanos()) as u64;
        let mut j = i;
        while j < samples.len() && (samples[j].at.as_nanos() / step.as_nanos()) as u64 == w {
            j += 1;
        }
        let mut l: Vec<Duration> = samples[i..j].iter().map(|s| s.lat).collect();
        l.sort_unstable();
        out.push(Window {
            t_ms: w * step.as_millis() as u64,
            n: j - i,
            p50: pct(&l, 0.5),
            p99: pct(&l, 0.99),
            max: pct(&l, 1.0),
            passes: samples[j - 1].passes,
            min_clean: samples[i..j].iter().map(|s| s.clean).min().unwrap_or(0),
            room_waits: samples[j - 1].room_waits,
        });
        i = j;
    }
    out
}

/// p50 and p99 per window against time (log scale), the cleaning phase shaded.
fn svg(ws: &[Window]) -> String {
    let (w, h, m) = (900.0, 360.0, 50.0);
    let t_max = ws.last().map_or(1, |x| x.t_ms + 100).max(1) as f64;
    let hi = ws.iter().map(|x| x.max).fold(10.0f64, f64::max);
    let lo = 1.0f64;
    let x = |t: u64| m + (t as f64 / t_max) * (w - 2.0 * m);
    let y = |v: f64| {
        let v = v.max(lo);
        h - m - (v.ln() - lo.ln()) / (hi.ln() - lo.ln()) * (h - 2.0 * m)
    };
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n<rect width='{w}' height='{h}' fill='white'/>\n"
    );
    if let Some(first) = ws.iter().find(|x| x.passes > 0) {
        let x0 = x(first.t_ms);
        s += &format!(
            "<rect x='{x0:.1}' y='{m}' width='{:.1}' height='{:.1}' fill='#fde2c8'/>\n<text x='{:.1}' y='{:.1}'>cleaner running</text>\n",
            w - m - x0,
            h - 2.0 * m,
            x0 + 4.0,
            m + 14.0
        );
    }
    for (label, color, f) in [
        ("p50", "#1f77b4", (|x: &Window| x.p50) as fn(&Window) -> f64),
        ("p99", "#d62728", |x: &Window| x.p99),
        ("max", "#999999", |x: &Window| x.max),
    ] {
        let pts: Vec<String> = ws
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.t_ms), y(f(p))))
            .collect();
        s += &format!(
            "<polyline fill='none' stroke='{color}' stroke-width='1.2' points='{}'/>\n",
            pts.join(" ")
        );
        let ly = match label {
            "p50" => 20.0,
            "p99" => 34.0,
            _ => 48.0,
        };
        s += &format!(
            "<text x='{:.1}' y='{ly}' fill='{color}'>{label} per 100 ms</text>\n",
            w - m - 110.0
        );
    }
    let mut v = 1.0;
    while v <= hi * 1.0001 {
        s += &format!(
            "<text x='4' y='{:.1}'>{}</text><line x1='{m}' x2='{:.1}' y1='{:.1}' y2='{:.1}' stroke='#eee'/>\n",
            y(v) + 4.0,
            if v >= 1000.0 {
                format!("{}ms", v / 1000.0)
            } else {
                format!("{v}µs")
            },
            w - m,
            y(v),
            y(v)
        );
        v *= 10.0;
    }
    s += &format!(
        "<text x='{:.1}' y='{:.1}'>time (s), total {:.1} s</text>\n</svg>\n",
        w / 2.0 - 60.0,
        h - 12.0,
        t_max / 1000.0
    );
    s
}
