//! Error paths: a protocol violation by the peer produces the right Terminate on the
//! wire (checked where the peer parses it), the QP goes to ERROR and outstanding and
//! later work completes with flush status; the application gets events.
//!
//! Terminate codes (RFC 5040 §7.2 / RFC 5041 §7.2): layer 1 = DDP, 0 = RDMAP; DDP
//! EType 1 = tagged buffer error (code 0 invalid STag, 1 base or bounds), EType 2 =
//! untagged buffer error (code 2 invalid MSN, no buffer available); RDMAP EType 2 = remote operation
//! error (code 7 catastrophic: IRD exceeded, docs/ddp-rdmap.md §3.6).

mod verbs_common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use verbs_common::*;
use xwarp::ddp::mpa::InitiatorConfig;
use xwarp::net::TcpStream;
use xwarp::poll_driver::vwire::WireConfig;
use xwarp::rdmap::conn::{ConnConfig, ConnEvent, Connection};
use xwarp::rdmap::verbs::{Resources, SendOp, SendWr};
use xwarp::rdmap::{QpConfig, RqConfig};
use xwarp::verbs::{Access, CmEvent, CompletionStatus, SendRequest, Sge, Stag, WcOpcode};

/// After the error both QPs are in ERROR: new work on either side is flushed.
fn assert_flushed_afterwards(c: &End, s: &End) {
    let m = mr(c, 64);
    c.qp.post_send(SendRequest::send(77, vec![m.sge(0, 8).unwrap()]))
        .unwrap();
    c.qp.post_recv(78, &[m.sge(0, 8).unwrap()]).unwrap();
    let m2 = mr(s, 64);
    s.qp.post_recv(79, &[m2.sge(0, 8).unwrap()]).unwrap();
    let mut got = [wc(&c.scq), wc(&c.rcq), wc(&s.rcq)];
    got.sort_by_key(|w| w.wr_id);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (77, CompletionStatus::WrFlushError),
            (78, CompletionStatus::WrFlushError),
            (79, CompletionStatus::WrFlushError)
        ]
    );
}

#[test]
fn rfc5041_write_to_invalid_stag_terminates_with_ddp_invalid_stag() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 7000, |_| {});
    let src = mr(&c, 4096);
    let dst = mr(&s, 4096);
    // A receive outstanding at the client is flushed when the Terminate arrives.
    c.qp.post_recv(5, &[src.sge(0, 64).unwrap()]).unwrap();
    let bad = Stag(dst.rkey().0 ^ 0x55);
    c.qp.post_send(SendRequest::write(
        1,
        vec![src.sge(0, 100).unwrap()],
        bad,
        dst.addr(),
    ))
    .unwrap();
    let (sent, received) = term(1, 1, 0);
    expect_events(&s.qp, &[sent, CmEvent::Disconnected]);
    expect_events(&c.qp, &[received, CmEvent::Disconnected]);
    let mut outstanding = [wc(&c.scq), wc(&c.rcq)];
    outstanding.sort_by_key(|w| w.wr_id);
    assert_eq!(outstanding[1].wr_id, 5);
    assert_eq!(outstanding[1].status, CompletionStatus::WrFlushError);
    assert_flushed_afterwards(&c, &s);
}

#[test]
fn rfc5041_write_out_of_bounds_terminates_with_base_or_bounds() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 7001, |_| {});
    let src = mr(&c, 8192);
    let dst = mr(&s, 4096);
    c.qp.post_send(SendRequest::write(
        1,
        vec![src.sge(0, 200).unwrap()],
        dst.rkey(),
        dst.addr() + 4000,
    ))
    .unwrap();
    let (sent, received) = term(1, 1, 1);
    expect_events(&s.qp, &[sent, CmEvent::Disconnected]);
    expect_events(&c.qp, &[received, CmEvent::Disconnected]);
    // Nothing was placed.
    assert_eq!(dst.to_vec(4000, 96).unwrap(), vec![0u8; 96]);
    assert_eq!(wc(&c.scq).wr_id, 1);
    assert_flushed_afterwards(&c, &s);
}

