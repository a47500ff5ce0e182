//! The control socket of a mount daemon.
//!
//! Protocol: a Unix stream socket; the client writes one command per line, a command word
//! followed by space-separated arguments (`stats`, `help`, ...); the daemon answers each
//! line with exactly one line holding one JSON document. Failures are
//! `{"error": "..."}`. New commands (the policy layer's) are added by registering a
//! handler in [`Commands`]; clients that only know `stats` are unaffected.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use log::{debug, warn};
use serde_json::{Value, json};

pub type Handler = Box<dyn Fn(&[&str]) -> Value + Send + Sync>;

/// The command table of one daemon.
#[derive(Default)]
pub struct Commands {
    table: BTreeMap<&'static str, (&'static str, Handler)>,
}

impl Commands {
    pub fn add(&mut self, name: &'static str, help: &'static str, h: Handler) {
        self.table.insert(name, (help, h));
    }

    /// Answers one request line.
    pub fn dispatch(&self, line: &str) -> Value {
        let mut words = line.split_whitespace();
        let Some(cmd) = words.next() else {
            return json!({"error": "empty command"});
        };
        let args: Vec<&str> = words.collect();
        if cmd == "help" {
            let cmds: BTreeMap<_, _> = self.table.iter().map(|(k, (h, _))| (*k, *h)).collect();
            return json!({ "commands": cmds });
        }
        match self.table.get(cmd) {
            Some((_, h)) => h(&args),
            None => json!({"error": format!("unknown command '{cmd}' (try 'help')")}),
        }
    }
}

impl Commands {
    /// The commands every daemon answers: `stats` (the file system's counters, the FUSE
    /// requests per opcode and `info` about the daemon), `ping`, `sync` and `umount`.
    pub fn for_daemon(
        fs: Arc<dyn cairn_vfs::FileSystem>,
        server: &cairn_fuse::Server,
        mut info: Value,
        stats_help: &'static str,
    ) -> Commands {
        let mut c = Commands::default();
        let syncing = fs.clone();
        let counts = server.counts();
        let started = std::time::Instant::now();
        info["pid"] = json!(std::process::id());
        c.add(
            "stats",
            stats_help,
            Box::new(move |_| {
                let raw = fs.stats_json();
                let fs_stats = serde_json::from_str::<Value>(&raw).unwrap_or(Value::String(raw));
                let mut daemon = info.clone();
                daemon["uptime_secs"] = json!(started.elapsed().as_secs_f64());
                json!({ "fs": fs_stats, "fuse": counts.to_json(), "daemon": daemon })
            }),
        );
        c.add(
            "ping",
            "is the daemon alive",
            Box::new(|_| json!({"ok": true, "pid": std::process::id()})),
        );
        c.add(
            "sync",
            "make everything the daemon holds durable (what sync(2) cannot ask a FUSE daemon)",
            Box::new(move |_| {
                let t = std::time::Instant::now();
                match syncing.sync_all() {
                    Ok(()) => json!({"ok": true, "secs": t.elapsed().as_secs_f64()}),
                    Err(e) => json!({"error": format!("sync: {e}")}),
                }
            }),
        );
        let u = server.unmounter();
        c.add(
            "umount",
            "unmount (lazily if busy); the daemon flushes and exits",
            Box::new(move |_| match u.unmount() {
                Ok(()) => json!({"ok": true}),
                Err(e) => json!({"error": format!("unmount: {e}")}),
            }),
        );
        c
    }
}

/// The state of a mount's background check, shared between the thread that runs it and
/// the `check-background status` requests that watch it.
#[derive(Default)]
struct CheckState {
    running: bool,
    done: u64,
    total: u64,
    /// The last check's summary (its JSON) or its one-line error.
    result: Option<std::result::Result<Value, String>>,
}

