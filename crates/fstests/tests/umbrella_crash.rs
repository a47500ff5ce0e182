//! Crash safety of umbrella migrations: a migration-heavy workload (files growing past and
//! shrinking below a size threshold, losing and regaining write permission, moving in and
//! out of a path rule) runs through an umbrella mount while the daemon is killed with
//! SIGKILL at random moments; each migration step sleeps a little
//! (`CAIRN_UMBRELLA_DELAY_MS`) so kills land inside the moves the daemon runs after each
//! close. After every remount (whose recovery finishes or rolls back interrupted moves)
//! every file must exist on exactly one branch with the contents and mode the workload
//! last completed, and no other file may exist on any branch.
//!
//! Environment: `CAIRN_UMBRELLA_CRASH_ROUNDS` (default 6), `CAIRN_UMBRELLA_CRASH_SEED`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_fstests::{UMBRELLA_CONFIG, cairn_bin, is_mountpoint, pattern, say};
use rand::{Rng, SeedableRng};

const BRANCHES: [&str; 3] = ["b1", "b2", "b3"];

struct Daemon {
    child: Child,
}

fn start(dir: &Path) -> Daemon {
    let mnt = dir.join("mnt");
    let child = Command::new(cairn_bin())
        .args(["umbrella", "-f"])
        .arg(dir.join("u.toml"))
        .arg(&mnt)
        .env("CAIRN_UMBRELLA_DELAY_MS", "3")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn cairn umbrella");
    let t = Instant::now();
    while !is_mountpoint(&mnt) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "umbrella mount did not come up"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Daemon { child }
}

fn kill(mut d: Daemon, mnt: &Path) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = d.child.wait();
    let ok = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let _ = Command::new("umount").arg("-l").arg(mnt).status();
    }
}

fn stop(mut d: Daemon, mnt: &Path) {
    let _ = Command::new(cairn_bin()).arg("umount").arg(mnt).status();
    let _ = d.child.wait();
}

#[derive(Clone, Debug, PartialEq)]
struct State {
    path: String,
    data: Vec<u8>,
    ro: bool,
}

/// Regular files under `root` (relative paths), skipping the metadata directory.
fn host_files(root: &Path, rel: &str, out: &mut Vec<String>) {
    let Ok(rd) = fs::read_dir(root.join(rel)) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if rel.is_empty() && name == ".umbrella" {
            continue;
        }
        let r = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            host_files(root, &r, out);
        } else {
            out.push(r);
        }
    }
}

fn apply(mnt: &Path, s: &State, op: u32, rng: &mut rand::rngs::StdRng) -> std::io::Result<State> {
    let mut n = s.clone();
    let p = mnt.join(&s.path);
    match op {
        // Grow past the 4K threshold.
        0 => {
            let add = pattern(rng.random(), rng.random_range(5000..20000));
            let mut f = fs::OpenOptions::new().append(true).open(&p)?;
            f.write_all(&add)?;
            n.data.extend_from_slice(&add);
        }
        // Shrink below it.
        1 => {
            let len = rng.random_range(0..3000).min(n.data.len());
            fs::OpenOptions::new()
                .write(true)
                .open(&p)?
                .set_len(len as u64)?;
            n.data.truncate(len);
        }
        // Read-only and back.
        2 => {
            fs::set_permissions(
                &p,
                fs::Permissions::from_mode(if s.ro { 0o644 } else { 0o444 }),
            )?;
            n.ro = !s.ro;
        }
        // In and out of the path rule (/*/sub*).
        _ => {
            let (dir, name) = s.path.split_once('/').unwrap();
            n.path = if let Some(rest) = name.strip_prefix("sub1/") {
                format!("{dir}/{rest}")
            } else {
                format!("{dir}/sub1/{name}")
            };
            fs::rename(&p, mnt.join(&n.path))?;
        }
    }
    Ok(n)
}

