//! Concurrent calls in a `Concurrent` mode: several threads of random calls, each in a
//! subtree of its own, with a syncer every 10 ms, a small cache (memory-pressure
//! write-back on the calling threads) and sync(2)/fsync thrown in — write-back running
//! with no engine lock held, overlapping every kind of call and its undo scope (on a
//! roomy file system, then on a small one where calls run out of space and roll back). Each
//! thread checks its own files' contents as it goes (never another file's bytes); at the
//! end, after a clean unmount, check-only fsck finds nothing and the tree equals the
//! union of the threads' models.
//!
//! The test prints its seed; replay with CAIRN_STRESS_SEED=N (CAIRN_STRESS_ITERS: calls
//! per thread).

mod common;

use std::sync::Arc;
use std::time::Duration;

use cairn_blockdev::BlockDevice;
use cairn_ffs::{Ffs, MountOptions};
use cairn_vfs::FileSystem;
use common::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

const THREADS: usize = 4;

/// A random call inside `root` (a directory of the thread's own), from what model `m`
/// says is there; never removes or renames `root` itself.
fn random_op(rng: &mut StdRng, m: &Model, root: &str) -> Op {
    let inside = |p: &String| p.starts_with(&format!("{root}/"));
    let dirs: Vec<String> = std::iter::once(root.to_string())
        .chain(
            m.paths(|k| matches!(k, Kind::Dir))
                .into_iter()
                .filter(inside),
        )
        .collect();
    let files: Vec<String> = m
        .paths(|k| matches!(k, Kind::File(_)))
        .into_iter()
        .filter(inside)
        .collect();
    let any: Vec<String> = m.paths(|_| true).into_iter().filter(inside).collect();
    let pick = |rng: &mut StdRng, v: &[String]| -> Option<String> {
        (!v.is_empty()).then(|| v[rng.random_range(0..v.len())].clone())
    };
    let new_name = |rng: &mut StdRng| -> String {
        let dir = pick(rng, &dirs).unwrap();
        format!("{dir}/n{}", rng.random_range(0..30))
    };
    let missing = format!("{root}/missing");
    let file = |rng: &mut StdRng| pick(rng, &files).unwrap_or_else(|| missing.clone());
    let some = |rng: &mut StdRng| pick(rng, &any).unwrap_or_else(|| missing.clone());
    let bs = BS;
    match rng.random_range(0..17) {
        0..=2 => Op::Create(new_name(rng)),
        3 => Op::Mkdir(new_name(rng)),
        4 => Op::Symlink(new_name(rng), vec![b's'; rng.random_range(1..600)]),
        5 => Op::Link(file(rng), new_name(rng)),
        6 => {
            let to = if rng.random_bool(0.7) {
                new_name(rng)
            } else {
                some(rng)
            };
            Op::Rename(some(rng), to)
        }
        7..=9 => {
            let off = match rng.random_range(0..3) {
                0 => rng.random_range(0..3 * bs),
                1 => rng.random_range(0..20 * bs),
                _ => rng.random_range(0..300 * bs),
            };
            // Some streams (>= 256 KiB): their data goes to the device with no lock held.
            let len = if rng.random_bool(0.15) {
                rng.random_range(256 << 10..400 << 10)
            } else {
                rng.random_range(1..20_000)
            };
            Op::Write(file(rng), off, data(rng.random(), len))
        }
        10 => Op::Truncate(file(rng), rng.random_range(0..40 * bs)),
        11 => Op::Punch(
            file(rng),
            rng.random_range(0..30 * bs),
            rng.random_range(1..10 * bs),
        ),
        12 => Op::SetXattr(
            file(rng),
            format!("user.k{}", rng.random_range(0..3)).into_bytes(),
            vec![rng.random(); rng.random_range(0..900)],
        ),
        13 | 14 => Op::Unlink(some(rng)),
        15 => Op::Rmdir(pick(rng, &dirs[1..]).unwrap_or_else(|| missing.clone())),
        _ => Op::OpenTrunc(file(rng)),
    }
}

/// Reads file `path` and compares it with the model (the thread's own subtree: nobody
/// else changes it).
fn check_file(fs: &Ffs, m: &Model, path: &str) -> Result<(), String> {
    let Some(Node {
        kind: Kind::File(want),
        ..
    }) = m.node(path)
    else {
        return Ok(());
    };
    let ino = resolve(fs, path).map_err(|e| format!("resolve {path}: {e:?}"))?;
    let mut got = Vec::new();
    fs.read(ino, 0, 0, want.len() as u32 + 1, &mut got)
        .map_err(|e| format!("read {path}: {e}"))?;
    if &got != want {
        let at = got.iter().zip(want).position(|(x, y)| x != y);
        return Err(format!(
            "{path}: read {} bytes, model {}; first difference at {at:?}",
            got.len(),
            want.len()
        ));
    }
    Ok(())
}

