//! RACK-TLP (RFC 8985): time-based loss detection from per-segment transmit times, and the
//! Tail Loss Probe.
//!
//! [`Rack`] keeps one record per transmitted segment (the sender's transmission units, in
//! sequence order, `SND.UNA..SND.NXT`). The sender feeds it sends, retransmissions and
//! ACKs whose SACK blocks it has validated (e.g. through the
//! [`Scoreboard`](super::sack::Scoreboard)); [`Rack::detect_loss`] marks segments lost and
//! says when to look again. [`Tlp`] computes the probe timeout and what to probe with.

use super::rtt::elapsed;
use super::sack::SackBlock;
use super::seq::Seq;
use smoltcp::time::{Duration, Instant};
use std::collections::VecDeque;

/// RFC 8985 constants the sender may tune.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RackConfig {
    /// DupThresh (RFC 8985 §6.2: 3), for the "reordering not seen" rule of the window.
    pub dup_thresh: u32,
    /// Loss recoveries a DSACK-widened reorder window persists (RFC 8985 §6.2: 16).
    pub reo_wnd_persist: u32,
    /// Most segment records kept; a send beyond it is refused ([`Rack::on_send`]).
    pub max_segments: usize,
}

impl Default for RackConfig {
    fn default() -> Self {
        RackConfig {
            dup_thresh: 3,
            reo_wnd_persist: 16,
            max_segments: 1 << 16,
        }
    }
}

/// One transmitted segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRecord {
    /// Its octets.
    pub range: SackBlock,
    /// When it was last (re)transmitted.
    pub xmit_ts: Instant,
    /// Transmission order of that (re)transmission: a counter over every send of the
    /// connection, the tie-break of [`sent_after`] for sends in the same clock tick.
    pub xmit_order: u64,
    /// Whether it was ever retransmitted.
    pub retransmitted: bool,
    /// Whether it was SACKed (cumulatively acknowledged ones are dropped).
    pub sacked: bool,
    /// Marked lost and not retransmitted since.
    pub lost: bool,
}

/// The result of one pass of [`Rack::detect_loss`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LossScan {
    /// Segments newly marked lost.
    pub newly_lost: u32,
    /// When to run detection again (the RACK reordering timer), if some segment may be
    /// lost only after its reorder window passes.
    pub reorder_timeout: Option<Duration>,
}

/// `t1, o1` was sent after `t2, o2` (RFC 8985 §6.2, RACK_sent_after).
///
/// The RFC breaks a tie of equal transmit times by sequence number, a stand-in for the
/// order of sending that holds for new data only: a retransmission of low sequence sent
/// after a new segment in the same clock tick would compare as sent *before* it, so the new
/// segment's delivery would mark the retransmission lost at once (RACK.rtt ≈ 0 since they
/// left together), again on every such ACK. Each send gets a transmission order instead
/// (`o1`, `o2`: increasing with every send and retransmission), which orders new data by
/// sequence exactly as the RFC does and a retransmission after everything sent before it.
fn sent_after(t1: Instant, o1: u64, t2: Instant, o2: u64) -> bool {
    t1 > t2 || (t1 == t2 && o1 > o2)
}

/// A delivered record as step 2/3 read it: (transmit time, order, end, retransmitted).
type Delivered = (Instant, u64, Seq, bool);

/// RACK's per-connection state (RFC 8985 §6.1) and the segment records.
#[derive(Debug, Clone)]
pub struct Rack {
    cfg: RackConfig,
    segs: VecDeque<SegmentRecord>,
    /// RACK.xmit_ts: the most recently sent segment known delivered, and its
    /// transmission order (the tie-break of [`sent_after`], in place of RACK.end_seq).
    xmit_ts: Option<Instant>,
    xmit_order: u64,
    /// The next send's transmission order.
    next_order: u64,
    /// Records marked lost and not retransmitted since (so that "anything lost?" is O(1)).
    lost_count: u32,
    /// Scratch for one ACK's delivered records (kept to avoid an allocation per ACK).
    delivered: Vec<Delivered>,
    /// RACK.rtt: the RTT of that segment.
    rtt: Duration,
    /// RACK.fack: the highest end delivered.
    fack: Option<Seq>,
    reordering_seen: bool,
    reo_wnd_mult: u32,
    reo_wnd_persist: u32,
    dsack_round: Option<Seq>,
    segs_sacked: u32,
    snd_nxt: Seq,
}

