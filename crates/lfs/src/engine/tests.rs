//! Engine tests on an in-memory device: operations across remounts, roll-forward after a
//! crash at every write boundary, hostile images.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use cairn_blockdev::{BlockDevice, MemDevice, TraceOp, VecTrace};
use cairn_vfs::{Ctx, FileSystem, RenameFlags};

use super::node::D_FIRST;
use super::*;
use crate::check::check_device;
use crate::format::inode::PTRS;

use crate::mkfs::{MkfsOptions, mkfs_device};

fn opts() -> MountOptions {
    MountOptions {
        syncer: false,
        ..Default::default()
    }
}

/// A fresh image of `blocks` blocks with 64 KiB segments (also the check's tests').
pub(crate) fn image(blocks: u64) -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, blocks));
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size: 64 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

pub(crate) fn mount(dev: &Arc<MemDevice>) -> Arc<Lfs> {
    Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()).unwrap()
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Every path (files with contents, directories with a trailing '/', symlinks with '@').
fn tree(fs: &Lfs) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((dir, path)) = stack.pop() {
        let mut ents = Vec::new();
        fs.readdir(dir, 0, 0, false, &mut |e| {
            ents.push((e.name.to_string_lossy().into_owned(), e.ino, e.kind));
            true
        })
        .unwrap();
        for (name, ino, kind) in ents {
            if name == "." || name == ".." {
                continue;
            }
            let p = format!("{path}/{name}");
            match kind {
                cairn_vfs::FileKind::Directory => {
                    out.insert(format!("{p}/"), vec![]);
                    stack.push((ino, p));
                }
                cairn_vfs::FileKind::Symlink => {
                    out.insert(format!("{p}@"), fs.readlink(ino).unwrap());
                }
                cairn_vfs::FileKind::CharDevice => {
                    let a = fs.getattr(ino).unwrap();
                    out.insert(format!("{p}%"), format!("{}:{:o}", a.rdev, a.perm).into());
                }
                _ => {
                    let size = fs.getattr(ino).unwrap().size;
                    let mut buf = Vec::new();
                    fs.read(ino, 0, 0, size as u32, &mut buf).unwrap();
                    out.insert(p, buf);
                }
            }
        }
    }
    out
}

fn write_file(fs: &Lfs, parent: u64, name: &str, data: &[u8]) -> u64 {
    let c = Ctx::root();
    let (a, fh) = fs
        .create(&c, parent, n(name), 0o644, 0, libc::O_RDWR)
        .unwrap();
    assert_eq!(fs.write(a.ino, fh, 0, data).unwrap() as usize, data.len());
    fs.release(a.ino, fh).unwrap();
    a.ino
}

fn assert_clean(dev: &Arc<MemDevice>) {
    let r = check_device(dev.clone() as Arc<dyn BlockDevice>).unwrap();
    assert!(r.is_clean(), "{:#?}", r.findings);
}

#[test]
fn create_write_read_unlink_rename_survive_remount() {
    let dev = image(4096);
    let c = Ctx::root();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    {
        let fs = mount(&dev);
        let d = fs.mkdir(&c, ROOT_INO, n("d"), 0o755, 0).unwrap().ino;
        write_file(&fs, d, "small", b"hello");
        write_file(&fs, ROOT_INO, "big", &big);
        write_file(&fs, ROOT_INO, "gone", b"bye");
        fs.unlink(&c, ROOT_INO, n("gone")).unwrap();
        fs.rename(
            &c,
            d,
            n("small"),
            ROOT_INO,
            n("moved"),
            RenameFlags::default(),
        )
        .unwrap();
        let m = fs.lookup(&c, ROOT_INO, n("moved")).unwrap().ino;
        fs.link(&c, m, d, n("hard")).unwrap();
        fs.symlink(&c, d, n("sym"), b"../moved").unwrap();
        fs.destroy().unwrap();
    }
    assert_clean(&dev);
    let fs = mount(&dev);
    let t = tree(&fs);
    assert_eq!(t["/moved"], b"hello");
    assert_eq!(t["/d/hard"], b"hello");
    assert_eq!(t["/d/sym@"], b"../moved");
    assert_eq!(t["/big"], big);
    assert!(!t.contains_key("/gone") && !t.contains_key("/d/small"));
    assert_eq!(fs.lookup(&c, ROOT_INO, n("moved")).unwrap().nlink, 2);
    // Truncate and overwrite in the middle of the big file, then remount again.
    let b = fs.lookup(&c, ROOT_INO, n("big")).unwrap().ino;
    let fh = fs.open(&c, b, libc::O_RDWR).unwrap();
    fs.write(b, fh, 100_000, b"XYZ").unwrap();
    fs.release(b, fh).unwrap();
    fs.setattr(
        &c,
        b,
        cairn_vfs::SetAttr {
            size: Some(200_001),
            ..Default::default()
        },
    )
    .unwrap();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    let fs = mount(&dev);
    let t = tree(&fs);
    let mut want = big[..200_001].to_vec();
    want[100_000..100_003].copy_from_slice(b"XYZ");
    assert_eq!(t["/big"], want);
}

#[test]
fn log_writes_are_whole_partial_segments() {
    let dev = image(4096);
    let fs = mount(&dev);
    let before = dev.counters().snapshot();
    for i in 0..200 {
        write_file(&fs, ROOT_INO, &format!("f{i}"), &[7u8; 1024]);
    }
    fs.flush_log().unwrap();
    let d = dev.counters().snapshot().delta(&before);
    // 200 files of one block + 200 inodes in 13 blocks + directory blocks: a handful of
    // writes, each a partial segment of up to 15 blocks (64 KiB segments).
    assert!(d.writes <= 40, "{d:?}");
    assert!(d.blocks_written >= 213, "{d:?}");
}

#[test]
fn deleted_space_is_reused_after_a_checkpoint() {
    // 1 MiB of segments, files of 64 KiB written and deleted over and over: without
    // segments freed by checkpoints this would run out after a few rounds.
    let dev = image(1024);
    let fs = mount(&dev);
    let c = Ctx::root();
    for round in 0..60 {
        write_file(&fs, ROOT_INO, "f", &vec![round as u8; 256 << 10]);
        fs.unlink(&c, ROOT_INO, n("f")).unwrap();
    }
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

#[test]
fn full_disk_is_enospc_and_consistent() {
    let dev = image(1024);
    let fs = mount(&dev);
    let c = Ctx::root();
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("fill"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    let chunk = vec![1u8; 64 << 10];
    let mut off = 0u64;
    let err = loop {
        match fs.write(a.ino, fh, off, &chunk) {
            Ok(k) => off += k as u64,
            Err(e) => break e,
        }
        assert!(off < 8 << 20, "never ran out");
    };
    assert_eq!(err.errno(), cairn_vfs::Errno::ENOSPC);
    fs.release(a.ino, fh).unwrap();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    let fs = mount(&dev);
    assert_eq!(fs.getattr(a.ino).unwrap().size, off);
    // Deleting gives the space back.
    fs.unlink(&c, ROOT_INO, n("fill")).unwrap();
    fs.checkpoint().unwrap();
    write_file(&fs, ROOT_INO, "again", &vec![2u8; 1 << 20]);
}

/// The crash test: a small workload, fsync after each step; the image cut after every
/// device write (everything not yet written lost) must mount, check clean, and show the
/// state after some step — never older than the last step whose fsync returned.
fn crash_cuts(broken: bool) -> std::result::Result<usize, String> {
    let dev = image(2048);
    let base = dev.to_bytes();
    let trace = Arc::new(VecTrace::with_data());
    dev.set_trace(Some(trace.clone()));
    let c = Ctx::root();
    let mut states = vec![];
    let mut durable_after = vec![]; // trace length once step i's fsync returned
    {
        let planted = if broken {
            Planted::CheckpointFirst
        } else {
            Planted::None
        };
        let fs = Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted)
            .unwrap();
        states.push(tree(&fs));
        durable_after.push(trace.len());
        type Step<'a> = Box<dyn Fn(&Lfs) + 'a>;
        let steps: Vec<Step> = vec![
            Box::new(|fs| {
                fs.mkdir(&c, ROOT_INO, n("a"), 0o755, 0).unwrap();
            }),
            Box::new(|fs| {
                let a = fs.lookup(&c, ROOT_INO, n("a")).unwrap().ino;
                write_file(fs, a, "x", b"one");
            }),
            Box::new(|fs| {
                write_file(fs, ROOT_INO, "y", &vec![9u8; 70_000]);
            }),
            Box::new(|fs| {
                fs.rename(
                    &c,
                    ROOT_INO,
                    n("y"),
                    ROOT_INO,
                    n("z"),
                    RenameFlags::default(),
                )
                .unwrap();
            }),
            Box::new(|fs| {
                let a = fs.lookup(&c, ROOT_INO, n("a")).unwrap().ino;
                let x = fs.lookup(&c, a, n("x")).unwrap().ino;
                fs.link(&c, x, ROOT_INO, n("x2")).unwrap();
                fs.unlink(&c, a, n("x")).unwrap();
            }),
            Box::new(|fs| {
                fs.checkpoint().unwrap();
            }),
            // One flush of many inodes: their blocks span partial segments, so only a
            // whole flush (up to its COMMIT) is a state some step produced.
            Box::new(|fs| {
                let a = fs.lookup(&c, ROOT_INO, n("a")).unwrap().ino;
                for i in 0..400 {
                    let name = format!("many{i}");
                    let (at, fh) = fs.create(&c, a, n(&name), 0o644, 0, 0).unwrap();
                    fs.release(at.ino, fh).unwrap();
                }
            }),
            // RENAME_WHITEOUT: the rename and its whiteout in one log write.
            Box::new(|fs| {
                let a = fs.lookup(&c, ROOT_INO, n("a")).unwrap().ino;
                let wo = RenameFlags {
                    whiteout: true,
                    ..Default::default()
                };
                fs.rename(&c, ROOT_INO, n("x2"), a, n("x3"), wo).unwrap();
            }),
            Box::new(|fs| {
                let a = fs.lookup(&c, ROOT_INO, n("a")).unwrap().ino;
                fs.rename(&c, ROOT_INO, n("z"), a, n("z"), RenameFlags::default())
                    .unwrap();
                write_file(fs, a, "w", b"w");
            }),
            // A cleaning pass: a crash anywhere in it loses nothing.
            Box::new(|fs| {
                let before = fs.cleaner_stats();
                fs.clean_now(fs.clean_segments() + 4).unwrap();
                let after = fs.cleaner_stats();
                assert!(after.blocks_moved > before.blocks_moved, "{after:?}");
            }),
            Box::new(|fs| {
                let a = fs.lookup(&c, ROOT_INO, n("a")).unwrap().ino;
                fs.unlink(&c, a, n("z")).unwrap();
                fs.unlink(&c, ROOT_INO, n("x2")).unwrap();
            }),
        ];
        for step in steps {
            step(&fs);
            fs.fsync(ROOT_INO, 0, false).unwrap();
            states.push(tree(&fs));
            durable_after.push(trace.len());
        }
    }
    let recs = trace.records();
    // Cut after every device write (reads and flushes change nothing on the image).
    let writes: Vec<usize> = (0..=recs.len())
        .filter(|&k| k == 0 || recs[k - 1].0.op == TraceOp::Write)
        .collect();
    let mut checked = 0;
    for &k in &writes {
        let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // The image with the first k operations of the trace applied.
            let mut img = base.clone();
            for (ev, data) in &recs[..k] {
                if ev.op == TraceOp::Write {
                    let d = data.as_ref().unwrap();
                    let o = ev.block as usize * BLOCK_SIZE;
                    img[o..o + d.len()].copy_from_slice(d);
                }
            }
            let crashed = Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, img));
            let fs = Lfs::mount_device(crashed.clone() as Arc<dyn BlockDevice>, &opts())
                .unwrap_or_else(|e| panic!("cut after {k} of {} operations: {e}", recs.len()));
            let t = tree(&fs);
            let at = states
                .iter()
                .rposition(|s| *s == t)
                .unwrap_or_else(|| panic!("cut after {k}: a state no step produced: {t:#?}"));
            let durable = durable_after.iter().rposition(|&d| d <= k).unwrap_or(0);
            assert!(
                at >= durable,
                "cut after {k}: state {at}, but step {durable} was fsynced"
            );
            drop(fs);
            assert_clean(&crashed);
        }));
        if let Err(p) = cut {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Err(format!("cut after {k} of {}: {msg}", recs.len()));
        }
        checked += 1;
    }
    Ok(checked)
}

#[test]
fn roll_forward_shows_a_prefix_at_every_write_boundary() {
    let checked = crash_cuts(false).unwrap();
    assert!(checked > 10, "{checked} cuts");
}

/// The same campaign catches an LFS that writes a checkpoint region before the segments it
/// names (a cut between the two leaves a region pointing at blocks never written).
#[test]
fn a_checkpoint_written_before_its_segments_is_caught() {
    let e = crash_cuts(true).unwrap_err();
    eprintln!("caught: {e}");
}

#[test]
fn hostile_images_are_refused_not_panicked() {
    let dev = image(512);
    let good = dev.to_bytes();
    // Not LFS at all.
    let zeros = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 512));
    let e = Lfs::mount_device(zeros as Arc<dyn BlockDevice>, &opts())
        .err()
        .unwrap();
    assert!(e.to_string().contains("not an LFS image"), "{e}");
    // Both checkpoint regions damaged.
    let mut img = good.clone();
    img[BLOCK_SIZE + 10] ^= 1;
    let sb = Superblock::decode(&good[..BLOCK_SIZE], 512).unwrap();
    let o = sb.cp_start(1) as usize * BLOCK_SIZE;
    img[o..o + 4].copy_from_slice(b"LFCP");
    let d = Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, img));
    let e = Lfs::mount_device(d as Arc<dyn BlockDevice>, &opts())
        .err()
        .unwrap();
    assert!(e.to_string().contains("checkpoint"), "{e}");
    // Flipping bytes all over the log: mount or check may fail, never panic.
    for i in 0..200usize {
        let mut img = good.clone();
        let at = (sb.first_segment as usize * BLOCK_SIZE + i * 997) % img.len();
        img[at] ^= 0x5a;
        let d = Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, img));
        if let Ok(fs) = Lfs::mount_device(d.clone() as Arc<dyn BlockDevice>, &opts()) {
            let mut v = Vec::new();
            let _ = fs.readdir(ROOT_INO, 0, 0, true, &mut |e| {
                v.push(e.ino);
                true
            });
            let _ = check_device(d as Arc<dyn BlockDevice>);
        }
    }
}

/// The cleaner keeps a disk whose files fill 70% of it (more with their metadata) writable under overwrites of many times its
/// size (without it, dead blocks spread over partly live segments end in ENOSPC), and
/// leaves every file with its last contents and the image consistent.
fn overwrite_workload(policy: &str) -> (CleanerStats, LfsStats) {
    overwrite_workload_on(policy, 1024, 64 << 10, 44, 3000)
}

fn overwrite_workload_on(
    policy: &str,
    blocks: u64,
    segment_size: u64,
    nfiles: u64,
    rounds: u64,
) -> (CleanerStats, LfsStats) {
    overwrite_workload_clocked(policy, blocks, segment_size, nfiles, rounds, true)
}

fn overwrite_workload_clocked(
    policy: &str,
    blocks: u64,
    segment_size: u64,
    nfiles: u64,
    rounds: u64,
    logical_clock: bool,
) -> (CleanerStats, LfsStats) {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, blocks));
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size,
            ..Default::default()
        },
    )
    .unwrap();
    // Segment ages on the logical clock (a tick per write), not in milliseconds: with the
    // wall clock the cost-benefit cleaner's choices — and whether this nearly full 4 MiB disk
    // of 16-block segments still has a segment worth cleaning at round 2,900 — depended on
    // how fast the machine ran the test (ENOSPC at round 2,931 under CI's load, none here).
    let o = MountOptions {
        cleaner: crate::cleaner::policy::Policy::parse(policy).unwrap(),
        logical_clock,
        ..opts()
    };
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &o).unwrap();
    let c = Ctx::root();
    let mut model: Vec<Vec<u8>> = Vec::new();
    let mut inos = Vec::new();
    for i in 0..nfiles {
        let data = vec![i as u8; 64 << 10];
        inos.push(write_file(&fs, ROOT_INO, &format!("f{i}"), &data));
        model.push(data);
    }
    let mut x = 12345u64;
    for round in 0..rounds {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Hot and cold: 90% of the writes go to the first 10% of the files.
        let hot = (nfiles / 10).max(1);
        let f = if (x >> 33) % 10 < 9 {
            (x >> 40) % hot
        } else {
            hot + (x >> 40) % (nfiles - hot)
        } as usize;
        let blk = ((x >> 20) % 16) as usize;
        let val = (round % 251) as u8;
        let fh = fs.open(&c, inos[f], libc::O_RDWR).unwrap();
        fs.write(inos[f], fh, (blk * 4096) as u64, &[val; 4096])
            .unwrap_or_else(|e| {
                let st = fs.st.lock();
                let live: u64 = st.usage.iter().map(|u| u.live_bytes as u64).sum();
                panic!(
                    "round {round}: {e}; {} clean segments, live {live} bytes, {} bytes \
                     admissible, {:?}",
                    st.clean_segments(),
                    st.admissible_bytes(),
                    st.cleaner
                )
            });
        fs.release(inos[f], fh).unwrap();
        model[f][blk * 4096..(blk + 1) * 4096].fill(val);
        if round % 50 == 0 {
            fs.fsync(inos[f], fh, false).unwrap();
        }
        // Reads on the live mount, through the block cache, while the cleaner empties
        // segments and the log writes over them again: a cached copy from a segment's
        // earlier life must never be returned.
        if round % 7 == 0 {
            let g = ((x >> 13) % nfiles) as usize;
            let mut got = Vec::new();
            fs.read(inos[g], 0, 0, model[g].len() as u32, &mut got)
                .unwrap();
            assert!(
                got == model[g],
                "round {round}: file {g} differs on the live mount"
            );
        }
    }
    let cs = fs.cleaner_stats();
    let ls = fs.lfs_stats();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    let fs = mount(&dev);
    for (i, want) in model.iter().enumerate() {
        let mut got = Vec::new();
        fs.read(inos[i], 0, 0, want.len() as u32, &mut got).unwrap();
        assert!(got == *want, "file {i} differs after cleaning");
    }
    (cs, ls)
}

