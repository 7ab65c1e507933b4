//! Property tests: random and hostile input against the reassembly map, the scoreboard
//! and RACK, checked against a simple model and the structures' invariants.

use super::rack::{Rack, RackConfig, Tlp};
use super::rtt::{RttConfig, RttEstimator};
use super::sack::{
    NextSeg, Reassembly, ReassemblyConfig, Received, SackBlock, SackList, Scoreboard,
    ScoreboardConfig,
};
use super::seq::Seq;
use proptest::prelude::*;
use smoltcp::time::{Duration, Instant};

/// Structural invariants of the receiver map.
fn check_reassembly(m: &Reassembly, cfg: &ReassemblyConfig) -> Result<(), TestCaseError> {
    let base = m.rcv_nxt();
    let mut prev_end = 0u32;
    let mut sum = 0u64;
    for (i, r) in m.ranges().enumerate() {
        let (s, e) = (r.start.since(base), r.end.since(base));
        prop_assert!(s < e, "empty or reversed range");
        prop_assert!(e <= super::sack::receiver::MAX_WINDOW);
        // Strictly above RCV.NXT and not touching the previous range.
        prop_assert!(s > prev_end || (i == 0 && s > 0));
        prev_end = e;
        sum += (e - s) as u64;
    }
    prop_assert_eq!(sum, m.held_bytes() as u64);
    prop_assert!(m.range_count() <= cfg.max_ranges);
    prop_assert!(m.held_bytes() <= cfg.max_bytes);
    Ok(())
}