impl Rack {
    /// No segment sent yet.
    pub fn new(cfg: RackConfig) -> Self {
        Rack {
            cfg,
            segs: VecDeque::new(),
            xmit_ts: None,
            xmit_order: 0,
            next_order: 0,
            lost_count: 0,
            delivered: Vec::new(),
            rtt: Duration::ZERO,
            fack: None,
            reordering_seen: false,
            reo_wnd_mult: 1,
            reo_wnd_persist: 0,
            dsack_round: None,
            segs_sacked: 0,
            snd_nxt: Seq(0),
        }
    }

    /// The segment records, lowest first.
    pub fn segments(&self) -> impl Iterator<Item = &SegmentRecord> {
        self.segs.iter()
    }

    /// Segments marked lost and not retransmitted since: what to retransmit now.
    pub fn lost(&self) -> impl Iterator<Item = SackBlock> + '_ {
        let any = self.lost_count > 0;
        self.segs
            .iter()
            .take_while(move |_| any)
            .filter(|s| s.lost)
            .map(|s| s.range)
    }

    /// How many segments are marked lost and not retransmitted since.
    pub fn lost_count(&self) -> u32 {
        self.lost_count
    }

    fn order(&mut self) -> u64 {
        self.next_order += 1;
        self.next_order
    }

    /// The highest-sequence segment not yet delivered (what a TLP retransmits, §7.3).
    pub fn last_undelivered(&self) -> Option<SackBlock> {
        self.segs.iter().rev().find(|s| !s.sacked).map(|s| s.range)
    }

    /// RACK.rtt (zero before the first delivery).
    pub fn rack_rtt(&self) -> Duration {
        self.rtt
    }

    /// Whether reordering was observed (RACK.reordering_seen).
    pub fn reordering_seen(&self) -> bool {
        self.reordering_seen
    }

    /// RACK.reo_wnd_mult.
    pub fn reo_wnd_mult(&self) -> u32 {
        self.reo_wnd_mult
    }

    /// A new segment `range` left at `now`. `false` (nothing recorded) when it is empty,
    /// does not follow the last record, or `max_segments` are held.
    pub fn on_send(&mut self, range: SackBlock, now: Instant) -> bool {
        if range.is_empty() || range.len() > super::sack::receiver::MAX_WINDOW {
            return false;
        }
        if let Some(last) = self.segs.back() {
            if !range.start.after_eq(last.range.end) {
                return false;
            }
        }
        if self.segs.len() >= self.cfg.max_segments {
            return false;
        }
        let xmit_order = self.order();
        self.segs.push_back(SegmentRecord {
            range,
            xmit_ts: now,
            xmit_order,
            retransmitted: false,
            sacked: false,
            lost: false,
        });
        self.snd_nxt = range.end;
        true
    }

    fn index_of(&self, seq: Seq) -> Option<usize> {
        let base = self.segs.front()?.range.start;
        let o = seq.since(base);
        let i = self.segs.partition_point(|s| s.range.end.since(base) <= o);
        (i < self.segs.len() && self.segs[i].range.start.since(base) <= o).then_some(i)
    }

    /// Every record overlapping `range` was retransmitted at `now` (segments are resent
    /// whole; a partial overlap counts for the whole record). Returns how many.
    pub fn on_retransmit(&mut self, range: SackBlock, now: Instant) -> u32 {
        let Some(mut i) = self.index_of(range.start) else {
            return 0;
        };
        let mut n = 0;
        let order = self.order();
        while i < self.segs.len() && self.segs[i].range.start.before(range.end) {
            let s = &mut self.segs[i];
            if !s.sacked {
                s.xmit_ts = now;
                s.xmit_order = order;
                s.retransmitted = true;
                if s.lost {
                    s.lost = false;
                    self.lost_count -= 1;
                }
                n += 1;
            }
            i += 1;
        }
        n
    }

    /// RFC 8985 §6.2 steps 2–4 for an ACK at `now`: cumulative ACK `ack`, the validated
    /// SACK blocks (no DSACK block among them), whether it carried a DSACK, and
    /// `ts_echo`: the send time of the TSval its TSecr echoes, when timestamps are on.
    /// `min_rtt` is the connection's minimum RTT (for the step 2 ambiguity check).
    ///
    /// Returns an RTT sample in microseconds from the recorded send time of the most
    /// recently sent never-retransmitted segment this ACK delivered (cumulatively or by
    /// SACK): Karn-safe (RFC 6298 §3), and finer than the echoed timestamp's milliseconds.
    pub fn on_ack(
        &mut self,
        now: Instant,
        ack: Seq,
        sacked: &[SackBlock],
        dsack: bool,
        ts_echo: Option<Instant>,
        min_rtt: Option<Duration>,
    ) -> Option<Duration> {
        let mut delivered = std::mem::take(&mut self.delivered);
        delivered.clear();
        // Cumulatively acknowledged records leave.
        while let Some(front) = self.segs.front() {
            if !front.range.end.before_eq(ack) {
                break;
            }
            let s = self.segs.pop_front().expect("front exists");
            if s.lost {
                self.lost_count -= 1;
            }
            if s.sacked {
                self.segs_sacked = self.segs_sacked.saturating_sub(1);
            } else {
                delivered.push((s.xmit_ts, s.xmit_order, s.range.end, s.retransmitted));
            }
        }
        // Fully SACKed records are delivered (at most 4 blocks, each a bounded walk).
        for b in sacked.iter().take(4) {
            let Some(front) = self.segs.front() else {
                break;
            };
            let base = front.range.start;
            // Only blocks inside what is outstanding (a caller's validation may be looser).
            if b.is_empty() || b.end.since(base) > self.snd_nxt.since(base) {
                continue;
            }
            // The first record starting at or after the block's left edge.
            let mut i = if b.start.before(base) {
                0
            } else {
                let o = b.start.since(base);
                self.segs.partition_point(|s| s.range.start.since(base) < o)
            };
            while i < self.segs.len() && b.contains_block(&self.segs[i].range) {
                let s = &mut self.segs[i];
                if !s.sacked {
                    s.sacked = true;
                    if s.lost {
                        s.lost = false;
                        self.lost_count -= 1;
                    }
                    self.segs_sacked += 1;
                    delivered.push((s.xmit_ts, s.xmit_order, s.range.end, s.retransmitted));
                }
                i += 1;
            }
        }
        delivered.sort_unstable_by_key(|d| (d.0, d.1));
        let sample = delivered
            .iter()
            .rev()
            .find(|d| !d.3)
            .map(|d| elapsed(d.0, now));
        for &(ts, order, _, retx) in &delivered {
            // Step 2: skip ambiguous deliveries of retransmitted segments.
            if retx {
                let for_original = ts_echo.is_some_and(|e| e < ts);
                let too_fast = min_rtt.is_some_and(|m| elapsed(ts, now) < m);
                if for_original || too_fast {
                    continue;
                }
            }
            if self
                .xmit_ts
                .is_none_or(|x| sent_after(ts, order, x, self.xmit_order))
            {
                self.xmit_ts = Some(ts);
                self.xmit_order = order;
                self.rtt = elapsed(ts, now);
            }
        }
        // Step 3: reordering — a never-retransmitted segment delivered below RACK.fack.
        delivered.sort_unstable_by(|a, b| a.2.diff(b.2).cmp(&0));
        for &(_, _, end, retx) in &delivered {
            match self.fack {
                Some(f) if end.before(f) => {
                    if !retx {
                        self.reordering_seen = true;
                    }
                }
                _ => self.fack = Some(end),
            }
        }
        // Step 4: DSACK widens the window, once per round trip.
        if self.dsack_round.is_some_and(|r| ack.after_eq(r)) {
            self.dsack_round = None;
        }
        if dsack {
            // A DSACK says a retransmission was spurious: the original was reordered, not
            // lost. Counted as reordering seen (as Linux does), else the window would stay
            // 0 whenever DupThresh segments are SACKed and the widening had no effect.
            self.reordering_seen = true;
        }
        if dsack && self.dsack_round.is_none() {
            self.dsack_round = Some(self.snd_nxt);
            self.reo_wnd_mult = self.reo_wnd_mult.saturating_add(1);
            self.reo_wnd_persist = self.cfg.reo_wnd_persist;
        }
        self.delivered = delivered;
        sample
    }

    /// RFC 8985 §6.2 step 4: a fast or timeout recovery ended; after `reo_wnd_persist`
    /// of them without DSACK the window multiplier returns to 1.
    pub fn on_recovery_exit(&mut self) {
        if self.reo_wnd_persist > 0 {
            self.reo_wnd_persist -= 1;
            if self.reo_wnd_persist == 0 {
                self.reo_wnd_mult = 1;
            }
        }
    }

    /// RACK.reo_wnd (RFC 8985 §6.2 step 4): 0 while no reordering was seen and the sender
    /// is in recovery or DupThresh segments are SACKed; else `reo_wnd_mult × min_RTT / 4`,
    /// at most SRTT.
    pub fn reo_wnd(&self, min_rtt: Duration, srtt: Duration, in_recovery: bool) -> Duration {
        if !self.reordering_seen && (in_recovery || self.segs_sacked >= self.cfg.dup_thresh) {
            return Duration::ZERO;
        }
        let w = Duration::from_micros(
            (min_rtt.total_micros() / 4).saturating_mul(self.reo_wnd_mult as u64),
        );
        w.min(srtt)
    }

    /// RFC 8985 §6.2 step 5: mark lost every undelivered segment sent before RACK's
    /// segment by more than RACK.rtt + reo_wnd; for the others, the time until they
    /// would be (the reordering timer).
    pub fn detect_loss(&mut self, now: Instant, reo_wnd: Duration) -> LossScan {
        let mut scan = LossScan::default();
        let Some(rx) = self.xmit_ts else {
            return scan;
        };
        let wait = self
            .rtt
            .total_micros()
            .saturating_add(reo_wnd.total_micros())
            .min(i64::MAX as u64) as i64;
        let rx_order = self.xmit_order;
        for s in self.segs.iter_mut() {
            // Records are in sequence order, and a never-retransmitted one was sent after
            // every record before it (later ones only later still, retransmitted or not):
            // the first one sent after RACK's segment ends the candidates. Keeps the scan
            // per ACK to the records that can be lost instead of the whole flight.
            if !s.retransmitted && s.xmit_order > rx_order && s.xmit_ts >= rx {
                break;
            }
            if s.sacked || s.lost || !sent_after(rx, rx_order, s.xmit_ts, s.xmit_order) {
                continue;
            }
            let remaining = s
                .xmit_ts
                .total_micros()
                .saturating_add(wait)
                .saturating_sub(now.total_micros());
            if remaining <= 0 {
                s.lost = true;
                self.lost_count += 1;
                scan.newly_lost += 1;
            } else {
                let r = Duration::from_micros(remaining as u64);
                scan.reorder_timeout = Some(scan.reorder_timeout.map_or(r, |t: Duration| t.max(r)));
            }
        }
        scan
    }

    /// RFC 8985 §6.3 on an RTO: every undelivered segment is lost.
    pub fn on_rto(&mut self) -> u32 {
        let mut n = 0;
        for s in self.segs.iter_mut().filter(|s| !s.sacked && !s.lost) {
            s.lost = true;
            n += 1;
        }
        self.lost_count += n;
        n
    }
}

