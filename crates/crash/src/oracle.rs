//! Walking a crash state, and the durability oracle.
//!
//! [`observe`] mounts nothing itself: it walks any [`FileSystem`] (the crash state mounted
//! read-only, in process) and records every name, its inode, permissions and, for regular
//! files, the contents. A name that cannot be listed, looked up or read is a walk error:
//! the state is damaged whatever fsck said.
//!
//! [`Timeline`] replays a recording's operation markers into [`Model`]s, and
//! [`Timeline::judge`] compares an observed state with what the mode promised at the crash
//! point (issue 5 §3c):
//! - `sync` (metadata durable on return): every name must be as the operations that had
//!   returned left it, or as the operation in flight would leave it;
//! - every mode: a file whose fsync returned (and that nothing changed since) holds exactly
//!   the fsynced contents, found by its inode number wherever its name is now;
//! - every mode: what a returned sync(2) or unmount made durable stays, except where a later
//!   operation touched it;
//! - stale data (000 §5: "no meta-data ever points to bad data", a Soft Updates guarantee
//!   FFS never made): each 16-byte piece of a tagged workload's file is zero or carries the
//!   file's own inode and generation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use cairn_vfs::{Ctx, FileKind, FileSystem, Ino};

use crate::model::{Kind, Model, under};
use crate::record::{Event, Op, OpResult, Recording};

/// One name found by the walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObsNode {
    pub kind: Kind,
    pub ino: u64,
    pub generation: u64,
    pub perm: u16,
    pub size: u64,
    /// Regular files: the contents (up to [`READ_CAP`] bytes).
    pub content: Option<Arc<Vec<u8>>>,
}

/// What a walk of a state found.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub paths: BTreeMap<String, ObsNode>,
    /// Names that could not be listed, looked up or read.
    pub errors: Vec<String>,
}

