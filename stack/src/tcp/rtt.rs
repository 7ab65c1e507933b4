//! Round-trip time estimation and the retransmission timeout (RFC 6298), with RTT samples
//! taken by Karn's rule (RFC 6298 §3) or from echoed timestamps (RFC 7323 §4).
//!
//! Sans-IO: every call that needs the time takes it as an argument.

use super::seq::Seq;
use smoltcp::time::{Duration, Instant};

/// Limits of the RTO computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttConfig {
    /// RTO before any RTT sample (RFC 6298 §2.1: 1 s).
    pub initial_rto: Duration,
    /// Floor of the RTO. RFC 6298 §2.4 says 1 s; Linux uses 200 ms (`TCP_RTO_MIN`), the
    /// default here.
    pub min_rto: Duration,
    /// Ceiling of the RTO, backoff included (RFC 6298 §2.5: at least 60 s if used; Linux
    /// `TCP_RTO_MAX` is 120 s, the default here).
    pub max_rto: Duration,
    /// Clock granularity G (RFC 6298 §2): the least variance term of the RTO.
    pub granularity: Duration,
    /// Window of the minimum-RTT filter (used by RACK, RFC 8985 §6.2 step 1).
    pub min_rtt_window: Duration,
}

impl Default for RttConfig {
    fn default() -> Self {
        RttConfig {
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(120),
            granularity: Duration::from_millis(1),
            min_rtt_window: Duration::from_secs(10),
        }
    }
}

/// Why an [`RttConfig`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RttConfigError {
    /// `min_rto` is zero.
    ZeroFloor,
    /// `max_rto` is below `min_rto`, or `initial_rto` outside `min_rto..=max_rto`.
    BadBounds,
}

impl std::fmt::Display for RttConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RttConfigError::ZeroFloor => write!(f, "min_rto must be above zero"),
            RttConfigError::BadBounds => {
                write!(f, "need min_rto <= initial_rto <= max_rto")
            }
        }
    }
}

impl std::error::Error for RttConfigError {}

impl RttConfig {
    /// Check the bounds.
    pub fn validate(&self) -> Result<(), RttConfigError> {
        if self.min_rto == Duration::ZERO {
            return Err(RttConfigError::ZeroFloor);
        }
        if self.max_rto < self.min_rto
            || self.initial_rto < self.min_rto
            || self.initial_rto > self.max_rto
        {
            return Err(RttConfigError::BadBounds);
        }
        Ok(())
    }
}

/// SRTT, RTTVAR and the RTO of one connection (RFC 6298 §2), the backoff (§5.5) and a
/// windowed minimum RTT.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    cfg: RttConfig,
    /// Smoothed RTT and variance in microseconds; `None` before the first sample.
    srtt_us: Option<u64>,
    rttvar_us: u64,
    /// The RTO without backoff, in microseconds.
    base_rto_us: u64,
    backoff: u32,
    latest: Option<Duration>,
    min_rtt: Option<(Duration, Instant)>,
}

const K: u64 = 4;

