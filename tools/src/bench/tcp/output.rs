//! `xwarp bench tcp` output: the results as [`Report`] rows (the `--json` schema) and the
//! table printed from those rows.

use super::options::{Options, PairKind, PairResult};
use crate::bench::report::{fmt_opt, fmt_ratio, Dist, Report, Row, Side, Unit};

/// The side of a pair's rows.
fn side(k: PairKind) -> Side {
    match k {
        PairKind::KernelKernel | PairKind::KernelBusyPoll => Side::Kernel,
        PairKind::XwarpKernel | PairKind::XwarpXwarp => Side::Xwarp,
        PairKind::AfxdpCeiling => Side::Ceiling,
    }
}

/// Fill `rep` (made when the run started) with the options and the results.
///
/// Rows: test `bulk` (per write size; the afxdp-ceiling without one): metric `bandwidth`
/// (Gbit/s, with the runs' spread and the bytes moved), `cpu_client`, `cpu_server`,
/// `cpu_engine` (s/GB); test `pingpong` (64 B): `latency_p50` (with the merged half round
/// trip distribution), `latency_p90`, `latency_p99` (µs, one-way: half the round trip).
/// Row names: [`super::row_name`] (xwarp pairs carry their mode and TCP core).
pub fn fill(rep: &mut Report, o: &Options, rs: &[PairResult]) {
    rep.config("mtu", o.mtu);
    rep.config("duration_s", o.duration.as_secs_f64());
    rep.config("sizes", o.sizes.clone());
    rep.config("pin", format!("{:?}", o.pin).to_lowercase());
    rep.config("engine_spin", format!("{:?}", o.spin));
    rep.config("app_spin_us", o.app_spin.as_micros() as u64);
    rep.config("repeat", o.repeat);
    rep.config("rps", o.rps.name());
    rep.config("xdp_mode", o.xdp_mode.name());
    rep.config("net", o.net);
    rep.config(
        "pairs",
        o.pairs.iter().map(|p| p.name()).collect::<Vec<_>>(),
    );
    rep.config("ping_size", super::options::PING_SIZE);
    rep.config(
        "modes",
        o.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
    );
    rep.config("tcp_core", super::options::core_name(o.tcp_core));
    rep.config("busy_poll_us", super::traffic::BUSY_POLL_US);
    for r in rs {
        let (name, sd) = (r.name.as_str(), side(r.kind));
        for b in &r.bulk {
            let sized = |row: Row| match b.size {
                Some(s) => row.size(s),
                None => row.note("MTU-sized frames, no TCP"),
            };
            rep.push(sized(
                Row::new("bulk", name, sd, "bandwidth", Unit::Gbps, b.gbps)
                    .spread(r.runs, b.gbps_min, b.gbps_max)
                    .bytes(b.bytes),
            ));
            for (metric, v) in [
                ("cpu_client", b.client_cpu_s_per_gb),
                ("cpu_server", b.server_cpu_s_per_gb),
                ("cpu_engine", Some(b.engine_cpu_s_per_gb)),
            ] {
                if let Some(v) = v {
                    rep.push(sized(Row::new("bulk", name, sd, metric, Unit::SecPerGb, v)));
                }
            }
        }
        let ping = |metric, v| {
            Row::new("pingpong", name, sd, metric, Unit::Us, v).size(super::options::PING_SIZE)
        };
        let dist = r
            .half_rtt_ns
            .as_ref()
            .and_then(|h| Dist::from_histogram_ns(h, 1.0));
        rep.push(ping("latency_p50", r.half_rtt_p50_us).dist(dist));
        rep.push(ping("latency_p90", r.half_rtt_p90_us));
        rep.push(ping("latency_p99", r.half_rtt_p99_us));
    }
    rep.notes = vec![
        "Values are medians of the rounds (--repeat); min/max: the bulk spread over the rounds.".into(),
        "bandwidth: bulk goodput at the receiver; latency: 64-byte ping-pong half round trip; ratio_to_kernel: to kernel-kernel (targets: xwarp-xwarp bulk >= 0.8, half RTT <= 0.5).".into(),
        "cpu_*: CPU seconds per GB on the client and server application threads (getrusage RUSAGE_THREAD) and on the engine threads.".into(),
        "afxdp-ceiling: UDP frames between the two AF_XDP sockets with one copy at each end and no TCP, the most any TCP engine on this AF_XDP path could move; its latency rows: 64-byte UDP ping-pong between the two sockets, both spinning, the least any engine on this path could take (xwarp_tools::bench::ceiling).".into(),
        "kernel-busypoll: ping-pong only, kernel sockets non-blocking with SO_BUSY_POLL, both ends spinning on their reads (ratio_to_kernel of the latency rows is against the blocking kernel-kernel row; the table prints the ratio to kernel-busypoll beside it).".into(),
        "xwarp row names: pair/mode/tcp_core (mode thread: engine threads; inline: the application threads drive their engines).".into(),
    ];
}

