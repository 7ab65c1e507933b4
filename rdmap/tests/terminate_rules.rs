//! One test per receive validation rule of RFC 5041 §7.2 / RFC 5040 §7 (docs/ddp-rdmap.md
//! §2.6, §3, docs/siw.md §4.5), each asserting the full DDP segment of the Terminate we emit.
//!
//! Receiver setup (STags are deterministic: index<<8 | key, key 1 on first use):
//! * 0x101: 64 bytes at TO 0x1000, LOCAL_WRITE | REMOTE_WRITE (write sink)
//! * 0x201: 64 bytes at TO 0x2000, REMOTE_READ (read source)
//! * 0x301: 16 bytes at TO 0x3000, LOCAL_WRITE (receive buffer), one receive posted
//! * 0x401: 16 bytes at TO 0x4000 in another PD, all rights

mod common;
use common::*;
use xwarp_ddp::segment::{DdpError, UntaggedErrorCode};
use xwarp_rdmap::wire::{LlpErrorCode, TerminateCause, TerminateLayout};
use xwarp_rdmap::*;

fn tagged(ddp: u8, rdmap: u8, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![ddp, rdmap];
    v.extend_from_slice(&stag.to_be_bytes());
    v.extend_from_slice(&to.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

#[allow(clippy::too_many_arguments)]
fn untagged(ddp: u8, rdmap: u8, inval: u32, qn: u32, msn: u32, mo: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![ddp, rdmap];
    for x in [inval, qn, msn, mo] {
        v.extend_from_slice(&x.to_be_bytes());
    }
    v.extend_from_slice(payload);
    v
}

fn setup(ird: u32) -> Side {
    let mut b = Side::new(ird, 1, 4);
    assert_eq!(
        b.reg(0x1000, 64, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .0,
        0x101
    );
    assert_eq!(b.reg(0x2000, 64, 7, Access::REMOTE_READ).0, 0x201);
    assert_eq!(b.reg(0x3000, 16, 0, Access::LOCAL_WRITE).0, 0x301);
    let other = b.res.stags.alloc_pd();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let s = b
        .res
        .stags
        .register(other, all, 0x4000, Box::new(vec![0u8; 16]))
        .unwrap();
    assert_eq!(s.0, 0x401);
    b.recv(1, Stag(0x301), 0x3000, 16);
    b
}

/// Deliver `seg`, then check the QP emits exactly `Terminate(body)` and dies.
fn expect_term(b: &mut Side, seg: &[u8], body: &[u8]) {
    b.deliver(seg);
    assert_eq!(b.qp.state(), QpState::Terminate);
    assert!(matches!(b.events()[..], [QpEvent::TerminateQueued(_)]));
    assert_eq!(b.next_segment(1500).unwrap(), term_segment(body));
    assert_eq!(b.qp.state(), QpState::Error);
    assert_eq!(b.next_segment(1500), None);
    assert_eq!(b.events(), vec![QpEvent::TerminateSent]);
}

/// Terminate body with M+D: control, DDP segment length, offending DDP header.
fn md(ctrl: [u8; 2], seg: &[u8]) -> Vec<u8> {
    let hlen = xwarp_ddp::segment::header_len(seg[0]);
    let mut v = vec![ctrl[0], ctrl[1], 0xc0, 0x00];
    v.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    v.extend_from_slice(&seg[..hlen]);
    v
}

#[test]
fn rfc5041_tagged_invalid_ddp_version() {
    let mut b = setup(1);
    let seg = tagged(0xc2, 0x40, 0x101, 0x1000, &[1, 2, 3, 4]);
    #[rustfmt::skip]
    let body = [
        0x11, 0x04, 0xc0, 0x00, 0x00, 0x12,
        0xc2, 0x40, 0x00, 0x00, 0x01, 0x01, 0, 0, 0, 0, 0, 0, 0x10, 0x00,
    ];
    expect_term(&mut b, &seg, &body);
    assert_eq!(b.mem(Stag(0x101)), vec![0; 64], "nothing placed");
}

#[test]
fn rfc5041_untagged_invalid_ddp_version() {
    let mut b = setup(1);
    let seg = untagged(0x40, 0x43, 0, 0, 1, 0, b"hi");
    #[rustfmt::skip]
    let body = [
        0x12, 0x06, 0xc0, 0x00, 0x00, 0x14,
        0x40, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
    ];
    expect_term(&mut b, &seg, &body);
    // The posted receive is flushed.
    let c = b.completions();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (1, CompletionStatus::WrFlushError)
    );
}

#[test]
fn rfc5040_invalid_rdmap_version() {
    let mut b = setup(1);
    let seg = untagged(0x41, 0x83, 0, 0, 1, 0, b"hi");
    expect_term(&mut b, &seg, &md([0x02, 0x05], &seg));
}

#[test]
fn rfc5040_unexpected_opcode_reserved() {
    let mut b = setup(1);
    let seg = untagged(0x41, 0x48, 0, 0, 1, 0, &[]);
    expect_term(&mut b, &seg, &md([0x02, 0x06], &seg));
}

#[test]
fn rfc5040_untagged_opcode_on_tagged_segment() {
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x43, 0x101, 0x1000, &[1]);
    expect_term(&mut b, &seg, &md([0x02, 0x06], &seg));
}

#[test]
fn rfc5041_invalid_qn() {
    let mut b = setup(1);
    let seg = untagged(0x41, 0x43, 0, 1, 1, 0, b"x");
    expect_term(&mut b, &seg, &md([0x12, 0x01], &seg));
    let mut b = setup(1);
    let seg = untagged(0x41, 0x43, 0, 9, 1, 0, b"x");
    expect_term(&mut b, &seg, &md([0x12, 0x01], &seg));
}

#[test]
fn rfc5041_untagged_msn_starts_at_one() {
    let mut b = setup(1);
    let seg = untagged(0x41, 0x43, 0, 0, 2, 0, b"x");
    expect_term(&mut b, &seg, &md([0x12, 0x03], &seg));
    let mut b = setup(1);
    let seg = untagged(0x41, 0x41, 0, 1, 0, 0, &[0; 28]);
    expect_term(&mut b, &seg, &md([0x12, 0x03], &seg));
}

#[test]
fn rfc5041_untagged_msn_increments_per_message() {
    let mut b = setup(1);
    b.deliver(&untagged(0x41, 0x43, 0, 0, 1, 0, b"a"));
    assert_eq!(b.completions(), vec![ok(1, WcOpcode::Recv, 1)]);
    b.recv(2, Stag(0x301), 0x3000, 16);
    let seg = untagged(0x41, 0x43, 0, 0, 1, 0, b"b");
    expect_term(&mut b, &seg, &md([0x12, 0x03], &seg));
}

#[test]
fn rfc5041_invalid_mo() {
    let mut b = setup(1);
    let seg = untagged(0x41, 0x43, 0, 0, 1, 4, b"x");
    expect_term(&mut b, &seg, &md([0x12, 0x04], &seg));
    // Continuation segment with a gap.
    let mut b = setup(1);
    b.deliver(&untagged(0x01, 0x43, 0, 0, 1, 0, b"ab"));
    let seg = untagged(0x41, 0x43, 0, 0, 1, 3, b"c");
    expect_term(&mut b, &seg, &md([0x12, 0x04], &seg));
}

#[test]
fn rfc5041_no_buffer_available() {
    let mut b = Side::new(1, 1, 4);
    let seg = untagged(0x41, 0x43, 0, 0, 1, 0, b"x");
    #[rustfmt::skip]
    let body = [
        0x12, 0x02, 0xc0, 0x00, 0x00, 0x13,
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
    ];
    expect_term(&mut b, &seg, &body);
}

#[test]
fn rfc5041_message_too_long_for_buffer() {
    let mut b = setup(1);
    b.deliver(&untagged(0x01, 0x43, 0, 0, 1, 0, &[9; 10]));
    let seg = untagged(0x41, 0x43, 0, 0, 1, 10, &[9; 7]);
    b.deliver(&seg);
    let c = b.completions();
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (1, CompletionStatus::LocalLengthError)
    );
    assert_eq!(
        b.next_segment(1500).unwrap(),
        term_segment(&md([0x12, 0x05], &seg))
    );
    assert_eq!(b.qp.state(), QpState::Error);
}

