//! Hostile peers against the memory model (issue 14): payload of one FPDU that keeps
//! arriving after its target region was invalidated, deregistered, re-registered or
//! revalidated; Send with Invalidate aimed at STags a peer may not revoke; receives a
//! completion cannot report. Every test checks the Terminate we send and, through an
//! oracle over several PDs and no-access regions, that no byte outside what the peer
//! may touch changed.

mod common;
use common::*;
use xwarp_rdmap::wire;
use xwarp_rdmap::*;

const W_BASE: u64 = 0x10_0000;
const W_LEN: usize = 64 * 1024;

fn tagged(ddp: u8, rdmap: u8, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![ddp, rdmap];
    v.extend_from_slice(&stag.to_be_bytes());
    v.extend_from_slice(&to.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn untagged(ddp: u8, rdmap: u8, inval: u32, qn: u32, msn: u32, mo: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![ddp, rdmap];
    for x in [inval, qn, msn, mo] {
        v.extend_from_slice(&x.to_be_bytes());
    }
    v.extend_from_slice(payload);
    v
}

/// Terminate body with M+D: control, DDP segment length, offending DDP header.
fn md(ctrl: [u8; 2], seg: &[u8]) -> Vec<u8> {
    let hlen = xwarp_ddp::segment::header_len(seg[0]);
    let mut v = vec![ctrl[0], ctrl[1], 0xc0, 0x00];
    v.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    v.extend_from_slice(&seg[..hlen]);
    v
}

/// The receiver: an OS-seeded (random) STag table, the QP's PD plus two others, and
/// regions of every kind around the Write target.
struct Target {
    b: Side,
    /// The Write sink: 64 KiB, Remote Write, in the QP's PD.
    w: Stag,
    /// Receive buffer (Local Write), one receive posted on it.
    rbuf: Stag,
    other_pds: [PdId; 2],
}

fn target() -> Target {
    let mut b = Side::new(1, 1, 4);
    // Swap in a random table (Side uses a predictable one for byte-exact tests).
    b.res = Resources::new();
    let pd = b.res.stags.alloc_pd();
    assert_eq!(pd, b.pd);
    let other_pds = [b.res.stags.alloc_pd(), b.res.stags.alloc_pd()];
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // Neighbours first, so some sit next to the target in any index order.
    b.reg(W_BASE, 4096, 0x11, Access::NONE);
    b.reg(W_BASE, 4096, 0x12, Access::REMOTE_READ);
    let w = b.reg(W_BASE, W_LEN, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let rbuf = b.reg(0x3000, 64, 0, Access::LOCAL_WRITE);
    for (i, &p) in other_pds.iter().enumerate() {
        for acc in [Access::NONE, all] {
            b.res
                .stags
                .register(p, acc, W_BASE, Box::new(vec![0x20 + i as u8; 4096]))
                .unwrap();
        }
    }
    b.recv(1, rbuf, 0x3000, 64);
    Target {
        b,
        w,
        rbuf,
        other_pds,
    }
}

/// Every region's bytes, by STag.
fn snapshot(res: &Resources) -> Vec<(Stag, Vec<u8>)> {
    let mut v: Vec<_> = res
        .stags
        .iter()
        .map(|(s, r)| (s, r.memory().read_at(0, r.len()).to_vec()))
        .collect();
    v.sort_by_key(|(s, _)| *s);
    v
}

/// Oracle: every region that existed in `before` and still exists is unchanged, except
/// `allowed` (STag and byte range) which must equal `expect` there.
fn assert_only(before: &[(Stag, Vec<u8>)], res: &Resources, allowed: Option<(Stag, usize, &[u8])>) {
    for (s, old) in before {
        let Some(r) = res.stags.region(*s) else {
            continue;
        };
        let now = r.memory().read_at(0, r.len());
        match allowed {
            Some((a, at, bytes)) if a == *s => {
                assert_eq!(&now[..at], &old[..at], "bytes before the Write changed");
                assert_eq!(&now[at..at + bytes.len()], bytes, "the admitted bytes");
                let end = at + bytes.len();
                assert_eq!(
                    &now[end..],
                    &old[end..],
                    "bytes landed after the target went away"
                );
            }
            _ => assert_eq!(now, &old[..], "region {s:?} changed"),
        }
    }
}

/// Terminate handed out, QP in ERROR.
fn expect_term(b: &mut Side, body: &[u8]) {
    assert_eq!(b.qp.state(), QpState::Terminate);
    assert!(b
        .events()
        .iter()
        .any(|e| matches!(e, QpEvent::TerminateQueued(_))));
    assert_eq!(b.next_segment(1500).unwrap(), term_segment(body));
    assert_eq!(b.qp.state(), QpState::Error);
}

/// A 60,000-byte Write to the target: header and 16 bytes, then `between` runs (the
/// application's commands between two TCP chunks of one FPDU), then the rest.
fn write_then(between: impl FnOnce(&mut Target)) {
    let mut t = target();
    let payload: Vec<u8> = (0..60_000u32).map(|x| (x % 251) as u8 + 1).collect();
    let to = W_BASE + 0x100;
    let seg = tagged(0xc1, 0x40, t.w.0, to, &payload);
    let before = snapshot(&t.b.res);
    let hlen = xwarp_ddp::segment::header_len(seg[0]);
    t.b.qp
        .on_header_bytes(&mut t.b.res, &seg[..hlen], seg.len())
        .unwrap();
    t.b.qp.on_payload(&mut t.b.res, &payload[..16]).unwrap();
    between(&mut t);
    for c in payload[16..].chunks(1448) {
        t.b.qp.on_payload(&mut t.b.res, c).unwrap();
    }
    t.b.qp.on_end(&mut t.b.res).unwrap();
    // RFC 5041 §7.2: tagged buffer error, invalid STag (DDP layer 1, etype 1, code 0).
    expect_term(&mut t.b, &md([0x11, 0x00], &seg));
    // Only the 16 bytes admitted before the target went away landed, if it still exists.
    assert_only(&before, &t.b.res, Some((t.w, 0x100, &payload[..16])));
}

#[test]
fn hostile_mid_fpdu_local_invalidate_places_nothing_more() {
    write_then(|t| t.b.res.stags.invalidate(t.w, t.b.pd).unwrap());
}

#[test]
fn hostile_mid_fpdu_invalidate_then_revalidate_places_nothing_more() {
    // The same STag value, usable again: still not the registration the FPDU was
    // admitted to.
    write_then(|t| {
        t.b.res.stags.invalidate(t.w, t.b.pd).unwrap();
        t.b.res.stags.revalidate(t.w).unwrap();
    });
}

#[test]
fn hostile_mid_fpdu_deregister_places_nothing_more() {
    write_then(|t| {
        t.b.res.stags.deregister(t.w).unwrap();
    });
}

#[test]
fn hostile_mid_fpdu_reregister_256_times_places_nothing_more() {
    // The old LIFO free list with an 8-bit key handed the target's STag to the 256th
    // re-registration of its slot, in any PD with any access.
    write_then(|t| {
        let pds = [t.b.pd, t.other_pds[0], t.other_pds[1]];
        let mut cur = t.w;
        // 256: with the old allocator the last one got the target's STag back, in the
        // QP's PD with Remote Write; the ones before cycle through PDs and access.
        for i in 0..256usize {
            t.b.res.stags.deregister(cur).unwrap();
            let acc = [Access::NONE, Access::LOCAL_WRITE | Access::REMOTE_WRITE][i % 2];
            cur =
                t.b.res
                    .stags
                    .register(pds[i % 3], acc, W_BASE, Box::new(vec![0u8; W_LEN]))
                    .unwrap();
        }
    });
}

#[test]
fn hostile_mid_fpdu_send_with_invalidate_from_another_qp() {
    // A second QP of the same PD revokes the target (allowed: it is a remote-access
    // region of that PD) while the first QP's FPDU is half placed.
    write_then(|t| {
        let mut q2 = QueuePair::new(QpConfig {
            pd: t.b.pd,
            ird: 1,
            ord: 1,
            sq_depth: 4,
            rq: RqConfig::Own(1),
        });
        q2.set_rts().unwrap();
        q2.post_recv(RecvWr {
            wr_id: 9,
            sgl: Vec::new(),
        })
        .unwrap();
        q2.on_segment(&mut t.b.res, &untagged(0x41, 0x46, t.w.0, 0, 1, 0, &[]))
            .unwrap();
        let c = q2.poll_completion().unwrap();
        assert_eq!(c.invalidated_stag, Some(t.w));
    });
}

#[test]
fn hostile_second_segment_after_reregistration_is_refused() {
    // A multi-segment Write: the region is revalidated (same STag value) between its
    // segments; the second segment is refused at its header.
    let mut t = target();
    let before = snapshot(&t.b.res);
    t.b.deliver(&tagged(0x81, 0x40, t.w.0, W_BASE, &[7; 8]));
    t.b.res.stags.invalidate(t.w, t.b.pd).unwrap();
    t.b.res.stags.revalidate(t.w).unwrap();
    let seg = tagged(0xc1, 0x40, t.w.0, W_BASE + 8, &[8; 8]);
    t.b.deliver(&seg);
    expect_term(&mut t.b, &md([0x11, 0x00], &seg));
    assert_only(&before, &t.b.res, Some((t.w, 0, &[7; 8])));
}

/// Send with Invalidate of `victim`: refused with RDMAP / remote operation / STag
/// cannot be invalidated; the receive is flushed and the victim stays valid.
fn refused_invalidate(t: &mut Target, victim: Stag) {
    let before = snapshot(&t.b.res);
    let seg = untagged(0x41, 0x46, victim.0, 0, 1, 0, b"kill");
    t.b.deliver(&seg);
    expect_term(&mut t.b, &md([0x02, 0x09], &seg));
    let c = t.b.completions();
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].invalidated_stag),
        (1, CompletionStatus::WrFlushError, None)
    );
    assert!(t.b.res.stags.region(victim).unwrap().valid);
    // The Send's bytes landed in the posted receive only.
    let mut expect = before.clone();
    for (s, m) in expect.iter_mut() {
        if *s == t.rbuf {
            m[..4].copy_from_slice(b"kill");
        }
    }
    assert_only(&expect, &t.b.res, None);
}

