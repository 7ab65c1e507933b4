//! perftest-style RDMA benchmarks over `xwarp::verbs` (the `write_bw`, `write_lat`,
//! `read_bw`, `read_lat`, `send_bw`, `send_lat` examples call [`main`]).
//!
//! Options follow perftest: `-s SIZE`, `-n ITERATIONS`, `-D SECONDS`, `-q QPS`,
//! `-t TX_DEPTH`, `-p PORT`, `[host]` for the client. `--vwire` runs both ends in one
//! process over the virtual wire (`--loss P` adds loss, reordering and duplication);
//! `--veth` runs both ends in one process on two AF_XDP verbs engines over a veth pair
//! between two network namespaces it creates (root; [`run_veth`]).
//! Send tests use a credit scheme (iWARP has no RNR retry): the receiver grants credits
//! for the receives it re-posted, the sender never has more Sends in flight than
//! credits.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::vwire::{LinkConfig, WireConfig};

use super::{
    vwire_pair, Access, CmEvent, CompletionQueue, CompletionStatus, ConnectParams, Context,
    MemoryRegion, QpInitAttr, QueuePair, SendRequest, Stag, WorkCompletion,
};
use crate::net::PairConfig;

/// Which test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA Write bandwidth.
    WriteBw,
    /// RDMA Write latency (ping-pong, polling memory).
    WriteLat,
    /// RDMA Read bandwidth.
    ReadBw,
    /// RDMA Read latency.
    ReadLat,
    /// Send bandwidth (with credits).
    SendBw,
    /// Send latency (ping-pong).
    SendLat,
}

impl Test {
    fn title(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::SendBw => "Send BW Test",
            Test::SendLat => "Send Latency Test",
        }
    }

    fn is_bw(self) -> bool {
        matches!(self, Test::WriteBw | Test::ReadBw | Test::SendBw)
    }
}

/// Parsed options.
#[derive(Debug, Clone)]
pub struct Opts {
    /// Message size (`-s`).
    pub size: usize,
    /// Iterations per QP (`-n`).
    pub iters: u64,
    /// Run for this long instead (`-D`).
    pub duration: Option<Duration>,
    /// Queue pairs (`-q`).
    pub qps: usize,
    /// Send queue depth (`-t`).
    pub tx_depth: usize,
    /// TCP port (`-p`).
    pub port: u16,
    /// Peer host (client mode).
    pub host: Option<String>,
    /// Both ends in-process over the virtual wire.
    pub vwire: bool,
    /// Virtual wire loss/reorder/duplicate probability.
    pub loss: f64,
    /// Both ends in-process on AF_XDP engines over a veth pair (root).
    pub veth: bool,
}

const USAGE: &str = "usage: TEST [-s SIZE] [-n ITERS] [-D SECONDS] [-q QPS] [-t TX_DEPTH] [-p PORT] [--vwire [--loss P] | --veth] [host]

  -s SIZE      message size in bytes (default 65536 for bandwidth, 2 for latency)
  -n ITERS     iterations per QP (default 5000 for bandwidth, 1000 for latency)
  -D SECONDS   run for this long instead of -n
  -q QPS       queue pairs (bandwidth tests; default 1)
  -t DEPTH     send queue depth (default 128)
  -p PORT      TCP port (default 18515)
  --vwire      both ends in this process over the in-process virtual wire
  --loss P     with --vwire: drop/reorder/duplicate probability per frame
  --veth       both ends in this process on AF_XDP engines over a veth pair between two
               network namespaces (root; MPA CRC off as with --vwire)";

