//! `cairn umount`: unmount, then wait until the daemon has flushed and exited, so the image
//! is complete when the command returns.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use nix::errno::Errno;
use nix::mount::MntFlags;

use crate::{control, runtime};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Detach now even if busy; the daemon flushes and exits when the last open file is
    /// closed (the command does not wait for that)
    #[arg(short = 'l', long)]
    pub lazy: bool,
    /// The mount point
    pub mountpoint: PathBuf,
}

/// The kernel sends FUSE RELEASE asynchronously and the closed file keeps the mount busy
/// until the daemon has answered, so a umount right after a close can see EBUSY for a
/// moment. Retry briefly before calling the mount busy.
fn umount_retrying_busy(mp: &std::path::Path, flags: MntFlags) -> nix::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut pause = Duration::from_millis(2);
    loop {
        match nix::mount::umount2(mp, flags) {
            Err(Errno::EBUSY) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

pub fn run(args: Args) -> Result<i32> {
    let mp = runtime::canonical_mountpoint(&args.mountpoint)?;
    let shown = args.mountpoint.display();
    // Open the record before unmounting: once the daemon exits it removes the file.
    let record = runtime::open_record(&mp);
    let flags = if args.lazy {
        MntFlags::MNT_DETACH
    } else {
        MntFlags::empty()
    };
    match umount_retrying_busy(&mp, flags) {
        Ok(()) => {}
        Err(Errno::EBUSY) => {
            bail!("cannot unmount {shown}: target is busy (close what uses it, or use --lazy)")
        }
        Err(Errno::EINVAL) if record.is_none() => bail!("{shown} is not mounted"),
        // Already gone from the namespace (lazily detached, or unmounted by someone
        // else): still wait for the daemon below.
        Err(Errno::EINVAL) => {}
        Err(Errno::EPERM) => {
            // Not root: ask the daemon, which mounted it, to unmount itself.
            if let Err(e) = control::request(&runtime::socket_for(&mp), "umount") {
                bail!("cannot unmount {shown}: permission denied ({e})");
            }
        }
        Err(e) => bail!("cannot unmount {shown}: {e}"),
    }
    if let Some(f) = record
        && !args.lazy
    {
        runtime::wait_for_exit(f)?;
    }
    Ok(0)
}
