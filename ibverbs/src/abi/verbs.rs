//! The structures and constants of `<infiniband/verbs.h>` that the library hands out or
//! receives.
//!
//! Memory layout rules the implementation must keep:
//! - An [`ibv_context`] is always the last field of a [`verbs_context`]; the library allocates
//!   the `verbs_context` (zeroed, then filled) and hands out `&vctx.context`. It sets
//!   `context.abi_compat` to [`VERBS_ABI_IS_EXTENDED`] and `vctx.sz` to
//!   `size_of::<verbs_context>()`: the header-inline `verbs_get_ctx()` subtracts
//!   `offset_of!(verbs_context, context)` from the `ibv_context` pointer and checks `sz` before
//!   it calls any extended slot. A NULL slot makes the inline wrappers fall back or fail with
//!   EOPNOTSUPP, so unsupported extended verbs are left NULL.
//! - Every object (`ibv_pd`, `ibv_cq`, `ibv_qp`, ...) is the first field of the library's own
//!   `#[repr(C)]` allocation, so a pointer the program passes back converts to the full object.

use super::verbs_obj::{ibv_cq, ibv_pd, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_srq, ibv_wc};
use core::ffi::{c_char, c_int, c_uint, c_void};
use libc::pthread_mutex_t;

macro_rules! opaque {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {$(
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            _opaque: [u8; 0],
        }
    )*};
}

opaque!(
    /// A memory window (not supported by xwarp; only pointed to).
    ibv_mw,
    /// A memory window bind request (only pointed to by `ibv_context_ops.bind_mw`).
    ibv_mw_bind,
    /// A receive work queue (RSS; only pointed to).
    ibv_wq,
    /// The pre-1.1 port attributes (only pointed to by the compat slot).
    _compat_ibv_port_attr,
    /// An XRC domain (only pointed to).
    ibv_xrcd,
    /// The extended variants and other objects reachable only through `verbs_context` slots
    /// that xwarp leaves NULL.
    ibv_opaque_ex,
);

/// `enum ibv_node_type` (an `int`).
pub type ibv_node_type = c_int;
/// Node type unknown.
pub const IBV_NODE_UNKNOWN: ibv_node_type = -1;
/// InfiniBand channel adapter.
pub const IBV_NODE_CA: ibv_node_type = 1;
/// Switch.
pub const IBV_NODE_SWITCH: ibv_node_type = 2;
/// Router.
pub const IBV_NODE_ROUTER: ibv_node_type = 3;
/// RDMA NIC (iWARP): what xwarp reports.
pub const IBV_NODE_RNIC: ibv_node_type = 4;
/// usNIC.
pub const IBV_NODE_USNIC: ibv_node_type = 5;
/// usNIC over UDP.
pub const IBV_NODE_USNIC_UDP: ibv_node_type = 6;
/// Unspecified.
pub const IBV_NODE_UNSPECIFIED: ibv_node_type = 7;

/// `enum ibv_transport_type` (an `int`).
pub type ibv_transport_type = c_int;
/// Transport unknown.
pub const IBV_TRANSPORT_UNKNOWN: ibv_transport_type = -1;
/// InfiniBand.
pub const IBV_TRANSPORT_IB: ibv_transport_type = 0;
/// iWARP: what xwarp reports.
pub const IBV_TRANSPORT_IWARP: ibv_transport_type = 1;
/// usNIC.
pub const IBV_TRANSPORT_USNIC: ibv_transport_type = 2;
/// usNIC over UDP.
pub const IBV_TRANSPORT_USNIC_UDP: ibv_transport_type = 3;
/// Unspecified.
pub const IBV_TRANSPORT_UNSPECIFIED: ibv_transport_type = 4;

/// `IBV_SYSFS_NAME_MAX`: the size of `ibv_device.name` and `dev_name`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`: the size of `ibv_device.dev_path` and `ibdev_path`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// The value of `ibv_context.abi_compat` that marks the context as the tail of a
/// [`verbs_context`] (`__VERBS_ABI_IS_EXTENDED`, `UINTPTR_MAX`).
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `union ibv_gid`: a 128-bit GID (for iWARP, the port's MAC-derived or IPv6 address).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    /// The 16 bytes.
    pub raw: [u8; 16],
    /// The two big-endian halves.
    pub global: ibv_gid_global,
}