#[test]
fn cleaner_keeps_a_full_disk_writable_greedy() {
    let (cs, _) = overwrite_workload("greedy");
    assert!(cs.segments_cleaned > 10, "{cs:?}");
    assert!(cs.blocks_moved > 0, "{cs:?}");
}

#[test]
fn cleaner_keeps_a_full_disk_writable_cost_benefit() {
    let (cs, ls) = overwrite_workload("cost-benefit+age-sort");
    assert!(cs.segments_cleaned > 10, "{cs:?}");
    eprintln!("{cs:?} {ls:?}");
}

/// 004 §3.3 with small segments: a 4 MiB disk of 16-block segments whose files hold 81%
/// of the log (47 files of 64 KiB, with their indirect blocks and inodes) stays writable
/// under hot-and-cold overwrites of three times its size. Every segment the cleaner could
/// take is about 80% live, so moving one writes its live blocks, an indirect block and an
/// inode block per file touched, the tables and a summary: more than the segment it
/// frees. Passes that pay take several segments at once; and they are found only if the
/// room rule counts what a pass writes exactly (a bound a few blocks too high refused
/// them: ENOSPC at round 394 with a fifth of the disk dead).
#[test]
fn small_segments_nearly_full_stay_writable_logical_clock() {
    let (cs, _) =
        overwrite_workload_clocked("cost-benefit+age-sort", 1024, 64 << 10, 47, 3000, true);
    assert!(cs.segments_cleaned > 100, "{cs:?}");
}

/// The same on the wall clock (segment ages in milliseconds, so the cleaner's choices
/// depend on the machine's speed: it must stay writable whatever they are).
#[test]
fn small_segments_nearly_full_stay_writable_wall_clock() {
    let (cs, _) =
        overwrite_workload_clocked("cost-benefit+age-sort", 1024, 64 << 10, 47, 3000, false);
    assert!(cs.segments_cleaned > 100, "{cs:?}");
}

/// A pass takes more segments than the plan's when those alone would not pay (004 §3.3).
/// Forty files of 12 blocks, checkpointed, then the first quarter of each overwritten and
/// checkpointed again: on 16-block segments, victims about 75% live.
fn forty_files_a_quarter_overwritten(fs: &Lfs) {
    let c = Ctx::root();
    let mut inos = Vec::new();
    for i in 0..40 {
        inos.push(write_file(
            fs,
            ROOT_INO,
            &format!("f{i}"),
            &[i as u8; 48 << 10],
        ));
    }
    fs.checkpoint().unwrap();
    for (i, &ino) in inos.iter().enumerate() {
        let fh = fs.open(&c, ino, libc::O_RDWR).unwrap();
        fs.write(ino, fh, 0, &[!(i as u8); 12 << 10]).unwrap();
        fs.release(ino, fh).unwrap();
    }
    fs.checkpoint().unwrap();
}

/// Forty files of 12 blocks on a disk of 16-block segments, a quarter of each then
/// overwritten: the plan, which counts live blocks only, takes the least utilized segment
/// alone for one more clean segment (its live blocks fit the log's head), but with the
/// inode, inode map and usage table blocks and summaries written again the pass spills
/// into a new segment and gives nothing back: refused. Taking the next least utilized
/// segment too, the same writes serve both, and the pass frees two segments for one.
#[test]
fn a_pass_takes_several_victims_when_one_does_not_pay() {
    let dev = image(1024);
    let fs = mount(&dev);
    forty_files_a_quarter_overwritten(&fs);
    let before = fs.clean_segments();
    let cleaned = fs.clean_now(before + 1).unwrap();
    let cs = fs.cleaner_stats();
    assert!(cleaned >= 2, "cleaned {cleaned}: {cs:?}");
    assert!(fs.clean_segments() > before, "{cs:?}");
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// The admission count of what the next flush writes (`State::buffered_blocks`, on every
/// write) sums indirect and xattr blocks over the inodes that may have some
/// (`DirtySet::meta_inodes`), and in tests checks that against the sum over every dirty
/// inode. Every way to dirty them, then a count before any flush: an xattr set, a
/// default ACL inherited at create, a write past the direct blocks, a truncate through
/// them, a cleaning pass re-pointing indirect blocks. A way that dirtied one without
/// saying so would fail the check here.
#[test]
fn every_inode_with_metadata_to_rewrite_is_counted() {
    let dev = image(4096);
    let fs = mount(&dev);
    let c = Ctx::root();
    let count = |fs: &Lfs| fs.st.lock().buffered_blocks(true);
    let a = write_file(&fs, ROOT_INO, "a", &[1; 4096]);
    fs.flush_log().unwrap();
    fs.setxattr(&c, a, n("user.k"), &[7; 3000], 0).unwrap();
    assert!(count(&fs) > 0);
    let d = fs.mkdir(&c, ROOT_INO, n("d"), 0o755, 0).unwrap().ino;
    // user::rw-, user:1000:r--, group::r--, mask::rw-, other::r-- (an extended ACL: a file
    // created below inherits it as its access ACL, an xattr to write).
    let acl = cairn_vfs::acl::encode_raw(&[
        (1, 6, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 4, u32::MAX),
    ]);
    fs.setxattr(&c, d, n("system.posix_acl_default"), &acl, 0)
        .unwrap();
    fs.flush_log().unwrap();
    let (f, fh) = fs.create(&c, d, n("f"), 0o644, 0, libc::O_RDWR).unwrap();
    count(&fs);
    fs.write(f.ino, fh, 40 * BS, &[3; 4096]).unwrap();
    count(&fs);
    fs.flush_log().unwrap();
    let size = cairn_vfs::SetAttr {
        size: Some(BS),
        ..Default::default()
    };
    fs.setattr(&c, f.ino, size).unwrap();
    count(&fs);
    fs.release(f.ino, fh).unwrap();
    fs.flush_log().unwrap();
    // A pass finding a live indirect block whose data blocks it does not move: `big`'s
    // indirect block rewritten by a truncate into a segment otherwise dead (`tmp`'s),
    // which the greedy pass takes first.
    let big = write_file(&fs, ROOT_INO, "big", &vec![5; 64 * BLOCK_SIZE]);
    fs.checkpoint().unwrap();
    write_file(&fs, ROOT_INO, "tmp", &vec![6; 12 * BLOCK_SIZE]);
    let size = cairn_vfs::SetAttr {
        size: Some(40 * BS),
        ..Default::default()
    };
    fs.setattr(&c, big, size).unwrap();
    fs.flush_log().unwrap();
    fs.unlink(&c, ROOT_INO, n("tmp")).unwrap();
    fs.checkpoint().unwrap();
    {
        let mut st = fs.st.lock();
        let th = Thresholds::new(1, st.clean_segments() + 1).unwrap();
        assert!(st.clean_pass(Policy::GREEDY, th).unwrap() > 0);
    }
    count(&fs);
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// A file created with nothing to inherit has no metadata block to write, so it is not
/// among the meta inodes: the admission count every write makes walks those, and counting
/// every new file there made a write after n creates cost n node lookups (half the CPU of
/// filling an image with small files).
#[test]
fn plain_creates_leave_no_inode_with_metadata_to_rewrite() {
    let dev = image(4096);
    let fs = mount(&dev);
    for i in 0..64 {
        write_file(&fs, ROOT_INO, &format!("f{i}"), &[1; 4096]);
    }
    fs.mkdir(&Ctx::root(), ROOT_INO, n("d"), 0o755, 0).unwrap();
    let st = fs.st.lock();
    assert!(st.dirty.inodes().len() >= 65);
    assert_eq!(st.dirty.meta_inodes().count(), 0);
    drop(st);
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// `df` tells the truth near a full disk: filling a 4 MiB disk of 16-block segments with
/// files written 16 KiB at a time until ENOSPC, the last `statfs` before the failing
/// write shows (about) no free space — never room that writes cannot have. The free count
/// it replaced (all blocks not live, less three segments) showed 69 blocks (7%) free at
/// ENOSPC here: the summaries and the old copies of inodes and indirect blocks, dead but
/// spread one or two a segment over nearly full segments no pass can pay to clean.
#[test]
fn statfs_shows_no_room_when_writes_fail_with_enospc() {
    let free = free_at_enospc(1024, 0, Planted::None);
    // A 16 KiB write needs 4 blocks and their metadata; a segment's worth is "about none".
    assert!(free <= 16, "ENOSPC while statfs showed {free} blocks free");
}

/// The same beside a write-back reserve, as a FUSE mount sets one (on an 8 MiB image,
/// 2.6-3.3 MiB for the kernel's dirty pages, `FileSystem::set_writeback_reserve`): calls
/// then run out of room with a third of the disk still clean, each asking for its bytes
/// *and* the reserve. A foreground pass aimed at that many clean segments planned every
/// dirty segment as its victim, which never pays, and the call failed with ENOSPC while
/// `df` showed the room a pass over the least utilized segments gives (CI under load:
/// 21 blocks, `lfs_df_shows_no_room_when_writes_fail_with_enospc`; here up to 19 for
/// some reserves). Every reserve from none to 6 MB in steps of 100 KB.
#[test]
fn statfs_shows_no_room_at_enospc_beside_any_writeback_reserve() {
    let worst = most_free_at_enospc_over_reserves(Planted::None);
    assert!(
        worst.1 <= 16,
        "ENOSPC while statfs showed {} blocks free (reserve {} bytes)",
        worst.1,
        worst.0
    );
}

/// The broken variant: only passes aimed at all the room asked for.
#[test]
fn a_foreground_cleaner_without_its_one_segment_pass_is_caught() {
    let worst = most_free_at_enospc_over_reserves(Planted::SizedPassOnly);
    assert!(
        worst.1 > 16,
        "the test cannot tell the variant: at most {} blocks free",
        worst.1
    );
}

/// The reserve whose fill ended with the most blocks shown free, and that count.
fn most_free_at_enospc_over_reserves(planted: Planted) -> (u64, u64) {
    (0..60u64)
        .map(|k| {
            let r = k * 100_000;
            (r, free_at_enospc(2048, r, planted))
        })
        .max_by_key(|&(_, f)| f)
        .expect("some reserves")
}

/// Fills a `blocks`-block disk of 16-block segments with files written 16 KiB at a time,
/// `reserve` bytes set aside for write-back, until a create or a write fails (ENOSPC);
/// returns the free blocks the last `statfs` before the failing call showed.
fn free_at_enospc(blocks: u64, reserve: u64, planted: Planted) -> u64 {
    let dev = image(blocks);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    if reserve > 0 {
        fs.set_writeback_reserve(reserve);
    }
    let c = Ctx::root();
    let mut last = fs.statfs().unwrap();
    let mut full = None;
    'fill: for i in 0..1000 {
        last = fs.statfs().unwrap();
        let (a, fh) = match fs.create(&c, ROOT_INO, n(&format!("f{i}")), 0o644, 0, libc::O_RDWR) {
            Ok(x) => x,
            Err(e) => {
                full = Some(e);
                break;
            }
        };
        for k in 0..4u64 {
            last = fs.statfs().unwrap();
            if let Err(e) = fs.write(a.ino, fh, k * (16 << 10), &[i as u8; 16 << 10]) {
                fs.release(a.ino, fh).unwrap();
                full = Some(e);
                break 'fill;
            }
        }
        fs.release(a.ino, fh).unwrap();
    }
    let e = full.expect("never ran out");
    assert_eq!(e.errno(), cairn_vfs::Errno::ENOSPC);
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    last.bfree
}

/// The other half: what `df` shows can be had. On a fresh 16 MiB image, one fallocate of
/// all the available space but 512 KiB (fstests generic/103's `_consume_freesp`) succeeds
/// (it once failed with ENOSPC: statfs counted a clean segment whole while writes were
/// admitted for 7/8 of it).
#[test]
fn statfs_available_space_can_be_allocated() {
    let dev = image(4096);
    let fs = mount(&dev);
    let c = Ctx::root();
    let s = fs.statfs().unwrap();
    let avail = s.bavail * s.bsize as u64;
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("spc"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    fs.fallocate(a.ino, fh, 0, avail - (512 << 10), 0)
        .unwrap_or_else(|e| panic!("fallocate of {avail} - 512 KiB available: {e}"));
    fs.release(a.ino, fh).unwrap();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// A create refused with ENOSPC leaves nothing behind: no name, no inode, the same tree
/// after a remount, a clean check. Programs (and the full-disk random test's model) take a
/// refused create to mean no file; a name or inode left by a create that failed midway would
/// be a file nobody was told of, found only after the remount.
#[test]
fn a_create_refused_on_a_full_disk_leaves_no_file() {
    let dev = image(1024);
    let fs = mount(&dev);
    let c = Ctx::root();
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("fill"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    let mut off = 0u64;
    while fs.write(a.ino, fh, off, &[3u8; 64 << 10]).is_ok() {
        off += 64 << 10;
        assert!(off < 8 << 20, "never ran out");
    }
    fs.release(a.ino, fh).unwrap();
    // Empty files until a create is refused (an inode and a directory entry take room).
    let mut before = tree(&fs);
    let mut i = 0;
    let (refused, files_free) = loop {
        let files_free = fs.statfs().unwrap().ffree;
        let name = format!("e{i}");
        match fs.create(&c, ROOT_INO, n(&name), 0o644, 0, libc::O_RDWR) {
            Ok((a, fh)) => {
                fs.release(a.ino, fh).unwrap();
                before.insert(format!("/{name}"), Vec::new());
            }
            Err(e) => {
                assert_eq!(e.errno(), cairn_vfs::Errno::ENOSPC);
                break (name, files_free);
            }
        }
        i += 1;
        assert!(i < 100_000, "creates never refused");
    };
    let gone = |fs: &Lfs| {
        let r = fs.lookup(&c, ROOT_INO, n(&refused)).map(|a| a.ino);
        assert!(
            matches!(&r, Err(e) if e.errno() == cairn_vfs::Errno::ENOENT),
            "{refused} was refused, yet lookup gives {r:?}"
        );
    };
    gone(&fs);
    assert_eq!(tree(&fs), before);
    assert_eq!(fs.statfs().unwrap().ffree, files_free, "an inode kept");
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    let fs = mount(&dev);
    gone(&fs);
    assert_eq!(tree(&fs), before);
    assert_eq!(fs.statfs().unwrap().ffree, files_free, "an inode kept");
}

/// Write cost at a larger scale (run by hand: `cargo test -p cairn-lfs --lib write_cost --
/// --ignored --nocapture`).
#[test]
#[ignore]
fn write_cost() {
    for policy in ["greedy", "cost-benefit+age-sort"] {
        // 64 MiB of 512 KiB segments, 75% of it in 64 KiB files.
        let (cs, ls) = overwrite_workload_on(policy, 16384, 512 << 10, 768, 40_000);
        let wc = (ls.new_data_blocks + cs.blocks_read + cs.blocks_moved) as f64
            / ls.new_data_blocks as f64;
        eprintln!("{policy}: write cost {wc:.2} {cs:?} {ls:?}");
    }
}

/// Recovery time against what was written since the last checkpoint (004 Table III): run by
/// hand, `cargo test -p cairn-lfs --lib recovery_time -- --ignored --nocapture`.
#[test]
#[ignore]
fn recovery_time() {
    for (file_kib, total_mib) in [(1usize, 1usize), (1, 10), (10, 10), (100, 10), (1, 50)] {
        let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 65536)); // 256 MiB
        mkfs_device(
            dev.clone(),
            &MkfsOptions {
                inodes: Some(60_000),
                ..Default::default()
            },
        )
        .unwrap();
        let o = MountOptions {
            checkpoint_bytes: u64::MAX,
            ..opts()
        };
        let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &o).unwrap();
        let n = total_mib * 1024 / file_kib;
        let data = vec![5u8; file_kib * 1024];
        for i in 0..n {
            write_file(&fs, ROOT_INO, &format!("f{i}"), &data);
        }
        fs.flush_log().unwrap();
        let img = dev.to_bytes();
        drop(fs);
        let crashed = Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, img));
        let t = std::time::Instant::now();
        let fs = Lfs::mount_device(crashed as Arc<dyn BlockDevice>, &opts()).unwrap();
        let el = t.elapsed();
        let s = fs.lfs_stats();
        assert!(s.rolled_forward_inodes as usize > n, "{s:?}");
        eprintln!(
            "{file_kib} KiB files, {total_mib} MiB: roll-forward of {} partial segments, {} inodes in {:.3} s",
            s.rolled_forward_partials,
            s.rolled_forward_inodes,
            el.as_secs_f64()
        );
    }
}