#[test]
fn rfc5040_remote_invalidate_of_inline_buffer_refused() {
    // The verbs engine's per-QP inline buffer: Local Write, in the QP's PD.
    let mut t = target();
    let inline = t.b.reg(0, 4096, 0, Access::LOCAL_WRITE);
    refused_invalidate(&mut t, inline);
}

#[test]
fn rfc5040_remote_invalidate_of_read_rtr_sink_refused() {
    // The Read-RTR sink the connection registers: empty, Local Write.
    let mut t = target();
    let pd = t.b.pd;
    let sink =
        t.b.res
            .stags
            .register(pd, Access::LOCAL_WRITE, 0, Box::new(Vec::<u8>::new()))
            .unwrap();
    refused_invalidate(&mut t, sink);
}

#[test]
fn rfc5040_remote_invalidate_of_local_only_keys_refused() {
    let mut t = target();
    let none = t.b.reg(0x8000, 16, 3, Access::NONE);
    refused_invalidate(&mut t, none);
    let mut t = target();
    let rbuf = t.rbuf;
    refused_invalidate(&mut t, rbuf);
}

#[test]
fn rfc5040_remote_invalidate_of_internal_stag_refused() {
    let mut t = target();
    let pd = t.b.pd;
    let internal =
        t.b.res
            .stags
            .register_internal(
                pd,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                0,
                Box::new(vec![0u8; 16]),
            )
            .unwrap();
    refused_invalidate(&mut t, internal);
}

