#![no_main]
// Body and property: cairn_fsck::fuzz::dir_block.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fsck::fuzz::dir_block(data));
