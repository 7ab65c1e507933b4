//! Virtual wire: intact in-order delivery, each fault type with fixed seeds, determinism,
//! rate limiting and the eventfd wakeup protocol.

mod common;

use common::*;
use std::time::{Duration, Instant};
use xwarp_poll_driver::backend::Backend;
use xwarp_poll_driver::sys::wait_readable;
use xwarp_poll_driver::vwire::{FaultCounters, LinkConfig, VirtualNic, VirtualWire, WireConfig};

fn wire(link: LinkConfig) -> (VirtualNic, VirtualNic) {
    VirtualWire::pair(WireConfig {
        mtu: 1500,
        queue_depth: 4096,
        a_to_b: link,
        b_to_a: LinkConfig::seeded(99),
        ..WireConfig::default()
    })
    .expect("valid config")
}

/// Send `n` numbered frames a -> b (in bursts that fit the queue), receiving as it goes;
/// returns everything b received, in order.
fn exchange(a: &mut VirtualNic, b: &mut VirtualNic, n: u64, len: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    for seq in 0..n {
        dev_send(a, &numbered_frame(seq, len));
        if seq % 512 == 511 {
            a.flush().unwrap();
            got.extend(drain(b));
        }
    }
    a.flush().unwrap();
    got.extend(drain(b));
    got
}

