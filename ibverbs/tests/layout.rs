//! Checks every `#[repr(C)]` definition of `xwarp_ibverbs::abi` against the installed
//! rdma-core headers: a C program, compiled with the system C compiler against
//! `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>`, prints the size and alignment of every
//! structure, the offset, size and alignment of every field, and the value of every enum
//! constant; each number is compared with the Rust side and every mismatch is reported by
//! name. The C numbers are also checked for coverage (the listed fields of a structure leave
//! no gap but padding), so a field missing from a list is caught too.

use core::mem::{align_of, offset_of, size_of, MaybeUninit};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use xwarp_ibverbs::abi::*;

/// One field: its C designator, and the Rust offset, size and alignment.
struct Field {
    c: &'static str,
    off: usize,
    size: usize,
    align: usize,
}

/// One structure or union: its C type, and the Rust size, alignment and fields.
struct Layout {
    c_type: String,
    name: &'static str,
    size: usize,
    align: usize,
    fields: Vec<Field>,
}

fn pointee_size<T>(_: *const T) -> usize {
    size_of::<T>()
}

fn pointee_align<T>(_: *const T) -> usize {
    align_of::<T>()
}

macro_rules! field {
    ($t:ident, $($f:ident).+, $c:literal) => {{
        let value = MaybeUninit::<$t>::uninit();
        let p = value.as_ptr();
        // SAFETY: `addr_of!` computes the field's address inside `value` without reading or
        // creating a reference to the (uninitialised) memory.
        let fp = unsafe { core::ptr::addr_of!((*p).$($f).+) };
        Field { c: $c, off: offset_of!($t, $($f).+), size: pointee_size(fp), align: pointee_align(fp) }
    }};
    ($t:ident, $($f:ident).+) => {
        field!($t, $($f).+, "")
    };
}

macro_rules! layout {
    ($kw:tt $t:ident { $( $($f:ident).+ $(= $c:literal)? ),* $(,)? }) => {
        Layout {
            c_type: format!("{} {}", stringify!($kw), stringify!($t)),
            name: stringify!($t),
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: vec![$( {
                let mut f = field!($t, $($f).+ $(, $c)?);
                if f.c.is_empty() {
                    f.c = stringify!($($f).+);
                }
                f
            } ),*],
        }
    };
}

macro_rules! enums {
    ($($n:ident),* $(,)?) => {
        vec![$((stringify!($n), $n as i64)),*]
    };
}

