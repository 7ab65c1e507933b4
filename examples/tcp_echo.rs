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
use std::sync::atomic::AtomicBool;

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

/// Accept connections until `stop` is set or the listener fails, one thread each
/// ([`xdp_server::accept_until`]). Returns the number of connections accepted.
pub fn serve_until(listener: TcpListener, stop: &AtomicBool) -> u64 {
    xdp_server::accept_until("tcp_echo", listener, stop, echo)
}

fn main() -> ExitCode {
    xdp_server::run(
        "tcp_echo",
        7,
        |a, p, i| format!("echoing on {a}:{p} ({i})"),
        serve_until,
    )
}
