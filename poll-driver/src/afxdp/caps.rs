//! What AF_XDP can do on each network interface: the data behind `xwarp devices`, and what
//! an engine can log about the interface it opens.
//!
//! [`devices`] / [`device`] query, without changing anything:
//! * the rtnetlink link dump: name, MTU (and its range), up/operstate/carrier, the number
//!   of TX and RX queues, the link kind of virtual devices, the XDP programs attached now
//!   (by mode), whose name [`AttachedProgram::name`] is read through `bpf(2)` and whose
//!   holders (the processes with a bpf_link fd on it) are found in `/proc/*/fdinfo`;
//! * ethtool ioctls: driver, version, firmware and bus (`ETHTOOL_GDRVINFO`), channels
//!   (`ETHTOOL_GCHANNELS`), link speed (`ETHTOOL_GSET`), TX checksum offload
//!   (`ETHTOOL_GTXCSUM`);
//! * the generic-netlink `netdev` family (Linux 6.3+): native XDP and its actions, XSK
//!   zero-copy, multi-buffer (`rx-sg`, `xdp-zc-max-segs`), RX metadata, and the AF_XDP TX
//!   metadata the driver honours in zero-copy mode (`xsk-features`, Linux 6.8+).
//!
//! **Fallback**: on a kernel without the `netdev` family (before 6.3, e.g. Debian 12's
//! 6.1), [`DeviceCaps::netdev`] is `None` and every capability it would give
//! ([`DeviceCaps::native_xdp`], [`DeviceCaps::zero_copy`], ...) reads `None` = unknown; the
//! rest (rtnetlink, ethtool) is still reported. [`probe`] finds out for real on such
//! kernels too.
//!
//! [`probe`] tries on an interface with no XDP program attached: attach an XDP_PASS program
//! in generic and in native mode (as bpf_links, detached right after), bind an AF_XDP
//! socket in copy mode, in zero-copy mode, in copy mode with multi-buffer and with TX
//! metadata; it then checks that no program is left on the interface.
//!
//! Everything runs in the calling thread's network namespace (netlink and ioctls, never
//! `/sys/class/net`, which shows the namespace sysfs was mounted in).

use super::bpf;
use super::genl::{self, Link, NetdevInfo, IFF_UP};
use super::program::{SteeringFilter, XdpMode, XdpProgram};
use super::socket::{
    kernel_accepts_tx_metadata, BindOptions, ChunkSize, RingSizes, Umem, XskSocket,
};
use super::txcsum::TX_METADATA_LEN;
use std::io;
use std::os::fd::AsRawFd;

/// `NETDEV_XDP_ACT_*` bits of the `netdev` family's `xdp-features`, with their names.
pub const XDP_FEATURE_NAMES: [(u64, &str); 7] = [
    (1, "basic"),
    (2, "redirect"),
    (4, "ndo-xmit"),
    (8, "xsk-zerocopy"),
    (16, "hw-offload"),
    (32, "rx-sg"),
    (64, "ndo-xmit-sg"),
];

/// `NETDEV_XDP_RX_METADATA_*` bits, with their names.
pub const RX_METADATA_NAMES: [(u64, &str); 3] = [(1, "timestamp"), (2, "hash"), (4, "vlan-tag")];

/// `NETDEV_XSK_FLAGS_*` bits (AF_XDP TX metadata in zero-copy mode), with their names.
pub const XSK_FEATURE_NAMES: [(u64, &str); 3] = [
    (1, "tx-timestamp"),
    (2, "tx-checksum"),
    (4, "tx-launch-time-fifo"),
];

const XDP_ACT_BASIC: u64 = 1;
const XDP_ACT_REDIRECT: u64 = 2;
const XDP_ACT_XSK_ZEROCOPY: u64 = 8;
const XDP_ACT_RX_SG: u64 = 32;
const XSK_TX_TIMESTAMP: u64 = 1;
const XSK_TX_CHECKSUM: u64 = 2;

