//! `fork`: engine connections inherited by a child keep working through a relay in the
//! parent.
//!
//! The engine is a thread of the process that started it; a child of `fork` does not have
//! it. So, around every `fork` (`pthread_atfork`):
//! * **prepare** (parent, before): for each live engine connection in the descriptor
//!   table (at most [`MAX_RELAYED_PER_FORK`]) make an `AF_UNIX` `SOCK_STREAM` socketpair.
//!   The table and the relay's books stay locked across the `fork`, so the child's copy is
//!   consistent.
//! * **child**: the child end goes to every descriptor number of the connection (`dup3`,
//!   `FD_CLOEXEC` of each kept; `O_NONBLOCK` is the program's view), the spare descriptors
//!   are closed, the table entry is dropped and the descriptor remembered as *relayed*
//!   ([`Relayed`]: the TCP addresses and options, for `getsockname`/`getpeername`/
//!   `getsockopt`/`setsockopt`). Everything else is the kernel's unix socket.
//! * **parent**: the child ends are closed and each parent end goes, with a reference to
//!   the connection, to the relay thread ([`Relay`], one per process, started on first
//!   use), which pumps bytes both ways with bounded buffers. The parent's own descriptor
//!   keeps working; its `close` does not close the connection while the relay serves the
//!   child (the relay holds a reference), and the last of the two closes it gracefully.
//!
//! Relay rules: engine end of stream → `shutdown(SHUT_WR)` on the unix end once the
//! buffered bytes are out; unix end of stream → the buffered bytes go out, then
//! `shutdown(SHUT_WR)` on the connection if the child only shut down writing (its end still
//! exists), nothing if the child closed its end (`POLLHUP`: like the kernel, a copy closed
//! in one process leaves the connection to the others); a pair whose child end is gone
//! (`POLLHUP`) reads nothing more from the connection, so bytes arriving after a child
//! exited or `exec`ed stay for the parent or a sibling. Connection reset or failure → the
//! unix end is closed. The parent shutting the connection down for writing → the child's
//! writes fail (`SHUT_RD` on the unix end).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

use libc::c_int;

use crate::linger;
use crate::process::xlog;
use crate::real;
use crate::sock::{self, Opts, Sock, StreamSock, TableGuard};

/// At most this many engine connections are relayed per `fork`; the child gets the old
/// behaviour (`EBADF`) on the rest, with a warning.
pub(crate) const MAX_RELAYED_PER_FORK: usize = 1024;

/// Size of each direction's relay buffer per connection.
const RELAY_BUF: usize = 64 << 10;

/// Longest relay sleep: a safety net against a wakeup consumed elsewhere (the parent's own
/// threads share the connection's readiness descriptor).
const RELAY_SLEEP: Duration = Duration::from_millis(50);

/// Re-check interval while a connection's send ring is full (no wakeup for room).
const RELAY_TICK: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------------------
// relayed descriptors (child side)

/// What a child knows about a connection relayed by its parent.
#[derive(Debug)]
pub(crate) struct Relayed {
    /// `AF_INET` or `AF_INET6`, as created by the program.
    pub(crate) domain: c_int,
    /// TCP local address.
    pub(crate) local: Option<SocketAddr>,
    /// TCP peer address.
    pub(crate) peer: Option<SocketAddr>,
    /// Options as the program set them (TCP-level ones are reported, not applied).
    pub(crate) opts: Mutex<Opts>,
}

impl Relayed {
    /// The remembered options.
    pub(crate) fn opts(&self) -> MutexGuard<'_, Opts> {
        self.opts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type RelayedMap = BTreeMap<RawFd, Arc<Relayed>>;

static RELAYED_COUNT: AtomicUsize = AtomicUsize::new(0);
static RELAYED: RwLock<RelayedMap> = RwLock::new(BTreeMap::new());

fn relayed_write() -> RwLockWriteGuard<'static, RelayedMap> {
    RELAYED.write().unwrap_or_else(|p| p.into_inner())
}

/// The relayed connection behind `fd`, if any.
pub(crate) fn relayed(fd: RawFd) -> Option<Arc<Relayed>> {
    if RELAYED_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    RELAYED
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&fd)
        .cloned()
}

fn insert_locked(m: &mut RelayedMap, fd: RawFd, r: Arc<Relayed>) {
    if m.insert(fd, r).is_none() {
        RELAYED_COUNT.fetch_add(1, Ordering::Release);
    }
}

/// `fd` was closed (or reused): forget it.
pub(crate) fn forget(fd: RawFd) {
    if RELAYED_COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    if relayed_write().remove(&fd).is_some() {
        RELAYED_COUNT.fetch_sub(1, Ordering::Release);
    }
}

/// `new` was made a duplicate of `old` (`dup*`, `F_DUPFD*`).
pub(crate) fn after_dup(old: RawFd, new: RawFd) {
    if RELAYED_COUNT.load(Ordering::Acquire) == 0 || old == new {
        return;
    }
    let mut m = relayed_write();
    if m.remove(&new).is_some() {
        RELAYED_COUNT.fetch_sub(1, Ordering::Release);
    }
    if let Some(r) = m.get(&old).cloned() {
        insert_locked(&mut m, new, r);
    }
}

// ---------------------------------------------------------------------------------------
// the relay's books (parent side)

/// A connection handed to the relay.
struct NewPair {
    /// Parent end of the socketpair (non-blocking).
    unix: RawFd,
    /// A `dup` of the connection's readiness eventfd (the relay's own registration).
    evfd: RawFd,
    sock: Arc<Sock>,
}

#[derive(Default)]
struct RelayBooks {
    /// Every descriptor the relay owns: closed in a child, which must not keep the
    /// parent's unix ends open (the relay's close would not reach the child it serves).
    fds: BTreeSet<RawFd>,
    /// The relay thread's wake eventfd, once started.
    wake: Option<RawFd>,
    /// Connections waiting for the relay thread.
    inbox: Vec<NewPair>,
}