/// What to send when the probe timeout fires (RFC 8985 §7.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Send one new segment (new data is available and the window allows it).
    NewData,
    /// Retransmit this segment: the highest-sequence one sent.
    Retransmit(SackBlock),
    /// Nothing outstanding; no probe.
    Nothing,
}

/// What an ACK said about the probe in flight (RFC 8985 §7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlpVerdict {
    /// No probe in flight, or the ACK does not settle it yet.
    Pending,
    /// The probe (or the original) was delivered and nothing was lost: the probe was a
    /// retransmission that came back as a DSACK, or it carried new data.
    NoLoss,
    /// The retransmitted probe repaired a lost tail: the caller applies its congestion
    /// response (RFC 8985 §7.4.2).
    RepairedLoss,
}

/// Tail Loss Probe state (RFC 8985 §7): TLP.end_seq and TLP.is_retrans.
#[derive(Debug, Clone, Default)]
pub struct Tlp {
    end_seq: Option<Seq>,
    is_retrans: bool,
}

/// RFC 8985 §7.2 WCDelAckT: the worst-case delayed-ACK time of a peer that did not say.
pub const WC_DEL_ACK: Duration = Duration::from_millis(200);

impl Tlp {
    /// No probe in flight.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a probe is unanswered (TLP.end_seq set).
    pub fn in_flight(&self) -> bool {
        self.end_seq.is_some()
    }

