//! `xwarp bench tcp`: TCP over one veth pair, side by side.
//!
//! Setup (root): namespaces A and B joined by a veth pair ([`VethPair`]); the kernel owns
//! `10.88.<net>.1` (A) and `.2` (B); xwarp engines own `.10` (AF_XDP on `veth-a`) and `.20`
//! (on `veth-b`), addresses the kernels do not have. Connections go from A to B:
//!
//! | pair | client (A) | server (B) |
//! |---|---|---|
//! | `kernel-kernel` | kernel socket | kernel socket |
//! | `xwarp-kernel` | xwarp engine A | kernel socket |
//! | `xwarp-xwarp` | xwarp engine A | xwarp engine B |
//! | `afxdp-ceiling` | raw AF_XDP socket A | raw AF_XDP socket B |
//!
//! `afxdp-ceiling` is no TCP at all: UDP frames from one AF_XDP socket to the other with one
//! copy at each end ([`super::ceiling`]), the upper bound of the xwarp rows on this path
//! (bulk only). The engines' socket buffers scale with the MTU ([`socket_buffer`]).
//!
//! The kernel baseline runs first, before any XDP program is attached to the pair (an
//! attached program changes the veth's offloads). Per pair:
//! * **bulk**: the client writes `--msg-size` byte messages for `--duration` seconds, the
//!   server reads and counts; throughput is received bytes over the receiver's time from the
//!   first byte to end of stream. Bytes are checked (a running sequence pattern).
//! * **ping-pong**: 64-byte request, 64-byte reply, for `--duration` seconds after a
//!   warm-up; half round trip = round trip / 2 into an HDR histogram (p50, p99).
//! * **CPU**: `getrusage(RUSAGE_THREAD)` on the client and server application threads
//!   (user + system) during bulk, per GB moved; the xwarp engine threads' CPU time is
//!   reported beside it (they spin, so it is mostly the spin budget).
//!
//! Pinning (`--pin`) and spinning: the machine may have only 2 cores while the xwarp↔xwarp
//! case runs four threads (two applications, two engines). Default `sides`: client and
//! engine A on the first core, server and engine B on the second. Engines spin for 1 ms
//! when idle (`--spin-us`), applications do not spin (`--app-spin-us 0`): an application
//! that spins on the core of its own engine only delays the engine it waits for, while a
//! sleeping application woken by its engine's readiness eventfd preempts the spinning engine
//! at once (same core, no IPI). Measured on 2 vCPUs: this gives the lowest half round trip
//! (~9 µs); app spin 20 µs gives ~30 µs, engines sleeping at once ~30 µs, engines and apps
//! split across cores (`split`) ~40–95 µs. Note that the kernel baseline's ping-pong depends
//! on placement as well: `sides` puts its client and server on different cores (cross-core
//! wakeups, ~20 µs); with `none` the scheduler co-locates them (~7 µs).
//! RPS (`--rps`): with `sides`, the `xwarp-kernel` pair runs with RPS masks on the veth
//! receive queues for their side's core, so the kernel receiver's TCP input runs on its own
//! core instead of in the xwarp engine's `sendto` softirq on the engine's core. The
//! `kernel-kernel` baseline runs without RPS (the kernel default): there RPS *costs* the
//! kernel about half its bulk rate. Measured at MTU 9000 in one run: kernel-kernel bulk
//! 24.6 Gbit/s at 0.46 CPU s/GB without RPS, 10.4 at 1.03 with it (its receive processing
//! moves to the receiver's core, which then also copies to the reader, while the sender's
//! core waits; without RPS the sender's softirq does TCP input and the receiver only copies).
//! `--rps all` gives the kernel pair RPS too (the old default, for comparison).

use std::ffi::OsString;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use hdrhistogram::Histogram;
use xwarp::poll_driver::backend::Backend;
use xwarp::poll_driver::netns::{NetNs, VethPair};

mod options;
mod traffic;

use options::*;

pub use options::{parse_args, Options, PairKind, PairResult, Pin, Rps};
use traffic::*;

use super::common::{self, socket_buffer};
use xwarp::net::{TcpListener, TcpStream};
use xwarp::toe::{start_xdp_engine, XdpEngine, XdpEngineConfig};

