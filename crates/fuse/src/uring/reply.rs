//! Encoding the adapter's answers into a ring entry: the reply body goes to the entry's
//! payload buffer (or, when the request's own arguments still occupy it, to a scratch
//! buffer copied there afterwards); the error code goes to the out header, which the
//! worker writes once the handler has returned.
//!
//! [`RingReply`] is the reply object handed to the adapter. Dropped without an answer (a
//! panic unwinding through it), it answers EIO, like the binding's reply objects.

use std::ffi::OsStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};
use zerocopy::IntoBytes;

use super::RingBacking;
use super::abi::{
    AttrOut, DirentHead, EntryOut, FuseAttr, GetxattrOut, IoctlOut, LseekOut, OpenOut, StatfsOut,
    StatxOut, SxTime, WriteOut,
};
use crate::reply::{
    AttrReply, Backing, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply,
    IoctlReply, LseekReply, OpenReply, Reply, StatfsReply, StatxReply, WriteReply, XattrReply,
};

/// Where a reply body goes.
pub(crate) enum Sink<'b> {
    /// Straight into the entry's payload buffer.
    Direct(&'b mut [u8]),
    /// Into a scratch buffer of at most `cap` bytes (the payload size), copied into the
    /// payload once the request's arguments, which live there, are no longer borrowed.
    Staged(&'b mut Vec<u8>, usize),
}

/// The answer being built for one request.
pub(crate) struct Answer<'b> {
    sink: Sink<'b>,
    len: usize,
    /// 0 or a negative errno, as the out header carries it.
    error: i32,
    answered: bool,
    /// The /dev/fuse descriptor, for registering passthrough backing files.
    dev: &'b Arc<std::fs::File>,
}

impl<'b> Answer<'b> {
    pub(crate) fn new(sink: Sink<'b>, dev: &'b Arc<std::fs::File>) -> Answer<'b> {
        Answer {
            sink,
            len: 0,
            error: 0,
            answered: false,
            dev,
        }
    }

    /// (error, body length) once the handler returned. A request nobody answered is EIO.
    pub(crate) fn result(&self) -> (i32, usize) {
        if self.answered {
            (self.error, if self.error == 0 { self.len } else { 0 })
        } else {
            (-libc::EIO, 0)
        }
    }

    fn cap(&self) -> usize {
        match &self.sink {
            Sink::Direct(b) => b.len(),
            Sink::Staged(_, cap) => *cap,
        }
    }

    /// Appends `bytes` to the body; false (nothing written) if it would not fit.
    fn put(&mut self, bytes: &[u8]) -> bool {
        let end = match self.len.checked_add(bytes.len()) {
            Some(e) if e <= self.cap() => e,
            _ => return false,
        };
        match &mut self.sink {
            Sink::Direct(b) => b[self.len..end].copy_from_slice(bytes),
            Sink::Staged(v, _) => {
                v.truncate(self.len);
                v.extend_from_slice(bytes);
            }
        }
        self.len = end;
        true
    }

    /// Answers with the body put so far, or EIO if some of it did not fit.
    fn finish(&mut self, fitted: bool) {
        self.answered = true;
        if fitted {
            self.error = 0;
        } else {
            log::error!("a reply did not fit the ring entry's payload buffer; answered EIO");
            self.error = -libc::EIO;
            self.len = 0;
        }
    }

    fn fail(&mut self, e: Errno) {
        self.answered = true;
        self.len = 0;
        let code = i32::from(e);
        // The kernel rejects an out header whose error is positive or below -ERESTARTSYS.
        self.error = if code > 0 && code < 512 {
            -code
        } else {
            -libc::EIO
        };
    }
}

/// The reply object the adapter's handlers answer through.
pub(crate) struct RingReply<'a, 'b> {
    ans: &'a mut Answer<'b>,
    /// READDIR/READDIRPLUS: the kernel's buffer size (entries beyond it do not fit).
    limit: usize,
}

impl<'a, 'b> RingReply<'a, 'b> {
    #[cfg(test)]
    pub(crate) fn new(ans: &'a mut Answer<'b>) -> RingReply<'a, 'b> {
        RingReply {
            ans,
            limit: usize::MAX,
        }
    }

    pub(crate) fn with_limit(ans: &'a mut Answer<'b>, limit: usize) -> RingReply<'a, 'b> {
        RingReply { ans, limit }
    }

    fn body(self, bytes: &[u8]) {
        let fitted = self.ans.put(bytes);
        self.ans.finish(fitted);
    }

    fn register(&self, fd: BorrowedFd<'_>) -> io::Result<Backing> {
        RingBacking::open(self.ans.dev, fd).map(Backing::Ring)
    }
}

