//! `xwarp bench shim` results: what one stack measured, as [`Report`] rows (the `--json`
//! schema), and the table printed from those rows.

use super::report::{fmt_ratio, Report, Row, Side, Unit};

/// One redis-benchmark test (SET or GET) on one stack.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisResult {
    /// `SET` or `GET`.
    pub test: String,
    /// redis-benchmark clients.
    pub clients: u32,
    /// Requests per second.
    pub rps: f64,
    /// Median latency in ms as redis-benchmark reports it (`None` if absent).
    pub p50_ms: Option<f64>,
}

/// sockperf ping-pong results on one stack (half round trips, µs).
#[derive(Debug, Clone, PartialEq)]
pub struct PingResult {
    /// Average.
    pub avg_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Round trips in the measured interval.
    pub observations: u64,
}

/// memcaslap against memcached on one stack.
#[derive(Debug, Clone, PartialEq)]
pub struct MemcachedResult {
    /// memcaslap connections.
    pub connections: u32,
    /// Operations (gets and sets) per second.
    pub tps: f64,
    /// Operations in the run.
    pub ops: u64,
}

/// Everything measured on one stack.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StackResults {
    /// redis-benchmark tests.
    pub redis: Vec<RedisResult>,
    /// memcaslap.
    pub memcached: Option<MemcachedResult>,
    /// sockperf ping-pong.
    pub ping: Option<PingResult>,
}

/// Add both stacks' results to `rep`; `requests`: redis-benchmark's `-n` with 50 clients
/// and with one.
///
/// Rows (name `kernel`, side kernel; name `shim`, side xwarp): test `redis SET -c 50 -n
/// 100000` and the like: `rate` (requests/s) and `latency_p50` (ms, as redis-benchmark
/// reports it); test `memcaslap -c 16`: `rate` (operations/s), `ops`; test `sockperf
/// ping-pong 64 B`: `latency_avg`, `latency_p50`, `latency_p99` (µs, half round trips, as
/// sockperf reports them), `round_trips`.
pub fn fill(
    rep: &mut Report,
    (requests, latency_requests): (u32, u32),
    kernel: &StackResults,
    shim: &StackResults,
) {
    for (name, side, res) in [
        ("kernel", Side::Kernel, kernel),
        ("shim", Side::Xwarp, shim),
    ] {
        for r in &res.redis {
            let n = if r.clients == 1 {
                latency_requests
            } else {
                requests
            };
            let test = format!("redis {} -c {} -n {n}", r.test, r.clients);
            rep.push(Row::new(&test, name, side, "rate", Unit::PerSec, r.rps));
            if let Some(p50) = r.p50_ms {
                rep.push(Row::new(&test, name, side, "latency_p50", Unit::Ms, p50));
            }
        }
        if let Some(m) = &res.memcached {
            let test = format!("memcaslap -c {}", m.connections);
            rep.push(Row::new(&test, name, side, "rate", Unit::PerSec, m.tps));
            rep.push(Row::new(
                &test,
                name,
                side,
                "ops",
                Unit::Count,
                m.ops as f64,
            ));
        }
        if let Some(p) = &res.ping {
            let test = "sockperf ping-pong 64 B";
            for (metric, v) in [
                ("latency_avg", p.avg_us),
                ("latency_p50", p.p50_us),
                ("latency_p99", p.p99_us),
            ] {
                rep.push(Row::new(test, name, side, metric, Unit::Us, v).size(64));
            }
            rep.push(
                Row::new(
                    test,
                    name,
                    side,
                    "round_trips",
                    Unit::Count,
                    p.observations as f64,
                )
                .size(64),
            );
        }
    }
    rep.notes = vec![
        "Servers in namespace A (kernel .1 / shim engine .10), clients in B on the kernel.".into(),
        "rate: higher is better; latencies: lower is better (ratio_to_kernel < 1 means the shim is faster).".into(),
    ];
}

/// The readable table, generated from the report's rows: one line per (test, metric) with
/// the kernel's and the shim's value and their ratio.
pub fn table(net: u8, rep: &Report) -> String {
    let mut s = format!(
        "xwarp bench shim: veth pair 10.88.{}.0/24, servers in A (kernel .1 / shim engine .10), clients in B on the kernel\n\n",
        net
    );
    s += &format!(
        "{:<44} {:>12} {:>12} {:>10}\n",
        "test", "kernel", "shim", "shim/kern"
    );
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for r in &rep.rows {
        let key = (r.test.as_str(), r.metric.as_str());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let get = |name: &str| {
            rep.rows
                .iter()
                .find(|x| x.test == r.test && x.metric == r.metric && x.name == name)
        };
        let (k, x) = (get("kernel"), get("shim"));
        let prec = match r.unit {
            Unit::Us => 2,
            Unit::Ms => 3,
            _ => 0,
        };
        let v = |row: Option<&Row>| {
            row.map(|r| format!("{:.prec$}", r.value))
                .unwrap_or_else(|| "-".into())
        };
        let unit = match r.unit {
            Unit::PerSec => "/s",
            u => u.name(),
        };
        s += &format!(
            "{:<44} {:>12} {:>12} {:>10}\n",
            format!("{} {} ({unit})", r.test, r.metric),
            v(k),
            v(x),
            x.and_then(|x| x.ratio_to_kernel)
                .map(|_| fmt_ratio(x.and_then(|x| x.ratio_to_kernel)) + "x")
                .unwrap_or_else(|| "-".into())
        );
    }
    s += "\nrate: higher is better; latencies: lower is better (shim/kern < 1 means the shim is faster).\n";
    s
}
