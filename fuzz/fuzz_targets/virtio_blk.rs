//! cargo-fuzz target: see `lull_fuzz::virtio_blk`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lull_fuzz::virtio_blk::run(data));
