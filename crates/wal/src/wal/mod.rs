//! The log: format, open (recovery), append, checkpoint; forcing, group commit and the I/O
//! path are in `commit.rs`, reads in `read.rs`.
//!
//! # State and the invariants it keeps
//!
//! Every LSN below `end` belongs to an appended record. Of those bytes:
//! - `[buf_start, end)` is in memory (`buf`); `buf_start` is the start of the block holding
//!   `written`, so the tail block's bytes that are already on the device are kept and written
//!   again, identical, when the block is next written (a sector write that lands either way
//!   leaves those bytes as they were: docs/DESIGN.md, "Assumptions about the device");
//! - `[.., written)` has been handed to the device;
//! - every record starting below `durable` is durable: a flush returned after the write of
//!   every byte below `durable`. `durable` is always a record boundary because every flush
//!   the log issues follows a write of everything appended so far.
//!
//! Space: the data area holds one lap. The live log is `[checkpoint, end)`, where
//! `checkpoint` is the one in the *durable* superblock; since the log is written in whole
//! blocks, the checkpoint's block counts whole. An append must keep `end` within one lap of
//! that block (`Geometry::span`), so no write can land on a byte recovery would need: the
//! live records from the durable checkpoint on. Space a checkpoint releases becomes usable
//! only once the superblock naming it is durable — otherwise a crash would send recovery to
//! the old checkpoint, whose records new ones had overwritten.
//!
//! # Who does I/O
//!
//! One thread at a time (`io_busy`): a forcing leader, an appender writing behind, a
//! checkpoint. It copies what to write under the state lock and writes without it, so appends
//! continue during a flush — they form the next group. The lock is never held across I/O.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cairn_blockdev::BlockDevice;
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::error::WalError;
use crate::format::{self, REC_HEADER, RecordHeader, SB_BYTES, Superblock, record_size};
use crate::plant::{self, Plant};
use crate::recover::{self, Recovery};
use crate::region::{Geometry, Region, Window};
use crate::stats::WalStats;
use crate::{Lsn, now_ns};

mod commit;
mod read;

pub use read::Scan;

/// How long a group-commit leader waits for more forcers before it writes (001 §3.2: "such
/// operations block to allow multiple requests to be batched together").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupWait {
    /// Never wait: a group is whoever arrived while the previous flush ran.
    Off,
    /// Wait up to this long.
    Fixed(Duration),
    /// Wait up to the device's average flush time, measured as the log runs, capped at `max`
    /// (jbd2 does the same with its average commit time): waiting longer than one flush
    /// costs more than the flush it saves.
    Auto { max: Duration },
}

impl Default for GroupWait {
    fn default() -> Self {
        GroupWait::Auto {
            max: Duration::from_millis(10),
        }
    }
}

/// Free space, as the low-space callback and [`Wal::space`] report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    pub capacity: u64,
    pub used: u64,
    pub free: u64,
    pub checkpoint: Lsn,
    pub end: Lsn,
}

/// Called once when free space falls below the low-water mark (again only after a
/// checkpoint lifted it above). It runs on the appending thread with no log lock held; it
/// should wake whoever checkpoints rather than checkpoint itself.
pub type LowSpaceFn = Arc<dyn Fn(Space) + Send + Sync>;

/// How a log is run.
#[derive(Clone, Default)]
pub struct Options {
    pub group_wait: GroupWait,
    /// When this many bytes of whole blocks wait unwritten, the appender writes them (no
    /// flush), as an asynchronous log writes its buffer when it fills (001 §3.2). 0: only
    /// forces and checkpoints write. Default 256 KiB.
    pub write_behind: Option<u64>,
    /// Free bytes below which the log asks for a checkpoint; default a quarter of the capacity.
    pub low_water: Option<u64>,
    pub on_low_space: Option<LowSpaceFn>,
    /// Refuse a log whose superblock names another owner.
    pub expect_owner: Option<[u8; 16]>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("group_wait", &self.group_wait)
            .field("write_behind", &self.write_behind)
            .field("low_water", &self.low_water)
            .field("on_low_space", &self.on_low_space.is_some())
            .field("expect_owner", &self.expect_owner)
            .finish()
    }
}

