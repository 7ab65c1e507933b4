//! The exported C symbols. Each checks whether the descriptor is an xwarp socket and
//! otherwise calls the C library's implementation untouched.

#![allow(clippy::missing_safety_doc)]

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::{
    c_int, c_ulong, c_void, epoll_event, fd_set, msghdr, nfds_t, off_t, pollfd, sigset_t, size_t,
    sockaddr, socklen_t, ssize_t, timespec, timeval,
};

use crate::addr;
use crate::engine::engine;
use crate::epoll;
use crate::errno::{errno_of, set_errno};
use crate::fork;
use crate::process::{config, xlog};
use crate::real;
use crate::sock::{self, lookup, Bound, ListenerSock, Opts, Sock, StreamSock};
use crate::wait::{self, block, block_hinted};

fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

fn fails(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

/// An xwarp socket of this process (not a `Bound` kernel socket).
fn xw(fd: c_int) -> Option<Arc<Sock>> {
    lookup(fd).filter(|s| s.common().is_some())
}

fn spin() -> Duration {
    config().map(|c| c.spin).unwrap_or_default()
}

unsafe fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: valid out pointers.
    let r = unsafe { real::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// A kernel TCP socket over IPv4/IPv6 (the only kind the shim may take over): its domain.
unsafe fn kernel_tcp_domain(fd: c_int) -> Option<c_int> {
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

// ---------------------------------------------------------------------------------------
// socket lifecycle

/// `socket(2)`: always a kernel socket; it may move onto the engine at bind/connect.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(cfg) = config() {
        // SAFETY: caller's address buffer.
        if let Some(sa) = unsafe { addr::from_raw(a, len) } {
            if cfg.accelerate_bind(sa) {
                // SAFETY: getsockopt on the caller's fd.
                if let Some(domain) = unsafe { kernel_tcp_domain(fd) } {
                    if lookup(fd).is_some() {
                        return fail(libc::EINVAL);
                    }
                    xlog!(Debug, "bind fd {fd} to {sa}: engine");
                    sock::insert(
                        fd,
                        Arc::new(Sock::Bound(Mutex::new(Bound {
                            addr: sa,
                            domain,
                            listening: None,
                            kernel_listening: false,
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
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
            0
        }
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
        let bytes = addr::encode(sa, domain);
        // SAFETY: encoded address of the right length.
        if unsafe { real::bind(fd, bytes.as_ptr().cast(), bytes.len() as socklen_t) } < 0 {
            return Err(last_errno());
        }
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
fn xwa(fd: c_int) -> Option<Arc<Sock>> {
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
        l.accept_once()
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { accept_impl(fd, a, len, 0) }
}

/// `accept4(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { accept_impl(fd, a, len, flags) }
}

/// `connect(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
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
    let accelerate = dst.is_some_and(|d| cfg.accelerate_connect(d));
    if !accelerate {
        if let Some(b) = bound {
            // Bound to the engine's address but going elsewhere: the kernel cannot do that;
            // fall back with the port only.
            if let Sock::Bound(b) = &*b {
                let b = b.lock().unwrap_or_else(|p| p.into_inner());
                sock::remove(fd);
                let bytes = addr::encode(addr::unspecified(b.domain, b.addr.port()), b.domain);
                // SAFETY: encoded address.
                if unsafe { real::bind(fd, bytes.as_ptr().cast(), bytes.len() as socklen_t) } < 0 {
                    return -1;
                }
            }
        }
        // SAFETY: forwarded.
        return unsafe { real::connect(fd, a, len) };
    }
    let dst: SocketAddr = match dst {
        Some(d) => d,
        None => return fail(libc::EINVAL),
    };
    // SAFETY: getsockopt on the caller's fd.
    let Some(domain) = (unsafe { kernel_tcp_domain(fd) }) else {
        // SAFETY: forwarded (UDP, AF_UNIX, ...).
        return unsafe { real::connect(fd, a, len) };
    };
    let Some(eng) = engine() else {
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
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
    // SAFETY: forwarded.
    unsafe { real::close(fd) }
}

/// `shutdown(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
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

// ---------------------------------------------------------------------------------------
// data

fn stream_of(s: &Sock) -> Result<&StreamSock, c_int> {
    match s {
        Sock::Stream(st) if st.common.alive() => Ok(st),
        Sock::Stream(_) => Err(libc::EBADF),
        _ => Err(libc::ENOTCONN),
    }
}

unsafe fn iov_mut<'a>(iov: *const libc::iovec, cnt: c_int) -> Result<Vec<&'a mut [u8]>, c_int> {
    if !(0..=1024).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt > 0 && iov.is_null() {
        return Err(libc::EFAULT);
    }
    let mut v = Vec::with_capacity(cnt as usize);
    for i in 0..cnt as usize {
        // SAFETY: caller's iovec array of `cnt` entries.
        let e = unsafe { *iov.add(i) };
        if e.iov_len > 0 && !e.iov_base.is_null() {
            // SAFETY: caller's buffer of iov_len bytes.
            v.push(unsafe { std::slice::from_raw_parts_mut(e.iov_base.cast::<u8>(), e.iov_len) });
        }
    }
    Ok(v)
}

unsafe fn iov_ref<'a>(iov: *const libc::iovec, cnt: c_int) -> Result<Vec<&'a [u8]>, c_int> {
    // SAFETY: same contract.
    unsafe { iov_mut(iov, cnt) }.map(|v| v.into_iter().map(|b| &*b).collect())
}

fn recv_impl(st: &StreamSock, bufs: &mut [&mut [u8]], flags: c_int) -> Result<usize, c_int> {
    let nb = st
        .common
        .nonblock
        .load(std::sync::atomic::Ordering::Relaxed)
        || flags & libc::MSG_DONTWAIT != 0;
    let peek = flags & libc::MSG_PEEK != 0;
    if bufs.is_empty() {
        return Ok(0);
    }
    if nb {
        return st.read_once(bufs, peek);
    }
    let timeout = st.common.opts().rcvtimeo;
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek && bufs.len() == 1;
    if !waitall {
        return block_hinted(
            st.common.evfd,
            spin(),
            timeout,
            || st.read_hint(),
            || st.read_once(bufs, peek),
        );
    }
    let buf = &mut *bufs[0];
    let mut got = 0;
    while got < buf.len() {
        let mut rest = [&mut buf[got..]];
        match block_hinted(
            st.common.evfd,
            spin(),
            timeout,
            || st.read_hint(),
            || st.read_once(&mut rest, false),
        ) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if got == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(got)
}

fn send_impl(st: &StreamSock, bufs: &[&[u8]], flags: c_int) -> Result<usize, c_int> {
    let nb = st
        .common
        .nonblock
        .load(std::sync::atomic::Ordering::Relaxed)
        || flags & libc::MSG_DONTWAIT != 0;
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let r = if nb || total == 0 {
        st.write_once(bufs)
    } else {
        // Blocking: everything goes out unless interrupted or timed out.
        let timeout = st.common.opts().sndtimeo;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut done = 0usize;
        let start = Instant::now();
        let spin = spin();
        loop {
            // The iovecs past `done`.
            let mut skip = done;
            let mut rest: Vec<&[u8]> = Vec::with_capacity(bufs.len());
            for b in bufs {
                if skip >= b.len() {
                    skip -= b.len();
                    continue;
                }
                rest.push(&b[skip..]);
                skip = 0;
            }
            match st.write_once(&rest) {
                Ok(n) => {
                    done += n;
                    if done == total {
                        break Ok(done);
                    }
                }
                Err(libc::EAGAIN) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        break if done > 0 {
                            Ok(done)
                        } else {
                            Err(libc::EAGAIN)
                        };
                    }
                    if now < start + spin {
                        wait::spin_pause();
                        continue;
                    }
                    // The eventfd also fires for readable data the program has not read:
                    // wait in short naps then, instead of spinning on it.
                    if st.available_cached() {
                        std::thread::sleep(Duration::from_micros(200));
                    } else if let Err(e) =
                        wait::wait_readable(st.common.evfd, deadline, wait::MAX_SLEEP)
                    {
                        if e == libc::EINTR && deadline.is_none() && wait::restart_after_signal() {
                            continue;
                        }
                        break if done > 0 { Ok(done) } else { Err(e) };
                    }
                }
                Err(e) => break if done > 0 { Ok(done) } else { Err(e) },
            }
        }
    };
    if r == Err(libc::EPIPE) && flags & libc::MSG_NOSIGNAL == 0 {
        // SAFETY: raising SIGPIPE like the kernel does.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
    r
}

fn ret(r: Result<usize, c_int>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fails(e),
    }
}

/// `read(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::read(fd, buf, n) };
    };
    if s.common().is_some_and(|c| !c.alive()) {
        return fails(libc::EBADF);
    }
    let Ok(st) = stream_of(&s) else {
        return fails(libc::EINVAL);
    };
    if n == 0 {
        return 0;
    }
    if buf.is_null() {
        return fails(libc::EFAULT);
    }
    // SAFETY: caller's buffer of n bytes.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
    ret(recv_impl(st, &mut [b], 0))
}

/// `__read_chk` (fortified `read`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: glibc's fortify failure path.
        unsafe { libc::abort() };
    }
    // SAFETY: same contract as read.
    unsafe { read(fd, buf, n) }
}

/// `write(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::write(fd, buf, n) };
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    if n > 0 && buf.is_null() {
        return fails(libc::EFAULT);
    }
    let b: &[u8] = if n == 0 {
        &[]
    } else {
        // SAFETY: caller's buffer of n bytes.
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) }
    };
    ret(send_impl(st, &[b], 0))
}

/// `readv(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::readv(fd, iov, cnt) };
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    // SAFETY: caller's iovecs.
    match unsafe { iov_mut(iov, cnt) } {
        Ok(mut v) => ret(recv_impl(st, &mut v, 0)),
        Err(e) => fails(e),
    }
}