/// A damaged size must not make the walk read gigabytes of holes.
pub const READ_CAP: u64 = 8 << 20;
/// A damaged directory must not make the walk run forever.
const MAX_NAMES: usize = 200_000;

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Walks the whole tree of `fs` from its root. A directory reached by a second name (an
/// interrupted rename) is recorded but not descended again, so cycles end.
pub fn observe(fs: &dyn FileSystem) -> Observed {
    let ctx = Ctx::root();
    let mut out = Observed::default();
    let mut seen_dirs: HashSet<Ino> = HashSet::new();
    let root = fs.root_ino();
    seen_dirs.insert(root);
    let mut queue: Vec<(Ino, String)> = vec![(root, String::new())];
    while let Some((dino, dpath)) = queue.pop() {
        let entries = match list(fs, &ctx, dino) {
            Ok(e) => e,
            Err(e) => {
                out.errors.push(format!("'/{dpath}': cannot list: {e}"));
                continue;
            }
        };
        for (name, dtype_ino, dkind) in entries {
            if out.paths.len() >= MAX_NAMES {
                out.errors
                    .push(format!("more than {MAX_NAMES} names: walk stopped"));
                return out;
            }
            let nm = String::from_utf8_lossy(&name).into_owned();
            let path = join(&dpath, &nm);
            let attr = match fs.lookup(&ctx, dino, OsStr::from_bytes(&name)) {
                Ok(a) => a,
                Err(e) => {
                    out.errors
                        .push(format!("'/{path}': listed but lookup fails: {e}"));
                    continue;
                }
            };
            if attr.ino != dtype_ino || attr.kind != dkind {
                out.errors.push(format!(
                    "'/{path}': entry says inode {dtype_ino} ({dkind:?}), lookup gives {} ({:?})",
                    attr.ino, attr.kind
                ));
            }
            let mut content = None;
            let kind = match attr.kind {
                FileKind::Directory => {
                    if seen_dirs.insert(attr.ino) {
                        queue.push((attr.ino, path.clone()));
                    }
                    Kind::Dir
                }
                FileKind::RegularFile => {
                    match read_all(fs, &ctx, attr.ino, attr.size) {
                        Ok(c) => content = Some(Arc::new(c)),
                        Err(e) => out.errors.push(format!("'/{path}': cannot read: {e}")),
                    }
                    Kind::File
                }
                FileKind::Symlink => match fs.readlink(attr.ino) {
                    Ok(t) => Kind::Symlink(t),
                    Err(e) => {
                        out.errors
                            .push(format!("'/{path}': cannot read the link: {e}"));
                        Kind::Symlink(Vec::new())
                    }
                },
                _ => Kind::Special,
            };
            out.paths.insert(
                path,
                ObsNode {
                    kind,
                    ino: attr.ino,
                    generation: attr.generation,
                    perm: attr.perm & 0o7777,
                    size: attr.size,
                    content,
                },
            );
        }
    }
    out
}

type Listing = Vec<(Vec<u8>, Ino, FileKind)>;

fn list(fs: &dyn FileSystem, ctx: &Ctx, dino: Ino) -> cairn_vfs::Result<Listing> {
    let fh = fs.opendir(ctx, dino)?;
    let mut out: Listing = Vec::new();
    let mut off = 0u64;
    let res = loop {
        let mut got = 0usize;
        let mut next = off;
        let r = fs.readdir(dino, fh, off, false, &mut |e| {
            if out.len() + got >= MAX_NAMES {
                return false;
            }
            let n = e.name.as_bytes();
            if n != b"." && n != b".." {
                out.push((n.to_vec(), e.ino, e.kind));
            }
            got += 1;
            next = e.next_offset;
            true
        });
        if let Err(e) = r {
            break Err(e);
        }
        if got == 0 || next == off || out.len() >= MAX_NAMES {
            break Ok(());
        }
        off = next;
    };
    let _ = fs.releasedir(dino, fh);
    res.map(|_| out)
}

fn read_all(fs: &dyn FileSystem, ctx: &Ctx, ino: Ino, size: u64) -> cairn_vfs::Result<Vec<u8>> {
    let fh = fs.open(ctx, ino, libc::O_RDONLY)?;
    let want = size.min(READ_CAP);
    let mut out = Vec::with_capacity(want as usize);
    let mut buf = Vec::new();
    let res = loop {
        if out.len() as u64 >= want {
            break Ok(());
        }
        let n = (want - out.len() as u64).min(1 << 20) as u32;
        if let Err(e) = fs.read(ino, fh, out.len() as u64, n, &mut buf) {
            break Err(e);
        }
        if buf.is_empty() {
            break Ok(());
        }
        out.extend_from_slice(&buf);
    };
    let _ = fs.release(ino, fh);
    res.map(|_| out)
}

/// Tags of workload data (see [`tag_data`]): 16-byte pieces naming their file.
pub const TAG_MAGIC: [u8; 4] = *b"cRsH";
pub const TAG_LEN: usize = 16;

/// Workload data for inode `ino`/`generation`: `len` bytes (a multiple of 16) of pieces
/// `magic | ino | generation | seq`, so a crash state's file can be checked for data that
/// belongs to another file.
pub fn tag_data(ino: u64, generation: u64, seq: u32, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut piece = [0u8; TAG_LEN];
    piece[0..4].copy_from_slice(&TAG_MAGIC);
    piece[4..8].copy_from_slice(&(ino as u32).to_le_bytes());
    piece[8..12].copy_from_slice(&(generation as u32).to_le_bytes());
    piece[12..16].copy_from_slice(&seq.to_le_bytes());
    while v.len() < len {
        v.extend_from_slice(&piece[..TAG_LEN.min(len - v.len())]);
    }
    v
}

/// The first piece of `content` that is neither zeros nor this file's own tag.
pub fn stale_piece(content: &[u8], ino: u64, generation: u64) -> Option<(usize, String)> {
    for (i, p) in content.chunks(TAG_LEN).enumerate() {
        if p.iter().all(|&b| b == 0) {
            continue;
        }
        let own = p.len() == TAG_LEN
            && p[0..4] == TAG_MAGIC
            && p[4..8] == (ino as u32).to_le_bytes()
            && p[8..12] == (generation as u32).to_le_bytes();
        if !own {
            let what = if p.len() == TAG_LEN && p[0..4] == TAG_MAGIC {
                format!(
                    "data of inode {} generation {}",
                    u32::from_le_bytes(p[4..8].try_into().unwrap_or_default()),
                    u32::from_le_bytes(p[8..12].try_into().unwrap_or_default())
                )
            } else {
                "bytes never written as file data".to_string()
            };
            return Some((i * TAG_LEN, what));
        }
    }
    None
}

/// One operation of a recording, with where it began and returned.
#[derive(Clone, Debug)]
pub struct OpRec {
    pub id: u64,
    pub op: Op,
    pub begin: usize,
    pub end: Option<usize>,
    pub result: Option<OpResult>,
}

/// What a mode promises (see `modes::Expectation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Promises {
    /// Every metadata call is durable when it returns (`sync`).
    pub metadata_on_return: bool,
    /// No file ever shows data it was not given (000 §5, Soft Updates).
    pub no_stale_data: bool,
}

