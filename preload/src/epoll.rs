//! epoll sets mixing kernel and xwarp descriptors.
//!
//! An xwarp descriptor is registered in the kernel epoll set as its readiness eventfd with
//! `EPOLLIN` (plus the program's `EPOLLET`), tagged so `epoll_wait` can tell it apart; the
//! program's own event mask and data are kept here per (epoll fd, fd). `epoll_wait`
//! computes the exact readiness of each tagged event, drops spurious ones, and synthesizes
//! `EPOLLOUT` (the eventfd has no useful writability): level-triggered writers are reported
//! whenever writable; edge-triggered ones once after registration and after each wakeup.
//! `EPOLLONESHOT` is handled here (the kernel registration is disabled after delivery and
//! re-enabled by `EPOLL_CTL_MOD`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::{c_int, epoll_event};

use crate::errno::set_errno;
use crate::real;
use crate::sigsafe::FdBits;
use crate::sock::{self, Sock};

/// Upper 16 bits of the kernel-side data of an xwarp registration.
const TAG: u64 = 0x7877_0000_0000_0000;
const TAG_MASK: u64 = 0xffff_0000_0000_0000;

const IN: u32 = libc::EPOLLIN as u32;
const OUT: u32 = libc::EPOLLOUT as u32;
const ET: u32 = libc::EPOLLET as u32;
const ONESHOT: u32 = libc::EPOLLONESHOT as u32;
const ALWAYS: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;

/// One xwarp descriptor in one epoll set.
#[derive(Debug)]
pub(crate) struct Reg {
    sock: Arc<Sock>,
    events: u32,
    data: u64,
    /// ONESHOT delivered: silent until `EPOLL_CTL_MOD`.
    disabled: bool,
    /// Edge-triggered `EPOLLOUT` to report once if writable.
    out_edge: bool,
}

static COUNT: AtomicUsize = AtomicUsize::new(0);
static REGS: Mutex<BTreeMap<(c_int, c_int), Reg>> = Mutex::new(BTreeMap::new());
/// The epoll descriptors [`REGS`] may hold registrations of (a `close` of any other
/// descriptor takes no lock, see `sigsafe.rs`).
static EPFDS: FdBits = FdBits::new();

/// The registrations, locked (also by the fork prepare handler across `fork`, after the
/// descriptor table: nothing that holds them takes the table).
pub(crate) type RegsGuard = MutexGuard<'static, BTreeMap<(c_int, c_int), Reg>>;

/// Lock the registrations (see [`RegsGuard`]).
pub(crate) fn regs() -> RegsGuard {
    REGS.lock().unwrap_or_else(|p| p.into_inner())
}

fn kernel_events(events: u32, disabled: bool) -> u32 {
    if disabled {
        0
    } else {
        IN | (events & ET)
    }
}

fn kctl(epfd: c_int, op: c_int, fd: c_int, events: u32) -> c_int {
    let mut ev = epoll_event {
        events,
        u64: TAG | fd as u32 as u64,
    };
    // SAFETY: valid epoll_event.
    unsafe { real::epoll_ctl(epfd, op, fd, &mut ev) }
}

/// `epoll_ctl` for an xwarp descriptor.
pub(crate) fn ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    sock: Arc<Sock>,
    ev: Option<epoll_event>,
) -> c_int {
    let mut m = regs();
    EPFDS.set(epfd);
    match op {
        libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD => {
            let Some(ev) = ev else {
                set_errno(libc::EFAULT);
                return -1;
            };
            let events = ev.events;
            let data = ev.u64;
            if op == libc::EPOLL_CTL_ADD && m.contains_key(&(epfd, fd)) {
                set_errno(libc::EEXIST);
                return -1;
            }
            if op == libc::EPOLL_CTL_MOD && !m.contains_key(&(epfd, fd)) {
                set_errno(libc::ENOENT);
                return -1;
            }
            if kctl(epfd, op, fd, kernel_events(events, false)) < 0 {
                return -1;
            }
            let fresh = m
                .insert(
                    (epfd, fd),
                    Reg {
                        sock,
                        events,
                        data,
                        disabled: false,
                        out_edge: events & OUT != 0,
                    },
                )
                .is_none();
            if fresh {
                COUNT.fetch_add(1, Ordering::Release);
            }
            0
        }
        libc::EPOLL_CTL_DEL => {
            let r = kctl(epfd, op, fd, 0);
            if m.remove(&(epfd, fd)).is_some() {
                COUNT.fetch_sub(1, Ordering::Release);
            }
            r
        }
        _ => {
            set_errno(libc::EINVAL);
            -1
        }
    }
}

