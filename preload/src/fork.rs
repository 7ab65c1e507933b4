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
use std::collections::BTreeMap;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, RwLockWriteGuard};

use libc::c_int;

use crate::engine::{lock_engine, EngineGuard};
use crate::epoll;
use crate::errno::last_errno;
use crate::linger;
use crate::process::xlog;
use crate::real;
use crate::sigsafe::SignalsBlocked;
use crate::sock::{self, Sock, StreamSock, TableGuard};
use crate::wait::signal;

mod relay;
mod relayed;

use relay::{books, finish_relays_at_exit, NewPair, Relay, RelayBooks, FINISHING, WAKE};
pub(crate) use relayed::{after_dup, forget, relayed, Relayed};
use relayed::{insert_locked, relayed_write, RelayedMap};

/// At most this many engine connections are relayed per `fork`; the child gets the old
/// behaviour (`EBADF`) on the rest, with a warning.
pub(crate) const MAX_RELAYED_PER_FORK: usize = 1024;

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
    pre_buffers: sock::PreBuffersGuard,
    regs: epoll::RegsGuard,
    table: TableGuard,
    relayed: RwLockWriteGuard<'static, RelayedMap>,
    books: MutexGuard<'static, Option<RelayBooks>>,
    engine: EngineGuard,
    pending: Vec<Prep>,
    /// Every signal blocked from prepare to the end of the parent/child handler (a
    /// handler must not run while this thread holds the table): restored last.
    blocked: SignalsBlocked,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// `pthread_atfork` prepare handler: make a socketpair per live engine connection and
/// hold every lock of the shim across `fork`, so that the child never inherits one held
/// by a thread that does not exist there.
#[cfg_attr(test, allow(dead_code))]
pub(crate) extern "C" fn prepare() {
    // Every shim-wide lock, in this one order (released in reverse by parent/child):
    //  1. the engine's state (held while the engine starts; nothing below is taken
    //     under it, and it is taken under none of them),
    //  2. the relay's books,
    //  3. the relayed map,
    //  4. the descriptor table,
    //  5. the epoll registrations (taken under nothing else; under them only socket
    //     locks),
    //  6. the buffer sizes remembered for kernel sockets (a leaf: nothing nests in it),
    //  7. the lingering list (taken so that no thread, the linger watcher mid-round,
    //     holds it at `fork`).
    // Elsewhere only books → list nests (the parent handler retires connections with the
    // books held); nothing takes any of the others while holding the list (see
    // `linger::lock_lingering`). Per-socket locks (a stream's, its options) come after
    // all of these: prepare takes each live connection's below.
    let blocked = SignalsBlocked::new();
    let engine = lock_engine();
    let mut books = books();
    let relayed = relayed_write();
    let table = sock::lock_table();
    let regs = epoll::regs();
    let pre_buffers = sock::lock_pre_buffers();
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
            pre_buffers,
            regs,
            table,
            relayed,
            books,
            engine,
            pending,
            blocked,
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
        return Err(last_errno());
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
        let e = last_errno();
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
            pre_buffers,
            regs,
            mut table,
            mut relayed,
            mut books,
            mut engine,
            pending,
            blocked,
        } = held;
        linger::forget_lingering_after_fork(&mut linger);
        drop(linger);
        drop(pre_buffers);
        drop(regs);
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
        crate::engine::after_fork_child(Some(&mut engine));
        drop(engine);
        drop(blocked);
        return;
    }
    crate::engine::after_fork_child(None);
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
        pre_buffers,
        regs,
        table,
        relayed,
        mut books,
        engine,
        pending,
        blocked,
    } = held;
    drop(linger);
    drop(pre_buffers);
    drop(regs);
    drop(table);
    drop(relayed);
    // The books stay locked below, the engine's state is not needed: 1 is released out
    // of order, which is harmless (order matters for taking, not for releasing).
    drop(engine);
    // Signals stay blocked to the end of this function (the books held below are no
    // lock a call from a signal handler takes).
    let _blocked = blocked;
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