#[test]
fn kill9_during_migrations_leaves_one_copy_of_everything() {
    let rounds: usize = std::env::var("CAIRN_UMBRELLA_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let seed: u64 = std::env::var("CAIRN_UMBRELLA_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    say!("CAIRN_UMBRELLA_CRASH_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for b in BRANCHES {
        fs::create_dir(d.join(b)).unwrap();
    }
    let mnt: PathBuf = d.join("mnt");
    fs::create_dir(&mnt).unwrap();
    fs::write(d.join("u.toml"), UMBRELLA_CONFIG).unwrap();

    let mut daemon = start(d);
    let mut model: BTreeMap<usize, State> = BTreeMap::new();
    for k in 0..24 {
        let dd = format!("d{}", k % 4);
        fs::create_dir_all(mnt.join(&dd).join("sub1")).unwrap();
        let data = pattern(k as u64, 1000 + 300 * k);
        let path = format!("{dd}/f{k:02}");
        fs::write(mnt.join(&path), &data).unwrap();
        model.insert(
            k,
            State {
                path,
                data,
                ro: false,
            },
        );
    }
    let mut total_ops = 0;
    let mut recovered = 0;
    for round in 0..rounds {
        let deadline = Instant::now() + Duration::from_millis(rng.random_range(150..900));
        while Instant::now() < deadline {
            let k = rng.random_range(0..model.len());
            let s = model[&k].clone();
            let op = rng.random_range(0..4u32);
            match apply(&mnt, &s, op, &mut rng) {
                Ok(n) => {
                    model.insert(k, n);
                    total_ops += 1;
                }
                Err(e) => panic!(
                    "round {round}: op {op} on {} failed before the kill: {e}",
                    s.path
                ),
            }
        }
        // Let some migrations start, then kill in the middle of them.
        std::thread::sleep(Duration::from_millis(rng.random_range(0..30)));
        kill(daemon, &mnt);
        daemon = start(d);
        let st = Command::new(cairn_bin())
            .args(["umbrella", "status", "--json"])
            .arg(&mnt)
            .output()
            .unwrap();
        let v = String::from_utf8_lossy(&st.stdout).into_owned();
        let n: u64 = v
            .split("\"recovered_at_mount\":")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        recovered += n;
        // Every file once, with the right contents.
        let mut seen: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for b in BRANCHES {
            let mut v = Vec::new();
            host_files(&d.join(b), "", &mut v);
            for f in v {
                seen.entry(f).or_default().push(b);
            }
        }
        for s in model.values() {
            let on = seen.get(&s.path).cloned().unwrap_or_default();
            assert_eq!(
                on.len(),
                1,
                "round {round}: {} is on {:?} (want exactly one branch); seed {seed}",
                s.path,
                on
            );
            let got = fs::read(mnt.join(&s.path))
                .unwrap_or_else(|e| panic!("round {round}: read {}: {e}", s.path));
            assert!(
                got == s.data,
                "round {round}: {} has {} bytes, want {}; seed {seed}",
                s.path,
                got.len(),
                s.data.len()
            );
            let mode = fs::metadata(mnt.join(&s.path))
                .unwrap()
                .permissions()
                .mode()
                & 0o777;
            assert_eq!(
                mode,
                if s.ro { 0o444 } else { 0o644 },
                "round {round}: mode of {}",
                s.path
            );
        }
        let expected: Vec<&String> = model.values().map(|s| &s.path).collect();
        for f in seen.keys() {
            assert!(
                expected.contains(&f),
                "round {round}: stray file {f} on {:?}; seed {seed}",
                seen[f]
            );
        }
        say!(
            "round {round}: {} files, each once, contents intact ({total_ops} operations, {recovered} interrupted moves recovered so far)",
            model.len()
        );
    }
    // The kills must have landed inside moves for this test to mean anything.
    if rounds >= 6 {
        assert!(
            recovered > 0,
            "no kill interrupted a migration in {rounds} rounds; seed {seed}"
        );
    }
    let st = Command::new(cairn_bin())
        .args(["umbrella", "status", "--json"])
        .arg(&mnt)
        .output()
        .unwrap();
    say!("final status: {}", String::from_utf8_lossy(&st.stdout));
    stop(daemon, &mnt);
}
