//! What the CM takes from the rest of the library: the one device context (opened once,
//! as librdmacm opens every device at start-up), the engine behind it ([`XwContext::verbs`],
//! the process's engine), the engine's address, the QP behind an `ibv_qp`, and the verbs
//! objects `rdma_create_qp` makes (librdmacm calls the same libibverbs functions; here the
//! crate's own constructors, never the exported symbols: a `.symver` needs its function in
//! the same object file).

use core::ffi::c_int;
use std::sync::OnceLock;

use xwarp_verbs::{Device, QueuePair};

use super::addr::EngineAddr;
use crate::abi::*;
use crate::config::DeviceConfig;
use crate::device::{self, XwContext};

struct Ctx(*mut ibv_context);
// SAFETY: the context is process-wide and never closed; the library's objects are
// thread-safe.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

static CONTEXT: OnceLock<Result<Ctx, c_int>> = OnceLock::new();

/// The xwarp device's context (`id->verbs` of every bound or resolved id): the device of
/// `XWARP_IFACE`, opened once. `ENODEV` when there is none (one line on stderr says why).
pub(crate) fn context() -> Result<*mut ibv_context, c_int> {
    let r = CONTEXT.get_or_init(|| {
        let devs = match DeviceConfig::from_vars(|k| std::env::var(k).ok())
            .and_then(|cfg| device::discover(&cfg))
        {
            Ok(d) => d,
            Err(why) => {
                crate::ffi::warn_line(&format!("{why}; rdma_cm has no RDMA device"));
                return Err(libc::ENODEV);
            }
        };
        let Some(d) = devs.first() else {
            return Err(libc::ENODEV);
        };
        // SAFETY: a device of the discovery list.
        let ctx = unsafe { crate::exports::open_device((&d.dev as *const ibv_device).cast_mut()) };
        if ctx.is_null() {
            Err(libc::ENODEV)
        } else {
            Ok(Ctx(ctx))
        }
    });
    match r {
        Ok(c) => Ok(c.0),
        Err(e) => Err(*e),
    }
}

static ADDR: OnceLock<Result<EngineAddr, String>> = OnceLock::new();

/// The engine's address (`XWARP_ADDR`, `XWARP_GATEWAY`); `ENODEV` with one line on stderr
/// when unset or bad.
pub(crate) fn engine_addr() -> Result<EngineAddr, c_int> {
    let r = ADDR.get_or_init(|| {
        let r = EngineAddr::from_vars(|k| std::env::var(k).ok());
        if let Err(why) = &r {
            crate::ffi::warn_line(&format!("{why}; rdma_cm has no address to use"));
        }
        r
    });
    r.clone().map_err(|_| libc::ENODEV)
}

/// The engine behind `ctx` (started on first use).
pub(crate) fn device(ctx: *mut ibv_context) -> Result<Device, c_int> {
    XwContext::from_raw(ctx)
        .ok_or(libc::EINVAL)?
        .verbs()
        .cloned()
}

/// The QP behind one of the library's `ibv_qp`s; `None` for any other pointer.
///
/// # Safety
/// The returned reference is valid until the program destroys the QP.
pub(crate) unsafe fn qp_of<'a>(qp: *mut ibv_qp) -> Option<&'a QueuePair> {
    crate::qp::from_raw(qp).map(|q| q.qp())
}

/// Record the verbs state the program sees in `qp->state` (RTS once connected, ERR once
/// the connection ended), as the kernel's CM moves an iWARP QP.
pub(crate) fn set_qp_state(qp: *mut ibv_qp, state: u32) {
    if let Some(q) = crate::qp::from_raw(qp) {
        q.set_state(state);
    }
}

/// `ibv_alloc_pd`.
pub(crate) fn alloc_pd(ctx: *mut ibv_context) -> Result<*mut ibv_pd, c_int> {
    crate::pd::create(ctx)
}

/// `ibv_create_comp_channel`.
pub(crate) fn create_comp_channel(ctx: *mut ibv_context) -> Result<*mut ibv_comp_channel, c_int> {
    crate::cq::create_channel(ctx)
}

/// `ibv_create_cq` with `cqe` entries on `channel`; `cq_context` is what
/// `ibv_get_cq_event` returns (the id: `rdma_get_*_comp` assert it).
pub(crate) fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut core::ffi::c_void,
    channel: *mut ibv_comp_channel,
) -> Result<*mut ibv_cq, c_int> {
    crate::cq::create(ctx, cqe, cq_context, channel, 0)
}

/// `ibv_create_qp` (writes the granted capacities back into `attr`).
///
/// # Safety
/// `attr` the program's readable and writable attributes.
pub(crate) unsafe fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<*mut ibv_qp, c_int> {
    // SAFETY: per the contract.
    unsafe { crate::qp::create(pd, attr) }
}

/// `ibv_destroy_qp` (0 or an errno).
pub(crate) fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    crate::qp::destroy(qp)
}

/// `ibv_destroy_cq` (0 or an errno).
pub(crate) fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    crate::cq::destroy(cq)
}

/// `ibv_destroy_comp_channel` (0 or an errno).
pub(crate) fn destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    crate::cq::destroy_channel(ch)
}

/// Move a new QP to INIT with the access flags and port of `rdma_init_qp_attr`, as
/// librdmacm's `rdma_create_qp` does (`ucma_init_conn_qp`): receives may be posted before
/// the connection.
pub(crate) fn init_qp(qp: *mut ibv_qp, port: u8) -> Result<(), c_int> {
    let x = crate::qp::from_raw(qp).ok_or(libc::EINVAL)?;
    // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
    let mut a: ibv_qp_attr = unsafe { core::mem::zeroed() };
    a.qp_state = IBV_QPS_INIT;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    a.port_num = port;
    let mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT;
    match crate::qp::modify(x, &a, mask as c_int) {
        0 => Ok(()),
        e => Err(e),
    }
}
