//! cairn-fsck
