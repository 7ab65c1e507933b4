//! Engine-side parts of the own TCP core (`tcp::conn`, issue 13): framing in and out
//! with the RST for segments that match no connection (`frames`), the 4-tuple
//! demultiplexer (`demux`), listeners with their SYN and accept-queue limits (`listen`)
//! and the deadline heap (`timers`).
//!
//! The poll loop built on them is `own.rs` (`StackConfig::tcp_core = Own`, see the crate
//! README, "Own TCP core: engine side").

pub(crate) mod demux;
pub(crate) mod frames;
pub(crate) mod listen;
pub(crate) mod timers;
