//! `xwarp bench scale`: request/response at many concurrent connections, xwarp and the
//! kernel in the same run, plus memory per idle connection (issue 16).
//!
//! Setup (root): the veth pair of `bench tcp` between two namespaces (A: clients, B:
//! servers). Rows: `kernel-kernel` (kernel sockets at both ends), `xwarp-xwarp/smoltcp`
//! and `xwarp-xwarp/own` (an xwarp engine on AF_XDP, generic mode, at each end of the same
//! veth; `StackConfig::tcp_core` smoltcp / own). All rows run over the same veth.
//!
//! Per row the connections are opened once and grown step by step to every `--conns`
//! count (1, 100, 1000, 10000 by default). At each count `--threads` client threads and as
//! many server threads each own a slice of the connections and run closed-loop rounds: the
//! client writes one 64-byte request on every connection of its slice, then reads every
//! reply (one request in flight per connection; at 1 connection this is a plain
//! ping-pong). The server reads a request on each of its connections in turn and answers
//! it with the request's bytes inverted; the client checks every reply (connection index,
//! round number, pattern). Measured over `--duration` per count: requests per second and
//! process CPU time per request (`/proc/self/stat`: client, server and, for xwarp, the
//! engine threads, which spin up to `--spin-us` when idle; softirq work is charged to the
//! thread that triggered it, as in `bench tcp`). The engines are pinned to the first and
//! second core, the application threads are not pinned. Every socket is non-blocking and
//! polled (a sweep that moves nothing yields, then sleeps 20 µs): an xwarp socket that never
//! waits makes no readiness eventfd, which keeps 10,000 pairs under a 20,000-descriptor
//! limit; the kernel row is capped at (RLIMIT_NOFILE − 512) / 2 pairs.
//!
//! Memory per idle connection: while growing from one count to the next (connections just
//! opened, no request yet), the process's RSS delta and the system's slab delta
//! (`/proc/meminfo` `Slab`: kernel socket structures, eventfds, epoll) divided by the
//! connections added. Both ends (client and server) are in this process and on this
//! kernel, so a value is per connection *pair*. Slab is system-wide: other processes add
//! noise. After the largest count the RSS delta from before the first connection is
//! reported again (`rss_after_use`): rings and buffers touched by traffic.
//!
//! The xwarp engines use `--buffer` bytes for each socket buffer and ring (default 16 KiB;
//! the stack's defaults, 1 MiB + 1 MiB + 2 × 256 KiB, exceed the default
//! `socket_buffer_budget` at 2048 sockets). Options: `--conns N[,N...]`, `--duration S`,
//! `--threads N`, `--only kernel,smoltcp,own`, `--buffer BYTES`, `--spin-us US`,
//! `--net N` (the 10.88.N.0/24 subnet), `--json FILE`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xwarp::net::{TcpListener, TcpStream};
use xwarp::poll_driver::engine::SpinBudget;
use xwarp::poll_driver::netns::VethPair;
use xwarp::stack::TcpCore;
use xwarp::toe::{start_xdp_engine, XdpEngine, XdpEngineConfig};

use super::common::{process_cpu, rx_frames_for, umem_for_mtu};
use super::plot::write_outputs;
use super::report::{Report, Row, Side, Unit};

/// Request and reply size.
pub const REQ: usize = 64;
const PORT: u16 = 7300;

/// Which stack a row runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// Kernel sockets at both ends.
    Kernel,
    /// xwarp engines at both ends, smoltcp's TCP socket.
    Smoltcp,
    /// xwarp engines at both ends, the own TCP core.
    Own,
}

impl Stack {
    /// The row name.
    pub fn name(self) -> &'static str {
        match self {
            Stack::Kernel => "kernel-kernel",
            Stack::Smoltcp => "xwarp-xwarp/smoltcp",
            Stack::Own => "xwarp-xwarp/own",
        }
    }
    fn side(self) -> Side {
        match self {
            Stack::Kernel => Side::Kernel,
            _ => Side::Xwarp,
        }
    }
}

