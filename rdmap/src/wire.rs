//! RDMAP wire formats (RFC 5040 §4): control byte, opcodes, the RDMA Read Request body,
//! the Terminate message and the error codes of all three Terminate layers.
//!
//! See iwarp-wire.md §3 for the layouts and §4.6 for siw's Terminate quirks.

use xwarp_ddp::segment::{DdpError, MAX_HEADER_LEN};

/// RDMAP version carried in the RV field (RFC 5040 §4.2).
pub const RDMAP_VERSION: u8 = 1;
/// Length of the RDMA Read Request body after the untagged DDP header.
pub const READ_REQUEST_LEN: usize = 28;
/// Length of the fixed Terminate Control field.
pub const TERMINATE_CONTROL_LEN: usize = 4;
/// Longest Terminate body: control + DDP Segment Length + untagged header + Read Request.
pub const MAX_TERMINATE_LEN: usize = TERMINATE_CONTROL_LEN + 2 + MAX_HEADER_LEN + READ_REQUEST_LEN;

/// Untagged queue numbers used by RDMAP (iwarp-wire.md §2.4).
pub mod qn {
    /// Send, Send with Invalidate, Send with SE, Send with SE and Invalidate.
    pub const SEND: u32 = 0;
    /// RDMA Read Request.
    pub const READ_REQUEST: u32 = 1;
    /// Terminate.
    pub const TERMINATE: u32 = 2;
}

/// RDMAP opcodes 0–7 (RFC 5040 §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send (untagged, QN 0).
    Send = 3,
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSe = 5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 6,
    /// Terminate (untagged, QN 2).
    Terminate = 7,
}

impl Opcode {
    /// Decode the 4-bit opcode; `None` for the reserved values 8–15.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Opcode::Write,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInvalidate,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInvalidate,
            7 => Opcode::Terminate,
            _ => return None,
        })
    }

    /// Whether the message uses the tagged buffer model (Write, Read Response).
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// The untagged queue a message with this opcode travels on (`None` for tagged ones).
    pub fn queue(self) -> Option<u32> {
        match self {
            Opcode::Write | Opcode::ReadResponse => None,
            Opcode::ReadRequest => Some(qn::READ_REQUEST),
            Opcode::Terminate => Some(qn::TERMINATE),
            _ => Some(qn::SEND),
        }
    }

    /// Send with Invalidate or Send with SE and Invalidate.
    pub fn is_invalidate(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }

    /// Send with SE or Send with SE and Invalidate.
    pub fn is_solicited(self) -> bool {
        matches!(self, Opcode::SendSe | Opcode::SendSeInvalidate)
    }

    /// The RDMAP control byte (RV=1, opcode) for this opcode.
    pub fn ctrl_byte(self) -> u8 {
        (RDMAP_VERSION << 6) | self as u8
    }
}

/// A bad RDMAP control byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtrlError {
    /// RV != 1.
    InvalidVersion(u8),
    /// Opcode 8–15.
    UnexpectedOpcode(u8),
}

/// Parse an RDMAP control byte (RFC 5040 §4.2). Reserved bits are not checked (siw does
/// not either, iwarp-wire.md §4.5).
pub fn parse_ctrl(byte: u8) -> Result<Opcode, CtrlError> {
    let rv = byte >> 6;
    if rv != RDMAP_VERSION {
        return Err(CtrlError::InvalidVersion(rv));
    }
    Opcode::from_u8(byte & 0x0f).ok_or(CtrlError::UnexpectedOpcode(byte & 0x0f))
}

