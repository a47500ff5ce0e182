//! The /dev/fuse transport: the binding's session threads, each with its own cloned
//! descriptor, call these methods, which forward to the adapter's handlers with the
//! binding's reply objects. INIT always comes this way, and so do forgets and interrupts
//! when the io_uring transport serves everything else.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use cairn_vfs::{SetAttr, SetTime};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use log::debug;

use crate::adapter::{Adapter, Negotiated, caller};
use crate::counters::Op;
use crate::uring::{self, Handoff, Offer, Prepared};
use crate::{ReaddirPlus, Transport};

/// What the binding's session owns: the shared adapter and the place where INIT leaves the
/// io_uring rings for [`crate::Server::mount`].
pub(crate) struct DevFs {
    pub(crate) a: Arc<Adapter>,
    pub(crate) handoff: Arc<Handoff>,
}

fn ctx(req: &Request) -> cairn_vfs::Ctx {
    caller(req.uid(), req.gid(), req.pid())
}

fn time_in(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    }
}

impl DevFs {
    /// Counts a request that came over /dev/fuse and hands back the adapter.
    fn a(&self) -> &Adapter {
        self.a.counts.via_dev();
        &self.a
    }

    /// INIT's io_uring part: when the options want io_uring and the kernel offers it, make
    /// the rings now (so a failure can still leave the flag out of the answer) and ask for
    /// it. Returns whether it was asked for.
    fn offer_uring(&self, config: &mut KernelConfig, payload_len: usize) -> bool {
        if self.a.opts.transport == Transport::Dev {
            return false;
        }
        if !config
            .capabilities()
            .contains(InitFlags::FUSE_OVER_IO_URING)
        {
            self.handoff.set_offer(Offer::Refused(format!(
                "the kernel does not offer FUSE over io_uring; {} is {}",
                uring::ENABLE_PARAM,
                uring::enable_param()
            )));
            return false;
        }
        match Prepared::new(payload_len, self.a.opts.uring_depth) {
            Ok(p) => {
                if config
                    .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                    .is_err()
                {
                    return false;
                }
                self.handoff.set_offer(Offer::Prepared(p));
                true
            }
            Err(e) => {
                self.handoff
                    .set_offer(Offer::Refused(format!("cannot set up io_uring: {e}")));
                false
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
impl fuser::Filesystem for DevFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let a = &self.a;
        // The file system applies the umask itself (FUSE_DONT_MASK): it must not where a
        // default ACL is inherited (`posix_acl_create`).
        let mut want = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_DONT_MASK;
        if a.posix_acl() {
            want |= InitFlags::FUSE_POSIX_ACL;
        }
        if a.fs.kills_privileges() {
            // The file system clears setuid/setgid on a write or truncation by someone
            // without CAP_FSETID; the kernel sends no mode change as the writer for it.
            want |= InitFlags::FUSE_HANDLE_KILLPRIV;
            // The same promise in its second form (FUSE_WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID
            // and FUSE_OPEN_KILL_SUIDGID say when; cairn's own rule, `perm::handle_flags`,
            // already covers them), for what the kernel does with it: it marks the mount
            // SB_NOSEC, so once it has found a file without security xattrs (removing its
            // capabilities if it had them) it marks the inode S_NOSEC and stops asking for
            // `security.capability` before every write — one GETXATTR per file instead of
            // one per write(2). Setting a security xattr through the mount clears the mark,
            // so a file given capabilities loses them at its next change as before.
            want |= InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        }
        if a.fs.stable_numbers() {
            // File handles hold node ids, which are the file system's inode numbers: the
            // kernel may ask for one by number after forgetting it (`lookup_by_number`).
            want |= InitFlags::FUSE_EXPORT_SUPPORT;
        } else {
            // Numbers that live in memory only cannot back a handle: name_to_handle_at is
            // refused (EOPNOTSUPP) rather than give handles that go stale whenever the
            // kernel drops the inode, and that a remount could point at another file.
            want |= InitFlags::FUSE_NO_EXPORT_SUPPORT;
        }
        if a.opts.atomic_o_trunc {
            want |= InitFlags::FUSE_ATOMIC_O_TRUNC;
        }
        match a.opts.readdirplus {
            ReaddirPlus::Off => {}
            ReaddirPlus::Always => want |= InitFlags::FUSE_DO_READDIRPLUS,
            ReaddirPlus::Auto => {
                want |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO
            }
        }
        // Refused before the mount if asked where the policy never allows it.
        let writeback = a
            .policy
            .writeback_cache
            .decide(a.opts.writeback_cache)
            .unwrap_or(false);
        if writeback {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        // Ask for each capability alone: a kernel lacking one must not cost us the others.
        for flag in want.iter() {
            if let Err(missing) = config.add_capabilities(flag) {
                debug!("kernel does not offer {missing:?}");
            }
        }
        let writeback = writeback
            && config
                .capabilities()
                .contains(InitFlags::FUSE_WRITEBACK_CACHE);
        // Passthrough and the writeback cache exclude each other in the kernel. A stack
        // depth of 1 lets branches live on any non-stacking file system (and lets this
        // mount sit under one more stacking layer).
        let mut passthrough = false;
        if a.opts.passthrough && !writeback && config.set_max_stack_depth(1).is_ok() {
            passthrough = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok();
            if !passthrough {
                let _ = config.set_max_stack_depth(0);
            }
        }
        let max_write = match config.set_max_write(a.opts.max_write) {
            Ok(_) => a.opts.max_write,
            Err(nearest) => {
                let _ = config.set_max_write(nearest);
                nearest
            }
        };
        let readahead = match config.set_max_readahead(a.opts.max_write) {
            Ok(_) => a.opts.max_write,
            Err(nearest) => {
                let _ = config.set_max_readahead(nearest);
                nearest
            }
        };
        // Room for readahead and writeback of a few large files at once.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // The kernel sizes ring payloads as max(8 KiB, max_write, max_pages pages), and the
        // binding asks for max_pages = the larger of max_write and readahead, in pages.
        let page = 4096usize;
        let payload = (max_write.max(readahead) as usize).next_multiple_of(page);
        let uring = self.offer_uring(config, payload);
        let killpriv_v2 = config
            .capabilities()
            .contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        a.set_negotiated(Negotiated {
            writeback,
            passthrough,
        });
        debug!(
            "FUSE init: writeback cache {writeback}, passthrough {passthrough}, killpriv_v2 {killpriv_v2}, max_write {max_write}, io_uring asked {uring}"
        );
        Ok(())
    }

    fn destroy(&mut self) {
        // The /dev/fuse threads have seen the connection end. The queue threads leave once
        // the kernel has given their entries back; no request may still be running in the
        // file system when it flushes.
        self.handoff.finish();
        self.a.destroy();
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.a().lookup(&ctx(req), parent.0, name, reply)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.a().forget(ino.0, nlookup);
        uring::pace_forgets(&self.a);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.a().getattr(ino.0, reply)
    }

    fn statx(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: fuser::ReplyStatx,
    ) {
        self.a().statx(&ctx(req), ino.0, reply)
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
        self.a().setattr(&ctx(req), ino.0, set, reply)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.a().readlink(ino.0, reply)
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
        self.a()
            .mknod(&ctx(req), parent.0, name, mode, umask, rdev, reply)
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
        self.a()
            .mkdir(&ctx(req), parent.0, name, mode, umask, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.a().unlink(&ctx(req), parent.0, name, reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.a().rmdir(&ctx(req), parent.0, name, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.a().symlink(
            &ctx(req),
            parent.0,
            link_name,
            target.as_os_str().as_bytes(),
            reply,
        )
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
        self.a().rename(
            &ctx(req),
            parent.0,
            name,
            newparent.0,
            newname,
            flags.bits(),
            reply,
        )
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.a().link(&ctx(req), ino.0, newparent.0, newname, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.a().open(&ctx(req), ino.0, flags.0, reply)
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
        self.a().read(ino.0, fh.0, offset, size, reply)
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let cached = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        self.a().write(ino.0, fh.0, offset, data, cached, reply)
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.a().flush(ino.0, fh.0, reply)
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
        self.a().release(ino.0, fh.0, reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.a().fsync(ino.0, fh.0, datasync, reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.a().opendir(&ctx(req), ino.0, reply)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.a().readdir(ino.0, fh.0, offset, reply)
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.a().readdirplus(ino.0, fh.0, offset, reply)
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.a().releasedir(ino.0, fh.0, reply)
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.a().fsyncdir(ino.0, fh.0, datasync, reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.a().statfs(reply)
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
        self.a()
            .setxattr(&ctx(req), ino.0, name, value, flags, reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.a().getxattr(&ctx(req), ino.0, name, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.a().listxattr(&ctx(req), ino.0, size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.a().removexattr(&ctx(req), ino.0, name, reply)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.a().access(&ctx(req), ino.0, mask.bits(), reply)
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
        self.a()
            .create(&ctx(req), parent.0, name, mode, umask, flags, reply)
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.a()
            .tmpfile(&ctx(req), parent.0, mode, umask, flags, reply)
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
        self.a().unsupported(Op::Getlk, Errno::ENOSYS, reply)
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
        self.a().unsupported(Op::Setlk, Errno::ENOSYS, reply)
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _bs: u32, _idx: u64, reply: fuser::ReplyBmap) {
        self.a().unsupported(Op::Bmap, Errno::ENOSYS, reply)
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.a()
            .ioctl(&ctx(req), ino.0, cmd, in_data, out_size, reply)
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
        self.a().fallocate(ino.0, fh.0, offset, length, mode, reply)
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
        self.a().lseek(ino.0, fh.0, offset, whence, reply)
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
        self.a()
            .unsupported(Op::CopyFileRange, Errno::ENOSYS, reply)
    }
}
