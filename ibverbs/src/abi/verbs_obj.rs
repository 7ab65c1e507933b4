//! The objects and work-request structures of `<infiniband/verbs.h>`: PD, MR, CQ, completion
//! channel, SRQ, QP, AH, SGE, send/receive WRs, work completions, QP/SRQ attributes.

use super::verbs::{ibv_context, ibv_gid, ibv_mw};
use core::ffi::{c_int, c_uint, c_void};
use libc::{pthread_cond_t, pthread_mutex_t};

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

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    /// Start address in the program's memory.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR that covers it (ignored for inline sends).
    pub lkey: u32,
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

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    /// Global route.
    pub grh: ibv_global_route,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Whether `grh` is valid.
    pub is_global: u8,
    /// Port.
    pub port_num: u8,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_srq_attr {
    /// Max WRs.
    pub max_wr: u32,
    /// Max SGEs per WR.
    pub max_sge: u32,
    /// Limit event threshold.
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    /// User's context pointer.
    pub srq_context: *mut c_void,
    /// Requested sizes (updated with the real ones).
    pub attr: ibv_srq_attr,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline data bytes per send WR.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (`ibv_create_qp`, `rdma_create_qp`).
#[repr(C)]
pub struct ibv_qp_init_attr {
    /// User's context pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ or NULL.
    pub srq: *mut ibv_srq,
    /// Requested capacities (updated with the real ones).
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: c_uint,
    /// Nonzero: every send WR generates a completion.
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp_attr` (`ibv_modify_qp`, `ibv_query_qp`, `rdma_init_qp_attr`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    /// `enum ibv_qp_state`.
    pub qp_state: c_uint,
    /// `enum ibv_qp_state`.
    pub cur_qp_state: c_uint,
    /// `enum ibv_mtu`.
    pub path_mtu: c_uint,
    /// `enum ibv_mig_state`.
    pub path_mig_state: c_uint,
    /// Q_Key.
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Destination QP number.
    pub dest_qp_num: u32,
    /// `IBV_ACCESS_*` remote access flags.
    pub qp_access_flags: c_uint,
    /// Capacities.
    pub cap: ibv_qp_cap,
    /// Primary path.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQD async notify.
    pub en_sqd_async_notify: u8,
    /// SQ draining (query only).
    pub sq_draining: u8,
    /// ORD: outstanding RDMA Reads as initiator.
    pub max_rd_atomic: u8,
    /// IRD: outstanding RDMA Reads as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Port.
    pub port_num: u8,
    /// Local ack timeout.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit (kbps).
    pub rate_limit: u32,
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
    pub wq: *mut super::verbs::ibv_wq,
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

/// `struct ibv_rx_hash_conf` (RSS; part of [`ibv_qp_init_attr_ex`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_rx_hash_conf {
    /// Hash function.
    pub rx_hash_function: u8,
    /// Key length.
    pub rx_hash_key_len: u8,
    /// Key.
    pub rx_hash_key: *mut u8,
    /// Hashed fields.
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`: what `rdma_create_qp_ex` (imported by perftest) receives.
/// The first seven fields are [`ibv_qp_init_attr`]'s; `comp_mask` (`IBV_QP_INIT_ATTR_*`)
/// says which of the rest are valid.
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    /// User's context pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ or NULL.
    pub srq: *mut ibv_srq,
    /// Requested capacities (updated with the real ones).
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: c_uint,
    /// Nonzero: every send WR generates a completion.
    pub sq_sig_all: c_int,
    /// `IBV_QP_INIT_ATTR_*` validity mask.
    pub comp_mask: u32,
    /// PD (`IBV_QP_INIT_ATTR_PD`).
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut super::verbs::ibv_xrcd,
    /// `IBV_QP_CREATE_*` flags.
    pub create_flags: u32,
    /// TSO header size.
    pub max_tso_header: u16,
    /// RSS indirection table.
    pub rwq_ind_tbl: *mut c_void,
    /// RSS configuration.
    pub rx_hash_conf: ibv_rx_hash_conf,
    /// Source QPN.
    pub source_qpn: u32,
    /// `IBV_QP_EX_WITH_*` (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`): the `ibv_wr_*` API.
    pub send_ops_flags: u64,
}
