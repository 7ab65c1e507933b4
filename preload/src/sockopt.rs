//! Names and options: `getsockname`, `getpeername`, `getsockopt`, `setsockopt` on engine
//! sockets and on connections relayed over `fork`, and `TCP_INFO`.

use std::net::SocketAddr;
use std::time::Duration;

use libc::{c_int, c_void, sockaddr, socklen_t, timeval};

use crate::addr;
use crate::call::{fail, kernel_tcp_domain, xw};
use crate::engine::engine;
use crate::errno::errno_of;
use crate::fork;
use crate::process::{config, xlog};
use crate::real;
use crate::sock::{self, lookup, Sock};

/// `getsockname(2)`.
pub(crate) unsafe fn getsockname(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
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
pub(crate) unsafe fn getpeername(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
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
pub(crate) unsafe fn getsockopt(
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
pub(crate) unsafe fn setsockopt(
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
