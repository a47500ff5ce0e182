//! Mount: the newer valid checkpoint region, the inode map and usage table it names, then
//! roll-forward (004 §4.2) through the partial segments written after it.
//!
//! Roll-forward reads the log from the checkpoint's position, following each segment's
//! `next_seg`, for as long as the summaries carry the expected serial and their blocks
//! their checksum. Partial segments are applied a *flush* at a time — only up to a summary
//! flagged COMMIT — so the recovered state is the state at the end of some flush: an
//! operation boundary, where directory entries and link counts agree (the records of the
//! directory operation log come first in each flush; see DESIGN.md for why applying whole
//! flushes is what keeps them consistent here). For each inode found, the inode map is
//! pointed at the new copy, and the usage table moves the bytes of the blocks the old copy
//! owned to those the new one owns (004 §4.2: "the utilizations of older segments will also
//! have to be adjusted").

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::BufferCache;
use cairn_vfs::{Errno, FsError, Result};
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap as HashMap;

#[cfg(any(test, feature = "planted"))]
use super::Planted;
use super::{
    Checkpointer, CleanerStats, Directories, DirtySet, Handles, InodeMap, Lfs, LfsStats,
    MountOptions, State, Usage, age_ms, corrupt, owned_blocks,
};
use crate::cleaner::policy::Thresholds;
use crate::format::BLOCK_SIZE;
use crate::format::checkpoint::{self, Checkpoint};
use crate::format::inode::{self, Inode};
use crate::format::summary::Kind;
use crate::format::summary::Summary;
use crate::format::superblock;
use crate::format::superblock::Superblock;
use crate::format::tables::{self, ImapEntry, UsageEntry};
use crate::log::read_partial;
use crate::log::{LogWriter, Segments};
use cairn_bufcache::{CacheConfig, NoHooks};

