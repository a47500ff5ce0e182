//! cairn's stand-alone write-ahead log service: the WAFS of the journaling paper (001 §5.2),
//! "a simple, free-standing file system that supports a limited number of operations: it can
//! be mounted and unmounted, it can append data, and it can return data by sequential or keyed
//! reads. The keys for keyed reads are log-sequence-numbers (LSNs), which correspond to
//! logical offsets in the log."
//!
//! It knows nothing of file systems: a client (cairn's FFS in `mode=journal`, later) appends
//! opaque records and gets back their [`Lsn`]s, forces the log up to an LSN before it writes
//! a block a record describes (write-ahead), and moves the checkpoint when it has written
//! everything older records describe, which releases their space.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use cairn_wal::{Wal, Region, FormatOptions};
//! # fn main() -> Result<(), cairn_wal::WalError> {
//! let dev: Arc<dyn cairn_blockdev::BlockDevice> = Arc::new(cairn_blockdev::MemDevice::new(4096, 256));
//! let region = Region::whole(&*dev);
//! Wal::format(&*dev, region, &FormatOptions::default())?;
//! let wal = Wal::open(dev, region)?;
//! let lsn = wal.append(b"create /a inode 12")?;
//! wal.force(lsn)?; // durable: the block it describes may now be written
//! for rec in wal.scan(wal.checkpoint()) {
//!     let rec = rec?;
//!     println!("{} {:?}", rec.lsn, rec.data);
//! }
//! wal.set_checkpoint(wal.end())?; // everything applied: release it
//! # Ok(()) }
//! ```
//!
//! # Where a log lives
//!
//! On any [`cairn_blockdev::BlockDevice`], in a [`Region`]: a whole image file, a second image
//! or loop device (LFFS-wafs with its own disk), or a reserved run of blocks of the file
//! system's own device (a log inside the file system, LFFS-file). The log writes only inside
//! its region, in whole blocks of the device's block size; a client sharing the device must
//! keep its own writes out of the region.
//!
//! # Guarantees
//!
//! - [`Wal::append`] never overwrites a record the checkpoint has not released; when a
//!   record does not fit it returns [`WalError::Full`] and the client checkpoints.
//! - When [`Wal::force`]`(lsn)` returns, every record with an LSN ≤ `lsn` is durable.
//! - After a crash, opening the log recovers a prefix of the records appended since the
//!   durable checkpoint that contains every forced record, and nothing after a record that
//!   did not land whole (001 §5.3). `docs/FORMAT.md` has the format, `docs/DESIGN.md` the
//!   argument and the device assumptions it rests on.
//! - Many threads forcing at once share one device flush (group commit, [`GroupWait`]).
//!
//! Hostile input — a region too small, holding something else, or a corrupt log — is refused
//! with a one-line [`WalError`]; nothing here panics on the contents of a device.

mod error;
pub mod format;
pub mod fuzz;
mod plant;
pub mod recover;
mod region;
mod stats;
mod wal;

#[cfg(test)]
mod tests;

pub use error::WalError;
pub use recover::{End, Recovery};
pub use region::Region;
pub use stats::{GROUP_BUCKETS, WalStats};
pub use wal::{
    FormatOptions, GroupWait, LowSpaceFn, Options, Record, Scan, Space, Wal, read_superblocks,
};

/// A log sequence number: the logical byte offset of a record in the log. LSNs only grow
/// and are never reused; 0 is never a record's (a new log starts at its capacity).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Lsn(pub u64);

impl std::fmt::Display for Lsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}
