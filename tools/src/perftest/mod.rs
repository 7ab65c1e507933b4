//! perftest-style RDMA benchmarks over `xwarp::verbs` (the `write_bw`, `write_lat`,
//! `read_bw`, `read_lat`, `send_bw`, `send_lat` examples call [`main`]).
//!
//! # Usage
//!
//! One end per process, as with perftest's `ib_write_bw` / `ib_write_bw <host>`: each
//! process runs an AF_XDP verbs engine ([`Context::start_xdp`]) that owns its own IPv4
//! address on a real interface (an address the kernel does not have; root):
//!
//! ```text
//! server:  write_bw --iface IF --addr A.B.C.D/PREFIX [--gateway G] [-p PORT] [options]
//! client:  write_bw --iface IF --addr E.F.G.H/PREFIX [--gateway G] [-p PORT] [options] A.B.C.D
//! ```
//!
//! The server prints `Waiting for client to connect on A.B.C.D:PORT`, serves one client
//! and exits; both ends print the perftest-style report (the server prints the results
//! the client measured). The client sends its run parameters and buffer address in the
//! MPA private data of each connection request; a server started with different `-s`,
//! `-n`, `-D`, `-q` or `--verify` rejects the connection, and both ends say why.
//!
//! Both ends in one process: `--vwire` over the in-process virtual wire (`--loss P` adds
//! loss, reordering and duplication); `--veth` on two AF_XDP verbs engines over a veth
//! pair between two network namespaces it creates (root; [`run_veth`]).
//!
//! Options (shared by all six tools): `-s SIZE`, `-n ITERATIONS`, `-D SECONDS`,
//! `-q QPS` (bandwidth tests), `-t TX_DEPTH`, `-p PORT`, `--no-crc` (MPA CRC32c is on by
//! default; CRC is used when either end asks for it), `--verify`.
//!
//! # Data verification (`--verify`)
//!
//! Off by default as in perftest. The sender fills every message with a pattern derived
//! from (QP, iteration, byte offset) before posting it; the receiver checks it:
//! * `write_bw`: the server checks, after the client's final message, that every buffer
//!   slot holds the pattern of the last iteration written to it;
//! * `send_bw`: the server checks every receive as it completes;
//! * `read_bw`, `read_lat`: the server fills its buffer once (the pattern of each slot);
//!   the client clears the target slot before each Read and checks it on completion;
//! * `write_lat`, `send_lat`: both ends check every iteration (ping and pong).
//!
//! A mismatch fails the run with the QP, the iteration and the first differing byte;
//! the server reports its failures to the client, so both ends exit non-zero. With
//! verification on, bandwidth tests keep at most one message per buffer slot in flight.
//!
//! # Flow
//!
//! Send tests use a credit scheme (iWARP has no RNR retry): the receiver grants credits
//! for the receives it re-posted, the sender never has more Sends in flight than
//! credits. Every receive the client needs is posted before it connects, every receive
//! the server needs before it accepts. At the end the client sends a DONE message
//! (Send with Solicited Event) on every QP after its data (so the server knows all data
//! is placed) carrying its iteration count and its result line; the server checks, then
//! answers with a FIN message (success, or the error text) on QP 0.
//!
//! Bounds: connecting gives up after 10 s; a client gives up after 10 s without
//! progress; the servers of the Send and Write-latency tests give up after 15 s without
//! hearing from their client. The servers of `write_bw`, `read_bw` and `read_lat` are
//! passive (the client's Writes and Reads need no help from them): they wait for DONE
//! or a connection event, and a client that vanished without closing leaves them
//! waiting until interrupted, as with perftest.

mod bw;
mod lat;
mod opts;
mod pattern;
mod proto;
mod report;
mod session;
mod side;

use clap::error::ErrorKind;
use opts::USAGE;

use crate::cli::clap_message;
pub use opts::{parse, Opts, Test};
use proto::{e2s, SILENCE};
pub use session::Outcome;
use session::*;
use side::*;

use std::ffi::OsString;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use xwarp::poll_driver::backend::Backend;
use xwarp::poll_driver::vwire::{LinkConfig, WireConfig};

use xwarp::net::PairConfig;
use xwarp::verbs::{vwire_pair, Context};

