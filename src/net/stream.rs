//! `TcpStream` over the engine.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use xwarp_poll_driver::engine::InlineDriver;
use xwarp_stack::{KeepAlive, Phase, SocketOptions, StackHandle, Stream, TcpInfo};

use super::{before_sleep, block_on, spin_budget, spin_round, DEFAULT_SPIN};

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
    pub(super) nodelay: bool,
    spin: Duration,
    /// `SO_LINGER`: `None` off; `Some(ZERO)` reset on close; `Some(t)` close waits up
    /// to `t` for every byte to be acknowledged.
    linger: Option<Duration>,
    /// `true` once closed (by [`TcpStream::close`]; `Drop` then does nothing more).
    closed: bool,
}

/// How long [`TcpStream::tcp_info`] waits for the engine's answer.
const INFO_WAIT: Duration = Duration::from_secs(1);

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
            linger: None,
            closed: false,
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

    /// Connect with socket options chosen before the handshake (buffer sizes: see
    /// [`SocketOptions`] and [`super::socket_buffer_size`]; keep-alive; nodelay).
    pub fn connect_with(
        stack: &StackHandle,
        addr: SocketAddr,
        options: &SocketOptions,
    ) -> io::Result<TcpStream> {
        let mut s = Self::connect_inner_with(stack, addr, None, options)?;
        s.nodelay = options.nodelay.unwrap_or(stack.config().tcp.nodelay);
        Ok(s)
    }

    fn connect_inner(
        stack: &StackHandle,
        addr: SocketAddr,
        timeout: Option<Duration>,
    ) -> io::Result<TcpStream> {
        Self::connect_inner_with(stack, addr, timeout, &SocketOptions::default())
    }

    fn connect_inner_with(
        stack: &StackHandle,
        addr: SocketAddr,
        timeout: Option<Duration>,
        options: &SocketOptions,
    ) -> io::Result<TcpStream> {
        let s = stack.connect_with(addr, None, timeout, options)?;
        let limit = timeout.unwrap_or(stack.config().connect_timeout) + CONNECT_GRACE;
        let deadline = Instant::now() + limit;
        block_on(
            stack.inline_driver(),
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

    /// [`TcpStream::connect_nonblocking`] with socket options chosen before the handshake
    /// (as [`TcpStream::connect_with`]).
    pub fn connect_nonblocking_with(
        stack: &StackHandle,
        addr: SocketAddr,
        options: &SocketOptions,
    ) -> io::Result<TcpStream> {
        let mut s = Self::from_stream(stack.connect_with(addr, None, None, options)?);
        s.nonblocking = true;
        s.nodelay = options.nodelay.unwrap_or(stack.config().tcp.nodelay);
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

    /// `SO_KEEPALIVE` (+ `TCP_KEEPIDLE`/`TCP_KEEPINTVL`/`TCP_KEEPCNT`): when the peer has
    /// been silent for [`KeepAlive::dead_after`], reads and writes fail with `TimedOut`
    /// (Linux: `ETIMEDOUT`). `None` switches it off. Differs from Linux in one point:
    /// smoltcp has a single probe period, so probes go out every
    /// [`KeepAlive::probe_interval`] of silence, the first one possibly before `idle`.
    pub fn set_keepalive(&mut self, keepalive: Option<KeepAlive>) -> io::Result<()> {
        self.inner.set_keepalive(keepalive)
    }

    /// The keep-alive settings (`None`: off).
    pub fn keepalive(&self) -> io::Result<Option<KeepAlive>> {
        Ok(self.inner.options().keepalive)
    }

    /// `SO_LINGER`. `None` (default): dropping or closing the stream returns at once and
    /// the engine delivers queued data, then FIN, in the background. `Some(ZERO)`: close
    /// resets the connection (RST; the peer sees `ConnectionReset`; queued data is
    /// discarded). `Some(t)`: close (and drop) waits up to `t` until every byte and the
    /// FIN are acknowledged; after `t` the close continues in the background.
    pub fn set_linger(&mut self, linger: Option<Duration>) -> io::Result<()> {
        self.linger = linger;
        Ok(())
    }

    /// The `SO_LINGER` setting.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(self.linger)
    }

    /// Close the stream honouring [`TcpStream::set_linger`]. With a linger time it
    /// returns `Ok` once everything was acknowledged and `TimedOut` if the time ran out
    /// first (Linux's `close` returns 0 in both cases; the close then goes on in the
    /// background either way). A failed connection reports its error.
    pub fn close(mut self) -> io::Result<()> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        match self.linger {
            Some(t) if t.is_zero() => self.inner.abort(),
            Some(t) => {
                if self.inner.phase() == Phase::Connecting {
                    return Ok(());
                }
                self.inner.shutdown_write()?;
                let deadline = Instant::now() + t;
                loop {
                    if self.inner.fin_acked() {
                        return Ok(());
                    }
                    if let Some(e) = self.inner.error() {
                        return Err(e.to_io());
                    }
                    if self.inner.phase() == Phase::Closed {
                        return Ok(());
                    }
                    // Discard input so the peer's data cannot hold our FIN back.
                    let mut scratch = [0u8; 4096];
                    while let Ok(n) = self.inner.try_read(&mut scratch) {
                        if n == 0 {
                            break;
                        }
                    }
                    if !self.inner.wait(Some(deadline))? && Instant::now() >= deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "linger time expired before the data was acknowledged",
                        ));
                    }
                }
            }
            None => Ok(()),
        }
    }

    /// What the engine knows about the connection (`TCP_INFO`): state, RTT estimate,
    /// MSS, queues, byte counters, buffer sizes.
    pub fn tcp_info(&self) -> io::Result<TcpInfo> {
        self.inner.tcp_info(INFO_WAIT)
    }

    /// `SO_RCVBUF` as Linux reports it: the connection's TCP receive buffer.
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        Ok(self.tcp_info()?.recv_buffer as usize)
    }

    /// `SO_SNDBUF` as Linux reports it: the connection's TCP send buffer.
    pub fn send_buffer_size(&self) -> io::Result<usize> {
        Ok(self.tcp_info()?.send_buffer as usize)
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
        self.closed = true;
        self.inner.abort()
    }

    /// [`TcpStream::abort`] through a reference (the shared stream of a split or async
    /// stream): RST now, nothing more at drop.
    #[cfg(feature = "tokio")]
    pub(super) fn abort_in_place(&mut self) -> io::Result<()> {
        self.closed = true;
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

    /// Split into a read half and a write half that two threads can use at once (a
    /// reader blocked in `read` while a writer writes); see [`super::split`] for why
    /// xwarp splits instead of offering `try_clone`. The stream's settings carry over:
    /// each half keeps its own timeout and spin budget, the close (with the linger time)
    /// happens once both halves are gone.
    pub fn into_split(self) -> io::Result<(super::ReadHalf, super::WriteHalf)> {
        super::split::split(self)
    }

    /// One non-blocking read, whatever the stream's mode (`Ok(0)` after a read shutdown).
    pub(super) fn try_read_now(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read_shut {
            return Ok(0);
        }
        read_polling(&mut self.inner, buf)
    }

    /// One non-blocking write, whatever the stream's mode.
    pub(super) fn try_write_now(&mut self, buf: &[u8]) -> io::Result<usize> {
        write_pushing(&mut self.inner, buf)
    }

    /// The engine's inline driver when it runs in inline mode (`None` in thread mode):
    /// this stream's blocking calls drive the engine through it.
    pub fn inline_driver(&self) -> Option<InlineDriver> {
        self.inner.stack().inline_driver().cloned()
    }

    /// The settings a split half starts from: (read timeout, write timeout, spin).
    pub(super) fn wait_settings(&self) -> (Option<Duration>, Option<Duration>, Duration) {
        (self.read_timeout, self.write_timeout, self.spin)
    }
}

