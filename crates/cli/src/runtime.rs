//! The runtime record of a mount: how `cairn umount` and `cairn stats` find the daemon.
//!
//! For a mount point `/mnt/data` the daemon keeps, in the runtime directory
//! (`/run/cairn` for root, `$XDG_RUNTIME_DIR/cairn` or `/tmp/cairn-UID` otherwise,
//! `$CAIRN_RUNTIME_DIR` if set):
//!
//! - `mnt-data.pid`: pid, image and mount point, one per line. The daemon holds an exclusive
//!   flock on it for its whole life, so "wait until the daemon is gone" is "take the lock"
//!   (no polling, no pid-reuse races). A second daemon for the same mount point is refused
//!   while the first serves it; once the first's mount is gone (a plain `umount` returns
//!   before the daemon's final flush has finished) the newcomer waits for it to exit, at
//!   most [`LEAVING_WAIT`], so `umount MNT && mount MNT` just works. `cairn fsck`, `cairn
//!   mkfs` and a mount elsewhere wait the same way for a daemon that still holds the image
//!   ([`wait_for_image`]).
//! - `mnt-data.sock`: the control socket (see `control`).
//! - `mnt-data.log`: the daemon's log (kept after exit).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::fcntl::{Flock, FlockArg};

pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CAIRN_RUNTIME_DIR") {
        return PathBuf::from(d);
    }
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return PathBuf::from("/run/cairn");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("cairn"),
        None => PathBuf::from(format!("/tmp/cairn-{uid}")),
    }
}

/// A file name for a mount point: `/` becomes `-`, bytes other than `[A-Za-z0-9._]` become
/// `%XX`; over-long names are cut and suffixed with a hash of the whole path.
pub fn escape(mountpoint: &Path) -> String {
    let bytes = mountpoint.as_os_str().as_bytes();
    let trimmed = bytes.strip_prefix(b"/").unwrap_or(bytes);
    let mut s = String::new();
    for &b in trimmed {
        match b {
            b'/' => s.push('-'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' => s.push(b as char),
            _ => s.push_str(&format!("%{b:02X}")),
        }
    }
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '-');
    }
    shorten(s, bytes, 200)
}

/// Cuts `s` to at most `max` bytes (at least 17), keeping it distinct by suffixing a hash of
/// the whole mount point path (FNV-1a: stable across builds, unlike std's hasher).
fn shorten(mut s: String, path: &[u8], max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let h = path.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    // The escaped name is ASCII, so any byte index is a char boundary.
    s.truncate(max.max(17) - 17);
    s.push_str(&format!("~{h:016x}"));
    s
}

/// A Unix socket's path must fit `sun_path`: 108 bytes with its terminating NUL.
const SOCKET_PATH_MAX: usize = 107;

/// The canonical form of a mount point as the daemon records it. A dead FUSE mount cannot be
/// stat'ed (ENOTCONN), so only its parent is resolved.
pub fn canonical_mountpoint(p: &Path) -> Result<PathBuf> {
    if let Ok(c) = p.canonicalize() {
        return Ok(c);
    }
    let abs = std::path::absolute(p).with_context(|| format!("bad path {}", p.display()))?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent
            .canonicalize()
            .unwrap_or(parent.to_path_buf())
            .join(name)),
        _ => Ok(abs),
    }
}

pub struct Paths {
    pub pid: PathBuf,
    pub sock: PathBuf,
    pub log: PathBuf,
}

pub fn paths(mountpoint: &Path) -> Paths {
    paths_in(&runtime_dir(), mountpoint)
}

fn paths_in(dir: &Path, mountpoint: &Path) -> Paths {
    // A deep runtime directory plus a long mount point would make the control socket's path
    // too long to bind (the daemon would run unreachable by `cairn stats`/`umount`): the name
    // is cut to fit, hash-suffixed, the same way by daemon and client.
    let room = SOCKET_PATH_MAX.saturating_sub(dir.as_os_str().len() + "/".len() + ".sock".len());
    let base = shorten(escape(mountpoint), mountpoint.as_os_str().as_bytes(), room);
    Paths {
        pid: dir.join(format!("{base}.pid")),
        sock: dir.join(format!("{base}.sock")),
        log: dir.join(format!("{base}.log")),
    }
}

