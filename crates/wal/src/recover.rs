//! Finding the log's end (001 §5.3): "reading the log beginning with the last checkpoint and
//! reading sequentially until it locates the end of the log. Log entries are timestamped and
//! checksummed so that the log recovery daemon can easily detect when the end of the log is
//! reached."
//!
//! The superblock names the checkpoint; the scan reads records from it and stops at the first
//! position that does not hold the next record of this log. A record is the next one only if
//! all of these hold, checked from the cheapest to the one that needs the payload:
//!
//! 1. its header has the magic (else: never-written space, or garbage);
//! 2. it names its own position as its LSN (else: a record of an earlier lap of the circular
//!    log, whose LSN is smaller by a multiple of the capacity, or garbage);
//! 3. its epoch is the superblock's epoch if it lies at or after the superblock's
//!    `epoch_start` (where the last read-write open began appending), an earlier one if it
//!    lies before, and never less than the previous record's — else it is a *ghost*: a record
//!    an earlier open wrote past the end a later open recovered, which the later open's
//!    records have since partly overwritten, or which a torn write of the later open has
//!    completed from its fragments (see `Wal::open_with`);
//! 4. it ends within one lap of the checkpoint's block (else: an impossible length);
//! 5. its checksum (seeded with the log's uuid) matches header and payload — else it is torn
//!    (a write that did not land whole), corrupt, or a record of an earlier log on this device.
//!
//! Nothing after the first failure is looked at: the records after a torn one were not
//! forced (a force makes every earlier record durable first), so they are not part of the
//! log, and a valid-looking record there may be a ghost.

use std::io;

use cairn_blockdev::BlockDevice;
use serde::{Deserialize, Serialize};

use crate::format::{HeaderError, REC_HEADER, RecordHeader, Superblock};
use crate::plant::{self, Plant};
use crate::region::{Geometry, Window};

/// Why the scan stopped: what lies at the log's end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum End {
    /// Zeros: space never written since the log was made (or zeroed by `cairn wal mkfs`).
    Unwritten,
    /// Bytes that are not a record header.
    Garbage,
    /// A record header from an earlier lap of the circular log (its LSN is `found`).
    EarlierLap { found: u64 },
    /// A record header naming an LSN that cannot be here (`found`): garbage.
    WrongLsn { found: u64 },
    /// A record an earlier open wrote beyond the end a later open recovered (a ghost).
    EarlierOpen { epoch: u32, least: u32 },
    /// A record claiming an epoch it cannot have here: one no open has had yet, or the
    /// current open's before the place it began appending. Garbage.
    ImpossibleEpoch { epoch: u32 },
    /// A record longer than the log can hold from this position.
    BadLength { len: u32 },
    /// A record whose checksum fails: torn by a crash, or corrupt.
    Torn,
    /// The log is full: the next record would reach the checkpoint's block.
    Full,
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Unwritten => write!(f, "unwritten space"),
            End::Garbage => write!(f, "not a record header"),
            End::EarlierLap { found } => write!(f, "a record of an earlier lap (LSN {found})"),
            End::WrongLsn { found } => write!(f, "a header naming LSN {found}: garbage"),
            End::EarlierOpen { epoch, least } => write!(
                f,
                "a stale record of epoch {epoch} where epoch {least} or later is due"
            ),
            End::ImpossibleEpoch { epoch } => {
                write!(f, "a record of epoch {epoch}, impossible here: garbage")
            }
            End::BadLength { len } => write!(f, "a record of impossible length {len}"),
            End::Torn => write!(f, "a torn or corrupt record (checksum mismatch)"),
            End::Full => write!(f, "the log is full up to its checkpoint"),
        }
    }
}

/// What the scan of a log found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// Where the scan started: the superblock's checkpoint.
    pub checkpoint: u64,
    /// The log's end: the LSN after the last record found.
    pub end: u64,
    /// Records between checkpoint and end.
    pub records: u64,
    /// Why the scan stopped at `end`.
    pub stop: End,
}

/// Scans from `sb`'s checkpoint; `visit(lsn, epoch, payload)` sees every record found.
pub(crate) fn scan(
    dev: &dyn BlockDevice,
    geo: Geometry,
    sb: &Superblock,
    mut visit: impl FnMut(u64, u32, &[u8]),
) -> io::Result<Recovery> {
    let ckpt = sb.checkpoint;
    let mut win = Window::new(dev, geo);
    let mut pos = ckpt;
    let mut prev = 0;
    let mut records = 0;
    let stop = loop {
        if geo.span(ckpt, pos + REC_HEADER as u64) > geo.capacity {
            break End::Full;
        }
        let head = win.get(pos, REC_HEADER as u64)?;
        let h = match RecordHeader::decode(head) {
            Ok(h) => h,
            Err(HeaderError::Zero) => break End::Unwritten,
            Err(HeaderError::NoMagic) => break End::Garbage,
        };
        if h.lsn != pos {
            if h.lsn < pos && (pos - h.lsn).is_multiple_of(geo.capacity) {
                break End::EarlierLap { found: h.lsn };
            }
            break End::WrongLsn { found: h.lsn };
        }
        if !plant::on(Plant::NoEpochCheck) {
            let current = pos >= sb.epoch_start;
            let start = !plant::on(Plant::NoEpochStart);
            let least = if current && start { sb.epoch } else { prev };
            if h.epoch < least {
                break End::EarlierOpen {
                    epoch: h.epoch,
                    least,
                };
            }
            if h.epoch > sb.epoch || (!current && h.epoch == sb.epoch && start) {
                break End::ImpossibleEpoch { epoch: h.epoch };
            }
        }
        let size = h.size();
        if geo.span(ckpt, pos + size) > geo.capacity {
            break End::BadLength { len: h.len };
        }
        let whole = win.get(pos, REC_HEADER as u64 + u64::from(h.len))?;
        let payload = &whole[REC_HEADER..];
        if !h.crc_ok(&sb.uuid, whole, payload) && !plant::on(Plant::SkipChecksum) {
            if plant::on(Plant::ScanPastBad) {
                pos += size;
                continue;
            }
            break End::Torn;
        }
        visit(pos, h.epoch, payload);
        prev = h.epoch;
        records += 1;
        pos += size;
    };
    Ok(Recovery {
        checkpoint: ckpt,
        end: pos,
        records,
        stop,
    })
}
