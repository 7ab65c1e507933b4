//! A model sender using [`Controller`] over `tcp::wire_sim`: one-way bulk data, SACK loss
//! recovery by the RFC 6675 scoreboard (`tcp::sack`), RFC 6298 RTO (`tcp::rtt`), and a
//! receiver that acknowledges every segment with SACK blocks. Not the connection state
//! machine (no handshake, no receive window, no delayed ACK): it shows the window's
//! behaviour on a lossy, rate-limited wire — slow start, a halving per loss episode, PRR
//! spreading the recovery, CUBIC regrowth — and that every byte arrives.

use super::{newly_acked_not_sacked, AckEvent, Algorithm, CcConfig, Controller};
use crate::tcp::rtt::{RttConfig, RttEstimator};
use crate::tcp::sack::{
    NextSeg, Reassembly, ReassemblyConfig, Received, SackBlock, SackList, Scoreboard,
    ScoreboardConfig,
};
use crate::tcp::seq::Seq;
use crate::tcp::wire_sim::{
    pattern_byte, run, EndpointReport, Limit, SimEndpoint, Stop, Wire, WireConfig,
};
use smoltcp::time::{Duration, Instant};

const MSS: u32 = 1000;
/// The receive window (the engine's 1 MiB buffer).
const RWND: u32 = 1 << 20;
const STREAM: u8 = 9;
/// IPv4 header + model header: kind, seq, ack, SACK count, 3 blocks, ts_val, ts_ecr.
const HDR: usize = 20 + 1 + 4 + 4 + 1 + 24 + 8 + 8;

#[derive(Debug)]
struct Pkt {
    seq: Seq,
    ack: Seq,
    sack: SackList,
    ts_val: i64,
    ts_ecr: i64,
    payload: Vec<u8>,
}

fn encode(p: &Pkt) -> Vec<u8> {
    let mut b = vec![0u8; HDR + p.payload.len()];
    b[0] = 0x45;
    let total = b.len().min(u16::MAX as usize) as u16;
    b[2..4].copy_from_slice(&total.to_be_bytes());
    b[21..25].copy_from_slice(&p.seq.0.to_be_bytes());
    b[25..29].copy_from_slice(&p.ack.0.to_be_bytes());
    b[29] = p.sack.len() as u8;
    for (i, blk) in p.sack.iter().take(3).enumerate() {
        let (l, r) = blk.to_wire();
        b[30 + 8 * i..34 + 8 * i].copy_from_slice(&l.to_be_bytes());
        b[34 + 8 * i..38 + 8 * i].copy_from_slice(&r.to_be_bytes());
    }
    b[54..62].copy_from_slice(&p.ts_val.to_be_bytes());
    b[62..70].copy_from_slice(&p.ts_ecr.to_be_bytes());
    b[HDR..].copy_from_slice(&p.payload);
    b
}

fn decode(b: &[u8]) -> Option<Pkt> {
    if b.len() < HDR {
        return None;
    }
    let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
    let i64_at = |i: usize| i64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let mut sack = SackList::new();
    for i in 0..usize::from(b[29]).min(3) {
        sack.push(SackBlock::from_wire((
            u32_at(30 + 8 * i),
            u32_at(34 + 8 * i),
        )));
    }
    Some(Pkt {
        seq: Seq(u32_at(21)),
        ack: Seq(u32_at(25)),
        sack,
        ts_val: i64_at(54),
        ts_ecr: i64_at(62),
        payload: b[HDR..].to_vec(),
    })
}

/// What the sender saw of its window.
#[derive(Debug, Default, Clone)]
struct CwndLog {
    recoveries: u32,
    rtos: u32,
    /// Largest cwnd seen, in MSS.
    max_cwnd: u32,
    /// Smallest cwnd right after a recovery ended (= ssthresh), in MSS.
    min_after_recovery: Option<u32>,
    /// Times PRR's quota exceeded ssthresh − pipe while pipe was at or below ssthresh.
    prr_violations: u32,
    /// (time µs, cwnd, ssthresh, in recovery) samples, one per ACK.
    samples: Vec<(i64, u32, u32, bool)>,
}

struct Sender {
    total: u32,
    iss: Seq,
    snd_una: Seq,
    snd_nxt: Seq,
    board: Scoreboard,
    rtt: RttEstimator,
    cc: Controller,
    rto_at: Option<Instant>,
    retransmits: u64,
    done_at: Option<Instant>,
    log: CwndLog,
    pending: Vec<Vec<u8>>,
}