/// What the oracle found wrong with one state.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Broken promises.
    pub violations: Vec<String>,
    /// Files showing data that is not theirs (a violation only for modes promising
    /// `no_stale_data`; counted for every mode).
    pub stale: Vec<String>,
    /// An operation renaming a directory was in flight at the crash point.
    pub dir_rename_in_flight: bool,
}

/// A recording's operations, and models of the namespace at any crash point.
pub struct Timeline {
    pub ops: Vec<OpRec>,
    /// Indices into `ops` in the order they returned.
    ends: Vec<usize>,
    initial: Model,
    /// Models after every `SNAP`-th returned operation.
    snaps: Vec<Model>,
    tagged: bool,
}

const SNAP: usize = 32;

impl Timeline {
    /// `initial` is the namespace at the recording's start (walked from the base image).
    pub fn new(rec: &Recording, initial: Model) -> Timeline {
        let mut ops: Vec<OpRec> = Vec::new();
        let mut by_id: HashMap<u64, usize> = HashMap::new();
        let mut ends = Vec::new();
        // Operations before the start (mkfs, mount, setup) are in the initial model already.
        for (i, ev) in rec.events.iter().enumerate().skip(rec.header.start) {
            match ev {
                Event::Begin { id, op } => {
                    by_id.insert(*id, ops.len());
                    ops.push(OpRec {
                        id: *id,
                        op: op.clone(),
                        begin: i,
                        end: None,
                        result: None,
                    });
                }
                Event::End { id, result } => {
                    if let Some(&k) = by_id.get(id) {
                        ops[k].end = Some(i);
                        ops[k].result = Some(result.clone());
                        ends.push(k);
                    }
                }
                _ => {}
            }
        }
        let mut snaps = vec![initial.clone()];
        let mut m = initial.clone();
        for (n, &k) in ends.iter().enumerate() {
            m.apply(&ops[k].op, ops[k].result.as_ref());
            if (n + 1) % SNAP == 0 {
                snaps.push(m.clone());
            }
        }
        Timeline {
            ops,
            ends,
            initial,
            snaps,
            tagged: rec.header.tagged,
        }
    }

    /// The namespace at the recording's start.
    pub fn initial(&self) -> &Model {
        &self.initial
    }

    /// The model after the first `n` returned operations.
    fn after(&self, n: usize) -> Model {
        let s = (n / SNAP).min(self.snaps.len() - 1);
        let mut m = self.snaps[s].clone();
        for &k in &self.ends[s * SNAP..n] {
            m.apply(&self.ops[k].op, self.ops[k].result.as_ref());
        }
        m
    }

