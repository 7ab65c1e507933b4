//! The enum values of `<infiniband/verbs.h>` programs pass in and read back, as constants.
//! Each C enum is a type alias of the C type its fields use.

use core::ffi::c_uint;

/// `enum ibv_wr_opcode` (stored in a C `unsigned int` field).
pub type ibv_wr_opcode = c_uint;
/// `IBV_WR_RDMA_WRITE`.
pub const IBV_WR_RDMA_WRITE: ibv_wr_opcode = 0;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wr_opcode = 1;
/// `IBV_WR_SEND`.
pub const IBV_WR_SEND: ibv_wr_opcode = 2;
/// `IBV_WR_SEND_WITH_IMM`.
pub const IBV_WR_SEND_WITH_IMM: ibv_wr_opcode = 3;
/// `IBV_WR_RDMA_READ`.
pub const IBV_WR_RDMA_READ: ibv_wr_opcode = 4;
/// `IBV_WR_ATOMIC_CMP_AND_SWP`.
pub const IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wr_opcode = 5;
/// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wr_opcode = 6;
/// `IBV_WR_LOCAL_INV`.
pub const IBV_WR_LOCAL_INV: ibv_wr_opcode = 7;
/// `IBV_WR_BIND_MW`.
pub const IBV_WR_BIND_MW: ibv_wr_opcode = 8;
/// `IBV_WR_SEND_WITH_INV`.
pub const IBV_WR_SEND_WITH_INV: ibv_wr_opcode = 9;
/// `IBV_WR_TSO`.
pub const IBV_WR_TSO: ibv_wr_opcode = 10;
/// `IBV_WR_DRIVER1`.
pub const IBV_WR_DRIVER1: ibv_wr_opcode = 11;
/// `IBV_WR_ATOMIC_WRITE`.
pub const IBV_WR_ATOMIC_WRITE: ibv_wr_opcode = 15;

/// `enum ibv_send_flags` (stored in a C `unsigned int` field).
pub type ibv_send_flags = c_uint;
/// `IBV_SEND_FENCE`.
pub const IBV_SEND_FENCE: ibv_send_flags = 1;
/// `IBV_SEND_SIGNALED`.
pub const IBV_SEND_SIGNALED: ibv_send_flags = 2;
/// `IBV_SEND_SOLICITED`.
pub const IBV_SEND_SOLICITED: ibv_send_flags = 4;
/// `IBV_SEND_INLINE`.
pub const IBV_SEND_INLINE: ibv_send_flags = 8;
/// `IBV_SEND_IP_CSUM`.
pub const IBV_SEND_IP_CSUM: ibv_send_flags = 16;

