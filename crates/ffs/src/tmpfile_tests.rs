//! O_TMPFILE in every mode of the registry: an unnamed file that a link may name (and that
//! then survives a remount and a crash once synced), that is freed at its last close
//! otherwise, and that a crash while it is open leaves to the mode's recovery to free.

use std::ffi::OsStr;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_vfs::modes::AfterCrash;
use cairn_vfs::{Ctx, Errno, FileSystem};

use crate::strategy::{ModeInfo, modes};
use crate::tests::fresh_with_log as fresh;
use crate::{Ffs, MountOptions};

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn mount(dev: &MemDevice, m: &ModeInfo) -> Arc<Ffs> {
    let d: Arc<dyn BlockDevice> = Arc::new(dev.with_block_size(4096));
    Ffs::mount_device(
        d,
        &MountOptions {
            mode: m.name.into(),
            ..Default::default()
        },
    )
    .unwrap()
}

fn fsck(dev: &MemDevice, repair: bool) -> cairn_fsck::Report {
    cairn_fsck::check(
        &dev.with_block_size(4096),
        cairn_fsck::CheckOptions {
            repair,
            ..Default::default()
        },
    )
    .unwrap()
}

fn data() -> Vec<u8> {
    (0..60_000u32).map(|i| (i * 13 + 1) as u8).collect()
}

/// Consistent in memory, unmounted, and clean to fsck.
fn unmount_clean(fs: Arc<Ffs>, dev: &MemDevice, m: &ModeInfo) {
    fs.self_check()
        .unwrap_or_else(|e| panic!("{}: {e}", m.name));
    fs.unmount().unwrap();
    drop(fs);
    let r = fsck(dev, false);
    assert!(r.is_clean(), "{}: {:?}", m.name, r.findings);
}

/// What a kernel does with a file it let go of: the last close, then the forget.
fn close_and_forget(fs: &Ffs, ino: u64, fh: u64) {
    fs.release(ino, fh).unwrap();
    fs.forget(ino, 1);
}

/// Created, written, linked, closed; after a remount the name has the data and fsck finds
/// the image clean.
#[test]
fn a_tmpfile_linked_keeps_its_data_across_a_remount() {
    for m in modes() {
        let dev = fresh();
        let fs = mount(&dev, m);
        let c = Ctx::root();
        let (a, fh) = fs.tmpfile(&c, 2, 0o640, 0o022, libc::O_RDWR).unwrap();
        assert_eq!(a.nlink, 0, "{}", m.name);
        assert_eq!(a.perm, 0o640, "{}", m.name);
        assert_eq!(fs.write(a.ino, fh, 100, &data()).unwrap(), 60_000);
        let l = fs.link(&c, a.ino, 2, n("named")).unwrap();
        assert_eq!((l.ino, l.nlink), (a.ino, 1), "{}", m.name);
        // Named, it is no orphan (statfs would count it as free space).
        fs.self_check()
            .unwrap_or_else(|e| panic!("{}: after the link: {e}", m.name));
        // Linked once, it is an ordinary file: unlinked again, no second link.
        fs.link(&c, a.ino, 2, n("second")).unwrap();
        fs.unlink(&c, 2, n("second")).unwrap();
        close_and_forget(&fs, a.ino, fh);
        fs.forget(a.ino, 2);
        unmount_clean(fs, &dev, m);
        let fs = mount(&dev, m);
        let f = fs.lookup(&c, 2, n("named")).unwrap();
        assert_eq!((f.ino, f.nlink, f.size), (a.ino, 1, 60_100), "{}", m.name);
        let mut buf = Vec::new();
        fs.read(f.ino, 0, 100, 60_000, &mut buf).unwrap();
        assert!(buf == data(), "{}: the data after a remount", m.name);
        fs.unmount().unwrap();
    }
}

/// Never linked: its last close frees the inode and its blocks; fsck finds nothing.
#[test]
fn a_tmpfile_closed_without_a_link_is_freed() {
    for m in modes() {
        let dev = fresh();
        let fs = mount(&dev, m);
        let c = Ctx::root();
        fs.sync_all().unwrap();
        let before = fs.statfs().unwrap();
        let (a, fh) = fs.tmpfile(&c, 2, 0o600, 0, libc::O_RDWR).unwrap();
        fs.write(a.ino, fh, 0, &data()).unwrap();
        fs.fsync(a.ino, fh, false).unwrap();
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0, "{}", m.name);
        close_and_forget(&fs, a.ino, fh);
        assert!(
            fs.getattr(a.ino).is_err(),
            "{}: inode {} freed",
            m.name,
            a.ino
        );
        fs.sync_all().unwrap();
        let after = fs.statfs().unwrap();
        assert_eq!(
            (after.bfree, after.ffree),
            (before.bfree, before.ffree),
            "{}",
            m.name
        );
        unmount_clean(fs, &dev, m);
    }
}