/// The readable table, generated from the report's rows: one line per row name and bulk
/// size (a ping-pong-only row such as kernel-busypoll has one line without bulk values).
pub fn table(o: &Options, rep: &Report) -> String {
    let mut s = format!(
        "xwarp bench tcp: veth pair, IP MTU {}, {:.1} s per run, pin {:?}, engine spin {:?}, app spin {:?}, RPS {}, XDP {}, TCP core {}\n\n",
        o.mtu,
        o.duration.as_secs_f64(),
        o.pin,
        o.spin,
        o.app_spin,
        o.rps.name(),
        o.xdp_mode.name(),
        super::options::core_name(o.tcp_core)
    );
    s += &format!(
        "{:<28} {:>7} {:>8} {:>13} {:>6} {:>6} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9}\n",
        "pair",
        "bytes",
        "Gbit/s",
        "(min-max)",
        "x kern",
        "x ceil",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "x kern",
        "x busy",
        "x ceil",
        "cli s/GB",
        "srv s/GB",
        "eng s/GB",
        "pingpongs"
    );
    let mut names: Vec<&str> = Vec::new();
    for r in rep
        .rows
        .iter()
        .filter(|r| r.test == "bulk" || r.test == "pingpong")
    {
        if !names.contains(&r.name.as_str()) {
            names.push(&r.name);
        }
    }
    let busy = rep.value("pingpong", "kernel-busypoll", "latency_p50");
    for name in names {
        let bw: Vec<_> = rep
            .rows
            .iter()
            .filter(|r| r.test == "bulk" && r.name == name && r.metric == "bandwidth")
            .collect();
        let p50 = rep.find("pingpong", name, "latency_p50");
        let p90 = rep.value("pingpong", name, "latency_p90");
        let p99 = rep.value("pingpong", name, "latency_p99");
        let x_busy = p50
            .zip(busy)
            .filter(|(_, b)| *b > 0.0 && name != "kernel-busypoll")
            .map(|(p, b)| p.value / b);
        let lines = bw.len().max(1);
        for i in 0..lines {
            let b = bw.get(i);
            let cpu = |m: &str| {
                b.and_then(|b| {
                    rep.rows
                        .iter()
                        .find(|r| {
                            r.test == "bulk" && r.name == name && r.metric == m && r.size == b.size
                        })
                        .map(|r| r.value)
                })
            };
            let first = i == 0;
            let lat = |v: Option<f64>| if first { fmt_opt(v, 2) } else { String::new() };
            let rat = |v: Option<f64>| if first { fmt_ratio(v) } else { String::new() };
            s += &format!(
                "{:<28} {:>7} {:>8} {:>13} {:>6} {:>6} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>9}\n",
                name,
                b.map_or("-".into(), |b| b.size.map(|s| s.to_string()).unwrap_or_else(|| "MTU".into())),
                b.map_or("-".into(), |b| format!("{:.2}", b.value)),
                b.map_or("-".into(), |b| format!("({}-{})", fmt_opt(b.min, 2), fmt_opt(b.max, 2))),
                fmt_ratio(b.and_then(|b| b.ratio_to_kernel)),
                fmt_ratio(b.and_then(|b| b.ratio_to_ceiling)),
                lat(p50.map(|r| r.value)),
                lat(p90),
                lat(p99),
                rat(p50.and_then(|r| r.ratio_to_kernel)),
                rat(x_busy),
                rat(p50.and_then(|r| r.ratio_to_ceiling)),
                fmt_opt(cpu("cpu_client"), 3),
                fmt_opt(cpu("cpu_server"), 3),
                fmt_opt(cpu("cpu_engine"), 3),
                if first {
                    p50.and_then(|r| r.dist.as_ref()).map_or("-".into(), |d| d.count.to_string())
                } else {
                    String::new()
                }
            );
        }
    }
    s += "\nValues are medians of the rounds (--repeat); (min-max): bulk spread over the rounds.\n";
    s += "Gbit/s: bulk goodput at each write size; p50/p90/p99: 64-byte ping-pong half round trip; x kern:\n\
          ratio to kernel-kernel at the same size (targets: xwarp-xwarp bulk >= 0.8, half RTT <= 0.5);\n\
          x busy: p50 over kernel-busypoll's (both ends spinning on non-blocking SO_BUSY_POLL sockets);\n\
          x ceil: ratio to afxdp-ceiling (bulk and p50); s/GB: CPU seconds per GB on the client and server application\n\
          threads (getrusage RUSAGE_THREAD) and on the engine threads.\n\
          afxdp-ceiling: UDP frames between the two AF_XDP sockets with one copy at each end and no TCP,\n\
          the most any TCP engine on this AF_XDP path could move; its p50/p90/p99: 64-byte UDP ping-pong\n\
          between the two sockets, both spinning, the least any engine on this path could take.\n\
          xwarp rows: pair/mode/tcp-core (thread: engine threads; inline: application threads drive the engine).\n";
    s
}

