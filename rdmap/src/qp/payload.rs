//! The payload of one outbound DDP segment as ranges of region memory, handed to the
//! `emit` callback of [`QueuePair::poll_segment`](super::QueuePair::poll_segment). The
//! bytes are never borrowed (the application may be writing them): the caller copies
//! them once, straight into the buffer it frames the FPDU in ([`PayloadReader::fill`]).

use crate::mem::RegionBytes;
use crate::verbs::MAX_SGE;

/// Up to [`MAX_SGE`] checked region ranges, in order, that make up one segment's payload.
#[derive(Debug, Clone, Copy)]
pub struct Payload<'a> {
    parts: [RegionBytes<'a>; MAX_SGE],
    n: usize,
    len: usize,
}

impl<'a> Payload<'a> {
    /// No payload.
    pub fn empty() -> Payload<'a> {
        Payload {
            parts: [RegionBytes::EMPTY; MAX_SGE],
            n: 0,
            len: 0,
        }
    }

    /// Append a range; `false` (and nothing added) if [`MAX_SGE`] ranges are held.
    pub(super) fn push(&mut self, b: RegionBytes<'a>) -> bool {
        if self.n == MAX_SGE {
            return false;
        }
        self.parts[self.n] = b;
        self.n += 1;
        self.len += b.len();
        true
    }

    /// Total payload bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no payload.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ranges, in order.
    pub fn parts(&self) -> &[RegionBytes<'a>] {
        &self.parts[..self.n]
    }

    /// A cursor that copies the payload out in order.
    pub fn reader(&self) -> PayloadReader<'_, 'a> {
        PayloadReader {
            p: self,
            part: 0,
            off: 0,
        }
    }

    /// A copy of the whole payload (tests, diagnostics).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.reader().fill(&mut v);
        v
    }
}

/// Copies a [`Payload`] out in order, piece by piece (e.g. between MPA markers).
#[derive(Debug)]
pub struct PayloadReader<'p, 'a> {
    p: &'p Payload<'a>,
    part: usize,
    off: usize,
}

impl PayloadReader<'_, '_> {
    /// Copy the next `dst.len()` payload bytes into `dst`. Panics if fewer remain.
    pub fn fill(&mut self, mut dst: &mut [u8]) {
        while !dst.is_empty() {
            let b = self.p.parts()[self.part];
            let n = (b.len() - self.off).min(dst.len());
            b.copy_to(self.off, &mut dst[..n]);
            dst = &mut dst[n..];
            self.off += n;
            if self.off == b.len() {
                self.part += 1;
                self.off = 0;
            }
        }
    }
}
