//! The runtime record of a mount: how `cairn umount` and `cairn stats` find the daemon.
//!
//! For a mount point `/mnt/data` the daemon keeps, in the runtime directory
//! (`/run/cairn` for root, `$XDG_RUNTIME_DIR/cairn` or `/tmp/cairn-UID` otherwise,
//! `$CAIRN_RUNTIME_DIR` if set):
//!
//! - `mnt-data.pid`: pid, image and mount point, one per line. The daemon holds an exclusive
//!   flock on it for its whole life, so "wait until the daemon is gone" is "take the lock"
//!   (no polling, no pid-reuse races), and a second daemon for the same mount point is
//!   refused.
//! - `mnt-data.sock`: the control socket (see `control`).
//! - `mnt-data.log`: the daemon's log (kept after exit).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::fcntl::{Flock, FlockArg};

pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CAIRN_RUNTIME_DIR") {
        return PathBuf::from(d);
    }
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return PathBuf::from("/run/cairn");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("cairn"),
        None => PathBuf::from(format!("/tmp/cairn-{uid}")),
    }
}

/// A file name for a mount point: `/` becomes `-`, bytes other than `[A-Za-z0-9._]` become
/// `%XX`; over-long names are cut and suffixed with a hash of the whole path.
pub fn escape(mountpoint: &Path) -> String {
    let bytes = mountpoint.as_os_str().as_bytes();
    let trimmed = bytes.strip_prefix(b"/").unwrap_or(bytes);
    let mut s = String::new();
    for &b in trimmed {
        match b {
            b'/' => s.push('-'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' => s.push(b as char),
            _ => s.push_str(&format!("%{b:02X}")),
        }
    }
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '-');
    }
    shorten(s, bytes, 200)
}

/// Cuts `s` to at most `max` bytes (at least 17), keeping it distinct by suffixing a hash of
/// the whole mount point path (FNV-1a: stable across builds, unlike std's hasher).
fn shorten(mut s: String, path: &[u8], max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let h = path.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    // The escaped name is ASCII, so any byte index is a char boundary.
    s.truncate(max.max(17) - 17);
    s.push_str(&format!("~{h:016x}"));
    s
}

/// A Unix socket's path must fit `sun_path`: 108 bytes with its terminating NUL.
const SOCKET_PATH_MAX: usize = 107;

/// The canonical form of a mount point as the daemon records it. A dead FUSE mount cannot be
/// stat'ed (ENOTCONN), so only its parent is resolved.
pub fn canonical_mountpoint(p: &Path) -> Result<PathBuf> {
    if let Ok(c) = p.canonicalize() {
        return Ok(c);
    }
    let abs = std::path::absolute(p).with_context(|| format!("bad path {}", p.display()))?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent
            .canonicalize()
            .unwrap_or(parent.to_path_buf())
            .join(name)),
        _ => Ok(abs),
    }
}

pub struct Paths {
    pub pid: PathBuf,
    pub sock: PathBuf,
    pub log: PathBuf,
}

pub fn paths(mountpoint: &Path) -> Paths {
    paths_in(&runtime_dir(), mountpoint)
}

fn paths_in(dir: &Path, mountpoint: &Path) -> Paths {
    // A deep runtime directory plus a long mount point would make the control socket's path
    // too long to bind (the daemon would run unreachable by `cairn stats`/`umount`): the name
    // is cut to fit, hash-suffixed, the same way by daemon and client.
    let room = SOCKET_PATH_MAX.saturating_sub(dir.as_os_str().len() + "/".len() + ".sock".len());
    let base = shorten(escape(mountpoint), mountpoint.as_os_str().as_bytes(), room);
    Paths {
        pid: dir.join(format!("{base}.pid")),
        sock: dir.join(format!("{base}.sock")),
        log: dir.join(format!("{base}.log")),
    }
}

/// The daemon's claim on a mount point, held until the process exits.
pub struct Record {
    lock: Flock<File>,
    pub paths: Paths,
}

/// Whether process `pid` is on its way out: gone, a zombie or dead, or with SIGKILL pending
/// for the whole thread group (its threads are still closing their files).
fn exiting(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the last ')' (the command name may itself contain one).
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    if matches!(state, Some('Z' | 'X' | 'x')) {
        return true;
    }
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("ShdPnd:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|mask| mask & SIGKILL_BIT != 0)
    })
}

