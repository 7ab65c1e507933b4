//! epoll sets mixing kernel and xwarp descriptors.
//!
//! An xwarp descriptor is registered in the kernel epoll set as its readiness eventfd,
//! **edge-triggered** (`EPOLLIN | EPOLLET`, plus the program's `EPOLLEXCLUSIVE`), tagged so
//! `epoll_wait` can tell it apart; the program's own event mask and data are kept here per
//! (epoll fd, fd). The kernel thus reports a descriptor once per signal of its eventfd
//! (the engine signals when data, a connection or a state change arrives for a socket
//! whose reader found it empty), and the eventfd is never drained for epoll's sake.
//! Level-triggered readiness lives in user space: a socket found readable goes on its
//! set's *hot list* and is re-checked by each `epoll_wait` without a system call for as
//! long as it stays readable (the check that finds it empty registers interest at the
//! engine, so the next arrival signals again). The kernel is asked when the hot list
//! gave nothing, when any readiness eventfd was signalled since the set last asked
//! ([`crate::inline::signals`]), when its last answer filled the buffer, and otherwise
//! every 16th call when the set may hold kernel descriptors (pipes, timers, kernel
//! sockets: they signal nothing the shim sees).
//!
//! `epoll_wait` computes the exact readiness of each event, drops spurious ones, and
//! synthesizes `EPOLLOUT` (the eventfd has no useful writability): level-triggered
//! writers are reported whenever writable; edge-triggered ones once after registration
//! and after each wakeup. `EPOLLONESHOT` is handled here (the kernel registration is
//! disabled after delivery and re-enabled by `EPOLL_CTL_MOD`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::{c_int, epoll_event};

use crate::errno::set_errno;
use crate::inline::KernelLooks;
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
const EXCLUSIVE: u32 = libc::EPOLLEXCLUSIVE as u32;
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
    /// On its set's hot list.
    hot: bool,
}

impl Reg {
    /// Level-triggered input interest: what the hot list holds.
    fn level_in(&self) -> bool {
        self.events & (IN | ET) == IN
    }
}

/// What an epoll set keeps besides its registrations.
#[derive(Debug, Default)]
struct Set {
    /// Level-triggered input registrations last found readable (see the module docs).
    hot: Vec<c_int>,
    /// Registrations with `EPOLLOUT` interest (none: the synthesis scan is skipped).
    outs: usize,
    /// The kernel's last answer filled the caller's buffer: more may wait there.
    full: bool,
    /// When the next look asks the kernel.
    looks: KernelLooks,
}

/// Every registration of xwarp descriptors, and the sets' own state.
#[derive(Debug)]
pub(crate) struct Regs {
    map: BTreeMap<(c_int, c_int), Reg>,
    sets: BTreeMap<c_int, Set>,
}

impl Regs {
    /// Forget registration `k` (bookkeeping only).
    fn drop_reg(&mut self, k: (c_int, c_int)) -> bool {
        let Some(r) = self.map.remove(&k) else {
            return false;
        };
        if let Some(set) = self.sets.get_mut(&k.0) {
            if r.events & OUT != 0 {
                set.outs -= 1;
            }
            if r.hot {
                set.hot.retain(|&f| f != k.1);
            }
        }
        true
    }
}

static COUNT: AtomicUsize = AtomicUsize::new(0);
static REGS: Mutex<Regs> = Mutex::new(Regs {
    map: BTreeMap::new(),
    sets: BTreeMap::new(),
});
/// The epoll descriptors [`REGS`] may hold registrations of (a `close` of any other
/// descriptor takes no lock, see `sigsafe.rs`).
static EPFDS: FdBits = FdBits::new();
/// The epoll descriptors that may hold kernel descriptors (set on their first
/// `EPOLL_CTL_ADD` of one; cleared when the epoll descriptor closes): only those need the
/// periodic kernel look of a wait whose engine sockets keep it busy.
static KERNEL_FDS: FdBits = FdBits::new();

/// A kernel descriptor is about to be added to `epfd` (lock-free).
pub(crate) fn note_kernel_fd(epfd: c_int) {
    KERNEL_FDS.set(epfd);
}

