//! Engine-side parts of the own TCP core (`tcp::conn`, issue 13): framing in and out
//! with the RST for segments that match no connection (`frames`), the 4-tuple
//! demultiplexer (`demux`), listeners with their SYN and accept-queue limits (`listen`)
//! and the deadline heap (`timers`).
//!
//! **Not wired into `TcpService` yet** (see the crate README, "Own TCP core: engine
//! side"): `StackConfig::tcp_core = Own` still runs smoltcp's socket. These parts are
//! unit-tested on their own so the poll loop can be built on them.
#![cfg_attr(not(test), allow(dead_code))]

pub(crate) mod demux;
pub(crate) mod frames;
pub(crate) mod listen;
pub(crate) mod timers;