/// Entry point of `xwarp bench tcp`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    // --help / --version: on stdout, status 0; a bad command line: status 2 with the usage.
    let cli = options::parse_cli(&args).unwrap_or_else(|e| e.exit());
    let opts = match options::check(cli) {
        Ok(o) => o,
        Err(e) => {
            let usage = <options::Cli as clap::CommandFactory>::command().render_usage();
            eprintln!("xwarp bench tcp: {e}\n\n{usage}\n\nFor more information, try '--help'.");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(results) => {
            print!("{}", table(&opts, &results));
            if let Some(path) = &opts.json {
                if let Err(e) = std::fs::write(path, json(&opts, &results)) {
                    eprintln!("xwarp bench tcp: writing {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xwarp bench tcp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The test network and addresses.
struct Net {
    veth: VethPair,
    xa: Ipv4Addr,
    xb: Ipv4Addr,
}

fn setup(o: &Options) -> io::Result<Net> {
    let veth = VethPair::new(o.net)?;
    let mtu = o.mtu.to_string();
    veth.a.ip(&["link", "set", &veth.if_a, "mtu", &mtu])?;
    veth.b.ip(&["link", "set", &veth.if_b, "mtu", &mtu])?;
    Ok(Net {
        xa: Ipv4Addr::new(10, 88, o.net, 10),
        xb: Ipv4Addr::new(10, 88, o.net, 20),
        veth,
    })
}

/// RPS for the pair about to run (`on`) or off: receive processing of each side on that
/// side's core (`--pin sides` only). Without it the receiver's whole TCP input runs in the
/// sender's `sendto`/softirq on the sender's core. Measured earlier: xwarp-kernel ~3.2 ->
/// ~6.6 Gbit/s with it; kernel-kernel loses with it (module docs).
fn apply_rps(net: &Net, o: &Options, on: bool) -> io::Result<()> {
    if o.pin != Pin::Sides {
        return Ok(());
    }
    let [_, _, core_a, core_b] = placement(o.pin);
    let v = &net.veth;
    for (ns, ifname, core) in [(&v.a, &v.if_a, core_a), (&v.b, &v.if_b, core_b)] {
        if let Some(c) = core.filter(|c| *c < 64) {
            set_rps(ns, ifname, if on { 1u64 << c } else { 0 })?;
        }
    }
    Ok(())
}

/// Steer receive processing of `ifname`'s queue 0 to the CPUs in `mask` (RPS). Runs through
/// `ip netns exec`, which mounts the namespace's own /sys.
fn set_rps(ns: &NetNs, ifname: &str, mask: u64) -> io::Result<()> {
    let path = format!("/sys/class/net/{ifname}/queues/rx-0/rps_cpus");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "sh", "-c"])
        .arg(format!("echo {mask:x} > {path}"))
        .stdin(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "setting {path} in {}: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn start_engine(
    net: &Net,
    o: &Options,
    side_a: bool,
    core: Option<usize>,
) -> io::Result<XdpEngine> {
    let (ns, ifname, ip, name) = if side_a {
        (&net.veth.a, &net.veth.if_a, net.xa, "bench-engine-a")
    } else {
        (&net.veth.b, &net.veth.if_b, net.xb, "bench-engine-b")
    };
    let mut cfg = XdpEngineConfig::new(ifname, ip, 24);
    // Frames larger than a chunk: multi-buffer (descriptor chains).
    (cfg.chunk, cfg.multi_buffer) = common::umem_for_mtu(o.mtu);
    cfg.engine.name = name.into();
    cfg.engine.core = core;
    cfg.engine.spin = o.spin;
    cfg.mode = o.xdp_mode;
    let buffer = socket_buffer(o.mtu);
    cfg.stack.rx_buffer = buffer;
    cfg.stack.tx_buffer = buffer;
    // RX chunks for that window (see `rx_frames_for`).
    cfg.rx_frames = common::rx_frames_for(o.mtu, buffer);
    // Application rings of half the socket buffer (at least 256 KiB, the stack's default):
    // at MTU 60000 a 256 KiB ring holds four 64 KiB writes and the writer sleeps on it every
    // few segments; measured xwarp-xwarp 21.2-21.5 Gbit/s with 256 KiB, 24.0-25.3 with 1 MiB
    // (quiet rounds).
    cfg.stack.ring_size = (buffer / 2).max(256 << 10);
    cfg.stack.tcp.nodelay = true;
    start_xdp_engine(Some(ns), cfg)
}

fn kernel_listener(net: &Net, port: u16) -> io::Result<std::net::TcpListener> {
    let addr = SocketAddr::from((net.veth.addr_b, port));
    net.veth.b.run(move || std::net::TcpListener::bind(addr))?
}

fn kernel_connect(net: &Net, port: u16) -> io::Result<Box<dyn Conn>> {
    let addr = SocketAddr::from((net.veth.addr_b, port));
    let s = net
        .veth
        .a
        .run(move || std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)))??;
    Ok(Box::new(s))
}

fn kernel_acceptor(l: std::net::TcpListener) -> Acceptor {
    Box::new(move || {
        let (s, _) = l.accept()?;
        Ok(Box::new(s) as Box<dyn Conn>)
    })
}

fn xwarp_acceptor(l: TcpListener) -> Acceptor {
    Box::new(move || {
        let (s, _) = l.accept()?;
        Ok(Box::new(s) as Box<dyn Conn>)
    })
}

fn xwarp_connector(e: &XdpEngine, addr: SocketAddr) -> Connector<'_> {
    Box::new(move || {
        let s = TcpStream::connect_timeout(e.stack(), addr, Duration::from_secs(5))?;
        Ok(Box::new(s) as Box<dyn Conn>)
    })
}

fn per_gb(cpu: Duration, bytes: u64) -> f64 {
    if bytes == 0 {
        return 0.0;
    }
    cpu.as_secs_f64() / (bytes as f64 / 1e9)
}

fn engine_cpu(engines: &[&XdpEngine]) -> Duration {
    engines
        .iter()
        .filter_map(|e| e.engine().cpu_time().ok())
        .sum()
}

fn result(
    kind: PairKind,
    bulk: (BulkSide, BulkSide),
    engine_cpu: Duration,
    h: &Histogram<u64>,
) -> PairResult {
    let (c, s) = bulk;
    let secs = s.elapsed.as_secs_f64().max(1e-9);
    let gbps = s.bytes as f64 * 8.0 / secs / 1e9;
    PairResult {
        kind,
        runs: 1,
        bulk_gbps: gbps,
        bulk_gbps_min: gbps,
        bulk_gbps_max: gbps,
        bulk_bytes: s.bytes,
        client_cpu_s_per_gb: per_gb(c.cpu, s.bytes),
        server_cpu_s_per_gb: per_gb(s.cpu, s.bytes),
        engine_cpu_s_per_gb: per_gb(engine_cpu, s.bytes),
        half_rtt_p50_us: h.value_at_quantile(0.50) as f64 / 1e3,
        half_rtt_p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
        pingpongs: h.len(),
    }
}

/// Run every requested pair over one fresh veth pair.
pub fn run(o: &Options) -> io::Result<Vec<PairResult>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "needs root (network namespaces, veth, AF_XDP)",
        ));
    }
    let net = setup(o)?;
    let mut order = o.pairs.clone();
    order.sort_by_key(|p| *p as u8);
    order.dedup();
    let mut samples: Vec<Vec<PairResult>> = vec![Vec::new(); order.len()];
    for round in 0..o.repeat {
        for (i, r) in run_round(o, &net, &order, round)?.into_iter().enumerate() {
            samples[i].push(r);
        }
    }
    Ok(samples.iter().filter_map(|s| median(s)).collect())
}

