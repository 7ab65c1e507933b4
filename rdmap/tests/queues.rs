//! Queue behaviour: flush-in-error, ORD and IRD limits, Read Response ordering and
//! class separation, fences, SRQs, local errors, caller framing errors, closing.

mod common;
use common::*;
use xwarp_ddp::segment::SegmentHeader;
use xwarp_rdmap::wire::{parse_ctrl, Opcode};
use xwarp_rdmap::*;

fn read_wr(wr_id: u64, sink: Stag, sink_to: u64, src: Stag, src_to: u64, len: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Read {
            remote_stag: src,
            remote_to: src_to,
        },
        sgl: vec![Sge {
            lkey: sink,
            addr: sink_to,
            len,
        }],
        signaled: true,
        fence: false,
    }
}

fn pair(a_ord: u32, b_ird: u32) -> (Side, Side, Stag, Stag, Stag) {
    let mut a = Side::new(4, a_ord, 8);
    let mut b = Side::new(b_ird, 4, 8);
    let a_buf = a.reg(0x1000, 4096, 0, Access::LOCAL_WRITE);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let b_src = b.reg_data(0x8000, &data, Access::REMOTE_READ);
    let b_recv = b.reg(0x2000, 4096, 0, Access::LOCAL_WRITE);
    (a, b, a_buf, b_src, b_recv)
}

fn opcode_of(seg: &[u8]) -> Opcode {
    parse_ctrl(seg[1]).unwrap()
}

#[test]
fn rfc5040_ord_limits_outstanding_reads() {
    let (mut a, mut b, a_buf, b_src, b_recv) = pair(2, 4);
    for i in 0..3 {
        a.qp.post_send(read_wr(
            i,
            a_buf,
            0x1000 + i * 16,
            b_src,
            0x8000 + i * 16,
            16,
        ))
        .unwrap();
    }
    b.recv(50, b_recv, 0x2000, 64);
    a.qp.post_send(send_wr(9, a_buf, 0x1000, 4)).unwrap();
    let segs = a.drain_segments(1500);
    assert_eq!(
        segs.len(),
        2,
        "ORD 2: the third Read and the Send behind it wait"
    );
    assert!(segs.iter().all(|s| opcode_of(s) == Opcode::ReadRequest));
    for s in &segs {
        b.deliver(s);
    }
    // One Read Response back frees one ORD slot.
    let resp = b.next_segment(1500).unwrap();
    a.deliver(&resp);
    assert_eq!(a.completions(), vec![ok(0, WcOpcode::Read, 16)]);
    let segs = a.drain_segments(1500);
    assert_eq!(segs.len(), 2);
    assert_eq!(opcode_of(&segs[0]), Opcode::ReadRequest);
    assert_eq!(
        &segs[0][10..14],
        &3u32.to_be_bytes(),
        "third Read Request MSN 3"
    );
    assert_eq!(opcode_of(&segs[1]), Opcode::Send);
    for s in &segs {
        b.deliver(s);
    }
    pump(&mut a, &mut b, 1500);
    let mut c = a.completions();
    c.sort_by_key(|c| c.wr_id);
    assert_eq!(
        c,
        vec![
            ok(1, WcOpcode::Read, 16),
            ok(2, WcOpcode::Read, 16),
            ok(9, WcOpcode::Send, 4)
        ]
    );
    assert_eq!(&a.mem(a_buf)[..48], &b.mem(b_src)[..48]);
}

#[test]
fn rfc5040_ird_limit_terminates_the_excess_read() {
    // Our ORD 3 against a peer IRD 2: the third Read Request exceeds the peer's IRD.
    let (mut a, mut b, a_buf, b_src, _) = pair(3, 2);
    for i in 0..3 {
        a.qp.post_send(read_wr(i, a_buf, 0x1000, b_src, 0x8000, 8))
            .unwrap();
    }
    let segs = a.drain_segments(1500);
    assert_eq!(segs.len(), 3);
    b.deliver(&segs[0]);
    b.deliver(&segs[1]);
    assert_eq!(b.qp.state(), QpState::Rts);
    b.deliver(&segs[2]);
    assert_eq!(b.qp.state(), QpState::Terminate);
    // The Terminate comes out at once: queued Read Responses are abandoned.
    let t = b.next_segment(1500).unwrap();
    assert_eq!(opcode_of(&t), Opcode::Terminate);
    assert_eq!(&t[18..22], &[0x02, 0x07, 0xe0, 0x00]);
    assert_eq!(b.next_segment(1500), None);
    a.deliver(&t);
    assert_eq!(a.qp.state(), QpState::Error);
    let c = a.completions();
    assert_eq!(c.len(), 3);
    assert!(c.iter().all(|c| c.status == CompletionStatus::WrFlushError));
}