/// `enum ibv_wc_status` (stored in a C `unsigned int` field).
pub type ibv_wc_status = c_uint;
/// `IBV_WC_SUCCESS`.
pub const IBV_WC_SUCCESS: ibv_wc_status = 0;
/// `IBV_WC_LOC_LEN_ERR`.
pub const IBV_WC_LOC_LEN_ERR: ibv_wc_status = 1;
/// `IBV_WC_LOC_QP_OP_ERR`.
pub const IBV_WC_LOC_QP_OP_ERR: ibv_wc_status = 2;
/// `IBV_WC_LOC_EEC_OP_ERR`.
pub const IBV_WC_LOC_EEC_OP_ERR: ibv_wc_status = 3;
/// `IBV_WC_LOC_PROT_ERR`.
pub const IBV_WC_LOC_PROT_ERR: ibv_wc_status = 4;
/// `IBV_WC_WR_FLUSH_ERR`.
pub const IBV_WC_WR_FLUSH_ERR: ibv_wc_status = 5;
/// `IBV_WC_MW_BIND_ERR`.
pub const IBV_WC_MW_BIND_ERR: ibv_wc_status = 6;
/// `IBV_WC_BAD_RESP_ERR`.
pub const IBV_WC_BAD_RESP_ERR: ibv_wc_status = 7;
/// `IBV_WC_LOC_ACCESS_ERR`.
pub const IBV_WC_LOC_ACCESS_ERR: ibv_wc_status = 8;
/// `IBV_WC_REM_INV_REQ_ERR`.
pub const IBV_WC_REM_INV_REQ_ERR: ibv_wc_status = 9;
/// `IBV_WC_REM_ACCESS_ERR`.
pub const IBV_WC_REM_ACCESS_ERR: ibv_wc_status = 10;
/// `IBV_WC_REM_OP_ERR`.
pub const IBV_WC_REM_OP_ERR: ibv_wc_status = 11;
/// `IBV_WC_RETRY_EXC_ERR`.
pub const IBV_WC_RETRY_EXC_ERR: ibv_wc_status = 12;
/// `IBV_WC_RNR_RETRY_EXC_ERR`.
pub const IBV_WC_RNR_RETRY_EXC_ERR: ibv_wc_status = 13;
/// `IBV_WC_LOC_RDD_VIOL_ERR`.
pub const IBV_WC_LOC_RDD_VIOL_ERR: ibv_wc_status = 14;
/// `IBV_WC_REM_INV_RD_REQ_ERR`.
pub const IBV_WC_REM_INV_RD_REQ_ERR: ibv_wc_status = 15;
/// `IBV_WC_REM_ABORT_ERR`.
pub const IBV_WC_REM_ABORT_ERR: ibv_wc_status = 16;
/// `IBV_WC_INV_EECN_ERR`.
pub const IBV_WC_INV_EECN_ERR: ibv_wc_status = 17;
/// `IBV_WC_INV_EEC_STATE_ERR`.
pub const IBV_WC_INV_EEC_STATE_ERR: ibv_wc_status = 18;
/// `IBV_WC_FATAL_ERR`.
pub const IBV_WC_FATAL_ERR: ibv_wc_status = 19;
/// `IBV_WC_RESP_TIMEOUT_ERR`.
pub const IBV_WC_RESP_TIMEOUT_ERR: ibv_wc_status = 20;
/// `IBV_WC_GENERAL_ERR`.
pub const IBV_WC_GENERAL_ERR: ibv_wc_status = 21;
/// `IBV_WC_TM_ERR`.
pub const IBV_WC_TM_ERR: ibv_wc_status = 22;
/// `IBV_WC_TM_RNDV_INCOMPLETE`.
pub const IBV_WC_TM_RNDV_INCOMPLETE: ibv_wc_status = 23;

/// `enum ibv_wc_opcode` (stored in a C `unsigned int` field).
pub type ibv_wc_opcode = c_uint;
/// `IBV_WC_SEND`.
pub const IBV_WC_SEND: ibv_wc_opcode = 0;
/// `IBV_WC_RDMA_WRITE`.
pub const IBV_WC_RDMA_WRITE: ibv_wc_opcode = 1;
/// `IBV_WC_RDMA_READ`.
pub const IBV_WC_RDMA_READ: ibv_wc_opcode = 2;
/// `IBV_WC_COMP_SWAP`.
pub const IBV_WC_COMP_SWAP: ibv_wc_opcode = 3;
/// `IBV_WC_FETCH_ADD`.
pub const IBV_WC_FETCH_ADD: ibv_wc_opcode = 4;
/// `IBV_WC_BIND_MW`.
pub const IBV_WC_BIND_MW: ibv_wc_opcode = 5;
/// `IBV_WC_LOCAL_INV`.
pub const IBV_WC_LOCAL_INV: ibv_wc_opcode = 6;
/// `IBV_WC_TSO`.
pub const IBV_WC_TSO: ibv_wc_opcode = 7;
/// `IBV_WC_ATOMIC_WRITE`.
pub const IBV_WC_ATOMIC_WRITE: ibv_wc_opcode = 9;
/// `IBV_WC_RECV`.
pub const IBV_WC_RECV: ibv_wc_opcode = 128;
/// `IBV_WC_RECV_RDMA_WITH_IMM`.
pub const IBV_WC_RECV_RDMA_WITH_IMM: ibv_wc_opcode = 129;

