//! The fstests run's watchdog (`scripts/fstests/watchdog.sh`): a test past its deadline is
//! killed with everything it started, recorded, and the mounts it used are cut off (their
//! daemons killed, the mounts detached), so the run goes on; tests that end in time are left
//! alone, however often one ends between two of the watchdog's looks.
//!
//! Runs the script itself against a fake suite: `tests/generic/901` waits on a cairn mount
//! whose daemon is stopped (a daemon that stopped answering: what held generic/069 and the
//! run behind it), `tests/generic/902` ends at once and is started over and over meanwhile.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cairn_fstests::{Workdir, host_only, is_mountpoint, say, workspace_root};

fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

fn script(path: &Path, body: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, format!("#!/bin/bash\n{body}\n")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Polls `ok` until it holds or `secs` pass.
fn within(secs: u64, mut ok: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ok()
}

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_test_past_its_deadline_is_killed_recorded_and_its_mount_cut_off() {
    if host_only() {
        return;
    }
    let w = Workdir::new();
    w.mkdir("mnt");
    w.ok(&["mkfs", "img", "--size", "64M"]);
    // Over /dev/fuse: a request the kernel gave an io_uring queue of a stopped daemon is
    // past the point where a kill ends the caller, and this kernel (6.18) then never
    // finishes it, not even once the daemon is killed and the connection aborted (the
    // caller stays in D state; dmesg: "ent-req-queue ... state=3").
    w.ok(&["mount", "-o", "transport=dev", "img", "mnt"]);
    let mnt = w.p("mnt").canonicalize().unwrap();
    let daemon = w.daemon("mnt");
    let suite = w.p("suite").canonicalize().unwrap_or_else(|_| {
        fs::create_dir_all(w.p("suite")).unwrap();
        w.p("suite").canonicalize().unwrap()
    });
    let hung = suite.join("tests/generic/901");
    let quick = suite.join("tests/generic/902");
    // A child that outlives its parent unless the whole tree is killed, then a stat that
    // waits on the daemon.
    script(
        &hung,
        &format!(
            "sleep 600 &\necho $! >{}/child\nstat {} >/dev/null\nwait",
            suite.display(),
            mnt.join("x").display()
        ),
    );
    script(&quick, "exit 0");
    let record = suite.join("timeouts.txt");

    let watchdog = Reaped(
        Command::new("bash")
            .arg(workspace_root().join("scripts/fstests/watchdog.sh"))
            .env("WATCHDOG_LIMIT", "2")
            .env("WATCHDOG_INTERVAL", "0.2")
            .env(
                "WATCHDOG_MATCH",
                format!("^/bin/bash {}/tests/[a-z]+/[0-9]+$", suite.display()),
            )
            .env("WATCHDOG_NS_PID", std::process::id().to_string())
            .env("WATCHDOG_MOUNTS", mnt.as_os_str())
            .env("WATCHDOG_PIDS", w.runtime())
            .env("WATCHDOG_RECORD", &record)
            .spawn()
            .expect("start watchdog.sh"),
    );

    // Quick tests, each ending between two looks now and then: none may be recorded, and
    // none may end the watchdog.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(4) {
        let s = Command::new("/bin/bash").arg(&quick).status().unwrap();
        assert!(s.success());
    }
    assert!(
        !record.exists(),
        "tests that ended in time were recorded: {}",
        fs::read_to_string(&record).unwrap_or_default()
    );

    // The daemon stops answering; the test waits on it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let mut test = Command::new("/bin/bash").arg(&hung).spawn().unwrap();
    let test_pid = test.id();
    assert!(
        within(10, || suite.join("child").exists()),
        "the fake test did not start"
    );
    let child: u32 = fs::read_to_string(suite.join("child"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let done = within(40, || {
        let _ = test.try_wait();
        !alive(test_pid) && !alive(child) && !alive(daemon) && !is_mountpoint(&mnt)
    });
    let _ = test.try_wait();
    let report = format!(
        "after the deadline: test alive {}, its child alive {}, daemon alive {}, still mounted {}",
        alive(test_pid),
        alive(child),
        alive(daemon),
        is_mountpoint(&mnt)
    );
    if !done {
        // Whatever the watchdog left goes before the verdict, so a failing run leaves
        // nothing behind (the daemon first: the fake test waits on it).
        let _ = Command::new("kill")
            .args(["-KILL", &daemon.to_string(), &child.to_string()])
            .arg(test_pid.to_string())
            .status();
        let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH);
        let _ = test.wait();
    }
    let rec = fs::read_to_string(&record).unwrap_or_default();
    say!("timeouts.txt: {rec:?}");
    assert!(done, "{report}");
    assert!(
        rec.lines()
            .any(|l| l.starts_with("generic/901 timed out after ")),
        "the timeout was not recorded: {rec:?}"
    );
    assert!(
        !rec.contains("generic/902"),
        "a quick test was recorded: {rec:?}"
    );
    drop(watchdog);
}

/// A test named in WATCHDOG_SLOW gets its multiple of the limit (generic/748, slow on every
/// target): one running past the plain limit but within its own is left alone, while the
/// same test without the entry is killed and recorded.
#[test]
fn a_slow_test_gets_its_multiple_of_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().canonicalize().unwrap();
    let slow = suite.join("tests/generic/903");
    script(&slow, "sleep 4");
    for (entry, killed) in [("generic/903=5", false), ("generic/904=5", true)] {
        let record = suite.join(format!("timeouts-{killed}.txt"));
        let _watchdog = Reaped(
            Command::new("bash")
                .arg(workspace_root().join("scripts/fstests/watchdog.sh"))
                .env("WATCHDOG_LIMIT", "1")
                .env("WATCHDOG_INTERVAL", "0.2")
                .env("WATCHDOG_SLOW", format!("generic/001=2 {entry}"))
                .env(
                    "WATCHDOG_MATCH",
                    format!("^/bin/bash {}/tests/[a-z]+/[0-9]+$", suite.display()),
                )
                .env("WATCHDOG_NS_PID", std::process::id().to_string())
                .env("WATCHDOG_MOUNTS", "")
                .env("WATCHDOG_PIDS", suite.as_os_str())
                .env("WATCHDOG_RECORD", &record)
                .spawn()
                .expect("start watchdog.sh"),
        );
        let s = Command::new("/bin/bash").arg(&slow).status().unwrap();
        let recorded = fs::read_to_string(&record).unwrap_or_default();
        assert_eq!(
            (s.success(), recorded.contains("generic/903 timed out")),
            (!killed, killed),
            "WATCHDOG_SLOW={entry}: exit {s}, recorded {recorded:?}"
        );
    }
    say!("a test named in WATCHDOG_SLOW runs past the plain limit");
}
