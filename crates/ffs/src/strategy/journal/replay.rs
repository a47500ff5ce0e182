//! Recovery's redo pass (001 §5.3): from the log's records since the checkpoint, the
//! complete operations' updates, applied in log order onto the file system's blocks.
//!
//! Why redo alone suffices (no undo pass): a block's home location is written only after
//! the log is forced up to the block's high LSN (`before_write`), and the journal notes on
//! a buffer the LSN of its operation's END record — so no change of an operation whose END
//! record is not durable ever reaches its home location. (The engine calls the strategy
//! under its lock from `begin_op` to `end_op` and defers eviction to it, so no write of a
//! buffer happens between a change and the logging of it at `end_op`.) What an incomplete
//! operation changed is therefore nowhere on disk, and forgetting its records is its undo.
//!
//! Why replaying is idempotent: every update is absolute bytes, applied in log order, so
//! replaying again (a crash during recovery) gives the same blocks. A block is skipped for
//! every update logged before a revoke of it: it was freed, and may since hold data the
//! log never describes.

use std::collections::{BTreeMap, HashMap};

use cairn_blockdev::BlockDevice;

use super::record::{Chunk, Entry};

/// What a replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    pub records: u64,
    /// Operations replayed (their END record found).
    pub ops: u64,
    /// Records of an operation whose END record is missing: not replayed.
    pub partial_records: u64,
    pub updates: u64,
    /// Updates not replayed because a later revoke freed their block.
    pub revoked: u64,
    /// Blocks written.
    pub blocks: u64,
}

/// What a replay leaves for the mount: the inodes whose link count reached 0 and that were
/// not freed before the crash (the mount frees them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    pub stats: ReplayStats,
    pub orphans: Vec<u64>,
}

/// The complete operations of `records` (each `(lsn, payload)`, in log order), flattened:
/// every entry of a complete operation, in order.
fn complete_entries(
    records: impl IntoIterator<Item = (u64, Vec<u8>)>,
    st: &mut ReplayStats,
) -> Result<Vec<Entry>, String> {
    let mut done = Vec::new();
    let mut pending: Option<(u64, Vec<Entry>, u64)> = None; // (op, entries, records)
    for (lsn, payload) in records {
        st.records += 1;
        let c = Chunk::decode(&payload).map_err(|e| format!("log record at LSN {lsn}: {e}"))?;
        match &mut pending {
            Some((op, entries, n)) if *op == c.op => {
                entries.extend(c.entries);
                *n += 1;
            }
            _ => {
                // A record of another operation before the END of the one pending: that
                // one was cut short by a crash (its later records never landed), and a
                // later mount appended after it. Forget it.
                if let Some((_, _, n)) = pending.take() {
                    st.partial_records += n;
                }
                pending = Some((c.op, c.entries, 1));
            }
        }
        if c.end
            && let Some((_, entries, _)) = pending.take()
        {
            st.ops += 1;
            done.extend(entries);
        }
    }
    if let Some((_, _, n)) = pending {
        st.partial_records += n;
    }
    Ok(done)
}

/// Replays `records` onto `dev` and flushes it. Every block and range is checked against
/// the device before anything is written: a record naming a block outside the file system
/// refuses the whole replay with one line.
pub fn replay(
    dev: &dyn BlockDevice,
    records: impl IntoIterator<Item = (u64, Vec<u8>)>,
) -> Result<Replayed, String> {
    replay_with(dev, records, true)
}

