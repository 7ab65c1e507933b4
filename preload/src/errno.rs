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
        // The engine's socket limits (`max_sockets`, `socket_buffer_budget`): Linux says
        // ENOBUFS when it cannot allocate a socket's buffers.
        K::OutOfMemory => libc::ENOBUFS,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_socket_limit_is_enobufs_as_on_linux() {
        let e = io::Error::new(io::ErrorKind::OutOfMemory, "socket limit");
        assert_eq!(errno_of(&e), libc::ENOBUFS);
    }
}
