//! `xwarp bench tcp --loss P[,P...]`: goodput through a lossy path.
//!
//! The usual tool for loss, `tc qdisc ... netem loss P`, needs the kernel's `sch_netem`,
//! which some kernels lack (this project's test machines answer "Specified qdisc kind is
//! unknown"). So the loss rows run on a path of their own, built from what the bench has:
//!
//! ```text
//!  A: veth-a 10.88.N.1/25 ── m-a .126 │ M (forwarding) │ m-b .129 ── veth-b .130/25 :B
//!     engine A .10/25, gw .126        │ XDP dropper on │             engine B .140, gw .129
//!                                     │ m-a and m-b    │
//! ```
//!
//! Three namespaces: the two ends A and B and a forwarding namespace M between them, joined
//! by two veth pairs. A [`LossDropper`] XDP program on both of M's interfaces (generic mode)
//! drops each IPv4 TCP frame with probability P, both directions, and counts the frames it
//! judged, so every row reports the loss the path really had. TSO, GSO and GRO are off on
//! all four interfaces, so every frame the dropper judges is one segment (with a 64 KiB
//! GSO super-frame one verdict would drop some 45 segments at once). RPS is on at every
//! receiving interface of the path, with all of the process's cores in the mask: a veth
//! queues a received frame on the backlog of the CPU that sent it, and a TCP sender sends
//! both from its application's core and from the softirq of the ACKs on the other core, so
//! without RPS one flow's frames pass M through two CPUs' backlogs and arrive reordered.
//! Measured without it, at loss 0 (kernel-kernel one-way, 2 s): 8,341 and 12,251
//! retransmitted segments, 7,459 and 11,120 of them reported spurious by DSACK; with it 0
//! and 0 (and at 1% loss no RTO instead of 4-6). The per-flow RPS hash keeps each flow on
//! one CPU per hop, so the path drops what the dropper drops and reorders nothing.
//!
//! Per loss rate and pair (`kernel-kernel`, then `xwarp-kernel` and `xwarp-xwarp` in every
//! `--mode`), two rows over fresh connections:
//! * **one-way**: the client writes for `--duration`, the server reads;
//! * **duplex**: one connection carrying data both ways at once: each end writes for
//!   `--duration` and reads what the other writes.
//!
//! Goodput is what a receiver got in order in the `--duration` after its first byte, over
//! that time (the data checked against the bench's pattern). Both ends run non-blocking on
//! one thread each; a row ends when both receivers' windows are over, or at its bound
//! (`--duration` + [`GRACE`]; a receiver cut short says so in the `cut` column). The
//! connections are then reset, so nothing of one row drains into the next.
//!
//! Counted per row: the dropper's frames dropped and passed (its drop fraction), the kernel
//! ends' retransmitted segments (`TCP_INFO` `tcpi_total_retrans`) and DSACKs received
//! (`tcpi_dsack_dups`, i.e. their spurious retransmissions), the RTOs of the kernel ends'
//! namespaces (`TcpExt: TCPTimeouts`, each end alone in its namespace), and the xwarp ends'
//! loss rescues (`TcpInfo::retransmits`; smoltcp exposes neither its RTOs nor DSACKs).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use xwarp::net::{TcpListener, TcpStream};
use xwarp::poll_driver::afxdp::dropper::{DropCounts, LossDropper};
use xwarp::poll_driver::afxdp::{XdpLink, XdpMode};
use xwarp::poll_driver::netns::NetNs;
use xwarp::toe::XdpEngine;

use super::super::common::{pattern, thread_cpu, PATTERN_PERIOD};
use super::options::{bad, row_name, Options, PairKind};
use super::traffic::{pin_to, placement, Conn};
use crate::bench::report::{fmt_opt, fmt_ratio, Report, Row, Side, Unit};

