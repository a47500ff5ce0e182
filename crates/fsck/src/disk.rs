//! Byte-addressed access to a device of any block size, and finding a usable superblock.
//!
//! fsck reads the device directly (never through the buffer cache): it must see exactly what a
//! crash left on the media, and it must keep working when every structure is hostile. Every
//! read is bounds-checked against the device; nothing here trusts a number read from disk.

use std::io;

use cairn_blockdev::BlockDevice;
use cairn_ffs::format::superblock::{SB_BYTES, SB_MAGIC};
use cairn_ffs::format::{Geometry, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, Superblock};

use crate::FsckError;

/// A device seen as a byte array. Unaligned accesses read (and for writes, modify) the
/// enclosing device blocks, so the file system's block size need not match the device's.
pub(crate) struct Disk<'a> {
    dev: &'a dyn BlockDevice,
    dbs: u64,
    len: u64,
}

impl<'a> Disk<'a> {
    pub fn new(dev: &'a dyn BlockDevice) -> Disk<'a> {
        let dbs = u64::from(dev.block_size().max(1));
        Disk {
            dev,
            dbs,
            len: dev.num_blocks().saturating_mul(dbs),
        }
    }

    /// Device size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    fn span(&self, off: u64, n: usize) -> io::Result<(u64, u64)> {
        match off.checked_add(n as u64) {
            Some(end) if end <= self.len => Ok((off / self.dbs, end.div_ceil(self.dbs))),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "access to bytes {off}..+{n} beyond the end of the device ({} bytes)",
                    self.len
                ),
            )),
        }
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let (first, last) = self.span(off, buf.len())?;
        if off.is_multiple_of(self.dbs) && (buf.len() as u64).is_multiple_of(self.dbs) {
            return self.dev.read_blocks(first, buf);
        }
        let mut tmp = vec![0u8; ((last - first) * self.dbs) as usize];
        self.dev.read_blocks(first, &mut tmp)?;
        let s = (off - first * self.dbs) as usize;
        buf.copy_from_slice(&tmp[s..s + buf.len()]);
        Ok(())
    }

    pub fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let (first, last) = self.span(off, data.len())?;
        if off.is_multiple_of(self.dbs) && (data.len() as u64).is_multiple_of(self.dbs) {
            return self.dev.write_blocks(first, data);
        }
        let mut tmp = vec![0u8; ((last - first) * self.dbs) as usize];
        self.dev.read_blocks(first, &mut tmp)?;
        let s = (off - first * self.dbs) as usize;
        tmp[s..s + data.len()].copy_from_slice(data);
        self.dev.write_blocks(first, &tmp)
    }

    pub fn flush(&self) -> io::Result<()> {
        self.dev.flush()
    }
}

/// The superblock fsck will work from.
pub(crate) struct Located {
    pub sb: Superblock,
    pub geo: Geometry,
    /// When the primary was unusable: the group whose copy is used and why the primary failed.
    pub backup: Option<(u64, String)>,
}

/// Largest prefix of the device scanned for a backup superblock when neither the damaged
/// primary nor the default geometry says where one is.
const SCAN_LIMIT: u64 = 256 << 20;
const SCAN_STEP: u64 = MIN_BLOCK_SIZE as u64;

/// Finds the superblock: the primary, else a backup copy (group 1's first, as FFS fsck's
/// `-b` default), located from the damaged primary's own geometry fields, from the default
/// geometry for every block size, or by a bounded scan.
pub(crate) fn locate(disk: &Disk) -> Result<Located, FsckError> {
    if disk.len() < SB_BYTES as u64 {
        return Err(FsckError::NotCairn(format!(
            "device too small to hold a cairn file system ({} bytes)",
            disk.len()
        )));
    }
    let mut raw = vec![0u8; SB_BYTES];
    disk.read(0, &mut raw)?;
    let primary_err = match Superblock::decode(&raw) {
        Ok(sb) => {
            let geo = sb.geometry().map_err(|e| FsckError::Unusable(e.0))?;
            fits(disk, &geo)?;
            return Ok(Located {
                sb,
                geo,
                backup: None,
            });
        }
        Err(e) => e.0,
    };
    // A foreign file (no magic anywhere we look) is refused as such, not as a damaged cairn.
    let mut candidates: Vec<u64> = Vec::new();
    if raw[0..8] == SB_MAGIC {
        let bs = u32::from_le_bytes(raw[12..16].try_into().unwrap_or_default());
        let bpg = u32::from_le_bytes(raw[24..28].try_into().unwrap_or_default()) as u64;
        if (MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs)
            && bs.is_power_of_two()
            && (1..=bs as u64 * 8).contains(&bpg)
        {
            candidates.push(bpg * bs as u64);
        }
    }
    let mut bs = MIN_BLOCK_SIZE as u64;
    while bs <= MAX_BLOCK_SIZE as u64 {
        candidates.push(bs * bs * 8);
        bs *= 2;
    }
    for off in candidates {
        if let Some(l) = try_backup(disk, off, &primary_err)? {
            return Ok(l);
        }
    }
    // Bounded scan in 1 MiB reads for a block that starts with the magic.
    let limit = disk.len().min(SCAN_LIMIT);
    let mut base = 0u64;
    let mut chunk = vec![0u8; 1 << 20];
    while base < limit {
        let n = (limit - base).min(chunk.len() as u64) as usize;
        let n = n - n % SB_BYTES;
        if n == 0 {
            break;
        }
        disk.read(base, &mut chunk[..n])?;
        let mut i = 0usize;
        while i + SB_BYTES <= n {
            let off = base + i as u64;
            if off > 0
                && chunk[i..i + 8] == SB_MAGIC
                && let Some(l) = try_backup(disk, off, &primary_err)?
            {
                return Ok(l);
            }
            i += SCAN_STEP as usize;
        }
        base += n as u64;
    }
    if raw[0..8] != SB_MAGIC {
        Err(FsckError::NotCairn(format!(
            "{primary_err}; no backup superblock found"
        )))
    } else {
        Err(FsckError::Unusable(format!(
            "primary superblock unusable ({primary_err}) and no backup superblock found"
        )))
    }
}

fn try_backup(disk: &Disk, off: u64, primary_err: &str) -> Result<Option<Located>, FsckError> {
    if off == 0 || off.saturating_add(SB_BYTES as u64) > disk.len() {
        return Ok(None);
    }
    let mut raw = vec![0u8; SB_BYTES];
    disk.read(off, &mut raw)?;
    let Ok(sb) = Superblock::decode(&raw) else {
        return Ok(None);
    };
    let Ok(geo) = sb.geometry() else {
        return Ok(None);
    };
    // The copy must sit exactly where its own geometry puts a group's first block: a stray
    // superblock image inside a file's data must not be mistaken for this file system's.
    let bs = geo.block_size as u64;
    if !off.is_multiple_of(geo.blocks_per_group * bs) {
        return Ok(None);
    }
    let g = off / (geo.blocks_per_group * bs);
    if g == 0 || g >= geo.group_count || fits(disk, &geo).is_err() {
        return Ok(None);
    }
    Ok(Some(Located {
        sb,
        geo,
        backup: Some((g, primary_err.to_string())),
    }))
}

fn fits(disk: &Disk, geo: &Geometry) -> Result<(), FsckError> {
    let need = geo.total_blocks.checked_mul(geo.block_size as u64);
    match need {
        Some(n) if n <= disk.len() => Ok(()),
        _ => Err(FsckError::Unusable(format!(
            "file system of {} blocks of {} bytes is larger than the device ({} bytes)",
            geo.total_blocks,
            geo.block_size,
            disk.len()
        ))),
    }
}
