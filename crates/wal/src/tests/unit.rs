//! The log's behaviour on a memory device: round trips, wrap-around, stale laps, torn
//! sectors, ghosts, checkpoint alternation, space accounting, refusals.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_blockdev::{BlockDevice, FaultDevice, MemDevice};

use crate::format::{REC_HEADER, record_size};
use crate::plant::{self, Plant};
use crate::{End, FormatOptions, GroupWait, Lsn, Options, Region, Wal, WalError, read_superblocks};

/// A formatted log of `data_blocks` data blocks of `bs` bytes, on a device with `pad` blocks
/// before the region (so region offsets are exercised).
pub(crate) fn log_dev(bs: u32, data_blocks: u64, pad: u64) -> (Arc<MemDevice>, Region) {
    let dev = Arc::new(MemDevice::new(bs, pad + 2 + data_blocks + 3));
    let region = Region {
        first_block: pad,
        blocks: 2 + data_blocks,
    };
    let fo = FormatOptions {
        uuid: Some([0xab; 16]),
        ..Default::default()
    };
    Wal::format(&*dev, region, &fo).unwrap();
    (dev, region)
}

fn open(dev: &Arc<MemDevice>, region: Region) -> Wal {
    Wal::open(dev.clone(), region).unwrap()
}

fn records(w: &Wal) -> Vec<(u64, Vec<u8>)> {
    w.scan(w.checkpoint())
        .map(|r| {
            let r = r.unwrap();
            (r.lsn.0, r.data)
        })
        .collect()
}

fn payload(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
}

/// Overwrites bytes of the log's data area at `lsn` directly on the device (a torn or damaged
/// write, a record that never landed).
fn poke(dev: &MemDevice, region: Region, capacity: u64, lsn: u64, bytes: &[u8]) {
    let bs = u64::from(dev.block_size());
    for (i, &b) in bytes.iter().enumerate() {
        let off = (lsn + i as u64) % capacity;
        let blk = region.first_block + 2 + off / bs;
        let mut block = vec![0u8; bs as usize];
        dev.read_blocks(blk, &mut block).unwrap();
        block[(off % bs) as usize] = b;
        dev.write_blocks(blk, &block).unwrap();
    }
}

#[test]
fn a_new_log_is_empty_and_each_open_is_a_new_epoch() {
    let (dev, region) = log_dev(512, 16, 3);
    let w = open(&dev, region);
    let c = w.capacity();
    assert_eq!(c, 16 * 512);
    assert_eq!(
        (w.checkpoint(), w.end(), w.durable()),
        (Lsn(c), Lsn(c), Lsn(c))
    );
    assert_eq!(w.recovery().stop, End::Unwritten);
    assert_eq!(w.epoch(), 1);
    assert_eq!(w.used_bytes(), 0);
    assert_eq!(w.free_bytes(), c);
    drop(w);
    assert_eq!(open(&dev, region).epoch(), 2);
    // A read-only open changes nothing.
    let before = dev.to_bytes();
    let r = Wal::open_read_only(dev.clone(), region).unwrap();
    assert_eq!(r.epoch(), 2);
    assert!(matches!(r.append(b"x"), Err(WalError::ReadOnly)));
    assert_eq!(dev.to_bytes(), before);
}

