//! The engine's counters ([`StackStats`]) and the cell that publishes them to other
//! threads.

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
    /// `ListenOverflows`), its handshakes in progress were at `syn_backlog`, or no socket
    /// could be armed within `max_sockets`/`socket_buffer_budget`; the client retransmits
    /// them.
    pub syn_dropped_backlog: u64,
    /// Connects refused with `SocketError::NoBuffers` (`max_sockets` or
    /// `socket_buffer_budget` reached).
    pub refused_limit: u64,
    /// Flows the ACK watch evicted at `max_tracked_flows`.
    pub flows_evicted: u64,
    /// Handshakes dropped after `syn_received_timeout` in SYN-RECEIVED.
    pub syn_received_expired: u64,
}

/// What an engine holds at one moment ([`TcpService::usage`](crate::TcpService::usage)),
/// to check it against the limits of [`StackConfig`](crate::StackConfig).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineUsage {
    /// smoltcp sockets alive (bounded by `max_sockets`).
    pub sockets: usize,
    /// Receive plus send buffer bytes of those sockets (bounded by `socket_buffer_budget`).
    pub socket_buffer_bytes: u64,
    /// Connection records (application and hosted, any state).
    pub connections: usize,
    /// Handshakes in progress in listener pools (bounded by `syn_backlog` per listener).
    pub half_open: usize,
    /// Flows the retransmission-floor ACK watch tracks (bounded by `max_tracked_flows`).
    pub tracked_flows: usize,
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
    pub(crate) struct Cell([AtomicU64; 11]);

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
                s.refused_limit,
                s.flows_evicted,
                s.syn_received_expired,
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
                refused_limit: g(8),
                flows_evicted: g(9),
                syn_received_expired: g(10),
            }
        }
    }
}

impl StatsCell {
    /// The last published counters.
    pub(crate) fn load(&self) -> StackStats {
        self.inner.load()
    }

    /// Publish `s` (engine thread).
    pub(crate) fn store(&self, s: &StackStats) {
        self.inner.store(s);
    }
}

/// How often the TCP service publishes its counters and tables for `xwarp stat`.
pub(crate) const TELEMETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The TCP service's side of the engine's telemetry segment (`xwarp-telemetry`): its
/// counters, the connection table and the protocol host's QP table, published every
/// [`TELEMETRY_EVERY`] from the engine thread.
pub(crate) struct Telemetry {
    pub(crate) seg: std::sync::Arc<xwarp_telemetry::Segment>,
    /// When to publish next.
    pub(crate) next: std::time::Instant,
    /// Something happened since the last publication (the engine must wake to publish
    /// it even if nothing else is due).
    pub(crate) dirty: bool,
    pub(crate) conns: Vec<xwarp_telemetry::ConnRecord>,
    pub(crate) qps: Vec<xwarp_telemetry::QpRecord>,
}

impl Telemetry {
    /// Publishing to `seg`, first at once.
    pub(crate) fn new(seg: std::sync::Arc<xwarp_telemetry::Segment>) -> Telemetry {
        Telemetry {
            seg,
            next: std::time::Instant::now(),
            dirty: true,
            conns: Vec::new(),
            qps: Vec::new(),
        }
    }
}