#[test]
fn delivers_frames_intact_and_in_order_without_faults() {
    let (mut a, mut b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let mut sent = Vec::new();
    for seq in 0..2000u64 {
        let len = 60 + (seq as usize * 37) % (1514 - 60 + 1);
        let f = numbered_frame(seq, len);
        dev_send(&mut a, &f);
        sent.push(f);
        if seq % 100 == 99 {
            a.flush().unwrap();
            let got = drain(&mut b);
            let start = sent.len() - got.len();
            assert_eq!(got, sent[start..].to_vec());
            assert_eq!(start as u64, seq + 1 - 100);
        }
    }
    // And the other direction uses its own queue.
    dev_send(&mut b, &numbered_frame(7, 100));
    assert_eq!(drain(&mut a), vec![numbered_frame(7, 100)]);
    let sa = a.stats();
    let sb = b.stats();
    assert_eq!(sa.tx_frames, 2000);
    assert_eq!(sb.rx_frames, 2000);
    assert_eq!(sa.tx_bytes, sb.rx_bytes);
    assert_eq!(sa.dropped, 0);
    assert_eq!(a.tx_faults(), FaultCounters::default());
}

#[test]
fn mtu_is_configurable_and_oversize_frames_are_dropped() {
    let (mut a, mut b) = VirtualWire::pair(WireConfig::jumbo()).unwrap();
    use smoltcp::phy::Device;
    assert_eq!(a.capabilities().max_transmission_unit, 9014);
    assert_eq!(a.capabilities().medium, smoltcp::phy::Medium::Ethernet);
    let big = numbered_frame(1, 9014);
    dev_send(&mut a, &big);
    dev_send(&mut a, &numbered_frame(2, 9015));
    assert_eq!(drain(&mut b), vec![big]);
    assert_eq!(a.tx_faults().oversize, 1);
    let (std_a, _) = VirtualWire::pair(WireConfig::default()).unwrap();
    assert_eq!(std_a.capabilities().max_transmission_unit, 1514);
}

#[test]
fn invalid_configs_are_errors_not_panics() {
    let bad = |f: &dyn Fn(&mut WireConfig)| {
        let mut c = WireConfig::default();
        f(&mut c);
        VirtualWire::pair(c).is_err()
    };
    assert!(bad(&|c| c.a_to_b.drop = 1.5));
    assert!(bad(&|c| c.b_to_a.corrupt = -0.1));
    assert!(bad(&|c| c.a_to_b.duplicate = f64::NAN));
    assert!(bad(&|c| c.mtu = 10));
    assert!(bad(&|c| c.queue_depth = 0));
    assert!(bad(&|c| {
        c.a_to_b.reorder = 0.5;
        c.a_to_b.reorder_delay = Duration::ZERO;
    }));
    assert!(bad(&|c| c.a_to_b.jitter = Duration::MAX));
    assert!(bad(&|c| c.b_to_a.delay = Duration::from_secs(7200)));
    assert!(bad(&|c| {
        c.checksum_offload = true;
        c.a_to_b.corrupt = 0.01;
    }));
    assert!(!bad(&|c| c.checksum_offload = true));
    assert!(!bad(&|_| {}));
}

fn seqs(frames: &[Vec<u8>]) -> Vec<u64> {
    frames.iter().map(|f| frame_seq(f)).collect()
}

#[test]
fn drop_fault_loses_about_p_and_is_deterministic() {
    let run = |seed: u64| {
        let (mut a, mut b) = wire(LinkConfig {
            drop: 0.1,
            ..LinkConfig::seeded(seed)
        });
        let got = exchange(&mut a, &mut b, 10_000, 100);
        (seqs(&got), a.tx_faults(), a.stats())
    };
    let (s1, f1, st) = run(42);
    let (s2, f2, _) = run(42);
    let (s3, _, _) = run(43);
    assert_eq!(s1, s2, "same seed, same losses");
    assert_eq!(f1, f2);
    assert_ne!(s1, s3, "another seed, other losses");
    assert!((800..=1200).contains(&f1.dropped), "dropped {}", f1.dropped);
    assert_eq!(s1.len() as u64 + f1.dropped, 10_000);
    assert_eq!(st.dropped, f1.dropped);
    assert!(
        s1.windows(2).all(|w| w[0] < w[1]),
        "survivors stay in order"
    );
}

#[test]
fn duplicate_fault_delivers_copies_next_to_the_original() {
    let (mut a, mut b) = wire(LinkConfig {
        duplicate: 0.05,
        ..LinkConfig::seeded(5)
    });
    let got = exchange(&mut a, &mut b, 4000, 200);
    let f = a.tx_faults();
    assert!(
        (120..=280).contains(&f.duplicated),
        "duplicated {}",
        f.duplicated
    );
    assert_eq!(got.len() as u64, 4000 + f.duplicated);
    let mut dups = 0;
    for w in got.windows(2) {
        if w[0] == w[1] {
            dups += 1;
        } else {
            assert_eq!(frame_seq(&w[1]), frame_seq(&w[0]) + 1);
        }
    }
    assert_eq!(dups, f.duplicated);
    for g in &got {
        assert_eq!(g, &numbered_frame(frame_seq(g), 200), "copies are intact");
    }
}

#[test]
fn corrupt_fault_flips_the_configured_number_of_bits() {
    for bits in [1u32, 3] {
        let (mut a, mut b) = wire(LinkConfig {
            corrupt: 0.1,
            corrupt_bits: bits,
            ..LinkConfig::seeded(11)
        });
        let got = exchange(&mut a, &mut b, 3000, 300);
        assert_eq!(got.len(), 3000);
        let mut corrupted = 0u64;
        for (i, g) in got.iter().enumerate() {
            let want = numbered_frame(i as u64, 300);
            let flipped: u32 = g.iter().zip(&want).map(|(x, y)| (x ^ y).count_ones()).sum();
            if flipped > 0 {
                corrupted += 1;
                // Flips of the same bit twice cancel out; the count is odd/even like `bits`.
                assert!(
                    flipped <= bits && flipped % 2 == bits % 2,
                    "flipped {flipped}"
                );
            }
        }
        let f = a.tx_faults();
        assert!(
            (200..=400).contains(&f.corrupted),
            "corrupted {}",
            f.corrupted
        );
        if bits == 1 {
            assert_eq!(corrupted, f.corrupted);
        } else {
            assert!(corrupted <= f.corrupted && corrupted + 5 >= f.corrupted);
        }
    }
}

#[test]
fn reorder_fault_lets_later_frames_overtake() {
    let hold = Duration::from_millis(150);
    let run = || {
        let (mut a, mut b) = wire(LinkConfig {
            reorder: 0.1,
            reorder_delay: hold,
            ..LinkConfig::seeded(3)
        });
        let start = Instant::now();
        for seq in 0..1000 {
            dev_send(&mut a, &numbered_frame(seq, 80));
        }
        a.flush().unwrap();
        let first = seqs(&drain(&mut b));
        let burst = start.elapsed();
        let deadline = b.next_deadline().expect("held frames have a deadline");
        assert!(deadline > Instant::now());
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        let mut late = Vec::new();
        while late.len() + first.len() < 1000 && start.elapsed() < Duration::from_secs(5) {
            late.extend(seqs(&drain(&mut b)));
            std::thread::sleep(Duration::from_millis(2));
        }
        (first, late, a.tx_faults(), burst)
    };
    let (first, late, f, burst) = run();
    assert!(burst < hold, "test machine too slow: burst took {burst:?}");
    assert!(
        (60..=140).contains(&f.reordered),
        "reordered {}",
        f.reordered
    );
    assert_eq!(late.len() as u64, f.reordered);
    assert_eq!(first.len() + late.len(), 1000);
    assert!(first.windows(2).all(|w| w[0] < w[1]));
    assert!(late.windows(2).all(|w| w[0] < w[1]));
    // The late ones really were overtaken.
    assert!(late.iter().any(|s| s < first.last().unwrap()));
    let (first2, late2, f2, _) = run();
    assert_eq!((first, late, f), (first2, late2, f2), "deterministic");
}

#[test]
fn delay_and_jitter_hold_frames_until_due() {
    let (mut a, mut b) = wire(LinkConfig {
        delay: Duration::from_millis(30),
        jitter: Duration::from_millis(10),
        ..LinkConfig::seeded(8)
    });
    let sent_at = Instant::now();
    for seq in 0..50 {
        dev_send(&mut a, &numbered_frame(seq, 64));
    }
    a.flush().unwrap();
    assert!(!b.poll_rx().unwrap(), "nothing is due yet");
    assert!(drain(&mut b).is_empty());
    let d = b.next_deadline().unwrap();
    assert!(d >= sent_at + Duration::from_millis(30));
    assert!(d <= sent_at + Duration::from_millis(45));
    let mut got = Vec::new();
    while got.len() < 50 && sent_at.elapsed() < Duration::from_secs(5) {
        for f in drain(&mut b) {
            assert!(sent_at.elapsed() >= Duration::from_millis(30));
            got.push(frame_seq(&f));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    got.sort_unstable();
    assert_eq!(got, (0..50).collect::<Vec<_>>());
    assert_eq!(a.tx_faults().delayed, 50);
}

#[test]
fn jitter_keeps_order_unless_allowed_to_reorder() {
    for may_reorder in [false, true] {
        let (mut a, mut b) = wire(LinkConfig {
            jitter: Duration::from_millis(5),
            jitter_may_reorder: may_reorder,
            ..LinkConfig::seeded(21)
        });
        let start = Instant::now();
        for seq in 0..500 {
            dev_send(&mut a, &numbered_frame(seq, 64));
        }
        a.flush().unwrap();
        let mut got = Vec::new();
        while got.len() < 500 && start.elapsed() < Duration::from_secs(5) {
            got.extend(seqs(&drain(&mut b)));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got.len(), 500);
        let in_order = got.windows(2).all(|w| w[0] < w[1]);
        assert_eq!(in_order, !may_reorder, "may_reorder={may_reorder}");
        got.sort_unstable();
        assert_eq!(got, (0..500).collect::<Vec<_>>());
    }
}

#[test]
fn rate_limit_paces_frames_at_the_configured_bit_rate() {
    // 1000-byte frames at 8 Mbit/s: 1 ms each, 100 frames ~ 100 ms.
    let (mut a, mut b) = wire(LinkConfig {
        rate_bps: 8_000_000,
        rate_queue: Duration::from_secs(1),
        ..LinkConfig::seeded(1)
    });
    let start = Instant::now();
    for seq in 0..100 {
        dev_send(&mut a, &numbered_frame(seq, 1000));
    }
    a.flush().unwrap();
    let mut got = Vec::new();
    let mut half_at = None;
    while got.len() < 100 && start.elapsed() < Duration::from_secs(5) {
        got.extend(seqs(&drain(&mut b)));
        if got.len() >= 50 && half_at.is_none() {
            half_at = Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let total = start.elapsed();
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    let half = half_at.unwrap();
    assert!(half >= Duration::from_millis(48), "half after {half:?}");
    assert!(total >= Duration::from_millis(99), "all after {total:?}");
    assert!(total < Duration::from_secs(1), "all after {total:?}");
    assert_eq!(a.tx_faults().rate_limited, 99);

    // A short queue tail-drops what cannot be sent within `rate_queue`.
    let (mut a, mut b) = wire(LinkConfig {
        rate_bps: 8_000_000,
        rate_queue: Duration::from_millis(10),
        ..LinkConfig::seeded(1)
    });
    for seq in 0..100 {
        dev_send(&mut a, &numbered_frame(seq, 1000));
    }
    a.flush().unwrap();
    let f = a.tx_faults();
    assert!(
        (10..=20).contains(&(100 - f.rate_dropped)),
        "accepted {}",
        100 - f.rate_dropped
    );
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(drain(&mut b).len() as u64, 100 - f.rate_dropped);
}

#[test]
fn all_faults_together_are_deterministic_per_seed() {
    let link = LinkConfig {
        drop: 0.05,
        duplicate: 0.05,
        corrupt: 0.05,
        ..LinkConfig::seeded(1234)
    };
    let run = |link: LinkConfig| {
        let (mut a, mut b) = wire(link);
        (exchange(&mut a, &mut b, 3000, 128), a.tx_faults())
    };
    let (g1, f1) = run(link.clone());
    let (g2, f2) = run(link.clone());
    assert_eq!(g1, g2);
    assert_eq!(f1, f2);
    assert!(f1.dropped > 0 && f1.duplicated > 0 && f1.corrupted > 0);
    let (g3, _) = run(LinkConfig { seed: 4321, ..link });
    assert_ne!(g1, g3);
}

#[test]
fn full_queue_drops_and_counts() {
    let (mut a, mut b) = VirtualWire::pair(WireConfig {
        queue_depth: 8,
        ..WireConfig::default()
    })
    .unwrap();
    for seq in 0..20 {
        dev_send(&mut a, &numbered_frame(seq, 64));
    }
    assert_eq!(seqs(&drain(&mut b)), (0..8).collect::<Vec<_>>());
    assert_eq!(a.tx_faults().queue_full, 12);
    assert_eq!(a.stats().dropped, 12);
}

#[test]
fn wait_fd_fires_only_when_the_receiver_armed_it() {
    let (mut a, mut b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let fd = b.wait_fd().unwrap();
    let mut r = [false];
    // Not armed: a send + flush makes no syscall and the fd stays quiet.
    dev_send(&mut a, &numbered_frame(0, 64));
    a.flush().unwrap();
    wait_readable(&[fd], &mut r, Some(Duration::ZERO)).unwrap();
    assert!(!r[0]);
    // Armed with a frame pending: prepare_sleep refuses to sleep.
    assert!(!b.prepare_sleep().unwrap());
    assert_eq!(drain(&mut b).len(), 1);
    // Armed and empty: sleeping is allowed, and the next flush wakes the fd.
    assert!(b.prepare_sleep().unwrap());
    wait_readable(&[fd], &mut r, Some(Duration::ZERO)).unwrap();
    assert!(!r[0]);
    dev_send(&mut a, &numbered_frame(1, 64));
    wait_readable(&[fd], &mut r, Some(Duration::ZERO)).unwrap();
    assert!(!r[0], "no wakeup before flush");
    a.flush().unwrap();
    wait_readable(&[fd], &mut r, Some(Duration::from_secs(1))).unwrap();
    assert!(r[0]);
    assert_eq!(seqs(&drain(&mut b)), vec![1]);
}

#[test]
fn ends_work_from_different_threads() {
    let (mut a, mut b) = VirtualWire::pair(WireConfig::default()).unwrap();
    let n = 20_000u64;
    let t = std::thread::spawn(move || {
        let mut seq = 0;
        while seq < n {
            // Keep at most 512 frames in flight so the 1024-deep queue never overflows.
            if seq - RECEIVED.load(std::sync::atomic::Ordering::Acquire) < 512 {
                dev_send(&mut a, &numbered_frame(seq, 256));
                seq += 1;
            }
            a.flush().unwrap();
        }
        a
    });
    let mut got = 0u64;
    let start = Instant::now();
    while got < n && start.elapsed() < Duration::from_secs(20) {
        while let Some(f) = dev_recv(&mut b) {
            assert_eq!(f, numbered_frame(got, 256));
            got += 1;
            RECEIVED.store(got, std::sync::atomic::Ordering::Release);
        }
        std::hint::spin_loop();
    }
    let a = t.join().unwrap();
    assert_eq!(got, n);
    assert_eq!(a.stats().tx_frames, n);
    assert_eq!(a.tx_faults().queue_full, 0);
}

static RECEIVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
