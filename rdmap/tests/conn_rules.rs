//! Connection rules: startup ordering, Terminates on MPA and QP errors, rejection,
//! timeouts and close (docs/mpa.md §1.5, §1.8, docs/siw.md §4.5, docs/mpa.md §1.9).

#[path = "conn_util.rs"]
mod util;

use std::time::{Duration, Instant};

use util::*;
use xwarp_ddp::mpa::crc::{crc32c, crc_to_trailer};
use xwarp_ddp::mpa::{MpaError, RtrSet, RtrType};
use xwarp_rdmap::conn::{ConnConfig, ConnError, ConnEvent};
use xwarp_rdmap::*;

const SEND: SendOp = SendOp::Send {
    solicited: false,
    invalidate: None,
};

fn sge(lkey: Stag, addr: u64, len: u32) -> Vec<Sge> {
    vec![Sge { lkey, addr, len }]
}

fn has_error(p: &Peer, f: impl Fn(&ConnError) -> bool) -> bool {
    p.events
        .iter()
        .any(|e| matches!(e, ConnEvent::Error(x) if f(x)))
}

/// The FPDUs of a byte stream (no markers), each as (ULPDU, CRC trailer).
fn fpdus(mut s: &[u8]) -> Vec<(Vec<u8>, [u8; 4])> {
    let mut v = Vec::new();
    while s.len() >= 2 {
        let n = u16::from_be_bytes([s[0], s[1]]) as usize;
        let pad = (4 - (n + 2) % 4) % 4;
        let total = 2 + n + pad + 4;
        let crc = s[2 + n + pad..total].try_into().unwrap();
        v.push((s[2..2 + n].to_vec(), crc));
        s = &s[total..];
    }
    v
}

#[test]
fn rfc5044_initiator_sends_nothing_after_request_until_reply() {
    let now = Instant::now();
    let mut rng = Rng(1);
    let mut i = Peer::new(true, now, |_| {});
    let mut r = Peer::new(false, now, |_| {});
    let buf = i.reg(0x1000, b"0123456789abcdef".to_vec(), Access::LOCAL_WRITE);
    i.send(1, SEND, sge(buf, 0x1000, 16));
    pump(&mut i, &mut r, &mut rng, 7, now);
    // The ULP of the responder has not decided: only the 24-byte Request went out.
    assert_eq!(i.sent.len(), 24);
    assert_eq!(&i.sent[..16], b"MPA ID Req Frame");
    assert!(r.sent.is_empty());
    let rb = r.reg(0x2000, vec![0; 16], Access::LOCAL_WRITE);
    r.recv(9, sge(rb, 0x2000, 16));
    r.conn.accept(Default::default()).unwrap();
    pump(&mut i, &mut r, &mut rng, 7, now);
    assert_eq!(r.mem(rb), b"0123456789abcdef");
    assert_eq!(r.completions()[0].wr_id, 9);
}

#[test]
fn rfc5044_responder_sends_no_fpdu_before_first_inbound_fpdu() {
    let mut rng = Rng(2);
    let (mut i, mut r) = connect(|_| {}, |_| {}, &mut rng, 64);
    let reply_len = r.sent.len();
    assert_eq!(reply_len, 24);
    let ib = i.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    i.recv(1, sge(ib, 0x1000, 16));
    let rs = r.reg(0x2000, b"from-the-server!".to_vec(), Access::LOCAL_WRITE);
    r.send(2, SEND, sge(rs, 0x2000, 16));
    pump(&mut i, &mut r, &mut rng, 64, Instant::now());
    assert_eq!(
        r.sent.len(),
        reply_len,
        "responder sent before the first FPDU"
    );
    assert!(i.completions().is_empty());
    // The initiator's first FPDU (a zero-length Write here) opens the gate.
    i.send(
        3,
        SendOp::Write {
            remote_stag: Stag(1),
            remote_to: 0,
        },
        Vec::new(),
    );
    pump(&mut i, &mut r, &mut rng, 64, Instant::now());
    assert!(r.sent.len() > reply_len);
    assert_eq!(i.mem(ib), b"from-the-server!");
}

