//! The mount's access-time rule through the layer (fstests' generic/003): the kernel leaves
//! a FUSE file's atime to the daemon, and the layer reads branch files as any program, so
//! it must apply `relatime`, `strictatime` and `noatime` itself rather than let every read
//! move the atime by the branch's own rule. The branch here is a tmpfs mounted
//! `strictatime` (every read it sees moves the atime): what the layer lets through is then
//! all that shows. Needs root and /dev/fuse.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

use cairn_vfs::Atime;
use common::Rig;

const ONE: &str = r#"
[[branch]]
name = "b"
path = "b"
"#;

/// (atime, ctime) of the branch file, in nanoseconds: what the branch holds, not a copy
/// the kernel may cache.
fn times(r: &Rig) -> (i128, i128) {
    let m = fs::metadata(r.b("b", "f")).unwrap();
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    (ns(m.atime(), m.atime_nsec()), ns(m.ctime(), m.ctime_nsec()))
}

/// Past the timestamps' granularity, so a new time differs from the old one.
fn tick() {
    std::thread::sleep(Duration::from_millis(20));
}

fn remount(r: &mut Rig, passthrough: bool, atime: Atime) {
    r.unmount();
    r.mount_opts(passthrough, atime);
}

#[test]
fn reads_through_the_layer_move_access_times_as_its_mount_says() {
    for passthrough in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let b = dir.path().join("b");
        fs::create_dir(&b).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16M,strictatime", "tmpfs"])
            .arg(&b)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs");
        let mut r = Rig::at(dir, vec![b], ONE);
        remount(&mut r, passthrough, Atime::Relative);
        let f = r.m("f");
        fs::write(&f, b"data").unwrap();
        let (t0, c0) = times(&r);
        // relatime: the first read after a write moves it, the next does not.
        tick();
        remount(&mut r, passthrough, Atime::Relative);
        fs::read(&f).unwrap();
        let (t1, c1) = times(&r);
        assert!(
            t1 > t0,
            "pt={passthrough}: relatime: the first read after a write"
        );
        assert_eq!(c1, c0, "pt={passthrough}: a read moved the change time");
        tick();
        fs::read(&f).unwrap();
        assert_eq!(times(&r).0, t1, "pt={passthrough}: relatime: a second read");
        // strictatime: every read.
        remount(&mut r, passthrough, Atime::Strict);
        tick();
        fs::read(&f).unwrap();
        let (t2, _) = times(&r);
        assert!(t2 > t1, "pt={passthrough}: strictatime: a read");
        tick();
        fs::read(&f).unwrap();
        let (t3, c3) = times(&r);
        assert!(t3 > t2, "pt={passthrough}: strictatime: the next read");
        assert_eq!(c3, c0, "pt={passthrough}: a read moved the change time");
        // noatime: never, not even the first read after a write, nor through the handle
        // that made a file.
        remount(&mut r, passthrough, Atime::Never);
        fs::write(&f, b"more").unwrap();
        let (t4, _) = times(&r);
        tick();
        fs::read(&f).unwrap();
        assert_eq!(times(&r).0, t4, "pt={passthrough}: noatime: a read");
        tick();
        fs::remove_file(&f).unwrap();
        let mut h = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&f)
            .unwrap();
        std::io::Write::write_all(&mut h, b"new").unwrap();
        let (t5, _) = times(&r);
        tick();
        let mut buf = Vec::new();
        std::io::Seek::seek(&mut h, std::io::SeekFrom::Start(0)).unwrap();
        std::io::Read::read_to_end(&mut h, &mut buf).unwrap();
        drop(h);
        assert_eq!(buf, b"new");
        assert_eq!(
            times(&r).0,
            t5,
            "pt={passthrough}: noatime: a read through the creating handle"
        );
    }
}
