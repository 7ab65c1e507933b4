//! The contract between NIC backends and the engine loop.
//!
//! A backend is a [`smoltcp::phy::Device`] (RX/TX tokens give the TCP stack direct access to
//! frame memory: a UMEM chunk for AF_XDP, a buffer for the virtual wire) plus the few hooks
//! the engine loop needs around each poll iteration.

use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

use xwarp_telemetry::layout::{MODE_UNKNOWN, NA};
use xwarp_telemetry::NicCounters;

/// Counters every backend keeps; the engine reports them and tests assert on them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BackendStats {
    /// Frames handed to the stack.
    pub rx_frames: u64,
    /// Bytes handed to the stack.
    pub rx_bytes: u64,
    /// Frames submitted for transmission.
    pub tx_frames: u64,
    /// Bytes submitted for transmission.
    pub tx_bytes: u64,
    /// Frames dropped by the backend (ring full, fill ring starved, injected loss, ...).
    pub dropped: u64,
}

/// A NIC backend driven by the engine loop.
pub trait Backend: smoltcp::phy::Device {
    /// Push every frame queued by TX tokens out to the wire (AF_XDP copy mode: kick with
    /// `sendto` until the TX ring is drained) and reclaim completed TX buffers.
    fn flush(&mut self) -> io::Result<()>;

    /// Make RX progress that does not involve the stack (refill the fill ring, pull frames
    /// from a shared link). Returns `true` when at least one frame is ready for `receive`.
    fn poll_rx(&mut self) -> io::Result<bool>;

    /// A file descriptor that becomes readable when frames arrive, for an idle engine to
    /// sleep on (`poll(2)`/`epoll`). `None` if the backend cannot wake a sleeper.
    fn wait_fd(&self) -> Option<RawFd>;

    /// Arm wakeups before the engine sleeps on [`Backend::wait_fd`] (AF_XDP need_wakeup,
    /// draining an eventfd). Returns `false` if work arrived meanwhile and the engine must
    /// not sleep.
    fn prepare_sleep(&mut self) -> io::Result<bool>;

    /// Counters since creation.
    fn stats(&self) -> BackendStats;

    /// The earliest time the backend itself needs to be polled again even if its
    /// [`Backend::wait_fd`] stays quiet (e.g. the virtual wire holding a delayed frame).
    /// Called by the engine after [`Backend::prepare_sleep`]; `None` (the default) means
    /// no such timer.
    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    /// The backend's counters for `xwarp stat` (`xwarp-telemetry`), called by the engine
    /// thread a few times a second (it may make a syscall). The default reports
    /// [`Backend::stats`] with an unknown mode.
    fn telemetry(&self) -> NicCounters {
        let s = self.stats();
        NicCounters {
            mode: MODE_UNKNOWN,
            zero_copy: NA,
            multi_buffer: NA,
            rx_frames: s.rx_frames,
            rx_bytes: s.rx_bytes,
            tx_frames: s.tx_frames,
            tx_bytes: s.tx_bytes,
            dropped: s.dropped,
            wire_faults: NA,
            ..NicCounters::default()
        }
    }

    /// What `xwarp stat` shows as the engine's interface (`vwire`, `veth0 q0`); empty
    /// by default.
    fn interface_label(&self) -> String {
        String::new()
    }
}
