//! The `rdma_cm_id` state machine (sans-IO): which call is allowed in which state, and what
//! an engine CM event does to the state. The rules are librdmacm's over the kernel's
//! `drivers/infiniband/core/cma.c` for iWARP ids (`docs/protocols.md` §5.1), reduced to
//! what an id on an xwarp engine can be in.

use core::ffi::c_int;

/// Where an id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdState {
    /// Created, nothing bound.
    Idle,
    /// `rdma_bind_addr` done.
    AddrBound,
    /// `rdma_resolve_addr` done (ADDR_RESOLVED queued).
    AddrResolved,
    /// `rdma_resolve_route` done (ROUTE_RESOLVED queued).
    RouteResolved,
    /// `rdma_listen` done.
    Listening,
    /// A passive id whose CONNECT_REQUEST is not answered yet.
    ConnectRequest,
    /// Active: `rdma_connect` issued, no answer yet.
    Connecting,
    /// Passive: `rdma_accept` issued, ESTABLISHED not yet seen.
    Accepting,
    /// ESTABLISHED delivered.
    Connected,
    /// `rdma_disconnect` issued on a connected id, DISCONNECTED not yet seen.
    Disconnecting,
    /// The connection is over (DISCONNECTED, REJECTED, a connect error, or rejected by
    /// us); only `rdma_disconnect` (a no-op) and destroy remain.
    Closed,
}

/// The calls whose legality depends on the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `rdma_bind_addr`.
    Bind,
    /// `rdma_resolve_addr`.
    ResolveAddr,
    /// `rdma_resolve_route`.
    ResolveRoute,
    /// `rdma_listen`.
    Listen,
    /// `rdma_connect`.
    Connect,
    /// `rdma_accept`.
    Accept,
    /// `rdma_reject`.
    Reject,
    /// `rdma_disconnect`.
    Disconnect,
}

/// What [`step`] says about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Do it; the id is then in this state.
    Go(IdState),
    /// Nothing to do, return success (a second `rdma_disconnect`).
    Noop,
    /// Refuse with this errno (the id is unchanged).
    Refuse(c_int),
}

/// The verdict on `op` in state `s`. Like the kernel's `cma_comp_exch` checks: a call out
/// of order is `EINVAL`; `rdma_resolve_addr` and `rdma_listen` on an unbound id bind it
/// first (to the wildcard address); `rdma_disconnect` after the connection ended returns 0.
pub fn step(s: IdState, op: Op) -> Verdict {
    use IdState::*;
    use Verdict::*;
    match (op, s) {
        (Op::Bind, Idle) => Go(AddrBound),
        (Op::ResolveAddr, Idle | AddrBound) => Go(AddrResolved),
        (Op::ResolveRoute, AddrResolved) => Go(RouteResolved),
        (Op::Listen, Idle | AddrBound) => Go(Listening),
        (Op::Connect, RouteResolved) => Go(Connecting),
        (Op::Accept, ConnectRequest) => Go(Accepting),
        (Op::Reject, ConnectRequest) => Go(Closed),
        (Op::Disconnect, Connected | Accepting | Connecting) => Go(Disconnecting),
        (Op::Disconnect, Disconnecting | Closed) => Noop,
        _ => Refuse(libc::EINVAL),
    }
}

/// An engine CM event of the id's QP, reduced to what matters for the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineEvent {
    /// The connection is up.
    Established,
    /// The peer rejected us, or connecting failed.
    ConnectFailed,
    /// The connection closed.
    Disconnected,
}

