//! `xwarp::net` for tokio (feature `tokio`): [`TcpStream`] implements
//! [`AsyncRead`] + [`AsyncWrite`], [`TcpListener::accept`] is an `async fn`.
//!
//! ```no_run
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use xwarp::net::tokio::{TcpListener, TcpStream};
//! use xwarp::net::vwire_pair;
//! # async fn run() -> std::io::Result<()> {
//! let (a, b) = vwire_pair(Default::default())?;
//! let listener = TcpListener::bind(b.stack(), "10.77.0.2:7".parse().unwrap())?;
//! let mut client = TcpStream::connect(a.stack(), "10.77.0.2:7".parse().unwrap()).await?;
//! let (mut server, _) = listener.accept().await?;
//! client.write_all(b"ping").await?;
//! let mut buf = [0u8; 4];
//! server.read_exact(&mut buf).await?;
//! # Ok(()) }
//! ```
//!
//! Readiness comes from the engine's per-socket eventfds registered with the runtime's
//! reactor through [`AsyncFd`]: no thread of its own, no polling loop. A socket's one
//! eventfd serves reads and writes, and tokio keeps one waker per direction of a
//! registration, so a stream registers two duplicates of it (one that read tasks wait
//! on, one for write tasks); an edge-triggered registration reports each signal of the
//! eventfd to both. Every operation is tried first (which registers the interest with
//! the engine and re-checks, see `xwarp_stack::Stream::try_read`); only a `WouldBlock`
//! waits, and a wakeup clears tokio's readiness and tries again, so a signal that comes
//! between the try and the wait is never lost. The engine signals on data, ring space,
//! the handshake's end, the peer's FIN (read returns `Ok(0)`), a reset
//! (`ConnectionReset`) and when it stops or forgets the socket (`ConnectionAborted`).
//!
//! All of it must run inside a tokio runtime with I/O enabled
//! (`Builder::enable_io`/`enable_all`); constructors outside a runtime fail with an
//! error. Binding a listener waits (microseconds) for the engine to arm the port, like
//! the blocking [`super::TcpListener::bind`].

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

use super::{Shutdown, SocketOptions, StackHandle};
use crate::net;

/// Register a duplicate of `fd` with the current runtime's reactor (read interest: an
/// eventfd is readable once signalled).
fn register(fd: impl AsFd) -> io::Result<AsyncFd<OwnedFd>> {
    if ::tokio::runtime::Handle::try_current().is_err() {
        return Err(io::Error::other(
            "xwarp::net::tokio needs a tokio runtime (call from within one)",
        ));
    }
    let dup = fd.as_fd().try_clone_to_owned()?;
    // SAFETY: `dup` is an open descriptor the `AsyncFd` owns: it stays open, names the
    // same file description and `as_raw_fd` returns the same number until the `AsyncFd`
    // drops it (nothing else can close it).
    let registered = unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE) };
    Ok(registered?)
}

/// Reset a readiness eventfd's counter (non-blocking; nothing to read is fine). Only
/// keeps the counter small: wakeups come from the edge-triggered registrations, which
/// see every signal whatever the counter holds.
fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 8];
    let _ = rustix::io::read(fd, &mut buf);
}

/// Wait for `fd` to be signalled after an operation said `WouldBlock`, then clear the
/// readiness so the caller tries again (`Pending` with the task's waker registered).
fn poll_signal(fd: &AsyncFd<OwnedFd>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    let mut guard = ready!(fd.poll_read_ready(cx))?;
    drain(guard.get_inner());
    guard.clear_ready();
    Poll::Ready(Ok(()))
}

/// What a stream and its halves share.
struct Core {
    /// Read tasks wait on this registration, write tasks on `write_ready`. Declared
    /// before `stream`: deregistered before the stream closes.
    read_ready: AsyncFd<OwnedFd>,
    write_ready: AsyncFd<OwnedFd>,
    /// Only ever used through its non-blocking operations, the lock held for one ring
    /// access at a time.
    stream: Mutex<net::TcpStream>,
}

impl Core {
    fn new(stream: net::TcpStream) -> io::Result<Core> {
        Ok(Core {
            read_ready: register(&stream)?,
            write_ready: register(&stream)?,
            stream: Mutex::new(stream),
        })
    }

