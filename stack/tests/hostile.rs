//! Issue 14 (hostile peers), the TCP engine's part: a spoofed-ACK flood, a SYN flood and
//! a connection flood against one `TcpService` driven by hand with raw frames (no threads,
//! no timing, as in `fin_trim.rs`), while a legitimate connection keeps moving verified
//! data. Memory is checked through `TcpService::usage` against the `StackConfig` limits.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use smoltcp::wire::TcpControl;
use xwarp_stack::{new_stack, ListenSocket, StackConfig, StackHandle, Stream, TcpService};

#[path = "support/scripted_nic.rs"]
mod scripted_nic;
use scripted_nic::ScriptedNic;
#[path = "support/peer.rs"]
mod peer;
use peer::{byte, PEER_PORT, PORT};

const US: Ipv4Addr = Ipv4Addr::new(10, 67, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 67, 0, 2);
/// Socket buffers of the test engine (each socket holds both).
const BUF: usize = 16 << 10;

/// One TCP segment as the engine sent it.
#[derive(Debug, Clone, Copy)]
struct Seg {
    dst: Ipv4Addr,
    dst_port: u16,
    src_port: u16,
    syn: bool,
    rst: bool,
    seq: u32,
    ack: Option<u32>,
}

/// A raw IPv4 TCP frame from `src:src_port` to the engine's `dst_port`, valid checksums.
fn frame(
    src: (Ipv4Addr, u16),
    dst_port: u16,
    control: TcpControl,
    seq: u32,
    ack: Option<u32>,
    payload: &[u8],
) -> Vec<u8> {
    peer::tcp_frame(src, (US, dst_port), control, seq, ack, None, payload)
}

/// xorshift64: the flood's source addresses, ports and sequence numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A source that is neither the engine nor the legitimate peer.
    fn source(&mut self) -> (Ipv4Addr, u16) {
        let x = self.next();
        let ip = Ipv4Addr::new(10, 67, ((x >> 8) as u8) | 1, (x as u8).max(3));
        (ip, ((x >> 16) as u16).max(1024))
    }
}

struct Harness {
    svc: TcpService,
    nic: ScriptedNic,
    h: StackHandle,
    /// Segments the engine sent, oldest first (drained by the tests).
    sent: Vec<Seg>,
}

impl Harness {
    fn new(cfg: impl FnOnce(&mut StackConfig)) -> Harness {
        let mut c = peer::config(US, 16, BUF, BUF, 64 << 10);
        cfg(&mut c);
        let (svc, h) = new_stack(c).unwrap();
        let mut hs = Harness {
            svc,
            nic: ScriptedNic::default(),
            h,
            sent: Vec::new(),
        };
        hs.arp();
        hs
    }

    fn poll(&mut self) {
        let sent = &mut self.sent;
        peer::drive(&mut self.svc, &mut self.nic, |ip, t| {
            sent.push(Seg {
                dst: ip.dst_addr(),
                dst_port: t.dst_port(),
                src_port: t.src_port(),
                syn: t.syn(),
                rst: t.rst(),
                seq: t.seq_number().0 as u32,
                ack: t.ack().then_some(t.ack_number().0 as u32),
            });
        });
    }

    fn inject(&mut self, f: Vec<u8>) {
        self.nic.rx.push_back(f);
    }

    fn arp(&mut self) {
        self.inject(peer::arp_request(PEER, US));
        self.poll();
    }

    /// Listen on `PORT` (the call waits for the engine, which this thread drives).
    fn listen(&mut self, backlog: usize) -> ListenSocket {
        let h = self.h.clone();
        peer::listen_driving(&h, SocketAddr::from((US, PORT)), backlog, || self.poll())
    }

    /// The engine's SYN-ACK to `src`, if it sent one since the last call.
    fn syn_ack_to(&mut self, src: (Ipv4Addr, u16)) -> Option<u32> {
        self.sent
            .iter()
            .rev()
            .find(|s| s.syn && s.dst == src.0 && s.dst_port == src.1)
            .map(|s| s.seq)
    }

    /// A full handshake from `src` (the peer's ISN is 999). Returns the engine's ISN + 1,
    /// or `None` if the SYN got no SYN-ACK.
    fn handshake(&mut self, src: (Ipv4Addr, u16)) -> Option<u32> {
        self.sent.clear();
        self.inject(frame(src, PORT, TcpControl::Syn, 999, None, &[]));
        self.poll();
        let isn = self.syn_ack_to(src)?;
        let their_next = isn.wrapping_add(1);
        self.inject(frame(
            src,
            PORT,
            TcpControl::None,
            1000,
            Some(their_next),
            &[],
        ));
        self.poll();
        Some(their_next)
    }
}

