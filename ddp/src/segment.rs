//! DDP segment headers (RFC 5041 §4) and the DDP error codes used in Terminate
//! messages (RFC 5041 §7.2, Terminate layer 1).
//!
//! A DDP segment is a DDP header followed by payload; over MPA each segment is one
//! ULPDU. The tagged header is 14 bytes, the untagged header 18 bytes
//! (docs/ddp-rdmap.md §2.2, §2.3). All fields are big-endian.
//!
//! The convention of [`crate::wire`]: [`Packet`] is the zero-copy view (one getter and
//! setter per field), [`TaggedHeader`], [`UntaggedHeader`] and [`SegmentHeader`] are the
//! parsed forms with `parse` and `emit`.

use crate::wire::be;

/// The only DDP version defined (RFC 5041 §4.1, DV field).
pub const DDP_VERSION: u8 = 1;
/// Length of a tagged DDP header (control, RsvdULP, STag, TO).
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length of an untagged DDP header (control, RsvdULP\[5\], QN, MSN, MO).
pub const UNTAGGED_HEADER_LEN: usize = 18;
/// Longest DDP header.
pub const MAX_HEADER_LEN: usize = UNTAGGED_HEADER_LEN;

/// DDP control byte: T (tagged buffer model).
pub const FLAG_TAGGED: u8 = 0x80;
/// DDP control byte: L (last segment of the DDP message).
pub const FLAG_LAST: u8 = 0x40;
/// DDP control byte: DV mask (DDP version).
pub const MASK_VERSION: u8 = 0x03;

/// Length of the DDP header that starts with DDP control byte `first_byte`
/// (14 if the T bit is set, else 18).
pub fn header_len(first_byte: u8) -> usize {
    if first_byte & FLAG_TAGGED != 0 {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

/// Why a DDP header could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentError {
    /// Fewer bytes than the header needs.
    Truncated,
    /// DV != 1 (RFC 5041 §7.2: tagged or untagged "Invalid DDP version").
    InvalidVersion {
        /// Whether the T bit was set, which selects the Terminate EType.
        tagged: bool,
        /// The version found.
        version: u8,
    },
}

impl SegmentError {
    /// The DDP Terminate error matching this parse failure, if there is one.
    pub fn ddp_error(&self) -> Option<DdpError> {
        match *self {
            SegmentError::Truncated => None,
            SegmentError::InvalidVersion { tagged: true, .. } => {
                Some(DdpError::Tagged(TaggedErrorCode::InvalidDdpVersion))
            }
            SegmentError::InvalidVersion { tagged: false, .. } => {
                Some(DdpError::Untagged(UntaggedErrorCode::InvalidDdpVersion))
            }
        }
    }
}

impl core::fmt::Display for SegmentError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SegmentError::Truncated => write!(f, "truncated DDP header"),
            SegmentError::InvalidVersion { version, .. } => {
                write!(f, "invalid DDP version {version}")
            }
        }
    }
}

impl std::error::Error for SegmentError {}

mod field {
    use core::ops::Range;
    /// Control byte: T, L, Rsvd, DV.
    pub const CTRL: usize = 0;
    /// First RsvdULP byte (RDMAP control).
    pub const RSVD_ULP: usize = 1;
    /// Tagged: Data Sink STag.
    pub const STAG: Range<usize> = 2..6;
    /// Tagged: Data Sink Tagged Offset.
    pub const TO: Range<usize> = 6..14;
    /// Untagged: RsvdULP bytes 1..5 (RDMAP's Invalidate STag).
    pub const RSVD_ULP_EXT: Range<usize> = 2..6;
    /// Untagged: queue number.
    pub const QN: Range<usize> = 6..10;
    /// Untagged: message sequence number.
    pub const MSN: Range<usize> = 10..14;
    /// Untagged: message offset.
    pub const MO: Range<usize> = 14..18;
}

