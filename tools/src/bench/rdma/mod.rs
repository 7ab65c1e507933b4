//! `xwarp bench rdma`: xwarp RDMA (iWARP over the xwarp TCP engine on AF_XDP) against
//! kernel TCP moving the same bytes in the same sizes, over one veth pair between two
//! namespaces it creates (root).
//!
//! * xwarp↔xwarp: two verbs engines ([`xwarp::verbs::Context::start_xdp`]) at
//!   `10.88.<net>.10` (veth-a) and `.20` (veth-b), MPA CRC on both sides:
//!   write_bw and read_bw (64 KiB messages, 16 outstanding), write_lat and send_lat
//!   (small messages, ping-pong, one-way = half the round trip).
//! * kernel↔kernel on the same veth (`.1` ↔ `.2`): bulk (64 KiB writes) and ping-pong
//!   (small messages, half round trip), `TCP_NODELAY`.
//! * perftest through the C ABI (`.30` ↔ `.40`, after the engines above stopped):
//!   Debian's `ib_write_bw -R` and `ib_send_lat -R` as two processes under `xwarp run`
//!   (libxwarp_ibverbs.so, one engine each), and what they cost against the Rust API rows
//!   of the same round ([`perftest`]).
//!
//! Placement (`--pin apart`, the default): engine A on the first core, engine B on the
//! second; the client thread (it posts requests and reaps completions) on the core of the
//! engine that *receives* the bulk data: B's for write_bw, A's for read_bw and the latency
//! tests; the server thread on the second core. The kernel pair: writer (client) on the
//! first core, reader on the second. Why the client moves for write_bw: the sending
//! engine's core also does the kernel's copy-mode AF_XDP work of both sides (its `sendto`
//! runs the veth, the peer's XDP program and the copy into the peer's UMEM), so it is
//! the bottleneck, and a client sharing it costs a wakeup and two context switches per
//! signaled completion there. Measured at MTU 60000, 3 interleaved pairs of runs:
//! 20.1 / 24.5 / 25.4 Gbit/s with the client on B's core against 19.1 / 20.8 / 22.7 on
//! A's. `--pin sides` keeps the client on A's core in every test (side A: client +
//! engine A, side B: server + engine B). Ping-pong waiters yield their core while they
//! poll (the engine of their side shares it), and so do idle engines
//! (`SpinBudget::Yield`, see `engine_spin`); `--pin none` leaves placement to the
//! scheduler. `--mtu` changes the veth MTU for both pairs.
//!
//! Bandwidth, honestly: the RDMA source buffer holds a pattern that is checked where it
//! lands (an untouched MR is the shared zero page, always in cache); the kernel pair moves
//! the same 2 MiB of 64 KiB messages into the same rotating 2 MiB; the kernel runs with its
//! default receive path (no RPS: with RPS it lost half its bulk rate here, which is why
//! `xwarp bench tcp` once reported a kernel half as fast). Each bandwidth row also reports
//! the process CPU seconds per GB moved, which is steadier than Gbit/s on a shared machine.
//!
//! XDP mode: generic (skb) by default. Measured on a veth, 5 interleaved runs of write_bw:
//! MTU 1500 2.49-2.65 CPU s/GB generic vs 2.94-3.08 native (Gbit/s median 4.8 vs 2.3, noisy);
//! MTU 9000 1.15-1.35 vs 1.21-1.43 (no clear difference).
//!
//! `--sizes LIST` measures write_bw, read_bw and the kernel bulk at every size (the
//! ceiling moves MTU frames and runs once). Prints a table with ratios (generated from the
//! rows of [`crate::bench::report`]), per-second progress lines of every bandwidth
//! measurement on stderr (`--quiet`: none); `--json FILE` writes the report, `--plot
//! FILE.svg` draws bandwidth against size and the latency CDFs ([`crate::bench::plot`]).

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xwarp::poll_driver::afxdp::AfXdpNic;
use xwarp::poll_driver::backend::Backend;
use xwarp::poll_driver::engine::{InlineDriver, SpinBudget};
use xwarp::poll_driver::netns::VethPair;

mod options;
mod output;
pub mod perftest;

use options::*;
pub use options::{parse, BwResults, Options, Pin, Results};
pub use output::{fill, table};

use super::plot::write_outputs;
use super::progress;
use super::report::Report;

use super::common::{self, process_cores, process_cpu};
use xwarp::toe::{RxChecksum, XdpEngineConfig};
use xwarp::verbs::{
    Access, CmEvent, CompletionQueue, CompletionStatus, ConnectParams, Context, MemoryRegion,
    ProtectionDomain, QpInitAttr, QueuePair, SendRequest, WorkCompletion,
};

/// Entry point of `xwarp bench rdma ARGS...`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    // --help / --version: on stdout, status 0; a bad command line: status 2 with the usage.
    let cli = options::parse_cli(&args).unwrap_or_else(|e| e.exit());
    let o = match options::check(cli) {
        Ok(o) => o,
        Err(e) => {
            let usage = <options::Cli as clap::CommandFactory>::command().render_usage();
            eprintln!("xwarp bench rdma: {e}\n\n{usage}\n\nFor more information, try '--help'.");
            return ExitCode::from(2);
        }
    };
    progress::set_quiet(o.quiet);
    let (t0, mut rep) = (Instant::now(), Report::new("rdma"));
    match run(&o) {
        Ok(r) => {
            output::fill(&mut rep, &o, &r);
            rep.intervals = progress::take_log();
            rep.finish(t0);
            print!("{}", output::table(&o, &rep));
            if let Err(e) = write_outputs(&rep, o.json.as_deref(), o.plot.as_deref()) {
                eprintln!("xwarp bench rdma: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xwarp bench rdma: {e}");
            ExitCode::FAILURE
        }
    }
}

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// One connected end.
struct End {
    pd: ProtectionDomain,
    qp: QueuePair,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    buf: MemoryRegion,
}

