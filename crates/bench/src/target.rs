//! The file systems under test and their life cycle: a fresh image per workload, mkfs, mount,
//! "make the next reads cold", counters, unmount.
//!
//! Every target lives on an image file in the scratch directory on the local disk, so they all
//! sit on the same device: kernel ext4 reaches it through a loop device, fuse2fs and cairn
//! through the image file itself, mergerfs through one branch directory on a loop-mounted ext4.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::counters::{Counters, Source};
use crate::sys;

/// mergerfs options (recorded in each record's notes).
pub const MERGERFS_OPTS: &str = "minfreespace=16M";
const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);
/// A FUSE daemon writes its cache back after the kernel detached the mount; a cairn mount in
/// sync mode with a large cache may take a while, but not forever.
const EXIT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Kind {
    /// Kernel ext4 on a loop device; `sync` = mounted `-o sync`.
    Ext4 { sync: bool },
    /// fuse2fs (e2fsprogs' FUSE ext4) on an image file.
    Fuse2fs,
    /// mergerfs with one branch: a directory on a loop-mounted ext4.
    Mergerfs,
    /// cairn in one of its metadata-update modes, on an image file.
    Cairn { mode: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TargetSpec {
    pub name: String,
    #[serde(flatten)]
    pub kind: Kind,
}

impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl TargetSpec {
    pub fn parse(name: &str) -> Result<TargetSpec> {
        let kind = match name {
            "ext4" => Kind::Ext4 { sync: false },
            "ext4-sync" => Kind::Ext4 { sync: true },
            "fuse2fs" => Kind::Fuse2fs,
            "mergerfs" => Kind::Mergerfs,
            n => match n.strip_prefix("cairn-") {
                Some(mode) if !mode.is_empty() => Kind::Cairn {
                    mode: mode.to_string(),
                },
                _ => bail!(
                    "unknown target '{n}' (known: ext4, ext4-sync, fuse2fs, mergerfs, cairn-<mode>)"
                ),
            },
        };
        Ok(TargetSpec {
            name: name.to_string(),
            kind,
        })
    }

    /// Tools this target needs on PATH (cairn's path is checked separately).
    pub fn tools(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Ext4 { .. } => &["mkfs.ext4", "losetup", "mount", "umount"],
            Kind::Fuse2fs => &["mkfs.ext4", "fuse2fs", "umount"],
            Kind::Mergerfs => &["mkfs.ext4", "losetup", "mount", "umount", "mergerfs"],
            Kind::Cairn { .. } => &["umount"],
        }
    }
}

/// What every target needs to know about the run.
#[derive(Clone, Debug)]
pub struct Env {
    /// Directory on the local disk that holds images and mount points.
    pub scratch: PathBuf,
    pub image_size: u64,
    /// The `cairn` binary.
    pub cairn: String,
}

/// A mounted target, ready for a workload in [`Mounted::dir`]. Dropping it unmounts and
/// releases everything (best effort); [`Mounted::teardown`] does the same and reports errors.
pub struct Mounted {
    pub spec: TargetSpec,
    cairn: String,
    root: PathBuf,
    image: PathBuf,
    /// Where the target is mounted (the mergerfs mount for mergerfs).
    mnt: PathBuf,
    /// mergerfs: the ext4 mount holding the branch.
    lower_mnt: Option<PathBuf>,
    loopdev: Option<String>,
    daemon: Option<u32>,
    mounted: bool,
    /// Mount attempts' facts for the record (daemon CPU placement, options).
    pub notes: Vec<String>,
}

impl Mounted {
    /// Makes a fresh file system for `spec` under `env.scratch/<name>` and mounts it.
    pub fn setup(spec: &TargetSpec, env: &Env) -> Result<Mounted> {
        let root = env.scratch.join(&spec.name);
        if root.exists() {
            cleanup_stale(&root);
            fs::remove_dir_all(&root)
                .with_context(|| format!("removing old {}", root.display()))?;
        }
        let root = sys::ensure_dir(&root)?;
        let image = root.join("fs.img");
        let mnt = sys::ensure_dir(&root.join("mnt"))?;
        let mut m = Mounted {
            spec: spec.clone(),
            cairn: env.cairn.clone(),
            root: root.clone(),
            image: image.clone(),
            mnt,
            lower_mnt: None,
            loopdev: None,
            daemon: None,
            mounted: false,
            notes: Vec::new(),
        };
        match &spec.kind {
            Kind::Cairn { .. } => {
                sys::run(
                    Command::new(&env.cairn)
                        .arg("mkfs")
                        .arg(&image)
                        .arg("--size")
                        .arg(env.image_size.to_string()),
                )?;
            }
            _ => {
                make_sparse(&image, env.image_size)?;
                // lazy_itable_init=0: no background zeroing thread writing while we measure.
                sys::run(
                    Command::new("mkfs.ext4")
                        .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
                        .arg(&image),
                )?;
            }
        }
        if matches!(spec.kind, Kind::Ext4 { .. } | Kind::Mergerfs) {
            let dev = sys::run(
                Command::new("losetup")
                    .args(["--find", "--show"])
                    .arg(&image),
            )?
            .trim()
            .to_string();
            m.loopdev = Some(dev);
        }
        if matches!(spec.kind, Kind::Mergerfs) {
            m.lower_mnt = Some(sys::ensure_dir(&root.join("lower"))?);
        }
        m.notes.push(format!("options: {}", m.mount_options()));
        m.mount()?;
        if let Some(lower) = &m.lower_mnt {
            fs::create_dir_all(lower.join("branch"))?;
        }
        m.mount_upper()?;
        fs::create_dir_all(m.dir())?;
        Ok(m)
    }

    /// The directory workloads run in (a subdirectory, so lost+found is out of the way).
    pub fn dir(&self) -> PathBuf {
        self.mnt.join("bench")
    }

    /// Where this target's counters come from, if anywhere.
    pub fn counter_source(&self) -> Option<Source> {
        match &self.spec.kind {
            Kind::Cairn { .. } => Some(Source::Cairn {
                cairn: self.cairn.clone(),
                mnt: self.mnt.clone(),
            }),
            Kind::Ext4 { .. } | Kind::Mergerfs => {
                self.loopdev.clone().map(|dev| Source::Block { dev })
            }
            Kind::Fuse2fs => None,
        }
    }

    pub fn counters(&self) -> Result<Option<Counters>> {
        self.counter_source().map(|s| s.read()).transpose()
    }

    /// Makes the next reads come from the device: FUSE targets are unmounted (so the daemon
    /// forgets its cache and writes everything back), then every kernel cache is dropped
    /// (including the page cache over the image files), then the target is mounted again.
    pub fn make_cold(&mut self) -> Result<()> {
        // Only a FUSE daemon holds a cache that drop_caches cannot reach; for mergerfs that is the
        // mergerfs layer, while its ext4 branch is a kernel file system like the others.
        match self.spec.kind {
            Kind::Ext4 { .. } => sys::drop_caches(),
            Kind::Mergerfs => {
                self.unmount_upper()?;
                sys::drop_caches()?;
                self.mount_upper()
            }
            Kind::Fuse2fs | Kind::Cairn { .. } => {
                self.unmount()?;
                sys::drop_caches()?;
                self.mount()
            }
        }
    }

    /// How the target is mounted, for the record.
    fn mount_options(&self) -> String {
        match &self.spec.kind {
            Kind::Ext4 { sync: true } => "mount -o sync (loop device)".into(),
            Kind::Ext4 { sync: false } => "mount (defaults; loop device)".into(),
            Kind::Fuse2fs => "fuse2fs -o rw (image file)".into(),
            Kind::Mergerfs => {
                format!("mergerfs -o {MERGERFS_OPTS}, one branch on ext4 (loop device)")
            }
            Kind::Cairn { mode } => format!("cairn mount -o mode={mode} (image file)"),
        }
    }

    /// Mounts the bottom layer: ext4 for the kernel targets and mergerfs, the FUSE daemon for
    /// fuse2fs and cairn.
    fn mount(&mut self) -> Result<()> {
        match &self.spec.kind {
            Kind::Ext4 { sync } => {
                let mut c = Command::new("mount");
                if *sync {
                    c.args(["-o", "sync"]);
                }
                sys::run(
                    c.arg(self.loopdev.as_ref().expect("loop device set up"))
                        .arg(&self.mnt),
                )?;
            }
            Kind::Mergerfs => {
                let lower = self.lower_mnt.as_ref().expect("lower mount point set up");
                sys::run(
                    Command::new("mount")
                        .arg(self.loopdev.as_ref().expect("loop device set up"))
                        .arg(lower),
                )?;
            }
            Kind::Fuse2fs => {
                // fuse2fs forks into the background once the mount exists.
                sys::run(
                    Command::new("fuse2fs")
                        .arg(&self.image)
                        .arg(&self.mnt)
                        .args(["-o", "rw"]),
                )?;
                self.after_fuse_mount()?;
            }
            Kind::Cairn { mode } => {
                sys::run(
                    Command::new(&self.cairn)
                        .arg("mount")
                        .arg("-o")
                        .arg(format!("mode={mode}"))
                        .arg(&self.image)
                        .arg(&self.mnt),
                )?;
                self.after_fuse_mount()?;
            }
        }
        self.mounted = true;
        Ok(())
    }

    fn mount_upper(&mut self) -> Result<()> {
        if let (Kind::Mergerfs, Some(lower)) = (&self.spec.kind, &self.lower_mnt) {
            let branch = lower.join("branch");
            // Defaults, as a user would mount it, except minfreespace: its 4 GiB default makes
            // every create on a small branch fail with ENOSPC.
            sys::run(
                Command::new("mergerfs")
                    .args(["-o", MERGERFS_OPTS])
                    .arg(&branch)
                    .arg(&self.mnt),
            )?;
            self.after_fuse_mount()?;
        }
        Ok(())
    }

    fn after_fuse_mount(&mut self) -> Result<()> {
        sys::wait_mounted(&self.mnt, MOUNT_TIMEOUT)?;
        self.daemon = sys::find_daemon(&self.mnt);
        match self.daemon {
            Some(pid) => {
                let cpus = sys::cpus_allowed(pid).unwrap_or_else(|| "?".into());
                let note = format!("daemon pid {pid} cpus {cpus}");
                if !self
                    .notes
                    .iter()
                    .any(|n| n.ends_with(&format!("cpus {cpus}")))
                {
                    self.notes.push(note);
                }
            }
            None => self.notes.push("daemon not found".into()),
        }
        Ok(())
    }

    fn unmount_upper(&mut self) -> Result<()> {
        if matches!(self.spec.kind, Kind::Mergerfs) && sys::mounted_fstype(&self.mnt).is_some() {
            self.unmount_fuse(&self.mnt.clone())?;
        }
        Ok(())
    }

    fn unmount(&mut self) -> Result<()> {
        if !self.mounted {
            return Ok(());
        }
        match &self.spec.kind {
            Kind::Ext4 { .. } => {
                sys::run(Command::new("umount").arg(&self.mnt))?;
            }
            Kind::Mergerfs => {
                sys::run(
                    Command::new("umount").arg(self.lower_mnt.as_ref().expect("lower mount")),
                )?;
            }
            Kind::Fuse2fs => self.unmount_fuse(&self.mnt.clone())?,
            Kind::Cairn { .. } => {
                // `cairn umount` returns once the daemon has flushed and exited.
                sys::run(Command::new(&self.cairn).arg("umount").arg(&self.mnt))?;
                if let Some(pid) = self.daemon.take() {
                    sys::wait_pid_exit(pid, EXIT_TIMEOUT)?;
                }
            }
        }
        self.mounted = false;
        Ok(())
    }

    fn unmount_fuse(&mut self, mnt: &Path) -> Result<()> {
        let pid = self.daemon.take().or_else(|| sys::find_daemon(mnt));
        if sys::mounted_fstype(mnt).is_none() {
            // Nothing unmounted it but us: the daemon died (or unmounted itself) mid-run.
            bail!(
                "{} is no longer mounted: its FUSE daemon went away during the workload",
                self.spec.name
            );
        }
        sys::run(Command::new("umount").arg(mnt))?;
        if let Some(pid) = pid {
            sys::wait_pid_exit(pid, EXIT_TIMEOUT)?;
        }
        Ok(())
    }

    /// Unmounts, detaches the loop device and deletes the image.
    pub fn teardown(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        self.unmount_upper()?;
        self.unmount()?;
        if let Some(dev) = self.loopdev.take() {
            sys::run(Command::new("losetup").arg("-d").arg(&dev))?;
        }
        fs::remove_dir_all(&self.root)
            .with_context(|| format!("removing {}", self.root.display()))?;
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.root.exists()
            && let Err(e) = self.release()
        {
            eprintln!("cairn-bench: cleanup of {} failed: {e:#}", self.spec.name);
            cleanup_stale(&self.root);
        }
    }
}

fn make_sparse(image: &Path, size: u64) -> Result<()> {
    let f = fs::File::create(image).with_context(|| format!("creating {}", image.display()))?;
    f.set_len(size)
        .with_context(|| format!("sizing {}", image.display()))?;
    Ok(())
}

/// Forcibly releases whatever an interrupted earlier run left under `root`: mounts (lazy
/// unmount, topmost first) and loop devices backed by its image.
fn cleanup_stale(root: &Path) {
    for sub in ["mnt", "lower"] {
        let p = root.join(sub);
        while sys::mounted_fstype(&p).is_some() {
            if Command::new("umount")
                .arg("-l")
                .arg(&p)
                .status()
                .map(|s| !s.success())
                .unwrap_or(true)
            {
                break;
            }
        }
    }
    let img = root.join("fs.img");
    if let Ok(out) = sys::run(Command::new("losetup").arg("-j").arg(&img)) {
        for dev in out.lines().filter_map(|l| l.split(':').next()) {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names() {
        assert_eq!(
            TargetSpec::parse("ext4-sync").unwrap().kind,
            Kind::Ext4 { sync: true }
        );
        assert_eq!(
            TargetSpec::parse("cairn-async").unwrap().kind,
            Kind::Cairn {
                mode: "async".into()
            }
        );
        assert!(TargetSpec::parse("cairn-").is_err());
        assert!(TargetSpec::parse("btrfs").is_err());
    }
}
