//! The engine: cairn's LFS as a `cairn_vfs::FileSystem`.
//!
//! Everything lives in one [`State`] behind one lock: the inode map and the segment usage
//! table (whole, in memory, as 004 §3.1 expects), the inodes in use with their block maps,
//! the dirty data blocks, the directory indexes and the log writer. Device reads of file
//! data, a background cleaning pass's reads of its victims and a checkpoint's device
//! flushes run without the lock (`readgate.rs`, `Lfs::checkpoint`). Nothing is written in
//! place: a flush ([`State::flush`]) appends, in this order, the directory operation log
//! records, the dirty data blocks, the indirect and xattr blocks that now point elsewhere,
//! and the inodes, as partial segments of the log; the last partial of a flush carries the
//! COMMIT flag. A checkpoint ([`State::checkpoint`]) is a flush followed by the dirty inode
//! map blocks and the whole usage table, a device flush, and the checkpoint region.
//!
//! Invariants (the ones a crash must not break):
//! - a flush is written at an operation boundary, under the lock, so every committed flush
//!   is a consistent file system; roll-forward applies partial segments only up to the last
//!   COMMIT (`recover.rs`);
//! - a segment whose live bytes drop to zero becomes clean only after a checkpoint that
//!   records it so is durable: until then the other checkpoint (or roll-forward from the
//!   current one) may still need its blocks;
//! - every block pushed into the log is accounted in the usage table at its new segment the
//!   moment its address is handed out, and taken off its old segment the moment nothing
//!   points to the old copy.

/// Is the deliberately broken variant `Planted::$p` planted in `$st` (a `State`)? Always
/// false outside tests and the planted catalogue.
macro_rules! planted {
    ($st:expr, $p:ident) => {{
        #[cfg(any(test, feature = "planted"))]
        let r = $st.planted == crate::engine::Planted::$p;
        #[cfg(not(any(test, feature = "planted")))]
        let r = false;
        r
    }};
}

mod acl;
mod checkpointer;
mod dirs;
mod dirty;
mod handles;
mod imap;
mod node;
mod ops;
pub(crate) mod readgate;
mod recover;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tmpfile_tests;
mod usage;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use cairn_blockdev::BlockDevice;
use cairn_bufcache::BufferCache;
use cairn_vfs::{Errno, FsError, Result};
use parking_lot::{Condvar, Mutex, MutexGuard};
// Maps keyed by inode number or file handle, hashed with FxHash (a multiplication per
// key): every operation looks up its inode, and SipHash's rounds were a visible share of
// the daemon's time per small-file create (the keys are ours, not an attacker's).
use rustc_hash::FxHashMap as HashMap;

pub use crate::cleaner::clean::CleanerStats;
use crate::cleaner::policy::{Policy, Thresholds};
use crate::format::inode::{self, Inode, Time};
use crate::format::summary::{Entry, Kind};
use crate::format::superblock::Superblock;
use crate::format::tables::ImapEntry;
use crate::format::{BLOCK_SIZE, put_u64};
use crate::log::LogWriter;
use crate::sequencer::Sequencer;
pub(crate) use checkpointer::Checkpointer;
pub(crate) use dirs::Directories;
pub(crate) use dirty::DirtySet;
pub(crate) use handles::Handles;
pub(crate) use imap::InodeMap;
pub(crate) use node::{
    Node, ReadAhead, T_TOP, encode_xattr_blocks, load_map, owned_blocks, read_xattr_chain,
    set_chain_next, slot_level, slot_of, slot_parent, slot_range, xattr_blocks_needed,
};
pub(crate) use readgate::{ReadGate, ReadPlan, Run};
pub use usage::Usage;

pub const ROOT_INO: u64 = 2;
pub(crate) const BS: u64 = BLOCK_SIZE as u64;
/// Clean segments kept back from file data: the checkpoint's table blocks and the log's
/// next segment always find room.
pub(crate) const RESERVE_SEGMENTS: u32 = 2;
/// What a syncer's wake-up writes after its cleaning (`State::syncer_due`).
pub(crate) enum SyncerDue {
    Checkpoint,
    Flush,
    Nothing,
}

/// Passes the background cleaner runs per wake-up at most (it is woken again by the next
/// call that finds too few clean segments, or at the syncer's next tick).
const MAX_BACKGROUND_PASSES: u32 = 64;
/// Passes a mount with `background_inline` runs after one operation at most: a syncer's
/// run goes on for up to [`MAX_BACKGROUND_PASSES`] while calls proceed beside it; inline,
/// the calling operation would pay for all of them, and a run whose thresholds no pass
/// reaches (buffered data counted against the clean segments, `State::clean_ahead`) would
/// make every operation pay again. The next operation still short of clean segments runs
/// the next passes.
pub const INLINE_PASSES: u32 = 2;
/// The key of [`MountOptions::background_inline`] in a device mount's options (the
/// registry's variants, `MountOptions::set_for_device`). Not in `crate::OPTIONS`: a user's
/// mount has its syncer, which runs the passes beside the calls; without one, the data
/// would wait for a full buffer or an fsync to reach the log. It exists for recordings.
pub const INLINE_BACKGROUND_KEY: &str = "background_inline";
/// Blocks of the log between two blocks of a read that are read with them and dropped
/// rather than ending the device read: the summary block between two partial segments,
/// and after an fsync the indirect blocks and inode block written before it (four for a
/// file past its single indirect block), or the unused end of a segment. Up to 32 KiB more
/// read against a device request saved: less than a request costs on a disk, an SSD or a
/// loop device.
const MAX_READ_GAP: u64 = 8;

/// Mount options of the LFS format.
#[derive(Clone, Debug)]
pub struct MountOptions {
    pub read_only: bool,
    /// Checkpoint at least this often (004 §4.1: Sprite LFS used 30 s).
    pub checkpoint_interval: Duration,
    /// ... and after this many bytes written to the log since the last one (bounds
    /// roll-forward time, 004 §4.1's alternative).
    pub checkpoint_bytes: u64,
    /// Dirty data buffered before a flush to the log.
    pub dirty_limit: u64,
    /// Dirty data older than this is flushed by the background syncer.
    pub flush_age: Duration,
    /// Run the background syncer (tests drive flushes themselves).
    pub syncer: bool,
    /// Without a syncer (`syncer: false`), run what a syncer's wake-up runs — background
    /// cleaning passes (`Lfs::clean_in_background`, several lock holds each, the room
    /// reserved between them, the checkpoint's device writes without the lock) and the
    /// checkpoint due by the log's size — on the calling thread, after the operation that
    /// wanted them has let the lock go (`Lfs::run`), at most [`INLINE_PASSES`] passes per
    /// operation. No thread and no clock: the crash harness records it deterministically
    /// (the registry's `lfs-background`). Off, a mount without a syncer cleans inside the
    /// operation's hold (`State::clean_if_low`), a pass no real mount runs. Not a `-o`
    /// option ([`INLINE_BACKGROUND_KEY`]).
    pub background_inline: bool,
    /// Cleaning policy (004 §3.4–3.5): `cleaner=cost-benefit+age-sort` (default, Sprite
    /// LFS's), `cost-benefit`, `greedy`, `greedy+age-sort`.
    pub cleaner: Policy,
    /// The cleaner starts when fewer segments than this are clean (default: a tenth of the
    /// segments, 2 to 20; a fiftieth, up to 100, on a disk of more than 1,000)...
    pub clean_start: Option<u32>,
    /// ... and stops once this many are (default: the start plus a fiftieth of the
    /// segments, 2 to 100).
    pub clean_stop: Option<u32>,
    /// Bytes of log blocks the buffer cache keeps for reads (`cache=SIZE`, default 256 MiB
    /// as for the FFS modes). Log blocks never change once written, so the cache holds only
    /// clean copies; a block is dropped from it when the log writes over its segment again.
    pub cache_bytes: u64,
    /// Largest read-ahead window in blocks (`readahead_kb=N`; 0, the default, turns
    /// read-ahead off): see [`ReadAhead`]. Off by default because a mount's reader already
    /// has the kernel's read-ahead, which sends large requests the engine reads straight
    /// into the reply; its own window goes through the buffer cache (a copy and an
    /// allocation per block in, a copy out) and made a 256 MiB `dd` read 0.6× as fast
    /// (docs/DESIGN.md). For callers of the engine that read in small pieces.
    pub readahead_blocks: u64,
    /// Segment ages count log blocks written instead of milliseconds (tests and the
    /// cleaning comparison with the simulator; not a mount option).
    pub logical_clock: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            checkpoint_interval: Duration::from_secs(30),
            checkpoint_bytes: 64 << 20,
            dirty_limit: 8 << 20,
            flush_age: Duration::from_secs(5),
            syncer: true,
            cleaner: Policy::COST_BENEFIT,
            clean_start: None,
            clean_stop: None,
            cache_bytes: 256 << 20,
            readahead_blocks: 0,
            logical_clock: false,
            background_inline: false,
        }
    }
}

impl MountOptions {
    /// The cleaning thresholds for a file system of `segments` segments.
    pub fn thresholds(&self, segments: u32) -> std::result::Result<Thresholds, String> {
        // At most this many segments are ever clean: the log's head and its next segment
        // never are. A threshold above it would keep the cleaner running after every
        // operation for a count it cannot reach: refused when given, clamped by default.
        let most = segments.saturating_sub(2).max(1);
        for (key, v) in [
            ("clean_start", self.clean_start),
            ("clean_stop", self.clean_stop),
        ] {
            if let Some(v) = v
                && v > most
            {
                return Err(format!(
                    "option {key}={v}: the image has {segments} segments, of which at most \
                     {most} can be clean"
                ));
            }
        }
        // Thresholds below the reserve (even `clean_start=1`) cannot stall the file system:
        // file data never takes the last RESERVE_SEGMENTS clean segments, and a write that
        // finds no room cleans in the foreground whatever the thresholds (`ensure_space`).
        // The start: a tenth of the segments, 2 to 20 (Sprite LFS's "a few tens", 004 §5.1);
        // on a disk of more than 1,000 segments a fiftieth of them, up to 100. A run's first
        // pass reserves its room before it gives any back, and on a larger disk its first
        // holds are longer (more candidates to rank, a larger inode map): the calls write
        // into what is left meanwhile. At 20 on a 1 GiB disk (2,048 segments) calls
        // overwriting 8 MB/s waited for room at the start of every run, up to 125 ms; at 40
        // none did (docs/bench/history.md, "Calls preempt the syncer at once").
        let fiftieth = segments / 50;
        let start = self
            .clean_start
            .unwrap_or_else(|| (segments / 10).clamp(2, 20).max(fiftieth.min(100)))
            .min(most);
        // A pass cleans until a fiftieth of the segments more are clean (2 to 100): a few
        // tens of segments at a time on a large disk, as Sprite LFS (004 §5.1). Large passes
        // (until a fifth of the disk was clean) blurred the choice cost-benefit makes: on a
        // 256 MiB disk at 75% utilization with hot-and-cold overwrites, cost-benefit + age
        // sort cost 4.93 against greedy's 4.63; with this gap 4.00 against 5.53, as the
        // simulator predicts for the same geometry (3.39, 5.15; docs/bench/history.md).
        let stop = self
            .clean_stop
            .unwrap_or_else(|| start.saturating_add(fiftieth.clamp(2, 100)).min(most));
        Thresholds::new(start, stop).map_err(|e| e.to_string())
    }