/// Parse perftest-style arguments (without the program name).
pub fn parse(test: Test, args: Vec<OsString>) -> Result<Opts, String> {
    let mut o = Opts {
        size: if test.is_bw() { 65536 } else { 2 },
        iters: if test.is_bw() { 5000 } else { 1000 },
        duration: None,
        qps: 1,
        tx_depth: 128,
        port: 18515,
        host: None,
        vwire: false,
        loss: 0.0,
        veth: false,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let a = a.to_str().ok_or("arguments must be UTF-8")?.to_owned();
        let mut val = |name: &str| -> Result<String, String> {
            it.next()
                .and_then(|v| v.to_str().map(str::to_owned))
                .ok_or(format!("{name} needs a value"))
        };
        let num = |s: String, name: &str| -> Result<u64, String> {
            s.parse::<u64>()
                .map_err(|_| format!("{name}: not a number"))
        };
        match a.as_str() {
            "-s" | "--size" => o.size = num(val("-s")?, "-s")? as usize,
            "-n" | "--iters" => o.iters = num(val("-n")?, "-n")?.max(1),
            "-D" | "--duration" => {
                o.duration = Some(Duration::from_secs(num(val("-D")?, "-D")?.max(1)))
            }
            "-q" | "--qp" => o.qps = (num(val("-q")?, "-q")? as usize).clamp(1, 256),
            "-t" | "--tx-depth" => o.tx_depth = (num(val("-t")?, "-t")? as usize).clamp(1, 4096),
            "-p" | "--port" => {
                o.port = u16::try_from(num(val("-p")?, "-p")?).map_err(|_| "-p: bad port")?
            }
            "--vwire" => o.vwire = true,
            "--veth" => o.veth = true,
            "--loss" => {
                o.loss = val("--loss")?
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=0.1).contains(p))
                    .ok_or("--loss: a probability up to 0.1")?
            }
            "-h" | "--help" => return Err(String::new()),
            s if !s.starts_with('-') && o.host.is_none() => o.host = Some(s.to_owned()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.size == 0 || o.size > (1 << 30) {
        return Err("-s must be 1..=1 GiB".into());
    }
    if !test.is_bw() {
        o.qps = 1;
    }
    if o.vwire && o.veth {
        return Err("--vwire and --veth exclude each other".into());
    }
    Ok(o)
}

/// Entry point of the example binaries.
pub fn main(test: Test) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let o = match parse(test, args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if !o.vwire && !o.veth {
        eprintln!(
            "only --vwire or --veth (both ends in this process) are available; a separate \
             client and server process are not implemented"
        );
        return ExitCode::from(2);
    }
    let r = if o.veth {
        run_veth(test, &o)
    } else {
        run_vwire(test, &o)
    };
    match r {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", test.title());
            ExitCode::FAILURE
        }
    }
}

fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

struct Side {
    qps: Vec<QueuePair>,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    buf: MemoryRegion,
    ctrl: MemoryRegion,
}

const SLOT: usize = 64;

/// Connect `qps` QPs between the two engines; returns (client, server, remote buf
/// (addr, rkey) of each side as seen by the other).
fn setup<B: Backend + Send + 'static>(
    a: &Context<B>,
    b: &Context<B>,
    server: Ipv4Addr,
    o: &Opts,
    buf_len: usize,
) -> Result<(Side, Side), String> {
    let addr: SocketAddr = SocketAddr::from((server, o.port));
    let listener = b.device().listen(addr, o.qps.max(1)).map_err(e2s)?;
    let mk = |ctx: &Context<B>| -> Result<Side, String> {
        let dev = ctx.device();
        let pd = dev.alloc_pd();
        let scq = dev.create_cq(4096).map_err(e2s)?;
        let rcq = dev.create_cq(4096).map_err(e2s)?;
        let acc = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let buf = pd.alloc_mr(buf_len, acc, true).map_err(e2s)?;
        let ctrl = pd.alloc_mr(SLOT * 1024 * o.qps, acc, false).map_err(e2s)?;
        let mut qps = Vec::new();
        for _ in 0..o.qps {
            let mut at = QpInitAttr::new(&scq, &rcq);
            at.max_send_wr = o.tx_depth.max(8) + 16;
            at.max_recv_wr = 1024;
            at.max_inline_data = 256;
            qps.push(pd.create_qp(&at).map_err(e2s)?);
        }
        Ok(Side {
            qps,
            scq,
            rcq,
            buf,
            ctrl,
        })
    };
    let client = mk(a)?;
    let server = mk(b)?;
    for (i, q) in client.qps.iter().enumerate() {
        q.connect(
            addr,
            ConnectParams {
                private_data: (i as u32).to_be_bytes().to_vec(),
                timeout: Duration::from_secs(10),
            },
        )
        .map_err(e2s)?;
    }
    for _ in 0..o.qps {
        let req = listener.get_request(Duration::from_secs(10)).map_err(e2s)?;
        let i = req
            .private_data
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .ok_or("bad private data")? as usize;
        let qp = server.qps.get(i).ok_or("bad QP index")?;
        req.accept(qp, &[]).map_err(e2s)?;
    }
    for q in client.qps.iter().chain(server.qps.iter()) {
        match q.next_event(Duration::from_secs(10)).map_err(e2s)? {
            CmEvent::Established { .. } => {}
            e => return Err(format!("connect: {e:?}")),
        }
    }
    Ok((client, server))
}

