//! Recording: every block write (with its contents) and flush a workload issues, in order,
//! interleaved with markers for the file-system operations that caused them.
//!
//! A [`Recorder`] is a [`TraceSink`]: install it on any device (`set_trace`) and it keeps the
//! writes and flushes the device completes. Multi-block writes are split into one event per
//! block, because the device model lets a crash keep any subset of the blocks of a write
//! (DESIGN.md, "Assumptions about the device"). Operation markers come from
//! [`crate::RecordingFs`], which wraps the file system the application talks to: a
//! [`Event::Begin`] when the call enters, an [`Event::End`] when it returns — the moment the
//! application may rely on the mode's durability promise.
//!
//! The same event stream is kept in memory for in-process workloads and written as JSON
//! lines for `cairn mount -o record=FILE` (see [`Recorder::to_file`] and [`load`]).
//!
//! **Two devices.** A journal with its log on a device of its own (`log=dev`, 001's
//! LFFS-wafs-2*) writes to two devices; both are recorded into the one event stream, in the
//! order their writes and flushes completed: the second device's blocks are numbered after
//! the first's ([`Header::log_blocks`]), and its flushes are [`Event::LogFlush`] (see
//! [`Recorder::second_device`]). A flush of either device says nothing about the other's
//! writes: [`crate::states`] keeps one flush frontier per device.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_blockdev::{TraceEvent, TraceOp, TraceSink};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::Error;

/// Contents of one recorded block. Blocks of zeros (mkfs's inode tables) are kept as a
/// marker so recordings and reproducers stay small.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockData {
    Zero,
    Bytes(Arc<[u8]>),
}

impl BlockData {
    pub fn from_slice(b: &[u8]) -> BlockData {
        if b.iter().all(|&x| x == 0) {
            BlockData::Zero
        } else {
            BlockData::Bytes(Arc::from(b))
        }
    }

    /// Copies the contents into `out` (a whole block).
    pub fn copy_to(&self, out: &mut [u8]) {
        match self {
            BlockData::Zero => out.fill(0),
            BlockData::Bytes(b) => out.copy_from_slice(&b[..out.len()]),
        }
    }
}

/// A file-system operation as the oracle needs it. Paths are relative to the root, `/`
/// separated, without a leading slash (the root itself is `""`). Files are named by their
/// inode number where the call names them that way (write, fsync, setattr), because an open
/// file may have several names or none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Op {
    Create {
        path: String,
    },
    /// An unnamed file made in directory `dir` (open(2) with O_TMPFILE): no name until a
    /// link gives it one.
    Tmpfile {
        dir: String,
    },
    Mkdir {
        path: String,
    },
    Mknod {
        path: String,
    },
    Symlink {
        path: String,
        target: String,
    },
    Link {
        ino: u64,
        path: String,
    },
    Unlink {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Rename {
        from: String,
        to: String,
        /// RENAME_WHITEOUT: `from` is left naming a new whiteout (a 0/0 character device)
        /// in the same call. Absent in recordings made before whiteouts (false).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        whiteout: bool,
    },
    /// Data written at `offset` (kept so the oracle knows what an fsynced file must hold).
    Write {
        ino: u64,
        offset: u64,
        #[serde(with = "b64")]
        data: Arc<[u8]>,
    },
    Truncate {
        ino: u64,
        size: u64,
    },
    Chmod {
        ino: u64,
        mode: u32,
    },
    /// Another setattr (times, owner): no effect on what the oracle compares.
    SetAttr {
        ino: u64,
    },
    Fsync {
        ino: u64,
    },
    Fsyncdir {
        path: String,
    },
    /// The last close of a handle (may free an unlinked inode).
    Release {
        ino: u64,
    },
    /// The kernel dropped its references to an inode (may free an unlinked inode: where a
    /// real mount frees most of them). No effect on names or contents.
    Forget {
        ino: u64,
    },
    /// sync(2): everything written so far is durable when it returns.
    SyncAll,
    /// Unmount: everything is durable when it returns.
    Unmount,
    /// A call the recorder could not describe (an inode it never saw named): the oracle
    /// stops comparing names once one has returned.
    Unknown {
        what: String,
    },
}