impl Drop for RingReply<'_, '_> {
    fn drop(&mut self) {
        // Consuming methods set `answered`; reaching here unanswered means the handler
        // dropped the reply (or panicked through it): the request still gets its answer.
        if !self.ans.answered {
            self.ans.fail(Errno::EIO);
        }
    }
}

/// (seconds, nanoseconds) since the epoch, negative before it, saturating like the binding.
fn time_out(t: &SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() == 0 {
                (-secs, 0)
            } else {
                (-secs - 1, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

fn mode_out(kind: FileType, perm: u16) -> u32 {
    let t = match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    };
    t | u32::from(perm)
}

pub(crate) fn attr_out(a: &FileAttr) -> FuseAttr {
    let (atime, atimensec) = time_out(&a.atime);
    let (mtime, mtimensec) = time_out(&a.mtime);
    let (ctime, ctimensec) = time_out(&a.ctime);
    FuseAttr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: mode_out(a.kind, a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

fn entry_out(attr_ttl: &Duration, entry_ttl: &Duration, a: &FileAttr, g: Generation) -> EntryOut {
    EntryOut {
        nodeid: a.ino.0,
        generation: g.0,
        entry_valid: entry_ttl.as_secs(),
        attr_valid: attr_ttl.as_secs(),
        entry_valid_nsec: entry_ttl.subsec_nanos(),
        attr_valid_nsec: attr_ttl.subsec_nanos(),
        attr: attr_out(a),
    }
}

fn open_out(fh: FileHandle, flags: FopenFlags, backing_id: i32) -> OpenOut {
    OpenOut {
        fh: fh.0,
        open_flags: flags.bits(),
        backing_id,
    }
}

/// An open answer handing the kernel `backing` for the file's I/O; `None` (answered EIO)
/// for a backing file this transport did not register.
fn passthrough_open_out(fh: FileHandle, flags: FopenFlags, backing: &Backing) -> Option<OpenOut> {
    Some(open_out(
        fh,
        flags | FopenFlags::FOPEN_PASSTHROUGH,
        ring_backing_id(backing)?,
    ))
}

/// The raw id of a backing file this transport registered (see [`Backing`]).
fn ring_backing_id(b: &Backing) -> Option<i32> {
    match b {
        Backing::Ring(r) => i32::try_from(r.id()).ok(),
        Backing::Dev(_) => {
            log::error!("a /dev/fuse-registered backing file reached the ring; answered EIO");
            None
        }
    }
}

fn dirent_type(kind: FileType) -> u32 {
    mode_out(kind, 0) >> 12
}

/// Appends one `fuse_dirent` (24-byte head, name, zero padding to 8) if it fits `limit`.
fn put_dirent(
    ans: &mut Answer<'_>,
    limit: usize,
    ino: u64,
    off: u64,
    typ: u32,
    name: &[u8],
) -> bool {
    let Ok(namelen) = u32::try_from(name.len()) else {
        return false;
    };
    let rec = (24 + name.len()).next_multiple_of(8);
    if ans.len + rec > limit.min(ans.cap()) {
        return false;
    }
    let head = DirentHead {
        ino,
        off,
        namelen,
        typ,
    };
    const PAD: [u8; 8] = [0; 8];
    ans.put(head.as_bytes()) && ans.put(name) && ans.put(&PAD[..rec - 24 - name.len()])
}

impl Reply for RingReply<'_, '_> {
    fn error(self, e: Errno) {
        self.ans.fail(e);
    }
}

impl EntryReply for RingReply<'_, '_> {
    fn entry(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr, g: Generation) {
        let e = entry_out(attr_ttl, entry_ttl, attr, g);
        self.body(e.as_bytes())
    }
}

impl AttrReply for RingReply<'_, '_> {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        let a = AttrOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            dummy: 0,
            attr: attr_out(attr),
        };
        self.body(a.as_bytes())
    }
}

/// `STATX_BASIC_STATS | STATX_BTIME`: the fields a statx answer fills.
const STATX_FILLED: u32 = libc::STATX_BASIC_STATS | libc::STATX_BTIME;

impl StatxReply for RingReply<'_, '_> {
    fn statx(self, ttl: &Duration, attr: &FileAttr, attributes: u64, attributes_mask: u64) {
        let sx = |t: &SystemTime| {
            let (tv_sec, tv_nsec) = time_out(t);
            SxTime {
                tv_sec,
                tv_nsec,
                reserved: 0,
            }
        };
        let a = attr_out(attr);
        let s = StatxOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            mask: STATX_FILLED,
            blksize: a.blksize,
            attributes,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            mode: a.mode as u16,
            ino: a.ino,
            size: a.size,
            blocks: a.blocks,
            attributes_mask,
            atime: sx(&attr.atime),
            btime: sx(&attr.crtime),
            ctime: sx(&attr.ctime),
            mtime: sx(&attr.mtime),
            // fuse_attr's rdev is in new_encode_dev() form; statx's is split.
            rdev_major: (a.rdev & 0xfff00) >> 8,
            rdev_minor: (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00),
            ..Default::default()
        };
        self.body(s.as_bytes())
    }
}

impl EmptyReply for RingReply<'_, '_> {
    fn ok(self) {
        self.body(&[])
    }
}

impl DataReply for RingReply<'_, '_> {
    fn data(self, data: &[u8]) {
        self.body(data)
    }
}

impl WriteReply for RingReply<'_, '_> {
    fn written(self, size: u32) {
        self.body(WriteOut { size, padding: 0 }.as_bytes())
    }
}

impl OpenReply for RingReply<'_, '_> {
    fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<Backing> {
        self.register(fd)
    }
    fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.body(open_out(fh, flags, 0).as_bytes())
    }
    fn opened_passthrough(self, fh: FileHandle, flags: FopenFlags, backing: &Backing) {
        match passthrough_open_out(fh, flags, backing) {
            Some(o) => self.body(o.as_bytes()),
            None => self.error(Errno::EIO),
        }
    }
}

