//! The in-engine stream-protocol hook: a [`ProtocolHost`] installed in the
//! [`TcpService`] owns the byte streams of the connections it opens or accepts, so a
//! protocol such as iWARP runs entirely on the engine thread.
//!
//! For these connections there are no application rings: received bytes are handed to
//! [`ProtocolHost::on_recv`] straight from smoltcp's receive buffer (`recv(|data| ..)`),
//! and [`ProtocolHost::on_send`] writes straight into smoltcp's send buffer
//! (`send(|buf| ..)`). The host reaches the rest of the world through its own queues
//! (it is polled once per engine iteration through [`ProtocolHost::poll`], where it may
//! open connections and listeners through [`ProtoCtl`]).
//!
//! Order per engine iteration: application commands, `poll` (plus the requests it queued
//! in [`ProtoCtl`]), ingress, then every hosted connection is served (connect outcome,
//! receive, send, close), then egress. Hosted sockets use Nagle only while a backlog of at
//! least [`NAGLE_BACKLOG`] bytes is queued. `XWARP_PROTO_TRACE` set: hosted connection states go to stderr once
//! a second.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smoltcp::iface::{Interface, SocketHandle};
use smoltcp::socket::tcp::{self, State};
use smoltcp::wire::{IpAddress, IpListenEndpoint};

use crate::service::TcpService;
use crate::shared::SocketError;

/// Up to this many hosted connections, received bytes are handed to the host after
/// every ingress packet (see `TcpService::proto_rearm`).
pub const DRAIN_PER_PACKET_MAX_CONNS: usize = 64;

/// Hosted sockets use Nagle's algorithm only while at least this many bytes are queued.
pub const NAGLE_BACKLOG: usize = 16 * 1024;

/// Identifies a hosted connection (unique per engine, shares the id space of sockets).
pub type ProtoConnId = u64;

/// What the host wants done with a connection, asked after each service of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CloseRequest {
    /// Keep it open.
    #[default]
    None,
    /// Send FIN once [`ProtocolHost::on_send`] has nothing more to send.
    Graceful,
    /// Reset it now.
    Abort,
}

/// A protocol running inside the engine on TCP byte streams (implemented by
/// `xwarp::verbs` for iWARP). Every method runs on the engine thread.
pub trait ProtocolHost: Send {
    /// Once per engine iteration, before ingress: take application work, run timers,
    /// open or close connections and listeners through `ctl`. Returns the next instant
    /// it must be polled at (besides doorbells and traffic).
    fn poll(&mut self, now: Instant, ctl: &mut ProtoCtl) -> Option<Instant>;
    /// The outcome of [`ProtoCtl::listen`] for `token`: the bound address or why not.
    fn on_listen(&mut self, token: u64, result: Result<SocketAddr, SocketError>);
    /// A connection arrived on the listener `token` (TCP handshake complete).
    fn on_accepted(
        &mut self,
        token: u64,
        conn: ProtoConnId,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
    );
    /// An active connection opened by [`ProtoCtl::connect`] is established.
    fn on_established(
        &mut self,
        conn: ProtoConnId,
        local: SocketAddr,
        peer: SocketAddr,
        now: Instant,
    );
    /// Received bytes, in order, straight from the TCP receive buffer. Returns how many
    /// were consumed; the rest is offered again later.
    fn on_recv(&mut self, conn: ProtoConnId, now: Instant, data: &[u8]) -> usize;
    /// Free space in the TCP send buffer: write bytes to send at its start, return how
    /// many were written.
    fn on_send(&mut self, conn: ProtoConnId, now: Instant, buf: &mut [u8]) -> usize;
    /// The peer sent FIN and every byte before it was delivered through `on_recv`.
    fn on_peer_fin(&mut self, conn: ProtoConnId, now: Instant);
    /// What to do with the connection after it was served.
    fn close_request(&mut self, conn: ProtoConnId) -> CloseRequest;
    /// The connection is gone: `None` after a graceful close, else why (refused, reset,
    /// timed out, ...). Called once, last.
    fn on_closed(&mut self, conn: ProtoConnId, now: Instant, error: Option<SocketError>);
}