    /// Parses one option of a device mount a tool makes (the crash harness's recordings of
    /// the registry's variants): the `-o` options, and [`INLINE_BACKGROUND_KEY`].
    pub fn set_for_device(
        &mut self,
        key: &str,
        value: Option<&str>,
    ) -> std::result::Result<(), String> {
        if key == INLINE_BACKGROUND_KEY {
            if value.is_some() {
                return Err(format!("option {key} takes no value"));
            }
            self.background_inline = true;
            return Ok(());
        }
        self.set(key, value)
    }

    /// Parses one `-o key[=value]` of the format.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> std::result::Result<(), String> {
        let secs = |v: Option<&str>| -> std::result::Result<Duration, String> {
            v.and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_secs)
                .ok_or_else(|| format!("option {key} takes a number of seconds"))
        };
        // The listed options (`crate::OPTIONS`, what `cairn help mount` shows) and `ro`/`rw`
        // are the only keys: one list for the help and the parser.
        if !matches!(key, "ro" | "rw") && cairn_vfs::options::find(crate::OPTIONS, key).is_none() {
            return Err(format!("unknown option '{key}' for an lfs image"));
        }
        match key {
            "mode" => match value {
                Some("lfs") | None => Ok(()),
                Some(m) => Err(format!("unknown mode '{m}' for an lfs image (modes: lfs)")),
            },
            "checkpoint_interval" => {
                self.checkpoint_interval = secs(value)?;
                Ok(())
            }
            "checkpoint_mb" => {
                self.checkpoint_bytes = value
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|&v| v > 0)
                    .ok_or("option checkpoint_mb takes a number of MiB")?
                    << 20;
                Ok(())
            }
            "cleaner" => {
                self.cleaner = value.and_then(Policy::parse).ok_or(
                    "option cleaner takes greedy, greedy+age-sort, cost-benefit or cost-benefit+age-sort",
                )?;
                Ok(())
            }
            "clean_start" | "clean_stop" => {
                let n = value
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("option {key} takes a number of segments"))?;
                if key == "clean_start" {
                    self.clean_start = Some(n);
                } else {
                    self.clean_stop = Some(n);
                }
                Ok(())
            }
            "cache" => {
                let v = value.ok_or("option cache takes a size of at least 4K (e.g. 64M)")?;
                self.cache_bytes =
                    cairn_vfs::parse_size(v).map_err(|e| format!("option cache: {e}"))?;
                if self.cache_bytes < BS {
                    return Err("option cache takes a size of at least 4K (e.g. 64M)".into());
                }
                Ok(())
            }
            "readahead_kb" => {
                self.readahead_blocks = value
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or("option readahead_kb takes a number of KiB")?
                    .div_ceil(BS / 1024);
                Ok(())
            }
            "ro" => {
                self.read_only = true;
                Ok(())
            }
            "rw" => Ok(()),
            _ => Err(format!("unknown option '{key}' for an lfs image")),
        }
    }
}

pub(crate) fn to_time(t: SystemTime) -> Time {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => Time {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (mut s, mut n) = (-(d.as_secs() as i64), d.subsec_nanos());
            if n > 0 {
                s -= 1;
                n = 1_000_000_000 - n;
            }
            Time { sec: s, nsec: n }
        }
    }
}

pub(crate) fn from_time(t: Time) -> SystemTime {
    if t.sec >= 0 {
        std::time::UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        std::time::UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
            + Duration::from_nanos(t.nsec as u64)
    }
}

/// A modification time as the usage table keeps it (its `youngest` column, the age of 004
/// §3.6): milliseconds since the epoch, so that cost-benefit tells ages apart within seconds.
pub(crate) fn age_ms(t: Time) -> u64 {
    (t.sec.max(0) as u64)
        .saturating_mul(1000)
        .saturating_add(t.nsec as u64 / 1_000_000)
}

pub(crate) fn now() -> Time {
    to_time(SystemTime::now())
}

/// Counters for `cairn stats` and the tests.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct LfsStats {
    pub flushes: u64,
    pub checkpoints: u64,
    pub partial_segments: u64,
    pub log_blocks: u64,
    pub rolled_forward_partials: u64,
    pub rolled_forward_inodes: u64,
    pub dirlog_records: u64,
    /// Data blocks flushed for applications (the denominator of the write cost).
    pub new_data_blocks: u64,
    /// Blocks read only to keep a file read in one device read across the summaries (and
    /// an fsync's metadata) between partial segments, and dropped.
    pub gap_blocks_read: u64,
    /// Empty segments a checkpoint left dirty because a read outside the lock held them
    /// (released by a later checkpoint).
    pub releases_held: u64,
}

pub(crate) struct State {
    pub sb: Superblock,
    pub dev: Arc<dyn BlockDevice>,
    /// Clean copies of log blocks read (never written through: the log writer writes the
    /// device itself and drops the cached copies of the blocks it overwrites).
    pub cache: Arc<BufferCache>,
    pub readahead_blocks: u64,
    pub logical_clock: bool,
    pub imap: InodeMap,
    pub usage: Usage,
    pub log: LogWriter,
    /// The inodes in use, loaded on first touch and kept while linked or open. Boxed: a
    /// hash table grows by moving every entry at once, and a node is large (block maps,
    /// attributes) — unboxed, one insert at 28,672 inodes took 14.6 ms, inside a hold of
    /// the lock every call waits for (docs/bench/history.md, "The holds that were not the
    /// cleaner's"). Boxed, growing moves a pointer per inode.
    pub nodes: HashMap<u64, Box<Node>>,
    /// The inodes some handle holds open (`Node::opens` > 0; kept by
    /// [`State::open_node`] and [`State::close_node`]). Only these can be orphans — an
    /// inode with no link is freed when its last handle goes (`maybe_free`) — so a
    /// checkpoint lists its orphans from them, not from a walk of every inode in use (45% of
    /// the hold preparing each checkpoint, at 49,000 inodes).
    pub opened: BTreeSet<u64>,
    pub dirty: DirtySet,
    pub dirs: Directories,
    pub cp: Checkpointer,
    pub handles: Handles,
    pub stats: LfsStats,
    pub cleaner: CleanerStats,
    /// Set when a log write failed half-way (see `note_log_result`).
    pub broken: Option<String>,
    pub policy: Policy,
    pub thresholds: Thresholds,
    pub read_only: bool,
    /// Bytes of room every call but a write-back of pages the kernel already accepted
    /// must leave (`FileSystem::set_writeback_reserve`; docs/DESIGN.md, "A full disk").
    pub writeback_reserve: u64,
    /// Set for the length of such a write-back: it may take the reserve.
    pub dip_into_reserve: bool,
    /// A background cleaning run is under way (`Lfs::clean_in_background`) ...
    pub bg_run: bool,
    /// ... and the last one ended with a pass that gave nothing back (no write waits for
    /// the background cleaner then: it cleans in the foreground).
    pub bg_stuck: bool,
    /// Set for the length of a write that can wait for that pass rather than clean in
    /// the foreground (`Lfs::write_as`) ...
    pub may_wait_for_cleaner: bool,
    /// Set for the length of a write that can wait (any mount, up to `CLEANER_WAIT`) for a
    /// background pass holding a reservation (`pass_reserve`) to end ...
    pub may_wait_for_pass: bool,
    /// ... and set by `ensure_space` when it refused the write for either reason.
    pub cleaner_deferred: bool,
    /// Clean segments a background cleaning pass has reserved for what it still writes
    /// while calls run between its lock holds (`Lfs::clean_pass_unlocked`): calls are
    /// admitted only beyond them and `RESERVE_SEGMENTS` ([`State::space_left`]), and
    /// other passes do not count them as room. 0 outside such a pass.
    pub pass_reserve: u32,
    /// The victims that pass frees at its checkpoint (0 outside it): with `pass_reserve`,
    /// what the write throttle counts as the clean segments the pass leaves
    /// ([`State::clean_after_pass`]).
    pub pass_frees: u32,
    /// Inodes with no link that were open when the system stopped: the checkpoint's orphan
    /// list, then what roll-forward finds written with no link (or with links again); a
    /// read-write mount frees them once roll-forward is done.
    pub orphans: BTreeSet<u64>,
    /// A deliberately broken ordering the crash harness must catch (tests and the planted
    /// catalogue only; see [`Planted`]).
    /// Segments held by reads in flight outside the lock (`readgate.rs`).
    pub gate: Arc<ReadGate>,
    /// A checkpoint prepared under the lock whose device writes run without it
    /// (`Lfs::checkpoint`): its lock is held by the writer until they are done, then holds
    /// their outcome. Settled (`State::settle_checkpoint`) before the next checkpoint.
    pub cp_flight: Option<Flight>,
    #[cfg(any(test, feature = "planted"))]
    pub planted: Planted,
}

/// A checkpoint whose device writes are in flight: the writer holds the lock while they
/// run and leaves their outcome in it.
pub(crate) type Flight = Arc<Mutex<Option<std::result::Result<CheckpointWrite, String>>>>;

/// The device writes of a checkpoint prepared under the lock (`State::checkpoint_prepare`):
/// everything the region names is written, not yet flushed.
pub(crate) struct CheckpointWrite {
    /// The region's first block (in the slot not used last) and its bytes.
    at: u64,
    region: Vec<u8>,
    /// Segments the region records with no live bytes.
    empties: Vec<u32>,
    /// The log's partial segments sealed before the region was encoded, to be on the
    /// device before its first flush (`sequencer.rs`; `None` when the log writes under the
    /// lock).
    barrier: Option<(Arc<Sequencer>, u64)>,
}

impl CheckpointWrite {
    /// A device flush (everything the region names is durable before the region is
    /// written), the region, a device flush. Needs nothing the engine's lock guards.
    pub(crate) fn write(&self, dev: &Arc<dyn BlockDevice>) -> Result<()> {
        if let Some((q, upto)) = &self.barrier {
            q.wait(*upto)?;
        }
        dev.flush()?;
        dev.write_blocks(self.at, &self.region)?;
        dev.flush()?;
        Ok(())
    }