/// A zero-copy view of a DDP segment (header + payload) in a buffer: one getter and one
/// setter per header field. Tagged-only fields (`stag`, `to`) and untagged-only fields
/// (`qn`, `msn`, `mo`, `rsvd_ulp_ext`) read as `None` for the other buffer model, and
/// their setters leave a header of the other model unchanged; set the T bit first.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap `buffer` without checks (getters may panic on short buffers; prefer
    /// [`Packet::new_checked`]).
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wrap `buffer`, checking that it holds the whole header its T bit announces.
    /// The DDP version is not checked here (see [`SegmentHeader::parse`]).
    pub fn new_checked(buffer: T) -> Result<Self, SegmentError> {
        let p = Packet { buffer };
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the whole header its T bit announces.
    pub fn check_len(&self) -> Result<(), SegmentError> {
        let b = self.buffer.as_ref();
        let first = *b.first().ok_or(SegmentError::Truncated)?;
        if b.len() < header_len(first) {
            return Err(SegmentError::Truncated);
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// T bit.
    pub fn tagged(&self) -> bool {
        self.b()[field::CTRL] & FLAG_TAGGED != 0
    }

    /// L bit.
    pub fn last(&self) -> bool {
        self.b()[field::CTRL] & FLAG_LAST != 0
    }

    /// DV field.
    pub fn version(&self) -> u8 {
        self.b()[field::CTRL] & MASK_VERSION
    }

    /// First RsvdULP byte (RDMAP control).
    pub fn rsvd_ulp(&self) -> u8 {
        self.b()[field::RSVD_ULP]
    }

    /// Header length (14 or 18).
    pub fn header_len(&self) -> usize {
        header_len(self.b()[field::CTRL])
    }

    /// STag (tagged only).
    pub fn stag(&self) -> Option<u32> {
        self.tagged().then(|| be::read_u32(&self.b()[field::STAG]))
    }

    /// Tagged offset (tagged only).
    pub fn to(&self) -> Option<u64> {
        self.tagged().then(|| be::read_u64(&self.b()[field::TO]))
    }

    /// RsvdULP bytes 1..5 (untagged only).
    pub fn rsvd_ulp_ext(&self) -> Option<u32> {
        (!self.tagged()).then(|| be::read_u32(&self.b()[field::RSVD_ULP_EXT]))
    }

    /// QN (untagged only).
    pub fn qn(&self) -> Option<u32> {
        (!self.tagged()).then(|| be::read_u32(&self.b()[field::QN]))
    }

    /// MSN (untagged only).
    pub fn msn(&self) -> Option<u32> {
        (!self.tagged()).then(|| be::read_u32(&self.b()[field::MSN]))
    }

    /// MO (untagged only).
    pub fn mo(&self) -> Option<u32> {
        (!self.tagged()).then(|| be::read_u32(&self.b()[field::MO]))
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Mutable payload bytes.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let h = self.header_len();
        &mut self.buffer.as_mut()[h..]
    }

    fn set_ctrl_bit(&mut self, bit: u8, on: bool) {
        let b = &mut self.buffer.as_mut()[field::CTRL];
        *b = (*b & !bit) | if on { bit } else { 0 };
    }

    /// Set or clear the T bit (which selects the header layout and length).
    pub fn set_tagged(&mut self, tagged: bool) {
        self.set_ctrl_bit(FLAG_TAGGED, tagged);
    }

    /// Set or clear the L bit.
    pub fn set_last(&mut self, last: bool) {
        self.set_ctrl_bit(FLAG_LAST, last);
    }

    /// Set the DV field (the low two bits of `version`).
    pub fn set_version(&mut self, version: u8) {
        let b = &mut self.buffer.as_mut()[field::CTRL];
        *b = (*b & !MASK_VERSION) | (version & MASK_VERSION);
    }

    /// Set the first RsvdULP byte (RDMAP control).
    pub fn set_rsvd_ulp(&mut self, value: u8) {
        self.buffer.as_mut()[field::RSVD_ULP] = value;
    }

    /// Set the STag (tagged only; no effect on an untagged header).
    pub fn set_stag(&mut self, value: u32) {
        if self.tagged() {
            be::write_u32(&mut self.buffer.as_mut()[field::STAG], value);
        }
    }

    /// Set the tagged offset (tagged only; no effect on an untagged header).
    pub fn set_to(&mut self, value: u64) {
        if self.tagged() {
            be::write_u64(&mut self.buffer.as_mut()[field::TO], value);
        }
    }

    /// Set RsvdULP bytes 1..5 (untagged only; no effect on a tagged header).
    pub fn set_rsvd_ulp_ext(&mut self, value: u32) {
        if !self.tagged() {
            be::write_u32(&mut self.buffer.as_mut()[field::RSVD_ULP_EXT], value);
        }
    }

    /// Set the QN (untagged only; no effect on a tagged header).
    pub fn set_qn(&mut self, value: u32) {
        if !self.tagged() {
            be::write_u32(&mut self.buffer.as_mut()[field::QN], value);
        }
    }

    /// Set the MSN (untagged only; no effect on a tagged header).
    pub fn set_msn(&mut self, value: u32) {
        if !self.tagged() {
            be::write_u32(&mut self.buffer.as_mut()[field::MSN], value);
        }
    }

    /// Set the MO (untagged only; no effect on a tagged header).
    pub fn set_mo(&mut self, value: u32) {
        if !self.tagged() {
            be::write_u32(&mut self.buffer.as_mut()[field::MO], value);
        }
    }
}

/// Tagged DDP header (RFC 5041 §4.2): T=1. The parsed form of a tagged [`Packet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaggedHeader {
    /// L: last segment of the message.
    pub last: bool,
    /// RsvdULP byte; RDMAP puts its control byte here.
    pub rsvd_ulp: u8,
    /// Data sink steering tag.
    pub stag: u32,
    /// Tagged offset of the first payload byte.
    pub to: u64,
}

impl TaggedHeader {
    /// Parse a tagged header from the first 14 bytes of `buf`, checking DV. The T bit
    /// is not looked at: the bytes are read as a tagged header (use
    /// [`SegmentHeader::parse`] to select the model by the T bit).
    pub fn parse(buf: &[u8]) -> Result<Self, SegmentError> {
        let b = buf
            .get(..TAGGED_HEADER_LEN)
            .ok_or(SegmentError::Truncated)?;
        check_version(b[field::CTRL])?;
        // Read as tagged whatever the T bit says: a copy with T set.
        let mut h = [0u8; TAGGED_HEADER_LEN];
        h.copy_from_slice(b);
        let mut p = Packet::new_unchecked(&mut h[..]);
        p.set_tagged(true);
        Ok(Self::from_fields(&p))
    }

    fn from_fields<T: AsRef<[u8]>>(p: &Packet<T>) -> Self {
        TaggedHeader {
            last: p.last(),
            rsvd_ulp: p.rsvd_ulp(),
            stag: p.stag().unwrap_or(0),
            to: p.to().unwrap_or(0),
        }
    }

    /// Write the 14-byte header into `buf[..14]`; returns 14, or `None` if `buf` is short.
    pub fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        let b = buf.get_mut(..TAGGED_HEADER_LEN)?;
        b[field::CTRL] = 0;
        let mut p = Packet::new_unchecked(b);
        p.set_tagged(true);
        p.set_last(self.last);
        p.set_version(DDP_VERSION);
        p.set_rsvd_ulp(self.rsvd_ulp);
        p.set_stag(self.stag);
        p.set_to(self.to);
        Some(TAGGED_HEADER_LEN)
    }
}

