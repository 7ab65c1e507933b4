//! One test per RFC rule the connection implements (named after the rule), driven by hand
//! with crafted segments from a fake peer.

use super::*;
use smoltcp::wire::Ipv4Address;

const ISS: u32 = 5000;
const PEER_ISS: u32 = 1_000_000;

/// A sink with `cap` bytes of room that keeps what it is given (the test drains it).
struct VecSink {
    data: Vec<u8>,
    cap: usize,
}

impl RxSink for VecSink {
    fn free(&self) -> usize {
        self.cap - self.data.len()
    }
    fn deliver(&mut self, d: &[u8]) -> usize {
        let n = d.len().min(self.free());
        self.data.extend_from_slice(&d[..n]);
        n
    }
}

fn ep(a: u8, port: u16) -> IpEndpoint {
    IpEndpoint::new(IpAddress::Ipv4(Ipv4Address::new(10, 0, 0, a)), port)
}

fn cfg() -> ConnConfig {
    ConnConfig {
        rx_window_max: 64 * 1024,
        ack_delay: Some(Duration::from_millis(40)),
        time_wait: Duration::from_secs(2),
        ..ConnConfig::default()
    }
}

/// The connection under test and a hand-driven peer.
struct T {
    c: Connection,
    now: Instant,
    tx: RingTx,
    sink: VecSink,
    /// The peer's next sequence number and its acknowledgment of ours.
    pseq: Seq,
    pack: Seq,
    pwin: u16,
    /// The peer's TSval (when timestamps are on).
    ts: Option<u32>,
    /// The peer's SACK blocks for its next segment.
    sack: [Option<(u32, u32)>; 3],
    /// The last TSval the connection sent (the peer echoes it).
    tsecr: u32,
}

impl T {
    fn syn(ts: bool) -> TcpRepr<'static> {
        TcpRepr {
            src_port: 80,
            dst_port: 4000,
            control: TcpControl::Syn,
            seq_number: Seq(PEER_ISS).into(),
            ack_number: None,
            window_len: 65535,
            window_scale: Some(7),
            max_seg_size: Some(1460),
            sack_permitted: true,
            sack_ranges: [None; 3],
            timestamp: ts.then(|| TcpTimestampRepr::new(100, 0)),
            payload: &[],
        }
    }

    /// An established connection (active open) with `cfg`.
    fn open(cfg: ConnConfig) -> T {
        T::open_with_room(cfg, 1 << 20)
    }

    /// The same with a sink of `room` bytes.
    fn open_with_room(cfg: ConnConfig, room: usize) -> T {
        T::open_after(cfg, room, Duration::ZERO)
    }

    /// The same with the SYN-ACK arriving `rtt` after the SYN.
    fn open_after(cfg: ConnConfig, room: usize, rtt: Duration) -> T {
        let now = Instant::from_secs(10);
        let c = Connection::connect(cfg, ep(1, 4000), ep(2, 80), Seq(ISS), now).unwrap();
        let mut t = T {
            c,
            now,
            tx: RingTx::new(1 << 20),
            sink: VecSink {
                data: Vec::new(),
                cap: room,
            },
            tsecr: 0,
            pseq: Seq(PEER_ISS),
            pack: Seq(ISS),
            pwin: 65535,
            ts: cfg.timestamps.then_some(100),
            sack: [None; 3],
        };
        let out = t.out();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].repr.control, TcpControl::Syn);
        t.wait(rtt);
        let mut synack = T::syn(cfg.timestamps);
        synack.ack_number = Some(Seq(ISS + 1).into());
        t.pack = Seq(ISS + 1);
        t.feed(synack, &[]);
        t.pseq = Seq(PEER_ISS + 1);
        assert_eq!(t.c.state(), State::Established);
        let out = t.out();
        assert!(out
            .iter()
            .any(|s| s.repr.ack_number == Some(Seq(PEER_ISS + 1).into())));
        t
    }

    fn out(&mut self) -> Vec<Segment> {
        let mut v = Vec::new();
        while let Some(s) = self.c.poll_transmit(self.now, &self.tx, &mut self.sink) {
            if let Some(ts) = s.repr.timestamp {
                self.tsecr = ts.tsval;
            }
            v.push(s);
            assert!(v.len() < 10_000);
        }
        v
    }

    fn payload(&self, s: &Segment) -> Vec<u8> {
        let mut b = vec![0; s.payload_len];
        assert_eq!(self.tx.copy_at(s.payload_offset, &mut b), s.payload_len);
        b
    }

    fn feed<'a>(&mut self, mut r: TcpRepr<'a>, payload: &'a [u8]) -> SegmentOutcome {
        if let (Some(ts), None) = (self.ts, r.timestamp) {
            r.timestamp = Some(TcpTimestampRepr::new(ts, self.tsecr));
        }
        r.payload = payload;
        let o = self.c.on_segment(self.now, &r, payload, &mut self.sink);
        self.tx.release(o.acked);
        o
    }

    fn repr(&self, seq: Seq, control: TcpControl) -> TcpRepr<'static> {
        TcpRepr {
            src_port: 80,
            dst_port: 4000,
            control,
            seq_number: seq.into(),
            ack_number: Some(self.pack.into()),
            window_len: self.pwin,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: self.sack,
            timestamp: None,
            payload: &[],
        }
    }

    /// The peer sends `payload` at `off` bytes past its next sequence number.
    fn data_at(&mut self, off: u32, payload: &[u8]) -> SegmentOutcome {
        let r = self.repr(self.pseq.wrapping_add(off), TcpControl::None);
        self.feed(r, payload)
    }

    /// An ACK from the peer (no payload).
    fn ack(&mut self, ack: Seq) -> SegmentOutcome {
        self.pack = ack;
        let r = self.repr(self.pseq, TcpControl::None);
        self.feed(r, &[])
    }

    fn wait(&mut self, d: Duration) {
        self.now += d;
    }

    fn acks(segs: &[Segment]) -> Vec<u32> {
        segs.iter()
            .filter_map(|s| s.repr.ack_number.map(|a| Seq::from(a).0))
            .collect()
    }
}

fn seq_of(s: &Segment) -> u32 {
    Seq::from(s.repr.seq_number).0
}

// ------------------------------------------------------------------ handshake, options

#[test]
fn rfc9293_3_5_active_open_syn_carries_options_and_completes() {
    let now = Instant::from_secs(1);
    let mut c = Connection::connect(cfg(), ep(1, 4000), ep(2, 80), Seq(ISS), now).unwrap();
    let tx = RingTx::new(16);
    let mut sink = VecSink {
        data: vec![],
        cap: 1000,
    };
    let syn = c.poll_transmit(now, &tx, &mut sink).unwrap();
    assert_eq!(syn.repr.control, TcpControl::Syn);
    assert_eq!(syn.repr.ack_number, None);
    assert_eq!(Seq::from(syn.repr.seq_number), Seq(ISS));
    assert_eq!(syn.repr.max_seg_size, Some(1460));
    assert_eq!(syn.repr.window_scale, Some(1)); // 64 KiB needs shift 1
    assert!(syn.repr.sack_permitted);
    assert!(syn.repr.timestamp.is_some());
    assert!(c.poll_transmit(now, &tx, &mut sink).is_none());
    let t = T::open(cfg());
    assert_eq!(t.c.negotiated(), (true, true, true));
    assert_eq!(t.c.window_scales(), (1, 7));
    // MSS 1460 minus 12 bytes of timestamp option.
    assert_eq!(t.c.info().snd_mss, 1448);
}

