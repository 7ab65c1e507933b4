//! The engine and the device: [`Context`] (an engine with the verbs host, started
//! through [`xwarp_stack::builder::EngineBuilder`]) and [`Device`], the cloneable handle
//! every verbs object is created from.

use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::engine::{Doorbell, EngineConfig, EngineHandle, EngineStats};
use xwarp_poll_driver::vwire::{VirtualNic, WireConfig};
use xwarp_stack::builder::{EngineBuilder, PairConfig, RunningEngine};
use xwarp_stack::xdp::XdpEngineConfig;
use xwarp_stack::{StackConfig, StackHandle, StackStats, TcpService};

use crate::cq::{CompletionQueue, CqShared};
use crate::engine::cmd::Cmd;
use crate::engine::host::VerbsHost;

/// Shared application-side state of one device (engine).
pub(crate) struct DevInner {
    pub(crate) cmds: Sender<Cmd>,
    pub(crate) bell: Doorbell,
    pub(crate) next_qpn: AtomicU32,
    pub(crate) next_pd: AtomicU32,
    pub(crate) next_token: AtomicU32,
    /// The engine's IPv4 address (for [`Device::local_ipv4`]).
    pub(crate) ipv4: Option<Ipv4Addr>,
}

impl DevInner {
    pub(crate) fn send(&self, cmd: Cmd) -> io::Result<()> {
        self.cmds
            .send(cmd)
            .map_err(|_| io::Error::new(io::ErrorKind::ConnectionAborted, "engine stopped"))?;
        self.bell.ring();
        Ok(())
    }

    pub(crate) fn call<T>(&self, make: impl FnOnce(Sender<T>) -> Cmd) -> io::Result<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(make(tx))?;
        rx.recv_timeout(Duration::from_secs(10))
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "engine did not answer"))
    }
}

/// A running engine with the verbs host: the TCP stack (also usable through
/// `xwarp::net` via [`Context::stack`]) and the iWARP data path on one engine thread.
/// Dropping it stops the engine.
pub struct Context<B: Backend + Send + 'static> {
    dev: Device,
    stack: StackHandle,
    engine: Option<EngineHandle<B, TcpService>>,
}

impl<B: Backend + Send + 'static> std::fmt::Debug for Context<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl<B: Backend + Send + 'static> Context<B> {
    /// Start an engine thread over `backend`.
    pub fn start(
        backend: B,
        stack_config: StackConfig,
        engine_config: EngineConfig,
    ) -> io::Result<Self> {
        Self::from_builder(EngineBuilder::new(backend, stack_config, engine_config))
    }

    /// Install the verbs host in the engine `builder` describes and spawn it.
    pub fn from_builder(builder: EngineBuilder<B>) -> io::Result<Self> {
        let stack_config = builder.stack_config();
        let ipv4 = stack_config.ipv4.map(|a| a.0);
        // EMSS: MTU minus IPv4 and TCP headers, minus the timestamp option.
        let emss =
            stack_config.mtu.saturating_sub(40) - if stack_config.timestamps { 12 } else { 0 };
        let (tx, rx) = crossbeam_channel::unbounded();
        let RunningEngine { stack, engine } = builder
            .protocol_host(Box::new(VerbsHost::new(rx, emss)))
            .spawn()?;
        Ok(Context {
            dev: Device {
                inner: Arc::new(DevInner {
                    cmds: tx,
                    bell: engine.doorbell(),
                    next_qpn: AtomicU32::new(1),
                    next_pd: AtomicU32::new(1000),
                    next_token: AtomicU32::new(1),
                    ipv4,
                }),
            },
            stack,
            engine: Some(engine),
        })
    }

    /// The device handle (cloneable; objects created from it keep working while the
    /// context lives).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The TCP stack of this engine (for `xwarp::net` sockets next to RDMA).
    pub fn stack(&self) -> &StackHandle {
        &self.stack
    }

    /// TCP counters.
    pub fn stack_stats(&self) -> StackStats {
        self.stack.stats()
    }

    /// A statistics snapshot of every QP of this engine, by QP number (one command-queue
    /// round trip, like [`QueuePair::stats`](crate::QueuePair::stats)).
    pub fn qp_stats(&self) -> io::Result<Vec<crate::qp_stats::QpStatsSnapshot>> {
        self.dev.inner.call(|reply| Cmd::AllQpStats { reply })
    }

    /// Engine loop counters.
    pub fn engine_stats(&self) -> EngineStats {
        self.engine.as_ref().map(|e| e.stats()).unwrap_or_default()
    }

    /// Stop the engine and return its backend.
    pub fn stop(mut self) -> io::Result<B> {
        match self.engine.take() {
            Some(e) => e.stop().map(|x| x.backend),
            None => Err(io::Error::other("engine already stopped")),
        }
    }
}

impl<B: Backend + Send + 'static> Drop for Context<B> {
    fn drop(&mut self) {
        if let Some(e) = self.engine.take() {
            let _ = e.stop();
        }
    }
}

/// Two verbs engines (10.77.0.1 and 10.77.0.2 by default) joined by a virtual wire.
pub fn vwire_pair(cfg: PairConfig) -> io::Result<(Context<VirtualNic>, Context<VirtualNic>)> {
    let (a, b) = EngineBuilder::vwire_pair(cfg)?;
    Ok((Context::from_builder(a)?, Context::from_builder(b)?))
}

/// A verbs engine on a real interface through AF_XDP (see [`xwarp_stack::xdp`]).
pub type XdpContext = Context<xwarp_poll_driver::afxdp::AfXdpNic>;

impl Context<xwarp_poll_driver::afxdp::AfXdpNic> {
    /// Open an AF_XDP NIC on `cfg.ifname` in namespace `ns` (the caller's own when `None`)
    /// and start a verbs engine on it: [`EngineBuilder::xdp`] followed by
    /// [`Context::from_builder`], so the verbs host is installed before the engine
    /// spawns. Root is needed.
    pub fn start_xdp(
        ns: Option<&xwarp_poll_driver::netns::NetNs>,
        cfg: XdpEngineConfig,
    ) -> io::Result<Self> {
        Context::from_builder(EngineBuilder::xdp(ns, cfg)?)
    }
}

/// [`vwire_pair`] with default addresses and engines over `wire`.
pub fn vwire_pair_simple(
    wire: WireConfig,
) -> io::Result<(Context<VirtualNic>, Context<VirtualNic>)> {
    vwire_pair(PairConfig {
        wire,
        ..Default::default()
    })
}

/// A cloneable handle on one verbs engine.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DevInner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ipv4", &self.inner.ipv4)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// The engine's IPv4 address.
    pub fn local_ipv4(&self) -> Option<Ipv4Addr> {
        self.inner.ipv4
    }

    /// Create a completion queue. `depth` is advisory (the queue grows as needed).
    pub fn create_cq(&self, depth: usize) -> io::Result<CompletionQueue> {
        Ok(CompletionQueue {
            shared: Arc::new(CqShared::new(depth)?),
            driver: self.inner.bell.inline_driver().cloned(),
        })
    }
}
