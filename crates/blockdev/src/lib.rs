//! Block devices for cairn.
//!
//! Every file system in cairn sees storage only through [`BlockDevice`]: whole blocks at block
//! addresses, plus [`BlockDevice::flush`], the durability barrier. Keeping the interface this
//! small (as redb's `StorageBackend` and littlefs's read/prog/erase/sync do) is what lets the
//! crash harness and the benchmarks substitute their own devices.
//!
//! Implementations:
//! - [`FileDevice`]: an image file (sparse when created here) or a raw block device such as a
//!   loop device, accessed with `pread`/`pwrite`; `flush` is `fdatasync`.
//! - [`MemDevice`]: memory, for tests; `flush` is a no-op because nothing can be lost.
//! - [`FaultDevice`]: wraps another device and fails reads, writes or flushes with `EIO` on
//!   demand (after a budget, or the n-th of a class, once or from then on), for error-path
//!   tests.
//! - [`disk::Disk`]: wraps another device in a model of a mechanical disk (the papers'
//!   hardware: seeks, rotation, zones, read-ahead, an optional write cache, a queue), which
//!   decides when each request completes and leaves the data path as it is.
//!
//! Every device counts its I/O ([`DeviceCounters`], relaxed atomics, always on: benchmarks
//! report I/O counts rather than seconds) and can hand every operation to a [`TraceSink`].
//!
//! # Assumptions about the media
//! cairn assumes what FFS assumed: a write of one block is atomic with respect to a crash
//! (it lands entirely or not at all), writes may reach the media in any order until a flush,
//! and a completed flush makes every write that returned before it durable. The crash harness
//! emulates a device that tears multi-block writes, so no code may rely on a multi-block write
//! being atomic.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub mod contents;
pub mod disk;
mod fault;
mod file;
pub mod image;
pub mod lock;
mod mem;

pub use fault::{FaultDevice, FaultOp};
pub use file::{FileDevice, open_locked, open_path, read_bytes_at};
pub use lock::Lock;
pub use mem::MemDevice;

/// Smallest block size a device accepts (a disk sector).
pub const MIN_BLOCK_SIZE: u32 = 512;
/// Largest block size a device accepts. The file system limits itself to 4–64 KiB; the device
/// layer only refuses sizes that would make a single block an unreasonable allocation.
pub const MAX_BLOCK_SIZE: u32 = 16 << 20;

/// A device addressed in whole blocks of a size fixed when it is opened.
pub trait BlockDevice: Send + Sync {
    /// Bytes per block, fixed at open.
    fn block_size(&self) -> u32;
    /// Number of whole blocks on the device.
    fn num_blocks(&self) -> u64;
    /// Reads `buf.len() / block_size` whole blocks starting at `block`.
    ///
    /// `buf.len()` must be a multiple of the block size and the range must lie on the device;
    /// otherwise the call fails with [`io::ErrorKind::InvalidInput`] (it never panics).
    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `buf.len() / block_size` whole blocks starting at `block`; same rules as
    /// [`BlockDevice::read_blocks`].
    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes blocks `block..block + count` read as zeros: a write of zeros, for every rule
    /// above and below (ordering, durability at the next flush, tearing), but with no buffer
    /// of zeros from the caller. Same range rules as [`BlockDevice::read_blocks`].
    ///
    /// The default writes zeros through [`BlockDevice::write_blocks`], a bounded buffer at a
    /// time, so a wrapper that does not override it (a device model, a crash-state overlay)
    /// sees, times and traces plain writes of zeros. [`FileDevice`] asks the kernel instead
    /// (`FALLOC_FL_ZERO_RANGE`: unwritten extents on an image file, the block layer's
    /// zero-out on a block device), [`MemDevice`] fills its memory; both trace it as one
    /// [`TraceOp::Zero`].
    fn zero_blocks(&self, block: u64, count: u64) -> io::Result<()> {
        write_zeros(self, block, count)
    }
    /// Durability barrier: every write that returned before this call is durable when it
    /// returns (fdatasync / BLKFLSBUF semantics).
    fn flush(&self) -> io::Result<()>;
    /// The device's always-on I/O counters.
    fn counters(&self) -> &DeviceCounters;
    /// Installs (`Some`) or removes (`None`) a trace sink. Cheap when none is installed.
    fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>);
    /// What the mechanical-disk model under this device did ([`disk::Disk`]), if there is
    /// one: busy time, seeks, rotations, per operation. Wrappers pass it through.
    fn disk_stats(&self) -> Option<disk::DiskStats> {
        None
    }
}

