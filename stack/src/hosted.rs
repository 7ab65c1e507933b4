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

use crate::conn::{Conn, ConnExtra, ConnTable, ConnTcp, EngineCtx, HostEnd, Kind, Sink};
use crate::proto::{CtlReq, ProtoConnId, ProtoCtl, ProtocolHost, DRAIN_PER_PACKET_MAX_CONNS};
use crate::shared::SocketError;
use crate::socket::new_socket;

struct ProtoListener {
    endpoint: IpListenEndpoint,
    backlog: usize,
    pool: Vec<SocketHandle>,
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
                    let r = self.listen(cx, token, local, backlog);
                    self.host.on_listen(token, r);
                }
                CtlReq::Unlisten { token } => {
                    if let Some(l) = self.listeners.remove(&token) {
                        for h in l.pool {
                            cx.table.socket_mut(h).abort();
                            cx.table.sockets.remove(h);
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
        let mut sock = new_socket(config, &config.tcp);
        if sock.connect(iface.context(), remote, port).is_err() {
            ports.release(port);
            self.host
                .on_closed(id, now, Some(SocketError::AddrNotAvailable));
            return;
        }
        let handle = cx.table.sockets.add(sock);
        cx.table.insert(
            id,
            Conn {
                tcp: ConnTcp::new(
                    handle,
                    Some(port),
                    Some(deadline),
                    State::SynSent,
                    ConnExtra::default(),
                ),
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
            },
        );
        self.arm(cx, token);
        Ok(local)
    }

    /// Promote established sockets of a listener pool and keep it armed.
    fn arm(&mut self, cx: &mut EngineCtx<'_>, token: u64) -> Vec<(u64, SocketHandle)> {
        let mut promoted = Vec::new();
        let Some(l) = self.listeners.get_mut(&token) else {
            return promoted;
        };
        let table: &mut ConnTable = cx.table;
        let mut i = 0;
        while i < l.pool.len() {
            let h = l.pool[i];
            match table.socket(h).state() {
                State::Listen | State::SynReceived => i += 1,
                State::Closed => {
                    l.pool.swap_remove(i);
                    table.sockets.remove(h);
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
            .filter(|&&h| table.socket(h).state() == State::Listen)
            .count();
        let want = l.backlog.min(cx.config.armed_listeners.max(1));
        for _ in armed..want {
            let mut s = new_socket(cx.config, &cx.config.tcp);
            if s.listen(l.endpoint).is_err() {
                break;
            }
            l.pool.push(table.sockets.add(s));
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
            for (token, h) in self.arm(cx, token) {
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
                        tcp: ConnTcp::new(h, None, None, state, ConnExtra::default()),
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

    /// `XWARP_PROTO_TRACE`: hosted connection states to stderr once a second.
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
