//! The byte streams the interop tools run iWARP over, and how they are chosen.
//!
//! `xwarp-rping-interop` and `xwarp-perftest-peer` run their sans-IO connection over a
//! [`Transport`] (`xwarp-rping` only takes the engine selection, [`NetArgs::engine_spec`],
//! and runs on `xwarp::verbs`). Two transports exist:
//!
//! * [`KernelTcp`]: a kernel TCP socket (`std::net`), the default, for quick local use;
//! * [`EngineTcp`]: a TCP stream of an xwarp engine ([`xwarp::net::TcpStream`]) bound with
//!   AF_XDP to an interface, owning its own IPv4 address on that link.
//!
//! [`Net::from_args`] picks one from the command line ([`NetArgs`]): `--iface IF --addr
//! A.B.C.D/PREFIX [--gateway G] [--rx-checksum verify]` → an engine on `IF` in the caller's
//! network namespace (the interop harness runs the tools inside its namespace with
//! `ip netns exec`). Without engine flags it falls back to **`XWARP_ENGINE`**
//! ([`Net::from_env`]): unset or `kernel` → kernel TCP; `xdp:IFACE:ADDR/PREFIX` (e.g.
//! `xdp:tap0:10.77.0.3/24`) → an engine on `IFACE`. `--rx-checksum verify` (or the
//! variable's `,verify` suffix) checks every received L4 checksum ([`RxChecksum::Verify`]);
//! the default trusts them ([`RxChecksum::TrustL4`], see `xwarp::toe`). Like every engine,
//! it records every frame it receives and sends when **`XWARP_PCAP`** is set (the engine
//! builder does it, `xwarp_poll_driver::pcap`); `%p` in that path becomes the process id,
//! so several tool processes of one run write separate files.
//!
//! Call [`Net::finish`] before the process exits: it lets the engine send the last ACKs,
//! stops it, and flushes the capture.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use xwarp::net::{NetEngine, StackConfig};
use xwarp::poll_driver::afxdp::{AfXdpConfig, AfXdpNic, SteeringFilter};
use xwarp::poll_driver::engine::EngineConfig;
use xwarp::stack::builder::EngineBuilder;
use xwarp::toe::RxChecksum;

use crate::cli::EngineArgs;

/// The environment variable selecting the transport (see the module docs).
pub const ENGINE_ENV: &str = "XWARP_ENGINE";

/// Ethernet header bytes in front of the IP packet.
const ETHERNET_HEADER_LEN: usize = 14;

/// How long [`Net::finish`] lets the engine run after the last connection closed (final
/// ACKs of the peer's FIN, a late retransmission).
const FINISH_LINGER: Duration = Duration::from_millis(300);

/// A reliable byte stream the iWARP connection runs over.
pub trait Transport {
    /// Sends all of `data`.
    fn send_all(&mut self, data: &[u8]) -> io::Result<()>;
    /// Receives into `buf`, waiting at most `timeout`: `Ok(None)` on timeout, `Ok(Some(0))`
    /// when the peer closed.
    fn recv(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>>;
    /// Closes our direction (FIN).
    fn shutdown(&mut self);
}

/// A kernel TCP socket (std::net), with `TCP_NODELAY` like siw's sockets.
pub struct KernelTcp(std::net::TcpStream);

impl KernelTcp {
    /// Wraps an accepted or connected stream.
    pub fn new(s: std::net::TcpStream) -> io::Result<KernelTcp> {
        s.set_nodelay(true)?;
        Ok(KernelTcp(s))
    }
}

/// Maps a read result onto [`Transport::recv`]'s convention.
fn recv_result(r: io::Result<usize>) -> io::Result<Option<usize>> {
    match r {
        Ok(n) => Ok(Some(n)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(None)
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(Some(0)),
        Err(e) => Err(e),
    }
}

impl Transport for KernelTcp {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.write_all(data)
    }

    fn recv(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        self.0
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        recv_result(self.0.read(buf))
    }

    fn shutdown(&mut self) {
        let _ = self.0.shutdown(Shutdown::Write);
    }
}

/// A TCP stream of an xwarp engine, with Nagle off like siw's sockets.
pub struct EngineTcp(xwarp::net::TcpStream);

impl EngineTcp {
    /// Wraps an accepted or connected engine stream.
    pub fn new(mut s: xwarp::net::TcpStream) -> io::Result<EngineTcp> {
        s.set_nodelay(true)?;
        Ok(EngineTcp(s))
    }
}

impl Transport for EngineTcp {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.write_all(data)
    }