impl Sender {
    fn new(algorithm: Algorithm, total: u32) -> Sender {
        let iss = Seq(u32::MAX - 50_000);
        Sender {
            total,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            board: Scoreboard::new(
                iss,
                ScoreboardConfig {
                    smss: MSS,
                    ..Default::default()
                },
            ),
            rtt: RttEstimator::new(RttConfig::default()).expect("default RTT config"),
            cc: Controller::try_new(CcConfig::rfc6928(algorithm, MSS)).expect("valid MSS"),
            rto_at: None,
            retransmits: 0,
            done_at: None,
            log: CwndLog::default(),
            pending: Vec::new(),
        }
    }

    fn segment(&self, seq: Seq, len: u32, now: Instant) -> Vec<u8> {
        let off = seq.since(self.iss) as u64;
        encode(&Pkt {
            seq,
            ack: Seq(0),
            sack: SackList::new(),
            ts_val: now.total_micros(),
            ts_ecr: -1,
            payload: (0..u64::from(len))
                .map(|i| pattern_byte(STREAM, off + i))
                .collect(),
        })
    }

    fn send_new(&mut self, now: Instant) -> bool {
        let sent = self.snd_nxt.since(self.iss);
        let len = (self.total - sent).min(MSS);
        if len == 0 || self.snd_nxt.since(self.snd_una) + len > RWND {
            return false;
        }
        let seq = self.snd_nxt;
        self.snd_nxt = seq.wrapping_add(len);
        self.board.on_send_new(self.snd_nxt);
        let p = self.segment(seq, len, now);
        self.pending.push(p);
        self.cc.on_sent(now, len);
        if self.rto_at.is_none() {
            self.rto_at = Some(now + self.rtt.rto());
        }
        true
    }

    fn retransmit(&mut self, b: SackBlock, now: Instant) {
        let p = self.segment(b.start, b.len(), now);
        self.pending.push(p);
        self.cc.on_sent(now, b.len());
        self.retransmits += 1;
    }

    fn send(&mut self, now: Instant) {
        for _ in 0..10_000 {
            let pipe = self.board.pipe();
            if self.cc.send_quota(pipe) < MSS {
                break;
            }
            if self.board.in_recovery() {
                let unsent = self.total - self.snd_nxt.since(self.iss);
                let avail = unsent.min(RWND.saturating_sub(self.snd_nxt.since(self.snd_una)));
                match self.board.next_seg(avail) {
                    NextSeg::Retransmit(b) | NextSeg::Rescue(b) => self.retransmit(b, now),
                    NextSeg::NewData(_) => {
                        if !self.send_new(now) {
                            break;
                        }
                    }
                    NextSeg::Nothing => break,
                }
            } else if !self.send_new(now) {
                break;
            }
        }
    }

    fn on_ack(&mut self, now: Instant, p: &Pkt) {
        let sacked_before = self.board.sacked_bytes();
        let info = self.board.on_ack(p.ack, &p.sack);
        if info.ignored {
            return;
        }
        let mut sample = None;
        if info.acked > 0 {
            self.snd_una = p.ack;
            if p.ts_ecr >= 0 {
                let s = Duration::from_micros((now.total_micros() - p.ts_ecr).max(0) as u64);
                self.rtt.on_sample(s, now);
                sample = Some(s);
            }
            self.rto_at = (self.snd_una != self.snd_nxt).then(|| now + self.rtt.rto());
        }
        let newly_acked = newly_acked_not_sacked(
            info.acked,
            info.newly_sacked,
            sacked_before,
            self.board.sacked_bytes(),
        );
        let pipe = self.board.pipe();
        self.cc.on_ack(
            now,
            &AckEvent {
                newly_acked,
                newly_sacked: info.newly_sacked,
                rtt: sample,
                min_rtt: self.rtt.min_rtt(),
                pipe,
                flight_size: self.board.outstanding(),
                app_limited: false,
            },
        );
        if self.cc.in_recovery()
            && pipe <= self.cc.ssthresh()
            && self.cc.send_quota(pipe) > self.cc.ssthresh() - pipe
        {
            self.log.prr_violations += 1;
        }
        if info.recovery_ended && self.cc.in_recovery() {
            self.cc.exit_recovery(now);
            let w = self.cc.cwnd() / MSS;
            self.log.min_after_recovery = Some(self.log.min_after_recovery.map_or(w, |m| m.min(w)));
        }
        if info.enter_recovery {
            let flight = self.board.outstanding();
            if let Some(b) = self.board.enter_recovery() {
                self.log.recoveries += 1;
                self.cc.enter_recovery(now, self.board.pipe(), flight);
                // RFC 6675 §5 step 4.3: the first retransmission goes regardless of cwnd.
                self.retransmit(b, now);
            }
        }
        self.log.max_cwnd = self.log.max_cwnd.max(self.cc.cwnd() / MSS);
        self.log.samples.push((
            now.total_micros(),
            self.cc.cwnd(),
            self.cc.ssthresh(),
            self.cc.in_recovery(),
        ));
        if self.snd_una.since(self.iss) == self.total && self.done_at.is_none() {
            self.done_at = Some(now);
        }
    }
}

