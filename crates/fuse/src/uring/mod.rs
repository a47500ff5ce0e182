//! FUSE over io_uring (Linux 6.14+, `Documentation/filesystems/fuse-io-uring.rst`): each
//! request is served on the CPU that issued it, with one system call per round trip.
//!
//! # How it works
//!
//! The kernel keeps one request queue per possible CPU and puts each request on the queue
//! of the CPU its caller runs on. The server registers *ring entries* on every queue: a
//! header buffer and a payload buffer, handed over with an io_uring command
//! (`IORING_OP_URING_CMD`, `FUSE_IO_URING_CMD_REGISTER`) on the /dev/fuse descriptor. A
//! request arrives as the completion of an entry's command, copied into its buffers; the
//! server answers in the same buffers and submits `COMMIT_AND_FETCH`, which delivers the
//! answer and hands the entry back for the next request, in one `io_uring_enter`. Against
//! the /dev/fuse transport (a `read` that wakes a server thread on whichever CPU it sleeps,
//! then a `write`), a round trip saves a system call and, with the queue's thread pinned to
//! the queue's CPU, the cross-CPU wake-up.
//!
//! Here: `uring_depth` entries per queue (default [`DEFAULT_DEPTH`]), each served by a
//! thread of its own with an io_uring of its own, every one pinned to the queue's CPU when
//! the daemon's affinity allows (a daemon started under `taskset` keeps its placement). With
//! one entry per queue a request that arrives while the entry's request is in the file
//! system waits in the kernel until that entry's commit fetches it; with several, it is
//! served at once by another entry, so a request that blocks (on the device, on a lock)
//! no longer holds up the others issued on its CPU. One thread per entry, not one thread
//! serving several entries, because the file system works synchronously: a thread holding
//! two requests still answers them in turn.
//!
//! Why every entry's thread is pinned: the kernel hands a request to the entry that became
//! available last, but the committing entry becomes available only after the answer has
//! woken the client (`fuse_uring_commit_fetch`: `fuse_uring_commit` ends the request, then
//! `fuse_uring_next_fuse_req` puts the entry back), and a client woken on the same CPU
//! often preempts the committing thread and sends its next request first. So a lone
//! client's requests alternate between a queue's entries. With the second entry's thread
//! free to run on another CPU, every other request of a client pinned to one CPU became a
//! cross-CPU wake-up and the client ran ~30% slower (docs/FUSE.md); pinned, the alternation
//! costs nothing measurable (the same CPU time per request as one entry). The price is that
//! two busy clients on one CPU still share that CPU: spreading them is the scheduler's job.
//!
//! # Choosing it
//!
//! INIT still goes over /dev/fuse. The kernel offers `FUSE_OVER_IO_URING` in INIT when its
//! `enable_uring` module parameter is on; the adapter then prepares the rings (io_uring
//! instances and buffers for every queue) *before* answering, so a machine without usable
//! io_uring is found out while the answer can still leave the flag out. Once the kernel has
//! the answer, no request is sent anywhere until every queue has an entry: the queue
//! threads start, register, and report; when all did, the mount is served over io_uring.
//! When a queue cannot register, the kernel is told to give up (a failed REGISTER clears
//! its io_uring flag, see `ring::refuse_rings`), and requests go over /dev/fuse.
//!
//! # What stays on /dev/fuse
//!
//! The kernel sends FORGET/BATCH_FORGET and INTERRUPT over /dev/fuse even when the rings
//! are ready, and notifications (server to kernel) are only possible there, so the
//! binding's /dev/fuse threads keep running beside the queues: they serve forgets, answer
//! interrupts (ENOSYS, as before) and notice when the connection ends.
//!
//! # Teardown
//!
//! Unmounting (or the daemon's death) aborts the connection: the kernel completes every
//! command it holds with ENOTCONN and fails every later commit. A queue thread leaves once
//! the kernel holds no command of its ring, which frees its buffers (see `ring` for why that
//! is the condition); the final flush (`FileSystem::destroy`) waits for every queue thread,
//! so no request is still running in the file system when it flushes. A teardown that
//! cannot wait for the kernel (the server dropped while the connection lives) stops the
//! threads through an eventfd each ring polls, closes the rings and leaks the buffers the
//! kernel still holds rather than freeing them under it.

