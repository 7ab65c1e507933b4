//! The own TCP core's service path (issue 13, `StackConfig::tcp_core = TcpCore::Own`):
//! connections are `tcp::conn::Connection`s instead of smoltcp sockets; smoltcp's
//! `Interface` keeps Ethernet, ARP, NDP, IPv4/IPv6 and ICMP.
//!
//! Per engine iteration ([`TcpService`]'s poll delegates here): application commands, the
//! protocol host's `poll` and requests, ingress (every frame parsed by `engine::frames`;
//! a TCP segment for one of the engine's addresses goes to its connection through
//! `engine::demux`, or to a listener (`engine::listen`), or is answered with the RFC 9293
//! §3.10.7.1 RST; everything else is replayed into the `Interface` unchanged), then the
//! connections whose timer is due (`engine::timers`), the dirty ones and the hosted ones
//! are served, and the `Interface`'s own egress (ARP/NDP replies, the raw-socket path
//! below) runs.
//!
//! A connection's segments are written straight into the device's TX token
//! (`frames::write_segment`: headers, payload copied from the `TxSource`, checksum) as
//! soon as it has something to send: after every received segment (one ACK per
//! segment, RFC 5681 §4.2) and after every application or host event. The destination MAC
//! is the source MAC of the peer's last frame (a routed peer's frames carry the
//! gateway's). Before the first frame from the peer (an active open's SYN) the segment is
//! handed to the `Interface` through a smoltcp raw socket (`IpProtocol::Tcp`), so the
//! `Interface` resolves the neighbour (ARP/NDP, gateway route) and frames it.
//!
//! Byte paths: an application connection's rx ring is the `RxSink` (in-order payload
//! copied from the received frame into the ring: one copy), its tx ring the `TxSource`
//! (read at an offset from SND.UNA without consuming; acknowledged bytes are consumed from
//! the ring, which wakes a blocked writer). A hosted connection's bytes go to
//! `ProtocolHost::on_recv` straight from the frame; `on_send` fills an engine-side
//! `RingTx` of `tx_buffer` bytes the connection sends and resends from.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use smoltcp::iface::{Interface, PollIngressSingleResult, PollResult, SocketHandle, SocketSet};
use smoltcp::phy::{ChecksumCapabilities, Device, RxToken, TxToken};
use smoltcp::socket::raw;
use smoltcp::wire::{EthernetAddress, IpAddress, IpEndpoint, IpProtocol, IpVersion, TcpRepr};

use crate::command::{AcceptedConn, Command};
use crate::config::{Congestion, SocketOptions, StackConfig};
use crate::conn::{close_expired, CloseProgress};
use crate::device::{CappedDevice, ETHERNET_HEADER_LEN};
use crate::engine::demux::{Demux, FourTuple};
use crate::engine::frames::{self, Ingress};
use crate::engine::listen::{Listener, Listeners};
use crate::engine::timers::Timers;
use crate::ports::Ports;
use crate::proto::{CloseRequest, CtlReq, ProtoConnId, ProtoCtl, ProtocolHost};
use crate::rescue::ReplayDevice;
use crate::shared::{ListenerShared, SocketError, SocketShared, TcpInfo, WANT_READ, WANT_WRITE};
use crate::socket::buffer_sizes;
use crate::stats::{EngineUsage, StackStats};
use crate::tcp::conn::{ConnConfig, ConnError, Connection, RingTx, RxSink, State, TxSource};
use crate::tcp::seq::Seq;

/// TIME-WAIT of the own core's connections: smoltcp's fixed 10 s, so both cores hold a
/// closed connection (and its port) equally long.
const TIME_WAIT: Duration = Duration::from_secs(10);

/// Frames taken from the device per engine iteration (the rest waits for the next).
///
/// Small on purpose: what the connections send in answer leaves the device only when the
/// engine flushes it at the end of the iteration (an AF_XDP socket in copy mode sends on
/// the kick), so a long batch holds every reply back for the whole batch. With 1024 a
/// sender behind a Linux receiver (an ACK per one or two segments) worked through
/// batches of stale ACKs for 10–40 ms while its answers waited in the TX ring: the path
/// looked 10–40 ms long to RACK and the RTT estimator, the window was idle between
/// batches, and goodput at 1% loss fell to 0.04–0.12 Gbit/s.
const INGRESS_BUDGET: usize = 64;

/// Hasher of the engine's connection ids: counters the engine assigns itself (no peer
/// chooses them), so one multiply spreads them well enough and SipHash (the default, ~4
/// lookups per frame, 12% of the core's instructions on a bulk transfer) is not needed.
#[derive(Debug, Default, Clone, Copy)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by connection id.
type IdMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

/// What is on the engine side of an application connection.
struct AppSide {
    shared: Arc<SocketShared>,
    rx: rtrb::Producer<u8>,
    tx: rtrb::Consumer<u8>,
    shutdown: bool,
    app_closed: bool,
    /// Bytes moved into the rx ring / acknowledged out of the tx ring since the
    /// application was last notified.
    pushed: usize,
    acked: usize,
}

/// The protocol host's side of a hosted connection.
struct HostSide {
    /// Bytes the host wrote (`on_send`), sent and resent from here.
    tx: RingTx,
    /// `on_established` / `on_accepted` was called: bytes may be handed to the host.
    ready: bool,
    fin_reported: bool,
    /// Scratch for the record ends `ProtocolHost::record_ends` reports (offsets from the
    /// head of `tx`), kept to avoid an allocation per fill.
    ends: Vec<u64>,
}

/// Who consumes a connection's bytes.
enum End {
    /// A passive handshake in progress: no rings yet (allocated at promotion).
    Half {
        listener: u64,
    },
    App(AppSide),
    Host(HostSide),
}

/// One connection of the own core.
struct OwnConn {
    tcp: Connection,
    key: FourTuple,
    /// Where its frames go (the source MAC of the peer's last frame).
    mac: Option<EthernetAddress>,
    /// Ephemeral or claimed local port, released on removal.
    port: Option<u16>,
    /// Active open in progress, until this deadline.
    connecting: Option<Instant>,
    /// `tcp_fin_timeout` of a close (see [`crate::conn::CloseProgress`]).
    close_deadline: Option<Instant>,
    /// Where the close stood when `close_deadline` was last set.
    close_progress: Option<CloseProgress>,
    fin_queued: bool,
    /// The outcome was reported; the connection only waits for CLOSED to be removed.
    finished: bool,
    end: End,
    /// Most receive window offered: the receive buffer size (the rx ring holds more).
    window: usize,
    /// Serve it again on the next iteration (room appeared in a full rx ring).
    again: bool,
    /// Buffer bytes it holds (rings, the host's send queue; reserved at the SYN for a
    /// passive open), counted against `socket_buffer_budget`.
    bytes: u64,
}

impl OwnConn {
    /// `tcp_fin_timeout`: the close this end asked for made no progress (no byte or FIN
    /// newly acknowledged, no state change) for `fin_timeout`; TIME-WAIT runs its own timer.
    fn close_stalled(&mut self, state: State, now: Instant, fin_timeout: Duration) -> bool {
        self.close_deadline.is_some()
            && state != State::TimeWait
            && close_expired(
                &mut self.close_deadline,
                &mut self.close_progress,
                CloseProgress {
                    acked: self.tcp.info().bytes_acked,
                    state: state as u8,
                },
                now,
                fin_timeout,
            )
    }
}

/// An application listener's engine side.
struct AppListener {
    shared: Arc<ListenerShared>,
    accept: Sender<AcceptedConn>,
    port: u16,
}

impl Drop for AppListener {
    /// Wakes an application blocked on the listener when the engine forgets it.
    fn drop(&mut self) {
        self.shared.set_engine_dropped();
    }
}

/// A protocol host's listener.
struct HostListener {
    token: u64,
    port: u16,
}

