//! MPA errors as values, each mapping to the Terminate code that reports it
//! (docs/mpa.md §1.8; RFC 5044 §8, RFC 6581 §5).

use core::fmt;

/// LLP (MPA) error codes carried in a Terminate message, Layer 2 (LLP), EType 0
/// (docs/mpa.md §1.8).
pub mod llp_code {
    /// TCP connection closed, terminated or lost.
    pub const CONNECTION_LOST: u8 = 0x01;
    /// MPA CRC error.
    pub const CRC_ERROR: u8 = 0x02;
    /// MPA marker and ULPDU_Length field mismatch.
    pub const MARKER_MISMATCH: u8 = 0x03;
    /// Invalid MPA Request or Reply frame.
    pub const INVALID_FRAME: u8 = 0x04;
    /// Local catastrophic error (RFC 6581).
    pub const LOCAL_CATASTROPHIC: u8 = 0x05;
    /// Insufficient IRD resources (RFC 6581).
    pub const INSUFFICIENT_IRD: u8 = 0x06;
    /// No matching RTR option (RFC 6581).
    pub const NO_MATCHING_RTR: u8 = 0x07;
}

/// Layer, error type and code of the Terminate message that reports an error
/// (RFC 5040 §7.2 / docs/mpa.md §1.8, docs/ddp-rdmap.md §2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateCode {
    /// Layer: 0 = RDMAP, 1 = DDP, 2 = LLP (MPA).
    pub layer: u8,
    /// Error type within the layer (0 for LLP errors).
    pub etype: u8,
    /// Error code.
    pub code: u8,
}

/// Why a Request or Reply frame is invalid (all map to LLP code 0x04).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameError {
    /// The first 16 bytes are neither "MPA ID Req Frame" nor "MPA ID Rep Frame".
    BadKey,
    /// A Request arrived where a Reply was expected, or the other way round.
    UnexpectedKey,
    /// The buffer is shorter than the frame it claims to hold (zero-copy view only).
    Truncated,
    /// PD_Length above the RFC 5044 maximum of 512 on receive.
    PdLengthTooLong(u16),
    /// Rev 2 with the enhanced flag but PD_Length < 4: the IRD/ORD block is missing.
    MissingEnhancedBlock,
    /// A revision we cannot interoperate with (RFC 5044: close the connection).
    UnsupportedRevision(u8),
    /// A Reply whose Rev is higher than the Request's.
    RevisionNotDowngraded {
        /// Rev of our Request.
        requested: u8,
        /// Rev of the peer's Reply.
        replied: u8,
    },
    /// The peer requires markers and markers are disabled locally.
    MarkersRefused,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadKey => f.write_str("bad MPA key"),
            FrameError::UnexpectedKey => f.write_str("unexpected frame kind (Request vs Reply)"),
            FrameError::Truncated => f.write_str("frame truncated"),
            FrameError::PdLengthTooLong(n) => write!(f, "PD_Length {n} above 512"),
            FrameError::MissingEnhancedBlock => {
                f.write_str("enhanced flag with Rev 2 but PD_Length < 4")
            }
            FrameError::UnsupportedRevision(r) => write!(f, "unsupported MPA revision {r}"),
            FrameError::RevisionNotDowngraded { requested, replied } => {
                write!(f, "Reply Rev {replied} above Request Rev {requested}")
            }
            FrameError::MarkersRefused => f.write_str("peer requires markers; disabled locally"),
        }
    }
}

/// Mistakes by the local caller (not the network); reported as LLP 0x05 if ever sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocalError {
    /// Private data would make PD_Length exceed the 256-byte emit limit (docs/siw.md §4.3).
    PrivateDataTooLong {
        /// PD_Length that would have been emitted (incl. the 4-byte v2 block).
        pd_length: usize,
    },
    /// IRD or ORD above the 14-bit maximum 0x3FFF.
    IrdOrdTooLarge,
    /// The enhanced block is present iff Rev = 2 and the enhanced flag is set.
    InconsistentEnhancedBlock,
    /// The output buffer cannot hold the frame or FPDU.
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// A ULPDU longer than 65535 bytes cannot be framed.
    UlpduTooLong(usize),
    /// With markers on, an FPDU so long that a FPDUPTR would not fit 16 bits.
    FpduTooLongForMarkers,
    /// The call is not valid in the negotiator's current state.
    InvalidState,
    /// An invalid configuration value.
    InvalidConfig(&'static str),
}

impl fmt::Display for LocalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalError::PrivateDataTooLong { pd_length } => {
                write!(f, "PD_Length {pd_length} above the 256-byte limit")
            }
            LocalError::IrdOrdTooLarge => f.write_str("IRD/ORD above 0x3FFF"),
            LocalError::InconsistentEnhancedBlock => {
                f.write_str("enhanced block present iff Rev 2 and enhanced flag")
            }
            LocalError::BufferTooSmall { needed, available } => {
                write!(f, "buffer too small: need {needed}, have {available}")
            }
            LocalError::UlpduTooLong(n) => write!(f, "ULPDU of {n} bytes above 65535"),
            LocalError::FpduTooLongForMarkers => f.write_str("FPDU too long for a 16-bit FPDUPTR"),
            LocalError::InvalidState => f.write_str("call not valid in this state"),
            LocalError::InvalidConfig(what) => write!(f, "invalid configuration: {what}"),
        }
    }
}

