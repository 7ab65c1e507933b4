//! A unit test per rule, each checking the numbers against the RFC's formula computed here.

use super::cubic::{ALPHA, BETA, C};
use super::*;
use proptest::prelude::*;
use smoltcp::time::{Duration, Instant};

const MSS: u32 = 1000;

fn ctl(algorithm: Algorithm) -> Controller {
    Controller::try_new(CcConfig {
        algorithm,
        mss: MSS,
        initial_window: 10 * MSS,
    })
    .expect("valid config")
}

fn ack(newly_acked: u32) -> AckEvent {
    AckEvent {
        newly_acked,
        ..AckEvent::default()
    }
}

fn at_ms(ms: i64) -> Instant {
    Instant::from_millis(ms)
}

/// A controller in congestion avoidance at `cwnd` after a loss at `w_max`: enter recovery at
/// window `w_max` (flight = w_max), exit at `t0`.
fn after_loss(algorithm: Algorithm, w_max: u32, t0: Instant) -> Controller {
    let mut c = ctl(algorithm);
    grow_to(&mut c, w_max);
    c.enter_recovery(t0, w_max, w_max);
    c.exit_recovery(t0);
    c
}

/// Slow start (no loss yet) until cwnd ≥ `w`, then set cwnd exactly by a (test-only) path:
/// ACK 2·MSS at a time.
fn grow_to(c: &mut Controller, w: u32) {
    let mut guard = 0;
    while c.cwnd() < w && guard < 1_000_000 {
        let step = (w - c.cwnd()).min(2 * MSS);
        c.on_ack(Instant::ZERO, &ack(step));
        guard += 1;
    }
    assert_eq!(c.cwnd(), w);
}

#[test]
fn rfc6928_initial_window_ten_segments() {
    let c = Controller::try_new(CcConfig::rfc6928(Algorithm::Cubic, 1460)).unwrap();
    assert_eq!(c.cwnd(), 14600);
    assert_eq!(c.cwnd(), 10 * 1460);
    assert_eq!(c.ssthresh(), u32::MAX);
    // An explicit window is kept.
    let c = ctl(Algorithm::NewReno);
    assert_eq!(c.cwnd(), 10 * MSS);
}

#[test]
fn rfc6928_2_initial_window_formula() {
    // IW = min(10·MSS, max(2·MSS, 14600)).
    for mss in [1u32, 100, 536, 1220, 1460, 7300, 8960, 65495, u32::MAX / 4] {
        let want = (10u64 * mss as u64)
            .min((2u64 * mss as u64).max(14600))
            .min(MAX_CWND as u64) as u32;
        assert_eq!(rfc6928_initial_window(mss), want, "mss {mss}");
    }
    assert_eq!(rfc6928_initial_window(8960), 17920); // two jumbo segments
                                                     // Below one MSS is raised to one MSS.
    let c = Controller::try_new(CcConfig {
        algorithm: Algorithm::NewReno,
        mss: 1460,
        initial_window: 10,
    })
    .unwrap();
    assert_eq!(c.cwnd(), 1460);
}

#[test]
fn construction_rejects_zero_mss() {
    let cfg = CcConfig {
        algorithm: Algorithm::Cubic,
        mss: 0,
        initial_window: 0,
    };
    assert_eq!(Controller::try_new(cfg).err(), Some(CcError::ZeroMss));
    // `new` never panics: RFC 9293's default MSS instead.
    let c = Controller::new(cfg);
    assert_eq!(c.mss(), 536);
    assert_eq!(c.cwnd(), rfc6928_initial_window(536));
}

#[test]
fn rfc5681_3_1_slow_start_increase_by_acked_up_to_smss() {
    let mut c = ctl(Algorithm::NewReno);
    c.on_ack(at_ms(1), &ack(300));
    assert_eq!(c.cwnd(), 10 * MSS + 300);
    c.on_ack(at_ms(2), &ack(MSS));
    assert_eq!(c.cwnd(), 11 * MSS + 300);
    // An ACK of nothing new (a duplicate) does not grow the window.
    c.on_ack(at_ms(3), &ack(0));
    assert_eq!(c.cwnd(), 11 * MSS + 300);
}

#[test]
fn rfc3465_2_2_slow_start_limit_l_two_smss() {
    let mut c = ctl(Algorithm::Cubic);
    c.on_ack(at_ms(1), &ack(5 * MSS));
    assert_eq!(c.cwnd(), 12 * MSS);
    c.on_ack(at_ms(2), &ack(2 * MSS));
    assert_eq!(c.cwnd(), 14 * MSS);
}

#[test]
fn rfc5681_3_1_slow_start_stops_at_ssthresh() {
    let mut c = ctl(Algorithm::NewReno);
    c.on_rto(at_ms(0), 24 * MSS); // ssthresh = 12 MSS, cwnd = 1 MSS
    assert_eq!((c.cwnd(), c.ssthresh()), (MSS, 12 * MSS));
    grow_to(&mut c, 11 * MSS);
    assert!(c.in_slow_start());
    c.on_ack(at_ms(1), &ack(2 * MSS));
    // 1 MSS of slow start reaches ssthresh; the other MSS counts in congestion avoidance.
    assert_eq!(c.cwnd(), 12 * MSS);
    assert!(!c.in_slow_start());
}

