//! The rest of the verbs the target programs import or the issue names: async events
//! (`ibv_get_async_event`, `ibv_ack_async_event`), `ibv_fork_init`,
//! `ibv_is_fork_initialized`, `ibv_query_pkey`, `_ibv_query_gid_ex`,
//! `ibv_wc_status_str`, and the unsupported UD/multicast/extended verbs
//! (`ibv_create_ah`, `ibv_create_ah_from_wc`, `ibv_destroy_ah`, `ibv_attach_mcast`,
//! `ibv_detach_mcast`, `ibv_qp_to_qp_ex`), which fail with `EOPNOTSUPP` and one warning
//! line naming the verb.
//!
//! Async events: each context's `async_fd` is a semaphore eventfd counting the events
//! queued by `XwContext::post_async_event` (blocking unless the program sets
//! `O_NONBLOCK`, poll/epoll-able). The library queues `IBV_EVENT_QP_FATAL` when a QP's
//! completions show the engine moved it to ERROR (an error status other than a flush),
//! and ibv-cm queues it for connection errors; the port watcher of each context
//! (`device.rs`) queues `IBV_EVENT_PORT_ERR`/`IBV_EVENT_PORT_ACTIVE` when the interface's
//! link goes down/up; CQ overflow cannot happen (the engine's CQs grow).

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use crate::abi::*;
use crate::device::XwContext;
use crate::ffi::{guard, set_errno, unsupported, wait_readable_cancellable, Attempt};

/// One non-blocking attempt of `ibv_get_async_event` (under the panic guard).
///
/// # Safety
/// As [`ibv_get_async_event`].
unsafe fn get_async_event_attempt(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> Attempt<c_int> {
    let Some(c) = XwContext::from_raw(ctx) else {
        set_errno(libc::EINVAL);
        return Attempt::Done(-1);
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return Attempt::Done(-1);
    }
    // The QP an event names counts it as handed out while the queue is locked, so its
    // destroy either dropped it from the queue or waits for its ack.
    match c.take_async_event(crate::qp::note_async_event_handed_out) {
        Some(ev) => {
            c.async_unacked.fetch_add(1, Ordering::SeqCst);
            // SAFETY: writable per the contract.
            unsafe { event.write(ev) };
            Attempt::Done(0)
        }
        None if crate::cq::is_nonblocking(c.vctx.context.async_fd) => {
            set_errno(libc::EAGAIN);
            Attempt::Done(-1)
        }
        None => Attempt::Wait(c.vctx.context.async_fd),
    }
}

/// `ibv_get_async_event@IBVERBS_1.1`: the next async event of `ctx` (waits unless the
/// program set `O_NONBLOCK` on `async_fd`); 0, or -1 with `errno` (`EAGAIN`, `EINVAL`).
///
/// `extern "C-unwind"` and blocking outside the panic guard, so that `pthread_cancel` of
/// a thread waiting here unwinds it (see `ffi::wait_readable_cancellable`).
///
/// # Safety
/// `event` writable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C-unwind" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    loop {
        // SAFETY: per the contract.
        let step = guard("ibv_get_async_event", Attempt::Done(-1), || unsafe {
            get_async_event_attempt(ctx, event)
        });
        match step {
            Attempt::Done(r) => return r,
            // Only integers are alive in this frame: a cancellation unwinds through it.
            Attempt::Wait(fd) => {
                wait_readable_cancellable(fd, -1);
            }
        }
    }
}

/// `ibv_ack_async_event@IBVERBS_1.1`: acknowledge an event `ibv_get_async_event` gave.
///
/// # Safety
/// `event` NULL or readable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard("ibv_ack_async_event", (), || {
        if event.is_null() {
            return;
        }
        // SAFETY: readable per the contract; the element is a pointer or an int, read
        // as the event type says.
        let (ty, el) = unsafe { ((*event).event_type, (*event).element) };
        // SAFETY: as above (plain pointer reads from the union).
        let ctx = unsafe {
            match ty {
                IBV_EVENT_CQ_ERR => crate::cq::from_raw(el.cq).map(|c| c.context()),
                IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => None,
                IBV_EVENT_DEVICE_FATAL
                | IBV_EVENT_PORT_ACTIVE
                | IBV_EVENT_PORT_ERR
                | IBV_EVENT_LID_CHANGE
                | IBV_EVENT_PKEY_CHANGE
                | IBV_EVENT_SM_CHANGE
                | IBV_EVENT_CLIENT_REREGISTER
                | IBV_EVENT_GID_CHANGE => None,
                _ => crate::qp::from_raw(el.qp).map(|q| q.context()),
            }
        };
        // SAFETY: readable per the contract.
        crate::qp::note_async_event_acked(unsafe { &*event });
        if let Some(c) = ctx {
            let _ = c
                .async_unacked
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
    })
}

