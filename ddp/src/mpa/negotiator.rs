//! MPA connection setup (RFC 5044 §7, RFC 6581 §3–§5), sans-IO in the quinn-proto style:
//! bytes in ([`Negotiator::handle_input`]), frames out ([`Negotiator::poll_transmit`]),
//! events out ([`Negotiator::poll_event`]), time in ([`Negotiator::handle_timeout`]).
//!
//! Phases: Initiator `AwaitingReply → Established | Rejected | Failed`; Responder
//! `AwaitingRequest → AwaitingUlp → Established | Closed (rejected by us) | Failed`.
//!
//! Rules implemented (tests in `ddp/tests/mpa_negotiation.rs` are named after them):
//! * The Initiator sends only its Request and nothing after it until the Reply is fully
//!   received: the caller gets [`Event::Established`] only after the last Reply byte.
//! * The Responder never sends an FPDU before the first inbound FPDU:
//!   [`Negotiated::responder_must_wait_for_first_fpdu`].
//! * Only frame bytes are consumed: FPDU bytes in the same input as the Reply are
//!   returned unconsumed (be liberal, docs/mpa.md §1.9).
//! * CRC: C in either frame ⇒ CRC both ways; a Responder receiving C=1 answers C=1.
//! * Markers per direction: M in the Request ⇒ the Responder inserts markers toward the
//!   Initiator; M in the Reply ⇒ the Initiator inserts markers toward the Responder.
//! * Rev 1 and Rev 2; the Reply's Rev is min(Request Rev, ours); other revisions close
//!   the connection without a Reply (RFC 5044; siw does the same, docs/siw.md §4.8.5).
//! * RFC 6581 IRD/ORD: each side's ORD never exceeds the other's IRD; see
//!   [`InitiatorConfig::relaxed_ird_ord`]; failures are [`MpaError::InsufficientIrd`] (0x06).
//! * P2P/RTR: the Initiator offers its set; the Responder echoes A and picks exactly one
//!   type: **Write if offered, else Read, else Send** (siw picks Write, then Read,
//!   docs/siw.md §4.3; Write needs no receive buffer and no IRD, Read needs IRD/ORD ≥ 1,
//!   Send consumes a receive buffer and MSN 1, so it is the last resort). No usable type ⇒
//!   [`MpaError::NoMatchingRtr`] (0x07).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::error::{FrameError, LocalError, MpaError};
use super::fpdu::FpduEncoder;
use super::frame::{
    EnhancedBlock, FrameKind, FrameParse, FrameRepr, RtrSet, RtrType, ENHANCED_BLOCK_LEN,
    HEADER_LEN, IRD_ORD_MAX, MAX_PD_LENGTH_EMIT, MAX_PD_LENGTH_RECEIVE,
};
use super::parser::FpduParser;

/// siw's initiator timeout waiting for the Reply (`MPAREQ_TIMEOUT`, docs/mpa.md §1.5).
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// siw's responder timeout waiting for the Request (`MPAREP_TIMEOUT`, docs/mpa.md §1.5).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest frame the negotiator buffers (20 + 512).
pub const MAX_FRAME_LEN: usize = HEADER_LEN + MAX_PD_LENGTH_RECEIVE;
/// siw's IRD/ORD cap (`SIW_MAX_IRD_QP`/`SIW_MAX_ORD_QP`, docs/siw.md §4.1).
pub const DEFAULT_MAX_IRD: u16 = 128;

/// Which end of the TCP connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Active side; sends the Request.
    Initiator,
    /// Passive side; sends the Reply.
    Responder,
}

