//! Unit tests of the transmit paths (`poll_transmit` and `poll_transmit_into`) and of the
//! Read RTR's sink region.

use super::*;
use crate::mem::{Access, PdId};
use crate::verbs::{SendWr, Sge};
use xwarp_ddp::mpa::RtrType;

/// xorshift64*: deterministic piece sizes.
struct Rng(u64);
impl Rng {
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        lo + (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % (hi - lo + 1) as u64) as usize
    }
}

struct End {
    conn: Connection,
    res: Resources,
    pd: PdId,
    sent: Vec<u8>,
}

fn end(initiator: bool, now: Instant) -> End {
    // A fixed STag seed: two runs must carry byte-identical streams.
    let mut res = Resources::with_stags(crate::mem::StagTable::with_seed(1));
    let pd = res.stags.alloc_pd();
    let mut cfg = ConnConfig::new(QpConfig {
        pd,
        ird: 4,
        ord: 4,
        sq_depth: 64,
        rq: RqConfig::Own(64),
    });
    cfg.emss = 1448;
    cfg.initiator.crc = true;
    cfg.responder.crc = true;
    let conn = if initiator {
        Connection::initiator(cfg, now).unwrap()
    } else {
        Connection::responder(cfg, now).unwrap()
    };
    End {
        conn,
        res,
        pd,
        sent: Vec::new(),
    }
}

/// Everything `e` has to send: through `poll_transmit_into` with buffers of random
/// sizes (`rng`), or through `poll_transmit` (`None`).
fn transmit(e: &mut End, rng: Option<&mut Rng>) -> Vec<u8> {
    let mut out = Vec::new();
    match rng {
        Some(rng) => loop {
            let mut buf = vec![0u8; rng.range(1, 3000)];
            let n = e.conn.poll_transmit_into(&e.res, &mut buf);
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        },
        None => while e.conn.poll_transmit(&e.res, &mut out) > 0 {},
    }
    e.sent.extend_from_slice(&out);
    out
}

/// Connect, then Write `data` and Send 100 bytes from the initiator; returns both
/// ends after everything was delivered.
fn run(data: &[u8], mut rng: Option<Rng>) -> (End, End, Stag) {
    let now = Instant::now();
    let (mut i, mut r) = (end(true, now), end(false, now));
    let sink = r
        .res
        .stags
        .register(
            r.pd,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            0x1000,
            Box::new(vec![0u8; data.len() + 100]),
        )
        .unwrap();
    let src = i
        .res
        .stags
        .register(i.pd, Access::LOCAL_WRITE, 0x9000, Box::new(data.to_vec()))
        .unwrap();
    let mut accepted = false;
    let mut posted = false;
    for _ in 0..10_000 {
        let ab = transmit(&mut i, rng.as_mut());
        let ba = transmit(&mut r, rng.as_mut());
        r.conn.handle_input(now, &ab, &mut r.res).unwrap();
        i.conn.handle_input(now, &ba, &mut i.res).unwrap();
        while let Some(e) = r.conn.poll_event() {
            if matches!(e, ConnEvent::ConnectRequest(_)) && !accepted {
                accepted = true;
                r.conn
                    .accept(AcceptParams {
                        ird: 4,
                        ord: 4,
                        private_data: Vec::new(),
                    })
                    .unwrap();
                let sge = Sge {
                    lkey: sink,
                    addr: 0x1000 + data.len() as u64,
                    len: 100,
                };
                r.conn
                    .post_recv(crate::verbs::RecvWr {
                        wr_id: 7,
                        sgl: vec![sge],
                    })
                    .unwrap();
            }
        }
        while i.conn.poll_event().is_some() {}
        if i.conn.is_established() && !posted {
            posted = true;
            let sge = |addr, len| Sge {
                lkey: src,
                addr,
                len,
            };
            let wr = |wr_id, op, sgl| SendWr {
                wr_id,
                op,
                sgl,
                signaled: true,
                fence: false,
            };
            let write = SendOp::Write {
                remote_stag: sink,
                remote_to: 0x1000,
            };
            i.conn
                .post_send(wr(1, write, vec![sge(0x9000, data.len() as u32)]))
                .unwrap();
            let send = SendOp::Send {
                solicited: false,
                invalidate: None,
            };
            i.conn
                .post_send(wr(2, send, vec![sge(0x9000, 100)]))
                .unwrap();
        }
        if posted && ab.is_empty() && ba.is_empty() {
            break;
        }
    }
    (i, r, sink)
}

