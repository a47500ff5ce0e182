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
use std::process::Command;

use cairn_fstests::{Listed, Workdir, mode_list, pattern, say};

const FILES: usize = 100;

/// How the test asks for durability.
#[derive(Clone, Copy, Debug)]
enum Ask {
    CairnSync,
    /// Nothing (the broken variant: `CAIRN_SYNC_TEST_ASK=none`).
    Nothing,
    /// coreutils `sync MNT`: fsync of the mount's root directory.
    SyncMountpoint,
}

fn round(mode: &Listed, log_device: bool, ask: Ask) {
    let w = Workdir::new();
    w.mkdir("mnt");
    w.ok(&["mkfs", "img", "--size", "128M", "--format", &mode.format]);
    // The periodic write-back out of reach, where the format has one to set.
    let mut opts = format!("mode={}", mode.mode);
    if w.cairn(&["mount", "-o", &format!("{opts},syncer=300"), "img", "mnt"])
        .status
        .success()
    {
        w.ok(&["umount", "mnt"]);
        opts.push_str(",syncer=300");
    }
    let timer = mode.options.iter().any(|o| o == "commit_interval");
    if timer {
        opts.push_str(",commit_interval=300");
    }
    if log_device {
        w.ok(&["wal", "mkfs", "log", "--size", "16M"]);
        opts.push_str(&format!(",log=dev:{}", w.p("log").display()));
    }
    w.ok(&["mount", "-o", &opts, "img", "mnt"]);
    for i in 0..FILES {
        fs::write(
            w.p("mnt").join(format!("f{i}")),
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
            w.ok(&["sync", "mnt"]);
            "cairn sync"
        }
        Ask::SyncMountpoint => {
            let o = Command::new("sync").arg(w.p("mnt")).output().unwrap();
            assert!(o.status.success(), "{o:?}");
            "sync MNT"
        }
    };
    w.kill9("mnt");
    if mode.after_crash == "fsck" {
        let o = w.cairn(&["fsck", "-y", "img"]);
        assert!(
            matches!(o.status.code(), Some(0 | 1)),
            "{}: fsck -y after kill -9: {}{}",
            mode.mode,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    w.ok(&["mount", "-o", &opts, "img", "mnt"]);
    let mut missing = Vec::new();
    for i in 0..FILES {
        match fs::read(w.p("mnt").join(format!("f{i}"))) {
            Ok(d) if d == pattern(i as u64, 3000 + i) => {}
            Ok(_) => missing.push(format!("f{i} (contents differ)")),
            Err(e) => missing.push(format!("f{i} ({e})")),
        }
    }
    say!(
        "{}{}: {what}, kill -9, {}: {} of {FILES} files lost",
        mode.mode,
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
        mode.mode
    );
    w.ok(&["umount", "mnt"]);
}

#[test]
fn cairn_sync_makes_every_mode_durable() {
    for m in mode_list() {
        round(&m, false, Ask::CairnSync);
    }
}

#[test]
fn sync_of_the_mount_point_makes_every_mode_durable() {
    for m in mode_list() {
        round(&m, false, Ask::SyncMountpoint);
    }
}

#[test]
fn journal_with_its_log_on_a_device_of_its_own() {
    let timed = mode_list();
    for m in timed
        .iter()
        .filter(|m| m.options.iter().any(|o| o == "commit_interval"))
    {
        round(m, true, Ask::CairnSync);
        round(m, true, Ask::SyncMountpoint);
    }
}
