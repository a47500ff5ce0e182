//! The transports under stress: which one serves a mount, and teardown with requests in
//! flight on every queue, by unmount, by forced abort and by the daemon's death.
//!
//! Needs root and /dev/fuse (as `mount.rs`). The io_uring cases turn the kernel's
//! `enable_uring` parameter on if it is off (it only changes what new mounts are offered),
//! and are skipped with a message on a kernel without it.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cairn_fuse::memfs::MemFs;
use cairn_fuse::{FuseOptions, Transport};
use nix::mount::{MntFlags, umount2};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

/// The tests here run one at a time: one of them turns the kernel parameter off, which
/// must not catch another's io_uring mount, and the load tests want the CPUs to themselves.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn uring_available() -> bool {
    let p = cairn_fuse::URING_PARAMETER;
    match fs::read_to_string(p) {
        Ok(v) if v.trim() == "Y" => true,
        Ok(_) if nix::unistd::geteuid().is_root() => fs::write(p, "Y").is_ok(),
        Ok(_) => {
            eprintln!("skipped: {p} is off and only root may turn it on");
            false
        }
        Err(e) => {
            eprintln!("skipped: this kernel has no FUSE over io_uring ({p}: {e})");
            false
        }
    }
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn opts(t: Transport) -> FuseOptions {
    FuseOptions {
        transport: t,
        ..Default::default()
    }
}

fn is_mountpoint(p: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = p.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(p))
}

/// Runs `f` on another thread and fails the test if it has not returned within `limit`
/// (a teardown that hangs in the kernel must fail the test, not hang the suite).
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

/// Clients per CPU in the load tests: one more than a queue has ring entries (the default
/// `uring_depth`, 2), so every entry of every queue is busy and requests wait in the kernel.
const CLIENTS_PER_CPU: usize = 3;

/// `CLIENTS_PER_CPU` clients per CPU, each pinned to its CPU, stat-ing fresh names in `dir`
/// (every stat a lookup, so every queue gets requests) until `stop`.
fn start_clients(dir: PathBuf, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    start_clients_on(dir, stop, 0..cpus(), CLIENTS_PER_CPU)
}

/// `per_cpu` clients pinned to each CPU of `cpus`, as [`start_clients`].
fn start_clients_on(
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    cpus: std::ops::Range<usize>,
    per_cpu: usize,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut v = Vec::new();
    for cpu in cpus {
        for k in 0..per_cpu {
            let (dir, stop) = (dir.clone(), stop.clone());
            v.push(std::thread::spawn(move || {
                let mut set = CpuSet::new();
                set.set(cpu).unwrap();
                let _ = sched_setaffinity(Pid::from_raw(0), &set);
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    // Errors are expected once the mount goes away.
                    let _ = fs::metadata(dir.join(format!("c{cpu}-{k}-{i}")));
                    i += 1;
                }
            }));
        }
    }
    v
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn transports() -> Vec<Transport> {
    let mut v = vec![Transport::Dev];
    if uring_available() {
        v.push(Transport::Uring);
    }
    v
}

/// How many requests the server works on at once: one per ring entry of every queue over
/// io_uring, one per thread over /dev/fuse.
fn servers(t: Transport, o: &FuseOptions) -> u64 {
    match t {
        Transport::Uring => (cpus() * o.uring_depth) as u64,
        _ => o.threads as u64,
    }
}

/// A memory file system mounted over transport `t` (in a temporary directory, returned to
/// live as long as the mount), twenty files written and read back through it.
fn served_mount(t: Transport) -> (tempfile::TempDir, cairn_fuse::MountHandle) {
    let fs = Arc::new(MemFs::default());
    let dir = tempfile::tempdir().unwrap();
    let h = cairn_fuse::spawn(fs, dir.path(), &opts(t)).unwrap();
    for i in 0..20 {
        let p = dir.path().join(format!("f{i}"));
        fs::write(&p, b"x").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"x");
    }
    (dir, h)
}

#[test]
fn the_chosen_transport_serves_and_is_reported() {
    let _serial = serial();
    for t in transports() {
        let (_dir, h) = served_mount(t);
        let c = h.counts();
        let report = c.transport().expect("transport settled at mount").clone();
        let (uring, dev) = c.by_transport();
        let j = c.to_json();
        match t {
            Transport::Uring => {
                assert_eq!(report.active, "uring", "{report:?}");
                assert_eq!(report.requested, "uring");
                assert!(report.queues >= 1);
                assert_eq!(report.depth, FuseOptions::default().uring_depth);
                assert!(uring > 40, "only {uring} requests over io_uring");
                // Only forgets (and interrupts) may use /dev/fuse.
                assert!(
                    dev <= c.get(cairn_fuse::Op::Forget),
                    "{dev} requests over /dev/fuse"
                );
                assert_eq!(j["transport"]["active"], "uring");
            }
            _ => {
                assert_eq!(report.active, "dev");
                assert_eq!(uring, 0);
                assert!(dev > 40);
                assert_eq!(j["transport"]["active"], "dev");
            }
        }
        h.unmount().unwrap();
    }
}

