//! What the engine costs per operation on a memory device, without FUSE: a create/unlink
//! loop, small overwrites of cached blocks and a rename loop, in both modes. Prints the
//! thread's CPU time per operation (best of 5; CPU time rather than wall-clock time, so other
//! work on a shared machine disturbs it less); asserts nothing. Run with
//! `cargo test -p cairn-ffs --release --test op_cost -- --ignored --nocapture`.
#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_ffs::{Ffs, MkfsOptions, MountOptions, mkfs_device};
use cairn_vfs::{Ctx, FileSystem, RenameFlags};

fn mount(mode: &str) -> Arc<Ffs> {
    let dev = MemDevice::new(4096, 65536);
    mkfs_device(&dev, &MkfsOptions::default()).unwrap();
    let d: Arc<dyn BlockDevice> = Arc::new(dev);
    Ffs::mount_device(
        d,
        &MountOptions {
            mode: mode.into(),
            ..Default::default()
        },
    )
    .unwrap()
}

/// CPU time this thread has used.
fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer to a local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

struct Clock(f64);

impl Clock {
    fn start() -> Clock {
        Clock(cpu_now())
    }
    fn us_per(&self, n: usize) -> f64 {
        (cpu_now() - self.0) * 1e6 / n as f64
    }
}

fn best_of(runs: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..runs).map(|_| f()).fold(f64::MAX, f64::min)
}

#[test]
#[ignore = "timing; run with --ignored --nocapture in release"]
fn op_cost() {
    let c = Ctx::root();
    for mode in ["async", "sync"] {
        let fs = mount(mode);
        let dir = fs.mkdir(&c, 2, OsStr::new("d"), 0o755, 0).unwrap().ino;
        let n = if mode == "async" { 10_000 } else { 1_000 };
        let names: Vec<String> = (0..n).map(|i| format!("file-{i:06}")).collect();
        let us = best_of(5, || {
            let t = Clock::start();
            let mut inos = Vec::with_capacity(names.len());
            for name in &names {
                let (a, fh) = fs
                    .create(&c, dir, OsStr::new(name), 0o644, 0, libc::O_RDWR)
                    .unwrap();
                fs.release(a.ino, fh).unwrap();
                inos.push(a.ino);
            }
            for (name, ino) in names.iter().zip(inos) {
                fs.unlink(&c, dir, OsStr::new(name)).unwrap();
                // The kernel's reference from create, as FUSE's FORGET drops it.
                fs.forget(ino, 1);
            }
            t.us_per(n)
        });
        println!("{mode}: create+release+unlink: {us:.2} us per file");
        let (f, fh) = fs
            .create(&c, dir, OsStr::new("big"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(f.ino, fh, 0, &vec![1u8; 1 << 20]).unwrap();
        let block = vec![7u8; 4096];
        let us = best_of(5, || {
            let t = Clock::start();
            for i in 0..20_000u64 {
                fs.write(f.ino, fh, (i % 256) * 4096, &block).unwrap();
            }
            t.us_per(20_000)
        });
        println!("{mode}: 4 KiB overwrite of a cached block: {us:.2} us");
        fs.mknod(&c, dir, OsStr::new("r0"), libc::S_IFREG | 0o644, 0, 0)
            .unwrap();
        let us = best_of(5, || {
            let t = Clock::start();
            for i in 0..n {
                let (a, b) = if i % 2 == 0 {
                    ("r0", "r1")
                } else {
                    ("r1", "r0")
                };
                fs.rename(
                    &c,
                    dir,
                    OsStr::new(a),
                    dir,
                    OsStr::new(b),
                    RenameFlags::default(),
                )
                .unwrap();
            }
            t.us_per(n)
        });
        println!("{mode}: rename: {us:.2} us");
        fs.release(f.ino, fh).unwrap();
        fs.unmount().unwrap();
    }
}