mod abi;
mod reply;
mod request;
mod ring;

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use log::{debug, error, info, warn};
use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::sys::eventfd::EventFd;
use nix::unistd::Pid;
use parking_lot::Mutex;
use zerocopy::IntoBytes;

use crate::adapter::Adapter;
use abi::{EntInOut, InHeader, OutHeader};
use ring::{Ring, STOP};

/// Ring entries per queue unless `uring_depth=` says otherwise: two, so a request arriving
/// while another from the same CPU is in the file system (a second client, or a request
/// that blocks) is served at once, for one more thread and one more payload buffer
/// (`max_write`, 1 MiB by default) per CPU.
pub(crate) const DEFAULT_DEPTH: usize = 2;

/// The largest `uring_depth=`: every entry is a thread and a payload buffer per CPU.
pub(crate) const MAX_DEPTH: usize = 16;

/// How long the mount waits for every queue thread to register.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the kernel's switch lives.
pub(crate) const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// A passthrough backing file registered by this transport (`FUSE_DEV_IOC_BACKING_OPEN` on
/// the connection); dropping it unregisters it.
#[derive(Debug)]
pub(crate) struct RingBacking {
    id: u32,
    dev: Arc<File>,
}

impl RingBacking {
    pub(crate) fn open(dev: &Arc<File>, fd: BorrowedFd<'_>) -> io::Result<RingBacking> {
        let id = fuser::BackingId::create_raw(dev.as_fd(), fd)?;
        Ok(RingBacking {
            id,
            dev: dev.clone(),
        })
    }

    pub(crate) fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for RingBacking {
    fn drop(&mut self) {
        if let Err(e) = ring::backing_close(&self.dev, self.id) {
            debug!("closing backing id {}: {e}", self.id);
        }
    }
}

/// The number of request queues the kernel keeps: one per possible CPU
/// (`num_possible_cpus()`), read from /sys/devices/system/cpu/possible ("0-3", "0,2-5").
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(s.trim())
        .ok_or_else(|| io::Error::other(format!("cannot parse possible CPUs '{}'", s.trim())))
}

fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

