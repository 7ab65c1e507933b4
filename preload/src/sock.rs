//! xwarp sockets behind program-visible descriptors, and the fd → socket table.
//!
//! Every xwarp socket's identity is a real kernel descriptor: a `dup` of its readiness
//! eventfd placed at the number the program sees. The eventfd is kept **readable while the
//! socket may be readable** (it is drained only right before an operation that then
//! re-checks and registers interest with the engine), so `poll`, `select` and `epoll` on it
//! work natively and spurious readiness is possible but a lost wakeup is not. The shim's
//! own `poll`/`select`/`epoll_wait` then compute the exact readiness.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};
use std::time::{Duration, Instant};

use libc::c_int;
use xwarp_stack::{socket_buffer_size, KeepAlive, ListenSocket, Phase, SocketOptions, Stream};

use crate::errno::errno_of;
use crate::linger::{self, closing, linger_wait, read_input, reap, Closing, Input};
use crate::process::{xlog, GENERATION};
use crate::sigsafe::{in_read_section, nested, Counted, FdBits, ReadSection, SignalsBlocked};
use crate::wait::{drain, signal};

/// How much a readiness probe pulls out of the receive ring into the socket's own buffer.
const PROBE_BYTES: usize = 16 << 10;

/// Socket options of an engine socket as the program set them (reported back by
/// `getsockopt`). The engine applies nodelay, keep-alive and (before connect/listen) the
/// buffer sizes; linger is applied by the shim's `close`; the rest is only reported.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Opts {
    pub(crate) reuseaddr: c_int,
    pub(crate) reuseport: c_int,
    pub(crate) keepalive: c_int,
    pub(crate) nodelay: c_int,
    pub(crate) keepidle: c_int,
    pub(crate) keepintvl: c_int,
    pub(crate) keepcnt: c_int,
    pub(crate) linger: (c_int, c_int),
    pub(crate) rcvtimeo: Option<Duration>,
    pub(crate) sndtimeo: Option<Duration>,
    /// `SO_RCVBUF`/`SO_SNDBUF` as `getsockopt` reports them (doubled, clamped), if set.
    pub(crate) rcvbuf: Option<usize>,
    pub(crate) sndbuf: Option<usize>,
}

/// Linux's keep-alive defaults (`net.ipv4.tcp_keepalive_*`) for knobs left at 0.
const KEEPIDLE_DEFAULT: c_int = 7200;
const KEEPINTVL_DEFAULT: c_int = 75;
const KEEPCNT_DEFAULT: c_int = 9;

impl Opts {
    /// `TCP_KEEPIDLE` as reported (the Linux default when never set).
    pub(crate) fn keepidle(&self) -> c_int {
        if self.keepidle > 0 {
            self.keepidle
        } else {
            KEEPIDLE_DEFAULT
        }
    }

    /// `TCP_KEEPINTVL` as reported.
    pub(crate) fn keepintvl(&self) -> c_int {
        if self.keepintvl > 0 {
            self.keepintvl
        } else {
            KEEPINTVL_DEFAULT
        }
    }

    /// `TCP_KEEPCNT` as reported.
    pub(crate) fn keepcnt(&self) -> c_int {
        if self.keepcnt > 0 {
            self.keepcnt
        } else {
            KEEPCNT_DEFAULT
        }
    }

    /// The engine's keep-alive for these options (`None` unless `SO_KEEPALIVE` is on).
    pub(crate) fn keepalive_engine(&self) -> Option<KeepAlive> {
        (self.keepalive != 0).then(|| KeepAlive {
            idle: Duration::from_secs(self.keepidle() as u64),
            interval: Duration::from_secs(self.keepintvl() as u64),
            count: self.keepcnt() as u32,
        })
    }

    /// The options the engine applies to a new connection or listener.
    pub(crate) fn engine(&self) -> SocketOptions {
        SocketOptions {
            nodelay: Some(self.nodelay != 0),
            keepalive: self.keepalive_engine(),
            recv_buffer: self.rcvbuf,
            send_buffer: self.sndbuf,
        }
    }

    /// `SO_LINGER` as a close policy: `None` off, `Some(ZERO)` reset, `Some(t)` wait.
    pub(crate) fn linger_policy(&self) -> Option<Duration> {
        (self.linger.0 != 0).then(|| Duration::from_secs(self.linger.1.max(0) as u64))
    }
}

// ---------------------------------------------------------------------------------------
// buffer sizes set on kernel sockets before they move to the engine

/// Requested (receive, send) buffer sizes, doubled like Linux.
type Buffers = (Option<usize>, Option<usize>);

