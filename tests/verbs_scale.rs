//! Scale: 64 QPs at once on one engine (server side on one SRQ), and a bulk RDMA Write
//! stream (1 GiB by default, `XWARP_VERBS_BULK_MIB` to change) over a virtual wire with
//! loss, reordering and duplication, checked by hash.

mod verbs_common;

use std::time::Instant;

use verbs_common::*;
use xwarp::poll_driver::vwire::{LinkConfig, WireConfig};
use xwarp::verbs::{
    Access, CmEvent, CompletionStatus, ConnectParams, QpInitAttr, SendRequest, WcOpcode,
};

#[test]
fn sixty_four_qps_at_once_on_one_engine() {
    const QPS: usize = 64;
    const LEN: usize = 32 * 1024;
    let (a, b) = pair(WireConfig::default());
    let listener = b.device().listen(server_addr(6000), 128).unwrap();
    let (cdev, sdev) = (a.device(), b.device());
    let (cpd, spd) = (cdev.alloc_pd(), sdev.alloc_pd());
    let (cscq, crcq) = (cdev.create_cq(1024).unwrap(), cdev.create_cq(1024).unwrap());
    let (sscq, srcq) = (sdev.create_cq(1024).unwrap(), sdev.create_cq(1024).unwrap());
    let srq = spd.create_srq(QPS * 2).unwrap();
    let acc = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let src = cpd.alloc_mr(QPS * LEN, acc, false).unwrap();
    let dst = spd.alloc_mr(QPS * LEN, acc, false).unwrap();
    let msgs = spd.alloc_mr(QPS * 64, acc, false).unwrap();
    for i in 0..QPS {
        src.write(i * LEN, &pattern(LEN, i as u8)).unwrap();
        srq.post_recv(i as u64, &[msgs.sge(i * 64, 64).unwrap()])
            .unwrap();
    }
    let clients: Vec<_> = (0..QPS)
        .map(|_| cpd.create_qp(&QpInitAttr::new(&cscq, &crcq)).unwrap())
        .collect();
    let servers: Vec<_> = (0..QPS)
        .map(|_| {
            let mut at = QpInitAttr::new(&sscq, &srcq);
            at.srq = Some(&srq);
            spd.create_qp(&at).unwrap()
        })
        .collect();
    for (i, c) in clients.iter().enumerate() {
        c.connect(
            server_addr(6000),
            ConnectParams {
                private_data: (i as u32).to_be_bytes().to_vec(),
                timeout: T,
            },
        )
        .unwrap();
    }
    // Requests arrive in any order; the private data says which client it is.
    let mut server_of = vec![usize::MAX; QPS];
    for (k, server) in servers.iter().enumerate() {
        let req = listener.get_request(T).unwrap();
        let i = u32::from_be_bytes(req.private_data[..4].try_into().unwrap()) as usize;
        server_of[i] = k;
        req.accept(server, &[]).unwrap();
    }
    for (i, c) in clients.iter().enumerate() {
        assert!(
            matches!(c.next_event(T).unwrap(), CmEvent::Established { .. }),
            "client {i}"
        );
        assert!(matches!(
            servers[server_of[i]].next_event(T).unwrap(),
            CmEvent::Established { .. }
        ));
    }
    // Every client writes its slice and then sends its index.
    for (i, c) in clients.iter().enumerate() {
        c.post_send(SendRequest::write(
            i as u64,
            vec![src.sge(i * LEN, LEN).unwrap()],
            dst.rkey(),
            dst.addr() + (i * LEN) as u64,
        ))
        .unwrap();
        c.post_send(SendRequest {
            inline: Some((i as u32).to_be_bytes().to_vec()),
            ..SendRequest::send(1000 + i as u64, vec![])
        })
        .unwrap();
    }
    let mut done = [false; QPS];
    for _ in 0..QPS {
        let w = wc(&srcq);
        assert_eq!(
            (w.status, w.opcode, w.byte_len),
            (CompletionStatus::Success, WcOpcode::Recv, 4)
        );
        let slot = w.wr_id as usize;
        let i = u32::from_be_bytes(msgs.to_vec(slot * 64, 4).unwrap().try_into().unwrap()) as usize;
        assert!(!done[i]);
        done[i] = true;
        assert_eq!(
            dst.to_vec(i * LEN, LEN).unwrap(),
            pattern(LEN, i as u8),
            "qp {i}"
        );
    }
    for _ in 0..2 * QPS {
        assert_eq!(wc(&cscq).status, CompletionStatus::Success);
    }
}

fn mix(mut h: u64, data: &[u8]) -> u64 {
    for w in data.chunks_exact(8) {
        let v = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(27);
    }
    h
}