/// RDMA Read Request body (RFC 5040 §4.4), the 28 bytes after the untagged header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadRequest {
    /// Data Sink STag (the requester's buffer).
    pub sink_stag: u32,
    /// Data Sink Tagged Offset.
    pub sink_to: u64,
    /// RDMA Read Message Size.
    pub size: u32,
    /// Data Source STag (the responder's buffer).
    pub src_stag: u32,
    /// Data Source Tagged Offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// Parse from `buf[..28]`; `None` if short.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let b = buf.get(..READ_REQUEST_LEN)?;
        Some(ReadRequest {
            sink_stag: be32(&b[0..4]),
            sink_to: be64(&b[4..12]),
            size: be32(&b[12..16]),
            src_stag: be32(&b[16..20]),
            src_to: be64(&b[20..28]),
        })
    }

    /// Emit into `buf[..28]`; `None` if short.
    pub fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        let b = buf.get_mut(..READ_REQUEST_LEN)?;
        b[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        b[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        b[20..28].copy_from_slice(&self.src_to.to_be_bytes());
        Some(READ_REQUEST_LEN)
    }

    /// The 28 wire bytes.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        self.emit(&mut b);
        b
    }
}

/// Terminate layers (RFC 5040 §4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layer {
    /// RDMAP.
    Rdmap = 0,
    /// DDP.
    Ddp = 1,
    /// The LLP (MPA).
    Llp = 2,
}

/// RDMAP (layer 0) ETypes (RFC 5040 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RdmapEtype {
    /// Local catastrophic error.
    LocalCatastrophic = 0,
    /// Remote protection error.
    RemoteProtection = 1,
    /// Remote operation error.
    RemoteOperation = 2,
}

/// RDMAP (layer 0) error codes (RFC 5040 §7, iwarp-wire.md §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RdmapErrorCode {
    /// Invalid STag.
    InvalidStag = 0x00,
    /// Base or bounds violation.
    BaseOrBounds = 0x01,
    /// Access rights violation.
    AccessRights = 0x02,
    /// STag not associated with RDMAP stream.
    StagNotAssociated = 0x03,
    /// TO wrap.
    ToWrap = 0x04,
    /// Invalid RDMAP version.
    InvalidVersion = 0x05,
    /// Unexpected OpCode.
    UnexpectedOpcode = 0x06,
    /// Catastrophic error, localized to RDMAP stream.
    CatastrophicStream = 0x07,
    /// Catastrophic error, global.
    CatastrophicGlobal = 0x08,
    /// STag cannot be invalidated.
    CannotInvalidate = 0x09,
    /// Unspecified error.
    Unspecified = 0xff,
}

impl RdmapErrorCode {
    /// Decode a code byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        use RdmapErrorCode::*;
        Some(match v {
            0x00 => InvalidStag,
            0x01 => BaseOrBounds,
            0x02 => AccessRights,
            0x03 => StagNotAssociated,
            0x04 => ToWrap,
            0x05 => InvalidVersion,
            0x06 => UnexpectedOpcode,
            0x07 => CatastrophicStream,
            0x08 => CatastrophicGlobal,
            0x09 => CannotInvalidate,
            0xff => Unspecified,
            _ => return None,
        })
    }
}

/// LLP (MPA, layer 2, EType 0) error codes (RFC 5044 §8, RFC 6581; iwarp-wire.md §1.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LlpErrorCode {
    /// TCP connection closed, terminated or lost.
    ConnectionLost = 0x01,
    /// MPA CRC error.
    CrcError = 0x02,
    /// MPA marker and ULPDU_Length mismatch.
    MarkerMismatch = 0x03,
    /// Invalid MPA Request/Reply frame.
    InvalidRequestReply = 0x04,
    /// Local catastrophic error.
    LocalCatastrophic = 0x05,
    /// Insufficient IRD resources.
    InsufficientIrd = 0x06,
    /// No matching RTR option.
    NoMatchingRtr = 0x07,
}

impl LlpErrorCode {
    /// Decode a code byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        use LlpErrorCode::*;
        Some(match v {
            0x01 => ConnectionLost,
            0x02 => CrcError,
            0x03 => MarkerMismatch,
            0x04 => InvalidRequestReply,
            0x05 => LocalCatastrophic,
            0x06 => InsufficientIrd,
            0x07 => NoMatchingRtr,
            _ => return None,
        })
    }
}

/// The (layer, EType, code) triple of a Terminate, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminateCause {
    /// Layer 0.
    Rdmap(RdmapEtype, RdmapErrorCode),
    /// Layer 1.
    Ddp(DdpError),
    /// Layer 2 (EType 0).
    Llp(LlpErrorCode),
}

