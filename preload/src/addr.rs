//! `sockaddr` ↔ [`SocketAddr`] conversions.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use libc::{c_int, sa_family_t, sockaddr, sockaddr_in, sockaddr_in6, socklen_t};

/// Read a socket address (IPv4, or IPv6 with IPv4-mapped addresses turned into IPv4).
///
/// # Safety
/// `addr` must be null or point to `len` readable bytes.
pub(crate) unsafe fn from_raw(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family is readable (checked above).
    let family = c_int::from(unsafe { (*addr).sa_family });
    match family {
        libc::AF_INET if len as usize >= std::mem::size_of::<sockaddr_in>() => {
            // SAFETY: long enough for sockaddr_in; read unaligned to be safe.
            let a: sockaddr_in = unsafe { std::ptr::read_unaligned(addr.cast()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<sockaddr_in6>() => {
            // SAFETY: long enough for sockaddr_in6.
            let a: sockaddr_in6 = unsafe { std::ptr::read_unaligned(addr.cast()) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            let port = u16::from_be(a.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    port,
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )),
            })
        }
        _ => None,
    }
}

/// Encode `sa` for a socket of `domain` (IPv4 addresses become IPv4-mapped on
/// `AF_INET6` sockets).
pub(crate) fn encode(sa: SocketAddr, domain: c_int) -> Vec<u8> {
    let v6 = |ip: Ipv6Addr, port: u16, flow: u32, scope: u32| {
        // SAFETY: all-zero is a valid sockaddr_in6.
        let mut a: sockaddr_in6 = unsafe { std::mem::zeroed() };
        a.sin6_family = libc::AF_INET6 as sa_family_t;
        a.sin6_port = port.to_be();
        a.sin6_addr.s6_addr = ip.octets();
        a.sin6_flowinfo = flow;
        a.sin6_scope_id = scope;
        // SAFETY: plain-old-data struct viewed as bytes.
        unsafe {
            std::slice::from_raw_parts(
                (&a as *const sockaddr_in6).cast::<u8>(),
                std::mem::size_of::<sockaddr_in6>(),
            )
        }
        .to_vec()
    };
    match (sa, domain) {
        (SocketAddr::V4(a), libc::AF_INET6) => v6(a.ip().to_ipv6_mapped(), a.port(), 0, 0),
        (SocketAddr::V4(a), _) => {
            // SAFETY: all-zero is a valid sockaddr_in.
            let mut s: sockaddr_in = unsafe { std::mem::zeroed() };
            s.sin_family = libc::AF_INET as sa_family_t;
            s.sin_port = a.port().to_be();
            s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            // SAFETY: plain-old-data struct viewed as bytes.
            unsafe {
                std::slice::from_raw_parts(
                    (&s as *const sockaddr_in).cast::<u8>(),
                    std::mem::size_of::<sockaddr_in>(),
                )
            }
            .to_vec()
        }
        (SocketAddr::V6(a), _) => v6(*a.ip(), a.port(), a.flowinfo(), a.scope_id()),
    }
}

/// Copy an encoded address out like the kernel: truncate to `*len`, report the full size.
///
/// # Safety
/// `addr`/`len` must be null or valid for the caller-declared size.
pub(crate) unsafe fn write_out(bytes: &[u8], addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    // SAFETY: `len` is valid (checked non-null, caller contract).
    let cap = unsafe { *len } as usize;
    let n = cap.min(bytes.len());
    // SAFETY: `addr` has room for `cap` bytes (caller contract); n <= cap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr.cast::<u8>(), n);
        *len = bytes.len() as socklen_t;
    }
}

/// The unspecified address of `domain` with `port`.
pub(crate) fn unspecified(domain: c_int, port: u16) -> SocketAddr {
    let ip = if domain == libc::AF_INET6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    SocketAddr::new(ip, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_roundtrip_and_mapped_v6() {
        let sa: SocketAddr = "10.88.1.2:8080".parse().unwrap();
        let b = encode(sa, libc::AF_INET);
        assert_eq!(b.len(), std::mem::size_of::<sockaddr_in>());
        // SAFETY: b holds a sockaddr_in.
        assert_eq!(
            unsafe { from_raw(b.as_ptr().cast(), b.len() as socklen_t) },
            Some(sa)
        );
        let b6 = encode(sa, libc::AF_INET6);
        assert_eq!(b6.len(), std::mem::size_of::<sockaddr_in6>());
        // SAFETY: b6 holds a sockaddr_in6 (IPv4-mapped), which reads back as IPv4.
        assert_eq!(
            unsafe { from_raw(b6.as_ptr().cast(), b6.len() as socklen_t) },
            Some(sa)
        );
        let v6: SocketAddr = "[fd00::2]:443".parse().unwrap();
        let b = encode(v6, libc::AF_INET6);
        // SAFETY: b holds a sockaddr_in6.
        assert_eq!(
            unsafe { from_raw(b.as_ptr().cast(), b.len() as socklen_t) },
            Some(v6)
        );
    }

    #[test]
    fn short_or_foreign_addresses_are_none() {
        let sa: SocketAddr = "10.88.1.2:8080".parse().unwrap();
        let b = encode(sa, libc::AF_INET);
        // SAFETY: the length given is within the buffer.
        assert_eq!(unsafe { from_raw(b.as_ptr().cast(), 4) }, None);
        let mut unix = b.clone();
        unix[0] = libc::AF_UNIX as u8;
        unix[1] = 0;
        // SAFETY: within the buffer.
        assert_eq!(
            unsafe { from_raw(unix.as_ptr().cast(), unix.len() as socklen_t) },
            None
        );
        // SAFETY: null is allowed.
        assert_eq!(unsafe { from_raw(std::ptr::null(), 16) }, None);
    }

    #[test]
    fn write_out_truncates_and_reports_full_length() {
        let b = encode("1.2.3.4:5".parse().unwrap(), libc::AF_INET);
        let mut buf = [0u8; 4];
        let mut len: socklen_t = 4;
        // SAFETY: buf has 4 bytes, len says 4.
        unsafe { write_out(&b, buf.as_mut_ptr().cast(), &mut len) };
        assert_eq!(len as usize, b.len());
        assert_eq!(&buf[..], &b[..4]);
    }
}
