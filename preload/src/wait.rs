//! Blocking the caller: the readiness eventfd's signal and drain, sleeping on it, the
//! spin-then-sleep loop of blocking calls, signal restarts, and starting shim threads.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use libc::c_int;

use crate::real;

/// Largest sleep of a blocking call before it re-checks (bounds the cost of a wakeup
/// consumed by another thread sharing the socket's eventfd).
pub(crate) const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Consume the eventfd `fd`'s count (non-blocking).
pub(crate) fn drain(fd: RawFd) {
    let mut b = [0u8; 8];
    // SAFETY: reading 8 bytes into a local buffer from a non-blocking eventfd.
    unsafe { real::read(fd, b.as_mut_ptr().cast(), 8) };
}

/// Make the eventfd `fd` readable (counted in [`crate::inline::signals`], after the write).
pub(crate) fn signal(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a local buffer to an eventfd.
    unsafe { real::write(fd, one.as_ptr().cast(), 8) };
    crate::inline::count_signal();
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

/// One round of a spinning wait: `sched_yield` with `XWARP_YIELD=1` (the default in
/// inline mode, where every spinning wait calls this between engine iterations: the core
/// goes to any other runnable thread, such as the keeper or a local peer, and comes
/// straight back when there is none), else a CPU spin hint.
pub(crate) fn spin_pause() {
    if crate::process::config().is_some_and(|c| c.yield_spin) {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    } else {
        std::hint::spin_loop();
    }
}

/// Run `op` until it stops saying `EAGAIN`: spin for `spin` (in inline mode driving the
/// engine on every round), then sleep on `fd` (in inline mode after parking: the
/// engine's keeper takes over while the caller sleeps). A signal
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
    let driver = crate::inline::driver();
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
            match driver {
                // Inline mode: this thread is the engine while it spins.
                Some(d) => {
                    d.try_drive();
                    while !hint() {
                        now = Instant::now();
                        if now >= spin_end || deadline.is_some_and(|d| now >= d) {
                            break;
                        }
                        spin_pause();
                        d.try_drive();
                    }
                }
                None => {
                    spin_pause();
                    while !hint() {
                        now = Instant::now();
                        if now >= spin_end || deadline.is_some_and(|d| now >= d) {
                            break;
                        }
                        spin_pause();
                    }
                }
            }
            continue;
        }
        if let Some(d) = driver {
            d.park();
        }
        match wait_readable(fd, deadline, MAX_SLEEP) {
            Err(libc::EINTR) if timeout.is_none() && restart_after_signal() => {}
            r => r?,
        }
    }
}