    /// The region alone, no flush before it (`Planted::PassRegionEarly`).
    #[cfg(any(test, feature = "planted"))]
    pub(crate) fn write_region_early(&self, dev: &Arc<dyn BlockDevice>) -> Result<()> {
        dev.write_blocks(self.at, &self.region)?;
        Ok(())
    }
}

/// Deliberately broken orderings, compiled only for tests and the crash harness's planted
/// catalogue (`feature = "planted"`): a checker that never fails proves nothing.
#[cfg(any(test, feature = "planted"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Planted {
    #[default]
    None,
    /// The checkpoint region is written before the segments it names (and with no flush
    /// between them): a crash between the two leaves a region naming blocks never written.
    CheckpointFirst,
    /// Segments the usage table shows empty are released at every flush, not once a
    /// checkpoint saying so is durable (004 §3.3: a segment is clean when a durable
    /// checkpoint says it holds nothing live). The log may then write over blocks the last
    /// durable checkpoint still names — an old inode-map block, or the inodes a crash would
    /// roll forward from — once it wraps round to such a segment.
    ReleaseAtFlush,
    /// Roll-forward applies each partial segment as it reads it, not a whole flush once
    /// its COMMIT is read (004 §4.2): a crash between the partial segments of one flush
    /// leaves half of it applied — inodes without the directory blocks or inodes written
    /// with them.
    RollForwardUncommitted,
    /// Cleaning passes and checkpoints ignore the segments a read outside the lock still
    /// holds (`readgate.rs`): the log may write over a segment between a read's
    /// plan and its device read, which then returns blocks of the segment's next life.
    NoReadGate,
    /// A cleaning pass moves every data block its victims' summaries name for a live
    /// inode version, without checking, under the lock, that the file still points at
    /// that address: a block overwritten while the pass read its victims (or any time
    /// before) comes back over the newer copy.
    NoRevalidation,
    /// A background pass lets calls in between its lock holds without reserving the clean
    /// segments the rest of its writes need (`State::pass_reserve`): calls take them, and
    /// the pass runs out of room half-way (its log write fails: ENOSPC).
    NoPassReserve,
    /// The write throttle measures the clean segments as they are in the middle of a
    /// background pass, its own writes taken and its victims not yet freed, rather than
    /// as the pass will leave them (`State::clean_after_pass`): every write waits for the
    /// pass's end whenever the pass's own writes dip below the line.
    ThrottleOnRawClean,
    /// No checkpoint pays the inode map's dirty blocks before the next one due by time or
    /// log size (`State::imap_debt_due`): the cleaner's passes carry the whole debt, and on
    /// a large file set none fits the room once the cleaner starts.
    ImapDebtUnpaid,
    /// A background pass choosing its victims over several holds of the lock applies what
    /// it found live in the earlier holds without checking it again in the last: an inode
    /// a call deleted between the holds is marked dirty (and written back), an indirect
    /// block or inode record a call replaced is counted and rewritten.
    NoChoiceRecheck,
    /// A background pass moving its live blocks in slices writes no inode in its slices:
    /// every inode its moves dirtied waits for the flush after the moves, one hold as long
    /// as all of them.
    NoInodesAhead,
    /// Reads ignore the partial segments sealed and not yet written (`sequencer.rs`) and
    /// ask the device (or the cache) for their blocks: a read of a block just flushed
    /// returns what the device held there before — zeros, or the segment's earlier life.
    InFlightFromDevice,
    /// Device flushes — a checkpoint's (then its region) and fsync's — do not wait for
    /// the partial segments sealed before them (`sequencer.rs`): a crash after the region
    /// leaves it naming blocks the device never received, and one after fsync loses what
    /// it returned as durable.
    FlushBeforeLogWrites,
    /// A call short of room cleans in the foreground only with passes aimed at all the
    /// room it asks for (`State::ensure_space`), never one segment more: with the
    /// write-back reserve in what it asks, the policy plans every dirty segment as a
    /// victim, no such pass pays, and the call fails with ENOSPC while `df` shows room.
    SizedPassOnly,
    /// A background pass writing the inode map ahead of its checkpoint takes every dirty
    /// block off the dirty set in its first hold but writes only that hold's share: the
    /// checkpoint names the old copies of the rest, whose entries the log no longer
    /// matches once their segments are cleaned or a remount reads them.
    ImapAheadDropsRest,
    /// A background choice over several holds checks again, in its last, only the items
    /// of the files the dirty set's watch saw change — and the watch sees none: what calls
    /// deleted, rewrote or truncated between the holds is moved and marked as found.
    ChoiceWatchBlind,
    /// A background pass writes its checkpoint's region as soon as the checkpoint is
    /// prepared, before the device flush that makes the partial segments it names durable
    /// (`CheckpointWrite::write` writes it again after): a crash in between leaves a
    /// region naming inode map and usage table blocks the device may not hold. Only the
    /// background pass (`Lfs::clean_pass_unlocked`): a recording that cleans in the
    /// operation's hold never runs it.
    PassRegionEarly,
}

pub(crate) fn io(e: std::io::Error) -> FsError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        FsError::Errno(Errno::ENOSPC)
    } else {
        FsError::Io(e)
    }
}

pub(crate) fn corrupt(e: impl std::fmt::Display) -> FsError {
    FsError::Corrupt(e.to_string())
}

impl State {
    // ---- reading the log ----------------------------------------------------------------

    pub fn read_block(&self, addr: u64) -> Result<Vec<u8>> {
        if !self.sb.in_log(addr) {
            return Err(corrupt(format!("block address {addr} outside the log")));
        }
        // A block whose partial segment is still in flight is read from its bytes there:
        // the device does not hold it yet.
        if !planted!(self, InFlightFromDevice)
            && let Some(b) = self.log.in_flight(addr)
        {
            return Ok(b);
        }
        Ok(self.cache.read(addr)?.read().to_vec())
    }

    /// Plans a read of blocks `first..first + n` of `ino` (zeros for holes), under the
    /// lock: what memory holds — blocks still buffered for the next flush, cached copies
    /// of log blocks, holes — is copied into the reply now; the rest is left as runs to
    /// read from the device without the lock ([`ReadPlan::read`]), one device read per run
    /// of blocks that lie next to each other in the log, and the segments those runs (and
    /// the read-ahead window `ahead`, start and count, read into the cache) lie in are
    /// pinned until then (`readgate.rs`), so no checkpoint frees them meanwhile.
    ///
    /// A run of the request's own blocks that nothing has cached is read straight into
    /// the reply, not through the cache (as FFS reads an uncached cluster): filling cache
    /// buffers the reader never asks for again cost a copy and an allocation per block.
    pub fn plan_read(
        &mut self,
        ino: u64,
        first: u64,
        n: u64,
        ahead: Option<(u64, u64)>,
    ) -> Result<ReadPlan> {
        let end = first.saturating_add(n);
        // Blocks of partial segments sealed and not yet written are copied from there
        // (`sequencer.rs`), never asked of the device or the cache.
        let flying = !planted!(self, InFlightFromDevice)
            && self.log.sequencer.as_ref().is_some_and(|q| q.any());
        let map = self.map(ino)?;
        // One walk of the block map for the whole request, not a search per block.
        let mut addrs: Vec<Option<u64>> = vec![None; n as usize];
        for (&l, &a) in map.range(first..end) {
            addrs[(l - first) as usize] = Some(a);
        }
        let mut want = Vec::new();
        if let Some((a, k)) = ahead {
            let found: Vec<(u64, u64)> = map
                .range(a..a.saturating_add(k))
                .map(|(&l, &a)| (l, a))
                .collect();
            // A block still buffered is read from memory; its old copy in the log is not.
            want = found
                .into_iter()
                .filter(|&(l, _)| !self.dirty.has_block(ino, l))
                .map(|(_, a)| a)
                .filter(|&a| self.sb.in_log(a) && self.cache.lookup(a).is_none())
                .filter(|&a| !flying || self.log.in_flight(a).is_none())
                .collect();
        }
        // Filled block by block in order (appended, not zeroed first and copied over: the
        // reply is the largest buffer of a read, and zeroing it cost as much as a copy).
        let mut out = Vec::with_capacity((n * BS) as usize);
        let mut runs: Vec<Run> = Vec::new();
        let max_run = (self.cache.config().max_cluster_bytes / BLOCK_SIZE).max(1) as u64;
        let any_dirty = self.dirty.any_in(ino, first, end);
        for (lbn, addr) in (first..).zip(&addrs) {
            if any_dirty && let Some(b) = self.dirty.block(ino, lbn) {
                out.extend_from_slice(b);
                continue;
            }
            let Some(a) = *addr else {
                out.resize(out.len() + BLOCK_SIZE, 0);
                continue;
            };
            if !self.sb.in_log(a) {
                return Err(corrupt(format!("block address {a} outside the log")));
            }
            if flying && let Some(b) = self.log.in_flight(a) {
                out.extend_from_slice(&b);
                continue;
            }
            if self.cache.lookup(a).is_some() {
                out.extend_from_slice(&self.cache.read(a)?.read());
                continue;
            }
            // A run: following blocks of the request that lie after the one before in
            // the log, each at most `MAX_READ_GAP` blocks after it. A file written in many
            // partial segments (fsync'd or small writes) has a summary block — and after
            // an fsync its indirect blocks and inode — between each piece; reading those
            // few blocks with the run and dropping them costs less than a device read per
            // piece (a 4 MiB file written in 64 KiB fsync'd pieces: 69 reads before, 8 now).
            let at = out.len();
            out.resize(at + BLOCK_SIZE, 0);
            if let Some(r) = runs.last_mut()
                && r.at + r.addrs.len() * BLOCK_SIZE == at
                && let (Some(&f), Some(&l)) = (r.addrs.first(), r.addrs.last())
                && a > l
                && a - l <= MAX_READ_GAP + 1
                && a - f < max_run
            {
                r.addrs.push(a);
            } else {
                runs.push(Run { at, addrs: vec![a] });
            }
        }
        for r in &runs {
            let span = r.span();
            self.stats.gap_blocks_read += span - r.addrs.len() as u64;
        }
        let segs: Vec<u32> = runs
            .iter()
            .flat_map(|r| &r.addrs)
            .chain(&want)
            .filter_map(|&a| self.sb.seg_of(a))
            .collect();
        let pin = (!segs.is_empty()).then(|| self.gate.pin(segs));
        Ok(ReadPlan {
            out,
            runs,
            ahead: want,
            dev: Arc::clone(&self.dev),
            cache: Arc::clone(&self.cache),
            _pin: pin,
        })
    }

