//! The one connection model of the engine.
//!
//! Every TCP connection the engine owns, whoever consumes its bytes, is one [`Conn`] in
//! the [`ConnTable`]: the smoltcp socket handle with its TCP-side bookkeeping
//! ([`ConnTcp`]) plus its [`Sink`], the consumer of its byte stream: an application's
//! pair of rings and shared state ([`AppEnd`]) or the in-engine protocol host
//! ([`HostEnd`], see `proto.rs`). The table also owns the smoltcp socket set and the
//! port reservations, so removing a connection frees its socket, its port and its
//! rescue flow in one place. The service iterates the table through
//! [`ConnTable::serve`], the per-connection code of this file.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{self, State};

use crate::config::StackConfig;
use crate::ports::Ports;
use crate::proto::{CloseRequest, ProtoConnId, ProtocolHost, NAGLE_BACKLOG};
use crate::rescue::{AckWatch, FlowKey};
use crate::shared::{SocketError, SocketShared, TcpInfo, WANT_READ, WANT_WRITE};
use crate::socket::apply_options;
use crate::stats::StackStats;

/// TCP-side state of one connection, whoever consumes its bytes.
pub(crate) struct ConnTcp {
    pub(crate) handle: SocketHandle,
    /// Ephemeral or explicitly claimed local port, released on removal.
    pub(crate) port: Option<u16>,
    /// Active open in progress, until this deadline.
    pub(crate) connecting: Option<Instant>,
    pub(crate) last_state: State,
    pub(crate) fin_queued: bool,
    /// `tcp_fin_timeout`: abort a close the peer has not finished by then, unless the
    /// close made progress meanwhile (see [`CloseProgress`]).
    pub(crate) close_deadline: Option<Instant>,
    /// Where the close stood when `close_deadline` was last set (`None` until first
    /// served after the close).
    pub(crate) close_progress: Option<CloseProgress>,
    /// The outcome was reported to the consumer; the socket only waits to be removed.
    pub(crate) finished: bool,
    /// Counters, RTT estimate and option state (`TCP_INFO`, keep-alive).
    pub(crate) extra: ConnExtra,
    /// Its IPv4 flow, tracked by the [`AckWatch`] while the connection exists (see
    /// [`flow_of`]).
    pub(crate) flow: Option<FlowKey>,
}

/// How far a connection closed by its owner has got: bytes the peer acknowledged and the
/// TCP state. `tcp_fin_timeout` ([`StackConfig::fin_timeout`]) bounds how long a close
/// may go without moving either, not how long the whole drain may take: a closed
/// connection still delivering its queued bytes to a slow (or lossy, or loaded) peer is
/// making progress and is not aborted. Linux likewise runs `tcp_fin_timeout` only in
/// FIN-WAIT-2 and gives up on data still in flight only after its retransmissions fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CloseProgress {
    /// Bytes the peer acknowledged.
    pub(crate) acked: u64,
    /// The TCP state (its discriminant).
    pub(crate) state: u8,
}

/// What to do with a closed connection whose `close_deadline` passed at `now` with
/// `progress` where it now stands: `true` (abort) only if nothing moved since the
/// deadline was set; otherwise the deadline moves to `now + fin_timeout`.
pub(crate) fn close_expired(
    deadline: &mut Option<Instant>,
    last: &mut Option<CloseProgress>,
    progress: CloseProgress,
    now: Instant,
    fin_timeout: Duration,
) -> bool {
    if !deadline.is_some_and(|d| now >= d) {
        if last.is_none() {
            *last = Some(progress);
        }
        return false;
    }
    if *last == Some(progress) {
        return true;
    }
    *last = Some(progress);
    *deadline = Some(now + fin_timeout);
    false
}

/// The [`AckWatch`] key of an IPv4 connection from local port `local_port` to `remote`.
pub(crate) fn flow_of(local_port: u16, remote: SocketAddr) -> Option<FlowKey> {
    match remote {
        SocketAddr::V4(peer) => Some((*peer.ip(), peer.port(), local_port)),
        SocketAddr::V6(_) => None,
    }
}

impl ConnTcp {
    /// A connection on socket `handle` in `state`, nothing reported yet.
    pub(crate) fn new(
        handle: SocketHandle,
        port: Option<u16>,
        connecting: Option<Instant>,
        state: State,
        extra: ConnExtra,
    ) -> ConnTcp {
        ConnTcp {
            handle,
            port,
            connecting,
            last_state: state,
            fin_queued: false,
            close_deadline: None,
            close_progress: None,
            finished: false,
            extra,
            flow: None,
        }
    }

