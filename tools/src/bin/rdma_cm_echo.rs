//! rdma_cm_echo — the exchange of rdma-core's librdmacm examples `rdma_server` /
//! `rdma_client` (librdmacm/examples/rdma_{server,client}.c) on the xwarp iWARP stack, so
//! either side can be the kernel siw peer:
//!
//! ```text
//! rdma_cm_echo -s [-a bind_addr] [-p port]     # like rdma_server
//! rdma_cm_echo -c  -a server    [-p port]     # like rdma_client
//! ```
//!
//! The exchange (default port 7471, RC, SQ/RQ depth 1, one SGE, 16-byte messages, every
//! send signaled):
//! * server: post a 16-byte receive, accept (`rdma_accept(id, NULL)`: IRD/ORD mirror the
//!   client's, docs/protocols.md §5.1), wait for the client's Send, Send 16 bytes back, wait
//!   for the send completion, disconnect;
//! * client: post a 16-byte receive, connect, Send 16 bytes, wait for the send completion,
//!   then for the server's Send, disconnect.
//!
//! The rdma-core programs send their never-written static buffers (16 zero bytes) inline;
//! inline vs. SGE makes no difference on the wire. We send [`SERVER_MSG`] / [`CLIENT_MSG`] so
//! a capture shows which side's payload is which, and print what we received as
//! `XWARP-RECV len=N data=<hex>` for the interop case to verify.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use xwarp::ddp::mpa::AcceptParams;
use xwarp::rdmap::conn::{ConnConfig, Connection};
use xwarp::rdmap::{Access, QpConfig, Resources, RqConfig, WcOpcode};

use xwarp_tools::support::{endpoint, transport};

use endpoint::{send_op, sge, Endpoint};
use transport::{Net, NetArgs};

/// librdmacm examples' default port.
const DEFAULT_PORT: u16 = 7471;
/// Message size of rdma_server/rdma_client.
const MSG_LEN: usize = 16;
/// What our server sends.
const SERVER_MSG: &[u8; MSG_LEN] = b"xwarp-server-msg";
/// What our client sends.
const CLIENT_MSG: &[u8; MSG_LEN] = b"xwarp-client-msg";

#[derive(Parser, Debug)]
#[command(
    name = "xwarp-rdma-cm-echo",
    version,
    about = "rdma_server / rdma_client exchange over xwarp"
)]
struct Opts {
    /// Server mode (like rdma_server).
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Client mode (like rdma_client).
    #[arg(short = 'c')]
    client: bool,
    /// Server: bind address (default all); client: server address.
    #[arg(short = 'a')]
    addr: Option<String>,
    /// Port.
    #[arg(short = 'p', default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Debug output.
    #[arg(short = 'd')]
    debug: bool,
    /// Run on an xwarp engine (`--iface IF --addr A/P [--gateway G]`); without these
    /// flags `XWARP_ENGINE` decides, and without it the tool runs on kernel TCP.
    #[command(flatten)]
    net: NetArgs,
}

fn qp(pd: xwarp::rdmap::PdId, ird: u32, ord: u32) -> QpConfig {
    // max_send_wr = max_recv_wr = 1, one SGE (rdma_server.c / rdma_client.c).
    QpConfig {
        pd,
        ird,
        ord,
        sq_depth: 1,
        rq: RqConfig::Own(1),
    }
}

/// Registers the two message buffers and posts the receive; returns (send SGE, recv STag).
fn setup<T: endpoint::Transport>(
    ep: &mut Endpoint<T>,
    msg: &[u8; MSG_LEN],
) -> Result<(xwarp::rdmap::Sge, xwarp::rdmap::Stag), String> {
    let (send, send_va) = ep.reg(MSG_LEN, Access::LOCAL_WRITE)?;
    let (recv, recv_va) = ep.reg(MSG_LEN, Access::LOCAL_WRITE)?;
    ep.write_mem(send, msg)?;
    ep.post_recv(1, sge(recv, recv_va, MSG_LEN))?;
    Ok((sge(send, send_va, MSG_LEN), recv))
}

