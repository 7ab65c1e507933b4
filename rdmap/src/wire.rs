//! RDMAP wire formats (RFC 5040 §4): control byte, opcodes, the RDMA Read Request body,
//! the Terminate message and the error codes of all three Terminate layers.
//!
//! See docs/ddp-rdmap.md §3 for the layouts and docs/siw.md §4.6 for siw's Terminate quirks.

use xwarp_ddp::segment::{DdpError, MAX_HEADER_LEN};
use xwarp_ddp::wire::be;

/// RDMAP version carried in the RV field (RFC 5040 §4.2).
pub const RDMAP_VERSION: u8 = 1;
/// Length of the RDMA Read Request body after the untagged DDP header.
pub const READ_REQUEST_LEN: usize = 28;
/// Length of the fixed Terminate Control field.
pub const TERMINATE_CONTROL_LEN: usize = 4;
/// Longest Terminate body: control + DDP Segment Length + untagged header + Read Request.
pub const MAX_TERMINATE_LEN: usize = TERMINATE_CONTROL_LEN + 2 + MAX_HEADER_LEN + READ_REQUEST_LEN;

/// Untagged queue numbers used by RDMAP (docs/ddp-rdmap.md §2.4).
pub mod qn {
    /// Send, Send with Invalidate, Send with SE, Send with SE and Invalidate.
    pub const SEND: u32 = 0;
    /// RDMA Read Request.
    pub const READ_REQUEST: u32 = 1;
    /// Terminate.
    pub const TERMINATE: u32 = 2;
}

xwarp_ddp::code_enum! {
    /// RDMAP opcodes 0–7 (RFC 5040 §4.2); `from_u8` is `None` for the reserved 8–15.
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
}