fn check(wc: &WorkCompletion) -> Result<(), String> {
    if wc.status != CompletionStatus::Success {
        return Err(format!("completion failed: {wc:?}"));
    }
    Ok(())
}

fn header(test: Test, o: &Opts, extra: &str) -> String {
    let line = "-".repeat(87);
    let transport = if o.veth {
        "AF_XDP on a veth pair".to_string()
    } else if o.loss > 0.0 {
        format!("in-process virtual wire, loss {}", o.loss)
    } else {
        "in-process virtual wire".to_string()
    };
    format!(
        "{line}\n                    {}\n Number of qps   : {}\t\tTransport type : IW (xwarp, {transport})\n TX depth        : {}\n Mtu             : 1500[B]\n{extra}{line}\n",
        test.title(),
        o.qps,
        o.tx_depth
    )
}

/// Bandwidth samples: (elapsed, cumulative bytes).
struct Bw {
    t0: Instant,
    samples: Vec<(Duration, u64)>,
}

impl Bw {
    fn report(&self, size: usize, msgs: u64) -> (f64, f64, f64, f64) {
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
        let _ = size;
        (peak, avg_mbs, msgs as f64 / secs / 1e6, secs)
    }
}

fn bw_line(o: &Opts, bw: &Bw, msgs: u64) -> String {
    let (peak, avg, mpps, secs) = bw.report(o.size, msgs);
    format!(
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]   BW average[Gb/sec]\n {:<10} {:<14} {:<18.2} {:<20.2} {:<15.6} {:.3}\n (total {} bytes in {:.3} s)\n",
        o.size,
        msgs,
        peak,
        avg,
        mpps,
        avg * 8.0 / 1e3,
        msgs * o.size as u64,
        secs
    )
}

/// Run the test with both ends in this process.
pub fn run_vwire(test: Test, o: &Opts) -> Result<String, String> {
    let link = |seed| LinkConfig {
        drop: o.loss,
        reorder: o.loss,
        duplicate: o.loss,
        ..LinkConfig::seeded(seed)
    };
    // Room for every QP's full TCP window in flight: the wire's queue is a buffer, not
    // a bottleneck to be found by loss.
    let wire = WireConfig {
        a_to_b: link(1),
        b_to_a: link(2),
        queue_depth: (1024 * o.qps).clamp(1024, 1 << 20),
        ..WireConfig::default()
    };
    let (a, b) = vwire_pair(PairConfig {
        wire,
        ..PairConfig::default()
    })
    .map_err(e2s)?;
    run_pair(test, o, &a, &b, Ipv4Addr::new(10, 77, 0, 2))
}

