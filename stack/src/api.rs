//! The application side: a cloneable [`StackHandle`] to open sockets, and the socket
//! handles [`Stream`] and [`ListenSocket`] that move data through lock-free rings.
//!
//! Every call here is non-blocking; blocking wrappers (spin, then sleep on the readiness
//! descriptor) live in `xwarp::net`.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use xwarp_poll_driver::engine::InlineDriver;

use crate::command::{AcceptedConn, Command};
use crate::config::{KeepAlive, SocketOptions, StackConfig};
use crate::shared::{
    ListenerShared, Phase, SocketError, SocketShared, TcpInfo, WANT_READ, WANT_WRITE,
};
use crate::stats::{StackStats, StatsCell};

/// Wakes the engine after an application queued work (the engine's doorbell).
pub type Kick = Arc<dyn Fn() + Send + Sync>;

/// A cloneable handle applications use to reach one TCP engine.
#[derive(Clone)]
pub struct StackHandle {
    cmds: Sender<Command>,
    next_id: Arc<AtomicU64>,
    kick: Arc<OnceLock<Kick>>,
    /// The engine's inline driver when it runs in inline mode (set by the builder).
    inline: Arc<OnceLock<InlineDriver>>,
    config: Arc<StackConfig>,
    stats: Arc<StatsCell>,
}

impl std::fmt::Debug for StackHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackHandle").finish_non_exhaustive()
    }
}

impl StackHandle {
    pub(crate) fn new(
        cmds: Sender<Command>,
        next_id: Arc<AtomicU64>,
        config: Arc<StackConfig>,
        stats: Arc<StatsCell>,
    ) -> StackHandle {
        StackHandle {
            cmds,
            next_id,
            kick: Arc::new(OnceLock::new()),
            inline: Arc::new(OnceLock::new()),
            config,
            stats,
        }
    }

    /// Install the engine doorbell. Only the first call has an effect; until then the
    /// engine is expected to poll on its own.
    pub fn set_kick(&self, kick: Kick) {
        let _ = self.kick.set(kick);
    }

    /// Install the engine's inline driver (an engine in
    /// `xwarp_poll_driver::engine::EngineMode::Inline`). Only the first call has an effect.
    pub fn set_inline_driver(&self, driver: InlineDriver) {
        let _ = self.inline.set(driver);
    }

    /// The engine's inline driver: `Some` when application threads are to drive the
    /// engine from their blocking and polling calls (`xwarp::net` does).
    pub fn inline_driver(&self) -> Option<&InlineDriver> {
        self.inline.get()
    }

    /// The engine's configuration.
    pub fn config(&self) -> &StackConfig {
        &self.config
    }

    /// Counters published by the engine after each poll; `accepted` is published before
    /// the connection reaches the accept queue, so it already counts every accepted stream.
    pub fn stats(&self) -> StackStats {
        self.stats.load()
    }

    fn ring(&self) {
        if let Some(k) = self.kick.get() {
            k();
        }
    }

    fn send(&self, cmd: Command) -> io::Result<()> {
        self.cmds
            .send(cmd)
            .map_err(|_| SocketError::EngineGone.to_io())?;
        self.ring();
        Ok(())
    }

    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Start connecting to `remote` (non-blocking). `local_port` binds the local port;
    /// `None` takes an ephemeral one. The returned stream is in [`Phase::Connecting`]
    /// until the handshake finishes or fails (connection refused, timeout).
    pub fn connect(
        &self,
        remote: SocketAddr,
        local_port: Option<u16>,
        timeout: Option<Duration>,
    ) -> io::Result<Stream> {
        self.connect_with(remote, local_port, timeout, &SocketOptions::default())
    }

    /// [`StackHandle::connect`] with per-socket options (buffer sizes take effect only
    /// here, before the handshake: the window scale is fixed by the SYN).
    pub fn connect_with(
        &self,
        remote: SocketAddr,
        local_port: Option<u16>,
        timeout: Option<Duration>,
        options: &SocketOptions,
    ) -> io::Result<Stream> {
        let engine_shared = SocketShared::new(self.id())?;
        let options = *options;
        engine_shared.update_options(|o| *o = options);
        let shared = Arc::new(engine_shared.app_handle());
        let (rx_ring, tx_ring) = crate::socket::ring_sizes(&self.config, &options);
        let (rx_prod, rx_cons) = rtrb::RingBuffer::new(rx_ring);
        let (tx_prod, tx_cons) = rtrb::RingBuffer::new(tx_ring);
        let deadline = Instant::now() + timeout.unwrap_or(self.config.connect_timeout);
        self.send(Command::Connect {
            shared: Arc::new(engine_shared),
            rx: rx_prod,
            tx: tx_cons,
            remote,
            local_port,
            deadline,
        })?;
        Ok(Stream {
            handle: self.clone(),
            shared,
            rx: rx_cons,
            tx: tx_prod,
            write_shut: false,
        })
    }

