//! pcap capture: a vwire exchange recorded through `PcapTap` is read back by tshark with
//! the right frame count and dissected as Ethernet/IPv4/UDP.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::pcap::{PcapSink, PcapTap, TsPrecision};
use xwarp_poll_driver::vwire::{VirtualWire, WireConfig};

fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn have_tshark() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Make tshark available: install it when running as root, else return `false` after
/// a loud message (the caller skips).
fn ensure_tshark() -> bool {
    if have_tshark() {
        return true;
    }
    if !is_root() {
        eprintln!(
            "\n!!!!!!!! SKIPPED: tshark is not installed and we are not root; \
             install it (apt-get install tshark) to run the pcap read-back test !!!!!!!!\n"
        );
        return false;
    }
    let install = || {
        Command::new("apt-get")
            .args([
                "-o",
                "DPkg::Lock::Timeout=300",
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "tshark",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get").args(["update", "-qq"]).status();
        install();
    }
    assert!(
        have_tshark(),
        "running as root but could not install tshark"
    );
    true
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xwarp-pd-{}-{name}", std::process::id()))
}

/// Run tshark on `path` with a display filter; returns the selected frame numbers.
fn tshark_frames(path: &PathBuf, filter: &str) -> Vec<u64> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["-Y", filter, "-T", "fields", "-e", "frame.number"])
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().parse().expect("frame number"))
        .collect()
}

fn capture_exchange(path: &PathBuf, precision: TsPrecision, n: usize) -> u64 {
    let (a, mut b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let sink = PcapSink::create(path, precision).unwrap();
    let mut a = PcapTap::new(a, Some(sink.clone()));
    assert!(a.is_capturing());
    for i in 0..n {
        let payload = format!("xwarp pcap frame {i}").into_bytes();
        dev_send(&mut a, &udp_frame(&payload));
        // The peer answers with a non-IP frame; the tap records it on receive.
        b.send_frame(&numbered_frame(i as u64, 64));
    }
    a.flush().unwrap();
    let got = drain(&mut b);
    assert_eq!(got.len(), n);
    let mut back = 0;
    while dev_recv(&mut a).is_some() {
        back += 1;
    }
    assert_eq!(back, n);
    let st = a.tap_stats();
    assert_eq!(st.errors, 0);
    assert_eq!(st.recorded, 2 * n as u64);
    drop(a.into_inner());
    sink.flush().unwrap();
    sink.frames()
}

#[test]
fn pcap_from_a_vwire_exchange_is_read_back_by_tshark() {
    if !ensure_tshark() {
        return;
    }
    for (precision, name) in [
        (TsPrecision::Micros, "us.pcap"),
        (TsPrecision::Nanos, "ns.pcap"),
    ] {
        let path = tmp(name);
        let recorded = capture_exchange(&path, precision, 25);
        assert_eq!(recorded, 50);
        let all = tshark_frames(&path, "frame");
        assert_eq!(all, (1..=50).collect::<Vec<_>>(), "{name}");
        // Sent frames are UDP to port 7 with intact checksums; received ones are 0x88b5.
        let udp = tshark_frames(&path, "udp.dstport == 7 && ip.src == 10.0.0.1");
        assert_eq!(udp.len(), 25, "{name}");
        let other = tshark_frames(&path, "eth.type == 0x88b5");
        assert_eq!(other.len(), 25, "{name}");
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn taps_naming_the_same_file_share_one_writer() {
    let path = tmp("shared.pcap");
    let s1 = PcapSink::create(&path, TsPrecision::Micros).unwrap();
    let s2 = PcapSink::create(&path, TsPrecision::Micros).unwrap();
    s1.record(&numbered_frame(1, 60)).unwrap();
    s2.record(&numbered_frame(2, 60)).unwrap();
    assert_eq!(s1.frames(), 2);
    drop(s1);
    drop(s2);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 24 + 2 * (16 + 60));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn tap_without_sink_passes_frames_through() {
    let (a, mut b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let mut a = PcapTap::new(a, None);
    assert!(!a.is_capturing());
    let f = udp_frame(b"plain");
    dev_send(&mut a, &f);
    a.flush().unwrap();
    assert_eq!(drain(&mut b), vec![f]);
    assert_eq!(a.tap_stats().recorded, 0);
    assert_eq!(a.stats().tx_frames, 1);
}
