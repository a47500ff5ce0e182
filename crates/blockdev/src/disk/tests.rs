use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::*;
use crate::{MemDevice, TraceOp, VecTrace};

/// The mechanism's hand-computable disk ([`mech::tests::toy`]) with a write cache of 1,000
/// sectors, for the tests that turn it on.
fn toy() -> DiskSpec {
    DiskSpec {
        write_cache_sectors: 1000,
        ..mech::tests::toy()
    }
}

fn frozen(spec: DiskSpec, write_cache: bool) -> DiskOptions {
    DiskOptions {
        write_cache,
        time: Time::Frozen,
        ..DiskOptions::new(Box::leak(Box::new(spec)))
    }
}

/// A 4 KiB-block memory device of `blocks` blocks under `opts`.
fn disk(opts: DiskOptions, blocks: u64) -> (Arc<MemDevice>, Disk) {
    let mem = Arc::new(MemDevice::new(4096, blocks));
    let d = Disk::new(mem.clone(), opts).unwrap();
    (mem, d)
}

fn close(a: u64, b: f64) -> bool {
    (a as f64 - b * 1e9).abs() < 2.0
}

/// Through the device, by hand: a 4 KiB write (8 sectors) at block 0 at t = 0 costs 0.8 ms
/// of transfer; then block 50 (LBA 400, cylinder 1: a 1-cylinder seek of 1 ms, then
/// sector 0 of cylinder 1, skewed by 3 head switches and a cylinder step: 50 sectors).
#[test]
fn service_times_through_the_device() {
    let (mem, d) = disk(frozen(toy(), false), 1000);
    d.write_blocks(0, &[7; 4096]).unwrap();
    let s = d.disk_stats().unwrap();
    assert!(close(s.write.busy_ns, 0.0008), "{}", s.write.busy_ns);
    assert!(close(s.clock_ns, 0.0008));
    d.read_blocks(50, &mut [0; 4096]).unwrap();
    let s = d.disk_stats().unwrap();
    assert_eq!((s.read.seeks, s.read.seek_cylinders), (1, 1));
    // At 0.8 ms + 1 ms the platter is at 0.18 of a revolution; the sector begins at 0.5.
    assert!(close(s.read.seek_ns, 0.001));
    assert!(close(s.read.rotation_ns, 0.0032), "{}", s.read.rotation_ns);
    assert!((s.read.rotations - 0.32).abs() < 1e-6);
    assert!(close(s.clock_ns, 0.0008 + 0.001 + 0.0032 + 0.0008));
    // The data went through, and the device's own counters are the wrapped device's.
    let mut b = [0; 4096];
    d.read_blocks(0, &mut b).unwrap();
    assert_eq!(b, [7; 4096]);
    assert_eq!(d.counters().snapshot().writes, 1);
    assert_eq!(mem.counters().snapshot().reads, 2);
}

/// With the write cache off (the default), a write is on the platter when it returns: a
/// flush waits for nothing and the clock does not move. With it on, the write returns
/// once in the buffer and the flush waits until the mechanism has written it.
#[test]
fn flush_costs_nothing_without_a_write_cache_and_waits_with_one() {
    let (_, d) = disk(frozen(toy(), false), 1000);
    d.write_blocks(500, &[1; 4096]).unwrap();
    let before = d.disk_stats().unwrap();
    d.flush().unwrap();
    let after = d.disk_stats().unwrap();
    assert_eq!(after.flushes, 1);
    assert_eq!(after.flush_wait_ns, 0);
    assert_eq!(after.clock_ns, before.clock_ns, "a flush moves no clock");

    let (_, d) = disk(frozen(toy(), true), 1000);
    d.write_blocks(500, &[1; 4096]).unwrap();
    let s = d.disk_stats().unwrap();
    // Acknowledged after the bus transfer (4 KiB at 100 MB/s); the mechanism needs the
    // seek to cylinder 10, the rotation and the transfer.
    let ack = 4096.0 / 100e6;
    let real = d.st.lock().lead;
    assert!(
        (real - ack).abs() < 1e-12,
        "the caller waited only {real} s"
    );
    assert!(
        s.write.busy_ns > 1_000_000,
        "a seek of 10 cylinders: over 1 ms"
    );
    d.flush().unwrap();
    let after = d.disk_stats().unwrap();
    let destaged = s.clock_ns as f64 / 1e9;
    assert!(
        close(after.flush_wait_ns, destaged - ack),
        "{} vs {}",
        after.flush_wait_ns,
        destaged - ack
    );
    // After the flush the clock is where the mechanism finished.
    assert!((d.st.lock().lead - destaged).abs() < 1e-9);
    // Nothing cached: a second flush waits for nothing.
    d.flush().unwrap();
    assert_eq!(d.disk_stats().unwrap().flush_wait_ns, after.flush_wait_ns);
}

