//! Netlink dumps for the device report ([`super::caps`]): a request/dump transport over any
//! netlink protocol, the attribute walker, the rtnetlink link dump (RTM_GETLINK with
//! NLM_F_DUMP: name, MTU, state, queue counts, kind, attached XDP programs) and the
//! generic-netlink `netdev` family (Linux 6.3+: `xdp-features`, `xdp-zc-max-segs`,
//! `xdp-rx-metadata-features`, `xsk-features` per ifindex, include/uapi/linux/netdev.h).
//!
//! Hand-written on `libc` like the rest of this module (`netlink.rs`, `bpf.rs`): the two
//! requests need a few dozen lines, while the netlink crates would add a dependency tree
//! to the engine's crate and still leave the `netdev` family's attributes to be declared
//! here. Everything runs in the calling thread's network namespace.

use std::io;
use std::os::fd::AsRawFd;

use super::netlink::{attr, attrs, socket, u16_at, u32_at};

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_OPERSTATE: u16 = 16;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_NUM_TX_QUEUES: u16 = 31;
const IFLA_NUM_RX_QUEUES: u16 = 32;
const IFLA_CARRIER: u16 = 33;
const IFLA_XDP: u16 = 43;
const IFLA_MIN_MTU: u16 = 50;
const IFLA_MAX_MTU: u16 = 51;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
const NETDEV_A_DEV_XDP_ZC_MAX_SEGS: u16 = 4;
const NETDEV_A_DEV_XDP_RX_METADATA_FEATURES: u16 = 5;
const NETDEV_A_DEV_XSK_FEATURES: u16 = 6;

/// `IFF_UP`.
pub const IFF_UP: u32 = 1;

/// An unsigned attribute of 1, 2, 4 or 8 bytes (the kernel's `uint` attributes may be
/// either width), native byte order.
fn uint(b: &[u8]) -> Option<u64> {
    match b.len() {
        1 => Some(u64::from(b[0])),
        2 => u16_at(b, 0).map(u64::from),
        4 => u32_at(b, 0).map(u64::from),
        8 => Some(u64::from_ne_bytes(b.try_into().ok()?)),
        _ => None,
    }
}

/// A NUL-terminated (or not) string attribute.
fn string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A netlink request: header (length patched by [`finish`]) followed by `body`.
fn request(ty: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid
    msg.extend_from_slice(body);
    msg
}

/// Split a datagram into `(type, body)` netlink messages.
fn messages(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u32_at(b, 0)? as usize;
        let ty = u16_at(b, 4)?;
        if len < 16 || len > b.len() {
            return None;
        }
        let body = &b[16..len];
        b = b.get((len + 3) & !3..).unwrap_or(&[]);
        Some((ty, body))
    })
}

/// Send `msg` on a `protocol` netlink socket and collect the bodies of every reply of type
/// `want` until the dump ends (NLMSG_DONE) or, for a plain request, the first reply. An
/// NLMSG_ERROR with a non-zero code is returned as that errno.
fn transact(protocol: i32, msg: &[u8], want: u16, dump: bool) -> io::Result<Vec<Vec<u8>>> {
    let sock = socket(protocol)?;
    // SAFETY: an all-zero sockaddr_nl is valid (pid 0 = the kernel).
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: valid fd, buffer and address of the stated sizes.
    let r = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // A dump of a few hundred interfaces spans a few dozen datagrams; bound the loop anyway.
    for _ in 0..4096 {
        // SAFETY: valid fd and buffer of the stated size.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for (ty, body) in messages(&buf[..n as usize]) {
            match ty {
                NLMSG_ERROR | NLMSG_DONE => {
                    let err = u32_at(body, 0).unwrap_or(0) as i32;
                    if err < 0 {
                        return Err(io::Error::from_raw_os_error(-err));
                    }
                    return Ok(out);
                }
                t if t == want => {
                    out.push(body.to_vec());
                    if !dump {
                        return Ok(out);
                    }
                }
                _ => {}
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "netlink: the dump did not end",
    ))
}