/// Largest buffer of zeros [`write_zeros`] writes at a time.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

/// [`BlockDevice::zero_blocks`] as plain writes of zeros, at most [`ZERO_CHUNK_BYTES`] (or
/// one block, if larger) per write: the default, and the fallback of a device whose kernel
/// call is refused.
pub fn write_zeros<D: BlockDevice + ?Sized>(dev: &D, block: u64, count: u64) -> io::Result<()> {
    let bs = u64::from(dev.block_size());
    check_range(dev.num_blocks(), block, count)?;
    let per = (ZERO_CHUNK_BYTES / bs).max(1).min(count.max(1));
    let zeros = vec![0u8; (per * bs) as usize];
    let mut at = block;
    let end = block + count;
    while at < end {
        let n = per.min(end - at);
        dev.write_blocks(at, &zeros[..(n * bs) as usize])?;
        at += n;
    }
    Ok(())
}

/// Cumulative I/O counters of a device.
///
/// Relaxed atomics: each counter is exact, but a snapshot taken while I/O is in flight may mix
/// counts from slightly different moments. That is fine for statistics and keeps the cost of
/// counting at a few uncontended atomic adds per operation.
///
/// An access is a *seek* when it does not start at the block right after the end of the
/// previous access of any kind (read or write); flushes do not move the position. The first
/// access counts as a seek unless it starts at block 0.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    blocks_read: AtomicU64,
    blocks_written: AtomicU64,
    read_seeks: AtomicU64,
    write_seeks: AtomicU64,
    /// Writes that were zero-range requests (also counted in `writes`).
    zeroes: AtomicU64,
    /// The block right after the end of the previous access.
    next_block: AtomicU64,
}

impl DeviceCounters {
    /// A consistent-enough copy of the counters (see the type's documentation).
    pub fn snapshot(&self) -> CounterSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CounterSnapshot {
            reads: r(&self.reads),
            writes: r(&self.writes),
            flushes: r(&self.flushes),
            bytes_read: r(&self.bytes_read),
            bytes_written: r(&self.bytes_written),
            blocks_read: r(&self.blocks_read),
            blocks_written: r(&self.blocks_written),
            read_seeks: r(&self.read_seeks),
            write_seeks: r(&self.write_seeks),
            zeroes: r(&self.zeroes),
        }
    }

    /// Counts one completed read of `blocks` blocks (`bytes` bytes) at `block`.
    pub fn note_read(&self, block: u64, blocks: u64, bytes: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        self.blocks_read.fetch_add(blocks, Ordering::Relaxed);
        if self.moved(block, blocks) {
            self.read_seeks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one completed write of `blocks` blocks (`bytes` bytes) at `block`.
    pub fn note_write(&self, block: u64, blocks: u64, bytes: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        self.blocks_written.fetch_add(blocks, Ordering::Relaxed);
        if self.moved(block, blocks) {
            self.write_seeks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one completed zero-range request of `blocks` blocks (`bytes` bytes) at
    /// `block`: a write of that many blocks, and one zero request.
    pub fn note_zero(&self, block: u64, blocks: u64, bytes: u64) {
        self.note_write(block, blocks, bytes);
        self.zeroes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one completed flush.
    pub fn note_flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the new position and says whether reaching `block` needed a seek.
    fn moved(&self, block: u64, blocks: u64) -> bool {
        let prev = self
            .next_block
            .swap(block.saturating_add(blocks), Ordering::Relaxed);
        prev != block
    }
}

/// A copy of [`DeviceCounters`] at one moment.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub blocks_read: u64,
    pub blocks_written: u64,
    pub read_seeks: u64,
    pub write_seeks: u64,
    /// Of `writes`, the zero-range requests ([`BlockDevice::zero_blocks`] done by the
    /// device itself, with no buffer of zeros).
    #[serde(default)]
    pub zeroes: u64,
}

impl CounterSnapshot {
    /// What happened between `earlier` and `self` (saturating, so a mismatched pair gives
    /// zeros rather than a panic).
    pub fn delta(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            flushes: self.flushes.saturating_sub(earlier.flushes),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            blocks_read: self.blocks_read.saturating_sub(earlier.blocks_read),
            blocks_written: self.blocks_written.saturating_sub(earlier.blocks_written),
            read_seeks: self.read_seeks.saturating_sub(earlier.read_seeks),
            write_seeks: self.write_seeks.saturating_sub(earlier.write_seeks),
            zeroes: self.zeroes.saturating_sub(earlier.zeroes),
        }
    }
}

/// The kind of a traced operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum TraceOp {
    Read,
    Write,
    /// A zero-range request ([`BlockDevice::zero_blocks`]): a write of zeros to `blocks`
    /// blocks, traced with no data (a recorder logs a block of zeros for each).
    Zero,
    Flush,
}

/// One completed device operation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceEvent {
    pub op: TraceOp,
    /// First block (0 for a flush).
    pub block: u64,
    /// Number of blocks (0 for a flush).
    pub blocks: u32,
    /// When the operation started, measured from the moment the device was opened.
    pub at: Duration,
}

