//! A device held in memory.

use std::io;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::{BlockDevice, DeviceCore, DeviceCounters, TraceSink};

/// A block device backed by a byte vector, for tests.
///
/// Writes are "durable" as soon as they return, so [`BlockDevice::flush`] only counts. Views
/// made with [`MemDevice::with_block_size`] share the bytes but have their own counters and
/// trace, like two opens of the same image file.
#[derive(Debug)]
pub struct MemDevice {
    core: DeviceCore,
    bytes: Arc<RwLock<Vec<u8>>>,
}

impl MemDevice {
    /// A zero-filled device of `num_blocks` blocks.
    ///
    /// # Panics
    /// If `block_size` is not a power of two in 512..=16 MiB or the size overflows `usize`:
    /// this constructor is for tests, whose parameters are constants.
    pub fn new(block_size: u32, num_blocks: u64) -> MemDevice {
        let len = u64::from(block_size)
            .checked_mul(num_blocks)
            .and_then(|n| usize::try_from(n).ok())
            .expect("MemDevice size overflows usize");
        MemDevice::from_bytes(block_size, vec![0; len])
    }

    /// A device over `bytes`; a tail shorter than a block is kept but not addressable.
    ///
    /// # Panics
    /// If `block_size` is invalid (see [`MemDevice::new`]).
    pub fn from_bytes(block_size: u32, bytes: Vec<u8>) -> MemDevice {
        MemDevice::view(block_size, Arc::new(RwLock::new(bytes)))
    }

    /// A copy of the whole storage (including any unaddressable tail).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.read().clone()
    }

    /// A second view of the same storage with another block size (e.g. to read a superblock
    /// at a fixed byte offset before the file system's block size is known).
    ///
    /// # Panics
    /// If `block_size` is invalid (see [`MemDevice::new`]).
    pub fn with_block_size(&self, block_size: u32) -> MemDevice {
        MemDevice::view(block_size, Arc::clone(&self.bytes))
    }

    fn view(block_size: u32, bytes: Arc<RwLock<Vec<u8>>>) -> MemDevice {
        let num_blocks = bytes.read().len() as u64 / u64::from(block_size.max(1));
        let core = DeviceCore::new(block_size, num_blocks).expect("invalid MemDevice block size");
        MemDevice { core, bytes }
    }
}

impl BlockDevice for MemDevice {
    fn block_size(&self) -> u32 {
        self.core.block_size()
    }

    fn num_blocks(&self) -> u64 {
        self.core.num_blocks()
    }

    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> io::Result<()> {
        let (off, blocks) = self.core.check(block, buf.len())?;
        if blocks == 0 {
            return Ok(());
        }
        let at = self.core.now();
        // In range by `check`, and the storage never shrinks, so the slice cannot panic.
        let off = off as usize;
        buf.copy_from_slice(&self.bytes.read()[off..off + buf.len()]);
        self.core.done_read(block, blocks, at);
        Ok(())
    }

    fn write_blocks(&self, block: u64, buf: &[u8]) -> io::Result<()> {
        let (off, blocks) = self.core.check(block, buf.len())?;
        if blocks == 0 {
            return Ok(());
        }
        let at = self.core.now();
        let off = off as usize;
        self.bytes.write()[off..off + buf.len()].copy_from_slice(buf);
        self.core.done_write(block, buf, at);
        Ok(())
    }

    fn zero_blocks(&self, block: u64, count: u64) -> io::Result<()> {
        let off = self.core.check_range(block, count)? as usize;
        if count == 0 {
            return Ok(());
        }
        let at = self.core.now();
        let len = count as usize * self.core.block_size() as usize;
        self.bytes.write()[off..off + len].fill(0);
        self.core.done_zero(block, count, at);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TraceOp, VecTrace};

    /// The operation, first block and length of each traced event.
    fn ops(t: &VecTrace) -> Vec<(TraceOp, u64, u32)> {
        t.events()
            .iter()
            .map(|e| (e.op, e.block, e.blocks))
            .collect()
    }

    #[test]
    fn read_back_what_was_written() {
        let d = MemDevice::new(512, 8);
        assert_eq!((d.block_size(), d.num_blocks()), (512, 8));
        let data: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
        d.write_blocks(3, &data).unwrap();
        let mut back = vec![0; 1024];
        d.read_blocks(3, &mut back).unwrap();
        assert_eq!(back, data);
        let s = d.counters().snapshot();
        assert_eq!(
            (s.reads, s.writes, s.blocks_read, s.blocks_written),
            (1, 1, 2, 2)
        );
        assert_eq!((s.bytes_read, s.bytes_written), (1024, 1024));
        // write at 3 is a seek from 0; the read at 3 after writing 3..5 is a seek too.
        assert_eq!((s.write_seeks, s.read_seeks), (1, 1));
    }

