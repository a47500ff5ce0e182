//! Engine tests on a memory device: operations, persistence across remount, the ordering
//! the sync strategy promises, and the boundaries of the block map.

use std::ffi::OsStr;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_vfs::{Ctx, Errno, FileSystem, RenameFlags, SetAttr};

use crate::{Ffs, MkfsOptions, MountOptions, mkfs_device};

/// Up to two kinds of dirty buffers, picked from `kinds`, written and each flushed, in a
/// random order (a write order no mode would choose); the worklist run once in `worklist`
/// calls on average. A crash may come after any of them.
pub(crate) fn random_write_back(fs: &Ffs, rng: &mut impl rand::Rng, kinds: &[u8], worklist: u32) {
    for _ in 0..rng.random_range(0..3) {
        write_kind(fs, kinds[rng.random_range(0..kinds.len())]);
    }
    if rng.random_range(0..worklist) == 0 {
        fs.strategy.background(fs).unwrap();
    }
}

/// Writes the dirty buffers of kind `k` and flushes.
pub(crate) fn write_kind(fs: &Ffs, k: u8) {
    fs.vol
        .cache
        .write_back_filter(&|b: &cairn_bufcache::Buf| b.kind() == k)
        .unwrap();
    fs.vol.cache.flush_device().unwrap();
}

fn fresh(blocks: u64, mode: &str) -> (MemDevice, Arc<Ffs>) {
    let dev = MemDevice::new(4096, blocks);
    mkfs_device(
        &dev,
        &MkfsOptions {
            blocks_per_group: Some(2048),
            ..Default::default()
        },
    )
    .unwrap();
    let fs = mount(&dev, mode);
    (dev, fs)
}

