//! Fuzz-target bodies. The cargo-fuzz target `wal` in `fuzz/` calls [`all`]; the seeded tests
//! below run the same bodies on stable in CI. Each states its property: parsing never panics,
//! what parses re-encodes to the same value, and a log image damaged anywhere opens or is
//! refused cleanly, and what it recovers reads back and accepts new records.

use std::sync::{Arc, OnceLock};

use cairn_blockdev::MemDevice;

use crate::format::{REC_HEADER, RecordHeader, SB_BYTES, Superblock, encode_record};
use crate::{FormatOptions, Options, Region, Wal};

/// Every body on the same input.
pub fn all(data: &[u8]) {
    superblock(data);
    record(data);
    log_image(data);
}

/// Superblock decoding: no panic; a decoded superblock re-encodes to bytes that decode to
/// the same value, and its checkpoint lies in its own LSN space.
pub fn superblock(data: &[u8]) {
    let Ok(sb) = Superblock::decode(data) else {
        return;
    };
    assert!(sb.checkpoint >= sb.first_lsn() && sb.epoch_start >= sb.first_lsn());
    let mut b = vec![0u8; SB_BYTES];
    sb.encode(&mut b);
    assert_eq!(Superblock::decode(&b).expect("re-decode"), sb);
}

/// Record header decoding and checksum verification under a fixed uuid: no panic; a record
/// that verifies re-encodes to a record that decodes and verifies identically.
pub fn record(data: &[u8]) {
    if data.len() < REC_HEADER {
        return;
    }
    let Ok(h) = RecordHeader::decode(data) else {
        return;
    };
    let _ = h.size();
    let uuid = [0x5a; 16];
    let n = (h.len as usize).min(data.len() - REC_HEADER);
    let payload = &data[REC_HEADER..REC_HEADER + n];
    if n != h.len as usize || !h.crc_ok(&uuid, data, payload) {
        return;
    }
    let mut out = Vec::new();
    encode_record(&mut out, &uuid, h.lsn, h.epoch, payload);
    let back = RecordHeader::decode(&out).expect("re-decode");
    assert_eq!((back.len, back.lsn, back.epoch), (h.len, h.lsn, h.epoch));
    assert!(back.crc_ok(&uuid, &out, &out[REC_HEADER..REC_HEADER + n]));
}

const IMAGE_BS: u32 = 512;
const IMAGE_BLOCKS: u64 = 18;

/// A small log (16 data blocks of 512 bytes) that has wrapped: records of several sizes,
/// some larger than a block and one across the wrap point, and a checkpoint.
pub fn base_image() -> &'static [u8] {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let dev = Arc::new(MemDevice::new(IMAGE_BS, IMAGE_BLOCKS));
        let region = Region::whole(&*dev);
        let fo = FormatOptions {
            uuid: Some([1; 16]),
            ..Default::default()
        };
        Wal::format(&*dev, region, &fo).expect("format");
        let wal = Wal::open(dev.clone(), region).expect("open");
        let mut i = 0u32;
        while wal.end().0 < 2 * wal.capacity() - 1500 {
            let len = [10usize, 600, 90, 1400, 3][i as usize % 5];
            let lsn = match wal.append(&vec![i as u8; len]) {
                Ok(l) => l,
                Err(_) => {
                    wal.set_checkpoint(wal.end()).expect("checkpoint");
                    continue;
                }
            };
            wal.force(lsn).expect("force");
            i += 1;
        }
        drop(wal);
        dev.to_bytes()
    })
}

/// The base image patched by the input: each 4-byte group is (offset: 3 bytes, value). Opening
/// it read-only and read-write must not panic; what a read-only open recovers must read back;
/// a read-write open must accept, force and recover a new record.
pub fn log_image(data: &[u8]) {
    let mut bytes = base_image().to_vec();
    for p in data.chunks_exact(4) {
        let off = u32::from_le_bytes([p[0], p[1], p[2], 0]) as usize % bytes.len();
        bytes[off] = p[3];
    }
    let dev = Arc::new(MemDevice::from_bytes(IMAGE_BS, bytes));
    let region = Region::whole(&*dev);
    if let Ok(w) = Wal::open_read_only(dev.clone(), region) {
        let mut n = 0;
        for r in w.scan(w.checkpoint()) {
            r.expect("a recovered record reads back");
            n += 1;
        }
        assert_eq!(n, w.recovery().records);
    }
    let Ok(w) = Wal::open_with(dev.clone(), region, Options::default()) else {
        return;
    };
    let before = w.recovery().records;
    let lsn = match w.append(b"after the damage") {
        Ok(l) => l,
        Err(crate::WalError::Full { .. }) => {
            w.set_checkpoint(w.end()).expect("checkpoint a full log");
            w.append(b"after the damage")
                .expect("append after checkpoint")
        }
        Err(e) => panic!("append: {e}"),
    };
    w.force(lsn).expect("force");
    let ckpt = w.checkpoint();
    drop(w);
    let w = Wal::open_read_only(dev, region).expect("reopen");
    let recs: Vec<_> = w.scan(ckpt).map(|r| r.expect("read back")).collect();
    let last = recs.last().expect("the new record");
    assert_eq!((last.lsn, &last.data[..]), (lsn, &b"after the damage"[..]));
    if ckpt.0 == w.recovery().checkpoint && lsn > ckpt {
        assert_eq!(recs.len() as u64, before + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{Rng, seed};

    fn mutate(rng: &mut Rng, valid: &[u8], n: usize, body: impl Fn(&[u8])) {
        body(valid);
        for _ in 0..n {
            let mut v = valid.to_vec();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(v.len() as u64) as usize;
                v[i] = rng.next_u64() as u8;
            }
            body(&v);
            let junk: Vec<u8> = (0..rng.below(valid.len() as u64 + 64))
                .map(|_| rng.next_u64() as u8)
                .collect();
            body(&junk);
        }
    }

    #[test]
    fn superblock_fuzz() {
        let mut rng = Rng::new(seed("superblock_fuzz"));
        let img = base_image();
        mutate(&mut rng, &img[..512], 3000, superblock);
        mutate(&mut rng, &img[512..1024], 3000, superblock);
    }

    #[test]
    fn record_fuzz() {
        let mut rng = Rng::new(seed("record_fuzz"));
        let mut rec = Vec::new();
        encode_record(&mut rec, &[0x5a; 16], 4096, 3, b"some payload bytes");
        mutate(&mut rng, &rec, 3000, record);
        let mut big = Vec::new();
        encode_record(&mut big, &[0x5a; 16], 1 << 40, 9, &[7u8; 700]);
        mutate(&mut rng, &big, 1000, record);
    }

    #[test]
    fn log_image_fuzz() {
        let mut rng = Rng::new(seed("log_image_fuzz"));
        log_image(&[]);
        for _ in 0..400 {
            let d: Vec<u8> = (0..4 * (1 + rng.below(12)))
                .map(|_| rng.next_u64() as u8)
                .collect();
            log_image(&d);
        }
        // Damage aimed at the superblocks and the first data blocks.
        for _ in 0..400 {
            let mut d = Vec::new();
            for _ in 0..1 + rng.below(4) {
                let off = rng.below(3 * 512) as u32;
                d.extend_from_slice(&off.to_le_bytes()[..3]);
                d.push(rng.next_u64() as u8);
            }
            log_image(&d);
        }
    }
}
