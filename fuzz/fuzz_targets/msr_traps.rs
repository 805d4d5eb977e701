//! libFuzzer entry for `vpmu::fuzz::msr_traps` (invariants documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu::fuzz::msr_traps(data));
