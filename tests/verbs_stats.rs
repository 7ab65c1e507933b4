//! Per-QP statistics of `xwarp::verbs` (`QueuePair::stats`, `Context::qp_stats`) over
//! the virtual wire, each count checked against real events: the bytes and placements
//! of a verified Write/Send/Read exchange, Read Requests served by the responder, the
//! Terminate codes both sides record for a DDP error and for an MPA CRC error (injected
//! by a raw iWARP peer that corrupts one FPDU, since the wire's TCP checksum would
//! catch a corrupted frame), and the work flushed when a QP goes to ERROR.

mod verbs_common;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use verbs_common::*;
use xwarp::ddp::mpa::InitiatorConfig;
use xwarp::net::TcpStream;
use xwarp::poll_driver::vwire::WireConfig;
use xwarp::rdmap::conn::{ConnConfig, ConnEvent, Connection};
use xwarp::rdmap::verbs::{RecvWr, Resources, SendOp, SendWr};
use xwarp::rdmap::{QpConfig, RqConfig};
use xwarp::verbs::{
    CmEvent, CompletionStatus, ErrorCounters, QpCounters, QpModify, QpState, QpStatsSnapshot,
    RtrType, SendOpcode, SendRequest, Sge, Stag, TerminateCode, WcOpcode,
};

/// Every accepted work request finished exactly once.
fn all_finished(c: &QpCounters) {
    assert_eq!(
        c.send_wrs_posted,
        c.send_wrs_completed + c.send_wrs_flushed + c.send_wrs_failed,
        "{c:#?}"
    );
    assert_eq!(
        c.recv_wrs_posted,
        c.recv_wrs_completed + c.recv_wrs_flushed + c.recv_wrs_failed,
        "{c:#?}"
    );
}

fn code(layer: u8, etype: u8, code: u8) -> Option<TerminateCode> {
    Some(TerminateCode { layer, etype, code })
}

