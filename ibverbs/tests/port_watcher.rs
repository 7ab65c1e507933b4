//! The port watcher is one thread per process, started by the first open context and
//! stopped by the last close (before, every context started its own polling thread and a
//! context never closed kept it forever). No root needed: the device is `xwarp_lo`.
//! Its events are tested on a veth in `tests/port_events.rs` (root).

use xwarp_ibverbs::abi::*;
use xwarp_ibverbs::exports::*;

/// Threads of this process named `xwarp-ibv-port`.
fn watchers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == "xwarp-ibv-port")
        })
        .count()
}

/// [`watchers`] once it equals `want` (a new thread names itself when it first runs), or
/// after 2 s.
fn watchers_settled(want: usize) -> usize {
    let t0 = std::time::Instant::now();
    loop {
        let n = watchers();
        if n == want || t0.elapsed() > std::time::Duration::from_secs(2) {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn one_port_watcher_per_process() {
    std::env::set_var("XWARP_IFACE", "lo");
    let mut n = 0;
    // SAFETY: `n` writable; the list is freed below.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        assert_eq!(n, 1);
        assert_eq!(watchers(), 0, "no context, no watcher");
        let ctxs: Vec<*mut ibv_context> = (0..3).map(|_| ibv_open_device(*list)).collect();
        assert!(ctxs.iter().all(|c| !c.is_null()));
        assert_eq!(watchers_settled(1), 1, "one watcher for three contexts");
        assert_eq!(ibv_close_device(ctxs[0]), 0);
        assert_eq!(ibv_close_device(ctxs[1]), 0);
        assert_eq!(watchers_settled(1), 1, "one context still open");
        assert_eq!(ibv_close_device(ctxs[2]), 0);
        assert_eq!(watchers(), 0, "the last close stops it");
        assert_eq!(ibv_close_device(ctxs[2]), libc::EINVAL, "closed already");
        let again = ibv_open_device(*list);
        assert_eq!(watchers_settled(1), 1, "restarted");
        assert_eq!(ibv_close_device(again), 0);
        assert_eq!(watchers(), 0);
        ibv_free_device_list(list);
    }
}
