//! The one JSON shape every bench writes (`--json FILE`, schema [`SCHEMA`]): a [`Report`]
//! of [`Row`]s, one measured value each, with the run's host and configuration. The
//! tables the benches print are generated from the same rows, and `--plot` draws them
//! ([`super::plot`]). The schema is documented in `tools/README.md` ("Bench output").
//!
//! Rows that measure the same thing share `test`, `metric` and `size`; among those, the
//! row with `side: kernel` is the baseline of the `ratio_to_kernel` of the others, and the
//! row with `side: ceiling` (the AF_XDP ceiling, [`super::ceiling`]) the baseline of their
//! `ratio_to_ceiling` ([`Report::fill_ratios`]).

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::time::{Instant, SystemTime};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The `schema` of every report this version writes.
pub const SCHEMA: &str = "xwarp-bench/1";

/// One bench run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Which bench: `tcp`, `rdma`, `shim`, `attack`, or `perftest` (the perftest-style tools).
    pub bench: String,
    /// When the run started, RFC 3339 UTC (`2026-12-02T01:02:03Z`).
    pub started: String,
    /// Wall-clock seconds from the start to the report.
    pub elapsed_s: f64,
    /// The machine.
    pub host: Host,
    /// The bench's options as it ran (its own keys; see each bench's `--help`).
    pub config: BTreeMap<String, serde_json::Value>,
    /// The measured values.
    pub rows: Vec<Row>,
    /// Pass/fail checks the bench made (`bench attack`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
    /// Results that are words, not numbers (`bench attack`: the bound, what the attacker got).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub facts: Vec<Fact>,
    /// Per-second progress of the bandwidth measurements, as printed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intervals: Vec<Interval>,
    /// What the numbers mean (the table's footnotes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The machine a report was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// `/proc/sys/kernel/hostname`.
    pub hostname: String,
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// CPU architecture (`x86_64`, `aarch64`, ...).
    pub arch: String,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// The first `model name` of `/proc/cpuinfo`, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    /// Version of the xwarp tools that measured.
    pub xwarp_version: String,
}

/// Which stack a row measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The Linux kernel's TCP (the baseline).
    Kernel,
    /// xwarp: an engine, the verbs, or the LD_PRELOAD shim (at least one end).
    Xwarp,
    /// The AF_XDP ceiling: raw frames between two AF_XDP sockets, no TCP.
    Ceiling,
}

impl Side {
    /// The name in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Side::Kernel => "kernel",
            Side::Xwarp => "xwarp",
            Side::Ceiling => "ceiling",
        }
    }
}

/// The unit of a row's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unit {
    /// Gigabits per second (10^9).
    #[serde(rename = "Gbit/s")]
    Gbps,
    /// Megabytes per second (10^6).
    #[serde(rename = "MB/s")]
    MBps,
    /// Microseconds.
    #[serde(rename = "us")]
    Us,
    /// Milliseconds.
    #[serde(rename = "ms")]
    Ms,
    /// CPU seconds per gigabyte moved (10^9 bytes).
    #[serde(rename = "s/GB")]
    SecPerGb,
    /// Operations (requests, transactions) per second.
    #[serde(rename = "1/s")]
    PerSec,
    /// Bytes.
    #[serde(rename = "B")]
    Bytes,
    /// A count of things.
    #[serde(rename = "count")]
    Count,
    /// A dimensionless ratio.
    #[serde(rename = "ratio")]
    Ratio,
}

impl Unit {
    /// The name in JSON and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Gbps => "Gbit/s",
            Unit::MBps => "MB/s",
            Unit::Us => "us",
            Unit::Ms => "ms",
            Unit::SecPerGb => "s/GB",
            Unit::PerSec => "1/s",
            Unit::Bytes => "B",
            Unit::Count => "count",
            Unit::Ratio => "ratio",
        }
    }
}

