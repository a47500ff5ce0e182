//! A mechanical disk under any device: the papers' hardware as a [`BlockDevice`] wrapper.
//!
//! [`Disk`] passes every read, write and flush to the device it wraps (the data goes where it
//! always goes, in the order it always would) and decides only *when* each request
//! completes: from the arm's position (seek time from the distance in cylinders), the
//! platter's angle (rotational latency), the zone's sectors per track (transfer), head
//! switches, the controller's overhead, the drive's read-ahead buffer and, when turned on,
//! its write cache. A disk serves one request at a time; requests that arrive while it is
//! busy wait in its queue, served in arrival order (`fifo`) or shortest seek first (`sstf`).
//!
//! Time is real by default: each request's thread sleeps until the model says the request is
//! done, so FUSE, the buffer cache and the daemon's CPU all take part, as on the papers'
//! machines. The model also keeps its own timeline (the *virtual clock*: when the disk would
//! have finished everything, had every sleep been exact) and its busy time, seeks, cylinders
//! travelled and rotations waited, per operation ([`DiskStats`]). With `time=virtual` nothing
//! sleeps and the virtual clock runs ahead of the real one by the service times.
//!
//! The write cache is off unless asked for (`:wcache`): a write completes when it is on the
//! platter, so a flush has nothing to wait for and costs nothing, as on the SCSI disks of
//! 000/001 and 004. With it on, a write completes when it is in the drive's buffer (the
//! mechanism writes it when it gets to it) and a flush waits until every cached write is on
//! the platter.
//!
//! The model never holds or reorders data: the wrapped device sees every write before the
//! write returns, so what a crash can leave is exactly what it could leave without the model
//! (the crash harness's recorder, installed with `set_trace`, sits below the model, on the
//! wrapped device). Only the time at which requests complete changes.
//!
//! Parameters and their sources: [`presets`] and docs/DISKS.md; the design: docs/DESIGN.md,
//! "A mechanical disk under any device".

mod mech;
pub mod presets;

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::{BlockDevice, DeviceCounters, TraceSink, invalid};
pub use mech::{Op, SeekCurve, Service};
pub use presets::{DiskSpec, by_name, presets};

/// Bytes per sector: the unit the layout counts in.
pub const SECTOR: u64 = 512;

/// How the disk's time relates to the wall clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Time {
    /// Each request's thread sleeps until the request is done (the default).
    Real,
    /// Nothing sleeps: the model's clock is the wall clock plus every service time the
    /// requests would have slept for. Quick, and exact for one thread; concurrent requests
    /// are not held back, so a workload's own timing (a syncer's interval, a group commit's
    /// wait) is not scaled with it.
    Virtual,
    /// Nothing sleeps and only service times advance the clock (tests: every service time
    /// is then a function of the requests alone).
    Frozen,
}

/// Which waiting request the disk takes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Queue {
    /// In arrival order.
    Fifo,
    /// The one nearest the arm (ties in arrival order).
    Sstf,
}

/// `-o disk=NAME[:opt...]`: a preset and how it runs. Options: `wcache` (write cache on),
/// `noreadahead`, `fifo` | `sstf` (default fifo), `real` | `virtual` (default real),
/// `nohostflush` (flushes are the model's only: see [`DiskOptions::host_flush`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DiskOptions {
    pub spec: &'static DiskSpec,
    pub write_cache: bool,
    pub read_ahead: bool,
    pub queue: Queue,
    pub time: Time,
    /// Pass flushes on to the wrapped device (the default), so the image is as durable on
    /// its host as without the model. The host's flush takes real time the model does not
    /// know about (this machine's fdatasync: about 2 ms, as long as a modeled write), so a
    /// measurement of the model turns it off (`nohostflush`): the image is then as durable
    /// as the host's page cache — what a crash of cairn's daemon leaves intact, not what a
    /// crash of the host does. The benchmark does this on its scratch images. The flushes
    /// are counted among the device's all the same: the file system asked for them.
    pub host_flush: bool,
}

