//! Unit tests of `rescue.rs`: ACK replay frames, FIN splitting, the duplicate-ACK guard
//! and the flow table's bounds.

use super::*;
use smoltcp::wire::{
    EthernetAddress, EthernetRepr, IpAddress, Ipv4Repr, TcpControl, TcpRepr, TcpSeqNumber,
};
use std::net::Ipv4Addr;
use std::time::Duration;

/// A watch tracking the test flow (10.0.0.2:80 -> 10.0.0.1:5000).
fn watched() -> AckWatch {
    let mut w = AckWatch::default();
    w.track(
        &(Ipv4Addr::new(10, 0, 0, 2), 80, 5000),
        false,
        Instant::now(),
    );
    w
}

fn ack_frame(ack: i32, window: u16, payload: &[u8]) -> Vec<u8> {
    segment(true, TcpControl::None, 100, ack, window, payload)
}

/// A TCP header (no options) from `ports.0` to `ports.1`, acknowledging `ack`.
fn tcp_repr(
    ports: (u16, u16),
    control: TcpControl,
    seq: i32,
    ack: i32,
    window: u16,
    payload: &[u8],
) -> TcpRepr<'_> {
    TcpRepr {
        src_port: ports.0,
        dst_port: ports.1,
        control,
        seq_number: TcpSeqNumber(seq),
        ack_number: Some(TcpSeqNumber(ack)),
        window_len: window,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None, None, None],
        timestamp: None,
        payload,
    }
}

/// A TCP segment between the peer (10.0.0.2:80) and us (10.0.0.1:5000), in the
/// direction `from_peer` says.
fn segment(
    from_peer: bool,
    control: TcpControl,
    seq: i32,
    ack: i32,
    window: u16,
    payload: &[u8],
) -> Vec<u8> {
    let (peer, us) = (Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 1));
    let (src, dst, src_port, dst_port) = if from_peer {
        (peer, us, 80, 5000)
    } else {
        (us, peer, 5000, 80)
    };
    let tcp = tcp_repr((src_port, dst_port), control, seq, ack, window, payload);
    let ip = Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Tcp,
        payload_len: tcp.buffer_len(),
        hop_limit: 64,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
        dst_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
        ethertype: EthernetProtocol::Ipv4,
    };
    let mut buf = vec![0u8; 14 + 20 + tcp.buffer_len()];
    let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
    eth.emit(&mut f);
    let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
    ip.emit(&mut p, &smoltcp::phy::ChecksumCapabilities::default());
    let mut t = TcpPacket::new_unchecked(p.payload_mut());
    tcp.emit(
        &mut t,
        &IpAddress::Ipv4(src),
        &IpAddress::Ipv4(dst),
        &smoltcp::phy::ChecksumCapabilities::default(),
    );
    buf
}

/// Recompute the IPv4 and TCP checksums of a frame built by [`ack_frame`].
fn refill_checksums(frame: &mut [u8]) {
    let mut eth = EthernetFrame::new_checked(frame).unwrap();
    let mut ip = Ipv4Packet::new_checked(eth.payload_mut()).unwrap();
    ip.fill_checksum();
    let (src, dst) = (
        IpAddress::Ipv4(ip.src_addr()),
        IpAddress::Ipv4(ip.dst_addr()),
    );
    TcpPacket::new_checked(ip.payload_mut())
        .unwrap()
        .fill_checksum(&src, &dst);
}

