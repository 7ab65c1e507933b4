//! `xwarp bench shim` output: the results as [`Report`] rows (the `--json` schema) and the
//! table printed from those rows.

use super::report::{fmt_ratio, Report, Row, Side, Unit};
use super::shim::{Options, StackResults};

/// Fill `rep` (made when the run started) with the options and both stacks' results.
///
/// Rows (name `kernel`, side kernel; name `shim`, side xwarp): test `redis SET -c 50 -n
/// 100000` and the like: `rate` (requests/s) and `latency_p50` (ms, as redis-benchmark
/// reports it); test `memcaslap -c 16`: `rate` (operations/s), `ops`; test `sockperf
/// ping-pong 64 B`: `latency_avg`, `latency_p50`, `latency_p99` (µs, half round trips, as
/// sockperf reports them), `round_trips`.
pub fn fill(rep: &mut Report, o: &Options, kernel: &StackResults, shim: &StackResults) {
    rep.config("net", o.net);
    rep.config("requests", o.requests);
    rep.config("latency_requests", o.latency_requests);
    rep.config("duration_s", o.duration.as_secs());
    rep.config("msg_size", 64);
    rep.config("redis", o.redis);
    rep.config("memcached", o.memcached);
    rep.config("sockperf", o.sockperf);
    for (name, side, res) in [
        ("kernel", Side::Kernel, kernel),
        ("shim", Side::Xwarp, shim),
    ] {
        for r in &res.redis {
            let n = if r.clients == 1 {
                o.latency_requests
            } else {
                o.requests
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
pub fn table(o: &Options, rep: &Report) -> String {
    let mut s = format!(
        "xwarp bench shim: veth pair 10.88.{}.0/24, servers in A (kernel .1 / shim engine .10), clients in B on the kernel\n\n",
        o.net
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