impl RttEstimator {
    /// A fresh estimator: RTO = `initial_rto` (RFC 6298 §2.1). Fails on a bad config.
    pub fn new(cfg: RttConfig) -> Result<Self, RttConfigError> {
        cfg.validate()?;
        Ok(RttEstimator {
            cfg,
            srtt_us: None,
            rttvar_us: 0,
            base_rto_us: cfg.initial_rto.total_micros(),
            backoff: 0,
            latest: None,
            min_rtt: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RttConfig {
        &self.cfg
    }

    /// Feed one RTT measurement R taken at `now` (RFC 6298 §2.2 for the first, §2.3 for
    /// later ones). A valid sample also ends any backoff (the RTO is recomputed from the
    /// estimate, RFC 6298 §5.7 note and Karn's algorithm).
    pub fn on_sample(&mut self, rtt: Duration, now: Instant) {
        let r = rtt.total_micros().min(u64::MAX / 16);
        match self.srtt_us {
            None => {
                // (2.2) SRTT <- R, RTTVAR <- R/2
                self.srtt_us = Some(r);
                self.rttvar_us = r / 2;
            }
            Some(srtt) => {
                // (2.3) RTTVAR <- (1 - beta) * RTTVAR + beta * |SRTT - R'|, beta = 1/4
                //       SRTT <- (1 - alpha) * SRTT + alpha * R', alpha = 1/8
                let delta = srtt.abs_diff(r);
                self.rttvar_us = (3 * self.rttvar_us + delta) / 4;
                self.srtt_us = Some((7 * srtt + r) / 8);
            }
        }
        let srtt = self.srtt_us.unwrap_or(r);
        // RTO <- SRTT + max(G, K * RTTVAR), then clamped (2.4, 2.5)
        let var = (K * self.rttvar_us).max(self.cfg.granularity.total_micros());
        self.base_rto_us = srtt.saturating_add(var).clamp(
            self.cfg.min_rto.total_micros(),
            self.cfg.max_rto.total_micros(),
        );
        self.backoff = 0;
        self.latest = Some(rtt);
        let window = self.cfg.min_rtt_window;
        self.min_rtt = match self.min_rtt {
            Some((m, at)) if m <= rtt && elapsed(at, now) < window => Some((m, at)),
            _ => Some((rtt, now)),
        };
    }

    /// The RTO to arm now: the base RTO doubled once per backoff, capped at `max_rto`.
    pub fn rto(&self) -> Duration {
        let shifted = if self.backoff >= 40 {
            u64::MAX
        } else {
            self.base_rto_us.saturating_mul(1u64 << self.backoff)
        };
        Duration::from_micros(shifted.min(self.cfg.max_rto.total_micros()))
    }

    /// The retransmission timer expired (RFC 6298 §5.5: RTO <- RTO * 2, "back off the
    /// timer"), bounded by `max_rto`.
    pub fn on_timeout(&mut self) {
        if self.rto() < self.cfg.max_rto {
            self.backoff += 1;
        }
    }

    /// How many times the RTO is backed off.
    pub fn backoff(&self) -> u32 {
        self.backoff
    }

    /// RFC 6298 §5.7: the SYN (or SYN-ACK) was retransmitted after a timeout and no RTT
    /// sample exists: once the connection is established, the RTO is 3 s. Kept within
    /// `min_rto..=max_rto`.
    pub fn on_syn_timed_out_established(&mut self) {
        if self.srtt_us.is_none() {
            self.base_rto_us = 3_000_000u64.clamp(
                self.cfg.min_rto.total_micros(),
                self.cfg.max_rto.total_micros(),
            );
            self.backoff = 0;
        }
    }

    /// SRTT, once sampled.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt_us.map(Duration::from_micros)
    }

    /// RTTVAR (zero before the first sample).
    pub fn rttvar(&self) -> Duration {
        Duration::from_micros(self.rttvar_us)
    }

    /// The last sample.
    pub fn latest(&self) -> Option<Duration> {
        self.latest
    }

    /// The least sample within the last `min_rtt_window` (restarted from the newest sample
    /// when the minimum ages out).
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt.map(|(m, _)| m)
    }
}

/// The retransmission timer of RFC 6298 §5: a deadline, started, restarted and stopped by
/// the rules there. The caller polls [`RtoTimer::expired`] with its clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RtoTimer {
    deadline: Option<Instant>,
}

impl RtoTimer {
    /// A stopped timer.
    pub fn new() -> Self {
        Self::default()
    }

    /// When it fires, if running.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// (5.1) A segment with data (or SYN/FIN) was sent: start the timer if it is not
    /// running.
    pub fn on_send(&mut self, now: Instant, est: &RttEstimator) {
        if self.deadline.is_none() {
            self.deadline = Some(now + est.rto());
        }
    }

