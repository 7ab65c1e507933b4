//! Where the records of an outgoing MPA byte stream end: the MPA Request or Reply frame,
//! then one FPDU after another (docs/mpa.md §1.6, §1.10).
//!
//! A TCP sender that knows these ends can keep every segment aligned to FPDUs
//! (RFC 5044 §8: MULPDU sizing and the sender's alignment; siw gets the same from
//! `MSG_EOR` on each FPDU): a segment starts where an FPDU starts and ends where one
//! ends. [`RecordSplitter`] follows the stream a transmitter writes, in order and in
//! pieces of any size, and reports each record's end. It reads only the framing (the
//! frame's PD_Length, each FPDU's ULPDU_Length) and never fails: bytes that are not MPA
//! framing (a frame without an MPA key) end the reporting for the rest of the stream, so
//! a sender then segments it as a plain byte stream. FPDUs with markers are not split
//! (markers exist for receivers of unaligned streams; nothing in the Linux world uses
//! them): the caller does not use a splitter on such a stream.

use super::fpdu::{fpdu_len_without_markers, ULPDU_LENGTH_LEN};
use super::frame::{HEADER_LEN, KEY_REPLY, KEY_REQUEST};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The stream starts with a Request or Reply frame.
    Frame,
    /// FPDUs.
    Fpdus,
    /// Not MPA framing: nothing more is reported.
    Off,
}

/// Follows an outgoing MPA stream and reports where its records end.
#[derive(Debug, Clone)]
pub struct RecordSplitter {
    phase: Phase,
    hdr: [u8; HEADER_LEN],
    have: usize,
    /// Bytes of the current record after its header still to come.
    remaining: usize,
    /// Stream bytes seen.
    pos: u64,
}

impl Default for RecordSplitter {
    fn default() -> Self {
        RecordSplitter::new()
    }
}

impl RecordSplitter {
    /// A splitter for a whole connection's stream: the MPA frame first, then FPDUs.
    pub fn new() -> RecordSplitter {
        RecordSplitter {
            phase: Phase::Frame,
            hdr: [0; HEADER_LEN],
            have: 0,
            remaining: 0,
            pos: 0,
        }
    }

    /// A splitter for a stream of FPDUs only (no frame before them).
    pub fn fpdus_only() -> RecordSplitter {
        RecordSplitter {
            phase: Phase::Fpdus,
            ..RecordSplitter::new()
        }
    }

    /// Whether it still follows the framing (`false` once bytes were not MPA framing).
    pub fn is_framing(&self) -> bool {
        self.phase != Phase::Off
    }

    /// Stream bytes fed so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Feed the next bytes of the stream; `end(k)` is called for every record that ends
    /// at byte `k` of `data` (`1..=data.len()`, ascending).
    pub fn feed(&mut self, data: &[u8], mut end: impl FnMut(usize)) {
        let mut at = 0;
        while at < data.len() && self.phase != Phase::Off {
            if self.remaining > 0 {
                let take = self.remaining.min(data.len() - at);
                at += take;
                self.remaining -= take;
                if self.remaining == 0 {
                    end(at);
                }
                continue;
            }
            let need = match self.phase {
                Phase::Frame => HEADER_LEN,
                _ => ULPDU_LENGTH_LEN,
            };
            let take = (need - self.have).min(data.len() - at);
            self.hdr[self.have..self.have + take].copy_from_slice(&data[at..at + take]);
            self.have += take;
            at += take;
            if self.have < need {
                break;
            }
            self.have = 0;
            let rest = match self.phase {
                Phase::Frame => {
                    let key = &self.hdr[..16];
                    if key != KEY_REQUEST && key != KEY_REPLY {
                        self.phase = Phase::Off;
                        break;
                    }
                    self.phase = Phase::Fpdus;
                    usize::from(u16::from_be_bytes([self.hdr[18], self.hdr[19]]))
                }
                _ => {
                    let ulpdu = usize::from(u16::from_be_bytes([self.hdr[0], self.hdr[1]]));
                    fpdu_len_without_markers(ulpdu) - ULPDU_LENGTH_LEN
                }
            };
            if rest == 0 {
                end(at);
            }
            self.remaining = rest;
        }
        self.pos += data.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mpa::{FpduEncoder, FrameKind, FrameRepr};

    fn frame(kind: FrameKind, pd: &[u8]) -> Vec<u8> {
        FrameRepr {
            kind,
            markers: false,
            crc: false,
            reject: false,
            enhanced: false,
            reserved: 0,
            revision: 1,
            enhanced_block: None,
            private_data: pd,
        }
        .to_vec()
        .unwrap()
    }

    /// The frame, then FPDUs of ULPDU lengths 14 (pad 0), 15 (pad 3), 1442 and 16.
    fn stream() -> (Vec<u8>, Vec<usize>) {
        let mut s = frame(FrameKind::Request, b"hello");
        let mut ends = vec![s.len()];
        let mut enc = FpduEncoder::new(true, false);
        for len in [14usize, 15, 1442, 16] {
            let ulpdu: Vec<u8> = (0..len).map(|i| i as u8).collect();
            s.extend(enc.encode_to_vec(&[&ulpdu]).unwrap());
            ends.push(s.len());
        }
        (s, ends)
    }

    #[test]
    fn rfc5044_8_record_ends_of_frame_and_fpdus_in_one_piece() {
        let (s, ends) = stream();
        let mut r = RecordSplitter::new();
        let mut got = Vec::new();
        r.feed(&s, |k| got.push(k));
        assert_eq!(got, ends);
        assert!(r.is_framing());
        assert_eq!(r.position(), s.len() as u64);
    }

    #[test]
    fn rfc5044_8_record_ends_whatever_the_pieces() {
        let (s, ends) = stream();
        for piece in [1usize, 2, 3, 5, 7, 19, 20, 21, 64, 1000] {
            let mut r = RecordSplitter::new();
            let mut got = Vec::new();
            let mut base = 0;
            for chunk in s.chunks(piece) {
                r.feed(chunk, |k| got.push(base + k));
                base += chunk.len();
            }
            assert_eq!(got, ends, "pieces of {piece}");
        }
    }

    #[test]
    fn a_stream_that_is_not_mpa_ends_the_reporting() {
        let mut r = RecordSplitter::new();
        let mut got = Vec::new();
        r.feed(&[0x55; 100], |k| got.push(k));
        assert!(got.is_empty());
        assert!(!r.is_framing());
        let mut r = RecordSplitter::fpdus_only();
        // ULPDU 2 + pad 0 + CRC: an 8-byte record; arbitrary bytes are still lengths.
        r.feed(&[0, 2, 1, 1, 0, 0, 0, 0, 0, 2], |k| got.push(k));
        assert_eq!(got, [8]);
    }
}