impl DiskOptions {
    /// A preset with its defaults: write cache off, read-ahead as the drive has it, FIFO,
    /// real time.
    pub fn new(spec: &'static DiskSpec) -> DiskOptions {
        DiskOptions {
            spec,
            write_cache: false,
            read_ahead: true,
            queue: Queue::Fifo,
            time: Time::Real,
            host_flush: true,
        }
    }

    /// Parses `NAME[:opt...]` (the value of `-o disk=` or `log_disk=`); a one-line error
    /// naming the presets or the options.
    pub fn parse(s: &str) -> Result<DiskOptions, String> {
        let mut parts = s.split(':');
        let name = parts.next().unwrap_or("").trim();
        let spec = by_name(name).ok_or_else(|| {
            let names: Vec<_> = presets().iter().map(|p| p.name).collect();
            format!("unknown disk model '{name}' (known: {})", names.join(", "))
        })?;
        let mut o = DiskOptions::new(spec);
        for p in parts {
            match p.trim() {
                "wcache" => o.write_cache = true,
                "nowcache" => o.write_cache = false,
                "noreadahead" => o.read_ahead = false,
                "fifo" => o.queue = Queue::Fifo,
                "sstf" => o.queue = Queue::Sstf,
                "real" => o.time = Time::Real,
                "virtual" => o.time = Time::Virtual,
                "hostflush" => o.host_flush = true,
                "nohostflush" => o.host_flush = false,
                other => {
                    return Err(format!(
                        "unknown disk option '{other}' in '{s}' (known: wcache, nowcache, noreadahead, fifo, sstf, real, virtual, hostflush, nohostflush)"
                    ));
                }
            }
        }
        Ok(o)
    }
}

/// Counts of one kind of request.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct OpStats {
    pub requests: u64,
    pub sectors: u64,
    /// Time the mechanism spent on them (overhead, seek, rotation, transfer).
    pub busy_ns: u64,
    pub seek_ns: u64,
    pub rotation_ns: u64,
    pub transfer_ns: u64,
    /// Requests that moved the arm, and the cylinders it moved for them.
    pub seeks: u64,
    pub seek_cylinders: u64,
    /// Rotational latency in revolutions.
    pub rotations: f64,
    /// Head switches and one-cylinder steps within transfers.
    pub switches: u64,
    /// Reads served from the read-ahead buffer (wholly or while it streamed on).
    pub cache_hits: u64,
    /// Time requests waited for the disk to take them (queueing).
    pub queue_wait_ns: u64,
}

impl OpStats {
    /// Counts one request; `rev` is the disk's revolution in seconds.
    fn add(&mut self, s: &Service, sectors: u64, wait: f64, rev: f64) {
        let ns = |secs: f64| (secs.max(0.0) * 1e9).round() as u64;
        self.requests += 1;
        self.rotations += s.rotation / rev;
        self.sectors += sectors;
        self.busy_ns += ns(s.end - s.start);
        self.seek_ns += ns(s.seek);
        self.rotation_ns += ns(s.rotation);
        self.transfer_ns += ns(s.transfer);
        if s.cylinders > 0 {
            self.seeks += 1;
            self.seek_cylinders += u64::from(s.cylinders);
        }
        self.switches += u64::from(s.switches);
        if s.cache_hit {
            self.cache_hits += 1;
        }
        self.queue_wait_ns += ns(wait);
    }
}

