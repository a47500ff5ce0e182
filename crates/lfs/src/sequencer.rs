//! The log's sequencer: partial segments sealed under the engine's lock, written to the
//! device without it, by one writer at a time, in the order they were sealed.
//!
//! The log writer (`log.rs`) hands out a block's address when the block is pushed, and the
//! engine points inodes, the inode map and the usage table at it at once, under its lock —
//! so a block is *published* the moment it is pushed, and nothing is re-pointed when its
//! device write ends. What the engine's lock no longer covers is that write: a full or
//! committed partial segment is *sealed* under the lock — its place, serial and entries
//! fixed, its blocks handed over, not copied (`Sequencer::submit`, `log::Partial`) — and
//! assembled, hashed and written later, by the mount's log writer thread or by whoever
//! needs it on the device first (`Sequencer::wait`). A block
//! overwritten or freed while its old copy is in flight is simply no longer pointed at: the
//! in-flight bytes are immutable, so nothing written late can bring an old copy back.
//!
//! Invariants:
//! - partials reach the device in seal order, one device write each, and never two at once
//!   (the writer token): the device holds a prefix of the log as sealed, as it did when the
//!   writes were made under the lock;
//! - a sealed partial stays readable from memory ([`Sequencer::block`]) until its device
//!   write has completed, and leaves the index only after: a read that does not find an
//!   address here finds it on the device (the log writer dropped its cached copies when it
//!   sealed the partial, and no read asks the device for an address in flight);
//! - a segment holding a partial in flight is *held* ([`Sequencer::holds`]): no cleaning
//!   pass takes it as a victim (it would read it half-written and miss live blocks) and no
//!   checkpoint releases it (the log could otherwise take it and write over it while the
//!   first write is still queued);
//! - every device flush that must make log writes durable (a checkpoint's first flush,
//!   fsync's) is preceded by [`Sequencer::wait`] for every partial sealed before it;
//! - a failed device write stops the writes: nothing sealed after it is written (the device
//!   keeps a prefix of the log), its blocks stay readable from memory, and every wait and
//!   every later change gets the error — the engine refuses changes until a remount, which
//!   recovers the last committed flush on the device, as after a failed write under the
//!   lock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use cairn_blockdev::BlockDevice;
use parking_lot::{Condvar, Mutex, MutexGuard};
use rustc_hash::FxHashMap as HashMap;

use crate::format::BLOCK_SIZE;
use crate::log::Partial;

/// Bytes sealed and not yet written past which a call waits for the writer after letting
/// the engine's lock go (`Sequencer::throttle`): two 8 MiB flushes and a cleaning pass's
/// moved blocks fit; a writer that falls further behind slows the calls, not memory.
pub(crate) const IN_FLIGHT_LIMIT: u64 = 32 << 20;

/// A partial segment sealed and not yet on the device.
struct Sealed {
    /// Position in seal order.
    seq: u64,
    partial: Partial,
}

#[derive(Default)]
struct Queue {
    /// Partials sealed so far: the `seq` of the next one.
    sealed: u64,
    /// Every partial with `seq < written` is on the device.
    written: u64,
    /// Sealed, not yet written, oldest first.
    pending: VecDeque<Arc<Sealed>>,
    /// The same, by first block, for reads.
    by_addr: BTreeMap<u64, Arc<Sealed>>,
    /// Partials in flight per segment.
    holds: HashMap<u32, u32>,
    bytes: u64,
    /// The first failed device write (nothing after it is written).
    failed: Option<String>,
    /// The writer thread stops once everything sealed is written.
    stop: bool,
}

