//! errno: set it, and map the engine's `io::Error`s onto it.

use std::io;

use libc::c_int;

/// The errno for an `io::Error` from the engine.
pub(crate) fn errno_of(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock => libc::EAGAIN,
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::ConnectionReset => libc::ECONNRESET,
        K::ConnectionAborted => libc::ECONNABORTED,
        K::TimedOut => libc::ETIMEDOUT,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::InvalidInput => libc::EINVAL,
        K::BrokenPipe => libc::EPIPE,
        K::NotConnected => libc::ENOTCONN,
        K::Interrupted => libc::EINTR,
        _ => libc::EIO,
    }
}

/// Set errno.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's errno after a failed C library call (`EIO` if it is not set).
pub(crate) fn last_errno() -> c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
