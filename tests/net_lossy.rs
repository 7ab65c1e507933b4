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

/// What one end of a full-duplex transfer saw: (len, hash) sent, (len, hash) received,
/// and its `TCP_INFO` at the end.
type Duplex = ((u64, u64), (u64, u64), xwarp::net::TcpInfo);

/// Read exactly `total` bytes of stream `seed`, checking every byte; returns (len, hash).
fn recv_exact(r: &mut impl Read, seed: u64, total: u64) -> (u64, u64) {
    let mut h = net_common::StreamHash::default();
    let mut buf = vec![0u8; 64 << 10];
    let mut expect = vec![0u8; 64 << 10];
    while h.len < total {
        let want = buf.len().min((total - h.len) as usize);
        let n = r.read(&mut buf[..want]).expect("recv");
        assert!(n > 0, "end of stream after {} of {total} bytes", h.len);
        net_common::fill(seed, h.len, &mut expect[..n]);
        assert!(
            buf[..n] == expect[..n],
            "stream {seed} differs at {}",
            h.len
        );
        h.update(&buf[..n]);
    }
    h.finish()
}

/// Send stream `send_seed` and receive stream `recv_seed` on ONE connection at once;
/// once both ends have everything (`both`), read `TCP_INFO` while the connection is still
/// open (a closed connection has left the engine), then close.
fn duplex(
    s: TcpStream,
    send_seed: u64,
    recv_seed: u64,
    total: u64,
    both: &std::sync::Barrier,
) -> Duplex {
    let (mut r, mut w) = s.into_split().unwrap();
    let writer = std::thread::spawn(move || {
        let h = send_stream(&mut w, send_seed, total, 64 << 10).expect("send");
        (h, w)
    });
    let got = recv_exact(&mut r, recv_seed, total);
    let (sent, w) = writer.join().unwrap();
    let s = xwarp::net::reunite(r, w).expect("halves of one stream");
    both.wait();
    let info = s.tcp_info().unwrap();
    both.wait();
    drop(s);
    (sent, got, info)
}

/// Issue 13 on the own TCP core: ONE connection carrying `total` bytes each way at once
/// over the virtual wire with `drop` loss plus duplication and reordering; both streams
/// byte-exact. Returns both ends' reports and the time taken.
fn own_core_duplex_over(drop: f64, dup: f64, total: u64, seed: u64) -> (Duplex, Duplex, f64) {
    let link = LinkConfig {
        drop,
        duplicate: dup,
        reorder: dup,
        reorder_delay: Duration::from_micros(200),
        ..LinkConfig::seeded(seed)
    };
    let mut cfg = pair_config(|c| {
        c.tcp_core = xwarp::stack::TcpCore::Own;
    });
    cfg.wire = WireConfig::symmetric(1500, link);
    let (a, b) = vwire_pair_with(cfg).unwrap();
    let listener = TcpListener::bind(b.stack(), addr(2, 9100)).unwrap();
    let t = Instant::now();
    let both = std::sync::Arc::new(std::sync::Barrier::new(2));
    let both2 = both.clone();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(STALL)).unwrap();
        s.set_write_timeout(Some(STALL)).unwrap();
        duplex(s, 2, 1, total, &both2)
    });
    let mut c = TcpStream::connect(a.stack(), addr(2, 9100)).unwrap();
    c.set_read_timeout(Some(STALL)).unwrap();
    c.set_write_timeout(Some(STALL)).unwrap();
    let ra = duplex(c, 1, 2, total, &both);
    let rb = server.join().unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(ra.0, rb.1, "a->b stream differs (len, hash)");
    assert_eq!(rb.0, ra.1, "b->a stream differs (len, hash)");
    assert_eq!(ra.0 .0, total);
    let (fa, fb) = (
        a.stop().unwrap().backend.tx_faults(),
        b.stop().unwrap().backend.tx_faults(),
    );
    for f in [&fa, &fb] {
        assert!(f.dropped > 0, "the wire dropped nothing: {f:?}");
    }
    eprintln!(
        "own core, one connection, {:.0}% loss: {} MiB each way in {secs:.2} s ({:.0} Mbit/s \
         per direction); a: retransmits {} RTOs {} TLPs {} fast recoveries {} DSACKs {}; \
         b: retransmits {} RTOs {} TLPs {} fast recoveries {} DSACKs {}; faults a->b \
         {fa:?}; b->a {fb:?}",
        drop * 100.0,
        total >> 20,
        total as f64 * 8.0 / secs / 1e6,
        ra.2.retransmits,
        ra.2.rtos,
        ra.2.tlps,
        ra.2.fast_recoveries,
        ra.2.dsacks,
        rb.2.retransmits,
        rb.2.rtos,
        rb.2.tlps,
        rb.2.fast_recoveries,
        rb.2.dsacks,
    );
    (ra, rb, secs)
}