fn report<T: endpoint::Transport>(ep: &Endpoint<T>, recv: xwarp::rdmap::Stag, len: u32) {
    let data = ep.mem(recv, MSG_LEN);
    let hex: String = data[..(len as usize).min(MSG_LEN)]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("XWARP-RECV len={len} data={hex}");
}

fn negotiated<T: endpoint::Transport>(ep: &Endpoint<T>) {
    if let Some(n) = ep.conn.negotiated() {
        println!(
            "XWARP-NEGOTIATED crc={} ird={} ord={} peer_ird={:?} peer_ord={:?}",
            n.crc, n.ird, n.ord, n.peer_ird, n.peer_ord
        );
    }
}

fn server(o: &Opts, net: &Net) -> Result<(), String> {
    let bind = o.addr.clone().unwrap_or_else(|| "0.0.0.0".into());
    let listener = net.listen(&bind, o.port)?;
    println!("rdma_cm_echo: listening on {bind}:{}", o.port);
    let (t, peer) = listener.accept()?;
    if o.debug {
        eprintln!("xwarp: connection from {peer}");
    }
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    let conn = Connection::responder(ConnConfig::new(qp(pd, 1, 1)), Instant::now())
        .map_err(|e| e.to_string())?;
    let mut ep = Endpoint::new(conn, res, pd, t, o.debug);
    let (send_sge, recv) = setup(&mut ep, SERVER_MSG)?;
    ep.run_until(|e| e.request.is_some())?;
    let req = ep.request.take().ok_or("no connect request")?;
    // rdma_accept(id, NULL): our IRD = the client's ORD, our ORD = its IRD (docs/protocols.md §5.1).
    ep.conn
        .accept(AcceptParams {
            ird: req.peer_ord.unwrap_or(1),
            ord: req.peer_ird.unwrap_or(1),
            private_data: Vec::new(),
        })
        .map_err(|e| e.to_string())?;
    ep.run_until(|e| e.established)?;
    negotiated(&ep);
    let c = ep.wait_cqe(WcOpcode::Recv).map_err(|e| e.to_string())?;
    report(&ep, recv, c.byte_len);
    ep.post_send(2, send_op(), send_sge)?;
    ep.wait_cqe(WcOpcode::Send).map_err(|e| e.to_string())?;
    ep.disconnect();
    Ok(())
}

fn client(o: &Opts, net: &Net) -> Result<(), String> {
    let addr = o.addr.as_deref().ok_or("client needs -a address")?;
    let t = net.connect(addr, o.port, Duration::from_secs(60))?;
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    let mut cfg = ConnConfig::new(qp(pd, 1, 1));
    // siw quirk (docs/siw.md §4.3, ConnConfig::new): rdma_server's siw QP may not read an
    // FPDU that arrives right behind its Reply; hold our first Send back briefly.
    cfg.first_fpdu_delay = Duration::from_millis(100);
    let conn = Connection::initiator(cfg, Instant::now()).map_err(|e| e.to_string())?;
    let mut ep = Endpoint::new(conn, res, pd, t, o.debug);
    let (send_sge, recv) = setup(&mut ep, CLIENT_MSG)?;
    ep.run_until(|e| e.established)?;
    negotiated(&ep);
    ep.post_send(2, send_op(), send_sge)?;
    ep.wait_cqe(WcOpcode::Send).map_err(|e| e.to_string())?;
    let c = ep.wait_cqe(WcOpcode::Recv).map_err(|e| e.to_string())?;
    report(&ep, recv, c.byte_len);
    ep.disconnect();
    Ok(())
}

fn main() -> ExitCode {
    xwarp_tools::cli::init_logging();
    let o: Opts = NetArgs::parse_checked(|o: &Opts| &o.net);
    let r = Net::from_args(&o.net).and_then(|net| {
        let r = match (o.server, o.client) {
            (true, false) => server(&o, &net),
            (false, true) => client(&o, &net),
            _ => Err("choose -s or -c".into()),
        };
        net.finish();
        r
    });
    println!("rdma_cm_echo: end {}", if r.is_ok() { 0 } else { 1 });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma_cm_echo: {e}");
            ExitCode::FAILURE
        }
    }
}
