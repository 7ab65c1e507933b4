//! HyStart++ (RFC 9406): leave the initial slow start when the RTT starts to rise (the
//! queue is filling), through Conservative Slow Start (CSS), instead of overshooting until
//! the queue overflows.
//!
//! Rounds are counted in delivered octets: a round ends when everything in flight at its
//! start has been delivered (RFC 9406's `windowEnd = SND.NXT`, without sequence numbers).

use smoltcp::time::Duration;

/// RFC 9406 §4.3 constants.
pub(super) const MIN_RTT_THRESH: Duration = Duration::from_millis(4);
pub(super) const MAX_RTT_THRESH: Duration = Duration::from_millis(16);
pub(super) const MIN_RTT_DIVISOR: u64 = 8;
pub(super) const N_RTT_SAMPLE: u32 = 8;
pub(super) const CSS_GROWTH_DIVISOR: u32 = 4;
pub(super) const CSS_ROUNDS: u32 = 5;

/// Where slow start stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Standard slow start, watching the RTT.
    SlowStart,
    /// Conservative Slow Start: growth divided by CSS_GROWTH_DIVISOR.
    Css,
    /// HyStart++ is over: CSS ran CSS_ROUNDS rounds, set ssthresh, congestion avoidance.
    Done,
}

/// What the controller should do after an ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Grow by the slow-start increase.
    SlowStart,
    /// Grow by the slow-start increase / CSS_GROWTH_DIVISOR.
    Css,
    /// Set ssthresh = cwnd: congestion avoidance from now on.
    EnterCongestionAvoidance,
}

#[derive(Debug, Clone)]
pub(super) struct HyStart {
    phase: Phase,
    delivered_total: u64,
    round_end: u64,
    last_round_min: Option<Duration>,
    current_round_min: Option<Duration>,
    samples: u32,
    css_baseline: Option<Duration>,
    css_rounds: u32,
}

impl HyStart {
    pub(super) fn new() -> HyStart {
        HyStart {
            phase: Phase::SlowStart,
            delivered_total: 0,
            round_end: 0,
            last_round_min: None,
            current_round_min: None,
            samples: 0,
            css_baseline: None,
            css_rounds: 0,
        }
    }

    pub(super) fn phase(&self) -> Phase {
        self.phase
    }

    /// An ACK in the initial slow start delivered `delivered` octets, with `flight_size`
    /// octets still outstanding and an RTT sample `rtt`.
    pub(super) fn on_ack(
        &mut self,
        delivered: u32,
        flight_size: u32,
        rtt: Option<Duration>,
    ) -> Verdict {
        if self.phase == Phase::Done {
            return Verdict::SlowStart;
        }
        self.delivered_total = self.delivered_total.saturating_add(u64::from(delivered));
        if self.delivered_total >= self.round_end {
            // RFC 9406 §4.2: a new round.
            self.last_round_min = self.current_round_min;
            self.current_round_min = None;
            self.samples = 0;
            self.round_end = self.delivered_total.saturating_add(u64::from(flight_size));
            if self.phase == Phase::Css {
                self.css_rounds += 1;
                if self.css_rounds >= CSS_ROUNDS {
                    self.phase = Phase::Done;
                    return Verdict::EnterCongestionAvoidance;
                }
            }
        }
        if let Some(r) = rtt {
            self.current_round_min = Some(self.current_round_min.map_or(r, |m| m.min(r)));
            self.samples = self.samples.saturating_add(1);
        }
        if self.samples >= N_RTT_SAMPLE {
            match (self.phase, self.current_round_min, self.last_round_min) {
                (Phase::SlowStart, Some(cur), Some(last)) => {
                    let thresh = Duration::from_micros(
                        (last.total_micros() / MIN_RTT_DIVISOR)
                            .clamp(MIN_RTT_THRESH.total_micros(), MAX_RTT_THRESH.total_micros()),
                    );
                    if cur >= last + thresh {
                        self.phase = Phase::Css;
                        self.css_baseline = Some(cur);
                        self.css_rounds = 0;
                    }
                }
                (Phase::Css, Some(cur), _) if self.css_baseline.is_some_and(|b| cur < b) => {
                    // The exit was spurious: back to slow start.
                    self.phase = Phase::SlowStart;
                    self.css_baseline = None;
                }
                _ => {}
            }
        }
        match self.phase {
            Phase::Css => Verdict::Css,
            _ => Verdict::SlowStart,
        }
    }
}
