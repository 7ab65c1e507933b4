//! tokio_echo — a tokio echo server and clients over `xwarp::net::tokio`.
//!
//! ```text
//! cargo run --release --example tokio_echo -- [--conns N] [--bytes B]
//!     two engines on the in-process virtual wire (no privileges): an echo server on one,
//!     N concurrent clients on the other, every echoed byte checked
//! cargo run --release --example tokio_echo -- --compare
//!     the same engine pair, tokio against the blocking API: one-connection bulk
//!     bandwidth and 64-byte ping-pong half round trips (3 interleaved rounds)
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
use xwarp::poll_driver::vwire::WireConfig;
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
    // A deep wire queue: with the default 1024 frames, many concurrent bulk flows
    // overflow it, and the losses (and the engine's recovery) rather than the sockets set
    // the pace.
    let (a, b) = vwire_pair(WireConfig {
        queue_depth: 1 << 16,
        ..WireConfig::default()
    })?;
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

/// Bulk bytes and ping-pong exchanges of one `--compare` round.
const BULK: usize = 64 << 20;
const PINGS: usize = 5_000;

/// One round with the blocking API: (bulk Gbit/s, ping-pong half round trip µs p50).
fn blocking_round(a: &StackHandle, b: &StackHandle, port: u16) -> io::Result<(f64, f64)> {
    use std::io::{Read, Write};
    let to = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 2), port));
    let l = xwarp::net::TcpListener::bind(b, to)?;
    let mut c = xwarp::net::TcpStream::connect(a, to)?;
    let (mut s, _) = l.accept()?;
    c.set_nodelay(true)?;
    s.set_nodelay(true)?;
    let t = Instant::now();
    let sink = std::thread::spawn(move || -> io::Result<xwarp::net::TcpStream> {
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0;
        while got < BULK {
            got += s.read(&mut buf)?;
        }
        s.write_all(b"k")?;
        Ok(s)
    });
    let chunk = vec![0x5au8; 256 << 10];
    for _ in 0..BULK / chunk.len() {
        c.write_all(&chunk)?;
    }
    c.read_exact(&mut [0u8; 1])?;
    let gbps = BULK as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9;
    let mut s = sink
        .join()
        .map_err(|_| io::Error::other("sink panicked"))??;
    let pong = std::thread::spawn(move || -> io::Result<()> {
        let mut m = [0u8; 64];
        for _ in 0..PINGS {
            s.read_exact(&mut m)?;
            s.write_all(&m)?;
        }
        Ok(())
    });
    let mut m = [1u8; 64];
    let mut rtts = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let t = Instant::now();
        c.write_all(&m)?;
        c.read_exact(&mut m)?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    pong.join()
        .map_err(|_| io::Error::other("pong panicked"))??;
    rtts.sort_by(f64::total_cmp);
    Ok((gbps, rtts[rtts.len() / 2]))
}

/// The same round through `xwarp::net::tokio`.
async fn tokio_round(a: &StackHandle, b: &StackHandle, port: u16) -> io::Result<(f64, f64)> {
    let to = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 2), port));
    let l = TcpListener::bind(b, to)?;
    let mut c = TcpStream::connect(a, to).await?;
    let (mut s, _) = l.accept().await?;
    c.set_nodelay(true)?;
    s.set_nodelay(true)?;
    let t = Instant::now();
    let sink = tokio::spawn(async move {
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0;
        while got < BULK {
            got += s.read(&mut buf).await?;
        }
        s.write_all(b"k").await?;
        io::Result::Ok(s)
    });
    let chunk = vec![0x5au8; 256 << 10];
    for _ in 0..BULK / chunk.len() {
        c.write_all(&chunk).await?;
    }
    c.read_exact(&mut [0u8; 1]).await?;
    let gbps = BULK as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9;
    let mut s = sink.await.map_err(io::Error::other)??;
    let pong = tokio::spawn(async move {
        let mut m = [0u8; 64];
        for _ in 0..PINGS {
            s.read_exact(&mut m).await?;
            s.write_all(&m).await?;
        }
        io::Result::Ok(())
    });
    let mut m = [1u8; 64];
    let mut rtts = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let t = Instant::now();
        c.write_all(&m).await?;
        c.read_exact(&mut m).await?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    pong.await.map_err(io::Error::other)??;
    rtts.sort_by(f64::total_cmp);
    Ok((gbps, rtts[rtts.len() / 2]))
}

/// `--compare`: 3 interleaved rounds of each, medians printed.
async fn compare() -> io::Result<()> {
    let (a, b) = vwire_pair(Default::default())?;
    let (mut blocking, mut tokio) = (Vec::new(), Vec::new());
    for round in 0..3u16 {
        let (sa, sb) = (a.stack().clone(), b.stack().clone());
        let r = tokio::task::spawn_blocking(move || blocking_round(&sa, &sb, 100 + round))
            .await
            .map_err(io::Error::other)??;
        blocking.push(r);
        tokio.push(tokio_round(a.stack(), b.stack(), 200 + round).await?);
    }
    let median = |v: &mut Vec<(f64, f64)>| {
        let mut bw: Vec<f64> = v.iter().map(|r| r.0).collect();
        let mut lat: Vec<f64> = v.iter().map(|r| r.1).collect();
        bw.sort_by(f64::total_cmp);
        lat.sort_by(f64::total_cmp);
        (bw[1], lat[1])
    };
    let (bb, bl) = median(&mut blocking);
    let (tb, tl) = median(&mut tokio);
    println!("tokio_echo --compare: virtual wire, 1 connection, medians of 3 interleaved rounds");
    println!(
        "  bulk {} MiB:        blocking {bb:.2} Gbit/s   tokio {tb:.2} Gbit/s ({:.2}x)",
        BULK >> 20,
        tb / bb
    );
    println!(
        "  64 B half RTT p50: blocking {bl:.1} us       tokio {tl:.1} us ({:.2}x)",
        tl / bl
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
    compare: bool,
}

fn parse_args() -> Option<Args> {
    let mut a = Args {
        iface: None,
        addr: None,
        port: 7,
        conns: 100,
        bytes: 256 << 10,
        compare: false,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        if k == "--compare" {
            a.compare = true;
            continue;
        }
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
            "usage: tokio_echo [--conns N] [--bytes B]              (virtual wire)\n       tokio_echo --compare                            (tokio vs blocking)\n       tokio_echo --iface IFACE --addr ADDR/PREFIX [--port P]   (AF_XDP server, root)"
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
        _ if args.compare => compare().await,
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