    /// PTO (RFC 8985 §7.2): 2·SRTT, plus the peer's maximum ACK delay (WCDelAckT when
    /// unknown) when only one segment is in flight; 1 s without an RTT sample; never past
    /// the pending RTO (`rto_remaining`).
    pub fn pto(
        srtt: Option<Duration>,
        one_segment_in_flight: bool,
        max_ack_delay: Option<Duration>,
        rto_remaining: Option<Duration>,
    ) -> Duration {
        let mut pto = match srtt {
            Some(s) => {
                let mut p = s.total_micros().saturating_mul(2);
                if one_segment_in_flight {
                    p = p.saturating_add(max_ack_delay.unwrap_or(WC_DEL_ACK).total_micros());
                }
                Duration::from_micros(p)
            }
            None => Duration::from_secs(1),
        };
        if let Some(r) = rto_remaining {
            pto = pto.min(r);
        }
        pto
    }

    /// RFC 8985 §7.2: whether to arm the PTO (after sending new data or on an ACK that
    /// advances SND.UNA): SACK is on, data is outstanding, no recovery runs and no probe
    /// is unanswered.
    pub fn may_arm(&self, sack_enabled: bool, outstanding: bool, in_recovery: bool) -> bool {
        sack_enabled && outstanding && !in_recovery && self.end_seq.is_none()
    }