/// RDMA Writes into two alternating 8 MiB halves of the server's region; after each
/// half the client sends a notice, the server hashes the half and returns a credit.
#[test]
fn bulk_rdma_writes_arrive_intact_over_a_lossy_wire() {
    let mib: usize = std::env::var("XWARP_VERBS_BULK_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    const MSG: usize = 64 * 1024;
    const HALF: usize = 8 << 20;
    const PER_HALF: usize = HALF / MSG;
    let batches = (mib << 20).div_ceil(HALF);
    let link = |seed| LinkConfig {
        drop: 0.001,
        reorder: 0.001,
        duplicate: 0.001,
        ..LinkConfig::seeded(seed)
    };
    let (a, b) = pair(WireConfig {
        a_to_b: link(11),
        b_to_a: link(12),
        ..WireConfig::default()
    });
    let (c, s) = connect(&a, &b, 6001, |q| {
        q.max_send_wr = 256;
        q.mpa.crc = true;
    });
    let acc = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let src = c.pd.alloc_mr(2 * HALF, acc, true).unwrap();
    let dst = s.pd.alloc_mr(2 * HALF, acc, true).unwrap();
    let cmsg = mr(&c, 64);
    let smsg = mr(&s, 64);
    let mut seed = 0x1234_5678_9abc_def0u64;
    let data: Vec<u8> = (0..2 * HALF)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    src.write(0, &data).unwrap();
    let chunk_of = |k: usize, j: usize| ((k * 7 + j * 13) % (2 * PER_HALF)) * MSG;
    let t0 = Instant::now();
    let server = std::thread::scope(|sc| {
        let server = sc.spawn(|| {
            let mut h = 0u64;
            let mut buf = vec![0u8; HALF];
            // Two notices can be in flight (one per half): keep two receives posted,
            // or the second notice finds none (a Terminate, RFC 5041 no buffer).
            for k in 0..2.min(batches) {
                s.qp.post_recv(k as u64, &[smsg.sge(8 * k, 8).unwrap()])
                    .unwrap();
            }
            for k in 0..batches {
                let w = wc(&s.rcq);
                if w.status != CompletionStatus::Success {
                    panic!(
                        "server recv {k}: {w:?}; events {:?}",
                        std::iter::from_fn(|| s.qp.poll_event()).collect::<Vec<_>>()
                    );
                }
                assert_eq!(w.wr_id, k as u64);
                dst.read((k % 2) * HALF, &mut buf).unwrap();
                h = mix(h, &buf);
                if k + 2 < batches {
                    s.qp.post_recv((k + 2) as u64, &[smsg.sge(8 * (k % 2), 8).unwrap()])
                        .unwrap();
                }
                s.qp.post_send(SendRequest {
                    inline: Some((k as u64).to_be_bytes().to_vec()),
                    ..SendRequest::send(k as u64, vec![])
                })
                .unwrap();
                let w = wc(&s.scq);
                assert_eq!(
                    w.status,
                    CompletionStatus::Success,
                    "server events {:?}",
                    std::iter::from_fn(|| s.qp.poll_event()).collect::<Vec<_>>()
                );
            }
            h
        });
        let mut want = 0u64;
        let mut credits_pending = 0usize;
        for k in 0..batches {
            if k >= 2 {
                // Wait for the credit of batch k-2 (its half is free again).
                let w = wc(&c.rcq);
                assert_eq!(w.status, CompletionStatus::Success);
                credits_pending -= 1;
            }
            c.qp.post_recv(k as u64, &[cmsg.sge(0, 8).unwrap()])
                .unwrap();
            credits_pending += 1;
            for j in 0..PER_HALF {
                let mut wr = SendRequest::write(
                    j as u64,
                    vec![src.sge(chunk_of(k, j), MSG).unwrap()],
                    dst.rkey(),
                    dst.addr() + ((k % 2) * HALF + j * MSG) as u64,
                );
                wr.signaled = j + 1 == PER_HALF;
                c.qp.post_send(wr).unwrap();
                want = mix(want, &data[chunk_of(k, j)..chunk_of(k, j) + MSG]);
            }
            c.qp.post_send(SendRequest {
                inline: Some((k as u64).to_be_bytes().to_vec()),
                ..SendRequest::send(1 << 40 | k as u64, vec![])
            })
            .unwrap();
            for _ in 0..2 {
                assert_eq!(wc(&c.scq).status, CompletionStatus::Success);
            }
        }
        while credits_pending > 0 {
            assert_eq!(wc(&c.rcq).status, CompletionStatus::Success);
            credits_pending -= 1;
        }
        (server.join().unwrap(), want)
    });
    let el = t0.elapsed().as_secs_f64();
    let (got, want) = server;
    eprintln!(
        "bulk: {} MiB of RDMA Writes in {el:.2} s ({:.2} Gb/s) over a lossy wire, hash {got:016x}",
        (batches * HALF) >> 20,
        (batches * HALF) as f64 * 8.0 / el / 1e9
    );
    assert_eq!(got, want, "hash of the data placed at the server");
}