/// The application's tx ring as the connection's `TxSource`: offset 0 is SND.UNA (the
/// ring's read position); bytes are read without being consumed.
struct AppTx<'a>(RefCell<&'a mut rtrb::Consumer<u8>>);

impl TxSource for AppTx<'_> {
    fn len(&self) -> u64 {
        self.0.borrow().slots() as u64
    }

    fn copy_at(&self, offset: u64, dst: &mut [u8]) -> usize {
        let mut c = self.0.borrow_mut();
        let have = c.slots();
        if offset >= have as u64 {
            return 0;
        }
        let off = offset as usize;
        let n = dst.len().min(have - off);
        let Ok(chunk) = c.read_chunk(off + n) else {
            return 0;
        };
        let (a, b) = chunk.as_slices();
        copy_range(a, b, off, &mut dst[..n]);
        // Not committed: the bytes stay in the ring until acknowledged.
        n
    }
}

/// Copy `dst.len()` bytes starting at `off` of the concatenation `a ++ b` into `dst`.
fn copy_range(a: &[u8], b: &[u8], off: usize, dst: &mut [u8]) {
    let n = dst.len();
    if off < a.len() {
        let first = (a.len() - off).min(n);
        dst[..first].copy_from_slice(&a[off..off + first]);
        dst[first..].copy_from_slice(&b[..n - first]);
    } else {
        let o = off - a.len();
        dst.copy_from_slice(&b[o..o + n]);
    }
}

/// The sink of one connection for one call (`on_segment` / `poll_transmit`).
enum Sink<'a> {
    /// Hold everything in the connection (handshake, host not told yet), offering
    /// `window`.
    Hold(usize),
    /// Take and drop everything (the application closed its end).
    Discard(usize),
    /// The application's rx ring, offering at most the receive buffer's worth.
    Ring(&'a mut rtrb::Producer<u8>, &'a mut usize, usize),
    Host {
        host: &'a mut dyn ProtocolHost,
        id: ProtoConnId,
        now: Instant,
        window: usize,
        got: &'a mut u64,
    },
}

impl RxSink for Sink<'_> {
    fn free(&self) -> usize {
        match self {
            Sink::Hold(w) | Sink::Discard(w) => *w,
            Sink::Ring(rx, _, limit) => rx.slots().min(*limit),
            Sink::Host { window, .. } => *window,
        }
    }

    fn deliver(&mut self, data: &[u8]) -> usize {
        match self {
            Sink::Hold(_) => 0,
            Sink::Discard(_) => data.len(),
            Sink::Ring(rx, pushed, _) => {
                let (_, rest) = rx.push_partial_slice(data);
                let n = data.len() - rest.len();
                **pushed += n;
                n
            }
            Sink::Host {
                host, id, now, got, ..
            } => {
                let n = host.on_recv(*id, *now, data).min(data.len());
                **got += n as u64;
                n
            }
        }
    }
}

/// Split a connection into its `Connection`, send queue and sink for one call.
fn parts<'a>(
    c: &'a mut OwnConn,
    host: Option<&'a mut dyn ProtocolHost>,
    id: u64,
    now: Instant,
    got: &'a mut u64,
) -> (&'a mut Connection, Tx<'a>, Sink<'a>) {
    let window = c.window;
    match &mut c.end {
        End::Half { .. } => (&mut c.tcp, Tx::None, Sink::Hold(window)),
        End::App(a) => {
            let sink = if a.app_closed {
                Sink::Discard(window)
            } else {
                Sink::Ring(&mut a.rx, &mut a.pushed, window)
            };
            (&mut c.tcp, Tx::App(AppTx(RefCell::new(&mut a.tx))), sink)
        }
        End::Host(h) => {
            let sink = match host {
                Some(host) if h.ready => Sink::Host {
                    host,
                    id,
                    now,
                    window,
                    got,
                },
                _ => Sink::Hold(window),
            };
            (&mut c.tcp, Tx::Host(&h.tx), sink)
        }
    }
}

/// The send queue of one connection for one call (no allocation per segment).
enum Tx<'a> {
    /// Nothing to send (handshakes, RSTs the engine sends itself).
    None,
    App(AppTx<'a>),
    Host(&'a RingTx),
}

impl TxSource for Tx<'_> {
    fn len(&self) -> u64 {
        match self {
            Tx::None => 0,
            Tx::App(a) => a.len(),
            Tx::Host(r) => r.len(),
        }
    }
    fn copy_at(&self, offset: u64, dst: &mut [u8]) -> usize {
        match self {
            Tx::None => 0,
            Tx::App(a) => a.copy_at(offset, dst),
            Tx::Host(r) => r.copy_at(offset, dst),
        }
    }
    fn next_boundary(&self, offset: u64) -> Option<u64> {
        match self {
            Tx::Host(r) => r.next_boundary(offset),
            _ => None,
        }
    }
    fn framed(&self) -> bool {
        matches!(self, Tx::Host(r) if r.framed())
    }
}

/// What the engine must do after one received frame.
enum Action {
    None,
    /// Send connection `id`'s segments now.
    Drive(u64),
    /// Answer a segment that matches no connection.
    Rst {
        mac: EthernetAddress,
        local: IpAddress,
        remote: IpAddress,
        repr: TcpRepr<'static>,
    },
}

/// What the own core needs of the service around it for one call.
pub(crate) struct Env<'a> {
    pub(crate) config: &'a StackConfig,
    pub(crate) counters: &'a mut StackStats,
    pub(crate) host: Option<&'a mut dyn ProtocolHost>,
    pub(crate) ids: &'a Arc<AtomicU64>,
}

impl Env<'_> {
    fn host(&mut self) -> Option<&mut dyn ProtocolHost> {
        match &mut self.host {
            Some(h) => Some(&mut **h),
            None => None,
        }
    }
}

/// The own core's state: connections, listeners, timers, ports and the raw sockets
/// of the first-SYN path.
pub(crate) struct OwnCore {
    epoch: Instant,
    conns: IdMap<OwnConn>,
    hosted: usize,
    demux: Demux,
    listeners: Listeners,
    app_listeners: HashMap<u64, AppListener>,
    host_listeners: HashMap<u64, HostListener>,
    timers: Timers,
    ports: Ports,
    raw: SocketSet<'static>,
    raw4: SocketHandle,
    raw6: SocketHandle,
    /// Non-TCP frames for the `Interface`, in arrival order.
    other: VecDeque<Vec<u8>>,
    dirty: Vec<u64>,
    /// Connections that found no TX token: served again next iteration.
    retry: Vec<u64>,
    scratch: Vec<u8>,
    iss_key: RandomState,
    host_deadline: Option<Instant>,
    caps: ChecksumCapabilities,
    mac: EthernetAddress,
    mtu: usize,
    /// Source MAC of the last TCP frame from each peer address (a routed peer's frames
    /// carry the gateway's): a new connection to a known peer needs no neighbour lookup.
    neighbours: HashMap<IpAddress, EthernetAddress>,
    /// Sum of the connections' `bytes`.
    buffer_bytes: u64,
}

/// Most peers whose MAC is remembered (the map is cleared when it is full).
const NEIGHBOURS_MAX: usize = 4096;

impl OwnCore {
    /// An empty core for `config`.
    pub(crate) fn new(config: &StackConfig, epoch: Instant) -> OwnCore {
        let mut raw = SocketSet::new(Vec::new());
        let mk = |v| {
            raw::Socket::new(
                Some(v),
                Some(IpProtocol::Tcp),
                raw::PacketBuffer::new(Vec::new(), Vec::new()),
                raw::PacketBuffer::new(vec![raw::PacketMetadata::EMPTY; 256], vec![0; 256 * 1600]),
            )
        };
        let raw4 = raw.add(mk(IpVersion::Ipv4));
        let raw6 = raw.add(mk(IpVersion::Ipv6));
        OwnCore {
            epoch,
            conns: IdMap::default(),
            hosted: 0,
            demux: Demux::default(),
            listeners: Listeners::default(),
            app_listeners: HashMap::new(),
            host_listeners: HashMap::new(),
            timers: Timers::default(),
            ports: Ports::new(config.ephemeral_ports.clone()),
            raw,
            raw4,
            raw6,
            other: VecDeque::new(),
            dirty: Vec::new(),
            retry: Vec::new(),
            scratch: vec![0; 65536 + 128],
            iss_key: RandomState::new(),
            host_deadline: None,
            caps: ChecksumCapabilities::default(),
            mac: EthernetAddress(config.mac),
            mtu: config.mtu,
            neighbours: HashMap::new(),
            buffer_bytes: 0,
        }
    }

