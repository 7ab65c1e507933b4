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
    /// `ListenOverflows`); the client retransmits them.
    pub syn_dropped_backlog: u64,
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
    /// The last published counters.
    pub(crate) fn load(&self) -> StackStats {
        self.inner.load()
    }

    /// Publish `s` (engine thread).
    pub(crate) fn store(&self, s: &StackStats) {
        self.inner.store(s);
    }
}