/// `writev(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::writev(fd, iov, cnt) };
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    // SAFETY: caller's iovecs.
    match unsafe { iov_ref(iov, cnt) } {
        Ok(v) => ret(send_impl(st, &v, 0)),
        Err(e) => fails(e),
    }
}

/// `recv(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::recv(fd, buf, n, flags) };
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    if n == 0 {
        return 0;
    }
    if buf.is_null() {
        return fails(libc::EFAULT);
    }
    // SAFETY: caller's buffer.
    let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
    ret(recv_impl(st, &mut [b], flags))
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
    if n > buflen {
        // SAFETY: fortify failure.
        unsafe { libc::abort() };
    }
    // SAFETY: same contract as recv.
    unsafe { recv(fd, buf, n, flags) }
}

/// `send(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::send(fd, buf, n, flags) };
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    if n > 0 && buf.is_null() {
        return fails(libc::EFAULT);
    }
    let b: &[u8] = if n == 0 {
        &[]
    } else {
        // SAFETY: caller's buffer.
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) }
    };
    ret(send_impl(st, &[b], flags))
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
    if xw(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::recvfrom(fd, buf, n, flags, a, len) };
    }
    if !len.is_null() {
        // SAFETY: caller's length (TCP reports no source address).
        unsafe { *len = 0 };
    }
    // SAFETY: same contract.
    unsafe { recv(fd, buf, n, flags) }
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
    if n > buflen {
        // SAFETY: fortify failure.
        unsafe { libc::abort() };
    }
    // SAFETY: same contract.
    unsafe { recvfrom(fd, buf, n, flags, a, len) }
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
    if xw(fd).is_none() {
        // SAFETY: forwarded.
        return unsafe { real::sendto(fd, buf, n, flags, a, len) };
    }
    // SAFETY: same contract.
    unsafe { send(fd, buf, n, flags) }
}