/// The daemon's claim on a mount point, held until the process exits.
pub struct Record {
    lock: Flock<File>,
    pub paths: Paths,
}

/// Whether process `pid` is on its way out: gone, a zombie or dead, or with SIGKILL pending
/// for the whole thread group (its threads are still closing their files).
fn exiting(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the last ')' (the command name may itself contain one).
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    if matches!(state, Some('Z' | 'X' | 'x')) {
        return true;
    }
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("ShdPnd:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|mask| mask & SIGKILL_BIT != 0)
    })
}

/// How long a new daemon (or mkfs, fsck) waits for one that no longer serves a mount to
/// finish and exit. A plain umount(2) of a FUSE mount returns as soon as the kernel has
/// let go of it; the daemon then writes back what it holds (up to its whole cache) and
/// exits. `umount MNT && mount MNT` must just work, so the new claim waits for that final
/// flush instead of refusing; the bound keeps a daemon that never finishes (a lazily
/// detached mount with files still open, a hung device) from holding the caller forever.
pub const LEAVING_WAIT: Duration = Duration::from_secs(60);

/// What a mount point's record says about the daemon that holds it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RecordInfo {
    /// None while the daemon is still mounting (it writes the record once mounted).
    pub pid: Option<u32>,
    pub image: Option<PathBuf>,
    pub mountpoint: Option<PathBuf>,
    /// The daemon's FUSE connection: every mount point it serves — its own and bind mounts
    /// of it (a second `cairn mount` of the same image) — shows it in the mount table.
    pub conn: Option<Conn>,
}

/// A FUSE connection as the mount table shows it: its device number (`0:45`, the table's
/// third field) and its source (the fsname: the field after the type, as the table escapes
/// it). The kernel gives a device number to the next mount as soon as the last mount of a
/// connection is gone, while its daemon may still be flushing and its record still names
/// the number: the number alone would take another file system's new mount (another
/// image's daemon, a parallel test's) for the leaving daemon's, and a `cairn mount` of the
/// image right after a `umount` would ask the exiting daemon to serve a second mount point.
/// The source tells them apart: two live daemons never serve one image (the image lock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conn {
    pub devno: String,
    /// Empty in a record from before the source was kept: the number alone decides then.
    pub source: String,
}

impl Conn {
    /// Whether a mount table entry's connection is this record's.
    fn is(&self, seen: &Conn) -> bool {
        self.devno == seen.devno && (self.source.is_empty() || self.source == seen.source)
    }
}

impl RecordInfo {
    /// Parses the pid file's lines: pid, image, mount point, device number, source.
    pub fn parse(text: &str) -> RecordInfo {
        let mut lines = text.lines();
        let pid = lines.next().and_then(|l| l.trim().parse().ok());
        let path = |l: Option<&str>| l.filter(|l| !l.is_empty()).map(PathBuf::from);
        let image = path(lines.next());
        let mountpoint = path(lines.next());
        let conn = lines
            .next()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|devno| Conn {
                devno: devno.to_string(),
                source: lines.next().unwrap_or_default().to_string(),
            });
        RecordInfo {
            pid,
            image,
            mountpoint,
            conn,
        }
    }

    /// Reads the record in `f`.
    pub fn read(f: &mut File) -> RecordInfo {
        use std::io::Seek;
        let mut text = String::new();
        let _ = f.rewind();
        let _ = f.read_to_string(&mut text);
        RecordInfo::parse(&text)
    }
}

/// Where the daemon holding a record is in its life, as a newcomer sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Holder {
    /// Alive and its mount is in the mount table: a second daemon is refused at once.
    Serving(u32),
    /// Its mount is gone (unmounted) but it has not exited: its final flush is running.
    Leaving(u32),
    /// Killed, its last threads still closing their files.
    Exiting(u32),
    /// It has claimed the mount point and not yet written its record (still mounting).
    Starting,
}

