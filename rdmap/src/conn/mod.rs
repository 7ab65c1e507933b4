//! One iWARP stream over a reliable byte stream: MPA negotiation, FPDU framing and the
//! RDMAP [`QueuePair`] joined into a sans-IO [`Connection`] (quinn-proto style).
//!
//! Bytes in ([`Connection::handle_input`]), bytes out ([`Connection::poll_transmit`]),
//! events out ([`Connection::poll_event`]), time in ([`Connection::handle_timeout`]). The
//! caller owns the TCP socket (kernel TCP or the xwarp engine) and the clock.
//!
//! Phases, each a variant carrying only its own state (the private `phase` module):
//! *handshake* (the MPA [`Negotiator`] consumes the Request/Reply frames; work posted
//! before the QP exists waits beside it), *open*
//! (received bytes go through the streaming [`FpduParser`](xwarp_ddp::mpa::FpduParser) straight into
//! [`QueuePair::on_header_bytes`]/[`QueuePair::on_payload`]/[`QueuePair::on_end`], so
//! payload is copied once, from the receive buffer into the target region; transmitted
//! FPDUs are framed by [`FpduEncoder`] straight from the header and the region ranges
//! ([`Payload`](crate::qp::Payload)) that [`QueuePair::poll_segment`] hands out, the payload copied once from
//! region memory into the FPDU), and *dead* (closed or failed: nothing is read,
//! only an already queued Terminate is still sent, then [`Connection::wants_close`]).
//!
//! Rules (docs/mpa.md §1.5, docs/siw.md §4.5, docs/mpa.md §1.9; the tests in `rdmap/tests/conn_*.rs` are named
//! after them):
//! * The Initiator sends only its Request until the Reply is received; the Responder
//!   sends only its Reply until the first inbound FPDU arrived with a good CRC
//!   (RFC 5044 §7.1.2). Neither pipelines bytes behind its frame (siw "extra data",
//!   docs/siw.md §4.5): the first FPDU only becomes possible once the peer's frame or
//!   FPDU has been received, i.e. after the peer consumed ours.
//! * P2P (RFC 6581): the Initiator's first FPDU is the negotiated RTR — a zero-length
//!   Write to STag 1, TO 0 (siw's form, docs/mpa.md §1.5), a zero-length Read, or a
//!   zero-length Send — ahead of any work the ULP posted. A P2P Responder reports
//!   [`ConnEvent::Established`] only after that first FPDU (as siw does, docs/siw.md §4.3).
//! * The QP is created when negotiation succeeds, with the negotiated IRD/ORD; work
//!   posted earlier through [`Connection::post_send`]/[`Connection::post_recv`] is
//!   queued and handed to it then (after the RTR).
//! * An MPA CRC, marker or length error sends the LLP Terminate (RFC 5040 layout, e.g.
//!   `20 02 00 00` for a CRC error) and closes; an Initiator that rejects the Reply
//!   (invalid frame 0x04, insufficient IRD 0x06, no matching RTR 0x07) does the same
//!   (RFC 6581 §5, siw `siw_proc_mpareply`). A Responder that has not yet received a
//!   valid FPDU closes without a Terminate (it may not send FPDUs yet).
//! * A QP protocol error sends the QP's Terminate and then reports that TCP must be
//!   closed ([`Connection::wants_close`]). A received Terminate moves the QP to ERROR and
//!   closes. [`Connection::close`] is graceful: queued work drains, then the QP is
//!   flushed and TCP is closed.
//!
//! * Toward siw, [`ConnConfig::first_fpdu_delay`] can hold the Initiator's first FPDU back
//!   a little after the Reply (a siw race, see [`ConnConfig::new`]), and
//!   [`ConnConfig::responder_sends_after_reply`] lets a Responder without P2P send right
//!   after its Reply, as siw's does (docs/siw.md §4.8.14).
//!
//! RTR side effects: a zero-length Send RTR consumes the Responder's first posted receive
//! (and MSN 1 on QN 0, docs/mpa.md §1.5); it completes with `byte_len` 0, so the
//! Responder ULP posts one receive for it. A zero-length Read RTR needs a local sink: the
//! Initiator registers an empty region in its [`Resources`] (one STag per connection),
//! deregistered as soon as that Read completed, or when the connection dies (the next
//! [`Connection::handle_input`], or [`Connection::release`] from an owner that drops it).

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use xwarp_ddp::mpa::{
    mulpdu, AcceptParams, ConnectRequest, Event as MpaEvent, FpduEncoder, FpduEvent,
    InitiatorConfig, MpaError, Negotiated, Negotiator, ResponderConfig, Role,
};
use xwarp_ddp::segment::{UntaggedHeader, UNTAGGED_HEADER_LEN};

mod framing;
mod phase;

use framing::{
    check_config, encode_segment, encode_segment_into, error_cqe, flush_cqe, rtr_wr, wc_opcode,
    RTR_WR_ID,
};