/// The kernel switch's state, for log lines ("Y", "N", or why it is unknown).
pub(crate) fn enable_param() -> String {
    match std::fs::read_to_string(ENABLE_PARAM) {
        Ok(s) => s.trim().to_string(),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// The rings of every queue, made before INIT is answered.
pub(crate) struct Prepared {
    /// One ring (and later one thread) per entry: queue 0's entries first, then queue 1's.
    rings: Vec<Ring>,
    queues: usize,
    depth: usize,
}

impl Prepared {
    /// io_uring instances and buffers for `depth` entries on every queue; `payload_len`
    /// must hold the largest request or reply the kernel may send (it checks at REGISTER).
    pub(crate) fn new(payload_len: usize, depth: usize) -> io::Result<Prepared> {
        let n = possible_cpus()?;
        let n = u16::try_from(n).map_err(|_| io::Error::other("too many CPUs"))?;
        let depth = depth.clamp(1, MAX_DEPTH);
        let payload_len = payload_len.max(abi::MIN_PAYLOAD);
        let mut rings = Vec::with_capacity(usize::from(n) * depth);
        for q in 0..n {
            for slot in 0..depth {
                // `depth` is at most MAX_DEPTH, so the slot fits.
                rings.push(Ring::new(q, slot as u16, 1, payload_len)?);
            }
        }
        Ok(Prepared {
            rings,
            queues: usize::from(n),
            depth,
        })
    }

    pub(crate) fn queues(&self) -> usize {
        self.queues
    }

    /// Ring entries per queue.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// Starts the queue threads and registers every ring's entries. The pool comes back
    /// even on failure: threads whose entries did register serve nothing and leave when the
    /// connection ends.
    pub(crate) fn start(self, a: Arc<Adapter>, dev: Arc<File>) -> (Pool, Result<(), String>) {
        let allowed = sched_getaffinity(Pid::from_raw(0)).ok();
        let (tx, rx) = mpsc::channel();
        let mut pool = Pool {
            threads: Vec::new(),
            stops: Vec::new(),
        };
        let mut failure: Option<String> = None;
        let mut expected = 0;
        for r in self.rings {
            let (qid, slot) = (r.qid, r.slot);
            // Pin every entry's thread to the queue's CPU (module comment), but only where
            // the daemon may run: a daemon placed with taskset or a cpuset keeps its
            // placement, and a queue outside it is served from inside it.
            let cpu = usize::from(qid);
            let pin = allowed
                .as_ref()
                .is_some_and(|s| s.is_set(cpu).unwrap_or(false))
                .then_some(cpu);
            pool.stops.push(r.stopper());
            let (a, dev, tx) = (a.clone(), dev.clone(), tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("cairn-uring-{qid}.{slot}"))
                .spawn(move || queue_thread(r, a, dev, pin, tx));
            match spawned {
                Ok(t) => {
                    pool.threads.push(t);
                    expected += 1;
                }
                Err(e) => {
                    failure.get_or_insert(format!("queue {qid}: cannot start its thread: {e}"));
                }
            }
        }
        drop(tx);
        for _ in 0..expected {
            match rx.recv_timeout(REGISTER_TIMEOUT) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    failure.get_or_insert(e);
                }
                Err(_) => {
                    failure.get_or_insert("a queue did not report its registration".into());
                    break;
                }
            }
        }
        match failure {
            None => (pool, Ok(())),
            Some(why) => {
                // Whatever registered, the kernel must stop waiting for the rest.
                match ring::refuse_rings(&dev) {
                    Ok(res) => debug!("told the kernel to give up io_uring ({res})"),
                    Err(e) => error!("could not tell the kernel to give up io_uring: {e}"),
                }
                (pool, Err(why))
            }
        }
    }
}

/// The running queue threads.
pub(crate) struct Pool {
    threads: Vec<JoinHandle<()>>,
    stops: Vec<Arc<EventFd>>,
}

impl Pool {
    /// Waits for every queue thread; they leave once the connection has ended.
    pub(crate) fn join(self) {
        for t in self.threads {
            if t.join().is_err() {
                error!("an io_uring queue thread panicked");
            }
        }
    }

    /// Makes every queue thread leave now, whether or not the connection has ended (the
    /// buffers the kernel still holds are leaked, see `ring`), then waits for them.
    pub(crate) fn stop(self) {
        for s in &self.stops {
            let _ = s.write(1);
        }
        self.join();
    }

