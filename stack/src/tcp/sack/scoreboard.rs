//! The sender's SACK scoreboard and its loss-recovery rules (RFC 6675): Update(),
//! IsLost(), SetPipe(), NextSeg(), DupAcks and RecoveryPoint, with RFC 2883 DSACK
//! detection. A peer can send any blocks: each ACK costs at most 4 blocks × the bounded
//! range count, and nothing outside `HighACK..HighData` is ever recorded.

use super::{SackBlock, SackList};
use crate::tcp::seq::Seq;

/// Parameters of the scoreboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreboardConfig {
    /// Sender maximum segment size (octets).
    pub smss: u32,
    /// DupThresh (RFC 6675 §2: 3).
    pub dup_thresh: u32,
    /// Most disjoint SACKed ranges recorded; blocks beyond are ignored (SACK is advisory).
    pub max_ranges: usize,
}

impl Default for ScoreboardConfig {
    fn default() -> Self {
        ScoreboardConfig {
            smss: 1448,
            dup_thresh: 3,
            max_ranges: 256,
        }
    }
}

/// What one ACK told the scoreboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckInfo {
    /// The ACK lay outside `HighACK..=HighData` and was ignored.
    pub ignored: bool,
    /// Octets newly acknowledged cumulatively.
    pub acked: u32,
    /// Octets newly SACKed.
    pub newly_sacked: u32,
    /// A duplicate ACK in RFC 6675 §2's sense: no cumulative progress, and SACK blocks that
    /// cover octets not SACKed before. Payload-carrying ACKs count too.
    pub dup_ack: bool,
    /// The DSACK block (RFC 2883 §4: the first block, below the cumulative ACK or inside
    /// the second block).
    pub dsack: Option<SackBlock>,
    /// Blocks refused: empty, reversed, longer than the send window, or outside
    /// `HighACK..=HighData`, or beyond `max_ranges`.
    pub rejected: u8,
    /// RFC 6675 §5 (2): enter loss recovery now (call [`Scoreboard::enter_recovery`]).
    pub enter_recovery: bool,
    /// RFC 6675 §5 (A): this ACK covered RecoveryPoint; recovery ended.
    pub recovery_ended: bool,
}

/// What to send next in recovery (RFC 6675 §4 NextSeg()).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextSeg {
    /// Rule (1): retransmit a lost segment (or rule (3), one not yet deemed lost).
    Retransmit(SackBlock),
    /// Rule (2): send up to this many octets of new data from HighData.
    NewData(u32),
    /// Rule (4): the rescue retransmission (HighRxt is not advanced).
    Rescue(SackBlock),
    /// Rule (5): nothing.
    Nothing,
}

/// Which octets of `HighACK..HighData` the peer has SACKed, and RFC 6675's state.
#[derive(Debug, Clone)]
pub struct Scoreboard {
    cfg: ScoreboardConfig,
    high_ack: Seq,
    high_data: Seq,
    /// One past HighRxt (HighRxt is RFC 6675's highest retransmitted octet).
    rxt_end: Seq,
    rescue_rxt: Option<Seq>,
    /// One past RecoveryPoint, while in loss recovery.
    recovery_end: Option<Seq>,
    after_rto: bool,
    dup_acks: u32,
    /// Sorted, disjoint, non-adjacent, all inside `high_ack..high_data`.
    sacked: Vec<(Seq, Seq)>,
    sacked_bytes: u32,
    /// Ranges an outside detector (RACK) declared lost; sorted, disjoint, bounded.
    marked_lost: Vec<(Seq, Seq)>,
    rejected_total: u64,
}

impl Scoreboard {
    /// An empty scoreboard; `iss_next` is ISS + 1 (SND.UNA = SND.NXT).
    pub fn new(iss_next: Seq, cfg: ScoreboardConfig) -> Self {
        let cfg = ScoreboardConfig {
            smss: cfg.smss.max(1),
            dup_thresh: cfg.dup_thresh.max(1),
            max_ranges: cfg.max_ranges.max(1),
        };
        Scoreboard {
            cfg,
            high_ack: iss_next,
            high_data: iss_next,
            rxt_end: iss_next,
            rescue_rxt: None,
            recovery_end: None,
            after_rto: false,
            dup_acks: 0,
            sacked: Vec::new(),
            sacked_bytes: 0,
            marked_lost: Vec::new(),
            rejected_total: 0,
        }
    }

