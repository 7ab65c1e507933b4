//! The engine loop: one thread per engine, optionally pinned to a core, that drives a
//! [`Backend`] and a [`Service`] (the TCP stack and the protocol layers above it) with a
//! spin-then-sleep policy.
//!
//! Contract (implementations fill in the rest of this module):
//! * [`Service::poll`] is called in a loop on the engine thread. It receives frames from
//!   the backend, runs TCP and upper layers, serves application requests and transmits.
//! * When `poll` reports no work for `spin_budget`, the engine calls
//!   [`Backend::prepare_sleep`] and sleeps in `poll(2)` on the backend's
//!   [`Backend::wait_fd`] and the engine's [`Doorbell`] until a frame arrives, an
//!   application rings the doorbell, or the service's next deadline passes.
//! * Applications never touch engine state: they push requests into lock-free queues owned
//!   by the service and ring the [`Doorbell`].

use crate::backend::Backend;
use std::time::Instant;

/// What one [`Service::poll`] iteration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PollOutcome {
    /// `true` if any frame, request or timer was processed (the engine keeps spinning).
    pub busy: bool,
    /// The earliest time the service needs to be polled again even if nothing arrives
    /// (TCP retransmission, delayed ACK, MPA timeouts). `None` means no timer is pending.
    pub next_deadline: Option<Instant>,
}

/// The work an engine runs on each iteration (implemented by `xwarp-stack`).
pub trait Service<B: Backend>: Send {
    /// Run one iteration at time `now`.
    fn poll(&mut self, backend: &mut B, now: Instant) -> PollOutcome;
}