/// `recvmsg(2)` (no ancillary data on xwarp sockets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::recvmsg(fd, msg, flags) };
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    if msg.is_null() {
        return fails(libc::EFAULT);
    }
    // SAFETY: caller's msghdr.
    let m = unsafe { &mut *msg };
    // SAFETY: caller's iovecs.
    let r = match unsafe { iov_mut(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(mut v) => recv_impl(st, &mut v, flags),
        Err(e) => Err(e),
    };
    m.msg_namelen = 0;
    m.msg_controllen = 0;
    m.msg_flags = 0;
    ret(r)
}

/// `sendmsg(2)` (ancillary data is ignored on xwarp sockets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::sendmsg(fd, msg, flags) };
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    if msg.is_null() {
        return fails(libc::EFAULT);
    }
    // SAFETY: caller's msghdr.
    let m = unsafe { &*msg };
    // SAFETY: caller's iovecs.
    match unsafe { iov_ref(m.msg_iov, m.msg_iovlen as c_int) } {
        Ok(v) => ret(send_impl(st, &v, flags)),
        Err(e) => fails(e),
    }
}

/// `sendfile(2)` with an xwarp socket as destination: file bytes are read and queued.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    inp: c_int,
    off: *mut off_t,
    count: size_t,
) -> ssize_t {
    let Some(s) = xw(out) else {
        // SAFETY: forwarded.
        return unsafe { real::sendfile(out, inp, off, count) };
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    let mut buf = vec![0u8; count.min(256 << 10)];
    let mut done: usize = 0;
    // SAFETY: caller's offset pointer or the file position.
    let mut pos: off_t = if off.is_null() {
        unsafe { real::lseek(inp, 0, libc::SEEK_CUR) }
    } else {
        unsafe { *off }
    };
    if pos < 0 {
        return -1;
    }
    while done < count {
        let want = buf.len().min(count - done);
        // SAFETY: reading into our buffer.
        let n = unsafe { real::pread(inp, buf.as_mut_ptr().cast(), want, pos) };
        if n < 0 {
            if done > 0 {
                break;
            }
            return -1;
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        let flags = if done > 0 { libc::MSG_DONTWAIT } else { 0 };
        match send_impl(st, &[&buf[..n]], flags | libc::MSG_NOSIGNAL) {
            Ok(w) => {
                done += w;
                pos += w as off_t;
                if w < n {
                    break;
                }
            }
            Err(e) if done == 0 => {
                if e == libc::EPIPE {
                    // SAFETY: like the kernel.
                    unsafe { libc::raise(libc::SIGPIPE) };
                }
                return fails(e);
            }
            Err(_) => break,
        }
    }
    if off.is_null() {
        // SAFETY: advance the file position by what was sent.
        unsafe { real::lseek(inp, pos, libc::SEEK_SET) };
    } else {
        // SAFETY: caller's offset.
        unsafe { *off = pos };
    }
    done as ssize_t
}

/// `sendfile64` (same as `sendfile` on 64-bit Linux).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: same contract.
    unsafe { sendfile(out, inp, off, count) }
}

// ---------------------------------------------------------------------------------------
// names and options

/// `getsockname(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(r) = fork::relayed(fd) {
        // SAFETY: caller's buffers.
        return unsafe { relayed_name(&r, r.local, a, len) };
    }
    let Some(s) = lookup(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::getsockname(fd, a, len) };
    };
    let (sa, domain) = match &*s {
        Sock::Bound(b) => {
            let b = b.lock().unwrap_or_else(|p| p.into_inner());
            (b.addr, b.domain)
        }
        Sock::Listener(l) => (
            l.ls.local_addr()
                .unwrap_or(addr::unspecified(l.common.domain, 0)),
            l.common.domain,
        ),
        Sock::Stream(st) => (
            st.lock()
                .stream
                .local_addr()
                .unwrap_or(addr::unspecified(st.common.domain, 0)),
            st.common.domain,
        ),
    };
    if a.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: caller's buffers.
    unsafe { addr::write_out(&addr::encode(sa, domain), a, len) };
    0
}