fn ok(wc: WorkCompletion) -> io::Result<WorkCompletion> {
    if wc.status == CompletionStatus::Success {
        Ok(wc)
    } else {
        Err(err(format!("completion failed: {wc:?}")))
    }
}

fn end(ctx: &Context<AfXdpNic>, len: usize) -> io::Result<End> {
    let dev = ctx.device();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(1024)?;
    let rcq = dev.create_cq(1024)?;
    let acc = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let buf = pd.alloc_mr(len, acc, false)?;
    let mut at = QpInitAttr::new(&scq, &rcq);
    at.max_send_wr = DEPTH * 4;
    at.max_recv_wr = 64;
    at.max_inline_data = 256;
    at.mpa.crc = true;
    let qp = pd.create_qp(&at)?;
    Ok(End {
        pd,
        qp,
        scq,
        rcq,
        buf,
    })
}

fn connect(
    a: &Context<AfXdpNic>,
    b: &Context<AfXdpNic>,
    addr: SocketAddr,
    len: usize,
) -> io::Result<(End, End)> {
    let listener = b.device().listen(addr, 4)?;
    let c = end(a, len)?;
    let s = end(b, len)?;
    c.qp.connect(
        addr,
        ConnectParams {
            private_data: Vec::new(),
            timeout: WAIT,
        },
    )?;
    let req = listener.get_request(WAIT)?;
    req.accept(&s.qp, &[])?;
    for q in [&c.qp, &s.qp] {
        match q.next_event(WAIT)? {
            CmEvent::Established { .. } => {}
            e => return Err(err(format!("connect: {e:?}"))),
        }
    }
    Ok((c, s))
}

/// Every `SIGNAL_EVERY`-th request of the bandwidth tests is signaled (a send queue
/// completes in order, so one completion retires the unsignaled requests before it), as
/// perftest's `ib_write_bw` moderates its completions: a CQE per 64 KiB message costs a CQ
/// push (and, with the client asleep, a wakeup) per message on the sending engine's core.
/// (Against one CQE per message the difference was within this machine's noise.) `DEPTH`
/// is a multiple, so a full window always holds a signaled request.
const SIGNAL_EVERY: u64 = 4;

/// The fill pattern of bandwidth source buffers: byte `i` of `side`'s buffer.
fn bw_pattern(side: u8, i: usize) -> u8 {
    (i % 251) as u8 ^ side.wrapping_mul(0x5b)
}

/// Write or Read bandwidth, `size`-byte messages (`BULK` by default), `DEPTH` outstanding, Gbit/s; and the
/// process CPU seconds spent per GB moved (both engines, the client and the kernel's
/// work done on their behalf). The data source is filled with a pattern first, and every
/// message slot is compared with it afterwards.
fn rdma_bw(c: &End, s: &End, read: bool, size: usize, dur: Duration) -> io::Result<(f64, f64)> {
    let slots = DEPTH * 2;
    let (src, dst, side) = if read { (s, c, 2) } else { (c, s, 1) };
    let pattern: Vec<u8> = (0..size * slots).map(|i| bw_pattern(side, i)).collect();
    src.buf.write(0, &pattern)?;
    dst.buf.fill(0, size * slots, 0)?;
    let (mut posted, mut done) = (0u64, 0u64);
    // `--pin apart`: the client runs on the core of the engine that receives the data (see
    // the module docs); this thread goes back to side A's core afterwards.
    let apart = APART.load(Ordering::Relaxed);
    let _side_b = (!read && apart).then(OnSideB::enter);
    // The client sleeps on the CQ's notification while there is no completion (as the
    // applications of `xwarp bench tcp` sleep on their sockets, and perftest's `-e`); off
    // the sending engine's core (`--pin apart`) it polls for `BULK_POLL` first. With
    // `--pin sides` it shares that core and sleeps at once: measured at MTU 9000, 3
    // interleaved runs, 7.5-8.1 Gbit/s sleeping vs 5.4-6.2 yielding, at the same CPU per GB.
    let poll_for = if apart { BULK_POLL } else { Duration::ZERO };
    let cpu0 = process_cpu();
    let t0 = Instant::now();
    loop {
        // Past the deadline, post up to the next signaled request only.
        while posted - done < DEPTH as u64 && (t0.elapsed() < dur || posted % SIGNAL_EVERY != 0) {
            let off = (posted as usize % slots) * size;
            let sge = c.buf.sge(off, size).ok_or_else(|| err("sge"))?;
            let (rkey, raddr) = (s.buf.rkey(), s.buf.addr() + off as u64);
            let mut wr = if read {
                SendRequest::read(posted, sge, rkey, raddr)
            } else {
                SendRequest::write(posted, vec![sge], rkey, raddr)
            };
            wr.signaled = posted % SIGNAL_EVERY == SIGNAL_EVERY - 1;
            c.qp.post_send(wr)
                .map_err(|e| err(format!("post: {e:?}")))?;
            posted += 1;
        }
        if done == posted {
            break;
        }
        let wc = ok(c.scq.next_polling(WAIT, poll_for)?)?;
        if wc.wr_id < done || wc.wr_id >= posted {
            return Err(err(format!("completion for wr {} out of order", wc.wr_id)));
        }
        progress::add((wc.wr_id + 1 - done) * size as u64);
        done = wc.wr_id + 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = process_cpu().saturating_sub(cpu0);
    let bytes = done as f64 * size as f64;
    let mut got = vec![0u8; size * slots];
    dst.buf.read(0, &mut got)?;
    // Slots never written (a run shorter than `slots` messages) stay zero.
    let used = (done as usize).min(slots) * size;
    if got[..used] != pattern[..used] {
        return Err(err("bandwidth: placed data differs from the source"));
    }
    Ok((bytes * 8.0 / secs / 1e9, cpu.as_secs_f64() / (bytes / 1e9)))
}

/// How long the bandwidth client polls its CQ (yielding the core on every empty poll)
/// before it sleeps on the CQ's notification, when it does not share the sending engine's
/// core (`--pin apart`; perftest's `ib_write_bw` polls without `-e`). A sleeping client is
/// woken by the sending engine with an eventfd write, an IPI to the other core, on the
/// bottleneck core. Measured at MTU 60000 with the engines' 2 ms yield budget, 3
/// interleaved pairs of write_bw runs: 24.7 / 24.4 / 25.0 Gbit/s polling against
/// 22.7 / 22.7 (and one slow 13.2) with the client sleeping and engines yielding 50 µs,
/// at the same CPU per GB (0.62-0.64 s).
const BULK_POLL: Duration = Duration::from_millis(2);

/// The p50 half round trip in µs of round trips `v` (NaN when empty) and every half
/// round trip in µs.
fn p50_half_us(v: &[Duration]) -> (f64, Vec<f64>) {
    let half: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e6 / 2.0).collect();
    let mut sorted = half.clone();
    sorted.sort_by(f64::total_cmp);
    (
        sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN),
        half,
    )
}

