//! Benchmarks (`xwarp bench ...`): side-by-side measurements against the kernel.

use std::ffi::OsString;
use std::process::ExitCode;

/// Entry point of `xwarp bench ARGS...` (ARGS excludes `xwarp bench`).
pub fn main(_args: Vec<OsString>) -> ExitCode {
    eprintln!("xwarp bench: not built yet");
    ExitCode::FAILURE
}