/// One measured value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The measurement (`bulk`, `pingpong`, `redis SET -c 50`, an attack's name, ...).
    pub test: String,
    /// This row within the test: the pair (`xwarp-kernel`), the RDMA test (`write_bw`),
    /// the kernel variant (`tcp`, `tcp-polled`), the stack (`shim`), ...
    pub name: String,
    /// Which stack.
    pub side: Side,
    /// What was measured: `bandwidth`, `latency_p50` (one-way: half the round trip),
    /// `latency_p99`, `cpu`, `cpu_client`, `rate`, ... (snake case, bench specific).
    pub metric: String,
    /// The unit of `value`, `min`, `max` and `dist`.
    pub unit: Unit,
    /// The value (the median over `runs` when there were several).
    pub value: f64,
    /// Message size in bytes, for measurements that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Runs (`--repeat` rounds) behind `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
    /// Lowest value over the runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Highest value over the runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// Bytes moved by the measurement (all runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The distribution of the individual samples (latency rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dist: Option<Dist>,
    /// `value` over the kernel baseline's (see [`Report::fill_ratios`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_to_kernel: Option<f64>,
    /// The `name` of the kernel row `ratio_to_kernel` divides by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_row: Option<String>,
    /// `value` over the AF_XDP ceiling's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_to_ceiling: Option<f64>,
    /// Anything else about the row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Row {
    /// A row with only the required fields.
    pub fn new(test: &str, name: &str, side: Side, metric: &str, unit: Unit, value: f64) -> Row {
        Row {
            test: test.into(),
            name: name.into(),
            side,
            metric: metric.into(),
            unit,
            value,
            size: None,
            runs: None,
            min: None,
            max: None,
            bytes: None,
            dist: None,
            ratio_to_kernel: None,
            kernel_row: None,
            ratio_to_ceiling: None,
            note: None,
        }
    }

    /// With a message size.
    pub fn size(mut self, size: usize) -> Row {
        self.size = Some(size as u64);
        self
    }

    /// With the runs behind the value and their spread.
    pub fn spread(mut self, runs: u32, min: f64, max: f64) -> Row {
        self.runs = Some(runs);
        self.min = finite(min);
        self.max = finite(max);
        self
    }

    /// With the bytes moved.
    pub fn bytes(mut self, bytes: u64) -> Row {
        self.bytes = Some(bytes);
        self
    }

    /// With the sample distribution.
    pub fn dist(mut self, d: Option<Dist>) -> Row {
        self.dist = d;
        self
    }

    /// With a note.
    pub fn note(mut self, n: impl Into<String>) -> Row {
        self.note = Some(n.into());
        self
    }

    /// Compare with this kernel row (instead of the first one of the test).
    pub fn against(mut self, kernel_row: &str) -> Row {
        self.kernel_row = Some(kernel_row.into());
        self
    }

    /// True when this row and `other` measure the same thing (test, metric, unit, size).
    fn comparable(&self, other: &Row) -> bool {
        self.same_measure(other) && self.size == other.size
    }

    /// True when this row and `other` share test, metric and unit (any size).
    fn same_measure(&self, other: &Row) -> bool {
        self.test == other.test && self.metric == other.metric && self.unit == other.unit
    }
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The distribution of a row's samples, in the row's unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    /// Samples.
    pub count: u64,
    /// Smallest sample.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// The cumulative distribution: `[value, fraction of samples <= value]`, fractions
    /// rising from 0 to 1 (at most ~110 points).
    pub cdf: Vec<[f64; 2]>,
}

/// The fractions the CDF is sampled at: every percent, then the tail.
fn cdf_fractions() -> impl Iterator<Item = f64> {
    (0..100)
        .map(|i| i as f64 / 100.0)
        .chain([0.995, 0.999, 0.9995, 0.9999, 1.0])
}

impl Dist {
    /// From an HDR histogram of nanoseconds, in µs divided by `div` (2: half round trips
    /// from round trips; 1: as recorded). `None` when empty.
    pub fn from_histogram_ns(h: &Histogram<u64>, div: f64) -> Option<Dist> {
        if h.is_empty() {
            return None;
        }
        let us = |v: u64| v as f64 / 1e3 / div;
        let q = |f: f64| us(h.value_at_quantile(f));
        Some(Dist {
            count: h.len(),
            min: us(h.min()),
            mean: h.mean() / 1e3 / div,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: us(h.max()),
            cdf: cdf_fractions().map(|f| [q(f), f]).collect(),
        })
    }

    /// From samples in the row's unit. `None` when empty or not all finite.
    pub fn from_samples(mut v: Vec<f64>) -> Option<Dist> {
        if v.is_empty() || v.iter().any(|x| !x.is_finite()) {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let q = |f: f64| v[((f * n as f64).ceil() as usize).clamp(1, n) - 1];
        Some(Dist {
            count: n as u64,
            min: v[0],
            mean: v.iter().sum::<f64>() / n as f64,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            p999: q(0.999),
            max: v[n - 1],
            cdf: cdf_fractions().map(|f| [q(f), f]).collect(),
        })
    }
}

/// A pass/fail check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// The test it belongs to.
    pub test: String,
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
}

/// A result in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    /// The test it belongs to.
    pub test: String,
    /// What it is.
    pub name: String,
    /// The words.
    pub value: String,
}