#[test]
fn rfc5041_invalid_stag() {
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x40, 0x999, 0x1000, &[1]);
    expect_term(&mut b, &seg, &md([0x11, 0x00], &seg));
    // Right index, wrong key.
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x40, 0x102, 0x1000, &[1]);
    expect_term(&mut b, &seg, &md([0x11, 0x00], &seg));
}

#[test]
fn rfc5041_stag_zero_is_invalid() {
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x40, 0, 0, &[1]);
    expect_term(&mut b, &seg, &md([0x11, 0x00], &seg));
}

#[test]
fn rfc5041_stag_not_associated_with_stream() {
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x40, 0x401, 0x4000, &[1]);
    expect_term(&mut b, &seg, &md([0x11, 0x02], &seg));
}

#[test]
fn rfc5040_write_needs_remote_write_access() {
    // Reported as invalid STag like siw (docs/siw.md §4.5).
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x40, 0x201, 0x2000, &[1]);
    expect_term(&mut b, &seg, &md([0x11, 0x00], &seg));
    assert_eq!(b.mem(Stag(0x201)), vec![7; 64]);
}

#[test]
fn rfc5041_base_or_bounds_violation() {
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x40, 0x101, 0x103d, &[1, 2, 3, 4]);
    expect_term(&mut b, &seg, &md([0x11, 0x01], &seg));
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x40, 0x101, 0xfff, &[1]);
    expect_term(&mut b, &seg, &md([0x11, 0x01], &seg));
}

