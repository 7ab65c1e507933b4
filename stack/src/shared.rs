//! State shared between the engine thread and application threads, one per socket.
//!
//! Only atomics and an eventfd: the engine publishes state with release stores and signals
//! the readiness descriptor; the application reads with acquire loads. Data never goes
//! through here; it moves through the per-socket SPSC rings.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::config::SocketOptions;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};

/// Connection phase as seen by the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// SYN sent, waiting for the handshake to finish.
    Connecting = 0,
    /// Handshake complete; data may flow.
    Established = 1,
    /// The connection is gone (see [`SocketShared::error`] for why, if not graceful).
    Closed = 2,
}

/// Why a socket failed; mapped to [`io::ErrorKind`] by [`SocketError::to_io`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SocketError {
    /// The peer answered the SYN with RST.
    Refused = 1,
    /// The peer reset an established connection.
    Reset = 2,
    /// The connect or user timeout expired.
    TimedOut = 3,
    /// The local port is already in use.
    AddrInUse = 4,
    /// No local address or ephemeral port is available for this destination.
    AddrNotAvailable = 5,
    /// The destination address is invalid (unspecified, multicast, wrong family).
    InvalidAddress = 6,
    /// The engine stopped.
    EngineGone = 7,
    /// The connection was aborted locally.
    Aborted = 8,
    /// The engine's socket limit (`StackConfig::max_sockets`) or socket buffer budget
    /// (`StackConfig::socket_buffer_budget`) is reached (Linux: `ENOBUFS`).
    NoBuffers = 9,
}

impl SocketError {
    fn from_u8(v: u8) -> Option<SocketError> {
        Some(match v {
            1 => SocketError::Refused,
            2 => SocketError::Reset,
            3 => SocketError::TimedOut,
            4 => SocketError::AddrInUse,
            5 => SocketError::AddrNotAvailable,
            6 => SocketError::InvalidAddress,
            7 => SocketError::EngineGone,
            8 => SocketError::Aborted,
            9 => SocketError::NoBuffers,
            _ => return None,
        })
    }

    /// The `io::Error` an application sees for this failure.
    pub fn to_io(self) -> io::Error {
        let (kind, msg) = match self {
            SocketError::Refused => (io::ErrorKind::ConnectionRefused, "connection refused"),
            SocketError::Reset => (io::ErrorKind::ConnectionReset, "connection reset by peer"),
            SocketError::TimedOut => (io::ErrorKind::TimedOut, "connection timed out"),
            SocketError::AddrInUse => (io::ErrorKind::AddrInUse, "address in use"),
            SocketError::AddrNotAvailable => {
                (io::ErrorKind::AddrNotAvailable, "address not available")
            }
            SocketError::InvalidAddress => (io::ErrorKind::InvalidInput, "invalid address"),
            SocketError::EngineGone => (io::ErrorKind::ConnectionAborted, "engine stopped"),
            SocketError::Aborted => (io::ErrorKind::ConnectionAborted, "connection aborted"),
            SocketError::NoBuffers => (
                io::ErrorKind::OutOfMemory,
                "no buffer space available (engine socket limit or buffer budget reached)",
            ),
        };
        io::Error::new(kind, msg)
    }
}

/// Readiness interest bits the application registers before it waits.
pub(crate) const WANT_READ: u8 = 1;
/// See [`WANT_READ`].
pub(crate) const WANT_WRITE: u8 = 2;

/// How many times any [`Readiness`] descriptor of this process was signalled.
static SIGNALS: AtomicU64 = AtomicU64::new(0);

/// How many readiness signals every engine of this process has raised so far (a counter
/// that only grows; bumped right after each [`Readiness::signal`]'s write). A poller that
/// recorded it before looking at its descriptors, and reads the same value later, knows
/// no readiness descriptor was written in between, so it need not ask the kernel about
/// them again.
pub fn readiness_signals() -> u64 {
    SIGNALS.load(Ordering::Acquire)
}

/// An eventfd that becomes readable when the engine has news for the application.
///
/// The descriptor is made on first use (a wait, or [`AsFd`] for an epoll set), not with the
/// socket: a connection the application only polls without blocking, or one that sits idle,
/// holds no file descriptor (issue 16: 100,000 idle connections in one process would
/// otherwise need 100,000 eventfds, beyond most `RLIMIT_NOFILE`s). A signal raised before
/// the descriptor exists is remembered and makes the new descriptor readable.
#[derive(Debug)]
pub struct Readiness {
    fd: OnceLock<OwnedFd>,
    /// Signalled while no descriptor existed yet.
    pending: AtomicBool,
}

