//! http_server — a small HTTP/1.1 server on the xwarp TCP engine over AF_XDP (root).
//!
//! ```text
//! ip netns exec NS http_server --ifname veth-a --ip 10.88.1.10/24 [--port 8080]
//! curl -o out http://10.88.1.10:8080/bytes/16777216      # from a peer namespace
//! ```
//!
//! Routes (GET and HEAD):
//! * `/bytes/<N>`: `N` bytes of a deterministic pseudo-random stream ([`fill_body`] with
//!   seed 0), `/bytes/<N>?seed=<S>` with seed `S`, so a client can verify what it got;
//! * `/`: a short text page naming the routes.
//!
//! Every response carries `Content-Length` and `Connection: close`; one thread per
//! connection. The engine owns the `--ip` address: it must not be configured on the
//! kernel's interface (the steering program redirects only that address to the engine).
//! Tests include this file as a module and call [`serve_until`].
#![allow(dead_code)]

// Each example is its own crate; tests/xdp_tcp.rs includes both, hence two copies there.
#[allow(clippy::duplicate_mod)]
#[path = "support/xdp_server.rs"]
mod xdp_server;

use std::io::{self, Read, Write};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use xwarp::net::{Shutdown, TcpListener, TcpStream};

/// Largest request head accepted (request line + headers).
const MAX_HEAD: usize = 16 << 10;
/// Largest body served by `/bytes/<N>` (1 TiB: effectively "no limit" while parsing safely).
const MAX_BODY: u64 = 1 << 40;

/// Byte `offset + k` of body stream `seed` for every `k` in `buf` (8 bytes per
/// multiplicative hash, little-endian).
pub fn fill_body(seed: u64, offset: u64, buf: &mut [u8]) {
    for (k, b) in buf.iter_mut().enumerate() {
        let i = offset + k as u64;
        let x = ((i / 8) ^ seed.rotate_left(17))
            .wrapping_add(seed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        *b = x.to_le_bytes()[(i % 8) as usize];
    }
}

/// A parsed request line.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// `GET` or `HEAD`.
    pub head_only: bool,
    /// The request target (path and query).
    pub target: String,
}

/// What a request maps to.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// The index page.
    Index,
    /// `len` bytes of stream `seed`.
    Bytes {
        /// Body length.
        len: u64,
        /// Stream seed.
        seed: u64,
    },
    /// Unknown path.
    NotFound,
}

/// Map a request target to a route.
pub fn route(target: &str) -> Route {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if path == "/" {
        return Route::Index;
    }
    let Some(n) = path.strip_prefix("/bytes/") else {
        return Route::NotFound;
    };
    let Ok(len) = n.parse::<u64>() else {
        return Route::NotFound;
    };
    if len > MAX_BODY {
        return Route::NotFound;
    }
    let mut seed = 0;
    for kv in query.split('&') {
        if let Some(v) = kv.strip_prefix("seed=") {
            match v.parse() {
                Ok(s) => seed = s,
                Err(_) => return Route::NotFound,
            }
        }
    }
    Route::Bytes { len, seed }
}

/// Read the request head (up to the blank line) and parse its request line.
/// `Ok(None)`: the client closed before sending a request.
fn read_request(s: &mut TcpStream) -> io::Result<Option<Result<Request, &'static str>>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end);
            break;
        }
        if head.len() > MAX_HEAD {
            return Ok(Some(Err("431 Request Header Fields Too Large")));
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(if head.is_empty() {
                None
            } else {
                Some(Err("400 Bad Request"))
            });
        }
        head.extend_from_slice(&buf[..n]);
    }
    let Ok(text) = std::str::from_utf8(&head) else {
        return Ok(Some(Err("400 Bad Request")));
    };
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Ok(Some(Err("400 Bad Request")));
    };
    if !version.starts_with("HTTP/1.") {
        return Ok(Some(Err("505 HTTP Version Not Supported")));
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Ok(Some(Err("405 Method Not Allowed"))),
    };
    Ok(Some(Ok(Request {
        head_only,
        target: target.to_string(),
    })))
}

fn respond_status(s: &mut TcpStream, status: &str) -> io::Result<()> {
    let body = format!("{status}\n");
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Serve one connection: one request, one response, then close.
pub fn handle(mut s: TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    let req = match read_request(&mut s)? {
        None => return Ok(()),
        Some(Err(status)) => {
            respond_status(&mut s, status)?;
            return s.shutdown(Shutdown::Write);
        }
        Some(Ok(r)) => r,
    };
    match route(&req.target) {
        Route::NotFound => respond_status(&mut s, "404 Not Found")?,
        Route::Index => {
            let body = "xwarp http_server\n/bytes/<N>[?seed=<S>]: N deterministic bytes\n";
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )?;
            if !req.head_only {
                s.write_all(body.as_bytes())?;
            }
        }
        Route::Bytes { len, seed } => {
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
            )?;
            if !req.head_only {
                let mut buf = vec![0u8; 64 << 10];
                let mut off = 0u64;
                while off < len {
                    let n = (len - off).min(buf.len() as u64) as usize;
                    fill_body(seed, off, &mut buf[..n]);
                    s.write_all(&buf[..n])?;
                    off += n as u64;
                }
            }
        }
    }
    s.shutdown(Shutdown::Write)
}

/// Accept connections until `stop` is set or the listener fails, one thread each
/// ([`xdp_server::accept_until`]). Returns the number of connections accepted.
pub fn serve_until(listener: TcpListener, stop: &AtomicBool) -> u64 {
    xdp_server::accept_until("http_server", listener, stop, handle)
}

fn main() -> ExitCode {
    xdp_server::run(
        "http_server",
        8080,
        |a, p, i| format!("serving http://{a}:{p}/ on {i}"),
        serve_until,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("/"), Route::Index);
        assert_eq!(route("/bytes/10"), Route::Bytes { len: 10, seed: 0 });
        assert_eq!(route("/bytes/10?seed=7"), Route::Bytes { len: 10, seed: 7 });
        assert_eq!(route("/bytes/x"), Route::NotFound);
        assert_eq!(route("/bytes/10?seed=x"), Route::NotFound);
        assert_eq!(route("/other"), Route::NotFound);
    }

    #[test]
    fn body_is_offset_consistent() {
        let mut whole = vec![0u8; 1000];
        fill_body(3, 0, &mut whole);
        let mut part = vec![0u8; 333];
        fill_body(3, 501, &mut part);
        assert_eq!(&whole[501..834], &part[..]);
        let mut other = vec![0u8; 1000];
        fill_body(4, 0, &mut other);
        assert_ne!(whole, other);
    }
}
