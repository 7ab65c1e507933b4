//! `QueuePair::connect_tuned` with `ConnectTuning::retry_refused`: a client that starts
//! before its server listens (perftest's clients do) is refused by the peer's TCP (RST to
//! the SYN); with the retry it tries again every `CONNECT_RETRY_INTERVAL` until the
//! listener is there, then connects and moves verified data. Without the retry, or past
//! its deadline, the refusal is one `ConnectError`; a QP disconnected or destroyed while
//! waiting for its next attempt gets its `ConnectError` at once. Two engines on the
//! virtual wire (no root).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use xwarp_poll_driver::vwire::VirtualNic;
use xwarp_verbs::{
    vwire_pair_simple, Access, CmEvent, CompletionQueue, CompletionStatus, ConnectParams,
    ConnectTuning, Context, ProtectionDomain, QpInitAttr, QueuePair, SendRequest, WcOpcode,
    WorkCompletion, CONNECT_RETRY_INTERVAL,
};

const T: Duration = Duration::from_secs(20);

struct End {
    pd: ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    qp: QueuePair,
}

fn end(ctx: &Context<VirtualNic>) -> End {
    let dev = ctx.device();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(16).unwrap();
    let rcq = dev.create_cq(16).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&scq, &rcq)).unwrap();
    End { pd, scq, rcq, qp }
}

fn params() -> ConnectParams {
    ConnectParams {
        private_data: b"retry-me".to_vec(),
        timeout: Duration::from_secs(5),
    }
}

fn retry(d: Duration) -> ConnectTuning {
    ConnectTuning {
        retry_refused: Some(d),
        ..ConnectTuning::default()
    }
}

fn wc(cq: &CompletionQueue) -> WorkCompletion {
    let t0 = Instant::now();
    loop {
        if let Some(w) = cq.poll_one() {
            return w;
        }
        assert!(t0.elapsed() < T, "no completion within {T:?}");
        let _ = cq.wait(Some(Duration::from_millis(50)));
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 8) as u8)
        .collect()
}

/// The first event of `qp` that is not `Disconnected`-after-something: the connect's
/// outcome, with how long it took from `t0`.
fn outcome(qp: &QueuePair, t0: Instant) -> (CmEvent, Duration) {
    let e = qp.next_event(T).expect("an event for the connect");
    (e, t0.elapsed())
}

#[test]
fn refused_connect_is_retried_until_the_listener_appears() {
    let (a, b) = vwire_pair_simple(Default::default()).unwrap();
    let at = SocketAddr::from(([10, 77, 0, 2], 5301));
    let (c, s) = (end(&a), end(&b));
    let t0 = Instant::now();
    c.qp.connect_tuned(at, params(), retry(Duration::from_secs(10)))
        .unwrap();
    // Several attempts are refused before anything listens.
    std::thread::sleep(CONNECT_RETRY_INTERVAL * 5);
    assert!(
        c.qp.next_event(Duration::ZERO).is_err(),
        "a refusal was reported although the retry deadline is ahead"
    );
    let listener = b.device().listen(at, 4).unwrap();
    let req = listener.get_request(T).unwrap();
    assert_eq!(req.private_data, b"retry-me");
    req.accept(&s.qp, b"welcome").unwrap();
    match outcome(&c.qp, t0) {
        (CmEvent::Established { private_data, .. }, dt) => {
            assert_eq!(private_data, b"welcome");
            assert!(dt >= CONNECT_RETRY_INTERVAL * 5, "established after {dt:?}");
        }
        (e, _) => panic!("expected Established, got {e:?}"),
    }
    assert!(matches!(
        s.qp.next_event(T).unwrap(),
        CmEvent::Established { .. }
    ));
    // Data over the retried connection, both ways, verified.
    let data = pattern(6000, 7);
    let cmr = c.pd.register(data.clone(), Access::LOCAL_WRITE).unwrap();
    let smr = s.pd.register(vec![0u8; 6000], Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(1, &[smr.sge_all().unwrap()]).unwrap();
    c.qp.post_send(SendRequest::send(2, vec![cmr.sge_all().unwrap()]))
        .unwrap();
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (1, CompletionStatus::Success, WcOpcode::Recv, 6000)
    );
    let w = wc(&c.scq);
    assert_eq!((w.wr_id, w.status), (2, CompletionStatus::Success));
    assert_eq!(smr.to_vec(0, 6000).unwrap(), data);
    let back = pattern(100, 9);
    let smr2 = s.pd.register(back.clone(), Access::LOCAL_WRITE).unwrap();
    let cmr2 = c.pd.register(vec![0u8; 100], Access::LOCAL_WRITE).unwrap();
    c.qp.post_recv(3, &[cmr2.sge_all().unwrap()]).unwrap();
    s.qp.post_send(SendRequest::send(4, vec![smr2.sge_all().unwrap()]))
        .unwrap();
    assert_eq!(wc(&c.rcq).byte_len, 100);
    assert_eq!(wc(&s.scq).status, CompletionStatus::Success);
    assert_eq!(cmr2.to_vec(0, 100).unwrap(), back);
}

