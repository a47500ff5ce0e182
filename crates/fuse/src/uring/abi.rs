//! The FUSE wire structures the io_uring transport reads and writes, as the kernel's
//! `include/uapi/linux/fuse.h` defines them (protocol 7.40, the version the binding
//! negotiates), plus the io_uring additions of 7.42. Native endianness, `repr(C)`, no
//! padding the kernel does not declare; `zerocopy` reads and writes them from byte slices
//! without `unsafe` and without alignment requirements.
//!
//! The binding keeps its copies of these private, so the transport owns this small layer.
//! Only what the adapter answers is here; the per-opcode input structures are read from the
//! request's first argument (`op_in` of the ring entry), whose size the kernel reports
//! indirectly: `fuse_in_header.len` is the header plus every argument, the ring's
//! `payload_sz` is every argument but the first.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

// fuse_uring_req_header: the per-entry header buffer (iov[0] of a REGISTER).
/// `in_out` (fuse_in_header on fetch, fuse_out_header on commit) at offset 0.
pub(crate) const HDR_IN_OUT: usize = 0;
/// `op_in`: the request's first argument, the per-opcode structure, at offset 128.
pub(crate) const HDR_OP_IN: usize = 128;
pub(crate) const HDR_OP_IN_LEN: usize = 128;
/// `ring_ent_in_out` (struct below) at offset 256.
pub(crate) const HDR_ENT_IN_OUT: usize = 256;
/// sizeof(struct fuse_uring_req_header).
pub(crate) const HDR_LEN: usize = 288;

/// io_uring command opcodes (`sqe->cmd_op`) on /dev/fuse.
pub(crate) const CMD_REGISTER: u32 = 1;
pub(crate) const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `fuse_write_in.write_flags`: the write is the kernel's write-back of its page cache.
pub(crate) const FUSE_WRITE_CACHE: u32 = 1 << 0;

/// The kernel's minimum payload buffer, FUSE_MIN_READ_BUFFER.
pub(crate) const MIN_PAYLOAD: usize = 8192;

/// `struct fuse_uring_ent_in_out` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub(crate) struct EntInOut {
    pub flags: u64,
    /// The request's unique id, echoed as the commit id.
    pub commit_id: u64,
    /// Bytes of payload, both directions.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_cmd_req`, the first 24 of the 80 command bytes of an SQE128.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub(crate) struct CmdReq {
    pub flags: u64,
    pub commit_id: u64,
    pub qid: u16,
    pub padding: [u8; 6],
}

impl CmdReq {
    /// The 80-byte command area of the SQE (the rest must be zero).
    pub(crate) fn to_cmd(self) -> [u8; 80] {
        let mut cmd = [0u8; 80];
        cmd[..24].copy_from_slice(self.as_bytes());
        cmd
    }
}

/// `struct fuse_in_header` (40 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub(crate) struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

/// `struct fuse_out_header` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub(crate) struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

// Opcodes (enum fuse_opcode).
pub(crate) const LOOKUP: u32 = 1;
pub(crate) const FORGET: u32 = 2;
pub(crate) const GETATTR: u32 = 3;
pub(crate) const SETATTR: u32 = 4;
pub(crate) const READLINK: u32 = 5;
pub(crate) const SYMLINK: u32 = 6;
pub(crate) const MKNOD: u32 = 8;
pub(crate) const MKDIR: u32 = 9;
pub(crate) const UNLINK: u32 = 10;
pub(crate) const RMDIR: u32 = 11;
pub(crate) const RENAME: u32 = 12;
pub(crate) const LINK: u32 = 13;
pub(crate) const OPEN: u32 = 14;
pub(crate) const READ: u32 = 15;
pub(crate) const WRITE: u32 = 16;
pub(crate) const STATFS: u32 = 17;
pub(crate) const RELEASE: u32 = 18;
pub(crate) const FSYNC: u32 = 20;
pub(crate) const SETXATTR: u32 = 21;
pub(crate) const GETXATTR: u32 = 22;
pub(crate) const LISTXATTR: u32 = 23;
pub(crate) const REMOVEXATTR: u32 = 24;
pub(crate) const FLUSH: u32 = 25;
pub(crate) const OPENDIR: u32 = 27;
pub(crate) const READDIR: u32 = 28;
pub(crate) const RELEASEDIR: u32 = 29;
pub(crate) const FSYNCDIR: u32 = 30;
pub(crate) const GETLK: u32 = 31;
pub(crate) const SETLK: u32 = 32;
pub(crate) const SETLKW: u32 = 33;
pub(crate) const ACCESS: u32 = 34;
pub(crate) const CREATE: u32 = 35;
pub(crate) const BMAP: u32 = 37;
pub(crate) const IOCTL: u32 = 39;
pub(crate) const POLL: u32 = 40;
pub(crate) const BATCH_FORGET: u32 = 42;
pub(crate) const FALLOCATE: u32 = 43;
pub(crate) const READDIRPLUS: u32 = 44;
pub(crate) const RENAME2: u32 = 45;
pub(crate) const LSEEK: u32 = 46;
pub(crate) const COPY_FILE_RANGE: u32 = 47;
pub(crate) const TMPFILE: u32 = 51;
pub(crate) const STATX: u32 = 52;

// fuse_setattr_in.valid bits.
pub(crate) const FATTR_MODE: u32 = 1 << 0;
pub(crate) const FATTR_UID: u32 = 1 << 1;
pub(crate) const FATTR_GID: u32 = 1 << 2;
pub(crate) const FATTR_SIZE: u32 = 1 << 3;
pub(crate) const FATTR_ATIME: u32 = 1 << 4;
pub(crate) const FATTR_MTIME: u32 = 1 << 5;
pub(crate) const FATTR_FH: u32 = 1 << 6;
pub(crate) const FATTR_ATIME_NOW: u32 = 1 << 7;
pub(crate) const FATTR_MTIME_NOW: u32 = 1 << 8;
pub(crate) const FATTR_CTIME: u32 = 1 << 10;