fn layouts() -> Vec<Layout> {
    vec![
        layout!(union ibv_gid { raw, global, global.subnet_prefix, global.interface_id }),
        layout!(struct ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }),
        layout!(struct _ibv_device_ops { _dummy1, _dummy2 }),
        layout!(struct ibv_device {
            _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path
        }),
        layout!(struct ibv_context_ops {
            _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
            _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
            _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
            _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
            _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp,
            _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
            _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event
        }),
        layout!(struct ibv_context {
            device, ops, ops.poll_cq, ops.req_notify_cq, ops.post_srq_recv, ops.post_send,
            ops.post_recv, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat
        }),
        layout!(struct verbs_context {
            query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
            create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
            modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
            modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
            post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
            create_wq, query_rt_values, create_cq_ex, priv_ = "priv", query_device_ex,
            ibv_destroy_flow, ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp,
            create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, _ABI_placeholder3,
            sz, context, context.ops.post_send, context.abi_compat
        }),
        layout!(struct ibv_device_attr {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt
        }),
        layout!(struct ibv_port_attr {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
            qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
            init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
            port_cap_flags2
        }),
        layout!(struct ibv_pd { context, handle }),
        layout!(struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }),
        layout!(struct ibv_comp_channel { context, fd, refcnt }),
        layout!(struct ibv_cq {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed
        }),
        layout!(struct ibv_srq {
            context, srq_context, pd, handle, mutex, cond, events_completed
        }),
        layout!(struct ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed
        }),
        layout!(struct ibv_ah { context, pd, handle }),
        layout!(struct ibv_sge { addr, length, lkey }),
        layout!(struct ibv_mw_bind_info { mr, addr, length, mw_access_flags }),
        layout!(struct ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags,
            imm.imm_data = "imm_data", imm.invalidate_rkey = "invalidate_rkey",
            wr, wr.rdma, wr.rdma.remote_addr, wr.rdma.rkey, wr.atomic, wr.atomic.remote_addr,
            wr.atomic.compare_add, wr.atomic.swap, wr.atomic.rkey, wr.ud, wr.ud.ah, wr.ud.remote_qpn,
            wr.ud.remote_qkey, qp_type, qp_type.xrc, qp_type.xrc.remote_srqn,
            ext.bind_mw = "bind_mw", ext.bind_mw.mw = "bind_mw.mw",
            ext.bind_mw.rkey = "bind_mw.rkey", ext.bind_mw.bind_info = "bind_mw.bind_info",
            ext.tso = "tso", ext.tso.hdr = "tso.hdr", ext.tso.hdr_sz = "tso.hdr_sz",
            ext.tso.mss = "tso.mss"
        }),
        layout!(struct ibv_recv_wr { wr_id, next, sg_list, num_sge }),
        layout!(struct ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len, imm.imm_data = "imm_data",
            imm.invalidated_rkey = "invalidated_rkey", qp_num, src_qp, wc_flags, pkey_index,
            slid, sl, dlid_path_bits
        }),
        layout!(struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }),
        layout!(struct ibv_ah_attr {
            grh, dlid, sl, src_path_bits, static_rate, is_global, port_num
        }),
        layout!(struct ibv_srq_attr { max_wr, max_sge, srq_limit }),
        layout!(struct ibv_srq_init_attr { srq_context, attr }),
        layout!(struct ibv_qp_cap {
            max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data
        }),
        layout!(struct ibv_qp_init_attr {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all
        }),
        layout!(struct ibv_rx_hash_conf {
            rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask
        }),
        layout!(struct ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags
        }),
        layout!(struct ibv_qp_attr {
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
            en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
            port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit
        }),
        layout!(struct ibv_async_event {
            element, element.cq, element.qp, element.srq, element.wq, element.port_num,
            event_type
        }),
        layout!(struct rdma_event_channel { fd }),
        layout!(struct rdma_ib_addr { sgid, dgid, pkey }),
        layout!(struct rdma_addr {
            src.addr = "src_addr", src.sin = "src_sin", src.sin6 = "src_sin6",
            src.storage = "src_storage", dst.addr = "dst_addr", dst.sin = "dst_sin",
            dst.sin6 = "dst_sin6", dst.storage = "dst_storage", addr, addr.ibaddr
        }),
        layout!(struct rdma_route { addr, path_rec, num_paths }),
        layout!(struct rdma_cm_id {
            verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
            recv_cq_channel, recv_cq, srq, pd, qp_type
        }),
        layout!(struct rdma_conn_param {
            private_data, private_data_len, responder_resources, initiator_depth, flow_control,
            retry_count, rnr_retry_count, srq, qp_num
        }),
        layout!(struct rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }),
        layout!(struct rdma_cm_event {
            id, listen_id, event, status, param, param.conn, param.ud, param.conn.qp_num
        }),
        layout!(struct rdma_addrinfo {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
            ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
            ai_connect_len, ai_connect, ai_next
        }),
    ]
}