/// Options of `xwarp bench scale`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Connection counts, ascending.
    pub conns: Vec<usize>,
    /// Measurement time per count.
    pub duration: Duration,
    /// Client threads (and as many server threads).
    pub threads: usize,
    /// Rows to run.
    pub stacks: Vec<Stack>,
    /// Socket buffer and ring size of the xwarp engines.
    pub buffer: usize,
    /// Engine idle spin.
    pub spin: SpinBudget,
    /// Subnet 10.88.N.0/24.
    pub net: u8,
    /// Write the report here too.
    pub json: Option<std::path::PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            conns: vec![1, 100, 1000, 10_000],
            duration: Duration::from_secs(2),
            threads: 1,
            stacks: vec![Stack::Kernel, Stack::Smoltcp, Stack::Own],
            buffer: 16 << 10,
            spin: SpinBudget::Duration(Duration::from_micros(1000)),
            net: 71,
            json: None,
        }
    }
}

const USAGE: &str = "usage: xwarp bench scale [--conns N[,N...]] [--duration S] [--threads N] \
[--only kernel,smoltcp,own] [--buffer BYTES] [--spin-us US|forever] [--net N] [--json FILE]";

/// Parse the arguments after `xwarp bench scale`.
pub fn parse_args(args: &[OsString]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--conns" => {
                let mut v = Vec::new();
                for n in val()?.split(',') {
                    let n: usize = n
                        .parse()
                        .ok()
                        .filter(|&n| (1..=60_000).contains(&n))
                        .ok_or(format!("--conns: {n} is not a count in 1..=60000"))?;
                    v.push(n);
                }
                v.sort_unstable();
                v.dedup();
                o.conns = v;
            }
            "--duration" => {
                let s: f64 = val()?
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                    .ok_or("--duration needs seconds in (0, 3600]")?;
                o.duration = Duration::from_secs_f64(s);
            }
            "--threads" => {
                o.threads = val()?
                    .parse()
                    .ok()
                    .filter(|&t| (1..=64).contains(&t))
                    .ok_or("--threads needs 1..=64")?
            }
            "--only" => {
                o.stacks.clear();
                for s in val()?.split(',') {
                    o.stacks.push(match s {
                        "kernel" => Stack::Kernel,
                        "smoltcp" => Stack::Smoltcp,
                        "own" => Stack::Own,
                        _ => return Err(format!("--only: unknown {s} (kernel, smoltcp, own)")),
                    });
                }
                o.stacks.dedup();
            }
            "--buffer" => {
                o.buffer = val()?
                    .parse()
                    .ok()
                    .filter(|&b| (4608..=64 << 20).contains(&b))
                    .ok_or("--buffer needs bytes in 4608..=67108864")?
            }
            "--spin-us" => {
                let v = val()?;
                o.spin = if v == "forever" {
                    SpinBudget::Forever
                } else {
                    SpinBudget::Duration(Duration::from_micros(
                        v.parse().map_err(|_| "--spin-us needs µs or 'forever'")?,
                    ))
                };
            }
            "--net" => {
                o.net = val()?
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or("--net needs 1..=255")?
            }
            "--json" => o.json = Some(val()?.into()),
            "--help" | "-h" => return Err(String::new()),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    Ok(o)
}

/// A connected stream of either kind.
trait Rw: Read + Write + Send {}
impl<T: Read + Write + Send> Rw for T {}
type Conn = Box<dyn Rw>;

/// One count's measurement.
#[derive(Debug, Clone)]
pub struct Point {
    /// Concurrent connections.
    pub conns: usize,
    /// Requests answered and checked.
    pub requests: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Process CPU time.
    pub cpu: Duration,
}

impl Point {
    /// Requests per second.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// CPU µs per request.
    pub fn cpu_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / (self.requests.max(1)) as f64
    }
}

/// Memory of idle connections, per connection pair.
#[derive(Debug, Clone, Default)]
pub struct IdleMem {
    /// Connections the deltas are over.
    pub conns: usize,
    /// Process RSS delta, bytes.
    pub rss: f64,
    /// System slab delta, bytes.
    pub slab: f64,
    /// RSS from before the first connection to after the last measurement, per connection.
    pub rss_after_use: f64,
}

