//! The log's on-disk format: codecs only, no I/O. docs/FORMAT.md ("The write-ahead log")
//! has the same tables; the offset comments below mirror it.
//!
//! A log occupies a region of `region_blocks` blocks of a device (the whole device, or a
//! reserved area of one):
//!
//! ```text
//!   region block 0    superblock copy 0 (first 512 bytes; even sequence numbers)
//!   region block 1    superblock copy 1 (first 512 bytes; odd sequence numbers)
//!   region block 2..  the data area: capacity C = (region_blocks - 2) * B bytes, circular
//! ```
//!
//! A byte of the log is named by its LSN, a logical offset that only grows; it lives at
//! byte `LSN mod C` of the data area. A new log begins at LSN `C` (lap 1, offset 0), so
//! LSN 0 — which the buffer cache uses for "no record" — is never a record's LSN.
//!
//! Little-endian everywhere, written field by field.

/// The superblock's magic.
pub const SB_MAGIC: [u8; 8] = *b"CAIRNWAL";
/// The format version this code writes and the newest it reads.
pub const VERSION: u32 = 1;
/// Bytes of a superblock copy: one sector, so that a copy is written atomically on every
/// device cairn assumes (docs/DESIGN.md, "Assumptions about the device").
pub const SB_BYTES: usize = 512;
/// Region blocks holding the superblock copies; the data area starts after them.
pub const SB_BLOCKS: u64 = 2;
/// The smallest data area, in blocks: enough for the block-granular space accounting to
/// leave room for records once the checkpoint's block and the tail block are reserved.
pub const MIN_DATA_BLOCKS: u64 = 8;

// Superblock copy (512 bytes at the start of region block 0 and of region block 1):
// 0   magic "CAIRNWAL"                 [u8; 8]
const SB_MAGIC_OFF: usize = 0;
// 8   version                          u32
const SB_VERSION_OFF: usize = 8;
// 12  block_size                       u32   the device block size the log was made with
const SB_BLOCK_SIZE_OFF: usize = 12;
// 16  region_blocks                    u64   superblock blocks included
const SB_REGION_BLOCKS_OFF: usize = 16;
// 24  uuid                             [u8; 16]  seeds every record checksum
const SB_UUID_OFF: usize = 24;
// 40  sequence                         u64   bumped on every superblock write; copy = seq % 2
const SB_SEQUENCE_OFF: usize = 40;
// 48  checkpoint                       u64   LSN where recovery starts scanning
const SB_CHECKPOINT_OFF: usize = 48;
// 56  epoch_start                      u64   LSN where `epoch`'s records begin (that open's recovered end)
const SB_EPOCH_START_OFF: usize = 56;
// 64  epoch                            u32   the last read-write open's epoch
const SB_EPOCH_OFF: usize = 64;
// 68  reserved, zero                   u32
// 72  created_ns                       i64   ns since the Unix epoch, set by format
const SB_CREATED_OFF: usize = 72;
// 80  written_ns                       i64   this copy's write
const SB_WRITTEN_OFF: usize = 80;
// 88  owner                            [u8; 16]  the client's id (e.g. its file system's uuid), 0 = none
const SB_OWNER_OFF: usize = 88;
// 104 reserved, zero                   404 bytes
// 508 crc32c of bytes 0..508           u32
const SB_CRC_OFF: usize = 508;

/// Magic of a record header.
pub const REC_MAGIC: [u8; 4] = *b"WREC";
/// Bytes of a record header.
pub const REC_HEADER: usize = 32;
/// Records start at LSNs that are multiples of this; the bytes between a record's end and
/// the next multiple are zero and belong to no record.
pub const REC_ALIGN: u64 = 8;

// Record header (32 bytes at the record's LSN; the payload follows, then zero padding to 8):
// 0   magic "WREC"                     [u8; 4]
const REC_MAGIC_OFF: usize = 0;
// 4   len                              u32   payload bytes
const REC_LEN_OFF: usize = 4;
// 8   lsn                              u64   this record's own LSN
const REC_LSN_OFF: usize = 8;
// 16  epoch                            u32   the epoch of the open that appended it
const REC_EPOCH_OFF: usize = 16;
// 20  reserved, zero                   8 bytes
// 28  crc32c(uuid ‖ bytes 0..28 ‖ payload)  u32
const REC_CRC_OFF: usize = 28;

/// Bytes a record of `len` payload bytes occupies in the log: header, payload, padding.
pub fn record_size(len: u64) -> u64 {
    (REC_HEADER as u64 + len).next_multiple_of(REC_ALIGN)
}

