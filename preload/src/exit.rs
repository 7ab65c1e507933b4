//! Process exit: give queued bytes a bounded chance to leave before the engine thread dies
//! with the process.

use std::sync::Once;
use std::time::{Duration, Instant};

use crate::sock::{self, Sock};

/// How long `exit` waits at most for unsent data.
const EXIT_FLUSH: Duration = Duration::from_secs(2);

extern "C" fn flush_at_exit() {
    let streams = sock::all_streams();
    let deadline = Instant::now() + EXIT_FLUSH;
    for s in &streams {
        if let Sock::Stream(st) = &**s {
            if !st.common.alive() {
                continue;
            }
            while st.unsent() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    // Close what the program left open (FIN after the data), and let the engine send it.
    let mut closed = false;
    for s in streams {
        if let Sock::Stream(st) = &*s {
            if st.common.alive() {
                let _ = st.lock().stream.shutdown_write();
                closed = true;
            }
        }
    }
    if closed {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Register the exit hook once per process.
pub(crate) fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(flush_at_exit) };
    });
}