    /// The same, with its flow set (see [`flow_of`]).
    pub(crate) fn with_flow(mut self, flow: Option<FlowKey>) -> ConnTcp {
        self.flow = flow;
        self
    }
}

/// The application's end of a connection: its rings and shared state.
pub(crate) struct AppEnd {
    pub(crate) shared: Arc<SocketShared>,
    pub(crate) rx: rtrb::Producer<u8>,
    pub(crate) tx: rtrb::Consumer<u8>,
    /// `shutdown(Write)`: FIN once the tx ring is drained.
    pub(crate) shutdown: bool,
    /// The application closed (or never accepted) the connection.
    pub(crate) app_closed: bool,
    /// Bytes taken out of the socket's receive buffer when a RST arrived for the flow
    /// (see [`ConnTable::save_unread`]), delivered to the rx ring before anything else; at
    /// most the socket's receive buffer capacity.
    pub(crate) unread: Vec<u8>,
    /// The connection closed (`Some(graceful)`: a RST in TIME-WAIT ends a complete
    /// stream) while `unread` still held bytes: the outcome is reported once they are all
    /// in the rx ring.
    pub(crate) outcome_pending: Option<bool>,
    /// The socket's state when a RST of its flow was about to be fed to smoltcp
    /// ([`ConnTable::save_unread`]): a RST in TIME-WAIT, CLOSING or LAST-ACK (the peer's
    /// FIN received) ends a complete stream, even when the engine did not serve the
    /// connection between the FIN and the RST.
    pub(crate) state_at_rst: Option<State>,
}

/// The protocol host's end of a connection (the host itself lives in `hosted.rs`).
#[derive(Default)]
pub(crate) struct HostEnd {
    /// (local, peer) once established.
    pub(crate) addrs: Option<(SocketAddr, SocketAddr)>,
    /// [`ProtocolHost::on_peer_fin`] was called.
    pub(crate) fin_reported: bool,
}

/// Who consumes a connection's bytes.
pub(crate) enum Sink {
    /// An application, through a [`Stream`](crate::Stream)'s rings.
    App(AppEnd),
    /// The in-engine protocol host.
    Host(HostEnd),
}

/// One connection as the engine sees it.
pub(crate) struct Conn {
    /// The socket and its TCP-side state.
    pub(crate) tcp: ConnTcp,
    /// The consumer of its bytes.
    pub(crate) sink: Sink,
}

/// Which connections to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Application connections.
    App,
    /// Connections of the protocol host.
    Hosted,
}

/// What serving one connection did.
#[derive(Default)]
pub(crate) struct Step {
    /// Bytes or state moved.
    pub(crate) moved: bool,
    /// The connection is done: recycle it.
    pub(crate) remove: bool,
}

/// What the protocol host's side (`hosted.rs`) may use of the engine: the connection
/// table, the configuration, the counters and the connection id source.
pub(crate) struct EngineCtx<'a> {
    pub(crate) table: &'a mut ConnTable,
    pub(crate) config: &'a StackConfig,
    pub(crate) stats: &'a mut StackStats,
    pub(crate) ids: &'a Arc<AtomicU64>,
}

/// Every connection of the engine, with the socket set and the port reservations.
pub(crate) struct ConnTable {
    /// smoltcp's sockets: connections, and the listener pools of the service and host.
    pub(crate) sockets: SocketSet<'static>,
    /// Ephemeral and listening ports.
    pub(crate) ports: Ports,
    conns: HashMap<u64, Conn>,
    /// How many of `conns` are hosted.
    hosted: usize,
    /// Bytes of receive and send buffer of every socket in `sockets`.
    buffer_bytes: u64,
    /// Number of sockets in `sockets` (added and removed only through
    /// [`ConnTable::add_socket`] and [`ConnTable::remove_socket`]).
    socket_count: usize,
    /// Flows of connections inserted since the last [`ConnTable::sync_watch`], with
    /// whether the connection was accepted (passive).
    new_flows: Vec<(FlowKey, bool)>,
    /// Application connections by IPv4 flow (packed [`FlowKey`], `rescue::pack`): the
    /// ones a received frame can have changed (issue 16: serve only those after ingress).
    /// Usually one id per flow; a new connection can share an old one's flow while the old
    /// one still waits in TIME-WAIT.
    by_flow: HashMap<u64, Vec<u64>>,
}

