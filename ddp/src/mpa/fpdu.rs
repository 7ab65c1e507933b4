//! FPDU framing on the transmit side: ULPDU_Length, pad to 4, CRC32c (or zeros) and
//! optional markers (RFC 5044 §4, §5; docs/mpa.md §1.6, §1.7), plus MULPDU sizing.
//!
//! Marker interpretation used by both [`FpduEncoder`] and
//! [`FpduParser`](super::FpduParser): a marker sits at every stream position
//! `S0 + 512·k` (S0 = first byte of the first FPDU in that direction). Its FPDUPTR is the
//! distance from the start of the FPDU that contains it to the marker's first byte. A marker
//! falling exactly where an FPDU begins is that FPDU's first 4 bytes (FPDUPTR 0), the
//! ULPDU_Length field follows it (as Wireshark's `get_first_marker_offset` assumes), and it
//! is covered by that FPDU's CRC. Every FPDU is a multiple of 4 bytes, so a marker never
//! splits the CRC field; markers before the CRC field are covered by the CRC.
//! The OSC iWARP userspace MPA (2007, `mpa_wrt_mrkr_fpdu`/`mpa_rd_mrkr_fpdu`) frames
//! markers the same way (leading marker with FPDUPTR 0, FPDUPTR = offset from the FPDU
//! start, markers inside the CRC). siw never uses markers (docs/mpa.md §1.7), so this has
//! no siw interop risk.

use super::crc::{crc32c, crc_to_trailer};
use super::error::{LocalError, MpaError};
use crate::wire::be;

/// Size of the ULPDU_Length field.
pub const ULPDU_LENGTH_LEN: usize = 2;
/// Size of the CRC field.
pub const CRC_LEN: usize = 4;
/// Size of a marker.
pub const MARKER_LEN: usize = 4;
/// Marker spacing in TCP sequence space.
pub const MARKER_INTERVAL: usize = 512;
/// Largest ULPDU (DDP segment) an FPDU can carry.
pub const MAX_ULPDU_LEN: usize = u16::MAX as usize;

/// Pad bytes after a ULPDU of `ulpdu_len` bytes: `(2 + ulpdu_len + pad) % 4 == 0`.
#[inline]
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - ((ulpdu_len + ULPDU_LENGTH_LEN) % 4)) % 4
}