/// What the model did, for `cairn stats` (`fs.disk`) and the benchmark: busy time (the
/// mechanism at work, 004 §5.1's "disk busy"), seeks and rotations, per operation.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct DiskStats {
    pub model: String,
    /// The fitted seek curve's mean (the preset's published average, as met by the fit).
    pub average_seek_ms: f64,
    pub time: Option<Time>,
    pub queue: Option<Queue>,
    pub write_cache: bool,
    pub read_ahead: bool,
    /// Whether flushes reach the wrapped device ([`DiskOptions::host_flush`]).
    pub host_flush: bool,
    /// Where the image starts on the disk, and how much of the disk it spans.
    pub first_sector: u64,
    pub sectors: u64,
    pub busy_ns: u64,
    pub seeks: u64,
    pub seek_cylinders: u64,
    pub rotations: f64,
    pub read: OpStats,
    pub write: OpStats,
    pub flushes: u64,
    /// Time flushes waited for cached writes (0 with the write cache off).
    pub flush_wait_ns: u64,
    /// The model's timeline: when the disk finishes the work it has been given, measured
    /// from when it was opened. Beside `real_ns`, how much the real run lagged the model.
    pub clock_ns: u64,
    /// Wall-clock time since the disk was opened.
    pub real_ns: u64,
    /// Time threads slept for the model, and how much later than asked they woke (the
    /// scheduler's overshoot).
    pub slept_ns: u64,
    pub late_ns: u64,
}

/// The disk's state, under one lock (no device I/O and no sleep is done holding it).
struct State {
    mech: mech::Mechanism,
    /// When the mechanism is done with everything it has been given (model seconds).
    free_at: f64,
    /// A request's thread holds the disk (between its grant and its completion).
    busy: bool,
    /// Requests waiting for the disk: ticket, cylinder.
    queue: Vec<(u64, u32)>,
    granted: Option<u64>,
    next_ticket: u64,
    /// The virtual and frozen clocks' lead over the wall clock (seconds).
    lead: f64,
    /// Writes in the write cache not yet on the platter: when each will be, and its size.
    destage: VecDeque<(f64, u64)>,
    stats: DiskStats,
}

/// A mechanical disk over another device: see the module documentation.
pub struct Disk {
    inner: Arc<dyn BlockDevice>,
    opts: DiskOptions,
    /// Sectors per block of the wrapped device.
    per_block: u64,
    /// Where block 0 of the wrapped device is on the disk.
    first_sector: u64,
    write_cache_sectors: u64,
    opened: Instant,
    st: Mutex<State>,
    turn: Condvar,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk")
            .field("model", &self.opts.spec.name)
            .field("first_sector", &self.first_sector)
            .finish()
    }
}

impl Disk {
    /// The disk `opts` describes under `inner`, whose block 0 is the disk's first sector. A
    /// device larger than the disk is refused with the way out.
    pub fn new(inner: Arc<dyn BlockDevice>, opts: DiskOptions) -> io::Result<Disk> {
        let spec = opts.spec;
        let mut mspec = spec.clone();
        if !opts.read_ahead {
            mspec.read_ahead_sectors = 0;
        }
        let mech = mech::Mechanism::new(&mspec);
        let per_block = u64::from(inner.block_size()) / SECTOR;
        let need = inner.num_blocks().saturating_mul(per_block);
        if per_block == 0 || need > mech.layout().sectors() {
            return Err(invalid(format!(
                "the device ({} MB) is larger than the modeled disk {} ({} MB): make a smaller image (cairn mkfs --size)",
                need * SECTOR / 1_000_000,
                spec.name,
                spec.capacity() / 1_000_000
            )));
        }
        let stats = DiskStats {
            average_seek_ms: mech.curve().average_ms(),
            model: spec.name.to_string(),
            time: Some(opts.time),
            queue: Some(opts.queue),
            write_cache: opts.write_cache,
            read_ahead: opts.read_ahead && spec.read_ahead_sectors > 0,
            host_flush: opts.host_flush,
            first_sector: 0,
            sectors: need,
            ..DiskStats::default()
        };
        Ok(Disk {
            inner,
            per_block,
            first_sector: 0,
            write_cache_sectors: u64::from(spec.write_cache_sectors).max(1),
            opts,
            opened: Instant::now(),
            st: Mutex::new(State {
                mech,
                free_at: 0.0,
                busy: false,
                queue: Vec::new(),
                granted: None,
                next_ticket: 0,
                lead: 0.0,
                destage: VecDeque::new(),
                stats,
            }),
            turn: Condvar::new(),
        })
    }

    pub fn options(&self) -> &DiskOptions {
        &self.opts
    }