/// Number of entries in [`PRE_BUFFERS`] (fast path: zero means nothing to look up).
static PRE_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The descriptors [`PRE_BUFFERS`] may hold (a `close` of any other takes no lock).
static PRE_BITS: FdBits = FdBits::new();

/// `SO_RCVBUF`/`SO_SNDBUF` values (as requested) set on kernel TCP sockets that may still
/// move to the engine: the kernel clamps them to `rmem_max`/`wmem_max` and cannot tell
/// an explicit value from its default, so the shim remembers what the program asked.
static PRE_BUFFERS: Mutex<BTreeMap<RawFd, Buffers>> = Mutex::new(BTreeMap::new());

/// Remember a buffer size the program set on kernel socket `fd`.
pub(crate) fn remember_buffer(fd: RawFd, rcv: bool, requested: c_int) {
    let v = socket_buffer_size(requested.max(0) as usize);
    let mut t = lock_pre_buffers();
    PRE_BITS.set(fd);
    let e = t.entry(fd).or_insert_with(|| {
        PRE_COUNT.fetch_add(1, Ordering::Release);
        (None, None)
    });
    if rcv {
        e.0 = Some(v);
    } else {
        e.1 = Some(v);
    }
}

/// Take (and forget) the buffer sizes remembered for `fd`: (receive, send), doubled.
pub(crate) fn take_buffers(fd: RawFd) -> Buffers {
    if PRE_COUNT.load(Ordering::Acquire) == 0 || !PRE_BITS.maybe(fd) {
        return (None, None);
    }
    let mut t = lock_pre_buffers();
    let r = match t.remove(&fd) {
        Some(v) => {
            PRE_COUNT.fetch_sub(1, Ordering::Release);
            v
        }
        None => (None, None),
    };
    PRE_BITS.clear(fd);
    r
}

/// [`PRE_BUFFERS`], locked.
pub(crate) type PreBuffersGuard = MutexGuard<'static, BTreeMap<RawFd, Buffers>>;

/// The buffer sizes remembered for kernel sockets, locked (also by the fork prepare
/// handler, so that a child never inherits the lock held).
pub(crate) fn lock_pre_buffers() -> PreBuffersGuard {
    PRE_BUFFERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// State common to every xwarp socket (shared by all descriptors that `dup` it).
#[derive(Debug)]
pub(crate) struct Common {
    /// `O_NONBLOCK` as the program set it (the eventfd itself always stays non-blocking).
    pub(crate) nonblock: AtomicBool,
    /// `AF_INET` or `AF_INET6`, as created by the program.
    pub(crate) domain: c_int,
    /// Remembered options.
    pub(crate) opts: Mutex<Opts>,
    /// Fork generation the socket belongs to.
    pub(crate) generation: u64,
    /// The readiness eventfd (owned by the engine-side socket; program fds are dups).
    pub(crate) evfd: RawFd,
}

impl Common {
    pub(crate) fn new(domain: c_int, nonblock: bool, opts: Opts, evfd: RawFd) -> Common {
        Common {
            nonblock: AtomicBool::new(nonblock),
            domain,
            opts: Mutex::new(opts),
            generation: GENERATION.load(Ordering::SeqCst),
            evfd,
        }
    }

    /// `true` if the socket belongs to this process's engine (not inherited over fork).
    pub(crate) fn alive(&self) -> bool {
        self.generation == GENERATION.load(Ordering::SeqCst)
    }

    pub(crate) fn opts(&self) -> Counted<'_, Opts> {
        Counted::lock(&self.opts)
    }

    /// [`Common::opts`] for a read or write (`EDEADLK` instead of waiting from a signal
    /// handler that interrupted this thread, see [`Counted::lock_io`]).
    pub(crate) fn opts_io(&self) -> Result<Counted<'_, Opts>, c_int> {
        Counted::lock_io(&self.opts)
    }
}

/// A bound socket waiting for `listen` or `connect` (still a kernel socket underneath).
#[derive(Debug)]
pub(crate) struct Bound {
    pub(crate) addr: SocketAddr,
    pub(crate) domain: c_int,
    /// `listen` was called with this backlog: the engine listener is opened by the first
    /// process that uses the socket (accept, poll, epoll), so a listener created before
    /// `fork` works in the child that serves it.
    pub(crate) listening: Option<c_int>,
    /// The kernel socket underneath was bound and listens too (wildcard addresses): it
    /// serves until the engine listener replaces it, or for good if the engine cannot start.
    pub(crate) kernel_listening: bool,
    /// epoll registrations `(epfd, events, data)` made before `listen` (on the kernel
    /// socket): `listen` moves them onto the engine listener.
    pub(crate) epoll: Vec<(c_int, u32, u64)>,
}

