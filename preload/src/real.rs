//! The C library's own implementations of the calls the shim intercepts, found with
//! `dlsym(RTLD_NEXT, ...)` on first use.

#![allow(clippy::missing_safety_doc)]

use libc::{
    c_int, c_ulong, c_void, epoll_event, fd_set, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t,
    sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use std::sync::atomic::{AtomicPtr, Ordering};

/// Value a wrapper returns when the C library lacks the symbol (never on glibc).
pub(crate) trait Failure {
    /// `-1` of the return type.
    fn failure() -> Self;
}
impl Failure for c_int {
    fn failure() -> Self {
        -1
    }
}
impl Failure for ssize_t {
    fn failure() -> Self {
        -1
    }
}

fn lookup(slot: &AtomicPtr<c_void>, name: &'static [u8]) -> *mut c_void {
    let p = slot.load(Ordering::Relaxed);
    if !p.is_null() {
        return p;
    }
    // SAFETY: `name` is a NUL-terminated literal; dlsym is thread-safe.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    slot.store(p, Ordering::Relaxed);
    p
}

macro_rules! real_fns {
    ($( $name:ident ( $($arg:ident : $t:ty),* ) -> $r:ty ; )*) => {
        $(
            /// The C library's implementation.
            pub(crate) unsafe fn $name($($arg: $t),*) -> $r {
                static SLOT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
                let p = lookup(&SLOT, concat!(stringify!($name), "\0").as_bytes());
                if p.is_null() {
                    // SAFETY: errno is thread-local.
                    unsafe { *libc::__errno_location() = libc::ENOSYS };
                    return <$r as Failure>::failure();
                }
                // SAFETY: the symbol has this C signature in glibc.
                let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller upholds the C contract of the call.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

real_fns! {
    socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    listen(fd: c_int, backlog: c_int) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    close(fd: c_int) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(fd: c_int, fd2: c_int) -> c_int;
    dup3(fd: c_int, fd2: c_int, flags: c_int) -> c_int;
    poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    ppoll(fds: *mut pollfd, n: nfds_t, ts: *const timespec, mask: *const sigset_t) -> c_int;
    select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, tv: *mut timeval) -> c_int;
    pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, ts: *const timespec, mask: *const sigset_t) -> c_int;
    epoll_create(size: c_int) -> c_int;
    epoll_create1(flags: c_int) -> c_int;
    epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
    epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait(epfd: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    sendfile(out: c_int, inp: c_int, off: *mut off_t, count: size_t) -> ssize_t;
    pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t;
    lseek(fd: c_int, off: off_t, whence: c_int) -> off_t;
}

impl Failure for i64 {
    fn failure() -> Self {
        -1
    }
}