/// Structural invariants of the scoreboard.
fn check_board(b: &Scoreboard) -> Result<(), TestCaseError> {
    let base = b.high_ack();
    let span = b.outstanding();
    let mut prev_end = None;
    let mut sum = 0u64;
    for r in b.sacked() {
        let (s, e) = (r.start.since(base), r.end.since(base));
        prop_assert!(
            s < e && e <= span,
            "SACKed range {:?} outside the send window",
            r
        );
        if let Some(p) = prev_end {
            prop_assert!(s > p, "ranges overlap or touch");
        }
        prev_end = Some(e);
        sum += (e - s) as u64;
    }
    prop_assert_eq!(sum, b.sacked_bytes() as u64);
    prop_assert!(b.sacked().count() <= b.config().max_ranges);
    prop_assert!(b.pipe() as u64 <= 2 * span as u64);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Segments in a 4 KiB space from a random start (wraparound included) against a
    /// bitmap model: RCV.NXT is the first missing octet, the ranges are the model's runs.
    #[test]
    fn reassembly_matches_model(
        start in any::<u32>(),
        segs in prop::collection::vec((0u32..4096, 1u32..600), 1..80),
    ) {
        let cfg = ReassemblyConfig { max_ranges: 1024, max_bytes: 1 << 20 };
        let mut m = Reassembly::new(Seq(start), cfg);
        let mut have = vec![false; 4096 + 600];
        for (off, len) in segs {
            // The window's right edge stays at start + 4096.
            let win = 4096 - m.rcv_nxt().since(Seq(start));
            let r = m.insert(Seq(start).wrapping_add(off), len, win);
            if let Received::Accepted { stored, .. } = r {
                let s = stored.start.since(Seq(start)) as usize;
                for h in &mut have[s..s + stored.len() as usize] {
                    *h = true;
                }
                prop_assert!(stored.end.since(Seq(start)) <= 4096);
            }
            check_reassembly(&m, &cfg)?;
            let nxt = have.iter().position(|h| !h).unwrap_or(have.len());
            prop_assert_eq!(m.rcv_nxt().since(Seq(start)) as usize, nxt);
            let runs: Vec<(usize, usize)> = {
                let mut v = Vec::new();
                let mut i = nxt;
                while i < have.len() {
                    if have[i] {
                        let j = have[i..].iter().position(|h| !h).map_or(have.len(), |p| i + p);
                        v.push((i, j));
                        i = j;
                    } else {
                        i += 1;
                    }
                }
                v
            };
            let got: Vec<(usize, usize)> = m
                .ranges()
                .map(|b| (b.start.since(Seq(start)) as usize, b.end.since(Seq(start)) as usize))
                .collect();
            prop_assert_eq!(got, runs);
        }
    }

    /// Any segment at all (hostile numbers, tiny bounds): no panic, bounds hold, and the
    /// SACK option names only held ranges plus at most one DSACK block first.
    #[test]
    fn reassembly_hostile_segments_bounded(
        start in any::<u32>(),
        segs in prop::collection::vec((any::<u32>(), any::<u32>(), any::<u32>()), 1..200),
        max_ranges in 1usize..8,
        max_bytes in 1u32..20_000,
        max_blocks in 0usize..6,
    ) {
        let cfg = ReassemblyConfig { max_ranges, max_bytes };
        let mut m = Reassembly::new(Seq(start), cfg);
        for (seq, len, win) in segs {
            // Half the segments land near RCV.NXT so the map actually fills.
            let seq = if seq % 2 == 0 { m.rcv_nxt().wrapping_add(seq % 50_000) } else { Seq(seq) };
            let _ = m.insert(seq, len % 3000, win);
            check_reassembly(&m, &cfg)?;
            let dsack = m.dsack_pending();
            let blocks = m.sack_blocks(max_blocks);
            prop_assert!(blocks.len() <= max_blocks.clamp(1, 4));
            let held: Vec<SackBlock> = m.ranges().collect();
            for (i, b) in blocks.iter().enumerate() {
                if i == 0 && dsack {
                    continue;
                }
                prop_assert!(held.contains(&b), "block {:?} not held", b);
            }
        }
    }

    /// Hostile ACKs and SACK blocks against a sender with random outstanding data:
    /// nothing outside HighACK..SND.NXT is ever recorded, the work per ACK is bounded
    /// by construction, and NextSeg only names octets inside the window.
    #[test]
    fn scoreboard_hostile_acks_stay_in_window(
        iss in any::<u32>(),
        sent in 1u32..200_000,
        acks in prop::collection::vec(
            (any::<u32>(), prop::collection::vec((any::<u32>(), any::<u32>()), 0..5), any::<bool>()),
            1..100,
        ),
        max_ranges in 1usize..32,
    ) {
        let cfg = ScoreboardConfig { smss: 1000, dup_thresh: 3, max_ranges };
        let mut b = Scoreboard::new(Seq(iss), cfg);
        b.on_send_new(Seq(iss).wrapping_add(sent));
        for (ack, blocks, near) in acks {
            let una = b.high_ack();
            let span = b.outstanding().max(1);
            // Mix plausible (inside the window) and arbitrary numbers.
            let pick = |x: u32| if near { una.wrapping_add(x % (span + 2000)).wrapping_sub(1000) } else { Seq(x) };
            let ack = if near { una.wrapping_add(ack % (span + 1)) } else { Seq(ack) };
            let mut l = SackList::new();
            for (s, e) in blocks {
                l.push(SackBlock::new(pick(s), pick(e)));
            }
            let info = b.on_ack(ack, &l);
            prop_assert!(info.rejected as usize <= l.len());
            check_board(&b)?;
            if info.enter_recovery {
                if let Some(seg) = b.enter_recovery() {
                    prop_assert!(seg.end.since(b.high_ack()) <= b.outstanding());
                }
            }
            match b.next_seg(0) {
                NextSeg::Retransmit(s) | NextSeg::Rescue(s) => {
                    prop_assert!(!s.is_empty());
                    prop_assert!(s.len() <= 1000);
                    prop_assert!(s.end.since(b.high_ack()) <= b.outstanding());
                    prop_assert!(!b.is_sacked(s.start));
                }
                NextSeg::NewData(_) => prop_assert!(false, "no new data was offered"),
                NextSeg::Nothing => {}
            }
            if ack.since(una) <= span && near && b.outstanding() == 0 {
                b.on_send_new(b.snd_nxt().wrapping_add(5000));
            }
        }
    }

    /// RACK with random sends, retransmissions and hostile SACKs: no panic, records stay
    /// ordered, lost segments are never SACKed ones, and the reorder timer is bounded by
    /// RACK.rtt + reo_wnd.
    #[test]
    fn rack_random_events_consistent(
        iss in any::<u32>(),
        events in prop::collection::vec((0u8..4, any::<u32>(), any::<u32>()), 1..200),
    ) {
        let mut r = Rack::new(RackConfig { max_segments: 64, ..RackConfig::default() });
        let mut snd_nxt = Seq(iss);
        let mut una = Seq(iss);
        let mut now = Instant::ZERO;
        for (kind, a, b) in events {
            now += Duration::from_micros((a % 5000) as u64);
            match kind {
                0 => {
                    let len = 1 + a % 1500;
                    if r.on_send(SackBlock::new(snd_nxt, snd_nxt.wrapping_add(len)), now) {
                        snd_nxt = snd_nxt.wrapping_add(len);
                    }
                }
                1 => {
                    let span = snd_nxt.since(una).max(1);
                    let s = una.wrapping_add(a % span);
                    r.on_retransmit(SackBlock::new(s, s.wrapping_add(b % 3000)), now);
                }
                2 => {
                    let span = snd_nxt.since(una);
                    let ack = if b % 3 == 0 { Seq(b) } else { una.wrapping_add(b % (span + 1)) };
                    if ack.since(una) <= span {
                        una = ack;
                    }
                    let blocks = [SackBlock::new(Seq(a), Seq(b)),
                        SackBlock::new(una.wrapping_add(a % 4000), una.wrapping_add(a % 4000 + b % 4000))];
                    r.on_ack(now, ack, &blocks, a % 7 == 0, None, Some(Duration::from_millis(1)));
                }
                _ => {
                    let wnd = Duration::from_micros((a % 10_000) as u64);
                    let scan = r.detect_loss(now, wnd);
                    if let Some(t) = scan.reorder_timeout {
                        prop_assert!(t <= r.rack_rtt() + wnd);
                    }
                }
            }
            let mut prev: Option<SackBlock> = None;
            for s in r.segments() {
                prop_assert!(!(s.lost && s.sacked));
                if let Some(p) = prev {
                    prop_assert!(s.range.start.after_eq(p.end));
                }
                prev = Some(s.range);
            }
            prop_assert!(r.segments().count() <= 64);
        }
    }

    /// Any samples, timeouts and clock values: the RTO stays within its floor and ceiling
    /// and nothing panics; the PTO never exceeds the pending RTO.
    #[test]
    fn rto_and_pto_within_bounds(
        events in prop::collection::vec((any::<u64>(), any::<i64>(), 0u8..3), 1..100),
        rto_left in any::<u64>(),
        ack_delay in any::<u64>(),
    ) {
        let cfg = RttConfig::default();
        let mut e = RttEstimator::new(cfg).unwrap();
        for (us, t, kind) in events {
            match kind {
                0 => e.on_timeout(),
                1 => e.on_syn_timed_out_established(),
                _ => e.on_sample(Duration::from_micros(us), Instant::from_micros(t)),
            }
            let rto = e.rto();
            prop_assert!(rto >= cfg.min_rto && rto <= cfg.max_rto, "{}", rto);
            let left = Duration::from_micros(rto_left);
            let pto = Tlp::pto(e.srtt(), us % 2 == 0, Some(Duration::from_micros(ack_delay)), Some(left));
            prop_assert!(pto <= left);
        }
    }
}
