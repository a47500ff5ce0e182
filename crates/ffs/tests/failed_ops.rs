//! An operation that fails changes nothing: after ENOSPC on a full file system, or a device
//! error at any read, write or flush inside the operation, the call returns an error (or
//! succeeds, if the failure was absorbed), the in-core state agrees with the buffers, and
//! after a clean unmount fsck finds nothing at all and every earlier file is intact, in
//! `sync` and `async` modes. See `crates/ffs/src/undo.rs`.
//!
//! The randomized test prints its seed; replay with CAIRN_FAULT_SEED=N (and
//! CAIRN_FAULT_ITERS for the number of operations per mode).

mod common;

use std::sync::Arc;

use cairn_blockdev::{BlockDevice, FaultOp, MemDevice, TraceOp, VecTrace};
use cairn_vfs::{Errno, FileSystem};
use common::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// Runs `op` on a copy of `base`, then checks: on failure nothing changed (free counts,
/// in-core state); after unmount fsck is clean; remounted, the tree equals the model (with
/// the operation applied if it succeeded). Returns the operation's result.
fn try_op(
    base: &[u8],
    mode: &str,
    model: &Model,
    op: &Op,
    arm: impl FnOnce(&cairn_blockdev::FaultDevice),
    cache: u64,
    what: &str,
) -> (Result<u64, Errno>, bool) {
    let img = MemDevice::from_bytes(BS as u32, base.to_vec());
    let (fault, fs) = mount_faulty(&img, mode, cache);
    let before = free(&fs);
    let injected = fault.injected();
    arm(&fault);
    let r = op.run(&fs);
    let hit = fault.injected() > injected;
    fault.heal();
    let mut m = model.clone();
    match r {
        Ok(w) => op.apply(&mut m, w),
        Err(_) => assert_eq!(
            free(&fs),
            before,
            "{what}: {} failed but the free counts changed",
            op.label()
        ),
    }
    if let Err(e) = fs.self_check() {
        panic!("{what}: {} ({r:?}): in-core state: {e}", op.label());
    }
    fs.unmount()
        .unwrap_or_else(|e| panic!("{what}: {}: unmount: {e}", op.label()));
    drop(fs);
    let findings = fsck(&img);
    assert!(
        findings.is_empty(),
        "{what}: {} ({r:?}): fsck after a clean unmount:\n{findings}",
        op.label()
    );
    let fs = mount(&img, mode);
    if let Err(e) = compare(&fs, &m) {
        panic!("{what}: {} ({r:?}): after remount: {e}", op.label());
    }
    fs.unmount().unwrap();
    (r, hit)
}

/// A populated image (and its model) in `mode`.
fn populated(mode: &str, blocks: u64) -> (Vec<u8>, Model) {
    let mem = mkfs(blocks, 512);
    let fs = mount(&mem, mode);
    let mut m = Model::new();
    populate(&fs, &mut m);
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(fsck(&mem), "");
    (mem.to_bytes(), m)
}