/// Whether `b` starts with a log superblock's magic (tells "not a log" from "a damaged one").
pub fn has_magic(b: &[u8]) -> bool {
    b.len() >= SB_MAGIC.len() && b[..SB_MAGIC.len()] == SB_MAGIC
}

/// One superblock copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub block_size: u32,
    pub region_blocks: u64,
    pub uuid: [u8; 16],
    pub sequence: u64,
    pub checkpoint: u64,
    pub epoch_start: u64,
    pub epoch: u32,
    pub created_ns: i64,
    pub written_ns: i64,
    pub owner: [u8; 16],
}

fn le_u32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

impl Superblock {
    /// Bytes of the data area.
    pub fn capacity(&self) -> u64 {
        self.region_blocks.saturating_sub(SB_BLOCKS) * u64::from(self.block_size)
    }

    /// The LSN a new log starts at: the data area's size (lap 1, offset 0).
    pub fn first_lsn(&self) -> u64 {
        self.capacity()
    }

    /// Encodes into the first 512 bytes of `b` (which must hold them; the rest is untouched).
    pub fn encode(&self, b: &mut [u8]) {
        let b = &mut b[..SB_BYTES];
        b.fill(0);
        b[SB_MAGIC_OFF..SB_MAGIC_OFF + 8].copy_from_slice(&SB_MAGIC);
        put_u32(b, SB_VERSION_OFF, self.version);
        put_u32(b, SB_BLOCK_SIZE_OFF, self.block_size);
        put_u64(b, SB_REGION_BLOCKS_OFF, self.region_blocks);
        b[SB_UUID_OFF..SB_UUID_OFF + 16].copy_from_slice(&self.uuid);
        put_u64(b, SB_SEQUENCE_OFF, self.sequence);
        put_u64(b, SB_CHECKPOINT_OFF, self.checkpoint);
        put_u64(b, SB_EPOCH_START_OFF, self.epoch_start);
        put_u32(b, SB_EPOCH_OFF, self.epoch);
        put_u64(b, SB_CREATED_OFF, self.created_ns as u64);
        put_u64(b, SB_WRITTEN_OFF, self.written_ns as u64);
        b[SB_OWNER_OFF..SB_OWNER_OFF + 16].copy_from_slice(&self.owner);
        let crc = crc32c::crc32c(&b[..SB_CRC_OFF]);
        put_u32(b, SB_CRC_OFF, crc);
    }

    /// Decodes and validates one copy. Checks run in the order that names the most basic
    /// problem first: length, magic, version, checksum, then the fields' own rules.
    pub fn decode(b: &[u8]) -> Result<Superblock, String> {
        if b.len() < SB_BYTES {
            return Err(format!(
                "superblock needs {SB_BYTES} bytes, got {}",
                b.len()
            ));
        }
        if !has_magic(b) {
            return Err("no log superblock magic".into());
        }
        let version = le_u32(b, SB_VERSION_OFF);
        if version == 0 || version > VERSION {
            return Err(format!(
                "log format version {version} is not one this cairn reads (1..={VERSION})"
            ));
        }
        let crc = le_u32(b, SB_CRC_OFF);
        let want = crc32c::crc32c(&b[..SB_CRC_OFF]);
        if crc != want {
            return Err(format!(
                "superblock checksum mismatch (stored {crc:#010x}, computed {want:#010x})"
            ));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[SB_UUID_OFF..SB_UUID_OFF + 16]);
        let mut owner = [0u8; 16];
        owner.copy_from_slice(&b[SB_OWNER_OFF..SB_OWNER_OFF + 16]);
        let sb = Superblock {
            version,
            block_size: le_u32(b, SB_BLOCK_SIZE_OFF),
            region_blocks: le_u64(b, SB_REGION_BLOCKS_OFF),
            uuid,
            sequence: le_u64(b, SB_SEQUENCE_OFF),
            checkpoint: le_u64(b, SB_CHECKPOINT_OFF),
            epoch_start: le_u64(b, SB_EPOCH_START_OFF),
            epoch: le_u32(b, SB_EPOCH_OFF),
            created_ns: le_u64(b, SB_CREATED_OFF) as i64,
            written_ns: le_u64(b, SB_WRITTEN_OFF) as i64,
            owner,
        };
        sb.validate()?;
        Ok(sb)
    }

