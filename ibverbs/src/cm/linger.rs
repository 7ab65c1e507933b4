//! Lingering at exit. The engine, and with it every TCP connection, lives inside the
//! program's process: a program that disconnects and returns from `main` at once (rping,
//! rdma_client) would take its engine down before the FIN of its graceful close is on the
//! wire (or acknowledged), and the peer would wait for a DISCONNECTED that never comes (the
//! kernel keeps a closed socket's FIN going after its process is gone). A program that
//! exits without `rdma_disconnect` is worse off: the kernel would close its sockets, but
//! nothing closes the engine's, so the peer never hears of it (no FIN, no RST). So once
//! the CM has used the engine, an `atexit` hook first disconnects every connection still
//! open (`Device::disconnect_all`: graceful, queued work drains, then the FIN), then waits
//! until the engine owns no connection any more (every close finished), at most
//! [`LINGER`].

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use xwarp_verbs::Device;

/// The longest the process waits at exit for its connections to finish closing.
pub const LINGER: Duration = Duration::from_secs(2);

static DEV: OnceLock<Device> = OnceLock::new();

/// The CM uses the engine behind `dev`: linger for its connections at exit.
pub(crate) fn note(dev: &Device) {
    if DEV.set(dev.clone()).is_ok() {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(at_exit) };
    }
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(d) = DEV.get() else { return };
        let deadline = Instant::now() + LINGER;
        let _ = d.disconnect_all();
        while Instant::now() < deadline {
            match d.cm_stats() {
                Ok(s) if s.connections > 0 => std::thread::sleep(Duration::from_millis(5)),
                _ => return,
            }
        }
    });
}