impl ConnTable {
    /// An empty table drawing ports from `ports`.
    pub(crate) fn new(ports: Ports) -> ConnTable {
        ConnTable {
            sockets: SocketSet::new(Vec::new()),
            ports,
            conns: HashMap::new(),
            hosted: 0,
            buffer_bytes: 0,
            socket_count: 0,
            new_flows: Vec::new(),
            by_flow: HashMap::new(),
        }
    }

    /// Append the application connections of the flows in `keys` (packed) to `out`.
    pub(crate) fn app_ids_of_flows(&self, keys: &[u64], out: &mut Vec<u64>) {
        for k in keys {
            if let Some(ids) = self.by_flow.get(k) {
                out.extend_from_slice(ids);
            }
        }
    }

    /// Whether one more socket with `bytes` of buffers fits the engine's limits
    /// (`StackConfig::max_sockets`, `StackConfig::socket_buffer_budget`).
    pub(crate) fn room_for(&self, bytes: u64, config: &StackConfig) -> bool {
        self.socket_count < config.max_sockets
            && self.buffer_bytes.saturating_add(bytes) <= config.socket_buffer_budget
    }

    /// Add socket `s` to the socket set, counting its buffers. Callers check
    /// [`ConnTable::room_for`] first.
    pub(crate) fn add_socket(&mut self, s: tcp::Socket<'static>) -> SocketHandle {
        self.buffer_bytes += buffer_bytes(&s);
        self.socket_count += 1;
        self.sockets.add(s)
    }

    /// Remove socket `h` from the socket set.
    pub(crate) fn remove_socket(&mut self, h: SocketHandle) {
        let bytes = buffer_bytes(self.socket(h));
        self.buffer_bytes = self.buffer_bytes.saturating_sub(bytes);
        self.socket_count -= 1;
        self.sockets.remove(h);
    }

    /// Number of sockets (connections, handshakes, armed listeners).
    pub(crate) fn socket_count(&self) -> usize {
        self.socket_count
    }

    /// Bytes of socket buffer held by all sockets.
    pub(crate) fn buffer_bytes(&self) -> u64 {
        self.buffer_bytes
    }

    /// Number of connection records (application and hosted, in any state).
    pub(crate) fn len_all(&self) -> usize {
        self.conns.len()
    }

    /// Have `watch` track the flows of the connections inserted since the last call.
    pub(crate) fn sync_watch(&mut self, watch: &mut AckWatch, now: Instant) {
        for (key, passive) in self.new_flows.drain(..) {
            watch.track(&key, passive, now);
        }
    }

    /// Every connection with its socket (for `xwarp stat`).
    pub(crate) fn each(&self) -> impl Iterator<Item = (u64, &Conn, &tcp::Socket<'static>)> {
        self.conns
            .iter()
            .map(|(&id, c)| (id, c, self.sockets.get::<tcp::Socket>(c.tcp.handle)))
    }