#[test]
fn rfc9293_3_5_passive_open_answers_syn_with_negotiated_options() {
    let now = Instant::from_secs(1);
    let mut syn = T::syn(false);
    syn.sack_permitted = false;
    syn.window_scale = None;
    let mut c = Connection::accept_syn(cfg(), ep(1, 4000), ep(2, 80), &syn, Seq(ISS), now).unwrap();
    assert_eq!(c.state(), State::SynReceived);
    let tx = RingTx::new(16);
    let mut sink = VecSink {
        data: vec![],
        cap: 1000,
    };
    let sa = c.poll_transmit(now, &tx, &mut sink).unwrap();
    assert_eq!(sa.repr.control, TcpControl::Syn);
    assert_eq!(sa.repr.ack_number, Some(Seq(PEER_ISS + 1).into()));
    // RFC 7323 §2.2 / RFC 2018 §2: only options the peer offered come back.
    assert_eq!(sa.repr.window_scale, None);
    assert!(!sa.repr.sack_permitted);
    assert_eq!(sa.repr.timestamp, None);
    let ack = TcpRepr {
        control: TcpControl::None,
        seq_number: Seq(PEER_ISS + 1).into(),
        ack_number: Some(Seq(ISS + 1).into()),
        ..syn
    };
    c.on_segment(now, &ack, &[], &mut sink);
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.negotiated(), (false, false, false));
    // A SYN-ACK or plain ACK is not a SYN to accept.
    assert_eq!(
        Connection::accept_syn(cfg(), ep(1, 4000), ep(2, 80), &ack, Seq(ISS), now).unwrap_err(),
        ConfigError::NotASyn
    );
}

#[test]
fn rfc9293_3_5_simultaneous_open() {
    let now = Instant::from_secs(1);
    let mut c = Connection::connect(cfg(), ep(1, 4000), ep(2, 80), Seq(ISS), now).unwrap();
    let tx = RingTx::new(16);
    let mut sink = VecSink {
        data: vec![],
        cap: 1000,
    };
    c.poll_transmit(now, &tx, &mut sink).unwrap();
    c.on_segment(now, &T::syn(true), &[], &mut sink);
    assert_eq!(c.state(), State::SynReceived);
    let sa = c.poll_transmit(now, &tx, &mut sink).unwrap();
    assert_eq!(sa.repr.control, TcpControl::Syn);
    assert_eq!(Seq::from(sa.repr.seq_number), Seq(ISS));
    assert_eq!(sa.repr.ack_number, Some(Seq(PEER_ISS + 1).into()));
    // The peer's SYN-ACK (its SYN again, now with our SYN acknowledged) completes it.
    let mut their_sa = T::syn(true);
    their_sa.ack_number = Some(Seq(ISS + 1).into());
    c.on_segment(now, &their_sa, &[], &mut sink);
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.rcv_nxt(), Seq(PEER_ISS + 1));
}

#[test]
fn rfc9293_3_10_7_3_syn_sent_unacceptable_ack_gets_rst() {
    let now = Instant::from_secs(1);
    let mut c = Connection::connect(cfg(), ep(1, 4000), ep(2, 80), Seq(ISS), now).unwrap();
    let tx = RingTx::new(16);
    let mut sink = VecSink {
        data: vec![],
        cap: 1000,
    };
    c.poll_transmit(now, &tx, &mut sink).unwrap();
    let mut bad = T::syn(false);
    bad.ack_number = Some(Seq(ISS + 77).into());
    c.on_segment(now, &bad, &[], &mut sink);
    assert_eq!(c.state(), State::SynSent);
    let rst = c.poll_transmit(now, &tx, &mut sink).unwrap();
    assert_eq!(rst.repr.control, TcpControl::Rst);
    assert_eq!(Seq::from(rst.repr.seq_number), Seq(ISS + 77));
    // A RST that does not acknowledge our SYN is ignored (RFC 5961 §3.2).
    bad.control = TcpControl::Rst;
    c.on_segment(now, &bad, &[], &mut sink);
    assert_eq!(c.state(), State::SynSent);
    // One that does refuses the connection.
    bad.ack_number = Some(Seq(ISS + 1).into());
    c.on_segment(now, &bad, &[], &mut sink);
    assert_eq!(
        (c.state(), c.error()),
        (State::Closed, Some(ConnError::Refused))
    );
}

#[test]
fn rfc6298_5_syn_retransmitted_with_backoff_then_times_out() {
    let mut now = Instant::from_secs(1);
    let cfg = ConnConfig {
        syn_retries: 2,
        ..cfg()
    };
    let mut c = Connection::connect(cfg, ep(1, 4000), ep(2, 80), Seq(ISS), now).unwrap();
    let tx = RingTx::new(16);
    let mut sink = VecSink {
        data: vec![],
        cap: 1000,
    };
    c.poll_transmit(now, &tx, &mut sink).unwrap();
    let first = c.poll_at().unwrap();
    assert_eq!(first - now, Duration::from_secs(1));
    now = first;
    let s = c.poll_transmit(now, &tx, &mut sink).unwrap();
    assert_eq!(s.repr.control, TcpControl::Syn);
    assert_eq!(c.poll_at().unwrap() - now, Duration::from_secs(2));
    now = c.poll_at().unwrap();
    assert!(c.poll_transmit(now, &tx, &mut sink).is_some());
    now = c.poll_at().unwrap();
    assert!(c.poll_transmit(now, &tx, &mut sink).is_none());
    assert_eq!(
        (c.state(), c.error()),
        (State::Closed, Some(ConnError::TimedOut))
    );
}

// ------------------------------------------------------------------ acceptability, RST, SYN

#[test]
fn rfc9293_3_10_7_4_unacceptable_segment_gets_ack() {
    let mut t = T::open(cfg());
    // Entirely before RCV.NXT (an old duplicate).
    let o = t.data_at(u32::MAX - 99, &[1; 50]);
    assert!(o.dropped);
    let out = t.out();
    assert_eq!(T::acks(&out), vec![PEER_ISS + 1]);
    // Far beyond the window.
    let o = t.data_at(10_000_000, &[1; 50]);
    assert!(o.dropped);
    assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 1]);
    assert!(t.sink.data.is_empty());
}

#[test]
fn rfc5961_3_2_rst_in_window_not_exact_gets_challenge_ack() {
    let mut t = T::open(cfg());
    let r = t.repr(t.pseq.wrapping_add(100), TcpControl::Rst);
    t.feed(r, &[]);
    assert_eq!(t.c.state(), State::Established);
    let out = t.out();
    assert_eq!(T::acks(&out), vec![PEER_ISS + 1]);
    assert_eq!(out[0].repr.control, TcpControl::None);
}

#[test]
fn rfc5961_3_2_rst_at_rcv_nxt_resets() {
    let mut t = T::open(cfg());
    let r = t.repr(t.pseq, TcpControl::Rst);
    t.feed(r, &[]);
    assert_eq!(
        (t.c.state(), t.c.error()),
        (State::Closed, Some(ConnError::Reset))
    );
    assert!(t.out().is_empty());
}

#[test]
fn rfc5961_3_2_rst_outside_window_is_silently_dropped() {
    let mut t = T::open(cfg());
    let r = t.repr(t.pseq.wrapping_add(1 << 24), TcpControl::Rst);
    t.feed(r, &[]);
    assert_eq!(t.c.state(), State::Established);
    assert!(t.out().is_empty());
}

#[test]
fn rfc5961_4_2_syn_in_synchronized_state_gets_challenge_ack() {
    let mut t = T::open(cfg());
    let mut r = t.repr(t.pseq.wrapping_add(10), TcpControl::Syn);
    r.ack_number = None;
    t.feed(r, &[]);
    assert_eq!(t.c.state(), State::Established);
    assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 1]);
}

#[test]
fn rfc5961_5_2_ack_for_unsent_data_dropped_with_ack() {
    let mut t = T::open(cfg());
    t.tx.write(&[9; 100]);
    let out = t.out();
    assert_eq!(out[0].payload_len, 100);
    // ACK beyond SND.NXT with data: dropped (data not taken), ACK sent.
    t.pack = Seq(ISS + 1 + 5000);
    let o = t.data_at(0, b"hello");
    assert!(o.dropped);
    assert_eq!(o.acked, 0);
    assert!(t.sink.data.is_empty());
    assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 1]);
    assert_eq!(t.tx.len(), 100);
}

#[test]
fn rfc5961_7_challenge_acks_are_throttled() {
    let mut t = T::open(ConnConfig {
        challenge_ack_limit: 3,
        ..cfg()
    });
    let mut sent = 0;
    for i in 0..10 {
        let r = t.repr(t.pseq.wrapping_add(100 + i), TcpControl::Rst);
        t.feed(r, &[]);
        sent += t.out().len();
    }
    assert_eq!(sent, 3);
    t.wait(Duration::from_secs(1));
    let r = t.repr(t.pseq.wrapping_add(100), TcpControl::Rst);
    t.feed(r, &[]);
    assert_eq!(t.out().len(), 1);
}

