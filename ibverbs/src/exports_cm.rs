//! The exported librdmacm functions, each at the symbol version librdmacm.so.1 defines it
//! at (`RDMACM_1.0`, `RDMACM_1.2` for `rdma_establish`/`rdma_init_qp_attr`; `.symver` at
//! the end, nodes in `libxwarp_ibverbs.map`). The work is in [`crate::cm`]; this file only
//! converts: librdmacm returns -1 with `errno` (or NULL with `errno`), and nothing panics
//! across the boundary (a panic becomes -1/`EIO` with one line on stderr).
//!
//! The multicast, SRQ and ECE calls of librdmacm exist here too so that a program that
//! imports them reaches this library and not the real librdmacm with one of our ids; they
//! return `ENOSYS` (UD multicast, `rdma_create_srq`) with one warning line.

use core::ffi::{c_char, c_int, c_void};

use crate::abi::*;
use crate::cm::id::{self, ConnParam};
use crate::cm::info;
use crate::cm::link;
use crate::ffi::{guard, set_errno, wait_readable_cancellable, Attempt};

fn rc(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn ptr<T>(r: Result<*mut T, c_int>) -> *mut T {
    match r {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
    }
}

/// `rdma_create_event_channel@RDMACM_1.0`: a channel whose `fd` is readable while an event
/// waits; NULL with `errno` on failure.
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard("rdma_create_event_channel", core::ptr::null_mut(), || {
        ptr(id::create_channel())
    })
}

/// `rdma_destroy_event_channel@RDMACM_1.0` (refused with a warning while ids use it).
///
/// # Safety
/// `ch` NULL or from `rdma_create_event_channel` (anything else is ignored).
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    guard("rdma_destroy_event_channel", (), || {
        if let Err(e) = id::destroy_channel(ch) {
            set_errno(e);
        }
    })
}

/// `rdma_create_id@RDMACM_1.0`: `RDMA_PS_TCP` only (UD port spaces: `EOPNOTSUPP` with one
/// warning); a NULL channel makes a synchronous id.
///
/// # Safety
/// `out` writable.
pub unsafe extern "C" fn rdma_create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard("rdma_create_id", -1, || {
        if out.is_null() {
            return rc(Err(libc::EINVAL));
        }
        rc(id::create_id(ch, context, ps).map(|p| {
            // SAFETY: writable per the contract.
            unsafe { *out = p }
        }))
    })
}

/// `rdma_destroy_id@RDMACM_1.0`: waits until the events of the id the program took are
/// acknowledged.
///
/// # Safety
/// `cm_id` not used after success.
pub unsafe extern "C" fn rdma_destroy_id(cm_id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", -1, || rc(id::destroy_id(cm_id)))
}

/// `rdma_bind_addr@RDMACM_1.0`.
///
/// # Safety
/// `addr` NULL or a readable socket address.
pub unsafe extern "C" fn rdma_bind_addr(
    cm_id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    // SAFETY: per the contract.
    guard("rdma_bind_addr", -1, || {
        rc(unsafe { id::bind(cm_id, addr) })
    })
}

/// `rdma_resolve_addr@RDMACM_1.0` (the timeout is not needed: resolution is local).
///
/// # Safety
/// `src`, `dst` NULL or readable socket addresses.
pub unsafe extern "C" fn rdma_resolve_addr(
    cm_id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: per the contract.
    guard("rdma_resolve_addr", -1, || {
        rc(unsafe { id::resolve_addr(cm_id, src, dst) })
    })
}

/// `rdma_resolve_route@RDMACM_1.0`.
pub extern "C" fn rdma_resolve_route(cm_id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || rc(id::resolve_route(cm_id)))
}

/// `rdma_listen@RDMACM_1.0`.
pub extern "C" fn rdma_listen(cm_id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || rc(id::listen(cm_id, backlog)))
}

/// `rdma_get_request@RDMACM_1.0` (synchronous listening ids).
///
/// # Safety
/// `out` writable.
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    out: *mut *mut rdma_cm_id,
) -> c_int {
    guard("rdma_get_request", -1, || {
        if out.is_null() {
            return rc(Err(libc::EINVAL));
        }
        rc(id::get_request(listen).map(|p| {
            // SAFETY: writable per the contract.
            unsafe { *out = p }
        }))
    })
}

/// `rdma_connect@RDMACM_1.0`.
///
/// # Safety
/// `param` NULL or a readable `rdma_conn_param` with readable private data.
pub unsafe extern "C" fn rdma_connect(
    cm_id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard("rdma_connect", -1, || {
        // SAFETY: per the contract.
        rc(id::connect(cm_id, unsafe { ConnParam::read(param) }))
    })
}

