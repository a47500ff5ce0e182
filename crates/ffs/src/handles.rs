//! Open file and directory handles.
//!
//! A handle is attached by open, create and opendir and freed by release. Each holds a
//! reference on its in-core inode (`InCore::nopen`); inside an undo scope the handles the
//! scope opened are noted, and a rollback closes them again.

use std::collections::HashMap;

use cairn_vfs::{Errno, Fh, Result};

/// One open file or directory handle.
pub(crate) struct Handle {
    pub ino: u64,
    pub flags: i32,
}

pub(crate) struct Handles {
    map: HashMap<u64, Handle>,
    next_fh: u64,
    /// `next_fh` when the open undo scope began (`None`: no scope).
    undo_next_fh: Option<u64>,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            map: HashMap::new(),
            next_fh: 1,
            undo_next_fh: None,
        }
    }
}

impl Handles {
    /// A new handle on `ino` (the caller counts it in the inode's `nopen`).
    pub fn open(&mut self, ino: u64, flags: i32) -> Fh {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.map.insert(fh, Handle { ino, flags });
        fh
    }

    /// The inode and open flags of handle `fh`; EBADF for an unknown one.
    pub fn get(&self, fh: Fh) -> Result<(u64, i32)> {
        self.map
            .get(&fh)
            .map(|h| (h.ino, h.flags))
            .ok_or_else(|| Errno::EBADF.into())
    }

    /// Closes `fh`; whether it was open.
    pub fn close(&mut self, fh: Fh) -> bool {
        self.map.remove(&fh).is_some()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Open handles per inode.
    pub fn per_inode(&self) -> HashMap<u64, u32> {
        let mut opened: HashMap<u64, u32> = HashMap::new();
        for h in self.map.values() {
            *opened.entry(h.ino).or_default() += 1;
        }
        opened
    }

    pub fn begin_undo(&mut self) {
        self.undo_next_fh = Some(self.next_fh);
    }

    pub fn commit_undo(&mut self) {
        self.undo_next_fh = None;
    }

    /// Closes every handle the scope opened.
    pub fn rollback_undo(&mut self) {
        if let Some(first) = self.undo_next_fh.take() {
            for fh in first..self.next_fh {
                self.map.remove(&fh);
            }
            self.next_fh = first;
        }
    }
}