/// One interface as the rtnetlink link dump reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub ifindex: u32,
    /// Interface name.
    pub name: String,
    /// `IFF_*` flags.
    pub flags: u32,
    /// MTU.
    pub mtu: u32,
    /// Smallest and largest MTU the device accepts, when reported.
    pub mtu_range: Option<(u32, u32)>,
    /// RFC 2863 operational state (`IF_OPER_*`: 6 up, 2 down, 0 unknown, ...).
    pub operstate: u8,
    /// Carrier (link detected), when reported.
    pub carrier: Option<bool>,
    /// Number of TX and RX queues (`numtxqueues`, `numrxqueues`).
    pub tx_queues: u32,
    /// See `tx_queues`.
    pub rx_queues: u32,
    /// The link kind of a virtual device (`veth`, `bridge`, ...), from IFLA_LINKINFO.
    pub kind: Option<String>,
    /// XDP program ids attached in driver, generic (skb) and offload mode (0 = none).
    pub xdp_drv: u32,
    /// See `xdp_drv`.
    pub xdp_skb: u32,
    /// See `xdp_drv`.
    pub xdp_hw: u32,
}

/// Parse one RTM_NEWLINK body (`struct ifinfomsg` + attributes). `None` if it is too short.
pub fn parse_link(body: &[u8]) -> Option<Link> {
    let mut l = Link {
        ifindex: u32_at(body, 4)?,
        flags: u32_at(body, 8)?,
        ..Link::default()
    };
    let (mut min_mtu, mut max_mtu) = (None, None);
    for (ty, v) in attrs(body.get(16..)?) {
        match ty {
            IFLA_IFNAME => l.name = string(v),
            IFLA_MTU => l.mtu = uint(v).unwrap_or(0) as u32,
            IFLA_MIN_MTU => min_mtu = uint(v).map(|m| m as u32),
            IFLA_MAX_MTU => max_mtu = uint(v).map(|m| m as u32),
            IFLA_OPERSTATE => l.operstate = v.first().copied().unwrap_or(0),
            IFLA_CARRIER => l.carrier = v.first().map(|&c| c != 0),
            IFLA_NUM_TX_QUEUES => l.tx_queues = uint(v).unwrap_or(0) as u32,
            IFLA_NUM_RX_QUEUES => l.rx_queues = uint(v).unwrap_or(0) as u32,
            IFLA_LINKINFO => {
                l.kind = attrs(v)
                    .find(|&(t, _)| t == IFLA_INFO_KIND)
                    .map(|(_, k)| string(k))
            }
            IFLA_XDP => {
                let (mut single, mut attached) = (0, 0);
                for (xt, xv) in attrs(v) {
                    let id = uint(xv).unwrap_or(0) as u32;
                    match xt {
                        IFLA_XDP_ATTACHED => attached = xv.first().copied().unwrap_or(0),
                        IFLA_XDP_PROG_ID => single = id,
                        IFLA_XDP_DRV_PROG_ID => l.xdp_drv = id,
                        IFLA_XDP_SKB_PROG_ID => l.xdp_skb = id,
                        IFLA_XDP_HW_PROG_ID => l.xdp_hw = id,
                        _ => {}
                    }
                }
                // One program: the kernel may give only IFLA_XDP_PROG_ID and the mode
                // (XDP_ATTACHED_DRV 1, SKB 2, HW 3).
                if single != 0 && l.xdp_drv == 0 && l.xdp_skb == 0 && l.xdp_hw == 0 {
                    match attached {
                        2 => l.xdp_skb = single,
                        3 => l.xdp_hw = single,
                        _ => l.xdp_drv = single,
                    }
                }
            }
            _ => {}
        }
    }
    l.mtu_range = min_mtu.zip(max_mtu).filter(|&(a, b)| a != 0 || b != 0);
    Some(l)
}

/// Every interface of this network namespace (RTM_GETLINK dump), in ifindex order.
pub fn links() -> io::Result<Vec<Link>> {
    // struct ifinfomsg, all zero (AF_UNSPEC, every interface).
    let msg = request(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, &[0u8; 16]);
    let mut v: Vec<Link> = transact(libc::NETLINK_ROUTE, &msg, RTM_NEWLINK, true)
        .map_err(|e| io::Error::new(e.kind(), format!("rtnetlink link dump: {e}")))?
        .iter()
        .filter_map(|b| parse_link(b))
        .collect();
    v.sort_by_key(|l| l.ifindex);
    Ok(v)
}

/// What the `netdev` generic-netlink family reports for one interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetdevInfo {
    /// Interface index.
    pub ifindex: u32,
    /// `NETDEV_XDP_ACT_*` bits (names in [`super::caps::XDP_FEATURE_NAMES`]).
    pub xdp_features: u64,
    /// Largest number of buffers of a zero-copy multi-buffer frame (`xdp-zc-max-segs`;
    /// 1 without zero-copy multi-buffer).
    pub xdp_zc_max_segs: Option<u32>,
    /// `NETDEV_XDP_RX_METADATA_*` bits (timestamp 1, hash 2, VLAN tag 4).
    pub xdp_rx_metadata: Option<u64>,
    /// `NETDEV_XSK_FLAGS_*` bits: AF_XDP TX metadata the driver honours in zero-copy mode
    /// (TX timestamp 1, TX checksum 2, launch time 4). Absent before Linux 6.8.
    pub xsk_features: Option<u64>,
}