#[test]
fn rfc3465_2_1_congestion_avoidance_one_smss_per_cwnd_acked() {
    let mut c = after_loss(Algorithm::NewReno, 20 * MSS, at_ms(0));
    assert_eq!(c.cwnd(), 10 * MSS);
    for i in 0..9 {
        c.on_ack(at_ms(i), &ack(MSS));
        assert_eq!(c.cwnd(), 10 * MSS, "after {} MSS acked", i + 1);
    }
    c.on_ack(at_ms(10), &ack(MSS));
    assert_eq!(c.cwnd(), 11 * MSS);
    // The next increase needs 11 MSS acknowledged.
    for i in 0..10 {
        c.on_ack(at_ms(20 + i), &ack(MSS));
    }
    assert_eq!(c.cwnd(), 11 * MSS);
    c.on_ack(at_ms(40), &ack(MSS));
    assert_eq!(c.cwnd(), 12 * MSS);
}

#[test]
fn rfc5681_3_2_enter_recovery_ssthresh_half_flight() {
    let mut c = ctl(Algorithm::NewReno);
    grow_to(&mut c, 30 * MSS);
    c.enter_recovery(at_ms(0), 20 * MSS, 21 * MSS);
    assert!(c.in_recovery());
    assert_eq!(c.ssthresh(), 21 * MSS / 2);
    c.exit_recovery(at_ms(10));
    assert_eq!(c.cwnd(), 21 * MSS / 2);
    // Never below 2·SMSS.
    c.enter_recovery(at_ms(20), MSS, MSS);
    assert_eq!(c.ssthresh(), 2 * MSS);
}

#[test]
fn rfc5681_3_1_rto_cwnd_one_smss_ssthresh_eq_4() {
    let mut c = ctl(Algorithm::NewReno);
    grow_to(&mut c, 40 * MSS);
    c.on_rto(at_ms(0), 30 * MSS);
    assert_eq!(c.cwnd(), MSS);
    assert_eq!(c.ssthresh(), (30 * MSS / 2).max(2 * MSS));
    let mut c = ctl(Algorithm::NewReno);
    c.on_rto(at_ms(0), 3 * MSS);
    assert_eq!(c.ssthresh(), 2 * MSS);
}

#[test]
fn rfc5681_3_1_ssthresh_held_on_repeated_timeout() {
    let mut c = ctl(Algorithm::NewReno);
    grow_to(&mut c, 40 * MSS);
    c.on_rto(at_ms(0), 40 * MSS);
    assert_eq!(c.ssthresh(), 20 * MSS);
    // The retransmission times out again: ssthresh stays.
    c.on_rto(at_ms(400), MSS);
    assert_eq!((c.cwnd(), c.ssthresh()), (MSS, 20 * MSS));
    // New data acknowledged: the next timeout halves again.
    c.on_ack(at_ms(500), &ack(MSS));
    c.on_rto(at_ms(900), 6 * MSS);
    assert_eq!(c.ssthresh(), 3 * MSS);
}

#[test]
fn rfc5681_3_1_timeout_in_recovery_never_raises_ssthresh() {
    let mut c = ctl(Algorithm::NewReno);
    grow_to(&mut c, 40 * MSS);
    c.enter_recovery(at_ms(0), 40 * MSS, 40 * MSS);
    assert_eq!(c.ssthresh(), 20 * MSS);
    // PRR sent new data, FlightSize grew to 60 segments, then the timer fired.
    c.on_rto(at_ms(500), 60 * MSS);
    assert_eq!((c.cwnd(), c.ssthresh()), (MSS, 20 * MSS));
    assert!(!c.in_recovery());
    // A smaller FlightSize still lowers it.
    let mut c = ctl(Algorithm::NewReno);
    grow_to(&mut c, 40 * MSS);
    c.enter_recovery(at_ms(0), 40 * MSS, 40 * MSS);
    c.on_rto(at_ms(500), 10 * MSS);
    assert_eq!(c.ssthresh(), 5 * MSS);
}

#[test]
fn rfc9438_4_8_timeout_uses_beta_and_restarts_with_w_max_at_epoch_start() {
    let mut c = ctl(Algorithm::Cubic);
    grow_to(&mut c, 100 * MSS);
    c.on_rto(at_ms(0), 100 * MSS);
    assert_eq!(c.cwnd(), MSS);
    assert_eq!(c.ssthresh(), (100.0 * MSS as f64 * BETA) as u32);
    grow_to(&mut c, 70 * MSS);
    // First congestion-avoidance ACK: the epoch starts with W_max = cwnd, K = 0.
    c.on_ack(at_ms(1000), &ack(MSS));
    let e = c.cubic.epoch().expect("epoch");
    assert_eq!(e.k, 0.0);
    assert_eq!(c.w_max(), 70 * MSS);
}