/// The descriptor `fd` is about to be closed or replaced: drop its registrations, in the
/// kernel's epoll sets too. The kernel keys an epoll item by (open file, fd number) and
/// drops it only when the file's last reference goes; the engine keeps its own reference
/// to a lingering socket's readiness eventfd, so an item left behind would keep firing
/// under the old number and, once `accept` reuses that number, be reported as a second
/// event of the new socket (a python `selectors` server then called `recv` on a socket it
/// had just closed: EBADF). Called before the real close, while `fd` still names the
/// eventfd; allocation-free (close may run in a signal handler).
pub(crate) fn forget_fd(fd: c_int) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut m = regs();
    let before = m.len();
    m.retain(|k, _| {
        if k.1 == fd {
            // Best effort: ENOENT/EBADF mean there is no item left to remove.
            let _ = kctl(k.0, libc::EPOLL_CTL_DEL, fd, 0);
            false
        } else {
            true
        }
    });
    COUNT.fetch_sub(before - m.len(), Ordering::Release);
}

/// The epoll descriptor `epfd` was closed.
pub(crate) fn forget_epfd(epfd: c_int) {
    if COUNT.load(Ordering::Acquire) == 0 || !EPFDS.maybe(epfd) {
        return;
    }
    let mut m = regs();
    let before = m.len();
    m.retain(|k, _| k.0 != epfd);
    COUNT.fetch_sub(before - m.len(), Ordering::Release);
    EPFDS.clear(epfd);
}

/// `true` if `epfd` may hold xwarp registrations.
pub(crate) fn involved(epfd: c_int) -> bool {
    COUNT.load(Ordering::Acquire) != 0
        && regs()
            .range((epfd, c_int::MIN)..=(epfd, c_int::MAX))
            .next()
            .is_some()
}

/// Readiness of a registration in epoll bits, restricted to what it asked for.
fn ready(r: &Reg, woke: bool) -> u32 {
    let level = r.events & ET == 0;
    let mut want: i16 = 0;
    if r.events & IN != 0 {
        want |= libc::POLLIN;
    }
    let check_out = r.events & OUT != 0 && (level || r.out_edge || woke);
    if check_out {
        want |= libc::POLLOUT;
    }
    let got = sock::readiness(&r.sock, want) as u16 as u32;
    let mut mask = r.events | ALWAYS;
    if !check_out {
        mask &= !OUT;
    }
    if !woke && r.events & IN != 0 && !level {
        // Edge-triggered input is reported only on a wakeup.
        mask &= !(IN | libc::EPOLLRDHUP as u32);
    }
    got & mask
}

/// `epoll_wait`/`epoll_pwait` on a set holding xwarp descriptors.
///
/// In inline mode (`XWARP_MODE=inline`) the caller drives the engine first: a call with a
/// timeout runs engine iterations between non-blocking looks for up to the spin budget
/// (`XWARP_SPIN_US`), then parks (the engine's keeper takes over: it fires the timers and
/// takes in frames while the caller sleeps) and blocks for what is left of the timeout.
///
/// # Safety
/// `events` must have room for `max` entries; `mask` null or a valid sigset.
pub(crate) unsafe fn wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    let Some(d) = crate::inline::driver() else {
        // SAFETY: same contract.
        return unsafe { wait_blocking(epfd, events, max, timeout, mask) };
    };
    let start = Instant::now();
    let spin = crate::process::spin();
    let mut round = 0u32;
    loop {
        let busy = d.try_drive();
        // Look (a syscall) on the first round, after an iteration that did work, and every
        // 16th round for the kernel's descriptors; an idle iteration changed no readiness
        // of the engine's sockets.
        if round > 0 && busy == Some(false) && !round.is_multiple_of(16) {
            round += 1;
            if start.elapsed() >= spin {
                break;
            }
            continue;
        }
        round += 1;
        // SAFETY: same contract.
        let r = unsafe { wait_blocking(epfd, events, max, 0, mask) };
        let spent = start.elapsed();
        if r != 0 || timeout == 0 || spent >= spin {
            if r != 0 || timeout == 0 {
                return r;
            }
            break;
        }
        if timeout > 0 && spent >= Duration::from_millis(timeout as u64) {
            return 0;
        }
    }
    d.park();
    let left = if timeout < 0 {
        -1
    } else {
        (timeout as u128).saturating_sub(start.elapsed().as_millis()) as c_int
    };
    // SAFETY: same contract.
    unsafe { wait_blocking(epfd, events, max, left, mask) }
}