/// FPDU length without markers: length field + ULPDU + pad + CRC.
#[inline]
pub const fn fpdu_len_without_markers(ulpdu_len: usize) -> usize {
    ULPDU_LENGTH_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// MULPDU (RFC 5044 §6, docs/mpa.md §1.6): the largest ULPDU whose FPDU fits one TCP
/// segment of `emss` bytes. Markers off: `EMSS − (6 + EMSS mod 4)`; markers on additionally
/// `− 4·⌈EMSS/512⌉`. Saturates at 0 for tiny EMSS and at 65535.
pub fn mulpdu(emss: usize, markers: bool) -> usize {
    let mut m = emss.saturating_sub(6 + emss % 4);
    if markers {
        m = m.saturating_sub(MARKER_LEN * emss.div_ceil(MARKER_INTERVAL));
    }
    m.min(MAX_ULPDU_LEN)
}

/// Number of marker positions (multiples of 512) in `[from, to)`.
#[inline]
fn markers_in(from: u64, to: u64) -> u64 {
    let i = MARKER_INTERVAL as u64;
    to.div_ceil(i) - from.div_ceil(i)
}

/// Encodes ULPDUs into FPDUs for one direction of a stream.
///
/// With markers on, the encoder tracks the stream position from S0 (its first FPDU byte),
/// so every FPDU of the direction must go through the same encoder, in order.
#[derive(Debug, Clone)]
pub struct FpduEncoder {
    crc: bool,
    markers: bool,
    pos: u64,
}

impl FpduEncoder {
    /// An encoder at S0. `crc`: compute CRC32c (else the field is zero, as siw sends it,
    /// docs/mpa.md §1.6); `markers`: insert markers.
    pub fn new(crc: bool, markers: bool) -> FpduEncoder {
        FpduEncoder {
            crc,
            markers,
            pos: 0,
        }
    }

    /// Whether CRC32c is computed.
    pub fn crc_enabled(&self) -> bool {
        self.crc
    }

    /// Whether markers are inserted.
    pub fn markers_enabled(&self) -> bool {
        self.markers
    }

    /// Bytes emitted so far (stream position relative to S0).
    pub fn stream_position(&self) -> u64 {
        self.pos
    }

    /// Exact length of the next FPDU for a ULPDU of `ulpdu_len` bytes, including the
    /// markers it will contain at the current stream position.
    pub fn encoded_len(&self, ulpdu_len: usize) -> usize {
        let base = fpdu_len_without_markers(ulpdu_len);
        if !self.markers {
            return base;
        }
        base + MARKER_LEN * self.marker_count(base) as usize
    }

    /// Upper bound of [`Self::encoded_len`] at any stream position.
    pub fn max_encoded_len(&self, ulpdu_len: usize) -> usize {
        let base = fpdu_len_without_markers(ulpdu_len);
        if !self.markers {
            return base;
        }
        // One marker per 508 payload bytes plus one at the start, rounded up.
        base + MARKER_LEN * (base.div_ceil(MARKER_INTERVAL - MARKER_LEN) + 1)
    }

    fn marker_count(&self, base: usize) -> u64 {
        let mut n = 0u64;
        loop {
            let total = base as u64 + MARKER_LEN as u64 * n;
            let c = markers_in(self.pos, self.pos + total);
            if c == n {
                return n;
            }
            n = c;
        }
    }

    /// Frames one ULPDU given as `ulpdu_parts` (e.g. DDP header, then payload slices,
    /// concatenated without an intermediate copy) into the start of `out`, returning the
    /// FPDU length. On error nothing is written and the stream position is unchanged.
    pub fn encode(&mut self, ulpdu_parts: &[&[u8]], out: &mut [u8]) -> Result<usize, MpaError> {
        let ulpdu_len: usize = ulpdu_parts.iter().map(|p| p.len()).sum();
        let (mut part, mut off) = (0, 0);
        self.encode_with(
            ulpdu_len,
            |mut dst| {
                while !dst.is_empty() {
                    let p = ulpdu_parts[part];
                    let n = (p.len() - off).min(dst.len());
                    dst[..n].copy_from_slice(&p[off..off + n]);
                    dst = &mut dst[n..];
                    off += n;
                    if off == p.len() {
                        part += 1;
                        off = 0;
                    }
                }
            },
            out,
        )
    }

    /// Frames one ULPDU of `ulpdu_len` bytes into the start of `out`, returning the FPDU
    /// length. The ULPDU bytes are written by `fill`, called with consecutive pieces of
    /// `out` (split around markers) that together take the `ulpdu_len` bytes in order;
    /// each call must fill its whole piece. This lets a caller copy payload straight from
    /// where it lives into the FPDU (one copy); the CRC is computed over the bytes as
    /// written into `out`. On error `fill` is not called, nothing is written and the
    /// stream position is unchanged.
    pub fn encode_with(
        &mut self,
        ulpdu_len: usize,
        mut fill: impl FnMut(&mut [u8]),
        out: &mut [u8],
    ) -> Result<usize, MpaError> {
        if ulpdu_len > MAX_ULPDU_LEN {
            return Err(LocalError::UlpduTooLong(ulpdu_len).into());
        }
        let total = self.encoded_len(ulpdu_len);
        if out.len() < total {
            return Err(LocalError::BufferTooSmall {
                needed: total,
                available: out.len(),
            }
            .into());
        }
        let pad = pad_len(ulpdu_len);
        let len_field = (ulpdu_len as u16).to_be_bytes();
        if !self.markers {
            let mut idx = 0;
            out[..2].copy_from_slice(&len_field);
            idx += 2;
            fill(&mut out[idx..idx + ulpdu_len]);
            idx += ulpdu_len;
            out[idx..idx + pad].fill(0);
            idx += pad;
            let trailer = if self.crc {
                crc_to_trailer(crc32c(&out[..idx]))
            } else {
                [0; 4]
            };
            out[idx..idx + CRC_LEN].copy_from_slice(&trailer);
            idx += CRC_LEN;
            debug_assert_eq!(idx, total);
            self.pos += total as u64;
            return Ok(total);
        }
        // Markers: the last marker's FPDUPTR must fit 16 bits.
        let interval = MARKER_INTERVAL as u64;
        let end = self.pos + total as u64;
        if markers_in(self.pos, end) > 0 {
            let last_marker = (end - 1) / interval * interval;
            if last_marker - self.pos > u64::from(u16::MAX) {
                return Err(LocalError::FpduTooLongForMarkers.into());
            }
        }
        let mut w = MarkerWriter {
            out,
            idx: 0,
            pos: self.pos,
            fpdu_start: self.pos,
        };
        w.put(&len_field);
        w.put_with(ulpdu_len, &mut fill);
        w.put(&[0u8; 3][..pad]);
        w.marker_if_due();
        let trailer = if self.crc {
            crc_to_trailer(crc32c(&w.out[..w.idx]))
        } else {
            [0; 4]
        };
        w.put(&trailer);
        debug_assert_eq!(w.idx, total);
        self.pos = w.pos;
        Ok(total)
    }

    /// Convenience: frames one ULPDU into a new vector.
    pub fn encode_to_vec(&mut self, ulpdu_parts: &[&[u8]]) -> Result<Vec<u8>, MpaError> {
        let len: usize = ulpdu_parts.iter().map(|p| p.len()).sum();
        let mut v = vec![0; self.max_encoded_len(len.min(MAX_ULPDU_LEN))];
        let n = self.encode(ulpdu_parts, &mut v)?;
        v.truncate(n);
        Ok(v)
    }
}

struct MarkerWriter<'o> {
    out: &'o mut [u8],
    idx: usize,
    pos: u64,
    fpdu_start: u64,
}