#[test]
fn append_force_read_scan_and_reopen() {
    let (dev, region) = log_dev(4096, 16, 0);
    let w = open(&dev, region);
    let writes = dev.counters().snapshot().writes;
    let mut want = Vec::new();
    for i in 0..20u64 {
        let p = payload(i, (i * 97 % 700) as usize);
        let lsn = w.append(&p).unwrap();
        assert!(want.last().is_none_or(|&(l, _)| lsn.0 > l), "LSNs grow");
        want.push((lsn.0, p));
    }
    // Readable before anything is written: from memory.
    assert_eq!(records(&w), want);
    assert_eq!(w.read(Lsn(want[5].0)).unwrap().data, want[5].1);
    assert_eq!(
        dev.counters().snapshot().writes,
        writes,
        "appends alone do not write"
    );
    w.force(Lsn(want[19].0)).unwrap();
    assert_eq!(w.durable(), w.end());
    // Forcing an earlier record again costs nothing.
    let flushes = w.stats().flushes;
    w.force(Lsn(want[3].0)).unwrap();
    assert_eq!(w.stats().flushes, flushes);
    assert!(w.stats().forces_already_durable >= 1);
    // A record whose bytes span the written tail block and memory reads back.
    let extra = w.append(&payload(99, 5000)).unwrap();
    assert_eq!(w.read(extra).unwrap().data, payload(99, 5000));
    w.close().unwrap();
    let w = open(&dev, region);
    want.push((extra.0, payload(99, 5000)));
    assert_eq!(records(&w), want);
    assert_eq!(w.recovery().records, 21);
    assert_eq!(w.recovery().stop, End::Unwritten);
}

#[test]
fn forcing_what_was_never_appended_is_an_error() {
    let (dev, region) = log_dev(512, 16, 0);
    let w = open(&dev, region);
    assert!(matches!(w.force(w.end()), Err(WalError::NotAppended(_))));
    let l = w.append(b"a").unwrap();
    w.force(l).unwrap();
    w.sync().unwrap();
    assert!(matches!(
        w.force(Lsn(l.0 + 40)),
        Err(WalError::NotAppended(_))
    ));
}

#[test]
fn big_records_and_records_across_the_wrap_point() {
    let (dev, region) = log_dev(512, 16, 2);
    let w = open(&dev, region);
    let c = w.capacity();
    let mut live: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut crossed = 0;
    for i in 0..200u64 {
        let p = payload(i, [5usize, 700, 1900, 64, 3000][i as usize % 5]);
        let lsn = loop {
            match w.append(&p) {
                Ok(l) => break l,
                Err(WalError::Full { .. }) => {
                    // Release all but the last two records.
                    let keep = live.len().saturating_sub(2);
                    let at = live.get(keep).map_or(w.end().0, |r| r.0);
                    w.set_checkpoint(Lsn(at)).unwrap();
                    live.drain(..keep);
                }
                Err(e) => panic!("{e}"),
            }
        };
        if lsn.0 % c + record_size(p.len() as u64) > c {
            crossed += 1;
        }
        live.push((lsn.0, p));
        if i % 3 == 0 {
            w.force(lsn).unwrap();
        }
    }
    assert!(
        crossed >= 5,
        "records crossed the wrap point {crossed} times"
    );
    assert!(w.end().0 > 10 * c, "the log went round many times");
    w.close().unwrap();
    let w = open(&dev, region);
    assert_eq!(records(&w), live);
    for (lsn, p) in &live {
        assert_eq!(&w.read(Lsn(*lsn)).unwrap().data, p);
    }
}

#[test]
fn a_record_of_an_earlier_lap_ends_the_log() {
    let (dev, region) = log_dev(512, 16, 0);
    let w = open(&dev, region);
    let c = w.capacity();
    // One-block records, so every block starts with a record header lap after lap (a tail
    // block is rewritten with zeros past the end, which would wipe an old header in it).
    const P: usize = 512 - REC_HEADER;
    let mut last = Lsn(0);
    while w.end().0 < 2 * c - 1000 {
        match w.append(&[1u8; P]) {
            Ok(l) => last = l,
            Err(WalError::Full { .. }) => w.set_checkpoint(last).unwrap(),
            Err(e) => panic!("{e}"),
        }
    }
    w.set_checkpoint(w.end()).unwrap();
    let l = w.append(&[2u8; P]).unwrap();
    w.force(l).unwrap();
    drop(w);
    let w = open(&dev, region);
    assert_eq!(w.recovery().records, 1);
    let next = l.0 + 512;
    assert_eq!(w.recovery().stop, End::EarlierLap { found: next - c });
    assert_eq!(w.end().0, next);
}

