//! Congestion control, sans-IO: slow start and congestion avoidance (RFC 5681) with
//! appropriate byte counting (RFC 3465, L = 2·SMSS), the initial window of RFC 6928, CUBIC
//! (RFC 9438) or NewReno-style halving, the response to a retransmission timeout (RFC 5681
//! §3.1), the restart window after idle (RFC 5681 §4.1), and Proportional Rate Reduction
//! during fast recovery (RFC 6937, PRR-SSRB by default, PRR-CRB on request).
//!
//! The connection owns loss detection (`tcp::sack`, `tcp::rack`) and tells the
//! [`Controller`] what happened: every ACK ([`Controller::on_ack`]), the start and end of
//! fast recovery, a timeout, every transmission, an idle restart. It asks how much it may
//! send with [`Controller::send_quota`]. All windows are in octets; nothing here panics or
//! overflows (sums saturate, the window is capped at [`MAX_CWND`]).

mod cubic;
mod hystart;
mod prr;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

use smoltcp::time::{Duration, Instant};

use cubic::Cubic;
use hystart::{HyStart, Verdict};
use prr::Prr;
pub use prr::PrrMode;

/// Largest congestion window the controller grows to (1 GiB, the largest receive window
/// RFC 7323 allows).
pub const MAX_CWND: u32 = 1 << 30;

/// Which congestion controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// RFC 5681 slow start and congestion avoidance, ssthresh = FlightSize / 2 on loss.
    NewReno,
    /// RFC 9438 CUBIC (β = 0.7, C = 0.4, fast convergence, Reno-friendly region).
    Cubic,
}

/// Controller parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CcConfig {
    /// Which algorithm.
    pub algorithm: Algorithm,
    /// The sender's maximum segment size (SMSS, octets of payload). Zero is rejected.
    pub mss: u32,
    /// Initial window in octets; 0 = RFC 6928's `min(10·MSS, max(2·MSS, 14600))`. A value
    /// below one MSS is raised to one MSS.
    pub initial_window: u32,
}

impl CcConfig {
    /// `algorithm` with `mss` and RFC 6928's initial window.
    pub fn rfc6928(algorithm: Algorithm, mss: u32) -> CcConfig {
        CcConfig {
            algorithm,
            mss,
            initial_window: 0,
        }
    }
}

/// RFC 6928 §2: `IW = min(10·MSS, max(2·MSS, 14600))` octets.
pub fn rfc6928_initial_window(mss: u32) -> u32 {
    mss.saturating_mul(10)
        .min(mss.saturating_mul(2).max(14600))
        .min(MAX_CWND)
}

/// `newly_acked` for an [`AckEvent`]: the SND.UNA advance `acked` less the octets in it that
/// earlier ACKs had SACKed, from the scoreboard's SACKed octets before and after the ACK and
/// its newly SACKed octets (`delivered = acked + sacked_after − sacked_before`, `newly_acked =
/// delivered − newly_sacked`). Saturates at 0 on inconsistent input.
pub fn newly_acked_not_sacked(
    acked: u32,
    newly_sacked: u32,
    sacked_before: u32,
    sacked_after: u32,
) -> u32 {
    let delivered =
        (u64::from(acked) + u64::from(sacked_after)).saturating_sub(u64::from(sacked_before));
    delivered
        .saturating_sub(u64::from(newly_sacked))
        .min(u64::from(acked)) as u32
}

/// A configuration the controller cannot run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CcError {
    /// `mss` was zero.
    ZeroMss,
}

impl std::fmt::Display for CcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CcError::ZeroMss => f.write_str("congestion control needs a non-zero MSS"),
        }
    }
}

impl std::error::Error for CcError {}

/// What one ACK told the sender.
///
/// Each octet should be counted once, when it is first reported delivered: `newly_acked +
/// newly_sacked` is then RFC 6937's DeliveredData (Δ SND.UNA + Δ SACKed), which PRR needs
/// exactly. [`newly_acked_not_sacked`] computes `newly_acked` from a `tcp::sack::Scoreboard`'s
/// numbers. Passing the plain SND.UNA advance instead counts SACKed-then-acknowledged octets
/// twice, so PRR sends more than it should during recovery. Window growth outside recovery
/// counts `newly_acked` only (RFC 5681: ACKs of new data; SACK-only ACKs grow nothing), so it
/// is the same under either way of counting, up to the octets SACKed before their
/// cumulative ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AckEvent {
    /// Octets newly acknowledged cumulatively (SND.UNA advance).
    pub newly_acked: u32,
    /// Octets newly SACKed.
    pub newly_sacked: u32,
    /// RTT sample taken from this ACK, if any.
    pub rtt: Option<Duration>,
    /// The connection's minimum RTT, if known.
    pub min_rtt: Option<Duration>,
    /// RFC 6675 pipe after this ACK was processed.
    pub pipe: u32,
    /// SND.NXT − SND.UNA after this ACK.
    pub flight_size: u32,
    /// The sender was not using its window before this ACK (limited by the application or
    /// the receive window, not by cwnd): the window does not grow (RFC 7661 §4.2's spirit,
    /// RFC 9438 §5.8).
    pub app_limited: bool,
}