use phase::{Handshake, Phase, Stream};

use crate::counters::{MpaResult, QpCounters, TerminateCode};
use crate::mem::Stag;
use crate::qp::{QpConfig, QpError, QpEvent, QpState, QueuePair, RqConfig};
use crate::verbs::{
    Completion, CompletionStatus, PostError, RecvWr, Resources, SendOp, SendWr, WcOpcode, MAX_SGE,
};
use crate::wire::{
    qn, LlpErrorCode, Opcode, ParsedTerminate, Terminate, TerminateCause, MAX_TERMINATE_LEN,
};

/// STag of the zero-length RDMA Write RTR (siw sends STag 1, TO 0; a non-zero STag because
/// Chelsio rejects STag 0, docs/mpa.md §1.5).
pub const RTR_WRITE_STAG: Stag = Stag(1);

/// Default EMSS: the TCP MSS of a 1500-byte Ethernet MTU with timestamps.
pub const DEFAULT_EMSS: usize = 1448;

/// Default most bytes one [`Connection::poll_transmit`] call appends.
pub const DEFAULT_TX_BURST: usize = 256 * 1024;

/// Connection settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnConfig {
    /// QP settings. `ird`/`ord` here are the *requested* depths: the Initiator sends them
    /// in its Request (they override [`InitiatorConfig::ird`]/[`InitiatorConfig::ord`]);
    /// the QP gets the negotiated values.
    pub qp: QpConfig,
    /// Effective MSS of the TCP connection; FPDUs are sized to `mulpdu(emss, markers)`
    /// (RFC 5044 §6) so each fits one TCP segment.
    pub emss: usize,
    /// Most bytes one [`Connection::poll_transmit`] call appends (at least one FPDU).
    pub tx_burst: usize,
    /// Initiator: how long to hold back the first FPDU after the Reply arrived (RFC 5044
    /// allows sending at once; default zero). siw quirk, see [`ConnConfig::new`].
    pub first_fpdu_delay: Duration,
    /// Responder without P2P (no RTR negotiated): open the transmit gate right after the
    /// MPA Reply instead of waiting for the first inbound FPDU (RFC 5044 §7.1.2). siw's
    /// Responder does this, and ULPs written against it (perftest's latency tests) have
    /// the server send first; toward such an Initiator the RFC rule deadlocks. With P2P
    /// negotiated the Responder still waits for the RTR (RFC 6581). Default false. siw
    /// quirk, docs/siw.md §4.8.14.
    pub responder_sends_after_reply: bool,
    /// MPA Initiator settings (used by [`Connection::initiator`]).
    pub initiator: InitiatorConfig,
    /// MPA Responder settings (used by [`Connection::responder`]).
    pub responder: ResponderConfig,
}

impl ConnConfig {
    /// Defaults (siw-compatible MPA v2, no CRC, no markers, EMSS 1448) around `qp`.
    ///
    /// `first_fpdu_delay` is zero. Toward a siw Responder a few milliseconds avoid a siw
    /// race: `siw_accept` sends the Reply before it hands the socket's data-ready upcall to
    /// the QP (`siw_qp_socket_assoc`); an FPDU arriving in between is left in the socket
    /// unread until more data comes, which stalls a ULP that waits for an answer (seen
    /// with rping on a slow guest; siw quirk, docs/siw.md §4.3).
    pub fn new(qp: QpConfig) -> ConnConfig {
        ConnConfig {
            qp,
            emss: DEFAULT_EMSS,
            tx_burst: DEFAULT_TX_BURST,
            first_fpdu_delay: Duration::ZERO,
            responder_sends_after_reply: false,
            initiator: InitiatorConfig::default(),
            responder: ResponderConfig::default(),
        }
    }
}

/// Why a connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnError {
    /// MPA negotiation failed, timed out, or the FPDU stream is corrupt (CRC, marker,
    /// ULPDU_Length).
    Mpa(MpaError),
    /// Our QP found a protocol error in the peer's stream and sent (or tried to send) this
    /// Terminate.
    LocalTerminate(Terminate),
    /// The Initiator sent bytes after its Request before our Reply (RFC 5044 §7.1.2).
    UnexpectedData,
    /// The TCP connection was closed or lost before the stream was closed gracefully.
    ConnectionLost,
    /// A QP call failed (an internal framing error; never caused by the peer).
    Qp(QpError),
    /// The call is not allowed in the current phase.
    InvalidState,
    /// The configuration cannot work (e.g. EMSS too small for the longest Terminate).
    InvalidConfig(&'static str),
}

impl fmt::Display for ConnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnError::Mpa(e) => write!(f, "MPA: {e}"),
            ConnError::LocalTerminate(t) => write!(
                f,
                "protocol error, Terminate layer {} etype {} code {:#04x}",
                t.layer, t.etype, t.code
            ),
            ConnError::UnexpectedData => f.write_str("peer sent data before the MPA Reply"),
            ConnError::ConnectionLost => f.write_str("TCP connection lost"),
            ConnError::Qp(e) => write!(f, "QP error: {e:?}"),
            ConnError::InvalidState => f.write_str("operation not allowed in this phase"),
            ConnError::InvalidConfig(s) => write!(f, "invalid configuration: {s}"),
        }
    }
}