impl SimEndpoint for Sender {
    fn receive(&mut self, now: Instant, packet: &[u8]) {
        if let Some(p) = decode(packet) {
            self.on_ack(now, &p);
        }
    }

    fn transmit(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        if self.rto_at.is_some_and(|t| t <= now) {
            self.rto_at = None;
            if self.snd_una != self.snd_nxt {
                self.log.rtos += 1;
                self.rtt.on_timeout();
                self.cc.on_rto(now, self.board.outstanding());
                self.board.on_rto();
                self.rto_at = Some(now + self.rtt.rto());
            }
        }
        self.send(now);
        out.append(&mut self.pending);
    }

    fn poll_at(&self, _now: Instant) -> Option<Instant> {
        self.rto_at
    }

    fn done(&self) -> bool {
        self.done_at.is_some()
    }

    fn report(&self) -> EndpointReport {
        EndpointReport {
            send_total: u64::from(self.total),
            acked: u64::from(self.snd_una.since(self.iss)),
            send_done_at: self.done_at,
            recv_done_at: Some(Instant::ZERO),
            retransmits: Some(self.retransmits),
            rtos: Some(u64::from(self.log.rtos)),
            ..EndpointReport::default()
        }
    }
}

struct Receiver {
    total: u32,
    irs: Seq,
    rx: Reassembly,
    data: Vec<u8>,
    delivered: u32,
    mismatch: Option<u64>,
    pending: Vec<Vec<u8>>,
    done_at: Option<Instant>,
}

impl Receiver {
    fn new(total: u32, irs: Seq) -> Receiver {
        Receiver {
            total,
            irs,
            rx: Reassembly::new(irs, ReassemblyConfig::default()),
            data: vec![0; total as usize],
            delivered: 0,
            mismatch: None,
            pending: Vec::new(),
            done_at: None,
        }
    }
}

impl SimEndpoint for Receiver {
    fn receive(&mut self, now: Instant, packet: &[u8]) {
        let Some(p) = decode(packet) else {
            return;
        };
        let len = p.payload.len() as u32;
        if let Received::Accepted { stored, .. } = self.rx.insert(p.seq, len, 4 << 20) {
            let skip = stored.start.since(p.seq) as usize;
            let off = stored.start.since(self.irs) as usize;
            let n = stored.len() as usize;
            if off + n <= self.data.len() && skip + n <= p.payload.len() {
                self.data[off..off + n].copy_from_slice(&p.payload[skip..skip + n]);
            }
        }
        let upto = self.rx.rcv_nxt().since(self.irs).min(self.total);
        for off in self.delivered..upto {
            if self.mismatch.is_none()
                && self.data[off as usize] != pattern_byte(STREAM, u64::from(off))
            {
                self.mismatch = Some(u64::from(off));
            }
        }
        self.delivered = upto;
        if self.delivered == self.total && self.done_at.is_none() {
            self.done_at = Some(now);
        }
        let ack = encode(&Pkt {
            seq: Seq(0),
            ack: self.rx.rcv_nxt(),
            sack: self.rx.sack_blocks(3),
            ts_val: now.total_micros(),
            ts_ecr: p.ts_val,
            payload: Vec::new(),
        });
        self.pending.push(ack);
    }

    fn transmit(&mut self, _now: Instant, out: &mut Vec<Vec<u8>>) {
        out.append(&mut self.pending);
    }

    fn poll_at(&self, _now: Instant) -> Option<Instant> {
        None
    }

    fn done(&self) -> bool {
        self.done_at.is_some()
    }

    fn report(&self) -> EndpointReport {
        EndpointReport {
            recv_total: u64::from(self.total),
            delivered: u64::from(self.delivered),
            first_mismatch: self.mismatch,
            recv_done_at: self.done_at,
            send_done_at: Some(Instant::ZERO),
            ..EndpointReport::default()
        }
    }
}

struct Outcome {
    stop: Stop,
    elapsed: Duration,
    goodput_mbit: f64,
    delivered: u64,
    mismatch: Option<u64>,
    log: CwndLog,
    lost: u64,
    tail_drops: u64,
}

