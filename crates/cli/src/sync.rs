//! `cairn sync MNT`: make a mounted file system durable.
//!
//! sync(2) and syncfs(2) write the kernel's dirty pages of a FUSE mount back to the daemon
//! but never ask the daemon to make anything durable: the kernel sends FUSE_SYNCFS only to
//! virtiofs. So `sync` and `sync -f MNT` leave everything the daemon holds (its buffer
//! cache, a journal's uncommitted log, an LFS's unwritten segment) exactly where it was.
//! This command does both halves: syncfs(2) on the mount (the kernel's dirty pages, those
//! of shared mappings, reach the daemon) and then the control socket's `sync` (the daemon's
//! `FileSystem::sync_all`). When it returns 0, everything written before it started is on
//! the device. docs/DESIGN.md, "Which sync", lists what each way of asking does.

use std::os::fd::AsFd;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use crate::{control, runtime};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The mount point(s)
    #[arg(required = true)]
    pub mountpoints: Vec<PathBuf>,
}

pub fn run(args: Args) -> Result<i32> {
    for m in &args.mountpoints {
        sync_one(m)?;
    }
    Ok(0)
}

fn sync_one(m: &std::path::Path) -> Result<()> {
    let mp = runtime::canonical_mountpoint(m)?;
    let sock = runtime::socket_for(&mp);
    if !sock.exists() {
        bail!(
            "no cairn daemon serves {} (no control socket {})",
            m.display(),
            sock.display()
        );
    }
    // First the kernel's half: dirty pages (of shared mappings) go to the daemon.
    let dir = std::fs::File::open(&mp).with_context(|| format!("cannot open {}", m.display()))?;
    nix::unistd::syncfs(dir.as_fd()).with_context(|| format!("syncfs {}", m.display()))?;
    // Then the daemon's: everything it holds to the device.
    control::request(&sock, "sync").with_context(|| format!("cannot sync {}", m.display()))?;
    Ok(())
}