impl MarkerWriter<'_> {
    fn marker_if_due(&mut self) {
        if self.pos.is_multiple_of(MARKER_INTERVAL as u64) {
            // Checked by the caller to fit 16 bits.
            let fpduptr = (self.pos - self.fpdu_start) as u16;
            let m = self.idx;
            self.out[m..m + 2].fill(0);
            be::write_u16(&mut self.out[m + 2..m + 4], fpduptr);
            self.idx += MARKER_LEN;
            self.pos += MARKER_LEN as u64;
        }
    }

    fn put(&mut self, data: &[u8]) {
        let mut at = 0;
        self.put_with(data.len(), &mut |dst: &mut [u8]| {
            dst.copy_from_slice(&data[at..at + dst.len()]);
            at += dst.len();
        });
    }

    /// Writes `len` bytes produced by `fill` (consecutive pieces between markers).
    fn put_with(&mut self, mut len: usize, fill: &mut impl FnMut(&mut [u8])) {
        while len > 0 {
            self.marker_if_due();
            let room = MARKER_INTERVAL - (self.pos % MARKER_INTERVAL as u64) as usize;
            let n = room.min(len);
            fill(&mut self.out[self.idx..self.idx + n]);
            self.idx += n;
            self.pos += n as u64;
            len -= n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc5044_pad_to_four() {
        assert_eq!(pad_len(14), 0);
        assert_eq!(pad_len(18), 0);
        assert_eq!(pad_len(21), 1);
        assert_eq!(pad_len(23), 3);
        assert_eq!(pad_len(0), 2);
        for u in 0..64 {
            assert_eq!((2 + u + pad_len(u)) % 4, 0);
        }
    }

    #[test]
    fn marker_count_counts_start_marker() {
        let e = FpduEncoder::new(false, true);
        // At S0 the FPDU starts with a marker.
        assert_eq!(e.encoded_len(14), 20 + 4);
        // 2+506+0+4 = 512 bytes of FPDU plus the leading marker = 516, crossing 512 once more.
        assert_eq!(e.encoded_len(506), 512 + 8);
    }

    #[test]
    fn encode_with_matches_encode_with_and_without_markers() {
        let payload: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 5) as u8).collect();
        let parts: [&[u8]; 3] = [&payload[..14], &payload[14..1000], &payload[1000..]];
        for (crc, markers) in [(true, false), (true, true), (false, true), (false, false)] {
            let (mut a, mut b) = (
                FpduEncoder::new(crc, markers),
                FpduEncoder::new(crc, markers),
            );
            for round in 0..3 {
                let len = 1000 + round * 700;
                let want = a.encode_to_vec(&[&payload[..len]]).unwrap();
                let mut got = vec![0u8; b.max_encoded_len(len)];
                let mut at = 0;
                let n = b
                    .encode_with(
                        len,
                        |dst| {
                            dst.copy_from_slice(&payload[at..at + dst.len()]);
                            at += dst.len();
                        },
                        &mut got,
                    )
                    .unwrap();
                assert_eq!(&got[..n], &want[..], "crc {crc} markers {markers}");
                assert_eq!(a.stream_position(), b.stream_position());
            }
            // Parts split anywhere give the same FPDU as one slice.
            let mut c = FpduEncoder::new(crc, markers);
            let mut d = FpduEncoder::new(crc, markers);
            assert_eq!(
                c.encode_to_vec(&parts).unwrap(),
                d.encode_to_vec(&[&payload[..]]).unwrap()
            );
        }
        // Errors call nothing.
        let mut e = FpduEncoder::new(true, false);
        let r = e.encode_with(100, |_| panic!("filled"), &mut [0u8; 10]);
        assert!(r.is_err());
        assert_eq!(e.stream_position(), 0);
    }
}
