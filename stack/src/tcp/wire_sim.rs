//! An in-memory IP wire with a virtual clock, for tests and measurements of TCP endpoints.
//!
//! - [`Wire`]: two directions carrying raw IPv4/IPv6 packets, each with a one-way delay, a
//!   bandwidth (serialisation delay behind a bounded queue that drops at the tail, like a
//!   router's), random loss, duplication and reordering (extra delay for a fraction of the
//!   packets), all driven by a seeded [`Rng`] so a run is repeatable.
//! - [`SimEndpoint`]: what an endpoint implements to be driven (receive a packet, transmit
//!   what it has, say when it next wants to be polled, say when it is done, report).
//! - [`run`]: the driver; virtual time jumps to the next event (a packet arrival or an
//!   endpoint's `poll_at`), bounded by a virtual-time and a step limit.
//! - [`SmoltcpEndpoint`]: smoltcp's `Interface` + one `tcp::Socket` built as the engine builds
//!   it (`crate::socket::new_socket`), sending a verifiable pattern while receiving and
//!   verifying the peer's on the same connection: the "before" of the TCP-core decision.
//!
//! Nothing here reads a clock: time is the driver's virtual `Instant`.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, HardwareAddress, Icmpv6Packet, Icmpv6Repr, IpAddress, IpCidr, IpProtocol,
    Ipv4Address, Ipv4Packet, Ipv6Address, Ipv6Packet, Ipv6Repr, NdiscNeighborFlags, NdiscRepr,
    RawHardwareAddress, TcpPacket,
};

use super::seq::Seq;
use crate::config::{StackConfig, TcpOptions};

/// A small seeded xorshift64* generator: repeatable runs without a dependency.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (any value; zero is mapped to a fixed non-zero state).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(splitmix64(seed) | 1)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `true` with probability `p` (p ≤ 0 never, p ≥ 1 always).
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Byte `off` of the verifiable stream number `stream`: a position-dependent pattern, so a
/// lost, duplicated or shifted byte never verifies.
pub(crate) fn pattern_byte(stream: u8, off: u64) -> u8 {
    let word = splitmix64((off >> 3) ^ (u64::from(stream) << 56));
    (word >> ((off & 7) * 8)) as u8
}

/// One direction's (or both directions') shape. Every probability is per packet.
#[derive(Clone, Debug)]
pub(crate) struct WireConfig {
    /// Propagation delay, one way.
    pub one_way: Duration,
    /// Link rate in bit/s; 0 = unlimited (no serialisation delay, no queue).
    pub bits_per_sec: u64,
    /// Bytes the queue in front of the link holds (packets beyond it are dropped at the tail).
    pub queue_bytes: usize,
    /// Bytes each packet costs on the link beyond its IP length (Ethernet header, FCS,
    /// preamble and inter-frame gap: 38).
    pub frame_overhead: usize,
    /// Probability that a packet is lost (after it used the link).
    pub loss: f64,
    /// Probability that a packet is sent twice (the copy queues behind it).
    pub duplicate: f64,
    /// Probability that a packet is held back by `reorder_extra`, so later ones overtake it.
    pub reorder: f64,
    /// Extra delay of a reordered packet.
    pub reorder_extra: Duration,
    /// RNG seed.
    pub seed: u64,
    /// IP MTU of the link: longer packets are dropped and counted (`LinkStats::oversized`),
    /// as a veth or NIC drops them. 0: no limit.
    pub mtu: usize,
}

impl WireConfig {
    /// A loss-free wire of `bits_per_sec` and `one_way` delay whose queue holds two
    /// bandwidth-delay products (at least 64 KiB).
    pub(crate) fn link(bits_per_sec: u64, one_way: Duration) -> WireConfig {
        let bdp = (bits_per_sec as u128 * 2 * one_way.total_micros() as u128 / 8_000_000) as usize;
        WireConfig {
            one_way,
            bits_per_sec,
            queue_bytes: (2 * bdp).max(64 << 10),
            frame_overhead: 38,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_extra: Duration::from_micros(0),
            seed: 1,
            mtu: 1500,
        }
    }
}

/// What happened to the packets sent in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LinkStats {
    /// Packets handed to the wire.
    pub sent: u64,
    /// Packets delivered (copies included).
    pub delivered: u64,
    /// Dropped at random.
    pub lost: u64,
    /// Dropped at the tail of a full queue.
    pub queue_drops: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Packets held back to be overtaken.
    pub reordered: u64,
    /// Handed over but not IPv4/IPv6 (dropped: an endpoint bug).
    pub not_ip: u64,
    /// Longer than the MTU (dropped: an endpoint bug).
    pub oversized: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Link {
    /// When the link finishes serialising what is queued (ns of virtual time).
    busy_until_ns: u64,
}

/// Two directions between endpoint 0 and endpoint 1. Packets are raw IP packets.
pub(crate) struct Wire {
    cfg: WireConfig,
    rng: Rng,
    links: [Link; 2],
    stats: [LinkStats; 2],
    /// (arrival µs, tiebreak) → (receiving side, packet).
    in_flight: BTreeMap<(i64, u64), (usize, Vec<u8>)>,
    next_id: u64,
}

