//! What the implementations of the intercepted calls share: returning an errno, finding
//! the xwarp socket behind a descriptor, probing a kernel socket.

use std::sync::Arc;

use libc::{c_int, socklen_t, ssize_t};

use crate::errno::set_errno;
pub(crate) use crate::process::spin;
use crate::real;
use crate::sock::{self, lookup, Sock};
use crate::{epoll, fork};

pub(crate) fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

pub(crate) fn fails(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

/// An xwarp socket of this process (not a `Bound` kernel socket).
pub(crate) fn xw(fd: c_int) -> Option<Arc<Sock>> {
    lookup(fd).filter(|s| s.common().is_some())
}

/// [`xw`] for the data calls, which a signal handler may make: `Err(EDEADLK)` instead of
/// waiting for the table when this thread holds socket locks and the table is taken
/// (see [`sock::lookup_io`]).
pub(crate) fn xw_io(fd: c_int) -> Result<Option<Arc<Sock>>, c_int> {
    Ok(sock::lookup_io(fd)?.filter(|s| s.common().is_some()))
}

/// The program's descriptor `fd` goes away (`close`, or `dup2`/`dup3` onto it, which close
/// it silently first): forget it in every table; when it was the last descriptor of an
/// engine socket, the socket closes as `close` closes it ([`sock::retire`]: reset on unread
/// input, `SO_LINGER`). A descriptor the shim does not own takes no lock here.
pub(crate) fn forget_descriptor(fd: c_int) {
    sock::take_buffers(fd);
    fork::forget(fd);
    if sock::any() {
        if let Some(s) = sock::remove(fd) {
            epoll::forget_fd(fd);
            if s.common().is_some_and(|c| !c.alive()) {
                // Inherited over fork: the engine behind it does not exist here.
                std::mem::forget(s);
            } else {
                sock::retire(s);
            }
        } else {
            epoll::forget_epfd(fd);
        }
    }
}

pub(crate) unsafe fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: valid out pointers.
    let r = unsafe { real::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// A kernel TCP socket over IPv4/IPv6 (the only kind the shim may take over): its domain.
pub(crate) unsafe fn kernel_tcp_domain(fd: c_int) -> Option<c_int> {
    // SAFETY: plain getsockopt calls.
    unsafe {
        if sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)? != libc::SOCK_STREAM {
            return None;
        }
        let proto = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
        if proto != 0 && proto != libc::IPPROTO_TCP {
            return None;
        }
        let d = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
        (d == libc::AF_INET || d == libc::AF_INET6).then_some(d)
    }
}
