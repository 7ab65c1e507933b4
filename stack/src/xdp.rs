//! An engine on a real interface: the AF_XDP socket bound to a Linux interface
//! (typically one end of a veth pair inside a network namespace), the stack settings
//! derived from it, and [`EngineBuilder::xdp`], the builder of an engine on it
//! (`xwarp::toe::start_xdp_engine` and `xwarp::verbs::Context::start_xdp` use it).
//!
//! ## What opening an engine on an interface does ([`open_xdp_nic`], [`EngineBuilder::xdp`])
//! 1. Opens the [`AfXdpNic`] on a thread that has entered the namespace (the interface
//!    name, its index, the steering program and the XSK all belong to that namespace; the
//!    socket keeps working from any thread afterwards). The steering program redirects only
//!    the engine's address (plus ARP/NDP for it); everything else goes to the kernel, so
//!    kernel sockets on the same interface keep working.
//! 2. Takes the MAC address from the interface and the IP MTU from the NIC: the smaller of
//!    the interface MTU and the largest frame a UMEM chunk holds (chunk − 256 − 14 bytes of
//!    Ethernet header), or with [`XdpEngineConfig::multi_buffer`] the interface MTU (frames
//!    span up to `MAX_CHAIN` chunks as descriptor chains). The TCP MSS follows (MTU − 40).
//! 3. [`EngineBuilder::spawn`] then starts the engine thread (optionally pinned) with the
//!    TCP stack service.
//!
//! ## Checksums (docs/afxdp.md §7.3)
//! TX: the engine computes the IPv4 and ICMP checksums. TCP and UDP checksums are left to
//! the kernel through AF_XDP TX metadata when [`XdpEngineConfig::tx_checksum`] allows it
//! (default `Auto`: with [`RxChecksum::TrustL4`] on a kernel that accepts TX metadata, in
//! copy mode; `XWARP_TX_CHECKSUM_OFFLOAD=off` turns `Auto` off): a veth then passes
//! them to a kernel peer as `CHECKSUM_PARTIAL` (trusted), a device without checksum offload
//! gets them finished in software on the way out. An engine with [`RxChecksum::Verify`]
//! keeps full software checksums under `Auto`, since over a veth its (verifying) engine
//! peers would see only partial ones. Else the engine computes them all.
//!
//! RX: a kernel peer on a veth hands its segments over with a *partial* L4 checksum
//! (CHECKSUM_PARTIAL: only the pseudo-header sum is filled in; the offload that would finish
//! it never runs on a virtual link). Verifying the TCP checksum would drop every segment a
//! kernel peer sends. Turning TX checksum offload off on the peer (`ethtool -K <peer> tx
//! off`) would make the checksums complete, but it also turns off the peer's TSO/GSO, which
//! changes the kernel we compare against. So the default, [`RxChecksum::TrustL4`], verifies
//! the IPv4 header checksum (always complete) and trusts TCP/UDP/ICMP checksums: a veth
//! pair moves memory between two namespaces of one kernel and cannot corrupt a frame.
//! [`RxChecksum::Verify`] verifies everything; use it on a real NIC, or when every peer
//! sends complete checksums (another xwarp engine, or a kernel peer with TX offload off).
//! Both are covered by tests (`tests/xdp_*.rs`).

use std::io;
use std::net::Ipv4Addr;

use smoltcp::phy::{Checksum, ChecksumCapabilities, Device};
use xwarp_poll_driver::afxdp::{
    AfXdpConfig, AfXdpNic, ChunkSize, SteeringFilter, TxChecksumOffload, XdpMode,
};
use xwarp_poll_driver::engine::EngineConfig;
use xwarp_poll_driver::netns::NetNs;

use crate::builder::EngineBuilder;
use crate::StackConfig;

/// Ethernet header bytes in front of the IP packet.
const ETHERNET_HEADER_LEN: usize = 14;

/// Which received checksums the engine verifies (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RxChecksum {
    /// Verify every checksum (IPv4 header, TCP, UDP, ICMP). Drops segments from a kernel
    /// veth peer that has TX checksum offload on.
    Verify,
    /// Verify the IPv4 header checksum; trust L4 checksums (veth peers send them partial).
    #[default]
    TrustL4,
}

impl RxChecksum {
    /// The smoltcp capabilities: full checksums on TX always, RX as chosen.
    pub fn capabilities(self) -> ChecksumCapabilities {
        let l4 = match self {
            RxChecksum::Verify => Checksum::Both,
            RxChecksum::TrustL4 => Checksum::Tx,
        };
        let mut caps = ChecksumCapabilities::default();
        caps.ipv4 = Checksum::Both;
        caps.tcp = l4;
        caps.udp = l4;
        caps.icmpv4 = l4;
        caps.icmpv6 = l4;
        caps
    }
}

/// Default [`XdpEngineConfig::rx_frames`].
pub const DEFAULT_RX_FRAMES: u32 = 2048;