    /// (5.2) everything outstanding is acknowledged: stop; (5.3) an ACK acknowledged new
    /// data: restart so that it expires after RTO.
    pub fn on_ack(&mut self, now: Instant, est: &RttEstimator, acked_new: bool, all_acked: bool) {
        if all_acked {
            self.deadline = None;
        } else if acked_new {
            self.deadline = Some(now + est.rto());
        }
    }

    /// Whether it has fired at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }

    /// (5.4)–(5.6) on expiry: the caller retransmits the earliest unacknowledged segment;
    /// this backs the RTO off (5.5) and restarts the timer with it (5.6).
    pub fn on_expired(&mut self, now: Instant, est: &mut RttEstimator) {
        est.on_timeout();
        self.deadline = Some(now + est.rto());
    }

    /// Stop (the connection closed or the caller re-arms another way).
    pub fn stop(&mut self) {
        self.deadline = None;
    }
}

/// Karn's rule (RFC 6298 §3, "Karn's algorithm"): times one segment at a time and takes no
/// sample from an ACK that covers a retransmission.
#[derive(Debug, Clone, Default)]
pub struct KarnSampler {
    timed: Option<(Seq, Instant)>,
}

impl KarnSampler {
    /// A sampler timing nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A segment ending at `end` (exclusive) was sent for the first time at `now`. Starts
    /// timing it unless a segment is timed already.
    pub fn on_send(&mut self, end: Seq, now: Instant) {
        if self.timed.is_none() {
            self.timed = Some((end, now));
        }
    }

    /// Something was retransmitted: the timed segment's ACK would be ambiguous, so stop
    /// timing (RFC 6298 §3: "MUST NOT" sample retransmitted segments).
    pub fn on_retransmit(&mut self) {
        self.timed = None;
    }

    /// A cumulative ACK up to `ack` arrived at `now`: the RTT of the timed segment, if it
    /// is covered now.
    pub fn on_ack(&mut self, ack: Seq, now: Instant) -> Option<Duration> {
        let (end, sent) = self.timed?;
        if end.before_eq(ack) {
            self.timed = None;
            Some(elapsed(sent, now))
        } else {
            None
        }
    }

    /// Whether a segment is being timed.
    pub fn is_timing(&self) -> bool {
        self.timed.is_some()
    }
}

/// `now - then`, zero when the clock went backwards.
pub(crate) fn elapsed(then: Instant, now: Instant) -> Duration {
    Duration::from_micros(
        now.total_micros()
            .saturating_sub(then.total_micros())
            .max(0) as u64,
    )
}

/// The TSval clock of RFC 7323: milliseconds since an origin, modulo 2^32.
#[derive(Debug, Clone, Copy)]
pub struct TsClock {
    origin: Instant,
}

impl TsClock {
    /// A clock whose TSval is 0 at `origin` (pick a random offset per connection if the
    /// values should not leak uptime; the caller adds it).
    pub fn new(origin: Instant) -> Self {
        TsClock { origin }
    }

    /// The TSval to send at `now`.
    pub fn tsval(&self, now: Instant) -> u32 {
        (now.total_millis().wrapping_sub(self.origin.total_millis())) as u32
    }

