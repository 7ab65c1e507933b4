//! One iWARP stream over a reliable byte stream: MPA negotiation, FPDU framing and the
//! RDMAP [`QueuePair`] joined into a sans-IO [`Connection`] (quinn-proto style).
//!
//! Bytes in ([`Connection::handle_input`]), bytes out ([`Connection::poll_transmit`]),
//! events out ([`Connection::poll_event`]), time in ([`Connection::handle_timeout`]). The
//! caller owns the TCP socket (kernel TCP or the xwarp engine) and the clock.
//!
//! Phases: *handshake* (the MPA [`Negotiator`] consumes the Request/Reply frames), *open*
//! (received bytes go through the streaming [`FpduParser`] straight into
//! [`QueuePair::on_header_bytes`]/[`QueuePair::on_payload`]/[`QueuePair::on_end`], so
//! payload is copied once, from the receive buffer into the target region; transmitted
//! FPDUs are framed by [`FpduEncoder`] straight from the header and region slices that
//! [`QueuePair::poll_segment`] hands out), and *dead* (closed or failed: nothing is read,
//! only an already queued Terminate is still sent, then [`Connection::wants_close`]).
//!
//! Rules (iwarp-wire.md §1.5, §4.5, §7; the tests in `rdmap/tests/conn_*.rs` are named
//! after them):
//! * The Initiator sends only its Request until the Reply is received; the Responder
//!   sends only its Reply until the first inbound FPDU arrived with a good CRC
//!   (RFC 5044 §7.1.2). Neither pipelines bytes behind its frame (siw "extra data",
//!   iwarp-wire.md §4.5): the first FPDU only becomes possible once the peer's frame or
//!   FPDU has been received, i.e. after the peer consumed ours.
//! * P2P (RFC 6581): the Initiator's first FPDU is the negotiated RTR — a zero-length
//!   Write to STag 1, TO 0 (siw's form, iwarp-wire.md §1.5), a zero-length Read, or a
//!   zero-length Send — ahead of any work the ULP posted. A P2P Responder reports
//!   [`ConnEvent::Established`] only after that first FPDU (as siw does, §4.3).
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
//!   a little after the Reply (a siw race, see [`ConnConfig::new`]).
//!
//! RTR side effects: a zero-length Send RTR consumes the Responder's first posted receive
//! (and MSN 1 on QN 0, iwarp-wire.md §1.5); it completes with `byte_len` 0, so the
//! Responder ULP posts one receive for it. A zero-length Read RTR needs a local sink: the
//! Initiator registers an empty region in its [`Resources`] (one STag per connection).

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use xwarp_ddp::mpa::{
    mulpdu, AcceptParams, ConnectRequest, Event as MpaEvent, FpduEncoder, FpduEvent, FpduParser,
    InitiatorConfig, MpaError, Negotiated, Negotiator, ResponderConfig, Role, RtrType,
};
use xwarp_ddp::segment::{UntaggedHeader, UNTAGGED_HEADER_LEN};

use crate::mem::{Access, Stag};
use crate::qp::{QpConfig, QpError, QpEvent, QpState, QueuePair, RqConfig, MIN_MULPDU};
use crate::verbs::{
    Completion, CompletionStatus, PostError, RecvWr, Resources, SendOp, SendWr, Sge, WcOpcode,
    MAX_SGE,
};
use crate::wire::{
    qn, LlpErrorCode, Opcode, ParsedTerminate, Terminate, TerminateCause, MAX_TERMINATE_LEN,
};

