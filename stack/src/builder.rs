//! Starting an engine: the one place where a backend, a TCP stack service and an
//! optional in-engine protocol host are put together on an engine thread.
//!
//! ```no_run
//! use xwarp_stack::builder::{EngineBuilder, PairConfig};
//! # fn main() -> std::io::Result<()> {
//! let (a, b) = EngineBuilder::vwire_pair(PairConfig::default())?;
//! let a = a.spawn()?; // sockets are opened on `a.stack`
//! let b = b.spawn()?;
//! # Ok(()) }
//! ```
//!
//! [`EngineBuilder::spawn`] builds the [`TcpService`] and its [`StackHandle`]
//! ([`crate::new_stack`]), installs the protocol host if one was given
//! ([`EngineBuilder::protocol_host`]), spawns the engine thread on the backend and wires
//! the stack handle's kick to the engine's doorbell, so every command an application
//! queues wakes the engine. [`EngineBuilder::vwire_pair`] makes two builders joined by the
//! virtual wire; `EngineBuilder::xdp` (in [`crate::xdp`]) one on an AF_XDP interface.
//!
//! ## Captures
//! Every engine spawned here records the frames it receives and sends when capture is
//! configured: [`EngineBuilder::capture`], else the process's setting
//! (`xwarp_poll_driver::pcap::set_process_capture`, the tools' `--pcap`), else
//! **`XWARP_PCAP`** (`CaptureSpec::configured`). Each engine gets a file of its own (the
//! `%e`/`-eN` naming of `CaptureSpec`), written as pcapng with one interface named after
//! the engine's link ([`EngineBuilder::interface_name`]: the AF_XDP interface,
//! `vwire-a`/`vwire-b`, else the engine thread's name). A file that cannot be created is
//! reported once on stderr and the engine runs without capture. Off, it costs one branch
//! per engine poll.

use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;

use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::engine::{Doorbell, Engine, EngineConfig, EngineHandle};
use xwarp_poll_driver::pcap::{Capture, CaptureSpec};
use xwarp_poll_driver::vwire::{VirtualNic, VirtualWire, WireConfig};

use crate::proto::ProtocolHost;

/// Say once per process why an engine runs without its `xwarp stat` segment.
fn warn_no_telemetry(e: &io::Error) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::warn!(
            "engine runs without telemetry (xwarp stat will not show it): cannot create \
             its segment in {}: {e}",
            xwarp_telemetry::stats_dir().display()
        );
    });
}
use crate::{new_stack, StackConfig, StackHandle, TcpService};

/// Everything an engine is made of, before it runs: a backend, the TCP stack settings,
/// the engine loop settings and, optionally, a protocol host for the TCP service.
pub struct EngineBuilder<B> {
    backend: B,
    stack: StackConfig,
    engine: EngineConfig,
    host: Option<Box<dyn ProtocolHost>>,
    /// `None`: as the process is configured ([`CaptureSpec::configured`]).
    capture: Option<Option<CaptureSpec>>,
    /// The link's name in a capture.
    iface_name: Option<String>,
}

/// Open the capture of an engine named `engine` on link `iface` as `choice` (or the
/// process's configuration) says; a failure is reported once and means no capture.
fn open_capture(
    choice: Option<Option<CaptureSpec>>,
    iface: Option<&str>,
    engine: &str,
) -> Option<Capture> {
    let spec = choice.unwrap_or_else(CaptureSpec::configured)?;
    let desc = format!("xwarp engine {engine}, pid {}", std::process::id());
    match spec.open_engine(iface.unwrap_or(engine), &desc) {
        Ok(c) => Some(c),
        Err(e) => {
            xwarp_poll_driver::pcap::sink::report_once(&format!(
                "xwarp: engine {engine} runs without capture: {e}"
            ));
            None
        }
    }
}

impl<B> std::fmt::Debug for EngineBuilder<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("stack", &self.stack)
            .field("engine", &self.engine)
            .field("host", &self.host.is_some())
            .field("capture", &self.capture)
            .finish_non_exhaustive()
    }
}

/// A running engine as [`EngineBuilder::spawn`] returns it.
#[derive(Debug)]
pub struct RunningEngine<B> {
    /// The handle sockets are opened on (its kick rings the engine's doorbell).
    pub stack: StackHandle,
    /// The engine thread's control handle (stats, doorbell, stop).
    pub engine: EngineHandle<B, TcpService>,
}

