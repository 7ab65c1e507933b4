//! The engine side: a smoltcp `Interface` + `SocketSet` driven as a poll-driver `Service`.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use smoltcp::iface::{Config as IfaceConfig, Interface, PollIngressSingleResult, PollResult};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{self, CongestionControl, State};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpListenEndpoint};
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::engine::{PollOutcome, Service};

use crate::command::{AcceptedConn, Command};
use crate::config::{Congestion, SocketOptions, StackConfig, TcpOptions};
use crate::device::{CappedDevice, ETHERNET_HEADER_LEN};
use crate::ports::Ports;
use crate::rescue::{AckWatch, FlowKey, ReplayDevice, WatchedDevice};
use crate::shared::{ListenerShared, SocketError, SocketShared, TcpInfo, WANT_READ, WANT_WRITE};

/// FIN-only segments (rescue.rs `split_fin`) kept while the TX ring is full.
const SPLIT_FINS_MAX: usize = 64;

/// Counters of the TCP engine.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StackStats {
    /// Connections established (active and passive).
    pub established: u64,
    /// Connections accepted from listeners.
    pub accepted: u64,
    /// Connections that ended with a reset (sent or received).
    pub resets: u64,
    /// Sockets removed from the socket set after reaching CLOSED.
    pub recycled: u64,
    /// Bytes moved from tx rings into TCP send buffers.
    pub tx_bytes: u64,
    /// Bytes moved from TCP receive buffers into rx rings.
    pub rx_bytes: u64,
    /// Listening sockets created (initial arming and re-arming).
    pub listeners_armed: u64,
    /// SYNs dropped because their listener's accept queue was full (Linux:
    /// `ListenOverflows`); the client retransmits them.
    pub syn_dropped_backlog: u64,
}

/// One connection as the engine sees it.
struct Conn {
    handle: SocketHandle,
    shared: Arc<SocketShared>,
    rx: rtrb::Producer<u8>,
    tx: rtrb::Consumer<u8>,
    connecting: Option<Instant>,
    /// Ephemeral or explicitly claimed local port, released on removal.
    port: Option<u16>,
    last_state: State,
    shutdown: bool,
    app_closed: bool,
    fin_queued: bool,
    close_deadline: Option<Instant>,
    finished: bool,
    /// Counters, RTT estimate and option state (`TCP_INFO`, keep-alive).
    extra: ConnExtra,
}

/// Per-connection bookkeeping beyond the data path: byte counters, the engine's RTT
/// estimate and whether smoltcp may abort the connection on its own (keep-alive).
#[derive(Debug, Default)]
struct ConnExtra {
    /// Bytes handed to smoltcp for sending.
    tx_total: u64,
    /// Bytes taken from smoltcp's receive buffer.
    rx_total: u64,
    /// RFC 6298 `SRTT` and `RTTVAR`.
    srtt: Option<Duration>,
    rttvar: Duration,
    /// RTT sample in flight: when bytes were handed to an idle connection and the
    /// `tx_total` whose acknowledgement ends the sample.
    probe: Option<(Instant, u64)>,
    /// smoltcp has a timeout set (keep-alive or user timeout): a close in egress is a
    /// timeout, reported as `TimedOut` rather than `Reset`.
    timeout_armed: bool,
    /// Loss rescues (rescue.rs) triggered for this connection.
    rescues: u32,
    /// Receive and send buffer sizes of the smoltcp socket.
    buffers: (usize, usize),
}

impl ConnExtra {
    fn new(buffers: (usize, usize), timeout_armed: bool) -> ConnExtra {
        ConnExtra {
            buffers,
            timeout_armed,
            ..ConnExtra::default()
        }
    }

    /// RFC 6298 §2: fold one RTT measurement into `SRTT`/`RTTVAR`.
    fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let delta = srtt.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + delta) / 4;
                self.srtt = Some((srtt * 7 + r) / 8);
            }
        }
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
        State::Listen => 10,
        State::Closing => 11,
    }
}

/// One listening port: a pool of smoltcp listening sockets (smoltcp has no backlog).
struct Listener {
    shared: Arc<ListenerShared>,
    accept: Sender<AcceptedConn>,
    endpoint: IpListenEndpoint,
    backlog: usize,
    pool: Vec<SocketHandle>,
    /// The accept queue is at the backlog: SYNs to this port are dropped (see
    /// `rescue::AckWatch::full_ports`).
    full: bool,
}

/// What serving one connection did.
#[derive(Default)]
struct Step {
    moved: bool,
    remove: bool,
}

/// Up to this many connections the engine runs egress after every ingress packet.
const EGRESS_PER_PACKET_MAX_CONNS: usize = 64;

fn tsval() -> u32 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u32
}

/// The [`AckWatch`] key of an established IPv4 connection.
fn flow_key(shared: &SocketShared) -> Option<FlowKey> {
    match shared.addrs()? {
        (local, SocketAddr::V4(peer)) => Some((*peer.ip(), peer.port(), local.port())),
        _ => None,
    }
}

fn smol_duration(d: Duration) -> smoltcp::time::Duration {
    smoltcp::time::Duration::from_micros(d.as_micros().min(u128::from(u64::MAX)) as u64)
}