/// An MPA error. Errors caused by the peer map to the LLP Terminate codes of
/// docs/mpa.md §1.8 ([`MpaError::llp_error_code`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MpaError {
    /// The peer did not answer in time (Request or Reply timeout); the connection is lost.
    Timeout,
    /// CRC32c of a received FPDU does not match its CRC field.
    CrcMismatch {
        /// CRC computed over the received bytes.
        computed: u32,
        /// CRC value carried by the FPDU (decoded little-endian).
        received: u32,
    },
    /// A received marker's FPDUPTR does not point at the current FPDU.
    MarkerMismatch {
        /// FPDUPTR value expected from our framing.
        expected: u16,
        /// FPDUPTR value found.
        found: u16,
    },
    /// An invalid Request/Reply frame.
    InvalidFrame(FrameError),
    /// ULPDU_Length shorter than the DDP header its first byte announces (14 or 18).
    UlpduTooShort {
        /// ULPDU_Length received.
        ulpdu_len: u16,
        /// DDP header length required.
        header_len: usize,
    },
    /// The IRD/ORD values cannot be reconciled (RFC 6581, LLP 0x06).
    InsufficientIrd {
        /// Our IRD (inbound Read depth).
        local_ird: u16,
        /// Our ORD (outbound Read depth).
        local_ord: u16,
        /// Peer IRD.
        peer_ird: u16,
        /// Peer ORD.
        peer_ord: u16,
    },
    /// P2P was requested but no offered RTR type is usable (RFC 6581, LLP 0x07).
    NoMatchingRtr,
    /// A local caller or configuration error.
    Local(LocalError),
}

impl MpaError {
    /// The LLP (MPA) error code of docs/mpa.md §1.8 for this error, or `None` for
    /// [`MpaError::UlpduTooShort`], which is a DDP-layer error (see [`Self::terminate_code`]).
    pub fn llp_error_code(&self) -> Option<u8> {
        match self {
            MpaError::Timeout => Some(llp_code::CONNECTION_LOST),
            MpaError::CrcMismatch { .. } => Some(llp_code::CRC_ERROR),
            MpaError::MarkerMismatch { .. } => Some(llp_code::MARKER_MISMATCH),
            MpaError::InvalidFrame(_) => Some(llp_code::INVALID_FRAME),
            MpaError::UlpduTooShort { .. } => None,
            MpaError::InsufficientIrd { .. } => Some(llp_code::INSUFFICIENT_IRD),
            MpaError::NoMatchingRtr => Some(llp_code::NO_MATCHING_RTR),
            MpaError::Local(_) => Some(llp_code::LOCAL_CATASTROPHIC),
        }
    }

    /// Layer/EType/code for a Terminate reporting this error. LLP errors are layer 2,
    /// EType 0; a too-short ULPDU is reported as a DDP catastrophic error (layer 1, 0, 0),
    /// because the DDP segment itself is malformed (RFC 5041 §7.2).
    pub fn terminate_code(&self) -> TerminateCode {
        match self.llp_error_code() {
            Some(code) => TerminateCode {
                layer: 2,
                etype: 0,
                code,
            },
            None => TerminateCode {
                layer: 1,
                etype: 0,
                code: 0,
            },
        }
    }
}

impl fmt::Display for MpaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MpaError::Timeout => f.write_str("MPA negotiation timed out"),
            MpaError::CrcMismatch { computed, received } => {
                write!(f, "MPA CRC mismatch: computed {computed:#010x}, received {received:#010x}")
            }
            MpaError::MarkerMismatch { expected, found } => {
                write!(f, "MPA marker FPDUPTR {found} where {expected} expected")
            }
            MpaError::InvalidFrame(e) => write!(f, "invalid MPA Request/Reply: {e}"),
            MpaError::UlpduTooShort { ulpdu_len, header_len } => write!(
                f,
                "ULPDU_Length {ulpdu_len} shorter than the {header_len}-byte DDP header"
            ),
            MpaError::InsufficientIrd { local_ird, local_ord, peer_ird, peer_ord } => write!(
                f,
                "insufficient IRD: local IRD {local_ird} ORD {local_ord}, peer IRD {peer_ird} ORD {peer_ord}"
            ),
            MpaError::NoMatchingRtr => f.write_str("no matching RTR option"),
            MpaError::Local(e) => write!(f, "local error: {e}"),
        }
    }
}

impl std::error::Error for MpaError {}

impl From<FrameError> for MpaError {
    fn from(e: FrameError) -> Self {
        MpaError::InvalidFrame(e)
    }
}

impl From<LocalError> for MpaError {
    fn from(e: LocalError) -> Self {
        MpaError::Local(e)
    }
}
