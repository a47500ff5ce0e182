//! `cairn fsck`: check (and with -y repair) a file system. The checker is crates/fsck.
//! `cairn fsck --background MOUNTPOINT` instead asks the mount's daemon (its control socket,
//! `check-background start|status`) to run the file system's background check on the live
//! mount (`cairn_ffs::bgcheck`) and polls its progress.

use std::io::IsTerminal;
use std::path::PathBuf;

use std::time::{Duration, Instant};

use anyhow::Result;
use cairn_fsck::{CheckOptions, Class, Progress, Report};
use serde_json::Value;

use crate::{control, runtime};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Repair what is found (default: check only)
    #[arg(short = 'y', conflicts_with = "no")]
    pub yes: bool,
    /// Check only, never write (the default; for e2fsck muscle memory)
    #[arg(short = 'n')]
    pub no: bool,
    /// Check an image that a read-write mount holds (check only, never with -y); the
    /// findings may be stale because the mount keeps writing
    #[arg(long, conflicts_with = "yes")]
    pub force: bool,
    /// Print the report as JSON on stdout
    #[arg(long)]
    pub json: bool,
    /// Check the live mount at MOUNTPOINT while applications keep writing (soft updates'
    /// background fsck): reclaim the leaks a crash left (blocks and inodes allocated but
    /// unreferenced, link counts above the names, open-unlinked files); progress on stderr
    #[arg(long, conflicts_with_all = ["yes", "no", "force"])]
    pub background: bool,
    /// Image file or block device (with --background: the mount point)
    pub image: PathBuf,
}

/// Exit codes follow e2fsck: 0 clean, 1 errors fixed, 4 errors left, 8 operational error.
pub fn run(args: Args) -> Result<i32> {
    if args.background {
        return background(&args);
    }
    let repair = args.yes && !args.no;
    // An image just unmounted may still be held by its daemon's final flush.
    if !args.force
        && let Err(e) = runtime::wait_for_image(&args.image, repair)
    {
        eprintln!("cairn fsck: {e:#}");
        return Ok(8);
    }
    let name = args.image.display().to_string();
    // A progress bar only for a person watching a terminal; pipes and logs get the summary.
    let bar = (std::io::stdout().is_terminal() && !args.json).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg:<40} [{bar:30}] {pos}/{len}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    });
    let progress = bar.clone().map(|b| {
        Box::new(move |p: &Progress| {
            b.set_message(format!("pass {}: {}", p.pass.number(), p.pass.name()));
            b.set_length(p.total);
            b.set_position(p.done);
        }) as Box<dyn FnMut(&Progress) + Send>
    });
    if args.force && !args.json {
        eprintln!(
            "cairn fsck: {name}: checking without the image lock (--force); if it is mounted, \
             findings may be stale"
        );
    }
    // The image's format picks the checker; an image no format recognizes goes to the
    // default one, which looks for backup superblocks before it gives up.
    let fs = cairn_fstypes::probe_path(&args.image).unwrap_or_else(|_| cairn_fstypes::types()[0]);
    let result = (fs.check)(
        &args.image,
        CheckOptions {
            repair,
            progress,
            force: args.force,
        },
    );
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    match result {
        Ok(report) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&json(&report))?);
            } else {
                print_text(&name, repair, &report);
            }
            Ok(report.exit_code())
        }
        Err(e) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "image": name, "error": e.to_string(), "exit_code": e.exit_code() })
                );
            } else {
                eprintln!("cairn fsck: {name}: {e}");
            }
            Ok(e.exit_code())
        }
    }
}

fn json(r: &Report) -> serde_json::Value {
    serde_json::json!({
        "exit_code": r.exit_code(),
        "clean": r.is_clean(),
        "repaired": r.repaired,
        "fixed": r.fixed,
        "backup_superblock": r.backup_superblock,
        "corruptions": r.corruptions().count(),
        "leaks": r.leaks().count(),
        "findings": r.findings,
        "stats": r.stats,
    })
}

fn print_text(name: &str, repair: bool, r: &Report) {
    println!(
        "cairn fsck {name} ({})",
        if repair { "repair" } else { "check only" }
    );
    for f in &r.findings {
        println!("  {f}");
    }
    let s = &r.stats;
    let pct = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            a as f64 * 100.0 / b as f64
        }
    };
    println!(
        "{name}: {} files, {} directories, {} symlinks, {} special; blocks {}/{} ({:.1}%), inodes {}/{} ({:.1}%)",
        s.files,
        s.dirs,
        s.symlinks,
        s.specials,
        s.blocks_used,
        s.blocks_total,
        pct(s.blocks_used, s.blocks_total),
        s.inodes_used,
        s.inodes_total,
        pct(s.inodes_used, s.inodes_total),
    );
    if r.is_clean() {
        println!("{name}: clean");
        return;
    }
    let corr = r
        .findings
        .iter()
        .filter(|f| f.class == Class::Corruption)
        .count();
    let leaks = r.findings.len() - corr;
    let left = r.unfixed().count();
    println!(
        "{name}: {} findings ({corr} corruption, {leaks} leak); {} fixed, {left} left{}",
        r.findings.len(),
        r.fixed,
        if left > 0 && !repair {
            " (run with -y to repair)"
        } else {
            ""
        }
    );
}