/// The legitimate connection: the peer's side of it and the application's stream.
struct Legit {
    stream: Stream,
    their_next: u32,
    next: u32,
    sent: u32,
}

impl Legit {
    fn open(hs: &mut Harness, listener: &ListenSocket) -> Legit {
        let their_next = hs.handshake((PEER, PEER_PORT)).expect("SYN-ACK");
        let stream = listener.try_accept().expect("accepted");
        Legit {
            stream,
            their_next,
            next: 1000,
            sent: 0,
        }
    }

    /// Send one segment of verified bytes and check the engine acknowledged it and the
    /// application read exactly those bytes.
    fn exchange(&mut self, hs: &mut Harness) {
        let data: Vec<u8> = (self.sent..self.sent + 1000).map(byte).collect();
        hs.sent.clear();
        hs.inject(frame(
            (PEER, PEER_PORT),
            PORT,
            TcpControl::None,
            self.next,
            Some(self.their_next),
            &data,
        ));
        hs.poll();
        self.next = self.next.wrapping_add(data.len() as u32);
        let acked = hs
            .sent
            .iter()
            .filter(|s| s.dst == PEER && s.dst_port == PEER_PORT)
            .filter_map(|s| s.ack)
            .next_back();
        assert_eq!(
            acked,
            Some(self.next),
            "the legitimate segment is acknowledged"
        );
        let mut buf = vec![0u8; 4096];
        let n = self.stream.try_read(&mut buf).expect("read");
        assert_eq!(
            &buf[..n],
            &data[..],
            "the application reads the peer's bytes"
        );
        self.sent += data.len() as u32;
    }
}

/// Issue 14 item 1 against a running engine: 100,000 spoofed pure ACKs with valid
/// checksums from random sources to the listening port and to random ports create no
/// tracked flow (before the fix each one created an entry holding a copy of its frame);
/// the legitimate connection is the one flow tracked and keeps moving data.
#[test]
fn hostile_spoofed_ack_flood_tracks_no_flow() {
    let mut hs = Harness::new(|_| {});
    let listener = hs.listen(8);
    let mut legit = Legit::open(&mut hs, &listener);
    legit.exchange(&mut hs);
    // The ACK watch (rescue.rs) exists only for smoltcp's socket: the own core tracks
    // no flows at all.
    let flows = usize::from(xwarp_stack::TcpCore::from_env() == xwarp_stack::TcpCore::Smoltcp);
    assert_eq!(hs.svc.usage().tracked_flows, flows);
    let sockets = hs.svc.usage().sockets;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..100 {
        for _ in 0..1000 {
            let src = rng.source();
            let x = rng.next();
            let port = if x & 1 == 0 { PORT } else { (x >> 8) as u16 };
            let f = frame(
                src,
                port,
                TcpControl::None,
                x as u32,
                Some((x >> 32) as u32),
                &[],
            );
            hs.inject(f);
        }
        hs.poll();
        hs.sent.clear();
        if round % 10 == 0 {
            legit.exchange(&mut hs);
        }
        let u = hs.svc.usage();
        assert_eq!(u.tracked_flows, flows, "round {round}: {u:?}");
        assert_eq!(u.sockets, sockets, "round {round}: {u:?}");
    }
    legit.exchange(&mut hs);
}