impl Holder {
    /// Classifies the holder of a record for `mountpoint` (the record's own mount point
    /// when it names one).
    pub fn of(info: &RecordInfo, mountpoint: &Path) -> Holder {
        let Some(pid) = info.pid else {
            return Holder::Starting;
        };
        if exiting(pid) {
            return Holder::Exiting(pid);
        }
        let serving = match &info.conn {
            Some(c) => !fuse_mounts_of(c).is_empty(),
            None => fuse_mounted(info.mountpoint.as_deref().unwrap_or(mountpoint)),
        };
        if serving {
            Holder::Serving(pid)
        } else {
            Holder::Leaving(pid)
        }
    }
}

/// A FUSE mount in the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FuseMount {
    conn: Conn,
    mountpoint: PathBuf,
    /// The directory of the file system mounted here (`/` for its root, else a bind mount).
    root: String,
}

/// The FUSE mounts in this namespace, from /proc/self/mountinfo (a stat of a mount point
/// would wait on its daemon).
fn fuse_mount_table() -> Vec<FuseMount> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_fuse_mounts(&t))
        .unwrap_or_default()
}

/// The FUSE mounts of a mountinfo text (proc(5): `id parent devno root mountpoint ... -
/// type source superoptions`).
fn parse_fuse_mounts(info: &str) -> Vec<FuseMount> {
    use std::os::unix::ffi::OsStringExt;
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut r = right.split(' ');
            if !r.next()?.starts_with("fuse") {
                return None;
            }
            let source = r.next()?.to_string();
            let f: Vec<&str> = left.split(' ').collect();
            let mp = std::ffi::OsString::from_vec(cairn_blockdev::lock::unescape_bytes(f.get(4)?));
            Some(FuseMount {
                conn: Conn {
                    devno: f.get(2)?.to_string(),
                    source,
                },
                mountpoint: PathBuf::from(mp),
                root: f.get(3)?.to_string(),
            })
        })
        .collect()
}

/// Where the FUSE connection `conn` is mounted (its root first).
pub fn fuse_mounts_of(conn: &Conn) -> Vec<PathBuf> {
    mounts_in(fuse_mount_table(), conn)
}

fn mounts_in(table: Vec<FuseMount>, conn: &Conn) -> Vec<PathBuf> {
    let mut v: Vec<(bool, PathBuf)> = table
        .into_iter()
        .filter(|m| conn.is(&m.conn))
        .map(|m| (m.root != "/", m.mountpoint))
        .collect();
    v.sort();
    v.into_iter().map(|(_, mp)| mp).collect()
}

/// The connection of the FUSE mount at `mountpoint`, if one is there (the top one).
pub fn fuse_conn(mountpoint: &Path) -> Option<Conn> {
    fuse_mount_table()
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == mountpoint)
        .map(|m| m.conn)
}

/// Whether a FUSE file system is mounted at `mountpoint` in this mount namespace (read from
/// /proc/self/mountinfo: a stat of the mount point would wait on the daemon).
pub fn fuse_mounted(mountpoint: &Path) -> bool {
    fuse_mount_table()
        .iter()
        .any(|m| m.mountpoint == mountpoint)
}

/// A bounded poll: short pauses first (a flush of a small cache takes milliseconds), then
/// up to 50 ms.
struct Patience {
    deadline: Instant,
    pause: Duration,
    started: Instant,
    announced: bool,
}

impl Patience {
    fn new(limit: Duration) -> Patience {
        let now = Instant::now();
        Patience {
            deadline: now + limit,
            pause: Duration::from_millis(1),
            started: now,
            announced: false,
        }
    }

    /// Sleeps a little and returns true, or returns false once the deadline has passed.
    /// Says once, in the log, what it waits for when the wait gets noticeable.
    fn wait(&mut self, what: impl FnOnce() -> String) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        if !self.announced && self.started.elapsed() > Duration::from_secs(1) {
            log::info!("waiting for {}", what());
            self.announced = true;
        }
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(Duration::from_millis(50));
        true
    }
}

