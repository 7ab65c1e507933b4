//! Echo and bulk transfer over two engines joined by a clean virtual wire.

mod net_common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Instant;

use net_common::{addr, fill, recv_stream, send_stream, StreamHash};
use xwarp::net::{vwire_pair, TcpListener, TcpStream};
use xwarp::poll_driver::vwire::WireConfig;

#[test]
fn echo_data_verified_by_hash() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let listener = TcpListener::bind(b.stack(), addr(2, 7)).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        assert_eq!(peer.ip(), addr(1, 0).ip());
        let mut buf = vec![0u8; 64 << 10];
        let mut echoed = 0u64;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).unwrap();
            echoed += n as u64;
        }
        s.shutdown(Shutdown::Write).unwrap();
        echoed
    });
    let mut c = TcpStream::connect(a.stack(), addr(2, 7)).unwrap();
    assert_eq!(c.peer_addr().unwrap(), addr(2, 7));
    assert_eq!(c.local_addr().unwrap().ip(), addr(1, 0).ip());
    c.set_nodelay(true).unwrap();
    assert!(c.nodelay().unwrap());
    // Blocks of varying size, each echoed back before the next is sent.
    let mut sent = StreamHash::default();
    let mut got = StreamHash::default();
    let mut off = 0u64;
    let mut block = vec![0u8; 200_000];
    let mut back = vec![0u8; 200_000];
    for i in 0..80u64 {
        let n = 1 + ((i * 7919) % 200_000) as usize;
        fill(42, off, &mut block[..n]);
        c.write_all(&block[..n]).unwrap();
        sent.update(&block[..n]);
        c.read_exact(&mut back[..n]).unwrap();
        got.update(&back[..n]);
        off += n as u64;
    }
    c.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "echo sent more than it received");
    assert_eq!(
        sent.finish(),
        got.finish(),
        "echoed stream differs (len, hash)"
    );
    assert_eq!(server.join().unwrap(), off);
}

#[test]
fn bulk_throughput_both_directions() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let listener = TcpListener::bind(b.stack(), addr(2, 5001)).unwrap();
    let total: u64 = std::env::var("XWARP_BULK_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 << 20);
    for (dir, seed) in [("a->b", 1u64), ("b->a", 2u64)] {
        let t = Instant::now();
        let mut c = TcpStream::connect(a.stack(), addr(2, 5001)).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        let (tx, rx) = if dir == "a->b" {
            (c, s)
        } else {
            std::mem::swap(&mut c, &mut s);
            (c, s)
        };
        let mut tx = tx;
        let mut rx = rx;
        let w = std::thread::spawn(move || {
            let h = send_stream(&mut tx, seed, total, 256 << 10).unwrap();
            tx.shutdown(Shutdown::Write).unwrap();
            (h, tx)
        });
        let got = recv_stream(&mut rx, seed, false).unwrap();
        let (sent, _tx) = w.join().unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(sent, got);
        eprintln!(
            "xwarp vwire bulk {dir}: {} MiB in {:.2} s = {:.2} Gbit/s",
            total >> 20,
            secs,
            total as f64 * 8.0 / secs / 1e9
        );
    }
}

/// The peer half-closes first; we then queue more than its receive buffer and ring hold
/// and shut down while its window is zero, and only later does it start reading. The
/// window update must still get the rest through (smoltcp 0.14 ignores window updates in
/// LAST-ACK, so the engine holds the FIN until the data before it is acknowledged).
#[test]
fn fin_after_peer_fin_behind_a_zero_window_still_delivers_everything() {
    let (a, b) = vwire_pair(WireConfig::default()).unwrap();
    let listener = TcpListener::bind(b.stack(), addr(2, 5002)).unwrap();
    let mut c = TcpStream::connect(a.stack(), addr(2, 5002)).unwrap();
    let (mut s, _) = listener.accept().unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut none = [0u8; 1];
    assert_eq!(
        s.read(&mut none).unwrap(),
        0,
        "server sees the client's FIN"
    );
    // Client side holds 1 MiB socket buffer + 256 KiB ring; the server side as much
    // again: 2 MiB fills the client's window and still fits on the server's side.
    let total = 2u64 << 20;
    let w = std::thread::spawn(move || {
        let h = send_stream(&mut s, 7, total, 64 << 10).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        (h, s)
    });
    // Let the writer finish and the client's window close before reading anything.
    let (sent, _s) = w.join().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    c.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let got = recv_stream(&mut c, 7, true).expect("download after the zero window");
    assert_eq!(got, sent);
}
