//! The mount's atime option in every mode (fstests' generic/003): the kernel leaves a FUSE
//! file system's access times to it, so cairn applies `relatime` (the default),
//! `strictatime` and `noatime` itself.
//!
//! Needs root and /dev/fuse.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cairn_fstests::{Workdir, mode_list, say};

fn atime(p: &Path) -> (i64, i64) {
    let m = fs::metadata(p).unwrap();
    (m.atime(), m.atime_nsec())
}

/// Sleeps past the timestamps' granularity so a new atime differs from the old one.
fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(20));
}

fn cycle(w: &Workdir, opts: &str) {
    if cairn_fstests::is_mountpoint(&w.p("mnt")) {
        w.ok(&["umount", "mnt"]);
    }
    w.ok(&["mount", "-o", opts, "img", "mnt"]);
}

#[test]
fn reads_update_access_times_as_the_mount_says() {
    for m in mode_list() {
        let w = Workdir::new();
        w.mkdir("mnt");
        w.ok(&["mkfs", "img", "--size", "64M", "--format", &m.format]);
        let mode = format!("mode={}", m.mode);
        let f = w.p("mnt").join("f");
        // relatime: the first read after a write updates it, the next does not.
        cycle(&w, &mode);
        fs::write(&f, b"data").unwrap();
        let t0 = atime(&f);
        tick();
        cycle(&w, &mode);
        fs::read(&f).unwrap();
        let t1 = atime(&f);
        assert!(
            t1 > t0,
            "{}: relatime: the first read after a write",
            m.mode
        );
        tick();
        cycle(&w, &mode);
        fs::read(&f).unwrap();
        assert_eq!(atime(&f), t1, "{}: relatime: a second read", m.mode);
        // strictatime: every read, even with the file in the page cache.
        cycle(&w, &format!("{mode},strictatime"));
        fs::read(&f).unwrap();
        let t2 = atime(&f);
        assert!(t2 > t1, "{}: strictatime: a read", m.mode);
        tick();
        fs::read(&f).unwrap();
        assert!(atime(&f) > t2, "{}: strictatime: the next read", m.mode);
        // noatime: never, even after a write.
        cycle(&w, &format!("{mode},noatime"));
        fs::write(&f, b"more").unwrap();
        let t3 = atime(&f);
        tick();
        cycle(&w, &format!("{mode},noatime"));
        fs::read(&f).unwrap();
        assert_eq!(atime(&f), t3, "{}: noatime", m.mode);
        // And what a read set survives a remount.
        cycle(&w, &mode);
        assert_eq!(atime(&f), t3, "{}: atime across a remount", m.mode);
        w.ok(&["umount", "mnt"]);
        say!(
            "{}: relatime, strictatime and noatime as the mount says",
            m.mode
        );
    }
}
