//! TX chunk allocator handing out runs of consecutive UMEM chunks, so a multi-buffer frame
//! is contiguous in the UMEM and the stack builds it in place (no staging copy); each
//! descriptor of its chain then covers one chunk.
//!
//! The TX area is cut into slabs of `per_slab` consecutive chunks. Runs are bumped off the
//! current slab; when a run does not fit, the current slab is retired and a free one taken.
//! A slab counts its chunks still on the TX or completion ring and becomes free again when
//! that count drops to zero, whatever order the completions come in. A run never straddles
//! two slabs, so at most `per_slab - 1` chunks of a slab go unused until it drains.

/// Allocator of consecutive TX chunks (see the module docs).
#[derive(Debug)]
pub(crate) struct TxSlabs {
    /// UMEM offset of the first TX chunk.
    base: u64,
    /// Chunk size in bytes.
    chunk: u64,
    /// Chunks per slab (the longest run).
    per_slab: u32,
    /// Per slab: chunks handed out and not yet completed.
    outstanding: Vec<u32>,
    /// Slabs with nothing outstanding, other than `current`.
    free: Vec<u32>,
    /// The slab runs are bumped off, if any.
    current: Option<u32>,
    /// Next unused chunk of `current`.
    next: u32,
    /// Chunks handed out and not yet completed, over all slabs.
    in_use: u32,
    /// Completed addresses that were not handed out (ignored; kept for diagnosis).
    stray: u64,
}

impl TxSlabs {
    /// `slabs` slabs of `per_slab` chunks of `chunk` bytes, starting at UMEM offset `base`.
    pub(crate) fn new(base: u64, chunk: u64, slabs: u32, per_slab: u32) -> Self {
        debug_assert!(chunk.is_power_of_two() && per_slab >= 1);
        TxSlabs {
            base,
            chunk,
            per_slab,
            outstanding: vec![0; slabs as usize],
            // Popped from the end: hand out slab 0 first.
            free: (0..slabs).rev().collect(),
            current: None,
            next: 0,
            in_use: 0,
            stray: 0,
        }
    }

    /// Chunk size in bytes.
    pub(crate) fn chunk_bytes(&self) -> u64 {
        self.chunk
    }

    /// Total TX chunks.
    pub(crate) fn capacity(&self) -> u32 {
        self.outstanding.len() as u32 * self.per_slab
    }

    /// Chunks handed out and not yet completed.
    pub(crate) fn in_use(&self) -> u32 {
        self.in_use
    }

    /// Completed addresses that did not belong to a handed-out chunk.
    pub(crate) fn stray(&self) -> u64 {
        self.stray
    }

    /// `true` if [`TxSlabs::alloc`] of `k` chunks would succeed.
    pub(crate) fn can_alloc(&self, k: u32) -> bool {
        if k == 0 || k > self.per_slab {
            return false;
        }
        if let Some(c) = self.current {
            if self.outstanding[c as usize] == 0 || self.next + k <= self.per_slab {
                return true;
            }
        }
        !self.free.is_empty()
    }

    /// UMEM offset of `k` consecutive free chunks (`1 <= k <= per_slab`), now outstanding
    /// until each is passed to [`TxSlabs::complete`]; `None` if no slab has room.
    pub(crate) fn alloc(&mut self, k: u32) -> Option<u64> {
        if k == 0 || k > self.per_slab {
            return None;
        }
        let slab = match self.current {
            Some(c) if self.outstanding[c as usize] == 0 => {
                // Drained while current: start over at its first chunk.
                self.next = 0;
                c
            }
            Some(c) if self.next + k <= self.per_slab => c,
            _ => {
                let fresh = self.free.pop()?;
                // The old current slab has chunks outstanding (else it would have been
                // reused above): it returns to `free` with its last completion.
                self.current = Some(fresh);
                self.next = 0;
                fresh
            }
        };
        let index = u64::from(slab) * u64::from(self.per_slab) + u64::from(self.next);
        self.next += k;
        self.outstanding[slab as usize] += k;
        self.in_use += k;
        Some(self.base + index * self.chunk)
    }