/// Waits (at most `deadline`) until process `pid` has no thread left: its image lock and
/// files go with its last thread, not with the pid-file lock its main thread drops.
fn wait_gone(pid: u32, patience: &mut Patience) {
    if pid == std::process::id() {
        return;
    }
    while cairn_blockdev::lock::pid_alive(pid) && patience.wait(|| format!("pid {pid} to exit")) {}
}

impl Record {
    /// Takes the pid-file lock for `mountpoint`. A live daemon serving it is refused at
    /// once; one that is still mounting, or was unmounted and is finishing its final flush,
    /// or was killed and is exiting, is waited for (at most [`LEAVING_WAIT`]).
    pub fn claim(mountpoint: &Path) -> Result<Record> {
        Record::claim_in(&runtime_dir(), mountpoint, LEAVING_WAIT)
    }

    fn claim_in(dir: &Path, mountpoint: &Path, limit: Duration) -> Result<Record> {
        let paths = paths_in(dir, mountpoint);
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut patience = Patience::new(limit);
        // The last holder seen alive while we waited: once its lock is free, its other
        // threads (and the image lock they share) may still be exiting.
        let mut seen: Option<u32> = None;
        loop {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&paths.pid)
                .with_context(|| format!("cannot create {}", paths.pid.display()))?;
            let lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(l) => l,
                Err((mut f, _)) => {
                    let mut text = String::new();
                    let _ = f.read_to_string(&mut text);
                    let info = RecordInfo::parse(&text);
                    seen = info.pid.or(seen);
                    let holder = Holder::of(&info, mountpoint);
                    let mp = mountpoint.display();
                    if let Holder::Serving(pid) = holder {
                        let here = info
                            .conn
                            .as_ref()
                            .is_none_or(|c| fuse_conn(mountpoint).is_some_and(|seen| c.is(&seen)));
                        if here {
                            bail!("{mp} is already served by a cairn daemon (pid {pid})");
                        }
                        let elsewhere = info.conn.as_ref().map(fuse_mounts_of).unwrap_or_default();
                        bail!(
                            "the cairn daemon (pid {pid}) that was mounted on {mp} still serves \
                             its file system at {}: unmount that first",
                            elsewhere
                                .iter()
                                .map(|p| p.display().to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                    if patience.wait(|| format!("the cairn daemon of {mp} ({holder:?})")) {
                        continue;
                    }
                    let secs = limit.as_secs();
                    match holder {
                        Holder::Leaving(pid) => bail!(
                            "{mp} was unmounted but its cairn daemon (pid {pid}) is still \
                             writing back after {secs} s; `cairn umount {mp}` waits until \
                             it has finished (its log: {})",
                            paths.log.display()
                        ),
                        Holder::Exiting(pid) => {
                            bail!(
                                "the killed cairn daemon of {mp} (pid {pid}) has not exited after {secs} s"
                            )
                        }
                        _ => bail!("{mp} is being mounted by another cairn daemon"),
                    }
                }
            };
            // A daemon that just exited removes its pid file while still holding the lock;
            // if we locked that unlinked file, start over with the new one.
            let same = std::fs::metadata(&paths.pid)
                .is_ok_and(|m| m.ino() == lock.metadata().map(|l| l.ino()).unwrap_or(0));
            if same {
                if let Some(pid) = seen {
                    wait_gone(pid, &mut patience);
                }
                lock.set_len(0)?;
                return Ok(Record { lock, paths });
            }
        }
    }

    /// Records who serves the mount point, once mounted (see [`RecordInfo`]).
    pub fn write_info(&mut self, image: &Path, mountpoint: &Path) -> Result<()> {
        let conn = fuse_conn(mountpoint).unwrap_or_default();
        let text = format!(
            "{}\n{}\n{}\n{}\n{}\n",
            std::process::id(),
            image.display(),
            mountpoint.display(),
            conn.devno,
            conn.source
        );
        self.lock.set_len(0)?;
        (&*self.lock).write_all(text.as_bytes())?;
        Ok(())
    }

    /// Removes the pid file and the socket (the lock goes with the process).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.paths.sock);
        let _ = std::fs::remove_file(&self.paths.pid);
    }
}