/// Entry point of the example binaries: parse the command line, run, print the report.
/// Exit status 2 for a bad command line, 1 for a failed run.
pub fn main(test: Test) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let parsed = opts::cli(test, args).map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            // Help and version go to stdout, exit status 0.
            let _ = e.print();
            None
        }
        _ => Some(clap_message(&e)),
    });
    let o = match parsed.and_then(|c| opts::from_cli(test, c).map_err(Some)) {
        Ok(o) => o,
        Err(None) => return ExitCode::SUCCESS,
        Err(Some(e)) => {
            eprintln!("{}: {e}", test.bin_name());
            eprintln!("{}", USAGE.replace("TEST", test.bin_name()));
            return ExitCode::from(2);
        }
    };
    if o.veth {
        // Ctrl-C / SIGTERM: remove the namespaces and their veth pair.
        if let Err(e) = crate::bench::common::install_teardown(test.bin_name()) {
            eprintln!(
                "{}: cannot install the signal handler: {e}",
                test.bin_name()
            );
        }
    }
    match run(test, &o) {
        Ok(out) => {
            let json = o.json.as_deref();
            if json == Some(std::path::Path::new("-")) {
                // stdout carries the JSON alone; the table goes to stderr.
                eprint!("{}", out.text);
            } else {
                print!("{}", out.text);
                let _ = std::io::stdout().flush();
            }
            if let (Some(path), Some(rep)) = (json, &out.report) {
                if let Err(e) = rep.write_json(path) {
                    eprintln!("{}: {e}", test.bin_name());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", test.bin_name());
            ExitCode::FAILURE
        }
    }
}

/// Run the test as `o` says (`--veth`, `--vwire` or `--iface`): the report and, for a
/// client, its bench-schema report (`--json`).
pub fn run(test: Test, o: &Opts) -> Result<Outcome, String> {
    if o.veth {
        veth(test, o)
    } else if o.vwire {
        vwire(test, o)
    } else {
        iface(test, o)
    }
}

/// Run the test with both ends in this process over the virtual wire; the client's report.
pub fn run_vwire(test: Test, o: &Opts) -> Result<String, String> {
    vwire(test, o).map(|r| r.text)
}

/// Run the test with both ends in this process on two AF_XDP verbs engines over a veth
/// pair between two network namespaces (`10.88.<net>.10` and `.20`, `net` 95; root).
pub fn run_veth(test: Test, o: &Opts) -> Result<String, String> {
    veth(test, o).map(|r| r.text)
}

/// Run one end in this process on an AF_XDP verbs engine on `o.iface` with address
/// `o.addr`: the client when `o.host` is set (returns its report), the server otherwise
/// (serves one client, returns its report). Root is needed.
pub fn run_iface(test: Test, o: &Opts) -> Result<String, String> {
    iface(test, o).map(|r| r.text)
}

fn vwire(test: Test, o: &Opts) -> Result<Outcome, String> {
    let link = |seed| LinkConfig {
        drop: o.loss,
        reorder: o.loss,
        duplicate: o.loss,
        ..LinkConfig::seeded(seed)
    };
    // Room for every QP's full TCP window in flight: the wire's queue is a buffer, not
    // a bottleneck to be found by loss.
    let wire = WireConfig {
        a_to_b: link(1),
        b_to_a: link(2),
        queue_depth: (1024 * o.qps).clamp(1024, 1 << 20),
        ..WireConfig::default()
    };
    let mut pair = PairConfig {
        wire,
        ..PairConfig::default()
    };
    pair.engine.spin = ENGINE_SPIN;
    let (a, b) = vwire_pair(pair).map_err(e2s)?;
    let transport = if o.loss > 0.0 {
        format!("in-process virtual wire, loss {}", o.loss)
    } else {
        "in-process virtual wire".to_string()
    };
    run_pair(test, o, &a, &b, Ipv4Addr::new(10, 77, 0, 2), &transport)
}

fn veth(test: Test, o: &Opts) -> Result<Outcome, String> {
    let net = xwarp::poll_driver::netns::VethPair::new(95).map_err(e2s)?;
    let a_ip = Ipv4Addr::new(10, 88, 95, 10);
    let b_ip = Ipv4Addr::new(10, 88, 95, 20);
    let cfg = |ifname: &str, ip, name: &str| {
        let mut c = xwarp::toe::XdpEngineConfig::new(ifname, ip, 24);
        // Both ends are xwarp engines: every checksum is complete.
        c.rx_checksum = xwarp::toe::RxChecksum::Verify;
        c.engine.name = name.into();
        c.engine.spin = ENGINE_SPIN;
        c
    };
    let a = Context::start_xdp(Some(&net.a), cfg(&net.if_a, a_ip, "perftest-a")).map_err(e2s)?;
    let b = Context::start_xdp(Some(&net.b), cfg(&net.if_b, b_ip, "perftest-b")).map_err(e2s)?;
    let r = run_pair(test, o, &a, &b, b_ip, "AF_XDP on a veth pair");
    // The engines stop before the namespaces go away.
    drop((a, b));
    drop(net);
    r
}

fn iface(test: Test, o: &Opts) -> Result<Outcome, String> {
    let iface = o.iface.as_deref().ok_or("--iface is required")?;
    let (ip, prefix) = o.addr.ok_or("--addr A.B.C.D/PREFIX is required")?;
    // Resolve the server before starting anything.
    let server = o.host.as_deref().map(|h| resolve(h, o.port)).transpose()?;
    let mut cfg = xwarp::toe::XdpEngineConfig::new(iface, ip, prefix);
    // The peer is another xwarp engine or a host behind a real NIC: verify every checksum.
    cfg.rx_checksum = xwarp::toe::RxChecksum::Verify;
    cfg.stack.ipv4_gateway = o.gateway;
    cfg.engine.spin = ENGINE_SPIN;
    cfg.engine.name = format!(
        "{}-{}",
        test.name(),
        if server.is_some() { "client" } else { "server" }
    );
    let ctx = Context::start_xdp(None, cfg)
        .map_err(|e| format!("cannot start an AF_XDP verbs engine on {iface}: {e}"))?;
    let transport = format!("AF_XDP on {iface}");
    match server {
        Some(addr) => client_session(&ctx, test, o, addr, &transport),
        None => {
            let stop = AtomicBool::new(false);
            let listening = |a: SocketAddr| {
                println!(" Waiting for client to connect on {a} ...");
                let _ = std::io::stdout().flush();
            };
            server_session(
                &ctx,
                test,
                o,
                SocketAddr::from((ip, o.port)),
                &stop,
                listening,
                &transport,
            )
            .map(|text| Outcome { text, report: None })
        }
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(SocketAddr::from((ip, port)));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or(format!("{host} has no IPv4 address"))
}

/// Run the test between engine `a` (client) and engine `b` (server at `server`): the
/// server's part on a thread, the client's here; returns the client's report.
fn run_pair<B: Backend + Send + 'static>(
    test: Test,
    o: &Opts,
    a: &Context<B>,
    b: &Context<B>,
    server: Ipv4Addr,
    transport: &str,
) -> Result<Outcome, String> {
    let addr = SocketAddr::from((server, o.port));
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::channel();
        let srv = sc.spawn(|| {
            let listening = move |_| {
                let _ = tx.send(());
            };
            server_session(b, test, o, addr, &stop, listening, transport)
        });
        let r = match rx.recv_timeout(SILENCE) {
            Ok(()) => client_session(a, test, o, addr, transport),
            Err(_) => Err("the server did not start listening".into()),
        };
        if r.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let s = srv.join().map_err(|_| "server panicked".to_string())?;
        match (r, s) {
            (Ok(report), Ok(_)) => Ok(report),
            (Err(e), Err(se)) if e.contains("server did not start") => Err(se),
            (Err(e), _) => Err(e),
            (Ok(_), Err(se)) => Err(format!("server: {se}")),
        }
    })
}