    /// Reads inode `ino` through the inode map.
    pub fn read_inode(&self, ino: u64) -> Result<Option<Inode>> {
        let Some(e) = self.imap.get(ino) else {
            return Ok(None);
        };
        if e.addr == 0 {
            return Ok(None);
        }
        let b = self.read_block(e.addr)?;
        match inode::find_in_block(&b, ino).map_err(corrupt)? {
            Some(n) if n.mode != 0 => Ok(Some(n)),
            _ => Err(corrupt(format!(
                "inode {ino}: not in the inode block at {}",
                e.addr
            ))),
        }
    }

    /// The in-memory inode `ino`, loaded if needed; ENOENT if it is free.
    pub fn node(&mut self, ino: u64) -> Result<&mut Node> {
        if !self.nodes.contains_key(&ino) {
            let inode = self.read_inode(ino)?.ok_or(Errno::ENOENT)?;
            self.nodes.insert(
                ino,
                Box::new(Node {
                    inode,
                    map: None,
                    ind: BTreeMap::new(),
                    dirty_slots: BTreeSet::new(),
                    xattrs: None,
                    xattr_dirty: false,
                    opens: 0,
                    ra: ReadAhead::default(),
                    linkable: false,
                }),
            );
        }
        self.nodes
            .get_mut(&ino)
            .map(|n| &mut **n)
            .ok_or(Errno::ENOENT.into())
    }

    /// Counts one more handle on `ino` (a file's or a directory's).
    pub(crate) fn open_node(&mut self, ino: u64) -> Result<&mut Node> {
        self.node(ino)?.opens += 1;
        self.opened.insert(ino);
        self.node(ino)
    }

