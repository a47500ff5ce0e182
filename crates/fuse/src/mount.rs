//! Mounting and unmounting.
//!
//! As root we call mount(2) ourselves instead of letting fuser do it: that is what lets the
//! mount carry the type `fuse.cairn` and the image path as its source in
//! /proc/self/mountinfo (fuser's own mount always says `fuse`), and it avoids spawning
//! fusermount3. Without the privilege (EPERM) the server falls back to fuser's mount, which
//! goes through the setuid fusermount3.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use log::{info, warn};
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use parking_lot::Mutex;

use crate::FuseOptions;

/// Mounts a FUSE file system at `mountpoint` with mount(2); returns the /dev/fuse
/// connection, or `None` when we lack the privilege and fusermount3 must do it.
pub(crate) fn mount_direct(mountpoint: &Path, opts: &FuseOptions) -> io::Result<Option<File>> {
    let meta = std::fs::metadata(mountpoint)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("mount point {} is not a directory", mountpoint.display()),
        ));
    }
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open /dev/fuse: {e} (is the fuse module loaded?)"),
            )
        })?;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        dev.as_raw_fd(),
        meta.mode() & libc::S_IFMT,
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    if opts.default_permissions {
        data.push_str(",default_permissions");
    }
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = MsFlags::empty();
    flags.set(MsFlags::MS_NOSUID, !opts.suid);
    flags.set(MsFlags::MS_NODEV, !opts.dev);
    flags.set(MsFlags::MS_NOEXEC, !opts.exec);
    flags.set(MsFlags::MS_NOATIME, opts.noatime);
    flags.set(MsFlags::MS_RDONLY, opts.read_only);
    let fstype = if opts.subtype.is_empty() {
        "fuse".to_string()
    } else {
        format!("fuse.{}", opts.subtype)
    };
    let source = if opts.fsname.is_empty() {
        "cairn"
    } else {
        opts.fsname.as_str()
    };
    let r = nix::mount::mount(
        Some(source),
        mountpoint,
        Some(fstype.as_str()),
        flags,
        Some(data.as_str()),
    );
    match r {
        Ok(()) => Ok(Some(dev)),
        Err(Errno::EPERM) => Ok(None),
        Err(Errno::ENODEV) if fstype != "fuse" => {
            // A kernel without subtype support still mounts plain "fuse".
            nix::mount::mount(
                Some(source),
                mountpoint,
                Some("fuse"),
                flags,
                Some(data.as_str()),
            )
            .map_err(|e| mount_error(mountpoint, e))?;
            Ok(Some(dev))
        }
        Err(e) => Err(mount_error(mountpoint, e)),
    }
}

fn mount_error(mountpoint: &Path, e: Errno) -> io::Error {
    io::Error::new(
        io::Error::from(e).kind(),
        format!("mount({}) failed: {e}", mountpoint.display()),
    )
}

/// Is the kernel connection behind this /dev/fuse descriptor still alive? After the mount
/// is gone the device reports POLLERR; checking it keeps a late unmount from hitting an
/// unrelated file system mounted at the same place since.
pub(crate) fn connected(dev: &File) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [PollFd::new(dev.as_fd(), PollFlags::empty())];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => return true,
            Ok(_) => {
                return !fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLERR));
            }
            Err(Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}

/// The kernel's number for the FUSE connection mounted at `mountpoint` (its directory in
/// /sys/fs/fuse/connections): the minor device number the mount has in
/// /proc/self/mountinfo. Read there, not with stat(2), because a stat of the mount point
/// would wait for the very daemon that is asking.
pub(crate) fn connection_number(mountpoint: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    connection_in(&mi, mountpoint.as_os_str().as_bytes())
}

/// [`connection_number`] on a mountinfo text: the last (topmost) mount at `mountpoint`.
fn connection_in(mountinfo: &str, mountpoint: &[u8]) -> Option<u32> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let fstype = line.split_once(" - ")?.1.split(' ').next()?;
            (fstype.starts_with("fuse")
                && cairn_blockdev::lock::unescape_bytes(f.get(4)?) == mountpoint)
                .then(|| f.get(2)?.split_once(':')?.1.parse().ok())
                .flatten()
        })
        .next_back()
}

enum How {
    Direct {
        mountpoint: PathBuf,
        dev: File,
        /// /sys/fs/fuse/connections/N, for the message when the kernel keeps the file
        /// system after our unmount (None when mountinfo did not show it).
        conn: Option<u32>,
        done: AtomicBool,
    },
    Fuser(Mutex<fuser::SessionUnmounter>),
}

