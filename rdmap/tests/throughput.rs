//! Data-path throughput of the sans-IO core (no MPA, no TCP): RDMA Writes produced by
//! `poll_segment` into a reused TX buffer and fed to the peer's receive calls.
//! Run: `cargo test --release -p xwarp-rdmap --test throughput -- --ignored --nocapture`.

mod common;
use common::*;
use std::time::Instant;
use xwarp_rdmap::*;

fn run(mulpdu: usize, msg: usize, total: usize) -> f64 {
    let mut a = Side::new(1, 1, 1);
    let mut b = Side::new(1, 1, 1);
    let src = a.reg(0x1000_0000, msg, 0x5a, Access::NONE);
    let dst = b.reg(0x2000_0000, msg, 0, Access::REMOTE_WRITE);
    let mut tx = vec![0u8; 65536];
    let start = Instant::now();
    let mut segs = 0u64;
    for i in 0..total / msg {
        a.qp.post_send(SendWr {
            wr_id: i as u64,
            op: SendOp::Write {
                remote_stag: dst,
                remote_to: 0x2000_0000,
            },
            sgl: vec![Sge {
                lkey: src,
                addr: 0x1000_0000,
                len: msg as u32,
            }],
            signaled: false,
            fence: false,
        })
        .unwrap();
        loop {
            let n =
                a.qp.poll_segment(&a.res, mulpdu, |h, p| {
                    tx[..h.len()].copy_from_slice(h);
                    let n = h.len() + p.len();
                    p.reader().fill(&mut tx[h.len()..n]);
                    n
                })
                .unwrap();
            let Some(n) = n else { break };
            b.qp.on_segment(&mut b.res, &tx[..n]).unwrap();
            segs += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(b.mem(dst), vec![0x5a; msg]);
    assert_eq!(b.qp.state(), QpState::Rts);
    let gbps = total as f64 * 8.0 / secs / 1e9;
    println!(
        "mulpdu {mulpdu:5} msg {msg:8}: {gbps:6.1} Gbit/s, {:.0} ns/segment",
        secs * 1e9 / segs as f64
    );
    gbps
}

#[test]
#[ignore]
fn write_throughput() {
    for mulpdu in [1424, 8960, 65535] {
        assert!(run(mulpdu, 1 << 20, 1 << 30) > 0.0);
    }
    assert!(run(1424, 64, 64 << 20) > 0.0);
}
