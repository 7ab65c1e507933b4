//! rping — rdma-core's `rping` (librdmacm/examples/rping.c) on the xwarp iWARP stack.
//!
//! Same command line and the same wire behaviour (docs/protocols.md §5.2), so it interoperates
//! with rdma-core `rping` on a kernel soft-iWARP (siw) peer in either role:
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port] [-P] [-q]  --iface IF --addr A/P
//! rping -c [-vVd] [-S size] [-C count]  -a addr  [-p port]            --iface IF --addr A/P
//! ```
//!
//! One iteration: the client Sends `{start_buf VA, rkey, size}` (16 bytes, big-endian);
//! the server RDMA-Reads `size` bytes of the client's start buffer, Sends 16 zero bytes
//! ("go ahead"); the client Sends `{rdma_buf VA, rkey, size}`; the server RDMA-Writes its
//! buffer into the client's and Sends again. `-V` compares the client's two buffers.
//!
//! Layering: the product path, [`xwarp::verbs`]: a verbs [`Context`] whose engine is bound
//! with AF_XDP to `--iface` and owns `--addr` (without the flags the variable
//! `XWARP_ENGINE=xdp:IFACE:ADDR/PREFIX` names them; capture with `XWARP_PCAP=/path`).
//! The engine thread runs TCP, MPA, DDP and RDMAP and places inbound Reads' responses and
//! Writes straight into the registered regions; this thread only posts work requests,
//! polls the completion queue and reads the connection's CM events, like rping does with
//! libibverbs.
//!
//! Memory: every buffer is a [`MemoryRegion`] of the protection domain; its address
//! ([`MemoryRegion::addr`]) is the tagged offset advertised to the peer, as rping
//! advertises the virtual address `ibv_reg_mr` registered (docs/ddp-rdmap.md §3.6).
//!
//! Interop switches of the client (the siw interop cases `xwarp_p2p`, `xwarp_errors`):
//! `--p2p TYPES` offers MPA v2 peer-to-peer mode with those RTR types
//! (`ConnectTuning::p2p_rtr_offer`), `--bad-stag` Writes to an STag the server never
//! advertised and expects its Terminate, `--report` prints `XWARP-*` lines with what was
//! negotiated and how every completion ended.
//!
//! Environment: `XWARP_MPA_CRC=1` makes the client request MPA CRC (the server always
//! accepts CRC when the client asks); `XWARP_FIRST_FPDU_DELAY_MS` (default 100) is how long
//! the client waits after the MPA Reply before its first FPDU (the siw race of
//! interop/README.md, "Reply-before-upcall race"). `XWARP_CONNECT_RETRY_MS` (default 0,
//! one attempt like rping): how long a refused connect is retried.

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use xwarp::poll_driver::backend::Backend;
use xwarp::verbs::{
    Access, ConnectParams, ConnectTuning, Context, MemoryRegion, RtrSet, SendRequest, Stag,
    WcOpcode, WorkCompletion,
};
use xwarp_tools::support::conn::{start_engine, Conn, WaitError};
use xwarp_tools::support::transport::NetArgs;