/// The FIN of a data+FIN segment goes to smoltcp only as a separate segment after the
/// data, so smoltcp's "hole before the FIN" check also covers a tail it trimmed to its
/// receive window (see [`split_fin`]).
#[test]
fn rfc9293_fin_is_processed_only_after_the_data_before_it() {
    let payload: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
    let frame = segment(true, TcpControl::Fin, 5000, 77, 900, &payload);
    let p = parse(&frame).unwrap();
    let caps = ChecksumCapabilities::default();
    let (data, fin) = split_fin(&frame, &p, &caps).expect("split");
    let (dip, dtcp) = ipv4_tcp(&data).unwrap();
    let (src, dst) = (
        IpAddress::Ipv4(dip.src_addr()),
        IpAddress::Ipv4(dip.dst_addr()),
    );
    assert!(dip.verify_checksum() && dtcp.verify_checksum(&src, &dst));
    assert!(!dtcp.fin() && dtcp.ack() && dtcp.payload() == &payload[..]);
    assert_eq!(dtcp.seq_number().0, 5000);
    let (fip, ftcp) = ipv4_tcp(&fin).unwrap();
    assert!(fip.verify_checksum() && ftcp.verify_checksum(&src, &dst));
    assert!(ftcp.fin() && ftcp.ack() && ftcp.payload().is_empty());
    assert_eq!(ftcp.seq_number().0, 5300);
    assert_eq!((ftcp.ack_number().0, ftcp.window_len()), (77, 900));
    assert_eq!(usize::from(fip.total_len()), 20 + 20);

    // Through the receive token: smoltcp gets the data now, the FIN queued behind it.
    let mut w = AckWatch::default();
    let tok = WatchedRx {
        inner: ReplayRx(frame.clone()),
        watch: &mut w,
        now: Instant::now(),
    };
    let seen = tok.consume(|f| f.to_vec());
    assert_eq!(seen, data);
    assert_eq!(w.split_fins.iter().collect::<Vec<_>>(), vec![&fin]);
    assert_eq!(w.fins_split, 1);

    // A FIN without data, or data without FIN, is left alone.
    for (control, body) in [(TcpControl::Fin, &[][..]), (TcpControl::None, &payload[..])] {
        let f = segment(true, control, 5000, 77, 900, body);
        let mut w = AckWatch::default();
        let tok = WatchedRx {
            inner: ReplayRx(f.clone()),
            watch: &mut w,
            now: Instant::now(),
        };
        assert_eq!(tok.consume(|x| x.to_vec()), f);
        assert!(w.split_fins.is_empty());
    }
}

/// A data+FIN segment whose checksum fails stays as it is (smoltcp drops it), so the
/// split cannot turn a corrupted header into a valid FIN; every single-bit flip in the
/// IPv4/TCP headers and payload is tried. With the checksums offloaded the split runs.
#[test]
fn rfc9293_corrupted_data_and_fin_segment_is_not_split() {
    let frame = segment(true, TcpControl::Fin, 5000, 77, 900, b"tail bytes");
    let caps = ChecksumCapabilities::default();
    for bit in 14 * 8..frame.len() * 8 {
        let mut bad = frame.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        if let Some(p) = parse(&bad) {
            if p.tcp.fin() && !p.tcp.payload().is_empty() {
                assert!(split_fin(&bad, &p, &caps).is_none(), "bit {bit} was split");
            }
        }
    }
    let mut trusted = ChecksumCapabilities::ignored();
    trusted.ipv4 = smoltcp::phy::Checksum::None;
    let p = parse(&frame).unwrap();
    assert!(split_fin(&frame, &p, &trusted).is_some());
}

#[test]
fn rfc9293_ipv6_data_and_fin_segment_is_split_too() {
    use smoltcp::wire::{Ipv6Address, Ipv6Repr};
    let (src, dst) = (
        Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
        Ipv6Address::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
    );
    let payload = b"the last bytes";
    let tcp = tcp_repr((80, 5000), TcpControl::Fin, 9000, 42, 512, payload);
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Tcp,
        payload_len: tcp.buffer_len(),
        hop_limit: 64,
    };
    let mut frame = vec![0u8; 14 + 40 + tcp.buffer_len()];
    let mut f = EthernetFrame::new_unchecked(&mut frame[..]);
    EthernetRepr {
        src_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
        dst_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
        ethertype: EthernetProtocol::Ipv6,
    }
    .emit(&mut f);
    let mut p = Ipv6Packet::new_unchecked(f.payload_mut());
    ip.emit(&mut p);
    let caps = ChecksumCapabilities::default();
    let (s6, d6) = (IpAddress::Ipv6(src), IpAddress::Ipv6(dst));
    tcp.emit(
        &mut TcpPacket::new_unchecked(p.payload_mut()),
        &s6,
        &d6,
        &caps,
    );
    let (data, fin) = split_fin_ipv6(&frame, &caps).expect("split");
    let dt = ipv6_tcp(&data).unwrap();
    assert!(dt.verify_checksum(&s6, &d6) && !dt.fin() && dt.payload() == payload);
    let ft = ipv6_tcp(&fin).unwrap();
    assert!(ft.verify_checksum(&s6, &d6) && ft.fin() && ft.payload().is_empty());
    assert_eq!(ft.seq_number().0, 9000 + payload.len() as i32);
    // A corrupted one is left alone.
    let mut bad = frame.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x10;
    assert!(split_fin_ipv6(&bad, &caps).is_none());
}