/// Run the test with both ends in this process on two AF_XDP verbs engines over a veth
/// pair between two network namespaces (`10.88.<net>.10` and `.20`, `net` 95; root).
pub fn run_veth(test: Test, o: &Opts) -> Result<String, String> {
    let net = xwarp_poll_driver::netns::VethPair::new(95).map_err(e2s)?;
    let a_ip = Ipv4Addr::new(10, 88, 95, 10);
    let b_ip = Ipv4Addr::new(10, 88, 95, 20);
    let cfg = |ifname: &str, ip, name: &str| {
        let mut c = crate::toe::XdpEngineConfig::new(ifname, ip, 24);
        // Both ends are xwarp engines: every checksum is complete.
        c.rx_checksum = crate::toe::RxChecksum::Verify;
        c.engine.name = name.into();
        c
    };
    let a = Context::start_xdp(Some(&net.a), cfg(&net.if_a, a_ip, "perftest-a")).map_err(e2s)?;
    let b = Context::start_xdp(Some(&net.b), cfg(&net.if_b, b_ip, "perftest-b")).map_err(e2s)?;
    let r = run_pair(test, o, &a, &b, b_ip);
    // The engines stop before the namespaces go away.
    drop((a, b));
    drop(net);
    r
}

/// Run the test between engine `a` (client) and engine `b` (server at `server`).
fn run_pair<B: Backend + Send + 'static>(
    test: Test,
    o: &Opts,
    a: &Context<B>,
    b: &Context<B>,
    server: Ipv4Addr,
) -> Result<String, String> {
    let ring = if test.is_bw() {
        (o.size * o.tx_depth.min(64)).clamp(o.size, 64 << 20)
    } else {
        // Latency tests: the sink at [0, size), a separate source at [size, 2 size).
        2 * o.size
    };
    let (c, s) = setup(a, b, server, o, ring.max(o.size))?;
    let out = match test {
        Test::WriteBw | Test::ReadBw => rdma_bw(test, o, &c, &s)?,
        Test::SendBw => send_bw(o, &c, &s)?,
        Test::WriteLat => write_lat(o, &c, &s)?,
        Test::ReadLat => read_lat(o, &c, &s)?,
        Test::SendLat => send_lat(o, &c, &s)?,
    };
    for q in &c.qps {
        let _ = q.disconnect();
    }
    Ok(format!("{}{}", header(test, o, ""), out))
}

fn wr_id(qp: usize, seq: u64) -> u64 {
    (qp as u64) << 40 | seq
}

fn stop(o: &Opts, t0: Instant, posted: u64) -> bool {
    match o.duration {
        Some(d) => t0.elapsed() >= d,
        None => posted >= o.iters,
    }
}