// ---------------------------------------------------------------------------------------
// Measurements.

#[cfg(test)]
mod tests {
    use super::*;
    use super::{opts::*, pattern::*, proto::*};
    use std::time::Duration;
    use xwarp::verbs::{CmEvent, ConnectParams, SendRequest, Stag};

    fn params(test: Test) -> Params {
        Params {
            test,
            size: 4096,
            iters: 100,
            duration: None,
            qps: 2,
            verify: true,
        }
    }

    #[test]
    fn pattern_depends_on_tag_and_offset_and_finds_the_first_difference() {
        let mut a = vec![0u8; 100];
        pattern(tag(0, 1, 7), &mut a);
        assert_eq!(first_mismatch(tag(0, 1, 7), &a), None);
        // Another iteration, QP or direction gives other bytes.
        for other in [tag(0, 1, 8), tag(0, 2, 7), tag(1, 1, 7)] {
            assert!(first_mismatch(other, &a).is_some());
        }
        // Words differ from each other (a shifted copy does not verify).
        assert_ne!(a[0..8], a[8..16]);
        let mut b = a.clone();
        b[93] ^= 0x40;
        assert_eq!(
            first_mismatch(tag(0, 1, 7), &b),
            Some((93, a[93] ^ 0x40, a[93]))
        );
        // A prefix of the pattern is the pattern of the shorter message.
        let mut c = vec![0u8; 13];
        pattern(tag(0, 1, 7), &mut c);
        assert_eq!(c, a[..13]);
    }