    /// How many operations had returned before event index `cp`.
    fn returned_before(&self, cp: usize) -> usize {
        self.ends
            .partition_point(|&k| self.ops[k].end.is_some_and(|e| e < cp))
    }

    /// Operations in flight at `cp`.
    pub fn in_flight(&self, cp: usize) -> Vec<&OpRec> {
        self.ops
            .iter()
            .filter(|o| o.begin < cp && o.end.is_none_or(|e| e >= cp))
            .collect()
    }

    /// The last operation that had returned before `cp`, for reports.
    pub fn last_returned(&self, cp: usize) -> Option<&OpRec> {
        let n = self.returned_before(cp);
        n.checked_sub(1).map(|i| &self.ops[self.ends[i]])
    }

    /// Judges `obs`, a crash at event index `cp`, against `promises`.
    pub fn judge(&self, cp: usize, obs: &Observed, promises: Promises) -> Verdict {
        let mut v = Verdict::default();
        let n = self.returned_before(cp);
        let returned = self.after(n);
        let flying = self.in_flight(cp);
        v.dir_rename_in_flight = flying.iter().any(|o| match &o.op {
            Op::Rename { from, .. } => returned
                .paths
                .get(from)
                .is_some_and(|n| n.kind == Kind::Dir),
            _ => false,
        });
        // The models the state may match: the returned operations, plus each operation in
        // flight (or all of them) having taken effect.
        let mut cands = vec![returned.clone()];
        for o in &flying {
            let mut m = returned.clone();
            m.apply(&o.op, None);
            cands.push(m);
        }
        if flying.len() > 1 {
            let mut m = returned.clone();
            for o in &flying {
                m.apply(&o.op, None);
            }
            cands.push(m);
        }

        if promises.metadata_on_return && !cands.iter().any(|m| m.unknown) {
            self.names(&cands, obs, cp, &mut v);
        }
        self.fsynced(&returned, &flying, obs, &mut v);
        self.synced(cp, obs, &mut v);
        if self.tagged {
            for (p, o) in &obs.paths {
                if let Some(c) = &o.content
                    && let Some((off, what)) = stale_piece(c, o.ino, o.generation)
                {
                    v.stale.push(format!(
                        "'/{p}' (inode {}) holds {what} at offset {off}",
                        o.ino
                    ));
                }
            }
            if promises.no_stale_data {
                v.violations.extend(v.stale.iter().cloned());
            }
        }
        v
    }

    /// `sync`: every name as the returned operations left it (or the ones in flight would).
    fn names(&self, cands: &[Model], obs: &Observed, cp: usize, v: &mut Verdict) {
        let mut all: HashSet<&str> = obs.paths.keys().map(String::as_str).collect();
        for m in cands {
            all.extend(m.paths.keys().map(String::as_str));
        }
        let mut all: Vec<&str> = all.into_iter().collect();
        all.sort_unstable();
        for p in all {
            let o = obs.paths.get(p);
            let ok = cands.iter().any(|m| {
                let n = m.paths.get(p);
                match (n, o) {
                    (None, None) => true,
                    (Some(n), Some(o)) => {
                        n.kind == o.kind
                            && n.ino.is_none_or(|i| i == o.ino)
                            && n.ino
                                .and_then(|i| m.perms.get(&i))
                                .is_none_or(|&perm| perm == o.perm)
                    }
                    _ => false,
                }
            });
            if !ok {
                let want = match cands[0].paths.get(p) {
                    Some(n) => format!(
                        "{} (inode {}{})",
                        n.kind.describe(),
                        n.ino.map_or("?".into(), |i| i.to_string()),
                        n.ino
                            .and_then(|i| cands[0].perms.get(&i))
                            .map_or(String::new(), |p| format!(", mode {p:o}"))
                    ),
                    None => "absent".into(),
                };
                let got = match o {
                    Some(o) => {
                        format!("{} (inode {}, mode {:o})", o.kind.describe(), o.ino, o.perm)
                    }
                    None => "absent".into(),
                };
                let by = self.last_touching(p, cp).map_or(String::new(), |o| {
                    format!(" after {} #{} returned", o.op.kind(), o.id)
                });
                v.violations
                    .push(format!("'/{p}': expected {want}{by}, found {got}"));
            }
        }
    }

