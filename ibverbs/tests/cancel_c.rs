//! `tests/c/cancel.c`: `pthread_cancel` of threads blocked in `ibv_get_cq_event` and
//! `ibv_get_async_event` (rping's server error path cancels its CQ thread there) must
//! unwind them and let the process go on; before the fix the forced unwind reached the
//! panic guard and the process aborted ("Rust cannot catch foreign exceptions"). No root
//! needed: the device is `xwarp_lo` and no engine starts. Also a cancel already pending
//! when a thread enters the library: it must not be acted upon inside the panic guard
//! (the warning line's `write`, the attempt's `epoll_wait` are cancellation points).

mod common;

use std::process::Command;

#[test]
fn pthread_cancel_of_blocked_waiters() {
    if let Err(why) = common::headers() {
        println!("SKIPPED: the pthread_cancel C test: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("xwarp-ibv-cancel-{}", std::process::id()));
    let exe = common::compile_c("cancel", &dir);
    let mut cmd = common::preloaded(Command::new("timeout"), &exe);
    cmd.env("XWARP_IFACE", "lo");
    let o = cmd.output().expect("run the C test");
    let _ = std::fs::remove_dir_all(&dir);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "C test failed ({:?}):\n{out}\n{err}",
        o.status
    );
    assert!(out.contains("0 failures"), "{out}\n{err}");
    // The one warning line: the pending-cancel thread's ibv_create_ah.
    let ours: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("xwarp-ibverbs:"))
        .collect();
    assert_eq!(ours.len(), 1, "{err}");
    assert!(ours[0].contains("ibv_create_ah"), "{err}");
}

/// `tests/c/stderr_closed.c`: the warning lines of unsupported verbs with stderr closed
/// (before, `eprintln!` panicked there and the unguarded exports aborted the process).
#[test]
fn warnings_with_stderr_closed() {
    if let Err(why) = common::headers() {
        println!("SKIPPED: the closed-stderr C test: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("xwarp-ibv-stderr-{}", std::process::id()));
    let exe = common::compile_c("stderr_closed", &dir);
    let mut cmd = common::preloaded(Command::new("timeout"), &exe);
    cmd.env("XWARP_IFACE", "lo");
    let o = cmd.output().expect("run the C test");
    let _ = std::fs::remove_dir_all(&dir);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "({:?}) {out}", o.status);
    assert!(out.contains("stderr closed: 0 failures"), "{out}");
}
