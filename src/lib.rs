//! # xwarp — a userspace TCP offload engine and iWARP (RDMA over TCP) stack
//!
//! Layers (each its own crate, re-exported here):
//! * [`ddp`] — MPA framing and negotiation, DDP segment headers (sans-IO).
//! * [`rdmap`] — RDMAP messages, stream state machines, QP and memory model (sans-IO).
//! * [`stack`] — the smoltcp-based TCP engine.
//! * [`poll_driver`] — NIC backends (AF_XDP, virtual wire) and the engine loop.
//! * [`verbs`] — RDMA verbs and a connection manager on the engine (`xwarp-verbs`).
#![warn(missing_docs)]

pub use xwarp_ddp as ddp;
pub use xwarp_poll_driver as poll_driver;
pub use xwarp_rdmap as rdmap;
pub use xwarp_stack as stack;

pub use xwarp_verbs as verbs;

pub mod net;
pub mod toe;
