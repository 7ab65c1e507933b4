//! Per-socket options of `xwarp::net` over the virtual wire (no root): linger,
//! keep-alive, buffer sizes and `TCP_INFO`, each proven by what the peer observes.

mod net_common;

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use net_common::{addr, recv_stream, send_stream};
use xwarp::net::{
    socket_buffer_size, vwire_pair, KeepAlive, SocketOptions, TcpListener, TcpStream,
};
use xwarp::poll_driver::vwire::WireConfig;

/// Connected (client on a, server on b) over a fresh pair.
fn connected(
    port: u16,
    client_opts: &SocketOptions,
    server_opts: &SocketOptions,
) -> (
    xwarp::net::NetEngine<xwarp::poll_driver::vwire::VirtualNic>,
    xwarp::net::NetEngine<xwarp::poll_driver::vwire::VirtualNic>,
    TcpStream,
    TcpStream,
) {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let l = TcpListener::bind_with(b.stack(), addr(2, port), 8, server_opts).unwrap();
    let c = TcpStream::connect_with(a.stack(), addr(2, port), client_opts).unwrap();
    let (s, _) = l.accept().unwrap();
    (a, b, c, s)
}

#[test]
fn linger_zero_close_sends_rst_and_the_peer_read_fails_with_connection_reset() {
    let d = SocketOptions::default();
    let (_a, b, mut c, mut s) = connected(7101, &d, &d);
    c.write_all(b"before the reset").unwrap();
    let mut buf = [0u8; 16];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"before the reset");
    let resets_before = b.stack().stats().resets;
    c.set_linger(Some(Duration::ZERO)).unwrap();
    assert_eq!(c.linger().unwrap(), Some(Duration::ZERO));
    c.close().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let e = s.read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    // The peer's engine counted a reset: it was an RST on the wire, not a FIN. (Stats
    // are published at the end of the engine's poll, possibly after the read saw it.)
    let t = Instant::now();
    while b.stack().stats().resets == resets_before && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.stack().stats().resets, resets_before + 1);
}

#[test]
fn dropping_a_linger_zero_stream_resets_too() {
    let d = SocketOptions::default();
    let (_a, _b, mut c, mut s) = connected(7102, &d, &d);
    c.set_linger(Some(Duration::ZERO)).unwrap();
    drop(c);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let e = s.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
}

#[test]
fn without_linger_close_is_graceful_and_the_peer_reads_every_byte_then_eof() {
    let d = SocketOptions::default();
    let (_a, _b, mut c, mut s) = connected(7103, &d, &d);
    let sent = send_stream(&mut c, 3, 300_000, 10_000).unwrap();
    c.close().unwrap();
    let got = recv_stream(&mut s, 3, true).unwrap();
    assert_eq!(sent, got);
}

#[test]
fn linger_close_waits_until_everything_is_acknowledged() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    // A small receive buffer on the reader: bytes are acknowledged only once they fit
    // into its 8 KiB TCP buffer or its 256 KiB ring, so an acknowledged FIN means the
    // reader has taken nearly everything.
    let small = SocketOptions {
        recv_buffer: Some(socket_buffer_size(4096)),
        ..SocketOptions::default()
    };
    let (_a, b, mut c, mut s) = connected(7104, &SocketOptions::default(), &small);
    let ring = b.stack().config().ring_size as u64;
    let total = 2_000_000u64;
    let progress = Arc::new(AtomicU64::new(0));
    let seen = progress.clone();
    let reader = std::thread::spawn(move || {
        // Start late and read slowly: the close below has to block meanwhile.
        std::thread::sleep(Duration::from_millis(300));
        let mut buf = vec![0u8; 16 << 10];
        let mut h = net_common::StreamHash::default();
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            let mut want = vec![0u8; n];
            net_common::fill(5, h.len, &mut want);
            assert_eq!(&buf[..n], &want[..], "payload differs at {}", h.len);
            h.update(&buf[..n]);
            seen.store(h.len, Ordering::SeqCst);
            std::thread::sleep(Duration::from_micros(200));
        }
        h.finish()
    });
    let sent = send_stream(&mut c, 5, total, 64 << 10).unwrap();
    c.set_linger(Some(Duration::from_secs(30))).unwrap();
    c.close().unwrap();
    let read_at_close = progress.load(Ordering::SeqCst);
    let got = reader.join().unwrap();
    assert_eq!(sent, got);
    assert!(
        read_at_close + ring + 8192 >= total,
        "close returned with only {read_at_close} of {total} bytes read"
    );
}