#[test]
fn rfc1624_incremental_checksum_matches_a_full_recompute() {
    let mut frame = segment(true, TcpControl::Fin, 1, 2, 3, b"abcdefg");
    let p = parse(&frame).unwrap();
    let (data, _) = split_fin(&frame, &p, &ChecksumCapabilities::default()).unwrap();
    // Clear FIN by hand and recompute from scratch: the same bytes.
    frame[14 + 20 + 13] &= !1;
    refill_checksums(&mut frame);
    assert_eq!(data, frame);
}

/// The regression of the stall in tests/net_lossy.rs: a pure ACK whose ACK number had
/// bit 13 flipped on the wire became the template, its replay carried a fresh checksum,
/// and smoltcp took it as an acknowledgement of 8192 bytes the peer never received.
/// Every single-bit flip in the IPv4 and TCP headers of a pure ACK must leave the
/// template (and the set of flows) untouched.
#[test]
fn rfc9293_segment_with_bad_checksum_never_becomes_a_replayed_ack() {
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let floor = Duration::from_millis(10);
    let genuine = ack_frame(1000, 500, &[]);
    let newer = ack_frame(1000 + 1460, 500, &[]);
    let expect = nudge_window(&genuine).unwrap();
    let mut accepted_changes = 0;
    for bit in 14 * 8..newer.len() * 8 {
        let mut bad = newer.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        let t0 = Instant::now();
        let mut w = watched();
        w.observe(&genuine, t0);
        w.observe(&bad, t0);
        assert_eq!(w.flows.len(), 1, "bit {bit}: a corrupted frame made a flow");
        let mut out = VecDeque::new();
        assert!(w.rescue(&key, t0 + floor, floor, &mut out), "bit {bit}");
        assert_eq!(out.len(), 4);
        for f in &out {
            if f != &expect {
                accepted_changes += 1;
            }
        }
    }
    assert_eq!(accepted_changes, 0, "corrupted templates were replayed");
    // The same ACK intact does become the template.
    let t0 = Instant::now();
    let mut w = watched();
    w.observe(&genuine, t0);
    w.observe(&newer, t0);
    let mut out = VecDeque::new();
    assert!(w.rescue(&key, t0 + floor, floor, &mut out));
    assert_eq!(out[0], nudge_window(&newer).unwrap());
}

#[test]
fn offloaded_checksums_are_not_required_of_templates() {
    // A device that verified checksums itself (smoltcp told not to): a frame whose
    // checksum fields are not filled in is still a template, and the replay carries a
    // correct TCP checksum.
    let mut frame = ack_frame(1000, 500, &[]);
    frame[14 + 20 + 16] = 0;
    frame[14 + 20 + 17] = 0;
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let floor = Duration::from_millis(10);
    let t0 = Instant::now();
    let mut strict = watched();
    strict.observe(&frame, t0);
    let mut out = VecDeque::new();
    assert!(!strict.rescue(&key, t0 + floor, floor, &mut out));
    let mut w = AckWatch {
        checksums: ChecksumCapabilities::ignored(),
        ..AckWatch::default()
    };
    w.track(&key, false, t0);
    w.observe(&frame, t0);
    assert!(w.rescue(&key, t0 + floor, floor, &mut out));
    assert_eq!(out.len(), 4);
    assert!(checksums_valid(
        &parse(&out[0]).unwrap(),
        &ChecksumCapabilities::default()
    ));
}