/// The names of the bits of `bits` found in `table`, in table order; unknown bits as hex.
pub fn flag_names(bits: u64, table: &[(u64, &'static str)]) -> Vec<String> {
    let mut out: Vec<String> = table
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| (*n).to_owned())
        .collect();
    let known = table.iter().fold(0, |a, (b, _)| a | b);
    if bits & !known != 0 {
        out.push(format!("{:#x}", bits & !known));
    }
    out
}

/// `ETHTOOL_GDRVINFO`: the driver behind an interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverInfo {
    /// Driver name (`veth`, `mlx5_core`, `ixgbe`, ...).
    pub driver: String,
    /// Driver version.
    pub version: String,
    /// Firmware version (empty for virtual devices).
    pub firmware: String,
    /// Bus address (PCI `0000:3b:00.0`; empty for virtual devices).
    pub bus: String,
}

/// `ETHTOOL_GCHANNELS`: queue channels, current and maximum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Channels {
    /// RX-only channels.
    pub rx: u32,
    /// TX-only channels.
    pub tx: u32,
    /// Other channels (link interrupts, ...).
    pub other: u32,
    /// Combined RX+TX channels (what most NICs use, and what AF_XDP queue ids address).
    pub combined: u32,
    /// Maximum of `rx`.
    pub max_rx: u32,
    /// Maximum of `tx`.
    pub max_tx: u32,
    /// Maximum of `combined`.
    pub max_combined: u32,
}

/// A process holding an XDP bpf_link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Process id.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
}

/// An XDP program attached to an interface now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedProgram {
    /// `native`, `generic` or `offload`.
    pub mode: &'static str,
    /// Program id (as `ip link` and `bpftool prog` show it).
    pub id: u32,
    /// The program's name (`xwarp_steer` for an xwarp engine's), if it could be read.
    pub name: Option<String>,
    /// Processes holding a bpf_link of it (empty: attached through netlink, which outlives
    /// its loader, or links not visible here).
    pub holders: Vec<Holder>,
}

/// Everything known about one interface (see the module doc for where each comes from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCaps {
    /// The rtnetlink view (name, ifindex, MTU, state, queues, kind, attached ids).
    pub link: Link,
    /// `ETHTOOL_GDRVINFO`, if the device answers it.
    pub driver: Option<DriverInfo>,
    /// `ETHTOOL_GCHANNELS`, if the device answers it.
    pub channels: Option<Channels>,
    /// Link speed in Mb/s, if known.
    pub speed_mbps: Option<u32>,
    /// TX checksum offload of the device (`ethtool -k`: tx-checksumming), if it answers.
    /// In AF_XDP copy mode, TX metadata checksum requests become a CHECKSUM_PARTIAL skb
    /// the device (or the kernel, in software) completes.
    pub tx_checksum_offload: Option<bool>,
    /// What the `netdev` family reports (`None`: no family on this kernel, or the device
    /// is not in its dump).
    pub netdev: Option<NetdevInfo>,
    /// XDP programs attached now.
    pub attached: Vec<AttachedProgram>,
}

impl DeviceCaps {
    /// Interface name.
    pub fn name(&self) -> &str {
        &self.link.name
    }

    /// Administratively up (`IFF_UP`).
    pub fn is_up(&self) -> bool {
        self.link.flags & IFF_UP != 0
    }

