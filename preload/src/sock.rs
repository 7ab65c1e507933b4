//! xwarp sockets behind program-visible descriptors, and the fd → socket table.
//!
//! Every xwarp socket's identity is a real kernel descriptor: a `dup` of its readiness
//! eventfd placed at the number the program sees. The eventfd is kept **readable while the
//! socket may be readable** (it is drained only right before an operation that then
//! re-checks and registers interest with the engine), so `poll`, `select` and `epoll` on it
//! work natively and spurious readiness is possible but a lost wakeup is not. The shim's
//! own `poll`/`select`/`epoll_wait` then compute the exact readiness.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use libc::c_int;
use xwarp_stack::{socket_buffer_size, KeepAlive, ListenSocket, Phase, SocketOptions, Stream};

use crate::engine::{xlog, GENERATION};
use crate::real;

/// Largest sleep of a blocking call before it re-checks (bounds the cost of a wakeup
/// consumed by another thread sharing the socket's eventfd).
pub(crate) const MAX_SLEEP: Duration = Duration::from_millis(50);

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

/// `SO_RCVBUF`/`SO_SNDBUF` values (as requested) set on kernel TCP sockets that may still
/// move to the engine: the kernel clamps them to `rmem_max`/`wmem_max` and cannot tell
/// an explicit value from its default, so the shim remembers what the program asked.
static PRE_BUFFERS: Mutex<BTreeMap<RawFd, Buffers>> = Mutex::new(BTreeMap::new());

/// Remember a buffer size the program set on kernel socket `fd`.
pub(crate) fn remember_buffer(fd: RawFd, rcv: bool, requested: c_int) {
    let v = socket_buffer_size(requested.max(0) as usize);
    let mut t = PRE_BUFFERS.lock().unwrap_or_else(|p| p.into_inner());
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
    if PRE_COUNT.load(Ordering::Acquire) == 0 {
        return (None, None);
    }
    let mut t = PRE_BUFFERS.lock().unwrap_or_else(|p| p.into_inner());
    match t.remove(&fd) {
        Some(v) => {
            PRE_COUNT.fetch_sub(1, Ordering::Release);
            v
        }
        None => (None, None),
    }
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

    pub(crate) fn opts(&self) -> MutexGuard<'_, Opts> {
        self.opts.lock().unwrap_or_else(|p| p.into_inner())
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

static LIVE: AtomicUsize = AtomicUsize::new(0);
static TABLE: RwLock<BTreeMap<RawFd, Arc<Sock>>> = RwLock::new(BTreeMap::new());

/// The socket behind `fd`, if it is one of the shim's.
pub(crate) fn lookup(fd: RawFd) -> Option<Arc<Sock>> {
    if LIVE.load(Ordering::Acquire) == 0 || fd < 0 {
        return None;
    }
    TABLE
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&fd)
        .cloned()
}

/// `true` if any descriptor is the shim's (fast path for kernel-only programs).
pub(crate) fn any() -> bool {
    LIVE.load(Ordering::Acquire) != 0
}

/// Make `fd` refer to `sock`.
pub(crate) fn insert(fd: RawFd, sock: Arc<Sock>) {
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    if t.insert(fd, sock).is_none() {
        LIVE.fetch_add(1, Ordering::Release);
    }
}

/// Forget `fd`; returns what it was.
pub(crate) fn remove(fd: RawFd) -> Option<Arc<Sock>> {
    if !any() {
        return None;
    }
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    let r = t.remove(&fd);
    if r.is_some() {
        LIVE.fetch_sub(1, Ordering::Release);
    }
    r
}

/// The table, write-locked (the fork handlers hold it across `fork`, so the child's copy
/// is consistent: no other thread can be half-way through an update).
pub(crate) type TableGuard = std::sync::RwLockWriteGuard<'static, BTreeMap<RawFd, Arc<Sock>>>;

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
    r
}

/// Every stream in the table (for the exit flush).
pub(crate) fn all_streams() -> Vec<Arc<Sock>> {
    TABLE
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .filter(|s| matches!(***s, Sock::Stream(_)))
        .cloned()
        .collect()
}

// ---------------------------------------------------------------------------------------
// closed connections that may still have bytes to deliver

/// How long a closed connection may take to finish its close before it is handed to the
/// engine's own FIN timeout.
const LINGER_LIMIT: Duration = Duration::from_secs(60);

/// A connection the program closed, kept until its close finished.
#[derive(Debug)]
pub(crate) struct Lingering {
    stream: Stream,
    /// When the program closed it.
    since: Instant,
    /// The peer's FIN arrived: no more input can come, nothing to watch for.
    eof: bool,
}

/// Connections the program closed: FIN is queued after their data; they are kept until the
/// engine reports them closed, so `exit` can wait for their data like the kernel would,
/// and so input arriving after the close resets them (RFC 2525 §2.17, as Linux does for an
/// orphaned socket).
static LINGER: Mutex<Vec<Lingering>> = Mutex::new(Vec::new());

/// [`LINGER`], locked (the fork handlers hold it across `fork`, see [`lock_lingering`]).
pub(crate) type LingerGuard = MutexGuard<'static, Vec<Lingering>>;