/// Everything [`open_xdp_nic`] needs.
#[derive(Debug, Clone)]
pub struct XdpEngineConfig {
    /// Interface to bind (in the namespace given to [`open_xdp_nic`]); queue 0.
    pub ifname: String,
    /// The engine's IPv4 address. Do not configure it on the kernel's interface.
    pub ipv4: Ipv4Addr,
    /// Prefix length of `ipv4`.
    pub prefix: u8,
    /// Stack settings; `mac`, `ipv4` and `mtu` are filled in by [`open_xdp_nic`].
    pub stack: StackConfig,
    /// Engine thread settings (name, core pinning, spin budget).
    pub engine: EngineConfig,
    /// UMEM chunk size: `C2048` carries IP packets up to 1778 bytes, `C4096` up to 3826.
    pub chunk: ChunkSize,
    /// XDP attach mode.
    pub mode: XdpMode,
    /// RX checksum policy.
    pub rx_checksum: RxChecksum,
    /// Multi-buffer AF_XDP (`XDP_USE_SG`): the stack's MTU follows the interface MTU
    /// (e.g. 9000 on a veth) instead of the chunk size. Off by default.
    pub multi_buffer: bool,
    /// TX TCP/UDP checksum offload through AF_XDP TX metadata (see the module docs,
    /// "Checksums"); `Auto` by default. Whether it ended up active:
    /// [`AfXdpNic::tx_checksum_offload`] on the NIC [`open_xdp_nic`] returns.
    pub tx_checksum: TxChecksumOffload,
    /// UMEM chunks for received frames (`AfXdpConfig::rx_frames`, 2048 by default; the
    /// fill and RX rings grow to hold them). The kernel writes frames into these chunks in
    /// turn, in address order, so every one of them passes through the cache: an area much
    /// larger than the receive windows the engine advertises only makes the kernel's copy
    /// into it (on the *sending* side's core, over a veth) write to memory that has left
    /// the cache. Too few chunks for the windows in flight, and the kernel drops frames
    /// (counted in the NIC's `dropped`) that TCP then retransmits.
    pub rx_frames: u32,
}

impl XdpEngineConfig {
    /// Defaults for an engine owning `ipv4/prefix` on `ifname`: 2048-byte chunks, native
    /// mode where possible, [`RxChecksum::TrustL4`], default stack and engine settings.
    pub fn new(ifname: &str, ipv4: Ipv4Addr, prefix: u8) -> Self {
        XdpEngineConfig {
            ifname: ifname.to_string(),
            ipv4,
            prefix,
            stack: StackConfig::default(),
            engine: EngineConfig::default(),
            chunk: ChunkSize::C2048,
            mode: XdpMode::Auto,
            rx_checksum: RxChecksum::default(),
            multi_buffer: false,
            tx_checksum: TxChecksumOffload::Auto,
            rx_frames: DEFAULT_RX_FRAMES,
        }
    }
}

/// Open the AF_XDP NIC on `cfg.ifname` inside namespace `ns` (the caller's own when
/// `None`) and derive the stack settings (MAC, address, MTU) from it, without starting
/// an engine (see the module docs). Returns the NIC, the filled-in stack settings and the
/// engine settings; [`EngineBuilder::xdp`] puts them in a builder, where a caller can
/// install a protocol host (e.g. the verbs engine) before spawning the engine. Root is
/// needed.
pub fn open_xdp_nic(
    ns: Option<&NetNs>,
    cfg: XdpEngineConfig,
) -> io::Result<(AfXdpNic, StackConfig, EngineConfig)> {
    if cfg.prefix > 32 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("IPv4 prefix length {} out of range", cfg.prefix),
        ));
    }
    let mut xcfg = AfXdpConfig::new(&cfg.ifname, SteeringFilter::new(vec![cfg.ipv4], Vec::new()));
    xcfg.chunk = cfg.chunk;
    xcfg.mode = cfg.mode;
    xcfg.checksum = cfg.rx_checksum.capabilities();
    xcfg.multi_buffer = cfg.multi_buffer;
    xcfg.tx_checksum = cfg.tx_checksum;
    xcfg.rx_frames = cfg.rx_frames;
    let ring = cfg.rx_frames.max(1).next_power_of_two();
    xcfg.rings.fill = xcfg.rings.fill.max(ring);
    xcfg.rings.rx = xcfg.rings.rx.max(ring);
    let nic = match ns {
        Some(ns) => ns.run(move || AfXdpNic::open(xcfg))??,
        None => AfXdpNic::open(xcfg)?,
    };
    let frame = nic.capabilities().max_transmission_unit;
    let mtu = frame.saturating_sub(ETHERNET_HEADER_LEN);
    if mtu < 576 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: IP MTU {mtu} from the NIC is below the IPv4 minimum of 576",
                cfg.ifname
            ),
        ));
    }
    let stack = StackConfig {
        mac: nic.mac_address(),
        ipv4: Some((cfg.ipv4, cfg.prefix)),
        mtu,
        ..cfg.stack
    };
    Ok((nic, stack, cfg.engine))
}

impl EngineBuilder<AfXdpNic> {
    /// Open an AF_XDP NIC on `cfg.ifname` inside namespace `ns` (the caller's own when
    /// `None`; [`open_xdp_nic`]) and make a builder of an engine on it, with the stack
    /// settings derived from the NIC. Root is needed.
    pub fn xdp(ns: Option<&NetNs>, cfg: XdpEngineConfig) -> io::Result<Self> {
        let ifname = cfg.ifname.clone();
        let (nic, stack, engine) = open_xdp_nic(ns, cfg)?;
        Ok(EngineBuilder::new(nic, stack, engine).interface_name(ifname))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_l4_still_verifies_ipv4_and_computes_everything_on_tx() {
        let c = RxChecksum::TrustL4.capabilities();
        assert!(matches!(c.ipv4, Checksum::Both));
        for l4 in [c.tcp, c.udp, c.icmpv4, c.icmpv6] {
            assert!(matches!(l4, Checksum::Tx));
        }
        let v = RxChecksum::Verify.capabilities();
        for all in [v.ipv4, v.tcp, v.udp, v.icmpv4, v.icmpv6] {
            assert!(matches!(all, Checksum::Both));
        }
    }

    #[test]
    fn open_rejects_bad_prefix_before_touching_the_kernel() {
        let mut cfg = XdpEngineConfig::new("does-not-exist0", Ipv4Addr::new(10, 0, 0, 1), 24);
        cfg.prefix = 33;
        let e = EngineBuilder::xdp(None, cfg).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