    fn last_touching(&self, p: &str, cp: usize) -> Option<&OpRec> {
        self.ops
            .iter()
            .rev()
            .filter(|o| o.end.is_some_and(|e| e < cp))
            .find(|o| {
                touched_paths(&o.op)
                    .iter()
                    .any(|t| under(p, t) || under(t, p))
            })
    }

    /// Every mode: fsynced files hold their fsynced contents.
    fn fsynced(&self, returned: &Model, flying: &[&OpRec], obs: &Observed, v: &mut Verdict) {
        let busy: HashSet<u64> = flying.iter().filter_map(|o| op_ino(&o.op)).collect();
        let names_busy = flying.iter().any(|o| {
            matches!(
                o.op,
                Op::Unlink { .. } | Op::Rename { .. } | Op::Rmdir { .. } | Op::Unknown { .. }
            )
        });
        let mut by_ino: HashMap<u64, &ObsNode> = HashMap::new();
        for o in obs.paths.values() {
            by_ino.entry(o.ino).or_insert(o);
        }
        for (&ino, f) in &returned.files {
            let Some(want) = &f.fsynced else { continue };
            if f.name_lost_since_fsync || busy.contains(&ino) {
                continue;
            }
            match by_ino.get(&ino) {
                None if names_busy => {}
                None => v
                    .violations
                    .push(format!("fsynced file (inode {ino}) is not in the tree")),
                Some(o) => {
                    let got = o.content.as_deref().map_or(&[][..], |c| c.as_slice());
                    if got != want.as_slice() {
                        let at = got
                            .iter()
                            .zip(want.iter())
                            .position(|(a, b)| a != b)
                            .unwrap_or(got.len().min(want.len()));
                        v.violations.push(format!(
                            "fsynced file (inode {ino}) holds {} bytes, {} were fsynced; first difference at byte {at}",
                            got.len(),
                            want.len()
                        ));
                    }
                }
            }
        }
    }

    /// Every mode: what the last returned sync(2)/unmount made durable, where no later
    /// operation touched it.
    fn synced(&self, cp: usize, obs: &Observed, v: &mut Verdict) {
        let Some(floor) = self
            .ops
            .iter()
            .filter(|o| matches!(o.op, Op::SyncAll | Op::Unmount))
            .filter(|o| o.end.is_some_and(|e| e < cp) && o.result.as_ref().is_some_and(|r| r.ok()))
            .max_by_key(|o| o.end)
        else {
            return;
        };
        let fend = floor.end.unwrap_or(0);
        let later: Vec<&OpRec> = self
            .ops
            .iter()
            .filter(|o| o.begin < cp && o.end.is_none_or(|e| e > fend))
            .collect();
        if later.iter().any(|o| matches!(o.op, Op::Unknown { .. })) {
            return;
        }
        let m = self.after(self.returned_before(fend + 1));
        if m.unknown {
            return;
        }
        let touched: Vec<String> = later.iter().flat_map(|o| touched_paths(&o.op)).collect();
        let data_touched: HashSet<u64> = later.iter().filter_map(|o| op_ino(&o.op)).collect();
        let mut all: HashSet<&str> = obs.paths.keys().map(String::as_str).collect();
        all.extend(m.paths.keys().map(String::as_str));
        let mut all: Vec<&str> = all.into_iter().collect();
        all.sort_unstable();
        for p in all {
            if touched.iter().any(|t| under(p, t)) {
                continue;
            }
            let (n, o) = (m.paths.get(p), obs.paths.get(p));
            let ok = match (n, o) {
                (None, None) => true,
                (Some(n), Some(o)) => n.kind == o.kind && n.ino.is_none_or(|i| i == o.ino),
                _ => false,
            };
            if !ok {
                v.violations.push(format!(
                    "'/{p}': {} when {} #{} returned, {} now",
                    n.map_or("absent".into(), |n| n.kind.describe()),
                    floor.op.kind(),
                    floor.id,
                    o.map_or("absent".into(), |o| o.kind.describe())
                ));
                continue;
            }
            if let (Some(n), Some(o)) = (n, o)
                && n.kind == Kind::File
                && let Some(ino) = n.ino
                && !data_touched.contains(&ino)
                && let Some(want) = m.files.get(&ino).and_then(|f| f.content.as_ref())
                && o.content.as_deref() != Some(want.as_ref())
            {
                v.violations.push(format!(
                    "'/{p}': contents differ from those made durable by {} #{}",
                    floor.op.kind(),
                    floor.id
                ));
            }
        }
    }
}

