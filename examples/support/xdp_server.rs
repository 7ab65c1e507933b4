//! The command line and start-up shared by the AF_XDP server examples (`http_server`,
//! `tcp_echo`): `--ifname IFACE --ip ADDR/PREFIX [--port PORT]`, an engine on that
//! interface, one listener, then the example's accept loop. The library's log records go
//! to stderr through env_logger, filtered by `XWARP_LOG` (default `warn`).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use xwarp::net::{TcpListener, TcpStream};
use xwarp::toe::{start_xdp_engine, XdpEngineConfig};

/// Parse `ADDR/PREFIX`.
pub fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, p) = s.split_once('/')?;
    let p: u8 = p.parse().ok()?;
    (p <= 32).then_some(())?;
    Some((a.parse().ok()?, p))
}

/// Run example `name`: parse the command line (port `default_port` unless given), start
/// the engine, listen, print `banner(addr, port, ifname)` and hand the listener to `serve`
/// (which runs until the process ends, so this returns only on failure).
pub fn run(
    name: &str,
    default_port: u16,
    banner: impl Fn(Ipv4Addr, u16, &str) -> String,
    serve: fn(TcpListener, &AtomicBool) -> u64,
) -> ExitCode {
    let usage = || {
        eprintln!("usage: {name} --ifname IFACE --ip ADDR/PREFIX [--port PORT]");
        ExitCode::from(2)
    };
    let _ = env_logger::Builder::new()
        .parse_filters(&std::env::var("XWARP_LOG").unwrap_or_else(|_| "warn".into()))
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut ifname, mut ip, mut port) = (None, None, default_port);
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
            eprintln!("{name}: starting the engine on {ifname}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(engine.stack(), SocketAddr::from((addr, port))) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{name}: listen on {addr}:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("{name}: {}", banner(addr, port, &ifname));
    serve(listener, &AtomicBool::new(false));
    ExitCode::FAILURE
}

/// Accept connections until `stop` is set or the listener fails, serving each with
/// `handle` on a thread of its own (errors are logged with `name`). Returns the number of
/// connections accepted. The accept is non-blocking with a 1 ms nap while idle, so the
/// loop sees `stop` without a connection arriving.
pub fn accept_until<R: 'static>(
    name: &'static str,
    mut listener: TcpListener,
    stop: &AtomicBool,
    handle: fn(TcpStream) -> io::Result<R>,
) -> u64 {
    let mut accepted = 0;
    if let Err(e) = listener.set_nonblocking(true) {
        log::error!("{name}: {e}");
        return 0;
    }
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, peer)) => {
                accepted += 1;
                std::thread::spawn(move || {
                    if let Err(e) = handle(s) {
                        log::warn!("{name}: {peer}: {e}");
                    }
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => {
                log::error!("{name}: accept: {e}");
                break;
            }
        }
    }
    accepted
}
