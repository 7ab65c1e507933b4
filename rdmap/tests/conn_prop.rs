//! Property: random message sequences (every data opcode, sizes 0..1 MiB, random EMSS)
//! through random re-segmentation of the TCP byte stream, with CRC and markers on and
//! off, leave memory exactly as a sequential model predicts and give the same
//! completions as an unsplit reference run.

#[path = "conn_util.rs"]
mod util;

use std::time::Instant;

use proptest::prelude::*;
use util::*;
use xwarp_rdmap::conn::ConnEvent;
use xwarp_rdmap::*;

const M: usize = 1 << 20;
const A_SRC: u64 = 0x10_0000_0000;
const A_SINK: u64 = 0x20_0000_0000;
const B_MEM: u64 = 0x30_0000_0000;

#[derive(Debug, Clone, Copy)]
enum Op {
    Write {
        len: usize,
        src: usize,
        dst: usize,
    },
    Read {
        len: usize,
        src: usize,
        dst: usize,
    },
    Send {
        len: usize,
        src: usize,
        se: bool,
        inv: bool,
    },
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0usize..600, 1 => 0usize..=M]
}

fn op() -> impl Strategy<Value = Op> {
    (
        0u8..3,
        size(),
        any::<u32>(),
        any::<u32>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(k, len, a, b, se, inv)| {
            let off = |x: u32| x as usize % (M - len + 1);
            match k {
                0 => Op::Write {
                    len,
                    src: off(a),
                    dst: off(b),
                },
                1 => Op::Read {
                    len,
                    src: off(a),
                    dst: off(b),
                },
                _ => Op::Send {
                    len,
                    src: off(a),
                    se,
                    inv,
                },
            }
        })
}

/// Writes and Sends wait for earlier Reads (verbs fence): a Write may otherwise change
/// a Read's source before its Response is built (RFC 5040 §5.5 allows that), which the
/// sequential model cannot predict.
fn fenced(p: &mut Peer, wr_id: u64, op: SendOp, sgl: Vec<Sge>) {
    p.conn
        .post_send(SendWr {
            wr_id,
            op,
            sgl,
            signaled: true,
            fence: true,
        })
        .unwrap();
}

struct Outcome {
    a_comp: Vec<Completion>,
    b_comp: Vec<Completion>,
    a_sink: Vec<u8>,
    b_mem: Vec<u8>,
    recvs: Vec<Vec<u8>>,
}

fn run(ops: &[Op], seed: u64, crc: bool, markers: bool, emss: usize, max_piece: usize) -> Outcome {
    let mut rng = Rng(seed);
    let tweak = move |c: &mut conn::ConnConfig| {
        c.initiator.crc = crc;
        c.initiator.markers = markers;
        c.responder.markers = markers;
        c.emss = emss;
    };
    let (mut a, mut b) = connect(tweak, tweak, &mut rng, max_piece);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let src = Rng(seed ^ 0xabcdef).bytes(M);
    let a_src = a.reg(A_SRC, src, Access::LOCAL_WRITE);
    let a_sink = a.reg(A_SINK, vec![0; M], rw);
    let b_mem = b.reg(B_MEM, Rng(seed ^ 0x1234).bytes(M), rw);
    let mut recv_stags = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let wr_id = i as u64;
        match *op {
            Op::Write { len, src, dst } => fenced(
                &mut a,
                wr_id,
                SendOp::Write {
                    remote_stag: b_mem,
                    remote_to: B_MEM + dst as u64,
                },
                vec![Sge {
                    lkey: a_src,
                    addr: A_SRC + src as u64,
                    len: len as u32,
                }],
            ),
            Op::Read { len, src, dst } => a.send(
                wr_id,
                SendOp::Read {
                    remote_stag: b_mem,
                    remote_to: B_MEM + src as u64,
                },
                vec![Sge {
                    lkey: a_sink,
                    addr: A_SINK + dst as u64,
                    len: len as u32,
                }],
            ),
            Op::Send { len, src, se, inv } => {
                let rb = b.reg(0x1000, vec![0; len], Access::LOCAL_WRITE);
                recv_stags.push(rb);
                b.recv(
                    wr_id,
                    vec![Sge {
                        lkey: rb,
                        addr: 0x1000,
                        len: len as u32,
                    }],
                );
                // Send with Invalidate targets a region of B's PD.
                let invalidate = inv.then(|| b.reg(0x9000, vec![0; 8], rw));
                fenced(
                    &mut a,
                    wr_id,
                    SendOp::Send {
                        solicited: se,
                        invalidate,
                    },
                    vec![Sge {
                        lkey: a_src,
                        addr: A_SRC + src as u64,
                        len: len as u32,
                    }],
                );
            }
        }
    }
    pump(&mut a, &mut b, &mut rng, max_piece, Instant::now());
    assert!(
        !a.events
            .iter()
            .chain(&b.events)
            .any(|e| matches!(e, ConnEvent::Error(_))),
        "errors: {:?} {:?}",
        a.events,
        b.events
    );
    Outcome {
        a_comp: a.completions(),
        b_comp: b.completions(),
        a_sink: a.mem(a_sink),
        b_mem: b.mem(b_mem),
        recvs: recv_stags.iter().map(|s| b.mem(*s)).collect(),
    }
}