/// The congestion window and slow-start threshold of one connection.
#[derive(Debug, Clone)]
pub struct Controller {
    algorithm: Algorithm,
    mss: u32,
    iw: u32,
    cwnd: u32,
    ssthresh: u32,
    /// RFC 3465 §2.1 `bytes_acked` in NewReno congestion avoidance.
    bytes_acked: u32,
    prr: Option<Prr>,
    prr_mode: PrrMode,
    cubic: Cubic,
    /// A timeout reduced ssthresh and no new data was acknowledged since: a further timeout
    /// holds ssthresh (RFC 5681 §3.1, note to equation 4).
    rto_pending: bool,
    last_sent: Option<Instant>,
    srtt: Option<Duration>,
    /// HyStart++ during the initial slow start; `None` when disabled or over.
    hystart: Option<HyStart>,
    /// The state before the last reduction, for [`Controller::undo_reduction`].
    prior: Option<Prior>,
}

/// What a reduction changed (RFC 9438 §4.9: cwnd, ssthresh and CUBIC's W_max, K, epoch,
/// W_est).
#[derive(Debug, Clone)]
struct Prior {
    cwnd: u32,
    ssthresh: u32,
    cubic: Cubic,
}

impl Controller {
    /// A controller at its initial window, or an error for a configuration it cannot run.
    pub fn try_new(cfg: CcConfig) -> Result<Controller, CcError> {
        if cfg.mss == 0 {
            return Err(CcError::ZeroMss);
        }
        Ok(Controller::with_mss(cfg, cfg.mss))
    }

    /// A controller at its initial window. A zero MSS (rejected by [`Controller::try_new`])
    /// is replaced by RFC 9293's default of 536 octets, with a warning in the log.
    pub fn new(cfg: CcConfig) -> Controller {
        let mss = if cfg.mss == 0 {
            log::warn!("{}: using an MSS of 536 octets", CcError::ZeroMss);
            536
        } else {
            cfg.mss
        };
        Controller::with_mss(cfg, mss)
    }

    fn with_mss(cfg: CcConfig, mss: u32) -> Controller {
        let mss = mss.clamp(1, MAX_CWND);
        let iw = match cfg.initial_window {
            0 => rfc6928_initial_window(mss),
            w => w.clamp(mss, MAX_CWND),
        };
        Controller {
            algorithm: cfg.algorithm,
            mss,
            iw,
            cwnd: iw,
            ssthresh: u32::MAX,
            bytes_acked: 0,
            prr: None,
            prr_mode: PrrMode::Ssrb,
            cubic: Cubic::default(),
            rto_pending: false,
            last_sent: None,
            srtt: None,
            hystart: Some(HyStart::new()),
            prior: None,
        }
    }

    /// Use HyStart++ (RFC 9406) in the initial slow start (the default) or plain RFC 5681
    /// slow start. Has no effect once the initial slow start is over.
    pub fn set_hystart(&mut self, on: bool) {
        if !on {
            self.hystart = None;
        } else if self.hystart.is_none() && self.ssthresh == u32::MAX && self.prr.is_none() {
            self.hystart = Some(HyStart::new());
        }
    }

    /// HyStart++ is in Conservative Slow Start (RFC 9406 §4.2).
    pub fn in_css(&self) -> bool {
        self.hystart
            .as_ref()
            .is_some_and(|h| h.phase() == hystart::Phase::Css)
    }

