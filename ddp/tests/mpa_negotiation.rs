//! One test per MPA negotiation rule (RFC 5044 §7, RFC 6581, siw behaviour of
//! docs/siw.md §4.2/§4.3), driving the sans-IO Negotiator with bytes and timestamps.

use std::time::{Duration, Instant};

use xwarp_ddp::mpa::frame::{flags, KEY_REPLY, KEY_REQUEST};
use xwarp_ddp::mpa::{
    AcceptParams, ConnectRequest, EnhancedBlock, Event, FpduEvent, FrameError, FrameKind,
    FrameParse, FrameRepr, InitiatorConfig, LocalError, MpaError, Negotiated, Negotiator,
    ResponderConfig, Role, RtrSet, RtrType,
};

fn frame(key: &[u8; 16], flag: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
    let mut v = key.to_vec();
    v.push(flag);
    v.push(rev);
    v.extend_from_slice(&(pd.len() as u16).to_be_bytes());
    v.extend_from_slice(pd);
    v
}

fn block(b: EnhancedBlock) -> Vec<u8> {
    b.to_bytes().unwrap().to_vec()
}

fn parse(f: &[u8]) -> FrameRepr<'_> {
    match FrameRepr::parse(f).unwrap() {
        FrameParse::Complete { repr, len } => {
            assert_eq!(len, f.len());
            repr
        }
        other => panic!("{other:?}"),
    }
}

fn initiator(cfg: InitiatorConfig) -> (Negotiator, Vec<u8>) {
    let mut n = Negotiator::initiator(cfg, Instant::now()).unwrap();
    let req = n.poll_transmit().unwrap();
    assert_eq!(n.poll_transmit(), None);
    (n, req)
}

fn established(n: &mut Negotiator) -> Negotiated {
    match n.poll_event() {
        Some(Event::Established(neg)) => neg,
        other => panic!("expected Established, got {other:?}"),
    }
}

fn failed(n: &mut Negotiator) -> MpaError {
    match n.poll_event() {
        Some(Event::Failed(e)) => e,
        other => panic!("expected Failed, got {other:?}"),
    }
}

/// Responder fed `request`; returns it with the ConnectRequest.
fn responder(cfg: ResponderConfig, request: &[u8]) -> (Negotiator, ConnectRequest) {
    let mut r = Negotiator::responder(cfg, Instant::now()).unwrap();
    assert_eq!(
        r.handle_input(Instant::now(), request).unwrap(),
        request.len()
    );
    match r.poll_event() {
        Some(Event::ConnectRequest(c)) => (r, c),
        other => panic!("expected ConnectRequest, got {other:?}"),
    }
}

/// Full exchange between our initiator and our responder.
fn pair(
    icfg: InitiatorConfig,
    rcfg: ResponderConfig,
    params: AcceptParams,
) -> (Negotiated, Negotiated, Vec<u8>, Vec<u8>) {
    let (mut i, req) = initiator(icfg);
    let (mut r, _) = responder(rcfg, &req);
    r.accept(params).unwrap();
    let rep = r.poll_transmit().unwrap();
    let rn = established(&mut r);
    assert_eq!(i.handle_input(Instant::now(), &rep).unwrap(), rep.len());
    let inn = established(&mut i);
    (inn, rn, req, rep)
}

fn accept11() -> AcceptParams {
    AcceptParams {
        ird: 1,
        ord: 1,
        private_data: Vec::new(),
    }
}

#[test]
fn siw_rping_request_is_enhanced_rev2_ird1_ord1() {
    // docs/protocols.md §5.3: what a siw rping client sends; our defaults produce the same.
    let (_, req) = initiator(InitiatorConfig::default());
    assert_eq!(req, frame(&KEY_REQUEST, 0x10, 2, &[0, 1, 0, 1]));
}

#[test]
fn siw_rping_server_reply_bytes() {
    // docs/protocols.md §5.3: Reply to `10 02 00 04 00 01 00 01` is "MPA ID Rep Frame" 10 02 00 04 00 01 00 01.
    let req = frame(&KEY_REQUEST, 0x10, 2, &[0, 1, 0, 1]);
    let (mut r, c) = responder(ResponderConfig::default(), &req);
    assert_eq!((c.peer_ird, c.peer_ord, c.p2p), (Some(1), Some(1), None));
    r.accept(accept11()).unwrap();
    assert_eq!(
        r.poll_transmit().unwrap(),
        frame(&KEY_REPLY, 0x10, 2, &[0, 1, 0, 1])
    );
}