/// `ibv_fork_init@IBVERBS_1.1`: 0. The engine reaches registered memory from its own
/// thread in the parent, without pinned pages, so nothing needs protecting across
/// `fork` (the child's copy-on-write pages are the child's).
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_fork_init() -> c_int {
    guard("ibv_fork_init", libc::EIO, || 0)
}

/// `IBV_FORK_UNNEEDED` of `enum ibv_fork_status`.
pub const IBV_FORK_UNNEEDED: c_int = 2;

/// `ibv_is_fork_initialized@IBVERBS_1.13`: `IBV_FORK_UNNEEDED` (see [`ibv_fork_init`]).
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    guard("ibv_is_fork_initialized", IBV_FORK_UNNEEDED, || {
        IBV_FORK_UNNEEDED
    })
}

/// `ibv_query_pkey@IBVERBS_1.1`: P_Key 0 of port 1 is the default 0xffff (as siw
/// reports); 0, or -1 with `EINVAL` for anything else.
///
/// # Safety
/// `pkey` writable.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard("ibv_query_pkey", -1, || {
        if XwContext::from_raw(ctx).is_none() || port != 1 || index != 0 || pkey.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: writable per the contract.
        unsafe { pkey.write(0xffff) };
        0
    })
}

/// `_ibv_query_gid_ex@IBVERBS_1.11` (the inline `ibv_query_gid_ex`, perftest): GID 0 of
/// port 1 with its type (`IBV_GID_TYPE_IB`, as the kernel types iWARP GIDs) and the
/// interface's ifindex; 0, `EINVAL` (bad context, port, flags or entry size), `ENODATA`
/// (index other than 0), `ENODEV` (the interface is gone).
///
/// # Safety
/// `entry` writable for `entry_size` bytes.
#[inline(never)] // keeps a global definition for the .symver below
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard("ibv_query_gid_ex", libc::EIO, || {
        let Some(c) = XwContext::from_raw(ctx) else {
            return libc::EINVAL;
        };
        if port != 1
            || flags != 0
            || entry.is_null()
            || entry_size < core::mem::size_of::<ibv_gid_entry>()
        {
            return libc::EINVAL;
        }
        if gid_index != 0 {
            return libc::ENODATA;
        }
        let Ok(facts) = c.device.facts() else {
            return libc::ENODEV;
        };
        // SAFETY: writable per the contract (entry_size covers the struct).
        unsafe {
            entry.write(ibv_gid_entry {
                gid: crate::attr::gid0(c.device.mac),
                gid_index: 0,
                port_num: 1,
                gid_type: IBV_GID_TYPE_IB,
                ndev_ifindex: facts.ifindex,
            })
        };
        0
    })
}

/// `ibv_wc_status_str@IBVERBS_1.1`: libibverbs' text of a completion status.
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_wc_status_str(status: c_uint) -> *const c_char {
    guard("ibv_wc_status_str", c"unknown".as_ptr(), || {
        wc_status_str(status)
    })
}

/// The text of [`ibv_wc_status_str`].
fn wc_status_str(status: c_uint) -> *const c_char {
    let s: &'static core::ffi::CStr = match status {
        IBV_WC_SUCCESS => c"success",
        IBV_WC_LOC_LEN_ERR => c"local length error",
        IBV_WC_LOC_QP_OP_ERR => c"local QP operation error",
        IBV_WC_LOC_EEC_OP_ERR => c"local EE context operation error",
        IBV_WC_LOC_PROT_ERR => c"local protection error",
        IBV_WC_WR_FLUSH_ERR => c"Work Request Flushed Error",
        IBV_WC_MW_BIND_ERR => c"memory management operation error",
        IBV_WC_BAD_RESP_ERR => c"bad response error",
        IBV_WC_LOC_ACCESS_ERR => c"local access error",
        IBV_WC_REM_INV_REQ_ERR => c"remote invalid request error",
        IBV_WC_REM_ACCESS_ERR => c"remote access error",
        IBV_WC_REM_OP_ERR => c"remote operation error",
        IBV_WC_RETRY_EXC_ERR => c"transport retry counter exceeded",
        IBV_WC_RNR_RETRY_EXC_ERR => c"RNR retry counter exceeded",
        IBV_WC_LOC_RDD_VIOL_ERR => c"local RDD violation error",
        IBV_WC_REM_INV_RD_REQ_ERR => c"remote invalid RD request",
        IBV_WC_REM_ABORT_ERR => c"aborted error",
        IBV_WC_INV_EECN_ERR => c"invalid EE context number",
        IBV_WC_INV_EEC_STATE_ERR => c"invalid EE context state",
        IBV_WC_FATAL_ERR => c"fatal error",
        IBV_WC_RESP_TIMEOUT_ERR => c"response timeout error",
        IBV_WC_GENERAL_ERR => c"general error",
        IBV_WC_TM_ERR => c"TM error",
        IBV_WC_TM_RNDV_INCOMPLETE => c"TM software rendezvous",
        _ => c"unknown",
    };
    s.as_ptr()
}