impl CreateReply for RingReply<'_, '_> {
    fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<Backing> {
        self.register(fd)
    }
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        g: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        let e = entry_out(ttl, ttl, attr, g);
        let o = open_out(fh, flags, 0);
        let fitted = self.ans.put(e.as_bytes()) && self.ans.put(o.as_bytes());
        self.ans.finish(fitted);
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
        let Some(o) = passthrough_open_out(fh, flags, backing) else {
            return self.error(Errno::EIO);
        };
        let e = entry_out(ttl, ttl, attr, g);
        let fitted = self.ans.put(e.as_bytes()) && self.ans.put(o.as_bytes());
        self.ans.finish(fitted);
    }
}

impl StatfsReply for RingReply<'_, '_> {
    fn statfs(self, s: &cairn_vfs::StatFs) {
        let out = StatfsOut {
            blocks: s.blocks,
            bfree: s.bfree,
            bavail: s.bavail,
            files: s.files,
            ffree: s.ffree,
            bsize: s.bsize,
            namelen: s.namelen,
            frsize: s.frsize,
            padding: 0,
            spare: [0; 6],
        };
        self.body(out.as_bytes())
    }
}

impl DirReply for RingReply<'_, '_> {
    fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        !put_dirent(
            self.ans,
            self.limit,
            ino.0,
            offset,
            dirent_type(kind),
            name.as_bytes(),
        )
    }
    fn ok(self) {
        self.ans.finish(true)
    }
}

impl DirPlusReply for RingReply<'_, '_> {
    fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        g: Generation,
    ) -> bool {
        let rec = 128 + (24 + name.len()).next_multiple_of(8);
        if self.ans.len + rec > self.limit.min(self.ans.cap()) {
            return true;
        }
        let e = entry_out(ttl, ttl, attr, g);
        let start = self.ans.len;
        let ok = self.ans.put(e.as_bytes())
            && put_dirent(
                self.ans,
                self.limit,
                ino.0,
                offset,
                dirent_type(attr.kind),
                name.as_bytes(),
            );
        if !ok {
            // Never leave half a record behind.
            self.ans.len = start;
        }
        !ok
    }
    fn ok(self) {
        self.ans.finish(true)
    }
}

impl XattrReply for RingReply<'_, '_> {
    fn size(self, size: u32) {
        self.body(GetxattrOut { size, padding: 0 }.as_bytes())
    }
    fn data(self, data: &[u8]) {
        self.body(data)
    }
}

impl IoctlReply for RingReply<'_, '_> {
    fn ioctl(self, result: i32, data: &[u8]) {
        let out = IoctlOut {
            result,
            ..Default::default()
        };
        let fitted = self.ans.put(out.as_bytes()) && self.ans.put(data);
        self.ans.finish(fitted);
    }
}