/// The TCP engine service. Build it with [`crate::new_stack`]; the engine thread calls
/// [`Service::poll`].
pub struct TcpService {
    pub(crate) config: StackConfig,
    epoch: Instant,
    cmds: Receiver<Command>,
    pub(crate) next_id: Arc<AtomicU64>,
    iface: Option<Interface>,
    pub(crate) sockets: SocketSet<'static>,
    conns: HashMap<u64, Conn>,
    listeners: HashMap<u64, Listener>,
    pub(crate) ports: Ports,
    dirty: Vec<u64>,
    next_deadline: Option<Instant>,
    pub(crate) counters: StackStats,
    stats: Arc<StatsCell>,
    pub(crate) watch: AckWatch,
    pub(crate) replay: VecDeque<Vec<u8>>,
    last_rescue_scan: Option<Instant>,
    /// `XWARP_STACK_TRACE` set: dump connection states to stderr once a second.
    trace: Option<Instant>,
    /// The in-engine protocol host and its connections (see `proto.rs`).
    pub(crate) proto: Option<crate::proto::ProtoSide>,
    /// Some connection may have a smoltcp timeout (keep-alive): [`TcpService::detect_timeouts`]
    /// has work to do. Cleared when a scan finds none.
    timeouts_armed: bool,
}

/// Stats published by the engine for other threads.
#[derive(Debug, Default)]
pub(crate) struct StatsCell {
    inner: parking_cell::Cell,
}

/// A tiny seqlock-free snapshot cell: the engine stores, readers load, fields are
/// independent atomics (a snapshot may mix two polls, which is fine for counters).
mod parking_cell {
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Debug, Default)]
    pub(crate) struct Cell([AtomicU64; 8]);

    impl Cell {
        pub(crate) fn store(&self, s: &super::StackStats) {
            let v = [
                s.established,
                s.accepted,
                s.resets,
                s.recycled,
                s.tx_bytes,
                s.rx_bytes,
                s.listeners_armed,
                s.syn_dropped_backlog,
            ];
            for (a, v) in self.0.iter().zip(v) {
                a.store(v, Ordering::Relaxed);
            }
        }

        pub(crate) fn load(&self) -> super::StackStats {
            let g = |i: usize| self.0[i].load(Ordering::Relaxed);
            super::StackStats {
                established: g(0),
                accepted: g(1),
                resets: g(2),
                recycled: g(3),
                tx_bytes: g(4),
                rx_bytes: g(5),
                listeners_armed: g(6),
                syn_dropped_backlog: g(7),
            }
        }
    }
}

impl StatsCell {
    pub(crate) fn load(&self) -> StackStats {
        self.inner.load()
    }
}

impl std::fmt::Debug for TcpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpService")
            .field("conns", &self.conns.len())
            .field("listeners", &self.listeners.len())
            .field("stats", &self.counters)
            .finish_non_exhaustive()
    }
}

impl TcpService {
    pub(crate) fn new(
        config: StackConfig,
        cmds: Receiver<Command>,
        next_id: Arc<AtomicU64>,
        stats: Arc<StatsCell>,
    ) -> TcpService {
        TcpService {
            ports: Ports::new(config.ephemeral_ports.clone()),
            config,
            epoch: Instant::now(),
            cmds,
            next_id,
            iface: None,
            sockets: SocketSet::new(Vec::new()),
            conns: HashMap::new(),
            listeners: HashMap::new(),
            dirty: Vec::new(),
            next_deadline: None,
            counters: StackStats::default(),
            stats,
            watch: AckWatch::default(),
            replay: VecDeque::new(),
            last_rescue_scan: None,
            trace: std::env::var_os("XWARP_STACK_TRACE").map(|_| Instant::now()),
            proto: None,
            timeouts_armed: false,
        }
    }

    /// Number of smoltcp sockets alive (connections, TIME-WAIT, armed listeners).
    pub fn socket_count(&self) -> usize {
        self.sockets.iter().count()
    }