    /// Use `mode` for PRR's reduction bound (PRR-SSRB unless told otherwise).
    pub fn set_prr_mode(&mut self, mode: PrrMode) {
        self.prr_mode = mode;
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The sender MSS the controller counts in.
    pub fn mss(&self) -> u32 {
        self.mss
    }

    /// The initial window (octets).
    pub fn initial_window(&self) -> u32 {
        self.iw
    }

    /// Congestion window (octets). During recovery: pipe + PRR's sndcnt at the last ACK.
    pub fn cwnd(&self) -> u32 {
        self.cwnd
    }

    /// Slow-start threshold (octets; `u32::MAX` until the first congestion event).
    pub fn ssthresh(&self) -> u32 {
        self.ssthresh
    }

    /// Whether fast recovery (PRR) is running.
    pub fn in_recovery(&self) -> bool {
        self.prr.is_some()
    }

    /// In slow start (cwnd below ssthresh, not in recovery).
    pub fn in_slow_start(&self) -> bool {
        self.prr.is_none() && self.cwnd < self.ssthresh
    }

    fn rtt_for_cubic(&self, ev: &AckEvent) -> Duration {
        self.srtt
            .or(ev.min_rtt)
            .or(ev.rtt)
            .unwrap_or(Duration::ZERO)
    }

    /// An ACK arrived. Outside recovery it grows the window by the octets it newly
    /// acknowledged (slow start, then NewReno or CUBIC congestion avoidance), never while
    /// app-limited; in recovery it only feeds PRR (with `newly_acked + newly_sacked`).
    pub fn on_ack(&mut self, now: Instant, ev: &AckEvent) {
        let delivered = ev.newly_acked.saturating_add(ev.newly_sacked);
        if delivered > 0 {
            self.rto_pending = false;
        }
        if let Some(rtt) = ev.rtt {
            // RFC 6298's smoothing (α = 1/8), for CUBIC's W_cubic(t + RTT).
            self.srtt = Some(match self.srtt {
                None => rtt,
                Some(s) => Duration::from_micros(
                    (s.total_micros().saturating_mul(7) / 8).saturating_add(rtt.total_micros() / 8),
                ),
            });
        }
        if let Some(prr) = self.prr.as_mut() {
            // RFC 6937 §3: prr_delivered += DeliveredData; cwnd = pipe + sndcnt. No growth.
            prr.on_ack(delivered);
            let sndcnt = prr.sndcnt(self.prr_mode, ev.pipe, self.ssthresh, self.mss);
            self.cwnd = ev.pipe.saturating_add(sndcnt).min(MAX_CWND);
            return;
        }
        if ev.app_limited {
            self.cubic.on_app_limited(now);
            return;
        }
        self.cubic.on_cwnd_limited(now);
        if ev.newly_acked == 0 {
            return;
        }
        let mut acked = ev.newly_acked;
        if self.cwnd < self.ssthresh {
            // RFC 5681 §3.1 (3.2) with RFC 3465 §2.2: cwnd += min(N, L·SMSS), L = 2; stop at
            // ssthresh and count the rest in congestion avoidance.
            let mut inc = acked.min(self.mss.saturating_mul(2));
            if let Some(h) = self.hystart.as_mut() {
                match h.on_ack(delivered, ev.flight_size, ev.rtt) {
                    Verdict::SlowStart => {}
                    // RFC 9406 §4.2: CSS grows by a quarter of slow start.
                    Verdict::Css => inc /= hystart::CSS_GROWTH_DIVISOR,
                    Verdict::EnterCongestionAvoidance => {
                        self.hystart = None;
                        self.ssthresh = self.cwnd.max(self.mss.saturating_mul(2));
                        return;
                    }
                }
            }
            let room = self.ssthresh - self.cwnd;
            if inc < room {
                self.cwnd = self.cwnd.saturating_add(inc).min(MAX_CWND);
                return;
            }
            self.cwnd = self.ssthresh.min(MAX_CWND);
            acked = acked.saturating_sub(room);
            if acked == 0 || self.cwnd >= MAX_CWND {
                return;
            }
        }
        match self.algorithm {
            Algorithm::NewReno => {
                // RFC 3465 §2.1: one SMSS per cwnd of acknowledged octets.
                self.bytes_acked = self.bytes_acked.saturating_add(acked);
                if self.bytes_acked >= self.cwnd {
                    self.bytes_acked -= self.cwnd;
                    self.cwnd = self.cwnd.saturating_add(self.mss).min(MAX_CWND);
                }
            }
            Algorithm::Cubic => {
                let rtt = self.rtt_for_cubic(ev);
                self.cwnd = self.cubic.on_ack(now, acked, self.cwnd, self.mss, rtt);
            }
        }
    }

    /// Fast recovery starts (loss detected by SACK/RACK or three duplicate ACKs): ssthresh
    /// = max(FlightSize/2, 2·SMSS) (RFC 5681 (4)) for NewReno, max(FlightSize·0.7, 2·SMSS)
    /// with W_max per RFC 9438 §4.6–4.7 for CUBIC, and PRR starts with RecoverFS =
    /// `flight_size` (RFC 6937 §3). Ignored while already in recovery (one reduction per
    /// recovery). The fast retransmit itself is the caller's (RFC 6675 §5 step 4.3).
    pub fn enter_recovery(&mut self, now: Instant, pipe: u32, flight_size: u32) {
        let _ = (now, pipe);
        if self.prr.is_some() {
            return;
        }
        self.save_prior();
        self.ssthresh = self.reduced_ssthresh(flight_size);
        self.hystart = None;
        if self.algorithm == Algorithm::Cubic {
            self.cubic.on_congestion(self.cwnd);
        }
        self.bytes_acked = 0;
        self.prr = Some(Prr::new(flight_size));
    }

    fn reduced_ssthresh(&self, flight_size: u32) -> u32 {
        let two = self.mss.saturating_mul(2);
        match self.algorithm {
            Algorithm::NewReno => (flight_size / 2).max(two),
            Algorithm::Cubic => cubic::beta_times(flight_size).max(two),
        }
    }

    /// Fast recovery ended (SND.UNA passed the recovery point): cwnd = ssthresh (RFC 6937
    /// §3); CUBIC's congestion-avoidance epoch starts now.
    pub fn exit_recovery(&mut self, now: Instant) {
        if self.prr.take().is_some() {
            self.cwnd = self.ssthresh.min(MAX_CWND);
            self.bytes_acked = 0;
            if self.algorithm == Algorithm::Cubic {
                self.cubic.begin_epoch(now, self.cwnd, self.mss);
            }
        }
    }

    /// The retransmission timer expired: cwnd = 1 SMSS (the loss window, RFC 5681 §3.1),
    /// ssthresh = max(FlightSize/2, 2·SMSS) (equation 4; CUBIC uses β = 0.7, RFC 9438 §4.8).
    /// ssthresh is held when the timer expires again before new data is delivered (the note
    /// to equation 4), and never raised by a timeout during fast recovery (the recovery
    /// already reduced it for this loss episode; FlightSize may since have grown). Ends
    /// recovery.
    pub fn on_rto(&mut self, now: Instant, flight_size: u32) {
        let _ = now;
        if !self.rto_pending {
            if self.prr.is_none() {
                self.save_prior();
            }
            let reduced = self.reduced_ssthresh(flight_size);
            self.ssthresh = if self.prr.is_some() {
                self.ssthresh.min(reduced)
            } else {
                reduced
            };
            if self.algorithm == Algorithm::Cubic {
                self.cubic.on_timeout(self.cwnd);
            }
        }
        self.rto_pending = true;
        self.hystart = None;
        self.prr = None;
        self.bytes_acked = 0;
        self.cwnd = self.mss;
    }

    fn save_prior(&mut self) {
        self.prior = Some(Prior {
            cwnd: self.cwnd,
            ssthresh: self.ssthresh,
            cubic: self.cubic.clone(),
        });
    }

    /// The last congestion event (fast recovery or timeout) was spurious, e.g. DSACKs showed
    /// every retransmission of the episode arrived twice (RFC 2883), or F-RTO/Eifel said so:
    /// restore the state from before the reduction (RFC 9438 §4.9: cwnd = max(cwnd,
    /// cwnd_prior), ssthresh, W_max, K, epoch start and W_est as they were) and end recovery.
    /// Returns `false` (and changes nothing) when there is no reduction to undo; each
    /// reduction can be undone once.
    pub fn undo_reduction(&mut self, now: Instant) -> bool {
        let _ = now;
        let Some(p) = self.prior.take() else {
            return false;
        };
        self.prr = None;
        self.rto_pending = false;
        self.bytes_acked = 0;
        self.cwnd = self.cwnd.max(p.cwnd).min(MAX_CWND);
        self.ssthresh = p.ssthresh;
        self.cubic = p.cubic;
        true
    }

    /// `bytes` of data (new or retransmitted) left at `now` (RFC 6937's prr_out).
    pub fn on_sent(&mut self, now: Instant, bytes: u32) {
        self.last_sent = Some(now);
        if let Some(prr) = self.prr.as_mut() {
            prr.on_sent(bytes);
        }
    }

    /// Octets that may be sent now with `pipe` octets in the network: PRR's sndcnt in
    /// recovery (what is left of it after what was sent since the last ACK), else
    /// cwnd − pipe.
    pub fn send_quota(&self, pipe: u32) -> u32 {
        match &self.prr {
            Some(prr) => prr.sndcnt(self.prr_mode, pipe, self.ssthresh, self.mss),
            None => self.cwnd.saturating_sub(pipe),
        }
    }

    /// Sending resumes after idleness: if nothing was sent for longer than `rto`, cwnd =
    /// min(IW, cwnd) (RFC 5681 §4.1's restart window); CUBIC starts a new epoch later.
    /// Ignored in recovery and when the last transmission is within `rto`.
    pub fn on_idle(&mut self, now: Instant, rto: Duration) {
        if self.prr.is_some() {
            return;
        }
        if let Some(last) = self.last_sent {
            let idle = now.total_micros().saturating_sub(last.total_micros());
            if idle <= rto.total_micros() as i64 {
                return;
            }
        }
        self.cwnd = self.cwnd.min(self.iw);
        self.bytes_acked = 0;
        self.cubic.on_idle_restart();
    }

    /// CUBIC's W_max in octets (0 before the first congestion event or for NewReno).
    pub fn w_max(&self) -> u32 {
        self.cubic.w_max_bytes()
    }
}
