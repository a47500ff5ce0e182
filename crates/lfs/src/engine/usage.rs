//! The segment usage table (004 §3.6): per segment its live bytes, whether it holds log
//! data (dirty) and the age of its youngest block — what the cleaner's policy reads — and
//! where the table's own blocks were last written.
//!
//! Invariants:
//! - the clean count equals the entries not dirty (kept as entries change; checked
//!   against a scan in debug builds);
//! - a segment becomes clean only through [`Usage::release_empty`], which the engine calls
//!   once a checkpoint recording the segment empty is durable (or the planted bug that
//!   breaks exactly this rule);
//! - `addrs[i]` is where block `i` of the table was last written.

use crate::format::tables::{self, UsageEntry};
use crate::log::Segments;

/// The segment usage table in memory (004 §3.6), with the number of clean segments kept as
/// entries change. Every call asks how many segments are clean (should the cleaner start,
/// is there room for this write); counting them each time cost a scan of every entry per
/// call — 8,192 on a 4 GiB disk of 512 KiB segments, a fifth of the daemon's time in a
/// small-file create. Entries are read through `Deref` and changed only through
/// [`Usage::update`], which keeps the count right (checked against a scan in debug builds).
#[derive(Clone, Debug, Default)]
pub struct Usage {
    entries: Vec<UsageEntry>,
    clean: u32,
    /// Where each block of the table was last written (what a checkpoint names).
    addrs: Vec<u64>,
}

impl Usage {
    pub fn new(entries: Vec<UsageEntry>, addrs: Vec<u64>) -> Usage {
        let clean = entries.iter().filter(|u| !u.dirty).count() as u32;
        Usage {
            entries,
            clean,
            addrs,
        }
    }

    /// `bytes` more live in segment `s`, written at time `t` (its age, 004 §3.6).
    pub fn add_live(&mut self, s: u32, bytes: u32, t: u64) {
        self.update(s as usize, |u| {
            u.live_bytes = u.live_bytes.saturating_add(bytes);
            u.dirty = true;
            u.youngest = u.youngest.max(t);
        });
    }

    /// `bytes` of segment `s` died (nothing points to them any more).
    pub fn sub_live(&mut self, s: u32, bytes: u32) {
        self.update(s as usize, |u| {
            u.live_bytes = u.live_bytes.saturating_sub(bytes)
        });
    }

    /// Segments among `segs` with no live bytes, other than the log's `head` and `next`
    /// segment and those `held` by a read in flight, become clean: only once a checkpoint
    /// recording them so is durable. A held segment stays dirty with nothing live, for a
    /// later checkpoint to release (`readgate.rs`). Returns how many were held back.
    pub fn release_empty(
        &mut self,
        segs: impl IntoIterator<Item = u32>,
        head: u32,
        next: u32,
        held: impl Fn(u32) -> bool,
    ) -> u32 {
        let mut kept = 0;
        for seg in segs {
            let s = seg as usize;
            let empty = self
                .entries
                .get(s)
                .is_some_and(|u| u.dirty && u.live_bytes == 0);
            if !empty || seg == head || seg == next {
                continue;
            }
            if held(seg) {
                kept += 1;
                continue;
            }
            self.update(s, |u| {
                u.dirty = false;
                u.youngest = 0;
            });
        }
        kept
    }

    /// Segments holding log data with no live bytes (what a checkpoint taken now records
    /// as empty, and may release once durable).
    pub fn empty_segments(&self) -> Vec<u32> {
        (0..self.entries.len() as u32)
            .filter(|&s| {
                let u = &self.entries[s as usize];
                u.dirty && u.live_bytes == 0
            })
            .collect()
    }

    /// Where each block of the table was last written.
    pub fn block_addrs(&self) -> &[u64] {
        &self.addrs
    }

    /// Block `i` as the log stores it.
    pub fn encode_block(&self, i: u32) -> Vec<u8> {
        tables::encode_usage(i, &self.entries)
    }

    /// Block `i` was written at `addr`; returns where it was before (now dead).
    pub fn moved_block(&mut self, i: usize, addr: u64) -> u64 {
        match self.addrs.get_mut(i) {
            Some(a) => std::mem::replace(a, addr),
            None => 0,
        }
    }

    /// Changes segment `s`'s entry (nothing if there is no such segment).
    pub fn update<R>(&mut self, s: usize, f: impl FnOnce(&mut UsageEntry) -> R) -> Option<R> {
        let u = self.entries.get_mut(s)?;
        let was = u.dirty;
        let r = f(u);
        match (was, u.dirty) {
            (true, false) => self.clean += 1,
            (false, true) => self.clean -= 1,
            _ => {}
        }
        Some(r)
    }

    /// Marks segment `s` as holding (or about to hold) log data.
    pub fn set_dirty(&mut self, s: usize) {
        self.update(s, |u| u.dirty = true);
    }

    /// Segments holding nothing of the log.
    pub fn clean(&self) -> u32 {
        debug_assert_eq!(
            self.clean as usize,
            self.entries.iter().filter(|u| !u.dirty).count(),
            "the usage table's clean count drifted from its entries"
        );
        self.clean
    }
}

impl std::ops::Deref for Usage {
    type Target = [UsageEntry];
    fn deref(&self) -> &[UsageEntry] {
        &self.entries
    }
}

impl Segments for Usage {
    fn take_clean(&mut self, avoid: &[u32]) -> Option<u32> {
        let n = self.entries.len();
        let start = avoid.first().map_or(0, |&s| s as usize + 1);
        let s = (0..n)
            .map(|i| ((start + i) % n) as u32)
            .find(|s| !self.entries[*s as usize].dirty && !avoid.contains(s))?;
        self.set_dirty(s as usize);
        Some(s)
    }
}
