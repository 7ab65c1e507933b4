//! The streaming FPDU parser (RFC 5044 §4–§6; docs/mpa.md §1.6, §1.7).
//!
//! Accepts the in-order TCP byte stream of one direction split in any way, and hands out
//! events that borrow the input: the DDP header (buffered internally, it may be split),
//! payload slices of the input (so the caller places payload straight into memory), and
//! the end of each FPDU after its CRC was verified. Markers are stripped and checked.
//! No allocation; the CRC is computed incrementally over the slices as they are handed out.

use super::crc::{crc32c_append, crc_from_trailer};
use super::error::MpaError;
use super::fpdu::{pad_len, CRC_LEN, MARKER_INTERVAL, MARKER_LEN};
use crate::wire::be;

/// DDP tagged header length (RFC 5041 §4.2).
pub const DDP_TAGGED_HEADER_LEN: usize = 14;
/// DDP untagged header length (RFC 5041 §4.3).
pub const DDP_UNTAGGED_HEADER_LEN: usize = 18;
/// DDP control byte T (tagged) bit.
const DDP_TAGGED_BIT: u8 = 0x80;

/// The MPA length and DDP header of one FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpduHeader {
    /// ULPDU_Length: DDP header + payload.
    pub ulpdu_len: u16,
    ddp_header: [u8; DDP_UNTAGGED_HEADER_LEN],
    header_len: u8,
}

impl FpduHeader {
    /// The DDP header bytes: 14 when tagged, else 18.
    pub fn ddp_header(&self) -> &[u8] {
        &self.ddp_header[..usize::from(self.header_len)]
    }

    /// Whether the DDP T bit (0x80 of the first ULPDU byte) is set.
    pub fn is_tagged(&self) -> bool {
        self.ddp_header[0] & DDP_TAGGED_BIT != 0
    }

    /// Payload bytes that follow the header in this FPDU.
    pub fn payload_len(&self) -> usize {
        usize::from(self.ulpdu_len) - usize::from(self.header_len)
    }
}

/// An event of [`FpduParser::next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FpduEvent<'a> {
    /// ULPDU_Length and the complete DDP header of a new FPDU.
    Header(FpduHeader),
    /// The next payload bytes of the current FPDU, a slice of the input (several per
    /// FPDU when the input is split or markers interrupt it).
    Payload(&'a [u8]),
    /// End of the current FPDU; its CRC was verified when CRC is on.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length { have: u8, buf: [u8; 2] },
    Header { have: u8 },
    Payload { remaining: u16 },
    Trailer { have: u8, buf: [u8; 7] },
}

/// Streaming FPDU parser for one direction of a stream (starts at S0).
#[derive(Debug, Clone)]
pub struct FpduParser {
    crc: bool,
    markers: bool,
    /// Stream position of the next byte, relative to S0 (markers included).
    pos: u64,
    /// Stream position where the current FPDU began (its leading marker if any).
    fpdu_start: u64,
    fpdu_begun: bool,
    crc_state: u32,
    marker_have: u8,
    marker_buf: [u8; MARKER_LEN],
    header: FpduHeader,
    state: State,
    failed: Option<MpaError>,
}

impl FpduParser {
    /// A parser at S0. `crc`: verify CRC32c (when off the field is never checked,
    /// docs/mpa.md §1.3); `markers`: the peer inserts markers toward us.
    pub fn new(crc: bool, markers: bool) -> FpduParser {
        FpduParser {
            crc,
            markers,
            pos: 0,
            fpdu_start: 0,
            fpdu_begun: false,
            crc_state: 0,
            marker_have: 0,
            marker_buf: [0; MARKER_LEN],
            header: FpduHeader {
                ulpdu_len: 0,
                ddp_header: [0; 18],
                header_len: 0,
            },
            state: State::Length {
                have: 0,
                buf: [0; 2],
            },
            failed: None,
        }
    }

    /// Whether CRC32c is verified.
    pub fn crc_enabled(&self) -> bool {
        self.crc
    }

