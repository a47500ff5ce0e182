//! The log's errors: one enum, every message one line naming the problem.

use std::io;

use crate::Lsn;

/// What can go wrong with a log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// The device failed an operation.
    #[error("log device I/O error: {0}")]
    Io(#[from] io::Error),
    /// The region does not lie on the device (or is absurd).
    #[error("bad log region: {0}")]
    Region(String),
    /// The region cannot hold a log.
    #[error("log device too small: {bytes} bytes, a log needs at least {min}")]
    TooSmall { bytes: u64, min: u64 },
    /// The region holds no cairn log; `found` says what it holds when that is recognizable.
    #[error("not a cairn write-ahead log{}", found.as_ref().map(|f| format!(" (it holds {f})")).unwrap_or_default())]
    NotALog { found: Option<String> },
    /// The region holds a log this code refuses: damaged superblocks, a geometry that does not
    /// match the region or device, a newer version.
    #[error("unusable write-ahead log: {0}")]
    Corrupt(String),
    /// A log made for another client (its superblock names another owner).
    #[error("the write-ahead log belongs to another owner ({found}, expected {expected})")]
    WrongOwner { found: String, expected: String },
    /// The record does not fit in the space the checkpoint has released; a client turns this
    /// into "force a checkpoint" and appends again. Nothing was appended.
    #[error(
        "log full: a record of {needed} bytes does not fit in {free} free bytes (checkpoint to release space)"
    )]
    Full { needed: u64, free: u64 },
    /// The record can never fit, even in an empty log.
    #[error("record of {len} bytes is larger than the largest the log holds ({max})")]
    TooLarge { len: u64, max: u64 },
    /// No record has been appended at or after this LSN.
    #[error("LSN {0} has not been appended yet")]
    NotAppended(Lsn),
    /// The record was released by a checkpoint.
    #[error("LSN {lsn} was released by the checkpoint at {checkpoint}")]
    Released { lsn: Lsn, checkpoint: Lsn },
    /// No record starts at this LSN.
    #[error("no record starts at LSN {0}")]
    NotARecord(Lsn),
    /// A record inside the live log fails its checksum (media corruption after recovery).
    #[error("record at LSN {0} is corrupt (checksum mismatch)")]
    CorruptRecord(Lsn),
    /// An earlier device error left the log in an unknown state; it accepts no more writes.
    #[error("the log failed earlier and accepts no more writes: {0}")]
    Failed(String),
    /// The log was opened read-only.
    #[error("the log is open read-only")]
    ReadOnly,
}
