//! The FUSE requests, each a thin translation onto [`cairn_vfs::FileSystem`], written once for
//! both transports: the handlers take the request's decoded arguments and answer through the
//! transport-neutral traits of [`crate::reply`]. `dev.rs` feeds them from the binding's
//! /dev/fuse threads, `uring/` from the io_uring queues.
//!
//! Invariants this module keeps:
//! - The kernel's root inode is 1; the file system's is [`FileSystem::root_ino`] (2 for ffs,
//!   whose ino 1 is never handed out). `ino_in` and `ino_out` are the only places that map,
//!   so no other number leaks across.
//! - Every request gets exactly one reply. A panic in the file system is caught; the reply
//!   object it unwinds through answers EIO on drop, so the kernel never waits forever and the
//!   other threads keep serving.
//! - Work happens on the thread that received the request: no queue and no worker pool in
//!   between, because on this machine a FUSE round trip is dominated by cross-CPU wake-ups
//!   and every hand-off adds one.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use cairn_vfs::fileattr;
use cairn_vfs::{
    Access, Attr, Ctx, FileKind, FileSystem, FsError, Ino, KernelCachePolicy, RenameFlags, SetAttr,
};
use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};
use log::{debug, error, warn};
use parking_lot::Mutex;

use crate::FuseOptions;
use crate::counters::{Op, RequestCounts};
use crate::reply::{
    AttrReply, Backing, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply,
    IoctlReply, LseekReply, OpenReply, Reply, StatfsReply, StatxReply, WriteReply, XattrReply,
};

/// The kernel's fixed root inode number.
const FUSE_ROOT: u64 = 1;

/// How the final flush went; read by the server after the session ends.
pub(crate) type DestroyResult = Arc<Mutex<Option<Result<(), String>>>>;

/// What INIT settled, before any request is served (set once, read by every request).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Negotiated {
    /// The kernel's writeback cache is on (the policy, the options and the kernel agreed).
    pub(crate) writeback: bool,
    /// The kernel agreed to FUSE passthrough.
    pub(crate) passthrough: bool,
}

pub(crate) struct Adapter {
    pub(crate) fs: Arc<dyn FileSystem>,
    root: Ino,
    pub(crate) policy: KernelCachePolicy,
    pub(crate) counts: Arc<RequestCounts>,
    pub(crate) opts: FuseOptions,
    /// Set by INIT (over /dev/fuse, before any other request can arrive on either transport).
    negotiated: OnceLock<Negotiated>,
    /// Notifications to the kernel (FUSE_NOTIFY_*), set once the session exists.
    notifier: OnceLock<fuser::Notifier>,
    /// Regular-file opens per inode, and the backing file they share when passed through.
    /// The kernel insists that while one open of an inode is passed through, every open of
    /// it is, with the same backing file (otherwise EINVAL), and that a passthrough open
    /// not join cached opens (ETXTBSY): so the choice is made by an inode's first open and
    /// holds until its last release, which drops (unregisters) the backing id.
    opens: Mutex<HashMap<Ino, InodeOpens>>,
    /// The inodes whose attributes the kernel may hold with setuid or setgid (see
    /// [`SetidSeen`]).
    setid: SetidSeen,
    pub(crate) destroyed: DestroyResult,
}

/// The inodes the adapter last described to the kernel with setuid or setgid in their mode.
///
/// The kernel's cached attributes of an inode are the last ones a reply gave it, so an inode
/// outside this set cannot show a stale setid bit: a write or fallocate that clears the bits
/// in the file system needs an attribute invalidation only for the inodes in it. Kept from
/// the replies themselves (every attribute the adapter sends passes through
/// [`Adapter::attr_out`]), so the write path asks the file system nothing (a getattr per
/// write was a host `stat` per write in the umbrella layer). An inode is added whenever a
/// reply may carry the bits and removed only by a reply that was sent without them; `len`
/// lets the common case (no setid file ever seen) skip the lock.
#[derive(Default)]
struct SetidSeen {
    inos: Mutex<std::collections::HashSet<Ino>>,
    len: std::sync::atomic::AtomicUsize,
}

impl SetidSeen {
    fn note(&self, ino: Ino, perm: u16) {
        use std::sync::atomic::Ordering::Relaxed;
        let setid = u32::from(perm) & (libc::S_ISUID | libc::S_ISGID) != 0;
        if !setid && self.len.load(Relaxed) == 0 {
            return;
        }
        let mut inos = self.inos.lock();
        if setid {
            inos.insert(ino);
        } else {
            inos.remove(&ino);
        }
        self.len.store(inos.len(), Relaxed);
    }

    fn contains(&self, ino: Ino) -> bool {
        self.len.load(std::sync::atomic::Ordering::Relaxed) != 0 && self.inos.lock().contains(&ino)
    }
}

struct InodeOpens {
    count: u32,
    backing: Option<(Backing, bool)>,
}

/// How one open of a regular file is answered.
enum OpenMode<'a> {
    Plain,
    Passthrough(&'a Backing),
}