/// `cairn fsck --background MOUNTPOINT`: starts the daemon's background check, shows its
/// progress on stderr, prints the summary. Exit codes as a repair: 0 nothing to reclaim,
/// 1 leaks reclaimed, 4 findings left for an offline fsck, 8 refused or failed (one line).
fn background(args: &Args) -> Result<i32> {
    let name = args.image.display().to_string();
    let fail = |msg: String| {
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "mountpoint": name, "error": msg, "exit_code": 8 })
            );
        } else {
            eprintln!("cairn fsck --background: {name}: {msg}");
        }
        Ok(8)
    };
    let sock = match runtime::canonical_mountpoint(&args.image) {
        Ok(mp) => runtime::socket_for(&mp),
        Err(e) => return fail(format!("{e:#}")),
    };
    if !sock.exists() {
        return fail("not a cairn mount (no cairn daemon serves it)".into());
    }
    if let Err(e) = control::request(&sock, "check-background start") {
        let msg = format!("{e:#}");
        return fail(if msg.contains("unknown command") {
            "this mount's file system has no background check (not a cairn FFS mount)".into()
        } else {
            msg
        });
    }
    let tty = std::io::stderr().is_terminal();
    let (t0, mut last_line) = (Instant::now(), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let v = match control::request(&sock, "check-background status") {
            Ok(v) => v,
            Err(e) => return fail(format!("lost the daemon: {e:#}")),
        };
        let (done, total) = (num(&v, "done"), num(&v, "total"));
        if v["running"].as_bool() == Some(true) {
            // A person sees one line updated in place; a log gets a line every 2 s.
            if tty && !args.json {
                eprint!("\rscanned {done}/{total} inodes");
            } else if last_line.elapsed() >= Duration::from_secs(2) {
                eprintln!("cairn fsck --background: scanned {done}/{total} inodes");
                last_line = Instant::now();
            }
            continue;
        }
        if tty && !args.json {
            eprint!("\r\x1b[K");
        }
        if let Some(e) = v["failed"].as_str() {
            return fail(e.to_string());
        }
        let sum = &v["summary"];
        let fixed = [
            "blocks_freed",
            "inodes_freed",
            "link_counts_fixed",
            "block_counts_fixed",
            "summaries_fixed",
        ]
        .iter()
        .map(|k| num(sum, k))
        .sum::<u64>();
        let code = if num(sum, "left_for_fsck") > 0 {
            4
        } else if fixed > 0 {
            1
        } else {
            0
        };
        if args.json {
            let mut out = sum.clone();
            out["mountpoint"] = Value::String(name.clone());
            out["exit_code"] = code.into();
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            print_background(&name, sum, t0.elapsed());
        }
        return Ok(code);
    }
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn print_background(name: &str, s: &Value, took: Duration) {
    println!(
        "cairn fsck --background {name} (mode {}): {} inodes scanned ({} round{}), {} in use, {:.2} s",
        s["mode"].as_str().unwrap_or("?"),
        num(s, "inodes_scanned"),
        num(s, "rounds"),
        if num(s, "rounds") == 1 { "" } else { "s" },
        num(s, "inodes_in_use"),
        took.as_secs_f64()
    );
    let rows = [
        ("blocks freed", num(s, "blocks_freed")),
        ("inodes freed", num(s, "inodes_freed")),
        ("  with their blocks", num(s, "blocks_freed_with_inodes")),
        ("link counts lowered", num(s, "link_counts_fixed")),
        ("block counts set", num(s, "block_counts_fixed")),
        ("group summaries fixed", num(s, "summaries_fixed")),
        (
            "skipped: changed during the scan",
            num(s, "skipped_changed"),
        ),
        ("skipped: open or owed by the mode", num(s, "skipped_busy")),
        ("left for an offline fsck", num(s, "left_for_fsck")),
    ];
    for (k, v) in rows {
        println!("  {k:<34} {v}");
    }
    println!(
        "  {:<34} {:.1} ms",
        "longest hold of the engine's lock",
        s["lock_held_max_ms"].as_f64().unwrap_or(0.0)
    );
    if let Some(left) = s["left"].as_array() {
        for l in left.iter().filter_map(Value::as_str) {
            println!("  left: {l}");
        }
    }
}
