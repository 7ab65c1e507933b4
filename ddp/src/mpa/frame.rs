//! MPA Request and Reply frames (RFC 5044 §7.1, RFC 6581 §3; docs/mpa.md §1.2–§1.4).
//!
//! Two faces, smoltcp style: [`Frame`] is a zero-copy view over a byte buffer with one
//! getter/setter per field, [`FrameRepr`] is the parsed form with [`FrameRepr::parse`]
//! (incomplete input is [`FrameParse::Incomplete`], not an error) and [`FrameRepr::emit`].

use super::error::{FrameError, LocalError, MpaError};
use crate::wire::be;

/// "MPA ID Req Frame" (docs/mpa.md §1.2).
pub const KEY_REQUEST: [u8; 16] = *b"MPA ID Req Frame";
/// "MPA ID Rep Frame" (docs/mpa.md §1.2).
pub const KEY_REPLY: [u8; 16] = *b"MPA ID Rep Frame";
/// Length of the fixed frame header: key, flags, Rev, PD_Length.
pub const HEADER_LEN: usize = 20;
/// Length of the RFC 6581 IRD/ORD block at the start of the private data.
pub const ENHANCED_BLOCK_LEN: usize = 4;
/// RFC 5044 maximum PD_Length, accepted on receive.
pub const MAX_PD_LENGTH_RECEIVE: usize = 512;
/// Largest PD_Length we emit, including the v2 block: siw drops frames above 256
/// (siw quirk, docs/siw.md §4.3, §4.8.1).
pub const MAX_PD_LENGTH_EMIT: usize = 256;
/// Largest IRD/ORD value (14 bits). irdma uses it as "no limit" (docs/mpa.md §1.4).
pub const IRD_ORD_MAX: u16 = 0x3FFF;

/// Flag bits of frame byte 16 (docs/mpa.md §1.2).
pub mod flags {
    /// M: the sender of this frame requires markers in the FPDUs it receives.
    pub const MARKERS: u8 = 0x80;
    /// C: CRC in use.
    pub const CRC: u8 = 0x40;
    /// R: reject (Reply only).
    pub const REJECT: u8 = 0x20;
    /// Enhanced connection setup (RFC 6581).
    pub const ENHANCED: u8 = 0x10;
    /// Reserved bits (send 0; siw's private GSO bit 0x08 lives here).
    pub const RESERVED: u8 = 0x0F;
}

mod field {
    use core::ops::Range;
    pub const KEY: Range<usize> = 0..16;
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LENGTH: Range<usize> = 18..20;
    pub const IRD: Range<usize> = 20..22;
    pub const ORD: Range<usize> = 22..24;
}

const V2_A_P2P: u16 = 0x8000;
const V2_B_SEND_RTR: u16 = 0x4000;
const V2_C_WRITE_RTR: u16 = 0x8000;
const V2_D_READ_RTR: u16 = 0x4000;

/// Request or Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// MPA Request (sent by the Initiator).
    Request,
    /// MPA Reply (sent by the Responder).
    Reply,
}

impl FrameKind {
    /// The 16-byte key of this frame kind.
    pub fn key(self) -> &'static [u8; 16] {
        match self {
            FrameKind::Request => &KEY_REQUEST,
            FrameKind::Reply => &KEY_REPLY,
        }
    }
}

/// One of the RFC 6581 ready-to-receive (RTR) message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtrType {
    /// Zero-length Send (flag B).
    Send,
    /// Zero-length RDMA Write (flag C).
    Write,
    /// Zero-length RDMA Read Request (flag D).
    Read,
}

/// A set of RTR types (flags B, C, D of the v2 block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrSet {
    /// Zero-length Send usable as RTR (B).
    pub send: bool,
    /// Zero-length RDMA Write usable as RTR (C).
    pub write: bool,
    /// Zero-length RDMA Read usable as RTR (D).
    pub read: bool,
}

impl RtrSet {
    /// No RTR type.
    pub const NONE: RtrSet = RtrSet {
        send: false,
        write: false,
        read: false,
    };
    /// All three RTR types.
    pub const ALL: RtrSet = RtrSet {
        send: true,
        write: true,
        read: true,
    };

    /// The set holding exactly `t`.
    pub fn only(t: RtrType) -> RtrSet {
        let mut s = RtrSet::NONE;
        s.insert(t);
        s
    }

    /// Adds `t`.
    pub fn insert(&mut self, t: RtrType) {
        match t {
            RtrType::Send => self.send = true,
            RtrType::Write => self.write = true,
            RtrType::Read => self.read = true,
        }
    }

    /// Whether `t` is in the set.
    pub fn contains(&self, t: RtrType) -> bool {
        match t {
            RtrType::Send => self.send,
            RtrType::Write => self.write,
            RtrType::Read => self.read,
        }
    }

