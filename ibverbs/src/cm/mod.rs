//! librdmacm on xwarp: event channels, `rdma_cm_id`s and their state machine, address and
//! route resolution against the engine's own address, listen/connect/accept/reject/
//! disconnect with private data onto `xwarp_verbs`' connection manager, and the pump
//! thread that turns the engine's reports into rdma_cm events. The C entry points are in
//! `crate::exports_cm`; `README.md` ("librdmacm") maps every call and event.
//!
//! * [`state`] — the id state machine (sans-IO).
//! * [`channel`] — the event queue and the event channel object.
//! * [`id`] — ids and what each call does.
//! * [`pump`] — engine reports → events.
//! * [`addr`] — socket addresses, reachability through the engine.
//! * [`info`] — `rdma_getaddrinfo`.
//! * [`linger`] — the exit hook that lets closing connections finish.
//! * `link` — what the CM takes from the rest of the library (context, engine, QPs).

pub mod addr;
pub mod channel;
pub(crate) mod id;
pub mod info;
pub mod linger;
pub(crate) mod link;
pub(crate) mod pump;
pub mod state;