#[test]
fn rfc7323_5_3_paws_drops_old_timestamp() {
    let mut t = T::open(cfg());
    t.ts = Some(500);
    t.data_at(0, b"abcd");
    t.pseq = t.pseq.wrapping_add(4);
    assert_eq!(t.sink.data, b"abcd");
    // An older TSval: an old duplicate, dropped and acknowledged.
    t.ts = Some(400);
    let o = t.data_at(0, b"efgh");
    assert!(o.dropped);
    assert_eq!(t.sink.data, b"abcd");
    let out = t.out();
    assert_eq!(T::acks(&out), vec![PEER_ISS + 5]);
    // The ACK echoes the newest valid TSval (RFC 7323 §4.3).
    assert_eq!(out[0].repr.timestamp.unwrap().tsecr, 500);
}

#[test]
fn rfc7323_4_3_ts_recent_not_taken_from_segment_beyond_last_ack_sent() {
    let mut t = T::open(cfg());
    t.ts = Some(300);
    // Out of order: SEG.SEQ > Last.ACK.sent, TS.Recent must stay.
    t.data_at(1000, b"zz");
    let out = t.out();
    assert_eq!(out[0].repr.timestamp.unwrap().tsecr, 100);
}

// ------------------------------------------------------------------ receive path

#[test]
fn rfc5681_4_2_out_of_order_segment_acked_immediately() {
    let mut t = T::open(cfg());
    t.data_at(1000, &[1; 500]);
    let out = t.out();
    assert_eq!(out.len(), 1, "immediate duplicate ACK");
    assert_eq!(T::acks(&out), vec![PEER_ISS + 1]);
    // RFC 2018 §4: the block of the segment that triggered it.
    assert_eq!(
        out[0].repr.sack_ranges[0],
        Some((PEER_ISS + 1001, PEER_ISS + 1501))
    );
    // A second out-of-order segment: a second duplicate ACK, its block first.
    t.data_at(2000, &[1; 500]);
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].repr.sack_ranges[..2],
        [
            Some((PEER_ISS + 2001, PEER_ISS + 2501)),
            Some((PEER_ISS + 1001, PEER_ISS + 1501))
        ]
    );
}

#[test]
fn rfc5681_4_2_hole_filling_segment_acked_immediately() {
    let mut t = T::open(cfg());
    t.data_at(100, &[2; 100]);
    t.out();
    t.data_at(0, &[1; 100]);
    let out = t.out();
    assert_eq!(T::acks(&out), vec![PEER_ISS + 201]);
    assert_eq!(t.sink.data.len(), 200);
    assert_eq!(&t.sink.data[..100], &[1; 100]);
    assert_eq!(&t.sink.data[100..], &[2; 100]);
}

#[test]
fn rfc5681_4_2_ack_at_least_every_second_full_segment() {
    // With timestamps a full-sized segment carries 1448 bytes (1460 − 12 of options).
    let mut t = T::open(cfg());
    assert!(t.ts.is_some());
    let mut off = 0;
    for _ in 0..3 {
        t.data_at(off, &[1; 1448]);
        assert!(t.out().is_empty(), "first segment: ACK delayed");
        t.data_at(off + 1448, &[1; 1448]);
        off += 2896;
        assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 1 + off]);
    }
}

#[test]
fn rfc5681_4_2_delayed_ack_within_timeout() {
    let mut t = T::open(cfg());
    t.data_at(0, &[1; 10]);
    assert!(t.out().is_empty());
    assert_eq!(t.c.poll_at(), Some(t.now + Duration::from_millis(40)));
    t.wait(Duration::from_millis(40));
    assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 11]);
}

#[test]
fn rfc2883_4_duplicate_segment_reported_as_dsack_first() {
    let mut t = T::open(cfg());
    t.data_at(0, &[1; 100]);
    t.wait(Duration::from_millis(50));
    t.out();
    t.data_at(500, &[3; 100]);
    t.out();
    t.data_at(0, &[1; 100]);
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].repr.sack_ranges[..2],
        [
            Some((PEER_ISS + 1, PEER_ISS + 101)),
            Some((PEER_ISS + 501, PEER_ISS + 601))
        ]
    );
}

#[test]
fn sink_taking_less_keeps_bytes_and_shrinks_the_window_offered() {
    let mut t = T::open(cfg());
    t.sink.cap = 300;
    t.data_at(0, &[5; 1000]);
    assert_eq!(t.sink.data.len(), 300);
    assert_eq!(t.c.info().ooo_bytes, 700);
    t.wait(Duration::from_millis(50));
    let out = t.out();
    // All 1000 were in the window last advertised: acknowledged, and held.
    assert_eq!(T::acks(&out), vec![PEER_ISS + 1001]);
    // The application reads: the rest arrives.
    t.sink.cap = 2000;
    t.out();
    assert_eq!(t.sink.data.len(), 1000);
    assert_eq!(t.c.info().ooo_bytes, 0);
}

#[test]
fn rfc9293_3_8_6_window_right_edge_never_moves_left() {
    let mut t = T::open(cfg());
    t.wait(Duration::from_millis(1));
    t.data_at(0, &[1; 10]);
    t.wait(Duration::from_millis(50));
    let out = t.out();
    let w0 = (out[0].repr.window_len as u32) << 1;
    let edge0 = PEER_ISS + 11 + w0;
    // The application stops reading and its room shrinks to almost nothing.
    t.sink.cap = t.sink.data.len() + 100;
    t.data_at(10, &[1; 50]);
    t.wait(Duration::from_millis(50));
    let out = t.out();
    let ack = Seq::from(out[0].repr.ack_number.unwrap()).0;
    let edge1 = ack + ((out[0].repr.window_len as u32) << 1);
    assert!(edge1 >= edge0, "edge {edge1} < {edge0}");
}

#[test]
fn rfc7323_2_3_window_field_is_scaled() {
    let mut t = T::open(cfg());
    t.data_at(0, &[1; 10]);
    t.wait(Duration::from_millis(50));
    let out = t.out();
    // 64 KiB of room with shift 1: the right edge stays at RCV.NXT(initial) + 65536.
    let ack = Seq::from(out[0].repr.ack_number.unwrap()).0;
    assert_eq!(
        ack + ((out[0].repr.window_len as u32) << 1),
        PEER_ISS + 1 + 65536
    );
    assert!(out[0].repr.window_len > 0x7fff - 10);
}

#[test]
fn rfc9293_3_8_6_2_2_receiver_sws_no_tiny_window_openings() {
    let mut t = T::open_with_room(cfg(), 2000);
    t.data_at(0, &[1; 2000]);
    t.wait(Duration::from_millis(50));
    let out = t.out();
    assert_eq!(out.last().unwrap().repr.window_len, 0);
    // 10 bytes read: no window update for so little.
    t.sink.data.drain(..10);
    t.sink.cap = 2000;
    assert!(t.out().is_empty());
    // Half the buffer read: an update.
    t.sink.data.drain(..1500);
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert!(out[0].repr.window_len > 0);
}

// ------------------------------------------------------------------ send path

#[test]
fn segments_never_cross_a_record_boundary() {
    let mut t = T::open(cfg());
    assert!(t.tx.push_record(&[1; 100]));
    assert!(t.tx.push_record(&[2; 3000]));
    assert!(t.tx.push_record(&[3; 50]));
    let out = t.out();
    let lens: Vec<usize> = out.iter().map(|s| s.payload_len).collect();
    assert_eq!(lens, vec![100, 1448, 1448, 104, 50]);
    let mut all = Vec::new();
    for s in &out {
        all.extend(t.payload(s));
    }
    assert_eq!(all.len(), 3150);
    assert!(all[..100].iter().all(|&b| b == 1));
    assert!(all[100..3100].iter().all(|&b| b == 2));
}

#[test]
fn rfc6928_initial_window_ten_segments() {
    let mut t = T::open(cfg());
    t.tx.write(&[7; 100_000]);
    let out = t.out();
    let data: Vec<&Segment> = out.iter().filter(|s| s.payload_len > 0).collect();
    assert_eq!(data.len(), 10);
    assert!(data.iter().all(|s| s.payload_len == 1448));
}

