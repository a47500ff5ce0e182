//! `cairn fsck`: check (and with -y repair) a file system. The checker is crates/fsck.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use cairn_fsck::{CheckOptions, Class, Progress, Report};

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
    /// Image file or block device
    pub image: PathBuf,
}

/// Exit codes follow e2fsck: 0 clean, 1 errors fixed, 4 errors left, 8 operational error.
pub fn run(args: Args) -> Result<i32> {
    let repair = args.yes && !args.no;
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