/// A claim dropped without serving (a mount that failed) leaves no pid file or socket.
impl Drop for Record {
    fn drop(&mut self) {
        self.remove();
    }
}

/// How many daemon logs the runtime directory keeps: those of live daemons plus this many
/// of the most recent others.
pub const KEEP_LOGS: usize = 8;

/// Deletes the logs of all but the `keep` most recently written finished mounts in `dir`
/// (a log whose pid file still exists belongs to a live daemon and is kept).
pub fn prune_logs(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut finished: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter(|p| !p.with_extension("pid").exists())
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    finished.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, p) in finished.into_iter().skip(keep) {
        let _ = std::fs::remove_file(p);
    }
}

/// Waits until no cairn daemon that has stopped serving `image` still holds it: after a
/// plain `umount MNT`, a mount of the same image elsewhere, `cairn fsck` or `cairn mkfs`
/// would otherwise find the image locked by the daemon's final flush. A daemon still
/// serving a mount of it is not waited for (the image lock then refuses, naming the
/// mount); one that has not finished within [`LEAVING_WAIT`] is an error naming it.
///
/// `exclusive`: the caller will want the image for writing; a reader only waits for a
/// writer.
pub fn wait_for_image(image: &Path, exclusive: bool) -> Result<()> {
    wait_for_image_in(&runtime_dir(), image, exclusive, LEAVING_WAIT)
}

fn wait_for_image_in(dir: &Path, image: &Path, exclusive: bool, limit: Duration) -> Result<()> {
    let Ok(want) = std::fs::metadata(image) else {
        return Ok(());
    };
    let same = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.dev() == want.dev() && m.ino() == want.ino())
    };
    let mut patience = Patience::new(limit);
    for (mut f, _, info) in records_in(dir) {
        let (Some(pid), Some(img), Some(mp)) = (info.pid, &info.image, &info.mountpoint) else {
            continue;
        };
        if !same(img) {
            continue;
        }
        loop {
            // A record whose lock we can take belongs to nobody (a daemon killed long ago).
            let held = match Flock::lock(f, FlockArg::LockSharedNonblock) {
                Ok(l) => {
                    f = l
                        .unlock()
                        .map_err(|(_, e)| anyhow::anyhow!("unlock: {e}"))?;
                    false
                }
                Err((back, _)) => {
                    f = back;
                    true
                }
            };
            if !held {
                wait_gone(pid, &mut patience);
                break;
            }
            if let Holder::Serving(_) = Holder::of(&info, mp) {
                break;
            }
            if !patience
                .wait(|| format!("the cairn daemon that served {} (pid {pid})", mp.display()))
            {
                bail!(
                    "{} is still held by the cairn daemon that served {} (pid {pid}), which \
                     is writing back after its unmount; `cairn umount {}` waits until it \
                     has finished",
                    image.display(),
                    mp.display(),
                    mp.display()
                );
            }
        }
    }
    // A daemon removes its record as it leaves but holds the image until its last thread
    // has exited; a check, or a mount still starting, holds it without a mount too. Wait
    // for such a holder; one that serves a mount is left to the image lock's refusal.
    if let Ok(f) = File::open(image) {
        while let Some(h) = cairn_blockdev::lock::holder(&f) {
            let conflicts = exclusive || h.writer;
            if h.mountpoint.is_some() || h.pid == std::process::id() || !conflicts {
                break;
            }
            if !patience.wait(|| h.describe()) {
                bail!("{} is still held by {}", image.display(), h.describe());
            }
        }
    }
    Ok(())
}

/// The record of the daemon serving `mountpoint`: the one named after it, or — for a
/// second mount point of an image, a bind mount of the daemon's — the one whose FUSE
/// connection is mounted there. Returns the open pid file and the record's paths.
pub fn find_record(mountpoint: &Path) -> Option<(File, Paths)> {
    let own = paths(mountpoint);
    if let Ok(f) = File::open(&own.pid) {
        return Some((f, own));
    }
    let seen = fuse_conn(mountpoint)?;
    records_in(&runtime_dir())
        .into_iter()
        .find(|(_, _, info)| info.conn.as_ref().is_some_and(|c| c.is(&seen)))
        .and_then(|(f, _, info)| Some((f, paths(info.mountpoint.as_deref()?))))
}