/// `rdma_accept@RDMACM_1.0`.
///
/// # Safety
/// As [`rdma_connect`].
pub unsafe extern "C" fn rdma_accept(cm_id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_accept", -1, || {
        // SAFETY: per the contract.
        rc(id::accept(cm_id, unsafe { ConnParam::read(param) }))
    })
}

/// `rdma_reject@RDMACM_1.0`.
///
/// # Safety
/// `data` NULL or readable for `len` bytes.
pub unsafe extern "C" fn rdma_reject(
    cm_id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    guard("rdma_reject", -1, || {
        let d = if data.is_null() || len == 0 {
            &[][..]
        } else {
            // SAFETY: per the contract.
            unsafe { core::slice::from_raw_parts(data.cast::<u8>(), len.into()) }
        };
        rc(id::reject(cm_id, d))
    })
}

/// `rdma_disconnect@RDMACM_1.0`.
pub extern "C" fn rdma_disconnect(cm_id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", -1, || rc(id::disconnect(cm_id)))
}

/// `rdma_get_cm_event@RDMACM_1.0`: waits unless the channel's fd is non-blocking
/// (`EAGAIN`). On a channel already destroyed it waits for good (see
/// `cm::id::destroy_channel`: rping's CM thread racing its main thread's exit).
///
/// `extern "C-unwind"` and blocking outside the panic guard, so that `pthread_cancel` of a
/// thread waiting here (a program's CM thread) unwinds it instead of aborting the process
/// (see `ffi::wait_readable_cancellable`).
///
/// # Safety
/// `out` writable.
#[inline(never)]
pub unsafe extern "C-unwind" fn rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    let mut waited = false;
    loop {
        let step = guard("rdma_get_cm_event", Attempt::Done(-1), || {
            if out.is_null() {
                return Attempt::Done(rc(Err(libc::EINVAL)));
            }
            match id::try_get_event(ch, waited) {
                Ok(Some(e)) => {
                    // SAFETY: writable per the contract.
                    unsafe { *out = e };
                    Attempt::Done(0)
                }
                Ok(None) => Attempt::Wait(ch_fd(ch)),
                Err(e) => Attempt::Done(rc(Err(e))),
            }
        });
        match step {
            Attempt::Done(r) => return r,
            // Only integers are alive in this frame: a cancellation unwinds through it.
            Attempt::Wait(fd) => {
                waited = true;
                wait_readable_cancellable(fd, -1);
            }
        }
    }
}

/// The fd of a channel [`id::try_get_event`] just accepted; -1 (poll then waits on
/// nothing, for good) for one destroyed before or while the caller waited on it.
fn ch_fd(ch: *mut rdma_event_channel) -> c_int {
    id::channel_of(ch).map(|c| c.c.fd).unwrap_or(-1)
}

/// `rdma_ack_cm_event@RDMACM_1.0`.
pub extern "C" fn rdma_ack_cm_event(e: *mut rdma_cm_event) -> c_int {
    guard("rdma_ack_cm_event", -1, || rc(id::ack_event(e)))
}

/// `rdma_create_qp@RDMACM_1.0`.
///
/// # Safety
/// `attr` NULL or a writable `ibv_qp_init_attr`.
pub unsafe extern "C" fn rdma_create_qp(
    cm_id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: per the contract.
    guard("rdma_create_qp", -1, || {
        rc(unsafe { id::create_qp(cm_id, pd, attr) })
    })
}

/// `rdma_create_qp_ex@RDMACM_1.0`: `comp_mask` may hold `IBV_QP_INIT_ATTR_PD` and
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS` with no flags; anything else (the `ibv_wr_*` send ops,
/// XRC, RSS) is `EOPNOTSUPP` with one warning.
///
/// # Safety
/// `attr` NULL or a writable `ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn rdma_create_qp_ex(
    cm_id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard("rdma_create_qp_ex", -1, || {
        // SAFETY: per the contract.
        let Some(x) = (unsafe { attr.as_mut() }) else {
            return rc(Err(libc::EINVAL));
        };
        let ok = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
        if x.comp_mask & !ok != 0
            || (x.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && x.create_flags != 0)
        {
            id::warn_once(&format!(
                "rdma_create_qp_ex: comp_mask {:#x} / create_flags {:#x} not supported (EOPNOTSUPP)",
                x.comp_mask, x.create_flags
            ));
            return rc(Err(libc::EOPNOTSUPP));
        }
        let pd = if x.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            x.pd
        } else {
            core::ptr::null_mut()
        };
        let mut a = ibv_qp_init_attr {
            qp_context: x.qp_context,
            send_cq: x.send_cq,
            recv_cq: x.recv_cq,
            srq: x.srq,
            cap: x.cap,
            qp_type: x.qp_type,
            sq_sig_all: x.sq_sig_all,
        };
        // SAFETY: a local attribute struct.
        let r = unsafe { id::create_qp(cm_id, pd, &mut a) };
        if r.is_ok() {
            x.cap = a.cap;
            x.send_cq = a.send_cq;
            x.recv_cq = a.recv_cq;
        }
        rc(r)
    })
}