/// Requests a [`ProtocolHost`] makes of the engine from [`ProtocolHost::poll`].
#[derive(Debug)]
pub struct ProtoCtl {
    ids: Arc<AtomicU64>,
    reqs: Vec<CtlReq>,
}

#[derive(Debug)]
enum CtlReq {
    Connect {
        id: ProtoConnId,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
    },
    Listen {
        token: u64,
        local: SocketAddr,
        backlog: usize,
    },
    Unlisten {
        token: u64,
    },
}

impl ProtoCtl {
    /// Start a TCP connection to `remote` (ephemeral local port unless `local_port`);
    /// the outcome comes as [`ProtocolHost::on_established`] or
    /// [`ProtocolHost::on_closed`] (refused, timed out at `deadline`, bad address).
    pub fn connect(
        &mut self,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
    ) -> ProtoConnId {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.reqs.push(CtlReq::Connect {
            id,
            remote,
            local_port,
            deadline,
        });
        id
    }

    /// Listen on `local` with up to `backlog` handshakes in progress; answered by
    /// [`ProtocolHost::on_listen`] with `token`; connections arrive through
    /// [`ProtocolHost::on_accepted`].
    pub fn listen(&mut self, token: u64, local: SocketAddr, backlog: usize) {
        self.reqs.push(CtlReq::Listen {
            token,
            local,
            backlog,
        });
    }

    /// Stop listening (handshakes in progress are reset).
    pub fn unlisten(&mut self, token: u64) {
        self.reqs.push(CtlReq::Unlisten { token });
    }
}

/// One hosted connection, engine side.
struct ProtoConn {
    handle: SocketHandle,
    port: Option<u16>,
    connecting: Option<Instant>,
    last_state: State,
    fin_queued: bool,
    fin_reported: bool,
    close_deadline: Option<Instant>,
    finished: bool,
    addrs: Option<(SocketAddr, SocketAddr)>,
}

struct ProtoListener {
    endpoint: IpListenEndpoint,
    backlog: usize,
    pool: Vec<SocketHandle>,
}

/// The hosted side of a [`TcpService`]: the host and its connections.
pub(crate) struct ProtoSide {
    host: Box<dyn ProtocolHost>,
    conns: HashMap<ProtoConnId, ProtoConn>,
    listeners: HashMap<u64, ProtoListener>,
    deadline: Option<Instant>,
    last_rescue_scan: Option<Instant>,
    trace_at: Option<Instant>,
    /// `XWARP_PROTO_TRACE` is set.
    trace: bool,
}

impl ProtoSide {
    pub(crate) fn new(host: Box<dyn ProtocolHost>) -> ProtoSide {
        ProtoSide {
            host,
            conns: HashMap::new(),
            listeners: HashMap::new(),
            deadline: None,
            last_rescue_scan: None,
            trace_at: None,
            trace: std::env::var_os("XWARP_PROTO_TRACE").is_some(),
        }
    }
}

fn flow_key(addrs: Option<(SocketAddr, SocketAddr)>) -> Option<crate::rescue::FlowKey> {
    match addrs? {
        (local, SocketAddr::V4(peer)) => Some((*peer.ip(), peer.port(), local.port())),
        _ => None,
    }
}

impl TcpService {
    /// Install the in-engine protocol host (before the service is handed to the engine).
    /// Connections it opens or accepts bypass the application rings.
    pub fn set_protocol_host(&mut self, host: Box<dyn ProtocolHost>) {
        self.proto = Some(ProtoSide::new(host));
    }

    /// The host's next deadline (from its last `poll`).
    pub(crate) fn proto_deadline(&self) -> Option<Instant> {
        let p = self.proto.as_ref()?;
        let conn = p
            .conns
            .values()
            .filter(|c| !c.finished)
            .filter_map(|c| c.connecting.or(c.close_deadline))
            .min();
        [p.deadline, conn].into_iter().flatten().min()
    }

