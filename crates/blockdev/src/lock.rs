//! Who may open an image: the lock every cairn program takes before it touches one.
//!
//! Two programs writing one image at once destroy it (two mounts each believing they own
//! the allocation bitmaps hand out the same blocks twice; a repairing fsck "fixes" a live
//! file system into a corrupt one). So every open of an image or device takes an advisory
//! `flock` on it for as long as the device is open:
//!
//! | opener | lock | refused while another holds |
//! |---|---|---|
//! | read-write mount, `fsck -y`, `mkfs` | exclusive | any lock |
//! | read-only mount, check-only `fsck`, `inspect` | shared | an exclusive lock |
//! | `fsck --force` (check only, findings may be stale) | none | nothing |
//!
//! A raw block device opened for writing is also opened `O_EXCL`, the kernel's exclusive
//! open: it fails with `EBUSY` while a kernel file system has the device mounted or another
//! program holds it exclusively, which a `flock` on the device node cannot see.
//!
//! The lock belongs to the open file description, so it lives exactly as long as the
//! [`FileDevice`](crate::FileDevice) (a daemon that dies for any reason releases it) and it
//! cannot be inherited by accident. When a lock is refused, [`holder`] names who holds it
//! from `/proc/locks` and the mount table, so the one-line message says which mount to
//! unmount.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// How an opener shares the image with other openers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    /// Nobody else may have it open (a read-write mount, repair, mkfs).
    Exclusive,
    /// Others may read it too, nobody may write it (a read-only mount, a check).
    Shared,
    /// No lock at all: a deliberate, read-only look at a live image (`fsck --force`).
    None,
}

impl Lock {
    /// The lock a device opened with this access needs.
    pub fn for_access(read_only: bool) -> Lock {
        if read_only {
            Lock::Shared
        } else {
            Lock::Exclusive
        }
    }
}