#[test]
fn poll_transmit_into_small_buffers_carries_the_same_stream_as_poll_transmit() {
    let data: Vec<u8> = (0..200_000u32).map(|x| (x * 7 + x / 253) as u8).collect();
    let (mut i_ref, _, _) = run(&data, None);
    let (mut i, mut r, sink) = run(&data, Some(Rng(0x5eed)));
    // Byte for byte the stream of the staging API (MPA frames, FPDUs, CRCs).
    assert_eq!(i.sent.len(), i_ref.sent.len());
    assert!(i.sent == i_ref.sent, "streams differ");
    // The data landed, and both work requests completed successfully.
    let mem = r
        .res
        .stags
        .region(sink)
        .unwrap()
        .memory()
        .read_at(0, data.len() + 100)
        .to_vec();
    assert_eq!(&mem[..data.len()], &data[..]);
    assert_eq!(&mem[data.len()..], &data[..100]);
    let ok = |c: Option<Completion>| c.map(|c| (c.wr_id, c.status));
    assert_eq!(
        ok(i.conn.poll_completion()),
        Some((1, CompletionStatus::Success))
    );
    assert_eq!(
        ok(i.conn.poll_completion()),
        Some((2, CompletionStatus::Success))
    );
    assert_eq!(
        ok(r.conn.poll_completion()),
        Some((7, CompletionStatus::Success))
    );
    assert!(i_ref.conn.poll_completion().is_some());
}

#[test]
fn poll_transmit_into_keeps_an_fpdu_that_does_not_fit_for_the_next_call() {
    let data = vec![0xa5u8; 4000];
    let (mut i, _, _) = run(&[1u8; 200], Some(Rng(1)));
    assert!(i.conn.is_established());
    // A one-byte buffer always takes exactly one byte while anything is queued.
    let src = i
        .res
        .stags
        .register(i.pd, Access::LOCAL_WRITE, 0x20000, Box::new(data.clone()))
        .unwrap();
    i.conn
        .post_send(SendWr {
            wr_id: 9,
            op: SendOp::Write {
                remote_stag: Stag(0x1234_5600),
                remote_to: 0,
            },
            sgl: vec![Sge {
                lkey: src,
                addr: 0x20000,
                len: 4000,
            }],
            signaled: true,
            fence: false,
        })
        .unwrap();
    let mut bytes = Vec::new();
    let mut one = [0u8; 1];
    while i.conn.poll_transmit_into(&i.res, &mut one) == 1 {
        bytes.push(one[0]);
        assert!(bytes.len() <= 8000, "never ends");
    }
    // Three FPDUs (MULPDU of a 1448-byte EMSS), each whole: length field + ULPDU +
    // pad + CRC, CRC valid.
    let mut at = 0;
    let mut fpdus = 0;
    while at < bytes.len() {
        let ulpdu = usize::from(u16::from_be_bytes([bytes[at], bytes[at + 1]]));
        let len = 2 + ulpdu + (4 - (2 + ulpdu) % 4) % 4;
        let trailer: [u8; 4] = bytes[at + len..at + len + 4].try_into().unwrap();
        assert_eq!(
            xwarp_ddp::mpa::crc::crc32c(&bytes[at..at + len]),
            xwarp_ddp::mpa::crc::crc_from_trailer(trailer),
            "FPDU {fpdus} CRC"
        );
        at += len + 4;
        fpdus += 1;
    }
    assert_eq!(at, bytes.len());
    assert_eq!(fpdus, 3);
}

