//! Walking a crash state, and the durability oracle.
//!
//! [`observe`] mounts nothing itself: it walks any [`FileSystem`] (the crash state mounted
//! read-only, in process) and records every name, its inode, permissions and, for regular
//! files, the contents. A name that cannot be listed, looked up or read is a walk error:
//! the state is damaged whatever fsck said.
//!
//! [`Timeline`] replays a recording's operation markers into [`Model`]s, and
//! [`Timeline::judge`] compares an observed state with what the mode promised at the crash
//! point:
//! - `sync` (metadata durable on return): the *whole* namespace — every name, its kind,
//!   inode and permissions, and a file's size where a returned setattr, create, fsync or
//!   sync fixed it — must be explained by one candidate: the returned operations plus some
//!   of those in flight, each done or (a rename) half done with both names. A crash state
//!   is one moment; two names cannot each be explained by a different moment;
//! - every mode: a file whose fsync returned (and that nothing changed since) holds exactly
//!   the fsynced contents, found by its inode number wherever its name is now;
//! - every mode: what a returned sync(2) or unmount made durable stays, except where a later
//!   operation touched it;
//! - every mode honouring fsync: once an fsync in flight has written the file's inode,
//!   every byte within the size on disk is content the file had — data before pointers;
//! - stale data (000 §5: "no meta-data ever points to bad data", a Soft Updates guarantee
//!   FFS never made): each 16-byte piece of a file is one a version of the file the state
//!   may show holds at that place: not another file's bytes, and not zeros where every such
//!   version had data. Counted for every mode, a violation where promised.

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
    /// Every metadata call is durable when it returns (`sync`): names, permissions, and the
    /// size a setattr gave a file.
    pub metadata_on_return: bool,
    /// fsync writes a file's data before the pointers to it: while an fsync is in flight,
    /// every byte within the file's size on disk is content the file had (never zeros
    /// where data was written, never another file's bytes) once the fsync has written the
    /// inode.
    pub fsync_data_first: bool,
    /// No file ever shows data it was not given (000 §5, Soft Updates; the journal's
    /// ordered data): a violation, not only a count.
    pub no_stale_data: bool,
    /// An inode that had a durable name and was never unlinked since keeps a name (002 §3
    /// rule 3; atomic rename in a log): see [`Timeline::kept_names`].
    pub names_kept: bool,
    /// The whole namespace is the one some prefix of the calls left, no shorter than the
    /// calls returned before the last returned fsync, fsyncdir or sync (a log replayed up
    /// to its last committed flush, where an fsync commits everything: LFS, 004 §4.2).
    pub prefix: bool,
}

/// What the oracle found wrong with one state.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Broken promises.
    pub violations: Vec<String>,
    /// Files showing data that is not theirs: another file's bytes, bytes never written as
    /// file data, or zeros where every version of the file the state may show had data (a
    /// violation only for modes promising `no_stale_data`; counted for every mode).
    pub stale: Vec<String>,
    /// An operation renaming a directory was in flight at the crash point.
    pub dir_rename_in_flight: bool,
}

/// One version of a file's contents: what it held after a call that changed it returned.
#[derive(Clone, Debug)]
pub struct Version {
    /// Event index of the call's return (0: the recording's start).
    pub end: usize,
    pub content: Arc<Vec<u8>>,
    pub generation: Option<u64>,
    /// The file was created here: earlier versions belong to an earlier file that had the
    /// same inode number.
    pub created: bool,
}

/// The contents a file may show at a crash point, oldest first (see
/// [`Timeline::versions_at`]).
pub struct Versions {
    pub contents: Vec<Arc<Vec<u8>>>,
    /// The file's generation, where the creating call reported it.
    pub generation: Option<u64>,
}

/// A candidate explanation of a crash state: the returned operations plus some of those in
/// flight, each done or half done.
pub struct Candidate {
    /// How the operations in flight stand in it, for reports.
    pub label: String,
    pub model: Model,
}

/// More in flight than this (concurrent FUSE requests): only prefixes in begin order.
const SUBSET_LIMIT: usize = 4;
const CANDIDATE_LIMIT: usize = 256;

/// A recording's operations, and models of the namespace at any crash point.
pub struct Timeline {
    pub ops: Vec<OpRec>,
    /// Indices into `ops` in the order they returned.
    ends: Vec<usize>,
    initial: Model,
    /// Models after every `SNAP`-th returned operation.
    snaps: Vec<Model>,
    tagged: bool,
    /// Every version of every file's contents, in the order the calls returned.
    versions: HashMap<u64, Vec<Version>>,
    /// Event indices at which an fsync of the inode returned.
    fsync_ends: HashMap<u64, Vec<usize>>,
    /// Event indices at which sync(2) or an unmount returned.
    sync_ends: Vec<usize>,
    /// When each inode first had a durable name, by what makes a name durable (see
    /// [`Durable`]).
    durable: Durable,
    /// Where each inode lost a name: the begin event of every returned unlink, rmdir or
    /// rename over one of its names (its victim as the model named it then).
    unlinks: HashMap<u64, Vec<usize>>,
}

/// The first moment (event index of a return; 0: the recording's start) each inode had a
/// name that a crash after it must keep, under each way a name becomes durable.
#[derive(Default)]
struct Durable {
    /// The start, a returned sync(2) or unmount (every name), or a returned fsync of the
    /// file while every directory above one of its names was durable: every mode.
    synced: HashMap<u64, usize>,
    /// As `synced`, with every returned fsync counting as a sync(2): a log that commits
    /// everything before an fsync (the prefix promise).
    fsync_commits_all: HashMap<u64, usize>,
    /// The return of the first call after which the inode had a name: metadata durable on
    /// return.
    named: HashMap<u64, usize>,
}

impl Durable {
    fn mark(map: &mut HashMap<u64, usize>, m: &Model, at: usize) {
        for n in m.paths.values() {
            if let Some(i) = n.ino {
                map.entry(i).or_insert(at);
            }
        }
    }

    /// `ino`'s names in `m` whose every directory above is in `map` (durable): the names
    /// an fsync of it makes durable.
    fn reachable(map: &HashMap<u64, usize>, m: &Model, ino: u64) -> bool {
        m.paths.iter().any(|(p, n)| {
            n.ino == Some(ino)
                && p.match_indices('/').all(|(i, _)| {
                    m.paths
                        .get(&p[..i])
                        .and_then(|d| d.ino)
                        .is_some_and(|d| map.contains_key(&d))
                })
        })
    }

