//! Property test: random message sequences (all operations, sizes 0..1 MiB, random
//! MULPDU, payload chunks split at random points) through two back-to-back QPs give
//! the memory contents and completions a plain model predicts.

mod common;
use common::*;
use proptest::prelude::*;
use xwarp_rdmap::*;

const REGION: usize = 1 << 20;

#[derive(Debug, Clone)]
enum Op {
    Send { len: usize, off: usize, se: bool },
    Write { len: usize, src: usize, dst: usize },
    Read { len: usize, src: usize, dst: usize },
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0usize..64, 3 => 0usize..4096, 1 => 0usize..REGION]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (size(), any::<prop::sample::Index>(), any::<bool>()).prop_map(|(len, o, se)| Op::Send {
            len,
            off: o.index(REGION - len + 1),
            se
        }),
        (
            size(),
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>()
        )
            .prop_map(|(len, s, d)| Op::Write {
                len,
                src: s.index(REGION - len + 1),
                dst: d.index(REGION - len + 1)
            }),
        (
            size(),
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>()
        )
            .prop_map(|(len, s, d)| Op::Read {
                len,
                src: s.index(REGION - len + 1),
                dst: d.index(REGION - len + 1)
            }),
    ]
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..REGION)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ seed)
        .collect()
}

/// Deliver every available segment of `from` to `to`, payloads cut at random points.
fn move_split(from: &mut Side, to: &mut Side, mulpdu: usize, rng: &mut Rng) -> bool {
    let mut moved = false;
    while let Some(seg) = from.next_segment(mulpdu) {
        assert!(seg.len() <= mulpdu);
        let hlen = xwarp_ddp::segment::header_len(seg[0]);
        let plen = seg.len() - hlen;
        let mut cuts: Vec<usize> = (0..rng.next() % 4)
            .map(|_| (rng.next() as usize) % (plen + 1))
            .collect();
        cuts.sort_unstable();
        to.deliver_split(&seg, &cuts);
        moved = true;
    }
    moved
}

fn pump_split(a: &mut Side, b: &mut Side, mulpdu: usize, rng: &mut Rng) {
    loop {
        let ab = move_split(a, b, mulpdu, rng);
        let ba = move_split(b, a, mulpdu, rng);
        if !ab && !ba {
            return;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn random_streams_place_and_complete_like_the_model(
        ops in prop::collection::vec(op(), 1..10),
        mulpdu in 70usize..9000,
        seed in 1u64..u64::MAX,
        signal_mask in any::<u16>(),
        ord in 1u32..4,
    ) {
        let mut rng = Rng(seed);
        let mut a = Side::new(4, ord, 1);
        let mut b = Side::new(ord, 4, 16);
        let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let a_src = a.reg_data(0x10_0000_0000, &pattern(1), all);
        let a_sink = a.reg(0x20_0000_0000, REGION, 0, Access::LOCAL_WRITE);
        let b_recv = b.reg(0x30_0000_0000, REGION, 0, Access::LOCAL_WRITE);
        let b_wsink = b.reg(0x40_0000_0000, REGION, 0, Access::REMOTE_WRITE);
        let b_src = b.reg_data(0x50_0000_0000, &pattern(2), Access::REMOTE_READ);

        let mut m_a_sink = vec![0u8; REGION];
        let mut m_b_recv = vec![0u8; REGION];
        let mut m_b_wsink = vec![0u8; REGION];
        let a_src_data = pattern(1);
        let b_src_data = pattern(2);
        let mut want_a = Vec::new();
        let mut want_b = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let wr_id = i as u64;
            let signaled = signal_mask & (1 << i) != 0;
            let (wr, opc, len) = match *op {
                Op::Send { len, off, se } => {
                    b.recv(1000 + wr_id, b_recv, 0x30_0000_0000, REGION as u32);
                    m_b_recv[..len].copy_from_slice(&a_src_data[off..off + len]);
                    want_b.push(Completion {
                        solicited: se,
                        ..ok(1000 + wr_id, WcOpcode::Recv, len as u32)
                    });
                    (SendWr {
                        wr_id,
                        op: SendOp::Send { solicited: se, invalidate: None },
                        sgl: vec![Sge { lkey: a_src, addr: 0x10_0000_0000 + off as u64, len: len as u32 }],
                        signaled,
                        fence: false,
                    }, WcOpcode::Send, len)
                }
                Op::Write { len, src, dst } => {
                    m_b_wsink[dst..dst + len].copy_from_slice(&a_src_data[src..src + len]);
                    // Split the source into two SGEs to exercise gathering.
                    let h = len / 2;
                    (SendWr {
                        wr_id,
                        op: SendOp::Write { remote_stag: b_wsink, remote_to: 0x40_0000_0000 + dst as u64 },
                        sgl: vec![
                            Sge { lkey: a_src, addr: 0x10_0000_0000 + src as u64, len: h as u32 },
                            Sge { lkey: a_src, addr: 0x10_0000_0000 + (src + h) as u64, len: (len - h) as u32 },
                        ],
                        signaled,
                        fence: false,
                    }, WcOpcode::Write, len)
                }
                Op::Read { len, src, dst } => {
                    m_a_sink[dst..dst + len].copy_from_slice(&b_src_data[src..src + len]);
                    (SendWr {
                        wr_id,
                        op: SendOp::Read { remote_stag: b_src, remote_to: 0x50_0000_0000 + src as u64 },
                        sgl: vec![Sge { lkey: a_sink, addr: 0x20_0000_0000 + dst as u64, len: len as u32 }],
                        signaled,
                        fence: false,
                    }, WcOpcode::Read, len)
                }
            };
            if signaled {
                want_a.push(ok(wr_id, opc, len as u32));
            }
            a.qp.post_send(wr).unwrap();
            // Sometimes move traffic between posts.
            if rng.next().is_multiple_of(3) {
                pump_split(&mut a, &mut b, mulpdu, &mut rng);
            }
        }
        pump_split(&mut a, &mut b, mulpdu, &mut rng);
        prop_assert_eq!(a.qp.state(), QpState::Rts);
        prop_assert_eq!(b.qp.state(), QpState::Rts);
        prop_assert!(a.events().is_empty());
        prop_assert!(b.events().is_empty());
        // Memory.
        prop_assert!(a.mem(a_sink) == m_a_sink, "read sink differs");
        prop_assert!(b.mem(b_wsink) == m_b_wsink, "write sink differs");
        prop_assert!(b.mem(b_recv) == m_b_recv, "receive buffer differs");
        // Completions: receives in MSN order; send side in posting order (a Send done
        // before an earlier Read's Response arrived waits for it).
        prop_assert_eq!(b.completions(), want_b);
        prop_assert_eq!(a.completions(), want_a);
    }
}