    /// Poll the host and carry out its requests (before ingress).
    pub(crate) fn proto_poll(&mut self, iface: &mut Interface, now: Instant) {
        let Some(mut p) = self.proto.take() else {
            return;
        };
        let mut ctl = ProtoCtl {
            ids: self.next_id.clone(),
            reqs: Vec::new(),
        };
        p.deadline = p.host.poll(now, &mut ctl);
        for req in ctl.reqs {
            match req {
                CtlReq::Connect {
                    id,
                    remote,
                    local_port,
                    deadline,
                } => self.proto_connect(&mut p, iface, id, remote, local_port, deadline, now),
                CtlReq::Listen {
                    token,
                    local,
                    backlog,
                } => {
                    let r = self.proto_listen(&mut p, token, local, backlog);
                    p.host.on_listen(token, r);
                }
                CtlReq::Unlisten { token } => {
                    if let Some(l) = p.listeners.remove(&token) {
                        for h in l.pool {
                            self.sockets.get_mut::<tcp::Socket>(h).abort();
                            self.sockets.remove(h);
                        }
                        self.ports.unlisten(l.endpoint.port);
                    }
                }
            }
        }
        self.proto = Some(p);
    }

    #[allow(clippy::too_many_arguments)]
    fn proto_connect(
        &mut self,
        p: &mut ProtoSide,
        iface: &mut Interface,
        id: ProtoConnId,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
        now: Instant,
    ) {
        let usable = !remote.ip().is_unspecified()
            && !remote.ip().is_multicast()
            && remote.port() != 0
            && match remote.ip() {
                std::net::IpAddr::V4(v4) => self.config.ipv4.is_some() && !v4.is_broadcast(),
                std::net::IpAddr::V6(_) => self.config.ipv6.is_some(),
            };
        if !usable {
            p.host.on_closed(id, now, Some(SocketError::InvalidAddress));
            return;
        }
        let port = match local_port {
            Some(port) if self.ports.claim(port) => port,
            Some(_) => {
                p.host.on_closed(id, now, Some(SocketError::AddrInUse));
                return;
            }
            None => match self.ports.allocate() {
                Some(port) => port,
                None => {
                    p.host
                        .on_closed(id, now, Some(SocketError::AddrNotAvailable));
                    return;
                }
            },
        };
        let mut sock = self.new_socket(&self.config.tcp);
        if sock.connect(iface.context(), remote, port).is_err() {
            self.ports.release(port);
            p.host
                .on_closed(id, now, Some(SocketError::AddrNotAvailable));
            return;
        }
        let handle = self.sockets.add(sock);
        p.conns.insert(
            id,
            ProtoConn {
                handle,
                port: Some(port),
                connecting: Some(deadline),
                last_state: State::SynSent,
                fin_queued: false,
                fin_reported: false,
                close_deadline: None,
                finished: false,
                addrs: None,
            },
        );
    }

    fn proto_listen(
        &mut self,
        p: &mut ProtoSide,
        token: u64,
        local: SocketAddr,
        backlog: usize,
    ) -> Result<SocketAddr, SocketError> {
        if !local.ip().is_unspecified() {
            let ours = match local.ip() {
                std::net::IpAddr::V4(v4) => self.config.ipv4.is_some_and(|(a, _)| a == v4),
                std::net::IpAddr::V6(v6) => self.config.ipv6.is_some_and(|(a, _)| a == v6),
            };
            if !ours {
                return Err(SocketError::AddrNotAvailable);
            }
        }
        if local.port() == 0 || !self.ports.listen(local.port(), token | (1 << 63)) {
            return Err(SocketError::AddrInUse);
        }
        let endpoint = IpListenEndpoint {
            addr: (!local.ip().is_unspecified()).then(|| IpAddress::from(local.ip())),
            port: local.port(),
        };
        p.listeners.insert(
            token,
            ProtoListener {
                endpoint,
                backlog: backlog.clamp(1, 256),
                pool: Vec::new(),
            },
        );
        self.proto_arm(p, token);
        Ok(local)
    }

