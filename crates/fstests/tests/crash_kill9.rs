//! `kill -9` of the daemon in the middle of a metadata workload, in every mode that promises
//! metadata calls durable on return (`sync`, `journal`; the rounds take them in turn, among
//! `CAIRN_TEST_MODES` when it is set).
//!
//! A writer thread creates, renames, links, unlinks, mkdirs and rmdirs (and sometimes writes
//! and fsyncs) under unique names, applying every operation that returned to an in-memory
//! model of the tree; the one operation in flight is recorded separately. After a random
//! delay the daemon gets SIGKILL and the dead mount is detached. Then:
//! - `cairn fsck IMAGE` (check only) may report nothing but `LEAK:` findings (leaked blocks or
//!   inodes, link counts too high, summaries off): exit 0, or 1/4 with no `CORRUPTION:` line
//!   (a journal's check judges the image as its log's replay leaves it);
//! - `cairn fsck -y` repairs (a journal: replays its log first), and a second `cairn fsck` is
//!   clean (exit 0);
//! - after remounting, the tree is exactly the model: every operation that had returned is
//!   there (created names exist, renamed ones under the new name, unlinked ones gone, fsynced
//!   contents intact), except at the names touched by the operation in flight.
//!
//! Environment: `CAIRN_CRASH_ROUNDS` (default 3), `CAIRN_CRASH_SEED` (default from the
//! clock, printed). With CAIRN_TEST_HOST_ONLY=1 the workload runs on a host directory and is
//! stopped instead of killed, which validates the model and the checker.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_fstests::{Errnoish, Target, errno_name, pattern, say};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type DirId = u64;
type FileId = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ent {
    Dir(DirId),
    File(FileId),
}

/// The tree as the operations that returned have left it.
#[derive(Default, Clone)]
struct Model {
    /// dir id -> (parent, name); the work directory is id 0 with no parent.
    dirs: BTreeMap<DirId, (DirId, String)>,
    entries: BTreeMap<(DirId, String), Ent>,
    /// Contents made durable by fsync (files whose content we check).
    contents: BTreeMap<FileId, Vec<u8>>,
    next: u64,
    ops: usize,
}

impl Model {
    fn path(&self, root: &Path, d: DirId) -> PathBuf {
        let mut parts = Vec::new();
        let mut cur = d;
        while cur != 0 {
            let (p, n) = &self.dirs[&cur];
            parts.push(n.clone());
            cur = *p;
        }
        let mut out = root.to_path_buf();
        for n in parts.iter().rev() {
            out.push(n);
        }
        out
    }

    fn children(&self, d: DirId) -> impl Iterator<Item = (&String, &Ent)> {
        self.entries
            .range((d, String::new())..)
            .take_while(move |((p, _), _)| *p == d)
            .map(|((_, n), e)| (n, e))
    }

    fn is_ancestor(&self, a: DirId, mut d: DirId) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == 0 {
                return false;
            }
            d = self.dirs[&d].0;
        }
    }

    fn fresh(&mut self, prefix: &str) -> (u64, String) {
        self.next += 1;
        (self.next, format!("{prefix}{:05}", self.next))
    }
}

/// What the operation in flight may have changed: (dir, name) slots whose state is unknown.
#[derive(Default, Clone, Debug)]
struct InFlight {
    desc: String,
    slots: Vec<(DirId, String)>,
}

#[derive(Default)]
struct Shared {
    model: Model,
    in_flight: Option<InFlight>,
    /// An error the model did not predict (a bug, not the kill).
    unexpected: Option<String>,
}