    /// The RFC 2863 operational state by name (`up`, `down`, `lowerlayerdown`, ...).
    pub fn operstate(&self) -> &'static str {
        const NAMES: [&str; 7] = [
            "unknown",
            "notpresent",
            "down",
            "lowerlayerdown",
            "testing",
            "dormant",
            "up",
        ];
        NAMES
            .get(usize::from(self.link.operstate))
            .copied()
            .unwrap_or("unknown")
    }

    fn xdp_bit(&self, bit: u64) -> Option<bool> {
        self.netdev.map(|n| n.xdp_features & bit != 0)
    }

    /// Native (driver) XDP: the driver runs XDP programs itself. `Some(false)`: only
    /// generic (skb) XDP, which every interface has. `None`: unknown (no `netdev` family).
    pub fn native_xdp(&self) -> Option<bool> {
        self.xdp_bit(XDP_ACT_BASIC)
    }

    /// The driver supports `XDP_REDIRECT` (what steering to an XSK needs in native mode).
    pub fn redirect(&self) -> Option<bool> {
        self.xdp_bit(XDP_ACT_REDIRECT)
    }

    /// AF_XDP zero-copy (`XDP_ZEROCOPY` binds).
    pub fn zero_copy(&self) -> Option<bool> {
        self.xdp_bit(XDP_ACT_XSK_ZEROCOPY)
    }

    /// Native XDP multi-buffer (frames spanning several buffers, `rx-sg`).
    pub fn multi_buffer(&self) -> Option<bool> {
        self.xdp_bit(XDP_ACT_RX_SG)
    }

    /// Buffers per frame in zero-copy multi-buffer mode (`xdp-zc-max-segs`).
    pub fn zc_max_segs(&self) -> Option<u32> {
        self.netdev.and_then(|n| n.xdp_zc_max_segs)
    }

    /// The driver computes TX checksums requested through AF_XDP TX metadata in zero-copy
    /// mode (`xsk-features` tx-checksum; `None` before Linux 6.8 or without the family).
    pub fn zc_tx_checksum(&self) -> Option<bool> {
        self.netdev
            .and_then(|n| n.xsk_features)
            .map(|f| f & XSK_TX_CHECKSUM != 0)
    }

    /// The driver stamps TX times requested through AF_XDP TX metadata (zero-copy mode).
    pub fn zc_tx_timestamp(&self) -> Option<bool> {
        self.netdev
            .and_then(|n| n.xsk_features)
            .map(|f| f & XSK_TX_TIMESTAMP != 0)
    }

    /// One line for logs: name, driver, XDP mode, zero-copy, multi-buffer, queues.
    pub fn summary(&self) -> String {
        let yn = |v: Option<bool>| match v {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unknown",
        };
        let driver = self
            .driver
            .as_ref()
            .map(|d| d.driver.as_str())
            .or(self.link.kind.as_deref())
            .unwrap_or("?");
        format!(
            "{} (ifindex {}, {driver}, mtu {}, {} rx / {} tx queues): native XDP {}, \
             zero-copy {}, multi-buffer {}, zero-copy TX checksum {}",
            self.link.name,
            self.link.ifindex,
            self.link.mtu,
            self.link.rx_queues,
            self.link.tx_queues,
            yn(self.native_xdp()),
            yn(self.zero_copy()),
            yn(self.multi_buffer()),
            yn(self.zc_tx_checksum()),
        )
    }
}

/// What the kernel offers, whatever the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCaps {
    /// AF_XDP sockets can be created (kernel support and privileges).
    pub af_xdp: bool,
    /// The generic-netlink `netdev` family exists (Linux 6.3+).
    pub netdev_family: bool,
    /// UMEM registration accepts TX metadata (`XDP_UMEM_TX_METADATA_LEN`, Linux 6.8+);
    /// `None` when it could not be tried (no AF_XDP, no privileges).
    pub tx_metadata: Option<bool>,
}

/// The kernel-wide capabilities.
pub fn kernel() -> KernelCaps {
    let k = KernelCaps {
        af_xdp: super::available(),
        netdev_family: genl::family_id("netdev").ok().flatten().is_some(),
        tx_metadata: kernel_accepts_tx_metadata(TX_METADATA_LEN).ok(),
    };
    log::debug!("kernel: {k:?}");
    k
}

/// Every interface of this network namespace, in ifindex order.
pub fn devices() -> io::Result<Vec<DeviceCaps>> {
    let links = genl::links()?;
    let netdev = netdev_table();
    let mut out: Vec<DeviceCaps> = links.into_iter().map(|l| describe(l, &netdev)).collect();
    find_holders(&mut out);
    Ok(out)
}

/// One interface by name; a name this namespace does not have is a `NotFound` error that
/// says so.
pub fn device(name: &str) -> io::Result<DeviceCaps> {
    let link = find_link(name)?;
    let mut out = vec![describe(link, &netdev_table())];
    find_holders(&mut out);
    Ok(out.remove(0))
}

fn find_link(name: &str) -> io::Result<Link> {
    genl::links()?
        .into_iter()
        .find(|l| l.name == name)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no network interface named {name:?} in this network namespace"),
            )
        })
}

/// The `netdev` dump, or an empty table (fallback) when the family is absent or the dump
/// fails.
fn netdev_table() -> Vec<NetdevInfo> {
    match genl::netdev_dump() {
        Ok(Some(v)) => v,
        Ok(None) => {
            log::debug!("no netdev netlink family (Linux < 6.3): XDP capabilities unknown");
            Vec::new()
        }
        Err(e) => {
            log::warn!("{e}: XDP capabilities unknown");
            Vec::new()
        }
    }
}