/// Untagged DDP header (RFC 5041 §4.3): T=0. The parsed form of an untagged [`Packet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UntaggedHeader {
    /// L: last segment of the message.
    pub last: bool,
    /// First RsvdULP byte; RDMAP puts its control byte here.
    pub rsvd_ulp: u8,
    /// RsvdULP bytes 1..5; RDMAP's Invalidate STag, or 0.
    pub rsvd_ulp_ext: u32,
    /// Queue number.
    pub qn: u32,
    /// Message sequence number (first message on each queue is 1).
    pub msn: u32,
    /// Message offset of the first payload byte.
    pub mo: u32,
}

impl UntaggedHeader {
    /// Parse an untagged header from the first 18 bytes of `buf`, checking DV. The T bit
    /// is not looked at: the bytes are read as an untagged header (use
    /// [`SegmentHeader::parse`] to select the model by the T bit).
    pub fn parse(buf: &[u8]) -> Result<Self, SegmentError> {
        let b = buf
            .get(..UNTAGGED_HEADER_LEN)
            .ok_or(SegmentError::Truncated)?;
        check_version(b[field::CTRL])?;
        // Read as untagged whatever the T bit says: a copy with T clear.
        let mut h = [0u8; UNTAGGED_HEADER_LEN];
        h.copy_from_slice(b);
        let mut p = Packet::new_unchecked(&mut h[..]);
        p.set_tagged(false);
        Ok(Self::from_fields(&p))
    }