    /// Waits for the queue threads to leave on their own once the connection has ended,
    /// and stops those still waiting after `grace`. A thread leaves when the kernel has
    /// given back every command of its ring; should the kernel keep one (an abort racing a
    /// commit), the thread would wait in `io_uring_enter` for ever, and with it the final
    /// flush, the daemon's exit and the `cairn umount` waiting for that exit. The
    /// connection is gone, so no request can reach a stopped thread: stopping loses
    /// nothing but the buffers the kernel kept.
    pub(crate) fn join_within(self, grace: Duration) {
        let deadline = std::time::Instant::now() + grace;
        let mut pause = Duration::from_millis(1);
        while !self.threads.iter().all(|t| t.is_finished()) {
            if std::time::Instant::now() >= deadline {
                let left = self.threads.iter().filter(|t| !t.is_finished()).count();
                warn!(
                    "{left} io_uring queue thread(s) still waiting for the kernel {grace:?} \
                     after the connection ended; stopping them"
                );
                return self.stop();
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        self.join();
    }
}

/// How long the final flush waits for the queue threads to leave on their own after the
/// connection ended (`Pool::join_within`); they normally leave within milliseconds.
const TEARDOWN_GRACE: Duration = Duration::from_secs(5);

/// How a mount's transport was settled, handed from the binding's INIT callback (inside
/// `Session::from_fd`) to [`crate::Server::mount`], and the running pool on to the
/// final flush.
#[derive(Default)]
pub(crate) struct Handoff {
    offer: Mutex<Option<Offer>>,
    pool: Mutex<Option<Pool>>,
    /// The connection, to tell whether it still lives when the session ends.
    dev: Mutex<Option<Arc<File>>>,
}

/// What INIT decided about io_uring.
pub(crate) enum Offer {
    /// The rings are ready and INIT asked for `FUSE_OVER_IO_URING`.
    Prepared(Prepared),
    /// Not used, and why (the kernel did not offer it, the rings could not be made).
    Refused(String),
}

impl Handoff {
    pub(crate) fn set_offer(&self, o: Offer) {
        *self.offer.lock() = Some(o);
    }

    pub(crate) fn take_offer(&self) -> Option<Offer> {
        self.offer.lock().take()
    }

    pub(crate) fn set_pool(&self, p: Pool) {
        *self.pool.lock() = Some(p);
    }

    pub(crate) fn take_pool(&self) -> Option<Pool> {
        self.pool.lock().take()
    }

    pub(crate) fn set_dev(&self, dev: Arc<File>) {
        *self.dev.lock() = Some(dev);
    }

    /// Collects the queue threads once the /dev/fuse session has ended: normally the
    /// connection is gone and they leave on their own; if it still lives (the session ended
    /// on an error), they are stopped rather than waited for.
    pub(crate) fn finish(&self) {
        let Some(pool) = self.take_pool() else {
            return;
        };
        let alive = self
            .dev
            .lock()
            .as_ref()
            .is_some_and(|d| crate::mount::connected(d));
        if alive {
            warn!(
                "the /dev/fuse session ended while the connection lives; stopping the io_uring queues"
            );
            pool.stop();
        } else {
            pool.join_within(TEARDOWN_GRACE);
        }
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        // The server went away without the final flush having collected the threads.
        if let Some(p) = self.pool.get_mut().take() {
            p.stop();
        }
    }
}

/// How long a /dev/fuse thread pauses after a forget it had to wait for, while io_uring
/// serves the mount.
const FORGET_PACE: Duration = Duration::from_millis(5);

/// A forget handled within this of the previous one came in the same read (a BATCH_FORGET,
/// which the binding splits into one call per inode, or forgets already queued when the
/// thread read): no wait, so no wake-up, came before it.
const SAME_READ: Duration = Duration::from_micros(200);

/// Called by a /dev/fuse thread after it handled a FORGET (one inode of a BATCH_FORGET).
/// Over io_uring those threads get nothing but forgets and interrupts (the kernel sends
/// both over /dev/fuse only: `fuse_io_uring_ops.send_forget` is `fuse_dev_queue_forget`),
/// and a thread waiting in `read` is woken for every single forget: with a create+unlink
/// loop that is one wake-up, context switch and `read` per pair, about a tenth of the pair's
/// CPU time with client and daemon on one CPU (docs/FUSE.md, "Where the time goes"). So a
/// thread that was woken for a forget pauses before it reads again: meanwhile the kernel
/// only queues the forgets (nobody waits to be woken), and the next `read` takes them all
/// as one BATCH_FORGET. A forget may wait: it only lowers lookup counts, and it is
/// unordered against the ring's requests anyway. An interrupt or the end of the
/// connection is noticed up to `FORGET_PACE` later.
pub(crate) fn pace_forgets(a: &Adapter) {
    use std::cell::Cell;
    use std::time::Instant;
    thread_local! {
        /// When this thread last finished handling a forget.
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    if a.counts.transport().is_none_or(|t| t.active != "uring") {
        return;
    }
    let now = Instant::now();
    if LAST
        .get()
        .is_none_or(|t| now.duration_since(t) >= SAME_READ)
    {
        std::thread::sleep(FORGET_PACE);
    }
    LAST.set(Some(Instant::now()));
}

fn pin_to(cpu: usize) -> nix::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)
}

/// Whether a failed command means the connection is going away (not worth a warning).
fn is_teardown(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOTCONN | libc::ECANCELED | libc::ECONNABORTED | libc::ENODEV
    )
}