#[test]
fn rfc9293_3_7_4_nagle_holds_small_segment_while_data_is_unacknowledged() {
    let mut t = T::open(ConnConfig {
        nagle: true,
        ..cfg()
    });
    t.tx.write(&[1; 10]);
    assert_eq!(t.out().len(), 1);
    t.tx.write(&[1; 10]);
    assert!(t.out().iter().all(|s| s.payload_len == 0));
    t.ack(Seq(ISS + 11));
    let out = t.out();
    assert_eq!(out.iter().map(|s| s.payload_len).sum::<usize>(), 10);
}

#[test]
fn rfc6298_5_rto_retransmits_with_floor_and_backoff() {
    // A peer that delays ACKs by 20 ms at most: the probe fires before the RTO.
    let mut t = T::open(ConnConfig {
        peer_max_ack_delay: Duration::from_millis(20),
        ..cfg()
    });
    t.tx.write(&[7; 100]);
    let out = t.out();
    assert_eq!(out.len(), 1);
    // No RTT sample yet: 1 s initial RTO; TLP first (no SRTT: 1 s as well, capped by it).
    let d = t.c.poll_at().unwrap();
    t.now = d;
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].payload_len, 100);
    // Round trip sample of 10 ms: RTO is the 200 ms floor.
    t.wait(Duration::from_millis(10));
    t.ts = Some(200);
    t.ack(Seq(ISS + 101));
    assert_eq!(t.c.info().rto, Duration::from_millis(200));
    t.tx.write(&[8; 100]);
    t.out();
    // Let the TLP and then the RTO fire.
    let mut rtos = 0;
    let mut last = t.now;
    let mut gaps = Vec::new();
    while rtos < 3 {
        let d = t.c.poll_at().unwrap();
        t.now = d;
        let out = t.out();
        if !out.is_empty() {
            gaps.push(t.now - last);
            last = t.now;
        }
        rtos = t.c.info().rto_count;
    }
    // The ACK at exactly the first probe's end leaves its verdict open (a DSACK may
    // follow, RFC 8985 §7.4.2 / Linux tcp_process_tlp_ack), so no second probe is armed.
    assert_eq!(t.c.info().tlp_count, 1, "{gaps:?} {:?}", t.c.info());
    // After the probe the retransmissions back off: 200 ms floor, then 400, 800.
    let ms: Vec<u64> = gaps.iter().map(|g| g.total_millis()).collect();
    assert!(ms.ends_with(&[400, 800]), "{ms:?}");
}

#[test]
fn rfc8985_7_tail_loss_probe_before_rto() {
    let mut t = T::open(cfg());
    t.tx.write(&[1; 3 * 1448]);
    t.out();
    t.wait(Duration::from_millis(10));
    // First one acked, SRTT 10 ms; two in flight: PTO = 2·SRTT.
    t.ack(Seq(ISS + 1 + 1448));
    let pto = t.c.poll_at().unwrap();
    assert!(
        pto - t.now < Duration::from_millis(200),
        "{:?}",
        pto - t.now
    );
    t.now = pto;
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(seq_of(&out[0]), ISS + 1 + 2 * 1448);
    assert_eq!(t.c.info().tlp_count, 1);
    assert_eq!(t.c.info().rto_count, 0);
}

#[test]
fn rfc6675_duplicate_acks_carrying_data_trigger_fast_retransmit() {
    let mut t = T::open(cfg());
    t.tx.write(&[1; 1448 * 6]);
    t.out();
    t.wait(Duration::from_millis(10));
    t.ack(Seq(ISS + 1)); // nothing new
                         // The first segment is lost; the peer's data segments SACK the rest.
    let una = ISS + 1;
    for k in 1..=5u32 {
        t.sack = [Some((una + 1448, una + 1448 * (k + 1))), None, None];
        t.data_at(0, &[9; 100]);
        t.pseq = t.pseq.wrapping_add(100);
    }
    t.wait(Duration::from_millis(5));
    let out = t.out();
    let rexmit: Vec<&Segment> = out.iter().filter(|s| s.payload_len > 0).collect();
    assert!(
        rexmit.iter().any(|s| seq_of(s) == una),
        "retransmitted {:?}",
        rexmit.iter().map(|s| seq_of(s)).collect::<Vec<_>>()
    );
    assert_eq!(t.c.info().rto_count, 0);
    assert_eq!(t.c.info().fast_recoveries, 1);
}

/// RFC 6675 §5 (4.3): on entering loss recovery the first segment presumed lost is
/// retransmitted at once, whatever PRR's quota (RFC 6937 starts with prr_delivered = 0).
/// Here RACK's reordering timer starts the recovery with no ACK arriving and pipe equal to
/// ssthresh, where sndcnt is 0: without the rule nothing left until the RTO. Toward a
/// Linux receiver whose burst of SACKs ended with the one that started recovery, that was
/// a 200 ms stall per loss burst.
#[test]
fn rfc6675_5_4_3_entering_recovery_retransmits_first_lost_segment_regardless_of_prr() {
    let mut t = T::open_after(cfg(), 1 << 20, Duration::from_millis(4));
    t.tx.write(&[1; 1448 * 10]);
    let first = t.out();
    assert_eq!(first.iter().filter(|s| s.payload_len > 0).count(), 10);
    t.wait(Duration::from_millis(5));
    let una = ISS + 1;
    // Segments 1 and 2 SACKed, segment 0 not: fewer than DupThresh, so RACK waits its
    // reordering window before calling segment 0 lost.
    t.sack = [Some((una + 1448, una + 1448 * 3)), None, None];
    t.ack(Seq(una));
    let out = t.out();
    assert!(!out.iter().any(|s| s.payload_len > 0 && seq_of(s) == una));
    // No more ACKs: the timers run until segment 0 leaves again.
    let mut rexmit_at = None;
    for _ in 0..8 {
        let at = t.c.poll_at().expect("a timer");
        t.now = at;
        if t.out()
            .iter()
            .any(|s| s.payload_len > 0 && seq_of(s) == una)
        {
            rexmit_at = Some(at);
            break;
        }
    }
    let at = rexmit_at.expect("segment 0 retransmitted");
    let info = t.c.info();
    assert_eq!(info.rto_count, 0, "{info:?}");
    assert_eq!(info.fast_recoveries, 1, "{info:?}");
    assert!(
        at - Instant::from_secs(10) < Duration::from_millis(50),
        "at {at}"
    );
}

#[test]
fn rfc2883_spurious_fast_recovery_undone_by_dsack() {
    let mut t = T::open(cfg());
    t.tx.write(&[1; 1448 * 6]);
    t.out();
    let cwnd_before = t.c.info().cwnd;
    t.wait(Duration::from_millis(10));
    let una = ISS + 1;
    // The first segment is only late: the peer SACKs the others first.
    for k in 1..=5u32 {
        t.sack = [Some((una + 1448, una + 1448 * (k + 1))), None, None];
        t.ack(Seq(una));
    }
    t.wait(Duration::from_millis(5));
    let out = t.out();
    assert!(out.iter().any(|s| s.payload_len > 0 && seq_of(s) == una));
    assert_eq!(t.c.info().fast_recoveries, 1);
    assert!(t.c.info().cwnd < cwnd_before);
    // The original arrives (everything acknowledged), then the retransmission: DSACK.
    t.sack = [None; 3];
    t.ack(Seq(una + 1448 * 6));
    t.sack = [Some((una, una + 1448)), None, None];
    t.ack(Seq(una + 1448 * 6));
    assert_eq!(t.c.info().dsacks_received, 1);
    assert_eq!(t.c.info().undos, 1);
    assert!(t.c.info().cwnd >= cwnd_before, "{:?}", t.c.info());
}

#[test]
fn rfc2883_dsack_of_a_network_duplicate_undoes_nothing() {
    let mut t = T::open(cfg());
    t.tx.write(&[1; 1448 * 6]);
    t.out();
    t.wait(Duration::from_millis(10));
    let una = ISS + 1;
    for k in 1..=5u32 {
        t.sack = [Some((una + 1448, una + 1448 * (k + 1))), None, None];
        t.ack(Seq(una));
    }
    t.wait(Duration::from_millis(5));
    t.out();
    // A DSACK for a segment that was never retransmitted (the network duplicated it).
    t.sack = [Some((una + 1448 * 3, una + 1448 * 4)), None, None];
    t.ack(Seq(una + 1448 * 6));
    assert_eq!(t.c.info().dsacks_received, 1);
    assert_eq!(t.c.info().undos, 0);
}

