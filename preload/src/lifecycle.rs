//! A socket's life: `socket`, `bind`, `listen` (the engine listener opens on first use),
//! `accept`, `connect`, `close`, `shutdown`.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libc::{c_int, sockaddr, socklen_t};

use crate::addr;
use crate::call::{fail, forget_descriptor, kernel_tcp_domain, sockopt_int, spin, xw};
use crate::engine::engine;
use crate::epoll;
use crate::errno::{errno_of, set_errno};
use crate::fork;
use crate::process::{config, xlog};
use crate::real;
use crate::sock::{self, lookup, Bound, ListenerSock, Opts, Sock, StreamSock};
use crate::wait::block;

/// Put `evfd` at descriptor number `target` (closing the kernel socket there), keeping
/// `FD_CLOEXEC`. Returns the program's `O_NONBLOCK`.
unsafe fn install(evfd: c_int, target: c_int) -> Result<bool, c_int> {
    // SAFETY: plain fcntl/dup3 on descriptors we were given.
    unsafe {
        let fdflags = real::fcntl(target, libc::F_GETFD, 0);
        let flflags = real::fcntl(target, libc::F_GETFL, 0);
        let cloexec = if fdflags >= 0 && fdflags & libc::FD_CLOEXEC != 0 {
            libc::O_CLOEXEC
        } else {
            0
        };
        if real::dup3(evfd, target, cloexec) < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        Ok(flflags >= 0 && flflags & libc::O_NONBLOCK != 0)
    }
}

/// `socket(2)`: always a kernel socket; it may move onto the engine at bind/connect.
pub(crate) unsafe fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: forwarded.
    let fd = unsafe { real::socket(domain, ty, proto) };
    if fd >= 0 {
        // A descriptor number reused after a close the shim did not see (dup2 onto it).
        sock::take_buffers(fd);
        fork::forget(fd);
    }
    fd
}

/// The options the program set on kernel socket `fd` before it moves to the engine: the
/// kernel stores and reports them, except explicit buffer sizes (see
/// [`sock::remember_buffer`]).
unsafe fn kernel_opts(fd: c_int) -> Opts {
    let get = |level, name| {
        // SAFETY: getsockopt on the caller's fd.
        unsafe { sockopt_int(fd, level, name) }.unwrap_or(0)
    };
    let mut l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = std::mem::size_of::<libc::linger>() as socklen_t;
    // SAFETY: valid out pointers of the right size.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&mut l as *mut libc::linger).cast(),
            &mut len,
        )
    };
    let (rcvbuf, sndbuf) = sock::take_buffers(fd);
    Opts {
        nodelay: get(libc::IPPROTO_TCP, libc::TCP_NODELAY),
        reuseaddr: get(libc::SOL_SOCKET, libc::SO_REUSEADDR),
        reuseport: get(libc::SOL_SOCKET, libc::SO_REUSEPORT),
        keepalive: get(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
        keepidle: get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
        keepintvl: get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
        keepcnt: get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
        linger: if r == 0 {
            (l.l_onoff, l.l_linger)
        } else {
            (0, 0)
        },
        rcvbuf,
        sndbuf,
        ..Opts::default()
    }
}

/// `bind(2)`.
pub(crate) unsafe fn bind(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(cfg) = config() {
        // SAFETY: caller's address buffer.
        if let Some(sa) = unsafe { addr::from_raw(a, len) } {
            // SAFETY: getsockopt on the caller's fd (an error reads as unset).
            let v6only = sa.is_ipv6()
                && unsafe { sockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) }
                    .is_some_and(|v| v != 0);
            if cfg.accelerate_bind_v6only(sa, v6only) {
                // SAFETY: getsockopt on the caller's fd.
                if let Some(domain) = unsafe { kernel_tcp_domain(fd) } {
                    if lookup(fd).is_some() {
                        return fail(libc::EINVAL);
                    }
                    if let Err(e) = sock::refuse_change(&[fd], true) {
                        return fail(e);
                    }
                    xlog!(Debug, "bind fd {fd} to {sa}: engine");
                    sock::insert(
                        fd,
                        Arc::new(Sock::Bound(Mutex::new(Bound {
                            addr: sa,
                            domain,
                            listening: None,
                            kernel_listening: false,
                            epoll: Vec::new(),
                        }))),
                    );
                    return 0;
                }
            }
        }
    }
    // SAFETY: forwarded.
    unsafe { real::bind(fd, a, len) }
}

