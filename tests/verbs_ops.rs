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
    expect_events(
        &s.qp,
        &[
            CmEvent::TerminateSent {
                layer: 1,
                etype: 1,
                code: 0,
            },
            CmEvent::Disconnected,
        ],
    );
    expect_events(
        &c.qp,
        &[
            CmEvent::TerminateReceived {
                layer: 1,
                etype: 1,
                code: 0,
            },
            CmEvent::Disconnected,
        ],
    );
}