    /// HighACK (SND.UNA).
    pub fn high_ack(&self) -> Seq {
        self.high_ack
    }
    /// One past HighData (SND.NXT).
    pub fn snd_nxt(&self) -> Seq {
        self.high_data
    }
    /// Octets outstanding (`SND.NXT - SND.UNA`, the FlightSize of RFC 5681).
    pub fn outstanding(&self) -> u32 {
        self.high_data.since(self.high_ack)
    }
    /// Octets SACKed and not yet cumulatively acknowledged.
    pub fn sacked_bytes(&self) -> u32 {
        self.sacked_bytes
    }
    /// The SACKed ranges in sequence order.
    pub fn sacked(&self) -> impl Iterator<Item = SackBlock> + '_ {
        self.sacked.iter().map(|&(s, e)| SackBlock::new(s, e))
    }
    /// The DupAcks counter.
    pub fn dup_acks(&self) -> u32 {
        self.dup_acks
    }
    /// Whether loss recovery is running.
    pub fn in_recovery(&self) -> bool {
        self.recovery_end.is_some()
    }
    /// Blocks refused over the scoreboard's life.
    pub fn rejected_total(&self) -> u64 {
        self.rejected_total
    }
    /// The configuration.
    pub fn config(&self) -> &ScoreboardConfig {
        &self.cfg
    }

    /// New data `SND.NXT..end` was sent: HighData advances (RFC 6675 §5 (C.4)).
    pub fn on_send_new(&mut self, end: Seq) {
        let span = end.since(self.high_ack);
        if span <= super::receiver::MAX_WINDOW && end.after(self.high_data) {
            self.high_data = end;
        }
    }

    /// Octets `range` were retransmitted by a decision made elsewhere (e.g. RACK marked
    /// them lost): HighRxt advances over them (RFC 6675 §5 (C.3)) so [`Self::pipe`]
    /// counts the retransmission. Ranges outside `HighACK..SND.NXT` are ignored.
    pub fn on_retransmit(&mut self, range: SackBlock) {
        let e = range.end.since(self.high_ack);
        if e <= self.outstanding() && range.end.after(self.rxt_end_now()) {
            self.rxt_end = range.end;
        }
    }

    /// An outside loss detector (RACK, RFC 8985 §6.2) declared `range` lost: IsLost() holds
    /// for it and [`Self::pipe`] stops counting its original transmission (RFC 8985 §9.1:
    /// RACK's marks feed the pipe). Ranges outside `HighACK..SND.NXT`, or beyond
    /// `max_ranges` marks, are ignored.
    pub fn mark_lost(&mut self, range: SackBlock) {
        let s = range.start.since(self.high_ack);
        let e = range.end.since(self.high_ack);
        if range.is_empty() || s >= e || e > self.outstanding() {
            return;
        }
        let off = |x: Seq| x.since(self.high_ack);
        let lo = self.marked_lost.partition_point(|r| off(r.1) < s);
        let hi = self.marked_lost.partition_point(|r| off(r.0) <= e);
        if lo == hi && self.marked_lost.len() >= self.cfg.max_ranges {
            return;
        }
        let ms = self.marked_lost[lo..hi]
            .first()
            .map_or(s, |r| off(r.0).min(s));
        let me = self.marked_lost[lo..hi]
            .last()
            .map_or(e, |r| off(r.1).max(e));
        let merged = (
            self.high_ack.wrapping_add(ms),
            self.high_ack.wrapping_add(me),
        );
        self.marked_lost.splice(lo..hi, [merged]);
    }

    fn marked_overlap(&self, s: Seq, e: Seq) -> u32 {
        let base = self.high_ack;
        let (s, e) = (s.since(base), e.since(base));
        self.marked_lost
            .iter()
            .map(|r| {
                let (a, z) = (r.0.since(base).max(s), r.1.since(base).min(e));
                z.saturating_sub(a)
            })
            .sum()
    }

    /// Whether `seq` has been SACKed.
    pub fn is_sacked(&self, seq: Seq) -> bool {
        let o = seq.since(self.high_ack);
        let i = self
            .sacked
            .partition_point(|r| r.1.since(self.high_ack) <= o);
        self.sacked
            .get(i)
            .is_some_and(|r| r.0.since(self.high_ack) <= o)
    }

    fn lost_by(&self, count: usize, bytes: u64) -> bool {
        count >= self.cfg.dup_thresh as usize
            || bytes > (self.cfg.dup_thresh as u64 - 1) * self.cfg.smss as u64
    }

    /// IsLost(SeqNum) (RFC 6675 §4): DupThresh discontiguous SACKed ranges above it, or
    /// more than (DupThresh − 1) × SMSS SACKed octets above it. After an RTO every
    /// un-SACKed octet below RecoveryPoint counts as lost (§5.1).
    pub fn is_lost(&self, seq: Seq) -> bool {
        let o = seq.since(self.high_ack);
        if o >= self.outstanding() || self.is_sacked(seq) {
            return false;
        }
        if self.after_rto && self.recovery_end.is_some_and(|r| seq.before(r)) {
            return true;
        }
        if self.marked_overlap(seq, seq.wrapping_add(1)) > 0 {
            return true;
        }
        self.is_lost_by_sacks(seq)
    }

    /// The un-SACKed holes with their loss verdict: `(start, end, lost)`, lowest first
    /// (at most ranges + 1 of them).
    fn holes(&self) -> Vec<(Seq, Seq, bool)> {
        let rto_lost = |s: Seq| self.after_rto && self.recovery_end.is_some_and(|r| s.before(r));
        let mut out = Vec::with_capacity(self.sacked.len() + 1);
        let mut count = 0usize;
        let mut bytes = 0u64;
        let mut top = self.high_data;
        for &(s, e) in self.sacked.iter().rev() {
            if e != top {
                out.push((e, top, self.lost_by(count, bytes) || rto_lost(e)));
            }
            count += 1;
            bytes += e.since(s) as u64;
            top = s;
        }
        if top != self.high_ack {
            out.push((
                self.high_ack,
                top,
                self.lost_by(count, bytes) || rto_lost(self.high_ack),
            ));
        }
        out.reverse();
        if let (true, Some(r)) = (self.after_rto, self.recovery_end) {
            // A hole across RecoveryPoint: only its part below is lost by the RTO rule.
            if let Some(i) = out.iter().position(|h| h.0.before(r) && r.before(h.1)) {
                let (hs, he, _) = out[i];
                let above = self.is_lost_by_sacks(r);
                out[i] = (hs, r, true);
                out.insert(i + 1, (r, he, above));
            }
        }
        out
    }

    fn is_lost_by_sacks(&self, seq: Seq) -> bool {
        let o = seq.since(self.high_ack);
        let mut count = 0;
        let mut bytes = 0u64;
        for &(s, e) in self.sacked.iter().rev() {
            if e.since(self.high_ack) <= o + 1 {
                break;
            }
            count += 1;
            bytes += e.since(s.max_seq(seq.wrapping_add(1))) as u64;
        }
        self.lost_by(count, bytes)
    }

    /// SetPipe() (RFC 6675 §4): octets believed in the network — each un-SACKed octet
    /// counts once if not lost and once more if retransmitted (at or below HighRxt).
    pub fn pipe(&self) -> u32 {
        let rxt_end = self.rxt_end_now();
        if self.sacked.is_empty() && self.marked_lost.is_empty() && !self.after_rto {
            // Nothing SACKed or marked (loss-free): one hole HighACK..HighData, not lost
            // (no SACKed octets above it), counted once plus its retransmitted part. The
            // same sum as the general walk below, without building the hole list (pipe is
            // asked several times per ACK).
            if self.high_data == self.high_ack {
                return 0;
            }
            let mut pipe = u64::from(self.high_data.since(self.high_ack));
            if self.high_ack.before(rxt_end) {
                pipe += u64::from(rxt_end.min_seq(self.high_data).since(self.high_ack));
            }
            return pipe.min(u32::MAX as u64) as u32;
        }
        let mut pipe = 0u64;
        for (s, e, lost) in self.holes() {
            let len = e.since(s) as u64;
            if !lost {
                pipe += len - self.marked_overlap(s, e) as u64;
            }
            if s.before(rxt_end) {
                pipe += rxt_end.min_seq(e).since(s) as u64;
            }
        }
        pipe.min(u32::MAX as u64) as u32
    }

    fn rxt_end_now(&self) -> Seq {
        if self.rxt_end.before(self.high_ack) {
            self.high_ack
        } else {
            self.rxt_end
        }
    }

    /// Update() (RFC 6675 §4) plus the cumulative ACK: process an ACK up to `ack` with
    /// its SACK blocks (at most the first 4 are read).
    pub fn on_ack(&mut self, ack: Seq, blocks: &SackList) -> AckInfo {
        let mut info = AckInfo::default();
        let ack_off = ack.since(self.high_ack);
        if ack_off > self.outstanding() {
            // Old (reordered) or beyond SND.NXT: RFC 9293 §3.10.7.4 ignores it.
            info.ignored = true;
            return info;
        }
        // At most four blocks: copied to the stack (no allocation per ACK).
        let mut arr = [SackBlock::new(ack, ack); 4];
        let mut n = 0;
        for b in blocks.iter().take(4) {
            arr[n] = b;
            n += 1;
        }
        let list = &arr[..n];
        let mut first = 0;
        if let Some(b0) = list.first() {
            // RFC 2883 §4: DSACK when the first block is at or below the cumulative ACK, or
            // inside the second block. Plausibility: no longer than the send window span.
            let below = b0.end.before_eq(ack) && !b0.is_empty();
            let inside = list.get(1).is_some_and(|b1| b1.contains_block(b0)) && !b0.is_empty();
            if (below || inside) && b0.len() <= super::receiver::MAX_WINDOW {
                let plausible_below = !below || ack.since(b0.start) <= super::receiver::MAX_WINDOW;
                if plausible_below {
                    info.dsack = Some(*b0);
                    first = 1;
                }
            }
        }
        if ack_off > 0 {
            info.acked = ack_off;
            self.high_ack = ack;
            // HighRxt never lags HighACK: a HighRxt left at ISS would, once 2^31 octets
            // have been acknowledged, compare as ahead of HighACK in sequence space, and
            // the pipe and NextSeg would take the whole window for retransmitted.
            if self.rxt_end.before(ack) {
                self.rxt_end = ack;
            }
            self.dup_acks = 0;
            self.trim_below(ack);
        }
        for b in &list[first..] {
            match self.add_block(*b) {
                Some(n) => info.newly_sacked += n,
                None => info.rejected += 1,
            }
        }
        self.rejected_total += info.rejected as u64;
        if ack_off == 0 && info.newly_sacked > 0 {
            info.dup_ack = true;
            self.dup_acks = self.dup_acks.saturating_add(1);
        }
        if let Some(r) = self.recovery_end {
            if ack.after_eq(r) {
                self.recovery_end = None;
                self.after_rto = false;
                self.rescue_rxt = None;
                info.recovery_ended = true;
            }
        }
        if !self.in_recovery() && self.outstanding() > 0 && self.sacked_bytes > 0 {
            info.enter_recovery =
                self.dup_acks >= self.cfg.dup_thresh || self.is_lost(self.high_ack);
        }
        info
    }

    fn trim_below(&mut self, ack: Seq) {
        let base = ack;
        let mut removed = 0u32;
        let before = self.sacked.len();
        // Ranges are ordered; those wholly at or below the ACK go, one may be cut.
        let mut keep_from = 0;
        for (i, r) in self.sacked.iter_mut().enumerate() {
            if r.1.before_eq(base) {
                removed += r.1.since(r.0);
                keep_from = i + 1;
            } else {
                if r.0.before(base) {
                    removed += base.since(r.0);
                    r.0 = base;
                }
                break;
            }
        }
        self.sacked.drain(..keep_from.min(before));
        self.sacked_bytes -= removed;
        self.marked_lost.retain_mut(|r| {
            if r.1.before_eq(base) {
                return false;
            }
            if r.0.before(base) {
                r.0 = base;
            }
            true
        });
    }

    /// Record one block; `None` when refused, else the octets it added.
    fn add_block(&mut self, b: SackBlock) -> Option<u32> {
        let span = self.outstanding();
        let s = b.start.since(self.high_ack);
        let e = b.end.since(self.high_ack);
        if b.is_empty() || s >= e || e > span {
            // Reversed, empty, wrapping, below the ACK or past SND.NXT.
            return None;
        }
        let off = |x: Seq| x.since(self.high_ack);
        let lo = self.sacked.partition_point(|r| off(r.1) < s);
        let hi = self.sacked.partition_point(|r| off(r.0) <= e);
        if lo == hi && self.sacked.len() >= self.cfg.max_ranges {
            return None;
        }
        let mut covered = 0u32;
        for r in &self.sacked[lo..hi] {
            let (a, z) = (off(r.0).max(s), off(r.1).min(e));
            if a < z {
                covered += z - a;
            }
        }
        let ms = self.sacked[lo..hi].first().map_or(s, |r| off(r.0).min(s));
        let me = self.sacked[lo..hi].last().map_or(e, |r| off(r.1).max(e));
        let merged = (
            self.high_ack.wrapping_add(ms),
            self.high_ack.wrapping_add(me),
        );
        self.sacked.splice(lo..hi, [merged]);
        let new = (e - s) - covered;
        self.sacked_bytes += new;
        Some(new)
    }

    /// RFC 6675 §5 (4): enter loss recovery. RecoveryPoint = HighData; returns the
    /// segment to retransmit first (from HighACK, up to SMSS or the next SACKed octet),
    /// recorded as retransmitted (HighRxt). The caller halves cwnd (RFC 5681 / 6937).
    pub fn enter_recovery(&mut self) -> Option<SackBlock> {
        if !self.begin_recovery() {
            return None;
        }
        let seg = self.segment_from(self.high_ack, self.first_sacked_after(self.high_ack));
        self.rxt_end = seg.end;
        Some(seg)
    }

    /// Start loss recovery without choosing a retransmission (when RACK, RFC 8985, decides
    /// what is lost): RecoveryPoint = HighData. `false` when nothing is outstanding.
    pub fn begin_recovery(&mut self) -> bool {
        if self.outstanding() == 0 {
            return false;
        }
        self.recovery_end = Some(self.high_data);
        self.rescue_rxt = None;
        true
    }

    fn first_sacked_after(&self, s: Seq) -> Seq {
        let o = s.since(self.high_ack);
        self.sacked
            .iter()
            .find(|r| r.0.since(self.high_ack) > o)
            .map_or(self.high_data, |r| r.0)
    }

    fn segment_from(&self, s: Seq, limit: Seq) -> SackBlock {
        let len = limit.since(s).min(self.cfg.smss);
        SackBlock::new(s, s.wrapping_add(len))
    }

    /// RFC 6675 §5.1: a retransmission timeout. RecoveryPoint = HighData, HighRxt
    /// restarts at HighACK, and every un-SACKed octet below RecoveryPoint counts as lost,
    /// so NextSeg() walks the holes from HighACK again.
    pub fn on_rto(&mut self) {
        if self.outstanding() == 0 {
            return;
        }
        self.recovery_end = Some(self.high_data);
        self.after_rto = true;
        self.rxt_end = self.high_ack;
        self.rescue_rxt = None;
        self.dup_acks = 0;
    }

    /// NextSeg() (RFC 6675 §4), committing the choice: a retransmission advances HighRxt
    /// (§5 (C.3)), a rescue sets RescueRxt. `new_data` is how many octets of new data the
    /// application has queued and the receive window allows (rule (2)). Call it only when
    /// cwnd − pipe ≥ 1 SMSS, and send what it returns.
    pub fn next_seg(&mut self, new_data: u32) -> NextSeg {
        let rxt_end = self.rxt_end_now();
        let highest_sacked = self.sacked.last().map(|r| r.1);
        let holes = self.holes();
        let below_sack = |s: Seq| {
            highest_sacked.is_some_and(|h| s.before(h))
                || (self.after_rto && self.recovery_end.is_some_and(|r| s.before(r)))
        };
        let candidate = |want_lost: bool| {
            for &(s, e, lost) in &holes {
                if want_lost && !lost {
                    continue;
                }
                // (1.a) S2 > HighRxt
                let start = if s.before(rxt_end) { rxt_end } else { s };
                if !start.before(e) || !below_sack(start) {
                    continue;
                }
                return Some(self.segment_from(start, e));
            }
            None
        };
        if let Some(seg) = candidate(true) {
            self.rxt_end = seg.end;
            return NextSeg::Retransmit(seg);
        }
        if new_data > 0 {
            return NextSeg::NewData(new_data.min(self.cfg.smss));
        }
        if let Some(seg) = candidate(false) {
            self.rxt_end = seg.end;
            return NextSeg::Retransmit(seg);
        }
        // Rule (4): one rescue retransmission per recovery, of the highest un-SACKed octet.
        if let Some(rp) = self.recovery_end {
            let allowed = self.rescue_rxt.is_none_or(|r| self.high_ack.after(r));
            if allowed {
                if let Some(&(s, e, _)) = holes.last() {
                    let len = e.since(s).min(self.cfg.smss);
                    self.rescue_rxt = Some(rp);
                    return NextSeg::Rescue(SackBlock::new(e.wrapping_sub(len), e));
                }
            }
        }
        NextSeg::Nothing
    }
}

#[cfg(test)]
mod tests;
