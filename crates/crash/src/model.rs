//! The reference model the durability oracle compares a crash state against: the namespace
//! (path → node) and every file's contents, as the operations of a recording left them.
//!
//! The model is driven only by what the recording says happened (each operation's
//! description and its result), never by predicting what a call should do: a failed call
//! changes nothing, and the inode a call created is the one it returned.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::record::{Op, OpResult};

/// What a name refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink(Vec<u8>),
    /// fifo, socket or device node.
    Special,
}

impl Kind {
    pub fn describe(&self) -> String {
        match self {
            Kind::File => "file".into(),
            Kind::Dir => "directory".into(),
            Kind::Symlink(t) => format!("symlink -> {}", String::from_utf8_lossy(t)),
            Kind::Special => "special file".into(),
        }
    }
}

/// One name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub kind: Kind,
    /// The inode, when the model knows it (an operation still in flight has not told us).
    pub ino: Option<u64>,
}

/// What the model knows of one inode's data.
#[derive(Clone, Debug, Default)]
pub struct FileState {
    /// `None` when the contents are unknown (a file that existed before the recording and
    /// was written at an offset the model cannot place).
    pub content: Option<Arc<Vec<u8>>>,
    /// Contents at the last fsync that returned, while nothing changed them since.
    pub fsynced: Option<Arc<Vec<u8>>>,
    /// Event index at which that fsync returned (for reports).
    pub fsync_op: u64,
    /// A name of the inode went away after the fsync (unlink, rename over it).
    pub name_lost_since_fsync: bool,
    /// The generation the creating call reported (`None`: not known).
    pub generation: Option<u64>,
    /// The sizes the file may have on disk in a mode whose metadata calls are durable on
    /// return: the size it had when its size was last made durable (create, truncate or
    /// extension by setattr, fsync, sync) and each size a later write gave it (a write's
    /// new size is delayed like its data: it reaches disk with the next write of the inode
    /// block, or not). Empty: nothing promised (contents unknown).
    pub sizes: Vec<u64>,
}

/// The namespace and file contents at one moment.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub paths: BTreeMap<String, Node>,
    pub files: HashMap<u64, FileState>,
    /// Permission bits of inodes, as the last call that reported them said.
    pub perms: HashMap<u64, u16>,
    /// An operation the recorder could not describe returned: names are no longer known.
    pub unknown: bool,
}

fn parent_of(p: &str) -> &str {
    p.rfind('/').map_or("", |i| &p[..i])
}

