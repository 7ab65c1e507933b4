//! Facts about the network interface behind the device, from the kernel of the calling
//! thread's network namespace (ioctls on a datagram socket, not `/sys`, which shows the
//! namespace it was mounted in): index, MAC, MTU, link state and speed.

use std::io;

/// What the device reports about its interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfaceFacts {
    /// Interface index.
    pub ifindex: u32,
    /// Hardware address (all zero when the interface has none).
    pub mac: [u8; 6],
    /// MTU.
    pub mtu: u32,
    /// Administratively up (`IFF_UP`) and with carrier (ethtool's link state, which is the
    /// driver's carrier at once; `IFF_RUNNING`, which follows it with the kernel's
    /// link-watch delay, when the driver has no ethtool support).
    pub link_up: bool,
    /// Link speed in Mb/s, when the driver reports one (ethtool).
    pub speed_mbps: Option<u32>,
}

/// An `AF_INET` datagram socket, closed on drop.
struct Sock(libc::c_int);

impl Sock {
    fn new() -> io::Result<Sock> {
        // SAFETY: plain socket(2); the fd is owned by the returned value.
        let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if s < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Sock(s))
    }

    /// `ioctl(req)` on an `ifreq` for `name`, after `prepare` filled its union.
    fn ifreq(
        &self,
        name: &str,
        req: libc::c_ulong,
        prepare: impl FnOnce(&mut libc::ifreq),
    ) -> io::Result<libc::ifreq> {
        // SAFETY: all-zero is a valid ifreq.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        if name.len() >= ifr.ifr_name.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "interface name too long",
            ));
        }
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        prepare(&mut ifr);
        // SAFETY: valid fd; `ifr` is a live ifreq (and whatever `prepare` pointed it at
        // lives in the caller's frame across the call).
        if unsafe { libc::ioctl(self.0, req as _, &mut ifr) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ifr)
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        // SAFETY: our fd, closed once.
        unsafe { libc::close(self.0) };
    }
}

/// `struct ethtool_cmd` (the legacy `ETHTOOL_GSET` request; enough for the speed).
#[repr(C)]
#[derive(Default)]
struct EthtoolCmd {
    cmd: u32,
    supported: u32,
    advertising: u32,
    speed: u16,
    duplex: u8,
    port: u8,
    phy_address: u8,
    transceiver: u8,
    autoneg: u8,
    mdio_support: u8,
    maxtxpkt: u32,
    maxrxpkt: u32,
    speed_hi: u16,
    eth_tp_mdix: u8,
    eth_tp_mdix_ctrl: u8,
    lp_advertising: u32,
    reserved: [u32; 2],
}

const ETHTOOL_GSET: u32 = 1;
const ETHTOOL_GLINK: u32 = 0xa;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// Look `name` up in the calling thread's network namespace. `NotFound` when there is
/// no such interface.
pub fn query(name: &str) -> io::Result<IfaceFacts> {
    let s = Sock::new()?;
    let named = |e: io::Error| {
        if e.raw_os_error() == Some(libc::ENODEV) {
            io::Error::new(io::ErrorKind::NotFound, "no such interface")
        } else {
            e
        }
    };
    let ifr = s.ifreq(name, libc::SIOCGIFINDEX, |_| ()).map_err(named)?;
    // SAFETY: SIOCGIFINDEX filled the ifindex member.
    let ifindex = unsafe { ifr.ifr_ifru.ifru_ifindex } as u32;
    let ifr = s.ifreq(name, libc::SIOCGIFFLAGS, |_| ()).map_err(named)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member.
    let flags = i32::from(unsafe { ifr.ifr_ifru.ifru_flags });
    let ifr = s.ifreq(name, libc::SIOCGIFMTU, |_| ()).map_err(named)?;
    // SAFETY: SIOCGIFMTU filled the mtu member.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu }.max(0) as u32;
    let ifr = s.ifreq(name, libc::SIOCGIFHWADDR, |_| ()).map_err(named)?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member.
    let hw = unsafe { ifr.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    let mut cmd = EthtoolCmd {
        cmd: ETHTOOL_GSET,
        ..Default::default()
    };
    let cmd_ptr: *mut EthtoolCmd = &mut cmd;
    let speed_mbps = s
        .ifreq(name, libc::SIOCETHTOOL, |r| {
            r.ifr_ifru.ifru_data = cmd_ptr.cast();
        })
        .ok()
        .map(|_| u32::from(cmd.speed) | (u32::from(cmd.speed_hi) << 16))
        .filter(|&v| v != 0 && v != u32::MAX && v != u32::from(u16::MAX));
    let mut link = EthtoolValue {
        cmd: ETHTOOL_GLINK,
        data: 0,
    };
    let link_ptr: *mut EthtoolValue = &mut link;
    let carrier = s
        .ifreq(name, libc::SIOCETHTOOL, |r| {
            r.ifr_ifru.ifru_data = link_ptr.cast();
        })
        .map(|_| link.data != 0)
        .unwrap_or(flags & libc::IFF_RUNNING != 0);
    Ok(IfaceFacts {
        ifindex,
        mac,
        mtu,
        link_up: flags & libc::IFF_UP != 0 && carrier,
        speed_mbps,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_found_and_a_missing_interface_is_not_found() {
        let lo = super::query("lo").expect("lo");
        assert!(lo.ifindex >= 1);
        assert!(lo.mtu >= 1280, "{lo:?}");
        let e = super::query("xwno-such0").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }
}