/// Lock the list of lingering connections. The fork prepare handler takes it last (after
/// the relay's books, the relayed map and the table): the watcher holds it for a whole
/// round, so a `fork` in the middle of one would otherwise leave the child a list locked
/// by a thread that does not exist there. Lock order: nothing that holds the list takes
/// the books, the relayed map or the table (under it there are only engine calls).
pub(crate) fn lock_lingering() -> LingerGuard {
    LINGER.lock().unwrap_or_else(|p| p.into_inner())
}

/// How far a closed (or closing-at-exit) connection got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closing {
    /// Closed, failed or reset: nothing left to do.
    Done,
    /// End of stream received and every byte handed to the engine: only the final
    /// handshake (or TIME-WAIT) remains.
    Quiet,
    /// Data or the peer's FIN still outstanding.
    Busy,
}

/// What a look at a closed connection's input found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    /// Nothing new (and no end of stream yet).
    Nothing,
    /// Data bytes (some discarded: the connection is about to be reset).
    Data,
    /// End of stream and no data before it.
    Eof,
    /// The connection failed.
    Failed,
}

/// Look at `s`'s receive ring: one read (discarding what it got: any data means the
/// connection is reset, so the rest does not matter). With nothing there the read
/// registered interest, so the readiness descriptor fires when input arrives.
fn read_input(s: &mut Stream) -> Input {
    let mut scratch = [0u8; 512];
    match s.try_read(&mut scratch) {
        Ok(0) => Input::Eof,
        Ok(_) => Input::Data,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Input::Nothing,
        Err(_) => Input::Failed,
    }
}

/// One look at a connection the program closed: input that arrives after the close resets
/// it (Linux: data for an orphaned socket in FIN-WAIT → RST, `tcp_rcv_state_process`;
/// RFC 2525 §2.17); otherwise how far the close got. Returns the state and whether the
/// peer's end of stream was seen.
fn closing(s: &mut Stream, eof_seen: bool) -> (Closing, bool) {
    let input = if eof_seen { Input::Eof } else { read_input(s) };
    match input {
        Input::Data => {
            xlog!(Debug, "input after close: resetting the connection");
            let _ = s.abort();
            return (Closing::Done, false);
        }
        Input::Failed => return (Closing::Done, false),
        Input::Nothing | Input::Eof => {}
    }
    let eof = input == Input::Eof;
    let c = if s.phase() == Phase::Closed || s.error().is_some() {
        Closing::Done
    } else if eof && s.tx_queued() == 0 {
        Closing::Quiet
    } else {
        Closing::Busy
    };
    (c, eof)
}

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
            let mut l = lock_lingering();
            l.push(Lingering {
                stream,
                since: Instant::now(),
                eof: inner.eof,
            });
            // Under the lock: a `fork` (whose prepare handler takes it) never sees the
            // watcher half-started.
            watch_lingering();
            drop(l);
        }
    }
    reap();
}