impl Op {
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Create { .. } => "create",
            Op::Tmpfile { .. } => "tmpfile",
            Op::Mkdir { .. } => "mkdir",
            Op::Mknod { .. } => "mknod",
            Op::Symlink { .. } => "symlink",
            Op::Link { .. } => "link",
            Op::Unlink { .. } => "unlink",
            Op::Rmdir { .. } => "rmdir",
            Op::Rename { .. } => "rename",
            Op::Write { .. } => "write",
            Op::Truncate { .. } => "truncate",
            Op::Chmod { .. } => "chmod",
            Op::SetAttr { .. } => "setattr",
            Op::Fsync { .. } => "fsync",
            Op::Fsyncdir { .. } => "fsyncdir",
            Op::Release { .. } => "release",
            Op::Forget { .. } => "forget",
            Op::SyncAll => "sync",
            Op::Unmount => "unmount",
            Op::Unknown { .. } => "unknown",
        }
    }

    /// The path the operation names first, for reports.
    pub fn path(&self) -> String {
        match self {
            Op::Create { path }
            | Op::Mkdir { path }
            | Op::Mknod { path }
            | Op::Symlink { path, .. }
            | Op::Link { path, .. }
            | Op::Unlink { path }
            | Op::Rmdir { path }
            | Op::Fsyncdir { path }
            | Op::Tmpfile { dir: path } => path.clone(),
            Op::Rename { from, to, whiteout } => {
                format!(
                    "{from} -> {to}{}",
                    if *whiteout { " (whiteout)" } else { "" }
                )
            }
            Op::Write { ino, .. }
            | Op::Truncate { ino, .. }
            | Op::Chmod { ino, .. }
            | Op::SetAttr { ino }
            | Op::Fsync { ino }
            | Op::Release { ino }
            | Op::Forget { ino } => format!("#{ino}"),
            Op::SyncAll | Op::Unmount => String::new(),
            Op::Unknown { what } => what.clone(),
        }
    }
}

/// What a call returned, as far as the oracle cares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResult {
    /// 0 on success, else the errno.
    pub errno: i32,
    /// The inode the call created or named (create, mkdir, link, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ino: Option<u64>,
    /// Its permission bits after the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perm: Option<u16>,
    /// Its generation (tells a file from an earlier one that had the same inode number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
}

impl OpResult {
    pub fn ok(&self) -> bool {
        self.errno == 0
    }
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// One block reached the device's (volatile) cache. `cont`: it is not the first block
    /// of the device write it belongs to (a multi-block write is split into one event per
    /// block; `crate::states` cuts crash states at the boundaries of device writes too —
    /// an LFS partial segment is one device write).
    Write {
        block: u64,
        data: BlockData,
        cont: bool,
    },
    /// A durability barrier of the (first) device returned: its writes before it are
    /// durable. It says nothing about a second device's writes.
    Flush,
    /// A durability barrier of the second device (a journal's log device) returned: its
    /// writes before it are durable, and nothing more.
    LogFlush,
    /// An operation entered the file system.
    Begin { id: u64, op: Op },
    /// The operation returned to the application.
    End { id: u64, result: OpResult },
}

/// Where the device's contents before the first event come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Base {
    /// All zeros: the recording starts before mkfs.
    Zero,
    /// A copy of the image taken before the recording started.
    File(PathBuf),
}

/// The recording's first line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// Format version of the recording file.
    pub recording: u32,
    pub block_size: u32,
    pub num_blocks: u64,
    pub base: Base,
    /// The mode the workload ran in.
    pub mode: String,
    /// The workload's name (for reports).
    pub workload: String,
    /// Crash states are generated from this event on (earlier events: mkfs, mount, setup).
    pub start: usize,
    /// Workload data is tagged (see `workload::tag`), so stale data can be recognized.
    #[serde(default)]
    pub tagged: bool,
    /// Blocks of a second device recorded with the first (a journal's log device,
    /// `log=dev`): its block `b` is block `num_blocks + b` of the recording, and its
    /// flushes are [`Event::LogFlush`]. 0: one device.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub log_blocks: u64,
    /// Set in reproducer files: the crash state and what was found in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repro: Option<crate::repro::Repro>,
}

