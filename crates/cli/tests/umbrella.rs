//! `cairn umbrella` end to end, through the real daemon: `reload` by mount point from
//! another working directory (issue 9 §10), a SIGKILL of the daemon at every step of a
//! migration (`CAIRN_UMBRELLA_CRASH_AT`), and a randomized workload that renames
//! directories, creates, links and removes files while migrations are in flight, with
//! clean and kill -9 remounts, checked against a model (issue 9 §5).
//!
//! Needs root and /dev/fuse. Each test has its own runtime directory (CAIRN_RUNTIME_DIR).
//! `CAIRN_UMBRELLA_MODEL_SEED` replays a randomized run; `CAIRN_UMBRELLA_MODEL_ROUNDS`
//! (default 12) sets its length.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

/// Files over 2K, and files under a `cold*` top directory, on slow; the rest on fast.
const TIERS: &str = r#"
[umbrella]
default = ["fast"]
[[branch]]
name = "fast"
path = "fast"
[[branch]]
name = "slow"
path = "slow"
[[rule]]
name = "cold directories"
namespace = [{ match = "/cold*/*", branches = ["slow"] }]
[[rule]]
name = "over 2K"
size = "> 2K"
branches = ["slow"]
"#;

const BRANCHES: [&str; 2] = ["fast", "slow"];

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new(config: &str) -> Env {
        let dir = tempfile::Builder::new()
            .prefix("umbrella-cli-")
            .tempdir()
            .unwrap();
        for d in ["fast", "slow", "mnt", "elsewhere"] {
            fs::create_dir(dir.path().join(d)).unwrap();
        }
        fs::write(dir.path().join("u.toml"), config).unwrap();
        Env { dir }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.p("mnt").join(rel)
    }

    fn cairn_in(&self, cwd: &Path, args: &[&str]) -> Output {
        Command::new(CAIRN)
            .args(args)
            .env("CAIRN_RUNTIME_DIR", self.p("run"))
            .current_dir(cwd)
            .output()
            .unwrap()
    }

    fn ok_in(&self, cwd: &Path, args: &[&str]) -> Output {
        let o = self.cairn_in(cwd, args);
        assert!(
            o.status.success(),
            "cairn {args:?} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    fn mounted(&self) -> bool {
        let m = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mp = self.p("mnt");
        m.lines()
            .any(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
    }

    /// A foreground daemon (`-f`), so the test knows its pid.
    fn start(&self, env: &[(&str, &str)]) -> Child {
        let child = Command::new(CAIRN)
            .args(["umbrella", "-f", "u.toml", "mnt"])
            .env("CAIRN_RUNTIME_DIR", self.p("run"))
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .current_dir(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        wait_until("the umbrella mount", || self.mounted());
        child
    }

    fn stop(&self, mut d: Child) {
        self.ok_in(self.dir.path(), &["umount", "mnt"]);
        let st = d.wait().unwrap();
        assert!(st.success(), "daemon ended with {st}");
    }

    /// SIGKILL (or wait for a daemon that killed itself), then detach the dead mount.
    fn kill(&self, mut d: Child, already: bool) {
        if !already {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(d.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let st = d.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            st.signal(),
            Some(9),
            "the daemon was to die by SIGKILL: {st}"
        );
        let _ = nix::mount::umount2(&self.p("mnt"), nix::mount::MntFlags::MNT_DETACH);
        wait_until("the dead mount to go", || !self.mounted());
    }

    fn status(&self) -> serde_json::Value {
        let o = self.ok_in(self.dir.path(), &["umbrella", "status", "--json", "mnt"]);
        serde_json::from_slice(&o.stdout).unwrap()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if self.mounted() {
            let _ = nix::mount::umount2(&self.p("mnt"), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u64).wrapping_mul(0x9e37_79b9).wrapping_add(seed) as u8)
        .collect()
}

/// Union path -> (link group, contents).
type Model = BTreeMap<String, (u64, Vec<u8>)>;

fn files_under(root: &Path, rel: &str, out: &mut Vec<String>) {
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
        if e.file_type().unwrap().is_dir() {
            files_under(root, &r, out);
        } else {
            out.push(r);
        }
    }
}

fn entries(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The union is the model (names, contents, links); every name is on exactly one branch;
/// no branch holds a move record, a temporary or a kept copy.
#[track_caller]
fn check(e: &Env, model: &Model, what: &str) {
    let mut union = Vec::new();
    files_under(&e.m(""), "", &mut union);
    union.sort();
    assert_eq!(
        union.iter().collect::<Vec<_>>(),
        model.keys().collect::<Vec<_>>(),
        "{what}: names in the union"
    );
    let mut group_ino: BTreeMap<u64, u64> = BTreeMap::new();
    for (p, (g, data)) in model {
        let got = fs::read(e.m(p)).unwrap_or_else(|err| panic!("{what}: read {p}: {err}"));
        assert!(
            got == *data,
            "{what}: {p} has {} bytes, want {}",
            got.len(),
            data.len()
        );
        let ino = fs::metadata(e.m(p)).unwrap().ino();
        assert_eq!(
            *group_ino.entry(*g).or_insert(ino),
            ino,
            "{what}: {p} is not linked to the other names of its file"
        );
    }
    // Reading a misplaced file through the mount (one whose move a kill cut off) queues its
    // move at close: let those finish before looking at the branches.
    wait_until("queued migrations", || {
        e.status()["migrations"]["pending"] == 0
    });
    for p in model.keys() {
        let on: Vec<&str> = BRANCHES
            .into_iter()
            .filter(|b| fs::symlink_metadata(e.p(b).join(p)).is_ok())
            .collect();
        assert_eq!(on.len(), 1, "{what}: {p} is on {on:?}");
    }
    for b in BRANCHES {
        let mut host = Vec::new();
        files_under(&e.p(b), "", &mut host);
        for h in host {
            assert!(model.contains_key(&h), "{what}: stray {h} on {b}");
        }
        for sub in ["moves", "tmp", "kept"] {
            let left = entries(&e.p(b).join(".umbrella").join(sub));
            assert!(
                left.is_empty(),
                "{what}: {b}/.umbrella/{sub} holds {left:?}"
            );
        }
    }
}

/// Issue 9 §10: the daemon is started with a relative config path and changes its working
/// directory; `reload MNT` (no path) must still find the file.
#[test]
fn reload_by_mount_point_from_another_directory() {
    let e = Env::new(TIERS);
    e.ok_in(e.dir.path(), &["umbrella", "u.toml", "mnt"]);
    fs::write(e.m("x"), b"x").unwrap();
    // New rules: everything on slow.
    fs::write(
        e.p("u.toml"),
        TIERS.replace("default = [\"fast\"]", "default = [\"slow\"]"),
    )
    .unwrap();
    let mnt = e.m("");
    let o = e.ok_in(
        &e.p("elsewhere"),
        &["umbrella", "reload", mnt.to_str().unwrap()],
    );
    let said = String::from_utf8_lossy(&o.stdout);
    let abs = e.p("u.toml").canonicalize().unwrap();
    assert!(said.contains(abs.to_str().unwrap()), "{said}");
    fs::write(e.m("y"), b"y").unwrap();
    assert!(e.p("slow/y").exists(), "the reloaded rules place new files");
    assert_eq!(e.status()["config"], abs.to_str().unwrap());
    e.ok_in(&e.p("elsewhere"), &["umount", mnt.to_str().unwrap()]);
}

/// A daemon that kills itself (SIGKILL) at each failpoint of a migration of a file with two
/// names; the next mount must show the file once, whole, with both names linked, and no
/// record, temporary or kept copy anywhere.
#[test]
fn a_kill_at_every_step_of_a_migration_loses_nothing() {
    for point in cairn_umbrella::FAILPOINTS {
        let what = format!("killed at {point}");
        let e = Env::new(TIERS);
        let d = e.start(&[("CAIRN_UMBRELLA_CRASH_AT", point)]);
        fs::create_dir(e.m("d")).unwrap();
        fs::write(e.m("d/small"), b"stays on fast").unwrap();
        let data = pattern(9, 4096);
        {
            let mut f = fs::File::create(e.m("d/a")).unwrap();
            f.write_all(&data).unwrap();
            fs::hard_link(e.m("d/a"), e.m("d/b")).unwrap();
        }
        e.kill(d, true);
        let mut model: Model = BTreeMap::new();
        model.insert("d/a".into(), (1, data.clone()));
        model.insert("d/b".into(), (1, data.clone()));
        model.insert("d/small".into(), (2, b"stays on fast".to_vec()));
        let d = e.start(&[]);
        let st = e.status();
        let recorded = !matches!(*point, "gathered" | "copied");
        assert_eq!(
            st["migrations"]["recovered_at_mount"],
            u64::from(recorded),
            "{what}: {st}"
        );
        assert_eq!(st["migrations"]["kept_at_mount"], 0, "{what}: {st}");
        check(&e, &model, &what);
        // Life goes on: the next close moves it, a clean remount keeps everything.
        drop(
            fs::OpenOptions::new()
                .append(true)
                .open(e.m("d/a"))
                .unwrap(),
        );
        wait_until("the move after recovery", || {
            e.p("slow/d/a").exists() && e.p("slow/d/b").exists()
        });
        e.stop(d);
        let d = e.start(&[]);
        check(&e, &model, &format!("{what}, then a clean remount"));
        e.stop(d);
    }
}

/// splitmix64: a reproducible stream from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            Some(&v[self.below(v.len() as u64) as usize])
        }
    }
}

struct Workload {
    model: Model,
    /// Top-level directories (each `dN` or `coldN`).
    dirs: Vec<String>,
    next_group: u64,
    next_dir: u64,
}

impl Workload {
    fn set_contents(&mut self, g: u64, data: &[u8]) {
        for (_, v) in self.model.iter_mut().filter(|(_, (x, _))| *x == g) {
            v.1 = data.to_vec();
        }
    }

    /// One random operation through the mount, mirrored in the model. Returns a label.
    fn step(&mut self, e: &Env, rng: &mut Rng) -> String {
        let files: Vec<String> = self.model.keys().cloned().collect();
        match rng.below(10) {
            // Create a file, sometimes over the size threshold, sometimes closed and its
            // directory renamed at once (the migration is then in flight).
            0..=2 => {
                let Some(dir) = rng.pick(&self.dirs).cloned() else {
                    return self.mkdir(e, rng);
                };
                let p = format!("{dir}/f{}", rng.next() % 100_000);
                if self.model.contains_key(&p) {
                    return "skip".into();
                }
                let data = pattern(rng.next(), rng.below(6000) as usize);
                fs::write(e.m(&p), &data).unwrap();
                self.next_group += 1;
                self.model.insert(p.clone(), (self.next_group, data));
                if rng.below(3) == 0 {
                    let l = self.rename_dir(e, &dir, rng);
                    return format!("create {p} then {l}");
                }
                format!("create {p}")
            }
            // Grow or shrink a file across the threshold.
            3 => {
                let Some(p) = rng.pick(&files).cloned() else {
                    return "skip".into();
                };
                let (g, mut data) = self.model[&p].clone();
                if rng.below(2) == 0 {
                    let more = pattern(rng.next(), 1000 + rng.below(4000) as usize);
                    let mut f = fs::OpenOptions::new().append(true).open(e.m(&p)).unwrap();
                    f.write_all(&more).unwrap();
                    data.extend_from_slice(&more);
                } else {
                    let len = rng.below(data.len() as u64 + 1) as usize;
                    fs::OpenOptions::new()
                        .write(true)
                        .open(e.m(&p))
                        .unwrap()
                        .set_len(len as u64)
                        .unwrap();
                    data.truncate(len);
                }
                self.set_contents(g, &data);
                format!("resize {p} to {}", data.len())
            }
            // A hard link in another directory.
            4 => {
                let (Some(p), Some(dir)) =
                    (rng.pick(&files).cloned(), rng.pick(&self.dirs).cloned())
                else {
                    return "skip".into();
                };
                let q = format!("{dir}/l{}", rng.next() % 100_000);
                if self.model.contains_key(&q) {
                    return "skip".into();
                }
                fs::hard_link(e.m(&p), e.m(&q)).unwrap();
                let v = self.model[&p].clone();
                self.model.insert(q.clone(), v);
                format!("link {p} {q}")
            }
            // Remove a name.
            5 => {
                let Some(p) = rng.pick(&files).cloned() else {
                    return "skip".into();
                };
                fs::remove_file(e.m(&p)).unwrap();
                self.model.remove(&p);
                format!("unlink {p}")
            }
            // Rename a file into another directory.
            6 => {
                let (Some(p), Some(dir)) =
                    (rng.pick(&files).cloned(), rng.pick(&self.dirs).cloned())
                else {
                    return "skip".into();
                };
                let q = format!("{dir}/r{}", rng.next() % 100_000);
                if self.model.contains_key(&q) {
                    return "skip".into();
                }
                fs::rename(e.m(&p), e.m(&q)).unwrap();
                let v = self.model.remove(&p).unwrap();
                self.model.insert(q.clone(), v);
                format!("rename {p} {q}")
            }
            // Rename a directory (in and out of the cold rule: every file in it moves).
            7 | 8 => {
                let Some(dir) = rng.pick(&self.dirs).cloned() else {
                    return self.mkdir(e, rng);
                };
                self.rename_dir(e, &dir, rng)
            }
            _ => self.mkdir(e, rng),
        }
    }

    fn mkdir(&mut self, e: &Env, rng: &mut Rng) -> String {
        self.next_dir += 1;
        let d = if rng.below(2) == 0 {
            format!("d{}", self.next_dir)
        } else {
            format!("cold{}", self.next_dir)
        };
        fs::create_dir(e.m(&d)).unwrap();
        self.dirs.push(d.clone());
        format!("mkdir {d}")
    }

    fn rename_dir(&mut self, e: &Env, dir: &str, rng: &mut Rng) -> String {
        self.next_dir += 1;
        let to = if dir.starts_with("cold") || rng.below(3) == 0 {
            format!("d{}", self.next_dir)
        } else {
            format!("cold{}", self.next_dir)
        };
        fs::rename(e.m(dir), e.m(&to)).unwrap();
        let prefix = format!("{dir}/");
        self.model = std::mem::take(&mut self.model)
            .into_iter()
            .map(|(k, v)| match k.strip_prefix(&prefix) {
                Some(rest) => (format!("{to}/{rest}"), v),
                None => (k, v),
            })
            .collect();
        for d in self.dirs.iter_mut().filter(|d| *d == dir) {
            *d = to.clone();
        }
        format!("rename {dir} {to}")
    }
}

#[test]
fn randomized_renames_and_migrations_with_clean_and_kill9_remounts() {
    let seed: u64 = std::env::var("CAIRN_UMBRELLA_MODEL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let rounds: usize = std::env::var("CAIRN_UMBRELLA_MODEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    println!("CAIRN_UMBRELLA_MODEL_SEED={seed} CAIRN_UMBRELLA_MODEL_ROUNDS={rounds}");
    let mut rng = Rng(seed);
    let e = Env::new(TIERS);
    // Each migration step sleeps a little, so renames and kills land inside moves.
    let env = [("CAIRN_UMBRELLA_DELAY_MS", "2")];
    let mut d = e.start(&env);
    let mut w = Workload {
        model: BTreeMap::new(),
        dirs: Vec::new(),
        next_group: 0,
        next_dir: 0,
    };
    let (mut kills, mut recovered, mut abandoned, mut ops) = (0, 0u64, 0u64, 0);
    for round in 0..rounds {
        let mut log = Vec::new();
        for _ in 0..50 {
            log.push(w.step(&e, &mut rng));
            ops += 1;
        }
        let kill = rng.below(2) == 0;
        let what = format!(
            "seed {seed}, round {round}, {} remount after: {}",
            if kill { "kill -9" } else { "clean" },
            log.join("; ")
        );
        if kill {
            // Right after the last operation: migrations it queued are in flight.
            e.kill(d, false);
            kills += 1;
        } else {
            // No move record outlives its move: once nothing is queued, none is left.
            wait_until("queued migrations", || {
                e.status()["migrations"]["pending"] == 0
            });
            let st = e.status();
            assert_eq!(st["migrations"]["records"], 0, "{what}: {st}");
            assert_eq!(st["migrations"]["unfinished"], 0, "{what}: {st}");
            abandoned += st["migrations"]["abandoned"].as_u64().unwrap_or(0);
            e.stop(d);
        }
        d = e.start(&env);
        let st = e.status();
        recovered += st["migrations"]["recovered_at_mount"].as_u64().unwrap_or(0);
        assert_eq!(st["migrations"]["kept_at_mount"], 0, "{what}: {st}");
        check(&e, &w.model, &what);
        println!(
            "round {round}: {} names in {} directories intact ({ops} operations, {kills} kills, \
             {recovered} interrupted moves recovered, {abandoned} moves abandoned because the \
             file changed, so far)",
            w.model.len(),
            w.dirs.len()
        );
    }
    let st = e.status();
    println!("final status: {st}");
    e.stop(d);
}

/// `mount -t fuse.umbrella CONFIG DIR` as fstests mounts it, through the helpers
/// (`cairn install-helper`), inside a private mount namespace whose /sbin is an overlay
/// (the machine's /sbin is never touched): a device node on the mount opens (the helper
/// mounts dev and suid as a disk file system is, generic/184), `-o remount,ro` and back
/// change the mount in place (generic/294), a second mount point of the same configuration
/// is served by the same daemon, renames seen from both (generic/732), and each unmount
/// goes through `cairn umount`.
#[test]
fn mount_dash_t_fuse_umbrella_remount_and_a_second_mount_point() {
    let e = Env::new(TIERS);
    let script = r#"mkdir mnt2
"$CAIRN" install-helper --link >/dev/null
mount -t fuse.umbrella u.toml mnt
grep -q " $PWD/mnt .* - fuse.umbrella " /proc/self/mountinfo
mknod mnt/null c 1 3
echo discarded > mnt/null
echo before > mnt/f
mount -o remount,ro mnt
if touch mnt/g 2>/dev/null; then echo "written while read-only"; exit 1; fi
mount -o remount,rw mnt
echo after > mnt/f
mount -t fuse.umbrella u.toml mnt2
test "$(cat mnt2/f)" = after
mv mnt2/f mnt/g
test "$(cat mnt2/g)" = after
umount mnt2
test "$(cat mnt/g)" = after
umount mnt
! grep -q " $PWD/mnt .* - fuse.umbrella " /proc/self/mountinfo
"#;
    common::in_private_sbin(script, e.dir.path(), &e.p("run"));
    assert!(e.p("fast/g").exists(), "the rename reached the branch");
}
