//! The QP state machine seen by the application (`QueuePair::state`, `query`, `modify`,
//! after `ibv_query_qp` / `ibv_modify_qp` and siw's `siw_qp_modify`), and Local
//! Invalidate ordering on the send queue, over the virtual wire.

mod verbs_common;

use std::collections::HashMap;
use std::io;
use std::time::{Duration, Instant};

use verbs_common::*;
use xwarp::poll_driver::vwire::WireConfig;
use xwarp::verbs::{
    CmEvent, CompletionQueue, CompletionStatus, ConnectParams, Listener, MemoryRegion, MpaAttr,
    QpInitAttr, QpModify, QpState, QueuePair, RtrType, SendOpcode, SendRequest, WcOpcode,
    WorkCompletion,
};

/// A virtual wire that delays every frame by `each_way` in both directions.
fn delayed(each_way: Duration) -> WireConfig {
    let mut wire = WireConfig::default();
    for l in [&mut wire.a_to_b, &mut wire.b_to_a] {
        l.delay = each_way;
    }
    wire
}

fn state(qp: &QueuePair) -> QpState {
    qp.state().expect("query")
}

/// Poll `qp` until it reports `want` (the engine moves it asynchronously).
fn wait_state(qp: &QueuePair, want: QpState) {
    let deadline = Instant::now() + T;
    loop {
        let s = state(qp);
        if s == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "state {s:?}, waiting for {want:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn assert_invalid(r: io::Result<()>, what: &str) {
    match r {
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
        other => panic!("{what}: expected InvalidInput, got {other:?}"),
    }
}

/// Collect completions until every id in `ids` was seen; each must come exactly once,
/// and nothing else may follow.
///
/// `settled` is the CM event that ends the teardown producing these completions (the
/// engine pushes every flush of a teardown before its event), or `None` when the caller
/// already waited for it or the teardown was synchronous (modify of a QP that never
/// connected). After everything was seen, a query of `qp` is a barrier: the engine
/// answers it only after every command posted before (commands are applied in order),
/// so a duplicate completion from anything already posted or torn down is in the CQ by
/// then and `poll_one` sees it; no grace period that a late duplicate could outlast.
fn collect_exactly_once(
    cq: &CompletionQueue,
    ids: &[u64],
    qp: &QueuePair,
    settled: Option<&CmEvent>,
) -> HashMap<u64, WorkCompletion> {
    if let Some(ev) = settled {
        expect_event(qp, ev);
    }
    let mut seen: HashMap<u64, WorkCompletion> = HashMap::new();
    while seen.len() < ids.len() {
        let w = cq
            .next(T)
            .unwrap_or_else(|e| panic!("{e}: saw {} of {} completions", seen.len(), ids.len()));
        assert!(ids.contains(&w.wr_id), "unexpected completion {w:?}");
        assert!(seen.insert(w.wr_id, w).is_none(), "second completion {w:?}");
    }
    qp.query().expect("query (engine barrier)");
    assert_eq!(cq.poll_one(), None, "a completion after all were seen");
    seen
}

/// A fresh QP is IDLE and reports what it was created with; connect moves both ends to
/// RTS and query then reports the connection's addresses.
#[test]
fn verbs_qp_is_idle_after_create_and_rts_after_connect() {
    let (a, b) = pair(WireConfig::default());
    let e = end(&a, |q| {
        q.max_send_wr = 32;
        q.max_recv_wr = 16;
        q.max_inline_data = 64;
    });
    let q = e.qp.query().unwrap();
    assert_eq!(q.state, QpState::Idle);
    assert_eq!(q.qp_num, e.qp.qp_num());
    assert_eq!((q.ird, q.ord), (16, 16));
    assert_eq!((q.max_send_wr, q.max_recv_wr), (32, Some(16)));
    assert_eq!(q.max_inline_data, 64);
    assert_eq!(
        (q.mpa.revision, q.mpa.crc, q.mpa.markers),
        (2, false, false)
    );
    assert_eq!(
        (q.negotiated, q.local_addr, q.peer_addr),
        (None, None, None)
    );

    let (c, s) = connect(&a, &b, 6000, |_| {});
    let (qc, qs) = (c.qp.query().unwrap(), s.qp.query().unwrap());
    assert_eq!((qc.state, qs.state), (QpState::Rts, QpState::Rts));
    assert_eq!(qs.local_addr, Some(server_addr(6000)));
    assert_eq!(qc.peer_addr, Some(server_addr(6000)));
    assert_eq!(qs.peer_addr, qc.local_addr);
    assert_eq!(
        qc.local_addr.map(|a| a.ip()),
        a.device().local_ipv4().map(Into::into)
    );
    let nc = qc.negotiated.expect("client negotiated");
    let ns = qs.negotiated.expect("server negotiated");
    assert_eq!((nc.revision, ns.revision), (2, 2));
    assert_eq!((nc.crc, ns.crc), (false, false));
    assert_eq!(nc.p2p_rtr, Some(xwarp::verbs::RtrType::Write));
    assert_eq!(ns.p2p_rtr, Some(xwarp::verbs::RtrType::Write));
}

/// RFC 6581 §3 IRD/ORD negotiation as siw does it: the Responder's ORD is lowered to
/// the Initiator's IRD, the Responder's IRD is raised to the Initiator's ORD when that
/// is at most 128 (siw's relaxed negotiation, docs/siw.md §4.3), and the Initiator
/// lowers its ORD to the Responder's IRD. Query reports the negotiated depths and the
/// peer's advertised ones.
#[test]
fn rfc6581_query_reports_negotiated_ird_ord_min_rules() {
    let (a, b) = pair(WireConfig::default());
    let listener = b.device().listen(server_addr(6001), 4).unwrap();
    let c = end(&a, |q| {
        q.ird = 4;
        q.ord = 200;
    });
    let s = end(&b, |q| {
        q.ird = 16;
        q.ord = 8;
    });
    c.qp.connect(server_addr(6001), ConnectParams::default())
        .unwrap();
    let req = listener.get_request(T).unwrap();
    assert_eq!((req.peer_ird, req.peer_ord), (Some(4), Some(200)));
    req.accept(&s.qp, b"").unwrap();
    let (ec, es) = (c.qp.next_event(T).unwrap(), s.qp.next_event(T).unwrap());
    assert!(
        matches!(
            ec,
            CmEvent::Established {
                ird: 4,
                ord: 16,
                ..
            }
        ),
        "{ec:?}"
    );
    assert!(
        matches!(
            es,
            CmEvent::Established {
                ird: 16,
                ord: 4,
                ..
            }
        ),
        "{es:?}"
    );
    let (qc, qs) = (c.qp.query().unwrap(), s.qp.query().unwrap());
    // Server ORD 8 -> min(8, client IRD 4); client ORD 200 -> min(200, server IRD 16);
    // client ORD 200 > 128, so the server's IRD is not raised.
    assert_eq!((qc.ird, qc.ord), (4, 16));
    assert_eq!((qs.ird, qs.ord), (16, 4));
    let (nc, ns) = (qc.negotiated.unwrap(), qs.negotiated.unwrap());
    assert_eq!((nc.peer_ird, nc.peer_ord), (Some(16), Some(4)));
    assert_eq!((ns.peer_ird, ns.peer_ord), (Some(4), Some(200)));
    // Every ORD is within the peer's IRD.
    assert!(qc.ord <= qs.ird && qs.ord <= qc.ird);
    // The requested values stay visible next to the negotiated ones: the relaxed rule
    // raises the server's IRD from the requested 2 to the client's ORD 8.
    let listener2 = b.device().listen(server_addr(6002), 4).unwrap();
    let c2 = end(&a, |q| {
        q.ird = 4;
        q.ord = 8;
    });
    let s2 = end(&b, |q| {
        q.ird = 2;
        q.ord = 16;
    });
    c2.qp
        .connect(server_addr(6002), ConnectParams::default())
        .unwrap();
    listener2
        .get_request(T)
        .unwrap()
        .accept(&s2.qp, b"")
        .unwrap();
    c2.qp.next_event(T).unwrap();
    s2.qp.next_event(T).unwrap();
    let (qc, qs) = (c2.qp.query().unwrap(), s2.qp.query().unwrap());
    assert_eq!((qs.ird, qs.ord), (8, 4));
    assert_eq!((qc.ird, qc.ord), (4, 8));
}

/// Attributes may change in IDLE before connect (siw/rdma-core: they are negotiated at
/// connect time); CRC asked by one side is used by both (RFC 5044 §7.1.2).
#[test]
fn verbs_modify_attributes_before_connect_take_effect() {
    let (a, b) = pair(WireConfig::default());
    let listener = b.device().listen(server_addr(6003), 4).unwrap();
    let c = end(&a, |_| {});
    let s = end(&b, |_| {});
    c.qp.modify(&QpModify {
        ird: Some(3),
        ord: Some(5),
        crc: Some(true),
        max_inline_data: Some(8),
        ..QpModify::default()
    })
    .unwrap();
    s.qp.modify(&QpModify {
        markers: Some(true),
        ..QpModify::default()
    })
    .unwrap();
    let q = c.qp.query().unwrap();
    assert_eq!(
        (q.state, q.ird, q.ord, q.mpa.crc),
        (QpState::Idle, 3, 5, true)
    );
    assert_eq!(q.max_inline_data, 8);
    assert!(s.qp.query().unwrap().mpa.markers);
    // The new inline limit applies at once.
    let big = SendRequest {
        inline: Some(vec![1; 9]),
        ..SendRequest::send(1, vec![])
    };
    assert!(c.qp.post_send(big).is_err());

    c.qp.connect(server_addr(6003), ConnectParams::default())
        .unwrap();
    let req = listener.get_request(T).unwrap();
    assert!(req.crc);
    assert_eq!((req.peer_ird, req.peer_ord), (Some(3), Some(5)));
    req.accept(&s.qp, b"").unwrap();
    assert!(matches!(
        c.qp.next_event(T).unwrap(),
        CmEvent::Established { crc: true, .. }
    ));
    assert!(matches!(
        s.qp.next_event(T).unwrap(),
        CmEvent::Established { crc: true, .. }
    ));
    let (nc, ns) = (
        c.qp.query().unwrap().negotiated.unwrap(),
        s.qp.query().unwrap().negotiated.unwrap(),
    );
    assert!(nc.crc && ns.crc);
    // The server asked for markers in what it receives: the client inserts them.
    assert!(nc.markers_tx && ns.markers_rx);
    assert!(!nc.markers_rx && !ns.markers_tx);

    // Data moves with the changed settings (CRC + markers), an 8-byte inline Send too.
    let sbuf = mr(&s, 4096);
    s.qp.post_recv(7, &[sbuf.sge(0, 64).unwrap()]).unwrap();
    c.qp.post_send(SendRequest {
        inline: Some(b"8 bytes!".to_vec()),
        ..SendRequest::send(2, vec![])
    })
    .unwrap();
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (7, CompletionStatus::Success, 8)
    );
    assert_eq!(sbuf.to_vec(0, 8).unwrap(), b"8 bytes!");
    assert_eq!(wc(&c.scq).status, CompletionStatus::Success);
}

