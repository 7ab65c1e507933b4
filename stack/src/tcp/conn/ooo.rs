//! The bytes a connection holds that its sink has not taken: out-of-order pieces above
//! RCV.NXT (their ranges are tracked, and bounded, by [`Reassembly`](crate::tcp::sack::Reassembly))
//! and in-order bytes the sink refused for lack of room. Keyed by stream offset (u64, no
//! wraparound); pieces never overlap, so memory is exactly the bytes held.

use std::collections::BTreeMap;

/// Pieces of the receive stream keyed by their first offset.
#[derive(Debug, Default, Clone)]
pub struct PieceStore {
    pieces: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
}

impl PieceStore {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Hold the octets of `data` starting at `start` that are not held yet.
    pub fn insert(&mut self, start: u64, data: &[u8]) {
        let end = start + data.len() as u64;
        let mut cur = start;
        // The piece starting before `start` may cover a prefix.
        if let Some((&s, v)) = self.pieces.range(..=start).next_back() {
            let e = s + v.len() as u64;
            if e > cur {
                cur = e;
            }
        }
        while cur < end {
            let next = self
                .pieces
                .range(cur..end)
                .next()
                .map(|(&s, v)| (s, v.len()));
            let gap_end = next.map_or(end, |(s, _)| s);
            if gap_end > cur {
                let a = (cur - start) as usize;
                let b = (gap_end - start) as usize;
                self.pieces.insert(cur, data[a..b].to_vec());
                self.bytes += b - a;
            }
            match next {
                Some((s, l)) => cur = cur.max(s + l as u64),
                None => break,
            }
        }
    }

    /// Offer what is held contiguously from `from`, up to `limit` (exclusive), to
    /// `take`; returns how many octets were taken.
    pub fn drain_from(
        &mut self,
        from: u64,
        limit: u64,
        mut take: impl FnMut(&[u8]) -> usize,
    ) -> u64 {
        let mut at = from;
        while at < limit {
            let Some(mut entry) = self.pieces.first_entry() else {
                break;
            };
            let s = *entry.key();
            if s > at {
                break;
            }
            let v = entry.get_mut();
            let e = s + v.len() as u64;
            if e <= at {
                // Entirely below (already delivered); drop it.
                self.bytes -= v.len();
                entry.remove();
                continue;
            }
            let skip = (at - s) as usize;
            let upto = (e.min(limit) - s) as usize;
            let n = take(&v[skip..upto]);
            at += n as u64;
            if at >= e {
                self.bytes -= v.len();
                entry.remove();
            } else if n < upto - skip {
                break;
            }
        }
        // Trim the partly taken head piece so memory follows what is held.
        if let Some(entry) = self.pieces.first_entry() {
            let s = *entry.key();
            if s < at {
                let mut v = entry.remove();
                let cut = (at - s) as usize;
                self.bytes -= cut;
                v.drain(..cut);
                self.pieces.insert(at, v);
            }
        }
        at - from
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_fill_gaps_only_and_drain_in_order() {
        let mut p = PieceStore::default();
        p.insert(10, &[1; 10]);
        p.insert(5, &[2; 20]);
        assert_eq!(p.bytes(), 20);
        let mut got = Vec::new();
        assert_eq!(
            p.drain_from(5, 25, |d| {
                got.extend_from_slice(d);
                d.len()
            }),
            20
        );
        assert_eq!(&got[..5], &[2; 5]);
        assert_eq!(&got[5..15], &[1; 10]);
        assert_eq!(&got[15..], &[2; 5]);
        assert_eq!(p.bytes(), 0);
    }

    #[test]
    fn partial_take_keeps_the_rest() {
        let mut p = PieceStore::default();
        p.insert(0, &[7; 100]);
        assert_eq!(p.drain_from(0, 100, |d| d.len().min(30)), 30);
        assert_eq!(p.bytes(), 70);
        assert_eq!(p.drain_from(30, 100, |d| d.len()), 70);
        assert_eq!(p.bytes(), 0);
    }
}