/// `enum ibv_wc_flags` (stored in a C `unsigned int` field).
pub type ibv_wc_flags = c_uint;
/// `IBV_WC_GRH`.
pub const IBV_WC_GRH: ibv_wc_flags = 1;
/// `IBV_WC_WITH_IMM`.
pub const IBV_WC_WITH_IMM: ibv_wc_flags = 2;
/// `IBV_WC_IP_CSUM_OK`.
pub const IBV_WC_IP_CSUM_OK: ibv_wc_flags = 4;
/// `IBV_WC_WITH_INV`.
pub const IBV_WC_WITH_INV: ibv_wc_flags = 8;

/// `enum ibv_qp_state` (stored in a C `unsigned int` field).
pub type ibv_qp_state = c_uint;
/// `IBV_QPS_RESET`.
pub const IBV_QPS_RESET: ibv_qp_state = 0;
/// `IBV_QPS_INIT`.
pub const IBV_QPS_INIT: ibv_qp_state = 1;
/// `IBV_QPS_RTR`.
pub const IBV_QPS_RTR: ibv_qp_state = 2;
/// `IBV_QPS_RTS`.
pub const IBV_QPS_RTS: ibv_qp_state = 3;
/// `IBV_QPS_SQD`.
pub const IBV_QPS_SQD: ibv_qp_state = 4;
/// `IBV_QPS_SQE`.
pub const IBV_QPS_SQE: ibv_qp_state = 5;
/// `IBV_QPS_ERR`.
pub const IBV_QPS_ERR: ibv_qp_state = 6;
/// `IBV_QPS_UNKNOWN`.
pub const IBV_QPS_UNKNOWN: ibv_qp_state = 7;

/// `enum ibv_qp_type` (stored in a C `unsigned int` field).
pub type ibv_qp_type = c_uint;
/// `IBV_QPT_RC`.
pub const IBV_QPT_RC: ibv_qp_type = 2;
/// `IBV_QPT_UC`.
pub const IBV_QPT_UC: ibv_qp_type = 3;
/// `IBV_QPT_UD`.
pub const IBV_QPT_UD: ibv_qp_type = 4;
/// `IBV_QPT_RAW_PACKET`.
pub const IBV_QPT_RAW_PACKET: ibv_qp_type = 8;
/// `IBV_QPT_XRC_SEND`.
pub const IBV_QPT_XRC_SEND: ibv_qp_type = 9;
/// `IBV_QPT_XRC_RECV`.
pub const IBV_QPT_XRC_RECV: ibv_qp_type = 10;
/// `IBV_QPT_DRIVER`.
pub const IBV_QPT_DRIVER: ibv_qp_type = 255;

