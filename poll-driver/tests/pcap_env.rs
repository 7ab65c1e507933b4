//! `XWARP_PCAP` enables capture for `PcapTap::from_env` (own test binary: it sets the
//! process environment).

mod common;

use common::*;
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::pcap::{PcapTap, PCAP_ENV};
use xwarp_poll_driver::vwire::{VirtualWire, WireConfig};

#[test]
fn xwarp_pcap_env_var_enables_capture() {
    let path = std::env::temp_dir().join(format!("xwarp-pd-env-{}.pcap", std::process::id()));
    std::env::remove_var(PCAP_ENV);
    let (a, _b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let a = PcapTap::from_env(a).unwrap();
    assert!(!a.is_capturing(), "off unless XWARP_PCAP is set");
    drop(a);

    std::env::set_var(PCAP_ENV, &path);
    let (a, mut b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let mut a = PcapTap::from_env(a).unwrap();
    std::env::remove_var(PCAP_ENV);
    assert!(a.is_capturing());
    let frames: Vec<Vec<u8>> = (0..3).map(|i| numbered_frame(i, 100)).collect();
    for f in &frames {
        dev_send(&mut a, f);
    }
    a.flush().unwrap();
    assert_eq!(drain(&mut b), frames);
    drop(a);
    // Global header, then one 16-byte record header + frame each, the frames verbatim.
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[0..4], &0xa1b2_c3d4u32.to_le_bytes());
    let mut off = 24;
    for f in &frames {
        let incl = u32::from_le_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize;
        assert_eq!(incl, f.len());
        assert_eq!(&bytes[off + 16..off + 16 + incl], &f[..]);
        off += 16 + incl;
    }
    assert_eq!(off, bytes.len());
    let _ = std::fs::remove_file(&path);
}
