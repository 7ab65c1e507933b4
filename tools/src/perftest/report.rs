//! The perftest-style report: header, bandwidth line and latency percentiles.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::opts::Test;
use super::proto::*;
use crate::bench::report::{Dist, Row, Side, Unit};

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

/// What a client measured: its table line ([`Measured::text`]) and its JSON rows
/// ([`Measured::rows`]) come from the same numbers.
pub(super) enum Measured {
    /// A bandwidth test.
    Bw {
        size: usize,
        msgs: u64,
        peak_mbs: f64,
        avg_mbs: f64,
        mpps: f64,
        secs: f64,
    },
    /// A latency test; `halve`: one-way (half the round trip), as perftest reports
    /// ping-pong tests.
    Lat { size: usize, lat: Lat, halve: bool },
}

impl Measured {
    pub(super) fn bw(size: usize, bw: &Bw, msgs: u64) -> Measured {
        let (peak_mbs, avg_mbs, mpps, secs) = bw.report(msgs);
        Measured::Bw {
            size,
            msgs,
            peak_mbs,
            avg_mbs,
            mpps,
            secs,
        }
    }

    pub(super) fn lat(size: usize, lat: Lat, halve: bool) -> Measured {
        Measured::Lat { size, lat, halve }
    }

    /// The perftest-style result line (with its heading).
    pub(super) fn text(&self) -> String {
        match self {
            Measured::Bw {
                size,
                msgs,
                peak_mbs,
                avg_mbs,
                mpps,
                secs,
            } => format!(
                " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]   BW average[Gb/sec]\n {:<10} {:<14} {:<18.2} {:<20.2} {:<15.6} {:.3}\n (total {} bytes in {:.3} s)\n",
                size,
                msgs,
                peak_mbs,
                avg_mbs,
                mpps,
                avg_mbs * 8.0 / 1e3,
                msgs * *size as u64,
                secs
            ),
            Measured::Lat { size, lat, halve } => lat.line(*size, *halve),
        }
    }

    /// The rows of the bench schema (`bench: perftest`): `bulk` rows (`bandwidth` in
    /// Gbit/s, `bw_average` and `bw_peak` in MB/s, `msg_rate` in 1/s) for bandwidth tests,
    /// `pingpong` rows (`latency_min`, `_p50` with the distribution, `_avg`, `_stdev`,
    /// `_p99`, `_p999`, `_max`, in µs) for latency tests; named after the test.
    pub(super) fn rows(&self, test: Test) -> Vec<Row> {
        match self {
            Measured::Bw {
                size,
                msgs,
                peak_mbs,
                avg_mbs,
                mpps,
                ..
            } => {
                let bytes = msgs * *size as u64;
                let row = |metric, unit, v| {
                    Row::new("bulk", test.name(), Side::Xwarp, metric, unit, v)
                        .size(*size)
                        .bytes(bytes)
                };
                vec![
                    row("bandwidth", Unit::Gbps, avg_mbs * 8.0 / 1e3),
                    row("bw_average", Unit::MBps, *avg_mbs),
                    row("bw_peak", Unit::MBps, *peak_mbs)
                        .note("the best rate over any window of at least 20 ms"),
                    row("msg_rate", Unit::PerSec, mpps * 1e6),
                ]
            }
            Measured::Lat { size, lat, halve } => {
                let div = if *halve { 2.0 } else { 1.0 };
                let h = &lat.h;
                let us = |v: u64| v as f64 / 1e3 / div;
                let note = if *halve {
                    "one-way: half the round trip"
                } else {
                    "the whole operation (an RDMA Read is a round trip)"
                };
                let row = |metric, v| {
                    Row::new("pingpong", test.name(), Side::Xwarp, metric, Unit::Us, v)
                        .size(*size)
                        .note(note)
                };
                vec![
                    row("latency_min", us(h.min())),
                    row("latency_p50", us(h.value_at_quantile(0.5)))
                        .dist(Dist::from_histogram_ns(h, div)),
                    row("latency_avg", h.mean() / 1e3 / div),
                    row("latency_stdev", h.stdev() / 1e3 / div),
                    row("latency_p99", us(h.value_at_quantile(0.99))),
                    row("latency_p999", us(h.value_at_quantile(0.999))),
                    row("latency_max", us(h.max())),
                ]
            }
        }
    }
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
