//! [`Connection`] as a [`SimEndpoint`] of `tcp::wire_sim`: segments wrapped in IPv4/IPv6
//! headers (smoltcp's `Ipv4Repr`/`Ipv6Repr`, checksums filled and checked), a ring-buffer
//! source of the sender's pattern stream and a sink verifying the peer's. Interop with
//! smoltcp's socket (another implementation) and the own ↔ own goodput table.

use super::*;
use crate::tcp::wire_sim::{
    self, pattern_byte, EndpointReport, Limit, Role, RunReport, SimEndpoint, SmoltcpEndpoint,
    SmoltcpSetup, Stop, Wire, WireConfig,
};
use smoltcp::wire::{
    IpProtocol, Ipv4Address, Ipv4Packet, Ipv4Repr, Ipv6Address, Ipv6Packet, Ipv6Repr,
};

/// wire_sim's ports and addresses (the smoltcp endpoint's).
const PORT: u16 = 4791;
const CLIENT_PORT: u16 = 49152;

fn stream_id(role: Role) -> u8 {
    match role {
        Role::Client => 1,
        Role::Server => 2,
    }
}

fn addrs(ipv6: bool, role: Role) -> (IpAddress, IpAddress) {
    let (c, s) = if ipv6 {
        (
            IpAddress::Ipv6(Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
            IpAddress::Ipv6(Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
        )
    } else {
        (
            IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1)),
            IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 2)),
        )
    };
    match role {
        Role::Client => (c, s),
        Role::Server => (s, c),
    }
}

/// Verifies the peer's pattern stream; room is constant (the application reads at once).
struct PatternSink {
    stream: u8,
    room: usize,
    delivered: u64,
    total: u64,
    first_mismatch: Option<u64>,
}

impl RxSink for PatternSink {
    fn free(&self) -> usize {
        self.room
    }
    fn deliver(&mut self, data: &[u8]) -> usize {
        for (i, &b) in data.iter().enumerate() {
            let off = self.delivered + i as u64;
            if self.first_mismatch.is_none()
                && (off >= self.total || b != pattern_byte(self.stream, off))
            {
                self.first_mismatch = Some(off);
            }
        }
        self.delivered += data.len() as u64;
        data.len()
    }
}

/// One own-TCP endpoint on the simulated wire.
pub(crate) struct OwnEndpoint {
    cfg: ConnConfig,
    role: Role,
    local: IpAddress,
    remote: IpAddress,
    conn: Option<Connection>,
    tx: RingTx,
    sink: PatternSink,
    written: u64,
    /// Close (FIN) once every byte is queued.
    pub close_after_send: bool,
    report: EndpointReport,
    /// Segments that failed to parse (bad checksum, not for us).
    pub rejected: u64,
}

impl OwnEndpoint {
    /// An endpoint sending `send_bytes` and expecting `recv_bytes`; a client connects at its
    /// first `transmit`.
    pub(crate) fn new(
        cfg: ConnConfig,
        role: Role,
        ipv6: bool,
        send_bytes: u64,
        recv_bytes: u64,
    ) -> Self {
        let (local, remote) = addrs(ipv6, role);
        let peer = match role {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        };
        OwnEndpoint {
            cfg,
            role,
            local,
            remote,
            conn: None,
            tx: RingTx::new(1 << 20),
            sink: PatternSink {
                stream: stream_id(peer),
                room: cfg.rx_window_max as usize,
                delivered: 0,
                total: recv_bytes,
                first_mismatch: None,
            },
            written: 0,
            close_after_send: false,
            report: EndpointReport {
                send_total: send_bytes,
                recv_total: recv_bytes,
                ..EndpointReport::default()
            },
            rejected: 0,
        }
    }

    /// The connection (after the first packet or connect).
    pub(crate) fn conn(&self) -> Option<&Connection> {
        self.conn.as_ref()
    }

