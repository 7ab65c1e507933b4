//! `xwarp run -- CMD`: run an unmodified program with the LD_PRELOAD socket shim.

use std::ffi::OsString;
use std::process::ExitCode;

/// Entry point of `xwarp run ARGS...` (ARGS excludes `xwarp run`).
pub fn main(_args: Vec<OsString>) -> ExitCode {
    eprintln!("xwarp run: not built yet");
    ExitCode::FAILURE
}
