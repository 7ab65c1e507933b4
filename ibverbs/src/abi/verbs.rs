//! The objects of `<infiniband/verbs.h>` the library hands out and the program passes back
//! (device, context and its ops tables, PD, MR, CQ, completion channel, SRQ, QP, AH), and
//! the work requests and completions that move through the ops tables.
//!
//! Memory layout rules the implementation must keep:
//! - An [`ibv_context`] is always the last field of a [`verbs_context`]; the library allocates
//!   the `verbs_context` (zeroed, then filled) and hands out `&vctx.context`. It sets
//!   `context.abi_compat` to [`VERBS_ABI_IS_EXTENDED`](super::VERBS_ABI_IS_EXTENDED) and `vctx.sz` to
//!   `size_of::<verbs_context>()`: the header-inline `verbs_get_ctx()` subtracts
//!   `offset_of!(verbs_context, context)` from the `ibv_context` pointer and checks `sz` before
//!   it calls any extended slot. A NULL slot makes the inline wrappers fall back or fail with
//!   EOPNOTSUPP, so unsupported extended verbs are left NULL.
//! - Every object (`ibv_pd`, `ibv_cq`, `ibv_qp`, ...) is the first field of the library's own
//!   `#[repr(C)]` allocation, so a pointer the program passes back converts to the full object.

use super::verbs_base::{
    _compat_ibv_port_attr, ibv_device_attr, ibv_mw, ibv_mw_bind, ibv_node_type, ibv_port_attr,
    ibv_sge, ibv_transport_type, ibv_wq, IBV_SYSFS_NAME_MAX, IBV_SYSFS_PATH_MAX,
};
use core::ffi::{c_char, c_int, c_uint, c_void};
use libc::{pthread_cond_t, pthread_mutex_t};

/// `struct _ibv_device_ops`: two unused slots at the start of [`ibv_device`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct _ibv_device_ops {
    /// Legacy `alloc_context`; never called by libibverbs 1.1 programs (NULL).
    pub _dummy1: Option<unsafe extern "C" fn(*mut ibv_device, c_int) -> *mut ibv_context>,
    /// Legacy `free_context` (NULL).
    pub _dummy2: Option<unsafe extern "C" fn(*mut ibv_context)>,
}

