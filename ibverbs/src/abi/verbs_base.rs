//! The pointer-free building blocks of `<infiniband/verbs.h>`: GIDs, device and port
//! attributes, SGEs, queue capacities, address vectors, QP attributes, and the opaque types
//! that are only pointed to. The objects that point at each other live in `verbs.rs`.

use core::ffi::{c_char, c_int, c_uint, c_void};

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
/// [`verbs_context`](super::verbs_context) (`__VERBS_ABI_IS_EXTENDED`, `UINTPTR_MAX`).
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

/// `struct ibv_rx_hash_conf` (RSS; part of [`ibv_qp_init_attr_ex`](super::ibv_qp_init_attr_ex)).
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
