//! Undo scopes: taking back every change a failed operation made, in memory and on the
//! device. See "Undo" in the crate documentation for the contract; this module holds the log
//! and the computation of the device half (the reverse replay).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::buf::{BlockNo, Buf, BufRef};

/// Spare before-image vectors kept for reuse, so a successful operation's saves do not
/// allocate once the cache is warm.
const SPARE_IMAGES: usize = 64;

/// Shared by the cache and every buffer it made: buffers reach it from [`Buf::write`].
#[derive(Default)]
pub(crate) struct UndoShared {
    /// The open scope's number; 0 when none is open.
    scope: AtomicU64,
    log: Mutex<UndoLog>,
}

/// What the open scope has recorded.
#[derive(Default)]
pub(crate) struct UndoLog {
    /// The last scope opened (the open one, while one is).
    pub next_scope: u64,
    /// Before-images in the order they were taken: the bytes a change was about to
    /// overwrite (the whole block for [`Buf::write`], a range for [`Buf::write_range`]),
    /// or "absent" for a buffer the scope created. Applied newest first, they turn a
    /// buffer's contents back into its contents at the start of the scope.
    pub saved: Vec<Saved>,
    /// Buffers `invalidate` dropped in the scope, with their dirty flag: a rollback puts
    /// them back (the free that dropped them is taken back too).
    pub detached: Vec<(BufRef, bool)>,
    /// Every device write the cache issued in the scope (one per cluster), with its image
    /// and the flush epoch it belongs to.
    pub writes: Vec<Written>,
    /// Flushes issued in the scope so far: writes of one epoch may reach the media in any
    /// order, writes of an earlier epoch are durable before any of a later one.
    pub epoch: u32,
    spare: Vec<Vec<u8>>,
}

/// Bytes of a buffer before a change, with the buffer's state then.
pub(crate) struct Saved {
    pub blkno: BlockNo,
    pub kind: u8,
    pub dirty: bool,
    /// Where `image` goes in the block.
    pub at: usize,
    /// `None`: the buffer was created by the scope (`get_new` of an uncached block).
    pub image: Option<Vec<u8>>,
}

/// One device write of a cluster in the scope.
pub(crate) struct Written {
    pub epoch: u32,
    pub first: BlockNo,
    pub image: Vec<u8>,
}

/// A block the scope changed, as a rollback sees it.
pub(crate) struct Changed<'a> {
    pub blkno: BlockNo,
    /// At the start of the scope the cache held no buffer for the block.
    pub absent: bool,
    pub kind: u8,
    pub dirty: bool,
    /// The before-images of the buffer the block had at the start, oldest first.
    pub saves: Vec<(usize, &'a [u8])>,
}

/// The device writes of one epoch of a rollback: blocks and their images.
pub(crate) type Epoch = Vec<(BlockNo, Vec<u8>)>;

/// The device writes of a rollback, one entry per epoch in the order to write them, each
/// followed by a flush.
pub(crate) type Replay = Vec<Epoch>;

impl UndoShared {
    /// The open scope's number, 0 if none.
    pub fn scope(&self) -> u64 {
        self.scope.load(Ordering::Acquire)
    }

    /// Opens a scope; false if one is already open.
    pub fn begin(&self) -> bool {
        let mut log = self.log.lock();
        if self.scope() != 0 {
            return false;
        }
        log.next_scope += 1;
        log.epoch = 0;
        self.scope.store(log.next_scope, Ordering::Release);
        true
    }

    /// Closes the scope, keeping its changes: the log is emptied in place.
    pub fn commit(&self) {
        let mut log = self.log.lock();
        self.scope.store(0, Ordering::Release);
        let UndoLog {
            saved,
            detached,
            writes,
            spare,
            ..
        } = &mut *log;
        for s in saved.drain(..) {
            if let Some(v) = s.image
                && spare.len() < SPARE_IMAGES
            {
                spare.push(v);
            }
        }
        detached.clear();
        writes.clear();
    }

    /// The buffers the open scope changed or dropped (the current buffer of every block it
    /// saved a before-image of is looked up by the caller), for a rollback to lock first.
    pub fn touched(&self) -> (Vec<BlockNo>, Vec<BufRef>) {
        let log = self.log.lock();
        let blks = log.saved.iter().map(|s| s.blkno).collect();
        let detached = log.detached.iter().map(|(b, _)| BufRef::clone(b)).collect();
        (blks, detached)
    }

    /// Closes the scope and hands its log over for a rollback.
    pub fn take(&self) -> UndoLog {
        let mut log = self.log.lock();
        self.scope.store(0, Ordering::Release);
        UndoLog {
            next_scope: log.next_scope,
            saved: std::mem::take(&mut log.saved),
            detached: std::mem::take(&mut log.detached),
            writes: std::mem::take(&mut log.writes),
            epoch: 0,
            spare: Vec::new(),
        }
    }

