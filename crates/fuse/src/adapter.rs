//! The FUSE callbacks, each a thin translation onto [`cairn_vfs::FileSystem`].
//!
//! Invariants this module keeps:
//! - The kernel's root inode is 1; the file system's is [`FileSystem::root_ino`] (2 for ffs,
//!   whose ino 1 is never handed out). `ino_in` and `ino_out` are the only places that map,
//!   so no other number leaks across.
//! - Every request gets exactly one reply. A panic in the file system is caught; the reply
//!   object it unwinds through answers EIO on drop, so the kernel never waits forever and the
//!   other threads keep serving.
//! - Work happens on the fuser thread that read the request: no queue and no worker pool in
//!   between, because on this machine a FUSE round trip is dominated by cross-CPU wake-ups
//!   and every hand-off adds one.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cairn_vfs::{
    Access, Attr, Ctx, FileKind, FileSystem, FsError, Ino, KernelCachePolicy, RenameFlags, SetAttr,
    SetTime,
};
use fuser::{
    AccessFlags, BackingId, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle,
    FileType, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use log::{debug, error, warn};
use parking_lot::Mutex;

use crate::counters::{Op, RequestCounts};
use crate::{FuseOptions, ReaddirPlus};

/// The kernel's fixed root inode number.
const FUSE_ROOT: u64 = 1;

/// How the final flush went; read by the server after the session ends.
pub(crate) type DestroyResult = Arc<Mutex<Option<Result<(), String>>>>;

pub(crate) struct Adapter {
    fs: Arc<dyn FileSystem>,
    root: Ino,
    policy: KernelCachePolicy,
    counts: Arc<RequestCounts>,
    opts: FuseOptions,
    /// Decided in `init` (before any request thread runs) from the policy, the options and
    /// what the kernel offers.
    writeback: bool,
    /// Decided in `init` like `writeback`: the kernel agreed to FUSE passthrough.
    passthrough: bool,
    /// Regular-file opens per inode, and the backing file they share when passed through.
    /// The kernel insists that while one open of an inode is passed through, every open of
    /// it is, with the same backing file (otherwise EINVAL), and that a passthrough open
    /// not join cached opens (ETXTBSY): so the choice is made by an inode's first open and
    /// holds until its last release, which drops (unregisters) the backing id.
    opens: Mutex<HashMap<Ino, InodeOpens>>,
    destroyed: DestroyResult,
}

struct InodeOpens {
    count: u32,
    backing: Option<(BackingId, bool)>,
}

/// How one open of a regular file is answered.
enum OpenMode<'a> {
    Plain,
    Passthrough(&'a BackingId),
}

thread_local! {
    /// One read buffer per serving thread, reused so a 1 MiB read allocates nothing.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Adapter {
    pub(crate) fn new(
        fs: Arc<dyn FileSystem>,
        counts: Arc<RequestCounts>,
        opts: FuseOptions,
        destroyed: DestroyResult,
    ) -> Adapter {
        let root = fs.root_ino();
        let policy = fs.cache_policy();
        Adapter {
            fs,
            root,
            policy,
            counts,
            opts,
            writeback: false,
            passthrough: false,
            opens: Mutex::new(HashMap::new()),
            destroyed,
        }
    }

    fn ino_in(&self, ino: INodeNo) -> Ino {
        if ino.0 == FUSE_ROOT { self.root } else { ino.0 }
    }

    fn ino_out(&self, ino: Ino) -> INodeNo {
        if ino == self.root {
            INodeNo(FUSE_ROOT)
        } else {
            INodeNo(ino)
        }
    }

    fn attr_out(&self, a: &Attr) -> FileAttr {
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

    fn reply_entry(&self, op: Op, reply: ReplyEntry, r: cairn_vfs::Result<Attr>) {
        match r {
            Ok(a) => reply.entry_with_ttls(
                &self.policy.attr_ttl,
                &self.policy.entry_ttl,
                &self.attr_out(&a),
                Generation(a.generation),
            ),
            Err(e) => reply.error(self.err(op, e)),
        }
    }

    fn reply_empty(&self, op: Op, reply: ReplyEmpty, r: cairn_vfs::Result<()>) {
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
        if self.writeback {
            flags & !libc::O_APPEND
        } else {
            flags
        }
    }

    fn fopen_flags(&self) -> FopenFlags {
        // Nothing but this mount changes the file system, so the page cache stays valid
        // across opens as long as the kernel may cache attributes at all.
        if self.policy.attr_ttl.is_zero() {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
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
        register: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> io::Result<BackingId>,
    ) -> cairn_vfs::Result<OpenMode<'m>> {
        let o = opens.entry(ino).or_insert(InodeOpens {
            count: 0,
            backing: None,
        });
        if o.count == 0
            && self.passthrough
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

fn ctx(req: &Request) -> Ctx {
    // Supplementary groups stay None: the vfs reads /proc/PID/status only when a check
    // cannot be decided on uid and primary gid.
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
        groups: None,
    }
}

fn time_in(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
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

#[allow(clippy::too_many_arguments)]
impl fuser::Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let mut want = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS;
        if self.opts.atomic_o_trunc {
            want |= InitFlags::FUSE_ATOMIC_O_TRUNC;
        }
        match self.opts.readdirplus {
            ReaddirPlus::Off => {}
            ReaddirPlus::Always => want |= InitFlags::FUSE_DO_READDIRPLUS,
            ReaddirPlus::Auto => {
                want |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO
            }
        }
        let writeback = self.policy.writeback_cache && self.opts.writeback_cache;
        if writeback {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        // Ask for each capability alone: a kernel lacking one must not cost us the others.
        for flag in want.iter() {
            if let Err(missing) = config.add_capabilities(flag) {
                debug!("kernel does not offer {missing:?}");
            }
        }
        self.writeback = writeback
            && config
                .capabilities()
                .contains(InitFlags::FUSE_WRITEBACK_CACHE);
        // Passthrough and the writeback cache exclude each other in the kernel. A stack
        // depth of 1 lets branches live on any non-stacking file system (and lets this
        // mount sit under one more stacking layer).
        if self.opts.passthrough && !self.writeback && config.set_max_stack_depth(1).is_ok() {
            self.passthrough = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok();
            if !self.passthrough {
                let _ = config.set_max_stack_depth(0);
            }
        }
        if let Err(nearest) = config.set_max_write(self.opts.max_write) {
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_readahead(self.opts.max_write) {
            let _ = config.set_max_readahead(nearest);
        }
        // Room for readahead and writeback of a few large files at once.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        debug!(
            "FUSE init: writeback cache {}, passthrough {}, max_write {}",
            self.writeback, self.passthrough, self.opts.max_write
        );
        Ok(())
    }

    fn destroy(&mut self) {
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

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.serve(Op::Lookup, || {
            match self.fs.lookup(&ctx(req), self.ino_in(parent), name) {
                Err(e) if e.errno().0 == libc::ENOENT && !self.policy.negative_ttl.is_zero() => {
                    // A negative entry (node id 0 with a timeout) lets the kernel remember
                    // the miss: the next stat or O_EXCL create of this name skips us.
                    self.counts.answered(Op::Lookup, libc::ENOENT);
                    let mut neg = self.attr_out(&placeholder_attr(0, FileKind::RegularFile));
                    neg.ino = INodeNo(0);
                    reply.entry_with_ttls(
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

    // The binding splits BATCH_FORGET into calls of this method (its batch type is private),
    // so the `forget` count is inodes forgotten, not round trips; forgets need no reply.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.serve(Op::Forget, || self.fs.forget(self.ino_in(ino), nlookup));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.serve(Op::Getattr, || match self.fs.getattr(self.ino_in(ino)) {
            Ok(a) => reply.attr(&self.policy.attr_ttl, &self.attr_out(&a)),
            Err(e) => reply.error(self.err(Op::Getattr, e)),
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.serve(Op::Setattr, || {
            let set = SetAttr {
                mode,
                uid,
                gid,
                size,
                atime: atime.map(time_in),
                mtime: mtime.map(time_in),
                ctime,
                fh: fh.map(|f| f.0),
            };
            match self.fs.setattr(&ctx(req), self.ino_in(ino), set) {
                Ok(a) => reply.attr(&self.policy.attr_ttl, &self.attr_out(&a)),
                Err(e) => reply.error(self.err(Op::Setattr, e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.serve(Op::Readlink, || match self.fs.readlink(self.ino_in(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(self.err(Op::Readlink, e)),
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.serve(Op::Mknod, || {
            let r = self
                .fs
                .mknod(&ctx(req), self.ino_in(parent), name, mode, umask, rdev);
            self.reply_entry(Op::Mknod, reply, r);
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.serve(Op::Mkdir, || {
            let r = self
                .fs
                .mkdir(&ctx(req), self.ino_in(parent), name, mode, umask);
            self.reply_entry(Op::Mkdir, reply, r);
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.serve(Op::Unlink, || {
            let r = self.fs.unlink(&ctx(req), self.ino_in(parent), name);
            self.reply_empty(Op::Unlink, reply, r);
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.serve(Op::Rmdir, || {
            let r = self.fs.rmdir(&ctx(req), self.ino_in(parent), name);
            self.reply_empty(Op::Rmdir, reply, r);
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.serve(Op::Symlink, || {
            let target = target.as_os_str().as_bytes();
            let r = self
                .fs
                .symlink(&ctx(req), self.ino_in(parent), link_name, target);
            self.reply_entry(Op::Symlink, reply, r);
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Rename, || {
            let r = RenameFlags::from_bits(flags.bits()).and_then(|f| {
                self.fs.rename(
                    &ctx(req),
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

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.serve(Op::Link, || {
            let r = self
                .fs
                .link(&ctx(req), self.ino_in(ino), self.ino_in(newparent), newname);
            self.reply_entry(Op::Link, reply, r);
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.serve(Op::Open, || {
            let c = ctx(req);
            let ino = self.ino_in(ino);
            let flags = self.fs_open_flags(flags.0);
            let r = if self.writeback && flags & libc::O_ACCMODE == libc::O_WRONLY {
                let rw = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
                match self.fs.open(&c, ino, rw) {
                    Err(e) if e.errno().0 == libc::EACCES => self.fs.open(&c, ino, flags),
                    r => r,
                }
            } else {
                self.fs.open(&c, ino, flags)
            };
            let fh = match r {
                Ok(fh) => fh,
                Err(e) => return reply.error(self.err(Op::Open, e)),
            };
            let mut opens = self.opens.lock();
            let mode = self.open_mode(&mut opens, ino, fh, flags, |fd| reply.open_backing(fd));
            match mode {
                Ok(OpenMode::Plain) => reply.opened(FileHandle(fh), self.fopen_flags()),
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

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.serve(Op::Read, || {
            READ_BUF.with_borrow_mut(|buf| {
                match self.fs.read(self.ino_in(ino), fh.0, offset, size, buf) {
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

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.serve(Op::Write, || {
            match self.fs.write(self.ino_in(ino), fh.0, offset, data) {
                Ok(n) => {
                    self.counts.wrote_bytes(n as usize);
                    reply.written(n);
                }
                Err(e) => reply.error(self.err(Op::Write, e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Flush, || {
            let r = self.fs.flush(self.ino_in(ino), fh.0);
            self.reply_empty(Op::Flush, reply, r);
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Release, || {
            let ino = self.ino_in(ino);
            let r = self.fs.release(ino, fh.0);
            {
                let mut opens = self.opens.lock();
                if let Some(o) = opens.get_mut(&ino) {
                    o.count = o.count.saturating_sub(1);
                    if o.count == 0 {
                        // Dropping the BackingId unregisters it; opens still in the kernel
                        // hold their own reference to the backing file.
                        opens.remove(&ino);
                    }
                }
            }
            self.reply_empty(Op::Release, reply, r);
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Fsync, || {
            let r = self.fs.fsync(self.ino_in(ino), fh.0, datasync);
            self.reply_empty(Op::Fsync, reply, r);
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.serve(Op::Opendir, || {
            match self.fs.opendir(&ctx(req), self.ino_in(ino)) {
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
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.serve(Op::Readdir, || {
            let mut emitted = 0usize;
            let r = self
                .fs
                .readdir(self.ino_in(ino), fh.0, offset, false, &mut |e| {
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

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.serve(Op::Readdirplus, || {
            let ttl = self.combined_ttl();
            let mut emitted = 0usize;
            let r = self
                .fs
                .readdir(self.ino_in(ino), fh.0, offset, true, &mut |e| {
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
                        &self.attr_out(&attr),
                        Generation(attr.generation),
                    );
                    emitted += usize::from(!full);
                    !full
                });
            match r {
                Err(e) if emitted == 0 => reply.error(self.err(Op::Readdirplus, e)),
                _ => reply.ok(),
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Releasedir, || {
            let r = self.fs.releasedir(self.ino_in(ino), fh.0);
            self.reply_empty(Op::Releasedir, reply, r);
        });
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Fsyncdir, || {
            let r = self.fs.fsyncdir(self.ino_in(ino), fh.0, datasync);
            self.reply_empty(Op::Fsyncdir, reply, r);
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.serve(Op::Statfs, || match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(self.err(Op::Statfs, e)),
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Setxattr, || {
            let r = self
                .fs
                .setxattr(&ctx(req), self.ino_in(ino), name, value, flags);
            self.reply_empty(Op::Setxattr, reply, r);
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.serve(Op::Getxattr, || {
            match self.fs.getxattr(&ctx(req), self.ino_in(ino), name) {
                Ok(v) => reply_xattr(self, Op::Getxattr, reply, &v, size),
                Err(e) => reply.error(self.err(Op::Getxattr, e)),
            }
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.serve(Op::Listxattr, || {
            match self.fs.listxattr(&ctx(req), self.ino_in(ino)) {
                Ok(v) => reply_xattr(self, Op::Listxattr, reply, &v, size),
                Err(e) => reply.error(self.err(Op::Listxattr, e)),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.serve(Op::Removexattr, || {
            let r = self.fs.removexattr(&ctx(req), self.ino_in(ino), name);
            self.reply_empty(Op::Removexattr, reply, r);
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.serve(Op::Access, || {
            let mask = Access((mask.bits() & (libc::R_OK | libc::W_OK | libc::X_OK)) as u32);
            let r = self.fs.access(&ctx(req), self.ino_in(ino), mask);
            self.reply_empty(Op::Access, reply, r);
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.serve(Op::Create, || {
            let mut flags = self.fs_open_flags(flags);
            if self.writeback && flags & libc::O_ACCMODE == libc::O_WRONLY {
                // The creator may always access the file it creates, whatever its mode;
                // read access lets the kernel fill partial pages through this handle.
                flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR;
            }
            let (a, fh) =
                match self
                    .fs
                    .create(&ctx(req), self.ino_in(parent), name, mode, umask, flags)
                {
                    Ok(r) => r,
                    Err(e) => return reply.error(self.err(Op::Create, e)),
                };
            let mut opens = self.opens.lock();
            let mode = self.open_mode(&mut opens, a.ino, fh, flags, |fd| reply.open_backing(fd));
            let (ttl, attr, generation) = (
                self.combined_ttl(),
                self.attr_out(&a),
                Generation(a.generation),
            );
            match mode {
                Ok(OpenMode::Plain) => {
                    reply.created(&ttl, &attr, generation, FileHandle(fh), self.fopen_flags())
                }
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
                    reply.error(self.err(Op::Create, e))
                }
            }
        });
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        // Not requested at init (no FUSE_POSIX_LOCKS), so the kernel handles locks locally.
        self.serve(Op::Getlk, || reply.error(Errno::ENOSYS));
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Setlk, || reply.error(Errno::ENOSYS));
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _bs: u32, _idx: u64, reply: fuser::ReplyBmap) {
        self.serve(Op::Bmap, || reply.error(Errno::ENOSYS));
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.serve(Op::Ioctl, || reply.error(Errno::ENOTTY));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.serve(Op::Fallocate, || {
            let r = self
                .fs
                .fallocate(self.ino_in(ino), fh.0, offset, length, mode);
            self.reply_empty(Op::Fallocate, reply, r);
        });
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.serve(Op::Lseek, || {
            let Ok(off) = u64::try_from(offset) else {
                self.counts.error(Op::Lseek);
                return reply.error(Errno::ENXIO);
            };
            match self.fs.lseek(self.ino_in(ino), fh.0, off, whence) {
                Ok(o) => match i64::try_from(o) {
                    Ok(o) => reply.offset(o),
                    Err(_) => reply
                        .error(self.err(Op::Lseek, FsError::Errno(cairn_vfs::Errno::EOVERFLOW))),
                },
                Err(e) => reply.error(self.err(Op::Lseek, e)),
            }
        });
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // ENOSYS makes the kernel fall back to read+write and stop asking.
        self.serve(Op::CopyFileRange, || reply.error(Errno::ENOSYS));
    }
}

/// getxattr/listxattr: a size-0 request is a probe for the length; a value that does not
/// fit the caller's buffer is ERANGE.
fn reply_xattr(a: &Adapter, op: Op, reply: ReplyXattr, value: &[u8], size: u32) {
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
