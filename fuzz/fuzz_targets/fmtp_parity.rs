//! `ldm7_fuzz::fmtp_parity` under libFuzzer (what it takes and checks: crates/fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ldm7_fuzz::fmtp_parity(data));
