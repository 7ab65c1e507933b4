//! Process exit: the engine is a thread of this process and dies with it, so `exit` waits
//! (bounded) for connections to deliver their data and finish their close, as the kernel
//! would do after the process is gone.

use std::sync::Once;
use std::time::{Duration, Instant};

use crate::linger::{self, Closing};
use crate::sock::{self, Sock};

/// How long `exit` waits at most for connections to finish.
const EXIT_LINGER: Duration = Duration::from_secs(5);

/// How long `exit` waits for final handshakes once no data is outstanding.
const QUIET_GRACE: Duration = Duration::from_millis(50);

extern "C" fn flush_at_exit() {
    let deadline = Instant::now() + EXIT_LINGER;
    // Connections still open: FIN after their queued data, like the kernel's close on
    // exit; RST for those with unread input (RFC 2525 §2.17, as Linux).
    let open = sock::all_streams();
    for s in &open {
        if let Sock::Stream(st) = &**s {
            if st.common.alive() {
                st.close_at_exit();
            }
        }
    }
    // Wait while data or a FIN is still on its way; once only final handshakes remain
    // (everything sent, end of stream received), give them a short grace period.
    let mut quiet_since: Option<Instant> = None;
    loop {
        let mut busy = linger::reap();
        for s in &open {
            if let Sock::Stream(st) = &**s {
                if st.common.alive() && st.closing() == Closing::Busy {
                    busy += 1;
                }
            }
        }
        let now = Instant::now();
        if busy == 0 {
            let since = *quiet_since.get_or_insert(now);
            if now.duration_since(since) >= QUIET_GRACE {
                break;
            }
        } else {
            quiet_since = None;
        }
        if now >= deadline {
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