impl TerminateCause {
    /// Terminate layer.
    pub fn layer(&self) -> Layer {
        match self {
            TerminateCause::Rdmap(..) => Layer::Rdmap,
            TerminateCause::Ddp(_) => Layer::Ddp,
            TerminateCause::Llp(_) => Layer::Llp,
        }
    }

    /// Terminate EType nibble.
    pub fn etype(&self) -> u8 {
        match self {
            TerminateCause::Rdmap(e, _) => *e as u8,
            TerminateCause::Ddp(e) => e.etype() as u8,
            TerminateCause::Llp(_) => 0,
        }
    }

    /// Terminate error code byte.
    pub fn code(&self) -> u8 {
        match self {
            TerminateCause::Rdmap(_, c) => *c as u8,
            TerminateCause::Ddp(e) => e.code(),
            TerminateCause::Llp(c) => *c as u8,
        }
    }

    /// Decode a raw triple; `None` if any part is undefined.
    pub fn from_raw(layer: u8, etype: u8, code: u8) -> Option<Self> {
        match layer {
            0 => {
                let et = match etype {
                    0 => RdmapEtype::LocalCatastrophic,
                    1 => RdmapEtype::RemoteProtection,
                    2 => RdmapEtype::RemoteOperation,
                    _ => return None,
                };
                Some(TerminateCause::Rdmap(et, RdmapErrorCode::from_u8(code)?))
            }
            1 => DdpError::from_etype_code(etype, code).map(TerminateCause::Ddp),
            2 if etype == 0 => LlpErrorCode::from_u8(code).map(TerminateCause::Llp),
            _ => None,
        }
    }

    /// A typical RDMAP remote-operation error.
    pub fn remote_op(code: RdmapErrorCode) -> Self {
        TerminateCause::Rdmap(RdmapEtype::RemoteOperation, code)
    }
}

/// Hdrct bits of the RFC layout (byte 2 of the Terminate Control).
pub mod hdrct {
    /// M: DDP Segment Length valid.
    pub const M: u8 = 0x80;
    /// D: terminated DDP header included.
    pub const D: u8 = 0x40;
    /// R: terminated RDMAP (Read Request) header included.
    pub const R: u8 = 0x20;
}

/// A Terminate message body (RFC 5040 §4.8) in a fixed-size buffer (no allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terminate {
    /// Raw Layer nibble.
    pub layer: u8,
    /// Raw EType nibble.
    pub etype: u8,
    /// Raw error code.
    pub code: u8,
    /// M bit: `ddp_segment_length` is valid.
    pub m: bool,
    /// DDP Segment Length of the terminated segment.
    pub ddp_segment_length: u16,
    /// Terminated DDP header (D bit), 14 or 18 bytes, as received.
    pub ddp_header: Option<TerminatedDdpHeader>,
    /// Terminated RDMAP header (R bit): the 28-byte Read Request body.
    pub rdmap_header: Option<[u8; READ_REQUEST_LEN]>,
}

/// Raw bytes of a terminated DDP header (14 or 18 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminatedDdpHeader {
    bytes: [u8; MAX_HEADER_LEN],
    len: u8,
}

impl TerminatedDdpHeader {
    /// Take the header at the start of `raw` (its length follows from the T bit);
    /// `None` if `raw` is shorter than that.
    pub fn from_bytes(raw: &[u8]) -> Option<Self> {
        let len = xwarp_ddp::segment::header_len(*raw.first()?);
        let mut bytes = [0u8; MAX_HEADER_LEN];
        bytes[..len].copy_from_slice(raw.get(..len)?);
        Some(TerminatedDdpHeader {
            bytes,
            len: len as u8,
        })
    }

    /// The header bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// Which reading of an inbound Terminate Control was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminateLayout {
    /// RFC 5040 layout: `layer<<4|etype`, Hdrct M=0x80 D=0x40 R=0x20.
    Rfc,
    /// siw's GCC-bitfield layout: `etype<<4|layer`, Hdrct M=0x01 D=0x02 R=0x04
    /// (siw quirk, iwarp-wire.md §4.6).
    Siw,
}