/// The receive side of a stream as the shim sees it.
#[derive(Debug)]
pub(crate) struct StreamInner {
    pub(crate) stream: Stream,
    /// Bytes a readiness probe took out of the ring, served before the ring.
    pending: Vec<u8>,
    /// Valid bytes in `pending` (the buffer itself is allocated once, never re-zeroed).
    plen: usize,
    pos: usize,
    eof: bool,
    pub(crate) read_shut: bool,
    pub(crate) write_shut: bool,
    /// The failure reported by `SO_ERROR` once.
    pub(crate) so_error: Option<c_int>,
    /// A connect failure was already reported to the program.
    pub(crate) reported: bool,
    /// Input was lost unread (a forked child closed its relayed copy with bytes in its
    /// socket): the last close resets the connection, as a close with unread input does.
    lost: bool,
}

/// An xwarp TCP connection.
#[derive(Debug)]
pub(crate) struct StreamSock {
    pub(crate) common: Common,
    inner: Mutex<StreamInner>,
    ring_size: usize,
}

/// An xwarp listening socket.
#[derive(Debug)]
pub(crate) struct ListenerSock {
    pub(crate) common: Common,
    pub(crate) ls: ListenSocket,
    queue: Mutex<VecDeque<Stream>>,
}

/// What a program descriptor is.
#[derive(Debug)]
pub(crate) enum Sock {
    /// Kernel socket bound (in the shim's books only) to an accelerated address.
    Bound(Mutex<Bound>),
    /// Listening on the engine.
    Listener(ListenerSock),
    /// Connection on the engine.
    Stream(StreamSock),
}

impl Sock {
    /// The shared state, if the socket lives on the engine.
    pub(crate) fn common(&self) -> Option<&Common> {
        match self {
            Sock::Bound(_) => None,
            Sock::Listener(l) => Some(&l.common),
            Sock::Stream(s) => Some(&s.common),
        }
    }
}

// ---------------------------------------------------------------------------------------
// fd table

// Who may wait for the table, and why no signal handler can deadlock on it (a handler may
// call `read`/`write`/`close` on an engine descriptor while its own thread is anywhere in
// the shim):
//
// * A descriptor whose bit in [`OWNED`] is clear is not looked up at all: calls on the
//   program's own descriptors (a self-pipe) take no lock (see `sigsafe.rs`).
// * The write side (socket creation, close, dup, the fork handlers) is only taken with
//   every signal blocked ([`SignalsBlocked`]): no handler ever runs on a thread that holds
//   the write side or waits for it.
// * The read side (every lookup, the hot path of each read/write/recv/send) is taken with
//   the signal mask untouched, inside a [`ReadSection`]: a thread-local depth counted
//   before the lock is touched and uncounted after it is released. A section only finds
//   the entry and clones its `Arc` (no user code, no other lock; [`all_streams`], at exit,
//   also collects the streams into a vector), and while it holds the guard, [`VIEW`]
//   points at the map.
// * A handler that finds its thread inside a section ([`in_read_section`]: it interrupted
//   that section) never waits for the table: it reads through [`VIEW`] (the guard belongs
//   to the frame under the handler, so it outlives the handler, and no writer can change
//   the map meanwhile) or, at the section's edges where [`VIEW`] is unset, only tries the
//   read side and fails with `EDEADLK` when a writer holds or waits for it (it might be
//   waiting for the very read guard the interrupted frame holds). The calls that change
//   the table refuse to start in that state (`EDEADLK` before any lock, see
//   [`refuse_change`]), so the write side is never wanted by a thread that may hold the
//   read side.
// * A thread that holds socket locks ([`nested`]: a handler that interrupted a socket
//   operation) only tries the read side too, in the data calls: the `fork` prepare
//   handler on another thread holds the write side while it waits for socket locks.
// So a thread waits for the table only when it holds neither the table nor (for the data
// calls) a socket lock; the thread that holds it is a reader (which waits for nothing) or
// a writer with signals blocked, which waits only for socket locks this thread does not
// hold.

type Map = BTreeMap<RawFd, Arc<Sock>>;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static TABLE: RwLock<Map> = RwLock::new(BTreeMap::new());
/// The descriptors [`TABLE`] may hold.
static OWNED: FdBits = FdBits::new();

thread_local! {
    /// The map, while this thread's innermost [`ReadSection`] holds the read guard (null
    /// otherwise).
    static VIEW: Cell<*const Map> = const { Cell::new(std::ptr::null()) };
}