    /// One chunk came back on the completion ring (`addr` may point anywhere inside it).
    pub(crate) fn complete(&mut self, addr: u64) {
        let Some(off) = addr.checked_sub(self.base) else {
            self.stray += 1;
            return;
        };
        let slab = off / self.chunk / u64::from(self.per_slab);
        let Some(out) = self.outstanding.get_mut(slab as usize) else {
            self.stray += 1;
            return;
        };
        if *out == 0 {
            self.stray += 1;
            return;
        }
        *out -= 1;
        self.in_use -= 1;
        if *out == 0 && self.current != Some(slab as u32) {
            self.free.push(slab as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: u64 = 2048;

    #[test]
    fn runs_are_consecutive_and_inside_one_slab() {
        let mut s = TxSlabs::new(10 * CHUNK, CHUNK, 2, 16);
        assert_eq!(s.alloc(5), Some(10 * CHUNK));
        assert_eq!(s.alloc(5), Some(15 * CHUNK));
        assert_eq!(s.alloc(5), Some(20 * CHUNK));
        // 15 used: a run of 2 does not fit in slab 0 and starts slab 1.
        assert_eq!(s.alloc(2), Some(26 * CHUNK));
        assert_eq!(s.alloc(1), Some(28 * CHUNK));
        assert_eq!(s.in_use(), 18);
        // Slab 1 has 13 left, slab 0 is retired and busy: 14 cannot be had.
        assert!(!s.can_alloc(14));
        assert_eq!(s.alloc(14), None);
        assert!(s.can_alloc(13));
        assert_eq!(s.alloc(17), None, "longer than a slab");
        assert_eq!(s.alloc(0), None);
    }

    #[test]
    fn retired_slab_returns_with_its_last_completion_in_any_order() {
        let mut s = TxSlabs::new(0, CHUNK, 2, 4);
        let a = s.alloc(3).unwrap();
        let b = s.alloc(2).unwrap(); // slab 1
        assert_eq!(b, 4 * CHUNK);
        assert!(!s.can_alloc(3), "slab 0 busy, slab 1 has 2 left");
        // Complete slab 0 out of order, with addresses inside the chunks.
        s.complete(a + 2 * CHUNK + 100);
        s.complete(a);
        assert!(!s.can_alloc(3));
        s.complete(a + CHUNK);
        assert!(s.can_alloc(3));
        assert_eq!(s.alloc(3), Some(0));
        assert_eq!(s.in_use(), 5);
    }

    #[test]
    fn drained_current_slab_starts_over() {
        let mut s = TxSlabs::new(0, CHUNK, 1, 4);
        let a = s.alloc(3).unwrap();
        assert!(!s.can_alloc(2));
        for i in 0..3 {
            s.complete(a + i * CHUNK);
        }
        assert_eq!(s.alloc(4), Some(0));
        assert_eq!(s.in_use(), 4);
    }

    #[test]
    fn stray_completions_are_ignored_and_counted() {
        let mut s = TxSlabs::new(8 * CHUNK, CHUNK, 2, 4);
        s.complete(0); // below the TX area
        s.complete(100 * CHUNK); // past it
        s.complete(9 * CHUNK); // never handed out
        assert_eq!(s.stray(), 3);
        assert_eq!(s.in_use(), 0);
        assert_eq!(s.alloc(4), Some(8 * CHUNK));
    }

    /// A model of the TX ring: random run lengths, completions in random order; no chunk
    /// is ever handed out twice while outstanding, and everything comes back.
    #[test]
    fn no_chunk_is_lent_twice_and_none_leaks() {
        let slabs = 6u32;
        let per = 16u32;
        let mut s = TxSlabs::new(3 * CHUNK, CHUNK, slabs, per);
        let mut owned = vec![false; (slabs * per) as usize];
        let mut flight: Vec<u64> = Vec::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut handed = 0u64;
        for _ in 0..20_000 {
            let k = (next() % u64::from(per)) as u32 + 1;
            if next() % 3 != 0 {
                if let Some(a) = s.alloc(k) {
                    handed += 1;
                    for i in 0..u64::from(k) {
                        let idx = ((a - 3 * CHUNK) / CHUNK + i) as usize;
                        assert!(
                            idx / per as usize
                                == (a - 3 * CHUNK) as usize / CHUNK as usize / per as usize,
                            "run inside one slab"
                        );
                        assert!(!owned[idx], "chunk {idx} lent twice");
                        owned[idx] = true;
                        flight.push(a + i * CHUNK);
                    }
                } else {
                    assert!(!flight.is_empty(), "alloc failed with nothing outstanding");
                }
            } else if !flight.is_empty() {
                let n = (next() % 8) as usize + 1;
                for _ in 0..n.min(flight.len()) {
                    let at = (next() % flight.len() as u64) as usize;
                    let a = flight.swap_remove(at);
                    owned[((a - 3 * CHUNK) / CHUNK) as usize] = false;
                    s.complete(a);
                }
            }
            assert_eq!(s.in_use() as usize, flight.len());
        }
        for a in flight.drain(..) {
            s.complete(a);
        }
        assert!(handed > 1000);
        assert_eq!(s.in_use(), 0);
        assert_eq!(s.stray(), 0);
        assert_eq!(s.capacity(), slabs * per);
        // Every slab is usable again: take them all as whole runs.
        for _ in 0..slabs {
            assert!(s.alloc(per).is_some());
        }
        assert_eq!(s.alloc(1), None);
    }
}