/// The state after `e`, and whether the event is reported to the program. An ESTABLISHED
/// is reported only while connecting/accepting; a connect failure only while connecting
/// (it ends the id); DISCONNECTED only for an id that was connected (rdma_cm reports no
/// DISCONNECTED for a connection that never came up) and only once.
pub fn on_event(s: IdState, e: EngineEvent) -> (IdState, bool) {
    use IdState::*;
    match (e, s) {
        (EngineEvent::Established, Connecting | Accepting) => (Connected, true),
        (EngineEvent::ConnectFailed, Connecting | Accepting) => (Closed, true),
        (EngineEvent::Disconnected, Connected | Disconnecting) => (Closed, true),
        // A disconnect requested before ESTABLISHED arrived: the connection still ends.
        (EngineEvent::Established, Disconnecting) => (Disconnecting, false),
        (EngineEvent::ConnectFailed, Disconnecting) => (Closed, false),
        _ => (s, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use IdState::*;

    #[test]
    fn active_side_in_order() {
        let mut s = Idle;
        for (op, want) in [
            (Op::ResolveAddr, AddrResolved),
            (Op::ResolveRoute, RouteResolved),
            (Op::Connect, Connecting),
        ] {
            match step(s, op) {
                Verdict::Go(n) => s = n,
                v => panic!("{op:?} in {s:?}: {v:?}"),
            }
            assert_eq!(s, want);
        }
        assert_eq!(on_event(s, EngineEvent::Established), (Connected, true));
        assert_eq!(step(Connected, Op::Disconnect), Verdict::Go(Disconnecting));
        assert_eq!(
            on_event(Disconnecting, EngineEvent::Disconnected),
            (Closed, true)
        );
        assert_eq!(step(Closed, Op::Disconnect), Verdict::Noop);
    }

    #[test]
    fn passive_side_in_order() {
        assert_eq!(step(Idle, Op::Bind), Verdict::Go(AddrBound));
        assert_eq!(step(AddrBound, Op::Listen), Verdict::Go(Listening));
        assert_eq!(step(Idle, Op::Listen), Verdict::Go(Listening));
        assert_eq!(step(ConnectRequest, Op::Accept), Verdict::Go(Accepting));
        assert_eq!(
            on_event(Accepting, EngineEvent::Established),
            (Connected, true)
        );
        // The peer disconnects: reported once; our later rdma_disconnect is a no-op.
        assert_eq!(
            on_event(Connected, EngineEvent::Disconnected),
            (Closed, true)
        );
        assert_eq!(on_event(Closed, EngineEvent::Disconnected), (Closed, false));
        assert_eq!(step(Closed, Op::Disconnect), Verdict::Noop);
    }

    #[test]
    fn calls_out_of_order_are_einval_and_change_nothing() {
        let e = Verdict::Refuse(libc::EINVAL);
        assert_eq!(step(AddrBound, Op::Bind), e);
        assert_eq!(step(AddrResolved, Op::Bind), e);
        assert_eq!(step(Idle, Op::ResolveRoute), e);
        assert_eq!(step(AddrResolved, Op::Connect), e);
        assert_eq!(step(Listening, Op::Connect), e);
        assert_eq!(step(Listening, Op::Accept), e);
        assert_eq!(step(Connected, Op::Accept), e);
        assert_eq!(step(Accepting, Op::Reject), e);
        assert_eq!(step(Idle, Op::Disconnect), e);
        assert_eq!(step(Listening, Op::Disconnect), e);
        assert_eq!(step(Connecting, Op::Listen), e);
        assert_eq!(step(RouteResolved, Op::ResolveAddr), e);
    }

    #[test]
    fn rejected_ends_the_id_and_events_after_it_are_silent() {
        assert_eq!(step(ConnectRequest, Op::Reject), Verdict::Go(Closed));
        assert_eq!(
            on_event(Connecting, EngineEvent::ConnectFailed),
            (Closed, true)
        );
        // The engine's Disconnected after a failed connect is not a DISCONNECTED.
        assert_eq!(on_event(Closed, EngineEvent::Disconnected), (Closed, false));
        assert_eq!(
            on_event(Connecting, EngineEvent::Disconnected),
            (Connecting, false)
        );
        // Late events on ids that are not connecting change nothing.
        assert_eq!(
            on_event(Listening, EngineEvent::Established),
            (Listening, false)
        );
        assert_eq!(
            on_event(Connected, EngineEvent::Established),
            (Connected, false)
        );
    }

    #[test]
    fn disconnect_before_established_still_ends_the_connection() {
        assert_eq!(step(Connecting, Op::Disconnect), Verdict::Go(Disconnecting));
        assert_eq!(
            on_event(Disconnecting, EngineEvent::Established),
            (Disconnecting, false)
        );
        assert_eq!(
            on_event(Disconnecting, EngineEvent::Disconnected),
            (Closed, true)
        );
    }
}