#[test]
fn rfc6937_no_cwnd_growth_during_recovery() {
    for alg in [Algorithm::NewReno, Algorithm::Cubic] {
        let mut c = ctl(alg);
        grow_to(&mut c, 20 * MSS);
        c.enter_recovery(at_ms(0), 20 * MSS, 20 * MSS);
        let ss = c.ssthresh();
        for i in 1..=30 {
            c.on_ack(
                at_ms(i),
                &AckEvent {
                    newly_acked: MSS,
                    pipe: 10 * MSS,
                    flight_size: 20 * MSS,
                    ..AckEvent::default()
                },
            );
            assert!(c.cwnd() <= ss, "{alg:?}: cwnd {} > ssthresh {ss}", c.cwnd());
        }
        // A second loss in the same recovery does not reduce again.
        c.enter_recovery(at_ms(31), 10 * MSS, 10 * MSS);
        assert_eq!(c.ssthresh(), ss);
        c.exit_recovery(at_ms(40));
        assert_eq!(c.cwnd(), ss);
        assert!(!c.in_recovery());
    }
}

/// Drive one recovery as RFC 6937's example does: RecoverFS = 20 segments, one segment
/// delivered per ACK, the sender sends whatever sndcnt allows; pipe as the sender computes it.
#[test]
fn rfc6937_prr_proportional_when_pipe_above_ssthresh() {
    let mut c = ctl(Algorithm::NewReno);
    grow_to(&mut c, 20 * MSS);
    let recover_fs = 20 * MSS;
    c.enter_recovery(at_ms(0), 19 * MSS, recover_fs);
    let ss = c.ssthresh();
    assert_eq!(ss, 10 * MSS);
    let mut pipe = 19 * MSS; // one segment lost
    let mut prr_out = 0u64;
    for i in 1..=19u64 {
        pipe -= MSS; // an ACK: one more segment delivered
        c.on_ack(
            at_ms(i as i64),
            &AckEvent {
                newly_sacked: MSS,
                pipe,
                flight_size: recover_fs,
                ..AckEvent::default()
            },
        );
        let delivered = i * MSS as u64;
        let want = if pipe > ss {
            (delivered * ss as u64).div_ceil(recover_fs as u64) as i64 - prr_out as i64
        } else {
            // SSRB
            let limit = (delivered as i64 - prr_out as i64).max(MSS as i64) + MSS as i64;
            (ss as i64 - pipe as i64).min(limit)
        }
        .max(0) as u32;
        let q = c.send_quota(pipe);
        assert_eq!(q, want, "ack {i} pipe {pipe}");
        // Send whole segments within the quota.
        let n = q / MSS;
        for _ in 0..n {
            c.on_sent(at_ms(i as i64), MSS);
            pipe += MSS;
            prr_out += MSS as u64;
        }
        assert_eq!(c.send_quota(pipe), q - n * MSS);
    }
    // The sending was spread over the recovery and pipe ended at ssthresh.
    assert_eq!(pipe, ss);
    assert!(prr_out >= (19 * MSS as u64 * ss as u64) / recover_fs as u64);
    c.exit_recovery(at_ms(30));
    assert_eq!(c.cwnd(), ss);
}

#[test]
fn rfc6937_prr_ssrb_slow_start_when_pipe_below_ssthresh() {
    let mut c = ctl(Algorithm::NewReno);
    grow_to(&mut c, 20 * MSS);
    c.enter_recovery(at_ms(0), 4 * MSS, 20 * MSS); // heavy loss: pipe far below ssthresh
    let ss = c.ssthresh();
    let mut pipe = 4 * MSS;
    let mut sent = 0u64;
    let mut delivered = 0u64;
    for i in 1..=5 {
        pipe -= MSS;
        delivered += MSS as u64;
        c.on_ack(
            at_ms(i),
            &AckEvent {
                newly_acked: MSS,
                pipe,
                flight_size: 20 * MSS,
                ..AckEvent::default()
            },
        );
        // limit = MAX(prr_delivered − prr_out, DeliveredData) + MSS
        let limit = (delivered as i64 - sent as i64).max(MSS as i64) + MSS as i64;
        let want = (ss as i64 - pipe as i64).min(limit).max(0) as u32;
        assert_eq!(c.send_quota(pipe), want, "ack {i}");
        c.on_sent(at_ms(i), want);
        sent += want as u64;
        pipe += want;
    }
    // Each ACK delivering one segment released two: slow-start-like regrowth.
    assert_eq!(pipe, 4 * MSS + 5 * MSS);
}

#[test]
fn rfc6937_prr_crb_conservative_when_pipe_below_ssthresh() {
    let mut c = ctl(Algorithm::NewReno);
    c.set_prr_mode(PrrMode::Crb);
    grow_to(&mut c, 20 * MSS);
    c.enter_recovery(at_ms(0), 4 * MSS, 20 * MSS);
    let mut pipe = 4 * MSS;
    for i in 1..=5 {
        pipe -= MSS;
        c.on_ack(
            at_ms(i),
            &AckEvent {
                newly_acked: MSS,
                pipe,
                flight_size: 20 * MSS,
                ..AckEvent::default()
            },
        );
        // limit = prr_delivered − prr_out: exactly what was delivered.
        assert_eq!(c.send_quota(pipe), MSS, "ack {i}");
        c.on_sent(at_ms(i), MSS);
        pipe += MSS;
        assert_eq!(c.send_quota(pipe), 0);
    }
    assert_eq!(pipe, 4 * MSS);
}