/// [`wait`] without driving the engine: what every mode ends in.
///
/// # Safety
/// As [`wait`].
unsafe fn wait_blocking(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if max <= 0 || events.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    // SAFETY: caller guarantees `max` entries.
    let out = unsafe { std::slice::from_raw_parts_mut(events, max as usize) };
    loop {
        // Synthesized readiness: level-triggered EPOLLOUT and pending ET EPOLLOUT edges.
        let mut n = 0usize;
        let mut poll_soon = false;
        {
            let mut m = regs();
            for ((_, _), r) in m.range_mut((epfd, c_int::MIN)..=(epfd, c_int::MAX)) {
                if n == out.len() {
                    break;
                }
                if r.disabled || r.events & OUT == 0 {
                    continue;
                }
                let level = r.events & ET == 0;
                if !level && !r.out_edge {
                    continue;
                }
                let got = ready(r, false);
                if got & OUT != 0 {
                    r.out_edge = false;
                    out[n] = epoll_event {
                        events: got,
                        u64: r.data,
                    };
                    n += 1;
                    if r.events & ONESHOT != 0 {
                        r.disabled = true;
                    }
                } else if level || r.out_edge {
                    poll_soon = true;
                }
            }
        }
        let room = out.len() - n;
        let mut t = match deadline {
            None => -1,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as c_int,
        };
        if n > 0 {
            t = 0;
        } else if poll_soon {
            // A writer waits for ring space the eventfd cannot announce: look again soon.
            t = if t < 0 { 1 } else { t.min(1) };
        }
        let k = if room == 0 {
            0
        } else {
            // SAFETY: `out[n..]` has `room` entries.
            let kbuf = unsafe { out.as_mut_ptr().add(n) };
            // SAFETY: valid buffer and count.
            unsafe {
                if mask.is_null() {
                    real::epoll_wait(epfd, kbuf, room as c_int, t)
                } else {
                    real::epoll_pwait(epfd, kbuf, room as c_int, t, mask)
                }
            }
        };
        if k < 0 {
            if n > 0 {
                return n as c_int;
            }
            return -1;
        }
        // Translate the kernel's events in place, compacting dropped ones.
        let mut w = n;
        {
            let mut m = regs();
            for i in n..n + k as usize {
                let ev = out[i];
                let data = ev.u64;
                if data & TAG_MASK != TAG {
                    out[w] = ev;
                    w += 1;
                    continue;
                }
                let fd = (data & 0xffff_ffff) as u32 as c_int;
                let Some(r) = m.get_mut(&(epfd, fd)) else {
                    continue;
                };
                if r.disabled {
                    continue;
                }
                let got = ready(r, true);
                if got & OUT != 0 {
                    r.out_edge = false;
                }
                if got == 0 {
                    continue;
                }
                // Merge with a synthesized event for the same registration.
                if let Some(j) = (0..n).find(|&j| out[j].u64 == r.data) {
                    out[j].events |= got;
                    continue;
                }
                out[w] = epoll_event {
                    events: got,
                    u64: r.data,
                };
                w += 1;
                if r.events & ONESHOT != 0 {
                    r.disabled = true;
                    kctl(epfd, libc::EPOLL_CTL_MOD, fd, 0);
                }
            }
        }
        if w > 0 {
            return w as c_int;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
    }
}