fn run_model(algorithm: Algorithm, total: u32, cfg: WireConfig) -> Outcome {
    let mut s = Sender::new(algorithm, total);
    let mut r = Receiver::new(total, s.iss);
    let mut w = Wire::new(cfg);
    let rep = run(
        &mut s,
        &mut r,
        &mut w,
        Limit {
            time: Duration::from_secs(300),
            steps: 20_000_000,
        },
    );
    Outcome {
        stop: rep.stop,
        elapsed: rep.elapsed,
        goodput_mbit: rep.goodput_ab() / 1e6,
        delivered: rep.b.delivered,
        mismatch: rep.b.first_mismatch,
        lost: rep.wire[0].lost,
        tail_drops: rep.wire[0].queue_drops,
        log: s.log,
    }
}

/// 80 Mbit/s, 5 ms one way (BDP 100 KB = 100 segments), 200 KB queue, 1% loss.
fn lossy_wire(seed: u64) -> WireConfig {
    let mut cfg = WireConfig::link(80_000_000, Duration::from_millis(5));
    cfg.loss = 0.01;
    cfg.seed = seed;
    cfg
}

#[test]
fn model_sender_cwnd_sane_under_one_percent_loss() {
    for algorithm in [Algorithm::Cubic, Algorithm::NewReno] {
        for seed in 1..=3 {
            let o = run_model(algorithm, 8 << 20, lossy_wire(seed));
            let tag = format!("{algorithm:?} seed {seed}");
            assert_eq!(o.stop, Stop::Done, "{tag}");
            assert_eq!(o.delivered, 8 << 20, "{tag}");
            assert_eq!(o.mismatch, None, "{tag}");
            assert!(o.lost > 50, "{tag}: the wire lost {}", o.lost);
            let l = &o.log;
            // Loss episodes are recovered by SACK + PRR, not by timeouts.
            assert!(l.recoveries >= 10, "{tag}: {} recoveries", l.recoveries);
            assert!(l.rtos <= l.recoveries / 20 + 1, "{tag}: {} RTOs", l.rtos);
            assert_eq!(l.prr_violations, 0, "{tag}");
            // The window never runs away beyond what the wire plus its queue hold (100
            // segments of BDP + 200 of queue), and the reductions keep it at ≥ 2 segments.
            assert!(l.max_cwnd <= 400, "{tag}: max cwnd {} MSS", l.max_cwnd);
            assert!(l.min_after_recovery.unwrap_or(0) >= 2, "{tag}");
            // In recovery the window never grows: cwnd ≤ its value at the ACK before.
            for pair in l.samples.windows(2) {
                let ((_, c0, s0, r0), (_, c1, _, r1)) = (pair[0], pair[1]);
                if r0 && r1 {
                    assert!(c1 <= c0.max(s0), "{tag}: {c0} → {c1} in recovery");
                }
            }
            // 1% random loss: Mathis' bound for Reno ≈ 1.22·MSS/(RTT·√p) = 9.8 Mbit/s;
            // anything near it shows sane halving, far above it would mean no reduction.
            assert!(o.goodput_mbit > 3.0, "{tag}: {:.1} Mbit/s", o.goodput_mbit);
            assert!(o.goodput_mbit < 80.0, "{tag}");
        }
    }
}

/// Prints the model's goodput and window statistics (run by hand with --nocapture).
#[test]
#[ignore]
fn measure_model_sender() {
    println!("| cc | loss | Mbit/s | time s | recoveries | RTOs | max cwnd MSS | min ssthresh MSS | lost | tail drops |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for algorithm in [Algorithm::Cubic, Algorithm::NewReno] {
        for loss in [0.0, 0.001, 0.01, 0.05] {
            let mut cfg = lossy_wire(7);
            cfg.loss = loss;
            let o = run_model(algorithm, 16 << 20, cfg);
            println!(
                "| {:?} | {}% | {:.1} | {:.2}{} | {} | {} | {} | {} | {} | {} |",
                algorithm,
                loss * 100.0,
                o.goodput_mbit,
                o.elapsed.total_micros() as f64 / 1e6,
                if o.stop == Stop::Done && o.mismatch.is_none() {
                    ""
                } else {
                    " (unfinished)"
                },
                o.log.recoveries,
                o.log.rtos,
                o.log.max_cwnd,
                o.log
                    .min_after_recovery
                    .map_or("–".into(), |m| m.to_string()),
                o.lost,
                o.tail_drops,
            );
        }
    }
}