/// Takes `lock` on `file` (the image at `path`) without waiting. A refusal is an error of
/// kind [`io::ErrorKind::ResourceBusy`] whose message names the holder.
///
/// One case is waited out rather than refused: a holder that is this very process. A
/// process that spawns a child while another of its threads closes an image lends the
/// child its open file descriptions until the child's `exec` closes them, so a lock just
/// released can look held for a moment (`/proc/locks` names the lock's creator, us).
/// Such a lock is retried for up to [`SELF_HOLD_WAIT`]; a lock this process really holds
/// elsewhere is still refused after it.
pub(crate) fn acquire(file: &File, path: &Path, lock: Lock) -> io::Result<()> {
    let start = std::time::Instant::now();
    loop {
        let r = match lock {
            Lock::None => return Ok(()),
            Lock::Exclusive => file.try_lock(),
            Lock::Shared => file.try_lock_shared(),
        };
        match r {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => {
                let h = holder(file);
                let ours = h.as_ref().is_none_or(|h| h.pid == std::process::id());
                if ours && start.elapsed() < SELF_HOLD_WAIT {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    continue;
                }
                let who = h.map_or_else(|| "another program".to_string(), |h| h.describe());
                return Err(busy(path, &who));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// How long a lock that this process itself appears to hold is retried (see [`acquire`]).
pub const SELF_HOLD_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// The error for an image someone else holds: one line naming the holder.
pub(crate) fn busy(path: &Path, who: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!("{} is in use by {who}", path.display()),
    )
}

/// A process holding a lock on an image, and the mount it serves if it is a mount daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Whether it holds the image for writing (an exclusive lock).
    pub writer: bool,
    /// The process's command name (`/proc/PID/comm`).
    pub command: String,
    /// Where the image is mounted, when the mount table has a FUSE mount of it.
    pub mountpoint: Option<String>,
    /// Whether that mount is read-only.
    pub mount_read_only: bool,
}

impl Holder {
    /// "the cairn mount on /mnt/a (read-write, pid 1234)" or "fsck (pid 99)".
    pub fn describe(&self) -> String {
        match &self.mountpoint {
            Some(mp) => format!(
                "the {} mount on {mp} ({}, pid {})",
                self.command,
                if self.mount_read_only {
                    "read-only"
                } else {
                    "read-write"
                },
                self.pid
            ),
            None => format!(
                "{} (pid {}, {})",
                self.command,
                self.pid,
                if self.writer { "writing" } else { "reading" }
            ),
        }
    }
}

/// Who holds a lock on the file `file` is open on, if anyone other than this open file
/// description does. Reads `/proc/locks` (its `FLOCK` lines carry the locker's pid) and
/// `/proc/self/mountinfo` (a cairn daemon mounts with the image's path as its source).
pub fn holder(file: &File) -> Option<Holder> {
    let meta = file.metadata().ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let (pid, writer) = parse_locks(&locks, meta.dev(), meta.ino())?;
    let command = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "a process".into());
    let mut h = Holder {
        pid,
        writer,
        command,
        mountpoint: None,
        mount_read_only: false,
    };
    if let Ok(mi) = std::fs::read_to_string("/proc/self/mountinfo") {
        for (source, mp, ro) in fuse_mounts(&mi) {
            // A mount's source is the image path the daemon was given; compare by identity.
            if std::fs::metadata(&source)
                .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
            {
                h.mountpoint = Some(mp);
                h.mount_read_only = ro;
                break;
            }
        }
    }
    Some(h)
}

/// The first `FLOCK` entry of `/proc/locks` on (dev, ino): its pid and whether it is a write
/// lock. Lines look like `1: FLOCK  ADVISORY  WRITE 12904 fe:00:9978527 0 EOF`; blocked
/// waiters (`1: -> FLOCK ...`) are skipped.
pub(crate) fn parse_locks(text: &str, dev: u64, ino: u64) -> Option<(u32, bool)> {
    let major = libc::major(dev) as u64;
    let minor = libc::minor(dev) as u64;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" {
            continue;
        }
        let id: Vec<&str> = f[5].split(':').collect();
        if id.len() != 3 {
            continue;
        }
        let (Ok(ma), Ok(mi), Ok(i)) = (
            u64::from_str_radix(id[0], 16),
            u64::from_str_radix(id[1], 16),
            id[2].parse::<u64>(),
        ) else {
            continue;
        };
        if (ma, mi, i) == (major, minor, ino)
            && let Ok(pid) = f[4].parse::<u32>()
        {
            return Some((pid, f[3] == "WRITE"));
        }
    }
    None
}

/// FUSE mounts in a mountinfo text: (source, mount point, read-only).
fn fuse_mounts(mountinfo: &str) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 6 || r.len() < 2 || !r[0].starts_with("fuse") {
            continue;
        }
        let ro = l[5].split(',').any(|o| o == "ro");
        out.push((unescape(r[1]), unescape(l[4]), ro));
    }
    out
}

/// Undoes the octal escapes (`\040` for a space: mountinfo escapes space, tab, newline
/// and backslash as `\ooo`) of a field of a /proc mount table, as text.
pub fn unescape(s: &str) -> String {
    String::from_utf8_lossy(&unescape_bytes(s)).into_owned()
}

