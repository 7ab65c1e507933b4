//! The engine side: a smoltcp `Interface` + `SocketSet` driven as a poll-driver `Service`.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use smoltcp::iface::SocketHandle;
use smoltcp::iface::{Config as IfaceConfig, Interface, PollIngressSingleResult, PollResult};
use smoltcp::socket::tcp::State;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpListenEndpoint};
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::engine::{PollOutcome, Service};
use xwarp_poll_driver::pcap::{Capture, Tapped};

use crate::command::{AcceptedConn, Command};
use crate::config::StackConfig;
use crate::conn::{
    flow_of, linux_state, AppEnd, Conn, ConnExtra, ConnTable, ConnTcp, EngineCtx, Kind, Sink,
};
use crate::device::{CappedDevice, ETHERNET_HEADER_LEN};
use crate::hosted::ProtoSide;
use crate::ports::Ports;
use crate::proto::ProtocolHost;
use crate::rescue::{AckWatch, ReplayDevice, WatchedDevice};
use crate::shared::{ListenerShared, SocketError, SocketShared};
use crate::socket::{buffer_sizes, new_socket_with};
use crate::stats::{EngineUsage, StackStats, StatsCell, Telemetry, TELEMETRY_EVERY};

/// FIN-only segments (rescue.rs `split_fin`) kept while the TX ring is full.
const SPLIT_FINS_MAX: usize = 64;

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
    /// When each pool socket in SYN-RECEIVED was first seen so (`syn_received_timeout`).
    syn_since: HashMap<SocketHandle, Instant>,
}

impl Drop for Listener {
    /// Wakes an application waiting on the listener's readiness descriptor when the
    /// engine forgets the port (an engine that stops drops its service, and so this):
    /// its next accept finds the engine gone instead of sleeping forever.
    fn drop(&mut self) {
        self.shared.set_engine_dropped();
    }
}

/// Up to this many connections the engine runs egress after every ingress packet.
const EGRESS_PER_PACKET_MAX_CONNS: usize = 64;

/// The TCP engine service. Build it with [`crate::new_stack`]; the engine thread calls
/// [`Service::poll`].
pub struct TcpService {
    config: StackConfig,
    epoch: Instant,
    cmds: Receiver<Command>,
    next_id: Arc<AtomicU64>,
    iface: Option<Interface>,
    /// Every connection (application and hosted), the socket set and the ports.
    table: ConnTable,
    listeners: HashMap<u64, Listener>,
    dirty: Vec<u64>,
    next_deadline: Option<Instant>,
    /// Application connections a command (shutdown, close, abort) changed this iteration.
    recheck: Vec<u64>,
    /// Those of the previous iteration: served in this one (see `poll_backend`).
    recheck_due: Vec<u64>,
    counters: StackStats,
    stats: Arc<StatsCell>,
    watch: AckWatch,
    replay: VecDeque<Vec<u8>>,
    last_rescue_scan: Option<Instant>,
    /// `XWARP_STACK_TRACE` set: dump connection states to stderr once a second.
    trace: Option<Instant>,
    /// The in-engine protocol host and its listeners (see `proto.rs`, `hosted.rs`).
    proto: Option<ProtoSide>,
    /// Some connection may have a smoltcp timeout (keep-alive): [`TcpService::detect_timeouts`]
    /// has work to do. Cleared when a scan finds none.
    timeouts_armed: bool,
    /// Every frame through the backend recorded here ([`TcpService::set_capture`]).
    capture: Option<Capture>,
    /// Where `xwarp stat` reads the counters and tables, if published.
    telemetry: Option<Telemetry>,
    /// `TcpCore::Own`: the own TCP core runs the connections (`own.rs`); the smoltcp
    /// socket set, listener pools and rescue stay empty.
    own: Option<crate::own::OwnCore>,
}