/// Block until `stream`'s FIN is acknowledged, it failed or closed, or `deadline`.
/// `false` if it was reset meanwhile (input arrived) or is done.
fn linger_wait(stream: &mut Stream, deadline: Instant) -> bool {
    let mut eof = false;
    loop {
        if stream.fin_acked() || stream.error().is_some() || stream.phase() == Phase::Closed {
            return true;
        }
        // Input arriving now resets the connection, as on Linux.
        let (c, e) = closing(stream, eof);
        eof = e;
        if c == Closing::Done {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        let _ = stream.wait(Some(deadline.min(now + MAX_SLEEP)));
    }
}

/// Wake descriptor of this process's lingering-connection watcher: `-1` not started,
/// `-2` being started.
static WATCH_WAKE: AtomicI32 = AtomicI32::new(-1);

/// Longest sleep of the watcher (bounds how late a finished close is forgotten).
const WATCH_SLEEP: Duration = Duration::from_secs(1);

/// Shortest time between two watcher rounds (bounds its cost when many closed
/// connections keep firing).
const WATCH_MIN_ROUND: Duration = Duration::from_millis(2);

/// A connection was added to [`LINGER`] (held by the caller): make sure a thread watches
/// the lingering connections, so input arriving after a close resets the connection
/// promptly even when the program makes no further socket call.
fn watch_lingering() {
    let w = WATCH_WAKE.load(Ordering::SeqCst);
    if w >= 0 {
        signal(w);
        return;
    }
    if w == -2
        || WATCH_WAKE
            .compare_exchange(-1, -2, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
    {
        return;
    }
    // SAFETY: plain descriptor creation.
    let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if wake < 0 {
        xlog!(
            Warn,
            "cannot watch closed connections (eventfd: {}); input after a close is noticed at the next close",
            io::Error::last_os_error()
        );
        WATCH_WAKE.store(-1, Ordering::SeqCst);
        return;
    }
    let r = spawn_with_signals_blocked("xwarp-linger", move || watcher(wake));
    match r {
        Ok(_) => WATCH_WAKE.store(wake, Ordering::SeqCst),
        Err(e) => {
            xlog!(
                Warn,
                "cannot watch closed connections ({e}); input after a close is noticed at the next close"
            );
            // SAFETY: our descriptor.
            unsafe { real::close(wake) };
            WATCH_WAKE.store(-1, Ordering::SeqCst);
        }
    }
}

/// The watcher thread: sleep on the readiness descriptors of lingering connections that
/// may still receive input, then look at those that fired ([`reap_fired`]), with a full
/// pass at least every [`WATCH_SLEEP`].
fn watcher(wake: RawFd) {
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut fired: Vec<RawFd> = Vec::new();
    let mut last_full = Instant::now();
    loop {
        fds.clear();
        fds.push(libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        });
        let any = {
            let l = lock_lingering();
            for c in l.iter().filter(|c| !c.eof) {
                fds.push(libc::pollfd {
                    fd: c.stream.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            !l.is_empty()
        };
        let ms = if any {
            WATCH_SLEEP.as_millis() as c_int
        } else {
            -1
        };
        // SAFETY: our vector of pollfds. A descriptor closed meanwhile (its connection
        // reaped by another thread) only causes an early, harmless wakeup.
        unsafe { real::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if fds[0].revents != 0 {
            drain(wake);
        }
        fired.clear();
        fired.extend(fds[1..].iter().filter(|p| p.revents != 0).map(|p| p.fd));
        fired.sort_unstable();
        let t = Instant::now();
        // Input after a close always fires the connection's descriptor (the last look
        // registered interest), so between full passes only those that fired need a look.
        // The full pass is still needed: a close that finished (FIN acknowledged, TIME-WAIT
        // over, failed), one past `LINGER_LIMIT`, and one whose peer's FIN arrived (no
        // longer polled) fire nothing, and must still be forgotten (dropped: the engine
        // frees the connection); `WATCH_SLEEP` bounds how late.
        let full = any && t.duration_since(last_full) >= WATCH_SLEEP;
        if full {
            last_full = t;
        }
        if full || !fired.is_empty() {
            reap_fired(&fired, full);
        }
        std::thread::sleep(WATCH_MIN_ROUND.saturating_sub(t.elapsed()));
    }
}

/// In the child after `fork`, with the list the prepare handler locked: the lingering
/// connections belong to the parent's engine. Forget them without dropping (a drop would
/// talk to an engine that does not exist here). The parent's watcher thread does not
/// exist here either: the next lingering close starts one for this process.
pub(crate) fn forget_lingering_after_fork(l: &mut LingerGuard) {
    std::mem::forget(std::mem::take(&mut **l));
    let w = WATCH_WAKE.swap(-1, Ordering::SeqCst);
    if w >= 0 {
        // SAFETY: raw syscall (async-signal-safe) on the parent watcher's descriptor.
        unsafe { libc::syscall(libc::SYS_close, w as libc::c_long) };
    }
}

/// Drop lingering connections that finished (or waited too long), reset those that
/// received input after their close; returns how many remain that still move data
/// (`Busy`).
pub(crate) fn reap() -> usize {
    // The callers other than the watcher leave draining the descriptors to it.
    reap_fired(&[], true)
}

/// Look at the lingering connections whose readiness descriptor is in `fired` (sorted;
/// the watcher's): drained, then looked at (drained first: input arriving after the look
/// fires again). `all`: look at the others too (without draining them). Returns how many
/// of those looked at still move data.
fn reap_fired(fired: &[RawFd], all: bool) -> usize {
    let mut l = lock_lingering();
    if l.is_empty() {
        return 0;
    }
    let now = Instant::now();
    let mut busy = 0;
    l.retain_mut(|c| {
        let fd = c.stream.as_raw_fd();
        let hit = !c.eof && fired.binary_search(&fd).is_ok();
        if hit {
            drain(fd);
        } else if !all {
            return true;
        }
        let (state, eof) = closing(&mut c.stream, c.eof);
        c.eof = eof;
        if state == Closing::Busy {
            busy += 1;
        }
        state != Closing::Done && now.duration_since(c.since) < LINGER_LIMIT
    });
    busy
}

// ---------------------------------------------------------------------------------------
// errno helpers

/// The errno for an `io::Error` from the engine.
pub(crate) fn errno_of(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock => libc::EAGAIN,
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::ConnectionReset => libc::ECONNRESET,
        K::ConnectionAborted => libc::ECONNABORTED,
        K::TimedOut => libc::ETIMEDOUT,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::InvalidInput => libc::EINVAL,
        K::BrokenPipe => libc::EPIPE,
        K::NotConnected => libc::ENOTCONN,
        K::Interrupted => libc::EINTR,
        _ => libc::EIO,
    }
}

/// Set errno.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

fn drain(fd: RawFd) {
    let mut b = [0u8; 8];
    // SAFETY: reading 8 bytes into a local buffer from a non-blocking eventfd.
    unsafe { real::read(fd, b.as_mut_ptr().cast(), 8) };
}

fn signal(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a local buffer to an eventfd.
    unsafe { real::write(fd, one.as_ptr().cast(), 8) };
}

/// Sleep until `fd` is readable, `deadline` passes, `cap` elapses or a signal arrives
/// (`Err(EINTR)`).
pub(crate) fn wait_readable(
    fd: RawFd,
    deadline: Option<Instant>,
    cap: Duration,
) -> Result<(), c_int> {
    let mut left = cap;
    if let Some(d) = deadline {
        left = left.min(d.saturating_duration_since(Instant::now()));
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = left.as_millis().max(1).min(i32::MAX as u128) as c_int;
    // SAFETY: one valid pollfd.
    let r = unsafe { real::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if e == libc::EINTR {
            return Err(libc::EINTR);
        }
    }
    Ok(())
}

/// After a signal interrupted a blocking call: restart it (`true`) like the kernel does
/// for `SA_RESTART` handlers. The interrupting signal is not known here, so the call is
/// restarted only if every installed handler has `SA_RESTART`.
pub(crate) fn restart_after_signal() -> bool {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: all-zero is a valid sigaction to be overwritten.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: query only (null new action).
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        let h = old.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN && old.sa_flags & libc::SA_RESTART == 0 {
            return false;
        }
    }
    true
}

/// Start a shim thread named `name` running `f` with every signal blocked: a thread
/// inherits the mask of the thread that creates it, and the program's signal handlers
/// must run on the program's own threads, as without the shim.
pub(crate) fn spawn_with_signals_blocked<F>(
    name: &str,
    f: F,
) -> io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // SAFETY: all-zero sigsets are valid to be filled.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: plain signal-mask calls on local sets.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let r = std::thread::Builder::new().name(name.into()).spawn(f);
    // SAFETY: restoring this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// One round of a spinning wait: `sched_yield` with `XWARP_YIELD=1` (the core goes to
/// any other runnable thread, such as the engine or a local peer, and comes straight back
/// when there is none), else a CPU spin hint.
pub(crate) fn spin_pause() {
    if crate::engine::config().is_some_and(|c| c.yield_spin) {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    } else {
        std::hint::spin_loop();
    }
}

/// Run `op` until it stops saying `EAGAIN`: spin for `spin`, then sleep on `fd`. A signal
/// ends the call with `EINTR` unless it is restarted ([`restart_after_signal`]; never
/// with a timeout, as the kernel does for `SO_RCVTIMEO`/`SO_SNDTIMEO`).
pub(crate) fn block<T>(
    fd: RawFd,
    spin: Duration,
    timeout: Option<Duration>,
    op: impl FnMut() -> Result<T, c_int>,
) -> Result<T, c_int> {
    block_hinted(fd, spin, timeout, || true, op)
}

/// [`block`] with a cheap, syscall-free `hint` polled while spinning: `op` runs again
/// only once `hint` says it may make progress (or the spin budget ran out and the call
/// is about to sleep). `op` itself may cost syscalls (a failed read drains the eventfd).
pub(crate) fn block_hinted<T>(
    fd: RawFd,
    spin: Duration,
    timeout: Option<Duration>,
    hint: impl Fn() -> bool,
    mut op: impl FnMut() -> Result<T, c_int>,
) -> Result<T, c_int> {
    let start = Instant::now();
    let deadline = timeout.map(|t| start + t);
    let spin_end = start + spin;
    loop {
        match op() {
            Err(libc::EAGAIN) => {}
            r => return r,
        }
        let mut now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(libc::EAGAIN);
        }
        if now < spin_end {
            spin_pause();
            while !hint() {
                now = Instant::now();
                if now >= spin_end || deadline.is_some_and(|d| now >= d) {
                    break;
                }
                spin_pause();
            }
            continue;
        }
        match wait_readable(fd, deadline, MAX_SLEEP) {
            Err(libc::EINTR) if timeout.is_none() && restart_after_signal() => {}
            r => r?,
        }
    }
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

    pub(crate) fn lock(&self) -> MutexGuard<'_, StreamInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One non-blocking attempt to fill `pending` from the ring. `Ok(true)`: readable
    /// (data, end of stream or error recorded). Leaves the eventfd readable iff readable.
    fn fill(&self, g: &mut StreamInner) -> bool {
        if g.pos < g.plen || g.eof || g.read_shut || g.so_error.is_some() {
            return true;
        }
        g.plen = 0;
        g.pos = 0;
        if g.pending.len() < PROBE_BYTES {
            g.pending.resize(PROBE_BYTES, 0);
        }
        let mut r = g.stream.try_read(&mut g.pending);
        if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
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
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut g = self.lock();
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
            if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
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
        if !self.fill(&mut g) {
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
        let mut g = self.lock();
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
        let mut g = self.lock();
        let mut ev = 0;
        let phase = g.stream.phase();
        if let Some(e) = g.stream.error() {
            if g.so_error.is_none() && !g.reported {
                g.so_error = Some(errno_of(&e.to_io()));
            }
            return libc::POLLERR | libc::POLLHUP | libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP;
        }
        if (want & libc::POLLIN != 0 || phase == Phase::Closed) && self.fill(&mut g) {
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
        let g = self.lock();
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

    fn poll_one(&self, q: &mut VecDeque<Stream>) -> Result<bool, c_int> {
        if !q.is_empty() {
            return Ok(true);
        }
        let mut r = self.ls.try_accept();
        if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
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
        let mut q = self.queue();
        if self.poll_one(&mut q)? {
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
        let mut q = self.queue();
        match self.poll_one(&mut q) {
            Ok(true) => libc::POLLIN,
            Ok(false) => 0,
            Err(_) => libc::POLLERR | libc::POLLIN,
        }
    }
}

/// Readiness of any xwarp socket for `want`.
pub(crate) fn readiness(s: &Sock, want: Events) -> Events {
    match s {
        Sock::Bound(_) => 0,
        Sock::Listener(l) => l.readiness(),
        Sock::Stream(st) => st.readiness(want),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The readiness-descriptor invariants over two engines joined by the virtual wire
    //! (no root needed).
    use super::*;
    use std::net::Ipv4Addr;
    use xwarp_poll_driver::engine::{Engine, EngineConfig, EngineHandle};
    use xwarp_poll_driver::vwire::{VirtualNic, VirtualWire, WireConfig};
    use xwarp_stack::{new_stack, StackConfig, StackHandle, TcpService};

    /// One engine over the virtual wire.
    pub(crate) struct End {
        stack: StackHandle,
        _engine: EngineHandle<VirtualNic, TcpService>,
    }

    pub(crate) fn pair() -> (End, End) {
        let (a, b) = VirtualWire::pair(WireConfig::default()).unwrap();
        let start = |nic: VirtualNic, last: u8| {
            let cfg = StackConfig {
                mac: [0x02, 0x78, 0x70, 0, 0, last],
                ipv4: Some((Ipv4Addr::new(10, 79, 0, last), 24)),
                ..StackConfig::default()
            };
            let (service, stack) = new_stack(cfg).unwrap();
            let engine = Engine::spawn(EngineConfig::default(), nic, service).unwrap();
            let bell = engine.doorbell();
            stack.set_kick(Arc::new(move || bell.ring()));
            End {
                stack,
                _engine: engine,
            }
        };
        (start(a, 1), start(b, 2))
    }

    /// `true` if `fd` polls readable within `ms`.
    fn fd_readable(fd: RawFd, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }

    /// Two engines, a server-side `StreamSock` and the client `Stream` connected to it.
    /// `n` connections from `a` to a listener of `b` at `addr`: (server sockets, clients).
    pub(crate) fn accept_n(
        a: &End,
        b: &End,
        addr: SocketAddr,
        n: usize,
    ) -> (Vec<StreamSock>, Vec<Stream>) {
        let ls = b.stack.listen(addr, n, Duration::from_secs(5)).unwrap();
        let l = ListenerSock::new(ls, libc::AF_INET, true, Opts::default());
        let clients: Vec<Stream> = (0..n)
            .map(|_| a.stack.connect(addr, None, None).unwrap())
            .collect();
        let ring = b.stack.config().ring_size;
        let mut servers = Vec::with_capacity(n);
        let deadline = Instant::now() + Duration::from_secs(10);
        while servers.len() < n {
            match l.accept_once() {
                Ok(s) => servers.push(StreamSock::new(
                    s,
                    libc::AF_INET,
                    true,
                    Opts::default(),
                    ring,
                )),
                Err(libc::EAGAIN) => {
                    assert!(Instant::now() < deadline, "only {} accepted", servers.len());
                    fd_readable(l.common.evfd, 50);
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        (servers, clients)
    }

    pub(crate) fn connected() -> (End, End, StreamSock, Stream) {
        let (a, b) = pair();
        let addr = "10.79.0.2:7000".parse().unwrap();
        let ls = b.stack.listen(addr, 8, Duration::from_secs(5)).unwrap();
        let l = ListenerSock::new(ls, libc::AF_INET, true, Opts::default());
        assert_eq!(l.readiness(), 0, "no connection yet");
        let client = a.stack.connect(addr, None, None).unwrap();
        // The listener's descriptor fires once the connection is queued.
        assert!(fd_readable(l.common.evfd, 5000), "listener fd never fired");
        assert_eq!(l.readiness(), libc::POLLIN);
        let server = l.accept_once().unwrap();
        assert_eq!(l.accept_once().err(), Some(libc::EAGAIN));
        let ring = b.stack.config().ring_size;
        let st = StreamSock::new(server, libc::AF_INET, true, Opts::default(), ring);
        (a, b, st, client)
    }

    #[test]
    fn options_turn_into_engine_keepalive_linger_and_doubled_buffers() {
        let mut o = Opts::default();
        assert_eq!(o.keepalive_engine(), None);
        assert_eq!((o.keepidle(), o.keepintvl(), o.keepcnt()), (7200, 75, 9));
        o.keepalive = 1;
        o.keepidle = 10;
        o.keepcnt = 3;
        let k = o.keepalive_engine().unwrap();
        assert_eq!(k.idle, Duration::from_secs(10));
        assert_eq!(k.interval, Duration::from_secs(75));
        assert_eq!(k.dead_after(), Duration::from_secs(10 + 225));
        assert_eq!(o.linger_policy(), None);
        o.linger = (1, 0);
        assert_eq!(o.linger_policy(), Some(Duration::ZERO));
        o.linger = (1, 7);
        assert_eq!(o.linger_policy(), Some(Duration::from_secs(7)));
        // Buffer sizes set on a kernel socket are remembered doubled, once.
        remember_buffer(90_001, true, 8192);
        remember_buffer(90_001, false, 1);
        assert_eq!(take_buffers(90_001), (Some(16384), Some(4608)));
        assert_eq!(take_buffers(90_001), (None, None));
        o.rcvbuf = Some(16384);
        assert_eq!(o.engine().recv_buffer, Some(16384));
        assert_eq!(o.engine().keepalive, Some(k));
    }

    #[test]
    fn spinning_blocking_read_gets_bytes_through_the_hint_and_sleeps_after_the_budget() {
        let (_a, _b, st, mut client) = connected();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !client.poll_connect().unwrap() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!st.read_hint(), "hint with nothing to read");
        // A reader spinning for 2 s (on the hint, not on the eventfd) gets bytes written
        // while it spins.
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut buf = [0u8; 64];
                let n = block_hinted(
                    st.common.evfd,
                    Duration::from_secs(2),
                    Some(Duration::from_secs(5)),
                    || st.read_hint(),
                    || st.read_once(&mut [&mut buf[..]], false),
                )
                .unwrap();
                buf[..n].to_vec()
            });
            std::thread::sleep(Duration::from_millis(20));
            client.try_write(b"ping").unwrap();
            assert_eq!(reader.join().unwrap(), b"ping");
        });
        assert!(!st.read_hint(), "hint after the bytes were consumed");
        // Past a zero spin budget the read sleeps on the descriptor and still wakes for
        // new bytes; with nothing coming the timeout ends it with EAGAIN.
        let t = Instant::now();
        let mut buf = [0u8; 8];
        let r = block_hinted(
            st.common.evfd,
            Duration::ZERO,
            Some(Duration::from_millis(30)),
            || st.read_hint(),
            || st.read_once(&mut [&mut buf[..]], false),
        );
        assert_eq!(r, Err(libc::EAGAIN));
        assert!(t.elapsed() >= Duration::from_millis(30));
        client.try_write(b"pong").unwrap();
        let n = block_hinted(
            st.common.evfd,
            Duration::ZERO,
            Some(Duration::from_secs(5)),
            || st.read_hint(),
            || st.read_once(&mut [&mut buf[..]], false),
        )
        .unwrap();
        assert_eq!(&buf[..n], b"pong");
        // End of stream shows in the hint.
        client.shutdown_write().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !st.read_hint() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(st.read_hint(), "no hint for end of stream");
        assert_eq!(st.read_once(&mut [&mut buf[..]], false), Ok(0));
    }

    #[test]
    fn descriptor_is_readable_exactly_while_bytes_wait_and_wakes_on_new_bytes() {
        let (_a, _b, st, mut client) = connected();
        let evfd = st.common.evfd;
        // Nothing to read: the probe drains the descriptor and registers interest.
        assert_eq!(st.readiness(libc::POLLIN) & libc::POLLIN, 0);
        assert!(
            !fd_readable(evfd, 0),
            "descriptor readable with nothing to read"
        );
        // Bytes arrive: the descriptor fires by itself (no probe needed).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !client.poll_connect().unwrap() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        client.try_write(b"hello world").unwrap();
        assert!(fd_readable(evfd, 5000), "no wakeup for new bytes");
        assert!(st.readiness(libc::POLLIN) & libc::POLLIN != 0);
        // A partial read leaves the rest readable and the descriptor still readable
        // (level-triggered pollers must see it).
        let mut five = [0u8; 5];
        assert_eq!(st.read_once(&mut [&mut five[..]], false), Ok(5));
        assert_eq!(&five, b"hello");
        assert!(fd_readable(evfd, 0));
        // MSG_PEEK leaves the bytes in place.
        let mut peek = [0u8; 64];
        assert_eq!(st.read_once(&mut [&mut peek[..]], true), Ok(6));
        let mut rest = [0u8; 64];
        assert_eq!(st.read_once(&mut [&mut rest[..]], false), Ok(6));
        assert_eq!(&rest[..6], b" world");
        assert_eq!(st.read_once(&mut [&mut rest[..]], false), Err(libc::EAGAIN));
        assert!(!fd_readable(evfd, 0), "descriptor readable after EAGAIN");
        // A short read registered interest: the next bytes signal again (edge for nginx).
        client.try_write(b"again").unwrap();
        assert!(fd_readable(evfd, 5000), "no wakeup after a short read");
        let mut v = [0u8; 3];
        let mut w = [0u8; 8];
        assert_eq!(st.read_once(&mut [&mut v[..], &mut w[..]], false), Ok(5));
        assert_eq!((&v[..], &w[..2]), (&b"aga"[..], &b"in"[..]));
        // End of stream: readable with RDHUP, reads return 0.
        client.shutdown_write().unwrap();
        // As a poller does: sleep on the descriptor, re-check (wakeups may be spurious,
        // never lost).
        let deadline = Instant::now() + Duration::from_secs(5);
        let ev = loop {
            assert!(fd_readable(evfd, 5000), "no wakeup for the FIN");
            let ev = st.readiness(libc::POLLIN | libc::POLLOUT);
            if ev & libc::POLLIN != 0 || Instant::now() > deadline {
                break ev;
            }
        };
        assert!(
            ev & libc::POLLIN != 0 && ev & libc::POLLRDHUP != 0,
            "{ev:#x}"
        );
        assert!(
            ev & libc::POLLOUT != 0,
            "still writable after the peer's FIN"
        );
        assert_eq!(st.read_once(&mut [&mut rest[..]], false), Ok(0));
    }

    #[test]
    fn writes_report_eagain_when_the_ring_is_full_and_writability_returns() {
        let (_a, _b, st, mut client) = connected();
        assert!(st.readiness(libc::POLLOUT) & libc::POLLOUT != 0);
        // The client does not read: fill the server's ring and the TCP windows.
        let chunk = vec![0x5au8; 64 << 10];
        let mut sent = 0usize;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match st.write_once(&[&chunk]) {
                Ok(n) => sent += n,
                Err(libc::EAGAIN) => break,
                Err(e) => panic!("write: {e}"),
            }
            assert!(Instant::now() < deadline, "ring never filled");
        }
        assert!(sent >= st.ring_size, "only {sent} bytes queued");
        // Drain on the client; POLLOUT comes back.
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0usize;
        while got < sent {
            match client.try_read(&mut buf) {
                Ok(n) => {
                    assert!(buf[..n].iter().all(|&b| b == 0x5a));
                    got += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    client
                        .wait(Some(Instant::now() + Duration::from_secs(5)))
                        .unwrap();
                }
                Err(e) => panic!("read: {e}"),
            }
            assert!(
                Instant::now() < deadline + Duration::from_secs(10),
                "drain stalled"
            );
        }
        assert_eq!(got, sent);
        assert!(st.readiness(libc::POLLOUT) & libc::POLLOUT != 0);
    }

    /// This thread's signal mask.
    fn sigmask() -> libc::sigset_t {
        // SAFETY: all-zero is a valid sigset to be overwritten; query only.
        unsafe {
            let mut m: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut m);
            m
        }
    }

    #[test]
    fn shim_threads_block_every_signal_and_leave_the_callers_mask_alone() {
        let before = sigmask();
        // SAFETY: reading a sigset.
        let blocked = |m: &libc::sigset_t, sig| unsafe { libc::sigismember(m, sig) == 1 };
        let h = spawn_with_signals_blocked("xwarp-test", move || {
            let m = sigmask();
            assert!(
                [
                    libc::SIGINT,
                    libc::SIGTERM,
                    libc::SIGCHLD,
                    libc::SIGUSR1,
                    libc::SIGALRM
                ]
                .iter()
                .all(|&s| blocked(&m, s)),
                "a signal is not blocked on the shim's thread"
            );
            assert_eq!(std::thread::current().name(), Some("xwarp-test"));
        })
        .unwrap();
        h.join().expect("the spawned thread's checks failed");
        let after = sigmask();
        for sig in 1..libc::SIGRTMIN() {
            assert_eq!(
                blocked(&before, sig),
                blocked(&after, sig),
                "the caller's mask changed for signal {sig}"
            );
        }
    }

    /// Wait (bounded) until `f` holds.
    fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Write all of `data` on the client stream.
    fn client_write(client: &mut Stream, data: &[u8]) {
        let mut off = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while off < data.len() {
            match client.try_write(&data[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let _ = client.wait(Some(Instant::now() + Duration::from_millis(5)));
                }
                Err(e) => panic!("client write: {e}"),
            }
            assert!(Instant::now() < deadline, "client write stalled");
        }
    }

    /// Read on the client until end of stream or failure: the bytes and how it ended.
    fn client_read_to_end(client: &mut Stream) -> (Vec<u8>, io::Result<()>) {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match client.try_read(&mut buf) {
                Ok(0) => return (got, Ok(())),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let _ = client.wait(Some(Instant::now() + Duration::from_millis(5)));
                }
                Err(e) => return (got, Err(e)),
            }
            assert!(Instant::now() < deadline, "client read never ended");
        }
    }

    #[test]
    fn rfc2525_close_with_unread_input_in_the_shims_buffer_resets_the_connection() {
        let (_a, _b, st, mut client) = connected();
        client_write(&mut client, b"request nobody reads");
        // A readiness probe moved the bytes into the shim's own buffer.
        wait_for("the request", Duration::from_secs(5), || {
            st.available() == 20
        });
        retire(Arc::new(Sock::Stream(st)));
        let (got, end) = client_read_to_end(&mut client);
        assert!(got.is_empty());
        assert_eq!(
            end.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionReset),
            "the peer must learn that its request was not read"
        );
    }

    #[test]
    fn rfc2525_close_with_unread_input_in_the_ring_resets_even_with_a_linger_timeout() {
        let (_a, _b, st, mut client) = connected();
        // SO_LINGER {1, 5}: Linux still resets at once when input is unread.
        st.common.opts().linger = (1, 5);
        client_write(&mut client, &[7u8; 3000]);
        wait_for("the bytes in the ring", Duration::from_secs(5), || {
            st.lock().stream.rx_ready()
        });
        let t = Instant::now();
        retire(Arc::new(Sock::Stream(st)));
        assert!(t.elapsed() < Duration::from_secs(2), "close lingered");
        let (_, end) = client_read_to_end(&mut client);
        assert_eq!(
            end.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionReset)
        );
    }

    #[test]
    fn rfc2525_close_after_reading_everything_sends_the_data_then_fin() {
        let (_a, _b, st, mut client) = connected();
        client_write(&mut client, b"GET /");
        let mut req = [0u8; 5];
        wait_for("the request", Duration::from_secs(5), || {
            st.read_once(&mut [&mut req[..]], false) == Ok(5)
        });
        assert_eq!(&req, b"GET /");
        let reply: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut off = 0;
        while off < reply.len() {
            match st.write_once(&[&reply[off..]]) {
                Ok(n) => off += n,
                Err(libc::EAGAIN) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("server write: {e}"),
            }
        }
        retire(Arc::new(Sock::Stream(st)));
        let (got, end) = client_read_to_end(&mut client);
        assert!(end.is_ok(), "clean close expected: {end:?}");
        assert_eq!(got.len(), reply.len());
        assert!(got == reply, "reply bytes differ");
    }

    #[test]
    fn rfc2525_input_arriving_after_the_close_resets_the_orphaned_connection() {
        let (_a, _b, st, mut client) = connected();
        retire(Arc::new(Sock::Stream(st)));
        // Nothing was unread: FIN.
        let (got, end) = client_read_to_end(&mut client);
        assert!(got.is_empty() && end.is_ok(), "{end:?}");
        assert!(client.error().is_none());
        // The peer sends after our FIN; the program makes no more socket calls: the
        // watcher resets the connection (Linux: data for an orphaned socket → RST).
        client_write(&mut client, b"too late");
        wait_for("the reset", Duration::from_secs(5), || {
            client.error().is_some()
        });
        assert_eq!(
            client.error().map(|e| e.to_io().kind()),
            Some(io::ErrorKind::ConnectionReset)
        );
    }
}

