//! Starting engines: a TCP stack service on an engine thread over any backend, and a
//! pair of them joined by the virtual wire.

use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;

use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::engine::{Engine, EngineConfig, EngineExit, EngineHandle, EngineStats};
use xwarp_poll_driver::vwire::{VirtualNic, VirtualWire, WireConfig};
use xwarp_stack::{new_stack, StackConfig, StackHandle, TcpService};

/// A running TCP engine: an engine thread driving a backend and the TCP stack service.
/// Dropping it stops the engine; sockets of a stopped engine fail with
/// `ConnectionAborted`.
#[derive(Debug)]
pub struct NetEngine<B: Backend + Send + 'static> {
    stack: StackHandle,
    engine: EngineHandle<B, TcpService>,
}

impl<B: Backend + Send + 'static> NetEngine<B> {
    /// Start an engine thread over `backend` with a TCP stack configured by `stack_config`.
    pub fn start(
        backend: B,
        stack_config: StackConfig,
        engine_config: EngineConfig,
    ) -> io::Result<Self> {
        let (service, stack) =
            new_stack(stack_config).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let engine = Engine::spawn(engine_config, backend, service)?;
        let bell = engine.doorbell();
        stack.set_kick(Arc::new(move || bell.ring()));
        Ok(NetEngine { stack, engine })
    }

    /// The handle sockets are opened on.
    pub fn stack(&self) -> &StackHandle {
        &self.stack
    }

    /// Engine loop counters.
    pub fn engine_stats(&self) -> EngineStats {
        self.engine.stats()
    }

    /// The engine thread's control handle.
    pub fn engine(&self) -> &EngineHandle<B, TcpService> {
        &self.engine
    }

    /// Stop the engine and get the backend and the service back.
    pub fn stop(self) -> io::Result<EngineExit<B, TcpService>> {
        self.engine.stop()
    }
}

/// Configuration of [`vwire_pair_with`]: the wire and both ends.
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

/// Two engines (10.77.0.1 and 10.77.0.2 by default) joined by a virtual wire.
pub fn vwire_pair(wire: WireConfig) -> io::Result<(NetEngine<VirtualNic>, NetEngine<VirtualNic>)> {
    vwire_pair_with(PairConfig {
        wire,
        ..PairConfig::default()
    })
}

/// Two engines joined by a virtual wire, fully configured.
pub fn vwire_pair_with(
    cfg: PairConfig,
) -> io::Result<(NetEngine<VirtualNic>, NetEngine<VirtualNic>)> {
    let (nic_a, nic_b) = VirtualWire::pair(cfg.wire)?;
    let mut ea = cfg.engine.clone();
    ea.name = format!("{}-a", cfg.engine.name);
    let mut eb = cfg.engine;
    eb.name = format!("{}-b", eb.name);
    let a = NetEngine::start(nic_a, cfg.a, ea)?;
    let b = NetEngine::start(nic_b, cfg.b, eb)?;
    Ok((a, b))
}
