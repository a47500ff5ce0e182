//! Host calls of one branch, each with a deadline.
//!
//! A branch is a host directory, and past one machine it is a network or distributed file
//! system (NFS, GlusterFS, JuiceFS…) whose server can stop answering: a system call on it
//! then blocks in the kernel, uninterruptibly, until the server comes back. Such a call must
//! never be made by a thread the namespace depends on. So an *isolated* branch runs its host
//! calls on workers of its own ([`Exec`]): the caller hands the call over and waits at most
//! the branch's deadline (`branch_timeout`). A call that misses it is answered
//! [`CallError::Timeout`] (the caller applies the error semantics) and stays in its worker
//! until the host answers; its result is then dropped, or undone by the call's own undo
//! (a file created for a request that was already answered is removed again).
//!
//! Workers are bounded per branch ([`MAX_WORKERS`]). A branch whose workers are all stuck —
//! busy for longer than the deadline — answers at once ([`CallError::Unavailable`]): no
//! queue grows behind a dead server, and no caller waits for a call that cannot start.
//!
//! A hand-off costs two context switches (about 10 µs on the 2-core test machine, where a
//! local `fstatat` costs 1.7 µs and a whole FUSE request 20–30 µs), so branches on local
//! kernel file systems run their calls *inline* by default: on the caller's thread, without
//! a deadline (a local disk that stops answering stops the machine anyway). Which file
//! systems count as local is [`is_local_fs`]; `isolate = true|false` in a branch's
//! configuration overrides it. Health probes always run on a worker, whatever the mode.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Workers per branch: enough for the FUSE threads' concurrent calls plus a probe; the
/// bound on threads a dead server can hold.
pub const MAX_WORKERS: usize = 6;

/// The default deadline of a host call (`branch_timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a call of an isolated branch did not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// The call missed its deadline; it may still be running on a worker.
    Timeout,
    /// Every worker is stuck on an earlier call: the call was not started.
    Unavailable,
}

impl CallError {
    /// What the application sees when the call was its own (not a merged operation, where
    /// `and` leaves the branch out): EIO, as for a branch that failed.
    pub fn errno(self) -> i32 {
        libc::EIO
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// One call handed to a worker, and where its answer goes.
pub struct Slot<T> {
    state: Mutex<SlotState<T>>,
    cv: Condvar,
}

enum SlotState<T> {
    Waiting,
    Done(T),
    /// The caller gave up (deadline): the worker drops the result, or undoes it.
    Abandoned,
    Taken,
}

/// Per-worker "busy since" stamps (nanoseconds since `epoch`, 0 = idle).
struct Pool {
    name: String,
    queue: Mutex<VecDeque<Job>>,
    cv: Condvar,
    workers: AtomicUsize,
    idle: AtomicUsize,
    busy: Mutex<Vec<Arc<AtomicU64>>>,
    epoch: Instant,
    stop: AtomicBool,
}

impl Pool {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    fn worker(self: Arc<Self>, busy: Arc<AtomicU64>) {
        loop {
            let job = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(j) = q.pop_front() {
                        break Some(j);
                    }
                    if self.stop.load(Ordering::Acquire) {
                        break None;
                    }
                    self.idle.fetch_add(1, Ordering::AcqRel);
                    // Idle workers leave after a while, so a mount over many branches keeps
                    // few threads; the wait is not a deadline on anything outside.
                    let timed_out = self
                        .cv
                        .wait_for(&mut q, Duration::from_secs(30))
                        .timed_out();
                    self.idle.fetch_sub(1, Ordering::AcqRel);
                    if timed_out && q.is_empty() {
                        break None;
                    }
                }
            };
            let Some(job) = job else { break };
            busy.store(self.now(), Ordering::Release);
            job();
            busy.store(0, Ordering::Release);
        }
        self.busy.lock().retain(|b| !Arc::ptr_eq(b, &busy));
        self.workers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The executor of one branch.
pub struct Exec {
    pool: Arc<Pool>,
    /// Calls go through the workers (see the module comment).
    isolated: AtomicBool,
    timeout_ns: AtomicU64,
}

impl Exec {
    pub fn new(name: &str, isolated: bool, timeout: Duration) -> Exec {
        Exec {
            pool: Arc::new(Pool {
                name: name.to_string(),
                queue: Mutex::new(VecDeque::new()),
                cv: Condvar::new(),
                workers: AtomicUsize::new(0),
                idle: AtomicUsize::new(0),
                busy: Mutex::new(Vec::new()),
                epoch: Instant::now(),
                stop: AtomicBool::new(false),
            }),
            isolated: AtomicBool::new(isolated),
            timeout_ns: AtomicU64::new(timeout.as_nanos() as u64),
        }
    }

    pub fn isolated(&self) -> bool {
        self.isolated.load(Ordering::Relaxed)
    }

    pub fn set_isolated(&self, on: bool) {
        self.isolated.store(on, Ordering::Relaxed);
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    pub fn set_timeout(&self, t: Duration) {
        self.timeout_ns
            .store(t.as_nanos().max(1) as u64, Ordering::Relaxed);
    }

    /// Workers busy on one call for longer than the deadline, and workers in all.
    pub fn stuck(&self) -> (usize, usize) {
        let limit = self.timeout().as_nanos() as u64;
        let now = self.pool.now();
        let busy = self.pool.busy.lock();
        let stuck = busy
            .iter()
            .filter(|b| {
                let s = b.load(Ordering::Acquire);
                s != 0 && now.saturating_sub(s) > limit
            })
            .count();
        (stuck, busy.len())
    }

    /// How long the oldest call now running on a worker has been running (zero when every
    /// worker is idle). Calls still queued behind busy workers are not counted: they have
    /// not reached the host.
    pub fn oldest_call(&self) -> Duration {
        let now = self.pool.now();
        let busy = self.pool.busy.lock();
        let oldest = busy
            .iter()
            .map(|b| b.load(Ordering::Acquire))
            .filter(|&s| s != 0)
            .map(|s| now.saturating_sub(s))
            .max()
            .unwrap_or(0);
        Duration::from_nanos(oldest)
    }

    /// Runs `f` with the branch's deadline: inline when the branch is not isolated,
    /// otherwise on a worker.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, CallError> {
        if !self.isolated() {
            return Ok(f());
        }
        self.submit(f, None::<fn(T)>, self.timeout()).wait()
    }

    /// Like [`Exec::run`], but when the caller has given up by the time `f` returns, the
    /// worker passes the result to `undo` (a file made for a request already answered with
    /// an error is removed again).
    pub fn run_or_undo<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
        undo: impl FnOnce(T) + Send + 'static,
    ) -> Result<T, CallError> {
        if !self.isolated() {
            return Ok(f());
        }
        self.submit(f, Some(undo), self.timeout()).wait()
    }

    /// Runs `f` on a worker whatever the mode (health probes), with deadline `timeout`.
    pub fn probe<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
        timeout: Duration,
    ) -> Result<T, CallError> {
        self.submit(f, None::<fn(T)>, timeout).wait()
    }