#[test]
fn a_torn_sector_ends_the_log_and_nothing_after_it_is_recovered() {
    let (dev, region) = log_dev(4096, 16, 0);
    let w = open(&dev, region);
    let a = w.append(&payload(1, 100)).unwrap();
    let b = w.append(&payload(2, 2000)).unwrap(); // spans sectors 0..4 of its block
    let c = w.append(&payload(3, 100)).unwrap();
    w.force(c).unwrap();
    let cap = w.capacity();
    drop(w);
    // The third sector of b's bytes did not land: it holds what was there before (zeros).
    let sector = (b.0 + 1024) / 512 * 512;
    poke(&dev, region, cap, sector, &[0u8; 512]);
    let w = open(&dev, region);
    assert_eq!(w.recovery().stop, End::Torn);
    assert_eq!(
        records(&w).iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![a.0]
    );
    assert_eq!(w.end(), b, "appending resumes where the torn record was");
}

#[test]
fn checksum_is_what_catches_a_torn_record() {
    // The same damage with the checksum check planted away: the torn record is "recovered".
    let (dev, region) = log_dev(4096, 16, 0);
    let w = open(&dev, region);
    w.append(&payload(1, 100)).unwrap();
    let b = w.append(&payload(2, 2000)).unwrap();
    w.sync().unwrap();
    let cap = w.capacity();
    drop(w);
    poke(&dev, region, cap, b.0 + 1024, &[0xee; 8]);
    plant::set(Some(Plant::SkipChecksum));
    let w = open(&dev, region);
    plant::set(None);
    assert_eq!(
        w.recovery().records,
        2,
        "planted: the torn record is accepted"
    );
}

/// The ghost scenario of `Wal::open_with`: a record that did not land, one after it that did,
/// and a later open that appends over the gap.
///
/// r3 starts on a block boundary: the later open rewrites its tail block with zeros past its
/// end, which would wipe a ghost in that block (a torn rewrite need not: the crash test covers
/// that case).
const R2: usize = 512 - 72 - REC_HEADER;

fn ghost_setup() -> (Arc<MemDevice>, Region, Lsn, Lsn, Lsn) {
    let (dev, region) = log_dev(512, 32, 0);
    let w = open(&dev, region);
    let r1 = w.append(&payload(1, 40)).unwrap();
    let r2 = w.append(&payload(2, R2)).unwrap();
    let r3 = w.append(&payload(3, 40)).unwrap();
    assert_eq!(r3.0 % 512, 0);
    w.sync().unwrap();
    let cap = w.capacity();
    drop(w);
    // r2 never landed; r3 did.
    poke(&dev, region, cap, r2.0, &[0u8; 32]);
    (dev, region, r1, r2, r3)
}

#[test]
fn ghosts_of_an_earlier_open_are_not_recovered() {
    let (dev, region, r1, r2, r3) = ghost_setup();
    let w = open(&dev, region);
    assert_eq!(w.end(), r2);
    assert_eq!(w.recovery().stop, End::Unwritten);
    // The second open appends a record of r2's size: the next position is r3, a ghost.
    let n = w.append(&payload(9, R2)).unwrap();
    assert_eq!(n, r2);
    w.force(n).unwrap();
    drop(w);
    let w = open(&dev, region);
    assert_eq!(
        records(&w),
        vec![(r1.0, payload(1, 40)), (r2.0, payload(9, R2))],
        "r3 is a ghost"
    );
    assert_eq!(w.recovery().stop, End::EarlierOpen { epoch: 1, least: 2 });
    assert_eq!(w.end().0, r3.0);
}

#[test]
fn a_ghost_at_the_checkpoint_is_not_recovered() {
    let (dev, region, _r1, r2, r3) = ghost_setup();
    let w = open(&dev, region);
    w.append(&payload(9, R2)).unwrap();
    // Everything applied: the checkpoint is the end, which is where the ghost r3 sits.
    w.set_checkpoint(w.end()).unwrap();
    assert_eq!(w.checkpoint(), r3);
    drop(w);
    let w = open(&dev, region);
    assert_eq!(
        w.recovery().records,
        0,
        "the ghost at the checkpoint is refused"
    );
    assert_eq!(w.recovery().stop, End::EarlierOpen { epoch: 1, least: 2 });
    let _ = r2;
}