thread_local! {
    /// One read buffer per serving thread, reused so a 1 MiB read allocates nothing.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Whether this thread has asked for a call thread's scheduler slice yet.
    static CALL_SLICE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Gives the serving thread a call thread's scheduler slice (`cairn_vfs::sched`) as it
/// serves its first request, whichever transport made the thread (fuser's /dev/fuse
/// threads are not ours to start): a request woken while a background thread of the file
/// system (the LFS syncer) runs then preempts it at once instead of at the next tick.
fn call_thread() {
    CALL_SLICE.with(|asked| {
        if !asked.replace(true)
            && let Err(e) = cairn_vfs::sched::serve_calls()
        {
            debug!("a request thread keeps the default scheduler slice: {e}");
        }
    });
}

impl Adapter {
    pub(crate) fn new(
        fs: Arc<dyn FileSystem>,
        counts: Arc<RequestCounts>,
        opts: FuseOptions,
        destroyed: DestroyResult,
    ) -> Adapter {
        let root = fs.root_ino();
        let mut policy = fs.cache_policy();
        if !opts.default_permissions {
            // Without default_permissions the kernel asks nobody whether the caller may
            // search a directory when it walks a path through entries it has cached: every
            // permission check must reach the file system, so no entry (and no negative
            // entry) is cached and each component of a path is looked up by its caller.
            policy.entry_ttl = Duration::ZERO;
            policy.negative_ttl = Duration::ZERO;
        }
        Adapter {
            fs,
            root,
            policy,
            counts,
            opts,
            negotiated: OnceLock::new(),
            notifier: OnceLock::new(),
            opens: Mutex::new(HashMap::new()),
            setid: SetidSeen::default(),
            destroyed,
        }
    }

    pub(crate) fn set_negotiated(&self, n: Negotiated) {
        if self.negotiated.set(n).is_err() {
            warn!("a second INIT was ignored");
        }
    }

    fn negotiated(&self) -> Negotiated {
        self.negotiated.get().copied().unwrap_or_default()
    }

    fn writeback(&self) -> bool {
        self.negotiated().writeback
    }

    fn ino_in(&self, ino: u64) -> Ino {
        if ino == FUSE_ROOT { self.root } else { ino }
    }

    fn ino_out(&self, ino: Ino) -> INodeNo {
        if ino == self.root {
            INodeNo(FUSE_ROOT)
        } else {
            INodeNo(ino)
        }
    }

    /// The attributes of a reply, noted as sent (see [`SetidSeen`]).
    fn attr_out(&self, a: &Attr) -> FileAttr {
        self.setid.note(a.ino, a.perm);
        self.attr_fuse(a)
    }

    /// The attributes in the kernel's form, not noted as sent (for an entry the reply may not
    /// take: readdirplus notes it once it is added).
    fn attr_fuse(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: self.ino_out(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            crtime: a.crtime,
            kind: kind_out(a.kind),
            perm: a.perm & 0o7777,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: a.blksize,
            flags: a.flags,
        }
    }

    /// The TTL for replies that carry entry and attributes under one timeout (create,
    /// readdirplus): the shorter of the two, so neither is trusted longer than allowed.
    fn combined_ttl(&self) -> Duration {
        self.policy.entry_ttl.min(self.policy.attr_ttl)
    }

    /// Counts the request, runs it, and turns a panic into EIO (the reply object dropped
    /// while unwinding sends it) instead of a dead mount.
    fn serve(&self, op: Op, f: impl FnOnce()) {
        call_thread();
        self.counts.request(op);
        if catch_unwind(AssertUnwindSafe(f)).is_err() {
            self.counts.error(op);
            error!(
                "the file system panicked serving {}; answered EIO",
                op.name()
            );
        }
    }

    fn err(&self, op: Op, e: FsError) -> Errno {
        let errno = e.errno().0;
        self.counts.answered(op, errno);
        if let FsError::Errno(_) = e {
            debug!("{}: {e}", op.name());
        } else {
            // Device errors and corruption are worth a line in the log; plain POSIX
            // failures (ENOENT, EEXIST...) are the normal life of a file system.
            warn!("{}: {e}", op.name());
        }
        Errno::from_i32(errno)
    }

    fn reply_entry(&self, op: Op, reply: impl EntryReply, r: cairn_vfs::Result<Attr>) {
        match r {
            Ok(a) => reply.entry(
                &self.policy.attr_ttl,
                &self.policy.entry_ttl,
                &self.attr_out(&a),
                Generation(a.generation),
            ),
            Err(e) => reply.error(self.err(op, e)),
        }
    }

    fn reply_empty(&self, op: Op, reply: impl EmptyReply, r: cairn_vfs::Result<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.err(op, e)),
        }
    }

    /// Open flags as the file system should see them. With the writeback cache the kernel
    /// owns the file size and computes O_APPEND offsets itself; a file system appending on
    /// its own would move the kernel's page-cache writes. The kernel may also read through
    /// a write-only handle to fill partial pages, so such handles are opened read-write
    /// when the caller may read (see `open`).
    fn fs_open_flags(&self, flags: i32) -> i32 {
        if self.writeback() {
            // O_APPEND stays for the file system to check (append-only files) but no longer
            // moves writes (`perm::O_OFFSETS_FROM_CALLER`).
            flags | cairn_vfs::perm::O_OFFSETS_FROM_CALLER
        } else {
            flags
        }
    }

    /// Whether INIT asks the kernel to check POSIX ACLs (FUSE_POSIX_ACL): when the file
    /// system keeps them and the kernel checks permissions at all. The kernel turns
    /// `default_permissions` on with it, so without `default_permissions` it is not asked
    /// for: ACLs then pass through to the file system, which checks them itself.
    pub(crate) fn posix_acl(&self) -> bool {
        self.opts.default_permissions && self.fs.posix_acls()
    }

    fn fopen_flags(&self) -> FopenFlags {
        // Nothing but this mount changes the file system, so the page cache stays valid
        // across opens as long as the kernel may cache attributes at all. Under
        // `strictatime` every open starts with an empty cache, so each reader's first read
        // reaches the file system, which alone keeps atime (a FUSE inode is S_NOATIME).
        if self.policy.attr_ttl.is_zero() || self.opts.atime == cairn_vfs::Atime::Strict {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        }
    }

    /// The open flags for a regular file opened with `flags`. When the file system is
    /// short of room (`FileSystem::room_is_short`), a handle that may write gets no page
    /// cache (FOPEN_DIRECT_IO): its writes reach the file system, and fail there with
    /// ENOSPC, at write(2); and the kernel refuses it a shared mapping (ENODEV at mmap)
    /// rather than accept pages through it that the file system could not store
    /// (docs/DESIGN.md, "A full disk").
    fn file_fopen_flags(&self, flags: i32) -> FopenFlags {
        if flags & libc::O_ACCMODE != libc::O_RDONLY && self.fs.room_is_short() {
            self.counts.direct_open();
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            self.fopen_flags()
        }
    }

    /// Counts one more open of a regular file and says whether the kernel should pass it
    /// through (see `opens`). `register` turns the file system's descriptor into a backing
    /// id; when it fails (no CAP_SYS_ADMIN, a backing file on a stacking file system) the
    /// open falls back to the ordinary path.
    fn open_mode<'m>(
        &self,
        opens: &'m mut HashMap<Ino, InodeOpens>,
        ino: Ino,
        fh: u64,
        flags: i32,
        register: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> io::Result<Backing>,
    ) -> cairn_vfs::Result<OpenMode<'m>> {
        let o = opens.entry(ino).or_insert(InodeOpens {
            count: 0,
            backing: None,
        });
        if o.count == 0
            && self.negotiated().passthrough
            && let Some(fd) = self.fs.backing_fd(ino, fh)
        {
            let acc = fcntl_accmode(&fd);
            let writable = acc == Some(libc::O_RDWR);
            if writable
                || (acc == Some(libc::O_RDONLY) && flags & libc::O_ACCMODE == libc::O_RDONLY)
            {
                match register(std::os::fd::AsFd::as_fd(&fd)) {
                    Ok(id) => o.backing = Some((id, writable)),
                    Err(e) => debug!("passthrough refused for inode {ino}: {e}"),
                }
            }
        }
        if let Some((_, writable)) = &o.backing
            && !writable
            && flags & libc::O_ACCMODE != libc::O_RDONLY
        {
            // The shared backing file is read-only (the host file system refused a
            // read-write descriptor) and this open cannot leave passthrough.
            return Err(FsError::Errno(cairn_vfs::Errno(libc::EROFS)));
        }
        o.count += 1;
        Ok(match &o.backing {
            Some((id, _)) => OpenMode::Passthrough(id),
            None => OpenMode::Plain,
        })
    }

    /// The file system's final flush, run once after the last request.
    pub(crate) fn destroy(&self) {
        let r = match catch_unwind(AssertUnwindSafe(|| self.fs.destroy())) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("final flush failed: {e}")),
            Err(_) => Err("final flush panicked".to_string()),
        };
        if let Err(e) = &r {
            error!("{e}");
        }
        *self.destroyed.lock() = Some(r);
    }
}