/// A parsed inbound Terminate with both readings of the control field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedTerminate {
    /// The RFC-layout reading (`None` if the body is inconsistent under that reading).
    pub rfc: Option<Terminate>,
    /// The siw-layout reading (`None` if inconsistent).
    pub siw: Option<Terminate>,
    /// Which reading [`ParsedTerminate::best`] returns.
    pub chosen: TerminateLayout,
}

impl ParsedTerminate {
    /// The plausible reading: the RFC one when it is consistent (body length matches the
    /// Hdrct bits) and its (layer, EType, code) is defined; else siw's if that is; else
    /// whichever reading is consistent. `None` only if the body is consistent under neither.
    pub fn best(&self) -> Option<&Terminate> {
        match self.chosen {
            TerminateLayout::Rfc => self.rfc.as_ref(),
            TerminateLayout::Siw => self.siw.as_ref(),
        }
    }
}

impl Terminate {
    /// A Terminate for `cause` with no attached headers.
    pub fn new(cause: TerminateCause) -> Self {
        Terminate {
            layer: cause.layer() as u8,
            etype: cause.etype(),
            code: cause.code(),
            m: false,
            ddp_segment_length: 0,
            ddp_header: None,
            rdmap_header: None,
        }
    }

    /// The typed cause, if the raw triple is defined.
    pub fn cause(&self) -> Option<TerminateCause> {
        TerminateCause::from_raw(self.layer, self.etype, self.code)
    }

    /// Body length on the wire.
    pub fn wire_len(&self) -> usize {
        let mut n = TERMINATE_CONTROL_LEN;
        if self.m || self.ddp_header.is_some() || self.rdmap_header.is_some() {
            n += 2;
            n += self.ddp_header.map_or(0, |h| h.len as usize);
            n += if self.rdmap_header.is_some() {
                READ_REQUEST_LEN
            } else {
                0
            };
        }
        n
    }