/// The process's stand-in descriptor, always readable: what [`Readiness`]'s `AsFd` hands
/// out when its own eventfd cannot be made (the process is out of descriptors), so a
/// poller retries and finds `WouldBlock` instead of the engine panicking. Made with the
/// first `Readiness`.
static FALLBACK: OnceLock<OwnedFd> = OnceLock::new();

fn new_eventfd() -> io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?)
}

impl Readiness {
    /// A readiness signal with no descriptor yet (see the type's docs). Fails only when
    /// the process-wide fallback descriptor cannot be made.
    pub fn new() -> io::Result<Readiness> {
        if FALLBACK.get().is_none() {
            let fd = new_eventfd()?;
            let _ = rustix::io::write(&fd, &1u64.to_ne_bytes());
            let _ = FALLBACK.set(fd);
        }
        Ok(Readiness {
            fd: OnceLock::new(),
            pending: AtomicBool::new(false),
        })
    }

    /// Whether the eventfd exists yet.
    pub fn has_fd(&self) -> bool {
        self.fd.get().is_some()
    }

    /// The eventfd, made now if it does not exist yet (readable when a signal came
    /// before it).
    pub fn fd(&self) -> io::Result<BorrowedFd<'_>> {
        if let Some(f) = self.fd.get() {
            return Ok(f.as_fd());
        }
        let made = new_eventfd()?;
        let f = self.fd.get_or_init(|| made);
        // Pairs with the fence in `signal`: either it sees the descriptor or this sees
        // its `pending`.
        fence(Ordering::SeqCst);
        if self.pending.swap(false, Ordering::SeqCst) {
            let _ = rustix::io::write(f, &1u64.to_ne_bytes());
        }
        Ok(f.as_fd())
    }

    /// Make the descriptor readable.
    pub fn signal(&self) {
        // EAGAIN only happens when the counter is about to overflow, i.e. it is
        // already readable: nothing is lost by ignoring it.
        match self.fd.get() {
            Some(f) => {
                let _ = rustix::io::write(f, &1u64.to_ne_bytes());
            }
            None => {
                self.pending.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                // The descriptor may have been made meanwhile by a maker that looked at
                // `pending` before the store above.
                if let Some(f) = self.fd.get() {
                    if self.pending.swap(false, Ordering::SeqCst) {
                        let _ = rustix::io::write(f, &1u64.to_ne_bytes());
                    }
                }
            }
        }
        SIGNALS.fetch_add(1, Ordering::Release);
    }

    /// Reset the descriptor to not readable.
    pub fn drain(&self) {
        self.pending.store(false, Ordering::SeqCst);
        if let Some(f) = self.fd.get() {
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(f, &mut buf);
        }
    }

    /// Sleep until the descriptor is readable or `deadline` passes; then drain it.
    /// Returns `false` on timeout.
    pub fn wait(&self, deadline: Option<Instant>) -> io::Result<bool> {
        let fd = self.fd()?;
        loop {
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    Some(rustix::event::Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: i64::from(left.subsec_nanos()),
                    })
                }
            };
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            match poll(&mut fds, timeout.as_ref()) {
                Ok(0) => continue,
                Ok(_) => {
                    self.drain();
                    return Ok(true);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The descriptor for `AsFd`/`AsRawFd`: the eventfd, or the always-readable fallback
    /// when it cannot be made (logged once).
    fn borrowed(&self) -> BorrowedFd<'_> {
        match self.fd() {
            Ok(f) => f,
            Err(e) => {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "xwarp: cannot make a readiness eventfd ({e}); handing out an always-readable stand-in (raise RLIMIT_NOFILE)"
                    );
                }
                match FALLBACK.get() {
                    Some(f) => f.as_fd(),
                    // Unreachable: `new` made it. Borrow the fd of the error-free path
                    // instead of panicking: stderr.
                    // SAFETY: fd 2 is not closed by this crate; a borrowed fd is only read
                    // as a number by pollers.
                    None => unsafe { BorrowedFd::borrow_raw(2) },
                }
            }
        }
    }
}

impl AsRawFd for Readiness {
    fn as_raw_fd(&self) -> RawFd {
        self.borrowed().as_raw_fd()
    }
}

impl AsFd for Readiness {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.borrowed()
    }
}