    fn from_fields<T: AsRef<[u8]>>(p: &Packet<T>) -> Self {
        UntaggedHeader {
            last: p.last(),
            rsvd_ulp: p.rsvd_ulp(),
            rsvd_ulp_ext: p.rsvd_ulp_ext().unwrap_or(0),
            qn: p.qn().unwrap_or(0),
            msn: p.msn().unwrap_or(0),
            mo: p.mo().unwrap_or(0),
        }
    }

    /// Write the 18-byte header into `buf[..18]`; returns 18, or `None` if `buf` is short.
    pub fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        let b = buf.get_mut(..UNTAGGED_HEADER_LEN)?;
        b[field::CTRL] = 0;
        let mut p = Packet::new_unchecked(b);
        p.set_last(self.last);
        p.set_version(DDP_VERSION);
        p.set_rsvd_ulp(self.rsvd_ulp);
        p.set_rsvd_ulp_ext(self.rsvd_ulp_ext);
        p.set_qn(self.qn);
        p.set_msn(self.msn);
        p.set_mo(self.mo);
        Some(UNTAGGED_HEADER_LEN)
    }
}

/// Either DDP header: the parsed form of a [`Packet`]'s header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentHeader {
    /// T=1.
    Tagged(TaggedHeader),
    /// T=0.
    Untagged(UntaggedHeader),
}

impl SegmentHeader {
    /// Parse whichever header `buf` starts with (selected by the T bit).
    pub fn parse(buf: &[u8]) -> Result<Self, SegmentError> {
        Self::from_packet(&Packet::new_checked(buf)?)
    }

    /// The header of a checked [`Packet`], checking DV.
    pub fn from_packet<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Self, SegmentError> {
        check_version(p.b()[field::CTRL])?;
        Ok(if p.tagged() {
            SegmentHeader::Tagged(TaggedHeader::from_fields(p))
        } else {
            SegmentHeader::Untagged(UntaggedHeader::from_fields(p))
        })
    }

    /// Emit into `buf`; returns the header length or `None` if `buf` is short.
    pub fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        match self {
            SegmentHeader::Tagged(h) => h.emit(buf),
            SegmentHeader::Untagged(h) => h.emit(buf),
        }
    }

    /// Header length in bytes (14 or 18).
    pub fn len(&self) -> usize {
        match self {
            SegmentHeader::Tagged(_) => TAGGED_HEADER_LEN,
            SegmentHeader::Untagged(_) => UNTAGGED_HEADER_LEN,
        }
    }

    /// Always false: a header is never empty (present for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The L bit.
    pub fn last(&self) -> bool {
        match self {
            SegmentHeader::Tagged(h) => h.last,
            SegmentHeader::Untagged(h) => h.last,
        }
    }

    /// The first RsvdULP byte (the RDMAP control byte).
    pub fn rsvd_ulp(&self) -> u8 {
        match self {
            SegmentHeader::Tagged(h) => h.rsvd_ulp,
            SegmentHeader::Untagged(h) => h.rsvd_ulp,
        }
    }

    /// Whether this is a tagged header.
    pub fn is_tagged(&self) -> bool {
        matches!(self, SegmentHeader::Tagged(_))
    }
}

fn check_version(ctrl: u8) -> Result<(), SegmentError> {
    let version = ctrl & MASK_VERSION;
    if version != DDP_VERSION {
        return Err(SegmentError::InvalidVersion {
            tagged: ctrl & FLAG_TAGGED != 0,
            version,
        });
    }
    Ok(())
}