fn constants() -> Vec<(&'static str, i64)> {
    enums![
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND,
        IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV,
        IBV_WR_BIND_MW,
        IBV_WR_SEND_WITH_INV,
        IBV_WR_TSO,
        IBV_WR_DRIVER1,
        IBV_WR_ATOMIC_WRITE,
        IBV_SEND_FENCE,
        IBV_SEND_SIGNALED,
        IBV_SEND_SOLICITED,
        IBV_SEND_INLINE,
        IBV_SEND_IP_CSUM,
        IBV_WC_SUCCESS,
        IBV_WC_LOC_LEN_ERR,
        IBV_WC_LOC_QP_OP_ERR,
        IBV_WC_LOC_EEC_OP_ERR,
        IBV_WC_LOC_PROT_ERR,
        IBV_WC_WR_FLUSH_ERR,
        IBV_WC_MW_BIND_ERR,
        IBV_WC_BAD_RESP_ERR,
        IBV_WC_LOC_ACCESS_ERR,
        IBV_WC_REM_INV_REQ_ERR,
        IBV_WC_REM_ACCESS_ERR,
        IBV_WC_REM_OP_ERR,
        IBV_WC_RETRY_EXC_ERR,
        IBV_WC_RNR_RETRY_EXC_ERR,
        IBV_WC_LOC_RDD_VIOL_ERR,
        IBV_WC_REM_INV_RD_REQ_ERR,
        IBV_WC_REM_ABORT_ERR,
        IBV_WC_INV_EECN_ERR,
        IBV_WC_INV_EEC_STATE_ERR,
        IBV_WC_FATAL_ERR,
        IBV_WC_RESP_TIMEOUT_ERR,
        IBV_WC_GENERAL_ERR,
        IBV_WC_TM_ERR,
        IBV_WC_TM_RNDV_INCOMPLETE,
        IBV_WC_SEND,
        IBV_WC_RDMA_WRITE,
        IBV_WC_RDMA_READ,
        IBV_WC_COMP_SWAP,
        IBV_WC_FETCH_ADD,
        IBV_WC_BIND_MW,
        IBV_WC_LOCAL_INV,
        IBV_WC_TSO,
        IBV_WC_ATOMIC_WRITE,
        IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM,
        IBV_WC_GRH,
        IBV_WC_WITH_IMM,
        IBV_WC_IP_CSUM_OK,
        IBV_WC_WITH_INV,
        IBV_QPS_RESET,
        IBV_QPS_INIT,
        IBV_QPS_RTR,
        IBV_QPS_RTS,
        IBV_QPS_SQD,
        IBV_QPS_SQE,
        IBV_QPS_ERR,
        IBV_QPS_UNKNOWN,
        IBV_QPT_RC,
        IBV_QPT_UC,
        IBV_QPT_UD,
        IBV_QPT_RAW_PACKET,
        IBV_QPT_XRC_SEND,
        IBV_QPT_XRC_RECV,
        IBV_QPT_DRIVER,
        IBV_QP_STATE,
        IBV_QP_CUR_STATE,
        IBV_QP_EN_SQD_ASYNC_NOTIFY,
        IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX,
        IBV_QP_PORT,
        IBV_QP_QKEY,
        IBV_QP_AV,
        IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT,
        IBV_QP_RNR_RETRY,
        IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_ALT_PATH,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_PATH_MIG_STATE,
        IBV_QP_CAP,
        IBV_QP_DEST_QPN,
        IBV_QP_RATE_LIMIT,
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC,
        IBV_ACCESS_MW_BIND,
        IBV_ACCESS_ZERO_BASED,
        IBV_ACCESS_ON_DEMAND,
        IBV_ACCESS_HUGETLB,
        IBV_ACCESS_RELAXED_ORDERING,
        IBV_EVENT_CQ_ERR,
        IBV_EVENT_QP_FATAL,
        IBV_EVENT_QP_REQ_ERR,
        IBV_EVENT_QP_ACCESS_ERR,
        IBV_EVENT_COMM_EST,
        IBV_EVENT_SQ_DRAINED,
        IBV_EVENT_PATH_MIG,
        IBV_EVENT_PATH_MIG_ERR,
        IBV_EVENT_DEVICE_FATAL,
        IBV_EVENT_PORT_ACTIVE,
        IBV_EVENT_PORT_ERR,
        IBV_EVENT_LID_CHANGE,
        IBV_EVENT_PKEY_CHANGE,
        IBV_EVENT_SM_CHANGE,
        IBV_EVENT_SRQ_ERR,
        IBV_EVENT_SRQ_LIMIT_REACHED,
        IBV_EVENT_QP_LAST_WQE_REACHED,
        IBV_EVENT_CLIENT_REREGISTER,
        IBV_EVENT_GID_CHANGE,
        IBV_EVENT_WQ_FATAL,
        IBV_MTU_256,
        IBV_MTU_512,
        IBV_MTU_1024,
        IBV_MTU_2048,
        IBV_MTU_4096,
        IBV_PORT_NOP,
        IBV_PORT_DOWN,
        IBV_PORT_INIT,
        IBV_PORT_ARMED,
        IBV_PORT_ACTIVE,
        IBV_PORT_ACTIVE_DEFER,
        IBV_ATOMIC_NONE,
        IBV_ATOMIC_HCA,
        IBV_ATOMIC_GLOB,
        IBV_MIG_MIGRATED,
        IBV_MIG_REARM,
        IBV_MIG_ARMED,
        IBV_SRQ_MAX_WR,
        IBV_SRQ_LIMIT,
        IBV_MW_TYPE_1,
        IBV_MW_TYPE_2,
        IBV_LINK_LAYER_UNSPECIFIED,
        IBV_LINK_LAYER_INFINIBAND,
        IBV_LINK_LAYER_ETHERNET,
        IBV_GID_TYPE_IB,
        IBV_GID_TYPE_ROCE_V1,
        IBV_GID_TYPE_ROCE_V2,
        IBV_PORT_CM_SUP,
        IBV_PORT_DEVICE_MGMT_SUP,
        RDMA_CM_EVENT_ADDR_RESOLVED,
        RDMA_CM_EVENT_ADDR_ERROR,
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR,
        RDMA_CM_EVENT_UNREACHABLE,
        RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED,
        RDMA_CM_EVENT_DISCONNECTED,
        RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN,
        RDMA_CM_EVENT_MULTICAST_ERROR,
        RDMA_CM_EVENT_ADDR_CHANGE,
        RDMA_CM_EVENT_TIMEWAIT_EXIT,
        RDMA_PS_IPOIB,
        RDMA_PS_TCP,
        RDMA_PS_UDP,
        RDMA_PS_IB,
        RDMA_OPTION_ID,
        RDMA_OPTION_IB,
        RDMA_OPTION_ID_TOS,
        RDMA_OPTION_ID_REUSEADDR,
        RDMA_OPTION_ID_AFONLY,
        RDMA_OPTION_ID_ACK_TIMEOUT,
        RDMA_OPTION_IB_PATH,
        RAI_PASSIVE,
        RAI_NUMERICHOST,
        RAI_NOROUTE,
        RAI_FAMILY,
        RDMA_MAX_RESP_RES,
        RDMA_MAX_INIT_DEPTH,
        IBV_NODE_UNKNOWN,
        IBV_NODE_CA,
        IBV_NODE_SWITCH,
        IBV_NODE_ROUTER,
        IBV_NODE_RNIC,
        IBV_NODE_USNIC,
        IBV_NODE_USNIC_UDP,
        IBV_NODE_UNSPECIFIED,
        IBV_TRANSPORT_UNKNOWN,
        IBV_TRANSPORT_IB,
        IBV_TRANSPORT_IWARP,
        IBV_TRANSPORT_USNIC,
        IBV_TRANSPORT_USNIC_UDP,
        IBV_TRANSPORT_UNSPECIFIED,
        IBV_SYSFS_NAME_MAX,
        IBV_SYSFS_PATH_MAX,
        IBV_QP_INIT_ATTR_PD,
        IBV_QP_INIT_ATTR_XRCD,
        IBV_QP_INIT_ATTR_CREATE_FLAGS,
        IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
        IBV_QP_INIT_ATTR_IND_TABLE,
        IBV_QP_INIT_ATTR_RX_HASH,
        IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    ]
}