#[test]
fn rfc5040_read_responses_in_request_order_and_classes_never_interleave() {
    let (mut a, mut b, a_buf, b_src, _) = pair(4, 4);
    let a_recv = a.reg(0x9000, 4096, 0, Access::LOCAL_WRITE);
    let a_wsink = a.reg(0x4_0000, 4096, 0, Access::REMOTE_WRITE);
    let sizes = [300u32, 0, 1000, 77];
    let mut to = 0x1000;
    for (i, &s) in sizes.iter().enumerate() {
        a.qp.post_send(read_wr(
            i as u64,
            a_buf,
            to,
            b_src,
            0x8000 + 100 * i as u64,
            s,
        ))
        .unwrap();
        to += u64::from(s);
    }
    for s in a.drain_segments(1500) {
        b.deliver(&s);
    }
    // B also has its own Send and Write queued while the Read Responses wait.
    a.recv(70, a_recv, 0x9000, 4096);
    let b_src_lkey = b.reg(0x7_0000, 2000, 3, Access::NONE);
    b.qp.post_send(send_wr(80, b_src_lkey, 0x7_0000, 2000))
        .unwrap();
    b.qp.post_send(SendWr {
        wr_id: 81,
        op: SendOp::Write {
            remote_stag: a_wsink,
            remote_to: 0x4_0000,
        },
        sgl: vec![Sge {
            lkey: b_src_lkey,
            addr: 0x7_0000,
            len: 500,
        }],
        signaled: false,
        fence: false,
    })
    .unwrap();
    let segs = b.drain_segments(200);
    // Check the class rule and Response order on the wire.
    let (mut open_tagged, mut open_untagged) = (None::<Opcode>, None::<u32>);
    let mut resp_tos = Vec::new();
    for s in &segs {
        let h = SegmentHeader::parse(s).unwrap();
        let op = opcode_of(s);
        match h {
            SegmentHeader::Tagged(t) => {
                if let Some(o) = open_tagged {
                    assert_eq!(o, op, "tagged messages interleaved");
                }
                open_tagged = (!t.last).then_some(op);
                if op == Opcode::ReadResponse {
                    resp_tos.push((t.to, s.len() - 14));
                }
            }
            SegmentHeader::Untagged(u) => {
                if let Some(m) = open_untagged {
                    assert_eq!(m, u.msn, "untagged messages interleaved");
                }
                open_untagged = (!u.last).then_some(u.msn);
            }
        }
    }
    // Responses are contiguous from 0x1000 in request order.
    let mut expect_to = 0x1000u64;
    for (to, len) in resp_tos {
        assert_eq!(to, expect_to);
        expect_to += len as u64;
    }
    assert_eq!(expect_to, 0x1000 + 1377);
    for s in &segs {
        a.deliver(s);
    }
    assert_eq!(a.qp.state(), QpState::Rts, "{:?}", a.events());
    let c = a.completions();
    let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    assert_eq!(
        ids.iter().filter(|&&i| i < 4).copied().collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert!(c.contains(&ok(70, WcOpcode::Recv, 2000)));
    assert_eq!(&a.mem(a_buf)[..300], &b.mem(b_src)[..300]);
    assert_eq!(&a.mem(a_buf)[300..1300], &b.mem(b_src)[200..1200]);
    assert_eq!(&a.mem(a_buf)[1300..1377], &b.mem(b_src)[300..377]);
    assert_eq!(
        &a.mem(a_wsink)[..501],
        &[&[3u8; 500][..], &[0]].concat()[..]
    );
    assert_eq!(&a.mem(a_recv)[..2000], &[3u8; 2000][..]);
    assert_eq!(
        b.completions(),
        vec![ok(80, WcOpcode::Send, 2000)],
        "81 unsignaled"
    );
}

#[test]
fn rfc5040_fence_waits_for_outstanding_reads() {
    let (mut a, mut b, a_buf, b_src, b_recv) = pair(4, 4);
    a.qp.post_send(read_wr(1, a_buf, 0x1000, b_src, 0x8000, 32))
        .unwrap();
    let mut fenced = send_wr(2, a_buf, 0x1000, 32);
    fenced.fence = true;
    a.qp.post_send(fenced).unwrap();
    b.recv(5, b_recv, 0x2000, 64);
    let segs = a.drain_segments(1500);
    assert_eq!(segs.len(), 1, "fenced Send waits for the Read");
    b.deliver(&segs[0]);
    a.deliver(&b.next_segment(1500).unwrap());
    let send = a.next_segment(1500).unwrap();
    b.deliver(&send);
    // The fenced Send carried the data the Read fetched.
    assert_eq!(&b.mem(b_recv)[..32], &b.mem(b_src)[..32]);
    assert_eq!(b.completions(), vec![ok(5, WcOpcode::Recv, 32)]);
}

#[test]
fn verbs_flush_in_error_completes_everything() {
    let (mut a, mut b, a_buf, b_src, _) = pair(1, 4);
    a.recv(100, a_buf, 0x1000, 16);
    a.recv(101, a_buf, 0x1000, 16);
    a.qp.post_send(read_wr(1, a_buf, 0x1000, b_src, 0x8000, 16))
        .unwrap();
    a.qp.post_send(send_wr(2, a_buf, 0x1000, 3000)).unwrap();
    a.qp.post_send(read_wr(3, a_buf, 0x1000, b_src, 0x8000, 16))
        .unwrap();
    a.qp.post_send(send_wr(4, a_buf, 0x1000, 4)).unwrap();
    let rr = a.next_segment(1500).unwrap();
    b.deliver(&rr);
    // Send 2 is in flight (first of three segments handed out): ORD 1 blocks read 3.
    a.deliver(&b.next_segment(1500).unwrap());
    assert!(a.next_segment(1500).is_some());
    a.qp.modify_to_error();
    assert_eq!(a.qp.state(), QpState::Error);
    let got: Vec<_> = a
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    use CompletionStatus::*;
    assert_eq!(
        got,
        vec![
            (1, Success),
            (2, WrFlushError),
            (3, WrFlushError),
            (4, WrFlushError),
            (100, WrFlushError),
            (101, WrFlushError)
        ]
    );
    // Posting in ERROR completes at once with a flush.
    a.qp.post_send(send_wr(7, a_buf, 0x1000, 1)).unwrap();
    a.recv(8, a_buf, 0x1000, 1);
    let got: Vec<_> = a
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode))
        .collect();
    assert_eq!(
        got,
        vec![
            (7, WrFlushError, WcOpcode::Send),
            (8, WrFlushError, WcOpcode::Recv)
        ]
    );
    assert_eq!(a.next_segment(1500), None);
}