impl Opcode {
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
/// not either, docs/siw.md §4.5).
pub fn parse_ctrl(byte: u8) -> Result<Opcode, CtrlError> {
    let rv = byte >> 6;
    if rv != RDMAP_VERSION {
        return Err(CtrlError::InvalidVersion(rv));
    }
    Opcode::from_u8(byte & 0x0f).ok_or(CtrlError::UnexpectedOpcode(byte & 0x0f))
}

/// Byte ranges of the RDMA Read Request header.
mod rr_field {
    use core::ops::Range;
    pub const SINK_STAG: Range<usize> = 0..4;
    pub const SINK_TO: Range<usize> = 4..12;
    pub const SIZE: Range<usize> = 12..16;
    pub const SRC_STAG: Range<usize> = 16..20;
    pub const SRC_TO: Range<usize> = 20..28;
}

/// Zero-copy view of an RDMA Read Request header (RFC 5040 §4.4): the 28 bytes after the
/// untagged DDP header, one getter and setter per field.
#[derive(Debug, Clone)]
pub struct ReadRequestHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ReadRequestHeader<T> {
    /// Wraps a buffer without checking its length; getters may then panic on a short
    /// buffer, so use [`ReadRequestHeader::new_checked`] for untrusted input.
    pub fn new_unchecked(buffer: T) -> Self {
        ReadRequestHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds the 28 header bytes (bytes after them are
    /// not part of the header).
    pub fn new_checked(buffer: T) -> Option<Self> {
        let h = ReadRequestHeader { buffer };
        h.check_len().then_some(h)
    }

    /// Whether the buffer holds the 28 header bytes.
    pub fn check_len(&self) -> bool {
        self.buffer.as_ref().len() >= READ_REQUEST_LEN
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Data Sink STag.
    pub fn sink_stag(&self) -> u32 {
        be::read_u32(&self.buffer.as_ref()[rr_field::SINK_STAG])
    }

    /// Data Sink Tagged Offset.
    pub fn sink_to(&self) -> u64 {
        be::read_u64(&self.buffer.as_ref()[rr_field::SINK_TO])
    }

    /// RDMA Read Message Size.
    pub fn size(&self) -> u32 {
        be::read_u32(&self.buffer.as_ref()[rr_field::SIZE])
    }

    /// Data Source STag.
    pub fn src_stag(&self) -> u32 {
        be::read_u32(&self.buffer.as_ref()[rr_field::SRC_STAG])
    }

    /// Data Source Tagged Offset.
    pub fn src_to(&self) -> u64 {
        be::read_u64(&self.buffer.as_ref()[rr_field::SRC_TO])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReadRequestHeader<T> {
    /// Sets the Data Sink STag.
    pub fn set_sink_stag(&mut self, value: u32) {
        be::write_u32(&mut self.buffer.as_mut()[rr_field::SINK_STAG], value);
    }

    /// Sets the Data Sink Tagged Offset.
    pub fn set_sink_to(&mut self, value: u64) {
        be::write_u64(&mut self.buffer.as_mut()[rr_field::SINK_TO], value);
    }

    /// Sets the RDMA Read Message Size.
    pub fn set_size(&mut self, value: u32) {
        be::write_u32(&mut self.buffer.as_mut()[rr_field::SIZE], value);
    }

    /// Sets the Data Source STag.
    pub fn set_src_stag(&mut self, value: u32) {
        be::write_u32(&mut self.buffer.as_mut()[rr_field::SRC_STAG], value);
    }

    /// Sets the Data Source Tagged Offset.
    pub fn set_src_to(&mut self, value: u64) {
        be::write_u64(&mut self.buffer.as_mut()[rr_field::SRC_TO], value);
    }
}

/// RDMA Read Request body (RFC 5040 §4.4), the 28 bytes after the untagged header: the
/// parsed form of a [`ReadRequestHeader`].
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
        ReadRequestHeader::new_checked(buf).map(|h| Self::from_header(&h))
    }

    /// The fields of a checked view.
    pub fn from_header<T: AsRef<[u8]>>(h: &ReadRequestHeader<T>) -> Self {
        ReadRequest {
            sink_stag: h.sink_stag(),
            sink_to: h.sink_to(),
            size: h.size(),
            src_stag: h.src_stag(),
            src_to: h.src_to(),
        }
    }

    /// Emit into `buf[..28]`; `None` if short.
    pub fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        let mut h = ReadRequestHeader::new_checked(buf)?;
        h.set_sink_stag(self.sink_stag);
        h.set_sink_to(self.sink_to);
        h.set_size(self.size);
        h.set_src_stag(self.src_stag);
        h.set_src_to(self.src_to);
        Some(READ_REQUEST_LEN)
    }

    /// The 28 wire bytes.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        self.emit(&mut b);
        b
    }
}

xwarp_ddp::code_enum! {
    /// Terminate layers (RFC 5040 §4.8).
    pub enum Layer {
        /// RDMAP.
        Rdmap = 0,
        /// DDP.
        Ddp = 1,
        /// The LLP (MPA).
        Llp = 2,
    }
}

xwarp_ddp::code_enum! {
    /// RDMAP (layer 0) ETypes (RFC 5040 §7).
    pub enum RdmapEtype {
        /// Local catastrophic error.
        LocalCatastrophic = 0,
        /// Remote protection error.
        RemoteProtection = 1,
        /// Remote operation error.
        RemoteOperation = 2,
    }
}

xwarp_ddp::code_enum! {
    /// RDMAP (layer 0) error codes (RFC 5040 §7, docs/ddp-rdmap.md §3.5).
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
}

xwarp_ddp::code_enum! {
    /// LLP (MPA, layer 2, EType 0) error codes (RFC 5044 §8, RFC 6581; docs/mpa.md §1.8).
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
                let et = RdmapEtype::from_u8(etype)?;
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

/// Hdrct bits as siw sends them (GCC little-endian bitfields, the siw quirk named in
/// [`TerminateLayout::Siw`]).
mod hdrct_siw {
    pub const M: u8 = 0x01;
    pub const D: u8 = 0x02;
    pub const R: u8 = 0x04;
}

/// Byte ranges of the Terminate header.
mod term_field {
    use core::ops::Range;
    /// Layer (high nibble) and EType (low nibble) in the RFC layout.
    pub const LAYER_ETYPE: usize = 0;
    pub const ERROR_CODE: usize = 1;
    pub const HDRCT: usize = 2;
    pub const RESERVED: usize = 3;
    pub const DDP_SEGMENT_LENGTH: Range<usize> = 4..6;
    /// Start of the terminated DDP header and Read Request header, when present.
    pub const ATTACHED: usize = 6;
}

/// Zero-copy view of a Terminate header (RFC 5040 §4.8): the Terminate Control field, the
/// DDP Segment Length and the attached terminated headers, one getter and setter per
/// field. The getters read the RFC layout; siw's swapped reading is
/// [`Terminate::parse`]'s business.
#[derive(Debug, Clone)]
pub struct TerminateHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TerminateHeader<T> {
    /// Wraps a buffer without checking its length; getters may then panic on a short
    /// buffer, so use [`TerminateHeader::new_checked`] for untrusted input.
    pub fn new_unchecked(buffer: T) -> Self {
        TerminateHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds the 4-byte Terminate Control field (the
    /// optional parts are checked by their getters).
    pub fn new_checked(buffer: T) -> Result<Self, TerminateParseError> {
        let h = TerminateHeader { buffer };
        h.check_len()?;
        Ok(h)
    }

    /// Checks that the buffer holds the Terminate Control field.
    pub fn check_len(&self) -> Result<(), TerminateParseError> {
        if self.buffer.as_ref().len() < TERMINATE_CONTROL_LEN {
            return Err(TerminateParseError::Truncated);
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Terminate Layer (RFC layout: high nibble of byte 0).
    pub fn layer(&self) -> u8 {
        self.buffer.as_ref()[term_field::LAYER_ETYPE] >> 4
    }

    /// Terminate EType (RFC layout: low nibble of byte 0).
    pub fn etype(&self) -> u8 {
        self.buffer.as_ref()[term_field::LAYER_ETYPE] & 0x0f
    }

    /// Terminate error code.
    pub fn error_code(&self) -> u8 {
        self.buffer.as_ref()[term_field::ERROR_CODE]
    }

    /// The raw Hdrct byte (RFC layout bits in [`hdrct`]).
    pub fn hdrct(&self) -> u8 {
        self.buffer.as_ref()[term_field::HDRCT]
    }

    /// The reserved byte 3 of the Terminate Control field.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[term_field::RESERVED]
    }

    /// DDP Segment Length, if the buffer is long enough to hold it.
    pub fn ddp_segment_length(&self) -> Option<u16> {
        self.buffer
            .as_ref()
            .get(term_field::DDP_SEGMENT_LENGTH)
            .map(be::read_u16)
    }

    /// The bytes after the DDP Segment Length: the terminated DDP header and Read Request
    /// header, as Hdrct announces them (empty if the buffer ends earlier).
    pub fn attached(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(term_field::ATTACHED..)
            .unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TerminateHeader<T> {
    /// Sets the Layer nibble (RFC layout; the low four bits of `value`).
    pub fn set_layer(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[term_field::LAYER_ETYPE];
        *b = (value << 4) | (*b & 0x0f);
    }

    /// Sets the EType nibble (RFC layout; the low four bits of `value`).
    pub fn set_etype(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[term_field::LAYER_ETYPE];
        *b = (*b & 0xf0) | (value & 0x0f);
    }

    /// Sets the error code.
    pub fn set_error_code(&mut self, value: u8) {
        self.buffer.as_mut()[term_field::ERROR_CODE] = value;
    }

    /// Sets the raw Hdrct byte.
    pub fn set_hdrct(&mut self, value: u8) {
        self.buffer.as_mut()[term_field::HDRCT] = value;
    }

    /// Sets the reserved byte.
    pub fn set_reserved(&mut self, value: u8) {
        self.buffer.as_mut()[term_field::RESERVED] = value;
    }

    /// Sets the DDP Segment Length (the buffer must hold it).
    pub fn set_ddp_segment_length(&mut self, value: u16) {
        be::write_u16(
            &mut self.buffer.as_mut()[term_field::DDP_SEGMENT_LENGTH],
            value,
        );
    }

    /// The attached-header bytes, mutably (the buffer must reach past the DDP Segment
    /// Length).
    pub fn attached_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[term_field::ATTACHED..]
    }
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
    /// (siw quirk, docs/siw.md §4.6).
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
    /// siw's payload-length reading (docs/siw.md §4.6).
    pub fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        let n = self.wire_len();
        let mut h = TerminateHeader::new_unchecked(buf.get_mut(..n)?);
        h.set_layer(self.layer);
        h.set_etype(self.etype);
        h.set_error_code(self.code);
        let mut bits = 0;
        if self.m {
            bits |= hdrct::M;
        }
        if self.ddp_header.is_some() {
            bits |= hdrct::D;
        }
        if self.rdmap_header.is_some() {
            bits |= hdrct::R;
        }
        h.set_hdrct(bits);
        h.set_reserved(0);
        if n > TERMINATE_CONTROL_LEN {
            h.set_ddp_segment_length(self.ddp_segment_length);
            let att = h.attached_mut();
            let mut off = 0;
            if let Some(d) = &self.ddp_header {
                let hb = d.as_bytes();
                att[off..off + hb.len()].copy_from_slice(hb);
                off += hb.len();
            }
            if let Some(r) = &self.rdmap_header {
                att[off..off + READ_REQUEST_LEN].copy_from_slice(r);
            }
        }
        Some(n)
    }

    fn parse_with(body: &[u8], layout: TerminateLayout) -> Option<Terminate> {
        let h = TerminateHeader::new_checked(body).ok()?;
        let bits = h.hdrct();
        // Reserved bits are ignored on receive; only lengths decide consistency.
        let (layer, etype, m, d, r) = match layout {
            TerminateLayout::Rfc => (
                h.layer(),
                h.etype(),
                bits & hdrct::M != 0,
                bits & hdrct::D != 0,
                bits & hdrct::R != 0,
            ),
            // siw quirk, docs/siw.md §4.6: GCC little-endian bitfield layout.
            TerminateLayout::Siw => (
                h.etype(),
                h.layer(),
                bits & hdrct_siw::M != 0,
                bits & hdrct_siw::D != 0,
                bits & hdrct_siw::R != 0,
            ),
        };
        let mut t = Terminate {
            layer,
            etype,
            code: h.error_code(),
            m,
            ddp_segment_length: 0,
            ddp_header: None,
            rdmap_header: None,
        };
        if !(m || d || r) {
            return (body.len() == TERMINATE_CONTROL_LEN).then_some(t);
        }
        t.ddp_segment_length = h.ddp_segment_length()?;
        let att = h.attached();
        let mut off = 0;
        if d {
            let dh = TerminatedDdpHeader::from_bytes(att)?;
            off += dh.len as usize;
            t.ddp_header = Some(dh);
        }
        if r {
            let mut rr = [0u8; READ_REQUEST_LEN];
            rr.copy_from_slice(att.get(off..off + READ_REQUEST_LEN)?);
            off += READ_REQUEST_LEN;
            t.rdmap_header = Some(rr);
        }
        (off == att.len()).then_some(t)
    }

    /// Parse an inbound Terminate body (the bytes after the untagged DDP header) under both
    /// the RFC layout and siw's swapped layout (siw quirk, docs/siw.md §4.6) and pick the
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
        // docs/testing.md §6.2 Read Request example.
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
        // siw quirk, docs/siw.md §4.6: LLP/MPA/CRC sent as 02 02 00 00. The RFC reading
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

    #[test]
    fn rfc5040_read_request_view_reads_and_writes_every_field() {
        // The Read Request of rfc5040_read_request_body_wire_bytes, then one byte past the header.
        let bytes = [
            0, 0, 1, 1, 0, 0, 0x55, 0xd0, 0xe0, 0xa0, 0xb0, 0, 0, 0, 0, 0x40, 0, 0, 2, 3, 0, 0,
            0x55, 0x9d, 0x4c, 0x2a, 0x10, 0, 0xee,
        ];
        let h = ReadRequestHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!((h.sink_stag(), h.sink_to()), (0x101, 0x0000_55d0_e0a0_b000));
        assert_eq!(h.size(), 64);
        assert_eq!((h.src_stag(), h.src_to()), (0x203, 0x0000_559d_4c2a_1000));
        assert!(ReadRequestHeader::new_checked(&bytes[..27]).is_none());
        let mut out = [0xeeu8; 29];
        let mut w = ReadRequestHeader::new_unchecked(&mut out[..]);
        w.set_sink_stag(0x101);
        w.set_sink_to(0x0000_55d0_e0a0_b000);
        w.set_size(64);
        w.set_src_stag(0x203);
        w.set_src_to(0x0000_559d_4c2a_1000);
        assert_eq!(out, bytes);
        assert_eq!(
            ReadRequest::from_header(&h),
            ReadRequest::parse(&bytes).unwrap()
        );
        assert_eq!(
            ReadRequest::parse(&bytes).unwrap().emit(&mut [0u8; 27]),
            None
        );
    }

    #[test]
    fn rfc5040_terminate_view_reads_and_writes_every_field() {
        // RDMAP / remote operation / catastrophic stream with M+D and an untagged DDP
        // header attached.
        let bytes = [
            0x02, 0x07, 0xc0, 0x00, 0x00, 0x2e, 0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0,
            0, 0, 0,
        ];
        let h = TerminateHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!((h.layer(), h.etype(), h.error_code()), (0, 2, 0x07));
        assert_eq!((h.hdrct(), h.reserved()), (hdrct::M | hdrct::D, 0));
        assert_eq!(h.ddp_segment_length(), Some(46));
        assert_eq!(h.attached(), &bytes[6..]);
        let short = TerminateHeader::new_checked(&bytes[..4]).unwrap();
        assert_eq!(
            (short.ddp_segment_length(), short.attached()),
            (None, &[][..])
        );
        assert_eq!(
            TerminateHeader::new_checked(&bytes[..3]).unwrap_err(),
            TerminateParseError::Truncated
        );
        let mut out = [0xffu8; 24];
        let mut w = TerminateHeader::new_unchecked(&mut out[..]);
        w.set_layer(0);
        w.set_etype(2);
        w.set_error_code(0x07);
        w.set_hdrct(0xc0);
        w.set_reserved(0);
        w.set_ddp_segment_length(46);
        w.attached_mut().copy_from_slice(&bytes[6..]);
        assert_eq!(out, bytes);
        // The LLP CRC error (layer 2 in the high nibble, code 0x02).
        let mut llp = [0u8; 4];
        let mut w = TerminateHeader::new_unchecked(&mut llp[..]);
        w.set_etype(0);
        w.set_layer(2);
        w.set_error_code(0x02);
        assert_eq!(llp, [0x20, 0x02, 0x00, 0x00]);
    }

    #[test]
    fn rfc5040_code_enums_decode_only_defined_values() {
        assert_eq!(Opcode::from_u8(7), Some(Opcode::Terminate));
        assert_eq!(Opcode::from_u8(8), None);
        assert_eq!(RdmapEtype::from_u8(2), Some(RdmapEtype::RemoteOperation));
        assert_eq!(RdmapEtype::from_u8(3), None);
        assert_eq!(
            RdmapErrorCode::from_u8(0xff),
            Some(RdmapErrorCode::Unspecified)
        );
        assert_eq!(RdmapErrorCode::from_u8(0x0a), None);
        assert_eq!(
            LlpErrorCode::from_u8(0x07),
            Some(LlpErrorCode::NoMatchingRtr)
        );
        assert_eq!(LlpErrorCode::from_u8(0x00), None);
        assert_eq!(Layer::from_u8(2), Some(Layer::Llp));
        assert_eq!(u8::from(Layer::Ddp), 1);
    }
}