/// Only a tmpfile made without O_EXCL, and not linked since, may be linked with no link:
/// a file unlinked while open, an O_EXCL tmpfile and a tmpfile linked then unlinked are
/// ENOENT, as on Linux. Nothing changes on the refusals.
#[test]
fn only_a_linkable_tmpfile_is_linked_from_no_link() {
    for m in modes() {
        let dev = fresh();
        let fs = mount(&dev, m);
        let c = Ctx::root();
        let (o, ofh) = fs
            .create(&c, 2, n("orphan"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.unlink(&c, 2, n("orphan")).unwrap();
        assert_eq!(
            fs.link(&c, o.ino, 2, n("back")).unwrap_err().errno(),
            Errno::ENOENT,
            "{}: an ordinary orphan",
            m.name
        );
        let (x, xfh) = fs
            .tmpfile(&c, 2, 0o644, 0, libc::O_RDWR | libc::O_EXCL)
            .unwrap();
        assert_eq!(
            fs.link(&c, x.ino, 2, n("x")).unwrap_err().errno(),
            Errno::ENOENT,
            "{}: O_EXCL",
            m.name
        );
        let (t, tfh) = fs.tmpfile(&c, 2, 0o644, 0, libc::O_RDWR).unwrap();
        fs.link(&c, t.ino, 2, n("t")).unwrap();
        fs.unlink(&c, 2, n("t")).unwrap();
        assert_eq!(
            fs.link(&c, t.ino, 2, n("t2")).unwrap_err().errno(),
            Errno::ENOENT,
            "{}: linked once, then unlinked",
            m.name
        );
        for name in ["back", "x", "t", "t2"] {
            assert!(fs.lookup(&c, 2, n(name)).is_err(), "{}: {name}", m.name);
        }
        // The permission checks of a create: write and search on the parent.
        let d = fs.mkdir(&c, 2, n("ro"), 0o555, 0).unwrap();
        let u = Ctx::user(1000, 1000);
        assert_eq!(
            fs.tmpfile(&u, d.ino, 0o644, 0, libc::O_RDWR)
                .unwrap_err()
                .errno(),
            Errno::EACCES,
            "{}",
            m.name
        );
        close_and_forget(&fs, o.ino, ofh);
        close_and_forget(&fs, x.ino, xfh);
        fs.release(t.ino, tfh).unwrap();
        fs.forget(t.ino, 2);
        unmount_clean(fs, &dev, m);
    }
}

/// The setgid bit of the parent: the tmpfile takes its group, as a create does.
#[test]
fn a_tmpfile_inherits_a_setgid_directory_s_group() {
    for m in modes() {
        let dev = fresh();
        let fs = mount(&dev, m);
        let c = Ctx::root();
        let d = fs.mkdir(&c, 2, n("g"), 0o2777, 0).unwrap();
        let set = cairn_vfs::SetAttr {
            gid: Some(50),
            ..Default::default()
        };
        fs.setattr(&c, d.ino, set).unwrap();
        let u = Ctx::user(1000, 1000);
        let (a, fh) = fs.tmpfile(&u, d.ino, 0o644, 0, libc::O_RDWR).unwrap();
        assert_eq!((a.uid, a.gid), (1000, 50), "{}", m.name);
        close_and_forget(&fs, a.ino, fh);
        fs.unmount().unwrap();
    }
}

/// A crash while a tmpfile is open (written and fsynced: its inode is on disk) and one
/// while a linked tmpfile is synced: after the mode's own recovery (fsck, the background
/// check, replay) the unnamed one is gone with its blocks, the named one has its data,
/// and fsck finds the image clean.
#[test]
fn a_crash_frees_an_open_tmpfile_and_keeps_a_linked_one() {
    for m in modes() {
        let dev = fresh();
        let fs = mount(&dev, m);
        let c = Ctx::root();
        fs.sync_all().unwrap();
        let free0 = fs.statfs().unwrap();
        let (k, kfh) = fs.tmpfile(&c, 2, 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(k.ino, kfh, 0, &data()).unwrap();
        fs.link(&c, k.ino, 2, n("kept")).unwrap();
        let (a, fh) = fs.tmpfile(&c, 2, 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(a.ino, fh, 0, &data()).unwrap();
        fs.fsync(a.ino, fh, false).unwrap();
        fs.sync_all().unwrap();
        // The crash: the device as it is now, the mount never unmounted.
        let img = MemDevice::from_bytes(4096, dev.to_bytes());
        drop(fs);
        match m.guarantees.after_crash {
            AfterCrash::Fsck => {
                let r = fsck(&img, true);
                assert!(r.corruptions().next().is_none(), "{}: {r:?}", m.name);
                assert!(!r.is_clean(), "{}: the open tmpfile was on disk", m.name);
            }
            AfterCrash::Mount => {
                let fs = mount(&img, m);
                fs.check_background_report(&|_, _| {}).unwrap();
                fs.unmount().unwrap();
            }
            AfterCrash::Recover => mount(&img, m).unmount().unwrap(),
        }
        let r = fsck(&img, false);
        assert!(r.is_clean(), "{}: {:?}", m.name, r.findings);
        let fs = mount(&img, m);
        let f = fs.lookup(&c, 2, n("kept")).unwrap();
        assert_eq!((f.ino, f.size), (k.ino, 60_000), "{}", m.name);
        let mut buf = Vec::new();
        fs.read(f.ino, 0, 0, 60_000, &mut buf).unwrap();
        assert!(buf == data(), "{}: the linked tmpfile's data", m.name);
        assert!(fs.getattr(a.ino).is_err(), "{}: the open one freed", m.name);
        fs.unlink(&c, 2, n("kept")).unwrap();
        fs.forget(f.ino, 1);
        fs.sync_all().unwrap();
        let free1 = fs.statfs().unwrap();
        assert_eq!(
            (free1.bfree, free1.ffree),
            (free0.bfree, free0.ffree),
            "{}: nothing leaked",
            m.name
        );
        fs.unmount().unwrap();
    }
}