impl std::fmt::Debug for TcpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpService")
            .field("conns", &self.table.len(Kind::App))
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
        let epoch = Instant::now();
        let own = (config.tcp_core == crate::config::TcpCore::Own)
            .then(|| crate::own::OwnCore::new(&config, epoch));
        TcpService {
            own,
            table: ConnTable::new(Ports::new(config.ephemeral_ports.clone())),
            config,
            epoch,
            cmds,
            next_id,
            iface: None,
            listeners: HashMap::new(),
            dirty: Vec::new(),
            next_deadline: None,
            recheck: Vec::new(),
            recheck_due: Vec::new(),
            counters: StackStats::default(),
            stats,
            watch: AckWatch::default(),
            replay: VecDeque::new(),
            last_rescue_scan: None,
            trace: std::env::var_os("XWARP_STACK_TRACE").map(|_| Instant::now()),
            proto: None,
            timeouts_armed: false,
            capture: None,
            telemetry: None,
        }
    }

    /// Publish the stack's counters, its connection table and the protocol host's QP
    /// table ([`ProtocolHost::qp_records`]) to `seg` every 100 ms from the engine thread
    /// (`xwarp stat`).
    pub fn set_telemetry(&mut self, seg: Arc<xwarp_telemetry::Segment>) {
        self.telemetry = Some(Telemetry::new(seg));
    }

    /// Publish to the telemetry segment if it is time (end of a poll that did `busy`
    /// work); returns when the engine must poll again to publish what changed.
    fn publish_telemetry(&mut self, now: Instant, busy: bool) -> Option<Instant> {
        let t = self.telemetry.as_mut()?;
        t.dirty |= busy;
        if now < t.next {
            return t.dirty.then_some(t.next);
        }
        t.next = now + TELEMETRY_EVERY;
        t.dirty = false;
        let c = &self.counters;
        t.seg.set_stack(&xwarp_telemetry::StackCounters {
            established: c.established,
            accepted: c.accepted,
            resets: c.resets,
            recycled: c.recycled,
            tx_bytes: c.tx_bytes,
            rx_bytes: c.rx_bytes,
            listeners_armed: c.listeners_armed,
            syn_dropped_backlog: c.syn_dropped_backlog,
            refused_limit: c.refused_limit,
            flows_evicted: c.flows_evicted,
            syn_received_expired: c.syn_received_expired,
            sockets: self
                .own
                .as_ref()
                .map_or(self.table.socket_count(), |o| o.len()) as u64,
            socket_buffer_bytes: self
                .own
                .as_ref()
                .map_or(self.table.buffer_bytes(), |o| o.usage().socket_buffer_bytes),
            connections: self.own.as_ref().map_or(self.table.len_all(), |o| o.len()) as u64,
            hosted_connections: self
                .own
                .as_ref()
                .map_or(self.table.len(Kind::Hosted), |o| o.hosted())
                as u64,
            listeners: self
                .own
                .as_ref()
                .map_or(self.listeners.len(), |o| o.listeners()) as u64,
        });
        let cap = t.seg.capacity();
        t.conns.clear();
        let mut total = 0;
        if let Some(own) = &self.own {
            total = own.conn_records(&mut t.conns, cap.conns);
        }
        for (id, conn, sock) in self.table.each() {
            total += 1;
            if t.conns.len() < cap.conns {
                t.conns.push(conn_record(id, conn, sock, &self.config));
            }
        }
        t.conns.sort_unstable_by_key(|r| r.id);
        t.seg.publish_conns(&t.conns, total);
        t.qps.clear();
        if let Some(p) = self.proto.as_mut() {
            p.host_mut().qp_records(&mut t.qps);
        }
        t.seg.publish_qps(&t.qps, t.qps.len());
        None
    }

    /// Number of smoltcp sockets alive (connections, TIME-WAIT, armed listeners).
    pub fn socket_count(&self) -> usize {
        if let Some(own) = &self.own {
            return own.len();
        }
        self.table.sockets.iter().count()
    }

    /// What the engine holds right now, against the limits of [`StackConfig`].
    pub fn usage(&self) -> EngineUsage {
        if let Some(own) = &self.own {
            return own.usage();
        }
        // The limit checks use the table's running count: it must match the socket set.
        debug_assert_eq!(self.table.socket_count(), self.socket_count());
        let half_open = self
            .listeners
            .values()
            .flat_map(|l| l.pool.iter())
            .filter(|&&h| self.table.socket(h).state() != State::Listen)
            .count()
            + self.proto.as_ref().map_or(0, |p| p.half_open(&self.table));
        EngineUsage {
            sockets: self.socket_count(),
            socket_buffer_bytes: self.table.buffer_bytes(),
            connections: self.table.len_all(),
            half_open,
            tracked_flows: self.watch.tracked(),
        }
    }

    /// Install the in-engine protocol host (before the service is handed to the engine).
    /// Connections it opens or accepts bypass the application rings.
    pub fn set_protocol_host(&mut self, host: Box<dyn ProtocolHost>) {
        self.proto = Some(ProtoSide::new(host));
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
                if let Some((_, a)) = self.table.app_mut(id) {
                    a.shutdown = true;
                    self.dirty.push(id);
                }
            }
            Command::Close { id } => {
                if let Some((c, a)) = self.table.app_mut(id) {
                    a.app_closed = true;
                    c.close_deadline = Some(now + self.config.fin_timeout);
                    let (connecting, h) = (c.connecting.is_some(), c.handle);
                    if connecting {
                        self.table.socket_mut(h).abort();
                    }
                    self.dirty.push(id);
                }
            }
            Command::Abort { id } => {
                if let Some((c, a)) = self.table.app_mut(id) {
                    a.shared.set_error(SocketError::Aborted);
                    c.finished = true;
                    let h = c.handle;
                    self.table.socket_mut(h).abort();
                    self.dirty.push(id);
                }
            }
            Command::SetNodelay { id, nodelay } => {
                if let Some((c, _)) = self.table.app(id) {
                    let h = c.handle;
                    self.table.socket_mut(h).set_nagle_enabled(!nodelay);
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
                if !self.table.ports.claim(p) {
                    shared.set_error(SocketError::AddrInUse);
                    return;
                }
                p
            }
            None => match self.table.ports.allocate() {
                Some(p) => p,
                None => {
                    shared.set_error(SocketError::AddrNotAvailable);
                    return;
                }
            },
        };
        let (rx_size, tx_size) = buffer_sizes(&self.config, &shared.options());
        if !self
            .table
            .room_for((rx_size + tx_size) as u64, &self.config)
        {
            // StackConfig::max_sockets or socket_buffer_budget: ENOBUFS, never an abort.
            self.table.ports.release(port);
            self.counters.refused_limit += 1;
            shared.set_error(SocketError::NoBuffers);
            return;
        }
        let (mut sock, buffers, timeout_armed) = new_socket_with(&self.config, &shared.options());
        self.timeouts_armed |= timeout_armed;
        if sock.connect(iface.context(), remote, port).is_err() {
            self.table.ports.release(port);
            shared.set_error(SocketError::AddrNotAvailable);
            return;
        }
        let handle = self.table.add_socket(sock);
        let id = shared.id;
        let tcp = ConnTcp::new(
            handle,
            Some(port),
            Some(deadline),
            State::SynSent,
            ConnExtra::new(buffers, timeout_armed),
        )
        .with_flow(flow_of(port, remote));
        self.table.insert(id, app_conn(tcp, shared, rx, tx));
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
        if !self.table.ports.listen(local.port(), shared.id) {
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
                // Linux cuts the backlog to net.core.somaxconn.
                backlog: backlog.clamp(1, self.config.max_backlog),
                pool: Vec::new(),
                full: false,
                syn_since: HashMap::new(),
            },
        );
        self.maintain_listener(id, now);
    }

    fn unlisten(&mut self, id: u64) {
        if let Some(mut l) = self.listeners.remove(&id) {
            for h in std::mem::take(&mut l.pool) {
                let s = self.table.socket_mut(h);
                if s.state() == State::Listen {
                    s.close();
                    self.table.remove_socket(h);
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
                    let mut tcp = ConnTcp::new(h, None, None, State::Closed, ConnExtra::default());
                    tcp.fin_queued = true;
                    tcp.finished = true;
                    let cid = shared.id;
                    let mut conn = app_conn(tcp, shared, rx, tx);
                    if let Sink::App(a) = &mut conn.sink {
                        a.app_closed = true;
                    }
                    self.table.insert(cid, conn);
                }
            }
            self.table.ports.unlisten(l.endpoint.port);
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
        if let Some(p) = &self.proto {
            p.full_ports_into(ports);
        }
    }

    fn maintain_listener(&mut self, id: u64, now: Instant) {
        let Some(l) = self.listeners.get_mut(&id) else {
            return;
        };
        let mut promoted = Vec::new();
        let mut i = 0;
        while i < l.pool.len() {
            let h = l.pool[i];
            let state = self.table.socket(h).state();
            match state {
                State::Listen => i += 1,
                State::SynReceived => {
                    let since = *l.syn_since.entry(h).or_insert(now);
                    if now.saturating_duration_since(since) >= self.config.syn_received_timeout {
                        // A handshake never finished (a spoofed SYN): free its slot.
                        l.syn_since.remove(&h);
                        l.pool.swap_remove(i);
                        self.table.socket_mut(h).abort();
                        self.table.remove_socket(h);
                        self.counters.syn_received_expired += 1;
                    } else {
                        i += 1;
                    }
                }
                State::Closed => {
                    l.syn_since.remove(&h);
                    l.pool.swap_remove(i);
                    self.table.remove_socket(h);
                }
                _ => {
                    l.syn_since.remove(&h);
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
            .filter(|&&h| self.table.socket(h).state() != State::Listen)
            .count();
        let armed = l.pool.len() - in_progress;
        let room = l
            .backlog
            .saturating_sub(l.accept.len() + in_progress)
            .min(self.config.syn_backlog.saturating_sub(in_progress));
        let target = room.min(self.config.armed_listeners);
        // No socket left to arm (StackConfig::max_sockets or socket_buffer_budget): SYNs
        // are dropped like those beyond the backlog until a socket is freed.
        let (rx_size, tx_size) = buffer_sizes(&self.config, &l.shared.options);
        let exhausted = armed == 0
            && !self
                .table
                .room_for((rx_size + tx_size) as u64, &self.config);
        l.full = room == 0 || exhausted;
        if armed > target {
            // The accept queue filled up: disarm so the backlog is not exceeded; SYNs to
            // the port are dropped meanwhile (`full`), not refused.
            let mut excess = armed - target;
            let mut j = 0;
            while j < l.pool.len() && excess > 0 {
                let h = l.pool[j];
                if self.table.socket(h).state() == State::Listen {
                    l.pool.swap_remove(j);
                    self.table.remove_socket(h);
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
            let bytes = (rx_size + tx_size) as u64;
            while need > 0 && self.table.room_for(bytes, &self.config) {
                let (mut s, _, _) = new_socket_with(&self.config, &options);
                if s.listen(endpoint).is_err() {
                    break;
                }
                new.push(self.table.add_socket(s));
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
                self.table.socket_mut(h).abort();
                return;
            }
        };
        let s = self.table.socket(h);
        let (Some(local), Some(remote)) = (s.local_endpoint(), s.remote_endpoint()) else {
            self.table.socket_mut(h).abort();
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
        let flow = flow_of(local.port, SocketAddr::from(remote));
        let tcp = ConnTcp::new(h, None, None, state, ConnExtra::new(buffers, timeout_armed))
            .with_flow(flow);
        self.table
            .insert(cid, app_conn(tcp, shared.clone(), rx_prod, tx_cons));
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
        self.stats.store(&self.counters);
        let delivered = match self.listeners.get(&listener) {
            Some(l) if l.accept.send(conn).is_ok() => {
                l.shared.notify_accept();
                true
            }
            _ => false,
        };
        if !delivered {
            // Nobody will ever accept it: close it like an application would.
            if let Some((c, a)) = self.table.app_mut(cid) {
                a.app_closed = true;
                c.close_deadline = Some(now + self.config.fin_timeout);
            }
        }
    }

    /// Serve connection `id` (application or hosted) and recycle it when it is done.
    fn serve(&mut self, id: u64, now: Instant) -> bool {
        if let Some((_, a)) = self.table.app(id) {
            // A swap (not a store) so that reading the app's `true` synchronizes with its
            // ring pushes made before it set the flag.
            a.shared.dirty.swap(false, Ordering::SeqCst);
            if a.shared.control.load(Ordering::Relaxed) {
                self.timeouts_armed |= self.table.control(id, &self.config);
            }
        }
        let host = self.proto.as_mut().map(|p| p.host_mut());
        let step = self
            .table
            .serve(id, now, self.config.fin_timeout, &mut self.counters, host);
        if step.remove {
            self.table.publish_final_info(id, &self.config);
            if self.table.recycle(id, &mut self.watch) {
                self.counters.recycled += 1;
            }
        }
        step.moved
    }

    /// Serve the connections `ids`.
    fn serve_all(&mut self, ids: &[u64], now: Instant) -> bool {
        let mut moved = false;
        for &id in ids {
            moved |= self.serve(id, now);
        }
        moved
    }

    /// smoltcp aborts a connection whose timeout expired (keep-alive: the peer stayed
    /// silent for idle + interval * count) during egress, which is the only place where an
    /// open socket reaches CLOSED without a received RST. Report it as `TimedOut`
    /// (`ETIMEDOUT`, like Linux) before serving would call it a reset.
    fn detect_timeouts(&mut self) -> bool {
        if !self.timeouts_armed {
            return false;
        }
        let (any, armed) = self.table.detect_timeouts(&mut self.dirty);
        self.timeouts_armed = armed;
        any
    }

    /// What the protocol host's side may use of the engine, and the host's side.
    fn hosted(&mut self) -> Option<(&mut ProtoSide, EngineCtx<'_>)> {
        let p = self.proto.as_mut()?;
        let cx = EngineCtx {
            table: &mut self.table,
            config: &self.config,
            stats: &mut self.counters,
            ids: &self.next_id,
        };
        Some((p, cx))
    }
}

/// An application connection on `tcp` with its rings and shared state.
fn app_conn(
    tcp: ConnTcp,
    shared: Arc<SocketShared>,
    rx: rtrb::Producer<u8>,
    tx: rtrb::Consumer<u8>,
) -> Conn {
    Conn {
        tcp,
        sink: Sink::App(AppEnd {
            shared,
            rx,
            tx,
            shutdown: false,
            app_closed: false,
            unread: Vec::new(),
            outcome_pending: None,
            state_at_rst: None,
        }),
    }
}

/// The record of connection `id` for the telemetry table.
fn conn_record(
    id: u64,
    c: &Conn,
    s: &smoltcp::socket::tcp::Socket<'static>,
    config: &StackConfig,
) -> xwarp_telemetry::ConnRecord {
    use std::net::SocketAddr;
    let ep =
        |e: Option<smoltcp::wire::IpEndpoint>| e.map(|e| SocketAddr::new(e.addr.into(), e.port));
    let local = ep(s.local_endpoint());
    let v6 = matches!(local, Some(SocketAddr::V6(_)));
    let x = &c.tcp.extra;
    let send_queue = s.send_queue() as u64;
    let (rx_ring, tx_ring) = match &c.sink {
        Sink::App(a) => (
            Some((a.rx.buffer().capacity() - a.rx.slots()) as u64),
            Some(a.tx.slots() as u64),
        ),
        Sink::Host(_) => (None, None),
    };
    let us = |d: std::time::Duration| d.as_micros() as u64;
    xwarp_telemetry::ConnRecord {
        id,
        state: linux_state(s.state()),
        hosted: matches!(c.sink, Sink::Host(_)),
        local,
        remote: ep(s.remote_endpoint()),
        bytes_sent: x.tx_total,
        bytes_acked: x.tx_total.saturating_sub(send_queue),
        bytes_received: x.rx_total + s.recv_queue() as u64,
        send_queue,
        send_buffer: s.send_capacity() as u64,
        recv_queue: s.recv_queue() as u64,
        recv_buffer: s.recv_capacity() as u64,
        rx_ring_used: rx_ring,
        tx_ring_used: tx_ring,
        retransmits: u64::from(x.rescues),
        srtt_us: x.srtt.map(us),
        rttvar_us: x.srtt.map(|_| us(x.rttvar)),
        rto_us: Some(us(x.rto(config))),
        // smoltcp keeps its congestion window private.
        cwnd: None,
        mss: config.mtu.saturating_sub(if v6 { 60 } else { 40 }) as u64,
    }
}

impl<B: Backend> Service<B> for TcpService {
    fn poll(&mut self, backend: &mut B, now: Instant) -> PollOutcome {
        // Not capturing: one branch per poll. Capturing: the same poll through a
        // recording view of the backend (neither type changes).
        match self.capture.take() {
            None => self.poll_backend(backend, now),
            Some(cap) => {
                let out = self.poll_backend(&mut Tapped::new(backend, &cap), now);
                self.capture = Some(cap);
                out
            }
        }
    }
}

impl TcpService {
    /// Record every frame this engine receives and sends to `capture` (`None`: stop).
    /// The engine builder sets it from `XWARP_PCAP` (`xwarp_poll_driver::pcap`).
    pub fn set_capture(&mut self, capture: Option<Capture>) {
        self.capture = capture;
    }

    /// The capture frames are recorded to, if any.
    pub fn capture(&self) -> Option<&Capture> {
        self.capture.as_ref()
    }

    /// One iteration of the own TCP core (`own.rs`).
    fn poll_own<B: Backend>(&mut self, backend: &mut B, now: Instant) -> PollOutcome {
        let Some(mut own) = self.own.take() else {
            return PollOutcome {
                busy: false,
                next_deadline: None,
            };
        };
        let _ = backend.poll_rx();
        let max_frame = self.config.mtu + ETHERNET_HEADER_LEN;
        let mut iface = match self.iface.take() {
            Some(i) => i,
            None => {
                let mut dev = CappedDevice {
                    inner: &mut *backend,
                    max_frame,
                };
                self.make_iface(&mut dev, now)
            }
        };
        let mut busy = false;
        let mut env = crate::own::Env {
            config: &self.config,
            counters: &mut self.counters,
            host: self.proto.as_mut().map(|p| p.host_mut()),
            ids: &self.next_id,
        };
        while let Ok(cmd) = self.cmds.try_recv() {
            busy = true;
            own.command(&mut env, cmd, now);
        }
        let (moved, next) = own.poll(&mut env, &mut iface, backend, now, max_frame);
        busy |= moved;
        let _ = backend.flush();
        self.stats.store(&self.counters);
        self.iface = Some(iface);
        self.own = Some(own);
        self.next_deadline = next;
        let publish_at = self.publish_telemetry(now, busy);
        PollOutcome {
            busy,
            next_deadline: [next, publish_at].into_iter().flatten().min(),
        }
    }

    fn poll_backend<B: Backend>(&mut self, backend: &mut B, now: Instant) -> PollOutcome {
        if self.own.is_some() {
            return self.poll_own(backend, now);
        }
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
            // A shutdown, close or abort changes the socket's state at this iteration's
            // egress (a RST makes it CLOSED at once) without any frame arriving: serve it
            // again next iteration, where a touched-only serve would not visit it.
            if let Command::ShutdownWrite { id } | Command::Close { id } | Command::Abort { id } =
                &cmd
            {
                self.recheck.push(*id);
            }
            self.handle_command(&mut iface, cmd, now);
        }
        if let Some((p, mut cx)) = self.hosted() {
            p.poll(&mut cx, &mut iface, now);
        }
        self.table.sync_watch(&mut self.watch, now);

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
                let result = iface.poll_ingress_single(t, &mut dev, &mut self.table.sockets);
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
                        iface.poll_ingress_single(t, &mut replay, &mut self.table.sockets),
                        PollIngressSingleResult::None
                    ) {}
                    // Bounded: the peer retransmits a FIN that was not acknowledged.
                    while dev.watch.split_fins.len() > SPLIT_FINS_MAX {
                        dev.watch.split_fins.pop_front();
                    }
                }
                // A RST of one of our flows was held back (rescue.rs `held_rsts`): save
                // what the socket still holds for the application, then feed it.
                if !dev.watch.held_rsts.is_empty() {
                    for frame in &dev.watch.held_rsts {
                        if let Some(key) = crate::rescue::rst_flow(frame) {
                            self.table.save_unread(&key);
                        }
                    }
                    let mut replay = ReplayDevice {
                        inner: &mut *dev.inner,
                        max_frame,
                        frames: &mut dev.watch.held_rsts,
                    };
                    while !matches!(
                        iface.poll_ingress_single(t, &mut replay, &mut self.table.sockets),
                        PollIngressSingleResult::None
                    ) {}
                    // One the TX ring had no room for is dropped (the peer's next segment
                    // is answered with another RST).
                    dev.watch.held_rsts.clear();
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
                        if self.table.len(Kind::App) <= EGRESS_PER_PACKET_MAX_CONNS {
                            while let PollResult::SocketStateChanged =
                                iface.poll_egress(t, &mut dev, &mut self.table.sockets)
                            {
                            }
                        }
                        if let Some((p, mut cx)) = self.hosted() {
                            p.between_packets(&mut cx, now);
                        }
                        // Re-arm listeners between packets: a burst of SYNs must not find
                        // the pool empty while the accept queue has room.
                        if !self.listeners.is_empty() {
                            let ids: Vec<u64> = self.listeners.keys().copied().collect();
                            for id in ids {
                                self.maintain_listener(id, now);
                            }
                        }
                        // Flows of connections just promoted (their handshake's last ACK
                        // is still in the watch's slot) and the listeners now full.
                        self.table.sync_watch(dev.watch, now);
                        self.full_ports_into(&mut dev.watch.full_ports);
                    }
                }
            }
        }
        self.counters.syn_dropped_backlog += std::mem::take(&mut watch.syn_drops);
        self.watch = watch;
        busy |= ingress;

        let timer_due = self.next_deadline.is_some_and(|d| now >= d);
        let mut touched = std::mem::take(&mut self.watch.touched);
        let touched_all = std::mem::replace(&mut self.watch.touched_all, false);
        if timer_due || (ingress && touched_all) {
            let ids = self.table.ids(Kind::App);
            busy |= self.serve_all(&ids, now);
            self.dirty.clear();
        } else if ingress {
            // Only the connections of the flows that received frames (a frame changes
            // only its own socket), the dirty ones and those a command changed last
            // iteration: the per-iteration cost follows the traffic, not the number of
            // connections (issue 16).
            let mut ids = std::mem::take(&mut self.dirty);
            self.table.app_ids_of_flows(&touched, &mut ids);
            ids.extend_from_slice(&self.recheck_due);
            ids.sort_unstable();
            ids.dedup();
            busy |= self.serve_all(&ids, now);
            ids.clear();
            self.dirty = ids;
        } else {
            let mut dirty = std::mem::take(&mut self.dirty);
            dirty.extend_from_slice(&self.recheck_due);
            busy |= self.serve_all(&dirty, now);
            self.dirty = dirty;
            self.dirty.clear();
        }
        // This iteration's commands are rechecked after its egress, in the next one.
        self.recheck_due.clear();
        std::mem::swap(&mut self.recheck, &mut self.recheck_due);
        busy |= !self.recheck_due.is_empty();
        // Keep the list's allocation for the next iteration.
        touched.clear();
        self.watch.touched = touched;
        if !self.listeners.is_empty() && (ingress || timer_due) {
            let ids: Vec<u64> = self.listeners.keys().copied().collect();
            for id in ids {
                self.maintain_listener(id, now);
            }
        }
        // The host's connections: hand it the new ones, then serve them all.
        if let Some((p, mut cx)) = self.hosted() {
            busy |= p.accept(&mut cx, now);
            p.trace(&cx, now);
            let ids = self.table.ids(Kind::Hosted);
            busy |= self.serve_all(&ids, now);
        }
        self.table.sync_watch(&mut self.watch, now);
        self.counters.flows_evicted = self.watch.evicted;
        self.stats.store(&self.counters);

        if let Some(last) = self.trace {
            if now >= last + Duration::from_secs(1) {
                self.trace = Some(now);
                self.table.dump_app(&self.config);
            }
        }

        let mut rescue_deadline = None;
        if let Some(floor) = self.config.rto_floor {
            let scan_every = floor / 4;
            if self.watch.partial_pending
                || self.last_rescue_scan.is_none_or(|t| now >= t + scan_every)
            {
                self.watch.partial_pending = false;
                self.last_rescue_scan = Some(now);
                let outstanding =
                    self.table
                        .rescue_scan(&mut self.watch, now, floor, &mut self.replay);
                // The host's open connections keep the scan going even when idle.
                if outstanding || self.table.hosted_open() {
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
                    iface.poll_ingress_single(t, &mut dev, &mut self.table.sockets),
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
                match iface.poll_egress(t, &mut dev, &mut self.table.sockets) {
                    PollResult::None => break,
                    PollResult::SocketStateChanged => busy = true,
                }
            }
        }
        let _ = backend.flush();
        busy |= self.detect_timeouts();

        let stack_deadline = iface
            .poll_at(t, &self.table.sockets)
            .map(|d| self.std_instant(d));
        self.iface = Some(iface);
        let next = [
            stack_deadline,
            self.table.next_deadline(),
            rescue_deadline,
            self.proto.as_ref().and_then(ProtoSide::deadline),
        ]
        .into_iter()
        .flatten()
        .min();
        self.next_deadline = next;
        // A FIN-only segment still queued (no TX token for a reply this time) must go in
        // on the next iteration, not after the engine slept until the next frame.
        busy |= !self.watch.split_fins.is_empty();
        // Not in `self.next_deadline`: a publication is no timer of the connections.
        let publish_at = self.publish_telemetry(now, busy);
        PollOutcome {
            busy,
            next_deadline: [next, publish_at].into_iter().flatten().min(),
        }
    }
}
