//! Image files and raw block devices.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::lock::{self, Lock};
use crate::{BlockDevice, DeviceCore, DeviceCounters, TraceSink, check_block_size};

/// A device over an image file or a raw block device (e.g. `/dev/loop0`).
///
/// I/O is positional (`pread`/`pwrite`), so concurrent callers need no lock; `flush` is
/// `fdatasync`, which on Linux also flushes a block device's volatile write cache. The
/// device's size is fixed at open; bytes past the last whole block are ignored.
#[derive(Debug)]
pub struct FileDevice {
    core: DeviceCore,
    file: File,
    path: PathBuf,
    read_only: bool,
    is_block_device: bool,
}

impl FileDevice {
    /// Opens an existing image file or block device, locked for its access (see [`Lock`]):
    /// exclusively when writable, shared when read-only. A device someone else holds is an
    /// error of kind [`io::ErrorKind::ResourceBusy`] naming the holder.
    pub fn open(path: &Path, block_size: u32, read_only: bool) -> io::Result<FileDevice> {
        FileDevice::open_with(path, block_size, read_only, Lock::for_access(read_only))
    }

    /// [`FileDevice::open`] with an explicit lock; `Lock::None` only for read-only looks
    /// at a live image.
    pub fn open_with(
        path: &Path,
        block_size: u32,
        read_only: bool,
        lock: Lock,
    ) -> io::Result<FileDevice> {
        check_block_size(block_size)?;
        let file = open_locked(path, read_only, lock, false)?;
        FileDevice::from_file(file, path, block_size, read_only)
    }

    /// Wraps a file already opened (and locked) by [`open_locked`].
    pub fn from_file(
        mut file: File,
        path: &Path,
        block_size: u32,
        read_only: bool,
    ) -> io::Result<FileDevice> {
        check_block_size(block_size)?;
        let meta = file.metadata()?;
        let is_block_device = meta.file_type().is_block_device();
        let size = if is_block_device {
            // A block device's inode reports length 0; seeking to the end asks the driver
            // (the same answer as the BLKGETSIZE64 ioctl, without unsafe code).
            let end = file.seek(SeekFrom::End(0))?;
            file.seek(SeekFrom::Start(0))?;
            end
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        };
        Ok(FileDevice {
            core: DeviceCore::new(block_size, size / u64::from(block_size))?,
            file,
            path: path.to_path_buf(),
            read_only,
            is_block_device,
        })
    }

    /// Creates (or resizes) an image file of `size_bytes` bytes and opens it read-write,
    /// locked exclusively before anything changes. The file is sparse: `set_len`
    /// allocates nothing.
    pub fn create(path: &Path, block_size: u32, size_bytes: u64) -> io::Result<FileDevice> {
        check_block_size(block_size)?;
        let file = open_locked(path, false, Lock::Exclusive, true)?;
        file.set_len(size_bytes)?;
        FileDevice::from_file(file, path, block_size, false)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }
}

impl BlockDevice for FileDevice {
    fn block_size(&self) -> u32 {
        self.core.block_size()
    }

    fn num_blocks(&self) -> u64 {
        self.core.num_blocks()
    }

    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        let (off, blocks) = self.core.check(block, buf.len())?;
        if blocks == 0 {
            return Ok(());
        }
        let at = self.core.now();
        self.file.read_exact_at(buf, off)?;
        self.core.done_read(block, blocks, at);
        Ok(())
    }

    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        let (off, blocks) = self.core.check(block, buf.len())?;
        if blocks == 0 {
            return Ok(());
        }
        let at = self.core.now();
        self.file.write_all_at(buf, off)?;
        self.core.done_write(block, buf, at);
        Ok(())
    }

    /// `fallocate(FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)`: on an image file the host
    /// file system marks the range unwritten (or writes zeros itself), on a block device
    /// the kernel issues the block layer's zero-out (what the BLKZEROOUT ioctl does; a loop
    /// device passes it on to its backing file as a zero range). Either way no buffer of
    /// zeros crosses into the kernel. A file system or driver that refuses it
    /// (`EOPNOTSUPP`, `EINVAL`) gets plain writes of zeros instead.
    fn zero_blocks(&self, block: u64, count: u64) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        let off = self.core.check_range(block, count)?;
        if count == 0 {
            return Ok(());
        }
        let len = count * u64::from(self.core.block_size());
        let (Ok(off_t), Ok(len_t)) = (libc::off_t::try_from(off), libc::off_t::try_from(len))
        else {
            return crate::write_zeros(self, block, count);
        };
        let at = self.core.now();
        let flags = nix::fcntl::FallocateFlags::FALLOC_FL_ZERO_RANGE
            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        match nix::fcntl::fallocate(&self.file, flags, off_t, len_t) {
            Ok(()) => {
                self.core.done_zero(block, count, at);
                Ok(())
            }
            Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::EINVAL) => {
                crate::write_zeros(self, block, count)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn flush(&self) -> io::Result<()> {
        let at = self.core.now();
        if !self.read_only {
            self.file.sync_data()?;
        }
        self.core.done_flush(at);
        Ok(())
    }

    fn counters(&self) -> &DeviceCounters {
        self.core.counters()
    }

    fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>) {
        self.core.set_trace(sink);
    }
}

