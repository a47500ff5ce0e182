//! cairn-dir: directories as cairn's on-disk formats share them.
//!
//! Sprite LFS keeps FFS's directory format (004 §4: "the same … directories as Unix FFS"),
//! so both of cairn's formats use one codec and one in-memory index:
//!
//! - [`block`]: the directory block codec, 512-byte chunks no entry crosses (a torn block
//!   write loses at most one entry update, never half of one). No I/O.
//! - [`index`]: [`DirIndex`], the name index of one directory (a hash map from name to the
//!   entry's place and a max-tree of free bytes per chunk), built from the directory's blocks
//!   and kept up to date by the format as it inserts, removes and re-points entries. No I/O:
//!   the format reads the blocks and declares its own consistency facts around each change.
//!
//! Every decoder here validates what it reads and returns [`FormatError`] (one line naming
//! the problem) on hostile bytes; nothing panics.

pub mod block;
pub mod index;

pub use index::{DirIndex, HeldBytes, MaxTree, Slot};

/// Why an on-disk structure could not be decoded. The message is one line naming the
/// problem. (cairn's formats re-export this type as their own codec error.)
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FormatError(pub String);

pub type FResult<T> = Result<T, FormatError>;

pub(crate) fn corrupt<T>(msg: impl Into<String>) -> FResult<T> {
    Err(FormatError(msg.into()))
}