fn worker(fs: Arc<Ffs>, seed: u64, t: usize, iters: usize) -> Model {
    let mut rng = StdRng::seed_from_u64(seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let root = format!("t{t}");
    let mut m = Model::new();
    let mk = Op::Mkdir(root.clone());
    mk.run(&fs).unwrap();
    mk.apply(&mut m, 0);
    let mut ok = 0;
    for i in 0..iters {
        let op = random_op(&mut rng, &m, &root);
        let r = op.run(&fs);
        if let Ok(w) = r {
            op.apply(&mut m, w);
            ok += 1;
        }
        let ctx = || format!("seed {seed}, thread {t}, call {i}: {} -> {r:?}", op.label());
        match rng.random_range(0..20) {
            0 => fs
                .sync_all()
                .unwrap_or_else(|e| panic!("{}: sync: {e}", ctx())),
            1 => {
                let files = m.paths(|k| matches!(k, Kind::File(_)));
                let mine: Vec<_> = files.iter().filter(|p| p.starts_with(&root)).collect();
                if let Some(p) = mine.first() {
                    let ino = resolve(&fs, p).unwrap();
                    fs.fsync(ino, 0, false)
                        .unwrap_or_else(|e| panic!("{}: fsync {p}: {e}", ctx()));
                }
            }
            _ => {}
        }
        // Read back a file of ours: its bytes, not another file's, while others write.
        if let Op::Write(p, ..) | Op::Truncate(p, _) | Op::Punch(p, ..) = &op
            && let Err(e) = check_file(&fs, &m, p)
        {
            panic!("{}: {e}", ctx());
        }
    }
    println!(
        "thread {t}: {ok} of {iters} calls succeeded, {} names",
        m.names.len()
    );
    m
}

/// The threads' models as one tree: each thread's subtree, node ids kept apart.
fn merge(models: Vec<Model>) -> Model {
    let mut all = Model::new();
    for (t, m) in models.into_iter().enumerate() {
        let root = format!("t{t}");
        let base = (t as u64 + 1) << 32;
        for (path, id) in m.names {
            if path == root || path.starts_with(&format!("{root}/")) {
                all.names.insert(path, id + base);
                all.nodes.insert(id + base, m.nodes[&id].clone());
            }
        }
    }
    all
}

#[test]
fn concurrent_stress_then_fsck() {
    let seed: u64 = std::env::var("CAIRN_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let iters: usize = std::env::var("CAIRN_STRESS_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    println!("concurrent_stress_then_fsck: CAIRN_STRESS_SEED={seed}");
    // A roomy file system, then a small one where calls run out of space halfway and are
    // rolled back while write-back goes on beside them.
    for blocks in [16384, 2048] {
        stress(seed, iters, blocks);
    }
}

fn stress(seed: u64, iters: usize, blocks: u64) {
    println!("{blocks} blocks:");
    let mem = mkfs(blocks, 1024);
    let dev: Arc<dyn BlockDevice> = Arc::new(mem.with_block_size(BS as u32));
    let fs = Ffs::mount_device(
        dev,
        &MountOptions {
            mode: "async".into(),
            // 64 blocks: past 32 dirty, each call's thread writes back (memory pressure).
            cache_bytes: 64 * BS,
            syncer_interval: Some(Duration::from_millis(10)),
            ..Default::default()
        },
    )
    .unwrap();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || worker(fs, seed, t, iters))
        })
        .collect();
    let models: Vec<Model> = threads
        .into_iter()
        .map(|h| h.join().expect("a worker thread panicked"))
        .collect();
    let ctx = format!("seed {seed}, {blocks} blocks");
    if let Err(e) = fs.self_check() {
        panic!("{ctx}: in-core state after the run: {e}");
    }
    let all = merge(models);
    if let Err(e) = compare(&fs, &all) {
        panic!("{ctx}: before unmount: {e}");
    }
    fs.unmount().unwrap();
    drop(fs);
    let f = fsck(&mem);
    assert!(f.is_empty(), "{ctx}: fsck after unmount:\n{f}");
    let fs = mount(&mem, "async");
    if let Err(e) = compare(&fs, &all) {
        panic!("{ctx}: after remount: {e}");
    }
    fs.unmount().unwrap();
}