#[test]
fn siw_extra_data_behind_request_fails_the_responder() {
    // docs/siw.md §4.5: bytes behind the Request before the Reply are a protocol error.
    let now = Instant::now();
    let mut r = Peer::new(false, now, |_| {});
    let mut req = b"MPA ID Req Frame".to_vec();
    req.extend_from_slice(&[0x10, 2, 0, 4, 0, 1, 0, 1]);
    req.extend_from_slice(&[
        0, 0x0e, 0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    let e = r.conn.handle_input(now, &req, &mut r.res).unwrap_err();
    assert_eq!(e, ConnError::UnexpectedData);
    r.drain_events();
    assert!(r.conn.wants_close());
    assert!(r.events.contains(&ConnEvent::Closed));
}

fn corrupted_fpdu(crc: bool) -> (Peer, Peer, Result<usize, ConnError>) {
    let mut rng = Rng(3);
    let tweak = move |c: &mut ConnConfig| c.initiator.crc = crc;
    let (mut i, mut r) = connect(tweak, |_| {}, &mut rng, 64);
    let rb = r.reg(0x2000, vec![0; 32], Access::LOCAL_WRITE);
    r.recv(1, sge(rb, 0x2000, 32));
    r.recv(2, sge(rb, 0x2000, 32));
    let ib = i.reg(0x1000, vec![0x5a; 32], Access::LOCAL_WRITE);
    i.send(1, SEND, sge(ib, 0x1000, 32));
    pump(&mut i, &mut r, &mut rng, 64, Instant::now());
    assert_eq!(r.completions().len(), 1);
    i.send(2, SEND, sge(ib, 0x1000, 32));
    let mut bytes = i.transmit();
    bytes[25] ^= 0x01; // a payload byte
    let res = r.conn.handle_input(Instant::now(), &bytes, &mut r.res);
    (i, r, res)
}

#[test]
fn rfc5044_crc_error_sends_llp_terminate_and_closes() {
    let (mut i, mut r, res) = corrupted_fpdu(true);
    assert!(matches!(
        res,
        Err(ConnError::Mpa(MpaError::CrcMismatch { .. }))
    ));
    let term = r.transmit();
    // RFC layout LLP / MPA / CRC error: the docs/testing.md §6.2 vector, MSN 1 on QN 2.
    let mut expect = vec![
        0x00, 0x16, 0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x20, 0x02, 0, 0,
    ];
    assert_eq!(crc_to_trailer(crc32c(&expect)), [0x7f, 0xe4, 0x25, 0x85]);
    expect.extend_from_slice(&[0x7f, 0xe4, 0x25, 0x85]);
    assert_eq!(term, expect);
    r.drain_events();
    assert!(has_error(&r, |e| matches!(
        e,
        ConnError::Mpa(MpaError::CrcMismatch { .. })
    )));
    assert!(r
        .events
        .iter()
        .any(|e| matches!(e, ConnEvent::TerminateSent(t) if (t.layer, t.code) == (2, 2))));
    assert!(r.conn.wants_close());
    assert_eq!(r.conn.qp().unwrap().state(), QpState::Error);
    // The remaining posted receive is flushed.
    let rc = r.completions();
    assert_eq!(rc.len(), 1);
    assert_eq!(rc[0].status, CompletionStatus::WrFlushError);
    // The sender sees the Terminate and errors too.
    i.conn
        .handle_input(Instant::now(), &term, &mut i.res)
        .unwrap();
    i.drain_events();
    assert!(i.events.iter().any(|e| matches!(
        e,
        ConnEvent::TerminateReceived(p) if p.best().map(|t| (t.layer, t.code)) == Some((2, 2))
    )));
    assert_eq!(i.conn.qp().unwrap().state(), QpState::Error);
    assert!(i.conn.wants_close());
}

#[test]
fn rfc5044_crc_not_checked_when_not_negotiated() {
    let (_i, mut r, res) = corrupted_fpdu(false);
    assert!(res.is_ok());
    // Placed as received (corrupted byte included), no Terminate.
    let rc = r.completions();
    assert_eq!(rc.len(), 1);
    assert_eq!(rc[0].status, CompletionStatus::Success);
    assert!(r.transmit().is_empty());
}

#[test]
fn rfc5040_qp_protocol_error_sends_terminate_then_wants_close() {
    let mut rng = Rng(4);
    let (mut i, mut r) = connect(|_| {}, |_| {}, &mut rng, 64);
    // No receive posted at the responder: DDP untagged error 0x02 (iwarp has no RNR).
    let ib = i.reg(0x1000, vec![1; 8], Access::LOCAL_WRITE);
    i.send(1, SEND, sge(ib, 0x1000, 8));
    pump(&mut i, &mut r, &mut rng, 64, Instant::now());
    let t = fpdus(&r.sent[24..]);
    assert_eq!(t.len(), 1);
    let (ulpdu, _) = &t[0];
    assert_eq!(&ulpdu[..2], &[0x41, 0x47]);
    // Layer DDP (1), EType untagged (2), code 0x02, M+D.
    assert_eq!(&ulpdu[18..21], &[0x12, 0x02, 0xc0]);
    assert!(has_error(&r, |e| matches!(e, ConnError::LocalTerminate(_))));
    assert!(r.conn.wants_close() && r.closed_tcp);
    assert!(i
        .events
        .iter()
        .any(|e| matches!(e, ConnEvent::TerminateReceived(_))));
    assert!(i.conn.is_closed());
}

#[test]
fn rfc5044_reject_with_private_data() {
    let now = Instant::now();
    let mut rng = Rng(5);
    let mut i = Peer::new(true, now, |c| c.initiator.private_data = b"hello".to_vec());
    let mut r = Peer::new(false, now, |_| {});
    let ib = i.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    i.recv(1, sge(ib, 0x1000, 16));
    pump(&mut i, &mut r, &mut rng, 5, now);
    let req = r.events.iter().find_map(|e| match e {
        ConnEvent::ConnectRequest(c) => Some(c.clone()),
        _ => None,
    });
    assert_eq!(req.unwrap().private_data, b"hello");
    r.conn.reject(b"go away").unwrap();
    pump(&mut i, &mut r, &mut rng, 5, now);
    assert_eq!(r.sent[16] & 0x20, 0x20, "R flag");
    assert!(i.events.contains(&ConnEvent::Rejected {
        private_data: b"go away".to_vec()
    }));
    assert!(i.events.contains(&ConnEvent::Closed) && r.events.contains(&ConnEvent::Closed));
    assert!(i.conn.wants_close() && r.conn.wants_close());
    // The receive posted before the stream opened is flushed.
    let c = i.completions();
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (1, CompletionStatus::WrFlushError)
    );
}

#[test]
fn siw_initiator_reply_timeout_10s() {
    let now = Instant::now();
    let mut i = Peer::new(true, now, |_| {});
    let ib = i.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    i.send(5, SEND, sge(ib, 0x1000, 16));
    assert_eq!(i.transmit().len(), 24);
    assert_eq!(i.conn.poll_timeout(), Some(now + Duration::from_secs(10)));
    i.conn.handle_timeout(now + Duration::from_secs(9));
    assert!(!i.conn.is_closed());
    i.conn.handle_timeout(now + Duration::from_secs(10));
    i.drain_events();
    assert!(has_error(&i, |e| *e == ConnError::Mpa(MpaError::Timeout)));
    assert!(i.conn.wants_close() && i.conn.poll_timeout().is_none());
    let c = i.completions();
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (5, CompletionStatus::WrFlushError)
    );
}