/// fuse_fsync_in.fsync_flags: only the data.
pub(crate) const FSYNC_FDATASYNC: u32 = 1;

/// `struct fuse_setattr_in` (88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

/// `struct fuse_mknod_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct MknodIn {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

/// `struct fuse_mkdir_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct MkdirIn {
    pub mode: u32,
    pub umask: u32,
}

/// `struct fuse_rename_in` (RENAME; RENAME2 adds flags, below).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct RenameIn {
    pub newdir: u64,
}

/// `struct fuse_rename2_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct Rename2In {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_link_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct LinkIn {
    pub oldnodeid: u64,
}

/// `struct fuse_open_in` (OPEN, OPENDIR).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

/// `struct fuse_create_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct CreateIn {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    pub open_flags: u32,
}

/// `struct fuse_read_in` (READ, READDIR, READDIRPLUS).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_write_in`; the data follows as the second argument (the ring payload).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_release_in` (RELEASE, RELEASEDIR).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

/// `struct fuse_flush_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct FlushIn {
    pub fh: u64,
    pub unused: u32,
    pub padding: u32,
    pub lock_owner: u64,
}

/// `struct fuse_fsync_in` (FSYNC, FSYNCDIR).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct FsyncIn {
    pub fh: u64,
    pub fsync_flags: u32,
    pub padding: u32,
}

/// The first 8 bytes of `struct fuse_setxattr_in` (FUSE_COMPAT_SETXATTR_IN_SIZE: the 16-byte
/// form only comes with FUSE_SETXATTR_EXT, which is not requested; its extra field holds
/// flags the vfs has no use for).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct SetxattrIn {
    pub size: u32,
    pub flags: u32,
}

/// `struct fuse_getxattr_in` (GETXATTR, LISTXATTR).
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct GetxattrIn {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_access_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct AccessIn {
    pub mask: u32,
    pub padding: u32,
}

/// `struct fuse_fallocate_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

/// `struct fuse_ioctl_in` (IOCTL); the input data (`in_size` bytes) follows in the payload.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct IoctlIn {
    pub fh: u64,
    pub flags: u32,
    pub cmd: u32,
    pub arg: u64,
    pub in_size: u32,
    pub out_size: u32,
}

/// `struct fuse_ioctl_out`; the output data follows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct IoctlOut {
    pub result: i32,
    pub flags: u32,
    pub in_iovs: u32,
    pub out_iovs: u32,
}

/// `struct fuse_lseek_in`.
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, KnownLayout, Immutable)]
pub(crate) struct LseekIn {
    pub fh: u64,
    pub offset: u64,
    pub whence: u32,
    pub padding: u32,
}

/// `struct fuse_attr` (88 bytes; Linux has no crtime and a padding word at the end).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct FuseAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

/// `struct fuse_entry_out` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: FuseAttr,
}

/// `struct fuse_attr_out` (104 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: FuseAttr,
}

/// `struct fuse_sx_time` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct SxTime {
    pub tv_sec: i64,
    pub tv_nsec: u32,
    pub reserved: i32,
}

/// `struct fuse_statx_out` with its `struct fuse_statx` (32 + 256 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct StatxOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub flags: u32,
    pub spare: [u64; 2],
    // struct fuse_statx:
    pub mask: u32,
    pub blksize: u32,
    pub attributes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u16,
    pub spare0: u16,
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub attributes_mask: u64,
    pub atime: SxTime,
    pub btime: SxTime,
    pub ctime: SxTime,
    pub mtime: SxTime,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub spare2: [u64; 14],
}

/// `struct fuse_open_out` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

/// `struct fuse_write_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_statfs_out` (struct fuse_kstatfs, 80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// `struct fuse_getxattr_out` (the size answer to a size-0 probe).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct GetxattrOut {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_lseek_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct LseekOut {
    pub offset: u64,
}

/// `struct fuse_dirent` without its name (24 bytes); the name follows, the record is padded
/// to a multiple of 8.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, IntoBytes, Immutable)]
pub(crate) struct DirentHead {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub typ: u32,
}

/// Reads a `T` from the front of `bytes`, or `None` when there are too few.
pub(crate) fn read<T: FromBytes>(bytes: &[u8]) -> Option<T> {
    T::read_from_prefix(bytes).ok().map(|(t, _)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_kernel_header() {
        use std::mem::size_of;
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<EntInOut>(), 32);
        assert_eq!(size_of::<CmdReq>(), 24);
        assert_eq!(HDR_ENT_IN_OUT + size_of::<EntInOut>(), HDR_LEN);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<ReleaseIn>(), 24);
        assert_eq!(size_of::<FlushIn>(), 24);
        assert_eq!(size_of::<FallocateIn>(), 32);
        assert_eq!(size_of::<LseekIn>(), 24);
        assert_eq!(size_of::<FuseAttr>(), 88);
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<StatxOut>(), 32 + 256);
        assert_eq!(std::mem::offset_of!(StatxOut, attributes_mask), 32 + 56);
        assert_eq!(std::mem::offset_of!(StatxOut, rdev_major), 32 + 128);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<DirentHead>(), 24);
    }

    #[test]
    fn short_input_reads_as_none() {
        assert!(read::<ReadIn>(&[0u8; 39]).is_none());
        assert!(read::<ReadIn>(&[0u8; 40]).is_some());
    }
}