/// Issue 14 item 4 (TCP part): thousands of spoofed SYNs hold at most `syn_backlog`
/// handshakes (each a socket with full buffers); the rest are dropped before smoltcp
/// (no SYN-ACK, no RST, as Linux without SYN cookies drops them); memory stays within
/// the bound; the established connection keeps moving verified data throughout; after
/// `syn_received_timeout` the stale handshakes are gone and a new client gets in.
#[test]
fn hostile_syn_flood_stays_within_the_half_open_bound() {
    const SYN_BACKLOG: usize = 16;
    let mut hs = Harness::new(|c| {
        c.syn_backlog = SYN_BACKLOG;
        c.syn_received_timeout = Duration::from_millis(300);
    });
    let listener = hs.listen(64);
    let mut legit = Legit::open(&mut hs, &listener);
    legit.exchange(&mut hs);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut most_half_open = 0;
    for round in 0..50 {
        for _ in 0..100 {
            let src = rng.source();
            hs.inject(frame(
                src,
                PORT,
                TcpControl::Syn,
                rng.next() as u32,
                None,
                &[],
            ));
        }
        hs.poll();
        assert!(
            !hs.sent.iter().any(|s| s.rst && s.src_port == PORT),
            "a dropped SYN gets no RST"
        );
        hs.sent.clear();
        legit.exchange(&mut hs);
        let u = hs.svc.usage();
        most_half_open = most_half_open.max(u.half_open);
        assert!(u.half_open <= SYN_BACKLOG, "round {round}: {u:?}");
        // The legitimate connection, the handshakes and at most `armed_listeners` armed.
        let most = 1 + SYN_BACKLOG + 4;
        assert!(u.sockets <= most, "round {round}: {u:?}");
        assert!(u.socket_buffer_bytes <= (most * 2 * BUF) as u64, "{u:?}");
    }
    assert_eq!(
        most_half_open, SYN_BACKLOG,
        "the flood filled the SYN queue"
    );
    assert!(hs.h.stats().syn_dropped_backlog > 0);
    assert_eq!(
        listener.try_accept().err().map(|e| e.kind()),
        Some(io::ErrorKind::WouldBlock)
    );
    // The flood stops; the stale handshakes expire and a new client is served.
    std::thread::sleep(Duration::from_millis(350));
    hs.poll();
    legit.exchange(&mut hs);
    assert_eq!(hs.svc.usage().half_open, 0, "{:?}", hs.svc.usage());
    assert!(hs.h.stats().syn_received_expired >= SYN_BACKLOG as u64);
    let late = (PEER, PEER_PORT + 1);
    assert!(hs.handshake(late).is_some(), "a new client gets a SYN-ACK");
    assert!(listener.try_accept().is_ok());
}

/// Issue 14 item 4 (TCP part): a flood of completed handshakes fills the accept queue up
/// to the listener's backlog and no further (later SYNs are dropped, not reset), and
/// application connects beyond `max_sockets` fail at once with `OutOfMemory` (ENOBUFS)
/// instead of allocating more buffers; the established connection keeps working and
/// freeing sockets lets a connect through again.
#[test]
fn hostile_connection_flood_beyond_the_limits_is_refused_cleanly() {
    const BACKLOG: usize = 8;
    const MAX_SOCKETS: usize = 24;
    let mut hs = Harness::new(|c| {
        c.max_sockets = MAX_SOCKETS;
        c.armed_listeners = 2;
    });
    let listener = hs.listen(BACKLOG);
    let mut legit = Legit::open(&mut hs, &listener);
    legit.exchange(&mut hs);
    // Handshakes completed by a flooding client, never accepted.
    let mut established = 0;
    for i in 0..200u16 {
        if hs.handshake((PEER, 20000 + i)).is_some() {
            established += 1;
        }
        assert!(
            !hs.sent.iter().any(|s| s.rst && s.dst_port == 20000 + i),
            "an overflowing SYN is dropped, not reset"
        );
    }
    assert_eq!(established, BACKLOG, "the accept queue holds the backlog");
    legit.exchange(&mut hs);
    // Application connects until the socket limit: the rest fail cleanly.
    let mut pending = Vec::new();
    let mut refused = 0u64;
    for i in 0..64u16 {
        let s =
            hs.h.connect(SocketAddr::from((PEER, 7000 + i)), None, None)
                .unwrap();
        hs.poll();
        match s.poll_connect() {
            Ok(_) => pending.push(s),
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::OutOfMemory, "{e}");
                refused += 1;
            }
        }
        let u = hs.svc.usage();
        assert!(u.sockets <= MAX_SOCKETS, "{u:?}");
        assert!(u.socket_buffer_bytes <= (MAX_SOCKETS * 2 * BUF) as u64);
    }
    assert!(refused > 0 && !pending.is_empty());
    assert_eq!(hs.h.stats().refused_limit, refused);
    legit.exchange(&mut hs);
    // Free the pending connects: a connect gets a socket again.
    for mut s in pending.drain(..) {
        s.abort().unwrap();
    }
    hs.poll();
    // The RSTs are out; the next ingress recycles the sockets.
    legit.exchange(&mut hs);
    let s =
        hs.h.connect(SocketAddr::from((PEER, 9000)), None, None)
            .unwrap();
    hs.poll();
    assert!(s.poll_connect().is_ok(), "{:?}", hs.svc.usage());
    legit.exchange(&mut hs);
}

/// What the test's protocol host saw.
#[derive(Default)]
struct HostLog {
    listening: bool,
    accepted: usize,
    closed: Vec<Option<xwarp_stack::SocketError>>,
}