    fn recv(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        self.0
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        recv_result(self.0.read(buf))
    }

    fn shutdown(&mut self) {
        let _ = self.0.shutdown(Shutdown::Write);
    }
}

/// Either transport, as chosen by [`Net`].
pub enum Stream {
    /// Kernel TCP.
    Kernel(KernelTcp),
    /// xwarp engine TCP.
    Engine(EngineTcp),
}

impl Transport for Stream {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Stream::Kernel(s) => s.send_all(data),
            Stream::Engine(s) => s.send_all(data),
        }
    }

    fn recv(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        match self {
            Stream::Kernel(s) => s.recv(buf, timeout),
            Stream::Engine(s) => s.recv(buf, timeout),
        }
    }

    fn shutdown(&mut self) {
        match self {
            Stream::Kernel(s) => s.shutdown(),
            Stream::Engine(s) => s.shutdown(),
        }
    }
}

/// A parsed `xdp:IFACE:ADDR/PREFIX[,verify]` engine selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpec {
    /// Interface to bind AF_XDP to.
    pub ifname: String,
    /// The engine's own IPv4 address (not configured on the kernel's interface).
    pub ipv4: Ipv4Addr,
    /// Prefix length of `ipv4`.
    pub prefix: u8,
    /// Received L4 checksum policy.
    pub rx_checksum: RxChecksum,
    /// IPv4 default gateway of the engine (`--gateway`; none from `XWARP_ENGINE`).
    pub gateway: Option<Ipv4Addr>,
}

/// What the received L4 checksums get (`--rx-checksum`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxPolicy {
    /// Trust them (`RxChecksum::TrustL4`, the default).
    Trust,
    /// Check every one (`RxChecksum::Verify`).
    Verify,
}

/// The engine flags of the rping-family tools: [`EngineArgs`] plus the checksum policy.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NetArgs {
    /// The engine to run on (`--iface IF --addr A/P [--gateway G]`).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// With --iface: check every received L4 checksum (verify) or trust them (trust, the
    /// default).
    #[arg(long, value_name = "POLICY")]
    pub rx_checksum: Option<RxPolicy>,
}

