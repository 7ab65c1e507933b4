//! Throughput of two Connections back to back (no sockets): RDMA Writes of 64 KiB from
//! the initiator, FPDUs framed at EMSS 1448 (and 9000), CRC off and on, every byte
//! verified at the end. The small variant always runs; the measurement is `#[ignore]`d:
//! `cargo test --release -p xwarp-rdmap --test conn_throughput -- --ignored --nocapture`.

#[path = "conn_util.rs"]
mod util;

use std::time::Instant;

use util::*;
use xwarp_rdmap::*;

const CHUNK: usize = 64 * 1024;

/// Moves `total` bytes as Writes; returns MB/s. Bytes go from one side's transmit buffer
/// straight into the other's handle_input in whole bursts.
fn run(total: usize, emss: usize, crc: bool) -> f64 {
    let mut rng = Rng(11);
    let tweak = move |c: &mut conn::ConnConfig| {
        c.initiator.crc = crc;
        c.emss = emss;
    };
    let (mut a, mut b) = connect(tweak, tweak, &mut rng, usize::MAX);
    let src: Vec<u8> = (0..CHUNK * 4).map(|i| (i * 31 + 7) as u8).collect();
    let a_src = a.reg(0x10_0000, src.clone(), Access::LOCAL_WRITE);
    let b_dst = b.reg(0x20_0000, vec![0; CHUNK * 4], Access::REMOTE_WRITE);
    let now = Instant::now();
    let t0 = Instant::now();
    let mut posted = 0usize;
    let mut done = 0usize;
    let mut buf = Vec::with_capacity(1 << 20);
    while done < total {
        while posted < total && posted - done < 8 * CHUNK {
            let k = (posted / CHUNK) % 4;
            a.send(
                posted as u64,
                SendOp::Write {
                    remote_stag: b_dst,
                    remote_to: 0x20_0000 + (k * CHUNK) as u64,
                },
                vec![Sge {
                    lkey: a_src,
                    addr: 0x10_0000 + (k * CHUNK) as u64,
                    len: CHUNK as u32,
                }],
            );
            posted += CHUNK;
        }
        buf.clear();
        while a.conn.poll_transmit(&a.res, &mut buf) > 0 {
            b.conn.handle_input(now, &buf, &mut b.res).unwrap();
            buf.clear();
        }
        while let Some(c) = a.conn.poll_completion() {
            assert_eq!(c.status, CompletionStatus::Success);
            done += CHUNK;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(b.mem(b_dst), src, "placed data");
    assert!(b.completions().is_empty());
    total as f64 / secs / 1e6
}

#[test]
fn writes_back_to_back_place_every_byte() {
    for crc in [false, true] {
        let mbps = run(4 << 20, 1448, crc);
        assert!(mbps > 0.0);
    }
}

#[test]
#[ignore = "measurement; run in release with --nocapture"]
fn measure_write_throughput() {
    for (emss, crc) in [(1448, false), (1448, true), (9000, false), (9000, true)] {
        let mbps = run(1 << 30, emss, crc);
        println!(
            "conn throughput: EMSS {emss}, CRC {crc}: {mbps:.0} MB/s (1 GiB of 64 KiB Writes)"
        );
    }
}
