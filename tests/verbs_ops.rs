//! Every opcode end-to-end over the virtual wire, data verified.

mod verbs_common;

use verbs_common::*;
use xwarp::poll_driver::vwire::WireConfig;
use xwarp::verbs::{CmEvent, CompletionStatus, SendOpcode, SendRequest, WcOpcode};

#[test]
fn send_write_read_roundtrip() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 4791, |_| {});
    let cbuf = mr(&c, 1 << 20);
    let sbuf = mr(&s, 1 << 20);

    // Send: server posts a receive, client sends 100 KB from two SGEs.
    let data = pattern(100_000, 1);
    cbuf.write(0, &data).unwrap();
    s.qp.post_recv(7, &[sbuf.sge(0, 200_000).unwrap()]).unwrap();
    c.qp.post_send(SendRequest::send(
        1,
        vec![
            cbuf.sge(0, 60_000).unwrap(),
            cbuf.sge(60_000, 40_000).unwrap(),
        ],
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (1, CompletionStatus::Success, WcOpcode::Send)
    );
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (7, CompletionStatus::Success, WcOpcode::Recv, 100_000)
    );
    assert_eq!(sbuf.to_vec(0, 100_000).unwrap(), data);

    // Write: client writes 300 KB into the server region at offset 4096.
    let data = pattern(300_000, 2);
    cbuf.write(0, &data).unwrap();
    c.qp.post_send(SendRequest::write(
        2,
        vec![cbuf.sge(0, 300_000).unwrap()],
        sbuf.rkey(),
        sbuf.addr() + 4096,
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (2, CompletionStatus::Success, WcOpcode::Write)
    );
    // A Send after the Write makes the Write visible (ordering), then check the data.
    s.qp.post_recv(8, &[sbuf.sge(900_000, 16).unwrap()])
        .unwrap();
    c.qp.post_send(SendRequest {
        inline: Some(b"done".to_vec()),
        ..SendRequest::send(3, vec![])
    })
    .unwrap();
    assert_eq!(wc(&s.rcq).byte_len, 4);
    assert_eq!(wc(&c.scq).wr_id, 3);
    assert_eq!(sbuf.to_vec(900_000, 4).unwrap(), b"done");
    assert_eq!(sbuf.to_vec(4096, 300_000).unwrap(), data);

    // Read: client reads 500 KB from the server.
    let data = pattern(500_000, 3);
    sbuf.write(100, &data).unwrap();
    c.qp.post_send(SendRequest::read(
        4,
        cbuf.sge(1000, 500_000).unwrap(),
        sbuf.rkey(),
        sbuf.addr() + 100,
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.byte_len),
        (4, CompletionStatus::Success, WcOpcode::Read, 500_000)
    );
    assert_eq!(cbuf.to_vec(1000, 500_000).unwrap(), data);

    // Send with Solicited Event and Send with Invalidate.
    s.qp.post_recv(9, &[sbuf.sge(0, 64).unwrap()]).unwrap();
    s.qp.post_recv(10, &[sbuf.sge(64, 64).unwrap()]).unwrap();
    let victim = mr(&s, 4096);
    c.qp.post_send(SendRequest {
        inline: Some(b"se".to_vec()),
        ..SendRequest::new(5, SendOpcode::SendWithSolicitedEvent, vec![])
    })
    .unwrap();
    c.qp.post_send(SendRequest {
        inline: Some(b"inv".to_vec()),
        ..SendRequest::new(6, SendOpcode::SendWithInvalidate(victim.rkey()), vec![])
    })
    .unwrap();
    let r = wc(&s.rcq);
    assert_eq!((r.wr_id, r.solicited), (9, true));
    let r = wc(&s.rcq);
    assert_eq!((r.wr_id, r.invalidated_rkey), (10, Some(victim.rkey())));
    assert_eq!(sbuf.to_vec(64, 3).unwrap(), b"inv");
    wc(&c.scq);
    wc(&c.scq);
    // The invalidated STag refuses a Write: the server sends a Terminate (DDP layer,
    // tagged buffer error, invalid STag) and the client receives it.
    c.qp.post_send(SendRequest::write(
        11,
        vec![cbuf.sge(0, 16).unwrap()],
        victim.rkey(),
        victim.addr(),
    ))
    .unwrap();
    // DDP layer, tagged buffer error, invalid STag.
    let (sent, received) = term(1, 1, 0);
    expect_events(&s.qp, &[sent, CmEvent::Disconnected]);
    expect_events(&c.qp, &[received, CmEvent::Disconnected]);
}

