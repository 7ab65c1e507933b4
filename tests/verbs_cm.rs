//! Connection manager: reject with private data, connect timeout, connect refused,
//! graceful disconnect, and a disconnect during traffic that loses nothing reported
//! complete.

mod verbs_common;

use std::time::{Duration, Instant};

use verbs_common::*;
use xwarp::poll_driver::vwire::{LinkConfig, WireConfig};
use xwarp::verbs::{CmEvent, CompletionStatus, ConnectParams, SendRequest, WcOpcode};

#[test]
fn reject_carries_private_data() {
    let (a, b) = pair(WireConfig::default());
    let listener = b.device().listen(server_addr(5000), 4).unwrap();
    let c = end(&a, |_| {});
    c.qp.connect(
        server_addr(5000),
        ConnectParams {
            private_data: b"let me in".to_vec(),
            timeout: T,
        },
    )
    .unwrap();
    let req = listener.get_request(T).unwrap();
    assert_eq!(req.private_data, b"let me in");
    assert_eq!((req.peer_ird, req.peer_ord), (Some(16), Some(16)));
    req.reject(b"go away").unwrap();
    assert_eq!(
        c.qp.next_event(T).unwrap(),
        CmEvent::Rejected {
            private_data: b"go away".to_vec()
        }
    );
    // Work posted on the rejected QP is flushed.
    let m = mr(&c, 64);
    c.qp.post_send(SendRequest::send(1, vec![m.sge(0, 8).unwrap()]))
        .unwrap();
    let w = wc(&c.scq);
    assert_eq!((w.wr_id, w.status), (1, CompletionStatus::WrFlushError));
}

#[test]
fn connect_times_out_when_nobody_answers() {
    // Every frame toward the server is lost: the SYN never arrives.
    let wire = WireConfig {
        a_to_b: LinkConfig {
            drop: 1.0,
            ..LinkConfig::seeded(1)
        },
        ..WireConfig::default()
    };
    let (a, _b) = pair(wire);
    let c = end(&a, |_| {});
    let t0 = Instant::now();
    c.qp.connect(
        server_addr(5001),
        ConnectParams {
            private_data: vec![],
            timeout: Duration::from_millis(500),
        },
    )
    .unwrap();
    match c.qp.next_event(T).unwrap() {
        CmEvent::ConnectError(e) => assert!(e.contains("timed out"), "{e}"),
        e => panic!("{e:?}"),
    }
    let el = t0.elapsed();
    assert!(
        el >= Duration::from_millis(450) && el < Duration::from_secs(5),
        "{el:?}"
    );
}

#[test]
fn connect_refused_without_listener() {
    let (a, _b) = pair(WireConfig::default());
    let c = end(&a, |_| {});
    c.qp.connect(server_addr(5002), ConnectParams::default())
        .unwrap();
    match c.qp.next_event(T).unwrap() {
        CmEvent::ConnectError(e) => assert!(e.contains("refused"), "{e}"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn graceful_disconnect_reaches_both_sides() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 5003, |_| {});
    c.qp.disconnect().unwrap();
    expect_event(&c.qp, &CmEvent::Disconnected);
    expect_event(&s.qp, &CmEvent::Disconnected);
    // Receives posted afterwards are flushed.
    let m = mr(&s, 64);
    s.qp.post_recv(5, &[m.sge(0, 64).unwrap()]).unwrap();
    let w = wc(&s.rcq);
    assert_eq!((w.wr_id, w.status), (5, CompletionStatus::WrFlushError));
}

/// The server disconnects while the client streams Sends into posted receives: every
/// receive reported successful holds exactly the bytes sent for it, every send is
/// accounted for (success or flush), and nothing completes twice.
#[test]
fn disconnect_during_traffic_loses_nothing_reported_complete() {
    let wire = WireConfig {
        a_to_b: LinkConfig {
            drop: 0.01,
            reorder: 0.01,
            ..LinkConfig::seeded(3)
        },
        ..WireConfig::default()
    };
    let (a, b) = pair(wire);
    let (c, s) = connect(&a, &b, 5004, |q| {
        q.max_send_wr = 512;
        q.max_recv_wr = 512;
    });
    const MSG: usize = 4096;
    const N: usize = 400;
    let src = mr(&c, MSG * N);
    let dst = mr(&s, MSG * N);
    for i in 0..N {
        src.write(i * MSG, &pattern(MSG, i as u8)).unwrap();
        s.qp.post_recv(i as u64, &[dst.sge(i * MSG, MSG).unwrap()])
            .unwrap();
    }
    for i in 0..N {
        c.qp.post_send(SendRequest::send(
            i as u64,
            vec![src.sge(i * MSG, MSG).unwrap()],
        ))
        .unwrap();
    }
    // Let some traffic through, then disconnect from the receiving side.
    let mut received = Vec::new();
    while received.len() < N / 4 {
        let w = wc(&s.rcq);
        assert_eq!(w.status, CompletionStatus::Success);
        received.push(w);
    }
    s.qp.disconnect().unwrap();
    let mut flushed = 0;
    let mut seen = std::collections::HashSet::new();
    for w in &received {
        assert!(seen.insert(w.wr_id));
    }
    // Drain the server: every receive completes exactly once.
    while seen.len() < N {
        let w = wc(&s.rcq);
        assert_eq!(w.opcode, WcOpcode::Recv);
        assert!(seen.insert(w.wr_id), "receive {} completed twice", w.wr_id);
        match w.status {
            CompletionStatus::Success => received.push(w),
            CompletionStatus::WrFlushError => flushed += 1,
            st => panic!("unexpected {st:?}"),
        }
    }
    for w in &received {
        let i = w.wr_id as usize;
        assert_eq!(w.byte_len as usize, MSG);
        assert_eq!(
            dst.to_vec(i * MSG, MSG).unwrap(),
            pattern(MSG, i as u8),
            "receive {i}"
        );
    }
    // The client: every send completes (success or flush), exactly once.
    let mut sends = std::collections::HashSet::new();
    while sends.len() < N {
        let w = wc(&c.scq);
        assert!(sends.insert(w.wr_id));
        assert!(matches!(
            w.status,
            CompletionStatus::Success | CompletionStatus::WrFlushError
        ));
    }
    expect_event(&s.qp, &CmEvent::Disconnected);
    expect_event(&c.qp, &CmEvent::Disconnected);
    eprintln!(
        "{} receives delivered and verified, {flushed} flushed",
        received.len()
    );
}
