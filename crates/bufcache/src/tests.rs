use std::sync::mpsc;
use std::time::Instant;

use cairn_blockdev::{CounterSnapshot, FaultDevice, FaultOp, MemDevice, TraceOp, VecTrace};

use super::*;

const BS: u32 = 512;

fn mem(blocks: u64) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(BS, blocks))
}

fn cache_over(dev: Arc<dyn BlockDevice>, budget_blocks: u64) -> Arc<BufferCache> {
    let cfg = CacheConfig {
        budget_bytes: budget_blocks * u64::from(BS),
        ..CacheConfig::default()
    };
    BufferCache::new(dev, cfg, Arc::new(NoHooks))
}

fn fill(cache: &BufferCache, buf: &BufRef, v: u8) {
    buf.write().fill(v);
    cache.mark_dirty(buf);
}

fn dev_block(dev: &MemDevice, blk: u64) -> Vec<u8> {
    let mut b = vec![0; BS as usize];
    dev.read_blocks(blk, &mut b).unwrap();
    b
}

fn writes_since(dev: &MemDevice, before: &CounterSnapshot) -> u64 {
    dev.counters().snapshot().delta(before).writes
}

/// Records what the cache asks of the hooks; rolls back byte 0 of kind-7 buffers to 0xEE.
#[derive(Default)]
struct Recorder {
    before: Mutex<Vec<BlockNo>>,
    after: Mutex<Vec<BlockNo>>,
    failed: Mutex<Vec<BlockNo>>,
    flushes: AtomicU64,
    fail_block: Mutex<Option<BlockNo>>,
}

impl WriteHooks for Recorder {
    fn before_write(&self, buf: &Buf, image: &mut [u8]) -> io::Result<()> {
        if *self.fail_block.lock() == Some(buf.blkno()) {
            return Err(io::Error::other("hook refused"));
        }
        self.before.lock().push(buf.blkno());
        if buf.kind() == 7 {
            image[0] = 0xEE;
        }
        Ok(())
    }
    fn after_write(&self, buf: &Buf) {
        self.after.lock().push(buf.blkno());
    }
    fn write_failed(&self, buf: &Buf) {
        self.failed.lock().push(buf.blkno());
    }
    fn after_flush(&self) {
        self.flushes.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn hit_after_miss_reads_device_once() {
    let dev = mem(8);
    dev.write_blocks(3, &[9; BS as usize]).unwrap();
    let cache = cache_over(dev.clone(), 8);
    let before = dev.counters().snapshot();
    assert_eq!(*cache.read(3).unwrap().read(), vec![9; BS as usize]);
    assert_eq!(*cache.read(3).unwrap().read(), vec![9; BS as usize]);
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.cached_buffers), (1, 1, 1));
    assert_eq!(s.cached_bytes, u64::from(BS));
    assert_eq!(dev.counters().snapshot().delta(&before).reads, 1);
    assert_eq!(cache.block_size(), BS as usize);
}

