//! The receiver's out-of-order map: which octets above RCV.NXT are held, bounded in ranges
//! and bytes, and the SACK (RFC 2018 §4) and DSACK (RFC 2883 §4) blocks to send.
//!
//! Only ranges are kept: the caller stores the payload (e.g. at its offset in the receive
//! ring) when [`Reassembly::insert`] accepts it.

use super::{SackBlock, SackList};
use crate::tcp::seq::Seq;

/// Largest segment or distance the map considers (2^30: the largest TCP window).
pub const MAX_WINDOW: u32 = 1 << 30;

/// Bounds of the map (a peer chooses what arrives out of order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReassemblyConfig {
    /// Most disjoint ranges held above RCV.NXT (holes = ranges).
    pub max_ranges: usize,
    /// Most octets held above RCV.NXT.
    pub max_bytes: u32,
}

impl Default for ReassemblyConfig {
    fn default() -> Self {
        // 256 holes: a 1 MiB window of 1448-byte segments at 5% loss has ~36.
        ReassemblyConfig {
            max_ranges: 256,
            max_bytes: 16 << 20,
        }
    }
}

/// Why a segment was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// It starts at or beyond the right edge of the window, or lies more than 2^30
    /// before RCV.NXT.
    OutOfWindow,
    /// It would need a new range and `max_ranges` are held.
    TooManyRanges,
    /// Its new octets would take the held octets over `max_bytes`.
    TooManyBytes,
    /// Longer than 2^30 octets.
    TooLong,
}

/// What [`Reassembly::insert`] did with a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// (Part of) the segment was taken: the caller stores octets `stored.start..stored.end`
    /// (its part inside the window and at or above the old RCV.NXT).
    Accepted {
        /// The octets to store.
        stored: SackBlock,
        /// How far RCV.NXT moved (octets now deliverable in order; 0 when out of order).
        advanced: u32,
        /// Octets in `stored` not held before.
        new_bytes: u32,
        /// Octets cut off past the right edge of the window.
        trimmed: u32,
        /// Octets that had arrived before (the first such run), reported as DSACK.
        duplicate: Option<SackBlock>,
    },
    /// Every octet had arrived before; reported as DSACK in the next ACK.
    Duplicate(SackBlock),
    /// Nothing was taken.
    Dropped(DropReason),
}

#[derive(Debug, Clone, Copy)]
struct Range {
    start: Seq,
    end: Seq,
    /// When it last received a segment (larger = more recent).
    stamp: u64,
}

/// Octets received above RCV.NXT, as disjoint, non-adjacent ranges sorted by sequence.
#[derive(Debug, Clone)]
pub struct Reassembly {
    cfg: ReassemblyConfig,
    rcv_nxt: Seq,
    ranges: Vec<Range>,
    held: u32,
    clock: u64,
    dsack: Option<SackBlock>,
}

impl Reassembly {
    /// An empty map expecting `rcv_nxt` next (IRS + 1).
    pub fn new(rcv_nxt: Seq, cfg: ReassemblyConfig) -> Self {
        Reassembly {
            cfg,
            rcv_nxt,
            ranges: Vec::new(),
            held: 0,
            clock: 0,
            dsack: None,
        }
    }

    /// The next octet expected in order.
    pub fn rcv_nxt(&self) -> Seq {
        self.rcv_nxt
    }

    /// Octets held out of order.
    pub fn held_bytes(&self) -> u32 {
        self.held
    }

