//! libFuzzer entry for `vpmu::fuzz::page_walk` (invariants documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu::fuzz::page_walk(data));
