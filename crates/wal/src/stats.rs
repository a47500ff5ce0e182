//! The log's counters, as one serializable struct (`cairn stats` shows a journaled mount's).

use serde::{Deserialize, Serialize};

/// Upper bounds of the group-size histogram's buckets: 1, 2, 3–4, 5–8, 9–16, 17–32, 33–64,
/// and 65 or more.
pub const GROUP_BUCKETS: [u64; 8] = [1, 2, 4, 8, 16, 32, 64, u64::MAX];

/// A snapshot of a log's counters and space. Counts are since the log was opened.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WalStats {
    // Space.
    /// Bytes of the data area.
    pub capacity: u64,
    /// Bytes between the checkpoint and the end (headers and padding included).
    pub used_bytes: u64,
    /// The largest record (header included) that can be appended now.
    pub free_bytes: u64,
    /// LSN of the checkpoint: recovery starts here.
    pub checkpoint: u64,
    /// LSN the next record will get.
    pub end: u64,
    /// Every record starting below this LSN is durable.
    pub durable: u64,
    /// Bytes appended since the checkpoint (= `used_bytes`): what recovery would scan.
    pub checkpoint_lag: u64,
    /// This open's epoch.
    pub epoch: u32,

    // Appends.
    pub appends: u64,
    /// Payload bytes appended.
    pub append_bytes: u64,
    /// Log bytes appended (headers and padding included).
    pub record_bytes: u64,
    /// Appends refused because the log was full (the client should checkpoint).
    pub full_refusals: u64,

    // Forces and group commit.
    /// `force` calls.
    pub forces: u64,
    /// `force` calls that found their record durable already (no wait, no I/O).
    pub forces_already_durable: u64,
    /// Forces that made the device flush (one per commit group).
    pub groups: u64,
    /// Forcers served by those flushes, leader included (`group_members / groups` is the
    /// mean group size).
    pub group_members: u64,
    /// The largest group.
    pub group_max: u64,
    /// Groups by size, bucketed by [`GROUP_BUCKETS`].
    pub group_sizes: [u64; 8],
    /// Times a group's leader waited for more forcers before writing.
    pub leader_waits: u64,
    /// Total time leaders waited, in nanoseconds.
    pub leader_wait_ns: u64,
    /// The group-commit wait in force now (0: none), in nanoseconds.
    pub group_wait_ns: u64,
    /// Moving average of the device's flush time, in nanoseconds.
    pub flush_avg_ns: u64,

    // Device I/O issued by the log.
    /// Device flushes (forces, checkpoints, opens).
    pub flushes: u64,
    /// Device writes (log blocks and superblocks).
    pub writes: u64,
    /// Bytes those writes carried.
    pub bytes_written: u64,
    /// Writes of full log blocks ahead of any force (asynchronous logging).
    pub write_behinds: u64,
    /// Checkpoints taken (superblock writes that moved the checkpoint).
    pub checkpoints: u64,
}

impl WalStats {
    /// The bucket index of a group of `size` forcers.
    pub fn bucket(size: u64) -> usize {
        GROUP_BUCKETS
            .iter()
            .position(|&b| size <= b)
            .unwrap_or(GROUP_BUCKETS.len() - 1)
    }

    /// Mean forcers per flush.
    pub fn mean_group(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.group_members as f64 / self.groups as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        assert_eq!(WalStats::bucket(1), 0);
        assert_eq!(WalStats::bucket(2), 1);
        assert_eq!(WalStats::bucket(3), 2);
        assert_eq!(WalStats::bucket(4), 2);
        assert_eq!(WalStats::bucket(16), 4);
        assert_eq!(WalStats::bucket(17), 5);
        assert_eq!(WalStats::bucket(1000), 7);
    }
}
