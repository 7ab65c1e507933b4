//! The attributes the xwarp device reports (`ibv_query_device`, `ibv_query_port`,
//! `ibv_query_gid`), modelled on what siw reports for itself and filled from the limits
//! the engine really enforces:
//!
//! | attribute | value | where the limit is |
//! |---|---|---|
//! | `max_sge`, `max_srq_sge` | [`MAX_SGE`] (16) | `xwarp_rdmap::verbs::MAX_SGE`: more SGEs are refused at post time |
//! | `max_sge_rd` | [`MAX_SGE_RD`] (1) | `xwarp_rdmap::verbs::MAX_SGE_RD`: a Read has exactly one sink SGE |
//! | `max_mr` | [`MAX_INDEX`] (2^24 − 1) | `xwarp_rdmap::mem::MAX_INDEX`: the STag index space of the engine's table |
//! | `max_mr_size` | `u64::MAX` | the STag table only refuses a region whose end wraps 64 bits (siw reports `~0` too) |
//! | `max_qp_rd_atom`, `max_qp_init_rd_atom` | [`IRD_ORD_MAX`] (16383) | `xwarp_ddp::mpa::frame::IRD_ORD_MAX`: the 14-bit IRD/ORD of the MPA v2 block; more fails the connection setup |
//! | `max_msg_sz` (port) | [`MAX_MSG_SIZE`] (2^32 − 1) | `xwarp_rdmap::verbs::MAX_MSG_SIZE`: a completion's byte count |
//! | `max_qp`, `max_qp_wr`, `max_cq`, `max_cqe`, `max_pd`, `max_srq`, `max_srq_wr`, `max_res_rd_atom` | [`UNBOUNDED`] (`INT_MAX`) | no engine limit: QP and PD numbers are 32-bit counters, queues grow as needed (rdmap preallocates at most 4096 entries); only memory and fds bound them |
//!
//! Not supported and reported as zero: atomics (`ATOMIC_NONE`), memory windows, UD/
//! multicast, address handles, FMRs, partition keys; no `device_cap_flags` are claimed
//! (no fast-register, so not even siw's `MEM_MGT_EXTENSIONS`). The vendor id is
//! xwarp's own ([`XWARP_VENDOR_ID`]), so perftest takes the device for a generic one and
//! uses `ibv_post_send`.

use core::ffi::{c_char, c_int};

use xwarp_ddp::mpa::frame::IRD_ORD_MAX;
use xwarp_rdmap::mem::MAX_INDEX;
use xwarp_rdmap::verbs::{MAX_MSG_SIZE, MAX_SGE, MAX_SGE_RD};

use crate::abi::*;
use crate::netdev::IfaceFacts;

/// The vendor id of the xwarp device: ASCII `xwp` (`0x787770`), after siw's `bmt`
/// (`0x626d74`); no PCI/IEEE vendor has it, and perftest's mlx5/EFA/HNS checks do not
/// match it.
pub const XWARP_VENDOR_ID: u32 = 0x78_77_70;
/// The vendor part id (0, as siw).
pub const XWARP_VENDOR_PART_ID: u32 = 0;
/// What a count the engine does not bound is reported as: the largest C `int`.
pub const UNBOUNDED: c_int = c_int::MAX;

fn int(n: u64) -> c_int {
    c_int::try_from(n).unwrap_or(UNBOUNDED)
}

