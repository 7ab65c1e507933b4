//! # xwarp-stack — the TCP engine on smoltcp
//!
//! [`TcpService`] wraps a smoltcp `Interface` and `SocketSet` and implements the
//! poll-driver [`Service`](xwarp_poll_driver::engine::Service) contract: the engine thread
//! owns every piece of TCP state. Applications reach it only through a [`StackHandle`]:
//! a command queue (connect, listen, accept, close, shutdown, options) and, per socket,
//! two lock-free SPSC byte rings plus a readiness eventfd.
//!
//! smoltcp's gaps against a Linux peer (no listen backlog, no SACK, fixed TIME-WAIT, ...)
//! and what this crate does about them are listed in the crate README.
#![warn(missing_docs)]

mod api;
pub mod builder;
mod command;
pub mod config;
mod conn;
mod device;
mod engine;
mod hosted;
mod own;
mod ports;
pub mod proto;
mod rescue;
mod service;
mod shared;
mod socket;
mod stats;
pub mod tcp;
#[cfg(target_os = "linux")]
pub mod xdp;

pub use api::{Kick, ListenSocket, StackHandle, Stream};
pub use command::AcceptedConn;
pub use config::{
    socket_buffer_size, ConfigError, Congestion, KeepAlive, SocketOptions, StackConfig, TcpCore,
    TcpOptions, MAX_SOCKET_BUFFER, MIN_SOCKET_BUFFER,
};
pub use service::TcpService;
pub use shared::{readiness_signals, Phase, Readiness, SocketError, TcpInfo};
pub use stats::{EngineUsage, StackStats};

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Build an engine service and the handle applications use to reach it. Hand the
/// service to the engine loop and install its doorbell with [`StackHandle::set_kick`].
pub fn new_stack(config: StackConfig) -> Result<(TcpService, StackHandle), ConfigError> {
    config.validate()?;
    let (tx, rx) = crossbeam_channel::unbounded();
    let next_id = Arc::new(AtomicU64::new(1));
    let stats = Arc::new(stats::StatsCell::default());
    let service = TcpService::new(config.clone(), rx, next_id.clone(), stats.clone());
    let handle = StackHandle::new(tx, next_id, Arc::new(config), stats);
    Ok((service, handle))
}