/// One random operation: returns false when the writer must stop.
fn step(root: &Path, rng: &mut StdRng, shared: &Mutex<Shared>, killed: &AtomicBool) -> bool {
    let m = shared.lock().unwrap().model.clone();
    let dirs: Vec<DirId> = std::iter::once(0).chain(m.dirs.keys().copied()).collect();
    let files: Vec<(DirId, String, FileId)> = m
        .entries
        .iter()
        .filter_map(|((d, n), e)| match e {
            Ent::File(f) => Some((*d, n.clone(), *f)),
            Ent::Dir(_) => None,
        })
        .collect();
    let pick_dir = |rng: &mut StdRng| dirs[rng.random_range(0..dirs.len())];
    let mut m2 = m.clone();
    let choice = rng.random_range(0..100);
    // (description, slots touched, the syscall, the model update)
    type Action = Box<dyn FnOnce() -> std::io::Result<()>>;
    let (desc, slots, action): (String, Vec<(DirId, String)>, Action) =
        if choice < 30 || files.is_empty() {
            let d = pick_dir(rng);
            let (id, name) = m2.fresh("f");
            let p = m.path(root, d).join(&name);
            let content = rng
                .random_bool(0.25)
                .then(|| pattern(id, rng.random_range(1..20_000)));
            m2.entries.insert((d, name.clone()), Ent::File(id));
            if let Some(c) = &content {
                m2.contents.insert(id, c.clone());
            }
            (
                format!("create {}", p.display()),
                vec![(d, name)],
                Box::new(move || {
                    let f = File::create(&p)?;
                    if let Some(c) = content {
                        f.write_all_at(&c, 0)?;
                        f.sync_all()?;
                    }
                    Ok(())
                }),
            )
        } else if choice < 45 {
            let d = pick_dir(rng);
            let (id, name) = m2.fresh("d");
            let p = m.path(root, d).join(&name);
            m2.dirs.insert(id, (d, name.clone()));
            m2.entries.insert((d, name.clone()), Ent::Dir(id));
            (
                format!("mkdir {}", p.display()),
                vec![(d, name)],
                Box::new(move || fs::create_dir(&p)),
            )
        } else if choice < 65 {
            let (d, n, f) = files[rng.random_range(0..files.len())].clone();
            let nd = pick_dir(rng);
            let (_, name) = m2.fresh("r");
            let (from, to) = (m.path(root, d).join(&n), m.path(root, nd).join(&name));
            m2.entries.remove(&(d, n.clone()));
            m2.entries.insert((nd, name.clone()), Ent::File(f));
            (
                format!("rename {} -> {}", from.display(), to.display()),
                vec![(d, n), (nd, name)],
                Box::new(move || fs::rename(&from, &to)),
            )
        } else if choice < 75 {
            let (d, n, f) = files[rng.random_range(0..files.len())].clone();
            let nd = pick_dir(rng);
            let (_, name) = m2.fresh("l");
            let (from, to) = (m.path(root, d).join(&n), m.path(root, nd).join(&name));
            m2.entries.insert((nd, name.clone()), Ent::File(f));
            (
                format!("link {} -> {}", from.display(), to.display()),
                vec![(nd, name)],
                Box::new(move || fs::hard_link(&from, &to)),
            )
        } else if choice < 90 {
            let (d, n, f) = files[rng.random_range(0..files.len())].clone();
            let p = m.path(root, d).join(&n);
            m2.entries.remove(&(d, n.clone()));
            if !m2.entries.values().any(|e| *e == Ent::File(f)) {
                m2.contents.remove(&f);
            }
            (
                format!("unlink {}", p.display()),
                vec![(d, n)],
                Box::new(move || fs::remove_file(&p)),
            )
        } else if choice < 95 && dirs.len() > 1 {
            // Rename a directory somewhere not inside itself.
            let d = dirs[rng.random_range(1..dirs.len())];
            let nd = pick_dir(rng);
            if m.is_ancestor(d, nd) {
                return true;
            }
            let (parent, old) = m.dirs[&d].clone();
            let (_, name) = m2.fresh("m");
            let (from, to) = (m.path(root, d), m.path(root, nd).join(&name));
            m2.entries.remove(&(parent, old.clone()));
            m2.entries.insert((nd, name.clone()), Ent::Dir(d));
            m2.dirs.insert(d, (nd, name.clone()));
            (
                format!("rename dir {} -> {}", from.display(), to.display()),
                vec![(parent, old), (nd, name)],
                Box::new(move || fs::rename(&from, &to)),
            )
        } else {
            // rmdir an empty directory, if any.
            let empty: Vec<DirId> = dirs
                .iter()
                .copied()
                .filter(|&d| d != 0 && m.children(d).next().is_none())
                .collect();
            if empty.is_empty() {
                return true;
            }
            let d = empty[rng.random_range(0..empty.len())];
            let (parent, name) = m.dirs[&d].clone();
            let p = m.path(root, d);
            m2.entries.remove(&(parent, name.clone()));
            m2.dirs.remove(&d);
            (
                format!("rmdir {}", p.display()),
                vec![(parent, name)],
                Box::new(move || fs::remove_dir(&p)),
            )
        };
    shared.lock().unwrap().in_flight = Some(InFlight {
        desc: desc.clone(),
        slots,
    });
    match action().errno_result() {
        Ok(()) => {
            let mut s = shared.lock().unwrap();
            m2.ops = m.ops + 1;
            s.model = m2;
            s.in_flight = None;
            true
        }
        Err(e) => {
            // After the kill any errno is possible: ENOTCONN/ECONNABORTED from the dead
            // connection, ENOENT once the mount is detached and paths resolve on the host.
            if !killed.load(Ordering::SeqCst) {
                shared.lock().unwrap().unexpected =
                    Some(format!("{desc}: unexpected {}", errno_name(e)));
            }
            false
        }
    }
}