impl Record {
    /// Takes the pid-file lock for `mountpoint`, refusing if a live daemon holds it.
    pub fn claim(mountpoint: &Path) -> Result<Record> {
        Record::claim_in(&runtime_dir(), mountpoint)
    }

    fn claim_in(dir: &Path, mountpoint: &Path) -> Result<Record> {
        let paths = paths_in(dir, mountpoint);
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let patience = Instant::now() + Duration::from_secs(5);
        loop {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&paths.pid)
                .with_context(|| format!("cannot create {}", paths.pid.display()))?;
            let lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(l) => l,
                Err((mut f, _)) => {
                    let mut who = String::new();
                    let _ = f.read_to_string(&mut who);
                    let pid = who.lines().next().unwrap_or("?").to_string();
                    // A daemon killed a moment ago still holds the lock until its last thread
                    // has closed its files (the group leader shows as a zombie before that):
                    // wait for it rather than refuse a remount that will be valid in
                    // milliseconds. A live daemon is refused at once.
                    if pid.parse().is_ok_and(exiting) && Instant::now() < patience {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    bail!(
                        "{} is already served by a cairn daemon (pid {pid})",
                        mountpoint.display()
                    );
                }
            };
            // A daemon that just exited removes its pid file while still holding the lock;
            // if we locked that unlinked file, start over with the new one.
            let same = std::fs::metadata(&paths.pid)
                .is_ok_and(|m| m.ino() == lock.metadata().map(|l| l.ino()).unwrap_or(0));
            if same {
                lock.set_len(0)?;
                return Ok(Record { lock, paths });
            }
        }
    }

    pub fn write_info(&mut self, image: &Path, mountpoint: &Path) -> Result<()> {
        let text = format!(
            "{}\n{}\n{}\n",
            std::process::id(),
            image.display(),
            mountpoint.display()
        );
        self.lock.set_len(0)?;
        (&*self.lock).write_all(text.as_bytes())?;
        Ok(())
    }

    /// Removes the pid file and the socket (the lock goes with the process).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.paths.sock);
        let _ = std::fs::remove_file(&self.paths.pid);
    }
}

/// A claim dropped without serving (a mount that failed) leaves no pid file or socket.
impl Drop for Record {
    fn drop(&mut self) {
        self.remove();
    }
}

/// How many daemon logs the runtime directory keeps: those of live daemons plus this many
/// of the most recent others.
pub const KEEP_LOGS: usize = 8;

/// Deletes the logs of all but the `keep` most recently written finished mounts in `dir`
/// (a log whose pid file still exists belongs to a live daemon and is kept).
pub fn prune_logs(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut finished: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter(|p| !p.with_extension("pid").exists())
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    finished.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, p) in finished.into_iter().skip(keep) {
        let _ = std::fs::remove_file(p);
    }
}

/// Opens the pid file of the daemon serving `mountpoint`, if there is one.
pub fn open_record(mountpoint: &Path) -> Option<File> {
    File::open(paths(mountpoint).pid).ok()
}

