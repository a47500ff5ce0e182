//! Segments held by device reads made outside the engine's lock.
//!
//! A file read resolves its block addresses under the engine's lock and reads the device
//! without it (`Lfs::read`); a background cleaning pass reads its victims the same way. In
//! between, another call may run a checkpoint that turns a segment clean, and the log may
//! then write over it: a read in flight would return blocks of the segment's next life. So
//! a read pins, under the lock, every segment it will read, and unpins once the device has
//! answered; [`Usage::release_empty`](super::Usage::release_empty) is only ever asked to
//! release segments no read holds (`State::release_checkpointed`), and a pinned one stays
//! dirty — with no live bytes, so the next checkpoint releases it. Nothing waits: a read
//! never needs the engine's lock to finish, and a checkpoint never waits for a read.
//!
//! Invariants:
//! - a pin is taken only while the engine's lock is held (so a checkpoint, which holds the
//!   lock, sees every read that could still touch a segment it frees);
//! - a segment with a pin is not released; the log writes only its head and segments it
//!   took clean, so the blocks a pinned read asks for are the ones its plan named;
//! - every pin is dropped (by [`Pinned`]'s `Drop`), whatever the read's outcome.

use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_bufcache::BufferCache;
use cairn_vfs::Result;
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;

use crate::format::BLOCK_SIZE;

/// Read pins per segment.
#[derive(Default)]
pub(crate) struct ReadGate {
    pins: Mutex<HashMap<u32, u32>>,
}

impl ReadGate {
    /// Pins `segs` (each once, duplicates allowed) until the returned guard drops. Called
    /// with the engine's lock held.
    pub fn pin(self: &Arc<Self>, mut segs: Vec<u32>) -> Pinned {
        segs.sort_unstable();
        segs.dedup();
        let mut p = self.pins.lock();
        for &s in &segs {
            *p.entry(s).or_insert(0) += 1;
        }
        Pinned {
            gate: Arc::clone(self),
            segs,
        }
    }

    /// The pins on segment `s` (a pass that pins its own victims asks whether anyone
    /// else does).
    pub fn pins(&self, s: u32) -> u32 {
        self.pins.lock().get(&s).copied().unwrap_or(0)
    }

    /// Is a read in flight in segment `s`?
    pub fn pinned(&self, s: u32) -> bool {
        self.pins(s) > 0
    }
}

/// Segments pinned by one read; dropping it unpins them.
pub(crate) struct Pinned {
    gate: Arc<ReadGate>,
    segs: Vec<u32>,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mut p = self.gate.pins.lock();
        for s in &self.segs {
            if let Some(n) = p.get_mut(s) {
                *n -= 1;
                if *n == 0 {
                    p.remove(s);
                }
            }
        }
    }
}

/// A file read planned under the engine's lock (`State::plan_read`), to finish without it.
pub(crate) struct ReadPlan {
    /// The reply: what memory held is in place, the runs' blocks are zeros until read.
    pub(crate) out: Vec<u8>,
    pub(crate) runs: Vec<Run>,
    /// Read-ahead addresses not cached, to read into the cache.
    pub(crate) ahead: Vec<u64>,
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) cache: Arc<BufferCache>,
    /// The segments of `runs` and `ahead`, held until the device has answered.
    pub(crate) _pin: Option<Pinned>,
}

/// Blocks of a reply read with one device read: `addrs` (ascending, each at most
/// `MAX_READ_GAP` after the one before) go to `out[at..]` in order.
pub(crate) struct Run {
    pub(crate) at: usize,
    pub(crate) addrs: Vec<u64>,
}

impl Run {
    /// Blocks the device read covers: the run's own and the gaps between them.
    pub(crate) fn span(&self) -> u64 {
        match (self.addrs.first(), self.addrs.last()) {
            (Some(&f), Some(&l)) => l - f + 1,
            _ => 0,
        }
    }
}

impl ReadPlan {
    /// The device reads, without the engine's lock: each run into its place in the reply
    /// (a run with gaps through one buffer, its blocks then copied to their places), the
    /// read-ahead window into the cache. The pins drop when this returns.
    pub(crate) fn read(mut self) -> Result<Vec<u8>> {
        let mut scratch = Vec::new();
        for r in &self.runs {
            let (Some(&first), n) = (r.addrs.first(), r.addrs.len()) else {
                continue;
            };
            let span = r.span() as usize;
            if span == n {
                self.dev
                    .read_blocks(first, &mut self.out[r.at..r.at + n * BLOCK_SIZE])?;
                continue;
            }
            scratch.resize(span * BLOCK_SIZE, 0);
            self.dev.read_blocks(first, &mut scratch)?;
            for (k, &a) in r.addrs.iter().enumerate() {
                let from = (a - first) as usize * BLOCK_SIZE;
                let to = r.at + k * BLOCK_SIZE;
                self.out[to..to + BLOCK_SIZE].copy_from_slice(&scratch[from..from + BLOCK_SIZE]);
            }
        }
        prefetch(&self.cache, &mut self.ahead)?;
        Ok(std::mem::take(&mut self.out))
    }
}

/// Reads into `cache`, with as few device reads as possible, every uncached block at
/// `addrs` (in any order, all in the log): each run of consecutive addresses is one device
/// read (up to the cache's largest cluster). A run goes on across a one-block gap — the
/// summary block between two partial segments of a file written sequentially — which is
/// read and cached with it: one block more, one device read fewer.
pub(crate) fn prefetch(cache: &BufferCache, addrs: &mut Vec<u64>) -> Result<()> {
    addrs.sort_unstable();
    addrs.dedup();
    let mut i = 0;
    while i < addrs.len() {
        let mut j = i + 1;
        while j < addrs.len() && addrs[j] <= addrs[j - 1] + 2 {
            j += 1;
        }
        cache.prefetch(addrs[i], addrs[j - 1] - addrs[i] + 1)?;
        i = j;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_count_and_drop() {
        let g = Arc::new(ReadGate::default());
        let a = g.pin(vec![3, 5, 3]);
        let b = g.pin(vec![5]);
        assert!(g.pinned(3) && g.pinned(5) && !g.pinned(4));
        drop(a);
        assert!(!g.pinned(3) && g.pinned(5));
        drop(b);
        assert!(!g.pinned(5));
    }
}