/// The median of each measured value over repeated runs of one pair (bulk min/max kept).
fn median(runs: &[PairResult]) -> Option<PairResult> {
    let first = runs.first()?;
    let med = |f: fn(&PairResult) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let gbps = runs.iter().map(|r| r.bulk_gbps);
    Some(PairResult {
        kind: first.kind,
        runs: runs.len() as u32,
        bulk_gbps: med(|r| r.bulk_gbps),
        bulk_gbps_min: gbps.clone().fold(f64::INFINITY, f64::min),
        bulk_gbps_max: gbps.fold(0.0, f64::max),
        bulk_bytes: runs.iter().map(|r| r.bulk_bytes).sum(),
        client_cpu_s_per_gb: med(|r| r.client_cpu_s_per_gb),
        server_cpu_s_per_gb: med(|r| r.server_cpu_s_per_gb),
        engine_cpu_s_per_gb: med(|r| r.engine_cpu_s_per_gb),
        half_rtt_p50_us: med(|r| r.half_rtt_p50_us),
        half_rtt_p99_us: med(|r| r.half_rtt_p99_us),
        pingpongs: runs.iter().map(|r| r.pingpongs).sum(),
    })
}

/// One measurement of every pair in `order` (kernel baseline first: engines of the
/// previous round have stopped, so no XDP program is attached to the pair then).
fn run_round(
    o: &Options,
    net: &Net,
    order: &[PairKind],
    round: u32,
) -> io::Result<Vec<PairResult>> {
    let [client_core, server_core, core_a, core_b] = placement(o.pin);
    let ends = Ends {
        client_core,
        server_core,
    };
    let mut out = Vec::new();
    for &kind in order {
        eprintln!(
            "xwarp bench tcp: round {}/{}: {} ...",
            round + 1,
            o.repeat,
            kind.name()
        );
        let kserver = SocketAddr::from((net.veth.addr_b, BULK_PORT));
        apply_rps(net, o, o.rps.applies(kind))?;
        let r = match kind {
            PairKind::KernelKernel => {
                let bulk = run_bulk(
                    &ends,
                    kernel_acceptor(kernel_listener(net, BULK_PORT)?),
                    Box::new(|| kernel_connect(net, BULK_PORT)),
                    o,
                )?;
                let h = run_ping(
                    &ends,
                    kernel_acceptor(kernel_listener(net, PING_PORT)?),
                    Box::new(|| kernel_connect(net, PING_PORT)),
                    o,
                )?;
                result(kind, bulk, Duration::ZERO, &h)
            }
            PairKind::XwarpKernel => {
                let ea = start_engine(net, o, true, core_a)?;
                let cpu0 = engine_cpu(&[&ea]);
                let bulk = run_bulk(
                    &ends,
                    kernel_acceptor(kernel_listener(net, BULK_PORT)?),
                    xwarp_connector(&ea, kserver),
                    o,
                )?;
                let ecpu = engine_cpu(&[&ea]) - cpu0;
                let h = run_ping(
                    &ends,
                    kernel_acceptor(kernel_listener(net, PING_PORT)?),
                    xwarp_connector(&ea, SocketAddr::from((net.veth.addr_b, PING_PORT))),
                    o,
                )?;
                let r = result(kind, bulk, ecpu, &h);
                report_engine("A", ea, r.bulk_bytes)?;
                r
            }
            PairKind::XwarpXwarp => {
                let ea = start_engine(net, o, true, core_a)?;
                let eb = start_engine(net, o, false, core_b)?;
                let cpu0 = engine_cpu(&[&ea, &eb]);
                let bulk = run_bulk(
                    &ends,
                    xwarp_acceptor(TcpListener::bind(
                        eb.stack(),
                        SocketAddr::from((net.xb, BULK_PORT)),
                    )?),
                    xwarp_connector(&ea, SocketAddr::from((net.xb, BULK_PORT))),
                    o,
                )?;
                let ecpu = engine_cpu(&[&ea, &eb]) - cpu0;
                let h = run_ping(
                    &ends,
                    xwarp_acceptor(TcpListener::bind(
                        eb.stack(),
                        SocketAddr::from((net.xb, PING_PORT)),
                    )?),
                    xwarp_connector(&ea, SocketAddr::from((net.xb, PING_PORT))),
                    o,
                )?;
                let r = result(kind, bulk, ecpu, &h);
                report_engine("A", ea, r.bulk_bytes)?;
                report_engine("B", eb, r.bulk_bytes)?;
                r
            }
            PairKind::AfxdpCeiling => ceiling_result(net, o, core_a, core_b)?,
        };
        out.push(r);
    }
    Ok(out)
}

