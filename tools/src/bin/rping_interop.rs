//! rping_interop — an rdma-core `rping` client on the xwarp iWARP stack with the knobs the
//! siw interop cases need beyond `xwarp-rping` (`tools/src/bin/rping.rs`):
//!
//! ```text
//! rping_interop -a addr [-p port] [-S size] [-C count] [-v] [-d]
//!               [--crc] [--p2p write,read,send] [--bad-stag]
//! ```
//!
//! * `--crc`: request MPA CRC (C=1) in the Request (docs/mpa.md §1.3).
//! * `--p2p TYPES`: request MPA v2 peer-to-peer mode offering these RTR types
//!   (RFC 6581; the Responder picks one, siw: Write if offered, else Read, docs/siw.md §4.3).
//! * `--bad-stag`: after the connection is up, RDMA-Write to an STag the peer never
//!   advertised; the peer must answer with a Terminate and close, our posted receive must be
//!   flushed (docs/siw.md §4.6). Prints the Terminate's control bytes under both layouts.
//! * `-C 0` runs until the peer goes away; every iteration that is printed was verified
//!   (the client compares the server's RDMA Write with its start buffer, like rping -V).
//!
//! One rping iteration is the same as rdma-core's (docs/protocols.md §5.2). Machine-readable
//! lines for the cases: `XWARP-NEGOTIATED ...`, `XWARP-TERMINATE ...`, `XWARP-STATS ...`.
//! Environment: `XWARP_FIRST_FPDU_DELAY_MS` (default 100, the siw Reply/upcall race, see
//! `ConnConfig::new`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use xwarp::ddp::mpa::RtrSet;
use xwarp::rdmap::conn::{ConnConfig, Connection};
use xwarp::rdmap::{Access, QpConfig, Resources, RqConfig, SendOp, Stag, WcOpcode};

use xwarp_tools::support::{endpoint, transport};

use endpoint::{send_op, sge, Endpoint, WaitError, RW};
use transport::{Net, NetArgs};

/// rping's default port.
const DEFAULT_PORT: u16 = 7174;
/// Size of `struct rping_rdma_info`.
const INFO_LEN: usize = 16;
/// The STag `--bad-stag` writes to: index 0xbad00, key 0x5a (never registered by siw's
/// rping, whose STags are small indices).
const BAD_STAG: Stag = Stag(0xbad0_005a);

#[derive(Parser, Debug)]
#[command(
    name = "xwarp-rping-interop",
    version,
    about = "rping client with interop knobs"
)]
struct Opts {
    /// Server address.
    #[arg(short = 'a')]
    addr: String,
    /// Port.
    #[arg(short = 'p', default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Iterations (0 = until the peer goes away).
    #[arg(short = 'C', default_value_t = 1)]
    count: u64,
    /// Buffer size, 26..=65535.
    #[arg(short = 'S', default_value_t = 64, value_parser = clap::value_parser!(u32).range(26..=65535))]
    size: u32,
    /// Print the verified ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Debug output.
    #[arg(short = 'd')]
    debug: bool,
    /// Request MPA CRC.
    #[arg(long)]
    crc: bool,
    /// Request P2P mode offering these RTR types (comma-separated: write, read, send).
    #[arg(long)]
    p2p: Option<String>,
    /// Write to an STag the peer never advertised and expect its Terminate.
    #[arg(long)]
    bad_stag: bool,
    /// Run on an xwarp engine (`--iface IF --addr A/P [--gateway G]`); without these
    /// flags `XWARP_ENGINE` decides, and without it the tool runs on kernel TCP.
    #[command(flatten)]
    net: NetArgs,
}