    /// Counts one handle on `ino` fewer; the caller frees it if that was the last and
    /// nothing names it (`maybe_free`).
    pub(crate) fn close_node(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.opens = n.opens.saturating_sub(1);
            if n.opens == 0 {
                self.opened.remove(&ino);
            }
        }
    }

    /// Files unlinked while open (and directories removed while open): what a checkpoint
    /// lists for the mount after a crash to free.
    fn orphan_list(&self) -> Vec<u64> {
        let orphan = |n: &Node| n.inode.nlink == 0 && n.inode.mode != 0;
        // The invariant `opened` keeps: no inode with no link is in use unopened.
        debug_assert!(
            self.nodes
                .iter()
                .all(|(i, n)| !orphan(n) || self.opened.contains(i)),
            "an orphan not among the open inodes"
        );
        self.opened
            .iter()
            .copied()
            .filter(|i| self.nodes.get(i).is_some_and(|n| orphan(n)))
            .collect()
    }

    /// The block map of `ino`, loading its indirect blocks on first use.
    pub fn map(&mut self, ino: u64) -> Result<&mut BTreeMap<u64, u64>> {
        if self.node(ino)?.map.is_none() {
            let inode = self.node(ino)?.inode.clone();
            let (map, ind) = load_map(&inode, |a| self.read_block(a))?;
            let n = self.node(ino)?;
            n.map = Some(map);
            n.ind = ind;
        }
        Ok(self.node(ino)?.map.as_mut().expect("loaded above"))
    }

    /// Contents of logical block `lbn` of `ino` (zeros for a hole).
    pub fn read_file_block(&mut self, ino: u64, lbn: u64) -> Result<Vec<u8>> {
        if let Some(d) = self.dirty.block(ino, lbn) {
            return Ok(d.clone());
        }
        match self.map(ino)?.get(&lbn).copied() {
            Some(a) => self.read_block(a),
            None => Ok(vec![0u8; BLOCK_SIZE]),
        }
    }

    /// Replaces logical block `lbn` of `ino` (written at the next flush).
    pub fn write_file_block(&mut self, ino: u64, lbn: u64, data: Vec<u8>) {
        self.dirty.write_block(ino, lbn, data);
    }

    pub fn mark_dirty(&mut self, ino: u64) {
        self.dirty.mark_inode(ino);
    }

    /// Inode `ino` changed with an indirect block or its xattr list (`dirty_slots`,
    /// `xattr_dirty`): the flush rewrites them, and counts them before (`DirtySet::meta_inodes`).
    pub fn mark_meta_dirty(&mut self, ino: u64) {
        self.dirty.mark_meta(ino);
    }

    // ---- usage accounting (004 §3.6) ------------------------------------------------------

    fn add_live(&mut self, addr: u64, bytes: u32, mtime: u64) {
        if let Some(s) = self.sb.seg_of(addr) {
            self.usage.add_live(s, bytes, mtime);
        }
    }

    pub fn kill(&mut self, addr: u64, bytes: u32) {
        if addr == 0 {
            return;
        }
        if let Some(s) = self.sb.seg_of(addr) {
            self.usage.sub_live(s, bytes);
        }
    }

    /// Appends a block to the log and accounts its live bytes to its segment, whose age
    /// (the usage table's `youngest`, 004 §3.6) becomes the time of this write — whether the
    /// block is new data or a live block the cleaner moves. The cleaning simulator calls
    /// this "age from the last write" (`sim::SegmentAge::LastWrite`, BSD LFS's
    /// `su_lastmod`): a segment of cold blocks the cleaner just wrote is young, so
    /// cost-benefit leaves it alone until it has had time to lose blocks. Stamping it with
    /// its blocks' old modification times instead makes cost-benefit clean that segment
    /// again as soon as it has lost a block or two, nearly full, pass after pass
    /// (docs/bench/history.md, the simulator's ablation).
    pub(crate) fn push(&mut self, entry: Entry, data: Vec<u8>, live: u32) -> Result<u64> {
        let addr = self
            .log
            .push(&self.sb, &self.dev, &mut self.usage, entry, data)
            .map_err(io)?;
        let t = self.clock();
        self.add_live(addr, live, t);
        self.cp.logged(BS);
        Ok(addr)
    }

    /// The clock of segment ages: milliseconds since the epoch, or with `logical_clock` the
    /// blocks pushed into the log so far (a replayed workload then cleans the same segments
    /// whatever the machine's speed; the simulator's clock is a write counter too).
    pub fn clock(&self) -> u64 {
        if self.logical_clock {
            self.log.blocks_written + self.log.pending_len() as u64
        } else {
            age_ms(now())
        }
    }

    /// Clean segments (the log's head and its next segment excluded).
    pub fn clean_segments(&self) -> u32 {
        self.usage.clean()
    }

    /// Bytes of file data that can still be buffered: the most data whose log blocks fit
    /// in what the log's head and the clean segments beyond the reserve hold, less what the
    /// buffered changes will take. Nothing while the reserve itself is short: the head's
    /// room is not file data's then, or flushes that reach the next segment would take the
    /// reserve's segments one by one (a log left with no clean segment cannot clean,
    /// checkpoint or unmount).
    ///
    /// Each write is charged what it brings to the log, not a share of the room: its data
    /// blocks, an indirect block per `PTRS` of them and three more (the double and triple
    /// indirect blocks, the inode's block), and a summary per partial segment of all that
    /// ([`State::log_blocks`]). The buffered changes count what the next flush writes for
    /// them, from above (a data block twice, for the indirect block a random overwrite of
    /// a large file dirties with it). That margin is also what foreground cleaning works
    /// in: counting buffered blocks once, as a sequential write takes them, let writes
    /// fill the log until no pass could keep up (ENOSPC at 86% live under overwrites,
    /// `small_thresholds_at_86_percent_never_fail_a_write`). A clean segment holds its whole
    /// length (its summaries are charged to what it holds); the head's rest less a
    /// summary and the block a segment may leave unused at its end. So `df`, which shows
    /// this count ([`State::admissible_bytes`]), falls by at least what a write takes.
    pub fn space_left(&self) -> u64 {
        let clean = self.clean_segments();
        let kept = self.kept_segments();
        if clean < kept {
            return 0;
        }
        let seg = self.sb.segment_blocks as u64;
        let beyond = (clean - kept) as u64;
        let in_head = (seg - self.log.off as u64).saturating_sub(2);
        // Not the free records of inodes just freed: a delete must not make `df` fall until
        // the flush (the reserve takes them).
        let pending = self.log_blocks(self.buffered_blocks(false));
        let room = (beyond * seg + in_head).saturating_sub(pending);
        // The most data `d` with `log_blocks(d + d / PTRS + 4) <= room`, from below.
        let payload = room - room.div_ceil(self.per_partial() + 1);
        let meta = payload.saturating_sub(4);
        let data = meta - meta.div_ceil(inode::PTRS + 1);
        data * BS
    }

    /// Blocks the next flush writes for the buffered changes (`write_dirty`), summaries
    /// not counted, from above: a data block twice (itself and an indirect block naming
    /// it: a random overwrite of a large file dirties one per block), the indirect blocks
    /// earlier changes (a truncate, a cleaning pass) left to rewrite, xattr blocks, inodes
    /// 16 to a block — with the free records of inodes freed since if `freed` — the
    /// directory operation log, and a block to spare.
    ///
    /// Called on every write (the admission rule, `space_left`): the indirect and xattr
    /// blocks are summed over the few inodes that may have some (`DirtySet::meta_inodes`),
    /// not over every dirty inode — with 8 MiB of small files buffered that sum was a
    /// quarter of the CPU time of an overwrite workload. Tests check it against the sum
    /// over every dirty inode.
    pub(crate) fn buffered_blocks(&self, freed: bool) -> u64 {
        let meta_of = |i: u64| {
            self.nodes
                .get(&i)
                .map_or(0, |n| n.dirty_slots.len() as u64 + n.xattr_log_blocks())
        };
        let meta: u64 = self.dirty.meta_inodes().map(meta_of).sum();
        debug_assert_eq!(
            meta,
            self.dirty.inodes().map(meta_of).sum::<u64>(),
            "an inode with indirect or xattr blocks to rewrite is not among the meta inodes"
        );
        let mut records = self.dirty.inodes().len() as u64;
        if freed {
            records += self.dirty.freed_count() as u64;
        }
        2 * self.dirty.data_blocks()
            + meta
            + records.div_ceil(inode::PER_BLOCK as u64)
            + self.dirty.dirlog_blocks()
            + !self.dirty.is_empty() as u64
    }

    /// Clean segments no call's data may take: the standing reserve (`RESERVE_SEGMENTS`,
    /// the next pass's and checkpoint's room) and what a background pass between its lock
    /// holds has reserved for the rest of its own writes (`pass_reserve`).
    pub(crate) fn kept_segments(&self) -> u32 {
        RESERVE_SEGMENTS + self.pass_reserve
    }

    /// Entries a partial segment holds: a summary's worth, or a segment's less its summary.
    fn per_partial(&self) -> u64 {
        (crate::format::summary::MAX_ENTRIES as u64)
            .min(self.sb.segment_blocks as u64 - 1)
            .max(1)
    }

    /// Log blocks `payload` blocks take: themselves and a summary per partial segment.
    pub(crate) fn log_blocks(&self, payload: u64) -> u64 {
        payload + payload.div_ceil(self.per_partial())
    }

    /// Bytes of new data a write can be admitted for now, as `statfs` shows them: the
    /// admission rule's own count ([`State::ensure_space`]) — the room the clean segments
    /// and the log's head give now ([`State::space_left`]) plus what its foreground
    /// cleaning can still give back ([`State::collectible_blocks`]) — less the write-back
    /// reserve, which only the kernel's write-back of pages already accepted may take. One
    /// count for both, so `df` never shows room a write cannot have (fstests' generic/103
    /// fallocates what df shows, less a little) nor hides room a write would get.
    pub fn admissible_bytes(&self) -> u64 {
        // With the reserve short, no write is admitted, whatever cleaning could give.
        if self.clean_segments() < self.kept_segments() {
            return 0;
        }
        (self.space_left() + self.collectible_blocks() * BS).saturating_sub(self.writeback_reserve)
    }

    /// Dead blocks cleaning can still give back (an estimate, from the usage table alone).
    ///
    /// Dead blocks are not all room: a cleaning pass writes, besides its victims' live
    /// blocks, the metadata naming them and the summaries, and it runs only if it gives
    /// back more than it writes within the room the log has now (`clean.rs`). So, from the
    /// usage table alone (no segment is read): if no pass over the least utilized
    /// segments pays for itself in the room left, nothing dead is collectible — writes
    /// end with ENOSPC once the clean segments beyond the reserve are used, and `df` must
    /// say so. Otherwise each dirty segment gives back its dead blocks less its own cost:
    /// a block of metadata (an indirect block, the usual case of an overwritten file) and
    /// the summaries its live blocks take when rewritten. A segment nearly full gives
    /// nothing. An estimate, as any `df` of a log-structured file system is; what it must
    /// not do is show a fifth of the disk free when writes already fail.
    pub fn collectible_blocks(&self) -> u64 {
        let seg = self.sb.segment_blocks as u64;
        let clean = self.clean_segments() as u64;
        let (head, next) = (self.log.seg, self.log.next_seg);
        let mut lives: Vec<u64> = self
            .usage
            .iter()
            .enumerate()
            .filter(|&(s, u)| u.dirty && s as u32 != head && s as u32 != next)
            .map(|(_, u)| (u.live_bytes as u64).div_ceil(BS).min(seg))
            .collect();
        lives.sort_unstable();
        const META_PER_VICTIM: u64 = 1;
        let imap_blocks = self.imap.block_addrs().len() as u64;
        let mut live = 0u64;
        let mut pays = false;
        for (k, &l) in (1u64..).zip(lives.iter()) {
            live += l;
            let (_, entered) = self.pass_log(live + META_PER_VICTIM * k + k.min(imap_blocks));
            if entered > clean {
                break;
            }
            if k > entered {
                pays = true;
                break;
            }
        }
        if !pays {
            return 0;
        }
        let per_partial = (crate::format::summary::MAX_ENTRIES as u64)
            .min(seg - 1)
            .max(1);
        // A segment with nothing live costs nothing to clean: the next checkpoint frees it.
        lives
            .iter()
            .map(|&l| match l {
                0 => seg,
                l => (seg - l).saturating_sub(META_PER_VICTIM + l.div_ceil(per_partial)),
            })
            .sum::<u64>()
    }

    // ---- flush and checkpoint (004 §4.1) --------------------------------------------------

    /// Closes the partial segment being filled (no commit): written, or sealed for the
    /// sequencer. A background pass does so at the end of each slice of its moves, so no
    /// block a file points at waits in the log writer while the lock is free.
    pub(crate) fn close_partial(&mut self) -> Result<()> {
        self.log
            .write_partial(&self.sb, &self.dev, &mut self.usage, false)
            .map_err(io)
    }

    /// Writes everything dirty to the log as one committed flush — a call's (fsync, the
    /// syncer, a full dirty set): if the log cannot take it, nothing is written and the
    /// call gets ENOSPC with the changes still buffered and the log intact
    /// ([`State::room_for_flush`]). A cleaning pass flushes with `flush_inner`: its room
    /// rule counted what it writes.
    pub fn flush(&mut self) -> Result<()> {
        self.check_log_ok()?;
        self.room_for_flush()?;
        let r = self.flush_inner();
        self.note_log_result(r)
    }

    /// Is there room for a flush of the buffered changes — and for the checkpoint after
    /// it? The log writer takes a clean segment the moment it enters one (`log.rs`): a
    /// flush that enters more than are clean fails half-way, its dirty sets already taken,
    /// and the log must refuse every change until remount. And a log left with no room
    /// for the inode map and usage table can never checkpoint again, so never free a
    /// segment. So the flush is counted first, by the log writer's own rules
    /// ([`State::pass_log`]): the buffered changes from above (free records included) and
    /// every inode map block, against the clean segments less a pass's reservation.
    ///
    /// Short, it is usually waiting on one thing: a checkpoint whose device writes run
    /// without the lock (a background pass's or the syncer's, `Lfs::write_checkpoint`)
    /// holds back the segments it empties — a pass's victims — until it is recorded, and
    /// the pass may have entered the standing reserve to move their live blocks (its room
    /// rule counts every clean segment). The room is a record away: settle it, which
    /// waits at most for those device writes, and count again. Still short, ENOSPC;
    /// a call that may wait for a pass holding a reservation (`may_wait_for_pass`) is
    /// told to (`cleaner_deferred`, `Lfs::run_making_room`).
    pub(crate) fn room_for_flush(&mut self) -> Result<()> {
        if self.read_only || self.dirty.is_empty() || self.flush_fits() {
            return Ok(());
        }
        if self.cp_flight.is_some() {
            self.settle_checkpoint()?;
            if self.flush_fits() {
                return Ok(());
            }
        }
        if self.pass_reserve > 0 && self.may_wait_for_pass {
            self.cleaner_deferred = true;
        }
        Err(Errno::ENOSPC.into())
    }

    /// Would the log take the buffered changes and a checkpoint after them
    /// ([`State::room_for_flush`])? `pass_log` runs the log writer's rules on counts: the
    /// payload, then the usage table in one partial segment; the inode map blocks and the
    /// flush's own commit summary are added to the payload.
    fn flush_fits(&self) -> bool {
        let clean = self.clean_segments().saturating_sub(self.pass_reserve) as u64;
        let imap = self.imap.block_addrs().len() as u64;
        self.pass_log(self.buffered_blocks(true) + imap + 1).1 <= clean
    }

    /// A log write that failed half-way left the in-memory state ahead of anything the log
    /// can hold (its dirty sets were taken): refuse further changes, so nothing built on it
    /// reaches the log. The image keeps its last committed flush; remounting recovers it.
    pub(crate) fn note_log_result<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r
            && self.broken.is_none()
        {
            ::log::error!("lfs: a log write failed ({e}); refusing changes until remount");
            self.broken = Some(e.to_string());
        }
        r
    }

    pub fn check_log_ok(&self) -> Result<()> {
        // A partial segment the sequencer failed to write broke the log as surely as a
        // write under the lock.
        let failed = self.log.sequencer.as_ref().and_then(|q| q.failed());
        match self.broken.as_ref().or(failed.as_ref()) {
            None => Ok(()),
            Some(m) => Err(FsError::Io(std::io::Error::other(format!(
                "an earlier log write failed ({m}); remount to recover"
            )))),
        }
    }

    pub(crate) fn flush_inner(&mut self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        if self.dirty.is_empty() {
            return Ok(());
        }
        self.write_dirty()?;
        self.log
            .write_partial(&self.sb, &self.dev, &mut self.usage, true)
            .map_err(io)?;
        self.stats.flushes += 1;
        #[cfg(any(test, feature = "planted"))]
        if self.planted == Planted::ReleaseAtFlush {
            // The deliberately broken rule the crash test must catch: no durable
            // checkpoint says these segments are empty yet.
            self.release_empty_segments();
        }
        Ok(())
    }

    /// Pushes the dirty state into the log writer (not yet committed).
    fn write_dirty(&mut self) -> Result<()> {
        // 1. The directory operation log, before the blocks and inodes it describes (004
        //    §4.2).
        let pending = self.dirty.take();
        self.stats.dirlog_records += pending.dirlog.len() as u64;
        for b in crate::format::dirlog::encode(&pending.dirlog) {
            let e = Entry {
                kind: Kind::DirLog,
                version: 0,
                ino: 0,
                lbn: 0,
            };
            self.push(e, b, 0)?;
        }
        // 2. Data blocks, file by file in logical order (temporal locality = logical here).
        for ((ino, lbn), d) in pending.data {
            let Some(n) = self.nodes.get(&ino) else {
                continue; // freed since
            };
            let version = n.inode.version;
            let e = Entry {
                kind: Kind::Data,
                version,
                ino,
                lbn,
            };
            let addr = self.push(e, d, BLOCK_SIZE as u32)?;
            self.stats.new_data_blocks += 1;
            self.map(ino)?;
            let old = self.set_map(ino, lbn, addr)?;
            self.kill(old, BLOCK_SIZE as u32);
        }
        // 3. Indirect and xattr blocks of the inodes about to be written.
        let inos = pending.inodes;
        for &ino in &inos {
            if self.nodes.contains_key(&ino) {
                self.write_meta_blocks(ino)?;
            }
        }
        // 4. Inodes, 16 to a block, then free records for inode numbers released.
        let mut records: Vec<Inode> = Vec::new();
        for &ino in &inos {
            if let Some(n) = self.nodes.get(&ino) {
                records.push(n.inode.clone());
            }
        }
        for (&ino, &version) in &pending.freed {
            // A free record: inode number and the version it will have next, mode 0.
            records.push(Inode {
                ino,
                version,
                ..Default::default()
            });
        }
        self.push_inode_records(&records)
    }

    /// Writes inodes `inos` ahead of the next flush, with their indirect and xattr blocks,
    /// not committed: a background cleaning pass's slice writes the files whose blocks it
    /// moved for the last time in that slice, so the flush after its moves — a hold every
    /// call waits for — writes only what came since (`Lfs::clean_pass_unlocked`). Returns
    /// the inodes written.
    ///
    /// Only an inode still dirty and with no data block buffered is written, and it is then
    /// no longer dirty: one a call buffered data for goes with that data at the next flush
    /// (its block map and size are not yet the data's), and one written since (a flush
    /// between the holds) is not written again. Written ahead, an inode may carry a call's
    /// change whose directory blocks and operation log records are still buffered; nothing
    /// of it is applied before the next commit (roll-forward applies whole flushes), and
    /// that commit is a flush of everything dirty then, those included.
    pub(crate) fn write_inodes_ahead(&mut self, inos: &[u64]) -> Result<u64> {
        let mut records: Vec<Inode> = Vec::new();
        for &ino in inos {
            if !self.dirty.is_inode_dirty(ino)
                || self.dirty.blocks_of(ino).next().is_some()
                || !self.nodes.contains_key(&ino)
            {
                continue;
            }
            self.write_meta_blocks(ino)?;
            self.dirty.inode_written(ino);
            if let Some(n) = self.nodes.get(&ino) {
                records.push(n.inode.clone());
            }
        }
        self.push_inode_records(&records)?;
        Ok(records.len() as u64)
    }

    /// Pushes inode records (and free records, mode 0), 16 to a block, and points the
    /// inode map at them.
    fn push_inode_records(&mut self, records: &[Inode]) -> Result<()> {
        for chunk in records.chunks(inode::PER_BLOCK) {
            let refs: Vec<&Inode> = chunk.iter().collect();
            let e = Entry {
                kind: Kind::Inode,
                version: 0,
                ino: chunk[0].ino,
                lbn: chunk.len() as u64,
            };
            let live = chunk.iter().filter(|n| n.mode != 0).count() as u32 * 256;
            let addr = self.push(e, inode::encode_block(&refs), live)?;
            for n in chunk {
                if n.mode == 0 {
                    continue;
                }
                let old = self.imap.addr(n.ino);
                self.kill(old, 256);
                self.imap.set(
                    n.ino,
                    ImapEntry {
                        addr,
                        version: n.version,
                    },
                );
            }
        }
        Ok(())
    }

    /// Sets `map[lbn] = addr` (0 removes), marking the indirect slot dirty; returns the old
    /// address. The map must be loaded.
    pub fn set_map(&mut self, ino: u64, lbn: u64, addr: u64) -> Result<u64> {
        let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
        let map = n.map.as_mut().ok_or(Errno::EIO)?;
        let old = if addr == 0 {
            map.remove(&lbn)
        } else {
            map.insert(lbn, addr)
        }
        .unwrap_or(0);
        if old == 0 && addr != 0 {
            n.inode.blocks += 1;
        } else if old != 0 && addr == 0 {
            n.inode.blocks = n.inode.blocks.saturating_sub(1);
        }
        match slot_of(lbn) {
            None => n.inode.direct[lbn as usize] = addr,
            Some(s) => {
                let mut at = Some(s);
                while let Some(x) = at {
                    n.dirty_slots.insert(x);
                    at = slot_parent(x);
                }
                // Not dirty here: the callers say when the inode is (a flush re-pointing
                // the blocks it writes must not dirty it again).
                self.dirty.note_meta(ino);
            }
        }
        Ok(old)
    }

    /// Rewrites the dirty indirect blocks (children before the double indirect block that
    /// names them) and the xattr block of `ino`.
    fn write_meta_blocks(&mut self, ino: u64) -> Result<()> {
        let slots: Vec<u64> = {
            let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
            let mut v: Vec<u64> = std::mem::take(&mut n.dirty_slots).into_iter().collect();
            // Children before the blocks that name them.
            v.sort_by_key(|&s| (slot_level(s), s));
            v
        };
        for s in slots {
            let n = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
            let version = n.inode.version;
            let mut b = vec![0u8; BLOCK_SIZE];
            let mut any = false;
            if slot_level(s) > 0 {
                let (lo, hi) = slot_range(s);
                for (&c, &a) in n.ind.range(lo..hi) {
                    put_u64(&mut b, ((c - lo) * 8) as usize, a);
                    any = true;
                }
            } else {
                let (lo, hi) = slot_range(s);
                if let Some(map) = &n.map {
                    for (&l, &a) in map.range(lo..hi) {
                        put_u64(&mut b, ((l - lo) * 8) as usize, a);
                        any = true;
                    }
                }
            }
            let new = if any {
                let e = Entry {
                    kind: Kind::Indirect,
                    version,
                    ino,
                    lbn: s,
                };
                self.push(e, b, BLOCK_SIZE as u32)?
            } else {
                0
            };
            let n = self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
            let old = if new == 0 {
                n.ind.remove(&s)
            } else {
                n.ind.insert(s, new)
            }
            .unwrap_or(0);
            match (old, new) {
                (0, a) if a != 0 => n.inode.blocks += 1,
                (o, 0) if o != 0 => n.inode.blocks = n.inode.blocks.saturating_sub(1),
                _ => {}
            }
            match s {
                0 => n.inode.indirect = new,
                1 => n.inode.dindirect = new,
                T_TOP => n.inode.tindirect = new,
                _ => {}
            }
            self.kill(old, BLOCK_SIZE as u32);
        }
        self.write_xattr_blocks(ino)
    }

    /// A checkpoint (004 §4.1): flush, then the dirty inode map blocks and the usage table
    /// into the log, a device flush, and the checkpoint region in the slot not used last.
    /// Segments with no live bytes become clean once the region is durable. All of it
    /// under the lock; `Lfs::checkpoint` does the device flushes and the region without it.
    pub fn checkpoint(&mut self) -> Result<()> {
        self.check_log_ok()?;
        let r = self.checkpoint_inner();
        self.note_log_result(r)
    }

    pub(crate) fn checkpoint_inner(&mut self) -> Result<()> {
        self.settle_checkpoint()?;
        if let Some(w) = self.checkpoint_prepare()? {
            w.write(&self.dev)?;
            self.checkpoint_finish(w);
        }
        Ok(())
    }

    /// The checkpoint whose device writes another thread made without the lock, if any:
    /// waits for them (they need nothing this lock guards) and records it done, so the
    /// next checkpoint starts from it. Called before any checkpoint is prepared.
    pub(crate) fn settle_checkpoint(&mut self) -> Result<()> {
        let Some(f) = self.cp_flight.take() else {
            return Ok(());
        };
        let r = f.lock().take();
        match r {
            Some(Ok(w)) => {
                self.checkpoint_finish(w);
                Ok(())
            }
            Some(Err(m)) => self.note_log_result(Err(FsError::Io(std::io::Error::other(m)))),
            None => self.note_log_result(Err(FsError::Io(std::io::Error::other(
                "a checkpoint's device writes did not finish",
            )))),
        }
    }

    /// Everything of a checkpoint up to its device flushes, under the lock: the flush, the
    /// inode map and usage table blocks, the last partial segment written (not yet
    /// flushed), and the region encoded with the log's position after it. `None` when
    /// there is nothing to write (read-only) or a planted ordering did it all.
    pub(crate) fn checkpoint_prepare(&mut self) -> Result<Option<CheckpointWrite>> {
        if self.read_only {
            return Ok(None);
        }
        self.write_dirty()?;
        for i in self.imap.take_dirty() {
            self.push_imap_block(i)?;
        }
        // The usage table describes its own new blocks: reserve their addresses in one
        // partial segment, account for them, then encode.
        let nu = self.usage.block_addrs().len();
        self.log
            .ensure_room(&self.sb, &self.dev, &mut self.usage, nu)
            .map_err(io)?;
        let mut addrs = Vec::with_capacity(nu);
        for i in 0..nu {
            let e = Entry {
                kind: Kind::Usage,
                version: 0,
                ino: 0,
                lbn: i as u64,
            };
            addrs.push(self.push(e, vec![0u8; BLOCK_SIZE], BLOCK_SIZE as u32)?);
        }
        for (i, &a) in addrs.iter().enumerate() {
            let old = self.usage.moved_block(i, a);
            self.kill(old, BLOCK_SIZE as u32);
        }
        for (i, &a) in addrs.iter().enumerate() {
            let b = self.usage.encode_block(i as u32);
            self.log.fill(&self.sb, a, b);
        }
        // What this region records empty; released once it is durable, and only these:
        // a segment emptied after this point is still live in the region being written.
        let empties = self.usage.empty_segments();
        #[cfg(any(test, feature = "planted"))]
        if self.planted == Planted::CheckpointFirst {
            // The deliberately broken order the crash test must catch: the region first,
            // naming where the log will be once the segments it names are written.
            let n = self.log.pending_len() as u32;
            let (mut seg, mut off) = (self.log.seg, self.log.off + n + 1);
            if off + 2 > self.sb.segment_blocks {
                (seg, off) = (self.log.next_seg, 0);
            }
            let w = self.encode_cp_region(seg, off, self.log.serial + 1, empties);
            self.dev.write_blocks(w.at, &w.region)?;
            self.log
                .write_partial(&self.sb, &self.dev, &mut self.usage, true)
                .map_err(io)?;
            if let Some((q, upto)) = self.log.barrier() {
                q.wait(upto)?;
            }
            self.dev.flush()?;
            self.checkpoint_finish(w);
            return Ok(None);
        }
        self.log
            .write_partial(&self.sb, &self.dev, &mut self.usage, true)
            .map_err(io)?;
        Ok(Some(self.encode_cp_region(
            self.log.seg,
            self.log.off,
            self.log.serial,
            empties,
        )))
    }

    /// Pushes block `i` of the inode map as it is now and points the map at the new copy
    /// (the old one dead). The caller has taken `i` off the dirty blocks.
    fn push_imap_block(&mut self, i: u32) -> Result<()> {
        let e = Entry {
            kind: Kind::Imap,
            version: 0,
            ino: 0,
            lbn: i as u64,
        };
        let b = self.imap.encode_block(i);
        let addr = self.push(e, b, BLOCK_SIZE as u32)?;
        let old = self.imap.moved_block(i, addr);
        self.kill(old, BLOCK_SIZE as u32);
        Ok(())
    }

    /// Writes up to `n` of the dirty inode map blocks ahead of the next checkpoint, not
    /// committed: a background pass does so in holds of their own before its checkpoint's,
    /// so that hold — every call waits for it — writes only the blocks calls dirtied
    /// since (on the overwrite benchmark nearly every block of the map is dirty at each
    /// checkpoint: 190 of them, most of a 2.5 ms hold). Returns the blocks still dirty.
    ///
    /// Sound because a block leaves the dirty set only as it is written, with its entries
    /// as they are in this hold: an entry a call changes after it dirties it again, and the
    /// checkpoint writes it again. No checkpoint names a copy written here before one is
    /// durable, and roll-forward ignores inode map blocks (it rebuilds the entries from the
    /// inode blocks after the checkpoint), so a crash before then leaves it a dead block.
    /// Its old copy, which the last durable checkpoint names, is counted dead at once, as
    /// the checkpoint's own writes count theirs: its segment becomes clean only once a
    /// checkpoint naming the new copy is durable.
    pub(crate) fn write_imap_ahead(&mut self, n: usize) -> Result<usize> {
        let now: Vec<u32> = self.imap.dirty_blocks().iter().copied().take(n).collect();
        if planted!(self, ImapAheadDropsRest) {
            // The deliberately broken variant: every dirty block taken, a slice written.
            self.imap.take_dirty();
        }
        for i in now {
            self.imap.written_block(i);
            self.push_imap_block(i)?;
        }
        Ok(self.imap.dirty_blocks().len())
    }

    fn encode_cp_region(
        &self,
        log_seg: u32,
        log_off: u32,
        log_serial: u64,
        empties: Vec<u32>,
    ) -> CheckpointWrite {
        let slot = self.cp.next_slot();
        let cp = crate::format::checkpoint::Checkpoint {
            serial: self.cp.serial() + 1,
            time_ns: crate::log::now_ns(),
            log_seg,
            log_off,
            log_serial,
            next_ino: self.imap.next_ino(),
            imap_addrs: self.imap.block_addrs().to_vec(),
            usage_addrs: self.usage.block_addrs().to_vec(),
            // Files unlinked while open: nothing in the log after this checkpoint need
            // mention them again, so the region lists them for the mount after a crash to
            // free (roll-forward finds only those written after it).
            orphans: self.orphan_list(),
        };
        CheckpointWrite {
            at: self.sb.cp_start(slot),
            region: cp.encode(self.sb.cp_blocks),
            empties,
            barrier: self
                .log
                .barrier()
                .filter(|_| !planted!(self, FlushBeforeLogWrites)),
        }
    }

    /// After a durable checkpoint region: the next slot, and the segments it recorded
    /// empty freed (those no read in flight holds).
    pub(crate) fn checkpoint_finish(&mut self, w: CheckpointWrite) {
        self.cp.done();
        self.release_checkpointed(w.empties);
        self.stats.checkpoints += 1;
        self.stats.flushes += 1;
    }

    /// Segments with no live bytes, other than the log's head and its next segment, are
    /// clean: called only when a checkpoint recording them so is durable.
    pub fn release_empty_segments(&mut self) {
        let all = 0..self.sb.segments;
        self.release_checkpointed(all);
    }

    /// Releases those of `segs` still empty (the ones a durable checkpoint recorded with
    /// no live bytes), but none a read in flight holds (`readgate.rs`).
    pub(crate) fn release_checkpointed(&mut self, segs: impl IntoIterator<Item = u32>) {
        let gate = Arc::clone(&self.gate);
        let ignore = self.ignores_read_pins();
        let log = &self.log;
        let kept = self.usage.release_empty(segs, log.seg, log.next_seg, |s| {
            (!ignore && gate.pinned(s)) || log.holds(s)
        });
        self.stats.releases_held += kept as u64;
    }

    /// Does a read outside the lock hold segment `s` (`readgate.rs`) — beside the `own`
    /// pins of the asking pass on it — or a partial segment in flight lie in it
    /// (`sequencer.rs`)?
    pub(crate) fn read_holds(&self, s: u32, own: u32) -> bool {
        (!self.ignores_read_pins() && self.gate.pins(s) > own) || self.write_holds(s)
    }

    /// Does a partial segment sealed and not yet written lie in segment `s`? Such a
    /// segment is no victim (a pass would read it half-written) and is not released.
    pub(crate) fn write_holds(&self, s: u32) -> bool {
        self.log.holds(s)
    }

    fn ignores_read_pins(&self) -> bool {
        planted!(self, NoReadGate)
    }

    /// Is a segment's worth of data buffered: what the syncer writes without waiting for
    /// the data to age (004 §3: Sprite LFS wrote a segment once its buffer filled)? Each
    /// flush is a hold of the lock every call waits for, as long as what it writes: left
    /// to age for the syncer's tick, 1,398 blocks took 5-8 ms in one hold, a call's p99
    /// with the cleaner idle (docs/bench/history.md, "The holds that were not the
    /// cleaner's"). A segment at a time, a flush still writes whole segments.
    pub(crate) fn write_behind(&self) -> bool {
        self.dirty.data_blocks() >= self.sb.segment_blocks as u64
    }

    /// Is the syncer to write a segment's worth now ([`State::write_behind`]), `retry_at`
    /// being when it may try again after a flush that failed (a full disk keeps the data
    /// buffered: trying at once, the thread would spin on it)?
    pub(crate) fn write_behind_due(&self, retry_at: Option<Instant>, now: Instant) -> bool {
        self.write_behind() && retry_at.is_none_or(|t| now >= t)
    }

    /// What a syncer's wake-up writes after its cleaning: a checkpoint once the log since
    /// the last one reaches `checkpoint_bytes`, else a flush once a segment's worth is
    /// buffered (not before `retry_at` after one failed). With `clock` (the syncer's own
    /// ticks) time decides too: a checkpoint every `checkpoint_interval` with anything
    /// new, a flush of data older than `flush_age`. Without it (`background_inline`, for
    /// recordings that must be the same run to run), only what was written does.
    pub(crate) fn syncer_due(
        &self,
        o: &MountOptions,
        clock: bool,
        retry_at: Option<Instant>,
    ) -> SyncerDue {
        let timed_checkpoint = clock
            && self.cp.age() >= o.checkpoint_interval
            && (self.cp.log_bytes() > 0 || self.dirty.since().is_some());
        let aged = clock
            && self
                .dirty
                .since()
                .is_some_and(|t| t.elapsed() >= o.flush_age);
        if timed_checkpoint || self.cp.log_bytes() >= o.checkpoint_bytes || self.imap_debt_due() {
            SyncerDue::Checkpoint
        } else if self.write_behind_due(retry_at, Instant::now()) || aged {
            SyncerDue::Flush
        } else {
            SyncerDue::Nothing
        }
    }

    /// Is a checkpoint due to write the inode map while there is room for it? Its dirty
    /// blocks are a debt the next checkpoint pays, and a cleaning pass's checkpoint is
    /// that checkpoint: its room rule and its gain count every dirty map block. Random
    /// overwrites across a large file set dirty most of the map between two checkpoints
    /// (776 blocks, six 512 KiB segments, for 197,000 files on a 1 GiB image), and at the
    /// cleaner's start the passes that would pay with that debt on them did not fit the
    /// room: each was refused, the clean segments ran out and writes failed with ENOSPC at
    /// 80% utilization (docs/bench/history.md, "ENOSPC at 80% on a 1 GiB image"). So the
    /// debt is paid by a checkpoint once it exceeds a quarter of the clean segments beyond
    /// the reserve, and is at least a segment's worth: near a full disk a checkpoint per
    /// segment of map blocks, never one per call.
    pub(crate) fn imap_debt_due(&self) -> bool {
        #[cfg(any(test, feature = "planted"))]
        if self.planted == Planted::ImapDebtUnpaid {
            return false;
        }
        let debt = self.imap.dirty_blocks().len() as u64;
        let seg = self.sb.segment_blocks as u64;
        let beyond = self.clean_segments().saturating_sub(self.kept_segments()) as u64;
        debt >= seg && debt * 4 > beyond * seg
    }

    /// Flushes or checkpoints when the buffers, the log or the clock say so. Returns
    /// whether the background cleaner is wanted (a mount with a syncer cleans there).
    pub fn maybe_flush(&mut self, o: &MountOptions) -> Result<bool> {
        if self.dirty.data_blocks() * BS >= o.dirty_limit {
            self.flush()?;
        }
        // With a syncer, the checkpoint is the syncer's (woken below, its device flushes
        // outside the lock), as with `background_inline` (after the lock, `Lfs::run`);
        // without either, here.
        let background = !o.read_only && (o.syncer || o.background_inline);
        if !background && (self.cp.log_bytes() >= o.checkpoint_bytes || self.imap_debt_due()) {
            self.checkpoint()?;
        }
        // The cleaner starts after the operation that took the clean segments below the
        // threshold, not at the syncer's next tick: ticks alone let a burst of writes use
        // up the clean segments, and once too few are left a pass has no room to move live
        // data. With a syncer the call only wakes it (the pass runs there, and this call
        // returns at once); without one (tests, crash recordings: a time-dependent thread
        // would make runs differ) the call cleans itself, or with `background_inline` runs
        // the syncer's passes once the lock is let go (`Lfs::run`).
        if background {
            return Ok(self.cleaning_wanted()
                || self.cp.log_bytes() >= o.checkpoint_bytes
                || self.imap_debt_due()
                || self.write_behind());
        }
        self.clean_if_low(16)?;
        Ok(false)
    }
}

