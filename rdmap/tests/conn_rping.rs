//! The rping exchange of docs/protocols.md §5.2 between two Connections wired back to back
//! through randomly re-segmenting byte pipes, in every framing variant: CRC on/off,
//! markers on/off, MPA Rev 1 and Rev 2, and P2P with each RTR type.

#[path = "conn_util.rs"]
mod util;

use util::*;
use xwarp_ddp::mpa::{RtrSet, RtrType};
use xwarp_rdmap::conn::ConnConfig;
use xwarp_rdmap::*;

fn framing(crc: bool, markers: bool, rev: u8) -> impl Fn(&mut ConnConfig) {
    move |c: &mut ConnConfig| {
        c.initiator.crc = crc;
        c.initiator.markers = markers;
        c.initiator.revision = rev;
        c.responder.markers = markers;
        c.emss = 200;
    }
}

fn run(crc: bool, markers: bool, rev: u8, seed: u64) {
    let mut rng = Rng(seed);
    let (mut c, mut s) = connect(
        framing(crc, markers, rev),
        framing(false, markers, rev),
        &mut rng,
        37,
    );
    let n = c.conn.negotiated().unwrap().clone();
    assert_eq!(n.crc, crc);
    assert_eq!(n.markers_tx, markers);
    assert_eq!(n.markers_rx, markers);
    assert_eq!(n.revision, rev);
    // 64 and a size that needs several FPDUs at EMSS 200.
    rping(&mut c, &mut s, 3, 64, &mut rng, 37);
    rping(&mut c, &mut s, 2, 1000, &mut rng, 300);
    // Graceful close from the client: the server sees the TCP close.
    c.conn.close();
    pump(&mut c, &mut s, &mut rng, 64, std::time::Instant::now());
    assert!(c.conn.is_closed() && s.conn.is_closed());
    assert!(c.events.contains(&conn::ConnEvent::Closed));
    assert!(!c
        .events
        .iter()
        .any(|e| matches!(e, conn::ConnEvent::Error(_))));
}

#[test]
fn rping_exchange_crc_off_markers_off_rev2() {
    run(false, false, 2, 1);
}

#[test]
fn rping_exchange_crc_on_markers_off_rev2() {
    run(true, false, 2, 2);
}

#[test]
fn rping_exchange_crc_off_markers_on_rev2() {
    run(false, true, 2, 3);
}

#[test]
fn rping_exchange_crc_on_markers_on_rev2() {
    run(true, true, 2, 4);
}

#[test]
fn rping_exchange_crc_on_markers_off_rev1() {
    run(true, false, 1, 5);
}

#[test]
fn rping_exchange_crc_off_markers_on_rev1() {
    run(false, true, 1, 6);
}

/// The first FPDU of the Initiator (right after its 24-byte Request) must be the RTR.
fn first_initiator_fpdu(i: &Peer) -> Vec<u8> {
    let fpdu = &i.sent[24..];
    let ulpdu_len = u16::from_be_bytes([fpdu[0], fpdu[1]]) as usize;
    fpdu[..2 + ulpdu_len].to_vec()
}

fn p2p(rtr: RtrType, crc: bool) {
    let mut rng = Rng(rtr as u64 + 10);
    let tweak_i = move |c: &mut ConnConfig| {
        c.initiator.p2p = Some(RtrSet::only(rtr));
        c.initiator.crc = crc;
    };
    let (mut c, mut s) = connect_with(
        tweak_i,
        |_| {},
        |_, r| {
            // A zero-length Send RTR consumes a receive (posted before the stream opens).
            if rtr == RtrType::Send {
                r.recv(7, Vec::new());
            }
        },
        &mut rng,
        13,
    );
    assert_eq!(c.conn.negotiated().unwrap().rtr, Some(rtr));
    assert!(
        established(&s),
        "P2P responder reports Established after the RTR"
    );
    let first = first_initiator_fpdu(&c);
    match rtr {
        // rfc6581_rtr_zero_length_write_stag_1_to_0 (siw's form).
        RtrType::Write => assert_eq!(
            first,
            [0x00, 0x0e, 0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
        ),
        RtrType::Read => {
            assert_eq!(&first[..4], &[0x00, 0x2e, 0x41, 0x41]);
            // QN 1, MSN 1, MO 0, read size 0.
            assert_eq!(&first[8..20], &[0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]);
            assert_eq!(&first[32..36], &[0, 0, 0, 0]);
        }
        RtrType::Send => {
            assert_eq!(
                first,
                [0x00, 0x12, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
            );
            let rc = s.completions();
            assert_eq!(rc.len(), 1);
            assert_eq!((rc[0].wr_id, rc[0].byte_len), (7, 0));
        }
    }
    // No completion for the RTR on the initiator.
    assert!(c.completions().is_empty());
    rping(&mut c, &mut s, 2, 64, &mut rng, 50);
}

#[test]
fn rfc6581_p2p_rtr_zero_length_write() {
    p2p(RtrType::Write, false);
}

#[test]
fn rfc6581_p2p_rtr_zero_length_read() {
    p2p(RtrType::Read, true);
}

#[test]
fn rfc6581_p2p_rtr_zero_length_send() {
    p2p(RtrType::Send, false);
}