const DEFAULT_WRITE_BEHIND: u64 = 256 << 10;

/// How [`Wal::format`] makes a log.
#[derive(Clone, Debug, Default)]
pub struct FormatOptions {
    /// The client's id recorded in the superblock (e.g. its file system's uuid); zero: none.
    pub owner: [u8; 16],
    /// Zero the data area too (a log on an image file then never writes into holes, which
    /// would make each flush commit the host's metadata as well).
    pub zero: bool,
    /// The log's uuid; random when `None`.
    pub uuid: Option<[u8; 16]>,
}

/// One record read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub lsn: Lsn,
    /// The epoch of the open that appended it.
    pub epoch: u32,
    pub data: Vec<u8>,
}

#[derive(Default)]
struct Counters {
    appends: u64,
    append_bytes: u64,
    record_bytes: u64,
    full_refusals: u64,
    groups: u64,
    group_members: u64,
    group_max: u64,
    group_sizes: [u64; 8],
    leader_waits: u64,
    leader_wait_ns: u64,
    flushes: u64,
    writes: u64,
    bytes_written: u64,
    write_behinds: u64,
    checkpoints: u64,
}

struct State {
    end: u64,
    buf_start: u64,
    buf: Vec<u8>,
    written: u64,
    durable: u64,
    checkpoint: u64,
    epoch: u32,
    sb_seq: u64,
    owner: [u8; 16],
    /// Where this open's records begin (its recovered end; see `Wal::open_with`).
    epoch_start: u64,
    io_busy: bool,
    failed: Option<String>,
    /// LSNs forcers are waiting on.
    waiters: Vec<u64>,
    leader_waiting: bool,
    /// Forcers the last flush served: the leader expects as many again.
    last_group: usize,
    flush_avg: Duration,
    low_armed: bool,
    c: Counters,
}

/// One batch of I/O, prepared under the lock and run without it.
struct Job {
    /// Block-aligned LSN of `data`.
    from: u64,
    data: Vec<u8>,
    /// What `written` becomes.
    to: u64,
    flush: bool,
    /// `durable` becomes `to` (a force or checkpoint; a planted bug may claim it without a flush).
    makes_durable: bool,
    sb: Option<Superblock>,
}

struct Done {
    writes: u64,
    bytes: u64,
    flush_time: Option<Duration>,
}