fn describe(link: Link, netdev: &[NetdevInfo]) -> DeviceCaps {
    let netdev = netdev.iter().find(|n| n.ifindex == link.ifindex).copied();
    log::debug!("{}: rtnetlink {link:?}, netdev {netdev:?}", link.name);
    let mut attached = Vec::new();
    for (mode, id) in [
        ("native", link.xdp_drv),
        ("generic", link.xdp_skb),
        ("offload", link.xdp_hw),
    ] {
        if id != 0 {
            let name = bpf::prog_fd_by_id(id)
                .and_then(|fd| bpf::prog_name_and_id(&fd))
                .map(|(n, _)| n)
                .ok();
            attached.push(AttachedProgram {
                mode,
                id,
                name,
                holders: Vec::new(),
            });
        }
    }
    DeviceCaps {
        driver: drvinfo(&link.name).ok(),
        channels: channels(&link.name).ok(),
        speed_mbps: speed(&link.name).ok().flatten(),
        tx_checksum_offload: crate::netns::tx_checksum_offload(&link.name).ok(),
        link,
        netdev,
        attached,
    }
}

/// Fill [`AttachedProgram::holders`]: the processes whose fds include an XDP bpf_link of
/// that program (`/proc/PID/fdinfo/FD`: `link_type: xdp`, `prog_id: ID`). Only walks
/// `/proc` when some program is attached; unreadable entries are skipped.
fn find_holders(devs: &mut [DeviceCaps]) {
    if devs.iter().all(|d| d.attached.is_empty()) {
        return;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let is_link =
                std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:bpf_link");
            if !is_link {
                continue;
            }
            let info = p.path().join("fdinfo").join(fd.file_name());
            let Ok(text) = std::fs::read_to_string(info) else {
                continue;
            };
            let Some(prog) = xdp_link_prog_id(&text) else {
                continue;
            };
            for prog_entry in devs.iter_mut().flat_map(|d| d.attached.iter_mut()) {
                if prog_entry.id == prog && !prog_entry.holders.iter().any(|h| h.pid == pid) {
                    let comm = std::fs::read_to_string(p.path().join("comm"))
                        .map(|c| c.trim().to_owned())
                        .unwrap_or_default();
                    prog_entry.holders.push(Holder { pid, comm });
                }
            }
        }
    }
}

/// The program id of an XDP bpf_link from its `/proc/PID/fdinfo/FD` text.
pub fn xdp_link_prog_id(fdinfo: &str) -> Option<u32> {
    let field = |k: &str| {
        fdinfo
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':').map(str::trim))
    };
    (field("link_type")? == "xdp").then_some(())?;
    field("prog_id")?.parse().ok()
}

/// `SIOCETHTOOL` on `ifname` with `data` (whose first `u32` is the ethtool command).
fn ethtool<T>(ifname: &str, data: &mut T) -> io::Result<()> {
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if ifname.is_empty() || ifname.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {ifname:?}"),
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (data as *mut T).cast();
    // SAFETY: plain socket(2); wrapped so it closes on every path.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd owned by nobody else.
    let s = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(s) };
    // SAFETY: valid fd; `req` points to `data`, which the caller sized for the command
    // and which lives across the call.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCETHTOOL as _, &mut req) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim().to_owned()
}

/// `ETHTOOL_GDRVINFO` of `ifname`.
pub fn drvinfo(ifname: &str) -> io::Result<DriverInfo> {
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    // struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32], bus_info[32],
    // erom_version[32], reserved2[12], five u32 counts: 196 bytes.
    let mut buf = [0u32; 49];
    buf[0] = ETHTOOL_GDRVINFO;
    ethtool(ifname, &mut buf)?;
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let driver = cstr(&bytes[4..36]);
    if driver.is_empty() {
        return Err(io::Error::other("no driver name"));
    }
    Ok(DriverInfo {
        driver,
        version: cstr(&bytes[36..68]),
        firmware: cstr(&bytes[68..100]),
        bus: cstr(&bytes[100..132]),
    })
}

