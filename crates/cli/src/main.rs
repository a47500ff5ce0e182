//! `cairn`: the one command of the toolkit.

use std::ffi::OsString;

use clap::{Parser, Subcommand};

mod control;
mod crash;
mod fsck;
mod helper;
mod inspect;
mod lfs;
mod mkfs;
mod modes;
mod mount;
mod mount_help;
mod runtime;
mod stats;
mod sync;
mod umbrella;
mod umount;
mod wal;

#[derive(Parser, Debug)]
#[command(
    name = "cairn",
    version,
    about = "cairn: file systems in user space over FUSE — FFS (sync, async, soft updates, journaling) and LFS, the umbrella policy layer, and tools to check, crash-test and benchmark them",
    after_help = "Run `cairn help mount` for the mount options, the log file and the runtime files."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a file system on an image file or block device
    Mkfs(mkfs::Args),
    /// Check (and with -y repair) a file system
    Fsck(fsck::Args),
    /// Show on-disk structures: superblock, group N, inode N, dir PATH, block N
    Inspect(inspect::Args),
    /// Mount an image; returns once the mount is ready (a daemon keeps serving it)
    Mount(mount::Args),
    /// Unmount and wait until the daemon has flushed everything and exited
    #[command(alias = "unmount")]
    Umount(umount::Args),
    /// Live counters of a mounted file system
    Stats(stats::Args),
    /// Make a mounted file system durable (sync(2) and `sync -f` never reach a FUSE daemon)
    Sync(sync::Args),
    /// Install the mount(8)/umount(8) helpers: mount.cairn, mount.fuse.cairn,
    /// umount.fuse.cairn, mount.fuse.umbrella, umount.fuse.umbrella (for mount -t cairn,
    /// -t fuse.cairn, -t fuse.umbrella and fstab)
    InstallHelper(helper::InstallArgs),
    /// List the metadata-update modes this build can mount (one per line: name, description)
    Modes {
        /// One JSON object per line instead: format, mode, target name, what to do after a
        /// crash, the guarantees the crash harness holds the mode to
        #[arg(long)]
        json: bool,
        /// A Markdown table instead: mode, format, what it is, when a call is durable,
        /// what a crash needs (the README's table)
        #[arg(long, conflicts_with = "json")]
        markdown: bool,
    },
    /// Crash-consistency testing: check every crash state of recorded workloads per mode
    Crash(crash::Args),
    /// Mount the UmbrellaFS policy layer over branch directories, and manage it
    Umbrella(umbrella::Args),
    /// The log-structured file system's tools (now: the LFS paper's cleaning simulator)
    Lfs(lfs::Args),
    /// Make, dump, summarize and measure a stand-alone write-ahead log (a journal's log device)
    Wal(wal::Args),
    /// Reproduce the papers' benchmarks on cairn, kernel file systems and FUSE peers
    Bench {
        #[command(subcommand)]
        cmd: cairn_bench::Cmd,
    },
}

/// SIGPIPE back to its default action (Rust starts programs with it ignored, so a write to
/// a closed pipe fails and `println!` panics).
#[allow(unsafe_code)]
fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL installs no handler and touches no
    // memory of this program; nothing else in the process is changing it concurrently (this
    // runs before any thread is started).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let argv = match helper::translate(&argv) {
        None => argv,
        Some((_, Ok(helper::Helper::Run(a)))) => a,
        Some((_, Ok(helper::Helper::Exit(code)))) => std::process::exit(code),
        Some((name, Err(e))) => {
            eprintln!("{name}: {e}");
            std::process::exit(1);
        }
    };
    let cli = Cli::parse_from(argv);
    // The mount command sets up its own logging (a file once it is a daemon).
    if !matches!(cli.cmd, Cmd::Mount(_) | Cmd::Umbrella(_)) {
        let env = env_logger::Env::default().default_filter_or("warn");
        let _ = env_logger::Builder::from_env(env).try_init();
    }
    if matches!(cli.cmd, Cmd::Modes { .. } | Cmd::Inspect(_) | Cmd::Stats(_)) {
        // Commands that only read and print: a reader that goes away (`cairn modes --json |
        // head`) ends them quietly, as it ends any Unix filter, instead of a panic in
        // `println!`. Not for commands that write an image or serve a mount, which must
        // finish what they started whatever happens to their output.
        default_sigpipe();
    }
    let result = match cli.cmd {
        Cmd::Mount(a) => mount::run(a),
        Cmd::Mkfs(a) => mkfs::run(a),
        Cmd::Fsck(a) => fsck::run(a),
        Cmd::Inspect(a) => inspect::run(a),
        Cmd::Umount(a) => umount::run(a),
        Cmd::Stats(a) => stats::run(a),
        Cmd::Sync(a) => sync::run(a),
        Cmd::InstallHelper(a) => helper::install(a),
        Cmd::Modes { markdown: true, .. } => {
            print!("{}", modes::readme_table());
            Ok(0)
        }
        Cmd::Modes { json, .. } => {
            for l in modes::lines(json) {
                println!("{l}");
            }
            Ok(0)
        }
        Cmd::Crash(a) => crash::run(a),
        Cmd::Umbrella(a) => umbrella::run(a),
        Cmd::Lfs(a) => lfs::run(a),
        Cmd::Wal(a) => wal::run(a),
        Cmd::Bench { cmd } => Ok(cairn_bench::main_with(cmd)),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("cairn: {e:#}");
            std::process::exit(1);
        }
    }
}