/// A protocol host that listens on `PORT` and opens `connects` connections to the peer
/// (who never answers them).
struct FloodHost {
    log: std::sync::Arc<std::sync::Mutex<HostLog>>,
    /// Connects to open at the next poll (set by the test).
    connects: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    started: bool,
}

impl xwarp_stack::proto::ProtocolHost for FloodHost {
    fn poll(&mut self, now: Instant, ctl: &mut xwarp_stack::proto::ProtoCtl) -> Option<Instant> {
        if !self.started {
            self.started = true;
            ctl.listen(1, SocketAddr::from((US, PORT)), 64);
        }
        let n = self.connects.swap(0, std::sync::atomic::Ordering::Relaxed);
        for i in 0..n {
            let remote = SocketAddr::from((PEER, 7000 + i as u16));
            ctl.connect(remote, None, now + Duration::from_secs(60));
        }
        None
    }
    fn on_listen(&mut self, _token: u64, result: Result<SocketAddr, xwarp_stack::SocketError>) {
        self.log.lock().unwrap().listening = result.is_ok();
    }
    fn on_accepted(&mut self, _: u64, _: u64, _: SocketAddr, _: SocketAddr, _: Instant) {
        self.log.lock().unwrap().accepted += 1;
    }
    fn on_established(&mut self, _: u64, _: SocketAddr, _: SocketAddr, _: Instant) {}
    fn on_recv(&mut self, _: u64, _: Instant, data: &[u8]) -> usize {
        data.len()
    }
    fn on_send(&mut self, _: u64, _: Instant, _: &mut [u8]) -> usize {
        0
    }
    fn on_peer_fin(&mut self, _: u64, _: Instant) {}
    fn close_request(&mut self, _: u64) -> xwarp_stack::proto::CloseRequest {
        xwarp_stack::proto::CloseRequest::None
    }
    fn on_closed(&mut self, _: u64, _: Instant, error: Option<xwarp_stack::SocketError>) {
        self.log.lock().unwrap().closed.push(error);
    }
}

/// The same floods against the in-engine protocol host's listener (the verbs engine's
/// MPA port): spoofed SYNs hold at most `syn_backlog` handshakes (before the fix its pool
/// was re-armed after every SYN, one socket with full buffers per spoofed SYN), and the
/// host's connects beyond `max_sockets` are closed with `NoBuffers`.
#[test]
fn hostile_syn_flood_on_a_hosted_listener_stays_within_the_bound() {
    const SYN_BACKLOG: usize = 16;
    const MAX_SOCKETS: usize = 64;
    let mut hs = Harness::new(|c| {
        c.syn_backlog = SYN_BACKLOG;
        c.max_sockets = MAX_SOCKETS;
    });
    let log = std::sync::Arc::new(std::sync::Mutex::new(HostLog::default()));
    let connects = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    hs.svc.set_protocol_host(Box::new(FloodHost {
        log: log.clone(),
        connects: connects.clone(),
        started: false,
    }));
    hs.poll();
    assert!(log.lock().unwrap().listening);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut most_half_open = 0;
    for round in 0..30 {
        for _ in 0..100 {
            let src = rng.source();
            hs.inject(frame(
                src,
                PORT,
                TcpControl::Syn,
                rng.next() as u32,
                None,
                &[],
            ));
        }
        hs.poll();
        hs.sent.clear();
        let u = hs.svc.usage();
        most_half_open = most_half_open.max(u.half_open);
        assert!(u.half_open <= SYN_BACKLOG, "round {round}: {u:?}");
        assert!(u.sockets <= SYN_BACKLOG + 4, "round {round}: {u:?}");
        assert!(u.socket_buffer_bytes <= ((SYN_BACKLOG + 4) * 2 * BUF) as u64);
    }
    assert_eq!(
        most_half_open, SYN_BACKLOG,
        "the flood filled the SYN queue"
    );
    assert!(hs.h.stats().syn_dropped_backlog > 0);
    // The host's connects beyond max_sockets are closed with NoBuffers, never an abort.
    connects.store(80, std::sync::atomic::Ordering::Relaxed);
    hs.poll();
    let l = log.lock().unwrap();
    let refused = l
        .closed
        .iter()
        .filter(|e| **e == Some(xwarp_stack::SocketError::NoBuffers))
        .count();
    assert!(refused > 0, "connects beyond max_sockets are refused");
    assert_eq!(refused, l.closed.len());
    assert_eq!(hs.svc.usage().sockets, MAX_SOCKETS);
    assert_eq!(hs.h.stats().refused_limit, refused as u64);
}