impl Commands {
    /// `check-background start|status`: runs the file system's background check
    /// (`FileSystem::check_background`, `cairn fsck --background`) on a thread of its own,
    /// so the request answers at once and the client polls the progress; one check at a
    /// time.
    pub fn add_check_background(&mut self, fs: Arc<dyn cairn_vfs::FileSystem>) {
        let state = Arc::new(parking_lot::Mutex::new(CheckState::default()));
        self.add(
            "check-background",
            "start: begin a background check (reclaims a crash's leaks on the live mount); status: its progress and summary",
            Box::new(move |args| match args.first().copied() {
                Some("start") => {
                    let mut s = state.lock();
                    if s.running {
                        return json!({"error": "a background check is already running"});
                    }
                    *s = CheckState {
                        running: true,
                        ..CheckState::default()
                    };
                    drop(s);
                    let (fs, st) = (fs.clone(), state.clone());
                    let spawned = std::thread::Builder::new()
                        .name("cairn-bgcheck".into())
                        .spawn(move || {
                            let progress = |done: u64, total: u64| {
                                let mut s = st.lock();
                                s.done = done;
                                s.total = total;
                            };
                            let r = fs.check_background(&progress);
                            let r = match r {
                                Ok(text) => serde_json::from_str::<Value>(&text)
                                    .map_err(|e| format!("bad summary: {e}")),
                                Err(e) => Err(e.to_string()),
                            };
                            let mut s = st.lock();
                            s.result = Some(r);
                            s.running = false;
                        });
                    match spawned {
                        Ok(_) => json!({"ok": true}),
                        Err(e) => {
                            state.lock().running = false;
                            json!({"error": format!("cannot start the check: {e}")})
                        }
                    }
                }
                Some("status") => {
                    let s = state.lock();
                    let mut v = json!({"running": s.running, "done": s.done, "total": s.total});
                    match &s.result {
                        Some(Ok(sum)) => v["summary"] = sum.clone(),
                        Some(Err(e)) => v["failed"] = json!(e),
                        None => {}
                    }
                    v
                }
                _ => json!({"error": "usage: check-background start|status"}),
            }),
        );
    }
}

/// A control socket bound and not yet served. A daemon binds it **before** its file system
/// appears in the mount table and serves it after: a client that sees the mount (a script,
/// `cairn stats` right after `cairn mount` returns) then always reaches this daemon —
/// its request waits in the socket's backlog until the commands are served — and never the
/// socket file a killed predecessor left behind, which refuses connections.
pub struct Listener(UnixListener);

impl Listener {
    /// Binds `path`, replacing a stale socket (the caller holds the mount point's record
    /// lock, so no live daemon owns it).
    pub fn bind(path: &Path) -> Result<Listener> {
        let _ = std::fs::remove_file(path);
        let listener =
            UnixListener::bind(path).with_context(|| format!("cannot bind {}", path.display()))?;
        // Only the owner (root, for a root-made mount) may talk to the daemon.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Listener(listener))
    }

    /// Answers connections on a background thread.
    pub fn serve(self, commands: Commands) -> Result<()> {
        let listener = self.0;
        let commands = Arc::new(commands);
        std::thread::Builder::new()
            .name("cairn-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => {
                            if let Err(e) = session(s, &commands) {
                                debug!("control connection: {e}");
                            }
                        }
                        Err(e) => warn!("control socket accept: {e}"),
                    }
                }
            })?;
        Ok(())
    }
}

fn session(s: UnixStream, commands: &Commands) -> std::io::Result<()> {
    // A client that stops talking must not hold up the next one for long.
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut out = s.try_clone()?;
    for line in BufReader::new(s).lines() {
        let reply = commands.dispatch(&line?);
        writeln!(out, "{reply}")?;
    }
    Ok(())
}

/// Sends one command to the daemon at `sock` and returns its JSON answer.
pub fn request(sock: &Path, command: &str) -> Result<Value> {
    let mut s = UnixStream::connect(sock)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    writeln!(s, "{command}")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    if line.is_empty() {
        bail!("the daemon closed the control connection without answering");
    }
    let v: Value = serde_json::from_str(&line).context("the daemon's answer is not JSON")?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("{e}");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_routes_words_and_reports_unknown_commands() {
        let mut c = Commands::default();
        c.add(
            "echo",
            "echo the arguments",
            Box::new(|a| json!({ "args": a })),
        );
        assert_eq!(c.dispatch("echo a  b"), json!({"args": ["a", "b"]}));
        assert!(c.dispatch("nope").get("error").is_some());
        assert!(c.dispatch("   ").get("error").is_some());
        assert_eq!(c.dispatch("help")["commands"]["echo"], "echo the arguments");
    }

    #[test]
    fn socket_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let mut c = Commands::default();
        c.add("stats", "counters", Box::new(|_| json!({"n": 7})));
        Listener::bind(&sock).unwrap().serve(c).unwrap();
        assert_eq!(request(&sock, "stats").unwrap()["n"], 7);
        let e = request(&sock, "frobnicate").unwrap_err().to_string();
        assert!(e.contains("unknown command"), "{e}");
    }
}