    /// Whether markers are expected.
    pub fn markers_enabled(&self) -> bool {
        self.markers
    }

    /// Bytes consumed so far (stream position relative to S0).
    pub fn stream_position(&self) -> u64 {
        self.pos
    }

    /// True between FPDUs (no partial FPDU buffered or in progress).
    pub fn is_idle(&self) -> bool {
        !self.fpdu_begun && self.failed.is_none()
    }

    /// The error that stopped the parser, if any (errors are sticky: the stream is dead).
    pub fn error(&self) -> Option<&MpaError> {
        self.failed.as_ref()
    }

    fn fail(&mut self, e: MpaError) -> Result<Option<FpduEvent<'static>>, MpaError> {
        self.failed = Some(e.clone());
        Err(e)
    }

    #[inline]
    fn begin_fpdu(&mut self) {
        if !self.fpdu_begun {
            self.fpdu_begun = true;
            self.fpdu_start = self.pos;
            self.crc_state = 0;
        }
    }

    #[inline]
    fn add_crc(&mut self, bytes: &[u8]) {
        if self.crc {
            self.crc_state = crc32c_append(self.crc_state, bytes);
        }
    }

    /// Logical (non-marker) bytes available before the next marker position.
    #[inline]
    fn room(&self) -> usize {
        if self.markers {
            MARKER_INTERVAL - (self.pos % MARKER_INTERVAL as u64) as usize
        } else {
            usize::MAX
        }
    }

    /// Consumes marker bytes if one is due. Returns false if the input ran out first.
    fn take_marker(&mut self, input: &mut &[u8]) -> Result<bool, MpaError> {
        if !self.markers
            || (self.marker_have == 0 && !self.pos.is_multiple_of(MARKER_INTERVAL as u64))
        {
            return Ok(true);
        }
        if input.is_empty() {
            return Ok(false);
        }
        if self.marker_have == 0 {
            // A marker where no FPDU is in progress starts the next FPDU (FPDUPTR 0).
            self.begin_fpdu();
        }
        let want = MARKER_LEN - usize::from(self.marker_have);
        let n = want.min(input.len());
        let have = usize::from(self.marker_have);
        self.marker_buf[have..have + n].copy_from_slice(&input[..n]);
        *input = &input[n..];
        self.marker_have += n as u8;
        self.pos += n as u64;
        if usize::from(self.marker_have) < MARKER_LEN {
            return Ok(false);
        }
        self.marker_have = 0;
        let marker_pos = self.pos - MARKER_LEN as u64;
        let found = be::read_u16(&self.marker_buf[2..4]);
        let offset = marker_pos - self.fpdu_start;
        if offset != u64::from(found) {
            let expected = u16::try_from(offset).unwrap_or(u16::MAX);
            return Err(MpaError::MarkerMismatch { expected, found });
        }
        // Markers before the CRC field are covered by the CRC (they never fall inside it:
        // FPDUs are multiples of 4 bytes).
        let in_crc_field = match self.state {
            State::Trailer { have, .. } => {
                usize::from(have) > pad_len(usize::from(self.header.ulpdu_len))
            }
            _ => false,
        };
        if !in_crc_field {
            let m = self.marker_buf;
            self.add_crc(&m);
        }
        Ok(true)
    }

    /// Returns the next event, advancing `input` past the bytes it used; `Ok(None)` when
    /// `input` is exhausted mid-way (call again with more bytes). Errors are sticky.
    pub fn next<'a>(&mut self, input: &mut &'a [u8]) -> Result<Option<FpduEvent<'a>>, MpaError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        loop {
            match self.take_marker(input) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(e) => return self.fail(e),
            }
            match self.state {
                State::Length { have, mut buf } => {
                    if input.is_empty() {
                        return Ok(None);
                    }
                    self.begin_fpdu();
                    let want = 2 - usize::from(have);
                    let n = want.min(input.len()).min(self.room());
                    buf[usize::from(have)..usize::from(have) + n].copy_from_slice(&input[..n]);
                    self.add_crc(&input[..n]);
                    *input = &input[n..];
                    self.pos += n as u64;
                    let have = have + n as u8;
                    if have < 2 {
                        self.state = State::Length { have, buf };
                        continue;
                    }
                    let ulpdu_len = be::read_u16(&buf);
                    if ulpdu_len == 0 {
                        return self.fail(MpaError::UlpduTooShort {
                            ulpdu_len,
                            header_len: DDP_TAGGED_HEADER_LEN,
                        });
                    }
                    self.header.ulpdu_len = ulpdu_len;
                    self.header.header_len = 0;
                    self.state = State::Header { have: 0 };
                }
                State::Header { have } => {
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let mut have = usize::from(have);
                    if have == 0 {
                        let header_len = if input[0] & DDP_TAGGED_BIT != 0 {
                            DDP_TAGGED_HEADER_LEN
                        } else {
                            DDP_UNTAGGED_HEADER_LEN
                        };
                        if usize::from(self.header.ulpdu_len) < header_len {
                            return self.fail(MpaError::UlpduTooShort {
                                ulpdu_len: self.header.ulpdu_len,
                                header_len,
                            });
                        }
                        self.header.header_len = header_len as u8;
                    }
                    let need = usize::from(self.header.header_len);
                    let n = (need - have).min(input.len()).min(self.room());
                    self.header.ddp_header[have..have + n].copy_from_slice(&input[..n]);
                    // CRC in stream order: a marker may interrupt the header.
                    self.add_crc(&input[..n]);
                    *input = &input[n..];
                    self.pos += n as u64;
                    have += n;
                    if have < need {
                        self.state = State::Header { have: have as u8 };
                        continue;
                    }
                    let h = self.header;
                    let remaining = h.ulpdu_len - u16::from(h.header_len);
                    self.state = if remaining == 0 {
                        State::Trailer {
                            have: 0,
                            buf: [0; 7],
                        }
                    } else {
                        State::Payload { remaining }
                    };
                    return Ok(Some(FpduEvent::Header(h)));
                }
                State::Payload { remaining } => {
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let n = usize::from(remaining).min(input.len()).min(self.room());
                    let (slice, rest) = input.split_at(n);
                    *input = rest;
                    self.pos += n as u64;
                    self.add_crc(slice);
                    let remaining = remaining - n as u16;
                    self.state = if remaining == 0 {
                        State::Trailer {
                            have: 0,
                            buf: [0; 7],
                        }
                    } else {
                        State::Payload { remaining }
                    };
                    return Ok(Some(FpduEvent::Payload(slice)));
                }
                State::Trailer { have, mut buf } => {
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let pad = pad_len(usize::from(self.header.ulpdu_len));
                    let need = pad + CRC_LEN;
                    let have = usize::from(have);
                    let n = (need - have).min(input.len()).min(self.room());
                    buf[have..have + n].copy_from_slice(&input[..n]);
                    *input = &input[n..];
                    self.pos += n as u64;
                    // Pad bytes are covered by the CRC, the CRC field is not.
                    let pad_end = (have + n).min(pad);
                    if have < pad_end {
                        self.add_crc(&buf[have..pad_end]);
                    }
                    let have = have + n;
                    if have < need {
                        self.state = State::Trailer {
                            have: have as u8,
                            buf,
                        };
                        continue;
                    }
                    if self.crc {
                        let received =
                            crc_from_trailer([buf[pad], buf[pad + 1], buf[pad + 2], buf[pad + 3]]);
                        if received != self.crc_state {
                            return self.fail(MpaError::CrcMismatch {
                                computed: self.crc_state,
                                received,
                            });
                        }
                    }
                    self.fpdu_begun = false;
                    self.state = State::Length {
                        have: 0,
                        buf: [0; 2],
                    };
                    return Ok(Some(FpduEvent::End));
                }
            }
        }
    }
}