    /// The rules a decoded copy's fields obey.
    fn validate(&self) -> Result<(), String> {
        let bs = self.block_size;
        if !bs.is_power_of_two()
            || !(cairn_blockdev::MIN_BLOCK_SIZE..=cairn_blockdev::MAX_BLOCK_SIZE).contains(&bs)
        {
            return Err(format!("bad block size {bs}"));
        }
        let data = self.region_blocks.saturating_sub(SB_BLOCKS);
        if data < MIN_DATA_BLOCKS {
            return Err(format!(
                "region of {} blocks is below the minimum of {}",
                self.region_blocks,
                SB_BLOCKS + MIN_DATA_BLOCKS
            ));
        }
        // The capacity must be representable with room for many laps of LSNs.
        if data.checked_mul(u64::from(bs)).is_none_or(|c| c > 1 << 60) {
            return Err(format!(
                "region of {} blocks is too large",
                self.region_blocks
            ));
        }
        if self.checkpoint < self.first_lsn() || !self.checkpoint.is_multiple_of(REC_ALIGN) {
            return Err(format!("bad checkpoint LSN {}", self.checkpoint));
        }
        if self.checkpoint > u64::MAX / 2 {
            return Err(format!(
                "checkpoint LSN {} is out of range",
                self.checkpoint
            ));
        }
        if self.epoch_start < self.first_lsn()
            || !self.epoch_start.is_multiple_of(REC_ALIGN)
            || self.epoch_start > u64::MAX / 2
        {
            return Err(format!("bad epoch start LSN {}", self.epoch_start));
        }
        Ok(())
    }
}

/// A decoded record header (the payload is checked separately: see [`RecordHeader::crc_ok`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub len: u32,
    pub lsn: u64,
    pub epoch: u32,
    pub crc: u32,
}

/// Why bytes at a record position are not a record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// All 32 bytes are zero: space never written (or zeroed by format).
    Zero,
    /// Not a record header at all.
    NoMagic,
}

impl RecordHeader {
    /// Decodes the first 32 bytes of `b` (which must hold them). Only the structure is
    /// checked here; the caller checks the LSN, epoch and length against the log.
    pub fn decode(b: &[u8]) -> Result<RecordHeader, HeaderError> {
        let b = &b[..REC_HEADER];
        if b[REC_MAGIC_OFF..REC_MAGIC_OFF + 4] != REC_MAGIC {
            return Err(if b.iter().all(|&x| x == 0) {
                HeaderError::Zero
            } else {
                HeaderError::NoMagic
            });
        }
        Ok(RecordHeader {
            len: le_u32(b, REC_LEN_OFF),
            lsn: le_u64(b, REC_LSN_OFF),
            epoch: le_u32(b, REC_EPOCH_OFF),
            crc: le_u32(b, REC_CRC_OFF),
        })
    }

    /// Bytes the record occupies in the log.
    pub fn size(&self) -> u64 {
        record_size(u64::from(self.len))
    }

    /// Whether the stored checksum matches `header` (the record's 32 header bytes) and
    /// `payload` under the log's `uuid`.
    pub fn crc_ok(&self, uuid: &[u8; 16], header: &[u8], payload: &[u8]) -> bool {
        record_crc(uuid, &header[..REC_CRC_OFF], payload) == self.crc
    }
}

/// The checksum of a record: seeded with the log's uuid, so a record left by an earlier log
/// on the same device (a new `cairn wal mkfs` over an old one) never verifies.
fn record_crc(uuid: &[u8; 16], head: &[u8], payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(uuid);
    let c = crc32c::crc32c_append(c, head);
    crc32c::crc32c_append(c, payload)
}