    /// The socket behind `h`.
    pub(crate) fn socket(&self, h: SocketHandle) -> &tcp::Socket<'static> {
        self.sockets.get::<tcp::Socket>(h)
    }

    /// The socket behind `h`, mutably.
    pub(crate) fn socket_mut(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(h)
    }

    /// Add connection `id`.
    pub(crate) fn insert(&mut self, id: u64, c: Conn) {
        if let Some(key) = c.tcp.flow {
            self.new_flows.push((key, c.tcp.connecting.is_none()));
            if matches!(c.sink, Sink::App(_)) {
                let ids = self.by_flow.entry(crate::rescue::pack(&key)).or_default();
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        if matches!(c.sink, Sink::Host(_)) {
            self.hosted += 1;
        }
        if let Some(old) = self.conns.insert(id, c) {
            if matches!(old.sink, Sink::Host(_)) {
                self.hosted -= 1;
            }
        }
    }

    /// How many connections of `kind` exist.
    pub(crate) fn len(&self, kind: Kind) -> usize {
        match kind {
            Kind::App => self.conns.len() - self.hosted,
            Kind::Hosted => self.hosted,
        }
    }

    /// The ids of the connections of `kind`.
    pub(crate) fn ids(&self, kind: Kind) -> Vec<u64> {
        if self.len(kind) == 0 {
            return Vec::new();
        }
        self.conns
            .iter()
            .filter(|(_, c)| (kind == Kind::Hosted) == matches!(c.sink, Sink::Host(_)))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Application connection `id`.
    pub(crate) fn app(&self, id: u64) -> Option<(&ConnTcp, &AppEnd)> {
        match self.conns.get(&id)? {
            Conn {
                tcp,
                sink: Sink::App(a),
            } => Some((tcp, a)),
            _ => None,
        }
    }

    /// Application connection `id`, mutably.
    pub(crate) fn app_mut(&mut self, id: u64) -> Option<(&mut ConnTcp, &mut AppEnd)> {
        match self.conns.get_mut(&id)? {
            Conn {
                tcp,
                sink: Sink::App(a),
            } => Some((tcp, a)),
            _ => None,
        }
    }

    /// Serve connection `id` (application or hosted; `host` serves the hosted ones).
    pub(crate) fn serve(
        &mut self,
        id: u64,
        now: Instant,
        fin_timeout: Duration,
        stats: &mut StackStats,
        host: Option<&mut dyn ProtocolHost>,
    ) -> Step {
        let Some(Conn { tcp, sink }) = self.conns.get_mut(&id) else {
            return Step::default();
        };
        match (sink, host) {
            (Sink::App(a), _) => serve_app(&mut self.sockets, tcp, a, now, fin_timeout, stats),
            (Sink::Host(h), Some(host)) => {
                serve_hosted(host, &mut self.sockets, id, tcp, h, now, fin_timeout, stats)
            }
            (Sink::Host(_), None) => Step::default(),
        }
    }

    /// Publish connection `id`'s last `TCP_INFO` (an application connection about to be
    /// recycled): the answer to the application's requests once the engine let go of it.
    pub(crate) fn publish_final_info(&self, id: u64, config: &StackConfig) {
        if let Some(Conn {
            tcp: c,
            sink: Sink::App(a),
        }) = self.conns.get(&id)
        {
            let s = self.sockets.get::<tcp::Socket>(c.handle);
            a.shared.answer_final_info(tcp_info(s, c, a, config));
        }
    }

    /// Remove connection `id`: forget its rescue flow, free its socket and its port.
    /// Returns whether it existed.
    pub(crate) fn recycle(&mut self, id: u64, watch: &mut AckWatch) -> bool {
        let Some(c) = self.conns.remove(&id) else {
            return false;
        };
        if matches!(c.sink, Sink::Host(_)) {
            self.hosted -= 1;
        }
        if let Some(key) = c.tcp.flow {
            self.new_flows.retain(|(k, _)| *k != key);
            watch.forget(&key);
            let packed = crate::rescue::pack(&key);
            if let Some(ids) = self.by_flow.get_mut(&packed) {
                ids.retain(|&i| i != id);
                if ids.is_empty() {
                    self.by_flow.remove(&packed);
                }
            }
        }
        self.remove_socket(c.tcp.handle);
        if let Some(p) = c.tcp.port {
            self.ports.release(p);
        }
        true
    }

    /// Apply changed options and answer `TCP_INFO` requests of application connection
    /// `id`. Returns whether smoltcp now has a timeout armed on it.
    pub(crate) fn control(&mut self, id: u64, config: &StackConfig) -> bool {
        let Some(Conn {
            tcp: c,
            sink: Sink::App(a),
        }) = self.conns.get_mut(&id)
        else {
            return false;
        };
        a.shared.control.store(false, Ordering::SeqCst);
        let mut armed = false;
        if let Some(o) = a.shared.take_changed_options() {
            let s = self.sockets.get_mut::<tcp::Socket>(c.handle);
            armed = apply_options(&config.tcp, s, &o);
            c.extra.timeout_armed = armed;
        }
        if a.shared.info_pending() {
            let s = self.sockets.get::<tcp::Socket>(c.handle);
            a.shared.answer_info(tcp_info(s, c, a, config));
        }
        armed
    }

    /// Hand the bytes received so far on every hosted connection to the host.
    pub(crate) fn drain_hosted(
        &mut self,
        host: &mut dyn ProtocolHost,
        now: Instant,
        stats: &mut StackStats,
    ) {
        for (&id, c) in self.conns.iter_mut() {
            if !matches!(c.sink, Sink::Host(_)) {
                continue;
            }
            let c = &mut c.tcp;
            if c.connecting.is_some() || c.finished {
                continue;
            }
            let s = self.sockets.get_mut::<tcp::Socket>(c.handle);
            while s.can_recv() {
                let n = s
                    .recv(|d| {
                        let n = host.on_recv(id, now, d).min(d.len());
                        (n, n)
                    })
                    .unwrap_or(0);
                if n == 0 {
                    break;
                }
                stats.rx_bytes += n as u64;
                c.extra.rx_total += n as u64;
            }
        }
    }

    /// A RST for `key` is about to be fed to smoltcp, which would throw away what its
    /// receive buffer still holds: move those bytes (received and acknowledged, not yet
    /// in the application's rx ring because the ring was full) into the connection's
    /// `unread` first, so the application reads them before the reset error, as on Linux.
    /// At most the socket's receive capacity is held (a RST smoltcp then rejects leaves
    /// the connection open and `unread` is drained first).
    pub(crate) fn save_unread(&mut self, key: &FlowKey) {
        for c in self.conns.values_mut() {
            let Sink::App(a) = &mut c.sink else {
                continue;
            };
            if c.tcp.flow.as_ref() != Some(key) || c.tcp.finished || a.app_closed {
                continue;
            }
            let s = self.sockets.get_mut::<tcp::Socket>(c.tcp.handle);
            a.state_at_rst = Some(s.state());
            let mut room = s.recv_capacity().saturating_sub(a.unread.len());
            while room > 0 && s.can_recv() {
                let unread = &mut a.unread;
                let n = s
                    .recv(|d| {
                        let n = d.len().min(room);
                        unread.extend_from_slice(&d[..n]);
                        (n, n)
                    })
                    .unwrap_or(0);
                if n == 0 {
                    break;
                }
                room -= n;
            }
            return;
        }
    }

    /// The stalled-flow rescue scan (`rescue.rs`): queue replayed ACKs into `replay` for
    /// every open connection with data outstanding whose flow made no progress for
    /// `floor`. Returns whether any connection has data outstanding.
    pub(crate) fn rescue_scan(
        &mut self,
        watch: &mut AckWatch,
        now: Instant,
        floor: Duration,
        replay: &mut VecDeque<Vec<u8>>,
    ) -> bool {
        let mut outstanding = false;
        for c in self.conns.values_mut() {
            if c.tcp.finished || c.tcp.connecting.is_some() {
                continue;
            }
            let s = self.sockets.get::<tcp::Socket>(c.tcp.handle);
            if s.send_queue() == 0 || !s.is_active() {
                continue;
            }
            if let Some(key) = c.tcp.flow {
                outstanding = true;
                if watch.rescue(&key, now, floor, replay) {
                    c.tcp.extra.rescues = c.tcp.extra.rescues.saturating_add(1);
                }
            }
        }
        outstanding
    }

    /// Some hosted connection is not finished.
    pub(crate) fn hosted_open(&self) -> bool {
        self.hosted > 0
            && self
                .conns
                .values()
                .any(|c| matches!(c.sink, Sink::Host(_)) && !c.tcp.finished)
    }

    /// The earliest connect or close deadline of an unfinished connection.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter(|c| !c.tcp.finished)
            .filter_map(|c| c.tcp.connecting.or(c.tcp.close_deadline))
            .min()
    }

    /// smoltcp aborts a connection whose timeout expired during egress: mark such
    /// application connections `TimedOut` and push their ids to `dirty`. Returns
    /// (whether one was found, whether any connection still has a timeout armed).
    pub(crate) fn detect_timeouts(&mut self, dirty: &mut Vec<u64>) -> (bool, bool) {
        let mut any = false;
        let mut armed = false;
        for c in self.conns.values_mut() {
            let Conn {
                tcp: c,
                sink: Sink::App(a),
            } = c
            else {
                continue;
            };
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
                a.shared.set_error(SocketError::TimedOut);
                dirty.push(a.shared.id);
                any = true;
            }
        }
        (any, armed)
    }

    /// `XWARP_STACK_TRACE`: application connection states, logged at info under target
    /// `xwarp_stack::trace` (shown by the CLI's and the shim's default logger).
    pub(crate) fn dump_app(&self, config: &StackConfig) {
        for (id, c) in &self.conns {
            let Conn {
                tcp: c,
                sink: Sink::App(a),
            } = c
            else {
                continue;
            };
            let s = self.sockets.get::<tcp::Socket>(c.handle);
            log::info!(
                target: "xwarp_stack::trace",
                "xwarp-stack {:?} conn {id}: {} send_q {} recv_q {} rx_ring_free {} tx_ring_used {} eof {} err {:?} fin_queued {} app_closed {} dirty {} stalled {}",
                config.ipv4.map(|a| a.0),
                s.state(),
                s.send_queue(),
                s.recv_queue(),
                a.rx.slots(),
                a.tx.slots(),
                a.shared.rx_eof(),
                a.shared.error(),
                c.fin_queued,
                a.app_closed,
                a.shared.dirty.load(Ordering::Relaxed),
                a.shared.rx_stalled.load(Ordering::Relaxed),
            );
        }
    }

    /// `XWARP_PROTO_TRACE`: hosted connection states, logged like `dump_app`.
    pub(crate) fn dump_hosted(&self, now: Instant, config: &StackConfig) {
        for (id, c) in &self.conns {
            if !matches!(c.sink, Sink::Host(_)) {
                continue;
            }
            let s = self.sockets.get::<tcp::Socket>(c.tcp.handle);
            log::info!(
                target: "xwarp_stack::trace",
                "proto {:?} {:?} conn {id}: {} send_q {} recv_q {} can_send {} can_recv {} peer {:?}",
                now,
                config.ipv4.map(|a| a.0),
                s.state(),
                s.send_queue(),
                s.recv_queue(),
                s.can_send(),
                s.can_recv(),
                s.remote_endpoint(),
            );
        }
    }
}