/// `p` is `dir` or below it.
pub fn under(p: &str, dir: &str) -> bool {
    p == dir || (p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/')
}

impl Model {
    /// Applies one operation. `result` is `None` for an operation still in flight: its
    /// effect is applied as if it succeeded, without the inode it would have reported.
    pub fn apply(&mut self, op: &Op, result: Option<&OpResult>) {
        if let Some(r) = result {
            if !r.ok() {
                return;
            }
            if let (Some(ino), Some(perm)) = (r.ino, r.perm) {
                self.perms.insert(ino, perm);
            }
        }
        let ino = result.and_then(|r| r.ino);
        let add = |m: &mut Model, path: &str, kind: Kind| {
            if !m.paths.contains_key(parent_of(path)) && !parent_of(path).is_empty() {
                // The parent is unknown to the model: do not invent it.
                m.unknown = true;
            }
            m.paths.insert(path.to_string(), Node { kind, ino });
        };
        match op {
            Op::Create { .. } | Op::Tmpfile { .. } => {
                // A tmpfile is a file with no name: a link may name it later.
                if let Op::Create { path } = op {
                    add(self, path, Kind::File);
                }
                if let Some(i) = ino {
                    self.files.insert(
                        i,
                        FileState {
                            content: Some(Arc::new(Vec::new())),
                            generation: result.and_then(|r| r.generation),
                            sizes: vec![0],
                            ..Default::default()
                        },
                    );
                }
            }
            Op::Mknod { path } => add(self, path, Kind::Special),
            Op::Mkdir { path } => add(self, path, Kind::Dir),
            Op::Symlink { path, target } => {
                add(self, path, Kind::Symlink(target.as_bytes().to_vec()))
            }
            Op::Link { ino: target, path } => {
                let kind = self
                    .paths
                    .values()
                    .find(|n| n.ino == Some(*target))
                    .map_or(Kind::File, |n| n.kind.clone());
                self.paths.insert(
                    path.clone(),
                    Node {
                        kind,
                        ino: Some(*target),
                    },
                );
            }
            Op::Unlink { path } => {
                if let Some(n) = self.paths.remove(path)
                    && let Some(i) = n.ino
                    && let Some(f) = self.files.get_mut(&i)
                {
                    f.name_lost_since_fsync = true;
                }
            }
            Op::Rmdir { path } => {
                self.remove_tree(path);
            }
            Op::Rename { from, to, whiteout } => {
                self.rename(from, to);
                // The old name now names the whiteout, an inode the call does not report.
                if *whiteout && from != to && !under(to, from) {
                    self.paths.insert(
                        from.clone(),
                        Node {
                            kind: Kind::Special,
                            ino: None,
                        },
                    );
                }
            }
            Op::Write {
                ino: i,
                offset,
                data,
            } => {
                let f = self.files.entry(*i).or_default();
                f.fsynced = None;
                if let Some(c) = &mut f.content {
                    write_into(Arc::make_mut(c), *offset, data);
                    let len = c.len() as u64;
                    if !f.sizes.is_empty() && !f.sizes.contains(&len) {
                        f.sizes.push(len);
                    }
                }
            }
            Op::Truncate { ino: i, size } => {
                let f = self.files.entry(*i).or_default();
                f.fsynced = None;
                if let Some(c) = &mut f.content {
                    Arc::make_mut(c).resize(*size as usize, 0);
                    // Durable on return in `sync` (setattr is a metadata call).
                    f.sizes = vec![*size];
                }
            }
            Op::Chmod { ino: i, mode } => {
                // In flight: the call would report the new bits.
                if result.is_none() {
                    self.perms.insert(*i, (*mode & 0o7777) as u16);
                }
            }
            Op::SetAttr { .. } | Op::Release { .. } | Op::Forget { .. } | Op::Fsyncdir { .. } => {}
            Op::Fsync { ino: i } => {
                if result.is_some()
                    && let Some(f) = self.files.get_mut(i)
                    && let Some(c) = &f.content
                {
                    f.fsynced = Some(c.clone());
                    f.name_lost_since_fsync = false;
                    f.sizes = vec![c.len() as u64];
                }
            }
            Op::SyncAll | Op::Unmount => {
                for f in self.files.values_mut() {
                    if let Some(c) = &f.content {
                        f.sizes = vec![c.len() as u64];
                    }
                }
            }
            Op::Unknown { .. } => self.unknown = true,
        }
    }

    fn remove_tree(&mut self, path: &str) {
        let gone: Vec<String> = self
            .paths
            .range(path.to_string()..)
            .take_while(|(p, _)| p.starts_with(path))
            .filter(|(p, _)| under(p, path))
            .map(|(p, _)| p.clone())
            .collect();
        for p in gone {
            if let Some(n) = self.paths.remove(&p)
                && let Some(i) = n.ino
                && let Some(f) = self.files.get_mut(&i)
            {
                f.name_lost_since_fsync = true;
            }
        }
    }

    /// The namespaces a rename passes through on disk when it is not atomic: rule 3 (002
    /// §3) puts the new name (replacing what `to` named) on disk before the old one is
    /// removed, so between the two both names exist. A directory reached by its second name
    /// is not descended again by the walk, so its subtree shows under whichever name the
    /// walk reached first: two variants. Empty when the rename would do nothing.
    pub fn rename_midway(&self, from: &str, to: &str) -> Vec<Model> {
        if from == to || under(to, from) {
            return Vec::new();
        }
        let Some(node) = self.paths.get(from).cloned() else {
            return Vec::new();
        };
        let mut both = self.clone();
        both.remove_tree(to);
        if node.kind != Kind::Dir {
            both.paths.insert(to.to_string(), node);
            return vec![both];
        }
        let mut subtree_at_to = both.clone();
        subtree_at_to.rename(from, to);
        subtree_at_to.paths.insert(from.to_string(), node.clone());
        both.paths.insert(to.to_string(), node);
        vec![both, subtree_at_to]
    }

    fn rename(&mut self, from: &str, to: &str) {
        if from == to || under(to, from) {
            return;
        }
        let Some(node) = self.paths.get(from).cloned() else {
            self.unknown = true;
            return;
        };
        // Whatever `to` named is replaced (an empty directory or a non-directory).
        self.remove_tree(to);
        if node.kind == Kind::Dir {
            let moving: Vec<String> = self
                .paths
                .range(from.to_string()..)
                .take_while(|(p, _)| p.starts_with(from))
                .filter(|(p, _)| under(p, from))
                .map(|(p, _)| p.clone())
                .collect();
            for p in moving {
                if let Some(n) = self.paths.remove(&p) {
                    self.paths.insert(format!("{to}{}", &p[from.len()..]), n);
                }
            }
        } else {
            self.paths.remove(from);
            self.paths.insert(to.to_string(), node);
        }
    }
}

/// Writes `data` at `offset` of `c`, growing it with zeros as a file grows.
pub fn write_into(c: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if c.len() < end {
        c.resize(end, 0);
    }
    c[offset as usize..end].copy_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ino: u64) -> OpResult {
        OpResult {
            errno: 0,
            ino: Some(ino),
            perm: Some(0o644),
            generation: Some(1),
        }
    }

    #[test]
    fn namespace_operations_move_whole_subtrees() {
        let mut m = Model::default();
        m.apply(&Op::Mkdir { path: "a".into() }, Some(&ok(10)));
        m.apply(&Op::Mkdir { path: "a/b".into() }, Some(&ok(11)));
        m.apply(
            &Op::Create {
                path: "a/b/f".into(),
            },
            Some(&ok(12)),
        );
        m.apply(&Op::Create { path: "ab".into() }, Some(&ok(13)));
        m.apply(
            &Op::Rename {
                from: "a".into(),
                to: "c".into(),
                whiteout: false,
            },
            Some(&ok(0)),
        );
        let keys: Vec<&str> = m.paths.keys().map(String::as_str).collect();
        assert_eq!(keys, vec!["ab", "c", "c/b", "c/b/f"]);
        m.apply(
            &Op::Rename {
                from: "ab".into(),
                to: "c/b/f".into(),
                whiteout: false,
            },
            Some(&ok(0)),
        );
        assert_eq!(m.paths["c/b/f"].ino, Some(13));
        assert!(m.files[&12].name_lost_since_fsync);
        // A failed call changes nothing.
        m.apply(
            &Op::Rmdir { path: "c".into() },
            Some(&OpResult {
                errno: libc::ENOTEMPTY,
                ino: None,
                perm: None,
                generation: None,
            }),
        );
        assert!(m.paths.contains_key("c"));
        m.apply(
            &Op::Unlink {
                path: "c/b/f".into(),
            },
            Some(&ok(0)),
        );
        m.apply(&Op::Rmdir { path: "c/b".into() }, Some(&ok(0)));
        assert_eq!(m.paths.keys().collect::<Vec<_>>(), vec!["c"]);
    }

    #[test]
    fn contents_and_fsync_snapshots() {
        let mut m = Model::default();
        m.apply(&Op::Create { path: "f".into() }, Some(&ok(5)));
        m.apply(
            &Op::Write {
                ino: 5,
                offset: 4,
                data: Arc::from(&b"xy"[..]),
            },
            Some(&ok(5)),
        );
        m.apply(&Op::Fsync { ino: 5 }, Some(&ok(5)));
        assert_eq!(
            **m.files[&5].fsynced.as_ref().unwrap(),
            b"\0\0\0\0xy".to_vec()
        );
        m.apply(&Op::Truncate { ino: 5, size: 2 }, Some(&ok(5)));
        assert!(m.files[&5].fsynced.is_none());
        assert_eq!(**m.files[&5].content.as_ref().unwrap(), vec![0, 0]);
        // An in-flight fsync promises nothing yet.
        m.apply(&Op::Fsync { ino: 5 }, None);
        assert!(m.files[&5].fsynced.is_none());
    }

    #[test]
    fn a_half_done_rename_has_both_names() {
        let mut m = Model::default();
        m.apply(&Op::Mkdir { path: "a".into() }, Some(&ok(10)));
        m.apply(&Op::Create { path: "a/f".into() }, Some(&ok(11)));
        m.apply(&Op::Create { path: "g".into() }, Some(&ok(12)));
        m.apply(&Op::Create { path: "h".into() }, Some(&ok(13)));
        // A file over another: the new name is re-pointed, the old one still there.
        let half = m.rename_midway("g", "h");
        assert_eq!(half.len(), 1);
        assert_eq!(half[0].paths["g"].ino, Some(12));
        assert_eq!(half[0].paths["h"].ino, Some(12));
        // A directory: its subtree under either name (the walk descends it once).
        let half = m.rename_midway("a", "b");
        assert_eq!(half.len(), 2);
        let keys = |m: &Model| m.paths.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&half[0]), vec!["a", "a/f", "b", "g", "h"]);
        assert_eq!(keys(&half[1]), vec!["a", "b", "b/f", "g", "h"]);
        assert!(m.rename_midway("a", "a/x").is_empty());
        // Sizes: a write adds one, a truncate or fsync fixes it.
        m.apply(
            &Op::Write {
                ino: 12,
                offset: 0,
                data: Arc::from(&[1u8; 32][..]),
            },
            Some(&ok(12)),
        );
        assert_eq!(m.files[&12].sizes, vec![0, 32]);
        m.apply(&Op::Truncate { ino: 12, size: 8 }, Some(&ok(12)));
        assert_eq!(m.files[&12].sizes, vec![8]);
    }

    #[test]
    fn under_is_a_path_prefix_not_a_string_prefix() {
        assert!(under("a/b", "a"));
        assert!(under("a", "a"));
        assert!(!under("ab", "a"));
        assert!(!under("a", "a/b"));
    }
}