#[test]
fn llp_close_flushes() {
    let (mut a, _b, a_buf, _, _) = pair(1, 1);
    a.recv(1, a_buf, 0x1000, 16);
    a.qp.on_llp_closed();
    assert_eq!(a.qp.state(), QpState::Error);
    assert_eq!(a.completions()[0].status, CompletionStatus::WrFlushError);
}

#[test]
fn srq_shared_by_two_qps() {
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    let srq = res.create_srq(4);
    let buf = res
        .stags
        .register(pd, Access::LOCAL_WRITE, 0, Box::new(vec![0u8; 64]))
        .unwrap();
    let cfg = QpConfig {
        pd,
        ird: 1,
        ord: 1,
        sq_depth: 4,
        rq: RqConfig::Shared(srq),
    };
    let mut q1 = QueuePair::new(cfg);
    let mut q2 = QueuePair::new(cfg);
    q1.set_rts().unwrap();
    q2.set_rts().unwrap();
    for (i, addr) in [(1u64, 0u64), (2, 32)] {
        res.post_srq_recv(
            srq,
            RecvWr {
                wr_id: i,
                sgl: vec![Sge {
                    lkey: buf,
                    addr,
                    len: 32,
                }],
            },
        )
        .unwrap();
    }
    assert_eq!(
        q1.post_recv(RecvWr {
            wr_id: 9,
            sgl: vec![]
        }),
        Err(PostError::InvalidState),
        "an SRQ QP has no own RQ"
    );
    let send = |msn: u8, data: &[u8]| {
        let mut v = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, msn, 0, 0, 0, 0];
        v.extend_from_slice(data);
        v
    };
    q1.on_segment(&mut res, &send(1, b"one")).unwrap();
    q2.on_segment(&mut res, &send(1, b"two")).unwrap();
    assert_eq!(q1.poll_completion(), Some(ok(1, WcOpcode::Recv, 3)));
    assert_eq!(q2.poll_completion(), Some(ok(2, WcOpcode::Recv, 3)));
    let m = res.stags.read(buf, 0, 64).unwrap();
    assert_eq!((&m[..3], &m[32..35]), (&b"one"[..], &b"two"[..]));
    // SRQ empty: the next Send has no buffer.
    q1.on_segment(&mut res, &send(2, b"x")).unwrap();
    assert_eq!(q1.state(), QpState::Terminate);
}

