//! The `ibv_context_ops` table every context gets: the slots the header-inline calls
//! jump through (`ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`). Everything else stays NULL: the compat slots are for
//! libibverbs 1.0 binaries, and the memory-window slots being NULL makes the inline
//! `ibv_alloc_mw`/`ibv_bind_mw`/`ibv_dealloc_mw` fail with `EOPNOTSUPP`/`ENOSYS`.

use crate::abi::*;

/// The table (see the module docs).
pub(crate) fn table() -> ibv_context_ops {
    // SAFETY: every field is an Option of a function pointer: all-zero is all None.
    let mut ops: ibv_context_ops = unsafe { core::mem::zeroed() };
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(crate::qp::post_send);
    ops.post_recv = Some(crate::qp::post_recv);
    ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    ops
}
