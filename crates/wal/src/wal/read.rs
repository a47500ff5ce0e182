//! Keyed and sequential reads (001 §5.2: "it can return data by sequential or keyed reads").

use super::*;

impl Wal {
    // ----- reading -----------------------------------------------------------------------

    /// The bytes `[lsn, lsn + len)` of the log: the part still in memory from there, the rest
    /// from the device (bytes below `buf_start` were written and are not written again).
    pub(super) fn read_bytes(&self, lsn: u64, len: u64) -> Result<Vec<u8>, WalError> {
        let (mem, dev_end) = {
            let st = self.st.lock();
            let end = lsn + len;
            if end > st.end {
                return Err(WalError::NotAppended(Lsn(lsn)));
            }
            if end <= st.buf_start {
                (Vec::new(), end)
            } else {
                let from = lsn.max(st.buf_start);
                let a = (from - st.buf_start) as usize;
                let b = (end - st.buf_start) as usize;
                (st.buf[a..b].to_vec(), from)
            }
        };
        let mut out = if dev_end > lsn {
            self.geo.read(&*self.dev, lsn, dev_end - lsn)?
        } else {
            Vec::new()
        };
        out.extend_from_slice(&mem);
        Ok(out)
    }

    /// Keyed read (001 §5.2): the record at `lsn`.
    pub fn read(&self, lsn: Lsn) -> Result<Record, WalError> {
        let (ckpt, end) = {
            let st = self.st.lock();
            (st.checkpoint, st.end)
        };
        if lsn.0 < ckpt {
            return Err(WalError::Released {
                lsn,
                checkpoint: Lsn(ckpt),
            });
        }
        if lsn.0 >= end {
            return Err(WalError::NotAppended(lsn));
        }
        let head = self.read_bytes(lsn.0, REC_HEADER as u64)?;
        let h = match RecordHeader::decode(&head) {
            Ok(h) if h.lsn == lsn.0 && lsn.0 + h.size() <= end => h,
            _ => return Err(WalError::NotARecord(lsn)),
        };
        let whole = self.read_bytes(lsn.0, REC_HEADER as u64 + u64::from(h.len))?;
        self.record_of(lsn, h, whole)
    }

    pub(super) fn record_of(
        &self,
        lsn: Lsn,
        h: RecordHeader,
        mut whole: Vec<u8>,
    ) -> Result<Record, WalError> {
        if !h.crc_ok(&self.uuid, &whole, &whole[REC_HEADER..]) {
            return Err(WalError::CorruptRecord(lsn));
        }
        whole.drain(..REC_HEADER);
        Ok(Record {
            lsn,
            epoch: h.epoch,
            data: whole,
        })
    }

    /// Sequential read (001 §5.2): the records from `from` (a record's LSN, e.g. the
    /// checkpoint) up to the end as of this call.
    pub fn scan(&self, from: Lsn) -> Scan<'_> {
        let st = self.st.lock();
        Scan {
            wal: self,
            pos: from.0,
            end: st.end,
            on_device: st.buf_start,
            start_error: (from.0 < st.checkpoint).then_some(WalError::Released {
                lsn: from,
                checkpoint: Lsn(st.checkpoint),
            }),
            win: Window::new(&*self.dev, self.geo),
            done: false,
        }
    }
}

/// Iterator of [`Wal::scan`]. Stops after the first error.
pub struct Scan<'a> {
    wal: &'a Wal,
    pos: u64,
    end: u64,
    /// Bytes below this were on the device when the scan began (read ahead in a window).
    on_device: u64,
    start_error: Option<WalError>,
    win: Window<'a>,
    done: bool,
}

impl Scan<'_> {
    fn fetch(&mut self, lsn: u64, len: u64) -> Result<Vec<u8>, WalError> {
        if lsn + len <= self.on_device {
            Ok(self.win.get(lsn, len)?.to_vec())
        } else {
            self.wal.read_bytes(lsn, len)
        }
    }

    fn next_record(&mut self) -> Result<Record, WalError> {
        let lsn = Lsn(self.pos);
        let head = self.fetch(self.pos, REC_HEADER as u64)?;
        let h = match RecordHeader::decode(&head) {
            Ok(h) if h.lsn == self.pos && self.pos + h.size() <= self.end => h,
            _ => return Err(WalError::NotARecord(lsn)),
        };
        let whole = self.fetch(self.pos, REC_HEADER as u64 + u64::from(h.len))?;
        let r = self.wal.record_of(lsn, h, whole)?;
        self.pos += h.size();
        Ok(r)
    }
}

impl Iterator for Scan<'_> {
    type Item = Result<Record, WalError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.start_error.take() {
            self.done = true;
            return Some(Err(e));
        }
        if self.done || self.pos >= self.end {
            return None;
        }
        let r = self.next_record();
        if r.is_err() {
            self.done = true;
        }
        Some(r)
    }
}