#[test]
fn rfc5040_remote_invalidate_of_remote_region_allowed() {
    let mut t = target();
    t.b.deliver(&untagged(0x41, 0x46, t.w.0, 0, 1, 0, b"ok"));
    let c = t.b.completions();
    assert_eq!(
        (c[0].status, c[0].invalidated_stag),
        (CompletionStatus::Success, Some(t.w))
    );
    assert!(!t.b.res.stags.region(t.w).unwrap().valid);
    assert_eq!(t.b.qp.state(), QpState::Rts);
}

#[test]
fn hostile_receive_longer_than_u32_refused_at_post() {
    let mut b = Side::new(1, 1, 4);
    let s = b.reg(0, 16, 0, Access::LOCAL_WRITE);
    let half = Sge {
        lkey: s,
        addr: 0,
        len: 0x8000_0000,
    };
    let over = RecvWr {
        wr_id: 1,
        sgl: vec![half, half],
    };
    assert_eq!(b.qp.post_recv(over.clone()), Err(PostError::InvalidSgl));
    let srq = b.res.create_srq(4);
    assert_eq!(b.res.post_srq_recv(srq, over), Err(PostError::InvalidSgl));
    // Exactly what a completion can report is fine.
    let max = RecvWr {
        wr_id: 2,
        sgl: vec![
            half,
            Sge {
                len: 0x7fff_ffff,
                ..half
            },
        ],
    };
    assert_eq!(b.qp.post_recv(max.clone()), Ok(()));
    assert_eq!(b.res.post_srq_recv(srq, max), Ok(()));
}

