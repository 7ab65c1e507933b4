//! The engine side of the in-engine protocol hook (`proto.rs`): the installed
//! [`ProtocolHost`], its listener pools and the requests it queues in a [`ProtoCtl`].
//!
//! Its connections are ordinary records of the [`ConnTable`] (with a [`HostEnd`]); this
//! side reaches the engine only through the [`EngineCtx`] the service passes in.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use smoltcp::iface::{Interface, SocketHandle};
use smoltcp::socket::tcp::State;
use smoltcp::wire::{IpAddress, IpListenEndpoint};

use crate::conn::{flow_of, Conn, ConnExtra, ConnTable, ConnTcp, EngineCtx, HostEnd, Kind, Sink};
use crate::proto::{CtlReq, ProtoConnId, ProtoCtl, ProtocolHost, DRAIN_PER_PACKET_MAX_CONNS};
use crate::shared::SocketError;
use crate::socket::new_socket;

struct ProtoListener {
    endpoint: IpListenEndpoint,
    backlog: usize,
    pool: Vec<SocketHandle>,
    /// Handshakes in progress at `syn_backlog`, or no socket to arm within the engine's
    /// limits: SYNs to the port are dropped before smoltcp sees them (it would answer
    /// RST), as Linux without SYN cookies drops them.
    full: bool,
    /// When each pool socket in SYN-RECEIVED was first seen so (`syn_received_timeout`).
    syn_since: HashMap<SocketHandle, Instant>,
}

/// The hosted side of a [`TcpService`](crate::TcpService): the host and its listeners.
pub(crate) struct ProtoSide {
    host: Box<dyn ProtocolHost>,
    listeners: HashMap<u64, ProtoListener>,
    deadline: Option<Instant>,
    trace_at: Option<Instant>,
    /// `XWARP_PROTO_TRACE` is set.
    trace: bool,
}

impl ProtoSide {
    /// The hosted side of `host`.
    pub(crate) fn new(host: Box<dyn ProtocolHost>) -> ProtoSide {
        ProtoSide {
            host,
            listeners: HashMap::new(),
            deadline: None,
            trace_at: None,
            trace: std::env::var_os("XWARP_PROTO_TRACE").is_some(),
        }
    }

    /// The host, to serve its connections.
    pub(crate) fn host_mut(&mut self) -> &mut dyn ProtocolHost {
        &mut *self.host
    }