/// A write-ahead log on a device or a region of one. `Send + Sync`: share it in an `Arc`.
pub struct Wal {
    dev: Arc<dyn BlockDevice>,
    geo: Geometry,
    uuid: [u8; 16],
    created_ns: i64,
    read_only: bool,
    opts: Options,
    recovery: Recovery,
    st: Mutex<State>,
    /// Woken when an I/O batch finishes (forcers, checkpoints waiting for the I/O slot).
    io_cv: Condvar,
    /// Woken when a forcer joins a leader that is waiting for its group.
    leader_cv: Condvar,
    /// Mirror of `State::durable` for the no-lock fast path of `force`.
    durable: AtomicU64,
    forces: AtomicU64,
    forces_fast: AtomicU64,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("region", &self.geo.region)
            .field("capacity", &self.geo.capacity)
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// Reads both superblock copies of the log in `region`: each decoded, or why not.
pub fn read_superblocks(
    dev: &dyn BlockDevice,
    region: Region,
) -> Result<[Result<Superblock, String>; 2], WalError> {
    let geo = Geometry::new(dev, region)?;
    let mut block = vec![0u8; geo.bs as usize];
    let mut out = [Err(String::new()), Err(String::new())];
    for (copy, slot) in out.iter_mut().enumerate() {
        dev.read_blocks(geo.sb_block(copy as u64), &mut block)?;
        *slot = Superblock::decode(&block[..SB_BYTES]).and_then(|sb| {
            if sb.sequence % 2 != copy as u64 && !plant::on(Plant::OneSuperblockCopy) {
                Err(format!(
                    "copy {copy} holds sequence {}, which belongs in the other copy",
                    sb.sequence
                ))
            } else {
                Ok(sb)
            }
        });
    }
    Ok(out)
}

/// Picks the superblock to use: the valid copy with the higher sequence, after checking that
/// it describes this region and device.
fn choose(
    dev: &dyn BlockDevice,
    geo: &Geometry,
    copies: [Result<Superblock, String>; 2],
) -> Result<Superblock, WalError> {
    let sb = match copies {
        [Ok(a), Ok(b)] => {
            if a.uuid != b.uuid {
                return Err(WalError::Corrupt(
                    "the two superblock copies belong to different logs (an interrupted format?)"
                        .into(),
                ));
            }
            if a.sequence >= b.sequence { a } else { b }
        }
        [Ok(a), Err(_)] | [Err(_), Ok(a)] => a,
        [Err(a), Err(b)] => {
            let mut magic = false;
            let mut head = vec![0u8; geo.bs as usize];
            for copy in 0..2 {
                dev.read_blocks(geo.sb_block(copy), &mut head)?;
                magic |= format::has_magic(&head);
            }
            if magic {
                return Err(WalError::Corrupt(format!(
                    "both superblock copies are unusable: copy 0: {a}; copy 1: {b}"
                )));
            }
            return Err(WalError::NotALog {
                found: describe(dev, geo.region)?,
            });
        }
    };
    if sb.block_size != dev.block_size() {
        return Err(WalError::Corrupt(format!(
            "the log was made with {}-byte blocks, its device is opened with {}-byte blocks",
            sb.block_size,
            dev.block_size()
        )));
    }
    if sb.region_blocks != geo.region.blocks {
        return Err(WalError::Corrupt(format!(
            "the superblock says the log has {} blocks, its region has {} (truncated or moved?)",
            sb.region_blocks, geo.region.blocks
        )));
    }
    Ok(sb)
}

/// What a region that is not a log holds, for the refusal message.
fn describe(dev: &dyn BlockDevice, region: Region) -> Result<Option<String>, WalError> {
    let bs = u64::from(dev.block_size());
    let blocks = (cairn_blockdev::contents::PROBE_BYTES as u64)
        .div_ceil(bs)
        .min(region.blocks);
    let mut head = vec![0u8; (blocks * bs) as usize];
    dev.read_blocks(region.first_block, &mut head)?;
    if head.starts_with(b"CAIRNFFS") {
        return Ok(Some("a cairn FFS file system".into()));
    }
    Ok(Some(
        cairn_blockdev::contents::describe(&head).unwrap_or_else(|| "only zeros".into()),
    ))
}

/// Whether the first block of `region` (which must lie on `dev`) starts with the magic.
fn has_log_magic(dev: &dyn BlockDevice, region: Region) -> Result<bool, WalError> {
    let mut b = vec![0u8; dev.block_size() as usize];
    dev.read_blocks(region.first_block, &mut b)?;
    Ok(format::has_magic(&b))
}

fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut u))
        .is_ok()
    {
        return u;
    }
    // No /dev/urandom: time, pid and a stack address through SplitMix64.
    let mut x = now_ns() as u64 ^ (u64::from(std::process::id()) << 32) ^ (&u as *const _ as u64);
    for chunk in u.chunks_mut(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    u
}