/// The EUI-64 node GUID of a MAC, in network byte order as `ibv_device_attr.node_guid`
/// holds it: the MAC split by `ff:fe` with the universal/local bit flipped (what siw
/// does with the netdev's address).
pub fn node_guid(mac: [u8; 6]) -> u64 {
    let eui = [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    u64::from_ne_bytes(eui)
}

/// The system page size.
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

/// `ibv_query_device`'s answer for a device whose interface has `mac`.
pub fn device_attr(mac: [u8; 6]) -> ibv_device_attr {
    // SAFETY: ibv_device_attr is plain integers and a char array: all-zero is valid.
    let mut a: ibv_device_attr = unsafe { core::mem::zeroed() };
    let ver = concat!("xwarp ", env!("CARGO_PKG_VERSION"));
    for (d, s) in a.fw_ver.iter_mut().zip(ver.bytes()) {
        *d = s as c_char;
    }
    a.node_guid = node_guid(mac);
    a.sys_image_guid = node_guid(mac);
    a.max_mr_size = u64::MAX;
    a.page_size_cap = page_size();
    a.vendor_id = XWARP_VENDOR_ID;
    a.vendor_part_id = XWARP_VENDOR_PART_ID;
    a.hw_ver = 0;
    a.max_qp = UNBOUNDED;
    a.max_qp_wr = UNBOUNDED;
    a.device_cap_flags = 0;
    a.max_sge = int(MAX_SGE as u64);
    a.max_sge_rd = int(MAX_SGE_RD as u64);
    a.max_cq = UNBOUNDED;
    a.max_cqe = UNBOUNDED;
    a.max_mr = int(u64::from(MAX_INDEX));
    a.max_pd = UNBOUNDED;
    a.max_qp_rd_atom = c_int::from(IRD_ORD_MAX);
    a.max_qp_init_rd_atom = c_int::from(IRD_ORD_MAX);
    a.max_res_rd_atom = UNBOUNDED;
    a.atomic_cap = IBV_ATOMIC_NONE;
    a.max_srq = UNBOUNDED;
    a.max_srq_wr = UNBOUNDED;
    a.max_srq_sge = int(MAX_SGE as u64);
    a.phys_port_cnt = 1;
    a
}

/// `ib_mtu_int_to_enum`: the largest IB MTU not above `mtu` (256 at least).
pub fn mtu_enum(mtu: u32) -> ibv_mtu {
    match mtu {
        4096.. => IBV_MTU_4096,
        2048.. => IBV_MTU_2048,
        1024.. => IBV_MTU_1024,
        512.. => IBV_MTU_512,
        _ => IBV_MTU_256,
    }
}

/// Port width and speed codes for an Ethernet speed in Mb/s, as the kernel maps a netdev's
/// speed for RoCE/iWARP ports (`ib_get_eth_speed`; 1 Gb/s when the driver reports none).
pub fn width_speed(mbps: Option<u32>) -> (u8, u8) {
    const W1X: u8 = 1;
    const W4X: u8 = 2;
    const SDR: u8 = 1;
    const DDR: u8 = 2;
    const FDR10: u8 = 8;
    const EDR: u8 = 32;
    const HDR: u8 = 64;
    const NDR: u8 = 128;
    match mbps.unwrap_or(1000) {
        0..=1000 => (W1X, SDR),
        1001..=10_000 => (W1X, FDR10),
        10_001..=20_000 => (W4X, DDR),
        20_001..=25_000 => (W1X, EDR),
        25_001..=40_000 => (W4X, FDR10),
        40_001..=100_000 => (W4X, EDR),
        100_001..=200_000 => (W4X, HDR),
        _ => (W4X, NDR),
    }
}

/// `IB_PORT_PHYS_STATE_LINK_UP`.
const PHYS_LINK_UP: u8 = 5;
/// `IB_PORT_PHYS_STATE_DISABLED`.
const PHYS_DISABLED: u8 = 3;

/// `ibv_query_port`'s answer for port 1 over an interface with `facts`, for an engine
/// with MTU `engine_mtu`. The state follows the link (ACTIVE when the interface is up
/// with carrier, DOWN otherwise: the engine owns its address, so the kernel's addresses
/// do not matter); `max_mtu` is the interface's MTU, `active_mtu` the smaller of it and
/// the engine's; one GID, link layer Ethernet, the connection-manager capability bits,
/// as siw reports.
pub fn port_attr(facts: &IfaceFacts, engine_mtu: usize) -> ibv_port_attr {
    let engine_mtu = u32::try_from(engine_mtu).unwrap_or(u32::MAX);
    let (active_width, active_speed) = width_speed(facts.speed_mbps);
    ibv_port_attr {
        state: if facts.link_up {
            IBV_PORT_ACTIVE
        } else {
            IBV_PORT_DOWN
        },
        max_mtu: mtu_enum(facts.mtu),
        active_mtu: mtu_enum(facts.mtu.min(engine_mtu)),
        gid_tbl_len: 1,
        port_cap_flags: IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP,
        max_msg_sz: u32::try_from(MAX_MSG_SIZE).unwrap_or(u32::MAX),
        active_width,
        active_speed,
        phys_state: if facts.link_up {
            PHYS_LINK_UP
        } else {
            PHYS_DISABLED
        },
        link_layer: IBV_LINK_LAYER_ETHERNET,
        ..Default::default()
    }
}

/// GID 0 as siw reports it: the MAC in the first six bytes, the rest zero.
pub fn gid0(mac: [u8; 6]) -> ibv_gid {
    let mut raw = [0u8; 16];
    raw[..6].copy_from_slice(&mac);
    ibv_gid { raw }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_the_eui64_of_the_mac() {
        let g = node_guid([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
        assert_eq!(u64::from_be(g), 0x0011_22ff_fe33_4455);
    }

    #[test]
    fn mtu_and_speed_mapping() {
        assert_eq!(mtu_enum(1500), IBV_MTU_1024);
        assert_eq!(mtu_enum(9000), IBV_MTU_4096);
        assert_eq!(mtu_enum(2048), IBV_MTU_2048);
        assert_eq!(mtu_enum(100), IBV_MTU_256);
        assert_eq!(width_speed(Some(10_000)), (1, 8));
        assert_eq!(width_speed(None), (1, 1));
        assert_eq!(width_speed(Some(100_000)), (2, 32));
    }

    #[test]
    fn limits_come_from_the_engine() {
        let a = device_attr([2, 0, 0, 0, 0, 1]);
        assert_eq!(a.max_sge, 16);
        assert_eq!(a.max_sge_rd, 1);
        assert_eq!(a.max_mr, (1 << 24) - 1);
        assert_eq!(a.max_qp_rd_atom, 0x3fff);
        assert_eq!(a.vendor_id, XWARP_VENDOR_ID);
        assert_eq!(a.phys_port_cnt, 1);
    }
}
