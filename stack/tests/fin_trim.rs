//! Regression: a data+FIN segment that ends past the receive window the engine last
//! advertised must not end the stream early (RFC 9293 §3.10.7.4: a FIN is processed only
//! once every byte before it is in).
//!
//! smoltcp 0.14 trims such a segment to its window and then acts on the FIN anyway. With
//! window scaling the advertised right edge can move *left* (a window rounded down to the
//! scale), so a peer's last segment, sent within the edge it saw earlier, can end past the
//! current one. The test plays the peer with hand-made frames against one `TcpService`
//! driven by hand (no threads, no timing): it fills the connection until the window is
//! small, makes the right edge retreat, sends the last bytes with FIN up to the old edge,
//! and checks that the FIN is not acknowledged, that the application reads every byte, and
//! that the end of stream comes only after the peer retransmitted the trimmed tail.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, IpAddress, IpProtocol, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr,
    TcpSeqNumber,
};
use xwarp_poll_driver::engine::Service;
use xwarp_stack::{new_stack, StackConfig, Stream, TcpService};

#[path = "support/scripted_nic.rs"]
mod scripted_nic;
use scripted_nic::ScriptedNic;

const US_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const US: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 2);
const PORT: u16 = 80;
const PEER_PORT: u16 = 40000;
const MSS: usize = 1460;

/// The peer's view of what the engine last sent on the connection.
#[derive(Debug, Clone, Copy, Default)]
struct Heard {
    ack: u32,
    win: u32,
    fin: bool,
}

struct Peer {
    svc: TcpService,
    nic: ScriptedNic,
    /// The engine's window shift (from its SYN-ACK).
    shift: u8,
    /// The engine's ISN + 1 (our ACK number).
    their_next: u32,
    /// Our next sequence number.
    next: u32,
    heard: Heard,
}

fn eth(frame_payload_len: usize, ethertype: EthernetProtocol) -> (Vec<u8>, EthernetRepr) {
    (
        vec![0u8; 14 + frame_payload_len],
        EthernetRepr {
            src_addr: EthernetAddress(PEER_MAC),
            dst_addr: EthernetAddress(US_MAC),
            ethertype,
        },
    )
}

impl Peer {
    fn poll(&mut self) {
        // Enough rounds for commands, ingress and egress to settle.
        for _ in 0..4 {
            self.svc.poll(&mut self.nic, Instant::now());
        }
        for f in std::mem::take(&mut self.nic.tx) {
            let Ok(e) = EthernetFrame::new_checked(&f[..]) else {
                continue;
            };
            if e.ethertype() != EthernetProtocol::Ipv4 {
                continue;
            }
            let ip = Ipv4Packet::new_checked(e.payload()).unwrap();
            if ip.next_header() != IpProtocol::Tcp {
                continue;
            }
            let t = TcpPacket::new_checked(ip.payload()).unwrap();
            if t.syn() {
                self.their_next = (t.seq_number().0 as u32).wrapping_add(1);
                let repr = TcpRepr::parse(
                    &t,
                    &IpAddress::Ipv4(ip.src_addr()),
                    &IpAddress::Ipv4(ip.dst_addr()),
                    &ChecksumCapabilities::default(),
                )
                .unwrap();
                self.shift = repr.window_scale.unwrap_or(0);
            }
            if t.ack() {
                self.heard = Heard {
                    ack: t.ack_number().0 as u32,
                    win: u32::from(t.window_len()) << self.shift,
                    fin: self.heard.fin || t.fin(),
                };
            }
        }
    }

    fn send(&mut self, control: TcpControl, payload: &[u8], seq: u32, window_scale: Option<u8>) {
        let tcp = TcpRepr {
            src_port: PEER_PORT,
            dst_port: PORT,
            control,
            seq_number: TcpSeqNumber(seq as i32),
            ack_number: (control != TcpControl::Syn)
                .then_some(TcpSeqNumber(self.their_next as i32)),
            window_len: 65535,
            window_scale,
            max_seg_size: (control == TcpControl::Syn).then_some(MSS as u16),
            sack_permitted: false,
            sack_ranges: [None, None, None],
            timestamp: None,
            payload,
        };
        let ip = Ipv4Repr {
            src_addr: PEER,
            dst_addr: US,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let (mut buf, e) = eth(20 + tcp.buffer_len(), EthernetProtocol::Ipv4);
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        e.emit(&mut f);
        let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
        let caps = ChecksumCapabilities::default();
        ip.emit(&mut p, &caps);
        tcp.emit(
            &mut TcpPacket::new_unchecked(p.payload_mut()),
            &IpAddress::Ipv4(PEER),
            &IpAddress::Ipv4(US),
            &caps,
        );
        self.nic.rx.push_back(buf);
        self.poll();
    }

    fn arp(&mut self) {
        let arp = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress(PEER_MAC),
            source_protocol_addr: PEER,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: US,
        };
        let (mut buf, mut e) = eth(arp.buffer_len(), EthernetProtocol::Arp);
        e.dst_addr = EthernetAddress::BROADCAST;
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        e.emit(&mut f);
        arp.emit(&mut ArpPacket::new_unchecked(f.payload_mut()));
        self.nic.rx.push_back(buf);
        self.poll();
    }

    /// Right edge of the window the engine last advertised.
    fn edge(&self) -> u32 {
        self.heard.ack.wrapping_add(self.heard.win)
    }
}

