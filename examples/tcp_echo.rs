//! tcp_echo — a TCP echo server on the xwarp engine over AF_XDP (root).
//!
//! ```text
//! ip netns exec NS tcp_echo --ifname veth-a --ip 10.88.1.10/24 [--port 7]
//! nc -N 10.88.1.10 7 < in > out && cmp in out           # from a peer namespace
//! ```
//!
//! Every connection gets its own thread that writes back what it reads; at end of stream
//! it sends FIN after the echoed bytes. Tests include this file as a module and call
//! [`serve_until`] / [`echo`].
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use xwarp::net::{Shutdown, TcpListener, TcpStream};
use xwarp::toe::{start_xdp_engine, XdpEngineConfig};

/// Echo one connection until the peer's FIN; returns the bytes echoed.
pub fn echo(mut s: TcpStream) -> io::Result<u64> {
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n])?;
        total += n as u64;
    }
    s.shutdown(Shutdown::Write)?;
    Ok(total)
}

/// Accept connections until `stop` is set or the listener fails, one thread each.
/// Returns the number of connections accepted.
///
/// The accept is non-blocking with a 1 ms nap while idle: a blocking `accept` is not woken
/// when the engine stops (reported to the stack owner; see `tests/xdp_tcp.rs`,
/// `blocked_accept_returns_when_engine_stops`), so a blocking loop could never be ended.
pub fn serve_until(mut listener: TcpListener, stop: &AtomicBool) -> u64 {
    let mut accepted = 0;
    if let Err(e) = listener.set_nonblocking(true) {
        eprintln!("tcp_echo: {e}");
        return 0;
    }
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, peer)) => {
                accepted += 1;
                std::thread::spawn(move || {
                    if let Err(e) = echo(s) {
                        eprintln!("tcp_echo: {peer}: {e}");
                    }
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => {
                eprintln!("tcp_echo: accept: {e}");
                break;
            }
        }
    }
    accepted
}

fn usage() -> ExitCode {
    eprintln!("usage: tcp_echo --ifname IFACE --ip ADDR/PREFIX [--port PORT]");
    ExitCode::from(2)
}

fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, p) = s.split_once('/')?;
    let p: u8 = p.parse().ok()?;
    (p <= 32).then_some(())?;
    Some((a.parse().ok()?, p))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut ifname, mut ip, mut port) = (None, None, 7u16);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.next()) {
            ("--ifname", Some(v)) => ifname = Some(v.clone()),
            ("--ip", Some(v)) => match parse_cidr(v) {
                Some(c) => ip = Some(c),
                None => return usage(),
            },
            ("--port", Some(v)) => match v.parse() {
                Ok(p) if p != 0 => port = p,
                _ => return usage(),
            },
            _ => return usage(),
        }
    }
    let (Some(ifname), Some((addr, prefix))) = (ifname, ip) else {
        return usage();
    };
    let engine = match start_xdp_engine(None, XdpEngineConfig::new(&ifname, addr, prefix)) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("tcp_echo: starting the engine on {ifname}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(engine.stack(), SocketAddr::from((addr, port))) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tcp_echo: listen on {addr}:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("tcp_echo: echoing on {addr}:{port} ({ifname})");
    serve_until(listener, &AtomicBool::new(false));
    ExitCode::FAILURE
}
