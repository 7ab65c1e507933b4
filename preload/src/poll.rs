//! Readiness: `poll`, `ppoll`, `select` and `pselect` over sets holding engine sockets
//! (exact readiness of those, the kernel for the rest), and the dispatch of the `epoll`
//! calls to [`crate::epoll`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{c_int, epoll_event, fd_set, nfds_t, pollfd, sigset_t, size_t, timespec, timeval};

use crate::epoll;
use crate::errno::set_errno;
use crate::inline::KernelLooks;
use crate::lifecycle::xwa;
use crate::real;
use crate::sock::{self, Sock};
use crate::wait;

/// `poll` over a set holding xwarp sockets. `timeout`: `None` waits forever. In inline
/// mode the caller drives the engine between non-blocking looks for up to the spin budget
/// first, then parks (the keeper takes over) and waits for the rest of the timeout. Those
/// looks are in user space (the engine sockets' readiness, no system call); the kernel's
/// `ppoll` is asked only for a set with kernel descriptors, every
/// [`KernelLooks::EVERY`]th round (the engine's readiness needs no kernel look).
unsafe fn poll_impl(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: Option<Duration>,
    mask: *const sigset_t,
) -> c_int {
    let Some(d) = crate::inline::driver() else {
        // SAFETY: same contract.
        return unsafe { poll_blocking(fds, n, timeout, mask) };
    };
    let start = Instant::now();
    let spin = crate::process::spin();
    // SAFETY: caller's array of n pollfds.
    let socks: Vec<Option<Arc<Sock>>> = unsafe { std::slice::from_raw_parts(fds, n as usize) }
        .iter()
        .map(|p| xwa(p.fd))
        .collect();
    let kernel_fds = socks.iter().any(|s| s.is_none());
    let mut round = 0u32;
    loop {
        d.try_drive();
        let r = if kernel_fds && round.is_multiple_of(KernelLooks::EVERY) {
            // SAFETY: same contract.
            unsafe { poll_blocking(fds, n, Some(Duration::ZERO), mask) }
        } else {
            // SAFETY: same contract.
            unsafe { poll_user(fds, n, &socks) }
        };
        round = round.wrapping_add(1);
        if r != 0 || timeout == Some(Duration::ZERO) {
            return r;
        }
        let spent = start.elapsed();
        if timeout.is_some_and(|t| spent >= t) {
            return 0;
        }
        if spent >= spin {
            break;
        }
        crate::wait::spin_pause();
    }
    d.park();
    let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
    // SAFETY: same contract.
    unsafe { poll_blocking(fds, n, left, mask) }
}

/// One user-space look of an inline spin: the exact readiness of the xwarp entries (the
/// eventfds left alone), no `revents` for kernel ones.
///
/// # Safety
/// `fds` is the caller's array of `n` pollfds; `socks` its xwarp sockets by index.
unsafe fn poll_user(fds: *mut pollfd, n: nfds_t, socks: &[Option<Arc<Sock>>]) -> c_int {
    // SAFETY: caller's array of n pollfds.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    let mut count = 0;
    for (p, s) in set.iter_mut().zip(socks) {
        p.revents = match s {
            Some(s) => {
                sock::readiness_keep(s, p.events)
                    & (p.events | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL)
            }
            None => 0,
        };
        if p.revents != 0 {
            count += 1;
        }
    }
    count
}

