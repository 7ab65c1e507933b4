//! The perftest-style report: header, bandwidth line and latency percentiles.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::proto::*;

/// Bandwidth samples: (elapsed, cumulative bytes).
pub(super) struct Bw {
    pub(super) t0: Instant,
    pub(super) samples: Vec<(Duration, u64)>,
}

impl Bw {
    pub(super) fn report(&self, msgs: u64) -> (f64, f64, f64, f64) {
        let (end, bytes) = self.samples.last().copied().unwrap_or_default();
        let secs = end.as_secs_f64().max(1e-9);
        let avg_mbs = bytes as f64 / secs / 1e6;
        // Peak: the best rate over any window of at least 20 ms.
        let mut peak = avg_mbs;
        let mut j = 0;
        for i in 0..self.samples.len() {
            while j < i && self.samples[i].0 - self.samples[j].0 > Duration::from_millis(20) {
                let dt = (self.samples[i].0 - self.samples[j].0).as_secs_f64();
                let db = (self.samples[i].1 - self.samples[j].1) as f64;
                peak = peak.max(db / dt / 1e6);
                j += 1;
            }
        }
        (peak, avg_mbs, msgs as f64 / secs / 1e6, secs)
    }
}

pub(super) fn bw_line(size: usize, bw: &Bw, msgs: u64) -> String {
    let (peak, avg, mpps, secs) = bw.report(msgs);
    format!(
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]   BW average[Gb/sec]\n {:<10} {:<14} {:<18.2} {:<20.2} {:<15.6} {:.3}\n (total {} bytes in {:.3} s)\n",
        size,
        msgs,
        peak,
        avg,
        mpps,
        avg * 8.0 / 1e3,
        msgs * size as u64,
        secs
    )
}

pub(super) struct Lat {
    pub(super) h: Histogram<u64>,
}

impl Lat {
    pub(super) fn new() -> Result<Lat, String> {
        Ok(Lat {
            h: Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(e2s)?,
        })
    }

    pub(super) fn add(&mut self, d: Duration) {
        let _ = self.h.record((d.as_nanos() as u64).max(1));
    }

    pub(super) fn line(&self, size: usize, halve: bool) -> String {
        let div = if halve { 2.0 } else { 1.0 };
        let us = |v: u64| v as f64 / 1e3 / div;
        format!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]\n {:<6} {:<14} {:<14.2} {:<12.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}\n{}",
            size,
            self.h.len(),
            us(self.h.min()),
            us(self.h.max()),
            us(self.h.value_at_quantile(0.5)),
            self.h.mean() / 1e3 / div,
            self.h.stdev() / 1e3 / div,
            us(self.h.value_at_quantile(0.99)),
            us(self.h.value_at_quantile(0.999)),
            if halve {
                " (one-way: half the round trip, as perftest reports ping-pong tests)\n"
            } else {
                ""
            }
        )
    }
}