fn rdma_bw(test: Test, o: &Opts, c: &Side, s: &Side) -> Result<String, String> {
    let read = test == Test::ReadBw;
    let depth = if read { o.tx_depth.min(16) } else { o.tx_depth };
    // In duration mode the last request is not known in advance: signal every one.
    let cq_mod = if o.duration.is_some() {
        1
    } else {
        (depth / 4).clamp(1, 16) as u64
    };
    let slots = (s.buf.len() / o.size).max(1);
    let nq = c.qps.len();
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let mut finished = vec![false; nq];
    let t0 = Instant::now();
    let mut bw = Bw {
        t0,
        samples: Vec::new(),
    };
    let mut total_done = 0u64;
    let mut wcs = Vec::with_capacity(64);
    loop {
        for (i, qp) in c.qps.iter().enumerate() {
            if stop(o, t0, posted[i]) && done[i] >= posted[i] {
                finished[i] = true;
            }
            if finished[i] {
                continue;
            }
            while posted[i] - done[i] < depth as u64 && !stop(o, t0, posted[i]) {
                let seq = posted[i];
                let off = (seq as usize % slots) * o.size;
                let last = o.duration.is_none() && seq + 1 == o.iters;
                let mut wr = if read {
                    SendRequest::read(
                        wr_id(i, seq),
                        c.buf.sge(off, o.size).ok_or("sge")?,
                        s.buf.rkey(),
                        s.buf.addr() + off as u64,
                    )
                } else {
                    SendRequest::write(
                        wr_id(i, seq),
                        vec![c.buf.sge(off, o.size).ok_or("sge")?],
                        s.buf.rkey(),
                        s.buf.addr() + off as u64,
                    )
                };
                wr.signaled = (seq + 1) % cq_mod == 0 || last;
                qp.post_send(wr).map_err(|e| format!("post: {e:?}"))?;
                posted[i] += 1;
            }
        }
        wcs.clear();
        if c.scq.poll(&mut wcs, 64) == 0 {
            if finished.iter().all(|f| *f) {
                break;
            }
            let wc = c
                .scq
                .next(Duration::from_secs(10))
                .map_err(|e| format!("{e} (posted {posted:?}, completed {done:?})"))?;
            wcs.push(wc);
        }
        for wc in &wcs {
            check(wc)?;
            let i = (wc.wr_id >> 40) as usize;
            let seq = wc.wr_id & ((1 << 40) - 1);
            let before = done[i];
            done[i] = done[i].max(seq + 1);
            total_done += done[i] - before;
        }
        bw.samples
            .push((bw.t0.elapsed(), total_done * o.size as u64));
        if finished.iter().all(|f| *f) {
            break;
        }
    }
    Ok(bw_line(o, &bw, total_done))
}