/// [`poll_impl`] without driving the engine.
unsafe fn poll_blocking(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: Option<Duration>,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: caller's array of n pollfds.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    let socks: Vec<Option<Arc<Sock>>> = set.iter().map(|p| xwa(p.fd)).collect();
    let deadline = timeout.map(|t| Instant::now() + t);
    // Only a call that may sleep on the eventfds drains those of sockets found not ready.
    let may_sleep = timeout != Some(Duration::ZERO);
    let orig: Vec<i16> = set.iter().map(|p| p.events).collect();
    loop {
        // Exact readiness of xwarp sockets first.
        let mut ready = 0;
        let mut out_wait = false;
        let mut xrev: Vec<i16> = vec![0; set.len()];
        for (i, s) in socks.iter().enumerate() {
            if let Some(s) = s {
                let want = orig[i];
                let got = if may_sleep {
                    sock::readiness(s, want)
                } else {
                    sock::readiness_keep(s, want)
                };
                let rev = got & (want | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL);
                xrev[i] = rev;
                if rev != 0 {
                    ready += 1;
                } else if want & libc::POLLOUT != 0 {
                    out_wait = true;
                }
            }
        }
        // Kernel descriptors (and the eventfds of xwarp ones, for the sleep).
        for (i, p) in set.iter_mut().enumerate() {
            p.revents = 0;
            if socks[i].is_some() {
                p.events = libc::POLLIN;
            }
        }
        let mut t: Option<Duration> = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if ready > 0 {
            t = Some(Duration::ZERO);
        } else {
            // Bound the sleep: a wakeup may have been consumed by another thread, and a
            // full send ring has no wakeup of its own.
            let cap = if out_wait {
                Duration::from_millis(1)
            } else {
                wait::MAX_SLEEP
            };
            t = Some(t.map_or(cap, |t| t.min(cap)));
        }
        let t = t.unwrap_or_default();
        let ts = timespec {
            tv_sec: t.as_secs() as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the caller's array, with events rewritten for xwarp entries.
        let r = unsafe { real::ppoll(set.as_mut_ptr(), n, &ts, mask) };
        let err = std::io::Error::last_os_error();
        let mut count = 0;
        for (i, p) in set.iter_mut().enumerate() {
            p.events = orig[i];
            if socks[i].is_some() {
                p.revents = xrev[i];
            }
            if p.revents != 0 {
                count += 1;
            }
        }
        if r < 0 {
            if count > 0 {
                return count;
            }
            set_errno(err.raw_os_error().unwrap_or(libc::EIO));
            return -1;
        }
        // Kernel results stand as they are; xwarp ones are re-computed after a sleep.
        if count > 0 {
            return count;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
    }
}

fn poll_involved(fds: *const pollfd, n: nfds_t) -> bool {
    if !sock::any() || fds.is_null() {
        return false;
    }
    // SAFETY: caller's array of n pollfds.
    let set = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    set.iter().any(|p| xwa(p.fd).is_some())
}

/// `poll(2)`.
pub(crate) unsafe fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if !poll_involved(fds, n) {
        // SAFETY: forwarded.
        return unsafe { real::poll(fds, n, timeout) };
    }
    let t = (timeout >= 0).then(|| Duration::from_millis(timeout as u64));
    // SAFETY: caller's array.
    unsafe { poll_impl(fds, n, t, std::ptr::null()) }
}

/// `__poll_chk` (fortified `poll`).
pub(crate) unsafe fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < n as usize {
        // SAFETY: fortify failure.
        unsafe { libc::abort() };
    }
    // SAFETY: same contract.
    unsafe { poll(fds, n, timeout) }
}

fn ts_duration(ts: *const timespec) -> Option<Duration> {
    if ts.is_null() {
        return None;
    }
    // SAFETY: caller's timespec.
    let t = unsafe { *ts };
    Some(Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    ))
}

/// `ppoll(2)`.
pub(crate) unsafe fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if !poll_involved(fds, n) {
        // SAFETY: forwarded.
        return unsafe { real::ppoll(fds, n, ts, mask) };
    }
    // SAFETY: caller's array.
    unsafe { poll_impl(fds, n, ts_duration(ts), mask) }
}

unsafe fn select_impl(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    timeout: Option<Duration>,
    mask: *const sigset_t,
) -> c_int {
    let mut pfds: Vec<pollfd> = Vec::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut ev = 0;
        // SAFETY: FD_ISSET on the caller's sets.
        unsafe {
            if !r.is_null() && libc::FD_ISSET(fd, r) {
                ev |= libc::POLLIN;
            }
            if !w.is_null() && libc::FD_ISSET(fd, w) {
                ev |= libc::POLLOUT;
            }
            if !e.is_null() && libc::FD_ISSET(fd, e) {
                ev |= libc::POLLPRI;
            }
        }
        if ev != 0 {
            pfds.push(pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    // SAFETY: our array.
    let n = unsafe { poll_impl(pfds.as_mut_ptr(), pfds.len() as nfds_t, timeout, mask) };
    if n < 0 {
        return n;
    }
    // SAFETY: FD_ZERO/FD_SET on the caller's sets.
    unsafe {
        for s in [r, w, e] {
            if !s.is_null() {
                libc::FD_ZERO(s);
            }
        }
        let mut count = 0;
        for p in &pfds {
            if p.revents & libc::POLLNVAL != 0 {
                set_errno(libc::EBADF);
                return -1;
            }
            let rd = p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
            let wr = p.revents & (libc::POLLOUT | libc::POLLERR) != 0;
            let ex = p.revents & libc::POLLPRI != 0;
            if rd && p.events & libc::POLLIN != 0 {
                libc::FD_SET(p.fd, r);
                count += 1;
            }
            if wr && p.events & libc::POLLOUT != 0 {
                libc::FD_SET(p.fd, w);
                count += 1;
            }
            if ex && p.events & libc::POLLPRI != 0 {
                libc::FD_SET(p.fd, e);
                count += 1;
            }
        }
        count
    }
}

fn select_involved(nfds: c_int, sets: [*mut fd_set; 3]) -> bool {
    if !sock::any() {
        return false;
    }
    (0..nfds.clamp(0, libc::FD_SETSIZE as c_int)).any(|fd| {
        // SAFETY: FD_ISSET on the caller's sets.
        sets.iter()
            .any(|s| !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) })
            && xwa(fd).is_some()
    })
}