/// A fresh image with a log area after the groups (journal's `log=file`; the other modes
/// leave it be): one image every mode mounts.
pub(crate) fn fresh_with_log() -> MemDevice {
    let dev = MemDevice::new(4096, 4096 + 1024);
    mkfs_device(
        &dev,
        &MkfsOptions {
            blocks_per_group: Some(2048),
            journal_size: Some(1024 * 4096),
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

fn mount(dev: &MemDevice, mode: &str) -> Arc<Ffs> {
    let d: Arc<dyn BlockDevice> = Arc::new(dev.with_block_size(4096));
    Ffs::mount_device(
        d,
        &MountOptions {
            mode: mode.into(),
            ..Default::default()
        },
    )
    .unwrap()
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn errno<T: std::fmt::Debug>(r: cairn_vfs::Result<T>) -> Errno {
    r.unwrap_err().errno()
}

#[test]
fn create_write_read_remount() {
    for mode in ["sync", "async"] {
        let (dev, fs) = fresh(8192, mode);
        let c = Ctx::root();
        let d = fs.mkdir(&c, 2, n("dir"), 0o755, 0).unwrap();
        let (f, fh) = fs
            .create(&c, d.ino, n("file"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(fs.write(f.ino, fh, 5000, &data).unwrap(), 100_000);
        let mut buf = Vec::new();
        fs.read(f.ino, fh, 0, 200_000, &mut buf).unwrap();
        assert_eq!(buf.len(), 105_000);
        assert!(buf[..5000].iter().all(|&b| b == 0));
        assert_eq!(&buf[5000..], &data[..]);
        fs.release(f.ino, fh).unwrap();
        fs.symlink(&c, 2, n("short"), b"dir/file").unwrap();
        let long = vec![b'x'; 300];
        fs.symlink(&c, 2, n("long"), &long).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let fs = mount(&dev, mode);
        let d2 = fs.lookup(&c, 2, n("dir")).unwrap();
        assert_eq!(d2.ino, d.ino);
        let f2 = fs.lookup(&c, d2.ino, n("file")).unwrap();
        assert_eq!(f2.size, 105_000);
        let mut buf2 = Vec::new();
        fs.read(f2.ino, 0, 5000, 100_000, &mut buf2).unwrap();
        assert_eq!(buf2, data);
        let s = fs.lookup(&c, 2, n("short")).unwrap();
        assert_eq!(fs.readlink(s.ino).unwrap(), b"dir/file");
        let l = fs.lookup(&c, 2, n("long")).unwrap();
        assert_eq!(fs.readlink(l.ino).unwrap(), long);
        assert_eq!(fs.getattr(2).unwrap().nlink, 4);
    }
}

#[test]
fn namespace_errors() {
    let (_dev, fs) = fresh(4096, "async");
    let c = Ctx::root();
    fs.mkdir(&c, 2, n("a"), 0o755, 0).unwrap();
    assert_eq!(errno(fs.mkdir(&c, 2, n("a"), 0o755, 0)), Errno::EEXIST);
    let a = fs.lookup(&c, 2, n("a")).unwrap();
    fs.mknod(&c, a.ino, n("f"), libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    assert_eq!(errno(fs.rmdir(&c, 2, n("a"))), Errno::ENOTEMPTY);
    assert_eq!(errno(fs.unlink(&c, 2, n("a"))), Errno::EISDIR);
    assert_eq!(errno(fs.lookup(&c, 2, n("nope"))), Errno::ENOENT);
    let long = "x".repeat(256);
    assert_eq!(
        errno(fs.mkdir(&c, 2, n(&long), 0o755, 0)),
        Errno::ENAMETOOLONG
    );
    // A directory into its own subtree.
    fs.mkdir(&c, a.ino, n("sub"), 0o755, 0).unwrap();
    let sub = fs.lookup(&c, a.ino, n("sub")).unwrap();
    assert_eq!(
        errno(fs.rename(&c, 2, n("a"), sub.ino, n("x"), RenameFlags::default())),
        Errno::EINVAL
    );
    // Move sub to the root: link counts follow.
    fs.rename(&c, a.ino, n("sub"), 2, n("sub2"), RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(fs.getattr(2).unwrap().nlink, 5);
    fs.unlink(&c, a.ino, n("f")).unwrap();
    fs.rmdir(&c, 2, n("a")).unwrap();
    assert_eq!(fs.getattr(2).unwrap().nlink, 4);
    // Non-root permission checks.
    let u = Ctx::user(1000, 1000);
    assert_eq!(errno(fs.mkdir(&u, 2, n("u"), 0o755, 0)), Errno::EACCES);
}

#[test]
fn rename_replace_and_exchange() {
    let (_dev, fs) = fresh(4096, "sync");
    let c = Ctx::root();
    let a = fs
        .mknod(&c, 2, n("a"), libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    let b = fs
        .mknod(&c, 2, n("b"), libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    let nr = RenameFlags {
        noreplace: true,
        exchange: false,
        ..Default::default()
    };
    assert_eq!(
        errno(fs.rename(&c, 2, n("a"), 2, n("b"), nr)),
        Errno::EEXIST
    );
    let ex = RenameFlags {
        noreplace: false,
        exchange: true,
        ..Default::default()
    };
    fs.rename(&c, 2, n("a"), 2, n("b"), ex).unwrap();
    assert_eq!(fs.lookup(&c, 2, n("a")).unwrap().ino, b.ino);
    fs.rename(&c, 2, n("a"), 2, n("b"), RenameFlags::default())
        .unwrap();
    assert_eq!(fs.lookup(&c, 2, n("b")).unwrap().ino, b.ino);
    assert_eq!(errno(fs.lookup(&c, 2, n("a"))), Errno::ENOENT);
    // a's inode lost its last name; the kernel's references keep it until forget.
    fs.forget(a.ino, 1);
    assert_eq!(errno(fs.getattr(a.ino)), Errno::ENOENT);
}

#[test]
fn big_sparse_file_and_truncate_frees_everything() {
    let (_dev, fs) = fresh(16384, "async");
    let c = Ctx::root();
    let free0 = fs.statfs().unwrap().bfree;
    let (f, fh) = fs.create(&c, 2, n("big"), 0o644, 0, libc::O_RDWR).unwrap();
    // Direct, single, double and triple indirect.
    let bs = 4096u64;
    let ppb = 512u64;
    for lbn in [
        0,
        11,
        12,
        12 + ppb - 1,
        12 + ppb,
        12 + ppb + ppb * ppb,
        1 << 26,
    ] {
        fs.write(f.ino, fh, lbn * bs + 7, b"hello").unwrap();
    }
    let mut buf = Vec::new();
    fs.read(f.ino, fh, (12 + ppb) * bs + 7, 5, &mut buf)
        .unwrap();
    assert_eq!(buf, b"hello");
    fs.read(f.ino, fh, 3 * bs, 10, &mut buf).unwrap();
    assert_eq!(buf, vec![0; 10]);
    fs.setattr(
        &c,
        f.ino,
        SetAttr {
            size: Some(13 * bs),
            ..Default::default()
        },
    )
    .unwrap();
    fs.read(f.ino, fh, 12 * bs + 7, 5, &mut buf).unwrap();
    assert_eq!(buf, b"hello");
    fs.setattr(
        &c,
        f.ino,
        SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().blocks, 0);
    assert_eq!(fs.statfs().unwrap().bfree, free0);
    assert_eq!(
        errno(fs.write(f.ino, fh, fs.vol.geo.max_file_size(), b"x")),
        Errno::EFBIG
    );
}

/// The flushes (and, where it matters, the writes) each call costs in `sync` mode are
/// exactly what its ordering needs: one per ordered step after the first, plus the flush
/// that makes the call durable on return. Every value here was measured on the engine as
/// it stood before the strategy interface carried facts, and any change to the engine
/// must keep them (the write order itself is guarded by crates/crash/tests/write_order.rs).
#[test]
fn sync_flushes_per_operation() {
    let (_dev, fs) = fresh(4096, "sync");
    let dev = fs.device().clone();
    let c = Ctx::root();
    let mut wrong = Vec::new();
    let mut check = |what: &str, flushes: u64, f: &mut dyn FnMut()| {
        let before = dev.counters().snapshot();
        f();
        let d = dev.counters().snapshot().delta(&before);
        if d.flushes != flushes {
            wrong.push(format!("{what}: {} flushes, expected {flushes}", d.flushes));
        }
        d
    };
    let root = 2;
    check("mknod: inode, barrier, entry, flush", 2, &mut || {
        fs.mknod(&c, root, n("x"), libc::S_IFREG | 0o644, 0, 0)
            .unwrap();
    });
    let x = fs.lookup(&c, root, n("x")).unwrap().ino;
    fs.forget(x, 1);
    check("unlink: the entry's removal only", 1, &mut || {
        fs.unlink(&c, root, n("x")).unwrap()
    });
    let d = check("forget: not a durability point", 0, &mut || fs.forget(x, 1));
    assert!(
        d.writes > 0,
        "the cleared inode is written at once (rule 2)"
    );
    let mut fh = 0;
    let mut f = 0;
    check(
        "create after a forget: its first barrier makes the cleared inode durable",
        3,
        &mut || {
            let (a, h) = fs.create(&c, root, n("f"), 0o644, 0, libc::O_RDWR).unwrap();
            (f, fh) = (a.ino, h);
        },
    );
    check("write into the cache: delayed", 0, &mut || {
        fs.write(f, fh, 0, &[1u8; 3 * 4096]).unwrap();
    });
    check(
        "fsync: data, barrier, bitmaps, barrier, metadata, flush",
        3,
        &mut || fs.fsync(f, fh, false).unwrap(),
    );
    check("write through a new indirect block", 1, &mut || {
        fs.write(f, fh, 20 * 4096, &[2u8; 4096]).unwrap();
    });
    check(
        "fsync with an indirect block: one more barrier",
        4,
        &mut || fs.fsync(f, fh, false).unwrap(),
    );
    check("setattr (chmod): one step", 1, &mut || {
        fs.setattr(
            &c,
            f,
            SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    });
    check(
        "setattr (truncate): cleared pointers, then the inode",
        2,
        &mut || {
            fs.setattr(
                &c,
                f,
                SetAttr {
                    size: Some(4096),
                    ..Default::default()
                },
            )
            .unwrap();
        },
    );
    check(
        "first setxattr: the new block, then the inode",
        2,
        &mut || fs.setxattr(&c, f, n("user.a"), b"1", 0).unwrap(),
    );
    check(
        "second setxattr: block and inode in one step",
        1,
        &mut || fs.setxattr(&c, f, n("user.b"), b"2", 0).unwrap(),
    );
    check(
        "removexattr: the rewritten block and the inode",
        1,
        &mut || {
            fs.removexattr(&c, f, n("user.a")).unwrap();
        },
    );
    check(
        "removexattr of the last one: cleared pointer, then the free",
        1,
        &mut || {
            fs.removexattr(&c, f, n("user.b")).unwrap();
        },
    );
    check("fallocate: data allocations are delayed", 0, &mut || {
        fs.fallocate(f, fh, 0, 3 * 4096, 0).unwrap()
    });
    check(
        "punch: the bitmaps fallocate owed, barrier, cleared pointers",
        2,
        &mut || {
            fs.fallocate(
                f,
                fh,
                4096,
                4096,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            )
            .unwrap()
        },
    );
    fs.write(f, fh, 0, &[3u8; 3 * 4096]).unwrap();
    check(
        "open(O_TRUNC): owed bitmaps, cleared pointers, inode",
        3,
        &mut || {
            let h = fs.open(&c, f, libc::O_RDWR | libc::O_TRUNC).unwrap();
            fs.release(f, h).unwrap();
        },
    );
    check("link: count up, barrier, entry, flush", 2, &mut || {
        fs.link(&c, f, root, n("f2")).unwrap();
    });
    check("rename: count up, new name, old name gone", 3, &mut || {
        fs.rename(&c, root, n("f2"), root, n("f3"), RenameFlags::default())
            .unwrap()
    });
    fs.mknod(&c, root, n("victim"), libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    check(
        "rename over a file: as rename; the victim's free is delayed",
        3,
        &mut || {
            fs.rename(&c, root, n("f3"), root, n("victim"), RenameFlags::default())
                .unwrap()
        },
    );
    fs.mknod(&c, root, n("other"), libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    check("exchange: one step", 1, &mut || {
        fs.rename(
            &c,
            root,
            n("victim"),
            root,
            n("other"),
            RenameFlags {
                noreplace: false,
                exchange: true,
                ..Default::default()
            },
        )
        .unwrap()
    });
    check(
        "rename with a whiteout: the whiteout's inode, count up, new name, old name given \
         to the whiteout",
        4,
        &mut || {
            let wo = RenameFlags {
                whiteout: true,
                ..Default::default()
            };
            fs.rename(&c, root, n("other"), root, n("wo"), wo).unwrap()
        },
    );
    check(
        "mkdir: first block and parent's count, inode, entry",
        3,
        &mut || {
            fs.mkdir(&c, root, n("d1"), 0o755, 0).unwrap();
        },
    );
    fs.mkdir(&c, root, n("d2"), 0o755, 0).unwrap();
    let d1 = fs.lookup(&c, root, n("d1")).unwrap().ino;
    let d2 = fs.lookup(&c, root, n("d2")).unwrap().ino;
    fs.mkdir(&c, d1, n("mover"), 0o755, 0).unwrap();
    check(
        "rename of a directory across parents: + its '..'",
        4,
        &mut || {
            fs.rename(&c, d1, n("mover"), d2, n("moved"), RenameFlags::default())
                .unwrap()
        },
    );
    check("rmdir: the entry's removal only", 1, &mut || {
        fs.rmdir(&c, d2, n("moved")).unwrap()
    });
    check("symlink (fast): inode, entry", 2, &mut || {
        fs.symlink(&c, root, n("s"), b"target").unwrap();
    });
    check("symlink (slow): target block, inode, entry", 3, &mut || {
        fs.symlink(&c, root, n("sl"), &[b'z'; 300]).unwrap();
    });
    // Names until one needs a new directory block: that call is measured.
    let mut i = 0;
    loop {
        let before = dev.counters().snapshot();
        fs.mknod(&c, d1, n(&format!("{i:0>200}")), libc::S_IFREG, 0, 0)
            .unwrap();
        let d = dev.counters().snapshot().delta(&before);
        if fs.getattr(d1).unwrap().size > fs.vol.geo.block_size as u64 {
            if d.flushes != 3 {
                wrong.push(format!(
                    "mknod growing its directory (inode, new block, entry): {} flushes, expected 3",
                    d.flushes
                ));
            }
            break;
        }
        i += 1;
    }
    fs.release(f, fh).unwrap();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let (_d, fsa) = fresh(4096, "async");
    let b2 = fsa.device().counters().snapshot();
    fsa.mknod(&c, 2, n("y"), libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    fsa.unlink(&c, 2, n("y")).unwrap();
    assert_eq!(
        fsa.device().counters().snapshot().delta(&b2).writes,
        0,
        "async delays everything"
    );
}

#[test]
fn large_directory_and_readdir_offsets() {
    let (_dev, fs) = fresh(16384, "async");
    let c = Ctx::root();
    let d = fs.mkdir(&c, 2, n("d"), 0o755, 0).unwrap();
    for i in 0..3000 {
        fs.mknod(
            &c,
            d.ino,
            n(&format!("file-{i:05}")),
            libc::S_IFREG | 0o644,
            0,
            0,
        )
        .unwrap();
    }
    for i in (0..3000).step_by(2) {
        fs.unlink(&c, d.ino, n(&format!("file-{i:05}"))).unwrap();
    }
    let mut seen = Vec::new();
    let mut off = 0;
    loop {
        let mut batch = Vec::new();
        fs.readdir(d.ino, 0, off, false, &mut |e| {
            if batch.len() == 100 {
                return false;
            }
            batch.push((e.name.to_string_lossy().into_owned(), e.next_offset));
            true
        })
        .unwrap();
        if batch.is_empty() {
            break;
        }
        off = batch.last().unwrap().1;
        seen.extend(batch.into_iter().map(|(n, _)| n));
    }
    assert_eq!(seen.len(), 1500 + 2);
    let mut uniq = seen.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), seen.len());
}

#[test]
fn enospc_leaves_fs_usable() {
    let (_dev, fs) = fresh(1024, "async");
    let c = Ctx::root();
    let (f, fh) = fs.create(&c, 2, n("fill"), 0o644, 0, libc::O_RDWR).unwrap();
    let chunk = vec![1u8; 65536];
    let mut off = 0;
    loop {
        match fs.write(f.ino, fh, off, &chunk) {
            Ok(0) => break,
            Ok(w) => off += w as u64,
            Err(e) => {
                assert_eq!(e.errno(), Errno::ENOSPC);
                break;
            }
        }
    }
    assert_eq!(fs.statfs().unwrap().bfree, 0);
    fs.release(f.ino, fh).unwrap();
    fs.unlink(&c, 2, n("fill")).unwrap();
    fs.forget(f.ino, 1);
    assert!(fs.statfs().unwrap().bfree > 900);
}

/// generic/213: a fallocate of more than the file system holds is refused before a block
/// is allocated (no buffer zeroed per block and rolled back), in every FFS strategy; the image
/// is as it was and a fallocate that fits still works, also over blocks the file has.
#[test]
fn oversize_fallocate_refused_up_front() {
    for mode in ["sync", "async", "softdep"] {
        let (_dev, fs) = fresh(1024, mode);
        let c = Ctx::root();
        let (f, fh) = fs.create(&c, 2, n("big"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.fsync(f.ino, fh, false).unwrap();
        let free = fs.statfs().unwrap().bfree;
        let before = fs.vol.cache.stats();
        for m in [0, libc::FALLOC_FL_ZERO_RANGE] {
            let r = fs.fallocate(f.ino, fh, 0, 2 * 1024 * 4096, m);
            assert_eq!(errno(r), Errno::ENOSPC, "{mode}, mode {m}");
        }
        // Allocating to the end and rolling back reads the bitmap and the block map once
        // per block: a refusal up front reads a few buffers.
        let after = fs.vol.cache.stats();
        let reads = after.hits + after.misses - before.hits - before.misses;
        assert!(
            reads < 16,
            "{mode}: {reads} buffer reads for a refused fallocate"
        );
        assert_eq!(fs.statfs().unwrap().bfree, free, "{mode}");
        assert_eq!(fs.getattr(f.ino).unwrap().size, 0, "{mode}");
        // df's available room is what one file can be given, indirect blocks and all
        // (generic/103 fallocates all of it but 512 KiB).
        let avail = fs.statfs().unwrap().bavail;
        let (g, gh) = fs.create(&c, 2, n("all"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.fallocate(g.ino, gh, 0, avail * 4096, 0)
            .unwrap_or_else(|e| panic!("{mode}: fallocate of the {avail} available blocks: {e}"));
        fs.release(g.ino, gh).unwrap();
        fs.unlink(&c, 2, n("all")).unwrap();
        fs.forget(g.ino, 1);
        fs.sync_all().unwrap();
        assert_eq!(fs.statfs().unwrap().bfree, free, "{mode}: all of it back");
        // Half the room, then the same range again: its blocks are the file's already.
        let half = free / 2 * 4096;
        fs.fallocate(f.ino, fh, 0, half, 0).unwrap();
        fs.fallocate(f.ino, fh, 0, half, 0).unwrap();
        fs.release(f.ino, fh).unwrap();
    }
}

#[test]
fn xattrs() {
    let (_dev, fs) = fresh(2048, "sync");
    let c = Ctx::root();
    let f = fs
        .mknod(&c, 2, n("f"), libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    fs.setxattr(&c, f.ino, n("user.a"), b"1", 0).unwrap();
    assert_eq!(
        errno(fs.setxattr(&c, f.ino, n("user.a"), b"2", libc::XATTR_CREATE)),
        Errno::EEXIST
    );
    assert_eq!(
        errno(fs.setxattr(&c, f.ino, n("user.b"), b"2", libc::XATTR_REPLACE)),
        Errno::ENODATA
    );
    assert_eq!(fs.getxattr(&c, f.ino, n("user.a")).unwrap(), b"1");
    assert_eq!(fs.listxattr(&c, f.ino).unwrap(), b"user.a\0");
    fs.removexattr(&c, f.ino, n("user.a")).unwrap();
    assert_eq!(errno(fs.getxattr(&c, f.ino, n("user.a"))), Errno::ENODATA);
    assert_eq!(fs.getattr(f.ino).unwrap().blocks, 0);
}

#[test]
fn bad_images_are_refused_with_one_line() {
    let dev = MemDevice::new(4096, 1024);
    let d: Arc<dyn BlockDevice> = Arc::new(dev.with_block_size(4096));
    let e = Ffs::mount_device(d, &MountOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("magic"), "{e}");
    let (dev, fs) = fresh(2048, "sync");
    fs.unmount().unwrap();
    drop(fs);
    let mut bytes = dev.to_bytes();
    bytes[8] = 9; // version
    let d: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(4096, bytes.clone()));
    let e = Ffs::mount_device(d, &MountOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("newer"), "{e}");
    bytes.truncate(4096 * 100);
    bytes[8] = 1;
    let d: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(4096, bytes));
    let e = Ffs::mount_device(d, &MountOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn directory_rename_over_empty_directory_across_parents_keeps_link_counts() {
    for mode in ["sync", "async"] {
        let (_dev, fs) = fresh(4096, mode);
        let c = Ctx::root();
        let p1 = fs.mkdir(&c, 2, n("p1"), 0o755, 0).unwrap();
        let p2 = fs.mkdir(&c, 2, n("p2"), 0o755, 0).unwrap();
        fs.mkdir(&c, p1.ino, n("mover"), 0o755, 0).unwrap();
        fs.mkdir(&c, p2.ino, n("empty"), 0o755, 0).unwrap();
        fs.rename(
            &c,
            p1.ino,
            n("mover"),
            p2.ino,
            n("empty"),
            RenameFlags::default(),
        )
        .unwrap();
        assert_eq!(fs.getattr(p1.ino).unwrap().nlink, 2);
        assert_eq!(fs.getattr(p2.ino).unwrap().nlink, 3);
        let m = fs.lookup(&c, p2.ino, n("empty")).unwrap();
        assert_eq!(fs.lookup(&c, m.ino, n("..")).unwrap().ino, p2.ino);
        // Same parent, over an empty directory: the parent loses one subdirectory.
        fs.mkdir(&c, p2.ino, n("e2"), 0o755, 0).unwrap();
        assert_eq!(fs.getattr(p2.ino).unwrap().nlink, 4);
        fs.rename(
            &c,
            p2.ino,
            n("empty"),
            p2.ino,
            n("e2"),
            RenameFlags::default(),
        )
        .unwrap();
        assert_eq!(fs.getattr(p2.ino).unwrap().nlink, 3);
    }
}

#[test]
fn fsync_writes_this_file_not_the_others() {
    for mode in ["sync", "async"] {
        let (_dev, fs) = fresh(8192, mode);
        let c = Ctx::root();
        let (a, fa) = fs.create(&c, 2, n("a"), 0o644, 0, libc::O_RDWR).unwrap();
        let (b, fb) = fs.create(&c, 2, n("b"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(a.ino, fa, 0, &vec![1u8; 40 * 4096]).unwrap();
        fs.write(b.ino, fb, 0, &vec![2u8; 100 * 4096]).unwrap();
        let dev = fs.device().clone();
        let before = dev.counters().snapshot();
        fs.fsync(a.ino, fa, false).unwrap();
        let d = dev.counters().snapshot().delta(&before);
        assert!(d.blocks_written >= 40, "{mode}: a's data written");
        assert!(
            d.blocks_written < 100,
            "{mode}: b's data left in the cache ({} blocks)",
            d.blocks_written
        );
        assert!(d.flushes >= 1);
        // Nothing of a is dirty any more.
        let blocks = fs.file_blocks(&mut fs.st.lock(), a.ino).unwrap();
        assert!(
            blocks
                .iter()
                .all(|&p| fs.vol.cache.lookup(p).is_none_or(|x| !x.is_dirty()))
        );
    }
}

/// Streaming writes (>= 256 KiB) go to the device directly for whole uncached blocks; a
/// block someone has cached (dirty from an earlier small write) must still win its bytes.
#[test]
fn streaming_writes_mix_with_cached_blocks() {
    for mode in ["sync", "async"] {
        let (dev, fs) = fresh(8192, mode);
        let c = Ctx::root();
        let (f, fh) = fs.create(&c, 2, n("s"), 0o644, 0, libc::O_RDWR).unwrap();
        // A small write first: blocks 40..=41 are now cached and dirty.
        fs.write(f.ino, fh, 40 * 4096 + 10, &[9u8; 5000]).unwrap();
        let big: Vec<u8> = (0..(1u32 << 20) + 777).map(|i| (i % 251) as u8).collect();
        let off = 3 * 4096 + 100;
        assert_eq!(fs.write(f.ino, fh, off, &big).unwrap() as usize, big.len());
        let mut want = vec![0u8; off as usize + big.len()];
        want[40 * 4096 + 10..40 * 4096 + 5010].fill(9);
        want[off as usize..].copy_from_slice(&big);
        let mut got = Vec::new();
        fs.read(f.ino, fh, 0, want.len() as u32 + 10, &mut got)
            .unwrap();
        if got != want {
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            panic!(
                "{mode}: read back differs: len {} vs {}, first at {:?} (block {:?})",
                got.len(),
                want.len(),
                first,
                first.map(|f| f / 4096)
            );
        }
        fs.release(f.ino, fh).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let fs = mount(&dev, mode);
        let a = fs.lookup(&c, 2, n("s")).unwrap();
        let mut got = Vec::new();
        fs.read(a.ino, 0, 0, want.len() as u32 + 10, &mut got)
            .unwrap();
        assert!(got == want, "{mode}: differs after remount");
    }
}

/// Someone without CAP_FSETID who writes or truncates a setuid/setgid file clears the bits
/// itself (FUSE_HANDLE_KILLPRIV: the kernel sends no mode change for it): setuid always,
/// setgid with group-execute; root's writes keep them; and a chmod from anyone but the owner
/// is EPERM, even one that only clears the bits.
#[test]
fn writes_by_others_kill_setuid_and_setgid_and_only_the_owner_chmods() {
    let (_dev, fs) = fresh(2048, "sync");
    let root = Ctx::root();
    let other = Ctx::user(2000, 2000);
    let mk = |name: &str, mode: u32| {
        let f = fs
            .mknod(&root, 2, n(name), libc::S_IFREG | 0o644, 0, 0)
            .unwrap();
        let ids = SetAttr {
            uid: Some(1000),
            gid: Some(1000),
            ..Default::default()
        };
        fs.setattr(&root, f.ino, ids).unwrap();
        fs.setattr(&root, f.ino, mode_to(mode)).unwrap();
        f.ino
    };
    let perm = |ino| fs.getattr(ino).unwrap().perm as u32;
    let write_as = |c: &Ctx, ino| {
        let fh = fs.open(c, ino, libc::O_WRONLY).unwrap();
        fs.write(ino, fh, 0, b"by someone").unwrap();
        fs.release(ino, fh).unwrap();
    };
    let a = mk("a", 0o6777);
    write_as(&other, a);
    assert_eq!(perm(a), 0o0777, "setuid, and setgid with group-execute, go");
    // Setgid without group-execute stays for a group member and goes for a writer outside
    // the group (setattr_should_drop_sgid).
    for (name, who, want) in [
        ("c", Ctx::user(2000, 1000), 0o2666),
        ("g", Ctx::user(2000, 2000), 0o0666),
    ] {
        let f = mk(name, 0o6666);
        write_as(&who, f);
        assert_eq!(
            perm(f),
            want,
            "setgid without group-execute, writer gid {}",
            who.gid
        );
    }
    let r = mk("r", 0o6777);
    write_as(&root, r);
    assert_eq!(perm(r), 0o6777, "root keeps them");
    let b = mk("b", 0o4666);
    let trunc = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    fs.setattr(&other, b, trunc).unwrap();
    assert_eq!(perm(b), 0o0666, "a truncation by someone else");
    let d = mk("d", 0o6777);
    for chmod in [0o0777, 0o6775, 0o2777, 0o7777] {
        assert_eq!(
            errno(fs.setattr(&other, d, mode_to(chmod))),
            Errno::EPERM,
            "{chmod:o}"
        );
    }
    assert_eq!(perm(d), 0o6777);
    // fallocate, punch and zero range too (generic/683-685); root's keep them.
    for (i, m) in [
        0,
        libc::FALLOC_FL_KEEP_SIZE,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        libc::FALLOC_FL_ZERO_RANGE,
    ]
    .into_iter()
    .enumerate()
    {
        for (who, want) in [(&root, 0o6777), (&other, 0o0777)] {
            let f = mk(&format!("fa{i}-{}", who.uid), 0o6777);
            let fh = fs.open(who, f, libc::O_WRONLY).unwrap();
            fs.fallocate(f, fh, 0, 8192, m).unwrap();
            fs.release(f, fh).unwrap();
            assert_eq!(perm(f), want, "fallocate mode {m:#x} by uid {}", who.uid);
        }
    }
}

fn mode_to(mode: u32) -> SetAttr {
    SetAttr {
        mode: Some(mode),
        ..Default::default()
    }
}

/// A mode shaped like soft updates, without its I/O ordering: every removal's on-disk
/// link-count drop is deferred (`Apply::Deferred`) and every free is held, both handed to
/// the engine only at its `sync` (`Engine::apply_link_drop`, `Engine::release`). It runs
/// without the engine's lock around its I/O (`Concurrent`), as those callbacks need.
struct Deferring {
    inner: crate::strategy::Delayed,
    drops: parking_lot::Mutex<Vec<(u64, u32)>>,
    releases: parking_lot::Mutex<Vec<crate::strategy::Release>>,
}

mod deferring {
    use super::Deferring;
    use crate::strategy::*;
    use cairn_vfs::Result;

    impl Strategy for Deferring {
        fn name(&self) -> &'static str {
            "deferring"
        }
        fn commit_policy(&self) -> cairn_vfs::modes::Commit {
            self.inner.commit_policy()
        }
        fn syncer_interval(&self) -> std::time::Duration {
            self.inner.syncer_interval()
        }
        fn io_model(&self) -> IoModel {
            IoModel::Concurrent
        }
        fn setup_directory_remove(&self, _: &mut Tx, f: &DirRemove) -> Result<Apply> {
            let mut d = self.drops.lock();
            d.push((f.ino, if f.rmdir { 2 } else { 1 }));
            if f.rmdir {
                d.push((f.dir, 1));
            }
            Ok(Apply::Deferred)
        }
        fn setup_directory_change(&self, tx: &mut Tx, f: &DirChange) -> Result<Apply> {
            let mut d = self.drops.lock();
            if f.dotdot {
                d.push((f.old_ino, 1));
            } else if tx.kind != OpKind::Exchange {
                d.push((f.old_ino, if f.old_is_dir { 2 } else { 1 }));
                if f.old_is_dir {
                    d.push((f.dir, 1));
                }
            }
            Ok(Apply::Deferred)
        }
        fn setup_freeblocks(&self, _: &mut Tx, f: &FreeBlocks) -> Result<()> {
            if !f.freed.is_empty() {
                self.releases.lock().push(Release::Blocks(f.freed.to_vec()));
            }
            Ok(())
        }
        fn setup_freefile(&self, _: &mut Tx, f: &FreeFile) -> Result<()> {
            self.releases.lock().push(Release::Inode {
                ino: f.ino,
                is_dir: f.is_dir,
            });
            Ok(())
        }
        fn sync(&self, e: &dyn Engine, why: SyncWhy) -> Result<()> {
            // Taken out first: the engine's callbacks declare facts back to us.
            loop {
                let drops = std::mem::take(&mut *self.drops.lock());
                for (ino, n) in drops {
                    e.apply_link_drop(ino, n)?;
                }
                let releases = std::mem::take(&mut *self.releases.lock());
                if releases.is_empty() && self.drops.lock().is_empty() {
                    break;
                }
                for r in releases {
                    e.release(r)?;
                }
            }
            self.inner.sync(e, why)
        }
    }
}

/// The engine keeps the count the namespace sees apart from the one on disk, and frees
/// nothing the strategy has not released: a mode may lower on-disk link counts and clear
/// bitmap bits later than the call that caused them (soft updates does, after the removal
/// and the cleared pointers are on disk), and the file system stays consistent meanwhile.
#[test]
fn deferred_link_drops_and_frees_wait_for_the_strategy() {
    let dev = MemDevice::new(4096, 4096);
    mkfs_device(
        &dev,
        &MkfsOptions {
            blocks_per_group: Some(2048),
            ..Default::default()
        },
    )
    .unwrap();
    let d: Arc<dyn BlockDevice> = Arc::new(dev.with_block_size(4096));
    let strategy = Box::new(Deferring {
        inner: crate::strategy::Delayed,
        drops: Default::default(),
        releases: Default::default(),
    });
    let fs = Ffs::mount_device_with_strategy(d, &MountOptions::default(), strategy).unwrap();
    let c = Ctx::root();
    let free0 = fs.statfs().unwrap();
    let bits = |fs: &Ffs| {
        let st = fs.st.lock();
        (st.alloc.free_blocks(), st.alloc.free_inodes())
    };
    let bits0 = bits(&fs);
    let (f, fh) = fs.create(&c, 2, n("f"), 0o644, 0, libc::O_RDWR).unwrap();
    fs.write(f.ino, fh, 0, &[7u8; 3 * 4096]).unwrap();
    fs.release(f.ino, fh).unwrap();
    fs.link(&c, f.ino, 2, n("g")).unwrap();
    let dir = fs.mkdir(&c, 2, n("d"), 0o755, 0).unwrap().ino;
    let on_disk = |ino| fs.vol.read_disk_inode(ino).unwrap().nlink;
    // A removal: stat shows the new count at once, the disk keeps the old one.
    fs.unlink(&c, 2, n("g")).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(on_disk(f.ino), 2, "the on-disk drop waits for the strategy");
    fs.self_check().unwrap();
    // The last name goes and the kernel forgets it: nothing is freed while the on-disk
    // count still waits.
    fs.unlink(&c, 2, n("f")).unwrap();
    fs.forget(f.ino, 2);
    fs.rmdir(&c, 2, n("d")).unwrap();
    fs.forget(dir, 1);
    assert_eq!(
        fs.getattr(2).unwrap().nlink,
        3,
        "the root's count for d's '..'"
    );
    assert_eq!(on_disk(2), 4);
    fs.self_check().unwrap();
    // statfs already counts the orphans as free (as FreeBSD counts pending frees); their
    // bits are still set.
    let held = bits(&fs);
    assert!(
        held.0 < bits0.0 && held.1 < bits0.1,
        "{held:?} vs {bits0:?}"
    );
    // The strategy hands its drops and frees back: everything is as before.
    fs.sync_all().unwrap();
    assert_eq!(on_disk(2), 3);
    assert!(fs.getattr(f.ino).is_err(), "inode {} freed", f.ino);
    let after = fs.statfs().unwrap();
    assert_eq!((after.bfree, after.ffree), (free0.bfree, free0.ffree));
    assert_eq!(bits(&fs), bits0);
    fs.self_check().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let report = cairn_fsck::check(
        &dev.with_block_size(4096),
        cairn_fsck::CheckOptions::default(),
    )
    .unwrap();
    assert!(report.findings.is_empty(), "{:?}", report.findings);
}

/// A mode's own mount options reach the mode: keys no mode knows are refused when set, and
/// a mode refuses options it does not take, naming them (sync and async take none).
#[test]
fn mode_options_are_the_modes_to_check() {
    let mut o = MountOptions::default();
    assert!(
        o.set("frobnicate", None)
            .unwrap_err()
            .contains("frobnicate")
    );
    assert!(o.check().is_ok());
    o.mode_options.push(("commit".into(), Some("group".into())));
    let e = o.check().unwrap_err();
    assert!(e.contains("commit") && e.contains("sync"), "{e}");
    let e = crate::strategy::make("turbo", &[]).err().unwrap();
    assert!(e.contains("unknown mode 'turbo'"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Locks and device I/O (IoModel)

/// A device that sleeps `delay` per written block, and can hold one large write (a
/// stream's) until the test lets it go.
struct SlowDevice {
    inner: Arc<dyn BlockDevice>,
    delay_us: std::sync::atomic::AtomicU64,
    blocks_written: std::sync::atomic::AtomicU64,
    gate: parking_lot::Mutex<Option<Gate>>,
    /// Holds the first read of at least `min_blocks` blocks, as `gate` does a write.
    read_gate: parking_lot::Mutex<Option<Gate>>,
}

/// Holds the first write of at least `min_blocks` blocks: says so on `reached`, then
/// waits for `release`.
struct Gate {
    min_blocks: u64,
    reached: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
}

impl SlowDevice {
    fn over(mem: &MemDevice) -> Arc<SlowDevice> {
        Arc::new(SlowDevice {
            inner: Arc::new(mem.with_block_size(4096)),
            delay_us: Default::default(),
            blocks_written: Default::default(),
            gate: parking_lot::Mutex::new(None),
            read_gate: parking_lot::Mutex::new(None),
        })
    }
    fn set_delay(&self, d: std::time::Duration) {
        self.delay_us
            .store(d.as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
    }
    fn written(&self) -> u64 {
        self.blocks_written
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl BlockDevice for SlowDevice {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let n = (buf.len() / self.block_size() as usize) as u64;
        let gate = {
            let mut g = self.read_gate.lock();
            if g.as_ref().is_some_and(|g| n >= g.min_blocks) {
                g.take()
            } else {
                None
            }
        };
        if let Some(g) = gate {
            let _ = g.reached.send(());
            let _ = g.release.recv();
        }
        self.inner.read_blocks(block, buf)
    }
    fn write_blocks(&self, block: u64, buf: &[u8]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let n = (buf.len() / self.block_size() as usize) as u64;
        let gate = {
            let mut g = self.gate.lock();
            if g.as_ref().is_some_and(|g| n >= g.min_blocks) {
                g.take()
            } else {
                None
            }
        };
        if let Some(g) = gate {
            let _ = g.reached.send(());
            let _ = g.release.recv();
        }
        let us = self.delay_us.load(Relaxed);
        if us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(us * n));
        }
        self.blocks_written.fetch_add(n, Relaxed);
        self.inner.write_blocks(block, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn counters(&self) -> &cairn_blockdev::DeviceCounters {
        self.inner.counters()
    }
    fn set_trace(&self, sink: Option<Arc<dyn cairn_blockdev::TraceSink>>) {
        self.inner.set_trace(sink)
    }
}

fn mount_slow(mem: &MemDevice, mode: &str) -> (Arc<SlowDevice>, Arc<Ffs>) {
    let slow = SlowDevice::over(mem);
    let fs = Ffs::mount_device(
        slow.clone(),
        &MountOptions {
            mode: mode.into(),
            cache_bytes: 256 << 20,
            // Only the test's own sync(2) writes back.
            syncer_interval: Some(std::time::Duration::from_secs(86_400)),
            ..Default::default()
        },
    )
    .unwrap();
    (slow, fs)
}

/// What `stall` measured: how long the full sync took, and each create+unlink pair's
/// latency on the other thread, sorted.
struct Stall {
    sync: std::time::Duration,
    calls: Vec<std::time::Duration>,
}

impl Stall {
    fn pct(&self, p: usize) -> std::time::Duration {
        self.calls[(self.calls.len() * p / 100).min(self.calls.len() - 1)]
    }
    fn max(&self) -> std::time::Duration {
        *self.calls.last().unwrap()
    }
}

/// `dirty` cached data blocks, a device that takes 2 ms per written block; thread A runs
/// a full sync (sync(2)) while this thread, once A's write-back has begun, does `pairs`
/// create+unlink pairs in a directory of their own, timing each pair.
fn stall(mode: &str, dirty: u64, pairs: usize) -> Stall {
    use std::time::{Duration, Instant};
    let mem = MemDevice::new(4096, 16384);
    mkfs_device(
        &mem,
        &MkfsOptions {
            blocks_per_group: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    let (slow, fs) = mount_slow(&mem, mode);
    let c = Ctx::root();
    let (f, fh) = fs.create(&c, 2, n("big"), 0o644, 0, libc::O_RDWR).unwrap();
    // 64 KiB writes stay in the cache (a stream starts at 256 KiB).
    for i in 0..dirty / 16 {
        fs.write(f.ino, fh, i * 65536, &[7u8; 65536]).unwrap();
    }
    let d = fs.mkdir(&c, 2, n("b"), 0o755, 0).unwrap().ino;
    slow.set_delay(Duration::from_millis(2));
    let start = slow.written();
    let syncer = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            fs.sync_all().unwrap();
            t.elapsed()
        })
    };
    while slow.written() == start && !syncer.is_finished() {
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut calls = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let t = Instant::now();
        let name = format!("f{i}");
        let (a, h) = fs.create(&c, d, n(&name), 0o644, 0, libc::O_RDWR).unwrap();
        fs.release(a.ino, h).unwrap();
        fs.unlink(&c, d, n(&name)).unwrap();
        fs.forget(a.ino, 1);
        calls.push(t.elapsed());
    }
    let sync = syncer.join().unwrap();
    calls.sort();
    slow.set_delay(Duration::ZERO);
    fs.release(f.ino, fh).unwrap();
    fs.unmount().unwrap();
    Stall { sync, calls }
}

/// In a `Concurrent` mode a full sync holds no engine lock across its device writes, so
/// calls on another thread go on meanwhile: the worst create+unlink stays far below the
/// sync's duration. In `sync` (`Serialized`) the same calls wait for the whole write-back:
/// its honest cost, documented here by the opposite assertion.
#[test]
fn syncer_does_not_stall_calls() {
    for mode in ["async", "sync"] {
        let s = stall(mode, 1024, 200);
        println!(
            "{mode}: full sync of 1024 dirty blocks {:?}; 200 create+unlink pairs meanwhile: \
             p50 {:?}, p99 {:?}, max {:?}",
            s.sync,
            s.pct(50),
            s.pct(99),
            s.max()
        );
        match mode {
            "async" => assert!(
                s.max() * 10 < s.sync,
                "async: a call stalled behind the sync: max {:?}, sync {:?}",
                s.max(),
                s.sync
            ),
            _ => assert!(
                s.max() * 2 > s.sync,
                "sync: calls are expected to wait for the write-back: max {:?}, sync {:?}",
                s.max(),
                s.sync
            ),
        }
    }
}

/// A stream writes into a hole of a file, into blocks another file freed (their old bytes
/// still on the device). While its data is on the way to the device — no engine lock held
/// in `async` — a read of the range sees the hole's zeros or the new bytes, never the
/// freed file's: reads take the file's lock shared, writes exclusively.
#[test]
fn read_during_stream_sees_old_or_new_never_foreign() {
    use std::time::Duration;
    for mode in ["async", "sync"] {
        let mem = MemDevice::new(4096, 8192);
        mkfs_device(
            &mem,
            &MkfsOptions {
                blocks_per_group: Some(8192),
                ..Default::default()
            },
        )
        .unwrap();
        let (slow, fs) = mount_slow(&mem, mode);
        let c = Ctx::root();
        const LEN: usize = 4 << 20;
        let (g, gh) = fs.create(&c, 2, n("g"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(g.ino, gh, 0, &vec![b'G'; LEN]).unwrap();
        fs.sync_all().unwrap();
        fs.release(g.ino, gh).unwrap();
        fs.unlink(&c, 2, n("g")).unwrap();
        fs.forget(g.ino, 1);
        let (f, fh) = fs.create(&c, 2, n("f"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.setattr(
            &c,
            f.ino,
            SetAttr {
                size: Some(LEN as u64),
                ..Default::default()
            },
        )
        .unwrap();
        let (reached_tx, reached_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        *slow.gate.lock() = Some(Gate {
            min_blocks: 64,
            reached: reached_tx,
            release: release_rx,
        });
        let writer = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.write(f.ino, fh, 0, &vec![b'N'; LEN]).unwrap())
        };
        reached_rx.recv().unwrap(); // the stream's first run is on its way to the device
        let reader = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                fs.read(f.ino, fh, 0, LEN as u32, &mut buf).unwrap();
                buf
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        release_tx.send(()).unwrap();
        assert_eq!(writer.join().unwrap() as usize, LEN);
        let seen = reader.join().unwrap();
        assert_eq!(seen.len(), LEN);
        for (i, blk) in seen.chunks(4096).enumerate() {
            assert!(
                blk.iter().all(|&b| b == 0) || blk.iter().all(|&b| b == b'N'),
                "{mode}: block {i} of the file read as {:?}… during the stream",
                &blk[..8]
            );
        }
        fs.release(f.ino, fh).unwrap();
        fs.unmount().unwrap();
    }
}

/// A read's device reads run without the engine's lock in a `Concurrent` mode; meanwhile
/// the file loses its last name, handle and lookup. Its blocks must stay its own until the
/// read is done (the read's hold, `InCore::writing`): freed at once, a new file's stream
/// could take them and the read would return that file's bytes. After the read the file is
/// freed all the same (the hold's end reclaims it): no block leaks.
#[test]
fn a_read_off_the_lock_keeps_the_files_blocks_until_it_is_done() {
    for mode in ["async", "softdep", "sync"] {
        let mem = MemDevice::new(4096, 8192);
        mkfs_device(
            &mem,
            &MkfsOptions {
                blocks_per_group: Some(8192),
                ..Default::default()
            },
        )
        .unwrap();
        let (slow, fs) = mount_slow(&mem, mode);
        let c = Ctx::root();
        const LEN: usize = 1 << 20;
        fs.sync_all().unwrap();
        let free0 = fs.statfs().unwrap().bfree;
        let (f, fh) = fs.create(&c, 2, n("f"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(f.ino, fh, 0, &vec![b'F'; LEN]).unwrap();
        // Made now, so that it cannot take f's inode number (and its file lock).
        let (g, gh) = fs.create(&c, 2, n("g"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.sync_all().unwrap();
        let (reached_tx, reached_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        *slow.read_gate.lock() = Some(Gate {
            min_blocks: 64,
            reached: reached_tx,
            release: release_rx,
        });
        let reader = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                fs.read(f.ino, fh, 0, LEN as u32, &mut buf).map(|()| buf)
            })
        };
        // In a `Serialized` mode the read holds the engine's lock at the gate: nothing
        // else can run, so the gate opens after a while and the rest follows the read.
        let gated = reached_rx
            .recv_timeout(std::time::Duration::from_secs(2))
            .is_ok();
        let other = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let c = Ctx::root();
                fs.release(f.ino, fh).unwrap();
                fs.unlink(&c, 2, n("f")).unwrap();
                fs.forget(f.ino, 1);
                fs.write(g.ino, gh, 0, &vec![b'G'; LEN]).unwrap();
                fs.release(g.ino, gh).unwrap();
            })
        };
        if gated && mode != "sync" {
            // The other thread's calls all run while the read is at the gate.
            let t = std::time::Instant::now();
            while !other.is_finished() && t.elapsed() < std::time::Duration::from_secs(5) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            assert!(
                other.is_finished(),
                "{mode}: calls on other files waited for a read"
            );
        }
        release_tx.send(()).unwrap();
        let seen = reader.join().unwrap().unwrap();
        other.join().unwrap();
        assert_eq!(seen.len(), LEN);
        for (i, blk) in seen.chunks(4096).enumerate() {
            assert!(
                blk.iter().all(|&b| b == b'F'),
                "{mode}: block {i} of f read as {:?}… (another file's bytes)",
                &blk[..8]
            );
        }
        fs.unlink(&c, 2, n("g")).unwrap();
        fs.forget(g.ino, 1);
        fs.sync_all().unwrap();
        assert_eq!(fs.statfs().unwrap().bfree, free0, "{mode}: blocks leaked");
        fs.unmount().unwrap();
    }
}

/// Looking up many cold files reads their inode table blocks a cluster at a time
/// (`INODE_CLUSTER`), not one device read per 16 inodes, and every inode comes back as
/// written.
#[test]
fn cold_inodes_are_read_a_cluster_at_a_time() {
    const FILES: usize = 512; // 32 table blocks of 16 inodes
    for mode in ["async", "softdep", "sync", "journal"] {
        let dev = fresh_with_log();
        let fs = mount(&dev, mode);
        let c = Ctx::root();
        let d = fs.mkdir(&c, 2, n("d"), 0o755, 0).unwrap();
        for i in 0..FILES {
            let (a, fh) = fs
                .create(&c, d.ino, n(&format!("f{i}")), 0o644, 0, libc::O_RDWR)
                .unwrap();
            fs.write(a.ino, fh, 0, &vec![7u8; i + 1]).unwrap();
            fs.release(a.ino, fh).unwrap();
        }
        fs.unmount().unwrap();

        let fs = mount(&dev, mode);
        // The last name first: its lookup reads every directory block (and one cluster),
        // so what is counted below is the other files' inodes.
        let d = fs.lookup(&c, 2, n("d")).unwrap();
        fs.lookup(&c, d.ino, n(&format!("f{}", FILES - 1))).unwrap();
        let before = fs.dev.counters().snapshot();
        for i in 0..FILES - 1 {
            let a = fs.lookup(&c, d.ino, n(&format!("f{i}"))).unwrap();
            assert_eq!(a.size, i as u64 + 1, "{mode}: f{i}");
        }
        let reads = fs.dev.counters().snapshot().delta(&before).reads;
        // 32 table blocks in clusters of 8, one of which may straddle a boundary; read one
        // at a time, 31.
        assert_eq!(crate::volume::INODE_CLUSTER, 8);
        let most = 5;
        assert!(
            reads <= most,
            "{mode}: {reads} device reads for {FILES} cold inodes"
        );
        fs.unmount().unwrap();
    }
}

/// A cold sequential read of a file written as one stream costs one device read per run of
/// contiguous blocks (a request's run stops only at an indirect block between two runs of
/// data), not one per block; and a read that crosses holes, cached blocks and blocks
/// elsewhere on the device returns the file's bytes, into a buffer that held another
/// file's bytes before (a reply's buffer is reused without being zeroed).
#[test]
fn reads_cluster_and_return_the_files_bytes_across_holes_and_cached_blocks() {
    for mode in ["async", "softdep", "sync", "journal"] {
        let dev = fresh_with_log();
        let fs = mount(&dev, mode);
        let c = Ctx::root();
        const BS: usize = 4096;
        const N: usize = 512; // 2 MiB: past the direct blocks and one indirect block
        let mut model = vec![0u8; N * BS];
        for (i, b) in model.chunks_mut(BS).enumerate() {
            b.fill(i as u8 | 1);
        }
        let (f, fh) = fs.create(&c, 2, n("f"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(f.ino, fh, 0, &model).unwrap();
        fs.release(f.ino, fh).unwrap();
        fs.unmount().unwrap();

        let fs = mount(&dev, mode);
        let fh = fs.open(&c, f.ino, libc::O_RDONLY).unwrap();
        let before = fs.dev.counters().snapshot();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for off in (0..N * BS).step_by(256 << 10) {
            fs.read(f.ino, fh, off as u64, 256 << 10, &mut buf).unwrap();
            got.extend_from_slice(&buf);
        }
        let reads = fs.dev.counters().snapshot().delta(&before).reads;
        assert!(got == model, "{mode}: the cold sequential read differs");
        // 8 requests, each one run but where an indirect block sits between two runs.
        assert!(reads <= 16, "{mode}: {reads} device reads for {N} blocks");
        fs.release(f.ino, fh).unwrap();
        fs.unmount().unwrap();

        // Holes (a punched block, a region past a truncate-extend), a cached block
        // (rewritten in part: a small write stays in the cache), a block moved elsewhere
        // (a hole filled later by a small write: allocated apart from its neighbours).
        let fs = mount(&dev, mode);
        let fh = fs.open(&c, f.ino, libc::O_RDWR).unwrap();
        fs.fallocate(
            f.ino,
            fh,
            (10 * BS) as u64,
            (3 * BS) as u64,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )
        .unwrap();
        model[10 * BS..13 * BS].fill(0);
        fs.write(f.ino, fh, (11 * BS + 100) as u64, b"moved")
            .unwrap();
        model[11 * BS + 100..11 * BS + 105].copy_from_slice(b"moved");
        fs.write(f.ino, fh, (20 * BS + 7) as u64, b"cached")
            .unwrap();
        model[20 * BS + 7..20 * BS + 13].copy_from_slice(b"cached");
        let grown = (N + 5) * BS;
        fs.setattr(
            &c,
            f.ino,
            SetAttr {
                size: Some(grown as u64),
                ..Default::default()
            },
        )
        .unwrap();
        model.resize(grown, 0);
        // The reused buffer holds nonzero bytes from a read of the whole file.
        let mut buf = Vec::new();
        fs.read(f.ino, fh, 0, (N * BS) as u32, &mut buf).unwrap();
        assert!(buf[..] == model[..N * BS], "{mode}: whole-file read");
        for (off, len) in [
            (9 * BS + 5, 5 * BS),
            (11 * BS + 99, 7),
            (19 * BS, 3 * BS),
            (N * BS - 10, 5 * BS + 10),
            (0, 64),
        ] {
            fs.read(f.ino, fh, off as u64, len as u32, &mut buf)
                .unwrap();
            assert!(
                buf[..] == model[off..off + len],
                "{mode}: read of {len} bytes at {off}"
            );
        }
        fs.release(f.ino, fh).unwrap();
        fs.unmount().unwrap();
    }
}

/// renameat2(RENAME_WHITEOUT) in every mode: the old name names a new whiteout (a character
/// device 0/0, no permission bits, owned by the caller) and the moved inode keeps its link
/// count; a replaced target goes as in a rename; a directory's parents count its `..` as
/// in a rename (a whiteout is no subdirectory); NOREPLACE is allowed with it, EXCHANGE is
/// not; without CAP_MKNOD nothing changes (EPERM). fsck finds the image clean and the
/// whiteouts are still there after a remount.
#[test]
fn rename_whiteout_leaves_a_whiteout_at_the_old_name() {
    use cairn_vfs::FileKind;
    for mode in ["sync", "async", "softdep", "journal"] {
        let dev = fresh_with_log();
        let fs = mount(&dev, mode);
        let c = Ctx {
            gid: 7,
            ..Ctx::root()
        };
        let wo = RenameFlags {
            whiteout: true,
            ..Default::default()
        };
        let is_whiteout = |fs: &Ffs, dir: u64, name: &str| {
            let w = fs.lookup(&c, dir, n(name)).unwrap();
            (w.kind, w.rdev, w.perm, w.nlink, w.uid, w.gid, w.size)
                == (FileKind::CharDevice, 0, 0, 1, 0, 7, 0)
        };
        let d = fs.mkdir(&c, 2, n("d"), 0o755, 0).unwrap().ino;
        let e = fs.mkdir(&c, 2, n("e"), 0o777, 0).unwrap().ino;
        let a = fs
            .mknod(&c, d, n("a"), libc::S_IFREG | 0o644, 0, 0)
            .unwrap();
        let size = |dir: u64| fs.getattr(dir).unwrap().size;
        let (dsize, esize) = (size(d), size(e));
        // A file to another directory.
        fs.rename(&c, d, n("a"), e, n("a2"), wo).unwrap();
        assert!(is_whiteout(&fs, d, "a"), "{mode}");
        let w = fs.lookup(&c, d, n("a")).unwrap().ino;
        assert_ne!(w, a.ino);
        assert_eq!(fs.lookup(&c, e, n("a2")).unwrap().ino, a.ino);
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 1, "{mode}");
        assert_eq!((size(d), size(e)), (dsize, esize));
        // Over an existing target: the target goes as in a rename.
        let b = fs
            .mknod(&c, e, n("b"), libc::S_IFREG | 0o644, 0, 0)
            .unwrap();
        fs.rename(&c, e, n("a2"), e, n("b"), wo).unwrap();
        assert_eq!(fs.lookup(&c, e, n("b")).unwrap().ino, a.ino);
        assert!(is_whiteout(&fs, e, "a2"), "{mode}");
        assert_eq!(
            fs.getattr(b.ino).unwrap().nlink,
            0,
            "{mode}: the victim's name went"
        );
        fs.forget(b.ino, 1);
        assert_eq!(
            errno(fs.getattr(b.ino)),
            Errno::ENOENT,
            "{mode}: victim freed"
        );
        // NOREPLACE with WHITEOUT: EEXIST over a name, a whiteout onto a free one.
        let nrwo = RenameFlags {
            noreplace: true,
            ..wo
        };
        assert_eq!(
            errno(fs.rename(&c, e, n("b"), e, n("a2"), nrwo)),
            Errno::EEXIST
        );
        fs.rename(&c, e, n("b"), d, n("c"), nrwo).unwrap();
        assert!(is_whiteout(&fs, e, "b"), "{mode}");
        // EXCHANGE with WHITEOUT: EINVAL, nothing changed.
        let exwo = RenameFlags {
            exchange: true,
            ..wo
        };
        assert_eq!(
            errno(fs.rename(&c, d, n("c"), e, n("b"), exwo)),
            Errno::EINVAL
        );
        assert_eq!(fs.lookup(&c, d, n("c")).unwrap().ino, a.ino);
        // A directory to another parent: the counts of a rename; the whiteout is none.
        let sub = fs.mkdir(&c, d, n("sub"), 0o755, 0).unwrap().ino;
        let links = |dir: u64| fs.getattr(dir).unwrap().nlink;
        assert_eq!((links(d), links(e)), (3, 2));
        fs.rename(&c, d, n("sub"), e, n("sub"), wo).unwrap();
        assert_eq!((links(d), links(e), links(sub)), (2, 3, 2), "{mode}");
        assert_eq!(fs.lookup(&c, sub, n("..")).unwrap().ino, e);
        assert!(is_whiteout(&fs, d, "sub"), "{mode}");
        // Within one parent.
        fs.rename(&c, e, n("sub"), e, n("sub2"), wo).unwrap();
        assert_eq!((links(e), links(sub)), (3, 2), "{mode}");
        assert!(is_whiteout(&fs, e, "sub"), "{mode}");
        // Without CAP_MKNOD: EPERM, nothing changed.
        let u = Ctx::user(1000, 1000);
        let f = fs
            .mknod(&u, e, n("u"), libc::S_IFREG | 0o644, 0, 0)
            .unwrap();
        assert_eq!(
            errno(fs.rename(&u, e, n("u"), e, n("u2"), wo)),
            Errno::EPERM
        );
        assert_eq!(fs.lookup(&c, e, n("u")).unwrap().ino, f.ino);
        assert_eq!(errno(fs.lookup(&c, e, n("u2"))), Errno::ENOENT);
        fs.self_check().unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let report = cairn_fsck::check(
            &dev.with_block_size(4096),
            cairn_fsck::CheckOptions::default(),
        )
        .unwrap();
        assert!(report.findings.is_empty(), "{mode}: {:?}", report.findings);
        let fs = mount(&dev, mode);
        for (dir, name) in [(d, "a"), (e, "a2"), (e, "b"), (d, "sub"), (e, "sub")] {
            assert!(is_whiteout(&fs, dir, name), "{mode}: {name} after remount");
        }
        assert_eq!(fs.getattr(d).unwrap().nlink, 2);
        assert_eq!(fs.getattr(e).unwrap().nlink, 3);
        fs.unmount().unwrap();
    }
}