    /// The host's next deadline (from its last `poll`).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Poll the host and carry out its requests (before ingress).
    pub(crate) fn poll(&mut self, cx: &mut EngineCtx<'_>, iface: &mut Interface, now: Instant) {
        let mut ctl = ProtoCtl::new(cx.ids.clone());
        self.deadline = self.host.poll(now, &mut ctl);
        for req in ctl.into_requests() {
            match req {
                CtlReq::Connect {
                    id,
                    remote,
                    local_port,
                    deadline,
                } => self.connect(cx, iface, id, remote, local_port, deadline, now),
                CtlReq::Listen {
                    token,
                    local,
                    backlog,
                } => {
                    let r = self.listen(cx, token, local, backlog, now);
                    self.host.on_listen(token, r);
                }
                CtlReq::Unlisten { token } => {
                    if let Some(l) = self.listeners.remove(&token) {
                        for h in l.pool {
                            cx.table.socket_mut(h).abort();
                            cx.table.remove_socket(h);
                        }
                        cx.table.ports.unlisten(l.endpoint.port);
                    }
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn connect(
        &mut self,
        cx: &mut EngineCtx<'_>,
        iface: &mut Interface,
        id: ProtoConnId,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
        now: Instant,
    ) {
        let config = cx.config;
        let usable = !remote.ip().is_unspecified()
            && !remote.ip().is_multicast()
            && remote.port() != 0
            && match remote.ip() {
                std::net::IpAddr::V4(v4) => config.ipv4.is_some() && !v4.is_broadcast(),
                std::net::IpAddr::V6(_) => config.ipv6.is_some(),
            };
        if !usable {
            self.host
                .on_closed(id, now, Some(SocketError::InvalidAddress));
            return;
        }
        let ports = &mut cx.table.ports;
        let port = match local_port {
            Some(port) if ports.claim(port) => port,
            Some(_) => {
                self.host.on_closed(id, now, Some(SocketError::AddrInUse));
                return;
            }
            None => match ports.allocate() {
                Some(port) => port,
                None => {
                    self.host
                        .on_closed(id, now, Some(SocketError::AddrNotAvailable));
                    return;
                }
            },
        };
        let bytes = (config.rx_buffer + config.tx_buffer) as u64;
        if !cx.table.room_for(bytes, config) {
            cx.table.ports.release(port);
            cx.stats.refused_limit += 1;
            self.host.on_closed(id, now, Some(SocketError::NoBuffers));
            return;
        }
        let mut sock = new_socket(config, &config.tcp);
        if sock.connect(iface.context(), remote, port).is_err() {
            cx.table.ports.release(port);
            self.host
                .on_closed(id, now, Some(SocketError::AddrNotAvailable));
            return;
        }
        let handle = cx.table.add_socket(sock);
        cx.table.insert(
            id,
            Conn {
                tcp: ConnTcp::new(
                    handle,
                    Some(port),
                    Some(deadline),
                    State::SynSent,
                    ConnExtra::default(),
                )
                .with_flow(flow_of(port, remote)),
                sink: Sink::Host(HostEnd::default()),
            },
        );
    }

    fn listen(
        &mut self,
        cx: &mut EngineCtx<'_>,
        token: u64,
        local: SocketAddr,
        backlog: usize,
        now: Instant,
    ) -> Result<SocketAddr, SocketError> {
        if !local.ip().is_unspecified() {
            let ours = match local.ip() {
                std::net::IpAddr::V4(v4) => cx.config.ipv4.is_some_and(|(a, _)| a == v4),
                std::net::IpAddr::V6(v6) => cx.config.ipv6.is_some_and(|(a, _)| a == v6),
            };
            if !ours {
                return Err(SocketError::AddrNotAvailable);
            }
        }
        if local.port() == 0 || !cx.table.ports.listen(local.port(), token | (1 << 63)) {
            return Err(SocketError::AddrInUse);
        }
        let endpoint = IpListenEndpoint {
            addr: (!local.ip().is_unspecified()).then(|| IpAddress::from(local.ip())),
            port: local.port(),
        };
        self.listeners.insert(
            token,
            ProtoListener {
                endpoint,
                backlog: backlog.clamp(1, 256),
                pool: Vec::new(),
                full: false,
                syn_since: HashMap::new(),
            },
        );
        self.arm(cx, token, now);
        Ok(local)
    }

    /// Promote established sockets of a listener pool and keep it armed.
    fn arm(
        &mut self,
        cx: &mut EngineCtx<'_>,
        token: u64,
        now: Instant,
    ) -> Vec<(u64, SocketHandle)> {
        let mut promoted = Vec::new();
        let Some(l) = self.listeners.get_mut(&token) else {
            return promoted;
        };
        let table: &mut ConnTable = cx.table;
        let mut i = 0;
        while i < l.pool.len() {
            let h = l.pool[i];
            match table.socket(h).state() {
                State::Listen => i += 1,
                State::SynReceived => {
                    let since = *l.syn_since.entry(h).or_insert(now);
                    if now.saturating_duration_since(since) >= cx.config.syn_received_timeout {
                        // A handshake never finished (a spoofed SYN): free its slot.
                        l.syn_since.remove(&h);
                        l.pool.swap_remove(i);
                        table.socket_mut(h).abort();
                        table.remove_socket(h);
                        cx.stats.syn_received_expired += 1;
                    } else {
                        i += 1;
                    }
                }
                State::Closed => {
                    l.syn_since.remove(&h);
                    l.pool.swap_remove(i);
                    table.remove_socket(h);
                }
                _ => {
                    l.syn_since.remove(&h);
                    l.pool.swap_remove(i);
                    promoted.push((token, h));
                }
            }
        }
        let armed = l
            .pool
            .iter()
            .filter(|&&h| table.socket(h).state() == State::Listen)
            .count();
        // Handshakes in progress are bounded by `syn_backlog` (the host takes established
        // connections at once, so its own queue bounds the rest).
        let in_progress = l.pool.len() - armed;
        let room = cx.config.syn_backlog.saturating_sub(in_progress);
        let want = l.backlog.min(cx.config.armed_listeners.max(1)).min(room);
        let bytes = (cx.config.rx_buffer + cx.config.tx_buffer) as u64;
        for _ in armed..want {
            if !table.room_for(bytes, cx.config) {
                break;
            }
            let mut s = new_socket(cx.config, &cx.config.tcp);
            if s.listen(l.endpoint).is_err() {
                break;
            }
            l.pool.push(table.add_socket(s));
        }
        let armed_now = l.pool.len() - in_progress;
        l.full = armed_now == 0;
        promoted
    }

    /// Add the ports of the host's listeners that drop SYNs now (see `ProtoListener::full`).
    pub(crate) fn full_ports_into(&self, ports: &mut Vec<u16>) {
        ports.extend(
            self.listeners
                .values()
                .filter(|l| l.full)
                .map(|l| l.endpoint.port),
        );
    }

    /// Handshakes in progress in the host's listener pools.
    pub(crate) fn half_open(&self, table: &ConnTable) -> usize {
        self.listeners
            .values()
            .flat_map(|l| l.pool.iter())
            .filter(|&&h| table.socket(h).state() != State::Listen)
            .count()
    }

    /// Between ingress packets: re-arm hosted listeners (a burst of SYNs must not find
    /// the pool empty), hand established handshakes to the host and, for up to
    /// [`DRAIN_PER_PACKET_MAX_CONNS`] connections, hand received bytes to the host at
    /// once. Draining per packet keeps the receive window open through a long ingress
    /// batch: a batch larger than the receive buffer would otherwise advertise a zero
    /// window, and a lost window update then stalls the sender until smoltcp's
    /// zero-window probe (backing off to seconds) gets through.
    pub(crate) fn between_packets(&mut self, cx: &mut EngineCtx<'_>, now: Instant) {
        if !self.listeners.is_empty() {
            self.accept(cx, now);
        }
        if cx.table.len(Kind::Hosted) <= DRAIN_PER_PACKET_MAX_CONNS {
            cx.table.drain_hosted(&mut *self.host, now, cx.stats);
        }
    }

    /// Hand connections established on the host's listeners to it. Returns whether
    /// any arrived.
    pub(crate) fn accept(&mut self, cx: &mut EngineCtx<'_>, now: Instant) -> bool {
        let mut moved = false;
        let tokens: Vec<u64> = self.listeners.keys().copied().collect();
        for token in tokens {
            for (token, h) in self.arm(cx, token, now) {
                let s = cx.table.socket(h);
                let (Some(local), Some(remote)) = (s.local_endpoint(), s.remote_endpoint()) else {
                    cx.table.socket_mut(h).abort();
                    continue;
                };
                let state = s.state();
                let id = cx.ids.fetch_add(1, Ordering::Relaxed);
                let addrs = (SocketAddr::from(local), SocketAddr::from(remote));
                cx.table.insert(
                    id,
                    Conn {
                        tcp: ConnTcp::new(h, None, None, state, ConnExtra::default())
                            .with_flow(flow_of(local.port, addrs.1)),
                        sink: Sink::Host(HostEnd {
                            addrs: Some(addrs),
                            fin_reported: false,
                        }),
                    },
                );
                cx.stats.established += 1;
                cx.stats.accepted += 1;
                self.host.on_accepted(token, id, addrs.0, addrs.1, now);
                moved = true;
            }
        }
        moved
    }

    /// `XWARP_PROTO_TRACE`: hosted connection states to the log once a second.
    pub(crate) fn trace(&mut self, cx: &EngineCtx<'_>, now: Instant) {
        if self.trace
            && self
                .trace_at
                .is_none_or(|t| now >= t + Duration::from_secs(1))
        {
            self.trace_at = Some(now);
            cx.table.dump_hosted(now, cx.config);
        }
    }
}
