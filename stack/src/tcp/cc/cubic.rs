//! CUBIC's window function (RFC 9438 §4), in octets. The controller (`super::Controller`)
//! decides when congestion avoidance runs; this keeps W_max, K, the epoch and the
//! Reno-friendly estimate W_est.

use smoltcp::time::{Duration, Instant};

use super::MAX_CWND;

/// RFC 9438 §5.1: C = 0.4 (segments per second³).
pub(super) const C: f64 = 0.4;
/// RFC 9438 §5.1: β_cubic = 0.7.
pub(super) const BETA: f64 = 0.7;
/// RFC 9438 §4.3: α_cubic = 3·(1 − β)/(1 + β).
pub(super) const ALPHA: f64 = 3.0 * (1.0 - BETA) / (1.0 + BETA);

/// `octets · β_cubic`, rounded down.
pub(super) fn beta_times(octets: u32) -> u32 {
    (f64::from(octets) * BETA) as u32
}

/// One congestion-avoidance epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Epoch {
    /// When the epoch began (shifted forward by app-limited periods, RFC 9438 §5.8).
    pub start: Instant,
    /// cwnd_epoch (octets).
    pub cwnd_epoch: f64,
    /// K (seconds), RFC 9438 (2).
    pub k: f64,
    /// W_est (octets), RFC 9438 §4.3.
    pub w_est: f64,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Cubic {
    /// W_max (octets): the window before the last reduction; 0 before any.
    w_max: f64,
    /// cwnd_prior (octets): cwnd when ssthresh was last set.
    cwnd_prior: f64,
    epoch: Option<Epoch>,
    /// The next epoch follows a timeout: W_max = cwnd at its start (RFC 9438 §4.8).
    after_timeout: bool,
    /// Since when ACKs have said app-limited.
    app_limited_since: Option<Instant>,
    /// Fraction of an octet of growth not yet applied.
    carry: f64,
}

fn secs(d_micros: i64) -> f64 {
    d_micros as f64 / 1e6
}

impl Cubic {
    pub(super) fn w_max_bytes(&self) -> u32 {
        self.w_max.clamp(0.0, f64::from(MAX_CWND)) as u32
    }

    #[cfg(test)]
    pub(super) fn epoch(&self) -> Option<Epoch> {
        self.epoch
    }

    /// W_cubic(t) in octets, RFC 9438 (1): C·(t − K)³ + W_max, with C scaled by the MSS.
    pub(super) fn w_cubic(&self, t: f64, k: f64, mss: u32) -> f64 {
        C * f64::from(mss) * (t - k).powi(3) + self.w_max
    }

    /// RFC 9438 §4.6–4.7: a congestion event at window `cwnd` (before the reduction).
    pub(super) fn on_congestion(&mut self, cwnd: u32) {
        let cwnd = f64::from(cwnd);
        // §4.7 fast convergence: a flow whose window shrank since the last event releases
        // bandwidth to newer flows.
        self.w_max = if cwnd < self.w_max {
            cwnd * (1.0 + BETA) / 2.0
        } else {
            cwnd
        };
        self.cwnd_prior = cwnd;
        self.after_timeout = false;
        self.epoch = None;
        self.carry = 0.0;
    }

    /// RFC 9438 §4.8: a timeout at window `cwnd`.
    pub(super) fn on_timeout(&mut self, cwnd: u32) {
        self.cwnd_prior = f64::from(cwnd);
        self.after_timeout = true;
        self.epoch = None;
        self.carry = 0.0;
    }

    /// The connection restarts after idleness: the next ACK in congestion avoidance starts a
    /// new epoch from the restart window.
    pub(super) fn on_idle_restart(&mut self) {
        self.epoch = None;
        self.carry = 0.0;
    }