/// One progress interval of a bandwidth measurement (the lines `--quiet` suppresses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// The row's test.
    pub test: String,
    /// The row's name.
    pub name: String,
    /// Message size, when the row has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Start of the interval, seconds from the start of the measurement.
    pub start_s: f64,
    /// End of the interval.
    pub end_s: f64,
    /// Bytes received in the interval.
    pub bytes: u64,
    /// Bandwidth over the interval.
    pub gbps: f64,
    /// TCP retransmissions of the sending socket in the interval, where the sending stack
    /// counts them (the kernel's `TCP_INFO`; the xwarp engine counts none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<u64>,
}

impl Report {
    /// An empty report of `bench`, started now.
    pub fn new(bench: &str) -> Report {
        Report {
            schema: SCHEMA.into(),
            bench: bench.into(),
            started: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            elapsed_s: 0.0,
            host: Host::this(),
            config: BTreeMap::new(),
            rows: Vec::new(),
            checks: Vec::new(),
            facts: Vec::new(),
            intervals: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Set a config key.
    pub fn config(&mut self, key: &str, value: impl Into<serde_json::Value>) {
        self.config.insert(key.into(), value.into());
    }

    /// Add a row; one whose value is not finite (not measured) is left out, and so are
    /// the optional values that are not.
    pub fn push(&mut self, mut r: Row) {
        if !r.value.is_finite() {
            return;
        }
        r.min = r.min.and_then(finite);
        r.max = r.max.and_then(finite);
        self.rows.push(r);
    }

    /// Set every row's ratios: `ratio_to_kernel` over the comparable kernel row (the one
    /// `kernel_row` names, else the first; a row without a size compares with any size),
    /// `ratio_to_ceiling` over the comparable ceiling row (a ceiling row without a size
    /// compares with every size). Baselines of value 0 give no ratio.
    pub fn fill_ratios(&mut self) {
        let rows = self.rows.clone();
        for r in &mut self.rows {
            let ratio = |b: &Row| (b.value > 0.0).then(|| r.value / b.value).and_then(finite);
            if r.side != Side::Kernel {
                // A row without a size (the ceiling's MTU frames) compares with the
                // first kernel row of its test and metric.
                let k = rows.iter().find(|k| {
                    k.side == Side::Kernel
                        && (k.comparable(r) || (r.size.is_none() && k.same_measure(r)))
                        && r.kernel_row.as_ref().is_none_or(|n| *n == k.name)
                });
                r.ratio_to_kernel = k.and_then(ratio);
                r.kernel_row = k.map(|k| k.name.clone()).or(r.kernel_row.take());
            }
            if r.side != Side::Ceiling {
                let c = rows.iter().find(|c| {
                    c.side == Side::Ceiling
                        && c.same_measure(r)
                        && (c.size.is_none() || c.size == r.size)
                });
                r.ratio_to_ceiling = c.and_then(ratio);
            }
        }
    }

    /// The first row of `test` / `name` / `metric` (any size).
    pub fn find(&self, test: &str, name: &str, metric: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.test == test && r.name == name && r.metric == metric)
    }

    /// The value of [`Report::find`].
    pub fn value(&self, test: &str, name: &str, metric: &str) -> Option<f64> {
        self.find(test, name, metric).map(|r| r.value)
    }

    /// Stamp the elapsed time since `t0`, fill the ratios, and render as pretty JSON.
    pub fn finish(&mut self, t0: Instant) {
        self.elapsed_s = (t0.elapsed().as_secs_f64() * 1e3).round() / 1e3;
        self.fill_ratios();
    }

    /// Pretty JSON (ends with a newline).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            // Only a non-string map key could fail; there is none.
            format!("{{\"error\": \"{e}\"}}")
        });
        s.push('\n');
        s
    }

    /// Parse a report, checking its schema.
    pub fn from_json(s: &str) -> Result<Report, String> {
        let r: Report = serde_json::from_str(s).map_err(|e| format!("bench JSON: {e}"))?;
        if r.schema != SCHEMA {
            return Err(format!(
                "bench JSON: schema {:?}, expected {SCHEMA:?}",
                r.schema
            ));
        }
        Ok(r)
    }

    /// Write the JSON to `path` (`-`: stdout).
    pub fn write_json(&self, path: &Path) -> io::Result<()> {
        write_out(path, self.to_json().as_bytes())
    }
}

/// Write `bytes` to `path`, or to stdout when `path` is `-`.
pub fn write_out(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if path == Path::new("-") {
        use io::Write;
        let mut out = io::stdout().lock();
        out.write_all(bytes)?;
        return out.flush();
    }
    std::fs::write(path, bytes)
        .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))
}