    /// Number of types in the set.
    pub fn len(&self) -> usize {
        usize::from(self.send) + usize::from(self.write) + usize::from(self.read)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Intersection of two sets.
    pub fn intersect(&self, other: &RtrSet) -> RtrSet {
        RtrSet {
            send: self.send && other.send,
            write: self.write && other.write,
            read: self.read && other.read,
        }
    }

    /// The single type in the set, if it holds exactly one.
    pub fn single(&self) -> Option<RtrType> {
        match (self.send, self.write, self.read) {
            (true, false, false) => Some(RtrType::Send),
            (false, true, false) => Some(RtrType::Write),
            (false, false, true) => Some(RtrType::Read),
            _ => None,
        }
    }
}

/// The RFC 6581 enhanced-setup block: first 4 private-data bytes when Rev = 2 and the
/// enhanced flag is set (docs/mpa.md §1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EnhancedBlock {
    /// A: peer-to-peer mode requested (Request) / accepted (Reply).
    pub p2p: bool,
    /// B, C, D: RTR types offered (Request) or the one selected (Reply).
    pub rtr: RtrSet,
    /// IRD of the frame's sender (14 bits).
    pub ird: u16,
    /// ORD of the frame's sender (14 bits).
    pub ord: u16,
}

impl EnhancedBlock {
    /// Decodes the 4 block bytes.
    pub fn from_bytes(b: [u8; 4]) -> EnhancedBlock {
        let w0 = be::read_u16(&b[0..2]);
        let w1 = be::read_u16(&b[2..4]);
        EnhancedBlock {
            p2p: w0 & V2_A_P2P != 0,
            rtr: RtrSet {
                send: w0 & V2_B_SEND_RTR != 0,
                write: w1 & V2_C_WRITE_RTR != 0,
                read: w1 & V2_D_READ_RTR != 0,
            },
            ird: w0 & IRD_ORD_MAX,
            ord: w1 & IRD_ORD_MAX,
        }
    }

    /// Encodes the block; IRD and ORD must be ≤ 0x3FFF.
    pub fn to_bytes(&self) -> Result<[u8; 4], LocalError> {
        if self.ird > IRD_ORD_MAX || self.ord > IRD_ORD_MAX {
            return Err(LocalError::IrdOrdTooLarge);
        }
        let mut w0 = self.ird;
        let mut w1 = self.ord;
        if self.p2p {
            w0 |= V2_A_P2P;
        }
        if self.rtr.send {
            w0 |= V2_B_SEND_RTR;
        }
        if self.rtr.write {
            w1 |= V2_C_WRITE_RTR;
        }
        if self.rtr.read {
            w1 |= V2_D_READ_RTR;
        }
        let mut b = [0u8; ENHANCED_BLOCK_LEN];
        be::write_u16(&mut b[0..2], w0);
        be::write_u16(&mut b[2..4], w1);
        Ok(b)
    }
}