/// `getpeername(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(r) = fork::relayed(fd) {
        // SAFETY: caller's buffers.
        return unsafe { relayed_name(&r, r.peer, a, len) };
    }
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::getpeername(fd, a, len) };
    };
    let Sock::Stream(st) = &*s else {
        return fail(libc::ENOTCONN);
    };
    let Some(p) = st.lock().stream.peer_addr() else {
        return fail(libc::ENOTCONN);
    };
    if a.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: caller's buffers.
    unsafe { addr::write_out(&addr::encode(p, st.common.domain), a, len) };
    0
}

/// `getsockname`/`getpeername` of a connection relayed over `fork`: the TCP address.
unsafe fn relayed_name(
    r: &fork::Relayed,
    sa: Option<SocketAddr>,
    a: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    let Some(sa) = sa else {
        return fail(libc::ENOTCONN);
    };
    if a.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: caller's buffers.
    unsafe { addr::write_out(&addr::encode(sa, r.domain), a, len) };
    0
}

/// `getsockopt` on a connection relayed over `fork` (a unix socket underneath): the
/// socket's identity and TCP-level options from the shim's books, the rest from the
/// kernel. `None`: ask the kernel.
unsafe fn relayed_getsockopt(
    r: &fork::Relayed,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> Option<c_int> {
    let o = *r.opts();
    let v = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => r.domain,
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => libc::IPPROTO_TCP,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => o.nodelay,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => o.keepidle(),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => o.keepintvl(),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => o.keepcnt(),
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            if val.is_null() || len.is_null() {
                return Some(fail(libc::EFAULT));
            }
            // Only the state is known here (the engine serves the parent).
            let info = tcp_info_bytes(None, 1);
            // SAFETY: caller's buffer of *len bytes.
            unsafe {
                let n = (*len as usize).min(info.len());
                std::ptr::copy_nonoverlapping(info.as_ptr(), val.cast::<u8>(), n);
                *len = n as socklen_t;
            }
            return Some(0);
        }
        (libc::IPPROTO_TCP, _) => return Some(fail(libc::ENOPROTOOPT)),
        _ => return None,
    };
    // SAFETY: caller's buffers.
    Some(unsafe { put_int(val, len, v) })
}