/// Unmount while every queue (every /dev/fuse thread) is inside a slow request and clients
/// keep sending more: the mount is detached, the requests in flight finish, and unmount
/// returns with the final flush done.
#[test]
fn unmount_under_load_completes() {
    let _serial = serial();
    for t in transports() {
        let fs = Arc::new(MemFs::default());
        fs.slow_lookups(Duration::from_millis(30));
        let dir = tempfile::tempdir().unwrap();
        let o = opts(t);
        let h = cairn_fuse::spawn(fs.clone(), dir.path(), &o).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let clients = start_clients(dir.path().to_path_buf(), stop.clone());
        let busy = servers(t, &o);
        wait_for("every queue busy", Duration::from_secs(20), || {
            fs.lookups_running() >= busy
        });
        within("unmount under load", Duration::from_secs(60), move || {
            h.unmount()
        })
        .unwrap();
        stop.store(true, Ordering::SeqCst);
        within("clients", Duration::from_secs(30), move || {
            for c in clients {
                c.join().unwrap();
            }
        });
        assert_eq!(fs.destroy_count(), 1, "{t:?}: final flush");
        assert!(!fs.destroyed_mid_request(), "{t:?}: flushed mid-request");
        assert!(!is_mountpoint(dir.path()));
    }
}

/// Requests issued on one CPU are served as many at a time as its queue has ring entries:
/// clients pinned to CPU 0, each blocked in a slow lookup, are all inside the file system
/// at once (with only the queue's first entry served, one would be, and the rest would wait
/// in the kernel for its commit). Then the mount unmounts with every entry busy.
#[test]
fn every_ring_entry_of_a_queue_serves() {
    let _serial = serial();
    if !uring_available() {
        return;
    }
    let depth = 3;
    let fs = Arc::new(MemFs::default());
    fs.slow_lookups(Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let o = FuseOptions {
        uring_depth: depth,
        ..opts(Transport::Uring)
    };
    let h = cairn_fuse::spawn(fs.clone(), dir.path(), &o).unwrap();
    let report = h.counts().transport().unwrap().clone();
    assert_eq!(
        (report.active, report.depth),
        ("uring", depth),
        "{report:?}"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let clients = start_clients_on(dir.path().to_path_buf(), stop.clone(), 0..1, depth + 1);
    let t0 = Instant::now();
    let mut most = 0;
    while most < depth as u64 && t0.elapsed() < Duration::from_secs(20) {
        most = most.max(fs.lookups_running());
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::SeqCst);
    within(
        "unmount with every entry busy",
        Duration::from_secs(60),
        move || h.unmount(),
    )
    .unwrap();
    within("clients", Duration::from_secs(30), move || {
        for c in clients {
            c.join().unwrap();
        }
    });
    assert_eq!(
        most, depth as u64,
        "requests from one CPU in the file system at once (uring_depth={depth})"
    );
    assert_eq!(fs.destroy_count(), 1);
    assert!(!fs.destroyed_mid_request());
}

/// Every ring entry's thread runs only on its queue's CPU: a lone client's requests
/// alternate between the entries of its CPU's queue, so an entry served from another CPU
/// would make every other request a cross-CPU wake-up (docs/FUSE.md).
#[test]
fn every_entry_thread_is_pinned_to_its_queue_cpu() {
    let _serial = serial();
    if !uring_available() {
        return;
    }
    // The threads are pinned only where the daemon may run.
    let mine = nix::sched::sched_getaffinity(Pid::from_raw(0)).unwrap();
    if (0..cpus()).any(|c| !mine.is_set(c).unwrap_or(false)) {
        eprintln!("skipped: this process may not run on every CPU");
        return;
    }
    let fs = Arc::new(MemFs::default());
    let dir = tempfile::tempdir().unwrap();
    let h = cairn_fuse::spawn(fs, dir.path(), &opts(Transport::Uring)).unwrap();
    let report = h.counts().transport().unwrap().clone();
    assert_eq!(report.active, "uring", "{report:?}");
    let mut seen = 0;
    for t in fs::read_dir("/proc/self/task").unwrap() {
        let t = t.unwrap().path();
        let comm = fs::read_to_string(t.join("comm")).unwrap_or_default();
        // "cairn-uring-Q.S": queue Q, entry S.
        let Some(qs) = comm.trim().strip_prefix("cairn-uring-") else {
            continue;
        };
        let q = qs.split('.').next().unwrap();
        let status = fs::read_to_string(t.join("status")).unwrap();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
        assert_eq!(
            allowed, q,
            "thread cairn-uring-{qs} may run on CPUs {allowed}"
        );
        seen += 1;
    }
    assert_eq!(seen, report.queues * report.depth, "{report:?}");
    h.unmount().unwrap();
}

/// The connection aborted (`umount -f`) while every queue holds a request in the file
/// system: the answers are refused, the queue threads still leave, the final flush runs,
/// and the dead mount unmounts without hanging.
#[test]
fn forced_abort_with_requests_in_flight() {
    let _serial = serial();
    for t in transports() {
        let fs = Arc::new(MemFs::default());
        fs.slow_lookups(Duration::from_millis(200));
        let dir = tempfile::tempdir().unwrap();
        let o = opts(t);
        let h = cairn_fuse::spawn(fs.clone(), dir.path(), &o).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let clients = start_clients(dir.path().to_path_buf(), stop.clone());
        let busy = servers(t, &o);
        wait_for("every queue busy", Duration::from_secs(20), || {
            fs.lookups_running() >= busy
        });
        // MNT_FORCE makes FUSE abort the connection (fuse_umount_begin) at once.
        let _ = umount2(dir.path(), MntFlags::MNT_FORCE);
        stop.store(true, Ordering::SeqCst);
        within(
            "clients after the abort",
            Duration::from_secs(30),
            move || {
                for c in clients {
                    c.join().unwrap();
                }
            },
        );
        within(
            "session end after the abort",
            Duration::from_secs(30),
            move || h.unmount(),
        )
        .unwrap();
        assert_eq!(fs.destroy_count(), 1, "{t:?}: final flush");
        assert!(
            !fs.destroyed_mid_request(),
            "{t:?}: the final flush ran while a request was still in the file system"
        );
        let p = dir.path().to_path_buf();
        within(
            "unmounting the dead mount",
            Duration::from_secs(30),
            move || {
                if is_mountpoint(&p) {
                    umount2(&p, MntFlags::MNT_DETACH).unwrap();
                }
            },
        );
        assert!(!is_mountpoint(dir.path()));
    }
}

/// The daemon process half of `killed_daemon_leaves_a_mount_that_unmounts`: mounts a slow
/// file system at `$CAIRN_TRANSPORT_CHILD`, says so on stdout, and serves until killed. In
/// an ordinary test run (no variable) it does nothing.
#[test]
fn child_daemon() {
    let Some(dir) = std::env::var_os("CAIRN_TRANSPORT_CHILD") else {
        return;
    };
    let t = match std::env::var("CAIRN_TRANSPORT_KIND").as_deref() {
        Ok("uring") => Transport::Uring,
        _ => Transport::Dev,
    };
    let fs = Arc::new(MemFs::default());
    fs.slow_lookups(Duration::from_millis(100));
    let h = cairn_fuse::spawn(fs, Path::new(&dir), &opts(t)).unwrap();
    println!("ready");
    loop {
        std::thread::sleep(Duration::from_secs(60));
        let _ = &h;
    }
}

/// kill -9 of a daemon while every queue holds a request in the file system and more wait
/// in the kernel: the clients get errors instead of hanging, and the dead mount unmounts.
#[test]
fn killed_daemon_leaves_a_mount_that_unmounts() {
    let _serial = serial();
    for t in transports() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_daemon", "--nocapture", "--test-threads=1"])
            .env("CAIRN_TRANSPORT_CHILD", dir.path())
            .env("CAIRN_TRANSPORT_KIND", t.name())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // (libtest prints "test child_daemon ... " before the test's own output.)
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(lines.any(|l| l.is_ok_and(|l| l.trim().ends_with("ready"))));
        });
        if rx.recv_timeout(Duration::from_secs(30)) != Ok(true) {
            let _ = child.kill();
            let _ = umount2(dir.path(), MntFlags::MNT_DETACH);
            panic!("the child daemon did not mount");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let clients = start_clients(dir.path().to_path_buf(), stop.clone());
        // Lookups take 100 ms and every CPU has one client more than its queue has entries:
        // after 300 ms every entry is inside one and the others wait in the kernel.
        std::thread::sleep(Duration::from_millis(300));
        child.kill().unwrap();
        child.wait().unwrap();
        stop.store(true, Ordering::SeqCst);
        within(
            "clients of the dead daemon",
            Duration::from_secs(30),
            move || {
                for c in clients {
                    c.join().unwrap();
                }
            },
        );
        let p = dir.path().to_path_buf();
        within(
            "unmounting the dead mount",
            Duration::from_secs(30),
            move || {
                // What `cairn umount` does: umount(2), lazily if something still holds it.
                match umount2(&p, MntFlags::empty()) {
                    Ok(()) => {}
                    Err(nix::errno::Errno::EBUSY) => umount2(&p, MntFlags::MNT_DETACH).unwrap(),
                    Err(e) => panic!("umount: {e}"),
                }
            },
        );
        assert!(!is_mountpoint(dir.path()), "{t:?}");
    }
}