/// The write cache holds at most its size: a writer beyond it waits for room.
#[test]
fn a_full_write_cache_makes_writers_wait() {
    let mut spec = toy();
    spec.write_cache_sectors = 16; // two 4 KiB writes
    let (_, d) = disk(frozen(spec, true), 1000);
    let ack = 4096.0 / 100e6;
    d.write_blocks(0, &[1; 4096]).unwrap();
    d.write_blocks(300, &[1; 4096]).unwrap();
    assert!((d.st.lock().lead - 2.0 * ack).abs() < 1e-12);
    d.write_blocks(600, &[1; 4096]).unwrap();
    let first_done = d.st.lock().destage.front().map(|(e, _)| *e);
    // The third waited for the first to reach the platter.
    assert!(first_done.is_some());
    assert!(
        d.st.lock().lead > 2.0 * ack + 0.0005,
        "{}",
        d.st.lock().lead
    );
}

/// Real time: a request's caller returns no sooner than the model's service time.
#[test]
fn real_time_sleeps_the_service_time() {
    let opts = DiskOptions::new(by_name("wren-iv").unwrap());
    assert_eq!(opts.time, Time::Real);
    let (_, d) = disk(opts, 1000);
    let t = Instant::now();
    d.write_blocks(900, &[1; 4096]).unwrap();
    let took = t.elapsed();
    let s = d.disk_stats().unwrap();
    assert!(s.write.seeks == 1 && s.write.busy_ns > 5_000_000, "{s:?}");
    assert!(
        took >= Duration::from_nanos(s.write.busy_ns),
        "{took:?} < {s:?}"
    );
    assert!(s.slept_ns > 0);
}

/// A device that holds its first write until told to go on, so that other requests pile up
/// in the disk's queue behind it.
struct Gate {
    mem: MemDevice,
    held: AtomicBool,
    go: parking_lot::Mutex<bool>,
    cv: parking_lot::Condvar,
}

impl BlockDevice for Gate {
    fn block_size(&self) -> u32 {
        self.mem.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.mem.num_blocks()
    }
    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_blocks(block, buf)
    }
    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()> {
        if !self.held.swap(true, Ordering::SeqCst) {
            let mut go = self.go.lock();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !*go {
                assert!(
                    !self.cv.wait_until(&mut go, deadline).timed_out(),
                    "gate never opened"
                );
            }
        }
        self.mem.write_blocks(block, buf)
    }
    fn flush(&self) -> io::Result<()> {
        self.mem.flush()
    }
    fn counters(&self) -> &DeviceCounters {
        self.mem.counters()
    }
    fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>) {
        self.mem.set_trace(sink);
    }
}