#[test]
fn rfc6937_prr_nothing_before_first_ack_of_recovery() {
    // prr_delivered = prr_out = 0 on entering recovery: sndcnt is 0 while pipe > ssthresh
    // (the fast retransmit is the caller's, RFC 6675 §5 step 4.3).
    let mut c = ctl(Algorithm::Cubic);
    grow_to(&mut c, 20 * MSS);
    c.enter_recovery(at_ms(0), 19 * MSS, 20 * MSS);
    assert_eq!(c.send_quota(19 * MSS), 0);
}

#[test]
fn rfc9438_4_2_cubic_window_at_k_equals_w_max() {
    let w_max = 100 * MSS;
    let c = after_loss(Algorithm::Cubic, w_max, at_ms(0));
    let e = c.cubic.epoch().expect("epoch at recovery exit");
    // cwnd_epoch = β·W_max, so K = cbrt(W_max·(1 − β)/C) in segments (RFC 9438 (2)).
    let k = (100.0 * (1.0 - 0.7) / 0.4f64).cbrt();
    assert!((e.k - k).abs() < 1e-9, "K {} want {k}", e.k);
    assert!((e.k - 4.2172).abs() < 1e-3);
    assert_eq!(e.cwnd_epoch, 70.0 * MSS as f64);
    assert!((c.cubic.w_cubic(k, e.k, MSS) - w_max as f64).abs() < 1e-6);
    // W_cubic(0) = cwnd_epoch.
    assert!((c.cubic.w_cubic(0.0, e.k, MSS) - e.cwnd_epoch).abs() < 1e-6);
    // Driving a window of ACKs every 100 ms RTT up to t = K lands at W_max.
    let mut c = c;
    let w = rounds(&mut c, 0, 100, (k * 10.0).round() as usize);
    let got = *w.last().unwrap() as f64 / MSS as f64;
    assert!((got - 100.0).abs() < 1.0, "cwnd {got} segments at t = K");
}

#[test]
fn rfc9438_4_2_target_clamped_between_cwnd_and_1_5_cwnd() {
    // Far into the convex region one ACK of a whole window may at most add 50%.
    let mut c = after_loss(Algorithm::Cubic, 100 * MSS, at_ms(0));
    let before = c.cwnd();
    c.on_ack(at_ms(60_000), &ack(before));
    assert_eq!(c.cwnd(), before + before / 2);
    // An ACK of one segment adds (target − cwnd)/cwnd segments: 0.5 MSS here.
    let w = c.cwnd();
    c.on_ack(at_ms(60_001), &ack(MSS));
    assert_eq!(c.cwnd(), w + MSS / 2);
}

/// One window of ACKs every `rtt_ms`; returns cwnd after each round.
fn rounds(c: &mut Controller, start_ms: i64, rtt_ms: i64, n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut t = start_ms;
    for _ in 0..n {
        t += rtt_ms;
        let w = c.cwnd();
        let mut left = w;
        while left > 0 {
            let a = left.min(MSS);
            c.on_ack(
                at_ms(t),
                &AckEvent {
                    newly_acked: a,
                    rtt: Some(Duration::from_millis(rtt_ms as u64)),
                    ..AckEvent::default()
                },
            );
            left -= a;
        }
        out.push(c.cwnd());
    }
    out
}

#[test]
fn rfc9438_4_4_concave_region_growth_slows_toward_w_max() {
    let w_max = 1000 * MSS;
    let mut c = after_loss(Algorithm::Cubic, w_max, at_ms(0));
    let k_ms = (1000.0 * 0.3 / 0.4f64).cbrt() * 1000.0; // 9.09 s
    let w = rounds(&mut c, 0, 100, (k_ms / 100.0) as usize - 2);
    let inc: Vec<i64> = w.windows(2).map(|p| p[1] as i64 - p[0] as i64).collect();
    assert!(w.iter().all(|&x| x < w_max), "stays below W_max before K");
    // Growth per round shrinks (allowing the integer carry a segment of slack).
    assert!(inc[0] > 4 * inc[inc.len() - 1], "{inc:?}");
    assert!(inc.windows(2).all(|p| p[1] <= p[0] + MSS as i64), "{inc:?}");
    // And it tracks W_cubic(t + RTT) (computed here) within a couple of segments.
    let t = (w.len() as f64) * 0.1;
    let want = C * (t + 0.1 - k_ms / 1000.0).powi(3) * MSS as f64 + w_max as f64;
    let got = *w.last().unwrap() as f64;
    assert!((got - want).abs() < 3.0 * MSS as f64, "{got} vs {want}");
}

#[test]
fn rfc9438_4_5_convex_region_growth_accelerates_beyond_w_max() {
    let w_max = 1000 * MSS;
    let mut c = after_loss(Algorithm::Cubic, w_max, at_ms(0));
    let k_ms = ((1000.0 * 0.3 / 0.4f64).cbrt() * 1000.0) as i64;
    // Skip to K: jump the clock (the window follows W_cubic, clamped at 1.5× per ACK round).
    rounds(&mut c, 0, 100, (k_ms / 100) as usize);
    let w = rounds(&mut c, k_ms, 100, 30);
    assert!(w[0] >= w_max - 2 * MSS);
    assert!(*w.last().unwrap() > w_max);
    let inc: Vec<i64> = w.windows(2).map(|p| p[1] as i64 - p[0] as i64).collect();
    assert!(inc[inc.len() - 1] > 4 * inc[1].max(1), "{inc:?}");
}