/// One row's results.
#[derive(Debug, Clone)]
pub struct StackResult {
    /// Which stack.
    pub stack: Stack,
    /// One per count.
    pub points: Vec<Point>,
    /// Memory per idle connection (the largest growth step).
    pub mem: IdleMem,
    /// The count at which the row stopped (no progress for 20 s), if it did.
    pub failed: Option<usize>,
}

/// Entry point.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            println!("{USAGE}\n\n{}", module_help());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("xwarp bench scale: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (t0, mut rep) = (Instant::now(), Report::new("scale"));
    match run(&o) {
        Ok(results) => {
            fill(&mut rep, &o, &results);
            rep.finish(t0);
            print!("{}", table(&o, &results));
            if let Err(e) = write_outputs(&rep, o.json.as_deref(), None) {
                eprintln!("xwarp bench scale: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xwarp bench scale: {e}");
            ExitCode::FAILURE
        }
    }
}

fn module_help() -> &'static str {
    "Request/response (64 bytes, one request in flight per connection) at each --conns \
count, kernel and xwarp over one veth pair (root), with CPU per request and memory per \
idle connection."
}

/// Raise RLIMIT_NOFILE to `want` (up to `nr_open`; only to the hard limit without
/// CAP_SYS_RESOURCE). Returns the soft limit now.
pub fn raise_fd_limit(want: u64) -> io::Result<u64> {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a live rlimit getrlimit writes into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let target = want.min(nr_open).max(l.rlim_cur);
    let new = libc::rlimit {
        rlim_cur: target,
        rlim_max: l.rlim_max.max(target),
    };
    // SAFETY: `new` is a live rlimit setrlimit reads.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
        return Ok(target);
    }
    // Without CAP_SYS_RESOURCE the hard limit stays: take that much.
    let hard = libc::rlimit {
        rlim_cur: l.rlim_max,
        rlim_max: l.rlim_max,
    };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &hard) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(l.rlim_max)
}

/// The soft RLIMIT_NOFILE.
fn fd_limit() -> usize {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a live rlimit getrlimit writes into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return 1024;
    }
    l.rlim_cur as usize
}

/// `VmRSS` of this process, bytes.
pub fn rss() -> u64 {
    kb_field("/proc/self/status", "VmRSS:")
}

/// System slab memory, bytes.
pub fn slab() -> u64 {
    kb_field("/proc/meminfo", "Slab:")
}

fn kb_field(file: &str, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// Run every requested row.
pub fn run(o: &Options) -> io::Result<Vec<StackResult>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "needs root (network namespaces, veth, AF_XDP)",
        ));
    }
    let max = o.conns.iter().copied().max().unwrap_or(1) as u64;
    raise_fd_limit(8 * max + 4096)?;
    let veth = VethPair::new(o.net)?;
    // Enough ephemeral ports and a backlog for the kernel row.
    for ns in [&veth.a, &veth.b] {
        let _ = ns.run(|| {
            let _ = std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "1024 65535");
            let _ = std::fs::write("/proc/sys/net/core/somaxconn", "4096");
            let _ = std::fs::write("/proc/sys/net/ipv4/tcp_max_syn_backlog", "4096");
        });
    }
    let mut out = Vec::new();
    for &s in &o.stacks {
        eprintln!("xwarp bench scale: {} ...", s.name());
        out.push(run_stack(&veth, o, s)?);
    }
    Ok(out)
}

fn cores() -> (Option<usize>, Option<usize>) {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    match ids.len() {
        0 => (None, None),
        1 => (Some(ids[0].id), Some(ids[0].id)),
        _ => (Some(ids[0].id), Some(ids[1].id)),
    }
}