/// A log write that fails half-way stops all further changes (their base is gone from
/// memory) until a remount, which shows the last committed flush.
#[test]
fn a_failed_log_write_refuses_changes_until_remount() {
    let dev = image(2048);
    let fault = Arc::new(cairn_blockdev::FaultDevice::new(
        dev.clone() as Arc<dyn BlockDevice>
    ));
    let fs = Lfs::mount_device(fault.clone() as Arc<dyn BlockDevice>, &opts()).unwrap();
    let c = Ctx::root();
    write_file(&fs, ROOT_INO, "kept", b"committed");
    fs.fsync(ROOT_INO, 0, false).unwrap();
    write_file(&fs, ROOT_INO, "lost", &vec![1u8; 200_000]);
    fault.fail_nth(cairn_blockdev::FaultOp::Write, 1, true);
    assert!(fs.fsync(ROOT_INO, 0, false).is_err());
    fault.heal();
    let e = fs.mkdir(&c, ROOT_INO, n("after"), 0o755, 0).unwrap_err();
    assert_eq!(e.errno(), cairn_vfs::Errno::EIO, "{e}");
    drop(fs);
    let fs = mount(&dev);
    let t = tree(&fs);
    assert_eq!(t["/kept"], b"committed");
    assert!(!t.contains_key("/lost") && !t.contains_key("/after/"));
    drop(fs);
    assert_clean(&dev);
}

/// A `clean_start` above 99 with no `clean_stop` is a valid choice, not a panic (the default
/// stop used to be `clamp(start + 1, 100)`, whose bounds cross there).
#[test]
fn a_high_clean_start_without_a_stop_is_accepted() {
    let mut o = MountOptions::default();
    o.set("clean_start", Some("150")).unwrap();
    let th = o.thresholds(1000).unwrap();
    assert!(th.should_start(149) && !th.should_start(150), "{th:?}");
    let mut o = MountOptions::default();
    o.set("clean_start", Some("5")).unwrap();
    assert!(o.thresholds(1000).is_ok());
}

/// A file written sequentially and read back sequentially with a cold cache: one device
/// read per run of blocks that lie together in the log (a partial segment), plus
/// read-ahead, not one per block.
fn sequential_read_device_reads(readahead_kb: &str) -> (u64, u64) {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 8192));
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size: 512 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = mount(&dev);
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i / 4096 + i) as u8).collect();
    let ino = write_file(&fs, ROOT_INO, "big", &data);
    fs.destroy().unwrap();
    drop(fs);
    let mut o = opts();
    o.set("readahead_kb", Some(readahead_kb)).unwrap();
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &o).unwrap();
    fs.getattr(ino).unwrap();
    let before = dev.counters().snapshot();
    let mut got = Vec::new();
    let req = 128 << 10;
    for off in (0..data.len()).step_by(req) {
        let mut b = Vec::new();
        fs.read(ino, 0, off as u64, req as u32, &mut b).unwrap();
        got.extend_from_slice(&b);
    }
    assert!(got == data, "contents differ");
    let d = dev.counters().snapshot().delta(&before);
    eprintln!(
        "readahead_kb={readahead_kb}: {} device reads, {} blocks",
        d.reads, d.blocks_read
    );
    (d.reads, d.blocks_read)
}

#[test]
fn a_sequential_read_is_clustered_and_read_ahead() {
    // 4 MiB = 1024 blocks in 128 KiB requests (32 of them).
    let (reads, blocks) = sequential_read_device_reads("2048");
    // 8 segments of 512 KiB, a few partial segments each, and the indirect blocks; the
    // read-ahead reads go on across the summary block between two partial segments (15
    // device reads when they stop at it).
    assert!(reads <= 12, "{reads} device reads for 1024 blocks");
    assert!(blocks <= 1024 + 16, "{blocks} blocks read for 1024");
    // Without read-ahead each request is still one device read per run, never per block...
    let (reads_no_ra, _) = sequential_read_device_reads("0");
    assert!(
        reads_no_ra <= 48,
        "{reads_no_ra} device reads without read-ahead"
    );
    // ... and read-ahead makes the device reads larger and fewer than the requests.
    assert!(
        reads < reads_no_ra,
        "{reads} with read-ahead, {reads_no_ra} without"
    );
}

/// Device reads for a sequential read (1 MiB requests, no read-ahead: a mount's reader
/// has the kernel's) of a 4 MiB file written in `piece` pieces, each fsync'd if `sync`
/// (one partial segment with its indirect block and inode each), on a cold cache.
fn partial_segment_read(piece: usize, sync: bool) -> (u64, u64, u64) {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 8192));
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size: 512 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = mount(&dev);
    let c = Ctx::root();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i / 4096 + i) as u8).collect();
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("big"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    for off in (0..data.len()).step_by(piece) {
        fs.write(a.ino, fh, off as u64, &data[off..off + piece])
            .unwrap();
        if sync {
            fs.fsync(a.ino, fh, false).unwrap();
        }
    }
    fs.release(a.ino, fh).unwrap();
    fs.destroy().unwrap();
    drop(fs);
    let fs = mount(&dev);
    fs.getattr(a.ino).unwrap();
    let before = dev.counters().snapshot();
    let mut got = Vec::new();
    for off in (0..data.len()).step_by(1 << 20) {
        let mut b = Vec::new();
        fs.read(a.ino, 0, off as u64, 1 << 20, &mut b).unwrap();
        got.extend_from_slice(&b);
    }
    assert!(got == data, "contents differ");
    let d = dev.counters().snapshot().delta(&before);
    let gap = fs.lfs_stats().gap_blocks_read;
    eprintln!(
        "{piece}-byte pieces, fsync {sync}: {} device reads ({:.1}/MiB), {} blocks, {gap} dropped",
        d.reads,
        d.reads as f64 / 4.0,
        d.blocks_read
    );
    (d.reads, d.blocks_read, gap)
}

/// A file written in many partial segments is read with about one device read per run of
/// the log, not one per partial segment: the summary block between two pieces (and after
/// an fsync the piece's indirect blocks and inode) is read with the run and dropped. A
/// 4 MiB file written in 64 KiB fsync'd pieces, read in 1 MiB requests: 69 device reads
/// (17.2/MiB) before, 8 now (for 1,240 blocks instead of 1,024); written in 1 MiB writes,
/// whose partial segments end at `MAX_ENTRIES` blocks: 12 (3.0/MiB) before, 8 now.
#[test]
fn a_read_across_partial_segments_is_one_device_read_per_run() {
    let (reads, blocks, gap) = partial_segment_read(64 << 10, true);
    assert!(
        reads <= 9,
        "{reads} device reads for 4 MiB in fsync'd 64 KiB pieces"
    );
    assert!(blocks <= 1024 + 4 * 64 + 16, "{blocks} blocks read");
    assert!(gap > 0);
    let (reads, _, _) = partial_segment_read(1 << 20, false);
    assert!(reads <= 9, "{reads} device reads for 4 MiB in 1 MiB writes");
}

/// Random reads do not trigger read-ahead: each costs the block it asks for.
#[test]
fn random_reads_read_only_what_they_ask() {
    let dev = image(4096);
    let fs = mount(&dev);
    let data = vec![7u8; 2 << 20];
    let ino = write_file(&fs, ROOT_INO, "f", &data);
    fs.destroy().unwrap();
    drop(fs);
    let fs = mount(&dev);
    fs.getattr(ino).unwrap();
    let mut x = 99u64;
    let before = dev.counters().snapshot();
    for _ in 0..64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        let blk = (x >> 33) % 512;
        let mut b = Vec::new();
        fs.read(ino, 0, blk * 4096, 4096, &mut b).unwrap();
        assert_eq!(b, vec![7u8; 4096]);
    }
    let d = dev.counters().snapshot().delta(&before);
    // 64 blocks (fewer if two reads hit the same one) and the file's indirect blocks.
    assert!(
        d.blocks_read <= 64 + 8,
        "{} blocks read for 64 random blocks",
        d.blocks_read
    );
}

#[test]
fn read_ahead_window_grows_on_sequential_reads_and_resets_on_a_seek() {
    let mut ra = ReadAhead::default();
    // First read at 0 of 32 blocks: window 64, read ahead 32..96.
    assert_eq!(ra.plan(0, 32, 512), Some((32, 64)));
    // Next sequential: window 128, ahead from 96 to 64 + 128.
    assert_eq!(ra.plan(32, 32, 512), Some((96, 96)));
    // A seek: nothing ahead, window reset.
    assert_eq!(ra.plan(1000, 1, 512), None);
    assert_eq!(ra.plan(5, 1, 512), None);
    // Sequential again from there: a fresh small window.
    assert_eq!(ra.plan(6, 1, 512), Some((7, 8)));
    // Turned off.
    let mut off = ReadAhead::default();
    assert_eq!(off.plan(0, 32, 0), None);
    // The window never exceeds the maximum.
    let mut big = ReadAhead::default();
    let mut at = 0;
    for _ in 0..20 {
        if let Some((_, k)) = big.plan(at, 32, 256) {
            assert!(k <= 256);
        }
        at += 32;
    }
}

/// A segment's age for cost-benefit counts from its last write, the cleaner's included
/// (`State::push`): the segments the cleaner fills with old blocks it moved are young.
/// Stamped with the blocks' own (old) times instead, they looked like the oldest segments
/// on the disk and cost-benefit cleaned them again while they were nearly full (on a
/// 64 MiB disk at 75% with hot-and-cold overwrites: write cost 9.77 against 6.69).
#[test]
fn segments_the_cleaner_writes_are_young() {
    let dev = image(4096);
    let o = MountOptions {
        cleaner: crate::cleaner::policy::Policy::GREEDY,
        logical_clock: true,
        ..opts()
    };
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &o).unwrap();
    let c = Ctx::root();
    // 64 one-block files kept, 64 deleted, interleaved in the log: segments half live.
    let mut keep = Vec::new();
    for i in 0..64 {
        keep.push(write_file(&fs, ROOT_INO, &format!("c{i}"), &[1u8; 4096]));
        write_file(&fs, ROOT_INO, &format!("j{i}"), &[2u8; 4096]);
    }
    fs.checkpoint().unwrap();
    for i in 0..64 {
        fs.unlink(&c, ROOT_INO, n(&format!("j{i}"))).unwrap();
    }
    // Time passes: a few hundred blocks go through the log.
    let big = write_file(&fs, ROOT_INO, "big", &vec![3u8; 1 << 20]);
    fs.checkpoint().unwrap();
    let _ = big;
    let (t0, old_segs) = {
        let mut st = fs.st.lock();
        let t0 = st.clock();
        let mut segs = BTreeSet::new();
        for &ino in &keep {
            let a = *st.map(ino).unwrap().get(&0).unwrap();
            segs.insert(st.sb.seg_of(a).unwrap());
        }
        (t0, segs)
    };
    let before = fs.clean_segments();
    assert!(fs.clean_now(before + 4).unwrap() > 0, "nothing cleaned");
    let mut st = fs.st.lock();
    let mut moved = 0;
    for &ino in &keep {
        let a = *st.map(ino).unwrap().get(&0).unwrap();
        let s = st.sb.seg_of(a).unwrap();
        if old_segs.contains(&s) {
            continue;
        }
        moved += 1;
        let y = st.usage[s as usize].youngest;
        assert!(
            y >= t0,
            "segment {s} holding moved blocks is dated {y}, before the pass ({t0})"
        );
    }
    assert!(
        moved > 16,
        "only {moved} blocks moved: the test needs a segment of them"
    );
}

#[test]
fn default_cleaning_thresholds_clean_a_few_segments_at_a_time() {
    let o = MountOptions::default();
    let t = |segs| {
        let th = o.thresholds(segs).unwrap();
        (th.start_below(), th.stop_at())
    };
    assert_eq!(t(511), (20, 30));
    assert_eq!(t(1000), (20, 40));
    // Beyond 1,000 segments the start grows with the disk (a fiftieth, up to 100).
    assert_eq!(t(2048), (40, 80));
    assert_eq!(t(8192), (100, 200));
    assert_eq!(t(127), (12, 14));
    assert_eq!(t(8), (2, 4));
}

/// The usage table's clean count follows every change of an entry, whichever way it goes,
/// and a segment the log takes stops counting as clean.
#[test]
fn the_usage_tables_clean_count_follows_its_entries() {
    use crate::log::Segments;
    let mut u = super::Usage::new(
        vec![crate::format::tables::UsageEntry::default(); 4],
        Vec::new(),
    );
    assert_eq!(u.clean(), 4);
    u.update(1, |e| {
        e.dirty = true;
        e.live_bytes = 4096;
    });
    assert_eq!(u.clean(), 3);
    u.update(1, |e| e.live_bytes = 0);
    assert_eq!(
        u.clean(),
        3,
        "no live bytes is not clean until a checkpoint says so"
    );
    u.update(1, |e| e.dirty = false);
    assert_eq!(u.clean(), 4);
    assert_eq!(u.update(9, |e| e.dirty = true), None);
    let s = u.take_clean(&[0]).unwrap();
    assert_eq!((s, u.clean()), (1, 3));
    assert!(u[1].dirty);
}

/// A 64 MiB image of 512 KiB segments mounted with small cleaning thresholds (start below
/// 4 clean segments, stop at 8) and a 1 MiB write buffer: the setting in which the cleaner
/// once refused its passes at 75% utilization and writes failed with ENOSPC while a
/// quarter of the disk was free.
fn small_threshold_opts() -> MountOptions {
    MountOptions {
        clean_start: Some(4),
        clean_stop: Some(8),
        dirty_limit: 1 << 20,
        logical_clock: true,
        ..opts()
    }
}

fn small_threshold_fs(o: &MountOptions) -> (Arc<MemDevice>, Arc<Lfs>) {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 16384));
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size: 512 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, o).unwrap();
    (dev, fs)
}

/// Fills `frac` of the log's bytes with 64 KiB files, then overwrites `wsize` pieces of
/// them (90% of the writes to a tenth of the files) until `total` bytes are written. Every
/// write must succeed; the files then read back as written, and the image checks clean.
fn fill_then_overwrite(frac: f64, wsize: usize, total: u64) {
    if let Err(e) = try_fill_then_overwrite(frac, wsize, total, &small_threshold_opts()) {
        panic!("{e}");
    }
}

