//! Descriptor calls: `fcntl` (`O_NONBLOCK`, `F_DUPFD`), `ioctl` (`FIONBIO`, `FIONREAD`,
//! `TIOCOUTQ`) and `dup`/`dup2`/`dup3`, which keep the socket table in step.

use libc::{c_int, c_ulong, c_void};

use crate::call::{fail, forget_descriptor, xw};
use crate::fork;
use crate::real;
use crate::sock::{self, lookup, Sock};

unsafe fn fcntl_impl(fd: c_int, cmd: c_int, arg: c_ulong, big: bool) -> c_int {
    let call = |fd, cmd, arg| {
        // SAFETY: forwarded.
        unsafe {
            if big {
                real::fcntl64(fd, cmd, arg)
            } else {
                real::fcntl(fd, cmd, arg)
            }
        }
    };
    let Some(s) = xw(fd) else {
        let n = call(fd, cmd, arg);
        if n >= 0 && matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
            fork::after_dup(fd, n);
        }
        return n;
    };
    let Some(c) = s.common() else {
        return call(fd, cmd, arg);
    };
    match cmd {
        libc::F_GETFL => {
            let f = call(fd, cmd, arg);
            if f < 0 {
                return f;
            }
            let nb = if c.nonblock.load(std::sync::atomic::Ordering::Relaxed) {
                libc::O_NONBLOCK
            } else {
                0
            };
            (f & !libc::O_NONBLOCK) | nb
        }
        libc::F_SETFL => {
            c.nonblock.store(
                arg as c_int & libc::O_NONBLOCK != 0,
                std::sync::atomic::Ordering::Relaxed,
            );
            0
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            if let Err(e) = sock::refuse_change(&[fd], false) {
                return fail(e);
            }
            let n = call(fd, cmd, arg);
            if n >= 0 {
                sock::insert(n, s.clone());
            }
            n
        }
        _ => call(fd, cmd, arg),
    }
}

/// `fcntl(2)` (the third argument read as an integer or pointer, as the ABI passes it).
pub(crate) unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fcntl_impl(fd, cmd, arg, false) }
}

/// `fcntl64` (glibc's name for programs built with 64-bit offsets).
pub(crate) unsafe fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fcntl_impl(fd, cmd, arg, true) }
}

/// `ioctl(2)`: `FIONBIO` and `FIONREAD` on xwarp sockets.
pub(crate) unsafe fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::ioctl(fd, req, arg) };
    };
    let Some(c) = s.common() else {
        return fail(libc::EBADF);
    };
    match req {
        libc::FIONBIO => {
            if arg.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: caller's int.
            let on = unsafe { *arg.cast::<c_int>() } != 0;
            c.nonblock.store(on, std::sync::atomic::Ordering::Relaxed);
            0
        }
        libc::FIONREAD => {
            if arg.is_null() {
                return fail(libc::EFAULT);
            }
            let n = match &*s {
                Sock::Stream(st) => st.available(),
                _ => return fail(libc::EINVAL),
            };
            // SAFETY: caller's int.
            unsafe { *arg.cast::<c_int>() = n.min(c_int::MAX as usize) as c_int };
            0
        }
        libc::TIOCOUTQ => {
            let n = match &*s {
                Sock::Stream(st) => st.unsent(),
                _ => return fail(libc::EINVAL),
            };
            if arg.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: caller's int.
            unsafe { *arg.cast::<c_int>() = n.min(c_int::MAX as usize) as c_int };
            0
        }
        _ => fail(libc::ENOTTY),
    }
}

/// `dup(2)`.
pub(crate) unsafe fn dup(fd: c_int) -> c_int {
    if let Err(e) = sock::refuse_change(&[fd], false) {
        return fail(e);
    }
    // SAFETY: forwarded.
    let n = unsafe { real::dup(fd) };
    if n >= 0 {
        if let Some(s) = lookup(fd) {
            sock::insert(n, s);
        }
        fork::after_dup(fd, n);
    }
    n
}

/// `new` now duplicates `old`. Linux closed `new` first, silently: what it was goes the
/// way of `close` (an engine connection whose last descriptor it was closes, resetting on
/// unread input), then `new` becomes what `old` is.
fn after_dup_onto(old: c_int, new: c_int) {
    forget_descriptor(new);
    fork::after_dup(old, new);
    if let Some(s) = lookup(old) {
        sock::insert(new, s);
    }
}

/// `dup2(2)`.
pub(crate) unsafe fn dup2(old: c_int, new: c_int) -> c_int {
    if let Err(e) = sock::refuse_change(&[old, new], false) {
        return fail(e);
    }
    // SAFETY: forwarded.
    let n = unsafe { real::dup2(old, new) };
    if n >= 0 && old != new {
        after_dup_onto(old, new);
    }
    n
}

/// `dup3(2)`.
pub(crate) unsafe fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if let Err(e) = sock::refuse_change(&[old, new], false) {
        return fail(e);
    }
    // SAFETY: forwarded.
    let n = unsafe { real::dup3(old, new, flags) };
    if n >= 0 {
        after_dup_onto(old, new);
    }
    n
}