#[test]
fn refused_connect_without_retry_is_reported_at_once() {
    let (a, _b) = vwire_pair_simple(Default::default()).unwrap();
    let at = SocketAddr::from(([10, 77, 0, 2], 5302));
    let c = end(&a);
    let t0 = Instant::now();
    c.qp.connect_tuned(at, params(), ConnectTuning::default())
        .unwrap();
    match outcome(&c.qp, t0) {
        (CmEvent::ConnectError(why), dt) => {
            assert!(dt < Duration::from_secs(3), "took {dt:?}");
            assert!(why.to_lowercase().contains("refused"), "{why}");
        }
        (e, _) => panic!("expected ConnectError, got {e:?}"),
    }
}

#[test]
fn refused_connect_is_reported_once_the_retry_deadline_passed() {
    let (a, _b) = vwire_pair_simple(Default::default()).unwrap();
    let at = SocketAddr::from(([10, 77, 0, 2], 5303));
    let c = end(&a);
    let window = Duration::from_millis(700);
    let t0 = Instant::now();
    c.qp.connect_tuned(at, params(), retry(window)).unwrap();
    match outcome(&c.qp, t0) {
        (CmEvent::ConnectError(why), dt) => {
            // The last attempt starts before the deadline; its refusal is final.
            assert!(
                dt >= window - CONNECT_RETRY_INTERVAL,
                "gave up after {dt:?}"
            );
            assert!(dt < window + Duration::from_secs(3), "gave up after {dt:?}");
            assert!(why.to_lowercase().contains("refused"), "{why}");
        }
        (e, _) => panic!("expected ConnectError, got {e:?}"),
    }
    // Exactly one outcome.
    assert!(c.qp.next_event(Duration::from_millis(300)).is_err());
}

#[test]
fn disconnect_while_waiting_to_retry_ends_the_connect() {
    let (a, _b) = vwire_pair_simple(Default::default()).unwrap();
    let at = SocketAddr::from(([10, 77, 0, 2], 5304));
    let c = end(&a);
    let t0 = Instant::now();
    c.qp.connect_tuned(at, params(), retry(Duration::from_secs(30)))
        .unwrap();
    std::thread::sleep(CONNECT_RETRY_INTERVAL * 3);
    c.qp.disconnect().unwrap();
    match outcome(&c.qp, t0) {
        (CmEvent::ConnectError(_), dt) => {
            assert!(dt < Duration::from_secs(5), "took {dt:?}")
        }
        (e, _) => panic!("expected ConnectError, got {e:?}"),
    }
    // The QP can be reset and connect again (here: refused once more, no retry).
    c.qp.modify(&xwarp_verbs::QpModify::to_state(xwarp_verbs::QpState::Idle))
        .unwrap();
    c.qp.connect_tuned(at, params(), ConnectTuning::default())
        .unwrap();
    assert!(matches!(
        c.qp.next_event(T).unwrap(),
        CmEvent::ConnectError(_)
    ));
}
