//! pcapng capture: a vwire exchange recorded through `PcapTap` into a `.pcapng` file is
//! read back by tshark with one interface, its name, and the direction of every frame;
//! a capture file that cannot be created or written is an error, never a panic or a
//! stalled engine; a writer that cannot keep up drops frames instead of growing.

mod common;

use common::*;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::pcap::{
    Direction, PcapFormat, PcapSink, PcapTap, SinkConfig, TsPrecision, SNAPLEN,
};
use xwarp_poll_driver::vwire::{VirtualWire, WireConfig};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xwarp-pd-{}-{name}", std::process::id()))
}

fn have_tshark() -> bool {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "\n!!!!!!!! SKIPPED: tshark is not installed (apt-get install tshark) !!!!!!!!\n"
        );
    }
    ok
}

/// A tshark number field (`0x00000002` or `2`).
fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("{s:?}")),
        None => s.parse().unwrap_or_else(|_| panic!("{s:?}")),
    }
}

/// tshark's fields of every frame, one `Vec` per frame.
fn tshark_fields(path: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(path)
        .args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = c.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect()
}

#[test]
fn pcapng_from_a_vwire_exchange_has_interfaces_and_directions() {
    if !have_tshark() {
        return;
    }
    let path = tmp("dir.pcapng");
    let (a, mut b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let sink = PcapSink::create(&path, TsPrecision::Nanos).unwrap();
    assert_eq!(sink.config().format, PcapFormat::PcapNg);
    let mut a = PcapTap::with_capture(a, Some(sink.interface("vwire-a", "test end a")));
    let n = 20;
    for i in 0..n {
        dev_send(&mut a, &udp_frame(format!("out {i}").as_bytes()));
        b.send_frame(&numbered_frame(i as u64, 64 + i));
    }
    a.flush().unwrap();
    assert_eq!(drain(&mut b).len(), n);
    let mut back = 0;
    while dev_recv(&mut a).is_some() {
        back += 1;
    }
    assert_eq!(back, n);
    let st = a.tap_stats();
    assert_eq!((st.recorded, st.dropped, st.errors), (2 * n as u64, 0, 0));
    drop(a.into_inner());
    drop(sink);
    let rows = tshark_fields(
        &path,
        &[
            "frame.interface_name",
            "frame.interface_description",
            "frame.packet_flags_direction",
            "eth.type",
            "frame.len",
        ],
    );
    assert_eq!(rows.len(), 2 * n, "{rows:?}");
    for r in &rows {
        assert_eq!((r[0].as_str(), r[1].as_str()), ("vwire-a", "test end a"));
        // Sent UDP frames are outbound (2), the peer's 0x88b5 frames inbound (1).
        match r[3].as_str() {
            "0x0800" => assert_eq!(num(&r[2]), 2, "{r:?}"),
            "0x88b5" => assert_eq!(num(&r[2]), 1, "{r:?}"),
            t => panic!("unexpected ethertype {t}"),
        }
    }
    let inbound_lens: Vec<usize> = rows
        .iter()
        .filter(|r| num(&r[2]) == 1)
        .map(|r| r[4].parse().unwrap())
        .collect();
    assert_eq!(inbound_lens, (0..n).map(|i| 64 + i).collect::<Vec<_>>());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn two_interfaces_in_one_file_keep_their_frames_apart() {
    if !have_tshark() {
        return;
    }
    let path = tmp("two.pcapng");
    let sink = PcapSink::create(&path, TsPrecision::Micros).unwrap();
    let c0 = sink.interface("eth-x", "");
    let c1 = sink.interface("eth-y", "");
    for i in 0..5u64 {
        c0.record(Direction::Outbound, &numbered_frame(i, 60));
        c1.record(Direction::Inbound, &numbered_frame(100 + i, 60));
    }
    drop((c0, c1));
    drop(sink);
    let rows = tshark_fields(
        &path,
        &[
            "frame.interface_id",
            "frame.interface_name",
            "frame.packet_flags_direction",
        ],
    );
    assert_eq!(rows.len(), 10);
    for r in rows {
        match r[0].as_str() {
            "0" => assert_eq!((r[1].as_str(), num(&r[2])), ("eth-x", 2)),
            "1" => assert_eq!((r[1].as_str(), num(&r[2])), ("eth-y", 1)),
            o => panic!("interface {o}"),
        }
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_bad_path_is_an_error_naming_the_file() {
    let e = PcapSink::create("/nonexistent-xwarp-dir/x.pcapng", TsPrecision::Micros).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    assert!(
        e.to_string().contains("/nonexistent-xwarp-dir/x.pcapng"),
        "{e}"
    );
}

#[test]
fn a_full_disk_stops_the_capture_once_without_stalling() {
    // /dev/full accepts the open and fails every write with ENOSPC.
    let sink = PcapSink::create("/dev/full", TsPrecision::Micros).unwrap();
    let cap = sink.interface("full", "");
    let t = Instant::now();
    for i in 0..2000u64 {
        cap.record(Direction::Outbound, &numbered_frame(i, 1500));
        if i == 10 {
            // The writer meets the error on its next write.
            assert!(sink.flush().is_err());
        }
    }
    assert!(t.elapsed() < Duration::from_secs(5), "recording stalled");
    let err = sink.error().expect("error kept");
    assert!(err.contains("/dev/full") && err.contains("space"), "{err}");
    assert!(sink.is_stopped());
    let st = cap.stats();
    assert_eq!(st.recorded + st.errors, 2000);
    assert!(st.errors >= 1989, "{st:?}");
    assert!(sink.flush().unwrap_err().to_string().contains("space"));
}

#[test]
fn a_writer_that_cannot_keep_up_drops_frames_and_never_blocks_the_recorder() {
    let path = tmp("fifo.pcapng");
    let _ = std::fs::remove_file(&path);
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // A reader that opens the FIFO and reads nothing until told: the pipe fills and the
    // sink's writer thread blocks in write(2).
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let p2 = path.clone();
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::open(&p2).unwrap();
        go_rx.recv().unwrap();
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut all).unwrap();
        all.len()
    });
    let config = SinkConfig {
        format: PcapFormat::PcapNg,
        precision: TsPrecision::Micros,
        snaplen: SNAPLEN,
    };
    let sink = PcapSink::create_with(&path, config).unwrap();
    let cap = sink.interface("slow", "");
    let t = Instant::now();
    let n = 12_000u64; // ~18 MB of 1500-byte frames: well past the bound
    for i in 0..n {
        cap.record(Direction::Inbound, &numbered_frame(i, 1500));
    }
    let took = t.elapsed();
    assert!(took < Duration::from_secs(5), "recording took {took:?}");
    let st = cap.stats();
    assert_eq!(st.recorded + st.dropped, n);
    assert!(st.dropped > 0, "{st:?}");
    // Recorded bytes are bounded by the two buffers (plus the pipe).
    assert!(
        st.recorded * 1544 <= 2 * xwarp_poll_driver::pcap::sink::BUFFER_BYTES as u64 + (1 << 20),
        "{st:?}"
    );
    assert_eq!(sink.dropped(), st.dropped);
    go_tx.send(()).unwrap();
    drop(cap);
    drop(sink);
    let got = reader.join().unwrap();
    assert!(got as u64 >= st.recorded * 1544, "{got} bytes for {st:?}");
    let _ = std::fs::remove_file(&path);
}