const HEADERS: [&str; 3] = [
    "/usr/include/infiniband/verbs.h",
    "/usr/include/rdma/rdma_cma.h",
    "/usr/include/rdma/rdma_verbs.h",
];

/// Makes sure the rdma-core headers are installed: installs `libibverbs-dev` and
/// `librdmacm-dev` when root and they are missing (once per test process, so the tests do not
/// race on the dpkg lock). Returns why they are unavailable, if so.
fn ensure_headers() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(install_headers).clone()
}

fn install_headers() -> Result<(), String> {
    let present = || HEADERS.iter().all(|h| Path::new(h).exists());
    if present() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("rdma-core headers missing and not root to install them".into());
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            // Another apt (a parallel test, unattended-upgrades) may hold the lock a while.
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("apt-get: {e}"))
    };
    let install = [
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "libibverbs-dev",
        "librdmacm-dev",
    ];
    let mut status = apt(&install)?;
    if !status.success() {
        // Empty or stale package lists: refresh them once and retry.
        apt(&["update", "-qq"])?;
        status = apt(&install)?;
    }
    if status.success() && present() {
        Ok(())
    } else {
        Err(format!(
            "apt-get install libibverbs-dev librdmacm-dev: {status}"
        ))
    }
}

/// The C program that prints the headers' view of every listed layout and constant.
fn c_program(layouts: &[Layout], consts: &[(&str, i64)]) -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\
         #include <rdma/rdma_cma.h>\n#include <rdma/rdma_verbs.h>\nint main(void) {\n",
    );
    for l in layouts {
        let t = &l.c_type;
        writeln!(
            c,
            "  printf(\"S {} %zu %zu\\n\", sizeof({t}), _Alignof({t}));",
            l.name
        )
        .unwrap();
        for f in &l.fields {
            let m = format!("((({t} *)0)->{})", f.c);
            writeln!(
                c,
                "  printf(\"F {} {} %zu %zu %zu\\n\", offsetof({t}, {}), sizeof{m}, __alignof__{m});",
                l.name, f.c, f.c
            )
            .unwrap();
        }
    }
    for (n, _) in consts {
        writeln!(c, "  printf(\"E {n} %lld\\n\", (long long)({n}));").unwrap();
    }
    c.push_str("  return 0;\n}\n");
    c
}