#[test]
fn only_a_bare_syn_to_a_full_port_is_recognised() {
    let mut syn = ack_frame(0, 500, &[]);
    // Turn the ACK into a bare SYN: flags byte of the TCP header (offset 13).
    let flags = 14 + 20 + 13;
    syn[flags] = 0x02;
    assert!(is_syn_to(&syn, &[5000]));
    assert!(!is_syn_to(&syn, &[5001]));
    assert!(!is_syn_to(&syn, &[]));
    syn[flags] = 0x12; // SYN-ACK: a reply to our own connect
    assert!(!is_syn_to(&syn, &[5000]));
    assert!(!is_syn_to(&ack_frame(1000, 500, &[]), &[5000]));
    assert!(
        !is_syn_to(&syn[..20], &[5000]),
        "truncated frames are not SYNs"
    );
}

#[test]
fn stalled_flow_gets_one_window_update_and_three_duplicate_acks() {
    let mut w = watched();
    let t0 = Instant::now();
    w.observe(&ack_frame(1000, 500, &[]), t0);
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let floor = Duration::from_millis(10);
    let mut out = VecDeque::new();
    assert!(!w.rescue(&key, t0 + Duration::from_millis(5), floor, &mut out));
    assert!(w.rescue(&key, t0 + Duration::from_millis(11), floor, &mut out));
    assert_eq!(out.len(), 4);
    for f in &out {
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!(tcp.window_len(), 499);
        assert_eq!(tcp.ack_number(), TcpSeqNumber(1000));
        assert!(tcp.verify_checksum(
            &IpAddress::Ipv4(ip.src_addr()),
            &IpAddress::Ipv4(ip.dst_addr())
        ));
    }
    // Not again within the floor; again after it.
    assert!(!w.rescue(&key, t0 + Duration::from_millis(15), floor, &mut out));
    assert!(w.rescue(&key, t0 + Duration::from_millis(22), floor, &mut out));
    // ACK progress (also carried by a data segment) restarts the clock.
    w.observe(
        &ack_frame(2000, 500, b"data"),
        t0 + Duration::from_millis(30),
    );
    assert!(!w.rescue(&key, t0 + Duration::from_millis(35), floor, &mut out));
}

#[test]
fn template_follows_ack_and_window_changes_of_pure_acks() {
    let mut w = watched();
    let t0 = Instant::now();
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let floor = Duration::from_millis(10);
    // A zero window, then a window update with the same ACK number: the update is
    // the template (a zero-window template would not be replayed).
    w.observe(&ack_frame(1000, 0, &[]), t0);
    w.observe(&ack_frame(1000, 300, &[]), t0);
    // Repeats of the same frame (the cached fast path) change nothing.
    w.observe(&ack_frame(1000, 300, b"xy"), t0);
    w.observe(&ack_frame(1000, 300, b"xy"), t0);
    let mut out = VecDeque::new();
    assert!(w.rescue(&key, t0 + floor, floor, &mut out));
    let check = |f: &Vec<u8>, ack: i32, window: u16| {
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!(tcp.ack_number(), TcpSeqNumber(ack));
        assert_eq!(tcp.window_len(), window);
    };
    check(&out[0], 1000, 299);
    // Data carrying a newer ACK restarts the clock but does not become the template;
    // a pure ACK with the new ACK number replaces it; one on another flow does not
    // disturb this flow.
    out.clear();
    w.observe(&ack_frame(1500, 700, b"xy"), t0 + floor);
    w.observe(&ack_frame(1500, 700, &[]), t0 + floor);
    let mut other = ack_frame(9000, 100, &[]);
    other[14 + 20 + 1] ^= 1; // another source port
    refill_checksums(&mut other);
    w.track(&(Ipv4Addr::new(10, 0, 0, 2), 81, 5000), false, t0);
    w.observe(&other, t0 + floor);
    assert_eq!(w.flows.len(), 2);
    w.observe(&ack_frame(1500, 700, &[]), t0 + floor);
    assert!(w.rescue(&key, t0 + 3 * floor, floor, &mut out));
    check(&out[0], 1500, 699);
    // Forgetting drops the flow (and the cached entry).
    w.forget(&key);
    out.clear();
    assert!(!w.rescue(&key, t0 + 10 * floor, floor, &mut out));
    w.observe(&ack_frame(1500, 700, b"xy"), t0);
    assert!(!w.rescue(&key, t0 + 10 * floor, floor, &mut out));
}