    /// The model's clock now (seconds since the disk was opened).
    fn now(&self, st: &State) -> f64 {
        match self.opts.time {
            Time::Real => self.opened.elapsed().as_secs_f64(),
            Time::Virtual => self.opened.elapsed().as_secs_f64() + st.lead,
            Time::Frozen => st.lead,
        }
    }

    /// Returns once the model's clock has reached `t`: a sleep in real time, a step of the
    /// clock otherwise.
    fn wait_until(&self, t: f64) {
        match self.opts.time {
            Time::Real => {
                let deadline = self.opened + Duration::from_secs_f64(t.max(0.0));
                let now = Instant::now();
                if deadline > now {
                    std::thread::sleep(deadline - now);
                    let woke = Instant::now();
                    let mut st = self.st.lock();
                    st.stats.slept_ns += (woke - now).as_nanos() as u64;
                    st.stats.late_ns += woke.saturating_duration_since(deadline).as_nanos() as u64;
                }
            }
            Time::Virtual => {
                let mut st = self.st.lock();
                let real = self.opened.elapsed().as_secs_f64();
                st.lead = st.lead.max(t - real);
            }
            Time::Frozen => {
                let mut st = self.st.lock();
                st.lead = st.lead.max(t);
            }
        }
    }

    /// Hands the disk to the next waiting request, if it is free.
    fn dispatch(&self, st: &mut State) {
        if st.busy || st.granted.is_some() || st.queue.is_empty() {
            return;
        }
        let arm = st.mech.cylinder();
        let i = match self.opts.queue {
            Queue::Fifo => 0,
            Queue::Sstf => st
                .queue
                .iter()
                .enumerate()
                .min_by_key(|(_, (t, c))| (c.abs_diff(arm), *t))
                .map_or(0, |(i, _)| i),
        };
        let (ticket, _) = st.queue.remove(i);
        st.granted = Some(ticket);
        self.turn.notify_all();
    }

    /// One request through the model: queue, service, the wrapped device's I/O, the wait.
    fn serve(
        &self,
        op: Op,
        block: u64,
        blocks: u64,
        io: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let lba = self.first_sector + block * self.per_block;
        let sectors = blocks * self.per_block;
        let mut st = self.st.lock();
        let arrival = self.now(&st);
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let cyl = st.mech.layout().locate(lba).cyl;
        st.queue.push((ticket, cyl));
        self.dispatch(&mut st);
        while st.granted != Some(ticket) {
            self.turn.wait(&mut st);
        }
        st.granted = None;
        st.busy = true;
        // A request that waited starts when the disk became free, not when its thread woke;
        // a write the cache takes needs only room in the buffer (`cached_write`).
        let cached = op == Op::Write && self.opts.write_cache;
        let start = if cached {
            arrival
        } else {
            arrival.max(st.free_at)
        };
        let (svc, done) = if cached {
            self.cached_write(&mut st, start, lba, sectors)
        } else {
            let svc = st.mech.access(start, op, lba, sectors);
            (svc, svc.end)
        };
        st.free_at = st.free_at.max(svc.end);
        let (wait, rev) = (start - arrival, st.mech.revolution());
        let stats = &mut st.stats;
        match op {
            Op::Read => stats.read.add(&svc, sectors, wait, rev),
            Op::Write => stats.write.add(&svc, sectors, wait, rev),
        }
        stats.busy_ns = stats.read.busy_ns + stats.write.busy_ns;
        stats.seeks = stats.read.seeks + stats.write.seeks;
        stats.seek_cylinders = stats.read.seek_cylinders + stats.write.seek_cylinders;
        stats.rotations = stats.read.rotations + stats.write.rotations;
        drop(st);
        // The data moves now, while the request holds the disk: the wrapped device sees the
        // requests in the order the disk serves them.
        let res = io();
        self.wait_until(done);
        let mut st = self.st.lock();
        st.busy = false;
        self.dispatch(&mut st);
        res
    }