/// Per-connection bookkeeping beyond the data path: byte counters, the engine's RTT
/// estimate and whether smoltcp may abort the connection on its own (keep-alive).
#[derive(Debug, Default)]
pub(crate) struct ConnExtra {
    /// Bytes handed to smoltcp for sending.
    pub(crate) tx_total: u64,
    /// Bytes taken from smoltcp's receive buffer.
    pub(crate) rx_total: u64,
    /// RFC 6298 `SRTT` and `RTTVAR`.
    pub(crate) srtt: Option<Duration>,
    pub(crate) rttvar: Duration,
    /// RTT sample in flight: when bytes were handed to an idle connection and the
    /// `tx_total` whose acknowledgement ends the sample.
    probe: Option<(Instant, u64)>,
    /// smoltcp has a timeout set (keep-alive or user timeout): a close in egress is a
    /// timeout, reported as `TimedOut` rather than `Reset`.
    timeout_armed: bool,
    /// Loss rescues (rescue.rs) triggered for this connection.
    pub(crate) rescues: u32,
    /// Receive and send buffer sizes of the smoltcp socket.
    pub(crate) buffers: (usize, usize),
}

impl ConnExtra {
    /// Bookkeeping of a socket with `buffers` (receive, send) and, if `timeout_armed`, a
    /// smoltcp timeout.
    pub(crate) fn new(buffers: (usize, usize), timeout_armed: bool) -> ConnExtra {
        ConnExtra {
            buffers,
            timeout_armed,
            ..ConnExtra::default()
        }
    }

