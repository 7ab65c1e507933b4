//! Socket addresses for the CM: reading the program's `struct sockaddr`, writing
//! `rdma_addr`, and whether a destination is reachable through the engine (its
//! `XWARP_ADDR` subnet, or anywhere with `XWARP_GATEWAY`). The engine speaks IPv4 here:
//! an IPv6 or `AF_IB` address is `EAFNOSUPPORT`.

use core::ffi::c_int;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::abi::*;

/// The engine's IPv4 configuration, as the CM needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineAddr {
    /// `XWARP_ADDR`'s address.
    pub ip: Ipv4Addr,
    /// `XWARP_ADDR`'s prefix length.
    pub prefix: u8,
    /// `XWARP_GATEWAY`.
    pub gateway: Option<Ipv4Addr>,
}

impl EngineAddr {
    /// Parse `XWARP_ADDR` (`A.B.C.D/P`) and `XWARP_GATEWAY` as read through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<EngineAddr, String> {
        let v = get("XWARP_ADDR").ok_or("XWARP_ADDR is not set")?;
        let (a, p) = v
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("XWARP_ADDR={v:?}: expected A.B.C.D/PREFIX"))?;
        let ip: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("XWARP_ADDR={v:?}: not an IPv4 address"))?;
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|p| (1..=32).contains(p))
            .ok_or_else(|| format!("XWARP_ADDR={v:?}: prefix must be 1..=32"))?;
        let gateway = match get("XWARP_GATEWAY").filter(|g| !g.trim().is_empty()) {
            None => None,
            Some(g) => Some(
                g.trim()
                    .parse()
                    .map_err(|_| format!("XWARP_GATEWAY={g:?}: not an IPv4 address"))?,
            ),
        };
        Ok(EngineAddr {
            ip,
            prefix,
            gateway,
        })
    }

    fn mask(&self) -> u32 {
        u32::MAX << (32 - u32::from(self.prefix))
    }

    /// Whether the engine can reach `dst`: inside its subnet (not the engine's own
    /// address, the network or broadcast address), or anywhere unicast with a gateway.
    pub fn reaches(&self, dst: Ipv4Addr) -> bool {
        if dst.is_unspecified() || dst.is_broadcast() || dst.is_multicast() || dst == self.ip {
            return false;
        }
        if dst.is_loopback() {
            return false;
        }
        let m = self.mask();
        let (d, me) = (u32::from(dst), u32::from(self.ip));
        if d & m == me & m {
            // Host part all zeros or all ones: not a peer (prefixes /31 and /32 aside).
            let host = d & !m;
            return self.prefix >= 31 || (host != 0 && host != !m);
        }
        self.gateway.is_some()
    }

    /// Whether `src` may be bound: the wildcard or the engine's own address.
    pub fn owns(&self, src: Ipv4Addr) -> bool {
        src.is_unspecified() || src == self.ip
    }
}

/// The program's socket address: `Ok(None)` for NULL, IPv4 (or IPv4-mapped IPv6, what
/// glibc's resolver may answer) as a [`SocketAddrV4`], any other family `EAFNOSUPPORT`
/// (the library's one parser, `ffi::read_sockaddr`).
///
/// # Safety
/// `sa` is NULL or points at a `sockaddr` whose family's structure is readable.
pub unsafe fn read_sockaddr(sa: *const libc::sockaddr) -> Result<Option<SocketAddrV4>, c_int> {
    // SAFETY: per the contract.
    unsafe { crate::ffi::read_sockaddr(sa) }
}

/// `a` as a `sockaddr_in`.
pub fn sockaddr_in_of(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Write `a` into one of `rdma_addr`'s address unions (zeroing the rest of it).
pub fn write_sockaddr(dst: &mut rdma_sockaddr, a: SocketAddrV4) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    *dst = rdma_sockaddr {
        storage: unsafe { core::mem::zeroed() },
    };
    dst.sin = sockaddr_in_of(a);
}

/// The IPv4 address stored in an `rdma_addr` union, if any.
pub fn stored(s: &rdma_sockaddr) -> Option<SocketAddrV4> {
    // SAFETY: every view of the union is plain bytes; the family says which one is meant.
    unsafe {
        if c_int::from(s.addr.sa_family) == libc::AF_INET {
            Some(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin.sin_addr.s_addr)),
                u16::from_be(s.sin.sin_port),
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eng(addr: &str, gw: Option<&str>) -> EngineAddr {
        EngineAddr::from_vars(|k| match k {
            "XWARP_ADDR" => Some(addr.to_string()),
            "XWARP_GATEWAY" => gw.map(str::to_string),
            _ => None,
        })
        .unwrap()
    }

    #[test]
    fn reachability_is_the_subnet_or_a_gateway() {
        let e = eng("10.1.0.10/24", None);
        assert!(e.reaches("10.1.0.11".parse().unwrap()));
        assert!(!e.reaches("10.1.0.10".parse().unwrap()), "ourselves");
        assert!(!e.reaches("10.1.0.0".parse().unwrap()), "network address");
        assert!(!e.reaches("10.1.0.255".parse().unwrap()), "broadcast");
        assert!(!e.reaches("10.2.0.1".parse().unwrap()), "no gateway");
        assert!(
            !e.reaches("127.0.0.1".parse().unwrap()),
            "loopback is the kernel's"
        );
        assert!(!e.reaches("0.0.0.0".parse().unwrap()));
        let g = eng("10.1.0.10/24", Some("10.1.0.1"));
        assert!(g.reaches("192.0.2.7".parse().unwrap()));
        assert!(!g.reaches("224.0.0.1".parse().unwrap()));
        let p31 = eng("10.9.0.0/31", None);
        assert!(p31.reaches("10.9.0.1".parse().unwrap()));
    }

    #[test]
    fn bad_engine_addresses_name_the_variable() {
        for bad in ["10.1.0.10", "10.1.0.10/0", "10.1.0.10/33", "x/24"] {
            let e = EngineAddr::from_vars(|k| (k == "XWARP_ADDR").then(|| bad.to_string()));
            assert!(e.unwrap_err().contains("XWARP_ADDR"), "{bad}");
        }
        assert!(EngineAddr::from_vars(|_| None).is_err());
        let e = EngineAddr::from_vars(|k| match k {
            "XWARP_ADDR" => Some("10.1.0.1/24".into()),
            _ => Some("nope".into()),
        });
        assert!(e.unwrap_err().contains("XWARP_GATEWAY"));
    }

    #[test]
    fn sockaddr_round_trip_and_families() {
        let a = SocketAddrV4::new("10.1.0.10".parse().unwrap(), 7174);
        let sin = sockaddr_in_of(a);
        // SAFETY: a valid sockaddr_in viewed as a sockaddr.
        let back = unsafe { read_sockaddr((&sin as *const libc::sockaddr_in).cast()) };
        assert_eq!(back, Ok(Some(a)));
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read_sockaddr(core::ptr::null()) }, Ok(None));
        // SAFETY: all-zero sockaddr_in6 with the family set.
        let mut s6: libc::sockaddr_in6 = unsafe { core::mem::zeroed() };
        s6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        // SAFETY: a valid sockaddr_in6.
        let r = unsafe { read_sockaddr((&s6 as *const libc::sockaddr_in6).cast()) };
        assert_eq!(r, Err(libc::EAFNOSUPPORT));
        // SAFETY: all-zero is valid storage.
        let mut u = rdma_sockaddr {
            storage: unsafe { core::mem::zeroed() },
        };
        assert_eq!(stored(&u), None);
        write_sockaddr(&mut u, a);
        assert_eq!(stored(&u), Some(a));
    }
}