/// The control socket of the daemon serving `mountpoint` (see [`find_record`]).
pub fn socket_for(mountpoint: &Path) -> PathBuf {
    find_record(mountpoint).map_or_else(|| paths(mountpoint).sock, |(_, p)| p.sock)
}

/// Every record in `dir`: the open pid file, its path and what it says.
fn records_in(dir: &Path) -> Vec<(File, PathBuf, RecordInfo)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pid"))
        .filter_map(|p| {
            let mut f = File::open(&p).ok()?;
            let info = RecordInfo::read(&mut f);
            Some((f, p, info))
        })
        .collect()
}

/// A live daemon serving `image` (a record naming the image whose connection is mounted).
pub fn serving(image: &Path) -> Option<RecordInfo> {
    let want = std::fs::metadata(image).ok()?;
    records_in(&runtime_dir())
        .into_iter()
        .map(|(_, _, info)| info)
        .find(|info| {
            info.image.as_deref().is_some_and(|i| {
                std::fs::metadata(i).is_ok_and(|m| m.dev() == want.dev() && m.ino() == want.ino())
            }) && info
                .mountpoint
                .as_deref()
                .is_some_and(|mp| matches!(Holder::of(info, mp), Holder::Serving(_)))
        })
}

/// Opens the pid file of the daemon serving `mountpoint`, if there is one.
pub fn open_record(mountpoint: &Path) -> Option<File> {
    find_record(mountpoint).map(|(f, _)| f)
}

