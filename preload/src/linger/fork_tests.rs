//! `fork` while the linger watcher is mid-round (the child must be able to exit).
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::*;
use crate::sock::tests::{accept_n, pair};
use crate::sock::{retire, Sock};

/// Wait (bounded) for child `pid`; its exit status, or `None` after `limit` (killed).
fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<c_int> {
    let deadline = Instant::now() + limit;
    loop {
        let mut status: c_int = 0;
        // SAFETY: our own child; status is a local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            });
        }
        if Instant::now() >= deadline {
            // SAFETY: our own child, stuck.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn fork_while_the_linger_watcher_is_mid_round_leaves_a_child_that_exits_promptly() {
    let (a, b) = pair();
    let addr: SocketAddr = "10.79.0.2:7100".parse().unwrap();
    // Lingering connections the peers neither read nor close (they stay on the list
    // and are looked at every round), plus some whose peers send after the close (the
    // watcher resets those while the forks go on).
    const STAYING: usize = 200;
    const LATE: usize = 24;
    let (servers, mut clients) = accept_n(&a, &b, addr, STAYING + LATE);
    for st in servers {
        retire(Arc::new(Sock::Stream(st)));
    }
    let stop = Arc::new(AtomicBool::new(false));
    // Keep the watcher going round: wake it constantly, and let input arrive on the
    // late ones one by one.
    let late: Vec<Stream> = clients.drain(STAYING..).collect();
    let s2 = stop.clone();
    let busy = std::thread::spawn(move || {
        let mut late = late;
        let mut n = 0u32;
        while !s2.load(Ordering::SeqCst) {
            let w = WATCH_WAKE.load(Ordering::SeqCst);
            if w >= 0 {
                signal(w);
            }
            n += 1;
            if n.is_multiple_of(40) {
                if let Some(mut c) = late.pop() {
                    let _ = c.try_write(b"too late");
                    // Kept until the end: the watcher resets it.
                    late.insert(0, c);
                }
            }
            std::thread::sleep(Duration::from_micros(250));
        }
        late
    });
    assert!(
        WATCH_WAKE.load(Ordering::SeqCst) >= 0,
        "the watcher did not start"
    );
    for i in 0..400u32 {
        crate::fork::prepare();
        // SAFETY: fork; the child only runs the child handler, the shim's exit work
        // (reap) and `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            crate::fork::child();
            // What the child's `exit` does (flush_at_exit → reap), twice, as the
            // first close after it would.
            reap();
            reap();
            let code = if WATCH_WAKE.load(Ordering::SeqCst) == -1 {
                0
            } else {
                2
            };
            // SAFETY: leaving the forked child without running the test harness.
            unsafe { libc::_exit(code) };
        }
        crate::fork::parent();
        assert!(pid > 0, "fork: {}", io::Error::last_os_error());
        match wait_child(pid, Duration::from_secs(5)) {
            Some(0) => {}
            Some(2) => panic!("fork {i}: the child still thinks a watcher runs"),
            Some(c) => panic!("fork {i}: the child failed ({c})"),
            None => panic!(
                "fork {i}: the child did not exit within 5 s (the lingering list stayed locked across fork?)"
            ),
        }
        // Sample different phases of the watcher's round.
        std::thread::sleep(Duration::from_micros(100 + (i as u64 % 7) * 300));
    }
    stop.store(true, Ordering::SeqCst);
    let late = busy.join().unwrap();
    drop((late, clients));
}