/// Read the table without touching the signal mask (see the comment above): `wait` says
/// whether this call may wait for the read side (`false`: only try, `EDEADLK` if taken).
fn read_table<R>(wait: bool, f: impl FnOnce(&Map) -> R) -> Result<R, c_int> {
    if in_read_section() {
        let v = VIEW.with(|v| v.get());
        if !v.is_null() {
            // SAFETY: set only while the read guard of a section of this thread is held;
            // that section is suspended under this call (a handler's), so the guard lives
            // until this returns, and no writer changes the map while it does.
            return Ok(f(unsafe { &*v }));
        }
    }
    let wait = wait && !in_read_section();
    let _section = ReadSection::enter();
    let t = if wait {
        TABLE.read().unwrap_or_else(|p| p.into_inner())
    } else {
        match TABLE.try_read() {
            Ok(t) => t,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(libc::EDEADLK),
        }
    };
    let outer = VIEW.with(|v| v.replace(&*t));
    compiler_fence(Ordering::SeqCst);
    let r = f(&t);
    compiler_fence(Ordering::SeqCst);
    VIEW.with(|v| v.set(outer));
    compiler_fence(Ordering::SeqCst);
    drop(t);
    Ok(r)
}

/// The socket behind `fd`, if it is one of the shim's. Called by a handler that
/// interrupted this thread's lookup while a writer waits for the table (the rare edge
/// [`read_table`] cannot serve) it finds none.
pub(crate) fn lookup(fd: RawFd) -> Option<Arc<Sock>> {
    if LIVE.load(Ordering::Acquire) == 0 || !OWNED.maybe(fd) {
        return None;
    }
    read_table(true, |t| t.get(&fd).cloned()).unwrap_or(None)
}

/// [`lookup`] for a call a signal handler may make (the data calls): no signal mask
/// change; when this thread already holds socket locks or is inside a table section (the
/// handler interrupted the shim) it only tries the table's lock, and gives `EDEADLK` when
/// the table is taken (see the comment above).
pub(crate) fn lookup_io(fd: RawFd) -> Result<Option<Arc<Sock>>, c_int> {
    if LIVE.load(Ordering::Acquire) == 0 || !OWNED.maybe(fd) {
        return Ok(None);
    }
    read_table(!nested(), |t| t.get(&fd).cloned())
}

/// `Err(EDEADLK)` if a call that may change the table must not start: this thread is
/// inside a table section (a signal handler interrupted it there) and the call concerns a
/// descriptor the shim may own, or `any_fd` (it may make one: `bind`, `connect`). Then it
/// would wait for the write side while its own frame may hold the read side.
pub(crate) fn refuse_change(fds: &[RawFd], any_fd: bool) -> Result<(), c_int> {
    if in_read_section() && (any_fd || fds.iter().any(|&fd| OWNED.maybe(fd))) {
        return Err(libc::EDEADLK);
    }
    Ok(())
}

/// `true` if any descriptor is the shim's (fast path for kernel-only programs).
pub(crate) fn any() -> bool {
    LIVE.load(Ordering::Acquire) != 0
}

/// Make `fd` refer to `sock`.
pub(crate) fn insert(fd: RawFd, sock: Arc<Sock>) {
    let _blocked = SignalsBlocked::new();
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    OWNED.set(fd);
    let old = t.insert(fd, sock);
    if old.is_none() {
        LIVE.fetch_add(1, Ordering::Release);
    }
    drop(t);
    // A replaced socket is dropped with signals still blocked and the table unlocked.
    drop(old);
}

/// Forget `fd`; returns what it was.
pub(crate) fn remove(fd: RawFd) -> Option<Arc<Sock>> {
    if !any() || !OWNED.maybe(fd) {
        return None;
    }
    let _blocked = SignalsBlocked::new();
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    remove_locked(&mut t, fd)
}

/// The table, write-locked (the fork handlers hold it across `fork`, so the child's copy
/// is consistent: no other thread can be half-way through an update). The caller blocks
/// signals while it holds it (the fork handlers do, for the whole `fork`).
pub(crate) type TableGuard = std::sync::RwLockWriteGuard<'static, Map>;

/// Write-lock the table (see [`TableGuard`]).
pub(crate) fn lock_table() -> TableGuard {
    TABLE.write().unwrap_or_else(|p| p.into_inner())
}

/// [`remove`] with the table already locked.
pub(crate) fn remove_locked(t: &mut TableGuard, fd: RawFd) -> Option<Arc<Sock>> {
    let r = t.remove(&fd);
    if r.is_some() {
        LIVE.fetch_sub(1, Ordering::Release);
    }
    OWNED.clear(fd);
    r
}