impl Wire {
    /// A wire shaped by `cfg` in both directions.
    pub(crate) fn new(cfg: WireConfig) -> Wire {
        Wire {
            rng: Rng::new(cfg.seed),
            cfg,
            links: [Link::default(); 2],
            stats: [LinkStats::default(); 2],
            in_flight: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// What happened so far in each direction (index = sending side).
    pub(crate) fn stats(&self) -> [LinkStats; 2] {
        self.stats
    }

    /// Endpoint `from` (0 or 1) sends `packet` at `now`.
    pub(crate) fn send(&mut self, now: Instant, from: usize, packet: Vec<u8>) {
        let from = from.min(1);
        self.stats[from].sent += 1;
        if !matches!(packet.first().map(|b| b >> 4), Some(4) | Some(6)) {
            self.stats[from].not_ip += 1;
            return;
        }
        if self.cfg.mtu > 0 && packet.len() > self.cfg.mtu {
            self.stats[from].oversized += 1;
            return;
        }
        if self.rng.chance(self.cfg.duplicate) {
            self.stats[from].duplicated += 1;
            self.enqueue(now, from, packet.clone());
        }
        self.enqueue(now, from, packet);
    }

    fn enqueue(&mut self, now: Instant, from: usize, packet: Vec<u8>) {
        let now_ns = now.total_micros().max(0) as u64 * 1000;
        let link = &mut self.links[from];
        let departs_ns = if self.cfg.bits_per_sec == 0 {
            now_ns
        } else {
            let backlog_ns = link.busy_until_ns.saturating_sub(now_ns);
            let backlog_bytes =
                (backlog_ns as u128 * self.cfg.bits_per_sec as u128 / 8_000_000_000) as usize;
            if backlog_bytes + packet.len() > self.cfg.queue_bytes {
                self.stats[from].queue_drops += 1;
                return;
            }
            let wire_bits = (packet.len() + self.cfg.frame_overhead) as u128 * 8;
            let ser_ns = (wire_bits * 1_000_000_000).div_ceil(self.cfg.bits_per_sec as u128);
            let start = link.busy_until_ns.max(now_ns);
            link.busy_until_ns = start.saturating_add(ser_ns as u64);
            link.busy_until_ns
        };
        if self.rng.chance(self.cfg.loss) {
            self.stats[from].lost += 1;
            return;
        }
        let mut arrive_ns = departs_ns + self.cfg.one_way.total_micros() * 1000;
        if self.rng.chance(self.cfg.reorder) {
            self.stats[from].reordered += 1;
            arrive_ns += self.cfg.reorder_extra.total_micros() * 1000;
        }
        let arrive_us = arrive_ns.div_ceil(1000).min(i64::MAX as u64) as i64;
        self.in_flight
            .insert((arrive_us, self.next_id), (1 - from, packet));
        self.next_id += 1;
    }

    /// When the next packet arrives, if any is in flight.
    pub(crate) fn next_arrival(&self) -> Option<Instant> {
        self.in_flight
            .keys()
            .next()
            .map(|&(us, _)| Instant::from_micros(us))
    }

    /// The next packet that has arrived by `now`: (receiving side, packet).
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(usize, Vec<u8>)> {
        let (&key, _) = self.in_flight.iter().next()?;
        if key.0 > now.total_micros() {
            return None;
        }
        let (to, p) = self.in_flight.remove(&key)?;
        self.stats[1 - to].delivered += 1;
        Some((to, p))
    }
}

/// What an endpoint knows about its run. Counts an endpoint cannot know are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EndpointReport {
    /// Stream bytes this endpoint was to send, and how many the peer acknowledged.
    pub send_total: u64,
    pub acked: u64,
    /// Stream bytes this endpoint was to receive, and how many arrived in order and matched
    /// the pattern.
    pub recv_total: u64,
    pub delivered: u64,
    /// Offset of the first received byte that did not match the pattern.
    pub first_mismatch: Option<u64>,
    /// When all its bytes were acknowledged / all the peer's bytes were received.
    pub send_done_at: Option<Instant>,
    pub recv_done_at: Option<Instant>,
    /// Data segments sent again (sequence range not beyond the highest sent before).
    pub retransmits: Option<u64>,
    /// Retransmission timeouts.
    pub rtos: Option<u64>,
}

/// An endpoint the driver can run. `transmit` is called after every `receive` batch and at
/// every `poll_at`; it appends whole IP packets to `out`.
pub(crate) trait SimEndpoint {
    /// A packet arrived at `now`.
    fn receive(&mut self, now: Instant, packet: &[u8]);
    /// Do what is due at `now` and append the packets to send.
    fn transmit(&mut self, now: Instant, out: &mut Vec<Vec<u8>>);
    /// When this endpoint next needs `transmit` without a packet arriving (a timer).
    fn poll_at(&self, now: Instant) -> Option<Instant>;
    /// Everything to send is acknowledged and everything to receive has arrived.
    fn done(&self) -> bool;
    /// The endpoint's account of the run.
    fn report(&self) -> EndpointReport;
}

/// Bounds of one run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limit {
    /// Virtual time.
    pub time: Duration,
    /// Driver iterations.
    pub steps: u64,
}

/// Why a run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Both endpoints done.
    Done,
    /// The virtual-time limit passed.
    TimeLimit,
    /// The step limit passed.
    StepLimit,
    /// Nothing in flight and no endpoint wants to be polled, yet not done (a hang).
    Idle,
}

/// The result of [`run`].
#[derive(Clone, Debug)]
pub(crate) struct RunReport {
    pub stop: Stop,
    /// Virtual time at the stop.
    pub elapsed: Duration,
    pub steps: u64,
    /// Index 0: packets sent by `a`; 1: by `b`.
    pub wire: [LinkStats; 2],
    pub a: EndpointReport,
    pub b: EndpointReport,
}

impl RunReport {
    /// Goodput of the a→b direction in bit/s (b's verified bytes over the time b got its
    /// last byte, or the whole run if it never finished).
    pub(crate) fn goodput_ab(&self) -> f64 {
        goodput(&self.b, self.elapsed)
    }