/// `select(2)`.
pub(crate) unsafe fn select(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    if !select_involved(nfds, [r, w, e]) {
        // SAFETY: forwarded.
        return unsafe { real::select(nfds, r, w, e, tv) };
    }
    let t = if tv.is_null() {
        None
    } else {
        // SAFETY: caller's timeval.
        let t = unsafe { *tv };
        Some(
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.clamp(0, 999_999) as u64),
        )
    };
    // SAFETY: caller's sets.
    unsafe { select_impl(nfds, r, w, e, t, std::ptr::null()) }
}

/// `pselect(2)`.
pub(crate) unsafe fn pselect(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if !select_involved(nfds, [r, w, e]) {
        // SAFETY: forwarded.
        return unsafe { real::pselect(nfds, r, w, e, ts, mask) };
    }
    // SAFETY: caller's sets.
    unsafe { select_impl(nfds, r, w, e, ts_duration(ts), mask) }
}

/// `epoll_ctl(2)`.
pub(crate) unsafe fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    let Some(s) = xwa(fd) else {
        if op == libc::EPOLL_CTL_ADD {
            epoll::note_kernel_fd(epfd);
        }
        // SAFETY: forwarded.
        let r = unsafe { real::epoll_ctl(epfd, op, fd, ev) };
        if r == 0 {
            // SAFETY: caller's event (may be null for DEL).
            let e = (!ev.is_null()).then(|| unsafe { *ev });
            remember_before_listen(epfd, op, fd, e);
        }
        return r;
    };
    // SAFETY: caller's event (may be null for DEL).
    let e = (!ev.is_null()).then(|| unsafe { *ev });
    epoll::ctl(epfd, op, fd, s, e)
}

/// A socket bound to an engine address but not yet listening sits in epoll sets as its
/// kernel socket: note the registration, `listen` moves it onto the engine listener.
fn remember_before_listen(epfd: c_int, op: c_int, fd: c_int, e: Option<epoll_event>) {
    if !sock::any() {
        return;
    }
    let Some(s) = sock::lookup(fd) else {
        return;
    };
    let Sock::Bound(b) = &*s else {
        return;
    };
    let mut b = b.lock().unwrap_or_else(|p| p.into_inner());
    if b.listening.is_some() {
        return;
    }
    b.epoll.retain(|r| r.0 != epfd);
    if let (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, Some(e)) = (op, e) {
        b.epoll.push((epfd, e.events, e.u64));
    }
}

/// `epoll_wait(2)`.
pub(crate) unsafe fn epoll_wait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    if !epoll::involved(epfd) {
        // SAFETY: forwarded.
        return unsafe { real::epoll_wait(epfd, ev, max, timeout) };
    }
    // SAFETY: caller's buffer.
    unsafe { epoll::wait(epfd, ev, max, timeout, std::ptr::null()) }
}

/// `epoll_pwait(2)`.
pub(crate) unsafe fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    if !epoll::involved(epfd) {
        // SAFETY: forwarded.
        return unsafe { real::epoll_pwait(epfd, ev, max, timeout, mask) };
    }
    let mut empty: sigset_t = unsafe { std::mem::zeroed() };
    let m = if mask.is_null() {
        // SAFETY: sigemptyset on our set; epoll_pwait with an empty mask blocks nothing.
        unsafe { libc::sigemptyset(&mut empty) };
        std::ptr::null()
    } else {
        mask
    };
    // SAFETY: caller's buffer and mask.
    unsafe { epoll::wait(epfd, ev, max, timeout, m) }
}