/// Opens an image file or block device (creating a missing image file when `create`) and
/// takes `lock` on it before anything else happens. A raw block device opened for writing
/// is opened `O_EXCL` too, so a device a kernel file system has mounted is refused.
pub fn open_locked(path: &Path, read_only: bool, lock: Lock, create: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(!read_only);
    if create && !read_only {
        o.create(true).truncate(false);
    }
    let is_block_device = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    if is_block_device && !read_only {
        o.custom_flags(libc::O_EXCL);
    }
    let file = match o.open(path) {
        Err(e) if is_block_device && e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(lock::busy(
                path,
                "a kernel file system or another program that opened it exclusively",
            ));
        }
        other => other?,
    };
    lock::acquire(&file, path, lock)?;
    Ok(file)
}

/// Opens an image file or block device as a shared [`BlockDevice`].
pub fn open_path(
    path: &Path,
    block_size: u32,
    read_only: bool,
) -> io::Result<Arc<dyn BlockDevice>> {
    Ok(Arc::new(FileDevice::open(path, block_size, read_only)?))
}

/// Reads `len` bytes at byte `offset` of a file or block device, without a block size (used to
/// read the superblock before the block size is known). A short file gives `UnexpectedEof`.
pub fn read_bytes_at(path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let file = File::open(path)?;
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_is_sparse_and_sized_in_whole_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let d = FileDevice::create(&p, 4096, 10 * 4096 + 123).unwrap();
        assert_eq!(d.num_blocks(), 10);
        assert!(!d.is_block_device());
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.len(), 10 * 4096 + 123);
        assert!(meta.blocks() * 512 < 4096, "image is not sparse");
    }

    #[test]
    fn round_trip_persists_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let d = FileDevice::create(&p, 512, 64 * 512).unwrap();
        let data: Vec<u8> = (0..1536).map(|i| (i * 7 % 256) as u8).collect();
        d.write_blocks(5, &data).unwrap();
        d.flush().unwrap();
        let s = d.counters().snapshot();
        assert_eq!((s.writes, s.blocks_written, s.flushes), (1, 3, 1));
        drop(d);

        let d = open_path(&p, 512, true).unwrap();
        let mut back = vec![0; 1536];
        d.read_blocks(5, &mut back).unwrap();
        assert_eq!(back, data);
        assert_eq!(read_bytes_at(&p, 5 * 512 + 10, 4).unwrap(), &data[10..14]);
        // A different block size sees the same bytes.
        let big = FileDevice::open(&p, 1024, true).unwrap();
        assert_eq!(big.num_blocks(), 32);
    }

    #[test]
    fn read_only_refuses_writes_and_range_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        FileDevice::create(&p, 512, 4 * 512).unwrap();
        let d = FileDevice::open(&p, 512, true).unwrap();
        let err = d.write_blocks(0, &[0; 512]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        d.flush().unwrap();
        let err = d.read_blocks(4, &mut [0; 512]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = d.read_blocks(0, &mut [0; 100]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn bad_paths_and_sizes_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(FileDevice::open(dir.path(), 4096, true).is_err());
        assert!(FileDevice::open(&dir.path().join("missing"), 4096, true).is_err());
        assert_eq!(
            FileDevice::create(&dir.path().join("x"), 3000, 1 << 20)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        let p = dir.path().join("short");
        std::fs::write(&p, [1, 2, 3]).unwrap();
        assert_eq!(
            read_bytes_at(&p, 2, 4).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(FileDevice::open(&p, 512, true).unwrap().num_blocks(), 0);
    }

    /// Whether the file system holding `dir` zeroes a range of a file itself
    /// (`FALLOC_FL_ZERO_RANGE`: ext4, xfs, btrfs; not tmpfs).
    fn zero_range_supported(dir: &Path) -> bool {
        let f = File::create(dir.join("probe")).unwrap();
        f.set_len(8192).unwrap();
        let flags = nix::fcntl::FallocateFlags::FALLOC_FL_ZERO_RANGE
            | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        nix::fcntl::fallocate(&f, flags, 0, 4096).is_ok()
    }

    /// Zeroes blocks 10..50 of a 64-block image in `dir` full of 0xa5; returns the device's
    /// counters for the call and the traced operations.
    fn zero_a_range(dir: &Path) -> (crate::CounterSnapshot, Vec<(crate::TraceOp, u64, u32)>) {
        let p = dir.join("img");
        let d = FileDevice::create(&p, 4096, 64 * 4096).unwrap();
        d.write_blocks(0, &vec![0xa5; 64 * 4096]).unwrap();
        let t = Arc::new(crate::VecTrace::new());
        d.set_trace(Some(t.clone()));
        let before = d.counters().snapshot();
        d.zero_blocks(10, 40).unwrap();
        let s = d.counters().snapshot().delta(&before);
        let ops = t
            .events()
            .iter()
            .map(|e| (e.op, e.block, e.blocks))
            .collect();
        let mut back = vec![1; 64 * 4096];
        d.read_blocks(0, &mut back).unwrap();
        for (i, b) in back.chunks(4096).enumerate() {
            let want = if (10..50).contains(&i) { 0 } else { 0xa5 };
            assert!(b.iter().all(|&x| x == want), "block {i}");
        }
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 64 * 4096);
        assert!(d.zero_blocks(60, 5).is_err(), "past the end");
        drop(d);
        let ro = FileDevice::open(&p, 4096, true).unwrap();
        assert_eq!(
            ro.zero_blocks(0, 1).unwrap_err().raw_os_error(),
            Some(libc::EROFS)
        );
        (s, ops)
    }

    /// Where the host file system zeroes ranges itself, one request does it (traced as
    /// one zero range); where it refuses (tmpfs), plain writes of zeros do.
    #[test]
    fn zero_blocks_zeroes_the_range_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (s, ops) = zero_a_range(dir.path());
        if zero_range_supported(dir.path()) {
            assert_eq!((s.writes, s.zeroes, s.blocks_written), (1, 1, 40));
            assert_eq!(ops, vec![(crate::TraceOp::Zero, 10, 40)]);
        } else {
            assert_eq!((s.writes, s.zeroes, s.blocks_written), (1, 0, 40));
            assert_eq!(ops, vec![(crate::TraceOp::Write, 10, 40)]);
        }
    }

    /// The fallback on a file system that refuses zero ranges (tmpfs, when /dev/shm is
    /// one; otherwise there is nothing to test).
    #[test]
    fn zero_blocks_falls_back_to_writes_of_zeros() {
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        if zero_range_supported(dir.path()) {
            return;
        }
        let (s, ops) = zero_a_range(dir.path());
        assert_eq!((s.writes, s.zeroes, s.blocks_written), (1, 0, 40));
        assert_eq!(ops, vec![(crate::TraceOp::Write, 10, 40)]);
    }

    /// Exercises the block-device path when a loop device can be set up (root with
    /// losetup); otherwise there is nothing to test and it returns early.
    #[test]
    fn raw_block_device_size_via_seek() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        FileDevice::create(&p, 4096, 256 * 4096).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&p)
            .output();
        let Ok(out) = out else { return };
        if !out.status.success() {
            return;
        }
        let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let result = (|| -> io::Result<()> {
            let d = FileDevice::open(Path::new(&loopdev), 4096, false)?;
            assert!(d.is_block_device());
            assert_eq!(d.num_blocks(), 256);
            d.write_blocks(255, &[0xab; 4096])?;
            d.flush()?;
            let mut b = [0; 4096];
            d.read_blocks(255, &mut b)?;
            assert_eq!(b, [0xab; 4096]);
            d.zero_blocks(254, 2)?;
            d.read_blocks(255, &mut b)?;
            assert_eq!(b, [0; 4096]);
            Ok(())
        })();
        let _ = std::process::Command::new("losetup")
            .args(["-d", &loopdev])
            .status();
        result.unwrap();
    }
}
