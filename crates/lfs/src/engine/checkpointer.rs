//! When the last checkpoint was and where the next one goes (004 §4.1): two regions, used
//! alternately, each naming the log's position and the tables' blocks; a mount takes the
//! newer valid one.
//!
//! Invariants:
//! - `slot` is the region the last durable checkpoint was written to; the next one goes to
//!   the other, so a crash while writing it leaves this one whole;
//! - `serial` is that checkpoint's serial; the next one's is `serial + 1`;
//! - `log_bytes` counts what was pushed into the log since then (bounds roll-forward).

use std::time::{Duration, Instant};

pub(crate) struct Checkpointer {
    serial: u64,
    slot: usize,
    last: Instant,
    log_bytes: u64,
}

impl Checkpointer {
    pub fn new(serial: u64, slot: usize) -> Checkpointer {
        Checkpointer {
            serial,
            slot: slot.min(1),
            last: Instant::now(),
            log_bytes: 0,
        }
    }

    /// The serial of the last durable checkpoint.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The region the next checkpoint goes to.
    pub fn next_slot(&self) -> usize {
        1 - self.slot
    }

    /// `bytes` more were pushed into the log.
    pub fn logged(&mut self, bytes: u64) {
        self.log_bytes += bytes;
    }

    /// Bytes pushed into the log since the last checkpoint.
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes
    }

    /// Time since the last checkpoint.
    pub fn age(&self) -> Duration {
        self.last.elapsed()
    }

    /// The next checkpoint's region is durable.
    pub fn done(&mut self) {
        self.serial += 1;
        self.slot = 1 - self.slot;
        self.last = Instant::now();
        self.log_bytes = 0;
    }
}
