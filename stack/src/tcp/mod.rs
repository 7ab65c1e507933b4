//! The parts of the project's own TCP loss recovery, sans-IO (time is an argument, nothing
//! here reads a clock, spawns or does I/O). Not yet wired into the engine, which still runs
//! smoltcp's `tcp::Socket`; see "Own TCP core: parts in progress" in the crate README.
//!
//! - [`seq`]: wrapping sequence-number arithmetic.
//! - [`rtt`]: RTT estimation and RTO (RFC 6298, RFC 7323 §4).
//! - [`sack`]: receiver reassembly map, SACK/DSACK blocks (RFC 2018, RFC 2883) and the
//!   sender's scoreboard (RFC 6675).
//! - [`rack`]: RACK-TLP time-based loss detection (RFC 8985).
//! - [`cc`]: congestion control: slow start, NewReno/CUBIC, PRR (RFC 5681, 3465, 6928,
//!   9438, 6937, 9406).
//! - `wire_sim` (tests only): an in-memory IP wire with a virtual clock, a driver for two
//!   endpoints, and smoltcp's socket as one (the baseline the own connection is measured
//!   against).
//! - [`conn`]: the connection state machine (RFC 9293) on these parts, sans-IO.

pub mod cc;
pub mod conn;
pub mod rack;
pub mod rtt;
pub mod sack;
pub mod seq;

#[cfg(test)]
mod sim;

#[cfg(test)]
pub(crate) mod wire_sim;

#[cfg(test)]
mod proptests;

pub use seq::Seq;
