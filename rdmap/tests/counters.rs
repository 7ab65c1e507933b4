//! Per-QP counters (`Connection::counters`) against real exchanges between two
//! Connections through re-segmenting byte pipes: every count is checked against what
//! the exchange moved (and the data itself is verified), the CRC error and the DDP
//! error against the RFC 5040/5041/5044 Terminate codes on both sides, the flushes
//! against the work that was outstanding.

#[path = "conn_util.rs"]
mod util;

use std::time::Instant;

use util::*;
use xwarp_ddp::mpa::{MpaError, RtrSet, RtrType};
use xwarp_ddp::segment::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use xwarp_rdmap::conn::{ConnConfig, ConnError};
use xwarp_rdmap::*;

const SEND: SendOp = SendOp::Send {
    solicited: false,
    invalidate: None,
};

fn sge(lkey: Stag, addr: u64, len: u32) -> Vec<Sge> {
    vec![Sge { lkey, addr, len }]
}

fn segments(len: usize, mulpdu: usize, hdr: usize) -> u64 {
    len.div_ceil(mulpdu - hdr) as u64
}

/// Every accepted work request finished exactly once.
fn all_finished(c: &QpCounters) {
    assert_eq!(c.wrs_outstanding(), 0, "{c:#?}");
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

/// A Write of `w` bytes, a Send of `s` bytes and `reads` Reads of `r` bytes each from
/// the initiator; returns both peers after the data was verified.
fn exchange(
    (w, s, r, reads): (usize, usize, usize, usize),
    seed: u64,
    max_piece: usize,
    tweak: impl Fn(&mut ConnConfig) + Copy,
) -> (Peer, Peer) {
    let mut rng = Rng(seed);
    let (mut i, mut p) = connect(tweak, tweak, &mut rng, max_piece);
    let wdata = rng.bytes(w);
    let sdata = rng.bytes(s);
    let rdata = rng.bytes(r);
    let mut isrc = wdata.clone();
    isrc.extend_from_slice(&sdata);
    let ib = i.reg(0x1000, isrc, Access::LOCAL_WRITE);
    let isink = i.reg(0x10_0000, vec![0; r * reads], Access::LOCAL_WRITE);
    let pw = p.reg(0x4000, vec![0; w], Access::REMOTE_WRITE);
    let ps = p.reg(0x8_0000, vec![0; s], Access::LOCAL_WRITE);
    let pr = p.reg(0x20_0000, rdata.clone(), Access::REMOTE_READ);
    p.recv(7, sge(ps, 0x8_0000, s as u32));
    i.send(
        1,
        SendOp::Write {
            remote_stag: pw,
            remote_to: 0x4000,
        },
        sge(ib, 0x1000, w as u32),
    );
    i.send(2, SEND, sge(ib, 0x1000 + w as u64, s as u32));
    for k in 0..reads {
        i.send(
            10 + k as u64,
            SendOp::Read {
                remote_stag: pr,
                remote_to: 0x20_0000,
            },
            sge(isink, 0x10_0000 + (k * r) as u64, r as u32),
        );
    }
    pump(&mut i, &mut p, &mut rng, max_piece, Instant::now());
    let ic = i.completions();
    assert_eq!(ic.len(), 2 + reads, "{ic:?}");
    assert!(ic.iter().all(|c| c.status == CompletionStatus::Success));
    let pc = p.completions();
    assert_eq!(pc.len(), 1);
    assert_eq!(pc[0].byte_len as usize, s);
    assert_eq!(p.mem(pw), wdata);
    assert_eq!(p.mem(ps), sdata);
    assert_eq!(i.mem(isink), rdata.repeat(reads));
    (i, p)
}

fn check_exchange(i: &Peer, p: &Peer, w: usize, s: usize, r: usize, reads: usize) {
    let (ic, pc) = (i.conn.counters(), p.conn.counters());
    let mi = i.conn.mulpdu();
    let mp = p.conn.mulpdu();
    // The initiator's side.
    assert_eq!(ic.send_wrs_posted, 2 + reads as u64);
    assert_eq!(ic.send_wrs_completed, 2 + reads as u64);
    assert_eq!(ic.recv_wrs_posted, 0);
    assert_eq!(ic.bytes_sent, (w + s) as u64);
    assert_eq!(ic.read_requests_sent, reads as u64);
    assert_eq!(ic.read_responses_placed, reads as u64);
    assert_eq!(ic.bytes_placed, (r * reads) as u64);
    assert_eq!(
        ic.tagged_placements,
        reads as u64 * segments(r, mp, TAGGED_HEADER_LEN)
    );
    assert_eq!(ic.untagged_placements, 0);
    assert_eq!(ic.read_requests_served, 0);
    // The peer's side: what the initiator sent was placed, segment for segment.
    assert_eq!(pc.send_wrs_posted, 0);
    assert_eq!((pc.recv_wrs_posted, pc.recv_wrs_completed), (1, 1));
    assert_eq!(pc.bytes_placed, (w + s) as u64);
    assert_eq!(pc.tagged_placements, segments(w, mi, TAGGED_HEADER_LEN));
    assert_eq!(pc.untagged_placements, segments(s, mi, UNTAGGED_HEADER_LEN));
    assert_eq!(pc.read_requests_served, reads as u64);
    assert_eq!(pc.bytes_sent, (r * reads) as u64);
    assert_eq!(pc.read_responses_placed, 0);
    // What one side sent, the other received.
    assert_eq!(ic.segments_sent, pc.segments_received);
    assert_eq!(pc.segments_sent, ic.segments_received);
    for c in [&ic, &pc] {
        assert_eq!(c.errors, ErrorCounters::default());
        assert_eq!((c.terminates_sent, c.terminates_received), (0, 0));
        assert_eq!(c.last_terminate_sent, None);
        all_finished(c);
    }
}

#[test]
fn counters_match_a_verified_write_send_read_exchange() {
    let (w, s, r, reads) = (10_000, 3_000, 5_000, 3);
    let (i, p) = exchange((w, s, r, reads), 21, 700, |c| c.initiator.crc = true);
    check_exchange(&i, &p, w, s, r, reads);
    let (ic, pc) = (i.conn.counters(), p.conn.counters());
    for c in [&ic, &pc] {
        let m = c.mpa.expect("MPA result");
        assert_eq!((m.revision, m.crc), (2, true));
        assert_eq!((m.markers_tx, m.markers_rx), (false, false));
        assert_eq!((m.ird, m.ord), (4, 4));
        assert_eq!(m.p2p_rtr, None);
    }
    // Zero-payload segments (Read Requests) are counted as segments, not placements.
    assert!(ic.segments_sent >= segments(w, i.conn.mulpdu(), TAGGED_HEADER_LEN) + reads as u64);
}

#[test]
fn counters_match_random_exchanges_through_random_segmentation() {
    let mut rng = Rng(0x5eed);
    for seed in 1..=24u64 {
        let w = rng.range(0, 40_000);
        let s = rng.range(0, 9_000);
        let r = rng.range(0, 20_000);
        let reads = rng.range(0, 3);
        let piece = rng.range(1, 3_000);
        let emss = [536, 1448, 9000][rng.range(0, 2)];
        let crc = rng.next_u64() & 1 == 1;
        let (i, p) = exchange((w, s, r, reads), seed, piece, move |c| {
            c.initiator.crc = crc;
            c.emss = emss;
        });
        check_exchange(&i, &p, w, s, r, reads);
    }
}

#[test]
fn p2p_rtr_is_not_counted_as_work_and_markers_are_reported() {
    let (w, s, r) = (4_000, 100, 1);
    let (i, p) = exchange((w, s, r, 1), 21, 700, |c| {
        c.initiator.p2p = Some(RtrSet::only(RtrType::Write));
        c.initiator.markers = true;
        c.responder.markers = true;
    });
    check_exchange(&i, &p, w, s, r, 1);
    let ic = i.conn.counters();
    let m = ic.mpa.unwrap();
    assert_eq!(m.p2p_rtr, Some(RtrType::Write));
    assert!(m.markers_tx && m.markers_rx);
    // The RTR (a zero-length Write) is one more segment than the ULP's messages, and
    // places nothing at the responder.
    let pc = p.conn.counters();
    assert_eq!(pc.segments_received, ic.segments_sent);
    assert_eq!(
        pc.tagged_placements,
        segments(w, i.conn.mulpdu(), TAGGED_HEADER_LEN)
    );
}

#[test]
fn mpa_crc_error_counts_one_and_both_sides_record_the_llp_terminate() {
    let mut rng = Rng(3);
    let tweak = |c: &mut ConnConfig| c.initiator.crc = true;
    let (mut i, mut r) = connect(tweak, |_| {}, &mut rng, 64);
    let rb = r.reg(0x2000, vec![0; 64], Access::LOCAL_WRITE);
    r.recv(1, sge(rb, 0x2000, 32));
    r.recv(2, sge(rb, 0x2020, 32));
    r.recv(3, sge(rb, 0x2040, 32));
    let ib = i.reg(0x1000, vec![0x5a; 32], Access::LOCAL_WRITE);
    i.send(1, SEND, sge(ib, 0x1000, 32));
    pump(&mut i, &mut r, &mut rng, 64, Instant::now());
    assert_eq!(r.completions().len(), 1);
    assert_eq!(r.conn.counters().bytes_placed, 32);
    i.send(2, SEND, sge(ib, 0x1000, 32));
    let mut bytes = i.transmit();
    bytes[25] ^= 0x01; // a payload byte: the CRC no longer matches
    let res = r.conn.handle_input(Instant::now(), &bytes, &mut r.res);
    assert!(matches!(
        res,
        Err(ConnError::Mpa(MpaError::CrcMismatch { .. }))
    ));
    let term = r.transmit();
    i.conn
        .handle_input(Instant::now(), &term, &mut i.res)
        .unwrap();
    let rc = r.conn.counters();
    // RFC 5044 §8 / RFC 5040 §4.8: Layer 2 (LLP), EType 0, code 0x02 CRC error.
    let crc = TerminateCode {
        layer: 2,
        etype: 0,
        code: 0x02,
    };
    assert_eq!(rc.crc_errors(), 1);
    assert_eq!(
        rc.errors,
        ErrorCounters {
            mpa_crc: 1,
            ..Default::default()
        }
    );
    assert_eq!((rc.terminates_sent, rc.terminates_received), (1, 0));
    assert_eq!(rc.last_terminate_sent, Some(crc));
    // The corrupt FPDU's payload streamed into the receive before its CRC (at the end
    // of the FPDU) was checked: its bytes count as placed, the segment does not count as
    // a placement, and its receive is flushed with the one left.
    assert_eq!(rc.bytes_placed, 64);
    assert_eq!(rc.untagged_placements, 1);
    assert_eq!(
        (
            rc.recv_wrs_posted,
            rc.recv_wrs_completed,
            rc.recv_wrs_flushed
        ),
        (3, 1, 2)
    );
    let ic = i.conn.counters();
    assert_eq!((ic.terminates_sent, ic.terminates_received), (0, 1));
    assert_eq!(ic.last_terminate_received, Some(crc));
    assert_eq!(ic.errors, ErrorCounters::default());
    assert_eq!(ic.send_wrs_completed, 2);
    for c in [&rc, &ic] {
        all_finished(c);
    }
}

#[test]
fn ddp_error_terminate_codes_on_both_sides_and_outstanding_work_flushed() {
    let mut rng = Rng(5);
    let (mut i, mut p) = connect(|_| {}, |_| {}, &mut rng, 300);
    let ib = i.reg(0x1000, vec![7; 4096], Access::LOCAL_WRITE);
    let pr = p.reg(0x9000, vec![1; 4096], Access::REMOTE_READ);
    for k in 0..3 {
        i.recv(100 + k, sge(ib, 0x1000, 64));
    }
    // A Write to an STag the peer never registered, then work that cannot finish.
    i.send(
        1,
        SendOp::Write {
            remote_stag: Stag(0x0bad_0000),
            remote_to: 0,
        },
        sge(ib, 0x1000, 100),
    );
    i.send(
        2,
        SendOp::Read {
            remote_stag: pr,
            remote_to: 0x9000,
        },
        sge(ib, 0x1000, 4096),
    );
    i.send(3, SEND, sge(ib, 0x1000, 10));
    pump(&mut i, &mut p, &mut rng, 300, Instant::now());
    assert!(i.conn.is_closed() && p.conn.is_closed());
    // RFC 5041 §7.2: DDP (1), tagged buffer (1), invalid STag (0x00).
    let code = TerminateCode {
        layer: 1,
        etype: 1,
        code: 0x00,
    };
    let pc = p.conn.counters();
    assert_eq!(pc.errors.ddp_tagged, 1);
    assert_eq!(pc.errors.total(), 1);
    assert_eq!((pc.terminates_sent, pc.terminates_received), (1, 0));
    assert_eq!(pc.last_terminate_sent, Some(code));
    assert_eq!(pc.bytes_placed, 0);
    assert_eq!(pc.tagged_placements, 0);
    assert_eq!(pc.read_requests_served, 0);
    let ic = i.conn.counters();
    assert_eq!((ic.terminates_sent, ic.terminates_received), (0, 1));
    assert_eq!(ic.last_terminate_received, Some(code));
    assert_eq!(ic.send_wrs_posted, 3);
    // The Write and the Send went out (iWARP completes them once sent); the Read never
    // got its Response and was flushed when the Terminate arrived, with every receive.
    let comps = i.completions();
    let flushed = |op| {
        comps
            .iter()
            .filter(|c| c.opcode == op && c.status == CompletionStatus::WrFlushError)
            .count() as u64
    };
    assert_eq!(
        ic.send_wrs_flushed,
        flushed(WcOpcode::Read) + flushed(WcOpcode::Send)
    );
    assert!(ic.send_wrs_flushed >= 1, "{ic:#?}");
    assert_eq!((ic.recv_wrs_posted, ic.recv_wrs_flushed), (3, 3));
    assert_eq!(flushed(WcOpcode::Recv), 3);
    for c in [&pc, &ic] {
        all_finished(c);
    }
    // Work posted after the stream died flushes at once and is counted.
    i.send(4, SEND, sge(ib, 0x1000, 10));
    let ic2 = i.conn.counters();
    assert_eq!(ic2.send_wrs_posted, 4);
    assert_eq!(ic2.send_wrs_flushed, ic.send_wrs_flushed + 1);
}

#[test]
fn work_posted_during_the_handshake_is_counted_when_the_handshake_fails() {
    let now = Instant::now();
    let mut i = Peer::new(true, now, |_| {});
    let b = i.reg(0x1000, vec![0; 16], Access::LOCAL_WRITE);
    i.send(1, SEND, sge(b, 0x1000, 16));
    i.recv(2, sge(b, 0x1000, 16));
    assert_eq!(i.conn.counters(), QpCounters::default());
    // A Reply that is not MPA: negotiation fails, the pending work is flushed.
    let _ = i.conn.handle_input(now, &[0u8; 40], &mut i.res);
    let c = i.conn.counters();
    assert_eq!(c.errors.mpa_negotiation, 1);
    assert_eq!((c.send_wrs_posted, c.send_wrs_flushed), (1, 1));
    assert_eq!((c.recv_wrs_posted, c.recv_wrs_flushed), (1, 1));
    assert_eq!(c.mpa, None);
    // The Initiator answers an invalid Reply with an LLP Terminate (RFC 6581 §5).
    assert_eq!(c.terminates_sent, 1);
    assert_eq!(
        c.last_terminate_sent.map(|t| (t.layer, t.code)),
        Some((2, 0x04))
    );
    assert_eq!(i.completions().len(), 2);
}

#[test]
fn an_application_wr_with_wr_id_u64_max_is_counted_posted_and_completed() {
    // u64::MAX is also the connection's RTR wr_id: with an RTR on the stream the
    // application's WRs of that id must still be counted (and completed).
    for rtr in [RtrType::Write, RtrType::Read] {
        let mut rng = Rng(33);
        let tweak = |c: &mut ConnConfig| c.initiator.p2p = Some(RtrSet::only(rtr));
        let (mut i, mut p) = connect(tweak, tweak, &mut rng, 500);
        let data = rng.bytes(300);
        let ib = i.reg(0x1000, data.clone(), Access::LOCAL_WRITE);
        let ps = p.reg(0x8000, vec![0; 300], Access::LOCAL_WRITE);
        p.recv(u64::MAX, sge(ps, 0x8000, 300));
        i.send(u64::MAX, SEND, sge(ib, 0x1000, 300));
        pump(&mut i, &mut p, &mut rng, 500, Instant::now());
        let ic = i.completions();
        assert_eq!(ic.len(), 1, "{rtr:?}: {ic:?}");
        assert_eq!(ic[0].wr_id, u64::MAX);
        assert_eq!(ic[0].status, CompletionStatus::Success);
        let pc = p.completions();
        assert_eq!(pc.len(), 1, "{rtr:?}: {pc:?}");
        assert_eq!((pc[0].wr_id, pc[0].byte_len), (u64::MAX, 300));
        assert_eq!(p.mem(ps), data);
        let (icn, pcn) = (i.conn.counters(), p.conn.counters());
        assert_eq!(
            (icn.send_wrs_posted, icn.send_wrs_completed),
            (1, 1),
            "{rtr:?}"
        );
        assert_eq!(
            (pcn.recv_wrs_posted, pcn.recv_wrs_completed),
            (1, 1),
            "{rtr:?}"
        );
        all_finished(&icn);
        all_finished(&pcn);
    }
}