static BOOKS: Mutex<Option<RelayBooks>> = Mutex::new(None);

fn books() -> MutexGuard<'static, Option<RelayBooks>> {
    BOOKS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Close a descriptor the relay owns (removed from the books under the lock, so a child
/// forked meanwhile never closes a number reused by someone else).
fn close_owned(fd: RawFd) {
    let mut b = books();
    if let Some(b) = b.as_mut() {
        b.fds.remove(&fd);
    }
    // SAFETY: our own descriptor.
    unsafe { real::close(fd) };
}

/// One connection being prepared for a `fork`.
struct Prep {
    fds: Vec<RawFd>,
    sock: Arc<Sock>,
    parent_end: RawFd,
    child_end: RawFd,
    evfd: RawFd,
    info: Arc<Relayed>,
}

/// Locks held across `fork` by the forking thread, and what prepare made.
struct Held {
    // Field order is drop order: the reverse of the locking order.
    linger: linger::LingerGuard,
    table: TableGuard,
    relayed: RwLockWriteGuard<'static, RelayedMap>,
    books: MutexGuard<'static, Option<RelayBooks>>,
    pending: Vec<Prep>,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

fn errno() -> c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `pthread_atfork` prepare handler: make a socketpair per live engine connection and
/// hold the shim's tables locked across `fork`.
#[cfg_attr(test, allow(dead_code))]
pub(crate) extern "C" fn prepare() {
    // Lock order: books, relayed, table, lingering list. Elsewhere only books → list
    // nests (the parent handler retires connections with the books held); nothing takes
    // any of the others while holding the list (see `linger::lock_lingering`).
    let mut books = books();
    let relayed = relayed_write();
    let table = sock::lock_table();
    // Taken so that no thread (the linger watcher mid-round) holds it at `fork`.
    let linger = linger::lock_lingering();
    books.get_or_insert_with(RelayBooks::default);
    // Distinct live connections, each with every descriptor number the program has for it.
    let mut conns: Vec<(Arc<Sock>, Vec<RawFd>)> = Vec::new();
    let mut index: BTreeMap<usize, usize> = BTreeMap::new();
    for (&fd, s) in table.iter() {
        if let Sock::Stream(st) = &**s {
            if st.common.alive() {
                let key = Arc::as_ptr(s) as usize;
                let i = *index.entry(key).or_insert_with(|| {
                    conns.push((s.clone(), Vec::new()));
                    conns.len() - 1
                });
                conns[i].1.push(fd);
            }
        }
    }
    if conns.len() > MAX_RELAYED_PER_FORK {
        xlog!(
            Warn,
            "fork with {} engine connections: relaying {MAX_RELAYED_PER_FORK}; the child gets EBADF on the rest",
            conns.len()
        );
        conns.truncate(MAX_RELAYED_PER_FORK);
    }
    let mut pending = Vec::with_capacity(conns.len());
    for (s, fds) in conns {
        let Sock::Stream(st) = &*s else { continue };
        match make_pair(st) {
            Ok((parent_end, child_end, evfd)) => {
                let (local, peer) = st.addrs();
                let info = Arc::new(Relayed {
                    domain: st.common.domain,
                    local,
                    peer,
                    opts: Mutex::new(*st.common.opts()),
                });
                pending.push(Prep {
                    fds,
                    sock: s.clone(),
                    parent_end,
                    child_end,
                    evfd,
                    info,
                });
            }
            Err(e) => xlog!(
                Warn,
                "fork: cannot relay the connection on fd {fds:?}: {}; the child gets EBADF on it",
                io::Error::from_raw_os_error(e)
            ),
        }
    }
    HELD.with(|h| {
        *h.borrow_mut() = Some(Held {
            linger,
            table,
            relayed,
            books,
            pending,
        })
    });
}

/// The socketpair (parent end non-blocking, child end as the program sees the socket) and
/// the relay's own `dup` of the readiness eventfd.
fn make_pair(st: &StreamSock) -> Result<(RawFd, RawFd, RawFd), c_int> {
    let mut sv = [-1 as c_int; 2];
    // SAFETY: out array of two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    } < 0
    {
        return Err(errno());
    }
    let [p, c] = sv;
    let nonblock = st.common.nonblock.load(Ordering::Relaxed);
    // SAFETY: flags on our new descriptors; dup of the connection's eventfd.
    let evfd = unsafe {
        real::fcntl(p, libc::F_SETFL, libc::O_NONBLOCK as libc::c_ulong);
        if nonblock {
            real::fcntl(c, libc::F_SETFL, libc::O_NONBLOCK as libc::c_ulong);
        }
        real::fcntl(st.common.evfd, libc::F_DUPFD_CLOEXEC, 0)
    };
    if evfd < 0 {
        let e = errno();
        // SAFETY: our descriptors.
        unsafe {
            real::close(p);
            real::close(c);
        }
        return Err(e);
    }
    Ok((p, c, evfd))
}

fn sys_close(fd: RawFd) {
    // SAFETY: raw syscall (async-signal-safe, no symbol lookup) on a descriptor we own.
    unsafe { libc::syscall(libc::SYS_close, fd as libc::c_long) };
}

/// `pthread_atfork` child handler. Only this thread exists: raw syscalls, no logging.
#[cfg_attr(test, allow(dead_code))]
pub(crate) extern "C" fn child() {
    if let Some(held) = HELD.with(|h| h.borrow_mut().take()) {
        let Held {
            mut linger,
            mut table,
            mut relayed,
            mut books,
            pending,
        } = held;
        linger::forget_lingering_after_fork(&mut linger);
        drop(linger);
        // The parent's relay does not exist here: its descriptors are not ours.
        if let Some(b) = books.as_mut() {
            for &fd in &b.fds {
                sys_close(fd);
            }
            b.fds.clear();
            b.wake = None;
            WAKE.store(-1, Ordering::SeqCst);
            FINISHING.store(0, Ordering::SeqCst);
            // References to the parent's connections: never drop them here (a drop talks
            // to the parent's engine).
            std::mem::forget(std::mem::take(&mut b.inbox));
        }
        for p in pending {
            for &fd in &p.fds {
                // SAFETY: raw fcntl/dup3 syscalls on descriptors of this process.
                let ok = unsafe {
                    let fdflags = libc::syscall(
                        libc::SYS_fcntl,
                        fd as libc::c_long,
                        libc::F_GETFD as libc::c_long,
                    );
                    let cloexec = if fdflags >= 0 && fdflags & libc::FD_CLOEXEC as libc::c_long != 0
                    {
                        libc::O_CLOEXEC
                    } else {
                        0
                    };
                    libc::syscall(
                        libc::SYS_dup3,
                        p.child_end as libc::c_long,
                        fd as libc::c_long,
                        cloexec as libc::c_long,
                    ) >= 0
                };
                if ok {
                    if let Some(s) = sock::remove_locked(&mut table, fd) {
                        std::mem::forget(s);
                    }
                    insert_locked(&mut relayed, fd, p.info.clone());
                }
            }
            sys_close(p.child_end);
            sys_close(p.parent_end);
            sys_close(p.evfd);
            std::mem::forget(p.sock);
        }
        drop(table);
        drop(relayed);
        drop(books);
    }
    crate::engine::after_fork_child();
}

/// `pthread_atfork` parent handler: close the child ends, hand the parent ends to the
/// relay thread.
#[cfg_attr(test, allow(dead_code))]
pub(crate) extern "C" fn parent() {
    let Some(held) = HELD.with(|h| h.borrow_mut().take()) else {
        return;
    };
    let Held {
        linger,
        table,
        relayed,
        mut books,
        pending,
    } = held;
    drop(linger);
    drop(table);
    drop(relayed);
    if pending.is_empty() {
        return;
    }
    let b = books.get_or_insert_with(RelayBooks::default);
    for p in pending {
        // SAFETY: our descriptor; the child has its own copy.
        unsafe { real::close(p.child_end) };
        b.fds.insert(p.parent_end);
        b.fds.insert(p.evfd);
        b.inbox.push(NewPair {
            unix: p.parent_end,
            evfd: p.evfd,
            sock: p.sock,
        });
    }
    if b.wake.is_none() {
        match start_relay(b) {
            Ok(w) => b.wake = Some(w),
            Err(e) => {
                xlog!(
                    Warn,
                    "fork: relay thread cannot start: {e}; relayed children see end of stream"
                );
                for np in std::mem::take(&mut b.inbox) {
                    for fd in [np.unix, np.evfd] {
                        b.fds.remove(&fd);
                        // SAFETY: our descriptors.
                        unsafe { real::close(fd) };
                    }
                    sock::retire(np.sock);
                }
                return;
            }
        }
    }
    if let Some(w) = b.wake {
        signal(w);
    }
}

fn signal(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: 8 bytes to an eventfd.
    unsafe { real::write(fd, one.as_ptr().cast(), 8) };
}

fn drain(fd: RawFd) {
    let mut b = [0u8; 8];
    // SAFETY: 8 bytes from a non-blocking eventfd.
    unsafe { real::read(fd, b.as_mut_ptr().cast(), 8) };
}

/// Start the relay thread (books locked by the caller); returns its wake descriptor.
fn start_relay(b: &mut RelayBooks) -> io::Result<RawFd> {
    let relay = Relay::new()?;
    b.fds.insert(relay.epfd);
    b.fds.insert(relay.wake);
    let (epfd, wake) = (relay.epfd, relay.wake);
    // The relay thread blocks every signal: the program's handlers run on the program's
    // threads, as without it.
    let r = crate::wait::spawn_with_signals_blocked("xwarp-relay", move || {
        let mut relay = relay;
        loop {
            let new = books()
                .as_mut()
                .map(|b| std::mem::take(&mut b.inbox))
                .unwrap_or_default();
            for np in new {
                relay.adopt(np);
            }
            relay.turn();
        }
    });
    match r {
        Ok(_) => {
            WAKE.store(wake, Ordering::SeqCst);
            // SAFETY: registering a plain extern "C" function.
            unsafe { libc::atexit(finish_relays_at_exit) };
            Ok(wake)
        }
        Err(e) => {
            // The closure (and the relay in it) is gone; its descriptors with it.
            b.fds.remove(&epfd);
            b.fds.remove(&wake);
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------------------
// the pump

/// A bounded byte buffer: filled at the end, drained from the front.
struct Buf {
    b: Box<[u8]>,
    lo: usize,
    hi: usize,
}

impl Buf {
    fn new(cap: usize) -> Buf {
        Buf {
            b: vec![0u8; cap].into_boxed_slice(),
            lo: 0,
            hi: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.lo == self.hi
    }

    fn has_room(&self) -> bool {
        self.hi - self.lo < self.b.len()
    }

    fn data(&self) -> &[u8] {
        &self.b[self.lo..self.hi]
    }

    fn consume(&mut self, n: usize) {
        self.lo = (self.lo + n).min(self.hi);
        if self.lo == self.hi {
            self.lo = 0;
            self.hi = 0;
        }
    }

    /// Free space at the end (compacting first when the end is reached).
    fn room(&mut self) -> &mut [u8] {
        if self.hi == self.b.len() && self.lo > 0 {
            self.b.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        &mut self.b[self.hi..]
    }

    fn fill(&mut self, n: usize) {
        self.hi = (self.hi + n).min(self.b.len());
    }

    fn clear(&mut self) {
        self.lo = 0;
        self.hi = 0;
    }
}

/// One relayed connection.
struct Pair {
    unix: RawFd,
    evfd: RawFd,
    sock: Arc<Sock>,
    to_child: Buf,
    to_engine: Buf,
    /// The connection reported end of stream.
    eng_eof: bool,
    /// Engine → child finished (`SHUT_WR` sent on the unix end).
    a_done: bool,
    /// The unix end reported end of stream.
    unix_eof: bool,
    /// The child closed its end (nobody reads what the engine sends).
    child_closed: bool,
    /// Child → engine finished.
    b_done: bool,
    /// Bytes for the engine wait for room in the send ring.
    blocked: bool,
    /// Events registered for the unix end (`None`: not registered).
    unix_ev: Option<u32>,
    /// The eventfd is registered.
    ev_on: bool,
}

/// What a pump round left.
#[derive(Debug, PartialEq, Eq)]
enum Pumped {
    /// More to do later.
    Live,
    /// The pair is finished.
    Done,
}

impl Pair {
    fn stream(&self) -> Option<&StreamSock> {
        match &*self.sock {
            Sock::Stream(st) => Some(st),
            _ => None,
        }
    }

    /// Child closed its end (`POLLHUP` with end of stream) rather than only shutting down
    /// writing.
    fn unix_hup(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.unix,
            events: 0,
            revents: 0,
        };
        // SAFETY: one pollfd, no wait.
        let r = unsafe { real::poll(&mut p, 1, 0) };
        r == 1 && p.revents & libc::POLLHUP != 0
    }

    /// Move bytes both ways until nothing moves (or a fairness bound).
    fn pump(&mut self) -> Pumped {
        let sock = self.sock.clone();
        let Sock::Stream(st) = &*sock else {
            return Pumped::Done;
        };
        self.blocked = false;
        // A child that closed its copy (exited, `exec` with `FD_CLOEXEC`) must not take
        // bytes from the connection: they belong to whoever still reads it (the parent, a
        // sibling served by another pair). The relay may learn of the close only after
        // new bytes arrived (a loaded machine: the close and the bytes in one turn, this
        // pair stepped first), and pulling them here would send them into a dead socket.
        // `POLLHUP` before our own `SHUT_WR` means the child's end is gone.
        if !self.a_done && !self.child_closed && !self.eng_eof && self.unix_hup() {
            self.child_gone(st, None);
        }
        for _ in 0..64 {
            let mut progress = false;
            // engine → child
            if !self.a_done && !self.child_closed {
                if !self.eng_eof && self.to_child.has_room() {
                    match st.read_once(&mut [self.to_child.room()], false) {
                        Ok(0) => {
                            self.eng_eof = true;
                            progress = true;
                        }
                        Ok(n) => {
                            self.to_child.fill(n);
                            progress = true;
                        }
                        Err(libc::EAGAIN) => {}
                        Err(_) => {
                            // Reset or failure: what arrived before goes out, then the
                            // unix end closes.
                            let _ = self.flush_to_child();
                            return Pumped::Done;
                        }
                    }
                }
                if !self.to_child.is_empty() {
                    match self.flush_to_child() {
                        Ok(true) => progress = true,
                        Ok(false) => {}
                        Err(e) => {
                            self.child_gone(st, Some(e));
                            progress = true;
                        }
                    }
                }
                if self.eng_eof && self.to_child.is_empty() && !self.child_closed {
                    // SAFETY: our descriptor.
                    unsafe { real::shutdown(self.unix, libc::SHUT_WR) };
                    self.a_done = true;
                    progress = true;
                }
            }
            if self.child_closed && !self.to_child.is_empty() {
                self.child_gone(st, None);
            }
            // child → engine
            if !self.b_done {
                if !self.unix_eof && self.to_engine.has_room() {
                    let room = self.to_engine.room();
                    // SAFETY: our buffer and descriptor.
                    let n = unsafe {
                        real::recv(
                            self.unix,
                            room.as_mut_ptr().cast(),
                            room.len(),
                            libc::MSG_DONTWAIT,
                        )
                    };
                    if n > 0 {
                        self.to_engine.fill(n as usize);
                        progress = true;
                    } else if n == 0 {
                        self.unix_eof = true;
                        if !self.child_closed && self.unix_hup() {
                            self.child_gone(st, None);
                        }
                        progress = true;
                    } else {
                        let e = errno();
                        if e != libc::EAGAIN && e != libc::EINTR {
                            self.unix_eof = true;
                            self.child_gone(st, Some(e));
                            progress = true;
                        }
                    }
                }
                if !self.to_engine.is_empty() {
                    match st.write_once(&[self.to_engine.data()]) {
                        Ok(n) => {
                            self.to_engine.consume(n);
                            progress |= n > 0;
                        }
                        Err(libc::EAGAIN) => self.blocked = true,
                        Err(libc::EPIPE) => {
                            // Shut down for writing (by the parent) or closed: the child's
                            // writes fail from now on, as on the shared kernel socket.
                            self.to_engine.clear();
                            self.b_done = true;
                            // SAFETY: our descriptor.
                            unsafe { real::shutdown(self.unix, libc::SHUT_RD) };
                            progress = true;
                        }
                        Err(_) => return Pumped::Done,
                    }
                }
                if self.unix_eof && self.to_engine.is_empty() && !self.b_done {
                    self.b_done = true;
                    if !self.child_closed {
                        // The child shut down writing: so does the connection.
                        let _ = st.shutdown_write();
                    }
                    progress = true;
                }
            }
            if self.b_done && (self.a_done || self.child_closed) {
                return Pumped::Done;
            }
            if !progress {
                break;
            }
        }
        Pumped::Live
    }

    /// The child closed its copy (or its end failed with `err`). Bytes the relay took for
    /// it and could not hand over go back to the connection, ahead of the rest, for the
    /// parent or a sibling (a kernel socket keeps them for the other copies). Bytes
    /// already in the child's socket are gone with it: the kernel then reports
    /// `ECONNRESET` on our end, and the connection is marked as having lost input (its
    /// last close resets it, as a close with unread input does).
    fn child_gone(&mut self, st: &StreamSock, err: Option<c_int>) {
        let first = !self.child_closed;
        self.child_closed = true;
        if !self.to_child.is_empty() {
            st.unread(self.to_child.data());
            self.to_child.clear();
        }
        if !first {
            return;
        }
        // The reset may have been reported already (`err`) or still be pending.
        let pending = {
            let mut e: c_int = 0;
            let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
            // SAFETY: our descriptor, an int-sized out value.
            unsafe {
                real::getsockopt(
                    self.unix,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    (&mut e as *mut c_int).cast(),
                    &mut len,
                )
            };
            e
        };
        if err == Some(libc::ECONNRESET) || pending == libc::ECONNRESET {
            xlog!(
                Warn,
                "fork relay: a child closed its copy of a connection without reading bytes already handed to it; they are lost (the connection's last close resets it)"
            );
            st.input_lost();
        }
    }

    /// Write buffered bytes to the unix end: `Ok(true)` if some went, `Err` if the child's
    /// end is gone.
    fn flush_to_child(&mut self) -> Result<bool, c_int> {
        let mut moved = false;
        while !self.to_child.is_empty() {
            let d = self.to_child.data();
            // SAFETY: our buffer and descriptor.
            let n = unsafe {
                real::send(
                    self.unix,
                    d.as_ptr().cast(),
                    d.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n > 0 {
                self.to_child.consume(n as usize);
                moved = true;
                continue;
            }
            let e = errno();
            if n < 0 && (e == libc::EAGAIN || e == libc::EINTR) {
                break;
            }
            return Err(e);
        }
        Ok(moved)
    }

    /// Events the unix end should be registered for.
    fn unix_interest(&self) -> u32 {
        let mut ev = 0;
        if !self.b_done && !self.unix_eof && self.to_engine.has_room() {
            ev |= libc::EPOLLIN as u32;
        }
        if !self.a_done && !self.child_closed && !self.to_child.is_empty() {
            ev |= libc::EPOLLOUT as u32;
        }
        ev
    }

    /// The child is done with the pair (or bytes are still on their way to the engine):
    /// `exit` waits for it.
    fn finishing(&self) -> bool {
        self.unix_eof || self.child_closed || !self.to_engine.is_empty()
    }

    /// The eventfd should wake the relay: it reads from the connection.
    fn evfd_interest(&self) -> bool {
        !self.a_done && !self.child_closed && !self.eng_eof && self.to_child.has_room()
    }
}

/// The relay: one epoll set over the unix ends and the connections' eventfds.
pub(crate) struct Relay {
    epfd: RawFd,
    wake: RawFd,
    pairs: BTreeMap<u64, Pair>,
    next: u64,
    last_full: Instant,
}

const WAKE_TOKEN: u64 = u64::MAX;

impl Relay {
    /// An empty relay with its epoll set and wake eventfd.
    pub(crate) fn new() -> io::Result<Relay> {
        // SAFETY: plain descriptor creation.
        let epfd = unsafe { real::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: plain descriptor creation.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: ours.
            unsafe { real::close(epfd) };
            return Err(e);
        }
        let r = Relay {
            epfd,
            wake,
            pairs: BTreeMap::new(),
            next: 0,
            last_full: Instant::now(),
        };
        r.ctl(libc::EPOLL_CTL_ADD, wake, libc::EPOLLIN as u32, WAKE_TOKEN);
        Ok(r)
    }

    fn ctl(&self, op: c_int, fd: RawFd, events: u32, token: u64) -> c_int {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: valid event.
        unsafe { real::epoll_ctl(self.epfd, op, fd, &mut ev) }
    }

    /// Take a connection to serve.
    fn adopt(&mut self, np: NewPair) {
        let id = self.next;
        self.next += 1;
        let p = Pair {
            unix: np.unix,
            evfd: np.evfd,
            sock: np.sock,
            to_child: Buf::new(RELAY_BUF),
            to_engine: Buf::new(RELAY_BUF),
            eng_eof: false,
            a_done: false,
            unix_eof: false,
            child_closed: false,
            b_done: false,
            blocked: false,
            unix_ev: None,
            ev_on: false,
        };
        if p.stream().is_none() {
            self.finish(p);
            return;
        }
        self.step(id, p);
    }

    /// Pump `p` and update its registrations, or finish it.
    fn step(&mut self, id: u64, mut p: Pair) {
        if p.pump() == Pumped::Done {
            self.finish(p);
            return;
        }
        let want = p.unix_interest();
        match (p.unix_ev, want) {
            (None, 0) => {}
            (Some(_), 0) => {
                self.ctl(libc::EPOLL_CTL_DEL, p.unix, 0, 0);
                p.unix_ev = None;
            }
            (None, w) => {
                self.ctl(libc::EPOLL_CTL_ADD, p.unix, w, id << 1);
                p.unix_ev = Some(w);
            }
            (Some(old), w) if old != w => {
                self.ctl(libc::EPOLL_CTL_MOD, p.unix, w, id << 1);
                p.unix_ev = Some(w);
            }
            _ => {}
        }
        let ev = p.evfd_interest();
        if ev != p.ev_on {
            if ev {
                self.ctl(
                    libc::EPOLL_CTL_ADD,
                    p.evfd,
                    libc::EPOLLIN as u32,
                    (id << 1) | 1,
                );
            } else {
                self.ctl(libc::EPOLL_CTL_DEL, p.evfd, 0, 0);
            }
            p.ev_on = ev;
        }
        self.pairs.insert(id, p);
    }

    fn finish(&mut self, p: Pair) {
        close_owned(p.unix);
        close_owned(p.evfd);
        // The parent's copy may still be open: the last reference closes gracefully.
        sock::retire(p.sock);
    }

    /// Wait for events (bounded) and pump the pairs that have some.
    fn turn(&mut self) {
        let blocked = self.pairs.values().any(|p| p.blocked);
        let timeout = if self.pairs.is_empty() {
            -1
        } else if blocked {
            RELAY_TICK.as_millis() as c_int
        } else {
            RELAY_SLEEP.as_millis() as c_int
        };
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        // SAFETY: our buffer of 64 events.
        let n = unsafe { real::epoll_wait(self.epfd, evs.as_mut_ptr(), 64, timeout) };
        let mut due: BTreeSet<u64> = BTreeSet::new();
        for e in evs.iter().take(n.max(0) as usize) {
            let tok = e.u64;
            if tok == WAKE_TOKEN {
                drain(self.wake);
            } else {
                due.insert(tok >> 1);
            }
        }
        let full = self.last_full.elapsed() >= RELAY_SLEEP;
        if full {
            self.last_full = Instant::now();
        }
        let ids: Vec<u64> = self
            .pairs
            .iter()
            .filter(|(id, p)| full || p.blocked || due.contains(id))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(p) = self.pairs.remove(&id) {
                self.step(id, p);
            }
        }
        let finishing = self.pairs.values().filter(|p| p.finishing()).count();
        FINISHING.store(finishing, Ordering::SeqCst);
        TURNS.fetch_add(1, Ordering::SeqCst);
    }
}

/// Relayed connections whose child is done (or bytes still on their way to the engine):
/// what `exit` waits for.
static FINISHING: AtomicUsize = AtomicUsize::new(0);

/// Relay loop iterations (lets `exit` wait until the relay saw the latest state).
static TURNS: AtomicU64 = AtomicU64::new(0);

/// Wake descriptor of this process's relay thread (-1: none).
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// How long `exit` waits at most for relayed connections to finish.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// At exit of a process that relays connections for its children: the relay dies with
/// the process, so first let it deliver what children that are done sent (their end of
/// stream included, bounded by [`EXIT_WAIT`]); children still serving see end of stream.
/// Registered after the engine's own exit hook, so it runs before it (which then waits
/// for the connections this one handed over).
extern "C" fn finish_relays_at_exit() {
    let wake = WAKE.load(Ordering::SeqCst);
    if wake < 0 {
        return;
    }
    let deadline = Instant::now() + EXIT_WAIT;
    let start = TURNS.load(Ordering::SeqCst);
    signal(wake);
    // Two full relay iterations after the wake: the counters reflect the state at exit.
    while TURNS.load(Ordering::SeqCst) < start + 2 && Instant::now() < deadline {
        signal(wake);
        std::thread::sleep(Duration::from_millis(1));
    }
    while FINISHING.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for p in std::mem::take(&mut self.pairs).into_values() {
            self.finish(p);
        }
        // Not `close_owned`: a relay that never ran is dropped with the books locked
        // (thread creation failed); its descriptors leave the books there.
        // SAFETY: the relay's own descriptors.
        unsafe {
            real::close(self.epfd);
            real::close(self.wake);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The relay pump over two engines joined by the virtual wire and a socketpair standing
    //! for the child's end (no root, no fork needed).
    use super::*;
    use crate::sock::tests::connected;
    use std::sync::atomic::AtomicBool;
    use xwarp_stack::Stream;

    const MIB: usize = 1 << 20;

    fn pattern(seed: u8, i: usize) -> u8 {
        (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 9) as u8)
    }

    /// The relay serving `sock` on a thread; returns the child's end (blocking), the
    /// stop switch and the thread.
    struct Running {
        child: RawFd,
        /// Bytes the relay holds for the children (its engine → child buffers), as of its
        /// last turn.
        held: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
        wake: RawFd,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Running {
        fn start(sock: Arc<Sock>) -> Running {
            let Sock::Stream(st) = &*sock else {
                panic!("not a stream")
            };
            // The test's server socket is non-blocking: the child's end follows that view.
            let (p, c, evfd) = make_pair(st).expect("socketpair");
            // SAFETY: our descriptor.
            let fl = unsafe { libc::fcntl(c, libc::F_GETFL) };
            assert!(fl & libc::O_NONBLOCK != 0, "O_NONBLOCK view not applied");
            // SAFETY: our descriptor; the test reads it blocking.
            unsafe { libc::fcntl(c, libc::F_SETFL, fl & !libc::O_NONBLOCK) };
            let mut relay = Relay::new().expect("relay");
            let wake = relay.wake;
            relay.adopt(NewPair {
                unix: p,
                evfd,
                sock,
            });
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            let held = Arc::new(AtomicUsize::new(0));
            let h2 = held.clone();
            let thread = std::thread::spawn(move || {
                while !s2.load(Ordering::SeqCst) {
                    relay.turn();
                    let n = relay.pairs.values().map(|p| p.to_child.data().len()).sum();
                    h2.store(n, Ordering::SeqCst);
                }
            });
            Running {
                child: c,
                held,
                stop,
                wake,
                thread: Some(thread),
            }
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            signal(self.wake);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
            if self.child >= 0 {
                // SAFETY: our descriptor.
                unsafe { libc::close(self.child) };
            }
        }
    }

    fn established(client: &Stream) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !client.poll_connect().expect("connect") {
            assert!(Instant::now() < deadline, "never established");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Write `n` pattern bytes on an engine stream (blocking).
    fn engine_write(s: &mut Stream, seed: u8, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let data: Vec<u8> = (0..n).map(|i| pattern(seed, i)).collect();
        let mut off = 0;
        while off < n {
            match s.try_write(&data[off..]) {
                Ok(k) => off += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    s.wait(Some(Instant::now() + Duration::from_millis(5)))
                        .unwrap();
                }
                Err(e) => panic!("engine write: {e}"),
            }
            assert!(Instant::now() < deadline, "engine write stalled");
        }
    }

    /// Read from an engine stream until `n` bytes or end of stream; returns the bytes.
    fn engine_read(s: &mut Stream, n: usize, limit: Duration) -> (Vec<u8>, bool) {
        let deadline = Instant::now() + limit;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        while got.len() < n {
            match s.try_read(&mut buf) {
                Ok(0) => return (got, true),
                Ok(k) => got.extend_from_slice(&buf[..k]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        break;
                    }
                    s.wait(Some(Instant::now() + Duration::from_millis(5)))
                        .unwrap();
                }
                Err(e) => panic!("engine read: {e}"),
            }
        }
        (got, false)
    }

    fn unix_write_all(fd: RawFd, data: &[u8]) {
        let mut off = 0;
        while off < data.len() {
            // SAFETY: our buffer.
            let n = unsafe {
                libc::send(
                    fd,
                    data[off..].as_ptr().cast(),
                    data.len() - off,
                    libc::MSG_NOSIGNAL,
                )
            };
            assert!(n > 0, "unix write: {}", io::Error::last_os_error());
            off += n as usize;
        }
    }

    /// Blocking read of up to `n` bytes (stops at end of stream).
    fn unix_read(fd: RawFd, n: usize) -> (Vec<u8>, bool) {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        while got.len() < n {
            let want = buf.len().min(n - got.len());
            // SAFETY: our buffer.
            let k = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), want) };
            assert!(k >= 0, "unix read: {}", io::Error::last_os_error());
            if k == 0 {
                return (got, true);
            }
            got.extend_from_slice(&buf[..k as usize]);
        }
        (got, false)
    }

    fn set_timeout(fd: RawFd, secs: i64) {
        let tv = libc::timeval {
            tv_sec: secs,
            tv_usec: 0,
        };
        // SAFETY: a timeval.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }

    fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn buffer_compacts_and_stays_bounded() {
        let mut b = Buf::new(8);
        assert!(b.is_empty() && b.has_room());
        b.room()[..6].copy_from_slice(b"abcdef");
        b.fill(6);
        b.consume(4);
        assert_eq!(b.data(), b"ef");
        assert_eq!(b.room().len(), 2);
        b.room()[..2].copy_from_slice(b"gh");
        b.fill(2);
        // End reached: the next room() compacts.
        assert_eq!(b.room().len(), 4);
        assert_eq!(b.data(), b"efgh");
        b.fill(100);
        assert!(!b.has_room());
        assert_eq!(b.data().len(), 8);
        b.consume(100);
        assert!(b.is_empty());
    }

    #[test]
    fn relay_moves_a_mib_each_way_and_propagates_half_close_both_ways() {
        let (_a, _b, st, mut client) = connected();
        established(&client);
        let sock = Arc::new(Sock::Stream(st));
        let r = Running::start(sock.clone());
        set_timeout(r.child, 10);
        // The parent's copy is closed right away (accept-then-fork): the relay's reference
        // keeps the connection open.
        sock::retire(sock.clone());
        let weak = Arc::downgrade(&sock);
        drop(sock);
        // engine → child, 1 MiB verified.
        let writer = std::thread::spawn(move || {
            engine_write(&mut client, 7, MIB);
            client
        });
        let (got, eof) = unix_read(r.child, MIB);
        assert!(!eof, "early end of stream after {} bytes", got.len());
        assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(7, i)));
        let mut client = writer.join().unwrap();
        // child → engine, 1 MiB verified (written on another thread: the relay's buffers
        // are bounded, so the child's writes wait for the engine side to read).
        let child = r.child;
        let w = std::thread::spawn(move || {
            let data: Vec<u8> = (0..MIB).map(|i| pattern(9, i)).collect();
            unix_write_all(child, &data);
        });
        let (got, eof) = engine_read(&mut client, MIB, Duration::from_secs(20));
        w.join().unwrap();
        assert!(!eof);
        assert_eq!(got.len(), MIB);
        assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(9, i)));
        // Peer half-closes: the child sees end of stream and can still reply.
        client.shutdown_write().unwrap();
        let (rest, eof) = unix_read(r.child, 1);
        assert!(rest.is_empty() && eof, "child did not see end of stream");
        unix_write_all(r.child, b"reply after eof");
        let (got, _) = engine_read(&mut client, 15, Duration::from_secs(10));
        assert_eq!(got, b"reply after eof");
        // The child shuts down writing: the peer sees end of stream.
        // SAFETY: our descriptor.
        unsafe { libc::shutdown(r.child, libc::SHUT_WR) };
        let (got, eof) = engine_read(&mut client, 1, Duration::from_secs(10));
        assert!(got.is_empty() && eof, "peer did not see the FIN");
        // Both directions done: the relay let go of the connection.
        wait_until("the relay to release the connection", || {
            weak.strong_count() == 0
        });
    }

    #[test]
    fn child_closing_its_copy_leaves_the_connection_to_the_parent_until_it_closes_too() {
        let (_a, _b, st, mut client) = connected();
        established(&client);
        let sock = Arc::new(Sock::Stream(st));
        let mut r = Running::start(sock.clone());
        unix_write_all(r.child, b"from child");
        // SAFETY: our descriptor (the child exits, or execs with FD_CLOEXEC).
        unsafe { libc::close(r.child) };
        r.child = -1;
        let (got, eof) = engine_read(&mut client, 10, Duration::from_secs(10));
        assert_eq!(got, b"from child");
        assert!(!eof);
        // Only the parent's reference remains; no FIN was sent for the child's close.
        wait_until("the relay to let go", || Arc::strong_count(&sock) == 1);
        let (got, eof) = engine_read(&mut client, 1, Duration::from_millis(300));
        assert!(
            got.is_empty() && !eof,
            "connection closed by the child's close"
        );
        // The parent still uses it.
        let Sock::Stream(st) = &*sock else {
            unreachable!()
        };
        assert_eq!(st.write_once(&[b"from parent"]), Ok(11));
        let (got, _) = engine_read(&mut client, 11, Duration::from_secs(10));
        assert_eq!(got, b"from parent");
        // The parent's close is the last: FIN.
        sock::retire(sock);
        let (got, eof) = engine_read(&mut client, 1, Duration::from_secs(10));
        assert!(got.is_empty() && eof, "no FIN after the last close");
    }

    #[test]
    fn child_that_closed_its_copy_takes_no_bytes_meant_for_a_sibling() {
        // fork + exec (FD_CLOEXEC closes the first child's copy), then a second fork whose
        // child serves the connection. The request arrives before the relay has looked at
        // the first pair since its child closed; the first pair is stepped first.
        let (_a, _b, st, mut client) = connected();
        established(&client);
        let sock = Arc::new(Sock::Stream(st));
        let Sock::Stream(st) = &*sock else {
            unreachable!()
        };
        let (p1, c1, e1) = make_pair(st).expect("socketpair");
        let (p2, c2, e2) = make_pair(st).expect("socketpair");
        let mut relay = Relay::new().expect("relay");
        for (unix, evfd) in [(p1, e1), (p2, e2)] {
            relay.adopt(NewPair {
                unix,
                evfd,
                sock: sock.clone(),
            });
        }
        // SAFETY: our descriptors (the exec'd child's copy goes; the second child reads
        // blocking, with a timeout).
        unsafe {
            libc::close(c1);
            let fl = libc::fcntl(c2, libc::F_GETFL);
            libc::fcntl(c2, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
        set_timeout(c2, 5);
        engine_write(&mut client, 5, 100);
        // Wait until the bytes are at the server socket (a peek leaves them there).
        let mut peek = [0u8; 100];
        wait_until("the request to arrive", || {
            st.read_once(&mut [&mut peek[..]], true) == Ok(100)
        });
        for _ in 0..3 {
            relay.turn();
        }
        let (got, eof) = unix_read(c2, 100);
        assert!(!eof, "second child saw end of stream");
        assert_eq!(got.len(), 100, "request lost to the closed first child");
        assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(5, i)));
        // The first pair is finished (its child is gone), the second still serves.
        assert_eq!(relay.pairs.len(), 1);
        drop(relay);
        // SAFETY: our descriptor.
        unsafe { libc::close(c2) };
    }

    #[test]
    fn connection_reset_closes_the_childs_end() {
        let (_a, _b, st, mut client) = connected();
        established(&client);
        let sock = Arc::new(Sock::Stream(st));
        let r = Running::start(sock.clone());
        set_timeout(r.child, 10);
        engine_write(&mut client, 1, 100);
        let (got, _) = unix_read(r.child, 100);
        assert!(got.iter().enumerate().all(|(i, &b)| b == pattern(1, i)));
        client.abort().unwrap();
        // The child sees its end closed (end of stream or ECONNRESET), not a hang.
        let mut b = [0u8; 16];
        // SAFETY: our buffer.
        let n = unsafe { libc::read(r.child, b.as_mut_ptr().cast(), 16) };
        let e = io::Error::last_os_error().raw_os_error();
        assert!(
            n == 0 || (n < 0 && e == Some(libc::ECONNRESET)),
            "read after reset: {n} {e:?}"
        );
        wait_until("the relay to let go", || Arc::strong_count(&sock) == 1);
    }

    #[test]
    fn child_closing_with_unread_bytes_hands_the_relays_bytes_back_to_the_parent() {
        let (_a, _b, st, mut client) = connected();
        established(&client);
        let sock = Arc::new(Sock::Stream(st));
        let mut r = Running::start(sock.clone());
        // The peer sends 1 MiB and ends; the child reads none of it.
        let writer = std::thread::spawn(move || {
            engine_write(&mut client, 3, MIB);
            client.shutdown_write().unwrap();
            client
        });
        // The child's socket fills up, then the relay's own buffer.
        wait_until("the child's socket to fill", || {
            let mut n: c_int = 0;
            // SAFETY: FIONREAD into an int.
            unsafe { libc::ioctl(r.child, libc::FIONREAD, &mut n) };
            n > 64 << 10
        });
        // Then the relay's own buffer: wait until it is full (the child reads nothing, so
        // it only grows), so the close below always has bytes to hand back.
        wait_until("the relay's buffer to fill", || {
            r.held.load(Ordering::SeqCst) == RELAY_BUF
        });
        // SAFETY: our descriptor (the child exits without reading).
        unsafe { libc::close(r.child) };
        r.child = -1;
        wait_until("the relay to let go", || Arc::strong_count(&sock) == 1);
        let Sock::Stream(st) = &*sock else {
            unreachable!()
        };
        // The hand-back happened: the relay's bytes wait in the shim's own buffer (a
        // probe of the ring alone never puts more than 16 KiB there).
        assert!(
            st.buffered() >= RELAY_BUF,
            "the relay's {RELAY_BUF} bytes were not handed back: {} buffered",
            st.buffered()
        );
        // The parent reads on: what the relay held comes first, then the rest, in order.
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match st.read_once(&mut [&mut buf[..]], false) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(libc::EAGAIN) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("parent read: {e}"),
            }
            assert!(Instant::now() < deadline, "parent read stalled");
        }
        let client = writer.join().unwrap();
        // Only what already sat in the child's socket is gone: the parent got the exact
        // tail of the stream, including the relay's buffered bytes (64 KiB).
        let lost = MIB - got.len();
        assert!(
            got.len() >= RELAY_BUF,
            "relay's bytes lost: got {}",
            got.len()
        );
        assert!(lost > 0, "the child's socket held nothing");
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(3, lost + i)),
            "the parent's bytes are not the tail of the stream"
        );
        // Bytes were lost unread: the last close resets the connection.
        sock::retire(sock);
        let deadline = Instant::now() + Duration::from_secs(5);
        while client.error().is_none() {
            assert!(Instant::now() < deadline, "no reset after losing input");
            let _ = client.wait(Some(Instant::now() + Duration::from_millis(5)));
        }
        assert_eq!(
            client.error().map(|e| e.to_io().kind()),
            Some(io::ErrorKind::ConnectionReset)
        );
    }
}
