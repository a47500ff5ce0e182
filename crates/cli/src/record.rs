//! `-o record=PATH`: every device operation of the mount as one JSON line
//! (`{"op":"Write","block":..,"blocks":..,"at":{"secs":..,"nanos":..}}`), in completion order,
//! for replaying or plotting a workload's I/O pattern.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use cairn_blockdev::{TraceEvent, TraceSink};
use parking_lot::Mutex;

pub struct JsonTrace {
    out: Mutex<BufWriter<File>>,
}

impl JsonTrace {
    pub fn create(path: &Path) -> Result<JsonTrace> {
        let f = File::create(path)
            .with_context(|| format!("cannot create trace {}", path.display()))?;
        Ok(JsonTrace {
            out: Mutex::new(BufWriter::with_capacity(1 << 20, f)),
        })
    }

    /// Writes out what is buffered; the daemon calls it after the final flush.
    pub fn finish(&self) -> std::io::Result<()> {
        self.out.lock().flush()
    }
}

impl TraceSink for JsonTrace {
    fn record(&self, ev: &TraceEvent, _data: Option<&[u8]>) {
        let mut out = self.out.lock();
        // A full disk must not fail the I/O being traced; the trace just ends short.
        if serde_json::to_writer(&mut *out, ev).is_ok() {
            let _ = out.write_all(b"\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_blockdev::TraceOp;
    use std::time::Duration;

    #[test]
    fn one_json_line_per_event() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.jsonl");
        let t = JsonTrace::create(&p).unwrap();
        for b in 0..3 {
            let ev = TraceEvent {
                op: TraceOp::Write,
                block: b,
                blocks: 1,
                at: Duration::from_micros(b),
            };
            t.record(&ev, Some(&[0u8; 8]));
        }
        t.finish().unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let evs: Vec<TraceEvent> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(evs.len(), 3);
        assert_eq!(evs[2].block, 2);
        assert_eq!(evs[0].op, TraceOp::Write);
    }
}
