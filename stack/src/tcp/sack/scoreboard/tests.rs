//! Unit tests of the scoreboard, one per RFC 6675 / RFC 2883 rule.
use super::*;

const MSS: u32 = 100;

/// A scoreboard with `segs` segments of 100 octets outstanding from 1000.
fn sb(segs: u32) -> Scoreboard {
    let mut b = Scoreboard::new(
        Seq(1000),
        ScoreboardConfig {
            smss: MSS,
            dup_thresh: 3,
            max_ranges: 16,
        },
    );
    b.on_send_new(Seq(1000 + segs * MSS));
    b
}
fn sack(blocks: &[(u32, u32)]) -> SackList {
    let mut l = SackList::new();
    for &(s, e) in blocks {
        l.push(SackBlock::new(Seq(s), Seq(e)));
    }
    l
}
/// SACK segment `i` (0-based from 1000) with ACK 1000.
fn sack_seg(b: &mut Scoreboard, i: u32) -> AckInfo {
    b.on_ack(Seq(1000), &sack(&[(1000 + i * MSS, 1100 + i * MSS)]))
}

#[test]
fn rfc6675_2_dup_ack_counts_data_bearing_acks_with_new_sack() {
    let mut b = sb(10);
    let i = sack_seg(&mut b, 2);
    assert!(i.dup_ack && b.dup_acks() == 1);
    // The same SACK again reports nothing new: not a duplicate ACK in RFC 6675's sense.
    let i = sack_seg(&mut b, 2);
    assert!(!i.dup_ack && b.dup_acks() == 1);
}

#[test]
fn rfc6675_is_lost_dupthresh_sacked_above() {
    let mut b = sb(10);
    sack_seg(&mut b, 2);
    sack_seg(&mut b, 4);
    assert!(!b.is_lost(Seq(1000)));
    sack_seg(&mut b, 6);
    // Three discontiguous SACKed ranges above 1000.
    assert!(b.is_lost(Seq(1000)));
    assert!(b.is_lost(Seq(1100)));
    assert!(!b.is_lost(Seq(1300)), "only two ranges above");
    assert!(!b.is_lost(Seq(1200)), "SACKed octets are not lost");
}

#[test]
fn rfc6675_is_lost_by_bytes_above() {
    let mut b = sb(10);
    // One contiguous range of 3 segments > (3 - 1) * SMSS octets.
    b.on_ack(Seq(1000), &sack(&[(1100, 1400)]));
    assert!(b.is_lost(Seq(1000)));
    let mut b = sb(10);
    b.on_ack(Seq(1000), &sack(&[(1100, 1300)]));
    assert!(!b.is_lost(Seq(1000)), "exactly 2 * SMSS is not more than");
}

#[test]
fn rfc6675_5_2_enter_recovery_on_dupthresh_or_is_lost() {
    let mut b = sb(10);
    assert!(!sack_seg(&mut b, 1).enter_recovery);
    assert!(!sack_seg(&mut b, 3).enter_recovery);
    let i = sack_seg(&mut b, 5);
    assert!(i.enter_recovery);
    // IsLost alone (one ACK SACKing 3 segments) also triggers it.
    let mut b = sb(10);
    assert!(b.on_ack(Seq(1000), &sack(&[(1100, 1400)])).enter_recovery);
}

#[test]
fn rfc6675_5_4_enter_recovery_retransmits_first_unacked_segment() {
    let mut b = sb(10);
    b.on_ack(Seq(1000), &sack(&[(1050, 1400)]));
    let seg = b.enter_recovery().unwrap();
    // Up to SMSS, stopping at the SACKed octets.
    assert_eq!(seg, SackBlock::new(Seq(1000), Seq(1050)));
    assert!(b.in_recovery());
}

/// SetPipe() with nothing SACKed (the fast path): every outstanding octet once, plus once
/// more for what was retransmitted, up to HighData; nothing after the ACK passes it all.
#[test]
fn rfc6675_set_pipe_without_sacks_counts_flight_plus_retransmitted() {
    let mut b = sb(10); // 1000..2000
    assert_eq!(b.pipe(), 1000);
    b.on_retransmit(SackBlock::new(Seq(1000), Seq(1200)));
    assert_eq!(b.pipe(), 1200);
    b.on_ack(Seq(1100), &SackList::new());
    assert_eq!(b.pipe(), 900 + 100);
    b.on_ack(Seq(1500), &SackList::new());
    assert_eq!(b.pipe(), 500);
    b.on_ack(Seq(2000), &SackList::new());
    assert_eq!(b.pipe(), 0);
    // Once a block arrives the general walk takes over and agrees on what it shares.
    b.on_send_new(Seq(2500));
    b.on_ack(Seq(2000), &sack(&[(2400, 2500)]));
    assert_eq!(b.pipe(), 400);
}

