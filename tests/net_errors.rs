//! Error paths and socket semantics of `xwarp::net` over the virtual wire.

mod net_common;

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use net_common::{addr, fill, pair_config, send_stream, StreamHash, STEP};
use xwarp::net::{vwire_pair, vwire_pair_with, TcpListener, TcpStream};
use xwarp::poll_driver::engine::{EngineConfig, EngineMode, InlineConfig};
use xwarp::poll_driver::vwire::WireConfig;

#[test]
fn connect_to_closed_port_is_refused() {
    let (a, _b) = vwire_pair(WireConfig::default()).unwrap();
    let e = TcpStream::connect(a.stack(), addr(2, 4444)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
}

#[test]
fn connect_to_silent_host_times_out() {
    let (a, _b) = vwire_pair(WireConfig::default()).unwrap();
    let t = Instant::now();
    // Nobody owns .9: ARP is never answered, no SYN-ACK ever comes.
    let e =
        TcpStream::connect_timeout(a.stack(), addr(9, 80), Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn bind_twice_is_addr_in_use() {
    let (_a, b) = vwire_pair(WireConfig::default()).unwrap();
    let _l = TcpListener::bind(b.stack(), addr(2, 80)).unwrap();
    let e = TcpListener::bind(b.stack(), addr(2, 80)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AddrInUse);
}

#[test]
fn read_timeout_expires_then_data_still_arrives() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let l = TcpListener::bind(b.stack(), addr(2, 81)).unwrap();
    let mut c = TcpStream::connect(a.stack(), addr(2, 81)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    c.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert_eq!(c.read_timeout().unwrap(), Some(Duration::from_millis(100)));
    assert_eq!(
        c.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let e = c.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut);
    assert!(t.elapsed() >= Duration::from_millis(100));
    s.write_all(b"late").unwrap();
    c.read_exact(&mut buf[..4]).unwrap();
    assert_eq!(&buf[..4], b"late");
}

#[test]
fn nonblocking_read_would_block_and_readiness_fd_fires() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let l = TcpListener::bind(b.stack(), addr(2, 82)).unwrap();
    let mut l = l;
    l.set_nonblocking(true).unwrap();
    assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    let mut c = TcpStream::connect(a.stack(), addr(2, 82)).unwrap();
    let (mut s, _) = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match l.accept() {
                Ok(x) => break x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline);
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
    };
    s.set_nonblocking(true).unwrap();
    // The descriptor may still hold the "established" edge: consume it.
    let _ = s.wait(Some(Duration::from_millis(1))).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(s.read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    // Nothing pending: the readiness descriptor stays quiet.
    assert!(!s.wait(Some(Duration::from_millis(20))).unwrap());
    c.write_all(b"wake").unwrap();
    // After the WouldBlock the descriptor fires once data is there.
    assert!(s.wait(Some(Duration::from_secs(10))).unwrap());
    assert_eq!(s.read(&mut buf).unwrap(), 4);
    assert_eq!(&buf[..4], b"wake");
}

#[test]
fn shutdown_write_gives_eof_at_peer_and_peer_can_still_send() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let l = TcpListener::bind(b.stack(), addr(2, 83)).unwrap();
    let mut c = TcpStream::connect(a.stack(), addr(2, 83)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    c.write_all(b"request").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(c.write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
    let mut req = Vec::new();
    s.read_to_end(&mut req).unwrap();
    assert_eq!(req, b"request");
    // Half-closed: the other direction still works.
    s.write_all(b"response").unwrap();
    drop(s);
    let mut resp = Vec::new();
    c.read_to_end(&mut resp).unwrap();
    assert_eq!(resp, b"response");
}

#[test]
fn abort_resets_the_peer() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let l = TcpListener::bind(b.stack(), addr(2, 84)).unwrap();
    let c = TcpStream::connect(a.stack(), addr(2, 84)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    c.abort().unwrap();
    let mut buf = [0u8; 8];
    let e = s.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset);
    assert_eq!(
        s.write(b"x").unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
}

/// Linux semantics: a SYN that finds the accept queue full is dropped (`ListenOverflows`),
/// not refused, so the client retransmits it and gets in once `accept` made room.
#[test]
fn listen_backlog_overflow_drops_syns_until_accept_makes_room() {
    let cfg = pair_config(|_| {});
    let (a, b) = vwire_pair_with(cfg).unwrap();
    let l = TcpListener::bind_with_backlog(b.stack(), addr(2, 85), 2).unwrap();
    let mut c1 = TcpStream::connect(a.stack(), addr(2, 85)).unwrap();
    let _c2 = TcpStream::connect(a.stack(), addr(2, 85)).unwrap();
    // Two established, none accepted: the queue is full, the next SYN goes unanswered.
    let e =
        TcpStream::connect_timeout(a.stack(), addr(2, 85), Duration::from_millis(400)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "no RST for a full backlog");
    assert!(b.stack().stats().syn_dropped_backlog >= 1);
    // A client that keeps trying gets in once a connection is accepted.
    let stack_a = a.stack().clone();
    let waiting = std::thread::spawn(move || {
        TcpStream::connect_timeout(&stack_a, addr(2, 85), Duration::from_secs(10))
    });
    std::thread::sleep(Duration::from_millis(200));
    // Data sent before accept waits in the queued connection.
    c1.write_all(b"queued").unwrap();
    let (mut s1, peer) = l.accept().unwrap();
    assert_eq!(peer, c1.local_addr().unwrap());
    let mut buf = [0u8; 6];
    s1.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"queued");
    let mut c3 = waiting
        .join()
        .unwrap()
        .expect("the retransmitted SYN gets in");
    let (_s2, _) = l.accept().unwrap();
    let (mut s3, peer3) = l.accept().unwrap();
    assert_eq!(peer3, c3.local_addr().unwrap());
    c3.write_all(b"late").unwrap();
    let mut four = [0u8; 4];
    s3.read_exact(&mut four).unwrap();
    assert_eq!(&four, b"late");
    assert!(b.stack().stats().accepted >= 3);
}

#[test]
fn closed_sockets_are_recycled() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let l = TcpListener::bind(b.stack(), addr(2, 86)).unwrap();
    for i in 0..20u8 {
        let mut c = TcpStream::connect(a.stack(), addr(2, 86)).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(&[i]).unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one).unwrap();
        assert_eq!(one[0], i);
        // The server closes first, so the server side holds TIME-WAIT and the client
        // side is recycled as soon as its LAST-ACK is acknowledged.
        drop(s);
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.stack().stats().recycled < 20 {
        assert!(
            Instant::now() < deadline,
            "client sockets not recycled: {:?}",
            a.stack().stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn ipv6_connect_and_exchange() {
    use std::net::{Ipv6Addr, SocketAddr};
    let mut cfg = pair_config(|_| {});
    cfg.a.ipv6 = Some((Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1), 64));
    cfg.b.ipv6 = Some((Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2), 64));
    let (a, b) = vwire_pair_with(cfg).unwrap();
    let server: SocketAddr = "[fd00::2]:90".parse().unwrap();
    let l = TcpListener::bind(b.stack(), server).unwrap();
    let mut c = TcpStream::connect(a.stack(), server).unwrap();
    let (mut s, peer) = l.accept().unwrap();
    assert_eq!(peer, c.local_addr().unwrap());
    assert_eq!(c.peer_addr().unwrap(), server);
    let msg: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    c.write_all(&msg).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert!(got == msg);
}

/// `tcp_fin_timeout` bounds a close that stopped moving, not one still delivering its
/// queued bytes: the client closes with about 1.3 MiB still queued (its ring and send
/// buffer) while the server reads slowly through small buffers, so the client's
/// FIN-WAIT-1 lasts several times the 150 ms `fin_timeout` (its FIN-WAIT-2, the server
/// draining its own small buffers, a fraction of it). Every byte arrives, then end of
/// stream, in both engine modes. Before, the close was aborted after `fin_timeout`
/// however much was still being acknowledged and the reader got `ConnectionReset`:
/// `inline_driving_from_several_threads_loses_nothing` hit that whenever its transfer
/// ran on past the default 60 s after a client's close.
#[test]
fn fin_timeout_does_not_abort_a_close_that_is_still_draining() {
    for inline in [false, true] {
        let mut cfg = pair_config(|c| c.fin_timeout = Duration::from_millis(150));
        cfg.b.rx_buffer = 32 << 10;
        cfg.b.ring_size = 32 << 10;
        if inline {
            cfg.engine = EngineConfig {
                mode: EngineMode::Inline(InlineConfig::default()),
                ..EngineConfig::default()
            };
        }
        let (a, b) = vwire_pair_with(cfg).unwrap();
        let listener = TcpListener::bind(b.stack(), addr(2, 30)).unwrap();
        let total = 2u64 << 20;
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut h = StreamHash::default();
            let (mut buf, mut expect) = (vec![0u8; 32 << 10], vec![0u8; 32 << 10]);
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    return Ok::<_, std::io::Error>((h.finish(), Instant::now()));
                }
                fill(31, h.len, &mut expect[..n]);
                assert_eq!(&buf[..n], &expect[..n], "bytes at {} differ", h.len);
                h.update(&buf[..n]);
                // At most 1.6 MB/s: what is queued at the close drains in ~0.8 s.
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let t = Instant::now();
        let mut c = TcpStream::connect(a.stack(), addr(2, 30)).unwrap();
        let sent = send_stream(&mut c, 31, total, 64 << 10).unwrap();
        let queued = c.tcp_info().unwrap().send_queue as u64 + c.unsent() as u64;
        drop(c);
        let closed = Instant::now();
        let (got, eof) = server.join().unwrap().unwrap_or_else(|e| {
            panic!("inline {inline}: the reader got {e} ({queued} bytes queued at the close)")
        });
        assert_eq!(got, sent, "inline {inline}");
        // The scenario holds: the drain outlasted fin_timeout several times over.
        assert!(
            eof - closed > Duration::from_millis(450),
            "inline {inline}: drained in {:?} ({queued} bytes queued)",
            eof - closed
        );
        assert!(
            t.elapsed() < STEP,
            "inline {inline}: took {:?}",
            t.elapsed()
        );
        assert_eq!(a.stack().stats().resets, 0, "inline {inline}");
    }
}
