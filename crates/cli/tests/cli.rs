//! The `cairn` command end to end: argument errors, the mount daemon's life cycle
//! (ready on return, umount waits, SIGTERM), stats, and the mount(8) helper.
//!
//! Mount tests need root and /dev/fuse (CI runs as root). Each test has its own runtime
//! directory (CAIRN_RUNTIME_DIR), so they run in parallel without seeing each other.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("mnt")).unwrap();
        Env { dir }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn mnt(&self) -> PathBuf {
        self.p("mnt")
    }

    fn cairn(&self, args: &[&str]) -> Output {
        Command::new(CAIRN)
            .args(args)
            .env("CAIRN_RUNTIME_DIR", self.p("run"))
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> Output {
        let o = self.cairn(args);
        assert!(
            o.status.success(),
            "cairn {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    /// A fresh 64 MiB image named `disk.img`.
    fn image(&self) -> &Self {
        self.ok(&["mkfs", "disk.img", "--size", "64M"]);
        self
    }

    fn mounted(&self) -> bool {
        let m = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mp = self.mnt().canonicalize().unwrap_or(self.mnt());
        m.lines()
            .any(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
    }

    /// The crash: the daemon killed (SIGKILL) and its dead mount detached.
    fn crash(&self) {
        let pid = self.daemon_pid();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        wait_until("the daemon to die", || !alive(pid));
        let _ = nix::mount::umount2(&self.mnt(), nix::mount::MntFlags::MNT_DETACH);
    }

    fn daemon_pid(&self) -> i32 {
        let dir = self.p("run");
        let pidfile = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "pid"))
            .expect("a pid file in the runtime directory");
        fs::read_to_string(pidfile)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }
}

impl Drop for Env {
    /// Detaches every mount left under this test's directory (a failed assertion must not
    /// leave mounts behind for the next test to trip over).
    fn drop(&mut self) {
        let root = self
            .dir
            .path()
            .canonicalize()
            .unwrap_or(self.dir.path().into());
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|p| p.starts_with(&root))
            .collect();
        under.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for p in under {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Alive, or still exiting with its files (and image lock) open: see `pid_alive`.
fn alive(pid: i32) -> bool {
    cairn_blockdev::lock::pid_alive(pid as u32)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn argument_errors_exit_nonzero_with_a_message() {
    let e = Env::new();
    assert_eq!(e.cairn(&[]).status.code(), Some(2));
    assert_eq!(e.cairn(&["mount", "only-one"]).status.code(), Some(2));
    assert_eq!(e.cairn(&["frobnicate"]).status.code(), Some(2));
    e.image();
    let o = e.cairn(&["mount", "-o", "mode=turbo", "disk.img", "mnt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("cairn: unknown mode 'turbo'"),
        "{}",
        stderr(&o)
    );
    let o = e.cairn(&["mount", "disk.img", "no-such-dir"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no-such-dir"), "{}", stderr(&o));
    let o = e.cairn(&["stats", "mnt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no cairn daemon"), "{}", stderr(&o));
    let o = e.cairn(&["umount", "mnt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not mounted"), "{}", stderr(&o));
    assert!(!e.mounted());
}

/// A reader that goes away ends a printing command quietly, as any Unix filter: no panic
/// message (`cairn modes --json | head -1` printed one, exit 101, before).
#[test]
fn a_closed_pipe_ends_a_printing_command_without_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(CAIRN)
        .args(["modes", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the command writes.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        o.status.success() || o.status.signal() == Some(libc::SIGPIPE),
        "{:?}: {err}",
        o.status
    );
}

#[test]
fn a_bad_image_is_one_clear_line_and_exit_1() {
    let e = Env::new();
    fs::write(e.p("bad.img"), vec![0x5a; 1 << 20]).unwrap();
    let o = e.cairn(&["mount", "bad.img", "mnt"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("cairn: cannot mount bad.img: "), "{err}");
    assert!(!e.mounted());
}

#[test]
fn mount_returns_when_ready_and_umount_waits_for_the_flush() {
    let e = Env::new();
    e.image();
    e.ok(&["mount", "-o", "mode=async,syncer=3600", "disk.img", "mnt"]);
    // Ready means: in mountinfo and serving, the moment the command returns.
    assert!(e.mounted());
    let pid = e.daemon_pid();
    assert!(alive(pid));
    fs::write(e.mnt().join("kept"), b"async data, flushed only at unmount").unwrap();
    e.ok(&["umount", "mnt"]);
    // umount returned: the daemon has flushed and exited already.
    assert!(!alive(pid), "umount returned before the daemon exited");
    assert!(!e.mounted());
    e.ok(&["mount", "disk.img", "mnt"]);
    assert_eq!(
        fs::read(e.mnt().join("kept")).unwrap(),
        b"async data, flushed only at unmount"
    );
    e.ok(&["umount", "mnt"]);
}

#[test]
fn sigterm_flushes_and_unmounts() {
    let e = Env::new();
    e.image();
    e.ok(&["mount", "-o", "mode=async", "disk.img", "mnt"]);
    fs::create_dir(e.mnt().join("d")).unwrap();
    fs::write(e.mnt().join("d/f"), b"survives SIGTERM").unwrap();
    let pid = e.daemon_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_until("the daemon to exit", || !alive(pid));
    assert!(!e.mounted());
    assert!(
        !e.p("run").read_dir().unwrap().any(|f| f
            .unwrap()
            .path()
            .extension()
            .is_some_and(|x| x == "sock"))
    );
    e.ok(&["mount", "disk.img", "mnt"]);
    assert_eq!(fs::read(e.mnt().join("d/f")).unwrap(), b"survives SIGTERM");
    e.ok(&["umount", "mnt"]);
}

/// A copy of the mount in another mount namespace keeps the kernel's file system alive after
/// the unmount here, so SIGTERM cannot end the session: the daemon says so in its log, naming
/// the connection to abort, instead of waiting in silence, and exits once the copy is gone.
#[test]
fn sigterm_names_the_way_out_when_another_namespace_holds_the_mount() {
    let e = Env::new();
    e.image();
    e.ok(&["mount", "-o", "mode=async", "disk.img", "mnt"]);
    fs::write(e.mnt().join("f"), b"kept").unwrap();
    let pid = e.daemon_pid();
    // `private`: the unmount below does not reach the copy.
    let mut holder = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "echo ready; read x",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "ready\n");
    nix::mount::umount2(&e.mnt(), nix::mount::MntFlags::empty()).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let log = || {
        fs::read_dir(e.p("run"))
            .unwrap()
            .map(|f| f.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .map(|p| fs::read_to_string(p).unwrap_or_default())
            .collect::<String>()
    };
    wait_until("the daemon to say who holds the mount", || {
        log().contains("still holds the file system")
    });
    let l = log();
    assert!(
        l.contains("/sys/fs/fuse/connections/") && l.contains("/abort`"),
        "{l}"
    );
    assert!(
        alive(pid),
        "the daemon serves the other namespace meanwhile"
    );
    drop(holder.stdin.take());
    holder.wait().unwrap();
    wait_until("the daemon to exit once the copy is gone", || !alive(pid));
    e.ok(&["mount", "disk.img", "mnt"]);
    assert_eq!(fs::read(e.mnt().join("f")).unwrap(), b"kept");
    e.ok(&["umount", "mnt"]);
}

/// `-o writeback_cache=yes`: the kernel's page cache takes write(2) in a mode whose calls are
/// durable on fsync — 64 writes of 4 KiB in random order over 256 KiB (less than the mount's
/// dirty limit, 1 MiB on this image) reach the daemon as a few large WRITE requests at fsync,
/// where without the option each is a request of its own —
/// and a mode that makes every call durable on return refuses it, naming the way out.
#[test]
fn writeback_cache_yes_buffers_writes_where_the_mode_allows_it() {
    use std::os::unix::fs::FileExt;
    let writes = |opts: &str| -> u64 {
        let e = Env::new();
        e.image();
        e.ok(&["mount", "-o", opts, "disk.img", "mnt"]);
        let f = fs::File::create(e.mnt().join("f")).unwrap();
        let mut order: Vec<u64> = (0..64).collect();
        // A fixed shuffle: every block once, never two neighbours in a row.
        order.sort_by_key(|i| (i * 37) % 64);
        for i in order {
            f.write_all_at(&[i as u8; 4096], i * 4096).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);
        let o = e.ok(&["stats", "--json", "mnt"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        e.ok(&["umount", "mnt"]);
        e.ok(&["mount", "disk.img", "mnt"]);
        let got = fs::read(e.mnt().join("f")).unwrap();
        assert!(
            got.chunks(4096)
                .enumerate()
                .all(|(i, c)| c.iter().all(|&b| b == i as u8)),
            "{opts}: the file differs after a remount"
        );
        e.ok(&["umount", "mnt"]);
        v["fuse"]["requests"]["write"].as_u64().unwrap()
    };
    let plain = writes("mode=async");
    let cached = writes("mode=async,writeback_cache=yes");
    assert!(plain >= 64, "without the option: {plain} WRITE requests");
    assert!(
        cached <= 16,
        "with writeback_cache=yes: {cached} WRITE requests"
    );
    let e = Env::new();
    e.image();
    let o = e.cairn(&[
        "mount",
        "-o",
        "mode=sync,writeback_cache=yes",
        "disk.img",
        "mnt",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("writeback_cache=yes") && stderr(&o).contains("cairn modes"),
        "{}",
        stderr(&o)
    );
    assert!(!e.mounted());
}

#[test]
fn stats_answers_in_json_and_text() {
    let e = Env::new();
    e.image();
    e.ok(&["mount", "disk.img", "mnt"]);
    for i in 0..10 {
        fs::write(e.mnt().join(format!("f{i}")), b"x").unwrap();
    }
    let o = e.ok(&["stats", "--json", "mnt"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        v["fuse"]["requests"]["create"].as_u64().unwrap() >= 10,
        "{v}"
    );
    assert!(v["fuse"]["total"].as_u64().unwrap() > 10);
    assert!(
        v["fs"].is_object(),
        "the fs's own counters are included: {v}"
    );
    assert_eq!(v["daemon"]["pid"].as_i64().unwrap() as i32, e.daemon_pid());
    let o = e.ok(&["stats", "mnt"]);
    let text = String::from_utf8(o.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("fuse.requests.create "))
        .expect(&text);
    assert!(
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 10
    );
    e.ok(&["umount", "mnt"]);
}

#[test]
fn a_second_mount_on_the_same_point_is_refused() {
    let e = Env::new();
    e.image();
    e.ok(&["mount", "disk.img", "mnt"]);
    let o = e.cairn(&["mount", "disk.img", "mnt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("already served"), "{}", stderr(&o));
    e.ok(&["umount", "mnt"]);
}

#[test]
fn foreground_mount_serves_until_unmounted() {
    let e = Env::new();
    e.image();
    let mut child = Command::new(CAIRN)
        .args(["mount", "-f", "disk.img", "mnt"])
        .env("CAIRN_RUNTIME_DIR", e.p("run"))
        .current_dir(e.dir.path())
        .spawn()
        .unwrap();
    wait_until("the foreground mount", || e.mounted());
    fs::write(e.mnt().join("fg"), b"1").unwrap();
    e.ok(&["umount", "mnt"]);
    assert!(child.wait().unwrap().success());
}

/// `mount -t cairn` and `umount` through the helpers, inside a private mount namespace in
/// which /usr/sbin (where /sbin points) is an overlay: the helpers are installed there and
/// vanish with the namespace, so the test never touches the machine's /sbin.
#[test]
fn mount_dash_t_cairn_and_umount_work_through_the_helpers() {
    let e = Env::new();
    e.image();
    let had_helper = Path::new("/sbin/mount.cairn").exists();
    let script = r#""$CAIRN" install-helper --lib-dir lib
test "$(readlink /sbin/mount.cairn)" = "$PWD/lib/cairn"
mount -t cairn -o mode=async,noatime,nofail disk.img mnt
grep -q " $PWD/mnt .* - fuse.cairn " /proc/self/mountinfo
echo helper > mnt/h
umount mnt
! grep -q " $PWD/mnt .* - fuse.cairn " /proc/self/mountinfo
"#;
    common::in_private_sbin(script, e.dir.path(), &e.p("run"));
    assert_eq!(
        Path::new("/sbin/mount.cairn").exists(),
        had_helper,
        "the machine's /sbin was changed"
    );
    // umount.fuse.cairn waited for the daemon's final flush: the file is on the image.
    e.ok(&["mount", "disk.img", "mnt"]);
    assert_eq!(fs::read(e.mnt().join("h")).unwrap(), b"helper\n");
    e.ok(&["umount", "mnt"]);
}

#[test]
fn record_option_writes_a_crash_recording_that_cairn_crash_checks() {
    let e = Env::new();
    e.image();
    e.ok(&["mount", "-o", "record=trace.jsonl", "disk.img", "mnt"]);
    fs::create_dir(e.mnt().join("d")).unwrap();
    fs::write(e.mnt().join("d/t"), vec![1u8; 100_000]).unwrap();
    fs::rename(e.mnt().join("d/t"), e.mnt().join("u")).unwrap();
    e.ok(&["umount", "mnt"]);
    assert!(
        e.p("trace.jsonl.base").exists(),
        "the base image is kept beside the recording"
    );
    let text = fs::read_to_string(e.p("trace.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["mode"], "sync", "{}", lines[0]);
    assert!(
        lines.iter().any(|v| v["t"] == "w" && v["d"].is_string()),
        "writes carry contents"
    );
    assert!(
        lines.iter().any(|v| v["t"] == "f"),
        "the final flush is recorded"
    );
    assert!(
        lines.iter().any(|v| v["t"] == "b"
            && v["op"]["kind"] == "rename"
            && v["op"]["from"] == "d/t"
            && v["op"]["to"] == "u"),
        "operation markers name paths"
    );
    assert!(lines.iter().any(|v| v["t"] == "e"), "and mark the return");
    // Exit 0 (expectations met) or 1 (a finding): both mean the recording was checked.
    let o = e.cairn(&[
        "crash",
        "run",
        "--recording",
        "trace.jsonl",
        "--states",
        "200",
        "--threads",
        "1",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("mount:") && out.contains("states in"), "{out}");
}

#[test]
fn memory_backend_mounts_without_an_image() {
    let e = Env::new();
    e.ok(&["mount", "--memory", "scratch", "mnt"]);
    fs::write(e.mnt().join("m"), b"in memory").unwrap();
    assert_eq!(fs::read(e.mnt().join("m")).unwrap(), b"in memory");
    let o = e.ok(&["stats", "--json", "mnt"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["daemon"]["image"], "scratch");
    assert!(v["fs"]["inodes"].as_u64().unwrap() >= 2, "{v}");
    e.ok(&["umount", "mnt"]);
    assert!(!e.mounted());
}

/// Issue: two read-write mounts of one image both succeeded and destroyed it. The image lock
/// refuses the second, naming the first; read-only mounts may share.
#[test]
fn one_image_is_mounted_read_write_only_once() {
    let e = Env::new();
    e.image();
    fs::create_dir(e.p("mnt2")).unwrap();
    e.ok(&["mount", "-o", "mode=async", "disk.img", "mnt"]);
    let first = e.mnt().canonicalize().unwrap();
    // A second mount point in another mode is refused, naming the mount that holds the
    // image (in its mode, it is served by the same daemon: crates/fstests/tests/remount.rs).
    for opts in ["rw,mode=sync", "ro,mode=softdep"] {
        let o = e.cairn(&["mount", "-o", opts, "disk.img", "mnt2"]);
        assert_eq!(o.status.code(), Some(1), "-o {opts}: {}", stderr(&o));
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("mount on {} (read-write", first.display())),
            "the message must name the mount holding the image: {err}"
        );
    }
    fs::write(e.mnt().join("f"), b"kept").unwrap();
    e.ok(&["umount", "mnt"]);
    // Read-only mounts share the image; a read-write one is refused while they hold it.
    e.ok(&["mount", "-o", "ro", "disk.img", "mnt"]);
    e.ok(&["mount", "-o", "ro", "disk.img", "mnt2"]);
    assert_eq!(fs::read(e.p("mnt2/f")).unwrap(), b"kept");
    fs::create_dir(e.p("mnt3")).unwrap();
    let o = e.cairn(&["mount", "disk.img", "mnt3"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
    e.ok(&["umount", "mnt2"]);
    e.ok(&["umount", "mnt"]);
}

/// Issue: `fsck -y` repaired a mounted image into a corrupt one. fsck refuses a live image
/// (exit 8, one line), `--force` checks it read-only and says the findings may be stale,
/// and a repair is refused even under a read-only mount.
#[test]
fn fsck_refuses_a_mounted_image() {
    let e = Env::new();
    e.image();
    e.ok(&["mount", "disk.img", "mnt"]);
    fs::write(e.mnt().join("f"), vec![7u8; 50_000]).unwrap();
    let before = fs::read(e.p("disk.img")).unwrap();
    for args in [&["fsck", "disk.img"][..], &["fsck", "-y", "disk.img"][..]] {
        let o = e.cairn(args);
        assert_eq!(o.status.code(), Some(8), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
        assert!(stderr(&o).contains("in use by"), "{}", stderr(&o));
    }
    assert!(
        fs::read(e.p("disk.img")).unwrap() == before,
        "fsck wrote to a live image"
    );
    let o = e.cairn(&["fsck", "--force", "disk.img"]);
    assert!(
        matches!(o.status.code(), Some(0) | Some(4)),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("may be stale"), "{}", stderr(&o));
    assert_ne!(
        e.cairn(&["fsck", "--force", "-y", "disk.img"])
            .status
            .code(),
        Some(0)
    );
    // inspect never writes: it shows a live image, with a warning.
    let o = e.cairn(&["inspect", "disk.img", "superblock"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("may be stale"), "{}", stderr(&o));
    e.ok(&["umount", "mnt"]);
    e.ok(&["mount", "-o", "ro", "disk.img", "mnt"]);
    e.ok(&["fsck", "disk.img"]);
    let o = e.cairn(&["fsck", "-y", "disk.img"]);
    assert_eq!(o.status.code(), Some(8), "{}", stderr(&o));
    assert!(stderr(&o).contains("refusing to repair"), "{}", stderr(&o));
    e.ok(&["umount", "mnt"]);
    e.ok(&["fsck", "-y", "disk.img"]);
}

/// Issue: mkfs replaced a text file and reformatted an image under its running daemon.
#[test]
fn mkfs_refuses_mounted_images_and_existing_data() {
    let e = Env::new();
    e.image();
    // An existing cairn file system: refused without --force, named.
    let o = e.cairn(&["mkfs", "disk.img", "--size", "64M"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("already holds a cairn file system (64 MiB)"),
        "{}",
        stderr(&o)
    );
    // Mounted: refused even with --force, and the image is untouched.
    e.ok(&["mount", "disk.img", "mnt"]);
    fs::write(e.mnt().join("f"), b"live").unwrap();
    let o = e.cairn(&["mkfs", "-F", "disk.img", "--size", "32M"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("in use by the cairn mount"),
        "{}",
        stderr(&o)
    );
    assert_eq!(fs::metadata(e.p("disk.img")).unwrap().len(), 64 << 20);
    e.ok(&["umount", "mnt"]);
    e.ok(&["fsck", "disk.img"]);
    e.ok(&["mount", "disk.img", "mnt"]);
    assert_eq!(fs::read(e.mnt().join("f")).unwrap(), b"live");
    e.ok(&["umount", "mnt"]);
    e.ok(&["mkfs", "--force", "disk.img", "--size", "32M"]);
    // A text file and foreign signatures are data.
    fs::write(e.p("notes.txt"), b"my notes\n").unwrap();
    let o = e.cairn(&["mkfs", "notes.txt", "--size", "8M"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("already holds text"), "{}", stderr(&o));
    assert_eq!(fs::read(e.p("notes.txt")).unwrap(), b"my notes\n");
    let mut ext = vec![0u8; 2 << 20];
    ext[1080] = 0x53;
    ext[1081] = 0xEF;
    fs::write(e.p("ext.img"), &ext).unwrap();
    let o = e.cairn(&["mkfs", "ext.img"]);
    assert!(stderr(&o).contains("ext2/ext3/ext4"), "{}", stderr(&o));
    // An all-zero image is free to use.
    fs::write(e.p("zero.img"), vec![0u8; 8 << 20]).unwrap();
    e.ok(&["mkfs", "zero.img"]);
    // Too small: the message says the minimum, and no file is left behind.
    let o = e.cairn(&["mkfs", "tiny.img", "--size", "16K"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("below the minimum of"),
        "{}",
        stderr(&o)
    );
    assert!(!e.p("tiny.img").exists());
}

/// An image larger than the host's free space is refused unless --sparse says it may be.
#[test]
fn mkfs_refuses_an_image_larger_than_the_free_space_unless_sparse() {
    let e = Env::new();
    let small = e.p("small");
    fs::create_dir(&small).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &small,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=4m"),
    )
    .unwrap();
    let o = e.cairn(&["mkfs", "small/big.img", "--size", "64M"]);
    let err = stderr(&o);
    let sparse = e.cairn(&["mkfs", "small/big.img", "--size", "64M", "--sparse"]);
    let _ = nix::mount::umount2(&small, nix::mount::MntFlags::MNT_DETACH);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--sparse"), "{err}");
    assert!(sparse.status.success(), "{}", stderr(&sparse));
}

/// A file that is not a cairn image is named as such, not as a corrupt file system.
#[test]
fn mounting_a_foreign_file_says_not_a_cairn_file_system() {
    let e = Env::new();
    fs::write(e.p("zeros.img"), vec![0u8; 1 << 20]).unwrap();
    let o = e.cairn(&["mount", "zeros.img", "mnt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not a cairn file system") && !stderr(&o).contains("corrupt"),
        "{}",
        stderr(&o)
    );
    // A failed mount leaves no pid file, socket or log behind.
    let left: Vec<_> = fs::read_dir(e.p("run"))
        .map(|d| d.flatten().map(|x| x.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// An image a crash left behind (its daemon killed) is not mounted read-write until fsck has
/// repaired it, in a mode that needs fsck after a crash; read-only and `-o force` still work.
#[test]
fn an_image_left_by_a_crash_needs_fsck_before_a_read_write_mount() {
    let e = Env::new();
    e.image();
    e.ok(&["mount", "-o", "mode=async", "disk.img", "mnt"]);
    fs::write(e.mnt().join("f"), b"data").unwrap();
    e.crash();
    let o = e.cairn(&["mount", "disk.img", "mnt"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("not unmounted cleanly") && err.contains("cairn fsck -y"),
        "{err}"
    );
    e.ok(&["mount", "-o", "ro", "disk.img", "mnt"]);
    e.ok(&["umount", "mnt"]);
    let o = e.cairn(&["fsck", "-y", "disk.img"]);
    assert!(
        matches!(o.status.code(), Some(0) | Some(1)),
        "{}",
        stderr(&o)
    );
    e.ok(&["mount", "disk.img", "mnt"]);
    e.ok(&["umount", "mnt"]);
}

/// A read-only mount of an image a journaled mount (commit=sync) left by a crash shows what
/// the log made durable, in any mode: the default mode (sync) has no log of its own, and
/// read the home locations alone, which the syncer had not yet written. The log is replayed
/// in memory (nothing written: the image is unchanged); a read-write mount in the journal's
/// mode replays it onto the disk.
#[test]
fn a_read_only_mount_of_a_crashed_journal_shows_what_its_log_made_durable() {
    let e = Env::new();
    e.image();
    // No syncer pass before the crash: the calls are in the log only.
    e.ok(&["mount", "-o", "mode=journal,syncer=3600", "disk.img", "mnt"]);
    use std::io::Write as _;
    fs::create_dir(e.mnt().join("d")).unwrap();
    let mut f = fs::File::create(e.mnt().join("d/f")).unwrap();
    f.write_all(b"logged").unwrap();
    f.sync_all().unwrap();
    drop(f);
    e.crash();
    let crashed = fs::read(e.p("disk.img")).unwrap();
    for opts in ["ro", "ro,mode=softdep", "ro,mode=journal"] {
        e.ok(&["mount", "-o", opts, "disk.img", "mnt"]);
        let seen = fs::read(e.mnt().join("d/f"));
        e.ok(&["umount", "mnt"]);
        assert_eq!(
            seen.as_deref().ok(),
            Some(&b"logged"[..]),
            "-o {opts}: the read-only mount shows the file system without the logged calls"
        );
        assert!(
            fs::read(e.p("disk.img")).unwrap() == crashed,
            "-o {opts}: a read-only mount wrote"
        );
    }
    e.ok(&["mount", "-o", "mode=journal", "disk.img", "mnt"]);
    assert_eq!(fs::read(e.mnt().join("d/f")).unwrap(), b"logged");
    e.ok(&["umount", "mnt"]);
}