impl LseekReply for RingReply<'_, '_> {
    fn offset(self, offset: i64) {
        self.body(
            LseekOut {
                offset: offset as u64,
            }
            .as_bytes(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Arc<std::fs::File> {
        Arc::new(std::fs::File::open("/dev/null").unwrap())
    }

    #[test]
    fn dropped_reply_answers_eio() {
        let d = dev();
        let mut buf = [0u8; 64];
        let mut ans = Answer::new(Sink::Direct(&mut buf), &d);
        drop(RingReply::new(&mut ans));
        assert_eq!(ans.result(), (-libc::EIO, 0));
    }

    #[test]
    fn errors_are_negative_and_bodiless() {
        let d = dev();
        let mut buf = [0u8; 64];
        let mut ans = Answer::new(Sink::Direct(&mut buf), &d);
        RingReply::new(&mut ans).error(Errno::ENOENT);
        assert_eq!(ans.result(), (-libc::ENOENT, 0));
    }

    #[test]
    fn a_body_too_large_for_the_buffer_is_eio() {
        let d = dev();
        let mut buf = [0u8; 8];
        let mut ans = Answer::new(Sink::Direct(&mut buf), &d);
        DataReply::data(RingReply::new(&mut ans), &[1u8; 9]);
        assert_eq!(ans.result(), (-libc::EIO, 0));
    }

    #[test]
    fn dirents_are_padded_and_stop_at_the_limit() {
        let d = dev();
        let mut buf = [0xffu8; 256];
        let mut ans = Answer::new(Sink::Direct(&mut buf), &d);
        let mut r = RingReply::with_limit(&mut ans, 64);
        assert!(!DirReply::add(
            &mut r,
            INodeNo(5),
            1,
            FileType::RegularFile,
            OsStr::new("abc")
        ));
        // 24 + 3 -> 32 bytes; a second 32-byte record still fits 64, a third does not.
        assert!(!DirReply::add(
            &mut r,
            INodeNo(6),
            2,
            FileType::Directory,
            OsStr::new("def")
        ));
        assert!(DirReply::add(
            &mut r,
            INodeNo(7),
            3,
            FileType::Directory,
            OsStr::new("ghi")
        ));
        DirReply::ok(r);
        assert_eq!(ans.result(), (0, 64));
        assert_eq!(&buf[0..8], &5u64.to_ne_bytes());
        assert_eq!(&buf[16..20], &3u32.to_ne_bytes());
        assert_eq!(&buf[20..24], &(libc::S_IFREG >> 12).to_ne_bytes());
        assert_eq!(&buf[24..32], b"abc\0\0\0\0\0");
    }

    #[test]
    fn staged_bodies_respect_the_payload_size() {
        let d = dev();
        let mut v = Vec::new();
        let mut ans = Answer::new(Sink::Staged(&mut v, 16), &d);
        RingReply::new(&mut ans).written(7);
        assert_eq!(ans.result(), (0, 8));
        assert_eq!(&v[..4], &7u32.to_ne_bytes());
    }

    #[test]
    fn times_before_the_epoch_keep_positive_nanoseconds() {
        let t = UNIX_EPOCH - Duration::new(1, 250_000_000);
        assert_eq!(time_out(&t), (-2, 750_000_000));
        assert_eq!(time_out(&(UNIX_EPOCH + Duration::new(3, 5))), (3, 5));
    }
}

#[cfg(test)]
mod statx_tests {
    use super::*;

    /// The statx answer carries the attributes, their mask, the birth time and the split
    /// rdev where the kernel's `struct fuse_statx_out` has them.
    #[test]
    fn statx_answer_layout() {
        let dev = Arc::new(std::fs::File::open("/dev/null").unwrap());
        let mut buf = vec![0u8; 512];
        let mut ans = Answer::new(Sink::Direct(&mut buf), &dev);
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        let attr = FileAttr {
            ino: INodeNo(7),
            size: 5,
            blocks: 8,
            atime: t(1),
            mtime: t(2),
            ctime: t(3),
            crtime: t(4),
            kind: FileType::CharDevice,
            perm: 0o644,
            nlink: 1,
            uid: 10,
            gid: 20,
            // new_encode_dev(8, 0x23401).
            rdev: 1 | (8 << 8) | (0x23400 << 12),
            blksize: 4096,
            flags: 0,
        };
        RingReply::new(&mut ans).statx(&Duration::from_secs(1), &attr, 0x20, 0x70);
        assert_eq!(ans.result(), (0, 32 + 256));
        let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().unwrap());
        let sx = 32;
        assert_eq!(u32_at(sx), libc::STATX_BASIC_STATS | libc::STATX_BTIME);
        assert_eq!(u64_at(sx + 8), 0x20, "stx_attributes");
        assert_eq!(u64_at(sx + 56), 0x70, "stx_attributes_mask");
        assert_eq!(u64_at(sx + 32), 7, "ino");
        assert_eq!(
            u32::from(u16::from_le_bytes([buf[sx + 28], buf[sx + 29]])),
            libc::S_IFCHR | 0o644
        );
        assert_eq!(u64_at(sx + 80), 4, "btime");
        assert_eq!((u32_at(sx + 128), u32_at(sx + 132)), (8, 0x23401), "rdev");
    }
}