/// `ETHTOOL_GCHANNELS` of `ifname`.
pub fn channels(ifname: &str) -> io::Result<Channels> {
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    // struct ethtool_channels: cmd, max_rx, max_tx, max_other, max_combined, rx_count,
    // tx_count, other_count, combined_count.
    let mut c = [0u32; 9];
    c[0] = ETHTOOL_GCHANNELS;
    ethtool(ifname, &mut c)?;
    Ok(Channels {
        max_rx: c[1],
        max_tx: c[2],
        max_combined: c[4],
        rx: c[5],
        tx: c[6],
        other: c[7],
        combined: c[8],
    })
}

/// Link speed of `ifname` in Mb/s (`ETHTOOL_GSET`); `Ok(None)` when the device does not
/// know it (link down, or a device without speed).
pub fn speed(ifname: &str) -> io::Result<Option<u32>> {
    const ETHTOOL_GSET: u32 = 0x1;
    // struct ethtool_cmd (44 bytes): speed (u16) at byte 12, speed_hi (u16) at byte 28.
    let mut c = [0u32; 11];
    c[0] = ETHTOOL_GSET;
    ethtool(ifname, &mut c)?;
    let lo = c[3] & 0xffff;
    let hi = c[7] & 0xffff;
    let (lo, hi) = if cfg!(target_endian = "little") {
        (lo, hi)
    } else {
        (c[3] >> 16, c[7] >> 16)
    };
    let s = (hi << 16) | lo;
    Ok((s != 0 && s != u32::MAX && s != 0xffff).then_some(s))
}

/// What an engine's AF_XDP NIC got when it opened, for the log: an info record
/// (`XWARP_LOG=info` shows it) and, at debug, the interface's [`DeviceCaps::summary`].
pub(crate) struct Opened<'a> {
    pub(crate) ifname: &'a str,
    pub(crate) queue: u32,
    pub(crate) zero_copy: bool,
    pub(crate) native: bool,
    pub(crate) multi_buffer: bool,
    pub(crate) tx_checksum_offload: bool,
    pub(crate) max_frame: usize,
}

impl Opened<'_> {
    pub(crate) fn log(&self) {
        let on = |b: bool| if b { "on" } else { "off" };
        log::info!(
            "AF_XDP on {} queue {}: {} mode, {} XDP, multi-buffer {}, TX checksum offload {}, \
             frames up to {} bytes",
            self.ifname,
            self.queue,
            if self.zero_copy { "zero-copy" } else { "copy" },
            if self.native { "native" } else { "generic" },
            on(self.multi_buffer),
            on(self.tx_checksum_offload),
            self.max_frame
        );
        if log::log_enabled!(log::Level::Debug) {
            match device(self.ifname) {
                Ok(d) => log::debug!("{}", d.summary()),
                Err(e) => log::debug!("{}: capabilities: {e}", self.ifname),
            }
        }
    }
}

/// The result of one [`probe`] step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// It worked; what was seen.
    Ok(String),
    /// The kernel refused; its error.
    Failed(String),
    /// Not tried, and why.
    Skipped(String),
}

impl ProbeOutcome {
    /// `true` for [`ProbeOutcome::Ok`].
    pub fn is_ok(&self) -> bool {
        matches!(self, ProbeOutcome::Ok(_))
    }

    /// `ok`, `failed` or `skipped`.
    pub fn status(&self) -> &'static str {
        match self {
            ProbeOutcome::Ok(_) => "ok",
            ProbeOutcome::Failed(_) => "failed",
            ProbeOutcome::Skipped(_) => "skipped",
        }
    }

    /// The detail or error text.
    pub fn detail(&self) -> &str {
        match self {
            ProbeOutcome::Ok(s) | ProbeOutcome::Failed(s) | ProbeOutcome::Skipped(s) => s,
        }
    }
}

/// What [`probe`] found on one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    /// Interface name.
    pub name: String,
    /// Attaching an XDP program in generic (skb) mode.
    pub generic: ProbeOutcome,
    /// Attaching an XDP program in native (driver) mode.
    pub native: ProbeOutcome,
    /// Binding an AF_XDP socket to queue 0 in copy mode.
    pub copy: ProbeOutcome,
    /// Binding in zero-copy mode.
    pub zero_copy: ProbeOutcome,
    /// Binding in copy mode with multi-buffer (`XDP_USE_SG`).
    pub multi_buffer: ProbeOutcome,
    /// Binding in copy mode with a UMEM registered with TX metadata.
    pub tx_metadata: ProbeOutcome,
    /// No XDP program was left attached afterwards (checked through rtnetlink).
    pub clean: bool,
}