#[test]
fn read_out_of_range_is_an_error_and_caches_nothing() {
    let cache = cache_over(mem(4), 8);
    assert_eq!(
        cache.read(4).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(cache.stats().cached_buffers, 0);
}

#[test]
fn eviction_keeps_budget_in_lru_order() {
    let cache = cache_over(mem(16), 4);
    for b in 0..4 {
        cache.read(b).unwrap();
    }
    cache.read(0).unwrap(); // 0 becomes the most recently used; 1 is now the oldest
    cache.read(4).unwrap();
    assert!(cache.lookup(1).is_none(), "LRU block 1 should be evicted");
    assert!(cache.lookup(0).is_some());
    for b in 5..12 {
        cache.read(b).unwrap();
    }
    let s = cache.stats();
    assert_eq!(s.cached_buffers, 4);
    assert_eq!(s.evictions, 8);
    assert!(s.cached_bytes <= s.budget_bytes);
}

#[test]
fn held_buffers_are_not_evicted() {
    let cache = cache_over(mem(16), 2);
    let held: Vec<BufRef> = (0..5).map(|b| cache.read(b).unwrap()).collect();
    assert_eq!(cache.stats().cached_buffers, 5);
    for b in 0..5 {
        assert!(Arc::ptr_eq(&cache.lookup(b).unwrap(), &held[b as usize]));
    }
    drop(held);
    cache.read(10).unwrap();
    assert_eq!(cache.stats().cached_buffers, 2);
}

#[test]
fn dirty_buffers_survive_eviction() {
    let dev = mem(64);
    let cache = cache_over(dev.clone(), 4);
    for b in 0..40u64 {
        let buf = cache.get_new(b);
        fill(&cache, &buf, b as u8 + 1);
    }
    let s = cache.stats();
    assert!(s.cached_buffers <= 4, "{s:?}");
    assert!(s.writebacks >= 36);
    for b in 0..40u64 {
        assert_eq!(cache.read(b).unwrap().read()[100], b as u8 + 1, "block {b}");
    }
    cache.sync().unwrap();
    for b in 0..40u64 {
        assert_eq!(dev_block(&dev, b), vec![b as u8 + 1; BS as usize]);
    }
}

#[test]
fn eight_contiguous_dirty_blocks_are_one_write() {
    let dev = mem(64);
    let cache = cache_over(dev.clone(), 64);
    for b in 10..18 {
        fill(&cache, &cache.get_new(b), 1);
    }
    fill(&cache, &cache.get_new(30), 2); // not contiguous: its own write
    let before = dev.counters().snapshot();
    cache.write_back_all().unwrap();
    assert_eq!(writes_since(&dev, &before), 2);
    let s = cache.stats();
    assert_eq!((s.cluster_writes, s.writebacks, s.dirty_buffers), (2, 9, 0));
    assert_eq!(dev.counters().snapshot().delta(&before).blocks_written, 9);
}

#[test]
fn clusters_are_capped_at_max_cluster_bytes() {
    let dev = mem(64);
    let cfg = CacheConfig {
        max_cluster_bytes: 3 * BS as usize,
        ..CacheConfig::default()
    };
    let cache = BufferCache::new(dev.clone(), cfg, Arc::new(NoHooks));
    for b in 0..8 {
        fill(&cache, &cache.get_new(b), 1);
    }
    let before = dev.counters().snapshot();
    cache.sync().unwrap();
    // 3 + 3 + 2 blocks.
    assert_eq!(writes_since(&dev, &before), 3);
    assert_eq!(dev.counters().snapshot().delta(&before).flushes, 1);
}

#[test]
fn hooks_see_every_written_buffer_and_roll_back_only_the_image() {
    let dev = mem(16);
    let rec = Arc::new(Recorder::default());
    let cache = BufferCache::new(dev.clone(), CacheConfig::default(), rec.clone());
    for b in [2, 3, 5] {
        let buf = cache.get_new(b);
        buf.set_kind(if b == 3 { 7 } else { 0 });
        fill(&cache, &buf, 0x11);
    }
    cache.write_back_all().unwrap();
    assert_eq!(*rec.before.lock(), vec![2, 3, 5]);
    assert_eq!(*rec.after.lock(), vec![2, 3, 5]);
    // The rolled-back byte reached the device, not the cached contents.
    assert_eq!(dev_block(&dev, 3)[0], 0xEE);
    assert_eq!(dev_block(&dev, 3)[1], 0x11);
    assert_eq!(dev_block(&dev, 2)[0], 0x11);
    assert_eq!(cache.read(3).unwrap().read()[0], 0x11);

    assert_eq!(rec.flushes.load(Ordering::SeqCst), 0);
    cache.flush_device().unwrap();
    assert_eq!(rec.flushes.load(Ordering::SeqCst), 1);

    // write_now goes through the hooks too, and writes even a clean buffer.
    let b5 = cache.read(5).unwrap();
    cache.write_now(&[&b5]).unwrap();
    assert_eq!(*rec.after.lock(), vec![2, 3, 5, 5]);
}

#[test]
fn set_hooks_replaces_the_strategy() {
    let dev = mem(16);
    let cache = cache_over(dev.clone(), 16);
    let rec = Arc::new(Recorder::default());
    cache.set_hooks(rec.clone());
    fill(&cache, &cache.get_new(1), 1);
    cache.sync().unwrap();
    assert_eq!(*rec.after.lock(), vec![1]);
    assert_eq!(rec.flushes.load(Ordering::SeqCst), 1);
}

/// Rolls back everything and asks to be written again, as soft updates does for a buffer
/// with unsatisfied dependencies.
struct RollBackAll;
impl WriteHooks for RollBackAll {
    fn before_write(&self, buf: &Buf, image: &mut [u8]) -> io::Result<()> {
        image.fill(0);
        buf.keep_dirty();
        Ok(())
    }
}

#[test]
fn keep_dirty_from_a_hook_keeps_the_buffer_dirty() {
    let dev = mem(16);
    let cache = BufferCache::new(dev.clone(), CacheConfig::default(), Arc::new(RollBackAll));
    let buf = cache.get_new(4);
    fill(&cache, &buf, 3);
    cache.write_back_all().unwrap();
    assert!(buf.is_dirty());
    assert_eq!(cache.dirty_count(), 1);
    assert_eq!(dev_block(&dev, 4), vec![0; BS as usize]);
    cache.set_hooks(Arc::new(NoHooks));
    cache.write_back_all().unwrap();
    assert!(!buf.is_dirty());
    assert_eq!(dev_block(&dev, 4), vec![3; BS as usize]);
}

/// Blocks in before_write until released, so a test can modify the buffer mid-write.
struct Pause {
    reached: Mutex<Option<mpsc::Sender<()>>>,
    release: Mutex<Option<mpsc::Receiver<()>>>,
}
impl WriteHooks for Pause {
    fn before_write(&self, _buf: &Buf, _image: &mut [u8]) -> io::Result<()> {
        if let Some(tx) = self.reached.lock().take() {
            tx.send(()).unwrap();
            let rx = self.release.lock().take().unwrap();
            rx.recv().unwrap();
        }
        Ok(())
    }
}

#[test]
fn modification_during_write_back_keeps_the_buffer_dirty() {
    let dev = mem(16);
    let (reached_tx, reached_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let hooks = Arc::new(Pause {
        reached: Mutex::new(Some(reached_tx)),
        release: Mutex::new(Some(release_rx)),
    });
    let cache = BufferCache::new(dev.clone(), CacheConfig::default(), hooks);
    let buf = cache.get_new(6);
    fill(&cache, &buf, 1);
    buf.note_lsn(5);

    let writer = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || cache.write_back_all())
    };
    reached_rx.recv().unwrap(); // the image (all 1s) is copied; the write is pending
    {
        let mut g = buf.write();
        g.fill(2);
        buf.note_lsn(9);
    }
    cache.mark_dirty(&buf);
    release_tx.send(()).unwrap();
    writer.join().unwrap().unwrap();

    assert_eq!(dev_block(&dev, 6), vec![1; BS as usize]);
    assert!(
        buf.is_dirty(),
        "the modification made during the write was lost"
    );
    assert_eq!((buf.low_lsn(), buf.high_lsn()), (5, 9));
    cache.write_back_all().unwrap();
    assert_eq!(dev_block(&dev, 6), vec![2; BS as usize]);
    assert!(!buf.is_dirty());
    assert_eq!((buf.low_lsn(), buf.high_lsn()), (0, 0));
}

