//! Fault injection for error-path tests.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::{BlockDevice, DeviceCounters, TraceSink};

/// A class of device operation a planned fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    Read,
    Write,
    Flush,
}

impl FaultOp {
    fn index(self) -> usize {
        match self {
            FaultOp::Read => 0,
            FaultOp::Write => 1,
            FaultOp::Flush => 2,
        }
    }
}

/// A planned fault: fail the `nth` operation of its class counted from when it was armed.
#[derive(Clone, Copy, Debug)]
struct Plan {
    nth: u64,
    /// Keep failing every later operation of the class until healed (a dead device), rather
    /// than only the `nth` (a transient error).
    sticky: bool,
}

/// Wraps a device and makes operations fail with `EIO`, for error-path tests. Two ways:
///
/// - a *budget* ([`FaultDevice::fail_after`]): exactly `n` more writes or flushes succeed,
///   then every later one fails until [`FaultDevice::heal`] (and reads too with
///   [`FaultDevice::set_fail_reads`]);
/// - a *plan* per operation class ([`FaultDevice::fail_nth`]): the `n`-th read, write or
///   flush from now fails, alone (a transient error) or with every later one of its class
///   (a device that died).
///
/// The budget counts operations, not blocks. A failed write changes nothing on the inner
/// device. Counters and traces are the inner device's, so they show only what really
/// reached it.
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    /// Remaining successful writes/flushes; `u64::MAX` means unlimited.
    budget: AtomicU64,
    fail_reads: AtomicBool,
    attempts: AtomicU64,
    injected: AtomicU64,
    /// Per class (read, write, flush): the armed plan and the operations seen since.
    plans: Mutex<[(Option<Plan>, u64); 3]>,
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
            plans: Mutex::new([(None, 0); 3]),
        }
    }

    /// Fails the `nth` (1-based) operation of class `op` counted from now; with `sticky`,
    /// every later one of the class too, until [`FaultDevice::heal`]. Replaces an earlier
    /// plan for the class and restarts its count.
    pub fn fail_nth(&self, op: FaultOp, nth: u64, sticky: bool) {
        self.plans.lock()[op.index()] = (Some(Plan { nth, sticky }), 0);
    }

    /// Operations of class `op` seen since its plan was armed (or since creation/heal),
    /// failed or not.
    pub fn seen(&self, op: FaultOp) -> u64 {
        self.plans.lock()[op.index()].1
    }

    /// Counts one operation of class `op` against its plan; an error if the plan fails it.
    fn planned(&self, op: FaultOp) -> io::Result<()> {
        let fail = {
            let mut plans = self.plans.lock();
            let (plan, seen) = &mut plans[op.index()];
            *seen += 1;
            plan.is_some_and(|p| *seen == p.nth || (p.sticky && *seen > p.nth))
        };
        if fail { Err(self.eio()) } else { Ok(()) }
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

    /// Stops injecting failures: no budget, no plans (their counts restart at 0).
    pub fn heal(&self) {
        self.set_fail_after(None);
        self.set_fail_reads(false);
        *self.plans.lock() = [(None, 0); 3];
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
        self.planned(FaultOp::Read)?;
        self.inner.read_blocks(block, buf)
    }

    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()> {
        self.planned(FaultOp::Write)?;
        self.admit()?;
        self.inner.write_blocks(block, buf)
    }

    /// A write, for the budget and the plans; passed on as a zero-range request.
    fn zero_blocks(&self, block: u64, count: u64) -> io::Result<()> {
        self.planned(FaultOp::Write)?;
        self.admit()?;
        self.inner.zero_blocks(block, count)
    }

    fn flush(&self) -> io::Result<()> {
        self.planned(FaultOp::Flush)?;
        self.admit()?;
        self.inner.flush()
    }

    fn counters(&self) -> &DeviceCounters {
        self.inner.counters()
    }

    fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>) {
        self.inner.set_trace(sink);
    }

    fn disk_stats(&self) -> Option<crate::disk::DiskStats> {
        self.inner.disk_stats()
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
    fn planned_faults_fail_the_nth_operation_once_or_from_then_on() {
        let mem = Arc::new(MemDevice::new(512, 4));
        let d = FaultDevice::new(mem.clone());
        d.fail_nth(FaultOp::Write, 2, false);
        d.write_blocks(0, &[1; 512]).unwrap();
        assert!(d.write_blocks(1, &[2; 512]).is_err(), "the 2nd write fails");
        d.write_blocks(2, &[3; 512]).unwrap();
        d.flush().unwrap();
        assert_eq!(d.seen(FaultOp::Write), 3);
        // Sticky: the 2nd flush and every later one fail; writes are not affected.
        d.fail_nth(FaultOp::Flush, 2, true);
        d.flush().unwrap();
        assert!(d.flush().is_err());
        assert!(d.flush().is_err());
        d.write_blocks(3, &[4; 512]).unwrap();
        // Reads: the 1st read fails.
        d.fail_nth(FaultOp::Read, 1, false);
        let mut b = [0; 512];
        assert_eq!(
            d.read_blocks(0, &mut b).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        d.read_blocks(0, &mut b).unwrap();
        assert_eq!(b, [1; 512]);
        d.heal();
        d.flush().unwrap();
        assert_eq!(d.seen(FaultOp::Flush), 1, "heal restarts the counts");
        assert_eq!(d.injected(), 4);
        assert_eq!(
            mem.counters().snapshot().writes,
            3,
            "the failed write did nothing"
        );
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