#[cfg(test)]
pub(crate) type TestHook = Box<dyn Fn() + Send + Sync>;

/// The mounted file system.
pub struct Lfs {
    pub(crate) st: Mutex<State>,
    pub(crate) opts: MountOptions,
    /// When reads update access times (`FileSystem::set_atime`).
    pub(crate) atime: Mutex<cairn_vfs::Atime>,
    /// Called by a read between its plan and its device reads (tests: to run other
    /// calls in that window).
    #[cfg(test)]
    pub(crate) read_hook: Mutex<Option<TestHook>>,
    /// Called by a background cleaning pass between reading its victims and taking the
    /// lock again (tests).
    #[cfg(test)]
    pub(crate) clean_hook: Mutex<Option<TestHook>>,
    /// Called by a background cleaning pass between two holds choosing its victims
    /// (tests).
    #[cfg(test)]
    pub(crate) choose_hook: Mutex<Option<TestHook>>,
    /// Called by a background cleaning pass between two slices of its moves (tests).
    #[cfg(test)]
    pub(crate) slice_hook: Mutex<Option<TestHook>>,
    /// Called by a checkpoint written without the lock once its device writes are done,
    /// before it is recorded (tests).
    #[cfg(test)]
    pub(crate) cp_hook: Mutex<Option<TestHook>>,
    pub(crate) stop: Arc<(Mutex<bool>, Condvar)>,
    /// Background cleaning passes ended (what a write short of room waits on).
    pub(crate) passes: (Mutex<u64>, Condvar),
    /// Calls waiting on `passes` for room now: a background pass chooses the whole room
    /// for them, half of it when none waits (`cleaner::clean::Room`).
    pub(crate) room_waiters: std::sync::atomic::AtomicUsize,
    syncer: Mutex<Option<std::thread::JoinHandle<()>>>,
    destroyed: AtomicBool,
}