fn read_request(src_stag: u32, src_to: u64, size: u32) -> Vec<u8> {
    let rr = wire::ReadRequest {
        sink_stag: 0xabc01,
        sink_to: 0x9_0000,
        size,
        src_stag,
        src_to,
    };
    untagged(0x41, 0x41, 0, 1, 1, 0, &rr.to_bytes())
}

#[test]
fn hostile_read_response_only_from_the_accepted_registration() {
    // A Read Request is accepted against a Remote Read region; the application then
    // invalidates and revalidates it (same STag value). Nothing of it leaves: the
    // Terminate is RDMAP remote protection / invalid STag with the Read Request.
    let mut t = target();
    let src = t.b.reg(0x7000, 256, 0x5a, Access::REMOTE_READ);
    let seg = read_request(src.0, 0x7000, 256);
    t.b.deliver(&seg);
    assert_eq!(t.b.qp.state(), QpState::Rts);
    t.b.res.stags.invalidate(src, t.b.pd).unwrap();
    t.b.res.stags.revalidate(src).unwrap();
    let mut body = vec![0x01, 0x00, 0xe0, 0x00, 0x00, 46];
    body.extend_from_slice(&seg);
    // The first thing handed out is the Terminate: no Read Response segment.
    assert_eq!(t.b.next_segment(1500).unwrap(), term_segment(&body));
    assert_eq!(t.b.qp.state(), QpState::Error);
    assert_eq!(t.b.next_segment(1500), None, "no Read Response left");
}

#[test]
fn hostile_mid_send_receive_buffer_invalidated_places_nothing_more() {
    // The receive buffer is invalidated and revalidated between two chunks of one Send:
    // the rest of the Send does not land (DDP catastrophic, receive flushed).
    let mut t = target();
    let before = snapshot(&t.b.res);
    let seg = untagged(0x41, 0x43, 0, 0, 1, 0, &[0xee; 48]);
    let hlen = xwarp_ddp::segment::header_len(seg[0]);
    t.b.qp
        .on_header_bytes(&mut t.b.res, &seg[..hlen], seg.len())
        .unwrap();
    t.b.qp.on_payload(&mut t.b.res, &[0xee; 8]).unwrap();
    t.b.res.stags.invalidate(t.rbuf, t.b.pd).unwrap();
    t.b.res.stags.revalidate(t.rbuf).unwrap();
    t.b.qp.on_payload(&mut t.b.res, &[0xee; 40]).unwrap();
    t.b.qp.on_end(&mut t.b.res).unwrap();
    expect_term(&mut t.b, &md([0x10, 0x00], &seg));
    assert_eq!(t.b.completions()[0].status, CompletionStatus::WrFlushError);
    assert_only(&before, &t.b.res, Some((t.rbuf, 0, &[0xee; 8])));
}
