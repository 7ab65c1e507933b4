//! Hostile peers against the connection manager over the virtual wire: a flood of MPA
//! Requests nobody accepts, peers that connect and never finish their Request, and a
//! legitimate connection that still gets through; plus the Read RTR's sink region.
//! Attackers are `xwarp::net` streams of the other engine writing MPA bytes by hand.

mod verbs_common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use verbs_common::*;
use xwarp::net::TcpStream;
use xwarp::poll_driver::vwire::WireConfig;
use xwarp::verbs::{
    CmEvent, CmStats, CompletionStatus, ConnectParams, Device, ListenConfig, SendRequest,
};

/// A Rev 1 MPA Request without flags or private data (docs/mpa.md §1.2).
fn mpa_request() -> Vec<u8> {
    let mut f = b"MPA ID Req Frame".to_vec();
    f.extend_from_slice(&[0x00, 0x01, 0x00, 0x00]);
    f
}

fn wait_stats(dev: &Device, what: &str, ok: impl Fn(&CmStats) -> bool) -> CmStats {
    let end = Instant::now() + T;
    loop {
        let s = dev.cm_stats().unwrap();
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < end, "waiting for {what}: {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Read the engine's answer to a Request: an MPA Reply with R=1 (reject), then EOF.
fn expect_reject_then_eof(s: &mut TcpStream) {
    s.set_read_timeout(Some(T)).unwrap();
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply).expect("a Reply");
    assert_eq!(&reply[..16], b"MPA ID Rep Frame");
    assert_ne!(reply[16] & 0x20, 0, "R=1 (rejected): {reply:02x?}");
    let mut pd = vec![0u8; usize::from(u16::from_be_bytes([reply[18], reply[19]]))];
    s.read_exact(&mut pd).expect("the Reply's private data");
    let mut rest = [0u8; 64];
    match s.read(&mut rest) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("{n} bytes after the reject Reply"),
    }
}

/// The connection was dropped (reset or closed) without any byte sent to it.
fn expect_dropped(s: &mut TcpStream) {
    s.set_read_timeout(Some(T)).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("{n} bytes sent to a peer that never finished its Request"),
    }
}

#[test]
fn hostile_mpa_request_flood_is_bounded_by_the_backlog_and_times_out() {
    const BACKLOG: usize = 4;
    const EXCESS: usize = 6;
    let (a, b) = pair(WireConfig::default());
    let port = 7400;
    let cfg = ListenConfig {
        backlog: BACKLOG,
        max_negotiating: 64,
        request_timeout: Duration::from_millis(1000),
        accept_timeout: Duration::from_millis(1500),
    };
    let listener = b.device().listen_with(server_addr(port), cfg).unwrap();
    let dev = b.device().clone();
    let base = dev.cm_stats().unwrap();
    assert_eq!(base.connections, 0);

    // The flood: full Requests beyond the backlog, half Requests, silent connections.
    let req = mpa_request();
    let mut full = Vec::new();
    for _ in 0..BACKLOG + EXCESS {
        let mut s = TcpStream::connect(a.stack(), server_addr(port)).unwrap();
        s.write_all(&req).unwrap();
        full.push(s);
        // One at a time, so the first BACKLOG are the held ones.
        let n = full.len();
        wait_stats(&dev, "request seen", |s| {
            s.pending + s.refused_backlog as usize == n
        });
    }
    let started = Instant::now();
    let mut half = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(a.stack(), server_addr(port)).unwrap();
        s.write_all(&req[..10]).unwrap();
        half.push(s);
    }
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(a.stack(), server_addr(port)).unwrap());
    }
    let s = wait_stats(&dev, "flood held", |s| s.negotiating == 8);
    assert_eq!(
        s.pending, BACKLOG,
        "pending requests bounded by the backlog"
    );
    assert_eq!(s.refused_backlog, EXCESS as u64);
    // Every excess Request was refused at once with R=1.
    for s in &mut full[BACKLOG..] {
        expect_reject_then_eof(s);
    }
    // The application takes one request and leaves the others queued.
    let taken = listener.get_request(T).unwrap();
    assert_eq!(dev.cm_stats().unwrap().pending, BACKLOG);

    // The peers that never finish their Request are dropped after request_timeout
    // (1 s here, not the 5 s default).
    let s = wait_stats(&dev, "negotiations timed out", |s| s.negotiating == 0);
    assert!(
        started.elapsed() < Duration::from_millis(3500),
        "request_timeout not applied: {:?}",
        started.elapsed()
    );
    assert_eq!(s.request_timeouts, 8);
    for s in half.iter_mut().chain(silent.iter_mut()) {
        expect_dropped(s);
    }
    // Requests nobody answers are rejected after accept_timeout, the taken one too.
    let s = wait_stats(&dev, "requests timed out", |s| s.pending == 0);
    assert_eq!(s.accept_timeouts, BACKLOG as u64);
    for s in &mut full[..BACKLOG] {
        expect_reject_then_eof(s);
    }
    // An answer after the timeout finds nothing.
    let late = end(&b, |_| {});
    let err = taken.accept(&late.qp, &[]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionAborted);

    // The expired requests still queued in the (bounded) channel do not take the
    // places of new ones: a new backlog's worth is held, nothing refused.
    let mut fresh = Vec::new();
    for _ in 0..BACKLOG {
        let mut s = TcpStream::connect(a.stack(), server_addr(port)).unwrap();
        s.write_all(&req).unwrap();
        fresh.push(s);
    }
    let s = wait_stats(&dev, "fresh requests held", |s| s.pending == BACKLOG);
    assert_eq!(s.refused_backlog, EXCESS as u64, "{s:?}");
    let mut got = Vec::new();
    while let Ok(r) = listener.get_request(Duration::from_millis(200)) {
        got.push(r);
    }
    assert_eq!(got.len(), BACKLOG, "only live requests are handed out");
    for r in got {
        r.reject(b"no").unwrap();
    }
    for s in &mut fresh {
        expect_reject_then_eof(s);
    }

    // Everything the flood held is released.
    drop((full, half, silent, fresh));
    wait_stats(&dev, "connections released", |s| s.connections == 0);
}