/// Connect with P2P and a zero-length Read RTR; returns both ends once the stream is
/// open on both sides and nothing is left to exchange.
fn run_read_rtr() -> (End, End, Option<Stag>) {
    let now = Instant::now();
    let (mut i, mut r) = (end(true, now), end(false, now));
    // The Request is queued at creation: build the initiator again with P2P (Read).
    let mut cfg = i.conn.cfg.clone();
    cfg.initiator.p2p = Some(xwarp_ddp::mpa::RtrSet::only(RtrType::Read));
    i.conn = Connection::initiator(cfg, now).unwrap();
    let mut accepted = false;
    let mut seen = None;
    for _ in 0..1000 {
        let ab = transmit(&mut i, None);
        let ba = transmit(&mut r, None);
        r.conn.handle_input(now, &ab, &mut r.res).unwrap();
        i.conn.handle_input(now, &ba, &mut i.res).unwrap();
        seen = seen.or(i.conn.rtr_sink());
        while let Some(e) = r.conn.poll_event() {
            if matches!(e, ConnEvent::ConnectRequest(_)) && !accepted {
                accepted = true;
                r.conn
                    .accept(AcceptParams {
                        ird: 4,
                        ord: 4,
                        private_data: Vec::new(),
                    })
                    .unwrap();
            }
        }
        while i.conn.poll_event().is_some() {}
        if accepted && ab.is_empty() && ba.is_empty() {
            break;
        }
    }
    assert!(i.conn.is_established() && r.conn.is_established());
    (i, r, seen)
}

#[test]
fn rfc6581_read_rtr_sink_is_deregistered_once_the_rtr_read_completed() {
    let (mut i, _r, seen) = run_read_rtr();
    assert_eq!(
        i.conn.negotiated().and_then(|n| n.rtr),
        Some(RtrType::Read),
        "a Read RTR was negotiated"
    );
    // The sink went with the RTR's completion, which the ULP never sees: the table is
    // back to its size (it held nothing else).
    let sink = seen.expect("the Read RTR registered a sink");
    assert!(
        i.res.stags.region(sink).is_none(),
        "sink STag still registered"
    );
    assert_eq!(i.conn.rtr_sink(), None);
    assert!(i.conn.poll_completion().is_none());
}

#[test]
fn rfc6581_read_rtr_sink_is_deregistered_when_the_connection_goes_first() {
    let now = Instant::now();
    let (mut i, mut r) = (end(true, now), end(false, now));
    let mut cfg = i.conn.cfg.clone();
    cfg.initiator.p2p = Some(xwarp_ddp::mpa::RtrSet::only(RtrType::Read));
    i.conn = Connection::initiator(cfg, now).unwrap();
    // Request over, Reply back: the Initiator opens and posts the Read RTR.
    let ab = transmit(&mut i, None);
    r.conn.handle_input(now, &ab, &mut r.res).unwrap();
    while r.conn.poll_event().is_some() {}
    r.conn
        .accept(AcceptParams {
            ird: 4,
            ord: 4,
            private_data: Vec::new(),
        })
        .unwrap();
    let ba = transmit(&mut r, None);
    i.conn.handle_input(now, &ba, &mut i.res).unwrap();
    let sink = i.conn.rtr_sink().expect("the Read RTR registered its sink");
    assert!(i.res.stags.region(sink).is_some());
    // The peer goes away before answering the RTR: the owner drops the connection.
    i.conn.handle_peer_closed();
    i.conn.release(&mut i.res);
    assert!(i.res.stags.region(sink).is_none(), "sink leaked");
    assert_eq!(i.conn.rtr_sink(), None);
    // And through handle_input when the owner keeps feeding a dead connection.
    let (mut i2, mut r2) = (end(true, now), end(false, now));
    let mut cfg = i2.conn.cfg.clone();
    cfg.initiator.p2p = Some(xwarp_ddp::mpa::RtrSet::only(RtrType::Read));
    i2.conn = Connection::initiator(cfg, now).unwrap();
    let ab = transmit(&mut i2, None);
    r2.conn.handle_input(now, &ab, &mut r2.res).unwrap();
    while r2.conn.poll_event().is_some() {}
    r2.conn
        .accept(AcceptParams {
            ird: 4,
            ord: 4,
            private_data: Vec::new(),
        })
        .unwrap();
    let ba = transmit(&mut r2, None);
    i2.conn.handle_input(now, &ba, &mut i2.res).unwrap();
    let sink = i2.conn.rtr_sink().expect("sink");
    i2.conn.handle_peer_closed();
    let _ = i2.conn.handle_input(now, &[], &mut i2.res);
    assert!(i2.res.stags.region(sink).is_none(), "sink leaked");
}