/// Stop an engine and print its NIC and XDP counters on stderr: frames dropped anywhere on
/// the AF_XDP path mean TCP recovery inside the measurement, and transmitted bytes beyond
/// the bulk goodput (`wire/goodput`) show retransmissions (ping-pong frames add ~0.1%).
fn report_engine(name: &str, e: XdpEngine, goodput: u64) -> io::Result<()> {
    let exit = e.stop()?;
    let nic = exit.backend.stats();
    let x = exit.backend.xdp_statistics().unwrap_or_default();
    eprintln!(
        "  engine {name}: nic tx {} frames {:.1} MB (wire/goodput {:.3}), rx {} frames, dropped {}; \
         xdp rx_dropped {} rx_ring_full {} fill_ring_empty {} invalid rx/tx {}/{}",
        nic.tx_frames,
        nic.tx_bytes as f64 / 1e6,
        nic.tx_bytes as f64 / goodput.max(1) as f64,
        nic.rx_frames,
        nic.dropped,
        x.rx_dropped,
        x.rx_ring_full,
        x.rx_fill_ring_empty_descs,
        x.rx_invalid_descs,
        x.tx_invalid_descs
    );
    Ok(())
}

/// The `afxdp-ceiling` row: one [`super::ceiling::run`]; its threads' CPU is the engine
/// column (they are the engines), there is no ping-pong (NaN, printed as `-`).
fn ceiling_result(
    net: &Net,
    o: &Options,
    core_a: Option<usize>,
    core_b: Option<usize>,
) -> io::Result<PairResult> {
    use super::ceiling::{run, Settings, Side};
    let v = &net.veth;
    let side_a = Side {
        ns: &v.a,
        ifname: &v.if_a,
        ip: net.xa,
        core: core_a,
    };
    let side_b = Side {
        ns: &v.b,
        ifname: &v.if_b,
        ip: net.xb,
        core: core_b,
    };
    let out = run(
        &side_a,
        &side_b,
        &Settings {
            mtu: o.mtu,
            mode: o.xdp_mode,
            duration: o.duration,
        },
    )?;
    if out.lost > 0 {
        eprintln!(
            "xwarp bench tcp: afxdp-ceiling: {} of {} frames lost (flow control keeps the fill ring fed; a loss means the kernel dropped)",
            out.lost, out.sent.frames
        );
    }
    let r = &out.received;
    let gbps = r.bytes as f64 * 8.0 / r.elapsed.as_secs_f64().max(1e-9) / 1e9;
    Ok(PairResult {
        kind: PairKind::AfxdpCeiling,
        runs: 1,
        bulk_gbps: gbps,
        bulk_gbps_min: gbps,
        bulk_gbps_max: gbps,
        bulk_bytes: r.bytes,
        client_cpu_s_per_gb: 0.0,
        server_cpu_s_per_gb: 0.0,
        engine_cpu_s_per_gb: per_gb(out.sent.cpu + r.cpu, r.bytes),
        half_rtt_p50_us: f64::NAN,
        half_rtt_p99_us: f64::NAN,
        pingpongs: 0,
    })
}