/// `setsockopt` on a connection relayed over `fork`: TCP-level options are remembered
/// (and reported) but cannot reach the parent's engine; the rest goes to the kernel.
unsafe fn relayed_setsockopt(
    r: &fork::Relayed,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> Option<c_int> {
    if level != libc::IPPROTO_TCP {
        return None;
    }
    // SAFETY: caller's buffer; `get_int` checks the length.
    let v = match unsafe { get_int(val, len) } {
        Ok(v) => v,
        Err(e) => return Some(fail(e)),
    };
    let mut o = r.opts();
    match name {
        libc::TCP_NODELAY => o.nodelay = c_int::from(v != 0),
        libc::TCP_KEEPIDLE | libc::TCP_KEEPINTVL if !(1..=32767).contains(&v) => {
            return Some(fail(libc::EINVAL))
        }
        libc::TCP_KEEPCNT if !(1..=127).contains(&v) => return Some(fail(libc::EINVAL)),
        libc::TCP_KEEPIDLE => o.keepidle = v,
        libc::TCP_KEEPINTVL => o.keepintvl = v,
        libc::TCP_KEEPCNT => o.keepcnt = v,
        _ => xlog!(
            Debug,
            "setsockopt(TCP, {name}) on a relayed descriptor: ignored"
        ),
    }
    Some(0)
}

unsafe fn put_int(val: *mut c_void, len: *mut socklen_t, v: c_int) -> c_int {
    if val.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: caller's buffers; copy at most *len bytes.
    unsafe {
        let n = (*len as usize).min(4);
        std::ptr::copy_nonoverlapping((&v as *const c_int).cast::<u8>(), val.cast::<u8>(), n);
        *len = n as socklen_t;
    }
    0
}

unsafe fn get_int(val: *const c_void, len: socklen_t) -> Result<c_int, c_int> {
    if val.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as usize) < 4 {
        return Err(libc::EINVAL);
    }
    // SAFETY: at least 4 readable bytes.
    Ok(unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) })
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
    if let Some(r) = fork::relayed(fd) {
        // SAFETY: caller's buffers.
        if let Some(ret) = unsafe { relayed_getsockopt(&r, level, name, val, len) } {
            return ret;
        }
    }
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::getsockopt(fd, level, name, val, len) };
    };
    let Some(c) = s.common() else {
        return fail(libc::EBADF);
    };
    let (def_rcv, def_snd) = engine()
        .map(|e| (e.stack.config().rx_buffer, e.stack.config().tx_buffer))
        .unwrap_or((0, 0));
    let o = *c.opts();
    let as_int = |v: usize| v.min(c_int::MAX as usize) as c_int;
    let v = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => c.domain,
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => libc::IPPROTO_TCP,
        (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => c_int::from(matches!(&*s, Sock::Listener(_))),
        (libc::SOL_SOCKET, libc::SO_ERROR) => match &*s {
            Sock::Stream(st) => {
                let mut g = st.lock();
                let e = g.so_error.take().or_else(|| {
                    if g.reported {
                        None
                    } else {
                        g.stream.error().map(|e| errno_of(&e.to_io()))
                    }
                });
                if e.is_some() {
                    g.reported = true;
                }
                e.unwrap_or(0)
            }
            _ => 0,
        },
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => as_int(o.rcvbuf.unwrap_or(def_rcv)),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => as_int(o.sndbuf.unwrap_or(def_snd)),
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => o.reuseaddr,
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => o.reuseport,
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => o.keepalive,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => o.nodelay,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => o.keepidle(),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => o.keepintvl(),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => o.keepcnt(),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            if val.is_null() || len.is_null() {
                return fail(libc::EFAULT);
            }
            let l = libc::linger {
                l_onoff: o.linger.0,
                l_linger: o.linger.1,
            };
            // SAFETY: caller's buffers, at most *len bytes.
            unsafe {
                let n = (*len as usize).min(std::mem::size_of::<libc::linger>());
                std::ptr::copy_nonoverlapping(
                    (&l as *const libc::linger).cast::<u8>(),
                    val.cast::<u8>(),
                    n,
                );
                *len = n as socklen_t;
            }
            return 0;
        }
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            if val.is_null() || len.is_null() {
                return fail(libc::EFAULT);
            }
            let info = match &*s {
                Sock::Listener(_) => tcp_info_bytes(None, 10), // TCP_LISTEN
                Sock::Stream(st) => {
                    let g = st.lock();
                    let fallback = match g.stream.phase() {
                        xwarp_stack::Phase::Connecting => 2, // TCP_SYN_SENT
                        xwarp_stack::Phase::Established => 1,
                        xwarp_stack::Phase::Closed => 7,
                    };
                    // The engine no longer serves a closed connection: state only.
                    let engine_info = g.stream.tcp_info(Duration::from_millis(200)).ok();
                    tcp_info_bytes(engine_info.as_ref(), fallback)
                }
                Sock::Bound(_) => tcp_info_bytes(None, 7),
            };
            // SAFETY: caller's buffer of *len bytes.
            unsafe {
                let n = (*len as usize).min(info.len());
                std::ptr::copy_nonoverlapping(info.as_ptr(), val.cast::<u8>(), n);
                *len = n as socklen_t;
            }
            return 0;
        }
        _ => return fail(libc::ENOPROTOOPT),
    };
    // SAFETY: caller's buffers.
    unsafe { put_int(val, len, v) }
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
    if let Some(r) = fork::relayed(fd) {
        // SAFETY: caller's buffer.
        if let Some(ret) = unsafe { relayed_setsockopt(&r, level, name, val, len) } {
            return ret;
        }
    }
    let Some(s) = xw(fd) else {
        // SAFETY: forwarded.
        let r = unsafe { real::setsockopt(fd, level, name, val, len) };
        let buffer =
            level == libc::SOL_SOCKET && (name == libc::SO_RCVBUF || name == libc::SO_SNDBUF);
        if r == 0 && buffer && config().is_some() {
            // The socket may still move to the engine at connect/listen: remember the
            // size asked for (the kernel clamps it to rmem_max/wmem_max).
            // SAFETY: caller's buffer; `get_int` checks the length.
            if let Ok(v) = unsafe { get_int(val, len) } {
                // SAFETY: getsockopt on the caller's fd.
                if unsafe { kernel_tcp_domain(fd) }.is_some() {
                    sock::remember_buffer(fd, name == libc::SO_RCVBUF, v);
                }
            }
        }
        return r;
    };
    let Some(c) = s.common() else {
        return fail(libc::EBADF);
    };
    let timeo = |val: *const c_void, len: socklen_t| -> Result<Option<Duration>, c_int> {
        if val.is_null() || (len as usize) < std::mem::size_of::<timeval>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a timeval's worth of bytes.
        let tv: timeval = unsafe { std::ptr::read_unaligned(val.cast()) };
        if tv.tv_sec < 0 || !(0..1_000_000).contains(&tv.tv_usec) {
            return Err(libc::EDOM);
        }
        let d = Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64);
        Ok((!d.is_zero()).then_some(d))
    };
    let r: Result<(), c_int> = (|| {
        let mut o = c.opts();
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => o.rcvtimeo = timeo(val, len)?,
            (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => o.sndtimeo = timeo(val, len)?,
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if val.is_null() || (len as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: a linger's worth of bytes.
                let l: libc::linger = unsafe { std::ptr::read_unaligned(val.cast()) };
                o.linger = (l.l_onoff, l.l_linger);
            }
            _ => {
                // SAFETY: caller's buffer.
                let v = unsafe { get_int(val, len) }?;
                match (level, name) {
                    (libc::SOL_SOCKET, libc::SO_REUSEADDR) => o.reuseaddr = c_int::from(v != 0),
                    (libc::SOL_SOCKET, libc::SO_REUSEPORT) => o.reuseport = c_int::from(v != 0),
                    (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => o.keepalive = c_int::from(v != 0),
                    // Linux doubles the value and reports the doubled one. The engine
                    // sizes a connection's buffers when it opens it (connect/listen;
                    // the window scale is fixed by the SYN): later changes are reported
                    // but do not resize an open connection.
                    (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                        o.rcvbuf = Some(xwarp_stack::socket_buffer_size(v.max(0) as usize))
                    }
                    (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                        o.sndbuf = Some(xwarp_stack::socket_buffer_size(v.max(0) as usize))
                    }
                    (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
                        o.nodelay = c_int::from(v != 0);
                        if let Sock::Stream(st) = &*s {
                            st.lock()
                                .stream
                                .set_nodelay(v != 0)
                                .map_err(|e| errno_of(&e))?;
                        }
                    }
                    // Linux's limits: MAX_TCP_KEEPIDLE/KEEPINTVL 32767 s, KEEPCNT 127.
                    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) if (1..=32767).contains(&v) => {
                        o.keepidle = v
                    }
                    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) if (1..=32767).contains(&v) => {
                        o.keepintvl = v
                    }
                    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) if (1..=127).contains(&v) => {
                        o.keepcnt = v
                    }
                    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)
                    | (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL)
                    | (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => return Err(libc::EINVAL),
                    _ => {
                        xlog!(
                            Debug,
                            "setsockopt({level}, {name}) on engine fd {fd}: ignored"
                        );
                    }
                }
            }
        }
        // Keep-alive knobs take effect on an open connection at once (Linux re-arms the
        // timer too); listeners pass them on at accept.
        if matches!(
            (level, name),
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE)
                | (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)
                | (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL)
                | (libc::IPPROTO_TCP, libc::TCP_KEEPCNT)
        ) {
            if let Sock::Stream(st) = &*s {
                st.lock()
                    .stream
                    .set_keepalive(o.keepalive_engine())
                    .map_err(|e| errno_of(&e))?;
            }
        }
        Ok(())
    })();
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Size of the `struct tcp_info` prefix the shim fills (through `tcpi_rehash`).
const TCP_INFO_LEN: usize = 240;