#[test]
fn syncer_writes_dirty_buffers_after_its_interval_and_stops() {
    let dev = mem(16);
    let cfg = CacheConfig {
        syncer_interval: Some(Duration::from_millis(50)),
        ..CacheConfig::default()
    };
    let cache = BufferCache::new(dev.clone(), cfg, Arc::new(NoHooks));
    fill(&cache, &cache.get_new(2), 0x42);
    let start = Instant::now();
    while cache.dirty_count() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "syncer never ran"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(dev_block(&dev, 2), vec![0x42; BS as usize]);

    cache.shutdown().unwrap();
    assert!(cache.syncer.lock().is_none());
    // With the syncer stopped, a dirty buffer stays dirty.
    fill(&cache, &cache.get_new(3), 1);
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(cache.dirty_count(), 1);
}

#[test]
fn dropping_the_cache_ends_the_syncer_thread() {
    let cfg = CacheConfig {
        syncer_interval: Some(Duration::from_secs(3600)),
        ..CacheConfig::default()
    };
    let cache = BufferCache::new(mem(4), cfg, Arc::new(NoHooks));
    let handle = cache.syncer.lock().take().unwrap();
    drop(cache);
    let start = Instant::now();
    while !handle.is_finished() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "syncer still runs"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn device_write_error_leaves_buffers_dirty_and_reports() {
    let mem_dev = mem(16);
    let fault = Arc::new(FaultDevice::fail_after(mem_dev.clone(), 0));
    let rec = Arc::new(Recorder::default());
    let cache = BufferCache::new(fault.clone(), CacheConfig::default(), rec.clone());
    let buf = cache.get_new(1);
    fill(&cache, &buf, 7);
    buf.note_lsn(3);
    let err = cache.sync().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(5)); // EIO
    assert!(buf.is_dirty());
    assert_eq!(buf.high_lsn(), 3);
    assert_eq!(*rec.failed.lock(), vec![1]);
    assert!(rec.after.lock().is_empty());
    assert_eq!(rec.flushes.load(Ordering::SeqCst), 0);
    assert_eq!(cache.stats().write_errors, 1);

    fault.heal();
    cache.sync().unwrap();
    assert!(!buf.is_dirty());
    assert_eq!(dev_block(&mem_dev, 1), vec![7; BS as usize]);
}

#[test]
fn flush_error_is_reported() {
    let fault = Arc::new(FaultDevice::new(mem(4)));
    let cache = cache_over(fault.clone(), 4);
    fill(&cache, &cache.get_new(0), 1);
    fault.set_fail_after(Some(1)); // the write passes, the flush fails
    assert!(cache.sync().is_err());
    assert_eq!(cache.dirty_count(), 0);
}

#[test]
fn eviction_with_failing_writes_never_drops_dirty_data() {
    let mem_dev = mem(64);
    let fault = Arc::new(FaultDevice::fail_after(mem_dev.clone(), 0));
    let cache = cache_over(fault.clone(), 2);
    for b in 0..10u64 {
        fill(&cache, &cache.get_new(b), b as u8 + 1);
    }
    assert_eq!(cache.dirty_count(), 10);
    assert_eq!(cache.stats().evictions, 0);
    for b in 0..10u64 {
        assert_eq!(cache.read(b).unwrap().read()[0], b as u8 + 1);
    }
    fault.heal();
    cache.sync().unwrap();
    for b in 0..10u64 {
        assert_eq!(dev_block(&mem_dev, b)[0], b as u8 + 1);
    }
}

#[test]
fn failing_before_write_abandons_the_cluster() {
    let dev = mem(16);
    let rec = Arc::new(Recorder::default());
    *rec.fail_block.lock() = Some(3);
    let cache = BufferCache::new(dev.clone(), CacheConfig::default(), rec.clone());
    for b in 2..5 {
        fill(&cache, &cache.get_new(b), 9);
    }
    let before = dev.counters().snapshot();
    assert!(cache.write_back_all().is_err());
    assert_eq!(writes_since(&dev, &before), 0);
    assert_eq!(*rec.failed.lock(), vec![2]);
    assert_eq!(cache.dirty_count(), 3);
}

#[test]
fn invalidate_drops_dirty_data_and_next_read_goes_to_device() {
    let dev = mem(16);
    let cache = cache_over(dev.clone(), 16);
    let buf = cache.get_new(5);
    fill(&cache, &buf, 8);
    cache.invalidate(5);
    assert!(buf.is_invalidated());
    assert_eq!(cache.dirty_count(), 0);
    cache.mark_dirty(&buf); // ignored: the block was freed
    assert_eq!(cache.dirty_count(), 0);
    let before = dev.counters().snapshot();
    cache.sync().unwrap();
    assert_eq!(writes_since(&dev, &before), 0);
    let misses = cache.stats().misses;
    let again = cache.read(5).unwrap();
    assert_eq!(cache.stats().misses, misses + 1);
    assert_eq!(*again.read(), vec![0; BS as usize]);
    assert!(!Arc::ptr_eq(&buf, &again));
}

/// Counts what the cache tells a strategy on its own: invalidations and pressure.
#[derive(Default)]
struct Told {
    invalidated: Mutex<Vec<BlockNo>>,
    pressure: AtomicU64,
    defer: bool,
}
impl WriteHooks for Told {
    fn invalidated(&self, buf: &Buf) {
        self.invalidated.lock().push(buf.blkno());
    }
    fn on_pressure(&self) -> Pressure {
        self.pressure.fetch_add(1, Ordering::SeqCst);
        if self.defer {
            Pressure::Defer
        } else {
            Pressure::EvictDirty
        }
    }
}

#[test]
fn invalidation_is_told_once() {
    let dev = mem(16);
    let told = Arc::new(Told::default());
    let cache = BufferCache::new(dev.clone(), CacheConfig::default(), told.clone());
    let buf = cache.get_new(5);
    fill(&cache, &buf, 8);
    cache.invalidate(5);
    cache.invalidate(5); // nothing cached any more: not told again
    assert_eq!(*told.invalidated.lock(), vec![5]);
}

