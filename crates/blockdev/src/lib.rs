//! cairn-blockdev