/// [`unescape`] as the bytes the kernel has (a mount point need not be UTF-8). A backslash
/// not followed by three octal digits of one byte (`\0`–`\377`) is kept as it is.
pub fn unescape_bytes(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b[i] == b'\\'
            && b.get(i + 1..i + 4).is_some_and(|d| {
                (b'0'..=b'3').contains(&d[0]) && d[1..].iter().all(|c| (b'0'..=b'7').contains(c))
            });
        if octal {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Whether `pid` still runs — or still holds its open files, and so its locks.
///
/// A zombie has exited (its status line says so while /proc/<pid> stays, as under a PID 1
/// that does not reap). But a multi-threaded process's leader turns zombie as soon as *its*
/// thread exits, while the other threads may still be exiting: the file table, and every
/// flock on it, is released only by the last one. So a zombie leader with other threads
/// left in /proc/<pid>/task still counts as alive.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let zombie = s
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('Z'));
    !zombie || std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() > 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    #[test]
    fn proc_locks_lines_are_parsed() {
        let text = "1: FLOCK  ADVISORY  WRITE 12904 fe:00:9978527 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 555 fe:00:9978527 0 EOF\n\
                    2: POSIX  ADVISORY  READ 77 08:01:42 0 EOF\n\
                    3: FLOCK  ADVISORY  READ 78 08:01:42 0 EOF\n";
        let dev = libc::makedev(0xfe, 0) as u64;
        assert_eq!(parse_locks(text, dev, 9978527), Some((12904, true)));
        let dev2 = libc::makedev(8, 1) as u64;
        assert_eq!(parse_locks(text, dev2, 42), Some((78, false)));
        assert_eq!(parse_locks(text, dev2, 43), None);
        assert_eq!(parse_locks("garbage\n\n1: FLOCK", dev, 1), None);
    }

    /// An escape at the very end is undone too, and a backslash that starts no escape of one
    /// byte (`\777` is none) is kept rather than overflowing.
    #[test]
    fn mount_fields_unescape_to_the_kernels_bytes() {
        assert_eq!(unescape_bytes("/a\\040b\\134c"), b"/a b\\c");
        assert_eq!(unescape_bytes("/a\\040"), b"/a ");
        assert_eq!(unescape_bytes("/a\\777\\04"), b"/a\\777\\04");
        assert_eq!(unescape("/x\\011y"), "/x\ty");
    }

    #[test]
    fn mountinfo_fuse_lines_are_parsed() {
        let mi = "36 35 98:0 / /mnt1 rw,noatime master:1 - ext3 /dev/root rw\n\
                  50 24 0:45 / /mnt/a\\040b rw,nosuid,nodev - fuse /img/d\\040x.img rw,user_id=0\n\
                  51 24 0:46 / /mnt/c ro,nosuid - fuse.cairn /img/c rw\n";
        let m = fuse_mounts(mi);
        assert_eq!(
            m,
            vec![
                ("/img/d x.img".to_string(), "/mnt/a b".to_string(), false),
                ("/img/c".to_string(), "/mnt/c".to_string(), true),
            ]
        );
    }

    #[test]
    fn exclusive_excludes_everyone_and_shared_excludes_writers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        let open = || OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let a = open();
        acquire(&a, &p, Lock::Exclusive).unwrap();
        let b = open();
        for l in [Lock::Exclusive, Lock::Shared] {
            let e = acquire(&b, &p, l).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("pid {}", std::process::id())),
                "{msg}"
            );
        }
        acquire(&b, &p, Lock::None).unwrap();
        drop(a);
        acquire(&b, &p, Lock::Shared).unwrap();
        let c = open();
        acquire(&c, &p, Lock::Shared).unwrap();
        let d = open();
        assert!(acquire(&d, &p, Lock::Exclusive).is_err());
        drop((b, c));
        acquire(&d, &p, Lock::Exclusive).unwrap();
    }

    /// A process whose leader thread has exited while another thread still runs is alive: it
    /// still holds its files and locks (`cairn umount` returned early on this and fsck found
    /// the image locked).
    #[test]
    fn a_zombie_leader_with_threads_left_is_alive() {
        const SCRIPT: &str = "import threading, time, ctypes\n\
            threading.Thread(target=lambda: time.sleep(0.8)).start()\n\
            ctypes.CDLL(None).pthread_exit(None)\n";
        let Ok(mut child) = std::process::Command::new("python3")
            .args(["-c", SCRIPT])
            .spawn()
        else {
            eprintln!("skipped: no python3 to make a process whose leader exits first");
            return;
        };
        let pid = child.id();
        let leader_exited = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
        };
        let t0 = std::time::Instant::now();
        while !leader_exited() && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(leader_exited(), "the leader thread should have exited");
        assert!(
            pid_alive(pid),
            "a thread is still running: the process holds its files"
        );
        // Unreaped, the process stays a zombie once its last thread is gone: not alive.
        let t0 = std::time::Instant::now();
        while pid_alive(pid) && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!pid_alive(pid), "every thread has exited");
        child.wait().unwrap();
    }
}