/// The port of the `i`-th `--sizes` run of a test whose first run uses `base` (a fresh
/// listener each; 20 apart, so no test's ports meet another's).
fn sweep_port(base: u16, i: usize) -> u16 {
    base + 20 * i as u16
}

/// Set by [`run`]: threads are pinned or not.
static PINNED: AtomicBool = AtomicBool::new(false);
/// Set by [`run`]: `--pin apart` (the write_bw client runs on side B's core).
static APART: AtomicBool = AtomicBool::new(false);

/// Pin the calling thread to side `side`'s core (0: A, 1: B) when there are two or more
/// cores: side A (client, engine A) on the first core, side B (server, engine B) on the
/// second, as `xwarp bench tcp --pin sides`.
fn pin(side: usize) {
    if !PINNED.load(Ordering::Relaxed) {
        return;
    }
    let ids = process_cores();
    if ids.len() >= 2 {
        core_affinity::set_for_current(ids[side]);
    }
}

/// The calling thread on side B's core until dropped, then back on side A's.
struct OnSideB;

impl OnSideB {
    fn enter() -> OnSideB {
        pin(1);
        OnSideB
    }
}

impl Drop for OnSideB {
    fn drop(&mut self) {
        pin(0);
    }
}

/// The core id of side `side` (see [`pin`]).
fn core_of(side: usize) -> Option<usize> {
    if !PINNED.load(Ordering::Relaxed) {
        return None;
    }
    let ids = process_cores();
    (ids.len() >= 2).then(|| ids[side].id)
}

/// Spin until `f` is true, `stop` is set (Ok(false)) or `WAIT` passes.
fn spin(
    stop: &AtomicBool,
    driver: Option<&InlineDriver>,
    mut f: impl FnMut() -> bool,
) -> io::Result<bool> {
    let t = Instant::now();
    loop {
        if f() {
            return Ok(true);
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(false);
        }
        if t.elapsed() > WAIT {
            return Err(err("ping-pong peer did not answer"));
        }
        // An engine may share the core (always with --pin sides; with --pin none
        // whenever the scheduler puts it there): let it run. A waiter that busy-spins
        // without yielding keeps a woken engine off the core until the scheduler slice
        // ends: measured with --pin none, p50 half round trips of ~1.1 ms in some runs.
        // In inline mode this thread is the engine: a waiter polling memory for an RDMA
        // Write must drive it, or only the keeper does (after 1 ms without a driver).
        match driver {
            Some(d) => {
                d.try_drive();
            }
            None => std::thread::yield_now(),
        }
    }
}

/// Write ping-pong: each side Writes `size` bytes into the peer's buffer; the last byte
/// carries the iteration mark the peer polls for. The round trips.
fn write_lat(c: &End, s: &End, size: usize, dur: Duration) -> io::Result<Vec<Duration>> {
    let last = size - 1;
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| -> io::Result<Vec<Duration>> {
        let server = sc.spawn(|| -> io::Result<()> {
            pin(1);
            let mut n = 0u64;
            loop {
                let mark = (n % 255 + 1) as u8;
                if !spin(&stop, s.scq.inline_driver(), || {
                    s.buf.poll_byte(last) == Some(mark)
                })? {
                    return Ok(());
                }
                s.buf.write(size + last, &[mark])?;
                n += 1;
                let sge = s.buf.sge(size, size).ok_or_else(|| err("sge"))?;
                let mut wr = SendRequest::write(n, vec![sge], c.buf.rkey(), c.buf.addr());
                wr.signaled = n.is_multiple_of(16);
                s.qp.post_send(wr).map_err(|e| err(format!("{e:?}")))?;
                while let Some(w) = s.scq.poll_one() {
                    ok(w)?;
                }
            }
        });
        let r = (|| -> io::Result<Vec<Duration>> {
            let mut lat = Vec::new();
            let t0 = Instant::now();
            let mut i = 0u64;
            while t0.elapsed() < dur {
                let mark = (i % 255 + 1) as u8;
                c.buf.write(size + last, &[mark])?;
                let t = Instant::now();
                let sge = c.buf.sge(size, size).ok_or_else(|| err("sge"))?;
                let mut wr = SendRequest::write(i, vec![sge], s.buf.rkey(), s.buf.addr());
                wr.signaled = (i + 1).is_multiple_of(16);
                c.qp.post_send(wr).map_err(|e| err(format!("{e:?}")))?;
                spin(&AtomicBool::new(false), c.scq.inline_driver(), || {
                    c.buf.poll_byte(last) == Some(mark)
                })?;
                lat.push(t.elapsed());
                while let Some(w) = c.scq.poll_one() {
                    ok(w)?;
                }
                i += 1;
            }
            Ok(lat)
        })();
        stop.store(true, Ordering::Relaxed);
        let srv = server.join().map_err(|_| err("server panicked"))?;
        let lat = r?;
        srv?;
        Ok(lat)
    })
}