impl EngineSpec {
    /// Parses `xdp:IFACE:ADDR/PREFIX` with an optional `,verify` or `,trust` suffix.
    pub fn parse(s: &str) -> Result<EngineSpec, String> {
        let bad = |why: &str| format!("{ENGINE_ENV}={s:?}: {why} (want xdp:IFACE:ADDR/PREFIX)");
        let (main, opt) = match s.split_once(',') {
            Some((m, o)) => (m, Some(o)),
            None => (s, None),
        };
        let rx_checksum = match opt {
            None | Some("trust") => RxChecksum::TrustL4,
            Some("verify") => RxChecksum::Verify,
            Some(_) => return Err(bad("unknown option")),
        };
        let rest = main
            .strip_prefix("xdp:")
            .ok_or_else(|| bad("no xdp: prefix"))?;
        let (ifname, net) = rest.split_once(':').ok_or_else(|| bad("no address"))?;
        if ifname.is_empty() || ifname.len() > 15 {
            return Err(bad("bad interface name"));
        }
        let (addr, prefix) = net.split_once('/').ok_or_else(|| bad("no prefix length"))?;
        let ipv4: Ipv4Addr = addr.parse().map_err(|_| bad("bad IPv4 address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| bad("bad prefix length"))?;
        if prefix > 32 || ipv4.is_unspecified() {
            return Err(bad("address or prefix out of range"));
        }
        Ok(EngineSpec {
            ifname: ifname.to_string(),
            ipv4,
            prefix,
            rx_checksum,
            gateway: None,
        })
    }
}

/// First local port of a process's engine: spread over 49152..=65532 by process id, so
/// consecutive example processes in one capture use different 4-tuples (each engine starts
/// its ephemeral ports at the range's start; identical 4-tuples from sequential processes
/// make tshark fold connections together, and could meet the peer's TIME_WAIT).
pub fn ephemeral_start(pid: u32) -> u16 {
    49152 + ((pid % 4096) * 4) as u16
}

/// The engine type: an AF_XDP NIC (capturing as the process is configured).
type Engine = NetEngine<AfXdpNic>;

/// Starts an engine for `spec` in the caller's namespace.
fn start_engine(spec: &EngineSpec) -> io::Result<Engine> {
    let mut xcfg = AfXdpConfig::new(
        &spec.ifname,
        SteeringFilter::new(vec![spec.ipv4], Vec::new()),
    );
    xcfg.checksum = spec.rx_checksum.capabilities();
    let nic = AfXdpNic::open(xcfg)?;
    let frame = smoltcp::phy::Device::capabilities(&nic).max_transmission_unit;
    let mtu = frame.saturating_sub(ETHERNET_HEADER_LEN);
    if mtu < 576 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: IP MTU {mtu} is below 576", spec.ifname),
        ));
    }
    let stack = StackConfig {
        mac: nic.mac_address(),
        ipv4: Some((spec.ipv4, spec.prefix)),
        ipv4_gateway: spec.gateway,
        mtu,
        ephemeral_ports: ephemeral_start(std::process::id())..=65535,
        ..StackConfig::default()
    };
    let engine = EngineConfig {
        name: "xwarp-interop".into(),
        ..EngineConfig::default()
    };
    let builder = EngineBuilder::new(nic, stack, engine).interface_name(spec.ifname.as_str());
    NetEngine::from_builder(builder)
}

/// Where the tools' TCP comes from: the kernel or an xwarp engine.
pub enum Net {
    /// Kernel TCP sockets.
    Kernel,
    /// An xwarp engine owning `spec.ipv4` on `spec.ifname`.
    Engine {
        /// The selection it was started from.
        spec: EngineSpec,
        /// The running engine.
        engine: Box<Engine>,
    },
}

/// A listening socket of either kind.
pub enum Listener {
    /// Kernel listener.
    Kernel(std::net::TcpListener),
    /// Engine listener.
    Engine(xwarp::net::TcpListener),
}

impl NetArgs {
    /// Whether the engine flags go together (`--iface` with `--addr`; `--gateway` and
    /// `--rx-checksum` only with them): the tools call it right after parsing, so a bad
    /// combination is a command-line error (status 2 with the usage).
    pub fn check(&self) -> Result<(), String> {
        let e = &self.engine;
        if e.iface.is_none() && (e.addr.is_some() || e.gateway.is_some()) {
            return Err("--addr and --gateway need --iface".into());
        }
        if e.iface.is_some() && e.addr.is_none() {
            return Err("--iface needs --addr A.B.C.D/PREFIX (the engine's own address)".into());
        }
        if e.iface.is_none() && self.rx_checksum.is_some() {
            return Err("--rx-checksum needs --iface".into());
        }
        Ok(())
    }