    /// RFC 7323 §4.1/§4.2: the RTT sample from the TSecr of an ACK that acknowledges new
    /// data (the caller checks that: §4.3, only ACKs that advance the left edge of the send
    /// window are measured, which keeps delayed ACKs from inflating the sample). `None`
    /// when TSecr lies in the future or more than 2^31 ms back (a bogus echo), or is 0 on an
    /// ACK that has no timestamp echo at all (the caller passes `None` then).
    pub fn rtt_from_tsecr(&self, now: Instant, tsecr: u32) -> Option<Duration> {
        let d = self.tsval(now).wrapping_sub(tsecr);
        if d >= 1 << 31 {
            return None;
        }
        Some(Duration::from_millis(d as u64))
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
    fn est() -> RttEstimator {
        RttEstimator::new(RttConfig::default()).unwrap()
    }

    #[test]
    fn rfc6298_2_1_initial_rto_one_second() {
        let e = est();
        assert_eq!(e.rto(), ms(1000));
        assert_eq!(e.srtt(), None);
    }

    #[test]
    fn rfc6298_2_2_first_sample_sets_srtt_and_half_rttvar() {
        let mut e = est();
        e.on_sample(ms(100), at(0));
        assert_eq!(e.srtt(), Some(ms(100)));
        assert_eq!(e.rttvar(), ms(50));
        // RTO = 100 + 4 * 50 = 300 ms
        assert_eq!(e.rto(), ms(300));
    }

    #[test]
    fn rfc6298_2_3_rto_after_second_sample() {
        let mut e = est();
        e.on_sample(ms(100), at(0));
        e.on_sample(ms(200), at(10));
        // RTTVAR = 3/4 * 50 + 1/4 * |100 - 200| = 62.5; SRTT = 7/8 * 100 + 1/8 * 200 = 112.5
        assert_eq!(e.rttvar(), Duration::from_micros(62_500));
        assert_eq!(e.srtt(), Some(Duration::from_micros(112_500)));
        assert_eq!(e.rto(), Duration::from_micros(112_500 + 250_000));
    }

    #[test]
    fn rfc6298_2_granularity_bounds_variance_term() {
        let cfg = RttConfig {
            min_rto: Duration::from_micros(1),
            granularity: ms(10),
            ..RttConfig::default()
        };
        let mut e = RttEstimator::new(cfg).unwrap();
        for i in 0..200 {
            e.on_sample(ms(50), at(i));
        }
        // RTTVAR decays towards 0; the RTO stays at SRTT + G.
        assert_eq!(e.rto(), ms(60));
    }

    #[test]
    fn rfc6298_2_4_rto_floor_linux_200ms_default() {
        let mut e = est();
        e.on_sample(ms(1), at(0));
        assert_eq!(e.rto(), ms(200));
        let mut e = RttEstimator::new(RttConfig {
            min_rto: ms(10),
            ..RttConfig::default()
        })
        .unwrap();
        e.on_sample(ms(1), at(0));
        assert_eq!(e.rto(), ms(10));
    }

    #[test]
    fn rfc6298_2_5_rto_ceiling() {
        let mut e = est();
        e.on_sample(Duration::from_secs(1000), at(0));
        assert_eq!(e.rto(), Duration::from_secs(120));
    }

    #[test]
    fn rfc6298_5_5_backoff_doubles_up_to_cap() {
        let mut e = est();
        e.on_sample(ms(100), at(0)); // RTO 300 ms
        e.on_timeout();
        assert_eq!(e.rto(), ms(600));
        e.on_timeout();
        assert_eq!(e.rto(), ms(1200));
        for _ in 0..100 {
            e.on_timeout();
        }
        assert_eq!(e.rto(), Duration::from_secs(120));
        assert!(e.backoff() < 20, "backoff stops growing at the cap");
    }

    #[test]
    fn rfc6298_5_7_new_sample_collapses_backoff() {
        let mut e = est();
        e.on_sample(ms(100), at(0));
        e.on_timeout();
        e.on_timeout();
        e.on_sample(ms(100), at(1));
        assert_eq!(e.backoff(), 0);
        assert!(e.rto() < ms(600));
    }

    #[test]
    fn rfc6298_5_7_syn_timeout_rto_three_seconds() {
        let mut e = est();
        e.on_timeout();
        e.on_syn_timed_out_established();
        assert_eq!(e.rto(), ms(3000));
        // Not once a sample exists.
        let mut e = est();
        e.on_sample(ms(100), at(0));
        e.on_syn_timed_out_established();
        assert_eq!(e.rto(), ms(300));
    }

    #[test]
    fn rfc6298_3_karn_no_sample_from_retransmitted_segment() {
        let mut k = KarnSampler::new();
        k.on_send(Seq(1000), at(0));
        k.on_retransmit();
        assert_eq!(k.on_ack(Seq(1000), at(50)), None);
        // A new first transmission is timed again.
        k.on_send(Seq(2000), at(60));
        assert!(k.is_timing());
        assert_eq!(k.on_ack(Seq(1500), at(70)), None);
        assert_eq!(k.on_ack(Seq(2000), at(90)), Some(ms(30)));
        assert!(!k.is_timing());
    }

    #[test]
    fn rfc6298_3_karn_one_timed_segment_across_wraparound() {
        let mut k = KarnSampler::new();
        k.on_send(Seq(5), at(0)); // segment [u32::MAX - 100, 5)
        k.on_send(Seq(900), at(1)); // ignored: one timed at a time
        assert_eq!(k.on_ack(Seq(u32::MAX), at(5)), None);
        assert_eq!(k.on_ack(Seq(5), at(7)), Some(ms(7)));
    }

    #[test]
    fn rfc7323_4_rtt_from_echoed_timestamp() {
        let c = TsClock::new(at(1_000));
        let tsval = c.tsval(at(1_250));
        assert_eq!(tsval, 250);
        assert_eq!(c.rtt_from_tsecr(at(1_290), tsval), Some(ms(40)));
        // An echo from the future is refused.
        assert_eq!(c.rtt_from_tsecr(at(1_290), tsval + 100), None);
        // The clock wraps without panicking.
        let c = TsClock::new(at(0));
        let t = Instant::from_millis((1i64 << 32) + 3);
        assert_eq!(c.tsval(t), 3);
        assert_eq!(c.rtt_from_tsecr(t, u32::MAX), Some(ms(4)));
    }

    #[test]
    fn rfc6298_5_1_timer_started_on_send_if_not_running() {
        let e = est();
        let mut t = RtoTimer::new();
        t.on_send(at(0), &e);
        t.on_send(at(500), &e);
        assert_eq!(t.deadline(), Some(at(1000)));
    }

    #[test]
    fn rfc6298_5_2_timer_stopped_when_all_acked() {
        let e = est();
        let mut t = RtoTimer::new();
        t.on_send(at(0), &e);
        t.on_ack(at(10), &e, true, true);
        assert_eq!(t.deadline(), None);
        assert!(!t.expired(at(5000)));
    }

    #[test]
    fn rfc6298_5_3_timer_restarted_on_new_ack() {
        let mut e = est();
        e.on_sample(ms(100), at(0)); // RTO 300 ms
        let mut t = RtoTimer::new();
        t.on_send(at(0), &e);
        t.on_ack(at(200), &e, true, false);
        assert_eq!(t.deadline(), Some(at(500)));
        // A duplicate ACK does not restart it.
        t.on_ack(at(400), &e, false, false);
        assert_eq!(t.deadline(), Some(at(500)));
    }

    #[test]
    fn rfc6298_5_5_5_6_expiry_backs_off_and_restarts() {
        let mut e = est();
        e.on_sample(ms(100), at(0));
        let mut t = RtoTimer::new();
        t.on_send(at(0), &e);
        assert!(t.expired(at(300)) && !t.expired(at(299)));
        t.on_expired(at(300), &mut e);
        assert_eq!(t.deadline(), Some(at(900)));
        t.on_expired(at(900), &mut e);
        assert_eq!(t.deadline(), Some(at(2100)));
    }

    #[test]
    fn config_rejects_bad_bounds() {
        let bad = RttConfig {
            min_rto: ms(500),
            initial_rto: ms(100),
            ..RttConfig::default()
        };
        assert_eq!(
            RttEstimator::new(bad).unwrap_err(),
            RttConfigError::BadBounds
        );
        let zero = RttConfig {
            min_rto: Duration::ZERO,
            ..RttConfig::default()
        };
        assert_eq!(zero.validate(), Err(RttConfigError::ZeroFloor));
    }

    #[test]
    fn min_rtt_windowed() {
        let mut e = est();
        e.on_sample(ms(10), at(0));
        e.on_sample(ms(30), at(100));
        assert_eq!(e.min_rtt(), Some(ms(10)));
        e.on_sample(ms(30), at(20_000));
        assert_eq!(e.min_rtt(), Some(ms(30)));
    }
}