#[test]
fn siw_responder_request_timeout_5s_and_no_timeout_while_ulp_decides() {
    let now = Instant::now();
    let mut r = Peer::new(false, now, |_| {});
    assert_eq!(r.conn.poll_timeout(), Some(now + Duration::from_secs(5)));
    r.conn.handle_timeout(now + Duration::from_secs(5));
    r.drain_events();
    assert!(has_error(&r, |e| *e == ConnError::Mpa(MpaError::Timeout)));
    assert!(r.conn.wants_close());

    let mut i = Peer::new(true, now, |_| {});
    let mut r = Peer::new(false, now, |_| {});
    pump(&mut i, &mut r, &mut Rng(6), 3, now);
    assert_eq!(r.conn.poll_timeout(), None);
    r.conn.handle_timeout(now + Duration::from_secs(60));
    assert!(!r.conn.is_closed());
}

#[test]
fn rfc6581_initiator_sends_llp_terminate_on_no_matching_rtr() {
    let now = Instant::now();
    let mut i = Peer::new(true, now, |c| {
        c.initiator.p2p = Some(RtrSet::only(RtrType::Write));
    });
    i.transmit();
    // A Reply choosing a Read RTR that was not offered.
    let mut rep = b"MPA ID Rep Frame".to_vec();
    rep.extend_from_slice(&[0x10, 2, 0, 4, 0x80, 0x01, 0x40, 0x01]);
    let e = i.conn.handle_input(now, &rep, &mut i.res).unwrap_err();
    assert_eq!(e, ConnError::Mpa(MpaError::NoMatchingRtr));
    let t = fpdus(&i.transmit());
    assert_eq!(t.len(), 1);
    assert_eq!(&t[0].0[..2], &[0x41, 0x47]);
    assert_eq!(&t[0].0[18..22], &[0x20, 0x07, 0, 0]);
    assert!(i.conn.wants_close());
}