/// With the kernel parameter off, `auto` and `uring` both mount over /dev/fuse and say why
/// in the one transport line (a warning when io_uring was asked for by name). The parameter
/// is put back at once: it only matters to mounts made while it is off.
#[test]
fn without_the_kernel_parameter_both_fall_back_to_dev() {
    let _serial = serial();
    if !uring_available() {
        return;
    }
    let fs = Arc::new(MemFs::default());
    let (dir, dir2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (auto, uring) = {
        let _off = ParamOff::new();
        (
            cairn_fuse::spawn(fs.clone(), dir.path(), &opts(Transport::Auto)),
            cairn_fuse::spawn(fs, dir2.path(), &opts(Transport::Uring)),
        )
    };
    for (h, d, asked) in [(auto, &dir, "auto"), (uring, &dir2, "uring")] {
        let h = h.unwrap_or_else(|e| panic!("transport={asked} must mount over /dev/fuse: {e}"));
        let r = h.counts().transport().unwrap().clone();
        assert_eq!(r.active, "dev", "{r:?}");
        assert_eq!(r.requested, asked);
        let why = r.reason.clone().unwrap_or_default();
        assert!(why.contains("enable_uring"), "reason: {why}");
        assert_eq!(why.contains("transport=uring"), asked == "uring", "{why}");
        assert!(
            r.line().starts_with("FUSE transport: /dev/fuse (") && !r.line().contains('\n'),
            "{}",
            r.line()
        );
        fs::write(d.path().join("a"), b"1").unwrap();
        assert_eq!(fs::read(d.path().join("a")).unwrap(), b"1");
        assert_eq!(h.counts().by_transport().0, 0);
        h.unmount().unwrap();
        assert!(!is_mountpoint(d.path()));
    }
}

/// Turns the parameter off for the life of the guard and puts back what it was, holding
/// the lock file the cairn suites (crates/fstests) take shared around their io_uring mounts,
/// so none of them is made while it is off.
struct ParamOff {
    before: String,
    _lock: Option<nix::fcntl::Flock<fs::File>>,
}

impl ParamOff {
    fn new() -> ParamOff {
        use nix::fcntl::{Flock, FlockArg};
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/tmp/cairn-enable-uring.lock")
            .ok()
            .and_then(|f| Flock::lock(f, FlockArg::LockExclusive).ok());
        let p = cairn_fuse::URING_PARAMETER;
        let before = fs::read_to_string(p).unwrap().trim().to_string();
        fs::write(p, "N").unwrap();
        ParamOff {
            before,
            _lock: lock,
        }
    }
}

impl Drop for ParamOff {
    fn drop(&mut self) {
        let _ = fs::write(cairn_fuse::URING_PARAMETER, &self.before);
    }
}

/// The threads of this process whose scheduler slice is a call thread's
/// (`cairn_vfs::sched::CALL_SLICE_NS`), by name; `None` where the kernel shows no slices.
fn call_slice_threads() -> Option<Vec<String>> {
    cairn_vfs::sched::thread_slice()?;
    let mut v = Vec::new();
    for t in fs::read_dir("/proc/self/task").unwrap().flatten() {
        let sched = fs::read_to_string(t.path().join("sched")).unwrap_or_default();
        if cairn_vfs::sched::slice_in(&sched) == Some(cairn_vfs::sched::CALL_SLICE_NS) {
            v.push(
                fs::read_to_string(t.path().join("comm"))
                    .unwrap_or_default()
                    .trim()
                    .into(),
            );
        }
    }
    Some(v)
}

/// Every thread that serves requests asks for a call thread's short scheduler slice (so a
/// request woken while a background thread of the file system runs preempts it at once):
/// after requests over either transport, the serving threads have it — over io_uring every
/// queue thread that served, over /dev/fuse at least one of fuser's threads — and no other
/// thread of the test does.
#[test]
fn serving_threads_ask_for_a_call_thread_s_slice() {
    let _serial = serial();
    let Some(before) = call_slice_threads() else {
        eprintln!("skipped: this kernel shows no scheduler slices");
        return;
    };
    assert!(
        before.is_empty(),
        "threads with the slice before any mount: {before:?}"
    );
    for t in transports() {
        let (_dir, h) = served_mount(t);
        let with = call_slice_threads().unwrap();
        h.unmount().unwrap();
        assert!(
            !with.is_empty(),
            "{t:?}: no serving thread has the call slice"
        );
        // fuser names its /dev/fuse threads, cairn its queue threads.
        let serving = if t == Transport::Uring {
            "cairn-uring-"
        } else {
            "fuser-"
        };
        assert!(
            with.iter().all(|n| n.starts_with(serving)),
            "{t:?}: threads with the call slice {with:?}"
        );
    }
}
