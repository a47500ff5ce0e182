#![no_main]
// Body and property: cairn_wal::fuzz::all (superblock, record and whole-log-image parsers).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| cairn_wal::fuzz::all(data));