    fn smol(&self, now: Instant) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(
            now.saturating_duration_since(self.epoch).as_micros() as i64
        )
    }

    fn std(&self, t: smoltcp::time::Instant) -> Instant {
        self.epoch + Duration::from_micros(t.total_micros().max(0) as u64)
    }

    /// What the core holds now.
    pub(crate) fn usage(&self) -> EngineUsage {
        // Every connection is in the demultiplexer, under its own 4-tuple.
        debug_assert_eq!(self.demux.len(), self.conns.len());
        EngineUsage {
            sockets: self.conns.len(),
            socket_buffer_bytes: self.buffer_bytes,
            connections: self.conns.len(),
            half_open: self.listeners.half_open(),
            tracked_flows: 0,
        }
    }

    /// Telemetry records of up to `cap` connections (`xwarp stat`); returns how many
    /// connections exist.
    pub(crate) fn conn_records(
        &self,
        out: &mut Vec<xwarp_telemetry::ConnRecord>,
        cap: usize,
    ) -> usize {
        let us = |d: smoltcp::time::Duration| d.total_micros();
        for (&id, c) in &self.conns {
            if out.len() >= cap {
                break;
            }
            let i = c.tcp.info();
            let (rx_ring, tx_ring, send_buffer, queued) = match &c.end {
                End::App(a) => (
                    Some((a.rx.buffer().capacity() - a.rx.slots()) as u64),
                    Some(a.tx.slots() as u64),
                    a.tx.buffer().capacity() as u64,
                    a.tx.slots() as u64,
                ),
                End::Host(h) => (None, None, h.tx.len() + h.tx.free() as u64, h.tx.len()),
                End::Half { .. } => (None, None, 0, 0),
            };
            out.push(xwarp_telemetry::ConnRecord {
                id,
                state: linux_state(i.state),
                hosted: matches!(c.end, End::Host(_)),
                local: Some(to_sock(c.key.0)),
                remote: Some(to_sock(c.key.1)),
                // Handed to TCP (as under smoltcp): acknowledged plus still queued.
                bytes_sent: i.bytes_acked + queued,
                bytes_acked: i.bytes_acked,
                bytes_received: i.bytes_received,
                send_queue: queued,
                send_buffer,
                recv_queue: i.ooo_bytes,
                recv_buffer: c.window as u64,
                rx_ring_used: rx_ring,
                tx_ring_used: tx_ring,
                retransmits: i.retransmits,
                srtt_us: i.srtt.map(us),
                rttvar_us: i.srtt.map(|_| us(i.rttvar)),
                rto_us: Some(us(i.rto)),
                cwnd: Some(u64::from(i.cwnd)),
                mss: u64::from(i.snd_mss),
            });
        }
        self.conns.len()
    }

    /// Hosted connections.
    pub(crate) fn hosted(&self) -> usize {
        self.hosted
    }

    /// Listeners (the application's and the host's).
    pub(crate) fn listeners(&self) -> usize {
        self.app_listeners.len() + self.host_listeners.len()
    }

    /// Number of connections (any state, handshakes included).
    pub(crate) fn len(&self) -> usize {
        self.conns.len()
    }

    /// RFC 6528 initial sequence number: a keyed hash of the 4-tuple plus a 4 µs clock.
    fn iss(&self, local: IpEndpoint, remote: IpEndpoint, now: Instant) -> Seq {
        let h = self.iss_key.hash_one((local, remote)) as u32;
        let m = (now.saturating_duration_since(self.epoch).as_micros() / 4) as u32;
        Seq(h.wrapping_add(m))
    }

    fn conn_config(&self, config: &StackConfig, o: &SocketOptions, window: usize) -> ConnConfig {
        let d = |d: Duration| smoltcp::time::Duration::from_micros(d.as_micros() as u64);
        let mut c = ConnConfig {
            mtu: self.mtu.min(u16::MAX as usize) as u16,
            rx_window_max: window.clamp(4096, 1 << 30) as u32,
            timestamps: config.timestamps,
            nagle: !o.nodelay.unwrap_or(config.tcp.nodelay),
            ack_delay: config.tcp.ack_delay.map(d),
            cc: match config.congestion {
                Congestion::Cubic => crate::tcp::cc::Algorithm::Cubic,
                // The own core always runs a congestion controller.
                Congestion::None => crate::tcp::cc::Algorithm::NewReno,
            },
            time_wait: d(TIME_WAIT),
            ..ConnConfig::default()
        };
        if let Some(floor) = config.rto_floor {
            c.rtt.min_rto = d(floor);
        }
        if let Some(k) = o.keepalive {
            c.keepalive = Some(d(k.idle));
            c.keepalive_interval = d(k.interval);
            c.keepalive_probes = k.count.max(1);
        } else if let Some(k) = config.tcp.keepalive {
            c.keepalive = Some(d(k));
            c.keepalive_interval = d(k);
        }
        c
    }

    fn local_addr(config: &StackConfig, remote: IpAddr) -> Option<IpAddress> {
        match remote {
            IpAddr::V4(_) => config.ipv4.map(|(a, _)| IpAddress::Ipv4(a)),
            IpAddr::V6(_) => config.ipv6.map(|(a, _)| IpAddress::Ipv6(a)),
        }
    }

    fn is_ours(config: &StackConfig, a: &IpAddress) -> bool {
        match a {
            IpAddress::Ipv4(v4) => config.ipv4.is_some_and(|(o, _)| o == *v4),
            IpAddress::Ipv6(v6) => config.ipv6.is_some_and(|(o, _)| o == *v6),
        }
    }

    fn usable(config: &StackConfig, ip: IpAddr) -> bool {
        if ip.is_unspecified() || ip.is_multicast() {
            return false;
        }
        match ip {
            IpAddr::V4(v4) => config.ipv4.is_some() && !v4.is_broadcast(),
            IpAddr::V6(_) => config.ipv6.is_some(),
        }
    }

    /// Whether one more connection holding `bytes` of buffers fits `max_sockets` and
    /// `socket_buffer_budget`.
    fn room_for(&self, config: &StackConfig, bytes: u64) -> bool {
        self.conns.len() < config.max_sockets
            && self.buffer_bytes.saturating_add(bytes) <= config.socket_buffer_budget
    }

    fn insert(&mut self, id: u64, c: OwnConn) {
        self.buffer_bytes += c.bytes;
        if matches!(c.end, End::Host(_)) {
            self.hosted += 1;
        }
        self.conns.insert(id, c);
    }

    /// Open a connection (application or hosted): `Err` when it cannot start.
    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        config: &StackConfig,
        id: u64,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
        options: &SocketOptions,
        end: End,
        now: Instant,
    ) -> Result<(), SocketError> {
        if !Self::usable(config, remote.ip()) || remote.port() == 0 {
            return Err(SocketError::InvalidAddress);
        }
        let Some(laddr) = Self::local_addr(config, remote.ip()) else {
            return Err(SocketError::InvalidAddress);
        };
        let bytes = match &end {
            // The socket-buffer part of the rings (`socket::ring_sizes`); the `ring_size`
            // part is bounded through `max_sockets`, as under smoltcp.
            End::App(a) => (a.rx.buffer().capacity() + a.tx.buffer().capacity())
                .saturating_sub(2 * config.ring_size) as u64,
            End::Host(h) => h.tx.len() + (h.tx.free() + config.rx_buffer) as u64,
            End::Half { .. } => 0,
        };
        if !self.room_for(config, bytes) {
            return Err(SocketError::NoBuffers);
        }
        let port = match local_port {
            Some(p) if self.ports.claim(p) => p,
            Some(_) => return Err(SocketError::AddrInUse),
            None => self.ports.allocate().ok_or(SocketError::AddrNotAvailable)?,
        };
        let local = IpEndpoint::new(laddr, port);
        let remote_ep = IpEndpoint::new(remote.ip().into(), remote.port());
        let (rx, _) = buffer_sizes(config, options);
        let window = rx;
        let cfg = self.conn_config(config, options, window);
        let iss = self.iss(local, remote_ep, now);
        let tcp = match Connection::connect(cfg, local, remote_ep, iss, self.smol(now)) {
            Ok(t) => t,
            Err(_) => {
                self.ports.release(port);
                return Err(SocketError::InvalidAddress);
            }
        };
        let key = (local, remote_ep);
        if !self.demux.insert(key, id) {
            self.ports.release(port);
            return Err(SocketError::AddrInUse);
        }
        let mac = self.neighbours.get(&remote_ep.addr).copied();
        self.insert(
            id,
            OwnConn {
                tcp,
                key,
                mac,
                port: Some(port),
                connecting: Some(deadline),
                close_deadline: None,
                close_progress: None,
                fin_queued: false,
                finished: false,
                end,
                window,
                again: false,
                bytes,
            },
        );
        self.dirty.push(id);
        Ok(())
    }

    /// Carry out one application command.
    pub(crate) fn command(&mut self, env: &mut Env<'_>, cmd: Command, now: Instant) {
        match cmd {
            Command::Connect {
                shared,
                rx,
                tx,
                remote,
                local_port,
                deadline,
            } => {
                let id = shared.id;
                let options = shared.options();
                let end = End::App(AppSide {
                    shared: shared.clone(),
                    rx,
                    tx,
                    shutdown: false,
                    app_closed: false,
                    pushed: 0,
                    acked: 0,
                });
                if let Err(e) = self.open(
                    env.config, id, remote, local_port, deadline, &options, end, now,
                ) {
                    if e == SocketError::NoBuffers {
                        env.counters.refused_limit += 1;
                    }
                    shared.set_error(e);
                }
            }
            Command::Listen {
                shared,
                accept,
                local,
                backlog,
            } => {
                let config = env.config;
                if !local.ip().is_unspecified() && !Self::usable(config, local.ip()) {
                    shared.set_error(SocketError::AddrNotAvailable);
                    return;
                }
                let id = shared.id;
                if !self.ports.listen(local.port(), id) {
                    shared.set_error(SocketError::AddrInUse);
                    return;
                }
                let addr = (!local.ip().is_unspecified()).then(|| IpAddress::from(local.ip()));
                let l = Listener::new(id, backlog.clamp(1, config.max_backlog), config.syn_backlog);
                if !self.listeners.add(addr, local.port(), l) {
                    self.ports.unlisten(local.port());
                    shared.set_error(SocketError::AddrInUse);
                    return;
                }
                shared.set_listening(local);
                self.app_listeners.insert(
                    id,
                    AppListener {
                        shared,
                        accept,
                        port: local.port(),
                    },
                );
            }
            Command::Unlisten { id } => {
                if let Some(l) = self.app_listeners.remove(&id) {
                    self.unlisten(id, l.port);
                }
            }
            Command::Rearm { id } => {
                if let Some(l) = self.listeners.get_mut(id) {
                    l.accepted();
                }
            }
            Command::Dirty { id } => self.dirty.push(id),
            Command::ShutdownWrite { id } => {
                if let Some(OwnConn {
                    end: End::App(a), ..
                }) = self.conns.get_mut(&id)
                {
                    a.shutdown = true;
                    self.dirty.push(id);
                }
            }
            Command::Close { id } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    if let End::App(a) = &mut c.end {
                        a.app_closed = true;
                        c.close_deadline = Some(now + env.config.fin_timeout);
                        if c.connecting.is_some() {
                            c.tcp.abort();
                        }
                        self.dirty.push(id);
                    }
                }
            }
            Command::Abort { id } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    if let End::App(a) = &mut c.end {
                        a.shared.set_error(SocketError::Aborted);
                        c.finished = true;
                        c.tcp.abort();
                        self.dirty.push(id);
                    }
                }
            }
            Command::SetNodelay { id, nodelay } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.tcp.set_nagle(!nodelay);
                    self.dirty.push(id);
                }
            }
        }
    }

    /// Stop listener `id` on `port`: its handshakes are reset.
    fn unlisten(&mut self, id: u64, port: u16) {
        self.listeners.remove(id);
        self.ports.unlisten(port);
        for (&cid, c) in self.conns.iter_mut() {
            if matches!(c.end, End::Half { listener } if listener == id) {
                c.tcp.abort();
                c.finished = true;
                self.dirty.push(cid);
            }
        }
    }

    /// Poll the protocol host and carry out its requests.
    pub(crate) fn poll_host(&mut self, env: &mut Env<'_>, now: Instant) {
        let ids = env.ids.clone();
        let Some(host) = env.host() else {
            return;
        };
        let mut ctl = ProtoCtl::new(ids);
        self.host_deadline = host.poll(now, &mut ctl);
        for req in ctl.into_requests() {
            match req {
                CtlReq::Connect {
                    id,
                    remote,
                    local_port,
                    deadline,
                } => {
                    let end = End::Host(HostSide {
                        tx: RingTx::new(env.config.tx_buffer),
                        ready: false,
                        fin_reported: false,
                        ends: Vec::new(),
                    });
                    let o = SocketOptions::default();
                    if let Err(e) =
                        self.open(env.config, id, remote, local_port, deadline, &o, end, now)
                    {
                        if e == SocketError::NoBuffers {
                            env.counters.refused_limit += 1;
                        }
                        if let Some(h) = env.host() {
                            h.on_closed(id, now, Some(e));
                        }
                    }
                }
                CtlReq::Listen {
                    token,
                    local,
                    backlog,
                } => {
                    let r = self.host_listen(env, token, local, backlog);
                    if let Some(h) = env.host() {
                        h.on_listen(token, r);
                    }
                }
                CtlReq::Unlisten { token } => {
                    let found = self
                        .host_listeners
                        .iter()
                        .find(|(_, l)| l.token == token)
                        .map(|(&id, l)| (id, l.port));
                    if let Some((id, port)) = found {
                        self.host_listeners.remove(&id);
                        self.unlisten(id, port);
                    }
                }
            }
        }
    }

    fn host_listen(
        &mut self,
        env: &mut Env<'_>,
        token: u64,
        local: SocketAddr,
        backlog: usize,
    ) -> Result<SocketAddr, SocketError> {
        let config = env.config;
        if !local.ip().is_unspecified() && !Self::usable(config, local.ip()) {
            return Err(SocketError::AddrNotAvailable);
        }
        let id = env.ids.fetch_add(1, Ordering::Relaxed);
        let mut local = local;
        if local.port() == 0 {
            local.set_port(self.ports.allocate().ok_or(SocketError::AddrNotAvailable)?);
            self.ports.release(local.port());
        }
        if !self.ports.listen(local.port(), id) {
            return Err(SocketError::AddrInUse);
        }
        let addr = (!local.ip().is_unspecified()).then(|| IpAddress::from(local.ip()));
        let l = Listener::new(id, backlog.clamp(1, config.max_backlog), config.syn_backlog);
        if !self.listeners.add(addr, local.port(), l) {
            self.ports.unlisten(local.port());
            return Err(SocketError::AddrInUse);
        }
        self.host_listeners.insert(
            id,
            HostListener {
                token,
                port: local.port(),
            },
        );
        Ok(local)
    }

    /// One received frame: a TCP segment of ours is handled here, anything else queued
    /// for the `Interface`.
    fn frame(&mut self, env: &mut Env<'_>, frame: &[u8], now: Instant) -> Action {
        let f = match frames::parse(frame, &self.caps) {
            Ingress::Tcp(f) => f,
            Ingress::Other => {
                self.other.push_back(frame.to_vec());
                return Action::None;
            }
            Ingress::Bad => return Action::None,
        };
        if !Self::is_ours(env.config, &f.local.addr) {
            return Action::None;
        }
        if self.neighbours.get(&f.remote.addr) != Some(&f.src_mac) {
            if self.neighbours.len() >= NEIGHBOURS_MAX {
                self.neighbours.clear();
            }
            self.neighbours.insert(f.remote.addr, f.src_mac);
        }
        let t = self.smol(now);
        if let Some(id) = self.demux.lookup(f.local, f.remote) {
            let Some(c) = self.conns.get_mut(&id) else {
                return Action::None;
            };
            c.mac = Some(f.src_mac);
            let mut got = 0;
            let out = {
                let (tcp, _tx, mut sink) = parts(c, env.host(), id, now, &mut got);
                tcp.on_segment(t, &f.repr, f.repr.payload, &mut sink)
            };
            env.counters.rx_bytes += got;
            if out.acked > 0 {
                release(c, out.acked);
            }
            return Action::Drive(id);
        }
        use smoltcp::wire::TcpControl;
        let syn = f.repr.control == TcpControl::Syn && f.repr.ack_number.is_none();
        if syn {
            if let Some(l) = self.listeners.find_mut(f.local) {
                let lid = l.id;
                let options = self
                    .app_listeners
                    .get(&lid)
                    .map(|a| a.shared.options)
                    .unwrap_or_default();
                // The buffers the connection will hold once established, reserved now.
                let bytes = if self.app_listeners.contains_key(&lid) {
                    let (r, t) = buffer_sizes(env.config, &options);
                    (r + t) as u64
                } else {
                    (env.config.rx_buffer + env.config.tx_buffer) as u64
                };
                if l.admit().is_err() || !self.room_for(env.config, bytes) {
                    env.counters.syn_dropped_backlog += 1;
                    return Action::None;
                }
                let cid = env.ids.fetch_add(1, Ordering::Relaxed);
                let window = if self.app_listeners.contains_key(&lid) {
                    buffer_sizes(env.config, &options).0
                } else {
                    env.config.rx_buffer
                };
                let cfg = self.conn_config(env.config, &options, window);
                let iss = self.iss(f.local, f.remote, now);
                let Ok(tcp) = Connection::accept_syn(cfg, f.local, f.remote, &f.repr, iss, t)
                else {
                    return Action::None;
                };
                let key = (f.local, f.remote);
                if !self.demux.insert(key, cid) {
                    return Action::None;
                }
                if let Some(l) = self.listeners.get_mut(lid) {
                    l.syn_received(cid, t);
                }
                self.insert(
                    cid,
                    OwnConn {
                        tcp,
                        key,
                        mac: Some(f.src_mac),
                        port: None,
                        connecting: None,
                        close_deadline: None,
                        close_progress: None,
                        fin_queued: false,
                        finished: false,
                        end: End::Half { listener: lid },
                        window,
                        again: false,
                        bytes,
                    },
                );
                return Action::Drive(cid);
            }
        }
        match frames::rst_for_unknown(&f.repr) {
            Some(repr) => Action::Rst {
                mac: f.src_mac,
                local: f.local.addr,
                remote: f.remote.addr,
                repr,
            },
            None => Action::None,
        }
    }

    /// Serve connection `id`: report what changed to its end, send what it has, re-arm
    /// its timer, remove it when done. Returns whether anything moved.
    fn drive<D: Device + ?Sized>(
        &mut self,
        env: &mut Env<'_>,
        dev: &mut D,
        id: u64,
        now: Instant,
    ) -> bool {
        if !self.conns.contains_key(&id) {
            return false;
        }
        let mut moved = self.report(env, id, now);
        moved |= self.transmit(env, dev, id, now);
        if self.report(env, id, now) {
            // What the end asked for (a FIN, a RST, bytes from the host) leaves now.
            moved = true;
            self.transmit(env, dev, id, now);
        }
        let Some(c) = self.conns.get(&id) else {
            return moved;
        };
        let done = c.finished && c.tcp.state() == State::Closed;
        let half_gone = matches!(c.end, End::Half { .. }) && c.tcp.state() == State::Closed;
        if done || half_gone {
            self.remove(id, env);
            return true;
        }
        let deadline = [
            c.tcp.poll_at().map(|t| self.std(t)),
            c.connecting,
            c.close_deadline,
        ]
        .into_iter()
        .flatten()
        .min();
        self.timers.set(id, deadline.map(|d| self.smol(d.max(now))));
        moved
    }

    fn remove(&mut self, id: u64, env: &mut Env<'_>) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        self.buffer_bytes = self.buffer_bytes.saturating_sub(c.bytes);
        if matches!(c.end, End::Host(_)) {
            self.hosted -= 1;
        }
        if let End::Half { listener } = c.end {
            if let Some(l) = self.listeners.get_mut(listener) {
                l.forget(id);
            }
        }
        self.demux.remove(&c.key, id);
        self.timers.set(id, None);
        if let Some(p) = c.port {
            self.ports.release(p);
        }
        if let End::App(a) = &c.end {
            a.shared.answer_final_info(tcp_info(&c.tcp, a, env.config));
            if a.shared.phase() != crate::shared::Phase::Closed {
                a.shared.set_closed();
            }
        }
        env.counters.recycled += 1;
    }

    /// Send connection `id`'s segments while the device has TX room.
    fn transmit<D: Device + ?Sized>(
        &mut self,
        env: &mut Env<'_>,
        dev: &mut D,
        id: u64,
        now: Instant,
    ) -> bool {
        let t = self.smol(now);
        let mut sent = false;
        let mtu = self.mtu;
        let src_mac = self.mac;
        let mut got = 0u64;
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        let (local, remote) = (c.key.0.addr, c.key.1.addr);
        let mac = c.mac;
        {
            let (tcp, tx, mut sink) = parts(c, env.host(), id, now, &mut got);
            loop {
                let Some(tok) = dev.transmit(t) else {
                    self.retry.push(id);
                    break;
                };
                let Some(seg) = tcp.poll_transmit(t, &tx, &mut sink) else {
                    break;
                };
                sent = true;
                match mac {
                    Some(dst) => {
                        let len = frames::frame_len(&seg, &local);
                        let r = tok.consume(len, |buf| {
                            frames::write_segment(buf, mtu, src_mac, dst, local, remote, &seg, &tx)
                        });
                        if let Err(e) = r {
                            log::warn!("own core: segment not framed: {e:?}");
                        }
                    }
                    None => {
                        drop(tok);
                        // No frame from the peer yet: the Interface resolves the
                        // neighbour and frames the packet (raw socket).
                        let zero = EthernetAddress([0; 6]);
                        let buf = &mut self.scratch;
                        match frames::write_segment(
                            buf, mtu, src_mac, zero, local, remote, &seg, &tx,
                        ) {
                            Ok(n) => {
                                let h = match local {
                                    IpAddress::Ipv4(_) => self.raw4,
                                    IpAddress::Ipv6(_) => self.raw6,
                                };
                                let s = self.raw.get_mut::<raw::Socket>(h);
                                let _ = s.send_slice(&buf[ETHERNET_HEADER_LEN..n]);
                            }
                            Err(e) => log::warn!("own core: segment not framed: {e:?}"),
                        }
                    }
                }
            }
        }
        env.counters.rx_bytes += got;
        sent
    }

    /// Report the connection's progress to its end (application or host) and take what
    /// the end asks (close, shutdown, more bytes from the host). Returns whether anything
    /// moved.
    fn report(&mut self, env: &mut Env<'_>, id: u64, now: Instant) -> bool {
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        let t = smoltcp::time::Instant::from_micros(
            now.saturating_duration_since(self.epoch).as_micros() as i64,
        );
        let state = c.tcp.state();
        let moved = match &c.end {
            End::Half { listener } => {
                let lid = *listener;
                if state != State::SynReceived && state != State::Closed {
                    self.promote(env, id, lid, now);
                    true
                } else {
                    false
                }
            }
            End::App(_) => report_app(c, env, now, t),
            End::Host(_) => report_host(c, id, env, now),
        };
        if let Some(c) = self.conns.get_mut(&id) {
            if std::mem::take(&mut c.again) {
                self.dirty.push(id);
            }
        }
        moved
    }

    /// A passive handshake completed: hand the connection to its listener's owner.
    fn promote(&mut self, env: &mut Env<'_>, id: u64, lid: u64, now: Instant) {
        if let Some(l) = self.listeners.get_mut(lid) {
            l.established(id);
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let (local, remote) = (to_sock(c.key.0), to_sock(c.key.1));
        env.counters.established += 1;
        if let Some(al) = self.app_listeners.get(&lid) {
            let shared = match SocketShared::new(id) {
                Ok(s) => Arc::new(s),
                Err(_) => {
                    c.tcp.abort();
                    c.finished = true;
                    return;
                }
            };
            shared.init_options(al.shared.options);
            shared.set_established(local, remote);
            let (rx_ring, tx_ring) = crate::socket::ring_sizes(env.config, &al.shared.options);
            let (rx_prod, rx_cons) = rtrb::RingBuffer::new(rx_ring);
            let (tx_prod, tx_cons) = rtrb::RingBuffer::new(tx_ring);
            c.end = End::App(AppSide {
                shared: shared.clone(),
                rx: rx_prod,
                tx: tx_cons,
                shutdown: false,
                app_closed: false,
                pushed: 0,
                acked: 0,
            });
            env.counters.accepted += 1;
            let conn = AcceptedConn {
                shared,
                rx: rx_cons,
                tx: tx_prod,
            };
            if al.accept.send(conn).is_ok() {
                al.shared.notify_accept();
            } else if let End::App(a) = &mut c.end {
                a.app_closed = true;
                c.close_deadline = Some(now + env.config.fin_timeout);
            }
        } else if let Some(hl) = self.host_listeners.get(&lid) {
            let token = hl.token;
            if let Some(l) = self.listeners.get_mut(lid) {
                l.accepted();
            }
            c.end = End::Host(HostSide {
                tx: RingTx::new(env.config.tx_buffer),
                ready: true,
                fin_reported: false,
                ends: Vec::new(),
            });
            c.window = env.config.rx_buffer;
            self.hosted += 1;
            if let Some(h) = env.host() {
                h.on_path_mss(id, c.tcp.info().snd_mss as usize);
                h.on_accepted(token, id, local, remote, now);
            }
        } else {
            // The listener went away meanwhile.
            c.tcp.abort();
            c.finished = true;
            c.end = End::Half { listener: lid };
        }
    }

    /// Serve the connections that need it and run the `Interface`. Returns (busy, next
    /// deadline).
    pub(crate) fn poll<D: Device + ?Sized>(
        &mut self,
        env: &mut Env<'_>,
        iface: &mut Interface,
        dev: &mut D,
        now: Instant,
        max_frame: usize,
    ) -> (bool, Option<Instant>) {
        let t = self.smol(now);
        self.caps = dev.capabilities().checksum;
        self.mtu = env
            .config
            .mtu
            .min(
                dev.capabilities()
                    .max_transmission_unit
                    .saturating_sub(ETHERNET_HEADER_LEN),
            )
            .min(max_frame - ETHERNET_HEADER_LEN);
        let mut busy = false;
        self.poll_host(env, now);

        // Ingress. The clock moves on per frame (from the caller's `now`, by the time this
        // iteration has taken): RACK orders sends by their transmit time and takes RTT
        // samples from it, so segments sent in answer to different ACKs of one batch must
        // not all carry the batch's first instant.
        let started = Instant::now();
        for _ in 0..INGRESS_BUDGET {
            let Some((rx, tx)) = dev.receive(t) else {
                break;
            };
            drop(tx);
            busy = true;
            let now = now + started.elapsed();
            let action = rx.consume(|frame| self.frame(env, frame, now));
            match action {
                Action::None => {}
                Action::Drive(id) => {
                    self.drive(env, dev, id, now);
                }
                Action::Rst {
                    mac,
                    local,
                    remote,
                    repr,
                } => {
                    let seg = frames::bare_segment(repr);
                    if let Some(tok) = dev.transmit(t) {
                        let len = frames::frame_len(&seg, &local);
                        let (mtu, src) = (self.mtu, self.mac);
                        let _ = tok.consume(len, |buf| {
                            frames::write_segment(
                                buf,
                                mtu,
                                src,
                                mac,
                                local,
                                remote,
                                &seg,
                                &Tx::None,
                            )
                        });
                    }
                }
            }
        }
        if !self.other.is_empty() {
            let mut replay = ReplayDevice {
                inner: &mut *dev,
                max_frame,
                frames: &mut self.other,
            };
            while !matches!(
                iface.poll_ingress_single(t, &mut replay, &mut self.raw),
                PollIngressSingleResult::None
            ) {}
            self.other.clear();
        }

        // Timers, dirty and retried connections, hosted connections.
        let now = now + started.elapsed();
        let t = self.smol(now);
        let mut due = Vec::new();
        self.timers.expired(t, &mut due);
        due.append(&mut self.dirty);
        due.append(&mut self.retry);
        if self.hosted > 0 {
            due.extend(
                self.conns
                    .iter()
                    .filter(|(_, c)| matches!(c.end, End::Host(_)))
                    .map(|(&id, _)| id),
            );
        }
        due.sort_unstable();
        due.dedup();
        for id in due {
            busy |= self.drive(env, dev, id, now);
        }

        // Handshakes that never completed (syn_received_timeout).
        let timeout = smoltcp::time::Duration::from_micros(
            env.config.syn_received_timeout.as_micros() as u64,
        );
        let mut expired = Vec::new();
        let lids: Vec<u64> = self
            .app_listeners
            .keys()
            .chain(self.host_listeners.keys())
            .copied()
            .collect();
        let mut syn_next: Option<Instant> = None;
        for lid in lids {
            if let Some(l) = self.listeners.get_mut(lid) {
                l.expire(t, timeout, &mut expired);
                if let Some(n) = l.next_expiry(timeout) {
                    let n = self.epoch + Duration::from_micros(n.total_micros().max(0) as u64);
                    syn_next = Some(syn_next.map_or(n, |s: Instant| s.min(n)));
                }
            }
        }
        for cid in expired {
            if let Some(c) = self.conns.get_mut(&cid) {
                c.tcp.abort();
                c.finished = true;
                env.counters.syn_received_expired += 1;
                busy |= self.drive(env, dev, cid, now);
            }
        }

        // The Interface: ARP/NDP replies and requests, the raw-socket first SYNs.
        let mut capped = CappedDevice {
            inner: &mut *dev,
            max_frame,
        };
        while let PollResult::SocketStateChanged = iface.poll_egress(t, &mut capped, &mut self.raw)
        {
            busy = true;
        }
        let iface_at = iface.poll_at(t, &self.raw).map(|d| self.std(d));
        let next = [
            self.timers.next().map(|d| self.std(d)),
            iface_at,
            syn_next,
            self.host_deadline,
        ]
        .into_iter()
        .flatten()
        .min();
        busy |= !self.retry.is_empty();
        (busy, next)
    }
}

