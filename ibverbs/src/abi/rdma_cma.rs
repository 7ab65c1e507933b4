//! The structures and constants of `<rdma/rdma_cma.h>` (and the `rdma_verbs.h` helpers, which
//! are all header-inline over these plus the verbs ops table).

use super::verbs::{ibv_comp_channel, ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_srq};
use super::verbs_base::{ibv_ah_attr, ibv_gid};
use core::ffi::{c_char, c_int, c_uint, c_void};
use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};

/// `struct rdma_event_channel`: programs poll `fd` before `rdma_get_cm_event`.
#[repr(C)]
pub struct rdma_event_channel {
    /// Readable when an event is queued.
    pub fd: c_int,
}

/// `struct rdma_ib_addr`: the IB part of [`rdma_addr`] (iWARP fills the GIDs from the
/// interface).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key (big-endian).
    pub pkey: u16,
}

/// An anonymous source/destination address union of [`rdma_addr`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_sockaddr {
    /// Generic view.
    pub addr: sockaddr,
    /// IPv4 view.
    pub sin: sockaddr_in,
    /// IPv6 view.
    pub sin6: sockaddr_in6,
    /// Storage (sets the size).
    pub storage: sockaddr_storage,
}

/// The `addr` union of [`rdma_addr`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_addr_ib {
    /// IB addressing.
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_addr`. Programs read `src_addr`/`dst_addr` (C: anonymous unions, here the
/// `src` and `dst` fields; `rdma_get_local_addr`/`rdma_get_peer_addr` are inline reads of
/// them).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// Local address (`src_addr`, `src_sin`, `src_sin6`, `src_storage`).
    pub src: rdma_sockaddr,
    /// Peer address (`dst_addr`, `dst_sin`, `dst_sin6`, `dst_storage`).
    pub dst: rdma_sockaddr,
    /// IB addressing.
    pub addr: rdma_addr_ib,
}

/// `struct ibv_sa_path_rec` (only pointed to by [`rdma_route`]; NULL on iWARP).
#[repr(C)]
pub struct ibv_sa_path_rec {
    _opaque: [u8; 0],
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    /// The addresses.
    pub addr: rdma_addr,
    /// Path records (NULL on iWARP).
    pub path_rec: *mut ibv_sa_path_rec,
    /// Number of path records (0 on iWARP).
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`. Programs read `verbs`, `qp`, `pd`, `context`, `route` and the CQ
/// fields `rdma_create_ep`/`rdma_create_qp` filled in directly.
#[repr(C)]
pub struct rdma_cm_id {
    /// The device context once the id is bound/resolved.
    pub verbs: *mut ibv_context,
    /// Event channel (NULL for synchronous ids).
    pub channel: *mut rdma_event_channel,
    /// User's context pointer.
    pub context: *mut c_void,
    /// QP from `rdma_create_qp`.
    pub qp: *mut ibv_qp,
    /// Addresses and path.
    pub route: rdma_route,
    /// `enum rdma_port_space`.
    pub ps: c_uint,
    /// Port (1).
    pub port_num: u8,
    /// The last event of a synchronous id.
    pub event: *mut rdma_cm_event,
    /// Send completion channel (`rdma_create_ep`/`rdma_create_qp` without CQs).
    pub send_cq_channel: *mut ibv_comp_channel,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive completion channel.
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut ibv_srq,
    /// PD.
    pub pd: *mut ibv_pd,
    /// `enum ibv_qp_type`.
    pub qp_type: c_uint,
}

/// `struct rdma_conn_param` (`rdma_connect`, `rdma_accept`, CONNECT_REQUEST/ESTABLISHED).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    /// MPA private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// IRD.
    pub responder_resources: u8,
    /// ORD.
    pub initiator_depth: u8,
    /// Flow control (ignored on iWARP).
    pub flow_control: u8,
    /// Retry count (ignored on iWARP).
    pub retry_count: u8,
    /// RNR retry count (ignored on iWARP).
    pub rnr_retry_count: u8,
    /// Whether the QP uses an SRQ.
    pub srq: u8,
    /// QP number (when there is no `id->qp`).
    pub qp_num: u32,
}

/// `struct rdma_ud_param` (UD ids; part of the event union).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Address handle attributes.
    pub ah_attr: ibv_ah_attr,
    /// Remote QPN.
    pub qp_num: u32,
    /// Q_Key.
    pub qkey: u32,
}