#[test]
fn rfc5044_initiator_sends_nothing_until_reply_fully_received() {
    let (mut i, _) = initiator(InitiatorConfig::default());
    let rep = frame(&KEY_REPLY, 0x10, 2, &[0, 1, 0, 1]);
    for (k, b) in rep.iter().enumerate() {
        assert_eq!(i.poll_transmit(), None);
        assert!(!i.is_established());
        assert_eq!(
            i.poll_event(),
            None,
            "event before the Reply completed at byte {k}"
        );
        assert_eq!(
            i.handle_input(Instant::now(), std::slice::from_ref(b))
                .unwrap(),
            1
        );
    }
    assert!(i.is_established());
    let n = established(&mut i);
    assert_eq!((n.ird, n.ord, n.crc), (1, 1, false));
    assert_eq!(i.poll_transmit(), None);
    assert_eq!(i.poll_timeout(), None);
}

#[test]
fn rfc5044_fpdu_bytes_behind_reply_are_returned_unconsumed() {
    // Be liberal: FPDU bytes arriving in the same read as the Reply (docs/mpa.md §1.9).
    let (mut i, _) = initiator(InitiatorConfig::default());
    let mut input = frame(&KEY_REPLY, 0x10, 2, &[0, 1, 0, 1]);
    let mut enc = xwarp_ddp::mpa::FpduEncoder::new(false, false);
    let fpdu = enc
        .encode_to_vec(&[&[0xC1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]])
        .unwrap();
    input.extend_from_slice(&fpdu);
    let used = i.handle_input(Instant::now(), &input).unwrap();
    assert_eq!(used, 24);
    let neg = established(&mut i);
    let mut p = neg.fpdu_parser();
    let mut rest = &input[used..];
    assert!(matches!(p.next(&mut rest).unwrap(), Some(FpduEvent::Header(h)) if h.is_tagged()));
    assert_eq!(p.next(&mut rest).unwrap(), Some(FpduEvent::End));
    // After negotiation nothing more is consumed.
    assert_eq!(i.handle_input(Instant::now(), &fpdu).unwrap(), 0);
}

#[test]
fn rfc5044_responder_must_wait_for_first_fpdu_and_initiator_sends_first() {
    let (i, r, _, _) = pair(
        InitiatorConfig::default(),
        ResponderConfig::default(),
        accept11(),
    );
    assert_eq!(r.role, Role::Responder);
    assert!(r.responder_must_wait_for_first_fpdu());
    assert_eq!(i.role, Role::Initiator);
    assert!(!i.responder_must_wait_for_first_fpdu());
}

#[test]
fn rfc5044_crc_in_reply_enables_crc_both_ways() {
    let (mut i, _) = initiator(InitiatorConfig::default());
    i.handle_input(Instant::now(), &frame(&KEY_REPLY, 0x50, 2, &[0, 1, 0, 1]))
        .unwrap();
    let n = established(&mut i);
    assert!(n.crc);
    assert!(n.fpdu_encoder().crc_enabled() && n.fpdu_parser().crc_enabled());
}

#[test]
fn rfc5044_responder_receiving_c_answers_c() {
    let icfg = InitiatorConfig {
        crc: true,
        ..Default::default()
    };
    let (i, r, req, rep) = pair(icfg, ResponderConfig::default(), accept11());
    assert_eq!(req[16], 0x50);
    assert_eq!(rep[16] & flags::CRC, flags::CRC);
    assert!(i.crc && r.crc);
}

#[test]
fn rfc5044_responder_may_require_crc() {
    let rcfg = ResponderConfig {
        crc: true,
        ..Default::default()
    };
    let (i, r, _, rep) = pair(InitiatorConfig::default(), rcfg, accept11());
    assert!(parse(&rep).crc);
    assert!(i.crc && r.crc);
}

#[test]
fn rfc5044_no_crc_unless_requested() {
    let (i, r, _, _) = pair(
        InitiatorConfig::default(),
        ResponderConfig::default(),
        accept11(),
    );
    assert!(!i.crc && !r.crc);
}