/// Compares the directory tree under `root` with the model, skipping the in-flight slots.
fn verify(root: &Path, m: &Model, inflight: Option<&InFlight>) -> Vec<String> {
    let mut errs = Vec::new();
    let uncertain: BTreeSet<(DirId, String)> = inflight
        .map(|f| f.slots.iter().cloned().collect())
        .unwrap_or_default();
    // Directories reached only through an uncertain slot are skipped with their subtree.
    let mut skip_dirs: BTreeSet<DirId> = BTreeSet::new();
    for (k, e) in &m.entries {
        if let (true, Ent::Dir(d)) = (uncertain.contains(k), e) {
            skip_dirs.insert(*d);
        }
    }
    let skipped = |mut d: DirId| -> bool {
        loop {
            if skip_dirs.contains(&d) {
                return true;
            }
            if d == 0 {
                return false;
            }
            d = m.dirs[&d].0;
        }
    };
    let mut inos: BTreeMap<FileId, (u64, PathBuf)> = BTreeMap::new();
    let all_dirs: Vec<DirId> = std::iter::once(0).chain(m.dirs.keys().copied()).collect();
    for d in all_dirs {
        if skipped(d) {
            continue;
        }
        let dp = m.path(root, d);
        let listed: BTreeSet<String> = match fs::read_dir(&dp) {
            Ok(rd) => rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) => {
                errs.push(format!("{}: cannot list: {e}", dp.display()));
                continue;
            }
        };
        let want: BTreeMap<&String, &Ent> = m.children(d).collect();
        for name in &listed {
            if !want.contains_key(name) && !uncertain.contains(&(d, name.clone())) {
                errs.push(format!(
                    "{}: unexpected entry (unlinked or renamed away by an operation that returned)",
                    dp.join(name).display()
                ));
            }
        }
        for (name, e) in want {
            if uncertain.contains(&(d, name.clone())) {
                continue;
            }
            let p = dp.join(name);
            if !listed.contains(name) {
                errs.push(format!(
                    "{}: missing (created or renamed here by an operation that returned)",
                    p.display()
                ));
                continue;
            }
            let md = match fs::symlink_metadata(&p) {
                Ok(md) => md,
                Err(err) => {
                    errs.push(format!("{}: listed but stat fails: {err}", p.display()));
                    continue;
                }
            };
            match e {
                Ent::Dir(_) if !md.is_dir() => {
                    errs.push(format!("{}: should be a directory", p.display()))
                }
                Ent::File(f) => {
                    if !md.is_file() {
                        errs.push(format!("{}: should be a regular file", p.display()));
                        continue;
                    }
                    if let Some((ino, first)) = inos.get(f) {
                        if *ino != md.ino() {
                            errs.push(format!(
                                "{} and {} should be hard links of one inode",
                                p.display(),
                                first.display()
                            ));
                        }
                    } else {
                        inos.insert(*f, (md.ino(), p.clone()));
                    }
                    if let Some(c) = m.contents.get(f) {
                        match fs::read(&p) {
                            Ok(got) if got == *c => {}
                            Ok(got) => errs.push(format!(
                                "{}: fsynced contents differ ({} bytes expected, {} read)",
                                p.display(),
                                c.len(),
                                got.len()
                            )),
                            Err(err) => errs.push(format!("{}: read: {err}", p.display())),
                        }
                    }
                }
                Ent::Dir(_) => {}
            }
        }
    }
    // Link counts of files whose names are all certain.
    let mut names_per_file: BTreeMap<FileId, u64> = BTreeMap::new();
    for e in m.entries.values() {
        if let Ent::File(f) = e {
            *names_per_file.entry(*f).or_default() += 1;
        }
    }
    let touched: BTreeSet<FileId> = m
        .entries
        .iter()
        .filter(|(k, _)| uncertain.contains(*k))
        .filter_map(|(_, e)| match e {
            Ent::File(f) => Some(*f),
            Ent::Dir(_) => None,
        })
        .collect();
    for (f, (_, p)) in &inos {
        if touched.contains(f)
            || inflight.is_some_and(|i| {
                i.desc.starts_with("link")
                    || i.desc.starts_with("unlink")
                    || i.desc.starts_with("rename ")
            })
        {
            continue;
        }
        let n = fs::symlink_metadata(p).map(|m| m.nlink()).unwrap_or(0);
        if n != names_per_file[f] {
            errs.push(format!(
                "{}: nlink {n}, expected {}",
                p.display(),
                names_per_file[f]
            ));
        }
    }
    errs
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