/// Try XDP and AF_XDP on `name` for real (root): see the module doc. Refuses (an
/// `AddrInUse` error naming the program) if a program is attached, so a running engine or
/// another tool's program is never touched; every program it attaches is a bpf_link
/// detached before it returns (and by the kernel, if this process dies).
pub fn probe(name: &str) -> io::Result<ProbeReport> {
    let link = find_link(name)?;
    if let Some((mode, id)) = [
        ("native", link.xdp_drv),
        ("generic", link.xdp_skb),
        ("offload", link.xdp_hw),
    ]
    .into_iter()
    .find(|(_, id)| *id != 0)
    {
        let pname = bpf::prog_fd_by_id(id)
            .and_then(|fd| bpf::prog_name_and_id(&fd))
            .map(|(n, _)| n)
            .unwrap_or_default();
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{name} runs XDP program {pname:?} (id {id}, {mode} mode) now; \
                 not probing an interface in use"
            ),
        ));
    }
    let ifindex = link.ifindex;
    let program = XdpProgram::load_named(&SteeringFilter::default(), 1, "xwarp_probe")
        .map_err(|e| io::Error::new(e.kind(), format!("loading the probe XDP program: {e}")))?;
    // Never the replacing attach: a program that appeared since the check above (say a
    // starting engine's) must not be detached by a probe.
    let attach = |mode: XdpMode| match program.attach_no_replace(ifindex, mode) {
        Ok(l) => {
            let seen = genl::links()
                .ok()
                .and_then(|v| v.into_iter().find(|l| l.ifindex == ifindex));
            let id = seen.map_or(0, |s| if l.is_native() { s.xdp_drv } else { s.xdp_skb });
            drop(l);
            if id == program.id() {
                ProbeOutcome::Ok(format!("program id {id} attached, then detached"))
            } else {
                ProbeOutcome::Failed(format!(
                    "attach returned a link but the interface reports program id {id}, \
                     not {}",
                    program.id()
                ))
            }
        }
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            ProbeOutcome::Failed(format!("an XDP program appeared meanwhile: {e}"))
        }
        Err(e) => ProbeOutcome::Failed(e.to_string()),
    };
    let generic = attach(XdpMode::Generic);
    let native = attach(XdpMode::Native);
    let base = BindOptions {
        zero_copy: false,
        need_wakeup: true,
        multi_buffer: false,
        unaligned_chunks: false,
        tx_metadata_len: 0,
    };
    let bind = |opts: BindOptions| -> ProbeOutcome {
        let umem = match Umem::new(64, ChunkSize::C4096) {
            Ok(u) => u,
            Err(e) => return ProbeOutcome::Failed(format!("UMEM: {e}")),
        };
        let sizes = RingSizes {
            fill: 32,
            completion: 32,
            rx: 32,
            tx: 32,
        };
        // The kernel frees the previous probe socket's buffer pool from a work queue: the
        // queue reads busy (EBUSY) for a moment after that socket closed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        loop {
            match XskSocket::bind(&umem, ifindex, 0, sizes, opts) {
                Ok(s) => {
                    let mode = if s.is_zero_copy() {
                        "zero-copy"
                    } else {
                        "copy"
                    };
                    return ProbeOutcome::Ok(format!("bound to queue 0 ({mode})"));
                }
                Err(e)
                    if e.kind() == io::ErrorKind::ResourceBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return ProbeOutcome::Failed(e.to_string()),
            }
        }
    };
    let copy = bind(base);
    let zero_copy = bind(BindOptions {
        zero_copy: true,
        ..base
    });
    let multi_buffer = bind(BindOptions {
        multi_buffer: true,
        ..base
    });
    let tx_metadata = match kernel_accepts_tx_metadata(TX_METADATA_LEN) {
        Ok(true) => bind(BindOptions {
            tx_metadata_len: TX_METADATA_LEN,
            ..base
        }),
        Ok(false) => ProbeOutcome::Skipped("this kernel has no AF_XDP TX metadata".into()),
        Err(e) => ProbeOutcome::Failed(e.to_string()),
    };
    drop(program);
    let after = find_link(name)?;
    let clean = after.xdp_drv == 0 && after.xdp_skb == 0 && after.xdp_hw == 0;
    let report = ProbeReport {
        name: name.to_owned(),
        generic,
        native,
        copy,
        zero_copy,
        multi_buffer,
        tx_metadata,
        clean,
    };
    log::debug!("probe: {report:?}");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(netdev: Option<NetdevInfo>) -> DeviceCaps {
        DeviceCaps {
            link: Link {
                ifindex: 3,
                name: "veth-a".into(),
                flags: IFF_UP,
                mtu: 1500,
                operstate: 6,
                rx_queues: 4,
                tx_queues: 2,
                kind: Some("veth".into()),
                ..Link::default()
            },
            driver: None,
            channels: None,
            speed_mbps: None,
            tx_checksum_offload: None,
            netdev,
            attached: Vec::new(),
        }
    }

    #[test]
    fn capabilities_follow_the_netdev_bits_and_are_unknown_without_them() {
        let veth = caps(Some(NetdevInfo {
            ifindex: 3,
            xdp_features: XDP_ACT_BASIC | XDP_ACT_REDIRECT | XDP_ACT_RX_SG,
            xdp_zc_max_segs: Some(1),
            xdp_rx_metadata: Some(0),
            xsk_features: Some(0),
        }));
        assert_eq!(veth.native_xdp(), Some(true));
        assert_eq!(veth.redirect(), Some(true));
        assert_eq!(veth.zero_copy(), Some(false));
        assert_eq!(veth.multi_buffer(), Some(true));
        assert_eq!(veth.zc_tx_checksum(), Some(false));
        assert_eq!(veth.operstate(), "up");
        assert!(veth.is_up());
        let s = veth.summary();
        assert!(
            s.contains("native XDP yes") && s.contains("zero-copy no"),
            "{s}"
        );
        assert!(s.contains("4 rx / 2 tx queues"), "{s}");

        let zc = caps(Some(NetdevInfo {
            xdp_features: 0x7f,
            xsk_features: Some(XSK_TX_CHECKSUM | XSK_TX_TIMESTAMP),
            ..NetdevInfo::default()
        }));
        assert_eq!(zc.zero_copy(), Some(true));
        assert_eq!(
            (zc.zc_tx_checksum(), zc.zc_tx_timestamp()),
            (Some(true), Some(true))
        );

        // Generic only: the family answers with no XDP bits.
        let lo = caps(Some(NetdevInfo::default()));
        assert_eq!(lo.native_xdp(), Some(false));
        assert_eq!(lo.zc_tx_checksum(), None, "xsk-features absent");

        // No netdev family (Linux < 6.3): unknown, never a guess.
        let old = caps(None);
        assert_eq!(old.native_xdp(), None);
        assert_eq!(old.zero_copy(), None);
        assert!(old.summary().contains("native XDP unknown"));
    }

    #[test]
    fn flag_names_list_known_bits_and_the_rest_in_hex() {
        assert_eq!(
            flag_names(0x23, &XDP_FEATURE_NAMES),
            ["basic", "redirect", "rx-sg"]
        );
        assert_eq!(
            flag_names(0x102, &XSK_FEATURE_NAMES),
            ["tx-checksum", "0x100"]
        );
        assert!(flag_names(0, &RX_METADATA_NAMES).is_empty());
    }

    #[test]
    fn fdinfo_of_an_xdp_link_names_its_program() {
        let xdp = "pos:\t0\nflags:\t02000000\nmnt_id:\t15\nino:\t1057\nlink_type:\txdp\n\
                   link_id:\t5\nprog_tag:\t3b185187f1855c4c\nprog_id:\t42\nifindex:\t7\n";
        assert_eq!(xdp_link_prog_id(xdp), Some(42));
        let tracing = "link_type:\ttracing\nlink_id:\t2\nprog_id:\t9\n";
        assert_eq!(xdp_link_prog_id(tracing), None);
        assert_eq!(xdp_link_prog_id("link_type:\txdp\nprog_id:\tx\n"), None);
        assert_eq!(xdp_link_prog_id(""), None);
    }

    #[test]
    fn bad_interface_names_are_errors() {
        let e = device("no-such-if-xw").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("no-such-if-xw"), "{e}");
        assert!(ethtool("", &mut [0u32; 9]).is_err());
        assert!(ethtool("a-name-far-too-long-for-ifreq", &mut [0u32; 9]).is_err());
        let e = probe("no-such-if-xw").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