#[test]
fn linger_close_gives_up_after_the_linger_time_when_the_peer_never_reads() {
    // Small buffers on the reader's side so the data cannot all be acknowledged.
    let small = SocketOptions {
        recv_buffer: Some(socket_buffer_size(4096)),
        ..SocketOptions::default()
    };
    let (_a, _b, mut c, s) = connected(7105, &SocketOptions::default(), &small);
    // Fill the client's ring; the server never reads.
    c.set_nonblocking(true).unwrap();
    let chunk = vec![7u8; 64 << 10];
    let mut queued = 0usize;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        match c.write(&chunk) {
            Ok(n) => queued += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(queued > 0);
    c.set_nonblocking(false).unwrap();
    c.set_linger(Some(Duration::from_millis(400))).unwrap();
    let t = Instant::now();
    let e = c.close().unwrap_err();
    let waited = t.elapsed();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    drop(s);
}

#[test]
fn keepalive_detects_a_vanished_peer_within_idle_plus_interval_times_count() {
    let ka = KeepAlive {
        idle: Duration::from_millis(300),
        interval: Duration::from_millis(200),
        count: 3,
    };
    let d = SocketOptions::default();
    let (a, _b, c, mut s) = connected(7106, &d, &d);
    s.set_keepalive(Some(ka)).unwrap();
    assert_eq!(s.keepalive().unwrap(), Some(ka));
    // The peer vanishes without a FIN or RST: its engine stops.
    // Engine first: closing the stream first could let its FIN out.
    let t = Instant::now();
    drop(a);
    drop(c);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let e = s.read(&mut [0u8; 8]).unwrap_err();
    let took = t.elapsed();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e} after {took:?}");
    // Dead after 900 ms of silence (the engine's stop may itself take a moment).
    assert!(took >= Duration::from_millis(800), "{took:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    // Writes report the same failure.
    let e = s.write(b"x").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
}

#[test]
fn keepalive_keeps_an_idle_connection_with_a_live_peer_open() {
    let ka = KeepAlive {
        idle: Duration::from_millis(200),
        interval: Duration::from_millis(100),
        count: 2,
    };
    let opts = SocketOptions {
        keepalive: Some(ka),
        ..SocketOptions::default()
    };
    // Both ends probe; both answer probes.
    let (_a, _b, mut c, mut s) = connected(7107, &opts, &opts);
    assert_eq!(s.keepalive().unwrap(), Some(ka), "accepted stream inherits");
    // Idle for 4x the failure time.
    std::thread::sleep(Duration::from_millis(1600));
    c.write_all(b"still alive").unwrap();
    let mut buf = [0u8; 11];
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"still alive");
    // Switching it off is accepted and reported.
    s.set_keepalive(None).unwrap();
    assert_eq!(s.keepalive().unwrap(), None);
}

#[test]
fn buffer_sizes_are_doubled_like_linux_and_bound_the_advertised_window() {
    let d = SocketOptions::default();
    let small = SocketOptions {
        recv_buffer: Some(socket_buffer_size(8192)),
        send_buffer: Some(socket_buffer_size(16384)),
        ..SocketOptions::default()
    };
    let (_a, _b, mut c, mut s) = connected(7108, &small, &d);
    assert_eq!(c.recv_buffer_size().unwrap(), 16384);
    assert_eq!(c.send_buffer_size().unwrap(), 32768);
    // The server got the engine default.
    assert_eq!(s.recv_buffer_size().unwrap(), 1 << 20);
    let info = c.tcp_info().unwrap();
    assert!(info.rcv_wnd <= 16384, "{info:?}");
    // Data still moves intact through the small window.
    let writer = std::thread::spawn(move || {
        let r = send_stream(&mut s, 9, 1_000_000, 32 << 10).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        r
    });
    let got = recv_stream(&mut c, 9, true).unwrap();
    assert_eq!(writer.join().unwrap(), got);
}

#[test]
fn accepted_connections_inherit_the_listeners_buffer_sizes() {
    let small = SocketOptions {
        recv_buffer: Some(socket_buffer_size(10_000)),
        ..SocketOptions::default()
    };
    let (_a, _b, c, s) = connected(7109, &SocketOptions::default(), &small);
    assert_eq!(s.recv_buffer_size().unwrap(), 20_000);
    assert_eq!(c.recv_buffer_size().unwrap(), 1 << 20);
}

#[test]
fn tcp_info_reports_state_rtt_mss_and_byte_counters() {
    let d = SocketOptions::default();
    let (_a, _b, mut c, mut s) = connected(7110, &d, &d);
    let mut buf = [0u8; 64];
    for i in 0..50u8 {
        c.write_all(&[i; 64]).unwrap();
        s.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [i; 64]);
        s.write_all(&buf).unwrap();
        c.read_exact(&mut buf).unwrap();
    }
    let info = c.tcp_info().unwrap();
    assert_eq!(info.state, 1, "TCP_ESTABLISHED: {info:?}");
    let rtt = info.rtt.expect("no RTT sample after 50 round trips");
    assert!(
        rtt > Duration::ZERO && rtt < Duration::from_millis(200),
        "{info:?}"
    );
    assert!(info.rto >= Duration::from_millis(200), "{info:?}");
    // smoltcp's MSS is the MTU's; the own core reports what a segment carries (Linux
    // `tcpi_snd_mss`): 1460 less the 12-byte timestamp option.
    let own = xwarp::net::StackConfig::default().tcp_core == xwarp::stack::TcpCore::Own;
    assert_eq!(info.snd_mss, if own { 1448 } else { 1460 });
    assert_eq!(info.bytes_sent, 50 * 64);
    assert_eq!(info.bytes_acked, 50 * 64, "{info:?}");
    assert_eq!(info.bytes_received, 50 * 64);
    assert_eq!(info.send_queue, 0);
    // After our FIN is acknowledged the state moves on (FIN-WAIT-2 = 5).
    c.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(s.read(&mut buf).unwrap(), 0);
    let t = Instant::now();
    loop {
        let st = c.tcp_info().unwrap().state;
        if st == 5 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "state {st}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
