//! fsck against images the engine wrote: the two must agree on the format, and what a
//! crash in `sync` mode leaves must be leaks only.

use std::ffi::OsStr;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_ffs::{Ffs, MkfsOptions, MountOptions, mkfs_device};
use cairn_fsck::{CheckOptions, Class, Report, check};
use cairn_vfs::{Ctx, FileSystem, RenameFlags};
use rand::{Rng, SeedableRng};

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn fresh() -> MemDevice {
    let dev = MemDevice::new(4096, 16384);
    mkfs_device(
        &dev,
        &MkfsOptions {
            blocks_per_group: Some(4096),
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

fn data(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// A bit of everything the engine can write.
fn populate(fs: &Ffs) {
    let c = Ctx::root();
    let d1 = fs.mkdir(&c, 2, n("d1"), 0o755, 0).unwrap().ino;
    let d2 = fs.mkdir(&c, d1, n("d2"), 0o755, 0).unwrap().ino;
    let d3 = fs.mkdir(&c, 2, n("d3"), 0o755, 0).unwrap().ino;
    for (i, len) in [0usize, 100, 50_000, 5 << 20].into_iter().enumerate() {
        let (f, fh) = fs
            .create(&c, d1, n(&format!("f{i}")), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(f.ino, fh, 0, &data(i as u32, len)).unwrap();
        fs.release(f.ino, fh).unwrap();
    }
    // Sparse, reaching the double-indirect range.
    let (f, fh) = fs
        .create(&c, d2, n("sparse"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    fs.write(f.ino, fh, 100 << 20, b"tail").unwrap();
    fs.write(f.ino, fh, 3 << 20, b"middle").unwrap();
    // Preallocated past EOF.
    fs.fallocate(f.ino, fh, 200 << 20, 65536, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    fs.release(f.ino, fh).unwrap();
    fs.symlink(&c, d3, n("fast"), b"../d1/f1").unwrap();
    fs.symlink(&c, d3, n("slow"), &[b'y'; 300]).unwrap();
    fs.mknod(&c, d3, n("fifo"), libc::S_IFIFO | 0o644, 0, 0)
        .unwrap();
    fs.mknod(&c, d3, n("null"), libc::S_IFCHR | 0o666, 0, 0x103)
        .unwrap();
    let f1 = fs.lookup(&c, d1, n("f1")).unwrap().ino;
    fs.link(&c, f1, d2, n("f1-link")).unwrap();
    fs.setxattr(&c, f1, n("user.note"), b"hello", 0).unwrap();
    // A big directory, then half of it removed.
    let big = fs.mkdir(&c, 2, n("many"), 0o755, 0).unwrap().ino;
    for i in 0..400 {
        let (f, fh) = fs
            .create(
                &c,
                big,
                n(&format!("file-with-a-longish-name-{i}")),
                0o644,
                0,
                libc::O_RDWR,
            )
            .unwrap();
        fs.release(f.ino, fh).unwrap();
    }
    for i in (0..400).step_by(2) {
        fs.unlink(&c, big, n(&format!("file-with-a-longish-name-{i}")))
            .unwrap();
    }
    // Renames: a file across directories, a directory across directories, over a target.
    fs.rename(&c, d1, n("f2"), d3, n("f2-moved"), RenameFlags::default())
        .unwrap();
    fs.rename(&c, d1, n("d2"), d3, n("d2-moved"), RenameFlags::default())
        .unwrap();
    fs.rename(&c, d1, n("f0"), d3, n("fast"), RenameFlags::default())
        .unwrap();
    let gone = fs.mkdir(&c, 2, n("gone"), 0o755, 0).unwrap();
    let _ = gone;
    fs.rmdir(&c, 2, n("gone")).unwrap();
}

fn run(bytes: &[u8], repair: bool) -> (Report, Vec<u8>) {
    let dev = MemDevice::from_bytes(4096, bytes.to_vec());
    let r = check(
        &dev,
        CheckOptions {
            repair,
            progress: None,
            ..Default::default()
        },
    )
    .expect("check runs");
    (r, dev.to_bytes())
}

fn show(r: &Report) -> String {
    r.findings
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn engine_images_are_clean_in_every_mode() {
    for mode in ["sync", "async"] {
        let dev = fresh();
        let (r, _) = run(&dev.to_bytes(), false);
        assert!(r.is_clean(), "fresh mkfs: {}", show(&r));
        let fs = mount(&dev, mode);
        populate(&fs);
        fs.unmount().unwrap();
        drop(fs);
        let (r, _) = run(&dev.to_bytes(), false);
        assert!(r.is_clean(), "{mode}: {}", show(&r));
        assert_eq!(r.stats.dirs, 6, "{mode}");
    }
}

#[test]
fn sync_mode_crash_leaves_only_leaks() {
    let dev = fresh();
    let fs = mount(&dev, "sync");
    populate(&fs);
    let c = Ctx::root();
    // A file unlinked while open: its inode lives on with link count 0 until release.
    let (f, fh) = fs
        .create(&c, 2, n("open-unlinked"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    fs.write(f.ino, fh, 0, &data(9, 20_000)).unwrap();
    fs.fsync(f.ino, fh, false).unwrap();
    fs.unlink(&c, 2, n("open-unlinked")).unwrap();
    // "Crash": take the device contents as they are now, without unmounting.
    let snapshot = dev.to_bytes();
    let (r, _) = run(&snapshot, false);
    assert!(r.corruptions().next().is_none(), "{}", show(&r));
    assert!(
        r.leaks()
            .any(|l| l.message.contains(&format!("unreferenced inode {}", f.ino))),
        "{}",
        show(&r)
    );
    let (r, repaired) = run(&snapshot, true);
    assert_eq!(r.exit_code(), 1, "{}", show(&r));
    let (r, _) = run(&repaired, false);
    assert!(r.is_clean(), "{}", show(&r));
    fs.release(f.ino, fh).unwrap();
    fs.unmount().unwrap();
}

#[test]
fn repaired_image_mounts_and_keeps_data() {
    let dev = fresh();
    let fs = mount(&dev, "sync");
    populate(&fs);
    fs.unmount().unwrap();
    drop(fs);
    // Lose the name of d1 (it holds f1 and f3): d1 goes to lost+found with its files.
    let mut bytes = dev.to_bytes();
    {
        let img = MemDevice::from_bytes(4096, bytes.clone());
        let fs = mount(&img, "sync");
        let c = Ctx::root();
        let d1 = fs.lookup(&c, 2, n("d1")).unwrap().ino;
        fs.unmount().unwrap();
        drop(fs);
        bytes = img.to_bytes();
        // Find the root directory's first block and blank d1's entry name byte by byte.
        let root_blk = u64::from_le_bytes(inode_raw(&bytes, 2)[80..88].try_into().unwrap());
        let blk = &mut bytes[root_blk as usize * 4096..(root_blk as usize + 1) * 4096];
        let e = cairn_ffs::format::dir::entries(blk)
            .flatten()
            .find(|e| e.ino as u64 == d1)
            .unwrap()
            .off;
        cairn_ffs::format::dir::remove(blk, e).unwrap();
    }
    let (r, _) = run(&bytes, false);
    assert!(
        r.findings
            .iter()
            .any(|f| f.class == Class::Corruption && f.message.contains("unreachable directory")),
        "{}",
        show(&r)
    );
    let (_, repaired) = run(&bytes, true);
    let (r, _) = run(&repaired, false);
    assert!(r.is_clean(), "{}", show(&r));
    let img = MemDevice::from_bytes(4096, repaired);
    let fs = mount(&img, "sync");
    let c = Ctx::root();
    let lf = fs.lookup(&c, 2, n("lost+found")).unwrap().ino;
    let entries = list(&*fs, lf);
    assert_eq!(entries.len(), 1, "{entries:?}");
    let d1 = fs.lookup(&c, lf, n(&entries[0])).unwrap().ino;
    let f3 = fs.lookup(&c, d1, n("f3")).unwrap().ino;
    let fh = fs.open(&c, f3, libc::O_RDONLY).unwrap();
    let mut buf = Vec::new();
    fs.read(f3, fh, 0, 6 << 20, &mut buf).unwrap();
    assert_eq!(buf, data(3, 5 << 20));
    fs.release(f3, fh).unwrap();
    fs.unmount().unwrap();
}

fn list(fs: &dyn FileSystem, dir: u64) -> Vec<String> {
    let c = Ctx::root();
    let fh = fs.opendir(&c, dir).unwrap();
    let mut names = Vec::new();
    fs.readdir(dir, fh, 0, false, &mut |e| {
        let s = e.name.to_string_lossy().into_owned();
        if s != "." && s != ".." {
            names.push(s);
        }
        true
    })
    .unwrap();
    fs.releasedir(dir, fh).unwrap();
    names
}

fn inode_raw(bytes: &[u8], ino: u64) -> Vec<u8> {
    let sb = cairn_ffs::format::Superblock::decode(&bytes[..512]).unwrap();
    let g = sb.geometry().unwrap();
    let (blk, off) = g.inode_location(ino);
    bytes[blk as usize * 4096 + off..blk as usize * 4096 + off + 256].to_vec()
}

/// Random byte flips in an engine-written image: check terminates, repair converges, and
/// the engine mounts the result and can list the root.
#[test]
fn random_flips_on_engine_image() {
    let dev = fresh();
    let fs = mount(&dev, "sync");
    populate(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let base = dev.to_bytes();
    let used: Vec<usize> = (0..base.len() / 4096)
        .filter(|&b| base[b * 4096..(b + 1) * 4096].iter().any(|&x| x != 0))
        .collect();
    let seed0: u64 = std::env::var("CAIRN_FSCK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let iters: u64 = std::env::var("CAIRN_FSCK_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    println!("random_flips_on_engine_image seed {seed0}");
    for it in 0..iters {
        let seed = seed0.wrapping_add(it);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut bytes = base.clone();
        for _ in 0..rng.random_range(1..=32) {
            let b = used[rng.random_range(0..used.len())];
            let off = b * 4096 + rng.random_range(0..4096);
            bytes[off] ^= 1 << rng.random_range(0..8);
        }
        let dev = MemDevice::from_bytes(4096, bytes);
        let Ok(r) = check(
            &dev,
            CheckOptions {
                repair: true,
                progress: None,
                ..Default::default()
            },
        ) else {
            continue;
        };
        let (r2, _) = run(&dev.to_bytes(), false);
        assert!(
            r2.is_clean(),
            "seed {seed}: {}\nfirst run:\n{}",
            show(&r2),
            show(&r)
        );
        let fs = mount(&dev, "sync");
        let _ = list(&*fs, 2);
        fs.unmount().unwrap();
    }
}
