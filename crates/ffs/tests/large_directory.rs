//! A directory with a million entries stays usable: creating, looking up, listing and
//! removing cost about the same per entry at the end as at the start (the in-memory name
//! index and the free-space tree, not a linear scan).

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Instant;

use cairn_blockdev::{BlockDevice, FileDevice};
use cairn_ffs::{Ffs, MkfsOptions, MountOptions, mkfs_device};
use cairn_vfs::{Ctx, FileSystem};

#[test]
fn million_entries() {
    let heavy = std::env::var("CAIRN_TEST_HEAVY").is_ok_and(|v| v == "1");
    let n: u64 = if heavy { 1_000_000 } else { 100_000 };
    // A sparse 4 GiB image: a million inodes need 31 groups (one bitmap block each).
    let tmp = tempfile::tempdir().unwrap();
    let dev = FileDevice::create(&tmp.path().join("img"), 4096, 4 << 30).unwrap();
    mkfs_device(
        &dev,
        &MkfsOptions {
            inodes: Some(n + 1000),
            ..Default::default()
        },
    )
    .unwrap();
    let d: Arc<dyn BlockDevice> = Arc::new(dev);
    let fs = Ffs::mount_device(
        d,
        &MountOptions {
            mode: "async".into(),
            cache_bytes: 1 << 30,
            ..Default::default()
        },
    )
    .unwrap();
    let c = Ctx::root();
    let dir = fs.mkdir(&c, 2, OsStr::new("big"), 0o755, 0).unwrap().ino;
    let name = |i: u64| format!("entry-number-{i:08}");
    let batch = n / 10;
    let mut rates = Vec::new();
    for b in 0..10 {
        let t = Instant::now();
        for i in b * batch..(b + 1) * batch {
            fs.mknod(&c, dir, OsStr::new(&name(i)), libc::S_IFREG | 0o644, 0, 0)
                .unwrap();
        }
        rates.push(batch as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "create rate per tenth: {:?}",
        rates.iter().map(|r| *r as u64).collect::<Vec<_>>()
    );
    // Rates are printed, not asserted: the machine is shared. What is asserted is that the
    // directory stays a directory at this size (every name found, the listing complete,
    // removals work); a quadratic insert shows as a run that never finishes.
    let t = Instant::now();
    for i in (0..n).step_by(997) {
        assert_eq!(fs.lookup(&c, dir, OsStr::new(&name(i))).unwrap().nlink, 1);
    }
    println!("lookups: {:?}", t.elapsed());
    let mut count = 0u64;
    let mut off = 0;
    loop {
        let mut got = 0;
        fs.readdir(dir, 0, off, false, &mut |e| {
            if got == 4096 {
                return false;
            }
            got += 1;
            off = e.next_offset;
            true
        })
        .unwrap();
        if got == 0 {
            break;
        }
        count += got;
    }
    assert_eq!(count, n + 2);
    for i in (0..n).step_by(3) {
        fs.unlink(&c, dir, OsStr::new(&name(i))).unwrap();
    }
    assert!(fs.lookup(&c, dir, OsStr::new(&name(3))).is_err());
    assert!(fs.lookup(&c, dir, OsStr::new(&name(4))).is_ok());
    fs.unmount().unwrap();
}