/// Bytes per direction of the own-core tests: `XWARP_LOSSY_OWN_BYTES` (default 16 MiB).
fn own_bytes() -> u64 {
    std::env::var("XWARP_LOSSY_OWN_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16 << 20)
}

/// 1% loss, 1% duplication, 1% reordering, one full-duplex connection: every loss is
/// repaired without a retransmission timeout (SACK, RACK-TLP), both ends.
#[test]
fn own_core_one_duplex_connection_at_1pct_loss_is_exact_with_no_rto() {
    let (a, b, _) = own_core_duplex_over(0.01, 0.01, own_bytes(), 0x13_01);
    assert!(
        a.2.retransmits > 0 && b.2.retransmits > 0,
        "losses were repaired"
    );
    assert_eq!(
        (a.2.rtos, b.2.rtos),
        (0, 0),
        "RTOs at 1% loss: a {:?} b {:?}",
        a.2,
        b.2
    );
}

/// 5% loss, 2% duplication, 2% reordering, one full-duplex connection: byte-exact.
#[test]
fn own_core_one_duplex_connection_at_5pct_loss_is_exact() {
    let (a, b, _) = own_core_duplex_over(0.05, 0.02, own_bytes() / 2, 0x13_05);
    assert!(
        a.2.retransmits > 0 && b.2.retransmits > 0,
        "losses were repaired"
    );
}

/// A burst of tail drops (a 64-frame wire queue, the receive window 1 MiB: each window
/// overruns it) must cost about a round trip per lost segment, not an `rto_floor` each.
/// smoltcp retransmits one segment per fast retransmit and has no NewReno, so after the
/// rescue's first retransmission every further hole waited another 200 ms (8 MiB took
/// ~20 s, and net_inline's several-threads test crawled at ~7 KB/s for a minute); the
/// rescue now answers each partial ACK at once (RFC 6582). Data verified.
#[test]
fn rfc6582_burst_of_tail_drops_recovers_at_a_round_trip_per_hole() {
    let mut cfg = pair_config(|_| {});
    cfg.wire = WireConfig {
        queue_depth: 64,
        ..WireConfig::default()
    };
    let (a, b) = vwire_pair_with(cfg).unwrap();
    let listener = TcpListener::bind(b.stack(), addr(2, 12)).unwrap();
    let total = 8u64 << 20;
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        recv(s, 12)
    });
    let t = Instant::now();
    let c = TcpStream::connect(a.stack(), addr(2, 12)).unwrap();
    let sent = send(c, 12, total);
    let got = server.join().unwrap();
    let took = t.elapsed();
    assert_eq!(sent, got);
    let ea = a.stop().unwrap();
    let drops = xwarp::poll_driver::backend::Backend::telemetry(&ea.backend).wire_faults;
    // The scenario holds: the queue overflowed many times (each a hole to recover).
    assert!(drops >= 20, "only {drops} frames dropped at the full queue");
    assert!(
        took < Duration::from_secs(8),
        "8 MiB with {drops} tail drops took {took:?}"
    );
}
