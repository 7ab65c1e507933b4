//! The native socket API over an xwarp engine: [`TcpListener`] and [`TcpStream`] with
//! the shape of `std::net`, moving data through the engine's lock-free per-socket rings.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use xwarp::net::{vwire_pair, TcpListener, TcpStream};
//! # fn main() -> std::io::Result<()> {
//! let (a, b) = vwire_pair(Default::default())?;
//! let listener = TcpListener::bind(b.stack(), "10.77.0.2:7".parse().unwrap())?;
//! let mut client = TcpStream::connect(a.stack(), "10.77.0.2:7".parse().unwrap())?;
//! let (mut server, _) = listener.accept()?;
//! client.write_all(b"ping")?;
//! let mut buf = [0u8; 4];
//! server.read_exact(&mut buf)?;
//! # Ok(()) }
//! ```
//!
//! Blocking calls spin for a short budget (the engine usually answers within
//! microseconds), then sleep on the socket's readiness eventfd. Non-blocking calls return
//! `WouldBlock`; the descriptor from [`std::os::fd::AsRawFd::as_raw_fd`] then becomes readable once the
//! operation can make progress (edge style: retry until `WouldBlock` before waiting again).
//!
//! When the engine runs in inline mode (`EngineMode::Inline`, `XWARP_MODE=inline`), the
//! blocking and polling calls drive the engine themselves: a call that would block runs
//! engine iterations on the calling thread while it spins (for the longer of the stream's
//! spin and `InlineConfig::spin`), then parks (the engine's keeper takes over) and sleeps
//! on the readiness descriptor; a write whose bytes the engine has not taken runs one
//! iteration, so the segment leaves before `write` returns; a non-blocking read that
//! finds nothing runs one iteration and looks again. A program that waits elsewhere (an
//! async runtime's reactor on the readiness descriptors, say) without calling in gets the
//! keeper: frames are taken in within `InlineConfig::keeper_after` (1 ms) of its last call;
//! such programs are better served by thread mode.
//!
//! [`TcpStream::into_split`] gives a read half and a write half for two threads at once
//! ([`split`] says why a split rather than `try_clone`). With the `tokio` feature,
//! `xwarp::net::tokio` has the same sockets as tokio `AsyncRead`/`AsyncWrite` types.

mod engine;
mod listener;
pub mod split;
mod stream;
#[cfg(feature = "tokio")]
pub mod tokio;

pub use engine::{vwire_pair, vwire_pair_with, NetEngine};
pub use listener::{TcpListener, DEFAULT_BACKLOG};
pub use split::{reunite, ReadHalf, WriteHalf};
pub use stream::{Shutdown, TcpStream};
pub use xwarp_stack::builder::PairConfig;
pub use xwarp_stack::{
    socket_buffer_size, Congestion, KeepAlive, SocketOptions, StackConfig, StackHandle, StackStats,
    TcpInfo, TcpOptions,
};

use std::io;
use std::time::{Duration, Instant};

use xwarp_poll_driver::engine::InlineDriver;

/// How long blocking calls spin before sleeping on the readiness descriptor.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// How long a blocking call spins: `spin`, or the inline driver's budget if longer.
pub(crate) fn spin_budget(driver: Option<&InlineDriver>, spin: Duration) -> Duration {
    driver.map_or(spin, |d| spin.max(d.spin()))
}

/// One round of a blocking call's spin phase: an engine iteration on this thread in inline
/// mode, else a CPU spin hint.
pub(crate) fn spin_round(driver: Option<&InlineDriver>) {
    match driver {
        Some(d) => {
            d.try_drive();
        }
        None => std::hint::spin_loop(),
    }
}

/// Before a blocking call sleeps: in inline mode, let the keeper take over at once.
pub(crate) fn before_sleep(driver: Option<&InlineDriver>) {
    if let Some(d) = driver {
        d.park();
    }
}

/// Retry `op` until it stops returning `WouldBlock`: spin for `spin` (driving the engine
/// with `driver` in inline mode), then sleep on `wait` until `deadline` (then `TimedOut`).
pub(crate) fn block_on<T>(
    driver: Option<&InlineDriver>,
    spin: Duration,
    deadline: Option<Instant>,
    mut op: impl FnMut() -> io::Result<T>,
    wait: impl Fn(Option<Instant>) -> io::Result<bool>,
) -> io::Result<T> {
    let spin_until = Instant::now() + spin_budget(driver, spin);
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "operation timed out",
            ));
        }
        if now < spin_until {
            spin_round(driver);
            continue;
        }
        before_sleep(driver);
        wait(deadline)?;
    }
}
