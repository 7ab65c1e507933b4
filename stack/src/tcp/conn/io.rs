//! The connection's two byte interfaces to its owner: [`RxSink`] (where in-order received
//! bytes go, one copy) and [`TxSource`] (where bytes to send and resend come from; the
//! connection never owns them), plus [`RingTx`], a simple ring-buffer source for tests and
//! sockets.

/// The consumer of a connection's in-order received bytes (an application ring, an FPDU
/// parser, registered memory).
pub trait RxSink {
    /// Bytes the sink can take now: the receive window is computed from it.
    fn free(&self) -> usize;
    /// Take a prefix of `data`; returns how many bytes were taken (may be fewer than
    /// offered: the rest stays with the connection and is offered again later).
    fn deliver(&mut self, data: &[u8]) -> usize;
}

/// The owner's send queue, as seen from SND.UNA: offset 0 is the oldest byte not yet
/// acknowledged. The connection reports acknowledged bytes
/// ([`SegmentOutcome::acked`](super::SegmentOutcome::acked)); the owner then drops exactly
/// that many from the front, so offsets stay relative to SND.UNA.
pub trait TxSource {
    /// Total bytes queued from SND.UNA (sent but unacknowledged, plus not yet sent).
    fn len(&self) -> u64;
    /// Whether nothing is queued.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy bytes starting at `offset` (from SND.UNA) into `dst`; returns how many were
    /// copied (less than `dst.len()` only when the queue ends first).
    fn copy_at(&self, offset: u64, dst: &mut [u8]) -> usize;
    /// The first record boundary strictly after `offset`, if the owner frames records
    /// (e.g. MPA FPDUs): no segment crosses it.
    fn next_boundary(&self, _offset: u64) -> Option<u64> {
        None
    }
    /// Whether the owner frames its bytes as records (every byte queued belongs to a
    /// record whose end it marks once the record is complete): a segment then carries
    /// whole records only, and bytes after the last end wait for theirs
    /// (`conn/records.rs`). `false`: a plain byte stream.
    fn framed(&self) -> bool {
        false
    }
}

/// A fixed-capacity ring of bytes to send, with optional record boundaries.
#[derive(Debug, Clone)]
pub struct RingTx {
    buf: Vec<u8>,
    head: usize,
    len: usize,
    /// Record ends as stream positions (bytes ever released + offset from the head),
    /// ascending; only with [`Self::push_record`] or [`Self::mark_record_end`].
    records: std::collections::VecDeque<u64>,
    /// Bytes released since the ring was made (the stream position of the head).
    released: u64,
    /// A record end was ever marked ([`TxSource::framed`]).
    framed: bool,
}

impl RingTx {
    /// An empty ring of `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        RingTx {
            buf: vec![0; capacity],
            head: 0,
            len: 0,
            records: Default::default(),
            released: 0,
            framed: false,
        }
    }

    /// Room left.
    pub fn free(&self) -> usize {
        self.buf.len() - self.len
    }

    /// Append as much of `data` as fits; returns how much.
    pub fn write(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.free());
        let cap = self.buf.len();
        let mut tail = (self.head + self.len) % cap.max(1);
        let mut done = 0;
        while done < n {
            let chunk = (n - done).min(cap - tail);
            self.buf[tail..tail + chunk].copy_from_slice(&data[done..done + chunk]);
            done += chunk;
            tail = (tail + chunk) % cap;
        }
        self.len += n;
        n
    }

    /// Append bytes written by `f` into the free space (called with each contiguous free
    /// region until it writes less than offered); returns how many were appended.
    pub fn fill(&mut self, mut f: impl FnMut(&mut [u8]) -> usize) -> usize {
        let cap = self.buf.len();
        let mut total = 0;
        while self.free() > 0 {
            let tail = (self.head + self.len) % cap;
            let room = if tail >= self.head {
                cap - tail
            } else {
                self.head - tail
            }
            .min(self.free());
            let n = f(&mut self.buf[tail..tail + room]).min(room);
            self.len += n;
            total += n;
            if n < room {
                break;
            }
        }
        total
    }

    /// Append `data` as one record (all or nothing); `false` when it does not fit.
    pub fn push_record(&mut self, data: &[u8]) -> bool {
        if data.len() > self.free() || data.is_empty() {
            return false;
        }
        self.write(data);
        self.records.push_back(self.released + self.len as u64);
        self.framed = true;
        true
    }

    /// Mark a record end `at` bytes from the head (bytes already written, e.g. by
    /// [`Self::fill`]); ignored unless `at` is within what is held and after the last end
    /// marked.
    pub fn mark_record_end(&mut self, at: u64) {
        let pos = self.released + at;
        if at == 0 || at > self.len as u64 || self.records.back().is_some_and(|&r| r >= pos) {
            return;
        }
        self.records.push_back(pos);
        self.framed = true;
    }

    /// Drop `n` acknowledged bytes from the front (at most what is held).
    pub fn release(&mut self, n: u64) {
        let n = (n.min(self.len as u64)) as usize;
        if self.buf.is_empty() {
            return;
        }
        self.head = (self.head + n) % self.buf.len();
        self.len -= n;
        self.released += n as u64;
        while self.records.front().is_some_and(|&r| r <= self.released) {
            self.records.pop_front();
        }
    }
}