/// Local Invalidate: a region invalidated locally refuses a remote Write (Terminate);
/// the completion arrives on the send CQ.
#[test]
fn local_invalidate_revokes_remote_access() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 4792, |_| {});
    let src = mr(&c, 4096);
    let dst = mr(&s, 4096);
    // Before: the Write lands.
    src.write(0, b"before").unwrap();
    c.qp.post_send(SendRequest::write(
        1,
        vec![src.sge(0, 6).unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    s.qp.post_recv(1, &[dst.sge(100, 8).unwrap()]).unwrap();
    c.qp.post_send(SendRequest::send(2, vec![src.sge(0, 1).unwrap()]))
        .unwrap();
    wc(&s.rcq);
    assert_eq!(dst.to_vec(0, 6).unwrap(), b"before");
    // The server invalidates its STag.
    s.qp.post_send(SendRequest::new(
        9,
        SendOpcode::LocalInvalidate(dst.rkey()),
        vec![],
    ))
    .unwrap();
    let w = wc(&s.scq);
    assert_eq!(
        (w.wr_id, w.opcode, w.status),
        (9, WcOpcode::LocalInvalidate, CompletionStatus::Success)
    );
    c.qp.post_send(SendRequest::write(
        3,
        vec![src.sge(0, 6).unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    expect_events(&s.qp, &[term(1, 1, 0).0]);
}

/// Unsignaled work produces no completion; a fenced Send waits for the Read before it.
#[test]
fn unsignaled_work_and_fenced_send_after_read() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 4793, |_| {});
    let cbuf = mr(&c, 1 << 20);
    let sbuf = mr(&s, 1 << 20);
    sbuf.write(0, &pattern(512 * 1024, 9)).unwrap();
    for i in 0..8u64 {
        let mut wr = SendRequest::write(
            100 + i,
            vec![cbuf.sge(0, 1024).unwrap()],
            sbuf.rkey(),
            sbuf.addr() + 600_000,
        );
        wr.signaled = false;
        c.qp.post_send(wr).unwrap();
    }
    // Read 512 KB, then a fenced Send carrying part of what was read (the Send's source
    // is the Read's sink: without the fence it could leave before the data arrived).
    c.qp.post_send(SendRequest::read(
        1,
        cbuf.sge(0, 512 * 1024).unwrap(),
        sbuf.rkey(),
        sbuf.addr(),
    ))
    .unwrap();
    s.qp.post_recv(5, &[sbuf.sge(800_000, 4096).unwrap()])
        .unwrap();
    let mut send = SendRequest::send(2, vec![cbuf.sge(512 * 1024 - 4096, 4096).unwrap()]);
    send.fence = true;
    c.qp.post_send(send).unwrap();
    let r = wc(&s.rcq);
    assert_eq!(r.byte_len, 4096);
    assert_eq!(
        sbuf.to_vec(800_000, 4096).unwrap(),
        pattern(512 * 1024, 9)[512 * 1024 - 4096..]
    );
    let ids: Vec<u64> = (0..2).map(|_| wc(&c.scq).wr_id).collect();
    assert_eq!(ids, vec![1, 2], "only the signaled work completes");
    assert!(c.scq.poll_one().is_none());
}

/// Solicited-only notification: an ordinary Send does not fire the CQ fd, a Send with
/// Solicited Event does.
#[test]
fn cq_notification_solicited_only() {
    use std::os::fd::AsRawFd;
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 4794, |_| {});
    let src = mr(&c, 64);
    let dst = mr(&s, 4096);
    assert!(s.rcq.as_raw_fd() >= 0);
    s.qp.post_recv(1, &[dst.sge(0, 64).unwrap()]).unwrap();
    s.qp.post_recv(2, &[dst.sge(64, 64).unwrap()]).unwrap();
    s.rcq.req_notify(true);
    c.qp.post_send(SendRequest::send(1, vec![src.sge(0, 8).unwrap()]))
        .unwrap();
    // The plain Send completes but does not wake a solicited-only waiter.
    assert!(!s
        .rcq
        .wait(Some(std::time::Duration::from_millis(300)))
        .unwrap());
    let w = s.rcq.poll_one().expect("plain send completed");
    assert!(!w.solicited);
    c.qp.post_send(SendRequest::new(
        2,
        SendOpcode::SendWithSolicitedEvent,
        vec![src.sge(0, 8).unwrap()],
    ))
    .unwrap();
    assert!(s.rcq.wait(Some(T)).unwrap(), "solicited send fires the fd");
    let w = s.rcq.poll_one().unwrap();
    assert!(w.solicited);
}

/// The exchange works in every MPA variant: CRC on/off, markers, revision 1, and each
/// P2P RTR type (and no P2P).
#[test]
fn mpa_variants_crc_markers_revision_and_rtr_types() {
    use xwarp::verbs::RtrType;
    let (a, b) = pair(WireConfig::default());
    let variants: Vec<(bool, bool, u8, Option<RtrType>)> = vec![
        (true, false, 2, Some(RtrType::Write)),
        (false, true, 2, Some(RtrType::Read)),
        (true, true, 2, Some(RtrType::Send)),
        (false, false, 2, None),
        (true, false, 1, None),
    ];
    for (k, (crc, markers, rev, rtr)) in variants.into_iter().enumerate() {
        // A zero-length Send RTR consumes one receive at the responder (docs/mpa.md
        // §1.5): post it before accepting.
        let pre = |e: &End| {
            if rtr == Some(RtrType::Send) {
                e.qp.post_recv(999, &[]).unwrap();
            }
        };
        let (c, s) = connect_pre(
            &a,
            &b,
            4800 + k as u16,
            |q| {
                q.mpa.crc = crc;
                q.mpa.markers = markers;
                q.mpa.revision = rev;
                q.mpa.p2p_rtr = rtr;
            },
            pre,
        );
        let cbuf = mr(&c, 256 * 1024);
        let sbuf = mr(&s, 256 * 1024);
        let data = pattern(200_000, k as u8);
        cbuf.write(0, &data).unwrap();
        c.qp.post_send(SendRequest::write(
            1,
            vec![cbuf.sge(0, 200_000).unwrap()],
            sbuf.rkey(),
            sbuf.addr(),
        ))
        .unwrap();
        s.qp.post_recv(2, &[sbuf.sge(210_000, 16).unwrap()])
            .unwrap();
        c.qp.post_send(SendRequest::send(2, vec![cbuf.sge(0, 16).unwrap()]))
            .unwrap();
        let mut r = wc(&s.rcq);
        if r.wr_id == 999 {
            assert_eq!(r.byte_len, 0);
            r = wc(&s.rcq);
        }
        assert_eq!(
            (r.wr_id, r.status),
            (2, CompletionStatus::Success),
            "variant {k}"
        );
        assert_eq!(sbuf.to_vec(0, 200_000).unwrap(), data, "variant {k}");
        // And a Read back.
        c.qp.post_send(SendRequest::read(
            3,
            cbuf.sge(0, 100_000).unwrap(),
            sbuf.rkey(),
            sbuf.addr() + 50_000,
        ))
        .unwrap();
        let ws: Vec<_> = (0..3).map(|_| wc(&c.scq)).collect();
        assert!(
            ws.iter().all(|w| w.status == CompletionStatus::Success),
            "{ws:?}"
        );
        assert_eq!(
            cbuf.to_vec(0, 100_000).unwrap(),
            data[50_000..150_000],
            "variant {k}"
        );
    }
}

/// A receive posted before the peer's Send is sent must catch it, even when the engine hands
/// the Send's bytes to the verbs host straight after the ingress packet, before its poll
/// has drained the command queue (iWARP has no RNR: a missing receive is a Terminate).
/// Both ends live in this process, so the client's Send can overtake the server's queued
/// post_recv unless the host applies queued commands before placing received bytes.
#[test]
fn receive_posted_before_the_peer_sends_is_never_missed() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 4795, |_| {});
    let cbuf = mr(&c, 64);
    let sbuf = mr(&s, 64 * 500);
    for i in 0..500u64 {
        s.qp.post_recv(i, &[sbuf.sge(64 * i as usize, 64).unwrap()])
            .unwrap();
        c.qp.post_send(SendRequest {
            inline: Some(i.to_be_bytes().to_vec()),
            ..SendRequest::send(i, vec![])
        })
        .unwrap();
        let r = wc(&s.rcq);
        assert_eq!(
            (r.wr_id, r.status, r.byte_len),
            (i, CompletionStatus::Success, 8),
            "receive {i}"
        );
        assert_eq!(wc(&c.scq).status, CompletionStatus::Success);
        assert_eq!(
            sbuf.to_vec(64 * i as usize, 8).unwrap(),
            i.to_be_bytes().to_vec()
        );
    }
    drop(cbuf);
}
