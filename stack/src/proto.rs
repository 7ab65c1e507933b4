//! The in-engine stream-protocol hook: a [`ProtocolHost`] installed in the
//! [`TcpService`](crate::TcpService) owns the byte streams of the connections it opens or
//! accepts, so a protocol such as iWARP runs entirely on the engine thread.
//!
//! For these connections there are no application rings: received bytes are handed to
//! [`ProtocolHost::on_recv`] straight from smoltcp's receive buffer (`recv(|data| ..)`),
//! and [`ProtocolHost::on_send`] writes straight into smoltcp's send buffer
//! (`send(|buf| ..)`). The host reaches the rest of the world through its own queues
//! (it is polled once per engine iteration through [`ProtocolHost::poll`], where it may
//! open connections and listeners through [`ProtoCtl`]).
//!
//! Order per engine iteration: application commands, `poll` (plus the requests it queued
//! in [`ProtoCtl`]), ingress, then every hosted connection is served (connect outcome,
//! receive, send, close), then egress. Hosted sockets use Nagle only while a backlog of at
//! least [`NAGLE_BACKLOG`] bytes is queued. `XWARP_PROTO_TRACE` set: hosted connection
//! states are logged once a second (info, target `xwarp_stack::trace`).
//!
//! This file is the interface only. The engine side is `hosted.rs` (the host, its
//! listeners and its requests) and `conn.rs` (hosted connections are records of the one
//! connection table, served by the same code as application sockets).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::shared::SocketError;

/// Up to this many hosted connections, received bytes are handed to the host after
/// every ingress packet (see `hosted.rs`, `ProtoSide::between_packets`).
pub const DRAIN_PER_PACKET_MAX_CONNS: usize = 64;

/// Hosted sockets use Nagle's algorithm only while at least this many bytes are queued.
pub const NAGLE_BACKLOG: usize = 16 * 1024;

/// Identifies a hosted connection (unique per engine, shares the id space of sockets).
pub type ProtoConnId = u64;

/// What the host wants done with a connection, asked after each service of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CloseRequest {
    /// Keep it open.
    #[default]
    None,
    /// Send FIN once [`ProtocolHost::on_send`] has nothing more to send.
    Graceful,
    /// Reset it now.
    Abort,
}

/// A protocol running inside the engine on TCP byte streams (implemented by
/// `xwarp::verbs` for iWARP). Every method runs on the engine thread.
pub trait ProtocolHost: Send {
    /// Once per engine iteration, before ingress: take application work, run timers,
    /// open or close connections and listeners through `ctl`. Returns the next instant
    /// it must be polled at (besides doorbells and traffic).
    fn poll(&mut self, now: Instant, ctl: &mut ProtoCtl) -> Option<Instant>;
    /// The outcome of [`ProtoCtl::listen`] for `token`: the bound address or why not.
    fn on_listen(&mut self, token: u64, result: Result<SocketAddr, SocketError>);
    /// A connection arrived on the listener `token` (TCP handshake complete).
    fn on_accepted(
        &mut self,
        token: u64,
        conn: ProtoConnId,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
    );
    /// An active connection opened by [`ProtoCtl::connect`] is established.
    fn on_established(
        &mut self,
        conn: ProtoConnId,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
    );
    /// Received bytes, in order, straight from the TCP receive buffer. Returns how many
    /// were consumed; the rest is offered again later.
    fn on_recv(&mut self, conn: ProtoConnId, now: Instant, data: &[u8]) -> usize;
    /// Free space in the TCP send buffer: write bytes to send at its start, return how
    /// many were written.
    fn on_send(&mut self, conn: ProtoConnId, now: Instant, buf: &mut [u8]) -> usize;
    /// Where records (e.g. MPA FPDUs) end in `data`, the bytes the last
    /// [`Self::on_send`] for `conn` wrote (exactly those, in stream order): call `end(k)`
    /// for each record ending at byte `k` of `data` (ascending). An engine that segments
    /// by records (the own TCP core) then never splits or merges one across a TCP segment
    /// (docs/mpa.md §1.10). The default reports none: a plain byte stream.
    fn record_ends(&mut self, conn: ProtoConnId, data: &[u8], end: &mut dyn FnMut(usize)) {
        let _ = (conn, data, end);
    }
    /// The payload one TCP segment of `conn` carries (the peer's MSS less the options
    /// every segment has), called once the handshake is done, before
    /// [`Self::on_established`] or [`Self::on_accepted`], by engines that know it (the own
    /// TCP core): FPDUs sized to it (MULPDU, RFC 5044 §8) fit one segment even when the
    /// peer's MSS is smaller than the local MTU gives. The default ignores it.
    fn on_path_mss(&mut self, conn: ProtoConnId, mss: usize) {
        let _ = (conn, mss);
    }
    /// The peer sent FIN and every byte before it was delivered through `on_recv`.
    fn on_peer_fin(&mut self, conn: ProtoConnId, now: Instant);
    /// What to do with the connection after it was served.
    fn close_request(&mut self, conn: ProtoConnId) -> CloseRequest;
    /// The connection is gone: `None` after a graceful close, else why (refused, reset,
    /// timed out, ...). Called once, last.
    fn on_closed(&mut self, conn: ProtoConnId, now: Instant, error: Option<SocketError>);
    /// Append a record of every queue pair to `out`, for `xwarp stat` (the TCP service
    /// calls it when it publishes its tables, a few times a second). The default has
    /// none.
    fn qp_records(&self, out: &mut Vec<xwarp_telemetry::QpRecord>) {
        let _ = out;
    }
}

/// Requests a [`ProtocolHost`] makes of the engine from [`ProtocolHost::poll`].
#[derive(Debug)]
pub struct ProtoCtl {
    ids: Arc<AtomicU64>,
    reqs: Vec<CtlReq>,
}

/// One request queued in a [`ProtoCtl`], carried out by the engine (`hosted.rs`).
#[derive(Debug)]
pub(crate) enum CtlReq {
    Connect {
        id: ProtoConnId,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
    },
    Listen {
        token: u64,
        local: SocketAddr,
        backlog: usize,
    },
    Unlisten {
        token: u64,
    },
}

impl ProtoCtl {
    /// An empty request queue drawing connection ids from `ids`.
    pub(crate) fn new(ids: Arc<AtomicU64>) -> ProtoCtl {
        ProtoCtl {
            ids,
            reqs: Vec::new(),
        }
    }

    /// The requests queued so far, in order.
    pub(crate) fn into_requests(self) -> Vec<CtlReq> {
        self.reqs
    }

    /// Start a TCP connection to `remote` (ephemeral local port unless `local_port`);
    /// the outcome comes as [`ProtocolHost::on_established`] or
    /// [`ProtocolHost::on_closed`] (refused, timed out at `deadline`, bad address).
    pub fn connect(
        &mut self,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
    ) -> ProtoConnId {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.reqs.push(CtlReq::Connect {
            id,
            remote,
            local_port,
            deadline,
        });
        id
    }

    /// Listen on `local` with up to `backlog` handshakes in progress; answered by
    /// [`ProtocolHost::on_listen`] with `token`; connections arrive through
    /// [`ProtocolHost::on_accepted`].
    pub fn listen(&mut self, token: u64, local: SocketAddr, backlog: usize) {
        self.reqs.push(CtlReq::Listen {
            token,
            local,
            backlog,
        });
    }

    /// Stop listening (handshakes in progress are reset).
    pub fn unlisten(&mut self, token: u64) {
        self.reqs.push(CtlReq::Unlisten { token });
    }
}
