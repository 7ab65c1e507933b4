//! rping — rdma-core's `rping` (librdmacm/examples/rping.c) on the xwarp iWARP stack.
//!
//! Same command line and the same wire behaviour (docs/protocols.md §5.2), so it interoperates
//! with rdma-core `rping` on a kernel soft-iWARP (siw) peer in either role:
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port] [-P] [-q]
//! rping -c [-vVd] [-S size] [-C count]  -a addr  [-p port]
//! ```
//!
//! One iteration: the client Sends `{start_buf VA, rkey, size}` (16 bytes, big-endian);
//! the server RDMA-Reads `size` bytes of the client's start buffer, Sends 16 zero bytes
//! ("go ahead"); the client Sends `{rdma_buf VA, rkey, size}`; the server RDMA-Writes its
//! buffer into the client's and Sends again. `-V` compares the client's two buffers.
//!
//! Layering: the protocol runs in the sans-IO [`Connection`]; the bytes move through a
//! [`Transport`](xwarp_tools::support::transport::Transport): a kernel TCP socket by default, or with
//! `--iface IFACE --addr ADDR/PREFIX` (fallback without flags: the variable
//! `XWARP_ENGINE=xdp:IFACE:ADDR/PREFIX`) a TCP stream of an xwarp engine bound to `IFACE`
//! with AF_XDP and owning `ADDR` (capture with `XWARP_PCAP=/path`). [`Endpoint`] and the rping
//! logic are the same on both.
//!
//! Memory: every buffer is a `Vec<u8>` registered as a region ([`RegionMemory`](xwarp::rdmap::mem::RegionMemory) is
//! implemented for `Vec<u8>`). Its tagged offset (TO) is the address of the Vec's heap
//! buffer, `vec.as_ptr() as u64`, a virtual-address-like value as rping uses with
//! `ibv_reg_mr` (docs/ddp-rdmap.md §3.6). The heap buffer does not move when the Vec is boxed
//! into the STag table, so the value stays a real address of the bytes, but the stack never
//! dereferences it: placement goes through the STag table.
//!
//! Environment: `XWARP_MPA_CRC=1` makes the client request MPA CRC (the server always
//! accepts CRC when the client asks); `XWARP_FIRST_FPDU_DELAY_MS` (default 100) is how long
//! the client waits after the MPA Reply before its first FPDU (a siw race, see
//! `ConnConfig::new`). FPDUs are sized for an EMSS of 1448 bytes.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use xwarp::ddp::mpa::AcceptParams;
use xwarp::rdmap::conn::{ConnConfig, Connection};
use xwarp::rdmap::{Access, PdId, QpConfig, Resources, RqConfig, SendOp, Sge, Stag, WcOpcode};

/// rping's default port.
const DEFAULT_PORT: u16 = 7174;
/// Size of `struct rping_rdma_info`.
const INFO_LEN: usize = 16;
/// Client: pause between siw's MPA Reply and our first FPDU (XWARP_FIRST_FPDU_DELAY_MS).
const DEFAULT_FIRST_FPDU_DELAY_MS: u64 = 100;

#[derive(Parser, Debug)]
#[command(
    name = "xwarp-rping",
    version,
    about = "RDMA ping-pong over xwarp iWARP (rdma-core rping compatible)",
    disable_version_flag = true
)]
struct Opts {
    /// Server mode.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Client mode.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server's bind address (default all), the client's destination.
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
    /// Run on an xwarp engine (`--iface IF --addr A/P [--gateway G]`); without these
    /// flags `XWARP_ENGINE` decides, and without it the tool runs on kernel TCP.
    #[command(flatten)]
    net: NetArgs,
    /// Print version.
    #[arg(long, action = clap::ArgAction::Version)]
    version: Option<bool>,
}

// ---------------------------------------------------------- transport and endpoint

use xwarp_tools::support::{endpoint, transport};

use endpoint::{send_op, Endpoint, WaitError, RW};
use transport::{Net, NetArgs, Stream};

// --------------------------------------------------------------------------- rping

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

fn qp_config(pd: PdId, ird: u32, ord: u32) -> QpConfig {
    // rping: SQ 16, RQ 2, one SGE.
    QpConfig {
        pd,
        ird,
        ord,
        sq_depth: 16,
        rq: RqConfig::Own(2),
    }
}