/// siw_qp_modify: attribute changes after the connection started, RTS from IDLE (only
/// connect/accept enter it), IDLE → CLOSING/TERMINATE, RTS → IDLE are refused with
/// InvalidInput and change nothing; to the current state is accepted and does nothing.
#[test]
fn siw_qp_modify_illegal_transitions_are_invalid_input() {
    let (a, b) = pair(WireConfig::default());
    let idle = end(&a, |_| {});
    for to in [QpState::Rts, QpState::Closing, QpState::Terminate] {
        assert_invalid(
            idle.qp.modify(&QpModify::to_state(to)),
            &format!("Idle -> {to:?}"),
        );
    }
    assert_invalid(
        idle.qp.modify(&QpModify {
            ird: Some(0x4000),
            ..QpModify::default()
        }),
        "IRD above the 14-bit MPA v2 field",
    );
    idle.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    assert_eq!(state(&idle.qp), QpState::Idle);
    assert_eq!(idle.qp.query().unwrap().ird, 16, "refused change applied");

    let (c, s) = connect(&a, &b, 6004, |_| {});
    for (what, m) in [
        (
            "IRD after RTS",
            QpModify {
                ird: Some(2),
                ..QpModify::default()
            },
        ),
        (
            "ORD after RTS",
            QpModify {
                ord: Some(2),
                ..QpModify::default()
            },
        ),
        (
            "CRC after RTS",
            QpModify {
                crc: Some(true),
                ..QpModify::default()
            },
        ),
        (
            "markers after RTS",
            QpModify {
                markers: Some(true),
                ..QpModify::default()
            },
        ),
        (
            "max inline after RTS",
            QpModify {
                max_inline_data: Some(1),
                ..QpModify::default()
            },
        ),
        ("Rts -> Idle", QpModify::to_state(QpState::Idle)),
        (
            "Rts -> Error with an attribute",
            QpModify {
                state: Some(QpState::Error),
                crc: Some(true),
                ..QpModify::default()
            },
        ),
    ] {
        assert_invalid(c.qp.modify(&m), what);
    }
    c.qp.modify(&QpModify::to_state(QpState::Rts)).unwrap();
    assert_eq!(state(&c.qp), QpState::Rts);
    let q = c.qp.query().unwrap();
    assert_eq!(
        (q.ird, q.ord, q.mpa.crc, q.max_inline_data),
        (16, 16, false, 256)
    );
    // Still works.
    let sbuf = mr(&s, 64);
    s.qp.post_recv(1, &[sbuf.sge(0, 64).unwrap()]).unwrap();
    c.qp.post_send(SendRequest {
        inline: Some(b"alive".to_vec()),
        ..SendRequest::send(1, vec![])
    })
    .unwrap();
    assert_eq!(wc(&s.rcq).byte_len, 5);
    assert_eq!(sbuf.to_vec(0, 5).unwrap(), b"alive");
}

/// IDLE → ERROR (siw: flush, state ERROR): work queued before connect completes with
/// WrFlushError exactly once, later work too; from ERROR only a reset to IDLE is possible
/// (every other target is InvalidInput); in ERROR the QP cannot connect and takes no
/// attributes without the reset.
#[test]
fn siw_modify_idle_to_error_flushes_queued_work_and_only_reset_leaves_error() {
    let (a, _b) = pair(WireConfig::default());
    let e = end(&a, |_| {});
    let m = mr(&e, 4096);
    for i in 0..4u64 {
        e.qp.post_recv(100 + i, &[m.sge(0, 64).unwrap()]).unwrap();
        e.qp.post_send(SendRequest::send(i, vec![m.sge(0, 8).unwrap()]))
            .unwrap();
    }
    e.qp.post_send(SendRequest::new(
        9,
        SendOpcode::LocalInvalidate(m.lkey()),
        vec![],
    ))
    .unwrap();
    e.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    assert_eq!(state(&e.qp), QpState::Error);
    // modify of a never-connected QP flushes before it returns: no event to wait for.
    let sends = collect_exactly_once(&e.scq, &[0, 1, 2, 3, 9], &e.qp, None);
    assert!(sends
        .values()
        .all(|w| w.status == CompletionStatus::WrFlushError));
    assert_eq!(sends[&9].opcode, WcOpcode::LocalInvalidate);
    let recvs = collect_exactly_once(&e.rcq, &[100, 101, 102, 103], &e.qp, None);
    assert!(recvs
        .values()
        .all(|w| w.status == CompletionStatus::WrFlushError && w.opcode == WcOpcode::Recv));
    // Later work is flushed as well.
    e.qp.post_send(SendRequest::send(20, vec![m.sge(0, 8).unwrap()]))
        .unwrap();
    e.qp.post_recv(120, &[m.sge(0, 8).unwrap()]).unwrap();
    assert_eq!(wc(&e.scq).status, CompletionStatus::WrFlushError);
    assert_eq!(wc(&e.rcq).status, CompletionStatus::WrFlushError);
    // From ERROR only the reset (tested with connections below).
    for to in [QpState::Rts, QpState::Closing, QpState::Terminate] {
        assert_invalid(
            e.qp.modify(&QpModify::to_state(to)),
            &format!("Error -> {to:?}"),
        );
    }
    assert_invalid(
        e.qp.modify(&QpModify {
            ord: Some(1),
            ..QpModify::default()
        }),
        "attributes in ERROR",
    );
    e.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    e.qp.connect(server_addr(6005), ConnectParams::default())
        .unwrap();
    assert!(matches!(
        e.qp.next_event(T).unwrap(),
        CmEvent::ConnectError(_)
    ));
    assert_eq!(state(&e.qp), QpState::Error);
}

