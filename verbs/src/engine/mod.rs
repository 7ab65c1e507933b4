//! The engine host of `xwarp::verbs`: a [`ProtocolHost`](xwarp_stack::proto::ProtocolHost) running one sans-IO iWARP
//! [`Connection`](xwarp_rdmap::conn::Connection) per QP on the engine thread, with the STag table and SRQs of the
//! device ([`Resources`](xwarp_rdmap::verbs::Resources)).
//!
//! Responder flow: TCP accepted → a probe Responder parses the MPA Request → the
//! request goes to the listener → on accept a Responder with the accepting QP's
//! settings is created, replays the Request bytes and accepts; on reject the probe
//! sends the Reply with R=1 and closes.
//!
//! Files: [`cmd`] (the application → engine commands), [`slot`] (one QP's engine
//! state), [`host`] (the host and its tables), `post` (work requests, Local
//! Invalidate ordering), `commands` (applying commands), `modify` (QP modify and
//! reset, after [`crate::qp_state`]), `accept` (binding a request to a QP), `pending` (requests waiting for the
//! application and the listener's limits on them) and `proto`
//! (the [`ProtocolHost`](xwarp_stack::proto::ProtocolHost) callbacks: CM handling and
//! placement).

mod accept;
pub(crate) mod cmd;
mod commands;
pub(crate) mod host;
mod modify;
mod pending;
mod post;
mod proto;
pub(crate) mod slot;