#[test]
fn rfc5044_markers_in_request_mean_responder_inserts_toward_initiator() {
    let icfg = InitiatorConfig {
        markers: true,
        ..Default::default()
    };
    let (i, r, req, rep) = pair(icfg, ResponderConfig::default(), accept11());
    assert!(parse(&req).markers && !parse(&rep).markers);
    assert!(r.markers_tx && !r.markers_rx);
    assert!(i.markers_rx && !i.markers_tx);
}

#[test]
fn rfc5044_markers_in_reply_mean_initiator_inserts_toward_responder() {
    let rcfg = ResponderConfig {
        markers: true,
        ..Default::default()
    };
    let (i, r, _, rep) = pair(InitiatorConfig::default(), rcfg, accept11());
    assert!(parse(&rep).markers);
    assert!(i.markers_tx && !i.markers_rx);
    assert!(r.markers_rx && !r.markers_tx);
    assert!(i.fpdu_encoder().markers_enabled() && r.fpdu_parser().markers_enabled());
}

#[test]
fn siw_refuses_markers_with_reject_reply() {
    // siw answers M=1 with R=1 (docs/siw.md §4.3); we do the same when markers are off.
    let req = frame(&KEY_REQUEST, 0x90, 2, &[0, 1, 0, 1]);
    let mut r = Negotiator::responder(
        ResponderConfig {
            accept_peer_markers: false,
            ..Default::default()
        },
        Instant::now(),
    )
    .unwrap();
    let err = r.handle_input(Instant::now(), &req).unwrap_err();
    assert_eq!(err, MpaError::InvalidFrame(FrameError::MarkersRefused));
    assert_eq!(failed(&mut r), err);
    let rep = r.poll_transmit().unwrap();
    assert!(parse(&rep).reject);
    assert!(r.is_closed());
}

#[test]
fn initiator_refuses_reply_markers_when_disabled() {
    let (mut i, _) = initiator(InitiatorConfig {
        accept_peer_markers: false,
        ..Default::default()
    });
    let err = i
        .handle_input(Instant::now(), &frame(&KEY_REPLY, 0x90, 2, &[0, 1, 0, 1]))
        .unwrap_err();
    assert_eq!(err.llp_error_code(), Some(0x04));
}

#[test]
fn rfc5044_reject_with_private_data() {
    let (mut i, req) = initiator(InitiatorConfig::default());
    let (mut r, _) = responder(ResponderConfig::default(), &req);
    r.reject(b"go away").unwrap();
    assert!(r.is_closed());
    assert_eq!(r.poll_event(), None);
    let rep = r.poll_transmit().unwrap();
    let repr = parse(&rep);
    assert!(repr.reject);
    assert_eq!(repr.private_data, b"go away");
    i.handle_input(Instant::now(), &rep).unwrap();
    assert_eq!(
        i.poll_event(),
        Some(Event::Rejected {
            private_data: b"go away".to_vec()
        })
    );
    assert!(i.is_closed() && !i.is_established());
}

#[test]
fn rfc5044_ulp_private_data_carried_both_ways() {
    let icfg = InitiatorConfig {
        private_data: b"hello".to_vec(),
        ..Default::default()
    };
    let (mut i, req) = initiator(icfg);
    let (mut r, c) = responder(ResponderConfig::default(), &req);
    assert_eq!(c.private_data, b"hello");
    r.accept(AcceptParams {
        ird: 1,
        ord: 1,
        private_data: b"world!".to_vec(),
    })
    .unwrap();
    let rep = r.poll_transmit().unwrap();
    assert_eq!(u16::from_be_bytes([rep[18], rep[19]]), 4 + 6);
    assert_eq!(established(&mut r).peer_private_data, b"hello");
    i.handle_input(Instant::now(), &rep).unwrap();
    assert_eq!(established(&mut i).peer_private_data, b"world!");
}

#[test]
fn siw_private_data_limit_256_on_emit() {
    // PD_Length (incl. the v2 block) ≤ 256 (docs/siw.md §4.3, §4.8.1).
    let ok = InitiatorConfig {
        private_data: vec![7; 252],
        ..Default::default()
    };
    let (_, req) = initiator(ok);
    assert_eq!(req.len(), 20 + 256);
    let too_long = InitiatorConfig {
        private_data: vec![7; 253],
        ..Default::default()
    };
    assert_eq!(
        Negotiator::initiator(too_long, Instant::now()).unwrap_err(),
        MpaError::Local(LocalError::PrivateDataTooLong { pd_length: 257 })
    );
    // Responder: accept with too much private data is refused and changes nothing.
    let (mut r, _) = responder(ResponderConfig::default(), &req);
    let big = AcceptParams {
        ird: 1,
        ord: 1,
        private_data: vec![0; 253],
    };
    assert!(matches!(
        r.accept(big),
        Err(MpaError::Local(LocalError::PrivateDataTooLong { .. }))
    ));
    assert!(r.reject(&[0; 253]).is_err());
    assert_eq!(r.poll_transmit(), None);
    r.accept(accept11()).unwrap();
    assert!(r.poll_transmit().is_some());
}