/// RTS → CLOSING is a graceful disconnect (RFC 5040 §6, verbs disconnect): queued work
/// drains, both ends see Disconnected; the closing side ends IDLE (as siw after a clean
/// close), the side whose peer closed ends ERROR (siw: LLP close in RTS). CLOSING →
/// RTS/TERMINATE is refused.
#[test]
fn rfc5040_modify_to_closing_is_a_graceful_disconnect() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 6006, |_| {});
    let src = mr(&c, 256 * 1024);
    let dst = mr(&s, 256 * 1024);
    let data = pattern(256 * 1024, 5);
    src.write(0, &data).unwrap();
    c.qp.post_send(SendRequest::write(
        1,
        vec![src.sge_all().unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    s.qp.post_recv(1, &[dst.sge(0, 16).unwrap()]).unwrap();
    s.qp.post_recv(2, &[dst.sge(16, 16).unwrap()]).unwrap();
    c.qp.modify(&QpModify::to_state(QpState::Closing)).unwrap();
    let st = state(&c.qp);
    assert!(matches!(st, QpState::Closing | QpState::Idle), "{st:?}");
    if st == QpState::Closing {
        // CLOSING → IDLE is tested on a slow wire below (here the close may finish in
        // between, and IDLE → IDLE after a close is a reset).
        for to in [QpState::Rts, QpState::Terminate] {
            let r = c.qp.modify(&QpModify::to_state(to));
            // The close may have finished meanwhile (then IDLE → x is judged).
            if state(&c.qp) == QpState::Closing {
                assert_invalid(r, &format!("Closing -> {to:?}"));
            }
        }
    }
    assert_eq!(wc(&c.scq).status, CompletionStatus::Success);
    expect_event(&c.qp, &CmEvent::Disconnected);
    expect_event(&s.qp, &CmEvent::Disconnected);
    wait_state(&c.qp, QpState::Idle);
    wait_state(&s.qp, QpState::Error);
    // The Write drained before the close; the server's receives were flushed once each.
    // Disconnected on `s` was awaited above.
    let r = collect_exactly_once(&s.rcq, &[1, 2], &s.qp, None);
    assert!(r
        .values()
        .all(|w| w.status == CompletionStatus::WrFlushError));
    let mut got = vec![0u8; data.len()];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got[32..], data[32..]);
    // Work after the close is flushed.
    c.qp.post_send(SendRequest::send(2, vec![src.sge(0, 4).unwrap()]))
        .unwrap();
    assert_eq!(wc(&c.scq).status, CompletionStatus::WrFlushError);
}

/// RTS → TERMINATE (siw: Terminate, RDMAP layer, local catastrophic, unspecified, then
/// the connection drops): the peer receives that Terminate (layer 0, etype 0, code
/// 0xff), we report it sent, both ends see Disconnected and end in ERROR.
#[test]
fn rfc5040_modify_to_terminate_sends_a_terminate() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 6007, |_| {});
    let m = mr(&s, 64);
    s.qp.post_recv(1, &[m.sge(0, 64).unwrap()]).unwrap();
    c.qp.modify(&QpModify::to_state(QpState::Terminate))
        .unwrap();
    let st = state(&c.qp);
    assert!(matches!(st, QpState::Terminate | QpState::Error), "{st:?}");
    let (sent, received) = term(0, 0, 0xff);
    expect_events(&s.qp, &[received, CmEvent::Disconnected]);
    expect_events(&c.qp, &[sent, CmEvent::Disconnected]);
    wait_state(&c.qp, QpState::Error);
    wait_state(&s.qp, QpState::Error);
    // The peer's receive was flushed by its ERROR.
    let r = wc(&s.rcq);
    assert_eq!((r.wr_id, r.status), (1, CompletionStatus::WrFlushError));
    // ERROR -> ERROR is a no-op.
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
}

/// RTS → ERROR during traffic (siw: "emergency close", flush SQ and RQ, drop the
/// connection): every work request gets exactly one completion, data reported complete
/// is correct, work posted afterwards is flushed, the connection is reset (the peer
/// counts the reset, sees Disconnected and its receives flush exactly once).
#[test]
fn siw_modify_to_error_during_traffic_flushes_everything_exactly_once() {
    const CHUNK: usize = 64 * 1024;
    const N: u64 = 48;
    // A slow line (4 Mbit/s each way, a queue deep enough not to tail-drop): the ~3 MiB
    // of work takes about 6 s on the wire, so the abort below (three completions in,
    // about 0.3 s) lands mid-traffic even if this thread is descheduled for seconds on a
    // loaded machine. The abort ends the traffic, so the test itself stays short.
    let mut wire = WireConfig::default();
    for l in [&mut wire.a_to_b, &mut wire.b_to_a] {
        l.rate_bps = 4_000_000;
        l.rate_queue = Duration::from_secs(2);
    }
    let (a, b) = pair(wire);
    let (c, s) = connect(&a, &b, 6008, |_| {});
    let csrc = mr(&c, 32 * CHUNK);
    let csink = mr(&c, 32 * CHUNK);
    let ssink = mr(&s, 64 * CHUNK);
    let sread = mr(&s, 32 * CHUNK);
    let src_data = pattern(32 * CHUNK, 11);
    let read_data = pattern(32 * CHUNK, 12);
    csrc.write(0, &src_data).unwrap();
    sread.write(0, &read_data).unwrap();
    let recv_ids: Vec<u64> = (1000..1032).collect();
    for (m, id) in recv_ids.iter().enumerate() {
        s.qp.post_recv(*id, &[ssink.sge(m * CHUNK, CHUNK).unwrap()])
            .unwrap();
    }
    let mut reads = Vec::new();
    let (mut nsend, mut nread) = (0usize, 0usize);
    // A Local Invalidate in the middle: the work behind it is held in the engine until
    // the work before it completed, and must be flushed from there too.
    let victim = mr(&c, 64);
    const LI: u64 = N / 2;
    for i in 0..N {
        let wr = match i % 3 {
            _ if i == LI => SendRequest::new(i, SendOpcode::LocalInvalidate(victim.lkey()), vec![]),
            0 => {
                nsend += 1;
                SendRequest::send(i, vec![csrc.sge((nsend - 1) * CHUNK, CHUNK).unwrap()])
            }
            1 => SendRequest::write(
                i,
                vec![csrc.sge((i as usize % 32) * CHUNK, CHUNK).unwrap()],
                ssink.rkey(),
                ssink.addr() + (32 + i as usize % 32) as u64 * CHUNK as u64,
            ),
            _ => {
                let j = nread;
                nread += 1;
                reads.push((i, j));
                SendRequest::read(
                    i,
                    csink.sge(j * CHUNK, CHUNK).unwrap(),
                    sread.rkey(),
                    sread.addr() + (j * CHUNK) as u64,
                )
            }
        };
        c.qp.post_send(wr).unwrap();
    }
    // Abort once traffic is moving (three completions in).
    let early: Vec<WorkCompletion> = (0..3).map(|_| wc(&c.scq)).collect();
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    assert_eq!(state(&c.qp), QpState::Error);
    c.qp.post_send(SendRequest::send(N, vec![csrc.sge(0, 8).unwrap()]))
        .unwrap();
    c.qp.post_recv(N + 1, &[csink.sge(0, 8).unwrap()]).unwrap();

    let ids: Vec<u64> = (0..=N)
        .filter(|i| !early.iter().any(|w| w.wr_id == *i))
        .collect();
    let started = Instant::now();
    let mut all = collect_exactly_once(&c.scq, &ids, &c.qp, Some(&CmEvent::Disconnected));
    for w in early {
        assert!(all.insert(w.wr_id, w).is_none());
    }
    let ok = all
        .values()
        .filter(|w| w.status == CompletionStatus::Success)
        .count();
    let flushed = all
        .values()
        .filter(|w| w.status == CompletionStatus::WrFlushError)
        .count();
    assert_eq!(ok + flushed, all.len(), "only success or flush: {all:?}");
    let flushed_before = all
        .values()
        .filter(|w| w.wr_id < N && w.status == CompletionStatus::WrFlushError)
        .count();
    eprintln!(
        "flushed {flushed_before} of {N}; teardown took {:?}",
        started.elapsed()
    );
    assert!(
        flushed_before > 0,
        "the abort came after everything completed"
    );
    assert_eq!(all[&LI].opcode, WcOpcode::LocalInvalidate);
    assert_eq!(all[&N].status, CompletionStatus::WrFlushError);
    for (id, j) in &reads {
        if all[id].status == CompletionStatus::Success {
            assert_eq!(all[id].byte_len as usize, CHUNK);
            assert_eq!(
                csink.to_vec(j * CHUNK, CHUNK).unwrap(),
                read_data[j * CHUNK..(j + 1) * CHUNK],
                "Read {id} reported complete with wrong data"
            );
        }
    }
    let r = wc(&c.rcq);
    assert_eq!((r.wr_id, r.status), (N + 1, CompletionStatus::WrFlushError));

    // The peer: reset counted, Disconnected, receives completed exactly once each, the
    // ones reported complete hold the Sends' bytes in order.
    let recvs = collect_exactly_once(&s.rcq, &recv_ids, &s.qp, Some(&CmEvent::Disconnected));
    assert!(b.stack_stats().resets >= 1, "{:?}", b.stack_stats());
    for (m, id) in recv_ids.iter().enumerate() {
        let w = recvs[id];
        match w.status {
            CompletionStatus::Success => {
                assert_eq!(w.byte_len as usize, CHUNK);
                assert_eq!(
                    ssink.to_vec(m * CHUNK, CHUNK).unwrap(),
                    src_data[m * CHUNK..(m + 1) * CHUNK]
                );
            }
            CompletionStatus::WrFlushError => {}
            other => panic!("receive {id}: {other:?}"),
        }
    }
    wait_state(&s.qp, QpState::Error);
    assert_eq!(state(&c.qp), QpState::Error);
}

