//! Hooks for the crate's own tests (not part of the C ABI): open a context whose objects
//! live on a given `xwarp_verbs` engine instead of the process's AF_XDP engine, so a
//! test can connect two contexts over an in-process virtual wire and move data through
//! the exported functions and the ops table.

use crate::abi::*;
use crate::device::XwContext;

/// `ibv_open_device(dev)`, with the context's objects on `device`'s engine. NULL if
/// `dev` is not an xwarp device.
///
/// # Safety
/// As `ibv_open_device`.
pub unsafe fn open_on(dev: *mut ibv_device, device: xwarp_verbs::Device) -> *mut ibv_context {
    // SAFETY: per the contract.
    let ctx = unsafe { crate::exports::open_device(dev) };
    if let Some(c) = XwContext::from_raw(ctx) {
        c.set_verbs(device);
    }
    ctx
}

/// The `xwarp_verbs::QueuePair` behind a QP pointer (to connect it in a test).
pub fn queue_pair(qp: *mut ibv_qp) -> Option<&'static xwarp_verbs::QueuePair> {
    crate::qp::from_raw(qp).map(|q| q.qp())
}

/// Record the verbs state of a QP as the connection manager would (`IBV_QPS_RTS` once
/// connected).
pub fn set_qp_state(qp: *mut ibv_qp, state: u32) {
    if let Some(q) = crate::qp::from_raw(qp) {
        q.set_state(state);
    }
}

/// Queue `IBV_EVENT_QP_FATAL` for a QP as the connection manager does on a connection
/// error ([`crate::qp::XQp::report_fatal`]).
pub fn report_qp_fatal(qp: *mut ibv_qp) {
    if let Some(q) = crate::qp::from_raw(qp) {
        q.report_fatal();
    }
}