#[test]
fn rfc6675_set_pipe_counts_unsacked_not_lost_plus_retransmitted() {
    let mut b = sb(10); // 1000..2000
    b.on_ack(
        Seq(1000),
        &sack(&[(1100, 1200), (1300, 1400), (1500, 1600)]),
    );
    // Holes: 1000..1100 (3 ranges above: lost), 1200..1300 (2: not), 1400..1500
    // (1: not), 1600..2000 (0: not). Pipe = 100 + 100 + 400.
    assert_eq!(b.pipe(), 600);
    let seg = b.enter_recovery().unwrap();
    assert_eq!(seg, SackBlock::new(Seq(1000), Seq(1100)));
    // The retransmission is in flight: +100.
    assert_eq!(b.pipe(), 700);
}

#[test]
fn rfc6675_next_seg_rule1_lost_above_high_rxt() {
    let mut b = sb(10);
    b.on_ack(
        Seq(1000),
        &sack(&[(1100, 1200), (1300, 1400), (1500, 1600), (1700, 1800)]),
    );
    b.enter_recovery(); // 1000..1100
                        // 1200..1300 has 3 ranges above: lost.
    assert_eq!(
        b.next_seg(0),
        NextSeg::Retransmit(SackBlock::new(Seq(1200), Seq(1300)))
    );
    // Rule (3) then: 1400..1500 is below the highest SACK, not lost.
    assert_eq!(
        b.next_seg(0),
        NextSeg::Retransmit(SackBlock::new(Seq(1400), Seq(1500)))
    );
}

#[test]
fn rfc6675_next_seg_rule2_new_data_before_rule3() {
    let mut b = sb(10);
    b.on_ack(Seq(1000), &sack(&[(1100, 1400), (1500, 1600)]));
    b.enter_recovery();
    assert_eq!(b.next_seg(5000), NextSeg::NewData(MSS));
    b.on_send_new(Seq(2100));
    assert_eq!(
        b.next_seg(0),
        NextSeg::Retransmit(SackBlock::new(Seq(1400), Seq(1500)))
    );
}

#[test]
fn rfc6675_next_seg_rule4_one_rescue_per_recovery() {
    let mut b = sb(4); // 1000..1400
    b.on_ack(Seq(1000), &sack(&[(1100, 1400)]));
    b.enter_recovery(); // 1000..1100 retransmitted; no other hole below a SACK
    assert_eq!(
        b.next_seg(0),
        NextSeg::Rescue(SackBlock::new(Seq(1000), Seq(1100)))
    );
    assert_eq!(b.next_seg(0), NextSeg::Nothing);
}

#[test]
fn rfc6675_5_a_cumulative_ack_past_recovery_point_ends_recovery() {
    let mut b = sb(10);
    b.on_ack(Seq(1000), &sack(&[(1100, 1400)]));
    b.enter_recovery();
    b.on_send_new(Seq(2500));
    let i = b.on_ack(Seq(1900), &SackList::new());
    assert!(!i.recovery_ended && b.in_recovery());
    let i = b.on_ack(Seq(2000), &SackList::new());
    assert!(i.recovery_ended && !b.in_recovery());
}

#[test]
fn rfc6675_5_1_rto_marks_unsacked_lost_below_recovery_point() {
    let mut b = sb(10);
    b.on_ack(Seq(1000), &sack(&[(1500, 1600)]));
    b.on_rto();
    assert!(b.is_lost(Seq(1000)) && b.is_lost(Seq(1700)));
    assert_eq!(
        b.next_seg(0),
        NextSeg::Retransmit(SackBlock::new(Seq(1000), Seq(1100)))
    );
    // The tail above the last SACK is resent too after an RTO.
    for _ in 0..4 {
        b.next_seg(0);
    }
    assert_eq!(
        b.next_seg(0),
        NextSeg::Retransmit(SackBlock::new(Seq(1600), Seq(1700)))
    );
}

#[test]
fn rfc6675_5_1_rto_new_data_above_recovery_point_not_lost() {
    let mut b = sb(10); // 1000..2000
    b.on_rto();
    b.on_send_new(Seq(2500));
    assert!(b.is_lost(Seq(1999)) && !b.is_lost(Seq(2000)));
    // Hole 1000..2500 split at RecoveryPoint: 1000 octets lost, 500 in flight.
    assert_eq!(b.pipe(), 500);
}