/// Drop `n` acknowledged bytes from the front of the connection's send queue.
fn release(c: &mut OwnConn, n: u64) {
    match &mut c.end {
        End::App(a) => {
            let n = (n as usize).min(a.tx.slots());
            if let Ok(chunk) = a.tx.read_chunk(n) {
                chunk.commit_all();
            }
            a.acked += n;
        }
        End::Host(h) => h.tx.release(n),
        End::Half { .. } => {}
    }
}

fn to_sock(e: IpEndpoint) -> SocketAddr {
    SocketAddr::new(e.addr.into(), e.port)
}

fn sock_err(e: Option<ConnError>) -> SocketError {
    match e {
        Some(ConnError::Refused) => SocketError::Refused,
        Some(ConnError::TimedOut) => SocketError::TimedOut,
        Some(ConnError::Aborted) => SocketError::Aborted,
        Some(ConnError::Reset) | None => SocketError::Reset,
    }
}

/// Linux's `TCP_*` state numbers (`include/net/tcp_states.h`).
fn linux_state(s: State) -> u8 {
    match s {
        State::Established => 1,
        State::SynSent => 2,
        State::SynReceived => 3,
        State::FinWait1 => 4,
        State::FinWait2 => 5,
        State::TimeWait => 6,
        State::Closed => 7,
        State::CloseWait => 8,
        State::LastAck => 9,
        State::Closing => 11,
    }
}