/// STag of the zero-length RDMA Write RTR (siw sends STag 1, TO 0; a non-zero STag because
/// Chelsio rejects STag 0, iwarp-wire.md §1.5).
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
    /// with rping on a slow guest; siw quirk, iwarp-wire.md §4.3).
    pub fn new(qp: QpConfig) -> ConnConfig {
        ConnConfig {
            qp,
            emss: DEFAULT_EMSS,
            tx_burst: DEFAULT_TX_BURST,
            first_fpdu_delay: Duration::ZERO,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Handshake,
    Open,
    Dead,
}

/// One iWARP stream (MPA + DDP + RDMAP) over a reliable byte stream, sans-IO.
pub struct Connection {
    role: Role,
    cfg: ConnConfig,
    phase: Phase,
    neg: Negotiator,
    negotiated: Option<Negotiated>,
    qp: Option<QueuePair>,
    pending_send: Vec<SendWr>,
    pending_recv: Vec<RecvWr>,
    flushed: VecDeque<Completion>,
    encoder: Option<FpduEncoder>,
    parser: Option<FpduParser>,
    mulpdu: usize,
    /// Responder: no FPDU may be sent before the first inbound FPDU (RFC 5044 §7.1.2).
    tx_gate_open: bool,
    /// Initiator: no FPDU (except a Terminate) before this instant (`first_fpdu_delay`).
    tx_hold_until: Option<Instant>,
    /// P2P Responder: Established is reported after the RTR.
    held_established: Option<Negotiated>,
    raw_tx: Vec<u8>,
    closing: bool,
    close_when_flushed: bool,
    closed_emitted: bool,
    last_terminate: Option<Terminate>,
    dying: bool,
    errors: u32,
    last_error: Option<ConnError>,
    events: VecDeque<ConnEvent>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("role", &self.role)
            .field("phase", &self.phase)
            .field("qp_state", &self.qp.as_ref().map(|q| q.state()))
            .field("tx_gate_open", &self.tx_gate_open)
            .field("wants_close", &self.wants_close())
            .finish()
    }
}