fn parse_rtr(s: &str) -> Result<RtrSet, String> {
    let mut set = RtrSet::NONE;
    for t in s.split(',').filter(|t| !t.is_empty()) {
        match t {
            "write" => set.write = true,
            "read" => set.read = true,
            "send" => set.send = true,
            _ => return Err(format!("unknown RTR type {t:?}")),
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

/// rping's start buffer (docs/protocols.md §5.2).
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

fn run(o: &Opts, net: &Net) -> Result<(), String> {
    let t = net.connect(&o.addr, o.port, Duration::from_secs(60))?;
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    // rping client: responder_resources = initiator_depth = 1, SQ 16, RQ 2 (docs/protocols.md §5.2).
    let mut cfg = ConnConfig::new(QpConfig {
        pd,
        ird: 1,
        ord: 1,
        sq_depth: 16,
        rq: RqConfig::Own(2),
    });
    cfg.initiator.crc = o.crc;
    cfg.initiator.p2p = o.p2p.as_deref().map(parse_rtr).transpose()?;
    // siw quirk (docs/siw.md §4.3, ConnConfig::new): hold the first FPDU back briefly.
    cfg.first_fpdu_delay = Duration::from_millis(
        std::env::var("XWARP_FIRST_FPDU_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100),
    );
    let conn = Connection::initiator(cfg, Instant::now()).map_err(|e| e.to_string())?;
    let mut ep = Endpoint::new(conn, res, pd, t, o.debug);
    let size = o.size as usize;
    let (start, start_va) = ep.reg(size, RW)?;
    let (rdma, rdma_va) = ep.reg(size, RW)?;
    let (send, send_va) = ep.reg(INFO_LEN, Access::LOCAL_WRITE)?;
    let (recv, recv_va) = ep.reg(INFO_LEN, Access::LOCAL_WRITE)?;
    let send_sge = sge(send, send_va, INFO_LEN);
    let recv_sge = sge(recv, recv_va, INFO_LEN);
    ep.post_recv(1, recv_sge)?;
    ep.run_until(|e| e.established)?;
    let n = ep
        .conn
        .negotiated()
        .cloned()
        .ok_or("no negotiation result")?;
    println!(
        "XWARP-NEGOTIATED crc={} rtr={:?} ird={} ord={} peer_ird={:?} peer_ord={:?}",
        n.crc, n.rtr, n.ird, n.ord, n.peer_ird, n.peer_ord
    );
    if o.bad_stag {
        return bad_stag(&mut ep, start, start_va, size);
    }
    let mut i = 0u64;
    let r = loop {
        if o.count != 0 && i >= o.count {
            break Ok(());
        }
        match iteration(
            &mut ep,
            i,
            size,
            o.size,
            [start, rdma, send],
            [start_va, rdma_va],
            send_sge,
            recv_sge,
        ) {
            Ok(()) => {}
            Err(e) => break Err(e),
        }
        let got = ep.mem(rdma, size);
        if got != ep.mem(start, size) {
            eprintln!("data mismatch!");
            break Err("data mismatch".to_string());
        }
        if o.verbose {
            println!("ping data: {}", c_string(&got));
        }
        i += 1;
    };
    if r.is_ok() {
        ep.disconnect();
    } else {
        ep.wait_closed(Duration::from_secs(3));
    }
    println!(
        "XWARP-STATS iterations={i} success={} flushed={} failed={} terminate={} problem={:?}",
        ep.stats.success,
        ep.stats.flushed,
        ep.stats.failed,
        ep.terminate_received.is_some(),
        ep.problem
    );
    r
}

#[allow(clippy::too_many_arguments)]
fn iteration<T: endpoint::Transport>(
    ep: &mut Endpoint<T>,
    i: u64,
    size: usize,
    size32: u32,
    [start, rdma, send]: [Stag; 3],
    [start_va, rdma_va]: [u64; 2],
    send_sge: xwarp::rdmap::Sge,
    recv_sge: xwarp::rdmap::Sge,
) -> Result<(), String> {
    let w = |e: WaitError| e.to_string();
    ep.write_mem(rdma, &vec![0u8; size])?;
    ep.write_mem(start, &pattern(i, size))?;
    ep.write_mem(send, &info(start_va, start, size32))?;
    ep.post_send(2, send_op(), send_sge)?;
    // The server Reads our start buffer, then Sends "go ahead".
    let c = ep.wait_cqe(WcOpcode::Recv).map_err(w)?;
    if c.byte_len as usize != INFO_LEN {
        return Err(format!("Received bogus data, size {}", c.byte_len));
    }
    ep.post_recv(1, recv_sge)?;
    ep.wait_cqe(WcOpcode::Send).map_err(w)?;
    ep.write_mem(send, &info(rdma_va, rdma, size32))?;
    ep.post_send(2, send_op(), send_sge)?;
    // The server Writes into our rdma buffer, then Sends.
    let c = ep.wait_cqe(WcOpcode::Recv).map_err(w)?;
    if c.byte_len as usize != INFO_LEN {
        return Err(format!("Received bogus data, size {}", c.byte_len));
    }
    ep.post_recv(1, recv_sge)?;
    ep.wait_cqe(WcOpcode::Send).map_err(w)?;
    Ok(())
}

/// `--bad-stag`: Write `size` bytes to [`BAD_STAG`]; the peer must Terminate (DDP tagged
/// buffer error, Invalid STag, docs/siw.md §4.5/§4.6) and close; the receive we posted
/// must come back flushed.
fn bad_stag<T: endpoint::Transport>(
    ep: &mut Endpoint<T>,
    start: Stag,
    start_va: u64,
    size: usize,
) -> Result<(), String> {
    ep.write_mem(start, &pattern(0, size))?;
    ep.post_send(
        7,
        SendOp::Write {
            remote_stag: BAD_STAG,
            remote_to: 0x1000,
        },
        sge(start, start_va, size),
    )?;
    let closed = ep.wait_closed(Duration::from_secs(20));
    println!(
        "XWARP-STATS iterations=0 success={} flushed={} failed={} terminate={} problem={:?}",
        ep.stats.success,
        ep.stats.flushed,
        ep.stats.failed,
        ep.terminate_received.is_some(),
        ep.problem
    );
    let t = ep
        .terminate_received
        .ok_or_else(|| format!("no Terminate from the peer (closed={closed})"))?;
    for (name, r) in [("rfc", t.rfc), ("siw", t.siw)] {
        match r {
            Some(r) => println!(
                "XWARP-TERMINATE layout={name} layer={} etype={} code={:#04x} m={} ddp_segment_length={} ddp_header={}",
                r.layer,
                r.etype,
                r.code,
                r.m,
                r.ddp_segment_length,
                r.ddp_header.is_some()
            ),
            None => println!("XWARP-TERMINATE layout={name} inconsistent"),
        }
    }
    println!("XWARP-TERMINATE chosen={:?}", t.chosen);
    if !closed {
        return Err("the stream did not close after the Terminate".into());
    }
    // The receive posted before connecting must be flushed, not lost or completed.
    let recv = ep.cqes.iter().find(|c| c.opcode == WcOpcode::Recv).copied();
    println!("XWARP-RECV {recv:?}");
    Ok(())
}

fn main() -> ExitCode {
    xwarp_tools::cli::init_logging();
    let o: Opts = NetArgs::parse_checked(|o: &Opts| &o.net);
    let net = match Net::from_args(&o.net) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("rping_interop: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = run(&o, &net);
    net.finish();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rping_interop: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rtr_sets() {
        assert_eq!(
            parse_rtr("write,read").unwrap(),
            RtrSet {
                send: false,
                write: true,
                read: true
            }
        );
        assert!(parse_rtr("").is_err());
        assert!(parse_rtr("bogus").is_err());
    }

    #[test]
    fn pattern_matches_rping() {
        assert_eq!(&pattern(0, 26)[..], b"rdma-ping-0: ABCDEFGHIJKL\0");
    }
}