/// The names an operation may change (a directory's whole subtree is under its name).
fn touched_paths(op: &Op) -> Vec<String> {
    match op {
        Op::Create { path }
        | Op::Mkdir { path }
        | Op::Mknod { path }
        | Op::Symlink { path, .. }
        | Op::Link { path, .. }
        | Op::Unlink { path }
        | Op::Rmdir { path } => vec![path.clone()],
        Op::Rename { from, to } => vec![from.clone(), to.clone()],
        _ => Vec::new(),
    }
}

/// The inode whose data an operation may change.
fn op_ino(op: &Op) -> Option<u64> {
    match op {
        Op::Write { ino, .. } | Op::Truncate { ino, .. } => Some(*ino),
        _ => None,
    }
}

/// The namespace found by a walk, as a model (the state a recording starts from).
pub fn model_of(obs: &Observed) -> Model {
    let mut m = Model::default();
    for (p, o) in &obs.paths {
        m.paths.insert(
            p.clone(),
            crate::model::Node {
                kind: o.kind.clone(),
                ino: Some(o.ino),
            },
        );
        m.perms.insert(o.ino, o.perm);
        if o.kind == Kind::File {
            m.files.insert(
                o.ino,
                crate::model::FileState {
                    content: o.content.clone(),
                    ..Default::default()
                },
            );
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Base, FORMAT, Header};

    fn hdr() -> Header {
        Header {
            recording: FORMAT,
            block_size: 4096,
            num_blocks: 16,
            base: Base::Zero,
            mode: "sync".into(),
            workload: "t".into(),
            start: 0,
            tagged: true,
            repro: None,
        }
    }

    fn ok(ino: Option<u64>) -> OpResult {
        OpResult {
            errno: 0,
            ino,
            perm: None,
        }
    }

    fn file(ino: u64, content: &[u8]) -> ObsNode {
        ObsNode {
            kind: Kind::File,
            ino,
            generation: 1,
            perm: 0o644,
            size: content.len() as u64,
            content: Some(Arc::new(content.to_vec())),
        }
    }

    const SYNC: Promises = Promises {
        metadata_on_return: true,
        no_stale_data: false,
    };
    const ASYNC: Promises = Promises {
        metadata_on_return: false,
        no_stale_data: false,
    };

    /// create a (returns, durable in sync), write + fsync a, then create b in flight.
    fn timeline() -> (Recording, Timeline) {
        let data: Arc<[u8]> = Arc::from(tag_data(7, 1, 0, 32));
        let ev = vec![
            Event::Begin {
                id: 1,
                op: Op::Create { path: "a".into() },
            },
            Event::Flush,
            Event::End {
                id: 1,
                result: ok(Some(7)),
            },
            Event::Begin {
                id: 2,
                op: Op::Write {
                    ino: 7,
                    offset: 0,
                    data: data.clone(),
                },
            },
            Event::End {
                id: 2,
                result: ok(None),
            },
            Event::Begin {
                id: 3,
                op: Op::Fsync { ino: 7 },
            },
            Event::Flush,
            Event::End {
                id: 3,
                result: ok(None),
            },
            Event::Begin {
                id: 4,
                op: Op::Create { path: "b".into() },
            },
            Event::Flush,
        ];
        let rec = Recording {
            header: hdr(),
            events: ev,
        };
        let t = Timeline::new(&rec, Model::default());
        (rec, t)
    }

    #[test]
    fn a_missing_entry_for_a_returned_sync_create_is_flagged() {
        let (_, t) = timeline();
        // Crash after the create returned (event 3 on), with an empty root.
        let empty = Observed::default();
        let v = t.judge(3, &empty, SYNC);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert!(v.violations[0].contains("'/a'"), "{}", v.violations[0]);
        assert!(v.violations[0].contains("create #1"), "{}", v.violations[0]);
        // The same state before the create returned is fine: it was in flight.
        assert!(t.judge(2, &empty, SYNC).violations.is_empty());
        // async promises no names.
        assert!(t.judge(3, &empty, ASYNC).violations.is_empty());
    }

    #[test]
    fn an_operation_in_flight_may_or_may_not_show() {
        let (_, t) = timeline();
        let data = tag_data(7, 1, 0, 32);
        let mut obs = Observed::default();
        obs.paths.insert("a".into(), file(7, &data));
        assert!(t.judge(9, &obs, SYNC).violations.is_empty());
        obs.paths.insert("b".into(), file(8, b""));
        assert!(t.judge(9, &obs, SYNC).violations.is_empty());
        // But a name nobody created is flagged.
        obs.paths.insert("c".into(), file(9, b""));
        let v = t.judge(9, &obs, SYNC);
        assert_eq!(v.violations.len(), 1);
        assert!(v.violations[0].contains("'/c': expected absent"));
    }

    #[test]
    fn fsynced_contents_are_checked_in_every_mode() {
        let (_, t) = timeline();
        let data = tag_data(7, 1, 0, 32);
        let mut obs = Observed::default();
        obs.paths.insert("a".into(), file(7, &data[..16]));
        let v = t.judge(9, &obs, ASYNC);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert!(v.violations[0].contains("fsynced file (inode 7) holds 16 bytes, 32"));
        // Before the fsync returned there is no promise.
        assert!(t.judge(6, &obs, ASYNC).violations.is_empty());
        // Found by inode wherever its name is.
        let mut moved = Observed::default();
        moved.paths.insert("elsewhere".into(), file(7, &data));
        assert!(t.judge(9, &moved, ASYNC).violations.is_empty());
        assert_eq!(
            t.judge(9, &Observed::default(), ASYNC).violations,
            vec!["fsynced file (inode 7) is not in the tree".to_string()]
        );
    }

    #[test]
    fn stale_data_is_recognized_by_tags() {
        let own = tag_data(7, 1, 3, 48);
        assert_eq!(stale_piece(&own, 7, 1), None);
        let mut mixed = own.clone();
        mixed[16..32].copy_from_slice(&tag_data(9, 2, 0, 16));
        assert_eq!(
            stale_piece(&mixed, 7, 1),
            Some((16, "data of inode 9 generation 2".into()))
        );
        let mut zeros = own.clone();
        zeros[32..].fill(0);
        assert_eq!(stale_piece(&zeros, 7, 1), None);
        zeros[40] = 1;
        assert_eq!(
            stale_piece(&zeros, 7, 1),
            Some((32, "bytes never written as file data".into()))
        );
        let (_, t) = timeline();
        let mut obs = Observed::default();
        obs.paths.insert("a".into(), file(7, &mixed));
        let v = t.judge(4, &obs, ASYNC);
        assert_eq!(v.stale.len(), 1);
        assert!(v.violations.is_empty(), "async does not promise it");
        let v = t.judge(
            4,
            &obs,
            Promises {
                metadata_on_return: false,
                no_stale_data: true,
            },
        );
        assert_eq!(v.violations.len(), 1);
    }
}