/// The `param` union of [`rdma_cm_event`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    /// Connected ids.
    pub conn: rdma_conn_param,
    /// UD ids.
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event` (`rdma_get_cm_event`; freed by `rdma_ack_cm_event`).
#[repr(C)]
pub struct rdma_cm_event {
    /// The id the event is about (a new id for CONNECT_REQUEST).
    pub id: *mut rdma_cm_id,
    /// The listening id for CONNECT_REQUEST.
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: c_uint,
    /// 0 or a negative errno / reject reason.
    pub status: c_int,
    /// Connection or UD parameters.
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo` (`rdma_getaddrinfo`, `rdma_create_ep`).
#[repr(C)]
pub struct rdma_addrinfo {
    /// `RAI_*` flags.
    pub ai_flags: c_int,
    /// Address family.
    pub ai_family: c_int,
    /// `enum ibv_qp_type`.
    pub ai_qp_type: c_int,
    /// `enum rdma_port_space`.
    pub ai_port_space: c_int,
    /// Length of `ai_src_addr`.
    pub ai_src_len: socklen_t,
    /// Length of `ai_dst_addr`.
    pub ai_dst_len: socklen_t,
    /// Source address or NULL.
    pub ai_src_addr: *mut sockaddr,
    /// Destination address or NULL.
    pub ai_dst_addr: *mut sockaddr,
    /// Source canonical name.
    pub ai_src_canonname: *mut c_char,
    /// Destination canonical name.
    pub ai_dst_canonname: *mut c_char,
    /// Length of `ai_route`.
    pub ai_route_len: usize,
    /// Route data (NULL on iWARP).
    pub ai_route: *mut c_void,
    /// Length of `ai_connect`.
    pub ai_connect_len: usize,
    /// Connect data.
    pub ai_connect: *mut c_void,
    /// Next entry.
    pub ai_next: *mut rdma_addrinfo,
}

/// `enum rdma_cm_event_type` (stored in a C `uint` field).
pub type rdma_cm_event_type = c_uint;
/// `RDMA_CM_EVENT_ADDR_RESOLVED`.
pub const RDMA_CM_EVENT_ADDR_RESOLVED: rdma_cm_event_type = 0;
/// `RDMA_CM_EVENT_ADDR_ERROR`.
pub const RDMA_CM_EVENT_ADDR_ERROR: rdma_cm_event_type = 1;
/// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: rdma_cm_event_type = 2;
/// `RDMA_CM_EVENT_ROUTE_ERROR`.
pub const RDMA_CM_EVENT_ROUTE_ERROR: rdma_cm_event_type = 3;
/// `RDMA_CM_EVENT_CONNECT_REQUEST`.
pub const RDMA_CM_EVENT_CONNECT_REQUEST: rdma_cm_event_type = 4;
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: rdma_cm_event_type = 5;
/// `RDMA_CM_EVENT_CONNECT_ERROR`.
pub const RDMA_CM_EVENT_CONNECT_ERROR: rdma_cm_event_type = 6;
/// `RDMA_CM_EVENT_UNREACHABLE`.
pub const RDMA_CM_EVENT_UNREACHABLE: rdma_cm_event_type = 7;
/// `RDMA_CM_EVENT_REJECTED`.
pub const RDMA_CM_EVENT_REJECTED: rdma_cm_event_type = 8;
/// `RDMA_CM_EVENT_ESTABLISHED`.
pub const RDMA_CM_EVENT_ESTABLISHED: rdma_cm_event_type = 9;
/// `RDMA_CM_EVENT_DISCONNECTED`.
pub const RDMA_CM_EVENT_DISCONNECTED: rdma_cm_event_type = 10;
/// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: rdma_cm_event_type = 11;
/// `RDMA_CM_EVENT_MULTICAST_JOIN`.
pub const RDMA_CM_EVENT_MULTICAST_JOIN: rdma_cm_event_type = 12;
/// `RDMA_CM_EVENT_MULTICAST_ERROR`.
pub const RDMA_CM_EVENT_MULTICAST_ERROR: rdma_cm_event_type = 13;
/// `RDMA_CM_EVENT_ADDR_CHANGE`.
pub const RDMA_CM_EVENT_ADDR_CHANGE: rdma_cm_event_type = 14;
/// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: rdma_cm_event_type = 15;

/// `enum rdma_port_space` (stored in a C `uint` field).
pub type rdma_port_space = c_uint;
/// `RDMA_PS_IPOIB`.
pub const RDMA_PS_IPOIB: rdma_port_space = 2;
/// `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: rdma_port_space = 0x106;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: rdma_port_space = 0x111;
/// `RDMA_PS_IB`.
pub const RDMA_PS_IB: rdma_port_space = 0x13f;

// rdma_option_level values.
/// `RDMA_OPTION_ID`.
pub const RDMA_OPTION_ID: c_int = 0;
/// `RDMA_OPTION_IB`.
pub const RDMA_OPTION_IB: c_int = 1;

// rdma_option_name values.
/// `RDMA_OPTION_ID_TOS`.
pub const RDMA_OPTION_ID_TOS: c_int = 0;
/// `RDMA_OPTION_ID_REUSEADDR`.
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
/// `RDMA_OPTION_ID_AFONLY`.
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
/// `RDMA_OPTION_ID_ACK_TIMEOUT`.
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
/// `RDMA_OPTION_IB_PATH`.
pub const RDMA_OPTION_IB_PATH: c_int = 1;

// rdma_addrinfo_flags values.
/// `RAI_PASSIVE`.
pub const RAI_PASSIVE: c_int = 1;
/// `RAI_NUMERICHOST`.
pub const RAI_NUMERICHOST: c_int = 2;
/// `RAI_NOROUTE`.
pub const RAI_NOROUTE: c_int = 4;
/// `RAI_FAMILY`.
pub const RAI_FAMILY: c_int = 8;

// rdma_limits values.
/// `RDMA_MAX_RESP_RES`.
pub const RDMA_MAX_RESP_RES: u8 = 255;
/// `RDMA_MAX_INIT_DEPTH`.
pub const RDMA_MAX_INIT_DEPTH: u8 = 255;
