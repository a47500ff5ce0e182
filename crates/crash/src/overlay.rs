//! Crash-state devices: a shared base image plus a small map of overridden blocks.
//!
//! A campaign checks thousands of states of the same 64 MiB image that differ in a handful
//! of blocks. Copying the image per state would cost more than checking it, so a state is
//! an [`Overlay`]: reads come from the block map if the block is there, else from the shared
//! base; writes (a mode's recovery, fsck repairs in `replay --repair`) go to the map. The
//! base is an `Arc`, so a state can be handed to `Ffs::mount_device` (which wants
//! `Arc<dyn BlockDevice>`) without copying.
//!
//! A recording of two devices (a journal's log device) keeps both in one overlay, the log's
//! blocks after the file system's; a [`Slice`] hands out each as a device of its own.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, DeviceCore, DeviceCounters, TraceSink};
use parking_lot::RwLock;

/// The image every state of one epoch shares.
#[derive(Debug)]
pub struct Base {
    pub block_size: u32,
    pub bytes: Vec<u8>,
}

impl Base {
    pub fn zeroed(block_size: u32, num_blocks: u64) -> Base {
        // vec![0; n] is calloc: untouched pages of a large, mostly empty image cost nothing.
        Base {
            block_size,
            bytes: vec![0u8; block_size as usize * num_blocks as usize],
        }
    }

    pub fn num_blocks(&self) -> u64 {
        (self.bytes.len() / self.block_size as usize) as u64
    }

    pub fn block(&self, b: u64) -> &[u8] {
        let bs = self.block_size as usize;
        let off = b as usize * bs;
        &self.bytes[off..off + bs]
    }

    pub fn block_mut(&mut self, b: u64) -> &mut [u8] {
        let bs = self.block_size as usize;
        let off = b as usize * bs;
        &mut self.bytes[off..off + bs]
    }
}

/// A device whose contents are `base` with `blocks` laid over it.
pub struct Overlay {
    core: DeviceCore,
    base: Arc<Base>,
    blocks: RwLock<HashMap<u64, Box<[u8]>>>,
}

impl std::fmt::Debug for Overlay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overlay")
            .field("block_size", &self.base.block_size)
            .field("overridden", &self.blocks.read().len())
            .finish()
    }
}

impl Overlay {
    pub fn new(base: Arc<Base>, blocks: HashMap<u64, Box<[u8]>>) -> io::Result<Overlay> {
        let core = DeviceCore::new(base.block_size, base.num_blocks())?;
        Ok(Overlay {
            core,
            base,
            blocks: RwLock::new(blocks),
        })
    }

    /// How many blocks differ from the base.
    pub fn overridden(&self) -> usize {
        self.blocks.read().len()
    }

    /// The whole image (for saving a reproducer's state as a plain image).
    pub fn to_image(&self) -> Vec<u8> {
        let mut v = self.base.bytes.clone();
        let bs = self.base.block_size as usize;
        for (&b, d) in self.blocks.read().iter() {
            v[b as usize * bs..(b as usize + 1) * bs].copy_from_slice(d);
        }
        v
    }
}

impl BlockDevice for Overlay {
    fn block_size(&self) -> u32 {
        self.core.block_size()
    }

    fn num_blocks(&self) -> u64 {
        self.core.num_blocks()
    }

    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        let (_, blocks) = self.core.check(block, buf.len())?;
        if blocks == 0 {
            return Ok(());
        }
        let at = self.core.now();
        let bs = self.base.block_size as usize;
        let map = self.blocks.read();
        if map.is_empty() {
            let off = block as usize * bs;
            buf.copy_from_slice(&self.base.bytes[off..off + buf.len()]);
        } else {
            for (i, out) in buf.chunks_exact_mut(bs).enumerate() {
                let b = block + i as u64;
                match map.get(&b) {
                    Some(d) => out.copy_from_slice(d),
                    None => out.copy_from_slice(self.base.block(b)),
                }
            }
        }
        drop(map);
        self.core.done_read(block, blocks, at);
        Ok(())
    }

    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()> {
        let (_, blocks) = self.core.check(block, buf.len())?;
        if blocks == 0 {
            return Ok(());
        }
        let at = self.core.now();
        let bs = self.base.block_size as usize;
        let mut map = self.blocks.write();
        for (i, d) in buf.chunks_exact(bs).enumerate() {
            map.insert(block + i as u64, Box::from(d));
        }
        drop(map);
        self.core.done_write(block, buf, at);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let at = self.core.now();
        self.core.done_flush(at);
        Ok(())
    }

    fn counters(&self) -> &DeviceCounters {
        self.core.counters()
    }

    fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>) {
        self.core.set_trace(sink);
    }
}