/// Blocks until the daemon that owns this pid file has exited.
pub fn wait_for_exit(mut f: File) -> Result<()> {
    let mut text = String::new();
    let _ = f.read_to_string(&mut text);
    let pid: Option<u32> = text.lines().next().and_then(|l| l.trim().parse().ok());
    // The daemon holds the pid file's lock until its final flush is done. The flush of a
    // large cache to a slow device may take long, so there is no deadline here, but a
    // wait that goes on says what it waits for, where to look and how to leave it.
    let started = std::time::Instant::now();
    let mut told = false;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match Flock::lock(f.try_clone()?, FlockArg::LockSharedNonblock) {
            Ok(_) => break,
            Err((_, nix::errno::Errno::EWOULDBLOCK | nix::errno::Errno::EINTR)) => {}
            Err((_, e)) => bail!("waiting for the daemon: {e}"),
        }
        if !told && started.elapsed() >= std::time::Duration::from_secs(10) {
            told = true;
            eprintln!(
                "cairn: waiting for the daemon{} to finish its final flush (its log tells \
                 how far it is; interrupting this wait leaves the daemon running)",
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            );
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
    // The lock is released when the exiting daemon's main thread closes the pid file; its
    // other threads (and the image lock held by the file table they share) may still be
    // exiting: wait until the last thread is gone, so "returned" means "the image is free".
    if let Some(pid) = pid.filter(|&p| p != std::process::id()) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while cairn_bench::sys::pid_alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_fit_sun_path_under_a_deep_runtime_directory() {
        let dir = Path::new("/tmp/cairn-test.89PTj9/run");
        let a = Path::new(
            "/var/tmp/cairn-bench-test.xbRkmu/cairn-bench.18017.01ec2fccf/cairn-async/mnt",
        );
        let b = Path::new(
            "/var/tmp/cairn-bench-test.xbRkmu/cairn-bench.18017.01ec2fccf/cairn-sync/mnt",
        );
        let (pa, pb) = (paths_in(dir, a), paths_in(dir, b));
        assert!(
            pa.sock.as_os_str().len() <= SOCKET_PATH_MAX,
            "{}",
            pa.sock.display()
        );
        assert_ne!(pa.sock, pb.sock);
        assert_eq!(pa.sock, paths_in(dir, a).sock);
        // Short paths keep their readable name.
        let short = paths_in(dir, Path::new("/mnt/data"));
        assert_eq!(short.sock, dir.join("mnt-data.sock"));
        // And the socket binds.
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("a".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let p = paths_in(&deep, a);
        std::os::unix::net::UnixListener::bind(&p.sock).unwrap();
    }

    #[test]
    fn escaping_is_flat_and_distinct() {
        assert_eq!(escape(Path::new("/mnt/data")), "mnt-data");
        assert_eq!(escape(Path::new("/")), "-");
        assert_eq!(escape(Path::new("/a b/é")), "a%20b-%C3%A9");
        assert_eq!(escape(Path::new("/.hidden")), "-.hidden");
        assert_ne!(escape(Path::new("/a-b")), escape(Path::new("/a/b")));
        let long = format!("/{}", "x".repeat(500));
        let e = escape(Path::new(&long));
        assert!(e.len() < 255);
        assert_ne!(e, escape(Path::new(&format!("{long}y"))));
    }

    #[test]
    fn only_a_dying_holder_is_waited_for() {
        assert!(
            !exiting(std::process::id()),
            "a live process is not exiting"
        );
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        assert!(!exiting(child.id()));
        child.kill().unwrap();
        // Until reaped, the killed child is a zombie (or still has SIGKILL pending).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !exiting(child.id()) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(exiting(child.id()), "a killed child counts as exiting");
        child.wait().unwrap();
        assert!(exiting(child.id()), "a reaped child is gone");
    }

    #[test]
    fn a_second_claim_is_refused_and_waiters_wake_on_release() {
        let dir = tempfile::tempdir().unwrap();
        let mp = Path::new("/some/mount");
        let mut r = Record::claim_in(dir.path(), mp).unwrap();
        r.write_info(Path::new("/img"), mp).unwrap();
        let err = Record::claim_in(dir.path(), mp).err().unwrap().to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        let f = File::open(&r.paths.pid).unwrap();
        let text = std::fs::read_to_string(&r.paths.pid).unwrap();
        assert_eq!(
            text.lines().next(),
            Some(std::process::id().to_string().as_str())
        );
        let waiter = std::thread::spawn(move || wait_for_exit(f));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "waiting must block while the daemon holds the lock"
        );
        r.remove();
        drop(r);
        waiter.join().unwrap().unwrap();
    }

    #[test]
    fn a_dropped_claim_leaves_nothing_and_old_logs_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let r = Record::claim_in(dir.path(), Path::new("/m")).unwrap();
        let pid = r.paths.pid.clone();
        assert!(pid.exists());
        drop(r);
        assert!(!pid.exists(), "a failed mount left its pid file");
        for i in 0..12 {
            let p = dir.path().join(format!("m{i}.log"));
            std::fs::write(&p, "x").unwrap();
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        // m0 is the oldest but belongs to a live daemon.
        std::fs::write(dir.path().join("m0.pid"), "1").unwrap();
        prune_logs(dir.path(), 3);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".log"))
            .collect();
        left.sort();
        assert_eq!(left, ["m0.log", "m10.log", "m11.log", "m9.log"]);
    }
}
