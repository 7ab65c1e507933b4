//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`: the libc resolver for IPv4 stream addresses,
//! packed as librdmacm packs them for iWARP (`RAI_PASSIVE`: the address is the source,
//! otherwise the destination; no route or connect data, port space TCP, QP type RC).

use core::ffi::{c_char, c_int};
use std::collections::HashSet;
use std::sync::Mutex;

use crate::abi::*;

#[repr(C)]
struct InfoRec {
    c: rdma_addrinfo,
    src: libc::sockaddr_in,
    dst: libc::sockaddr_in,
}

static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn live<T>(f: impl FnOnce(&mut HashSet<usize>) -> T) -> T {
    let mut g = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashSet::new))
}

/// What the C function returns: 0, a `getaddrinfo` `EAI_*` code from the resolver (as
/// librdmacm passes them on), or -1 with this errno.
#[derive(Debug, PartialEq, Eq)]
pub enum GaiError {
    /// An `EAI_*` code.
    Eai(c_int),
    /// -1 with this errno.
    Errno(c_int),
}

/// Resolve `node`/`service` into one `rdma_addrinfo` (free it with [`freeaddrinfo`]).
///
/// # Safety
/// `node`, `service` NULL or C strings; `hints` NULL or a readable `rdma_addrinfo` whose
/// `ai_src_addr` (if set) is a readable `sockaddr`.
pub unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
) -> Result<*mut rdma_addrinfo, GaiError> {
    // SAFETY: per the contract.
    let h = unsafe { hints.as_ref() };
    let flags = h.map(|h| h.ai_flags).unwrap_or(0);
    let family = h.map(|h| h.ai_family).unwrap_or(0);
    if family != 0 && family != libc::AF_INET {
        return Err(GaiError::Eai(libc::EAI_FAMILY));
    }
    let ps = h
        .map(|h| h.ai_port_space)
        .filter(|p| *p != 0)
        .unwrap_or(RDMA_PS_TCP as c_int);
    let qpt = h
        .map(|h| h.ai_qp_type)
        .filter(|q| *q != 0)
        .unwrap_or(IBV_QPT_RC as c_int);
    if node.is_null() && service.is_null() {
        return Err(GaiError::Eai(libc::EAI_NONAME));
    }
    // SAFETY: all-zero is a valid addrinfo hint.
    let mut lh: libc::addrinfo = unsafe { core::mem::zeroed() };
    lh.ai_family = libc::AF_INET;
    lh.ai_socktype = libc::SOCK_STREAM;
    if flags & RAI_PASSIVE != 0 {
        lh.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        lh.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut out: *mut libc::addrinfo = core::ptr::null_mut();
    // SAFETY: C strings or NULL per the contract; `out` is written by libc.
    let r = unsafe { libc::getaddrinfo(node, service, &lh, &mut out) };
    if r != 0 {
        return Err(GaiError::Eai(r));
    }
    // The first IPv4 result.
    let mut found = None;
    let mut p = out;
    while !p.is_null() {
        // SAFETY: a list libc returned.
        let a = unsafe { &*p };
        if a.ai_family == libc::AF_INET && !a.ai_addr.is_null() {
            // SAFETY: an AF_INET entry holds a sockaddr_in.
            found = Some(unsafe { a.ai_addr.cast::<libc::sockaddr_in>().read_unaligned() });
            break;
        }
        p = a.ai_next;
    }
    // SAFETY: the list from getaddrinfo, freed once.
    unsafe { libc::freeaddrinfo(out) };
    let Some(sin) = found else {
        return Err(GaiError::Eai(libc::EAI_NONAME));
    };
    // SAFETY: plain data; all-zero is a valid start.
    let mut rec: Box<InfoRec> = Box::new(unsafe { core::mem::zeroed() });
    rec.c.ai_flags = flags;
    rec.c.ai_family = libc::AF_INET;
    rec.c.ai_qp_type = qpt;
    rec.c.ai_port_space = ps;
    let sl = core::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    if flags & RAI_PASSIVE != 0 {
        rec.src = sin;
        rec.c.ai_src_len = sl;
        rec.c.ai_src_addr = (&mut rec.src as *mut libc::sockaddr_in).cast();
    } else {
        rec.dst = sin;
        rec.c.ai_dst_len = sl;
        rec.c.ai_dst_addr = (&mut rec.dst as *mut libc::sockaddr_in).cast();
        if let Some(h) = h {
            if !h.ai_src_addr.is_null() {
                // SAFETY: per the contract.
                match unsafe { super::addr::read_sockaddr(h.ai_src_addr) } {
                    Ok(Some(s)) => {
                        rec.src = super::addr::sockaddr_in_of(s);
                        rec.c.ai_src_len = sl;
                        rec.c.ai_src_addr = (&mut rec.src as *mut libc::sockaddr_in).cast();
                    }
                    Ok(None) => {}
                    Err(e) => return Err(GaiError::Errno(e)),
                }
            }
        }
    }
    let p = Box::into_raw(rec);
    live(|l| l.insert(p as usize));
    Ok(p.cast())
}

/// Free what [`getaddrinfo`] returned; anything else is ignored.
pub fn freeaddrinfo(res: *mut rdma_addrinfo) {
    if live(|l| l.remove(&(res as usize))) {
        // SAFETY: a box getaddrinfo made, removed from the registry once.
        drop(unsafe { Box::from_raw(res.cast::<InfoRec>()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn numeric_active_and_passive() {
        let node = CString::new("10.1.0.10").unwrap();
        let port = CString::new("7174").unwrap();
        // SAFETY: C strings, no hints.
        let r = unsafe { getaddrinfo(node.as_ptr(), port.as_ptr(), core::ptr::null()) }.unwrap();
        // SAFETY: a live result.
        let a = unsafe { &*r };
        assert!(a.ai_src_addr.is_null());
        assert_eq!(a.ai_port_space, RDMA_PS_TCP as c_int);
        assert_eq!(a.ai_qp_type, IBV_QPT_RC as c_int);
        // SAFETY: ai_dst_addr is the record's sockaddr_in.
        let d = unsafe { super::super::addr::read_sockaddr(a.ai_dst_addr) }
            .unwrap()
            .unwrap();
        assert_eq!(d, "10.1.0.10:7174".parse().unwrap());
        freeaddrinfo(r);
        // SAFETY: all-zero hints with RAI_PASSIVE.
        let mut h: rdma_addrinfo = unsafe { core::mem::zeroed() };
        h.ai_flags = RAI_PASSIVE;
        // SAFETY: C string and hints.
        let r = unsafe { getaddrinfo(core::ptr::null(), port.as_ptr(), &h) }.unwrap();
        // SAFETY: a live result.
        let a = unsafe { &*r };
        assert!(a.ai_dst_addr.is_null());
        // SAFETY: the record's sockaddr_in.
        let s = unsafe { super::super::addr::read_sockaddr(a.ai_src_addr) }
            .unwrap()
            .unwrap();
        assert_eq!(s, "0.0.0.0:7174".parse().unwrap());
        freeaddrinfo(r);
        freeaddrinfo(r); // a second free is ignored
        freeaddrinfo(core::ptr::null_mut());
    }

    #[test]
    fn errors_are_resolver_codes() {
        let bad = CString::new("not an address").unwrap();
        // SAFETY: all-zero hints.
        let mut h: rdma_addrinfo = unsafe { core::mem::zeroed() };
        h.ai_flags = RAI_NUMERICHOST;
        // SAFETY: C string and hints.
        let r = unsafe { getaddrinfo(bad.as_ptr(), core::ptr::null(), &h) };
        assert!(matches!(r, Err(GaiError::Eai(_))));
        h.ai_family = libc::AF_INET6;
        // SAFETY: as above.
        let r = unsafe { getaddrinfo(bad.as_ptr(), core::ptr::null(), &h) };
        assert_eq!(r.err(), Some(GaiError::Eai(libc::EAI_FAMILY)));
        // SAFETY: NULL strings.
        let r = unsafe { getaddrinfo(core::ptr::null(), core::ptr::null(), core::ptr::null()) };
        assert_eq!(r.err(), Some(GaiError::Eai(libc::EAI_NONAME)));
    }
}
