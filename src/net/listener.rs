//! `TcpListener` over the engine.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use xwarp_stack::{ListenSocket, SocketOptions, StackHandle};

use super::{block_on, TcpStream, DEFAULT_SPIN};

/// Backlog used by [`TcpListener::bind`] (Linux's default `somaxconn` is 4096; std uses 128).
pub const DEFAULT_BACKLOG: usize = 128;

/// How long `bind` waits for the engine to arm the port.
const BIND_WAIT: Duration = Duration::from_secs(5);

/// A listening TCP port on an xwarp engine.
#[derive(Debug)]
pub struct TcpListener {
    inner: ListenSocket,
    nonblocking: bool,
}

impl TcpListener {
    /// Listen on `addr` (port must be non-zero) with a backlog of [`DEFAULT_BACKLOG`].
    pub fn bind(stack: &StackHandle, addr: SocketAddr) -> io::Result<TcpListener> {
        Self::bind_with_backlog(stack, addr, DEFAULT_BACKLOG)
    }

    /// Listen on `addr` with an accept queue of `backlog` established connections.
    /// SYNs that find the queue full are dropped, as on Linux (no RST): the client
    /// retransmits them and gets in once `accept` makes room.
    pub fn bind_with_backlog(
        stack: &StackHandle,
        addr: SocketAddr,
        backlog: usize,
    ) -> io::Result<TcpListener> {
        if addr.port() == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "port 0 is not supported",
            ));
        }
        Ok(TcpListener {
            inner: stack.listen(addr, backlog, BIND_WAIT)?,
            nonblocking: false,
        })
    }

    /// Listen with socket options that every accepted connection inherits (buffer
    /// sizes, keep-alive, nodelay), like options set on a Linux listener before `listen`.
    pub fn bind_with(
        stack: &StackHandle,
        addr: SocketAddr,
        backlog: usize,
        options: &SocketOptions,
    ) -> io::Result<TcpListener> {
        if addr.port() == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "port 0 is not supported",
            ));
        }
        Ok(TcpListener {
            inner: stack.listen_with(addr, backlog, BIND_WAIT, options)?,
            nonblocking: false,
        })
    }

    /// The options accepted connections inherit.
    pub fn options(&self) -> SocketOptions {
        self.inner.options()
    }

    /// Take the next established connection, blocking unless non-blocking mode is on.
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let driver = self.inner.stack().inline_driver();
        let s = if self.nonblocking {
            match self.inner.try_accept() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && driver.is_some() => {
                    driver.map(|d| d.try_drive());
                    self.inner.try_accept()?
                }
                r => r?,
            }
        } else {
            block_on(
                driver,
                DEFAULT_SPIN,
                None,
                || self.inner.try_accept(),
                |d| self.inner.wait(d),
            )?
        };
        let nodelay = self.inner.options().nodelay;
        let mut stream = TcpStream::from_stream(s);
        if let Some(nd) = nodelay {
            stream.nodelay = nd;
        }
        let peer = stream.peer_addr()?;
        Ok((stream, peer))
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner
            .local_addr()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    /// Switch non-blocking mode (`accept` returns `WouldBlock` instead of waiting).
    pub fn set_nonblocking(&mut self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking = nonblocking;
        Ok(())
    }
}

impl AsRawFd for TcpListener {
    /// Readiness eventfd: readable once a connection is queued after a `WouldBlock`.
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl AsFd for TcpListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}