#[cfg(test)]
mod tests {
    use super::super::options::BulkResult;
    use super::*;

    fn pair(kind: PairKind, gbps: &[(Option<usize>, f64)], p50: f64) -> PairResult {
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).unwrap();
        h.record((p50 * 1e3) as u64).unwrap();
        PairResult {
            kind,
            name: kind.name().into(),
            runs: 1,
            bulk: gbps
                .iter()
                .map(|&(size, g)| BulkResult {
                    size,
                    gbps: g,
                    gbps_min: g,
                    gbps_max: g,
                    bytes: 1,
                    client_cpu_s_per_gb: size.map(|_| 0.5),
                    server_cpu_s_per_gb: size.map(|_| 0.25),
                    engine_cpu_s_per_gb: 0.0,
                })
                .collect(),
            half_rtt_p50_us: p50,
            half_rtt_p90_us: p50 * 1.5,
            half_rtt_p99_us: p50 * 2.0,
            pingpongs: 10,
            half_rtt_ns: kind.ne(&PairKind::AfxdpCeiling).then_some(h),
        }
    }

    #[test]
    fn rows_table_and_json_carry_ratios_per_size() {
        let rs = [
            pair(
                PairKind::KernelKernel,
                &[(Some(1024), 5.0), (Some(65536), 10.0)],
                10.0,
            ),
            pair(
                PairKind::XwarpXwarp,
                &[(Some(1024), 4.0), (Some(65536), 8.0)],
                4.0,
            ),
            pair(PairKind::KernelBusyPoll, &[], 8.0),
            pair(PairKind::AfxdpCeiling, &[(None, 16.0)], 2.0),
        ];
        let o = Options::default();
        let mut rep = Report::new("tcp");
        fill(&mut rep, &o, &rs);
        rep.fill_ratios();
        let x = |size| {
            rep.rows
                .iter()
                .find(|r| {
                    r.name == "xwarp-xwarp" && r.metric == "bandwidth" && r.size == Some(size)
                })
                .unwrap()
        };
        assert_eq!(x(1024).ratio_to_kernel, Some(0.8));
        assert_eq!(x(65536).ratio_to_kernel, Some(0.8));
        assert_eq!(x(65536).ratio_to_ceiling, Some(0.5));
        let lat = rep.find("pingpong", "xwarp-xwarp", "latency_p50").unwrap();
        assert_eq!(lat.ratio_to_kernel, Some(0.4));
        assert_eq!(lat.dist.as_ref().map(|d| d.count), Some(1));
        // The ceiling's ping-pong bounds the latency rows; it has no application CPU.
        assert_eq!(lat.ratio_to_ceiling, Some(2.0));
        let ceil = rep
            .find("pingpong", "afxdp-ceiling", "latency_p50")
            .unwrap();
        assert_eq!(ceil.ratio_to_kernel, Some(0.2));
        assert!(rep.find("bulk", "afxdp-ceiling", "cpu_client").is_none());
        let t = table(&o, &rep);
        assert!(
            t.contains("xwarp-xwarp") && t.contains("0.80") && t.contains("0.40"),
            "{t}"
        );
        assert!(t.contains("65536") && t.contains("MTU"), "{t}");
        // The busy-poll row: ping-pong only, one line; the xwarp row's p50 over it (4/8).
        let busy_line = t
            .lines()
            .find(|l| l.starts_with("kernel-busypoll"))
            .unwrap();
        assert!(
            busy_line.contains("8.00") && busy_line.contains("12.00"),
            "{busy_line}"
        );
        let x_line = t.lines().find(|l| l.starts_with("xwarp-xwarp")).unwrap();
        assert!(x_line.contains(" 0.50 "), "{x_line}");
        assert_eq!(
            rep.value("pingpong", "xwarp-xwarp", "latency_p90"),
            Some(6.0)
        );
        // Latency ratios to the kernel are against the blocking row (pushed first).
        assert_eq!(lat.kernel_row.as_deref(), Some("kernel-kernel"));
        assert!(rep.find("bulk", "kernel-busypoll", "bandwidth").is_none());
        let back = Report::from_json(&rep.to_json()).unwrap();
        assert_eq!(back, rep);
    }
}