    /// Goodput of the b→a direction in bit/s.
    pub(crate) fn goodput_ba(&self) -> f64 {
        goodput(&self.a, self.elapsed)
    }
}

fn goodput(receiver: &EndpointReport, elapsed: Duration) -> f64 {
    let t = receiver
        .recv_done_at
        .map(|t| t.total_micros())
        .unwrap_or(elapsed.total_micros() as i64);
    if t <= 0 {
        return 0.0;
    }
    receiver.delivered as f64 * 8.0 / (t as f64 / 1e6)
}

/// Drive `a` (wire side 0) and `b` (side 1) over `wire` from virtual time zero until both are
/// done or `limit` is reached.
pub(crate) fn run<A: SimEndpoint + ?Sized, B: SimEndpoint + ?Sized>(
    a: &mut A,
    b: &mut B,
    wire: &mut Wire,
    limit: Limit,
) -> RunReport {
    let mut now = Instant::ZERO;
    let mut steps = 0u64;
    let mut out = Vec::new();
    let stop = loop {
        if a.done() && b.done() {
            break Stop::Done;
        }
        if steps >= limit.steps {
            break Stop::StepLimit;
        }
        if now.total_micros() > limit.time.total_micros() as i64 {
            break Stop::TimeLimit;
        }
        steps += 1;
        let mut moved = false;
        while let Some((to, p)) = wire.pop_due(now) {
            moved = true;
            if to == 0 {
                a.receive(now, &p);
            } else {
                b.receive(now, &p);
            }
        }
        a.transmit(now, &mut out);
        moved |= !out.is_empty();
        for p in out.drain(..) {
            wire.send(now, 0, p);
        }
        b.transmit(now, &mut out);
        moved |= !out.is_empty();
        for p in out.drain(..) {
            wire.send(now, 1, p);
        }
        let next = [wire.next_arrival(), a.poll_at(now), b.poll_at(now)]
            .into_iter()
            .flatten()
            .min();
        match next {
            None => {
                if a.done() && b.done() {
                    break Stop::Done;
                }
                break Stop::Idle;
            }
            // An endpoint that asks to be polled now again after a step that moved
            // nothing would spin at one instant: let a microsecond pass.
            Some(t) if t <= now && !moved => now += Duration::from_micros(1),
            Some(t) => now = if t > now { t } else { now },
        }
    };
    RunReport {
        stop,
        elapsed: Duration::from_micros(now.total_micros().max(0) as u64),
        steps,
        wire: wire.stats(),
        a: a.report(),
        b: b.report(),
    }
}

// --- smoltcp's socket as a SimEndpoint -------------------------------------------------

thread_local! {
    /// Virtual milliseconds for the TCP timestamp generator (a plain `fn() -> u32`, so it
    /// cannot capture the endpoint's clock).
    static VIRTUAL_MS: Cell<u32> = const { Cell::new(0) };
}

fn virtual_tsval() -> u32 {
    VIRTUAL_MS.with(Cell::get)
}

const ETH_HEADER: usize = 14;

/// Ethernet frames between smoltcp's interface and the endpoint (the wire carries IP).
struct FrameQueue {
    rx: VecDeque<Vec<u8>>,
    tx: Vec<Vec<u8>>,
    mtu: usize,
}

struct SimRx(Vec<u8>);
struct SimTx<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for SimRx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for SimTx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.0.push(buf);
        r
    }
}

impl Device for FrameQueue {
    type RxToken<'a> = SimRx;
    type TxToken<'a> = SimTx<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(SimRx, SimTx<'_>)> {
        let f = self.rx.pop_front()?;
        Some((SimRx(f), SimTx(&mut self.tx)))
    }

    fn transmit(&mut self, _now: Instant) -> Option<SimTx<'_>> {
        Some(SimTx(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + ETH_HEADER;
        caps
    }
}

/// Which side opens the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Server,
}

/// One smoltcp endpoint's setup.
#[derive(Clone, Debug)]
pub(crate) struct SmoltcpSetup {
    pub role: Role,
    /// IPv6 instead of IPv4.
    pub ipv6: bool,
    /// Stream bytes this endpoint sends / expects from the peer.
    pub send_bytes: u64,
    pub recv_bytes: u64,
    /// Buffers, MTU, congestion control, timestamps as the engine's.
    pub stack: StackConfig,
    /// The socket options (Nagle, ACK delay) as the engine's.
    pub tcp: TcpOptions,
}

impl SmoltcpSetup {
    /// The engine's defaults with Nagle off (iWARP sets `TCP_NODELAY`).
    pub(crate) fn engine(role: Role, send_bytes: u64, recv_bytes: u64) -> SmoltcpSetup {
        SmoltcpSetup {
            role,
            ipv6: false,
            send_bytes,
            recv_bytes,
            stack: StackConfig::default(),
            tcp: TcpOptions {
                nodelay: true,
                ..TcpOptions::default()
            },
        }
    }
}

const PORT: u16 = 4791;
const CLIENT_PORT: u16 = 49152;

fn addrs(ipv6: bool, role: Role) -> (IpAddress, IpAddress, u8) {
    let (c, s, prefix) = if ipv6 {
        (
            IpAddress::Ipv6(Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
            IpAddress::Ipv6(Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
            64,
        )
    } else {
        (
            IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 1)),
            IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, 2)),
            24,
        )
    };
    match role {
        Role::Client => (c, s, prefix),
        Role::Server => (s, c, prefix),
    }
}

/// The peer's (invented) MAC; the wire carries no Ethernet, so this endpoint answers its
/// own interface's ARP requests and neighbour solicitations with it.
const PEER_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0xfe]);