/// rping's default port.
const DEFAULT_PORT: u16 = 7174;
/// Size of `struct rping_rdma_info`.
const INFO_LEN: usize = 16;
/// Client: pause between siw's MPA Reply and our first FPDU (XWARP_FIRST_FPDU_DELAY_MS).
const DEFAULT_FIRST_FPDU_DELAY_MS: u64 = 100;
/// TCP handshake plus MPA negotiation.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Parser, Debug)]
#[command(
    name = "xwarp-rping",
    version,
    about = "RDMA ping-pong over xwarp::verbs on an AF_XDP engine (rdma-core rping compatible)",
    disable_version_flag = true
)]
struct Opts {
    /// Server mode.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Client mode.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's bind address (default the engine's), the client's destination.
    #[arg(short = 'a')]
    addr: Option<String>,
    /// Port.
    #[arg(short = 'p', default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Iterations (0 = until interrupted).
    #[arg(short = 'C', default_value_t = 0)]
    count: u64,
    /// Buffer size, 26..=65535.
    #[arg(short = 'S', default_value_t = 64, value_parser = clap::value_parser!(u32).range(26..=65535))]
    size: u32,
    /// Print the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate the ping data (client).
    #[arg(short = 'V')]
    validate: bool,
    /// Debug output.
    #[arg(short = 'd')]
    debug: bool,
    /// Persistent server: accept connections one after another.
    #[arg(short = 'P')]
    persistent: bool,
    /// Server: rping's "self-created QP" mode; on the wire it accepts with explicit
    /// IRD/ORD 1/1 instead of mirroring the client's values.
    #[arg(short = 'q')]
    explicit_ird_ord: bool,
    /// Client: offer MPA v2 peer-to-peer mode with these RTR types (comma-separated:
    /// write, read, send; RFC 6581 §3.2, the server picks one; siw: Write if offered, else
    /// Read, docs/siw.md §4.3). Default: no P2P, like rdma-core's rping on siw.
    #[arg(long, value_name = "TYPES", value_parser = parse_rtr)]
    p2p: Option<RtrSet>,
    /// Client: once connected, RDMA-Write `-S` bytes to an STag the server never
    /// advertised (0xbad0005a) instead of pinging; the server must answer with a
    /// Terminate and close, and our posted receive must come back flushed (docs/siw.md
    /// §4.5/§4.6). Success = that happened.
    #[arg(long, conflicts_with = "server")]
    bad_stag: bool,
    /// Client: print machine-readable lines for the interop cases: `XWARP-NEGOTIATED`
    /// (what MPA negotiated), `XWARP-STATS` (iterations, completions by outcome, the
    /// Terminate received), with --bad-stag `XWARP-TERMINATE` and `XWARP-RECV`.
    #[arg(long)]
    report: bool,
    /// The engine to run on (`--iface IF --addr A/P [--gateway G] [--rx-checksum
    /// verify]`); without these flags `XWARP_ENGINE=xdp:IF:A/P` names it.
    #[command(flatten)]
    net: NetArgs,
    /// Print version.
    #[arg(long, action = clap::ArgAction::Version)]
    version: Option<bool>,
}

// --------------------------------------------------------------------------- rping

/// The STag `--bad-stag` writes to: index 0xbad00, key 0x5a (never registered by siw's
/// rping, whose STags are small indices).
const BAD_STAG: Stag = Stag(0xbad0_005a);

/// `--p2p write,read,send` (any non-empty subset).
fn parse_rtr(s: &str) -> Result<RtrSet, String> {
    let mut set = RtrSet::NONE;
    for t in s.split(',').filter(|t| !t.is_empty()) {
        match t {
            "write" => set.write = true,
            "read" => set.read = true,
            "send" => set.send = true,
            _ => return Err(format!("unknown RTR type {t:?} (write, read, send)")),
        }
    }
    if set == RtrSet::NONE {
        return Err("--p2p needs at least one RTR type".into());
    }
    Ok(set)
}