#[test]
fn rfc5681_3_2_without_sack_third_duplicate_ack_fast_retransmits() {
    let mut t = T::open(ConnConfig {
        sack: false,
        ..cfg()
    });
    t.tx.write(&[1; 1448 * 6]);
    t.out();
    for _ in 0..3 {
        t.ack(Seq(ISS + 1));
    }
    let out = t.out();
    assert_eq!(
        out.iter()
            .filter(|s| s.payload_len > 0 && seq_of(s) == ISS + 1)
            .count(),
        1
    );
}

#[test]
fn rfc2883_dsack_received_is_counted() {
    let mut t = T::open(cfg());
    t.tx.write(&[1; 2896]);
    t.out();
    t.sack = [Some((ISS + 1, ISS + 1449)), None, None];
    t.ack(Seq(ISS + 2897));
    assert_eq!(t.c.info().dsacks_received, 1);
    assert_eq!(t.tx.len(), 0);
}

#[test]
fn rfc9293_3_8_6_1_zero_window_probe() {
    let mut t = T::open(cfg());
    t.pwin = 0;
    t.ack(Seq(ISS + 1));
    t.tx.write(&[1; 100]);
    assert!(t.out().is_empty(), "nothing into a zero window");
    let p = t.c.poll_at().unwrap();
    t.now = p;
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].payload_len, 0);
    assert_eq!(seq_of(&out[0]), ISS); // one below SND.NXT: the peer answers
    t.pwin = 1000;
    t.ack(Seq(ISS + 1));
    assert_eq!(t.out()[0].payload_len, 100);
}

#[test]
fn rfc9293_3_8_4_keepalive_probes_then_times_out() {
    let mut t = T::open(ConnConfig {
        keepalive: Some(Duration::from_secs(10)),
        keepalive_interval: Duration::from_secs(1),
        keepalive_probes: 2,
        ..cfg()
    });
    t.out();
    t.now = t.c.poll_at().unwrap();
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(seq_of(&out[0]), ISS);
    // An answer resets it.
    t.ack(Seq(ISS + 1));
    assert!(t.c.poll_at().unwrap() - t.now >= Duration::from_secs(10));
    for _ in 0..3 {
        t.now = t.c.poll_at().unwrap();
        t.out();
    }
    assert_eq!(
        (t.c.state(), t.c.error()),
        (State::Closed, Some(ConnError::TimedOut))
    );
}

// ------------------------------------------------------------------ closing

#[test]
fn rfc9293_3_6_active_close_through_time_wait() {
    let mut t = T::open(cfg());
    t.tx.write(b"bye");
    t.c.close();
    assert!(!t.c.may_send());
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.control, TcpControl::Fin);
    assert_eq!(out[0].payload_len, 3);
    assert_eq!(t.c.state(), State::FinWait1);
    t.ack(Seq(ISS + 5));
    assert_eq!(t.c.state(), State::FinWait2);
    let r = t.repr(t.pseq, TcpControl::Fin);
    t.feed(r, &[]);
    assert_eq!(t.c.state(), State::TimeWait);
    assert!(t.c.rx_eof());
    assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 2]);
    // RFC 9293 §3.10.7.4: a retransmitted FIN is acknowledged again, 2·MSL restarts.
    t.wait(Duration::from_secs(1));
    let r = t.repr(t.pseq, TcpControl::Fin);
    t.feed(r, &[]);
    assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 2]);
    assert_eq!(t.c.poll_at(), Some(t.now + Duration::from_secs(2)));
    t.wait(Duration::from_secs(2));
    t.out();
    assert_eq!((t.c.state(), t.c.error()), (State::Closed, None));
}

#[test]
fn rfc9293_3_6_passive_close_through_last_ack() {
    let mut t = T::open(cfg());
    let r = t.repr(t.pseq, TcpControl::Fin);
    t.feed(r, b"end");
    assert_eq!(t.c.state(), State::CloseWait);
    assert_eq!(t.sink.data, b"end");
    assert!(t.c.rx_eof());
    assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 5]);
    // We may still send.
    t.tx.write(b"reply");
    t.c.close();
    let out = t.out();
    assert_eq!(out[0].repr.control, TcpControl::Fin);
    assert_eq!(t.c.state(), State::LastAck);
    t.pseq = t.pseq.wrapping_add(4);
    t.ack(Seq(ISS + 7));
    assert_eq!((t.c.state(), t.c.error()), (State::Closed, None));
}

#[test]
fn rfc9293_3_6_simultaneous_close_through_closing() {
    let mut t = T::open(cfg());
    t.c.close();
    let out = t.out();
    assert_eq!(out[0].repr.control, TcpControl::Fin);
    // The peer's FIN crosses ours (it has not seen ours).
    let r = t.repr(t.pseq, TcpControl::Fin);
    t.feed(r, &[]);
    assert_eq!(t.c.state(), State::Closing);
    t.pseq = t.pseq.wrapping_add(1);
    t.ack(Seq(ISS + 2));
    assert_eq!(t.c.state(), State::TimeWait);
}

#[test]
fn rfc9293_3_10_7_4_fin_after_a_hole_waits_for_the_hole() {
    let mut t = T::open(cfg());
    let r = t.repr(t.pseq.wrapping_add(100), TcpControl::Fin);
    t.feed(r, &[2; 50]);
    assert_eq!(t.c.state(), State::Established);
    t.data_at(0, &[1; 100]);
    assert_eq!(t.c.state(), State::CloseWait);
    assert_eq!(t.sink.data.len(), 150);
    assert_eq!(T::acks(&t.out()).last(), Some(&(PEER_ISS + 152)));
}

#[test]
fn rfc9293_3_10_7_4_rst_keeps_bytes_the_sink_has_not_taken() {
    let mut t = T::open(cfg());
    t.sink.cap = 100;
    t.data_at(0, &[4; 600]);
    assert_eq!(t.sink.data.len(), 100);
    let r = t.repr(t.pseq.wrapping_add(600), TcpControl::Rst);
    t.feed(r, &[]);
    assert_eq!(
        (t.c.state(), t.c.error()),
        (State::Closed, Some(ConnError::Reset))
    );
    assert!(!t.c.rx_eof());
    // The application reads on: what was acknowledged before the RST still arrives.
    t.sink.cap = 1000;
    assert!(t.out().is_empty());
    assert_eq!(t.sink.data, vec![4; 600]);
    assert_eq!(t.c.info().ooo_bytes, 0);
}

#[test]
fn rfc9293_3_10_5_abort_sends_rst() {
    let mut t = T::open(cfg());
    t.c.abort();
    assert_eq!(
        (t.c.state(), t.c.error()),
        (State::Closed, Some(ConnError::Aborted))
    );
    let out = t.out();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].repr.control, TcpControl::Rst);
    assert_eq!(seq_of(&out[0]), ISS + 1);
}

#[test]
fn emit_writes_a_checksummed_segment_from_the_source() {
    let mut t = T::open(cfg());
    t.tx.write(b"payload bytes");
    let out = t.out();
    let (src, dst) = (t.c.local().addr, t.c.remote().addr);
    let mut buf = vec![0u8; 2000];
    let n = out[0].emit(&mut buf, &src, &dst, &t.tx).unwrap();
    let pkt = TcpPacket::new_checked(&buf[..n]).unwrap();
    assert!(pkt.verify_checksum(&src, &dst));
    let r = TcpRepr::parse(&pkt, &src, &dst, &ChecksumCapabilities::default()).unwrap();
    assert_eq!(r.payload, b"payload bytes");
    assert!(r.timestamp.is_some());
    assert_eq!(
        out[0].emit(&mut buf[..10], &src, &dst, &t.tx),
        Err(EmitError::BufferTooSmall)
    );
}

#[test]
fn config_errors_are_reported() {
    let now = Instant::ZERO;
    let bad = ConnConfig { mss: 10, ..cfg() };
    assert_eq!(
        Connection::connect(bad, ep(1, 1), ep(2, 2), Seq(1), now).unwrap_err(),
        ConfigError::MssTooSmall
    );
    let bad = ConnConfig {
        rx_window_max: 0,
        ..cfg()
    };
    assert_eq!(bad.validate(), Err(ConfigError::BadWindow));
}

// ------------------------------------------------------------------ hostile input

