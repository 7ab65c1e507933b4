//! The phases of a [`Connection`](super::Connection), each carrying only the state that
//! exists in it: the MPA negotiator and the work posted before the QP exists while the
//! stream is being opened; the QP, the FPDU framing and the transmit gates once it is
//! open; what is left of an open stream (its queued Terminate may still go out, its
//! completions still drain) once it is dead.

use std::time::Instant;

use xwarp_ddp::mpa::{FpduEncoder, FpduParser, Negotiated, Negotiator};

use crate::qp::QueuePair;
use crate::verbs::{RecvWr, SendWr};
use crate::wire::Terminate;

/// Where a connection is.
pub(super) enum Phase {
    /// MPA negotiation in progress.
    Handshake(Handshake),
    /// Negotiated: FPDUs flow.
    Open(Stream),
    /// Closed or failed: nothing is read. The stream, if it was opened, is kept so that a
    /// queued Terminate is still sent and completions can be polled.
    Dead(Option<Stream>),
}

/// State that exists only while MPA negotiation is in progress.
pub(super) struct Handshake {
    /// The MPA Initiator or Responder.
    pub(super) neg: Negotiator,
    /// Send work posted before the QP exists; handed to it (after the RTR) when the
    /// stream opens.
    pub(super) pending_send: Vec<SendWr>,
    /// Receives posted before the QP exists.
    pub(super) pending_recv: Vec<RecvWr>,
}

impl Handshake {
    /// A handshake driven by `neg`, with nothing posted yet.
    pub(super) fn new(neg: Negotiator) -> Handshake {
        Handshake {
            neg,
            pending_send: Vec::new(),
            pending_recv: Vec::new(),
        }
    }
}

/// State that exists once negotiation succeeded: the QP, the FPDU framing both ways and
/// the gates on the first FPDUs.
pub(super) struct Stream {
    /// The negotiated parameters.
    pub(super) negotiated: Negotiated,
    /// The queue pair, with the negotiated IRD/ORD.
    pub(super) qp: QueuePair,
    /// Frames outbound ULPDUs.
    pub(super) encoder: FpduEncoder,
    /// Parses inbound FPDUs.
    pub(super) parser: FpduParser,
    /// The largest ULPDU we send.
    pub(super) mulpdu: usize,
    /// Responder: no FPDU may be sent before the first inbound FPDU (RFC 5044 §7.1.2);
    /// always open for the Initiator.
    pub(super) tx_gate_open: bool,
    /// Initiator: no FPDU (except a Terminate) before this instant (`first_fpdu_delay`).
    pub(super) tx_hold_until: Option<Instant>,
    /// P2P Responder: Established is reported after the RTR.
    pub(super) held_established: Option<Negotiated>,
    /// A graceful close was requested: queued work drains, then the stream dies.
    pub(super) closing: bool,
    /// The QP queued a Terminate for a protocol error: tear down once the current FPDU
    /// is complete.
    pub(super) dying: bool,
    /// The Terminate the QP queued, reported as sent once it is handed out.
    pub(super) last_terminate: Option<Terminate>,
}

impl Stream {
    /// A freshly opened stream around `qp`; the transmit gate starts open for the
    /// Initiator and closed for the Responder.
    pub(super) fn new(
        negotiated: Negotiated,
        qp: QueuePair,
        mulpdu: usize,
        tx_gate_open: bool,
    ) -> Stream {
        Stream {
            encoder: negotiated.fpdu_encoder(),
            parser: negotiated.fpdu_parser(),
            negotiated,
            qp,
            mulpdu,
            tx_gate_open,
            tx_hold_until: None,
            held_established: None,
            closing: false,
            dying: false,
            last_terminate: None,
        }
    }
}

impl Phase {
    /// The stream, if one was opened (open or dead).
    pub(super) fn stream(&self) -> Option<&Stream> {
        match self {
            Phase::Open(s) | Phase::Dead(Some(s)) => Some(s),
            Phase::Handshake(_) | Phase::Dead(None) => None,
        }
    }

    /// The stream, mutably, if one was opened (open or dead).
    pub(super) fn stream_mut(&mut self) -> Option<&mut Stream> {
        match self {
            Phase::Open(s) | Phase::Dead(Some(s)) => Some(s),
            Phase::Handshake(_) | Phase::Dead(None) => None,
        }
    }

    /// A short name for `Debug`.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Phase::Handshake(_) => "Handshake",
            Phase::Open(_) => "Open",
            Phase::Dead(_) => "Dead",
        }
    }
}