/// With 0 to 5 blocks free, and with no inode free, every creating operation either
/// succeeds or fails with ENOSPC and leaves nothing behind (the mkdir that leaked its inode
/// when its first block could not be allocated, and every sibling of it).
#[test]
fn full_file_system_every_creating_op_fails_cleanly() {
    let creating: Vec<Op> = every_op()
        .into_iter()
        .filter(|op| {
            !matches!(
                op,
                Op::Unlink(_) | Op::Rmdir(_) | Op::Punch(..) | Op::OpenTrunc(_)
            ) && !matches!(op, Op::Truncate(_, s) if *s < 1 << 20)
                && !matches!(op, Op::RemoveXattr(..))
        })
        .collect();
    for mode in ["sync", "async"] {
        let (base, mut model) = populated(mode, 1024);
        // Fill every block with one file, then free k of its direct blocks for each k.
        let mem = MemDevice::from_bytes(BS as u32, base);
        let fs = mount(&mem, mode);
        let fill = Op::Create("fill".into());
        fill.run(&fs).unwrap();
        fill.apply(&mut model, 0);
        let mut off = 0u64;
        loop {
            let w = Op::Write("fill".into(), off, vec![0xAB; 64 << 10]);
            match w.run(&fs) {
                Ok(0) | Err(Errno::ENOSPC) => break,
                Ok(k) => {
                    w.apply(&mut model, k);
                    off += k;
                }
                Err(e) => panic!("filling: {e:?}"),
            }
        }
        assert_eq!(free(&fs).0, 0, "{mode}: the file system is full");
        fs.unmount().unwrap();
        drop(fs);
        let mut full = mem.to_bytes();
        let mut cases = Vec::new();
        for k in 0..=5u64 {
            if k > 0 {
                let mem = MemDevice::from_bytes(BS as u32, full);
                let fs = mount(&mem, mode);
                let punch = Op::Punch("fill".into(), (k - 1) * BS, BS);
                punch.run(&fs).unwrap();
                punch.apply(&mut model, 0);
                assert_eq!(free(&fs).0, k);
                fs.unmount().unwrap();
                drop(fs);
                full = mem.to_bytes();
            }
            cases.push((
                format!("{mode}, {k} blocks free"),
                full.clone(),
                model.clone(),
            ));
        }
        // No inode free, blocks to spare.
        {
            let mem = MemDevice::from_bytes(BS as u32, cases[5].1.clone());
            let mut m = cases[5].2.clone();
            let fs = mount(&mem, mode);
            let dir = Op::Mkdir("inodes".into());
            dir.run(&fs).unwrap();
            dir.apply(&mut m, 0);
            for i in 0.. {
                let op = Op::Mknod(format!("inodes/{i}"));
                match op.run(&fs) {
                    Ok(_) => op.apply(&mut m, 0),
                    Err(Errno::ENOSPC) => break,
                    Err(e) => panic!("{e:?}"),
                }
            }
            // Room for the operations' blocks: give back the fill's first 64 KiB.
            let punch = Op::Punch("fill".into(), 0, 64 << 10);
            punch.run(&fs).unwrap();
            punch.apply(&mut m, 0);
            assert_eq!(free(&fs).1, 0);
            fs.unmount().unwrap();
            drop(fs);
            cases.push((format!("{mode}, no inode free"), mem.to_bytes(), m));
        }
        for (what, img, m) in &cases {
            let mut failed = 0;
            for op in &creating {
                let (r, _) = try_op(img, mode, m, op, |_| {}, 64 << 20, what);
                match r {
                    Ok(_) => {}
                    Err(Errno::ENOSPC) => failed += 1,
                    Err(e) => panic!("{what}: {}: {e:?}, expected ENOSPC", op.label()),
                }
            }
            println!("{what}: {failed} of {} operations refused", creating.len());
            if what.contains(" 0 blocks") || what.contains("no inode") {
                assert!(failed > 0, "{what}: something must be refused");
            }
        }
    }
}

/// Fails the n-th device write (then the n-th flush, then the n-th read) inside every
/// operation, for every n the operation reaches, once (a transient error) and from then on
/// (a device that died), with a large cache and with one so small that the operation's own
/// reads evict dirty buffers. Then heals the device and checks (see `try_op`).
fn faults_everywhere(mode: &str) {
    let (base, model) = populated(mode, 1024);
    let mut runs = 0;
    let mut failed = 0;
    for cache in [64 << 20, 12 * BS] {
        for op in every_op() {
            for kind in [FaultOp::Write, FaultOp::Flush, FaultOp::Read] {
                for sticky in [false, true] {
                    for nth in 1.. {
                        let what = format!(
                            "{mode}, cache {} KiB, {kind:?} #{nth}{}",
                            cache >> 10,
                            if sticky { " and later" } else { "" }
                        );
                        let (r, hit) = try_op(
                            &base,
                            mode,
                            &model,
                            &op,
                            |f| f.fail_nth(kind, nth, sticky),
                            cache,
                            &what,
                        );
                        runs += 1;
                        if r.is_err() {
                            failed += 1;
                        }
                        if !hit {
                            break;
                        }
                    }
                }
            }
        }
    }
    println!("{mode}: {runs} runs, {failed} operations failed and were taken back");
}

#[test]
fn faults_everywhere_sync() {
    faults_everywhere("sync");
}

#[test]
fn faults_everywhere_async() {
    faults_everywhere("async");
}