/// Linux `struct tcp_info` (`include/uapi/linux/tcp.h`) from what the engine knows;
/// fields the engine cannot know (congestion window, SACK, segment counts) stay zero.
fn tcp_info_bytes(info: Option<&xwarp_stack::TcpInfo>, state: u8) -> [u8; TCP_INFO_LEN] {
    let mut b = [0u8; TCP_INFO_LEN];
    b[0] = state;
    let Some(i) = info else {
        return b;
    };
    b[0] = i.state;
    let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
    let mut put32 = |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    // tcpi_options: TCPI_OPT_TIMESTAMPS | TCPI_OPT_WSCALE (the engine always offers
    // window scaling and, by default, timestamps).
    let mss = i.snd_mss.max(1);
    put32(8, us(i.rto)); // tcpi_rto
    put32(16, i.snd_mss); // tcpi_snd_mss
    put32(20, i.rcv_mss); // tcpi_rcv_mss
    put32(24, i.send_queue.div_ceil(mss)); // tcpi_unacked (segments, estimated)
    put32(68, i.rtt.map(us).unwrap_or(0)); // tcpi_rtt
    put32(72, us(i.rttvar)); // tcpi_rttvar
    put32(84, i.rcv_mss); // tcpi_advmss
    put32(96, i.recv_buffer); // tcpi_rcv_space
    put32(100, i.retransmits); // tcpi_total_retrans
    put32(232, i.rcv_wnd); // tcpi_rcv_wnd
    let mut put64 = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    put64(120, i.bytes_acked); // tcpi_bytes_acked
    put64(128, i.bytes_received); // tcpi_bytes_received
    put64(200, i.bytes_sent); // tcpi_bytes_sent
    b[5] = 0x1 | 0x4;
    b
}