/// Stats once the engine saw `ok` hold (the counters of the far side of an event may
/// trail the event by an engine iteration).
fn stats_when(e: &End, ok: impl Fn(&QpStatsSnapshot) -> bool) -> QpStatsSnapshot {
    let t0 = Instant::now();
    loop {
        let s = e.qp.stats().unwrap();
        if ok(&s) || t0.elapsed() > T {
            return s;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn stats_count_a_verified_write_send_read_exchange() {
    let (a, b) = pair(WireConfig::default());
    let port = 7400;
    let (c, s) = connect(&a, &b, port, |q| q.mpa.crc = true);
    let (w, sl, r) = (100_000usize, 5_000usize, 30_000usize);
    let csrc = mr(&c, w + sl);
    let data = pattern(w + sl, 3);
    csrc.write(0, &data).unwrap();
    let csink = mr(&c, 2 * r);
    let sdst = mr(&s, w);
    let srecv = mr(&s, sl);
    let ssrc = mr(&s, r);
    let rdata = pattern(r, 9);
    ssrc.write(0, &rdata).unwrap();
    s.qp.post_recv(9, &[srecv.sge(0, sl).unwrap()]).unwrap();
    let half = w / 2;
    c.qp.post_send(SendRequest::write(
        1,
        vec![csrc.sge(0, half).unwrap()],
        sdst.rkey(),
        sdst.addr(),
    ))
    .unwrap();
    let mut unsignaled = SendRequest::write(
        2,
        vec![csrc.sge(half, w - half).unwrap()],
        sdst.rkey(),
        sdst.addr() + half as u64,
    );
    unsignaled.signaled = false;
    c.qp.post_send(unsignaled).unwrap();
    c.qp.post_send(SendRequest::send(3, vec![csrc.sge(w, sl).unwrap()]))
        .unwrap();
    for k in 0..2u64 {
        c.qp.post_send(SendRequest::read(
            4 + k,
            csink.sge(k as usize * r, r).unwrap(),
            ssrc.rkey(),
            ssrc.addr(),
        ))
        .unwrap();
    }
    let mut ids: Vec<_> = (0..4).map(|_| wc(&c.scq)).collect();
    assert!(ids.iter().all(|w| w.status == CompletionStatus::Success));
    ids.sort_by_key(|w| w.wr_id);
    assert_eq!(
        ids.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![1, 3, 4, 5]
    );
    let rw = wc(&s.rcq);
    assert_eq!((rw.wr_id, rw.byte_len as usize), (9, sl));
    assert_eq!(sdst.to_vec(0, w).unwrap(), data[..w]);
    assert_eq!(srecv.to_vec(0, sl).unwrap(), data[w..]);
    assert_eq!(csink.to_vec(0, 2 * r).unwrap(), rdata.repeat(2));

    let cs = c.qp.stats().unwrap();
    let ss = s.qp.stats().unwrap();
    let (cc, sc) = (cs.counters, ss.counters);
    // The client: five send WRs (one unsignaled) done, Writes and the Send sent, two
    // Reads placed.
    assert_eq!((cc.send_wrs_posted, cc.send_wrs_completed), (5, 5));
    assert_eq!(cc.recv_wrs_posted, 0);
    assert_eq!(cc.bytes_sent, (w + sl) as u64);
    assert_eq!(cc.read_requests_sent, 2);
    assert_eq!(cc.read_responses_placed, 2);
    assert_eq!(cc.bytes_placed, 2 * r as u64);
    assert_eq!(cc.untagged_placements, 0);
    // Everything the server sent was a Read Response segment with data.
    assert_eq!(cc.tagged_placements, sc.segments_sent);
    assert_eq!(cc.segments_received, sc.segments_sent);
    assert!(sc.segments_sent >= (2 * r / 1448) as u64, "{sc:#?}");
    // The server: the Writes and the Send placed, both Reads served.
    assert_eq!((sc.recv_wrs_posted, sc.recv_wrs_completed), (1, 1));
    assert_eq!(sc.send_wrs_posted, 0);
    assert_eq!(sc.bytes_placed, (w + sl) as u64);
    assert_eq!(sc.read_requests_served, 2);
    assert_eq!(sc.bytes_sent, 2 * r as u64);
    assert_eq!(sc.segments_received, cc.segments_sent);
    // Every client segment but the Write RTR and the two Read Requests placed data.
    assert_eq!(
        sc.tagged_placements + sc.untagged_placements,
        cc.segments_sent - 1 - 2
    );
    assert!(sc.untagged_placements >= 4, "{sc:#?}");
    for st in [&cs, &ss] {
        assert_eq!(st.state, QpState::Rts);
        let m = st.mpa().expect("MPA result");
        assert_eq!(
            (m.revision, m.crc, m.markers_tx, m.markers_rx),
            (2, true, false, false)
        );
        assert_eq!(m.p2p_rtr, Some(RtrType::Write));
        assert_eq!((m.ird, m.ord), (16, 16));
        assert_eq!(st.counters.errors, ErrorCounters::default());
        assert_eq!(
            st.counters.terminates_sent + st.counters.terminates_received,
            0
        );
        all_finished(&st.counters);
    }
    assert_eq!(cs.qp_num, c.qp.qp_num());
    assert_eq!(cs.peer_addr, Some(server_addr(port)));
    assert_eq!(
        cs.local_addr.map(|a| a.ip()),
        Some(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)))
    );
    assert_eq!(ss.local_addr, Some(server_addr(port)));
    // The engine-wide list holds the same snapshot.
    let all = b.qp_stats().unwrap();
    assert_eq!(all.iter().filter(|x| x.qp_num == ss.qp_num).count(), 1);
    assert_eq!(all.iter().find(|x| x.qp_num == ss.qp_num), Some(&ss));
    assert_eq!(a.qp_stats().unwrap(), vec![cs]);

    // A Local Invalidate is a send work request the engine carries out itself.
    c.qp.post_send(SendRequest::new(
        6,
        SendOpcode::LocalInvalidate(csink.rkey()),
        vec![],
    ))
    .unwrap();
    let li = wc(&c.scq);
    assert_eq!(
        (li.wr_id, li.opcode, li.status),
        (6, WcOpcode::LocalInvalidate, CompletionStatus::Success)
    );
    let cc2 = c.qp.stats().unwrap().counters;
    assert_eq!((cc2.send_wrs_posted, cc2.send_wrs_completed), (6, 6));
    assert_eq!(cc2.bytes_sent, cc.bytes_sent);
}

#[test]
fn stats_record_ddp_terminate_codes_on_both_sides_and_the_flushes() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 7401, |_| {});
    let src = mr(&c, 4096);
    let dst = mr(&s, 4096);
    for i in 0..3 {
        c.qp.post_recv(10 + i, &[src.sge(0, 64).unwrap()]).unwrap();
    }
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
    let mut flushed = 0;
    for _ in 0..4 {
        let w = wc_any(&c);
        if w.status == CompletionStatus::WrFlushError {
            assert_eq!(w.opcode, WcOpcode::Recv);
            flushed += 1;
        }
    }
    assert_eq!(flushed, 3);
    // RFC 5041 §7.2: DDP (1), tagged buffer error (1), invalid STag (0x00).
    let ss = s.qp.stats().unwrap();
    assert_eq!(ss.state, QpState::Error);
    assert_eq!(ss.counters.errors.ddp_tagged, 1);
    assert_eq!(ss.counters.errors.total(), 1);
    assert_eq!(ss.counters.terminates_sent, 1);
    assert_eq!(ss.counters.last_terminate_sent, code(1, 1, 0));
    assert_eq!(ss.counters.bytes_placed, 0);
    let cs = c.qp.stats().unwrap();
    assert_eq!(cs.state, QpState::Error);
    assert_eq!(cs.counters.terminates_received, 1);
    assert_eq!(cs.counters.last_terminate_received, code(1, 1, 0));
    assert_eq!(cs.counters.errors, ErrorCounters::default());
    assert_eq!(
        (cs.counters.recv_wrs_posted, cs.counters.recv_wrs_flushed),
        (3, 3)
    );
    assert_eq!(
        (cs.counters.send_wrs_posted, cs.counters.send_wrs_completed),
        (1, 1)
    );
    all_finished(&cs.counters);
    all_finished(&ss.counters);
    // Work posted in ERROR flushes at once and is counted.
    c.qp.post_send(SendRequest::send(20, vec![src.sge(0, 8).unwrap()]))
        .unwrap();
    assert_eq!(wc(&c.scq).status, CompletionStatus::WrFlushError);
    let cs2 = c.qp.stats().unwrap();
    assert_eq!(
        (cs2.counters.send_wrs_posted, cs2.counters.send_wrs_flushed),
        (2, 1)
    );
}

