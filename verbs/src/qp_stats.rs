//! Per-QP statistics: [`QpStatsSnapshot`], what
//! [`QueuePair::stats`](crate::QueuePair::stats) and
//! [`Context::qp_stats`](crate::Context::qp_stats) return and what the engine host lists
//! on its own thread (the counters themselves are kept by the protocol core,
//! [`QpCounters`]).

use std::net::SocketAddr;

use xwarp_rdmap::{MpaResult, QpCounters};

use crate::qp_state::QpState;

/// A statistics snapshot of one QP, taken on the engine thread
/// ([`QueuePair::stats`](crate::QueuePair::stats),
/// [`Context::qp_stats`](crate::Context::qp_stats)). A plain `Copy` value.
///
/// The counters are kept for the QP's whole life: a reset
/// ([`QueuePair::modify`](crate::QueuePair::modify) to `Idle`) keeps them (the last
/// Terminate codes included); only [`Self::mpa`] belongs to the current connection. What each counter counts: [`QpCounters`]. Work the engine
/// finishes without the connection is counted too: work flushed before the connection
/// existed or after it was gone, a post the connection refused, and Local Invalidate
/// (a send work request, counted in `send_wrs_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpStatsSnapshot {
    /// QP number.
    pub qp_num: u32,
    /// The QP's state (as [`QueuePair::state`](crate::QueuePair::state) reports it).
    pub state: QpState,
    /// Our TCP address, once the connection exists.
    pub local_addr: Option<SocketAddr>,
    /// The peer's TCP address, once the connection exists.
    pub peer_addr: Option<SocketAddr>,
    /// The counters (with `counters.mpa`, the current connection's MPA result).
    pub counters: QpCounters,
}

impl QpStatsSnapshot {
    /// What MPA negotiated for the current connection (`None` before negotiation
    /// finished, and after a reset).
    pub fn mpa(&self) -> Option<MpaResult> {
        self.counters.mpa
    }
}