/// smoltcp's `Interface` and one `tcp::Socket` built as the engine builds its sockets, over
/// an in-memory device. Sends `send_bytes` of pattern stream `role` while receiving and
/// verifying `recv_bytes` of the peer's stream, on one connection.
pub(crate) struct SmoltcpEndpoint {
    iface: Interface,
    sockets: SocketSet<'static>,
    handle: SocketHandle,
    dev: FrameQueue,
    mac: EthernetAddress,
    role: Role,
    remote: IpAddress,
    connect_pending: bool,
    written: u64,
    report: EndpointReport,
    next_poll: Option<Instant>,
    /// Highest sequence number sent, for counting retransmissions.
    snd_max: Option<Seq>,
    retransmits: u64,
}

fn stream_id(role: Role) -> u8 {
    match role {
        Role::Client => 1,
        Role::Server => 2,
    }
}

impl SmoltcpEndpoint {
    /// An endpoint per `setup`; a client connects at its first `transmit`.
    pub(crate) fn new(setup: &SmoltcpSetup) -> SmoltcpEndpoint {
        let mac = EthernetAddress([
            0x02,
            0,
            0,
            0,
            0,
            if setup.role == Role::Client { 1 } else { 2 },
        ]);
        let mut dev = FrameQueue {
            rx: VecDeque::new(),
            tx: Vec::new(),
            mtu: setup.stack.mtu,
        };
        let mut cfg = Config::new(HardwareAddress::Ethernet(mac));
        cfg.random_seed = 7 + u64::from(stream_id(setup.role));
        let mut iface = Interface::new(cfg, &mut dev, Instant::ZERO);
        let (local, remote, prefix) = addrs(setup.ipv6, setup.role);
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(local, prefix));
        });
        // The engine's socket, except the wall-clock timestamp generator: ours reads the
        // virtual clock.
        let stack = StackConfig {
            timestamps: false,
            ..setup.stack.clone()
        };
        let mut sock = crate::socket::new_socket(&stack, &setup.tcp);
        if setup.stack.timestamps {
            sock.set_tsval_generator(Some(virtual_tsval));
        }
        if setup.role == Role::Server {
            sock.listen(PORT).expect("listen on a fresh socket");
        }
        let mut sockets = SocketSet::new(Vec::new());
        let handle = sockets.add(sock);
        SmoltcpEndpoint {
            iface,
            sockets,
            handle,
            dev,
            mac,
            role: setup.role,
            remote,
            connect_pending: setup.role == Role::Client,
            written: 0,
            report: EndpointReport {
                send_total: setup.send_bytes,
                recv_total: setup.recv_bytes,
                ..EndpointReport::default()
            },
            next_poll: Some(Instant::ZERO),
            snd_max: None,
            retransmits: 0,
        }
    }

    /// Move bytes between the socket and the pattern streams; `true` if any moved.
    fn app(&mut self, now: Instant) -> bool {
        let sock = self.sockets.get_mut::<tcp::Socket>(self.handle);
        let mut moved = false;
        let peer_stream = match self.role {
            Role::Client => stream_id(Role::Server),
            Role::Server => stream_id(Role::Client),
        };
        while sock.can_recv() {
            let r = &mut self.report;
            let n = sock
                .recv(|buf| {
                    for (i, &b) in buf.iter().enumerate() {
                        let off = r.delivered + i as u64;
                        if r.first_mismatch.is_none()
                            && (off >= r.recv_total || b != pattern_byte(peer_stream, off))
                        {
                            r.first_mismatch = Some(off);
                        }
                    }
                    (buf.len(), buf.len())
                })
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            self.report.delivered += n as u64;
            moved = true;
        }
        if self.report.recv_done_at.is_none() && self.report.delivered >= self.report.recv_total {
            self.report.recv_done_at = Some(now);
        }
        let mine = stream_id(self.role);
        while sock.can_send() && self.written < self.report.send_total {
            let start = self.written;
            let left = self.report.send_total - start;
            let n = sock
                .send(|buf| {
                    let n = buf.len().min(left.min(usize::MAX as u64) as usize);
                    for (i, b) in buf[..n].iter_mut().enumerate() {
                        *b = pattern_byte(mine, start + i as u64);
                    }
                    (n, n)
                })
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            self.written += n as u64;
            moved = true;
        }
        if sock.is_active() {
            self.report.acked = self.written - sock.send_queue() as u64;
        }
        if self.report.send_done_at.is_none()
            && self.written >= self.report.send_total
            && self.report.acked >= self.report.send_total
            && self.connected()
        {
            self.report.send_done_at = Some(now);
        }
        moved
    }

    fn connected(&self) -> bool {
        matches!(
            self.sockets.get::<tcp::Socket>(self.handle).state(),
            tcp::State::Established | tcp::State::CloseWait
        )
    }

    /// Sort what the interface sent: IP packets go out on the wire, ARP requests and
    /// neighbour solicitations are answered locally.
    fn drain_frames(&mut self, out: &mut Vec<Vec<u8>>) {
        for frame in std::mem::take(&mut self.dev.tx) {
            let Ok(eth) = EthernetFrame::new_checked(&frame[..]) else {
                continue;
            };
            match eth.ethertype() {
                EthernetProtocol::Ipv4 => {
                    self.count_retransmit(&frame[ETH_HEADER..]);
                    out.push(frame[ETH_HEADER..].to_vec());
                }
                EthernetProtocol::Ipv6 => {
                    if let Some(reply) = self.neighbor_advert(&frame[ETH_HEADER..]) {
                        self.dev.rx.push_back(reply);
                    } else {
                        self.count_retransmit(&frame[ETH_HEADER..]);
                        out.push(frame[ETH_HEADER..].to_vec());
                    }
                }
                EthernetProtocol::Arp => {
                    if let Some(reply) = self.arp_reply(eth.payload()) {
                        self.dev.rx.push_back(reply);
                    }
                }
                _ => {}
            }
        }
    }

    fn ethernet(&self, proto: EthernetProtocol, payload_len: usize) -> Vec<u8> {
        let mut f = vec![0u8; ETH_HEADER + payload_len];
        EthernetRepr {
            src_addr: PEER_MAC,
            dst_addr: self.mac,
            ethertype: proto,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
        f
    }

    fn arp_reply(&self, payload: &[u8]) -> Option<Vec<u8>> {
        let repr = ArpRepr::parse(&ArpPacket::new_checked(payload).ok()?).ok()?;
        let ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        } = repr
        else {
            return None;
        };
        let reply = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: PEER_MAC,
            source_protocol_addr: target_protocol_addr,
            target_hardware_addr: source_hardware_addr,
            target_protocol_addr: source_protocol_addr,
        };
        let mut f = self.ethernet(EthernetProtocol::Arp, reply.buffer_len());
        reply.emit(&mut ArpPacket::new_unchecked(&mut f[ETH_HEADER..]));
        Some(f)
    }

    fn neighbor_advert(&self, ip: &[u8]) -> Option<Vec<u8>> {
        let pkt = Ipv6Packet::new_checked(ip).ok()?;
        let hdr = Ipv6Repr::parse(&pkt).ok()?;
        if hdr.next_header != IpProtocol::Icmpv6 {
            return None;
        }
        let icmp = Icmpv6Packet::new_checked(pkt.payload()).ok()?;
        let caps = smoltcp::phy::ChecksumCapabilities::default();
        let repr = Icmpv6Repr::parse(&hdr.src_addr, &hdr.dst_addr, &icmp, &caps).ok()?;
        let Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit { target_addr, .. }) = repr else {
            return None;
        };
        let advert = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
            flags: NdiscNeighborFlags::SOLICITED | NdiscNeighborFlags::OVERRIDE,
            target_addr,
            lladdr: Some(RawHardwareAddress::from(PEER_MAC)),
        });
        let ip_repr = Ipv6Repr {
            src_addr: target_addr,
            dst_addr: hdr.src_addr,
            next_header: IpProtocol::Icmpv6,
            payload_len: advert.buffer_len(),
            hop_limit: 255,
        };
        let mut f = self.ethernet(
            EthernetProtocol::Ipv6,
            ip_repr.buffer_len() + advert.buffer_len(),
        );
        let mut ip_pkt = Ipv6Packet::new_unchecked(&mut f[ETH_HEADER..]);
        ip_repr.emit(&mut ip_pkt);
        advert.emit(
            &target_addr,
            &hdr.src_addr,
            &mut Icmpv6Packet::new_unchecked(ip_pkt.payload_mut()),
            &caps,
        );
        Some(f)
    }

    /// A data segment whose end is not beyond the highest sequence sent before is a
    /// retransmission.
    fn count_retransmit(&mut self, ip: &[u8]) {
        let tcp_bytes = match ip.first().map(|b| b >> 4) {
            Some(4) => Ipv4Packet::new_checked(ip)
                .ok()
                .filter(|p| p.next_header() == IpProtocol::Tcp)
                .map(|p| {
                    let h = p.header_len() as usize;
                    let total = (p.total_len() as usize).min(ip.len());
                    &ip[h.min(total)..total]
                }),
            Some(6) => Ipv6Packet::new_checked(ip)
                .ok()
                .filter(|p| p.next_header() == IpProtocol::Tcp)
                .map(|p| {
                    let end = (40 + p.payload_len() as usize).min(ip.len());
                    &ip[40.min(end)..end]
                }),
            _ => None,
        };
        let Some(seg) = tcp_bytes.and_then(|b| TcpPacket::new_checked(b).ok()) else {
            return;
        };
        let len = seg.payload().len() as u32 + u32::from(seg.syn()) + u32::from(seg.fin());
        if len == 0 {
            return;
        }
        let seq = Seq(seg.seq_number().0 as u32);
        let end = seq.wrapping_add(len);
        match self.snd_max {
            Some(max) if !end.after(max) => self.retransmits += 1,
            _ => self.snd_max = Some(end),
        }
    }
}

