//! # xwarp-verbs (`xwarp::verbs`) — RDMA verbs and a connection manager on an xwarp engine
//!
//! The whole iWARP data path runs on the engine thread (see
//! [`xwarp_stack::proto`]): TCP receive buffer → MPA/FPDU parser → placement into
//! registered memory → completions; Read Requests are answered from registered memory
//! without the application; FPDUs are encoded on the engine thread into the TCP send
//! buffer. Application threads only post work requests (a lock-free command queue plus
//! the engine doorbell) and take completions (one lock-free queue per CQ plus an
//! eventfd for blocking waits).
//!
//! Objects (after ibverbs / rdma_cm):
//! * [`Context`] — an engine (TCP stack + verbs host) over a backend: the virtual wire
//!   ([`vwire_pair`]) or any [`Backend`](xwarp_poll_driver::backend::Backend) (AF_XDP through `xwarp::toe`).
//! * [`Device`] — cloneable handle: [`Device::alloc_pd`], [`Device::create_cq`],
//!   [`Device::listen`].
//! * [`ProtectionDomain`] — memory registration ([`ProtectionDomain::alloc_mr`],
//!   [`ProtectionDomain::register`]; application memory in place, as `ibv_reg_mr`:
//!   [`ProtectionDomain::register_raw`], see [`foreign`]), [`ProtectionDomain::create_qp`],
//!   [`ProtectionDomain::create_srq`].
//! * [`MemoryRegion`] — lkey/rkey (STags), address, copy in/out (see [`mem`] for the
//!   aliasing contract).
//! * [`CompletionQueue`] — poll, `req_notify` (all or solicited-only), blocking wait on
//!   an fd usable from epoll.
//! * [`QueuePair`] — RC QP: post_send (Send, Send with SE / Invalidate, Write, Read,
//!   Local Invalidate; SGLs, signaled/unsignaled, inline, fence), post_recv, connect,
//!   disconnect, CM events ([`CmEvent`]); the QP state machine through
//!   [`QueuePair::state`], [`QueuePair::query`] ([`QpAttr`]) and [`QueuePair::modify`]
//!   ([`QpModify`]), after `ibv_query_qp` / `ibv_modify_qp` and siw's `siw_qp_modify`;
//!   a reset (modify to IDLE from ERROR, or after a graceful close) makes a QP
//!   connect/accept again.
//! * Statistics: [`QueuePair::stats`] and [`Context::qp_stats`] give
//!   [`QpStatsSnapshot`]s (the RDMAP/DDP/MPA [`QpCounters`] of each QP, its state,
//!   addresses and MPA result), kept on the engine thread as plain integers.
//! * [`Listener`] / [`ConnRequest`] — incoming connection requests with private data and
//!   the peer's IRD/ORD; accept or reject with private data.
//!
//! Every `wr_id` is the application's: the engine's internal RTR message completes on a
//! queue of its own inside the QP, never on the application's CQ.
//!
//! Files, by concern (after siw's split): [`context`] (the engine and the device
//! handle), [`pd`] (protection domains and memory regions; [`mem`] the shared buffers;
//! [`foreign`] application memory registered in place),
//! [`cq`], [`srq`], [`qp`] (queue pairs), [`qp_attr`] (their attributes), [`qp_stats`]
//! (their statistics), `qp_state`
//! (the QP state machine: the one transition table), [`wr`] (work requests),
//! [`cm_event`], [`cm_limits`] and [`cm`] (the connection manager), and `engine/` (the engine host:
//! commands, CM handling, placement).
#![warn(missing_docs)]

pub mod cm;
pub mod cm_event;
pub mod cm_limits;
pub mod context;
pub mod cq;
mod engine;
pub mod foreign;
pub mod mem;
pub mod pd;
pub mod qp;
pub mod qp_attr;
mod qp_state;
pub mod qp_stats;
pub mod srq;
pub mod wr;

pub use xwarp_ddp::mpa::{RtrSet, RtrType};
pub use xwarp_rdmap::verbs::{CompletionStatus, PostError, Sge, MAX_SGE};
pub use xwarp_rdmap::{
    Access, ErrorCounters, MemError, MpaResult, QpCounters, Stag, TerminateCode,
};

pub use cm::{ConnRequest, Listener};
pub use cm_event::{CmEvent, ConnectParams, ConnectTuning, CONNECT_RETRY_INTERVAL};
pub use cm_limits::{CmStats, ListenConfig};
pub use context::{vwire_pair, vwire_pair_simple, Context, Device, XdpContext};
pub use cq::{CompletionQueue, WcOpcode, WorkCompletion};
pub use pd::{DeregError, MemoryRegion, ProtectionDomain, ENGINE_WAIT};
pub use qp::{QpInitAttr, QueuePair};
pub use qp_attr::{MpaAttr, NegotiatedMpa, QpAttr, QpModify, MAX_INLINE_BUFFER, MAX_INLINE_DATA};
pub use qp_state::QpState;
pub use qp_stats::QpStatsSnapshot;
pub use srq::SharedReceiveQueue;
pub use wr::{SendOpcode, SendRequest};
