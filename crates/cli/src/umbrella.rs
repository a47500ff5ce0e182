//! `cairn umbrella`: mount the UmbrellaFS policy layer over branch directories, and talk to
//! its daemon (reload, enforce, branch add/remove/list, status, where).
//!
//! The daemon is the same as `cairn mount`'s (fork, ready pipe, runtime record, control
//! socket, signals); the control socket carries the layer's own commands besides
//! `stats`, `ping` and `umount`, so `cairn umount` and `cairn stats` work unchanged.

use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use cairn_fuse::{FuseOptions, Server};
use cairn_umbrella::{Config, Umbrella, hex};
use cairn_vfs::FileSystem;
use log::{error, info, warn};
use nix::sys::signal::{SigSet, Signal};
use serde_json::{Value, json};

use crate::{control, mount, runtime};

const HELP: &str = "\
Mount:   cairn umbrella [-f] [-o OPTIONS] CONFIG.toml MOUNTPOINT
Then:    cairn umbrella status|reload|enforce|branch ... MOUNTPOINT, cairn umbrella where PATH,
         cairn umount MOUNTPOINT.
Options: the FUSE ones of `cairn mount` (threads=N, allow_other, default_permissions,
max_write=SIZE, readdirplus=..., noexec, ...), log=PATH, and remount (with ro/rw, ...,
as `cairn mount`). Mounting a configuration a daemon already serves at a second mount
point makes that daemon serve it there too. `cairn install-helper` adds
mount.fuse.umbrella for `mount -t fuse.umbrella CONFIG DIR` and fstab.
See examples/umbrella-fig4.toml and the README for the configuration format.";

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true, after_help = HELP)]
pub struct Args {
    #[command(subcommand)]
    cmd: Option<Sub>,
    /// Mount options, comma-separated
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Stay in the foreground and log to stderr
    #[arg(short = 'f', long)]
    foreground: bool,
    /// The configuration file
    #[arg(required = true)]
    config: Option<PathBuf>,
    /// Where to mount
    #[arg(required = true)]
    mountpoint: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Re-read the configuration (or CONFIG) without unmounting; a bad file keeps the old rules
    Reload {
        mountpoint: PathBuf,
        config: Option<PathBuf>,
    },
    /// Move every misplaced file now (time rules act this way), with a progress bar
    Enforce {
        mountpoint: PathBuf,
        /// Throttle, bytes per second (like 50M); default: the config's enforce_rate
        #[arg(long)]
        rate: Option<String>,
        /// Start and return without waiting
        #[arg(long)]
        no_wait: bool,
    },
    /// Add, remove or list branches of a live mount
    Branch {
        #[command(subcommand)]
        op: BranchOp,
    },
    /// Branches, rules with hit counts, migrations
    Status {
        mountpoint: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Which branch holds PATH and which rule put it there
    Where {
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Subcommand, Debug)]
enum BranchOp {
    /// Add (or re-add) a branch: its rules become active again
    Add {
        mountpoint: PathBuf,
        name: String,
        path: PathBuf,
    },
    /// Take a branch out: its files leave the union, rules preferring it go inactive
    Remove { mountpoint: PathBuf, name: String },
    List {
        mountpoint: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: Args) -> Result<i32> {
    match args.cmd {
        None => {
            let (Some(config), Some(mp)) = (args.config, args.mountpoint) else {
                bail!("usage: cairn umbrella CONFIG.toml MOUNTPOINT");
            };
            mount_cmd(&config, &mp, &args.options, args.foreground)
        }
        Some(sub) => {
            let env = env_logger::Env::default().default_filter_or("warn");
            let _ = env_logger::Builder::from_env(env).try_init();
            client(sub)
        }
    }
}

fn sock_of(mp: &Path) -> Result<PathBuf> {
    let c = runtime::canonical_mountpoint(mp)?;
    let sock = runtime::paths(&c).sock;
    if !sock.exists() {
        bail!("no cairn daemon serves {}", mp.display());
    }
    Ok(sock)
}

fn ask(mp: &Path, line: &str) -> Result<Value> {
    let sock = sock_of(mp)?;
    control::request(&sock, line).with_context(|| format!("{}", mp.display()))
}

fn client(sub: Sub) -> Result<i32> {
    match sub {
        Sub::Reload { mountpoint, config } => {
            let line = match config {
                Some(c) => {
                    let abs = std::path::absolute(&c)?;
                    format!("reload {}", hex(abs.as_os_str().as_bytes()))
                }
                None => "reload".into(),
            };
            let v = ask(&mountpoint, &line)?;
            println!(
                "reloaded {} ({} rules)",
                v["config"].as_str().unwrap_or("?"),
                v["rules"]
            );
            Ok(0)
        }
        Sub::Enforce {
            mountpoint,
            rate,
            no_wait,
        } => enforce(&mountpoint, rate.as_deref(), no_wait),
        Sub::Branch { op } => match op {
            BranchOp::Add {
                mountpoint,
                name,
                path,
            } => {
                // Resolved by the daemon, with the branch's deadline: a path on a hung
                // mount must not hang this command either.
                let abs = std::path::absolute(&path)
                    .with_context(|| format!("branch {}", path.display()))?;
                let v = ask(
                    &mountpoint,
                    &format!("branch-add {name} {}", hex(abs.as_os_str().as_bytes())),
                )?;
                println!("branch '{name}' added ({})", abs.display());
                if let Some(r) = v["active_rules"].as_array() {
                    println!(
                        "active rules: {}",
                        r.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                Ok(0)
            }
            BranchOp::Remove { mountpoint, name } => {
                let v = ask(&mountpoint, &format!("branch-remove {name}"))?;
                println!("branch '{name}' removed");
                if let Some(r) = v["inactive_rules"].as_array().filter(|r| !r.is_empty()) {
                    println!(
                        "inactive rules: {}",
                        r.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                Ok(0)
            }
            BranchOp::List { mountpoint, json } => {
                let v = ask(&mountpoint, "branch-list")?;
                if json {
                    println!("{v}");
                } else {
                    print!("{}", render_branches(&v["branches"]));
                }
                Ok(0)
            }
        },
        Sub::Status { mountpoint, json } => {
            let v = ask(&mountpoint, "status")?;
            if json {
                println!("{v}");
            } else {
                print!("{}", render_status(&v));
            }
            Ok(0)
        }
        Sub::Where { path, json } => {
            let abs = std::path::absolute(&path)?;
            // The mount is the nearest ancestor with a daemon.
            let mut mp = abs.parent().map(Path::to_path_buf);
            let mut found = None;
            while let Some(m) = mp {
                let c = runtime::canonical_mountpoint(&m).unwrap_or(m.clone());
                if runtime::paths(&c).sock.exists() {
                    found = Some(c);
                    break;
                }
                mp = m.parent().map(Path::to_path_buf);
            }
            let mp = found.ok_or_else(|| {
                anyhow!("{} is not inside a cairn umbrella mount", path.display())
            })?;
            let parent = abs
                .parent()
                .unwrap_or(&abs)
                .canonicalize()
                .unwrap_or_else(|_| abs.clone());
            let full = parent.join(abs.file_name().unwrap_or_default());
            let rel = full
                .strip_prefix(&mp)
                .map_err(|_| anyhow!("{} is not under {}", path.display(), mp.display()))?;
            let mut u = b"/".to_vec();
            u.extend_from_slice(rel.as_os_str().as_bytes());
            let v = ask(&mp, &format!("where {}", hex(&u)))?;
            if json {
                println!("{v}");
            } else if v["kind"] == "file" {
                println!(
                    "{}: on branch '{}' ({})",
                    path.display(),
                    v["branch"].as_str().unwrap_or("?"),
                    v["host_path"].as_str().unwrap_or("?")
                );
                println!(
                    "  rule: {} -> {}",
                    v["rule"].as_str().unwrap_or("?"),
                    v["rule_branches"]
                );
                if let Some(t) = v["would_move_to"].as_str() {
                    println!(
                        "  misplaced: the rules now choose '{t}' (moved at its next close or by enforce)"
                    );
                }
            } else {
                println!("{}: directory on {}", path.display(), v["branches"]);
            }
            Ok(0)
        }
    }
}

fn enforce(mp: &Path, rate: Option<&str>, no_wait: bool) -> Result<i32> {
    let rate = match rate {
        None => None,
        Some(r) => Some(
            cairn_umbrella::config::parse_bytes(r)
                .filter(|&n| n > 0)
                .ok_or_else(|| anyhow!("bad --rate '{r}'"))?,
        ),
    };
    let line = match rate {
        Some(r) => format!("enforce {r}"),
        None => "enforce".into(),
    };
    ask(mp, &line)?;
    if no_wait {
        println!("enforcer started");
        return Ok(0);
    }
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} files, {msg} [{elapsed_precise}]",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let started = Instant::now();
    let v = loop {
        let v = ask(mp, "enforce-status")?;
        if let Some(b) = &bar {
            b.set_length(v["total"].as_u64().unwrap_or(0));
            b.set_position(v["done"].as_u64().unwrap_or(0));
            b.set_message(format!("{} moved", v["moved"]));
        }
        if v["finished"] == true {
            break v;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    println!(
        "enforce: {} files checked, {} moved ({} bytes), {} failed, in {:.1} s",
        v["done"],
        v["moved"],
        v["bytes"],
        v["failed"],
        v["seconds"]
            .as_f64()
            .unwrap_or(started.elapsed().as_secs_f64())
    );
    Ok(if v["failed"].as_u64().unwrap_or(0) > 0 {
        1
    } else {
        0
    })
}

fn human(n: u64) -> String {
    let units = ["B", "K", "M", "G", "T"];
    let mut f = n as f64;
    let mut u = 0;
    while f >= 1024.0 && u + 1 < units.len() {
        f /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}B")
    } else {
        format!("{f:.1}{}", units[u])
    }
}

fn render_branches(v: &Value) -> String {
    let mut s = format!(
        "{:<12} {:<8} {:>9} {:>9} {:>8}  {}\n",
        "BRANCH", "STATE", "FREE", "SIZE", "FILES", "PATH"
    );
    for b in v.as_array().into_iter().flatten() {
        s += &format!(
            "{:<12} {:<8} {:>9} {:>9} {:>8}  {}{}\n",
            b["name"].as_str().unwrap_or("?"),
            b["state"].as_str().unwrap_or("?"),
            human(b["free_bytes"].as_u64().unwrap_or(0)),
            human(b["total_bytes"].as_u64().unwrap_or(0)),
            b["files"].as_u64().unwrap_or(0),
            b["path"].as_str().unwrap_or("?"),
            if b["index"] == true { "  (index)" } else { "" }
        );
    }
    // Why each branch is in its state and since when, its deadline, what its calls
    // answered: one line per branch that is not simply active and error-free.
    for b in v.as_array().into_iter().flatten() {
        let e = &b["errors"];
        let n = |k: &str| e[k].as_u64().unwrap_or(0);
        let errors = n("timeouts") + n("unavailable") + n("enotconn") + n("estale") + n("eio");
        let waiting = b["waiting_to_return"].as_u64().unwrap_or(0);
        if b["state"] == "active" && errors == 0 && waiting == 0 {
            continue;
        }
        s += &format!(
            "  {}: {} for {:.0} s ({}); calls {} with a {} ms deadline; \
             {} timeouts, {} refused while stuck, {} ENOTCONN, {} ESTALE, {} EIO",
            b["name"].as_str().unwrap_or("?"),
            b["state"].as_str().unwrap_or("?"),
            b["for_seconds"].as_f64().unwrap_or(0.0),
            b["reason"].as_str().unwrap_or("?"),
            if b["isolated"] == true {
                "isolated"
            } else {
                "inline"
            },
            b["timeout_ms"],
            n("timeouts"),
            n("unavailable"),
            n("enotconn"),
            n("estale"),
            n("eio"),
        );
        if waiting > 0 {
            s += &format!("; {waiting} files wait to go back to it");
        }
        s += "\n";
    }
    s
}

fn render_status(v: &Value) -> String {
    let mut s = format!(
        "error semantics: {}\n\n",
        v["errors"].as_str().unwrap_or("?")
    );
    s += &render_branches(&v["branches"]);
    s += &format!("\n{:<50} {:<8} {:>8}\n", "RULE", "STATE", "HITS");
    for r in v["rules"].as_array().into_iter().flatten() {
        s += &format!(
            "{:<50} {:<8} {:>8}\n",
            r["rule"].as_str().unwrap_or("?"),
            if r["active"] == true {
                "active"
            } else {
                "inactive"
            },
            r["hits"].as_u64().unwrap_or(0)
        );
    }
    let m = &v["migrations"];
    s += &format!(
        "\nmigrations: {} done, {} pending, {} failed, {} abandoned (the file changed; retried), \
         {} moved, {} overflows\n",
        m["done"],
        m["pending"],
        m["failed"],
        m["abandoned"],
        human(m["bytes"].as_u64().unwrap_or(0)),
        m["overflows"],
    );
    s += &format!(
        "move records on the branches: {} ({} left unfinished for the next mount); \
         at mount: {} recovered, {} copies kept\n",
        m["records"], m["unfinished"], m["recovered_at_mount"], m["kept_at_mount"]
    );
    if let Some(k) = v["kept"].as_array().filter(|k| !k.is_empty()) {
        s += "copies kept by recovery (it could not tell which copy was right; see the log):\n";
        for d in k {
            s += &format!("  {}\n", d.as_str().unwrap_or("?"));
        }
    }
    if v["conflicts"].as_u64().unwrap_or(0) > 0 {
        s += &format!("conflicts found by the index scan: {}\n", v["conflicts"]);
    }
    if let Some(c) = v["conflict_names"].as_array().filter(|c| !c.is_empty()) {
        s += "names changed on both sides while a branch was away (both kept):\n";
        for n in c {
            s += &format!("  {}\n", n.as_str().unwrap_or("?"));
        }
    }
    if v["enforce"].is_object() {
        let e = &v["enforce"];
        s += &format!(
            "last enforce: {}/{} files, {} moved, finished: {}\n",
            e["done"], e["total"], e["moved"], e["finished"]
        );
    }
    s
}

/// `cairn umbrella mount`'s `-o` list: the FUSE options, `log=`, and what mount(8) and
/// fstab pass that means nothing here (`mount::ignored`, the list `cairn mount` skips too:
/// generic/003 remounts with `nodiratime`).
fn mount_options(options: &[String]) -> Result<(FuseOptions, Option<PathBuf>)> {
    let mut fuse = FuseOptions {
        subtype: "umbrella".into(),
        ..Default::default()
    };
    let mut log = None;
    for item in options
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (item, None),
        };
        match k {
            "log" => {
                log = Some(std::path::absolute(
                    v.ok_or_else(|| anyhow!("option 'log' needs a path"))?,
                )?)
            }
            "ro" => fuse.read_only = true,
            "rw" => fuse.read_only = false,
            k if mount::ignored(k) => {}
            _ => {
                if !fuse.set(k, v).map_err(|e| anyhow!(e))? {
                    bail!("unknown option '{item}'");
                }
            }
        }
    }
    Ok((fuse, log))
}

fn mount_cmd(config: &Path, mp: &Path, options: &[String], foreground: bool) -> Result<i32> {
    if mount::is_remount(options) {
        return mount::remount(mp, options);
    }
    let cfg = Config::load(config).map_err(|e| anyhow!("{e}"))?;
    let mountpoint = mp
        .canonicalize()
        .with_context(|| format!("bad mount point {}", mp.display()))?;
    if !mountpoint.is_dir() {
        bail!("bad mount point {}: not a directory", mp.display());
    }
    for b in &cfg.branches {
        if mountpoint.starts_with(&b.path) || b.path.starts_with(&mountpoint) {
            bail!(
                "the mount point {} overlaps branch '{}' ({})",
                mountpoint.display(),
                b.name,
                b.path.display()
            );
        }
    }
    let (mut fuse, log) = mount_options(options)?;
    if fuse.fsname.is_empty() {
        fuse.fsname = cfg
            .source
            .canonicalize()
            .unwrap_or(cfg.source.clone())
            .display()
            .to_string();
    }
    // A second mount point of a configuration a live daemon serves: the same daemon
    // serves it (two daemons over one set of branches would each keep an index and a
    // kernel cache the other's changes never reach).
    if let Some(daemon) = runtime::serving(&cfg.source) {
        let second = mount::Second {
            read_only: fuse.read_only,
            fuse: &fuse,
            mode: None,
        };
        let shown = cfg.source.display().to_string();
        mount::second_mount_point(&daemon, &second, &shown, &mountpoint)?;
        return Ok(0);
    }
    let job = Job {
        cfg,
        fuse,
        mountpoint,
    };
    if foreground {
        mount::init_log(None);
        let d = job.start()?;
        return Ok(d.serve());
    }
    let log = log.unwrap_or_else(|| runtime::paths(&job.mountpoint).log);
    mount::fork_daemon(log, move || job.start(), Daemon::serve)
}

struct Job {
    cfg: Config,
    fuse: FuseOptions,
    mountpoint: PathBuf,
}

struct Daemon {
    server: Server,
    record: runtime::Record,
    mountpoint: PathBuf,
}

impl Job {
    fn start(self) -> Result<Daemon> {
        let mut signals = SigSet::empty();
        for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            signals.add(s);
        }
        signals.thread_block().context("blocking signals")?;
        let mut record = runtime::Record::claim(&self.mountpoint)?;
        // Bound before the mount appears, served once it is up (see `control::Listener`).
        let listener = control::Listener::bind(&record.paths.sock)
            .map_err(|e| warn!("no control socket: {e:#}"))
            .ok();
        let shown = self.cfg.source.display().to_string();
        let fs = match Umbrella::mount(&self.cfg) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                record.remove();
                bail!("cannot mount {shown}: {e}");
            }
        };
        let server = match Server::mount(fs.clone(), &self.mountpoint, &self.fuse) {
            Ok(s) => s,
            Err(e) => {
                let _ = fs.destroy();
                record.remove();
                bail!("cannot mount {shown} on {}: {e}", self.mountpoint.display());
            }
        };
        record.write_info(&self.cfg.source, &self.mountpoint)?;
        let c = commands(fs.clone(), &server, &self);
        if let Some(l) = listener
            && let Err(e) = l.serve(c)
        {
            warn!("no control socket: {e:#}");
        }
        let u = server.unmounter();
        std::thread::Builder::new()
            .name("cairn-signals".into())
            .spawn(move || mount::signal_loop(signals, u))?;
        info!(
            "umbrella {} mounted on {} ({} branches)",
            shown,
            self.mountpoint.display(),
            self.cfg.branches.len()
        );
        Ok(Daemon {
            server,
            record,
            mountpoint: self.mountpoint,
        })
    }
}

fn commands(fs: Arc<Umbrella>, server: &Server, job: &Job) -> control::Commands {
    let info = json!({
        "config": job.cfg.source.display().to_string(),
        "mountpoint": job.mountpoint.display().to_string(),
        "fuse_threads": job.fuse.threads,
        "read_only": job.fuse.read_only,
    });
    let f: Arc<dyn cairn_vfs::FileSystem> = fs.clone();
    let mut c = control::Commands::for_daemon(
        f,
        server,
        info,
        "live counters: the layer's status, the FUSE requests per opcode, the daemon's",
    );
    let table: [(&'static str, &'static str); 9] = [
        ("status", "branches, rules with hit counts, migrations"),
        ("where", "where HEX-PATH: the branch and rule of a file"),
        ("reload", "reload [HEX-CONFIG]: re-read the rules"),
        (
            "enforce",
            "enforce [BYTES-PER-SEC]: start the policy enforcer",
        ),
        ("enforce-status", "progress of the last enforcer run"),
        ("quiesce", "wait until no migration is queued"),
        ("branch-list", "the branches"),
        ("branch-add", "branch-add NAME HEX-PATH"),
        ("branch-remove", "branch-remove NAME"),
    ];
    for (name, help) in table {
        let f = fs.clone();
        c.add(name, help, Box::new(move |args| f.command(name, args)));
    }
    c
}

impl Daemon {
    fn serve(self) -> i32 {
        let Daemon {
            server,
            record,
            mountpoint,
        } = self;
        let r = server.run();
        record.remove();
        match r {
            Ok(()) => {
                info!("{} unmounted; index saved", mountpoint.display());
                0
            }
            Err(e) => {
                error!("{}: {e}", mountpoint.display());
                eprintln!("cairn: {}: {e}", mountpoint.display());
                1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_atime_options_are_accepted() {
        for o in crate::mount::tests::ATIME_OPTIONS.split(',') {
            assert!(
                mount_options(&[o.to_string()]).is_ok(),
                "cairn umbrella mount -o {o} refused"
            );
        }
        let (f, _) = mount_options(&["relatime,nodiratime,noatime".into()]).unwrap();
        assert_eq!(f.atime, cairn_vfs::Atime::Never);
        assert!(mount_options(&["frobnicate".into()]).is_err());
    }
}