crate::code_enum! {
    /// Terminate EType values of layer 1 (DDP) (RFC 5041 §7.2).
    pub enum DdpEtype {
        /// Local catastrophic error.
        Catastrophic = 0,
        /// Tagged buffer error.
        TaggedBuffer = 1,
        /// Untagged buffer error.
        UntaggedBuffer = 2,
        /// Reserved for the LLP.
        Rsvd = 3,
    }
}

crate::code_enum! {
    /// Error codes for EType 1, tagged buffer (RFC 5041 §7.2).
    pub enum TaggedErrorCode {
        /// Invalid STag.
        InvalidStag = 0x00,
        /// Base or bounds violation.
        BaseOrBounds = 0x01,
        /// STag not associated with DDP stream.
        StagNotAssociated = 0x02,
        /// TO wrap.
        ToWrap = 0x03,
        /// Invalid DDP version.
        InvalidDdpVersion = 0x04,
    }
}

crate::code_enum! {
    /// Error codes for EType 2, untagged buffer (RFC 5041 §7.2).
    pub enum UntaggedErrorCode {
        /// Invalid QN.
        InvalidQn = 0x01,
        /// Invalid MSN – no buffer available.
        NoBufferAvailable = 0x02,
        /// Invalid MSN – MSN range is not valid.
        MsnRange = 0x03,
        /// Invalid MO.
        InvalidMo = 0x04,
        /// DDP message too long for available buffer.
        MessageTooLong = 0x05,
        /// Invalid DDP version.
        InvalidDdpVersion = 0x06,
    }
}

/// A DDP-layer (Terminate layer 1) error: EType plus code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DdpError {
    /// EType 0, code 0: local catastrophic / unspecified.
    Catastrophic,
    /// EType 1 with a tagged buffer code.
    Tagged(TaggedErrorCode),
    /// EType 2 with an untagged buffer code.
    Untagged(UntaggedErrorCode),
}

impl DdpError {
    /// Terminate EType.
    pub fn etype(&self) -> DdpEtype {
        match self {
            DdpError::Catastrophic => DdpEtype::Catastrophic,
            DdpError::Tagged(_) => DdpEtype::TaggedBuffer,
            DdpError::Untagged(_) => DdpEtype::UntaggedBuffer,
        }
    }

    /// Terminate error code byte.
    pub fn code(&self) -> u8 {
        match self {
            DdpError::Catastrophic => 0,
            DdpError::Tagged(c) => *c as u8,
            DdpError::Untagged(c) => *c as u8,
        }
    }