    fn parse<'a>(&self, packet: &'a [u8]) -> Option<(IpAddress, &'a [u8])> {
        match packet.first().map(|b| b >> 4) {
            Some(4) => {
                let p = Ipv4Packet::new_checked(packet).ok()?;
                let r = Ipv4Repr::parse(&p, &ChecksumCapabilities::default()).ok()?;
                if r.next_header != IpProtocol::Tcp || IpAddress::Ipv4(r.dst_addr) != self.local {
                    return None;
                }
                let h = p.header_len() as usize;
                Some((IpAddress::Ipv4(r.src_addr), &packet[h..h + r.payload_len]))
            }
            Some(6) => {
                let p = Ipv6Packet::new_checked(packet).ok()?;
                let r = Ipv6Repr::parse(&p).ok()?;
                if r.next_header != IpProtocol::Tcp || IpAddress::Ipv6(r.dst_addr) != self.local {
                    return None;
                }
                Some((IpAddress::Ipv6(r.src_addr), &packet[40..40 + r.payload_len]))
            }
            _ => None,
        }
    }

    fn fill(&mut self) {
        let mine = stream_id(self.role);
        let mut chunk = [0u8; 4096];
        while self.written < self.report.send_total && self.tx.free() > 0 {
            let n = (self.report.send_total - self.written)
                .min(chunk.len() as u64)
                .min(self.tx.free() as u64) as usize;
            for (i, c) in chunk[..n].iter_mut().enumerate() {
                *c = pattern_byte(mine, self.written + i as u64);
            }
            self.tx.write(&chunk[..n]);
            self.written += n as u64;
        }
        if self.close_after_send && self.written == self.report.send_total {
            if let Some(c) = self.conn.as_mut() {
                if c.may_send() && c.state() != State::SynSent {
                    c.close();
                }
            }
        }
    }
}

impl SimEndpoint for OwnEndpoint {
    fn receive(&mut self, now: Instant, packet: &[u8]) {
        let Some((src, tcp)) = self.parse(packet) else {
            self.rejected += 1;
            return;
        };
        let Ok(pkt) = TcpPacket::new_checked(tcp) else {
            self.rejected += 1;
            return;
        };
        let Ok(repr) = TcpRepr::parse(&pkt, &src, &self.local, &ChecksumCapabilities::default())
        else {
            self.rejected += 1;
            return;
        };
        if self.conn.is_none() {
            if self.role == Role::Server
                && repr.control == TcpControl::Syn
                && repr.ack_number.is_none()
                && repr.dst_port == PORT
            {
                self.conn = Connection::accept_syn(
                    self.cfg,
                    IpEndpoint::new(self.local, PORT),
                    IpEndpoint::new(src, repr.src_port),
                    &repr,
                    Seq(0x8000_0000 - 7),
                    now,
                )
                .ok();
            }
            return;
        }
        let conn = self.conn.as_mut().expect("checked");
        let o = conn.on_segment(now, &repr, repr.payload, &mut self.sink);
        self.tx.release(o.acked);
        self.report.acked += o.acked;
        self.report.delivered = self.sink.delivered;
        self.report.first_mismatch = self.sink.first_mismatch;
        if self.report.send_done_at.is_none() && self.report.acked >= self.report.send_total {
            self.report.send_done_at = Some(now);
        }
        if self.report.recv_done_at.is_none() && self.sink.delivered >= self.report.recv_total {
            self.report.recv_done_at = Some(now);
        }
    }

    fn transmit(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        if self.conn.is_none() && self.role == Role::Client {
            self.conn = Connection::connect(
                self.cfg,
                IpEndpoint::new(self.local, CLIENT_PORT),
                IpEndpoint::new(self.remote, PORT),
                Seq(u32::MAX - 30_000),
                now,
            )
            .ok();
        }
        self.fill();
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let ip_len = match self.local {
            IpAddress::Ipv4(_) => 20,
            IpAddress::Ipv6(_) => 40,
        };
        for _ in 0..100_000 {
            let Some(seg) = conn.poll_transmit(now, &self.tx, &mut self.sink) else {
                break;
            };
            let tcp_len = seg.buffer_len();
            let mut buf = vec![0u8; ip_len + tcp_len];
            match (self.local, self.remote) {
                (IpAddress::Ipv4(s), IpAddress::Ipv4(d)) => Ipv4Repr {
                    src_addr: s,
                    dst_addr: d,
                    next_header: IpProtocol::Tcp,
                    payload_len: tcp_len,
                    hop_limit: 64,
                }
                .emit(
                    &mut Ipv4Packet::new_unchecked(&mut buf[..]),
                    &ChecksumCapabilities::default(),
                ),
                (IpAddress::Ipv6(s), IpAddress::Ipv6(d)) => Ipv6Repr {
                    src_addr: s,
                    dst_addr: d,
                    next_header: IpProtocol::Tcp,
                    payload_len: tcp_len,
                    hop_limit: 64,
                }
                .emit(&mut Ipv6Packet::new_unchecked(&mut buf[..])),
                _ => unreachable!("one IP version per endpoint"),
            }
            seg.emit(&mut buf[ip_len..], &self.local, &self.remote, &self.tx)
                .expect("segment fits its buffer and the source holds its bytes");
            out.push(buf);
        }
        self.report.delivered = self.sink.delivered;
    }