/// The sequential model: what memory must hold after `ops`.
fn model(ops: &[Op], seed: u64) -> (Vec<u8>, Vec<u8>, Vec<Vec<u8>>) {
    let src = Rng(seed ^ 0xabcdef).bytes(M);
    let mut a_sink = vec![0; M];
    let mut b_mem = Rng(seed ^ 0x1234).bytes(M);
    let mut recvs = Vec::new();
    for op in ops {
        match *op {
            Op::Write { len, src: s, dst } => {
                b_mem[dst..dst + len].copy_from_slice(&src[s..s + len])
            }
            Op::Read { len, src: s, dst } => {
                a_sink[dst..dst + len].copy_from_slice(&b_mem[s..s + len])
            }
            Op::Send { len, src: s, .. } => recvs.push(src[s..s + len].to_vec()),
        }
    }
    (a_sink, b_mem, recvs)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn random_messages_survive_random_resegmentation(
        ops in prop::collection::vec(op(), 1..6),
        seed in any::<u64>(),
        crc in any::<bool>(),
        markers in any::<bool>(),
        emss in 128usize..9000,
        max_piece in prop_oneof![1usize..16, 16usize..3000, 3000usize..70000],
    ) {
        let got = run(&ops, seed, crc, markers, emss, max_piece);
        let (a_sink, b_mem, recvs) = model(&ops, seed);
        prop_assert!(got.a_sink == a_sink, "read data differs");
        prop_assert!(got.b_mem == b_mem, "written data differs");
        prop_assert_eq!(&got.recvs, &recvs);
        // Same completions as an unsplit run with default framing.
        let reference = run(&ops, seed, false, false, 1448, usize::MAX);
        prop_assert_eq!(&got.a_comp, &reference.a_comp);
        prop_assert_eq!(&got.b_comp, &reference.b_comp);
        // And they are what the operations imply.
        prop_assert_eq!(got.a_comp.len(), ops.len());
        let recv_count = ops.iter().filter(|o| matches!(o, Op::Send { .. })).count();
        prop_assert_eq!(got.b_comp.len(), recv_count);
        for (i, (c, op)) in got.a_comp.iter().zip(&ops).enumerate() {
            prop_assert_eq!(c.wr_id, i as u64);
            prop_assert_eq!(c.status, CompletionStatus::Success);
            let (opc, len) = match *op {
                Op::Write { len, .. } => (WcOpcode::Write, len),
                Op::Read { len, .. } => (WcOpcode::Read, len),
                Op::Send { len, .. } => (WcOpcode::Send, len),
            };
            prop_assert_eq!(c.opcode, opc);
            if opc == WcOpcode::Read {
                prop_assert_eq!(c.byte_len as usize, len);
            }
        }
        let sends = ops.iter().enumerate().filter_map(|(i, o)| match *o {
            Op::Send { len, se, inv, .. } => Some((i, len, se, inv)),
            _ => None,
        });
        for (c, (i, len, se, inv)) in got.b_comp.iter().zip(sends) {
            prop_assert_eq!(c.wr_id, i as u64);
            prop_assert_eq!(c.status, CompletionStatus::Success);
            prop_assert_eq!(c.byte_len as usize, len);
            prop_assert_eq!(c.solicited, se);
            prop_assert_eq!(c.invalidated_stag.is_some(), inv);
        }
    }
}