    /// A write into the write cache: acknowledged once it is in the buffer (after waiting
    /// for room, if the buffer is full); the mechanism writes it after what it already has.
    /// Returns the mechanical service and when the write completes for its caller.
    fn cached_write(&self, st: &mut State, start: f64, lba: u64, sectors: u64) -> (Service, f64) {
        let overhead = st.mech.overhead(Op::Write);
        let mut room_at = start;
        while let Some(&(end, _)) = st.destage.front() {
            let held: u64 = st.destage.iter().map(|(_, n)| n).sum();
            if end <= room_at {
                st.destage.pop_front();
            } else if held + sectors > self.write_cache_sectors {
                room_at = end;
                st.destage.pop_front();
            } else {
                break;
            }
        }
        let ack = room_at + overhead + st.mech.bus_time(sectors);
        let svc = st.mech.access(ack.max(st.free_at), Op::Write, lba, sectors);
        st.destage.push_back((svc.end, sectors));
        (svc, ack)
    }
}

impl BlockDevice for Disk {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }

    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        match checked(&*self.inner, block, buf.len()) {
            Some(0) => Ok(()),
            Some(n) => self.serve(Op::Read, block, n, || self.inner.read_blocks(block, buf)),
            // Out of range or not whole blocks: the wrapped device says so, the model
            // counts nothing.
            None => self.inner.read_blocks(block, buf),
        }
    }

    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()> {
        match checked(&*self.inner, block, buf.len()) {
            Some(0) => Ok(()),
            Some(n) => self.serve(Op::Write, block, n, || self.inner.write_blocks(block, buf)),
            None => self.inner.write_blocks(block, buf),
        }
    }

    /// With the write cache off every completed write is on the platter already: the flush
    /// costs the model nothing. With it on, the flush waits until the last cached write is.
    /// Either way the wrapped device is flushed, so the image is as durable as without the
    /// model — unless told not to (`nohostflush`, [`DiskOptions::host_flush`]).
    fn flush(&self) -> io::Result<()> {
        let until = {
            let mut st = self.st.lock();
            let now = self.now(&st);
            let until = if self.opts.write_cache {
                st.destage.iter().map(|(end, _)| *end).fold(now, f64::max)
            } else {
                now
            };
            st.stats.flushes += 1;
            st.stats.flush_wait_ns += ((until - now) * 1e9).round() as u64;
            until
        };
        if self.opts.host_flush {
            self.inner.flush()?;
        } else {
            // Not done, but asked for: the device's counters count the file system's
            // requests, so its flushes per operation read the same with or without it.
            self.inner.counters().note_flush();
        }
        self.wait_until(until);
        Ok(())
    }

    fn counters(&self) -> &DeviceCounters {
        self.inner.counters()
    }

    /// The trace (the crash recorder) goes on the wrapped device: it sees exactly the
    /// writes it would see without the model, in the order they reach the device.
    fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>) {
        self.inner.set_trace(sink);
    }

    fn disk_stats(&self) -> Option<DiskStats> {
        let st = self.st.lock();
        let mut s = st.stats.clone();
        s.clock_ns = (st.free_at.max(self.now(&st)) * 1e9) as u64;
        s.real_ns = self.opened.elapsed().as_nanos() as u64;
        Some(s)
    }
}

/// Whole blocks of a valid transfer (`None` when the wrapped device would refuse it).
fn checked(dev: &dyn BlockDevice, block: u64, len: usize) -> Option<u64> {
    let bs = u64::from(dev.block_size());
    let len = len as u64;
    if !len.is_multiple_of(bs) {
        return None;
    }
    let n = len / bs;
    (block.checked_add(n)? <= dev.num_blocks()).then_some(n)
}

/// `dev` under the disk `opts` describes, or `dev` itself without one: what a mount does with
/// `-o disk=` (and a journal with `log_disk=`).
pub fn wrap(
    dev: Arc<dyn BlockDevice>,
    opts: Option<&DiskOptions>,
) -> io::Result<Arc<dyn BlockDevice>> {
    match opts {
        None => Ok(dev),
        Some(o) => Ok(Arc::new(Disk::new(dev, o.clone())?)),
    }
}

#[cfg(test)]
mod tests;