#[test]
fn rfc5041_send_without_posted_receive_terminates_with_no_buffer() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 7002, |_| {});
    let src = mr(&c, 4096);
    c.qp.post_send(SendRequest::send(1, vec![src.sge(0, 64).unwrap()]))
        .unwrap();
    let (sent, received) = term(1, 2, 2);
    expect_events(&s.qp, &[sent, CmEvent::Disconnected]);
    expect_events(&c.qp, &[received, CmEvent::Disconnected]);
    // The Send itself was handed to TCP before the Terminate came back.
    assert_eq!(wc(&c.scq).wr_id, 1);
    assert_flushed_afterwards(&c, &s);
}

#[test]
fn rfc5040_read_from_invalid_stag_fails_the_read_and_terminates() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 7003, |_| {});
    let sink = mr(&c, 4096);
    let src = mr(&s, 4096);
    c.qp.post_send(SendRequest::read(
        1,
        sink.sge(0, 128).unwrap(),
        Stag(src.rkey().0 ^ 0x0f),
        src.addr(),
    ))
    .unwrap();
    // RDMAP layer, remote protection error, invalid STag.
    let (sent, received) = term(0, 1, 0);
    expect_events(&s.qp, &[sent, CmEvent::Disconnected]);
    expect_events(&c.qp, &[received, CmEvent::Disconnected]);
    let w = wc(&c.scq);
    assert_eq!((w.wr_id, w.opcode), (1, WcOpcode::Read));
    assert_ne!(w.status, CompletionStatus::Success);
    assert_flushed_afterwards(&c, &s);
}

/// A raw MPA v1 peer (no IRD/ORD negotiation) sends more Read Requests than the
/// server's IRD of 1: the server terminates with RDMAP remote operation error 0x07; the
/// raw peer parses that Terminate off the wire.
#[test]
fn rfc5040_read_requests_beyond_ird_terminate() {
    let (a, b) = pair(WireConfig::default());
    let listener = b.device().listen(server_addr(7004), 4).unwrap();
    let s = end(&b, |q| {
        q.ird = 1;
        q.ord = 1;
    });
    let src =
        s.pd.alloc_mr(1 << 20, Access::LOCAL_WRITE | Access::REMOTE_READ, false)
            .unwrap();
    let mut stream = TcpStream::connect(a.stack(), server_addr(7004)).unwrap();
    stream.set_nonblocking(true).unwrap();
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    let sink = res
        .stags
        .register(pd, Access::LOCAL_WRITE, 0, Box::new(vec![0u8; 1 << 20]))
        .unwrap();
    let mut cfg = ConnConfig::new(QpConfig {
        pd,
        ird: 8,
        ord: 8,
        sq_depth: 16,
        rq: RqConfig::Own(4),
    });
    cfg.initiator = InitiatorConfig {
        revision: 1,
        enhanced: false,
        ..InitiatorConfig::default()
    };
    let t0 = Instant::now();
    let mut conn = Connection::initiator(cfg, t0).unwrap();
    for i in 0..4u64 {
        conn.post_send(SendWr {
            wr_id: i,
            op: SendOp::Read {
                remote_stag: src.rkey(),
                remote_to: src.addr() + i * 4096,
            },
            sgl: vec![Sge {
                lkey: sink,
                addr: i * 4096,
                len: 4096,
            }],
            signaled: true,
            fence: false,
        })
        .unwrap();
    }
    let mut accepted = false;
    let mut got = None;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    while got.is_none() {
        assert!(t0.elapsed() < T, "no Terminate from the server");
        if !accepted {
            if let Ok(req) = listener.get_request(Duration::from_millis(1)) {
                assert_eq!(req.revision, 1);
                req.accept(&s.qp, &[]).unwrap();
                accepted = true;
            }
        }
        out.clear();
        conn.poll_transmit(&res, &mut out);
        if !out.is_empty() {
            stream.set_nonblocking(false).unwrap();
            stream.write_all(&out).unwrap();
            stream.set_nonblocking(true).unwrap();
        }
        match stream.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => {
                let _ = conn.handle_input(Instant::now(), &buf[..n], &mut res);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(200))
            }
            Err(e) => panic!("{e}"),
        }
        while let Some(e) = conn.poll_event() {
            if let ConnEvent::TerminateReceived(p) = e {
                got = p.best().map(|t| (t.layer, t.etype, t.code));
            }
        }
    }
    assert_eq!(got, Some((0, 2, 7)));
    let (sent, _) = term(0, 2, 7);
    expect_events(&s.qp, &[sent]);
}
