//! What every exported function shares: `errno`, the panic guard at the C boundary, the
//! one warning line of an unsupported verb, and the registry that tells the library's own
//! objects from anything else a program passes.
//!
//! * [`guard`]: every `extern "C"` function of the library runs its body inside it; a
//!   panic (a bug of ours) is caught, logged in one line and turned into the verb's error
//!   return (`EIO`/NULL), never unwinding into C or aborting the host program.
//! * [`unsupported`]: `xwarp-ibverbs: <verb>: not supported by xwarp (<why>)`, once per
//!   verb and process, on stderr; the caller returns `EOPNOTSUPP` (or NULL with it).
//! * [`wait_readable_cancellable`]: the one blocking wait of a verb that may sleep
//!   (`ibv_get_cq_event`, `ibv_get_async_event`, librdmacm's `rdma_get_cm_event`), done
//!   so that `pthread_cancel` of the waiting thread works (see its docs).
//! * [`warn_line`]: one line on stderr by a single `write(2)` that cannot panic.
//! * [`read_sockaddr`]: a program's socket address as IPv4 (v4-mapped IPv6 included), for
//!   librdmacm.
//! * [`Registry`]: the addresses of the live objects of one kind (PD, MR, CQ, ...): a
//!   pointer is dereferenced only after it was found there, so a stale, foreign or NULL
//!   pointer gets `EINVAL` instead of a crash.

use core::ffi::c_int;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, RwLock};

/// Set this thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's `errno`.
pub(crate) fn errno() -> c_int {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() }
}

/// Run `f`; a panic becomes `on_panic` (and one line on stderr naming `verb`).
///
/// Thread cancellation is disabled while `f` runs (and restored after): `f` may reach a
/// cancellation point (`write` of a warning line, `read`/`epoll_wait` of an attempt,
/// `open` of `/proc/self/maps`), and a cancellation acted upon there would unwind into
/// `catch_unwind` and abort the process. A cancel requested meanwhile stays pending until
/// the thread's next cancellation point outside the library, or the verb's own
/// cancellable wait ([`wait_readable_cancellable`]).
pub(crate) fn guard<T>(verb: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    let mut old: c_int = 0;
    // SAFETY: pthread_setcancelstate on the calling thread with a valid state and a
    // live out-pointer; it is not a cancellation point.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
    let r = guard_data_path(verb, on_panic, f);
    let mut ignored: c_int = 0;
    // SAFETY: as above, restoring the caller's state.
    unsafe { pthread_setcancelstate(old, &mut ignored) };
    r
}

