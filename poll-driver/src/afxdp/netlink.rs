//! The two rtnetlink requests the XDP attach logic needs: which XDP programs are attached to
//! an interface (RTM_GETLINK, IFLA_XDP), and detaching/attaching a netlink-attached program
//! (RTM_SETLINK, IFLA_XDP { IFLA_XDP_FD, IFLA_XDP_FLAGS }). Scoped to the calling thread's
//! network namespace.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
/// Attribute type flag: the payload is nested attributes.
pub(super) const NLA_F_NESTED: u16 = 0x8000;
/// Attribute type flag: the payload is in network byte order.
const NLA_F_NET_BYTEORDER: u16 = 0x4000;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;

/// `XDP_FLAGS_SKB_MODE` (generic XDP).
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE` (native XDP).
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// `XDP_FLAGS_HW_MODE` (offloaded XDP).
pub const XDP_FLAGS_HW_MODE: u32 = 1 << 3;

/// XDP programs attached to one interface, by mode (program ids; 0 = none).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct XdpAttachment {
    /// Native (driver) mode program.
    pub drv: u32,
    /// Generic (skb) mode program.
    pub skb: u32,
    /// Offloaded program.
    pub hw: u32,
}

impl XdpAttachment {
    /// `true` if no program is attached in any mode.
    pub fn is_empty(&self) -> bool {
        self.drv == 0 && self.skb == 0 && self.hw == 0
    }
}

/// A netlink socket of `protocol` (`NETLINK_ROUTE`, `NETLINK_GENERIC`) with a 2 s receive
/// timeout; shared with the generic-netlink client (`genl.rs`).
pub(super) fn socket(protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked and wrapped in an OwnedFd.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: valid fd, option value points to a live timeval of the stated size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
    Ok(fd)
}

fn header(msg: &mut Vec<u8>, ty: u16, flags: u16, ifindex: u32) {
    msg.extend_from_slice(&0u32.to_ne_bytes()); // length, patched later
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid
                                                // struct ifinfomsg
    msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
}

/// Append attribute `ty` with `payload`, padded to 4 bytes.
pub(super) fn attr(msg: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(payload);
    while !msg.len().is_multiple_of(4) {
        msg.push(0);
    }
}

fn finish(msg: &mut [u8]) {
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_ne_bytes());
}

pub(super) fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(o..o + 2)?.try_into().ok()?))
}

pub(super) fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?))
}

/// Iterate `(type, payload)` over a run of netlink attributes (the nested and
/// byte-order flags masked off); stops at the first malformed one.
pub(super) fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16_at(b, 0)? as usize;
        let ty = u16_at(b, 2)? & !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        let adv = (len + 3) & !3;
        b = b.get(adv..).unwrap_or(&[]);
        Some((ty, payload))
    })
}

/// Send `msg` and return the first reply of type `want` (or `None` for a plain ACK).
fn transact(msg: &[u8], want: Option<u16>) -> io::Result<Option<Vec<u8>>> {
    let sock = socket(libc::NETLINK_ROUTE)?;
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
    let mut buf = vec![0u8; 64 * 1024];
    for _ in 0..16 {
        // SAFETY: valid fd and buffer of the stated size.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut b = &buf[..n as usize];
        while b.len() >= 16 {
            let len = u32_at(b, 0).unwrap_or(0) as usize;
            let ty = u16_at(b, 4).unwrap_or(0);
            if len < 16 || len > b.len() {
                break;
            }
            let body = &b[16..len];
            if ty == NLMSG_ERROR {
                let err = u32_at(body, 0).unwrap_or(0) as i32;
                if err != 0 {
                    return Err(io::Error::from_raw_os_error(-err));
                }
                if want.is_none() {
                    return Ok(None);
                }
            } else if Some(ty) == want {
                return Ok(Some(body.to_vec()));
            }
            b = &b[((len + 3) & !3).min(b.len())..];
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "rtnetlink: no answer to the request",
    ))
}

/// Which XDP programs are attached to `ifindex` (in this thread's network namespace).
pub fn xdp_attachment(ifindex: u32) -> io::Result<XdpAttachment> {
    let mut msg = Vec::with_capacity(64);
    header(&mut msg, RTM_GETLINK, NLM_F_REQUEST, ifindex);
    finish(&mut msg);
    let body = transact(&msg, Some(RTM_NEWLINK))?.unwrap_or_default();
    let mut out = XdpAttachment::default();
    let mut single = 0;
    let mut mode_flags = 0;
    if body.len() < 16 {
        return Ok(out);
    }
    for (ty, payload) in attrs(&body[16..]) {
        if ty != IFLA_XDP {
            continue;
        }
        for (xty, v) in attrs(payload) {
            let v32 = u32_at(v, 0).unwrap_or(0);
            match xty {
                IFLA_XDP_DRV_PROG_ID => out.drv = v32,
                IFLA_XDP_SKB_PROG_ID => out.skb = v32,
                IFLA_XDP_HW_PROG_ID => out.hw = v32,
                IFLA_XDP_PROG_ID => single = v32,
                2 => mode_flags = v.first().copied().unwrap_or(0),
                _ => {}
            }
        }
    }
    // Older kernels report only IFLA_XDP_PROG_ID plus IFLA_XDP_ATTACHED (1 drv, 2 skb, 3 hw).
    if out.is_empty() && single != 0 {
        match mode_flags {
            2 => out.skb = single,
            3 => out.hw = single,
            _ => out.drv = single,
        }
    }
    Ok(out)
}

/// Attach program `fd` (or detach with `fd = -1`) through netlink in the mode given by
/// `flags` (`XDP_FLAGS_*`). This is the legacy path: a program attached this way stays
/// after the process exits, which is why xwarp itself uses bpf_links.
pub fn set_xdp_fd(ifindex: u32, fd: i32, flags: u32) -> io::Result<()> {
    let mut msg = Vec::with_capacity(64);
    header(&mut msg, RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, ifindex);
    let mut nested = Vec::new();
    attr(&mut nested, IFLA_XDP_FD, &fd.to_ne_bytes());
    attr(&mut nested, IFLA_XDP_FLAGS, &flags.to_ne_bytes());
    attr(&mut msg, IFLA_XDP | NLA_F_NESTED, &nested);
    finish(&mut msg);
    transact(&msg, None).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_walker_handles_padding_and_truncation() {
        let mut b = Vec::new();
        attr(&mut b, 5, &[1, 2, 3]);
        attr(&mut b, 6 | NLA_F_NESTED, &7u32.to_ne_bytes());
        let got: Vec<_> = attrs(&b).map(|(t, p)| (t, p.to_vec())).collect();
        assert_eq!(
            got,
            vec![(5, vec![1, 2, 3]), (6, 7u32.to_ne_bytes().to_vec())]
        );
        // A length field pointing past the end stops the walk instead of panicking.
        let mut bad = b.clone();
        bad[0] = 200;
        assert_eq!(attrs(&bad).count(), 0);
        assert_eq!(attrs(&[1, 0]).count(), 0);
    }
}