/// What the crash test found: a torn write of a new open completes an old torn record at the
/// same LSN. Open 1's record r2 straddles a sector boundary with its first 8 header bytes
/// (magic, length) in the first sector; that sector did not land, the rest did. Open 2
/// recovers up to r2, appends r2' of the same length there, and its write tears the other
/// way: only the first sector lands. Sector by sector, r2 is whole again, checksum and all.
fn fragment_setup() -> (Arc<MemDevice>, Region, Lsn, Lsn) {
    let (dev, region) = log_dev(4096, 16, 0);
    let w = open(&dev, region);
    let cap = w.capacity();
    let r1 = w.append(&payload(1, 504 - REC_HEADER)).unwrap();
    let r2 = w.append(&payload(2, 300)).unwrap();
    assert_eq!(r2.0 % 512, 504);
    w.sync().unwrap();
    drop(w);
    poke(&dev, region, cap, r2.0, &[0u8; 8]);
    let before = dev.to_bytes();
    let w = open(&dev, region);
    assert_eq!(w.end(), r2);
    let n = w.append(&payload(9, 300)).unwrap();
    w.sync().unwrap();
    drop(w);
    // The torn write: only the first sector of the data area's block 0 landed.
    let data0 = ((region.first_block + 2) * 4096) as usize;
    let mut now = dev.to_bytes();
    now[data0 + 512..data0 + 4096].copy_from_slice(&before[data0 + 512..data0 + 4096]);
    let dev = Arc::new(MemDevice::from_bytes(4096, now));
    (dev, region, r1, n)
}

#[test]
fn a_torn_write_cannot_complete_an_old_record() {
    let (dev, region, r1, _) = fragment_setup();
    let w = open(&dev, region);
    assert_eq!(records(&w), vec![(r1.0, payload(1, 504 - REC_HEADER))]);
    assert_eq!(w.recovery().stop, End::EarlierOpen { epoch: 1, least: 2 });
    // Without the superblock's epoch_start the fragments pass for a record.
    let (dev, region, r1, r2) = fragment_setup();
    plant::set(Some(Plant::NoEpochStart));
    let w = open(&dev, region);
    plant::set(None);
    assert_eq!(
        records(&w),
        vec![
            (r1.0, payload(1, 504 - REC_HEADER)),
            (r2.0, payload(2, 300))
        ],
        "planted: open 1's torn r2 is back"
    );
}

#[test]
fn without_epochs_the_log_is_wrong() {
    for p in [Plant::NoEpochCheck, Plant::NoEpochBump] {
        let (dev, region, r1, r2, _r3) = ghost_setup();
        plant::set(Some(p));
        let w = open(&dev, region);
        w.append(&payload(9, R2)).unwrap();
        w.sync().unwrap();
        drop(w);
        let w = open(&dev, region);
        plant::set(None);
        // Unchecked epochs bring the ghost back; an epoch that is not new makes the
        // records before this open's start look impossible.
        assert_ne!(
            records(&w),
            vec![(r1.0, payload(1, 40)), (r2.0, payload(9, R2))],
            "{p:?}"
        );
    }
}