#[test]
fn rfc9438_4_3_reno_friendly_region_follows_w_est() {
    // A small window and a short RTT: Reno's per-RTT growth outruns the cubic curve.
    let w_max = 20 * MSS;
    let mut c = after_loss(Algorithm::Cubic, w_max, at_ms(0));
    let cwnd_epoch = 0.7 * w_max as f64;
    assert_eq!(c.cwnd() as f64, cwnd_epoch);
    let mut w_est = cwnd_epoch;
    let mut cwnd = c.cwnd() as f64;
    // One MSS per ACK, one ACK per 100 µs (1 ms RTT: ~10 ACKs... per round).
    for i in 1..=200i64 {
        let alpha = if w_est >= w_max as f64 { 1.0 } else { ALPHA };
        w_est += alpha * MSS as f64 * MSS as f64 / cwnd;
        c.on_ack(
            Instant::from_micros(i * 100),
            &AckEvent {
                newly_acked: MSS,
                rtt: Some(Duration::from_millis(1)),
                ..AckEvent::default()
            },
        );
        let e = c.cubic.epoch().unwrap();
        assert!(
            (e.w_est - w_est).abs() < 1e-6,
            "W_est {} want {w_est}",
            e.w_est
        );
        let t = i as f64 * 100e-6;
        let w_cubic = C * MSS as f64 * (t - e.k).powi(3) + w_max as f64;
        if w_cubic < w_est {
            assert_eq!(c.cwnd(), w_est as u32, "ack {i}: cwnd = W_est");
        }
        cwnd = c.cwnd() as f64;
    }
    // α_cubic = 3(1−β)/(1+β) ≈ 0.529: the first window of ACKs adds about half a segment...
    assert!((ALPHA - 0.5294).abs() < 1e-3);
    // ... and W_est passed W_max (cwnd_prior) after which α = 1.
    assert!(c.cwnd() > w_max, "cwnd {}", c.cwnd());
}

#[test]
fn rfc9438_4_6_multiplicative_decrease_beta_0_7() {
    let mut c = ctl(Algorithm::Cubic);
    grow_to(&mut c, 100 * MSS);
    c.enter_recovery(at_ms(0), 100 * MSS, 100 * MSS);
    assert_eq!(c.ssthresh(), (100.0 * MSS as f64 * 0.7) as u32);
    assert_eq!(c.w_max(), 100 * MSS);
    c.exit_recovery(at_ms(10));
    assert_eq!(c.cwnd(), 70 * MSS);
    // ssthresh uses FlightSize (RFC 9438 §4.6), and is at least 2 segments.
    let mut c = ctl(Algorithm::Cubic);
    grow_to(&mut c, 100 * MSS);
    c.enter_recovery(at_ms(0), 50 * MSS, 60 * MSS);
    assert_eq!(c.ssthresh(), 42 * MSS);
    let mut c = ctl(Algorithm::Cubic);
    c.enter_recovery(at_ms(0), MSS, 2 * MSS);
    assert_eq!(c.ssthresh(), 2 * MSS);
}

#[test]
fn rfc9438_4_7_fast_convergence() {
    let mut c = ctl(Algorithm::Cubic);
    grow_to(&mut c, 100 * MSS);
    c.enter_recovery(at_ms(0), 100 * MSS, 100 * MSS);
    c.exit_recovery(at_ms(10));
    assert_eq!(c.w_max(), 100 * MSS);
    // Second loss before regaining W_max: W_max = cwnd·(1 + β)/2.
    grow_to(&mut c, 80 * MSS);
    c.enter_recovery(at_ms(100), 80 * MSS, 80 * MSS);
    assert_eq!(c.w_max(), (80.0 * MSS as f64 * (1.0 + 0.7) / 2.0) as u32);
    assert_eq!(c.w_max(), 68 * MSS);
    c.exit_recovery(at_ms(110));
    // A loss above the old W_max sets W_max = cwnd.
    grow_to(&mut c, 90 * MSS);
    c.enter_recovery(at_ms(200), 90 * MSS, 90 * MSS);
    assert_eq!(c.w_max(), 90 * MSS);
}

#[test]
fn rfc9438_5_8_no_growth_while_app_limited() {
    let mut c = after_loss(Algorithm::Cubic, 100 * MSS, at_ms(0));
    let w = c.cwnd();
    let limited = AckEvent {
        newly_acked: MSS,
        app_limited: true,
        rtt: Some(Duration::from_millis(10)),
        ..AckEvent::default()
    };
    for i in 1..=500 {
        c.on_ack(at_ms(i * 10), &limited);
    }
    assert_eq!(c.cwnd(), w);
    // The 5 s app-limited do not count in t: the first cwnd-limited ACK after them grows as
    // one right after the epoch start would, not as one 5 s into it.
    let mut fresh = after_loss(Algorithm::Cubic, 100 * MSS, at_ms(0));
    let ev = AckEvent {
        newly_acked: MSS,
        rtt: Some(Duration::from_millis(10)),
        ..AckEvent::default()
    };
    fresh.on_ack(at_ms(10), &ev);
    c.on_ack(at_ms(5010), &ev);
    assert_eq!(c.cwnd(), fresh.cwnd());
    // NewReno and slow start hold too.
    let mut r = ctl(Algorithm::NewReno);
    r.on_ack(at_ms(1), &limited);
    assert_eq!(r.cwnd(), 10 * MSS);
}