/// `enum ibv_qp_attr_mask` (stored in a C `unsigned int` field).
pub type ibv_qp_attr_mask = c_uint;
/// `IBV_QP_STATE`.
pub const IBV_QP_STATE: ibv_qp_attr_mask = 1;
/// `IBV_QP_CUR_STATE`.
pub const IBV_QP_CUR_STATE: ibv_qp_attr_mask = 2;
/// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: ibv_qp_attr_mask = 4;
/// `IBV_QP_ACCESS_FLAGS`.
pub const IBV_QP_ACCESS_FLAGS: ibv_qp_attr_mask = 8;
/// `IBV_QP_PKEY_INDEX`.
pub const IBV_QP_PKEY_INDEX: ibv_qp_attr_mask = 16;
/// `IBV_QP_PORT`.
pub const IBV_QP_PORT: ibv_qp_attr_mask = 32;
/// `IBV_QP_QKEY`.
pub const IBV_QP_QKEY: ibv_qp_attr_mask = 64;
/// `IBV_QP_AV`.
pub const IBV_QP_AV: ibv_qp_attr_mask = 128;
/// `IBV_QP_PATH_MTU`.
pub const IBV_QP_PATH_MTU: ibv_qp_attr_mask = 1 << 8;
/// `IBV_QP_TIMEOUT`.
pub const IBV_QP_TIMEOUT: ibv_qp_attr_mask = 1 << 9;
/// `IBV_QP_RETRY_CNT`.
pub const IBV_QP_RETRY_CNT: ibv_qp_attr_mask = 1 << 10;
/// `IBV_QP_RNR_RETRY`.
pub const IBV_QP_RNR_RETRY: ibv_qp_attr_mask = 1 << 11;
/// `IBV_QP_RQ_PSN`.
pub const IBV_QP_RQ_PSN: ibv_qp_attr_mask = 1 << 12;
/// `IBV_QP_MAX_QP_RD_ATOMIC`.
pub const IBV_QP_MAX_QP_RD_ATOMIC: ibv_qp_attr_mask = 1 << 13;
/// `IBV_QP_ALT_PATH`.
pub const IBV_QP_ALT_PATH: ibv_qp_attr_mask = 1 << 14;
/// `IBV_QP_MIN_RNR_TIMER`.
pub const IBV_QP_MIN_RNR_TIMER: ibv_qp_attr_mask = 1 << 15;
/// `IBV_QP_SQ_PSN`.
pub const IBV_QP_SQ_PSN: ibv_qp_attr_mask = 1 << 16;
/// `IBV_QP_MAX_DEST_RD_ATOMIC`.
pub const IBV_QP_MAX_DEST_RD_ATOMIC: ibv_qp_attr_mask = 1 << 17;
/// `IBV_QP_PATH_MIG_STATE`.
pub const IBV_QP_PATH_MIG_STATE: ibv_qp_attr_mask = 1 << 18;
/// `IBV_QP_CAP`.
pub const IBV_QP_CAP: ibv_qp_attr_mask = 1 << 19;
/// `IBV_QP_DEST_QPN`.
pub const IBV_QP_DEST_QPN: ibv_qp_attr_mask = 1 << 20;
/// `IBV_QP_RATE_LIMIT`.
pub const IBV_QP_RATE_LIMIT: ibv_qp_attr_mask = 1 << 25;

/// `enum ibv_access_flags` (stored in a C `unsigned int` field).
pub type ibv_access_flags = c_uint;
/// `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: ibv_access_flags = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const IBV_ACCESS_REMOTE_WRITE: ibv_access_flags = 2;
/// `IBV_ACCESS_REMOTE_READ`.
pub const IBV_ACCESS_REMOTE_READ: ibv_access_flags = 4;
/// `IBV_ACCESS_REMOTE_ATOMIC`.
pub const IBV_ACCESS_REMOTE_ATOMIC: ibv_access_flags = 8;
/// `IBV_ACCESS_MW_BIND`.
pub const IBV_ACCESS_MW_BIND: ibv_access_flags = 16;
/// `IBV_ACCESS_ZERO_BASED`.
pub const IBV_ACCESS_ZERO_BASED: ibv_access_flags = 32;
/// `IBV_ACCESS_ON_DEMAND`.
pub const IBV_ACCESS_ON_DEMAND: ibv_access_flags = 64;
/// `IBV_ACCESS_HUGETLB`.
pub const IBV_ACCESS_HUGETLB: ibv_access_flags = 128;
/// `IBV_ACCESS_RELAXED_ORDERING`.
pub const IBV_ACCESS_RELAXED_ORDERING: ibv_access_flags = 1 << 20;