fn try_fill_then_overwrite(
    frac: f64,
    wsize: usize,
    total: u64,
    o: &MountOptions,
) -> std::result::Result<(), String> {
    let (dev, fs) = small_threshold_fs(o);
    let c = Ctx::root();
    let log_bytes = {
        let st = fs.st.lock();
        st.sb.segments as u64 * st.sb.segment_blocks as u64 * BS
    };
    let nfiles = ((log_bytes as f64 * frac) as u64 / (64 << 10)) as usize;
    let mut model: Vec<Vec<u8>> = Vec::new();
    let mut inos = Vec::new();
    for i in 0..nfiles {
        let data = vec![i as u8; 64 << 10];
        let (a, fh) = fs
            .create(&c, ROOT_INO, n(&format!("f{i}")), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(a.ino, fh, 0, &data)
            .unwrap_or_else(|e| panic!("filling, file {i} of {nfiles}: {e}"));
        fs.release(a.ino, fh).unwrap();
        inos.push(a.ino);
        model.push(data);
    }
    let mut x = 99u64;
    let rounds = total / wsize as u64;
    for round in 0..rounds {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let hot = (nfiles / 10).max(1);
        let f = if (x >> 33) % 10 < 9 {
            (x >> 40) as usize % hot
        } else {
            hot + (x >> 40) as usize % (nfiles - hot)
        };
        let piece = (x >> 20) as usize % ((64 << 10) / wsize);
        let val = (round % 251) as u8;
        let fh = fs.open(&c, inos[f], libc::O_RDWR).unwrap();
        fs.write(inos[f], fh, (piece * wsize) as u64, &vec![val; wsize])
            .map_err(|e| {
                let st = fs.st.lock();
                let live: u64 = st.usage.iter().map(|u| u.live_bytes as u64).sum();

                format!(
                    "{:.0}% full, round {round} of {rounds}: {e}; {} clean segments, \
                     live {live} of {log_bytes} bytes, {:?}",
                    frac * 100.0,
                    st.clean_segments(),
                    st.cleaner
                )
            })?;
        fs.release(inos[f], fh).unwrap();
        model[f][piece * wsize..(piece + 1) * wsize].fill(val);
    }
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    let fs = mount(&dev);
    for (i, want) in model.iter().enumerate() {
        let mut got = Vec::new();
        fs.read(inos[i], 0, 0, want.len() as u32, &mut got).unwrap();
        assert!(got == *want, "file {i} differs after cleaning");
    }
    Ok(())
}

/// 004 §3.4 and the issue: "never a failed write while space remains". With the small
/// thresholds, 80% of the log in files (about 85% live with their inodes and indirect
/// blocks) and overwrites of three times the disk in 16 KiB pieces all succeed. The room
/// rule this replaced (three quarters of the clean segments but one) refused every pass
/// once two segments were clean and failed at round 1665.
#[test]
fn small_thresholds_at_80_percent_never_fail_a_write() {
    fill_then_overwrite(0.80, 16 << 10, 192 << 20);
}

/// The same with 4 KiB overwrites, each of which rewrites an indirect block and an inode
/// too: at 78% the old rule failed at round 11604.
#[test]
fn small_thresholds_at_78_percent_4k_overwrites_never_fail() {
    fill_then_overwrite(0.78, 4096, 64 << 20);
}

/// Near the real limit: 86% of the log in files (92% live) leaves the cleaner a few
/// segments' worth of dead blocks spread over the disk, still enough (the old rule failed
/// at round 134, having run no pass at all).
#[test]
fn small_thresholds_at_86_percent_never_fail_a_write() {
    fill_then_overwrite(0.86, 16 << 10, 64 << 20);
}

/// Thresholds as low as they go (start below 1, stop at 1): the background cleaner never
/// runs before file data is refused, and foreground cleaning alone keeps writes going.
#[test]
fn lowest_thresholds_leave_foreground_cleaning_to_keep_writes_going() {
    let o = MountOptions {
        clean_start: Some(1),
        clean_stop: Some(1),
        ..small_threshold_opts()
    };
    if let Err(e) = try_fill_then_overwrite(0.80, 16 << 10, 64 << 20, &o) {
        panic!("{e}");
    }
}

/// The other half of the rule: when live data really fills the disk, writes fail with
/// ENOSPC, the image stays consistent (the log keeps the clean segments its checkpoints
/// need), and deleting a file makes writes possible again.
#[test]
fn filling_to_enospc_keeps_the_image_consistent_and_a_delete_frees_room() {
    let o = small_threshold_opts();
    let (dev, fs) = small_threshold_fs(&o);
    let c = Ctx::root();
    let mut files = Vec::new();
    let full = 'fill: loop {
        let i = files.len();
        let (a, fh) = match fs.create(&c, ROOT_INO, n(&format!("f{i}")), 0o644, 0, libc::O_RDWR) {
            Ok(x) => x,
            Err(e) => break 'fill e,
        };
        let mut written = 0u64;
        let r = loop {
            if written == 256 << 10 {
                break Ok(());
            }
            match fs.write(a.ino, fh, written, &[i as u8; 64 << 10]) {
                Ok(k) => written += k as u64,
                Err(e) => break Err(e),
            }
        };
        fs.release(a.ino, fh).unwrap();
        files.push((a.ino, written));
        if let Err(e) = r {
            break e;
        }
        assert!(files.len() < 1000, "never ran out");
    };
    assert_eq!(full.errno(), cairn_vfs::Errno::ENOSPC);
    // Really full: live blocks take nearly all of the log.
    let (live, log_bytes) = {
        let st = fs.st.lock();
        let live: u64 = st.usage.iter().map(|u| u.live_bytes as u64).sum();
        (
            live,
            st.sb.segments as u64 * st.sb.segment_blocks as u64 * BS,
        )
    };
    assert!(
        live * 100 > log_bytes * 93,
        "ENOSPC with only {live} of {log_bytes} bytes live"
    );
    // Overwrites of a full disk, 4 KiB at a time over many files (each rewriting an
    // indirect block and an inode too), succeed or fail with ENOSPC — and never take the
    // last clean segment the log needs to checkpoint.
    let mut x = 7u64;
    for k in 0..1000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let (ino, size) = files[(x >> 33) as usize % files.len()];
        if size == 0 {
            continue;
        }
        let fh = fs.open(&c, ino, libc::O_RDWR).unwrap();
        match fs.write(ino, fh, ((x >> 20) % (size / 4096)) * 4096, &[7u8; 4096]) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.errno(), cairn_vfs::Errno::ENOSPC),
        }
        fs.release(ino, fh).unwrap();
        assert!(
            fs.clean_segments() >= 1,
            "overwrite {k}: the log has no clean segment left"
        );
    }
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &o).unwrap();
    for (i, &(ino, size)) in files.iter().enumerate().skip(1) {
        assert_eq!(fs.getattr(ino).unwrap().size, size, "file {i}");
    }
    // Deletes give their room back: a file of half their size fits again (written in
    // 16 KiB pieces: the room is in segments the cleaner must empty first, and what it
    // moves rewrites indirect blocks and inodes too).
    fs.unlink(&c, ROOT_INO, n("f1")).unwrap();
    fs.unlink(&c, ROOT_INO, n("f2")).unwrap();
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("again"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    for k in 0..16u64 {
        fs.write(a.ino, fh, k * (16 << 10), &[9u8; 16 << 10])
            .unwrap_or_else(|e| panic!("piece {k} after the delete: {e}"));
    }
    fs.release(a.ino, fh).unwrap();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// An indirect block the cleaner moves takes the block naming it along: a double indirect
/// block's child rewritten elsewhere while its parent kept the old address would leave
/// the file pointing into a segment the cleaner has freed. Forty children of one double
/// indirect block, each naming one data block: the middle child's segment (16-block
/// segments) holds only children, so nothing else in it makes the parent dirty.
#[test]
fn a_moved_indirect_block_rewrites_its_parent() {
    let dev = image(4096);
    let fs = mount(&dev);
    let c = Ctx::root();
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("sparse"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    for i in 0..40u64 {
        fs.write(a.ino, fh, (D_FIRST + i * PTRS) * BS, &[i as u8; 4096])
            .unwrap();
    }
    fs.release(a.ino, fh).unwrap();
    fs.checkpoint().unwrap();
    let mut st = fs.st.lock();
    let child = 2 + 20;
    st.map(a.ino).unwrap();
    let addr = st.nodes[&a.ino].ind[&child];
    let seg = st.sb.seg_of(addr).unwrap();
    let scan = st.scan_segment(seg);
    let mut w = crate::cleaner::clean::Work::default();
    st.collect_live(&scan, &mut w).unwrap();
    assert!(w.slots.contains(&(a.ino, child)), "{:?}", w.slots);
    assert!(
        w.slots.contains(&(a.ino, 1)),
        "the double indirect block is not rewritten: {:?}",
        w.slots
    );
}

#[test]
fn cleaning_thresholds_above_the_segment_count_are_refused() {
    let mut o = MountOptions::default();
    o.set("clean_stop", Some("200")).unwrap();
    let e = o.thresholds(127).unwrap_err();
    assert!(e.contains("clean_stop=200") && !e.contains('\n'), "{e}");
    // The defaults of a tiny image are clamped, not refused.
    let th = MountOptions::default().thresholds(4).unwrap();
    assert!(th.stop_at() <= 2, "{th:?}");
}

/// Sequential read throughput on a memory device, cold cache (run by hand for profiling:
/// `cargo test -p cairn-lfs --lib sequential_read_speed -- --ignored --nocapture`).
#[test]
#[ignore]
fn sequential_read_speed() {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 65536));
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size: 512 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = mount(&dev);
    let (a, fh) = fs
        .create(&Ctx::root(), ROOT_INO, n("big"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..192u64 {
        fs.write(a.ino, fh, i << 20, &chunk).unwrap();
    }
    fs.release(a.ino, fh).unwrap();
    fs.destroy().unwrap();
    drop(fs);
    let rounds = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        let fs = mount(&dev);
        let t = std::time::Instant::now();
        let before = dev.counters().snapshot();
        let mut b = Vec::new();
        let mut total = 0u64;
        for off in (0..192u64 << 20).step_by(128 << 10) {
            fs.read(a.ino, 0, off, 128 << 10, &mut b).unwrap();
            total += b.len() as u64;
        }
        let d = dev.counters().snapshot().delta(&before);
        let s = t.elapsed().as_secs_f64();
        eprintln!(
            "round {round}: {} MiB in {s:.3} s = {:.0} MiB/s, {} device reads",
            total >> 20,
            (total >> 20) as f64 / s,
            d.reads
        );
    }
}

/// Reads at any offset and length return the file's bytes whatever each block's source:
/// a hole, a block still buffered, a cached one, one read from the device (the reply is
/// built block by block in order and handed over without a copy; a request that starts
/// inside a block drops the bytes before it).
#[test]
fn reads_at_any_offset_see_holes_buffered_cached_and_device_blocks() {
    let dev = image(4096);
    let fs = mount(&dev);
    let c = Ctx::root();
    let mut model = vec![0u8; 60 * 4096 + 123];
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("f"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    let put = |model: &mut Vec<u8>, off: usize, len: usize, v: u8| {
        let d: Vec<u8> = (0..len).map(|i| v ^ (i % 251) as u8).collect();
        fs.write(a.ino, fh, off as u64, &d).unwrap();
        model[off..off + len].copy_from_slice(&d);
    };
    // Blocks 0..10 and 16..60 on the device (blocks 10..16 a hole), then a few buffered.
    put(&mut model, 0, 10 * 4096, 1);
    put(&mut model, 16 * 4096, 44 * 4096 + 123, 2);
    fs.flush_log().unwrap();
    put(&mut model, 20 * 4096 + 100, 5000, 3);
    put(&mut model, 40 * 4096, 4096, 4);
    let check = |fs: &Lfs| {
        let mut x = 5u64;
        for _ in 0..300 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) as usize % model.len();
            let len = (x >> 40) as usize % (70 << 10);
            let mut got = vec![7u8; 3];
            fs.read(a.ino, fh, off as u64, len as u32, &mut got)
                .unwrap();
            let want = &model[off..(off + len).min(model.len())];
            assert!(got == want, "read of {len} at {off}");
        }
    };
    check(&fs);
    fs.release(a.ino, fh).unwrap();
    fs.destroy().unwrap();
    drop(fs);
    // Cold: every block from the device or read ahead into the cache.
    let fs = mount(&dev);
    check(&fs);
}

/// A read resolves its addresses under the lock and reads the device without it; `planted`
/// decides whether checkpoints respect the read's pins. Between the plan and the device
/// read (the read hook), the file is overwritten, its old segment emptied and checkpointed,
/// and the log made to go round the disk several times. Returns what the read returned and
/// what the file held when the read began.
fn read_across_segment_reuse(planted: Planted) -> (Vec<u8>, Vec<u8>, LfsStats) {
    let dev = image(2048);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    let old: Vec<u8> = (0..8 * 4096u32).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    let ino = write_file(&fs, ROOT_INO, "f", &old);
    fs.checkpoint().unwrap();
    let weak = Arc::downgrade(&fs);
    let fired = Arc::new(AtomicBool::new(false));
    let f2 = fired.clone();
    *fs.read_hook.lock() = Some(Box::new(move || {
        if f2.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let fs = weak.upgrade().unwrap();
        let c = Ctx::root();
        let fh = fs.open(&c, ino, libc::O_RDWR).unwrap();
        fs.write(ino, fh, 0, &vec![0xeeu8; 8 * 4096]).unwrap();
        fs.release(ino, fh).unwrap();
        fs.checkpoint().unwrap();
        // Scratch files written and removed: 10 times the disk through the log.
        for i in 0..160 {
            write_file(&fs, ROOT_INO, &format!("s{i}"), &vec![i as u8; 128 << 10]);
            fs.flush_log().unwrap();
            fs.unlink(&c, ROOT_INO, n(&format!("s{i}"))).unwrap();
            fs.clean_now(fs.clean_segments() + 8).unwrap();
            fs.checkpoint().unwrap();
        }
    }));
    let mut got = Vec::new();
    fs.read(ino, 0, 0, old.len() as u32, &mut got).unwrap();
    assert!(fired.load(std::sync::atomic::Ordering::SeqCst));
    *fs.read_hook.lock() = None;
    let stats = fs.lfs_stats();
    (got, old, stats)
}

#[test]
fn a_read_outside_the_lock_holds_its_segments_against_reuse() {
    let (got, want, _) = read_across_segment_reuse(Planted::None);
    assert!(got == want, "the read returned blocks of a reused segment");
}

/// The broken variant: the cleaner and checkpoints ignore the pins, the segment is cleaned
/// and reused under the read.
#[test]
fn a_read_without_the_gate_is_caught() {
    let (got, want, _) = read_across_segment_reuse(Planted::NoReadGate);
    assert!(
        got != want,
        "the test cannot tell a read that lost its segment"
    );
}

/// The race test's generator (the simulator's: SplitMix64).
struct Xs(crate::sim::rng::Rng);
impl Xs {
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n
    }
}

/// Contents of block `blk` of file `f` at version `v` of the race test.
fn race_block(f: usize, blk: u64, v: u32) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    for (i, x) in b.chunks_mut(8).enumerate() {
        let w = (f as u64) << 48 | blk << 32 | (v as u64) << 12 | i as u64;
        x.copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// Reads and overwrites race background cleaning passes (victims read without the lock,
/// checkpoints written without it) and checkpoints. One thread overwrites and reads back
/// its files against a model; one reads files nothing changes; one cleans and
/// checkpoints without pause. Every read must show exactly the model. With `log_writer`,
/// the log's partial segments are written by a writer thread, outside the lock
/// (`sequencer.rs`): reads, overwrites and passes meet blocks in flight.
fn race_cleaning(
    planted: Planted,
    seed: u64,
    log_writer: bool,
) -> std::result::Result<CleanerStats, String> {
    use std::sync::atomic::Ordering::SeqCst;
    eprintln!("race_cleaning: seed {seed} ({planted:?}, log writer {log_writer})");
    let dev = image(4096);
    let o = MountOptions {
        syncer: false,
        dirty_limit: 256 << 10,
        ..Default::default()
    };
    let fs = Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &o, planted).unwrap();
    if log_writer {
        attach_sequencer(&fs, true);
    }
    const FILES: usize = 48;
    const BLOCKS: u64 = 24;
    let c = Ctx::root();
    let mut inos = Vec::new();
    for f in 0..2 * FILES {
        let data: Vec<u8> = (0..BLOCKS).flat_map(|b| race_block(f, b, 0)).collect();
        inos.push(write_file(&fs, ROOT_INO, &format!("f{f}"), &data));
    }
    fs.checkpoint().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let failed: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let check = |f: usize, ino: u64, model: &[u32], rng: &mut Xs| -> Option<String> {
        let first = rng.below(BLOCKS);
        let n = 1 + rng.below(BLOCKS - first);
        let mut got = Vec::new();
        if let Err(e) = fs.read(ino, 0, first * BS, (n * BS) as u32, &mut got) {
            return Some(format!("read of file {f}: {e}"));
        }
        for (k, blk) in (first..first + n).enumerate() {
            let want = race_block(f, blk, model[blk as usize]);
            if got.get(k * BLOCK_SIZE..(k + 1) * BLOCK_SIZE) != Some(&want[..]) {
                return Some(format!(
                    "file {f} block {blk}: not version {} (seed {seed})",
                    model[blk as usize]
                ));
            }
        }
        None
    };
    std::thread::scope(|s| {
        // The cleaner: passes of the background kind, checkpoints between them.
        s.spawn(|| {
            while !stop.load(SeqCst) {
                let th = Thresholds::new(1, fs.clean_segments() + 6).unwrap();
                let r = fs
                    .clean_pass_unlocked(Policy::GREEDY, th)
                    .and_then(|_| fs.checkpoint());
                if let Err(e) = r {
                    *failed.lock() = Some(format!("cleaner: {e}"));
                    stop.store(true, SeqCst);
                }
            }
        });
        // The reader of files nothing changes.
        s.spawn(|| {
            let mut rng = Xs(crate::sim::rng::Rng::new(crate::sim::rng::derive(
                seed,
                &[1],
            )));
            let model = vec![0u32; BLOCKS as usize];
            while !stop.load(SeqCst) {
                let f = FILES + rng.below(FILES as u64) as usize;
                if let Some(e) = check(f, inos[f], &model, &mut rng) {
                    *failed.lock() = Some(e);
                    stop.store(true, SeqCst);
                }
            }
        });
        // The writer, with its model.
        let mut rng = Xs(crate::sim::rng::Rng::new(seed));
        let mut model = vec![vec![0u32; BLOCKS as usize]; FILES];
        for i in 0..4000u32 {
            if stop.load(SeqCst) {
                break;
            }
            let f = rng.below(FILES as u64) as usize;
            if rng.below(3) == 0 {
                if let Some(e) = check(f, inos[f], &model[f], &mut rng) {
                    *failed.lock() = Some(e);
                    break;
                }
                continue;
            }
            let first = rng.below(BLOCKS);
            let n = 1 + rng.below(4.min(BLOCKS - first));
            let v = i + 1;
            let data: Vec<u8> = (first..first + n)
                .flat_map(|b| race_block(f, b, v))
                .collect();
            let fh = fs.open(&c, inos[f], libc::O_RDWR).unwrap();
            fs.write(inos[f], fh, first * BS, &data).unwrap();
            fs.release(inos[f], fh).unwrap();
            for b in first..first + n {
                model[f][b as usize] = v;
            }
            if i % 16 == 0 {
                fs.flush_log().unwrap();
            }
        }
        stop.store(true, SeqCst);
        // Everything once more, after the last pass.
        for (f, m) in model.iter().enumerate() {
            let mut got = Vec::new();
            fs.read(inos[f], 0, 0, (BLOCKS * BS) as u32, &mut got)
                .unwrap();
            let want: Vec<u8> = (0..BLOCKS)
                .flat_map(|b| race_block(f, b, m[b as usize]))
                .collect();
            if got != want {
                failed
                    .lock()
                    .get_or_insert(format!("file {f} at the end (seed {seed})"));
            }
        }
    });
    let stats = fs.cleaner_stats();
    if let Some(e) = failed.lock().take() {
        return Err(e);
    }
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    Ok(stats)
}

/// `CAIRN_SEED`, or the clock's nanoseconds (printed by the test).
fn race_seed() -> u64 {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    };
    std::env::var("CAIRN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(now)
}

#[test]
fn reads_and_overwrites_race_background_cleaning() {
    // Log writes under the lock, then by a writer thread outside it (`sequencer.rs`).
    for log_writer in [false, true] {
        let stats = race_cleaning(Planted::None, race_seed(), log_writer).unwrap();
        assert!(
            stats.passes > 5 && stats.blocks_moved > 0 && stats.split_passes > 0,
            "{stats:?}"
        );
    }
}