/// Freeing a block whose old contents are being written does not wait for that write (the
/// caller may hold its file system's lock), yet the block's next contents still land last:
/// their write waits for the old one.
#[test]
fn invalidate_does_not_wait_but_the_next_write_of_the_block_does() {
    let dev = mem(16);
    let (reached_tx, reached_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let hooks = Arc::new(Pause {
        reached: Mutex::new(Some(reached_tx)),
        release: Mutex::new(Some(release_rx)),
    });
    let cache = BufferCache::new(dev.clone(), CacheConfig::default(), hooks);
    let old = cache.get_new(6);
    fill(&cache, &old, 1);
    let old_writer = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || cache.write_back_all())
    };
    reached_rx.recv().unwrap(); // the old image is copied; its write is in flight
    let freer = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || cache.invalidate(6))
    };
    let t = Instant::now();
    while !freer.is_finished() && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let waited = !freer.is_finished();
    if waited {
        release_tx.send(()).unwrap();
    }
    assert!(!waited, "invalidate waited for the write in flight");
    freer.join().unwrap();
    let new = cache.get_new(6);
    fill(&cache, &new, 2);
    let new_writer = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || cache.write_back_all())
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !new_writer.is_finished(),
        "the new write did not wait for the old one"
    );
    release_tx.send(()).unwrap();
    old_writer.join().unwrap().unwrap();
    new_writer.join().unwrap().unwrap();
    assert_eq!(dev_block(&dev, 6), vec![2; BS as usize]);
}

#[test]
fn deferred_pressure_writes_nothing_and_lets_the_budget_go_soft() {
    let dev = mem(64);
    let told = Arc::new(Told {
        defer: true,
        ..Default::default()
    });
    let cache = BufferCache::new(
        dev.clone(),
        CacheConfig {
            budget_bytes: 4 * BS as u64,
            ..CacheConfig::default()
        },
        told.clone(),
    );
    let before = dev.counters().snapshot();
    for b in 0..40u64 {
        let buf = cache.get_new(b);
        fill(&cache, &buf, b as u8 + 1);
    }
    assert_eq!(
        writes_since(&dev, &before),
        0,
        "eviction wrote a dirty buffer"
    );
    assert_eq!(cache.stats().dirty_buffers, 40);
    assert!(told.pressure.load(Ordering::SeqCst) > 0);
    // The strategy writes back in its own order; then the budget holds again.
    cache.write_back_all().unwrap();
    cache.read(50).unwrap();
    assert!(cache.stats().cached_buffers <= 4);
}

#[test]
fn get_new_zeroes_the_cached_buffer_in_place() {
    let dev = mem(16);
    dev.write_blocks(2, &[5; BS as usize]).unwrap();
    let cache = cache_over(dev.clone(), 16);
    let old = cache.read(2).unwrap();
    let before = dev.counters().snapshot();
    let new = cache.get_new(2);
    assert!(Arc::ptr_eq(&old, &new));
    assert_eq!(*old.read(), vec![0; BS as usize]);
    let fresh = cache.get_new(9);
    assert_eq!(*fresh.read(), vec![0; BS as usize]);
    assert_eq!(dev.counters().snapshot().delta(&before).reads, 0);
}

#[test]
fn write_back_filter_writes_only_matching_buffers() {
    let dev = mem(16);
    let cache = cache_over(dev.clone(), 16);
    for b in 0..6 {
        let buf = cache.get_new(b);
        buf.set_kind((b % 2) as u8);
        fill(&cache, &buf, 1);
    }
    cache.write_back_filter(&|b| b.kind() == 1).unwrap();
    assert_eq!(cache.dirty_count(), 3);
    for b in 0..6 {
        let expect = if b % 2 == 1 { 1 } else { 0 };
        assert_eq!(dev_block(&dev, b)[0], expect, "block {b}");
    }
}

#[test]
fn prefetch_reads_missing_runs_in_one_device_read() {
    let dev = mem(32);
    let cache = cache_over(dev.clone(), 32);
    let cached = cache.get_new(4);
    fill(&cache, &cached, 3);
    let before = dev.counters().snapshot();
    cache.prefetch(0, 12).unwrap();
    // 0..4 and 5..12: two reads; the dirty block 4 is untouched.
    assert_eq!(dev.counters().snapshot().delta(&before).reads, 2);
    assert_eq!(cached.read()[0], 3);
    let hits = cache.stats().hits;
    for b in 0..12 {
        cache.read(b).unwrap();
    }
    assert_eq!(cache.stats().hits, hits + 12);
    assert!(cache.prefetch(30, 5).is_err());
}