/// `rdma_destroy_qp@RDMACM_1.0`.
pub extern "C" fn rdma_destroy_qp(cm_id: *mut rdma_cm_id) {
    guard("rdma_destroy_qp", (), || {
        if let Err(e) = id::destroy_qp(cm_id) {
            set_errno(e);
        }
    })
}

/// `rdma_getaddrinfo@RDMACM_1.0`: 0, an `EAI_*` code, or -1 with `errno`.
///
/// # Safety
/// `node`, `service` NULL or C strings; `hints` NULL or readable; `res` writable.
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", -1, || {
        if res.is_null() {
            return rc(Err(libc::EINVAL));
        }
        // SAFETY: per the contract.
        match unsafe { info::getaddrinfo(node, service, hints) } {
            Ok(p) => {
                // SAFETY: writable per the contract.
                unsafe { *res = p };
                0
            }
            Err(info::GaiError::Eai(e)) => e,
            Err(info::GaiError::Errno(e)) => rc(Err(e)),
        }
    })
}

/// `rdma_freeaddrinfo@RDMACM_1.0`.
pub extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard("rdma_freeaddrinfo", (), || info::freeaddrinfo(res))
}

/// `rdma_create_ep@RDMACM_1.0`: a synchronous id bound (`RAI_PASSIVE`) or resolved to
/// `res`'s addresses, with a QP when `qp_init_attr` is given (for a passive id, each id
/// `rdma_get_request` returns gets one).
///
/// # Safety
/// `out` writable; `res` a readable `rdma_addrinfo`; `attr` NULL or writable.
pub unsafe extern "C" fn rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_ep", -1, || {
        // SAFETY: per the contract.
        let Some(r) = (unsafe { res.as_ref() }) else {
            return rc(Err(libc::EINVAL));
        };
        if out.is_null() {
            return rc(Err(libc::EINVAL));
        }
        let ps = if r.ai_port_space == 0 {
            RDMA_PS_TCP
        } else {
            r.ai_port_space as rdma_port_space
        };
        let cid = match id::create_id(core::ptr::null_mut(), core::ptr::null_mut(), ps) {
            Ok(c) => c,
            Err(e) => return rc(Err(e)),
        };
        // librdmacm's rdma_create_ep gives the QP the addrinfo's QP type (rdma_client
        // leaves `qp_type` 0 in its attributes).
        let qpt = if r.ai_qp_type == 0 {
            IBV_QPT_RC
        } else {
            r.ai_qp_type as u32
        };
        if !attr.is_null() {
            // SAFETY: writable per the contract.
            unsafe { (*attr).qp_type = qpt };
        }
        let r2 = (|| {
            if r.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: the addrinfo's address per the contract.
                unsafe { id::bind(cid, r.ai_src_addr) }?;
                if !attr.is_null() {
                    // SAFETY: readable per the contract (copied).
                    let a = unsafe { attr.read() };
                    id::set_ep_qp(cid, a, pd)?;
                }
            } else {
                // SAFETY: as above.
                unsafe { id::resolve_addr(cid, r.ai_src_addr, r.ai_dst_addr) }?;
                id::resolve_route(cid)?;
                if !attr.is_null() {
                    // SAFETY: writable per the contract.
                    unsafe { id::create_qp(cid, pd, attr) }?;
                }
            }
            Ok(())
        })();
        match r2 {
            Ok(()) => {
                // SAFETY: writable per the contract.
                unsafe { *out = cid };
                0
            }
            Err(e) => {
                let _ = id::destroy_qp(cid);
                let _ = id::destroy_id(cid);
                rc(Err(e))
            }
        }
    })
}

/// `rdma_destroy_ep@RDMACM_1.0`: its QP, then the id.
///
/// # Safety
/// `cm_id` not used afterwards.
pub unsafe extern "C" fn rdma_destroy_ep(cm_id: *mut rdma_cm_id) {
    guard("rdma_destroy_ep", (), || {
        let _ = id::destroy_qp(cm_id);
        if let Err(e) = id::destroy_id(cm_id) {
            set_errno(e);
        }
    })
}

/// `rdma_set_option@RDMACM_1.0`.
///
/// # Safety
/// `val` readable for `len` bytes.
pub unsafe extern "C" fn rdma_set_option(
    cm_id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    guard("rdma_set_option", -1, || {
        // SAFETY: per the contract.
        rc(unsafe { id::set_option(cm_id, level, name, val, len) })
    })
}