/// The broken variant: a pass that moves what its victims' summaries name without
/// checking the file still points there brings old blocks back.
#[test]
fn a_pass_without_revalidation_is_caught() {
    let r = race_cleaning(Planted::NoRevalidation, race_seed(), false);
    assert!(r.is_err(), "the race test cannot tell stale blocks: {r:?}");
}

/// A background pass takes at most half the clean segments beyond the reserve while no
/// call waits for room, so that it reserves its room and runs in slices with calls writing
/// into the rest; with a call waiting, the whole room (the pass that frees the most
/// soonest). The same image twice, a pass asked for more than the disk can give: the
/// waited-for pass moves more, and the other's log fits in its half.
#[test]
fn a_background_pass_leaves_calls_half_the_room_unless_they_wait() {
    let pass = |waiting: usize| {
        let dev = image(1024);
        let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()).unwrap();
        forty_files_a_quarter_overwritten(&fs);
        let (clean, kept) = {
            let st = fs.st.lock();
            (st.clean_segments(), RESERVE_SEGMENTS)
        };
        let th = Thresholds::new(1, clean + 40).unwrap();
        fs.room_waiters
            .store(waiting, std::sync::atomic::Ordering::Relaxed);
        let entered0 = fs.st.lock().log.segments_entered;
        fs.clean_pass_unlocked(Policy::GREEDY, th).unwrap().unwrap();
        fs.room_waiters
            .store(0, std::sync::atomic::Ordering::Relaxed);
        let entered = fs.st.lock().log.segments_entered - entered0;
        let cs = fs.cleaner_stats();
        fs.destroy().unwrap();
        drop(fs);
        assert_clean(&dev);
        (cs, entered, (kept + (clean - kept) / 2) as u64)
    };
    let (shared, entered, half) = pass(0);
    let (whole, _, _) = pass(1);
    eprintln!(
        "shared: {shared:?}, {entered} segments entered (half: {half}); waited for: {whole:?}"
    );
    // The choice counts the pass's log against half the room; its slices' summaries may
    // take a segment more (`State::slice_reserve`).
    assert!(
        entered <= half + 1,
        "{entered} segments entered, half the room is {half}"
    );
    assert_eq!(
        shared.split_passes, 1,
        "the pass could not reserve its room"
    );
    assert!(
        shared.blocks_moved < whole.blocks_moved,
        "shared {shared:?}, whole {whole:?}"
    );
}

/// A background pass reads its victims without the lock, after flushing what calls
/// buffered: the flush kills the old copies of the blocks it writes, so the segments worth
/// cleaning are the ones the ranking names after it. Ten files' middles overwritten and
/// only buffered: their segments look as full as the rest until the flush, the least
/// utilized after it; read before it, the pass read none of them and took them under the
/// lock.
#[test]
fn a_background_pass_reads_the_victims_it_takes_without_the_lock() {
    let dev = image(1024);
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let c = Ctx::root();
    for i in 30..40 {
        let f = fs.lookup(&c, ROOT_INO, n(&format!("f{i}"))).unwrap();
        let fh = fs.open(&c, f.ino, libc::O_RDWR).unwrap();
        fs.write(f.ino, fh, 3 * BS, &[0xee; 6 * BLOCK_SIZE])
            .unwrap();
        fs.release(f.ino, fh).unwrap();
    }
    assert!(
        fs.st.lock().dirty.data_blocks() > 0,
        "the overwrites are buffered"
    );
    let clean = fs.st.lock().clean_segments();
    let th = Thresholds::new(1, clean + 3).unwrap();
    let cleaned = fs.clean_pass_unlocked(Policy::GREEDY, th).unwrap();
    let cs = fs.cleaner_stats();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    assert!(cleaned.is_some_and(|n| n > 0), "{cs:?}");
    assert_eq!(cs.segments_read_under_lock, 0, "{cs:?}");
}

/// A background pass writes what its moves dirtied (the moved files' inodes) in a flush of
/// its own before the checkpoint, so the checkpoint's hold writes only the inode map, the
/// usage table and what calls changed since: with no call between, the partial segments
/// after the last commit before the checkpoint's hold name no inode.
#[test]
fn a_background_pass_flushes_its_moves_before_its_checkpoint() {
    use crate::format::summary::FLAG_COMMIT;
    let dev = image(1024);
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let clean = fs.st.lock().clean_segments();
    let th = Thresholds::new(1, clean + 3).unwrap();
    fs.clean_pass_unlocked(Policy::GREEDY, th).unwrap().unwrap();
    let cs = fs.cleaner_stats();
    assert!(cs.split_passes == 1 && cs.blocks_moved > 0, "{cs:?}");
    let scan = {
        let mut st = fs.st.lock();
        let head = st.log.seg;
        st.scan_segment(head)
    };
    // The checkpoint's partial segments: those after the last commit before the final one,
    // or after the last one with a moved block (the slices write their inodes ahead, not
    // committed, and with no call between them the flush after the moves writes nothing).
    let ends: Vec<usize> = (0..scan.len())
        .filter(|&i| {
            scan[i].0.flags & FLAG_COMMIT != 0
                || scan[i].0.entries.iter().any(|e| e.kind == Kind::Data)
        })
        .collect();
    let from = match ends.len() {
        0 => panic!("no commit in the log's head"),
        1 => 0,
        n => ends[n - 2] + 1,
    };
    let kinds: Vec<Kind> = scan[from..]
        .iter()
        .flat_map(|(s, _)| s.entries.iter().map(|e| e.kind))
        .collect();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    assert!(kinds.contains(&Kind::Usage), "{kinds:?}");
    assert!(
        !kinds.contains(&Kind::Inode),
        "the checkpoint wrote inodes: {kinds:?}"
    );
}

/// A background pass in slices writes, with each slice's moves, the inodes of the files
/// it moved last: the flush after its moves (a hold every call waits for) writes only what
/// came since — here nothing, no call running between the slices. With
/// `Planted::NoInodesAhead` (the slices write no inode) that flush writes every inode
/// the moves dirtied, and the test fails.
fn inodes_ahead(planted: Planted) -> CleanerStats {
    let dev = image(1024);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let clean = fs.st.lock().clean_segments();
    let th = Thresholds::new(1, clean + 3).unwrap();
    fs.clean_pass_unlocked(Policy::GREEDY, th).unwrap().unwrap();
    let cs = fs.cleaner_stats();
    eprintln!("{cs:?}");
    // Several slices, or the test shows nothing.
    assert!(
        cs.split_passes == 1 && cs.blocks_moved > 2 * MOVE_SLICE_TEST,
        "{cs:?}"
    );
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    cs
}

const MOVE_SLICE_TEST: u64 = 16;

#[test]
fn a_pass_in_slices_writes_its_inodes_with_its_moves() {
    let cs = inodes_ahead(Planted::None);
    assert!(cs.inodes_written_by_slices > 0, "{cs:?}");
    assert_eq!(cs.most_moves_flush_blocks, 0, "{cs:?}");
}

#[test]
fn a_pass_leaving_its_inodes_to_the_flush_after_its_moves_is_caught() {
    let cs = inodes_ahead(Planted::NoInodesAhead);
    assert!(cs.most_moves_flush_blocks > 0, "{cs:?}");
}

/// A background pass writes the inode map blocks dirty after its moves ahead of its
/// checkpoint, two per hold in tests (`State::write_imap_ahead`), so the checkpoint's hold
/// writes only what calls dirtied since. Here 800 files spread over four blocks of the map
/// have their mode changed, buffered, before the pass (its first flush writes them): after
/// it and a remount every change must be there, and the image check clean. With
/// `Planted::ImapAheadDropsRest` (the first hold takes every dirty block off the dirty set
/// and writes two) the checkpoint names stale blocks: `Err` names what the remount shows.
fn imap_ahead(planted: Planted) -> std::result::Result<CleanerStats, String> {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 2048));
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size: 64 << 10,
            inodes: Some(2048),
            ..Default::default()
        },
    )
    .unwrap();
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let c = Ctx::root();
    let mut inos = Vec::new();
    for i in 0..800 {
        let (a, fh) = fs
            .create(&c, ROOT_INO, n(&format!("e{i}")), 0o644, 0, libc::O_WRONLY)
            .unwrap();
        fs.release(a.ino, fh).unwrap();
        inos.push(a.ino);
    }
    fs.checkpoint().unwrap();
    let blocks: BTreeSet<u64> = inos
        .iter()
        .map(|&i| i / crate::format::tables::PER_BLOCK as u64)
        .collect();
    assert!(blocks.len() >= 4, "the files span {blocks:?} of the map");
    for &ino in &inos {
        let set = cairn_vfs::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        fs.setattr(&c, ino, set).unwrap();
    }
    let th = Thresholds::new(1, fs.clean_segments() + 3).unwrap();
    let cleaned = fs.clean_pass_unlocked(Policy::GREEDY, th).unwrap();
    let cs = fs.cleaner_stats();
    eprintln!("{cleaned:?} {cs:?}");
    assert!(
        cleaned.is_some() && cs.split_passes == 1 && cs.imap_blocks_ahead > 0,
        "the pass wrote no inode map block ahead: {cs:?}"
    );
    fs.destroy().unwrap();
    drop(fs);
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts())
        .map_err(|e| format!("remount: {e}"))?;
    for &ino in &inos {
        match fs.getattr(ino) {
            Ok(a) if a.perm == 0o600 => {}
            Ok(a) => return Err(format!("inode {ino} has mode {:o} after remount", a.perm)),
            Err(e) => return Err(format!("inode {ino} after remount: {e}")),
        }
    }
    fs.destroy().map_err(|e| format!("unmount: {e}"))?;
    drop(fs);
    let r = check_device(dev.clone() as Arc<dyn BlockDevice>).map_err(|e| format!("{e}"))?;
    if !r.is_clean() {
        return Err(format!("{:#?}", r.findings));
    }
    Ok(cs)
}

#[test]
fn a_pass_writes_the_inode_map_ahead_of_its_checkpoint() {
    let cs = imap_ahead(Planted::None).unwrap();
    assert!(cs.imap_blocks_ahead >= 2, "{cs:?}");
}

#[test]
fn an_inode_map_written_ahead_without_its_dirty_blocks_is_caught() {
    let r = imap_ahead(Planted::ImapAheadDropsRest);
    eprintln!("{r:?}");
    assert!(r.is_err(), "stale inode map blocks went unnoticed: {r:?}");
}

/// Calls between every two slices of a pass dirty again the files it moved — overwriting
/// their blocks (the last few left buffered for the next slice, whose inodes it must then
/// not write ahead of that data), flushing every 16 — as long as there is room.
/// The inodes the slices wrote ahead are written again by the calls' flushes and the
/// flush after the moves: that is the calls' room, not the pass's; the pass must end
/// within its reservation, clean, and the image check with every file's last contents.
#[test]
fn calls_dirtying_moved_files_between_slices_leave_the_pass_its_room() {
    let dev = image(1024);
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let c = Ctx::root();
    let inos: Vec<u64> = (0..40)
        .map(|i| fs.lookup(&c, ROOT_INO, n(&format!("f{i}"))).unwrap().ino)
        .collect();
    let weak = Arc::downgrade(&fs);
    // ino -> block -> byte last written there.
    let model: Arc<Mutex<BTreeMap<(u64, u64), u8>>> = Arc::default();
    let m2 = model.clone();
    let turns = Arc::new(Mutex::new(0u64));
    let t2 = turns.clone();
    let refused = Arc::new(AtomicBool::new(false));
    let r2 = refused.clone();
    *fs.slice_hook.lock() = Some(Box::new(move || {
        let fs = weak.upgrade().unwrap();
        let mut turn = t2.lock();
        *turn += 1;
        // Flushed every 16 writes, the last few left buffered for the next slice.
        for k in 0..600u64 {
            let ino = inos[(k % 40) as usize];
            let lbn = (*turn + k / 40) % 12;
            let byte = (*turn * 7 + k) as u8;
            let mut st = fs.st.lock();
            if st.do_write(ino, lbn * BS, &[byte; BLOCK_SIZE]).is_err() {
                r2.store(true, std::sync::atomic::Ordering::SeqCst);
                break;
            }
            st.mark_dirty(ino);
            m2.lock().insert((ino, lbn), byte);
            if k % 16 == 15 && st.flush().is_err() {
                r2.store(true, std::sync::atomic::Ordering::SeqCst);
                break;
            }
        }
    }));
    let th = Thresholds::new(1, fs.clean_segments() + 4).unwrap();
    let r = fs.clean_pass_unlocked(Policy::GREEDY, th);
    *fs.slice_hook.lock() = None;
    let cs = fs.cleaner_stats();
    eprintln!("pass: {r:?}, {} turns, {cs:?}", *turns.lock());
    assert!(r.as_ref().is_ok_and(|n| n.is_some_and(|n| n > 0)), "{r:?}");
    assert!(
        cs.split_passes == 1 && *turns.lock() > 2 && cs.inodes_written_by_slices > 0,
        "{cs:?}"
    );
    // Short of room, a call cleans in the foreground (no syncer): most turns write all
    // 600 blocks.
    assert!(model.lock().len() > 100, "the calls wrote too little");
    eprintln!(
        "refused: {}",
        refused.load(std::sync::atomic::Ordering::SeqCst)
    );
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    let fs = mount(&dev);
    for (&(ino, lbn), &byte) in model.lock().iter() {
        let fh = fs.open(&c, ino, libc::O_RDONLY).unwrap();
        let mut got = Vec::new();
        fs.read(ino, fh, lbn * BS, BLOCK_SIZE as u32, &mut got)
            .unwrap();
        fs.release(ino, fh).unwrap();
        assert_eq!(got, vec![byte; BLOCK_SIZE], "inode {ino} block {lbn}");
    }
}

/// The syncer writes a segment's worth of buffered data as soon as it is there, woken by
/// the write that made it, not when the data has aged: each flush is a hold of the lock,
/// as long as what it writes. With the age an hour, a segment and a block written stay
/// buffered without it.
#[test]
fn the_syncer_writes_a_segment_as_soon_as_one_is_buffered() {
    let dev = image(2048);
    let o = MountOptions {
        flush_age: std::time::Duration::from_secs(3600),
        checkpoint_interval: std::time::Duration::from_secs(3600),
        ..Default::default()
    };
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &o).unwrap();
    let seg = fs.st.lock().sb.segment_blocks as usize;
    let c = Ctx::root();
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("f"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    fs.write(a.ino, fh, 0, &vec![7u8; (seg + 1) * BLOCK_SIZE])
        .unwrap();
    let t0 = std::time::Instant::now();
    let deadline = t0 + std::time::Duration::from_secs(10);
    while fs.st.lock().dirty.data_blocks() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} blocks still buffered",
            fs.st.lock().dirty.data_blocks()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    fs.release(a.ino, fh).unwrap();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// A segment's worth buffered is due at once, but not again until the retry time after a
/// flush that failed (the syncer would spin on a full disk that keeps the data buffered).
#[test]
fn a_failed_write_behind_waits_for_its_retry_time() {
    let dev = image(2048);
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()).unwrap();
    let seg = fs.st.lock().sb.segment_blocks as usize;
    write_file(&fs, ROOT_INO, "f", &vec![3u8; seg * BLOCK_SIZE]);
    let now = std::time::Instant::now();
    let later = now + std::time::Duration::from_millis(500);
    {
        let st = fs.st.lock();
        assert!(st.write_behind_due(None, now));
        assert!(
            !st.write_behind_due(Some(later), now),
            "retried before its time"
        );
        assert!(st.write_behind_due(Some(later), later));
    }
    fs.destroy().unwrap();
}

/// Half the room is never more than the whole: with the clean segments cut down one at a
/// time (a reservation standing for calls' writes), whatever a background choice
/// (`Room::Shared`) takes enters no more segments than are clean beyond that reservation.
/// Below the standing reserve, "the reserve and half the rest" would be more than there is.
#[test]
fn half_the_room_is_never_more_than_the_room() {
    use crate::cleaner::clean::{Gain, Prescans, Room};
    let dev = image(1024);
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let mut st = fs.st.lock();
    let clean = st.clean_segments();
    let th = Thresholds::new(1, clean + 40).unwrap();
    let mut passes = 0;
    for held in 0..=clean {
        st.pass_reserve = held;
        let chosen = st
            .clean_pass_choose(
                Policy::GREEDY,
                th,
                Gain::Segment,
                Room::Shared,
                &mut Prescans::default(),
            )
            .unwrap();
        if let Some(c) = chosen {
            let entered = st.pass_log(c.payload).1;
            assert!(
                entered <= (clean - held) as u64,
                "{entered} segments entered with {} clean beyond the {held} held",
                clean - held
            );
            passes += 1;
        }
    }
    st.pass_reserve = 0;
    assert!(passes > 0, "no pass at all");
    drop(st);
    fs.destroy().unwrap();
}

