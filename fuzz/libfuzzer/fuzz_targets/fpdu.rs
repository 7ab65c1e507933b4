//! cargo-fuzz binary for `xwarp_fuzz::targets::fpdu` (input layout and oracles documented there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xwarp_fuzz::targets::fpdu(data));