/// `enum ibv_event_type` (stored in a C `unsigned int` field).
pub type ibv_event_type = c_uint;
/// `IBV_EVENT_CQ_ERR`.
pub const IBV_EVENT_CQ_ERR: ibv_event_type = 0;
/// `IBV_EVENT_QP_FATAL`.
pub const IBV_EVENT_QP_FATAL: ibv_event_type = 1;
/// `IBV_EVENT_QP_REQ_ERR`.
pub const IBV_EVENT_QP_REQ_ERR: ibv_event_type = 2;
/// `IBV_EVENT_QP_ACCESS_ERR`.
pub const IBV_EVENT_QP_ACCESS_ERR: ibv_event_type = 3;
/// `IBV_EVENT_COMM_EST`.
pub const IBV_EVENT_COMM_EST: ibv_event_type = 4;
/// `IBV_EVENT_SQ_DRAINED`.
pub const IBV_EVENT_SQ_DRAINED: ibv_event_type = 5;
/// `IBV_EVENT_PATH_MIG`.
pub const IBV_EVENT_PATH_MIG: ibv_event_type = 6;
/// `IBV_EVENT_PATH_MIG_ERR`.
pub const IBV_EVENT_PATH_MIG_ERR: ibv_event_type = 7;
/// `IBV_EVENT_DEVICE_FATAL`.
pub const IBV_EVENT_DEVICE_FATAL: ibv_event_type = 8;
/// `IBV_EVENT_PORT_ACTIVE`.
pub const IBV_EVENT_PORT_ACTIVE: ibv_event_type = 9;
/// `IBV_EVENT_PORT_ERR`.
pub const IBV_EVENT_PORT_ERR: ibv_event_type = 10;
/// `IBV_EVENT_LID_CHANGE`.
pub const IBV_EVENT_LID_CHANGE: ibv_event_type = 11;
/// `IBV_EVENT_PKEY_CHANGE`.
pub const IBV_EVENT_PKEY_CHANGE: ibv_event_type = 12;
/// `IBV_EVENT_SM_CHANGE`.
pub const IBV_EVENT_SM_CHANGE: ibv_event_type = 13;
/// `IBV_EVENT_SRQ_ERR`.
pub const IBV_EVENT_SRQ_ERR: ibv_event_type = 14;
/// `IBV_EVENT_SRQ_LIMIT_REACHED`.
pub const IBV_EVENT_SRQ_LIMIT_REACHED: ibv_event_type = 15;
/// `IBV_EVENT_QP_LAST_WQE_REACHED`.
pub const IBV_EVENT_QP_LAST_WQE_REACHED: ibv_event_type = 16;
/// `IBV_EVENT_CLIENT_REREGISTER`.
pub const IBV_EVENT_CLIENT_REREGISTER: ibv_event_type = 17;
/// `IBV_EVENT_GID_CHANGE`.
pub const IBV_EVENT_GID_CHANGE: ibv_event_type = 18;
/// `IBV_EVENT_WQ_FATAL`.
pub const IBV_EVENT_WQ_FATAL: ibv_event_type = 19;

/// `enum ibv_mtu` (stored in a C `unsigned int` field).
pub type ibv_mtu = c_uint;
/// `IBV_MTU_256`.
pub const IBV_MTU_256: ibv_mtu = 1;
/// `IBV_MTU_512`.
pub const IBV_MTU_512: ibv_mtu = 2;
/// `IBV_MTU_1024`.
pub const IBV_MTU_1024: ibv_mtu = 3;
/// `IBV_MTU_2048`.
pub const IBV_MTU_2048: ibv_mtu = 4;
/// `IBV_MTU_4096`.
pub const IBV_MTU_4096: ibv_mtu = 5;

/// `enum ibv_port_state` (stored in a C `unsigned int` field).
pub type ibv_port_state = c_uint;
/// `IBV_PORT_NOP`.
pub const IBV_PORT_NOP: ibv_port_state = 0;
/// `IBV_PORT_DOWN`.
pub const IBV_PORT_DOWN: ibv_port_state = 1;
/// `IBV_PORT_INIT`.
pub const IBV_PORT_INIT: ibv_port_state = 2;
/// `IBV_PORT_ARMED`.
pub const IBV_PORT_ARMED: ibv_port_state = 3;
/// `IBV_PORT_ACTIVE`.
pub const IBV_PORT_ACTIVE: ibv_port_state = 4;
/// `IBV_PORT_ACTIVE_DEFER`.
pub const IBV_PORT_ACTIVE_DEFER: ibv_port_state = 5;

/// `enum ibv_atomic_cap` (stored in a C `unsigned int` field).
pub type ibv_atomic_cap = c_uint;
/// `IBV_ATOMIC_NONE`.
pub const IBV_ATOMIC_NONE: ibv_atomic_cap = 0;
/// `IBV_ATOMIC_HCA`.
pub const IBV_ATOMIC_HCA: ibv_atomic_cap = 1;
/// `IBV_ATOMIC_GLOB`.
pub const IBV_ATOMIC_GLOB: ibv_atomic_cap = 2;