fn engine(
    veth: &VethPair,
    o: &Options,
    side_a: bool,
    core: TcpCore,
    max: usize,
) -> io::Result<XdpEngine> {
    let (ns, ifname, ip, cpu) = if side_a {
        (
            &veth.a,
            &veth.if_a,
            Ipv4Addr::new(10, 88, o.net, 10),
            cores().0,
        )
    } else {
        (
            &veth.b,
            &veth.if_b,
            Ipv4Addr::new(10, 88, o.net, 20),
            cores().1,
        )
    };
    let mut cfg = XdpEngineConfig::new(ifname, ip, 24);
    cfg.stack.tcp_core = core;
    (cfg.chunk, cfg.multi_buffer) = umem_for_mtu(1500);
    cfg.engine.name = if side_a {
        "scale-engine-a"
    } else {
        "scale-engine-b"
    }
    .into();
    cfg.engine.core = cpu;
    cfg.engine.spin = o.spin;
    cfg.mode = xwarp::poll_driver::afxdp::XdpMode::Generic;
    cfg.stack.rx_buffer = o.buffer;
    cfg.stack.tx_buffer = o.buffer;
    cfg.stack.ring_size = o.buffer;
    cfg.stack.tcp.nodelay = true;
    cfg.stack.ephemeral_ports = 1024..=65535;
    cfg.stack.syn_backlog = 4096;
    cfg.stack.max_sockets = (max + 4096).max(cfg.stack.max_sockets);
    cfg.rx_frames = rx_frames_for(1500, o.buffer).max(4096);
    start_xdp_engine(Some(ns), cfg)
}

/// The two ends' ways of opening connections.
enum Ends {
    Kernel {
        listener: std::net::TcpListener,
        server: SocketAddr,
    },
    Xwarp {
        a: Box<XdpEngine>,
        b: Box<XdpEngine>,
        listener: TcpListener,
        server: SocketAddr,
    },
}

impl Ends {
    /// Open `n` more connections: (client ends, server ends), in the same order.
    fn open(&self, veth: &VethPair, n: usize) -> io::Result<(Vec<Conn>, Vec<Conn>)> {
        std::thread::scope(|sc| {
            let acc = sc.spawn(|| -> io::Result<Vec<Conn>> {
                let mut v: Vec<Conn> = Vec::with_capacity(n);
                for _ in 0..n {
                    match self {
                        Ends::Kernel { listener, .. } => {
                            let (s, _) = listener.accept()?;
                            s.set_nodelay(true)?;
                            s.set_nonblocking(true)?;
                            v.push(Box::new(s));
                        }
                        Ends::Xwarp { listener, .. } => {
                            let (mut s, _) = listener.accept()?;
                            s.set_nodelay(true)?;
                            s.set_nonblocking(true)?;
                            v.push(Box::new(s));
                        }
                    }
                }
                Ok(v)
            });
            let clients = match self {
                Ends::Kernel { server, .. } => {
                    let server = *server;
                    veth.a.run(move || -> io::Result<Vec<Conn>> {
                        let mut v: Vec<Conn> = Vec::with_capacity(n);
                        for _ in 0..n {
                            let s = std::net::TcpStream::connect_timeout(
                                &server,
                                Duration::from_secs(10),
                            )?;
                            s.set_nodelay(true)?;
                            s.set_nonblocking(true)?;
                            v.push(Box::new(s));
                        }
                        Ok(v)
                    })?
                }
                Ends::Xwarp { a, server, .. } => {
                    // Non-blocking connects: a blocking one would wait on (and so make) the
                    // socket's readiness eventfd, one descriptor per connection.
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        v.push(TcpStream::connect_nonblocking(a.stack(), *server)?);
                    }
                    let deadline = Instant::now() + Duration::from_secs(30);
                    let mut open = vec![false; n];
                    let mut left = n;
                    while left > 0 {
                        for (i, c) in v.iter().enumerate() {
                            if !open[i] && c.poll_connect()? {
                                open[i] = true;
                                left -= 1;
                            }
                        }
                        if Instant::now() > deadline {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!("{left} of {n} connects unfinished"),
                            ));
                        }
                        std::thread::yield_now();
                    }
                    let mut out: Vec<Conn> = Vec::with_capacity(n);
                    for mut s in v {
                        s.set_nodelay(true)?;
                        s.set_nonblocking(true)?;
                        out.push(Box::new(s));
                    }
                    Ok(out)
                }
            };
            let clients = match clients {
                Ok(c) => c,
                Err(e) => {
                    // Unblock the acceptor: a connection of our own to the listener per
                    // missing one would be needed; instead report and let the scope wait
                    // only if the acceptor can finish. Kernel: connect to ourselves.
                    return Err(e);
                }
            };
            let servers = acc
                .join()
                .map_err(|_| io::Error::other("acceptor panicked"))??;
            Ok((clients, servers))
        })
    }

    fn engine_cpu(&self) -> Duration {
        match self {
            Ends::Kernel { .. } => Duration::ZERO,
            Ends::Xwarp { a, b, .. } => [a, b]
                .iter()
                .filter_map(|e| e.engine().cpu_time().ok())
                .sum(),
        }
    }
}