    /// Promote established sockets of a listener pool and keep it armed.
    fn proto_arm(&mut self, p: &mut ProtoSide, token: u64) -> Vec<(u64, SocketHandle)> {
        let mut promoted = Vec::new();
        let Some(l) = p.listeners.get_mut(&token) else {
            return promoted;
        };
        let mut i = 0;
        while i < l.pool.len() {
            let h = l.pool[i];
            match self.sockets.get::<tcp::Socket>(h).state() {
                State::Listen | State::SynReceived => i += 1,
                State::Closed => {
                    l.pool.swap_remove(i);
                    self.sockets.remove(h);
                }
                _ => {
                    l.pool.swap_remove(i);
                    promoted.push((token, h));
                }
            }
        }
        let armed = l
            .pool
            .iter()
            .filter(|&&h| self.sockets.get::<tcp::Socket>(h).state() == State::Listen)
            .count();
        let want = l.backlog.min(self.config.armed_listeners.max(1));
        for _ in armed..want {
            let mut s = self.new_socket(&self.config.tcp);
            if s.listen(l.endpoint).is_err() {
                break;
            }
            l.pool.push(self.sockets.add(s));
        }
        promoted
    }

    /// Between ingress packets: re-arm hosted listeners (a burst of SYNs must not find
    /// the pool empty), hand established handshakes to the host and, for up to
    /// [`DRAIN_PER_PACKET_MAX_CONNS`] connections, hand received bytes to the host at
    /// once. Draining per packet keeps the receive window open through a long ingress
    /// batch: a batch larger than the receive buffer would otherwise advertise a zero
    /// window, and a lost window update then stalls the sender until smoltcp's
    /// zero-window probe (backing off to seconds) gets through.
    pub(crate) fn proto_rearm(&mut self, now: Instant) {
        if let Some(mut p) = self.proto.take() {
            if !p.listeners.is_empty() {
                self.proto_listeners(&mut p, now);
            }
            if p.conns.len() <= DRAIN_PER_PACKET_MAX_CONNS {
                for (&id, c) in p.conns.iter() {
                    if c.connecting.is_some() || c.finished {
                        continue;
                    }
                    let s = self.sockets.get_mut::<tcp::Socket>(c.handle);
                    while s.can_recv() {
                        let host = &mut p.host;
                        let n = s
                            .recv(|d| {
                                let n = host.on_recv(id, now, d).min(d.len());
                                (n, n)
                            })
                            .unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        self.counters.rx_bytes += n as u64;
                    }
                }
            }
            self.proto = Some(p);
        }
    }

    fn proto_listeners(&mut self, p: &mut ProtoSide, now: Instant) -> bool {
        let mut moved = false;
        let tokens: Vec<u64> = p.listeners.keys().copied().collect();
        for token in tokens {
            for (token, h) in self.proto_arm(p, token) {
                let s = self.sockets.get::<tcp::Socket>(h);
                let (Some(local), Some(remote)) = (s.local_endpoint(), s.remote_endpoint()) else {
                    self.sockets.get_mut::<tcp::Socket>(h).abort();
                    continue;
                };
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let addrs = (SocketAddr::from(local), SocketAddr::from(remote));
                p.conns.insert(
                    id,
                    ProtoConn {
                        handle: h,
                        port: None,
                        connecting: None,
                        last_state: s.state(),
                        fin_queued: false,
                        fin_reported: false,
                        close_deadline: None,
                        finished: false,
                        addrs: Some(addrs),
                    },
                );
                self.counters.established += 1;
                self.counters.accepted += 1;
                p.host.on_accepted(token, id, addrs.0, addrs.1, now);
                moved = true;
            }
        }
        moved
    }