/// Requests that arrive while the disk is busy wait: one served at a time, the waiting
/// time counted, and with `sstf` the one nearest the arm goes first.
fn queue_order(queue: Queue) -> Vec<u64> {
    let gate = Arc::new(Gate {
        mem: MemDevice::new(4096, 1000),
        held: AtomicBool::new(false),
        go: parking_lot::Mutex::new(false),
        cv: parking_lot::Condvar::new(),
    });
    let trace = Arc::new(VecTrace::new());
    gate.set_trace(Some(trace.clone()));
    let opts = DiskOptions {
        queue,
        ..frozen(toy(), false)
    };
    let d = Arc::new(Disk::new(gate.clone(), opts).unwrap());
    let write = |b: u64| {
        let d = d.clone();
        std::thread::spawn(move || d.write_blocks(b, &[1; 4096]).unwrap())
    };
    // The first write holds the disk (the arm ends on cylinder 0); then a far one and a
    // near one queue, in that order.
    let first = write(0);
    let wait_for = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.st.lock().queue.len() != n || !d.st.lock().busy {
            assert!(Instant::now() < deadline, "requests did not queue");
            std::thread::yield_now();
        }
    };
    wait_for(0);
    let far = write(900);
    wait_for(1);
    let near = write(5);
    wait_for(2);
    *gate.go.lock() = true;
    gate.cv.notify_all();
    for t in [first, far, near] {
        t.join().unwrap();
    }
    let s = d.disk_stats().unwrap();
    assert_eq!(s.write.requests, 3);
    assert!(s.write.queue_wait_ns > 0, "the queued requests waited");
    // One at a time: the clock is the sum of the service times.
    assert!(s.clock_ns.abs_diff(s.busy_ns) < 10, "{s:?}");
    trace
        .events()
        .iter()
        .filter(|e| e.op == TraceOp::Write)
        .map(|e| e.block)
        .collect()
}

#[test]
fn fifo_serves_in_arrival_order_and_sstf_nearest_first() {
    assert_eq!(queue_order(Queue::Fifo), [0, 900, 5]);
    assert_eq!(queue_order(Queue::Sstf), [0, 5, 900]);
}

/// The recorder of the crash harness, installed on the model, sees the wrapped device's
/// writes with their data: the model sits above it and changes nothing it records.
#[test]
fn the_trace_is_the_wrapped_devices() {
    let (mem, d) = disk(frozen(toy(), false), 100);
    let t = Arc::new(VecTrace::with_data());
    d.set_trace(Some(t.clone()));
    d.write_blocks(3, &[9; 4096]).unwrap();
    d.flush().unwrap();
    let recs = t.records();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].0.block, 3);
    assert_eq!(recs[0].1.as_deref(), Some(&[9u8; 4096][..]));
    assert_eq!(mem.counters().snapshot().flushes, 1);
    // `nohostflush`: the model's flush only; the wrapped device sees none.
    let mem = Arc::new(MemDevice::new(4096, 10));
    let opts = DiskOptions {
        host_flush: false,
        ..frozen(toy(), false)
    };
    let d = Disk::new(mem.clone(), opts).unwrap();
    let t = Arc::new(VecTrace::new());
    mem.set_trace(Some(t.clone()));
    d.write_blocks(0, &[1; 4096]).unwrap();
    d.flush().unwrap();
    assert!(
        t.events().iter().all(|e| e.op != TraceOp::Flush),
        "the wrapped device was not flushed"
    );
    assert_eq!(
        d.counters().snapshot().flushes,
        1,
        "but the request is counted"
    );
    assert_eq!(d.disk_stats().unwrap().flushes, 1);
}

#[test]
fn bad_requests_are_the_wrapped_devices_errors_and_cost_nothing() {
    let (_, d) = disk(frozen(toy(), false), 10);
    assert!(d.read_blocks(10, &mut [0; 4096]).is_err());
    assert!(d.write_blocks(0, &[0; 100]).is_err());
    d.read_blocks(0, &mut []).unwrap();
    let s = d.disk_stats().unwrap();
    assert_eq!((s.read.requests, s.write.requests, s.clock_ns), (0, 0, 0));
}

#[test]
fn a_device_larger_than_the_disk_is_refused() {
    let wren = by_name("wren-iv").unwrap();
    let mem = Arc::new(MemDevice::new(4096, wren.capacity() / 4096 + 1));
    let e = Disk::new(mem, DiskOptions::new(wren)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("cairn mkfs --size"), "{e}");
    let fits = Arc::new(MemDevice::new(4096, wren.capacity() / 4096));
    Disk::new(fits, DiskOptions::new(wren)).unwrap();
}