#[test]
fn rfc5041_to_wrap() {
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x40, 0x101, u64::MAX - 1, &[1, 2, 3, 4]);
    expect_term(&mut b, &seg, &md([0x11, 0x03], &seg));
}

#[test]
fn rfc5041_tagged_continuation_same_stag_and_contiguous_to() {
    let mut b = setup(1);
    b.deliver(&tagged(0x81, 0x40, 0x101, 0x1000, &[1, 2]));
    let seg = tagged(0xc1, 0x40, 0x201, 0x1002, &[3]);
    expect_term(&mut b, &seg, &md([0x11, 0x00], &seg));
    let mut b = setup(1);
    b.deliver(&tagged(0x81, 0x40, 0x101, 0x1000, &[1, 2]));
    let seg = tagged(0xc1, 0x40, 0x101, 0x1003, &[3]);
    expect_term(&mut b, &seg, &md([0x11, 0x01], &seg));
}

#[test]
fn rfc5040_zero_length_write_needs_no_stag_check() {
    // The RTR form siw sends (STag 1, TO 0), docs/mpa.md §1.5.
    let mut b = setup(1);
    b.deliver(&[0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(b.next_segment(1500), None);
    b.deliver(&tagged(0xc1, 0x40, 0x101, 0x1000, b"ok"));
    assert_eq!(&b.mem(Stag(0x101))[..2], b"ok");
}

#[test]
fn siw_no_untagged_interleaving() {
    let mut b = setup(1);
    b.deliver(&untagged(0x01, 0x43, 0, 0, 1, 0, b"ab"));
    let rr = [0u8; 28];
    let seg = untagged(0x41, 0x41, 0, 1, 1, 0, &rr);
    expect_term(&mut b, &seg, &md([0x12, 0x03], &seg));
}

#[test]
fn siw_no_tagged_interleaving() {
    let mut b = setup(1);
    b.deliver(&tagged(0x81, 0x40, 0x101, 0x1000, &[1, 2]));
    let seg = tagged(0xc1, 0x42, 0x101, 0x1000, &[3]);
    expect_term(&mut b, &seg, &md([0x02, 0x06], &seg));
}

#[test]
fn rfc5040_tagged_may_interleave_with_untagged() {
    let mut b = setup(1);
    b.deliver(&untagged(0x01, 0x43, 0, 0, 1, 0, b"ab"));
    b.deliver(&tagged(0xc1, 0x40, 0x101, 0x1000, b"W"));
    b.deliver(&untagged(0x41, 0x43, 0, 0, 1, 2, b"c"));
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(b.completions(), vec![ok(1, WcOpcode::Recv, 3)]);
    assert_eq!(&b.mem(Stag(0x301))[..3], b"abc");
    assert_eq!(b.mem(Stag(0x101))[0], b'W');
}

#[test]
fn rfc5040_read_response_without_request() {
    let mut b = setup(1);
    let seg = tagged(0xc1, 0x42, 0x101, 0x1000, &[1]);
    expect_term(&mut b, &seg, &md([0x02, 0x06], &seg));
}

/// B issues a 4-byte Read into 0x101 @ 0x1010 and puts the Read Request on the wire.
fn with_outstanding_read() -> Side {
    let mut b = setup(1);
    b.qp.post_send(SendWr {
        wr_id: 9,
        op: SendOp::Read {
            remote_stag: Stag(0x77),
            remote_to: 0x5000,
        },
        sgl: vec![Sge {
            lkey: Stag(0x101),
            addr: 0x1010,
            len: 4,
        }],
        signaled: true,
        fence: false,
    })
    .unwrap();
    #[rustfmt::skip]
    let expect = [
        0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0,
        0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0x10, 0x10, 0, 0, 0, 4,
        0, 0, 0, 0x77, 0, 0, 0, 0, 0, 0, 0x50, 0x00,
    ];
    assert_eq!(b.next_segment(1500).unwrap(), expect);
    b
}

#[test]
fn rfc5040_read_response_exact_matching() {
    // Right: placed, completes.
    let mut b = with_outstanding_read();
    b.deliver(&tagged(0x81, 0x42, 0x101, 0x1010, &[1, 2]));
    assert!(
        b.completions().is_empty(),
        "Read completes on the last Response segment"
    );
    b.deliver(&tagged(0xc1, 0x42, 0x101, 0x1012, &[3, 4]));
    assert_eq!(b.completions(), vec![ok(9, WcOpcode::Read, 4)]);
    assert_eq!(&b.mem(Stag(0x101))[0x10..0x14], &[1, 2, 3, 4]);
    // Wrong STag.
    let mut b = with_outstanding_read();
    let seg = tagged(0xc1, 0x42, 0x201, 0x1010, &[1, 2, 3, 4]);
    expect_term(&mut b, &seg, &md([0x11, 0x00], &seg));
    // TO not the Sink TO.
    let mut b = with_outstanding_read();
    let seg = tagged(0xc1, 0x42, 0x101, 0x1011, &[1, 2, 3, 4]);
    expect_term(&mut b, &seg, &md([0x11, 0x01], &seg));
    // Longer than requested.
    let mut b = with_outstanding_read();
    let seg = tagged(0xc1, 0x42, 0x101, 0x1010, &[1, 2, 3, 4, 5]);
    expect_term(&mut b, &seg, &md([0x11, 0x01], &seg));
    // Last segment before the full size.
    let mut b = with_outstanding_read();
    let seg = tagged(0xc1, 0x42, 0x101, 0x1010, &[1, 2, 3]);
    expect_term(&mut b, &seg, &md([0x11, 0x01], &seg));
    let c = b.completions();
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (9, CompletionStatus::WrFlushError)
    );
}

fn read_request(msn: u32, src_stag: u32, src_to: u64, size: u32) -> Vec<u8> {
    let rr = wire::ReadRequest {
        sink_stag: 0xabc01,
        sink_to: 0x9_0000,
        size,
        src_stag,
        src_to,
    };
    untagged(0x41, 0x41, 0, 1, msn, 0, &rr.to_bytes())
}

/// Body with M+D+R: control, length, untagged header, Read Request.
fn mdr(ctrl: [u8; 2], seg: &[u8]) -> Vec<u8> {
    let mut v = vec![ctrl[0], ctrl[1], 0xe0, 0x00, 0x00, 46];
    v.extend_from_slice(seg);
    v
}

#[test]
fn rfc5040_ird_exceeded() {
    let mut b = setup(1);
    b.deliver(&read_request(1, 0x201, 0x2000, 8));
    assert_eq!(b.qp.state(), QpState::Rts);
    let seg = read_request(2, 0x201, 0x2000, 8);
    b.deliver(&seg);
    #[rustfmt::skip]
    let body = [
        0x02, 0x07, 0xe0, 0x00, 0x00, 0x2e,
        0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0,
        0, 0x0a, 0xbc, 0x01, 0, 0, 0, 0, 0, 0x09, 0, 0, 0, 0, 0, 8,
        0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0x20, 0x00,
    ];
    assert_eq!(b.next_segment(1500).unwrap(), term_segment(&body));
    assert_eq!(b.qp.state(), QpState::Error);
}

#[test]
fn rfc5040_ird_zero_rejects_every_read() {
    let mut b = setup(0);
    let seg = read_request(1, 0x201, 0x2000, 8);
    expect_term(&mut b, &seg, &mdr([0x02, 0x07], &seg));
}

#[test]
fn rfc5040_read_source_validation() {
    for (src_stag, to, size, code) in [
        (0x999u32, 0x2000u64, 8u32, 0x00u8), // invalid STag
        (0x201, 0x2039, 8, 0x01),            // bounds
        (0x101, 0x1000, 8, 0x02),            // no Remote Read
        (0x401, 0x4000, 8, 0x03),            // other PD
        (0x201, u64::MAX - 2, 8, 0x04),      // TO wrap
    ] {
        let mut b = setup(1);
        let seg = read_request(1, src_stag, to, size);
        expect_term(&mut b, &seg, &mdr([0x01, code], &seg));
    }
}

#[test]
fn rfc5040_read_request_is_one_28_byte_segment() {
    let mut b = setup(1);
    let seg = untagged(0x41, 0x41, 0, 1, 1, 0, &[0; 29]);
    expect_term(&mut b, &seg, &md([0x02, 0xff], &seg));
    let mut b = setup(1);
    let seg = untagged(0x01, 0x41, 0, 1, 1, 0, &[0; 28]);
    expect_term(&mut b, &seg, &md([0x02, 0xff], &seg));
}

#[test]
fn rfc5040_read_request_served_as_read_response() {
    let mut b = setup(1);
    let data: Vec<u8> = (0..64u8).collect();
    b.res.stags.write(Stag(0x201), 0, &data).unwrap();
    b.deliver(&read_request(1, 0x201, 0x2000, 64));
    // MULPDU 70: 56 payload bytes per tagged segment.
    assert_eq!(
        b.drain_segments(70),
        vec![
            tagged(0x81, 0x42, 0xabc01, 0x9_0000, &data[..56]),
            tagged(0xc1, 0x42, 0xabc01, 0x9_0038, &data[56..]),
        ]
    );
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn rfc5040_send_with_invalidate() {
    let mut b = setup(1);
    let seg = untagged(0x41, 0x44, 0x101, 0, 1, 0, b"inv");
    b.deliver(&seg);
    let c = b.completions();
    assert_eq!(c[0].invalidated_stag, Some(Stag(0x101)));
    assert!(!c[0].solicited);
    // The region is now unusable for Writes.
    let seg = tagged(0xc1, 0x40, 0x101, 0x1000, &[1]);
    expect_term(&mut b, &seg, &md([0x11, 0x00], &seg));
}

#[test]
fn rfc5040_send_with_se_sets_solicited() {
    let mut b = setup(1);
    b.deliver(&untagged(0x41, 0x45, 0, 0, 1, 0, b"se"));
    let c = b.completions();
    assert!(c[0].solicited);
    assert_eq!(c[0].invalidated_stag, None);
}

#[test]
fn rfc5040_stag_cannot_be_invalidated() {
    let mut b = setup(1);
    let seg = untagged(0x41, 0x46, 0x401, 0, 1, 0, b"x");
    expect_term(&mut b, &seg, &md([0x01, 0x09], &seg));
    let c = b.completions();
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (1, CompletionStatus::WrFlushError)
    );
}

#[test]
fn rfc5040_inbound_terminate_reported_and_flushes() {
    let mut b = setup(1);
    b.recv(2, Stag(0x301), 0x3000, 16);
    // RFC layout, LLP / MPA / CRC error (docs/testing.md §6.2).
    b.deliver(&term_segment(&[0x20, 0x02, 0x00, 0x00]));
    assert_eq!(b.qp.state(), QpState::Error);
    let ev = b.events();
    let QpEvent::TerminateReceived(p) = ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(p.chosen, TerminateLayout::Rfc);
    assert_eq!(
        p.best().unwrap().cause(),
        Some(TerminateCause::Llp(LlpErrorCode::CrcError))
    );
    assert_eq!(
        b.next_segment(1500),
        None,
        "no Terminate answers a Terminate"
    );
    let ids: Vec<_> = b
        .completions()
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        ids,
        vec![
            (1, CompletionStatus::WrFlushError),
            (2, CompletionStatus::WrFlushError)
        ]
    );
}

