//! What the connection manager reports and takes: [`CmEvent`] and [`ConnectParams`].

use std::time::Duration;

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

impl Default for ConnectParams {
    fn default() -> Self {
        ConnectParams {
            private_data: Vec::new(),
            timeout: Duration::from_secs(10),
        }
    }
}