/// Initiator settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitiatorConfig {
    /// Rev to request: 1 (RFC 5044) or 2 (RFC 6581). Default 2.
    pub revision: u8,
    /// With Rev 2, use enhanced setup (flag 0x10 + IRD/ORD block). Default true
    /// (siw requires an enhanced Reply to its enhanced Request, docs/siw.md §4.2).
    pub enhanced: bool,
    /// Set C: require CRC. Default false (siw default, docs/siw.md §4.1).
    pub crc: bool,
    /// Set M: require markers in the FPDUs we receive. Default false (siw refuses markers).
    pub markers: bool,
    /// Accept a Reply with M=1 (we then insert markers). Default true.
    pub accept_peer_markers: bool,
    /// Our IRD (Reads we serve). Default 1 (rping uses 1/1, docs/protocols.md §5.2).
    pub ird: u16,
    /// Our ORD (Reads we issue). Default 1.
    pub ord: u16,
    /// P2P mode: the RTR types we can send. `None` (default): no P2P, as siw.
    pub p2p: Option<RtrSet>,
    /// ULP private data. With the v2 block PD_Length must stay ≤ 256; keep it ≤ 251 bytes
    /// toward siw (its u8 length wraps, docs/siw.md §4.8.2).
    pub private_data: Vec<u8>,
    /// How long to wait for the Reply. Default 10 s.
    pub reply_timeout: Duration,
    /// Adjust instead of failing (siw `relaxed_ird_negotiation`, docs/siw.md §4.2):
    /// raise our IRD up to `max_ird` to match the Reply's ORD, and lower our ORD to the
    /// Reply's IRD. When false either mismatch fails with 0x06. Default true.
    pub relaxed_ird_ord: bool,
    /// Upper bound for a relaxed IRD increase. Default 128.
    pub max_ird: u16,
    /// Advertise IRD and ORD of at least 1: siw with IRD 0 Terminates every Read and with
    /// ORD 0 cannot issue one (siw quirk, docs/siw.md §4.8.11). Default true.
    pub siw_min_ird_ord: bool,
}

impl Default for InitiatorConfig {
    fn default() -> Self {
        InitiatorConfig {
            revision: 2,
            enhanced: true,
            crc: false,
            markers: false,
            accept_peer_markers: true,
            ird: 1,
            ord: 1,
            p2p: None,
            private_data: Vec::new(),
            reply_timeout: DEFAULT_REPLY_TIMEOUT,
            relaxed_ird_ord: true,
            max_ird: DEFAULT_MAX_IRD,
            siw_min_ird_ord: true,
        }
    }
}

/// Responder settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponderConfig {
    /// Highest Rev we speak (1 or 2). Default 2.
    pub max_revision: u8,
    /// Set C in every Reply: require CRC. Default false.
    pub crc: bool,
    /// Set M in the Reply: require markers in the FPDUs we receive. Default false.
    pub markers: bool,
    /// Accept a Request with M=1 (we then insert markers); when false such a Request gets
    /// a Reply with R=1, as siw does (docs/siw.md §4.3). Default true.
    pub accept_peer_markers: bool,
    /// RTR types we accept as the first FPDU in P2P mode. Default all three.
    pub rtr: RtrSet,
    /// How long to wait for the Request after TCP accept. Default 5 s.
    pub request_timeout: Duration,
    /// Raise our IRD up to `max_ird` to match the Request's ORD (siw relaxed negotiation,
    /// docs/siw.md §4.3). Default true.
    pub relaxed_ird_ord: bool,
    /// Upper bound for a relaxed IRD increase. Default 128.
    pub max_ird: u16,
    /// Advertise IRD and ORD of at least 1 (docs/siw.md §4.8.11). Default true.
    pub siw_min_ird_ord: bool,
    /// Echo the Request's reserved flag bits in the Reply, as siw does (docs/siw.md §4.3,
    /// §4.8.4). Default false: RFC 5044 says send 0.
    pub echo_reserved_flags: bool,
}

impl Default for ResponderConfig {
    fn default() -> Self {
        ResponderConfig {
            max_revision: 2,
            crc: false,
            markers: false,
            accept_peer_markers: true,
            rtr: RtrSet::ALL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            relaxed_ird_ord: true,
            max_ird: DEFAULT_MAX_IRD,
            siw_min_ird_ord: true,
            echo_reserved_flags: false,
        }
    }
}

