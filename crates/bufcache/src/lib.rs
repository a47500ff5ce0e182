//! cairn-bufcache
