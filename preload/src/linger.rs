//! Connections the program closed that may still have bytes to deliver: kept until their
//! close finished, watched by a thread so input arriving after the close resets them
//! (RFC 2525 §2.17), and waited for at `exit`.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::c_int;
use xwarp_stack::{Phase, Stream};

use crate::process::xlog;
use crate::real;
use crate::wait::{drain, signal, spawn_with_signals_blocked, MAX_SLEEP};

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
    /// End of stream received and our FIN acknowledged (every byte delivered): only the
    /// final handshake (or TIME-WAIT) remains.
    Quiet,
    /// Data or the peer's FIN still outstanding.
    Busy,
}

/// What a look at a closed connection's input found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
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
pub(crate) fn read_input(s: &mut Stream) -> Input {
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
pub(crate) fn closing(s: &mut Stream, eof_seen: bool) -> (Closing, bool) {
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
    } else if eof && s.tx_queued() == 0 && s.fin_acked() {
        // The ring being empty is not enough: the engine may still hold bytes it has not
        // sent (or not had acknowledged); only the acknowledged FIN says they arrived.
        Closing::Quiet
    } else {
        Closing::Busy
    };
    (c, eof)
}

/// Keep `stream`, which the program closed (FIN queued; `eof`: the peer's FIN was seen),
/// until its close finished, and make sure the watcher looks at it.
pub(crate) fn keep(stream: Stream, eof: bool) {
    let mut l = lock_lingering();
    l.push(Lingering {
        stream,
        since: Instant::now(),
        eof,
    });
    // Under the lock: a `fork` (whose prepare handler takes it) never sees the
    // watcher half-started.
    watch_lingering();
    drop(l);
}

/// Block until `stream`'s FIN is acknowledged, it failed or closed, or `deadline`.
/// `false` if it was reset meanwhile (input arrived) or is done.
pub(crate) fn linger_wait(stream: &mut Stream, deadline: Instant) -> bool {
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

#[cfg(test)]
mod fork_tests;