/// Engine ↔ application state of one connection: a handle on [`SocketState`].
///
/// [`SocketShared::new`] makes the engine's handle: when the engine drops it (connection
/// forgotten, or the engine stopped and its service dropped) it signals the readiness
/// descriptor, so an application sleeping on it wakes up and finds the connection's fate
/// (error, EOF or `EngineGone` through its abandoned rings). The application holds its
/// own handle ([`SocketShared::app_handle`]) on the same state, which signals nothing.
#[derive(Debug)]
pub struct SocketShared {
    state: std::sync::Arc<SocketState>,
    engine_side: bool,
}

impl std::ops::Deref for SocketShared {
    type Target = SocketState;

    fn deref(&self) -> &SocketState {
        &self.state
    }
}

impl Drop for SocketShared {
    fn drop(&mut self) {
        if self.engine_side {
            // Flag first: the wakeup may run before the engine drops the rings.
            self.state.engine_dropped.store(true, Ordering::Release);
            self.state.readiness.signal();
        }
    }
}

/// The state behind a [`SocketShared`].
#[derive(Debug)]
pub struct SocketState {
    /// Engine-wide connection id.
    pub(crate) id: u64,
    pub(crate) readiness: Readiness,
    phase: AtomicU8,
    error: AtomicU8,
    rx_eof: AtomicBool,
    want: AtomicU8,
    /// Set by the app when it queued tx data or freed rx space the engine has not seen.
    pub(crate) dirty: AtomicBool,
    /// Set by the engine when smoltcp holds data the rx ring had no room for.
    pub(crate) rx_stalled: AtomicBool,
    /// Set when the engine dropped its handle (it forgot the connection or stopped).
    engine_dropped: AtomicBool,
    addrs: OnceLock<(SocketAddr, SocketAddr)>,
    /// Set by the app when it changed `options` or asked for a [`TcpInfo`]: the engine
    /// looks at the control fields below only when this is set (one load per serve).
    pub(crate) control: AtomicBool,
    /// The socket's options as the application last set them (taken by the engine at
    /// connect and after `control`; never touched on the data path).
    options: Mutex<SocketOptions>,
    /// `options` changed since the engine last applied them.
    pub(crate) options_changed: AtomicBool,
    /// Set by the engine once our FIN is acknowledged (every byte delivered).
    fin_acked: AtomicBool,
    /// Number of [`TcpInfo`] requests made / answered.
    pub(crate) info_requested: AtomicU64,
    info_answered: AtomicU64,
    info: Mutex<TcpInfo>,
}

/// What the engine knows about one connection, in the spirit of Linux `struct tcp_info`
/// (see [`crate::Stream::tcp_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpInfo {
    /// TCP state in Linux numbering (`TCP_ESTABLISHED` = 1 ... `TCP_CLOSING` = 11).
    pub state: u8,
    /// Retransmission timeout the engine works with: the RFC 6298 estimate from the
    /// engine's RTT samples, floored at the engine's effective minimum RTO.
    pub rto: Duration,
    /// Smoothed round-trip time (`None`: no sample yet). Sampled by the engine from the
    /// time between handing bytes to an idle connection and their full acknowledgement,
    /// so it includes the peer's delayed-ACK time, like Linux's.
    pub rtt: Option<Duration>,
    /// Round-trip time variation (RFC 6298 `RTTVAR`).
    pub rttvar: Duration,
    /// Maximum segment size this end sends with (bounded by the MTU; the peer's MSS
    /// option is not visible through smoltcp, see the crate docs).
    pub snd_mss: u32,
    /// Maximum segment size this end advertised.
    pub rcv_mss: u32,
    /// Bytes in the TCP send buffer (sent but unacknowledged plus not yet sent).
    pub send_queue: u32,
    /// Bytes received in the TCP buffer that the application ring has not taken yet.
    pub recv_queue: u32,
    /// Receive window this end can currently offer (free receive buffer).
    pub rcv_wnd: u32,
    /// Bytes handed to TCP for sending.
    pub bytes_sent: u64,
    /// Bytes acknowledged by the peer.
    pub bytes_acked: u64,
    /// Bytes received from the peer (in order).
    pub bytes_received: u64,
    /// Times the engine's loss rescue made smoltcp retransmit (rescue.rs).
    pub retransmits: u32,
    /// The TCP receive buffer size of this connection.
    pub recv_buffer: u32,
    /// The TCP send buffer size of this connection.
    pub send_buffer: u32,
    /// Retransmission timeouts (own TCP core only; 0 under smoltcp, which hides them).
    pub rtos: u32,
    /// Tail-loss probes sent (own TCP core only).
    pub tlps: u32,
    /// Fast recoveries entered (own TCP core only).
    pub fast_recoveries: u32,
    /// DSACK blocks received (own TCP core only).
    pub dsacks: u32,
    /// Congestion window in bytes (own TCP core only; smoltcp keeps it private).
    pub cwnd: u32,
}