pub const FORMAT: u32 = 1;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Header {
    /// Blocks of every recorded device together (the first's, then the second's).
    pub fn total_blocks(&self) -> u64 {
        self.num_blocks.saturating_add(self.log_blocks)
    }

    /// Whether `block` (of the recording's numbering) is on the second device.
    pub fn on_log_device(&self, block: u64) -> bool {
        block >= self.num_blocks
    }
}

/// A complete recording.
#[derive(Clone, Debug)]
pub struct Recording {
    pub header: Header,
    pub events: Vec<Event>,
}

/// Collects events in memory (a [`TraceSink`] for the device, plus the operation markers).
pub struct Recorder {
    block_size: usize,
    events: Mutex<Vec<Event>>,
    out: Option<Mutex<BufWriter<File>>>,
    next_op: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("block_size", &self.block_size)
            .field("events", &self.events.lock().len())
            .finish()
    }
}

impl Recorder {
    /// Keeps events in memory.
    pub fn new(block_size: u32) -> Recorder {
        Recorder {
            block_size: block_size as usize,
            events: Mutex::new(Vec::new()),
            out: None,
            next_op: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// Streams events as JSON lines to `path` (after `header`) instead of keeping them: a
    /// long-running mount must not hold every write in memory.
    pub fn to_file(path: &Path, header: &Header) -> Result<Recorder, Error> {
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        serde_json::to_writer(&mut w, header).map_err(|e| Error::Format(e.to_string()))?;
        w.write_all(b"\n").map_err(|e| Error::io(path, e))?;
        Ok(Recorder {
            block_size: header.block_size as usize,
            events: Mutex::new(Vec::new()),
            out: Some(Mutex::new(w)),
            next_op: std::sync::atomic::AtomicU64::new(1),
        })
    }

    fn push(&self, ev: Event) {
        match &self.out {
            None => self.events.lock().push(ev),
            Some(out) => {
                let mut out = out.lock();
                // A full disk must not fail the I/O being recorded: the recording ends short.
                if serde_json::to_writer(&mut *out, &Line::from(&ev)).is_ok() {
                    let _ = out.write_all(b"\n");
                }
            }
        }
    }

    /// Writes out what is buffered (file recordings).
    pub fn finish(&self) -> io::Result<()> {
        match &self.out {
            Some(out) => out.lock().flush(),
            None => Ok(()),
        }
    }

    /// Marks an operation's entry; returns its id.
    pub fn begin(&self, op: Op) -> u64 {
        let id = self
            .next_op
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.push(Event::Begin { id, op });
        id
    }

    /// Marks an operation's return.
    pub fn end(&self, id: u64, result: OpResult) {
        self.push(Event::End { id, result });
    }

    /// Number of events so far (in-memory recorders).
    pub fn len(&self) -> usize {
        self.events.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The events so far (in-memory recorders).
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// A sink for a second device (a journal's log device) recorded into the same stream:
    /// its block `b` is recorded as block `first_blocks + b`, its flushes as
    /// [`Event::LogFlush`]. Both devices push into one stream, so the events keep the order
    /// in which the two devices completed them.
    pub fn second_device(self: &Arc<Self>, first_blocks: u64) -> Arc<dyn TraceSink> {
        Arc::new(SecondDevice {
            rec: Arc::clone(self),
            offset: first_blocks,
        })
    }
}

/// See [`Recorder::second_device`].
struct SecondDevice {
    rec: Arc<Recorder>,
    offset: u64,
}

impl TraceSink for SecondDevice {
    fn record(&self, ev: &TraceEvent, data: Option<&[u8]>) {
        match ev.op {
            TraceOp::Read => {}
            TraceOp::Flush => self.rec.push(Event::LogFlush),
            TraceOp::Write | TraceOp::Zero => {
                let moved = TraceEvent {
                    block: ev.block + self.offset,
                    ..ev.clone()
                };
                self.rec.record(&moved, data);
            }
        }
    }
}

impl TraceSink for Recorder {
    fn record(&self, ev: &TraceEvent, data: Option<&[u8]>) {
        match ev.op {
            TraceOp::Read => {}
            TraceOp::Flush => self.push(Event::Flush),
            TraceOp::Write => {
                let Some(data) = data else { return };
                let bs = self.block_size.max(1);
                for (i, chunk) in data.chunks_exact(bs).enumerate() {
                    self.push(Event::Write {
                        block: ev.block + i as u64,
                        data: BlockData::from_slice(chunk),
                        cont: i > 0,
                    });
                }
            }
            // A zero-range request is a write of zeros to each of its blocks, torn like
            // any multi-block write: a crash state may hold any subset of them.
            TraceOp::Zero => {
                for i in 0..u64::from(ev.blocks) {
                    self.push(Event::Write {
                        block: ev.block + i,
                        data: BlockData::Zero,
                        cont: i > 0,
                    });
                }
            }
        }
    }
}

/// One line of a recording file after the header.
#[derive(Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum Line {
    /// A block write; `d` is absent for a block of zeros; `c` is true for a block after
    /// the first of a multi-block device write (absent: the write's first block).
    W {
        b: u64,
        #[serde(default, skip_serializing_if = "Option::is_none", with = "b64opt")]
        d: Option<Arc<[u8]>>,
        #[serde(default, skip_serializing_if = "is_false")]
        c: bool,
    },
    F,
    /// A flush of the second device.
    Lf,
    B {
        id: u64,
        op: Op,
    },
    E {
        id: u64,
        #[serde(flatten)]
        r: OpResult,
    },
}

impl From<&Event> for Line {
    fn from(ev: &Event) -> Line {
        match ev {
            Event::Write { block, data, cont } => Line::W {
                b: *block,
                d: match data {
                    BlockData::Zero => None,
                    BlockData::Bytes(b) => Some(b.clone()),
                },
                c: *cont,
            },
            Event::Flush => Line::F,
            Event::LogFlush => Line::Lf,
            Event::Begin { id, op } => Line::B {
                id: *id,
                op: op.clone(),
            },
            Event::End { id, result } => Line::E {
                id: *id,
                r: result.clone(),
            },
        }
    }
}

impl Recording {
    /// Writes the recording as JSON lines.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let f = File::create(path).map_err(|e| Error::io(path, e))?;
        let mut w = BufWriter::new(f);
        let fmt = |e: serde_json::Error| Error::Format(e.to_string());
        serde_json::to_writer(&mut w, &self.header).map_err(fmt)?;
        w.write_all(b"\n").map_err(|e| Error::io(path, e))?;
        for ev in &self.events {
            serde_json::to_writer(&mut w, &Line::from(ev)).map_err(fmt)?;
            w.write_all(b"\n").map_err(|e| Error::io(path, e))?;
        }
        w.flush().map_err(|e| Error::io(path, e))
    }

    /// The crash-state epochs of this recording (see [`crate::states`]).
    pub fn block_size(&self) -> u32 {
        self.header.block_size
    }
}

/// Reads a recording written by [`Recording::save`] or a [`Recorder::to_file`] recorder. A
/// recording cut short (a daemon that was killed) loses only its last, partial line.
pub fn load(path: &Path) -> Result<Recording, Error> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut lines = BufReader::new(f).lines();
    let first = lines
        .next()
        .ok_or_else(|| Error::Format(format!("{}: empty recording", path.display())))?
        .map_err(|e| Error::io(path, e))?;
    let mut header: Header = serde_json::from_str(&first)
        .map_err(|e| Error::Format(format!("{}: bad header: {e}", path.display())))?;
    if header.recording != FORMAT {
        return Err(Error::Format(format!(
            "{}: recording format {} (this build reads {FORMAT})",
            path.display(),
            header.recording
        )));
    }
    if !header.block_size.is_power_of_two() || header.block_size < 512 {
        return Err(Error::Format(format!(
            "{}: bad block size {}",
            path.display(),
            header.block_size
        )));
    }
    // A relative base path is relative to the recording's directory.
    if let Base::File(p) = &header.base
        && p.is_relative()
        && let Some(dir) = path.parent()
    {
        header.base = Base::File(dir.join(p));
    }
    let bs = header.block_size as usize;
    let mut events = Vec::new();
    let mut lines = lines.peekable();
    let mut n = 1usize;
    while let Some(line) = lines.next() {
        n += 1;
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = match serde_json::from_str(&line) {
            Ok(l) => l,
            // A torn last line of a killed recorder is expected; anything else is damage.
            Err(_) if lines.peek().is_none() => break,
            Err(e) => {
                return Err(Error::Format(format!("{}:{n}: {e}", path.display())));
            }
        };
        events.push(match parsed {
            Line::W { b, d, c } => {
                if b >= header.total_blocks() {
                    return Err(Error::Format(format!(
                        "{}:{n}: block {b} beyond the device ({} blocks)",
                        path.display(),
                        header.total_blocks()
                    )));
                }
                Event::Write {
                    block: b,
                    data: match d {
                        None => BlockData::Zero,
                        Some(d) if d.len() == bs => BlockData::Bytes(d),
                        Some(d) => {
                            return Err(Error::Format(format!(
                                "{}:{n}: block of {} bytes, expected {bs}",
                                path.display(),
                                d.len()
                            )));
                        }
                    },
                    cont: c,
                }
            }
            Line::F => Event::Flush,
            Line::Lf => Event::LogFlush,
            Line::B { id, op } => Event::Begin { id, op },
            Line::E { id, r } => Event::End { id, result: r },
        });
    }
    if header.start > events.len() {
        header.start = events.len();
    }
    Ok(Recording { header, events })
}