    fn lock(&self) -> MutexGuard<'_, net::TcpStream> {
        // Every operation under the lock is one non-blocking step: a panic in one left
        // the stream consistent.
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let r = self.lock().try_read_now(buf.initialize_unfilled());
            match r {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            ready!(poll_signal(&self.read_ready, cx))?;
        }
    }

    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let r = self.lock().try_write_now(buf);
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
            ready!(poll_signal(&self.write_ready, cx))?;
        }
    }

    /// Wait for the handshake to end.
    fn poll_connected(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            // The engine signals the descriptor unconditionally when the handshake
            // succeeds or fails (and when it stops), so no interest to register.
            match self.lock().poll_connect() {
                Ok(true) => return Poll::Ready(Ok(())),
                Ok(false) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            ready!(poll_signal(&self.read_ready, cx))?;
        }
    }
}

/// A TCP connection on an xwarp engine for tokio: [`AsyncRead`] + [`AsyncWrite`].
/// Dropping it (and both halves of [`TcpStream::into_split`]) closes the connection
/// gracefully: queued data is still sent, then FIN.
pub struct TcpStream {
    core: Arc<Core>,
}

impl fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStream")
            .field("stream", &*self.core.lock())
            .finish()
    }
}

impl TcpStream {
    /// Connect to `addr`; fails like [`net::TcpStream::connect`] (`ConnectionRefused`,
    /// `TimedOut` after the engine's connect timeout, ...).
    pub async fn connect(stack: &StackHandle, addr: SocketAddr) -> io::Result<TcpStream> {
        let s = Self::from_std(net::TcpStream::connect_nonblocking(stack, addr)?)?;
        poll_fn(|cx| s.core.poll_connected(cx)).await?;
        Ok(s)
    }

    /// [`TcpStream::connect`] with socket options chosen before the handshake (see
    /// [`net::TcpStream::connect_with`]).
    pub async fn connect_with(
        stack: &StackHandle,
        addr: SocketAddr,
        options: &SocketOptions,
    ) -> io::Result<TcpStream> {
        let s = Self::from_std(net::TcpStream::connect_nonblocking_with(
            stack, addr, options,
        )?)?;
        poll_fn(|cx| s.core.poll_connected(cx)).await?;
        Ok(s)
    }

    /// Wrap a blocking-API stream (connected, or connecting from
    /// [`net::TcpStream::connect_nonblocking`]). Its timeouts no longer apply: wrap a
    /// future in `tokio::time::timeout` instead.
    pub fn from_std(stream: net::TcpStream) -> io::Result<TcpStream> {
        Ok(TcpStream {
            core: Arc::new(Core::new(stream)?),
        })
    }

    /// Peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().peer_addr()
    }

    /// Local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().local_addr()
    }

    /// `TCP_NODELAY`: disable (true) or enable Nagle's algorithm.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.core.lock().set_nodelay(nodelay)
    }

    /// The last value given to [`TcpStream::set_nodelay`].
    pub fn nodelay(&self) -> io::Result<bool> {
        self.core.lock().nodelay()
    }

    /// Close one or both directions at once (no waiting), as `std`'s `shutdown(how)`:
    /// `Write` sends FIN after the queued data, `Read` makes further reads return
    /// `Ok(0)`. `AsyncWriteExt::shutdown` (`s.shutdown().await`, as with tokio's own
    /// stream; hence this name) does the `Write` part.
    pub fn shutdown_with(&self, how: Shutdown) -> io::Result<()> {
        self.core.lock().shutdown(how)
    }

    /// Reset the connection (RST): queued data is discarded, the peer sees
    /// `ConnectionReset`.
    pub fn abort(self) -> io::Result<()> {
        self.core.lock().abort_in_place()
    }

    /// What the engine knows about the connection (`TCP_INFO`; waits up to a second for
    /// the engine's answer, which comes within microseconds from a running engine).
    pub fn tcp_info(&self) -> io::Result<net::TcpInfo> {
        self.core.lock().tcp_info()
    }

    /// Split into halves that separate tasks own (tokio's `into_split`): reads and
    /// writes run at once, each waking on its own registration. Dropping the write half
    /// sends FIN (like tokio's); the connection closes once both halves are dropped.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        (
            OwnedReadHalf {
                core: self.core.clone(),
            },
            OwnedWriteHalf {
                core: self.core,
                shutdown_on_drop: true,
            },
        )
    }
}

impl AsyncRead for TcpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.core.poll_read(cx, buf)
    }
}