/// Receives every completed operation of a device it is installed on.
///
/// `record` runs synchronously on the thread doing the I/O, after the operation succeeded
/// (failed operations are not traced), so it must be quick and must not call back into the
/// device.
pub trait TraceSink: Send + Sync {
    /// `data` holds the written bytes for writes (so a crash recorder can log contents),
    /// `None` for reads, flushes and zero-range writes (whose bytes are all zero).
    fn record(&self, ev: &TraceEvent, data: Option<&[u8]>);
}

/// A trace sink that keeps events (and optionally written data) in memory.
#[derive(Debug, Default)]
pub struct VecTrace {
    keep_data: bool,
    records: parking_lot::Mutex<Vec<(TraceEvent, Option<Vec<u8>>)>>,
}

impl VecTrace {
    /// Keeps events only.
    pub fn new() -> VecTrace {
        VecTrace::default()
    }

    /// Keeps events and a copy of every write's data.
    pub fn with_data() -> VecTrace {
        VecTrace {
            keep_data: true,
            records: Default::default(),
        }
    }

    /// The events recorded so far, in completion order.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.records.lock().iter().map(|(e, _)| e.clone()).collect()
    }

    /// Events with their written data (always `None` unless built with [`VecTrace::with_data`]).
    pub fn records(&self) -> Vec<(TraceEvent, Option<Vec<u8>>)> {
        self.records.lock().clone()
    }

    /// Removes and returns the recorded events.
    pub fn take(&self) -> Vec<TraceEvent> {
        std::mem::take(&mut *self.records.lock())
            .into_iter()
            .map(|(e, _)| e)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.records.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&self) {
        self.records.lock().clear();
    }
}

impl TraceSink for VecTrace {
    fn record(&self, ev: &TraceEvent, data: Option<&[u8]>) {
        let data = if self.keep_data {
            data.map(<[u8]>::to_vec)
        } else {
            None
        };
        self.records.lock().push((ev.clone(), data));
    }
}

/// The bookkeeping every device shares: geometry checks, counters and the trace hook.
///
/// Public so that devices outside this crate (the crash harness's emulated device) count and
/// trace exactly like the built-in ones.
pub struct DeviceCore {
    block_size: u32,
    num_blocks: u64,
    counters: DeviceCounters,
    opened: Instant,
    /// Lets the hot path skip the trace lock entirely when no sink is installed.
    tracing: AtomicBool,
    sink: parking_lot::RwLock<Option<Arc<dyn TraceSink>>>,
}