    /// Start an epoch at `now` with `cwnd` (RFC 9438 §4.2: K from W_max and cwnd_epoch;
    /// §4.3: W_est = cwnd_epoch; §4.8: after a timeout W_max = cwnd_epoch).
    pub(super) fn begin_epoch(&mut self, now: Instant, cwnd: u32, mss: u32) {
        let cwnd = f64::from(cwnd);
        // §4.8: after a timeout W_max = cwnd_epoch. Likewise when congestion avoidance starts
        // without any congestion event (HyStart++ ended slow start): K = 0, so the window
        // grows from cwnd along the convex curve instead of W_max = 0's steep one.
        if self.after_timeout || self.w_max <= 0.0 {
            self.after_timeout = false;
            self.w_max = cwnd;
        }
        let k = ((self.w_max - cwnd) / f64::from(mss.max(1)) / C).cbrt();
        self.epoch = Some(Epoch {
            start: now,
            cwnd_epoch: cwnd,
            k,
            w_est: cwnd,
        });
        self.carry = 0.0;
        self.app_limited_since = None;
    }

    /// An app-limited ACK: no growth, and the time does not count in `t` (RFC 9438 §5.8).
    pub(super) fn on_app_limited(&mut self, now: Instant) {
        if self.app_limited_since.is_none() {
            self.app_limited_since = Some(now);
        }
    }

    /// A cwnd-limited ACK: an app-limited period that just ended shifts the epoch start.
    pub(super) fn on_cwnd_limited(&mut self, now: Instant) {
        if let Some(since) = self.app_limited_since.take() {
            if let Some(e) = self.epoch.as_mut() {
                let gap = now
                    .total_micros()
                    .saturating_sub(since.total_micros())
                    .max(0);
                e.start = Instant::from_micros(e.start.total_micros().saturating_add(gap));
            }
        }
    }

    /// Congestion avoidance: `acked` new octets at `cwnd`; returns the new cwnd. RFC 9438
    /// §4.2–4.5: target = W_cubic(t + RTT) clamped to [cwnd, 1.5·cwnd], cwnd +=
    /// (target − cwnd)/cwnd per acknowledged segment, unless W_cubic(t) < W_est (the
    /// Reno-friendly region, §4.3), where cwnd = W_est.
    pub(super) fn on_ack(
        &mut self,
        now: Instant,
        acked: u32,
        cwnd: u32,
        mss: u32,
        rtt: Duration,
    ) -> u32 {
        if self.epoch.is_none() {
            self.begin_epoch(now, cwnd, mss);
        }
        let Some(mut e) = self.epoch else {
            return cwnd;
        };
        let cwnd_f = f64::from(cwnd.max(1));
        let mss_f = f64::from(mss.max(1));
        let acked_f = f64::from(acked);
        let t = secs(
            now.total_micros()
                .saturating_sub(e.start.total_micros())
                .max(0),
        );
        let rtt_s = secs(rtt.total_micros().min(i64::MAX as u64) as i64);
        // §4.3: W_est grows by α_cubic segments per window of acknowledged segments;
        // α = 1 once W_est has reached cwnd_prior.
        let alpha = if e.w_est >= self.cwnd_prior {
            1.0
        } else {
            ALPHA
        };
        e.w_est += alpha * mss_f * acked_f / cwnd_f;
        self.epoch = Some(e);
        let new = if self.w_cubic(t, e.k, mss) < e.w_est {
            // §4.3 Reno-friendly region.
            self.carry = 0.0;
            e.w_est.max(cwnd_f)
        } else {
            // §4.4 concave (cwnd < W_max) and §4.5 convex (cwnd ≥ W_max) regions.
            let target = self
                .w_cubic(t + rtt_s, e.k, mss)
                .clamp(cwnd_f, 1.5 * cwnd_f);
            let grow = (target - cwnd_f) * acked_f / cwnd_f + self.carry;
            let whole = grow.floor();
            self.carry = grow - whole;
            cwnd_f + whole
        };
        new.clamp(f64::from(mss.max(1)), f64::from(MAX_CWND)) as u32
    }
}