    fn poll_at(&self, _now: Instant) -> Option<Instant> {
        match &self.conn {
            None if self.role == Role::Client => Some(Instant::ZERO),
            None => None,
            Some(c) => c.poll_at(),
        }
    }

    fn done(&self) -> bool {
        let data = self.report.recv_done_at.is_some() && self.report.send_done_at.is_some();
        let closed = !self.close_after_send
            || self.conn.as_ref().is_some_and(|c| {
                matches!(c.state(), State::FinWait2 | State::TimeWait | State::Closed)
            });
        data && closed
    }

    fn report(&self) -> EndpointReport {
        let info = self.conn.as_ref().map(|c| c.info());
        EndpointReport {
            retransmits: info.map(|i| i.retransmits),
            rtos: info.map(|i| i.rto_count),
            ..self.report.clone()
        }
    }
}

fn own_cfg() -> ConnConfig {
    ConnConfig {
        rx_window_max: 1 << 20,
        ..ConnConfig::default()
    }
}

fn check_exact(r: &RunReport, ab: u64, ba: u64) {
    assert_eq!(r.stop, Stop::Done, "{r:?}");
    assert_eq!((r.b.delivered, r.b.first_mismatch), (ab, None), "{r:?}");
    assert_eq!((r.a.delivered, r.a.first_mismatch), (ba, None), "{r:?}");
    // Nothing longer than the wire's 1500-byte MTU (options included).
    assert_eq!(r.wire[0].oversized + r.wire[1].oversized, 0, "{r:?}");
}

fn limit() -> Limit {
    Limit {
        time: Duration::from_secs(600),
        steps: 20_000_000,
    }
}

fn lossy_80m(loss: f64, seed: u64) -> WireConfig {
    wire_sim::table_wire(80_000_000, 5000, false, loss, seed)
}

#[test]
fn interop_own_client_smoltcp_server_full_duplex_ipv4() {
    let n = 2 << 20;
    let mut a = OwnEndpoint::new(own_cfg(), Role::Client, false, n, n);
    a.close_after_send = true;
    let mut b = SmoltcpEndpoint::new(&SmoltcpSetup::engine(Role::Server, n, n));
    let mut w = Wire::new(lossy_80m(0.0, 1));
    let r = wire_sim::run(&mut a, &mut b, &mut w, limit());
    check_exact(&r, n, n);
    let c = a.conn().unwrap();
    // Our FIN was acknowledged.
    // smoltcp answers SACK-permitted, window scaling (1 MiB buffers: shift 5 both ways) and
    // timestamps.
    assert_eq!(c.negotiated(), (true, true, true));
    assert_eq!(c.window_scales(), (5, 5));
    assert_eq!(c.state(), State::FinWait2);
    assert_eq!(a.rejected, 0);
}

#[test]
fn interop_smoltcp_client_own_server_full_duplex_ipv6() {
    let n = 2 << 20;
    let mut setup = SmoltcpSetup::engine(Role::Client, n, n);
    setup.ipv6 = true;
    let mut a = SmoltcpEndpoint::new(&setup);
    let mut b = OwnEndpoint::new(own_cfg(), Role::Server, true, n, n);
    b.close_after_send = true;
    let mut w = Wire::new(lossy_80m(0.0, 2));
    let r = wire_sim::run(&mut a, &mut b, &mut w, limit());
    check_exact(&r, n, n);
    let c = b.conn().unwrap();
    assert_eq!(c.state(), State::FinWait2);
    assert_eq!(b.rejected, 0);
}

#[test]
fn interop_own_smoltcp_one_percent_loss_byte_exact() {
    let n = 1 << 20;
    let mut a = OwnEndpoint::new(own_cfg(), Role::Client, false, n, n);
    let mut b = SmoltcpEndpoint::new(&SmoltcpSetup::engine(Role::Server, n, n));
    let mut cfg = lossy_80m(0.01, 3);
    cfg.duplicate = 0.01;
    cfg.reorder = 0.01;
    cfg.reorder_extra = Duration::from_micros(2000);
    let mut w = Wire::new(cfg);
    let r = wire_sim::run(&mut a, &mut b, &mut w, limit());
    check_exact(&r, n, n);
}