/// A completion from either CQ of `e`.
fn wc_any(e: &End) -> xwarp::verbs::WorkCompletion {
    let t0 = Instant::now();
    loop {
        if let Some(w) = e.scq.poll_one() {
            return w;
        }
        if let Some(w) = e.rcq.poll_one() {
            return w;
        }
        assert!(t0.elapsed() < T, "no completion");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn modify_to_error_counts_the_flushed_work_and_a_reset_keeps_the_counts() {
    let (a, b) = pair(WireConfig::default());
    let (c, s) = connect(&a, &b, 7402, |_| {});
    let m = mr(&c, 4096);
    for i in 0..4 {
        c.qp.post_recv(i, &[m.sge(0, 64).unwrap()]).unwrap();
    }
    // A Write that moves data, so the counts are not all about flushes.
    let d = mr(&s, 4096);
    c.qp.post_send(SendRequest::write(
        9,
        vec![m.sge(0, 4096).unwrap()],
        d.rkey(),
        d.addr(),
    ))
    .unwrap();
    assert_eq!(wc(&c.scq).status, CompletionStatus::Success);
    stats_when(&s, |x| x.counters.bytes_placed == 4096);
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    for _ in 0..4 {
        assert_eq!(wc(&c.rcq).status, CompletionStatus::WrFlushError);
    }
    let cs = c.qp.stats().unwrap();
    assert_eq!(cs.state, QpState::Error);
    assert_eq!(
        (cs.counters.recv_wrs_posted, cs.counters.recv_wrs_flushed),
        (4, 4)
    );
    assert_eq!(cs.counters.bytes_sent, 4096);
    all_finished(&cs.counters);
    let ss = stats_when(&s, |x| x.state == QpState::Error);
    assert_eq!(ss.counters.bytes_placed, 4096);
    assert_eq!(ss.counters.tagged_placements, cs.counters.segments_sent - 1);

    // A reset keeps the QP's counts (not the connection's MPA result); work posted on
    // the fresh QP and flushed before it ever connects is counted by the engine.
    c.qp.modify(&QpModify::to_state(QpState::Idle)).unwrap();
    let r = c.qp.stats().unwrap();
    assert_eq!(r.state, QpState::Idle);
    assert_eq!(r.mpa(), None);
    assert_eq!((r.local_addr, r.peer_addr), (None, None));
    assert_eq!(r.counters.recv_wrs_flushed, 4);
    assert_eq!(r.counters.bytes_sent, 4096);
    c.qp.post_send(SendRequest::send(30, vec![m.sge(0, 8).unwrap()]))
        .unwrap();
    c.qp.post_recv(31, &[m.sge(0, 8).unwrap()]).unwrap();
    c.qp.modify(&QpModify::to_state(QpState::Error)).unwrap();
    assert_eq!(wc(&c.scq).status, CompletionStatus::WrFlushError);
    assert_eq!(wc(&c.rcq).status, CompletionStatus::WrFlushError);
    let e = c.qp.stats().unwrap();
    assert_eq!(
        (e.counters.send_wrs_posted, e.counters.send_wrs_flushed),
        (2, 1)
    );
    assert_eq!(
        (e.counters.recv_wrs_posted, e.counters.recv_wrs_flushed),
        (5, 5)
    );
    all_finished(&e.counters);
}

/// A raw iWARP Initiator (CRC on) over `xwarp::net` against a verbs QP: one good Send,
/// then one whose FPDU has a payload byte flipped. The QP counts one CRC error and sends
/// the LLP Terminate (RFC 5044 §8: layer 2, EType 0, code 0x02 CRC error), which the raw
/// peer parses off the wire and records the same.
#[test]
fn mpa_crc_error_counts_one_and_both_sides_record_the_llp_terminate() {
    let (a, b) = pair(WireConfig::default());
    let listener = b.device().listen(server_addr(7403), 4).unwrap();
    let s = end(&b, |q| {
        q.mpa.crc = true;
        q.mpa.p2p_rtr = None;
    });
    let rbuf = mr(&s, 4096);
    for i in 0..3 {
        s.qp.post_recv(i, &[rbuf.sge(i as usize * 64, 64).unwrap()])
            .unwrap();
    }
    let mut stream = TcpStream::connect(a.stack(), server_addr(7403)).unwrap();
    stream.set_nonblocking(true).unwrap();
    let mut res = Resources::new();
    let pd = res.stags.alloc_pd();
    let src = res
        .stags
        .register(
            pd,
            xwarp::verbs::Access::LOCAL_WRITE,
            0,
            Box::new(vec![0x5au8; 64]),
        )
        .unwrap();
    let mut cfg = ConnConfig::new(QpConfig {
        pd,
        ird: 4,
        ord: 4,
        sq_depth: 16,
        rq: RqConfig::Own(4),
    });
    cfg.initiator = InitiatorConfig {
        crc: true,
        ..InitiatorConfig::default()
    };
    let t0 = Instant::now();
    let mut conn = Connection::initiator(cfg, t0).unwrap();
    conn.post_recv(RecvWr {
        wr_id: 50,
        sgl: vec![Sge {
            lkey: src,
            addr: 0,
            len: 64,
        }],
    })
    .unwrap();
    let send = |id| SendWr {
        wr_id: id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: vec![Sge {
            lkey: src,
            addr: 0,
            len: 40,
        }],
        signaled: true,
        fence: false,
    };
    conn.post_send(send(1)).unwrap();
    let mut accepted = false;
    let mut corrupted = false;
    let mut got = None;
    let mut buf = vec![0u8; 65536];
    while got.is_none() {
        assert!(t0.elapsed() < T, "no Terminate from the server");
        if !accepted {
            if let Ok(req) = listener.get_request(Duration::from_millis(1)) {
                req.accept(&s.qp, &[]).unwrap();
                accepted = true;
            }
        }
        if !corrupted && s.rcq.poll_one().is_some() {
            // The first Send arrived intact: the second one goes out corrupted.
            conn.post_send(send(2)).unwrap();
            corrupted = true;
            let mut out = Vec::new();
            conn.poll_transmit(&res, &mut out);
            // 2 bytes ULPDU_Length, 18 bytes untagged DDP header, the payload (byte 25
            // is one of it), no pad, the CRC.
            assert_eq!(out.len(), 2 + 18 + 40 + 4);
            out[25] ^= 0x01;
            write_all(&mut stream, &out);
        }
        let mut out = Vec::new();
        conn.poll_transmit(&res, &mut out);
        write_all(&mut stream, &out);
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
    assert_eq!(got, Some((2, 0, 2)));
    let (sent, _) = term(2, 0, 2);
    expect_events(&s.qp, &[sent]);
    let ss = s.qp.stats().unwrap();
    let sc = ss.counters;
    assert_eq!(sc.crc_errors(), 1);
    assert_eq!(
        sc.errors,
        ErrorCounters {
            mpa_crc: 1,
            ..Default::default()
        }
    );
    assert_eq!((sc.terminates_sent, sc.terminates_received), (1, 0));
    assert_eq!(sc.last_terminate_sent, code(2, 0, 2));
    assert_eq!(sc.untagged_placements, 1);
    assert_eq!(sc.recv_wrs_completed, 1);
    // The bad FPDU's payload streamed in before its CRC was checked: counted as placed.
    assert_eq!(sc.bytes_placed, 80);
    assert_eq!(ss.mpa().map(|m| m.crc), Some(true));
    // The raw peer's counters tell the same story from its side.
    let pc = conn.counters();
    assert_eq!((pc.terminates_sent, pc.terminates_received), (0, 1));
    assert_eq!(pc.last_terminate_received, code(2, 0, 2));
    assert_eq!(pc.send_wrs_completed, 2);
    assert_eq!(pc.bytes_sent, 80);
    // The server's two receives left are flushed.
    let ss = stats_when(&s, |x| x.counters.recv_wrs_flushed == 2);
    assert_eq!(ss.counters.recv_wrs_flushed, 2);
    all_finished(&ss.counters);
}

fn write_all(stream: &mut TcpStream, out: &[u8]) {
    if !out.is_empty() {
        stream.set_nonblocking(false).unwrap();
        stream.write_all(out).unwrap();
        stream.set_nonblocking(true).unwrap();
    }
}
