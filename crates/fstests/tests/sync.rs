//! A sync that works: sync(2) and syncfs(2) never reach a FUSE daemon on this kernel (it
//! sends FUSE_SYNCFS only to virtiofs), so cairn offers two ways a user can make a mount
//! durable, and this suite holds both to it in every mode `cairn modes` lists:
//! - `cairn sync MNT` (syncfs for the kernel's dirty pages, then the daemon's sync over the
//!   control socket);
//! - `sync MNT` (coreutils fsyncs the directory it is given: FUSE_FSYNCDIR of the root,
//!   which the adapter answers with a sync of the whole file system).
//!
//! 100 files are created and written (with the mode's periodic write-back pushed out of
//! reach: `syncer=300`, and for a journal `commit_interval=300`), one of the two syncs runs,
//! the daemon is killed with SIGKILL, and after the recovery the mode declares
//! (`after_crash` in `cairn modes --json`: fsck -y, or just mount) every file is there with
//! its contents. journal-async also runs with its log on a device of its own.
//!
//! Needs root and /dev/fuse.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};

use cairn_fstests::{cairn_bin, is_mountpoint, pattern, say};

const FILES: usize = 100;

/// One mode as `cairn modes --json` lists it.
struct Mode {
    name: String,
    format: String,
    after_crash: String,
    /// Whether the mode takes `commit_interval` (a journal with a commit timer).
    timer: bool,
}

fn modes() -> Vec<Mode> {
    let out = Command::new(cairn_bin())
        .args(["modes", "--json"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| Mode {
            name: v["mode"].as_str().unwrap().to_string(),
            format: v["type"].as_str().unwrap_or("ffs").to_string(),
            after_crash: v["after_crash"].as_str().unwrap_or("mount").to_string(),
            timer: v["options"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o["key"] == "commit_interval")),
        })
        .collect()
}

struct Setup {
    dir: tempfile::TempDir,
    opts: String,
}

impl Setup {
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn cairn(&self, args: &[&str]) -> Output {
        Command::new(cairn_bin())
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
            "cairn {args:?} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    fn mount(&self) {
        self.ok(&["mount", "-o", &self.opts, "img", "mnt"]);
    }

    fn daemon(&self) -> u32 {
        let o = self.ok(&["stats", "--json", "mnt"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["daemon"]["pid"].as_u64().unwrap() as u32
    }

    /// SIGKILL to the daemon, then the dead mount detached.
    fn kill9(&self) {
        let pid = self.daemon();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let t = std::time::Instant::now();
        while cairn_bench::sys::pid_alive(pid) {
            assert!(t.elapsed().as_secs() < 20, "the killed daemon did not go");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        nix::mount::umount2(&self.p("mnt"), nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if is_mountpoint(&self.p("mnt")) {
            let _ = self.cairn(&["umount", "mnt"]);
        }
    }
}

/// How the test asks for durability.
#[derive(Clone, Copy, Debug)]
enum Ask {
    CairnSync,
    /// Nothing (the broken variant: `CAIRN_SYNC_TEST_ASK=none`).
    Nothing,
    /// coreutils `sync MNT`: fsync of the mount's root directory.
    SyncMountpoint,
}

fn round(mode: &Mode, log_device: bool, ask: Ask) {
    let mut s = Setup {
        dir: tempfile::tempdir().unwrap(),
        opts: String::new(),
    };
    fs::create_dir(s.p("mnt")).unwrap();
    s.ok(&["mkfs", "img", "--size", "128M", "--format", &mode.format]);
    // The periodic write-back out of reach, where the format has one to set.
    let mut opts = format!("mode={}", mode.name);
    if s.cairn(&["mount", "-o", &format!("{opts},syncer=300"), "img", "mnt"])
        .status
        .success()
    {
        s.ok(&["umount", "mnt"]);
        opts.push_str(",syncer=300");
    }
    if mode.timer {
        opts.push_str(",commit_interval=300");
    }
    if log_device {
        s.ok(&["wal", "mkfs", "log", "--size", "16M"]);
        opts.push_str(&format!(",log=dev:{}", s.p("log").display()));
    }
    s.opts = opts;
    s.mount();
    for i in 0..FILES {
        fs::write(
            s.p("mnt").join(format!("f{i}")),
            pattern(i as u64, 3000 + i),
        )
        .unwrap();
    }
    // CAIRN_SYNC_TEST_ASK=none replaces the sync by nothing (a broken variant that must fail).
    let ask = match std::env::var("CAIRN_SYNC_TEST_ASK").as_deref() {
        Ok("none") => Ask::Nothing,
        _ => ask,
    };
    let what = match ask {
        Ask::Nothing => "nothing",
        Ask::CairnSync => {
            s.ok(&["sync", "mnt"]);
            "cairn sync"
        }
        Ask::SyncMountpoint => {
            let o = Command::new("sync").arg(s.p("mnt")).output().unwrap();
            assert!(o.status.success(), "{o:?}");
            "sync MNT"
        }
    };
    s.kill9();
    if mode.after_crash == "fsck" {
        let o = s.cairn(&["fsck", "-y", "img"]);
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{}: fsck -y after kill -9: {}{}",
            mode.name,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    s.mount();
    let mut missing = Vec::new();
    for i in 0..FILES {
        match fs::read(s.p("mnt").join(format!("f{i}"))) {
            Ok(d) if d == pattern(i as u64, 3000 + i) => {}
            Ok(_) => missing.push(format!("f{i} (contents differ)")),
            Err(e) => missing.push(format!("f{i} ({e})")),
        }
    }
    say!(
        "{}{}: {what}, kill -9, {}: {} of {FILES} files lost",
        mode.name,
        if log_device {
            " (log on its own device)"
        } else {
            ""
        },
        mode.after_crash,
        missing.len()
    );
    assert!(
        missing.is_empty(),
        "{} after `{what}` and kill -9: {missing:?}",
        mode.name
    );
    s.ok(&["umount", "mnt"]);
}

#[test]
fn cairn_sync_makes_every_mode_durable() {
    for m in modes() {
        round(&m, false, Ask::CairnSync);
    }
}

#[test]
fn sync_of_the_mount_point_makes_every_mode_durable() {
    for m in modes() {
        round(&m, false, Ask::SyncMountpoint);
    }
}

#[test]
fn journal_with_its_log_on_a_device_of_its_own() {
    for m in modes().iter().filter(|m| m.timer) {
        round(m, true, Ask::CairnSync);
        round(m, true, Ask::SyncMountpoint);
    }
}
