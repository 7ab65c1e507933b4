//! tokio_echo — a tokio echo server and clients over `xwarp::net::tokio`.
//!
//! ```text
//! cargo run --release --example tokio_echo -- [--conns N] [--bytes B]
//!     two engines on the in-process virtual wire (no privileges): an echo server on one,
//!     N concurrent clients on the other, every echoed byte checked
//! ip netns exec NS tokio_echo --iface veth-a --addr 10.88.1.10/24 [--port 7]
//!     (root) an echo server on an AF_XDP engine; from a peer: nc -N 10.88.1.10 7 < in > out
//! ```
//!
//! The server runs one task per connection; clients split their stream, one task writing
//! a pattern while another reads the echo back.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use xwarp::net::tokio::{TcpListener, TcpStream};
use xwarp::net::{vwire_pair, SocketOptions, StackHandle};
use xwarp::toe::{start_xdp_engine, XdpEngineConfig};

/// The pattern byte at stream offset `i` of connection `seed`.
fn pattern(seed: u64, i: u64) -> u8 {
    ((i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (i / 251) as u8
}

/// Echo one connection until the peer's FIN, then FIN back.
async fn echo(mut s: TcpStream) -> io::Result<u64> {
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n]).await?;
        total += n as u64;
    }
    s.shutdown().await?;
    Ok(total)
}

/// Accept forever (or `limit` connections), one echo task each.
async fn serve(listener: TcpListener, limit: Option<usize>) -> io::Result<u64> {
    let mut tasks = Vec::new();
    let mut n = 0;
    while limit.is_none_or(|l| n < l) {
        let (s, peer) = listener.accept().await?;
        n += 1;
        let t = tokio::spawn(async move {
            let r = echo(s).await;
            if let Err(e) = &r {
                eprintln!("tokio_echo: {peer}: {e}");
            }
            r.unwrap_or(0)
        });
        if limit.is_some() {
            tasks.push(t);
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(io::Error::other)?;
    }
    Ok(total)
}

/// Send `bytes` of pattern `seed` and check the echo; returns the bytes checked.
async fn client(stack: StackHandle, to: SocketAddr, seed: u64, bytes: u64) -> io::Result<u64> {
    let s = TcpStream::connect(&stack, to).await?;
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 << 10];
        let mut off = 0u64;
        while off < bytes {
            let n = (buf.len() as u64).min(bytes - off) as usize;
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = pattern(seed, off + k as u64);
            }
            w.write_all(&buf[..n]).await?;
            off += n as u64;
        }
        w.shutdown().await
    });
    let mut buf = vec![0u8; 16 << 10];
    let mut got = 0u64;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        if let Some(k) = (0..n).find(|&k| buf[k] != pattern(seed, got + k as u64)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("connection {seed}: byte {} differs", got + k as u64),
            ));
        }
        got += n as u64;
    }
    writer.await.map_err(io::Error::other)??;
    if got != bytes {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection {seed}: {got} of {bytes} bytes echoed"),
        ));
    }
    Ok(got)
}

/// Both ends in this process on the virtual wire.
async fn vwire_run(conns: usize, bytes: u64) -> io::Result<()> {
    let (a, b) = vwire_pair(Default::default())?;
    let to = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 2), 7));
    let listener = TcpListener::bind_with(b.stack(), to, conns.max(1), &SocketOptions::default())?;
    let t = Instant::now();
    let server = tokio::spawn(serve(listener, Some(conns)));
    let clients: Vec<_> = (0..conns as u64)
        .map(|seed| tokio::spawn(client(a.stack().clone(), to, seed, bytes)))
        .collect();
    let mut total = 0;
    for c in clients {
        total += c.await.map_err(io::Error::other)??;
    }
    let echoed = server.await.map_err(io::Error::other)??;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "tokio_echo: {conns} connections, {total} bytes echoed and verified (server echoed {echoed}) in {:.3} s, {:.1} Mbit/s each way",
        secs,
        total as f64 * 8.0 / secs / 1e6
    );
    Ok(())
}

fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, p) = s.split_once('/')?;
    let p: u8 = p.parse().ok().filter(|&p| p <= 32)?;
    Some((a.parse().ok()?, p))
}

struct Args {
    iface: Option<String>,
    addr: Option<(Ipv4Addr, u8)>,
    port: u16,
    conns: usize,
    bytes: u64,
}

fn parse_args() -> Option<Args> {
    let mut a = Args {
        iface: None,
        addr: None,
        port: 7,
        conns: 100,
        bytes: 256 << 10,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let v = it.next()?;
        match k.as_str() {
            "--iface" => a.iface = Some(v.clone()),
            "--addr" => a.addr = Some(parse_cidr(v)?),
            "--port" => a.port = v.parse().ok().filter(|&p| p != 0)?,
            "--conns" => a.conns = v.parse().ok().filter(|&n| n > 0)?,
            "--bytes" => a.bytes = v.parse().ok()?,
            _ => return None,
        }
    }
    (a.iface.is_some() == a.addr.is_some()).then_some(a)
}

#[tokio::main]
async fn main() -> ExitCode {
    let Some(args) = parse_args() else {
        eprintln!(
            "usage: tokio_echo [--conns N] [--bytes B]              (virtual wire)\n       tokio_echo --iface IFACE --addr ADDR/PREFIX [--port P]   (AF_XDP server, root)"
        );
        return ExitCode::from(2);
    };
    let r = match (args.iface, args.addr) {
        (Some(iface), Some((ip, prefix))) => {
            // Starting the engine blocks briefly (it opens the NIC): fine before serving.
            match start_xdp_engine(None, XdpEngineConfig::new(&iface, ip, prefix)) {
                Ok(engine) => {
                    let at = SocketAddr::from((ip, args.port));
                    match TcpListener::bind(engine.stack(), at) {
                        Ok(l) => {
                            eprintln!("tokio_echo: echoing on {at} ({iface})");
                            serve(l, None).await.map(|_| ())
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        }
        _ => vwire_run(args.conns, args.bytes).await,
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokio_echo: {e}");
            ExitCode::FAILURE
        }
    }
}