fn std_dur(d: smoltcp::time::Duration) -> Duration {
    Duration::from_micros(d.total_micros())
}

/// `TCP_INFO` of an application connection from the connection's own counters.
fn tcp_info(tcp: &Connection, a: &AppSide, config: &StackConfig) -> TcpInfo {
    let i = tcp.info();
    let u32c = |v: u64| v.min(u32::MAX as u64) as u32;
    // The socket buffers the application asked for (they are part of the rings here).
    let (rx_buf, tx_buf) = buffer_sizes(config, &a.shared.options());
    let rcv_mss = ConnConfig {
        mtu: config.mtu.min(u16::MAX as usize) as u16,
        ..ConnConfig::default()
    }
    .local_mss(&tcp.remote().addr);
    TcpInfo {
        state: linux_state(i.state),
        rto: std_dur(i.rto),
        rtt: i.srtt.map(std_dur),
        rttvar: std_dur(i.rttvar),
        snd_mss: i.snd_mss,
        rcv_mss: u32::from(rcv_mss),
        send_queue: u32c(a.tx.slots() as u64),
        recv_queue: u32c(i.ooo_bytes),
        rcv_wnd: u32c(a.rx.slots().min(rx_buf) as u64),
        // Handed to TCP (as under smoltcp): acknowledged plus still in the tx ring.
        bytes_sent: i.bytes_acked + a.tx.slots() as u64,
        bytes_acked: i.bytes_acked,
        bytes_received: i.bytes_received,
        retransmits: u32c(i.retransmits),
        recv_buffer: u32c(rx_buf as u64),
        send_buffer: u32c(tx_buf as u64),
        rtos: u32c(i.rto_count),
        tlps: u32c(i.tlp_count),
        fast_recoveries: u32c(i.fast_recoveries),
        dsacks: u32c(i.dsacks_received),
        cwnd: i.cwnd,
    }
}