#[test]
fn local_protection_error_on_send() {
    let (mut a, _b, a_buf, _, _) = pair(1, 1);
    a.qp.post_send(send_wr(1, Stag(0x999), 0, 4)).unwrap();
    a.qp.post_send(send_wr(2, a_buf, 0x1000, 4)).unwrap();
    // RDMAP / local catastrophic / unspecified, no attachments.
    assert_eq!(
        a.next_segment(1500).unwrap(),
        term_segment(&[0x00, 0xff, 0x00, 0x00])
    );
    let got: Vec<_> = a
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, CompletionStatus::LocalProtectionError),
            (2, CompletionStatus::WrFlushError)
        ]
    );
    // Read sink without Local Write is a local protection error too.
    let (mut a, _b, _, _, _) = pair(1, 1);
    let ro = a.reg(0x5000, 16, 0, Access::REMOTE_READ);
    a.qp.post_send(read_wr(3, ro, 0x5000, Stag(0x101), 0, 16))
        .unwrap();
    assert_eq!(
        a.next_segment(1500).unwrap(),
        term_segment(&[0x00, 0xff, 0x00, 0x00])
    );
    assert_eq!(
        a.completions()[0].status,
        CompletionStatus::LocalProtectionError
    );
}

#[test]
fn caller_errors_are_errors_not_panics() {
    let (mut a, _b, a_buf, _, _) = pair(1, 1);
    assert_eq!(
        a.qp.poll_segment(&a.res, MIN_MULPDU - 1, |_, _| ()),
        Err(QpError::MulpduTooSmall)
    );
    let mut bad = read_wr(1, a_buf, 0x1000, Stag(1), 0, 1);
    bad.sgl.push(bad.sgl[0]);
    assert_eq!(a.qp.post_send(bad), Err(PostError::InvalidSgl));
    assert_eq!(a.qp.on_payload(&mut a.res, b"x"), Err(QpError::Framing));
    assert_eq!(a.qp.on_end(&mut a.res), Err(QpError::Framing));
    let hdr = [0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(
        a.qp.on_header_bytes(&mut a.res, &hdr, 13),
        Err(QpError::Framing)
    );
    assert_eq!(
        a.qp.on_header_bytes(&mut a.res, &hdr[..10], 14),
        Err(QpError::Framing)
    );
    a.qp.on_header_bytes(&mut a.res, &hdr, 15).unwrap();
    assert_eq!(
        a.qp.on_header_bytes(&mut a.res, &hdr, 15),
        Err(QpError::Framing)
    );
    assert_eq!(a.qp.on_payload(&mut a.res, b"xy"), Err(QpError::Framing));
    assert_eq!(
        a.qp.on_end(&mut a.res),
        Err(QpError::Framing),
        "1 byte missing"
    );
    assert_eq!(a.qp.on_segment(&mut a.res, &[]), Err(QpError::Framing));
    // sq_depth 64.
    let (mut a, _b, a_buf, _, _) = pair(1, 1);
    for _ in 0..64 {
        a.qp.post_send(send_wr(0, a_buf, 0x1000, 0)).unwrap();
    }
    assert_eq!(
        a.qp.post_send(send_wr(0, a_buf, 0x1000, 0)),
        Err(PostError::QueueFull)
    );
}

#[test]
fn closing_drains_then_rejects_new_work() {
    let (mut a, mut b, a_buf, _, b_recv) = pair(1, 1);
    b.recv(1, b_recv, 0x2000, 4096);
    a.qp.post_send(send_wr(1, a_buf, 0x1000, 3000)).unwrap();
    a.qp.close().unwrap();
    assert_eq!(
        a.qp.post_send(send_wr(2, a_buf, 0x1000, 1)),
        Err(PostError::InvalidState)
    );
    assert!(!a.qp.is_drained());
    pump(&mut a, &mut b, 1500);
    assert!(a.qp.is_drained());
    assert_eq!(a.qp.state(), QpState::Closing);
    assert_eq!(b.completions(), vec![ok(1, WcOpcode::Recv, 3000)]);
}

#[test]
fn idle_qp_sends_nothing_until_rts() {
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    let buf = res
        .stags
        .register(pd, Access::NONE, 0, Box::new(vec![1u8; 8]))
        .unwrap();
    let mut q = QueuePair::new(QpConfig {
        pd,
        ird: 1,
        ord: 1,
        sq_depth: 4,
        rq: RqConfig::Own(4),
    });
    q.post_send(send_wr(1, buf, 0, 8)).unwrap();
    assert_eq!(q.poll_segment(&res, 1500, |h, _| h.to_vec()), Ok(None));
    q.set_rts().unwrap();
    assert!(q
        .poll_segment(&res, 1500, |h, _| h.to_vec())
        .unwrap()
        .is_some());
    assert_eq!(q.set_rts(), Err(QpError::InvalidState));
}

#[test]
fn rfc5041_tx_msn_per_queue_starts_at_one_and_mo_to_are_contiguous() {
    let (mut a, _b, a_buf, _, _) = pair(4, 4);
    a.qp.post_send(send_wr(1, a_buf, 0x1000, 200)).unwrap();
    a.qp.post_send(read_wr(2, a_buf, 0x1000, Stag(0x55), 0x10, 8))
        .unwrap();
    a.qp.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Write {
            remote_stag: Stag(0x66),
            remote_to: 0xffff_fff0,
        },
        sgl: vec![Sge {
            lkey: a_buf,
            addr: 0x1000,
            len: 130,
        }],
        signaled: true,
        fence: false,
    })
    .unwrap();
    a.qp.post_send(send_wr(4, a_buf, 0x1000, 0)).unwrap();
    let segs = a.drain_segments(MIN_MULPDU);
    let hdrs: Vec<SegmentHeader> = segs
        .iter()
        .map(|s| SegmentHeader::parse(s).unwrap())
        .collect();
    let mut want = Vec::new();
    // Send: 200 bytes in 52-byte chunks, MSN 1, MO 0, 52, 104, 156.
    for (mo, last) in [(0, false), (52, false), (104, false), (156, true)] {
        want.push(format!("U qn0 msn1 mo{mo} L{last}"));
    }
    want.push("U qn1 msn1 mo0 Ltrue".to_string());
    // Write: 130 bytes in 56-byte chunks, TO contiguous across the 32-bit boundary.
    for (to, last) in [
        (0xffff_fff0u64, false),
        (0x1_0000_0028, false),
        (0x1_0000_0060, true),
    ] {
        want.push(format!("T stag66 to{to:x} L{last}"));
    }
    want.push("U qn0 msn2 mo0 Ltrue".to_string());
    let got: Vec<String> = hdrs
        .iter()
        .map(|h| match h {
            SegmentHeader::Untagged(u) => {
                format!("U qn{} msn{} mo{} L{}", u.qn, u.msn, u.mo, u.last)
            }
            SegmentHeader::Tagged(t) => format!("T stag{:x} to{:x} L{}", t.stag, t.to, t.last),
        })
        .collect();
    assert_eq!(got, want);
    assert!(segs.iter().all(|s| s.len() <= MIN_MULPDU));
    // Send 1 completes locally when its last segment is handed out; 3 and 4 are done
    // too but their completions wait behind the open Read (verbs: SQ completions in
    // posting order).
    let ids: Vec<u64> = a.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![1]);
    let mut resp = vec![0xc1, 0x42];
    resp.extend_from_slice(&a_buf.0.to_be_bytes());
    resp.extend_from_slice(&0x1000u64.to_be_bytes());
    resp.extend_from_slice(b"12345678");
    a.deliver(&resp);
    let ids: Vec<u64> = a.completions().iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![2, 3, 4]);
}

#[test]
fn rfc5040_zero_length_read_gets_one_empty_response() {
    let (mut a, mut b, a_buf, b_src, _) = pair(1, 1);
    a.qp.post_send(read_wr(1, a_buf, 0x1000, b_src, 0x8000, 0))
        .unwrap();
    b.deliver(&a.next_segment(1500).unwrap());
    let r = b.next_segment(1500).unwrap();
    assert_eq!(r.len(), 14);
    assert_eq!(&r[..2], &[0xc1, 0x42]);
    a.deliver(&r);
    assert_eq!(a.completions(), vec![ok(1, WcOpcode::Read, 0)]);
}
