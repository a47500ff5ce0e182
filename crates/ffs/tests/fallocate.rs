//! A large fallocate in every mode: its new blocks get their zeros from zero-range requests
//! to the device, not from a buffer each (generic/213's fallocates of 1 GiB held 1 GiB of
//! buffers until the call ended), and they read as zeros — before and after a remount, over
//! blocks that held another file's bytes — with fsck clean; one that fails midway changes
//! nothing.

mod common;

use cairn_blockdev::{FaultOp, MemDevice};
use cairn_ffs::{Ffs, MkfsOptions, mkfs_device};
use cairn_vfs::{Ctx, FileSystem};
use common::{BS, fsck, mount, mount_faulty, n};

/// The range fallocated: 32 MiB, 8192 blocks.
const RANGE: u64 = 32 << 20;
/// The image: 64 MiB.
const BLOCKS: u64 = 16384;

/// An image with a log area, so every mode mounts it.
fn mkfs() -> MemDevice {
    let dev = MemDevice::new(BS as u32, BLOCKS);
    mkfs_device(
        &dev,
        &MkfsOptions {
            blocks_per_group: Some(4096),
            journal_size: Some(4 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

fn mode_names() -> Vec<&'static str> {
    cairn_ffs::modes().iter().map(|m| m.name).collect()
}

/// Every byte of `ino` up to `len` is zero.
fn all_zeros(fs: &Ffs, ino: u64, len: u64) -> bool {
    let mut off = 0;
    let mut buf = Vec::new();
    while off < len {
        buf.clear();
        fs.read(ino, 0, off, 1 << 20, &mut buf).unwrap();
        if buf.is_empty() || buf.iter().any(|&b| b != 0) {
            return false;
        }
        off += buf.len() as u64;
    }
    true
}

/// Half the image written with a pattern and deleted, so the blocks a fallocate gets next
/// held another file's bytes.
fn leave_stale_bytes(fs: &Ffs) {
    let c = Ctx::root();
    let (f, fh) = fs.create(&c, 2, n("old"), 0o644, 0, libc::O_RDWR).unwrap();
    let chunk = vec![0xab; 1 << 20];
    for i in 0..RANGE >> 20 {
        fs.write(f.ino, fh, i << 20, &chunk).unwrap();
    }
    fs.fsync(f.ino, fh, false).unwrap();
    fs.release(f.ino, fh).unwrap();
    fs.unlink(&c, 2, n("old")).unwrap();
    fs.forget(f.ino, 1);
    fs.sync_all().unwrap();
}

#[test]
fn a_large_fallocate_makes_no_buffer_per_block_and_reads_zeros() {
    for mode in mode_names() {
        let mem = mkfs();
        let fs = mount(&mem, mode);
        leave_stale_bytes(&fs);
        let c = Ctx::root();
        let (f, fh) = fs.create(&c, 2, n("big"), 0o644, 0, libc::O_RDWR).unwrap();
        let (g, gh) = fs.create(&c, 2, n("zr"), 0o644, 0, libc::O_RDWR).unwrap();
        let cache = fs.cache_stats();
        let dev = fs.device().counters().snapshot();
        fs.fallocate(f.ino, fh, 0, RANGE, 0).unwrap();
        // FALLOC_FL_ZERO_RANGE over a hole allocates the same way.
        fs.fallocate(g.ino, gh, 0, RANGE / 4, libc::FALLOC_FL_ZERO_RANGE)
            .unwrap();
        assert_eq!(fs.getattr(f.ino).unwrap().size, RANGE, "{mode}");
        assert!(all_zeros(&fs, f.ino, RANGE), "{mode}: stale bytes");
        assert!(all_zeros(&fs, g.ino, RANGE / 4), "{mode}: stale bytes");
        let made = fs.cache_stats().insertions - cache.insertions;
        let d = fs.device().counters().snapshot().delta(&dev);
        let blocks = (RANGE + RANGE / 4) / BS;
        // The buffers made are the block map's and the bitmaps' (one indirect block per
        // 512 data blocks, a few group blocks), not one per data block.
        assert!(
            made < blocks / 64,
            "{mode}: {made} buffers for {blocks} new blocks"
        );
        assert!(d.zeroes >= 2, "{mode}: {} zero requests", d.zeroes);
        assert!(
            d.blocks_written < blocks * 2,
            "{mode}: {} blocks written for {blocks} new ones",
            d.blocks_written
        );
        fs.release(f.ino, fh).unwrap();
        fs.release(g.ino, gh).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        assert_eq!(fsck(&mem), "", "{mode}: fsck after unmount");
        let fs = mount(&mem, mode);
        let ino = fs.lookup(&c, 2, n("big")).unwrap().ino;
        assert_eq!(fs.getattr(ino).unwrap().size, RANGE, "{mode}");
        assert!(fs.getattr(ino).unwrap().blocks * 512 >= RANGE, "{mode}");
        assert!(
            all_zeros(&fs, ino, RANGE),
            "{mode}: stale bytes after remount"
        );
        fs.unmount().unwrap();
    }
}

/// A fault at each device write or flush of a large fallocate in turn (the zero-range
/// request is a write to the fault injector): the call fails and changes nothing — the
/// free count, the file's size and blocks are as before, and fsck is clean after unmount.
/// A journaled mode stops accepting writes once its log failed (by design), so there only
/// the call's first write and flush fail: the zero-range request and its flush, which come
/// before anything is logged.
#[test]
fn a_large_fallocate_that_fails_midway_changes_nothing() {
    for mode in mode_names() {
        let journaled = mode.starts_with("journal");
        for kind in [FaultOp::Write, FaultOp::Flush] {
            for nth in 1.. {
                let mem = mkfs();
                let (fault, fs) = mount_faulty(&mem, mode, 8 << 20);
                let c = Ctx::root();
                let (f, fh) = fs.create(&c, 2, n("big"), 0o644, 0, libc::O_RDWR).unwrap();
                fs.fsync(f.ino, fh, false).unwrap();
                let free = fs.statfs().unwrap().bfree;
                fault.fail_nth(kind, nth, false);
                let r = fs.fallocate(f.ino, fh, 0, RANGE / 2, 0);
                let hit = fault.seen(kind) >= nth;
                fault.heal();
                let what = format!("{mode}, {kind:?} #{nth}");
                if journaled {
                    assert!(r.is_err(), "{what}: the zero-range request or its flush");
                }
                if r.is_err() {
                    assert_eq!(fs.statfs().unwrap().bfree, free, "{what}: blocks kept");
                    let a = fs.getattr(f.ino).unwrap();
                    assert_eq!((a.size, a.blocks), (0, 0), "{what}");
                } else {
                    assert!(all_zeros(&fs, f.ino, RANGE / 2), "{what}");
                }
                fs.release(f.ino, fh).unwrap();
                fs.unmount().unwrap();
                drop(fs);
                assert_eq!(fsck(&mem), "", "{what}: fsck after unmount");
                if !hit || journaled {
                    break;
                }
            }
        }
    }
}

/// Soft updates counts the zero-range write as the new blocks' own durable write
/// (`DataZeroed`), so an fsync right after a large fallocate finds their pointers safe and
/// writes the block map and the inode in a wave each, rather than writing and flushing for
/// blocks that have no buffer until a full sweep notices they are clean.
#[test]
fn soft_updates_fsync_after_a_large_fallocate_takes_few_flushes() {
    let mem = mkfs();
    let fs = mount(&mem, "softdep");
    let c = Ctx::root();
    let (f, fh) = fs.create(&c, 2, n("big"), 0o644, 0, libc::O_RDWR).unwrap();
    fs.fsync(f.ino, fh, false).unwrap();
    fs.fallocate(f.ino, fh, 0, RANGE, 0).unwrap();
    let before = fs.device().counters().snapshot();
    fs.fsync(f.ino, fh, false).unwrap();
    let flushes = fs.device().counters().snapshot().delta(&before).flushes;
    assert!(flushes <= 4, "{flushes} flushes for the fsync");
    fs.release(f.ino, fh).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(fsck(&mem), "");
}
