//! Extended-attribute block: one per inode that has attributes.
//!
//!   0  magic "CXAT"  [u8; 4]
//!   4  count         u32
//!   8  used bytes    u32 (header included)
//!   12 crc32c of bytes 16..used  u32
//!   16 entries: name_len u16, reserved u16, value_len u32, name, value, padded to 4 bytes

use super::*;

pub const XATTR_MAGIC: [u8; 4] = *b"CXAT";
const HDR: usize = 16;

fn entry_size(name: usize, value: usize) -> usize {
    (8 + name + value).div_ceil(4) * 4
}

/// Bytes a block needs to hold these attributes.
pub fn encoded_size(attrs: &[(Vec<u8>, Vec<u8>)]) -> usize {
    HDR + attrs
        .iter()
        .map(|(n, v)| entry_size(n.len(), v.len()))
        .sum::<usize>()
}

/// Encodes; the caller checks [`encoded_size`] fits first (returns false if not).
pub fn encode(attrs: &[(Vec<u8>, Vec<u8>)], b: &mut [u8]) -> bool {
    if encoded_size(attrs) > b.len() {
        return false;
    }
    b.fill(0);
    b[0..4].copy_from_slice(&XATTR_MAGIC);
    put_u32(b, 4, attrs.len() as u32);
    let mut off = HDR;
    for (n, v) in attrs {
        put_u16(b, off, n.len() as u16);
        put_u32(b, off + 4, v.len() as u32);
        b[off + 8..off + 8 + n.len()].copy_from_slice(n);
        b[off + 8 + n.len()..off + 8 + n.len() + v.len()].copy_from_slice(v);
        off += entry_size(n.len(), v.len());
    }
    put_u32(b, 8, off as u32);
    let c = crc(&b[HDR..off]);
    put_u32(b, 12, c);
    true
}

pub fn decode(b: &[u8]) -> FResult<Vec<(Vec<u8>, Vec<u8>)>> {
    if b.len() < HDR || b[0..4] != XATTR_MAGIC {
        return corrupt("extended-attribute block: bad magic");
    }
    let count = get_u32(b, 4) as usize;
    let used = get_u32(b, 8) as usize;
    if used < HDR || used > b.len() {
        return corrupt("extended-attribute block: bad length");
    }
    if crc(&b[HDR..used]) != get_u32(b, 12) {
        return corrupt("extended-attribute block: checksum mismatch");
    }
    let mut out = Vec::new();
    let mut off = HDR;
    for _ in 0..count {
        if off + 8 > used {
            return corrupt("extended-attribute block: entry out of bounds");
        }
        let nl = get_u16(b, off) as usize;
        let vl = get_u32(b, off + 4) as usize;
        let end = off.checked_add(entry_size(nl, vl)).filter(|&e| e <= used);
        if end.is_none() || nl == 0 || nl > MAX_NAME {
            return corrupt("extended-attribute block: bad entry");
        }
        out.push((
            b[off + 8..off + 8 + nl].to_vec(),
            b[off + 8 + nl..off + 8 + nl + vl].to_vec(),
        ));
        off = end.unwrap_or(used);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_corruption() {
        let attrs = vec![
            (b"user.a".to_vec(), b"1".to_vec()),
            (b"user.bb".to_vec(), vec![0u8; 300]),
        ];
        let mut b = vec![0u8; 4096];
        assert!(encode(&attrs, &mut b));
        assert_eq!(decode(&b).unwrap(), attrs);
        b[20] ^= 1;
        assert!(decode(&b).is_err());
        let big = vec![(b"user.x".to_vec(), vec![0u8; 5000])];
        assert!(!encode(&big, &mut b));
    }
}
