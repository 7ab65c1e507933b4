//! The creation attributes of `<infiniband/verbs.h>` (`ibv_create_qp`, `rdma_create_qp_ex`,
//! `ibv_create_srq`): they point at the objects of `verbs.rs`.

use super::verbs::{ibv_cq, ibv_pd, ibv_srq};
use super::verbs_base::{ibv_qp_cap, ibv_rx_hash_conf, ibv_srq_attr, ibv_xrcd};
use core::ffi::{c_int, c_uint, c_void};

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    /// User's context pointer.
    pub srq_context: *mut c_void,
    /// Requested sizes (updated with the real ones).
    pub attr: ibv_srq_attr,
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
    pub xrcd: *mut ibv_xrcd,
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
