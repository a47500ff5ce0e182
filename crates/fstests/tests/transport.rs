//! The FUSE transport as a user of `cairn` sees it: `-o transport=`, what `cairn stats` and
//! the mount log report, the fallback when the kernel refuses io_uring, and a daemon killed
//! with requests in flight on every queue, cleaned up by `cairn umount`.
//!
//! The io_uring cases need root and a kernel with FUSE over io_uring; elsewhere they print
//! why and pass. The fallback case turns the kernel's `enable_uring` parameter off only
//! around its own mounts (it only changes what mounts made meanwhile are offered) and puts
//! it back at once, holding the lock file every io_uring mount of these suites takes
//! ([`cairn_fstests::URING_PARAMETER_LOCK`]), so no such mount, in this process or
//! another, is caught by it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_fstests::{
    ParamOff, cairn_bin, is_mountpoint, run, say, uring_parameter_lock, uring_usable,
};
use serde_json::Value;

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh image and mount point in a temporary directory.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("cairn-transport-")
            .tempdir()
            .unwrap();
        let o = run(Command::new(cairn_bin())
            .arg("mkfs")
            .arg(dir.path().join("img"))
            .args(["--size", "128M"]));
        assert!(o.status.success(), "mkfs: {o:?}");
        fs::create_dir(dir.path().join("mnt")).unwrap();
        Scratch { dir }
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    /// `cairn mount -o mode=sync,transport=T,logfile=...`: (success, stderr).
    fn mount(&self, transport: &str) -> (bool, String) {
        let _lock = (transport != "dev").then(|| uring_parameter_lock(false));
        self.mount_unlocked(transport)
    }

    fn mount_unlocked(&self, transport: &str) -> (bool, String) {
        let o = run(Command::new(cairn_bin())
            .arg("mount")
            .arg("-o")
            .arg(format!(
                "mode=sync,transport={transport},logfile={}",
                self.log().display()
            ))
            .arg(self.dir.path().join("img"))
            .arg(self.mnt()));
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    fn stats(&self) -> Value {
        let o = run(Command::new(cairn_bin())
            .args(["stats", "--json"])
            .arg(self.mnt()));
        assert!(o.status.success(), "cairn stats: {o:?}");
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn umount(&self) {
        let o = run(Command::new(cairn_bin()).arg("umount").arg(self.mnt()));
        assert!(o.status.success(), "cairn umount: {o:?}");
        assert!(!is_mountpoint(&self.mnt()));
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if is_mountpoint(&self.mnt()) {
            let _ = Command::new("umount").arg("-l").arg(self.mnt()).status();
        }
    }
}

fn uring_or_skip() -> bool {
    match uring_usable() {
        Ok(()) => true,
        Err(why) => {
            say!("skipped: {why}");
            false
        }
    }
}

#[test]
fn stats_and_the_mount_log_report_the_transport() {
    let _s = serial();
    let mut cases = vec![("dev", "dev")];
    if uring_or_skip() {
        cases.push(("uring", "uring"));
        cases.push(("auto", "uring"));
    }
    for (asked, expected) in cases {
        let s = Scratch::new();
        let (ok, err) = s.mount(asked);
        assert!(ok, "mount -o transport={asked}: {err}");
        for i in 0..50 {
            fs::write(s.mnt().join(format!("f{i}")), b"x").unwrap();
        }
        let v = s.stats();
        let t = &v["fuse"]["transport"];
        say!("transport={asked}: {t}");
        assert_eq!(t["requested"], asked, "{t}");
        assert_eq!(t["active"], expected, "{t}");
        let uring = t["uring_requests"].as_u64().unwrap();
        if expected == "uring" {
            assert!(uring >= 100, "{t}");
            // The default `uring_depth`.
            assert_eq!(t["depth"], 2, "{t}");
        } else {
            assert_eq!(uring, 0, "{t}");
        }
        s.umount();
        let log = fs::read_to_string(s.log()).unwrap();
        let want = if expected == "uring" {
            "FUSE transport: io_uring"
        } else {
            "FUSE transport: /dev/fuse"
        };
        assert!(log.contains(want), "the log does not say '{want}':\n{log}");
    }
}

/// With the kernel parameter off, `transport=uring` (and `auto`) still mount, over
/// /dev/fuse, with one line in the mount log saying why (a warning for `uring`, which asked
/// for io_uring by name) and nothing on the terminal; `cairn stats` shows what serves.
#[test]
fn with_the_parameter_off_uring_and_auto_fall_back_with_one_log_line() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let (u, a) = (Scratch::new(), Scratch::new());
    let (u_res, a_res) = {
        let _off = ParamOff::new().expect("turn the parameter off");
        (u.mount_unlocked("uring"), a.mount_unlocked("auto"))
    };
    for (s, asked, (ok, err)) in [(&u, "uring", u_res), (&a, "auto", a_res)] {
        assert!(ok, "transport={asked} must mount over /dev/fuse: {err}");
        assert!(err.trim().is_empty(), "transport={asked}: said {err}");
        let t = s.stats()["fuse"]["transport"].clone();
        say!("parameter off, transport={asked}: {t}");
        assert_eq!(t["requested"], asked, "{t}");
        assert_eq!(t["active"], "dev", "{t}");
        assert!(
            t["reason"].as_str().unwrap_or("").contains("enable_uring"),
            "{t}"
        );
        fs::write(s.mnt().join("x"), b"1").unwrap();
        assert_eq!(fs::read(s.mnt().join("x")).unwrap(), b"1");
        s.umount();
        let log = fs::read_to_string(s.log()).unwrap();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("FUSE transport:"))
            .collect();
        assert_eq!(lines.len(), 1, "{log}");
        assert!(
            lines[0].contains("/dev/fuse (") && lines[0].contains("enable_uring"),
            "{}",
            lines[0]
        );
        if asked == "uring" {
            assert!(
                lines[0].contains("WARN") && lines[0].contains("transport=uring"),
                "{}",
                lines[0]
            );
        }
    }
}