fn run_stack(veth: &VethPair, o: &Options, stack: Stack) -> io::Result<StackResult> {
    let max = o.conns.iter().copied().max().unwrap_or(1);
    let rss0 = rss();
    let ends = match stack {
        Stack::Kernel => {
            let server = SocketAddr::from((veth.addr_b, PORT));
            let listener = veth.b.run(move || std::net::TcpListener::bind(server))??;
            // A backlog of 4096 (std's bind asks for 128; a second listen() raises it).
            // SAFETY: a valid listening socket's fd.
            if unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), 4096) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ends::Kernel { listener, server }
        }
        Stack::Smoltcp | Stack::Own => {
            let core = if stack == Stack::Own {
                TcpCore::Own
            } else {
                TcpCore::Smoltcp
            };
            let a = engine(veth, o, true, core, max)?;
            let b = engine(veth, o, false, core, max)?;
            let server = SocketAddr::from((Ipv4Addr::new(10, 88, o.net, 20), PORT));
            let listener = TcpListener::bind_with_backlog(b.stack(), server, 4096)?;
            Ends::Xwarp {
                a: Box::new(a),
                b: Box::new(b),
                listener,
                server,
            }
        }
    };
    let rss_start = rss();
    let _ = rss0;
    let (mut clients, mut servers): (Vec<Conn>, Vec<Conn>) = (Vec::new(), Vec::new());
    let mut points = Vec::new();
    let mut mem = IdleMem::default();
    let mut failed = None;
    // Kernel sockets: two descriptors per connection pair in this process.
    let cap = match stack {
        Stack::Kernel => fd_limit().saturating_sub(512) / 2,
        _ => usize::MAX,
    };
    for &want in &o.conns {
        let n = want.min(cap);
        if n < want {
            eprintln!(
                "  {}: {n} connections instead of {want}: RLIMIT_NOFILE {} (two descriptors per pair)",
                stack.name(),
                fd_limit()
            );
        }
        let add = n.saturating_sub(clients.len());
        let (r0, s0) = (rss(), slab());
        let t = Instant::now();
        // Grow in batches below the accept backlog.
        let mut left = add;
        while left > 0 {
            let k = left.min(2048);
            let (c, s) = ends.open(veth, k)?;
            clients.extend(c);
            servers.extend(s);
            left -= k;
        }
        std::thread::sleep(Duration::from_millis(200));
        let (r1, s1) = (rss(), slab());
        if add > 0 && add >= mem.conns {
            mem = IdleMem {
                conns: add,
                rss: (r1 as f64 - r0 as f64) / add as f64,
                slab: (s1 as f64 - s0 as f64) / add as f64,
                rss_after_use: 0.0,
            };
        }
        eprintln!(
            "  {}: {n} connections open ({add} added in {:.2} s)",
            stack.name(),
            t.elapsed().as_secs_f64()
        );
        let ecpu0 = ends.engine_cpu();
        let p = match measure(o, &mut clients, &mut servers) {
            Ok(p) => p,
            Err(e) => {
                // A count this stack cannot serve (no progress for 20 s): the row ends here.
                eprintln!("  {}: {n} connections: {e}; row ends", stack.name());
                failed = Some(n);
                break;
            }
        };
        let ecpu = ends.engine_cpu() - ecpu0;
        eprintln!(
            "  {}: {n} connections: {:.0} req/s, {:.2} µs CPU/request ({:.2} of it engines)",
            stack.name(),
            p.rate(),
            p.cpu_us(),
            ecpu.as_secs_f64() * 1e6 / p.requests.max(1) as f64,
        );
        points.push(p);
    }
    mem.rss_after_use = (rss() as f64 - rss_start as f64) / clients.len().max(1) as f64;
    drop(clients);
    drop(servers);
    if let Ends::Xwarp { a, b, listener, .. } = ends {
        drop(listener);
        let _ = (*a).stop();
        let _ = (*b).stop();
    }
    Ok(StackResult {
        stack,
        points,
        mem,
        failed,
    })
}