/// The background syncer runs `SYNCER_NICENESS` nicer than the calls (so they preempt its
/// cleaning, not it them) and with a slice of `SYNCER_SLICE_NS` (so a woken call waits no
/// longer for the CPU): every `lfs-syncer` thread of this process, this test's among
/// them, is at the test thread's niceness plus that, and at that slice where the kernel
/// shows one.
#[test]
fn the_background_syncer_runs_nicer_than_the_calls() {
    let dev = image(1024);
    let fs = Lfs::mount_device(
        dev.clone() as Arc<dyn BlockDevice>,
        &MountOptions::default(),
    )
    .unwrap();
    let nice_of = |stat: &str| -> i32 {
        // Field 19 of /proc/.../stat, counted after the command's closing parenthesis.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split(' ').nth(16).unwrap().parse().unwrap()
    };
    // `se.slice` of /proc/.../sched, in nanoseconds (kernels that show it).
    let slice_of = cairn_vfs::sched::slice_in;
    let mine = nice_of(&std::fs::read_to_string("/proc/thread-self/stat").unwrap());
    let want = (mine + crate::engine::SYNCER_NICENESS).min(19);
    // What a thread that asks for the syncer's slice gets: the slice on kernels with
    // custom slices (6.12 on), the default before.
    let want_slice = std::thread::spawn(move || {
        let _ = cairn_vfs::sched::set_thread(want, crate::engine::SYNCER_SLICE_NS);
        cairn_vfs::sched::thread_slice()
    })
    .join()
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let syncers = loop {
        let mut found = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() == "lfs-syncer" {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                let sched = std::fs::read_to_string(t.path().join("sched")).unwrap_or_default();
                if !stat.is_empty() {
                    found.push((nice_of(&stat), slice_of(&sched)));
                }
            }
        }
        // The thread sets its priority as it starts: wait for it to have done so.
        if (!found.is_empty() && found.iter().all(|&f| f == (want, want_slice)))
            || std::time::Instant::now() > deadline
        {
            break found;
        }
        std::thread::yield_now();
    };
    assert!(!syncers.is_empty(), "no lfs-syncer thread");
    assert!(
        syncers.iter().all(|&f| f == (want, want_slice)),
        "syncer niceness and slice {syncers:?}, want {want} and {want_slice:?} ns"
    );
    fs.destroy().unwrap();
}

/// A background pass chooses its victims a victim per hold (in tests), calls between:
/// forty files of 14 blocks with an extended attribute, their first 4 blocks overwritten,
/// and between two of those holds a quarter of them deleted (half their inode numbers taken
/// again by new files), a quarter rewritten whole (the attribute too), a quarter truncated
/// to a block and a bit, and that flushed. What the first holds found live in the victims
/// — data, indirect and xattr blocks, inode records, inode map blocks — is then
/// stale; the pass must still end with every file as the calls left it and the image
/// clean, before and after a remount. Returns what went wrong, if anything.
fn calls_between_choosing_holds(planted: Planted) -> Vec<String> {
    let dev = image(2048);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    // Fourteen blocks: the last two behind an indirect block, which the victims hold too.
    let c = Ctx::root();
    let mut inos = Vec::new();
    for i in 0..40u8 {
        let ino = write_file(&fs, ROOT_INO, &format!("f{i}"), &[i; 56 << 10]);
        fs.setxattr(&c, ino, n("user.t"), &[i; 100], 0).unwrap();
        inos.push(ino);
    }
    fs.checkpoint().unwrap();
    for (i, &ino) in inos.iter().enumerate() {
        let fh = fs.open(&c, ino, libc::O_RDWR).unwrap();
        fs.write(ino, fh, 0, &[!(i as u8); 16 << 10]).unwrap();
        fs.release(ino, fh).unwrap();
    }
    fs.checkpoint().unwrap();
    let mut want = tree(&fs);
    let xattrs = Arc::new(Mutex::new(
        (0..40u8)
            .map(|i| (format!("f{i}"), Some(vec![i; 100])))
            .collect::<BTreeMap<_, _>>(),
    ));
    let x2 = xattrs.clone();
    let model = Arc::new(Mutex::new(BTreeMap::new()));
    let m2 = model.clone();
    let weak = Arc::downgrade(&fs);
    let gaps = Arc::new(Mutex::new(0u32));
    let g2 = gaps.clone();
    *fs.choose_hook.lock() = Some(Box::new(move || {
        // The fourth gap: the victims holding the files are taken by then (segment 0,
        // the first, holds the root directory).
        let mut g = g2.lock();
        *g += 1;
        if *g != 4 {
            return;
        }
        let fs = weak.upgrade().unwrap();
        let c = Ctx::root();
        let mut m = m2.lock();
        let mut x = x2.lock();
        for i in 0..40u8 {
            let name = format!("f{i}");
            let ino = fs.lookup(&c, ROOT_INO, n(&name)).unwrap().ino;
            match i % 4 {
                0 | 3 => {
                    fs.unlink(&c, ROOT_INO, n(&name)).unwrap();
                    m.insert(format!("/{name}"), None);
                    x.remove(&name);
                }
                1 => {
                    let data = vec![i ^ 0x77; 56 << 10];
                    let fh = fs.open(&c, ino, libc::O_RDWR).unwrap();
                    fs.write(ino, fh, 0, &data).unwrap();
                    fs.release(ino, fh).unwrap();
                    m.insert(format!("/{name}"), Some(data));
                    fs.setxattr(&c, ino, n("user.t"), &[i ^ 0x77; 100], 0)
                        .unwrap();
                    x.insert(name, Some(vec![i ^ 0x77; 100]));
                }
                2 => {
                    let size = BS + 5;
                    fs.setattr(
                        &c,
                        ino,
                        cairn_vfs::SetAttr {
                            size: Some(size),
                            ..Default::default()
                        },
                    )
                    .unwrap();
                    // Within the overwritten first quarter.
                    let data = vec![!i; size as usize];
                    m.insert(format!("/{name}"), Some(data));
                }
                _ => {}
            }
        }
        // New files take half the deleted files' inode numbers again (a new version).
        for i in (0..40u8).step_by(8) {
            let data = vec![i ^ 0x3c; 20 << 10];
            write_file(&fs, ROOT_INO, &format!("g{i}"), &data);
            m.insert(format!("/g{i}"), Some(data));
            x.insert(format!("g{i}"), None);
        }
        fs.st.lock().flush().unwrap();
    }));
    let th = Thresholds::new(1, fs.clean_segments() + 4).unwrap();
    let r = fs.clean_pass_unlocked(Policy::GREEDY, th);
    *fs.choose_hook.lock() = None;
    let cs = fs.cleaner_stats();
    let mut wrong = Vec::new();
    if *gaps.lock() < 4 || cs.longest_collect_hold_us == 0 {
        wrong.push(format!("the choice took one hold: {cs:?}"));
    }
    match r {
        Ok(Some(n)) if n > 0 => {}
        other => wrong.push(format!("pass: {other:?}, {cs:?}")),
    }
    for (k, v) in model.lock().iter() {
        match v {
            Some(d) => want.insert(k.clone(), d.clone()),
            None => want.remove(k),
        };
    }
    let xattrs_wrong = |fs: &Lfs| {
        xattrs.lock().iter().any(|(name, v)| {
            let ino = fs.lookup(&c, ROOT_INO, n(name)).unwrap().ino;
            fs.getxattr(&c, ino, n("user.t")).ok() != *v
        })
    };
    if tree(&fs) != want || xattrs_wrong(&fs) {
        wrong.push("the files after the pass are not what the calls left".into());
    }
    if fs.destroy().is_err() {
        wrong.push("unmount failed".into());
    }
    drop(fs);
    match check_device(dev.clone() as Arc<dyn BlockDevice>) {
        Ok(r) if r.is_clean() => {}
        Ok(r) => wrong.push(format!("check: {:?}", r.findings)),
        Err(e) => wrong.push(format!("check: {e}")),
    }
    match Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()) {
        Ok(fs) => {
            if tree(&fs) != want || xattrs_wrong(&fs) {
                wrong.push("the files after a remount are not what the calls left".into());
            }
            let _ = fs.destroy();
        }
        Err(e) => wrong.push(format!("remount: {e}")),
    }
    wrong
}

/// A choice over several holds counts the room rule again in its last: calls between its
/// holds take clean segments. Between its holds a file is written and flushed a block
/// at a time, a segment's worth per gap, until one segment is left beyond the standing
/// reserve; the pass gives
/// back the victims taken last until the rest fit its room (asserted where it goes on to
/// write), or gives up: it ends without error and the image checks clean.
#[test]
fn a_choice_over_several_holds_counts_its_room_again() {
    // The gaps between the choice's holds, counted on a first run (the runs are the same
    // up to the calls).
    let gaps = calls_in_the_last_choosing_gap(None);
    assert!(gaps >= 2, "the choice took {gaps} gaps");
    calls_in_the_last_choosing_gap(Some(gaps));
}

/// Runs the pass of `a_choice_over_several_holds_counts_its_room_again`, with the calls at
/// gap `last` (none if `None`); returns the gaps.
fn calls_in_the_last_choosing_gap(last: Option<u32>) -> u32 {
    let dev = image(1024);
    let fs = mount(&dev);
    forty_files_a_quarter_overwritten(&fs);
    let c = Ctx::root();
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("filler"), 0o644, 0, libc::O_RDWR)
        .unwrap();
    fs.release(a.ino, fh).unwrap();
    let weak = Arc::downgrade(&fs);
    let gaps = Arc::new(Mutex::new(0u32));
    let g2 = gaps.clone();
    let written = Arc::new(Mutex::new(0u64));
    let w2 = written.clone();
    *fs.choose_hook.lock() = Some(Box::new(move || {
        let mut g = g2.lock();
        *g += 1;
        if Some(*g) != last {
            return;
        }
        let fs = weak.upgrade().unwrap();
        // The engine's write itself, as between the slices of the moves, until the clean
        // segments are down to one beyond the standing reserve (short of the foreground
        // cleaning a write with no room would do).
        let mut k = w2.lock();
        loop {
            let mut st = fs.st.lock();
            if st.clean_segments() <= RESERVE_SEGMENTS + 1
                || st.do_write(a.ino, *k * BS, &[0x5a; BLOCK_SIZE]).is_err()
            {
                break;
            }
            st.mark_dirty(a.ino);
            if st.flush().is_err() {
                break;
            }
            *k += 1;
        }
    }));
    let th = Thresholds::new(1, fs.clean_segments() + 4).unwrap();
    let r = fs.clean_pass_unlocked(Policy::GREEDY, th);
    *fs.choose_hook.lock() = None;
    let cs = fs.cleaner_stats();
    eprintln!("pass {r:?}, calls wrote {} blocks, {cs:?}", *written.lock());
    assert!(last.is_none() || *written.lock() > 0, "{cs:?}");
    assert!(r.is_ok(), "{r:?} {cs:?}");
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    *gaps.lock()
}

