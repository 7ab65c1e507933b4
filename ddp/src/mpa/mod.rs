//! MPA — Marker PDU Aligned framing (RFC 5044) with enhanced connection setup (RFC 6581).
//!
//! * [`crc`]: CRC32c, one-shot and incremental; trailer stored little-endian.
//! * [`frame`]: Request/Reply frames ([`Frame`] view, [`FrameRepr`] parse/emit).
//! * [`negotiator`]: the sans-IO [`Negotiator`] for Initiator and Responder.
//! * [`fpdu`]: [`FpduEncoder`], pad and [`mulpdu`] sizing.
//! * [`parser`]: the streaming [`FpduParser`].
//! * [`records`]: [`RecordSplitter`], where the records of an outgoing stream end (for
//!   FPDU-aligned segmentation).
//! * [`error`]: [`MpaError`] and its LLP Terminate codes (docs/mpa.md §1.8).
//!
//! The frame parser, the negotiator and the FPDU parser take arbitrary bytes and never
//! panic, so a fuzz harness can drive them directly.

pub mod crc;
pub mod error;
pub mod fpdu;
pub mod frame;
pub mod negotiator;
pub mod parser;
pub mod records;

pub use error::{llp_code, FrameError, LocalError, MpaError, TerminateCode};
pub use fpdu::{mulpdu, pad_len, FpduEncoder};
pub use frame::{EnhancedBlock, Frame, FrameKind, FrameParse, FrameRepr, RtrSet, RtrType};
pub use negotiator::{
    AcceptParams, ConnectRequest, Event, InitiatorConfig, Negotiated, Negotiator, ResponderConfig,
    Role,
};
pub use parser::{FpduEvent, FpduHeader, FpduParser};
pub use records::RecordSplitter;
