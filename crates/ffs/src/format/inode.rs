//! 256-byte inodes.

use super::*;

pub const INODE_SIZE: usize = 256;
pub const NDIRECT: usize = 12;
/// Symlink targets up to this length live in the inode's pointer area (a "fast symlink").
pub const FAST_SYMLINK_MAX: usize = 120;
const PTR_AREA: usize = 80;
/// Inode flag: the pointer area holds a fast-symlink target, not block pointers.
pub const FLAG_INLINE: u32 = 0x8000_0000;

/// An inode as stored on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskInode {
    // 0   mode (S_IFMT | permission bits)  u32; 0 = free inode
    pub mode: u32,
    // 4   nlink                            u32
    pub nlink: u32,
    // 8   uid                              u32
    pub uid: u32,
    // 12  gid                              u32
    pub gid: u32,
    // 16  size in bytes                    u64
    pub size: u64,
    // 24  blocks allocated (data, indirect and xattr), in file-system blocks  u64
    pub blocks: u64,
    // 32  atime, ns since the epoch        i64
    pub atime: i64,
    // 40  mtime                            i64
    pub mtime: i64,
    // 48  ctime                            i64
    pub ctime: i64,
    // 56  birth time                       i64
    pub btime: i64,
    // 64  flags                            u32 (bit 31: fast symlink, target inline)
    pub flags: u32,
    // 68  generation                       u32
    pub generation: u32,
    // 72  rdev                             u32
    pub rdev: u32,
    // 76  reserved                         u32
    // 80  direct block pointers            [u64; 12]   (fast symlink: target bytes 80..200)
    pub direct: [u64; NDIRECT],
    // 176 single, double, triple indirect  [u64; 3]
    pub indirect: [u64; 3],
    // 200 extended-attribute block         u64
    pub xattr: u64,
    // 208 reserved                         [u8; 44]
    // 252 crc32c of (ino as u64 LE ++ bytes 0..252)  u32
    /// Fast-symlink target (replaces the pointer area on disk when set).
    pub fast_link: Option<Vec<u8>>,
}

impl DiskInode {
    pub fn is_free(&self) -> bool {
        self.mode == 0
    }
    pub fn kind_bits(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.kind_bits() == libc::S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.kind_bits() == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.kind_bits() == libc::S_IFLNK
    }

    pub fn encode(&self, ino: u64, b: &mut [u8]) {
        let b = &mut b[..INODE_SIZE];
        b.fill(0);
        if self.mode == 0 {
            // A free inode is all zeros, generation kept so reuse bumps it.
            put_u32(b, 68, self.generation);
        } else {
            put_u32(b, 0, self.mode);
            put_u32(b, 4, self.nlink);
            put_u32(b, 8, self.uid);
            put_u32(b, 12, self.gid);
            put_u64(b, 16, self.size);
            put_u64(b, 24, self.blocks);
            put_i64(b, 32, self.atime);
            put_i64(b, 40, self.mtime);
            put_i64(b, 48, self.ctime);
            put_i64(b, 56, self.btime);
            let inline = if self.fast_link.is_some() {
                FLAG_INLINE
            } else {
                0
            };
            put_u32(b, 64, (self.flags & !FLAG_INLINE) | inline);
            put_u32(b, 68, self.generation);
            put_u32(b, 72, self.rdev);
            match &self.fast_link {
                Some(t) => {
                    let n = t.len().min(FAST_SYMLINK_MAX);
                    b[PTR_AREA..PTR_AREA + n].copy_from_slice(&t[..n]);
                }
                None => {
                    for (i, p) in self.direct.iter().enumerate() {
                        put_u64(b, PTR_AREA + 8 * i, *p);
                    }
                    for (i, p) in self.indirect.iter().enumerate() {
                        put_u64(b, 176 + 8 * i, *p);
                    }
                }
            }
            put_u64(b, 200, self.xattr);
        }
        let c = inode_crc(ino, b);
        put_u32(b, 252, c);
    }

    /// The mode and size of an encoded inode, unchecked: for a caller that holds the
    /// buffer the engine itself just encoded (soft updates looks at every inode update
    /// for a raised size, and most updates raise none: a full decode, checksum included,
    /// was a measurable part of each call). `None` if `b` is short.
    pub fn peek_mode_size(b: &[u8]) -> Option<(u32, u64)> {
        if b.len() < INODE_SIZE {
            return None;
        }
        Some((get_u32(b, 0), get_u64(b, 16)))
    }

