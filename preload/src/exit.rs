//! Process exit: the engine is a thread of this process and dies with it, so `exit` waits
//! (bounded) for connections to deliver their data and finish their close, as the kernel
//! would do after the process is gone.

use std::sync::Once;
use std::time::{Duration, Instant};

use xwarp_stack::Phase;

use crate::sock::{self, Sock};

/// How long `exit` waits at most for connections to finish.
const EXIT_LINGER: Duration = Duration::from_secs(5);

extern "C" fn flush_at_exit() {
    let deadline = Instant::now() + EXIT_LINGER;
    // Connections still open: FIN after their queued data, like the kernel's close on exit.
    let open = sock::all_streams();
    for s in &open {
        if let Sock::Stream(st) = &**s {
            if st.common.alive() {
                let mut g = st.lock();
                if g.stream.phase() == Phase::Established {
                    let _ = g.stream.shutdown_write();
                }
            }
        }
    }
    loop {
        let lingering = sock::reap();
        let open_left = open
            .iter()
            .filter(|s| match &***s {
                Sock::Stream(st) => st.common.alive() && !st.drain_finished(),
                _ => false,
            })
            .count();
        if lingering + open_left == 0 || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
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
