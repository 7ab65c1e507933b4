//! cargo-fuzz binary for `xwarp_fuzz::targets::rdmap_rx` (input layout and oracles documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xwarp_fuzz::targets::rdmap_rx(data));
