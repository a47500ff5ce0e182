//! cairn-ffs