impl SocketShared {
    /// The engine's handle on fresh state (see the type docs).
    pub(crate) fn new(id: u64) -> io::Result<SocketShared> {
        Ok(SocketShared {
            state: std::sync::Arc::new(SocketState::new(id)?),
            engine_side: true,
        })
    }

    /// An application handle on the same state: dropping it signals nothing.
    pub(crate) fn app_handle(&self) -> SocketShared {
        SocketShared {
            state: self.state.clone(),
            engine_side: false,
        }
    }
}

impl SocketState {
    fn new(id: u64) -> io::Result<SocketState> {
        Ok(SocketState {
            id,
            readiness: Readiness::new()?,
            phase: AtomicU8::new(Phase::Connecting as u8),
            error: AtomicU8::new(0),
            rx_eof: AtomicBool::new(false),
            want: AtomicU8::new(0),
            dirty: AtomicBool::new(false),
            rx_stalled: AtomicBool::new(false),
            engine_dropped: AtomicBool::new(false),
            addrs: OnceLock::new(),
            control: AtomicBool::new(false),
            options: Mutex::new(SocketOptions::default()),
            options_changed: AtomicBool::new(false),
            fin_acked: AtomicBool::new(false),
            info_requested: AtomicU64::new(0),
            info_answered: AtomicU64::new(0),
            info: Mutex::new(TcpInfo::default()),
        })
    }

    /// The socket's options as last set by the application.
    pub fn options(&self) -> SocketOptions {
        *self.lock_options()
    }

    fn lock_options(&self) -> MutexGuard<'_, SocketOptions> {
        self.options.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Application side: change the options (the engine applies them once it is told;
    /// see [`SocketState::control`]). Returns `true` if they changed.
    pub(crate) fn update_options(&self, f: impl FnOnce(&mut SocketOptions)) -> bool {
        let mut o = self.lock_options();
        let before = *o;
        f(&mut o);
        let changed = *o != before;
        drop(o);
        if changed {
            self.options_changed.store(true, Ordering::SeqCst);
            self.control.store(true, Ordering::SeqCst);
        }
        changed
    }

    /// Set the options without asking the engine to re-apply them (the engine itself,
    /// for accepted connections that inherit their listener's options).
    pub(crate) fn init_options(&self, options: SocketOptions) {
        *self.lock_options() = options;
    }

    /// Engine side: the options, if they changed since the last call.
    pub(crate) fn take_changed_options(&self) -> Option<SocketOptions> {
        self.options_changed
            .swap(false, Ordering::SeqCst)
            .then(|| self.options())
    }

    /// `true` once our FIN was acknowledged: every byte written reached the peer.
    pub fn fin_acked(&self) -> bool {
        self.fin_acked.load(Ordering::Acquire)
    }

    pub(crate) fn set_fin_acked(&self) {
        if !self.fin_acked.swap(true, Ordering::AcqRel) {
            self.readiness.signal();
        }
    }

    /// Application side: ask for a fresh [`TcpInfo`]; returns the request number to
    /// wait for with [`SocketState::info_if_answered`].
    pub(crate) fn request_info(&self) -> u64 {
        let n = self.info_requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.control.store(true, Ordering::SeqCst);
        n
    }

    /// The engine's answer once it answered request `n` or a later one.
    pub(crate) fn info_if_answered(&self, n: u64) -> Option<TcpInfo> {
        if self.info_answered.load(Ordering::Acquire) >= n {
            Some(*self.info.lock().unwrap_or_else(|p| p.into_inner()))
        } else {
            None
        }
    }

    /// Engine side: `true` if an info request is pending.
    pub(crate) fn info_pending(&self) -> bool {
        self.info_requested.load(Ordering::SeqCst) > self.info_answered.load(Ordering::Acquire)
    }

    /// Engine side: publish the answer to every request made so far.
    pub(crate) fn answer_info(&self, info: TcpInfo) {
        let n = self.info_requested.load(Ordering::SeqCst);
        *self.info.lock().unwrap_or_else(|p| p.into_inner()) = info;
        self.info_answered.store(n, Ordering::Release);
    }

    /// Engine side, as it lets go of the connection: its last `TCP_INFO`, the answer to
    /// every request from now on (Linux answers `TCP_INFO` on a closed socket too).
    pub(crate) fn answer_final_info(&self, info: TcpInfo) {
        *self.info.lock().unwrap_or_else(|p| p.into_inner()) = info;
        self.info_answered.store(u64::MAX, Ordering::Release);
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Connecting,
            1 => Phase::Established,
            _ => Phase::Closed,
        }
    }