#[test]
fn rfc2883_4_dsack_below_ack_detected_not_recorded() {
    let mut b = sb(10);
    b.on_ack(Seq(1200), &SackList::new());
    let i = b.on_ack(Seq(1200), &sack(&[(1000, 1100)]));
    assert_eq!(i.dsack, Some(SackBlock::new(Seq(1000), Seq(1100))));
    assert_eq!((i.rejected, b.sacked_bytes()), (0, 0));
    assert!(!i.dup_ack);
}

#[test]
fn rfc2883_4_dsack_inside_second_block() {
    let mut b = sb(10);
    let i = b.on_ack(Seq(1000), &sack(&[(1300, 1400), (1200, 1500)]));
    assert_eq!(i.dsack, Some(SackBlock::new(Seq(1300), Seq(1400))));
    assert_eq!(b.sacked_bytes(), 300);
}

#[test]
fn rfc8985_9_marked_lost_leaves_the_pipe() {
    let mut b = sb(10);
    b.on_ack(Seq(1000), &sack(&[(1500, 1600)]));
    assert_eq!(b.pipe(), 900);
    b.mark_lost(SackBlock::new(Seq(1100), Seq(1200)));
    assert!(b.is_lost(Seq(1150)) && !b.is_lost(Seq(1000)));
    assert_eq!(b.pipe(), 800);
    b.on_retransmit(SackBlock::new(Seq(1100), Seq(1200)));
    assert_eq!(b.pipe(), 900 + 100);
    // Hostile or stale marks are ignored; the cumulative ACK trims them.
    b.mark_lost(SackBlock::new(Seq(5000), Seq(6000)));
    b.on_ack(Seq(1150), &SackList::new());
    assert!(b.is_lost(Seq(1150)));
    b.on_ack(Seq(1200), &SackList::new());
    assert!(!b.is_lost(Seq(1200)));
}

#[test]
fn hostile_blocks_rejected() {
    let mut b = sb(10); // 1000..2000
    let i = b.on_ack(
        Seq(1000),
        &sack(&[(1500, 1400), (1900, 2100), (5, 10), (1500, 1500)]),
    );
    assert_eq!(i.rejected, 4);
    assert_eq!(b.sacked_bytes(), 0);
    // An ACK beyond SND.NXT is ignored whole.
    assert!(b.on_ack(Seq(3000), &sack(&[(1100, 1200)])).ignored);
    assert_eq!(b.sacked_bytes(), 0);
}

#[test]
fn max_ranges_bounds_the_scoreboard() {
    let mut b = sb(100);
    let mut rejected = 0;
    for i in 0..50 {
        rejected += sack_seg(&mut b, 2 * i + 1).rejected;
    }
    assert_eq!(b.sacked().count(), 16);
    assert_eq!(rejected, 34);
}

#[test]
fn cumulative_ack_trims_sacked_ranges_across_wraparound() {
    let base = Seq(u32::MAX - 250);
    let mut b = Scoreboard::new(
        base,
        ScoreboardConfig {
            smss: MSS,
            ..Default::default()
        },
    );
    b.on_send_new(base.wrapping_add(1000));
    b.on_ack(
        base,
        &sack(&[(base.wrapping_add(200).0, base.wrapping_add(400).0)]),
    );
    assert_eq!(b.sacked_bytes(), 200);
    b.on_ack(base.wrapping_add(300), &SackList::new());
    assert_eq!(b.sacked_bytes(), 100);
    assert_eq!(
        b.sacked().next(),
        Some(SackBlock::new(
            base.wrapping_add(300),
            base.wrapping_add(400)
        ))
    );
}

/// RFC 6675 §3: HighRxt lies between HighACK and HighData; a HighRxt left behind at ISS
/// while more than 2^31 octets are acknowledged without a loss must not wrap around to
/// "ahead" (that corrupted the stream of one-way bulk past 2 GiB).
#[test]
fn rfc6675_3_high_rxt_follows_high_ack_past_2_pow_31_octets() {
    let mut b = sb(10);
    let mut at = Seq(2000);
    b.on_ack(at, &SackList::new());
    for _ in 0..3 {
        at = at.wrapping_add(1 << 30);
        b.on_send_new(at);
        b.on_ack(at, &SackList::new());
    }
    b.on_send_new(at.wrapping_add(10 * MSS));
    assert_eq!(b.outstanding(), 10 * MSS);
    // Nothing retransmitted: the pipe is what is in flight, once.
    assert_eq!(b.pipe(), 10 * MSS);
    assert!(matches!(b.next_seg(MSS), NextSeg::NewData(_)));
}