fn run_round(round: u64, seed: u64, mode: &str) {
    let host = cairn_fstests::host_only();
    let mut t = if host {
        Target::host_dir()
    } else {
        Target::cairn(mode)
    };
    say!("=== kill -9 round {round} on {} (seed {seed})", t.name());
    let root = t.path("work");
    fs::create_dir(&root).unwrap();
    let shared = Arc::new(Mutex::new(Shared::default()));
    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (shared, killed, stop, root) =
            (shared.clone(), killed.clone(), stop.clone(), root.clone());
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            while !stop.load(Ordering::SeqCst) && step(&root, &mut rng, &shared, &killed) {}
        })
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0xDEAD);
    let delay = Duration::from_millis(rng.random_range(400..2500));
    std::thread::sleep(delay);
    if host {
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap();
    } else {
        killed.store(true, Ordering::SeqCst);
        t.kill_daemon();
        writer.join().unwrap();
    }
    let s = shared.lock().unwrap();
    if let Some(u) = &s.unexpected {
        panic!("round {round}: the workload failed before the kill: {u}");
    }
    let (model, inflight) = (s.model.clone(), s.in_flight.clone());
    drop(s);
    say!(
        "after {:.1}s: {} operations had returned ({} names, {} dirs, {} fsynced files); in flight: {}",
        delay.as_secs_f64(),
        model.ops,
        model.entries.len(),
        model.dirs.len(),
        model.contents.len(),
        inflight
            .as_ref()
            .map(|i| i.desc.as_str())
            .unwrap_or("nothing")
    );
    assert!(
        model.ops >= 20,
        "the workload made only {} operations before the kill",
        model.ops
    );

    if t.is_cairn() {
        let f = t.fsck(&[]);
        say!(
            "fsck (check only) after kill -9: exit {}\n{}",
            f.code,
            f.output
        );
        // cairn fsck classes each finding as "LEAK: ..." (what an interrupted sync-mode
        // operation may leave) or "CORRUPTION: ..." (what the ordering rules forbid); a
        // check-only run with findings exits 4 (errors left), like e2fsck -n.
        let corrupt = f.output.lines().any(|l| l.contains("CORRUPTION"));
        assert!(
            f.code == 0 || ((f.code == 1 || f.code == 4) && !corrupt && f.output.contains("LEAK")),
            "round {round}: fsck after kill -9 found more than leaked blocks/inodes (exit {}):\n{}",
            f.code,
            f.output
        );
        let f = t.fsck(&["-y"]);
        say!("fsck -y: exit {}", f.code);
        assert!(
            f.code == 0 || f.code == 1,
            "round {round}: fsck -y did not repair (exit {}):\n{}",
            f.code,
            f.output
        );
        let f = t.fsck(&[]);
        assert_eq!(
            f.code, 0,
            "round {round}: fsck after fsck -y is not clean:\n{}",
            f.output
        );
        t.mount();
    }
    let start = Instant::now();
    let errs = verify(&root, &model, inflight.as_ref());
    assert!(
        errs.is_empty(),
        "round {round} (seed {seed}): {} operations that had returned are not reflected after the crash \
         (in flight: {:?}):\n{}",
        errs.len(),
        inflight.map(|i| i.desc),
        errs.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
    say!(
        "round {round}: every returned operation is there ({:.1}s to verify)",
        start.elapsed().as_secs_f64()
    );
    if !t.is_cairn() {
        // The checker must be able to fail: undo one returned operation and one unlink.
        let victim = model.entries.iter().find_map(|((d, n), e)| {
            matches!(e, Ent::File(_)).then(|| model.path(&root, *d).join(n))
        });
        if let Some(v) = victim {
            fs::remove_file(&v).unwrap();
            fs::write(root.join("resurrected"), b"").unwrap();
            let errs = verify(&root, &model, None);
            assert!(
                errs.len() >= 2,
                "the checker missed a removed and an extra name: {errs:?}"
            );
            say!(
                "checker self-test: detected {} planted differences",
                errs.len()
            );
        }
    }
    t.assert_fsck_clean_and_remount("verification after crash recovery");
}

#[test]
fn kill9_during_metadata_workload() {
    let rounds = env_u64("CAIRN_CRASH_ROUNDS").unwrap_or(3);
    let seed = env_u64("CAIRN_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    say!("CAIRN_CRASH_SEED={seed} CAIRN_CRASH_ROUNDS={rounds}");
    let modes = if cairn_fstests::host_only() {
        vec!["host".to_string()]
    } else {
        cairn_fstests::durable_modes()
    };
    if modes.is_empty() {
        say!(
            "no mode under test promises calls durable on return ({:?}): nothing to hold a kill -9 to",
            cairn_fstests::modes()
        );
        return;
    }
    for r in 0..rounds.max(modes.len() as u64) {
        let mode = &modes[(r % modes.len() as u64) as usize];
        run_round(
            r,
            seed.wrapping_add(r.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            mode,
        );
    }
}
