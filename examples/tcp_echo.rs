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

// Each example is its own crate; tests/xdp_tcp.rs includes both, hence two copies there.
#[allow(clippy::duplicate_mod)]
#[path = "support/xdp_server.rs"]
mod xdp_server;

use std::io::{self, Read, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use xwarp::net::{Shutdown, TcpListener, TcpStream};

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

fn main() -> ExitCode {
    xdp_server::run(
        "tcp_echo",
        7,
        |a, p, i| format!("echoing on {a}:{p} ({i})"),
        serve_until,
    )
}