/// Blocks until the daemon that owns this pid file has exited — unless it still serves its
/// file system at another mount point (a second mount point of the image), which an
/// unmount of one of them leaves alone.
pub fn wait_for_exit(mut f: File) -> Result<()> {
    let info = RecordInfo::read(&mut f);
    if let (Some(_), Some(mp)) = (&info.conn, &info.mountpoint)
        && let Holder::Serving(_) = Holder::of(&info, mp)
    {
        return Ok(());
    }
    let pid = info.pid;
    // The daemon holds the pid file's lock until its final flush is done. The flush of a
    // large cache to a slow device may take long, so there is no deadline here, but a
    // wait that goes on says what it waits for, where to look and how to leave it.
    let started = std::time::Instant::now();
    let mut told = false;
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match Flock::lock(f.try_clone()?, FlockArg::LockSharedNonblock) {
            Ok(_) => break,
            Err((_, nix::errno::Errno::EWOULDBLOCK | nix::errno::Errno::EINTR)) => {}
            Err((_, e)) => bail!("waiting for the daemon: {e}"),
        }
        if !told && started.elapsed() >= std::time::Duration::from_secs(10) {
            told = true;
            eprintln!(
                "cairn: waiting for the daemon{} to finish its final flush (its log tells \
                 how far it is; interrupting this wait leaves the daemon running)",
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            );
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
    // The lock is released when the exiting daemon's main thread closes the pid file; its
    // other threads (and the image lock held by the file table they share) may still be
    // exiting: wait until the last thread is gone, so "returned" means "the image is free".
    if let Some(pid) = pid.filter(|&p| p != std::process::id()) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while cairn_blockdev::lock::pid_alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_fit_sun_path_under_a_deep_runtime_directory() {
        let dir = Path::new("/tmp/cairn-test.89PTj9/run");
        let a = Path::new(
            "/var/tmp/cairn-bench-test.xbRkmu/cairn-bench.18017.01ec2fccf/cairn-async/mnt",
        );
        let b = Path::new(
            "/var/tmp/cairn-bench-test.xbRkmu/cairn-bench.18017.01ec2fccf/cairn-sync/mnt",
        );
        let (pa, pb) = (paths_in(dir, a), paths_in(dir, b));
        assert!(
            pa.sock.as_os_str().len() <= SOCKET_PATH_MAX,
            "{}",
            pa.sock.display()
        );
        assert_ne!(pa.sock, pb.sock);
        assert_eq!(pa.sock, paths_in(dir, a).sock);
        // Short paths keep their readable name.
        let short = paths_in(dir, Path::new("/mnt/data"));
        assert_eq!(short.sock, dir.join("mnt-data.sock"));
        // And the socket binds.
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("a".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let p = paths_in(&deep, a);
        std::os::unix::net::UnixListener::bind(&p.sock).unwrap();
    }

    #[test]
    fn escaping_is_flat_and_distinct() {
        assert_eq!(escape(Path::new("/mnt/data")), "mnt-data");
        assert_eq!(escape(Path::new("/")), "-");
        assert_eq!(escape(Path::new("/a b/é")), "a%20b-%C3%A9");
        assert_eq!(escape(Path::new("/.hidden")), "-.hidden");
        assert_ne!(escape(Path::new("/a-b")), escape(Path::new("/a/b")));
        let long = format!("/{}", "x".repeat(500));
        let e = escape(Path::new(&long));
        assert!(e.len() < 255);
        assert_ne!(e, escape(Path::new(&format!("{long}y"))));
    }

    #[test]
    fn only_a_dying_holder_is_waited_for() {
        assert!(
            !exiting(std::process::id()),
            "a live process is not exiting"
        );
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        assert!(!exiting(child.id()));
        child.kill().unwrap();
        // Until reaped, the killed child is a zombie (or still has SIGKILL pending).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !exiting(child.id()) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(exiting(child.id()), "a killed child counts as exiting");
        child.wait().unwrap();
        assert!(exiting(child.id()), "a reaped child is gone");
    }

    #[test]
    fn a_claim_on_a_holder_without_its_mount_waits_bounded_and_waiters_wake_on_release() {
        let dir = tempfile::tempdir().unwrap();
        // Not mounted: the holder counts as a daemon finishing its final flush.
        let mp = Path::new("/some/mount");
        let mut r = Record::claim_in(dir.path(), mp, LEAVING_WAIT).unwrap();
        r.write_info(Path::new("/img"), mp).unwrap();
        let t = Instant::now();
        let err = Record::claim_in(dir.path(), mp, Duration::from_millis(100))
            .err()
            .unwrap()
            .to_string();
        assert!(t.elapsed() >= Duration::from_millis(100), "it waited");
        assert!(
            err.contains(&format!("pid {}", std::process::id())) && err.contains("cairn umount"),
            "{err}"
        );
        let f = File::open(&r.paths.pid).unwrap();
        let text = std::fs::read_to_string(&r.paths.pid).unwrap();
        assert_eq!(
            text.lines().next(),
            Some(std::process::id().to_string().as_str())
        );
        let waiter = std::thread::spawn(move || wait_for_exit(f));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "waiting must block while the daemon holds the lock"
        );
        // A second claim started now gets the mount point once the holder lets go.
        let d = dir.path().to_path_buf();
        let claimer = std::thread::spawn(move || Record::claim_in(&d, mp, LEAVING_WAIT));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!claimer.is_finished(), "the claim waits for the holder");
        r.remove();
        drop(r);
        waiter.join().unwrap().unwrap();
        claimer.join().unwrap().unwrap();
    }

    #[test]
    fn records_and_holders_are_read() {
        let i = RecordInfo::parse("42\n/img/a b\n/mnt/x\n");
        assert_eq!(i.pid, Some(42));
        assert_eq!(i.image.as_deref(), Some(Path::new("/img/a b")));
        assert_eq!(i.mountpoint.as_deref(), Some(Path::new("/mnt/x")));
        assert_eq!(RecordInfo::parse(""), RecordInfo::default());
        assert_eq!(
            Holder::of(&RecordInfo::default(), Path::new("/m")),
            Holder::Starting
        );
        let me = std::process::id();
        let unmounted = RecordInfo::parse(&format!("{me}\n/img\n/no/such/mount\n"));
        assert_eq!(Holder::of(&unmounted, Path::new("/x")), Holder::Leaving(me));
        assert!(!fuse_mounted(Path::new("/")), "/ is not a FUSE mount");
    }

    /// The kernel gives a released FUSE device number to the next mount at once: a daemon
    /// still flushing after its unmount must not count as serving because another file
    /// system's new mount got its number (a `cairn mount` right after `umount` then asked
    /// the exiting daemon for a second mount point: "Broken pipe").
    #[test]
    fn a_reused_device_number_is_not_the_leaving_daemons_mount() {
        let table = parse_fuse_mounts(
            "36 25 0:55 / /mnt/b rw,relatime shared:1 - fuse /img/b rw,user_id=0,group_id=0\n\
             37 25 8:1 / /data rw - ext4 /dev/sda1 rw\n\
             38 25 0:55 /d /mnt/b\\040bind rw - fuse /img/b rw,user_id=0,group_id=0\n",
        );
        assert_eq!(table.len(), 2, "{table:?}");
        assert_eq!(table[1].mountpoint, Path::new("/mnt/b bind"));
        let leaving = RecordInfo::parse("42\n/img/a\n/mnt/a\n0:55\n/img/a\n")
            .conn
            .unwrap();
        assert!(
            mounts_in(table.clone(), &leaving).is_empty(),
            "another image's mount with the same device number"
        );
        let serving = RecordInfo::parse("43\n/img/b\n/mnt/b\n0:55\n/img/b\n")
            .conn
            .unwrap();
        assert_eq!(
            mounts_in(table.clone(), &serving),
            [Path::new("/mnt/b"), Path::new("/mnt/b bind")],
            "its own mount first, then its bind mount"
        );
        // A record from before the source was kept: the number alone.
        let old = RecordInfo::parse("44\n/img/b\n/mnt/b\n0:55\n")
            .conn
            .unwrap();
        assert_eq!(old.source, "");
        assert_eq!(mounts_in(table, &old).len(), 2);
    }

    #[test]
    fn fsck_and_mkfs_wait_for_the_daemon_that_held_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        std::fs::write(&img, b"x").unwrap();
        let run = dir.path().join("run");
        let mp = Path::new("/gone/mount");
        // Nobody: no wait.
        wait_for_image_in(&run, &img, true, Duration::from_secs(5)).unwrap();
        let mut r = Record::claim_in(&run, mp, LEAVING_WAIT).unwrap();
        r.write_info(&img, mp).unwrap();
        // Another image: no wait.
        let other = dir.path().join("other");
        std::fs::write(&other, b"y").unwrap();
        let t = Instant::now();
        wait_for_image_in(&run, &other, true, Duration::from_secs(5)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        // Held by a daemon whose mount is gone: bounded, then named.
        let e = wait_for_image_in(&run, &img, true, Duration::from_millis(100))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/gone/mount") && e.contains("still held"), "{e}");
        // Released while waited for: returns.
        let (r2, i2) = (run.clone(), img.clone());
        let w = std::thread::spawn(move || wait_for_image_in(&r2, &i2, true, LEAVING_WAIT));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!w.is_finished());
        drop(r);
        w.join().unwrap().unwrap();
    }

    #[test]
    fn a_dropped_claim_leaves_nothing_and_old_logs_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let r = Record::claim_in(dir.path(), Path::new("/m"), LEAVING_WAIT).unwrap();
        let pid = r.paths.pid.clone();
        assert!(pid.exists());
        drop(r);
        assert!(!pid.exists(), "a failed mount left its pid file");
        for i in 0..12 {
            let p = dir.path().join(format!("m{i}.log"));
            std::fs::write(&p, "x").unwrap();
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        // m0 is the oldest but belongs to a live daemon.
        std::fs::write(dir.path().join("m0.pid"), "1").unwrap();
        prune_logs(dir.path(), 3);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".log"))
            .collect();
        left.sort();
        assert_eq!(left, ["m0.log", "m10.log", "m11.log", "m9.log"]);
    }
}