/// Parse one `netdev` `dev-get` reply body (`struct genlmsghdr` + attributes).
pub fn parse_netdev(body: &[u8]) -> Option<NetdevInfo> {
    let mut d = NetdevInfo::default();
    let mut have_index = false;
    for (ty, v) in attrs(body.get(4..)?) {
        match ty {
            NETDEV_A_DEV_IFINDEX => {
                d.ifindex = uint(v)? as u32;
                have_index = true;
            }
            NETDEV_A_DEV_XDP_FEATURES => d.xdp_features = uint(v)?,
            NETDEV_A_DEV_XDP_ZC_MAX_SEGS => d.xdp_zc_max_segs = uint(v).map(|s| s as u32),
            NETDEV_A_DEV_XDP_RX_METADATA_FEATURES => d.xdp_rx_metadata = uint(v),
            NETDEV_A_DEV_XSK_FEATURES => d.xsk_features = uint(v),
            _ => {}
        }
    }
    have_index.then_some(d)
}

fn genl_header(cmd: u8, version: u8) -> Vec<u8> {
    vec![cmd, version, 0, 0]
}

/// The id of generic-netlink family `name`; `Ok(None)` if this kernel does not have it.
pub fn family_id(name: &str) -> io::Result<Option<u16>> {
    let mut body = genl_header(CTRL_CMD_GETFAMILY, 1);
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    attr(&mut body, CTRL_ATTR_FAMILY_NAME, &cname);
    let msg = request(GENL_ID_CTRL, NLM_F_REQUEST, &body);
    match transact(libc::NETLINK_GENERIC, &msg, GENL_ID_CTRL, false) {
        Ok(replies) => Ok(replies.first().and_then(|b| {
            attrs(b.get(4..)?)
                .find(|&(t, _)| t == CTRL_ATTR_FAMILY_ID)
                .and_then(|(_, v)| u16_at(v, 0))
        })),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("generic netlink: resolving family {name}: {e}"),
        )),
    }
}