/// `enum ibv_mig_state` (stored in a C `unsigned int` field).
pub type ibv_mig_state = c_uint;
/// `IBV_MIG_MIGRATED`.
pub const IBV_MIG_MIGRATED: ibv_mig_state = 0;
/// `IBV_MIG_REARM`.
pub const IBV_MIG_REARM: ibv_mig_state = 1;
/// `IBV_MIG_ARMED`.
pub const IBV_MIG_ARMED: ibv_mig_state = 2;

/// `enum ibv_srq_attr_mask` (stored in a C `unsigned int` field).
pub type ibv_srq_attr_mask = c_uint;
/// `IBV_SRQ_MAX_WR`.
pub const IBV_SRQ_MAX_WR: ibv_srq_attr_mask = 1;
/// `IBV_SRQ_LIMIT`.
pub const IBV_SRQ_LIMIT: ibv_srq_attr_mask = 2;

/// `enum ibv_mw_type` (stored in a C `unsigned int` field).
pub type ibv_mw_type = c_uint;
/// `IBV_MW_TYPE_1`.
pub const IBV_MW_TYPE_1: ibv_mw_type = 1;
/// `IBV_MW_TYPE_2`.
pub const IBV_MW_TYPE_2: ibv_mw_type = 2;

// ibv_link_layer values.
/// `IBV_LINK_LAYER_UNSPECIFIED`.
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
/// `IBV_LINK_LAYER_INFINIBAND`.
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `enum ibv_gid_type` (stored in a C `unsigned int` field).
pub type ibv_gid_type = c_uint;
/// `IBV_GID_TYPE_IB`.
pub const IBV_GID_TYPE_IB: ibv_gid_type = 0;
/// `IBV_GID_TYPE_ROCE_V1`.
pub const IBV_GID_TYPE_ROCE_V1: ibv_gid_type = 1;
/// `IBV_GID_TYPE_ROCE_V2`.
pub const IBV_GID_TYPE_ROCE_V2: ibv_gid_type = 2;

/// `enum ibv_gid_type_sysfs` (what `ibv_query_gid_type` stores, an `int`-sized enum).
/// It is declared in rdma-core's `<infiniband/driver.h>`, which Debian does not install,
/// so `tests/layout.rs` cannot check its values against a header: they are those of
/// rdma-core 44's `libibverbs/driver.h`.
pub type ibv_gid_type_sysfs = c_uint;
/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1`: the type of an IB or iWARP GID (the kernel gives
/// iWARP ports IB-type GIDs).
pub const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: ibv_gid_type_sysfs = 0;
/// `IBV_GID_TYPE_SYSFS_ROCE_V2`.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: ibv_gid_type_sysfs = 1;

// enum ibv_port_cap_flags values (`ibv_port_attr.port_cap_flags`).
/// `IBV_PORT_CM_SUP`: the port supports a connection manager (siw sets it).
pub const IBV_PORT_CM_SUP: u32 = 1 << 16;
/// `IBV_PORT_DEVICE_MGMT_SUP` (siw sets it).
pub const IBV_PORT_DEVICE_MGMT_SUP: u32 = 1 << 19;

/// `enum ibv_qp_init_attr_mask` (stored in a C `unsigned int` field).
pub type ibv_qp_init_attr_mask = c_uint;
/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: ibv_qp_init_attr_mask = 1;
/// `IBV_QP_INIT_ATTR_XRCD`.
pub const IBV_QP_INIT_ATTR_XRCD: ibv_qp_init_attr_mask = 2;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: ibv_qp_init_attr_mask = 4;
/// `IBV_QP_INIT_ATTR_MAX_TSO_HEADER`.
pub const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: ibv_qp_init_attr_mask = 8;
/// `IBV_QP_INIT_ATTR_IND_TABLE`.
pub const IBV_QP_INIT_ATTR_IND_TABLE: ibv_qp_init_attr_mask = 16;
/// `IBV_QP_INIT_ATTR_RX_HASH`.
pub const IBV_QP_INIT_ATTR_RX_HASH: ibv_qp_init_attr_mask = 32;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: ibv_qp_init_attr_mask = 64;