    /// Records the bytes `contents` hold at `at` in `buf` before a change (`None`: the scope
    /// created the buffer).
    pub fn save(&self, buf: &Buf, at: usize, contents: Option<&[u8]>) {
        let mut log = self.log.lock();
        let image = contents.map(|c| {
            let mut v = log.spare.pop().unwrap_or_default();
            v.clear();
            v.extend_from_slice(c);
            v
        });
        log.saved.push(Saved {
            blkno: buf.blkno(),
            kind: buf.kind(),
            dirty: buf.is_dirty(),
            at,
            image,
        });
    }

    pub fn note_detached(&self, buf: BufRef, dirty: bool) {
        if self.scope() != 0 {
            self.log.lock().detached.push((buf, dirty));
        }
    }

    /// Keeps the image of a device write made in the scope (the write may have failed: a
    /// device may still have stored part of it).
    pub fn note_write(&self, first: BlockNo, image: Vec<u8>) {
        if self.scope() != 0 {
            let mut log = self.log.lock();
            let epoch = log.epoch;
            log.writes.push(Written {
                epoch,
                first,
                image,
            });
        }
    }

    pub fn note_flush(&self) {
        if self.scope() != 0 {
            self.log.lock().epoch += 1;
        }
    }
}

impl UndoLog {
    /// The blocks the scope changed, in the order it first changed them. A block whose
    /// buffer the scope invalidated and then created anew keeps only the saves of its
    /// first buffer (the later buffer is dropped by the rollback).
    pub fn changed(&self) -> Vec<Changed<'_>> {
        let mut order: Vec<Changed<'_>> = Vec::new();
        let mut index: HashMap<BlockNo, (usize, bool)> = HashMap::new();
        for s in &self.saved {
            match index.get_mut(&s.blkno) {
                None => {
                    index.insert(s.blkno, (order.len(), s.image.is_none()));
                    order.push(Changed {
                        blkno: s.blkno,
                        absent: s.image.is_none(),
                        kind: s.kind,
                        dirty: s.dirty,
                        saves: s.image.iter().map(|i| (s.at, i.as_slice())).collect(),
                    });
                }
                Some((i, closed)) => {
                    match &s.image {
                        Some(img) if !*closed => order[*i].saves.push((s.at, img)),
                        // A new buffer for the block: what follows is not the first one's.
                        None => *closed = true,
                        Some(_) => {}
                    }
                }
            }
        }
        order
    }

    /// The device half of a rollback, given every changed block's contents at the start of
    /// the scope (`None`: the scope created the block's buffer). The scope's writes took
    /// the device through states D_0 → D_1 → … → D_n, one per flush epoch, each a state the
    /// operation's own ordering made safe to crash in. The replay walks them backwards: for
    /// epochs n down to 1 it rewrites every block the epoch wrote with the image that block
    /// had in D_(epoch-1) (the last image written in an earlier epoch, or the contents at
    /// the start of the scope if the scope had not written it before), and flushes. A
    /// crash during reverse epoch e leaves D_e with some of its blocks back at their
    /// D_(e-1) images: exactly the states a crash during the forward epoch e could leave.
    /// So the rollback is as crash-safe as the operation was.
    ///
    /// Blocks the scope wrote without changing them (write-back of older dirty buffers)
    /// are left alone: their image is their current, committed contents. Blocks whose
    /// buffer the scope created are not rewritten in the epoch that first wrote them (the
    /// caller allocated them in the scope and frees them again; their contents no longer
    /// matter).
    ///
    /// The start contents of a block that was dirty when the scope began hold older
    /// delayed changes that were not on the device. Writing them in reverse epoch e lands
    /// those changes where the forward epoch e landed them too (the forward image carried
    /// them), so their own ordering preconditions already held on the device at that point.
    pub fn replay(&self, start: &HashMap<BlockNo, Option<Vec<u8>>>, block_size: usize) -> Replay {
        if self.writes.is_empty() || block_size == 0 {
            return Vec::new();
        }
        // Per changed block, its writes in order: (epoch, image).
        let mut per_block: HashMap<BlockNo, Vec<(u32, &[u8])>> = HashMap::new();
        for w in &self.writes {
            for (i, img) in w.image.chunks_exact(block_size).enumerate() {
                let b = w.first + i as u64;
                if start.contains_key(&b) {
                    per_block.entry(b).or_default().push((w.epoch, img));
                }
            }
        }
        let mut by_epoch: BTreeMap<u32, Vec<(BlockNo, Vec<u8>)>> = BTreeMap::new();
        let mut blocks: Vec<_> = per_block.into_iter().collect();
        blocks.sort_by_key(|(b, _)| *b);
        for (b, recs) in blocks {
            // The image in force before each epoch that wrote the block.
            let mut prior: Option<&[u8]> = start[&b].as_deref();
            let mut i = 0;
            while i < recs.len() {
                let e = recs[i].0;
                if let Some(img) = prior {
                    by_epoch.entry(e).or_default().push((b, img.to_vec()));
                }
                while i < recs.len() && recs[i].0 == e {
                    i += 1;
                }
                prior = Some(recs[i - 1].1);
            }
        }
        by_epoch.into_values().rev().collect()
    }
}