impl std::fmt::Debug for DeviceCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCore")
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks)
            .field("tracing", &self.tracing.load(Ordering::Relaxed))
            .finish()
    }
}

impl DeviceCore {
    /// Fails with `InvalidInput` unless `block_size` is a power of two within
    /// [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`].
    pub fn new(block_size: u32, num_blocks: u64) -> io::Result<DeviceCore> {
        check_block_size(block_size)?;
        Ok(DeviceCore {
            block_size,
            num_blocks,
            counters: DeviceCounters::default(),
            opened: Instant::now(),
            tracing: AtomicBool::new(false),
            sink: parking_lot::RwLock::new(None),
        })
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    pub fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    /// Validates a transfer of `len` bytes at `block` and returns its byte offset and block
    /// count.
    pub fn check(&self, block: u64, len: usize) -> io::Result<(u64, u64)> {
        let bs = u64::from(self.block_size);
        let len = len as u64;
        if !len.is_multiple_of(bs) {
            return Err(invalid(format!(
                "transfer of {len} bytes is not a multiple of the block size {bs}"
            )));
        }
        let blocks = len / bs;
        check_range(self.num_blocks, block, blocks)?;
        Ok((block * bs, blocks))
    }

    /// The current time relative to the device's opening, for [`TraceEvent::at`].
    pub fn now(&self) -> Duration {
        self.opened.elapsed()
    }

    /// Whether a trace sink is installed (so callers can skip taking timestamps).
    pub fn tracing(&self) -> bool {
        self.tracing.load(Ordering::Relaxed)
    }

    pub fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>) {
        let mut slot = self.sink.write();
        self.tracing.store(sink.is_some(), Ordering::Relaxed);
        *slot = sink;
    }

    /// Counts and traces a completed read that started at `at`.
    pub fn done_read(&self, block: u64, blocks: u64, at: Duration) {
        let bytes = blocks * u64::from(self.block_size);
        self.counters.note_read(block, blocks, bytes);
        self.trace(TraceOp::Read, block, blocks, at, None);
    }

    /// Counts and traces a completed write of `data` that started at `at`.
    pub fn done_write(&self, block: u64, data: &[u8], at: Duration) {
        let blocks = data.len() as u64 / u64::from(self.block_size);
        self.counters.note_write(block, blocks, data.len() as u64);
        self.trace(TraceOp::Write, block, blocks, at, Some(data));
    }

    /// Counts and traces a completed zero-range write of `blocks` blocks that started at
    /// `at`.
    pub fn done_zero(&self, block: u64, blocks: u64, at: Duration) {
        let bytes = blocks * u64::from(self.block_size);
        self.counters.note_zero(block, blocks, bytes);
        // An event counts its blocks in a u32: a larger range is traced in pieces.
        let mut at_blk = block;
        let end = block + blocks;
        while at_blk < end {
            let n = (end - at_blk).min(u64::from(u32::MAX));
            self.trace(TraceOp::Zero, at_blk, n, at, None);
            at_blk += n;
        }
    }

    /// Validates a zero-range request of `count` blocks at `block`; its byte offset.
    pub fn check_range(&self, block: u64, count: u64) -> io::Result<u64> {
        check_range(self.num_blocks, block, count)?;
        Ok(block * u64::from(self.block_size))
    }

    /// Counts and traces a completed flush that started at `at`.
    pub fn done_flush(&self, at: Duration) {
        self.counters.note_flush();
        self.trace(TraceOp::Flush, 0, 0, at, None);
    }

    fn trace(&self, op: TraceOp, block: u64, blocks: u64, at: Duration, data: Option<&[u8]>) {
        if !self.tracing() {
            return;
        }
        // Clone the Arc so the sink runs without the slot lock held: a sink that takes a while
        // must not block set_trace, and set_trace from inside a sink must not deadlock.
        let sink = self.sink.read().clone();
        if let Some(sink) = sink {
            let ev = TraceEvent {
                op,
                block,
                blocks: u32::try_from(blocks).unwrap_or(u32::MAX),
                at,
            };
            sink.record(&ev, data);
        }
    }
}