#[test]
fn rfc5681_4_1_restart_window_after_idle() {
    let mut c = ctl(Algorithm::Cubic);
    grow_to(&mut c, 50 * MSS);
    let rto = Duration::from_millis(200);
    c.on_sent(at_ms(0), MSS);
    c.on_idle(at_ms(150), rto);
    assert_eq!(c.cwnd(), 50 * MSS, "idle shorter than the RTO");
    c.on_idle(at_ms(250), rto);
    assert_eq!(c.cwnd(), 10 * MSS, "RW = min(IW, cwnd)");
    let mut small = ctl(Algorithm::NewReno);
    small.on_rto(at_ms(0), 10 * MSS);
    small.on_idle(at_ms(10_000), rto);
    assert_eq!(small.cwnd(), MSS, "never raised");
}

#[test]
fn odd_inputs_saturate_without_panic() {
    for alg in [Algorithm::NewReno, Algorithm::Cubic] {
        let mut c = Controller::new(CcConfig {
            algorithm: alg,
            mss: u32::MAX,
            initial_window: u32::MAX,
        });
        assert!(c.cwnd() <= MAX_CWND);
        let big = AckEvent {
            newly_acked: u32::MAX,
            newly_sacked: u32::MAX,
            rtt: Some(Duration::from_secs(1 << 40)),
            min_rtt: Some(Duration::from_micros(0)),
            pipe: u32::MAX,
            flight_size: u32::MAX,
            app_limited: false,
        };
        c.on_ack(Instant::from_micros(i64::MAX), &big);
        c.on_ack(Instant::from_micros(i64::MIN), &big);
        c.enter_recovery(Instant::ZERO, u32::MAX, u32::MAX);
        c.on_ack(Instant::ZERO, &big);
        c.on_sent(Instant::ZERO, u32::MAX);
        let _ = c.send_quota(0);
        let _ = c.send_quota(u32::MAX);
        c.exit_recovery(Instant::from_micros(i64::MAX));
        c.on_ack(Instant::from_micros(i64::MAX), &big);
        c.on_rto(Instant::ZERO, u32::MAX);
        c.on_idle(
            Instant::from_micros(i64::MIN),
            Duration::from_micros(u64::MAX),
        );
        assert!(c.cwnd() <= MAX_CWND);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Ack(u32, u32, u32, bool, u16),
    Enter(u32, u32),
    Exit,
    Rto(u32),
    Sent(u32),
    Idle(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u32..200_000, 0u32..50_000, 0u32..2_000_000, any::<bool>(), 0u16..500)
            .prop_map(|(a, s, p, l, r)| Op::Ack(a, s, p, l, r)),
        1 => (0u32..2_000_000, 0u32..2_000_000).prop_map(|(p, f)| Op::Enter(p, f)),
        1 => Just(Op::Exit),
        1 => (0u32..2_000_000).prop_map(Op::Rto),
        3 => (0u32..100_000).prop_map(Op::Sent),
        1 => (0u16..2000).prop_map(Op::Idle),
    ]
}

proptest! {
    /// Whatever the connection reports, the window stays within [1 MSS … MAX_CWND] outside
    /// recovery, ssthresh never drops below 2·MSS, recovery with pipe at or below ssthresh
    /// never allows more than ssthresh − pipe, and outside recovery the quota is cwnd − pipe.
    #[test]
    fn controller_invariants(cubic in any::<bool>(), mss in 1u32..9000, ops in proptest::collection::vec(op(), 1..300)) {
        let alg = if cubic { Algorithm::Cubic } else { Algorithm::NewReno };
        let mut c = Controller::try_new(CcConfig { algorithm: alg, mss, initial_window: 0 }).unwrap();
        let mut now = 0i64;
        for o in ops {
            now += 1000;
            let t = Instant::from_micros(now);
            match o {
                Op::Ack(a, s, pipe, lim, rtt) => {
                    c.on_ack(t, &AckEvent { newly_acked: a, newly_sacked: s, rtt: Some(Duration::from_millis(rtt as u64)), min_rtt: None, pipe, flight_size: pipe, app_limited: lim });
                    if c.in_recovery() && pipe <= c.ssthresh() {
                        // RFC 6937: below ssthresh never more than ssthresh − pipe.
                        prop_assert!(c.send_quota(pipe) <= c.ssthresh() - pipe);
                    }
                }
                Op::Enter(p, f) => c.enter_recovery(t, p, f),
                Op::Exit => c.exit_recovery(t),
                Op::Rto(f) => c.on_rto(t, f),
                Op::Sent(b) => c.on_sent(t, b),
                Op::Idle(ms) => c.on_idle(t, Duration::from_millis(ms as u64)),
            }
            prop_assert!(c.cwnd() <= MAX_CWND);
            prop_assert!(c.ssthresh() >= 2 * mss.min(MAX_CWND));
            if !c.in_recovery() {
                prop_assert!(c.cwnd() >= mss);
                prop_assert_eq!(c.send_quota(0), c.cwnd());
                prop_assert_eq!(c.send_quota(c.cwnd() / 2), c.cwnd() - c.cwnd() / 2);
            }
        }
    }
}