/// The registrations, locked (also by the fork prepare handler across `fork`, after the
/// descriptor table: nothing that holds them takes the table).
pub(crate) type RegsGuard = MutexGuard<'static, Regs>;

/// Lock the registrations (see [`RegsGuard`]).
pub(crate) fn regs() -> RegsGuard {
    REGS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The kernel-side events of a registration: its eventfd, edge-triggered (a signal is an
/// edge; level-triggered readiness is the hot list's), `EPOLLEXCLUSIVE` passed through.
fn kernel_events(events: u32, disabled: bool) -> u32 {
    if disabled {
        0
    } else {
        IN | ET | (events & EXCLUSIVE)
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
            if op == libc::EPOLL_CTL_ADD && m.map.contains_key(&(epfd, fd)) {
                set_errno(libc::EEXIST);
                return -1;
            }
            if op == libc::EPOLL_CTL_MOD && !m.map.contains_key(&(epfd, fd)) {
                set_errno(libc::ENOENT);
                return -1;
            }
            if kctl(epfd, op, fd, kernel_events(events, false)) < 0 {
                return -1;
            }
            let fresh = !m.drop_reg((epfd, fd));
            let reg = Reg {
                sock,
                events,
                data,
                disabled: false,
                out_edge: events & OUT != 0,
                // Whatever is readable already is reported by the next wait.
                hot: events & (IN | ET) == IN,
            };
            let set = m.sets.entry(epfd).or_default();
            if reg.events & OUT != 0 {
                set.outs += 1;
            }
            if reg.hot {
                set.hot.push(fd);
            }
            m.map.insert((epfd, fd), reg);
            if fresh {
                COUNT.fetch_add(1, Ordering::Release);
            }
            0
        }
        libc::EPOLL_CTL_DEL => {
            let r = kctl(epfd, op, fd, 0);
            if m.drop_reg((epfd, fd)) {
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
    let mut g = regs();
    let m = &mut *g;
    let before = m.map.len();
    let sets = &mut m.sets;
    m.map.retain(|k, r| {
        if k.1 == fd {
            // Best effort: ENOENT/EBADF mean there is no item left to remove.
            let _ = kctl(k.0, libc::EPOLL_CTL_DEL, fd, 0);
            if let Some(set) = sets.get_mut(&k.0) {
                if r.events & OUT != 0 {
                    set.outs -= 1;
                }
                if r.hot {
                    set.hot.retain(|&f| f != fd);
                }
            }
            false
        } else {
            true
        }
    });
    COUNT.fetch_sub(before - m.map.len(), Ordering::Release);
}

/// The epoll descriptor `epfd` was closed.
pub(crate) fn forget_epfd(epfd: c_int) {
    KERNEL_FDS.clear(epfd);
    if COUNT.load(Ordering::Acquire) == 0 || !EPFDS.maybe(epfd) {
        return;
    }
    let mut m = regs();
    let before = m.map.len();
    m.map.retain(|k, _| k.0 != epfd);
    // Removing a map entry frees (close may run in a signal handler: the set's hot list
    // is kept, emptied, for the number's next epoll set).
    if let Some(set) = m.sets.get_mut(&epfd) {
        set.hot.clear();
        set.outs = 0;
        set.full = false;
    }
    COUNT.fetch_sub(before - m.map.len(), Ordering::Release);
    EPFDS.clear(epfd);
}

/// `true` if `epfd` may hold xwarp registrations.
pub(crate) fn involved(epfd: c_int) -> bool {
    COUNT.load(Ordering::Acquire) != 0
        && regs()
            .map
            .range((epfd, c_int::MIN)..=(epfd, c_int::MAX))
            .next()
            .is_some()
}

/// Readiness of a registration in epoll bits, restricted to what it asked for. Leaves
/// the eventfd alone (the kernel holds it edge-triggered).
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
    let got = sock::readiness_keep(&r.sock, want) as u16 as u32;
    let mut mask = r.events | ALWAYS;
    if !check_out {
        mask &= !OUT;
    }
    if !woke && r.events & IN != 0 && !level {
        // Edge-triggered input is reported only on a wakeup.
        mask &= !(IN | libc::EPOLLRDHUP as u32);
    }
    got & (mask & !(ET | ONESHOT | EXCLUSIVE | libc::EPOLLWAKEUP as u32))
}

/// What kind of look: it decides when the kernel must be asked ([`KernelLooks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// A wait that blocks when nothing is ready: asks the kernel when user space found
    /// nothing.
    Wait,
    /// A spinning inline wait's look between engine iterations: never blocks, asks the
    /// kernel only when [`KernelLooks`] says it may know more.
    Spin,
}

/// `epoll_wait`/`epoll_pwait` on a set holding xwarp descriptors.
///
/// In inline mode (`XWARP_MODE=inline`) the caller drives the engine first: a call with a
/// timeout runs engine iterations between non-blocking looks for up to the spin budget
/// (`XWARP_SPIN_US`), then parks (the engine's keeper takes over: it fires the timers and
/// takes in frames while the caller sleeps) and blocks for what is left of the timeout.
/// The looks between iterations are user-space ones (hot list, synthesized `EPOLLOUT`);
/// the kernel is asked only when a readiness eventfd was signalled since it was last
/// asked, and every 16th look when the set holds kernel descriptors ([`KernelLooks`]).
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
    if max <= 0 || events.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: caller guarantees `max` entries.
    let out = unsafe { std::slice::from_raw_parts_mut(events, max as usize) };
    let start = Instant::now();
    let spin = crate::process::spin();
    loop {
        d.try_drive();
        // SAFETY: a valid buffer; `mask` as the caller's.
        let r = unsafe { look(epfd, out, 0, mask, Kernel::Spin) };
        if r != 0 || timeout == 0 {
            return r;
        }
        let spent = start.elapsed();
        if timeout > 0 && spent >= Duration::from_millis(timeout as u64) {
            return 0;
        }
        if spent >= spin {
            break;
        }
        // The core goes to a thread woken onto it (a local peer this round's transmit
        // woke, the keeper) instead of waiting for the spin to run out (see `spin_pause`).
        crate::wait::spin_pause();
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
        let t = match deadline {
            None => -1,
            Some(d) => ms_until(d),
        };
        // SAFETY: a valid buffer; `mask` as the caller's.
        let r = unsafe { look(epfd, out, t, mask, Kernel::Wait) };
        if r != 0 {
            return r;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
    }
}

/// Milliseconds until `d` for the kernel's timeout, rounded **up**: rounded down, the
/// last fraction of a millisecond became a timeout of 0 and the wait spun through
/// `epoll_wait(.., 0)` calls until the deadline passed (as the kernel does, a timeout
/// ends no earlier than asked).
fn ms_until(d: Instant) -> c_int {
    let left = d.saturating_duration_since(Instant::now());
    let ms = left.as_nanos().div_ceil(1_000_000);
    ms.min(i32::MAX as u128) as c_int
}

/// One look at the set: the hot list and synthesized `EPOLLOUT` in user space, then (as
/// `kernel` says) the kernel's epoll with timeout `t` ms (-1: forever; 0 when user space
/// found something). Returns the number of events written to `out`, or -1 (errno set).
///
/// # Safety
/// `mask` null or a valid sigset.
unsafe fn look(
    epfd: c_int,
    out: &mut [epoll_event],
    t: c_int,
    mask: *const libc::sigset_t,
    kernel: Kernel,
) -> c_int {
    let mut n = 0usize;
    let mut poll_soon = false;
    {
        let mut g = regs();
        let Regs { map, sets } = &mut *g;
        let Some(set) = sets.get_mut(&epfd) else {
            drop(g);
            // No xwarp registration left (closed meanwhile): the kernel's set as it is.
            // SAFETY: the caller's buffer and count.
            return unsafe { kernel_wait(epfd, out, t, mask) };
        };
        let kernel_fds = KERNEL_FDS.maybe(epfd);
        // When the kernel is to be asked anyway, user space leaves it one slot: a hot list
        // longer than the caller's buffer must not keep it from ever being asked.
        let cap = if out.len() > 1 && set.looks.would_ask(set.full, kernel_fds) {
            out.len() - 1
        } else {
            out.len()
        };
        // Synthesized EPOLLOUT of registrations not on the hot list (the hot list's
        // look covers both directions): level-triggered ones and pending ET edges.
        if set.outs > 0 {
            for ((_, _), r) in map.range_mut((epfd, c_int::MIN)..=(epfd, c_int::MAX)) {
                if n >= cap {
                    break;
                }
                if r.disabled || r.events & OUT == 0 || r.hot {
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
                } else {
                    poll_soon = true;
                }
            }
        }
        // The hot list: level-triggered input found readable before, re-checked.
        let mut i = 0;
        while i < set.hot.len() {
            let fd = set.hot[i];
            let Some(r) = map.get_mut(&(epfd, fd)) else {
                set.hot.swap_remove(i);
                continue;
            };
            if r.disabled || !r.level_in() {
                r.hot = false;
                set.hot.swap_remove(i);
                continue;
            }
            if n >= cap {
                // The rest are looked at first next time (every hot socket gets its turn).
                set.hot.rotate_left(i);
                break;
            }
            let got = ready(r, true);
            if got & (IN | ALWAYS | libc::EPOLLRDHUP as u32) == 0 {
                // Empty now: the look registered interest, the next arrival signals.
                r.hot = false;
                set.hot.swap_remove(i);
                if got != 0 {
                    out[n] = epoll_event {
                        events: got,
                        u64: r.data,
                    };
                    n += 1;
                }
                continue;
            }
            out[n] = epoll_event {
                events: got,
                u64: r.data,
            };
            n += 1;
            if r.events & ONESHOT != 0 {
                r.disabled = true;
                r.hot = false;
                set.hot.swap_remove(i);
                kctl(epfd, libc::EPOLL_CTL_MOD, fd, 0);
                continue;
            }
            i += 1;
        }
        let must = set.full || (kernel == Kernel::Wait && n == 0);
        if n == out.len() {
            set.looks.skip();
            return n as c_int;
        }
        if !set.looks.due(must, kernel_fds) {
            return n as c_int;
        }
    }
    let room = out.len() - n;
    let mut t = t;
    if n > 0 {
        t = 0;
    } else if poll_soon {
        // A writer waits for ring space the eventfd cannot announce: look again soon.
        t = if t < 0 { 1 } else { t.min(1) };
    }
    if room == 0 {
        return n as c_int;
    }
    // SAFETY: `out[n..]` has `room` entries.
    let k = unsafe { kernel_wait(epfd, &mut out[n..], t, mask) };
    if k < 0 {
        if n > 0 {
            return n as c_int;
        }
        return -1;
    }
    // Translate the kernel's events in place, compacting dropped ones.
    let mut w = n;
    let mut g = regs();
    let Regs { map, sets } = &mut *g;
    let Some(set) = sets.get_mut(&epfd) else {
        // Every registration went meanwhile: drop the tagged events.
        for i in n..n + k as usize {
            let ev = out[i];
            if ev.u64 & TAG_MASK != TAG {
                out[w] = ev;
                w += 1;
            }
        }
        return w as c_int;
    };
    set.full = k as usize == room;
    for i in n..n + k as usize {
        let ev = out[i];
        let data = ev.u64;
        if data & TAG_MASK != TAG {
            out[w] = ev;
            w += 1;
            continue;
        }
        let fd = (data & 0xffff_ffff) as u32 as c_int;
        let Some(r) = map.get_mut(&(epfd, fd)) else {
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
        if r.level_in() && !r.hot && got & IN != 0 && r.events & ONESHOT == 0 {
            r.hot = true;
            set.hot.push(fd);
        }
        // Merge with a user-space event for the same registration.
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
    w as c_int
}

/// The kernel's `epoll_wait`/`epoll_pwait` into `out`.
///
/// # Safety
/// `mask` null or a valid sigset.
unsafe fn kernel_wait(
    epfd: c_int,
    out: &mut [epoll_event],
    t: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    let len = out.len().min(c_int::MAX as usize) as c_int;
    // SAFETY: `out` has `len` entries; `mask` as the caller's.
    unsafe {
        if mask.is_null() {
            real::epoll_wait(epfd, out.as_mut_ptr(), len, t)
        } else {
            real::epoll_pwait(epfd, out.as_mut_ptr(), len, t, mask)
        }
    }
}