    /// The failure, if the connection failed.
    pub fn error(&self) -> Option<SocketError> {
        SocketError::from_u8(self.error.load(Ordering::Acquire))
    }

    /// `true` once the engine let go of the connection (it forgot it, or it stopped).
    pub fn engine_dropped(&self) -> bool {
        self.engine_dropped.load(Ordering::Acquire)
    }

    /// `true` once the peer's FIN was seen and every byte before it is in the rx ring.
    pub fn rx_eof(&self) -> bool {
        self.rx_eof.load(Ordering::Acquire)
    }

    /// (local, peer) addresses, known once established.
    pub fn addrs(&self) -> Option<(SocketAddr, SocketAddr)> {
        self.addrs.get().copied()
    }

    pub(crate) fn set_established(&self, local: SocketAddr, peer: SocketAddr) {
        let _ = self.addrs.set((local, peer));
        self.phase
            .store(Phase::Established as u8, Ordering::Release);
        self.readiness.signal();
    }

    pub(crate) fn set_error(&self, e: SocketError) {
        // The first error wins.
        let _ = self
            .error
            .compare_exchange(0, e as u8, Ordering::AcqRel, Ordering::Acquire);
        self.phase.store(Phase::Closed as u8, Ordering::Release);
        self.readiness.signal();
    }

    pub(crate) fn set_rx_eof(&self) {
        if !self.rx_eof.swap(true, Ordering::AcqRel) {
            self.readiness.signal();
        }
    }

    pub(crate) fn set_closed(&self) {
        self.phase.store(Phase::Closed as u8, Ordering::Release);
        self.readiness.signal();
    }