mod hostile {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    struct Seg {
        off: i64,
        ack_off: i64,
        ctl: u8,
        len: usize,
        win: u16,
        sack: [Option<(i64, i64)>; 3],
        ts: Option<u32>,
        mss: Option<u16>,
    }

    fn seg() -> impl Strategy<Value = Seg> {
        let blk = proptest::option::of((-70_000i64..70_000, -70_000i64..70_000));
        (
            -100_000i64..100_000,
            -100_000i64..100_000,
            0u8..5,
            0usize..3000,
            any::<u16>(),
            [blk.clone(), blk.clone(), blk],
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u16>()),
        )
            .prop_map(|(off, ack_off, ctl, len, win, sack, ts, mss)| Seg {
                off,
                ack_off,
                ctl,
                len,
                win,
                sack,
                ts,
                mss,
            })
    }

    fn to_repr<'a>(s: &Seg, payload: &'a [u8]) -> TcpRepr<'a> {
        let ctl = [
            TcpControl::None,
            TcpControl::Psh,
            TcpControl::Syn,
            TcpControl::Fin,
            TcpControl::Rst,
        ][s.ctl as usize];
        let base = Seq(PEER_ISS + 1);
        let una = Seq(ISS + 1);
        TcpRepr {
            src_port: 80,
            dst_port: 4000,
            control: ctl,
            seq_number: base.wrapping_add(s.off as u32).into(),
            ack_number: (s.ack_off % 3 != 0).then(|| una.wrapping_add(s.ack_off as u32).into()),
            window_len: s.win,
            window_scale: s.mss.map(|m| m as u8),
            max_seg_size: s.mss,
            sack_permitted: s.win.is_multiple_of(2),
            sack_ranges: s.sack.map(|b| {
                b.map(|(l, r)| (una.wrapping_add(l as u32).0, una.wrapping_add(r as u32).0))
            }),
            timestamp: s.ts.map(|v| TcpTimestampRepr::new(v, v)),
            payload: &payload[..s.len],
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn hostile_segments_during_the_handshake_never_panic(
            segs in proptest::collection::vec(seg(), 1..60),
            passive in any::<bool>(),
        ) {
            let now = Instant::from_secs(1);
            let mut c = if passive {
                Connection::accept_syn(cfg(), ep(1, 4000), ep(2, 80), &T::syn(true), Seq(ISS), now).unwrap()
            } else {
                Connection::connect(cfg(), ep(1, 4000), ep(2, 80), Seq(ISS), now).unwrap()
            };
            let tx = RingTx::new(1024);
            let mut sink = VecSink { data: vec![], cap: 4096 };
            let payload = vec![0x55; 3000];
            let mut t = now;
            for s in &segs {
                while c.poll_transmit(t, &tx, &mut sink).is_some() {}
                let r = to_repr(s, &payload);
                let o = c.on_segment(t, &r, r.payload, &mut sink);
                prop_assert_eq!(o.acked, 0);
                prop_assert!(sink.data.len() <= 4096);
                t += Duration::from_millis(7);
            }
        }

        #[test]
        fn hostile_segments_never_panic_and_stay_bounded(segs in proptest::collection::vec(seg(), 1..200)) {
            let cfg = ConnConfig {
                ooo: ReassemblyConfig { max_ranges: 8, max_bytes: 20_000 },
                ..cfg()
            };
            let mut t = T::open(cfg);
            t.tx.write(&[3; 50_000]);
            t.out();
            let payload = vec![0xaa; 3000];
            for s in segs {
                let ctl = [TcpControl::None, TcpControl::Psh, TcpControl::Syn, TcpControl::Fin, TcpControl::Rst][s.ctl as usize];
                let base = Seq(PEER_ISS + 1);
                let una = Seq(ISS + 1);
                let r = TcpRepr {
                    src_port: 80,
                    dst_port: 4000,
                    control: ctl,
                    seq_number: base.wrapping_add(s.off as u32).into(),
                    ack_number: Some(una.wrapping_add(s.ack_off as u32).into()),
                    window_len: s.win,
                    window_scale: None,
                    max_seg_size: s.mss,
                    sack_permitted: false,
                    sack_ranges: s.sack.map(|b| b.map(|(l, r)| (una.wrapping_add(l as u32).0, una.wrapping_add(r as u32).0))),
                    timestamp: s.ts.map(|v| TcpTimestampRepr::new(v, v)),
                    payload: &payload[..s.len],
                };
                let o = t.c.on_segment(t.now, &r, &payload[..s.len], &mut t.sink);
                prop_assert!(o.acked <= t.tx.len());
                t.tx.release(o.acked);
                t.wait(Duration::from_millis(3));
                let out = t.out();
                prop_assert!(out.len() < 1000);
                for seg in &out {
                    prop_assert!(seg.payload_len <= 1448);
                    prop_assert!(seg.payload_offset + seg.payload_len as u64 <= t.tx.len());
                }
                let info = t.c.info();
                // Out-of-order bytes within the map's bound plus one advertised window.
                prop_assert!(info.ooo_bytes <= 20_000 + 64 * 1024);
                if t.c.state() == State::Closed {
                    break;
                }
            }
        }
    }
}

/// Two connections wired back to back (every segment emitted, checksummed and parsed).
fn exchange(
    now: Instant,
    c: &mut [Connection; 2],
    tx: &mut [RingTx; 2],
    sink: &mut [VecSink; 2],
) -> usize {
    // Both sides transmit first, then both receive: their segments cross.
    let mut moved = 0;
    let mut frames = [Vec::new(), Vec::new()];
    for i in 0..2 {
        let (src, dst) = (c[i].local().addr, c[i].remote().addr);
        while let Some(seg) = c[i].poll_transmit(now, &tx[i], &mut sink[i]) {
            let mut buf = vec![0u8; seg.buffer_len()];
            seg.emit(&mut buf, &src, &dst, &tx[i]).unwrap();
            frames[i].push(buf);
        }
    }
    for (i, frames) in frames.into_iter().enumerate() {
        let (src, dst) = (c[i].local().addr, c[i].remote().addr);
        for f in frames {
            moved += 1;
            let pkt = TcpPacket::new_checked(&f[..]).unwrap();
            let r = TcpRepr::parse(&pkt, &src, &dst, &ChecksumCapabilities::default()).unwrap();
            let o = c[1 - i].on_segment(now, &r, r.payload, &mut sink[1 - i]);
            tx[1 - i].release(o.acked);
        }
    }
    moved
}

#[test]
fn rfc9293_3_5_simultaneous_open_and_close_between_two_connections() {
    let mut now = Instant::from_secs(5);
    let mut c = [
        Connection::connect(cfg(), ep(1, 7000), ep(2, 7001), Seq(111), now).unwrap(),
        Connection::connect(cfg(), ep(2, 7001), ep(1, 7000), Seq(u32::MAX - 5), now).unwrap(),
    ];
    let mut tx = [RingTx::new(1 << 16), RingTx::new(1 << 16)];
    let mut sink = [
        VecSink {
            data: vec![],
            cap: 1 << 20,
        },
        VecSink {
            data: vec![],
            cap: 1 << 20,
        },
    ];
    // Both SYNs cross: each side sees a SYN in SYN-SENT.
    for _ in 0..10 {
        exchange(now, &mut c, &mut tx, &mut sink);
        now += Duration::from_millis(1);
    }
    assert_eq!(c.each_ref().map(|c| c.state()), [State::Established; 2]);
    let a: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let b: Vec<u8> = (0..30_000u32).map(|i| (i % 241) as u8).collect();
    tx[0].write(&a);
    tx[1].write(&b);
    for _ in 0..200 {
        exchange(now, &mut c, &mut tx, &mut sink);
        now += Duration::from_millis(1);
    }
    assert_eq!(sink[1].data, a);
    assert_eq!(sink[0].data, b);
    // Both close at once: the FINs cross (CLOSING on both sides, then TIME-WAIT).
    c[0].close();
    c[1].close();
    exchange(now, &mut c, &mut tx, &mut sink);
    assert_eq!(c.each_ref().map(|c| c.state()), [State::Closing; 2]);
    exchange(now, &mut c, &mut tx, &mut sink);
    assert_eq!(c.each_ref().map(|c| c.state()), [State::TimeWait; 2]);
    assert!(c.iter().all(|c| c.rx_eof()));
    now += Duration::from_secs(2);
    exchange(now, &mut c, &mut tx, &mut sink);
    assert_eq!(c.each_ref().map(|c| c.state()), [State::Closed; 2]);
    assert_eq!(c.each_ref().map(|c| c.error()), [None; 2]);
}