impl Wal {
    /// Makes a new, empty log in `region` of `dev`, replacing whatever was there.
    ///
    /// Both superblock blocks are zeroed and flushed before the new copies are written, so a
    /// crash in between leaves no copy at all rather than an older log's copy beside the new
    /// one; the records of an older log never verify under the new uuid.
    pub fn format(
        dev: &dyn BlockDevice,
        region: Region,
        opts: &FormatOptions,
    ) -> Result<Superblock, WalError> {
        let geo = Geometry::new(dev, region)?;
        let bs = geo.bs as usize;
        let zero = vec![0u8; bs];
        dev.write_blocks(geo.sb_block(0), &zero)?;
        dev.write_blocks(geo.sb_block(1), &zero)?;
        dev.flush()?;
        if opts.zero {
            let chunk = vec![0u8; (1 << 20).max(bs) / bs * bs];
            let data0 = region.first_block + format::SB_BLOCKS;
            let total = region.blocks - format::SB_BLOCKS;
            let per = (chunk.len() / bs) as u64;
            let mut b = 0;
            while b < total {
                let n = per.min(total - b);
                dev.write_blocks(data0 + b, &chunk[..n as usize * bs])?;
                b += n;
            }
        }
        let now = now_ns();
        let mut sb = Superblock {
            version: format::VERSION,
            block_size: dev.block_size(),
            region_blocks: region.blocks,
            uuid: opts.uuid.unwrap_or_else(random_uuid),
            sequence: 0,
            checkpoint: geo.capacity,
            epoch_start: geo.capacity,
            epoch: 0,
            created_ns: now,
            written_ns: now,
            owner: opts.owner,
        };
        let mut block = vec![0u8; bs];
        for copy in 0..2 {
            sb.sequence = copy;
            sb.encode(&mut block);
            dev.write_blocks(geo.sb_block(copy), &block)?;
        }
        dev.flush()?;
        Ok(sb)
    }

    /// Opens the log in `region` of `dev` for appending, with default options.
    pub fn open(dev: Arc<dyn BlockDevice>, region: Region) -> Result<Wal, WalError> {
        Wal::open_with(dev, region, Options::default())
    }

    /// Opens the log for appending: reads the superblock, finds the log's end by scanning
    /// from the checkpoint (001 §5.3, see [`crate::recover`]), then starts a new *epoch* and
    /// makes it durable, with the LSN where it starts, before anything is appended.
    ///
    /// Why the epoch: the scan stops at the first record that did not land, but records after
    /// it may have landed (writes between flushes reach the media in any order). This open
    /// appends from the recovered end, over them. Once its own records have partly
    /// overwritten that region, a later scan could run from this open's last record into an
    /// old one that happens to sit where the next record starts — a *ghost*, never part of the
    /// log; and a torn write of this open can even complete an old torn record at the very
    /// same LSN from its fragments (the crash test found that one). Every record carries its
    /// open's epoch; this open's is larger than any on the device, and the superblock says
    /// where it begins (`epoch_start`) before its first record is written. So recovery demands
    /// the current epoch at and after `epoch_start` and an older one before it, and a ghost,
    /// which is always older, ends the log.
    pub fn open_with(
        dev: Arc<dyn BlockDevice>,
        region: Region,
        opts: Options,
    ) -> Result<Wal, WalError> {
        Wal::open_inner(dev, region, opts, false)
    }

    /// Opens the log to read it only (`cairn wal dump`): no epoch, no writes.
    pub fn open_read_only(dev: Arc<dyn BlockDevice>, region: Region) -> Result<Wal, WalError> {
        Wal::open_inner(dev, region, Options::default(), true)
    }

