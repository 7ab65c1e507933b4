//! `TcpStream` over the engine.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use xwarp_stack::{StackHandle, Stream};

use super::{block_on, DEFAULT_SPIN};

/// Which halves [`TcpStream::shutdown`] closes (as `std::net::Shutdown`).
pub use std::net::Shutdown;

/// Extra time the application waits beyond the engine's own connect deadline.
const CONNECT_GRACE: Duration = Duration::from_millis(500);

/// A TCP connection on an xwarp engine. Dropping it closes the connection gracefully:
/// queued data is still sent, then FIN.
#[derive(Debug)]
pub struct TcpStream {
    inner: Stream,
    nonblocking: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    read_shut: bool,
    nodelay: bool,
    spin: Duration,
}

fn check_timeout(t: Option<Duration>) -> io::Result<()> {
    if t == Some(Duration::ZERO) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero timeout"));
    }
    Ok(())
}

impl TcpStream {
    pub(crate) fn from_stream(inner: Stream) -> TcpStream {
        TcpStream {
            nodelay: false,
            inner,
            nonblocking: false,
            read_timeout: None,
            write_timeout: None,
            read_shut: false,
            spin: DEFAULT_SPIN,
        }
    }

    /// Connect to `addr`, waiting up to the engine's configured connect timeout.
    pub fn connect(stack: &StackHandle, addr: SocketAddr) -> io::Result<TcpStream> {
        Self::connect_inner(stack, addr, None)
    }

    /// Connect to `addr`, failing with `TimedOut` after `timeout`.
    pub fn connect_timeout(
        stack: &StackHandle,
        addr: SocketAddr,
        timeout: Duration,
    ) -> io::Result<TcpStream> {
        check_timeout(Some(timeout))?;
        Self::connect_inner(stack, addr, Some(timeout))
    }

    fn connect_inner(
        stack: &StackHandle,
        addr: SocketAddr,
        timeout: Option<Duration>,
    ) -> io::Result<TcpStream> {
        let s = stack.connect(addr, None, timeout)?;
        let limit = timeout.unwrap_or(stack.config().connect_timeout) + CONNECT_GRACE;
        let deadline = Instant::now() + limit;
        block_on(
            DEFAULT_SPIN,
            Some(deadline),
            || match s.poll_connect() {
                Ok(true) => Ok(()),
                Ok(false) => Err(io::ErrorKind::WouldBlock.into()),
                Err(e) => Err(e),
            },
            |d| s.wait(d),
        )?;
        Ok(Self::from_stream(s))
    }

    /// Start connecting without waiting: the stream is usable once [`TcpStream::poll_connect`]
    /// says `true` (its readiness descriptor fires when the handshake ends either way).
    pub fn connect_nonblocking(stack: &StackHandle, addr: SocketAddr) -> io::Result<TcpStream> {
        let mut s = Self::from_stream(stack.connect(addr, None, None)?);
        s.nonblocking = true;
        Ok(s)
    }

    /// `Ok(true)` once connected, `Ok(false)` while the handshake runs, or its failure
    /// (`ConnectionRefused`, `TimedOut`, ...).
    pub fn poll_connect(&self) -> io::Result<bool> {
        self.inner.poll_connect()
    }

    /// Switch non-blocking mode: reads and writes return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&mut self, nonblocking: bool) -> io::Result<()> {
        self.nonblocking = nonblocking;
        Ok(())
    }

    /// Read timeout for blocking reads (`None`: wait forever). Zero is rejected, like std.
    /// An expired read fails with `TimedOut`.
    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.read_timeout = t;
        Ok(())
    }

    /// Write timeout for blocking writes.
    pub fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.write_timeout = t;
        Ok(())
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.read_timeout)
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.write_timeout)
    }

    /// How long blocking calls spin before sleeping (default [`DEFAULT_SPIN`]).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// `TCP_NODELAY`: disable (true) or enable Nagle's algorithm.
    pub fn set_nodelay(&mut self, nodelay: bool) -> io::Result<()> {
        self.inner.set_nodelay(nodelay)?;
        self.nodelay = nodelay;
        Ok(())
    }

    /// The last value given to [`TcpStream::set_nodelay`] (or the engine default `false`).
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(self.nodelay)
    }

    /// Close one or both halves. `Write` sends FIN after the queued data (the peer reads
    /// end of stream); `Read` makes further reads return `Ok(0)`.
    pub fn shutdown(&mut self, how: Shutdown) -> io::Result<()> {
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.read_shut = true;
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            self.inner.shutdown_write()?;
        }
        Ok(())
    }

    /// Reset the connection (RST); the peer sees `ConnectionReset`.
    pub fn abort(mut self) -> io::Result<()> {
        self.inner.abort()
    }

    /// Local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner
            .local_addr()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    /// Peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner
            .peer_addr()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    /// Sleep on the readiness descriptor until it fires (`true`) or `timeout` passes
    /// (`false`). For non-blocking loops: call after an operation returned `WouldBlock`.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        self.inner.wait(timeout.map(|t| Instant::now() + t))
    }

    /// Bytes written but not yet taken by the engine.
    pub fn unsent(&self) -> usize {
        self.inner.tx_queued()
    }
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read_shut {
            return Ok(0);
        }
        if self.nonblocking {
            return self.inner.try_read(buf);
        }
        let deadline = self.read_timeout.map(|t| Instant::now() + t);
        block_on_stream(self.spin, deadline, &mut self.inner, |s| s.try_read(buf))
    }
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.nonblocking {
            return self.inner.try_write(buf);
        }
        let deadline = self.write_timeout.map(|t| Instant::now() + t);
        block_on_stream(self.spin, deadline, &mut self.inner, |s| s.try_write(buf))
    }

    /// Data is handed to the engine by `write` already; nothing to flush.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// [`block_on`] for an operation that needs `&mut Stream` while waiting needs `&Stream`.
fn block_on_stream<T>(
    spin: Duration,
    deadline: Option<Instant>,
    s: &mut Stream,
    mut op: impl FnMut(&mut Stream) -> io::Result<T>,
) -> io::Result<T> {
    let spin_until = Instant::now() + spin;
    loop {
        match op(s) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "operation timed out",
            ));
        }
        if now < spin_until {
            std::hint::spin_loop();
            continue;
        }
        s.wait(deadline)?;
    }
}

impl AsRawFd for TcpStream {
    /// Readiness eventfd: readable once a read or write that returned `WouldBlock`
    /// (or a non-blocking connect) can make progress.
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl AsFd for TcpStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}