#[test]
fn rfc6298_3_karn_no_rtt_sample_from_a_retransmitted_segment() {
    let mut t = T::open(ConnConfig {
        timestamps: false,
        ..cfg()
    });
    t.ts = None;
    let srtt0 = t.c.info().srtt;
    t.tx.write(&[1; 100]);
    t.out();
    // The RTO (no probe without an RTT... the PTO fires first and retransmits).
    t.now = t.c.poll_at().unwrap();
    assert_eq!(t.out()[0].payload_len, 100);
    t.wait(Duration::from_millis(700));
    t.ack(Seq(ISS + 101));
    // An ACK for a retransmitted segment is ambiguous: no sample taken.
    assert_eq!(t.c.info().srtt, srtt0);
    // A fresh segment is timed again.
    t.tx.write(&[2; 100]);
    t.out();
    t.wait(Duration::from_millis(30));
    t.ack(Seq(ISS + 201));
    assert_ne!(t.c.info().srtt, srtt0);
}

#[test]
fn rfc9293_3_10_7_4_zero_window_still_takes_acks() {
    let mut t = T::open_with_room(cfg(), 1000);
    t.tx.write(&[1; 500]);
    t.out();
    t.data_at(0, &[9; 1000]);
    t.wait(Duration::from_millis(50));
    let out = t.out();
    assert_eq!(out.last().unwrap().repr.window_len, 0);
    t.pseq = t.pseq.wrapping_add(1000);
    // A data segment into the closed window: not taken, but its ACK is processed.
    t.pack = Seq(ISS + 501);
    let o = t.data_at(0, &[8; 10]);
    assert_eq!(o.acked, 500);
    assert_eq!(t.sink.data.len(), 1000);
    assert_eq!(T::acks(&t.out()), vec![PEER_ISS + 1001]);
}

// ------------------------------------------------------------------ review fixes

/// Calls `poll_transmit` until `None`, at most `max` times; the segments, or a panic.
fn out_bounded(t: &mut T, max: usize) -> Vec<Segment> {
    let mut v = Vec::new();
    while let Some(s) = t.c.poll_transmit(t.now, &t.tx, &mut t.sink) {
        if let Some(ts) = s.repr.timestamp {
            t.tsecr = ts.tsval;
        }
        v.push(s);
        assert!(
            v.len() <= max,
            "poll_transmit did not stop: {} segments",
            v.len()
        );
    }
    v
}

#[test]
fn rfc9293_3_8_6_2_2_window_update_only_when_the_advertised_window_changes() {
    // No window scaling and far more room than 65535 + MSS: the field stays at 0xffff, so
    // no window update is ever due.
    let c = ConnConfig {
        window_scaling: false,
        rx_window_max: 1 << 20,
        ..cfg()
    };
    let mut t = T::open_with_room(c, 1 << 20);
    t.data_at(0, &[1; 1000]);
    t.wait(Duration::from_millis(50));
    assert_eq!(out_bounded(&mut t, 2).len(), 1);
    t.sink.data.clear();
    assert!(out_bounded(&mut t, 1).len() <= 1);
    assert!(out_bounded(&mut t, 0).is_empty());
    // A slowly draining sink with window scaling: every drain step ends after at most one
    // update.
    let mut t = T::open_with_room(cfg(), 20_000);
    t.data_at(0, &[2; 20_000]);
    t.wait(Duration::from_millis(50));
    out_bounded(&mut t, 2);
    for _ in 0..200 {
        t.sink.data.drain(..100);
        out_bounded(&mut t, 1);
    }
    assert!(out_bounded(&mut t, 0).is_empty());
}