    /// Serve every hosted connection and listener (after ingress). Returns whether
    /// anything moved.
    pub(crate) fn proto_serve(&mut self, now: Instant) -> bool {
        let Some(mut p) = self.proto.take() else {
            return false;
        };
        let mut moved = self.proto_listeners(&mut p, now);
        if p.trace && p.trace_at.is_none_or(|t| now >= t + Duration::from_secs(1)) {
            p.trace_at = Some(now);
            for (id, c) in &p.conns {
                let s = self.sockets.get::<tcp::Socket>(c.handle);
                eprintln!(
                    "proto {:?} {:?} conn {id}: {} send_q {} recv_q {} can_send {} can_recv {} peer {:?}",
                    now,
                    self.config.ipv4.map(|a| a.0),
                    s.state(),
                    s.send_queue(),
                    s.recv_queue(),
                    s.can_send(),
                    s.can_recv(),
                    s.remote_endpoint(),
                );
            }
        }
        let ids: Vec<ProtoConnId> = p.conns.keys().copied().collect();
        let fin_timeout = self.config.fin_timeout;
        for id in ids {
            let Some(c) = p.conns.get_mut(&id) else {
                continue;
            };
            let (m, remove) = serve_one(
                &mut *p.host,
                &mut self.sockets,
                id,
                c,
                now,
                fin_timeout,
                &mut self.counters,
            );
            moved |= m;
            if remove {
                if let Some(c) = p.conns.remove(&id) {
                    if let Some(key) = flow_key(c.addrs) {
                        self.watch.forget(&key);
                    }
                    self.sockets.remove(c.handle);
                    if let Some(port) = c.port {
                        self.ports.release(port);
                    }
                    self.counters.recycled += 1;
                }
            }
        }
        // Stalled-flow rescue (see `rescue.rs`), for hosted connections too.
        if let Some(floor) = self.config.rto_floor {
            let every = floor / 4;
            if p.last_rescue_scan.is_none_or(|t| now >= t + every) {
                p.last_rescue_scan = Some(now);
                for c in p.conns.values() {
                    if c.finished || c.connecting.is_some() {
                        continue;
                    }
                    let s = self.sockets.get::<tcp::Socket>(c.handle);
                    if s.send_queue() == 0 || !s.is_active() {
                        continue;
                    }
                    if let Some(key) = flow_key(c.addrs) {
                        self.watch.rescue(&key, now, floor, &mut self.replay);
                    }
                }
            }
            if p.conns.values().any(|c| !c.finished) {
                let next = p.last_rescue_scan.map(|t| t + every);
                p.deadline = [p.deadline, next].into_iter().flatten().min();
            }
        }
        self.proto = Some(p);
        moved
    }
}

fn serve_one(
    host: &mut dyn ProtocolHost,
    sockets: &mut smoltcp::iface::SocketSet<'static>,
    id: ProtoConnId,
    c: &mut ProtoConn,
    now: Instant,
    fin_timeout: Duration,
    stats: &mut crate::service::StackStats,
) -> (bool, bool) {
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
                    c.addrs = Some((l.into(), r.into()));
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
            moved = true;
        }
        if !c.fin_reported && !s.may_recv() && s.recv_queue() == 0 && s.state() != State::Closed {
            c.fin_reported = true;
            host.on_peer_fin(id, now);
            moved = true;
        }
        // Transmit: the protocol encodes straight into the TCP send buffer.
        if !c.fin_queued {
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
                moved = true;
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
        if !c.finished && c.close_deadline.is_some_and(|d| now >= d) && state != State::TimeWait {
            s.abort();
            c.finished = true;
            host.on_closed(id, now, Some(SocketError::TimedOut));
        }
    }
    let s = sockets.get::<tcp::Socket>(c.handle);
    let remove = c.finished && s.state() == State::Closed && s.local_endpoint().is_none();
    (moved, remove)
}