#[test]
fn siw_layout_inbound_terminate_with_header() {
    let mut b = setup(1);
    // siw quirk (docs/siw.md §4.6): etype<<4|layer, hdrct M|D in the low bits,
    // DDP segment length = payload length.
    let mut body = vec![0x21, 0x05, 0x03, 0x00, 0x00, 0x10];
    body.extend_from_slice(&untagged(0x41, 0x43, 0, 0, 1, 0, &[]));
    b.deliver(&term_segment(&body));
    let ev = b.events();
    let QpEvent::TerminateReceived(p) = ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(p.chosen, TerminateLayout::Siw);
    assert_eq!(
        p.best().unwrap().cause(),
        Some(TerminateCause::Ddp(DdpError::Untagged(
            UntaggedErrorCode::MessageTooLong
        )))
    );
}

#[test]
fn llp_error_terminate_from_outside() {
    let mut b = setup(1);
    b.qp.terminate(TerminateCause::Llp(LlpErrorCode::CrcError));
    #[rustfmt::skip]
    let expect = [
        0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0,
        0x20, 0x02, 0x00, 0x00,
    ];
    assert_eq!(b.next_segment(1500).unwrap(), expect);
    assert_eq!(b.qp.state(), QpState::Error);
}

#[test]
fn rfc5040_zero_length_read_request_needs_no_source_check() {
    // Zero-length Read RTR (docs/mpa.md §1.5): any source STag, one empty Response.
    let mut b = setup(1);
    b.deliver(&read_request(1, 0, 0, 0));
    assert_eq!(b.qp.state(), QpState::Rts);
    assert_eq!(
        b.drain_segments(1500),
        vec![tagged(0xc1, 0x42, 0xabc01, 0x9_0000, &[])]
    );
}