    #[test]
    fn out_of_range_and_partial_blocks_are_invalid_input_not_panics() {
        let d = MemDevice::new(512, 4);
        let mut one = vec![0; 512];
        let kind = |r: io::Result<()>| r.unwrap_err().kind();
        assert_eq!(
            kind(d.read_blocks(4, &mut one)),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(kind(d.write_blocks(4, &one)), io::ErrorKind::InvalidInput);
        assert_eq!(
            kind(d.read_blocks(3, &mut vec![0; 1024])),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(d.write_blocks(0, &one[..100])),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(d.read_blocks(u64::MAX, &mut one)),
            io::ErrorKind::InvalidInput
        );
        // Failed operations are not counted.
        assert_eq!(d.counters().snapshot(), Default::default());
    }

    #[test]
    fn views_share_storage_and_tail_is_ignored() {
        let d = MemDevice::from_bytes(1024, vec![7; 4096 + 100]);
        assert_eq!(d.num_blocks(), 4);
        let small = d.with_block_size(512);
        assert_eq!(small.num_blocks(), 8);
        small.write_blocks(2, &[9; 512]).unwrap();
        let mut b = vec![0; 1024];
        d.read_blocks(1, &mut b).unwrap();
        assert_eq!(&b[..512], &[9u8; 512][..]);
        assert_eq!(&b[512..], &[7u8; 512][..]);
        assert_eq!(d.to_bytes().len(), 4096 + 100);
        // Each view counts its own I/O.
        assert_eq!(small.counters().snapshot().writes, 1);
        assert_eq!(d.counters().snapshot().writes, 0);
    }

    #[test]
    fn trace_sees_every_operation_with_written_data() {
        let d = MemDevice::new(512, 4);
        let t = Arc::new(VecTrace::with_data());
        d.set_trace(Some(t.clone()));
        d.write_blocks(1, &[5; 1024]).unwrap();
        d.read_blocks(0, &mut [0; 512]).unwrap();
        d.flush().unwrap();
        d.set_trace(None);
        d.flush().unwrap();
        let recs = t.records();
        assert_eq!(
            ops(&t),
            vec![
                (TraceOp::Write, 1, 2),
                (TraceOp::Read, 0, 1),
                (TraceOp::Flush, 0, 0)
            ]
        );
        assert_eq!(recs[0].1.as_deref(), Some(&[5u8; 1024][..]));
        assert_eq!(recs[1].1, None);
        assert!(recs[0].0.at <= recs[2].0.at);
        assert_eq!(d.counters().snapshot().flushes, 2);
    }

    #[test]
    fn zero_blocks_is_one_traced_zero_request() {
        let d = MemDevice::new(512, 8);
        d.write_blocks(0, &[7; 8 * 512]).unwrap();
        let t = Arc::new(VecTrace::with_data());
        d.set_trace(Some(t.clone()));
        d.zero_blocks(2, 3).unwrap();
        d.zero_blocks(8, 0).unwrap();
        assert!(d.zero_blocks(6, 3).is_err());
        let recs = t.records();
        assert_eq!(recs.len(), 1);
        assert_eq!(ops(&t), vec![(TraceOp::Zero, 2, 3)]);
        assert_eq!(recs[0].1, None);
        let bytes = d.to_bytes();
        assert!(bytes[..1024].iter().all(|&b| b == 7));
        assert!(bytes[1024..2560].iter().all(|&b| b == 0));
        assert!(bytes[2560..].iter().all(|&b| b == 7));
        let s = d.counters().snapshot();
        assert_eq!((s.zeroes, s.blocks_written), (1, 8 + 3));
    }

    /// A device that does not override `zero_blocks` gets plain writes of zeros, in
    /// bounded pieces: what a device model or a crash overlay sees.
    #[test]
    fn the_default_zero_blocks_writes_zeros_in_bounded_pieces() {
        struct Plain(MemDevice);
        impl BlockDevice for Plain {
            fn block_size(&self) -> u32 {
                self.0.block_size()
            }
            fn num_blocks(&self) -> u64 {
                self.0.num_blocks()
            }
            fn read_blocks(&self, b: u64, buf: &mut [u8]) -> io::Result<()> {
                self.0.read_blocks(b, buf)
            }
            fn write_blocks(&self, b: u64, buf: &[u8]) -> io::Result<()> {
                self.0.write_blocks(b, buf)
            }
            fn flush(&self) -> io::Result<()> {
                self.0.flush()
            }
            fn counters(&self) -> &crate::DeviceCounters {
                self.0.counters()
            }
            fn set_trace(&self, sink: Option<Arc<dyn crate::TraceSink>>) {
                self.0.set_trace(sink)
            }
        }
        let d = Plain(MemDevice::from_bytes(4096, vec![9; 600 * 4096]));
        let t = Arc::new(VecTrace::with_data());
        d.set_trace(Some(t.clone()));
        d.zero_blocks(10, 300).unwrap();
        let recs = t.records();
        assert_eq!(
            ops(&t),
            vec![(TraceOp::Write, 10, 256), (TraceOp::Write, 266, 44)]
        );
        assert!(
            recs.iter()
                .all(|(_, d)| d.as_ref().unwrap().iter().all(|&b| b == 0))
        );
        assert_eq!(d.counters().snapshot().zeroes, 0);
        assert!(d.zero_blocks(599, 2).is_err());
    }
}