impl State {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        sb: Superblock,
        dev: Arc<dyn BlockDevice>,
        imap: Vec<ImapEntry>,
        imap_addrs: Vec<u64>,
        usage: Vec<UsageEntry>,
        usage_addrs: Vec<u64>,
        cp: &Checkpoint,
        cp_slot: usize,
        read_only: bool,
        opts: &MountOptions,
    ) -> State {
        let sb_segments = sb.segments;
        let log = LogWriter::new(
            cp.log_seg,
            cp.log_off,
            cp.log_serial,
            cp.log_seg,
            sb.segment_blocks,
        );
        let cache = BufferCache::new(
            Arc::clone(&dev),
            CacheConfig {
                budget_bytes: opts.cache_bytes,
                ..CacheConfig::default()
            },
            Arc::new(NoHooks),
        );
        let mut log = log;
        log.cache = Some(Arc::clone(&cache));
        State {
            sb,
            dev,
            cache,
            readahead_blocks: opts.readahead_blocks,
            logical_clock: opts.logical_clock,
            imap: InodeMap::new(imap, imap_addrs, cp.next_ino),
            usage: Usage::new(usage, usage_addrs),
            log,
            nodes: HashMap::default(),
            dirty: DirtySet::default(),
            dirs: Directories::default(),
            cp: Checkpointer::new(cp.serial, cp_slot),
            handles: Handles::default(),
            stats: LfsStats::default(),
            cleaner: CleanerStats::default(),
            broken: None,
            policy: opts.cleaner,
            thresholds: opts
                .thresholds(sb_segments)
                .unwrap_or_else(|_| Thresholds::new(2, 4).expect("valid")),
            read_only,
            writeback_reserve: 0,
            dip_into_reserve: false,
            bg_run: false,
            bg_stuck: false,
            may_wait_for_cleaner: false,
            pass_reserve: 0,
            pass_frees: 0,
            may_wait_for_pass: false,
            cleaner_deferred: false,
            orphans: BTreeSet::new(),
            opened: BTreeSet::new(),
            gate: Arc::default(),
            cp_flight: None,
            #[cfg(any(test, feature = "planted"))]
            planted: Planted::None,
        }
    }

    /// Points the log writer's next segment at a clean one (after mount or mkfs).
    pub(crate) fn pick_next_segment(&mut self) -> Result<()> {
        let seg = self.log.seg;
        self.usage.set_dirty(seg as usize);
        self.log.next_seg = self
            .usage
            .take_clean(&[seg])
            .ok_or_else(|| corrupt("no clean segment left for the log"))?;
        Ok(())
    }

    /// Roll-forward from the checkpoint's log position; returns the partial segments applied.
    fn roll_forward(&mut self) -> Result<u64> {
        let sb = self.sb.clone();
        let (mut seg, mut off, mut serial) = (self.log.seg, self.log.off, self.log.serial);
        let mut unit: Vec<(Summary, Vec<u8>)> = Vec::new();
        let mut applied = 0u64;
        // Each partial takes at least one block of a finite log: this bounds the walk even
        // on a hostile image.
        for _ in 0..sb.total_blocks {
            let Some((s, data)) = read_partial(&sb, &self.dev, seg, off, serial) else {
                break;
            };
            serial += 1;
            off += 1 + s.entries.len() as u32;
            if off + 2 > sb.segment_blocks || s.skip_rest() {
                seg = s.next_seg;
                off = 0;
            }
            let commit = s.commit();
            #[cfg(any(test, feature = "planted"))]
            let commit = commit || self.planted == Planted::RollForwardUncommitted;
            unit.push((s, data));
            if commit {
                for (s, data) in std::mem::take(&mut unit) {
                    self.apply_partial(&s, &data)?;
                    applied += 1;
                }
                self.log.seg = seg;
                self.log.off = off;
                self.log.serial = serial;
            }
        }
        self.stats.rolled_forward_partials = applied;
        Ok(applied)
    }

    fn apply_partial(&mut self, s: &Summary, data: &[u8]) -> Result<()> {
        self.usage.set_dirty(s.seg as usize);
        let base = self.sb.seg_start(s.seg) + s.off as u64 + 1;
        for (i, e) in s.entries.iter().enumerate() {
            let b = &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
            match e.kind {
                Kind::Inode => {
                    let recs = inode::decode_block(b).map_err(corrupt)?;
                    for r in recs {
                        self.apply_inode(r, base + i as u64)?;
                    }
                }
                Kind::DirLog => {
                    let recs = crate::format::dirlog::decode(b).map_err(corrupt)?;
                    self.stats.dirlog_records += recs.len() as u64;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A newer copy of an inode (or its free record) found in the log at `addr`.
    fn apply_inode(&mut self, r: Inode, addr: u64) -> Result<()> {
        let ino = r.ino;
        if ino == 0 || ino >= self.sb.max_inodes as u64 {
            return Err(corrupt(format!(
                "inode number {ino} out of range in the log"
            )));
        }
        let old = self.imap.get(ino).unwrap_or_default();
        if old.addr != 0 {
            if let Some(prev) = self.read_inode(ino)? {
                for a in owned_blocks(&prev, |a| self.read_block(a))? {
                    self.kill(a, BLOCK_SIZE as u32);
                }
            }
            self.kill(old.addr, 256);
        }
        // The newest copy decides: an inode written with no link is an orphan unless a
        // later copy (its free record, or a link again) follows.
        if r.mode != 0 && r.nlink == 0 {
            self.orphans.insert(ino);
        } else {
            self.orphans.remove(&ino);
        }
        if r.mode == 0 {
            self.imap.set(
                ino,
                ImapEntry {
                    addr: 0,
                    version: r.version,
                },
            );
        } else {
            let mtime = age_ms(r.mtime);
            for a in owned_blocks(&r, |a| self.read_block(a))? {
                self.add_live(a, BLOCK_SIZE as u32, mtime);
            }
            self.add_live(addr, 256, mtime);
            self.imap.set(
                ino,
                ImapEntry {
                    addr,
                    version: r.version,
                },
            );
        }
        self.stats.rolled_forward_inodes += 1;
        Ok(())
    }
}

/// What a mount does with an image of an older format version read-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Older {
    Refuse,
    /// `cairn fsck -y`'s mount, before [`Lfs::upgrade_device`].
    Upgrade,
}

fn refused(msg: String) -> FsError {
    FsError::Refused(Errno::EINVAL, msg)
}

/// Reads the superblock and the chosen checkpoint of a device.
pub(crate) fn open_image(dev: &Arc<dyn BlockDevice>) -> Result<(Superblock, usize, Checkpoint)> {
    if dev.block_size() as usize != BLOCK_SIZE {
        return Err(refused(format!(
            "device block size {} (LFS uses {BLOCK_SIZE})",
            dev.block_size()
        )));
    }
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_blocks(0, &mut b)?;
    let sb = Superblock::decode(&b, dev.num_blocks()).map_err(|e| refused(e.0))?;
    let read_cp = |slot: usize| -> Result<crate::format::FResult<Checkpoint>> {
        let mut r = vec![0u8; sb.cp_blocks as usize * BLOCK_SIZE];
        dev.read_blocks(sb.cp_start(slot), &mut r)?;
        Ok(Checkpoint::decode(&r, &sb))
    };
    let (slot, cp) = checkpoint::choose(read_cp(0)?, read_cp(1)?).map_err(|e| refused(e.0))?;
    Ok((sb, slot, cp))
}

/// Loads the inode map and usage table a checkpoint names.
pub(crate) fn load_tables(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    cp: &Checkpoint,
) -> Result<(Vec<ImapEntry>, Vec<UsageEntry>)> {
    let mut b = vec![0u8; BLOCK_SIZE];
    let mut imap = Vec::with_capacity(sb.imap_blocks as usize * tables::PER_BLOCK);
    for (i, &a) in cp.imap_addrs.iter().enumerate() {
        dev.read_blocks(a, &mut b)?;
        imap.extend(tables::decode_imap(&b, i as u32).map_err(corrupt)?);
    }
    imap.truncate(sb.max_inodes as usize);
    if let Some((i, e)) = imap
        .iter()
        .enumerate()
        .find(|(_, e)| e.addr != 0 && !sb.in_log(e.addr))
    {
        return Err(corrupt(format!(
            "inode map: inode {i} at block {} outside the log",
            e.addr
        )));
    }
    let mut usage = Vec::with_capacity(sb.usage_blocks as usize * tables::PER_BLOCK);
    for (i, &a) in cp.usage_addrs.iter().enumerate() {
        dev.read_blocks(a, &mut b)?;
        usage.extend(tables::decode_usage(&b, i as u32).map_err(corrupt)?);
    }
    usage.truncate(sb.segments as usize);
    Ok((imap, usage))
}

impl Lfs {
    /// Mounts the image at `path` (locked: exclusively, or shared when read-only).
    pub fn mount(path: &std::path::Path, opts: &MountOptions) -> Result<Arc<Lfs>> {
        Self::mount_on(path, opts, None)
    }

    /// [`Lfs::mount`] with the image's device under a model of a mechanical disk (`-o
    /// disk=`, docs/DISKS.md), when `disk` names one.
    pub fn mount_on(
        path: &std::path::Path,
        opts: &MountOptions,
        disk: Option<&cairn_blockdev::disk::DiskOptions>,
    ) -> Result<Arc<Lfs>> {
        let dev = cairn_blockdev::FileDevice::open(path, BLOCK_SIZE as u32, opts.read_only)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::ResourceBusy {
                    FsError::Refused(Errno::EBUSY, e.to_string())
                } else {
                    FsError::Io(e)
                }
            })?;
        let dev = cairn_blockdev::disk::wrap(Arc::new(dev), disk)
            .map_err(|e| FsError::Refused(Errno::EINVAL, e.to_string()))?;
        Self::mount_device(dev, opts)
    }

    /// Mounts a file system on `dev`: checkpoint, tables, roll-forward, and (read-write) a
    /// checkpoint of what roll-forward found, so a second crash starts from it. An image of
    /// an older format version mounts read-only only (see [`Lfs::upgrade_device`]).
    pub fn mount_device(dev: Arc<dyn BlockDevice>, opts: &MountOptions) -> Result<Arc<Lfs>> {
        Self::mount_inner(dev, opts, Older::Refuse, |_| {})
    }

    /// A read-write mount of `dev` whatever its format version, for `cairn fsck -y`
    /// ([`crate::check::repair_device`]): an older image's log is rolled forward as that
    /// version checks it, and what the mount writes is the current version's. The caller
    /// finishes with [`Lfs::upgrade_device`] once the mount has been unmounted.
    pub(crate) fn mount_upgrading(
        dev: Arc<dyn BlockDevice>,
        opts: &MountOptions,
    ) -> Result<Arc<Lfs>> {
        Self::mount_inner(dev, opts, Older::Upgrade, |_| {})
    }

    /// Rewrites the superblock of an older format version as the current one, after a
    /// read-write mount ([`Lfs::mount_upgrading`]) rolled its log forward and its unmount
    /// checkpointed: nothing of the log the older version checks remains to roll forward.
    /// The version and the checksum lie in the block's first 512-byte sector, which the
    /// device lands whole (DESIGN.md, "Assumptions about the device"): a crash leaves the
    /// old superblock or the new one. Returns whether it upgraded.
    pub(crate) fn upgrade_device(dev: &Arc<dyn BlockDevice>) -> Result<bool> {
        let mut b = vec![0u8; BLOCK_SIZE];
        dev.read_blocks(0, &mut b)?;
        let sb = Superblock::decode(&b, dev.num_blocks()).map_err(|e| refused(e.0))?;
        if sb.version >= superblock::VERSION {
            return Ok(false);
        }
        dev.flush()?;
        let new = Superblock {
            version: superblock::VERSION,
            ..sb
        };
        dev.write_blocks(0, &new.encode())?;
        dev.flush()?;
        log::warn!(
            "upgraded the LFS image from format version {} to {}",
            sb.version,
            superblock::VERSION
        );
        Ok(true)
    }

    /// [`Lfs::mount_device`] with a planted ordering bug (the crash harness's catalogue).
    #[cfg(any(test, feature = "planted"))]
    pub fn mount_device_planted(
        dev: Arc<dyn BlockDevice>,
        opts: &MountOptions,
        planted: Planted,
    ) -> Result<Arc<Lfs>> {
        Self::mount_inner(dev, opts, Older::Refuse, |st| st.planted = planted)
    }

    fn mount_inner(
        dev: Arc<dyn BlockDevice>,
        opts: &MountOptions,
        older: Older,
        plant: impl FnOnce(&mut State),
    ) -> Result<Arc<Lfs>> {
        let (sb, slot, cp) = open_image(&dev)?;
        if sb.version < superblock::VERSION && !opts.read_only && older == Older::Refuse {
            return Err(refused(format!(
                "LFS format version {}: its log's checksums can pass a stale block after a crash, so this cairn mounts it read-only only; `cairn fsck -y IMAGE` upgrades it to version {} (older cairn builds then refuse it)",
                sb.version,
                superblock::VERSION
            )));
        }
        opts.thresholds(sb.segments)
            .map_err(|e| FsError::Refused(Errno::EINVAL, e))?;
        let (imap, usage) = load_tables(&dev, &sb, &cp)?;
        let mut st = State::new(
            sb,
            dev,
            imap,
            cp.imap_addrs.clone(),
            usage,
            cp.usage_addrs.clone(),
            &cp,
            slot,
            opts.read_only,
            opts,
        );
        plant(&mut st);
        // The checkpoint's orphans still in the inode map; roll-forward adds and drops.
        st.orphans = cp
            .orphans
            .iter()
            .copied()
            .filter(|&i| st.imap.addr(i) != 0)
            .collect();
        st.usage.set_dirty(cp.log_seg as usize);
        let rolled = st.roll_forward()?;
        if !opts.read_only {
            st.pick_next_segment()?;
            // Files unlinked while open when the system stopped (the checkpoint's orphan
            // list and what roll-forward saw): nothing can open them again, so they go
            // now, and the checkpoint below records it.
            let orphans = std::mem::take(&mut st.orphans);
            for &ino in &orphans {
                st.node(ino)?;
                st.maybe_free(ino)?;
            }
            if rolled > 0 || !orphans.is_empty() {
                st.checkpoint()?;
            } else {
                st.release_empty_segments();
            }
        }
        // From here on (recovery and the mount's checkpoint wrote under the lock), the
        // log's partial segments are written by the log writer thread, without the
        // engine's lock, when the mount runs background writers at all; a mount without
        // them (tests, the crash harness's recordings) writes each as it is sealed.
        if opts.syncer && !opts.read_only {
            st.log.sequencer = Some(crate::sequencer::Sequencer::start(Arc::clone(&st.dev)));
        }
        let fs = Arc::new(Lfs {
            st: Mutex::new(st),
            opts: opts.clone(),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
            passes: (Mutex::new(0), Condvar::new()),
            room_waiters: std::sync::atomic::AtomicUsize::new(0),
            syncer: Mutex::new(None),
            destroyed: AtomicBool::new(false),
            atime: Mutex::new(cairn_vfs::Atime::default()),
            #[cfg(test)]
            read_hook: Mutex::new(None),
            #[cfg(test)]
            clean_hook: Mutex::new(None),
            #[cfg(test)]
            choose_hook: Mutex::new(None),
            #[cfg(test)]
            slice_hook: Mutex::new(None),
            #[cfg(test)]
            cp_hook: Mutex::new(None),
        });
        fs.start_syncer();
        Ok(fs)
    }
}