#[test]
fn hostile_mpa_request_flood_leaves_a_legitimate_connection_working() {
    const BACKLOG: usize = 4;
    let (a, b) = pair(WireConfig::default());
    let port = 7401;
    let cfg = ListenConfig {
        backlog: BACKLOG,
        max_negotiating: 64,
        request_timeout: Duration::from_millis(1000),
        accept_timeout: Duration::from_millis(800),
    };
    let listener = b.device().listen_with(server_addr(port), cfg).unwrap();
    let dev = b.device().clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The attacker keeps the backlog full: a new Request as soon as one is answered.
    let attacker = {
        let (stack, stop) = (a.stack().clone(), stop.clone());
        std::thread::spawn(move || {
            let mut live: Vec<TcpStream> = Vec::new();
            let mut sent = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                live.retain_mut(|s| {
                    s.set_nonblocking(true).unwrap();
                    let mut b = [0u8; 64];
                    s.read(&mut b).is_err()
                });
                if live.len() < 2 * BACKLOG {
                    if let Ok(mut s) = TcpStream::connect(&stack, server_addr(port)) {
                        if s.write_all(&mpa_request()).is_ok() {
                            sent += 1;
                            live.push(s);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            sent
        })
    };
    wait_stats(&dev, "backlog full", |s| s.pending == BACKLOG);

    // The server answers only the legitimate peer (its private data) and ignores the
    // attacker's requests, which time out; the client retries when refused.
    let server = end(&b, |_| {});
    let deadline = Instant::now() + T;
    let mut ignored = Vec::new();
    let mut attempts = 0;
    let legit;
    'connect: loop {
        assert!(
            Instant::now() < deadline,
            "legitimate connect never got through"
        );
        attempts += 1;
        let qp = end(&a, |_| {});
        qp.qp
            .connect(
                server_addr(port),
                ConnectParams {
                    private_data: b"legit".to_vec(),
                    timeout: T,
                },
            )
            .unwrap();
        let until = Instant::now() + Duration::from_secs(3);
        loop {
            if let Ok(r) = listener.get_request(Duration::from_millis(20)) {
                if r.private_data == b"legit" {
                    r.accept(&server.qp, b"welcome").unwrap();
                    match qp.qp.next_event(T).unwrap() {
                        CmEvent::Established { .. } => {}
                        e => panic!("client: {e:?}"),
                    }
                    // Keep this QP as the client.
                    assert!(run_data(&qp, &server), "data differs");
                    legit = qp;
                    break 'connect;
                }
                ignored.push(r);
            }
            if let Some(e) = qp.qp.poll_event() {
                assert!(
                    matches!(e, CmEvent::Rejected { .. } | CmEvent::ConnectError(_)),
                    "{e:?}"
                );
                break;
            }
            if Instant::now() > until {
                break;
            }
        }
    }
    // The backlog held throughout.
    let s = dev.cm_stats().unwrap();
    assert!(s.pending <= BACKLOG, "{s:?}");
    assert!(s.accept_timeouts > 0 || s.refused_backlog > 0, "{s:?}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = attacker.join().unwrap();
    assert!(sent > BACKLOG, "the attacker sent {sent} Requests");
    eprintln!("legitimate connect after {attempts} attempts; attacker sent {sent}; {s:?}");
    drop(ignored);
    // Once the attacker is gone, only the legitimate connection is left (refused
    // connections go after their close, TIME-WAIT included).
    wait_stats(&dev, "attack released", |s| {
        s.connections == 1 && s.pending == 0 && s.negotiating == 0
    });
    drop(legit);
}

/// An RDMA Write of a pattern and a Send from `c` to `s`, checked byte for byte.
fn run_data(c: &End, s: &End) -> bool {
    const LEN: usize = 256 * 1024;
    let src = mr(c, LEN);
    let dst = mr(s, LEN);
    let msg = mr(s, 64);
    let data = pattern(LEN, 0x5a);
    src.write(0, &data).unwrap();
    s.qp.post_recv(1, &[msg.sge(0, 64).unwrap()]).unwrap();
    c.qp.post_send(SendRequest::write(
        2,
        vec![src.sge(0, LEN).unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    c.qp.post_send(SendRequest::send(3, vec![src.sge(0, 16).unwrap()]))
        .unwrap();
    let w = wc(&c.scq);
    assert_eq!(w.status, CompletionStatus::Success, "{w:?}");
    let w = wc(&c.scq);
    assert_eq!(w.status, CompletionStatus::Success, "{w:?}");
    let r = wc(&s.rcq);
    assert_eq!(r.status, CompletionStatus::Success, "{r:?}");
    dst.to_vec(0, LEN).unwrap() == data && msg.to_vec(0, 16).unwrap() == data[..16]
}

#[test]
fn hostile_connection_flood_without_requests_is_bounded_by_max_negotiating() {
    let (a, b) = pair(WireConfig::default());
    let port = 7402;
    let cfg = ListenConfig {
        max_negotiating: 2,
        request_timeout: Duration::from_secs(30),
        ..ListenConfig::new(4)
    };
    let _listener = b.device().listen_with(server_addr(port), cfg).unwrap();
    let dev = b.device().clone();
    let mut silent = Vec::new();
    for n in 1..=5 {
        // A refused one may see its reset before `connect` returns.
        match TcpStream::connect(a.stack(), server_addr(port)) {
            Ok(s) => silent.push(Some(s)),
            Err(e) if n > 2 => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
                silent.push(None);
            }
            Err(e) => panic!("admitted connection {n}: {e}"),
        }
        // One at a time, so the first two are the admitted ones.
        wait_stats(&dev, "connection seen", |s| {
            s.negotiating + s.refused_negotiating as usize == n
        });
    }
    let s = wait_stats(&dev, "extra connections reset", |s| {
        s.refused_negotiating == 3
    });
    assert_eq!(s.negotiating, 2, "{s:?}");
    for s in silent[2..].iter_mut().flatten() {
        expect_dropped(s);
    }
    // The two admitted ones still complete their Request and are held.
    for s in silent[..2].iter_mut().flatten() {
        s.write_all(&mpa_request()).unwrap();
    }
    let s = wait_stats(&dev, "requests held", |s| s.pending == 2);
    assert_eq!(s.negotiating, 0);
    drop(silent);
    wait_stats(&dev, "connections released", |s| s.pending == 0);
}