impl SimEndpoint for SmoltcpEndpoint {
    fn receive(&mut self, _now: Instant, packet: &[u8]) {
        let proto = match packet.first().map(|b| b >> 4) {
            Some(4) => EthernetProtocol::Ipv4,
            Some(6) => EthernetProtocol::Ipv6,
            _ => return,
        };
        let mut f = self.ethernet(proto, packet.len());
        f[ETH_HEADER..].copy_from_slice(packet);
        self.dev.rx.push_back(f);
    }

    fn transmit(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        VIRTUAL_MS.with(|c| c.set(now.total_millis() as u32));
        if self.connect_pending {
            self.connect_pending = false;
            let remote = self.remote;
            let sock = self.sockets.get_mut::<tcp::Socket>(self.handle);
            // A fresh socket with a fixed local port: connect cannot fail here.
            let _ = sock.connect(self.iface.context(), (remote, PORT), CLIENT_PORT);
        }
        // Poll until neither the interface nor the application has anything more to do
        // at this instant (bounded: local ARP/NDP answers take one more round).
        for _ in 0..16 {
            self.iface.poll(now, &mut self.dev, &mut self.sockets);
            let moved = self.app(now);
            self.drain_frames(out);
            if !moved && self.dev.rx.is_empty() {
                break;
            }
        }
        self.next_poll = self.iface.poll_at(now, &self.sockets);
    }