fn check_config(cfg: &ConnConfig) -> Result<(), ConnError> {
    // Markers may be negotiated on either direction, so size for the worst case.
    if mulpdu(cfg.emss, true) < MIN_MULPDU {
        return Err(ConnError::InvalidConfig(
            "emss too small for the longest Terminate",
        ));
    }
    if cfg.qp.ird > u32::from(u16::MAX) || cfg.qp.ord > u32::from(u16::MAX) {
        return Err(ConnError::InvalidConfig("ird/ord above 65535"));
    }
    Ok(())
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
            phase: Phase::Handshake,
            neg,
            negotiated: None,
            qp: None,
            pending_send: Vec::new(),
            pending_recv: Vec::new(),
            flushed: VecDeque::new(),
            encoder: None,
            parser: None,
            mulpdu: 0,
            tx_gate_open: role == Role::Initiator,
            tx_hold_until: None,
            held_established: None,
            raw_tx: Vec::new(),
            closing: false,
            close_when_flushed: false,
            closed_emitted: false,
            last_terminate: None,
            dying: false,
            errors: 0,
            last_error: None,
            events: VecDeque::new(),
        }
    }

    /// Which end we are.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The negotiated parameters, once negotiation succeeded.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// Whether the stream is open (negotiated, not closed or failed).
    pub fn is_established(&self) -> bool {
        self.phase == Phase::Open
    }

    /// The largest ULPDU (DDP segment) we send, 0 before negotiation.
    pub fn mulpdu(&self) -> usize {
        self.mulpdu
    }

    /// The queue pair (exists once negotiation succeeded).
    pub fn qp(&self) -> Option<&QueuePair> {
        self.qp.as_ref()
    }

    /// The queue pair, mutably. Post send work through [`Self::post_send`] so that a
    /// P2P RTR stays the first message.
    pub fn qp_mut(&mut self) -> Option<&mut QueuePair> {
        self.qp.as_mut()
    }

    /// Post send work. Before negotiation it is queued (at most the SQ depth) and handed
    /// to the QP when the stream opens, after the RTR; after a failure it completes with
    /// a flush status.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if let Some(qp) = self.qp.as_mut() {
            return qp.post_send(wr);
        }
        if wr.sgl.len() > MAX_SGE || (matches!(wr.op, SendOp::Read { .. }) && wr.sgl.len() != 1) {
            return Err(PostError::InvalidSgl);
        }
        if self.phase == Phase::Dead {
            self.flushed
                .push_back(flush_cqe(wr.wr_id, wc_opcode(&wr.op)));
            return Ok(());
        }
        if self.pending_send.len() >= self.cfg.qp.sq_depth {
            return Err(PostError::QueueFull);
        }
        self.pending_send.push(wr);
        Ok(())
    }

    /// Post a receive (QP's own receive queue). Queued before negotiation like
    /// [`Self::post_send`].
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if let Some(qp) = self.qp.as_mut() {
            return qp.post_recv(wr);
        }
        let depth = match self.cfg.qp.rq {
            RqConfig::Own(d) => d,
            RqConfig::Shared(_) => return Err(PostError::InvalidState),
        };
        if wr.sgl.len() > MAX_SGE {
            return Err(PostError::InvalidSgl);
        }
        if self.phase == Phase::Dead {
            self.flushed.push_back(flush_cqe(wr.wr_id, WcOpcode::Recv));
            return Ok(());
        }
        if self.pending_recv.len() >= depth {
            return Err(PostError::QueueFull);
        }
        self.pending_recv.push(wr);
        Ok(())
    }

    /// The next work completion.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        if let Some(c) = self.flushed.pop_front() {
            return Some(c);
        }
        self.qp.as_mut().and_then(|q| q.poll_completion())
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ConnEvent> {
        self.events.pop_front()
    }

    /// When [`Self::handle_timeout`] must be called (MPA Request/Reply deadlines; none
    /// while the Responder ULP decides, iwarp-wire.md §1.5).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Handshake => self.neg.poll_timeout(),
            Phase::Open => self.tx_hold_until,
            Phase::Dead => None,
        }
    }

    /// Fails the negotiation if its deadline passed; ends the Initiator's
    /// `first_fpdu_delay`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.phase == Phase::Handshake {
            self.neg.handle_timeout(now);
            self.pump_mpa(None, Some(now));
        }
        if self.tx_hold_until.is_some_and(|t| now >= t) {
            self.tx_hold_until = None;
        }
    }

    /// Responder: accept the pending [`ConnEvent::ConnectRequest`]; queues the Reply.
    pub fn accept(&mut self, params: AcceptParams) -> Result<(), ConnError> {
        if self.role != Role::Responder || self.phase != Phase::Handshake {
            return Err(ConnError::InvalidState);
        }
        self.neg.accept(params)?;
        self.pump_mpa(None, None);
        Ok(())
    }

    /// Responder: reject the pending [`ConnEvent::ConnectRequest`] with a Reply R=1
    /// carrying `private_data`, then close.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), ConnError> {
        if self.role != Role::Responder || self.phase != Phase::Handshake {
            return Err(ConnError::InvalidState);
        }
        self.neg.reject(private_data)?;
        self.pump_mpa(None, None);
        self.die();
        Ok(())
    }

    /// Graceful close (verbs disconnect): no new send work; queued work drains, then the
    /// QP is flushed, [`ConnEvent::Closed`] is reported and [`Self::wants_close`] becomes
    /// true. Before the stream is open it closes at once.
    pub fn close(&mut self) {
        match self.phase {
            Phase::Dead => {}
            Phase::Handshake => self.die(),
            Phase::Open => {
                self.closing = true;
                if let Some(qp) = self.qp.as_mut() {
                    if qp.state() == QpState::Rts {
                        let _ = qp.close();
                    }
                }
                self.check_closed();
            }
        }
    }

    /// The peer closed TCP (FIN or RST) or the connection was lost. Outstanding work is
    /// flushed; unless we were already closing gracefully this is an error
    /// ([`ConnError::ConnectionLost`]).
    pub fn handle_peer_closed(&mut self) {
        if self.phase == Phase::Dead {
            self.die();
            return;
        }
        let graceful = self.closing && self.qp.as_ref().is_some_and(|q| q.is_drained());
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
        if !self.close_when_flushed || !self.raw_tx.is_empty() {
            return false;
        }
        match &self.qp {
            Some(q) => q.state() != QpState::Terminate || !self.tx_gate_open,
            None => true,
        }
    }

    /// Whether the stream is finished (closed or failed).
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Dead
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
        if self.phase == Phase::Handshake {
            // Errors are reported through pump_mpa (Event::Failed).
            let n = self.neg.handle_input(now, rest).unwrap_or(rest.len());
            self.pump_mpa(Some(res), Some(now));
            rest = &rest[n.min(rest.len())..];
            if self.phase == Phase::Handshake && !rest.is_empty() {
                // Responder waiting for its ULP: the Initiator may not send anything
                // before our Reply (RFC 5044 §7.1.2; siw fails such a connection, §4.5).
                self.fail(ConnError::UnexpectedData);
            }
        }
        if self.phase == Phase::Open && !rest.is_empty() {
            self.rx_fpdus(rest, res);
        }
        match &self.last_error {
            Some(e) if self.errors != errors_before => Err(e.clone()),
            _ => Ok(input.len()),
        }
    }

    fn rx_fpdus(&mut self, mut rest: &[u8], res: &mut Resources) {
        while !rest.is_empty() && self.phase == Phase::Open {
            let (Some(parser), Some(qp)) = (self.parser.as_mut(), self.qp.as_mut()) else {
                return;
            };
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
            if ended && !self.tx_gate_open {
                // The first inbound FPDU arrived intact: the Responder may send
                // (RFC 5044 §7.1.2; RFC 6581 RTR).
                self.tx_gate_open = true;
                if let Some(n) = self.held_established.take() {
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
        let tc = e.terminate_code();
        if let Some(qp) = self.qp.as_mut() {
            match TerminateCause::from_raw(tc.layer, tc.etype, tc.code) {
                Some(cause) if self.tx_gate_open => qp.terminate(cause),
                _ => qp.modify_to_error(),
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
        let may_send = self.may_send_fpdus();
        if may_send {
            let mulpdu = self.mulpdu;
            while out.len() - start < self.cfg.tx_burst {
                let (Some(qp), Some(enc)) = (self.qp.as_mut(), self.encoder.as_mut()) else {
                    break;
                };
                let r = qp.poll_segment(res, mulpdu, |hdr, payload| {
                    encode_segment(enc, hdr, payload, out)
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
            let mulpdu = self.mulpdu;
            let burst = self.cfg.tx_burst.min(out.len());
            while n < burst {
                let (Some(qp), Some(enc)) = (self.qp.as_mut(), self.encoder.as_mut()) else {
                    break;
                };
                let spill = &mut self.raw_tx;
                let rest = &mut out[n..];
                let r = qp.poll_segment(res, mulpdu, |hdr, payload| {
                    encode_segment_into(enc, hdr, payload, rest, spill)
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
        self.tx_gate_open
            && match self.qp.as_ref().map(|q| q.state()) {
                Some(QpState::Rts | QpState::Closing) => {
                    self.phase == Phase::Open && self.tx_hold_until.is_none()
                }
                Some(QpState::Terminate) => true,
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

    fn pump_mpa(&mut self, mut res: Option<&mut Resources>, now: Option<Instant>) {
        while let Some(f) = self.neg.poll_transmit() {
            self.raw_tx.extend_from_slice(&f);
        }
        while let Some(ev) = self.neg.poll_event() {
            match ev {
                MpaEvent::ConnectRequest(r) => self.events.push_back(ConnEvent::ConnectRequest(r)),
                MpaEvent::Established(n) => self.open(n, res.as_deref_mut(), now),
                MpaEvent::Rejected { private_data } => {
                    self.events.push_back(ConnEvent::Rejected { private_data });
                    self.die();
                }
                MpaEvent::Failed(e) => {
                    if self.role == Role::Initiator {
                        self.initiator_llp_terminate(&e);
                    }
                    self.fail(ConnError::Mpa(e));
                }
            }
        }
        // A Responder's reject Reply may have been queued together with the failure.
        while let Some(f) = self.neg.poll_transmit() {
            self.raw_tx.extend_from_slice(&f);
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
        let Some(m) = Terminate::new(TerminateCause::Llp(code)).emit(&mut buf[n..]) else {
            return;
        };
        let mut enc = FpduEncoder::new(self.cfg.initiator.crc, false);
        if let Ok(f) = enc.encode_to_vec(&[&buf[..n + m]]) {
            self.raw_tx.extend_from_slice(&f);
        }
    }

    fn open(&mut self, n: Negotiated, res: Option<&mut Resources>, now: Option<Instant>) {
        let mut qcfg = self.cfg.qp;
        qcfg.ird = u32::from(n.ird);
        qcfg.ord = u32::from(n.ord);
        let mut qp = QueuePair::new(qcfg);
        if qp.set_rts().is_err() {
            self.fail(ConnError::Qp(QpError::InvalidState));
            return;
        }
        self.mulpdu = mulpdu(self.cfg.emss, n.markers_tx);
        self.encoder = Some(n.fpdu_encoder());
        self.parser = Some(n.fpdu_parser());
        for wr in std::mem::take(&mut self.pending_recv) {
            if qp.post_recv(wr.clone()).is_err() {
                self.flushed.push_back(error_cqe(wr.wr_id, WcOpcode::Recv));
            }
        }
        if let Some(rtr) = n.rtr_to_send() {
            let wr = match rtr {
                RtrType::Write => Some(SendWr {
                    wr_id: u64::MAX,
                    op: SendOp::Write {
                        remote_stag: RTR_WRITE_STAG,
                        remote_to: 0,
                    },
                    sgl: Vec::new(),
                    signaled: false,
                    fence: false,
                }),
                RtrType::Send => Some(SendWr {
                    wr_id: u64::MAX,
                    op: SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                    sgl: Vec::new(),
                    signaled: false,
                    fence: false,
                }),
                RtrType::Read => {
                    // A zero-length Read still needs a valid local sink: an empty region.
                    let mr = res.and_then(|r| {
                        r.stags
                            .register(qcfg.pd, Access::LOCAL_WRITE, 0, Box::new(Vec::<u8>::new()))
                            .ok()
                    });
                    mr.map(|lkey| SendWr {
                        wr_id: u64::MAX,
                        op: SendOp::Read {
                            remote_stag: RTR_WRITE_STAG,
                            remote_to: 0,
                        },
                        sgl: vec![Sge {
                            lkey,
                            addr: 0,
                            len: 0,
                        }],
                        signaled: false,
                        fence: false,
                    })
                }
            };
            match wr.map(|wr| qp.post_send(wr)) {
                Some(Ok(())) => {}
                _ => {
                    self.qp = Some(qp);
                    self.fail(ConnError::InvalidConfig("cannot post the RTR"));
                    return;
                }
            }
        }
        for wr in std::mem::take(&mut self.pending_send) {
            if qp.post_send(wr.clone()).is_err() {
                self.flushed
                    .push_back(error_cqe(wr.wr_id, wc_opcode(&wr.op)));
            }
        }
        self.qp = Some(qp);
        self.phase = Phase::Open;
        if let (Role::Initiator, Some(now)) = (self.role, now) {
            if !self.cfg.first_fpdu_delay.is_zero() {
                self.tx_hold_until = Some(now + self.cfg.first_fpdu_delay);
            }
        }
        self.negotiated = Some(n.clone());
        if self.role == Role::Responder && n.rtr.is_some() {
            self.held_established = Some(n);
        } else {
            self.events.push_back(ConnEvent::Established(n));
        }
    }

    fn pump_qp(&mut self) {
        let Some(qp) = self.qp.as_mut() else { return };
        let mut evs = Vec::new();
        while let Some(e) = qp.poll_event() {
            evs.push(e);
        }
        for e in evs {
            match e {
                QpEvent::TerminateReceived(p) => {
                    self.events.push_back(ConnEvent::TerminateReceived(p));
                    self.die();
                }
                QpEvent::TerminateQueued(t) => {
                    self.last_terminate = Some(t);
                    // An LLP error was already reported by llp_error.
                    if t.layer != 2 && self.phase != Phase::Dead {
                        self.record_error(ConnError::LocalTerminate(t));
                        // Tear down once the current FPDU is complete: a Responder may
                        // send the Terminate only if that first FPDU proves intact.
                        self.dying = true;
                    }
                }
                QpEvent::TerminateSent => {
                    if let Some(t) = self.last_terminate.take() {
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
        let between_fpdus = self.parser.as_ref().is_none_or(|p| p.is_idle());
        if self.dying && (self.tx_gate_open || between_fpdus) {
            self.dying = false;
            self.die();
        }
    }

    fn check_closed(&mut self) {
        if self.closing && self.phase == Phase::Open {
            if let Some(qp) = self.qp.as_mut() {
                if qp.state() == QpState::Closing && qp.is_drained() {
                    self.die();
                }
            }
        }
    }

    /// Report an error and tear down (a queued Terminate is still sent).
    fn fail(&mut self, e: ConnError) {
        if self.phase == Phase::Dead && self.closed_emitted {
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
        self.phase = Phase::Dead;
        self.close_when_flushed = true;
        if let Some(qp) = self.qp.as_mut() {
            if qp.state() != QpState::Terminate || !self.tx_gate_open {
                qp.on_llp_closed();
            }
        }
        for wr in std::mem::take(&mut self.pending_recv) {
            self.flushed.push_back(flush_cqe(wr.wr_id, WcOpcode::Recv));
        }
        for wr in std::mem::take(&mut self.pending_send) {
            self.flushed
                .push_back(flush_cqe(wr.wr_id, wc_opcode(&wr.op)));
        }
        if !self.closed_emitted {
            self.closed_emitted = true;
            self.events.push_back(ConnEvent::Closed);
        }
    }
}

fn encode_segment(
    enc: &mut FpduEncoder,
    hdr: &[u8],
    payload: &[&[u8]],
    out: &mut Vec<u8>,
) -> Result<usize, MpaError> {
    let mut parts: [&[u8]; 1 + MAX_SGE] = [&[]; 1 + MAX_SGE];
    let mut n = 1;
    parts[0] = hdr;
    let mut ulpdu_len = hdr.len();
    for p in payload {
        if n == parts.len() {
            return Err(xwarp_ddp::mpa::LocalError::InvalidState.into());
        }
        parts[n] = p;
        n += 1;
        ulpdu_len += p.len();
    }
    let start = out.len();
    out.resize(start + enc.max_encoded_len(ulpdu_len), 0);
    match enc.encode(&parts[..n], &mut out[start..]) {
        Ok(k) => {
            out.truncate(start + k);
            Ok(k)
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Frames one ULPDU into the start of `out` when the largest FPDU it can become fits;
/// otherwise into `spill` (empty on entry), copying what fits into `out` and leaving the
/// rest at the start of `spill`. Returns the bytes written into `out`.
fn encode_segment_into(
    enc: &mut FpduEncoder,
    hdr: &[u8],
    payload: &[&[u8]],
    out: &mut [u8],
    spill: &mut Vec<u8>,
) -> Result<usize, MpaError> {
    let ulpdu_len = hdr.len() + payload.iter().map(|p| p.len()).sum::<usize>();
    if enc.max_encoded_len(ulpdu_len) <= out.len() {
        let mut parts: [&[u8]; 1 + MAX_SGE] = [&[]; 1 + MAX_SGE];
        if payload.len() >= parts.len() {
            return Err(xwarp_ddp::mpa::LocalError::InvalidState.into());
        }
        parts[0] = hdr;
        parts[1..=payload.len()].copy_from_slice(payload);
        return enc.encode(&parts[..=payload.len()], out);
    }
    let k = encode_segment(enc, hdr, payload, spill)?;
    let fit = k.min(out.len());
    out[..fit].copy_from_slice(&spill[..fit]);
    spill.drain(..fit);
    Ok(fit)
}

fn wc_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::Write,
        SendOp::Read { .. } => WcOpcode::Read,
    }
}

fn flush_cqe(wr_id: u64, opcode: WcOpcode) -> Completion {
    Completion {
        wr_id,
        status: CompletionStatus::WrFlushError,
        opcode,
        byte_len: 0,
        solicited: false,
        invalidated_stag: None,
    }
}

fn error_cqe(wr_id: u64, opcode: WcOpcode) -> Completion {
    Completion {
        status: CompletionStatus::LocalQpOperationError,
        ..flush_cqe(wr_id, opcode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::PdId;
    use crate::verbs::SendWr;

    /// xorshift64*: deterministic piece sizes.
    struct Rng(u64);
    impl Rng {
        fn range(&mut self, lo: usize, hi: usize) -> usize {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            lo + (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % (hi - lo + 1) as u64) as usize
        }
    }

    struct End {
        conn: Connection,
        res: Resources,
        pd: PdId,
        sent: Vec<u8>,
    }

    fn end(initiator: bool, now: Instant) -> End {
        let mut res = Resources::new();
        let pd = res.stags.alloc_pd();
        let mut cfg = ConnConfig::new(QpConfig {
            pd,
            ird: 4,
            ord: 4,
            sq_depth: 64,
            rq: RqConfig::Own(64),
        });
        cfg.emss = 1448;
        cfg.initiator.crc = true;
        cfg.responder.crc = true;
        let conn = if initiator {
            Connection::initiator(cfg, now).unwrap()
        } else {
            Connection::responder(cfg, now).unwrap()
        };
        End {
            conn,
            res,
            pd,
            sent: Vec::new(),
        }
    }

    /// Everything `e` has to send: through `poll_transmit_into` with buffers of random
    /// sizes (`rng`), or through `poll_transmit` (`None`).
    fn transmit(e: &mut End, rng: Option<&mut Rng>) -> Vec<u8> {
        let mut out = Vec::new();
        match rng {
            Some(rng) => loop {
                let mut buf = vec![0u8; rng.range(1, 3000)];
                let n = e.conn.poll_transmit_into(&e.res, &mut buf);
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            },
            None => while e.conn.poll_transmit(&e.res, &mut out) > 0 {},
        }
        e.sent.extend_from_slice(&out);
        out
    }

    /// Connect, then Write `data` and Send 100 bytes from the initiator; returns both
    /// ends after everything was delivered.
    fn run(data: &[u8], mut rng: Option<Rng>) -> (End, End, Stag) {
        let now = Instant::now();
        let (mut i, mut r) = (end(true, now), end(false, now));
        let sink = r
            .res
            .stags
            .register(
                r.pd,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                0x1000,
                Box::new(vec![0u8; data.len() + 100]),
            )
            .unwrap();
        let src = i
            .res
            .stags
            .register(i.pd, Access::LOCAL_WRITE, 0x9000, Box::new(data.to_vec()))
            .unwrap();
        let mut accepted = false;
        let mut posted = false;
        for _ in 0..10_000 {
            let ab = transmit(&mut i, rng.as_mut());
            let ba = transmit(&mut r, rng.as_mut());
            r.conn.handle_input(now, &ab, &mut r.res).unwrap();
            i.conn.handle_input(now, &ba, &mut i.res).unwrap();
            while let Some(e) = r.conn.poll_event() {
                if matches!(e, ConnEvent::ConnectRequest(_)) && !accepted {
                    accepted = true;
                    r.conn
                        .accept(AcceptParams {
                            ird: 4,
                            ord: 4,
                            private_data: Vec::new(),
                        })
                        .unwrap();
                    let sge = Sge {
                        lkey: sink,
                        addr: 0x1000 + data.len() as u64,
                        len: 100,
                    };
                    r.conn
                        .post_recv(crate::verbs::RecvWr {
                            wr_id: 7,
                            sgl: vec![sge],
                        })
                        .unwrap();
                }
            }
            while i.conn.poll_event().is_some() {}
            if i.conn.is_established() && !posted {
                posted = true;
                let sge = |addr, len| Sge {
                    lkey: src,
                    addr,
                    len,
                };
                let wr = |wr_id, op, sgl| SendWr {
                    wr_id,
                    op,
                    sgl,
                    signaled: true,
                    fence: false,
                };
                let write = SendOp::Write {
                    remote_stag: sink,
                    remote_to: 0x1000,
                };
                i.conn
                    .post_send(wr(1, write, vec![sge(0x9000, data.len() as u32)]))
                    .unwrap();
                let send = SendOp::Send {
                    solicited: false,
                    invalidate: None,
                };
                i.conn
                    .post_send(wr(2, send, vec![sge(0x9000, 100)]))
                    .unwrap();
            }
            if posted && ab.is_empty() && ba.is_empty() {
                break;
            }
        }
        (i, r, sink)
    }

    #[test]
    fn poll_transmit_into_small_buffers_carries_the_same_stream_as_poll_transmit() {
        let data: Vec<u8> = (0..200_000u32).map(|x| (x * 7 + x / 253) as u8).collect();
        let (mut i_ref, _, _) = run(&data, None);
        let (mut i, mut r, sink) = run(&data, Some(Rng(0x5eed)));
        // Byte for byte the stream of the staging API (MPA frames, FPDUs, CRCs).
        assert_eq!(i.sent.len(), i_ref.sent.len());
        assert!(i.sent == i_ref.sent, "streams differ");
        // The data landed, and both work requests completed successfully.
        let mem = r
            .res
            .stags
            .region(sink)
            .unwrap()
            .memory()
            .read_at(0, data.len() + 100)
            .to_vec();
        assert_eq!(&mem[..data.len()], &data[..]);
        assert_eq!(&mem[data.len()..], &data[..100]);
        let ok = |c: Option<Completion>| c.map(|c| (c.wr_id, c.status));
        assert_eq!(
            ok(i.conn.poll_completion()),
            Some((1, CompletionStatus::Success))
        );
        assert_eq!(
            ok(i.conn.poll_completion()),
            Some((2, CompletionStatus::Success))
        );
        assert_eq!(
            ok(r.conn.poll_completion()),
            Some((7, CompletionStatus::Success))
        );
        assert!(i_ref.conn.poll_completion().is_some());
    }

    #[test]
    fn poll_transmit_into_keeps_an_fpdu_that_does_not_fit_for_the_next_call() {
        let data = vec![0xa5u8; 4000];
        let (mut i, _, _) = run(&[1u8; 200], Some(Rng(1)));
        assert!(i.conn.is_established());
        // A one-byte buffer always takes exactly one byte while anything is queued.
        let src = i
            .res
            .stags
            .register(i.pd, Access::LOCAL_WRITE, 0x20000, Box::new(data.clone()))
            .unwrap();
        i.conn
            .post_send(SendWr {
                wr_id: 9,
                op: SendOp::Write {
                    remote_stag: Stag(0x1234_5600),
                    remote_to: 0,
                },
                sgl: vec![Sge {
                    lkey: src,
                    addr: 0x20000,
                    len: 4000,
                }],
                signaled: true,
                fence: false,
            })
            .unwrap();
        let mut bytes = Vec::new();
        let mut one = [0u8; 1];
        while i.conn.poll_transmit_into(&i.res, &mut one) == 1 {
            bytes.push(one[0]);
            assert!(bytes.len() <= 8000, "never ends");
        }
        // Three FPDUs (MULPDU of a 1448-byte EMSS), each whole: length field + ULPDU +
        // pad + CRC, CRC valid.
        let mut at = 0;
        let mut fpdus = 0;
        while at < bytes.len() {
            let ulpdu = usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
            let len = 2 + ulpdu + (4 - (2 + ulpdu) % 4) % 4;
            let trailer: [u8; 4] = bytes[at + len..at + len + 4].try_into().unwrap();
            assert_eq!(
                xwarp_ddp::mpa::crc::crc32c(&bytes[at..at + len]),
                xwarp_ddp::mpa::crc::crc_from_trailer(trailer),
                "FPDU {fpdus} CRC"
            );
            at += len + 4;
            fpdus += 1;
        }
        assert_eq!(at, bytes.len());
        assert_eq!(fpdus, 3);
    }
}