/// Local Invalidate ordering (verbs: send work is processed in order): a Write posted
/// before a Local Invalidate of its source STag completes successfully with its data
/// delivered, then the Local Invalidate completes, and a Write posted after it that
/// uses the STag fails with LocalProtectionError.
#[test]
fn verbs_local_invalidate_waits_for_an_earlier_write_from_the_stag() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 6009, |_| {});
    let src = mr(&c, 2 << 20);
    let dst = mr(&s, 2 << 20);
    let data = pattern(2 << 20, 21);
    src.write(0, &data).unwrap();
    c.qp.post_send(SendRequest::write(
        1,
        vec![src.sge_all().unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    c.qp.post_send(SendRequest::new(
        2,
        SendOpcode::LocalInvalidate(src.lkey()),
        vec![],
    ))
    .unwrap();
    c.qp.post_send(SendRequest::write(
        3,
        vec![src.sge(0, 16).unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    let w1 = wc(&c.scq);
    assert_eq!((w1.wr_id, w1.status), (1, CompletionStatus::Success));
    let w2 = wc(&c.scq);
    assert_eq!(
        (w2.wr_id, w2.opcode, w2.status),
        (2, WcOpcode::LocalInvalidate, CompletionStatus::Success)
    );
    let w3 = wc(&c.scq);
    assert_eq!(
        (w3.wr_id, w3.status),
        (3, CompletionStatus::LocalProtectionError)
    );
    // The first Write's bytes arrived (a Send after it would be refused now: the QP
    // took a local error; read the server's region once its side settled).
    let deadline = Instant::now() + T;
    while dst.to_vec(0, data.len()).unwrap() != data {
        assert!(Instant::now() < deadline, "Write data incomplete");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Local Invalidate ordering: an unfenced Local Invalidate of a Read's sink STag posted
/// right after the Read waits until the Read Response was placed (the Read completes
/// with the right data), then invalidates; a later Read into the STag is refused.
#[test]
fn verbs_local_invalidate_waits_for_an_earlier_read_into_the_stag() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 6010, |_| {});
    let sink = mr(&c, 1 << 20);
    let remote = mr(&s, 1 << 20);
    let data = pattern(1 << 20, 31);
    remote.write(0, &data).unwrap();
    c.qp.post_send(SendRequest::read(
        1,
        sink.sge_all().unwrap(),
        remote.rkey(),
        remote.addr(),
    ))
    .unwrap();
    let li = SendRequest::new(2, SendOpcode::LocalInvalidate(sink.lkey()), vec![]);
    assert!(!li.fence);
    c.qp.post_send(li).unwrap();
    c.qp.post_send(SendRequest::read(
        3,
        sink.sge(0, 64).unwrap(),
        remote.rkey(),
        remote.addr(),
    ))
    .unwrap();
    let w1 = wc(&c.scq);
    assert_eq!(
        (w1.wr_id, w1.status, w1.byte_len),
        (1, CompletionStatus::Success, 1 << 20)
    );
    assert_eq!(sink.to_vec(0, 1 << 20).unwrap(), data);
    let w2 = wc(&c.scq);
    assert_eq!((w2.wr_id, w2.status), (2, CompletionStatus::Success));
    let w3 = wc(&c.scq);
    assert_eq!(
        (w3.wr_id, w3.status),
        (3, CompletionStatus::LocalProtectionError)
    );
}

/// A Local Invalidate posted before the connection is up waits for it and for the work
/// posted before it; completions come in posting order; an unsignaled one that
/// succeeds completes silently, while a Send after it goes out normally.
#[test]
fn verbs_local_invalidate_posted_before_connect_keeps_posting_order() {
    let (a, b) = pair(WireConfig::default());
    let listener = b.device().listen(server_addr(6011), 4).unwrap();
    let c = end(&a, |_| {});
    let s = end(&b, |_| {});
    let src = mr(&c, 128 * 1024);
    let other = mr(&c, 4096);
    let dst = mr(&s, 256 * 1024);
    let data = pattern(128 * 1024, 41);
    src.write(0, &data).unwrap();
    other.write(0, b"after").unwrap();
    // Posted while IDLE: a Write from `src`, a Local Invalidate of `src`, a Send from
    // `other` (still valid, so it goes out behind the Local Invalidate).
    c.qp.post_send(SendRequest::write(
        1,
        vec![src.sge_all().unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    c.qp.post_send(SendRequest::new(
        2,
        SendOpcode::LocalInvalidate(src.lkey()),
        vec![],
    ))
    .unwrap();
    c.qp.post_send(SendRequest::send(3, vec![other.sge(0, 5).unwrap()]))
        .unwrap();
    s.qp.post_recv(9, &[dst.sge(200 * 1024, 64).unwrap()])
        .unwrap();
    assert_eq!(c.scq.poll_one(), None);
    c.qp.connect(server_addr(6011), ConnectParams::default())
        .unwrap();
    listener.get_request(T).unwrap().accept(&s.qp, b"").unwrap();
    let ids: Vec<(u64, CompletionStatus)> = (0..3)
        .map(|_| {
            let w = wc(&c.scq);
            (w.wr_id, w.status)
        })
        .collect();
    assert_eq!(
        ids,
        vec![
            (1, CompletionStatus::Success),
            (2, CompletionStatus::Success),
            (3, CompletionStatus::Success)
        ]
    );
    let r = wc(&s.rcq);
    assert_eq!((r.wr_id, r.byte_len), (9, 5));
    assert_eq!(dst.to_vec(200 * 1024, 5).unwrap(), b"after");
    assert_eq!(dst.to_vec(0, data.len()).unwrap(), data);
    // An unsignaled Local Invalidate that succeeds produces no completion.
    let mut li = SendRequest::new(4, SendOpcode::LocalInvalidate(other.lkey()), vec![]);
    li.signaled = false;
    c.qp.post_send(li).unwrap();
    c.qp.post_send(SendRequest::write(
        5,
        vec![other.sge(0, 5).unwrap()],
        dst.rkey(),
        dst.addr(),
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.wr_id, w.status),
        (5, CompletionStatus::LocalProtectionError)
    );
}

/// On `c`: Read all of `remote` into `sink` (wr 1), Local Invalidate `victim` (wr 2, held
/// behind the Read), Send the first 4 bytes of `note` (wr 3, held behind it), then
/// `disconnect` while that work is still held.
fn post_read_invalidate_send_disconnect(
    c: &End,
    sink: &MemoryRegion,
    remote: &MemoryRegion,
    victim: &MemoryRegion,
    note: &MemoryRegion,
) {
    c.qp.post_send(SendRequest::read(
        1,
        sink.sge_all().unwrap(),
        remote.rkey(),
        remote.addr(),
    ))
    .unwrap();
    c.qp.post_send(SendRequest::new(
        2,
        SendOpcode::LocalInvalidate(victim.lkey()),
        vec![],
    ))
    .unwrap();
    c.qp.post_send(SendRequest::send(3, vec![note.sge(0, 4).unwrap()]))
        .unwrap();
    c.qp.disconnect().unwrap();
}

/// A graceful disconnect right after a Local Invalidate that is still waiting: the work
/// behind the Local Invalidate still drains (RFC 5040 §6 graceful close: queued work
/// completes), then the connection closes and the QP ends IDLE.
#[test]
fn rfc5040_disconnect_drains_work_held_behind_a_local_invalidate() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 6012, |_| {});
    let sink = mr(&c, 1 << 20);
    let victim = mr(&c, 64);
    let note = mr(&c, 64);
    let remote = mr(&s, 1 << 20);
    let data = pattern(1 << 20, 51);
    remote.write(0, &data).unwrap();
    note.write(0, b"last").unwrap();
    s.qp.post_recv(7, &[remote.sge(0, 64).unwrap()]).unwrap();
    post_read_invalidate_send_disconnect(&c, &sink, &remote, &victim, &note);
    let st = state(&c.qp);
    assert!(matches!(st, QpState::Closing | QpState::Idle), "{st:?}");
    let got: Vec<(u64, CompletionStatus)> = (0..3)
        .map(|_| {
            let w = wc(&c.scq);
            (w.wr_id, w.status)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (1, CompletionStatus::Success),
            (2, CompletionStatus::Success),
            (3, CompletionStatus::Success)
        ]
    );
    assert_eq!(sink.to_vec(0, 1 << 20).unwrap(), data);
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (7, CompletionStatus::Success, 4)
    );
    assert_eq!(remote.to_vec(0, 4).unwrap(), b"last");
    expect_event(&c.qp, &CmEvent::Disconnected);
    expect_event(&s.qp, &CmEvent::Disconnected);
    wait_state(&c.qp, QpState::Idle);
}

/// A QP is bound to one connection: accepting a second request on a QP that is already
/// connected is refused to the caller (`InvalidInput`, as rdma_accept's EINVAL), the used
/// QP gets no event of it and stays RTS and keeps working, and the second Initiator's
/// connection is dropped. A QP in ERROR is refused the same way.
#[test]
fn verbs_accept_on_a_used_qp_is_refused() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 6013, |_| {});
    let listener = b.device().listen(server_addr(6014), 4).unwrap();
    let c2 = end(&a, |_| {});
    c2.qp
        .connect(server_addr(6014), ConnectParams::default())
        .unwrap();
    let r = listener.get_request(T).unwrap().accept(&s.qp, b"");
    assert_invalid(r, "accept on a connected QP");
    match c2.qp.next_event(T).unwrap() {
        CmEvent::ConnectError(_) | CmEvent::Disconnected => {}
        e => panic!("second initiator: {e:?}"),
    }
    // Accept was answered synchronously and the second connection is gone: had the
    // refusal been queued on the used QP, it would be there now.
    assert_eq!(s.qp.poll_event(), None, "the used QP got an event");
    // A QP in ERROR (never connected) is refused too.
    let dead = end(&b, |_| {});
    dead.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    let c3 = end(&a, |_| {});
    c3.qp
        .connect(server_addr(6014), ConnectParams::default())
        .unwrap();
    let r = listener.get_request(T).unwrap().accept(&dead.qp, b"");
    assert_invalid(r, "accept on a QP in ERROR");
    match c3.qp.next_event(T).unwrap() {
        CmEvent::ConnectError(_) | CmEvent::Disconnected => {}
        e => panic!("third initiator: {e:?}"),
    }
    assert_eq!(dead.qp.poll_event(), None);
    assert_eq!(state(&dead.qp), QpState::Error);
    assert_eq!(state(&s.qp), QpState::Rts);
    let m = mr(&s, 64);
    s.qp.post_recv(1, &[m.sge(0, 64).unwrap()]).unwrap();
    c.qp.post_send(SendRequest {
        inline: Some(b"still".to_vec()),
        ..SendRequest::send(1, vec![])
    })
    .unwrap();
    assert_eq!(wc(&s.rcq).byte_len, 5);
    assert_eq!(m.to_vec(0, 5).unwrap(), b"still");
}

/// modify(ERROR) while the TCP handshake is still running (siw: IDLE → ERROR aborts the
/// connect): when the handshake then completes, no iWARP connection is built on it (no
/// MPA Request reaches the listener, early work is not handed to one), the TCP connection
/// is reset, the QP stays ERROR, the connect ends with ConnectError (not Disconnected)
/// and work posted before and after the modify is flushed exactly once.
#[test]
fn siw_modify_to_error_during_the_tcp_handshake_aborts_the_connect() {
    // 150 ms each way: the SYN-ACK arrives long after the modify.
    let (a, b) = pair(delayed(Duration::from_millis(150)));
    let listener = b.device().listen(server_addr(6015), 4).unwrap();
    let c = end(&a, |_| {});
    let m = mr(&c, 64);
    c.qp.connect(server_addr(6015), ConnectParams::default())
        .unwrap();
    c.qp.post_send(SendRequest::send(1, vec![m.sge(0, 8).unwrap()]))
        .unwrap();
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    assert_eq!(state(&c.qp), QpState::Error);
    c.qp.post_send(SendRequest::send(2, vec![m.sge(0, 8).unwrap()]))
        .unwrap();
    c.qp.post_recv(3, &[m.sge(0, 8).unwrap()]).unwrap();
    match c.qp.next_event(T).unwrap() {
        CmEvent::ConnectError(_) => {}
        e => panic!("expected ConnectError, got {e:?}"),
    }
    assert_eq!(state(&c.qp), QpState::Error);
    let sends = collect_exactly_once(&c.scq, &[1, 2], &c.qp, None);
    assert!(sends
        .values()
        .all(|w| w.status == CompletionStatus::WrFlushError));
    let r = collect_exactly_once(&c.rcq, &[3], &c.qp, None);
    assert_eq!(r[&3].status, CompletionStatus::WrFlushError);
    // Whatever the handshake left behind has had time to arrive: no MPA Request came.
    assert!(listener.get_request(Duration::from_millis(500)).is_err());
    assert_eq!(c.qp.poll_event(), None);
}

/// `max_inline_data` is bounded (it sizes a per-QP buffer of `max_inline_data ×
/// max_send_wr` bytes): more than `MAX_INLINE_DATA`, or a buffer over
/// `MAX_INLINE_BUFFER`, is `InvalidInput` at create and at modify (which then changes
/// nothing), instead of an allocation that aborts the engine; the engine keeps working
/// and the largest legal value carries an inline Send of that size.
#[test]
fn verbs_max_inline_data_is_bounded() {
    use xwarp::verbs::{QpInitAttr, MAX_INLINE_BUFFER, MAX_INLINE_DATA};
    let (a, b) = pair(WireConfig::default());
    let dev = a.device();
    let pd = dev.alloc_pd();
    let (scq, rcq) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
    for (inline, depth) in [
        (MAX_INLINE_DATA + 1, 1),
        (usize::MAX, 1),
        (usize::MAX / 2, 4),
        (MAX_INLINE_DATA, MAX_INLINE_BUFFER / MAX_INLINE_DATA + 1),
    ] {
        let mut at = QpInitAttr::new(&scq, &rcq);
        at.max_inline_data = inline;
        at.max_send_wr = depth;
        match pd.create_qp(&at) {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
            other => panic!("create inline {inline} depth {depth}: {other:?}"),
        }
    }
    let e = end(&a, |q| {
        q.max_send_wr = 4;
        q.max_inline_data = 64;
    });
    for n in [MAX_INLINE_DATA + 1, usize::MAX] {
        assert_invalid(
            e.qp.modify(&QpModify {
                max_inline_data: Some(n),
                ..QpModify::default()
            }),
            &format!("modify max_inline_data {n}"),
        );
        assert_eq!(e.qp.query().unwrap().max_inline_data, 64);
    }
    e.qp.modify(&QpModify {
        max_inline_data: Some(MAX_INLINE_DATA),
        ..QpModify::default()
    })
    .unwrap();
    assert_eq!(e.qp.query().unwrap().max_inline_data, MAX_INLINE_DATA);

    // The engine is alive and the bound is usable: connect `e` and Send that much inline.
    let listener = b.device().listen(server_addr(6016), 4).unwrap();
    let s = end(&b, |_| {});
    let sink = mr(&s, MAX_INLINE_DATA);
    s.qp.post_recv(1, &[sink.sge_all().unwrap()]).unwrap();
    e.qp.connect(server_addr(6016), ConnectParams::default())
        .unwrap();
    listener.get_request(T).unwrap().accept(&s.qp, b"").unwrap();
    assert!(matches!(
        e.qp.next_event(T).unwrap(),
        CmEvent::Established { .. }
    ));
    let data = pattern(MAX_INLINE_DATA, 61);
    e.qp.post_send(SendRequest {
        inline: Some(data.clone()),
        ..SendRequest::send(9, vec![])
    })
    .unwrap();
    assert_eq!(wc(&e.scq).status, CompletionStatus::Success);
    let r = wc(&s.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len as usize),
        (1, CompletionStatus::Success, MAX_INLINE_DATA)
    );
    assert_eq!(sink.to_vec(0, MAX_INLINE_DATA).unwrap(), data);
}

/// Work posted after a graceful disconnect that waits behind a Local Invalidate is not
/// executed (the QP is CLOSING and takes no new work): it is flushed, while the work
/// posted before the disconnect still drains in order and the peer receives only that.
#[test]
fn rfc5040_work_posted_after_disconnect_is_flushed_not_run_before_the_close() {
    // 20 ms each way: the Read is surely outstanding (the Local Invalidate held) when
    // the disconnect and the later work arrive.
    let (a, b) = pair(delayed(Duration::from_millis(20)));
    let (c, s) = connect(&a, &b, 6017, |_| {});
    let sink = mr(&c, 256 * 1024);
    let victim = mr(&c, 64);
    let note = mr(&c, 64);
    let remote = mr(&s, 256 * 1024);
    let data = pattern(256 * 1024, 71);
    remote.write(0, &data).unwrap();
    note.write(0, b"lastlate").unwrap();
    s.qp.post_recv(7, &[remote.sge(0, 64).unwrap()]).unwrap();
    s.qp.post_recv(8, &[remote.sge(64, 64).unwrap()]).unwrap();
    post_read_invalidate_send_disconnect(&c, &sink, &remote, &victim, &note);
    // Posted after the disconnect: must not run (4 would reach the peer's receive 8).
    c.qp.post_send(SendRequest::send(4, vec![note.sge(4, 4).unwrap()]))
        .unwrap();
    c.qp.post_send(SendRequest::new(
        5,
        SendOpcode::LocalInvalidate(note.lkey()),
        vec![],
    ))
    .unwrap();
    c.qp.post_recv(6, &[sink.sge(0, 8).unwrap()]).unwrap();
    let got = collect_exactly_once(
        &c.scq,
        &[1, 2, 3, 4, 5],
        &c.qp,
        Some(&CmEvent::Disconnected),
    );
    let status = |id: u64| (got[&id].status, got[&id].opcode);
    assert_eq!(status(1), (CompletionStatus::Success, WcOpcode::Read));
    assert_eq!(
        status(2),
        (CompletionStatus::Success, WcOpcode::LocalInvalidate)
    );
    assert_eq!(status(3), (CompletionStatus::Success, WcOpcode::Send));
    assert_eq!(status(4), (CompletionStatus::WrFlushError, WcOpcode::Send));
    assert_eq!(
        status(5),
        (CompletionStatus::WrFlushError, WcOpcode::LocalInvalidate)
    );
    let r = collect_exactly_once(&c.rcq, &[6], &c.qp, None);
    assert_eq!(r[&6].status, CompletionStatus::WrFlushError);
    assert_eq!(sink.to_vec(0, 256 * 1024).unwrap(), data);
    let rs = collect_exactly_once(&s.rcq, &[7, 8], &s.qp, Some(&CmEvent::Disconnected));
    assert_eq!(
        (rs[&7].status, rs[&7].byte_len),
        (CompletionStatus::Success, 4)
    );
    assert_eq!(remote.to_vec(0, 4).unwrap(), b"last");
    assert_eq!(rs[&8].status, CompletionStatus::WrFlushError);
    wait_state(&c.qp, QpState::Idle);
}

// ---------------------------------------------------------------- reset and reuse

/// Connect the existing QP of `c` to the existing QP of `s` through `listener`; both
/// must report Established next (a reset QP carries no stale event). Returns the
/// client's Established event.
fn establish(c: &End, s: &End, listener: &Listener) -> CmEvent {
    c.qp.connect(
        listener.local_addr(),
        ConnectParams {
            private_data: b"again".to_vec(),
            timeout: T,
        },
    )
    .unwrap();
    let req = listener.get_request(T).unwrap();
    assert_eq!(req.private_data, b"again");
    req.accept(&s.qp, b"ok").unwrap();
    let ec = c.qp.next_event(T).unwrap();
    assert!(
        matches!(&ec, CmEvent::Established { private_data, .. } if private_data == b"ok"),
        "client: {ec:?}"
    );
    let es = s.qp.next_event(T).unwrap();
    assert!(
        matches!(&es, CmEvent::Established { private_data, .. } if private_data == b"again"),
        "server: {es:?}"
    );
    assert_eq!((state(&c.qp), state(&s.qp)), (QpState::Rts, QpState::Rts));
    ec
}

/// A Write, a Send and a Read from `c` to `s` with wr_ids `base + 1..=3` (the receive is
/// `base + 10`): every completion comes once with its id, opcode and length, and the
/// bytes arrive (the Read's bytes come back).
fn move_data(c: &End, s: &End, seed: u8, base: u64) {
    const W: usize = 48 * 1024;
    const SEND: usize = 1000;
    const R: usize = 24 * 1024;
    let csrc = mr(c, W + SEND);
    let csink = mr(c, R);
    let sbuf = mr(s, 2 * W + R);
    let (wdata, sdata, rdata) = (
        pattern(W, seed),
        pattern(SEND, seed ^ 0x55),
        pattern(R, !seed),
    );
    csrc.write(0, &wdata).unwrap();
    csrc.write(W, &sdata).unwrap();
    sbuf.write(2 * W, &rdata).unwrap();
    s.qp.post_recv(base + 10, &[sbuf.sge(W, W).unwrap()])
        .unwrap();
    c.qp.post_send(SendRequest::write(
        base + 1,
        vec![csrc.sge(0, W).unwrap()],
        sbuf.rkey(),
        sbuf.addr(),
    ))
    .unwrap();
    c.qp.post_send(SendRequest::send(
        base + 2,
        vec![csrc.sge(W, SEND).unwrap()],
    ))
    .unwrap();
    c.qp.post_send(SendRequest::read(
        base + 3,
        csink.sge_all().unwrap(),
        sbuf.rkey(),
        sbuf.addr() + 2 * W as u64,
    ))
    .unwrap();
    let got = collect_exactly_once(&c.scq, &[base + 1, base + 2, base + 3], &c.qp, None);
    for (id, op, len) in [
        (base + 1, WcOpcode::Write, None),
        (base + 2, WcOpcode::Send, None),
        (base + 3, WcOpcode::Read, Some(R as u32)),
    ] {
        let w = got[&id];
        assert_eq!(
            (w.status, w.opcode),
            (CompletionStatus::Success, op),
            "{w:?}"
        );
        assert_eq!(w.qp_num, c.qp.qp_num());
        if let Some(len) = len {
            assert_eq!(w.byte_len, len);
        }
    }
    let r = collect_exactly_once(&s.rcq, &[base + 10], &s.qp, None)[&(base + 10)];
    assert_eq!(
        (r.status, r.opcode, r.byte_len as usize, r.qp_num),
        (
            CompletionStatus::Success,
            WcOpcode::Recv,
            SEND,
            s.qp.qp_num()
        )
    );
    assert_eq!(sbuf.to_vec(0, W).unwrap(), wdata);
    assert_eq!(sbuf.to_vec(W, SEND).unwrap(), sdata);
    assert_eq!(csink.to_vec(0, R).unwrap(), rdata);
}

/// Verbs RESET (ERROR → IDLE): after an abortive ERROR during traffic (the peer sees the
/// reset), the same QP (same qp_num) connects again, here with new attributes given in
/// the reset (CRC, a Read RTR), and moves data with a Write, a Send and a Read. Every
/// work request of the old connection completed exactly once before the reset, none of
/// them after it on either CQ, no CM event of the old connection follows the reset, the
/// old TCP connection is not reused, and query shows the new negotiation. Work posted in
/// IDLE after the reset waits for the new connection, as on a new QP.
#[test]
fn verbs_qp_reset_from_error_allows_a_new_connection() {
    // 5 ms each way: the large Writes below are still in flight at the abort.
    let (a, b) = pair(delayed(Duration::from_millis(5)));
    let listener = b.device().listen(server_addr(6100), 4).unwrap();
    let c = end(&a, |_| {});
    let s = end(&b, |_| {});
    let qpn = (c.qp.qp_num(), s.qp.qp_num());
    establish(&c, &s, &listener);
    move_data(&c, &s, 1, 100);
    let old = c.qp.query().unwrap();
    let old_neg = old.negotiated.clone().unwrap();
    assert_eq!(
        (old_neg.crc, old_neg.p2p_rtr),
        (false, Some(RtrType::Write))
    );

    // Outstanding work on both sides, then the abort.
    let big = mr(&c, 8 << 20);
    let sink = mr(&s, 8 << 20);
    let cbuf = mr(&c, 64);
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    for i in 0..8u64 {
        c.qp.post_send(SendRequest::write(
            1000 + i,
            vec![big.sge((i as usize) << 20, 1 << 20).unwrap()],
            sink.rkey(),
            sink.addr() + (i << 20),
        ))
        .unwrap();
        sends.push(1000 + i);
    }
    c.qp.post_recv(1500, &[cbuf.sge(0, 64).unwrap()]).unwrap();
    recvs.push(1500);
    for i in 0..3u64 {
        s.qp.post_recv(2000 + i, &[sink.sge(0, 64).unwrap()])
            .unwrap();
    }
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    // Flushed synchronously by the modify: all there, exactly once.
    let sc = collect_exactly_once(&c.scq, &sends, &c.qp, None);
    assert!(sc.values().all(|w| matches!(
        w.status,
        CompletionStatus::Success | CompletionStatus::WrFlushError
    )));
    let rc = collect_exactly_once(&c.rcq, &recvs, &c.qp, None);
    assert_eq!(rc[&1500].status, CompletionStatus::WrFlushError);
    // The peer sees the reset and flushes its receives once each.
    let pr = collect_exactly_once(
        &s.rcq,
        &[2000, 2001, 2002],
        &s.qp,
        Some(&CmEvent::Disconnected),
    );
    assert!(pr
        .values()
        .all(|w| w.status == CompletionStatus::WrFlushError));
    assert!(b.stack_stats().resets >= 1, "{:?}", b.stack_stats());
    wait_state(&s.qp, QpState::Error);

    // Reset at once (the client's TCP teardown may still be running: it is released
    // from the QP, not waited for), with new attributes.
    c.qp.modify(&QpModify {
        state: Some(QpState::Idle),
        crc: Some(true),
        p2p_rtr: Some(Some(RtrType::Read)),
        ..QpModify::default()
    })
    .unwrap();
    s.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    for (e, n) in [(&c, qpn.0), (&s, qpn.1)] {
        let q = e.qp.query().unwrap();
        assert_eq!((q.state, q.qp_num), (QpState::Idle, n));
        assert_eq!(
            (q.negotiated, q.local_addr, q.peer_addr),
            (None, None, None)
        );
        assert_eq!(e.qp.poll_event(), None, "an old CM event after the reset");
        assert_eq!(e.scq.poll_one(), None, "an old completion after the reset");
        assert_eq!(e.rcq.poll_one(), None, "an old completion after the reset");
    }
    let q = c.qp.query().unwrap();
    assert_eq!((q.mpa.crc, q.mpa.p2p_rtr), (true, Some(RtrType::Read)));
    // IDLE → IDLE on a reset QP is a plain no-op.
    c.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    let q = c.qp.query().unwrap();
    assert_eq!((q.state, q.mpa.crc), (QpState::Idle, true));

    // Work posted in IDLE waits for the connection, as on a new QP.
    let early = mr(&c, 64);
    early.write(0, b"posted while idle").unwrap();
    let early_sink = mr(&s, 64);
    s.qp.post_recv(310, &[early_sink.sge(0, 64).unwrap()])
        .unwrap();
    c.qp.post_send(SendRequest::send(300, vec![early.sge(0, 17).unwrap()]))
        .unwrap();
    let ev = establish(&c, &s, &listener);
    assert!(
        matches!(ev, CmEvent::Established { crc: true, .. }),
        "{ev:?}"
    );
    let w = collect_exactly_once(&c.scq, &[300], &c.qp, None)[&300];
    assert_eq!(w.status, CompletionStatus::Success);
    let r = collect_exactly_once(&s.rcq, &[310], &s.qp, None)[&310];
    assert_eq!((r.status, r.byte_len), (CompletionStatus::Success, 17));
    assert_eq!(early_sink.to_vec(0, 17).unwrap(), b"posted while idle");

    move_data(&c, &s, 2, 200);
    let (qc, qs) = (c.qp.query().unwrap(), s.qp.query().unwrap());
    let (nc, ns) = (qc.negotiated.unwrap(), qs.negotiated.unwrap());
    assert!(nc.crc && ns.crc);
    assert_eq!(
        (nc.p2p_rtr, ns.p2p_rtr),
        (Some(RtrType::Read), Some(RtrType::Read))
    );
    assert_eq!((qc.qp_num, qs.qp_num), qpn);
    // A new TCP connection: the old one is never reused.
    assert_ne!(qc.local_addr, old.local_addr);
    assert_eq!(qs.peer_addr, qc.local_addr);
}

/// The reset also works after errors the peer caused, and after a graceful disconnect:
/// a Terminate from the peer (both ends ERROR), then a graceful disconnect (the closing
/// end is IDLE, its peer ERROR; without the reset the closed QP cannot connect). After
/// each reset the same QPs connect again and move data. Each QP is reset as soon as its
/// Disconnected came, while (30 ms each way) its TCP connection is still finishing its
/// close: that teardown goes on detached from the QP and never reaches the new
/// connection.
#[test]
fn verbs_qp_reset_after_peer_terminate_and_after_graceful_disconnect() {
    let (a, b) = pair(delayed(Duration::from_millis(30)));
    let listener = b.device().listen(server_addr(6101), 4).unwrap();
    let c = end(&a, |_| {});
    let s = end(&b, |_| {});
    establish(&c, &s, &listener);
    move_data(&c, &s, 3, 100);

    // The server sends a Terminate: the client's ERROR is the peer's doing.
    let cr = mr(&c, 64);
    c.qp.post_recv(150, &[cr.sge(0, 64).unwrap()]).unwrap();
    s.qp.modify(&QpModify::to_state(QpState::Terminate))
        .unwrap();
    let (sent, received) = term(0, 0, 0xff);
    expect_events(&c.qp, &[received, CmEvent::Disconnected]);
    assert_eq!(state(&c.qp), QpState::Error);
    let r = collect_exactly_once(&c.rcq, &[150], &c.qp, None);
    assert_eq!(r[&150].status, CompletionStatus::WrFlushError);
    c.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    expect_events(&s.qp, &[sent, CmEvent::Disconnected]);
    assert_eq!(state(&s.qp), QpState::Error);
    s.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    assert_eq!((state(&c.qp), state(&s.qp)), (QpState::Idle, QpState::Idle));
    establish(&c, &s, &listener);
    move_data(&c, &s, 4, 200);

    // Graceful disconnect from the client.
    c.qp.disconnect().unwrap();
    // The passive end: Disconnected on the peer's FIN, its own FIN not yet acknowledged.
    expect_event(&s.qp, &CmEvent::Disconnected);
    assert_eq!(state(&s.qp), QpState::Error);
    s.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    expect_event(&c.qp, &CmEvent::Disconnected);
    wait_state(&c.qp, QpState::Idle);
    // Closed but not reset: it cannot connect.
    c.qp.connect(listener.local_addr(), ConnectParams::default())
        .unwrap();
    assert!(matches!(
        c.qp.next_event(T).unwrap(),
        CmEvent::ConnectError(_)
    ));
    c.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    for e in [&c, &s] {
        let q = e.qp.query().unwrap();
        assert_eq!((q.state, q.negotiated), (QpState::Idle, None));
    }
    establish(&c, &s, &listener);
    move_data(&c, &s, 5, 300);
    // The old connections' teardown (the client's TIME-WAIT included) is not the QPs'.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!((state(&c.qp), state(&s.qp)), (QpState::Rts, QpState::Rts));
    assert_eq!(c.qp.poll_event(), None);
    assert_eq!(s.qp.poll_event(), None);
    assert_eq!(c.scq.poll_one(), None);
    assert_eq!(s.rcq.poll_one(), None);
}

/// Transitions that do not reset are refused with InvalidInput and a reason: RTS → IDLE
/// (siw_qp_nextstate_from_rts has no IDLE), CLOSING → IDLE while the close still drains
/// (siw moves CLOSING to IDLE itself once the LLP closed), attribute changes in RTS and
/// CLOSING (revision and P2P RTR too). The refused QP keeps working; from CLOSING the
/// way out is ERROR, and the reset then works.
#[test]
fn siw_reset_refused_from_rts_and_closing() {
    // The Read Response (1 MiB) crawls back at 2 Mbit/s: the QP stays CLOSING (its Read
    // is outstanding) for about 4 s after the disconnect, while the test needs a moment.
    let mut wire = WireConfig::default();
    wire.b_to_a.rate_bps = 2_000_000;
    wire.b_to_a.rate_queue = Duration::from_secs(8);
    let (a, b) = pair(wire);
    let (c, s) = connect(&a, &b, 6102, |_| {});
    let attrs = [
        QpModify {
            revision: Some(1),
            p2p_rtr: Some(None),
            ..QpModify::default()
        },
        QpModify {
            p2p_rtr: Some(Some(RtrType::Send)),
            ..QpModify::default()
        },
        QpModify {
            state: Some(QpState::Idle),
            crc: Some(true),
            ..QpModify::default()
        },
    ];
    assert_invalid(
        c.qp.modify(&QpModify::to_state(QpState::Idle)),
        "Rts -> Idle",
    );
    for m in &attrs {
        assert_invalid(c.qp.modify(m), &format!("{m:?} in RTS"));
    }
    let q = c.qp.query().unwrap();
    assert_eq!(q.state, QpState::Rts);
    assert_eq!(q.mpa, MpaAttr::default());
    let why =
        c.qp.modify(&QpModify::to_state(QpState::Idle))
            .unwrap_err()
            .to_string();
    assert!(why.contains("Rts -> Idle"), "{why}");

    let sink = mr(&c, 1 << 20);
    let remote = mr(&s, 1 << 20);
    remote.write(0, &pattern(1 << 20, 9)).unwrap();
    c.qp.post_send(SendRequest::read(
        1,
        sink.sge_all().unwrap(),
        remote.rkey(),
        remote.addr(),
    ))
    .unwrap();
    c.qp.disconnect().unwrap();
    assert_eq!(state(&c.qp), QpState::Closing);
    let r = c.qp.modify(&QpModify::to_state(QpState::Idle));
    assert_invalid(r, "Closing -> Idle");
    for m in &attrs {
        assert_invalid(c.qp.modify(m), &format!("{m:?} in CLOSING"));
    }
    assert_eq!(
        state(&c.qp),
        QpState::Closing,
        "the refused modify changed the state"
    );
    // CLOSING → ERROR, then the reset.
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    let w = collect_exactly_once(&c.scq, &[1], &c.qp, Some(&CmEvent::Disconnected))[&1];
    assert_eq!(
        (w.opcode, w.status),
        (WcOpcode::Read, CompletionStatus::WrFlushError)
    );
    c.qp.modify(&QpModify {
        state: Some(QpState::Idle),
        revision: Some(1),
        p2p_rtr: Some(None),
        ..QpModify::default()
    })
    .unwrap();
    let q = c.qp.query().unwrap();
    assert_eq!(
        (q.state, q.mpa.revision, q.mpa.p2p_rtr),
        (QpState::Idle, 1, None)
    );
}

/// RFC 6581: the MPA revision and the P2P RTR type change by modify before connect, and
/// with a reset; query reports the settings and what was negotiated: revision 1 without
/// P2P, revision 2 with the RTR type asked for (the Initiator's choice is the one on the
/// wire, the Responder accepts every type). P2P with revision 1, or revisions other than
/// 1 and 2, are refused by modify and by create_qp, and a refused modify changes nothing.
#[test]
fn rfc6581_modify_sets_revision_and_p2p_rtr_type() {
    let (a, b) = pair(WireConfig::default());
    let listener = b.device().listen(server_addr(6103), 4).unwrap();
    let c = end(&a, |_| {});
    let s = end(&b, |_| {});
    // Invalid combinations: nothing changes.
    for (what, m) in [
        (
            "revision 1 keeping the default Write RTR",
            QpModify {
                revision: Some(1),
                ..QpModify::default()
            },
        ),
        (
            "revision 3",
            QpModify {
                revision: Some(3),
                p2p_rtr: Some(None),
                ..QpModify::default()
            },
        ),
        (
            "revision 0",
            QpModify {
                revision: Some(0),
                ..QpModify::default()
            },
        ),
        (
            "P2P with revision 1",
            QpModify {
                revision: Some(1),
                p2p_rtr: Some(Some(RtrType::Read)),
                ird: Some(2),
                ..QpModify::default()
            },
        ),
    ] {
        assert_invalid(c.qp.modify(&m), what);
    }
    let q = c.qp.query().unwrap();
    assert_eq!((q.mpa, q.ird), (MpaAttr::default(), 16));
    {
        let pd = a.device().alloc_pd();
        let mut attr = QpInitAttr::new(&c.scq, &c.rcq);
        attr.mpa.revision = 1;
        match pd.create_qp(&attr) {
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {}
            other => panic!("create_qp with revision 1 and P2P: {other:?}"),
        }
    }

    // P2P with a Read RTR, set by modify: used on the wire.
    c.qp.modify(&QpModify {
        p2p_rtr: Some(Some(RtrType::Read)),
        ..QpModify::default()
    })
    .unwrap();
    assert_eq!(c.qp.query().unwrap().mpa.p2p_rtr, Some(RtrType::Read));
    c.qp.connect(listener.local_addr(), ConnectParams::default())
        .unwrap();
    let req = listener.get_request(T).unwrap();
    assert_eq!((req.revision, req.p2p), (2, Some(RtrType::Read)));
    req.accept(&s.qp, b"").unwrap();
    assert!(matches!(
        c.qp.next_event(T).unwrap(),
        CmEvent::Established { revision: 2, .. }
    ));
    assert!(matches!(
        s.qp.next_event(T).unwrap(),
        CmEvent::Established { revision: 2, .. }
    ));
    for e in [&c, &s] {
        let n = e.qp.query().unwrap().negotiated.unwrap();
        assert_eq!((n.revision, n.p2p_rtr), (2, Some(RtrType::Read)));
    }
    move_data(&c, &s, 6, 100);

    // Error, then a reset to revision 1 without P2P on the client.
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    expect_event(&s.qp, &CmEvent::Disconnected);
    c.qp.modify(&QpModify {
        state: Some(QpState::Idle),
        revision: Some(1),
        p2p_rtr: Some(None),
        ..QpModify::default()
    })
    .unwrap();
    s.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    let q = c.qp.query().unwrap();
    assert_eq!(
        (q.mpa.revision, q.mpa.p2p_rtr, q.negotiated),
        (1, None, None)
    );
    c.qp.connect(listener.local_addr(), ConnectParams::default())
        .unwrap();
    let req = listener.get_request(T).unwrap();
    assert_eq!((req.revision, req.p2p), (1, None));
    req.accept(&s.qp, b"").unwrap();
    assert!(matches!(
        c.qp.next_event(T).unwrap(),
        CmEvent::Established { revision: 1, .. }
    ));
    assert!(matches!(
        s.qp.next_event(T).unwrap(),
        CmEvent::Established { revision: 1, .. }
    ));
    for e in [&c, &s] {
        let n = e.qp.query().unwrap().negotiated.unwrap();
        assert_eq!((n.revision, n.p2p_rtr, n.peer_ird), (1, None, None));
    }
    move_data(&c, &s, 7, 200);
}

/// A failed connect leaves the QP in ERROR (refused: nobody listens); the reset makes it
/// connect again. A connect aborted by ERROR during the TCP handshake and reset at once
/// (its TCP connection still opening, 20 ms each way) leaves no trace: the next connect
/// of the same QP is the only request the listener sees, and no event of the aborted one
/// reaches the QP.
#[test]
fn verbs_qp_reset_after_a_failed_or_aborted_connect() {
    let (a, b) = pair(delayed(Duration::from_millis(20)));
    let c = end(&a, |_| {});
    let s = end(&b, |_| {});
    c.qp.connect(server_addr(6104), ConnectParams::default())
        .unwrap();
    assert!(matches!(
        c.qp.next_event(T).unwrap(),
        CmEvent::ConnectError(_)
    ));
    assert_eq!(state(&c.qp), QpState::Error);
    c.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    assert_eq!(state(&c.qp), QpState::Idle);

    let listener = b.device().listen(server_addr(6104), 4).unwrap();
    c.qp.connect(server_addr(6104), ConnectParams::default())
        .unwrap();
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    c.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    assert_eq!(state(&c.qp), QpState::Idle);
    establish(&c, &s, &listener);
    move_data(&c, &s, 8, 100);
    assert!(
        listener.get_request(Duration::from_millis(100)).is_err(),
        "a request from the aborted connect"
    );
    assert_eq!(c.qp.poll_event(), None);
}