/// A Request as shown to the Responder's ULP, which answers with
/// [`Negotiator::accept`] or [`Negotiator::reject`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Rev of the Request.
    pub revision: u8,
    /// Whether the Request used enhanced setup (v2 block present).
    pub enhanced: bool,
    /// C flag.
    pub crc: bool,
    /// M flag (we will insert markers toward the Initiator).
    pub markers: bool,
    /// Initiator IRD (v2 block).
    pub peer_ird: Option<u16>,
    /// Initiator ORD (v2 block).
    pub peer_ord: Option<u16>,
    /// RTR types offered when the Initiator asked for P2P (flag A).
    pub p2p: Option<RtrSet>,
    /// The RTR type we will pick if accepted.
    pub rtr: Option<RtrType>,
    /// ULP private data (v2 block stripped).
    pub private_data: Vec<u8>,
}

/// The Responder ULP's answer to a [`ConnectRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AcceptParams {
    /// Our IRD (Reads we serve).
    pub ird: u16,
    /// Our ORD (Reads we issue); lowered to the Initiator's IRD.
    pub ord: u16,
    /// ULP private data for the Reply.
    pub private_data: Vec<u8>,
}

/// The outcome of a successful negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// Our role.
    pub role: Role,
    /// Rev in use (the Reply's).
    pub revision: u8,
    /// Whether enhanced (RFC 6581) setup was used.
    pub enhanced: bool,
    /// CRC32c generated and checked in both directions.
    pub crc: bool,
    /// We insert markers in the FPDUs we send.
    pub markers_tx: bool,
    /// The peer inserts markers in the FPDUs we receive.
    pub markers_rx: bool,
    /// Our negotiated IRD.
    pub ird: u16,
    /// Our negotiated ORD.
    pub ord: u16,
    /// Peer IRD from its v2 block.
    pub peer_ird: Option<u16>,
    /// Peer ORD from its v2 block.
    pub peer_ord: Option<u16>,
    /// P2P negotiated: the RTR type the Initiator sends as its first FPDU.
    pub rtr: Option<RtrType>,
    /// The peer's ULP private data (v2 block stripped).
    pub peer_private_data: Vec<u8>,
}

impl Negotiated {
    /// RFC 5044 §7.1.2: the Responder sends no FPDU before it received (and validated)
    /// the first FPDU from the Initiator. True for the Responder.
    pub fn responder_must_wait_for_first_fpdu(&self) -> bool {
        self.role == Role::Responder
    }

    /// For the Initiator in P2P mode: the zero-length RTR message it must send first
    /// (a Write RTR should use a non-zero STag, docs/mpa.md §1.5).
    pub fn rtr_to_send(&self) -> Option<RtrType> {
        match self.role {
            Role::Initiator => self.rtr,
            Role::Responder => None,
        }
    }

    /// Encoder for the FPDUs we send.
    pub fn fpdu_encoder(&self) -> FpduEncoder {
        FpduEncoder::new(self.crc, self.markers_tx)
    }

    /// Parser for the FPDUs we receive.
    pub fn fpdu_parser(&self) -> FpduParser {
        FpduParser::new(self.crc, self.markers_rx)
    }
}

