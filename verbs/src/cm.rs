//! The connection manager's passive side: [`Listener`] and [`ConnRequest`] (after
//! rdma_cm's listen / get_request / accept / reject).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use xwarp_ddp::mpa::RtrType;
use xwarp_stack::Readiness;

pub use crate::cm_limits::{
    CmStats, ListenConfig, DEFAULT_ACCEPT_TIMEOUT, DEFAULT_MAX_NEGOTIATING, DEFAULT_REQUEST_TIMEOUT,
};
use crate::context::Device;
use crate::engine::cmd::{Cmd, RequestMsg};
use crate::qp::QueuePair;

impl Device {
    /// Listen for connection requests on `addr` (the port must be non-zero), holding at
    /// most `backlog` of them; the other limits are [`ListenConfig::new`]'s defaults.
    pub fn listen(&self, addr: SocketAddr, backlog: usize) -> io::Result<Listener> {
        self.listen_with(addr, ListenConfig::new(backlog))
    }

    /// Listen on `addr` with the limits in `config`.
    pub fn listen_with(&self, addr: SocketAddr, config: ListenConfig) -> io::Result<Listener> {
        let mut config = config;
        config.backlog = config.backlog.max(1);
        config.max_negotiating = config.max_negotiating.max(1);
        let token = u64::from(self.inner.next_token.fetch_add(1, Ordering::Relaxed));
        // Bounded: the engine never holds more than `backlog` live requests, and it
        // purges dead ones (through its own receiver) when the channel is full.
        let (tx, rx) = crossbeam_channel::bounded(config.backlog);
        let ready = Arc::new(Readiness::new()?);
        let r = self.inner.call(|reply| Cmd::Listen {
            token,
            addr,
            config,
            requests: tx,
            requests_rx: rx.clone(),
            ready: ready.clone(),
            reply,
        })?;
        r.map_err(|e| e.to_io())?;
        Ok(Listener {
            dev: self.clone(),
            token,
            rx,
            ready,
            addr,
        })
    }

    /// The connection manager's counters (connections, pending requests, refusals).
    pub fn cm_stats(&self) -> io::Result<CmStats> {
        self.inner.call(|reply| Cmd::CmStats { reply })
    }

    /// Start a graceful disconnect ([`QueuePair::disconnect`](crate::QueuePair::disconnect))
    /// of every QP of this engine whose connection is still open or being set up; returns
    /// how many. For a process about to exit: its engine, and with it every TCP
    /// connection, ends with the process, so connections left open would never tell the
    /// peer (no FIN, no RST). Wait for [`CmStats::connections`] to reach 0 afterwards.
    pub fn disconnect_all(&self) -> io::Result<usize> {
        self.inner.call(|reply| Cmd::DisconnectAll { reply })
    }
}

/// A listening endpoint of the connection manager.
pub struct Listener {
    dev: Device,
    token: u64,
    rx: Receiver<RequestMsg>,
    ready: Arc<Readiness>,
    addr: SocketAddr,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Listener {
    /// The listening address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Wait up to `timeout` for the next connection request.
    pub fn get_request(&self, timeout: Duration) -> io::Result<ConnRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(m) = self.rx.try_recv() {
                return Ok(ConnRequest {
                    dev: self.dev.clone(),
                    conn: m.conn,
                    peer: m.peer,
                    private_data: m.req.private_data,
                    peer_ird: m.req.peer_ird,
                    peer_ord: m.req.peer_ord,
                    crc: m.req.crc,
                    markers: m.req.markers,
                    revision: m.req.revision,
                    p2p: m.req.rtr,
                    answered: false,
                });
            }
            if !self.ready.wait(Some(deadline))? && self.rx.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no connection request",
                ));
            }
        }
    }
}

impl AsRawFd for Listener {
    /// Readable when a request is queued.
    fn as_raw_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.dev.inner.send(Cmd::Unlisten { token: self.token });
    }
}

/// An incoming connection request (MPA Request received). Answer with
/// [`ConnRequest::accept`] or [`ConnRequest::reject`]; dropping it rejects.
pub struct ConnRequest {
    dev: Device,
    conn: u64,
    /// The Initiator's address.
    pub peer: SocketAddr,
    /// The Initiator's private data.
    pub private_data: Vec<u8>,
    /// The Initiator's IRD (MPA v2).
    pub peer_ird: Option<u16>,
    /// The Initiator's ORD (MPA v2).
    pub peer_ord: Option<u16>,
    /// CRC requested.
    pub crc: bool,
    /// Markers requested.
    pub markers: bool,
    /// MPA revision of the Request.
    pub revision: u8,
    /// P2P: the RTR type that will be used.
    pub p2p: Option<RtrType>,
    answered: bool,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest")
            .field("peer", &self.peer)
            .field("private_data", &self.private_data)
            .field("peer_ird", &self.peer_ird)
            .field("peer_ord", &self.peer_ord)
            .finish()
    }
}

impl ConnRequest {
    /// Accept on `qp` (not yet connected) with our private data; `Established` follows
    /// on the QP's events. Returns once the engine bound the request to the QP.
    ///
    /// Errors (as `rdma_accept`), reported here and never as an event of `qp`:
    /// `InvalidInput` if `qp` was already used (connected, connecting, accepted, or in
    /// ERROR; a reset with [`QueuePair::modify`] to `Idle` makes it unused again) — the
    /// request's connection is then dropped (reset); `ConnectionAborted` if
    /// the Initiator's connection went away before the answer.
    pub fn accept(mut self, qp: &QueuePair, private_data: &[u8]) -> io::Result<()> {
        self.answered = true;
        let (conn, qpn) = (self.conn, qp.qpn);
        let private_data = private_data.to_vec();
        self.dev.inner.call(|reply| Cmd::Accept {
            conn,
            qpn,
            private_data,
            reply,
        })?
    }

    /// Reject with private data (MPA Reply with R=1), then close.
    pub fn reject(mut self, private_data: &[u8]) -> io::Result<()> {
        self.answered = true;
        self.dev.inner.send(Cmd::Reject {
            conn: self.conn,
            private_data: private_data.to_vec(),
        })
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.dev.inner.send(Cmd::Reject {
                conn: self.conn,
                private_data: Vec::new(),
            });
        }
    }
}