    /// The engine the flags select, or without them `XWARP_ENGINE` ([`Net::from_env`]);
    /// `None`: kernel TCP. Applies `--pcap` (every engine started afterwards captures).
    pub fn engine_spec(&self) -> Result<Option<EngineSpec>, String> {
        self.check()?;
        self.engine.apply_pcap();
        if self.engine.is_empty() {
            return match std::env::var(ENGINE_ENV) {
                Err(_) => Ok(None),
                Ok(v) if v.is_empty() || v == "kernel" => Ok(None),
                Ok(v) => EngineSpec::parse(&v).map(Some),
            };
        }
        let ifname = self
            .engine
            .iface
            .clone()
            .ok_or("--addr and --gateway need --iface")?;
        let (ipv4, prefix) = self
            .engine
            .addr
            .ok_or("--iface needs --addr A.B.C.D/PREFIX (the engine's own address)")?;
        let rx_checksum = match self.rx_checksum {
            Some(RxPolicy::Verify) => RxChecksum::Verify,
            Some(RxPolicy::Trust) | None => RxChecksum::TrustL4,
        };
        Ok(Some(EngineSpec {
            ifname,
            ipv4,
            prefix,
            rx_checksum,
            gateway: self.engine.gateway,
        }))
    }

    /// Parse `T` from the process's command line and check its engine flags (`net` of
    /// it): exits with status 2 and the usage on a bad combination, like clap does.
    pub fn parse_checked<T: clap::Parser>(net: impl Fn(&T) -> &NetArgs) -> T {
        let t = T::parse();
        if let Err(e) = net(&t).check() {
            T::command()
                .error(clap::error::ErrorKind::ArgumentConflict, e)
                .exit();
        }
        t
    }
}

impl Net {
    /// An engine as the command line's engine flags say, or without them as
    /// `XWARP_ENGINE` says ([`Net::from_env`]; see the module docs).
    pub fn from_args(a: &NetArgs) -> Result<Net, String> {
        match a.engine_spec()? {
            Some(spec) => Net::start(spec),
            None => Ok(Net::Kernel),
        }
    }

    /// Kernel TCP, or an engine started as `XWARP_ENGINE` says (see the module docs).
    pub fn from_env() -> Result<Net, String> {
        match std::env::var(ENGINE_ENV) {
            Err(_) => Ok(Net::Kernel),
            Ok(v) if v.is_empty() || v == "kernel" => Ok(Net::Kernel),
            Ok(v) => Net::start(EngineSpec::parse(&v)?),
        }
    }

    /// Start an engine for `spec` (capturing to `XWARP_PCAP` if set).
    fn start(spec: EngineSpec) -> Result<Net, String> {
        let engine =
            start_engine(&spec).map_err(|e| format!("xwarp engine on {}: {e}", spec.ifname))?;
        let pcap = xwarp::poll_driver::pcap::active_captures().pop();
        eprintln!(
            "xwarp: engine on {} owns {}/{} ({:?}){}",
            spec.ifname,
            spec.ipv4,
            spec.prefix,
            spec.rx_checksum,
            pcap.map(|p| format!(", capture {}", p.display()))
                .unwrap_or_default()
        );
        Ok(Net::Engine {
            spec,
            engine: Box::new(engine),
        })
    }