/// `InvalidInput` unless blocks `block..block + count` lie on a device of `num_blocks`.
fn check_range(num_blocks: u64, block: u64, count: u64) -> io::Result<()> {
    match block.checked_add(count) {
        Some(end) if end <= num_blocks => Ok(()),
        _ => Err(invalid(format!(
            "blocks {block}..+{count} out of range (device has {num_blocks} blocks)"
        ))),
    }
}

fn check_block_size(block_size: u32) -> io::Result<()> {
    if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
        return Err(invalid(format!(
            "block size {block_size} is not a power of two between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE}"
        )));
    }
    Ok(())
}

pub(crate) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeks_count_non_contiguous_accesses_of_any_kind() {
        let c = DeviceCounters::default();
        c.note_read(0, 2, 0); // starts at 0: no seek
        c.note_write(2, 1, 0); // right after the read: no seek
        c.note_read(3, 1, 0); // right after the write: no seek
        c.note_flush(); // does not move the position
        c.note_write(4, 1, 0); // contiguous
        c.note_write(4, 1, 0); // rewrite of the same block: seek
        c.note_read(10, 1, 0); // jump forward: seek
        c.note_read(9, 1, 0); // jump backward: seek
        let s = c.snapshot();
        assert_eq!((s.reads, s.writes, s.flushes), (4, 3, 1));
        assert_eq!((s.read_seeks, s.write_seeks), (2, 1));
    }

    #[test]
    fn first_access_away_from_zero_is_a_seek() {
        let c = DeviceCounters::default();
        c.note_write(7, 1, 0);
        assert_eq!(c.snapshot().write_seeks, 1);
    }

    #[test]
    fn delta_subtracts_fieldwise_and_saturates() {
        let a = CounterSnapshot {
            reads: 5,
            bytes_written: 100,
            ..Default::default()
        };
        let b = CounterSnapshot {
            reads: 7,
            bytes_written: 150,
            flushes: 1,
            ..Default::default()
        };
        let d = b.delta(&a);
        assert_eq!(d.reads, 2);
        assert_eq!(d.bytes_written, 50);
        assert_eq!(d.flushes, 1);
        assert_eq!(a.delta(&b), CounterSnapshot::default());
    }

    #[test]
    fn block_size_must_be_a_sane_power_of_two() {
        for bs in [0, 1, 256, 1000, 4097, MAX_BLOCK_SIZE * 2] {
            assert_eq!(
                DeviceCore::new(bs, 1).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{bs}"
            );
        }
        for bs in [512, 4096, 65536] {
            DeviceCore::new(bs, 1).unwrap();
        }
    }

    #[test]
    fn check_rejects_partial_blocks_and_overflow() {
        let core = DeviceCore::new(512, 10).unwrap();
        assert_eq!(core.check(0, 512 * 10).unwrap(), (0, 10));
        assert_eq!(core.check(9, 512).unwrap(), (9 * 512, 1));
        assert!(core.check(0, 100).is_err());
        assert!(core.check(10, 512).is_err());
        assert!(core.check(9, 1024).is_err());
        assert!(core.check(u64::MAX, 512).is_err());
        assert_eq!(core.check(10, 0).unwrap(), (10 * 512, 0));
        assert!(core.check(11, 0).is_err());
    }

    #[test]
    fn vec_trace_keeps_data_only_when_asked() {
        let ev = TraceEvent {
            op: TraceOp::Write,
            block: 3,
            blocks: 1,
            at: Duration::ZERO,
        };
        let plain = VecTrace::new();
        plain.record(&ev, Some(&[1, 2]));
        assert_eq!(plain.records()[0].1, None);
        let full = VecTrace::with_data();
        full.record(&ev, Some(&[1, 2]));
        assert_eq!(full.records()[0].1.as_deref(), Some(&[1u8, 2][..]));
        assert_eq!(full.take(), vec![ev]);
        assert!(full.is_empty());
    }
}