/// The command an entry last had with the kernel, to repeat it after EAGAIN/EINTR.
#[derive(Clone, Copy)]
enum Last {
    Register,
    Commit(u64),
}

/// One queue: pin, register, then serve until the kernel gives every entry back.
fn queue_thread(
    mut r: Ring,
    a: Arc<Adapter>,
    dev: Arc<File>,
    pin: Option<usize>,
    report: mpsc::Sender<Result<(), String>>,
) {
    // For log lines: queue and entry ("0.1").
    let qid = format!("{}.{}", r.qid, r.slot);
    if let Some(cpu) = pin
        && let Err(e) = pin_to(cpu)
    {
        debug!("queue {qid}: cannot pin to CPU {cpu}: {e}");
    }
    let mut last = vec![Last::Register; r.depth()];
    let mut cqes = Vec::new();
    let registered = r
        .enable()
        .map_err(|e| format!("enabling the ring: {e}"))
        .and_then(|()| {
            r.register_dev(&dev)
                .map_err(|e| format!("registering /dev/fuse: {e}"))
        })
        .and_then(|()| register(&mut r, &mut cqes));
    let _ = report.send(registered.map_err(|e| format!("queue {qid}: {e}")));
    drop(report);
    let mut scratch = Vec::new();
    let mut retries = vec![0u32; r.depth()];
    let mut stopping = false;
    loop {
        for (ud, res) in cqes.drain(..) {
            if ud == STOP {
                stopping = true;
                continue;
            }
            let i = ud as usize;
            if !r.in_kernel(i) {
                warn!("queue {qid}: completion for unknown entry {ud}");
                continue;
            }
            r.completed(i);
            if res == 0 {
                retries[i] = 0;
                if stopping {
                    continue;
                }
                match serve_one(&mut r, i, &a, &dev, &mut scratch) {
                    Some(id) => last[i] = Last::Commit(id),
                    None => continue,
                }
            } else if (res == -libc::EAGAIN || res == -libc::EINTR) && retries[i] < 100 {
                retries[i] += 1;
                let again = match last[i] {
                    Last::Register => r.push_register(i),
                    Last::Commit(id) => r.push_commit(i, id),
                };
                if let Err(e) = again {
                    error!("queue {qid}: cannot resubmit entry {i}: {e}");
                }
            } else if !is_teardown(-res) {
                warn!(
                    "queue {qid}: command failed: {}; entry {i} retired",
                    io::Error::from_raw_os_error(-res)
                );
            }
        }
        if stopping || r.outstanding() == 0 {
            break;
        }
        match r.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
            Err(e) => {
                error!("queue {qid}: io_uring_enter failed: {e}; leaving");
                break;
            }
        }
        r.reap(&mut cqes);
    }
    if r.outstanding() > 0 {
        info!(
            "queue {qid}: stopped with {} entries still with the kernel (their buffers are kept)",
            r.outstanding()
        );
    }
    debug!("queue {qid}: done");
}

