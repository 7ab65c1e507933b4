//! The exported C symbols: only the entry points. Each hands its arguments to the module
//! that implements it (see the crate README's module map), which checks whether the
//! descriptor is an xwarp socket and otherwise calls the C library's implementation
//! untouched.

#![allow(clippy::missing_safety_doc)]

use libc::{
    c_int, c_ulong, c_void, epoll_event, fd_set, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t,
    sockaddr, socklen_t, ssize_t, timespec, timeval,
};

use crate::{fdops, io, lifecycle, poll, real, sockopt};

// ---------------------------------------------------------------------------------------
// socket lifecycle

/// `socket(2)`: always a kernel socket; it may move onto the engine at bind/connect.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { lifecycle::socket(domain, ty, proto) }
}

/// `bind(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { lifecycle::bind(fd, a, len) }
}

/// `listen(2)`: on an accelerated address only recorded; the engine listener opens on
/// first use.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { lifecycle::listen(fd, backlog) }
}

/// `accept(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { lifecycle::accept(fd, a, len) }
}

/// `accept4(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { lifecycle::accept4(fd, a, len, flags) }
}

/// `connect(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { lifecycle::connect(fd, a, len) }
}

/// `close(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { lifecycle::close(fd) }
}

/// `shutdown(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { lifecycle::shutdown(fd, how) }
}

// ---------------------------------------------------------------------------------------
// data

/// `read(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::read(fd, buf, n) }
}

/// `__read_chk` (fortified `read`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::__read_chk(fd, buf, n, buflen) }
}

/// `write(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::write(fd, buf, n) }
}

/// `readv(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::readv(fd, iov, cnt) }
}

/// `writev(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::writev(fd, iov, cnt) }
}

/// `recv(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::recv(fd, buf, n, flags) }
}

/// `__recv_chk` (fortified `recv`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::__recv_chk(fd, buf, n, buflen, flags) }
}

/// `send(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::send(fd, buf, n, flags) }
}

/// `recvfrom(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::recvfrom(fd, buf, n, flags, a, len) }
}

/// `__recvfrom_chk` (fortified `recvfrom`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::__recvfrom_chk(fd, buf, n, buflen, flags, a, len) }
}

/// `sendto(2)` (the address is ignored on a connected TCP socket, as by Linux).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    a: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::sendto(fd, buf, n, flags, a, len) }
}

/// `recvmsg(2)` (no ancillary data on xwarp sockets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::recvmsg(fd, msg, flags) }
}

/// `sendmsg(2)` (ancillary data is ignored on xwarp sockets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::sendmsg(fd, msg, flags) }
}

/// `sendfile(2)` with an xwarp socket as destination: file bytes are read and queued.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    inp: c_int,
    off: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::sendfile(out, inp, off, count) }
}

/// `sendfile64` (same as `sendfile` on 64-bit Linux).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { io::sendfile64(out, inp, off, count) }
}

// ---------------------------------------------------------------------------------------
// names and options

/// `getsockname(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { sockopt::getsockname(fd, a, len) }
}

/// `getpeername(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { sockopt::getpeername(fd, a, len) }
}

/// `getsockopt(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { sockopt::getsockopt(fd, level, name, val, len) }
}

/// `setsockopt(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { sockopt::setsockopt(fd, level, name, val, len) }
}

// ---------------------------------------------------------------------------------------
// descriptors

/// `fcntl(2)` (the third argument read as an integer or pointer, as the ABI passes it).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { fdops::fcntl(fd, cmd, arg) }
}

/// `fcntl64` (glibc's name for programs built with 64-bit offsets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { fdops::fcntl64(fd, cmd, arg) }
}

/// `ioctl(2)`: `FIONBIO` and `FIONREAD` on xwarp sockets.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { fdops::ioctl(fd, req, arg) }
}

/// `dup(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { fdops::dup(fd) }
}

/// `dup2(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { fdops::dup2(old, new) }
}

/// `dup3(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { fdops::dup3(old, new, flags) }
}

// ---------------------------------------------------------------------------------------
// readiness

/// `poll(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { poll::poll(fds, n, timeout) }
}

/// `__poll_chk` (fortified `poll`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { poll::__poll_chk(fds, n, timeout, fdslen) }
}

/// `ppoll(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { poll::ppoll(fds, n, ts, mask) }
}

/// `select(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { poll::select(nfds, r, w, e, tv) }
}

/// `pselect(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { poll::pselect(nfds, r, w, e, ts, mask) }
}

/// `epoll_create(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { real::epoll_create(size) }
}

/// `epoll_create1(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { real::epoll_create1(flags) }
}

/// `epoll_ctl(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { poll::epoll_ctl(epfd, op, fd, ev) }
}

/// `epoll_wait(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { poll::epoll_wait(epfd, ev, max, timeout) }
}

/// `epoll_pwait(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the caller's contract, passed on unchanged.
    unsafe { poll::epoll_pwait(epfd, ev, max, timeout, mask) }
}