impl Drop for TcpStream {
    /// Closes like [`TcpStream::close`] (with a linger time, dropping blocks up to it).
    fn drop(&mut self) {
        let _ = self.close_inner();
    }
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read_shut {
            return Ok(0);
        }
        if self.nonblocking {
            return read_polling(&mut self.inner, buf);
        }
        let deadline = self.read_timeout.map(|t| Instant::now() + t);
        block_on_stream(self.spin, deadline, &mut self.inner, |s| s.try_read(buf))
    }
}

/// A non-blocking read; in inline mode one engine iteration runs when nothing is
/// buffered, and the ring is read again.
pub(super) fn read_polling(s: &mut Stream, buf: &mut [u8]) -> io::Result<usize> {
    match s.try_read(buf) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => match s.stack().inline_driver() {
            Some(d) => {
                d.try_drive();
                s.try_read(buf)
            }
            None => Err(e),
        },
        r => r,
    }
}

/// A non-blocking write; in inline mode, bytes the engine has not taken yet (the write's
/// own doorbell ring drives only when no other thread is driving) get one more iteration,
/// so they leave before the call returns.
pub(super) fn write_pushing(s: &mut Stream, buf: &[u8]) -> io::Result<usize> {
    let r = s.try_write(buf);
    if r.is_ok() && s.tx_queued() > 0 {
        if let Some(d) = s.stack().inline_driver() {
            d.try_drive();
        }
    }
    r
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.nonblocking {
            return write_pushing(&mut self.inner, buf);
        }
        let deadline = self.write_timeout.map(|t| Instant::now() + t);
        block_on_stream(self.spin, deadline, &mut self.inner, |s| {
            write_pushing(s, buf)
        })
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
    let driver = s.stack().inline_driver().cloned();
    let driver = driver.as_ref();
    let spin_until = Instant::now() + spin_budget(driver, spin);
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
            spin_round(driver);
            continue;
        }
        before_sleep(driver);
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