/// The `global` member of [`ibv_gid`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_gid_global {
    /// Subnet prefix (big-endian).
    pub subnet_prefix: u64,
    /// Interface id (big-endian).
    pub interface_id: u64,
}

/// `struct ibv_gid_entry` (filled by `_ibv_query_gid_ex`, which perftest imports).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Its table index.
    pub gid_index: u32,
    /// Its port.
    pub port_num: u32,
    /// `enum ibv_gid_type` value.
    pub gid_type: u32,
    /// The netdev's ifindex.
    pub ndev_ifindex: u32,
}

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
    /// [`IBV_NODE_RNIC`] for xwarp.
    pub node_type: ibv_node_type,
    /// [`IBV_TRANSPORT_IWARP`] for xwarp.
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
    /// [`VERBS_ABI_IS_EXTENDED`].
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

/// `struct ibv_device_attr` (`ibv_query_device`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    /// NUL-terminated firmware version.
    pub fw_ver: [c_char; 64],
    /// Node GUID (big-endian).
    pub node_guid: u64,
    /// System image GUID (big-endian).
    pub sys_image_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Max QPs.
    pub max_qp: c_int,
    /// Max WRs per queue.
    pub max_qp_wr: c_int,
    /// `IBV_DEVICE_*` capability flags.
    pub device_cap_flags: c_uint,
    /// Max SGEs per WR.
    pub max_sge: c_int,
    /// Max SGEs per RDMA Read.
    pub max_sge_rd: c_int,
    /// Max CQs.
    pub max_cq: c_int,
    /// Max CQEs per CQ.
    pub max_cqe: c_int,
    /// Max MRs.
    pub max_mr: c_int,
    /// Max PDs.
    pub max_pd: c_int,
    /// Max outstanding RDMA Reads as responder per QP (IRD).
    pub max_qp_rd_atom: c_int,
    /// EE equivalent (0).
    pub max_ee_rd_atom: c_int,
    /// Total responder resources.
    pub max_res_rd_atom: c_int,
    /// Max outstanding RDMA Reads as initiator per QP (ORD).
    pub max_qp_init_rd_atom: c_int,
    /// EE equivalent (0).
    pub max_ee_init_rd_atom: c_int,
    /// `enum ibv_atomic_cap`.
    pub atomic_cap: c_uint,
    /// Max EE contexts.
    pub max_ee: c_int,
    /// Max RDDs.
    pub max_rdd: c_int,
    /// Max memory windows.
    pub max_mw: c_int,
    /// Max raw IPv6 QPs.
    pub max_raw_ipv6_qp: c_int,
    /// Max raw Ethertype QPs.
    pub max_raw_ethy_qp: c_int,
    /// Max multicast groups.
    pub max_mcast_grp: c_int,
    /// Max QPs per multicast group.
    pub max_mcast_qp_attach: c_int,
    /// Max total multicast attachments.
    pub max_total_mcast_qp_attach: c_int,
    /// Max address handles.
    pub max_ah: c_int,
    /// Max FMRs.
    pub max_fmr: c_int,
    /// Max maps per FMR.
    pub max_map_per_fmr: c_int,
    /// Max SRQs.
    pub max_srq: c_int,
    /// Max WRs per SRQ.
    pub max_srq_wr: c_int,
    /// Max SGEs per SRQ WR.
    pub max_srq_sge: c_int,
    /// Max partition keys.
    pub max_pkeys: u16,
    /// Local CA ack delay.
    pub local_ca_ack_delay: u8,
    /// Number of ports (1).
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (`ibv_query_port`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    /// `enum ibv_port_state`.
    pub state: c_uint,
    /// `enum ibv_mtu`.
    pub max_mtu: c_uint,
    /// `enum ibv_mtu`.
    pub active_mtu: c_uint,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// `IBV_PORT_*` capability flags.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID (0 on iWARP).
    pub lid: u16,
    /// SM LID.
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// Max VLs.
    pub max_vl_num: u8,
    /// SM SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Active link width.
    pub active_width: u8,
    /// Active link speed.
    pub active_speed: u8,
    /// Physical port state.
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// Port flags.
    pub flags: u8,
    /// More capability flags.
    pub port_cap_flags2: u16,
}