fn ratio(x: f64, base: Option<f64>) -> Option<f64> {
    base.filter(|b| *b > 0.0)
        .map(|b| x / b)
        .filter(|r| r.is_finite())
}

/// The readable table, with ratios to the kernel baseline (when it ran).
pub fn table(o: &Options, rs: &[PairResult]) -> String {
    let base = rs.iter().find(|r| r.kind == PairKind::KernelKernel);
    let mut s = format!(
        "xwarp bench tcp: veth pair, IP MTU {}, {:.1} s per run, {}-byte writes, pin {:?}, engine spin {:?}, app spin {:?}, RPS {}, XDP {}\n\n",
        o.mtu,
        o.duration.as_secs_f64(),
        o.msg_size,
        o.pin,
        o.spin,
        o.app_spin,
        o.rps.name(),
        o.xdp_mode.name()
    );
    s += &format!(
        "{:<14} {:>9} {:>13} {:>7} {:>10} {:>10} {:>7} {:>11} {:>11} {:>11} {:>11}\n",
        "pair",
        "Gbit/s",
        "(min-max)",
        "x kern",
        "p50 µs",
        "p99 µs",
        "x kern",
        "cli s/GB",
        "srv s/GB",
        "eng s/GB",
        "pingpongs"
    );
    let fmt_ratio = |r: Option<f64>| r.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
    // A row without ping-pong (afxdp-ceiling) has NaN latencies.
    let fmt_us = |v: f64| {
        if v.is_finite() {
            format!("{v:.2}")
        } else {
            "-".into()
        }
    };
    for r in rs {
        s += &format!(
            "{:<14} {:>9.2} {:>13} {:>7} {:>10} {:>10} {:>7} {:>11.3} {:>11.3} {:>11.3} {:>11}\n",
            r.kind.name(),
            r.bulk_gbps,
            format!("({:.2}-{:.2})", r.bulk_gbps_min, r.bulk_gbps_max),
            fmt_ratio(ratio(r.bulk_gbps, base.map(|b| b.bulk_gbps))),
            fmt_us(r.half_rtt_p50_us),
            fmt_us(r.half_rtt_p99_us),
            fmt_ratio(ratio(r.half_rtt_p50_us, base.map(|b| b.half_rtt_p50_us))),
            r.client_cpu_s_per_gb,
            r.server_cpu_s_per_gb,
            r.engine_cpu_s_per_gb,
            r.pingpongs
        );
    }
    s += "\nValues are medians of the rounds (--repeat); (min-max): bulk spread over the rounds.\n";
    s += "Gbit/s: bulk goodput; p50/p99: 64-byte ping-pong half round trip; x kern: ratio to kernel-kernel\n\
          (targets: xwarp-xwarp bulk >= 0.8, half RTT <= 0.5); s/GB: CPU seconds per GB on the client and\n\
          server application threads (getrusage RUSAGE_THREAD) and on the engine threads.\n\
          afxdp-ceiling: UDP frames between the two AF_XDP sockets with one copy at each end and no TCP,\n\
          the most any TCP engine on this AF_XDP path could move (xwarp::bench::ceiling).\n";
    s
}

