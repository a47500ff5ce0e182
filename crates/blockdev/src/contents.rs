//! What an image or device already holds, so a formatter can refuse to destroy it.
//!
//! `mkfs.ext4` and `mkfs.xfs` refuse a device that carries a known signature unless forced;
//! cairn's mkfs does the same, and also refuses any non-zero bytes at the start (a text file
//! given by mistake is data too). A file system's own format is recognized by its crate;
//! this module knows the foreign signatures, at the offsets their formats define them.

/// How many leading bytes [`describe`] looks at: enough for every signature below (btrfs's
/// sits at 64 KiB + 64, ISO 9660's at 32 KiB + 1).
pub const PROBE_BYTES: usize = 128 << 10;

/// (offset, bytes, what it means)
const SIGNATURES: &[(usize, &[u8], &str)] = &[
    (1080, &[0x53, 0xEF], "an ext2/ext3/ext4 file system"),
    (0, b"XFSB", "an XFS file system"),
    (65600, b"_BHRfS_M", "a btrfs file system"),
    (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
    (0, b"hsqs", "a squashfs image"),
    (32769, b"CD001", "an ISO 9660 image"),
    (4086, b"SWAPSPACE2", "a swap area"),
    (4086, b"SWAP-SPACE", "a swap area"),
    (512, b"EFI PART", "a GPT partition table"),
    (3, b"EXFAT   ", "an exFAT file system"),
    (3, b"NTFS    ", "an NTFS file system"),
    (54, b"FAT1", "a FAT file system"),
    (82, b"FAT32   ", "a FAT32 file system"),
    (510, &[0x55, 0xAA], "a DOS partition table or boot sector"),
];

/// A description of what the leading bytes `head` of an image hold ("an XFS file system",
/// "text", "data (non-zero bytes in its first 128 KiB)"), or `None` when they are all zero
/// (a new or wiped image that may be formatted without asking).
pub fn describe(head: &[u8]) -> Option<String> {
    for &(off, sig, what) in SIGNATURES {
        if head.len() >= off + sig.len() && &head[off..off + sig.len()] == sig {
            return Some(what.to_string());
        }
    }
    let used = head.iter().rposition(|&b| b != 0)? + 1;
    let text = head[..used]
        .iter()
        .all(|&b| b == b'\n' || b == b'\t' || b == b'\r' || (0x20..0x7f).contains(&b) || b >= 0x80);
    if text {
        return Some(format!("text ({used} bytes)"));
    }
    Some(format!(
        "data (non-zero bytes in its first {} KiB)",
        head.len().div_ceil(1024)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_free_and_anything_else_is_named() {
        assert_eq!(describe(&[]), None);
        assert_eq!(describe(&vec![0; PROBE_BYTES]), None);
        let mut h = vec![0u8; PROBE_BYTES];
        h[1080] = 0x53;
        h[1081] = 0xEF;
        assert_eq!(describe(&h).unwrap(), "an ext2/ext3/ext4 file system");
        let mut h = vec![0u8; PROBE_BYTES];
        h[65600..65608].copy_from_slice(b"_BHRfS_M");
        assert_eq!(describe(&h).unwrap(), "a btrfs file system");
        assert_eq!(describe(b"hello\nworld\n").unwrap(), "text (12 bytes)");
        let mut h = vec![0u8; 8192];
        h[5000] = 1;
        assert!(describe(&h).unwrap().starts_with("data"));
        // A signature past the end of a short image is not read out of bounds.
        assert!(describe(&[0x55]).is_some());
    }
}
