//! Proportional Rate Reduction (RFC 6937 §3): during fast recovery, how much may be sent per
//! ACK so that cwnd ends at ssthresh with the sending spread over the recovery.

/// PRR's bound when pipe has fallen below ssthresh (RFC 6937 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrrMode {
    /// Slow Start Reduction Bound: `limit = max(prr_delivered − prr_out, DeliveredData) +
    /// MSS`, regrowing towards ssthresh like slow start (the RFC's recommendation).
    #[default]
    Ssrb,
    /// Conservative Reduction Bound: `limit = prr_delivered − prr_out` (packet
    /// conservation: never more out than delivered).
    Crb,
}

/// The state of one recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Prr {
    /// RecoverFS: FlightSize at the start of recovery (at least 1).
    recover_fs: u64,
    /// prr_delivered: octets delivered to the receiver since recovery began.
    delivered: u64,
    /// prr_out: octets sent since recovery began.
    out: u64,
    /// DeliveredData of the last ACK.
    last_delivered: u64,
    /// prr_out when the last ACK arrived (what was sent since is charged against that
    /// ACK's sndcnt).
    out_at_ack: u64,
}

impl Prr {
    /// RFC 6937 §3 on entering recovery: prr_delivered = prr_out = 0, RecoverFS =
    /// `flight_size`.
    pub(super) fn new(flight_size: u32) -> Prr {
        Prr {
            recover_fs: u64::from(flight_size.max(1)),
            delivered: 0,
            out: 0,
            last_delivered: 0,
            out_at_ack: 0,
        }
    }

    /// An ACK delivered `delivered` octets (RFC 6937's DeliveredData).
    pub(super) fn on_ack(&mut self, delivered: u32) {
        self.delivered = self.delivered.saturating_add(u64::from(delivered));
        self.last_delivered = u64::from(delivered);
        self.out_at_ack = self.out;
    }

    /// `bytes` were sent (prr_out).
    pub(super) fn on_sent(&mut self, bytes: u32) {
        self.out = self.out.saturating_add(u64::from(bytes));
    }

    /// sndcnt for the last ACK given the current `pipe`, less what was sent since that ACK
    /// (RFC 6937 §3):
    ///
    /// ```text
    /// if pipe > ssthresh: sndcnt = CEIL(prr_delivered · ssthresh / RecoverFS) − prr_out
    /// else:               sndcnt = MIN(ssthresh − pipe, limit)   (limit per PrrMode)
    /// sndcnt = MAX(sndcnt, 0)
    /// ```
    pub(super) fn sndcnt(&self, mode: PrrMode, pipe: u32, ssthresh: u32, mss: u32) -> u32 {
        let pipe = u64::from(pipe);
        let ssthresh = u64::from(ssthresh);
        let q = if pipe > ssthresh {
            let allowed = (u128::from(self.delivered) * u128::from(ssthresh))
                .div_ceil(u128::from(self.recover_fs));
            allowed
                .saturating_sub(u128::from(self.out))
                .min(u128::from(u64::MAX)) as u64
        } else {
            let limit = match mode {
                PrrMode::Crb => self.delivered.saturating_sub(self.out),
                PrrMode::Ssrb => {
                    let since_ack = self.out.saturating_sub(self.out_at_ack);
                    self.delivered
                        .saturating_sub(self.out_at_ack)
                        .max(self.last_delivered)
                        .saturating_add(u64::from(mss))
                        .saturating_sub(since_ack)
                }
            };
            (ssthresh - pipe).min(limit)
        };
        q.min(u64::from(u32::MAX)) as u32
    }
}