/// The results as JSON.
pub fn json(o: &Options, rs: &[PairResult]) -> String {
    let base = rs.iter().find(|r| r.kind == PairKind::KernelKernel);
    let num = |v: Option<f64>| match v {
        Some(v) if v.is_finite() => format!("{v:.4}"),
        _ => "null".into(),
    };
    let mut s = format!(
        "{{\n  \"config\": {{\"mtu\": {}, \"duration_s\": {}, \"msg_size\": {}, \"pin\": \"{:?}\", \"engine_spin\": \"{:?}\", \"app_spin_us\": {}, \"repeat\": {}, \"rps\": \"{}\", \"xdp_mode\": \"{}\"}},\n  \"results\": [\n",
        o.mtu,
        o.duration.as_secs_f64(),
        o.msg_size,
        o.pin,
        o.spin,
        o.app_spin.as_micros(),
        o.repeat,
        o.rps.name(),
        o.xdp_mode.name()
    );
    for (i, r) in rs.iter().enumerate() {
        s += &format!(
            "    {{\"pair\": \"{}\", \"runs\": {}, \"bulk_gbps\": {}, \"bulk_gbps_min\": {}, \"bulk_gbps_max\": {}, \"bulk_bytes\": {}, \"bulk_ratio_to_kernel\": {}, \"half_rtt_p50_us\": {}, \"half_rtt_p99_us\": {}, \"half_rtt_p50_ratio_to_kernel\": {}, \"pingpongs\": {}, \"client_cpu_s_per_gb\": {}, \"server_cpu_s_per_gb\": {}, \"engine_cpu_s_per_gb\": {}}}{}\n",
            r.kind.name(),
            r.runs,
            num(Some(r.bulk_gbps)),
            num(Some(r.bulk_gbps_min)),
            num(Some(r.bulk_gbps_max)),
            r.bulk_bytes,
            num(ratio(r.bulk_gbps, base.map(|b| b.bulk_gbps))),
            num(Some(r.half_rtt_p50_us)),
            num(Some(r.half_rtt_p99_us)),
            num(ratio(r.half_rtt_p50_us, base.map(|b| b.half_rtt_p50_us))),
            r.pingpongs,
            num(Some(r.client_cpu_s_per_gb)),
            num(Some(r.server_cpu_s_per_gb)),
            num(Some(r.engine_cpu_s_per_gb)),
            if i + 1 < rs.len() { "," } else { "" }
        );
    }
    s += "  ]\n}\n";
    s
}