/// Compiles and runs the C program; returns its output.
fn run_c(src: &str) -> Result<String, String> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ibverbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let c_file = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c_file, src).map_err(|e| format!("{}: {e}", c_file.display()))?;
    let out = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&c_file)
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe)
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !run.status.success() {
        return Err(format!("layout program failed: {}", run.status));
    }
    String::from_utf8(run.stdout).map_err(|e| e.to_string())
}

/// Parses the C program's output: `S name size align`, `F name field off size align`,
/// `E name value`.
fn parse(out: &str) -> (BTreeMap<String, [u64; 3]>, BTreeMap<String, i64>) {
    let mut numbers = BTreeMap::new();
    let mut values = BTreeMap::new();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let n = |s: &str| {
            s.parse::<u64>()
                .unwrap_or_else(|_| panic!("bad number in {line:?}"))
        };
        match w.as_slice() {
            ["S", name, size, align] => {
                numbers.insert(name.to_string(), [n(size), n(align), 0]);
            }
            ["F", name, field, off, size, align] => {
                numbers.insert(format!("{name}.{field}"), [n(off), n(size), n(align)]);
            }
            ["E", name, v] => {
                values.insert(
                    name.to_string(),
                    v.parse()
                        .unwrap_or_else(|_| panic!("bad value in {line:?}")),
                );
            }
            _ => panic!("unexpected line from the C program: {line:?}"),
        }
    }
    (numbers, values)
}

/// Every way the Rust side differs from the C side.
fn mismatches(layouts: &[Layout], consts: &[(&str, i64)], c: &str) -> Vec<String> {
    let (numbers, values) = parse(c);
    let mut bad = Vec::new();
    for l in layouts {
        let Some(&[size, align, _]) = numbers.get(l.name) else {
            bad.push(format!("{}: missing from the C output", l.name));
            continue;
        };
        if (size, align) != (l.size as u64, l.align as u64) {
            bad.push(format!(
                "{}: C size/align {size}/{align}, Rust {}/{}",
                l.name, l.size, l.align
            ));
        }
        for f in &l.fields {
            let key = format!("{}.{}", l.name, f.c);
            let Some(&[off, fsize, falign]) = numbers.get(&key) else {
                bad.push(format!("{key}: missing from the C output"));
                continue;
            };
            if (off, fsize, falign) != (f.off as u64, f.size as u64, f.align as u64) {
                bad.push(format!(
                    "{key}: C offset/size/align {off}/{fsize}/{falign}, Rust {}/{}/{}",
                    f.off, f.size, f.align
                ));
            }
        }
        // Coverage, on the C numbers: the top-level fields, in offset order, must tile the
        // structure with nothing between them but alignment padding.
        let mut top: Vec<[u64; 3]> = l
            .fields
            .iter()
            .filter(|f| !f.c.contains('.'))
            .filter_map(|f| numbers.get(&format!("{}.{}", l.name, f.c)).copied())
            .collect();
        top.sort();
        let mut end = 0u64;
        for [off, fsize, falign] in top {
            let expected = end.div_ceil(falign) * falign;
            if off > end && off != expected {
                bad.push(format!(
                    "{}: gap before the field at offset {off} (previous fields end at {end}): a field is missing from the list",
                    l.name
                ));
            }
            end = end.max(off + fsize);
        }
        if end.div_ceil(align.max(1)) * align.max(1) != size {
            bad.push(format!(
                "{}: listed fields end at {end} but the size is {size}: a field is missing from the list",
                l.name
            ));
        }
    }
    for (name, v) in consts {
        match values.get(*name) {
            None => bad.push(format!("{name}: missing from the C output")),
            Some(c) if c != v => bad.push(format!("{name}: C value {c}, Rust {v}")),
            Some(_) => {}
        }
    }
    bad
}