#[test]
fn superblock_copies_alternate_and_a_damaged_newest_copy_falls_back() {
    let (dev, region) = log_dev(512, 32, 1);
    let w = open(&dev, region);
    let seq = |dev: &MemDevice| {
        read_superblocks(dev, region)
            .unwrap()
            .map(|c| c.map(|s| (s.sequence, s.checkpoint)).unwrap())
    };
    // format: 0 and 1; open: 2 (copy 0).
    let s = seq(&dev);
    assert_eq!((s[0].0, s[1].0), (2, 1));
    let a = w.append(&payload(1, 100)).unwrap();
    let b = w.append(&payload(2, 100)).unwrap();
    let c = w.append(&payload(3, 100)).unwrap();
    w.set_checkpoint(b).unwrap();
    let s = seq(&dev);
    assert_eq!(s[1], (3, b.0), "the checkpoint went to copy 1");
    w.set_checkpoint(c).unwrap();
    let s = seq(&dev);
    assert_eq!(s[0], (4, c.0), "the next to copy 0");
    assert_eq!(s[1], (3, b.0), "copy 1 kept the previous checkpoint");
    drop(w);
    // The newest copy is damaged (a bad sector): the older one is used, and its records are
    // still there because space is only reused once the newer copy was durable.
    let mut blk = vec![0u8; 512];
    dev.read_blocks(region.first_block, &mut blk).unwrap();
    blk[100] ^= 0xff;
    dev.write_blocks(region.first_block, &blk).unwrap();
    let w = Wal::open_read_only(dev.clone(), region).unwrap();
    assert_eq!(w.checkpoint(), b);
    assert_eq!(
        records(&w),
        vec![(b.0, payload(2, 100)), (c.0, payload(3, 100))]
    );
    let _ = a;
}