/// RFC 6581 §3: the Initiator's RTR is the connection's own FPDU. Held back by
/// `first_fpdu_delay` (toward siw), it must not take one of the application's SQ slots:
/// the ULP may fill the whole queue right after ESTABLISHED (perftest's `ib_write_bw`
/// posts its full 128-deep queue), and every one of those WRs is carried and completed.
#[test]
fn rfc6581_held_rtr_takes_no_application_send_queue_slot() {
    let now = Instant::now();
    let (mut i, mut r) = (end(true, now), end(false, now));
    let mut cfg = i.conn.cfg.clone();
    cfg.initiator.p2p = Some(xwarp_ddp::mpa::RtrSet::only(RtrType::Write));
    cfg.first_fpdu_delay = Duration::from_millis(100);
    i.conn = Connection::initiator(cfg, now).unwrap();
    let depth = i.conn.cfg.qp.sq_depth;
    let data: Vec<u8> = (0..depth * 16).map(|k| (k * 7 + 3) as u8).collect();
    let sink = r
        .res
        .stags
        .register(
            r.pd,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            0x1000,
            Box::new(vec![0u8; data.len()]),
        )
        .unwrap();
    let src = i
        .res
        .stags
        .register(i.pd, Access::LOCAL_WRITE, 0x9000, Box::new(data.clone()))
        .unwrap();
    let mut accepted = false;
    for _ in 0..100 {
        let ab = transmit(&mut i, None);
        let ba = transmit(&mut r, None);
        r.conn.handle_input(now, &ab, &mut r.res).unwrap();
        i.conn.handle_input(now, &ba, &mut i.res).unwrap();
        while let Some(e) = r.conn.poll_event() {
            if matches!(e, ConnEvent::ConnectRequest(_)) && !accepted {
                accepted = true;
                r.conn
                    .accept(AcceptParams {
                        ird: 4,
                        ord: 4,
                        private_data: Vec::new(),
                    })
                    .unwrap();
            }
        }
        while i.conn.poll_event().is_some() {}
        if i.conn.is_established() {
            break;
        }
    }
    assert!(i.conn.is_established(), "the initiator reports ESTABLISHED");
    assert!(i.conn.poll_timeout().is_some(), "the RTR is still held");
    for k in 0..depth {
        let wr = SendWr {
            wr_id: k as u64,
            op: SendOp::Write {
                remote_stag: sink,
                remote_to: 0x1000 + 16 * k as u64,
            },
            sgl: vec![Sge {
                lkey: src,
                addr: 0x9000 + 16 * k as u64,
                len: 16,
            }],
            signaled: true,
            fence: false,
        };
        i.conn
            .post_send(wr)
            .unwrap_or_else(|e| panic!("WR {k} of a {depth}-deep queue refused: {e:?}"));
    }
    let over = SendWr {
        wr_id: 999,
        op: SendOp::Write {
            remote_stag: sink,
            remote_to: 0x1000,
        },
        sgl: Vec::new(),
        signaled: true,
        fence: false,
    };
    assert!(
        matches!(i.conn.post_send(over), Err(PostError::QueueFull)),
        "one WR beyond the depth is refused"
    );
    assert!(
        transmit(&mut i, None).is_empty(),
        "nothing leaves during the hold"
    );
    let later = now + Duration::from_millis(150);
    i.conn.handle_timeout(later);
    let mut done = Vec::new();
    for _ in 0..100 {
        let ab = transmit(&mut i, None);
        let ba = transmit(&mut r, None);
        r.conn.handle_input(later, &ab, &mut r.res).unwrap();
        i.conn.handle_input(later, &ba, &mut i.res).unwrap();
        while let Some(c) = i.conn.poll_completion() {
            done.push(c);
        }
        if ab.is_empty() && ba.is_empty() && done.len() == depth {
            break;
        }
    }
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..depth as u64).collect::<Vec<_>>());
    assert!(done
        .iter()
        .all(|c| c.status == crate::verbs::CompletionStatus::Success));
    let mut placed = vec![0u8; data.len()];
    r.res
        .stags
        .region(sink)
        .unwrap()
        .memory()
        .read_into(0, &mut placed);
    assert_eq!(placed, data, "every Write placed its pattern");
}