/// One debugging-information entry of `readelf --debug-dump=info`.
struct Die {
    tag: String,
    name: Option<String>,
    type_ref: Option<u64>,
    has_children: bool,
    children: Vec<usize>,
}

/// Parses the DIE tree out of readelf's text dump (the parts the member check needs).
fn parse_dies(dump: &str) -> (Vec<Die>, BTreeMap<u64, usize>) {
    let mut dies: Vec<Die> = Vec::new();
    let mut by_offset = BTreeMap::new();
    let mut stack: Vec<usize> = Vec::new();
    for line in dump.lines() {
        let t = line.trim_start();
        // A DIE header: " <2><5fc0>: Abbrev Number: 25 (DW_TAG_member)".
        if let Some(rest) = t.strip_prefix('<') {
            if let (Some((depth, rest)), true) =
                (rest.split_once('>'), t.contains("Abbrev Number:"))
            {
                let Ok(depth) = depth.parse::<usize>() else {
                    continue;
                };
                let off = rest
                    .strip_prefix('<')
                    .and_then(|r| r.split_once('>'))
                    .and_then(|(o, _)| u64::from_str_radix(o, 16).ok());
                let Some(tag) = t
                    .split_once('(')
                    .map(|(_, tag)| tag.trim_end_matches(')').to_string())
                else {
                    continue; // "Abbrev Number: 0": the end of a child list.
                };
                stack.truncate(depth);
                let idx = dies.len();
                if let Some(&parent) = stack.last() {
                    dies[parent].children.push(idx);
                    dies[parent].has_children = true;
                }
                dies.push(Die {
                    tag,
                    name: None,
                    type_ref: None,
                    has_children: false,
                    children: Vec::new(),
                });
                if let Some(off) = off {
                    by_offset.insert(off, idx);
                }
                while stack.len() < depth {
                    stack.push(usize::MAX);
                }
                stack.push(idx);
                continue;
            }
            // An attribute: "<5fc1>   DW_AT_name        : (indirect string, ...): wr_id".
            let Some(die) = dies.last_mut() else { continue };
            if let Some((_, attr)) = t.split_once("DW_AT_") {
                let (key, value) = attr.split_once(':').unwrap_or((attr, ""));
                match key.trim() {
                    "name" => die.name = value.rsplit(": ").next().map(|v| v.trim().to_string()),
                    "type" => {
                        die.type_ref = value
                            .trim()
                            .trim_start_matches("<0x")
                            .trim_end_matches('>')
                            .parse::<String>()
                            .ok()
                            .and_then(|h| u64::from_str_radix(&h, 16).ok())
                    }
                    _ => {}
                }
            }
        }
    }
    (dies, by_offset)
}

/// The C designators of every member of `die`, with anonymous members flattened (as C
/// does) and members of unnamed aggregate type descended into (`wr.rdma.rkey`).
fn members(
    dies: &[Die],
    by_offset: &BTreeMap<u64, usize>,
    die: usize,
    prefix: &str,
    out: &mut Vec<String>,
) {
    for &c in &dies[die].children {
        let m = &dies[c];
        if m.tag != "DW_TAG_member" {
            continue;
        }
        let ty = m.type_ref.and_then(|r| by_offset.get(&r)).copied();
        let unnamed_aggregate = ty.filter(|&t| {
            let t = &dies[t];
            t.name.is_none() && (t.tag == "DW_TAG_union_type" || t.tag == "DW_TAG_structure_type")
        });
        match (&m.name, unnamed_aggregate) {
            (Some(name), Some(t)) => {
                out.push(format!("{prefix}{name}"));
                members(dies, by_offset, t, &format!("{prefix}{name}."), out);
            }
            (Some(name), None) => out.push(format!("{prefix}{name}")),
            (None, Some(t)) => members(dies, by_offset, t, prefix, out),
            (None, None) => out.push(format!("{prefix}<anonymous member of unknown type>")),
        }
    }
}