impl std::error::Error for ConnError {}

impl From<MpaError> for ConnError {
    fn from(e: MpaError) -> Self {
        ConnError::Mpa(e)
    }
}

impl From<QpError> for ConnError {
    fn from(e: QpError) -> Self {
        ConnError::Qp(e)
    }
}

/// Connection events for the ULP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// Responder: the Initiator's Request (private data, IRD/ORD, P2P offer); answer with
    /// [`Connection::accept`] or [`Connection::reject`].
    ConnectRequest(ConnectRequest),
    /// The stream is open (for a P2P Responder: after the RTR arrived).
    Established(Negotiated),
    /// Initiator: the Responder rejected us (Reply with R=1), with its private data.
    Rejected {
        /// The Responder's private data.
        private_data: Vec<u8>,
    },
    /// The peer sent a Terminate (both readings of its control field); the QP is in ERROR.
    TerminateReceived(ParsedTerminate),
    /// We sent this Terminate (a local protocol error was detected).
    TerminateSent(Terminate),
    /// The connection failed; TCP must be closed once [`Connection::wants_close`].
    Error(ConnError),
    /// The stream is closed (graceful close finished, rejection, or teardown after an
    /// error or a Terminate). Emitted once, last.
    Closed,
}

/// One iWARP stream (MPA + DDP + RDMAP) over a reliable byte stream, sans-IO.
pub struct Connection {
    role: Role,
    cfg: ConnConfig,
    phase: Phase,
    flushed: VecDeque<Completion>,
    raw_tx: Vec<u8>,
    errors: u32,
    last_error: Option<ConnError>,
    events: VecDeque<ConnEvent>,
    /// The empty sink region of a zero-length Read RTR, while it is registered.
    rtr_sink: Option<Stag>,
    /// What the connection counts itself (MPA errors, work it finished without the QP);
    /// [`Connection::counters`] adds the QP's.
    ctr: QpCounters,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("role", &self.role)
            .field("phase", &format_args!("{}", self.phase.name()))
            .field("qp_state", &self.qp().map(|q| q.state()))
            .field("tx_gate_open", &self.tx_gate_open())
            .field("wants_close", &self.wants_close())
            .finish()
    }
}

impl Connection {
    /// The MPA Initiator (active side, after TCP connect); its Request is queued at once.
    /// `cfg.qp.ird`/`ord` are the IRD/ORD it requests.
    pub fn initiator(cfg: ConnConfig, now: Instant) -> Result<Connection, ConnError> {
        check_config(&cfg)?;
        let mut icfg = cfg.initiator.clone();
        icfg.ird = cfg.qp.ird as u16;
        icfg.ord = cfg.qp.ord as u16;
        let neg = Negotiator::initiator(icfg, now)?;
        let mut c = Connection::new(Role::Initiator, cfg, neg);
        c.pump_mpa(None, Some(now));
        Ok(c)
    }

    /// The MPA Responder (passive side, after TCP accept); waits for the Request.
    pub fn responder(cfg: ConnConfig, now: Instant) -> Result<Connection, ConnError> {
        check_config(&cfg)?;
        let neg = Negotiator::responder(cfg.responder.clone(), now)?;
        Ok(Connection::new(Role::Responder, cfg, neg))
    }

    fn new(role: Role, cfg: ConnConfig, neg: Negotiator) -> Connection {
        Connection {
            role,
            cfg,
            phase: Phase::Handshake(Handshake::new(neg)),
            flushed: VecDeque::new(),
            raw_tx: Vec::new(),
            errors: 0,
            last_error: None,
            events: VecDeque::new(),
            rtr_sink: None,
            ctr: QpCounters::default(),
        }
    }