fn info(buf: u64, rkey: Stag, size: u32) -> [u8; INFO_LEN] {
    let mut b = [0u8; INFO_LEN];
    b[..8].copy_from_slice(&buf.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.0.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

fn parse_info(b: &[u8]) -> (u64, Stag, u32) {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&b[..8]);
    let mut rkey = [0u8; 4];
    rkey.copy_from_slice(&b[8..12]);
    let mut size = [0u8; 4];
    size.copy_from_slice(&b[12..16]);
    (
        u64::from_be_bytes(buf),
        Stag(u32::from_be_bytes(rkey)),
        u32::from_be_bytes(size),
    )
}

/// rping's start buffer: `"rdma-ping-%d: "` then characters cycling from
/// `65 + i % 58` through 122 back to 65, NUL-terminated.
fn pattern(i: u64, size: usize) -> Vec<u8> {
    let mut v = format!("rdma-ping-{i}: ").into_bytes();
    let mut c = 65 + (i % 58) as u8;
    while v.len() < size.saturating_sub(1) {
        v.push(c);
        c += 1;
        if c > 122 {
            c = 65;
        }
    }
    v.truncate(size.saturating_sub(1));
    v.push(0);
    v
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// rping's buffers on one connection: the shared [`Conn`] (CQ, QP, completion
/// bookkeeping) and the 16-byte send and receive buffers.
struct Rconn {
    c: Conn,
    send: MemoryRegion,
    recv: MemoryRegion,
}

fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn post_err(e: xwarp::verbs::PostError) -> String {
    format!("posting a work request: {e:?}")
}

impl Rconn {
    /// rping's single CQ for both queues, its QP (SQ 16, RQ 2, one SGE) with IRD/ORD
    /// `ird`/`ord` and MPA CRC `crc`, and its send and receive buffers.
    fn new<B: Backend + Send + 'static>(
        ctx: &Context<B>,
        pd: &xwarp::verbs::ProtectionDomain,
        ird: u32,
        ord: u32,
        crc: bool,
        debug: bool,
    ) -> Result<Rconn, String> {
        let c = Conn::new(
            ctx,
            pd,
            32,
            |at| {
                at.max_send_wr = 16;
                at.max_recv_wr = 2;
                at.ird = ird;
                at.ord = ord;
                at.mpa.crc = crc;
                // No peer-to-peer RTR: rdma-core's rping on siw asks for none (its Request
                // is `10 02 00 04 00 01 00 01`, docs/protocols.md §5.3), so neither do we;
                // the client's first FPDU is its first Send (`--p2p` offers some anyway).
                at.mpa.p2p_rtr = None;
            },
            debug,
        )?;
        let send = pd
            .alloc_mr(INFO_LEN, Access::LOCAL_WRITE, false)
            .map_err(e2s)?;
        let recv = pd
            .alloc_mr(INFO_LEN, Access::LOCAL_WRITE, false)
            .map_err(e2s)?;
        Ok(Rconn { c, send, recv })
    }

    fn post_recv(&self) -> Result<(), String> {
        let sge = self.recv.sge(0, INFO_LEN).ok_or("receive buffer")?;
        self.c.qp.post_recv(1, &[sge]).map_err(post_err)
    }

    /// Send the 16-byte send buffer.
    fn post_send_buf(&self) -> Result<(), String> {
        let sge = self.send.sge(0, INFO_LEN).ok_or("send buffer")?;
        self.c
            .qp
            .post_send(SendRequest::send(2, vec![sge]))
            .map_err(post_err)
    }

    fn wait(&mut self, op: WcOpcode) -> Result<WorkCompletion, WaitError> {
        self.c.wait(op)
    }

    fn established(&self) -> Result<(), String> {
        self.c
            .established(CONNECT_TIMEOUT + Duration::from_secs(2))
            .map(|_| ())
    }
}

fn check_len(c: &WorkCompletion) -> Result<(), String> {
    if c.byte_len as usize != INFO_LEN {
        return Err(format!("Received bogus data, size {}", c.byte_len));
    }
    Ok(())
}

fn resolve(addr: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(ip) = addr.parse::<Ipv4Addr>() {
        return Ok(SocketAddr::from((ip, port)));
    }
    (addr, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or(format!("{addr} has no IPv4 address"))
}

fn client<B: Backend + Send + 'static>(o: &Opts, ctx: &Context<B>) -> Result<(), String> {
    let addr = resolve(o.addr.as_deref().ok_or("client needs -a address")?, o.port)?;
    let pd = ctx.device().alloc_pd();
    // rping client: responder_resources = initiator_depth = 1 (docs/protocols.md §5.2).
    let crc = std::env::var_os("XWARP_MPA_CRC").is_some_and(|v| v == "1");
    let mut conn = Rconn::new(ctx, &pd, 1, 1, crc, o.debug)?;
    let size = o.size as usize;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let start = pd.alloc_mr(size, rw, false).map_err(e2s)?;
    let rdma = pd.alloc_mr(size, rw, false).map_err(e2s)?;
    conn.post_recv()?;
    // siw quirk (docs/siw.md §4.3): an FPDU right behind siw's Reply can sit unread in its
    // socket, and rping's server then waits forever for our Send.
    let retry = env_ms("XWARP_CONNECT_RETRY_MS", 0);
    conn.c
        .qp
        .connect_tuned(
            addr,
            ConnectParams {
                private_data: Vec::new(),
                timeout: CONNECT_TIMEOUT,
            },
            ConnectTuning {
                first_fpdu_delay: env_ms("XWARP_FIRST_FPDU_DELAY_MS", DEFAULT_FIRST_FPDU_DELAY_MS),
                retry_refused: (!retry.is_zero()).then_some(retry),
                p2p_rtr_offer: o.p2p,
            },
        )
        .map_err(e2s)?;
    conn.established()?;
    if o.report {
        let q = conn.c.qp.query().map_err(e2s)?;
        let n = q.negotiated.ok_or("no negotiation result")?;
        println!(
            "XWARP-NEGOTIATED crc={} rtr={:?} ird={} ord={} peer_ird={:?} peer_ord={:?}",
            n.crc, n.p2p_rtr, q.ird, q.ord, n.peer_ird, n.peer_ord
        );
    }
    if o.bad_stag {
        return bad_stag(o, &mut conn, &start, size);
    }
    let mut done = 0;
    let r = client_loop(o, &mut conn, &start, &rdma, size, &mut done);
    conn.c.close();
    report_stats(o, &conn, done);
    r
}

/// `XWARP-STATS` (with `--report`).
fn report_stats(o: &Opts, conn: &Rconn, iterations: u64) {
    if o.report {
        let s = conn.c.stats;
        println!(
            "XWARP-STATS iterations={iterations} success={} flushed={} failed={} terminate={} problem={:?}",
            s.success,
            s.flushed,
            s.failed,
            conn.c.terminate_received.is_some(),
            conn.c.problem
        );
    }
}

/// `--bad-stag`: Write `size` bytes to [`BAD_STAG`]; the peer must Terminate (DDP tagged
/// buffer error, Invalid STag, docs/siw.md §4.5/§4.6) and close; the receive we posted
/// must come back flushed.
fn bad_stag(o: &Opts, conn: &mut Rconn, start: &MemoryRegion, size: usize) -> Result<(), String> {
    start.write(0, &pattern(0, size)).map_err(e2s)?;
    let src = start.sge(0, size).ok_or("start buffer")?;
    conn.c
        .qp
        .post_send(SendRequest::write(7, vec![src], BAD_STAG, 0x1000))
        .map_err(post_err)?;
    let closed = conn.c.wait_disconnected(Duration::from_secs(20));
    report_stats(o, conn, 0);
    let (layer, etype, code) = conn
        .c
        .terminate_received
        .ok_or_else(|| format!("no Terminate from the peer (closed={closed})"))?;
    if o.report {
        println!("XWARP-TERMINATE layer={layer} etype={etype} code={code:#04x}");
        let recv = conn.c.pending.iter().find(|c| c.opcode == WcOpcode::Recv);
        println!("XWARP-RECV {recv:?}");
    }
    if !closed {
        return Err("the connection did not close after the Terminate".into());
    }
    Ok(())
}

fn client_loop(
    o: &Opts,
    conn: &mut Rconn,
    start: &MemoryRegion,
    rdma: &MemoryRegion,
    size: usize,
    done: &mut u64,
) -> Result<(), String> {
    let mut i = 0u64;
    while o.count == 0 || i < o.count {
        let p = pattern(i, size);
        start.write(0, &p).map_err(e2s)?;
        conn.send
            .write(0, &info(start.addr(), start.rkey(), o.size))
            .map_err(e2s)?;
        conn.post_send_buf()?;
        // The server Reads our start buffer, then Sends "go ahead".
        check_len(&conn.wait(WcOpcode::Recv)?)?;
        conn.post_recv()?;
        conn.wait(WcOpcode::Send)?;
        conn.send
            .write(0, &info(rdma.addr(), rdma.rkey(), o.size))
            .map_err(e2s)?;
        conn.post_send_buf()?;
        // The server Writes into our rdma buffer, then Sends.
        check_len(&conn.wait(WcOpcode::Recv)?)?;
        conn.post_recv()?;
        conn.wait(WcOpcode::Send)?;
        let got = rdma.to_vec(0, size).map_err(e2s)?;
        if o.validate && got != start.to_vec(0, size).map_err(e2s)? {
            eprintln!("data mismatch!");
            return Err("data mismatch".into());
        }
        if o.verbose {
            println!("ping data: {}", c_string(&got));
        }
        i += 1;
        *done = i;
    }
    Ok(())
}

fn serve<B: Backend + Send + 'static>(
    o: &Opts,
    ctx: &Context<B>,
    req: xwarp::verbs::ConnRequest,
) -> Result<(), String> {
    let pd = ctx.device().alloc_pd();
    // rdma_accept(id, NULL) mirrors the client: our IRD = its ORD, our ORD = its IRD
    // (docs/protocols.md §5.1); -q accepts with 1/1.
    let (ird, ord) = if o.explicit_ird_ord {
        (1, 1)
    } else {
        (
            u32::from(req.peer_ord.unwrap_or(1)),
            u32::from(req.peer_ird.unwrap_or(1)),
        )
    };
    // The server accepts CRC when the client asks (crc follows the Request).
    let mut conn = Rconn::new(ctx, &pd, ird, ord, req.crc, o.debug)?;
    let size = o.size as usize;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let rdma = pd.alloc_mr(size, rw, false).map_err(e2s)?;
    conn.post_recv()?;
    req.accept(&conn.c.qp, &[]).map_err(e2s)?;
    conn.established()?;
    let r = serve_loop(o, &mut conn, &rdma, size);
    conn.c.close();
    r
}

