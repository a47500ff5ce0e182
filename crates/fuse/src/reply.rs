//! The answers a request handler gives, independent of the transport that carries them.
//!
//! [`crate::adapter::Adapter`] translates every request onto the vfs contract once; the two
//! transports only decode requests and encode these answers: over /dev/fuse the binding's
//! own reply objects implement the traits (below), over io_uring the ring entries do
//! (`uring::reply`). Whichever transport, a reply object that is dropped without an answer
//! (a handler that returned early by mistake, or a panic unwinding through it) answers EIO,
//! so every request gets exactly one reply.

use std::ffi::OsStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use cairn_vfs::StatFs;
use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};

use crate::uring::RingBacking;

/// A host file registered with the kernel for FUSE passthrough; dropping it unregisters it
/// (opens still in the kernel keep their own reference). Which transport registered it
/// decides the variant: a mount answers all its opens over one transport (the kernel sends
/// nothing over /dev/fuse but forgets and interrupts once the rings are ready, and nothing
/// over the rings unless they are), so a backing file never crosses transports; if it ever
/// did, the open would be answered EIO rather than with the wrong id.
#[derive(Debug)]
pub(crate) enum Backing {
    Dev(fuser::BackingId),
    Ring(RingBacking),
}

/// Every reply can be an error.
pub(crate) trait Reply {
    fn error(self, e: Errno);
}

pub(crate) trait EntryReply: Reply {
    fn entry(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr, g: Generation);
}

pub(crate) trait AttrReply: Reply {
    fn attr(self, ttl: &Duration, attr: &FileAttr);
}

/// FUSE_STATX's answer: the attributes and the `STATX_ATTR_*` bits with their mask.
pub(crate) trait StatxReply: Reply {
    fn statx(self, ttl: &Duration, attr: &FileAttr, attributes: u64, attributes_mask: u64);
}

pub(crate) trait EmptyReply: Reply {
    fn ok(self);
}

pub(crate) trait DataReply: Reply {
    fn data(self, data: &[u8]);
}

/// An ioctl's answer: its result and the data copied back to the caller.
pub(crate) trait IoctlReply: Reply {
    fn ioctl(self, result: i32, data: &[u8]);
}

pub(crate) trait WriteReply: Reply {
    fn written(self, size: u32);
}

pub(crate) trait OpenReply: Reply {
    fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<Backing>;
    fn opened(self, fh: FileHandle, flags: FopenFlags);
    fn opened_passthrough(self, fh: FileHandle, flags: FopenFlags, backing: &Backing);
}

pub(crate) trait CreateReply: Reply {
    fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<Backing>;
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        g: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    );
    #[allow(clippy::too_many_arguments)]
    fn created_passthrough(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        g: Generation,
        fh: FileHandle,
        flags: FopenFlags,
        backing: &Backing,
    );
}

pub(crate) trait StatfsReply: Reply {
    fn statfs(self, s: &StatFs);
}

pub(crate) trait DirReply: Reply {
    /// Adds an entry; `true` means the buffer is full and the entry was not added.
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool;
    fn ok(self);
}

pub(crate) trait DirPlusReply: Reply {
    /// Adds an entry; `true` means the buffer is full and the entry was not added.
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        g: Generation,
    ) -> bool;
    fn ok(self);
}

pub(crate) trait XattrReply: Reply {
    fn size(self, size: u32);
    fn data(self, data: &[u8]);
}

pub(crate) trait LseekReply: Reply {
    fn offset(self, offset: i64);
}

// The binding's reply objects, for the /dev/fuse transport.

macro_rules! dev_error {
    ($($t:ty),*) => {$(
        impl Reply for $t {
            fn error(self, e: Errno) {
                <$t>::error(self, e)
            }
        }
    )*};
}

dev_error!(
    fuser::ReplyEntry,
    fuser::ReplyAttr,
    fuser::ReplyStatx,
    fuser::ReplyEmpty,
    fuser::ReplyData,
    fuser::ReplyWrite,
    fuser::ReplyOpen,
    fuser::ReplyCreate,
    fuser::ReplyStatfs,
    fuser::ReplyDirectory,
    fuser::ReplyDirectoryPlus,
    fuser::ReplyXattr,
    fuser::ReplyLseek,
    fuser::ReplyLock,
    fuser::ReplyBmap,
    fuser::ReplyIoctl,
    fuser::ReplyPoll
);

