#![no_main]
// Body and property: cairn_fsck::fuzz::xattr_chain.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fsck::fuzz::xattr_chain(data));
