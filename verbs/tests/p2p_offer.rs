//! `ConnectTuning::p2p_rtr_offer`: the Initiator's MPA Request offers a set of RTR types
//! instead of the QP's single `MpaAttr::p2p_rtr`; the Responder picks exactly one of them
//! (RFC 6581 §3.2), both sides report that one as negotiated, and the connection then
//! moves verified data. An empty offer, or an offer on a revision-1 QP, is refused with a
//! `ConnectError`. Two engines on the virtual wire (no root).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use xwarp_poll_driver::vwire::VirtualNic;
use xwarp_verbs::{
    vwire_pair_simple, Access, CmEvent, CompletionQueue, CompletionStatus, ConnectParams,
    ConnectTuning, Context, ProtectionDomain, QpInitAttr, QueuePair, RtrSet, RtrType, SendRequest,
    WcOpcode, WorkCompletion,
};

const T: Duration = Duration::from_secs(20);

struct End {
    pd: ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    qp: QueuePair,
}

fn end(ctx: &Context<VirtualNic>, revision: u8) -> End {
    let dev = ctx.device();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(16).unwrap();
    let rcq = dev.create_cq(16).unwrap();
    let mut at = QpInitAttr::new(&scq, &rcq);
    at.mpa.revision = revision;
    // The QP's own setting says "no P2P": only the offer can bring an RTR.
    at.mpa.p2p_rtr = None;
    let qp = pd.create_qp(&at).unwrap();
    End { pd, scq, rcq, qp }
}

fn offer(set: RtrSet) -> ConnectTuning {
    ConnectTuning {
        p2p_rtr_offer: Some(set),
        ..ConnectTuning::default()
    }
}

fn params() -> ConnectParams {
    ConnectParams {
        private_data: Vec::new(),
        timeout: Duration::from_secs(5),
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

fn established(qp: &QueuePair) {
    match qp.next_event(T).unwrap() {
        CmEvent::Established { revision, .. } => assert_eq!(revision, 2),
        e => panic!("expected Established, got {e:?}"),
    }
}

/// Connects with `set` offered; returns the RTR type each side reports negotiated, after a
/// verified 3000-byte RDMA Read over the connection.
fn connect_with_offer(port: u16, set: RtrSet) -> (Option<RtrType>, Option<RtrType>) {
    let (a, b) = vwire_pair_simple(Default::default()).unwrap();
    let at = SocketAddr::from(([10, 77, 0, 2], port));
    let (c, s) = (end(&a, 2), end(&b, 2));
    let listener = b.device().listen(at, 4).unwrap();
    c.qp.connect_tuned(at, params(), offer(set)).unwrap();
    let req = listener.get_request(T).unwrap();
    req.accept(&s.qp, &[]).unwrap();
    established(&c.qp);
    established(&s.qp);
    let neg = |qp: &QueuePair| qp.query().unwrap().negotiated.unwrap().p2p_rtr;
    // Data after the RTR: the client Reads the server's pattern.
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 5) as u8).collect();
    let src = s.pd.register(data.clone(), Access::REMOTE_READ).unwrap();
    let dst = c.pd.register(vec![0u8; 3000], Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(SendRequest::read(
        7,
        dst.sge_all().unwrap(),
        src.rkey(),
        src.addr(),
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.byte_len),
        (7, CompletionStatus::Success, WcOpcode::Read, 3000)
    );
    assert_eq!(dst.to_vec(0, 3000).unwrap(), data);
    let _ = &s.rcq;
    (neg(&c.qp), neg(&s.qp))
}

#[test]
fn rfc6581_responder_picks_one_offered_rtr_read_only() {
    let read = RtrSet {
        read: true,
        ..RtrSet::NONE
    };
    assert_eq!(
        connect_with_offer(5501, read),
        (Some(RtrType::Read), Some(RtrType::Read))
    );
}

#[test]
fn rfc6581_responder_picks_one_offered_rtr_write_and_read() {
    let wr = RtrSet {
        write: true,
        read: true,
        send: false,
    };
    // xwarp's Responder prefers Write, as siw does (docs/siw.md §4.3).
    assert_eq!(
        connect_with_offer(5502, wr),
        (Some(RtrType::Write), Some(RtrType::Write))
    );
}

#[test]
fn p2p_offer_empty_or_on_revision_1_is_a_connect_error() {
    let (a, _b) = vwire_pair_simple(Default::default()).unwrap();
    let at = SocketAddr::from(([10, 77, 0, 2], 5503));
    for (revision, set) in [(2, RtrSet::NONE), (1, RtrSet::ALL)] {
        let c = end(&a, revision);
        c.qp.connect_tuned(at, params(), offer(set)).unwrap();
        match c.qp.next_event(T).unwrap() {
            CmEvent::ConnectError(why) => {
                assert!(why.contains("revision"), "{why}");
            }
            e => panic!("revision {revision}, offer {set:?}: expected ConnectError, got {e:?}"),
        }
        // The QP never connected: still usable for a plain connect attempt's state.
        assert!(c.qp.next_event(Duration::from_millis(200)).is_err());
    }
}