/// `rdma_get_src_port@RDMACM_1.0` (network byte order).
pub extern "C" fn rdma_get_src_port(cm_id: *mut rdma_cm_id) -> u16 {
    guard("rdma_get_src_port", 0, || id::port_of(cm_id, false))
}

/// `rdma_get_dst_port@RDMACM_1.0` (network byte order).
pub extern "C" fn rdma_get_dst_port(cm_id: *mut rdma_cm_id) -> u16 {
    guard("rdma_get_dst_port", 0, || id::port_of(cm_id, true))
}

/// `rdma_event_str@RDMACM_1.0`: librdmacm's names.
pub extern "C" fn rdma_event_str(e: rdma_cm_event_type) -> *const c_char {
    let s: &'static [u8] = match e {
        RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr().cast()
}

/// `rdma_get_devices@RDMACM_1.0`: a NULL-terminated array of the device contexts (the one
/// xwarp device), freed with `rdma_free_devices`; NULL with `ENODEV` without a device.
///
/// # Safety
/// `num` NULL or writable.
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", core::ptr::null_mut(), || {
        let ctx = match link::context() {
            Ok(c) => c,
            Err(e) => {
                if !num.is_null() {
                    // SAFETY: writable per the contract.
                    unsafe { *num = 0 };
                }
                return ptr(Err(e));
            }
        };
        // SAFETY: calloc of two pointers; checked.
        let list = unsafe { libc::calloc(2, core::mem::size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if list.is_null() {
            return ptr(Err(libc::ENOMEM));
        }
        // SAFETY: two slots; the second stays NULL.
        unsafe { *list = ctx };
        if !num.is_null() {
            // SAFETY: writable per the contract.
            unsafe { *num = 1 };
        }
        list
    })
}

/// `rdma_free_devices@RDMACM_1.0`.
///
/// # Safety
/// `list` NULL or from `rdma_get_devices`, freed once.
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: per the contract, from calloc.
    unsafe { libc::free(list.cast()) }
}

/// `rdma_migrate_id@RDMACM_1.0`.
pub extern "C" fn rdma_migrate_id(cm_id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> c_int {
    guard("rdma_migrate_id", -1, || rc(id::migrate(cm_id, ch)))
}

/// `rdma_notify@RDMACM_1.0`: 0 (the kernel does nothing for an iWARP id).
pub extern "C" fn rdma_notify(cm_id: *mut rdma_cm_id, _event: c_int) -> c_int {
    guard("rdma_notify", -1, || rc(id::check(cm_id)))
}

/// `rdma_establish@RDMACM_1.2`: 0 (iWARP has no CONNECT_RESPONSE to answer; the kernel
/// does nothing for an iWARP id).
pub extern "C" fn rdma_establish(cm_id: *mut rdma_cm_id) -> c_int {
    guard("rdma_establish", -1, || rc(id::check(cm_id)))
}

/// `rdma_init_qp_attr@RDMACM_1.2`.
///
/// # Safety
/// `attr`, `mask` writable.
pub unsafe extern "C" fn rdma_init_qp_attr(
    cm_id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    // SAFETY: per the contract.
    guard("rdma_init_qp_attr", -1, || {
        rc(unsafe { id::init_qp_attr(cm_id, attr, mask) })
    })
}

fn unsupported(what: &str) -> c_int {
    id::warn_once(&format!("{what} is not supported on xwarp (ENOSYS)"));
    rc(Err(libc::ENOSYS))
}

/// `rdma_join_multicast@RDMACM_1.0`: UD multicast, `ENOSYS`.
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _context: *mut c_void,
) -> c_int {
    unsupported("rdma_join_multicast (UD multicast)")
}

/// `rdma_join_multicast_ex@RDMACM_1.1`: `ENOSYS`.
pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _context: *mut c_void,
) -> c_int {
    unsupported("rdma_join_multicast_ex (UD multicast)")
}

/// `rdma_leave_multicast@RDMACM_1.0`: `ENOSYS`.
pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut libc::sockaddr) -> c_int {
    unsupported("rdma_leave_multicast (UD multicast)")
}

/// `rdma_create_srq@RDMACM_1.0`: `ENOSYS` (create the SRQ with `ibv_create_srq`).
pub extern "C" fn rdma_create_srq(
    _id: *mut rdma_cm_id,
    _pd: *mut ibv_pd,
    _attr: *mut ibv_srq_init_attr,
) -> c_int {
    unsupported("rdma_create_srq")
}

/// `rdma_create_srq_ex@RDMACM_1.0`: `ENOSYS`.
pub extern "C" fn rdma_create_srq_ex(_id: *mut rdma_cm_id, _attr: *mut c_void) -> c_int {
    unsupported("rdma_create_srq_ex")
}