#[test]
fn rfc9293_3_7_1_mss_from_the_mtu_per_address_family() {
    assert_eq!(ConnConfig::mss_for_mtu(1500, false), 1460);
    assert_eq!(ConnConfig::mss_for_mtu(1500, true), 1440);
    let v6 = IpEndpoint::new(
        IpAddress::Ipv6(smoltcp::wire::Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
        80,
    );
    let me6 = IpEndpoint::new(
        IpAddress::Ipv6(smoltcp::wire::Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
        4000,
    );
    let mut c = Connection::connect(cfg(), me6, v6, Seq(ISS), Instant::from_secs(1)).unwrap();
    let tx = RingTx::new(16);
    let mut sink = VecSink {
        data: Vec::new(),
        cap: 1 << 16,
    };
    let syn = c
        .poll_transmit(Instant::from_secs(1), &tx, &mut sink)
        .unwrap();
    assert_eq!(syn.repr.max_seg_size, Some(1440));
    let t = T::open(cfg());
    assert_eq!(t.c.info().snd_mss, 1448);
    assert!(ConnConfig { mtu: 100, ..cfg() }.validate().is_err());
}

#[test]
fn rfc2018_3_data_segments_with_sack_blocks_fit_the_mtu() {
    // Out-of-order data from the peer: every segment we send carries up to three SACK
    // blocks; with timestamps, payload + options must stay within the 1460-byte MSS.
    let mut t = T::open(cfg());
    for i in 0..3u32 {
        t.data_at(1000 + i * 200, &[1; 100]);
    }
    t.out();
    let data: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
    t.tx.write(&data);
    let out = t.out();
    assert!(out.iter().any(|s| s.payload_len > 0));
    for s in &out {
        assert!(s.repr.sack_ranges[2].is_some(), "three SACK blocks");
        assert!(s.buffer_len() <= 1480, "{} bytes of TCP", s.buffer_len());
    }
    // A retransmission keeps its original (full) size and drops SACK blocks instead.
    t.wait(Duration::from_secs(2));
    let out = t.out();
    let r = out
        .iter()
        .find(|s| s.payload_len > 0)
        .expect("RTO retransmission");
    assert!(r.buffer_len() <= 1480, "{} bytes of TCP", r.buffer_len());
}

#[test]
fn rfc6298_3_sub_millisecond_rtt_sampled_in_microseconds() {
    // A 100 µs path: every ACK covers one never-retransmitted segment, timed from its send
    // time; the echoed timestamps (whole ms) would read 0.
    let mut t = T::open_after(cfg(), 1 << 20, Duration::from_micros(100));
    let data = vec![7u8; 10 * 1448];
    t.tx.write(&data);
    let out = t.out();
    assert_eq!(out.len(), 10);
    t.wait(Duration::from_micros(100));
    for s in &out {
        let end = Seq::from(s.repr.seq_number).wrapping_add(s.payload_len as u32);
        t.ack(end);
    }
    let info = t.c.info();
    assert_eq!(info.min_rtt, Some(Duration::from_micros(100)), "{info:?}");
    let srtt = info.srtt.unwrap();
    assert!(
        srtt >= Duration::from_micros(100) && srtt < Duration::from_millis(1),
        "{srtt}"
    );
}

#[test]
fn rfc8985_7_2_pto_one_segment_in_flight_adds_peer_max_ack_delay() {
    // SRTT 10 ms; one segment in flight: PTO = 2·SRTT + the peer's 200 ms delayed ACK,
    // capped by the RTO (200 ms floor), not 2·SRTT + our own 40 ms ACK delay.
    let mut t = T::open_after(cfg(), 1 << 20, Duration::from_millis(10));
    t.tx.write(&[1; 100]);
    assert_eq!(t.out().len(), 1);
    assert_eq!(t.c.poll_at(), Some(t.now + Duration::from_millis(200)));
    let c = ConnConfig {
        peer_max_ack_delay: Duration::from_millis(5),
        ..cfg()
    };
    let mut t = T::open_after(c, 1 << 20, Duration::from_millis(10));
    t.tx.write(&[1; 100]);
    assert_eq!(t.out().len(), 1);
    assert_eq!(t.c.poll_at(), Some(t.now + Duration::from_millis(25)));
}

#[test]
fn rfc9293_3_10_5_abort_in_time_wait_just_deletes() {
    let mut t = T::open(cfg());
    t.c.close();
    assert_eq!(t.out()[0].repr.control, TcpControl::Fin);
    t.ack(Seq(ISS + 2));
    let r = t.repr(t.pseq, TcpControl::Fin);
    t.feed(r, &[]);
    assert_eq!(t.c.state(), State::TimeWait);
    t.out();
    t.c.abort();
    assert_eq!(t.c.state(), State::Closed);
    assert!(t.out().is_empty(), "no RST from TIME-WAIT");
}

#[test]
fn rfc9293_3_8_6_1_unanswered_zero_window_probes_time_out() {
    let c = ConnConfig {
        max_rto_retries: 3,
        ..cfg()
    };
    let mut t = T::open(c);
    t.pwin = 0;
    t.ack(Seq(ISS + 1));
    t.tx.write(&[1; 100]);
    assert!(t.out().is_empty());
    let mut probes = 0;
    for _ in 0..20 {
        let Some(p) = t.c.poll_at() else { break };
        t.now = p;
        probes += t.out().len();
        if t.c.state() == State::Closed {
            break;
        }
    }
    assert_eq!(probes, 3);
    assert_eq!(t.c.error(), Some(ConnError::TimedOut));
}

#[test]
fn rfc7323_5_5_ts_recent_older_than_24_days_is_invalid() {
    let mut t = T::open(cfg());
    t.ts = Some(500);
    t.data_at(0, b"abcd");
    t.pseq = t.pseq.wrapping_add(4);
    // Idle for 25 days: the peer's TSval looks older, but TS.Recent has expired.
    t.wait(Duration::from_secs(25 * 24 * 3600));
    t.ts = Some(400);
    let o = t.data_at(0, b"efgh");
    assert!(!o.dropped, "PAWS must not drop after 24 days idle");
    assert_eq!(t.sink.data, b"abcdefgh");
    let out = t.out();
    assert_eq!(out.last().unwrap().repr.timestamp.unwrap().tsecr, 400);
}

// ------------------------------------------- record (FPDU) alignment, docs/mpa.md §1.10

/// Every data segment of `segs` starts and ends on a record boundary (`ends`: record ends
/// as offsets from the stream's first byte; `una_off`: the stream offset of SND.UNA).
fn assert_whole_records(segs: &[Segment], ends: &[u64], una_off: u64) {
    for s in segs.iter().filter(|s| s.payload_len > 0) {
        let start = una_off + s.payload_offset;
        let end = start + s.payload_len as u64;
        assert!(
            (start == 0 || ends.contains(&start)) && ends.contains(&end),
            "segment [{start}, {end}) is not whole records of {ends:?}"
        );
    }
}

#[test]
fn rfc5044_8_small_records_share_a_segment_whole() {
    let mut t = T::open(cfg());
    let mut ends = Vec::new();
    let mut at = 0;
    for l in [60u64, 700, 600, 200, 1448, 8] {
        assert!(t.tx.push_record(&vec![l as u8; l as usize]));
        at += l;
        ends.push(at);
    }
    let out = t.out();
    assert_whole_records(&out, &ends, 0);
    let lens: Vec<usize> = out
        .iter()
        .map(|s| s.payload_len)
        .filter(|&l| l > 0)
        .collect();
    assert_eq!(lens, [1360, 200, 1448, 8]);
}

#[test]
fn rfc5044_8_a_record_waits_for_a_window_that_holds_it_whole() {
    let mut t = T::open(cfg());
    // The peer's window: 11 << 7 = 1408 bytes.
    t.pwin = 11;
    t.ack(Seq(ISS + 1));
    for b in [1u8, 2, 3] {
        assert!(t.tx.push_record(&[b; 1000]));
    }
    let out = t.out();
    let lens: Vec<usize> = out
        .iter()
        .map(|s| s.payload_len)
        .filter(|&l| l > 0)
        .collect();
    // 408 bytes of window are left after the first record: no partial record.
    assert_eq!(lens, [1000]);
    t.ack(Seq(ISS + 1001));
    let out = t.out();
    assert_whole_records(&out, &[1000, 2000, 3000], 1000);
    assert_eq!(out.iter().map(|s| s.payload_len).sum::<usize>(), 1000);
    // A zero window with nothing in flight: only the persist probe (no payload), and the
    // record goes out whole once the window opens.
    t.pwin = 0;
    t.ack(Seq(ISS + 2001));
    assert!(t.out().iter().all(|s| s.payload_len == 0));
    let at = t.c.poll_at().expect("persist timer");
    t.now = at;
    let probes = t.out();
    assert_eq!(probes.len(), 1, "one persist probe");
    assert_eq!(probes[0].payload_len, 0);
    // The window opens to less than the record: still waiting, persist armed again.
    t.pwin = 5;
    t.ack(Seq(ISS + 2001));
    assert!(t.out().iter().all(|s| s.payload_len == 0));
    assert!(
        t.c.poll_at().is_some(),
        "a timer keeps the wait from deadlocking"
    );
    t.pwin = 11;
    t.ack(Seq(ISS + 2001));
    let out = t.out();
    assert_whole_records(&out, &[1000, 2000, 3000], 2000);
    assert_eq!(out.iter().map(|s| s.payload_len).sum::<usize>(), 1000);
}

#[test]
fn rfc5044_8_bytes_after_the_last_record_end_wait_for_it() {
    let mut t = T::open(cfg());
    assert_eq!(t.tx.write(&[1; 100]), 100);
    t.tx.mark_record_end(60);
    let out = t.out();
    let lens: Vec<usize> = out
        .iter()
        .map(|s| s.payload_len)
        .filter(|&l| l > 0)
        .collect();
    assert_eq!(lens, [60], "the unfinished record waits");
    assert_eq!(t.tx.write(&[2; 20]), 20);
    t.tx.mark_record_end(120);
    let out = t.out();
    assert_whole_records(&out, &[60, 120], 0);
    assert_eq!(out.iter().map(|s| s.payload_len).sum::<usize>(), 60);
}

#[test]
fn rfc5044_8_sack_blocks_give_way_to_a_whole_record() {
    let mut t = T::open(cfg());
    // Out-of-order data from the peer: our segments owe it a SACK block.
    t.data_at(1000, &[9; 100]);
    t.out();
    // A record of the full MSS (1448 with timestamps) does not fit beside the block.
    assert!(t.tx.push_record(&[1; 1448]));
    assert!(t.tx.push_record(&[2; 1448]));
    let out = t.out();
    let data: Vec<&Segment> = out.iter().filter(|s| s.payload_len > 0).collect();
    assert_eq!(data.len(), 2);
    assert_whole_records(&out, &[1448, 2896], 0);
    for s in data {
        let opts = s.repr.header_len() - 20;
        assert!(s.payload_len + opts <= 1460, "{} + {opts}", s.payload_len);
    }
}

#[test]
fn rfc5044_8_retransmissions_keep_record_alignment() {
    let mut t = T::open(cfg());
    let lens = [100usize, 1448, 60, 1448, 200, 1448];
    let mut ends = Vec::new();
    let mut at = 0u64;
    for (i, l) in lens.iter().enumerate() {
        assert!(t.tx.push_record(&vec![i as u8; *l]));
        at += *l as u64;
        ends.push(at);
    }
    let out = t.out();
    assert_whole_records(&out, &ends, 0);
    assert_eq!(out.iter().filter(|s| s.payload_len > 0).count(), lens.len());
    // Nothing is acknowledged: the probe (TLP) and then RTOs retransmit, every segment
    // still exactly one record.
    let mut resent = 0;
    while t.c.info().rto_count < 2 {
        let d = t.c.poll_at().unwrap();
        t.now = d;
        let out = t.out();
        assert_whole_records(&out, &ends, 0);
        resent += out.iter().filter(|s| s.payload_len > 0).count();
    }
    assert!(resent >= 2, "{resent}");
    // The peer got the first two records and the fourth (SACK): what is resent is still
    // whole records.
    let una = 100 + 1448;
    t.sack[0] = Some((
        ISS + 1 + (una + 60) as u32,
        ISS + 1 + (una + 60 + 1448) as u32,
    ));
    t.ack(Seq(ISS + 1 + una as u32));
    let mut out = t.out();
    for _ in 0..4 {
        let d = t.c.poll_at().unwrap();
        t.now = d;
        out.extend(t.out());
    }
    assert_whole_records(&out, &ends, una as u64);
    assert!(
        out.iter().any(|s| s.payload_len == 60),
        "the lost record is resent"
    );
}