/// Zero-copy view of a Request/Reply frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking its length; getters may then panic on a short
    /// buffer, so use [`Frame::new_checked`] for untrusted input.
    pub fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer, checking it holds the 20-byte header and PD_Length bytes.
    pub fn new_checked(buffer: T) -> Result<Frame<T>, FrameError> {
        let f = Frame { buffer };
        f.check_len()?;
        Ok(f)
    }

    /// Checks the buffer holds the header and the private data it announces.
    pub fn check_len(&self) -> Result<(), FrameError> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || len < HEADER_LEN + usize::from(self.pd_length()) {
            return Err(FrameError::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 16-byte key.
    pub fn key(&self) -> &[u8] {
        &self.buffer.as_ref()[field::KEY]
    }

    /// Request or Reply, from the key; `None` for any other key.
    pub fn kind(&self) -> Option<FrameKind> {
        match self.key() {
            k if k == KEY_REQUEST => Some(FrameKind::Request),
            k if k == KEY_REPLY => Some(FrameKind::Reply),
            _ => None,
        }
    }

    /// The raw flag byte (M, C, R, enhanced, reserved).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// M flag.
    pub fn markers(&self) -> bool {
        self.flags() & flags::MARKERS != 0
    }

    /// C flag.
    pub fn crc(&self) -> bool {
        self.flags() & flags::CRC != 0
    }

    /// R flag.
    pub fn reject(&self) -> bool {
        self.flags() & flags::REJECT != 0
    }

    /// Enhanced-connection flag (RFC 6581).
    pub fn enhanced(&self) -> bool {
        self.flags() & flags::ENHANCED != 0
    }

    /// Reserved flag bits (0x0F).
    pub fn reserved(&self) -> u8 {
        self.flags() & flags::RESERVED
    }

    /// Rev.
    pub fn revision(&self) -> u8 {
        self.buffer.as_ref()[field::REV]
    }

    /// PD_Length.
    pub fn pd_length(&self) -> u16 {
        be::read_u16(&self.buffer.as_ref()[field::PD_LENGTH])
    }

    /// Whether the v2 IRD/ORD block is present (Rev 2 and enhanced flag).
    pub fn has_enhanced_block(&self) -> bool {
        self.revision() == 2 && self.enhanced()
    }

    /// The v2 block, if present and the buffer holds it.
    pub fn enhanced_block(&self) -> Option<EnhancedBlock> {
        if !self.has_enhanced_block() || self.pd_length() < ENHANCED_BLOCK_LEN as u16 {
            return None;
        }
        let b = self.buffer.as_ref().get(field::IRD.start..field::ORD.end)?;
        Some(EnhancedBlock::from_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// All PD_Length bytes after the header (including the v2 block if present).
    pub fn private_data(&self) -> &[u8] {
        let end = HEADER_LEN + usize::from(self.pd_length());
        &self.buffer.as_ref()[HEADER_LEN..end]
    }

    /// ULP private data: the private data after the v2 block, if any.
    pub fn ulp_private_data(&self) -> &[u8] {
        let pd = self.private_data();
        if self.has_enhanced_block() && pd.len() >= ENHANCED_BLOCK_LEN {
            &pd[ENHANCED_BLOCK_LEN..]
        } else {
            pd
        }
    }

    /// Total frame length: 20 + PD_Length.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + usize::from(self.pd_length())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the key.
    pub fn set_kind(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[field::KEY].copy_from_slice(kind.key());
    }

    /// Sets the raw flag byte.
    pub fn set_flags(&mut self, value: u8) {
        self.buffer.as_mut()[field::FLAGS] = value;
    }

    /// Sets Rev.
    pub fn set_revision(&mut self, value: u8) {
        self.buffer.as_mut()[field::REV] = value;
    }

    /// Sets PD_Length.
    pub fn set_pd_length(&mut self, value: u16) {
        be::write_u16(&mut self.buffer.as_mut()[field::PD_LENGTH], value);
    }

    /// Mutable private data (PD_Length bytes after the header).
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.pd_length());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// Parsed form of a Request/Reply frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M flag.
    pub markers: bool,
    /// C flag.
    pub crc: bool,
    /// R flag.
    pub reject: bool,
    /// Enhanced-connection flag (RFC 6581).
    pub enhanced: bool,
    /// Reserved flag bits (0x0F), kept so a responder can echo them (siw does,
    /// docs/siw.md §4.3).
    pub reserved: u8,
    /// Rev.
    pub revision: u8,
    /// The v2 block; must be `Some` exactly when `revision == 2 && enhanced`.
    pub enhanced_block: Option<EnhancedBlock>,
    /// ULP private data (after the v2 block).
    pub private_data: &'a [u8],
}

/// Result of [`FrameRepr::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameParse<'a> {
    /// More bytes are needed; `needed` more complete the next stage (header, then
    /// private data), so a caller buffering input never reads past the frame.
    Incomplete {
        /// Bytes still missing for the next stage.
        needed: usize,
    },
    /// A complete frame of `len` bytes at the start of the input.
    Complete {
        /// The parsed frame.
        repr: FrameRepr<'a>,
        /// Frame length (20 + PD_Length); bytes after it are not part of the frame.
        len: usize,
    },
}

impl<'a> FrameRepr<'a> {
    /// Parses a frame from the start of `buf`. Checks the key as soon as its bytes are
    /// there, accepts PD_Length up to 512 (RFC 5044), and requires the v2 block when
    /// Rev = 2 and the enhanced flag is set. Bytes after the frame are ignored.
    pub fn parse(buf: &'a [u8]) -> Result<FrameParse<'a>, FrameError> {
        let key_prefix = &buf[..buf.len().min(16)];
        let kind = if KEY_REQUEST.starts_with(key_prefix) {
            FrameKind::Request
        } else if KEY_REPLY.starts_with(key_prefix) {
            FrameKind::Reply
        } else {
            return Err(FrameError::BadKey);
        };
        if buf.len() < HEADER_LEN {
            return Ok(FrameParse::Incomplete {
                needed: HEADER_LEN - buf.len(),
            });
        }
        let view = Frame::new_unchecked(buf);
        let pd_length = usize::from(view.pd_length());
        if pd_length > MAX_PD_LENGTH_RECEIVE {
            return Err(FrameError::PdLengthTooLong(view.pd_length()));
        }
        let len = HEADER_LEN + pd_length;
        if buf.len() < len {
            return Ok(FrameParse::Incomplete {
                needed: len - buf.len(),
            });
        }
        if view.has_enhanced_block() && pd_length < ENHANCED_BLOCK_LEN {
            return Err(FrameError::MissingEnhancedBlock);
        }
        let ulp_start = if view.has_enhanced_block() {
            HEADER_LEN + ENHANCED_BLOCK_LEN
        } else {
            HEADER_LEN
        };
        let repr = FrameRepr {
            kind,
            markers: view.markers(),
            crc: view.crc(),
            reject: view.reject(),
            enhanced: view.enhanced(),
            reserved: view.reserved(),
            revision: view.revision(),
            enhanced_block: view.enhanced_block(),
            private_data: &buf[ulp_start..len],
        };
        Ok(FrameParse::Complete { repr, len })
    }

    /// The flag byte this frame emits.
    pub fn flag_byte(&self) -> u8 {
        let mut f = self.reserved & flags::RESERVED;
        if self.markers {
            f |= flags::MARKERS;
        }
        if self.crc {
            f |= flags::CRC;
        }
        if self.reject {
            f |= flags::REJECT;
        }
        if self.enhanced {
            f |= flags::ENHANCED;
        }
        f
    }

    /// PD_Length this frame emits (v2 block + ULP private data).
    pub fn pd_length(&self) -> usize {
        let block = if self.enhanced_block.is_some() {
            ENHANCED_BLOCK_LEN
        } else {
            0
        };
        block + self.private_data.len()
    }

    /// Emitted length: 20 + PD_Length.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.pd_length()
    }

    /// Writes the frame to the start of `out`, returning its length. Refuses PD_Length
    /// above 256 (siw limit, docs/siw.md §4.3, §4.8), an inconsistent v2 block and
    /// IRD/ORD above 0x3FFF.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, MpaError> {
        let pd_length = self.pd_length();
        if pd_length > MAX_PD_LENGTH_EMIT {
            return Err(LocalError::PrivateDataTooLong { pd_length }.into());
        }
        if (self.revision == 2 && self.enhanced) != self.enhanced_block.is_some() {
            return Err(LocalError::InconsistentEnhancedBlock.into());
        }
        let block = self.enhanced_block.map(|b| b.to_bytes()).transpose()?;
        let len = HEADER_LEN + pd_length;
        if out.len() < len {
            return Err(LocalError::BufferTooSmall {
                needed: len,
                available: out.len(),
            }
            .into());
        }
        let mut f = Frame::new_unchecked(&mut out[..len]);
        f.set_kind(self.kind);
        f.set_flags(self.flag_byte());
        f.set_revision(self.revision);
        f.set_pd_length(pd_length as u16);
        let pd = f.private_data_mut();
        let ulp = match block {
            Some(b) => {
                pd[..ENHANCED_BLOCK_LEN].copy_from_slice(&b);
                &mut pd[ENHANCED_BLOCK_LEN..]
            }
            None => pd,
        };
        ulp.copy_from_slice(self.private_data);
        Ok(len)
    }

    /// Emits into a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>, MpaError> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_mismatch_detected_before_header_complete() {
        assert_eq!(FrameRepr::parse(b"MPA ID X"), Err(FrameError::BadKey));
        assert_eq!(
            FrameRepr::parse(b"MPA ID R"),
            Ok(FrameParse::Incomplete { needed: 12 })
        );
        assert_eq!(
            FrameRepr::parse(b""),
            Ok(FrameParse::Incomplete { needed: 20 })
        );
    }

    #[test]
    fn enhanced_block_bits() {
        let b = EnhancedBlock::from_bytes([0xC0, 0x01, 0xC0, 0x02]);
        assert!(b.p2p);
        assert_eq!(b.rtr, RtrSet::ALL);
        assert_eq!((b.ird, b.ord), (1, 2));
        assert_eq!(b.to_bytes().unwrap(), [0xC0, 0x01, 0xC0, 0x02]);
        let too_big = EnhancedBlock {
            ird: 0x4000,
            ..Default::default()
        };
        assert_eq!(too_big.to_bytes(), Err(LocalError::IrdOrdTooLarge));
    }

    #[test]
    fn checked_view_rejects_truncated() {
        let mut buf = [0u8; 24];
        buf[..16].copy_from_slice(&KEY_REQUEST);
        buf[19] = 5;
        assert_eq!(
            Frame::new_checked(&buf[..]).err(),
            Some(FrameError::Truncated)
        );
        buf[19] = 4;
        let f = Frame::new_checked(&buf[..]).unwrap();
        assert_eq!(f.kind(), Some(FrameKind::Request));
        assert_eq!(f.frame_len(), 24);
    }
}
