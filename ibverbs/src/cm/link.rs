//! What the CM takes from the rest of the library: the one device context (opened once,
//! as librdmacm opens every device at start-up), the engine behind it, the engine's
//! address, the QP behind an `ibv_qp`, and the verbs calls `rdma_create_qp` makes
//! (librdmacm calls the same libibverbs functions).

use core::ffi::c_int;
use std::sync::OnceLock;

use xwarp_verbs::{Device, QueuePair};

use super::addr::EngineAddr;
use crate::abi::*;

struct Ctx(*mut ibv_context);
// SAFETY: the context is process-wide and never closed; the library's objects are
// thread-safe.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

static CONTEXT: OnceLock<Result<Ctx, c_int>> = OnceLock::new();

/// The xwarp device's context (`id->verbs` of every bound or resolved id): the first device
/// of `ibv_get_device_list`, opened once. `ENODEV` when no device is listed (the list
/// printed why).
pub(crate) fn context() -> Result<*mut ibv_context, c_int> {
    let r = CONTEXT.get_or_init(|| Err(libc::ENODEV));
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
            eprintln!("xwarp-ibverbs: {why}; rdma_cm has no address to use");
        }
        r
    });
    r.clone().map_err(|_| libc::ENODEV)
}

/// The engine behind `ctx` (started on first use).
pub(crate) fn device(ctx: *mut ibv_context) -> Result<Device, c_int> {
    let _ = ctx;
    Err(libc::ENOSYS)
}

/// The QP behind one of the library's `ibv_qp`s; `None` for any other pointer.
///
/// # Safety
/// The returned reference is valid until the program destroys the QP.
pub(crate) unsafe fn qp_of<'a>(qp: *mut ibv_qp) -> Option<&'a QueuePair> {
    let _ = qp;
    None
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// `ctx` is the library's context.
pub(crate) unsafe fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    let _ = ctx;
    core::ptr::null_mut()
}

/// `ibv_create_comp_channel`.
///
/// # Safety
/// As [`alloc_pd`].
pub(crate) unsafe fn create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    let _ = ctx;
    core::ptr::null_mut()
}

/// `ibv_create_cq` with `cqe` entries on `channel`.
///
/// # Safety
/// As [`alloc_pd`]; `channel` NULL or the context's.
pub(crate) unsafe fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    channel: *mut ibv_comp_channel,
) -> *mut ibv_cq {
    let _ = (ctx, cqe, channel);
    core::ptr::null_mut()
}

/// `ibv_create_qp` (writes the granted capacities back into `attr`).
///
/// # Safety
/// `pd` the library's; `attr` valid.
pub(crate) unsafe fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    let _ = (pd, attr);
    core::ptr::null_mut()
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// `qp` the library's, not used afterwards.
pub(crate) unsafe fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    let _ = qp;
    libc::ENOSYS
}

/// `ibv_destroy_cq`.
///
/// # Safety
/// As [`destroy_qp`].
pub(crate) unsafe fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    let _ = cq;
    libc::ENOSYS
}

/// `ibv_destroy_comp_channel`.
///
/// # Safety
/// As [`destroy_qp`].
pub(crate) unsafe fn destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    let _ = ch;
    libc::ENOSYS
}
