//! `xwarp bench tcp`: TCP over one veth pair, side by side.
//!
//! Setup (root): namespaces A and B joined by a veth pair ([`VethPair`]); the kernel owns
//! `10.88.<net>.1` (A) and `.2` (B); xwarp engines own `.10` (AF_XDP on `veth-a`) and `.20`
//! (on `veth-b`), addresses the kernels do not have. Connections go from A to B:
//!
//! | pair | client (A) | server (B) |
//! |---|---|---|
//! | `kernel-kernel` | kernel socket | kernel socket |
//! | `kernel-busypoll` | kernel socket, spinning | kernel socket, spinning |
//! | `xwarp-kernel` | xwarp engine A | kernel socket |
//! | `xwarp-xwarp` | xwarp engine A | xwarp engine B |
//! | `afxdp-ceiling` | raw AF_XDP socket A | raw AF_XDP socket B |
//!
//! `afxdp-ceiling` is no TCP at all: UDP frames from one AF_XDP socket to the other with one
//! copy at each end ([`super::ceiling`]), the upper bound of the xwarp rows on this path;
//! its latency is a 64-byte UDP ping-pong between the two sockets with both threads
//! spinning ([`super::ceiling::pingpong`]), the lower bound of the xwarp rows' half RTT. The engines' socket buffers scale with the MTU ([`socket_buffer`]).
//!
//! `kernel-busypoll` is ping-pong only: both sockets non-blocking with `SO_BUSY_POLL`
//! (50 µs) and both ends spinning on their reads and writes, the kernel's best latency on
//! this path, beside the blocking `kernel-kernel` row. (A veth without XDP hands received
//! frames to the CPU backlog, not to a NAPI queue of its own, so the busy poll itself likely
//! finds little to poll there; the spinning is the part that surely counts. Not measured
//! apart.) The latency rows' `ratio_to_kernel` stays against the blocking
//! row; the table prints the ratio to the busy-polling one beside it (`x busy`).
//!
//! The xwarp pairs run once per `--mode` (`thread`: engine threads; `inline`: the
//! application threads drive their engines, `EngineMode::Inline`, what `XWARP_MODE=inline`
//! selects; `both`) with the `--tcp-core` (`StackConfig::tcp_core`: `own` runs the crate's own
//! TCP connection, opt-in; see xwarp-stack's README). Their rows are named `pair/mode/core`, e.g.
//! `xwarp-xwarp/inline/smoltcp`.
//!
//! `--loss P[,P...]` adds, after the rows above, goodput through a lossy path (a forwarding
//! namespace with an XDP dropper, no netem needed) for kernel-kernel, xwarp-kernel and
//! xwarp-xwarp, one-way and full duplex: see [`loss`].
//!
//! The kernel baseline runs first, before any XDP program is attached to the pair (an
//! attached program changes the veth's offloads). Per pair:
//! * **bulk**: the client writes `--msg-size` byte messages for `--duration` seconds, the
//!   server reads and counts; throughput is received bytes over the receiver's time from the
//!   first byte to end of stream. Bytes are checked (a running sequence pattern).
//! * **ping-pong**: 64-byte request, 64-byte reply, for `--duration` seconds after a
//!   warm-up; half round trip = round trip / 2 into an HDR histogram (p50, p90, p99).
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
//!
//! Output: a table generated from the rows of [`crate::bench::report`] (one line per pair
//! and `--sizes` size), per-second progress lines of every bulk run on stderr with the
//! sender's TCP retransmissions (`--quiet`: none); `--json FILE` writes the report, `--plot
//! FILE.svg` draws bulk bandwidth against write size and the ping-pong latency CDFs.

use std::ffi::OsString;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use xwarp::poll_driver::backend::Backend;
use xwarp::poll_driver::netns::{NetNs, VethPair};

pub mod loss;
mod options;
mod output;
mod traffic;

use options::*;

pub use loss::{LossResult, LossRun};
pub use options::{
    parse_args, row_name, BulkResult, ModeSel, Options, PairKind, PairResult, Pin, Rps,
};
pub use output::{fill, table};
use traffic::*;