fn send_bw(o: &Opts, c: &Side, s: &Side) -> Result<String, String> {
    const RX: u64 = 256;
    const GRANT: u64 = 32;
    let nq = c.qps.len();
    let slots = (s.buf.len() / o.size).max(1);
    let published: Arc<Vec<AtomicU64>> =
        Arc::new((0..nq).map(|_| AtomicU64::new(u64::MAX)).collect());
    let abort = Arc::new(AtomicBool::new(false));
    // In duration mode the last Send is not known in advance: signal every one.
    let cq_mod = if o.duration.is_some() { 1 } else { 16u64 };
    // Before the client may send (no RNR retry in iWARP).
    // Receives: RX per QP, re-posted as they complete; a credit Send per GRANT.
    for (i, qp) in s.qps.iter().enumerate() {
        for k in 0..RX {
            let off = ((i as u64 * RX + k) as usize % slots) * o.size;
            qp.post_recv(wr_id(i, k), &[s.buf.sge(off, o.size).ok_or("sge")?])
                .map_err(|e| format!("{e:?}"))?;
        }
    }
    std::thread::scope(|sc| -> Result<String, String> {
        let pubs = published.clone();
        let ab = abort.clone();
        let server = sc.spawn(move || -> Result<(), String> {
            let mut got = vec![0u64; nq];
            let mut granted = vec![0u64; nq];
            let mut sends = 0u64;
            loop {
                if ab.load(Ordering::Relaxed) {
                    return Ok(());
                }
                if (0..nq).all(|i| pubs[i].load(Ordering::Acquire) == got[i]) {
                    return Ok(());
                }
                let wc = match s.rcq.next(Duration::from_millis(200)) {
                    Ok(w) => w,
                    Err(_) => continue,
                };
                check(&wc)?;
                let i = (wc.wr_id >> 40) as usize;
                let k = wc.wr_id & ((1 << 40) - 1);
                got[i] += 1;
                let off = ((i as u64 * RX + k % RX) as usize % slots) * o.size;
                s.qps[i]
                    .post_recv(wc.wr_id, &[s.buf.sge(off, o.size).ok_or("sge")?])
                    .map_err(|e| format!("{e:?}"))?;
                if got[i] - granted[i] >= GRANT {
                    let n = got[i] - granted[i];
                    granted[i] = got[i];
                    sends += 1;
                    let mut wr = SendRequest {
                        inline: Some(n.to_be_bytes().to_vec()),
                        ..SendRequest::send(sends, vec![])
                    };
                    wr.signaled = sends % 16 == 0;
                    s.qps[i].post_send(wr).map_err(|e| format!("{e:?}"))?;
                    while let Some(w) = s.scq.poll_one() {
                        check(&w)?;
                    }
                }
            }
        });
        let result = (|| -> Result<String, String> {
            // Credit receives at the client.
            for (i, qp) in c.qps.iter().enumerate() {
                for k in 0..64u64 {
                    qp.post_recv(
                        wr_id(i, k),
                        &[c.ctrl.sge((i * 64 + k as usize) * 16, 16).ok_or("sge")?],
                    )
                    .map_err(|e| format!("{e:?}"))?;
                }
            }
            let mut credits = vec![RX; nq];
            let mut posted = vec![0u64; nq];
            let mut done = vec![0u64; nq];
            let t0 = Instant::now();
            let mut bw = Bw {
                t0,
                samples: Vec::new(),
            };
            let mut total = 0u64;
            let mut wcs = Vec::new();
            loop {
                let mut all_stopped = true;
                for (i, qp) in c.qps.iter().enumerate() {
                    while credits[i] > 0
                        && posted[i] - done[i] < o.tx_depth as u64
                        && !stop(o, t0, posted[i])
                    {
                        let seq = posted[i];
                        let off = (seq as usize % slots) * o.size;
                        let mut wr = SendRequest::send(
                            wr_id(i, seq),
                            vec![c.buf.sge(off, o.size).ok_or("sge")?],
                        );
                        let last = o.duration.is_none() && seq + 1 == o.iters;
                        wr.signaled = (seq + 1) % cq_mod == 0 || last;
                        qp.post_send(wr).map_err(|e| format!("{e:?}"))?;
                        posted[i] += 1;
                        credits[i] -= 1;
                    }
                    if !stop(o, t0, posted[i]) || done[i] < posted[i] {
                        all_stopped = false;
                    }
                }
                wcs.clear();
                c.scq.poll(&mut wcs, 64);
                for wc in &wcs {
                    check(wc)?;
                    let i = (wc.wr_id >> 40) as usize;
                    let seq = wc.wr_id & ((1 << 40) - 1);
                    let before = done[i];
                    done[i] = done[i].max(seq + 1);
                    total += done[i] - before;
                }
                while let Some(wc) = c.rcq.poll_one() {
                    check(&wc)?;
                    let i = (wc.wr_id >> 40) as usize;
                    let k = (wc.wr_id & ((1 << 40) - 1)) as usize;
                    let mut n = [0u8; 8];
                    c.ctrl.read((i * 64 + k) * 16, &mut n).map_err(e2s)?;
                    credits[i] += u64::from_be_bytes(n);
                    c.qps[i]
                        .post_recv(wc.wr_id, &[c.ctrl.sge((i * 64 + k) * 16, 16).ok_or("sge")?])
                        .map_err(|e| format!("{e:?}"))?;
                }
                bw.samples.push((bw.t0.elapsed(), total * o.size as u64));
                if all_stopped {
                    for i in 0..nq {
                        published[i].store(posted[i], Ordering::Release);
                    }
                    break;
                }
                if wcs.is_empty() {
                    std::hint::spin_loop();
                }
            }
            Ok(bw_line(o, &bw, total))
        })();
        if result.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        let srv = server.join().map_err(|_| "server panicked".to_string())?;
        let r = result?;
        srv?;
        Ok(r)
    })
}

struct Lat {
    h: Histogram<u64>,
}

impl Lat {
    fn new() -> Result<Lat, String> {
        Ok(Lat {
            h: Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(e2s)?,
        })
    }

    fn add(&mut self, d: Duration) {
        let _ = self.h.record((d.as_nanos() as u64).max(1));
    }

