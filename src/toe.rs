//! The TCP engine on a real interface: an AF_XDP socket bound to a Linux interface
//! (typically one end of a veth pair inside a network namespace) driving an xwarp
//! [`NetEngine`].
//!
//! ```no_run
//! use std::net::Ipv4Addr;
//! use xwarp::net::TcpListener;
//! use xwarp::poll_driver::netns::VethPair;
//! use xwarp::toe::{start_xdp_engine, XdpEngineConfig};
//! # fn main() -> std::io::Result<()> {
//! let net = VethPair::new(7)?;
//! // The engine owns 10.88.7.10, an address the kernel in namespace A does not have.
//! let cfg = XdpEngineConfig::new(&net.if_a, Ipv4Addr::new(10, 88, 7, 10), 24);
//! let engine = start_xdp_engine(Some(&net.a), cfg)?;
//! let listener = TcpListener::bind(engine.stack(), "10.88.7.10:80".parse().unwrap())?;
//! # Ok(()) }
//! ```
//!
//! The configuration, the opening of the NIC and the checksum policy live in
//! [`xwarp_stack::xdp`] (re-exported here); its module docs say what
//! [`start_xdp_engine`] does and how checksums are handled.

use std::io;

use xwarp_poll_driver::afxdp::AfXdpNic;
use xwarp_poll_driver::netns::NetNs;
use xwarp_stack::builder::EngineBuilder;

pub use xwarp_stack::xdp::{open_xdp_nic, RxChecksum, XdpEngineConfig, DEFAULT_RX_FRAMES};

use crate::net::NetEngine;

/// An engine running on an AF_XDP interface.
pub type XdpEngine = NetEngine<AfXdpNic>;

/// Open an AF_XDP NIC on `cfg.ifname` inside namespace `ns` (the caller's own namespace when
/// `None`) and start a TCP engine on it. The stack's MAC is the interface's, its MTU the
/// NIC's (see [`xwarp_stack::xdp`]). Root is needed.
pub fn start_xdp_engine(ns: Option<&NetNs>, cfg: XdpEngineConfig) -> io::Result<XdpEngine> {
    NetEngine::from_builder(EngineBuilder::xdp(ns, cfg)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn rejects_bad_prefix_before_touching_the_kernel() {
        let mut cfg = XdpEngineConfig::new("does-not-exist0", Ipv4Addr::new(10, 0, 0, 1), 24);
        cfg.prefix = 33;
        let e = start_xdp_engine(None, cfg).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
