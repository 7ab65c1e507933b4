//! The xwarp programs, built on the public API of the `xwarp` library.
//!
//! The `xwarp` binary (`src/main.rs`) dispatches to [`demo`], [`launcher`] (`xwarp run`)
//! and [`bench`](mod@bench); the perftest-style binaries (`xwarp-write-bw`, ...) call [`perftest`];
//! `xwarp-rping` and `xwarp-perftest-peer`, the siw interop peers, run on `xwarp::verbs`
//! and share [`support`]. See `tools/README.md`.
#![warn(missing_docs)]

pub mod attack;
pub mod bench;
pub mod cli;
pub mod demo;
pub mod devices;
pub mod launcher;
pub mod perftest;
pub mod support;