fn daemon_pid(mnt: &Path) -> Option<i32> {
    let want = mnt.as_os_str().as_encoded_bytes().to_vec();
    fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != std::process::id() as i32)
        .find(|p| {
            fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let a: Vec<&[u8]> = c.split(|&b| b == 0).collect();
                a.contains(&want.as_slice()) && a.iter().any(|x| x.ends_with(b"cairn"))
            })
        })
}

#[test]
fn a_daemon_killed_with_requests_in_flight_leaves_a_mount_cairn_umount_cleans() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let s = Scratch::new();
    let (ok, err) = s.mount("uring");
    assert!(ok, "{err}");
    let pid = daemon_pid(&s.mnt()).expect("the daemon's pid");
    // Two writers per CPU, each pinned to it, so every queue has requests in flight
    // (sync mode: each create waits for the device).
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut writers = Vec::new();
    for cpu in 0..cpus {
        for k in 0..3 {
            let (dir, stop) = (s.mnt(), stop.clone());
            writers.push(std::thread::spawn(move || {
                let mut set = nix::sched::CpuSet::new();
                set.set(cpu).unwrap();
                let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    if fs::write(dir.join(format!("w{cpu}-{k}-{i}")), [7u8; 3000]).is_err() {
                        break;
                    }
                    i += 1;
                }
            }));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    say!("SIGKILL to daemon {pid} under load");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    stop.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    for w in writers {
        w.join().unwrap();
    }
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "writers hung after the kill"
    );
    let t0 = Instant::now();
    s.umount();
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "cairn umount took {:?}",
        t0.elapsed()
    );
}

/// Clients pinned to every CPU, three each (one more than a queue's default two ring
/// entries), looking up fresh names in `dir` (every stat a LOOKUP round trip, so every
/// entry of every queue keeps a request in flight) until `stop`; errors are expected once
/// the mount goes away.
fn lookup_clients(dir: PathBuf, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<u64>> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut v = Vec::new();
    for cpu in 0..cpus {
        for k in 0..3 {
            let (dir, stop) = (dir.clone(), stop.clone());
            v.push(std::thread::spawn(move || {
                let mut set = nix::sched::CpuSet::new();
                set.set(cpu).unwrap();
                let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let _ = fs::metadata(dir.join(format!("c{cpu}-{k}-{i}")));
                    i += 1;
                }
                i
            }));
        }
    }
    v
}

/// `cairn umount --lazy` while clients on every CPU keep every queue busy (a plain umount(2)
/// is EBUSY while a path walk is inside the mount: that is the kernel's rule, not a hang):
/// the mount is detached at once, the daemon finishes the requests in flight, flushes and
/// exits within a bounded time, and the image is clean, over each transport.
#[test]
fn cairn_umount_under_load_completes() {
    let _s = serial();
    let mut cases = vec!["dev"];
    if uring_or_skip() {
        cases.push("uring");
    }
    for t in cases {
        let s = Scratch::new();
        let (ok, err) = s.mount(t);
        assert!(ok, "{err}");
        assert_eq!(s.stats()["fuse"]["transport"]["active"], t);
        fs::write(s.mnt().join("kept"), b"still here").unwrap();
        let pid = daemon_pid(&s.mnt()).expect("the daemon's pid");
        let stop = Arc::new(AtomicBool::new(false));
        let clients = lookup_clients(s.mnt(), stop.clone());
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        let o = run(Command::new(cairn_bin())
            .args(["umount", "--lazy"])
            .arg(s.mnt()));
        assert!(o.status.success(), "{t}: cairn umount --lazy: {o:?}");
        assert!(!is_mountpoint(&s.mnt()));
        let gone = || {
            fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| st.contains(") Z "))
        };
        while !gone() && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        say!(
            "{t}: daemon gone {:?} after cairn umount under load",
            t0.elapsed()
        );
        stop.store(true, Ordering::SeqCst);
        let n: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
        assert!(n > 0, "{t}: the clients never ran");
        assert!(
            gone(),
            "{t}: the daemon {pid} still runs 30 s after the unmount"
        );
        let o = run(Command::new(cairn_bin())
            .arg("fsck")
            .arg(s.dir.path().join("img")));
        assert!(
            o.status.success(),
            "{t}: fsck after umount under load: {o:?}"
        );
        let (ok, err) = s.mount("dev");
        assert!(ok, "{err}");
        assert_eq!(fs::read(s.mnt().join("kept")).unwrap(), b"still here");
        s.umount();
    }
}