    /// RFC 8985 §7.3: the PTO fired. New data if the application has some and the peer's
    /// window allows, else the highest segment sent (`last_segment`, e.g.
    /// [`Rack::last_undelivered`]).
    pub fn on_pto(&self, new_data_sendable: bool, last_segment: Option<SackBlock>) -> Probe {
        if new_data_sendable {
            Probe::NewData
        } else if let Some(seg) = last_segment {
            Probe::Retransmit(seg)
        } else {
            Probe::Nothing
        }
    }

    /// The probe left; `snd_nxt` is SND.NXT after it (TLP.end_seq), `is_retrans` whether it
    /// was a retransmission. Arm the RTO next, not the PTO (§7.3).
    pub fn on_probe_sent(&mut self, snd_nxt: Seq, is_retrans: bool) {
        self.end_seq = Some(snd_nxt);
        self.is_retrans = is_retrans;
    }

    /// RFC 8985 §7.4: an ACK with cumulative `ack` and its DSACK block (if any).
    pub fn on_ack(&mut self, ack: Seq, dsack: Option<SackBlock>) -> TlpVerdict {
        let Some(end) = self.end_seq else {
            return TlpVerdict::Pending;
        };
        if self.is_retrans && dsack.is_some_and(|d| d.end == end) {
            // The probe was a duplicate: the original arrived. No loss.
            self.end_seq = None;
            return TlpVerdict::NoLoss;
        }
        if !self.is_retrans && ack.after_eq(end) {
            self.end_seq = None;
            return TlpVerdict::NoLoss;
        }
        // A retransmitted probe repaired a loss only when the ACK passes its end (Linux
        // tcp_process_tlp_ack): at exactly the end a DSACK may still show it was a copy.
        if self.is_retrans && ack.after(end) {
            self.end_seq = None;
            return TlpVerdict::RepairedLoss;
        }
        TlpVerdict::Pending
    }

    /// Forget the probe (an RTO fired, or recovery started).
    pub fn reset(&mut self) {
        self.end_seq = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }
    fn at(v: i64) -> Instant {
        Instant::from_millis(v)
    }
    fn blk(s: u32, e: u32) -> SackBlock {
        SackBlock::new(Seq(s), Seq(e))
    }
    /// Segments of 100 octets from 0, segment i sent at i ms.
    fn rack(n: u32) -> Rack {
        let mut r = Rack::new(RackConfig::default());
        for i in 0..n {
            assert!(r.on_send(blk(i * 100, i * 100 + 100), at(i as i64)));
        }
        r
    }

