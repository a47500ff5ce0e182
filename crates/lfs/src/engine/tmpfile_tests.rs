//! O_TMPFILE in the log: an unnamed file that a link may name (and that then survives a
//! remount and a crash once fsynced), freed at its last close otherwise, and freed by the
//! next read-write mount after a crash while it is open, whether roll-forward or the
//! checkpoint's orphan list finds it.

use std::ffi::OsStr;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_vfs::{Ctx, Errno, FileSystem};

use super::tests::{image, mount};
use super::*;
use crate::check::{CheckReport, check_device};

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn data() -> Vec<u8> {
    (0..60_000u32).map(|i| (i * 13 + 1) as u8).collect()
}

fn check(dev: &Arc<MemDevice>) -> CheckReport {
    check_device(dev.clone() as Arc<dyn BlockDevice>).unwrap()
}

/// Unmounted, and clean to the check with no orphan left.
fn unmount_clean(fs: Arc<Lfs>, dev: &Arc<MemDevice>) {
    fs.destroy().unwrap();
    drop(fs);
    let r = check(dev);
    assert!(r.is_clean() && r.pending_orphans == 0, "{r:?}");
}

fn crashed(dev: &Arc<MemDevice>) -> Arc<MemDevice> {
    Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, dev.to_bytes()))
}

#[test]
fn a_tmpfile_linked_keeps_its_data_across_a_remount() {
    let dev = image(2048);
    let fs = mount(&dev);
    let c = Ctx::root();
    let (a, fh) = fs
        .tmpfile(&c, ROOT_INO, 0o640, 0o022, libc::O_RDWR)
        .unwrap();
    assert_eq!((a.nlink, a.perm), (0, 0o640));
    fs.write(a.ino, fh, 100, &data()).unwrap();
    let l = fs.link(&c, a.ino, ROOT_INO, n("named")).unwrap();
    assert_eq!((l.ino, l.nlink), (a.ino, 1));
    fs.release(a.ino, fh).unwrap();
    fs.destroy().unwrap();
    drop(fs);
    let r = check(&dev);
    assert!(r.is_clean(), "{:?}", r.findings);
    let fs = mount(&dev);
    let f = fs.lookup(&c, ROOT_INO, n("named")).unwrap();
    assert_eq!((f.ino, f.nlink, f.size), (a.ino, 1, 60_100));
    let mut buf = Vec::new();
    fs.read(f.ino, 0, 100, 60_000, &mut buf).unwrap();
    assert!(buf == data(), "the data after a remount");
}

#[test]
fn a_tmpfile_closed_without_a_link_is_freed() {
    let dev = image(2048);
    let fs = mount(&dev);
    let c = Ctx::root();
    let before = fs.statfs().unwrap().ffree;
    let (a, fh) = fs.tmpfile(&c, ROOT_INO, 0o600, 0, libc::O_RDWR).unwrap();
    fs.write(a.ino, fh, 0, &data()).unwrap();
    fs.fsync(a.ino, fh, false).unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0);
    fs.release(a.ino, fh).unwrap();
    assert!(fs.getattr(a.ino).is_err(), "inode {} freed", a.ino);
    assert_eq!(fs.statfs().unwrap().ffree, before);
    unmount_clean(fs, &dev);
}

/// Only a tmpfile made without O_EXCL, and not linked since, is linked from no link.
#[test]
fn only_a_linkable_tmpfile_is_linked_from_no_link() {
    let dev = image(2048);
    let fs = mount(&dev);
    let c = Ctx::root();
    let (o, ofh) = fs
        .create(&c, ROOT_INO, n("orphan"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    fs.unlink(&c, ROOT_INO, n("orphan")).unwrap();
    let enoent = |ino, name| {
        let e = fs.link(&c, ino, ROOT_INO, n(name)).unwrap_err().errno();
        assert_eq!(e, Errno::ENOENT, "{name}");
    };
    enoent(o.ino, "back");
    let (x, xfh) = fs
        .tmpfile(&c, ROOT_INO, 0o644, 0, libc::O_RDWR | libc::O_EXCL)
        .unwrap();
    enoent(x.ino, "x");
    let (t, tfh) = fs.tmpfile(&c, ROOT_INO, 0o644, 0, libc::O_RDWR).unwrap();
    fs.link(&c, t.ino, ROOT_INO, n("t")).unwrap();
    fs.unlink(&c, ROOT_INO, n("t")).unwrap();
    enoent(t.ino, "t2");
    for name in ["back", "x", "t", "t2"] {
        assert!(fs.lookup(&c, ROOT_INO, n(name)).is_err(), "{name}");
    }
    let d = fs.mkdir(&c, ROOT_INO, n("ro"), 0o555, 0).unwrap();
    let u = Ctx::user(1000, 1000);
    let e = fs.tmpfile(&u, d.ino, 0o644, 0, libc::O_RDWR).unwrap_err();
    assert_eq!(e.errno(), Errno::EACCES);
    for (ino, fh) in [(o.ino, ofh), (x.ino, xfh), (t.ino, tfh)] {
        fs.release(ino, fh).unwrap();
    }
    unmount_clean(fs, &dev);
}

/// A crash while a tmpfile is open, found by roll-forward (written after the checkpoint)
/// or by the checkpoint's orphan list: the next read-write mount frees it; a tmpfile
/// linked and fsynced before the crash keeps its name and data.
#[test]
fn a_crash_frees_an_open_tmpfile_and_keeps_a_linked_one() {
    for checkpointed in [false, true] {
        let dev = image(2048);
        let fs = mount(&dev);
        let c = Ctx::root();
        let free0 = fs.statfs().unwrap();
        let (k, kfh) = fs.tmpfile(&c, ROOT_INO, 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(k.ino, kfh, 0, &data()).unwrap();
        fs.link(&c, k.ino, ROOT_INO, n("kept")).unwrap();
        fs.fsync(k.ino, kfh, false).unwrap();
        let (a, fh) = fs.tmpfile(&c, ROOT_INO, 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(a.ino, fh, 0, &data()).unwrap();
        fs.fsync(a.ino, fh, false).unwrap();
        if checkpointed {
            fs.checkpoint().unwrap();
        }
        let img = crashed(&dev);
        drop(fs);
        let r = check(&img);
        assert!(
            r.is_clean() && r.pending_orphans == 1,
            "{checkpointed}: {r:?}"
        );
        let fs = mount(&img);
        assert!(
            fs.getattr(a.ino).is_err(),
            "{checkpointed}: the open one freed"
        );
        let f = fs.lookup(&c, ROOT_INO, n("kept")).unwrap();
        assert_eq!((f.ino, f.size), (k.ino, 60_000));
        let mut buf = Vec::new();
        fs.read(f.ino, 0, 0, 60_000, &mut buf).unwrap();
        assert!(buf == data(), "{checkpointed}: the linked tmpfile's data");
        fs.unlink(&c, ROOT_INO, n("kept")).unwrap();
        assert_eq!(fs.statfs().unwrap().ffree, free0.ffree, "nothing leaked");
        fs.destroy().unwrap();
        drop(fs);
        let r = check(&img);
        assert!(
            r.is_clean() && r.pending_orphans == 0,
            "{checkpointed}: {r:?}"
        );
    }
}