/// Standard base64 (RFC 4648, with padding): write contents in JSON at 4/3 of their size.
pub mod b64 {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(data: &[u8]) -> String {
        let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
        for c in data.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(s: &str) -> Result<Vec<u8>, String> {
        let s = s.as_bytes();
        if !s.len().is_multiple_of(4) {
            return Err("base64 length is not a multiple of 4".into());
        }
        let val = |c: u8| -> Result<u32, String> {
            Ok(match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                _ => return Err(format!("bad base64 byte {c:#x}")),
            } as u32)
        };
        let mut out = Vec::with_capacity(s.len() / 4 * 3);
        for (k, q) in s.chunks(4).enumerate() {
            let last = k == s.len() / 4 - 1;
            let pad = q.iter().rev().take_while(|&&c| c == b'=').count();
            if pad > 2 || (pad > 0 && !last) {
                return Err("misplaced base64 padding".into());
            }
            let mut n = 0u32;
            for &c in &q[..4 - pad] {
                n = (n << 6) | val(c)?;
            }
            n <<= 6 * pad as u32;
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.extend_from_slice(&bytes[..3 - pad]);
        }
        Ok(out)
    }

    pub fn serialize<S: Serializer>(d: &Arc<[u8]>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<[u8]>, D::Error> {
        let s = String::deserialize(d)?;
        decode(&s).map(Arc::from).map_err(serde::de::Error::custom)
    }
}

mod b64opt {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Arc<[u8]>>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&super::b64::encode(d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<[u8]>>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        match s {
            None => Ok(None),
            Some(s) => super::b64::decode(&s)
                .map(|v| Some(Arc::from(v)))
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Copies an image file to `to`, skipping runs of zeros so the copy stays sparse: the base
/// of a `cairn mount -o record=FILE` recording.
pub fn snapshot_image(from: &Path, to: &Path) -> Result<(), Error> {
    use std::io::{Read, Seek, SeekFrom};
    let mut src = File::open(from).map_err(|e| Error::io(from, e))?;
    let len = src.metadata().map_err(|e| Error::io(from, e))?.len();
    let mut dst = File::create(to).map_err(|e| Error::io(to, e))?;
    dst.set_len(len).map_err(|e| Error::io(to, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = src.read(&mut buf).map_err(|e| Error::io(from, e))?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|&b| b != 0) {
            dst.seek(SeekFrom::Start(off))
                .map_err(|e| Error::io(to, e))?;
            dst.write_all(&buf[..n]).map_err(|e| Error::io(to, e))?;
        }
        off += n as u64;
    }
    dst.sync_all().map_err(|e| Error::io(to, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_blockdev::{BlockDevice, MemDevice};

    #[test]
    fn base64_round_trips_every_length() {
        for len in 0usize..40 {
            let d: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let e = b64::encode(&d);
            assert_eq!(e.len(), len.div_ceil(3) * 4);
            assert_eq!(b64::decode(&e).unwrap(), d, "{len}");
        }
        assert_eq!(b64::encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64::encode(b"fo"), "Zm8=");
        assert!(b64::decode("Zm8").is_err());
        assert!(b64::decode("Z=8=").is_err());
        assert!(b64::decode("Zm!=").is_err());
    }

    #[test]
    fn recorder_splits_writes_into_blocks_and_keeps_order() {
        let dev = MemDevice::new(512, 16);
        let rec = Arc::new(Recorder::new(512));
        dev.set_trace(Some(rec.clone()));
        let id = rec.begin(Op::Mkdir { path: "d".into() });
        let mut two = vec![0u8; 1024];
        two[600] = 9;
        dev.write_blocks(3, &two).unwrap();
        dev.read_blocks(0, &mut [0; 512]).unwrap();
        dev.flush().unwrap();
        rec.end(
            id,
            OpResult {
                errno: 0,
                ino: Some(5),
                perm: None,
                generation: None,
            },
        );
        let evs = rec.events();
        assert_eq!(evs.len(), 5);
        assert_eq!(
            evs[1],
            Event::Write {
                block: 3,
                data: BlockData::Zero,
                cont: false,
            }
        );
        match &evs[2] {
            Event::Write {
                block: 4,
                data: BlockData::Bytes(b),
                cont: true,
            } => assert_eq!(b[600 - 512], 9),
            e => panic!("{e:?}"),
        }
        assert_eq!(evs[3], Event::Flush);
        assert!(matches!(evs[4], Event::End { id: 1, .. }));
    }

    /// A zero-range request (fallocate's new blocks) is recorded as a write of zeros to
    /// each block, over what the blocks held, on either device: a crash state may show any
    /// subset of them, as for a multi-block write.
    #[test]
    fn recorder_sees_zero_range_writes_as_writes_of_zeros() {
        let dev = MemDevice::new(512, 16);
        let log = MemDevice::new(512, 8);
        let rec = Arc::new(Recorder::new(512));
        dev.set_trace(Some(rec.clone()));
        log.set_trace(Some(rec.second_device(16)));
        dev.write_blocks(4, &[7; 3 * 512]).unwrap();
        dev.zero_blocks(4, 3).unwrap();
        log.zero_blocks(1, 2).unwrap();
        dev.flush().unwrap();
        let writes: Vec<(u64, bool, bool)> = rec
            .events()
            .iter()
            .filter_map(|e| match e {
                Event::Write { block, data, cont } => {
                    Some((*block, *data == BlockData::Zero, *cont))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            writes,
            vec![
                (4, false, false),
                (5, false, true),
                (6, false, true),
                (4, true, false),
                (5, true, true),
                (6, true, true),
                (17, true, false),
                (18, true, true),
            ]
        );
        assert_eq!(rec.events().last(), Some(&Event::Flush));
    }

    #[test]
    fn save_and_load_round_trip_and_tolerate_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let mut blk = vec![0u8; 512];
        blk[7] = 1;
        let rec = Recording {
            header: Header {
                recording: FORMAT,
                block_size: 512,
                num_blocks: 8,
                base: Base::Zero,
                mode: "sync".into(),
                workload: "t".into(),
                start: 1,
                tagged: true,
                log_blocks: 0,
                repro: None,
            },
            events: vec![
                Event::Write {
                    block: 1,
                    data: BlockData::Bytes(blk.into()),
                    cont: false,
                },
                Event::Begin {
                    id: 1,
                    op: Op::Write {
                        ino: 3,
                        offset: 16,
                        data: Arc::from(&b"abc"[..]),
                    },
                },
                Event::Write {
                    block: 2,
                    data: BlockData::Zero,
                    cont: true,
                },
                Event::Flush,
                Event::End {
                    id: 1,
                    result: OpResult {
                        errno: 0,
                        ino: None,
                        perm: None,
                        generation: None,
                    },
                },
            ],
        };
        rec.save(&p).unwrap();
        let back = load(&p).unwrap();
        assert_eq!(back.header, rec.header);
        assert_eq!(back.events, rec.events);
        // A killed recorder leaves half a line: it is dropped, the rest loads.
        let mut text = std::fs::read_to_string(&p).unwrap();
        text.push_str("{\"t\":\"w\",\"b\":3,\"d\":\"AA");
        std::fs::write(&p, &text).unwrap();
        assert_eq!(load(&p).unwrap().events.len(), 5);
        // A block beyond the device is refused, not trusted.
        let bad = text.replace("\"b\":2", "\"b\":99");
        std::fs::write(&p, bad).unwrap();
        assert!(load(&p).is_err());
    }

    #[test]
    fn file_recorder_streams_lines_that_load() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let header = Header {
            recording: FORMAT,
            block_size: 512,
            num_blocks: 4,
            base: Base::File("r.jsonl.base".into()),
            mode: "async".into(),
            workload: "mount".into(),
            start: 0,
            tagged: false,
            log_blocks: 0,
            repro: None,
        };
        let rec = Arc::new(Recorder::to_file(&p, &header).unwrap());
        let dev = MemDevice::new(512, 4);
        dev.set_trace(Some(rec.clone()));
        dev.write_blocks(1, &[5u8; 512]).unwrap();
        dev.flush().unwrap();
        rec.finish().unwrap();
        let back = load(&p).unwrap();
        assert_eq!(back.events.len(), 2);
        assert_eq!(
            back.header.base,
            Base::File(dir.path().join("r.jsonl.base"))
        );
    }

    #[test]
    fn a_second_device_records_into_the_same_stream_and_round_trips() {
        let fs = MemDevice::new(512, 8);
        let log = MemDevice::new(512, 4);
        let rec = Arc::new(Recorder::new(512));
        fs.set_trace(Some(rec.clone()));
        log.set_trace(Some(rec.second_device(8)));
        log.write_blocks(1, &[1u8; 1024]).unwrap();
        log.flush().unwrap();
        fs.write_blocks(7, &[2u8; 512]).unwrap();
        fs.flush().unwrap();
        let evs = rec.events();
        let blocks: Vec<String> = evs
            .iter()
            .map(|e| match e {
                Event::Write { block, .. } => format!("w{block}"),
                Event::Flush => "f".into(),
                Event::LogFlush => "lf".into(),
                _ => "?".into(),
            })
            .collect();
        assert_eq!(blocks, ["w9", "w10", "lf", "w7", "f"]);
        let header = Header {
            recording: FORMAT,
            block_size: 512,
            num_blocks: 8,
            base: Base::Zero,
            mode: "journal-2sync".into(),
            workload: "t".into(),
            start: 0,
            tagged: false,
            log_blocks: 4,
            repro: None,
        };
        assert!(header.on_log_device(9) && !header.on_log_device(7));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        let r = Recording {
            header: header.clone(),
            events: evs,
        };
        r.save(&p).unwrap();
        let back = load(&p).unwrap();
        assert_eq!((back.header, back.events), (header, r.events.clone()));
        // A block beyond both devices is refused.
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text.replace("\"b\":10", "\"b\":12")).unwrap();
        assert!(load(&p).is_err());
        // A one-device recording keeps its old header (no log_blocks field).
        assert!(
            !serde_json::to_string(&Header {
                log_blocks: 0,
                ..r.header
            })
            .unwrap()
            .contains("log_blocks")
        );
    }

    #[test]
    fn snapshot_copies_contents() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let mut data = vec![0u8; 3 << 20];
        data[(2 << 20) + 5] = 7;
        std::fs::write(&a, &data).unwrap();
        snapshot_image(&a, &b).unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), data);
    }
}
