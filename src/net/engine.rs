//! Starting engines: a TCP stack service on an engine thread over any backend, and a
//! pair of them joined by the virtual wire (both through
//! [`xwarp_stack::builder::EngineBuilder`]).

use std::io;

use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::engine::{EngineConfig, EngineExit, EngineHandle, EngineStats};
use xwarp_poll_driver::vwire::{VirtualNic, WireConfig};
use xwarp_stack::builder::{EngineBuilder, PairConfig, RunningEngine};
use xwarp_stack::{StackConfig, StackHandle, TcpService};

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
        Self::from_builder(EngineBuilder::new(backend, stack_config, engine_config))
    }

    /// Spawn the engine `builder` describes (a protocol host it carries stays installed).
    pub fn from_builder(builder: EngineBuilder<B>) -> io::Result<Self> {
        let RunningEngine { stack, engine } = builder.spawn()?;
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
    let (a, b) = EngineBuilder::vwire_pair(cfg)?;
    Ok((NetEngine::from_builder(a)?, NetEngine::from_builder(b)?))
}
