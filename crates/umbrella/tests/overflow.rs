//! Two large files growing at once through a real mount (fstests generic/371 in small):
//! one thread writes a file, another fallocates one, both created empty on the first
//! branch, which holds only one of them. Each must end on a branch with room, never with
//! ENOSPC: the two together fit on the two branches at every moment.

mod common;

use std::fs;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use common::Rig;
use nix::fcntl::FallocateFlags;

/// The fstests umbrella configuration (scripts/fstests/umbrella.sh): small files on fast
/// first, files over 1 MiB on slow first.
const TIERS: &str = r#"
[umbrella]
default = ["fast", "slow"]
[[branch]]
name = "fast"
path = "fast"
[[branch]]
name = "slow"
path = "slow"
[[rule]]
name = "large files"
size = "> 1M"
branches = ["slow", "fast"]
"#;

const FILE: usize = 10 << 20;
const ROUNDS: usize = 60;

/// One round of the writer: create, write `FILE` bytes in 64 KiB pieces (xfs_io's pwrite),
/// close, remove. Ok(false): a write got ENOSPC.
fn write_round(r: &Rig) -> bool {
    let p = r.m("f1");
    let mut f = fs::File::create(&p).unwrap();
    let buf = vec![0x5au8; 64 << 10];
    let mut ok = true;
    for _ in 0..FILE / buf.len() {
        if let Err(e) = f.write_all(&buf) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "write: {e}");
            ok = false;
            break;
        }
    }
    drop(f);
    fs::remove_file(&p).unwrap();
    ok
}

/// One round of the allocator: create, fallocate `FILE` bytes, close, remove.
fn falloc_round(r: &Rig) -> bool {
    let p = r.m("f2");
    let f = fs::File::create(&p).unwrap();
    let rc = nix::fcntl::fallocate(&f, FallocateFlags::empty(), 0, FILE as libc::off_t);
    let ok = match rc {
        Ok(()) => true,
        Err(e) => {
            assert_eq!(e, nix::errno::Errno::ENOSPC, "fallocate: {e}");
            false
        }
    };
    drop(f);
    fs::remove_file(&p).unwrap();
    ok
}

#[test]
fn two_large_files_growing_at_once_find_room() {
    let r = Arc::new(Rig::with_tmpfs(
        &[("fast", Some("16M")), ("slow", Some("16M"))],
        TIERS,
    ));
    let (w_fail, a_fail) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    std::thread::scope(|s| {
        let (r1, w) = (&r, &w_fail);
        s.spawn(move || {
            for _ in 0..ROUNDS {
                if !write_round(r1) {
                    w.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let (r2, a) = (&r, &a_fail);
        s.spawn(move || {
            for _ in 0..ROUNDS {
                if !falloc_round(r2) {
                    a.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    });
    let (w, a) = (
        w_fail.load(Ordering::Relaxed),
        a_fail.load(Ordering::Relaxed),
    );
    eprintln!("ENOSPC: {w} of {ROUNDS} writes, {a} of {ROUNDS} fallocates");
    assert_eq!((w, a), (0, 0), "ENOSPC with room for both files");
}

/// A file that fits on no branch still gets ENOSPC, soon (the looks for room are bounded),
/// and stays whole where it was: the 4 KiB written before are there, on its first branch.
#[test]
fn a_file_that_fits_nowhere_gets_enospc_soon_and_stays_whole() {
    let r = Rig::with_tmpfs(&[("fast", Some("16M")), ("slow", Some("16M"))], TIERS);
    let p = r.m("huge");
    let mut f = fs::File::create(&p).unwrap();
    f.write_all(&[7u8; 4096]).unwrap();
    f.flush().unwrap();
    let t = std::time::Instant::now();
    let e = nix::fcntl::fallocate(&f, FallocateFlags::empty(), 0, 20 << 20).unwrap_err();
    assert_eq!(e, nix::errno::Errno::ENOSPC);
    let buf = vec![1u8; 1 << 20];
    let mut written = 4096usize;
    let e = loop {
        match f.write_all(&buf) {
            Ok(()) => written += buf.len(),
            Err(e) => break e,
        }
    };
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "ENOSPC took {:?}",
        t.elapsed()
    );
    assert!(
        written < 16 << 20,
        "wrote {written} bytes on 16 MiB branches"
    );
    drop(f);
    let back = fs::read(&p).unwrap();
    assert_eq!(&back[..4096], &[7u8; 4096][..]);
    assert_eq!(r.on("fast", "huge") as u8 + r.on("slow", "huge") as u8, 1);
}
