//! # xwarp-poll-driver — NIC backends and the polled engine loop
//!
//! * [`backend`]: the contract every NIC backend fulfils (a smoltcp `Device` plus what the
//!   engine loop needs to flush, sleep and wake).
//! * `vwire`: the in-process virtual wire with seeded fault injection (no privileges).
//! * `afxdp`: AF_XDP sockets, UMEM, rings and the XDP steering program (root).
//! * `pcap`: frame capture readable by Wireshark/tshark.
//! * `engine`: the engine loop on a pinned core with a spin-then-sleep policy.
#![warn(missing_docs)]

#[cfg(target_os = "linux")]
pub mod afxdp;
pub mod backend;
pub mod engine;
#[cfg(target_os = "linux")]
pub mod netns;
pub mod pcap;
pub mod rng;
pub mod sys;
pub mod vwire;