impl AsyncWrite for TcpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.core.poll_write(cx, buf)
    }

    /// Data is handed to the engine by `write` already; nothing to flush.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Sends FIN after the queued data (returns at once).
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.core.lock().shutdown(Shutdown::Write))
    }
}

/// The reading half of [`TcpStream::into_split`].
pub struct OwnedReadHalf {
    core: Arc<Core>,
}

/// The writing half of [`TcpStream::into_split`]; dropping it sends FIN.
pub struct OwnedWriteHalf {
    core: Arc<Core>,
    shutdown_on_drop: bool,
}

impl fmt::Debug for OwnedReadHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedReadHalf").finish_non_exhaustive()
    }
}

impl fmt::Debug for OwnedWriteHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedWriteHalf").finish_non_exhaustive()
    }
}

/// [`OwnedReadHalf::reunite`] was given halves of two different streams.
#[derive(Debug)]
pub struct ReuniteError(pub OwnedReadHalf, pub OwnedWriteHalf);

impl fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tried to reunite halves of different streams")
    }
}

impl std::error::Error for ReuniteError {}

impl OwnedReadHalf {
    /// Put the halves back together (no FIN is sent).
    pub fn reunite(self, mut other: OwnedWriteHalf) -> Result<TcpStream, ReuniteError> {
        if !Arc::ptr_eq(&self.core, &other.core) {
            return Err(ReuniteError(self, other));
        }
        other.shutdown_on_drop = false;
        Ok(TcpStream { core: self.core })
    }

    /// Peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().peer_addr()
    }

    /// Local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().local_addr()
    }
}

impl OwnedWriteHalf {
    /// Put the halves back together (no FIN is sent).
    pub fn reunite(self, other: OwnedReadHalf) -> Result<TcpStream, ReuniteError> {
        other.reunite(self)
    }

    /// Peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().peer_addr()
    }

    /// Local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.core.lock().local_addr()
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if self.shutdown_on_drop {
            let _ = self.core.lock().shutdown(Shutdown::Write);
        }
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.core.poll_read(cx, buf)
    }
}

impl AsyncWrite for OwnedWriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.core.poll_write(cx, buf)
    }

    /// Nothing to flush (see [`TcpStream`]'s).
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Sends FIN after the queued data (returns at once).
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.core.lock().shutdown(Shutdown::Write))
    }
}

/// A listening TCP port on an xwarp engine for tokio.
pub struct TcpListener {
    /// Declared before `inner`: deregistered before the listener closes.
    ready: AsyncFd<OwnedFd>,
    inner: net::TcpListener,
}

impl fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpListener")
            .field("inner", &self.inner)
            .finish()
    }
}

impl TcpListener {
    /// Listen on `addr` (port non-zero) with a backlog of [`net::DEFAULT_BACKLOG`].
    pub fn bind(stack: &StackHandle, addr: SocketAddr) -> io::Result<TcpListener> {
        Self::from_std(net::TcpListener::bind(stack, addr)?)
    }

    /// Listen with an accept queue of `backlog` and options every accepted connection
    /// inherits (see [`net::TcpListener::bind_with`]).
    pub fn bind_with(
        stack: &StackHandle,
        addr: SocketAddr,
        backlog: usize,
        options: &SocketOptions,
    ) -> io::Result<TcpListener> {
        Self::from_std(net::TcpListener::bind_with(stack, addr, backlog, options)?)
    }

    /// Wrap a blocking-API listener.
    pub fn from_std(mut inner: net::TcpListener) -> io::Result<TcpListener> {
        inner.set_nonblocking(true)?;
        Ok(TcpListener {
            ready: register(&inner)?,
            inner,
        })
    }

    /// Take the next established connection. Many tasks may wait at once; when the
    /// engine stops, waiting tasks fail with `ConnectionAborted`.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        loop {
            match self.inner.accept() {
                Ok((s, peer)) => return Ok((TcpStream::from_std(s)?, peer)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // `readable` (unlike `poll_read_ready`) keeps a waker per waiting task.
            let mut guard = self.ready.readable().await?;
            drain(guard.get_inner());
            guard.clear_ready();
        }
    }

    /// [`TcpListener::accept`] for hand-written futures: only the last task that polled
    /// is woken.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        loop {
            match self.inner.accept() {
                Ok((s, peer)) => return Poll::Ready(TcpStream::from_std(s).map(|s| (s, peer))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            ready!(poll_signal(&self.ready, cx))?;
        }
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}