    /// How many disjoint ranges are held (= holes before them).
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// The held ranges in sequence order.
    pub fn ranges(&self) -> impl Iterator<Item = SackBlock> + '_ {
        self.ranges.iter().map(|r| SackBlock::new(r.start, r.end))
    }

    fn off(&self, s: Seq) -> u32 {
        s.since(self.rcv_nxt)
    }

    /// Take the segment `seq..seq+len`, with `window` octets open from RCV.NXT.
    pub fn insert(&mut self, seq: Seq, len: u32, window: u32) -> Received {
        if len > MAX_WINDOW {
            return Received::Dropped(DropReason::TooLong);
        }
        let window = window.min(MAX_WINDOW);
        let end = seq.wrapping_add(len);
        let off_s = seq.diff(self.rcv_nxt) as i64;
        let off_e = off_s + len as i64;
        if len > 0 && off_e <= 0 {
            if -off_s <= MAX_WINDOW as i64 {
                let b = SackBlock::new(seq, end);
                self.dsack = Some(b);
                return Received::Duplicate(b);
            }
            return Received::Dropped(DropReason::OutOfWindow);
        }
        if off_s >= window as i64 && len > 0 {
            return Received::Dropped(DropReason::OutOfWindow);
        }
        if off_s < -(MAX_WINDOW as i64) {
            return Received::Dropped(DropReason::OutOfWindow);
        }
        let s = off_s.max(0) as u32;
        let e = off_e.min(window as i64).max(s as i64) as u32;
        let trimmed = (off_e - e as i64).max(0) as u32;
        let mut duplicate = (off_s < 0).then(|| SackBlock::new(seq, self.rcv_nxt));
        let stored = SackBlock::new(self.rcv_nxt.wrapping_add(s), self.rcv_nxt.wrapping_add(e));
        if s == e {
            return Received::Accepted {
                stored,
                advanced: 0,
                new_bytes: 0,
                trimmed,
                duplicate,
            };
        }
        // Ranges that overlap or touch [s, e).
        let lo = self.ranges.partition_point(|r| self.off(r.end) < s);
        let hi = self.ranges.partition_point(|r| self.off(r.start) <= e);
        let mut covered = 0u32;
        for r in &self.ranges[lo..hi] {
            let (rs, re) = (self.off(r.start), self.off(r.end));
            let (a, b) = (rs.max(s), re.min(e));
            if a < b {
                covered += b - a;
                if duplicate.is_none() {
                    duplicate = Some(SackBlock::new(
                        self.rcv_nxt.wrapping_add(a),
                        self.rcv_nxt.wrapping_add(b),
                    ));
                }
            }
        }
        let new_bytes = (e - s) - covered;
        self.clock += 1;
        if new_bytes == 0 {
            // All inside one held range (touching ranges cannot cover a gap).
            if let Some(r) = self.ranges.get_mut(lo) {
                r.stamp = self.clock;
            }
            let b = SackBlock::new(seq, end);
            self.dsack = Some(b);
            return Received::Duplicate(b);
        }
        let merged_s = self.ranges[lo..hi]
            .first()
            .map_or(s, |r| self.off(r.start).min(s));
        let merged_e = self.ranges[lo..hi]
            .last()
            .map_or(e, |r| self.off(r.end).max(e));
        if merged_s == 0 {
            let removed: u32 = self.ranges[lo..hi]
                .iter()
                .map(|r| r.end.since(r.start))
                .sum();
            self.ranges.drain(lo..hi);
            self.held -= removed;
            self.rcv_nxt = self.rcv_nxt.wrapping_add(merged_e);
            if duplicate.is_some() {
                self.dsack = duplicate;
            }
            return Received::Accepted {
                stored,
                advanced: merged_e,
                new_bytes,
                trimmed,
                duplicate,
            };
        }
        if lo == hi && self.ranges.len() >= self.cfg.max_ranges {
            return Received::Dropped(DropReason::TooManyRanges);
        }
        if self.held as u64 + new_bytes as u64 > self.cfg.max_bytes as u64 {
            return Received::Dropped(DropReason::TooManyBytes);
        }
        let r = Range {
            start: self.rcv_nxt.wrapping_add(merged_s),
            end: self.rcv_nxt.wrapping_add(merged_e),
            stamp: self.clock,
        };
        self.ranges.splice(lo..hi, [r]);
        self.held += new_bytes;
        if duplicate.is_some() {
            self.dsack = duplicate;
        }
        Received::Accepted {
            stored,
            advanced: 0,
            new_bytes,
            trimmed,
            duplicate,
        }
    }

    /// The SACK option for the ACK about to be sent, at most `max_blocks` (clamped to
    /// 1..=4; 3 with timestamps): a pending DSACK block first (RFC 2883 §4, reported
    /// once), then the held range containing it (§4, second block), then the held ranges
    /// most recently added to first (RFC 2018 §4: the first block holds the segment that
    /// triggered the ACK, the rest repeat the most recently reported ones; a range
    /// absorbed by a merge is reported as the merged range).
    pub fn sack_blocks(&mut self, max_blocks: usize) -> SackList {
        let max = max_blocks.clamp(1, 4);
        let mut out = SackList::new();
        let mut skip = None;
        if let Some(d) = self.dsack.take() {
            out.push(d);
            if let Some(i) = self
                .ranges
                .iter()
                .position(|r| SackBlock::new(r.start, r.end).contains_block(&d))
            {
                if out.len() < max {
                    out.push(SackBlock::new(self.ranges[i].start, self.ranges[i].end));
                }
                skip = Some(i);
            }
        }
        // Pick the most recent ranges: O(max * ranges), ranges bounded by max_ranges.
        let mut last_stamp = u64::MAX;
        while out.len() < max {
            let mut best: Option<usize> = None;
            for (i, r) in self.ranges.iter().enumerate() {
                if Some(i) == skip || r.stamp >= last_stamp {
                    continue;
                }
                if best.is_none_or(|b| self.ranges[b].stamp < r.stamp) {
                    best = Some(i);
                }
            }
            let Some(b) = best else { break };
            last_stamp = self.ranges[b].stamp;
            out.push(SackBlock::new(self.ranges[b].start, self.ranges[b].end));
        }
        out
    }

    /// Whether a DSACK block waits for the next ACK.
    pub fn dsack_pending(&self) -> bool {
        self.dsack.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u32 = 1 << 20;

    fn r() -> Reassembly {
        Reassembly::new(Seq(1000), ReassemblyConfig::default())
    }
    fn blocks(l: &SackList) -> Vec<(u32, u32)> {
        l.iter().map(|b| (b.start.0, b.end.0)).collect()
    }

    #[test]
    fn in_order_segment_advances_rcv_nxt() {
        let mut m = r();
        match m.insert(Seq(1000), 100, W) {
            Received::Accepted {
                advanced,
                new_bytes,
                ..
            } => {
                assert_eq!((advanced, new_bytes), (100, 100))
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(m.rcv_nxt(), Seq(1100));
        assert!(m.sack_blocks(4).is_empty());
    }

    #[test]
    fn filling_the_hole_delivers_held_ranges() {
        let mut m = r();
        m.insert(Seq(1100), 100, W);
        m.insert(Seq(1300), 100, W);
        assert_eq!(m.range_count(), 2);
        assert_eq!(m.held_bytes(), 200);
        match m.insert(Seq(1000), 100, W) {
            Received::Accepted { advanced, .. } => assert_eq!(advanced, 200),
            o => panic!("{o:?}"),
        }
        assert_eq!(m.rcv_nxt(), Seq(1200));
        assert_eq!(m.held_bytes(), 100);
        m.insert(Seq(1200), 100, W);
        assert_eq!(m.rcv_nxt(), Seq(1400));
        assert_eq!((m.range_count(), m.held_bytes()), (0, 0));
    }

    #[test]
    fn rfc2018_first_block_holds_most_recent_segment() {
        let mut m = r();
        m.insert(Seq(1100), 100, W);
        m.insert(Seq(1500), 100, W);
        m.insert(Seq(1300), 100, W);
        assert_eq!(blocks(&m.sack_blocks(4))[0], (1300, 1400));
        // A segment extending an older range makes that range first.
        m.insert(Seq(1200), 50, W);
        assert_eq!(blocks(&m.sack_blocks(4))[0], (1100, 1250));
    }

    #[test]
    fn rfc2018_4_later_blocks_most_recent_first() {
        let mut m = r();
        for s in [1100, 1300, 1500, 1700, 1900] {
            m.insert(Seq(s), 100, W);
        }
        assert_eq!(
            blocks(&m.sack_blocks(4)),
            vec![(1900, 2000), (1700, 1800), (1500, 1600), (1300, 1400)]
        );
        // With timestamps only three fit.
        assert_eq!(m.sack_blocks(3).len(), 3);
    }

    #[test]
    fn rfc2018_4_merged_block_reported_whole() {
        let mut m = r();
        m.insert(Seq(1100), 100, W);
        m.insert(Seq(1300), 100, W);
        m.insert(Seq(1200), 100, W); // joins both
        assert_eq!(blocks(&m.sack_blocks(4)), vec![(1100, 1400)]);
    }

    #[test]
    fn rfc2018_4_no_blocks_once_in_order() {
        let mut m = r();
        m.insert(Seq(1100), 100, W);
        m.insert(Seq(1000), 100, W);
        assert!(m.sack_blocks(4).is_empty());
    }

    #[test]
    fn rfc2883_4_1_dsack_first_block_reports_duplicate_below_ack() {
        let mut m = r();
        m.insert(Seq(1000), 500, W);
        m.insert(Seq(1600), 100, W);
        assert_eq!(
            m.insert(Seq(1000), 100, W),
            Received::Duplicate(SackBlock::new(Seq(1000), Seq(1100)))
        );
        assert!(m.dsack_pending());
        assert_eq!(blocks(&m.sack_blocks(4)), vec![(1000, 1100), (1600, 1700)]);
        // Reported once.
        assert_eq!(blocks(&m.sack_blocks(4)), vec![(1600, 1700)]);
    }

    #[test]
    fn rfc2883_4_2_dsack_second_block_is_the_containing_range() {
        let mut m = r();
        m.insert(Seq(1100), 300, W);
        m.insert(Seq(1600), 100, W);
        assert!(matches!(
            m.insert(Seq(1200), 100, W),
            Received::Duplicate(_)
        ));
        assert_eq!(
            blocks(&m.sack_blocks(4)),
            vec![(1200, 1300), (1100, 1400), (1600, 1700)]
        );
    }

    #[test]
    fn rfc2883_4_partial_duplicate_reports_the_duplicated_part() {
        let mut m = r();
        m.insert(Seq(1000), 100, W);
        match m.insert(Seq(1050), 100, W) {
            Received::Accepted {
                duplicate,
                advanced,
                ..
            } => {
                assert_eq!(duplicate, Some(SackBlock::new(Seq(1050), Seq(1100))));
                assert_eq!(advanced, 50);
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(blocks(&m.sack_blocks(4)), vec![(1050, 1100)]);
    }

    #[test]
    fn segment_past_window_trimmed_or_dropped() {
        let mut m = r();
        match m.insert(Seq(1000), 300, 200) {
            Received::Accepted {
                trimmed, advanced, ..
            } => assert_eq!((trimmed, advanced), (100, 200)),
            o => panic!("{o:?}"),
        }
        assert_eq!(
            m.insert(Seq(1400), 10, 200),
            Received::Dropped(DropReason::OutOfWindow)
        );
        assert_eq!(
            m.insert(Seq(1000), MAX_WINDOW + 1, W),
            Received::Dropped(DropReason::TooLong)
        );
        // Far below RCV.NXT: not a plausible duplicate.
        assert_eq!(
            m.insert(Seq(1200).wrapping_add(1 << 31), 10, W),
            Received::Dropped(DropReason::OutOfWindow)
        );
    }

    #[test]
    fn bounded_ranges_and_bytes_drop_cleanly() {
        let mut m = Reassembly::new(
            Seq(0),
            ReassemblyConfig {
                max_ranges: 2,
                max_bytes: 250,
            },
        );
        m.insert(Seq(100), 100, W);
        m.insert(Seq(300), 100, W);
        assert_eq!(
            m.insert(Seq(500), 10, W),
            Received::Dropped(DropReason::TooManyRanges)
        );
        // Extending a held range needs no new range, but the byte cap holds.
        assert_eq!(
            m.insert(Seq(400), 60, W),
            Received::Dropped(DropReason::TooManyBytes)
        );
        assert!(matches!(
            m.insert(Seq(400), 50, W),
            Received::Accepted { new_bytes: 50, .. }
        ));
        // In-order data is always taken.
        assert!(matches!(
            m.insert(Seq(0), 100, W),
            Received::Accepted { advanced: 200, .. }
        ));
        assert_eq!((m.range_count(), m.held_bytes()), (1, 150));
    }

    #[test]
    fn wraparound_reassembly() {
        let start = Seq(u32::MAX - 150);
        let mut m = Reassembly::new(start, ReassemblyConfig::default());
        m.insert(start.wrapping_add(100), 200, W); // crosses 2^32
        assert_eq!(blocks(&m.sack_blocks(4)), vec![(u32::MAX - 50, 149)]);
        assert!(matches!(
            m.insert(start, 100, W),
            Received::Accepted { advanced: 300, .. }
        ));
        assert_eq!(m.rcv_nxt(), Seq(149));
    }
}
