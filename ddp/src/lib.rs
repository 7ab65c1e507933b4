//! # xwarp-ddp — MPA framing/negotiation and DDP segment headers, sans-IO
//!
//! * [`mpa`]: RFC 5044 / RFC 6581 — Request/Reply frames, the initiator and responder
//!   [`mpa::Negotiator`]s, FPDU framing (ULPDU_Length, pad, CRC32c, markers), MULPDU
//!   sizing and the streaming FPDU parser.
//! * [`segment`]: RFC 5041 — tagged and untagged DDP segment headers and the DDP error
//!   codes used in Terminate messages.
//! * [`wire`]: the header convention (checked view + `Repr` with `parse`/`emit`), the
//!   big-endian field helpers [`wire::be`] and the [`code_enum!`] macro, shared with
//!   `xwarp-rdmap`.
//!
//! Nothing here touches a socket, a clock or a thread: bytes and timestamps in, bytes and
//! events out. See `docs/` for the wire reference.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod mpa;
pub mod segment;
pub mod wire;