impl<B: Backend + Send + 'static> EngineBuilder<B> {
    /// An engine over `backend` with a TCP stack configured by `stack` and an engine loop
    /// configured by `engine`, without a protocol host.
    pub fn new(backend: B, stack: StackConfig, engine: EngineConfig) -> Self {
        EngineBuilder {
            backend,
            stack,
            engine,
            host: None,
            capture: None,
            iface_name: None,
        }
    }

    /// Capture this engine's frames as `spec` says (`None`: no capture), instead of as
    /// the process is configured (`XWARP_PCAP`, see the module docs).
    pub fn capture(mut self, spec: Option<CaptureSpec>) -> Self {
        self.capture = Some(spec);
        self
    }

    /// The name of the engine's link in a capture (pcapng `if_name`).
    pub fn interface_name(mut self, name: impl Into<String>) -> Self {
        self.iface_name = Some(name.into());
        self
    }

    /// The stack settings the engine will run with (e.g. to size a protocol host by the
    /// MTU before [`Self::protocol_host`]).
    pub fn stack_config(&self) -> &StackConfig {
        &self.stack
    }

    /// The engine loop settings.
    pub fn engine_config(&self) -> &EngineConfig {
        &self.engine
    }

    /// Change the engine loop settings.
    pub fn engine_config_mut(&mut self) -> &mut EngineConfig {
        &mut self.engine
    }

    /// Install `host` in the TCP service ([`TcpService::set_protocol_host`]) when the
    /// engine is spawned.
    pub fn protocol_host(mut self, host: Box<dyn ProtocolHost>) -> Self {
        self.host = Some(host);
        self
    }

    /// Build the stack, install the protocol host, spawn the engine thread and wire the
    /// stack's kick to the engine's doorbell. An invalid stack configuration is
    /// `InvalidInput`.
    ///
    /// Unless `XWARP_STATS=0`, the engine publishes its counters and tables for
    /// `xwarp stat` in a segment under `/dev/shm` (`xwarp-telemetry`), removed when the
    /// engine stops; if the segment cannot be created the engine runs without it.
    pub fn spawn(self) -> io::Result<RunningEngine<B>> {
        let address = describe_addresses(&self.stack);
        let (mut service, stack) =
            new_stack(self.stack).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if let Some(host) = self.host {
            service.set_protocol_host(host);
        }
        let name = &self.engine.name;
        service.set_capture(open_capture(self.capture, self.iface_name.as_deref(), name));
        let telemetry = if xwarp_telemetry::enabled() {
            let info = xwarp_telemetry::SegmentInfo {
                program: String::new(),
                interface: self.backend.interface_label(),
                address,
            };
            // Segments of processes killed by a signal are left behind (no exit hook
            // runs); each new engine removes a few, so they do not pile up.
            xwarp_telemetry::reader::sweep_dead(&xwarp_telemetry::stats_dir(), 16);
            match xwarp_telemetry::Segment::create(&info) {
                Ok(seg) => Some(Arc::new(seg)),
                Err(e) => {
                    warn_no_telemetry(&e);
                    None
                }
            }
        } else {
            None
        };
        if let Some(seg) = &telemetry {
            service.set_telemetry(seg.clone());
        }
        let engine = Engine::spawn_published(
            self.engine,
            Doorbell::new()?,
            self.backend,
            service,
            telemetry,
        )?;
        let bell = engine.doorbell();
        stack.set_kick(Arc::new(move || bell.ring()));
        if let Some(d) = engine.inline_driver() {
            stack.set_inline_driver(d);
        }
        Ok(RunningEngine { stack, engine })
    }
}

/// The stack's addresses as `xwarp stat` shows them (`10.0.0.1/24 fd00::1/64`).
fn describe_addresses(c: &StackConfig) -> String {
    let mut parts = Vec::new();
    if let Some((ip, p)) = c.ipv4 {
        parts.push(format!("{ip}/{p}"));
    }
    if let Some((ip, p)) = c.ipv6 {
        parts.push(format!("{ip}/{p}"));
    }
    parts.join(" ")
}