/// Encodes a whole record (header, payload, zero padding) at the end of `out`.
pub fn encode_record(out: &mut Vec<u8>, uuid: &[u8; 16], lsn: u64, epoch: u32, payload: &[u8]) {
    let start = out.len();
    let mut h = [0u8; REC_HEADER];
    h[REC_MAGIC_OFF..REC_MAGIC_OFF + 4].copy_from_slice(&REC_MAGIC);
    // A payload's length is bounded by the capacity check in `append` (< 2^32).
    put_u32(&mut h, REC_LEN_OFF, payload.len() as u32);
    put_u64(&mut h, REC_LSN_OFF, lsn);
    put_u32(&mut h, REC_EPOCH_OFF, epoch);
    let crc = record_crc(uuid, &h[..REC_CRC_OFF], payload);
    put_u32(&mut h, REC_CRC_OFF, crc);
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let size = record_size(payload.len() as u64) as usize;
    out.resize(start + size, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            version: VERSION,
            block_size: 4096,
            region_blocks: 66,
            uuid: [7; 16],
            sequence: 3,
            checkpoint: 64 * 4096 + 40,
            epoch_start: 64 * 4096 + 400,
            epoch: 5,
            created_ns: 1,
            written_ns: -2,
            owner: [9; 16],
        }
    }

    #[test]
    fn superblock_round_trips_at_the_documented_offsets() {
        let s = sb();
        let mut b = vec![0xffu8; 4096];
        s.encode(&mut b);
        assert_eq!(&b[0..8], b"CAIRNWAL");
        assert_eq!(le_u32(&b, 12), 4096);
        assert_eq!(le_u64(&b, 48), s.checkpoint);
        assert_eq!(le_u64(&b, 56), s.epoch_start);
        assert_eq!(le_u32(&b, 64), 5);
        assert_eq!(&b[88..104], &[9u8; 16]);
        assert!(b[104..508].iter().all(|&x| x == 0));
        assert!(
            b[512..].iter().all(|&x| x == 0xff),
            "only the first sector is written"
        );
        assert_eq!(Superblock::decode(&b).unwrap(), s);
        assert_eq!(s.capacity(), 64 * 4096);
    }

    #[test]
    fn superblock_refusals_name_the_problem() {
        let s = sb();
        let mut b = vec![0u8; 512];
        s.encode(&mut b);
        assert!(
            Superblock::decode(&b[..100])
                .unwrap_err()
                .contains("512 bytes")
        );
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(Superblock::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = b.clone();
        bad[8] = 2;
        assert!(Superblock::decode(&bad).unwrap_err().contains("version 2"));
        let mut bad = b.clone();
        bad[100] = 1;
        assert!(Superblock::decode(&bad).unwrap_err().contains("checksum"));
        for (f, want) in [
            (
                Box::new(|s: &mut Superblock| s.block_size = 3000) as Box<dyn Fn(&mut Superblock)>,
                "block size",
            ),
            (
                Box::new(|s: &mut Superblock| s.region_blocks = 9),
                "minimum",
            ),
            (
                Box::new(|s: &mut Superblock| s.checkpoint = 5),
                "checkpoint",
            ),
            (
                Box::new(|s: &mut Superblock| s.checkpoint += 4),
                "checkpoint",
            ),
            (
                Box::new(|s: &mut Superblock| s.epoch_start = 8),
                "epoch start",
            ),
            (
                Box::new(|s: &mut Superblock| s.epoch_start += 1),
                "epoch start",
            ),
            (
                Box::new(|s: &mut Superblock| s.region_blocks = u64::MAX),
                "too large",
            ),
        ] {
            let mut s2 = s.clone();
            f(&mut s2);
            s2.encode(&mut b);
            let e = Superblock::decode(&b).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn record_round_trips_and_its_checksum_covers_everything() {
        let uuid = [3u8; 16];
        let mut out = vec![1, 2, 3];
        encode_record(&mut out, &uuid, 4096, 7, b"hello");
        let rec = &out[3..];
        assert_eq!(rec.len() as u64, record_size(5));
        assert_eq!(rec.len(), 40);
        let h = RecordHeader::decode(rec).unwrap();
        assert_eq!((h.len, h.lsn, h.epoch), (5, 4096, 7));
        assert!(h.crc_ok(&uuid, rec, &rec[32..37]));
        assert!(rec[37..].iter().all(|&x| x == 0));
        // Another log's uuid, a flipped payload byte, a changed LSN or epoch: no match.
        assert!(!h.crc_ok(&[4; 16], rec, &rec[32..37]));
        assert!(!h.crc_ok(&uuid, rec, b"hellp"));
        let mut r2 = rec.to_vec();
        r2[8] ^= 1;
        let h2 = RecordHeader::decode(&r2).unwrap();
        assert!(!h2.crc_ok(&uuid, &r2, &r2[32..37]));
        let mut r3 = rec.to_vec();
        r3[16] ^= 1;
        let h3 = RecordHeader::decode(&r3).unwrap();
        assert!(!h3.crc_ok(&uuid, &r3, &r3[32..37]));
    }

    #[test]
    fn headers_that_are_not_records() {
        assert_eq!(RecordHeader::decode(&[0; 32]), Err(HeaderError::Zero));
        let mut b = [0u8; 32];
        b[5] = 1;
        assert_eq!(RecordHeader::decode(&b), Err(HeaderError::NoMagic));
        assert_eq!(record_size(0), 32);
        assert_eq!(record_size(1), 40);
        assert_eq!(record_size(8), 40);
        assert_eq!(record_size(9), 48);
    }
}