/// Whether the rx ring's room (`slots`) holds the receive window below the receive
/// buffer (`window`): then a reader freeing room can open the window, and must wake the
/// engine to advertise it. Waiting for a full ring instead (`slots == 0`) stalled one-way
/// bulk: a ring with less room than one SWS step advertises no new right edge while not
/// being full, the reader drained it without telling the engine, and the sender sat
/// behind a closed window until some timer woke the receiver's engine.
fn room_limits_window(slots: usize, window: usize) -> bool {
    slots < window
}

/// Report an application connection's progress to its shared state and take its
/// requests (shutdown, close, options, `TCP_INFO`).
fn report_app(c: &mut OwnConn, env: &mut Env<'_>, now: Instant, t: smoltcp::time::Instant) -> bool {
    let window = c.window;
    let End::App(a) = &mut c.end else {
        return false;
    };
    // A swap (not a store): reading the app's `true` synchronizes with its ring pushes.
    a.shared.dirty.swap(false, Ordering::SeqCst);
    if a.shared.control.swap(false, Ordering::SeqCst) {
        if let Some(o) = a.shared.take_changed_options() {
            if let Some(nd) = o.nodelay {
                c.tcp.set_nagle(!nd);
            }
            let d = |d: Duration| smoltcp::time::Duration::from_micros(d.as_micros() as u64);
            match o.keepalive {
                Some(k) => c
                    .tcp
                    .set_keepalive(Some(d(k.idle)), d(k.interval), k.count, t),
                None => match env.config.tcp.keepalive {
                    Some(k) => c.tcp.set_keepalive(Some(d(k)), d(k), 9, t),
                    None => c.tcp.set_keepalive(None, d(Duration::from_secs(75)), 9, t),
                },
            }
        }
        if a.shared.info_pending() {
            a.shared.answer_info(tcp_info(&c.tcp, a, env.config));
        }
    }
    let mut moved = false;
    let state = c.tcp.state();
    if let Some(deadline) = c.connecting {
        match state {
            State::SynSent | State::SynReceived => {
                if now >= deadline {
                    c.tcp.abort();
                    a.shared.set_error(SocketError::TimedOut);
                    c.connecting = None;
                    c.finished = true;
                    return true;
                }
                return false;
            }
            State::Closed => {
                let e = match c.tcp.error() {
                    Some(ConnError::TimedOut) => SocketError::TimedOut,
                    Some(ConnError::Aborted) => SocketError::Aborted,
                    _ if now >= deadline => SocketError::TimedOut,
                    _ => SocketError::Refused,
                };
                a.shared.set_error(e);
                c.connecting = None;
                c.finished = true;
                return true;
            }
            _ => {
                a.shared.set_established(to_sock(c.key.0), to_sock(c.key.1));
                c.connecting = None;
                env.counters.established += 1;
                moved = true;
            }
        }
    }
    if c.finished {
        return moved;
    }
    if a.pushed > 0 {
        env.counters.rx_bytes += a.pushed as u64;
        a.pushed = 0;
        a.shared.notify(WANT_READ);
        moved = true;
    }
    if a.acked > 0 {
        env.counters.tx_bytes += a.acked as u64;
        a.acked = 0;
        a.shared.notify(WANT_WRITE);
        moved = true;
    }
    if !a.app_closed && room_limits_window(a.rx.slots(), window) {
        // The reader that frees room marks the connection dirty (window update).
        a.shared.rx_stalled.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if a.rx.slots() > 0 {
            c.again = true;
        }
    }
    if (a.shutdown || a.app_closed) && !c.fin_queued && state != State::Closed {
        c.tcp.close();
        c.fin_queued = true;
        moved = true;
    }
    // After a RST the outcome below decides (a reset is no end of stream).
    if c.tcp.rx_eof() && !a.app_closed && state != State::Closed {
        a.shared.set_rx_eof();
    }
    if c.fin_queued && matches!(state, State::FinWait2 | State::TimeWait) {
        a.shared.set_fin_acked();
    }
    if state == State::Closed {
        let err = c.tcp.error();
        // A RST after both FINs (TIME-WAIT) ends a complete stream.
        let graceful = err.is_none() || (c.fin_queued && c.tcp.rx_eof());
        if err == Some(ConnError::Reset) && !graceful && !a.app_closed && c.tcp.info().ooo_bytes > 0
        {
            // Bytes received before the RST still wait for room in the rx ring: they
            // come first, then the error (Linux's read returns queued data first).
            return moved;
        }
        if graceful {
            if c.fin_queued {
                a.shared.set_fin_acked();
            }
            a.shared.set_rx_eof();
            a.shared.set_closed();
        } else {
            if err == Some(ConnError::Reset) {
                env.counters.resets += 1;
            }
            a.shared.set_error(sock_err(err));
        }
        c.finished = true;
        return true;
    }
    if a.app_closed && c.close_stalled(state, now, env.config.fin_timeout) {
        // tcp_fin_timeout: the peer stopped finishing the close.
        c.tcp.abort();
        c.finished = true;
        moved = true;
    }
    moved
}