    /// Emit the RFC 5040 layout into `buf`; returns the length or `None` if `buf` is short.
    /// The DDP Segment Length field follows the RFC (whole terminated DDP segment), not
    /// siw's payload-length reading (iwarp-wire.md §4.6).
    pub fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        let n = self.wire_len();
        let b = buf.get_mut(..n)?;
        b[0] = (self.layer << 4) | (self.etype & 0x0f);
        b[1] = self.code;
        b[2] = if self.m { hdrct::M } else { 0 }
            | if self.ddp_header.is_some() {
                hdrct::D
            } else {
                0
            }
            | if self.rdmap_header.is_some() {
                hdrct::R
            } else {
                0
            };
        b[3] = 0;
        if n > TERMINATE_CONTROL_LEN {
            b[4..6].copy_from_slice(&self.ddp_segment_length.to_be_bytes());
            let mut off = 6;
            if let Some(h) = &self.ddp_header {
                let hb = h.as_bytes();
                b[off..off + hb.len()].copy_from_slice(hb);
                off += hb.len();
            }
            if let Some(r) = &self.rdmap_header {
                b[off..off + READ_REQUEST_LEN].copy_from_slice(r);
            }
        }
        Some(n)
    }

    fn parse_with(body: &[u8], layout: TerminateLayout) -> Option<Terminate> {
        let c = body.get(..TERMINATE_CONTROL_LEN)?;
        let (layer, etype, m, d, r, rsvd) = match layout {
            TerminateLayout::Rfc => (
                c[0] >> 4,
                c[0] & 0x0f,
                c[2] & hdrct::M != 0,
                c[2] & hdrct::D != 0,
                c[2] & hdrct::R != 0,
                (c[2] & 0x1f) != 0 || c[3] != 0,
            ),
            // siw quirk, iwarp-wire.md §4.6: GCC little-endian bitfield layout.
            TerminateLayout::Siw => (
                c[0] & 0x0f,
                c[0] >> 4,
                c[2] & 0x01 != 0,
                c[2] & 0x02 != 0,
                c[2] & 0x04 != 0,
                (c[2] & 0xf8) != 0 || c[3] != 0,
            ),
        };
        let _ = rsvd; // reserved bits are ignored on receive; only lengths decide consistency
        let mut t = Terminate {
            layer,
            etype,
            code: c[1],
            m,
            ddp_segment_length: 0,
            ddp_header: None,
            rdmap_header: None,
        };
        let rest = &body[TERMINATE_CONTROL_LEN..];
        if !(m || d || r) {
            return rest.is_empty().then_some(t);
        }
        let len = rest.get(..2)?;
        t.ddp_segment_length = u16::from_be_bytes([len[0], len[1]]);
        let mut off = 2;
        if d {
            let h = TerminatedDdpHeader::from_bytes(&rest[off..])?;
            off += h.len as usize;
            t.ddp_header = Some(h);
        }
        if r {
            let mut rr = [0u8; READ_REQUEST_LEN];
            rr.copy_from_slice(rest.get(off..off + READ_REQUEST_LEN)?);
            off += READ_REQUEST_LEN;
            t.rdmap_header = Some(rr);
        }
        (off == rest.len()).then_some(t)
    }

    /// Parse an inbound Terminate body (the bytes after the untagged DDP header) under both
    /// the RFC layout and siw's swapped layout (siw quirk, iwarp-wire.md §4.6) and pick the
    /// plausible one (see [`ParsedTerminate::best`]). Errors only if the body is shorter than
    /// the 4-byte control field.
    pub fn parse(body: &[u8]) -> Result<ParsedTerminate, TerminateParseError> {
        if body.len() < TERMINATE_CONTROL_LEN {
            return Err(TerminateParseError::Truncated);
        }
        let rfc = Self::parse_with(body, TerminateLayout::Rfc);
        let siw = Self::parse_with(body, TerminateLayout::Siw);
        let defined = |t: &Option<Terminate>| t.as_ref().is_some_and(|t| t.cause().is_some());
        let chosen = if defined(&rfc) {
            TerminateLayout::Rfc
        } else if defined(&siw) || (rfc.is_none() && siw.is_some()) {
            TerminateLayout::Siw
        } else {
            TerminateLayout::Rfc
        };
        Ok(ParsedTerminate { rfc, siw, chosen })
    }
}