/// Something the caller must react to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Responder: a Request arrived; answer with [`Negotiator::accept`] or
    /// [`Negotiator::reject`]. No timeout runs meanwhile.
    ConnectRequest(ConnectRequest),
    /// Negotiation done; FPDUs may flow (subject to the first-FPDU rule).
    Established(Negotiated),
    /// Initiator: the Responder rejected (R=1); close TCP.
    Rejected {
        /// The Responder's ULP private data.
        private_data: Vec<u8>,
    },
    /// Negotiation failed; send any queued frame, report `llp_error_code()` in a
    /// Terminate if appropriate, and close TCP.
    Failed(MpaError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RequestInfo {
    revision: u8,
    enhanced: bool,
    crc: bool,
    markers: bool,
    reserved: u8,
    block: Option<EnhancedBlock>,
    rtr: Option<RtrType>,
}

#[derive(Debug, Clone)]
enum State {
    AwaitingReply {
        deadline: Instant,
        request: RequestInfo,
    },
    AwaitingRequest {
        deadline: Instant,
    },
    AwaitingUlp {
        request: RequestInfo,
        private_data: Vec<u8>,
    },
    Established,
    Rejected,
    Closed,
    Failed,
}

/// MPA Request/Reply negotiator for one connection.
#[derive(Debug, Clone)]
pub struct Negotiator {
    role: Role,
    state: State,
    init: InitiatorConfig,
    resp: ResponderConfig,
    /// Partial frame bytes (at most 20 + 512).
    buf: Vec<u8>,
    transmit: VecDeque<Vec<u8>>,
    events: VecDeque<Event>,
}

fn floor1(v: u16, on: bool) -> u16 {
    if on {
        v.max(1)
    } else {
        v
    }
}

impl Negotiator {
    /// An Initiator; its Request is queued for [`Self::poll_transmit`] and the Reply timer
    /// starts at `now`. Fails on a bad configuration (Rev, IRD/ORD, private-data length).
    pub fn initiator(config: InitiatorConfig, now: Instant) -> Result<Negotiator, MpaError> {
        if !(1..=2).contains(&config.revision) {
            return Err(LocalError::InvalidConfig("revision must be 1 or 2").into());
        }
        let enhanced = config.revision == 2 && config.enhanced;
        let mut ird = floor1(config.ird, config.siw_min_ird_ord);
        let mut ord = floor1(config.ord, config.siw_min_ird_ord);
        let mut block = None;
        if enhanced {
            let p2p = config.p2p.is_some();
            let rtr = config.p2p.unwrap_or(RtrSet::NONE);
            if p2p && rtr.read {
                // A Read RTR needs ORD ≥ 1 (siw forces it too, docs/siw.md §4.2).
                ord = ord.max(1);
            }
            if ird > IRD_ORD_MAX || ord > IRD_ORD_MAX {
                return Err(LocalError::IrdOrdTooLarge.into());
            }
            block = Some(EnhancedBlock { p2p, rtr, ird, ord });
        } else {
            ird = ird.min(IRD_ORD_MAX);
            ord = ord.min(IRD_ORD_MAX);
        }
        let repr = FrameRepr {
            kind: FrameKind::Request,
            markers: config.markers,
            crc: config.crc,
            reject: false,
            enhanced,
            reserved: 0,
            revision: config.revision,
            enhanced_block: block,
            private_data: &config.private_data,
        };
        let frame = repr.to_vec()?;
        let request = RequestInfo {
            revision: config.revision,
            enhanced,
            crc: config.crc,
            markers: config.markers,
            reserved: 0,
            block,
            rtr: None,
        };
        let deadline = now + config.reply_timeout;
        let mut init = config;
        init.ird = ird;
        init.ord = ord;
        Ok(Negotiator {
            role: Role::Initiator,
            state: State::AwaitingReply { deadline, request },
            init,
            resp: ResponderConfig::default(),
            buf: Vec::new(),
            transmit: VecDeque::from([frame]),
            events: VecDeque::new(),
        })
    }

    /// A Responder on a freshly accepted TCP connection; the Request timer starts at `now`.
    pub fn responder(config: ResponderConfig, now: Instant) -> Result<Negotiator, MpaError> {
        if !(1..=2).contains(&config.max_revision) {
            return Err(LocalError::InvalidConfig("max_revision must be 1 or 2").into());
        }
        let deadline = now + config.request_timeout;
        Ok(Negotiator {
            role: Role::Responder,
            state: State::AwaitingRequest { deadline },
            init: InitiatorConfig::default(),
            resp: config,
            buf: Vec::new(),
            transmit: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether negotiation succeeded.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    /// Whether the connection should be closed once queued frames are sent (rejected in
    /// either direction, or failed).
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Rejected | State::Closed | State::Failed)
    }

    /// The next frame to send (the Request, or the Reply). Send each exactly once and send
    /// nothing behind it before the negotiation completes: siw fails a connection when
    /// bytes follow a Request/Reply it has not processed yet (docs/siw.md §4.5).
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmit.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Self::handle_timeout`] must be called; `None` while the ULP decides and after
    /// negotiation.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitingReply { deadline, .. } | State::AwaitingRequest { deadline } => {
                Some(deadline)
            }
            _ => None,
        }
    }

    /// Fails the negotiation with [`MpaError::Timeout`] if its deadline passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(deadline) = self.poll_timeout() {
            if now >= deadline {
                self.fail(MpaError::Timeout);
            }
        }
    }

    fn fail(&mut self, e: MpaError) -> MpaError {
        self.state = State::Failed;
        self.events.push_back(Event::Failed(e.clone()));
        e
    }

    /// Feeds received TCP bytes. Consumes only bytes of the expected frame and returns how
    /// many; bytes after a complete frame (e.g. the first FPDU behind the Reply) stay with
    /// the caller for the FPDU parser. Returns `Ok(0)` when no frame is expected (while the
    /// ULP decides, or after negotiation). A protocol error is returned and also queued as
    /// [`Event::Failed`].
    pub fn handle_input(&mut self, _now: Instant, input: &[u8]) -> Result<usize, MpaError> {
        if !matches!(
            self.state,
            State::AwaitingReply { .. } | State::AwaitingRequest { .. }
        ) {
            return Ok(0);
        }
        let mut consumed = 0;
        loop {
            match FrameRepr::parse(&self.buf) {
                Err(e) => return Err(self.frame_error(e)),
                Ok(FrameParse::Incomplete { needed }) => {
                    let rest = &input[consumed..];
                    if rest.is_empty() {
                        return Ok(consumed);
                    }
                    let n = needed.min(rest.len());
                    self.buf.extend_from_slice(&rest[..n]);
                    consumed += n;
                }
                Ok(FrameParse::Complete { .. }) => break,
            }
        }
        let buf = std::mem::take(&mut self.buf);
        let repr = match FrameRepr::parse(&buf) {
            Ok(FrameParse::Complete { repr, .. }) => repr,
            // Unreachable: the loop above only exits on a complete frame.
            _ => return Err(self.fail(LocalError::InvalidState.into())),
        };
        let result = match self.role {
            Role::Initiator => self.on_reply(&repr),
            Role::Responder => self.on_request(&repr),
        };
        result.map(|()| consumed).map_err(|e| self.fail(e))
    }

    fn frame_error(&mut self, e: FrameError) -> MpaError {
        if self.role == Role::Responder && e == FrameError::MissingEnhancedBlock {
            // siw answers a Rev 2 enhanced Request with PD_Length < 4 with R=1
            // (docs/siw.md §4.3).
            let request = RequestInfo {
                revision: 2,
                enhanced: true,
                crc: false,
                markers: false,
                reserved: 0,
                block: None,
                rtr: None,
            };
            self.queue_reject_reply(&request, &[]);
        }
        self.fail(e.into())
    }

    fn on_reply(&mut self, rep: &FrameRepr<'_>) -> Result<(), MpaError> {
        let request = match &self.state {
            State::AwaitingReply { request, .. } => *request,
            _ => return Err(LocalError::InvalidState.into()),
        };
        if rep.kind != FrameKind::Reply {
            return Err(FrameError::UnexpectedKey.into());
        }
        if rep.revision == 0 || rep.revision > 2 {
            return Err(FrameError::UnsupportedRevision(rep.revision).into());
        }
        if rep.revision > request.revision {
            return Err(FrameError::RevisionNotDowngraded {
                requested: request.revision,
                replied: rep.revision,
            }
            .into());
        }
        if rep.reject {
            self.state = State::Rejected;
            self.events.push_back(Event::Rejected {
                private_data: rep.private_data.to_vec(),
            });
            return Ok(());
        }
        if rep.markers && !self.init.accept_peer_markers {
            return Err(FrameError::MarkersRefused.into());
        }
        let cfg = &self.init;
        let (mut ird, mut ord) = (cfg.ird, cfg.ord);
        let mut rtr = None;
        let (peer_ird, peer_ord) = match rep.enhanced_block {
            Some(b) => {
                let insufficient = MpaError::InsufficientIrd {
                    local_ird: ird,
                    local_ord: ord,
                    peer_ird: b.ird,
                    peer_ord: b.ord,
                };
                if b.ord > ird {
                    if cfg.relaxed_ird_ord && b.ord <= cfg.max_ird {
                        ird = b.ord;
                    } else {
                        return Err(insufficient);
                    }
                }
                if b.ird < ord {
                    if cfg.relaxed_ird_ord {
                        ord = b.ird;
                    } else {
                        return Err(insufficient);
                    }
                }
                let offered = request.block.filter(|r| r.p2p).map(|r| r.rtr);
                match (offered, b.p2p) {
                    (Some(offered), true) => {
                        let chosen = b.rtr.single().filter(|t| offered.contains(*t));
                        match chosen {
                            // A Read RTR needs our ORD ≥ 1 and the Responder's IRD ≥ 1.
                            Some(RtrType::Read) if ord == 0 || b.ird == 0 => {
                                return Err(MpaError::NoMatchingRtr)
                            }
                            Some(t) => rtr = Some(t),
                            None => return Err(MpaError::NoMatchingRtr),
                        }
                    }
                    // A without our offer.
                    (None, true) => return Err(MpaError::NoMatchingRtr),
                    // No A in the Reply: P2P not in use. Old siw did not echo A
                    // (docs/siw.md §4.8.12), so tolerate it.
                    (_, false) => {}
                }
                (Some(b.ird), Some(b.ord))
            }
            None => (None, None),
        };
        let negotiated = Negotiated {
            role: Role::Initiator,
            revision: rep.revision,
            enhanced: rep.enhanced_block.is_some(),
            crc: request.crc || rep.crc,
            markers_tx: rep.markers,
            markers_rx: request.markers,
            ird,
            ord,
            peer_ird,
            peer_ord,
            rtr,
            peer_private_data: rep.private_data.to_vec(),
        };
        self.state = State::Established;
        self.events.push_back(Event::Established(negotiated));
        Ok(())
    }

    fn on_request(&mut self, req: &FrameRepr<'_>) -> Result<(), MpaError> {
        if req.kind != FrameKind::Request {
            return Err(FrameError::UnexpectedKey.into());
        }
        if req.revision == 0 || req.revision > 2 {
            // No Reply: close (RFC 5044 §7.1.1; siw drops it too, docs/siw.md §4.8.5).
            return Err(FrameError::UnsupportedRevision(req.revision).into());
        }
        let mut info = RequestInfo {
            revision: req.revision,
            enhanced: req.enhanced,
            crc: req.crc,
            markers: req.markers,
            reserved: req.reserved,
            block: req.enhanced_block,
            rtr: None,
        };
        if req.markers && !self.resp.accept_peer_markers {
            self.queue_reject_reply(&info, &[]);
            return Err(FrameError::MarkersRefused.into());
        }
        let reply_enhanced = self.reply_revision(&info) == 2 && info.block.is_some();
        if let Some(b) = info.block.filter(|b| b.p2p && reply_enhanced) {
            let usable = b.rtr.intersect(&self.resp.rtr);
            // Write if offered, else Read (needs Initiator ORD ≥ 1), else Send.
            info.rtr = if usable.write {
                Some(RtrType::Write)
            } else if usable.read && b.ord >= 1 {
                Some(RtrType::Read)
            } else if usable.send {
                Some(RtrType::Send)
            } else {
                None
            };
            if info.rtr.is_none() {
                self.queue_reject_reply(&info, &[]);
                return Err(MpaError::NoMatchingRtr);
            }
        }
        let block = info.block;
        self.events.push_back(Event::ConnectRequest(ConnectRequest {
            revision: info.revision,
            enhanced: block.is_some(),
            crc: info.crc,
            markers: info.markers,
            peer_ird: block.map(|b| b.ird),
            peer_ord: block.map(|b| b.ord),
            p2p: block.filter(|b| b.p2p).map(|b| b.rtr),
            rtr: info.rtr,
            private_data: req.private_data.to_vec(),
        }));
        self.state = State::AwaitingUlp {
            request: info,
            private_data: req.private_data.to_vec(),
        };
        Ok(())
    }

    fn reply_revision(&self, request: &RequestInfo) -> u8 {
        request.revision.min(self.resp.max_revision)
    }

    fn reply_repr<'p>(
        &self,
        request: &RequestInfo,
        reject: bool,
        block: Option<EnhancedBlock>,
        private_data: &'p [u8],
    ) -> FrameRepr<'p> {
        let revision = self.reply_revision(request);
        let enhanced = revision == 2 && request.enhanced;
        FrameRepr {
            kind: FrameKind::Reply,
            markers: self.resp.markers,
            // A Responder receiving C=1 answers C=1 (RFC 5044 §7.1.2).
            crc: request.crc || self.resp.crc,
            reject,
            enhanced,
            // siw quirk (echoes the Request's flag word), docs/siw.md §4.3.
            reserved: if self.resp.echo_reserved_flags {
                request.reserved
            } else {
                0
            },
            revision,
            enhanced_block: if enhanced {
                Some(block.unwrap_or_default())
            } else {
                None
            },
            private_data,
        }
    }

    fn queue_reject_reply(&mut self, request: &RequestInfo, private_data: &[u8]) {
        let block = request.block.map(|b| EnhancedBlock {
            p2p: b.p2p,
            rtr: RtrSet::NONE,
            ird: 0,
            ord: 0,
        });
        let pd = &private_data[..private_data
            .len()
            .min(MAX_PD_LENGTH_EMIT - ENHANCED_BLOCK_LEN)];
        if let Ok(frame) = self.reply_repr(request, true, block, pd).to_vec() {
            self.transmit.push_back(frame);
        }
    }

    fn check_pd(&self, request: &RequestInfo, private_data: &[u8]) -> Result<(), MpaError> {
        let enhanced = self.reply_revision(request) == 2 && request.enhanced;
        let pd_length = private_data.len() + if enhanced { ENHANCED_BLOCK_LEN } else { 0 };
        if pd_length > MAX_PD_LENGTH_EMIT {
            return Err(LocalError::PrivateDataTooLong { pd_length }.into());
        }
        Ok(())
    }

    /// Responder: accept the pending [`ConnectRequest`]; queues the Reply and the
    /// [`Event::Established`]. On a caller error (wrong state, private data too long,
    /// IRD/ORD above 0x3FFF) nothing changes.
    pub fn accept(&mut self, params: AcceptParams) -> Result<(), MpaError> {
        let (request, peer_pd) = match &self.state {
            State::AwaitingUlp {
                request,
                private_data,
            } => (*request, private_data.clone()),
            _ => return Err(LocalError::InvalidState.into()),
        };
        self.check_pd(&request, &params.private_data)?;
        let cfg = &self.resp;
        let mut ird = floor1(params.ird, cfg.siw_min_ird_ord);
        let mut ord = floor1(params.ord, cfg.siw_min_ird_ord);
        if ird > IRD_ORD_MAX || ord > IRD_ORD_MAX {
            return Err(LocalError::IrdOrdTooLarge.into());
        }
        let revision = self.reply_revision(&request);
        let enhanced = revision == 2 && request.enhanced;
        let peer = request.block.filter(|_| enhanced);
        if let Some(b) = peer {
            // Our ORD never exceeds the Initiator's IRD (RFC 6581 §3).
            ord = ord.min(b.ird);
            if b.ord > ird && cfg.relaxed_ird_ord && b.ord <= cfg.max_ird {
                ird = b.ord;
            }
            if request.rtr == Some(RtrType::Read) {
                ird = ird.max(1);
            }
        }
        let block = EnhancedBlock {
            p2p: request.rtr.is_some(),
            rtr: request.rtr.map(RtrSet::only).unwrap_or_default(),
            ird,
            ord,
        };
        let frame = self
            .reply_repr(&request, false, Some(block), &params.private_data)
            .to_vec()?;
        self.transmit.push_back(frame);
        let negotiated = Negotiated {
            role: Role::Responder,
            revision,
            enhanced,
            crc: request.crc || self.resp.crc,
            markers_tx: request.markers,
            markers_rx: self.resp.markers,
            ird,
            ord,
            peer_ird: peer.map(|b| b.ird),
            peer_ord: peer.map(|b| b.ord),
            rtr: request.rtr,
            peer_private_data: peer_pd,
        };
        self.state = State::Established;
        self.events.push_back(Event::Established(negotiated));
        Ok(())
    }

    /// Responder: reject the pending [`ConnectRequest`] with a Reply R=1 carrying
    /// `private_data`; then close TCP once the Reply is sent.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), MpaError> {
        let request = match &self.state {
            State::AwaitingUlp { request, .. } => *request,
            _ => return Err(LocalError::InvalidState.into()),
        };
        self.check_pd(&request, private_data)?;
        self.queue_reject_reply(&request, private_data);
        self.state = State::Closed;
        Ok(())
    }
}