    #[test]
    fn rfc8985_6_2_step2_rack_tracks_most_recently_sent_delivered() {
        let mut r = rack(5);
        r.on_ack(at(50), Seq(0), &[blk(300, 400)], false, None, None);
        assert_eq!(r.rack_rtt(), ms(47));
        // A SACK of an earlier-sent segment does not move RACK back.
        r.on_ack(at(60), Seq(0), &[blk(100, 200)], false, None, None);
        assert_eq!(r.rack_rtt(), ms(47));
    }

    #[test]
    fn rfc8985_6_2_step2_retransmission_ambiguity_skipped() {
        let mut r = rack(3);
        r.on_retransmit(blk(0, 100), at(40));
        // Delivered 2 ms after the retransmission, with min_RTT 10 ms: it was the original.
        r.on_ack(at(42), Seq(100), &[], false, None, Some(ms(10)));
        assert_eq!(r.rack_rtt(), Duration::ZERO);
        // With timestamps: the echo names a send before the retransmission.
        let mut r = rack(3);
        r.on_retransmit(blk(0, 100), at(40));
        r.on_ack(at(60), Seq(100), &[], false, Some(at(0)), None);
        assert_eq!(r.rack_rtt(), Duration::ZERO);
        r.on_ack(at(90), Seq(200), &[], false, Some(at(1)), None);
        assert_eq!(r.rack_rtt(), ms(89));
    }

    #[test]
    fn rfc8985_6_2_step3_reordering_detected_below_fack() {
        let mut r = rack(4);
        r.on_ack(at(20), Seq(0), &[blk(200, 300)], false, None, None);
        assert!(!r.reordering_seen());
        // Segment 1 arrives late, never retransmitted: reordering.
        r.on_ack(at(21), Seq(0), &[blk(100, 300)], false, None, None);
        assert!(r.reordering_seen());
    }

    #[test]
    fn rfc8985_6_2_step4_reo_wnd_quarter_min_rtt_capped_by_srtt() {
        let mut r = rack(10);
        assert_eq!(r.reo_wnd(ms(40), ms(50), false), ms(10));
        assert_eq!(r.reo_wnd(ms(400), ms(50), false), ms(50));
        // No reordering seen and in recovery: 0.
        assert_eq!(r.reo_wnd(ms(40), ms(50), true), Duration::ZERO);
        // No reordering seen and DupThresh segments SACKed: 0.
        r.on_ack(at(20), Seq(0), &[blk(100, 400)], false, None, None);
        assert_eq!(r.reo_wnd(ms(40), ms(50), false), Duration::ZERO);
    }

    #[test]
    fn rfc8985_6_2_step4_dsack_widens_reo_wnd_once_per_round() {
        let mut r = rack(10);
        r.on_ack(at(20), Seq(100), &[], true, None, None);
        assert_eq!(r.reo_wnd_mult(), 2);
        // A second DSACK in the same round (SND.UNA below the round's SND.NXT) does not.
        r.on_ack(at(21), Seq(200), &[], true, None, None);
        assert_eq!(r.reo_wnd_mult(), 2);
        r.on_ack(at(30), Seq(1000), &[], true, None, None);
        assert_eq!(r.reo_wnd_mult(), 3);
        assert!(r.reordering_seen());
        assert_eq!(r.reo_wnd(ms(40), ms(100), false), ms(30));
    }

    #[test]
    fn rfc8985_6_2_step4_reo_wnd_mult_resets_after_16_recoveries() {
        let mut r = rack(2);
        r.on_ack(at(20), Seq(100), &[], true, None, None);
        assert_eq!(r.reo_wnd_mult(), 2);
        for _ in 0..15 {
            r.on_recovery_exit();
        }
        assert_eq!(r.reo_wnd_mult(), 2);
        r.on_recovery_exit();
        assert_eq!(r.reo_wnd_mult(), 1);
    }