    #[test]
    fn request_private_data_round_trips_and_bad_data_is_an_error() {
        let p = params(Test::WriteBw);
        let r = Remote {
            rkey: Stag(0x1234_5601),
            addr: 0x7f00_0000_1000,
            len: p.buf_len(false).unwrap() as u64,
        };
        let b = encode_request(&p, 1, &r);
        assert!(b.len() <= 251, "fits siw's private data limit");
        assert_eq!(decode_request(&b), Ok((p.clone(), 1, r)));
        // Every truncation is an error, never a panic.
        for n in 0..b.len() {
            assert!(decode_request(&b[..n]).is_err(), "truncated to {n}");
        }
        let mut bad = b.clone();
        bad[0] = b'Y';
        assert!(decode_request(&bad).unwrap_err().contains("magic"));
        // QP index 9 of 2.
        let mut bad = b.clone();
        bad[11] = 9;
        assert!(decode_request(&bad).is_err());
        let mut short_buf = r;
        short_buf.len = 10;
        assert!(decode_request(&encode_request(&p, 0, &short_buf)).is_err());
        // Accept and reject data.
        let acc = encode_accept(&Remote {
            len: p.buf_len(true).unwrap() as u64,
            ..r
        });
        assert_eq!(decode_accept(&acc, &p).unwrap().rkey, r.rkey);
        assert!(decode_accept(&acc[..10], &p).is_err());
        assert_eq!(decode_reject(&encode_reject("-s differs")), "-s differs");
        assert_eq!(decode_reject(b"junk"), "no reason given");
    }

    #[test]
    fn server_names_every_differing_option() {
        let s = params(Test::SendBw);
        assert_eq!(s.mismatch(&s), None);
        let c = Params {
            size: 64,
            qps: 1,
            verify: false,
            ..s.clone()
        };
        let why = s.mismatch(&c).unwrap();
        assert!(why.contains("-s 64 (server 4096)"), "{why}");
        assert!(why.contains("-q 1 (server 2)"), "{why}");
        assert!(why.contains("--verify off (server on)"), "{why}");
        let other = params(Test::WriteBw);
        assert!(s.mismatch(&other).unwrap().contains("write_bw"));
        // -n does not matter in duration mode.
        let d = Params {
            duration: Some(Duration::from_secs(2)),
            ..s.clone()
        };
        let d2 = Params {
            iters: 5,
            ..d.clone()
        };
        assert_eq!(d.mismatch(&d2), None);
    }

    #[test]
    fn bad_command_lines_are_errors() {
        let p = |a: &[&str]| parse(Test::WriteBw, a.iter().map(Into::into).collect());
        assert!(p(&[]).unwrap_err().contains("--iface"));
        assert!(p(&["--iface", "eth0"]).unwrap_err().contains("--addr"));
        assert!(p(&["--iface", "eth0", "--addr", "10.0.0.1"])
            .unwrap_err()
            .contains("PREFIX"));
        assert!(p(&["--iface", "eth0", "--addr", "10.0.0.1/33"]).is_err());
        assert!(p(&["--vwire", "10.0.0.1"]).unwrap_err().contains("--iface"));
        assert!(p(&["--vwire", "--veth"]).is_err());
        assert!(p(&["--vwire", "-s", "x"]).unwrap_err().contains("-s"));
        assert!(p(&["--vwire", "-s"]).unwrap_err().contains("needs a value"));
        assert!(p(&["--vwire", "-p", "0"]).is_err());
        assert!(p(&["--vwire", "--bogus"]).unwrap_err().contains("--bogus"));
        assert!(p(&["--veth", "--loss", "0.01"]).is_err());
        let o = p(&[
            "--iface",
            "eth0",
            "--addr",
            "10.0.0.1/24",
            "--gateway",
            "10.0.0.254",
            "--no-crc",
            "--verify",
            "10.0.0.2",
        ])
        .unwrap();
        assert_eq!(o.addr, Some((Ipv4Addr::new(10, 0, 0, 1), 24)));
        assert_eq!(o.gateway, Some(Ipv4Addr::new(10, 0, 0, 254)));
        assert!(!o.crc && o.verify);
        assert_eq!(o.host.as_deref(), Some("10.0.0.2"));
    }