/// Configuration of a pair of engines joined by the virtual wire
/// ([`EngineBuilder::vwire_pair`]): the wire and both ends.
#[derive(Debug, Clone)]
pub struct PairConfig {
    /// The virtual wire (MTU, faults per direction).
    pub wire: WireConfig,
    /// Stack of end `a` (default 10.77.0.1/24).
    pub a: StackConfig,
    /// Stack of end `b` (default 10.77.0.2/24).
    pub b: StackConfig,
    /// Engine loop settings of both ends (thread names get `-a`/`-b` appended).
    pub engine: EngineConfig,
}

impl Default for PairConfig {
    fn default() -> Self {
        let end = |last: u8| StackConfig {
            mac: [0x02, 0x78, 0x77, 0x00, 0x00, last],
            ipv4: Some((Ipv4Addr::new(10, 77, 0, last), 24)),
            ..StackConfig::default()
        };
        PairConfig {
            wire: WireConfig::default(),
            a: end(1),
            b: end(2),
            engine: EngineConfig::default(),
        }
    }
}

impl EngineBuilder<VirtualNic> {
    /// Two builders whose backends are the ends of one virtual wire, `a` and `b` of
    /// `cfg`; the engine threads are named after `cfg.engine.name` with `-a` / `-b`.
    pub fn vwire_pair(cfg: PairConfig) -> io::Result<(Self, Self)> {
        let (nic_a, nic_b) = VirtualWire::pair(cfg.wire)?;
        let mut ea = cfg.engine.clone();
        ea.name = format!("{}-a", cfg.engine.name);
        let mut eb = cfg.engine;
        eb.name = format!("{}-b", eb.name);
        Ok((
            EngineBuilder::new(nic_a, cfg.a, ea).interface_name("vwire-a"),
            EngineBuilder::new(nic_b, cfg.b, eb).interface_name("vwire-b"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vwire_pair_names_the_engines_after_their_end() {
        let cfg = PairConfig::default();
        let (a, b) = EngineBuilder::vwire_pair(cfg).unwrap();
        assert_eq!(a.engine_config().name, "xwarp-engine-a");
        assert_eq!(b.engine_config().name, "xwarp-engine-b");
        assert_eq!(
            a.stack_config().ipv4,
            Some((Ipv4Addr::new(10, 77, 0, 1), 24))
        );
    }

    /// The pcapng blocks of `bytes`: (type, body).
    fn blocks(mut bytes: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut v = Vec::new();
        while bytes.len() >= 12 {
            let bt = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
            let len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
            v.push((bt, bytes[8..len - 4].to_vec()));
            bytes = &bytes[len..];
        }
        assert!(bytes.is_empty(), "trailing bytes");
        v
    }

    #[test]
    fn each_engine_of_a_pair_captures_to_its_own_file_named_after_its_end() {
        let dir = std::env::temp_dir();
        let tmpl = dir.join(format!("xwarp-builder-{}-%e.pcapng", std::process::id()));
        let spec = CaptureSpec::new(tmpl.to_str().unwrap());
        let (a, b) = EngineBuilder::vwire_pair(PairConfig::default()).unwrap();
        let a = a.capture(Some(spec.clone())).spawn().unwrap();
        let b = b.capture(Some(spec)).spawn().unwrap();
        let live = xwarp_poll_driver::pcap::active_captures();
        let mine: Vec<_> = live
            .iter()
            .filter(|p| p.to_string_lossy().contains("xwarp-builder-"))
            .cloned()
            .collect();
        assert_eq!(mine.len(), 2, "{live:?}");
        assert_ne!(mine[0], mine[1]);
        drop((a.engine.stop().unwrap(), b.engine.stop().unwrap()));
        for (p, end) in mine.iter().zip(["vwire-a", "vwire-b"]) {
            let bytes = std::fs::read(p).unwrap();
            let bl = blocks(&bytes);
            // Section header, the interface (named after the end), statistics at close.
            assert_eq!(bl[0].0, 0x0A0D_0D0A);
            assert_eq!(bl[1].0, 1);
            let idb = &bl[1].1;
            assert_eq!(u16::from_le_bytes([idb[8], idb[9]]), 2, "if_name first");
            assert_eq!(u16::from_le_bytes([idb[10], idb[11]]) as usize, end.len());
            assert_eq!(&idb[12..12 + end.len()], end.as_bytes());
            assert_eq!(bl.last().unwrap().0, 5);
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn an_engine_whose_capture_cannot_be_created_runs_without_it() {
        let (a, b) = EngineBuilder::vwire_pair(PairConfig::default()).unwrap();
        let spec = CaptureSpec::new("/nonexistent-xwarp-dir/%e.pcapng");
        let a = a.capture(Some(spec)).spawn().unwrap();
        let b = b.capture(None).spawn().unwrap();
        let ea = a.engine.stop().unwrap();
        assert!(ea.service.capture().is_none());
        assert!(ea.error.is_none());
        assert!(b.engine.stop().unwrap().service.capture().is_none());
    }

    /// The live segment of this process whose engine owns `address`.
    fn segment_of(address: &str) -> Option<xwarp_telemetry::reader::EngineSnapshot> {
        let dir = xwarp_telemetry::stats_dir();
        xwarp_telemetry::reader::scan(&dir)
            .ok()?
            .into_iter()
            .filter(|f| f.pid == std::process::id())
            .filter_map(|f| f.segment.ok())
            .find(|s| s.address == address)
    }

    #[test]
    fn spawned_engines_publish_their_connections_and_remove_the_segment_on_stop() {
        use std::net::SocketAddr;
        use std::time::{Duration, Instant};
        let mut cfg = PairConfig::default();
        cfg.a.ipv4 = Some((Ipv4Addr::new(10, 77, 31, 1), 24));
        cfg.b.ipv4 = Some((Ipv4Addr::new(10, 77, 31, 2), 24));
        let (a, b) = EngineBuilder::vwire_pair(cfg).unwrap();
        let (a, b) = (a.spawn().unwrap(), b.spawn().unwrap());
        let srv: SocketAddr = "10.77.31.2:7000".parse().unwrap();
        let l = b.stack.listen(srv, 4, Duration::from_secs(5)).unwrap();
        let mut c = a.stack.connect(srv, None, None).unwrap();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = loop {
            if let Ok(s) = l.try_accept() {
                break s;
            }
            assert!(Instant::now() < deadline, "no connection");
            std::thread::sleep(Duration::from_millis(1));
        };
        let (mut sent, mut got) = (0, Vec::new());
        let mut buf = [0u8; 4096];
        while got.len() < data.len() {
            assert!(Instant::now() < deadline, "transfer stalled");
            if sent < data.len() {
                sent += c.try_write(&data[sent..]).unwrap_or(0);
            }
            match s.try_read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        assert_eq!(got, data);
        // Published within about 100 ms of the transfer, without further traffic.
        let snap = loop {
            let snap = segment_of("10.77.31.1/24").expect("no segment for engine a");
            let done = snap
                .conns
                .records
                .iter()
                .any(|r| r.bytes_acked >= data.len() as u64);
            if done {
                break snap;
            }
            assert!(Instant::now() < deadline, "never published: {snap:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(snap.interface, "vwire");
        let r = &snap.conns.records[0];
        assert_eq!(xwarp_telemetry::layout::tcp_state_name(r.state), "ESTAB");
        assert_eq!(r.remote, Some(srv));
        // smoltcp keeps its congestion window private; the own core reports it.
        let own = crate::config::TcpCore::from_env() == crate::config::TcpCore::Own;
        assert_eq!(r.cwnd.is_some(), own);
        assert!(snap.stack.established >= 1 && snap.stack.tx_bytes >= data.len() as u64);
        assert!(snap.nic.tx_bytes > data.len() as u64, "{:?}", snap.nic);
        assert!(snap.engine.iterations > 0);
        let b_snap = segment_of("10.77.31.2/24").expect("no segment for engine b");
        assert_eq!(b_snap.stack.accepted, 1);
        let (pa, pb) = (snap.path.clone(), b_snap.path.clone());
        drop((c, s, l));
        drop((a, b));
        assert!(!pa.exists() && !pb.exists(), "segments left after stop");
    }

    #[test]
    fn spawn_rejects_an_invalid_stack_config() {
        let (nic, _peer) = VirtualWire::pair(WireConfig::default()).unwrap();
        let bad = StackConfig {
            mtu: 10,
            ..StackConfig::default()
        };
        let e = EngineBuilder::new(nic, bad, EngineConfig::default())
            .spawn()
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