fn fcntl_accmode(fd: &std::os::fd::OwnedFd) -> Option<i32> {
    let fl = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).ok()?;
    Some(fl & libc::O_ACCMODE)
}

fn kind_out(k: FileKind) -> FileType {
    match k {
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::Directory => FileType::Directory,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::RegularFile => FileType::RegularFile,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Socket => FileType::Socket,
    }
}

/// The caller of a request, as the vfs wants it. Supplementary groups stay None: the vfs
/// reads /proc/PID/status only when a check cannot be decided on uid and primary gid.
pub(crate) fn caller(uid: u32, gid: u32, pid: u32) -> Ctx {
    Ctx {
        uid,
        gid,
        pid,
        groups: None,
    }
}

fn is_dot_or_dotdot(name: &OsStr) -> bool {
    name == "." || name == ".."
}

/// An attribute for readdirplus entries the file system left without one (`.` and `..`,
/// whose attributes the kernel ignores): only the number and kind are meaningful.
fn placeholder_attr(ino: Ino, kind: FileKind) -> Attr {
    Attr {
        ino,
        generation: 0,
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: 0,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The request handlers. Inode numbers arrive as the kernel sends them (the root is 1);
/// `c` is the caller where the vfs call needs one.
impl Adapter {
    pub(crate) fn lookup(&self, c: &Ctx, parent: u64, name: &OsStr, reply: impl EntryReply) {
        self.serve(Op::Lookup, || {
            if is_dot_or_dotdot(name) {
                return self.reply_entry(Op::Lookup, reply, self.lookup_by_number(c, parent, name));
            }
            match self.fs.lookup(c, self.ino_in(parent), name) {
                Err(e) if e.errno().0 == libc::ENOENT && !self.policy.negative_ttl.is_zero() => {
                    // A negative entry (node id 0 with a timeout) lets the kernel remember
                    // the miss: the next stat or O_EXCL create of this name skips us.
                    self.counts.answered(Op::Lookup, libc::ENOENT);
                    let mut neg = self.attr_out(&placeholder_attr(0, FileKind::RegularFile));
                    neg.ino = INodeNo(0);
                    reply.entry(
                        &Duration::ZERO,
                        &self.policy.negative_ttl,
                        &neg,
                        Generation(0),
                    );
                }
                r => self.reply_entry(Op::Lookup, reply, r),
            }
        });
    }

    /// The kernel's look-ups by node id alone (FUSE_EXPORT_SUPPORT): a path walk never
    /// sends `.` or `..` (the kernel resolves them itself), so these come from file handles
    /// (`open_by_handle_at`, NFS export) for an inode the kernel no longer has in memory.
    /// `.` of any node asks for that inode itself (`fuse_get_dentry`), `..` of a
    /// directory for its parent (`fuse_get_parent`, to reconnect a directory's handle to
    /// the tree). A number that names no live inode is ESTALE, never a negative entry
    /// (which would tell the kernel the *name* is absent), and never another inode: the
    /// kernel compares the answer's generation with the handle's.
    fn lookup_by_number(&self, c: &Ctx, node: u64, name: &OsStr) -> cairn_vfs::Result<Attr> {
        let ino = self.ino_in(node);
        if name == "." {
            // ESTALE for a gone number is `lookup_number`'s own contract.
            return self.fs.lookup_number(ino);
        }
        if !self.fs.stable_numbers() {
            return Err(FsError::Errno(cairn_vfs::Errno::ESTALE));
        }
        // `..` of a directory that is gone: ENOENT from the lookup, stale to the handle.
        self.fs.lookup(c, ino, name).map_err(|e| match e.errno() {
            cairn_vfs::Errno::ENOENT => FsError::Errno(cairn_vfs::Errno::ESTALE),
            _ => e,
        })
    }

    /// Forgets need no reply. Over /dev/fuse the binding splits BATCH_FORGET into one call
    /// per inode, so the `forget` count is inodes forgotten, not round trips.
    pub(crate) fn forget(&self, ino: u64, nlookup: u64) {
        self.serve(Op::Forget, || self.fs.forget(self.ino_in(ino), nlookup));
    }

    pub(crate) fn getattr(&self, ino: u64, reply: impl AttrReply) {
        self.serve(Op::Getattr, || match self.fs.getattr(self.ino_in(ino)) {
            Ok(a) => reply.attr(&self.policy.attr_ttl, &self.attr_out(&a)),
            Err(e) => reply.error(self.err(Op::Getattr, e)),
        });
    }

    /// FUSE_STATX: getattr's attributes, plus `stx_attributes` from the inode's flags
    /// ([`fileattr::statx_attributes`]), both from one call (`getattr_flags`). The kernel
    /// sends it instead of GETATTR when its cached attributes are stale and the caller asked
    /// for more than the basic stats (`fuse_update_get_attr`); its mask is fixed
    /// (`STATX_BASIC_STATS | STATX_BTIME`, whatever the caller asked) and `stx_attributes`
    /// has no mask bit, so the flags are always part of the answer. A file system that keeps
    /// no flags, or cannot say for this inode (a POSIX error: ENOTTY, EOPNOTSUPP...),
    /// answers with an empty mask, which tells the caller "unknown", never "not set"; a
    /// device error or corruption fails the request.
    pub(crate) fn statx(&self, c: &Ctx, ino: u64, reply: impl StatxReply) {
        self.serve(Op::Statx, || {
            let ino = self.ino_in(ino);
            let r = self.fs.getattr_flags(c, ino).and_then(|(a, flags)| {
                let attributes = match flags {
                    Ok(f) => fileattr::statx_attributes(f),
                    Err(FsError::Errno(e)) => {
                        debug!("statx: no inode flags for {ino} ({e})");
                        (0, 0)
                    }
                    Err(e) => return Err(e),
                };
                Ok((a, attributes))
            });
            match r {
                Ok((a, (set, mask))) => {
                    reply.statx(&self.policy.attr_ttl, &self.attr_out(&a), set, mask)
                }
                Err(e) => reply.error(self.err(Op::Statx, e)),
            }
        });
    }

    pub(crate) fn setattr(&self, c: &Ctx, ino: u64, set: SetAttr, reply: impl AttrReply) {
        self.serve(Op::Setattr, || {
            // Clamped here, for every transport and file system, as the kernel clamps to
            // a superblock's time range: a FUSE superblock's is unbounded.
            match self
                .fs
                .setattr(c, self.ino_in(ino), set.with_times_clamped())
            {
                Ok(a) => reply.attr(&self.policy.attr_ttl, &self.attr_out(&a)),
                Err(e) => reply.error(self.err(Op::Setattr, e)),
            }
        });
    }

    pub(crate) fn readlink(&self, ino: u64, reply: impl DataReply) {
        self.serve(Op::Readlink, || match self.fs.readlink(self.ino_in(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(self.err(Op::Readlink, e)),
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mknod(
        &self,
        c: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: impl EntryReply,
    ) {
        self.serve(Op::Mknod, || {
            let r = self
                .fs
                .mknod(c, self.ino_in(parent), name, mode, umask, rdev);
            self.reply_entry(Op::Mknod, reply, r);
        });
    }

    pub(crate) fn mkdir(
        &self,
        c: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: impl EntryReply,
    ) {
        self.serve(Op::Mkdir, || {
            let r = self.fs.mkdir(c, self.ino_in(parent), name, mode, umask);
            self.reply_entry(Op::Mkdir, reply, r);
        });
    }

    pub(crate) fn unlink(&self, c: &Ctx, parent: u64, name: &OsStr, reply: impl EmptyReply) {
        self.serve(Op::Unlink, || {
            let r = self.fs.unlink(c, self.ino_in(parent), name);
            self.reply_empty(Op::Unlink, reply, r);
        });
    }

    pub(crate) fn rmdir(&self, c: &Ctx, parent: u64, name: &OsStr, reply: impl EmptyReply) {
        self.serve(Op::Rmdir, || {
            let r = self.fs.rmdir(c, self.ino_in(parent), name);
            self.reply_empty(Op::Rmdir, reply, r);
        });
    }

    pub(crate) fn symlink(
        &self,
        c: &Ctx,
        parent: u64,
        link_name: &OsStr,
        target: &[u8],
        reply: impl EntryReply,
    ) {
        self.serve(Op::Symlink, || {
            let r = self.fs.symlink(c, self.ino_in(parent), link_name, target);
            self.reply_entry(Op::Symlink, reply, r);
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rename(
        &self,
        c: &Ctx,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: impl EmptyReply,
    ) {
        self.serve(Op::Rename, || {
            let r = RenameFlags::from_bits(flags).and_then(|f| {
                // A file system without whiteouts is never handed the flag (it would
                // otherwise be a plain rename that leaves nothing at the old name).
                if f.whiteout && !self.fs.supports_whiteout() {
                    return Err(FsError::Errno(cairn_vfs::Errno::EINVAL));
                }
                self.fs.rename(
                    c,
                    self.ino_in(parent),
                    name,
                    self.ino_in(newparent),
                    newname,
                    f,
                )
            });
            self.reply_empty(Op::Rename, reply, r);
        });
    }

    pub(crate) fn link(
        &self,
        c: &Ctx,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
        reply: impl EntryReply,
    ) {
        self.serve(Op::Link, || {
            let r = self
                .fs
                .link(c, self.ino_in(ino), self.ino_in(newparent), newname);
            self.reply_entry(Op::Link, reply, r);
        });
    }

    pub(crate) fn open(&self, c: &Ctx, ino: u64, flags: i32, reply: impl OpenReply) {
        self.serve(Op::Open, || {
            let ino = self.ino_in(ino);
            let flags = self.fs_open_flags(flags);
            let r = if self.writeback() && flags & libc::O_ACCMODE == libc::O_WRONLY {
                let rw = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
                match self.fs.open(c, ino, rw) {
                    Err(e) if e.errno().0 == libc::EACCES => self.fs.open(c, ino, flags),
                    r => r,
                }
            } else {
                self.fs.open(c, ino, flags)
            };
            let fh = match r {
                Ok(fh) => fh,
                Err(e) => return reply.error(self.err(Op::Open, e)),
            };
            let mut opens = self.opens.lock();
            let mode = self.open_mode(&mut opens, ino, fh, flags, |fd| reply.open_backing(fd));
            match mode {
                Ok(OpenMode::Plain) => reply.opened(FileHandle(fh), self.file_fopen_flags(flags)),
                Ok(OpenMode::Passthrough(id)) => {
                    reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), id)
                }
                Err(e) => {
                    drop(opens);
                    let _ = self.fs.release(ino, fh);
                    reply.error(self.err(Op::Open, e))
                }
            }
        });
    }

    pub(crate) fn read(&self, ino: u64, fh: u64, offset: u64, size: u32, reply: impl DataReply) {
        self.serve(Op::Read, || {
            READ_BUF.with_borrow_mut(|buf| {
                match self.fs.read(self.ino_in(ino), fh, offset, size, buf) {
                    Ok(()) => {
                        // The contract says at most `size`; trust but do not overrun the
                        // kernel's buffer if a file system gets it wrong.
                        let n = buf.len().min(size as usize);
                        self.counts.read_bytes(n);
                        reply.data(&buf[..n]);
                    }
                    Err(e) => reply.error(self.err(Op::Read, e)),
                }
                // Do not keep a huge buffer alive after an unusually large read.
                if buf.capacity() > 4 << 20 {
                    *buf = Vec::new();
                }
            });
        });
    }

    /// A WRITE. `cached`: the kernel's write-back of its page cache (FUSE_WRITE_CACHE),
    /// i.e. pages a program was already told were written, which the file system may
    /// store in the room it holds back for them; a failure of one is a loss the program
    /// learns of only from msync, fsync or close, so it is logged, naming the file.
    pub(crate) fn write(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        cached: bool,
        reply: impl WriteReply,
    ) {
        self.serve(Op::Write, || {
            let kernel_ino = ino;
            let ino = self.ino_in(ino);
            let setid = !cached && self.has_setid(ino);
            let r = if cached {
                self.fs.write_back(ino, fh, offset, data)
            } else {
                self.fs.write(ino, fh, offset, data)
            };
            match r {
                Ok(n) => {
                    self.counts.wrote_bytes(n as usize);
                    if setid {
                        self.attrs_changed(kernel_ino);
                    }
                    reply.written(n);
                }
                Err(e) => {
                    if cached {
                        self.counts.write_back_lost();
                        error!(
                            "inode {ino}: the kernel's write-back of {} bytes at offset {offset} \
                             failed ({e}); the data a program wrote through the kernel's page \
                             cache (a shared mapping, or write(2) with writeback_cache=yes) \
                             is lost, and msync, fsync and close of the file report it \
                             (find MOUNTPOINT -inum {ino} names it)",
                            data.len()
                        );
                    }
                    reply.error(self.err(Op::Write, e))
                }
            }
        });
    }

    pub(crate) fn flush(&self, ino: u64, fh: u64, reply: impl EmptyReply) {
        self.serve(Op::Flush, || {
            let r = self.fs.flush(self.ino_in(ino), fh);
            self.reply_empty(Op::Flush, reply, r);
        });
    }

    pub(crate) fn release(&self, ino: u64, fh: u64, reply: impl EmptyReply) {
        self.serve(Op::Release, || {
            let ino = self.ino_in(ino);
            let r = self.fs.release(ino, fh);
            {
                let mut opens = self.opens.lock();
                if let Some(o) = opens.get_mut(&ino) {
                    o.count = o.count.saturating_sub(1);
                    if o.count == 0 {
                        // Dropping the backing id unregisters it; opens still in the kernel
                        // hold their own reference to the backing file.
                        opens.remove(&ino);
                    }
                }
            }
            self.reply_empty(Op::Release, reply, r);
        });
    }

    pub(crate) fn fsync(&self, ino: u64, fh: u64, datasync: bool, reply: impl EmptyReply) {
        self.serve(Op::Fsync, || {
            let r = self.fs.fsync(self.ino_in(ino), fh, datasync);
            self.reply_empty(Op::Fsync, reply, r);
        });
    }

    pub(crate) fn opendir(&self, c: &Ctx, ino: u64, reply: impl OpenReply) {
        self.serve(Op::Opendir, || match self.fs.opendir(c, self.ino_in(ino)) {
            Ok(fh) => {
                // Let the kernel keep listings in its page cache: every change to a directory
                // goes through this mount, and the kernel drops the cached listing itself
                // when it creates, removes or renames in it (fuse_dir_changed).
                let flags = if self.policy.entry_ttl.is_zero() {
                    FopenFlags::empty()
                } else {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                };
                reply.opened(FileHandle(fh), flags);
            }
            Err(e) => reply.error(self.err(Op::Opendir, e)),
        });
    }

    pub(crate) fn readdir(&self, ino: u64, fh: u64, offset: u64, mut reply: impl DirReply) {
        self.serve(Op::Readdir, || {
            let mut emitted = 0usize;
            let r = self
                .fs
                .readdir(self.ino_in(ino), fh, offset, false, &mut |e| {
                    let full =
                        reply.add(self.ino_out(e.ino), e.next_offset, kind_out(e.kind), e.name);
                    emitted += usize::from(!full);
                    !full
                });
            match r {
                // Entries already placed are real; an error after them is reported by the
                // next call, which resumes after the last one delivered.
                Err(e) if emitted == 0 => reply.error(self.err(Op::Readdir, e)),
                _ => reply.ok(),
            }
        });
    }

    pub(crate) fn readdirplus(&self, ino: u64, fh: u64, offset: u64, mut reply: impl DirPlusReply) {
        self.serve(Op::Readdirplus, || {
            let ttl = self.combined_ttl();
            let mut emitted = 0usize;
            let r = self
                .fs
                .readdir(self.ino_in(ino), fh, offset, true, &mut |e| {
                    let attr = match e.attr {
                        Some(a) => a,
                        None => {
                            if !is_dot_or_dotdot(e.name) {
                                warn!("readdirplus entry {:?} came without attributes", e.name);
                            }
                            placeholder_attr(e.ino, e.kind)
                        }
                    };
                    // The kernel counts a lookup for every entry it links (all but `.` and
                    // `..`), matching the file system's count for entries it emitted with plus.
                    let full = reply.add(
                        self.ino_out(e.ino),
                        e.next_offset,
                        e.name,
                        &ttl,
                        &self.attr_fuse(&attr),
                        Generation(attr.generation),
                    );
                    if !full {
                        self.setid.note(attr.ino, attr.perm);
                    }
                    emitted += usize::from(!full);
                    !full
                });
            match r {
                Err(e) if emitted == 0 => reply.error(self.err(Op::Readdirplus, e)),
                _ => reply.ok(),
            }
        });
    }

    pub(crate) fn releasedir(&self, ino: u64, fh: u64, reply: impl EmptyReply) {
        self.serve(Op::Releasedir, || {
            let r = self.fs.releasedir(self.ino_in(ino), fh);
            self.reply_empty(Op::Releasedir, reply, r);
        });
    }

    /// fsync of a directory. Of the root it syncs the whole file system: sync(2) and
    /// syncfs(2) never reach a FUSE daemon on a kernel that sends FUSE_SYNCFS only to
    /// virtiofs, and `sync MNT` (coreutils fsyncs the files it is given) is the one way a
    /// user has to ask the kernel for a durable file system (docs/DESIGN.md, "Which sync").
    /// Durable is more than the directory's entries, never less.
    pub(crate) fn fsyncdir(&self, ino: u64, fh: u64, datasync: bool, reply: impl EmptyReply) {
        self.serve(Op::Fsyncdir, || {
            let r = if ino == FUSE_ROOT {
                self.fs.sync_all()
            } else {
                self.fs.fsyncdir(self.ino_in(ino), fh, datasync)
            };
            self.reply_empty(Op::Fsyncdir, reply, r);
        });
    }

    pub(crate) fn statfs(&self, reply: impl StatfsReply) {
        self.serve(Op::Statfs, || match self.fs.statfs() {
            Ok(s) => reply.statfs(&s),
            Err(e) => reply.error(self.err(Op::Statfs, e)),
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn setxattr(
        &self,
        c: &Ctx,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: impl EmptyReply,
    ) {
        self.serve(Op::Setxattr, || {
            let r = self.fs.setxattr(c, self.ino_in(ino), name, value, flags);
            self.reply_empty(Op::Setxattr, reply, r);
        });
    }

    pub(crate) fn getxattr(
        &self,
        c: &Ctx,
        ino: u64,
        name: &OsStr,
        size: u32,
        reply: impl XattrReply,
    ) {
        self.serve(Op::Getxattr, || {
            match self.fs.getxattr(c, self.ino_in(ino), name) {
                Ok(v) => reply_xattr(self, Op::Getxattr, reply, &v, size),
                Err(e) => reply.error(self.err(Op::Getxattr, e)),
            }
        });
    }

    pub(crate) fn listxattr(&self, c: &Ctx, ino: u64, size: u32, reply: impl XattrReply) {
        self.serve(Op::Listxattr, || {
            match self.fs.listxattr(c, self.ino_in(ino)) {
                Ok(v) => reply_xattr(self, Op::Listxattr, reply, &v, size),
                Err(e) => reply.error(self.err(Op::Listxattr, e)),
            }
        });
    }

    pub(crate) fn removexattr(&self, c: &Ctx, ino: u64, name: &OsStr, reply: impl EmptyReply) {
        self.serve(Op::Removexattr, || {
            let r = self.fs.removexattr(c, self.ino_in(ino), name);
            self.reply_empty(Op::Removexattr, reply, r);
        });
    }

    pub(crate) fn access(&self, c: &Ctx, ino: u64, mask: i32, reply: impl EmptyReply) {
        self.serve(Op::Access, || {
            let mask = Access((mask & (libc::R_OK | libc::W_OK | libc::X_OK)) as u32);
            let r = self.fs.access(c, self.ino_in(ino), mask);
            self.reply_empty(Op::Access, reply, r);
        });
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create(
        &self,
        c: &Ctx,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: impl CreateReply,
    ) {
        self.serve(Op::Create, || {
            let flags = self.creator_flags(flags);
            let r = self
                .fs
                .create(c, self.ino_in(parent), name, mode, umask, flags);
            self.reply_created(Op::Create, flags, r, reply);
        });
    }

    /// FUSE_TMPFILE (open(2) with O_TMPFILE): served as a create without a name. The
    /// reply shows the inode as it is, link count 0: the kernel takes the count it is
    /// given (fstat on the descriptor shows it) and counts nothing down itself.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tmpfile(
        &self,
        c: &Ctx,
        parent: u64,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: impl CreateReply,
    ) {
        self.serve(Op::Tmpfile, || {
            let flags = self.creator_flags(flags);
            let r = self.fs.tmpfile(c, self.ino_in(parent), mode, umask, flags);
            self.reply_created(Op::Tmpfile, flags, r, reply);
        });
    }

    /// The open flags a creating call hands the file system: the creator may always access
    /// the file it creates, whatever its mode; with the writeback cache a write-only one is
    /// opened for reading too, so the kernel can fill partial pages through this handle.
    fn creator_flags(&self, flags: i32) -> i32 {
        let flags = self.fs_open_flags(flags);
        if self.writeback() && flags & libc::O_ACCMODE == libc::O_WRONLY {
            (flags & !libc::O_ACCMODE) | libc::O_RDWR
        } else {
            flags
        }
    }

    /// The reply to a create or tmpfile: the new inode's entry and its open handle (plain
    /// or passed through); a handle that cannot be set up is released again.
    fn reply_created(
        &self,
        op: Op,
        flags: i32,
        r: Result<(cairn_vfs::Attr, u64), FsError>,
        reply: impl CreateReply,
    ) {
        {
            let (a, fh) = match r {
                Ok(r) => r,
                Err(e) => return reply.error(self.err(op, e)),
            };
            let mut opens = self.opens.lock();
            let mode = self.open_mode(&mut opens, a.ino, fh, flags, |fd| reply.open_backing(fd));
            let (ttl, attr, generation) = (
                self.combined_ttl(),
                self.attr_out(&a),
                Generation(a.generation),
            );
            match mode {
                Ok(OpenMode::Plain) => reply.created(
                    &ttl,
                    &attr,
                    generation,
                    FileHandle(fh),
                    self.file_fopen_flags(flags),
                ),
                Ok(OpenMode::Passthrough(id)) => reply.created_passthrough(
                    &ttl,
                    &attr,
                    generation,
                    FileHandle(fh),
                    FopenFlags::empty(),
                    id,
                ),
                Err(e) => {
                    drop(opens);
                    let _ = self.fs.release(a.ino, fh);
                    reply.error(self.err(op, e))
                }
            }
        }
    }

    /// FUSE_IOCTL. The kernel sends the file-attribute ioctls of chattr and lsattr here
    /// (`fs/fuse/ioctl.c`, `fuse_fileattr_get`/`_set`, on a file it opened read-only for
    /// the purpose) after its own checks; the file system checks again (a caller without
    /// the kernel, or one the kernel let through: the owner rule and CAP_LINUX_IMMUTABLE are
    /// the VFS's, but the kernel knows nothing of a FUSE inode's flags). Every other ioctl
    /// is ENOTTY, the answer to the client's isatty probe.
    pub(crate) fn ioctl(
        &self,
        c: &Ctx,
        ino: u64,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: impl IoctlReply,
    ) {
        let kernel_ino = ino;
        self.serve(Op::Ioctl, || {
            let ino = self.ino_in(ino);
            let which = FileAttrIoctl::of(cmd);
            let r = match which {
                None => Err(FsError::Errno(cairn_vfs::Errno(libc::ENOTTY))),
                Some(FileAttrIoctl::GetFlags) => self.fs.get_flags(c, ino).map(|f| {
                    let mut out = f.to_le_bytes().to_vec();
                    out.truncate(out_size as usize);
                    out
                }),
                Some(FileAttrIoctl::SetFlags) => match in_data.get(..4) {
                    Some(b) => {
                        let f = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        self.fs.set_flags(c, ino, f).map(|()| Vec::new())
                    }
                    None => Err(FsError::Errno(cairn_vfs::Errno::EINVAL)),
                },
                Some(FileAttrIoctl::FsGetXattr) => self.fs.get_flags(c, ino).map(|f| {
                    let mut out = vec![0u8; FSXATTR_LEN];
                    out[..4].copy_from_slice(&fileattr::to_xflags(f).to_le_bytes());
                    out.truncate(out_size as usize);
                    out
                }),
                Some(FileAttrIoctl::FsSetXattr) => match in_data.get(..FSXATTR_LEN) {
                    // Extent size, project id and CoW extent size hints are not kept.
                    Some(b) if b[4..20].iter().any(|&x| x != 0) => {
                        Err(FsError::Errno(cairn_vfs::Errno::EOPNOTSUPP))
                    }
                    Some(b) => fileattr::from_xflags(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .and_then(|f| self.fs.set_flags(c, ino, f))
                        .map(|()| Vec::new()),
                    None => Err(FsError::Errno(cairn_vfs::Errno::EINVAL)),
                },
            };
            match r {
                Ok(data) => {
                    // Before the reply: once the caller has its answer it may stat the
                    // file, and must not find the old attributes still cached.
                    if let Some(FileAttrIoctl::SetFlags | FileAttrIoctl::FsSetXattr) = which {
                        self.attrs_changed(kernel_ino);
                    }
                    reply.ioctl(0, &data);
                }
                Err(e) => reply.error(self.err(Op::Ioctl, e)),
            }
        });
    }

    /// Gives the adapter the session's notifier (before requests are served).
    pub(crate) fn set_notifier(&self, n: fuser::Notifier) {
        let _ = self.notifier.set(n);
    }

    /// Tells the kernel that the attributes it keeps for `kernel_ino` (a node id as the
    /// kernel knows it) are stale: FUSE_NOTIFY_INVAL_INODE with a negative offset, which
    /// drops the attributes only, no cached page. For a change the kernel does not know
    /// alters them (an inode flag set by ioctl changes the ctime), which `stat` would
    /// otherwise not show for attr_ttl (generic/277). Sent before the reply (sent after
    /// it, a `stat` right after the chattr raced the notification and now and then showed
    /// the old ctime): with a negative offset the kernel only drops the cached attributes,
    /// taking no lock the waiting caller holds. A failure is harmless (the inode may be
    /// gone from the kernel's cache already) and only logged.
    fn attrs_changed(&self, kernel_ino: u64) {
        if let Some(n) = self.notifier.get()
            && let Err(e) = n.inval_inode(fuser::INodeNo(kernel_ino), -1, 0)
        {
            log::debug!("attribute invalidation of {kernel_ino}: {e}");
        }
    }

    /// Whether the kernel may hold inode `ino` (the file system's number) with setuid or
    /// setgid: a write or fallocate by someone without CAP_FSETID then clears them in the file
    /// system (FUSE_HANDLE_KILLPRIV), a change of mode the kernel does not know of and `stat`
    /// would not show for attr_ttl (generic/355, 683-685): the attributes are invalidated
    /// before the reply, as after chattr. Answered from the replies sent ([`SetidSeen`]):
    /// files without the bits (nearly all) cost no call into the file system and no
    /// notification.
    fn has_setid(&self, ino: u64) -> bool {
        self.setid.contains(ino)
    }

    /// Requests the adapter answers without the file system: `op` with `errno`. Locks
    /// (no FUSE_POSIX_LOCKS at init, so the kernel handles them locally), bmap, poll and
    /// copy_file_range (ENOSYS makes the kernel fall back to read+write and stop asking)
    /// get ENOSYS; ioctl gets ENOTTY, the answer to the client's isatty probe.
    pub(crate) fn unsupported(&self, op: Op, errno: Errno, reply: impl Reply) {
        self.serve(op, || reply.error(errno));
    }

    pub(crate) fn fallocate(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
        reply: impl EmptyReply,
    ) {
        self.serve(Op::Fallocate, || {
            let setid = self.has_setid(self.ino_in(ino));
            let r = self
                .fs
                .fallocate(self.ino_in(ino), fh, offset, length, mode);
            if setid && r.is_ok() {
                self.attrs_changed(ino);
            }
            self.reply_empty(Op::Fallocate, reply, r);
        });
    }

    pub(crate) fn lseek(
        &self,
        ino: u64,
        fh: u64,
        offset: i64,
        whence: i32,
        reply: impl LseekReply,
    ) {
        self.serve(Op::Lseek, || {
            let Ok(off) = u64::try_from(offset) else {
                self.counts.error(Op::Lseek);
                return reply.error(Errno::ENXIO);
            };
            match self.fs.lseek(self.ino_in(ino), fh, off, whence) {
                Ok(o) => match i64::try_from(o) {
                    Ok(o) => reply.offset(o),
                    Err(_) => reply
                        .error(self.err(Op::Lseek, FsError::Errno(cairn_vfs::Errno::EOVERFLOW))),
                },
                Err(e) => reply.error(self.err(Op::Lseek, e)),
            }
        });
    }
}

/// `struct fsxattr`: xflags, extent size, extents, project id, CoW extent size, 8 spare.
const FSXATTR_LEN: usize = 28;

/// The file-attribute ioctls, known by type and number whatever the size their command
/// encodes (FS_IOC_GETFLAGS is `_IOR('f', 1, long)`, but the kernel's fileattr path moves
/// an int, and 32-bit callers use FS_IOC32_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileAttrIoctl {
    GetFlags,
    SetFlags,
    FsGetXattr,
    FsSetXattr,
}

impl FileAttrIoctl {
    fn of(cmd: u32) -> Option<FileAttrIoctl> {
        // _IOC: direction in bits 30-31, size in 16-29, type in 8-15, number in 0-7.
        let (dir, ty, nr) = (cmd >> 30, (cmd >> 8) & 0xff, cmd & 0xff);
        const READ: u32 = 2;
        const WRITE: u32 = 1;
        Some(match (dir, ty as u8, nr) {
            (READ, b'f', 1) => FileAttrIoctl::GetFlags,
            (WRITE, b'f', 2) => FileAttrIoctl::SetFlags,
            (READ, b'X', 31) => FileAttrIoctl::FsGetXattr,
            (WRITE, b'X', 32) => FileAttrIoctl::FsSetXattr,
            _ => return None,
        })
    }
}

/// getxattr/listxattr: a size-0 request is a probe for the length; a value that does not
/// fit the caller's buffer is ERANGE.
fn reply_xattr(a: &Adapter, op: Op, reply: impl XattrReply, value: &[u8], size: u32) {
    let Ok(len) = u32::try_from(value.len()) else {
        return reply.error(a.err(op, FsError::Errno(cairn_vfs::Errno::E2BIG)));
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        a.counts.error(op);
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}