fn serve_loop(o: &Opts, conn: &mut Rconn, rdma: &MemoryRegion, size: usize) -> Result<(), String> {
    let mut i = 0u64;
    loop {
        // The client advertises its start buffer...
        let c = match conn.wait(WcOpcode::Recv) {
            Ok(c) => c,
            Err(WaitError::Disconnected(why)) => {
                if o.debug {
                    eprintln!("xwarp: client disconnected ({why}) after {i} iterations");
                }
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        check_len(&c)?;
        let (buf, rkey, len) = parse_info(&conn.recv.to_vec(0, INFO_LEN).map_err(e2s)?);
        conn.post_recv()?;
        let len = len.min(o.size) as usize;
        // ...we Read it into our rdma buffer...
        let sink = rdma.sge(0, len).ok_or("read length")?;
        conn.c
            .qp
            .post_send(SendRequest::read(3, sink, rkey, buf))
            .map_err(post_err)?;
        conn.wait(WcOpcode::Read)?;
        let data = rdma.to_vec(0, size).map_err(e2s)?;
        if o.verbose {
            println!("server ping data: {}", c_string(&data));
        }
        // ...tell it to go ahead (send_buf is never formatted: 16 zero bytes)...
        conn.post_send_buf()?;
        conn.wait(WcOpcode::Send)?;
        // ...it advertises its rdma buffer; we Write ours into it and Send.
        check_len(&conn.wait(WcOpcode::Recv)?)?;
        let (buf, rkey, len) = parse_info(&conn.recv.to_vec(0, INFO_LEN).map_err(e2s)?);
        conn.post_recv()?;
        let strlen = data.iter().position(|&b| b == 0).unwrap_or(size) + 1;
        let wlen = strlen.min(size).min(len as usize);
        let src = rdma.sge(0, wlen).ok_or("write length")?;
        conn.c
            .qp
            .post_send(SendRequest::write(5, vec![src], rkey, buf))
            .map_err(post_err)?;
        conn.wait(WcOpcode::Write)?;
        conn.post_send_buf()?;
        conn.wait(WcOpcode::Send)?;
        i += 1;
        if o.count != 0 && i >= o.count && o.debug {
            eprintln!("xwarp: {i} iterations done, waiting for the client to disconnect");
        }
    }
}

fn server<B: Backend + Send + 'static>(
    o: &Opts,
    ctx: &Context<B>,
    own: Ipv4Addr,
) -> Result<(), String> {
    let bind = match o.addr.as_deref() {
        None | Some("0.0.0.0") => SocketAddr::from((own, o.port)),
        Some(a) => resolve(a, o.port)?,
    };
    let listener = ctx
        .device()
        .listen(bind, 8)
        .map_err(|e| format!("listen on {bind}: {e}"))?;
    loop {
        let req = loop {
            match listener.get_request(Duration::from_secs(1)) {
                Ok(r) => break r,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                Err(e) => return Err(format!("waiting for a connection: {e}")),
            }
        };
        if o.debug {
            eprintln!(
                "xwarp: connection request from {} (IRD/ORD {:?}/{:?}, CRC {})",
                req.peer, req.peer_ird, req.peer_ord, req.crc
            );
        }
        let r = serve(o, ctx, req);
        if !o.persistent {
            return r;
        }
        if let Err(e) = r {
            eprintln!("rping: {e}");
        }
    }
}

fn run(o: &Opts) -> Result<(), String> {
    let spec = o.net.engine_spec()?.ok_or(
        "xwarp-rping runs on an xwarp engine: give --iface IF --addr A.B.C.D/PREFIX \
         (or XWARP_ENGINE=xdp:IF:A.B.C.D/PREFIX)",
    )?;
    if o.server == o.client {
        return Err("choose -s or -c".into());
    }
    let ctx = start_engine(&spec, "xwarp-rping")?;
    let r = if o.server {
        server(o, &ctx, spec.ipv4)
    } else {
        client(o, &ctx)
    };
    // Stopping the engine sends what is queued and flushes the capture.
    if let Err(e) = ctx.stop() {
        eprintln!("xwarp: stopping the engine: {e}");
    }
    r
}

fn main() -> ExitCode {
    xwarp_tools::cli::init_logging();
    let o: Opts = NetArgs::parse_checked(|o: &Opts| &o.net);
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rping: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_rping() {
        let p = pattern(0, 26);
        assert_eq!(&p[..], b"rdma-ping-0: ABCDEFGHIJKL\0");
        let p = pattern(57, 30);
        assert_eq!(&p[..15], b"rdma-ping-57: z");
        assert_eq!(p[15], b'A');
        assert_eq!(p.len(), 30);
    }

    #[test]
    fn p2p_option_parses_rtr_sets() {
        assert_eq!(
            parse_rtr("write,read").unwrap(),
            RtrSet {
                send: false,
                write: true,
                read: true
            }
        );
        assert_eq!(
            parse_rtr("send").unwrap(),
            RtrSet {
                send: true,
                ..RtrSet::NONE
            }
        );
        assert!(parse_rtr("").is_err());
        assert!(parse_rtr(",").is_err());
        assert!(parse_rtr("write,bogus").is_err());
    }

    #[test]
    fn rping_info_is_big_endian() {
        let b = info(0x0000_559d_4c2a_1000, Stag(0x203), 64);
        assert_eq!(
            b,
            [0, 0, 0x55, 0x9d, 0x4c, 0x2a, 0x10, 0, 0, 0, 2, 3, 0, 0, 0, 64]
        );
        assert_eq!(parse_info(&b), (0x0000_559d_4c2a_1000, Stag(0x203), 64));
    }
}
