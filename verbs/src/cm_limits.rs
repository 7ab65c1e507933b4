//! The connection manager's limits on what listeners hold ([`ListenConfig`]) and its
//! counters ([`CmStats`]); used by [`crate::cm`] and the engine host.

use std::time::Duration;

/// Default [`ListenConfig::max_negotiating`].
pub const DEFAULT_MAX_NEGOTIATING: usize = 256;
/// Default [`ListenConfig::request_timeout`]: siw's `MPAREP_TIMEOUT`, how long siw waits
/// for the Request after accepting TCP (docs/siw.md §4.1, docs/mpa.md §1.5).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default [`ListenConfig::accept_timeout`]: siw's `MPAREQ_TIMEOUT`, how long a siw
/// Initiator waits for the Reply (docs/siw.md §4.1); a request still unanswered after
/// that is of no use to such a peer.
pub const DEFAULT_ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The limits of one listener: what a peer that connects and never finishes (or a flood
/// of Requests nobody accepts) can hold of the engine.
///
/// * [`backlog`](Self::backlog): connection requests held for the application (MPA
///   Request received, not yet accepted or rejected, whether or not
///   [`Listener::get_request`](crate::Listener::get_request) took them). A Request beyond it is refused at once
///   the way a ULP rejects: an MPA Reply with R=1 and no private data, then TCP close
///   (docs/mpa.md §1.5 "Reject", the bytes of `rdma_reject` in docs/siw.md §4.3), so a
///   siw or rdma_cm Initiator sees "rejected" rather than waiting for its 10 s timeout.
///   It is also the TCP listen backlog (handshakes in progress).
/// * [`max_negotiating`](Self::max_negotiating): TCP connections accepted whose MPA
///   Request is not complete yet; one beyond it is reset.
/// * [`request_timeout`](Self::request_timeout): a connection whose whole Request has
///   not arrived by then is reset (siw drops it the same way, docs/siw.md §4.3).
/// * [`accept_timeout`](Self::accept_timeout): a request the application neither
///   accepted nor rejected by then is rejected (Reply with R=1, close) and its
///   connection and buffers are released; a later `accept` of it fails with
///   `ConnectionAborted`.
///
/// Each held or negotiating connection costs its TCP socket's buffers (the stack's
/// configuration) plus at most 4 KiB of Request bytes and one parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenConfig {
    /// Most requests held for the application (0 counts as 1).
    pub backlog: usize,
    /// Most connections still reading their MPA Request (0 counts as 1). Default
    /// [`DEFAULT_MAX_NEGOTIATING`].
    pub max_negotiating: usize,
    /// How long a connected peer has to send its whole MPA Request. Default
    /// [`DEFAULT_REQUEST_TIMEOUT`].
    pub request_timeout: Duration,
    /// How long a received request waits for `accept` or `reject`. Default
    /// [`DEFAULT_ACCEPT_TIMEOUT`].
    pub accept_timeout: Duration,
}

impl ListenConfig {
    /// The defaults with `backlog`.
    pub fn new(backlog: usize) -> ListenConfig {
        ListenConfig {
            backlog,
            max_negotiating: DEFAULT_MAX_NEGOTIATING,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            accept_timeout: DEFAULT_ACCEPT_TIMEOUT,
        }
    }
}

/// Connection-manager counters of one device ([`Device::cm_stats`](crate::Device::cm_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    /// TCP connections the verbs host owns (bound to QPs, pending, or closing detached).
    pub connections: usize,
    /// Accepted connections still reading their MPA Request.
    pub negotiating: usize,
    /// Requests held for the application (received, not yet answered).
    pub pending: usize,
    /// Requests refused because their listener already held `backlog` of them.
    pub refused_backlog: u64,
    /// Connections reset because `max_negotiating` were already reading a Request.
    pub refused_negotiating: u64,
    /// Requests rejected because the application did not answer in `accept_timeout`.
    pub accept_timeouts: u64,
    /// Connections reset because their Request was not complete in `request_timeout`.
    pub request_timeouts: u64,
}