/// Submits a REGISTER for every entry and the stop poll. A REGISTER the kernel refuses
/// completes at once with the reason; one it accepts completes only with a request, which
/// is left in `cqes` for the serving loop.
fn register(r: &mut Ring, cqes: &mut Vec<(u64, i32)>) -> Result<(), String> {
    for i in 0..r.depth() {
        r.push_register(i).map_err(|e| e.to_string())?;
    }
    r.push_stop_poll().map_err(|e| e.to_string())?;
    for attempt in 0.. {
        r.submit_and_wait(0)
            .map_err(|e| format!("io_uring_enter: {e}"))?;
        r.reap(cqes);
        let mut again = Vec::new();
        let mut back = Vec::new();
        let mut refused = None;
        cqes.retain(|&(ud, res)| {
            if ud == STOP || res >= 0 {
                return true;
            }
            if res == -libc::EAGAIN && attempt < 50 {
                again.push(ud as usize);
            } else {
                back.push(ud as usize);
                refused.get_or_insert(res);
            }
            false
        });
        // These commands are over: their entries are with us again.
        for &i in again.iter().chain(&back) {
            r.completed(i);
        }
        if let Some(res) = refused {
            // The kernel has dropped io_uring for the mount; entries that did register
            // complete with ENOTCONN when the connection ends.
            return Err(format!(
                "REGISTER refused: {}",
                io::Error::from_raw_os_error(-res)
            ));
        }
        if again.is_empty() {
            return Ok(());
        }
        // The kernel had not finished INIT yet (EAGAIN): try again shortly.
        std::thread::sleep(Duration::from_millis(10));
        for i in again {
            r.push_register(i).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Serves the request in entry `i` and queues its commit; the commit id, or `None` when the
/// entry cannot be committed (then it is retired).
fn serve_one(
    r: &mut Ring,
    i: usize,
    a: &Adapter,
    dev: &Arc<File>,
    scratch: &mut Vec<u8>,
) -> Option<u64> {
    let qid = r.qid;
    let (hdr, payload) = r.bufs(i)?;
    let h: InHeader = abi::read(&hdr[abi::HDR_IN_OUT..])?;
    let ent: EntInOut = abi::read(&hdr[abi::HDR_ENT_IN_OUT..])?;
    let commit_id = ent.commit_id;
    if commit_id == 0 {
        // The kernel could never match an answer to it; the request stays with the
        // kernel until the connection is aborted.
        error!(
            "queue {qid}: request without a commit id (opcode {})",
            h.opcode
        );
        return None;
    }
    a.counts.via_uring();
    let (error, len) = match request::arg0_len(&h, ent.payload_sz) {
        Some(n) => {
            let mut arg0 = [0u8; abi::HDR_OP_IN_LEN];
            arg0[..n].copy_from_slice(&hdr[abi::HDR_OP_IN..abi::HDR_OP_IN + n]);
            let sz = ent.payload_sz as usize;
            catch_unwind(AssertUnwindSafe(|| {
                request::serve(a, &h, &arg0[..n], payload, sz, scratch, dev)
            }))
            .unwrap_or_else(|_| {
                error!(
                    "queue {qid}: decoding opcode {} panicked; answered EIO",
                    h.opcode
                );
                (-libc::EIO, 0)
            })
        }
        None => {
            warn!(
                "queue {qid}: request lengths do not add up (opcode {}, len {}, payload {}); answered EIO",
                h.opcode, h.len, ent.payload_sz
            );
            (-libc::EIO, 0)
        }
    };
    let out = OutHeader {
        len: (std::mem::size_of::<OutHeader>() + len) as u32,
        error,
        unique: h.unique,
    };
    hdr[abi::HDR_IN_OUT..abi::HDR_IN_OUT + 16].copy_from_slice(out.as_bytes());
    let eio = EntInOut {
        commit_id,
        payload_sz: len as u32,
        ..Default::default()
    };
    hdr[abi::HDR_ENT_IN_OUT..abi::HDR_LEN].copy_from_slice(eio.as_bytes());
    match r.push_commit(i, commit_id) {
        Ok(()) => Some(commit_id),
        Err(e) => {
            error!("queue {qid}: cannot queue the answer: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0,2-5"), Some(5));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    /// A queue thread the kernel never lets go (it waits until its stop is signalled) is
    /// stopped after the grace, so the final flush and the daemon's exit go on; one that
    /// leaves by itself is simply joined. With `join` in place of `join_within` the first
    /// half waits for ever.
    #[test]
    fn a_queue_thread_the_kernel_keeps_is_stopped_after_the_grace() {
        let pool = |leaves_alone: bool| {
            let stop = Arc::new(EventFd::new().unwrap());
            let s = stop.clone();
            let t = std::thread::spawn(move || {
                if !leaves_alone {
                    let _ = s.read();
                }
            });
            Pool {
                threads: vec![t],
                stops: vec![stop],
            }
        };
        let t = std::time::Instant::now();
        pool(false).join_within(Duration::from_millis(100));
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(100) && took < Duration::from_secs(5),
            "{took:?}"
        );
        let t = std::time::Instant::now();
        pool(true).join_within(Duration::from_secs(30));
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