/// No `wr_id` is reserved: with a Read RTR still outstanding (held by
/// `first_fpdu_delay`), the ULP's own Read and Send carrying the id the RTR uses
/// (`u64::MAX`) complete on its CQ, the Read with the peer's bytes, while the RTR's
/// completion stays internal and its sink is given back.
#[test]
fn rfc6581_read_rtr_completion_is_internal_so_every_wr_id_is_the_ulps() {
    let now = Instant::now();
    let (mut i, mut r) = (end(true, now), end(false, now));
    let mut cfg = i.conn.cfg.clone();
    cfg.initiator.p2p = Some(xwarp_ddp::mpa::RtrSet::only(RtrType::Read));
    cfg.first_fpdu_delay = Duration::from_millis(100);
    i.conn = Connection::initiator(cfg, now).unwrap();
    let pattern: Vec<u8> = (0..3000u32).map(|k| (k * 13 + 5) as u8).collect();
    let remote = r
        .res
        .stags
        .register(
            r.pd,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
            0x4000,
            Box::new(pattern.clone()),
        )
        .unwrap();
    let recv_buf = r
        .res
        .stags
        .register(r.pd, Access::LOCAL_WRITE, 0, Box::new(vec![0u8; 64]))
        .unwrap();
    let local = i
        .res
        .stags
        .register(
            i.pd,
            Access::LOCAL_WRITE,
            0x8000,
            Box::new(vec![0u8; pattern.len() + 64]),
        )
        .unwrap();
    let mut accepted = false;
    for _ in 0..100 {
        let ab = transmit(&mut i, None);
        let ba = transmit(&mut r, None);
        r.conn.handle_input(now, &ab, &mut r.res).unwrap();
        i.conn.handle_input(now, &ba, &mut i.res).unwrap();
        while let Some(e) = r.conn.poll_event() {
            if matches!(e, ConnEvent::ConnectRequest(_)) && !accepted {
                accepted = true;
                r.conn
                    .accept(AcceptParams {
                        ird: 4,
                        ord: 4,
                        private_data: Vec::new(),
                    })
                    .unwrap();
                r.conn
                    .post_recv(crate::verbs::RecvWr {
                        wr_id: u64::MAX,
                        sgl: vec![Sge {
                            lkey: recv_buf,
                            addr: 0,
                            len: 64,
                        }],
                    })
                    .unwrap();
            }
        }
        while i.conn.poll_event().is_some() {}
        if i.conn.is_established() {
            break;
        }
    }
    assert!(i.conn.is_established());
    let sink = i
        .conn
        .rtr_sink()
        .expect("the held Read RTR registered its sink");
    let read = SendWr {
        wr_id: u64::MAX,
        op: SendOp::Read {
            remote_stag: remote,
            remote_to: 0x4000,
        },
        sgl: vec![Sge {
            lkey: local,
            addr: 0x8000,
            len: pattern.len() as u32,
        }],
        signaled: true,
        fence: false,
    };
    let send = SendWr {
        wr_id: u64::MAX,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: vec![Sge {
            lkey: local,
            addr: 0x8000 + pattern.len() as u64,
            len: 8,
        }],
        signaled: true,
        fence: false,
    };
    i.conn.post_send(read).unwrap();
    i.conn.post_send(send).unwrap();
    let later = now + Duration::from_millis(150);
    i.conn.handle_timeout(later);
    let (mut done, mut got) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let ab = transmit(&mut i, None);
        let ba = transmit(&mut r, None);
        r.conn.handle_input(later, &ab, &mut r.res).unwrap();
        i.conn.handle_input(later, &ba, &mut i.res).unwrap();
        done.extend(std::iter::from_fn(|| i.conn.poll_completion()));
        got.extend(std::iter::from_fn(|| r.conn.poll_completion()));
        if ab.is_empty() && ba.is_empty() && done.len() == 2 {
            break;
        }
    }
    let seen: Vec<_> = done.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
    let ok = crate::verbs::CompletionStatus::Success;
    assert_eq!(
        seen,
        vec![
            (u64::MAX, WcOpcode::Read, ok),
            (u64::MAX, WcOpcode::Send, ok)
        ],
        "the ULP's WRs complete, the RTR's completion does not show"
    );
    assert_eq!(got.len(), 1, "the responder's receive completed");
    assert_eq!((got[0].wr_id, got[0].byte_len), (u64::MAX, 8));
    let mut placed = vec![0u8; pattern.len()];
    i.res
        .stags
        .region(local)
        .unwrap()
        .memory()
        .read_into(0, &mut placed);
    assert_eq!(placed, pattern, "the Read brought the peer's bytes");
    assert!(
        i.res.stags.region(sink).is_none(),
        "the RTR's sink was given back"
    );
}