/// A Terminate body too short to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminateParseError {
    /// Fewer than 4 bytes.
    Truncated,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xwarp_ddp::segment::UntaggedErrorCode;

    #[test]
    fn rfc5040_ctrl_byte_rv1_and_opcodes() {
        for op in 0..8u8 {
            let o = Opcode::from_u8(op).unwrap();
            assert_eq!(o.ctrl_byte(), 0x40 | op);
            assert_eq!(parse_ctrl(0x40 | op), Ok(o));
        }
        assert_eq!(parse_ctrl(0x48), Err(CtrlError::UnexpectedOpcode(8)));
        assert_eq!(parse_ctrl(0x83), Err(CtrlError::InvalidVersion(2)));
        assert_eq!(parse_ctrl(0x03), Err(CtrlError::InvalidVersion(0)));
    }

    #[test]
    fn rfc5040_read_request_body_wire_bytes() {
        // iwarp-wire.md §6.2 Read Request example.
        let r = ReadRequest {
            sink_stag: 0x101,
            sink_to: 0x0000_55d0_e0a0_b000,
            size: 64,
            src_stag: 0x203,
            src_to: 0x0000_559d_4c2a_1000,
        };
        let b = r.to_bytes();
        assert_eq!(
            b,
            [
                0, 0, 1, 1, 0, 0, 0x55, 0xd0, 0xe0, 0xa0, 0xb0, 0, 0, 0, 0, 0x40, 0, 0, 2, 3, 0, 0,
                0x55, 0x9d, 0x4c, 0x2a, 0x10, 0
            ]
        );
        assert_eq!(ReadRequest::parse(&b), Some(r));
        assert_eq!(ReadRequest::parse(&b[..27]), None);
    }

    #[test]
    fn rfc5040_terminate_llp_crc_rfc_layout() {
        let t = Terminate::new(TerminateCause::Llp(LlpErrorCode::CrcError));
        let mut b = [0u8; MAX_TERMINATE_LEN];
        let n = t.emit(&mut b).unwrap();
        assert_eq!(&b[..n], &[0x20, 0x02, 0x00, 0x00]);
        let p = Terminate::parse(&b[..n]).unwrap();
        assert_eq!(p.chosen, TerminateLayout::Rfc);
        assert_eq!(
            p.best().unwrap().cause(),
            Some(TerminateCause::Llp(LlpErrorCode::CrcError))
        );
    }

    #[test]
    fn siw_swapped_terminate_nibbles_are_recognised() {
        // siw quirk, iwarp-wire.md §4.6: LLP/MPA/CRC sent as 02 02 00 00. The RFC reading
        // would be RDMAP / remote operation / access rights, which is also "defined", so
        // both readings are reported and the RFC one is preferred.
        let p = Terminate::parse(&[0x02, 0x02, 0x00, 0x00]).unwrap();
        assert_eq!(
            p.siw.unwrap().cause(),
            Some(TerminateCause::Llp(LlpErrorCode::CrcError))
        );
        assert_eq!(
            p.rfc.unwrap().cause(),
            Some(TerminateCause::remote_op(RdmapErrorCode::AccessRights))
        );
        // siw DDP untagged error with M+D: byte0 = 0x21 (etype 2, layer 1), hdrct 0x03.
        let mut body = vec![0x21, 0x05, 0x03, 0x00, 0x00, 0x10];
        body.extend_from_slice(&[0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
        let p = Terminate::parse(&body).unwrap();
        assert!(
            p.rfc.is_none(),
            "RFC reading has no header bits, body too long"
        );
        assert_eq!(p.chosen, TerminateLayout::Siw);
        let t = p.best().unwrap();
        assert_eq!(
            t.cause(),
            Some(TerminateCause::Ddp(DdpError::Untagged(
                UntaggedErrorCode::MessageTooLong
            )))
        );
        assert_eq!(t.ddp_segment_length, 16);
        assert_eq!(t.ddp_header.unwrap().as_bytes(), &body[6..]);
    }

    #[test]
    fn rfc5040_terminate_with_headers_roundtrip() {
        let rr = ReadRequest {
            sink_stag: 1,
            sink_to: 2,
            size: 3,
            src_stag: 4,
            src_to: 5,
        };
        let hdr = [0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
        let mut t = Terminate::new(TerminateCause::remote_op(
            RdmapErrorCode::CatastrophicStream,
        ));
        t.m = true;
        t.ddp_segment_length = 46;
        t.ddp_header = TerminatedDdpHeader::from_bytes(&hdr);
        t.rdmap_header = Some(rr.to_bytes());
        let mut b = [0u8; MAX_TERMINATE_LEN];
        let n = t.emit(&mut b).unwrap();
        assert_eq!(n, MAX_TERMINATE_LEN);
        assert_eq!(&b[..6], &[0x02, 0x07, 0xe0, 0x00, 0x00, 46]);
        let p = Terminate::parse(&b[..n]).unwrap();
        assert_eq!(p.chosen, TerminateLayout::Rfc);
        assert_eq!(p.best(), Some(&t));
        assert_eq!(
            Terminate::parse(&b[..3]),
            Err(TerminateParseError::Truncated)
        );
        // Truncated attachments: no consistent reading, no panic.
        let p = Terminate::parse(&b[..20]).unwrap();
        assert!(p.rfc.is_none());
    }

    #[test]
    fn terminate_cause_codes_roundtrip() {
        for layer in 0..4u8 {
            for et in 0..16u8 {
                for code in 0..=255u8 {
                    if let Some(c) = TerminateCause::from_raw(layer, et, code) {
                        assert_eq!((c.layer() as u8, c.etype(), c.code()), (layer, et, code));
                    }
                }
            }
        }
    }
}