    /// Connects to `addr:port`, retrying refused attempts for up to `retry` (the guest's
    /// server may not listen yet; `Duration::ZERO`: one attempt).
    pub fn connect(&self, addr: &str, port: u16, retry: Duration) -> Result<Stream, String> {
        let target = (addr, port)
            .to_socket_addrs()
            .map_err(|e| format!("{addr}: {e}"))?
            .next()
            .ok_or("no address")?;
        let deadline = Instant::now() + retry;
        loop {
            let r = match self {
                Net::Kernel => {
                    std::net::TcpStream::connect_timeout(&target, Duration::from_secs(3))
                        .and_then(KernelTcp::new)
                        .map(Stream::Kernel)
                }
                Net::Engine { engine, .. } => xwarp::net::TcpStream::connect_timeout(
                    engine.stack(),
                    target,
                    Duration::from_secs(3),
                )
                .and_then(EngineTcp::new)
                .map(Stream::Engine),
            };
            match r {
                Ok(s) => return Ok(s),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(300));
                }
                Err(e) => return Err(format!("connect {target}: {e}")),
            }
        }
    }

    /// Listens on `bind:port`. On the engine an unspecified `bind` (`0.0.0.0`) means the
    /// engine's own address.
    pub fn listen(&self, bind: &str, port: u16) -> Result<Listener, String> {
        match self {
            Net::Kernel => std::net::TcpListener::bind((bind, port))
                .map(Listener::Kernel)
                .map_err(|e| format!("bind {bind}: {e}")),
            Net::Engine { spec, engine } => {
                let ip: IpAddr = bind
                    .parse()
                    .map_err(|_| format!("bind {bind}: not an IP"))?;
                let ip = if ip.is_unspecified() {
                    IpAddr::V4(spec.ipv4)
                } else {
                    ip
                };
                xwarp::net::TcpListener::bind(engine.stack(), SocketAddr::new(ip, port))
                    .map(Listener::Engine)
                    .map_err(|e| format!("bind {ip}:{port}: {e}"))
            }
        }
    }

    /// The address peers reach us at: the engine's, or `None` on kernel TCP.
    pub fn engine_addr(&self) -> Option<Ipv4Addr> {
        match self {
            Net::Kernel => None,
            Net::Engine { spec, .. } => Some(spec.ipv4),
        }
    }

    /// Lets the engine finish its last exchanges, stops it and flushes the capture (a
    /// no-op on kernel TCP). Call after every stream was dropped or closed.
    pub fn finish(self) {
        if let Net::Engine { engine, .. } = self {
            std::thread::sleep(FINISH_LINGER);
            match engine.stop() {
                // Dropping the backend drops the capture sink, which flushes the file.
                Ok(exit) => drop(exit),
                Err(e) => eprintln!("xwarp: stopping the engine: {e}"),
            }
        }
    }
}

impl Listener {
    /// Accepts the next connection (blocking).
    pub fn accept(&self) -> Result<(Stream, SocketAddr), String> {
        match self {
            Listener::Kernel(l) => {
                let (s, peer) = l.accept().map_err(|e| format!("accept: {e}"))?;
                let s = KernelTcp::new(s).map_err(|e| e.to_string())?;
                Ok((Stream::Kernel(s), peer))
            }
            Listener::Engine(l) => {
                let (s, peer) = l.accept().map_err(|e| format!("accept: {e}"))?;
                let s = EngineTcp::new(s).map_err(|e| e.to_string())?;
                Ok((Stream::Engine(s), peer))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_spec_parses_interface_address_prefix_and_policy() {
        let s = EngineSpec::parse("xdp:tap0:10.77.0.3/24").unwrap();
        assert_eq!(s.ifname, "tap0");
        assert_eq!(s.ipv4, Ipv4Addr::new(10, 77, 0, 3));
        assert_eq!(s.prefix, 24);
        assert_eq!(s.rx_checksum, RxChecksum::TrustL4);
        let v = EngineSpec::parse("xdp:veth1:192.168.5.9/30,verify").unwrap();
        assert_eq!(v.rx_checksum, RxChecksum::Verify);
        assert_eq!(v.prefix, 30);
    }

    #[test]
    fn ephemeral_ports_differ_between_consecutive_processes_and_stay_in_range() {
        for pid in [0u32, 1, 4095, 4096, 123_456, u32::MAX] {
            let p = ephemeral_start(pid);
            assert!((49152..=65532).contains(&p), "pid {pid}: {p}");
            assert_ne!(p, ephemeral_start(pid.wrapping_add(1)), "pid {pid}");
        }
    }

    #[test]
    fn engine_spec_rejects_malformed_selections() {
        for bad in [
            "",
            "tap0:10.77.0.3/24",
            "xdp:tap0",
            "xdp::10.77.0.3/24",
            "xdp:tap0:10.77.0.3",
            "xdp:tap0:10.77.0.300/24",
            "xdp:tap0:10.77.0.3/33",
            "xdp:tap0:0.0.0.0/24",
            "xdp:tap0:10.77.0.3/24,fast",
            "xdp:averyveryverylongname:10.77.0.3/24",
        ] {
            assert!(EngineSpec::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