/// Every interface the `netdev` family knows in this namespace (`dev-get` dump);
/// `Ok(None)` when the kernel has no `netdev` family (before Linux 6.3, e.g. Debian 12).
pub fn netdev_dump() -> io::Result<Option<Vec<NetdevInfo>>> {
    let Some(id) = family_id("netdev")? else {
        return Ok(None);
    };
    let msg = request(
        id,
        NLM_F_REQUEST | NLM_F_DUMP,
        &genl_header(NETDEV_CMD_DEV_GET, 1),
    );
    let replies = transact(libc::NETLINK_GENERIC, &msg, id, true)
        .map_err(|e| io::Error::new(e.kind(), format!("netdev dev-get dump: {e}")))?;
    Ok(Some(
        replies.iter().filter_map(|b| parse_netdev(b)).collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::afxdp::netlink::NLA_F_NESTED;

    fn link_body(attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        b[4..8].copy_from_slice(&7u32.to_ne_bytes());
        b[8..12].copy_from_slice(&(IFF_UP | 0x10000).to_ne_bytes());
        for (t, v) in attrs {
            attr(&mut b, *t, v);
        }
        b
    }

    #[test]
    fn link_attributes_parse() {
        let mut linkinfo = Vec::new();
        attr(&mut linkinfo, IFLA_INFO_KIND, b"veth\0");
        let mut xdp = Vec::new();
        attr(&mut xdp, IFLA_XDP_ATTACHED, &[1]);
        attr(&mut xdp, IFLA_XDP_PROG_ID, &42u32.to_ne_bytes());
        let body = link_body(&[
            (IFLA_IFNAME, b"veth-a\0".to_vec()),
            (IFLA_MTU, 1500u32.to_ne_bytes().to_vec()),
            (IFLA_MIN_MTU, 68u32.to_ne_bytes().to_vec()),
            (IFLA_MAX_MTU, 65535u32.to_ne_bytes().to_vec()),
            (IFLA_OPERSTATE, vec![6]),
            (IFLA_CARRIER, vec![1]),
            (IFLA_NUM_TX_QUEUES, 3u32.to_ne_bytes().to_vec()),
            (IFLA_NUM_RX_QUEUES, 4u32.to_ne_bytes().to_vec()),
            (IFLA_LINKINFO | NLA_F_NESTED, linkinfo),
            (IFLA_XDP | NLA_F_NESTED, xdp),
        ]);
        let l = parse_link(&body).unwrap();
        assert_eq!(l.ifindex, 7);
        assert_eq!(l.name, "veth-a");
        assert_eq!(l.flags & IFF_UP, IFF_UP);
        assert_eq!((l.mtu, l.mtu_range), (1500, Some((68, 65535))));
        assert_eq!((l.operstate, l.carrier), (6, Some(true)));
        assert_eq!((l.tx_queues, l.rx_queues), (3, 4));
        assert_eq!(l.kind.as_deref(), Some("veth"));
        // Only IFLA_XDP_PROG_ID + ATTACHED=DRV: the single program counts as native.
        assert_eq!((l.xdp_drv, l.xdp_skb, l.xdp_hw), (42, 0, 0));

        // Per-mode ids win over the single id; generic mode alone.
        let mut xdp = Vec::new();
        attr(&mut xdp, IFLA_XDP_ATTACHED, &[2]);
        attr(&mut xdp, IFLA_XDP_PROG_ID, &9u32.to_ne_bytes());
        attr(&mut xdp, IFLA_XDP_SKB_PROG_ID, &9u32.to_ne_bytes());
        let l = parse_link(&link_body(&[(IFLA_XDP, xdp)])).unwrap();
        assert_eq!((l.xdp_drv, l.xdp_skb), (0, 9));
        assert_eq!(l.kind, None);
        assert!(parse_link(&[0; 8]).is_none(), "short body");
    }

    #[test]
    fn netdev_attributes_parse_in_either_width() {
        let mut b = genl_header(NETDEV_CMD_DEV_GET, 1);
        attr(&mut b, NETDEV_A_DEV_IFINDEX, &5u32.to_ne_bytes());
        attr(&mut b, NETDEV_A_DEV_XDP_FEATURES, &0x27u64.to_ne_bytes());
        attr(&mut b, NETDEV_A_DEV_XDP_ZC_MAX_SEGS, &1u32.to_ne_bytes());
        attr(
            &mut b,
            NETDEV_A_DEV_XDP_RX_METADATA_FEATURES,
            &3u32.to_ne_bytes(),
        );
        attr(&mut b, NETDEV_A_DEV_XSK_FEATURES, &2u64.to_ne_bytes());
        let d = parse_netdev(&b).unwrap();
        assert_eq!(
            d,
            NetdevInfo {
                ifindex: 5,
                xdp_features: 0x27,
                xdp_zc_max_segs: Some(1),
                xdp_rx_metadata: Some(3),
                xsk_features: Some(2),
            }
        );
        // An older kernel: no xsk-features, no rx metadata.
        let mut b = genl_header(NETDEV_CMD_DEV_GET, 1);
        attr(&mut b, NETDEV_A_DEV_IFINDEX, &5u32.to_ne_bytes());
        attr(&mut b, NETDEV_A_DEV_XDP_FEATURES, &1u64.to_ne_bytes());
        let d = parse_netdev(&b).unwrap();
        assert_eq!((d.xsk_features, d.xdp_zc_max_segs), (None, None));
        // No ifindex: not a device record. A truncated attribute stops the walk.
        let mut b = genl_header(NETDEV_CMD_DEV_GET, 1);
        attr(&mut b, NETDEV_A_DEV_XDP_FEATURES, &1u64.to_ne_bytes());
        assert!(parse_netdev(&b).is_none());
        let mut b = genl_header(NETDEV_CMD_DEV_GET, 1);
        attr(&mut b, NETDEV_A_DEV_IFINDEX, &5u32.to_ne_bytes());
        b.extend_from_slice(&[200, 0, 3, 0, 1]);
        assert_eq!(parse_netdev(&b).unwrap().xdp_features, 0);
    }

    #[test]
    fn dump_messages_split_and_stop_on_garbage() {
        let mut d = request(RTM_NEWLINK, 2, &[1, 2, 3, 4]);
        d.extend(request(NLMSG_DONE, 2, &0u32.to_ne_bytes()));
        let got: Vec<_> = messages(&d).map(|(t, b)| (t, b.len())).collect();
        assert_eq!(got, vec![(RTM_NEWLINK, 4), (NLMSG_DONE, 4)]);
        d[0] = 255; // length past the end
        assert_eq!(messages(&d).count(), 0);
    }
}