#[test]
fn graceful_close_drains_then_flushes_receives() {
    let mut rng = Rng(7);
    let (mut i, mut r) = connect(|_| {}, |_| {}, &mut rng, 64);
    let rb = r.reg(0x2000, vec![0; 4096], Access::LOCAL_WRITE);
    r.recv(1, sge(rb, 0x2000, 4096));
    r.recv(2, sge(rb, 0x2000, 4096));
    let ib = i.reg(
        0x1000,
        (0..4096).map(|x| x as u8).collect(),
        Access::LOCAL_WRITE,
    );
    i.recv(3, sge(ib, 0x1000, 16));
    i.send(1, SEND, sge(ib, 0x1000, 4096));
    // Close right after posting: the Send still drains first.
    i.conn.close();
    assert!(!i.conn.wants_close());
    pump(&mut i, &mut r, &mut rng, 64, Instant::now());
    assert_eq!(r.mem(rb), i.mem(ib));
    let ic = i.completions();
    assert!(
        ic.contains(&Completion {
            wr_id: 1,
            status: CompletionStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 4096,
            solicited: false,
            invalidated_stag: None
        }) || ic
            .iter()
            .any(|c| c.wr_id == 1 && c.status == CompletionStatus::Success)
    );
    assert!(ic
        .iter()
        .any(|c| c.wr_id == 3 && c.status == CompletionStatus::WrFlushError));
    assert!(!has_error(&i, |_| true));
    // The responder saw the TCP close as a lost connection and flushed its receive.
    assert!(has_error(&r, |e| *e == ConnError::ConnectionLost));
    let rc = r.completions();
    assert_eq!(rc.len(), 2);
    assert_eq!(rc[1].status, CompletionStatus::WrFlushError);
}

#[test]
fn config_with_tiny_emss_is_rejected() {
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    let mut cfg = ConnConfig::new(qp_config(pd, 1, 1));
    cfg.emss = 60;
    assert!(matches!(
        conn::Connection::initiator(cfg, Instant::now()),
        Err(ConnError::InvalidConfig(_))
    ));
}

#[test]
fn siw_quirk_first_fpdu_delay_holds_the_initiators_first_fpdu() {
    // docs/siw.md §4.3: siw_accept sends the Reply before the QP owns the socket's
    // data-ready upcall, so an FPDU right behind the Reply can sit unread.
    let now = Instant::now();
    let mut rng = Rng(8);
    let delay = Duration::from_millis(50);
    let mut i = Peer::new(true, now, |c| c.first_fpdu_delay = delay);
    let mut r = Peer::new(false, now, |_| {});
    let ib = i.reg(0x1000, b"held back please".to_vec(), Access::LOCAL_WRITE);
    i.send(1, SEND, sge(ib, 0x1000, 16));
    let rb = r.reg(0x2000, vec![0; 16], Access::LOCAL_WRITE);
    r.recv(2, sge(rb, 0x2000, 16));
    pump(&mut i, &mut r, &mut rng, 9, now);
    r.conn.accept(Default::default()).unwrap();
    pump(&mut i, &mut r, &mut rng, 9, now);
    assert!(i.conn.is_established());
    assert_eq!(i.sent.len(), 24, "only the Request before the delay ends");
    let t = i.conn.poll_timeout().expect("a timer for the delay");
    assert!(t > now && t <= Instant::now() + delay);
    i.conn.handle_timeout(t - Duration::from_millis(1));
    pump(&mut i, &mut r, &mut rng, 9, now);
    assert_eq!(i.sent.len(), 24);
    i.conn.handle_timeout(t);
    assert_eq!(i.conn.poll_timeout(), None);
    pump(&mut i, &mut r, &mut rng, 9, now);
    assert_eq!(r.mem(rb), b"held back please");
}