    #[test]
    fn rfc8985_6_2_step5_loss_marked_after_rtt_plus_reo_wnd() {
        let mut r = rack(4); // sent at 0, 1, 2, 3 ms
        r.on_ack(at(13), Seq(0), &[blk(300, 400)], false, None, None); // RACK.rtt = 10
                                                                       // Segments 0..3 were sent before segment 3. With reo_wnd 2 ms, segment 0 is lost
                                                                       // at 0 + 10 + 2 = 12 <= 13; segment 2 (sent at 2) waits until 14.
        let scan = r.detect_loss(at(13), ms(2));
        assert_eq!(scan.newly_lost, 2);
        assert_eq!(scan.reorder_timeout, Some(ms(1)));
        assert_eq!(
            r.lost().collect::<Vec<_>>(),
            vec![blk(0, 100), blk(100, 200)]
        );
        // The reordering timer fires.
        assert_eq!(r.detect_loss(at(14), ms(2)).newly_lost, 1);
    }

    #[test]
    fn rfc8985_6_2_step5_lost_retransmission_detected() {
        let mut r = rack(4);
        r.on_ack(at(13), Seq(0), &[blk(300, 400)], false, None, None);
        r.detect_loss(at(13), Duration::ZERO);
        r.on_retransmit(blk(0, 100), at(14));
        assert_eq!(r.lost().count(), 2);
        // A segment sent after the retransmission is delivered; the retransmission is not.
        r.on_send(blk(400, 500), at(15));
        r.on_ack(at(25), Seq(0), &[blk(300, 500)], false, None, None);
        let scan = r.detect_loss(at(25), Duration::ZERO);
        assert!(r.lost().any(|b| b == blk(0, 100)), "{scan:?}");
    }

    /// RACK_sent_after with equal transmit times (an engine reads its clock once per
    /// batch): a new segment that left *before* a retransmission in the same tick does not
    /// count as sent after it, though its sequence is higher; one that left after it does.
    /// With the RFC's sequence tie-break every SACK of such a new segment marked the
    /// retransmission lost again at once (a Linux receiver answered each copy with a
    /// DSACK: the xwarp-sender collapse under loss).
    #[test]
    fn rfc8985_6_2_rack_sent_after_orders_same_tick_sends_by_transmission() {
        let mut r = Rack::new(RackConfig::default());
        for i in 0..3 {
            assert!(r.on_send(blk(i * 100, i * 100 + 100), at(0)));
        }
        // Segments 1 and 2 SACKed: 0 is lost (RACK.rtt 1 ms, no reorder window).
        r.on_ack(at(1), Seq(0), &[blk(100, 300)], false, None, None);
        assert_eq!(r.detect_loss(at(1), Duration::ZERO).newly_lost, 1);
        assert_eq!(r.lost_count(), 1);
        // One tick at 5 ms: new segment 3, the retransmission of 0, new segment 4.
        assert!(r.on_send(blk(300, 400), at(5)));
        assert_eq!(r.on_retransmit(blk(0, 100), at(5)), 1);
        assert!(r.on_send(blk(400, 500), at(5)));
        assert_eq!(r.lost_count(), 0);
        // Segment 3 (sent before the retransmission) is SACKed: nothing is lost.
        r.on_ack(at(6), Seq(0), &[blk(100, 400)], false, None, None);
        let scan = r.detect_loss(at(6), Duration::ZERO);
        assert_eq!(scan.newly_lost, 0, "{scan:?}");
        assert_eq!(r.lost().count(), 0);
        // Segment 4 (sent after it) is SACKed and the retransmission is not: lost.
        r.on_ack(at(7), Seq(0), &[blk(100, 500)], false, None, None);
        assert_eq!(r.detect_loss(at(7), Duration::ZERO).newly_lost, 1);
        assert_eq!(r.lost().collect::<Vec<_>>(), vec![blk(0, 100)]);
        // The cumulative ACK takes the record, and the lost count with it.
        r.on_ack(at(8), Seq(500), &[], false, None, None);
        assert_eq!(r.lost_count(), 0);
        assert_eq!(r.lost().count(), 0);
    }

