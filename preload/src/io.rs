//! Data calls on engine connections: `read`/`write` and their vector, message, fortified
//! and `sendfile` forms, blocking (spin, then sleep) unless the socket or call is
//! non-blocking.

use std::time::{Duration, Instant};

use libc::{c_int, c_void, msghdr, off_t, size_t, sockaddr, socklen_t, ssize_t};

use crate::call::{fails, spin, xw_io};
use crate::real;
use crate::sock::{Sock, StreamSock};
use crate::wait::{self, block_hinted};
use xwarp_poll_driver::engine::InlineDriver;

fn stream_of(s: &Sock) -> Result<&StreamSock, c_int> {
    match s {
        Sock::Stream(st) if st.common.alive() => Ok(st),
        Sock::Stream(_) => Err(libc::EBADF),
        _ => Err(libc::ENOTCONN),
    }
}

/// The program's iovecs, checked: (base, length) of each non-empty one, in order.
unsafe fn iov_list(iov: *const libc::iovec, cnt: c_int) -> Result<Vec<(*mut u8, usize)>, c_int> {
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
            v.push((e.iov_base.cast::<u8>(), e.iov_len));
        }
    }
    Ok(v)
}

/// `true` if two of the iovecs share a byte (a program may pass the same buffer twice).
fn overlapping(list: &[(*mut u8, usize)]) -> bool {
    let mut spans: Vec<(usize, usize)> = list
        .iter()
        .map(|&(p, n)| (p as usize, (p as usize).saturating_add(n)))
        .collect();
    spans.sort_unstable();
    spans.windows(2).any(|w| w[1].0 < w[0].1)
}

/// At most this much is received at once into iovecs that overlap (they go through a
/// buffer of the shim first; a shorter read is what the program gets then).
const ALIASED_READ_MAX: usize = 256 << 10;

/// Receive into the program's iovecs. Disjoint ones are written in place; iovecs that
/// overlap never become overlapping `&mut` slices: the bytes land in a buffer of the shim
/// and are copied out iovec by iovec through raw pointers, in order, so where iovecs
/// share memory the later one's bytes stay (what Linux leaves there).
unsafe fn recv_iov(
    st: &StreamSock,
    list: &[(*mut u8, usize)],
    flags: c_int,
) -> Result<usize, c_int> {
    if !overlapping(list) {
        let mut v: Vec<&mut [u8]> = list
            .iter()
            // SAFETY: the caller's buffers, pairwise disjoint (checked above).
            .map(|&(p, n)| unsafe { std::slice::from_raw_parts_mut(p, n) })
            .collect();
        return recv_impl(st, &mut v, flags);
    }
    let total: usize = list.iter().map(|&(_, n)| n).sum();
    let mut bounce = vec![0u8; total.min(ALIASED_READ_MAX)];
    let got = recv_impl(st, &mut [&mut bounce[..]], flags)?;
    let mut off = 0;
    for &(p, n) in list {
        if off >= got {
            break;
        }
        let k = n.min(got - off);
        // SAFETY: `k` bytes of the caller's buffer at `p`; the source is our own buffer.
        unsafe { std::ptr::copy_nonoverlapping(bounce.as_ptr().add(off), p, k) };
        off += k;
    }
    Ok(got)
}

/// The program's iovecs to send (shared slices: overlapping ones are fine).
unsafe fn iov_ref<'a>(iov: *const libc::iovec, cnt: c_int) -> Result<Vec<&'a [u8]>, c_int> {
    // SAFETY: same contract.
    let list = unsafe { iov_list(iov, cnt) }?;
    Ok(list
        .into_iter()
        // SAFETY: the caller's buffers of the given lengths, only read.
        .map(|(p, n)| unsafe { std::slice::from_raw_parts(p.cast_const(), n) })
        .collect())
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
        return match st.read_once_keep(bufs, peek) {
            // Inline mode: nothing buffered yet, so run the engine once and look again.
            Err(libc::EAGAIN) if crate::inline::driver().is_some() => {
                crate::inline::drive();
                st.read_once_keep(bufs, peek)
            }
            r => r,
        };
    }
    let timeout = st.common.opts_io()?.rcvtimeo;
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
        // Inline mode: a non-blocking write (an event loop's) does not run the engine;
        // the loop's next `epoll_wait`/`poll`/read drives once for all the writes it
        // queued (measured: one iteration per write made redis -c 50 0.23x the kernel).
        if crate::inline::driver().is_some() {
            InlineDriver::deferring(|| st.write_once(bufs))
        } else {
            st.write_once(bufs)
        }
    } else {
        // Blocking: everything goes out unless interrupted or timed out.
        let timeout = match st.common.opts_io() {
            Ok(o) => o.sndtimeo,
            Err(e) => return Err(e),
        };
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
                        match crate::inline::driver() {
                            Some(d) => {
                                d.try_drive();
                                wait::spin_pause();
                            }
                            None => wait::spin_pause(),
                        }
                        continue;
                    }
                    crate::inline::park();
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
    // Inline mode, blocking write: what the ring still holds leaves in this call (the
    // write's doorbell ring drove already unless another thread was driving).
    if !nb && matches!(r, Ok(n) if n > 0) && crate::inline::driver().is_some() && st.tx_pending() {
        crate::inline::drive();
    }
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
pub(crate) unsafe fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let s = match xw_io(fd) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::read(fd, buf, n) },
        Err(e) => return fails(e),
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
pub(crate) unsafe fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    if n > buflen {
        // SAFETY: glibc's fortify failure path.
        unsafe { libc::abort() };
    }
    // SAFETY: same contract as read.
    unsafe { read(fd, buf, n) }
}