/// One slow-start round of `n` ACKs of one MSS each with RTT `rtt_ms`, flight = cwnd.
fn hystart_round(c: &mut Controller, t: &mut i64, n: u32, rtt_ms: u64) {
    for _ in 0..n {
        *t += 1;
        let flight = c.cwnd();
        c.on_ack(
            at_ms(*t),
            &AckEvent {
                newly_acked: MSS,
                rtt: Some(Duration::from_millis(rtt_ms)),
                flight_size: flight,
                ..AckEvent::default()
            },
        );
    }
}

#[test]
fn rfc9406_4_2_delay_increase_enters_css() {
    let mut c = ctl(Algorithm::Cubic);
    let mut t = 0;
    // Rounds at 20 ms: RttThresh = max(4 ms, min(20/8 = 2.5 ms, 16 ms)) = 4 ms.
    hystart_round(&mut c, &mut t, 10, 20);
    hystart_round(&mut c, &mut t, 20, 20);
    assert!(!c.in_css());
    // 23 ms < 20 + 4: still slow start (growth 1 MSS per ACK).
    let w = c.cwnd();
    hystart_round(&mut c, &mut t, 8, 23);
    assert!(!c.in_css());
    assert_eq!(c.cwnd(), w + 8 * MSS);
    // The next round's minimum is 25 ms ≥ 23 + 4 after N_RTT_SAMPLE = 8 samples: CSS.
    let w = c.cwnd();
    let mut t2 = t;
    // Finish the round first (flight was large): ACK until a round boundary passes.
    hystart_round(&mut c, &mut t2, w / MSS, 30);
    assert!(c.in_css(), "cwnd {} ", c.cwnd() / MSS);
    assert_eq!(c.ssthresh(), u32::MAX);
}

#[test]
fn rfc9406_4_2_css_grows_a_quarter_and_ends_after_five_rounds() {
    let mut c = ctl(Algorithm::Cubic);
    let mut t = 0;
    hystart_round(&mut c, &mut t, 10, 10);
    hystart_round(&mut c, &mut t, 20, 10);
    hystart_round(&mut c, &mut t, 40, 20);
    assert!(c.in_css());
    // In CSS an ACK of one MSS adds MSS / CSS_GROWTH_DIVISOR.
    let w = c.cwnd();
    hystart_round(&mut c, &mut t, 1, 20);
    assert_eq!(c.cwnd(), w + MSS / 4);
    // CSS_ROUNDS rounds later: ssthresh = cwnd, congestion avoidance.
    for _ in 0..6 {
        if !c.in_css() {
            break;
        }
        let n = c.cwnd() / MSS + 1;
        hystart_round(&mut c, &mut t, n, 20);
    }
    assert!(!c.in_css());
    assert!(!c.in_slow_start());
    assert_ne!(c.ssthresh(), u32::MAX);
    // CUBIC's first epoch without a congestion event starts at W_max = cwnd_epoch (K = 0).
    c.on_ack(at_ms(t + 1), &ack(MSS));
    let e = c.cubic.epoch().expect("epoch");
    assert_eq!(e.k, 0.0);
    assert_eq!(c.w_max(), e.cwnd_epoch as u32);
}

#[test]
fn rfc9406_4_2_spurious_css_exit_returns_to_slow_start() {
    let mut c = ctl(Algorithm::NewReno);
    let mut t = 0;
    hystart_round(&mut c, &mut t, 10, 10);
    hystart_round(&mut c, &mut t, 20, 10);
    hystart_round(&mut c, &mut t, 40, 20);
    assert!(c.in_css());
    // The RTT drops below the CSS baseline (20 ms) within the next round: slow start again.
    hystart_round(&mut c, &mut t, 80, 12);
    assert!(!c.in_css());
    let w = c.cwnd();
    hystart_round(&mut c, &mut t, 1, 12);
    assert_eq!(c.cwnd(), w + MSS);
}

#[test]
fn rfc9406_4_3_only_the_initial_slow_start() {
    let mut c = ctl(Algorithm::Cubic);
    c.on_rto(at_ms(0), 20 * MSS);
    let mut t = 0;
    hystart_round(&mut c, &mut t, 3, 10);
    hystart_round(&mut c, &mut t, 5, 10);
    // A rising RTT after the timeout does not trigger CSS: standard slow start.
    hystart_round(&mut c, &mut t, 5, 50);
    assert!(!c.in_css());
    // And it can be turned off.
    let mut c = ctl(Algorithm::Cubic);
    c.set_hystart(false);
    let mut t = 0;
    hystart_round(&mut c, &mut t, 10, 10);
    hystart_round(&mut c, &mut t, 20, 10);
    hystart_round(&mut c, &mut t, 40, 40);
    assert!(!c.in_css());
    assert!(c.in_slow_start());
}