#[test]
fn rfc5044_pd_length_up_to_512_accepted_on_receive() {
    let req = frame(
        &KEY_REQUEST,
        0x10,
        2,
        &[[0, 1, 0, 1].as_slice(), &[9; 508]].concat(),
    );
    let (_, c) = responder(ResponderConfig::default(), &req);
    assert_eq!(c.private_data.len(), 508);
    let too_long = frame(&KEY_REQUEST, 0x10, 2, &[0; 513]);
    let mut r = Negotiator::responder(ResponderConfig::default(), Instant::now()).unwrap();
    let err = r.handle_input(Instant::now(), &too_long).unwrap_err();
    assert_eq!(
        err,
        MpaError::InvalidFrame(FrameError::PdLengthTooLong(513))
    );
    assert_eq!(err.llp_error_code(), Some(0x04));
    assert_eq!(r.poll_transmit(), None);
}

#[test]
fn rfc5044_invalid_key_is_llp_0x04() {
    let (mut i, _) = initiator(InitiatorConfig::default());
    let err = i
        .handle_input(Instant::now(), b"MPA ID Rxp Frame\x10\x02\x00\x00")
        .unwrap_err();
    assert_eq!(err, MpaError::InvalidFrame(FrameError::BadKey));
    assert_eq!(err.llp_error_code(), Some(0x04));
    assert_eq!(failed(&mut i), err);
    // A Request where a Reply is expected is invalid too.
    let (mut i, req) = initiator(InitiatorConfig::default());
    let err = i.handle_input(Instant::now(), &req).unwrap_err();
    assert_eq!(err, MpaError::InvalidFrame(FrameError::UnexpectedKey));
}