    /// Decode an (EType, code) pair; `None` if not defined by RFC 5041.
    pub fn from_etype_code(etype: u8, code: u8) -> Option<Self> {
        match etype {
            0 if code == 0 => Some(DdpError::Catastrophic),
            1 => TaggedErrorCode::from_u8(code).map(DdpError::Tagged),
            2 => UntaggedErrorCode::from_u8(code).map(DdpError::Untagged),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc5041_tagged_header_roundtrip_wire_bytes() {
        // Zero-length Write RTR as siw sends it (docs/testing.md §6.2), without the MPA length.
        let bytes = [0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        let h = SegmentHeader::parse(&bytes).unwrap();
        assert_eq!(
            h,
            SegmentHeader::Tagged(TaggedHeader {
                last: true,
                rsvd_ulp: 0x40,
                stag: 1,
                to: 0
            })
        );
        let mut out = [0u8; 14];
        assert_eq!(h.emit(&mut out), Some(14));
        assert_eq!(out, bytes);
    }

    #[test]
    fn rfc5041_untagged_header_roundtrip_wire_bytes() {
        // Send, QN 0, MSN 1 (docs/testing.md §6.2).
        let bytes = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        let h = UntaggedHeader::parse(&bytes).unwrap();
        assert_eq!(
            h,
            UntaggedHeader {
                last: true,
                rsvd_ulp: 0x43,
                rsvd_ulp_ext: 0,
                qn: 0,
                msn: 1,
                mo: 0
            }
        );
        let mut out = [0u8; 18];
        h.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
        let h2 = UntaggedHeader {
            last: false,
            rsvd_ulp: 0x44,
            rsvd_ulp_ext: 0x0102_0304,
            qn: 2,
            msn: 0xdead_beef,
            mo: 0x0a0b_0c0d,
        };
        h2.emit(&mut out).unwrap();
        assert_eq!(out[0], 0x01);
        assert_eq!(UntaggedHeader::parse(&out).unwrap(), h2);
    }

    #[test]
    fn packet_view_reads_fields_in_place() {
        let mut bytes = [0u8; 22];
        UntaggedHeader {
            last: false,
            rsvd_ulp: 0x44,
            rsvd_ulp_ext: 0x101,
            qn: 0,
            msn: 7,
            mo: 9,
        }
        .emit(&mut bytes)
        .unwrap();
        let mut p = Packet::new_checked(&mut bytes[..]).unwrap();
        assert!(!p.tagged() && !p.last());
        assert_eq!(p.version(), 1);
        assert_eq!(p.rsvd_ulp(), 0x44);
        assert_eq!(
            (p.rsvd_ulp_ext(), p.qn(), p.msn(), p.mo()),
            (Some(0x101), Some(0), Some(7), Some(9))
        );
        assert_eq!((p.stag(), p.to()), (None, None));
        p.payload_mut().copy_from_slice(b"abcd");
        p.set_last(true);
        assert_eq!(p.payload(), b"abcd");
        assert_eq!(bytes[0], 0x41);
        let t = [0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0xff];
        let p = Packet::new_checked(&t[..]).unwrap();
        assert_eq!((p.stag(), p.to(), p.qn()), (Some(1), Some(2), None));
        assert_eq!(p.payload(), &[0xff]);
        assert_eq!(
            Packet::new_checked(&t[..13]).unwrap_err(),
            SegmentError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&[][..]).unwrap_err(),
            SegmentError::Truncated
        );
    }

    #[test]
    fn rfc5041_header_len_from_t_bit() {
        assert_eq!(header_len(0xc1), 14);
        assert_eq!(header_len(0x81), 14);
        assert_eq!(header_len(0x41), 18);
        assert_eq!(header_len(0x01), 18);
    }

    #[test]
    fn rfc5041_invalid_ddp_version_rejected() {
        let mut t = [0u8; 14];
        t[0] = 0xc2;
        assert_eq!(
            SegmentHeader::parse(&t),
            Err(SegmentError::InvalidVersion {
                tagged: true,
                version: 2
            })
        );
        let e = SegmentHeader::parse(&t).unwrap_err().ddp_error().unwrap();
        assert_eq!((e.etype() as u8, e.code()), (1, 0x04));
        let mut u = [0u8; 18];
        u[0] = 0x40;
        let e = SegmentHeader::parse(&u).unwrap_err().ddp_error().unwrap();
        assert_eq!((e.etype() as u8, e.code()), (2, 0x06));
    }

    #[test]
    fn truncated_headers_are_errors_not_panics() {
        assert_eq!(SegmentHeader::parse(&[]), Err(SegmentError::Truncated));
        assert_eq!(
            SegmentHeader::parse(&[0xc1, 0, 0]),
            Err(SegmentError::Truncated)
        );
        assert_eq!(
            SegmentHeader::parse(&[0x41; 17]),
            Err(SegmentError::Truncated)
        );
        let h = SegmentHeader::Tagged(TaggedHeader {
            last: true,
            rsvd_ulp: 0,
            stag: 1,
            to: 2,
        });
        assert_eq!(h.emit(&mut [0u8; 13]), None);
    }

    #[test]
    fn rfc5041_ddp_error_codes_roundtrip() {
        for et in 0..4u8 {
            for code in 0..=255u8 {
                if let Some(e) = DdpError::from_etype_code(et, code) {
                    assert_eq!((e.etype() as u8, e.code()), (et, code));
                }
            }
        }
        assert_eq!(
            DdpError::from_etype_code(2, 0x05),
            Some(DdpError::Untagged(UntaggedErrorCode::MessageTooLong))
        );
        assert_eq!(DdpError::from_etype_code(2, 0x00), None);
    }

    #[test]
    fn rfc5041_tagged_view_reads_and_writes_every_field() {
        // Read Response segment: L=1, RDMAP ctrl 0x42, STag 0x203, TO 0x559d4c2a1000,
        // two payload bytes.
        let bytes = [
            0xc1, 0x42, 0x00, 0x00, 0x02, 0x03, 0x00, 0x00, 0x55, 0x9d, 0x4c, 0x2a, 0x10, 0x00,
            0xab, 0xcd,
        ];
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert!(p.tagged() && p.last());
        assert_eq!((p.version(), p.rsvd_ulp(), p.header_len()), (1, 0x42, 14));
        assert_eq!(
            (p.stag(), p.to()),
            (Some(0x203), Some(0x0000_559d_4c2a_1000))
        );
        assert_eq!(p.payload(), &[0xab, 0xcd]);
        let mut out = [0u8; 16];
        let mut q = Packet::new_unchecked(&mut out[..]);
        q.set_tagged(true);
        q.set_last(true);
        q.set_version(1);
        q.set_rsvd_ulp(0x42);
        q.set_stag(0x203);
        q.set_to(0x0000_559d_4c2a_1000);
        q.payload_mut().copy_from_slice(&[0xab, 0xcd]);
        // Untagged-only setters leave a tagged header alone.
        q.set_qn(0xffff_ffff);
        q.set_msn(0xffff_ffff);
        q.set_mo(0xffff_ffff);
        q.set_rsvd_ulp_ext(0xffff_ffff);
        assert_eq!(out, bytes);
        assert_eq!(
            SegmentHeader::from_packet(&Packet::new_checked(&bytes[..]).unwrap()),
            Ok(SegmentHeader::Tagged(TaggedHeader {
                last: true,
                rsvd_ulp: 0x42,
                stag: 0x203,
                to: 0x0000_559d_4c2a_1000,
            }))
        );
    }

    #[test]
    fn rfc5041_untagged_view_reads_and_writes_every_field() {
        // Send with Invalidate, not last: Invalidate STag 0x01020304, QN 0, MSN 2, MO 8.
        let bytes = [
            0x01, 0x44, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
            0x00, 0x00, 0x00, 0x08,
        ];
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert!(!p.tagged() && !p.last());
        assert_eq!(
            (p.rsvd_ulp_ext(), p.qn(), p.msn(), p.mo()),
            (Some(0x0102_0304), Some(0), Some(2), Some(8))
        );
        assert!(p.payload().is_empty());
        let mut out = [0u8; 18];
        let mut q = Packet::new_unchecked(&mut out[..]);
        q.set_version(1);
        q.set_rsvd_ulp(0x44);
        q.set_rsvd_ulp_ext(0x0102_0304);
        q.set_qn(0);
        q.set_msn(2);
        q.set_mo(8);
        // Tagged-only setters leave an untagged header alone.
        q.set_stag(0xffff_ffff);
        q.set_to(u64::MAX);
        assert_eq!(out, bytes);
        let mut q = Packet::new_unchecked(&mut out[..]);
        q.set_version(0x06);
        assert_eq!(q.version(), 0x02, "DV is two bits");
        assert_eq!(
            SegmentHeader::from_packet(&q),
            Err(SegmentError::InvalidVersion {
                tagged: false,
                version: 2
            })
        );
    }

    #[test]
    fn rfc5041_reprs_read_the_model_they_are_asked_for() {
        // TaggedHeader::parse does not look at the T bit; SegmentHeader::parse does.
        let bytes = [0x41, 0x43, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(
            TaggedHeader::parse(&bytes),
            Ok(TaggedHeader {
                last: true,
                rsvd_ulp: 0x43,
                stag: 7,
                to: 1,
            })
        );
        assert!(!SegmentHeader::parse(&bytes).unwrap().is_tagged());
        let t = [0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
        assert_eq!(UntaggedHeader::parse(&t).unwrap().mo, 9);
    }
}