    /// Decodes the inode `ino` from its 256 bytes. Checks the checksum and that the mode
    /// names a file type; pointer ranges are checked by the users (they know the geometry).
    pub fn decode(ino: u64, b: &[u8]) -> FResult<DiskInode> {
        if b.len() < INODE_SIZE {
            return corrupt(format!("inode {ino}: short read"));
        }
        let b = &b[..INODE_SIZE];
        if get_u32(b, 252) != inode_crc(ino, b) {
            if b.iter().all(|&x| x == 0) {
                // Never-written inode table space (mkfs leaves it sparse).
                return Ok(DiskInode::default());
            }
            return corrupt(format!("inode {ino}: checksum mismatch"));
        }
        let mode = get_u32(b, 0);
        let mut d = DiskInode {
            generation: get_u32(b, 68),
            ..Default::default()
        };
        if mode == 0 {
            return Ok(d);
        }
        if cairn_vfs::FileKind::from_mode(mode).is_none() {
            return corrupt(format!("inode {ino}: bad file type in mode {mode:o}"));
        }
        d.mode = mode;
        d.nlink = get_u32(b, 4);
        d.uid = get_u32(b, 8);
        d.gid = get_u32(b, 12);
        d.size = get_u64(b, 16);
        d.blocks = get_u64(b, 24);
        d.atime = get_i64(b, 32);
        d.mtime = get_i64(b, 40);
        d.ctime = get_i64(b, 48);
        d.btime = get_i64(b, 56);
        let raw_flags = get_u32(b, 64);
        d.flags = raw_flags & !FLAG_INLINE;
        d.rdev = get_u32(b, 72);
        d.xattr = get_u64(b, 200);
        if raw_flags & FLAG_INLINE != 0 {
            if !d.is_symlink() || d.size as usize > FAST_SYMLINK_MAX {
                return corrupt(format!(
                    "inode {ino}: inline data on a non-symlink or too long"
                ));
            }
            d.fast_link = Some(b[PTR_AREA..PTR_AREA + d.size as usize].to_vec());
        } else {
            for i in 0..NDIRECT {
                d.direct[i] = get_u64(b, PTR_AREA + 8 * i);
            }
            for i in 0..3 {
                d.indirect[i] = get_u64(b, 176 + 8 * i);
            }
        }
        Ok(d)
    }

    /// Every block pointer held directly in the inode (direct and indirect roots).
    pub fn root_pointers(&self) -> impl Iterator<Item = u64> + '_ {
        let fast = self.fast_link.is_some();
        self.direct
            .iter()
            .chain(self.indirect.iter())
            .copied()
            .filter(move |&p| p != 0 && !fast)
    }
}

fn inode_crc(ino: u64, b: &[u8]) -> u32 {
    let c = crc32c::crc32c(&ino.to_le_bytes());
    crc32c::crc32c_append(c, &b[..252])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let mut d = DiskInode {
            mode: libc::S_IFREG | 0o644,
            nlink: 1,
            uid: 1000,
            gid: 100,
            size: 123456,
            blocks: 31,
            atime: 1,
            mtime: -2,
            ctime: 3,
            btime: 4,
            flags: 0,
            generation: 7,
            rdev: 0,
            xattr: 99,
            ..Default::default()
        };
        d.direct[0] = 1000;
        d.direct[11] = 1011;
        d.indirect = [5, 6, 7];
        let mut b = [0u8; 256];
        d.encode(42, &mut b);
        assert_eq!(DiskInode::decode(42, &b).unwrap(), d);
        // An inode copied to another slot fails its checksum.
        assert!(DiskInode::decode(43, &b).is_err());
        b[17] ^= 0xff;
        assert!(
            DiskInode::decode(42, &b)
                .unwrap_err()
                .0
                .contains("checksum")
        );
        assert!(DiskInode::decode(42, &[0u8; 256]).unwrap().is_free());
    }

    #[test]
    fn fast_symlink() {
        let d = DiskInode {
            mode: libc::S_IFLNK | 0o777,
            nlink: 1,
            size: 11,
            fast_link: Some(b"hello/world".to_vec()),
            ..Default::default()
        };
        let mut b = [0u8; 256];
        d.encode(9, &mut b);
        let back = DiskInode::decode(9, &b).unwrap();
        assert_eq!(back.fast_link.as_deref(), Some(&b"hello/world"[..]));
        assert_eq!(back.root_pointers().count(), 0);
    }

    #[test]
    fn fast_symlink_with_xattr_block() {
        let d = DiskInode {
            mode: libc::S_IFLNK | 0o777,
            nlink: 1,
            size: 3,
            blocks: 1,
            xattr: 500,
            fast_link: Some(b"abc".to_vec()),
            ..Default::default()
        };
        let mut b = [0u8; 256];
        d.encode(9, &mut b);
        assert_eq!(
            DiskInode::decode(9, &b).unwrap().fast_link.as_deref(),
            Some(&b"abc"[..])
        );
    }
}