#[test]
fn flow_keys_pack_without_collisions() {
    let a = pack(&(Ipv4Addr::new(10, 0, 0, 2), 80, 5000));
    let b = pack(&(Ipv4Addr::new(10, 0, 0, 2), 5000, 80));
    let c = pack(&(Ipv4Addr::new(10, 0, 0, 3), 80, 5000));
    assert!(a != b && a != c && b != c);
    let state = std::collections::hash_map::RandomState::new();
    let hash = |k: u64| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = state.build_hasher();
        h.write_u64(k);
        h.finish()
    };
    // Peers differing only in their port land in different low bits (bucket index).
    let lows: std::collections::HashSet<u64> = (0..64u16)
        .map(|p| hash(pack(&(Ipv4Addr::new(10, 0, 0, 2), 40000 + p, 80))) & 0xff)
        .collect();
    assert!(lows.len() > 32, "{} distinct buckets of 64", lows.len());
}

/// smoltcp 0.14 workaround (see `AckWatch::is_dup_ack_behind_fin`): once our FIN is
/// out, repeats of the peer's ACK of everything before it are withheld; the first such
/// ACK, a window update, an ACK with data and the ACK of the FIN itself all pass.
#[test]
fn rfc5681_duplicate_acks_behind_a_lone_fin_are_withheld() {
    let mut w = watched();
    let now = Instant::now();
    // Before our FIN nothing is withheld: duplicate ACKs drive fast retransmit.
    let dup = ack_frame(1000, 500, &[]);
    w.observe(&dup, now);
    assert!(!w.is_dup_ack_behind_fin(&dup));
    // We send the last 100 bytes with the FIN: the FIN has sequence number 1000.
    w.observe_tx(&segment(false, TcpControl::Fin, 900, 100, 600, &[7; 100]));
    // The peer acknowledged up to 1000 already (above), so a repeat is withheld...
    assert!(w.is_dup_ack_behind_fin(&ack_frame(1000, 500, &[])));
    // ...but not a window update, an ACK carrying data, or an older ACK number.
    assert!(!w.is_dup_ack_behind_fin(&ack_frame(1000, 600, &[])));
    assert!(!w.is_dup_ack_behind_fin(&ack_frame(1000, 500, &[1, 2, 3])));
    assert!(!w.is_dup_ack_behind_fin(&ack_frame(990, 500, &[])));
    // The ACK of the FIN passes and ends the guard for this flow.
    assert!(!w.is_dup_ack_behind_fin(&ack_frame(1001, 500, &[])));
    assert!(!w.is_dup_ack_behind_fin(&ack_frame(1000, 500, &[])));
    // Another flow's FIN guards only that flow, and forgetting the flow drops it.
    w.observe_tx(&segment(false, TcpControl::Fin, 900, 100, 600, &[7; 100]));
    assert!(w.is_dup_ack_behind_fin(&ack_frame(1000, 500, &[])));
    w.forget(&(Ipv4Addr::new(10, 0, 0, 2), 80, 5000));
    assert!(!w.is_dup_ack_behind_fin(&ack_frame(1000, 500, &[])));
}

/// A pure ACK with valid checksums from `src`:`src_port` to 10.0.0.1:`dst_port`.
fn spoofed_ack(src: Ipv4Addr, src_port: u16, dst_port: u16, ack: i32) -> Vec<u8> {
    let mut f = ack_frame(ack, 500, &[]);
    f[14 + 12..14 + 16].copy_from_slice(&src.octets());
    f[14 + 20..14 + 22].copy_from_slice(&src_port.to_be_bytes());
    f[14 + 22..14 + 24].copy_from_slice(&dst_port.to_be_bytes());
    refill_checksums(&mut f);
    f
}

