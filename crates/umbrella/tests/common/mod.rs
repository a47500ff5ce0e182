//! The test rig shared by the mount tests: branch directories under a temporary
//! directory, the layer mounted in-process through `cairn_fuse::spawn`.
#![allow(dead_code)]

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_umbrella::{Config, Umbrella};

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub fs: Option<Arc<Umbrella>>,
    pub mount: Option<cairn_fuse::MountHandle>,
    tmpfs: Vec<PathBuf>,
}

impl Rig {
    /// Branches `names` under a temp dir, config text with `{dir}` standing for it.
    pub fn new(names: &[&str], config: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        for n in names {
            fs::create_dir_all(dir.path().join(n)).unwrap();
        }
        fs::create_dir(dir.path().join("mnt")).unwrap();
        let mut r = Rig {
            dir,
            fs: None,
            mount: None,
            tmpfs: Vec::new(),
        };
        r.write_config(config);
        r.mount();
        r
    }

    /// Over branch directories the caller prepared in `dir`; `mounts` (file systems it
    /// mounted there) are unmounted with the rig.
    pub fn at(dir: tempfile::TempDir, mounts: Vec<PathBuf>, config: &str) -> Rig {
        fs::create_dir(dir.path().join("mnt")).unwrap();
        let mut r = Rig {
            dir,
            fs: None,
            mount: None,
            tmpfs: mounts,
        };
        r.write_config(config);
        r.mount();
        r
    }

    pub fn with_tmpfs(names: &[(&str, Option<&str>)], config: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let mut tmpfs = Vec::new();
        for (n, size) in names {
            let p = dir.path().join(n);
            fs::create_dir_all(&p).unwrap();
            if let Some(s) = size {
                let ok = Command::new("mount")
                    .args(["-t", "tmpfs", "-o", &format!("size={s}"), "tmpfs"])
                    .arg(&p)
                    .status()
                    .unwrap()
                    .success();
                assert!(ok, "mount tmpfs");
                tmpfs.push(p);
            }
        }
        fs::create_dir(dir.path().join("mnt")).unwrap();
        let mut r = Rig {
            dir,
            fs: None,
            mount: None,
            tmpfs,
        };
        r.write_config(config);
        r.mount();
        r
    }

    pub fn write_config(&self, text: &str) {
        fs::write(self.dir.path().join("u.toml"), text).unwrap();
    }

    pub fn mount(&mut self) {
        self.mount_with(true);
    }

    pub fn mount_with(&mut self, passthrough: bool) {
        self.mount_opts(passthrough, cairn_vfs::Atime::default());
    }

    /// Mounted with `passthrough` and the access-time rule `atime`.
    pub fn mount_opts(&mut self, passthrough: bool, atime: cairn_vfs::Atime) {
        let _ = env_logger::builder().is_test(true).try_init();
        let cfg = Config::load(&self.dir.path().join("u.toml")).unwrap();
        let fs = Arc::new(Umbrella::mount(&cfg).unwrap());
        let opts = cairn_fuse::FuseOptions {
            fsname: "umbrella-test".into(),
            subtype: "umbrella".into(),
            passthrough,
            atime,
            ..Default::default()
        };
        self.mount =
            Some(cairn_fuse::spawn(fs.clone(), &self.dir.path().join("mnt"), &opts).unwrap());
        self.fs = Some(fs);
    }

    pub fn unmount(&mut self) {
        if let Some(m) = self.mount.take() {
            m.unmount().unwrap();
        }
    }

    pub fn m(&self, rel: &str) -> PathBuf {
        self.dir.path().join("mnt").join(rel)
    }

    pub fn b(&self, branch: &str, rel: &str) -> PathBuf {
        self.dir.path().join(branch).join(rel)
    }

    pub fn on(&self, branch: &str, rel: &str) -> bool {
        fs::symlink_metadata(self.b(branch, rel)).is_ok()
    }

    /// Waits for the kernel's asynchronous RELEASE and the migration worker.
    pub fn settle(&self) {
        std::thread::sleep(Duration::from_millis(100));
        self.fs.as_ref().unwrap().quiesce();
    }

    pub fn fs(&self) -> &Umbrella {
        self.fs.as_ref().expect("mounted")
    }

    pub fn cmd(&self, c: &str, args: &[&str]) -> serde_json::Value {
        self.fs.as_ref().unwrap().command(c, args)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.unmount();
        for p in &self.tmpfs {
            let _ = Command::new("umount").arg("-l").arg(p).status();
        }
    }
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
