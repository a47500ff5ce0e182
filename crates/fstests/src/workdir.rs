//! A scratch directory for tests that drive the `cairn` command themselves (mount life
//! cycle, kill -9, full disks): its own runtime directory (so daemons, pid files and logs
//! stay apart from other tests'), the command run from inside it, and what a test asks of a
//! daemon. Dropping it unmounts what it left mounted under it.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use crate::{cairn_bin, is_mountpoint};

pub struct Workdir {
    dir: tempfile::TempDir,
}

impl Default for Workdir {
    fn default() -> Self {
        Self::new()
    }
}

impl Workdir {
    pub fn new() -> Workdir {
        Workdir {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// `dir/rel`.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Makes the directory `rel` (a mount point).
    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.p(rel);
        fs::create_dir_all(&p).expect("mkdir");
        p
    }

    /// The runtime directory of the daemons this work directory starts.
    pub fn runtime(&self) -> PathBuf {
        self.p("run")
    }

    /// Runs `cairn ARGS` here.
    pub fn cairn(&self, args: &[&str]) -> Output {
        Command::new(cairn_bin())
            .args(args)
            .env("CAIRN_RUNTIME_DIR", self.runtime())
            .current_dir(self.dir.path())
            .output()
            .expect("run cairn")
    }

    /// Runs `cairn ARGS` here and panics, with its output, unless it succeeds.
    pub fn ok(&self, args: &[&str]) -> Output {
        let o = self.cairn(args);
        assert!(
            o.status.success(),
            "cairn {args:?} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    /// `cairn stats --json MNT`.
    pub fn stats(&self, mnt: &str) -> serde_json::Value {
        let o = self.ok(&["stats", "--json", mnt]);
        serde_json::from_slice(&o.stdout).expect("stats JSON")
    }

    /// The pid of the daemon serving `mnt`.
    pub fn daemon(&self, mnt: &str) -> u32 {
        self.stats(mnt)["daemon"]["pid"]
            .as_u64()
            .expect("daemon pid") as u32
    }

    /// The daemon log of the mount at `mnt` (every log in the runtime directory, for a
    /// mount point whose log name is cut).
    pub fn logs(&self) -> String {
        let Ok(rd) = fs::read_dir(self.runtime()) else {
            return String::new();
        };
        rd.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .filter_map(|e| fs::read_to_string(e.path()).ok())
            .collect()
    }

    /// SIGKILL to the daemon of `mnt`; returns once its last thread has gone and the dead
    /// mount is detached.
    pub fn kill9(&self, mnt: &str) {
        let pid = self.daemon(mnt);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill -9");
        crate::wait_gone(pid, Duration::from_secs(20));
        nix::mount::umount2(&self.p(mnt), nix::mount::MntFlags::MNT_DETACH).expect("detach");
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let root = self.dir.path().to_path_buf();
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|p| p.starts_with(&root))
            .collect();
        under.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for p in under {
            if is_mountpoint(&p) {
                let rel = p
                    .strip_prefix(&root)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .into_owned();
                if !self.cairn(&["umount", &rel]).status.success() {
                    let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
                }
            }
        }
    }
}