/// [`replay`], skipping revoked updates only when `revokes` (false: the crash harness's
/// planted bug, `Journal::plant_ignore_revoke`).
pub(crate) fn replay_with(
    dev: &dyn BlockDevice,
    records: impl IntoIterator<Item = (u64, Vec<u8>)>,
    revokes: bool,
) -> Result<Replayed, String> {
    let mut st = ReplayStats::default();
    let entries = complete_entries(records, &mut st)?;
    let bs = dev.block_size() as usize;
    // The position of the last revoke of each block.
    let mut last_revoke: HashMap<u64, usize> = HashMap::new();
    let mut orphans = std::collections::BTreeSet::new();
    for (i, e) in entries.iter().enumerate() {
        match e {
            Entry::Orphan { ino } => {
                orphans.insert(*ino);
            }
            Entry::OrphanGone { ino } => {
                orphans.remove(ino);
            }
            Entry::Revoke { block } if revokes => {
                last_revoke.insert(*block, i);
            }
            Entry::Revoke { .. } => {}
            Entry::Update {
                block,
                offset,
                data,
            } => {
                if *block >= dev.num_blocks() || (*offset as usize).saturating_add(data.len()) > bs
                {
                    return Err(format!(
                        "log record updates bytes {}..+{} of block {block}, outside the file system",
                        offset,
                        data.len()
                    ));
                }
            }
        }
    }
    let mut blocks: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        let Entry::Update {
            block,
            offset,
            data,
        } = e
        else {
            continue;
        };
        if last_revoke.get(block).is_some_and(|&r| r > i) {
            st.revoked += 1;
            continue;
        }
        st.updates += 1;
        let img = match blocks.entry(*block) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let mut b = vec![0u8; bs];
                dev.read_blocks(*block, &mut b)
                    .map_err(|e| format!("cannot read block {block} to replay the log: {e}"))?;
                v.insert(b)
            }
        };
        let o = *offset as usize;
        img[o..o + data.len()].copy_from_slice(data);
    }
    for (blk, img) in &blocks {
        dev.write_blocks(*blk, img)
            .map_err(|e| format!("cannot write block {blk} while replaying the log: {e}"))?;
        st.blocks += 1;
    }
    if !blocks.is_empty() {
        dev.flush()
            .map_err(|e| format!("cannot flush after replaying the log: {e}"))?;
    }
    Ok(Replayed {
        stats: st,
        orphans: orphans.into_iter().collect(),
    })
}

/// A device showing `base` as a replay would leave it, without writing `base`: the replay's
/// writes land in memory (a read-only mount, `cairn fsck` without `-y`). Reads of blocks the
/// replay wrote come from memory, the rest from `base`; the counters and trace are `base`'s.
pub struct ReplayView {
    base: std::sync::Arc<dyn BlockDevice>,
    blocks: parking_lot::RwLock<HashMap<u64, Box<[u8]>>>,
}

impl ReplayView {
    pub fn new(base: std::sync::Arc<dyn BlockDevice>) -> ReplayView {
        ReplayView {
            base,
            blocks: parking_lot::RwLock::new(HashMap::new()),
        }
    }

    /// How many blocks the replay changed.
    pub fn changed(&self) -> usize {
        self.blocks.read().len()
    }
}

impl BlockDevice for ReplayView {
    fn block_size(&self) -> u32 {
        self.base.block_size()
    }

    fn num_blocks(&self) -> u64 {
        self.base.num_blocks()
    }

    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.base.read_blocks(block, buf)?;
        let bs = self.base.block_size() as usize;
        let map = self.blocks.read();
        if !map.is_empty() {
            for (i, out) in buf.chunks_exact_mut(bs).enumerate() {
                if let Some(d) = map.get(&(block + i as u64)) {
                    out.copy_from_slice(d);
                }
            }
        }
        Ok(())
    }

    fn write_blocks(&self, block: u64, buf: &[u8]) -> std::io::Result<()> {
        let bs = self.base.block_size() as usize;
        if bs == 0 || !buf.len().is_multiple_of(bs) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "transfer is not a multiple of the block size",
            ));
        }
        let n = (buf.len() / bs) as u64;
        if block
            .checked_add(n)
            .is_none_or(|end| end > self.num_blocks())
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("blocks {block}..+{n} out of range"),
            ));
        }
        let mut map = self.blocks.write();
        for (i, d) in buf.chunks_exact(bs).enumerate() {
            map.insert(block + i as u64, Box::from(d));
        }
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn counters(&self) -> &cairn_blockdev::DeviceCounters {
        self.base.counters()
    }

    fn set_trace(&self, sink: Option<std::sync::Arc<dyn cairn_blockdev::TraceSink>>) {
        self.base.set_trace(sink);
    }
}

#[cfg(test)]
mod tests {
    use cairn_blockdev::MemDevice;

    use super::super::record::split;
    use super::*;

    fn upd(block: u64, offset: u32, data: &[u8]) -> Entry {
        Entry::Update {
            block,
            offset,
            data: data.to_vec(),
        }
    }

    fn recs(ops: Vec<(u64, Vec<Entry>)>, limit: usize) -> Vec<(u64, Vec<u8>)> {
        let mut lsn = 100;
        let mut out = Vec::new();
        for (op, e) in ops {
            for p in split(op, e, limit) {
                out.push((lsn, p));
                lsn += 10;
            }
        }
        out
    }

    fn block(dev: &MemDevice, b: u64) -> Vec<u8> {
        let mut v = vec![0u8; 512];
        dev.read_blocks(b, &mut v).unwrap();
        v
    }