#[cfg(test)]
mod fork_tests {
    //! `fork` while the linger watcher is mid-round (the child must be able to exit).
    use super::tests::{accept_n, pair};
    use super::*;

    /// Wait (bounded) for child `pid`; its exit status, or `None` after `limit` (killed).
    fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<c_int> {
        let deadline = Instant::now() + limit;
        loop {
            let mut status: c_int = 0;
            // SAFETY: our own child; status is a local.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                return Some(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    -1
                });
            }
            if Instant::now() >= deadline {
                // SAFETY: our own child, stuck.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn fork_while_the_linger_watcher_is_mid_round_leaves_a_child_that_exits_promptly() {
        let (a, b) = pair();
        let addr: SocketAddr = "10.79.0.2:7100".parse().unwrap();
        // Lingering connections the peers neither read nor close (they stay on the list
        // and are looked at every round), plus some whose peers send after the close (the
        // watcher resets those while the forks go on).
        const STAYING: usize = 200;
        const LATE: usize = 24;
        let (servers, mut clients) = accept_n(&a, &b, addr, STAYING + LATE);
        for st in servers {
            retire(Arc::new(Sock::Stream(st)));
        }
        let stop = Arc::new(AtomicBool::new(false));
        // Keep the watcher going round: wake it constantly, and let input arrive on the
        // late ones one by one.
        let late: Vec<Stream> = clients.drain(STAYING..).collect();
        let s2 = stop.clone();
        let busy = std::thread::spawn(move || {
            let mut late = late;
            let mut n = 0u32;
            while !s2.load(Ordering::SeqCst) {
                let w = WATCH_WAKE.load(Ordering::SeqCst);
                if w >= 0 {
                    signal(w);
                }
                n += 1;
                if n.is_multiple_of(40) {
                    if let Some(mut c) = late.pop() {
                        let _ = c.try_write(b"too late");
                        // Kept until the end: the watcher resets it.
                        late.insert(0, c);
                    }
                }
                std::thread::sleep(Duration::from_micros(250));
            }
            late
        });
        assert!(
            WATCH_WAKE.load(Ordering::SeqCst) >= 0,
            "the watcher did not start"
        );
        for i in 0..400u32 {
            crate::fork::prepare();
            // SAFETY: fork; the child only runs the child handler, the shim's exit work
            // (reap) and `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                crate::fork::child();
                // What the child's `exit` does (flush_at_exit → reap), twice, as the
                // first close after it would.
                reap();
                reap();
                let code = if WATCH_WAKE.load(Ordering::SeqCst) == -1 {
                    0
                } else {
                    2
                };
                // SAFETY: leaving the forked child without running the test harness.
                unsafe { libc::_exit(code) };
            }
            crate::fork::parent();
            assert!(pid > 0, "fork: {}", io::Error::last_os_error());
            match wait_child(pid, Duration::from_secs(5)) {
                Some(0) => {}
                Some(2) => panic!("fork {i}: the child still thinks a watcher runs"),
                Some(c) => panic!("fork {i}: the child failed ({c})"),
                None => panic!(
                    "fork {i}: the child did not exit within 5 s (the lingering list stayed locked across fork?)"
                ),
            }
            // Sample different phases of the watcher's round.
            std::thread::sleep(Duration::from_micros(100 + (i as u64 % 7) * 300));
        }
        stop.store(true, Ordering::SeqCst);
        let late = busy.join().unwrap();
        drop((late, clients));
    }
}
