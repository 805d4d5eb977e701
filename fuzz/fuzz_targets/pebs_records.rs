//! libFuzzer entry for `vpmu::fuzz::pebs_records` (invariants documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu::fuzz::pebs_records(data));