    /// Listen on `local` with an accept queue of `backlog` connections; waits (up to
    /// `wait`) for the engine to arm the port.
    pub fn listen(
        &self,
        local: SocketAddr,
        backlog: usize,
        wait: Duration,
    ) -> io::Result<ListenSocket> {
        self.listen_with(local, backlog, wait, &SocketOptions::default())
    }

    /// [`StackHandle::listen`] with options for the listener and every connection it
    /// accepts (like Linux, accepted sockets inherit the listener's options).
    pub fn listen_with(
        &self,
        local: SocketAddr,
        backlog: usize,
        wait: Duration,
        options: &SocketOptions,
    ) -> io::Result<ListenSocket> {
        let shared = Arc::new(ListenerShared::new(self.id(), *options)?);
        let (tx, rx) = crossbeam_channel::unbounded();
        self.send(Command::Listen {
            shared: shared.clone(),
            accept: tx,
            local,
            backlog,
        })?;
        let listener = ListenSocket {
            handle: self.clone(),
            shared,
            accept: rx,
        };
        let deadline = Instant::now() + wait;
        loop {
            if let Some(e) = listener.shared.error() {
                return Err(e.to_io());
            }
            if listener.shared.is_listening() {
                return Ok(listener);
            }
            if !listener.shared.readiness.wait(Some(deadline))? {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "engine did not answer the listen request",
                ));
            }
        }
    }
}

/// One TCP connection, application side. Dropping it closes the connection gracefully
/// (queued data is sent, then FIN).
#[derive(Debug)]
pub struct Stream {
    handle: StackHandle,
    shared: Arc<SocketShared>,
    rx: rtrb::Consumer<u8>,
    tx: rtrb::Producer<u8>,
    write_shut: bool,
}

impl Stream {
    pub(crate) fn from_accepted(handle: StackHandle, c: AcceptedConn) -> Stream {
        // Hold an application handle: the engine's (dropped here; the engine keeps its
        // clone) signals the readiness descriptor when the engine lets go of it.
        Stream {
            handle,
            shared: Arc::new(c.shared.app_handle()),
            rx: c.rx,
            tx: c.tx,
            write_shut: false,
        }
    }

    /// The handle of the engine this stream belongs to.
    pub fn stack(&self) -> &StackHandle {
        &self.handle
    }

    /// Connection phase.
    pub fn phase(&self) -> Phase {
        self.shared.phase()
    }

    /// `Ok(true)` once established, `Ok(false)` while connecting, the failure otherwise.
    pub fn poll_connect(&self) -> io::Result<bool> {
        if let Some(e) = self.shared.error() {
            return Err(e.to_io());
        }
        match self.shared.phase() {
            Phase::Connecting => {
                if self.rx.is_abandoned() || self.shared.engine_dropped() {
                    return Err(SocketError::EngineGone.to_io());
                }
                Ok(false)
            }
            Phase::Established => Ok(true),
            Phase::Closed => Err(io::Error::new(io::ErrorKind::NotConnected, "socket closed")),
        }
    }

    /// Sleep until the readiness descriptor fires or `deadline` passes (`false`). It also
    /// fires when the engine lets go of the connection (e.g. the engine stopped): the
    /// next operation then reports why.
    pub fn wait(&self, deadline: Option<Instant>) -> io::Result<bool> {
        self.shared.readiness.wait(deadline)
    }

    fn mark_dirty(&self) {
        if !self.shared.dirty.swap(true, Ordering::SeqCst) {
            let _ = self.handle.send(Command::Dirty { id: self.shared.id });
        }
    }

