//! Snapshots of a directory tree, for comparing two trees (differential test) or one tree
//! before and after an unmount (persistence).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// What [`snapshot`] records and [`diff`] compares.
#[derive(Clone, Copy, Debug)]
pub struct Opts {
    /// Compare mtimes (persistence: yes; differential: no, the two trees are changed at
    /// different instants).
    pub mtimes: bool,
    /// Compare owners.
    pub owners: bool,
    /// Read extended attributes (user.* only; security.* may be added by the host).
    pub xattrs: bool,
}

impl Opts {
    pub const ALL: Opts = Opts {
        mtimes: true,
        owners: true,
        xattrs: true,
    };
    pub const CONTENT: Opts = Opts {
        mtimes: false,
        owners: true,
        xattrs: false,
    };
}

/// One object in a tree. Inode numbers, st_dev, st_blocks, atime and directory sizes differ
/// legitimately between file systems and are not recorded; hard links are recorded as the
/// first path (in walk order) that names the same inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    /// Regular files and symlinks only.
    pub size: u64,
    pub nlink: u64,
    pub mtime_ns: Option<i128>,
    /// Regular files: length and FNV-1a digest of the contents; symlinks: the target.
    pub content: Vec<u8>,
    pub rdev: u64,
    pub xattrs: BTreeMap<String, Vec<u8>>,
    /// For hard links: the first path naming the same inode.
    pub link_of: Option<Vec<u8>>,
}

/// A tree: relative path bytes -> entry.
pub type Tree = BTreeMap<Vec<u8>, Entry>;

fn kind_of(ft: &fs::FileType) -> &'static str {
    if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() {
        "chardev"
    } else if ft.is_block_device() {
        "blockdev"
    } else {
        "unknown"
    }
}

/// Digest of a file's contents: 8 bytes of length then 8 bytes of FNV-1a.
pub fn file_digest(p: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = fs::File::open(p)?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut len = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        len += n as u64;
        for &b in &buf[..n] {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    let mut v = len.to_le_bytes().to_vec();
    v.extend_from_slice(&h.to_le_bytes());
    Ok(v)
}

/// Snapshots the tree under `root` (not `root` itself), skipping `skip` names at the top
/// level (e.g. "lost+found").
pub fn snapshot(root: &Path, opts: Opts, skip: &[&str]) -> std::io::Result<Tree> {
    let mut out = Tree::new();
    let mut seen: BTreeMap<(u64, u64), Vec<u8>> = BTreeMap::new();
    walk(root, Vec::new(), opts, skip, &mut out, &mut seen)?;
    Ok(out)
}

fn walk(
    dir: &Path,
    rel: Vec<u8>,
    opts: Opts,
    skip: &[&str],
    out: &mut Tree,
    seen: &mut BTreeMap<(u64, u64), Vec<u8>>,
) -> std::io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort();
    for name in names {
        if rel.is_empty() && skip.iter().any(|s| name.as_bytes() == s.as_bytes()) {
            continue;
        }
        let path = dir.join(&name);
        let mut r = rel.clone();
        if !r.is_empty() {
            r.push(b'/');
        }
        r.extend_from_slice(name.as_bytes());
        let m = fs::symlink_metadata(&path)?;
        let kind = kind_of(&m.file_type());
        let mut link_of = None;
        if kind != "dir" && m.nlink() > 1 {
            match seen.get(&(m.dev(), m.ino())) {
                Some(first) => link_of = Some(first.clone()),
                None => {
                    seen.insert((m.dev(), m.ino()), r.clone());
                }
            }
        }
        let content = match kind {
            "file" if link_of.is_none() => file_digest(&path)?,
            "symlink" => fs::read_link(&path)?.as_os_str().as_bytes().to_vec(),
            _ => Vec::new(),
        };
        let mut xattrs = BTreeMap::new();
        if opts.xattrs && kind != "symlink" {
            for n in crate::sys::listxattr(&path)? {
                if n.starts_with("user.") {
                    xattrs.insert(n.clone(), crate::sys::getxattr(&path, &n)?);
                }
            }
        }
        let e = Entry {
            kind,
            perm: m.mode() & 0o7777,
            uid: if opts.owners { m.uid() } else { 0 },
            gid: if opts.owners { m.gid() } else { 0 },
            size: if kind == "dir" { 0 } else { m.size() },
            nlink: m.nlink(),
            mtime_ns: opts
                .mtimes
                .then(|| m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128),
            content,
            rdev: m.rdev(),
            xattrs,
            link_of,
        };
        out.insert(r.clone(), e);
        if kind == "dir" {
            walk(&path, r, opts, skip, out, seen)?;
        }
    }
    Ok(())
}

/// The differences between two trees, one line each (empty = identical).
pub fn diff(a_name: &str, a: &Tree, b_name: &str, b: &Tree) -> Vec<String> {
    let mut out = Vec::new();
    for (k, ea) in a {
        let name = String::from_utf8_lossy(k);
        match b.get(k) {
            None => out.push(format!("{name}: only in {a_name}")),
            Some(eb) if ea != eb => out.push(format!("{name}: {a_name} {ea:?} != {b_name} {eb:?}")),
            Some(_) => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            out.push(format!("{}: only in {b_name}", String::from_utf8_lossy(k)));
        }
    }
    out
}