#[test]
fn options_parse_and_refuse_in_one_line() {
    let o = DiskOptions::parse("cheetah-10k").unwrap();
    assert_eq!(o.spec.name, "cheetah-10k");
    assert!(!o.write_cache && o.read_ahead);
    assert_eq!((o.queue, o.time), (Queue::Fifo, Time::Real));
    assert!(o.host_flush);
    let o = DiskOptions::parse("hdd-7200:wcache:sstf:virtual:noreadahead:nohostflush").unwrap();
    assert!(o.write_cache && !o.read_ahead && !o.host_flush);
    assert_eq!((o.queue, o.time), (Queue::Sstf, Time::Virtual));
    let e = DiskOptions::parse("floppy").unwrap_err();
    assert!(
        e.contains("known: cheetah-10k, viking, wren-iv, hdd-7200"),
        "{e}"
    );
    let e = DiskOptions::parse("wren-iv:turbo").unwrap_err();
    assert!(e.contains("'turbo'") && !e.contains('\n'), "{e}");
}

/// Every preset cites a source (or its assumption) for every parameter, and docs/DISKS.md
/// lists it.
#[test]
fn every_preset_parameter_is_cited_and_documented() {
    let docs = include_str!("../../../../docs/DISKS.md");
    for p in presets() {
        let cited = |key: &str| p.sources.iter().any(|c| c.param.contains(key));
        for key in [
            "rpm",
            "heads",
            "zones",
            "track_to_track_ms",
            "average_seek_ms",
            "full_stroke_ms",
            "head_switch_ms",
            "write_settle_ms",
            "overhead_ms",
            "bus_mb_s",
            "read_ahead_sectors",
            "write_cache_sectors",
        ] {
            assert!(cited(key), "{}: no source for {key}", p.name);
        }
        assert!(p.sources.iter().all(|c| !c.source.is_empty()));
        assert!(
            docs.contains(&format!("`{}`", p.name)),
            "docs/DISKS.md does not describe {}",
            p.name
        );
        // Sane mechanics: the fitted curve meets the published average.
        let m = mech::Mechanism::new(p);
        assert!(
            (m.curve().average_ms() - p.average_seek_ms).abs() < 0.05 * p.average_seek_ms,
            "{}: fit {} ms for {} ms",
            p.name,
            m.curve().average_ms(),
            p.average_seek_ms
        );
    }
}

/// A zero range under the model is what the disk would do for it: writes of zeros, timed
/// like any write of that many sectors (the model does not override `zero_blocks`), and
/// the wrapped device sees those writes, not a zero-range request.
#[test]
fn a_zero_range_is_modelled_as_writes_of_zeros() {
    let (mem, d) = disk(frozen(toy(), false), 1000);
    d.write_blocks(0, &vec![7; 300 * 4096]).unwrap();
    let before = d.disk_stats().unwrap();
    let t = Arc::new(VecTrace::with_data());
    d.set_trace(Some(t.clone()));
    d.zero_blocks(10, 280).unwrap();
    let s = d.disk_stats().unwrap();
    assert!(
        s.write.busy_ns > before.write.busy_ns,
        "the zeroing took no disk time"
    );
    assert_eq!(s.write.sectors - before.write.sectors, 280 * 8);
    assert!(
        t.events().iter().all(|e| e.op == TraceOp::Write),
        "{:?}",
        t.events()
    );
    let blocks: u64 = t.events().iter().map(|e| u64::from(e.blocks)).sum();
    assert_eq!(blocks, 280);
    assert_eq!(mem.counters().snapshot().zeroes, 0);
    let mut b = vec![1; 300 * 4096];
    d.read_blocks(0, &mut b).unwrap();
    for (i, blk) in b.chunks(4096).enumerate() {
        let want = if (10..290).contains(&i) { 0 } else { 7 };
        assert!(blk.iter().all(|&x| x == want), "block {i}");
    }
}