    fn line(&self, o: &Opts, halve: bool) -> String {
        let us = |v: u64| v as f64 / 1e3 / if halve { 2.0 } else { 1.0 };
        format!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]\n {:<6} {:<14} {:<14.2} {:<12.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}\n{}",
            o.size,
            self.h.len(),
            us(self.h.min()),
            us(self.h.max()),
            us(self.h.value_at_quantile(0.5)),
            self.h.mean() / 1e3 / if halve { 2.0 } else { 1.0 },
            self.h.stdev() / 1e3 / if halve { 2.0 } else { 1.0 },
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

fn lat_iters(o: &Opts, t0: Instant, i: u64) -> bool {
    match o.duration {
        Some(d) => t0.elapsed() < d,
        None => i < o.iters,
    }
}

fn send_lat(o: &Opts, c: &Side, s: &Side) -> Result<String, String> {
    let (cq, sq) = (&c.qps[0], &s.qps[0]);
    let inline = o.size <= 256;
    let done = AtomicBool::new(false);
    let mut lat = Lat::new()?;
    // The server's first receive is posted before the client may send (a Send without
    // a posted receive is a protocol error in iWARP: there is no RNR retry).
    sq.post_recv(0, &[s.buf.sge(0, o.size).ok_or("sge")?])
        .map_err(|e| format!("{e:?}"))?;
    std::thread::scope(|sc| -> Result<(), String> {
        let server = sc.spawn(|| -> Result<(), String> {
            let mut n = 0u64;
            let mut payload = vec![0u8; o.size];
            loop {
                let wc = loop {
                    if done.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    if let Some(w) = s.rcq.poll_one() {
                        break w;
                    }
                    std::hint::spin_loop();
                };
                check(&wc)?;
                sq.post_recv(0, &[s.buf.sge(0, o.size).ok_or("sge")?])
                    .map_err(|e| format!("{e:?}"))?;
                n += 1;
                let mut wr = if inline {
                    s.buf.read(0, &mut payload).map_err(e2s)?;
                    SendRequest {
                        inline: Some(payload.clone()),
                        ..SendRequest::send(n, vec![])
                    }
                } else {
                    SendRequest::send(n, vec![s.buf.sge(0, o.size).ok_or("sge")?])
                };
                wr.signaled = n % 16 == 0;
                sq.post_send(wr).map_err(|e| format!("{e:?}"))?;
                while let Some(w) = s.scq.poll_one() {
                    check(&w)?;
                }
            }
        });
        let r = (|| -> Result<(), String> {
            let t0 = Instant::now();
            let mut i = 0u64;
            let data = vec![0x5au8; o.size];
            c.buf.write(0, &data).map_err(e2s)?;
            while lat_iters(o, t0, i) {
                cq.post_recv(0, &[c.ctrl.sge(0, o.size.min(c.ctrl.len())).ok_or("sge")?])
                    .map_err(|e| format!("{e:?}"))?;
                let t = Instant::now();
                let mut wr = if inline {
                    SendRequest {
                        inline: Some(data.clone()),
                        ..SendRequest::send(i, vec![])
                    }
                } else {
                    SendRequest::send(i, vec![c.buf.sge(0, o.size).ok_or("sge")?])
                };
                wr.signaled = (i + 1) % 16 == 0;
                cq.post_send(wr).map_err(|e| format!("{e:?}"))?;
                let wc = loop {
                    if let Some(w) = c.rcq.poll_one() {
                        break w;
                    }
                    if t.elapsed() > Duration::from_secs(10) {
                        return Err("send_lat: no answer".into());
                    }
                    std::hint::spin_loop();
                };
                lat.add(t.elapsed());
                check(&wc)?;
                while let Some(w) = c.scq.poll_one() {
                    check(&w)?;
                }
                i += 1;
            }
            Ok(())
        })();
        done.store(true, Ordering::Relaxed);
        let srv = server.join().map_err(|_| "server panicked".to_string())?;
        r?;
        srv
    })?;
    if o.size > c.ctrl.len() {
        return Err("send_lat: size above the receive buffer".into());
    }
    Ok(lat.line(o, true))
}

fn write_lat(o: &Opts, c: &Side, s: &Side) -> Result<String, String> {
    // Each side Writes from its source half into the peer's sink half and polls the
    // last byte of its own sink half for the iteration mark (1..=255, never repeated
    // back to back), as perftest does. Source and sink never overlap, so no buffer is
    // written while a Write reads it.
    let (cq, sq) = (&c.qps[0], &s.qps[0]);
    let size = o.size;
    let last = size - 1;
    let done = AtomicBool::new(false);
    let mut lat = Lat::new()?;
    let (crkey, caddr) = (c.buf.rkey(), c.buf.addr());
    let (srkey, saddr) = (s.buf.rkey(), s.buf.addr());
    std::thread::scope(|sc| -> Result<(), String> {
        let server = sc.spawn(|| -> Result<(), String> {
            let mut n = 0u64;
            loop {
                let mark = (n % 255 + 1) as u8;
                loop {
                    if done.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    if s.buf.poll_byte(last) == Some(mark) {
                        break;
                    }
                    std::hint::spin_loop();
                }
                s.buf.write(size + last, &[mark]).map_err(e2s)?;
                n += 1;
                let mut wr = write_wr(n, &s.buf, size, crkey, caddr);
                wr.signaled = n % 16 == 0;
                sq.post_send(wr).map_err(|e| format!("{e:?}"))?;
                while let Some(w) = s.scq.poll_one() {
                    check(&w)?;
                }
            }
        });
        let r = (|| -> Result<(), String> {
            let t0 = Instant::now();
            let mut i = 0u64;
            while lat_iters(o, t0, i) {
                let mark = (i % 255 + 1) as u8;
                c.buf.write(size + last, &[mark]).map_err(e2s)?;
                let t = Instant::now();
                let mut wr = write_wr(i, &c.buf, size, srkey, saddr);
                wr.signaled = (i + 1) % 16 == 0;
                cq.post_send(wr).map_err(|e| format!("{e:?}"))?;
                loop {
                    if c.buf.poll_byte(last) == Some(mark) {
                        break;
                    }
                    if t.elapsed() > Duration::from_secs(10) {
                        return Err("write_lat: no answer".into());
                    }
                    std::hint::spin_loop();
                }
                lat.add(t.elapsed());
                while let Some(w) = c.scq.poll_one() {
                    check(&w)?;
                }
                i += 1;
            }
            Ok(())
        })();
        done.store(true, Ordering::Relaxed);
        let srv = server.join().map_err(|_| "server panicked".to_string())?;
        r?;
        srv
    })?;
    Ok(lat.line(o, true))
}

/// A Write of the source half `[size, 2 size)` of `mr` to the peer's sink half.
fn write_wr(id: u64, mr: &MemoryRegion, size: usize, rkey: Stag, addr: u64) -> SendRequest {
    match mr.sge(size, size) {
        Some(sge) => SendRequest::write(id, vec![sge], rkey, addr),
        None => SendRequest::write(id, vec![], rkey, addr),
    }
}

fn read_lat(o: &Opts, c: &Side, s: &Side) -> Result<String, String> {
    let qp = &c.qps[0];
    let mut lat = Lat::new()?;
    let t0 = Instant::now();
    let mut i = 0u64;
    while lat_iters(o, t0, i) {
        let t = Instant::now();
        qp.post_send(SendRequest::read(
            i,
            c.buf.sge(0, o.size).ok_or("sge")?,
            s.buf.rkey(),
            s.buf.addr(),
        ))
        .map_err(|e| format!("{e:?}"))?;
        let wc = loop {
            if let Some(w) = c.scq.poll_one() {
                break w;
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err("read_lat: no completion".into());
            }
            std::hint::spin_loop();
        };
        lat.add(t.elapsed());
        check(&wc)?;
        i += 1;
    }
    Ok(lat.line(o, false))
}
