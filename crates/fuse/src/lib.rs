//! cairn-fuse