/// How much nicer than the calls the background syncer (and its cleaning passes) runs.
pub(crate) const SYNCER_NICENESS: i32 = 10;

/// The scheduler slice the background syncer asks for (Linux 6.6's EEVDF scheduler, with
/// custom slices since 6.12; earlier kernels ignore it). Longer than a call thread's
/// (`cairn_vfs::sched::CALL_SLICE_NS`, which the FUSE request threads ask for): a woken
/// thread preempts the running one at once only where its slice is the shorter
/// (`PREEMPT_SHORT`); with equal slices a call woken in the syncer's first slice after it
/// took the CPU waited for the next tick. Short still, so that a caller at the default
/// slice (a program driving the engine directly) waits one such slice, not a default one.
pub(crate) const SYNCER_SLICE_NS: u64 = 2 * cairn_vfs::sched::CALL_SLICE_NS;
const _: () = assert!(SYNCER_SLICE_NS > cairn_vfs::sched::CALL_SLICE_NS);

/// Lowers the calling thread's priority by [`SYNCER_NICENESS`] (to 19 at most) and asks
/// for a short scheduler slice ([`SYNCER_SLICE_NS`]): the background syncer's. Its passes
/// do most of their work outside the engine's lock (reading victims, hashing what they
/// write); at the calls' priority the scheduler gave that work slices of a few
/// milliseconds while calls waited for the CPU, and preempted the pass inside its lock
/// holds for the log writer's turn, so each hold stretched by as much. A nicer syncer is
/// preempted by the calls instead, and still runs whenever they wait (for room, for its
/// lock). Measured on the overwrite benchmark, the thread reniced from outside: running
/// p99 16-27 ms -> 9.4-10.6 ms, throughput unchanged (history.md).
///
/// Nicer is not enough on the CPU a call shares with it: the kernel lets a woken thread
/// preempt the running one at once only where the woken one's slice is shorter, and
/// otherwise notices a used-up slice at the next tick (4 ms apart at 250 Hz). With the
/// calls at the default slice the syncer kept the CPU for 2.9-3.5 ms while a woken call
/// waited (a scheduler trace; history.md, "Calls preempt the syncer at once"). The calls'
/// threads therefore ask for a shorter slice than this thread's (`cairn_vfs::sched`). The
/// idle scheduling class, which also gave the CPU to the calls, is not used: a syncer
/// starved by other processes while it holds the engine lock would stop every call. A
/// thread may always raise its own niceness and set its own slice; a failure only costs
/// the latency.
fn yield_to_calls() {
    let me = Some(rustix::thread::gettid());
    let nice =
        rustix::process::getpriority_process(me).map(|nice| (nice + SYNCER_NICENESS).min(19));
    let set = nice.and_then(|n| rustix::process::setpriority_process(me, n));
    if let Err(e) = set {
        ::log::debug!("lfs syncer: cannot lower its priority: {e}");
    }
    if let Ok(n) = nice
        && let Err(e) = cairn_vfs::sched::set_thread(n, SYNCER_SLICE_NS)
    {
        ::log::debug!("lfs syncer: cannot shorten its scheduler slice: {e}");
    }
}