impl EntryReply for fuser::ReplyEntry {
    fn entry(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr, g: Generation) {
        self.entry_with_ttls(attr_ttl, entry_ttl, attr, g)
    }
}

impl AttrReply for fuser::ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        fuser::ReplyAttr::attr(self, ttl, attr)
    }
}

impl StatxReply for fuser::ReplyStatx {
    fn statx(self, ttl: &Duration, attr: &FileAttr, attributes: u64, attributes_mask: u64) {
        fuser::ReplyStatx::statx(self, ttl, attr, attributes, attributes_mask)
    }
}

impl EmptyReply for fuser::ReplyEmpty {
    fn ok(self) {
        fuser::ReplyEmpty::ok(self)
    }
}

impl DataReply for fuser::ReplyData {
    fn data(self, data: &[u8]) {
        fuser::ReplyData::data(self, data)
    }
}

impl WriteReply for fuser::ReplyWrite {
    fn written(self, size: u32) {
        fuser::ReplyWrite::written(self, size)
    }
}

impl OpenReply for fuser::ReplyOpen {
    fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<Backing> {
        fuser::ReplyOpen::open_backing(self, fd).map(Backing::Dev)
    }
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        fuser::ReplyOpen::opened(self, fh, flags)
    }
    fn opened_passthrough(self, fh: FileHandle, flags: FopenFlags, backing: &Backing) {
        match backing {
            Backing::Dev(id) => fuser::ReplyOpen::opened_passthrough(self, fh, flags, id),
            Backing::Ring(_) => {
                log::error!("a ring-registered backing file reached /dev/fuse; answered EIO");
                fuser::ReplyOpen::error(self, Errno::EIO)
            }
        }
    }
}

impl CreateReply for fuser::ReplyCreate {
    fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<Backing> {
        fuser::ReplyCreate::open_backing(self, fd).map(Backing::Dev)
    }
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        g: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        fuser::ReplyCreate::created(self, ttl, attr, g, fh, flags)
    }
    fn created_passthrough(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        g: Generation,
        fh: FileHandle,
        flags: FopenFlags,
        backing: &Backing,
    ) {
        match backing {
            Backing::Dev(id) => {
                fuser::ReplyCreate::created_passthrough(self, ttl, attr, g, fh, flags, id)
            }
            Backing::Ring(_) => {
                log::error!("a ring-registered backing file reached /dev/fuse; answered EIO");
                fuser::ReplyCreate::error(self, Errno::EIO)
            }
        }
    }
}

impl StatfsReply for fuser::ReplyStatfs {
    fn statfs(self, s: &StatFs) {
        fuser::ReplyStatfs::statfs(
            self, s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        )
    }
}

impl DirReply for fuser::ReplyDirectory {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        fuser::ReplyDirectory::add(self, ino, offset, kind, name)
    }
    fn ok(self) {
        fuser::ReplyDirectory::ok(self)
    }
}

impl DirPlusReply for fuser::ReplyDirectoryPlus {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        g: Generation,
    ) -> bool {
        fuser::ReplyDirectoryPlus::add(self, ino, offset, name, ttl, attr, g)
    }
    fn ok(self) {
        fuser::ReplyDirectoryPlus::ok(self)
    }
}

impl XattrReply for fuser::ReplyXattr {
    fn size(self, size: u32) {
        fuser::ReplyXattr::size(self, size)
    }
    fn data(self, data: &[u8]) {
        fuser::ReplyXattr::data(self, data)
    }
}

impl IoctlReply for fuser::ReplyIoctl {
    fn ioctl(self, result: i32, data: &[u8]) {
        fuser::ReplyIoctl::ioctl(self, result, data)
    }
}

impl LseekReply for fuser::ReplyLseek {
    fn offset(self, offset: i64) {
        fuser::ReplyLseek::offset(self, offset)
    }
}