/// Send ping-pong with `size`-byte inline Sends; the echoed payload is verified.
/// The round trips.
fn send_lat(c: &End, s: &End, size: usize, dur: Duration) -> io::Result<Vec<Duration>> {
    let stop = AtomicBool::new(false);
    let rsge = |e: &End| e.buf.sge(0, size).ok_or_else(|| err("sge"));
    s.qp.post_recv(0, &[rsge(s)?])
        .map_err(|e| err(format!("{e:?}")))?;
    // Wait until the server's engine applied that receive before the client may send: a
    // synchronous registration queues behind it. Received bytes reach the verbs host after
    // every ingress packet, queued commands only at the start of an engine iteration, so
    // a receive posted just before the peer's Send arrives can otherwise miss it (DDP
    // Terminate, untagged buffer, no buffer available).
    drop(s.pd.alloc_mr(64, Access::LOCAL_WRITE, false)?);
    std::thread::scope(|sc| -> io::Result<Vec<Duration>> {
        let server = sc.spawn(|| -> io::Result<()> {
            pin(1);
            let mut n = 0u64;
            let mut payload = vec![0u8; size];
            loop {
                let mut got = None;
                if !spin(&stop, s.rcq.inline_driver(), || {
                    got = s.rcq.poll_one();
                    got.is_some()
                })? {
                    return Ok(());
                }
                got.map(ok).transpose()?;
                s.buf.read(0, &mut payload)?;
                s.qp.post_recv(0, &[rsge(s)?])
                    .map_err(|e| err(format!("{e:?}")))?;
                n += 1;
                let mut wr = SendRequest {
                    inline: Some(payload.clone()),
                    ..SendRequest::send(n, vec![])
                };
                wr.signaled = n.is_multiple_of(16);
                s.qp.post_send(wr).map_err(|e| err(format!("{e:?}")))?;
                while let Some(w) = s.scq.poll_one() {
                    ok(w)?;
                }
            }
        });
        let r = (|| -> io::Result<Vec<Duration>> {
            let mut lat = Vec::new();
            let t0 = Instant::now();
            let mut i = 0u64;
            let mut echo = vec![0u8; size];
            while t0.elapsed() < dur {
                let data = vec![(i % 251) as u8; size];
                c.qp.post_recv(0, &[rsge(c)?])
                    .map_err(|e| err(format!("{e:?}")))?;
                let t = Instant::now();
                let mut wr = SendRequest {
                    inline: Some(data.clone()),
                    ..SendRequest::send(i, vec![])
                };
                wr.signaled = (i + 1).is_multiple_of(16);
                c.qp.post_send(wr).map_err(|e| err(format!("{e:?}")))?;
                let mut got = None;
                spin(&AtomicBool::new(false), c.rcq.inline_driver(), || {
                    got = c.rcq.poll_one();
                    got.is_some()
                })?;
                lat.push(t.elapsed());
                got.map(ok).transpose()?;
                c.buf.read(0, &mut echo)?;
                if echo != data {
                    return Err(err(format!("send_lat: echo {i} differs")));
                }
                while let Some(w) = c.scq.poll_one() {
                    ok(w)?;
                }
                i += 1;
            }
            Ok(lat)
        })();
        stop.store(true, Ordering::Relaxed);
        let srv = server.join().map_err(|_| err("server panicked"))?;
        let lat = r?;
        srv?;
        Ok(lat)
    })
}

/// Kernel TCP bulk from namespace A to B: `size`-byte writes for `dur`, Gbit/s at the
/// receiver (which checks the byte count), and process CPU seconds per GB.
fn tcp_bulk(net: &VethPair, port: u16, size: usize, dur: Duration) -> io::Result<(f64, f64)> {
    let addr = SocketAddr::from((net.addr_b, port));
    let l = net.b.run(move || std::net::TcpListener::bind(addr))??;
    let slots = DEPTH * 2;
    let rx = std::thread::spawn(move || -> io::Result<(u64, Duration)> {
        pin(1);
        let (mut s, _) = l.accept()?;
        // Reads land in `slots` rotating 64 KiB slots, as the RDMA Writes do (written
        // once first, as `rdma_bw` clears its sink: no page faults inside the measurement).
        let mut buf = vec![0xffu8; size * slots];
        let mut n = 0u64;
        let t0 = Instant::now();
        loop {
            let off = (n / size as u64 % slots as u64) as usize * size;
            let at = (n % size as u64) as usize;
            let k = s.read(&mut buf[off + at..off + size])?;
            if k == 0 {
                return Ok((n, t0.elapsed()));
            }
            // Spot-check the stream: the first and last byte of each read.
            for i in [0, k - 1] {
                let pos = (n + i as u64) % (size * slots) as u64;
                if buf[off + at + i] != bw_pattern(1, pos as usize) {
                    return Err(err(format!("kernel bulk: byte {} differs", n + i as u64)));
                }
            }
            n += k as u64;
            progress::add(k as u64);
        }
    });
    let mut c = net
        .a
        .run(move || std::net::TcpStream::connect_timeout(&addr, WAIT))??;
    c.set_nodelay(true)?;
    // The same source as write_bw: `slots` 64 KiB messages of the same pattern, in turn.
    let buf: Vec<u8> = (0..size * slots).map(|i| bw_pattern(1, i)).collect();
    let mut sent = 0u64;
    let cpu0 = process_cpu();
    let t0 = Instant::now();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&c);
    let retrans = || progress::kernel_retransmits(fd);
    let mut next_sample = Duration::ZERO;
    loop {
        let now = t0.elapsed();
        if now >= dur {
            break;
        }
        if now >= next_sample {
            progress::set_retransmits(retrans());
            next_sample = now + Duration::from_millis(250);
        }
        let off = (sent / size as u64 % slots as u64) as usize * size;
        c.write_all(&buf[off..off + size])?;
        sent += size as u64;
    }
    progress::set_retransmits(retrans());
    c.shutdown(std::net::Shutdown::Write)?;
    let (n, el) = rx.join().map_err(|_| err("receiver panicked"))??;
    let cpu = process_cpu().saturating_sub(cpu0);
    if n != sent {
        return Err(err(format!("kernel bulk: sent {sent}, received {n}")));
    }
    Ok((
        n as f64 * 8.0 / el.as_secs_f64() / 1e9,
        cpu.as_secs_f64() / (n as f64 / 1e9).max(1e-9),
    ))
}