impl TxSource for RingTx {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn copy_at(&self, offset: u64, dst: &mut [u8]) -> usize {
        if offset >= self.len as u64 {
            return 0;
        }
        let off = offset as usize;
        let n = dst.len().min(self.len - off);
        let cap = self.buf.len();
        let mut pos = (self.head + off) % cap;
        let mut done = 0;
        while done < n {
            let chunk = (n - done).min(cap - pos);
            dst[done..done + chunk].copy_from_slice(&self.buf[pos..pos + chunk]);
            done += chunk;
            pos = (pos + chunk) % cap;
        }
        n
    }

    fn next_boundary(&self, offset: u64) -> Option<u64> {
        let pos = self.released + offset;
        let i = self.records.partition_point(|&r| r <= pos);
        self.records.get(i).map(|&r| r - self.released)
    }

    fn framed(&self) -> bool {
        self.framed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_wraps_and_copies_at_offsets() {
        let mut r = RingTx::new(8);
        assert_eq!(r.write(b"abcdef"), 6);
        r.release(4);
        assert_eq!(r.write(b"ghijklmn"), 6);
        assert_eq!(r.len(), 8);
        let mut d = [0u8; 8];
        assert_eq!(r.copy_at(0, &mut d), 8);
        assert_eq!(&d, b"efghijkl");
        assert_eq!(r.copy_at(6, &mut d), 2);
        assert_eq!(&d[..2], b"kl");
        assert_eq!(r.copy_at(8, &mut d), 0);
    }

    #[test]
    fn ring_fill_writes_contiguous_regions_across_the_wrap() {
        let mut r = RingTx::new(8);
        assert_eq!(r.write(b"abcdef"), 6);
        r.release(5);
        let mut next = b'g';
        let n = r.fill(|buf| {
            for b in buf.iter_mut() {
                *b = next;
                next += 1;
            }
            buf.len()
        });
        assert_eq!(n, 7);
        let mut d = [0u8; 8];
        assert_eq!(r.copy_at(0, &mut d), 8);
        assert_eq!(&d, b"fghijklm");
        assert_eq!(r.fill(|buf| buf.len()), 0);
    }

    #[test]
    fn ring_records_give_boundaries() {
        let mut r = RingTx::new(64);
        assert!(r.push_record(&[1; 10]));
        assert!(r.push_record(&[2; 20]));
        assert_eq!(r.next_boundary(0), Some(10));
        assert_eq!(r.next_boundary(10), Some(30));
        assert_eq!(r.next_boundary(30), None);
        r.release(10);
        assert_eq!(r.next_boundary(0), Some(20));
        assert!(!r.push_record(&[0; 100]));
    }

    #[test]
    fn ring_record_ends_marked_after_fill_survive_release_and_wrap() {
        let mut r = RingTx::new(16);
        assert_eq!(r.fill(|b| b.len().min(12)), 12);
        r.mark_record_end(5);
        r.mark_record_end(12);
        r.mark_record_end(3); // before the last end: ignored
        r.mark_record_end(20); // beyond what is held: ignored
        assert_eq!(r.next_boundary(0), Some(5));
        assert_eq!(r.next_boundary(5), Some(12));
        r.release(5);
        assert_eq!(r.next_boundary(0), Some(7));
        assert_eq!(r.write(&[9; 9]), 9);
        r.mark_record_end(16);
        assert_eq!(r.next_boundary(7), Some(16));
        r.release(7);
        assert_eq!(r.next_boundary(0), Some(9));
        r.release(9);
        assert_eq!(r.next_boundary(0), None);
    }
}
