//! What a capture writes when the process exits with its engine still running (the
//! shim's case: `flush_all` from `atexit`), and the writer thread's signal mask. Own test
//! binary: `flush_all` finishes every sink of the process.

use std::path::Path;
use std::time::Duration;

use xwarp_poll_driver::pcap::{flush_all, Direction, PcapSink, TsPrecision};

/// `(block type, body)` of each pcapng block (little-endian files).
fn blocks(b: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 12 <= b.len() {
        let ty = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let len = u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()) as usize;
        assert!(
            len >= 12 && at + len <= b.len(),
            "block at {at}: length {len}"
        );
        out.push((ty, b[at + 8..at + len - 4].to_vec()));
        at += len;
    }
    assert_eq!(at, b.len(), "trailing bytes");
    out
}

const EPB: u32 = 6;
const ISB: u32 = 5;

fn count(path: &Path, ty: u32) -> usize {
    blocks(&std::fs::read(path).unwrap())
        .iter()
        .filter(|(t, _)| *t == ty)
        .count()
}

#[test]
fn the_exit_flush_writes_interface_statistics_once() {
    let path = std::env::temp_dir().join(format!("xwarp-pd-exit-{}.pcapng", std::process::id()));
    let sink = PcapSink::create(&path, TsPrecision::Micros).unwrap();
    let cap = sink.interface("veth0", "");
    for i in 0..3u8 {
        cap.record(Direction::Inbound, &[i; 60]);
    }
    // What the atexit hook does while the engine still runs.
    flush_all();
    assert_eq!(count(&path, EPB), 3);
    assert_eq!(count(&path, ISB), 1, "the exit flush writes the statistics");
    let isb = blocks(&std::fs::read(&path).unwrap())
        .into_iter()
        .find(|(t, _)| *t == ISB)
        .unwrap()
        .1;
    assert_eq!(
        u32::from_le_bytes(isb[..4].try_into().unwrap()),
        0,
        "interface 0"
    );
    // A second flush, more frames and the final drop add frames, never a second ISB.
    flush_all();
    cap.record(Direction::Outbound, &[9; 60]);
    drop(cap);
    drop(sink);
    assert_eq!(count(&path, EPB), 4);
    assert_eq!(count(&path, ISB), 1);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_capture_writer_thread_blocks_every_signal() {
    let path = std::env::temp_dir().join(format!("xwarp-pd-sig-{}.pcap", std::process::id()));
    let sink = PcapSink::create(&path, TsPrecision::Micros).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mut masks = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if comm.trim() != "xwarp-pcap" {
            continue;
        }
        let status = std::fs::read_to_string(t.join("status")).unwrap();
        let blk = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .unwrap()
            .trim();
        masks.push(u64::from_str_radix(blk, 16).unwrap());
    }
    assert!(!masks.is_empty(), "no xwarp-pcap thread");
    for m in masks {
        for sig in [libc::SIGPIPE, libc::SIGINT, libc::SIGTERM, libc::SIGUSR1] {
            assert_ne!(m & (1 << (sig - 1)), 0, "signal {sig} not blocked: {m:#x}");
        }
    }
    // This thread's mask is restored.
    let me = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let blk = me.lines().find_map(|l| l.strip_prefix("SigBlk:")).unwrap();
    assert_eq!(
        u64::from_str_radix(blk.trim(), 16).unwrap() & (1 << (libc::SIGPIPE - 1)),
        0
    );
    drop(sink);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_exit_flush_does_not_hang_on_a_stalled_fifo_and_a_closed_one_stops_the_capture() {
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::env::temp_dir().join(format!("xwarp-pd-fifo-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // A reader that never reads: the pipe fills and the writer thread blocks in write.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .unwrap();
    let sink = PcapSink::create(&path, TsPrecision::Micros).unwrap();
    let cap = sink.interface("veth0", "");
    for i in 0..1000u32 {
        cap.record(Direction::Inbound, &[i as u8; 1500]);
    }
    std::thread::sleep(Duration::from_millis(300));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        flush_all();
        let _ = tx.send(());
    });
    let flushed = rx.recv_timeout(Duration::from_secs(2));
    if flushed.is_err() {
        drop(reader);
        panic!("flush_all blocked behind the stalled writer");
    }
    // The reader goes away: the blocked write fails with EPIPE (no SIGPIPE on the
    // writer thread) and the capture stops with that error.
    drop(reader);
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while !sink.is_stopped() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let e = sink.error().expect("capture stopped");
    assert!(
        e.contains("Broken pipe") || e.contains("os error 32"),
        "{e}"
    );
    drop(cap);
    drop(sink);
    let _ = std::fs::remove_file(&path);
}
