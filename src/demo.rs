//! `xwarp demo`: the main job over the in-process virtual wire (no privileges needed).

use std::ffi::OsString;
use std::process::ExitCode;

/// Entry point of `xwarp demo ARGS...`.
pub fn main(_args: Vec<OsString>) -> ExitCode {
    eprintln!("xwarp demo: not built yet");
    ExitCode::FAILURE
}