#[test]
fn a_choice_over_several_holds_checks_what_it_found_again() {
    let wrong = calls_between_choosing_holds(Planted::None);
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The checker of the test above checks: without the last hold's re-check, what the first
/// holds found live is applied stale.
#[test]
fn a_choice_applying_what_it_found_stale_is_caught() {
    let wrong = calls_between_choosing_holds(Planted::NoChoiceRecheck);
    eprintln!("{wrong:#?}");
    assert!(!wrong.is_empty());
}

/// The last hold checks again only the files the dirty set's watch saw calls change
/// (`State::recheck_watched`): blind, it applies what it found stale as the variant above.
#[test]
fn a_choice_whose_watch_misses_the_calls_changes_is_caught() {
    let wrong = calls_between_choosing_holds(Planted::ChoiceWatchBlind);
    eprintln!("{wrong:#?}");
    assert!(!wrong.is_empty());
}

/// A background pass that moves its live blocks in slices lets calls in between; the room
/// rule counted its writes against the clean segments when it chose its victims. Forty
/// files of 12 blocks on 16-block segments, a quarter of each overwritten (victims 75%
/// live); between the first two slices of a pass, a new file is written and flushed 4 KiB
/// at a time until ENOSPC (or 1 MiB). The pass must still end, clean, and the image check.
/// Returns the pass's outcome (`Err` when it failed) and the bytes the calls wrote.
fn calls_between_slices(planted: Planted) -> (std::result::Result<u32, String>, u64) {
    let dev = image(1024);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let weak = Arc::downgrade(&fs);
    let written = Arc::new(Mutex::new(0u64));
    let w2 = written.clone();
    let fired = Arc::new(AtomicBool::new(false));
    let f2 = fired.clone();
    *fs.slice_hook.lock() = Some(Box::new(move || {
        if f2.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let fs = weak.upgrade().unwrap();
        let c = Ctx::root();
        let (a, fh) = fs
            .create(&c, ROOT_INO, n("filler"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.release(a.ino, fh).unwrap();
        // The engine's write itself: `FileSystem::write` would wait for this very pass
        // (`Lfs::write_as`), which runs on this thread.
        for k in 0..256u64 {
            let mut st = fs.st.lock();
            if st.do_write(a.ino, k * BS, &[0x5a; BLOCK_SIZE]).is_err() {
                break;
            }
            st.mark_dirty(a.ino);
            if st.flush().is_err() {
                break;
            }
            *w2.lock() += BS;
        }
    }));
    let th = Thresholds::new(1, fs.clean_segments() + 4).unwrap();
    let r = fs
        .clean_pass_unlocked(Policy::GREEDY, th)
        .map_err(|e| e.to_string())
        .and_then(|n| n.ok_or_else(|| "refused".to_string()));
    *fs.slice_hook.lock() = None;
    let cs = fs.cleaner_stats();
    eprintln!("pass: {r:?}, calls wrote {} bytes, {cs:?}", *written.lock());
    assert!(
        fired.load(std::sync::atomic::Ordering::SeqCst) && cs.split_passes == 1,
        "no slices: {cs:?}"
    );
    if r.is_ok() {
        fs.destroy().unwrap();
        drop(fs);
        assert_clean(&dev);
    }
    let w = *written.lock();
    (r, w)
}

/// The invariant of a pass in slices: its room is reserved before calls run between its
/// holds (`State::pass_reserve`), so calls that take every segment they are admitted for
/// leave the pass what it counted, and it ends having cleaned.
#[test]
fn a_pass_in_slices_keeps_the_room_it_reserved() {
    let (r, written) = calls_between_slices(Planted::None);
    assert!(r.as_ref().is_ok_and(|&n| n > 0), "{r:?}");
    assert!(written > 0, "the calls between the slices wrote nothing");
}

/// The broken variant: without the reservation the calls take the segments the pass
/// counted on, and its moves run out of room.
#[test]
fn a_pass_in_slices_without_its_reservation_is_caught() {
    let (r, _) = calls_between_slices(Planted::NoPassReserve);
    assert!(
        r.is_err(),
        "the test cannot tell a pass without its room: {r:?}"
    );
}

/// What the write throttle says between the holds of one background pass, with its line
/// put at the clean segments the pass starts with: per slice, the clean segments then
/// (`clean_ahead`, the pass's own writes taken) and whether a write would have waited;
/// and the clean segments the pass started and ended with.
fn throttle_between_slices(planted: Planted) -> (Vec<(u32, bool)>, u32, u32) {
    let dev = image(1024);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let start = fs.clean_segments();
    assert!(start > RESERVE_SEGMENTS + 2, "too few clean: {start}");
    // The line is half the start threshold.
    fs.st.lock().thresholds = Thresholds::new(2 * start, 2 * start + 4).unwrap();
    let weak = Arc::downgrade(&fs);
    let seen: Arc<Mutex<Vec<(u32, bool)>>> = Arc::default();
    let s2 = seen.clone();
    *fs.slice_hook.lock() = Some(Box::new(move || {
        let fs = weak.upgrade().unwrap();
        let mut st = fs.st.lock();
        // As a write in a background run would ask (`Lfs::run_making_room`).
        st.bg_run = true;
        st.may_wait_for_cleaner = true;
        let t = st.throttled();
        st.bg_run = false;
        st.may_wait_for_cleaner = false;
        s2.lock().push((st.clean_ahead(), t));
    }));
    let th = Thresholds::new(1, start + 4).unwrap();
    let r = fs.clean_pass_unlocked(Policy::GREEDY, th).unwrap();
    *fs.slice_hook.lock() = None;
    assert!(r.is_some_and(|n| n > 0), "the pass cleaned nothing: {r:?}");
    let end = fs.clean_segments();
    fs.destroy().unwrap();
    let seen = seen.lock().clone();
    eprintln!("{planted:?}: clean {start} -> {end}, between slices {seen:?}");
    (seen, start, end)
}

/// A background pass's own writes do not stop the calls: the clean segments dip while it
/// writes its victims' live blocks (its reservation) and come back with more when its
/// checkpoint frees them, so a write is throttled on what the pass leaves
/// (`State::clean_after_pass`), not on the dip — through which every write waited for the
/// pass's end while the cleaner kept up.
#[test]
fn a_pass_s_own_writes_do_not_throttle_the_calls() {
    let (seen, start, end) = throttle_between_slices(Planted::None);
    assert!(
        seen.iter().any(|&(clean, _)| clean < start),
        "the pass never dipped below the line: the test cannot tell"
    );
    assert!(
        end >= start,
        "the pass left fewer clean than the line: {end} < {start}"
    );
    assert!(
        seen.iter().all(|&(_, t)| !t),
        "a write between the slices would have waited: {seen:?}"
    );
}

/// The broken variant: measured on the dip, the same pass throttles the calls.
#[test]
fn a_throttle_on_the_pass_s_dip_is_caught() {
    let (seen, _, _) = throttle_between_slices(Planted::ThrottleOnRawClean);
    assert!(
        seen.iter().any(|&(_, t)| t),
        "the test cannot tell a throttle on the dip: {seen:?}"
    );
}

/// Calls between the slices of background passes, and a crash after each: files
/// overwritten (a block or two, fsync'd), created (fsync'd) and unlinked while passes move
/// their live blocks; after every call the image as it stands (what a crash leaves) must
/// mount, check clean, and hold every file as last fsync'd. Seed printed (`CAIRN_SEED=`).
fn crashes_between_slices(planted: Planted, seed: u64) -> std::result::Result<u64, String> {
    eprintln!("crashes_between_slices: seed {seed} ({planted:?})");
    let dev = image(2048);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    let file = |f: u64, v: u64| -> Vec<u8> {
        (0..8 * BLOCK_SIZE)
            .map(|i| (i as u64 / 512 + f * 7 + v * 13) as u8)
            .collect()
    };
    // name -> contents as last fsync'd (every change here is fsync'd but unlinks).
    let model: Arc<Mutex<BTreeMap<String, Vec<u8>>>> = Arc::default();
    let inos: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    for f in 0..48u64 {
        let name = format!("f{f}");
        let ino = write_file(&fs, ROOT_INO, &name, &file(f, 0));
        model.lock().insert(name.clone(), file(f, 0));
        inos.lock().insert(name, ino);
    }
    fs.checkpoint().unwrap();
    let failed: Arc<Mutex<Option<String>>> = Arc::default();
    let calls = Arc::new(Mutex::new(0u64));
    let rng = Arc::new(Mutex::new(Xs(crate::sim::rng::Rng::new(seed))));
    let weak = Arc::downgrade(&fs);
    let (m2, i2, f2, c2, r2, d2) = (
        model.clone(),
        inos.clone(),
        failed.clone(),
        calls.clone(),
        rng.clone(),
        dev.clone(),
    );
    // One call, then a crash.
    let step = move |fs: &Lfs| -> std::result::Result<(), String> {
        let c = Ctx::root();
        let mut rng = r2.lock();
        let mut model = m2.lock();
        let mut inos = i2.lock();
        let names: Vec<String> = inos.keys().cloned().collect();
        let pick = names[rng.below(names.len() as u64) as usize].clone();
        let ino = inos[&pick];
        let n_calls = {
            let mut k = c2.lock();
            *k += 1;
            *k
        };
        match rng.below(8) {
            0 if names.len() > 24 => {
                fs.unlink(&c, ROOT_INO, n(&pick))
                    .map_err(|e| e.to_string())?;
                inos.remove(&pick);
                model.remove(&pick);
            }
            1 => {
                let name = format!("n{n_calls}");
                let data = file(n_calls, 1);
                let (a, fh) = fs
                    .create(&c, ROOT_INO, n(&name), 0o644, 0, libc::O_RDWR)
                    .map_err(|e| e.to_string())?;
                fs.write(a.ino, fh, 0, &data).map_err(|e| e.to_string())?;
                fs.fsync(a.ino, fh, false).map_err(|e| e.to_string())?;
                fs.release(a.ino, fh).map_err(|e| e.to_string())?;
                inos.insert(name.clone(), a.ino);
                model.insert(name, data);
            }
            _ => {
                let blk = rng.below(8);
                let len = (1 + rng.below(2)).min(8 - blk) as usize * BLOCK_SIZE;
                let v = (n_calls & 0xff) as u8;
                let fh = fs.open(&c, ino, libc::O_RDWR).map_err(|e| e.to_string())?;
                fs.write(ino, fh, blk * BS, &vec![v; len])
                    .map_err(|e| e.to_string())?;
                fs.fsync(ino, fh, false).map_err(|e| e.to_string())?;
                fs.release(ino, fh).map_err(|e| e.to_string())?;
                let m = model.get_mut(&pick).expect("modelled");
                m[(blk * BS) as usize..(blk * BS) as usize + len].fill(v);
            }
        }
        // The crash: the image as the device holds it now.
        let img = Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, d2.to_bytes()));
        let r = check_device(img.clone() as Arc<dyn BlockDevice>).map_err(|e| e.to_string())?;
        if !r.is_clean() {
            return Err(format!(
                "crash after call {n_calls}: {:?} (seed {seed})",
                r.findings
            ));
        }
        let after = Lfs::mount_device(img as Arc<dyn BlockDevice>, &opts())
            .map_err(|e| format!("mount after call {n_calls}: {e}"))?;
        let t = tree(&after);
        for (name, want) in model.iter() {
            if t.get(&format!("/{name}")) != Some(want) {
                return Err(format!(
                    "crash after call {n_calls}: {name} is not as fsync'd (seed {seed})"
                ));
            }
        }
        Ok(())
    };
    *fs.slice_hook.lock() = Some(Box::new(move || {
        let Some(fs) = weak.upgrade() else { return };
        if f2.lock().is_some() {
            return;
        }
        if let Err(e) = step(&fs) {
            *f2.lock() = Some(e);
        }
    }));
    for round in 0..16u8 {
        // Dead blocks for the passes to collect, a few in every segment: a block of
        // each of 24 files, the rest of each file live.
        for _ in 0..24 {
            let (name, blk) = {
                let mut r = rng.lock();
                (format!("f{}", r.below(48)), r.below(8))
            };
            let Some(&ino) = inos.lock().get(&name) else {
                continue;
            };
            let c = Ctx::root();
            let fh = fs.open(&c, ino, libc::O_RDWR).unwrap();
            fs.write(ino, fh, blk * BS, &[round; BLOCK_SIZE]).unwrap();
            fs.fsync(ino, fh, false).unwrap();
            fs.release(ino, fh).unwrap();
            let mut m = model.lock();
            let at = (blk * BS) as usize;
            m.get_mut(&name).expect("modelled")[at..at + BLOCK_SIZE].fill(round);
        }
        let th = Thresholds::new(1, fs.clean_segments() + 4).unwrap();
        if let Err(e) = fs.clean_pass_unlocked(Policy::GREEDY, th) {
            failed
                .lock()
                .get_or_insert(format!("pass: {e} (seed {seed})"));
        }
        if failed.lock().is_some() {
            break;
        }
    }
    *fs.slice_hook.lock() = None;
    let stats = fs.cleaner_stats();
    if let Some(e) = failed.lock().take() {
        return Err(e);
    }
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    eprintln!("{} calls between slices, {stats:?}", *calls.lock());
    Ok(*calls.lock())
}

#[test]
fn crashes_between_the_slices_of_a_pass_keep_what_was_fsynced() {
    let calls = crashes_between_slices(Planted::None, race_seed()).unwrap();
    assert!(calls > 10, "only {calls} calls between slices");
}

/// The broken variant: slices that move what the victims' summaries named without
/// re-checking it bring an overwritten block back over its fsync'd copy. Whether a seed's
/// calls overwrite a block a later slice moves is the seed's (about one seed in fifteen
/// never does: 1795986807228999263 is one), so the variant is looked for over a few
/// consecutive seeds: missed by all six, the test cannot tell stale blocks.
#[test]
fn crashes_between_slices_catch_a_pass_without_revalidation() {
    let first = race_seed();
    let seeds = (0..6u64).map(|i| first.wrapping_add(i));
    let caught = seeds
        .clone()
        .find(|&s| crashes_between_slices(Planted::NoRevalidation, s).is_err());
    assert!(
        caught.is_some(),
        "the crash test cannot tell stale blocks: seeds {:?}",
        seeds.collect::<Vec<_>>()
    );
}

// ---- the log's writes outside the lock (`sequencer.rs`) -----------------------------------

/// Gives a mount without background writers a sequencer (with or without its writer
/// thread): from now on its partial segments are sealed under the lock and written
/// outside it.
fn attach_sequencer(fs: &Lfs, threaded: bool) -> Arc<crate::sequencer::Sequencer> {
    use crate::sequencer::Sequencer;
    let mut st = fs.st.lock();
    let dev = Arc::clone(&st.dev);
    let q = if threaded {
        Sequencer::start(dev)
    } else {
        Sequencer::new(dev)
    };
    st.log.sequencer = Some(Arc::clone(&q));
    q
}

/// A background pass's holds seal their partial segments without waking the log writer
/// thread (`LogWriter::quiet`: woken in the hold, the writer took the CPU from the pass
/// while every call waited for the lock; woken after it, it often ran in the next hold),
/// and the pass writes them itself once each hold is over: with no writer thread at all,
/// everything sealed so far is written between every two slices.
#[test]
fn a_pass_writes_its_partials_after_its_holds() {
    let dev = image(1024);
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts()).unwrap();
    forty_files_a_quarter_overwritten(&fs);
    let q = attach_sequencer(&fs, false);
    let q2 = Arc::clone(&q);
    let behind: Arc<Mutex<Vec<u64>>> = Arc::default();
    let (b2, turns) = (behind.clone(), Arc::new(Mutex::new(0u32)));
    let t2 = turns.clone();
    *fs.slice_hook.lock() = Some(Box::new(move || {
        *t2.lock() += 1;
        let sealed = q2.sealed();
        if q2.written() < sealed {
            b2.lock().push(sealed - q2.written());
        }
    }));
    let th = Thresholds::new(1, fs.clean_segments() + 3).unwrap();
    fs.clean_pass_unlocked(Policy::GREEDY, th).unwrap().unwrap();
    *fs.slice_hook.lock() = None;
    let cs = fs.cleaner_stats();
    assert!(cs.split_passes == 1 && *turns.lock() > 2, "{cs:?}");
    assert!(
        behind.lock().is_empty(),
        "partials left unwritten between slices: {:?}",
        behind.lock()
    );
    q.drain().unwrap();
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// Random writes, overwrites, truncates and unlinks of small files, flushed to the log
/// every few calls, with the log writer stopped (`Sequencer::pause`): every block flushed
/// is in flight, and every read — of a file just written, of one whose inode and indirect
/// blocks must be loaded again — must see the model. Then the writes go out, a checkpoint,
/// a remount: the same tree. `Err` names the first difference.
fn reads_in_flight(planted: Planted, seed: u64) -> std::result::Result<(), String> {
    eprintln!("reads_in_flight: seed {seed} ({planted:?})");
    let dev = image(8192);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    let q = attach_sequencer(&fs, false);
    let c = Ctx::root();
    let mut rng = Xs(crate::sim::rng::Rng::new(seed));
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut inos: BTreeMap<String, u64> = BTreeMap::new();
    let paused = q.pause();
    for i in 0..400u32 {
        let name = format!("f{}", rng.below(24));
        match rng.below(8) {
            0 if inos.contains_key(&name) => {
                fs.unlink(&c, ROOT_INO, n(&name)).unwrap();
                inos.remove(&name);
                model.remove(&name);
            }
            1 if inos.contains_key(&name) => {
                let ino = inos[&name];
                let size = rng.below(20 * BS);
                let set = cairn_vfs::SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                fs.setattr(&c, ino, set).unwrap();
                model.get_mut(&name).unwrap().resize(size as usize, 0);
            }
            _ => {
                let ino = match inos.get(&name) {
                    Some(&ino) => ino,
                    None => {
                        let (a, fh) = fs
                            .create(&c, ROOT_INO, n(&name), 0o644, 0, libc::O_RDWR)
                            .unwrap();
                        fs.release(a.ino, fh).unwrap();
                        inos.insert(name.clone(), a.ino);
                        model.insert(name.clone(), Vec::new());
                        a.ino
                    }
                };
                // Past the direct blocks now and then, so indirect blocks are in flight too.
                let span = if rng.below(4) == 0 { 40 } else { 8 } * BS;
                let off = rng.below(span);
                let len = 1 + rng.below(3 * BS) as usize;
                let data: Vec<u8> = (0..len).map(|k| (i as usize * 7 + k) as u8 | 1).collect();
                let fh = fs.open(&c, ino, libc::O_RDWR).unwrap();
                fs.write(ino, fh, off, &data).unwrap();
                fs.release(ino, fh).unwrap();
                let m = model.get_mut(&name).unwrap();
                let end = off as usize + len;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
            }
        }
        if rng.below(4) == 0 {
            fs.flush_log().unwrap();
            // Inodes and block maps loaded again from the log: read through `read_block`.
            if rng.below(2) == 0 {
                let mut st = fs.st.lock();
                let idle: Vec<u64> = st
                    .nodes
                    .iter()
                    .filter(|(ino, n)| n.opens == 0 && **ino != ROOT_INO)
                    .map(|(&ino, _)| ino)
                    .filter(|ino| !st.dirty.inodes().any(|d| d == *ino))
                    .collect();
                for ino in idle {
                    st.nodes.remove(&ino);
                }
            }
        }
        let name = format!("f{}", rng.below(24));
        if let (Some(&ino), Some(want)) = (inos.get(&name), model.get(&name)) {
            let mut got = Vec::new();
            fs.read(ino, 0, 0, want.len() as u32 + 1, &mut got)
                .map_err(|e| format!("read of {name}: {e} (seed {seed})"))?;
            if &got != want {
                return Err(format!(
                    "{name} after call {i}: not the model (seed {seed})"
                ));
            }
        }
    }
    assert!(q.any(), "nothing was in flight");
    drop(paused);
    fs.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
    drop(fs);
    let fs = mount(&dev);
    let t: BTreeMap<String, Vec<u8>> = tree(&fs)
        .into_iter()
        .map(|(k, v)| (k.trim_start_matches('/').to_string(), v))
        .collect();
    if t != model {
        return Err(format!("the remounted tree is not the model (seed {seed})"));
    }
    drop(fs);
    assert_clean(&dev);
    Ok(())
}

#[test]
fn a_read_of_blocks_in_flight_is_served_from_memory() {
    reads_in_flight(Planted::None, race_seed()).unwrap();
}

/// The broken variant: reads that ask the device for blocks still in flight get what the
/// device held there before.
#[test]
fn a_read_of_blocks_in_flight_from_the_device_is_caught() {
    let seed = race_seed();
    assert!(
        caught(|| reads_in_flight(Planted::InFlightFromDevice, seed)),
        "the test cannot tell a block in flight (seed {seed})"
    );
}

/// Random files written, some fsync'd, then a checkpoint, with a sequencer that has no
/// writer thread: the partial segments reach the device only when a flush waits for them.
/// The image as it is the moment fsync or the checkpoint returns — a crash then — must
/// hold every fsync'd file and, after the checkpoint, the whole model.
fn flushes_after_their_writes(planted: Planted, seed: u64) -> std::result::Result<(), String> {
    eprintln!("flushes_after_their_writes: seed {seed} ({planted:?})");
    let dev = image(8192);
    let fs =
        Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &opts(), planted).unwrap();
    attach_sequencer(&fs, false);
    let c = Ctx::root();
    let mut rng = Xs(crate::sim::rng::Rng::new(seed));
    let crash = || -> std::result::Result<Arc<Lfs>, String> {
        let img = Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, dev.to_bytes()));
        Lfs::mount_device(img as Arc<dyn BlockDevice>, &opts()).map_err(|e| format!("mount: {e}"))
    };
    let mut model = BTreeMap::new();
    for round in 0..6 {
        let mut synced = Vec::new();
        for k in 0..1 + rng.below(6) {
            let name = format!("r{round}f{k}");
            let len = 1 + rng.below(30 * BS) as usize;
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + round * 7) as u8).collect();
            let (a, fh) = fs
                .create(&c, ROOT_INO, n(&name), 0o644, 0, libc::O_RDWR)
                .unwrap();
            fs.write(a.ino, fh, 0, &data).unwrap();
            if rng.below(2) == 0 {
                fs.fsync(a.ino, fh, false).unwrap();
                synced.push(name.clone());
            }
            fs.release(a.ino, fh).unwrap();
            model.insert(name, data);
        }
        let after = crash()?;
        let t = tree(&after);
        for name in &synced {
            if t.get(&format!("/{name}")) != model.get(name) {
                return Err(format!("{name}: fsync'd, not on the device (seed {seed})"));
            }
        }
        if rng.below(2) == 0 {
            fs.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
            let after = crash()?;
            let t: BTreeMap<String, Vec<u8>> = tree(&after)
                .into_iter()
                .map(|(k, v)| (k.trim_start_matches('/').to_string(), v))
                .collect();
            if t != model {
                return Err(format!(
                    "after checkpoint {round}: not the model (seed {seed})"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn fsync_and_checkpoints_flush_after_the_log_writes_they_cover() {
    flushes_after_their_writes(Planted::None, race_seed()).unwrap();
}

/// The broken variant: a device flush that does not wait for the writes sealed before it.
#[test]
fn a_flush_before_the_log_writes_is_caught() {
    let r = flushes_after_their_writes(Planted::FlushBeforeLogWrites, race_seed());
    assert!(r.is_err(), "the test cannot tell an early flush: {r:?}");
}

/// The broken variant: reads ask the device for blocks still in flight.
#[test]
fn a_read_of_blocks_in_flight_racing_the_log_writer_is_caught() {
    let seed = race_seed();
    assert!(
        caught(|| race_cleaning(Planted::InFlightFromDevice, seed, true).map(drop)),
        "the race test cannot tell a block in flight (seed {seed})"
    );
}

/// Did a run of a test body with a planted variant fail — with an error, or with a failed
/// assertion or an unexpected error from a call (what a variant that corrupts a directory
/// block read back gives)?
fn caught(body: impl FnOnce() -> std::result::Result<(), String>) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => false,
        Ok(Err(e)) => {
            eprintln!("caught: {e}");
            true
        }
        Err(_) => {
            eprintln!("caught: a panic");
            true
        }
    }
}

/// renameat2(RENAME_WHITEOUT): the old name names a new whiteout (a character device 0/0,
/// no permission bits, the caller's), the moved inode keeps its link count, a replaced
/// target goes, a moved directory's parents count its `..` as in a rename; NOREPLACE is
/// allowed with it, EXCHANGE is not (EINVAL); without CAP_MKNOD, EPERM and nothing
/// changes. The check finds the image clean, and the whiteouts are there after a remount.
#[test]
fn rename_whiteout_leaves_a_whiteout_at_the_old_name() {
    use cairn_vfs::{Errno, FileKind};
    let dev = image(1024);
    let fs = mount(&dev);
    let c = Ctx {
        gid: 7,
        ..Ctx::root()
    };
    let wo = RenameFlags {
        whiteout: true,
        ..Default::default()
    };
    let errno = |r: cairn_vfs::Result<()>| r.unwrap_err().errno();
    let is_whiteout = |fs: &Lfs, dir: u64, name: &str| {
        let w = fs.lookup(&c, dir, n(name)).unwrap();
        (w.kind, w.rdev, w.perm, w.nlink, w.uid, w.gid, w.size)
            == (FileKind::CharDevice, 0, 0, 1, 0, 7, 0)
    };
    let d = fs.mkdir(&c, ROOT_INO, n("d"), 0o755, 0).unwrap().ino;
    let e = fs.mkdir(&c, ROOT_INO, n("e"), 0o777, 0).unwrap().ino;
    let a = write_file(&fs, d, "a", b"contents");
    let size = |dir: u64| fs.getattr(dir).unwrap().size;
    let links = |dir: u64| fs.getattr(dir).unwrap().nlink;
    let (dsize, esize) = (size(d), size(e));
    fs.rename(&c, d, n("a"), e, n("a2"), wo).unwrap();
    assert!(is_whiteout(&fs, d, "a"));
    assert_eq!(fs.lookup(&c, e, n("a2")).unwrap().ino, a);
    assert_eq!(fs.getattr(a).unwrap().nlink, 1);
    assert_eq!((size(d), size(e)), (dsize, esize));
    // Over an existing target.
    let b = write_file(&fs, e, "b", b"victim");
    fs.rename(&c, e, n("a2"), e, n("b"), wo).unwrap();
    assert_eq!(fs.lookup(&c, e, n("b")).unwrap().ino, a);
    assert!(is_whiteout(&fs, e, "a2"));
    assert!(fs.getattr(b).is_err(), "the victim is freed");
    // NOREPLACE with WHITEOUT; EXCHANGE with WHITEOUT.
    let nrwo = RenameFlags {
        noreplace: true,
        ..wo
    };
    assert_eq!(
        errno(fs.rename(&c, e, n("b"), e, n("a2"), nrwo)),
        Errno::EEXIST
    );
    fs.rename(&c, e, n("b"), d, n("c"), nrwo).unwrap();
    assert!(is_whiteout(&fs, e, "b"));
    let exwo = RenameFlags {
        exchange: true,
        ..wo
    };
    assert_eq!(
        errno(fs.rename(&c, d, n("c"), e, n("b"), exwo)),
        Errno::EINVAL
    );
    assert_eq!(fs.lookup(&c, d, n("c")).unwrap().ino, a);
    // A directory to another parent, then within one.
    let sub = fs.mkdir(&c, d, n("sub"), 0o755, 0).unwrap().ino;
    assert_eq!((links(d), links(e)), (3, 2));
    fs.rename(&c, d, n("sub"), e, n("sub"), wo).unwrap();
    assert_eq!((links(d), links(e), links(sub)), (2, 3, 2));
    assert_eq!(fs.lookup(&c, sub, n("..")).unwrap().ino, e);
    assert!(is_whiteout(&fs, d, "sub"));
    fs.rename(&c, e, n("sub"), e, n("sub2"), wo).unwrap();
    assert_eq!(links(e), 3);
    assert!(is_whiteout(&fs, e, "sub"));
    // Without CAP_MKNOD.
    let u = Ctx::user(1000, 1000);
    let f = fs
        .mknod(&u, e, n("u"), libc::S_IFREG | 0o644, 0, 0)
        .unwrap();
    assert_eq!(
        errno(fs.rename(&u, e, n("u"), e, n("u2"), wo)),
        Errno::EPERM
    );
    assert_eq!(fs.lookup(&c, e, n("u")).unwrap().ino, f.ino);
    assert!(fs.lookup(&c, e, n("u2")).is_err());
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
    let fs = mount(&dev);
    for (dir, name) in [(d, "a"), (e, "a2"), (e, "b"), (d, "sub"), (e, "sub")] {
        assert!(is_whiteout(&fs, dir, name), "{name} after remount");
    }
    assert_eq!(fs.getattr(e).unwrap().nlink, 3);
    fs.destroy().unwrap();
}

/// Files of 512 KiB written until a write fails for room: their names.
fn fill_with_files(fs: &Lfs) -> Vec<String> {
    let c = Ctx::root();
    let mut names = Vec::new();
    'fill: for i in 0.. {
        let name = format!("f{i}");
        let Ok((a, fh)) = fs.create(&c, ROOT_INO, n(&name), 0o644, 0, libc::O_RDWR) else {
            break;
        };
        names.push(name);
        for k in 0..8u64 {
            if fs
                .write(a.ino, fh, k * (64 << 10), &[i as u8; 64 << 10])
                .is_err()
            {
                fs.release(a.ino, fh).unwrap();
                break 'fill;
            }
        }
        fs.release(a.ino, fh).unwrap();
    }
    names
}

/// Space on its way back is room for the page cache: after the files filling a disk are
/// removed, their segments hold nothing live but are clean only once a checkpoint records
/// them so (and partly dead ones once a pass cleans them). An open asking whether the room
/// is short must count them — make the checkpoint, or clean, as a write short of room would —
/// not answer from the clean segments alone: otherwise the open gets no page cache and a
/// shared mapping is refused (ENODEV) until the syncer's next round, which under load came
/// after the open (CI saw it: `space_on_its_way_back_is_room_for_the_page_cache`).
#[test]
fn removed_files_are_room_for_the_page_cache_before_any_checkpoint() {
    let dev = image(4096);
    let fs = mount(&dev);
    fs.set_writeback_reserve(1 << 20);
    let c = Ctx::root();
    let names = fill_with_files(&fs);
    assert!(fs.room_is_short(), "the disk never filled");
    for name in &names {
        fs.unlink(&c, ROOT_INO, n(name)).unwrap();
    }
    assert!(
        !fs.room_is_short(),
        "{} files removed, and the room still short ({} clean segments)",
        names.len(),
        fs.clean_segments()
    );
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// A call short of room waits for a background run under way even when the last run ended
/// having given nothing back (`bg_stuck`, set while the disk was full of live data): the
/// run under way pins the victims it reads — after an `rm`, the segments whose blocks all
/// died — so a call cleaning beside it finds nothing (CI saw `create` fail with ENOSPC
/// right after the removes, `space_on_its_way_back_is_room_for_the_page_cache`). Here the
/// call must defer to the run (`cleaner_deferred`), not clean beside it.
#[test]
fn a_run_under_way_is_waited_for_though_the_last_was_stuck() {
    let dev = image(4096);
    let fs = mount(&dev);
    fs.set_writeback_reserve(1 << 20);
    let c = Ctx::root();
    let names = fill_with_files(&fs);
    for name in &names {
        fs.unlink(&c, ROOT_INO, n(name)).unwrap();
    }
    let mut st = fs.st.lock();
    st.bg_stuck = true;
    st.bg_run = true;
    st.may_wait_for_cleaner = true;
    let reserve = st.writeback_reserve;
    let r = st.ensure_space(reserve);
    let deferred = std::mem::take(&mut st.cleaner_deferred);
    st.may_wait_for_cleaner = false;
    st.bg_run = false;
    assert!(
        r.is_err() && deferred,
        "with a run under way, a call short of room cleaned beside it: {r:?}"
    );
    drop(st);
    assert!(!fs.room_is_short(), "the removed files are still not room");
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// A checkpoint written without the lock (the syncer's, a background pass's) holds back
/// the segments it empties until it is recorded; meanwhile the clean segments may be
/// gone — a pass moving its victims' live blocks may enter every one, the standing
/// reserve included. A call's flush that would enter a segment then must record that
/// checkpoint and go on, never take the log past its last clean segment: CI under load
/// saw an fsync find none, the log writer fail half-way ("log: no clean segment") and the
/// mount refuse every change (EIO) until remount. Here the checkpoint's device writes are
/// done, its record not yet made; a file of a segment and a half is written, the clean
/// segments are taken as such a pass would have taken them, and the file is fsynced.
#[test]
fn a_flush_short_of_room_records_the_checkpoint_in_flight() {
    let dev = image(4096);
    let fs = mount(&dev);
    let c = Ctx::root();
    for i in 0..10u8 {
        let name = format!("old{i}");
        let (a, fh) = fs
            .create(&c, ROOT_INO, n(&name), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(a.ino, fh, 0, &[i; 16 * BLOCK_SIZE]).unwrap();
        fs.release(a.ino, fh).unwrap();
    }
    fs.checkpoint().unwrap();
    for i in 0..10u8 {
        fs.unlink(&c, ROOT_INO, n(&format!("old{i}"))).unwrap();
    }
    let data: Vec<u8> = (0..24 * BLOCK_SIZE).map(|i| (i % 253) as u8).collect();
    let weak = Arc::downgrade(&fs);
    let outcome = Arc::new(Mutex::new(None));
    let (d2, o2) = (data.clone(), outcome.clone());
    *fs.cp_hook.lock() = Some(Box::new(move || {
        let fs = weak.upgrade().unwrap();
        let c = Ctx::root();
        let (a, fh) = fs
            .create(&c, ROOT_INO, n("x"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(a.ino, fh, 0, &d2).unwrap();
        {
            let mut st = fs.st.lock();
            let (head, next) = (st.log.seg, st.log.next_seg);
            while crate::log::Segments::take_clean(&mut st.usage, &[head, next]).is_some() {}
        }
        *o2.lock() = Some((a.ino, fs.fsync(a.ino, fh, false).map_err(|e| e.to_string())));
        fs.release(a.ino, fh).unwrap();
    }));
    fs.checkpoint().unwrap();
    *fs.cp_hook.lock() = None;
    let (ino, r) = outcome.lock().take().expect("the hook ran");
    assert!(
        r.is_ok(),
        "the fsync beside the checkpoint in flight: {r:?}"
    );
    fs.st.lock().check_log_ok().unwrap();
    let mut got = Vec::new();
    fs.read(ino, 0, 0, data.len() as u32, &mut got).unwrap();
    assert!(got == data, "the file read back differs");
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

/// A mount with `background_inline` and no syncer cleans with the background passes (their
/// room reserved between holds: `split_passes`), on the calling thread after each call,
/// never more than `INLINE_PASSES` per call — even with a stop threshold the clean
/// segments never reach, which would otherwise make every call run a syncer's whole run —
/// and the image checks clean.
#[test]
fn inline_background_passes_are_bounded_per_call() {
    let dev = image(1536);
    let segments = dev_segments(&dev);
    let o = MountOptions {
        background_inline: true,
        clean_start: Some(segments - 3),
        clean_stop: Some(segments - 2),
        ..opts()
    };
    let fs = Lfs::mount_device(dev.clone() as Arc<dyn BlockDevice>, &o).unwrap();
    let c = Ctx::root();
    let mut files = Vec::new();
    for i in 0..8 {
        let (a, fh) = fs
            .create(&c, ROOT_INO, n(&format!("f{i}")), 0o644, 0, libc::O_RDWR)
            .unwrap();
        files.push((a.ino, fh));
    }
    let mut most = 0;
    for round in 0..30u64 {
        for &(ino, fh) in &files {
            let before = fs.cleaner_stats().passes;
            fs.write(ino, fh, (round % 4) * 65536, &[round as u8; 65536])
                .unwrap();
            most = most.max(fs.cleaner_stats().passes - before);
        }
    }
    let cs = fs.cleaner_stats();
    assert!(cs.passes > 0 && cs.split_passes > 0, "{cs:?}");
    assert!(most <= INLINE_PASSES as u64, "{most} passes in one call");
    fs.destroy().unwrap();
    drop(fs);
    assert_clean(&dev);
}

fn dev_segments(dev: &Arc<MemDevice>) -> u32 {
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_blocks(0, &mut b).unwrap();
    Superblock::decode(&b, dev.num_blocks()).unwrap().segments
}

/// close(2) needs no FLUSH request: `flush` answers ENOSYS (so the kernel stops sending it,
/// one FUSE round trip less per file), and what a close must leave — the data written, an
/// unlinked open file freed — is there without it, through release alone.
#[test]
fn close_needs_no_flush_request() {
    let dev = image(4096);
    let c = Ctx::root();
    {
        let fs = mount(&dev);
        let (a, fh) = fs
            .create(&c, ROOT_INO, n("kept"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        assert_eq!(fs.write(a.ino, fh, 0, b"written").unwrap(), 7);
        let e = fs.flush(a.ino, fh).unwrap_err();
        assert_eq!(e.errno(), cairn_vfs::Errno::ENOSYS);
        fs.release(a.ino, fh).unwrap();
        let mut buf = Vec::new();
        fs.read(a.ino, 0, 0, 100, &mut buf).unwrap();
        assert_eq!(buf, b"written");
        // Unlinked while open, then closed with no FLUSH: freed at release.
        let (g, fh) = fs
            .create(&c, ROOT_INO, n("gone"), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.unlink(&c, ROOT_INO, n("gone")).unwrap();
        fs.release(g.ino, fh).unwrap();
        assert!(fs.getattr(g.ino).is_err());
        fs.destroy().unwrap();
    }
    assert_clean(&dev);
    let fs = mount(&dev);
    let t = tree(&fs);
    assert_eq!(t["/kept"], b"written");
    assert!(!t.contains_key("/gone"));
}

/// The inode map's dirty blocks on a 256-segment image of 16-block segments, 12,000
/// empty files over 47 map blocks, the clean segments brought down to twelve: the mode of one
/// file per map block changed and flushed, which dirties the whole map. After each call, the
/// debt a cleaning pass's checkpoint would carry (`State::imap_debt_due`) is below a
/// segment or within a quarter of the clean segments beyond the reserve. Returns the calls
/// after which it was not, and the checkpoints made.
fn imap_debt_under_chmods(planted: Planted) -> (Vec<String>, u64) {
    let dev = Arc::new(MemDevice::new(BLOCK_SIZE as u32, 4096));
    mkfs_device(
        dev.clone(),
        &MkfsOptions {
            segment_size: 64 << 10,
            inodes: Some(12_800),
            ..Default::default()
        },
    )
    .unwrap();
    // The cleaner kept out of it: the debt alone is under test.
    let o = MountOptions {
        clean_start: Some(2),
        clean_stop: Some(3),
        ..opts()
    };
    let fs = Lfs::mount_device_planted(dev.clone() as Arc<dyn BlockDevice>, &o, planted).unwrap();
    let c = Ctx::root();
    let mut files = Vec::new();
    for d in 0..24 {
        let dir = fs
            .mkdir(&c, ROOT_INO, n(&format!("d{d}")), 0o755, 0)
            .unwrap()
            .ino;
        for i in 0..500 {
            let (a, fh) = fs
                .create(&c, dir, n(&format!("f{i}")), 0o644, 0, libc::O_WRONLY)
                .unwrap();
            fs.release(a.ino, fh).unwrap();
            files.push(a.ino);
        }
    }
    let (a, fh) = fs
        .create(&c, ROOT_INO, n("big"), 0o644, 0, libc::O_WRONLY)
        .unwrap();
    let chunk = vec![7u8; 64 << 10];
    let mut off = 0;
    while fs.st.lock().clean_segments() > 12 {
        fs.write(a.ino, fh, off, &chunk).unwrap();
        off += chunk.len() as u64;
        fs.st.lock().flush().unwrap();
    }
    fs.release(a.ino, fh).unwrap();
    fs.st.lock().checkpoint().unwrap();
    let serial = |fs: &Lfs| fs.st.lock().cp.serial();
    let before = serial(&fs);
    files.sort_unstable();
    let per_block = crate::format::tables::PER_BLOCK;
    let mut over = Vec::new();
    for (k, &ino) in files.iter().step_by(per_block).enumerate() {
        let set = cairn_vfs::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        };
        fs.setattr(&c, ino, set).unwrap();
        let mut st = fs.st.lock();
        let debt = st.imap.dirty_blocks().len() as u64;
        let seg = st.sb.segment_blocks as u64;
        let beyond = st.clean_segments().saturating_sub(st.kept_segments()) as u64;
        if debt >= seg && debt * 4 > beyond * seg && over.len() < 5 {
            over.push(format!(
                "after chmod {k}: {debt} map blocks dirty, {beyond} clean beyond the reserve"
            ));
        }
        // The inode goes to the log (and its map entry changes) at a flush, as the
        // syncer's would: the next call finds the debt grown.
        st.flush().unwrap();
    }
    let made = serial(&fs) - before;
    // Unpaid, the debt may leave the unmount's checkpoint no room.
    if planted == Planted::None {
        fs.destroy().unwrap();
        assert_clean(&dev);
    }
    (over, made)
}

/// A checkpoint pays the inode map's debt while there is room for it.
#[test]
fn the_inode_map_s_debt_stays_within_the_room() {
    let (over, made) = imap_debt_under_chmods(Planted::None);
    assert!(over.is_empty(), "{over:?}");
    assert!(made >= 1, "no checkpoint paid the debt");
}

/// Without those checkpoints the debt outgrows the room.
#[test]
fn an_unpaid_inode_map_debt_is_caught() {
    let (over, made) = imap_debt_under_chmods(Planted::ImapDebtUnpaid);
    assert!(
        !over.is_empty(),
        "the debt stayed within the room ({made} checkpoints)"
    );
}