    fn open_inner(
        dev: Arc<dyn BlockDevice>,
        region: Region,
        opts: Options,
        read_only: bool,
    ) -> Result<Wal, WalError> {
        let geo = match Geometry::new(&*dev, region) {
            // Too small for a log: say what it holds instead when it is not one.
            Err(WalError::TooSmall { .. })
                if region.blocks > 0 && !has_log_magic(&*dev, region)? =>
            {
                return Err(WalError::NotALog {
                    found: describe(&*dev, region)?,
                });
            }
            r => r?,
        };
        let sb = choose(&*dev, &geo, read_superblocks(&*dev, region)?)?;
        if let Some(want) = opts.expect_owner
            && want != sb.owner
        {
            return Err(WalError::WrongOwner {
                found: hex(&sb.owner),
                expected: hex(&want),
            });
        }
        let recovery = recover::scan(&*dev, geo, &sb, |_, _, _| {})?;
        let end = recovery.end;
        let buf_start = geo.down(end);
        let buf = if buf_start < end {
            geo.read(&*dev, buf_start, end - buf_start)?
        } else {
            Vec::new()
        };
        let mut st = State {
            end,
            buf_start,
            buf,
            written: end,
            durable: end,
            checkpoint: sb.checkpoint,
            epoch_start: sb.epoch_start,
            epoch: sb.epoch,
            sb_seq: sb.sequence,
            owner: sb.owner,
            io_busy: false,
            failed: None,
            waiters: Vec::new(),
            leader_waiting: false,
            last_group: 1,
            flush_avg: Duration::ZERO,
            low_armed: true,
            c: Counters::default(),
        };
        if !read_only {
            let epoch = if plant::on(Plant::NoEpochBump) {
                sb.epoch.max(1)
            } else {
                sb.epoch.checked_add(1).ok_or_else(|| {
                    WalError::Corrupt("the log's epoch counter is exhausted".into())
                })?
            };
            let mut next = sb.clone();
            next.sequence += 1;
            next.epoch = epoch;
            next.epoch_start = end;
            next.written_ns = now_ns();
            write_superblock(&*dev, &geo, &next)?;
            let t = Instant::now();
            dev.flush()?;
            st.flush_avg = t.elapsed();
            st.c.writes += 1;
            st.c.bytes_written += geo.bs;
            st.c.flushes += 1;
            st.epoch = epoch;
            st.sb_seq = next.sequence;
            st.epoch_start = end;
        }
        Ok(Wal {
            durable: AtomicU64::new(end),
            dev,
            geo,
            uuid: sb.uuid,
            created_ns: sb.created_ns,
            read_only,
            opts,
            recovery,
            st: Mutex::new(st),
            io_cv: Condvar::new(),
            leader_cv: Condvar::new(),
            forces: AtomicU64::new(0),
            forces_fast: AtomicU64::new(0),
        })
    }

    // ----- facts -------------------------------------------------------------------------

    /// What the open's scan found (checkpoint, end, records, why it stopped).
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    pub fn region(&self) -> Region {
        self.geo.region
    }

    pub fn block_size(&self) -> u32 {
        self.geo.bs as u32
    }