/// Random operations on random names, a random fault armed before some of them, checked
/// against the model all along; clean remounts in between; fsck clean at the end.
#[test]
fn random_ops_with_faults_match_the_model() {
    let seed: u64 = std::env::var("CAIRN_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let iters: usize = std::env::var("CAIRN_FAULT_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    // Compare the whole tree every this many operations (1 to find the first bad one).
    let every: usize = std::env::var("CAIRN_FAULT_COMPARE_EVERY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25);
    println!("random_ops_with_faults_match_the_model: CAIRN_FAULT_SEED={seed}");
    let trace = std::env::var("CAIRN_FAULT_TRACE").is_ok();
    let modes: Vec<String> = std::env::var("CAIRN_FAULT_MODES")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|_| vec!["sync".into(), "async".into()]);
    for mode in modes.iter().map(String::as_str) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mem = mkfs(768, 256);
        let cache = if rng.random_bool(0.5) {
            64 << 20
        } else {
            16 * BS
        };
        let (mut fault, mut fs) = mount_faulty(&mem, mode, cache);
        let mut m = Model::new();
        let (mut ok, mut refused, mut faulted) = (0, 0, 0);
        for i in 0..iters {
            let op = random_op(&mut rng, &m);
            let armed = rng.random_bool(0.3);
            if armed {
                let kind = [FaultOp::Write, FaultOp::Flush, FaultOp::Read][rng.random_range(0..3)];
                let (nth, sticky) = (rng.random_range(1..8), rng.random_bool(0.5));
                if trace {
                    println!("   arm {kind:?} #{nth} sticky {sticky}");
                }
                fault.fail_nth(kind, nth, sticky);
            }
            let before = free(&fs);
            let injected = fault.injected();
            let r = op.run(&fs);
            match (&r, fault.injected() > injected) {
                (Ok(_), _) => ok += 1,
                (Err(_), true) => faulted += 1,
                (Err(_), false) => refused += 1,
            }
            fault.heal();
            if trace {
                println!("op {i}: {} -> {r:?}", op.label());
            }
            let ctx = || format!("seed {seed}, {mode}, op {i}: {} -> {r:?}", op.label());
            match r {
                Ok(w) => op.apply(&mut m, w),
                Err(_) => assert_eq!(free(&fs), before, "{}: free counts changed", ctx()),
            }
            if let Err(e) = fs.self_check() {
                panic!("{}: in-core state: {e}", ctx());
            }
            if i % every.max(1) == 0
                && let Err(e) = compare(&fs, &m)
            {
                panic!("{}: {e}", ctx());
            }
            if rng.random_bool(0.03) {
                fs.unmount().unwrap();
                drop(fs);
                let f = fsck(&mem);
                assert!(f.is_empty(), "{}: fsck after remount:\n{f}", ctx());
                (fault, fs) = mount_faulty(&mem, mode, cache);
            }
        }
        println!(
            "{mode}: {ok} succeeded, {refused} refused, {faulted} failed by a fault, {} files",
            m.names.len()
        );
        fs.unmount().unwrap();
        drop(fs);
        let f = fsck(&mem);
        assert!(f.is_empty(), "seed {seed}, {mode}: fsck at the end:\n{f}");
        let fs = mount(&mem, mode);
        if let Err(e) = compare(&fs, &m) {
            panic!("seed {seed}, {mode}: at the end: {e}");
        }
        fs.unmount().unwrap();
    }
}