/// issue 14 item 1: 100,000 spoofed pure ACKs (valid checksums, random source
/// addresses and ports, to any local port) create no flow and store no frame but the
/// one reused slot; the tracked connection's rescue still works; our FIN on a flow we
/// do not track is not remembered either.
#[test]
fn hostile_spoofed_ack_flood_creates_no_flow() {
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let floor = Duration::from_millis(10);
    let t0 = Instant::now();
    let mut w = watched();
    w.observe(&ack_frame(1000, 500, &[]), t0);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let src = Ipv4Addr::from((x >> 32) as u32);
        let f = spoofed_ack(src, x as u16, (x >> 16) as u16, i);
        assert!(checksums_valid(
            &parse(&f).unwrap(),
            &ChecksumCapabilities::default()
        ));
        w.observe(&f, t0);
        w.observe_tx(&segment(false, TcpControl::Fin, 1, 1, 1, &[]));
    }
    assert_eq!(w.tracked(), 1, "only the connection's flow is tracked");
    assert!(w.fins.len() <= 1);
    let mut out = VecDeque::new();
    assert!(w.rescue(&key, t0 + floor, floor, &mut out));
    assert_eq!(out[0], nudge_window(&ack_frame(1000, 500, &[])).unwrap());
    // Nothing for an untracked flow.
    let mut w = AckWatch::default();
    w.observe(&ack_frame(1000, 500, &[]), t0);
    w.observe_tx(&segment(false, TcpControl::Fin, 900, 100, 600, &[7; 100]));
    assert_eq!((w.tracked(), w.fins.len()), (0, 0));
    assert!(!w.rescue(&key, t0 + floor, floor, &mut out));
}

/// The final ACK of a passive handshake, seen before its connection is promoted,
/// becomes that flow's first template; an active open adopts nothing.
#[test]
fn handshake_ack_seen_before_promotion_becomes_the_template() {
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let floor = Duration::from_millis(10);
    let t0 = Instant::now();
    let mut out = VecDeque::new();
    let mut w = AckWatch::default();
    w.observe(&ack_frame(1000, 500, &[]), t0);
    w.track(&key, true, t0);
    assert!(w.rescue(&key, t0 + floor, floor, &mut out));
    let mut w = AckWatch::default();
    w.observe(&ack_frame(1000, 500, &[]), t0);
    w.track(&key, false, t0);
    assert!(!w.rescue(&key, t0 + floor, floor, &mut out));
}

/// `max_tracked_flows`: the table never exceeds its bound; tracking one more evicts
/// the flow whose ACK number moved least recently.
#[test]
fn hostile_tracked_flows_are_bounded_and_evict_the_stalest() {
    let t0 = Instant::now();
    let mut w = AckWatch {
        max_flows: 4,
        ..AckWatch::default()
    };
    let peer = Ipv4Addr::new(10, 0, 0, 2);
    for p in 0..4u16 {
        w.track(
            &(peer, 1000 + p, 5000),
            false,
            t0 + Duration::from_millis(u64::from(p)),
        );
    }
    // Flow 1000 makes progress: flow 1001 is now the stalest.
    w.observe(
        &spoofed_ack(peer, 1000, 5000, 77),
        t0 + Duration::from_secs(1),
    );
    for p in 4..7u16 {
        w.track(&(peer, 1000 + p, 5000), false, t0 + Duration::from_secs(2));
        assert!(w.tracked() <= 4);
    }
    assert_eq!((w.tracked(), w.evicted), (4, 3));
    let mut out = VecDeque::new();
    let later = t0 + Duration::from_secs(10);
    assert!(w.rescue(
        &(peer, 1000, 5000),
        later,
        Duration::from_millis(10),
        &mut out
    ));
    assert!(!w.flows.contains_key(&pack(&(peer, 1001, 5000))));
}

#[test]
fn zero_window_is_not_rescued() {
    let mut w = watched();
    let t0 = Instant::now();
    w.observe(&ack_frame(1000, 0, &[]), t0);
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let mut out = VecDeque::new();
    assert!(!w.rescue(
        &key,
        t0 + Duration::from_secs(1),
        Duration::from_millis(10),
        &mut out
    ));
    assert!(out.is_empty());
}

