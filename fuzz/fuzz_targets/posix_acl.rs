#![no_main]
// Body and property: cairn_fsck::fuzz::posix_acl.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_fsck::fuzz::posix_acl(data));