#[test]
fn rfc5044_bad_key_detected_on_first_bytes() {
    let mut r = Negotiator::responder(ResponderConfig::default(), Instant::now()).unwrap();
    assert!(r.handle_input(Instant::now(), b"GET / HTTP/1.1").is_err());
    assert!(r.is_closed());
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn rfc6581_responder_replies_rev1_when_it_speaks_only_rev1() {
    let rcfg = ResponderConfig {
        max_revision: 1,
        ..Default::default()
    };
    let (i, r, _, rep) = pair(InitiatorConfig::default(), rcfg, accept11());
    let repr = parse(&rep);
    assert_eq!(repr.revision, 1);
    assert!(repr.enhanced_block.is_none() && !repr.enhanced);
    assert_eq!(rep.len(), 20);
    assert!(!i.enhanced && !r.enhanced);
    assert_eq!((i.peer_ird, i.rtr), (None, None));
    assert_eq!((i.ird, i.ord), (1, 1));
}

#[test]
fn rfc5044_rev1_request_gets_rev1_reply() {
    let icfg = InitiatorConfig {
        revision: 1,
        ..Default::default()
    };
    let (i, _, req, rep) = pair(icfg, ResponderConfig::default(), accept11());
    assert_eq!(req, frame(&KEY_REQUEST, 0, 1, &[]));
    assert_eq!(rep, frame(&KEY_REPLY, 0, 1, &[]));
    assert_eq!(i.revision, 1);
}

#[test]
fn rfc5044_unsupported_revision_closes_without_reply() {
    // siw drops a Rev > 2 Request silently (docs/siw.md §4.8.5).
    for rev in [0u8, 3, 255] {
        let mut r = Negotiator::responder(ResponderConfig::default(), Instant::now()).unwrap();
        let err = r
            .handle_input(Instant::now(), &frame(&KEY_REQUEST, 0, rev, &[]))
            .unwrap_err();
        assert_eq!(
            err,
            MpaError::InvalidFrame(FrameError::UnsupportedRevision(rev))
        );
        assert_eq!(r.poll_transmit(), None);
    }
}

#[test]
fn rfc6581_reply_rev_higher_than_request_is_invalid() {
    let (mut i, _) = initiator(InitiatorConfig {
        revision: 1,
        ..Default::default()
    });
    let err = i.handle_input(Instant::now(), &frame(&KEY_REPLY, 0x10, 2, &[0, 1, 0, 1]));
    assert_eq!(
        err.unwrap_err(),
        MpaError::InvalidFrame(FrameError::RevisionNotDowngraded {
            requested: 1,
            replied: 2
        })
    );
}

#[test]
fn siw_reply_echoing_reserved_flag_bits_is_accepted() {
    // A siw Responder reuses the Request's flag word (docs/siw.md §4.3, §4.8.4),
    // e.g. its private GSO bit 0x08: reserved bits are ignored on receive.
    let (mut i, _) = initiator(InitiatorConfig::default());
    i.handle_input(Instant::now(), &frame(&KEY_REPLY, 0x18, 2, &[0, 1, 0, 1]))
        .unwrap();
    assert_eq!(established(&mut i).ird, 1);
}

#[test]
fn siw_echo_reserved_flags_option() {
    let req = frame(&KEY_REQUEST, 0x18, 2, &[0, 1, 0, 1]);
    let (mut r, _) = responder(ResponderConfig::default(), &req);
    r.accept(accept11()).unwrap();
    assert_eq!(
        r.poll_transmit().unwrap()[16],
        0x10,
        "RFC: reserved bits sent as 0"
    );
    let echo = ResponderConfig {
        echo_reserved_flags: true,
        ..Default::default()
    };
    let (mut r, _) = responder(echo, &req);
    r.accept(accept11()).unwrap();
    assert_eq!(r.poll_transmit().unwrap()[16], 0x18, "siw-style echo");
}

#[test]
fn rfc6581_missing_enhanced_block_gets_reject_reply() {
    // siw: Rev 2 + enhanced with PD_Length < 4 → Reply R=1 (docs/siw.md §4.3).
    let mut r = Negotiator::responder(ResponderConfig::default(), Instant::now()).unwrap();
    let err = r
        .handle_input(Instant::now(), &frame(&KEY_REQUEST, 0x10, 2, &[0, 1]))
        .unwrap_err();
    assert_eq!(
        err,
        MpaError::InvalidFrame(FrameError::MissingEnhancedBlock)
    );
    assert!(parse(&r.poll_transmit().unwrap()).reject);
}

#[test]
fn rfc6581_p2p_responder_echoes_a_and_picks_write_first() {
    let icfg = InitiatorConfig {
        p2p: Some(RtrSet::ALL),
        ..Default::default()
    };
    let (i, r, req, rep) = pair(icfg, ResponderConfig::default(), accept11());
    let rb = parse(&req).enhanced_block.unwrap();
    assert!(rb.p2p && rb.rtr == RtrSet::ALL);
    let b = parse(&rep).enhanced_block.unwrap();
    assert!(b.p2p, "RFC 6581: A in the Request ⇒ A in the Reply");
    assert_eq!(b.rtr, RtrSet::only(RtrType::Write));
    assert_eq!(i.rtr_to_send(), Some(RtrType::Write));
    assert_eq!(r.rtr, Some(RtrType::Write));
    assert_eq!(r.rtr_to_send(), None);
}

#[test]
fn rfc6581_p2p_responder_picks_read_when_write_not_offered() {
    let offered = RtrSet {
        send: true,
        write: false,
        read: true,
    };
    let icfg = InitiatorConfig {
        p2p: Some(offered),
        ..Default::default()
    };
    let (i, r, _, rep) = pair(icfg, ResponderConfig::default(), accept11());
    assert_eq!(
        parse(&rep).enhanced_block.unwrap().rtr,
        RtrSet::only(RtrType::Read)
    );
    assert_eq!(i.rtr_to_send(), Some(RtrType::Read));
    assert!(r.ird >= 1 && i.ord >= 1, "a Read RTR needs IRD/ORD ≥ 1");
}

#[test]
fn rfc6581_p2p_responder_picks_send_last() {
    let icfg = InitiatorConfig {
        p2p: Some(RtrSet::only(RtrType::Send)),
        ..Default::default()
    };
    let (i, _, _, _) = pair(icfg, ResponderConfig::default(), accept11());
    assert_eq!(i.rtr_to_send(), Some(RtrType::Send));
    // The responder's supported set also limits the choice.
    let icfg = InitiatorConfig {
        p2p: Some(RtrSet::ALL),
        ..Default::default()
    };
    let rcfg = ResponderConfig {
        rtr: RtrSet::only(RtrType::Send),
        ..Default::default()
    };
    let (i, _, _, _) = pair(icfg, rcfg, accept11());
    assert_eq!(i.rtr_to_send(), Some(RtrType::Send));
}

#[test]
fn siw_p2p_read_rtr_forces_initiator_ord_at_least_one() {
    // docs/siw.md §4.2: with P2P "ORD is forced ≥ 1" for a Read RTR.
    let icfg = InitiatorConfig {
        p2p: Some(RtrSet::only(RtrType::Read)),
        ord: 0,
        siw_min_ird_ord: false,
        ..Default::default()
    };
    let (_, req) = initiator(icfg);
    assert_eq!(parse(&req).enhanced_block.unwrap().ord, 1);
}

#[test]
fn rfc6581_no_matching_rtr_is_llp_0x07() {
    // Responder side: no usable type ⇒ Reply R=1 and 0x07.
    let offered = RtrSet::only(RtrType::Read);
    let (_, req) = initiator(InitiatorConfig {
        p2p: Some(offered),
        ..Default::default()
    });
    let rcfg = ResponderConfig {
        rtr: RtrSet::only(RtrType::Write),
        ..Default::default()
    };
    let mut r = Negotiator::responder(rcfg, Instant::now()).unwrap();
    let err = r.handle_input(Instant::now(), &req).unwrap_err();
    assert_eq!(err, MpaError::NoMatchingRtr);
    assert_eq!(err.llp_error_code(), Some(0x07));
    let rep = r.poll_transmit().unwrap();
    assert!(parse(&rep).reject);
    // Initiator side: the Reply selects a type we did not offer, or several types.
    for rtr in [RtrSet::only(RtrType::Write), RtrSet::ALL, RtrSet::NONE] {
        let (mut i, _) = initiator(InitiatorConfig {
            p2p: Some(offered),
            ..Default::default()
        });
        let b = EnhancedBlock {
            p2p: true,
            rtr,
            ird: 1,
            ord: 1,
        };
        let err = i.handle_input(Instant::now(), &frame(&KEY_REPLY, 0x10, 2, &block(b)));
        assert_eq!(err.unwrap_err(), MpaError::NoMatchingRtr);
    }
    // A in the Reply without an offer.
    let (mut i, _) = initiator(InitiatorConfig::default());
    let b = EnhancedBlock {
        p2p: true,
        rtr: RtrSet::only(RtrType::Write),
        ird: 1,
        ord: 1,
    };
    let err = i.handle_input(Instant::now(), &frame(&KEY_REPLY, 0x10, 2, &block(b)));
    assert_eq!(err.unwrap_err(), MpaError::NoMatchingRtr);
}

#[test]
fn siw_old_reply_without_a_means_no_p2p() {
    // Historical siw did not echo A (docs/siw.md §4.8.12): P2P simply not in use.
    let (mut i, _) = initiator(InitiatorConfig {
        p2p: Some(RtrSet::ALL),
        ..Default::default()
    });
    i.handle_input(Instant::now(), &frame(&KEY_REPLY, 0x10, 2, &[0, 1, 0, 1]))
        .unwrap();
    assert_eq!(established(&mut i).rtr_to_send(), None);
}

#[test]
fn rfc6581_responder_ord_never_exceeds_initiator_ird() {
    let icfg = InitiatorConfig {
        ird: 2,
        ord: 3,
        ..Default::default()
    };
    let params = AcceptParams {
        ird: 8,
        ord: 16,
        private_data: vec![],
    };
    let (i, r, _, rep) = pair(icfg, ResponderConfig::default(), params);
    let b = parse(&rep).enhanced_block.unwrap();
    assert_eq!((b.ird, b.ord), (8, 2));
    assert_eq!((r.ird, r.ord), (8, 2));
    assert_eq!((r.peer_ird, r.peer_ord), (Some(2), Some(3)));
    assert_eq!((i.ird, i.ord), (2, 3));
}

#[test]
fn siw_relaxed_ird_responder_raises_ird_to_initiator_ord() {
    // docs/siw.md §4.3: Reply IRD = max(ULP ird, peer ORD) if ≤ 128.
    let icfg = InitiatorConfig {
        ird: 1,
        ord: 16,
        ..Default::default()
    };
    let (i, r, _, _) = pair(icfg.clone(), ResponderConfig::default(), accept11());
    assert_eq!(r.ird, 16);
    assert_eq!(i.ord, 16);
    // Above max_ird: keep ours; the initiator lowers its ORD (relaxed).
    let rcfg = ResponderConfig {
        max_ird: 8,
        ..Default::default()
    };
    let (i, r, _, _) = pair(icfg, rcfg, accept11());
    assert_eq!(r.ird, 1);
    assert_eq!(i.ord, 1);
}

#[test]
fn rfc6581_insufficient_ird_is_llp_0x06() {
    // Strict: the Reply's ORD exceeds our IRD.
    let strict = InitiatorConfig {
        relaxed_ird_ord: false,
        ..Default::default()
    };
    let (mut i, _) = initiator(strict.clone());
    let b = EnhancedBlock {
        p2p: false,
        rtr: RtrSet::NONE,
        ird: 1,
        ord: 4,
    };
    let err = i
        .handle_input(Instant::now(), &frame(&KEY_REPLY, 0x10, 2, &block(b)))
        .unwrap_err();
    assert!(matches!(
        err,
        MpaError::InsufficientIrd {
            local_ird: 1,
            peer_ord: 4,
            ..
        }
    ));
    assert_eq!(err.llp_error_code(), Some(0x06));
    // Strict: the Reply's IRD is below our ORD.
    let (mut i, _) = initiator(InitiatorConfig { ord: 4, ..strict });
    let b = EnhancedBlock {
        p2p: false,
        rtr: RtrSet::NONE,
        ird: 2,
        ord: 1,
    };
    let err = i
        .handle_input(Instant::now(), &frame(&KEY_REPLY, 0x10, 2, &block(b)))
        .unwrap_err();
    assert_eq!(err.llp_error_code(), Some(0x06));
    // Relaxed, but the Reply's ORD is above max_ird.
    let (mut i, _) = initiator(InitiatorConfig {
        max_ird: 64,
        ..Default::default()
    });
    let b = EnhancedBlock {
        p2p: false,
        rtr: RtrSet::NONE,
        ird: 1,
        ord: 65,
    };
    let err = i
        .handle_input(Instant::now(), &frame(&KEY_REPLY, 0x10, 2, &block(b)))
        .unwrap_err();
    assert_eq!(err.llp_error_code(), Some(0x06));
}

#[test]
fn siw_relaxed_ird_initiator_adjusts() {
    // docs/siw.md §4.2: own IRD := Reply ORD, own ORD := Reply IRD (within limits).
    let (mut i, _) = initiator(InitiatorConfig {
        ird: 1,
        ord: 8,
        ..Default::default()
    });
    let b = EnhancedBlock {
        p2p: false,
        rtr: RtrSet::NONE,
        ird: 2,
        ord: 4,
    };
    i.handle_input(Instant::now(), &frame(&KEY_REPLY, 0x10, 2, &block(b)))
        .unwrap();
    let n = established(&mut i);
    assert_eq!((n.ird, n.ord), (4, 2));
    assert_eq!((n.peer_ird, n.peer_ord), (Some(2), Some(4)));
}

#[test]
fn siw_ird_ord_at_least_one_by_default() {
    // docs/siw.md §4.8.11: IRD/ORD 0 toward siw breaks RDMA Read.
    let (_, req) = initiator(InitiatorConfig {
        ird: 0,
        ord: 0,
        ..Default::default()
    });
    assert_eq!(&req[20..], &[0, 1, 0, 1]);
    let off = InitiatorConfig {
        ird: 0,
        ord: 0,
        siw_min_ird_ord: false,
        ..Default::default()
    };
    let (_, req) = initiator(off);
    assert_eq!(&req[20..], &[0, 0, 0, 0]);
    let (mut r, _) = responder(
        ResponderConfig::default(),
        &frame(&KEY_REQUEST, 0x10, 2, &[0, 1, 0, 1]),
    );
    r.accept(AcceptParams::default()).unwrap();
    assert_eq!(&r.poll_transmit().unwrap()[20..], &[0, 1, 0, 1]);
}

#[test]
fn ird_ord_above_14_bits_refused() {
    let err = Negotiator::initiator(
        InitiatorConfig {
            ird: 0x4000,
            ..Default::default()
        },
        Instant::now(),
    )
    .unwrap_err();
    assert_eq!(err, MpaError::Local(LocalError::IrdOrdTooLarge));
}

#[test]
fn siw_timeouts_initiator_10s_responder_5s_none_while_ulp_decides() {
    let t0 = Instant::now();
    let mut i = Negotiator::initiator(InitiatorConfig::default(), t0).unwrap();
    assert_eq!(i.poll_timeout(), Some(t0 + Duration::from_secs(10)));
    i.handle_timeout(t0 + Duration::from_secs(9));
    assert_eq!(i.poll_event(), None);
    i.handle_timeout(t0 + Duration::from_secs(10));
    let err = failed(&mut i);
    assert_eq!(err, MpaError::Timeout);
    assert_eq!(err.llp_error_code(), Some(0x01));
    assert_eq!(i.poll_timeout(), None);

    let mut r = Negotiator::responder(ResponderConfig::default(), t0).unwrap();
    assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    let req = frame(&KEY_REQUEST, 0x10, 2, &[0, 1, 0, 1]);
    // Split Request: the timer still runs until it is complete.
    r.handle_input(t0, &req[..10]).unwrap();
    assert!(r.poll_timeout().is_some());
    r.handle_input(t0, &req[10..]).unwrap();
    assert!(matches!(r.poll_event(), Some(Event::ConnectRequest(_))));
    assert_eq!(r.poll_timeout(), None);
    r.handle_timeout(t0 + Duration::from_secs(3600));
    assert_eq!(r.poll_event(), None);
    r.accept(accept11()).unwrap();
    assert!(r.is_established());
}

#[test]
fn configured_timeouts_are_used() {
    let t0 = Instant::now();
    let cfg = InitiatorConfig {
        reply_timeout: Duration::from_millis(250),
        ..Default::default()
    };
    let i = Negotiator::initiator(cfg, t0).unwrap();
    assert_eq!(i.poll_timeout(), Some(t0 + Duration::from_millis(250)));
    let cfg = ResponderConfig {
        request_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let r = Negotiator::responder(cfg, t0).unwrap();
    assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_secs(1)));
}