/// How long a row may run beyond `--duration` before it is cut.
pub const GRACE: Duration = Duration::from_secs(15);
/// First server port of the loss rows (one port per row).
const LOSS_PORT: u16 = 5600;
/// Connect timeout under loss (a lost SYN costs the kernel a 1 s retransmission).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The three namespaces and the dropper (module docs). Drop order: the XDP links, the
/// dropper, then the namespaces (with their veth pairs).
struct LossNet {
    /// Held for their lifetime: dropping a link detaches the dropper.
    _links: Vec<XdpLink>,
    dropper: LossDropper,
    a: NetNs,
    /// The forwarding namespace (removed on drop).
    _m: NetNs,
    b: NetNs,
    net: u8,
}

impl LossNet {
    fn addr(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 88, self.net, host)
    }
}

/// `ethtool -K dev tso off gso off gro off` inside `ns`.
fn offloads_off(ns: &NetNs, dev: &str) -> io::Result<()> {
    let out = ns
        .command("ethtool")?
        .args(["-K", dev, "tso", "off", "gso", "off", "gro", "off"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running ethtool: {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ethtool -K {dev} tso off gso off gro off in {}: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn setup(o: &Options) -> io::Result<LossNet> {
    let (a, m, b) = (NetNs::new("la")?, NetNs::new("lm")?, NetNs::new("lb")?);
    let n = o.net;
    let ip = |h: u8| format!("10.88.{n}.{h}");
    a.ip(&[
        "link",
        "add",
        "veth-a",
        "type",
        "veth",
        "peer",
        "name",
        "m-a",
        "netns",
        m.name(),
    ])?;
    b.ip(&[
        "link",
        "add",
        "veth-b",
        "type",
        "veth",
        "peer",
        "name",
        "m-b",
        "netns",
        m.name(),
    ])?;
    let mtu = o.mtu.to_string();
    // RPS over every core this process may use: a flow's frames then queue on one CPU's
    // backlog at each hop (see the module docs: without it the path reorders).
    let rps_mask = super::super::common::process_cores()
        .iter()
        .filter(|c| c.id < 64)
        .fold(0u64, |m, c| m | 1 << c.id)
        .max(1);
    for (ns, dev, addr) in [
        (&a, "veth-a", ip(1)),
        (&m, "m-a", ip(126)),
        (&m, "m-b", ip(129)),
        (&b, "veth-b", ip(130)),
    ] {
        ns.ip(&["addr", "add", &format!("{addr}/25"), "dev", dev])?;
        ns.ip(&["link", "set", dev, "mtu", &mtu])?;
        ns.ip(&["link", "set", dev, "up"])?;
        offloads_off(ns, dev)?;
        super::set_rps(ns, dev, rps_mask)?;
    }
    a.ip(&["route", "add", "default", "via", &ip(126)])?;
    b.ip(&["route", "add", "default", "via", &ip(129)])?;
    // /proc/sys/net is the opening thread's namespace's.
    m.run(|| -> io::Result<()> {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
        let v = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")?;
        if v.trim() != "1" {
            return Err(io::Error::other("ip_forward did not turn on in M"));
        }
        Ok(())
    })??;
    let dropper = LossDropper::load(0.0)?;
    let mut links = Vec::new();
    for dev in ["m-a", "m-b"] {
        let d = &dropper;
        let link = m.run(move || -> io::Result<XdpLink> {
            let c = std::ffi::CString::new(dev).map_err(|e| bad(e.to_string()))?;
            // SAFETY: `c` is a valid NUL-terminated string.
            let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
            if idx == 0 {
                return Err(io::Error::last_os_error());
            }
            d.attach(idx, XdpMode::Generic)
        })??;
        links.push(link);
    }
    Ok(LossNet {
        _links: links,
        dropper,
        a,
        _m: m,
        b,
        net: n,
    })
}

/// TCP counters of one namespace (`/proc/net/netstat` `TcpExt:`).
#[derive(Debug, Clone, Copy, Default)]
struct NsTcp {
    timeouts: u64,
}

/// The value of `field` in the `prefix` header/value line pair of a `/proc/net/{snmp,netstat}`
/// text.
fn proc_field(text: &str, prefix: &str, field: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let names = lines.next()?;
    let values = lines.next()?;
    let i = names.split_whitespace().position(|n| n == field)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

fn ns_tcp(ns: &NetNs) -> io::Result<NsTcp> {
    // /proc/thread-self/net: the calling thread's namespace.
    let text = ns.run(|| std::fs::read_to_string("/proc/thread-self/net/netstat"))??;
    Ok(NsTcp {
        timeouts: proc_field(&text, "TcpExt:", "TCPTimeouts").unwrap_or(0),
    })
}

/// What one end of a loss row did.
#[derive(Debug, Default, Clone, Copy)]
struct EndTally {
    /// Bytes received in order within the window after the first byte.
    counted: u64,
    /// That window (the duration, or less when cut).
    window: Duration,
    /// The window was cut by the row's bound.
    cut: bool,
    cpu: Duration,
}

/// One end of a loss row, non-blocking: write for `dur` if `send`, read (and check) if
/// `recv`, until both ends are done ([`ROW_ENDS`] reached on `done`) or `hard`.
fn drive(
    c: &mut dyn Conn,
    send: bool,
    recv: bool,
    dur: Duration,
    msg: usize,
    hard: Instant,
    done: &AtomicUsize,
) -> io::Result<EndTally> {
    let cpu0 = thread_cpu();
    let src: Vec<u8> = (0..(msg as u64 + PATTERN_PERIOD)).map(pattern).collect();
    let mut rbuf = vec![0u8; 256 << 10];
    let t0 = Instant::now();
    let (mut sent, mut got) = (0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut t = EndTally::default();
    let (mut eof, mut me_done) = (false, false);
    let mut idle_since: Option<Instant> = None;
    // XWARP_LOSS_TRACE=MS: the sending end's TCP state every MS milliseconds on stderr
    // (xwarp ends; for diagnosing a row).
    let trace = std::env::var("XWARP_LOSS_TRACE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|_| send)
        .map(Duration::from_millis);
    let mut next_trace = t0;
    loop {
        let now = Instant::now();
        let mut progress = false;
        if let Some(every) = trace {
            if now >= next_trace {
                next_trace = now + every;
                if let Some(line) = c.trace_line() {
                    eprintln!("[trace {:>8.3} s] {line}", (now - t0).as_secs_f64());
                }
            }
        }
        if send && now - t0 < dur {
            let at = (sent % PATTERN_PERIOD) as usize;
            match c.write(&src[at..at + msg]) {
                Ok(n) => {
                    sent += n as u64;
                    progress |= n > 0;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if recv && !eof {
            match c.read(&mut rbuf) {
                Ok(0) => eof = true,
                Ok(n) => {
                    for k in [0, n / 2, n - 1] {
                        if rbuf[k] != pattern(got + k as u64) {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("loss row: data mismatch at offset {}", got + k as u64),
                            ));
                        }
                    }
                    got += n as u64;
                    let at = Instant::now();
                    let f = *first.get_or_insert(at);
                    if at - f <= dur {
                        t.counted = got;
                    }
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let now = Instant::now();
        let send_done = !send || now - t0 >= dur;
        let recv_done = !recv || eof || first.is_some_and(|f| now - f >= dur);
        if send_done && recv_done && !me_done {
            me_done = true;
            done.fetch_add(1, Ordering::AcqRel);
        }
        if me_done && done.load(Ordering::Acquire) >= ROW_ENDS {
            break;
        }
        if now >= hard {
            t.cut = recv && !recv_done;
            break;
        }
        if progress {
            idle_since = None;
        } else {
            // Spin briefly (yielding the core), then nap: under loss most of a row is
            // waiting for recovery, and the engines need the cores.
            let since = *idle_since.get_or_insert(now);
            if now - since < Duration::from_micros(50) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
    if recv {
        t.window = match first {
            Some(f) => (Instant::now() - f).min(dur),
            None => dur,
        };
    }
    t.cpu = thread_cpu() - cpu0;
    Ok(t)
}

/// Ends of a row.
const ROW_ENDS: usize = 2;

/// One row's measurement.
#[derive(Debug, Clone)]
pub struct LossRun {
    /// Full duplex (both ends write) or one-way.
    pub duplex: bool,
    /// Client-to-server goodput, Gbit/s.
    pub fwd_gbps: f64,
    /// Server-to-client goodput (duplex only), Gbit/s.
    pub rev_gbps: Option<f64>,
    /// Bytes counted client to server, and back.
    pub bytes: (u64, u64),
    /// Frames the dropper judged during the row (both directions).
    pub drops: DropCounts,
    /// Retransmitted segments of the kernel ends (`tcpi_total_retrans`), if any is kernel.
    pub kernel_retrans: Option<u64>,
    /// RTOs of the kernel ends' namespaces (`TCPTimeouts`).
    pub kernel_rtos: Option<u64>,
    /// DSACKs the kernel ends received (`tcpi_dsack_dups`).
    pub kernel_dsacks: Option<u64>,
    /// The xwarp ends' loss rescues (`TcpInfo::retransmits`), if any end is xwarp.
    pub xwarp_rescues: Option<u64>,
    /// The xwarp ends' retransmission timeouts (`TcpInfo::rtos`; own core only).
    pub xwarp_rtos: Option<u64>,
    /// A receiver's window was cut by the row's bound.
    pub cut: bool,
}

/// The rows of one pair at one loss rate.
#[derive(Debug, Clone)]
pub struct LossResult {
    /// Loss probability asked for.
    pub p: f64,
    /// Which pair.
    pub kind: PairKind,
    /// Row name ([`row_name`]).
    pub name: String,
    /// One-way, then duplex.
    pub runs: Vec<LossRun>,
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
    }
}

/// The ends of a pair: how to get the server's listener and the client's connection.
enum Ends<'a> {
    Kernel,
    XwarpKernel(&'a XdpEngine),
    XwarpXwarp(&'a XdpEngine, &'a XdpEngine),
}

/// Connect a fresh client-server pair on `port`: (client, server).
fn connect(
    net: &LossNet,
    ends: &Ends<'_>,
    port: u16,
) -> io::Result<(Box<dyn Conn>, Box<dyn Conn>)> {
    let kernel_b = SocketAddr::from((net.addr(130), port));
    let xwarp_b = SocketAddr::from((net.addr(140), port));
    let kernel_client = || -> io::Result<Box<dyn Conn>> {
        let s = net
            .a
            .run(move || std::net::TcpStream::connect_timeout(&kernel_b, CONNECT_TIMEOUT))??;
        Ok(Box::new(s))
    };
    let xwarp_client = |e: &XdpEngine, addr| -> io::Result<Box<dyn Conn>> {
        Ok(Box::new(TcpStream::connect_timeout(
            e.stack(),
            addr,
            CONNECT_TIMEOUT,
        )?))
    };
    // The handshake completes into the listener's queue, so accept follows the connect.
    match ends {
        Ends::Kernel | Ends::XwarpKernel(_) => {
            let l = net.b.run(move || std::net::TcpListener::bind(kernel_b))??;
            let c = match ends {
                Ends::XwarpKernel(e) => xwarp_client(e, kernel_b)?,
                _ => kernel_client()?,
            };
            let (s, _) = l.accept()?;
            Ok((c, Box::new(s)))
        }
        Ends::XwarpXwarp(ea, eb) => {
            let l = TcpListener::bind(eb.stack(), xwarp_b)?;
            let c = xwarp_client(ea, xwarp_b)?;
            let (s, _) = l.accept()?;
            Ok((c, Box::new(s)))
        }
    }
}

/// One row over a fresh connection on `port`.
fn row(
    net: &LossNet,
    o: &Options,
    ends: &Ends<'_>,
    port: u16,
    duplex: bool,
) -> io::Result<LossRun> {
    let [client_core, server_core, _, _] = placement(o.pin);
    let (kernel_client, kernel_server) = match ends {
        Ends::Kernel => (true, true),
        Ends::XwarpKernel(_) => (false, true),
        Ends::XwarpXwarp(..) => (false, false),
    };
    let (na0, nb0) = (ns_tcp(&net.a)?, ns_tcp(&net.b)?);
    let d0 = net.dropper.counts()?;
    let (mut c, mut s) = connect(net, ends, port)?;
    c.prepare(o.app_spin)?;
    s.prepare(o.app_spin)?;
    c.set_nonblocking(true)?;
    s.set_nonblocking(true)?;
    let (dur, msg) = (o.duration, o.sizes[0]);
    let hard = Instant::now() + dur + GRACE;
    let done = AtomicUsize::new(0);
    let (tc, ts) = std::thread::scope(|sc| {
        let done = &done;
        let cref = &mut c;
        let sref = &mut s;
        let hc = sc.spawn(move || {
            pin_to(client_core);
            drive(&mut **cref, true, duplex, dur, msg, hard, done)
        });
        let hs = sc.spawn(move || {
            pin_to(server_core);
            drive(&mut **sref, duplex, true, dur, msg, hard, done)
        });
        (hc.join(), hs.join())
    });
    let tc = tc.map_err(|_| io::Error::other("loss row client panicked"))?;
    let ts = ts.map_err(|_| io::Error::other("loss row server panicked"))?;
    // Counters before the resets.
    let side = |conn: &dyn Conn, kernel: bool| {
        if kernel {
            (conn.retransmits(), conn.dsacks(), None, None)
        } else {
            (None, None, conn.retransmits(), conn.rtos())
        }
    };
    let (cr, cd, cx, ct) = side(&*c, kernel_client);
    let (sr, sd, sx, st) = side(&*s, kernel_server);
    c.abort();
    s.abort();
    let (tc, ts) = (tc?, ts?);
    let drops = net.dropper.counts()?.since(d0);
    let (na1, nb1) = (ns_tcp(&net.a)?, ns_tcp(&net.b)?);
    let rto = |k: bool, a: NsTcp, b: NsTcp| k.then(|| b.timeouts.saturating_sub(a.timeouts));
    let gbps = |t: &EndTally| t.counted as f64 * 8.0 / t.window.as_secs_f64().max(1e-9) / 1e9;
    Ok(LossRun {
        duplex,
        fwd_gbps: gbps(&ts),
        rev_gbps: duplex.then(|| gbps(&tc)),
        bytes: (ts.counted, if duplex { tc.counted } else { 0 }),
        drops,
        kernel_retrans: add(cr, sr),
        kernel_rtos: add(rto(kernel_client, na0, na1), rto(kernel_server, nb0, nb1)),
        kernel_dsacks: add(cd, sd),
        xwarp_rescues: add(cx, sx),
        xwarp_rtos: add(ct, st),
        cut: ts.cut || tc.cut,
    })
}

/// The rows of one pair: every loss rate, one-way then duplex.
fn pair_rows(
    net: &LossNet,
    o: &Options,
    ends: &Ends<'_>,
    kind: PairKind,
    name: &str,
    port: &mut u16,
) -> io::Result<Vec<LossResult>> {
    let mut out = Vec::new();
    for &p in &o.loss {
        net.dropper.set_loss(p)?;
        let mut runs = Vec::new();
        for duplex in [false, true] {
            eprintln!(
                "xwarp bench tcp: loss {p}: {name} {} ...",
                if duplex { "duplex" } else { "one-way" }
            );
            runs.push(row(net, o, ends, *port, duplex)?);
            *port = port.wrapping_add(1).max(LOSS_PORT);
        }
        out.push(LossResult {
            p,
            kind,
            name: name.to_string(),
            runs,
        });
    }
    net.dropper.set_loss(0.0)?;
    Ok(out)
}

/// Run the loss rows of every requested TCP pair (see the module docs).
pub fn run(o: &Options) -> io::Result<Vec<LossResult>> {
    let net = setup(o)?;
    let [_, _, core_a, core_b] = placement(o.pin);
    let mut port = LOSS_PORT;
    let mut out = Vec::new();
    let want = |k: PairKind| o.pairs.contains(&k);
    if want(PairKind::KernelKernel) {
        let name = PairKind::KernelKernel.name();
        out.extend(pair_rows(
            &net,
            o,
            &Ends::Kernel,
            PairKind::KernelKernel,
            name,
            &mut port,
        )?);
    }
    let engine = |side_a: bool, core, mode| {
        let (ns, dev, ip, gw) = if side_a {
            (&net.a, "veth-a", net.addr(10), net.addr(126))
        } else {
            (&net.b, "veth-b", net.addr(140), net.addr(129))
        };
        super::engine_on(ns, dev, ip, 25, Some(gw), side_a, o, core, mode)
    };
    for &mode in &o.modes {
        for kind in [PairKind::XwarpKernel, PairKind::XwarpXwarp] {
            if !want(kind) {
                continue;
            }
            let name = row_name(kind, mode, o.tcp_core);
            let ea = engine(true, core_a, mode)?;
            let eb = match kind {
                PairKind::XwarpXwarp => Some(engine(false, core_b, mode)?),
                _ => None,
            };
            let ends = match &eb {
                Some(eb) => Ends::XwarpXwarp(&ea, eb),
                None => Ends::XwarpKernel(&ea),
            };
            let rows = pair_rows(&net, o, &ends, kind, &name, &mut port);
            let bytes: u64 = rows
                .iter()
                .flatten()
                .flat_map(|r| &r.runs)
                .map(|r| r.bytes.0 + r.bytes.1)
                .sum();
            super::report_engine("A", ea, bytes)?;
            if let Some(eb) = eb {
                super::report_engine("B", eb, bytes)?;
            }
            out.extend(rows?);
        }
    }
    drop(net);
    Ok(out)
}

/// The report's test name of the loss rows at `p`.
pub fn test_name(p: f64) -> String {
    format!("loss-{p}")
}

/// The side of a pair's rows.
fn side(k: PairKind) -> Side {
    if k.is_xwarp() {
        Side::Xwarp
    } else {
        Side::Kernel
    }
}

/// Add the loss rows to `rep`: test `loss-<p>`, per pair and direction (`oneway`,
/// `duplex`): `goodput_oneway`, `goodput_duplex_fwd`, `goodput_duplex_rev` (Gbit/s, size =
/// the write size) and counts `<dir>_path_drops`, `<dir>_drop_fraction` (ratio),
/// `<dir>_kernel_retrans`, `<dir>_kernel_rtos`, `<dir>_kernel_dsacks`, `<dir>_xwarp_rescues`.
pub fn fill(rep: &mut Report, o: &Options, rs: &[LossResult]) {
    if rs.is_empty() {
        return;
    }
    rep.config("loss", o.loss.clone());
    let msg = o.sizes[0];
    for r in rs {
        let (t, sd) = (test_name(r.p), side(r.kind));
        for run in &r.runs {
            let dir = if run.duplex { "duplex" } else { "oneway" };
            let note = run.cut.then_some("cut at the row's time bound");
            let gp = |metric: &str, v: f64, bytes: u64| {
                let row = Row::new(&t, &r.name, sd, metric, Unit::Gbps, v)
                    .size(msg)
                    .bytes(bytes);
                match note {
                    Some(n) => row.note(n),
                    None => row,
                }
            };
            if run.duplex {
                rep.push(gp("goodput_duplex_fwd", run.fwd_gbps, run.bytes.0));
                if let Some(v) = run.rev_gbps {
                    rep.push(gp("goodput_duplex_rev", v, run.bytes.1));
                }
            } else {
                rep.push(gp("goodput_oneway", run.fwd_gbps, run.bytes.0));
            }
            let count = |m: &str, v: u64| {
                Row::new(
                    &t,
                    &r.name,
                    sd,
                    &format!("{dir}_{m}"),
                    Unit::Count,
                    v as f64,
                )
            };
            rep.push(count("path_drops", run.drops.dropped));
            rep.push(Row::new(
                &t,
                &r.name,
                sd,
                &format!("{dir}_drop_fraction"),
                Unit::Ratio,
                run.drops.fraction(),
            ));
            for (m, v) in [
                ("kernel_retrans", run.kernel_retrans),
                ("kernel_rtos", run.kernel_rtos),
                ("kernel_dsacks", run.kernel_dsacks),
                ("xwarp_rescues", run.xwarp_rescues),
                ("xwarp_rtos", run.xwarp_rtos),
            ] {
                if let Some(v) = v {
                    rep.push(count(m, v));
                }
            }
        }
    }
    rep.notes.push(
        "loss-<p>: goodput through a forwarding namespace whose XDP program drops the share p of TCP frames each way (no netem on this kernel); path_drops/drop_fraction: what the dropper dropped in the row; kernel_*: the kernel ends' TCP_INFO retransmissions and DSACKs received and their namespaces' RTOs (TCPTimeouts); xwarp_rescues: the engines' loss rescues; xwarp_rtos: the engines' RTOs (own TCP core; smoltcp exposes no RTO or DSACK count).".into(),
    );
}

/// The loss table, from the report's rows.
pub fn table(o: &Options, rep: &Report) -> String {
    let mut s = format!(
        "\nxwarp bench tcp --loss: forwarding namespace with an XDP dropper on both of its interfaces, IP MTU {}, {:.1} s windows, {} B writes, TSO/GSO/GRO off\n\n",
        o.mtu,
        o.duration.as_secs_f64(),
        o.sizes[0]
    );
    s += &format!(
        "{:<6} {:<28} {:<7} {:>9} {:>9} {:>6} {:>8} {:>7} {:>8} {:>6} {:>6} {:>7} {:>6} {:>4}\n",
        "loss",
        "pair",
        "dir",
        "Gbit/s",
        "rev",
        "x kern",
        "drops",
        "drop %",
        "retr(k)",
        "RTO(k)",
        "DSACK",
        "rescue",
        "RTO(x)",
        "cut"
    );
    for &p in &o.loss {
        let t = test_name(p);
        let mut names: Vec<&str> = Vec::new();
        for r in rep.rows.iter().filter(|r| r.test == t) {
            if !names.contains(&r.name.as_str()) {
                names.push(&r.name);
            }
        }
        for name in names {
            for dir in ["oneway", "duplex"] {
                let fwd_metric = if dir == "oneway" {
                    "goodput_oneway"
                } else {
                    "goodput_duplex_fwd"
                };
                let Some(fwd) = rep.find(&t, name, fwd_metric) else {
                    continue;
                };
                let v = |m: &str| rep.value(&t, name, &format!("{dir}_{m}"));
                let n = |m: &str| v(m).map_or("-".into(), |x| format!("{x:.0}"));
                s += &format!(
                    "{:<6} {:<28} {:<7} {:>9.4} {:>9} {:>6} {:>8} {:>7} {:>8} {:>6} {:>6} {:>7} {:>6} {:>4}\n",
                    format!("{p}"),
                    name,
                    dir,
                    fwd.value,
                    fmt_opt(rep.value(&t, name, "goodput_duplex_rev").filter(|_| dir == "duplex"), 4),
                    fmt_ratio(fwd.ratio_to_kernel),
                    n("path_drops"),
                    fmt_opt(v("drop_fraction").map(|f| f * 100.0), 2),
                    n("kernel_retrans"),
                    n("kernel_rtos"),
                    n("kernel_dsacks"),
                    n("xwarp_rescues"),
                    n("xwarp_rtos"),
                    if fwd.note.is_some() { "cut" } else { "" }
                );
            }
        }
    }
    s += "\nGbit/s: in-order goodput at the receiver over the window after its first byte (duplex: client to server;\n\
          rev: server to client on the same connection); x kern: to kernel-kernel at the same loss and direction;\n\
          drops / drop %: frames the dropper dropped in the row (both directions); retr(k), RTO(k), DSACK: the kernel\n\
          ends' retransmitted segments, RTOs and DSACKs received; rescue: the xwarp engines' loss rescues;\n\
          RTO(x): the xwarp engines' RTOs (own core; smoltcp exposes no RTO or DSACK count); cut: a receiver's window ended at the row's time bound.\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_fields_are_read_by_name() {
        let text = "TcpExt: SyncookiesSent TCPTimeouts TCPDSACKRecv\nTcpExt: 0 17 4\nIpExt: InNoRoutes\nIpExt: 9\n";
        assert_eq!(proc_field(text, "TcpExt:", "TCPTimeouts"), Some(17));
        assert_eq!(proc_field(text, "TcpExt:", "TCPDSACKRecv"), Some(4));
        assert_eq!(proc_field(text, "IpExt:", "InNoRoutes"), Some(9));
        assert_eq!(proc_field(text, "TcpExt:", "Nope"), None);
        assert_eq!(proc_field("", "TcpExt:", "TCPTimeouts"), None);
        assert_eq!(add(None, None), None);
        assert_eq!(add(Some(2), None), Some(2));
        assert_eq!(add(Some(2), Some(3)), Some(5));
    }

    #[test]
    fn loss_rows_fill_the_report_and_the_table() {
        let run = |duplex, g| LossRun {
            duplex,
            fwd_gbps: g,
            rev_gbps: duplex.then_some(g / 2.0),
            bytes: (100, if duplex { 50 } else { 0 }),
            drops: DropCounts {
                dropped: 10,
                passed: 990,
            },
            kernel_retrans: Some(12),
            kernel_rtos: Some(1),
            kernel_dsacks: Some(0),
            xwarp_rescues: None,
            xwarp_rtos: None,
            cut: false,
        };
        let o = Options {
            loss: vec![0.01],
            ..Options::default()
        };
        let rs = [
            LossResult {
                p: 0.01,
                kind: PairKind::KernelKernel,
                name: "kernel-kernel".into(),
                runs: vec![run(false, 2.0), run(true, 1.0)],
            },
            LossResult {
                p: 0.01,
                kind: PairKind::XwarpXwarp,
                name: "xwarp-xwarp/thread/smoltcp".into(),
                runs: vec![run(false, 1.0), run(true, 0.25)],
            },
        ];
        let mut rep = Report::new("tcp");
        fill(&mut rep, &o, &rs);
        rep.fill_ratios();
        let x = rep
            .find("loss-0.01", "xwarp-xwarp/thread/smoltcp", "goodput_oneway")
            .unwrap();
        assert_eq!(x.ratio_to_kernel, Some(0.5));
        assert_eq!(
            rep.value("loss-0.01", "kernel-kernel", "oneway_drop_fraction"),
            Some(0.01)
        );
        assert_eq!(
            rep.value("loss-0.01", "kernel-kernel", "goodput_duplex_rev"),
            Some(0.5)
        );
        let t = table(&o, &rep);
        assert!(
            t.contains("xwarp-xwarp/thread/smoltcp") && t.contains("duplex"),
            "{t}"
        );
        assert!(t.contains("0.50"), "{t}");
        let back = Report::from_json(&rep.to_json()).unwrap();
        assert_eq!(back, rep);
    }
}