    /// Bytes of the data area.
    pub fn capacity(&self) -> u64 {
        self.geo.capacity
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    pub fn owner(&self) -> [u8; 16] {
        self.st.lock().owner
    }

    pub fn created_ns(&self) -> i64 {
        self.created_ns
    }

    pub fn epoch(&self) -> u32 {
        self.st.lock().epoch
    }

    /// The largest payload a record may have: one that fits in an empty log wherever its end is.
    pub fn max_record(&self) -> u64 {
        (self.geo.capacity - 2 * self.geo.bs)
            .saturating_sub(REC_HEADER as u64)
            .min(u64::from(u32::MAX))
    }

    /// The durable checkpoint: records before it are released.
    pub fn checkpoint(&self) -> Lsn {
        Lsn(self.st.lock().checkpoint)
    }

    /// The LSN the next record will get.
    pub fn end(&self) -> Lsn {
        Lsn(self.st.lock().end)
    }

    /// Every record starting below this LSN is durable.
    pub fn durable(&self) -> Lsn {
        Lsn(self.durable.load(Ordering::Acquire))
    }

    /// Bytes between the checkpoint and the end.
    pub fn used_bytes(&self) -> u64 {
        self.space().used
    }

    /// The largest record, header included, that can be appended now.
    pub fn free_bytes(&self) -> u64 {
        self.space().free
    }

    pub fn space(&self) -> Space {
        let st = self.st.lock();
        self.space_of(&st)
    }

    fn space_of(&self, st: &State) -> Space {
        Space {
            capacity: self.geo.capacity,
            used: st.end - st.checkpoint,
            free: self.free_of(st),
            checkpoint: Lsn(st.checkpoint),
            end: Lsn(st.end),
        }
    }

    /// Room left before the end would reach the checkpoint's block one lap on.
    fn free_of(&self, st: &State) -> u64 {
        (self.geo.down(st.checkpoint) + self.geo.capacity).saturating_sub(st.end)
    }

    fn low_water(&self) -> u64 {
        self.opts.low_water.unwrap_or(self.geo.capacity / 4)
    }

    /// Whether free space is below the low-water mark: time to checkpoint.
    pub fn needs_checkpoint(&self) -> bool {
        self.free_bytes() < self.low_water()
    }

    fn write_behind(&self) -> u64 {
        self.opts.write_behind.unwrap_or(DEFAULT_WRITE_BEHIND)
    }

    fn group_wait_of(&self, st: &State) -> Duration {
        match self.opts.group_wait {
            GroupWait::Off => Duration::ZERO,
            GroupWait::Fixed(d) => d,
            GroupWait::Auto { max } => st.flush_avg.min(max),
        }
    }

    /// The device the log is on.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    pub fn stats(&self) -> WalStats {
        let st = self.st.lock();
        let sp = self.space_of(&st);
        let c = &st.c;
        WalStats {
            capacity: sp.capacity,
            used_bytes: sp.used,
            free_bytes: sp.free,
            checkpoint: st.checkpoint,
            end: st.end,
            durable: st.durable,
            checkpoint_lag: sp.used,
            epoch: st.epoch,
            appends: c.appends,
            append_bytes: c.append_bytes,
            record_bytes: c.record_bytes,
            full_refusals: c.full_refusals,
            forces: self.forces.load(Ordering::Relaxed),
            forces_already_durable: self.forces_fast.load(Ordering::Relaxed),
            groups: c.groups,
            group_members: c.group_members,
            group_max: c.group_max,
            group_sizes: c.group_sizes,
            leader_waits: c.leader_waits,
            leader_wait_ns: c.leader_wait_ns,
            group_wait_ns: self.group_wait_of(&st).as_nanos() as u64,
            flush_avg_ns: st.flush_avg.as_nanos() as u64,
            flushes: c.flushes,
            writes: c.writes,
            bytes_written: c.bytes_written,
            write_behinds: c.write_behinds,
            checkpoints: c.checkpoints,
        }
    }

    // ----- appending ---------------------------------------------------------------------

    /// Appends one record and returns its LSN. The record is in memory until a force, a
    /// checkpoint or write-behind writes it; it is durable once [`Wal::force`] of its LSN (or
    /// a later one) returns.
    ///
    /// Never overwrites an unreleased record: a record that does not fit in the space the
    /// durable checkpoint leaves is refused with [`WalError::Full`] and nothing changes.
    pub fn append(&self, payload: &[u8]) -> Result<Lsn, WalError> {
        if self.read_only {
            return Err(WalError::ReadOnly);
        }
        let len = payload.len() as u64;
        if len > self.max_record() {
            return Err(WalError::TooLarge {
                len,
                max: self.max_record(),
            });
        }
        let size = record_size(len);
        let mut st = self.st.lock();
        if let Some(f) = &st.failed {
            return Err(WalError::Failed(f.clone()));
        }
        let free = self.free_of(&st);
        if size > free && !plant::on(Plant::ReuseUnreleased) {
            st.c.full_refusals += 1;
            return Err(WalError::Full { needed: size, free });
        }
        let lsn = st.end;
        let epoch = st.epoch;
        format::encode_record(&mut st.buf, &self.uuid, lsn, epoch, payload);
        st.end += size;
        st.c.appends += 1;
        st.c.append_bytes += len;
        st.c.record_bytes += size;
        let low = if st.low_armed && self.free_of(&st) < self.low_water() {
            st.low_armed = false;
            Some(self.space_of(&st))
        } else {
            None
        };
        self.maybe_write_behind(&mut st);
        drop(st);
        if let (Some(space), Some(f)) = (low, &self.opts.on_low_space) {
            f(space);
        }
        Ok(Lsn(lsn))
    }