/// What the log says when the kernel keeps serving requests for a file system no longer
/// mounted in the daemon's namespace.
fn held_elsewhere(mountpoint: &Path, conn: Option<u32>) -> String {
    let abort = match conn {
        Some(n) => format!("`echo 1 > /sys/fs/fuse/connections/{n}/abort`"),
        None => "writing 1 to its `abort` file in /sys/fs/fuse/connections".to_string(),
    };
    format!(
        "{} is not mounted here, but the kernel still holds the file system (a copy of the mount in another mount namespace, or a detached mount with open files): serving until the last user lets go; to end it now, unmount it there, or abort the connection with {abort} (writes the kernel has not yet sent are then lost, and its users get ENOTCONN)",
        mountpoint.display()
    )
}

/// Unmounts the file system from any thread (a signal-handling thread, a control-socket
/// command, a test). Clone freely; only the first call does anything.
///
/// If the mount is busy it is detached lazily: it disappears from the namespace at once and
/// the session ends, flushing everything, when the last open file is closed.
#[derive(Clone)]
pub struct Unmounter {
    how: Arc<How>,
}

impl std::fmt::Debug for Unmounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.how {
            How::Direct { mountpoint, .. } => write!(f, "Unmounter({})", mountpoint.display()),
            How::Fuser(_) => write!(f, "Unmounter(fusermount)"),
        }
    }
}

impl Unmounter {
    pub(crate) fn direct(mountpoint: PathBuf, dev: File) -> Unmounter {
        Unmounter {
            how: Arc::new(How::Direct {
                conn: connection_number(&mountpoint),
                mountpoint,
                dev,
                done: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn fuser(u: fuser::SessionUnmounter) -> Unmounter {
        Unmounter {
            how: Arc::new(How::Fuser(Mutex::new(u))),
        }
    }

    /// Unmounts; returns once the kernel has let go of the mount point (the session then
    /// ends on its own and calls the file system's `destroy`).
    pub fn unmount(&self) -> io::Result<()> {
        match &*self.how {
            How::Fuser(u) => u.lock().unmount(),
            How::Direct {
                mountpoint,
                dev,
                conn,
                done,
            } => {
                if done.swap(true, Ordering::SeqCst) || !connected(dev) {
                    return Ok(());
                }
                match nix::mount::umount2(mountpoint, MntFlags::empty()) {
                    Ok(()) => {
                        info!("unmounted {}", mountpoint.display());
                        Ok(())
                    }
                    Err(Errno::EBUSY) => {
                        warn!(
                            "{} is busy; detaching it (the daemon exits when the last open file is closed)",
                            mountpoint.display()
                        );
                        nix::mount::umount2(mountpoint, MntFlags::MNT_DETACH)
                            .map_err(io::Error::from)
                    }
                    // Someone else unmounted it already: the session ends when the kernel
                    // lets go of the file system. If it still holds it, something outside
                    // this mount namespace does (a copy of the mount in another namespace,
                    // or a detached mount with files open), and serving goes on until it
                    // lets go: say so, and how to end it, rather than wait in silence.
                    Err(Errno::EINVAL) | Err(Errno::ENOENT) => {
                        if connected(dev) {
                            warn!("{}", held_elsewhere(mountpoint, *conn));
                        }
                        Ok(())
                    }
                    Err(e) => {
                        done.store(false, Ordering::SeqCst);
                        Err(io::Error::from(e))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_number_is_the_minor_of_the_topmost_fuse_mount_there() {
        let mi = "\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
91 22 0:57 / /mnt/a\\040b rw,nosuid shared:40 - fuse.cairn /img rw,user_id=0
92 22 0:58 / /mnt/c rw,nosuid shared:41 - fuse.cairn /img2 rw,user_id=0
93 92 0:61 / /mnt/c rw,nosuid shared:42 - fuse.cairn /img3 rw,user_id=0
94 22 0:70 / /mnt/t rw shared:43 - tmpfs none rw
";
        assert_eq!(connection_in(mi, b"/mnt/a b"), Some(57));
        assert_eq!(connection_in(mi, b"/mnt/c"), Some(61));
        // Not a FUSE mount, or not mounted: no connection to name.
        assert_eq!(connection_in(mi, b"/mnt/t"), None);
        assert_eq!(connection_in(mi, b"/mnt/x"), None);
        let m = held_elsewhere(Path::new("/mnt/c"), Some(61));
        assert!(m.contains("/sys/fs/fuse/connections/61/abort"), "{m}");
    }
}