const UD: &str = "no UD queue pairs, address handles or multicast on iWARP";

/// `ibv_create_ah@IBVERBS_1.1`: NULL with `EOPNOTSUPP` (UD).
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_create_ah(_pd: *mut ibv_pd, _attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard("ibv_create_ah", core::ptr::null_mut(), || {
        unsupported("ibv_create_ah", UD);
        set_errno(libc::EOPNOTSUPP);
        core::ptr::null_mut()
    })
}

/// `ibv_create_ah_from_wc@IBVERBS_1.1`: NULL with `EOPNOTSUPP` (UD).
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_create_ah_from_wc(
    _pd: *mut ibv_pd,
    _wc: *mut ibv_wc,
    _grh: *mut c_void,
    _port: u8,
) -> *mut ibv_ah {
    guard("ibv_create_ah_from_wc", core::ptr::null_mut(), || {
        unsupported("ibv_create_ah_from_wc", UD);
        set_errno(libc::EOPNOTSUPP);
        core::ptr::null_mut()
    })
}

/// `ibv_destroy_ah@IBVERBS_1.1`: `EOPNOTSUPP` (no AH can exist).
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_destroy_ah(_ah: *mut ibv_ah) -> c_int {
    guard("ibv_destroy_ah", libc::EIO, || {
        unsupported("ibv_destroy_ah", UD);
        libc::EOPNOTSUPP
    })
}

/// `ibv_attach_mcast@IBVERBS_1.1`: `EOPNOTSUPP` (UD multicast).
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    guard("ibv_attach_mcast", libc::EIO, || {
        unsupported("ibv_attach_mcast", UD);
        libc::EOPNOTSUPP
    })
}

/// `ibv_detach_mcast@IBVERBS_1.1`: `EOPNOTSUPP` (UD multicast).
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    guard("ibv_detach_mcast", libc::EIO, || {
        unsupported("ibv_detach_mcast", UD);
        libc::EOPNOTSUPP
    })
}

/// `ibv_qp_to_qp_ex@IBVERBS_1.6`: NULL, as libibverbs answers for a QP not created by
/// `ibv_create_qp_ex` with send ops (the `ibv_wr_*` API is not implemented), with
/// `EOPNOTSUPP`.
#[inline(never)] // keeps a global definition for the .symver below
pub extern "C" fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut c_void {
    guard("ibv_qp_to_qp_ex", core::ptr::null_mut(), || {
        unsupported(
            "ibv_qp_to_qp_ex",
            "the ibv_wr_* post-send API is not implemented",
        );
        set_errno(libc::EOPNOTSUPP);
        core::ptr::null_mut()
    })
}

core::arch::global_asm!(
    ".symver {get_async}, ibv_get_async_event@@IBVERBS_1.1",
    ".symver {ack_async}, ibv_ack_async_event@@IBVERBS_1.1",
    ".symver {fork_init}, ibv_fork_init@@IBVERBS_1.1",
    ".symver {is_fork}, ibv_is_fork_initialized@@IBVERBS_1.13",
    ".symver {pkey}, ibv_query_pkey@@IBVERBS_1.1",
    ".symver {gid_ex}, _ibv_query_gid_ex@@IBVERBS_1.11",
    ".symver {status_str}, ibv_wc_status_str@@IBVERBS_1.1",
    ".symver {create_ah}, ibv_create_ah@@IBVERBS_1.1",
    ".symver {ah_from_wc}, ibv_create_ah_from_wc@@IBVERBS_1.1",
    ".symver {destroy_ah}, ibv_destroy_ah@@IBVERBS_1.1",
    ".symver {attach}, ibv_attach_mcast@@IBVERBS_1.1",
    ".symver {detach}, ibv_detach_mcast@@IBVERBS_1.1",
    ".symver {to_ex}, ibv_qp_to_qp_ex@@IBVERBS_1.6",
    get_async = sym ibv_get_async_event,
    ack_async = sym ibv_ack_async_event,
    fork_init = sym ibv_fork_init,
    is_fork = sym ibv_is_fork_initialized,
    pkey = sym ibv_query_pkey,
    gid_ex = sym _ibv_query_gid_ex,
    status_str = sym ibv_wc_status_str,
    create_ah = sym ibv_create_ah,
    ah_from_wc = sym ibv_create_ah_from_wc,
    destroy_ah = sym ibv_destroy_ah,
    attach = sym ibv_attach_mcast,
    detach = sym ibv_detach_mcast,
    to_ex = sym ibv_qp_to_qp_ex,
);
