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

/// How long blocking calls spin before sleeping on the readiness descriptor.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// Retry `op` until it stops returning `WouldBlock`: spin for `spin`, then sleep on
/// `wait` until `deadline` (then `TimedOut`).
pub(crate) fn block_on<T>(
    spin: Duration,
    deadline: Option<Instant>,
    mut op: impl FnMut() -> io::Result<T>,
    wait: impl Fn(Option<Instant>) -> io::Result<bool>,
) -> io::Result<T> {
    let spin_until = Instant::now() + spin;
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
            std::hint::spin_loop();
            continue;
        }
        wait(deadline)?;
    }
}
