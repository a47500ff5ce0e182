//! Per-run scratch directories, and the cleanup of runs that died.
//!
//! Every `cairn bench run` (and `flush-rate`) works in a directory of its own,
//! `cairn-bench.<pid>.<n>`, made in the parent that `--scratch` names (default `/var/tmp`), and
//! holds an exclusive `flock(2)` on the file `lock` inside it for as long as it lives. The
//! kernel drops a flock when its holder exits, however it exits (Ctrl-C, SIGKILL, a panic), so
//! "the lock can be taken" means exactly "the run that made this directory is gone". Two runs
//! with the same parent therefore never share a path, and a run that starts cleans up only
//! after runs that died.
//!
//! The rules, each protecting a live run or a user's files:
//! - A directory is a run's only if its name starts with [`PREFIX`], it is a real directory
//!   (not a symlink) owned by this user, and it holds a regular file [`LOCK`]. Nothing else in
//!   the parent is ever touched.
//! - Cleanup takes the lock without waiting before it touches anything; if the lock is held,
//!   the run is alive and its directory is left alone.
//! - The lock file appears under its name only once it is locked (it is made as `lock.new`,
//!   locked, then renamed), so a starting run is never seen with an unlocked `lock`; a
//!   directory without `lock` is a run still being made and is skipped.
//! - The lock is opened close-on-exec (as every file Rust opens), so the FUSE daemons a run
//!   starts do not inherit it: a daemon that outlives its run does not keep the run's directory
//!   "alive" forever; the cleanup unmounts it.
//! - Removal never reaches into another file system: whatever is mounted below a dead run's
//!   directory is unmounted first, loop devices over its images are detached, and a directory
//!   that still holds a mount is left in place and reported rather than deleted through it.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};

use crate::sys;

/// How every run's directory name starts.
pub const PREFIX: &str = "cairn-bench.";
/// The lock file inside a run's directory; held (flock, exclusive) while the run lives.
pub const LOCK: &str = "lock";
/// The lock file's name until it is locked.
const LOCK_NEW: &str = "lock.new";

/// This run's own scratch directory, locked for as long as the value lives. Dropping it (or
/// [`ScratchDir::remove`]) releases what is left in it and removes it.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
    /// Held until the directory is gone; `None` once released.
    lock: Option<Flock<File>>,
}

impl ScratchDir {
    /// Makes a fresh, locked directory `cairn-bench.<pid>.<n>` in `parent` (created if missing).
    pub fn create(parent: &Path) -> Result<ScratchDir> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let parent = sys::ensure_dir(parent)?;
        let mut made = None;
        for _ in 0..100 {
            // The pid keeps concurrent runs apart, the sequence number and clock keep one
            // process's directories (and a recycled pid's) apart; mkdir is the atomic claim.
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let name = format!(
                "{PREFIX}{}.{}{nanos:x}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            );
            let path = parent.join(name);
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    made = Some(path);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("mkdir {}", path.display())),
            }
        }
        let Some(path) = made else {
            bail!(
                "cannot make a fresh {PREFIX}* directory in {}",
                parent.display()
            );
        };
        match lock_new(&path) {
            Ok(lock) => Ok(ScratchDir {
                path,
                lock: Some(lock),
            }),
            Err(e) => {
                // Nobody else can have used it yet: it is ours and empty but for the lock file.
                let _ = fs::remove_dir_all(&path);
                Err(e)
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Releases what is still mounted or attached below the directory, removes it, and only
    /// then gives up the lock, so no cleanup can start on it halfway.
    pub fn remove(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        if self.lock.is_none() {
            return Ok(());
        }
        let res = if self.path.exists() {
            release_under(&self.path);
            remove_tree(&self.path)
        } else {
            Ok(())
        };
        self.lock = None;
        res
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("cairn bench: {e:#}");
        }
    }
}

/// Creates the lock file under a temporary name, locks it, and only then gives it its name.
fn lock_new(dir: &Path) -> Result<Flock<File>> {
    let tmp = dir.join(LOCK_NEW);
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let lock = Flock::lock(f, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| anyhow::anyhow!("locking {}: {e}", tmp.display()))?;
    fs::rename(&tmp, dir.join(LOCK))
        .with_context(|| format!("renaming {} to {LOCK}", tmp.display()))?;
    Ok(lock)
}

