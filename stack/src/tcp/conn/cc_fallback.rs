//! A small NewReno (RFC 5681, RFC 6582's recovery via the scoreboard) with Proportional
//! Rate Reduction (RFC 6937, PRR-SSRB), behind the API agreed for `tcp::cc` (written in
//! parallel on the `tcp-cc` branch). The connection uses this one until `tcp::cc` lands;
//! `Algorithm::Cubic` is accepted and runs NewReno here.

use smoltcp::time::{Duration, Instant};

/// Which congestion controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// RFC 5681 / 6582.
    NewReno,
    /// RFC 9438 (NewReno in this fallback).
    Cubic,
}

/// Controller parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcConfig {
    /// Which algorithm.
    pub algorithm: Algorithm,
    /// Sender MSS (octets).
    pub mss: u32,
    /// Initial window (octets; RFC 6928: 10 segments).
    pub initial_window: u32,
}

/// What one ACK delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckEvent {
    /// Octets newly acknowledged cumulatively.
    pub newly_acked: u32,
    /// Octets newly SACKed.
    pub newly_sacked: u32,
    /// RTT sample of this ACK.
    pub rtt: Option<Duration>,
    /// The connection's minimum RTT.
    pub min_rtt: Option<Duration>,
    /// RFC 6675 pipe after the ACK.
    pub pipe: u32,
    /// SND.NXT − SND.UNA after the ACK.
    pub flight_size: u32,
    /// The sender had nothing more to send (cwnd not the limit).
    pub app_limited: bool,
}

#[derive(Debug, Clone, Copy)]
struct Prr {
    recover_fs: u32,
    delivered: u64,
    out: u64,
    last_delivered: u32,
}

/// NewReno with PRR.
#[derive(Debug, Clone)]
pub struct Controller {
    mss: u32,
    iw: u32,
    cwnd: u32,
    ssthresh: u32,
    acked_ca: u32,
    prr: Option<Prr>,
}

impl Controller {
    /// A controller at the initial window.
    pub fn new(cfg: CcConfig) -> Self {
        let mss = cfg.mss.max(1);
        let iw = cfg.initial_window.max(mss);
        Controller {
            mss,
            iw,
            cwnd: iw,
            ssthresh: u32::MAX,
            acked_ca: 0,
            prr: None,
        }
    }
    /// Congestion window (octets).
    pub fn cwnd(&self) -> u32 {
        self.cwnd
    }
    /// Slow-start threshold (octets).
    pub fn ssthresh(&self) -> u32 {
        self.ssthresh
    }
    /// Whether fast recovery runs.
    pub fn in_recovery(&self) -> bool {
        self.prr.is_some()
    }
    /// An ACK arrived.
    pub fn on_ack(&mut self, _now: Instant, ev: &AckEvent) {
        let delivered = ev.newly_acked.saturating_add(ev.newly_sacked);
        if let Some(p) = self.prr.as_mut() {
            p.delivered += delivered as u64;
            p.last_delivered = delivered;
            return;
        }
        if ev.app_limited || ev.newly_acked == 0 {
            return;
        }
        if self.cwnd < self.ssthresh {
            // RFC 5681 §3.1 with RFC 3465's L = 2·SMSS.
            self.cwnd = self
                .cwnd
                .saturating_add(ev.newly_acked.min(2 * self.mss))
                .min(1 << 30);
        } else {
            self.acked_ca = self.acked_ca.saturating_add(ev.newly_acked);
            if self.acked_ca >= self.cwnd {
                self.acked_ca -= self.cwnd;
                self.cwnd = self.cwnd.saturating_add(self.mss).min(1 << 30);
            }
        }
    }
    /// Loss detected: fast recovery starts (ssthresh = FlightSize / 2, RFC 5681 (4.2)).
    pub fn enter_recovery(&mut self, _now: Instant, _pipe: u32, flight_size: u32) {
        self.ssthresh = (flight_size / 2).max(2 * self.mss);
        self.prr = Some(Prr {
            recover_fs: flight_size.max(1),
            delivered: 0,
            out: 0,
            last_delivered: 0,
        });
    }
    /// Recovery ended (RFC 6937: cwnd = ssthresh).
    pub fn exit_recovery(&mut self, _now: Instant) {
        if self.prr.take().is_some() {
            self.cwnd = self.ssthresh;
            self.acked_ca = 0;
        }
    }
    /// A retransmission timeout (RFC 5681 (4.1) and §3.1: cwnd = 1 SMSS).
    pub fn on_rto(&mut self, _now: Instant, flight_size: u32) {
        self.ssthresh = (flight_size / 2).max(2 * self.mss);
        self.cwnd = self.mss;
        self.prr = None;
        self.acked_ca = 0;
    }
    /// Octets left (new or retransmitted).
    pub fn on_sent(&mut self, _now: Instant, bytes: u32) {
        if let Some(p) = self.prr.as_mut() {
            p.out += bytes as u64;
        }
    }
    /// Octets that may leave now (PRR's sndcnt in recovery, else cwnd − pipe).
    pub fn send_quota(&self, pipe: u32) -> u32 {
        match self.prr {
            Some(p) => {
                let ss = self.ssthresh as u64;
                let q = if pipe as u64 > ss {
                    (p.delivered * ss).div_ceil(p.recover_fs as u64) as i64 - p.out as i64
                } else {
                    // PRR-SSRB.
                    let limit = (p.delivered as i64 - p.out as i64).max(p.last_delivered as i64)
                        + self.mss as i64;
                    (ss as i64 - pipe as i64).min(limit)
                };
                q.clamp(0, u32::MAX as i64) as u32
            }
            None => self.cwnd.saturating_sub(pipe),
        }
    }
    /// Sending resumes after an idle period longer than the RTO (RFC 5681 §4.1).
    pub fn on_idle(&mut self, _now: Instant, _rto: Duration) {
        self.cwnd = self.cwnd.min(self.iw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> Controller {
        Controller::new(CcConfig {
            algorithm: Algorithm::NewReno,
            mss: 1000,
            initial_window: 10_000,
        })
    }

    #[test]
    fn rfc5681_3_1_slow_start_grows_per_ack() {
        let mut c = c();
        let ev = AckEvent {
            newly_acked: 2000,
            ..Default::default()
        };
        c.on_ack(Instant::ZERO, &ev);
        assert_eq!(c.cwnd(), 12_000);
    }

    #[test]
    fn rfc6937_prr_sends_in_proportion_then_cwnd_is_ssthresh() {
        let mut c = c();
        c.enter_recovery(Instant::ZERO, 10_000, 10_000);
        assert_eq!(c.ssthresh(), 5000);
        c.on_ack(
            Instant::ZERO,
            &AckEvent {
                newly_sacked: 2000,
                pipe: 8000,
                flight_size: 10_000,
                ..Default::default()
            },
        );
        // pipe 8000 > ssthresh: sndcnt = ceil(2000 * 5000 / 10000) - 0 = 1000.
        assert_eq!(c.send_quota(8000), 1000);
        c.on_sent(Instant::ZERO, 1000);
        assert_eq!(c.send_quota(8000), 0);
        c.exit_recovery(Instant::ZERO);
        assert_eq!(c.cwnd(), 5000);
    }

    #[test]
    fn rfc5681_3_1_rto_collapses_to_one_segment() {
        let mut c = c();
        c.on_rto(Instant::ZERO, 8000);
        assert_eq!((c.cwnd(), c.ssthresh()), (1000, 4000));
    }
}