#[test]
fn siw_quirk_without_rtr_responder_sends_after_reply() {
    // docs/siw.md §4.8.14: siw's Responder sends right after its Reply when no RTR was
    // negotiated; with the switch on, ours does too (a ULP whose server speaks first,
    // like perftest's latency tests, deadlocks under RFC 5044 §7.1.2 otherwise).
    let mut rng = Rng(9);
    let (mut i, mut r) = connect(
        |_| {},
        |c| c.responder_sends_after_reply = true,
        &mut rng,
        64,
    );
    assert_eq!(r.conn.negotiated().and_then(|n| n.rtr), None);
    let reply_len = r.sent.len();
    assert_eq!(reply_len, 24);
    let ib = i.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    i.recv(1, sge(ib, 0x1000, 16));
    let rs = r.reg(0x2000, b"server-goes-1st!".to_vec(), Access::LOCAL_WRITE);
    r.send(2, SEND, sge(rs, 0x2000, 16));
    pump(&mut i, &mut r, &mut rng, 64, Instant::now());
    assert_eq!(
        i.sent.len(),
        24,
        "the initiator sent nothing but its Request"
    );
    assert!(r.sent.len() > reply_len, "the responder did not send");
    assert_eq!(i.mem(ib), b"server-goes-1st!");
    let c = i.completions();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode, c[0].byte_len),
        (1, CompletionStatus::Success, WcOpcode::Recv, 16)
    );
    // Without the switch the same exchange waits (the RFC rule).
    let (mut i2, mut r2) = connect(|_| {}, |_| {}, &mut rng, 64);
    let ib2 = i2.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    i2.recv(1, sge(ib2, 0x1000, 16));
    let rs2 = r2.reg(0x2000, b"server-goes-1st!".to_vec(), Access::LOCAL_WRITE);
    r2.send(2, SEND, sge(rs2, 0x2000, 16));
    pump(&mut i2, &mut r2, &mut rng, 64, Instant::now());
    assert_eq!(r2.sent.len(), 24);
    assert_eq!(i2.mem(ib2), vec![0; 16]);
}

#[test]
fn rfc6581_responder_waits_for_the_rtr_even_when_it_may_send_after_reply() {
    // With P2P negotiated the switch changes nothing: the Responder sends only after the
    // RTR (RFC 6581 §4; docs/siw.md §4.8.14). The Initiator holds its RTR back here, so
    // the Responder would have a window to send in.
    let now = Instant::now();
    let mut rng = Rng(10);
    let delay = Duration::from_millis(50);
    let mut i = Peer::new(true, now, |c| {
        c.initiator.p2p = Some(RtrSet::only(RtrType::Write));
        c.first_fpdu_delay = delay;
    });
    let mut r = Peer::new(false, now, |c| c.responder_sends_after_reply = true);
    let ib = i.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    i.recv(1, sge(ib, 0x1000, 16));
    let rs = r.reg(0x2000, b"after-the-rtr-ok".to_vec(), Access::LOCAL_WRITE);
    r.send(2, SEND, sge(rs, 0x2000, 16));
    pump(&mut i, &mut r, &mut rng, 64, now);
    r.conn.accept(Default::default()).unwrap();
    pump(&mut i, &mut r, &mut rng, 64, now);
    assert!(i.conn.is_established());
    assert_eq!(
        r.conn.negotiated().and_then(|n| n.rtr),
        Some(RtrType::Write)
    );
    assert_eq!(i.sent.len(), 24, "the RTR is still held");
    assert_eq!(r.sent.len(), 24, "the responder sent before the RTR");
    let reported = |p: &Peer| {
        p.events
            .iter()
            .any(|e| matches!(e, ConnEvent::Established(_)))
    };
    assert!(!reported(&r), "Established before the RTR");
    let t = i.conn.poll_timeout().expect("the delay's timer");
    i.conn.handle_timeout(t);
    pump(&mut i, &mut r, &mut rng, 64, now);
    assert!(reported(&r));
    assert!(r.sent.len() > 24);
    assert_eq!(i.mem(ib), b"after-the-rtr-ok");
}