    #[test]
    fn replays_complete_operations_in_order_and_is_idempotent() {
        let dev = MemDevice::new(512, 16);
        let r = recs(
            vec![
                (1, vec![upd(3, 0, b"aaaa"), upd(4, 10, b"x")]),
                (2, vec![upd(3, 2, b"bb")]),
            ],
            1 << 16,
        );
        let s = replay(&dev, r.clone()).unwrap().stats;
        assert_eq!((s.ops, s.updates, s.blocks), (2, 3, 2));
        let b3 = block(&dev, 3);
        assert_eq!(&b3[..4], b"aabb");
        assert_eq!(block(&dev, 4)[10], b'x');
        // Again (a crash during recovery): the same blocks.
        let before = dev.to_bytes();
        replay(&dev, r).unwrap();
        assert_eq!(dev.to_bytes(), before);
    }

    #[test]
    fn an_operation_without_its_end_record_is_not_replayed() {
        let dev = MemDevice::new(512, 16);
        let mut r = recs(
            vec![
                (1, vec![upd(3, 0, b"ok")]),
                (2, vec![upd(5, 0, b"p1"), upd(6, 0, b"p2")]),
            ],
            40, // one entry per record: op 2 spans two
        );
        r.pop(); // op 2's END record never landed
        let s = replay(&dev, r.clone()).unwrap().stats;
        assert_eq!((s.ops, s.partial_records), (1, 1));
        assert_eq!(&block(&dev, 3)[..2], b"ok");
        assert_eq!(&block(&dev, 5)[..2], &[0, 0]);
        // A later mount's operation after the cut-short one: still not replayed.
        r.extend(recs(vec![(9, vec![upd(7, 0, b"n")])], 1 << 16));
        let s = replay(&dev, r).unwrap().stats;
        assert_eq!((s.ops, s.partial_records), (2, 1));
        assert_eq!(&block(&dev, 5)[..2], &[0, 0]);
        assert_eq!(block(&dev, 7)[0], b'n');
    }

    #[test]
    fn a_revoke_hides_earlier_updates_of_its_block_only() {
        let dev = MemDevice::new(512, 16);
        dev.write_blocks(3, &[7u8; 512]).unwrap(); // a data block's new contents
        let r = recs(
            vec![
                (1, vec![upd(3, 0, b"dir!"), upd(4, 0, b"keep")]),
                (2, vec![Entry::Revoke { block: 3 }]),
            ],
            1 << 16,
        );
        let s = replay(&dev, r).unwrap().stats;
        assert_eq!(s.revoked, 1);
        assert_eq!(block(&dev, 3), vec![7u8; 512]);
        assert_eq!(&block(&dev, 4)[..4], b"keep");
        // Reallocated as metadata after the revoke: replayed.
        let r = recs(
            vec![
                (1, vec![Entry::Revoke { block: 3 }]),
                (2, vec![upd(3, 0, b"new!")]),
            ],
            1 << 16,
        );
        replay(&dev, r).unwrap();
        assert_eq!(&block(&dev, 3)[..4], b"new!");
    }

    #[test]
    fn orphans_are_those_not_gone_by_the_end() {
        let dev = MemDevice::new(512, 16);
        let r = recs(
            vec![
                (1, vec![Entry::Orphan { ino: 5 }, Entry::Orphan { ino: 6 }]),
                (2, vec![Entry::OrphanGone { ino: 5 }]),
                (3, vec![Entry::Orphan { ino: 7 }]),
            ],
            1 << 16,
        );
        let mut cut = r.clone();
        cut.pop();
        assert_eq!(replay(&dev, r).unwrap().orphans, vec![6, 7]);
        assert_eq!(replay(&dev, cut).unwrap().orphans, vec![6]);
    }

    #[test]
    fn a_record_outside_the_file_system_is_refused_before_any_write() {
        let dev = MemDevice::new(512, 16);
        let r = recs(vec![(1, vec![upd(3, 0, b"a"), upd(16, 0, b"b")])], 1 << 16);
        assert!(replay(&dev, r).unwrap_err().contains("outside"));
        assert_eq!(block(&dev, 3)[0], 0);
        let r = recs(vec![(1, vec![upd(3, 510, b"abc")])], 1 << 16);
        assert!(replay(&dev, r).is_err());
        assert!(replay(&dev, vec![(5, b"garbage".to_vec())]).is_err());
    }
}