/// `listen(2)`: on an accelerated address only recorded; see [`activate`].
pub(crate) unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    if let Err(e) = sock::refuse_change(&[fd], false) {
        return fail(e);
    }
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::listen(fd, backlog) };
    };
    match &*s {
        Sock::Listener(_) => 0,
        Sock::Stream(_) => fail(libc::EINVAL),
        Sock::Bound(b) => {
            let mut b = b.lock().unwrap_or_else(|p| p.into_inner());
            if b.listening.is_none() {
                // Listen on the kernel as well (possible for wildcard addresses), so
                // connections made before the first accept/poll are not refused.
                let bytes = addr::encode(b.addr, b.domain);
                // SAFETY: encoded address; the caller's socket.
                b.kernel_listening = unsafe {
                    real::bind(fd, bytes.as_ptr().cast(), bytes.len() as socklen_t) == 0
                        && real::listen(fd, backlog) == 0
                };
            }
            b.listening = Some(backlog);
            xlog!(
                Debug,
                "listen fd {fd} on {}: engine, opened on first use",
                b.addr
            );
            let regs = std::mem::take(&mut b.epoll);
            drop(b);
            if !regs.is_empty() {
                // SAFETY: the caller's descriptors.
                unsafe { move_epoll_registrations(fd, &regs) };
            }
            0
        }
    }
}