/// What [`cleanup_dead_runs`] found.
#[derive(Debug, Default)]
pub struct Cleanup {
    /// Directories of dead runs, released and removed.
    pub removed: Vec<PathBuf>,
    /// Directories of runs that are alive (their lock is held): not touched.
    pub live: Vec<PathBuf>,
    /// Dead runs' directories that could not be removed, and why (e.g. a mount that would not
    /// go away); left in place.
    pub kept: Vec<(PathBuf, String)>,
}

/// Releases and removes the directories that runs which died (Ctrl-C, SIGKILL, a crash) left
/// in `parent`: their mounts, loop devices and images. Touches nothing else (see the module's
/// rules); a missing `parent` has nothing to clean.
pub fn cleanup_dead_runs(parent: &Path) -> Result<Cleanup> {
    let mut out = Cleanup::default();
    let entries = match fs::read_dir(parent) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", parent.display())),
    };
    let parent = parent
        .canonicalize()
        .with_context(|| format!("canonicalize {}", parent.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let is_run_name = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .is_some_and(|rest| !rest.is_empty());
        if !is_run_name {
            continue;
        }
        let dir = parent.join(&name);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() && m.uid() == me => {}
            _ => continue,
        }
        let lock = match probe(&dir) {
            Probe::NotARun => continue,
            Probe::Live => {
                out.live.push(dir);
                continue;
            }
            Probe::Dead(lock) => lock,
        };
        release_under(&dir);
        match remove_tree(&dir) {
            Ok(()) => out.removed.push(dir),
            Err(e) => out.kept.push((dir, format!("{e:#}"))),
        }
        drop(lock);
    }
    Ok(out)
}

/// What a directory named like a run's turned out to be.
enum Probe {
    /// No regular lock file (not a run's, or one still being made), or one that cannot be
    /// opened or locked for another reason, or gone meanwhile: not ours to touch.
    NotARun,
    /// Its lock is held: the run lives.
    Live,
    /// Its lock is ours now: the run that made it is gone.
    Dead(Flock<File>),
}

fn probe(dir: &Path) -> Probe {
    let path = dir.join(LOCK);
    if !fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()) {
        return Probe::NotARun;
    }
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(&path)
    else {
        return Probe::NotARun;
    };
    let lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((_, Errno::EWOULDBLOCK)) => return Probe::Live,
        Err(_) => return Probe::NotARun,
    };
    // Another cleanup may have removed the directory between our open and our lock; then the
    // lock we hold is on a file that no longer has this name, and the directory is not ours to
    // clean.
    let same = match (lock.metadata(), fs::symlink_metadata(&path)) {
        (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
        _ => false,
    };
    if same {
        Probe::Dead(lock)
    } else {
        Probe::NotARun
    }
}

/// Mount points at or below `dir` (canonical), topmost first: the reverse of mount order, so
/// a mount stacked on another, or inside another, comes before it.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v: Vec<PathBuf> = sys::mount_points(&info)
        .into_iter()
        .filter(|p| p.starts_with(dir))
        .collect();
    v.reverse();
    v
}

/// Releases everything a run made below `dir`: unmounts (lazily, topmost first) what is
/// mounted there and detaches the loop devices whose backing file lies there. Best effort: what
/// stays is caught by [`remove_tree`], which refuses to delete through a mount.
pub fn release_under(dir: &Path) {
    for mnt in mounts_under(dir) {
        // A stacked mount appears once per layer; each `umount -l` takes the top one.
        while sys::mounted_fstype(&mnt).is_some() {
            let ok = Command::new("umount")
                .arg("-l")
                .arg(&mnt)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                break;
            }
        }
    }
    for dev in sys::loop_devices_backed_under(dir) {
        let _ = Command::new("losetup").arg("-d").arg(&dev).status();
    }
}

