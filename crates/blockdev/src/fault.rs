//! Fault injection for error-path tests.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::{BlockDevice, DeviceCounters, TraceSink};

/// Wraps a device and makes writes and flushes fail with `EIO` once a budget of successful
/// write/flush operations is used up (and, optionally, reads too).
///
/// The budget counts operations, not blocks: `fail_after(n)` lets exactly `n` more writes or
/// flushes through, then every later one fails until [`FaultDevice::heal`]. A failed write
/// changes nothing on the inner device. Counters and traces are the inner device's, so they
/// show only what really reached it.
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    /// Remaining successful writes/flushes; `u64::MAX` means unlimited.
    budget: AtomicU64,
    fail_reads: AtomicBool,
    attempts: AtomicU64,
    injected: AtomicU64,
}

const UNLIMITED: u64 = u64::MAX;

impl FaultDevice {
    /// A pass-through wrapper that fails nothing until told to.
    pub fn new(inner: Arc<dyn BlockDevice>) -> FaultDevice {
        FaultDevice {
            inner,
            budget: AtomicU64::new(UNLIMITED),
            fail_reads: AtomicBool::new(false),
            attempts: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }

    /// A wrapper that lets `n` writes/flushes succeed and fails the rest.
    pub fn fail_after(inner: Arc<dyn BlockDevice>, n: u64) -> FaultDevice {
        let d = FaultDevice::new(inner);
        d.set_fail_after(Some(n));
        d
    }

    /// `Some(n)`: the next `n` writes/flushes succeed, later ones fail. `None`: never fail.
    pub fn set_fail_after(&self, n: Option<u64>) {
        self.budget.store(
            n.map_or(UNLIMITED, |n| n.min(UNLIMITED - 1)),
            Ordering::SeqCst,
        );
    }

    /// Makes reads fail with `EIO` too (they are not counted against the budget).
    pub fn set_fail_reads(&self, fail: bool) {
        self.fail_reads.store(fail, Ordering::SeqCst);
    }

    /// Stops injecting failures.
    pub fn heal(&self) {
        self.set_fail_after(None);
        self.set_fail_reads(false);
    }

    /// Write and flush calls seen so far, failed or not.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Failures injected so far (reads included).
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// Takes one unit of budget; an error when there is none left.
    fn admit(&self) -> io::Result<()> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let ok = self
            .budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| match b {
                UNLIMITED => Some(UNLIMITED),
                0 => None,
                b => Some(b - 1),
            })
            .is_ok();
        if ok { Ok(()) } else { Err(self.eio()) }
    }

    fn eio(&self) -> io::Error {
        self.injected.fetch_add(1, Ordering::SeqCst);
        io::Error::from_raw_os_error(libc::EIO)
    }
}

impl BlockDevice for FaultDevice {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }

    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(self.eio());
        }
        self.inner.read_blocks(block, buf)
    }

    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()> {
        self.admit()?;
        self.inner.write_blocks(block, buf)
    }

    fn flush(&self) -> io::Result<()> {
        self.admit()?;
        self.inner.flush()
    }

    fn counters(&self) -> &DeviceCounters {
        self.inner.counters()
    }

    fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>) {
        self.inner.set_trace(sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    #[test]
    fn fails_writes_and_flushes_after_budget_until_healed() {
        let mem = Arc::new(MemDevice::new(512, 4));
        let d = FaultDevice::fail_after(mem.clone(), 2);
        d.write_blocks(0, &[1; 512]).unwrap();
        d.flush().unwrap();
        let err = d.write_blocks(1, &[2; 512]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert_eq!(d.flush().unwrap_err().raw_os_error(), Some(libc::EIO));
        // The failed write did not reach the device; reads still work.
        let mut b = [0; 512];
        d.read_blocks(1, &mut b).unwrap();
        assert_eq!(b, [0; 512]);
        assert_eq!((d.attempts(), d.injected()), (4, 2));
        assert_eq!(mem.counters().snapshot().writes, 1);

        d.heal();
        d.write_blocks(1, &[2; 512]).unwrap();
        d.read_blocks(1, &mut b).unwrap();
        assert_eq!(b, [2; 512]);
    }

    #[test]
    fn read_faults_and_zero_budget() {
        let d = FaultDevice::new(Arc::new(MemDevice::new(512, 4)));
        d.write_blocks(0, &[1; 512]).unwrap();
        d.set_fail_reads(true);
        assert_eq!(
            d.read_blocks(0, &mut [0; 512]).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        d.set_fail_after(Some(0));
        assert!(d.write_blocks(0, &[1; 512]).is_err());
        d.set_fail_after(None);
        d.write_blocks(0, &[1; 512]).unwrap();
    }
}