/// `write(2)`.
pub(crate) unsafe fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let s = match xw_io(fd) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::write(fd, buf, n) },
        Err(e) => return fails(e),
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
pub(crate) unsafe fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    let s = match xw_io(fd) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::readv(fd, iov, cnt) },
        Err(e) => return fails(e),
    };
    let st = match stream_of(&s) {
        Ok(st) => st,
        Err(e) => return fails(e),
    };
    // SAFETY: caller's iovecs.
    match unsafe { iov_list(iov, cnt) } {
        // SAFETY: the caller's iovecs, checked.
        Ok(list) => ret(unsafe { recv_iov(st, &list, 0) }),
        Err(e) => fails(e),
    }
}

/// `writev(2)`.
pub(crate) unsafe fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    let s = match xw_io(fd) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::writev(fd, iov, cnt) },
        Err(e) => return fails(e),
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
pub(crate) unsafe fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    let s = match xw_io(fd) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::recv(fd, buf, n, flags) },
        Err(e) => return fails(e),
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
pub(crate) unsafe fn __recv_chk(
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
pub(crate) unsafe fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    let s = match xw_io(fd) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::send(fd, buf, n, flags) },
        Err(e) => return fails(e),
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
pub(crate) unsafe fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    match xw_io(fd) {
        Ok(Some(_)) => {}
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::recvfrom(fd, buf, n, flags, a, len) },
        Err(e) => return fails(e),
    }
    if !len.is_null() {
        // SAFETY: caller's length (TCP reports no source address).
        unsafe { *len = 0 };
    }
    // SAFETY: same contract.
    unsafe { recv(fd, buf, n, flags) }
}

/// `__recvfrom_chk` (fortified `recvfrom`).
pub(crate) unsafe fn __recvfrom_chk(
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
pub(crate) unsafe fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    a: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    match xw_io(fd) {
        Ok(Some(_)) => {}
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::sendto(fd, buf, n, flags, a, len) },
        Err(e) => return fails(e),
    }
    // SAFETY: same contract.
    unsafe { send(fd, buf, n, flags) }
}

/// `recvmsg(2)` (no ancillary data on xwarp sockets).
pub(crate) unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let s = match xw_io(fd) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::recvmsg(fd, msg, flags) },
        Err(e) => return fails(e),
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
    let r = match unsafe { iov_list(m.msg_iov, m.msg_iovlen as c_int) } {
        // SAFETY: the caller's iovecs, checked.
        Ok(list) => unsafe { recv_iov(st, &list, flags) },
        Err(e) => Err(e),
    };
    m.msg_namelen = 0;
    m.msg_controllen = 0;
    m.msg_flags = 0;
    ret(r)
}

/// `sendmsg(2)` (ancillary data is ignored on xwarp sockets).
pub(crate) unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let s = match xw_io(fd) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::sendmsg(fd, msg, flags) },
        Err(e) => return fails(e),
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
pub(crate) unsafe fn sendfile(out: c_int, inp: c_int, off: *mut off_t, count: size_t) -> ssize_t {
    let s = match xw_io(out) {
        Ok(Some(s)) => s,
        // SAFETY: forwarded.
        Ok(None) => return unsafe { real::sendfile(out, inp, off, count) },
        Err(e) => return fails(e),
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
pub(crate) unsafe fn sendfile64(out: c_int, inp: c_int, off: *mut off_t, count: size_t) -> ssize_t {
    // SAFETY: same contract.
    unsafe { sendfile(out, inp, off, count) }
}