/// Every stream in the table (for the exit flush).
pub(crate) fn all_streams() -> Vec<Arc<Sock>> {
    read_table(true, |t| {
        t.values()
            .filter(|s| matches!(***s, Sock::Stream(_)))
            .cloned()
            .collect()
    })
    .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// the last close

/// RFC 2525 §2.17 (Linux `tcp_close`: "data was lost"): a connection closed with unread
/// input is reset, not closed with FIN, so the peer learns its data was not read. Discards
/// the input held by the shim and the receive ring; `true` if there was any (or some was
/// lost earlier, see [`StreamSock::input_lost`]). Bytes the engine has not moved to the
/// ring yet arrive after the close and reset the connection then ([`closing`]).
fn discard_unread(inner: &mut StreamInner) -> bool {
    let mut unread = inner.pos < inner.plen || inner.lost;
    inner.pos = 0;
    inner.plen = 0;
    if !inner.eof && inner.so_error.is_none() {
        match read_input(&mut inner.stream) {
            Input::Data => unread = true,
            Input::Eof => inner.eof = true,
            Input::Nothing | Input::Failed => {}
        }
    }
    unread
}

/// The program closed its last descriptor of `sock`: close gracefully in the background,
/// or as `SO_LINGER` says: `{on, 0}` resets the connection (RST), `{on, t}` blocks up to
/// `t` seconds until every byte and the FIN are acknowledged, then goes on in the
/// background (Linux semantics; `close` returns 0 either way). Unread input resets the
/// connection whatever `SO_LINGER` says ([`discard_unread`]).
pub(crate) fn retire(sock: Arc<Sock>) {
    // `into_inner`, not `try_unwrap`: when the program's close and the fork relay drop
    // their references at the same time, exactly one of them gets to close.
    if let Some(Sock::Stream(st)) = Arc::into_inner(sock) {
        let linger = st.common.opts().linger_policy();
        let mut inner = st.inner.into_inner().unwrap_or_else(|p| p.into_inner());
        let unread = discard_unread(&mut inner);
        let mut stream = inner.stream;
        if unread {
            xlog!(Debug, "close with unread input: resetting the connection");
        }
        if unread || linger.is_some_and(|t| t.is_zero()) {
            let _ = stream.abort();
            drop(stream);
            reap();
            return;
        }
        if let Some(t) = linger {
            if stream.phase() == Phase::Established {
                let _ = stream.shutdown_write();
                if !linger_wait(&mut stream, Instant::now() + t) {
                    reap();
                    return;
                }
            }
        }
        if stream.phase() == Phase::Established {
            let _ = stream.shutdown_write();
            linger::keep(stream, inner.eof);
        }
    }
    reap();
}

// ---------------------------------------------------------------------------------------
// streams

/// Readiness bits in `poll` terms (`POLLIN` etc. equal the `EPOLL*` values).
pub(crate) type Events = i16;

impl StreamSock {
    pub(crate) fn new(
        stream: Stream,
        common_domain: c_int,
        nonblock: bool,
        opts: Opts,
        ring_size: usize,
    ) -> StreamSock {
        let evfd = stream.as_raw_fd();
        StreamSock {
            common: Common::new(common_domain, nonblock, opts, evfd),
            inner: Mutex::new(StreamInner {
                stream,
                pending: Vec::new(),
                plen: 0,
                pos: 0,
                eof: false,
                read_shut: false,
                write_shut: false,
                so_error: None,
                reported: false,
                lost: false,
            }),
            ring_size,
        }
    }

    pub(crate) fn lock(&self) -> Counted<'_, StreamInner> {
        Counted::lock(&self.inner)
    }

    /// [`StreamSock::lock`] for a read or write: `EDEADLK` instead of waiting when this
    /// thread already holds socket locks (a signal handler's call, [`Counted::lock_io`]).
    fn lock_io(&self) -> Result<Counted<'_, StreamInner>, c_int> {
        Counted::lock_io(&self.inner)
    }

    /// One non-blocking attempt to fill `pending` from the ring. `Ok(true)`: readable
    /// (data, end of stream or error recorded). Leaves the eventfd readable iff readable.
    fn fill(&self, g: &mut StreamInner) -> bool {
        self.fill_with(g, true)
    }

    /// [`StreamSock::fill`]; with `drain` false an empty ring only registers interest and
    /// leaves the eventfd as it is (possibly readable without cause: see
    /// [`StreamSock::read_once_keep`]).
    fn fill_with(&self, g: &mut StreamInner, drain_evfd: bool) -> bool {
        if g.pos < g.plen || g.eof || g.read_shut || g.so_error.is_some() {
            return true;
        }
        g.plen = 0;
        g.pos = 0;
        if g.pending.len() < PROBE_BYTES {
            g.pending.resize(PROBE_BYTES, 0);
        }
        let mut r = g.stream.try_read(&mut g.pending);
        if drain_evfd && matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            // Drain, then re-check with interest registered: a signal raised after the
            // drain is not lost, and a readable socket re-signals below.
            drain(self.common.evfd);
            r = g.stream.try_read(&mut g.pending);
            if !matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                signal(self.common.evfd);
            }
        }
        match r {
            Ok(0) => {
                g.plen = 0;
                g.eof = true;
                true
            }
            Ok(n) => {
                g.plen = n;
                true
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                g.plen = 0;
                false
            }
            Err(e) => {
                g.plen = 0;
                g.so_error = Some(errno_of(&e));
                true
            }
        }
    }

    /// Non-blocking read into `bufs` (scatter). `peek` leaves the bytes in place.
    pub(crate) fn read_once(&self, bufs: &mut [&mut [u8]], peek: bool) -> Result<usize, c_int> {
        self.read_once_with(bufs, peek, true)
    }

    /// [`StreamSock::read_once`] for a program's non-blocking read: `EAGAIN` leaves the
    /// eventfd alone (no `read(2)` to drain it) and only registers interest at the engine.
    /// The eventfd may then stay readable with nothing to read; every wait that sleeps on
    /// it drains it first (blocking calls, `poll`/`select`), and `epoll` registers it
    /// edge-triggered in the kernel, where a stale count fires nothing.
    pub(crate) fn read_once_keep(
        &self,
        bufs: &mut [&mut [u8]],
        peek: bool,
    ) -> Result<usize, c_int> {
        self.read_once_with(bufs, peek, false)
    }

    fn read_once_with(
        &self,
        bufs: &mut [&mut [u8]],
        peek: bool,
        drain_evfd: bool,
    ) -> Result<usize, c_int> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut g = self.lock_io()?;
        if g.read_shut {
            return Ok(0);
        }
        if total == 0 {
            return Ok(0);
        }
        // Large reads with nothing pending go straight from the ring into the first buffer.
        if g.pos >= g.plen && !peek && !g.eof && g.so_error.is_none() && bufs[0].len() >= 4096 {
            let b0 = &mut *bufs[0];
            let mut r = g.stream.try_read(b0);
            if drain_evfd && matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                drain(self.common.evfd);
                r = g.stream.try_read(b0);
                if !matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                    signal(self.common.evfd);
                }
            }
            return match r {
                Ok(0) => {
                    g.eof = true;
                    Ok(0)
                }
                Ok(n) if n < b0.len() => Ok(n + Self::top_up(&mut g, &mut b0[n..])),
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(libc::EAGAIN),
                Err(e) => {
                    let n = errno_of(&e);
                    g.so_error = Some(n);
                    Err(n)
                }
            };
        }
        if !self.fill_with(&mut g, drain_evfd) {
            return Err(libc::EAGAIN);
        }
        if g.pos >= g.plen {
            if let Some(e) = g.so_error {
                if !peek {
                    g.so_error = None;
                    g.reported = true;
                }
                return Err(e);
            }
            return Ok(0);
        }
        let mut n = 0;
        let mut pos = g.pos;
        let mut last = (0, 0);
        for (i, b) in bufs.iter_mut().enumerate() {
            let take = b.len().min(g.plen - pos);
            b[..take].copy_from_slice(&g.pending[pos..pos + take]);
            pos += take;
            n += take;
            last = (i, take);
            if pos == g.plen {
                break;
            }
        }
        if !peek {
            g.pos = pos;
            if pos == g.plen && n < total {
                let (i, off) = last;
                n += Self::top_up(&mut g, &mut bufs[i][off..]);
            }
        }
        Ok(n)
    }

    /// After a read that emptied the ring without filling the caller's buffer: read once
    /// more into `rest`. Either more bytes arrived, or the engine now knows the program
    /// waits for input and signals the descriptor when the next bytes come (programs with
    /// edge-triggered epoll, such as nginx, stop reading after a short read and rely on
    /// that edge).
    fn top_up(g: &mut StreamInner, rest: &mut [u8]) -> usize {
        if rest.is_empty() || g.eof || g.so_error.is_some() {
            return 0;
        }
        match g.stream.try_read(rest) {
            Ok(0) => {
                g.eof = true;
                0
            }
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                g.so_error = Some(errno_of(&e));
                0
            }
        }
    }

    /// Non-blocking write of `bufs` (gather): as many bytes as the ring takes.
    pub(crate) fn write_once(&self, bufs: &[&[u8]]) -> Result<usize, c_int> {
        let mut g = self.lock_io()?;
        if g.write_shut {
            return Err(libc::EPIPE);
        }
        let mut n = 0;
        for b in bufs {
            if b.is_empty() {
                continue;
            }
            match g.stream.try_write(b) {
                Ok(k) => {
                    n += k;
                    if k < b.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if n > 0 {
                        break;
                    }
                    if g.stream.phase() == Phase::Connecting {
                        return Err(libc::EAGAIN);
                    }
                    // The ring was full when interest was registered; keep the eventfd's
                    // readable state honest for the read side (see the module docs).
                    drain(self.common.evfd);
                    match g.stream.try_write(b) {
                        Ok(k) => {
                            n += k;
                            signal(self.common.evfd);
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            let readable = g.pos < g.plen || g.eof;
                            if readable || self.fill(&mut g) {
                                signal(self.common.evfd);
                            }
                            return Err(libc::EAGAIN);
                        }
                        Err(e) => return Err(errno_of(&e)),
                    }
                }
                Err(e) => {
                    if n > 0 {
                        break;
                    }
                    return Err(errno_of(&e));
                }
            }
        }
        Ok(n)
    }

    /// `true` if a write would make progress now.
    fn writable(&self, g: &StreamInner) -> bool {
        g.stream.phase() == Phase::Established
            && !g.write_shut
            && g.stream.tx_queued() < self.ring_size
    }

    /// Current readiness for `want` (`POLLIN`/`POLLOUT`); error and hang-up always.
    pub(crate) fn readiness(&self, want: Events) -> Events {
        self.readiness_with(want, true)
    }

    fn readiness_with(&self, want: Events, drain_evfd: bool) -> Events {
        let mut g = self.lock();
        let mut ev = 0;
        let phase = g.stream.phase();
        if let Some(e) = g.stream.error() {
            if g.so_error.is_none() && !g.reported {
                g.so_error = Some(errno_of(&e.to_io()));
            }
            return libc::POLLERR | libc::POLLHUP | libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP;
        }
        if (want & libc::POLLIN != 0 || phase == Phase::Closed)
            && self.fill_with(&mut g, drain_evfd)
        {
            ev |= libc::POLLIN;
            if g.eof {
                ev |= libc::POLLRDHUP;
            }
        }
        if g.so_error.is_some() {
            ev |= libc::POLLERR;
        }
        if want & libc::POLLOUT != 0 && self.writable(&g) {
            ev |= libc::POLLOUT;
        }
        if phase == Phase::Closed {
            if g.eof {
                ev |= libc::POLLHUP;
            }
            ev |= libc::POLLOUT;
        }
        ev
    }

    /// Cheap check (no syscall, no copy) whether a read may make progress now: buffered
    /// bytes, bytes in the ring, or a state change to report. For spinning readers.
    pub(crate) fn read_hint(&self) -> bool {
        // Taken: let the read itself say why (`EDEADLK`).
        let Ok(g) = self.lock_io() else {
            return true;
        };
        g.pos < g.plen || g.eof || g.read_shut || g.so_error.is_some() || g.stream.rx_ready()
    }

    /// Bytes readable without blocking (`FIONREAD`).
    pub(crate) fn available(&self) -> usize {
        let mut g = self.lock();
        self.fill(&mut g);
        g.plen - g.pos.min(g.plen)
    }

    /// Bytes waiting in the shim's own buffer (no probe of the ring).
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        let g = self.lock();
        g.plen - g.pos.min(g.plen)
    }

    /// `true` if bytes or end of stream wait in the shim's buffer (cheap, no probe).
    pub(crate) fn available_cached(&self) -> bool {
        let g = self.lock();
        g.pos < g.plen || g.eof
    }

    /// Bytes written but not yet taken by the engine (in the send ring).
    pub(crate) fn tx_pending(&self) -> bool {
        self.lock().stream.tx_queued() > 0
    }

    /// At exit, before waiting: the process's close of the connection. Unread input
    /// resets it (RFC 2525 §2.17, [`discard_unread`]); otherwise FIN after the queued
    /// data.
    pub(crate) fn close_at_exit(&self) {
        let mut g = self.lock();
        if g.stream.phase() != Phase::Established {
            return;
        }
        if discard_unread(&mut g) {
            let _ = g.stream.abort();
        } else {
            g.write_shut = true;
            let _ = g.stream.shutdown_write();
        }
    }

    /// At exit: how far the close got (input arriving now resets the connection).
    pub(crate) fn closing(&self) -> Closing {
        let mut g = self.lock();
        let eof = g.eof;
        let (c, eof) = closing(&mut g.stream, eof);
        g.eof = eof;
        c
    }

    /// Give back bytes taken from the connection that nobody read (a fork relay whose
    /// child closed its copy): they are served before anything else, and count as unread
    /// input for the last close.
    pub(crate) fn unread(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut g = self.lock();
        let mut v = Vec::with_capacity((bytes.len() + g.plen - g.pos.min(g.plen)).max(PROBE_BYTES));
        v.extend_from_slice(bytes);
        if g.pos < g.plen {
            let (pos, plen) = (g.pos, g.plen);
            v.extend_from_slice(&g.pending[pos..plen]);
        }
        let n = v.len();
        v.resize(n.max(PROBE_BYTES), 0);
        g.pending = v;
        g.plen = n;
        g.pos = 0;
        drop(g);
        // Readable now: keep the descriptor's invariant.
        signal(self.common.evfd);
    }

    /// Input was lost before anybody read it (a fork relay's child closed its copy with
    /// bytes still in its socket): the last close resets the connection.
    pub(crate) fn input_lost(&self) {
        self.lock().lost = true;
    }

    /// `shutdown(SHUT_WR)`: FIN after the queued data; later writes fail with `EPIPE`.
    /// Wakes readers and writers waiting on the descriptor.
    pub(crate) fn shutdown_write(&self) -> Result<(), c_int> {
        let mut g = self.lock();
        if !g.write_shut {
            g.write_shut = true;
            g.stream.shutdown_write().map_err(|e| errno_of(&e))?;
        }
        drop(g);
        signal(self.common.evfd);
        Ok(())
    }

    /// (local, peer) addresses once established.
    pub(crate) fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        let g = self.lock();
        (g.stream.local_addr(), g.stream.peer_addr())
    }

    /// Bytes written but not yet taken by the engine.
    pub(crate) fn unsent(&self) -> usize {
        self.lock().stream.tx_queued()
    }
}