    fn smol_now(&self, now: Instant) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(
            now.saturating_duration_since(self.epoch).as_micros() as i64
        )
    }

    fn std_instant(&self, t: smoltcp::time::Instant) -> Instant {
        self.epoch + Duration::from_micros(t.total_micros().max(0) as u64)
    }

    fn make_iface<D: smoltcp::phy::Device + ?Sized>(&self, dev: &mut D, now: Instant) -> Interface {
        let mut c = IfaceConfig::new(HardwareAddress::Ethernet(EthernetAddress(self.config.mac)));
        c.random_seed = self.config.random_seed;
        let mut iface = Interface::new(c, dev, self.smol_now(now));
        iface.update_ip_addrs(|addrs| {
            if let Some((ip, p)) = self.config.ipv4 {
                let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(ip), p));
            }
            if let Some((ip, p)) = self.config.ipv6 {
                let _ = addrs.push(IpCidr::new(IpAddress::Ipv6(ip), p));
            }
        });
        if let Some(gw) = self.config.ipv4_gateway {
            let _ = iface.routes_mut().add_default_ipv4_route(gw);
        }
        iface
    }

    pub(crate) fn new_socket(&self, opts: &TcpOptions) -> tcp::Socket<'static> {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; self.config.rx_buffer]),
            tcp::SocketBuffer::new(vec![0u8; self.config.tx_buffer]),
        );
        s.set_nagle_enabled(!opts.nodelay);
        s.set_ack_delay(opts.ack_delay.map(smol_duration));
        s.set_keep_alive(opts.keepalive.map(smol_duration));
        s.set_timeout(opts.user_timeout.map(smol_duration));
        s.set_congestion_control(match self.config.congestion {
            Congestion::None => CongestionControl::None,
            Congestion::Cubic => CongestionControl::Cubic,
        });
        if self.config.timestamps {
            s.set_tsval_generator(Some(tsval));
        }
        s
    }

    /// A socket with the application's options on top of the engine defaults; also
    /// returns its (receive, send) buffer sizes and whether smoltcp may time it out.
    fn new_socket_with(&self, o: &SocketOptions) -> (tcp::Socket<'static>, (usize, usize), bool) {
        let rx = o.recv_buffer.unwrap_or(self.config.rx_buffer);
        let tx = o.send_buffer.unwrap_or(self.config.tx_buffer);
        let mut s = if (rx, tx) == (self.config.rx_buffer, self.config.tx_buffer) {
            self.new_socket(&self.config.tcp)
        } else {
            let mut s = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0u8; rx]),
                tcp::SocketBuffer::new(vec![0u8; tx]),
            );
            let defaults = self.new_socket(&self.config.tcp);
            s.set_nagle_enabled(defaults.nagle_enabled());
            s.set_ack_delay(defaults.ack_delay());
            s.set_congestion_control(defaults.congestion_control());
            if self.config.timestamps {
                s.set_tsval_generator(Some(tsval));
            }
            s
        };
        let armed = Self::apply_options(&self.config.tcp, &mut s, o);
        (s, (rx, tx), armed)
    }

    /// Apply the options that can change at any time (nodelay, keep-alive); returns
    /// whether smoltcp now has a timeout (keep-alive death or user timeout).
    fn apply_options(d: &TcpOptions, s: &mut tcp::Socket<'static>, o: &SocketOptions) -> bool {
        s.set_nagle_enabled(!o.nodelay.unwrap_or(d.nodelay));
        match o.keepalive {
            Some(k) => {
                s.set_keep_alive(Some(smol_duration(k.probe_interval())));
                // A silent peer is dead after idle + interval * count (Linux's rule);
                // smoltcp's timeout counts from the last segment heard from the peer.
                s.set_timeout(Some(smol_duration(k.dead_after())));
            }
            None => {
                s.set_keep_alive(d.keepalive.map(smol_duration));
                s.set_timeout(d.user_timeout.map(smol_duration));
            }
        }
        s.timeout().is_some()
    }

    /// What the engine knows about connection `c` (`TCP_INFO`).
    fn tcp_info(&self, c: &Conn) -> TcpInfo {
        let s = self.sockets.get::<tcp::Socket>(c.handle);
        let v6 = matches!(c.shared.addrs(), Some((SocketAddr::V6(_), _)));
        let mss = self.config.mtu.saturating_sub(if v6 { 60 } else { 40 }) as u32;
        let x = &c.extra;
        // smoltcp's own minimum RTO is 1 s; the rescue floor (rescue.rs) lowers it.
        let floor = self.config.rto_floor.unwrap_or(Duration::from_secs(1));
        let rto = match x.srtt {
            None => Duration::from_secs(1).max(floor),
            Some(srtt) => (srtt + (x.rttvar * 4).max(Duration::from_millis(1))).max(floor),
        }
        .min(Duration::from_secs(60));
        let send_queue = s.send_queue();
        let u32c = |v: usize| v.min(u32::MAX as usize) as u32;
        TcpInfo {
            state: linux_state(s.state()),
            rto,
            rtt: x.srtt,
            rttvar: x.rttvar,
            snd_mss: mss,
            rcv_mss: mss,
            send_queue: u32c(send_queue),
            recv_queue: u32c(s.recv_queue()),
            rcv_wnd: u32c(s.recv_capacity().saturating_sub(s.recv_queue())),
            bytes_sent: x.tx_total,
            bytes_acked: x.tx_total.saturating_sub(send_queue as u64),
            bytes_received: x.rx_total + s.recv_queue() as u64,
            retransmits: x.rescues,
            recv_buffer: u32c(x.buffers.0),
            send_buffer: u32c(x.buffers.1),
        }
    }

    fn address_usable(&self, ip: IpAddr) -> bool {
        if ip.is_unspecified() || ip.is_multicast() {
            return false;
        }
        match ip {
            IpAddr::V4(v4) => self.config.ipv4.is_some() && !v4.is_broadcast(),
            IpAddr::V6(_) => self.config.ipv6.is_some(),
        }
    }

    fn handle_command(&mut self, iface: &mut Interface, cmd: Command, now: Instant) {
        match cmd {
            Command::Connect {
                shared,
                rx,
                tx,
                remote,
                local_port,
                deadline,
            } => self.connect(iface, shared, rx, tx, remote, local_port, deadline),
            Command::Listen {
                shared,
                accept,
                local,
                backlog,
            } => self.listen(shared, accept, local, backlog, now),
            Command::Unlisten { id } => self.unlisten(id),
            Command::Rearm { id } => self.maintain_listener(id, now),
            Command::Dirty { id } => self.dirty.push(id),
            Command::ShutdownWrite { id } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.shutdown = true;
                    self.dirty.push(id);
                }
            }
            Command::Close { id } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.app_closed = true;
                    c.close_deadline = Some(now + self.config.fin_timeout);
                    if c.connecting.is_some() {
                        self.sockets.get_mut::<tcp::Socket>(c.handle).abort();
                    }
                    self.dirty.push(id);
                }
            }
            Command::Abort { id } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    self.sockets.get_mut::<tcp::Socket>(c.handle).abort();
                    c.shared.set_error(SocketError::Aborted);
                    c.finished = true;
                    self.dirty.push(id);
                }
            }
            Command::SetNodelay { id, nodelay } => {
                if let Some(c) = self.conns.get(&id) {
                    self.sockets
                        .get_mut::<tcp::Socket>(c.handle)
                        .set_nagle_enabled(!nodelay);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn connect(
        &mut self,
        iface: &mut Interface,
        shared: Arc<SocketShared>,
        rx: rtrb::Producer<u8>,
        tx: rtrb::Consumer<u8>,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
    ) {
        if !self.address_usable(remote.ip()) || remote.port() == 0 {
            shared.set_error(SocketError::InvalidAddress);
            return;
        }
        let port = match local_port {
            Some(p) => {
                if !self.ports.claim(p) {
                    shared.set_error(SocketError::AddrInUse);
                    return;
                }
                p
            }
            None => match self.ports.allocate() {
                Some(p) => p,
                None => {
                    shared.set_error(SocketError::AddrNotAvailable);
                    return;
                }
            },
        };
        let (mut sock, buffers, timeout_armed) = self.new_socket_with(&shared.options());
        self.timeouts_armed |= timeout_armed;
        if sock.connect(iface.context(), remote, port).is_err() {
            self.ports.release(port);
            shared.set_error(SocketError::AddrNotAvailable);
            return;
        }
        let handle = self.sockets.add(sock);
        let id = shared.id;
        self.conns.insert(
            id,
            Conn {
                handle,
                shared,
                rx,
                tx,
                connecting: Some(deadline),
                port: Some(port),
                last_state: State::SynSent,
                shutdown: false,
                app_closed: false,
                fin_queued: false,
                close_deadline: None,
                finished: false,
                extra: ConnExtra::new(buffers, timeout_armed),
            },
        );
        self.dirty.push(id);
    }

    fn listen(
        &mut self,
        shared: Arc<ListenerShared>,
        accept: Sender<AcceptedConn>,
        local: SocketAddr,
        backlog: usize,
        now: Instant,
    ) {
        if !local.ip().is_unspecified() && !self.address_usable(local.ip()) {
            shared.set_error(SocketError::AddrNotAvailable);
            return;
        }
        if !self.ports.listen(local.port(), shared.id) {
            shared.set_error(SocketError::AddrInUse);
            return;
        }
        let endpoint = IpListenEndpoint {
            addr: (!local.ip().is_unspecified()).then(|| IpAddress::from(local.ip())),
            port: local.port(),
        };
        let id = shared.id;
        shared.set_listening(local);
        self.listeners.insert(
            id,
            Listener {
                shared,
                accept,
                endpoint,
                backlog: backlog.max(1),
                pool: Vec::new(),
                full: false,
            },
        );
        self.maintain_listener(id, now);
    }

    fn unlisten(&mut self, id: u64) {
        if let Some(l) = self.listeners.remove(&id) {
            for h in l.pool {
                let s = self.sockets.get_mut::<tcp::Socket>(h);
                if s.state() == State::Listen {
                    s.close();
                    self.sockets.remove(h);
                } else {
                    // A handshake in progress: reset it, remove it once the RST is out.
                    s.abort();
                    let shared =
                        match SocketShared::new(self.next_id.fetch_add(1, Ordering::Relaxed)) {
                            Ok(s) => Arc::new(s),
                            Err(_) => continue,
                        };
                    let (rx, _app_rx) = rtrb::RingBuffer::new(1);
                    let (_app_tx, tx) = rtrb::RingBuffer::new(1);
                    self.conns.insert(
                        shared.id,
                        Conn {
                            handle: h,
                            shared,
                            rx,
                            tx,
                            connecting: None,
                            port: None,
                            last_state: State::Closed,
                            shutdown: false,
                            app_closed: true,
                            fin_queued: true,
                            close_deadline: None,
                            finished: true,
                            extra: ConnExtra::default(),
                        },
                    );
                }
            }
            self.ports.unlisten(l.endpoint.port);
        }
    }

    /// Promote established sockets of a listener's pool to connections and keep the pool
    /// armed within the backlog.
    /// The local ports of listeners whose accept queue is full.
    fn full_ports_into(&self, ports: &mut Vec<u16>) {
        ports.clear();
        ports.extend(
            self.listeners
                .values()
                .filter(|l| l.full)
                .map(|l| l.endpoint.port),
        );
    }

    fn maintain_listener(&mut self, id: u64, now: Instant) {
        let Some(l) = self.listeners.get_mut(&id) else {
            return;
        };
        let mut promoted = Vec::new();
        let mut i = 0;
        while i < l.pool.len() {
            let h = l.pool[i];
            let state = self.sockets.get::<tcp::Socket>(h).state();
            match state {
                State::Listen | State::SynReceived => i += 1,
                State::Closed => {
                    l.pool.swap_remove(i);
                    self.sockets.remove(h);
                }
                _ => {
                    l.pool.swap_remove(i);
                    promoted.push(h);
                }
            }
        }
        for h in promoted {
            self.promote(id, h, now);
        }
        let Some(l) = self.listeners.get_mut(&id) else {
            return;
        };
        let in_progress = l
            .pool
            .iter()
            .filter(|&&h| self.sockets.get::<tcp::Socket>(h).state() != State::Listen)
            .count();
        let armed = l.pool.len() - in_progress;
        let room = l
            .backlog
            .saturating_sub(l.accept.len() + in_progress)
            .min(self.config.syn_backlog.saturating_sub(in_progress));
        let target = room.min(self.config.armed_listeners);
        l.full = room == 0;
        if armed > target {
            // The accept queue filled up: disarm so the backlog is not exceeded; SYNs to
            // the port are dropped meanwhile (`full`), not refused.
            let mut excess = armed - target;
            let mut j = 0;
            while j < l.pool.len() && excess > 0 {
                let h = l.pool[j];
                if self.sockets.get::<tcp::Socket>(h).state() == State::Listen {
                    l.pool.swap_remove(j);
                    self.sockets.remove(h);
                    excess -= 1;
                } else {
                    j += 1;
                }
            }
        } else {
            let endpoint = l.endpoint;
            let options = l.shared.options;
            let mut need = target - armed;
            let mut new = Vec::new();
            while need > 0 {
                let (mut s, _, _) = self.new_socket_with(&options);
                if s.listen(endpoint).is_err() {
                    break;
                }
                new.push(self.sockets.add(s));
                need -= 1;
            }
            let n = new.len() as u64;
            if let Some(l) = self.listeners.get_mut(&id) {
                l.pool.extend(new);
            }
            self.counters.listeners_armed += n;
        }
    }

    fn promote(&mut self, listener: u64, h: SocketHandle, now: Instant) {
        let cid = self.next_id.fetch_add(1, Ordering::Relaxed);
        let shared = match SocketShared::new(cid) {
            Ok(s) => Arc::new(s),
            Err(_) => {
                self.sockets.get_mut::<tcp::Socket>(h).abort();
                return;
            }
        };
        let s = self.sockets.get::<tcp::Socket>(h);
        let (Some(local), Some(remote)) = (s.local_endpoint(), s.remote_endpoint()) else {
            self.sockets.get_mut::<tcp::Socket>(h).abort();
            return;
        };
        let state = s.state();
        // Accepted connections inherit the listener's options (applied to the pool
        // socket when it was armed).
        let options = self
            .listeners
            .get(&listener)
            .map(|l| l.shared.options)
            .unwrap_or_default();
        shared.init_options(options);
        let buffers = (s.recv_capacity(), s.send_capacity());
        let timeout_armed = s.timeout().is_some();
        self.timeouts_armed |= timeout_armed;
        shared.set_established(local.into(), remote.into());
        let (rx_prod, rx_cons) = rtrb::RingBuffer::new(self.config.ring_size);
        let (tx_prod, tx_cons) = rtrb::RingBuffer::new(self.config.ring_size);
        self.conns.insert(
            cid,
            Conn {
                handle: h,
                shared: shared.clone(),
                rx: rx_prod,
                tx: tx_cons,
                connecting: None,
                port: None,
                last_state: state,
                shutdown: false,
                app_closed: false,
                fin_queued: false,
                close_deadline: None,
                finished: false,
                extra: ConnExtra::new(buffers, timeout_armed),
            },
        );
        self.dirty.push(cid);
        self.counters.established += 1;
        self.counters.accepted += 1;
        let conn = AcceptedConn {
            shared,
            rx: rx_cons,
            tx: tx_prod,
        };
        // Publish before handing the connection over, so a thread that has accepted it
        // already sees it counted in `accepted` (tests and monitoring rely on that).
        self.stats.inner.store(&self.counters);
        let delivered = match self.listeners.get(&listener) {
            Some(l) if l.accept.send(conn).is_ok() => {
                l.shared.notify_accept();
                true
            }
            _ => false,
        };
        if !delivered {
            // Nobody will ever accept it: close it like an application would.
            if let Some(c) = self.conns.get_mut(&cid) {
                c.app_closed = true;
                c.close_deadline = Some(now + self.config.fin_timeout);
            }
        }
    }

    /// Move data between rings and the socket, publish state, decide removal.
    fn serve_conn(
        sockets: &mut SocketSet<'static>,
        c: &mut Conn,
        now: Instant,
        stats: &mut StackStats,
    ) -> Step {
        let mut step = Step::default();
        let s = sockets.get_mut::<tcp::Socket>(c.handle);
        let state = s.state();

        if let Some(deadline) = c.connecting {
            match state {
                State::SynSent | State::SynReceived | State::Listen => {
                    if now >= deadline {
                        s.abort();
                        c.shared.set_error(SocketError::TimedOut);
                        c.connecting = None;
                        c.finished = true;
                    }
                }
                State::Closed => {
                    let e = if now >= deadline {
                        SocketError::TimedOut
                    } else {
                        SocketError::Refused
                    };
                    c.shared.set_error(e);
                    c.connecting = None;
                    c.finished = true;
                }
                _ => {
                    if let (Some(l), Some(r)) = (s.local_endpoint(), s.remote_endpoint()) {
                        c.shared.set_established(l.into(), r.into());
                    }
                    c.connecting = None;
                    stats.established += 1;
                }
            }
        }

        if c.connecting.is_none() && !c.finished {
            // Receive: TCP buffer -> rx ring, straight through smoltcp's ring slices.
            let mut pushed = 0usize;
            while s.can_recv() {
                if c.app_closed {
                    let _ = s.recv(|d| (d.len(), ()));
                    continue;
                }
                if c.rx.slots() == 0 {
                    c.shared.rx_stalled.store(true, Ordering::SeqCst);
                    fence(Ordering::SeqCst);
                    if c.rx.slots() == 0 {
                        break;
                    }
                }
                let rx = &mut c.rx;
                let n = s
                    .recv(|d| {
                        let (_, rest) = rx.push_partial_slice(d);
                        let n = d.len() - rest.len();
                        (n, n)
                    })
                    .unwrap_or(0);
                if n == 0 {
                    break;
                }
                pushed += n;
            }
            if pushed > 0 {
                c.extra.rx_total += pushed as u64;
                stats.rx_bytes += pushed as u64;
                c.shared.notify(WANT_READ);
                step.moved = true;
            }

            // Transmit: tx ring -> TCP buffer.
            if !c.fin_queued {
                let idle = s.send_queue() == 0;
                let mut moved = 0usize;
                while s.can_send() {
                    let avail = c.tx.slots();
                    if avail == 0 {
                        break;
                    }
                    let tx = &mut c.tx;
                    let n = s
                        .send(|free| {
                            let n = free.len().min(avail);
                            if let Ok(chunk) = tx.read_chunk(n) {
                                let (a, b) = chunk.as_slices();
                                free[..a.len()].copy_from_slice(a);
                                free[a.len()..n].copy_from_slice(b);
                                chunk.commit_all();
                                (n, n)
                            } else {
                                (0, 0)
                            }
                        })
                        .unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    moved += n;
                }
                if moved > 0 {
                    c.extra.tx_total += moved as u64;
                    if idle && c.extra.probe.is_none() {
                        c.extra.probe = Some((now, c.extra.tx_total));
                    }
                    stats.tx_bytes += moved as u64;
                    c.shared.notify(WANT_WRITE);
                    step.moved = true;
                }
                // smoltcp 0.14 in LAST-ACK answers an ACK that acknowledges nothing with a
                // challenge ACK and drops it before reading its window field. Entering
                // LAST-ACK with data still queued behind a zero window would then deadlock:
                // the peer's window update is ignored forever (seen in CI: bulk download
                // after the peer's FIN). So in CLOSE-WAIT the FIN waits until every byte
                // queued before it is acknowledged; it costs at most one round trip.
                let fin_must_wait = state == State::CloseWait && s.send_queue() > 0;
                if (c.shutdown || c.app_closed)
                    && c.tx.slots() == 0
                    && s.may_send()
                    && !fin_must_wait
                {
                    s.close();
                    c.fin_queued = true;
                    step.moved = true;
                }
            }

            if let Some((start, until)) = c.extra.probe {
                if c.extra.tx_total.saturating_sub(s.send_queue() as u64) >= until {
                    c.extra.probe = None;
                    c.extra.sample(now.saturating_duration_since(start));
                }
            }

            let state = s.state();
            if c.fin_queued
                && matches!(state, State::FinWait2 | State::TimeWait)
                && s.send_queue() == 0
            {
                c.shared.set_fin_acked();
            }
            if state == State::Closed {
                let graceful = matches!(
                    c.last_state,
                    State::LastAck | State::TimeWait | State::Closing
                ) || (c.last_state == State::Closed);
                if graceful {
                    if c.fin_queued {
                        c.shared.set_fin_acked();
                    }
                    c.shared.set_rx_eof();
                    c.shared.set_closed();
                } else {
                    stats.resets += 1;
                    c.shared.set_error(SocketError::Reset);
                }
                c.finished = true;
            } else if !s.may_recv() && s.recv_queue() == 0 {
                // FIN received and every byte before it delivered.
                c.shared.set_rx_eof();
            }
            c.last_state = state;

            if c.app_closed
                && c.close_deadline.is_some_and(|d| now >= d)
                && state != State::TimeWait
            {
                // tcp_fin_timeout: the peer never finished the close.
                s.abort();
                c.finished = true;
            }
        }

        let s = sockets.get::<tcp::Socket>(c.handle);
        if s.state() == State::Closed && s.local_endpoint().is_none() {
            if !c.finished {
                c.shared.set_closed();
                c.finished = true;
            }
            step.remove = true;
        }
        step
    }

    fn serve(&mut self, id: u64, now: Instant) -> bool {
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        // A swap (not a store) so that reading the app's `true` synchronizes with its
        // ring pushes made before it set the flag.
        c.shared.dirty.swap(false, Ordering::SeqCst);
        if c.shared.control.load(Ordering::Relaxed) {
            self.control(id);
        }
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        let stats = &mut self.counters;
        let step = Self::serve_conn(&mut self.sockets, c, now, stats);
        if step.remove {
            if let Some(c) = self.conns.remove(&id) {
                if let Some(key) = flow_key(&c.shared) {
                    self.watch.forget(&key);
                }
                self.sockets.remove(c.handle);
                if let Some(p) = c.port {
                    self.ports.release(p);
                }
                stats.recycled += 1;
            }
        }
        step.moved
    }

    /// Apply changed options and answer `TCP_INFO` requests of connection `id`.
    fn control(&mut self, id: u64) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        c.shared.control.store(false, Ordering::SeqCst);
        if let Some(o) = c.shared.take_changed_options() {
            let s = self.sockets.get_mut::<tcp::Socket>(c.handle);
            let armed = Self::apply_options(&self.config.tcp, s, &o);
            if let Some(c) = self.conns.get_mut(&id) {
                c.extra.timeout_armed = armed;
                self.timeouts_armed |= armed;
            }
        }
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.shared.info_pending() {
            let info = self.tcp_info(c);
            c.shared.answer_info(info);
        }
    }

    fn dump(&self, now: Instant) {
        for (id, c) in &self.conns {
            let s = self.sockets.get::<tcp::Socket>(c.handle);
            eprintln!(
                "xwarp-stack {:?} conn {id}: {} send_q {} recv_q {} rx_ring_free {} tx_ring_used {} eof {} err {:?} fin_queued {} app_closed {} dirty {} stalled {}",
                self.config.ipv4.map(|a| a.0),
                s.state(),
                s.send_queue(),
                s.recv_queue(),
                c.rx.slots(),
                c.tx.slots(),
                c.shared.rx_eof(),
                c.shared.error(),
                c.fin_queued,
                c.app_closed,
                c.shared.dirty.load(Ordering::Relaxed),
                c.shared.rx_stalled.load(Ordering::Relaxed),
            );
        }
        let _ = now;
    }

    /// smoltcp aborts a connection whose timeout expired (keep-alive: the peer stayed
    /// silent for idle + interval * count) during egress, which is the only place where an
    /// open socket reaches CLOSED without a received RST. Report it as `TimedOut`
    /// (`ETIMEDOUT`, like Linux) before `serve_conn` would call it a reset.
    fn detect_timeouts(&mut self) -> bool {
        if !self.timeouts_armed {
            return false;
        }
        let mut any = false;
        let mut armed = false;
        for c in self.conns.values_mut() {
            if !c.extra.timeout_armed || c.finished {
                continue;
            }
            armed = true;
            if c.connecting.is_some() {
                continue;
            }
            if self.sockets.get::<tcp::Socket>(c.handle).state() == State::Closed
                && !matches!(
                    c.last_state,
                    State::TimeWait | State::LastAck | State::Closing
                )
            {
                c.shared.set_error(SocketError::TimedOut);
                self.dirty.push(c.shared.id);
                any = true;
            }
        }
        self.timeouts_armed = armed;
        any
    }

    fn next_conn_deadline(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(|c| {
                if c.finished {
                    None
                } else {
                    c.connecting.or(c.close_deadline)
                }
            })
            .min()
    }
}