    /// Which end we are.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The negotiated parameters, once negotiation succeeded.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.phase.stream().map(|s| &s.negotiated)
    }

    /// Whether the stream is open (negotiated, not closed or failed).
    pub fn is_established(&self) -> bool {
        matches!(self.phase, Phase::Open(_))
    }

    /// The largest ULPDU (DDP segment) we send, 0 before negotiation.
    pub fn mulpdu(&self) -> usize {
        self.phase.stream().map_or(0, |s| s.mulpdu)
    }

    /// The counters of this stream: the QP's ([`QueuePair::counters`]) plus what only
    /// the connection sees (MPA CRC, marker and length errors, work finished before the
    /// QP existed or after the stream died without one, an Initiator's LLP Terminate for
    /// a Reply it cannot use) and the MPA result. A copy of ~300 bytes, no other cost.
    pub fn counters(&self) -> QpCounters {
        let mut c = self.ctr;
        if let Some(qp) = self.qp() {
            c.accumulate(&qp.counters());
        }
        c.mpa = self.negotiated().map(MpaResult::from);
        c
    }

    /// The queue pair (exists once negotiation succeeded).
    pub fn qp(&self) -> Option<&QueuePair> {
        self.phase.stream().map(|s| &s.qp)
    }

    /// The queue pair, mutably. Post send work through [`Self::post_send`] so that a
    /// P2P RTR stays the first message.
    pub fn qp_mut(&mut self) -> Option<&mut QueuePair> {
        self.phase.stream_mut().map(|s| &mut s.qp)
    }

    /// Whether we may send FPDUs as far as the peer is concerned: always for the
    /// Initiator; for the Responder once the first inbound FPDU arrived intact.
    fn tx_gate_open(&self) -> bool {
        self.phase
            .stream()
            .map_or(self.role == Role::Initiator, |s| s.tx_gate_open)
    }

    /// Post send work. Before negotiation it is queued (at most the SQ depth) and handed
    /// to the QP when the stream opens, after the RTR; after a failure it completes with
    /// a flush status.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if let Some(qp) = self.qp_mut() {
            return qp.post_send(wr);
        }
        if wr.sgl.len() > MAX_SGE || (matches!(wr.op, SendOp::Read { .. }) && wr.sgl.len() != 1) {
            return Err(PostError::InvalidSgl);
        }
        match &mut self.phase {
            Phase::Handshake(h) => {
                if h.pending_send.len() >= self.cfg.qp.sq_depth {
                    return Err(PostError::QueueFull);
                }
                h.pending_send.push(wr);
            }
            _ => {
                let op = wc_opcode(&wr.op);
                self.ctr
                    .count_posted_and_done(op, CompletionStatus::WrFlushError);
                self.flushed.push_back(flush_cqe(wr.wr_id, op));
            }
        }
        Ok(())
    }

    /// Post a receive (QP's own receive queue). Queued before negotiation like
    /// [`Self::post_send`].
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if let Some(qp) = self.qp_mut() {
            return qp.post_recv(wr);
        }
        let depth = match self.cfg.qp.rq {
            RqConfig::Own(d) => d,
            RqConfig::Shared(_) => return Err(PostError::InvalidState),
        };
        if wr.sgl.len() > MAX_SGE {
            return Err(PostError::InvalidSgl);
        }
        match &mut self.phase {
            Phase::Handshake(h) => {
                if h.pending_recv.len() >= depth {
                    return Err(PostError::QueueFull);
                }
                h.pending_recv.push(wr);
            }
            _ => {
                self.ctr
                    .count_posted_and_done(WcOpcode::Recv, CompletionStatus::WrFlushError);
                self.flushed.push_back(flush_cqe(wr.wr_id, WcOpcode::Recv));
            }
        }
        Ok(())
    }

    /// The next work completion.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        if let Some(c) = self.flushed.pop_front() {
            return Some(c);
        }
        self.qp_mut().and_then(|q| q.poll_completion())
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// When [`Self::handle_timeout`] must be called (MPA Request/Reply deadlines; none
    /// while the Responder ULP decides, docs/mpa.md §1.5).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Handshake(h) => h.neg.poll_timeout(),
            Phase::Open(s) => s.tx_hold_until,
            Phase::Dead(_) => None,
        }
    }

    /// Fails the negotiation if its deadline passed; ends the Initiator's
    /// `first_fpdu_delay`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Phase::Handshake(h) = &mut self.phase {
            h.neg.handle_timeout(now);
            self.pump_mpa(None, Some(now));
        }
        if let Some(s) = self.phase.stream_mut() {
            if s.tx_hold_until.is_some_and(|t| now >= t) {
                s.tx_hold_until = None;
            }
        }
    }

    /// Responder: accept the pending [`ConnEvent::ConnectRequest`]; queues the Reply.
    pub fn accept(&mut self, params: AcceptParams) -> Result<(), ConnError> {
        let Phase::Handshake(h) = &mut self.phase else {
            return Err(ConnError::InvalidState);
        };
        if self.role != Role::Responder {
            return Err(ConnError::InvalidState);
        }
        h.neg.accept(params)?;
        self.pump_mpa(None, None);
        Ok(())
    }

    /// Responder: reject the pending [`ConnEvent::ConnectRequest`] with a Reply R=1
    /// carrying `private_data`, then close.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), ConnError> {
        let Phase::Handshake(h) = &mut self.phase else {
            return Err(ConnError::InvalidState);
        };
        if self.role != Role::Responder {
            return Err(ConnError::InvalidState);
        }
        h.neg.reject(private_data)?;
        self.pump_mpa(None, None);
        self.die();
        Ok(())
    }

    /// Graceful close (verbs disconnect): no new send work; queued work drains, then the
    /// QP is flushed, [`ConnEvent::Closed`] is reported and [`Self::wants_close`] becomes
    /// true. Before the stream is open it closes at once.
    pub fn close(&mut self) {
        match &mut self.phase {
            Phase::Dead(_) => {}
            Phase::Handshake(_) => self.die(),
            Phase::Open(s) => {
                s.closing = true;
                if s.qp.state() == QpState::Rts {
                    let _ = s.qp.close();
                }
                self.check_closed();
            }
        }
    }

    /// The peer closed TCP (FIN or RST) or the connection was lost. Outstanding work is
    /// flushed; unless we were already closing gracefully this is an error
    /// ([`ConnError::ConnectionLost`]).
    pub fn handle_peer_closed(&mut self) {
        if let Phase::Dead(_) = self.phase {
            self.die();
            return;
        }
        let graceful = self
            .phase
            .stream()
            .is_some_and(|s| s.closing && s.qp.is_drained());
        if !graceful {
            self.events
                .push_back(ConnEvent::Error(ConnError::ConnectionLost));
        }
        self.die();
    }

    /// Whether TCP should be closed now: the stream is finished and every byte that had
    /// to be sent (a Reply with R=1, a Terminate) was handed out by
    /// [`Self::poll_transmit`].
    pub fn wants_close(&self) -> bool {
        let Phase::Dead(stream) = &self.phase else {
            return false;
        };
        if !self.raw_tx.is_empty() {
            return false;
        }
        match stream {
            Some(s) => s.qp.state() != QpState::Terminate || !s.tx_gate_open,
            None => true,
        }
    }

    /// Whether the stream is finished (closed or failed).
    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Dead(_))
    }

    // ------------------------------------------------------------------ input

    /// Feeds received TCP bytes: the MPA frame during setup, then FPDUs, placed straight
    /// into the regions in `res`. Consumes all of `input` (bytes after the stream died are
    /// discarded) and returns how many bytes it consumed. A protocol error is returned and
    /// also reported as [`ConnEvent::Error`].
    pub fn handle_input(
        &mut self,
        now: Instant,
        input: &[u8],
        res: &mut Resources,
    ) -> Result<usize, ConnError> {
        let errors_before = self.errors;
        let mut rest = input;
        if let Phase::Handshake(h) = &mut self.phase {
            // Errors are reported through pump_mpa (Event::Failed).
            let n = h.neg.handle_input(now, rest).unwrap_or(rest.len());
            self.pump_mpa(Some(res), Some(now));
            rest = &rest[n.min(rest.len())..];
            if matches!(self.phase, Phase::Handshake(_)) && !rest.is_empty() {
                // Responder waiting for its ULP: the Initiator may not send anything
                // before our Reply (RFC 5044 §7.1.2; siw fails such a connection, docs/siw.md §4.5).
                self.fail(ConnError::UnexpectedData);
            }
        }
        if self.is_established() && !rest.is_empty() {
            self.rx_fpdus(rest, res);
        }
        if self.rtr_sink.is_some() {
            self.settle_rtr_sink(res);
        }
        match &self.last_error {
            Some(e) if self.errors != errors_before => Err(e.clone()),
            _ => Ok(input.len()),
        }
    }

    /// Deregister the Read RTR's sink once the RTR Read completed or the stream died. The
    /// RTR's completion (signaled only for this) comes from the QP's internal queue; the
    /// ULP never sees it, as with the unsignaled Write and Send RTRs.
    fn settle_rtr_sink(&mut self, res: &mut Resources) {
        let Some(sink) = self.rtr_sink else {
            return;
        };
        let mut done = self.is_closed();
        if let Some(qp) = self.phase.stream_mut().map(|s| &mut s.qp) {
            while let Some(c) = qp.poll_internal_completion() {
                done |= c.opcode == WcOpcode::Read;
            }
        }
        if done {
            let _ = res.stags.deregister(sink);
            self.rtr_sink = None;
        }
    }

    /// Give back what the connection registered in `res` (the Read RTR's sink, if it is
    /// still registered). An owner that drops a connection before it finished calls this
    /// first; calling it more than once is harmless.
    pub fn release(&mut self, res: &mut Resources) {
        if let Some(sink) = self.rtr_sink.take() {
            let _ = res.stags.deregister(sink);
        }
    }

    /// The STag of the Read RTR's sink while it is registered (tests and diagnostics).
    pub fn rtr_sink(&self) -> Option<Stag> {
        self.rtr_sink
    }

    fn rx_fpdus(&mut self, mut rest: &[u8], res: &mut Resources) {
        while !rest.is_empty() {
            let Phase::Open(s) = &mut self.phase else {
                return;
            };
            let Stream { parser, qp, .. } = s;
            let mut ended = false;
            let step = match parser.next(&mut rest) {
                Ok(None) => break,
                Ok(Some(FpduEvent::Header(h))) => {
                    qp.on_header_bytes(res, h.ddp_header(), usize::from(h.ulpdu_len))
                }
                Ok(Some(FpduEvent::Payload(p))) => qp.on_payload(res, p),
                Ok(Some(FpduEvent::End)) => {
                    ended = true;
                    qp.on_end(res)
                }
                Err(e) => {
                    self.llp_error(e);
                    return;
                }
            };
            if let Err(e) = step {
                self.fail(ConnError::Qp(e));
                return;
            }
            if ended && !s.tx_gate_open {
                // The first inbound FPDU arrived intact: the Responder may send
                // (RFC 5044 §7.1.2; RFC 6581 RTR).
                s.tx_gate_open = true;
                if let Some(n) = s.held_established.take() {
                    self.events.push_back(ConnEvent::Established(n));
                }
            }
            self.pump_qp();
            self.maybe_die();
        }
    }

    /// An MPA framing error in the FPDU stream: LLP Terminate (RFC layout) if we may send
    /// FPDUs, then close.
    fn llp_error(&mut self, e: MpaError) {
        match e {
            MpaError::CrcMismatch { .. } => self.ctr.errors.mpa_crc += 1,
            MpaError::MarkerMismatch { .. } => self.ctr.errors.mpa_marker += 1,
            _ => self.ctr.errors.mpa_framing += 1,
        }
        let tc = e.terminate_code();
        if let Some(s) = self.phase.stream_mut() {
            match TerminateCause::from_raw(tc.layer, tc.etype, tc.code) {
                Some(cause) if s.tx_gate_open => s.qp.terminate(cause),
                _ => s.qp.modify_to_error(),
            }
        }
        self.fail(ConnError::Mpa(e));
    }

    // ----------------------------------------------------------------- output

    /// Appends bytes to send to `out` (MPA frame during setup, then FPDUs), at most about
    /// `tx_burst` bytes (always whole FPDUs); returns how many were appended. Call until
    /// it returns 0.
    pub fn poll_transmit(&mut self, res: &Resources, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.append(&mut self.raw_tx);
        if self.may_send_fpdus() {
            while out.len() - start < self.cfg.tx_burst {
                let Some(Stream {
                    qp,
                    encoder,
                    mulpdu,
                    ..
                }) = self.phase.stream_mut()
                else {
                    break;
                };
                let r = qp.poll_segment(res, *mulpdu, |hdr, payload| {
                    encode_segment(encoder, hdr, payload, out)
                });
                if !self.after_segment(r) {
                    break;
                }
            }
        }
        self.pump_qp();
        self.maybe_die();
        self.check_closed();
        out.len() - start
    }

    /// Like [`Self::poll_transmit`], but encodes straight into `out` (e.g. the free
    /// space of a TCP send buffer), with no staging copy: writes up to `out.len()` bytes
    /// of the byte stream (MPA frames, then FPDUs) at the start of `out` and returns how
    /// many. Stops after about `tx_burst` bytes. An FPDU larger than the space left is
    /// encoded aside; what does not fit is kept and written first by the next call (of
    /// either method), so the stream is never cut short. Call until it returns 0.
    pub fn poll_transmit_into(&mut self, res: &Resources, out: &mut [u8]) -> usize {
        let mut n = 0;
        if !self.raw_tx.is_empty() {
            let k = self.raw_tx.len().min(out.len());
            out[..k].copy_from_slice(&self.raw_tx[..k]);
            self.raw_tx.drain(..k);
            n = k;
        }
        if self.raw_tx.is_empty() && self.may_send_fpdus() {
            let burst = self.cfg.tx_burst.min(out.len());
            while n < burst {
                let Some(Stream {
                    qp,
                    encoder,
                    mulpdu,
                    ..
                }) = self.phase.stream_mut()
                else {
                    break;
                };
                let spill = &mut self.raw_tx;
                let rest = &mut out[n..];
                let r = qp.poll_segment(res, *mulpdu, |hdr, payload| {
                    encode_segment_into(encoder, hdr, payload, rest, spill)
                });
                if let Ok(Some(Ok(k))) = r {
                    n += k;
                }
                if !self.after_segment(r) || !self.raw_tx.is_empty() {
                    break;
                }
            }
        }
        self.pump_qp();
        self.maybe_die();
        self.check_closed();
        n
    }

    /// Whether FPDUs may be produced now.
    fn may_send_fpdus(&self) -> bool {
        let Some(s) = self.phase.stream() else {
            return false;
        };
        s.tx_gate_open
            && match s.qp.state() {
                QpState::Rts | QpState::Closing => {
                    self.is_established() && s.tx_hold_until.is_none()
                }
                QpState::Terminate => true,
                _ => false,
            }
    }

    /// Bookkeeping after one `poll_segment` of the transmit loop; `false` ends the loop.
    fn after_segment(&mut self, r: Result<Option<Result<usize, MpaError>>, QpError>) -> bool {
        match r {
            Ok(None) => return false,
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => {
                self.fail(ConnError::Mpa(e));
                return false;
            }
            Err(e) => {
                self.fail(ConnError::Qp(e));
                return false;
            }
        }
        self.pump_qp();
        true
    }

    // --------------------------------------------------------------- internals

    /// Hands the negotiator's frames to the byte stream and acts on its events.
    fn pump_mpa(&mut self, mut res: Option<&mut Resources>, now: Option<Instant>) {
        let Phase::Handshake(h) = &mut self.phase else {
            return;
        };
        // Everything the negotiator has queued (a Responder's reject Reply may come
        // together with the failure) is taken before the events are acted on, since
        // opening or failing ends the handshake and with it the negotiator.
        while let Some(f) = h.neg.poll_transmit() {
            self.raw_tx.extend_from_slice(&f);
        }
        let mut evs = Vec::new();
        while let Some(ev) = h.neg.poll_event() {
            evs.push(ev);
        }
        for ev in evs {
            match ev {
                MpaEvent::ConnectRequest(r) => self.events.push_back(ConnEvent::ConnectRequest(r)),
                MpaEvent::Established(n) => self.open(n, res.as_deref_mut(), now),
                MpaEvent::Rejected { private_data } => {
                    self.events.push_back(ConnEvent::Rejected { private_data });
                    self.die();
                }
                MpaEvent::Failed(e) => {
                    self.ctr.errors.mpa_negotiation += 1;
                    if self.role == Role::Initiator {
                        self.initiator_llp_terminate(&e);
                    }
                    self.fail(ConnError::Mpa(e));
                }
            }
        }
    }

    /// RFC 6581 §5 / siw `siw_proc_mpareply`: an Initiator that cannot use the Reply
    /// answers with an LLP Terminate (0x04 invalid frame, 0x06 IRD, 0x07 RTR). The
    /// Responder is in full operation after its Reply, so it parses this FPDU.
    fn initiator_llp_terminate(&mut self, e: &MpaError) {
        let code = match e {
            MpaError::InvalidFrame(_) => LlpErrorCode::InvalidRequestReply,
            MpaError::InsufficientIrd { .. } => LlpErrorCode::InsufficientIrd,
            MpaError::NoMatchingRtr => LlpErrorCode::NoMatchingRtr,
            _ => return,
        };
        let mut buf = [0u8; UNTAGGED_HEADER_LEN + MAX_TERMINATE_LEN];
        let h = UntaggedHeader {
            last: true,
            rsvd_ulp: Opcode::Terminate.ctrl_byte(),
            rsvd_ulp_ext: 0,
            qn: qn::TERMINATE,
            msn: 1,
            mo: 0,
        };
        let Some(n) = h.emit(&mut buf) else { return };
        let t = Terminate::new(TerminateCause::Llp(code));
        let Some(m) = t.emit(&mut buf[n..]) else {
            return;
        };
        let mut enc = FpduEncoder::new(self.cfg.initiator.crc, false);
        if let Ok(f) = enc.encode_to_vec(&[&buf[..n + m]]) {
            self.raw_tx.extend_from_slice(&f);
            self.ctr.segments_sent += 1;
            self.ctr.terminates_sent += 1;
            self.ctr.last_terminate_sent = Some(TerminateCode::from(&t));
        }
    }

    /// Negotiation succeeded: the handshake becomes an open [`Stream`] with a QP in RTS
    /// that gets the work posted so far (after the RTR, if one is to be sent).
    fn open(&mut self, n: Negotiated, res: Option<&mut Resources>, now: Option<Instant>) {
        let Phase::Handshake(h) = &mut self.phase else {
            return;
        };
        let mut qcfg = self.cfg.qp;
        qcfg.ird = u32::from(n.ird);
        qcfg.ord = u32::from(n.ord);
        let mut qp = QueuePair::new(qcfg);
        if qp.set_rts().is_err() {
            self.fail(ConnError::Qp(QpError::InvalidState));
            return;
        }
        for wr in std::mem::take(&mut h.pending_recv) {
            if qp.post_recv(wr.clone()).is_err() {
                let c = error_cqe(wr.wr_id, WcOpcode::Recv);
                self.ctr.count_posted_and_done(c.opcode, c.status);
                self.flushed.push_back(c);
            }
        }
        if let Some(rtr) = n.rtr_to_send() {
            let wr = rtr_wr(rtr, qcfg, res);
            if let Some(SendOp::Read { .. }) = wr.as_ref().map(|w| &w.op) {
                self.rtr_sink = wr.as_ref().and_then(|w| w.sgl.first()).map(|s| s.lkey);
            }
            qp.set_internal_wr(RTR_WR_ID);
            match wr.map(|wr| qp.post_send(wr)) {
                Some(Ok(())) => {}
                _ => {
                    // The stream dies with its QP, which flushes the receives it got.
                    let pending_send = std::mem::take(&mut h.pending_send);
                    let stream = self.new_stream(n, qp);
                    self.phase = Phase::Open(stream);
                    for wr in pending_send {
                        let c = flush_cqe(wr.wr_id, wc_opcode(&wr.op));
                        self.ctr.count_posted_and_done(c.opcode, c.status);
                        self.flushed.push_back(c);
                    }
                    self.fail(ConnError::InvalidConfig("cannot post the RTR"));
                    return;
                }
            }
        }
        for wr in std::mem::take(&mut h.pending_send) {
            if qp.post_send(wr.clone()).is_err() {
                let c = error_cqe(wr.wr_id, wc_opcode(&wr.op));
                self.ctr.count_posted_and_done(c.opcode, c.status);
                self.flushed.push_back(c);
            }
        }
        let mut s = self.new_stream(n.clone(), qp);
        if let (Role::Initiator, Some(now)) = (self.role, now) {
            if !self.cfg.first_fpdu_delay.is_zero() {
                s.tx_hold_until = Some(now + self.cfg.first_fpdu_delay);
            }
        }
        if self.role == Role::Responder && n.rtr.is_some() {
            s.held_established = Some(n);
        } else {
            self.events.push_back(ConnEvent::Established(n));
        }
        self.phase = Phase::Open(s);
    }

    fn new_stream(&self, n: Negotiated, qp: QueuePair) -> Stream {
        let mulpdu = mulpdu(self.cfg.emss, n.markers_tx);
        // The Responder's gate opens on the first inbound FPDU (RFC 5044 §7.1.2), or at
        // once when asked to send after its Reply and no RTR will come (siw quirk,
        // docs/siw.md §4.8.14).
        let gate_open = self.role == Role::Initiator
            || (self.cfg.responder_sends_after_reply && n.rtr.is_none());
        Stream::new(n, qp, mulpdu, gate_open)
    }

    fn pump_qp(&mut self) {
        let Some(s) = self.phase.stream_mut() else {
            return;
        };
        let mut evs = Vec::new();
        while let Some(e) = s.qp.poll_event() {
            evs.push(e);
        }
        for e in evs {
            match e {
                QpEvent::TerminateReceived(p) => {
                    self.events.push_back(ConnEvent::TerminateReceived(p));
                    self.die();
                }
                QpEvent::TerminateQueued(t) => {
                    let open = self.is_established();
                    let Some(s) = self.phase.stream_mut() else {
                        continue;
                    };
                    s.last_terminate = Some(t);
                    // An LLP error was already reported by llp_error.
                    if t.layer != 2 && open {
                        // Tear down once the current FPDU is complete: a Responder may
                        // send the Terminate only if that first FPDU proves intact.
                        s.dying = true;
                        self.record_error(ConnError::LocalTerminate(t));
                    }
                }
                QpEvent::TerminateSent => {
                    if let Some(t) = self
                        .phase
                        .stream_mut()
                        .and_then(|s| s.last_terminate.take())
                    {
                        self.events.push_back(ConnEvent::TerminateSent(t));
                    }
                    self.die();
                }
                QpEvent::TerminateDropped(t) => {
                    self.fail(ConnError::LocalTerminate(t));
                }
            }
        }
    }

    fn maybe_die(&mut self) {
        let Some(s) = self.phase.stream_mut() else {
            return;
        };
        if s.dying && (s.tx_gate_open || s.parser.is_idle()) {
            s.dying = false;
            self.die();
        }
    }

    fn check_closed(&mut self) {
        if let Phase::Open(s) = &self.phase {
            if s.closing && s.qp.state() == QpState::Closing && s.qp.is_drained() {
                self.die();
            }
        }
    }

    /// Report an error and tear down (a queued Terminate is still sent).
    fn fail(&mut self, e: ConnError) {
        if let Phase::Dead(_) = self.phase {
            return;
        }
        self.record_error(e);
        self.die();
    }

    fn record_error(&mut self, e: ConnError) {
        self.errors += 1;
        self.last_error = Some(e.clone());
        self.events.push_back(ConnEvent::Error(e));
    }

    /// Tear down: no more input, flush work (after a queued Terminate went out), report
    /// Closed once.
    fn die(&mut self) {
        let (mut stream, was_dead) = match std::mem::replace(&mut self.phase, Phase::Dead(None)) {
            Phase::Handshake(h) => {
                let recvs = h.pending_recv.iter().map(|w| (w.wr_id, WcOpcode::Recv));
                let sends = h.pending_send.iter().map(|w| (w.wr_id, wc_opcode(&w.op)));
                for (id, op) in recvs.chain(sends) {
                    self.ctr
                        .count_posted_and_done(op, CompletionStatus::WrFlushError);
                    self.flushed.push_back(flush_cqe(id, op));
                }
                (None, false)
            }
            Phase::Open(s) => (Some(s), false),
            Phase::Dead(s) => (s, true),
        };
        if let Some(s) = stream.as_mut() {
            if s.qp.state() != QpState::Terminate || !s.tx_gate_open {
                s.qp.on_llp_closed();
            }
        }
        self.phase = Phase::Dead(stream);
        if !was_dead {
            self.events.push_back(ConnEvent::Closed);
        }
    }
}

#[cfg(test)]
mod tests;