fn random_op(rng: &mut StdRng, m: &Model) -> Op {
    let dirs = m.paths(|k| matches!(k, Kind::Dir));
    let files = m.paths(|k| matches!(k, Kind::File(_)));
    let any = m.paths(|_| true);
    let pick = |rng: &mut StdRng, v: &[String]| -> Option<String> {
        (!v.is_empty()).then(|| v[rng.random_range(0..v.len())].clone())
    };
    let new_name = |rng: &mut StdRng| -> String {
        let dir = if rng.random_bool(0.3) {
            String::new()
        } else {
            pick(rng, &dirs).unwrap_or_default()
        };
        let name = if rng.random_bool(0.15) {
            let c = (b'a' + rng.random_range(0..6)) as char;
            format!(
                "{}{}",
                long(c).get(..250).unwrap(),
                rng.random_range(10000..10006)
            )
        } else {
            format!("n{}", rng.random_range(0..40))
        };
        if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        }
    };
    let file = |rng: &mut StdRng| pick(rng, &files).unwrap_or_else(|| "nofile".into());
    let bs = BS;
    match rng.random_range(0..17) {
        0 | 1 => Op::Create(new_name(rng)),
        2 => Op::Mkdir(new_name(rng)),
        3 => Op::Symlink(new_name(rng), vec![b's'; rng.random_range(1..600)]),
        4 => Op::Mknod(new_name(rng)),
        5 => Op::Link(file(rng), new_name(rng)),
        6 => Op::Rename(
            pick(rng, &any).unwrap_or_else(|| "x".into()),
            if rng.random_bool(0.7) {
                new_name(rng)
            } else {
                pick(rng, &any).unwrap_or_else(|| "y".into())
            },
        ),
        7 | 8 => {
            let off = match rng.random_range(0..4) {
                0 => rng.random_range(0..3 * bs),
                1 => rng.random_range(0..20 * bs),
                2 => (12 + 512) * bs + rng.random_range(0..bs),
                _ => rng.random_range(0..600 * bs),
            };
            let len = if rng.random_bool(0.1) {
                rng.random_range(256 << 10..400 << 10)
            } else {
                rng.random_range(1..20_000)
            };
            Op::Write(file(rng), off, data(rng.random(), len))
        }
        9 => Op::Truncate(file(rng), rng.random_range(0..40 * bs)),
        10 => Op::Fallocate(
            file(rng),
            rng.random_range(0..30 * bs),
            rng.random_range(1..20 * bs),
        ),
        11 => Op::Punch(
            file(rng),
            rng.random_range(0..30 * bs),
            rng.random_range(1..10 * bs),
        ),
        12 => Op::SetXattr(
            pick(rng, &files)
                .or_else(|| pick(rng, &dirs))
                .unwrap_or_default(),
            format!("user.k{}", rng.random_range(0..4)).into_bytes(),
            vec![rng.random(); rng.random_range(0..900)],
        ),
        13 => Op::RemoveXattr(
            file(rng),
            format!("user.k{}", rng.random_range(0..4)).into_bytes(),
        ),
        14 => Op::Unlink(pick(rng, &any).unwrap_or_else(|| "x".into())),
        15 => Op::Rmdir(pick(rng, &dirs).unwrap_or_else(|| "x".into())),
        _ => Op::OpenTrunc(file(rng)),
    }
}

/// Every disk state a power failure could leave while a `sync` operation fails (a write,
/// flush or read fault at every point), is taken back, and the file system is unmounted —
/// every flush epoch's predecessors durable plus any subset of the epoch's block writes
/// (all subsets of up to 6, else each single write, each all-but-one and a sample) — is at
/// worst a leak: the rollback's reverse replay never passes through a state the ordering
/// rules forbid, even when the device refuses the rollback at first and it is written
/// later.
#[test]
fn sync_rollback_crash_states_are_leaks_only() {
    let (base, _model) = populated("sync", 1024);
    let mut rng = StdRng::seed_from_u64(7);
    let (mut cases, mut states) = (0, 0);
    for op in every_op() {
        for (kind, sticky) in [
            (FaultOp::Write, false),
            (FaultOp::Write, true),
            (FaultOp::Flush, false),
            (FaultOp::Read, false),
        ] {
            for nth in 1.. {
                let img = MemDevice::from_bytes(BS as u32, base.clone());
                let (fault, fs) = mount_faulty(&img, "sync", 64 << 20);
                let trace = Arc::new(VecTrace::with_data());
                let start = img.to_bytes();
                fault.set_trace(Some(trace.clone()));
                fault.fail_nth(kind, nth, sticky);
                let injected = fault.injected();
                let r = op.run(&fs);
                let hit = fault.injected() > injected;
                fault.heal();
                fs.unmount().unwrap();
                drop(fs);
                fault.set_trace(None);
                if hit && r.is_err() {
                    cases += 1;
                    states += check_crash_states(&start, &trace, &mut rng, &|| {
                        format!("{} with {kind:?} #{nth} (sticky {sticky})", op.label())
                    });
                }
                if !hit {
                    break;
                }
            }
        }
    }
    println!("{cases} failed operations, {states} crash states, no corruption");
    assert!(cases > 50);
}

/// An access ACL naming user 1000 rwx, the owning group r--, other ---, with `mask`.
fn named_acl(mask: u16) -> Vec<u8> {
    cairn_vfs::acl::example_named(1000, mask)
}