#[test]
fn responder_does_not_consume_bytes_behind_request() {
    // An Initiator must not pipeline data behind its Request (siw fails such a connection,
    // docs/siw.md §4.5); we consume only the frame and leave the rest to the caller.
    let mut input = frame(&KEY_REQUEST, 0x10, 2, &[0, 1, 0, 1]);
    input.extend_from_slice(&[0, 14, 0xC1]);
    let mut r = Negotiator::responder(ResponderConfig::default(), Instant::now()).unwrap();
    assert_eq!(r.handle_input(Instant::now(), &input).unwrap(), 24);
    assert_eq!(r.handle_input(Instant::now(), &input[24..]).unwrap(), 0);
}

#[test]
fn accept_and_reject_only_while_ulp_decides() {
    let mut r = Negotiator::responder(ResponderConfig::default(), Instant::now()).unwrap();
    assert_eq!(
        r.accept(accept11()),
        Err(MpaError::Local(LocalError::InvalidState))
    );
    assert_eq!(
        r.reject(b""),
        Err(MpaError::Local(LocalError::InvalidState))
    );
    let (mut i, _) = initiator(InitiatorConfig::default());
    assert!(i.accept(accept11()).is_err());
}

#[test]
fn end_to_end_fpdus_after_negotiation_with_crc_and_markers() {
    let icfg = InitiatorConfig {
        crc: true,
        markers: true,
        ..Default::default()
    };
    let rcfg = ResponderConfig {
        markers: true,
        ..Default::default()
    };
    let (i, r, _, _) = pair(icfg, rcfg, accept11());
    let mut tx = i.fpdu_encoder();
    let mut rx = r.fpdu_parser();
    let payload: Vec<u8> = (0..3000u32).map(|x| (x * 7) as u8).collect();
    let hdr = [0xC1, 0x40, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0x10, 0];
    let wire = tx.encode_to_vec(&[&hdr, &payload]).unwrap();
    let mut input = &wire[..];
    let mut got = Vec::new();
    while let Some(ev) = rx.next(&mut input).unwrap() {
        if let FpduEvent::Payload(s) = ev {
            got.extend_from_slice(s);
        }
    }
    assert_eq!(got, payload);
    assert!(rx.is_idle());
    assert_eq!(
        FrameKind::Request,
        parse(&frame(&KEY_REQUEST, 0, 1, &[])).kind
    );
}