/// The stream byte at offset `i`.
fn byte(i: u32) -> u8 {
    (i.wrapping_mul(131) >> 3) as u8
}

/// Read until the end of stream (`true`) or until nothing more arrives (`false`).
fn read_all(s: &mut Stream, peer: &mut Peer, got: &mut Vec<u8>) -> bool {
    let mut buf = vec![0u8; 64 << 10];
    let mut idle = 0;
    while idle < 4 {
        match s.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                idle = 0;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                peer.poll();
                idle += 1;
            }
            Err(e) => panic!("read: {e}"),
        }
    }
    false
}

#[test]
fn rfc9293_fin_past_a_retreated_window_edge_does_not_end_the_stream_early() {
    let cfg = StackConfig {
        mac: US_MAC,
        ipv4: Some((US, 24)),
        // 1 MiB: window scale 5, so advertised windows are multiples of 32 bytes.
        rx_buffer: 1 << 20,
        tx_buffer: 64 << 10,
        ring_size: 64 << 10,
        timestamps: false,
        // Every segment acknowledged at once: the test reads each window the engine sends.
        tcp: xwarp_stack::TcpOptions {
            ack_delay: None,
            ..Default::default()
        },
        ..StackConfig::default()
    };
    let (svc, h) = new_stack(cfg).unwrap();
    let mut peer = Peer {
        svc,
        nic: ScriptedNic::default(),
        shift: 0,
        their_next: 0,
        next: 1000,
        heard: Heard::default(),
    };
    // Listen (the call waits for the engine, which this thread drives).
    let listener = std::thread::scope(|sc| {
        let t = sc.spawn(|| {
            h.listen(SocketAddr::from((US, PORT)), 8, Duration::from_secs(10))
                .unwrap()
        });
        while !t.is_finished() {
            peer.poll();
        }
        t.join().unwrap()
    });
    peer.arp();
    peer.send(TcpControl::Syn, &[], 999, Some(7));
    assert!(
        peer.shift >= 1,
        "the engine must scale its window (shift {})",
        peer.shift
    );
    peer.send(TcpControl::None, &[], 1000, None);
    let mut stream = listener.try_accept().expect("accepted");

    // Fill the connection (the application reads nothing) until the window is small.
    let mut sent = 0u32;
    loop {
        let room = peer.edge().wrapping_sub(peer.next) as usize;
        if room <= MSS / 2 {
            break;
        }
        let n = MSS.min(room - MSS / 2);
        let data: Vec<u8> = (sent..sent + n as u32).map(byte).collect();
        let seq = peer.next;
        peer.send(TcpControl::None, &data, seq, None);
        peer.next = peer.next.wrapping_add(n as u32);
        sent += n as u32;
        assert_eq!(
            peer.heard.ack, peer.next,
            "every byte is taken while there is room"
        );
    }
    // Make the right edge retreat: small segments until one moves it left.
    let old_edge = peer.edge();
    let mut retreated = false;
    for _ in 0..64 {
        let seq = peer.next;
        peer.send(TcpControl::None, &[byte(sent)], seq, None);
        peer.next = peer.next.wrapping_add(1);
        sent += 1;
        if peer.edge().wrapping_sub(old_edge) as i32 > 0 {
            continue; // moved right (cannot with a full ring, but do not rely on it)
        }
        if peer.edge() != old_edge {
            retreated = true;
            break;
        }
    }
    assert!(retreated, "the window's right edge never moved left");
    let new_edge = peer.edge();
    let tail = old_edge.wrapping_sub(peer.next) as usize;
    assert!(tail > 0 && tail <= MSS, "tail of {tail} bytes");
    let trimmed = old_edge.wrapping_sub(new_edge);

    // The last bytes with FIN, up to the edge advertised before: past the current one.
    let last: Vec<u8> = (sent..sent + tail as u32).map(byte).collect();
    let seq = peer.next;
    peer.send(TcpControl::Fin, &last, seq, None);
    assert!(
        !peer.heard.fin && peer.heard.ack == new_edge,
        "after a data+FIN segment {trimmed} bytes past the window the engine acknowledged {} \
         (FIN would be {}); it must acknowledge up to the window edge {new_edge} only",
        peer.heard.ack,
        seq.wrapping_add(tail as u32).wrapping_add(1)
    );
    // The application reads everything that arrived; the stream has not ended.
    let mut got = Vec::new();
    let ended = read_all(&mut stream, &mut peer, &mut got);
    assert!(
        !ended,
        "end of stream after {} of {} bytes",
        got.len(),
        sent as usize + tail
    );
    // The peer retransmits what was not acknowledged, with its FIN.
    let acked = peer.heard.ack;
    let from = acked.wrapping_sub(seq) as usize;
    peer.send(TcpControl::Fin, &last[from..], acked, None);
    assert!(
        read_all(&mut stream, &mut peer, &mut got),
        "no end of stream after the FIN"
    );
    let expect: Vec<u8> = (0..sent + tail as u32).map(byte).collect();
    assert_eq!(got.len(), expect.len(), "bytes before the end of stream");
    assert!(got == expect, "stream content");
    assert_eq!(
        peer.heard.ack,
        seq.wrapping_add(tail as u32).wrapping_add(1),
        "FIN acknowledged"
    );
}