    // ----- checkpoints -------------------------------------------------------------------

    /// Releases the log before `lsn` (a record's LSN, or the end): the client has made
    /// everything those records describe durable elsewhere. When this returns, the superblock
    /// naming the new checkpoint is durable — only then is the released space reused — and so
    /// is every record appended before the call (the same flush).
    pub fn set_checkpoint(&self, lsn: Lsn) -> Result<(), WalError> {
        if self.read_only {
            return Err(WalError::ReadOnly);
        }
        let mut st = self.st.lock();
        if lsn.0 < st.checkpoint {
            return Err(WalError::Released {
                lsn,
                checkpoint: Lsn(st.checkpoint),
            });
        }
        if lsn.0 > st.end {
            return Err(WalError::NotAppended(lsn));
        }
        if lsn.0 == st.checkpoint {
            return Ok(());
        }
        if lsn.0 < st.end {
            drop(st);
            self.check_record_start(lsn)?;
            st = self.st.lock();
            if lsn.0 <= st.checkpoint {
                return Ok(()); // another thread checkpointed at or past it meanwhile
            }
        }
        self.take_io(&mut st)?;
        let mut sb = self.superblock_of(&st);
        sb.checkpoint = lsn.0;
        let flush = !plant::on(Plant::CheckpointWithoutFlush);
        let to = st.end;
        let job = self.job(&st, to, flush, flush, Some(sb));
        let r = MutexGuard::unlocked(&mut st, || self.run(&job));
        self.finish(&mut st, &job, r).map(|_| ())
    }

    /// Records `owner` (e.g. the file system that now uses this log) in the superblock, durably.
    pub fn set_owner(&self, owner: [u8; 16]) -> Result<(), WalError> {
        if self.read_only {
            return Err(WalError::ReadOnly);
        }
        let mut st = self.st.lock();
        self.take_io(&mut st)?;
        let mut sb = self.superblock_of(&st);
        sb.owner = owner;
        let to = st.end;
        let job = self.job(&st, to, true, true, Some(sb));
        let r = MutexGuard::unlocked(&mut st, || self.run(&job));
        self.finish(&mut st, &job, r).map(|_| ())
    }

    /// The next superblock write: this state, the next sequence number.
    fn superblock_of(&self, st: &State) -> Superblock {
        Superblock {
            version: format::VERSION,
            block_size: self.geo.bs as u32,
            region_blocks: self.geo.region.blocks,
            uuid: self.uuid,
            sequence: st.sb_seq + 1,
            checkpoint: st.checkpoint,
            epoch_start: st.epoch_start,
            epoch: st.epoch,
            created_ns: self.created_ns,
            written_ns: now_ns(),
            owner: st.owner,
        }
    }

    fn check_record_start(&self, lsn: Lsn) -> Result<(), WalError> {
        let head = match self.read_bytes(lsn.0, REC_HEADER as u64) {
            Err(WalError::NotAppended(_)) => return Err(WalError::NotARecord(lsn)),
            r => r?,
        };
        match RecordHeader::decode(&head) {
            Ok(h) if h.lsn == lsn.0 => Ok(()),
            _ => Err(WalError::NotARecord(lsn)),
        }
    }

    /// Forces everything appended and closes the log. Dropping a `Wal` without `close` is a
    /// crash as far as the log is concerned: unforced records may be lost, nothing else.
    pub fn close(self) -> Result<(), WalError> {
        if self.read_only {
            return Ok(());
        }
        self.sync()
    }
}
fn write_superblock(dev: &dyn BlockDevice, geo: &Geometry, sb: &Superblock) -> std::io::Result<()> {
    let mut block = vec![0u8; geo.bs as usize];
    sb.encode(&mut block);
    let copy = if plant::on(Plant::OneSuperblockCopy) {
        0
    } else {
        sb.sequence % 2
    };
    dev.write_blocks(geo.sb_block(copy), &block)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