impl Host {
    /// This machine.
    pub fn this() -> Host {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
        Host {
            hostname: read("/proc/sys/kernel/hostname"),
            kernel: read("/proc/sys/kernel/osrelease"),
            arch: std::env::consts::ARCH.into(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            xwarp_version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

/// Format an optional ratio for a table (`-` when absent).
pub fn fmt_ratio(r: Option<f64>) -> String {
    r.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

/// Format an optional value with `prec` decimals (`-` when absent).
pub fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.filter(|v| v.is_finite())
        .map(|v| format!("{v:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

/// Parse a size list: `64,4K,64K,1M` (K = 1024, M = 1024²), each within `1..=max`.
pub fn parse_sizes(flag: &str, v: &str, max: usize) -> Result<Vec<usize>, String> {
    let one = |s: &str| -> Result<usize, String> {
        let s = s.trim();
        let (num, mul) = match s.as_bytes().last() {
            Some(b'k' | b'K') => (&s[..s.len() - 1], 1usize << 10),
            Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
            _ => (s, 1),
        };
        let n: usize = num
            .parse()
            .map_err(|_| format!("{flag}: {s:?} is not a size"))?;
        match n.checked_mul(mul) {
            Some(b) if (1..=max).contains(&b) => Ok(b),
            _ => Err(format!("{flag}: {s} is not within 1..={max} bytes")),
        }
    };
    let mut out = v.split(',').map(one).collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_pick_the_comparable_baselines() {
        let mut r = Report::new("t");
        r.push(Row::new("bulk", "k", Side::Kernel, "bandwidth", Unit::Gbps, 10.0).size(64));
        r.push(Row::new("bulk", "k", Side::Kernel, "bandwidth", Unit::Gbps, 20.0).size(128));
        r.push(Row::new("bulk", "x", Side::Xwarp, "bandwidth", Unit::Gbps, 5.0).size(128));
        r.push(Row::new(
            "bulk",
            "c",
            Side::Ceiling,
            "bandwidth",
            Unit::Gbps,
            25.0,
        ));
        r.push(Row::new("lat", "k1", Side::Kernel, "p50", Unit::Us, 10.0));
        r.push(Row::new("lat", "k2", Side::Kernel, "p50", Unit::Us, 4.0));
        r.push(Row::new("lat", "x", Side::Xwarp, "p50", Unit::Us, 2.0).against("k2"));
        r.push(Row::new(
            "lat",
            "nan",
            Side::Xwarp,
            "p50",
            Unit::Us,
            f64::NAN,
        ));
        r.fill_ratios();
        let x = r.find("bulk", "x", "bandwidth").unwrap();
        assert_eq!(x.ratio_to_kernel, Some(0.25));
        assert_eq!(x.ratio_to_ceiling, Some(0.2));
        assert_eq!(x.kernel_row.as_deref(), Some("k"));
        let k = &r.rows[0];
        assert_eq!((k.ratio_to_kernel, k.ratio_to_ceiling), (None, Some(0.4)));
        let l = r.find("lat", "x", "p50").unwrap();
        assert_eq!(l.ratio_to_kernel, Some(0.5));
        assert_eq!(l.ratio_to_ceiling, None);
        assert!(r.find("lat", "nan", "p50").is_none());
        let back = Report::from_json(&r.to_json()).unwrap();
        assert_eq!(back, r);
        assert!(Report::from_json(&r.to_json().replace(SCHEMA, "other/9")).is_err());
        assert!(Report::from_json("{").is_err());
    }

    #[test]
    fn distributions_from_samples_and_histograms_agree() {
        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        let d = Dist::from_samples(v).unwrap();
        assert_eq!(
            (d.count, d.min, d.max, d.p50, d.p99),
            (1000, 1.0, 1000.0, 500.0, 990.0)
        );
        assert!(d
            .cdf
            .windows(2)
            .all(|w| w[0][0] <= w[1][0] && w[0][1] < w[1][1]));
        assert_eq!(d.cdf.last(), Some(&[1000.0, 1.0]));
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
        for i in 1..=1000u64 {
            h.record(i * 1000).unwrap();
        }
        let dh = Dist::from_histogram_ns(&h, 2.0).unwrap();
        assert!((dh.p50 - 250.0).abs() < 1.0, "{}", dh.p50);
        assert!((dh.max - 500.0).abs() < 1.0, "{}", dh.max);
        assert!(Dist::from_samples(vec![]).is_none());
        assert!(Dist::from_samples(vec![f64::NAN]).is_none());
    }

    #[test]
    fn size_lists_parse_with_suffixes_and_bounds() {
        assert_eq!(
            parse_sizes("--sizes", "64K,4k,1M,64", 1 << 20).unwrap(),
            vec![64, 4096, 65536, 1 << 20]
        );
        for bad in ["", "0", "2M", "x", "4G", "-1", "1,,2"] {
            assert!(parse_sizes("--sizes", bad, 1 << 20).is_err(), "{bad}");
        }
    }
}