    #[test]
    fn sack_block_starting_mid_segment_marks_the_whole_ones() {
        let mut r = rack(5);
        r.on_ack(at(20), Seq(0), &[blk(150, 420)], false, None, None);
        let sacked: Vec<u32> = r
            .segments()
            .filter(|s| s.sacked)
            .map(|s| s.range.start.0)
            .collect();
        assert_eq!(sacked, vec![200, 300]);
        // A block past SND.NXT is ignored whole.
        r.on_ack(at(21), Seq(0), &[blk(400, 900)], false, None, None);
        assert!(!r.segments().any(|s| s.range.start == Seq(400) && s.sacked));
    }

    #[test]
    fn rfc8985_6_3_rto_marks_everything_undelivered_lost() {
        let mut r = rack(4);
        r.on_ack(at(13), Seq(0), &[blk(200, 300)], false, None, None);
        assert_eq!(r.on_rto(), 3);
    }

    #[test]
    fn rfc8985_tlp_pto_two_srtt() {
        assert_eq!(Tlp::pto(Some(ms(30)), false, None, None), ms(60));
    }

    #[test]
    fn rfc8985_7_2_pto_adds_max_ack_delay_for_one_segment() {
        assert_eq!(Tlp::pto(Some(ms(30)), true, None, None), ms(260));
        assert_eq!(Tlp::pto(Some(ms(30)), true, Some(ms(25)), None), ms(85));
    }

    #[test]
    fn rfc8985_7_2_pto_one_second_without_srtt_and_capped_by_rto() {
        assert_eq!(Tlp::pto(None, false, None, None), ms(1000));
        assert_eq!(Tlp::pto(Some(ms(300)), false, None, Some(ms(250))), ms(250));
    }

    #[test]
    fn rfc8985_7_2_arm_only_outside_recovery_without_probe_in_flight() {
        let mut t = Tlp::new();
        assert!(t.may_arm(true, true, false));
        assert!(!t.may_arm(false, true, false));
        assert!(!t.may_arm(true, true, true));
        assert!(!t.may_arm(true, false, false));
        t.on_probe_sent(Seq(500), true);
        assert!(!t.may_arm(true, true, false));
    }

    #[test]
    fn rfc8985_7_3_probe_new_data_else_highest_segment() {
        let r = rack(3);
        let t = Tlp::new();
        assert_eq!(t.on_pto(true, r.last_undelivered()), Probe::NewData);
        assert_eq!(
            t.on_pto(false, r.last_undelivered()),
            Probe::Retransmit(blk(200, 300))
        );
        assert_eq!(t.on_pto(false, None), Probe::Nothing);
    }

    #[test]
    fn rfc8985_7_4_probe_dsack_means_no_loss() {
        let mut t = Tlp::new();
        t.on_probe_sent(Seq(300), true);
        assert_eq!(t.on_ack(Seq(300), Some(blk(200, 300))), TlpVerdict::NoLoss);
        assert!(!t.in_flight());
    }

    #[test]
    fn rfc8985_7_4_probe_ack_beyond_probe_end_without_dsack_repaired_loss() {
        let mut t = Tlp::new();
        t.on_probe_sent(Seq(300), true);
        assert_eq!(t.on_ack(Seq(200), None), TlpVerdict::Pending);
        assert_eq!(t.on_ack(Seq(300), None), TlpVerdict::Pending);
        assert_eq!(t.on_ack(Seq(301), None), TlpVerdict::RepairedLoss);
        let mut t = Tlp::new();
        t.on_probe_sent(Seq(400), false);
        assert_eq!(t.on_ack(Seq(400), None), TlpVerdict::NoLoss);
    }

    #[test]
    fn records_refuse_out_of_order_and_bound() {
        let mut r = Rack::new(RackConfig {
            max_segments: 2,
            ..RackConfig::default()
        });
        assert!(r.on_send(blk(0, 100), at(0)));
        assert!(!r.on_send(blk(50, 150), at(0)));
        assert!(!r.on_send(blk(100, 100), at(0)));
        assert!(r.on_send(blk(100, 200), at(0)));
        assert!(!r.on_send(blk(200, 300), at(0)));
        // A hostile SACK for nothing sent changes nothing.
        r.on_ack(at(5), Seq(0), &[blk(7000, 9000)], false, None, None);
        assert_eq!(r.segments().filter(|s| s.sacked).count(), 0);
    }
}