/// [`guard`] without touching the cancellation state, for the data-path slots
/// (`poll_cq`, `req_notify_cq`, `post_send`, `post_recv`, `post_srq_recv`), which reach
/// no cancellation point (`sched_yield` is none) and are called millions of times.
pub(crate) fn guard_data_path<T>(verb: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(e) => {
            let what = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            warn_line(&format!("{verb}: internal error ({what}); the call fails"));
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// glibc's `PTHREAD_CANCEL_DISABLE` (`<pthread.h>`; `PTHREAD_CANCEL_ENABLE` is 0).
const PTHREAD_CANCEL_DISABLE: c_int = 1;

extern "C" {
    /// `pthread_setcancelstate(3)` (not in the `libc` crate).
    fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
}

/// What one non-blocking attempt of a blocking verb found: done with this return value,
/// or nothing yet and the fd to wait on (see [`wait_readable_cancellable`]).
pub(crate) enum Attempt<T> {
    /// The verb's return value.
    Done(T),
    /// Nothing yet: wait until this fd is readable, then try again.
    Wait(c_int),
}

extern "C-unwind" {
    /// glibc's `poll(2)`, declared `"C-unwind"`: it is a cancellation point, and a
    /// `pthread_cancel` of the thread blocked in it unwinds out of it (a forced unwind).
    #[link_name = "poll"]
    fn poll_unwind(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int;
}

/// Block until `fd` is readable (or `timeout_ms` passed, -1: no limit), in a way
/// `pthread_cancel` can interrupt. Returns `poll`'s result (`> 0` readable, 0 timeout,
/// -1 with `errno`, e.g. `EINTR`).
///
/// Why it is built this way: glibc implements `pthread_cancel` of a thread blocked in a
/// cancellation point (`poll`, `read`, `epoll_wait`) as a *forced unwind* through every
/// frame of the thread (rping's server error path cancels its CQ thread while it sits in
/// `ibv_get_cq_event`). A forced unwind that reaches a `catch_unwind` (our panic
/// [`guard`]) or the abort-on-unwind edge of an `extern "C"` function aborts the process
/// ("Rust cannot catch foreign exceptions"). RFC 2945 (the `"C-unwind"` ABI) defines a
/// forced unwind through Rust frames as sound exactly when those frames are "plain old
/// frames": no destructors pending and no `catch_unwind`, with `"C-unwind"` at every
/// foreign boundary. So every verb that may block is an `extern "C-unwind"` export that
/// loops over `guard(one non-blocking attempt)` (all Rust state dropped when it returns)
/// and this call, made from the export's own frame with only integers and raw pointers
/// alive; this function's frame has no destructors either. A cancelled thread therefore
/// unwinds from `poll` straight through to the program's frames and
/// `pthread_join` sees `PTHREAD_CANCELED`; nothing of ours is held (no lock, no
/// allocation) at that point.
///
/// For ibv-cm: `rdma_get_cm_event` should do the same: make the export
/// `extern "C-unwind"`, try under [`guard`] without blocking, and call this with the
/// event channel's fd from the export's frame when there is nothing yet.
#[inline(never)]
pub extern "C-unwind" fn wait_readable_cancellable(fd: c_int, timeout_ms: c_int) -> c_int {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on this frame; `poll` only reads and writes it.
    unsafe { poll_unwind(&mut p, 1, timeout_ms) }
}

/// Write `xwarp-ibverbs: <line>` and a newline to stderr in one `write(2)`, ignoring any
/// failure (`eprintln!` panics when stderr is closed or full, which inside an export
/// would turn a warning into an internal error, and inside the panic guard into an
/// abort).
pub(crate) fn warn_line(line: &str) {
    let mut b = Vec::with_capacity(line.len() + 16);
    b.extend_from_slice(b"xwarp-ibverbs: ");
    b.extend_from_slice(line.as_bytes());
    b.push(b'\n');
    // SAFETY: writing a live buffer of its length to fd 2 (whatever it is, or closed:
    // the error is ignored).
    let _ = unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
}

static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// One line on stderr, once per `verb` and process: the verb is not supported (`why`).
pub(crate) fn unsupported(verb: &str, why: &str) {
    let mut w = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if w.get_or_insert_with(HashSet::new).insert(verb.to_string()) {
        warn_line(&format!("{verb}: not supported by xwarp ({why})"));
    }
}

/// One warning line on stderr (a bad argument the program should know about), at most
/// once per `key`.
pub(crate) fn warn_once(key: &str, line: &str) {
    let mut w = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if w.get_or_insert_with(HashSet::new).insert(key.to_string()) {
        warn_line(line);
    }
}

/// The registry's sets: foldhash's fast hasher (a few cycles per `usize`, with a final
/// mix, so the aligned addresses do not cluster in hashbrown's low-bit buckets as they
/// did with a bare multiply). Fixed seed: the keys are our own allocations' addresses,
/// not attacker-chosen.
type AddrSet = HashSet<usize, foldhash::fast::FixedState>;

/// Shards of a [`Registry`]: threads polling different CQs or posting to different QPs
/// take different locks.
const SHARDS: usize = 16;

/// The live objects of one kind, by address (see the module docs). Lookups are on the
/// data path (every `ibv_post_send`, `ibv_poll_cq`): a read lock of one of
/// [`SHARDS`] shards and one foldhash probe (about 20 ns with the earlier multiply
/// hash, measured on the 2-vCPU test machine under load; not re-measured with foldhash).
pub(crate) struct Registry {
    shards: [RwLock<Option<AddrSet>>; SHARDS],
}

impl Registry {
    /// An empty registry (const, for a `static`).
    pub(crate) const fn new() -> Registry {
        Registry {
            shards: [const { RwLock::new(None) }; SHARDS],
        }
    }

    fn shard(&self, p: *const u8) -> &RwLock<Option<AddrSet>> {
        &self.shards[((p as usize) >> 6) % SHARDS]
    }

    /// Record a new object.
    pub(crate) fn insert(&self, p: *const u8) {
        let mut l = self.shard(p).write().unwrap_or_else(|e| e.into_inner());
        l.get_or_insert_with(AddrSet::default).insert(p as usize);
    }

    /// Forget an object (it is being destroyed); whether it was there.
    pub(crate) fn remove(&self, p: *const u8) -> bool {
        let mut l = self.shard(p).write().unwrap_or_else(|e| e.into_inner());
        l.as_mut().is_some_and(|m| m.remove(&(p as usize)))
    }

    /// Whether `p` is a live object of this kind.
    pub(crate) fn contains(&self, p: *const u8) -> bool {
        if p.is_null() {
            return false;
        }
        let l = self.shard(p).read().unwrap_or_else(|e| e.into_inner());
        l.as_ref().is_some_and(|m| m.contains(&(p as usize)))
    }
}

/// An `io::Error` from the engine as an errno value (`fallback` when it has none).
pub(crate) fn io_errno(e: &std::io::Error, fallback: c_int) -> c_int {
    use std::io::ErrorKind as K;
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    match e.kind() {
        K::InvalidInput => libc::EINVAL,
        K::OutOfMemory => libc::ENOMEM,
        K::TimedOut => libc::ETIMEDOUT,
        K::ConnectionAborted => libc::ENODEV,
        K::NotFound => libc::ENOENT,
        _ => fallback,
    }
}

/// A socket address a program passed (librdmacm's `rdma_bind_addr`, `rdma_resolve_addr`,
/// `rdma_getaddrinfo` results): `Ok(None)` for NULL; an IPv4 `sockaddr_in` as a
/// [`SocketAddrV4`](std::net::SocketAddrV4); an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`, in a `sockaddr_in6`) as that IPv4 address and port; any other
/// family or IPv6 address `EAFNOSUPPORT` (the engine is IPv4 only).
///
/// Why the mapped form: glibc's `getaddrinfo` in a network namespace without any IPv4
/// address configured (AI_ADDRCONFIG sees none: the engine owns the address, not the
/// kernel) answers `AF_INET6` with the v4-mapped form of a numeric IPv4 host, which
/// rping and rdma_client then pass on unchanged.
///
/// For ibv-cm: the CM's address parsing should call this one.
///
/// # Safety
/// `sa` is NULL or points at a `sockaddr` whose family's structure is readable.
#[allow(dead_code)] // for librdmacm (src/cm/), which adopts it after this lands
pub unsafe fn read_sockaddr(
    sa: *const libc::sockaddr,
) -> Result<Option<std::net::SocketAddrV4>, c_int> {
    use std::net::{Ipv4Addr, SocketAddrV4};
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract, at least the family is readable (unaligned: programs
    // cast byte buffers).
    let fam = c_int::from(unsafe { core::ptr::addr_of!((*sa).sa_family).read_unaligned() });
    match fam {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a readable sockaddr_in.
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            Ok(Some(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a readable sockaddr_in6.
            let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            let ip6 = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            match ip6.to_ipv4_mapped() {
                Some(ip) => Ok(Some(SocketAddrV4::new(ip, u16::from_be(sin6.sin6_port)))),
                None => Err(libc::EAFNOSUPPORT),
            }
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// Addresses of same-sized allocations (here 4096 of them, 64 bytes apart) spread
    /// over hashbrown's buckets, which take the hash's low bits: with a bare multiply
    /// the low bits of `addr >> 4` times an odd constant were always 0 and at most a
    /// quarter of 1024 buckets were ever used.
    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        let b = foldhash::fast::FixedState::default();
        let mut used = HashSet::new();
        for i in 0..4096usize {
            let addr = 0x5555_0000_0000usize + i * 64;
            used.insert(b.hash_one(addr) & 1023);
        }
        // Uniform hashing fills about 1024 * (1 - e^-4) = 1005 of them.
        assert!(used.len() > 900, "{} of 1024 buckets", used.len());
    }

    #[test]
    fn sockaddr_ipv4_and_v4_mapped_ipv6() {
        use std::net::{Ipv4Addr, SocketAddrV4};
        // SAFETY: plain data.
        let mut sin: libc::sockaddr_in = unsafe { core::mem::zeroed() };
        sin.sin_family = libc::AF_INET as u16;
        sin.sin_port = 7174u16.to_be();
        sin.sin_addr.s_addr = u32::from(Ipv4Addr::new(10, 1, 0, 10)).to_be();
        let want = SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, 10), 7174);
        // SAFETY: live sockaddrs of their family.
        unsafe {
            assert_eq!(
                read_sockaddr((&sin as *const libc::sockaddr_in).cast()),
                Ok(Some(want))
            );
            assert_eq!(read_sockaddr(core::ptr::null()), Ok(None));
            let mut s6: libc::sockaddr_in6 = core::mem::zeroed();
            s6.sin6_family = libc::AF_INET6 as u16;
            s6.sin6_port = 7174u16.to_be();
            s6.sin6_addr.s6_addr = Ipv4Addr::new(10, 1, 0, 10).to_ipv6_mapped().octets();
            let p6 = |s: &libc::sockaddr_in6| (s as *const libc::sockaddr_in6).cast();
            assert_eq!(read_sockaddr(p6(&s6)), Ok(Some(want)), "::ffff:10.1.0.10");
            s6.sin6_addr.s6_addr = "fe80::1".parse::<std::net::Ipv6Addr>().unwrap().octets();
            assert_eq!(read_sockaddr(p6(&s6)), Err(libc::EAFNOSUPPORT));
            let mut other: libc::sockaddr = core::mem::zeroed();
            other.sa_family = libc::AF_UNIX as u16;
            assert_eq!(read_sockaddr(&other), Err(libc::EAFNOSUPPORT));
        }
    }

    #[test]
    fn registry_insert_contains_remove() {
        let r = Registry::new();
        let v: Vec<Box<u64>> = (0..1000).map(Box::new).collect();
        for b in &v {
            r.insert((&**b as *const u64).cast());
        }
        assert!(v.iter().all(|b| r.contains((&**b as *const u64).cast())));
        assert!(!r.contains(core::ptr::null()));
        assert!(r.remove((&*v[3] as *const u64).cast()));
        assert!(!r.contains((&*v[3] as *const u64).cast()));
        assert!(!r.remove((&*v[3] as *const u64).cast()));
    }
}
