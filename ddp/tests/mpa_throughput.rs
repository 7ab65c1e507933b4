//! Throughput of the FPDU encoder and parser (ignored by default; run with
//! `cargo test --release -p xwarp-ddp --test mpa_throughput -- --ignored --nocapture`).
//! Verifies the data it moves, so it is also a correctness check at volume.

use std::time::Instant;

use xwarp_ddp::mpa::{mulpdu, FpduEncoder, FpduEvent, FpduParser};

fn run(emss: usize, crc: bool, markers: bool) {
    let m = mulpdu(emss, markers);
    let hdr = [0xC1u8, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    let payload: Vec<u8> = (0..m - hdr.len()).map(|i| i as u8).collect();
    let count = (64 << 20) / emss;
    let mut enc = FpduEncoder::new(crc, markers);
    let mut wire = vec![0u8; count * enc.max_encoded_len(m)];
    // Touch the pages first so the timing measures framing, not page faults.
    wire.fill(1);
    let t = Instant::now();
    let mut off = 0;
    for _ in 0..count {
        off += enc.encode(&[&hdr, &payload], &mut wire[off..]).unwrap();
    }
    let enc_s = t.elapsed().as_secs_f64();
    wire.truncate(off);
    let mut sink = vec![0u8; payload.len()];
    let mut p = FpduParser::new(crc, markers);
    let t = Instant::now();
    let mut input = &wire[..];
    let (mut ends, mut at) = (0, 0);
    while let Some(ev) = p.next(&mut input).unwrap() {
        match ev {
            FpduEvent::Header(_) => at = 0,
            FpduEvent::Payload(s) => {
                sink[at..at + s.len()].copy_from_slice(s);
                at += s.len();
            }
            FpduEvent::End => ends += 1,
        }
    }
    let dec_s = t.elapsed().as_secs_f64();
    assert_eq!(ends, count);
    assert_eq!(sink, payload);
    let gb = off as f64 / 1e9;
    println!(
        "emss {emss:5} crc {crc:5} markers {markers:5}: encode {:5.1} GB/s, parse+place {:5.1} GB/s",
        gb / enc_s,
        gb / dec_s
    );
}

#[test]
#[ignore]
fn mpa_throughput() {
    for emss in [1448, 8948, 65483] {
        for (crc, markers) in [(false, false), (true, false), (true, true)] {
            run(emss, crc, markers);
        }
    }
}