/// `read_exact` that, with `poll`, spins on a non-blocking socket (yielding on every empty
/// read) instead of sleeping in the kernel.
fn read_full(s: &mut std::net::TcpStream, buf: &mut [u8], poll: bool) -> io::Result<()> {
    if !poll {
        return s.read_exact(buf);
    }
    let deadline = Instant::now() + WAIT;
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                std::thread::yield_now();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Kernel TCP ping-pong of `size`-byte messages (echo verified). The round trips.
/// `poll`: both ends poll non-blocking sockets instead of sleeping in `read`.
fn tcp_pingpong(
    net: &VethPair,
    port: u16,
    size: usize,
    dur: Duration,
    poll: bool,
) -> io::Result<Vec<Duration>> {
    let addr = SocketAddr::from((net.addr_b, port));
    let l = net.b.run(move || std::net::TcpListener::bind(addr))??;
    let echo = std::thread::spawn(move || -> io::Result<()> {
        pin(1);
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        s.set_nonblocking(poll)?;
        let mut buf = vec![0u8; size];
        loop {
            match read_full(&mut s, &mut buf, poll) {
                Ok(()) => s.write_all(&buf)?,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut c = net
        .a
        .run(move || std::net::TcpStream::connect_timeout(&addr, WAIT))??;
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(WAIT))?;
    c.set_nonblocking(poll)?;
    let mut lat = Vec::new();
    let mut back = vec![0u8; size];
    let t0 = Instant::now();
    let mut i = 0u64;
    while t0.elapsed() < dur {
        let data = vec![(i % 251) as u8; size];
        let t = Instant::now();
        c.write_all(&data)?;
        read_full(&mut c, &mut back, poll)?;
        lat.push(t.elapsed());
        if back != data {
            return Err(err(format!("kernel ping-pong: echo {i} differs")));
        }
        i += 1;
    }
    c.shutdown(std::net::Shutdown::Write)?;
    echo.join().map_err(|_| err("echo panicked"))??;
    Ok(lat)
}

/// Run every measurement on a fresh veth pair (root needed).
pub fn run(o: &Options) -> io::Result<Results> {
    PINNED.store(o.pin != Pin::None, Ordering::Relaxed);
    APART.store(o.pin == Pin::Apart, Ordering::Relaxed);
    let _ = process_cores();
    // This thread is the client of every test.
    pin(0);
    let net = VethPair::new(o.net)?;
    let mtu = o.mtu.to_string();
    net.a.ip(&["link", "set", &net.if_a, "mtu", &mtu])?;
    net.b.ip(&["link", "set", &net.if_b, "mtu", &mtu])?;
    let tools = perftest_tools(o)?;
    let mut rounds = Vec::new();
    for round in 0..o.repeat {
        if o.repeat > 1 {
            eprintln!("xwarp bench rdma: round {}/{}", round + 1, o.repeat);
        }
        let mut r = run_round(o, &net)?;
        match &tools {
            Ok(t) => run_perftest(o, &net, t, &mut r)?,
            Err(why) => r.perftest_skipped = Some(why.clone()),
        }
        if o.repeat > 1 {
            // Each round's bandwidths, so the spread behind the medians is on record.
            for b in &r.bw {
                eprintln!(
                    "xwarp bench rdma: round {}: {} B: write_bw {:.2} read_bw {:.2} ib_write_bw \
                     {:.2} kernel bulk {:.2} ceiling {:.2} Gbit/s",
                    round + 1,
                    b.size,
                    b.write_bw_gbps,
                    b.read_bw_gbps,
                    b.ib_write_bw_gbps,
                    b.tcp_bulk_gbps,
                    r.ceiling_gbps
                );
            }
            if r.perftest_skipped.is_none() {
                eprintln!(
                    "xwarp bench rdma: round {}: {} B: send_lat p50 {:.2} ib_send_lat typical {:.2} \
                     avg {:.2} p99 {:.2} us",
                    round + 1,
                    o.small,
                    r.send_lat_us,
                    r.ib_send_lat_us,
                    r.ib_send_lat_avg_us,
                    r.ib_send_lat_p99_us
                );
            }
        }
        rounds.push(r);
    }
    Ok(output::median(&rounds))
}

/// The perftest rows' programs and libraries: `Ok(Err(why))` when the rows are skipped
/// (selected by default, but perftest or libxwarp_ibverbs.so is missing; said loudly on
/// stderr), an error when `--only` names them and they cannot run.
fn perftest_tools(o: &Options) -> io::Result<Result<perftest::Tools, String>> {
    let (bw, lat) = (o.runs(perftest::WRITE_BW), o.runs(perftest::SEND_LAT));
    if !bw && !lat {
        return Ok(Err("not selected (--only)".into()));
    }
    let xwarp = std::env::current_exe()?;
    // The library's engine takes MTUs up to 9000 (XWARP_MTU).
    let mtu = o.mtu.min(9000);
    match perftest::Tools::check(xwarp, o.preload.clone(), o.rdma_lib.clone(), mtu, 24) {
        Ok(mut t) => {
            match perftest::engine_env(engine_spin(o)) {
                Some(v) => t.engine_env = v,
                None => eprintln!(
                    "xwarp bench rdma: the library's engines cannot spin {}: they keep their default",
                    spin_name(o)
                ),
            }
            Ok(Ok(t))
        }
        Err(e) if o.asked_for(perftest::WRITE_BW) || o.asked_for(perftest::SEND_LAT) => {
            Err(err(format!("perftest rows: {e}")))
        }
        Err(e) => {
            eprintln!(
                "xwarp bench rdma: SKIPPED the perftest rows (ib_write_bw, ib_send_lat): {e}"
            );
            Ok(Err(e))
        }
    }
}

/// The perftest rows of one round ([`perftest`]), after `run_round`'s engines stopped.
fn run_perftest(
    o: &Options,
    net: &VethPair,
    t: &perftest::Tools,
    r: &mut Results,
) -> io::Result<()> {
    // `--pin sides` and `apart`: each process (program + its engine) on its side's core, as
    // both modes place the Rust latency tests (client + engine A on the first core, server
    // + engine B on the second; a process's threads cannot be split the way `apart` places
    // the write_bw client). `--pin none`: the scheduler places the four threads.
    let cores = if o.pin != Pin::None {
        [core_of(0), core_of(1)]
    } else {
        [None, None]
    };
    let ends = perftest::ends(net, o.net, cores);
    if o.runs(perftest::WRITE_BW) {
        for (i, w) in r.bw.iter_mut().enumerate() {
            eprintln!("xwarp bench rdma: {} -R {} B", perftest::WRITE_BW, w.size);
            let res = perftest::write_bw(
                t,
                &ends,
                sweep_port(18600, i),
                w.size,
                DEPTH,
                SIGNAL_EVERY,
                o.duration,
            )?;
            w.ib_write_bw_gbps = res.avg_gbps;
        }
    }
    if o.runs(perftest::SEND_LAT) {
        eprintln!("xwarp bench rdma: {} -R {} B", perftest::SEND_LAT, o.small);
        let l = perftest::send_lat(t, &ends, 18601, o.small, o.perftest_iters)?;
        (r.ib_send_lat_us, r.ib_send_lat_avg_us, r.ib_send_lat_p99_us) =
            (l.typical_us, l.avg_us, l.p99_us);
    }
    Ok(())
}

/// One round of every selected test on the pair: kernel TCP first (no XDP program attached
/// yet), the AF_XDP ceiling, then two engines for the RDMA tests (stopped at the end).
fn run_round(o: &Options, net: &VethPair) -> io::Result<Results> {
    let a_ip = Ipv4Addr::new(10, 88, o.net, 10);
    let b_ip = Ipv4Addr::new(10, 88, o.net, 20);
    let mut r = Results::new(&o.sizes);
    if o.runs("tcp") {
        for (i, w) in r.bw.iter_mut().enumerate() {
            let meter = progress::start("bulk", "tcp", Some(w.size));
            let res = tcp_bulk(net, sweep_port(5201, i), w.size, o.duration);
            meter.finish();
            (w.tcp_bulk_gbps, w.tcp_bulk_cpu_s_per_gb) = res?;
        }
        let lat = tcp_pingpong(net, 5202, o.small, o.duration, false)?;
        (r.tcp_lat_us, r.tcp_lat_samples) = p50_half_us(&lat);
        let lat = tcp_pingpong(net, 5203, o.small, o.duration, true)?;
        (r.tcp_lat_poll_us, r.tcp_lat_poll_samples) = p50_half_us(&lat);
    }
    if o.runs("ceiling") {
        let meter = progress::start("bulk", "afxdp-ceiling", None);
        let res = ceiling(net, o, a_ip, b_ip);
        meter.finish();
        r.ceiling_gbps = res?;
    }
    let cfg = |ifname: &str, ip, name: &str, core| {
        let mut c = XdpEngineConfig::new(ifname, ip, 24);
        // Both ends are xwarp engines and send full checksums; by default the TCP
        // checksum is trusted on receive as in `xwarp bench tcp` (a veth cannot corrupt a
        // frame, and the kernel pair does not verify it either); the MPA CRC is checked.
        c.rx_checksum = o.rx_checksum;
        c.engine.name = name.into();
        c.engine.core = core;
        c.engine.spin = engine_spin(o);
        c.mode = o.xdp_mode;
        // Frames larger than a chunk: multi-buffer (descriptor chains).
        (c.chunk, c.multi_buffer) = common::umem_for_mtu(o.mtu);
        // Socket buffers as `xwarp bench tcp` sizes them for the MTU.
        c.stack.rx_buffer = common::socket_buffer(o.mtu);
        c.stack.tx_buffer = common::socket_buffer(o.mtu);
        // RX chunks for that window (see `rx_frames_for`).
        c.rx_frames = common::rx_frames_for(o.mtu, c.stack.rx_buffer);
        c.stack.tcp.nodelay = true;
        c
    };
    let a = Context::start_xdp(Some(&net.a), cfg(&net.if_a, a_ip, "rdma-a", core_of(0)))?;
    let b = Context::start_xdp(Some(&net.b), cfg(&net.if_b, b_ip, "rdma-b", core_of(1)))?;
    let stage = |what: &str, c: &End, s: &End, e: io::Error| {
        // The CM events say why a connection failed (Terminate, disconnect).
        let ev = |q: &QueuePair| {
            std::iter::from_fn(|| q.next_event(Duration::from_millis(100)).ok())
                .take(8)
                .collect::<Vec<_>>()
        };
        err(format!(
            "{what}: {e}; client events {:?}, server events {:?}",
            ev(&c.qp),
            ev(&s.qp)
        ))
    };
    for (test, read, base) in [("write_bw", false, 4791), ("read_bw", true, 4792)] {
        if !o.runs(test) {
            continue;
        }
        for (i, w) in r.bw.iter_mut().enumerate() {
            let addr = SocketAddr::from((b_ip, sweep_port(base, i)));
            let (c, s) = connect(&a, &b, addr, w.size * DEPTH * 2)?;
            let meter = progress::start("bulk", test, Some(w.size));
            let res = rdma_bw(&c, &s, read, w.size, o.duration);
            meter.finish();
            let res = res.map_err(|e| stage(test, &c, &s, e))?;
            if read {
                (w.read_bw_gbps, w.read_bw_cpu_s_per_gb) = res;
            } else {
                (w.write_bw_gbps, w.write_bw_cpu_s_per_gb) = res;
            }
        }
    }
    let lat_len = BULK * DEPTH * 2;
    if o.runs("write_lat") {
        let (c, s) = connect(&a, &b, SocketAddr::from((b_ip, 4793)), lat_len)?;
        let lat =
            write_lat(&c, &s, o.small, o.duration).map_err(|e| stage("write_lat", &c, &s, e))?;
        (r.write_lat_us, r.write_lat_samples) = p50_half_us(&lat);
    }
    if o.runs("send_lat") {
        let (c, s) = connect(&a, &b, SocketAddr::from((b_ip, 4794)), lat_len)?;
        let lat =
            send_lat(&c, &s, o.small, o.duration).map_err(|e| stage("send_lat", &c, &s, e))?;
        (r.send_lat_us, r.send_lat_samples) = p50_half_us(&lat);
    }
    // Per-engine counters on stderr: frames dropped anywhere on the AF_XDP path mean
    // TCP recovery (and stalls) inside the measurements.
    for (name, ctx) in [("A", a), ("B", b)] {
        let eng = ctx.engine_stats();
        let nic = ctx.stop()?.stats();
        eprintln!(
            "engine {name}: {} iterations ({} busy), {} sleeps, wakeups doorbell {} nic {} \
             timeout {}; nic rx {} tx {} frames, {} dropped",
            eng.iterations,
            eng.busy_iterations,
            eng.sleeps,
            eng.wakeups_doorbell,
            eng.wakeups_backend,
            eng.wakeups_timeout,
            nic.rx_frames,
            nic.tx_frames,
            nic.dropped
        );
    }
    Ok(r)
}

/// The `afxdp-ceiling` of `xwarp bench tcp` on this run's veth pair (its own AF_XDP sockets,
/// detached again before the engines start): received Gbit/s.
fn ceiling(net: &VethPair, o: &Options, a_ip: Ipv4Addr, b_ip: Ipv4Addr) -> io::Result<f64> {
    use super::ceiling::{run, Settings, Side};
    let side = |ns, ifname, ip, n| Side {
        ns,
        ifname,
        ip,
        core: core_of(n),
    };
    let out = run(
        &side(&net.a, &net.if_a, a_ip, 0),
        &side(&net.b, &net.if_b, b_ip, 1),
        &Settings {
            mtu: o.mtu,
            mode: o.xdp_mode,
            duration: o.duration,
        },
    )?;
    let r = out.received;
    Ok(r.bytes as f64 * 8.0 / r.elapsed.as_secs_f64().max(1e-9) / 1e9)
}

/// The engines' idle policy. Each engine shares a core with application threads (two
/// engines and two ping-pong threads on two cores), so an engine that busy-spins while
/// idle keeps the thread it serves off the core: with the default 50 µs busy spin every
/// hand-over (application -> engine -> wire -> engine -> application) waited out a spin
/// budget, ~125-140 µs half round trip. An engine that yields while idle (as the
/// waiters do) hands over with a context switch instead: ~15-20 µs. (With waiters that
/// busy-spin, a yielding engine would lose a whole scheduler slice per yield; sleeping at
/// once, `--spin-us 0`, is the better choice there.)
///
/// The budget is 2 ms rather than `SpinBudget::SHARED_CORES`' 50 µs: the receiving engine
/// of a bulk test idles in gaps of tens of µs while the sender refills its send buffer,
/// and each time it fell asleep the sender's next frame had to wake it (an IPI from inside
/// the sender's `sendto`, on the bottleneck core): ~2.5% of that core went to
/// `sock_def_readable` at MTU 60000. Yielding costs the core's other thread nothing.
fn engine_spin(o: &Options) -> SpinBudget {
    o.spin.unwrap_or(ENGINE_SPIN)
}

/// Default engine idle policy of `xwarp bench rdma` (see [`engine_spin`]).
const ENGINE_SPIN: SpinBudget = SpinBudget::Yield(Duration::from_millis(2));

pub(super) fn spin_name(o: &Options) -> String {
    match engine_spin(o) {
        SpinBudget::Iterations(n) => format!("{n} iterations"),
        SpinBudget::Duration(d) => format!("{} us", d.as_micros()),
        SpinBudget::Forever => "forever".into(),
        SpinBudget::Yield(d) => format!("yield {} us", d.as_micros()),
    }
}

pub(super) fn csum_name(o: &Options) -> &'static str {
    match o.rx_checksum {
        RxChecksum::TrustL4 => "trust-l4",
        RxChecksum::Verify => "verify",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xwarp::poll_driver::afxdp::XdpMode;

    #[test]
    fn process_cpu_counts_this_process() {
        let t0 = process_cpu();
        let start = Instant::now();
        let mut x = 0u64;
        while process_cpu() < t0 + Duration::from_millis(30) && start.elapsed() < WAIT {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        assert!(process_cpu() >= t0 + Duration::from_millis(30), "{x}");
    }

    #[test]
    fn bw_pattern_differs_between_slots_and_sides() {
        // A message placed in the wrong slot, or a Read answered from the wrong side's
        // buffer, must not compare equal.
        let slot = |side, k: usize| {
            (0..BULK)
                .map(|i| bw_pattern(side, k * BULK + i))
                .collect::<Vec<_>>()
        };
        let first = slot(1, 0);
        for k in 1..DEPTH * 2 {
            assert_ne!(slot(1, k), first, "slot {k}");
        }
        assert_ne!(slot(2, 0), first);
    }

    #[test]
    fn parse_rejects_bad_values_and_accepts_good_ones() {
        let a = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(parse(&a(&["--duration", "0"])).is_err());
        assert!(parse(&a(&["--small", "0"])).is_err());
        assert!(parse(&a(&["--bogus", "1"])).is_err());
        assert!(parse(&a(&["--small"])).is_err());
        assert!(parse(&a(&["--pin", "split"])).is_err());
        assert!(parse(&a(&["--help"])).unwrap().is_none());
        let o = parse(&a(&[
            "--duration",
            "0.5",
            "--small",
            "8",
            "--net",
            "91",
            "--pin",
            "none",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (o.duration, o.small, o.net, o.pin),
            (Duration::from_millis(500), 8, 91, Pin::None)
        );
        assert_eq!(Options::default().pin, Pin::Apart);
        let o = parse(&a(&["--pin", "sides"])).unwrap().unwrap();
        assert_eq!(o.pin, Pin::Sides);
        assert!(parse(&a(&["--pin", "everywhere"])).is_err());
        assert_eq!(engine_spin(&o), SpinBudget::Yield(Duration::from_millis(2)));
        let o = parse(&a(&["--spin-us", "0"])).unwrap().unwrap();
        assert_eq!(engine_spin(&o), SpinBudget::Duration(Duration::ZERO));
        assert!(parse(&a(&["--spin-us", "yieldx"])).is_err());
        assert!(parse(&a(&["--only", "write_bw,bogus"])).is_err());
        let o = parse(&a(&["--spin-us", "yield20", "--only", "write_bw,tcp"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            engine_spin(&o),
            SpinBudget::Yield(Duration::from_micros(20))
        );
        assert!(o.runs("write_bw") && o.runs("tcp") && !o.runs("read_bw"));
        assert!(parse(&a(&["--xdp-mode", "zerocopy"])).is_err());
        assert!(parse(&a(&["--rx-checksum", "maybe"])).is_err());
        let o = parse(&a(&["--xdp-mode", "native", "--rx-checksum", "verify"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (o.xdp_mode, o.rx_checksum),
            (XdpMode::Native, RxChecksum::Verify)
        );
        let d = Options::default();
        assert_eq!(
            (d.xdp_mode, d.rx_checksum),
            (XdpMode::Generic, RxChecksum::TrustL4)
        );
        let o = parse(&a(&[
            "--sizes", "4K,64K", "--json", "-", "--plot", "p.svg", "--quiet",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((&o.sizes[..], o.quiet), (&[4096, 65536][..], true));
        assert_eq!(o.json.as_deref(), Some(std::path::Path::new("-")));
        assert!(parse(&a(&["--sizes", "2M"])).is_err());
        assert!(parse(&a(&["--sizes", "1,x"])).is_err());
        assert_eq!(Options::default().sizes, vec![BULK]);
        assert_eq!((sweep_port(4791, 0), sweep_port(4791, 2)), (4791, 4831));
        let (p50, half) = p50_half_us(&[Duration::from_micros(10), Duration::from_micros(30)]);
        assert_eq!((p50, half), (15.0, vec![5.0, 15.0]));
        assert!(p50_half_us(&[]).0.is_nan());
        let o = parse(&a(&[])).unwrap().unwrap();
        assert_eq!(engine_spin(&o), SpinBudget::Yield(Duration::from_millis(2)));
        assert!(TESTS.iter().all(|t| o.runs(t)));
        assert!(!o.asked_for("ib_write_bw"));
        assert_eq!(o.perftest_iters, 5000);
        assert!(parse(&a(&["--perftest-iters", "5"])).is_err());
        assert!(parse(&a(&["--perftest-iters", "many"])).is_err());
        let o = parse(&a(&[
            "--only",
            "ib_write_bw,write_bw",
            "--perftest-iters",
            "300",
            "--preload",
            "/x/p.so",
            "--rdma-lib",
            "/x/i.so",
        ]))
        .unwrap()
        .unwrap();
        assert!(o.asked_for("ib_write_bw") && !o.runs("ib_send_lat") && !o.asked_for("write_lat"));
        assert_eq!(o.perftest_iters, 300);
        assert_eq!(
            (o.preload.as_deref(), o.rdma_lib.as_deref()),
            (
                Some(std::path::Path::new("/x/p.so")),
                Some(std::path::Path::new("/x/i.so"))
            )
        );
    }
}