/// Every crash state of a `sync` call that changes an access ACL and the mode with it —
/// set on a file without attributes and on one with others, replaced, rewritten by chmod,
/// removed as equivalent, inherited at create — keeps the two in agreement (fsck holds a
/// mode to its access ACL): the inode write that switches to the new xattr block carries
/// the new mode (docs/DESIGN.md, "POSIX ACLs").
#[test]
fn sync_acl_changes_keep_mode_and_acl_together_in_every_crash_state() {
    use cairn_vfs::{Ctx, SetAttr};
    let c = Ctx::root();
    let mem = mkfs(1024, 1024);
    let fs = mount(&mem, "sync");
    let (plain, fh) = fs
        .create(&c, 2, n("plain"), 0o640, 0, libc::O_RDWR)
        .unwrap();
    fs.release(plain.ino, fh).unwrap();
    let (other, fh) = fs
        .create(&c, 2, n("other"), 0o640, 0, libc::O_RDWR)
        .unwrap();
    fs.release(other.ino, fh).unwrap();
    fs.setxattr(&c, other.ino, n("user.note"), b"kept", 0)
        .unwrap();
    let d = fs.mkdir(&c, 2, n("d"), 0o755, 0).unwrap().ino;
    fs.setxattr(&c, d, n("system.posix_acl_default"), &named_acl(7), 0)
        .unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let base = mem.to_bytes();
    type Call = Box<dyn Fn(&cairn_ffs::Ffs, u64, u64)>;
    let calls: Vec<(&str, Call)> = vec![
        (
            "set on a file without attributes",
            Box::new(|fs, p, _| {
                fs.setxattr(
                    &Ctx::root(),
                    p,
                    n("system.posix_acl_access"),
                    &named_acl(6),
                    0,
                )
                .unwrap()
            }),
        ),
        (
            "set beside another attribute",
            Box::new(|fs, _, o| {
                fs.setxattr(
                    &Ctx::root(),
                    o,
                    n("system.posix_acl_access"),
                    &named_acl(7),
                    0,
                )
                .unwrap()
            }),
        ),
        (
            "set, then chmod",
            Box::new(|fs, p, _| {
                let c = Ctx::root();
                fs.setxattr(&c, p, n("system.posix_acl_access"), &named_acl(6), 0)
                    .unwrap();
                let s = SetAttr {
                    mode: Some(0o604),
                    ..Default::default()
                };
                fs.setattr(&c, p, s).unwrap();
            }),
        ),
        (
            "set, then an equivalent one",
            Box::new(|fs, _, o| {
                let c = Ctx::root();
                fs.setxattr(&c, o, n("system.posix_acl_access"), &named_acl(6), 0)
                    .unwrap();
                let mut three = 2u32.to_le_bytes().to_vec();
                for (t, p) in [(1u16, 7u16), (4, 5), (0x20, 1)] {
                    three.extend_from_slice(&t.to_le_bytes());
                    three.extend_from_slice(&p.to_le_bytes());
                    three.extend_from_slice(&u32::MAX.to_le_bytes());
                }
                fs.setxattr(&c, o, n("system.posix_acl_access"), &three, 0)
                    .unwrap();
            }),
        ),
        (
            "create under a default ACL",
            Box::new(|fs, _, _| {
                let c = Ctx::root();
                let d = fs.lookup(&c, 2, n("d")).unwrap().ino;
                let (f, fh) = fs
                    .create(&c, d, n("child"), 0o666, 0o022, libc::O_RDWR)
                    .unwrap();
                fs.release(f.ino, fh).unwrap();
            }),
        ),
    ];
    let mut rng = StdRng::seed_from_u64(11);
    let mut states = 0;
    for (what, call) in &calls {
        let img = MemDevice::from_bytes(BS as u32, base.clone());
        let (fault, fs) = mount_faulty(&img, "sync", 64 << 20);
        let trace = Arc::new(VecTrace::with_data());
        let start = img.to_bytes();
        fault.set_trace(Some(trace.clone()));
        call(&fs, plain.ino, other.ino);
        fs.unmount().unwrap();
        drop(fs);
        fault.set_trace(None);
        states += check_crash_states(&start, &trace, &mut rng, &|| what.to_string());
        assert!(fsck(&img).is_empty(), "{what}: {}", fsck(&img));
    }
    println!(
        "{} calls, {states} crash states, mode and ACL always together",
        calls.len()
    );
}