    fn poll_at(&self, _now: Instant) -> Option<Instant> {
        self.next_poll
    }

    fn done(&self) -> bool {
        self.report.recv_done_at.is_some() && self.report.send_done_at.is_some()
    }

    fn report(&self) -> EndpointReport {
        EndpointReport {
            retransmits: Some(self.retransmits),
            rtos: None,
            ..self.report.clone()
        }
    }
}

// --- The goodput table --------------------------------------------------------------

/// The wires of the goodput table: (name, bit/s, one-way delay µs).
pub(crate) const TABLE_LINKS: [(&str, u64, u64); 2] = [
    ("1G/100µs", 1_000_000_000, 100),
    ("80M/5ms", 80_000_000, 5000),
];

/// The loss rates of the goodput table; at 5% also 2% duplication and 2% reordering (by one
/// one-way delay).
pub(crate) const TABLE_LOSSES: [f64; 4] = [0.0, 0.001, 0.01, 0.05];

/// The wire of one table cell: `deep` queue (4 MiB, above both 1 MiB windows: no tail
/// drops) or two bandwidth-delay products (at least 64 KiB).
pub(crate) fn table_wire(
    bits: u64,
    one_way_us: u64,
    deep: bool,
    loss: f64,
    seed: u64,
) -> WireConfig {
    let mut cfg = WireConfig::link(bits, Duration::from_micros(one_way_us));
    if deep {
        cfg.queue_bytes = 4 << 20;
    }
    cfg.loss = loss;
    if loss >= 0.05 {
        cfg.duplicate = 0.02;
        cfg.reorder = 0.02;
        cfg.reorder_extra = Duration::from_micros(one_way_us);
    }
    cfg.seed = seed;
    cfg
}