/// Fill a hosted connection's send queue from `on_send` and mark the record ends the host
/// reports in what it wrote (`ProtocolHost::record_ends`): `tcp::conn` never lets a
/// segment cross one, so FPDUs stay aligned to segments (docs/mpa.md §1.10).
fn fill_records(h: &mut HostSide, host: &mut dyn ProtocolHost, id: u64, now: Instant) -> usize {
    let mut at = h.tx.len();
    let ends = &mut h.ends;
    let n = h.tx.fill(|buf| {
        let k = host.on_send(id, now, buf).min(buf.len());
        host.record_ends(id, &buf[..k], &mut |e| ends.push(at + e as u64));
        at += k as u64;
        k
    });
    for e in h.ends.drain(..) {
        h.tx.mark_record_end(e);
    }
    n
}

/// Report a hosted connection's progress to the host, fill its send queue from
/// `on_send`, carry out its close request.
fn report_host(c: &mut OwnConn, id: u64, env: &mut Env<'_>, now: Instant) -> bool {
    let fin_timeout = env.config.fin_timeout;
    let Some(host) = env.host.as_deref_mut() else {
        return false;
    };
    let End::Host(h) = &mut c.end else {
        return false;
    };
    let mut moved = false;
    let state = c.tcp.state();
    if let Some(deadline) = c.connecting {
        match state {
            State::SynSent | State::SynReceived => {
                if now >= deadline {
                    c.tcp.abort();
                    c.connecting = None;
                    c.finished = true;
                    host.on_closed(id, now, Some(SocketError::TimedOut));
                    return true;
                }
                return false;
            }
            State::Closed => {
                let e = match c.tcp.error() {
                    Some(ConnError::TimedOut) => SocketError::TimedOut,
                    _ if now >= deadline => SocketError::TimedOut,
                    _ => SocketError::Refused,
                };
                c.connecting = None;
                c.finished = true;
                host.on_closed(id, now, Some(e));
                return true;
            }
            _ => {
                c.connecting = None;
                h.ready = true;
                env.counters.established += 1;
                host.on_path_mss(id, c.tcp.info().snd_mss as usize);
                host.on_established(id, to_sock(c.key.0), to_sock(c.key.1), now);
                moved = true;
            }
        }
    }
    if c.finished {
        return moved;
    }
    let mut drained = true;
    if !c.fin_queued && c.tcp.may_send() {
        loop {
            let n = fill_records(h, host, id, now);
            if n == 0 {
                drained = h.tx.free() > 0;
                break;
            }
            env.counters.tx_bytes += n as u64;
            moved = true;
        }
    }
    if !h.fin_reported && c.tcp.rx_eof() && state != State::Closed {
        h.fin_reported = true;
        host.on_peer_fin(id, now);
        moved = true;
    }
    match host.close_request(id) {
        CloseRequest::None => {}
        CloseRequest::Graceful => {
            if !c.fin_queued && drained {
                c.tcp.close();
                c.fin_queued = true;
                c.close_deadline = Some(now + fin_timeout);
                moved = true;
            }
        }
        CloseRequest::Abort => {
            c.tcp.abort();
            c.fin_queued = true;
            c.finished = true;
            host.on_closed(id, now, Some(SocketError::Aborted));
            return true;
        }
    }
    let state = c.tcp.state();
    if state == State::Closed {
        let err = c.tcp.error();
        let graceful = err.is_none() || (c.fin_queued && c.tcp.rx_eof());
        c.finished = true;
        if graceful {
            host.on_closed(id, now, None);
        } else {
            if err == Some(ConnError::Reset) {
                env.counters.resets += 1;
            }
            host.on_closed(id, now, Some(sock_err(err)));
        }
        return true;
    }
    if c.close_stalled(state, now, fin_timeout) {
        c.tcp.abort();
        c.finished = true;
        host.on_closed(id, now, Some(SocketError::TimedOut));
        moved = true;
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_range_spans_both_slices() {
        let (a, b) = (b"abcd".as_slice(), b"efgh".as_slice());
        let mut d = [0u8; 5];
        copy_range(a, b, 2, &mut d);
        assert_eq!(&d, b"cdefg");
        let mut d = [0u8; 2];
        copy_range(a, b, 5, &mut d);
        assert_eq!(&d, b"fg");
        copy_range(a, b, 0, &mut d);
        assert_eq!(&d, b"ab");
    }

    /// The tx ring as `TxSource`: bytes read at offsets from SND.UNA (across the ring's
    /// wrap) stay in the ring until `release` consumes what was acknowledged.
    #[test]
    fn app_tx_reads_at_offsets_without_consuming_until_acknowledged() {
        let (mut prod, mut cons) = rtrb::RingBuffer::<u8>::new(8);
        let put = |p: &mut rtrb::Producer<u8>, d: &[u8]| {
            for &x in d {
                p.push(x).unwrap();
            }
        };
        put(&mut prod, b"abcdef");
        // Move the read position so the next bytes wrap.
        cons.read_chunk(5).unwrap().commit_all();
        put(&mut prod, b"ghijklm");
        {
            let tx = AppTx(RefCell::new(&mut cons));
            assert_eq!(tx.len(), 8);
            let mut d = [0u8; 8];
            assert_eq!(tx.copy_at(0, &mut d), 8);
            assert_eq!(&d, b"fghijklm");
            assert_eq!(tx.copy_at(6, &mut d), 2);
            assert_eq!(&d[..2], b"lm");
            assert_eq!(tx.copy_at(8, &mut d), 0);
            // Reading consumed nothing.
            assert_eq!(tx.len(), 8);
        }
        let mut d = [0u8; 3];
        assert_eq!(cons.read_chunk(3).map(|c| c.len()).unwrap(), 3);
        let tx = AppTx(RefCell::new(&mut cons));
        assert_eq!(tx.copy_at(0, &mut d), 3);
        assert_eq!(&d, b"fgh");
    }

    /// RFC 9293 §3.8.6.2.2 (receiver SWS avoidance) moves the right edge only by whole
    /// steps, so a ring short of room stops advertising before it is full: the reader
    /// must be asked to wake the engine as soon as room limits the window, not only at a
    /// full ring (the cause of slow one-way bulk between two own-core engines).
    #[test]
    fn rfc9293_3_8_6_2_2_reader_wakes_the_engine_once_ring_room_limits_the_window() {
        // Room left, but less than an SWS step (one MSS): no window opens by itself.
        assert!(room_limits_window(1000, 256 << 10));
        assert!(room_limits_window(0, 256 << 10));
        assert!(room_limits_window((256 << 10) - 1, 256 << 10));
        // Room for the whole buffer: the window is not held back by the ring.
        assert!(!room_limits_window(256 << 10, 256 << 10));
        assert!(!room_limits_window(512 << 10, 256 << 10));
    }

    /// The rx ring as `RxSink`: the window offered is the ring's room capped at the
    /// receive buffer; a full ring takes a prefix, the rest stays with the connection.
    #[test]
    fn ring_sink_offers_at_most_the_receive_buffer_and_takes_a_prefix() {
        let (mut prod, mut cons) = rtrb::RingBuffer::<u8>::new(10);
        let mut pushed = 0;
        let mut sink = Sink::Ring(&mut prod, &mut pushed, 4);
        assert_eq!(sink.free(), 4);
        assert_eq!(sink.deliver(b"0123456"), 7);
        assert_eq!(sink.free(), 3);
        assert_eq!(sink.deliver(b"789ab"), 3);
        assert_eq!(sink.free(), 0);
        assert_eq!(pushed, 10);
        assert_eq!(cons.pop().unwrap(), b'0');
        let mut d = Sink::Discard(16);
        assert_eq!((d.free(), d.deliver(b"xyz")), (16, 3));
        let mut h = Sink::Hold(16);
        assert_eq!((h.free(), h.deliver(b"xyz")), (16, 0));
    }
}
