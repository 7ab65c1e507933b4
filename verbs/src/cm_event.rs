//! What the connection manager reports and takes: [`CmEvent`] and [`ConnectParams`].

use std::time::Duration;

use xwarp_ddp::mpa::RtrSet;

/// Connection-manager events of a QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// The connection is up.
    Established {
        /// The peer's private data (Request or Reply).
        private_data: Vec<u8>,
        /// Negotiated IRD.
        ird: u16,
        /// Negotiated ORD.
        ord: u16,
        /// CRC in use.
        crc: bool,
        /// MPA revision in use.
        revision: u8,
    },
    /// The Responder rejected our request.
    Rejected {
        /// Its private data.
        private_data: Vec<u8>,
    },
    /// Connecting failed before MPA (refused, timed out, bad address) or during MPA.
    ConnectError(String),
    /// We detected a protocol error and sent this Terminate (layer, etype, code).
    TerminateSent {
        /// Layer nibble.
        layer: u8,
        /// EType nibble.
        etype: u8,
        /// Error code.
        code: u8,
    },
    /// The peer sent a Terminate.
    TerminateReceived {
        /// Layer nibble.
        layer: u8,
        /// EType nibble.
        etype: u8,
        /// Error code.
        code: u8,
    },
    /// A connection error (the QP is in ERROR; work is flushed).
    Error(String),
    /// The connection is closed (after a disconnect by either side or an error).
    Disconnected,
}

/// Connect parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// Private data for the MPA Request (at most 251 bytes toward siw).
    pub private_data: Vec<u8>,
    /// Give up after this long (TCP handshake plus MPA negotiation).
    pub timeout: Duration,
}

/// How often a connect the peer refused is tried again
/// ([`ConnectTuning::retry_refused`]).
pub const CONNECT_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// How [`QueuePair::connect_tuned`](crate::QueuePair::connect_tuned) connects: settings
/// for peers and programs that need more than the protocol's defaults. The default is
/// [`QueuePair::connect`](crate::QueuePair::connect)'s behaviour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectTuning {
    /// Hold the first FPDU (the RTR or the first posted work) back this long after the
    /// MPA Reply arrived (`ConnConfig::first_fpdu_delay`): a siw Responder may not read
    /// an FPDU that comes right behind its Reply (docs/siw.md §4.3). Default zero.
    pub first_fpdu_delay: Duration,
    /// Try a TCP connect that the peer refused (RST to the SYN: nothing listens yet)
    /// again every [`CONNECT_RETRY_INTERVAL`], until this long after the connect was
    /// issued; only then report the refusal. Each attempt has the full
    /// [`ConnectParams::timeout`]. Only a refusal is retried: a timeout, an MPA reject or
    /// any later failure is reported at once. For programs whose client may start
    /// before its server listens (perftest's clients, run right after their server).
    /// Default `None`: a refusal is reported at once.
    pub retry_refused: Option<Duration>,
    /// Offer exactly these peer-to-peer RTR types in the MPA Request (RFC 6581 §3.2; the
    /// Responder picks one) instead of the QP's single [`MpaAttr::p2p_rtr`](crate::MpaAttr::p2p_rtr).
    /// Needs MPA revision 2 and at least one type; otherwise the connect ends in a
    /// `ConnectError` naming the reason. For interop tests that check how a peer picks
    /// (siw: Write if offered, else Read, docs/siw.md §4.3). Default `None`.
    pub p2p_rtr_offer: Option<RtrSet>,
}

impl Default for ConnectParams {
    fn default() -> Self {
        ConnectParams {
            private_data: Vec::new(),
            timeout: Duration::from_secs(10),
        }
    }
}