/// The sealed partial segments of one mount and the token of the one writer.
pub(crate) struct Sequencer {
    dev: Arc<dyn BlockDevice>,
    q: Mutex<Queue>,
    /// Signalled at every seal, every completed write and at stop.
    cv: Condvar,
    /// Held by whoever writes the next partial: two writes never run at once, and they run
    /// in seal order.
    token: Mutex<()>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Sequencer {
    /// A sequencer with its writer thread (a mount with background writers).
    pub(crate) fn start(dev: Arc<dyn BlockDevice>) -> Arc<Sequencer> {
        let s = Self::new(dev);
        let w = Arc::clone(&s);
        let h = std::thread::Builder::new()
            .name("lfs-log-writer".into())
            .spawn(move || w.run());
        if let Ok(h) = h {
            *s.thread.lock() = Some(h);
        }
        s
    }

    /// A sequencer without a thread: partials are written by whoever waits for them.
    pub(crate) fn new(dev: Arc<dyn BlockDevice>) -> Arc<Sequencer> {
        Arc::new(Sequencer {
            dev,
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            token: Mutex::new(()),
            thread: Mutex::new(None),
        })
    }

    /// Hands over a partial segment the log writer closed; returns its place in seal
    /// order. Called under the engine's lock: its summary's hash, its assembly and its
    /// device write are the writer's. The writer thread is woken only if `wake` (else by
    /// the next partial, or written by whoever waits for them: a background cleaning pass
    /// writes its own once each hold is over, `Sequencer::drain`).
    pub(crate) fn submit(&self, partial: Partial, wake: bool) -> u64 {
        let mut q = self.q.lock();
        let seq = q.sealed;
        q.sealed += 1;
        q.bytes += (partial.len() * BLOCK_SIZE) as u64;
        *q.holds.entry(partial.seg).or_insert(0) += 1;
        let at = partial.at;
        let s = Arc::new(Sealed { seq, partial });
        q.by_addr.insert(at, Arc::clone(&s));
        q.pending.push_back(s);
        drop(q);
        if wake {
            self.cv.notify_all();
        }
        seq
    }

    /// Partials sealed so far: what a device flush made now must wait for.
    pub(crate) fn sealed(&self) -> u64 {
        self.q.lock().sealed
    }

    /// Partials written so far (the first `written` sealed).
    #[cfg(test)]
    pub(crate) fn written(&self) -> u64 {
        self.q.lock().written
    }

    /// The bytes of block `addr` if it is in a partial still in flight.
    pub(crate) fn block(&self, addr: u64) -> Option<Vec<u8>> {
        let q = self.q.lock();
        if q.pending.is_empty() {
            return None;
        }
        let (&at, s) = q.by_addr.range(..=addr).next_back()?;
        s.partial.block((addr - at) as usize)
    }

    /// Is anything in flight at all (a read then looks its blocks up one by one)?
    pub(crate) fn any(&self) -> bool {
        !self.q.lock().pending.is_empty()
    }

    /// Does a partial in flight lie in segment `seg`?
    pub(crate) fn holds(&self, seg: u32) -> bool {
        self.q.lock().holds.contains_key(&seg)
    }

    /// The failed write that stopped the log, if any.
    pub(crate) fn failed(&self) -> Option<String> {
        self.q.lock().failed.clone()
    }

    /// Writes the oldest pending partial; the caller holds the token. False when there is
    /// nothing to write (or the log stopped at a failed write).
    fn write_one(&self, _token: &MutexGuard<'_, ()>) -> bool {
        let s = {
            let q = self.q.lock();
            if q.failed.is_some() {
                return false;
            }
            match q.pending.front() {
                Some(s) => Arc::clone(s),
                None => return false,
            }
        };
        let (at, seg) = (s.partial.at, s.partial.seg);
        let buf = s.partial.bytes();
        let r = self.dev.write_blocks(at, &buf);
        let mut q = self.q.lock();
        match r {
            Ok(()) => {
                let front = q.pending.pop_front();
                debug_assert!(
                    front.is_some_and(|f| f.seq == s.seq),
                    "written out of order"
                );
                // Only this partial's entry: a later one sealed at the same address (its
                // segment reused) stays readable until its own write.
                if q.by_addr.get(&at).is_some_and(|x| Arc::ptr_eq(x, &s)) {
                    q.by_addr.remove(&at);
                }
                if let Some(n) = q.holds.get_mut(&seg) {
                    *n -= 1;
                    if *n == 0 {
                        q.holds.remove(&seg);
                    }
                }
                q.bytes -= buf.len() as u64;
                q.written = s.seq + 1;
            }
            Err(e) => {
                ::log::error!("lfs: a log write at block {at} failed: {e}");
                q.failed = Some(format!("log write at block {at}: {e}"));
            }
        }
        drop(q);
        self.cv.notify_all();
        true
    }

    /// Waits until `done` holds of the queue, writing partials itself whenever no one else
    /// is (so a mount without a writer thread, or a writer thread not yet scheduled, never
    /// stalls a wait). Fails once a write failed.
    fn wait_for(&self, done: impl Fn(&Queue) -> bool) -> std::io::Result<()> {
        loop {
            {
                let q = self.q.lock();
                if done(&q) {
                    return Ok(());
                }
                if let Some(m) = &q.failed {
                    return Err(std::io::Error::other(format!(
                        "an earlier log write failed ({m}); remount to recover"
                    )));
                }
            }
            if let Some(t) = self.token.try_lock() {
                self.write_one(&t);
                continue;
            }
            let mut q = self.q.lock();
            if done(&q) || q.failed.is_some() {
                continue;
            }
            // Every completed write signals; the timeout only bounds a missed one.
            self.cv.wait_for(&mut q, Duration::from_millis(50));
        }
    }

    /// Waits until the first `upto` partials sealed are on the device (not yet durable:
    /// the caller's device flush makes them so).
    pub(crate) fn wait(&self, upto: u64) -> std::io::Result<()> {
        self.wait_for(|q| q.written >= upto)
    }

    /// Everything sealed so far on the device.
    pub(crate) fn drain(&self) -> std::io::Result<()> {
        let upto = self.sealed();
        self.wait(upto)
    }

    /// Called after a call let the engine's lock go: waits while more than
    /// `IN_FLIGHT_LIMIT` bytes are in flight, so a writer that falls behind slows the
    /// calls rather than filling memory.
    pub(crate) fn throttle(&self) -> std::io::Result<()> {
        if self.q.lock().bytes <= IN_FLIGHT_LIMIT {
            return Ok(());
        }
        self.wait_for(|q| q.bytes <= IN_FLIGHT_LIMIT)
    }

    /// The writer thread: writes each partial as it is sealed, until stopped with nothing
    /// left to write.
    fn run(&self) {
        loop {
            {
                let mut q = self.q.lock();
                while (q.pending.is_empty() || q.failed.is_some()) && !q.stop {
                    self.cv.wait(&mut q);
                }
                if q.stop && (q.pending.is_empty() || q.failed.is_some()) {
                    return;
                }
            }
            let t = self.token.lock();
            self.write_one(&t);
        }
    }

    /// Writes what is left and stops the writer thread (unmount, or the engine dropped).
    pub(crate) fn shutdown(&self) -> std::io::Result<()> {
        let r = self.drain();
        self.q.lock().stop = true;
        self.cv.notify_all();
        if let Some(h) = self.thread.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
        r
    }

    /// Holds the writer token: nothing is written until the guard drops (tests: keeps
    /// partials in flight while other calls run).
    #[cfg(test)]
    pub(crate) fn pause(&self) -> MutexGuard<'_, ()> {
        self.token.lock()
    }
}