impl<B: Backend> Service<B> for TcpService {
    fn poll(&mut self, backend: &mut B, now: Instant) -> PollOutcome {
        let t = self.smol_now(now);
        let mut busy = false;
        let _ = backend.poll_rx();
        let max_frame = self.config.mtu + ETHERNET_HEADER_LEN;
        let mut iface = match self.iface.take() {
            Some(i) => i,
            None => {
                let mut dev = CappedDevice {
                    inner: &mut *backend,
                    max_frame,
                };
                // Rescue templates must pass the checksums smoltcp verifies (rescue.rs).
                self.watch.checksums = smoltcp::phy::Device::capabilities(&dev).checksum;
                self.make_iface(&mut dev, now)
            }
        };

        while let Ok(cmd) = self.cmds.try_recv() {
            busy = true;
            self.handle_command(&mut iface, cmd, now);
        }
        self.proto_poll(&mut iface, now);

        let mut ingress = false;
        let mut watch = std::mem::take(&mut self.watch);
        self.full_ports_into(&mut watch.full_ports);
        {
            let mut dev = WatchedDevice {
                inner: &mut *backend,
                max_frame,
                watch: &mut watch,
                now,
            };
            iface.poll_maintenance(t);
            loop {
                let result = iface.poll_ingress_single(t, &mut dev, &mut self.sockets);
                // A data+FIN segment arrives split (rescue.rs `split_fin`): its FIN-only half
                // goes in right behind the data, before the next frame. One the TX ring
                // cannot carry a reply for now stays queued for the next poll.
                if !dev.watch.split_fins.is_empty() {
                    let mut replay = ReplayDevice {
                        inner: &mut *dev.inner,
                        max_frame,
                        frames: &mut dev.watch.split_fins,
                    };
                    while !matches!(
                        iface.poll_ingress_single(t, &mut replay, &mut self.sockets),
                        PollIngressSingleResult::None
                    ) {}
                    // Bounded: the peer retransmits a FIN that was not acknowledged.
                    while dev.watch.split_fins.len() > SPLIT_FINS_MAX {
                        dev.watch.split_fins.pop_front();
                    }
                }
                match result {
                    PollIngressSingleResult::None => break,
                    PollIngressSingleResult::PacketProcessed => ingress = true,
                    PollIngressSingleResult::SocketStateChanged => {
                        ingress = true;
                        // smoltcp emits ACKs only at egress, so a batch of out-of-order
                        // segments would collapse into one duplicate ACK and the peer
                        // would never count three (RFC 5681 §3.2 wants one per segment):
                        // fall back to its 1 s minimum RTO. Egress per packet while the
                        // socket set is small enough for that to be cheap.
                        if self.conns.len() <= EGRESS_PER_PACKET_MAX_CONNS {
                            while let PollResult::SocketStateChanged =
                                iface.poll_egress(t, &mut dev, &mut self.sockets)
                            {
                            }
                        }
                        self.proto_rearm(now);
                        // Re-arm listeners between packets: a burst of SYNs must not find
                        // the pool empty while the accept queue has room.
                        if !self.listeners.is_empty() {
                            let ids: Vec<u64> = self.listeners.keys().copied().collect();
                            for id in ids {
                                self.maintain_listener(id, now);
                            }
                            self.full_ports_into(&mut dev.watch.full_ports);
                        }
                    }
                }
            }
        }
        self.counters.syn_dropped_backlog += std::mem::take(&mut watch.syn_drops);
        self.watch = watch;
        busy |= ingress;

        let timer_due = self.next_deadline.is_some_and(|d| now >= d);
        if ingress || timer_due {
            let ids: Vec<u64> = self.conns.keys().copied().collect();
            for id in ids {
                busy |= self.serve(id, now);
            }
            self.dirty.clear();
        } else {
            let dirty = std::mem::take(&mut self.dirty);
            for &id in &dirty {
                busy |= self.serve(id, now);
            }
            self.dirty = dirty;
            self.dirty.clear();
        }
        if !self.listeners.is_empty() && (ingress || timer_due) {
            let ids: Vec<u64> = self.listeners.keys().copied().collect();
            for id in ids {
                self.maintain_listener(id, now);
            }
        }
        busy |= self.proto_serve(now);
        self.stats.inner.store(&self.counters);

        if let Some(last) = self.trace {
            if now >= last + Duration::from_secs(1) {
                self.trace = Some(now);
                self.dump(now);
            }
        }

        let mut rescue_deadline = None;
        if let Some(floor) = self.config.rto_floor {
            let scan_every = floor / 4;
            if self.last_rescue_scan.is_none_or(|t| now >= t + scan_every) {
                self.last_rescue_scan = Some(now);
                let mut outstanding = false;
                for c in self.conns.values_mut() {
                    if c.finished || c.connecting.is_some() {
                        continue;
                    }
                    let s = self.sockets.get::<tcp::Socket>(c.handle);
                    if s.send_queue() == 0 || !s.is_active() {
                        continue;
                    }
                    if let Some(key) = flow_key(&c.shared) {
                        outstanding = true;
                        if self.watch.rescue(&key, now, floor, &mut self.replay) {
                            c.extra.rescues = c.extra.rescues.saturating_add(1);
                        }
                    }
                }
                if outstanding {
                    rescue_deadline = Some(now + scan_every);
                }
            } else if let Some(t) = self.last_rescue_scan {
                rescue_deadline = Some(t + scan_every);
            }
            if !self.replay.is_empty() {
                busy = true;
                let mut dev = ReplayDevice {
                    inner: &mut *backend,
                    max_frame,
                    frames: &mut self.replay,
                };
                while !matches!(
                    iface.poll_ingress_single(t, &mut dev, &mut self.sockets),
                    PollIngressSingleResult::None
                ) {}
                self.replay.clear();
            }
        }

        {
            // Watched so that the AckWatch sees our FINs (rescue.rs, duplicate ACKs behind
            // a FIN); egress receives nothing, so only that part of the watch runs.
            let mut dev = WatchedDevice {
                inner: &mut *backend,
                max_frame,
                watch: &mut self.watch,
                now,
            };
            loop {
                match iface.poll_egress(t, &mut dev, &mut self.sockets) {
                    PollResult::None => break,
                    PollResult::SocketStateChanged => busy = true,
                }
            }
        }
        let _ = backend.flush();
        busy |= self.detect_timeouts();

        let stack_deadline = iface.poll_at(t, &self.sockets).map(|d| self.std_instant(d));
        self.iface = Some(iface);
        let next = [
            stack_deadline,
            self.next_conn_deadline(),
            rescue_deadline,
            self.proto_deadline(),
        ]
        .into_iter()
        .flatten()
        .min();
        self.next_deadline = next;
        // A FIN-only segment still queued (no TX token for a reply this time) must go in
        // on the next iteration, not after the engine slept until the next frame.
        busy |= !self.watch.split_fins.is_empty();
        PollOutcome {
            busy,
            next_deadline: next,
        }
    }
}