    /// The retransmission timeout the engine works with: smoltcp's own minimum RTO is
    /// 1 s; the rescue floor (rescue.rs) lowers it.
    pub(crate) fn rto(&self, config: &StackConfig) -> Duration {
        let floor = config.rto_floor.unwrap_or(Duration::from_secs(1));
        match self.srtt {
            None => Duration::from_secs(1).max(floor),
            Some(srtt) => (srtt + (self.rttvar * 4).max(Duration::from_millis(1))).max(floor),
        }
        .min(Duration::from_secs(60))
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

/// Receive plus send buffer bytes of socket `s`.
fn buffer_bytes(s: &tcp::Socket<'static>) -> u64 {
    (s.recv_capacity() + s.send_capacity()) as u64
}

/// Linux's `TCP_*` state numbers (`include/net/tcp_states.h`).
pub(crate) fn linux_state(s: State) -> u8 {
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

/// What the engine knows about connection `c` (`TCP_INFO`).
fn tcp_info(s: &tcp::Socket<'static>, c: &ConnTcp, a: &AppEnd, config: &StackConfig) -> TcpInfo {
    let v6 = matches!(a.shared.addrs(), Some((SocketAddr::V6(_), _)));
    let mss = config.mtu.saturating_sub(if v6 { 60 } else { 40 }) as u32;
    let x = &c.extra;
    let rto = x.rto(config);
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
        ..TcpInfo::default()
    }
}

/// Serve an application connection: move data between its rings and the socket,
/// publish state, decide removal.
fn serve_app(
    sockets: &mut SocketSet<'static>,
    c: &mut ConnTcp,
    a: &mut AppEnd,
    now: Instant,
    fin_timeout: Duration,
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
                    a.shared.set_error(SocketError::TimedOut);
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
                a.shared.set_error(e);
                c.connecting = None;
                c.finished = true;
            }
            _ => {
                if let (Some(l), Some(r)) = (s.local_endpoint(), s.remote_endpoint()) {
                    a.shared.set_established(l.into(), r.into());
                }
                c.connecting = None;
                stats.established += 1;
            }
        }
    }

    if c.connecting.is_none() && !c.finished {
        // Receive: TCP buffer -> rx ring, straight through smoltcp's ring slices.
        let mut pushed = 0usize;
        // First what was saved from the socket when a RST arrived (`save_unread`).
        if a.app_closed {
            a.unread = Vec::new();
        }
        while !a.unread.is_empty() {
            let (_, rest) = a.rx.push_partial_slice(&a.unread);
            let n = a.unread.len() - rest.len();
            a.unread.drain(..n);
            pushed += n;
            if !a.unread.is_empty() && a.rx.slots() == 0 {
                a.shared.rx_stalled.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if a.rx.slots() == 0 {
                    break;
                }
            }
        }
        while a.unread.is_empty() && s.can_recv() {
            if a.app_closed {
                let _ = s.recv(|d| (d.len(), ()));
                continue;
            }
            if a.rx.slots() == 0 {
                a.shared.rx_stalled.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if a.rx.slots() == 0 {
                    break;
                }
            }
            let rx = &mut a.rx;
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
            a.shared.notify(WANT_READ);
            step.moved = true;
        }

        // Transmit: tx ring -> TCP buffer.
        if !c.fin_queued {
            let idle = s.send_queue() == 0;
            let mut moved = 0usize;
            while s.can_send() {
                let avail = a.tx.slots();
                if avail == 0 {
                    break;
                }
                let tx = &mut a.tx;
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
                a.shared.notify(WANT_WRITE);
                step.moved = true;
            }
            // smoltcp 0.14 in LAST-ACK answers an ACK that acknowledges nothing with a
            // challenge ACK and drops it before reading its window field. Entering
            // LAST-ACK with data still queued behind a zero window would then deadlock:
            // the peer's window update is ignored forever (seen in CI: bulk download
            // after the peer's FIN). So in CLOSE-WAIT the FIN waits until every byte
            // queued before it is acknowledged; it costs at most one round trip.
            let fin_must_wait = state == State::CloseWait && s.send_queue() > 0;
            if (a.shutdown || a.app_closed) && a.tx.slots() == 0 && s.may_send() && !fin_must_wait {
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
        if c.fin_queued && matches!(state, State::FinWait2 | State::TimeWait) && s.send_queue() == 0
        {
            a.shared.set_fin_acked();
        }
        if state == State::Closed {
            let peer_done =
                |st: State| matches!(st, State::LastAck | State::TimeWait | State::Closing);
            let graceful = a.outcome_pending.unwrap_or_else(|| {
                peer_done(c.last_state)
                    || c.last_state == State::Closed
                    || a.state_at_rst.is_some_and(peer_done)
            });
            if !a.unread.is_empty() {
                // Closed with bytes acknowledged before the RST still to deliver: they
                // come first, then the outcome (Linux's read returns queued data first).
                a.outcome_pending = Some(graceful);
            } else if graceful {
                if c.fin_queued {
                    a.shared.set_fin_acked();
                }
                a.shared.set_rx_eof();
                a.shared.set_closed();
                c.finished = true;
            } else {
                stats.resets += 1;
                a.shared.set_error(SocketError::Reset);
                c.finished = true;
            }
        } else if !s.may_recv() && s.recv_queue() == 0 && a.unread.is_empty() {
            // FIN received and every byte before it delivered.
            a.shared.set_rx_eof();
        }
        c.last_state = state;

        if a.app_closed && c.close_deadline.is_some() && state != State::TimeWait {
            let progress = CloseProgress {
                acked: c.extra.tx_total.saturating_sub(s.send_queue() as u64),
                state: state as u8,
            };
            let (deadline, last) = (&mut c.close_deadline, &mut c.close_progress);
            if close_expired(deadline, last, progress, now, fin_timeout) {
                // tcp_fin_timeout: the peer stopped finishing the close.
                s.abort();
                c.finished = true;
            }
        }
    }

    let s = sockets.get::<tcp::Socket>(c.handle);
    if s.state() == State::Closed && s.local_endpoint().is_none() && a.unread.is_empty() {
        if !c.finished {
            a.shared.set_closed();
            c.finished = true;
        }
        step.remove = true;
    }
    step
}

/// Serve a hosted connection: report its connect outcome, hand received bytes to the
/// host and let it fill the send buffer, carry out its close request, decide removal.
#[allow(clippy::too_many_arguments)]
fn serve_hosted(
    host: &mut dyn ProtocolHost,
    sockets: &mut SocketSet<'static>,
    id: ProtoConnId,
    c: &mut ConnTcp,
    h: &mut HostEnd,
    now: Instant,
    fin_timeout: Duration,
    stats: &mut StackStats,
) -> Step {
    let mut moved = false;
    let s = sockets.get_mut::<tcp::Socket>(c.handle);
    if let Some(deadline) = c.connecting {
        match s.state() {
            State::SynSent | State::SynReceived | State::Listen => {
                if now >= deadline {
                    s.abort();
                    c.connecting = None;
                    c.finished = true;
                    host.on_closed(id, now, Some(SocketError::TimedOut));
                }
            }
            State::Closed => {
                let e = if now >= deadline {
                    SocketError::TimedOut
                } else {
                    SocketError::Refused
                };
                c.connecting = None;
                c.finished = true;
                host.on_closed(id, now, Some(e));
            }
            _ => {
                c.connecting = None;
                stats.established += 1;
                if let (Some(l), Some(r)) = (s.local_endpoint(), s.remote_endpoint()) {
                    h.addrs = Some((l.into(), r.into()));
                    host.on_established(id, l.into(), r.into(), now);
                    moved = true;
                }
            }
        }
    }
    if c.connecting.is_none() && !c.finished {
        // Receive: straight from the TCP buffer into the protocol.
        while s.can_recv() {
            let n = s
                .recv(|d| {
                    let n = host.on_recv(id, now, d).min(d.len());
                    (n, n)
                })
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            stats.rx_bytes += n as u64;
            c.extra.rx_total += n as u64;
            moved = true;
        }
        if !h.fin_reported && !s.may_recv() && s.recv_queue() == 0 && s.state() != State::Closed {
            h.fin_reported = true;
            host.on_peer_fin(id, now);
            moved = true;
        }
        // Transmit: the protocol encodes straight into the TCP send buffer.
        if !c.fin_queued {
            // RTT sample as for application connections (`xwarp stat`'s SRTT).
            if s.send_queue() == 0 && c.extra.probe.is_none() && s.can_send() {
                c.extra.probe = Some((now, c.extra.tx_total + 1));
            }
            while s.can_send() {
                let n = s
                    .send(|buf| {
                        let n = host.on_send(id, now, buf).min(buf.len());
                        (n, n)
                    })
                    .unwrap_or(0);
                if n == 0 {
                    break;
                }
                stats.tx_bytes += n as u64;
                c.extra.tx_total += n as u64;
                moved = true;
            }
        }
        if let Some((start, until)) = c.extra.probe {
            let acked = c.extra.tx_total.saturating_sub(s.send_queue() as u64);
            if c.extra.tx_total < until && s.send_queue() == 0 {
                // Nothing was sent: no sample.
                c.extra.probe = None;
            } else if acked >= until {
                c.extra.probe = None;
                c.extra.sample(now.saturating_duration_since(start));
            }
        }
        // Nagle only while a bulk backlog is queued: a lone small message (latency
        // ping-pong) leaves at once, while the small window openings of a bulk stream
        // do not turn into tiny segments (silly-window sends at per-packet egress).
        s.set_nagle_enabled(s.send_queue() >= NAGLE_BACKLOG);
        match host.close_request(id) {
            CloseRequest::None => {}
            CloseRequest::Graceful => {
                if !c.fin_queued && s.may_send() {
                    s.close();
                    c.fin_queued = true;
                    c.close_deadline = Some(now + fin_timeout);
                    moved = true;
                } else if !c.fin_queued {
                    c.fin_queued = true;
                    c.close_deadline = Some(now + fin_timeout);
                }
            }
            CloseRequest::Abort => {
                s.abort();
                c.fin_queued = true;
                c.finished = true;
                host.on_closed(id, now, Some(SocketError::Aborted));
                moved = true;
            }
        }
        let state = s.state();
        if !c.finished && state == State::Closed {
            let graceful = matches!(
                c.last_state,
                State::LastAck | State::TimeWait | State::Closing
            ) || c.last_state == State::Closed;
            c.finished = true;
            if graceful {
                host.on_closed(id, now, None);
            } else {
                stats.resets += 1;
                host.on_closed(id, now, Some(SocketError::Reset));
            }
            moved = true;
        }
        c.last_state = state;
        let progress = CloseProgress {
            acked: c.extra.tx_total.saturating_sub(s.send_queue() as u64),
            state: state as u8,
        };
        if !c.finished
            && c.close_deadline.is_some()
            && state != State::TimeWait
            && close_expired(
                &mut c.close_deadline,
                &mut c.close_progress,
                progress,
                now,
                fin_timeout,
            )
        {
            s.abort();
            c.finished = true;
            host.on_closed(id, now, Some(SocketError::TimedOut));
        }
    }
    let s = sockets.get::<tcp::Socket>(c.handle);
    let remove = c.finished && s.state() == State::Closed && s.local_endpoint().is_none();
    Step { moved, remove }
}
