#![no_main]
// Body and property: cairn_lfs::fuzz::superblock.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_lfs::fuzz::superblock(data));
