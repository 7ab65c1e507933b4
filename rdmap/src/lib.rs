//! # xwarp-rdmap — RDMAP (RFC 5040) over DDP (RFC 5041), sans-IO
//!
//! * [`wire`]: RDMAP control byte, opcodes, RDMA Read Request body, Terminate message
//!   (RFC layout out; RFC or siw layout in) and the Terminate error codes.
//! * [`mem`]: protection domains, memory regions, STags, invalidation, the STag table.
//! * [`verbs`]: work requests, completions, receive queues / SRQs, shared [`verbs::Resources`].
//! * [`counters`]: per-QP counters ([`QpCounters`]) kept by the code that does the work.
//! * [`qp`]: the [`qp::QueuePair`] — send state machine (segmentation, MSN/MO/TO, ORD,
//!   fences, Read Responses), receive state machine (every RFC 5040/5041 check, direct
//!   placement, Terminate generation), read responder (IRD) and QP state machine.
//!
//! The layer ends at DDP segments (DDP header + payload); MPA framing wraps them
//! elsewhere. Nothing here touches a socket, a clock or a thread. See
//! `docs/ddp-rdmap.md` §2–§3, `docs/siw.md` §4 for the wire rules implemented here.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conn;
pub mod counters;
pub mod mem;
pub mod qp;
pub mod verbs;
pub mod wire;

pub use conn::{ConnConfig, ConnError, ConnEvent, Connection};
pub use counters::{ErrorCounters, MpaResult, QpCounters, TerminateCode};
pub use mem::{Access, MemError, PdId, RegionMemory, RegionPin, Stag, StagTable};
pub use qp::{QpConfig, QpError, QpEvent, QpState, QueuePair, RqConfig, MIN_MULPDU};
pub use verbs::{
    Completion, CompletionStatus, PostError, RecvWr, Resources, SendOp, SendWr, Sge, SrqId,
    WcOpcode,
};