/// Every member the headers declare (per the compiler's debug info) that a layout does not
/// check; and every layout whose type the debug info lacks.
fn unchecked_members(layouts: &[Layout], dump: &str) -> Vec<String> {
    let (dies, by_offset) = parse_dies(dump);
    let mut bad = Vec::new();
    for l in layouts {
        let (kind, name) = l.c_type.split_once(' ').unwrap_or(("struct", l.name));
        let tag = if kind == "union" {
            "DW_TAG_union_type"
        } else {
            "DW_TAG_structure_type"
        };
        let Some(die) = dies
            .iter()
            .position(|d| d.tag == tag && d.name.as_deref() == Some(name) && d.has_children)
        else {
            bad.push(format!("{}: no definition in the debug info", l.name));
            continue;
        };
        let mut all = Vec::new();
        members(&dies, &by_offset, die, "", &mut all);
        for m in all {
            if !l.fields.iter().any(|f| f.c == m) {
                bad.push(format!(
                    "{}.{m}: declared in the header but not checked",
                    l.name
                ));
            }
        }
    }
    bad
}

/// Compiles the headers with debug info and dumps it with readelf.
fn debug_info(dir: &Path) -> Result<String, String> {
    let c_file = dir.join("members.c");
    let obj = dir.join("members.o");
    std::fs::write(
        &c_file,
        "#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n#include <rdma/rdma_verbs.h>\n",
    )
    .map_err(|e| format!("{}: {e}", c_file.display()))?;
    let out = Command::new("cc")
        .args([
            "-c",
            "-g",
            "-gdwarf-4",
            "-fno-eliminate-unused-debug-types",
            "-o",
        ])
        .arg(&obj)
        .arg(&c_file)
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let dump = Command::new("readelf")
        .arg("--debug-dump=info")
        .arg(&obj)
        .output()
        .map_err(|e| format!("readelf: {e}"))?;
    if !dump.status.success() {
        return Err(format!("readelf failed: {}", dump.status));
    }
    String::from_utf8(dump.stdout).map_err(|e| e.to_string())
}

/// Every member of every checked structure, as the compiler's debug info lists them, is
/// in the layout lists (so no field of the header goes unchecked).
#[test]
fn every_header_member_is_checked() {
    if let Err(why) = ensure_headers() {
        println!("SKIPPED: ibverbs member check: {why}");
        return;
    }
    if Command::new("readelf").arg("--version").output().is_err() {
        println!("SKIPPED: ibverbs member check: no readelf (binutils)");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ibverbs-members-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = debug_info(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let bad = unchecked_members(&layouts(), &dump.unwrap());
    assert!(
        bad.is_empty(),
        "{} header members unchecked:\n  {}",
        bad.len(),
        bad.join("\n  ")
    );
}

#[test]
fn layouts_match_the_installed_headers() {
    if let Err(why) = ensure_headers() {
        println!("SKIPPED: ibverbs layout check: {why}");
        return;
    }
    if Command::new("cc").arg("--version").output().is_err() {
        println!("SKIPPED: ibverbs layout check: no C compiler (cc)");
        return;
    }
    let layouts = layouts();
    let consts = constants();
    let out = run_c(&c_program(&layouts, &consts)).unwrap();
    let bad = mismatches(&layouts, &consts, &out);
    let fields: usize = layouts.iter().map(|l| l.fields.len()).sum();
    assert!(
        bad.is_empty(),
        "{} ABI mismatches against the installed headers:\n  {}",
        bad.len(),
        bad.join("\n  ")
    );
    println!(
        "checked {} structures, {fields} fields, {} constants against the installed headers",
        layouts.len(),
        consts.len()
    );
}

/// The checker itself must catch a wrong offset, size, constant and a missing field.
#[test]
fn mismatches_are_reported_by_name() {
    let layouts = vec![Layout {
        c_type: "struct t".into(),
        name: "t",
        size: 16,
        align: 8,
        fields: vec![
            Field {
                c: "a",
                off: 0,
                size: 4,
                align: 4,
            },
            Field {
                c: "c",
                off: 8,
                size: 8,
                align: 8,
            },
        ],
    }];
    let consts = vec![("K", 3)];
    // C says: c is at 12 (not 8), a field between a and c is unlisted, size 24, K = 4.
    let c = "S t 24 8\nF t a 0 4 4\nF t c 16 8 8\nE K 4\n";
    let bad = mismatches(&layouts, &consts, c);
    let text = bad.join("\n");
    assert!(text.contains("t: C size/align 24/8, Rust 16/8"), "{text}");
    assert!(
        text.contains("t.c: C offset/size/align 16/8/8, Rust 8/8/8"),
        "{text}"
    );
    assert!(
        text.contains("t: gap before the field at offset 16"),
        "{text}"
    );
    assert!(text.contains("K: C value 4, Rust 3"), "{text}");
}
