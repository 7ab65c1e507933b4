//! Bulk transfer both ways over a hostile virtual wire: 1% loss, 1% duplication,
//! reordering and 0.1% corruption per direction must still deliver byte-exact streams.
//! One connection per direction, both running at once: smoltcp counts only
//! payload-free segments as duplicate ACKs, so a full-duplex flow never fast-retransmits
//! and would crawl from one 1 s RTO to the next (see stack/README.md).
//!
//! Size per direction: `XWARP_LOSSY_BYTES` (default 256 MiB).

mod net_common;

use std::io::{self, Read};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use net_common::{addr, pair_config, recv_stream, send_stream};
use xwarp::net::{vwire_pair_with, TcpListener, TcpStream};
use xwarp::poll_driver::vwire::{LinkConfig, WireConfig};

/// No progress for this long fails the test.
const STALL: Duration = Duration::from_secs(60);

/// Fail the test over error `e` of `what` on `s`, with what the engine knows about the
/// connection (a stall shows up as the sender's `bytes_acked` against the receiver's
/// `bytes_received`, its state, queues and rescue count).
fn fail(s: &TcpStream, what: &str, e: io::Error) -> ! {
    panic!(
        "{what} on {:?} -> {:?}: {e}; TCP_INFO {:?}",
        s.local_addr(),
        s.peer_addr(),
        s.tcp_info()
    )
}

/// Send `total` bytes of stream `seed` and close the write half.
fn send(mut s: TcpStream, seed: u64, total: u64) -> (u64, u64) {
    // A stall fails the test instead of hanging it.
    s.set_read_timeout(Some(STALL)).unwrap();
    s.set_write_timeout(Some(STALL)).unwrap();
    let h = send_stream(&mut s, seed, total, 64 << 10).unwrap_or_else(|e| fail(&s, "send", e));
    s.shutdown(Shutdown::Write).unwrap();
    // Keep the connection open until the peer has read everything and closed.
    let mut rest = Vec::new();
    if let Err(e) = s.read_to_end(&mut rest) {
        fail(&s, "waiting for the peer's FIN", e);
    }
    assert!(rest.is_empty());
    h
}

/// Receive and verify stream `seed` until EOF.
fn recv(mut s: TcpStream, seed: u64) -> (u64, u64) {
    s.set_read_timeout(Some(STALL)).unwrap();
    recv_stream(&mut s, seed, true).unwrap_or_else(|e| fail(&s, "recv", e))
}

#[test]
fn lossy_duplicating_reordering_corrupting_wire_delivers_exact_bytes() {
    let total: u64 = std::env::var("XWARP_LOSSY_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20);
    let link = LinkConfig {
        drop: 0.01,
        duplicate: 0.01,
        reorder: 0.01,
        reorder_delay: Duration::from_micros(200),
        corrupt: 0.001,
        // One flipped bit per corrupted frame: the TCP checksum (16-bit ones'-complement
        // sum) catches every single-bit error, but two flips in the same bit position of
        // different words in opposite directions cancel out. With 3-bit corruption that
        // slipped through about once per 256 MiB run: a TCP limit (MPA's CRC32c is what
        // catches those in iWARP), not a stack bug.
        corrupt_bits: 1,
        ..LinkConfig::seeded(0x10_55)
    };
    let mut cfg = pair_config(|c| {
        // 256 KiB windows recover faster than 1 MiB ones here (fewer holes per window
        // for smoltcp's 4-hole reassembler); the virtual wire's RTT is microseconds, so
        // a 10 ms retransmission floor is still conservative.
        c.rx_buffer = 256 << 10;
        c.tx_buffer = 256 << 10;
        c.rto_floor = Some(Duration::from_millis(10));
    });
    cfg.wire = WireConfig::symmetric(1500, link);
    let (a, b) = vwire_pair_with(cfg).unwrap();
    let listener = TcpListener::bind(b.stack(), addr(2, 9000)).unwrap();
    let t = Instant::now();
    let server = std::thread::spawn(move || {
        let (s1, _) = listener.accept().unwrap();
        let (s2, _) = listener.accept().unwrap();
        // Which accepted connection is which: the client opened "up" first.
        let up = std::thread::spawn(move || recv(s1, 1));
        let down = send(s2, 2, total);
        (down, up.join().unwrap())
    });
    let c_up = TcpStream::connect(a.stack(), addr(2, 9000)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let c_down = TcpStream::connect(a.stack(), addr(2, 9000)).unwrap();
    let up = std::thread::spawn(move || send(c_up, 1, total));
    let a_got = recv(c_down, 2);
    let a_sent = up.join().unwrap();
    let (b_sent, b_got) = server.join().unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(a_sent, b_got, "a->b stream differs (len, hash)");
    assert_eq!(b_sent, a_got, "b->a stream differs (len, hash)");
    assert_eq!(a_sent.0, total);
    let ea = a.stop().unwrap();
    let eb = b.stop().unwrap();
    let (fa, fb) = (ea.backend.tx_faults(), eb.backend.tx_faults());
    eprintln!(
        "lossy wire: {} MiB each way in {secs:.1} s ({:.0} Mbit/s per direction); faults a->b {fa:?}; b->a {fb:?}",
        total >> 20,
        total as f64 * 8.0 / secs / 1e6
    );
    // The faults really happened.
    for f in [fa, fb] {
        assert!(f.dropped > 0 && f.duplicated > 0 && f.reordered > 0 && f.corrupted > 0);
    }
}