    /// Read available bytes; `Ok(0)` is end of stream; `WouldBlock` when nothing is
    /// buffered (the readiness descriptor fires when that changes).
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        for attempt in 0..2 {
            if let Some(n) = self.read_ring(buf) {
                return Ok(n);
            }
            // The engine may deliver the last bytes and then announce the end between the
            // look at the ring above and the flags below: those bytes come first.
            if self.shared.rx_eof() {
                return Ok(self.read_ring(buf).unwrap_or(0));
            }
            if let Some(e) = self.shared.error() {
                return Err(e.to_io());
            }
            if self.shared.phase() == Phase::Closed {
                return Ok(self.read_ring(buf).unwrap_or(0));
            }
            if self.rx.is_abandoned() || self.shared.engine_dropped() {
                return Err(SocketError::EngineGone.to_io());
            }
            if attempt == 0 {
                self.shared.register_want(WANT_READ);
            }
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Copy what the receive ring holds into `buf` (`None` if it is empty), and wake the
    /// engine if it stopped delivering for want of ring space.
    fn read_ring(&mut self, buf: &mut [u8]) -> Option<usize> {
        let n = buf.len().min(self.rx.slots());
        if n == 0 {
            return None;
        }
        let chunk = self.rx.read_chunk(n).ok()?;
        let (a, b) = chunk.as_slices();
        buf[..a.len()].copy_from_slice(a);
        buf[a.len()..n].copy_from_slice(b);
        chunk.commit_all();
        fence(Ordering::SeqCst);
        if self.shared.rx_stalled.swap(false, Ordering::SeqCst) {
            self.mark_dirty();
        }
        Some(n)
    }

    /// `true` if [`Stream::try_read`] would not say `WouldBlock` now: bytes in the
    /// receive ring, end of stream, a failure or a closed connection. Lock-free and
    /// syscall-free (for spinning readers); unlike `try_read` it registers no interest.
    pub fn rx_ready(&self) -> bool {
        self.rx.slots() > 0
            || self.shared.rx_eof()
            || self.shared.error().is_some()
            || self.shared.phase() == Phase::Closed
            || self.rx.is_abandoned()
            || self.shared.engine_dropped()
    }

    /// Queue bytes for sending; `WouldBlock` when the ring is full.
    pub fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.write_shut {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "socket shut down for writing",
            ));
        }
        if let Some(e) = self.shared.error() {
            return Err(e.to_io());
        }
        match self.shared.phase() {
            Phase::Closed => {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "connection closed",
                ))
            }
            Phase::Connecting => return Err(io::ErrorKind::WouldBlock.into()),
            Phase::Established => {}
        }
        if buf.is_empty() {
            return Ok(0);
        }
        if self.tx.is_abandoned() || self.shared.engine_dropped() {
            return Err(SocketError::EngineGone.to_io());
        }
        for attempt in 0..2 {
            let (_, rest) = self.tx.push_partial_slice(buf);
            let n = buf.len() - rest.len();
            if n > 0 {
                self.mark_dirty();
                return Ok(n);
            }
            if attempt == 0 {
                self.shared.register_want(WANT_WRITE);
            }
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Bytes queued in the tx ring that the engine has not taken yet.
    pub fn tx_queued(&self) -> usize {
        self.tx.buffer().capacity() - self.tx.slots()
    }

    /// Send FIN after the queued data; further writes fail with `BrokenPipe`.
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        if !self.write_shut {
            self.write_shut = true;
            self.handle
                .send(Command::ShutdownWrite { id: self.shared.id })?;
        }
        Ok(())
    }

    /// Reset the connection (RST) instead of closing it gracefully.
    pub fn abort(&mut self) -> io::Result<()> {
        self.handle.send(Command::Abort { id: self.shared.id })
    }

    /// Change `TCP_NODELAY` on this connection.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        // Recorded so that a later option change re-applies this value.
        let mut o = self.shared.options();
        o.nodelay = Some(nodelay);
        self.shared.init_options(o);
        self.handle.send(Command::SetNodelay {
            id: self.shared.id,
            nodelay,
        })
    }

    /// The options as last set on this connection (inherited from the listener for
    /// accepted connections).
    pub fn options(&self) -> SocketOptions {
        self.shared.options()
    }

    fn update_options(&self, f: impl FnOnce(&mut SocketOptions)) -> io::Result<()> {
        if self.shared.update_options(f) {
            self.handle.send(Command::Dirty { id: self.shared.id })?;
        }
        Ok(())
    }

    /// `SO_KEEPALIVE` with `TCP_KEEPIDLE`/`TCP_KEEPINTVL`/`TCP_KEEPCNT`: once the peer
    /// has been silent for [`KeepAlive::dead_after`], the connection fails with
    /// `TimedOut` (`ETIMEDOUT`). `None` switches keep-alive off (the engine default).
    pub fn set_keepalive(&self, keepalive: Option<KeepAlive>) -> io::Result<()> {
        self.update_options(|o| o.keepalive = keepalive)
    }

    /// `true` once the peer acknowledged our FIN, i.e. every byte written was delivered
    /// (what a lingering close waits for).
    pub fn fin_acked(&self) -> bool {
        self.shared.fin_acked()
    }

    /// Ask the engine what it knows about the connection ([`TcpInfo`]); waits up to
    /// `timeout` for the answer (`TimedOut` if the engine no longer serves the
    /// connection, e.g. after it closed).
    pub fn tcp_info(&self, timeout: Duration) -> io::Result<TcpInfo> {
        let n = self.shared.request_info();
        // The engine publishes the last answer before it lets go of the connection.
        let last = || {
            self.shared
                .info_if_answered(n)
                .ok_or_else(|| SocketError::EngineGone.to_io())
        };
        if self
            .handle
            .send(Command::Dirty { id: self.shared.id })
            .is_err()
        {
            return last();
        }
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            if let Some(info) = self.shared.info_if_answered(n) {
                return Ok(info);
            }
            if self.shared.engine_dropped() {
                return last();
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "engine did not answer the TCP_INFO request",
                ));
            }
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Local address, once established.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.addrs().map(|a| a.0)
    }

    /// Peer address, once established.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.shared.addrs().map(|a| a.1)
    }

    /// The connection's failure, if any.
    pub fn error(&self) -> Option<SocketError> {
        self.shared.error()
    }
}

