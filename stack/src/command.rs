//! The command queue from applications to the engine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::shared::{ListenerShared, SocketShared};

/// A connection handed to the application by `accept`: its shared state and the
/// application halves of its rings.
#[derive(Debug)]
pub struct AcceptedConn {
    pub(crate) shared: Arc<SocketShared>,
    pub(crate) rx: rtrb::Consumer<u8>,
    pub(crate) tx: rtrb::Producer<u8>,
}

/// A request from an application thread to the engine.
#[derive(Debug)]
pub(crate) enum Command {
    /// Open a connection. The engine owns `rx` (producer) and `tx` (consumer).
    Connect {
        shared: Arc<SocketShared>,
        rx: rtrb::Producer<u8>,
        tx: rtrb::Consumer<u8>,
        remote: SocketAddr,
        local_port: Option<u16>,
        deadline: Instant,
    },
    /// Listen on `local` with an accept queue of `backlog`.
    Listen {
        shared: Arc<ListenerShared>,
        accept: crossbeam_channel::Sender<AcceptedConn>,
        local: SocketAddr,
        backlog: usize,
    },
    /// Stop listening; handshakes in progress are reset.
    Unlisten { id: u64 },
    /// The app took a connection from the accept queue: re-arm the port.
    Rearm { id: u64 },
    /// The app queued tx data or freed rx ring space.
    Dirty { id: u64 },
    /// Send FIN after the queued data (`shutdown(Write)`).
    ShutdownWrite { id: u64 },
    /// The application dropped its handle: drain queued data, FIN, then forget.
    Close { id: u64 },
    /// Reset the connection now.
    Abort { id: u64 },
    /// Change `TCP_NODELAY`.
    SetNodelay { id: u64, nodelay: bool },
}
