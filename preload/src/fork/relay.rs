//! The parent's side of `fork`: the relay thread's books (what it owns, what waits for
//! it) and the pump that moves bytes between each relayed connection and the unix socket
//! standing for the child's copy.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::c_int;

use crate::errno::last_errno;
use crate::process::xlog;
use crate::real;
use crate::sock::{self, Sock, StreamSock};
use crate::wait::{drain, signal};

/// Size of each direction's relay buffer per connection.
pub(super) const RELAY_BUF: usize = 64 << 10;

/// Longest relay sleep: a safety net against a wakeup consumed elsewhere (the parent's own
/// threads share the connection's readiness descriptor).
const RELAY_SLEEP: Duration = Duration::from_millis(50);

/// Re-check interval while a connection's send ring is full (no wakeup for room).
const RELAY_TICK: Duration = Duration::from_millis(1);

// ---------------------------------------------------------------------------------------
// the books

/// A connection handed to the relay.
pub(super) struct NewPair {
    /// Parent end of the socketpair (non-blocking).
    pub(super) unix: RawFd,
    /// A `dup` of the connection's readiness eventfd (the relay's own registration).
    pub(super) evfd: RawFd,
    pub(super) sock: Arc<Sock>,
}

#[derive(Default)]
pub(super) struct RelayBooks {
    /// Every descriptor the relay owns: closed in a child, which must not keep the
    /// parent's unix ends open (the relay's close would not reach the child it serves).
    pub(super) fds: BTreeSet<RawFd>,
    /// The relay thread's wake eventfd, once started.
    pub(super) wake: Option<RawFd>,
    /// Connections waiting for the relay thread.
    pub(super) inbox: Vec<NewPair>,
}

static BOOKS: Mutex<Option<RelayBooks>> = Mutex::new(None);

pub(super) fn books() -> MutexGuard<'static, Option<RelayBooks>> {
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
                        let e = last_errno();
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
            let e = last_errno();
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
    pub(super) epfd: RawFd,
    pub(super) wake: RawFd,
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
    pub(super) fn adopt(&mut self, np: NewPair) {
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
    pub(super) fn turn(&mut self) {
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
pub(super) static FINISHING: AtomicUsize = AtomicUsize::new(0);

/// Relay loop iterations (lets `exit` wait until the relay saw the latest state).
static TURNS: AtomicU64 = AtomicU64::new(0);

/// Wake descriptor of this process's relay thread (-1: none).
pub(super) static WAKE: AtomicI32 = AtomicI32::new(-1);

/// How long `exit` waits at most for relayed connections to finish.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// At exit of a process that relays connections for its children: the relay dies with
/// the process, so first let it deliver what children that are done sent (their end of
/// stream included, bounded by [`EXIT_WAIT`]); children still serving see end of stream.
/// Registered after the engine's own exit hook, so it runs before it (which then waits
/// for the connections this one handed over).
pub(super) extern "C" fn finish_relays_at_exit() {
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
mod tests;