#[cfg(test)]
mod tests {
    use super::super::common::pattern;
    use super::*;
    use xwarp::poll_driver::afxdp::XdpMode;
    use xwarp::poll_driver::engine::SpinBudget;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_options_and_rejects_bad_ones() {
        let o = parse_args(&args(&[
            "--duration",
            "1.5",
            "--msg-size",
            "1000",
            "--pin",
            "none",
            "--only",
            "xwarp-xwarp,kernel-kernel",
            "--spin-us",
            "forever",
            "--mtu",
            "3000",
            "--repeat",
            "5",
            "--rps",
            "all",
            "--xdp-mode",
            "native",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(o.duration, Duration::from_millis(1500));
        assert_eq!(o.msg_size, 1000);
        assert_eq!(o.repeat, 5);
        assert_eq!(o.rps, Rps::All);
        assert_eq!(o.xdp_mode, XdpMode::Native);
        assert_eq!(Options::default().xdp_mode, XdpMode::Generic);
        assert!(Rps::All.applies(PairKind::KernelKernel));
        assert_eq!(Options::default().rps, Rps::XwarpKernel);
        assert!(!Rps::XwarpKernel.applies(PairKind::KernelKernel));
        assert!(Rps::XwarpKernel.applies(PairKind::XwarpKernel));
        assert!(!Rps::None.applies(PairKind::XwarpKernel));
        assert_eq!(o.pin, Pin::None);
        assert_eq!(o.spin, SpinBudget::Forever);
        assert_eq!(o.mtu, 3000);
        assert_eq!(o.pairs, vec![PairKind::XwarpXwarp, PairKind::KernelKernel]);
        assert!(parse_args(&args(&["--help"])).unwrap().is_none());
        for bad in [
            &["--duration"][..],
            &["--duration", "x"],
            &["--msg-size", "0"],
            &["--mtu", "60001"],
            &["--mtu", "575"],
            &["--pin", "diagonal"],
            &["--only", "kernel"],
            &["--net", "300"],
            &["--repeat", "0"],
            &["--rps", "some"],
            &["--xdp-mode", "zerocopy"],
            &["--frobnicate", "1"],
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn table_and_json_carry_ratios() {
        let r = |kind, gbps, p50| PairResult {
            kind,
            runs: 1,
            bulk_gbps: gbps,
            bulk_gbps_min: gbps,
            bulk_gbps_max: gbps,
            bulk_bytes: 1,
            client_cpu_s_per_gb: 0.5,
            server_cpu_s_per_gb: 0.25,
            engine_cpu_s_per_gb: 0.0,
            half_rtt_p50_us: p50,
            half_rtt_p99_us: p50 * 2.0,
            pingpongs: 10,
        };
        let rs = [
            r(PairKind::KernelKernel, 10.0, 10.0),
            r(PairKind::XwarpXwarp, 8.0, 4.0),
        ];
        let o = Options::default();
        let t = table(&o, &rs);
        assert!(
            t.contains("xwarp-xwarp") && t.contains("0.80") && t.contains("0.40"),
            "{t}"
        );
        let j = json(&o, &rs);
        assert!(j.contains("\"bulk_ratio_to_kernel\": 0.8000"), "{j}");
        assert!(
            j.contains("\"half_rtt_p50_ratio_to_kernel\": 0.4000"),
            "{j}"
        );
    }

    #[test]
    fn median_of_rounds_keeps_the_bulk_spread() {
        let r = |gbps: f64, p50: f64| PairResult {
            kind: PairKind::XwarpKernel,
            runs: 1,
            bulk_gbps: gbps,
            bulk_gbps_min: gbps,
            bulk_gbps_max: gbps,
            bulk_bytes: 10,
            client_cpu_s_per_gb: 1.0,
            server_cpu_s_per_gb: 2.0,
            engine_cpu_s_per_gb: 3.0,
            half_rtt_p50_us: p50,
            half_rtt_p99_us: p50,
            pingpongs: 5,
        };
        let m = median(&[r(1.0, 9.0), r(7.0, 3.0), r(4.0, 5.0)]).unwrap();
        assert_eq!(
            (m.bulk_gbps, m.bulk_gbps_min, m.bulk_gbps_max),
            (4.0, 1.0, 7.0)
        );
        assert_eq!(m.half_rtt_p50_us, 5.0);
        assert_eq!((m.runs, m.bulk_bytes, m.pingpongs), (3, 30, 15));
        let even = median(&[r(2.0, 1.0), r(4.0, 3.0)]).unwrap();
        assert_eq!((even.bulk_gbps, even.half_rtt_p50_us), (3.0, 2.0));
        assert!(median(&[]).is_none());
    }

    #[test]
    fn pattern_is_not_periodic_at_small_powers_of_two() {
        for p in [256u64, 4096, 65536, 1 << 20] {
            assert!(
                (0..4096).any(|i| pattern(i) != pattern(i + p)),
                "period {p}"
            );
        }
    }
}