/// RFC 6582 §3.2 step 5 (NewReno partial acknowledgment): once a rescue started a
/// recovery at the highest sequence number sent, an ACK that advances but stays below it
/// gets the next rescue at once instead of after another floor (a burst of lost segments
/// then costs one round trip each, not one floor each); an ACK reaching it ends the
/// recovery, and the floor applies again.
#[test]
fn rfc6582_partial_ack_after_a_rescue_is_rescued_at_once() {
    let mut w = watched();
    let t0 = Instant::now();
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let floor = Duration::from_millis(10);
    let ms = |n: u64| t0 + Duration::from_millis(n);
    // We sent up to 1000 + 10 * 100; the peer acknowledged 1000 and nothing more.
    for i in 0..10 {
        w.observe_tx(&segment(
            false,
            TcpControl::None,
            1000 + i * 100,
            100,
            600,
            &[7; 100],
        ));
    }
    w.observe(&ack_frame(1000, 500, &[]), t0);
    let mut out = VecDeque::new();
    assert!(!w.rescue(&key, ms(5), floor, &mut out));
    assert!(
        w.rescue(&key, ms(10), floor, &mut out),
        "the stall is rescued"
    );
    assert!(!w.partial_pending);
    // The retransmission filled the first hole only: a partial ACK, rescued at once.
    w.observe(&ack_frame(1100, 500, &[]), ms(11));
    assert!(w.partial_pending, "a partial ACK asks for a scan now");
    out.clear();
    assert!(
        w.rescue(&key, ms(11), floor, &mut out),
        "partial ACK rescued at once"
    );
    let eth = EthernetFrame::new_checked(&out[0][..]).unwrap();
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
    assert_eq!(
        tcp.ack_number(),
        TcpSeqNumber(1100),
        "replays the partial ACK"
    );
    // Once only: the same partial ACK waits for the floor again.
    assert!(!w.rescue(&key, ms(12), floor, &mut out));
    // A partial ACK carried by data is no template: it waits for the floor.
    w.observe(&ack_frame(1200, 500, b"xy"), ms(13));
    assert!(!w.rescue(&key, ms(14), floor, &mut out));
    // New data sent during the recovery does not move `recover` (2000).
    w.observe_tx(&segment(false, TcpControl::None, 2000, 100, 600, &[7; 100]));
    w.observe(&ack_frame(1900, 500, &[]), ms(15));
    assert!(
        w.rescue(&key, ms(15), floor, &mut out),
        "still below recover"
    );
    // (The service clears the flag when it scans.)
    w.partial_pending = false;
    // An ACK at `recover` ends the recovery: ACK progress is normal again.
    w.observe(&ack_frame(2000, 500, &[]), ms(16));
    assert!(!w.partial_pending, "an ACK at recover is no partial ACK");
    assert!(!w.rescue(&key, ms(16), floor, &mut out));
    w.observe(&ack_frame(2050, 500, &[]), ms(17));
    assert!(!w.partial_pending, "no recovery: no partial ACK");
    assert!(!w.rescue(&key, ms(18), floor, &mut out));
    assert!(
        w.rescue(&key, ms(27), floor, &mut out),
        "a new stall after the floor"
    );
}

/// Without a rescue first there is no recovery: ACK progress never counts as partial
/// (a normal ACK clock must not trigger fast retransmits).
#[test]
fn ack_progress_without_a_rescue_is_no_partial_ack() {
    let mut w = watched();
    let t0 = Instant::now();
    let key = (Ipv4Addr::new(10, 0, 0, 2), 80, 5000);
    let floor = Duration::from_millis(10);
    w.observe_tx(&segment(
        false,
        TcpControl::None,
        1000,
        100,
        600,
        &[7; 1000],
    ));
    let mut out = VecDeque::new();
    for i in 1..=9 {
        w.observe(&ack_frame(1000 + i * 100, 500, &[]), t0);
        assert!(!w.partial_pending);
        assert!(!w.rescue(&key, t0, floor, &mut out));
    }
}
