//! Shared by the error-path tests: a reference model of a file tree, the operations the
//! tests apply to both the engine and the model, and the checks (fsck, full comparison).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, FaultDevice, MemDevice};
use cairn_ffs::{Ffs, MkfsOptions, MountOptions, mkfs_device};
use cairn_fsck::{CheckOptions, check};
use cairn_vfs::{Ctx, Errno, FileKind, FileSystem, RenameFlags, SetAttr};

pub const BS: u64 = 4096;

pub fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A name of 255 bytes starting with `c`: a chunk of a directory block holds only one more
/// such record after `.` and `..`, so the tests can fill a directory block exactly.
pub fn long(c: char) -> String {
    std::iter::repeat_n(c, 255).collect()
}

/// Bytes that differ per seed and position.
pub fn data(seed: u32, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| {
            (i.wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97))
                >> 13) as u8
        })
        .collect()
}

pub fn mkfs(blocks: u64, bpg: u64) -> MemDevice {
    let dev = MemDevice::new(BS as u32, blocks);
    mkfs_device(
        &dev,
        &MkfsOptions {
            blocks_per_group: Some(bpg),
            ..Default::default()
        },
    )
    .unwrap();
    dev
}

pub fn mount_on(dev: Arc<dyn BlockDevice>, mode: &str, cache_bytes: u64) -> Arc<Ffs> {
    Ffs::mount_device(
        dev,
        &MountOptions {
            mode: mode.into(),
            cache_bytes,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Mounts `mem` behind a fault injector.
pub fn mount_faulty(mem: &MemDevice, mode: &str, cache_bytes: u64) -> (Arc<FaultDevice>, Arc<Ffs>) {
    let fault = Arc::new(FaultDevice::new(Arc::new(mem.with_block_size(BS as u32))));
    let fs = mount_on(fault.clone(), mode, cache_bytes);
    (fault, fs)
}

pub fn mount(mem: &MemDevice, mode: &str) -> Arc<Ffs> {
    mount_on(Arc::new(mem.with_block_size(BS as u32)), mode, 64 << 20)
}

/// fsck's corruption findings (leaks are what a crash may leave) on an image.
pub fn corruptions(bytes: Vec<u8>) -> String {
    let r = check(
        &MemDevice::from_bytes(BS as u32, bytes),
        CheckOptions {
            repair: false,
            progress: None,
            ..Default::default()
        },
    )
    .expect("fsck runs");
    r.corruptions()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// fsck's findings on `mem`, one per line (empty: clean).
pub fn fsck(mem: &MemDevice) -> String {
    let r = check(
        &mem.with_block_size(BS as u32),
        CheckOptions {
            repair: false,
            progress: None,
            ..Default::default()
        },
    )
    .expect("fsck runs");
    r.findings
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------
// The model

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(Vec<u8>),
    Fifo,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub kind: Kind,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// What the tree must hold: names (paths, "" is the root) to node ids, and the nodes.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub names: BTreeMap<String, u64>,
    pub nodes: HashMap<u64, Node>,
    next: u64,
}

fn parent_of(p: &str) -> &str {
    p.rfind('/').map_or("", |i| &p[..i])
}

fn base_of(p: &str) -> &str {
    p.rfind('/').map_or(p, |i| &p[i + 1..])
}

impl Model {
    /// A fresh file system: the root and lost+found.
    pub fn new() -> Model {
        let mut m = Model::default();
        m.add("", Kind::Dir);
        m.add("lost+found", Kind::Dir);
        m
    }

    fn add(&mut self, path: &str, kind: Kind) {
        self.next += 1;
        self.nodes.insert(
            self.next,
            Node {
                kind,
                xattrs: BTreeMap::new(),
            },
        );
        self.names.insert(path.to_string(), self.next);
    }

    pub fn node(&self, path: &str) -> Option<&Node> {
        self.names.get(path).and_then(|i| self.nodes.get(i))
    }

    fn node_mut(&mut self, path: &str) -> &mut Node {
        let id = self.names[path];
        self.nodes.get_mut(&id).unwrap()
    }

    fn file_mut(&mut self, path: &str) -> &mut Vec<u8> {
        match &mut self.node_mut(path).kind {
            Kind::File(d) => d,
            k => panic!("{path} is not a file: {k:?}"),
        }
    }

    pub fn children(&self, dir: &str) -> Vec<String> {
        self.names
            .keys()
            .filter(|p| !p.is_empty() && parent_of(p) == dir)
            .map(|p| base_of(p).to_string())
            .collect()
    }

    pub fn paths(&self, pred: impl Fn(&Kind) -> bool) -> Vec<String> {
        self.names
            .iter()
            .filter(|(p, id)| !p.is_empty() && pred(&self.nodes[id].kind))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn remove_name(&mut self, path: &str) {
        let id = self.names.remove(path).unwrap();
        if !self.names.values().any(|&i| i == id) {
            self.nodes.remove(&id);
        }
    }

    fn links(&self, id: u64) -> usize {
        self.names.values().filter(|&&i| i == id).count()
    }
}

// ---------------------------------------------------------------------------------------
// Operations on both

/// One operation, by path. Renames replace an existing target (file, or empty directory).
#[derive(Clone, Debug)]
pub enum Op {
    Create(String),
    Mknod(String),
    Mkdir(String),
    Symlink(String, Vec<u8>),
    Link(String, String),
    Rename(String, String),
    SetXattr(String, Vec<u8>, Vec<u8>),
    RemoveXattr(String, Vec<u8>),
    Write(String, u64, Vec<u8>),
    Fallocate(String, u64, u64),
    Punch(String, u64, u64),
    Truncate(String, u64),
    OpenTrunc(String),
    Unlink(String),
    Rmdir(String),
}

impl Op {
    /// A short label for messages (long names abbreviated).
    pub fn label(&self) -> String {
        let s = match self {
            Op::Write(p, off, d) => format!("Write({p:?}, {off}, {} bytes)", d.len()),
            Op::SetXattr(p, k, v) => format!(
                "SetXattr({p:?}, {:?}, {} bytes)",
                String::from_utf8_lossy(k),
                v.len()
            ),
            Op::Symlink(p, t) => format!("Symlink({p:?}, {} bytes)", t.len()),
            _ => format!("{self:?}"),
        };
        let mut out = String::new();
        let mut run = 0;
        for c in s.chars() {
            run = if out.ends_with(c) { run + 1 } else { 0 };
            if run < 4 {
                out.push(c);
            }
        }
        out.chars().take(120).collect()
    }
}

/// Looks `path` up component by component and drops the lookup references at once, as a
/// kernel that forgets promptly would (so unlinked inodes are freed inside the operation
/// that drops their last name, the path the undo must handle).
pub fn resolve(fs: &Ffs, path: &str) -> Result<u64, Errno> {
    let c = Ctx::root();
    let mut ino = fs.root_ino();
    if path.is_empty() {
        return Ok(ino);
    }
    for comp in path.split('/') {
        let a = fs.lookup(&c, ino, n(comp)).map_err(|e| e.errno())?;
        fs.forget(a.ino, 1);
        ino = a.ino;
    }
    Ok(ino)
}

fn parent_and_name(fs: &Ffs, path: &str) -> Result<(u64, String), Errno> {
    Ok((resolve(fs, parent_of(path))?, base_of(path).to_string()))
}

impl Op {
    /// Runs the operation on the engine; Ok carries the bytes a write wrote.
    pub fn run(&self, fs: &Ffs) -> Result<u64, Errno> {
        let c = Ctx::root();
        let e = |x: cairn_vfs::FsError| x.errno();
        match self {
            Op::Create(p) => {
                let (d, name) = parent_and_name(fs, p)?;
                let (a, fh) = fs
                    .create(&c, d, n(&name), 0o644, 0, libc::O_RDWR)
                    .map_err(e)?;
                fs.release(a.ino, fh).map_err(e)?;
                fs.forget(a.ino, 1);
                Ok(0)
            }
            Op::Mknod(p) => {
                let (d, name) = parent_and_name(fs, p)?;
                let a = fs
                    .mknod(&c, d, n(&name), libc::S_IFIFO | 0o644, 0, 0)
                    .map_err(e)?;
                fs.forget(a.ino, 1);
                Ok(0)
            }
            Op::Mkdir(p) => {
                let (d, name) = parent_and_name(fs, p)?;
                let a = fs.mkdir(&c, d, n(&name), 0o755, 0).map_err(e)?;
                fs.forget(a.ino, 1);
                Ok(0)
            }
            Op::Symlink(p, t) => {
                let (d, name) = parent_and_name(fs, p)?;
                let a = fs.symlink(&c, d, n(&name), t).map_err(e)?;
                fs.forget(a.ino, 1);
                Ok(0)
            }
            Op::Link(from, to) => {
                let ino = resolve(fs, from)?;
                let (d, name) = parent_and_name(fs, to)?;
                let a = fs.link(&c, ino, d, n(&name)).map_err(e)?;
                fs.forget(a.ino, 1);
                Ok(0)
            }
            Op::Rename(from, to) => {
                let (d1, n1) = parent_and_name(fs, from)?;
                let (d2, n2) = parent_and_name(fs, to)?;
                fs.rename(&c, d1, n(&n1), d2, n(&n2), RenameFlags::default())
                    .map_err(e)?;
                Ok(0)
            }
            Op::SetXattr(p, k, v) => {
                let ino = resolve(fs, p)?;
                fs.setxattr(&c, ino, OsStr::new(std::str::from_utf8(k).unwrap()), v, 0)
                    .map_err(e)?;
                Ok(0)
            }
            Op::RemoveXattr(p, k) => {
                let ino = resolve(fs, p)?;
                fs.removexattr(&c, ino, OsStr::new(std::str::from_utf8(k).unwrap()))
                    .map_err(e)?;
                Ok(0)
            }
            Op::Write(p, off, d) => {
                let ino = resolve(fs, p)?;
                Ok(fs.write(ino, 0, *off, d).map_err(e)? as u64)
            }
            Op::Fallocate(p, off, len) => {
                let ino = resolve(fs, p)?;
                fs.fallocate(ino, 0, *off, *len, 0).map_err(e)?;
                Ok(0)
            }
            Op::Punch(p, off, len) => {
                let ino = resolve(fs, p)?;
                fs.fallocate(
                    ino,
                    0,
                    *off,
                    *len,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                )
                .map_err(e)?;
                Ok(0)
            }
            Op::Truncate(p, size) => {
                let ino = resolve(fs, p)?;
                fs.setattr(
                    &c,
                    ino,
                    SetAttr {
                        size: Some(*size),
                        ..Default::default()
                    },
                )
                .map_err(e)?;
                Ok(0)
            }
            Op::OpenTrunc(p) => {
                let ino = resolve(fs, p)?;
                let fh = fs.open(&c, ino, libc::O_RDWR | libc::O_TRUNC).map_err(e)?;
                fs.release(ino, fh).map_err(e)?;
                Ok(0)
            }
            Op::Unlink(p) => {
                let (d, name) = parent_and_name(fs, p)?;
                fs.unlink(&c, d, n(&name)).map_err(e)?;
                Ok(0)
            }
            Op::Rmdir(p) => {
                let (d, name) = parent_and_name(fs, p)?;
                fs.rmdir(&c, d, n(&name)).map_err(e)?;
                Ok(0)
            }
        }
    }

    /// Applies the operation to the model, as it succeeded (`written`: the bytes a write
    /// wrote).
    pub fn apply(&self, m: &mut Model, written: u64) {
        match self {
            Op::Create(p) => m.add(p, Kind::File(Vec::new())),
            Op::Mknod(p) => m.add(p, Kind::Fifo),
            Op::Mkdir(p) => m.add(p, Kind::Dir),
            Op::Symlink(p, t) => m.add(p, Kind::Symlink(t.clone())),
            Op::Link(from, to) => {
                let id = m.names[from];
                m.names.insert(to.clone(), id);
            }
            Op::Rename(from, to) => {
                if m.names.get(from) == m.names.get(to) {
                    return;
                }
                if m.names.contains_key(to) {
                    m.remove_name(to);
                }
                let prefix = format!("{from}/");
                let moved: Vec<String> = m
                    .names
                    .keys()
                    .filter(|k| *k == from || k.starts_with(&prefix))
                    .cloned()
                    .collect();
                for k in moved {
                    let id = m.names.remove(&k).unwrap();
                    m.names.insert(format!("{to}{}", &k[from.len()..]), id);
                }
            }
            Op::SetXattr(p, k, v) => {
                m.node_mut(p).xattrs.insert(k.clone(), v.clone());
            }
            Op::RemoveXattr(p, k) => {
                m.node_mut(p).xattrs.remove(k);
            }
            Op::Write(p, off, d) => {
                let f = m.file_mut(p);
                let end = *off as usize + written as usize;
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[*off as usize..end].copy_from_slice(&d[..written as usize]);
            }
            Op::Fallocate(p, off, len) => {
                let f = m.file_mut(p);
                let end = (off + len) as usize;
                if f.len() < end {
                    f.resize(end, 0);
                }
            }
            Op::Punch(p, off, len) => {
                let f = m.file_mut(p);
                let end = ((off + len) as usize).min(f.len());
                if (*off as usize) < end {
                    f[*off as usize..end].fill(0);
                }
            }
            Op::Truncate(p, size) => m.file_mut(p).resize(*size as usize, 0),
            Op::OpenTrunc(p) => m.file_mut(p).clear(),
            Op::Unlink(p) | Op::Rmdir(p) => m.remove_name(p),
        }
    }
}

/// Compares the whole tree on `fs` with the model: names, kinds, contents, targets,
/// xattrs and link counts. Returns the first difference.
pub fn compare(fs: &Ffs, m: &Model) -> Result<(), String> {
    let c = Ctx::root();
    let mut stack = vec![(String::new(), fs.root_ino())];
    while let Some((path, dino)) = stack.pop() {
        let mut listed = Vec::new();
        fs.readdir(dino, 0, 0, false, &mut |e| {
            let name = e.name.to_string_lossy().into_owned();
            if name != "." && name != ".." {
                listed.push((name, e.ino, e.kind));
            }
            true
        })
        .map_err(|e| format!("readdir {path:?}: {e}"))?;
        let mut want = m.children(&path);
        want.sort();
        let mut got: Vec<String> = listed.iter().map(|x| x.0.clone()).collect();
        got.sort();
        if got != want {
            return Err(format!("directory {path:?}: names {got:?}, model {want:?}"));
        }
        let subdirs = listed.iter().filter(|x| x.2 == FileKind::Directory).count();
        let da = fs.getattr(dino).map_err(|e| e.to_string())?;
        if da.nlink as usize != 2 + subdirs {
            return Err(format!(
                "directory {path:?}: nlink {} with {subdirs} subdirectories",
                da.nlink
            ));
        }
        for (name, ino, kind) in listed {
            let p = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}/{name}")
            };
            let id = m.names[&p];
            let node = &m.nodes[&id];
            let a = fs.getattr(ino).map_err(|e| format!("{p}: {e}"))?;
            if a.kind != kind {
                return Err(format!("{p}: entry type {kind:?}, inode {:?}", a.kind));
            }
            match &node.kind {
                Kind::Dir => {
                    if kind != FileKind::Directory {
                        return Err(format!("{p}: {kind:?}, model a directory"));
                    }
                    stack.push((p.clone(), ino));
                }
                Kind::File(d) => {
                    if kind != FileKind::RegularFile {
                        return Err(format!("{p}: {kind:?}, model a file"));
                    }
                    if a.size != d.len() as u64 {
                        return Err(format!("{p}: size {}, model {}", a.size, d.len()));
                    }
                    let mut buf = Vec::new();
                    fs.read(ino, 0, 0, d.len() as u32 + 1, &mut buf)
                        .map_err(|e| format!("read {p}: {e}"))?;
                    if &buf != d {
                        let at = buf.iter().zip(d).position(|(x, y)| x != y);
                        return Err(format!("{p}: contents differ (first at {at:?})"));
                    }
                    if a.nlink as usize != m.links(id) {
                        return Err(format!("{p}: nlink {}, model {}", a.nlink, m.links(id)));
                    }
                }
                Kind::Symlink(t) => {
                    let got = fs.readlink(ino).map_err(|e| format!("{p}: {e}"))?;
                    if &got != t {
                        return Err(format!("{p}: symlink target differs"));
                    }
                }
                Kind::Fifo => {
                    if kind != FileKind::Fifo {
                        return Err(format!("{p}: {kind:?}, model a fifo"));
                    }
                }
            }
            if matches!(node.kind, Kind::File(_) | Kind::Dir) {
                let list = fs.listxattr(&c, ino).map_err(|e| e.to_string())?;
                let mut names: Vec<Vec<u8>> = list
                    .split(|&b| b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| s.to_vec())
                    .collect();
                names.sort();
                let want: Vec<Vec<u8>> = node.xattrs.keys().cloned().collect();
                if names != want {
                    return Err(format!("{p}: xattr names differ"));
                }
                for (k, v) in &node.xattrs {
                    let got = fs
                        .getxattr(&c, ino, OsStr::new(std::str::from_utf8(k).unwrap()))
                        .map_err(|e| e.to_string())?;
                    if &got != v {
                        return Err(format!("{p}: xattr value differs"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The earlier files every error-path test starts from (and must find intact): nested
/// directories, files from empty to past the single-indirect range, one written by a
/// streaming write, a hard link, short and long symlinks, a fifo, xattrs, an empty
/// directory, a directory to move, and `full`, whose one block has no room left for a
/// 255-byte name (adding one grows it).
pub fn populate(fs: &Ffs, m: &mut Model) {
    let ops = vec![
        Op::Mkdir("a".into()),
        Op::Mkdir("a/b".into()),
        Op::Mkdir("e".into()),
        Op::Mkdir("sub".into()),
        Op::Mkdir("full".into()),
        Op::Create("f".into()),
        Op::Write("f".into(), 0, data(1, 10_000)),
        Op::Create("g".into()),
        Op::Write("g".into(), 0, data(2, 60_000)),
        Op::SetXattr("g".into(), b"user.x".to_vec(), b"gee".to_vec()),
        Op::Create("a/h".into()),
        Op::Write("a/h".into(), 0, data(3, 300)),
        Op::Create("a/b/i".into()),
        Op::Write("a/b/i".into(), 0, data(4, 300_000)),
        Op::Create("empty".into()),
        Op::Create("sub/x".into()),
        Op::Write("sub/x".into(), 0, data(5, 5000)),
        Op::Link("f".into(), "a/f-link".into()),
        Op::Symlink("a/s".into(), b"../f".to_vec()),
        Op::Symlink("a/s-long".into(), vec![b'y'; 300]),
        Op::Mknod("a/fifo".into()),
        Op::SetXattr("a".into(), b"user.dir".to_vec(), b"dee".to_vec()),
    ];
    for op in ops {
        let w = op
            .run(fs)
            .unwrap_or_else(|e| panic!("populate {}: {e:?}", op.label()));
        op.apply(m, w);
    }
    for c in ['1', '2', '3', '4', '5', '6', '7', '8'] {
        let op = Op::Create(format!("full/{}", long(c)));
        op.run(fs).unwrap();
        op.apply(m, 0);
    }
}

/// The operations the error-path tests try (with room to succeed when nothing fails):
/// every kind of creation, including the ones that grow a directory, allocate indirect
/// blocks or an xattr block, plus renames, removals and truncations that free.
pub fn every_op() -> Vec<Op> {
    let full = |c: char| format!("full/{}", long(c));
    vec![
        Op::Create("a/new".into()),
        Op::Create(full('c')),
        Op::Mknod(full('n')),
        Op::Mkdir("a/newdir".into()),
        Op::Mkdir(full('d')),
        Op::Symlink("a/s-new".into(), b"target".to_vec()),
        Op::Symlink("a/s-new-long".into(), vec![b'z'; 400]),
        Op::Symlink(full('s'), vec![b'z'; 400]),
        Op::Link("f".into(), full('l')),
        Op::Rename("g".into(), full('r')),
        Op::Rename("sub".into(), full('m')),
        Op::Rename("a/h".into(), "a/h2".into()),
        Op::Rename("a/h".into(), "g".into()),
        Op::Rename("a/h".into(), "f".into()),
        Op::Rename("e".into(), "a/b/e".into()),
        Op::SetXattr("f".into(), b"user.new".to_vec(), vec![7; 100]),
        Op::SetXattr("g".into(), b"user.more".to_vec(), vec![8; 100]),
        Op::RemoveXattr("g".into(), b"user.x".to_vec()),
        Op::Write("f".into(), 0, data(10, 100)),
        Op::Write("f".into(), 12 * BS, data(11, 5000)),
        Op::Write("f".into(), (12 + 512) * BS + 10, data(12, 100)),
        Op::Write("empty".into(), 0, data(13, 300 << 10)),
        Op::Write("a/h".into(), 100, data(14, 20_000)),
        Op::Fallocate("f".into(), 0, 200 << 10),
        // Large enough for the new blocks to be zeroed on the device, not in buffers.
        Op::Fallocate("f".into(), 200 << 10, 320 << 10),
        Op::Punch("g".into(), BS, 2 * BS),
        Op::Truncate("g".into(), 5000),
        Op::Truncate("f".into(), 1 << 20),
        Op::OpenTrunc("a/h".into()),
        Op::Unlink("f".into()),
        Op::Unlink("a/h".into()),
        Op::Unlink("g".into()),
        Op::Rmdir("e".into()),
    ]
}

/// Free blocks and inodes.
pub fn free(fs: &Ffs) -> (u64, u64) {
    let s = fs.statfs().unwrap();
    (s.bfree, s.ffree)
}
