//! Open file and directory handles: a handle names an inode and the flags it was opened
//! with (append, kill-privileges); the inode counts its opens (`Node::opens`), so an inode
//! unlinked while open is freed at its last release.

use rustc_hash::FxHashMap as HashMap;

pub(crate) struct Handles {
    map: HashMap<u64, (u64, i32)>,
    next: u64,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            map: HashMap::default(),
            next: 1,
        }
    }
}

impl Handles {
    /// A new handle on `ino` (the caller counts it in the inode's opens).
    pub fn open(&mut self, ino: u64, flags: i32) -> u64 {
        let fh = self.number();
        self.map.insert(fh, (ino, flags));
        fh
    }

    /// A handle number naming nothing (a directory's: readdir needs none).
    pub fn number(&mut self) -> u64 {
        let fh = self.next;
        self.next += 1;
        fh
    }

    /// The flags handle `fh` was opened with.
    pub fn flags(&self, fh: u64) -> Option<i32> {
        self.map.get(&fh).map(|h| h.1)
    }

    pub fn close(&mut self, fh: u64) {
        self.map.remove(&fh);
    }
}