// ---------------------------------------------------------------------------------------
// descriptors

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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fcntl_impl(fd, cmd, arg, false) }
}

/// `fcntl64` (glibc's name for programs built with 64-bit offsets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fcntl_impl(fd, cmd, arg, true) }
}

/// `ioctl(2)`: `FIONBIO` and `FIONREAD` on xwarp sockets.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
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

fn after_dup_onto(old: c_int, new: c_int) {
    fork::after_dup(old, new);
    if sock::any() {
        if sock::remove(new).is_some() {
            epoll::forget_fd(new);
        } else {
            epoll::forget_epfd(new);
        }
        if let Some(s) = lookup(old) {
            sock::insert(new, s);
        }
    }
}

/// `dup2(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: forwarded.
    let n = unsafe { real::dup2(old, new) };
    if n >= 0 && old != new {
        after_dup_onto(old, new);
    }
    n
}

/// `dup3(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    let n = unsafe { real::dup3(old, new, flags) };
    if n >= 0 {
        after_dup_onto(old, new);
    }
    n
}

// ---------------------------------------------------------------------------------------
// readiness

/// `poll` over a set holding xwarp sockets. `timeout`: `None` waits forever.
unsafe fn poll_impl(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: Option<Duration>,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: caller's array of n pollfds.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    let socks: Vec<Option<Arc<Sock>>> = set.iter().map(|p| xwa(p.fd)).collect();
    let deadline = timeout.map(|t| Instant::now() + t);
    let orig: Vec<i16> = set.iter().map(|p| p.events).collect();
    loop {
        // Exact readiness of xwarp sockets first.
        let mut ready = 0;
        let mut out_wait = false;
        let mut xrev: Vec<i16> = vec![0; set.len()];
        for (i, s) in socks.iter().enumerate() {
            if let Some(s) = s {
                let want = orig[i];
                let got = sock::readiness(s, want);
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if !poll_involved(fds, n) {
        // SAFETY: forwarded.
        return unsafe { real::poll(fds, n, timeout) };
    }
    let t = (timeout >= 0).then(|| Duration::from_millis(timeout as u64));
    // SAFETY: caller's array.
    unsafe { poll_impl(fds, n, t, std::ptr::null()) }
}

/// `__poll_chk` (fortified `poll`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __poll_chk(
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ppoll(
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn select(
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pselect(
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
    let Some(s) = xwa(fd) else {
        // SAFETY: forwarded.
        return unsafe { real::epoll_ctl(epfd, op, fd, ev) };
    };
    // SAFETY: caller's event (may be null for DEL).
    let e = (!ev.is_null()).then(|| unsafe { *ev });
    epoll::ctl(epfd, op, fd, s, e)
}

/// `epoll_wait(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_wait(
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
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
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
