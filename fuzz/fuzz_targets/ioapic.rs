//! cargo-fuzz target: see `lull_fuzz::ioapic`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::ioapic::run(data));