#[test]
fn space_accounting_full_refusal_and_the_low_space_signal() {
    let (dev, region) = log_dev(512, 16, 0);
    let fired = Arc::new(AtomicU64::new(0));
    let f2 = fired.clone();
    let opts = Options {
        low_water: Some(2048),
        on_low_space: Some(Arc::new(move |_| {
            f2.fetch_add(1, Ordering::SeqCst);
        })),
        ..Default::default()
    };
    let w = Wal::open_with(dev.clone(), region, opts).unwrap();
    let c = w.capacity();
    assert_eq!(w.max_record(), c - 1024 - REC_HEADER as u64);
    assert!(matches!(
        w.append(&vec![0; w.max_record() as usize + 1]),
        Err(WalError::TooLarge { .. })
    ));
    let mut lsns = Vec::new();
    loop {
        let before = w.space();
        match w.append(&[7u8; 300]) {
            Ok(l) => {
                lsns.push(l);
                let after = w.space();
                assert_eq!(after.used, before.used + record_size(300));
                assert_eq!(after.free, before.free - record_size(300));
            }
            Err(WalError::Full { needed, free }) => {
                assert_eq!(needed, record_size(300));
                assert!(free < needed);
                assert_eq!(w.space(), before, "a refused append changes nothing");
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(fired.load(Ordering::SeqCst), 1, "signalled once");
    assert!(w.needs_checkpoint());
    assert_eq!(w.stats().full_refusals, 1);
    // used + free = capacity, less the part of the checkpoint's block before it.
    let sp = w.space();
    assert_eq!(sp.used + sp.free, c - (sp.checkpoint.0 % 512));
    // Releasing half makes room; the signal re-arms.
    let half = lsns[lsns.len() / 2];
    w.set_checkpoint(half).unwrap();
    assert!(!w.needs_checkpoint());
    let free = w.free_bytes();
    assert!(free >= c / 2 - 512 - 400, "{free}");
    let l = w.append(&[8u8; 300]).unwrap();
    w.force(l).unwrap();
    while w.append(&[9u8; 300]).is_ok() {}
    assert_eq!(fired.load(Ordering::SeqCst), 2);
    drop(w);
    let w = open(&dev, region);
    assert_eq!(w.checkpoint(), half);
}

#[test]
fn without_the_space_check_an_append_overwrites_unreleased_records() {
    let (dev, region) = log_dev(512, 16, 0);
    let w = open(&dev, region);
    let first = w.append(&[1u8; 300]).unwrap();
    w.force(first).unwrap();
    plant::set(Some(Plant::ReuseUnreleased));
    let mut n = 0;
    while w.end().0 < first.0 + w.capacity() + 512 {
        let l = w.append(&[2u8; 300]).unwrap();
        w.force(l).unwrap();
        n += 1;
    }
    plant::set(None);
    assert!(n > 0);
    assert!(
        !matches!(w.read(first), Ok(r) if r.data == [1u8; 300]),
        "planted: the unreleased first record was overwritten"
    );
}

#[test]
fn checkpoint_and_read_refusals() {
    let (dev, region) = log_dev(512, 16, 0);
    let w = open(&dev, region);
    let a = w.append(&[1u8; 100]).unwrap();
    let b = w.append(&[2u8; 100]).unwrap();
    assert!(matches!(
        w.set_checkpoint(Lsn(a.0 + 8)),
        Err(WalError::NotARecord(_))
    ));
    assert!(matches!(
        w.set_checkpoint(Lsn(w.end().0 + 8)),
        Err(WalError::NotAppended(_))
    ));
    w.set_checkpoint(b).unwrap();
    assert!(matches!(
        w.set_checkpoint(a),
        Err(WalError::Released { .. })
    ));
    assert!(matches!(w.read(a), Err(WalError::Released { .. })));
    assert!(matches!(w.read(Lsn(b.0 + 8)), Err(WalError::NotARecord(_))));
    assert!(matches!(w.read(w.end()), Err(WalError::NotAppended(_))));
    assert!(matches!(
        w.scan(a).next(),
        Some(Err(WalError::Released { .. }))
    ));
    w.set_checkpoint(w.end()).unwrap();
    assert_eq!(w.used_bytes(), 0);
}

#[test]
fn hostile_regions_are_refused_with_one_line() {
    let msg = |r: Result<Wal, WalError>| {
        let e = r.unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    };
    // Too small; outside the device.
    let dev = Arc::new(MemDevice::new(512, 64));
    let e = msg(Wal::open(
        dev.clone(),
        Region {
            first_block: 0,
            blocks: 9,
        },
    ));
    assert!(e.contains("not a cairn write-ahead log"), "{e}");
    let (logdev, _) = log_dev(512, 16, 0);
    let e = msg(Wal::open(
        logdev,
        Region {
            first_block: 0,
            blocks: 9,
        },
    ));
    assert!(e.contains("too small"), "{e}");
    let e = msg(Wal::open(
        dev.clone(),
        Region {
            first_block: 60,
            blocks: 10,
        },
    ));
    assert!(e.contains("do not lie on"), "{e}");
    // Zeros; something else.
    let e = msg(Wal::open(dev.clone(), Region::whole(&*dev)));
    assert!(
        e.contains("not a cairn write-ahead log (it holds only zeros)"),
        "{e}"
    );
    let mut ext4 = vec![0u8; 64 * 512];
    ext4[1080] = 0x53;
    ext4[1081] = 0xef;
    let dev = Arc::new(MemDevice::from_bytes(512, ext4));
    let e = msg(Wal::open(dev.clone(), Region::whole(&*dev)));
    assert!(e.contains("ext2/ext3/ext4"), "{e}");
    let mut ffs = vec![0u8; 64 * 512];
    ffs[..8].copy_from_slice(b"CAIRNFFS");
    let dev = Arc::new(MemDevice::from_bytes(512, ffs));
    let e = msg(Wal::open(dev.clone(), Region::whole(&*dev)));
    assert!(e.contains("cairn FFS"), "{e}");
    // Both copies damaged.
    let (dev, region) = log_dev(512, 16, 0);
    for blk in 0..2 {
        let mut b = vec![0u8; 512];
        dev.read_blocks(blk, &mut b).unwrap();
        b[50] ^= 1;
        dev.write_blocks(blk, &b).unwrap();
    }
    let e = msg(Wal::open(dev.clone(), region));
    assert!(
        e.contains("both superblock copies") && e.contains("checksum"),
        "{e}"
    );
    // Truncated (the region is shorter than the log), another block size, copies of two logs.
    let (dev, region) = log_dev(512, 16, 0);
    let short = Region {
        blocks: region.blocks - 1,
        ..region
    };
    let e = msg(Wal::open(dev.clone(), short));
    assert!(e.contains("truncated"), "{e}");
    let big: Arc<dyn BlockDevice> = Arc::new(dev.with_block_size(1024));
    let e = msg(Wal::open(big.clone(), Region::whole(&*big)));
    assert!(e.contains("512-byte blocks"), "{e}");
    let (dev, region) = log_dev(512, 16, 0);
    let other = MemDevice::new(512, 18);
    Wal::format(&other, Region::whole(&other), &FormatOptions::default()).unwrap();
    let mut b = vec![0u8; 512];
    other.read_blocks(1, &mut b).unwrap();
    dev.write_blocks(1, &b).unwrap();
    let e = msg(Wal::open(dev.clone(), region));
    assert!(e.contains("different logs"), "{e}");
    // Another owner.
    let (dev, region) = log_dev(512, 16, 0);
    let opts = Options {
        expect_owner: Some([5; 16]),
        ..Default::default()
    };
    let e = msg(Wal::open_with(dev.clone(), region, opts.clone()));
    assert!(e.contains("another owner"), "{e}");
    open(&dev, region).set_owner([5; 16]).unwrap();
    Wal::open_with(dev.clone(), region, opts).unwrap();
}

#[test]
fn write_behind_writes_full_blocks_without_flushing() {
    let (dev, region) = log_dev(512, 64, 0);
    let opts = Options {
        write_behind: Some(1024),
        ..Default::default()
    };
    let w = Wal::open_with(dev.clone(), region, opts).unwrap();
    let flushes = dev.counters().snapshot().flushes;
    let mut want = Vec::new();
    for i in 0..40u64 {
        let p = payload(i, 150);
        want.push((w.append(&p).unwrap().0, p));
    }
    let s = w.stats();
    assert!(s.write_behinds >= 4, "{s:?}");
    assert_eq!(
        dev.counters().snapshot().flushes,
        flushes,
        "write-behind never flushes"
    );
    assert!(w.durable().0 < want[0].0 + 1, "nothing is durable yet");
    assert_eq!(records(&w), want);
    // What write-behind wrote is on the device: a crash now recovers a prefix of it.
    drop(w);
    let w = open(&dev, region);
    let got = records(&w);
    assert!(got.len() >= 20 && got.len() < 40, "{}", got.len());
    assert_eq!(got[..], want[..got.len()]);
}

#[test]
fn a_device_failure_poisons_the_log() {
    let (mem, region) = log_dev(512, 16, 0);
    let fault = Arc::new(FaultDevice::new(mem.clone()));
    let w = Wal::open(fault.clone(), region).unwrap();
    let a = w.append(b"one").unwrap();
    fault.set_fail_after(Some(0));
    assert!(matches!(w.force(a), Err(WalError::Io(_))));
    fault.heal();
    assert!(matches!(w.force(a), Err(WalError::Failed(_))));
    assert!(matches!(w.append(b"two"), Err(WalError::Failed(_))));
    assert!(matches!(
        w.set_checkpoint(w.end()),
        Err(WalError::Failed(_))
    ));
    // Reads still work.
    assert_eq!(w.read(a).unwrap().data, b"one");
}

#[test]
fn group_wait_configurations_report_their_wait() {
    let (dev, region) = log_dev(512, 16, 0);
    for (gw, want) in [
        (GroupWait::Off, Some(0)),
        (
            GroupWait::Fixed(std::time::Duration::from_micros(700)),
            Some(700_000),
        ),
        (
            GroupWait::Auto {
                max: std::time::Duration::ZERO,
            },
            Some(0),
        ),
        (GroupWait::default(), None),
    ] {
        let w = Wal::open_with(
            dev.clone(),
            region,
            Options {
                group_wait: gw,
                ..Default::default()
            },
        )
        .unwrap();
        let s = w.stats();
        if let Some(want) = want {
            assert_eq!(s.group_wait_ns, want, "{gw:?}");
        } else {
            // Auto: the flush time measured at open (a memory device: tiny, but measured).
            assert_eq!(s.group_wait_ns, s.flush_avg_ns.min(10_000_000));
        }
        // A lone forcer never waits for a group.
        for i in 0..5 {
            let l = w.append(&[i; 10]).unwrap();
            w.force(l).unwrap();
        }
        let s = w.stats();
        assert_eq!((s.leader_waits, s.groups, s.group_max), (0, 5, 1));
    }
}