/// `struct ibv_device`, as returned in `ibv_get_device_list()`'s array. Programs read
/// `node_type`, `transport_type` and `name` directly. rdma-core's private `verbs_device`
/// (`driver.h`, not installed) starts with this struct and continues with a driver-ops
/// pointer that provider libraries (`libmlx5`, `libefa`) compare with their own; the library's
/// device object therefore starts with an `ibv_device` followed by a NULL pointer.
#[repr(C)]
pub struct ibv_device {
    /// Unused ops.
    pub _ops: _ibv_device_ops,
    /// [`IBV_NODE_RNIC`](super::IBV_NODE_RNIC) for xwarp.
    pub node_type: ibv_node_type,
    /// [`IBV_TRANSPORT_IWARP`](super::IBV_TRANSPORT_IWARP) for xwarp.
    pub transport_type: ibv_transport_type,
    /// NUL-terminated device name (`ibv_get_device_name`).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// NUL-terminated uverbs char device name (`uverbsN`).
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// NUL-terminated sysfs path of the uverbs device.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// NUL-terminated sysfs path of the IB device.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// An unused (compat) slot of [`ibv_context_ops`]: always NULL.
pub type compat_slot = Option<unsafe extern "C" fn() -> *mut c_void>;

/// `ibv_context_ops.poll_cq`.
pub type poll_cq_fn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ibv_context_ops.req_notify_cq`.
pub type req_notify_cq_fn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ibv_context_ops.post_send`.
pub type post_send_fn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ibv_context_ops.post_recv`.
pub type post_recv_fn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ibv_context_ops.post_srq_recv`.
pub type post_srq_recv_fn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops`: the table the header-inline calls dispatch through. Only
/// `poll_cq`, `req_notify_cq`, `post_send`, `post_recv`, `post_srq_recv` and the memory
/// window slots (`alloc_mw`, `dealloc_mw`, `bind_mw`) are read by inline code; the
/// `_compat_*` slots are for libibverbs 1.0 binaries and stay NULL.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_context_ops {
    /// Compat `query_device` (NULL).
    pub _compat_query_device:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int>,
    /// Compat `query_port` (NULL).
    pub _compat_query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int>,
    /// Compat slot (NULL).
    pub _compat_alloc_pd: compat_slot,
    /// Compat slot (NULL).
    pub _compat_dealloc_pd: compat_slot,
    /// Compat slot (NULL).
    pub _compat_reg_mr: compat_slot,
    /// Compat slot (NULL).
    pub _compat_rereg_mr: compat_slot,
    /// Compat slot (NULL).
    pub _compat_dereg_mr: compat_slot,
    /// `ibv_alloc_mw` (inline): NULL makes it fail with EOPNOTSUPP.
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, c_uint) -> *mut ibv_mw>,
    /// `ibv_bind_mw` (inline).
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    /// `ibv_dealloc_mw` (inline).
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    /// Compat slot (NULL).
    pub _compat_create_cq: compat_slot,
    /// `ibv_poll_cq` (inline).
    pub poll_cq: Option<poll_cq_fn>,
    /// `ibv_req_notify_cq` (inline).
    pub req_notify_cq: Option<req_notify_cq_fn>,
    /// Compat slot (NULL).
    pub _compat_cq_event: compat_slot,
    /// Compat slot (NULL).
    pub _compat_resize_cq: compat_slot,
    /// Compat slot (NULL).
    pub _compat_destroy_cq: compat_slot,
    /// Compat slot (NULL).
    pub _compat_create_srq: compat_slot,
    /// Compat slot (NULL).
    pub _compat_modify_srq: compat_slot,
    /// Compat slot (NULL).
    pub _compat_query_srq: compat_slot,
    /// Compat slot (NULL).
    pub _compat_destroy_srq: compat_slot,
    /// `ibv_post_srq_recv` (inline).
    pub post_srq_recv: Option<post_srq_recv_fn>,
    /// Compat slot (NULL).
    pub _compat_create_qp: compat_slot,
    /// Compat slot (NULL).
    pub _compat_query_qp: compat_slot,
    /// Compat slot (NULL).
    pub _compat_modify_qp: compat_slot,
    /// Compat slot (NULL).
    pub _compat_destroy_qp: compat_slot,
    /// `ibv_post_send` (inline).
    pub post_send: Option<post_send_fn>,
    /// `ibv_post_recv` (inline).
    pub post_recv: Option<post_recv_fn>,
    /// Compat slot (NULL).
    pub _compat_create_ah: compat_slot,
    /// Compat slot (NULL).
    pub _compat_destroy_ah: compat_slot,
    /// Compat slot (NULL).
    pub _compat_attach_mcast: compat_slot,
    /// Compat slot (NULL).
    pub _compat_detach_mcast: compat_slot,
    /// Compat slot (NULL).
    pub _compat_async_event: compat_slot,
}

/// `struct ibv_context`: an open device. Always allocated as the tail of a
/// [`verbs_context`] (see the module docs).
#[repr(C)]
pub struct ibv_context {
    /// The device it was opened from.
    pub device: *mut ibv_device,
    /// The ops table the inline calls use.
    pub ops: ibv_context_ops,
    /// The command fd (for xwarp: an fd that is only ever closed, e.g. on /dev/null).
    pub cmd_fd: c_int,
    /// The fd `ibv_get_async_event` waits on (poll/epoll-able).
    pub async_fd: c_int,
    /// Number of completion vectors (>= 1).
    pub num_comp_vectors: c_int,
    /// Protects the context (libibverbs initialises it; so must the library).
    pub mutex: pthread_mutex_t,
    /// [`VERBS_ABI_IS_EXTENDED`](super::VERBS_ABI_IS_EXTENDED).
    pub abi_compat: *mut c_void,
}

/// An extended slot of [`verbs_context`] that xwarp leaves NULL (the inline wrappers then
/// fail with EOPNOTSUPP/ENOSYS or fall back to the 1.1 call).
pub type ex_slot = Option<unsafe extern "C" fn() -> c_int>;

/// `verbs_context.query_port`: `___ibv_query_port` (the inline behind `ibv_query_port`)
/// calls it with `sizeof(struct ibv_port_attr)` when it is set.
pub type query_port_fn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
/// `verbs_context.query_device_ex` (`ibv_query_device_ex`, inline; falls back to
/// `ibv_query_device` on EOPNOTSUPP/ENOSYS or when NULL).
pub type query_device_ex_fn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut c_void, usize) -> c_int;

/// `struct verbs_context`: the extended context. It sits in memory BEFORE the
/// [`ibv_context`] handed to the program (its last field), and `sz` must be immediately before
/// that. Slots the program reaches through inline calls in rdma-core 44: `query_port`
/// (`ibv_query_port`), `query_device_ex`, `create_cq_ex`, `create_qp_ex`, `create_srq_ex`,
/// `open_qp`, `get_srq_num`, `open_xrcd`/`close_xrcd`, `alloc_td`, `modify_cq`, ... The slots
/// listed in order from the header; the typed ones are those xwarp will fill.
#[repr(C)]
pub struct verbs_context {
    /// `ibv_query_port` (inline `___ibv_query_port`).
    pub query_port: Option<query_port_fn>,
    /// `ibv_advise_mr`.
    pub advise_mr: ex_slot,
    /// `ibv_alloc_null_mr`.
    pub alloc_null_mr: ex_slot,
    /// `ibv_read_counters`.
    pub read_counters: ex_slot,
    /// `ibv_attach_counters_point_flow`.
    pub attach_counters_point_flow: ex_slot,
    /// `ibv_create_counters`.
    pub create_counters: ex_slot,
    /// `ibv_destroy_counters`.
    pub destroy_counters: ex_slot,
    /// `ibv_reg_dm_mr`.
    pub reg_dm_mr: ex_slot,
    /// `ibv_alloc_dm`.
    pub alloc_dm: ex_slot,
    /// `ibv_free_dm`.
    pub free_dm: ex_slot,
    /// `ibv_modify_flow_action_esp`.
    pub modify_flow_action_esp: ex_slot,
    /// `ibv_destroy_flow_action`.
    pub destroy_flow_action: ex_slot,
    /// `ibv_create_flow_action_esp`.
    pub create_flow_action_esp: ex_slot,
    /// `ibv_modify_qp_rate_limit`.
    pub modify_qp_rate_limit: ex_slot,
    /// `ibv_alloc_parent_domain`.
    pub alloc_parent_domain: ex_slot,
    /// `ibv_dealloc_td`.
    pub dealloc_td: ex_slot,
    /// `ibv_alloc_td`.
    pub alloc_td: ex_slot,
    /// `ibv_modify_cq`.
    pub modify_cq: ex_slot,
    /// `ibv_post_srq_ops`.
    pub post_srq_ops: ex_slot,
    /// `ibv_destroy_rwq_ind_table`.
    pub destroy_rwq_ind_table: ex_slot,
    /// `ibv_create_rwq_ind_table`.
    pub create_rwq_ind_table: ex_slot,
    /// `ibv_destroy_wq`.
    pub destroy_wq: ex_slot,
    /// `ibv_modify_wq`.
    pub modify_wq: ex_slot,
    /// `ibv_create_wq`.
    pub create_wq: ex_slot,
    /// `ibv_query_rt_values_ex`.
    pub query_rt_values: ex_slot,
    /// `ibv_create_cq_ex`.
    pub create_cq_ex: ex_slot,
    /// libibverbs-private data pointer (NULL for xwarp).
    pub priv_: *mut c_void,
    /// `ibv_query_device_ex`.
    pub query_device_ex: Option<query_device_ex_fn>,
    /// `ibv_destroy_flow`.
    pub ibv_destroy_flow: ex_slot,
    /// Placeholder.
    pub ABI_placeholder2: Option<unsafe extern "C" fn()>,
    /// `ibv_create_flow`.
    pub ibv_create_flow: ex_slot,
    /// Placeholder.
    pub ABI_placeholder1: Option<unsafe extern "C" fn()>,
    /// `ibv_open_qp`.
    pub open_qp: ex_slot,
    /// `ibv_create_qp_ex`.
    pub create_qp_ex: ex_slot,
    /// `ibv_get_srq_num`.
    pub get_srq_num: ex_slot,
    /// `ibv_create_srq_ex`.
    pub create_srq_ex: ex_slot,
    /// `ibv_open_xrcd`.
    pub open_xrcd: ex_slot,
    /// `ibv_close_xrcd`.
    pub close_xrcd: ex_slot,
    /// Placeholder.
    pub _ABI_placeholder3: u64,
    /// `size_of::<verbs_context>()`: the inline wrappers use a slot only if `sz` covers it.
    pub sz: usize,
    /// The context handed to the program. Must stay the last field.
    pub context: ibv_context,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Kernel handle (an xwarp-chosen id).
    pub handle: u32,
}

/// `struct ibv_mr`. Programs read `lkey`, `rkey`, `addr` and `length` directly.
#[repr(C)]
pub struct ibv_mr {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Owning PD.
    pub pd: *mut ibv_pd,
    /// Start of the registered range.
    pub addr: *mut c_void,
    /// Length of the registered range.
    pub length: usize,
    /// Handle.
    pub handle: u32,
    /// Local key (the SGE `lkey`).
    pub lkey: u32,
    /// Remote key (STag) the peer addresses the region by.
    pub rkey: u32,
}

/// `struct ibv_comp_channel`: `fd` is what programs poll/epoll before `ibv_get_cq_event`.
#[repr(C)]
pub struct ibv_comp_channel {
    /// Owning context.
    pub context: *mut ibv_context,
    /// The readiness fd (an eventfd for xwarp).
    pub fd: c_int,
    /// CQs attached to the channel.
    pub refcnt: c_int,
}

/// `struct ibv_cq`. `ibv_ack_cq_events` is a real call but programs may read `cq_context`.
#[repr(C)]
pub struct ibv_cq {
    /// Owning context; its ops table serves `ibv_poll_cq`/`ibv_req_notify_cq`.
    pub context: *mut ibv_context,
    /// Completion channel (may be NULL).
    pub channel: *mut ibv_comp_channel,
    /// User's context pointer (returned by `ibv_get_cq_event`).
    pub cq_context: *mut c_void,
    /// Handle.
    pub handle: u32,
    /// Number of CQEs (at least what was asked for).
    pub cqe: c_int,
    /// Protects the event counters.
    pub mutex: pthread_mutex_t,
    /// Signalled when events are acknowledged (destroy waits on it).
    pub cond: pthread_cond_t,
    /// Completion events delivered.
    pub comp_events_completed: u32,
    /// Async events delivered.
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    /// Owning context; `ops.post_srq_recv` serves `ibv_post_srq_recv`.
    pub context: *mut ibv_context,
    /// User's context pointer.
    pub srq_context: *mut c_void,
    /// Owning PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
    /// Protects `events_completed`.
    pub mutex: pthread_mutex_t,
    /// Signalled on event acknowledgement.
    pub cond: pthread_cond_t,
    /// Async events delivered.
    pub events_completed: u32,
}

/// `struct ibv_qp`. Programs read `qp_num` and `state` directly.
#[repr(C)]
pub struct ibv_qp {
    /// Owning context; `ops.post_send`/`ops.post_recv` serve the inline posts.
    pub context: *mut ibv_context,
    /// User's context pointer.
    pub qp_context: *mut c_void,
    /// Owning PD.
    pub pd: *mut ibv_pd,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ (may be NULL).
    pub srq: *mut ibv_srq,
    /// Handle.
    pub handle: u32,
    /// QP number.
    pub qp_num: u32,
    /// `enum ibv_qp_state`, kept current by modify.
    pub state: c_uint,
    /// `enum ibv_qp_type`.
    pub qp_type: c_uint,
    /// Protects `events_completed`.
    pub mutex: pthread_mutex_t,
    /// Signalled on event acknowledgement.
    pub cond: pthread_cond_t,
    /// Async events delivered.
    pub events_completed: u32,
}

/// `struct ibv_ah` (UD only; xwarp creates none but the struct is part of the ABI).
#[repr(C)]
pub struct ibv_ah {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Owning PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
}

/// The anonymous `imm_data`/`invalidate_rkey` union of [`ibv_send_wr`] (Rust field `imm`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_imm {
    /// Immediate data (big-endian), for `*_WITH_IMM`.
    pub imm_data: u32,
    /// STag to invalidate, for `IBV_WR_SEND_WITH_INV`.
    pub invalidate_rkey: u32,
}

/// `wr.rdma` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_rdma {
    /// Remote (tagged) address.
    pub remote_addr: u64,
    /// Remote STag.
    pub rkey: u32,
}

/// `wr.atomic` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_atomic {
    /// Remote address.
    pub remote_addr: u64,
    /// Compare or add operand.
    pub compare_add: u64,
    /// Swap operand.
    pub swap: u64,
    /// Remote STag.
    pub rkey: u32,
}

/// `wr.ud` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_ud {
    /// Address handle.
    pub ah: *mut ibv_ah,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// The `wr` union of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    /// RDMA Write / Read.
    pub rdma: ibv_send_wr_rdma,
    /// Atomics.
    pub atomic: ibv_send_wr_atomic,
    /// UD.
    pub ud: ibv_send_wr_ud,
}

/// `qp_type.xrc` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_xrc {
    /// Remote SRQ number.
    pub remote_srqn: u32,
}

/// The `qp_type` union of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_qp_type {
    /// XRC.
    pub xrc: ibv_send_wr_xrc,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind_info {
    /// MR the window is bound in.
    pub mr: *mut ibv_mr,
    /// Start address.
    pub addr: u64,
    /// Length.
    pub length: u64,
    /// Access flags.
    pub mw_access_flags: c_uint,
}

/// `bind_mw` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_bind_mw {
    /// The window.
    pub mw: *mut ibv_mw,
    /// New rkey.
    pub rkey: u32,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// `tso` of [`ibv_send_wr`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_tso {
    /// Header.
    pub hdr: *mut c_void,
    /// Header size.
    pub hdr_sz: u16,
    /// MSS.
    pub mss: u16,
}

/// The trailing anonymous `bind_mw`/`tso` union of [`ibv_send_wr`] (Rust field `ext`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_ext {
    /// Memory-window bind.
    pub bind_mw: ibv_send_wr_bind_mw,
    /// TSO.
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr`, a linked list the program builds and `ibv_post_send` walks.
#[repr(C)]
pub struct ibv_send_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Next WR or NULL.
    pub next: *mut ibv_send_wr,
    /// Gather list (`num_sge` entries).
    pub sg_list: *mut ibv_sge,
    /// Length of `sg_list`.
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`.
    pub opcode: c_uint,
    /// `IBV_SEND_*` flags (signaled, solicited, inline, fence).
    pub send_flags: c_uint,
    /// Immediate data or rkey to invalidate (C: anonymous union).
    pub imm: ibv_send_wr_imm,
    /// Per-opcode remote parameters.
    pub wr: ibv_send_wr_wr,
    /// Per-QP-type parameters.
    pub qp_type: ibv_send_wr_qp_type,
    /// Bind-MW / TSO parameters (C: anonymous union).
    pub ext: ibv_send_wr_ext,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Next WR or NULL.
    pub next: *mut ibv_recv_wr,
    /// Scatter list.
    pub sg_list: *mut ibv_sge,
    /// Length of `sg_list`.
    pub num_sge: c_int,
}

/// The anonymous `imm_data`/`invalidated_rkey` union of [`ibv_wc`] (Rust field `imm`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_wc_imm {
    /// Immediate data (big-endian) when `wc_flags` has `IBV_WC_WITH_IMM`.
    pub imm_data: u32,
    /// Invalidated STag when `wc_flags` has `IBV_WC_WITH_INV`.
    pub invalidated_rkey: u32,
}

/// `struct ibv_wc`, what `ibv_poll_cq` fills.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wc {
    /// The WR's `wr_id`.
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: c_uint,
    /// `enum ibv_wc_opcode`.
    pub opcode: c_uint,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes received / transferred.
    pub byte_len: u32,
    /// Immediate data / invalidated rkey (C: anonymous union).
    pub imm: ibv_wc_imm,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP (UD).
    pub src_qp: u32,
    /// `IBV_WC_*` flags.
    pub wc_flags: c_uint,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
}

/// The `element` union of [`ibv_async_event`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    /// For CQ events.
    pub cq: *mut ibv_cq,
    /// For QP events.
    pub qp: *mut ibv_qp,
    /// For SRQ events.
    pub srq: *mut ibv_srq,
    /// For WQ events.
    pub wq: *mut ibv_wq,
    /// For port events.
    pub port_num: c_int,
}

/// `struct ibv_async_event` (`ibv_get_async_event`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    /// The object the event is about.
    pub element: ibv_async_event_element,
    /// `enum ibv_event_type`.
    pub event_type: c_uint,
}