    /// Starts `f` (inline: runs it now) and returns the answer to wait for: merged
    /// operations start their calls on every branch before waiting for any.
    pub fn start<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Pending<T> {
        if !self.isolated() {
            return Pending::Ready(Some(f()));
        }
        self.submit(f, None::<fn(T)>, self.timeout())
    }

    fn submit<T: Send + 'static, U: FnOnce(T) + Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
        undo: Option<U>,
        timeout: Duration,
    ) -> Pending<T> {
        let deadline = Instant::now() + timeout;
        let p = &self.pool;
        let (stuck, total) = self.stuck();
        if total >= MAX_WORKERS && stuck == total {
            return Pending::Failed(CallError::Unavailable);
        }
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState::Waiting),
            cv: Condvar::new(),
        });
        let s = slot.clone();
        let job: Job = Box::new(move || {
            // A call whose caller left before it started is not made at all.
            if matches!(*s.state.lock(), SlotState::Abandoned) {
                return;
            }
            let v = f();
            let mut st = s.state.lock();
            match *st {
                SlotState::Abandoned => {
                    drop(st);
                    if let Some(u) = undo {
                        u(v);
                    }
                }
                _ => {
                    *st = SlotState::Done(v);
                    s.cv.notify_one();
                }
            }
        });
        p.queue.lock().push_back(job);
        if p.idle.load(Ordering::Acquire) > 0 {
            p.cv.notify_one();
        } else if p.workers.load(Ordering::Acquire) < MAX_WORKERS {
            p.workers.fetch_add(1, Ordering::AcqRel);
            let busy = Arc::new(AtomicU64::new(0));
            p.busy.lock().push(busy.clone());
            let pool = p.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("umb-{}", p.name))
                .spawn(move || pool.worker(busy));
            if spawned.is_err() {
                p.workers.fetch_sub(1, Ordering::AcqRel);
            }
        } else {
            p.cv.notify_one();
        }
        Pending::Queued(slot, deadline)
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.pool.stop.store(true, Ordering::Release);
        self.pool.cv.notify_all();
    }
}

/// A call started by [`Exec::start`].
pub enum Pending<T> {
    Ready(Option<T>),
    Failed(CallError),
    Queued(Arc<Slot<T>>, Instant),
}