    /// A client that sends one wrong byte: the server's verification names the message
    /// and the byte, and the client learns it from the FIN.
    #[test]
    fn server_verification_catches_a_wrong_byte_and_tells_the_client() {
        for (test, what) in [
            (Test::WriteBw, "RDMA Write 7 on QP 0: byte 123 of 1000"),
            (Test::SendBw, "Send 7 on QP 0: byte 123 of 1000"),
        ] {
            let (a, b) = vwire_pair(PairConfig::default()).unwrap();
            let args = ["--vwire", "--verify", "-s", "1000", "-n", "20"];
            let o = parse(test, args.iter().map(Into::into).collect()).unwrap();
            let p = Params::of(test, &o);
            let addr = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 2), o.port));
            let stop = AtomicBool::new(false);
            std::thread::scope(|sc| {
                let (tx, rx) = std::sync::mpsc::channel();
                let srv = sc.spawn(|| {
                    let listening = move |_| {
                        let _ = tx.send(());
                    };
                    server_session(&b, test, &o, addr, &stop, listening, "test")
                });
                rx.recv_timeout(SILENCE).unwrap();
                let c = make_side(&a, 1, 16, p.buf_len(false).unwrap(), true).unwrap();
                for k in 0..CTRL_RX {
                    post_ctrl_recv(&c, 0, k).unwrap();
                }
                let params = ConnectParams {
                    private_data: encode_request(&p, 0, &Remote::of(&c.buf)),
                    timeout: SILENCE,
                };
                c.qps[0].connect(addr, params).unwrap();
                let r = match c.qps[0].next_event(SILENCE).unwrap() {
                    CmEvent::Established { private_data, .. } => {
                        decode_accept(&private_data, &p).unwrap()
                    }
                    e => panic!("{e:?}"),
                };
                let mut scratch = Vec::new();
                // The right pattern, but for one byte of iteration 7 (its own slot).
                for seq in 0..8u64 {
                    let off = seq as usize * p.size;
                    put_pattern(&c.buf, off, p.size, tag(0, 0, seq), &mut scratch).unwrap();
                    if seq == 7 {
                        c.buf.write(off + 123, &[!scratch[123]]).unwrap();
                    }
                    let sge = c.buf.sge(off, p.size).unwrap();
                    let wr = match test {
                        Test::WriteBw => {
                            SendRequest::write(seq, vec![sge], r.rkey, r.addr + off as u64)
                        }
                        _ => SendRequest::send(seq, vec![sge]),
                    };
                    c.qps[0].post_send(wr).unwrap();
                    check(&c.scq.next(SILENCE).unwrap()).unwrap();
                }
                let e = client_finish(&p, &c, &[8], "").unwrap_err();
                assert!(
                    e.contains("the server reported: data verification failed"),
                    "{e}"
                );
                assert!(e.contains(what), "{e}");
                let se = srv.join().unwrap().unwrap_err();
                assert!(se.contains(what), "{se}");
            });
        }
    }

    #[test]
    fn buffer_layouts_hold_the_rings() {
        for t in Test::ALL {
            let p = Params {
                qps: if t.is_bw() { 2 } else { 1 },
                ..params(t)
            };
            assert!(p.buf_len(true).unwrap() >= p.size);
            assert!(p.buf_len(false).unwrap() >= p.size);
            assert!(p.rx() as u64 > GRANT - 1);
        }
        let huge = Params {
            size: 1 << 30,
            qps: 256,
            ..params(Test::WriteBw)
        };
        assert_eq!(huge.slots(), 1);
        assert_eq!(Test::from_code(0), None);
        for t in Test::ALL {
            assert_eq!(Test::from_code(t.code()), Some(t));
        }
    }
}