/// Blocks `first..first + blocks` of another device, as a device: the file system's and
/// the log's part of a two-device state (reads and writes go to the shared overlay).
pub struct Slice {
    core: DeviceCore,
    inner: Arc<dyn BlockDevice>,
    first: u64,
}

impl std::fmt::Debug for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slice")
            .field("first", &self.first)
            .field("blocks", &self.core.num_blocks())
            .finish()
    }
}

impl Slice {
    /// `blocks` is clamped to what `inner` has past `first`.
    pub fn new(inner: Arc<dyn BlockDevice>, first: u64, blocks: u64) -> io::Result<Slice> {
        let blocks = blocks.min(inner.num_blocks().saturating_sub(first));
        let core = DeviceCore::new(inner.block_size(), blocks)?;
        Ok(Slice { core, inner, first })
    }
}

impl BlockDevice for Slice {
    fn block_size(&self) -> u32 {
        self.core.block_size()
    }

    fn num_blocks(&self) -> u64 {
        self.core.num_blocks()
    }

    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        let (_, blocks) = self.core.check(block, buf.len())?;
        if blocks == 0 {
            return Ok(());
        }
        let at = self.core.now();
        self.inner.read_blocks(self.first + block, buf)?;
        self.core.done_read(block, blocks, at);
        Ok(())
    }

    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()> {
        let (_, blocks) = self.core.check(block, buf.len())?;
        if blocks == 0 {
            return Ok(());
        }
        let at = self.core.now();
        self.inner.write_blocks(self.first + block, buf)?;
        self.core.done_write(block, buf, at);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let at = self.core.now();
        self.inner.flush()?;
        self.core.done_flush(at);
        Ok(())
    }

    fn counters(&self) -> &DeviceCounters {
        self.core.counters()
    }

    fn set_trace(&self, sink: Option<Arc<dyn TraceSink>>) {
        self.core.set_trace(sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prefer_the_overlay_and_writes_never_touch_the_base() {
        let mut base = Base::zeroed(512, 4);
        base.block_mut(1).fill(1);
        base.block_mut(2).fill(2);
        let base = Arc::new(base);
        let mut m = HashMap::new();
        m.insert(2u64, vec![9u8; 512].into_boxed_slice());
        let o = Overlay::new(base.clone(), m).unwrap();
        let mut buf = vec![0u8; 512 * 3];
        o.read_blocks(1, &mut buf).unwrap();
        assert!(buf[..512].iter().all(|&b| b == 1));
        assert!(buf[512..1024].iter().all(|&b| b == 9));
        assert!(buf[1024..].iter().all(|&b| b == 0));
        o.write_blocks(3, &[7u8; 512]).unwrap();
        o.read_blocks(3, &mut buf[..512]).unwrap();
        assert!(buf[..512].iter().all(|&b| b == 7));
        assert!(base.block(3).iter().all(|&b| b == 0));
        assert_eq!(o.overridden(), 2);
        let img = o.to_image();
        assert_eq!((img[512], img[1024], img[1536]), (1, 9, 7));
        assert!(o.read_blocks(4, &mut buf[..512]).is_err());
    }

    #[test]
    fn slices_are_windows_of_one_overlay() {
        let mut base = Base::zeroed(512, 6);
        base.block_mut(4).fill(4);
        let o: Arc<dyn BlockDevice> =
            Arc::new(Overlay::new(Arc::new(base), HashMap::new()).unwrap());
        let fs = Slice::new(o.clone(), 0, 4).unwrap();
        let log = Slice::new(o.clone(), 4, 2).unwrap();
        assert_eq!((fs.num_blocks(), log.num_blocks()), (4, 2));
        let mut b = vec![0u8; 512];
        log.read_blocks(0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 4));
        log.write_blocks(1, &[5u8; 512]).unwrap();
        o.read_blocks(5, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 5));
        // Neither reaches past its end into the other.
        assert!(fs.read_blocks(4, &mut b).is_err());
        assert!(log.write_blocks(2, &b).is_err());
        // Clamped to the device.
        assert_eq!(Slice::new(o, 5, 9).unwrap().num_blocks(), 1);
    }
}
