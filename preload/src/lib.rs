//! # xwarp-preload — the LD_PRELOAD socket shim (`libxwarp_preload.so`)
//!
//! Runs the TCP sockets of an unmodified program on the xwarp engine (AF_XDP) and leaves
//! everything else (AF_UNIX, UDP, loopback, other addresses) to the kernel untouched.
//! Configuration comes from `XWARP_*` environment variables, see the crate README and
//! [`config::Config`]. `xwarp run -- CMD` sets it up.
//!
//! How it maps the socket API:
//! * `socket()` always makes a kernel socket. `bind()` to an accelerated address (the
//!   engine's, or a wildcard on an accelerated port) is remembered; `listen()` then opens an
//!   engine listener and `connect()` to an engine-reachable destination an engine
//!   connection. Either replaces the kernel socket **at the same descriptor number** by a
//!   `dup` of the engine socket's readiness eventfd, so descriptor numbers never collide,
//!   `close`/`dup`/`fork`/`exec` keep working on real descriptors, and poll/epoll/select
//!   can sleep on it natively.
//! * The eventfd is kept readable while the socket may be readable ([`sock`]); the shim's
//!   `poll`/`select`/`epoll_wait` compute exact readiness per xwarp socket.
//! * Every call on a descriptor not in the shim's table goes to the C library unchanged.
#![warn(missing_docs)]

pub mod config;

mod addr;
mod call;
mod engine;
mod epoll;
mod errno;
mod exit;
mod fdops;
mod fork;
mod inline;
mod io;
mod lifecycle;
mod linger;
mod logging;
mod poll;
mod process;
mod real;
mod sigsafe;
mod sock;
mod sockopt;
mod wait;

/// The exported C symbols (not exported from unit-test builds, which must keep libc's).
pub mod ffi;

#[cfg(not(test))]
/// Runs when the library is loaded: read and validate the configuration (a
/// misconfiguration exits with a message) and install the fork handlers (engine
/// connections inherited by a child are relayed by the parent, see [`fork`]).
extern "C" fn on_load() {
    if process::config().is_some() {
        // SAFETY: registering plain extern "C" functions as the fork handlers.
        unsafe { libc::pthread_atfork(Some(fork::prepare), Some(fork::parent), Some(fork::child)) };
    }
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