/// Builds the crash states of a recording made from `start` and fscks each; returns how
/// many were checked.
fn check_crash_states(
    start: &[u8],
    trace: &VecTrace,
    rng: &mut StdRng,
    what: &dyn Fn() -> String,
) -> usize {
    let bs = BS as usize;
    // Epochs of single-block writes.
    let mut epochs: Vec<Vec<(u64, Vec<u8>)>> = vec![Vec::new()];
    for (e, d) in trace.records() {
        match e.op {
            TraceOp::Write => {
                let d = d.expect("recorded with data");
                for (i, blk) in d.chunks_exact(bs).enumerate() {
                    epochs
                        .last_mut()
                        .unwrap()
                        .push((e.block + i as u64, blk.to_vec()));
                }
            }
            TraceOp::Zero => {
                for i in 0..u64::from(e.blocks) {
                    epochs.last_mut().unwrap().push((e.block + i, vec![0; bs]));
                }
            }
            TraceOp::Flush => epochs.push(Vec::new()),
            TraceOp::Read => {}
        }
    }
    let apply = |img: &mut Vec<u8>, w: &(u64, Vec<u8>)| {
        let at = w.0 as usize * bs;
        img[at..at + bs].copy_from_slice(&w.1);
    };
    let mut durable = start.to_vec();
    let mut checked = 0;
    for (i, epoch) in epochs.iter().enumerate() {
        let n = epoch.len();
        let subsets: Vec<Vec<bool>> = if n <= 6 {
            (0..1u32 << n)
                .map(|m| (0..n).map(|j| m & (1 << j) != 0).collect())
                .collect()
        } else {
            let mut v: Vec<Vec<bool>> = (0..n)
                .map(|k| (0..n).map(|j| j == k).collect())
                .chain((0..n).map(|k| (0..n).map(|j| j != k).collect()))
                .collect();
            v.push(vec![false; n]);
            v.extend((0..32).map(|_| (0..n).map(|_| rng.random_bool(0.5)).collect()));
            v
        };
        for keep in subsets {
            let mut img = durable.clone();
            for (w, k) in epoch.iter().zip(&keep) {
                if *k {
                    apply(&mut img, w);
                }
            }
            let c = corruptions(img);
            assert!(
                c.is_empty(),
                "{}: crash in epoch {i} of {} keeping {keep:?}:\n{c}",
                what(),
                epochs.len()
            );
            checked += 1;
        }
        for w in epoch {
            apply(&mut durable, w);
        }
    }
    checked
}

/// Corruption found halfway through an operation: a write whose first block is allocated
/// and whose second block's path crosses a planted bad pointer fails with EUCLEAN and
/// leaves everything as before — the first block is freed again, the size and contents
/// are unchanged, and fsck finds exactly the planted damage and nothing more.
#[test]
fn corruption_found_midway_changes_nothing() {
    for mode in ["sync", "async"] {
        let (base, mut model) = populated(mode, 1024);
        let mem = MemDevice::from_bytes(BS as u32, base);
        let fs = mount(&mem, mode);
        let dbl = (12 + 512) * BS; // first byte of the double-indirect range
        for op in [
            Op::Create("c".into()),
            Op::Write("c".into(), dbl, b"deep".to_vec()),
        ] {
            let w = op.run(&fs).unwrap();
            op.apply(&mut model, w);
        }
        let ino = resolve(&fs, "c").unwrap();
        fs.unmount().unwrap();
        drop(fs);
        // The double-indirect block's first pointer (to the indirect block of "deep") now
        // names a group descriptor (FORMAT.md: inode offset 184, group 0's block 1).
        let mut bytes = mem.to_bytes();
        let sb = cairn_ffs::format::Superblock::decode(&bytes[..512]).unwrap();
        let (iblk, ioff) = sb.geometry().unwrap().inode_location(ino);
        let at = iblk as usize * BS as usize + ioff + 184;
        let d = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        bytes[d * BS as usize..d * BS as usize + 8].copy_from_slice(&1u64.to_le_bytes());
        let planted = fsck(&MemDevice::from_bytes(BS as u32, bytes.clone()));
        assert!(planted.contains("CORRUPTION"), "{planted}");

        let img = MemDevice::from_bytes(BS as u32, bytes);
        let fs = mount(&img, mode);
        let before = free(&fs);
        // The last block of the single-indirect range, then the first of the double.
        let op = Op::Write("c".into(), dbl - 10, vec![7; 20]);
        let r = op.run(&fs);
        assert_eq!(r, Err(Errno::EUCLEAN), "{mode}");
        assert_eq!(free(&fs), before, "{mode}: the first block was given back");
        fs.self_check().unwrap();
        let a = fs.getattr(ino).unwrap();
        assert_eq!(a.size, dbl + 4, "{mode}");
        fs.unmount().unwrap();
        drop(fs);
        assert_eq!(fsck(&img), planted, "{mode}: only the planted damage");
    }
}