fn client(o: &Opts, net: &Net) -> Result<(), String> {
    let addr = o.addr.as_deref().ok_or("client needs -a address")?;
    // One attempt, like rping (the interop case retries while the guest is not listening).
    let t = net.connect(addr, o.port, Duration::ZERO)?;
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    // rping client: responder_resources = initiator_depth = 1 (docs/protocols.md §5.2).
    let mut cfg = ConnConfig::new(qp_config(pd, 1, 1));
    cfg.initiator.crc = std::env::var_os("XWARP_MPA_CRC").is_some_and(|v| v == "1");
    // siw quirk (docs/siw.md §4.3, see ConnConfig::new): an FPDU right behind siw's Reply
    // can sit unread in its socket, and rping's server then waits forever for our Send.
    cfg.first_fpdu_delay = Duration::from_millis(
        std::env::var("XWARP_FIRST_FPDU_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_FIRST_FPDU_DELAY_MS),
    );
    let conn = Connection::initiator(cfg, Instant::now()).map_err(|e| e.to_string())?;
    let mut ep = Endpoint::new(conn, res, pd, t, o.debug);
    let size = o.size as usize;
    let (start, start_va) = ep.reg(size, RW)?;
    let (rdma, rdma_va) = ep.reg(size, RW)?;
    let (send, send_va) = ep.reg(INFO_LEN, Access::LOCAL_WRITE)?;
    let (recv, recv_va) = ep.reg(INFO_LEN, Access::LOCAL_WRITE)?;
    let send_sge = Sge {
        lkey: send,
        addr: send_va,
        len: INFO_LEN as u32,
    };
    let recv_sge = Sge {
        lkey: recv,
        addr: recv_va,
        len: INFO_LEN as u32,
    };
    ep.post_recv(1, recv_sge)?;
    ep.run_until(|e| e.established)?;
    if o.debug {
        eprintln!("xwarp: established {:?}", ep.conn.negotiated());
    }
    let mut i = 0u64;
    while o.count == 0 || i < o.count {
        let p = pattern(i, size);
        ep.write_mem(start, &p)?;
        ep.write_mem(send, &info(start_va, start, o.size))?;
        ep.post_send(2, send_op(), send_sge)?;
        // The server Reads our start buffer, then Sends "go ahead".
        let c = ep.wait_cqe(WcOpcode::Recv).map_err(|e| e.to_string())?;
        if c.byte_len as usize != INFO_LEN {
            return Err(format!("Received bogus data, size {}", c.byte_len));
        }
        ep.post_recv(1, recv_sge)?;
        ep.wait_cqe(WcOpcode::Send).map_err(|e| e.to_string())?;
        ep.write_mem(send, &info(rdma_va, rdma, o.size))?;
        ep.post_send(2, send_op(), send_sge)?;
        // The server Writes into our rdma buffer, then Sends.
        let c = ep.wait_cqe(WcOpcode::Recv).map_err(|e| e.to_string())?;
        if c.byte_len as usize != INFO_LEN {
            return Err(format!("Received bogus data, size {}", c.byte_len));
        }
        ep.post_recv(1, recv_sge)?;
        ep.wait_cqe(WcOpcode::Send).map_err(|e| e.to_string())?;
        let got = ep.mem(rdma, size);
        if o.validate && got != ep.mem(start, size) {
            eprintln!("data mismatch!");
            ep.disconnect();
            return Err("data mismatch".into());
        }
        if o.verbose {
            println!("ping data: {}", c_string(&got));
        }
        i += 1;
    }
    ep.disconnect();
    if let Some(p) = ep
        .problem
        .as_ref()
        .filter(|_| !ep.closed || ep.cqes.is_empty())
    {
        if o.debug {
            eprintln!("xwarp: at close: {p}");
        }
    }
    Ok(())
}

fn serve(o: &Opts, t: Stream) -> Result<(), String> {
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    let cfg = ConnConfig::new(qp_config(pd, 1, 1));
    let conn = Connection::responder(cfg, Instant::now()).map_err(|e| e.to_string())?;
    let mut ep = Endpoint::new(conn, res, pd, t, o.debug);
    let size = o.size as usize;
    let (rdma, rdma_va) = ep.reg(size, RW)?;
    let (send, send_va) = ep.reg(INFO_LEN, Access::LOCAL_WRITE)?;
    let (recv, recv_va) = ep.reg(INFO_LEN, Access::LOCAL_WRITE)?;
    let send_sge = Sge {
        lkey: send,
        addr: send_va,
        len: INFO_LEN as u32,
    };
    let recv_sge = Sge {
        lkey: recv,
        addr: recv_va,
        len: INFO_LEN as u32,
    };
    ep.post_recv(1, recv_sge)?;
    ep.run_until(|e| e.request.is_some())?;
    let req = ep.request.take().ok_or("no connect request")?;
    // rdma_accept(id, NULL) mirrors the client: our IRD = its ORD, our ORD = its IRD
    // (docs/protocols.md §5.1); -q accepts with 1/1.
    let (ird, ord) = if o.explicit_ird_ord {
        (1, 1)
    } else {
        (req.peer_ord.unwrap_or(1), req.peer_ird.unwrap_or(1))
    };
    ep.conn
        .accept(AcceptParams {
            ird,
            ord,
            private_data: Vec::new(),
        })
        .map_err(|e| e.to_string())?;
    ep.run_until(|e| e.established)?;
    if o.debug {
        eprintln!("xwarp: established {:?}", ep.conn.negotiated());
    }
    let mut i = 0u64;
    loop {
        // The client advertises its start buffer...
        let c = match ep.wait_cqe(WcOpcode::Recv) {
            Ok(c) => c,
            Err(WaitError::Disconnected(why)) => {
                if o.debug {
                    eprintln!("xwarp: client disconnected ({why})");
                }
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        if c.byte_len as usize != INFO_LEN {
            return Err(format!("Received bogus data, size {}", c.byte_len));
        }
        let (buf, rkey, len) = parse_info(&ep.mem(recv, INFO_LEN));
        ep.post_recv(1, recv_sge)?;
        let len = len.min(o.size);
        // ...we Read it into our rdma buffer...
        ep.post_send(
            3,
            SendOp::Read {
                remote_stag: rkey,
                remote_to: buf,
            },
            Sge {
                lkey: rdma,
                addr: rdma_va,
                len,
            },
        )?;
        ep.wait_cqe(WcOpcode::Read).map_err(|e| e.to_string())?;
        if o.verbose {
            println!("server ping data: {}", c_string(&ep.mem(rdma, size)));
        }
        // ...tell it to go ahead (send_buf is never formatted: 16 zero bytes)...
        ep.post_send(4, send_op(), send_sge)?;
        ep.wait_cqe(WcOpcode::Send).map_err(|e| e.to_string())?;
        // ...it advertises its rdma buffer; we Write ours into it and Send.
        let c = ep.wait_cqe(WcOpcode::Recv).map_err(|e| e.to_string())?;
        if c.byte_len as usize != INFO_LEN {
            return Err(format!("Received bogus data, size {}", c.byte_len));
        }
        let (buf, rkey, len) = parse_info(&ep.mem(recv, INFO_LEN));
        ep.post_recv(1, recv_sge)?;
        let data = ep.mem(rdma, size);
        let strlen = data.iter().position(|&b| b == 0).unwrap_or(size) + 1;
        let wlen = (strlen.min(size) as u32).min(len);
        ep.post_send(
            5,
            SendOp::Write {
                remote_stag: rkey,
                remote_to: buf,
            },
            Sge {
                lkey: rdma,
                addr: rdma_va,
                len: wlen,
            },
        )?;
        ep.wait_cqe(WcOpcode::Write).map_err(|e| e.to_string())?;
        ep.post_send(6, send_op(), send_sge)?;
        ep.wait_cqe(WcOpcode::Send).map_err(|e| e.to_string())?;
        i += 1;
        if o.count != 0 && i >= o.count && o.debug {
            eprintln!("xwarp: {i} iterations done, waiting for the client to disconnect");
        }
    }
}

fn server(o: &Opts, net: &Net) -> Result<(), String> {
    let bind = o.addr.clone().unwrap_or_else(|| "0.0.0.0".into());
    let listener = net.listen(&bind, o.port)?;
    loop {
        let (stream, peer) = listener.accept()?;
        if o.debug {
            eprintln!("xwarp: connection from {peer}");
        }
        let r = serve(o, stream);
        if !o.persistent {
            return r;
        }
        if let Err(e) = r {
            eprintln!("rping: {e}");
        }
    }
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
    match r {
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
    fn rping_info_is_big_endian() {
        let b = info(0x0000_559d_4c2a_1000, Stag(0x203), 64);
        assert_eq!(
            b,
            [0, 0, 0x55, 0x9d, 0x4c, 0x2a, 0x10, 0, 0, 0, 2, 3, 0, 0, 0, 64]
        );
        assert_eq!(parse_info(&b), (0x0000_559d_4c2a_1000, Stag(0x203), 64));
    }
}