    /// When `ino` first had a durable name under `promises`.
    fn since(&self, ino: u64, promises: Promises) -> Option<usize> {
        let mut at = self.synced.get(&ino).copied();
        let mut earlier = |m: &HashMap<u64, usize>| {
            if let Some(&e) = m.get(&ino) {
                at = Some(at.map_or(e, |a| a.min(e)));
            }
        };
        if promises.prefix {
            earlier(&self.fsync_commits_all);
        }
        if promises.metadata_on_return {
            earlier(&self.named);
        }
        at
    }

    fn inodes(&self) -> impl Iterator<Item = u64> + '_ {
        let mut all: Vec<u64> = self
            .synced
            .keys()
            .chain(self.fsync_commits_all.keys())
            .chain(self.named.keys())
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        all.into_iter()
    }
}

/// The inodes a call may take a name from: the victim of an unlink or rmdir, whatever a
/// rename replaces (as `m` names them).
fn victims(m: &Model, op: &Op) -> Vec<u64> {
    let at = |p: &str| m.paths.get(p).and_then(|n| n.ino);
    match op {
        Op::Unlink { path } | Op::Rmdir { path } => at(path).into_iter().collect(),
        Op::Rename { from, to, .. } if from != to && !under(to, from) => {
            at(to).into_iter().collect()
        }
        _ => Vec::new(),
    }
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
        let mut versions: HashMap<u64, Vec<Version>> = HashMap::new();
        for (&ino, f) in &initial.files {
            if let Some(c) = &f.content {
                versions.insert(
                    ino,
                    vec![Version {
                        end: 0,
                        content: c.clone(),
                        generation: f.generation,
                        created: true,
                    }],
                );
            }
        }
        let mut fsync_ends: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut sync_ends = Vec::new();
        let mut snaps = vec![initial.clone()];
        let mut m = initial.clone();
        let mut durable = Durable::default();
        for map in [
            &mut durable.synced,
            &mut durable.fsync_commits_all,
            &mut durable.named,
        ] {
            Durable::mark(map, &initial, 0);
        }
        let mut unlinks: HashMap<u64, Vec<usize>> = HashMap::new();
        for (n, &k) in ends.iter().enumerate() {
            let o = &ops[k];
            let ok = o.result.as_ref().is_some_and(|r| r.ok());
            if ok {
                for v in victims(&m, &o.op) {
                    unlinks.entry(v).or_default().push(o.begin);
                }
            }
            m.apply(&o.op, o.result.as_ref());
            let end = o.end.unwrap_or(0);
            if ok {
                Durable::mark(&mut durable.named, &m, end);
                match &o.op {
                    Op::SyncAll | Op::Unmount => {
                        Durable::mark(&mut durable.synced, &m, end);
                        Durable::mark(&mut durable.fsync_commits_all, &m, end);
                    }
                    Op::Fsync { ino } => {
                        Durable::mark(&mut durable.fsync_commits_all, &m, end);
                        if !durable.synced.contains_key(ino)
                            && Durable::reachable(&durable.synced, &m, *ino)
                        {
                            durable.synced.insert(*ino, end);
                        }
                    }
                    _ => {}
                }
            }
            if o.result.as_ref().is_some_and(|r| r.ok()) {
                let changed = match &o.op {
                    Op::Create { .. } | Op::Tmpfile { .. } => o.result.as_ref().and_then(|r| r.ino),
                    Op::Write { ino, .. } | Op::Truncate { ino, .. } => Some(*ino),
                    Op::Fsync { ino } => {
                        fsync_ends.entry(*ino).or_default().push(end);
                        None
                    }
                    Op::SyncAll | Op::Unmount => {
                        sync_ends.push(end);
                        None
                    }
                    _ => None,
                };
                if let Some(ino) = changed
                    && let Some(f) = m.files.get(&ino)
                    && let Some(c) = &f.content
                {
                    versions.entry(ino).or_default().push(Version {
                        end,
                        content: c.clone(),
                        generation: f.generation,
                        created: matches!(o.op, Op::Create { .. } | Op::Tmpfile { .. }),
                    });
                }
            }
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
            versions,
            fsync_ends,
            sync_ends,
            durable,
            unlinks,
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

    /// Operations in flight at `cp`, in the order they began.
    pub fn in_flight(&self, cp: usize) -> Vec<&OpRec> {
        self.ops
            .iter()
            .filter(|o| o.begin < cp && o.end.is_none_or(|e| e >= cp))
            .collect()
    }

    /// Operations that had begun before `cp`, in the order they began: the shortest prefix
    /// of the workload that reaches a crash at `cp`.
    pub fn begun_before(&self, cp: usize) -> &[OpRec] {
        let n = self.ops.partition_point(|o| o.begin < cp);
        &self.ops[..n]
    }

    /// Whether an operation renaming a directory was in flight at `cp`.
    pub fn dir_rename_in_flight(&self, cp: usize) -> bool {
        dir_rename(&self.after(self.returned_before(cp)), &self.in_flight(cp))
    }

    /// The last operation that had returned before `cp`, for reports.
    pub fn last_returned(&self, cp: usize) -> Option<&OpRec> {
        let n = self.returned_before(cp);
        n.checked_sub(1).map(|i| &self.ops[self.ends[i]])
    }

    /// Every model a crash at `cp` may match: the returned operations, plus any subset of
    /// those in flight (in the order they began; only prefixes when many are in flight),
    /// each done or — a rename — half done (both names).
    pub fn candidates(&self, cp: usize) -> Vec<Candidate> {
        let returned = self.after(self.returned_before(cp));
        let flying: Vec<&OpRec> = self
            .in_flight(cp)
            .into_iter()
            .filter(|o| changes_model(&o.op))
            .collect();
        let mut out = vec![Candidate {
            label: "no call in flight done".into(),
            model: returned.clone(),
        }];
        let n = flying.len();
        if n == 0 {
            return out;
        }
        out.clear();
        let subsets: Vec<Vec<usize>> = if n <= SUBSET_LIMIT {
            (0u32..1 << n)
                .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).collect())
                .collect()
        } else {
            (0..=n).map(|k| (0..k).collect()).collect()
        };
        for set in subsets {
            let mut partial = vec![(Vec::<String>::new(), returned.clone())];
            for &i in &set {
                let o = flying[i];
                let mut next = Vec::new();
                for (label, m) in partial {
                    let mut done = m.clone();
                    done.apply(&o.op, None);
                    let mut l = label.clone();
                    l.push(format!("{} #{} done", o.op.kind(), o.id));
                    next.push((l, done));
                    if let Op::Rename { from, to, .. } = &o.op {
                        for half in m.rename_midway(from, to) {
                            let mut l = label.clone();
                            l.push(format!("rename #{} half done (both names)", o.id));
                            next.push((l, half));
                        }
                    }
                }
                partial = next;
            }
            for (label, model) in partial {
                out.push(Candidate {
                    label: if label.is_empty() {
                        "no call in flight done".into()
                    } else {
                        label.join(", ")
                    },
                    model,
                });
                if out.len() >= CANDIDATE_LIMIT {
                    return out;
                }
            }
        }
        out
    }

    /// The prefix promise: the state must match the returned calls (with those in flight,
    /// as [`Timeline::candidates`]), or the first `k` returned calls for some `k` down to
    /// the calls returned before the last returned fsync, fsyncdir or sync. `n` is the
    /// number of calls returned before `cp`. The prefixes are tried in order from the durable
    /// point, one model advanced a call at a time, and the search stops at the first that
    /// matches; only a state none explains pays for all of them.
    fn prefix_state(&self, cp: usize, n: usize, obs: &Observed, v: &mut Verdict) {
        let mut cands = self.candidates(cp);
        if cands.iter().any(|c| c.model.unknown) {
            return;
        }
        if cands
            .iter()
            .any(|c| Self::mismatches(&c.model, obs, 1) == 0)
        {
            return;
        }
        let durable = self.ends[..n]
            .iter()
            .rposition(|&k| {
                let o = &self.ops[k];
                matches!(
                    o.op,
                    Op::Fsync { .. } | Op::Fsyncdir { .. } | Op::SyncAll | Op::Unmount
                ) && o.result.as_ref().is_some_and(|r| r.ok())
            })
            .map_or(0, |i| i + 1);
        // One model walked forward from the durable point, a call at a time (a clone per
        // prefix cost more than the rest of a state's check); the closest is kept for the
        // report.
        let mut m = self.after(durable);
        let mut best: Option<(usize, usize, Model)> = None;
        for k in durable..n {
            if k > durable {
                let o = &self.ops[self.ends[k - 1]];
                m.apply(&o.op, o.result.as_ref());
            }
            if m.unknown {
                return;
            }
            let limit = best.as_ref().map_or(usize::MAX, |b| b.0);
            let c = Self::mismatches(&m, obs, limit);
            if c == 0 {
                return;
            }
            if c < limit {
                best = Some((c, k, m.clone()));
            }
        }
        if let Some((_, k, model)) = best {
            cands.push(Candidate {
                label: format!("the first {k} returned calls"),
                model,
            });
        }
        self.whole_state(&cands, obs, cp, v);
    }

    /// Judges `obs`, a crash at event index `cp`, against `promises`. `fsync_wrote` names
    /// the inodes with an fsync in flight whose inode on disk was written by that fsync
    /// (see `check.rs`): their contents must already be complete.
    pub fn judge(
        &self,
        cp: usize,
        obs: &Observed,
        promises: Promises,
        fsync_wrote: &HashSet<u64>,
    ) -> Verdict {
        let mut v = Verdict::default();
        let n = self.returned_before(cp);
        let returned = self.after(n);
        let flying = self.in_flight(cp);
        v.dir_rename_in_flight = dir_rename(&returned, &flying);
        let unknown = returned.unknown || flying.iter().any(|o| matches!(o.op, Op::Unknown { .. }));
        if promises.metadata_on_return && !unknown {
            let cands = self.candidates(cp);
            if !cands.iter().any(|c| c.model.unknown) {
                self.whole_state(&cands, obs, cp, &mut v);
            }
        } else if promises.prefix && !unknown {
            self.prefix_state(cp, n, obs, &mut v);
        }
        if promises.names_kept && !unknown {
            self.kept_names(cp, &returned, &flying, obs, promises, &mut v);
        }
        self.fsynced(&returned, &flying, obs, promises, &mut v);
        self.synced(cp, obs, &mut v);
        if !unknown {
            self.contents(cp, &flying, obs, promises, fsync_wrote, &mut v);
        }
        if promises.no_stale_data {
            v.violations.extend(v.stale.iter().cloned());
        }
        v
    }

    /// Metadata durable on return: the whole namespace (every name, its kind, inode and
    /// permissions, a file's size) must be explained by one candidate. Judging each name
    /// alone would let "old name absent" (explained by the rename done) and "new name
    /// absent" (explained by the rename not done) pass together, a state no correct rename
    /// leaves.
    fn whole_state(&self, cands: &[Candidate], obs: &Observed, cp: usize, v: &mut Verdict) {
        let mut best: Option<(usize, usize)> = None;
        for (i, c) in cands.iter().enumerate() {
            let limit = best.map_or(usize::MAX, |(_, b)| b);
            let n = Self::mismatches(&c.model, obs, limit);
            if n == 0 {
                return;
            }
            if n < limit {
                best = Some((i, n));
            }
        }
        let Some((i, _)) = best else { return };
        let diff = self.differences(&cands[i].model, obs, cp);
        let note = if cands.len() > 1 {
            format!(" [closest explanation: {}]", cands[i].label)
        } else {
            String::new()
        };
        for d in diff {
            v.violations.push(format!("{d}{note}"));
        }
    }

    /// Names kept (002 §3 rule 3, promised by every mode but `async`): an inode that had
    /// a durable name before `cp` and lost none since — no unlink, rmdir or rename over one
    /// of its names returned or in flight — must have a name in the state, wherever: a
    /// rename in flight may leave the old name, the new one or both, never neither. fsck
    /// calls a nameless inode a leak (it reconnects it to lost+found), but a returned call
    /// had made one of its names durable and nothing took it back.
    fn kept_names(
        &self,
        cp: usize,
        returned: &Model,
        flying: &[&OpRec],
        obs: &Observed,
        promises: Promises,
        v: &mut Verdict,
    ) {
        let on_disk: HashSet<u64> = obs.paths.values().map(|o| o.ino).collect();
        // A call in flight may have taken a name (one that never returns is not in
        // `unlinks`).
        let busy: HashSet<u64> = flying
            .iter()
            .flat_map(|o| victims(returned, &o.op))
            .collect();
        for ino in self.durable.inodes() {
            let Some(since) = self.durable.since(ino, promises) else {
                continue;
            };
            if since >= cp || on_disk.contains(&ino) || busy.contains(&ino) {
                continue;
            }
            let unlinked = self
                .unlinks
                .get(&ino)
                .is_some_and(|b| b.iter().any(|&b| b > since && b < cp));
            if unlinked {
                continue;
            }
            let names: Vec<String> = returned
                .paths
                .iter()
                .filter(|(_, n)| n.ino == Some(ino))
                .map(|(p, _)| format!("'/{p}'"))
                .collect();
            let by = self
                .ops
                .iter()
                .find(|o| o.end == Some(since))
                .map_or("the start".to_string(), |o| {
                    format!("{} #{}", o.op.kind(), o.id)
                });
            v.violations.push(format!(
                "inode {ino} has no name on disk ({}): its name was durable after {by} and it was never unlinked, so one must survive (002 §3 rule 3)",
                if names.is_empty() {
                    "a call in flight moves it".to_string()
                } else {
                    format!("named {} by the returned calls", names.join(", "))
                }
            ));
        }
    }

    /// How many names of `obs` model `m` does not explain, counting up to `limit` (0:
    /// `m` explains the state). [`Timeline::differences`] without the reports, for the
    /// searches that try many models per state.
    fn mismatches(m: &Model, obs: &Observed, limit: usize) -> usize {
        let wrong = |p: &str| {
            let (n, o) = (m.paths.get(p), obs.paths.get(p));
            !node_matches(m, n, o) || size_mismatch(m, n, o).is_some()
        };
        let only_in_model = m.paths.keys().filter(|p| !obs.paths.contains_key(*p));
        obs.paths
            .keys()
            .chain(only_in_model)
            .filter(|p| wrong(p))
            .take(limit)
            .count()
    }

    /// How `obs` differs from model `m` (empty: `m` explains it).
    fn differences(&self, m: &Model, obs: &Observed, cp: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut all: Vec<&str> = obs.paths.keys().map(String::as_str).collect();
        all.extend(m.paths.keys().map(String::as_str));
        all.sort_unstable();
        all.dedup();
        for p in all {
            let (n, o) = (m.paths.get(p), obs.paths.get(p));
            let ok = node_matches(m, n, o);
            let by = || {
                self.last_touching(p, cp).map_or(String::new(), |o| {
                    format!(" after {} #{} returned", o.op.kind(), o.id)
                })
            };
            if !ok {
                let want = match n {
                    Some(n) => format!(
                        "{} (inode {}{})",
                        n.kind.describe(),
                        n.ino.map_or("?".into(), |i| i.to_string()),
                        n.ino
                            .and_then(|i| m.perms.get(&i))
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
                out.push(format!("'/{p}': expected {want}{}, found {got}", by()));
                continue;
            }
            // A size set by a returned setattr (or create, fsync, sync) is durable.
            if let Some(f) = size_mismatch(m, n, o)
                && let Some(o) = o
            {
                let by = self.last_sizing(o.ino, cp).map_or(String::new(), |r| {
                    format!(" after {} #{} returned", r.op.kind(), r.id)
                });
                out.push(format!(
                    "'/{p}': size {} on disk, expected {}{by}",
                    o.size,
                    f.sizes
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(" or ")
                ));
            }
        }
        out
    }

    fn last_touching(&self, p: &str, cp: usize) -> Option<&OpRec> {
        let near = |t: &str| under(p, t) || under(t, p);
        self.ops
            .iter()
            .rev()
            .filter(|o| o.end.is_some_and(|e| e < cp))
            .find(|o| match &o.op {
                Op::Rename { from, to, .. } => near(from) || near(to),
                op => named_path(op).is_some_and(near),
            })
    }

    /// The last returned call that made `ino`'s size durable.
    fn last_sizing(&self, ino: u64, cp: usize) -> Option<&OpRec> {
        self.ops
            .iter()
            .rev()
            .filter(|o| o.end.is_some_and(|e| e < cp))
            .find(|o| match &o.op {
                Op::Truncate { ino: i, .. } | Op::Fsync { ino: i } => *i == ino,
                Op::Create { .. } | Op::Tmpfile { .. } => {
                    o.result.as_ref().and_then(|r| r.ino) == Some(ino)
                }
                Op::SyncAll | Op::Unmount => true,
                _ => false,
            })
    }

    /// Every mode: fsynced files hold their fsynced contents. A mode that keeps names
    /// (`names_kept`) must show the file too; one that does not (`async`) may lose its name
    /// to a later unordered write of its directory — the contents are held to the fsync
    /// wherever the file is found.
    fn fsynced(
        &self,
        returned: &Model,
        flying: &[&OpRec],
        obs: &Observed,
        promises: Promises,
        v: &mut Verdict,
    ) {
        let busy: HashSet<u64> = flying.iter().filter_map(|o| op_ino(&o.op)).collect();
        let names_busy = flying.iter().any(|o| {
            matches!(
                o.op,
                Op::Unlink { .. } | Op::Rename { .. } | Op::Rmdir { .. } | Op::Unknown { .. }
            )
        });
        let by_ino = by_ino(obs);
        // A file no name reaches (an O_TMPFILE never linked) is nowhere to be found.
        let named: HashSet<u64> = returned.paths.values().filter_map(|n| n.ino).collect();
        for (&ino, f) in &returned.files {
            let Some(want) = &f.fsynced else { continue };
            if f.name_lost_since_fsync || busy.contains(&ino) || !named.contains(&ino) {
                continue;
            }
            match by_ino.get(&ino) {
                None if names_busy || !promises.names_kept => {}
                None => v
                    .violations
                    .push(format!("fsynced file (inode {ino}) is not in the tree")),
                Some((_, o)) => {
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

    /// The contents of `ino` a crash at `cp` may show, oldest first, and the file's
    /// generation: the version at its last durable point (fsync, sync(2), the start) or
    /// its creation if later, every version since, and those the calls in flight would
    /// make. `None`: the model does not know the file's contents.
    pub fn versions_at(&self, ino: u64, cp: usize, flying: &[&OpRec]) -> Option<Versions> {
        let all = self.versions.get(&ino)?;
        let all = &all[..all.partition_point(|v| v.end < cp)];
        if all.is_empty() {
            return None;
        }
        let last_before =
            |ends: &[usize]| ends[..ends.partition_point(|&e| e < cp)].last().copied();
        let durable = [
            self.fsync_ends.get(&ino).and_then(|e| last_before(e)),
            last_before(&self.sync_ends),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0);
        let at_durable = all.partition_point(|v| v.end <= durable).saturating_sub(1);
        let created = all.iter().rposition(|v| v.created).unwrap_or(0);
        let from = at_durable.max(created);
        let mut out: Vec<Arc<Vec<u8>>> = all[from..].iter().map(|v| v.content.clone()).collect();
        let generation = all[from..].last().and_then(|v| v.generation);
        for o in flying {
            let mut c = out.last().map_or_else(Vec::new, |c| c.as_ref().clone());
            match &o.op {
                Op::Write {
                    ino: i,
                    offset,
                    data,
                } if *i == ino => crate::model::write_into(&mut c, *offset, data),
                Op::Truncate { ino: i, size } if *i == ino => c.resize(*size as usize, 0),
                _ => continue,
            }
            out.push(Arc::new(c));
        }
        Some(Versions {
            contents: out,
            generation,
        })
    }

    /// Every file's contents against the versions it may show: an fsync in flight that
    /// already wrote the inode promises complete contents (`fsync_data_first`); anything
    /// else that is not the file's content is counted as stale data.
    fn contents(
        &self,
        cp: usize,
        flying: &[&OpRec],
        obs: &Observed,
        promises: Promises,
        fsync_wrote: &HashSet<u64>,
        v: &mut Verdict,
    ) {
        let syncing: HashMap<u64, u64> = flying
            .iter()
            .filter_map(|o| match o.op {
                Op::Fsync { ino } => Some((ino, o.id)),
                _ => None,
            })
            .collect();
        for (p, o) in &obs.paths {
            let Some(c) = &o.content else { continue };
            if o.size > READ_CAP {
                continue;
            }
            let versions = self
                .versions_at(o.ino, cp, flying)
                .filter(|v| v.generation.is_none_or(|g| g == o.generation));
            let bad = match &versions {
                Some(v) => foreign_piece(c, &v.contents, o.ino, o.generation, self.tagged),
                None if self.tagged => stale_piece(c, o.ino, o.generation),
                None => None,
            };
            let Some((off, what)) = bad else { continue };
            let msg = format!("'/{p}' (inode {}) holds {what} at offset {off}", o.ino);
            match syncing.get(&o.ino) {
                Some(id) if fsync_wrote.contains(&o.ino) && versions.is_some() => {
                    let m = format!(
                        "{msg}, while fsync #{id} was in flight and had already written its inode: data must reach disk before the pointers to it"
                    );
                    if promises.fsync_data_first {
                        v.violations.push(m.clone());
                    }
                    v.stale.push(m);
                }
                _ => v.stale.push(msg),
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

fn dir_rename(returned: &Model, flying: &[&OpRec]) -> bool {
    flying.iter().any(|o| match &o.op {
        Op::Rename { from, .. } => returned
            .paths
            .get(from)
            .is_some_and(|n| n.kind == Kind::Dir),
        _ => false,
    })
}

/// Whether an operation in flight can change what the names check compares (names,
/// permissions, sizes) in a way a candidate must allow for.
fn changes_model(op: &Op) -> bool {
    !matches!(
        op,
        Op::Release { .. }
            | Op::Forget { .. }
            | Op::Fsync { .. }
            | Op::Fsyncdir { .. }
            | Op::SetAttr { .. }
            | Op::SyncAll
            | Op::Unmount
    )
}

/// The first name found for each inode of `obs`.
fn by_ino(obs: &Observed) -> HashMap<u64, (&String, &ObsNode)> {
    let mut m = HashMap::new();
    for (p, o) in &obs.paths {
        m.entry(o.ino).or_insert((p, o));
    }
    m
}

/// The first 16-byte piece of `content` that no version in `versions` holds at that place,
/// and what it is. A version holds a piece when it covers those bytes with the same bytes:
/// zeros are accepted where a version has zeros (a hole, or written zeros), never beyond a
/// version's size, so a file whose size reached disk before its data is seen ("zeros
/// where data was written"). A state shows each piece from one write of its block, and
/// every write of a block reflects the file as some call left it; sectors (512 bytes)
/// hold whole pieces, so a torn write does too.
pub fn foreign_piece(
    content: &[u8],
    versions: &[Arc<Vec<u8>>],
    ino: u64,
    generation: u64,
    tagged: bool,
) -> Option<(usize, String)> {
    if versions.iter().any(|v| v.as_slice() == content) {
        return None;
    }
    for (i, p) in content.chunks(TAG_LEN).enumerate() {
        let off = i * TAG_LEN;
        let end = off + p.len();
        if versions.iter().any(|v| v.len() >= end && v[off..end] == *p) {
            continue;
        }
        let what = if p.iter().all(|&b| b == 0) {
            "zeros where data was written".to_string()
        } else if tagged && p.len() == TAG_LEN && p[0..4] == TAG_MAGIC {
            let pi = u32::from_le_bytes(p[4..8].try_into().unwrap_or_default());
            let pg = u32::from_le_bytes(p[8..12].try_into().unwrap_or_default());
            if pi == ino as u32 && pg == generation as u32 {
                "its own data from a version it no longer may show".to_string()
            } else {
                format!("data of inode {pi} generation {pg}")
            }
        } else if tagged {
            "bytes never written as file data".to_string()
        } else {
            "bytes no version of the file held there".to_string()
        };
        return Some((off, what));
    }
    None
}

/// Whether the name `o` the state shows (or its absence) is the one `n` the model has:
/// kind, inode and permission bits.
fn node_matches(m: &Model, n: Option<&crate::model::Node>, o: Option<&ObsNode>) -> bool {
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
}

/// The file's model state when the size the state shows is not one the model allows (a
/// size set by a returned setattr, create, fsync or sync is durable).
fn size_mismatch<'m>(
    m: &'m Model,
    n: Option<&crate::model::Node>,
    o: Option<&ObsNode>,
) -> Option<&'m crate::model::FileState> {
    let (n, o) = (n?, o?);
    if n.kind != Kind::File {
        return None;
    }
    let f = n.ino.and_then(|i| m.files.get(&i))?;
    (!f.sizes.is_empty() && !f.sizes.contains(&o.size)).then_some(f)
}

/// The one name an operation other than rename changes.
fn named_path(op: &Op) -> Option<&str> {
    match op {
        Op::Create { path }
        | Op::Mkdir { path }
        | Op::Mknod { path }
        | Op::Symlink { path, .. }
        | Op::Link { path, .. }
        | Op::Unlink { path }
        | Op::Rmdir { path } => Some(path),
        _ => None,
    }
}

/// The names an operation may change (a directory's whole subtree is under its name).
fn touched_paths(op: &Op) -> Vec<String> {
    match op {
        Op::Rename { from, to, .. } => vec![from.clone(), to.clone()],
        op => named_path(op).map(str::to_string).into_iter().collect(),
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
                    // Contents cut at READ_CAP are not known.
                    content: o.content.clone().filter(|_| o.size <= READ_CAP),
                    generation: Some(o.generation),
                    sizes: vec![o.size],
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
            log_blocks: 0,
            repro: None,
        }
    }

    fn ok(ino: Option<u64>) -> OpResult {
        OpResult {
            errno: 0,
            ino,
            perm: None,
            generation: Some(1),
        }
    }

    fn none() -> HashSet<u64> {
        HashSet::new()
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
        fsync_data_first: true,
        no_stale_data: false,
        names_kept: true,
        prefix: false,
    };
    const ASYNC: Promises = Promises {
        metadata_on_return: false,
        fsync_data_first: true,
        no_stale_data: false,
        names_kept: false,
        prefix: false,
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

    /// The prefix promise (LFS): the namespace is the one some prefix of the calls left, no
    /// shorter than the calls returned before the last returned fsync.
    #[test]
    fn the_prefix_promise_takes_prefixes_only_and_nothing_before_an_fsync() {
        let mut ev = Vec::new();
        let names = ["a", "b", "c"];
        for (i, n) in names.iter().enumerate() {
            let id = i as u64 + 1;
            ev.push(begin(
                id,
                Op::Create {
                    path: n.to_string(),
                },
            ));
            ev.push(Event::End {
                id,
                result: ok(Some(10 + id)),
            });
        }
        // fsync (#4) after a, b, c; then d (#5) returns and e (#6) is in flight.
        ev.push(begin(4, Op::Fsync { ino: 11 }));
        ev.push(Event::Flush);
        ev.push(Event::End {
            id: 4,
            result: ok(None),
        });
        let fsync_end = ev.len();
        ev.push(begin(5, Op::Create { path: "d".into() }));
        ev.push(Event::End {
            id: 5,
            result: ok(Some(14)),
        });
        ev.push(begin(6, Op::Create { path: "e".into() }));
        ev.push(Event::Flush);
        let end = ev.len();
        let rec = Recording {
            header: hdr(),
            events: ev,
        };
        let t = Timeline::new(&rec, Model::default());
        let obs = |names: &[&str]| {
            let mut o = Observed::default();
            for n in names {
                let ino = 11 + (n.as_bytes()[0] - b'a') as u64;
                o.paths.insert(n.to_string(), file(ino, b""));
            }
            o
        };
        let prefix = Promises {
            prefix: true,
            ..ASYNC
        };
        let ok_at = |cp: usize, names: &[&str]| {
            let v = t.judge(cp, &obs(names), prefix, &none());
            v.violations.is_empty()
        };
        // After the fsync returned: a, b, c must be there; d and e may be.
        assert!(ok_at(end, &["a", "b", "c"]));
        assert!(ok_at(end, &["a", "b", "c", "d"]));
        assert!(ok_at(end, &["a", "b", "c", "d", "e"]));
        assert!(!ok_at(end, &["a", "b"]), "the fsync made c durable");
        assert!(
            !ok_at(end, &["a", "b", "c", "e"]),
            "e without d is no prefix"
        );
        // Before the fsync returned any prefix goes, and only a prefix.
        assert!(ok_at(fsync_end - 1, &[]));
        assert!(ok_at(fsync_end - 1, &["a"]));
        assert!(!ok_at(fsync_end - 1, &["b"]), "b without a is no prefix");
        assert!(!ok_at(fsync_end - 1, &["a", "c"]));
        // async promises none of it.
        assert!(
            t.judge(end, &obs(&["a", "c", "e"]), ASYNC, &none())
                .violations
                .is_empty()
        );
    }

    #[test]
    fn a_missing_entry_for_a_returned_sync_create_is_flagged() {
        let (_, t) = timeline();
        // Crash after the create returned (event 3 on), with an empty root.
        let empty = Observed::default();
        let v = t.judge(3, &empty, SYNC, &none());
        assert_eq!(v.violations.len(), 2, "{:?}", v.violations);
        assert!(v.violations[0].contains("'/a'"), "{}", v.violations[0]);
        assert!(v.violations[0].contains("create #1"), "{}", v.violations[0]);
        // The name was durable when the create returned: the inode must keep one.
        assert!(
            v.violations[1].contains("inode 7 has no name on disk"),
            "{}",
            v.violations[1]
        );
        // The same state before the create returned is fine: it was in flight.
        assert!(t.judge(2, &empty, SYNC, &none()).violations.is_empty());
        // async promises no names.
        assert!(t.judge(3, &empty, ASYNC, &none()).violations.is_empty());
    }

    #[test]
    fn an_operation_in_flight_may_or_may_not_show() {
        let (_, t) = timeline();
        let data = tag_data(7, 1, 0, 32);
        let mut obs = Observed::default();
        obs.paths.insert("a".into(), file(7, &data));
        assert!(t.judge(9, &obs, SYNC, &none()).violations.is_empty());
        obs.paths.insert("b".into(), file(8, b""));
        assert!(t.judge(9, &obs, SYNC, &none()).violations.is_empty());
        // But a name nobody created is flagged.
        obs.paths.insert("c".into(), file(9, b""));
        let v = t.judge(9, &obs, SYNC, &none());
        assert_eq!(v.violations.len(), 1);
        assert!(v.violations[0].contains("'/c': expected absent"));
    }

    #[test]
    fn fsynced_contents_are_checked_in_every_mode() {
        let (_, t) = timeline();
        let data = tag_data(7, 1, 0, 32);
        let mut obs = Observed::default();
        obs.paths.insert("a".into(), file(7, &data[..16]));
        let v = t.judge(9, &obs, ASYNC, &none());
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert!(v.violations[0].contains("fsynced file (inode 7) holds 16 bytes, 32"));
        // Before the fsync returned there is no promise.
        assert!(t.judge(6, &obs, ASYNC, &none()).violations.is_empty());
        // Found by inode wherever its name is.
        let mut moved = Observed::default();
        moved.paths.insert("elsewhere".into(), file(7, &data));
        assert!(t.judge(9, &moved, ASYNC, &none()).violations.is_empty());
        // A mode that keeps names must show it; async (no names kept) may lose its name.
        let kept = Promises {
            names_kept: true,
            ..ASYNC
        };
        let v = t.judge(9, &Observed::default(), kept, &none()).violations;
        assert!(
            v.contains(&"fsynced file (inode 7) is not in the tree".to_string()),
            "{v:?}"
        );
        assert!(
            t.judge(9, &Observed::default(), ASYNC, &none())
                .violations
                .is_empty()
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
        let v = t.judge(4, &obs, ASYNC, &none());
        assert_eq!(v.stale.len(), 1);
        assert!(v.violations.is_empty(), "async does not promise it");
        let v = t.judge(
            4,
            &obs,
            Promises {
                no_stale_data: true,
                ..ASYNC
            },
            &none(),
        );
        assert_eq!(v.violations.len(), 1);
    }

    fn begin(id: u64, op: Op) -> Event {
        Event::Begin { id, op }
    }

    fn end(id: u64, ino: Option<u64>) -> Event {
        Event::End {
            id,
            result: ok(ino),
        }
    }

    fn dir(ino: u64) -> ObsNode {
        ObsNode {
            kind: Kind::Dir,
            ino,
            generation: 1,
            perm: 0o755,
            size: 4096,
            content: None,
        }
    }

    fn timeline_of(events: Vec<Event>) -> Timeline {
        let rec = Recording {
            header: hdr(),
            events,
        };
        Timeline::new(&rec, Model::default())
    }

    /// Directories p (10) and q (11) made, and p/f (12) created.
    fn p_q_f() -> Vec<Event> {
        vec![
            begin(1, Op::Mkdir { path: "p".into() }),
            end(1, Some(10)),
            begin(2, Op::Mkdir { path: "q".into() }),
            end(2, Some(11)),
            begin(3, Op::Create { path: "p/f".into() }),
            end(3, Some(12)),
        ]
    }

    /// A state is one moment: a rename in flight may show the old name, the new one, or
    /// both (rule 3 writes the new first), but never neither, though each missing name
    /// alone is explained by some moment.
    #[test]
    fn a_rename_in_flight_is_judged_as_a_whole_state() {
        let t = timeline_of(
            [
                p_q_f(),
                vec![
                    begin(
                        4,
                        Op::Rename {
                            from: "p/f".into(),
                            to: "q/f".into(),
                            whiteout: false,
                        },
                    ),
                    Event::Flush,
                    end(4, None),
                ],
            ]
            .concat(),
        );
        let state = |names: &[&str]| {
            let mut o = Observed::default();
            o.paths.insert("p".into(), dir(10));
            o.paths.insert("q".into(), dir(11));
            for n in names {
                o.paths.insert(n.to_string(), file(12, b""));
            }
            t.judge(7, &o, SYNC, &none())
        };
        assert!(state(&["p/f"]).violations.is_empty());
        assert!(state(&["q/f"]).violations.is_empty());
        assert!(state(&["p/f", "q/f"]).violations.is_empty(), "half done");
        let v = state(&[]);
        assert!(!v.violations.is_empty());
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("inode 12 has no name on disk")),
            "{:?}",
            v.violations
        );
        // After the rename returned, only the new name.
        let mut o = Observed::default();
        o.paths.insert("p".into(), dir(10));
        o.paths.insert("q".into(), dir(11));
        o.paths.insert("p/f".into(), file(12, b""));
        assert!(!t.judge(9, &o, SYNC, &none()).violations.is_empty());
    }

    /// A returned setattr's size is durable in sync; a write's size is not promised.
    #[test]
    fn a_returned_truncate_fixes_the_size_on_disk_in_sync() {
        let data: Arc<[u8]> = Arc::from(tag_data(7, 1, 0, 64));
        let t = timeline_of(vec![
            begin(1, Op::Create { path: "a".into() }),
            end(1, Some(7)),
            begin(
                2,
                Op::Write {
                    ino: 7,
                    offset: 0,
                    data: data.clone(),
                },
            ),
            end(2, None),
            begin(3, Op::Truncate { ino: 7, size: 32 }),
            Event::Flush,
            end(3, None),
            begin(4, Op::Fsync { ino: 99 }),
            Event::Flush,
        ]);
        let with = |content: &[u8]| {
            let mut o = Observed::default();
            o.paths.insert("a".into(), file(7, content));
            o
        };
        // Before the truncate returned: 0 (create) or 64 (the write's size reached disk).
        assert!(
            t.judge(6, &with(&data), SYNC, &none())
                .violations
                .is_empty()
        );
        assert!(t.judge(6, &with(b""), SYNC, &none()).violations.is_empty());
        assert!(
            t.judge(6, &with(&data[..32]), SYNC, &none())
                .violations
                .is_empty()
        );
        // After: 32 only.
        assert!(
            t.judge(8, &with(&data[..32]), SYNC, &none())
                .violations
                .is_empty()
        );
        let v = t.judge(8, &with(&data), SYNC, &none());
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert!(
            v.violations[0].contains("size 64 on disk, expected 32 after truncate #3"),
            "{}",
            v.violations[0]
        );
        assert!(
            t.judge(8, &with(&data), ASYNC, &none())
                .violations
                .is_empty()
        );
    }

    /// Once an fsync in flight has written the inode, the file's bytes within its size are
    /// content it had: zeros where data was written, or another file's bytes, break the
    /// promise. Before that write, the same state is FFS's ordinary stale-data window:
    /// counted, not a violation.
    #[test]
    fn an_fsync_that_wrote_the_inode_promises_complete_contents() {
        let data: Arc<[u8]> = Arc::from(tag_data(7, 1, 0, 32));
        let t = timeline_of(vec![
            begin(1, Op::Create { path: "a".into() }),
            end(1, Some(7)),
            begin(
                2,
                Op::Write {
                    ino: 7,
                    offset: 0,
                    data: data.clone(),
                },
            ),
            end(2, None),
            begin(3, Op::Fsync { ino: 7 }),
            Event::Flush,
            Event::Flush,
            end(3, None),
        ]);
        let with = |content: &[u8]| {
            let mut o = Observed::default();
            o.paths.insert("a".into(), file(7, content));
            o
        };
        let wrote: HashSet<u64> = [7].into();
        let zeros = with(&[0u8; 32]);
        let v = t.judge(6, &zeros, ASYNC, &wrote);
        assert_eq!(v.violations.len(), 1, "{:?}", v.violations);
        assert!(
            v.violations[0].contains("zeros where data was written at offset 0")
                && v.violations[0].contains("fsync #3"),
            "{}",
            v.violations[0]
        );
        let v = t.judge(6, &zeros, ASYNC, &none());
        assert!(v.violations.is_empty());
        assert_eq!(v.stale.len(), 1, "counted as stale data");
        let mut foreign = data.to_vec();
        foreign[16..].copy_from_slice(&tag_data(9, 4, 0, 16));
        let v = t.judge(6, &with(&foreign), SYNC, &wrote);
        assert!(
            v.violations
                .iter()
                .any(|m| m.contains("data of inode 9 generation 4 at offset 16")),
            "{:?}",
            v.violations
        );
        // The complete contents, or the old (empty) file, are fine.
        assert!(t.judge(6, &with(&data), SYNC, &wrote).violations.is_empty());
        assert!(t.judge(6, &with(b""), SYNC, &wrote).violations.is_empty());
        // A hole is zeros the file had.
        assert!(foreign_piece(&[0u8; 16], &[Arc::new(vec![0u8; 16])], 7, 1, true).is_none());
    }

    /// Names kept (002 §3 rule 3) in a mode without durability on return: a name made
    /// durable by sync(2), or by an fsync while its directory was durable, survives a
    /// rename in flight under the old name, the new one or both — never neither; a name
    /// never made durable, or one an unlink took, may go; `async` promises nothing.
    #[test]
    fn a_durable_name_survives_every_crash_until_it_is_unlinked() {
        let kept = Promises {
            names_kept: true,
            ..ASYNC
        };
        let t = timeline_of(
            [
                p_q_f(),
                vec![
                    begin(4, Op::SyncAll),
                    Event::Flush,
                    end(4, None),
                    // g in a durable directory, fsynced: durable; h in a new directory: not.
                    begin(5, Op::Mkdir { path: "n".into() }),
                    end(5, Some(13)),
                    begin(6, Op::Create { path: "p/g".into() }),
                    end(6, Some(14)),
                    begin(7, Op::Create { path: "n/h".into() }),
                    end(7, Some(15)),
                    begin(8, Op::Fsync { ino: 14 }),
                    end(8, None),
                    begin(9, Op::Fsync { ino: 15 }),
                    end(9, None),
                    begin(
                        10,
                        Op::Rename {
                            from: "p/f".into(),
                            to: "q/f".into(),
                            whiteout: false,
                        },
                    ),
                    Event::Flush,
                    end(10, None),
                    begin(11, Op::Unlink { path: "p/g".into() }),
                    Event::Flush,
                    end(11, None),
                ],
            ]
            .concat(),
        );
        let state = |cp: usize, names: &[(&str, u64)]| {
            let mut o = Observed::default();
            for &(n, ino) in names {
                let node = if ino < 12 { dir(ino) } else { file(ino, b"") };
                o.paths.insert(n.to_string(), node);
            }
            t.judge(cp, &o, kept, &none()).violations
        };
        let dirs = [("p", 10), ("q", 11)];
        let with = |extra: &[(&'static str, u64)]| -> Vec<(&'static str, u64)> {
            dirs.iter().chain(extra).copied().collect()
        };
        // The rename in flight (crash at its flush, event 20): f under either name or both.
        let cp = 20;
        for names in [
            with(&[("p/f", 12), ("p/g", 14)]),
            with(&[("q/f", 12), ("p/g", 14)]),
            with(&[("p/f", 12), ("q/f", 12), ("p/g", 14)]),
        ] {
            assert!(state(cp, &names).is_empty(), "{names:?}");
        }
        let v = state(cp, &with(&[("p/g", 14)]));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("inode 12 has no name on disk") && v[0].contains("sync #4"),
            "{}",
            v[0]
        );
        // g's fsync made its name durable; h's did not (n was never made durable).
        let v = state(cp, &with(&[("q/f", 12)]));
        assert!(
            v.len() == 1 && v[0].contains("inode 14") && v[0].contains("fsync #8"),
            "{v:?}"
        );
        // Before the sync returned, nothing was durable.
        assert!(state(8, &[]).is_empty());
        // After g's unlink began (crash at its flush, event 23), g may be gone.
        assert!(state(23, &with(&[("q/f", 12)])).is_empty());
        // (h, fsynced, is held to its fsync by another check once nothing is in flight.)
        let h = [("q/f", 12), ("n", 13), ("n/h", 15)];
        assert!(
            state(25, &with(&h)).is_empty(),
            "{:?}",
            state(25, &with(&h))
        );
        // async keeps no names (what the sync made durable it keeps, f aside: the rename
        // in flight touches it).
        let mut o = Observed::default();
        o.paths.insert("p".into(), dir(10));
        o.paths.insert("q".into(), dir(11));
        assert!(t.judge(cp, &o, ASYNC, &none()).violations.is_empty());
        assert_eq!(t.judge(cp, &o, kept, &none()).violations.len(), 2);
    }
}