    /// Application side: register interest before re-checking and sleeping.
    pub(crate) fn register_want(&self, bits: u8) {
        self.want.fetch_or(bits, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Engine side: after making progress on `bits`, wake the app if it waits for them.
    pub(crate) fn notify(&self, bits: u8) {
        fence(Ordering::SeqCst);
        if self.want.load(Ordering::SeqCst) & bits != 0
            && self.want.fetch_and(!bits, Ordering::SeqCst) & bits != 0
        {
            // No sched_yield here: yielding right after waking a same-core application
            // gave +7-10% bulk but +1.4 µs p50 ping-pong half RTT (bench tcp, pin sides,
            // A/B runs); the woken application is usually scheduled promptly anyway.
            self.readiness.signal();
        }
    }
}

/// Engine ↔ application state of one listening port.
#[derive(Debug)]
pub struct ListenerShared {
    pub(crate) id: u64,
    pub(crate) readiness: Readiness,
    error: AtomicU8,
    listening: AtomicBool,
    pub(crate) want_accept: AtomicBool,
    /// Set when the engine let go of the listener (it stopped, or the port was closed).
    engine_dropped: AtomicBool,
    local: OnceLock<SocketAddr>,
    /// Options every socket of this listener (and every accepted connection) gets.
    pub(crate) options: SocketOptions,
}

impl ListenerShared {
    pub(crate) fn new(id: u64, options: SocketOptions) -> io::Result<ListenerShared> {
        Ok(ListenerShared {
            options,
            id,
            readiness: Readiness::new()?,
            error: AtomicU8::new(0),
            listening: AtomicBool::new(false),
            want_accept: AtomicBool::new(false),
            engine_dropped: AtomicBool::new(false),
            local: OnceLock::new(),
        })
    }

    /// The failure, if `listen` failed.
    pub fn error(&self) -> Option<SocketError> {
        SocketError::from_u8(self.error.load(Ordering::Acquire))
    }

    /// `true` once the engine armed the port.
    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// The bound address, once listening.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local.get().copied()
    }

    pub(crate) fn set_listening(&self, local: SocketAddr) {
        let _ = self.local.set(local);
        self.listening.store(true, Ordering::Release);
        self.readiness.signal();
    }

    pub(crate) fn set_error(&self, e: SocketError) {
        let _ = self
            .error
            .compare_exchange(0, e as u8, Ordering::AcqRel, Ordering::Acquire);
        self.readiness.signal();
    }

    /// `true` once the engine let go of the listener (see [`ListenerShared::set_engine_dropped`]).
    pub fn engine_dropped(&self) -> bool {
        self.engine_dropped.load(Ordering::Acquire)
    }

    /// Engine side: the engine forgot the listener (it stopped, or the port was closed):
    /// flag it, then wake an application waiting on the readiness descriptor (the flag
    /// comes first, so the woken application sees it).
    pub(crate) fn set_engine_dropped(&self) {
        self.engine_dropped.store(true, Ordering::Release);
        self.readiness.signal();
    }

    pub(crate) fn notify_accept(&self) {
        fence(Ordering::SeqCst);
        if self.want_accept.swap(false, Ordering::SeqCst) {
            self.readiness.signal();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn readiness_signals_counts_every_signal() {
        let r = Readiness::new().unwrap();
        let before = readiness_signals();
        r.signal();
        r.signal();
        // Other tests signal in parallel: at least these two.
        assert!(readiness_signals() >= before + 2);
    }

    #[test]
    fn readiness_wait_times_out_then_wakes() {
        let r = Readiness::new().unwrap();
        let t = Instant::now();
        assert!(!r.wait(Some(t + Duration::from_millis(20))).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(20));
        r.signal();
        assert!(r
            .wait(Some(Instant::now() + Duration::from_secs(5)))
            .unwrap());
        // Drained: a second wait times out.
        assert!(!r
            .wait(Some(Instant::now() + Duration::from_millis(5)))
            .unwrap());
    }

    #[test]
    fn readiness_descriptor_is_made_on_first_use_and_keeps_an_earlier_signal() {
        let r = Readiness::new().unwrap();
        r.signal();
        r.drain();
        r.signal();
        assert!(!r.has_fd(), "signal and drain made a descriptor");
        // The signal raised before the descriptor existed makes it readable.
        let fd = r.fd().unwrap().as_raw_fd();
        assert!(r.has_fd());
        assert_eq!(r.as_raw_fd(), fd);
        let mut p = [PollFd::new(&r, PollFlags::IN)];
        assert_eq!(
            poll(
                &mut p,
                Some(&rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0
                })
            )
            .unwrap(),
            1
        );
        assert!(r
            .wait(Some(Instant::now() + Duration::from_millis(5)))
            .unwrap());
        assert!(!r
            .wait(Some(Instant::now() + Duration::from_millis(5)))
            .unwrap());
        // Drained before the descriptor existed: not readable.
        let q = Readiness::new().unwrap();
        q.signal();
        q.drain();
        assert!(!q
            .wait(Some(Instant::now() + Duration::from_millis(5)))
            .unwrap());
    }

    #[test]
    fn notify_signals_only_registered_interest() {
        let s = SocketShared::new(1).unwrap();
        s.notify(WANT_READ);
        assert!(!s
            .readiness
            .wait(Some(Instant::now() + Duration::from_millis(5)))
            .unwrap());
        s.register_want(WANT_READ);
        s.notify(WANT_WRITE);
        assert!(!s
            .readiness
            .wait(Some(Instant::now() + Duration::from_millis(5)))
            .unwrap());
        s.notify(WANT_READ);
        assert!(s
            .readiness
            .wait(Some(Instant::now() + Duration::from_millis(5)))
            .unwrap());
    }

    #[test]
    fn dropping_the_engine_handle_signals_the_application() {
        let engine = SocketShared::new(9).unwrap();
        let app = engine.app_handle();
        assert_eq!(app.id, 9);
        let soon = || Some(Instant::now() + Duration::from_millis(5));
        // Application handles signal nothing when dropped.
        drop(app.app_handle());
        assert!(!app.readiness.wait(soon()).unwrap());
        // State is shared: the engine's updates are the application's.
        engine.set_rx_eof();
        assert!(app.rx_eof());
        assert!(app.readiness.wait(soon()).unwrap());
        assert!(!app.engine_dropped());
        drop(engine);
        assert!(app.engine_dropped());
        assert!(app.readiness.wait(soon()).unwrap());
    }

    #[test]
    fn first_error_wins_and_maps_to_io_kind() {
        let s = SocketShared::new(1).unwrap();
        s.set_error(SocketError::Refused);
        s.set_error(SocketError::Reset);
        assert_eq!(s.error(), Some(SocketError::Refused));
        assert_eq!(s.phase(), Phase::Closed);
        assert_eq!(
            s.error().unwrap().to_io().kind(),
            io::ErrorKind::ConnectionRefused
        );
    }
}
