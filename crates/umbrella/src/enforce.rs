//! The policy enforcer (§2.2, §5.4): walks every file of the namespace and moves the
//! misplaced ones. This is how rules on time (atime/mtime age) act, and how files come back
//! to a branch that was re-added. Throttled to a byte rate so it can run beside real work.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fs::Inner;
use crate::migrate::Outcome;

#[derive(Default)]
pub struct Job {
    pub total: AtomicU64,
    pub done: AtomicU64,
    pub moved: AtomicU64,
    pub failed: AtomicU64,
    pub bytes: AtomicU64,
    pub finished: AtomicBool,
    cancelled: AtomicBool,
    started: parking_lot::Mutex<Option<Instant>>,
    elapsed: parking_lot::Mutex<Option<Duration>>,
}

impl Job {
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    pub fn to_json(&self) -> Value {
        let elapsed = self
            .elapsed
            .lock()
            .or_else(|| self.started.lock().map(|s| s.elapsed()))
            .unwrap_or_default();
        json!({
            "total": self.total.load(Ordering::Relaxed),
            "done": self.done.load(Ordering::Relaxed),
            "moved": self.moved.load(Ordering::Relaxed),
            "failed": self.failed.load(Ordering::Relaxed),
            "bytes": self.bytes.load(Ordering::Relaxed),
            "finished": self.finished.load(Ordering::Acquire),
            "seconds": elapsed.as_secs_f64(),
        })
    }
}

impl Inner {
    /// Starts an enforcer run (or returns the one running). `rate` overrides the
    /// configured throttle (bytes per second).
    pub(crate) fn start_enforce(self: &Arc<Self>, rate: Option<u64>) -> Arc<Job> {
        let mut slot = self.enforce.lock();
        if let Some(j) = slot.as_ref()
            && !j.finished.load(Ordering::Acquire)
        {
            return j.clone();
        }
        let job = Arc::new(Job::default());
        *slot = Some(job.clone());
        let rate = rate.or(self.policy().enforce_rate);
        let inner = Arc::downgrade(self);
        let j = job.clone();
        let spawned = std::thread::Builder::new()
            .name("umbrella-enforce".into())
            .spawn(move || {
                if let Some(i) = inner.upgrade() {
                    i.run_enforce(&j, rate);
                }
                j.finished.store(true, Ordering::Release);
            });
        if spawned.is_err() {
            job.finished.store(true, Ordering::Release);
        }
        job
    }

    fn run_enforce(&self, job: &Job, rate: Option<u64>) {
        let start = Instant::now();
        *job.started.lock() = Some(start);
        let files = self.ns.read().files();
        job.total.store(files.len() as u64, Ordering::Relaxed);
        for (dir, name, b) in files {
            if job.cancelled.load(Ordering::Acquire) || self.stopping.load(Ordering::Acquire) {
                break;
            }
            let ino = match self.stat_entry(dir, &name, b) {
                Ok((_, st)) => Some(self.node_for_enforce(dir, &name, b, &st)),
                Err(_) => None,
            };
            if let Some(ino) = ino {
                match self.check_and_move(ino) {
                    Outcome::Moved(n) => {
                        job.moved.fetch_add(1, Ordering::Relaxed);
                        job.bytes.fetch_add(n, Ordering::Relaxed);
                    }
                    Outcome::Failed => {
                        job.failed.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Stayed | Outcome::Changed => {}
                }
            }
            job.done.fetch_add(1, Ordering::Relaxed);
            if let Some(r) = rate {
                // Sleep until the bytes moved so far fit the rate.
                let due =
                    Duration::from_secs_f64(job.bytes.load(Ordering::Relaxed) as f64 / r as f64);
                let el = start.elapsed();
                if due > el {
                    std::thread::sleep(due - el);
                }
            }
        }
        *job.elapsed.lock() = Some(start.elapsed());
    }
}