// ---------------------------------------------------------------------------------------
// listeners

impl ListenerSock {
    pub(crate) fn new(ls: ListenSocket, domain: c_int, nonblock: bool, opts: Opts) -> ListenerSock {
        let evfd = ls.as_raw_fd();
        ListenerSock {
            common: Common::new(domain, nonblock, opts, evfd),
            ls,
            queue: Mutex::new(VecDeque::new()),
        }
    }

    fn queue(&self) -> MutexGuard<'_, VecDeque<Stream>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn poll_one(&self, q: &mut VecDeque<Stream>, drain_evfd: bool) -> Result<bool, c_int> {
        if !q.is_empty() {
            return Ok(true);
        }
        let mut r = self.ls.try_accept();
        if drain_evfd && matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            drain(self.common.evfd);
            r = self.ls.try_accept();
            if r.is_ok() {
                signal(self.common.evfd);
            }
        }
        match r {
            Ok(s) => {
                q.push_back(s);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(errno_of(&e)),
        }
    }

    /// Take one established connection without blocking.
    pub(crate) fn accept_once(&self) -> Result<Stream, c_int> {
        self.accept_once_with(true)
    }

    /// [`ListenerSock::accept_once`] for a program's non-blocking `accept`: `EAGAIN`
    /// leaves the eventfd alone (see [`StreamSock::read_once_keep`]).
    pub(crate) fn accept_once_keep(&self) -> Result<Stream, c_int> {
        self.accept_once_with(false)
    }

    fn accept_once_with(&self, drain_evfd: bool) -> Result<Stream, c_int> {
        let mut q = self.queue();
        if self.poll_one(&mut q, drain_evfd)? {
            // A second queued connection keeps the descriptor readable.
            let s = q.pop_front().ok_or(libc::EAGAIN)?;
            if !q.is_empty() {
                signal(self.common.evfd);
            }
            return Ok(s);
        }
        Err(libc::EAGAIN)
    }

    /// Readiness: `POLLIN` when a connection is queued.
    pub(crate) fn readiness(&self) -> Events {
        self.readiness_with(true)
    }

    fn readiness_with(&self, drain_evfd: bool) -> Events {
        let mut q = self.queue();
        match self.poll_one(&mut q, drain_evfd) {
            Ok(true) => libc::POLLIN,
            Ok(false) => 0,
            Err(_) => libc::POLLERR | libc::POLLIN,
        }
    }
}

/// Readiness of any xwarp socket for `want`. Drains the eventfd of a socket found not
/// ready (for waits that then sleep on it: `poll`, `select`).
pub(crate) fn readiness(s: &Sock, want: Events) -> Events {
    match s {
        Sock::Bound(_) => 0,
        Sock::Listener(l) => l.readiness(),
        Sock::Stream(st) => st.readiness(want),
    }
}

/// [`readiness`] that leaves the eventfd alone (no `read(2)`), for `epoll`: the kernel
/// holds the eventfds edge-triggered, so a stale count wakes nothing (`epoll.rs`).
pub(crate) fn readiness_keep(s: &Sock, want: Events) -> Events {
    match s {
        Sock::Bound(_) => 0,
        Sock::Listener(l) => l.readiness_with(false),
        Sock::Stream(st) => st.readiness_with(want, false),
    }
}

#[cfg(test)]
pub(crate) mod tests;
