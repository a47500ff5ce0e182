//! The engine on damaged images: random bytes flipped in a populated image, then mount,
//! walk every file and make a few changes. Errors are fine (EUCLEAN, EIO, ENOENT...);
//! a panic, a hang or an out-of-bounds read is not. The seed is printed for replay
//! (CAIRN_HOSTILE_SEED, CAIRN_HOSTILE_ITERS).

use std::ffi::OsStr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_ffs::{Ffs, MkfsOptions, MountOptions, mkfs_device};
use cairn_vfs::{Ctx, FileSystem};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn populated() -> Vec<u8> {
    let dev = MemDevice::new(4096, 2048);
    mkfs_device(
        &dev,
        &MkfsOptions {
            blocks_per_group: Some(512),
            ..Default::default()
        },
    )
    .unwrap();
    let d: Arc<dyn BlockDevice> = Arc::new(dev.with_block_size(4096));
    let fs = Ffs::mount_device(
        d,
        &MountOptions {
            mode: "async".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let c = Ctx::root();
    let mut dirs = vec![2u64];
    for i in 0..6 {
        let parent = dirs[i % dirs.len()];
        let d = fs
            .mkdir(&c, parent, OsStr::new(&format!("d{i}")), 0o755, 0)
            .unwrap();
        dirs.push(d.ino);
        for j in 0..15 {
            let (f, fh) = fs
                .create(
                    &c,
                    d.ino,
                    OsStr::new(&format!("f{j}")),
                    0o644,
                    0,
                    libc::O_RDWR,
                )
                .unwrap();
            let len = (j * 7919) % 70_000;
            fs.write(f.ino, fh, 0, &vec![j as u8; len]).unwrap();
            fs.release(f.ino, fh).unwrap();
        }
        fs.symlink(&c, d.ino, OsStr::new("s"), &[b'x'; 200])
            .unwrap();
        fs.setxattr(&c, d.ino, OsStr::new("user.k"), b"v", 0)
            .unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    dev.to_bytes()
}

/// Walks the whole tree, reading everything; then changes a few things. Returns the
/// number of errors seen (not a failure: damaged images give errors).
fn exercise(fs: &Ffs) -> usize {
    let c = Ctx::root();
    let mut errors = 0;
    let mut stack = vec![fs.root_ino()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        seen += 1;
        if seen > 10_000 {
            break;
        }
        let mut names = Vec::new();
        let r = fs.readdir(dir, 0, 0, true, &mut |e| {
            names.push((e.name.to_owned(), e.ino, e.kind));
            names.len() < 5000
        });
        errors += r.is_err() as usize;
        for (name, _, _) in names {
            if name == "." || name == ".." {
                continue;
            }
            match fs.lookup(&c, dir, &name) {
                Ok(a) => match a.kind {
                    cairn_vfs::FileKind::Directory => stack.push(a.ino),
                    cairn_vfs::FileKind::Symlink => errors += fs.readlink(a.ino).is_err() as usize,
                    _ => {
                        let mut buf = Vec::new();
                        errors += fs.read(a.ino, 0, 0, 1 << 20, &mut buf).is_err() as usize;
                        errors += fs.listxattr(&c, a.ino).is_err() as usize;
                    }
                },
                Err(_) => errors += 1,
            }
        }
        errors += fs
            .create(&c, dir, OsStr::new("new"), 0o644, 0, libc::O_RDWR)
            .is_err() as usize;
        errors += fs.unlink(&c, dir, OsStr::new("new")).is_err() as usize;
    }
    errors += fs.mkdir(&c, 2, OsStr::new("fresh"), 0o755, 0).is_err() as usize;
    errors += fs.statfs().is_err() as usize;
    errors
}

#[test]
fn damaged_images_give_errors_never_panics() {
    let seed: u64 = std::env::var("CAIRN_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    let iters: usize = std::env::var("CAIRN_HOSTILE_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    println!(
        "hostile images: seed {seed} (CAIRN_HOSTILE_SEED={seed} to replay), {iters} iterations"
    );
    let base = populated();
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut refused, mut errors) = (0, 0);
    for it in 0..iters {
        let mut img = base.clone();
        // Damage the metadata-rich first blocks of each group and some random blocks.
        for _ in 0..rng.random_range(1..40) {
            let blk = if rng.random_bool(0.7) {
                let g = rng.random_range(0..4u64);
                g * 512 + rng.random_range(0..40u64)
            } else {
                rng.random_range(0..2048u64)
            };
            let off = blk as usize * 4096 + rng.random_range(0..4096usize);
            img[off] ^= 1 << rng.random_range(0..8);
            if rng.random_bool(0.1) {
                img[off] = rng.random();
            }
        }
        let r = catch_unwind(AssertUnwindSafe(|| {
            let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(4096, img));
            match Ffs::mount_device(
                dev,
                &MountOptions {
                    mode: "sync".into(),
                    ..Default::default()
                },
            ) {
                Ok(fs) => {
                    let e = exercise(&fs);
                    let _ = fs.unmount();
                    (false, e)
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert!(!msg.contains('\n'), "a refusal is one line: {msg}");
                    (true, 0)
                }
            }
        }));
        match r {
            Ok((r, e)) => {
                refused += r as usize;
                errors += e;
            }
            Err(_) => panic!("iteration {it} panicked: replay with CAIRN_HOSTILE_SEED={seed}"),
        }
    }
    println!(
        "{refused} of {iters} images refused at mount; {errors} operation errors on the others"
    );
}