impl Lfs {
    /// Runs the background syncer: flushes dirty data older than `flush_age` and
    /// checkpoints every `checkpoint_interval` (004 §4.1).
    fn start_syncer(self: &Arc<Self>) {
        if !self.opts.syncer || self.opts.read_only {
            return;
        }
        let weak = Arc::downgrade(self);
        let stop = self.stop.clone();
        let h = std::thread::Builder::new()
            .name("lfs-syncer".into())
            .spawn(move || {
                yield_to_calls();
                // After a flush that failed (a full disk keeps the data buffered), a
                // segment's worth buffered is not written again before the next tick: the
                // thread would spin on it, and the calls' wake-ups with it.
                let mut retry_at: Option<Instant> = None;
                let behind = |st: &State, retry_at| st.write_behind_due(retry_at, Instant::now());
                loop {
                    // A segment buffered while this thread was busy woke no one: it is
                    // written now, not at the next tick.
                    let due = weak
                        .upgrade()
                        .is_some_and(|fs| behind(&fs.st.lock(), retry_at));
                    {
                        let (m, cv) = &*stop;
                        let mut s = m.lock();
                        if !*s && !due {
                            cv.wait_for(&mut s, Duration::from_millis(500));
                        }
                        if *s {
                            return;
                        }
                    }
                    let Some(fs) = weak.upgrade() else { return };
                    fs.clean_in_background();
                    let st = fs.st.lock();
                    let due = st.syncer_due(&fs.opts, true, retry_at);
                    let r = fs.write_due(st, due);
                    retry_at = r
                        .is_err()
                        .then(|| Instant::now() + Duration::from_millis(500));
                    if let Err(e) = r {
                        ::log::warn!("lfs syncer: {e}");
                    }
                }
            });
        if let Ok(h) = h {
            *self.syncer.lock() = Some(h);
        }
    }

    /// The background cleaner's run (004 §3.4): once fewer than `clean_start` segments are
    /// clean, passes until `clean_stop` are, each reading its victims and making its
    /// checkpoint's device writes without the engine's lock (`Lfs::clean_step`). Writes
    /// short of room wait for the run (`Lfs::write_as`) unless it ends having given
    /// nothing back (`bg_stuck`); then they clean in the foreground (`ensure_space`).
    fn clean_in_background(&self) {
        self.clean_in_background_upto(MAX_BACKGROUND_PASSES);
    }

    /// [`Lfs::clean_in_background`], at most `passes` passes.
    fn clean_in_background_upto(&self, passes: u32) {
        {
            let mut st = self.st.lock();
            if !st.cleaning_wanted() {
                return;
            }
            st.bg_run = true;
        }
        let mut stuck = false;
        for _ in 0..passes {
            if *self.stop.0.lock() {
                break;
            }
            match self.clean_step() {
                Ok(true) => {}
                Ok(false) => {
                    let st = self.st.lock();
                    stuck = !st.thresholds.satisfied(st.clean_ahead());
                    break;
                }
                Err(e) => {
                    ::log::warn!("lfs cleaner: {e}");
                    stuck = true;
                    break;
                }
            }
        }
        let mut st = self.st.lock();
        st.bg_run = false;
        st.bg_stuck = stuck;
        drop(st);
        // Writes waiting for the run (`Lfs::write_as`) look again.
        let (m, cv) = &self.passes;
        *m.lock() += 1;
        cv.notify_all();
    }

    /// What a syncer's wake-up runs, for a mount with `background_inline` (no syncer), on
    /// the calling thread once its operation has let the lock go: background cleaning
    /// passes ([`INLINE_PASSES`] at most), then the checkpoint due by the log's size, with
    /// its device writes outside the lock, or the write-behind of a segment's worth
    /// buffered. Nothing the clock decides (the syncer's ticks, `flush_age`): a recording
    /// stays the same run to run.
    pub(crate) fn background_inline(&self) {
        self.clean_in_background_upto(INLINE_PASSES);
        let st = self.st.lock();
        let due = st.syncer_due(&self.opts, false, None);
        if let Err(e) = self.write_due(st, due) {
            ::log::warn!("lfs background: {e}");
        }
    }

    /// Writes what `due` says (`State::syncer_due`): a checkpoint, its device writes
    /// without the lock; or a flush under it.
    fn write_due(&self, st: MutexGuard<'_, State>, due: SyncerDue) -> Result<()> {
        match due {
            SyncerDue::Checkpoint => {
                drop(st);
                self.checkpoint()
            }
            SyncerDue::Flush => {
                let mut st = st;
                st.flush()
            }
            SyncerDue::Nothing => Ok(()),
        }
    }

    fn stop_syncer(&self) {
        {
            let (m, cv) = &*self.stop;
            *m.lock() = true;
            cv.notify_all();
        }
        if let Some(h) = self.syncer.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }

    /// Counters: flushes, checkpoints, partial segments and blocks written.
    pub fn lfs_stats(&self) -> LfsStats {
        let st = self.st.lock();
        let mut s = st.stats;
        s.partial_segments = st.log.partials_written;
        s.log_blocks = st.log.blocks_written;
        s
    }

    /// The cleaner's counters.
    pub fn cleaner_stats(&self) -> CleanerStats {
        self.st.lock().cleaner
    }

    /// Runs one cleaning pass now, with the mount's policy, towards `stop_at` clean segments.
    pub fn clean_now(&self, stop_at: u32) -> Result<u32> {
        let mut st = self.st.lock();
        let th = Thresholds::new(1, stop_at.max(1)).map_err(corrupt)?;
        let p = st.policy;
        st.clean_pass(p, th)
    }

    /// Clean segments now.
    pub fn clean_segments(&self) -> u32 {
        self.st.lock().clean_segments()
    }

    /// Writes a checkpoint now: prepared under the engine's lock (the flush, the tables,
    /// the last partial segment written), its device flushes and region without it, then
    /// recorded under the lock again — the segments it freed released. Calls go on
    /// meanwhile; what they write to the log lands after the position the region names,
    /// where roll-forward finds it. Two checkpoints never overlap: the next one (here or
    /// under the lock, `State::settle_checkpoint`) waits for this one's device writes.
    pub fn checkpoint(&self) -> Result<()> {
        let mut st = self.st.lock();
        st.check_log_ok()?;
        st.settle_checkpoint()?;
        let r = st.checkpoint_prepare();
        match st.note_log_result(r)? {
            Some(w) => self.write_checkpoint(st, w).map(drop),
            None => Ok(()),
        }
    }

    /// The device writes of checkpoint `w`, prepared under `st`, made without the lock;
    /// returns the lock again, with the checkpoint recorded.
    pub(crate) fn write_checkpoint<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        w: CheckpointWrite,
    ) -> Result<MutexGuard<'a, State>> {
        let flight: Flight = Arc::new(Mutex::new(None));
        {
            // Taken before the engine's lock is let go: a checkpoint under the lock waits
            // on it, and never sees the flight unfinished.
            let mut out = flight.lock();
            st.cp_flight = Some(Arc::clone(&flight));
            let dev = Arc::clone(&st.dev);
            drop(st);
            let r = w.write(&dev);
            *out = Some(r.map(|()| w).map_err(|e| e.to_string()));
        }
        #[cfg(test)]
        if let Some(h) = &*self.cp_hook.lock() {
            h();
        }
        let mut st = self.st.lock();
        if st
            .cp_flight
            .as_ref()
            .is_some_and(|f| Arc::ptr_eq(f, &flight))
        {
            st.settle_checkpoint()?;
        } else {
            // Settled by the next checkpoint already (an error there broke the log).
            st.check_log_ok()?;
        }
        Ok(st)
    }

    /// Flushes everything dirty to the log (committed, not checkpointed) without a device
    /// flush: what a crash right after may keep.
    pub fn flush_log(&self) -> Result<()> {
        self.st.lock().flush()
    }
}

impl Drop for Lfs {
    fn drop(&mut self) {
        self.stop_syncer();
        // The log writer thread writes what is sealed, then stops.
        let q = self.st.lock().log.sequencer.clone();
        if let Some(q) = q
            && let Err(e) = q.shutdown()
        {
            ::log::warn!("lfs: {e}");
        }
    }
}