#[test]
fn rfc6937_delivered_data_counts_each_octet_once() {
    // 3 segments SACKed earlier; a cumulative ACK covers them plus 1 new segment and SACKs
    // 1 more: DeliveredData = Δ SND.UNA + Δ SACKed = 4 + (1 − 3) = 2 segments.
    let acked = 4 * MSS;
    let newly_acked = newly_acked_not_sacked(acked, MSS, 3 * MSS, MSS);
    assert_eq!(newly_acked + MSS, 2 * MSS);
    assert_eq!(newly_acked, MSS);
    // No SACK at all: the SND.UNA advance.
    assert_eq!(newly_acked_not_sacked(acked, 0, 0, 0), acked);
    // Inconsistent numbers saturate.
    assert_eq!(newly_acked_not_sacked(0, MSS, 5 * MSS, 0), 0);
    assert_eq!(newly_acked_not_sacked(u32::MAX, 0, 0, u32::MAX), u32::MAX);
    // PRR counts newly_acked + newly_sacked; growth outside recovery only newly_acked.
    let mut c = ctl(Algorithm::NewReno);
    c.on_ack(
        at_ms(1),
        &AckEvent {
            newly_sacked: 5 * MSS,
            ..AckEvent::default()
        },
    );
    assert_eq!(c.cwnd(), 10 * MSS);
    grow_to(&mut c, 20 * MSS);
    c.enter_recovery(at_ms(2), 20 * MSS, 20 * MSS);
    c.on_ack(
        at_ms(3),
        &AckEvent {
            newly_acked: MSS,
            newly_sacked: MSS,
            pipe: 19 * MSS,
            flight_size: 20 * MSS,
            ..AckEvent::default()
        },
    );
    // ⌈2·MSS · 10·MSS / 20·MSS⌉ − 0 = 1 MSS.
    assert_eq!(c.send_quota(19 * MSS), MSS);
}

#[test]
fn rfc9438_4_9_spurious_fast_retransmit_restores_state() {
    let mut c = after_loss(Algorithm::Cubic, 100 * MSS, at_ms(0));
    rounds(&mut c, 0, 100, 10);
    let (cwnd, ss, w_max) = (c.cwnd(), c.ssthresh(), c.w_max());
    let epoch = c.cubic.epoch().expect("epoch");
    c.enter_recovery(at_ms(1100), cwnd, cwnd);
    assert!(c.ssthresh() < ss);
    assert!(c.undo_reduction(at_ms(1150)));
    assert!(!c.in_recovery());
    assert_eq!((c.cwnd(), c.ssthresh(), c.w_max()), (cwnd, ss, w_max));
    let e = c.cubic.epoch().expect("epoch restored");
    assert_eq!(
        (e.start, e.k, e.cwnd_epoch, e.w_est),
        (epoch.start, epoch.k, epoch.cwnd_epoch, epoch.w_est)
    );
    // Once only.
    assert!(!c.undo_reduction(at_ms(1200)));
    assert_eq!(c.cwnd(), cwnd);
}

#[test]
fn rfc9438_4_9_spurious_timeout_restores_state() {
    for alg in [Algorithm::NewReno, Algorithm::Cubic] {
        let mut c = ctl(alg);
        grow_to(&mut c, 40 * MSS);
        c.on_rto(at_ms(0), 40 * MSS);
        c.on_rto(at_ms(400), 40 * MSS); // backed-off repeat: nothing new saved
        assert_eq!(c.cwnd(), MSS);
        c.on_ack(at_ms(500), &ack(MSS));
        assert!(c.undo_reduction(at_ms(500)));
        assert_eq!((c.cwnd(), c.ssthresh()), (40 * MSS, u32::MAX), "{alg:?}");
        // Undo restores the episode just before: the recovery's, not the timeout's.
        let mut c = ctl(alg);
        grow_to(&mut c, 12 * MSS);
        c.on_rto(at_ms(0), 12 * MSS);
        grow_to(&mut c, 6 * MSS);
        c.enter_recovery(at_ms(10), 6 * MSS, 6 * MSS); // a later episode: undo restores it
        assert!(c.undo_reduction(at_ms(20)));
        assert_eq!(c.cwnd(), 6 * MSS);
        // ssthresh as the timeout set it: 12·MSS·β (CUBIC) or 12·MSS / 2.
        let want = match alg {
            Algorithm::Cubic => (12.0 * MSS as f64 * BETA) as u32,
            Algorithm::NewReno => 6 * MSS,
        };
        assert_eq!(c.ssthresh(), want);
    }
    // A window grown past the prior one is kept: cwnd = max(cwnd, cwnd_prior).
    let mut c = ctl(Algorithm::NewReno);
    c.on_rto(at_ms(0), 10 * MSS);
    grow_to(&mut c, 12 * MSS);
    assert!(c.undo_reduction(at_ms(100)));
    assert_eq!((c.cwnd(), c.ssthresh()), (12 * MSS, u32::MAX));
    // Nothing to undo on a fresh controller.
    assert!(!ctl(Algorithm::Cubic).undo_reduction(at_ms(0)));
}