#[test]
fn concurrent_writers_and_syncer_lose_nothing() {
    let dev = mem(256);
    let cfg = CacheConfig {
        budget_bytes: 32 * u64::from(BS),
        syncer_interval: Some(Duration::from_millis(1)),
        max_cluster_bytes: 8 * BS as usize,
    };
    let cache = BufferCache::new(dev.clone(), cfg, Arc::new(NoHooks));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                for round in 0..20u8 {
                    for i in 0..32u64 {
                        let blk = t * 64 + i;
                        let buf = cache.read(blk).unwrap();
                        let mut g = buf.write();
                        g[0] = round;
                        g[1] = t as u8;
                        cache.mark_dirty(&buf);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    cache.shutdown().unwrap();
    for t in 0..4u64 {
        for i in 0..32u64 {
            let b = dev_block(&dev, t * 64 + i);
            assert_eq!((b[0], b[1]), (19, t as u8));
        }
    }
}

mod model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const BLOCKS: u64 = 12;

    #[derive(Clone, Debug)]
    enum Op {
        Read(u64),
        Write(u64, u8),
        New(u64, u8),
        Hold(u64),
        Release,
        WriteBack,
        Sync,
        Invalidate(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let blk = 0..BLOCKS;
        prop_oneof![
            4 => blk.clone().prop_map(Op::Read),
            4 => (blk.clone(), any::<u8>()).prop_map(|(b, v)| Op::Write(b, v)),
            2 => (blk.clone(), any::<u8>()).prop_map(|(b, v)| Op::New(b, v)),
            1 => blk.clone().prop_map(Op::Hold),
            1 => Just(Op::Release),
            1 => Just(Op::WriteBack),
            1 => Just(Op::Sync),
            1 => blk.prop_map(Op::Invalidate),
        ]
    }

    /// Block contents as the model knows them: the fill byte, with the block number in the
    /// first byte so a block written to the wrong place is caught.
    fn image(blk: u64, v: u8) -> Vec<u8> {
        let mut b = vec![v; BS as usize];
        b[0] = blk as u8;
        b
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn cache_matches_a_reference_map(ops in proptest::collection::vec(op(), 1..120)) {
            let dev = mem(BLOCKS);
            for b in 0..BLOCKS {
                dev.write_blocks(b, &image(b, 0)).unwrap();
            }
            let cfg = CacheConfig {
                budget_bytes: 3 * u64::from(BS),
                syncer_interval: None,
                max_cluster_bytes: 2 * BS as usize,
            };
            let cache = BufferCache::new(dev.clone(), cfg, Arc::new(NoHooks));
            // None: invalidated, contents unknown until rewritten.
            let mut model: HashMap<u64, Option<u8>> = (0..BLOCKS).map(|b| (b, Some(0))).collect();
            let mut held: Vec<BufRef> = Vec::new();
            let mut peak_held = 0;
            for op in ops {
                match op {
                    Op::Read(b) => {
                        let buf = cache.read(b).unwrap();
                        if let Some(v) = model[&b] {
                            prop_assert_eq!(&*buf.read(), &image(b, v));
                        }
                    }
                    Op::Write(b, v) => {
                        let buf = cache.read(b).unwrap();
                        buf.write().copy_from_slice(&image(b, v));
                        cache.mark_dirty(&buf);
                        model.insert(b, Some(v));
                    }
                    Op::New(b, v) => {
                        let buf = cache.get_new(b);
                        prop_assert_eq!(&*buf.read(), &vec![0; BS as usize]);
                        buf.write().copy_from_slice(&image(b, v));
                        cache.mark_dirty(&buf);
                        model.insert(b, Some(v));
                    }
                    Op::Hold(b) => held.push(cache.read(b).unwrap()),
                    Op::Release => { held.pop(); }
                    Op::WriteBack => cache.write_back_all().unwrap(),
                    Op::Sync => {
                        cache.sync().unwrap();
                        prop_assert_eq!(cache.dirty_count(), 0);
                    }
                    Op::Invalidate(b) => {
                        held.retain(|h| h.blkno() != b);
                        cache.invalidate(b);
                        model.insert(b, None);
                    }
                }
                // Eviction runs on insertion and spares held buffers, so the budget can be
                // exceeded by at most the most buffers ever held at once.
                peak_held = peak_held.max(held.len() as u64);
                let s = cache.stats();
                prop_assert!(s.cached_buffers <= 3 + peak_held, "{:?}", s);
            }
            drop(held);
            cache.sync().unwrap();
            for (b, v) in model {
                if let Some(v) = v {
                    prop_assert_eq!(dev_block(&dev, b), image(b, v), "device block {}", b);
                    let buf = cache.read(b).unwrap();
                    prop_assert_eq!(&*buf.read(), &image(b, v));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Undo scopes

fn content(cache: &BufferCache, blk: BlockNo) -> Option<(Vec<u8>, bool)> {
    cache.lookup(blk).map(|b| (b.read().clone(), b.is_dirty()))
}

#[test]
fn rollback_restores_memory_as_it_was() {
    let dev = mem(16);
    dev.write_blocks(2, &[2; BS as usize]).unwrap();
    dev.write_blocks(4, &[4; BS as usize]).unwrap();
    let cache = cache_over(dev.clone(), 16);
    let b1 = cache.read(1).unwrap();
    fill(&cache, &b1, 0x11); // dirty before the scope
    b1.set_kind(3);
    let b2 = cache.read(2).unwrap(); // clean before the scope
    let b4 = cache.read(4).unwrap();
    fill(&cache, &b4, 0x44);
    drop((b1, b2, b4));
    let before = dev.counters().snapshot();

    cache.begin_undo().unwrap();
    let b1 = cache.read(1).unwrap();
    fill(&cache, &b1, 0xA1);
    b1.set_kind(9);
    fill(&cache, &b1, 0xA2); // a second change saves nothing more
    fill(&cache, &cache.read(2).unwrap(), 0xA3);
    fill(&cache, &cache.get_new(3), 0xA4); // created by the scope
    cache.invalidate(4); // a free the scope takes back too
    fill(&cache, &cache.get_new(5), 0xA5);
    cache.invalidate(5);
    drop(b1);
    cache.rollback_undo().unwrap();

    assert_eq!(content(&cache, 1), Some((vec![0x11; BS as usize], true)));
    assert_eq!(cache.lookup(1).unwrap().kind(), 3);
    assert_eq!(content(&cache, 2), Some((vec![2; BS as usize], false)));
    assert_eq!(
        content(&cache, 3),
        None,
        "a buffer the scope created is gone"
    );
    assert_eq!(content(&cache, 4), Some((vec![0x44; BS as usize], true)));
    assert_eq!(content(&cache, 5), None);
    assert_eq!(cache.dirty_count(), 2);
    assert_eq!(
        writes_since(&dev, &before),
        0,
        "nothing was written, nothing to undo"
    );
    // The cache keeps working: a dirty restored buffer is written by the next write-back.
    cache.write_back_all().unwrap();
    assert_eq!(dev_block(&dev, 4), vec![0x44; BS as usize]);
    assert_eq!(cache.dirty_count(), 0);
}

/// A scope that creates far more buffers than the budget (ffs's fallocate of a GiB makes a
/// zeroed buffer per block in one scope) holds them all; each insertion's eviction looks at
/// a bounded number of them, not at every one again (which was quadratic: minutes of CPU).
#[test]
fn a_scope_over_budget_costs_a_bounded_scan_per_insertion() {
    let n = 4000;
    let dev = mem(n + 16);
    let cache = cache_over(dev.clone(), 16);
    cache.begin_undo().unwrap();
    for b in 0..n {
        fill(&cache, &cache.get_new(b), 1);
    }
    let s = cache.stats();
    assert_eq!(s.cached_buffers, n, "the scope's buffers are all kept");
    assert!(
        s.eviction_scans < 200 * n,
        "{} buffers looked at for {n} insertions",
        s.eviction_scans
    );
    cache.commit_undo();
    cache.write_back_all().unwrap();
    assert_eq!(dev_block(&dev, n - 1), vec![1; BS as usize]);
}

#[test]
fn commit_keeps_everything() {
    let dev = mem(8);
    let cache = cache_over(dev.clone(), 8);
    cache.begin_undo().unwrap();
    fill(&cache, &cache.read(1).unwrap(), 7);
    fill(&cache, &cache.get_new(2), 8);
    cache.invalidate(1);
    cache.commit_undo();
    assert_eq!(content(&cache, 1), None);
    assert_eq!(content(&cache, 2), Some((vec![8; BS as usize], true)));
    // Scopes do not nest.
    cache.begin_undo().unwrap();
    assert!(cache.begin_undo().is_err());
    cache.commit_undo();
}

/// The device half: a scope that wrote three flush epochs is written back newest epoch
/// first, each block getting the image it had before that epoch, a flush after each; the
/// device ends where it started and the buffers are clean again.
#[test]
fn rollback_writes_back_epochs_in_reverse() {
    let dev = mem(16);
    for b in 1..=3 {
        dev.write_blocks(b, &[b as u8; BS as usize]).unwrap();
    }
    let cache = cache_over(dev.clone(), 16);
    let trace = Arc::new(VecTrace::with_data());
    cache.begin_undo().unwrap();
    let (b1, b2, b3) = (
        cache.read(1).unwrap(),
        cache.read(2).unwrap(),
        cache.read(3).unwrap(),
    );
    dev.set_trace(Some(trace.clone()));
    fill(&cache, &b1, 0xB1);
    cache.write_now(&[&b1]).unwrap(); // epoch 0: b1 = B1
    cache.flush_device().unwrap();
    fill(&cache, &b1, 0xC1);
    fill(&cache, &b2, 0xC2);
    cache.write_now(&[&b1, &b2]).unwrap(); // epoch 1: b1 = C1, b2 = C2
    cache.flush_device().unwrap();
    fill(&cache, &b3, 0xD3);
    cache.write_now(&[&b3]).unwrap(); // epoch 2: b3 = D3, never flushed
    trace.take();
    drop((b1, b2, b3));
    cache.rollback_undo().unwrap();
    let got: Vec<(TraceOp, u64, Option<u8>)> = trace
        .records()
        .into_iter()
        .map(|(e, d)| (e.op, e.block, d.map(|d| d[0])))
        .collect();
    use TraceOp::{Flush, Write};
    assert_eq!(
        got,
        vec![
            (Write, 3, Some(3)),
            (Flush, 0, None),
            (Write, 1, Some(0xB1)),
            (Write, 2, Some(2)),
            (Flush, 0, None),
            (Write, 1, Some(1)),
            (Flush, 0, None),
        ]
    );
    for b in 1..=3u64 {
        assert_eq!(dev_block(&dev, b), vec![b as u8; BS as usize]);
        assert_eq!(
            content(&cache, b),
            Some((vec![b as u8; BS as usize], false))
        );
    }
    dev.set_trace(None);
}

/// A device that refuses the rollback's writes: they stay pending, nothing newer reaches
/// the device and no new scope opens until they are written; then everything proceeds.
#[test]
fn refused_rollback_stays_pending_and_goes_first() {
    let mem_dev = mem(8);
    mem_dev.write_blocks(1, &[1; BS as usize]).unwrap();
    let fault = Arc::new(FaultDevice::new(mem_dev.clone()));
    let cache = cache_over(fault.clone(), 8);
    cache.begin_undo().unwrap();
    let b1 = cache.read(1).unwrap();
    fill(&cache, &b1, 0xEE);
    cache.write_now(&[&b1]).unwrap();
    fault.fail_nth(FaultOp::Write, 1, true);
    drop(b1);
    assert!(cache.rollback_undo().is_err());
    assert!(cache.undo_pending());
    assert_eq!(
        dev_block(&mem_dev, 1),
        vec![0xEE; BS as usize],
        "not yet undone"
    );
    assert_eq!(content(&cache, 1), Some((vec![1; BS as usize], true)));
    assert!(
        cache.begin_undo().is_err(),
        "no new scope before the image is back"
    );
    fill(&cache, &cache.read(2).unwrap(), 2);
    assert!(cache.write_back_all().is_err());
    assert_eq!(
        dev_block(&mem_dev, 2),
        vec![0; BS as usize],
        "nothing newer went first"
    );
    fault.heal();
    cache.write_back_all().unwrap();
    assert!(!cache.undo_pending());
    assert_eq!(dev_block(&mem_dev, 1), vec![1; BS as usize]);
    assert_eq!(dev_block(&mem_dev, 2), vec![2; BS as usize]);
    cache.begin_undo().unwrap();
    cache.commit_undo();
}

/// Under memory pressure the cache neither writes back nor drops what the open scope
/// changed (the change may be taken back, and the rollback starts from the buffer), not even
/// once a step wrote it clean.
#[test]
fn eviction_spares_what_the_scope_changed() {
    let dev = mem(64);
    let cache = cache_over(dev.clone(), 4);
    let before = dev.counters().snapshot();
    cache.begin_undo().unwrap();
    for b in 0..8 {
        fill(&cache, &cache.read(b).unwrap(), 0x50 + b as u8);
    }
    assert_eq!(
        writes_since(&dev, &before),
        0,
        "nothing the scope changed was written"
    );
    cache.commit_undo();
    // Now they may go.
    for b in 8..16 {
        cache.read(b).unwrap();
    }
    assert!(writes_since(&dev, &before) > 0);
    cache.sync().unwrap();

    cache.begin_undo().unwrap();
    let b20 = cache.read(20).unwrap();
    fill(&cache, &b20, 0x20);
    cache.write_now(&[&b20]).unwrap();
    drop(b20);
    for b in 30..40 {
        cache.read(b).unwrap();
    }
    assert!(cache.lookup(20).is_some(), "written clean, still kept");
    cache.rollback_undo().unwrap();
    assert_eq!(content(&cache, 20), Some((vec![0; BS as usize], false)));
    assert_eq!(dev_block(&dev, 20), vec![0; BS as usize]);
}

/// `write_range` saves only the bytes it hands out; saves of one buffer apply newest first,
/// whatever mix of ranges and whole-block saves the scope made; `write_untracked` saves
/// nothing.
#[test]
fn range_saves_restore_exactly() {
    let dev = mem(8);
    let cache = cache_over(dev.clone(), 8);
    let b = cache.read(1).unwrap();
    for (i, x) in b.write().iter_mut().enumerate() {
        *x = i as u8;
    }
    let orig = b.read().clone();
    cache.begin_undo().unwrap();
    b.write_range(10, 4).fill(0xAA);
    b.write_range(12, 8).fill(0xBB); // overlaps the first range
    b.write_range(500, 100).fill(0xCC); // cut to the block
    b.write()[0] = 0xDD; // now a whole-block save of the changed contents
    b.write_range(11, 2).fill(0xEE); // after a whole save: nothing more to save
    cache.mark_dirty(&b);
    cache.rollback_undo().unwrap();
    assert_eq!(*b.read(), orig);
    assert!(!b.is_dirty());

    cache.begin_undo().unwrap();
    b.write_untracked()[0] = 0x11;
    cache.rollback_undo().unwrap();
    assert_eq!(b.read()[0], 0x11, "an untracked change is not taken back");
}

/// A block whose untouched (dirty) buffer the scope invalidated, then created anew: the
/// rollback drops the new buffer and puts the old one back, contents and dirty flag.
#[test]
fn rollback_of_free_then_reuse_keeps_the_old_buffer() {
    let dev = mem(8);
    let cache = cache_over(dev.clone(), 8);
    fill(&cache, &cache.read(3).unwrap(), 0x33);
    cache.begin_undo().unwrap();
    cache.invalidate(3);
    fill(&cache, &cache.get_new(3), 0x44);
    cache.rollback_undo().unwrap();
    assert_eq!(content(&cache, 3), Some((vec![0x33; BS as usize], true)));
    // The same, with the new buffer written in the scope: the replay puts the old
    // buffer's contents on the device.
    cache.begin_undo().unwrap();
    cache.invalidate(3);
    let b = cache.get_new(3);
    fill(&cache, &b, 0x55);
    cache.write_now(&[&b]).unwrap();
    drop(b);
    cache.rollback_undo().unwrap();
    assert_eq!(dev_block(&dev, 3), vec![0x33; BS as usize]);
    assert_eq!(content(&cache, 3).unwrap().0, vec![0x33; BS as usize]);
}

/// A write-back on another thread that copied a buffer the scope changed, and has not yet
/// written it, when the scope is rolled back: the rollback waits for that write and then
/// puts the block's old contents back on the device, so the device and the (clean)
/// buffer agree. Without the wait the write lands after the rollback and the clean buffer
/// hides a device block holding the taken-back change.
#[test]
fn rollback_waits_for_a_concurrent_write_back_of_a_changed_block() {
    let dev = mem(16);
    dev.write_blocks(6, &[1; BS as usize]).unwrap();
    let (reached_tx, reached_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let hooks = Arc::new(Pause {
        reached: Mutex::new(Some(reached_tx)),
        release: Mutex::new(Some(release_rx)),
    });
    let cache = BufferCache::new(dev.clone(), CacheConfig::default(), hooks);
    let buf = cache.read(6).unwrap();
    cache.begin_undo().unwrap();
    fill(&cache, &buf, 2);
    let writer = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || cache.write_back_all())
    };
    reached_rx.recv().unwrap(); // the image (all 2s) is copied; the write is pending
    let rollback = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || cache.rollback_undo())
    };
    std::thread::sleep(Duration::from_millis(100));
    release_tx.send(()).unwrap();
    writer.join().unwrap().unwrap();
    rollback.join().unwrap().unwrap();
    assert_eq!(*buf.read(), vec![1; BS as usize]);
    assert_eq!(
        dev_block(&dev, 6),
        vec![1; BS as usize],
        "the taken-back change reached the device after the rollback"
    );
    cache.write_back_all().unwrap();
    assert_eq!(dev_block(&dev, 6), vec![1; BS as usize]);
}

/// Block 6 of `dev` cached with 1s and written back, its write held in flight while the
/// block is freed (`invalidate`) and `direct` runs on another thread; returns whether
/// `direct` waited for the old write (it had not finished 100 ms later), once both are done.
fn direct_after_a_freed_write_in_flight(
    dev: &Arc<MemDevice>,
    direct: impl FnOnce(&BufferCache) -> io::Result<()> + Send + 'static,
) -> bool {
    let (reached_tx, reached_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let hooks = Arc::new(Pause {
        reached: Mutex::new(Some(reached_tx)),
        release: Mutex::new(Some(release_rx)),
    });
    let cache = BufferCache::new(dev.clone(), CacheConfig::default(), hooks);
    fill(&cache, &cache.get_new(6), 1);
    let old_writer = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || cache.write_back_all())
    };
    reached_rx.recv().unwrap(); // the old image is copied; its write is in flight
    cache.invalidate(6);
    let inserted = cache.stats().insertions;
    let direct = {
        let cache = Arc::clone(&cache);
        std::thread::spawn(move || direct(&cache))
    };
    std::thread::sleep(Duration::from_millis(100));
    let waited = !direct.is_finished();
    release_tx.send(()).unwrap();
    old_writer.join().unwrap().unwrap();
    direct.join().unwrap().unwrap();
    assert_eq!(cache.stats().insertions, inserted, "no buffer made");
    assert!(cache.lookup(6).is_none());
    waited
}

/// A block freed while a write of it is in flight, then written straight to the device
/// (a stream into the block's next owner): the direct write waits for the old one, so the
/// device ends with the new contents.
#[test]
fn write_uncached_waits_for_a_freed_buffer_in_flight() {
    let dev = mem(16);
    let waited =
        direct_after_a_freed_write_in_flight(&dev, |c| c.write_uncached(6, &[2; BS as usize]));
    assert!(waited, "the direct write did not wait for the old one");
    assert_eq!(dev_block(&dev, 6), vec![2; BS as usize]);
}

/// A zero range over a block freed while a write of it is in flight (fallocate's new
/// blocks): the zeroing waits for the old write, so the device ends with zeros; it is one
/// device request and puts no buffer in the cache.
#[test]
fn zero_uncached_waits_for_a_freed_buffer_in_flight_and_caches_nothing() {
    let dev = mem(16);
    dev.write_blocks(0, &[7; 16 * BS as usize]).unwrap();
    let before = dev.counters().snapshot();
    let waited = direct_after_a_freed_write_in_flight(&dev, |c| c.zero_uncached(4, 6));
    assert!(waited, "the zeroing did not wait for the old write");
    for blk in 0..16 {
        let want = if (4..10).contains(&blk) { 0 } else { 7 };
        assert_eq!(dev_block(&dev, blk), vec![want; BS as usize], "block {blk}");
    }
    let d = dev.counters().snapshot().delta(&before);
    assert_eq!(
        (d.zeroes, d.blocks_written),
        (1, 6 + 1),
        "one zero request, one old write"
    );
}

/// The touched mask names every 1/64th a change reached since it was last taken: all of a
/// new buffer, the grains of each `write_range`, all after `write`, `write_untracked` or a
/// rollback; taking it clears it.
#[test]
fn touched_names_every_changed_grain() {
    let dev = mem(8);
    let cache = cache_over(dev.clone(), 8);
    let b = cache.read(1).unwrap();
    let grain = Buf::grain_of(BS as usize);
    assert_eq!(b.take_touched(), u64::MAX, "a new buffer: all of it");
    assert_eq!(b.take_touched(), 0);
    b.write_range(grain - 1, 2).fill(1); // straddles grains 0 and 1
    b.write_range(5 * grain, grain).fill(2); // exactly grain 5
    b.write_range(BS as usize - 1, 100).fill(3); // cut to the block: the last grain
    b.write_range(7 * grain, 0).fill(4); // empty: nothing
    assert_eq!(b.take_touched(), 0b11 | 1 << 5 | 1 << 63);
    b.write()[0] = 1;
    assert_eq!(b.take_touched(), u64::MAX);
    b.write_untracked()[0] = 2;
    assert_eq!(b.take_touched(), u64::MAX);
    cache.begin_undo().unwrap();
    b.write_range(0, 1).fill(9);
    cache.rollback_undo().unwrap();
    assert_eq!(b.take_touched(), u64::MAX, "a rollback: all of it");
}

/// A hit on a buffer among the youngest quarter of the cache does not reorder the LRU (no
/// tick spent, no ordered-map update): the repeated hits of a streaming call on its indirect
/// and bitmap blocks cost a hash lookup each. An older buffer's hit still moves it.
#[test]
fn a_hit_on_a_young_buffer_leaves_the_lru_order_alone() {
    let cache = cache_over(mem(256), 64);
    for b in 0..64 {
        cache.read(b).unwrap();
    }
    let ticks = cache.state.lock().next_tick;
    for _ in 0..10 {
        cache.read(63).unwrap();
        cache.read(60).unwrap();
    }
    assert_eq!(
        cache.state.lock().next_tick,
        ticks,
        "young hits moved buffers"
    );
    cache.read(0).unwrap();
    assert_eq!(
        cache.state.lock().next_tick,
        ticks + 1,
        "an old hit did not move"
    );
    // Block 0 is now the youngest: the next insertion evicts block 1, the oldest.
    cache.read(100).unwrap();
    assert!(cache.lookup(0).is_some());
    assert!(cache.lookup(1).is_none());
}

/// What LRU promises survives the young-hit shortcut: a block hit at least once per quarter
/// of the cache's turnover is never evicted, however many other blocks pass through.
#[test]
fn a_block_hit_within_each_quarter_turnover_stays_cached() {
    let cache = cache_over(mem(4096), 64);
    let hot = 4000;
    cache.read(hot).unwrap();
    for b in 0..2000 {
        cache.read(b).unwrap();
        if b % 8 == 0 {
            cache.read(hot).unwrap();
        }
        assert!(
            cache.lookup(hot).is_some(),
            "hot block evicted after block {b}"
        );
    }
    assert_eq!(cache.stats().cached_buffers, 64);
}