/// Print the goodput table (both wires, both queue depths, every loss rate, full duplex and
/// one-way; three seeds per cell, the median run shown) for endpoints made by
/// `make(a_to_b_bytes, b_to_a_bytes)`. A cell whose runs did not all finish byte-exact within
/// 900 s of virtual time is marked with the number that did not.
pub(crate) fn print_goodput_table<A: SimEndpoint, B: SimEndpoint>(
    label: &str,
    n: u64,
    mut make: impl FnMut(u64, u64) -> (A, B),
) {
    println!("{label}, {n} bytes per direction, median of 3 seeds");
    println!(
        "| wire | queue | loss | dir | a→b Mbit/s | b→a Mbit/s | time s | lost | tail drops | retransmits | unfinished |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, bits, one_way_us) in TABLE_LINKS {
        for (qname, deep) in [("4 MiB", true), ("2·BDP", false)] {
            for loss in TABLE_LOSSES {
                for duplex in [true, false] {
                    let mut runs: Vec<RunReport> = (0..3u64)
                        .map(|seed| {
                            let (mut a, mut b) = make(n, if duplex { n } else { 0 });
                            let mut w =
                                Wire::new(table_wire(bits, one_way_us, deep, loss, 11 + seed));
                            run(
                                &mut a,
                                &mut b,
                                &mut w,
                                Limit {
                                    time: Duration::from_secs(900),
                                    steps: 50_000_000,
                                },
                            )
                        })
                        .collect();
                    let bad = |r: &RunReport| {
                        r.stop != Stop::Done
                            || r.a.first_mismatch.is_some()
                            || r.b.first_mismatch.is_some()
                    };
                    let unfinished = runs.iter().filter(|r| bad(r)).count();
                    runs.sort_by_key(|r| r.elapsed.total_micros());
                    let r = &runs[1];
                    println!(
                        "| {} | {} | {}{} | {} | {:.1} | {} | {:.2} | {} | {} | {} | {} |",
                        name,
                        qname,
                        loss * 100.0,
                        if loss >= 0.05 {
                            "% +2% dup +2% reorder"
                        } else {
                            "%"
                        },
                        if duplex { "both" } else { "a→b" },
                        r.goodput_ab() / 1e6,
                        if duplex {
                            format!("{:.1}", r.goodput_ba() / 1e6)
                        } else {
                            "–".into()
                        },
                        r.elapsed.total_micros() as f64 / 1e6,
                        r.wire[0].lost + r.wire[1].lost,
                        r.wire[0].queue_drops + r.wire[1].queue_drops,
                        r.a.retransmits.unwrap_or(0) + r.b.retransmits.unwrap_or(0),
                        if unfinished == 0 {
                            "".to_string()
                        } else {
                            format!("{unfinished}/3")
                        },
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loss-free wire whose queue (4 MiB) holds more than both sockets' windows (1 MiB
    /// each): no tail drops.
    fn lossless(bits: u64, one_way_us: i64) -> WireConfig {
        WireConfig {
            queue_bytes: 4 << 20,
            ..WireConfig::link(bits, Duration::from_micros(one_way_us as u64))
        }
    }

    fn ip_packet(len: usize) -> Vec<u8> {
        let mut p = vec![0u8; len];
        p[0] = 0x45;
        p
    }

    #[test]
    fn wire_serialisation_and_propagation_delay() {
        // 8 Mbit/s: a 1000-byte packet with no overhead takes 1 ms to serialise.
        let mut cfg = lossless(8_000_000, 500);
        cfg.frame_overhead = 0;
        let mut w = Wire::new(cfg);
        for _ in 0..3 {
            w.send(Instant::ZERO, 0, ip_packet(1000));
        }
        let mut arrivals = Vec::new();
        while let Some(t) = w.next_arrival() {
            let (to, p) = w.pop_due(t).expect("due at its arrival");
            assert_eq!((to, p.len()), (1, 1000));
            arrivals.push(t.total_micros());
        }
        assert_eq!(arrivals, vec![1500, 2500, 3500]);
        assert_eq!(w.stats()[0].delivered, 3);
    }

    #[test]
    fn wire_tail_drop_when_queue_full() {
        let mut cfg = WireConfig::link(8_000_000, Duration::from_micros(100));
        cfg.frame_overhead = 0;
        cfg.queue_bytes = 3000;
        let mut w = Wire::new(cfg);
        for _ in 0..10 {
            w.send(Instant::ZERO, 1, ip_packet(1000));
        }
        assert_eq!(w.stats()[1].queue_drops, 7);
        assert_eq!(w.in_flight.len(), 3);
        // 1.5 ms later 1.5 packets have left: room for one more.
        let t = Instant::from_micros(1500);
        w.send(t, 1, ip_packet(1000));
        w.send(t, 1, ip_packet(1000));
        assert_eq!(w.stats()[1].queue_drops, 8);
        assert!(w.pop_due(Instant::from_micros(1000)).is_none());
        assert_eq!(w.pop_due(Instant::from_micros(1100)).map(|x| x.0), Some(0));
    }

    #[test]
    fn wire_loss_duplication_reordering_rates_follow_config() {
        let mut cfg = WireConfig::link(0, Duration::from_micros(1000));
        cfg.loss = 0.05;
        cfg.duplicate = 0.02;
        cfg.reorder = 0.02;
        cfg.reorder_extra = Duration::from_micros(500);
        cfg.seed = 42;
        let mut w = Wire::new(cfg);
        let n = 100_000u64;
        for i in 0..n {
            let mut p = ip_packet(64);
            p[8..16].copy_from_slice(&i.to_be_bytes());
            w.send(Instant::from_micros(i as i64 * 10), 0, p);
        }
        let s = w.stats()[0];
        let near = |x: u64, p: f64, base: u64| {
            (x as f64 - p * base as f64).abs() < 0.1 * p * base as f64 + 50.0
        };
        assert!(near(s.duplicated, 0.02, n), "{s:?}");
        assert!(near(s.lost, 0.05, n + s.duplicated), "{s:?}");
        assert!(near(s.reordered, 0.02, n + s.duplicated - s.lost), "{s:?}");
        // Reordered packets arrive after packets sent up to 500 µs later.
        let mut ids = Vec::new();
        while let Some(t) = w.next_arrival() {
            let (_, p) = w.pop_due(t).expect("due");
            ids.push(u64::from_be_bytes(p[8..16].try_into().unwrap()));
        }
        assert_eq!(ids.len() as u64, n + s.duplicated - s.lost);
        let overtaken = ids.windows(2).filter(|w| w[1] < w[0]).count() as u64;
        assert!(
            overtaken > s.reordered / 2 && overtaken <= s.reordered,
            "{overtaken} {s:?}"
        );
        // Same seed, same run.
        let mut cfg2 = WireConfig::link(0, Duration::from_micros(1000));
        cfg2.loss = 0.05;
        cfg2.duplicate = 0.02;
        cfg2.reorder = 0.02;
        cfg2.reorder_extra = Duration::from_micros(500);
        cfg2.seed = 42;
        let mut w2 = Wire::new(cfg2);
        for i in 0..n {
            w2.send(Instant::from_micros(i as i64 * 10), 0, ip_packet(64));
        }
        assert_eq!(w2.stats()[0], s);
    }

    #[test]
    fn wire_drops_and_counts_packets_above_the_mtu() {
        let mut w = Wire::new(lossless(0, 10));
        w.send(Instant::ZERO, 0, ip_packet(1500));
        w.send(Instant::ZERO, 0, ip_packet(1501));
        assert_eq!(w.stats()[0].oversized, 1);
        assert_eq!(
            w.pop_due(Instant::from_micros(10)).map(|p| p.1.len()),
            Some(1500)
        );
        assert_eq!(w.pop_due(Instant::from_micros(10)), None);
    }

    #[test]
    fn wire_drops_what_is_not_ip() {
        let mut w = Wire::new(lossless(0, 10));
        w.send(Instant::ZERO, 0, vec![0x00; 20]);
        w.send(Instant::ZERO, 0, Vec::new());
        assert_eq!(w.stats()[0].not_ip, 2);
        assert!(w.next_arrival().is_none());
    }

    /// Sends one packet every `every` µs forever, or nothing; never done.
    struct Ticker {
        every: Option<i64>,
        next: i64,
        got: u64,
    }

    impl SimEndpoint for Ticker {
        fn receive(&mut self, _now: Instant, _packet: &[u8]) {
            self.got += 1;
        }
        fn transmit(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
            if let Some(e) = self.every {
                if now.total_micros() >= self.next {
                    out.push(ip_packet(100));
                    self.next = now.total_micros() + e;
                }
            }
        }
        fn poll_at(&self, _now: Instant) -> Option<Instant> {
            self.every.map(|_| Instant::from_micros(self.next))
        }
        fn done(&self) -> bool {
            false
        }
        fn report(&self) -> EndpointReport {
            EndpointReport {
                delivered: self.got,
                ..EndpointReport::default()
            }
        }
    }

    #[test]
    fn run_stops_on_idle_time_and_step_limits() {
        let quiet = || Ticker {
            every: None,
            next: 0,
            got: 0,
        };
        let ticking = || Ticker {
            every: Some(1000),
            next: 0,
            got: 0,
        };
        let limit = Limit {
            time: Duration::from_secs(1),
            steps: 1_000_000,
        };
        let r = run(
            &mut quiet(),
            &mut quiet(),
            &mut Wire::new(lossless(0, 10)),
            limit,
        );
        assert_eq!(r.stop, Stop::Idle);
        let (mut a, mut b) = (ticking(), quiet());
        let r = run(&mut a, &mut b, &mut Wire::new(lossless(0, 10)), limit);
        assert_eq!(r.stop, Stop::TimeLimit);
        assert!(r.elapsed >= Duration::from_secs(1) && r.elapsed < Duration::from_millis(1002));
        assert!((999..=1002).contains(&b.got), "{}", b.got);
        let r = run(
            &mut ticking(),
            &mut ticking(),
            &mut Wire::new(lossless(0, 10)),
            Limit {
                time: Duration::from_secs(1),
                steps: 50,
            },
        );
        assert_eq!((r.stop, r.steps), (Stop::StepLimit, 50));
    }

    #[test]
    fn pattern_detects_shift() {
        let a: Vec<u8> = (0..4096).map(|i| pattern_byte(1, i)).collect();
        let b: Vec<u8> = (1..4097).map(|i| pattern_byte(1, i)).collect();
        let c: Vec<u8> = (0..4096).map(|i| pattern_byte(2, i)).collect();
        assert!(a.iter().zip(&b).filter(|(x, y)| x == y).count() < 64);
        assert!(a.iter().zip(&c).filter(|(x, y)| x == y).count() < 64);
    }

    pub(crate) fn smoltcp_pair(
        ipv6: bool,
        client_bytes: u64,
        server_bytes: u64,
    ) -> (SmoltcpEndpoint, SmoltcpEndpoint) {
        let mut c = SmoltcpSetup::engine(Role::Client, client_bytes, server_bytes);
        let mut s = SmoltcpSetup::engine(Role::Server, server_bytes, client_bytes);
        c.ipv6 = ipv6;
        s.ipv6 = ipv6;
        (SmoltcpEndpoint::new(&c), SmoltcpEndpoint::new(&s))
    }

    fn check_exact(r: &RunReport, ab: u64, ba: u64) {
        assert_eq!(r.stop, Stop::Done, "{r:#?}");
        assert_eq!(r.b.delivered, ab, "{r:#?}");
        assert_eq!(r.a.delivered, ba, "{r:#?}");
        assert_eq!(r.a.first_mismatch, None);
        assert_eq!(r.b.first_mismatch, None);
        assert_eq!(r.a.acked, ba.max(r.a.send_total));
        assert_eq!(r.wire[0].oversized + r.wire[1].oversized, 0, "{r:#?}");
    }

    #[test]
    fn smoltcp_full_duplex_byte_exact_lossless_ipv4() {
        let n = 4 << 20;
        let (mut a, mut b) = smoltcp_pair(false, n, n);
        let mut w = Wire::new(lossless(1_000_000_000, 100));
        let r = run(
            &mut a,
            &mut b,
            &mut w,
            Limit {
                time: Duration::from_secs(30),
                steps: 2_000_000,
            },
        );
        check_exact(&r, n, n);
        assert!(r.steps < 2_000_000);
        assert_eq!(r.wire[0].queue_drops + r.wire[1].queue_drops, 0, "{r:#?}");
        // 4 MiB each way at 1 Gbit/s: at least 20 ms, and no stall on a clean wire.
        assert!(r.elapsed > Duration::from_millis(20), "{r:#?}");
        assert!(r.elapsed < Duration::from_secs(2), "{r:#?}");
    }

    #[test]
    fn smoltcp_full_duplex_byte_exact_lossless_ipv6() {
        let n = 1 << 20;
        let (mut a, mut b) = smoltcp_pair(true, n, n / 2);
        let mut w = Wire::new(lossless(80_000_000, 5000));
        let r = run(
            &mut a,
            &mut b,
            &mut w,
            Limit {
                time: Duration::from_secs(30),
                steps: 2_000_000,
            },
        );
        check_exact(&r, n, n / 2);
    }

    #[test]
    fn smoltcp_full_duplex_byte_exact_one_percent_loss() {
        let n = 1 << 20;
        let (mut a, mut b) = smoltcp_pair(false, n, n);
        let mut cfg = lossless(80_000_000, 5000);
        cfg.loss = 0.01;
        cfg.duplicate = 0.01;
        cfg.reorder = 0.01;
        cfg.reorder_extra = Duration::from_micros(2000);
        cfg.seed = 3;
        let mut w = Wire::new(cfg);
        let r = run(
            &mut a,
            &mut b,
            &mut w,
            Limit {
                time: Duration::from_secs(600),
                steps: 5_000_000,
            },
        );
        check_exact(&r, n, n);
        assert!(r.wire[0].lost + r.wire[1].lost > 0);
        assert!(r.a.retransmits.unwrap_or(0) + r.b.retransmits.unwrap_or(0) > 0);
    }

    /// The baseline table of stack/README.md ("Baseline: smoltcp's socket on the simulated
    /// wire"). Run by hand:
    /// `cargo test -p xwarp-stack --release --lib tcp::wire_sim -- --ignored --nocapture`
    /// (`XWARP_SIM_BYTES` sets the bytes per direction, default 16 MiB).
    #[test]
    #[ignore]
    fn measure_smoltcp_baseline() {
        let n: u64 = std::env::var("XWARP_SIM_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16 << 20);
        print_goodput_table("smoltcp↔smoltcp", n, |ab, ba| smoltcp_pair(false, ab, ba));
    }
}