/// `listen` on a socket already in epoll sets: they watch the kernel socket, which the
/// engine listener's descriptor replaces. Open the listener now and register it in the
/// same sets with the same events and data (back on the kernel socket if the engine
/// cannot start).
unsafe fn move_epoll_registrations(fd: c_int, regs: &[(c_int, u32, u64)]) {
    for &(epfd, _, _) in regs {
        // SAFETY: plain epoll_ctl on the caller's descriptors.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }
    let s = xwa(fd);
    for &(epfd, events, data) in regs {
        let mut ev = libc::epoll_event { events, u64: data };
        let r = match &s {
            Some(s) => epoll::ctl(epfd, libc::EPOLL_CTL_ADD, fd, s.clone(), Some(ev)),
            // SAFETY: plain epoll_ctl on the caller's descriptors.
            None => unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) },
        };
        if r < 0 {
            xlog!(
                Warn,
                "fd {fd}: epoll set {epfd} lost the listener at listen: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Bind kernel socket `fd` to `sa` for a fallback to the kernel; when the kernel does not
/// have the address (the engine's own, `EADDRNOTAVAIL`), to the family's wildcard with the
/// same port instead, so the socket still has its port (and `getsockname`, `listen`,
/// `accept` work) rather than staying unbound.
unsafe fn kernel_bind(fd: c_int, sa: SocketAddr, domain: c_int) -> Result<(), c_int> {
    let try_bind = |sa: SocketAddr| {
        let bytes = addr::encode(sa, domain);
        // SAFETY: encoded address of the right length; the caller's socket.
        if unsafe { real::bind(fd, bytes.as_ptr().cast(), bytes.len() as socklen_t) } < 0 {
            Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO))
        } else {
            Ok(())
        }
    };
    match try_bind(sa) {
        Err(libc::EADDRNOTAVAIL) => {
            let wild = addr::unspecified(domain, sa.port());
            xlog!(
                Info,
                "fd {fd}: the kernel does not have {}, binding {wild} instead",
                sa.ip()
            );
            try_bind(wild)
        }
        r => r,
    }
}

/// Open the engine listener of a socket the program called `listen` on, in this process.
/// `Ok(None)`: the engine cannot start, the socket now listens on the kernel instead.
unsafe fn activate(fd: c_int, b: &Bound) -> Result<Option<Arc<Sock>>, c_int> {
    let (sa, domain) = (b.addr, b.domain);
    let backlog = b.listening.unwrap_or(128);
    let last_errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    let Some(eng) = engine() else {
        // Kernel fallback: do the bind and listen we skipped.
        sock::remove(fd);
        if b.kernel_listening {
            return Ok(None);
        }
        // SAFETY: the caller's socket.
        unsafe { kernel_bind(fd, sa, domain) }?;
        // SAFETY: forwarded.
        if unsafe { real::listen(fd, backlog) } < 0 {
            return Err(last_errno());
        }
        return Ok(None);
    };
    let backlog = if backlog <= 0 { 1 } else { backlog.min(4096) } as usize;
    // SAFETY: getsockopt on the caller's fd.
    let opts = unsafe { kernel_opts(fd) };
    let ls = eng
        .stack
        .listen_with(sa, backlog, Duration::from_secs(5), &opts.engine())
        .map_err(|e| errno_of(&e))?;
    // SAFETY: the eventfd is ours; `fd` is the caller's socket, replaced.
    let nonblock = unsafe { install(ls.as_raw_fd(), fd) }?;
    xlog!(Info, "listening on {sa} (engine), fd {fd}");
    let l = ListenerSock::new(ls, domain, nonblock, opts);
    // Register interest with the engine so the first connection signals the descriptor.
    l.readiness();
    let s = Arc::new(Sock::Listener(l));
    sock::insert(fd, s.clone());
    Ok(Some(s))
}

/// Like [`xw`], opening a recorded listener first (see [`activate`]).
pub(crate) fn xwa(fd: c_int) -> Option<Arc<Sock>> {
    let s = lookup(fd)?;
    if let Sock::Bound(b) = &*s {
        let b = b.lock().unwrap_or_else(|p| p.into_inner());
        b.listening?;
        // SAFETY: `fd` is the program's socket.
        return match unsafe { activate(fd, &b) } {
            Ok(a) => a,
            Err(e) => {
                xlog!(
                    Warn,
                    "engine listener on {} failed: {}",
                    b.addr,
                    std::io::Error::from_raw_os_error(e)
                );
                set_errno(e);
                None
            }
        };
    }
    s.common().is_some().then_some(s)
}

unsafe fn accept_impl(fd: c_int, a: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    if let Err(e) = sock::refuse_change(&[fd], false) {
        return fail(e);
    }
    let Some(s) = xwa(fd) else {
        // SAFETY: forwarded.
        let n = unsafe { real::accept4(fd, a, len, flags) };
        if n >= 0 {
            fork::forget(n);
        }
        return n;
    };
    let Sock::Listener(l) = &*s else {
        return fail(libc::EINVAL);
    };
    if !l.common.alive() {
        return fail(libc::EBADF);
    }
    let r = if l.common.nonblock.load(std::sync::atomic::Ordering::Relaxed) {
        l.accept_once_keep()
    } else {
        block(l.common.evfd, spin(), None, || l.accept_once())
    };
    let stream = match r {
        Ok(st) => st,
        Err(e) => return fail(e),
    };
    // Options set on the listener after `listen` apply to new connections too (the
    // engine already gave them the ones from `listen` time).
    let opts = *l.common.opts();
    let inherited = stream.options();
    if inherited.nodelay != Some(opts.nodelay != 0) {
        let _ = stream.set_nodelay(opts.nodelay != 0);
    }
    if inherited.keepalive != opts.keepalive_engine() {
        let _ = stream.set_keepalive(opts.keepalive_engine());
    }
    let peer = stream.peer_addr();
    let ring = engine().map(|e| e.stack.config().ring_size).unwrap_or(1);
    let cmd = if flags & libc::SOCK_CLOEXEC != 0 {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: duplicating the stream's own eventfd.
    let nfd = unsafe { real::fcntl(stream.as_raw_fd(), cmd, 0) };
    if nfd < 0 {
        return -1;
    }
    let st = StreamSock::new(
        stream,
        l.common.domain,
        flags & libc::SOCK_NONBLOCK != 0,
        opts,
        ring,
    );
    // Register read interest so the first bytes signal the descriptor.
    st.readiness(libc::POLLIN);
    sock::insert(nfd, Arc::new(Sock::Stream(st)));
    if let Some(p) = peer {
        // SAFETY: caller's buffers.
        unsafe { addr::write_out(&addr::encode(p, l.common.domain), a, len) };
    }
    nfd
}

/// `accept(2)`.
pub(crate) unsafe fn accept(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { accept_impl(fd, a, len, 0) }
}

/// `accept4(2)`.
pub(crate) unsafe fn accept4(
    fd: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { accept_impl(fd, a, len, flags) }
}

/// `connect(2)`.
pub(crate) unsafe fn connect(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    if let Err(e) = sock::refuse_change(&[fd], false) {
        return fail(e);
    }
    if let Some(s) = xw(fd) {
        return match &*s {
            Sock::Stream(st) => {
                let mut g = st.lock();
                if g.stream.phase() == xwarp_stack::Phase::Connecting {
                    fail(libc::EALREADY)
                } else if let Some(e) = g.stream.error() {
                    if g.reported {
                        fail(libc::ECONNABORTED)
                    } else {
                        g.reported = true;
                        g.so_error = None;
                        fail(errno_of(&e.to_io()))
                    }
                } else {
                    fail(libc::EISCONN)
                }
            }
            _ => fail(libc::EINVAL),
        };
    }
    let Some(cfg) = config() else {
        // SAFETY: forwarded.
        return unsafe { real::connect(fd, a, len) };
    };
    // SAFETY: caller's address.
    let dst = unsafe { addr::from_raw(a, len) };
    let bound = lookup(fd);
    // An engine destination from a kernel TCP socket (not UDP, AF_UNIX, ...), and the
    // engine running: else the kernel connects.
    let engine_dst = dst.filter(|d| cfg.accelerate_connect(*d));
    // SAFETY: getsockopt on the caller's fd.
    let domain = engine_dst.and_then(|_| unsafe { kernel_tcp_domain(fd) });
    let eng = domain.and_then(|_| engine());
    let (Some(dst), Some(domain), Some(eng)) = (engine_dst, domain, eng) else {
        if let Some(Sock::Bound(b)) = bound.as_deref() {
            // Bound to the engine's address but on the kernel: the kernel cannot use that
            // address; fall back with the port only.
            let b = b.lock().unwrap_or_else(|p| p.into_inner());
            sock::remove(fd);
            let wild = addr::unspecified(b.domain, b.addr.port());
            // SAFETY: the caller's socket.
            if let Err(e) = unsafe { kernel_bind(fd, wild, b.domain) } {
                return fail(e);
            }
        }
        // SAFETY: forwarded.
        return unsafe { real::connect(fd, a, len) };
    };
    let local_port = match bound.as_deref() {
        Some(Sock::Bound(b)) => {
            let p = b.lock().unwrap_or_else(|p| p.into_inner()).addr.port();
            (p != 0).then_some(p)
        }
        _ => None,
    };
    // SAFETY: getsockopt on the caller's fd.
    let opts = unsafe { kernel_opts(fd) };
    let stream = match eng
        .stack
        .connect_with(dst, local_port, None, &opts.engine())
    {
        Ok(s) => s,
        Err(e) => return fail(errno_of(&e)),
    };
    // SAFETY: our eventfd over the caller's socket.
    let nonblock = match unsafe { install(stream.as_raw_fd(), fd) } {
        Ok(nb) => nb,
        Err(e) => return fail(e),
    };
    if let Err(e) = sock::refuse_change(&[], true) {
        return fail(e);
    }
    xlog!(Debug, "connect fd {fd} to {dst}: engine");
    let st = Arc::new(Sock::Stream(StreamSock::new(
        stream,
        domain,
        nonblock,
        opts,
        eng.stack.config().ring_size,
    )));
    sock::insert(fd, st.clone());
    let Sock::Stream(st) = &*st else {
        return fail(libc::EIO);
    };
    if nonblock {
        return fail(libc::EINPROGRESS);
    }
    let r = block(st.common.evfd, spin(), None, || {
        let mut g = st.lock();
        match g.stream.poll_connect() {
            Ok(true) => Ok(()),
            Ok(false) => Err(libc::EAGAIN),
            Err(e) => {
                g.reported = true;
                Err(errno_of(&e))
            }
        }
    });
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `close(2)`.
pub(crate) unsafe fn close(fd: c_int) -> c_int {
    if let Err(e) = sock::refuse_change(&[fd], false) {
        return fail(e);
    }
    forget_descriptor(fd);
    // SAFETY: forwarded.
    unsafe { real::close(fd) }
}

/// `shutdown(2)`.
pub(crate) unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::shutdown(fd, how) };
    };
    let Sock::Stream(st) = &*s else {
        return fail(libc::ENOTCONN);
    };
    if !st.common.alive() {
        return fail(libc::EBADF);
    }
    let mut g = st.lock();
    if g.stream.phase() == xwarp_stack::Phase::Connecting {
        return fail(libc::ENOTCONN);
    }
    match how {
        libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR => {}
        _ => return fail(libc::EINVAL),
    }
    if how != libc::SHUT_WR {
        g.read_shut = true;
    }
    if how != libc::SHUT_RD && !g.write_shut {
        g.write_shut = true;
        if let Err(e) = g.stream.shutdown_write() {
            return fail(errno_of(&e));
        }
    }
    drop(g);
    // Readers and writers waiting on the descriptor must re-check.
    let one = 1u64.to_ne_bytes();
    // SAFETY: write 8 bytes to our eventfd.
    unsafe { real::write(st.common.evfd, one.as_ptr().cast(), 8) };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel fallback of a socket bound to an address the kernel does not have (the
    /// engine's) keeps its port on the wildcard: the socket can listen and is named.
    #[test]
    fn kernel_bind_of_an_address_the_kernel_lacks_takes_the_wildcard_with_the_port() {
        // SAFETY: plain socket calls on descriptors this test owns.
        unsafe {
            let probe = std::net::TcpListener::bind("0.0.0.0:0").expect("probe");
            let port = probe.local_addr().expect("addr").port();
            drop(probe);
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            // TEST-NET-1: never configured on a test machine.
            let sa: SocketAddr = format!("192.0.2.77:{port}").parse().unwrap();
            assert_eq!(kernel_bind(fd, sa, libc::AF_INET), Ok(()));
            assert_eq!(libc::listen(fd, 4), 0);
            let mut raw: libc::sockaddr_storage = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
            assert_eq!(
                libc::getsockname(
                    fd,
                    (&mut raw as *mut libc::sockaddr_storage).cast(),
                    &mut len
                ),
                0
            );
            let got = addr::from_raw((&raw as *const libc::sockaddr_storage).cast(), len);
            assert_eq!(got, Some(format!("0.0.0.0:{port}").parse().unwrap()));
            libc::close(fd);
        }
    }
}
