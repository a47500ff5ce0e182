//! The directories' name indexes (`cairn_dir::DirIndex`), built from a directory's blocks
//! on first use and kept as entries change. An index is only ever a copy: the directory's
//! blocks (buffered or in the log) are the truth, and every change is made to both, block
//! first (`State::dir_add` and its neighbours in `ops.rs`).

use cairn_dir::DirIndex;
use rustc_hash::FxHashMap as HashMap;

#[derive(Default)]
pub(crate) struct Directories {
    idx: HashMap<u64, DirIndex>,
}

impl Directories {
    pub fn get_mut(&mut self, ino: u64) -> Option<&mut DirIndex> {
        self.idx.get_mut(&ino)
    }

    pub fn contains(&self, ino: u64) -> bool {
        self.idx.contains_key(&ino)
    }

    pub fn insert(&mut self, ino: u64, idx: DirIndex) {
        self.idx.insert(ino, idx);
    }

    /// Directory `ino` was freed.
    pub fn forget(&mut self, ino: u64) {
        self.idx.remove(&ino);
    }
}