/// Removes `dir` and everything below it, never crossing into another file system: if anything
/// is still mounted at or below it, nothing is removed.
pub fn remove_tree(dir: &Path) -> Result<()> {
    let canon = dir
        .canonicalize()
        .with_context(|| format!("canonicalize {}", dir.display()))?;
    if let Some(m) = mounts_under(&canon).first() {
        bail!(
            "{} still has a mount at {}: left in place",
            dir.display(),
            m.display()
        );
    }
    let dev = fs::symlink_metadata(&canon)?.dev();
    remove_same_fs(&canon, dev)
}

fn remove_same_fs(p: &Path, dev: u64) -> Result<()> {
    let m = fs::symlink_metadata(p).with_context(|| format!("stat {}", p.display()))?;
    if !m.is_dir() {
        return fs::remove_file(p).with_context(|| format!("removing {}", p.display()));
    }
    // A directory on another device is a mount the mount table did not show us (another
    // namespace, a race): never delete what is inside it.
    if m.dev() != dev {
        bail!("{} is on another file system: left in place", p.display());
    }
    for e in fs::read_dir(p).with_context(|| format!("reading {}", p.display()))? {
        remove_same_fs(&e?.path(), dev)?;
    }
    fs::remove_dir(p).with_context(|| format!("removing {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run that died leaves: its directory, an unlocked lock file, a target's image and
    /// mount point.
    fn dead_run(parent: &Path, name: &str) -> PathBuf {
        let d = parent.join(name);
        fs::create_dir_all(d.join("cairn-async/mnt")).unwrap();
        fs::write(d.join(LOCK), "").unwrap();
        fs::write(d.join("cairn-async/fs.img"), "image").unwrap();
        d
    }

    #[test]
    fn a_live_runs_directory_is_left_alone_and_a_dead_ones_is_removed() {
        let parent = tempfile::tempdir().unwrap();
        // Run 1 is alive: it holds its directory's lock and has a target set up in it.
        let live = ScratchDir::create(parent.path()).unwrap();
        let target = live.path().join("cairn-async");
        fs::create_dir_all(target.join("mnt")).unwrap();
        fs::write(target.join("fs.img"), "live image").unwrap();
        // A run that died, and things in the parent that are no run's.
        let dead = dead_run(parent.path(), "cairn-bench.1.dead");
        let no_lock = parent.path().join("cairn-bench.2.starting");
        fs::create_dir_all(no_lock.join("mnt")).unwrap();
        // The fixed directory earlier versions used, a name with no run part, a user's files:
        // each looks like a run's scratch to a cleanup that goes by contents.
        let foreign: Vec<PathBuf> = ["cairn-bench", "cairn-bench.", "my-files"]
            .iter()
            .map(|n| dead_run(parent.path(), n))
            .collect();

        // Run 2 starts: it cleans up, then makes its own directory.
        let report = cleanup_dead_runs(parent.path()).unwrap();
        let second = ScratchDir::create(parent.path()).unwrap();

        assert_eq!(
            fs::read_to_string(target.join("fs.img")).unwrap(),
            "live image"
        );
        assert!(target.join("mnt").is_dir());
        assert_eq!(report.live, [live.path().to_path_buf()]);
        assert!(!dead.exists(), "the dead run's directory is still there");
        let canon = parent.path().canonicalize().unwrap();
        assert_eq!(report.removed, [canon.join("cairn-bench.1.dead")]);
        assert!(report.kept.is_empty(), "{report:?}");
        assert!(no_lock.join("mnt").is_dir(), "a run being made was touched");
        for f in &foreign {
            assert!(
                f.join("cairn-async/fs.img").is_file(),
                "{} touched",
                f.display()
            );
        }
        assert_ne!(second.path(), live.path());
        assert!(
            second
                .path()
                .starts_with(parent.path().canonicalize().unwrap())
        );

        // Each run removes its own directory at the end, and only its own.
        let (p1, p2) = (live.path().to_path_buf(), second.path().to_path_buf());
        second.remove().unwrap();
        assert!(!p2.exists() && p1.join("cairn-async/fs.img").is_file());
        drop(live);
        assert!(!p1.exists());
        assert!(foreign.iter().all(|f| f.is_dir()) && no_lock.is_dir());
    }

    /// The lock is the kernel's: a process holding it elsewhere keeps the directory alive, and
    /// it dies with the process, whatever kills it.
    #[test]
    fn a_lock_held_by_another_process_counts_until_it_exits() {
        let parent = tempfile::tempdir().unwrap();
        let d = dead_run(parent.path(), "cairn-bench.3.other");
        // --no-fork: the lock and the process that holds it are one, so killing it frees both.
        let mut holder = Command::new("flock")
            .args(["--exclusive", "--no-fork"])
            .arg(d.join(LOCK))
            .args(["sleep", "30"])
            .spawn()
            .unwrap();
        // flock(1) takes the lock before it execs sleep; wait until it has.
        let t0 = std::time::Instant::now();
        while matches!(probe(&d), Probe::Dead(_)) && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let r = cleanup_dead_runs(parent.path()).unwrap();
        let alive = d.join("cairn-async/fs.img").is_file();
        holder.kill().unwrap();
        holder.wait().unwrap();
        assert!(alive && r.removed.is_empty() && r.live.len() == 1, "{r:?}");
        let r = cleanup_dead_runs(parent.path()).unwrap();
        assert_eq!(r.removed.len(), 1, "{r:?}");
        assert!(!d.exists());
    }

    #[test]
    fn symlinks_named_like_runs_are_not_followed() {
        let parent = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let victim = dead_run(elsewhere.path(), "data");
        std::os::unix::fs::symlink(&victim, parent.path().join("cairn-bench.4.link")).unwrap();
        let r = cleanup_dead_runs(parent.path()).unwrap();
        assert!(r.removed.is_empty());
        assert!(victim.join("cairn-async/fs.img").is_file());
    }

    /// As root: a dead run's mount and loop device are released before its directory goes,
    /// while a live run's mount stays mounted.
    #[test]
    fn a_dead_runs_mounts_and_loop_devices_are_released_a_live_ones_are_not() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (mounts, loop devices); skipped");
            return;
        }
        let parent = tempfile::tempdir_in("/var/tmp").unwrap();
        let live = ScratchDir::create(parent.path()).unwrap();
        let live_mnt = live.path().join("t/mnt");
        fs::create_dir_all(&live_mnt).unwrap();
        mount_tmpfs(&live_mnt);
        fs::write(live_mnt.join("data"), "live").unwrap();

        let dead = dead_run(parent.path(), "cairn-bench.5.dead")
            .canonicalize()
            .unwrap();
        let dead_mnt = dead.join("cairn-async/mnt");
        mount_tmpfs(&dead_mnt);
        let img = dead.join("cairn-async/loop.img");
        fs::File::create(&img).unwrap().set_len(1 << 20).unwrap();
        let dev = sys::run(Command::new("losetup").args(["--find", "--show"]).arg(&img))
            .unwrap()
            .trim()
            .to_string();

        let r = cleanup_dead_runs(parent.path()).unwrap();
        let dev_left = sys::loop_devices_backed_under(&dead);
        let live_mounted = sys::mounted_fstype(&live_mnt).is_some();
        let live_data = fs::read_to_string(live_mnt.join("data")).ok();
        // Leave nothing behind whatever the outcome.
        let _ = Command::new("umount").arg(&live_mnt).status();
        if !dev_left.is_empty() {
            let _ = Command::new("losetup").arg("-d").arg(&dev).status();
        }
        assert!(live_mounted, "the live run's mount was unmounted");
        assert_eq!(live_data.as_deref(), Some("live"));
        assert!(dev_left.is_empty(), "loop device {dev} not detached");
        assert_eq!(r.removed, std::slice::from_ref(&dead), "{r:?}");
        assert!(!dead.exists());
        assert!(sys::mounted_fstype(&dead_mnt).is_none());
    }

    fn mount_tmpfs(at: &Path) {
        sys::run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=1m", "cairn-bench-test"])
                .arg(at),
        )
        .unwrap();
    }

    #[test]
    fn removal_refuses_to_cross_a_mount() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (a mount); skipped");
            return;
        }
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let mnt = d.path().join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        mount_tmpfs(&mnt);
        fs::write(mnt.join("keep"), "x").unwrap();
        let r = remove_tree(d.path());
        let kept = mnt.join("keep").is_file();
        let _ = Command::new("umount").arg(&mnt).status();
        assert!(r.is_err() && kept);
    }
}