/// The request of connection `idx` in `round` (`stop`: the last one).
fn request(idx: u64, round: u64, stop: bool) -> [u8; REQ] {
    let mut r = [0u8; REQ];
    r[..8].copy_from_slice(&idx.to_le_bytes());
    r[8..16].copy_from_slice(&round.to_le_bytes());
    r[16] = u8::from(stop);
    for (i, b) in r[17..].iter_mut().enumerate() {
        *b = (idx.wrapping_mul(31) ^ round.wrapping_mul(7) ^ i as u64) as u8;
    }
    r
}

/// Write all of `buf` to a non-blocking stream (yielding while it would block).
fn write_nb(c: &mut Conn, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match c.write(&buf[off..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "write stalled"));
                }
                std::thread::yield_now();
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// After a sweep that moved nothing: yield the first few times, then sleep briefly, so the
/// engine (or the kernel's softirq) sharing the core gets it. The same for every row.
fn idle(spins: &mut u32) {
    *spins += 1;
    if *spins < 8 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// How long a round may make no progress before the bench gives up.
const STALL: Duration = Duration::from_secs(20);

/// Client side of one slice: rounds until `until`, then a stop round. Returns requests.
/// Non-blocking: a round writes every request, then sweeps the connections still owing a
/// reply until none does (yielding after a sweep that moved nothing).
fn client(conns: &mut [Conn], base: u64, until: Instant) -> io::Result<u64> {
    let mut round = 0u64;
    let mut done = 0u64;
    let mut bufs = vec![[0u8; REQ]; conns.len()];
    let mut got = vec![0usize; conns.len()];
    let mut owing: Vec<usize> = Vec::with_capacity(conns.len());
    loop {
        let stop = Instant::now() >= until;
        let deadline = Instant::now() + STALL;
        for (i, c) in conns.iter_mut().enumerate() {
            write_nb(c, &request(base + i as u64, round, stop), deadline)?;
            got[i] = 0;
        }
        owing.clear();
        owing.extend(0..conns.len());
        let mut spins = 0;
        while !owing.is_empty() {
            let mut moved = false;
            let mut k = 0;
            while k < owing.len() {
                let i = owing[k];
                match conns[i].read(&mut bufs[i][got[i]..]) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => {
                        moved = true;
                        got[i] += n;
                        if got[i] == REQ {
                            let want = request(base + i as u64, round, stop);
                            if bufs[i].iter().zip(want.iter()).any(|(a, b)| *a != !*b) {
                                return Err(io::Error::new(
                                    io::ErrorKind::InvalidData,
                                    format!(
                                        "connection {}: round {round}: wrong reply",
                                        base + i as u64
                                    ),
                                ));
                            }
                            owing.swap_remove(k);
                            continue;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                k += 1;
            }
            if moved {
                spins = 0;
            } else {
                if Instant::now() > deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("round {round}: {} replies missing", owing.len()),
                    ));
                }
                idle(&mut spins);
            }
        }
        done += conns.len() as u64;
        round += 1;
        if stop {
            return Ok(done);
        }
    }
}