impl<T> Pending<T> {
    /// The answer, or the reason there is none by the deadline.
    pub fn wait(self) -> Result<T, CallError> {
        match self {
            Pending::Ready(v) => Ok(v.expect("ready once")),
            Pending::Failed(e) => Err(e),
            Pending::Queued(slot, deadline) => {
                let mut st = slot.state.lock();
                loop {
                    match std::mem::replace(&mut *st, SlotState::Taken) {
                        SlotState::Done(v) => return Ok(v),
                        SlotState::Waiting => *st = SlotState::Waiting,
                        other => {
                            *st = other;
                            return Err(CallError::Timeout);
                        }
                    }
                    if slot.cv.wait_until(&mut st, deadline).timed_out() {
                        if let SlotState::Done(v) = std::mem::replace(&mut *st, SlotState::Taken) {
                            return Ok(v);
                        }
                        *st = SlotState::Abandoned;
                        return Err(CallError::Timeout);
                    }
                }
            }
        }
    }
}

/// Flattens a call's answer into an `io::Result`: a missed deadline or a branch whose
/// workers are all stuck is EIO to the caller (the branch's health records which).
pub fn flat<T>(r: Result<io::Result<T>, CallError>) -> io::Result<T> {
    match r {
        Ok(r) => r,
        Err(e) => Err(io::Error::from_raw_os_error(e.errno())),
    }
}

/// File systems whose calls cannot block on anything but this machine's own devices:
/// branches on them run their calls inline (see the module comment). Everything else —
/// NFS, CIFS, Ceph, FUSE (GlusterFS, JuiceFS, MooseFS, sshfs, another cairn), 9p,
/// unknown types — is isolated.
pub fn is_local_fs(f_type: i64) -> bool {
    const LOCAL: &[i64] = &[
        0xEF53,      // ext2/3/4
        0x5846_5342, // xfs
        0x9123_683E, // btrfs
        0x0102_1994, // tmpfs
        0x858_458F6, // ramfs
        0xF2F5_2010, // f2fs
        0x2FC1_2FC1, // zfs
        0x4d44,      // vfat
        0x5346_544e, // ntfs3
        0x2011_BAB0, // exfat
        0x794c_7630, // overlayfs
        0x3153_464a, // jfs
        0x5265_4973, // reiserfs
        0xCA45_1A4E, // bcachefs
    ];
    LOCAL.contains(&f_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_past_its_deadline_is_answered_and_undone_later() {
        let e = Exec::new("t", true, Duration::from_millis(100));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let undone = Arc::new(AtomicBool::new(false));
        let (g, u) = (gate.clone(), undone.clone());
        let t = Instant::now();
        let r = e.run_or_undo(
            move || {
                let mut open = g.0.lock();
                while !*open {
                    g.1.wait(&mut open);
                }
                7
            },
            move |v| {
                assert_eq!(v, 7);
                u.store(true, Ordering::Release);
            },
        );
        assert_eq!(r, Err(CallError::Timeout));
        assert!(t.elapsed() < Duration::from_secs(2));
        // A quick call still answers while the first is stuck (another worker takes it).
        assert_eq!(e.run(|| 5), Ok(5));
        *gate.0.lock() = true;
        gate.1.notify_all();
        let t = Instant::now();
        while !undone.load(Ordering::Acquire) {
            assert!(t.elapsed() < Duration::from_secs(5), "undo never ran");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_branch_whose_workers_are_all_stuck_fails_fast() {
        let e = Exec::new("t", true, Duration::from_millis(50));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        for _ in 0..MAX_WORKERS {
            let g = gate.clone();
            let _ = e.run(move || {
                let mut open = g.0.lock();
                while !*open {
                    g.1.wait(&mut open);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(60));
        let t = Instant::now();
        assert_eq!(e.run(|| 1), Err(CallError::Unavailable));
        assert!(t.elapsed() < Duration::from_millis(20));
        *gate.0.lock() = true;
        gate.1.notify_all();
        let t = Instant::now();
        while e.run(|| 1) != Ok(1) {
            assert!(t.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_oldest_running_call_is_measured() {
        let e = Exec::new("t", true, Duration::from_secs(5));
        assert_eq!(e.oldest_call(), Duration::ZERO);
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        let p = e.start(move || {
            let mut open = g.0.lock();
            while !*open {
                g.1.wait(&mut open);
            }
        });
        let t = Instant::now();
        while e.oldest_call() < Duration::from_millis(30) {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the call never counted"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        *gate.0.lock() = true;
        gate.1.notify_all();
        assert_eq!(p.wait(), Ok(()));
        let t = Instant::now();
        while e.oldest_call() != Duration::ZERO {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the worker stayed busy"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn inline_runs_on_the_caller() {
        let e = Exec::new("t", false, Duration::from_millis(1));
        let me = std::thread::current().id();
        assert_eq!(e.run(move || std::thread::current().id() == me), Ok(true));
        // Probes use a worker even then.
        assert_eq!(
            e.probe(move || std::thread::current().id() == me, DEFAULT_TIMEOUT),
            Ok(false)
        );
    }
}