use super::plot::write_outputs;
use super::progress;
use super::report::Report;

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
    progress::set_quiet(opts.quiet);
    let (t0, mut rep) = (Instant::now(), Report::new("tcp"));
    let results = run(&opts).and_then(|pairs| {
        let losses = if opts.loss.is_empty() {
            Vec::new()
        } else {
            loss::run(&opts)?
        };
        Ok((pairs, losses))
    });
    match results {
        Ok((results, losses)) => {
            output::fill(&mut rep, &opts, &results);
            loss::fill(&mut rep, &opts, &losses);
            rep.intervals = progress::take_log();
            rep.finish(t0);
            print!("{}", output::table(&opts, &rep));
            if !losses.is_empty() {
                print!("{}", loss::table(&opts, &rep));
            }
            if let Err(e) = write_outputs(&rep, opts.json.as_deref(), opts.plot.as_deref()) {
                eprintln!("xwarp bench tcp: {e}");
                return ExitCode::FAILURE;
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
pub(super) fn set_rps(ns: &NetNs, ifname: &str, mask: u64) -> io::Result<()> {
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
    mode: ModeSel,
) -> io::Result<XdpEngine> {
    let (ns, ifname, ip) = if side_a {
        (&net.veth.a, &net.veth.if_a, net.xa)
    } else {
        (&net.veth.b, &net.veth.if_b, net.xb)
    };
    engine_on(ns, ifname, ip, 24, None, side_a, o, core, mode)
}

/// An engine owning `ip/prefix` (with `gateway`) on `ifname` in `ns`, configured for the
/// bench: buffers for the MTU, `mode`, the `--tcp-core`.
#[allow(clippy::too_many_arguments)]
pub(super) fn engine_on(
    ns: &NetNs,
    ifname: &str,
    ip: Ipv4Addr,
    prefix: u8,
    gateway: Option<Ipv4Addr>,
    side_a: bool,
    o: &Options,
    core: Option<usize>,
    mode: ModeSel,
) -> io::Result<XdpEngine> {
    let name = if side_a {
        "bench-engine-a"
    } else {
        "bench-engine-b"
    };
    let mut cfg = XdpEngineConfig::new(ifname, ip, prefix);
    cfg.stack.ipv4_gateway = gateway;
    cfg.stack.tcp_core = o.tcp_core;
    cfg.engine.mode = mode.engine_mode();
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

pub(super) fn per_gb(cpu: Duration, bytes: u64) -> f64 {
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

/// One bulk measurement as a [`BulkResult`] (one run).
fn bulk_result(size: usize, c: &BulkSide, s: &BulkSide, engine_cpu: Duration) -> BulkResult {
    let secs = s.elapsed.as_secs_f64().max(1e-9);
    let gbps = s.bytes as f64 * 8.0 / secs / 1e9;
    BulkResult {
        size: Some(size),
        gbps,
        gbps_min: gbps,
        gbps_max: gbps,
        bytes: s.bytes,
        client_cpu_s_per_gb: Some(per_gb(c.cpu, s.bytes)),
        server_cpu_s_per_gb: Some(per_gb(s.cpu, s.bytes)),
        engine_cpu_s_per_gb: per_gb(engine_cpu, s.bytes),
    }
}

fn result(kind: PairKind, name: String, bulk: Vec<BulkResult>, h: Histogram<u64>) -> PairResult {
    PairResult {
        kind,
        name,
        runs: 1,
        bulk,
        half_rtt_p50_us: h.value_at_quantile(0.50) as f64 / 1e3,
        half_rtt_p90_us: h.value_at_quantile(0.90) as f64 / 1e3,
        half_rtt_p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
        pingpongs: h.len(),
        half_rtt_ns: Some(h),
    }
}

/// The port of the bulk run at the `i`-th size (a fresh listener each).
fn bulk_port(i: usize) -> u16 {
    if i == 0 {
        BULK_PORT
    } else {
        BULK_SWEEP_PORT + i as u16
    }
}

/// The bulk run of one pair at every `--sizes` size, each under a progress meter: `one`
/// runs it at (size, port) and returns both sides and the engines' CPU time.
fn sweep(
    o: &Options,
    name: &str,
    mut one: impl FnMut(usize, u16) -> io::Result<((BulkSide, BulkSide), Duration)>,
) -> io::Result<Vec<BulkResult>> {
    let mut out = Vec::new();
    for (i, &size) in o.sizes.iter().enumerate() {
        let meter = progress::start("bulk", name, Some(size));
        let r = one(size, bulk_port(i));
        meter.finish();
        let ((c, s), ecpu) = r?;
        out.push(bulk_result(size, &c, &s, ecpu));
    }
    Ok(out)
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
    let mut kinds = o.pairs.clone();
    kinds.sort_by_key(|p| *p as u8);
    kinds.dedup();
    // Every xwarp pair once per --mode.
    let mut order = Vec::new();
    for k in kinds {
        if k.is_xwarp() {
            order.extend(o.modes.iter().map(|m| (k, *m)));
        } else {
            order.push((k, ModeSel::Thread));
        }
    }
    let mut samples: Vec<Vec<PairResult>> = vec![Vec::new(); order.len()];
    for round in 0..o.repeat {
        for (i, r) in run_round(o, &net, &order, round)?.into_iter().enumerate() {
            samples[i].push(r);
        }
    }
    Ok(samples.iter().filter_map(|s| median(s)).collect())
}

fn med(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median of each measured value over repeated runs of one pair, per write size (bulk
/// min/max kept); the ping-pong histograms are merged.
fn median(runs: &[PairResult]) -> Option<PairResult> {
    let first = runs.first()?;
    let m = |f: &dyn Fn(&PairResult) -> f64| med(runs.iter().map(f).collect());
    let bulk = (0..first.bulk.len())
        .map(|j| {
            let at: Vec<&BulkResult> = runs.iter().filter_map(|r| r.bulk.get(j)).collect();
            let mb = |f: &dyn Fn(&BulkResult) -> f64| med(at.iter().map(|b| f(b)).collect());
            let mo = |f: &dyn Fn(&BulkResult) -> Option<f64>| {
                let v: Vec<f64> = at.iter().filter_map(|b| f(b)).collect();
                (!v.is_empty()).then(|| med(v))
            };
            BulkResult {
                size: first.bulk[j].size,
                gbps: mb(&|b| b.gbps),
                gbps_min: at.iter().map(|b| b.gbps).fold(f64::INFINITY, f64::min),
                gbps_max: at.iter().map(|b| b.gbps).fold(0.0, f64::max),
                bytes: at.iter().map(|b| b.bytes).sum(),
                client_cpu_s_per_gb: mo(&|b| b.client_cpu_s_per_gb),
                server_cpu_s_per_gb: mo(&|b| b.server_cpu_s_per_gb),
                engine_cpu_s_per_gb: mb(&|b| b.engine_cpu_s_per_gb),
            }
        })
        .collect();
    let mut hist: Option<Histogram<u64>> = None;
    for h in runs.iter().filter_map(|r| r.half_rtt_ns.as_ref()) {
        match &mut hist {
            None => hist = Some(h.clone()),
            Some(all) => {
                let _ = all.add(h);
            }
        }
    }
    Some(PairResult {
        kind: first.kind,
        name: first.name.clone(),
        runs: runs.len() as u32,
        bulk,
        half_rtt_p50_us: m(&|r| r.half_rtt_p50_us),
        half_rtt_p90_us: m(&|r| r.half_rtt_p90_us),
        half_rtt_p99_us: m(&|r| r.half_rtt_p99_us),
        pingpongs: runs.iter().map(|r| r.pingpongs).sum(),
        half_rtt_ns: hist,
    })
}

/// Bytes of every bulk run of a result.
fn bulk_bytes(r: &PairResult) -> u64 {
    r.bulk.iter().map(|b| b.bytes).sum()
}

/// One measurement of every pair in `order` (kernel baseline first: engines of the
/// previous round have stopped, so no XDP program is attached to the pair then).
fn run_round(
    o: &Options,
    net: &Net,
    order: &[(PairKind, ModeSel)],
    round: u32,
) -> io::Result<Vec<PairResult>> {
    let [client_core, server_core, core_a, core_b] = placement(o.pin);
    let ends = Ends {
        client_core,
        server_core,
    };
    let mut out = Vec::new();
    for &(kind, mode) in order {
        let name = row_name(kind, mode, o.tcp_core);
        eprintln!(
            "xwarp bench tcp: round {}/{}: {name} ...",
            round + 1,
            o.repeat,
        );
        apply_rps(net, o, o.rps.applies(kind))?;
        let r = match kind {
            PairKind::KernelBusyPoll => {
                let l = kernel_listener(net, PING_PORT)?;
                let h = run_ping(
                    &ends,
                    Box::new(move || {
                        let (s, _) = l.accept()?;
                        Ok(Box::new(Spinning::new(s)?) as Box<dyn Conn>)
                    }),
                    Box::new(|| {
                        let addr = SocketAddr::from((net.veth.addr_b, PING_PORT));
                        let s = net.veth.a.run(move || {
                            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                        })??;
                        Ok(Box::new(Spinning::new(s)?) as Box<dyn Conn>)
                    }),
                    o,
                )?;
                result(kind, name, Vec::new(), h)
            }
            PairKind::KernelKernel => {
                let bulk = sweep(o, &name, |size, port| {
                    let b = run_bulk(
                        &ends,
                        kernel_acceptor(kernel_listener(net, port)?),
                        Box::new(move || kernel_connect(net, port)),
                        o,
                        size,
                    )?;
                    Ok((b, Duration::ZERO))
                })?;
                let h = run_ping(
                    &ends,
                    kernel_acceptor(kernel_listener(net, PING_PORT)?),
                    Box::new(|| kernel_connect(net, PING_PORT)),
                    o,
                )?;
                result(kind, name, bulk, h)
            }
            PairKind::XwarpKernel => {
                let ea = start_engine(net, o, true, core_a, mode)?;
                let bulk = sweep(o, &name, |size, port| {
                    let cpu0 = engine_cpu(&[&ea]);
                    let b = run_bulk(
                        &ends,
                        kernel_acceptor(kernel_listener(net, port)?),
                        xwarp_connector(&ea, SocketAddr::from((net.veth.addr_b, port))),
                        o,
                        size,
                    )?;
                    Ok((b, engine_cpu(&[&ea]) - cpu0))
                })?;
                let h = run_ping(
                    &ends,
                    kernel_acceptor(kernel_listener(net, PING_PORT)?),
                    xwarp_connector(&ea, SocketAddr::from((net.veth.addr_b, PING_PORT))),
                    o,
                )?;
                let r = result(kind, name, bulk, h);
                report_engine("A", ea, bulk_bytes(&r))?;
                r
            }
            PairKind::XwarpXwarp => {
                let ea = start_engine(net, o, true, core_a, mode)?;
                let eb = start_engine(net, o, false, core_b, mode)?;
                let bulk = sweep(o, &name, |size, port| {
                    let cpu0 = engine_cpu(&[&ea, &eb]);
                    let b = run_bulk(
                        &ends,
                        xwarp_acceptor(TcpListener::bind(
                            eb.stack(),
                            SocketAddr::from((net.xb, port)),
                        )?),
                        xwarp_connector(&ea, SocketAddr::from((net.xb, port))),
                        o,
                        size,
                    )?;
                    Ok((b, engine_cpu(&[&ea, &eb]) - cpu0))
                })?;
                let h = run_ping(
                    &ends,
                    xwarp_acceptor(TcpListener::bind(
                        eb.stack(),
                        SocketAddr::from((net.xb, PING_PORT)),
                    )?),
                    xwarp_connector(&ea, SocketAddr::from((net.xb, PING_PORT))),
                    o,
                )?;
                let r = result(kind, name, bulk, h);
                report_engine("A", ea, bulk_bytes(&r))?;
                report_engine("B", eb, bulk_bytes(&r))?;
                r
            }
            PairKind::AfxdpCeiling => {
                let meter = progress::start("bulk", kind.name(), None);
                let r = ceiling_result(net, o, core_a, core_b);
                meter.finish();
                r?
            }
        };
        out.push(r);
    }
    Ok(out)
}

/// Stop an engine and print its NIC and XDP counters on stderr: frames dropped anywhere on
/// the AF_XDP path mean TCP recovery inside the measurement, and transmitted bytes beyond
/// the bulk goodput (`wire/goodput`) show retransmissions (ping-pong frames add ~0.1%).
pub(super) fn report_engine(name: &str, e: XdpEngine, goodput: u64) -> io::Result<()> {
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
/// column (they are the engines), its latency is [`super::ceiling::pingpong`] (64-byte UDP ping-pong, both sides spinning).
fn ceiling_result(
    net: &Net,
    o: &Options,
    core_a: Option<usize>,
    core_b: Option<usize>,
) -> io::Result<PairResult> {
    use super::ceiling::{pingpong, run, PingSettings, Settings, Side};
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
    let ping = pingpong(
        &side_a,
        &side_b,
        &PingSettings {
            mode: o.xdp_mode,
            warmup: u64::from(WARMUP),
            rounds: u64::MAX,
            duration: o.duration,
        },
    )?;
    if ping.resent > 0 {
        eprintln!(
            "xwarp bench tcp: afxdp-ceiling ping-pong: {} requests resent (no reply in 200 ms)",
            ping.resent
        );
    }
    let r = &out.received;
    let gbps = r.bytes as f64 * 8.0 / r.elapsed.as_secs_f64().max(1e-9) / 1e9;
    let mut res = result(
        PairKind::AfxdpCeiling,
        PairKind::AfxdpCeiling.name().into(),
        Vec::new(),
        ping.half_rtt_ns,
    );
    res.bulk = vec![BulkResult {
        size: None,
        gbps,
        gbps_min: gbps,
        gbps_max: gbps,
        bytes: r.bytes,
        client_cpu_s_per_gb: None,
        server_cpu_s_per_gb: None,
        engine_cpu_s_per_gb: per_gb(out.sent.cpu + r.cpu, r.bytes),
    }];
    Ok(res)
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
            "--mode",
            "both",
            "--tcp-core",
            "own",
            "--loss",
            "0.001,0.05,0.001",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(o.modes, vec![ModeSel::Thread, ModeSel::Inline]);
        assert_eq!(o.tcp_core, xwarp::stack::TcpCore::Own);
        assert_eq!(o.loss, vec![0.001, 0.05]);
        assert_eq!(
            row_name(PairKind::XwarpXwarp, ModeSel::Inline, o.tcp_core),
            "xwarp-xwarp/inline/own"
        );
        assert_eq!(
            row_name(PairKind::KernelBusyPoll, ModeSel::Inline, o.tcp_core),
            "kernel-busypoll"
        );
        let inline = parse_args(&args(&["--mode", "inline", "--tcp-core", "smoltcp"]))
            .unwrap()
            .unwrap();
        assert!(inline.modes == [ModeSel::Inline] && inline.modes[0].engine_mode().is_inline());
        assert!(inline.loss.is_empty());
        assert_eq!(o.duration, Duration::from_millis(1500));
        assert_eq!(o.sizes, vec![1000]);
        let w = parse_args(&args(&["--sizes", "64K,1K", "--quiet", "--plot", "x.svg"]))
            .unwrap()
            .unwrap();
        assert_eq!((&w.sizes[..], w.quiet), (&[1024, 65536][..], true));
        assert_eq!(w.plot.as_deref(), Some(std::path::Path::new("x.svg")));
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
            &["--sizes", "1K,0"],
            &["--sizes", "1K", "--msg-size", "1000"],
            &["--mode", "threads"],
            &["--tcp-core", "lwip"],
            &["--loss", "0.6"],
            &["--loss", "-0.01"],
            &["--loss", "1%"],
            &["--loss", "0.01,"],
            &["--loss", "0.1,0.2,0.3,0.4,0.5,0.01,0.02,0.03,0.04"],
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn median_of_rounds_keeps_the_bulk_spread_per_size() {
        let r = |gbps: f64, p50: f64| {
            let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).unwrap();
            h.record((p50 * 1e3) as u64).unwrap();
            let b = |size, g| BulkResult {
                size: Some(size),
                gbps: g,
                gbps_min: g,
                gbps_max: g,
                bytes: 10,
                client_cpu_s_per_gb: Some(1.0),
                server_cpu_s_per_gb: Some(2.0),
                engine_cpu_s_per_gb: 3.0,
            };
            PairResult {
                kind: PairKind::XwarpKernel,
                name: "xwarp-kernel/thread/smoltcp".into(),
                runs: 1,
                bulk: vec![b(1024, gbps / 2.0), b(65536, gbps)],
                half_rtt_p50_us: p50,
                half_rtt_p90_us: p50,
                half_rtt_p99_us: p50,
                pingpongs: 5,
                half_rtt_ns: Some(h),
            }
        };
        let m = median(&[r(1.0, 9.0), r(7.0, 3.0), r(4.0, 5.0)]).unwrap();
        let big = &m.bulk[1];
        assert_eq!((big.gbps, big.gbps_min, big.gbps_max), (4.0, 1.0, 7.0));
        assert_eq!((m.bulk[0].gbps, m.bulk[0].size), (2.0, Some(1024)));
        assert_eq!(m.half_rtt_p50_us, 5.0);
        assert_eq!((m.runs, big.bytes, m.pingpongs), (3, 30, 15));
        assert_eq!(m.half_rtt_ns.as_ref().map(|h| h.len()), Some(3));
        let even = median(&[r(2.0, 1.0), r(4.0, 3.0)]).unwrap();
        assert_eq!((even.bulk[1].gbps, even.half_rtt_p50_us), (3.0, 2.0));
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