/// Server side of one slice: answer until every connection sent its stop request
/// (non-blocking sweeps like [`client`]).
fn server(conns: &mut [Conn]) -> io::Result<()> {
    let mut active: Vec<usize> = (0..conns.len()).collect();
    let mut bufs = vec![[0u8; REQ]; conns.len()];
    let mut got = vec![0usize; conns.len()];
    let mut last = Instant::now();
    let mut spins = 0;
    while !active.is_empty() {
        let mut moved = false;
        let mut k = 0;
        while k < active.len() {
            let i = active[k];
            match conns[i].read(&mut bufs[i][got[i]..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    moved = true;
                    got[i] += n;
                    if got[i] == REQ {
                        got[i] = 0;
                        let stop = bufs[i][16] == 1;
                        let mut reply = bufs[i];
                        for b in reply.iter_mut() {
                            *b = !*b;
                        }
                        write_nb(&mut conns[i], &reply, Instant::now() + STALL)?;
                        if stop {
                            active.swap_remove(k);
                            continue;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            k += 1;
        }
        if moved {
            last = Instant::now();
            spins = 0;
        } else {
            if last.elapsed() > STALL + Duration::from_secs(5) {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "server stalled"));
            }
            idle(&mut spins);
        }
    }
    Ok(())
}

fn measure(o: &Options, clients: &mut [Conn], servers: &mut [Conn]) -> io::Result<Point> {
    let n = clients.len();
    let t = o.threads.min(n).max(1);
    let chunk = n.div_ceil(t);
    let cpu0 = process_cpu();
    let start = Instant::now();
    let until = start + o.duration;
    let requests = std::thread::scope(|sc| -> io::Result<u64> {
        let mut hs = Vec::new();
        for s in servers.chunks_mut(chunk) {
            hs.push(sc.spawn(move || server(s)));
        }
        let mut cs = Vec::new();
        for (k, c) in clients.chunks_mut(chunk).enumerate() {
            cs.push(sc.spawn(move || client(c, (k * chunk) as u64, until)));
        }
        let mut total = 0;
        let mut err = None;
        for h in cs {
            match h.join() {
                Ok(Ok(r)) => total += r,
                Ok(Err(e)) => err = Some(e),
                Err(_) => err = Some(io::Error::other("client thread panicked")),
            }
        }
        for h in hs {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => err = err.or(Some(e)),
                Err(_) => err = err.or(Some(io::Error::other("server thread panicked"))),
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    })?;
    Ok(Point {
        conns: n,
        requests,
        elapsed: start.elapsed(),
        cpu: process_cpu() - cpu0,
    })
}

/// Rows: test `rr64`, metric `rate` (1/s) and `cpu_per_request` (µs) per count (`size`:
/// the connection count); test `idle`, metrics `rss_per_conn`, `slab_per_conn`,
/// `rss_after_use_per_conn` (B); test `rr64`, metrics `rate_ratio_max_vs_1`,
/// `cpu_ratio_max_vs_1`.
pub fn fill(rep: &mut Report, o: &Options, results: &[StackResult]) {
    rep.config("conns", o.conns.clone());
    rep.config("duration_s", o.duration.as_secs_f64());
    rep.config("threads", o.threads as u64);
    rep.config("buffer", o.buffer as u64);
    rep.config(
        "wire",
        "veth between two namespaces; xwarp on AF_XDP generic",
    );
    for r in results {
        let name = r.stack.name();
        for p in &r.points {
            rep.push(
                Row::new("rr64", name, r.stack.side(), "rate", Unit::PerSec, p.rate())
                    .size(p.conns),
            );
            rep.push(
                Row::new(
                    "rr64",
                    name,
                    r.stack.side(),
                    "cpu_per_request",
                    Unit::Us,
                    p.cpu_us(),
                )
                .size(p.conns),
            );
        }
        if let Some(n) = r.failed {
            rep.push(
                Row::new(
                    "rr64",
                    name,
                    r.stack.side(),
                    "stalled_at",
                    Unit::Count,
                    n as f64,
                )
                .note("no reply moved for 20 s at this connection count"),
            );
        }
        if let (Some(first), Some(last)) = (r.points.first(), r.points.last()) {
            rep.push(Row::new(
                "rr64",
                name,
                r.stack.side(),
                "rate_ratio_max_vs_1",
                Unit::Ratio,
                last.rate() / first.rate().max(1e-9),
            ));
            rep.push(Row::new(
                "rr64",
                name,
                r.stack.side(),
                "cpu_ratio_max_vs_1",
                Unit::Ratio,
                last.cpu_us() / first.cpu_us().max(1e-9),
            ));
        }
        for (m, v) in [
            ("rss_per_conn", r.mem.rss),
            ("slab_per_conn", r.mem.slab),
            ("rss_after_use_per_conn", r.mem.rss_after_use),
        ] {
            rep.push(
                Row::new("idle", name, r.stack.side(), m, Unit::Bytes, v).note(
                    "per connection pair (client and server end), over the largest growth step",
                ),
            );
        }
    }
    rep.fill_ratios();
}

/// The printed table.
pub fn table(o: &Options, results: &[StackResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nrequest/response, {REQ} B, one request in flight per connection, {} client + {} server thread(s), {:.1} s per count (veth; xwarp on AF_XDP generic)",
        o.threads,
        o.threads,
        o.duration.as_secs_f64()
    );
    let _ = write!(s, "{:<22}", "row");
    for n in &o.conns {
        let _ = write!(s, " {:>18}", format!("{n} conns"));
    }
    let _ = writeln!(s, " {:>10} {:>10}", "rate max/1", "cpu max/1");
    for r in results {
        let _ = write!(s, "{:<22}", r.stack.name());
        for p in &r.points {
            let _ = write!(
                s,
                " {:>18}",
                format!("{:.0}/s {:.1}us", p.rate(), p.cpu_us())
            );
        }
        if let Some(n) = r.failed {
            let _ = write!(s, " {:>18}", format!("stalled at {n}"));
        }
        if let (Some(a), Some(b)) = (r.points.first(), r.points.last()) {
            let _ = write!(
                s,
                " {:>10.2} {:>10.2}",
                b.rate() / a.rate().max(1e-9),
                b.cpu_us() / a.cpu_us().max(1e-9)
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "(each cell: requests/s, process CPU µs per request; ratios: largest count over 1 connection)"
    );
    let _ = writeln!(
        s,
        "\nmemory per idle connection pair (client + server end, both in this process / kernel)"
    );
    let _ = writeln!(
        s,
        "{:<22} {:>8} {:>12} {:>12} {:>16}",
        "row", "over", "RSS B", "slab B", "RSS after use B"
    );
    for r in results {
        let _ = writeln!(
            s,
            "{:<22} {:>8} {:>12.0} {:>12.0} {:>16.0}",
            r.stack.name(),
            r.mem.conns,
            r.mem.rss,
            r.mem.slab,
            r.mem.rss_after_use
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_options_and_rejects_bad_ones() {
        let o = parse_args(&args(&[
            "--conns",
            "1000,1,10",
            "--duration",
            "0.5",
            "--threads",
            "2",
            "--only",
            "own,kernel",
            "--buffer",
            "8192",
        ]))
        .unwrap();
        assert_eq!(o.conns, vec![1, 10, 1000]);
        assert_eq!(o.duration, Duration::from_millis(500));
        assert_eq!(o.threads, 2);
        assert_eq!(o.stacks, vec![Stack::Own, Stack::Kernel]);
        assert_eq!(o.buffer, 8192);
        for bad in [
            &["--conns", "0"][..],
            &["--conns", "70000"],
            &["--duration", "-1"],
            &["--threads", "0"],
            &["--only", "lwip"],
            &["--buffer", "100"],
            &["--frob"],
            &["--conns"],
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn replies_are_checked_against_the_inverted_request() {
        let a = request(3, 9, false);
        assert_ne!(a, request(4, 9, false));
        assert_ne!(a, request(3, 10, false));
        assert_ne!(a, request(3, 9, true));
        assert_eq!(u64::from_le_bytes(a[..8].try_into().unwrap()), 3);
    }
}