impl AsRawFd for Stream {
    /// The readiness eventfd: readable after a `WouldBlock` once progress is possible
    /// (edge-style: drain it and retry the operation).
    fn as_raw_fd(&self) -> RawFd {
        self.shared.readiness.as_raw_fd()
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.readiness.as_fd()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.handle.send(Command::Close { id: self.shared.id });
    }
}

/// A listening port, application side. Dropping it stops listening; connections queued
/// but not accepted are closed.
#[derive(Debug)]
pub struct ListenSocket {
    handle: StackHandle,
    shared: Arc<ListenerShared>,
    accept: Receiver<AcceptedConn>,
}

impl ListenSocket {
    /// Take one established connection; `WouldBlock` if none is queued.
    pub fn try_accept(&self) -> io::Result<Stream> {
        for attempt in 0..2 {
            match self.accept.try_recv() {
                Ok(c) => {
                    // Room in the accept queue: let the engine re-arm the port.
                    let _ = self.handle.send(Command::Rearm { id: self.shared.id });
                    return Ok(Stream::from_accepted(self.handle.clone(), c));
                }
                Err(TryRecvError::Disconnected) => return Err(SocketError::EngineGone.to_io()),
                Err(TryRecvError::Empty) => {
                    // Queued connections come first; the flag is set before the wakeup.
                    if self.shared.engine_dropped() {
                        return Err(SocketError::EngineGone.to_io());
                    }
                    if attempt == 0 {
                        self.shared.want_accept.store(true, Ordering::SeqCst);
                        fence(Ordering::SeqCst);
                    }
                }
            }
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Sleep until a connection is queued, the engine stops (the next
    /// [`ListenSocket::try_accept`] then fails with `ConnectionAborted`) or `deadline`
    /// passes (`false`). Drains the readiness descriptor when it returns `true`.
    ///
    /// It waits on the accept queue itself rather than on the readiness descriptor: the
    /// queue's sending half lives in the engine, so a stopped engine disconnects it and
    /// wakes this wait, while nothing signals the descriptor in that case.
    pub fn wait(&self, deadline: Option<Instant>) -> io::Result<bool> {
        let mut sel = crossbeam_channel::Select::new();
        sel.recv(&self.accept);
        let ready = match deadline {
            None => {
                sel.ready();
                true
            }
            Some(d) => sel.ready_deadline(d).is_ok(),
        };
        if ready {
            self.shared.readiness.drain();
        }
        Ok(ready)
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared.local_addr()
    }

    /// The options this listener and its accepted connections were given.
    pub fn options(&self) -> SocketOptions {
        self.shared.options
    }

    /// A clone of the engine handle this listener belongs to.
    pub fn stack(&self) -> &StackHandle {
        &self.handle
    }
}

impl AsRawFd for ListenSocket {
    /// Readable after a `WouldBlock` from [`ListenSocket::try_accept`] once a connection
    /// is queued.
    fn as_raw_fd(&self) -> RawFd {
        self.shared.readiness.as_raw_fd()
    }
}

impl AsFd for ListenSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.readiness.as_fd()
    }
}

impl Drop for ListenSocket {
    fn drop(&mut self) {
        let _ = self.handle.send(Command::Unlisten { id: self.shared.id });
        while let Ok(c) = self.accept.try_recv() {
            drop(Stream::from_accepted(self.handle.clone(), c));
        }
    }
}