/// `rdma_destroy_srq@RDMACM_1.0`: nothing to destroy (`rdma_create_srq` never succeeds).
pub extern "C" fn rdma_destroy_srq(_id: *mut rdma_cm_id) {}

/// `rdma_set_local_ece@RDMACM_1.3`: ECE is InfiniBand's, `ENOSYS`.
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    unsupported("rdma_set_local_ece (ECE)")
}

/// `rdma_get_remote_ece@RDMACM_1.3`: `ENOSYS`.
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    unsupported("rdma_get_remote_ece (ECE)")
}

/// `rdma_reject_ece@RDMACM_1.3`: `ENOSYS`.
pub extern "C" fn rdma_reject_ece(_id: *mut rdma_cm_id, _data: *const c_void, _len: u8) -> c_int {
    unsupported("rdma_reject_ece (ECE)")
}

// The C names and versions. Each is a global trampoline here that jumps to the Rust
// function: a `.symver` alias takes the binding of the symbol it names, and LLVM makes a
// Rust function local when nothing outside its codegen unit refers to it (rdma_event_str
// and rdma_destroy_srq were exported as local symbols when named directly), so the alias
// is put on a symbol whose binding this assembly sets. The trampolines' own names are not
// exported (`local: *` in libxwarp_ibverbs.map).
core::arch::global_asm!(
    ".text",
    ".globl xwarp_cm_rdma_create_event_channel",
    ".type xwarp_cm_rdma_create_event_channel, @function",
    "xwarp_cm_rdma_create_event_channel:",
    "jmp {a01}@PLT",
    ".size xwarp_cm_rdma_create_event_channel, . - xwarp_cm_rdma_create_event_channel",
    ".symver xwarp_cm_rdma_create_event_channel, rdma_create_event_channel@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_destroy_event_channel",
    ".type xwarp_cm_rdma_destroy_event_channel, @function",
    "xwarp_cm_rdma_destroy_event_channel:",
    "jmp {a02}@PLT",
    ".size xwarp_cm_rdma_destroy_event_channel, . - xwarp_cm_rdma_destroy_event_channel",
    ".symver xwarp_cm_rdma_destroy_event_channel, rdma_destroy_event_channel@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_create_id",
    ".type xwarp_cm_rdma_create_id, @function",
    "xwarp_cm_rdma_create_id:",
    "jmp {a03}@PLT",
    ".size xwarp_cm_rdma_create_id, . - xwarp_cm_rdma_create_id",
    ".symver xwarp_cm_rdma_create_id, rdma_create_id@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_destroy_id",
    ".type xwarp_cm_rdma_destroy_id, @function",
    "xwarp_cm_rdma_destroy_id:",
    "jmp {a04}@PLT",
    ".size xwarp_cm_rdma_destroy_id, . - xwarp_cm_rdma_destroy_id",
    ".symver xwarp_cm_rdma_destroy_id, rdma_destroy_id@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_bind_addr",
    ".type xwarp_cm_rdma_bind_addr, @function",
    "xwarp_cm_rdma_bind_addr:",
    "jmp {a05}@PLT",
    ".size xwarp_cm_rdma_bind_addr, . - xwarp_cm_rdma_bind_addr",
    ".symver xwarp_cm_rdma_bind_addr, rdma_bind_addr@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_resolve_addr",
    ".type xwarp_cm_rdma_resolve_addr, @function",
    "xwarp_cm_rdma_resolve_addr:",
    "jmp {a06}@PLT",
    ".size xwarp_cm_rdma_resolve_addr, . - xwarp_cm_rdma_resolve_addr",
    ".symver xwarp_cm_rdma_resolve_addr, rdma_resolve_addr@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_resolve_route",
    ".type xwarp_cm_rdma_resolve_route, @function",
    "xwarp_cm_rdma_resolve_route:",
    "jmp {a07}@PLT",
    ".size xwarp_cm_rdma_resolve_route, . - xwarp_cm_rdma_resolve_route",
    ".symver xwarp_cm_rdma_resolve_route, rdma_resolve_route@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_listen",
    ".type xwarp_cm_rdma_listen, @function",
    "xwarp_cm_rdma_listen:",
    "jmp {a08}@PLT",
    ".size xwarp_cm_rdma_listen, . - xwarp_cm_rdma_listen",
    ".symver xwarp_cm_rdma_listen, rdma_listen@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_get_request",
    ".type xwarp_cm_rdma_get_request, @function",
    "xwarp_cm_rdma_get_request:",
    "jmp {a09}@PLT",
    ".size xwarp_cm_rdma_get_request, . - xwarp_cm_rdma_get_request",
    ".symver xwarp_cm_rdma_get_request, rdma_get_request@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_connect",
    ".type xwarp_cm_rdma_connect, @function",
    "xwarp_cm_rdma_connect:",
    "jmp {a10}@PLT",
    ".size xwarp_cm_rdma_connect, . - xwarp_cm_rdma_connect",
    ".symver xwarp_cm_rdma_connect, rdma_connect@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_accept",
    ".type xwarp_cm_rdma_accept, @function",
    "xwarp_cm_rdma_accept:",
    "jmp {a11}@PLT",
    ".size xwarp_cm_rdma_accept, . - xwarp_cm_rdma_accept",
    ".symver xwarp_cm_rdma_accept, rdma_accept@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_reject",
    ".type xwarp_cm_rdma_reject, @function",
    "xwarp_cm_rdma_reject:",
    "jmp {a12}@PLT",
    ".size xwarp_cm_rdma_reject, . - xwarp_cm_rdma_reject",
    ".symver xwarp_cm_rdma_reject, rdma_reject@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_disconnect",
    ".type xwarp_cm_rdma_disconnect, @function",
    "xwarp_cm_rdma_disconnect:",
    "jmp {a13}@PLT",
    ".size xwarp_cm_rdma_disconnect, . - xwarp_cm_rdma_disconnect",
    ".symver xwarp_cm_rdma_disconnect, rdma_disconnect@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_get_cm_event",
    ".type xwarp_cm_rdma_get_cm_event, @function",
    "xwarp_cm_rdma_get_cm_event:",
    "jmp {a14}@PLT",
    ".size xwarp_cm_rdma_get_cm_event, . - xwarp_cm_rdma_get_cm_event",
    ".symver xwarp_cm_rdma_get_cm_event, rdma_get_cm_event@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_ack_cm_event",
    ".type xwarp_cm_rdma_ack_cm_event, @function",
    "xwarp_cm_rdma_ack_cm_event:",
    "jmp {a15}@PLT",
    ".size xwarp_cm_rdma_ack_cm_event, . - xwarp_cm_rdma_ack_cm_event",
    ".symver xwarp_cm_rdma_ack_cm_event, rdma_ack_cm_event@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_create_qp",
    ".type xwarp_cm_rdma_create_qp, @function",
    "xwarp_cm_rdma_create_qp:",
    "jmp {a16}@PLT",
    ".size xwarp_cm_rdma_create_qp, . - xwarp_cm_rdma_create_qp",
    ".symver xwarp_cm_rdma_create_qp, rdma_create_qp@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_create_qp_ex",
    ".type xwarp_cm_rdma_create_qp_ex, @function",
    "xwarp_cm_rdma_create_qp_ex:",
    "jmp {a17}@PLT",
    ".size xwarp_cm_rdma_create_qp_ex, . - xwarp_cm_rdma_create_qp_ex",
    ".symver xwarp_cm_rdma_create_qp_ex, rdma_create_qp_ex@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_destroy_qp",
    ".type xwarp_cm_rdma_destroy_qp, @function",
    "xwarp_cm_rdma_destroy_qp:",
    "jmp {a18}@PLT",
    ".size xwarp_cm_rdma_destroy_qp, . - xwarp_cm_rdma_destroy_qp",
    ".symver xwarp_cm_rdma_destroy_qp, rdma_destroy_qp@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_getaddrinfo",
    ".type xwarp_cm_rdma_getaddrinfo, @function",
    "xwarp_cm_rdma_getaddrinfo:",
    "jmp {a19}@PLT",
    ".size xwarp_cm_rdma_getaddrinfo, . - xwarp_cm_rdma_getaddrinfo",
    ".symver xwarp_cm_rdma_getaddrinfo, rdma_getaddrinfo@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_freeaddrinfo",
    ".type xwarp_cm_rdma_freeaddrinfo, @function",
    "xwarp_cm_rdma_freeaddrinfo:",
    "jmp {a20}@PLT",
    ".size xwarp_cm_rdma_freeaddrinfo, . - xwarp_cm_rdma_freeaddrinfo",
    ".symver xwarp_cm_rdma_freeaddrinfo, rdma_freeaddrinfo@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_create_ep",
    ".type xwarp_cm_rdma_create_ep, @function",
    "xwarp_cm_rdma_create_ep:",
    "jmp {a21}@PLT",
    ".size xwarp_cm_rdma_create_ep, . - xwarp_cm_rdma_create_ep",
    ".symver xwarp_cm_rdma_create_ep, rdma_create_ep@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_destroy_ep",
    ".type xwarp_cm_rdma_destroy_ep, @function",
    "xwarp_cm_rdma_destroy_ep:",
    "jmp {a22}@PLT",
    ".size xwarp_cm_rdma_destroy_ep, . - xwarp_cm_rdma_destroy_ep",
    ".symver xwarp_cm_rdma_destroy_ep, rdma_destroy_ep@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_set_option",
    ".type xwarp_cm_rdma_set_option, @function",
    "xwarp_cm_rdma_set_option:",
    "jmp {a23}@PLT",
    ".size xwarp_cm_rdma_set_option, . - xwarp_cm_rdma_set_option",
    ".symver xwarp_cm_rdma_set_option, rdma_set_option@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_get_src_port",
    ".type xwarp_cm_rdma_get_src_port, @function",
    "xwarp_cm_rdma_get_src_port:",
    "jmp {a24}@PLT",
    ".size xwarp_cm_rdma_get_src_port, . - xwarp_cm_rdma_get_src_port",
    ".symver xwarp_cm_rdma_get_src_port, rdma_get_src_port@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_get_dst_port",
    ".type xwarp_cm_rdma_get_dst_port, @function",
    "xwarp_cm_rdma_get_dst_port:",
    "jmp {a25}@PLT",
    ".size xwarp_cm_rdma_get_dst_port, . - xwarp_cm_rdma_get_dst_port",
    ".symver xwarp_cm_rdma_get_dst_port, rdma_get_dst_port@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_event_str",
    ".type xwarp_cm_rdma_event_str, @function",
    "xwarp_cm_rdma_event_str:",
    "jmp {a26}@PLT",
    ".size xwarp_cm_rdma_event_str, . - xwarp_cm_rdma_event_str",
    ".symver xwarp_cm_rdma_event_str, rdma_event_str@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_get_devices",
    ".type xwarp_cm_rdma_get_devices, @function",
    "xwarp_cm_rdma_get_devices:",
    "jmp {a27}@PLT",
    ".size xwarp_cm_rdma_get_devices, . - xwarp_cm_rdma_get_devices",
    ".symver xwarp_cm_rdma_get_devices, rdma_get_devices@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_free_devices",
    ".type xwarp_cm_rdma_free_devices, @function",
    "xwarp_cm_rdma_free_devices:",
    "jmp {a28}@PLT",
    ".size xwarp_cm_rdma_free_devices, . - xwarp_cm_rdma_free_devices",
    ".symver xwarp_cm_rdma_free_devices, rdma_free_devices@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_migrate_id",
    ".type xwarp_cm_rdma_migrate_id, @function",
    "xwarp_cm_rdma_migrate_id:",
    "jmp {a29}@PLT",
    ".size xwarp_cm_rdma_migrate_id, . - xwarp_cm_rdma_migrate_id",
    ".symver xwarp_cm_rdma_migrate_id, rdma_migrate_id@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_notify",
    ".type xwarp_cm_rdma_notify, @function",
    "xwarp_cm_rdma_notify:",
    "jmp {a30}@PLT",
    ".size xwarp_cm_rdma_notify, . - xwarp_cm_rdma_notify",
    ".symver xwarp_cm_rdma_notify, rdma_notify@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_establish",
    ".type xwarp_cm_rdma_establish, @function",
    "xwarp_cm_rdma_establish:",
    "jmp {a31}@PLT",
    ".size xwarp_cm_rdma_establish, . - xwarp_cm_rdma_establish",
    ".symver xwarp_cm_rdma_establish, rdma_establish@@RDMACM_1.2",
    ".globl xwarp_cm_rdma_init_qp_attr",
    ".type xwarp_cm_rdma_init_qp_attr, @function",
    "xwarp_cm_rdma_init_qp_attr:",
    "jmp {a32}@PLT",
    ".size xwarp_cm_rdma_init_qp_attr, . - xwarp_cm_rdma_init_qp_attr",
    ".symver xwarp_cm_rdma_init_qp_attr, rdma_init_qp_attr@@RDMACM_1.2",
    ".globl xwarp_cm_rdma_join_multicast",
    ".type xwarp_cm_rdma_join_multicast, @function",
    "xwarp_cm_rdma_join_multicast:",
    "jmp {a33}@PLT",
    ".size xwarp_cm_rdma_join_multicast, . - xwarp_cm_rdma_join_multicast",
    ".symver xwarp_cm_rdma_join_multicast, rdma_join_multicast@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_join_multicast_ex",
    ".type xwarp_cm_rdma_join_multicast_ex, @function",
    "xwarp_cm_rdma_join_multicast_ex:",
    "jmp {a34}@PLT",
    ".size xwarp_cm_rdma_join_multicast_ex, . - xwarp_cm_rdma_join_multicast_ex",
    ".symver xwarp_cm_rdma_join_multicast_ex, rdma_join_multicast_ex@@RDMACM_1.1",
    ".globl xwarp_cm_rdma_leave_multicast",
    ".type xwarp_cm_rdma_leave_multicast, @function",
    "xwarp_cm_rdma_leave_multicast:",
    "jmp {a35}@PLT",
    ".size xwarp_cm_rdma_leave_multicast, . - xwarp_cm_rdma_leave_multicast",
    ".symver xwarp_cm_rdma_leave_multicast, rdma_leave_multicast@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_create_srq",
    ".type xwarp_cm_rdma_create_srq, @function",
    "xwarp_cm_rdma_create_srq:",
    "jmp {a36}@PLT",
    ".size xwarp_cm_rdma_create_srq, . - xwarp_cm_rdma_create_srq",
    ".symver xwarp_cm_rdma_create_srq, rdma_create_srq@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_create_srq_ex",
    ".type xwarp_cm_rdma_create_srq_ex, @function",
    "xwarp_cm_rdma_create_srq_ex:",
    "jmp {a37}@PLT",
    ".size xwarp_cm_rdma_create_srq_ex, . - xwarp_cm_rdma_create_srq_ex",
    ".symver xwarp_cm_rdma_create_srq_ex, rdma_create_srq_ex@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_destroy_srq",
    ".type xwarp_cm_rdma_destroy_srq, @function",
    "xwarp_cm_rdma_destroy_srq:",
    "jmp {a38}@PLT",
    ".size xwarp_cm_rdma_destroy_srq, . - xwarp_cm_rdma_destroy_srq",
    ".symver xwarp_cm_rdma_destroy_srq, rdma_destroy_srq@@RDMACM_1.0",
    ".globl xwarp_cm_rdma_set_local_ece",
    ".type xwarp_cm_rdma_set_local_ece, @function",
    "xwarp_cm_rdma_set_local_ece:",
    "jmp {a39}@PLT",
    ".size xwarp_cm_rdma_set_local_ece, . - xwarp_cm_rdma_set_local_ece",
    ".symver xwarp_cm_rdma_set_local_ece, rdma_set_local_ece@@RDMACM_1.3",
    ".globl xwarp_cm_rdma_get_remote_ece",
    ".type xwarp_cm_rdma_get_remote_ece, @function",
    "xwarp_cm_rdma_get_remote_ece:",
    "jmp {a40}@PLT",
    ".size xwarp_cm_rdma_get_remote_ece, . - xwarp_cm_rdma_get_remote_ece",
    ".symver xwarp_cm_rdma_get_remote_ece, rdma_get_remote_ece@@RDMACM_1.3",
    ".globl xwarp_cm_rdma_reject_ece",
    ".type xwarp_cm_rdma_reject_ece, @function",
    "xwarp_cm_rdma_reject_ece:",
    "jmp {a41}@PLT",
    ".size xwarp_cm_rdma_reject_ece, . - xwarp_cm_rdma_reject_ece",
    ".symver xwarp_cm_rdma_reject_ece, rdma_reject_ece@@RDMACM_1.3",
    a01 = sym rdma_create_event_channel,
    a02 = sym rdma_destroy_event_channel,
    a03 = sym rdma_create_id,
    a04 = sym rdma_destroy_id,
    a05 = sym rdma_bind_addr,
    a06 = sym rdma_resolve_addr,
    a07 = sym rdma_resolve_route,
    a08 = sym rdma_listen,
    a09 = sym rdma_get_request,
    a10 = sym rdma_connect,
    a11 = sym rdma_accept,
    a12 = sym rdma_reject,
    a13 = sym rdma_disconnect,
    a14 = sym rdma_get_cm_event,
    a15 = sym rdma_ack_cm_event,
    a16 = sym rdma_create_qp,
    a17 = sym rdma_create_qp_ex,
    a18 = sym rdma_destroy_qp,
    a19 = sym rdma_getaddrinfo,
    a20 = sym rdma_freeaddrinfo,
    a21 = sym rdma_create_ep,
    a22 = sym rdma_destroy_ep,
    a23 = sym rdma_set_option,
    a24 = sym rdma_get_src_port,
    a25 = sym rdma_get_dst_port,
    a26 = sym rdma_event_str,
    a27 = sym rdma_get_devices,
    a28 = sym rdma_free_devices,
    a29 = sym rdma_migrate_id,
    a30 = sym rdma_notify,
    a31 = sym rdma_establish,
    a32 = sym rdma_init_qp_attr,
    a33 = sym rdma_join_multicast,
    a34 = sym rdma_join_multicast_ex,
    a35 = sym rdma_leave_multicast,
    a36 = sym rdma_create_srq,
    a37 = sym rdma_create_srq_ex,
    a38 = sym rdma_destroy_srq,
    a39 = sym rdma_set_local_ece,
    a40 = sym rdma_get_remote_ece,
    a41 = sym rdma_reject_ece,
);
