//! Running a child process with a bound on its time: its output is collected while it runs
//! (a chatty program writes far more than a pipe holds) and it is killed at the limit.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Run `cmd` (its stdout/stderr set to piped by the caller) and collect what it wrote,
/// killing it with SIGKILL after `limit`; fails the test when it had to be killed.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd.spawn().expect("spawn");
    let pid = child.id() as libc::pid_t;
    let done = AtomicBool::new(false);
    let killed = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = Instant::now() + limit;
            while !done.load(Ordering::Acquire) {
                if Instant::now() > deadline {
                    killed.store(true, Ordering::Release);
                    // SAFETY: kill(2) on our own child, not yet reaped (`done` is unset).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let out = child.wait_with_output().expect("output");
        done.store(true, Ordering::Release);
        out
    });
    assert!(
        !killed.load(Ordering::Acquire),
        "{cmd:?} did not finish in {limit:?}"
    );
    out
}