fn own_pair(ab: u64, ba: u64, ipv6: bool) -> (OwnEndpoint, OwnEndpoint) {
    let mut a = OwnEndpoint::new(own_cfg(), Role::Client, ipv6, ab, ba);
    let mut b = OwnEndpoint::new(own_cfg(), Role::Server, ipv6, ba, ab);
    a.close_after_send = true;
    b.close_after_send = true;
    (a, b)
}

#[test]
fn own_own_wire_sim_full_duplex_0_1_5_percent() {
    let n = 4 << 20;
    for (loss, v6) in [(0.0, false), (0.01, true), (0.05, false)] {
        let (mut a, mut b) = own_pair(n, n, v6);
        let mut w = Wire::new(lossy_80m(loss, 11));
        let r = wire_sim::run(&mut a, &mut b, &mut w, limit());
        check_exact(&r, n, n);
        let rtos = r.a.rtos.unwrap() + r.b.rtos.unwrap();
        let lost = r.wire[0].lost + r.wire[1].lost + r.wire[0].queue_drops + r.wire[1].queue_drops;
        if loss == 0.01 {
            assert_eq!(rtos, 0, "{r:?}");
        }
        assert!(
            rtos * 100 <= lost.max(100),
            "{rtos} RTOs for {lost} losses: {r:?}"
        );
    }
}

/// The goodput table of stack/README.md for own ↔ own (same wires, seeds and format as
/// `tcp::wire_sim`'s smoltcp baseline). Run by hand:
/// `cargo test -p xwarp-stack --release --lib tcp::conn::sim_endpoint -- --ignored --nocapture`
/// (`XWARP_SIM_BYTES` sets the bytes per direction, default 16 MiB).
#[test]
#[ignore]
fn measure_own_goodput_table() {
    let n: u64 = std::env::var("XWARP_SIM_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16 << 20);
    wire_sim::print_goodput_table("own↔own", n, |ab, ba| {
        let a = OwnEndpoint::new(own_cfg(), Role::Client, false, ab, ba);
        let b = OwnEndpoint::new(own_cfg(), Role::Server, false, ba, ab);
        (a, b)
    });
}

/// One cell of the table with the connections' counters (run by hand, as above).
#[test]
#[ignore]
fn measure_shallow_queue_cell() {
    for (bits, one_way) in [(1_000_000_000u64, 100u64), (80_000_000, 5000)] {
        for duplex in [true, false] {
            let n = 16 << 20;
            let (mut a, mut b) = own_pair(n, if duplex { n } else { 0 }, false);
            let mut w = Wire::new(wire_sim::table_wire(bits, one_way, false, 0.0, 11));
            let r = wire_sim::run(&mut a, &mut b, &mut w, limit());
            println!(
                "{bits} bit/s, {one_way} µs, duplex {duplex}: {:.1} / {:.1} Mbit/s, tail drops {}, {:?}\n  {:?}",
                r.goodput_ab() / 1e6,
                r.goodput_ba() / 1e6,
                r.wire[0].queue_drops + r.wire[1].queue_drops,
                a.conn().map(|c| c.info()),
                b.conn().map(|c| c.info())
            );
        }
    }
}

/// More than 2^31 octets one way on one connection (every sequence number comparison
/// against state left at ISS flips there): byte-exact, no retransmission. One-way bulk
/// between two own-core engines corrupted the stream just past 2 GiB while the ACK path
/// took `max_seq(ISS + 1)` as the start of the newly acknowledged data (it then counted
/// the whole distance back to ISS as acknowledged and dropped unsent bytes).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "2 GiB through the simulator: ~10 s in release, minutes unoptimized"
)]
fn own_own_one_way_past_2_pow_31_octets_is_byte_exact() {
    let n = (1u64 << 31) + (8 << 20);
    let (mut a, mut b) = own_pair(n, 0, false);
    let mut w = Wire::new(wire_sim::table_wire(40_000_000_000, 20, true, 0.0, 7));
    let r = wire_sim::run(
        &mut a,
        &mut b,
        &mut w,
        Limit {
            time: Duration::from_secs(600),
            steps: 200_000_000,
        },
    );
    check_exact(&r, n, 0);
    assert_eq!(r.a.retransmits, Some(0), "{r:?}");
}
