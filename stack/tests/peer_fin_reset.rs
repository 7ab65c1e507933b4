//! A peer (a Linux socket) sends its data and FIN, then closes; the application reads
//! slowly. (a) After acknowledging the FIN the engine sends no window updates (Linux does
//! not: the peer has nothing more to send, and a peer whose socket is gone answers each with
//! a RST). (b) A RST arriving while the application still has unread bytes, in its rx ring
//! and in smoltcp's receive buffer, leaves every byte readable, then `ConnectionReset`.

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
    /// Sequence number after the peer's FIN, once sent.
    fin_end: Option<u32>,
    /// The engine acknowledged the FIN.
    fin_acked: bool,
    /// Pure ACKs repeating the FIN's acknowledgement (window updates) after it.
    window_updates: usize,
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
            if t.fin() {
                // The engine's FIN: the peer acknowledges it from now on.
                self.their_next = (t.seq_number().0 as u32)
                    .wrapping_add(t.payload().len() as u32)
                    .wrapping_add(1);
            }
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
            if t.ack() && Some(t.ack_number().0 as u32) == self.fin_end {
                let pure = t.payload().is_empty() && !t.syn() && !t.fin() && !t.rst();
                if self.fin_acked && pure {
                    self.window_updates += 1;
                }
                self.fin_acked = true;
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
        self.queue(control, payload, seq, window_scale);
        self.poll();
    }

    /// A segment for the engine's next poll (the test polls later).
    fn queue(&mut self, control: TcpControl, payload: &[u8], seq: u32, window_scale: Option<u8>) {
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

/// An engine with a small application ring, an accepted connection, and the peer's data
/// sent (the window nearly closed) with its FIN.
fn setup(half_close_first: bool) -> (Peer, Stream, xwarp_stack::ListenSocket, u32) {
    setup_with(half_close_first, false)
}

/// [`setup`]; `rst_behind_fin`: the peer's RST arrives in the same poll as its FIN.
fn setup_with(
    half_close_first: bool,
    rst_behind_fin: bool,
) -> (Peer, Stream, xwarp_stack::ListenSocket, u32) {
    let cfg = StackConfig {
        mac: US_MAC,
        ipv4: Some((US, 24)),
        rx_buffer: 64 << 10,
        tx_buffer: 64 << 10,
        ring_size: 16 << 10,
        timestamps: false,
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
        fin_end: None,
        fin_acked: false,
        window_updates: 0,
    };
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
    peer.send(TcpControl::None, &[], 1000, None);
    let mut stream = listener.try_accept().expect("accepted");
    if half_close_first {
        // The application closes its side first (asyncio's `write_eof`): FIN-WAIT-2, then
        // TIME-WAIT once the peer's FIN is in.
        stream.shutdown_write().unwrap();
        peer.poll();
        assert!(peer.heard.fin, "the engine sent its FIN");
        let seq = peer.next;
        peer.send(TcpControl::None, &[], seq, None);
    }
    // Fill ring and socket buffer (the application reads nothing yet).
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
    assert!(sent > (48 << 10), "only {sent} bytes fit");
    let seq = peer.next;
    peer.fin_end = Some(seq.wrapping_add(1));
    if rst_behind_fin {
        peer.queue(TcpControl::Fin, &[], seq, None);
        peer.queue(TcpControl::Rst, &[], seq.wrapping_add(1), None);
        peer.poll();
        peer.next = seq.wrapping_add(1);
        return (peer, stream, listener, sent);
    }
    peer.send(TcpControl::Fin, &[], seq, None);
    peer.next = seq.wrapping_add(1);
    assert!(peer.fin_acked, "FIN acknowledged");
    (peer, stream, listener, sent)
}

/// Read 2 KiB at a time, polling the engine in between: the bytes until the end of stream
/// (`Ok`) or an error, or `None` at a stall.
fn read_slowly(
    s: &mut Stream,
    peer: &mut Peer,
    got: &mut Vec<u8>,
    max: usize,
) -> Option<io::Result<()>> {
    let mut buf = vec![0u8; 2 << 10];
    let mut idle = 0;
    let start = got.len();
    while idle < 8 && got.len() - start < max {
        match s.try_read(&mut buf) {
            Ok(0) => return Some(Ok(())),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                idle = 0;
                peer.poll();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                peer.poll();
                idle += 1;
            }
            Err(e) => return Some(Err(e)),
        }
    }
    None
}

#[test]
fn no_window_updates_after_the_peers_fin() {
    for half_close_first in [false, true] {
        let (mut peer, mut stream, _l, sent) = setup(half_close_first);
        let mut got = Vec::new();
        let end = read_slowly(&mut stream, &mut peer, &mut got, usize::MAX);
        assert!(matches!(end, Some(Ok(()))), "end of stream: {end:?}");
        let expect: Vec<u8> = (0..sent).map(byte).collect();
        assert!(
            got == expect,
            "stream content ({} of {sent} bytes)",
            got.len()
        );
        assert_eq!(
            peer.window_updates, 0,
            "window updates sent after the FIN was acknowledged (we closed first: \
             {half_close_first})"
        );
    }
}

#[test]
fn a_reset_keeps_the_bytes_already_acknowledged() {
    for half_close_first in [false, true] {
        let (mut peer, mut stream, _l, sent) = setup(half_close_first);
        // A little read: the ring is refilled from the socket, which still holds more.
        let mut got = Vec::new();
        assert!(read_slowly(&mut stream, &mut peer, &mut got, 4 << 10).is_none());
        assert!(
            (sent as usize) - got.len() > (16 << 10) + (8 << 10),
            "bytes left in the ring and the socket buffer: {}",
            sent as usize - got.len()
        );
        // The peer's socket is gone: RST.
        let seq = peer.next;
        peer.send(TcpControl::Rst, &[], seq, None);
        let end = read_slowly(&mut stream, &mut peer, &mut got, usize::MAX);
        let expect: Vec<u8> = (0..sent).map(byte).collect();
        assert_eq!(
            got.len(),
            expect.len(),
            "bytes read before the reset ({half_close_first})"
        );
        assert!(got == expect, "stream content");
        // In TIME-WAIT (we closed first) the stream was complete: a clean end of stream,
        // as before; in CLOSE-WAIT the reset error.
        match end {
            Some(Ok(())) if half_close_first => {}
            Some(Err(e)) if !half_close_first => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionReset)
            }
            other => {
                panic!("after the bytes: {other:?}, expected ConnectionReset ({half_close_first})")
            }
        }
    }
}

#[test]
fn a_reset_right_behind_the_peers_fin_in_time_wait_ends_the_stream_cleanly() {
    // We closed first; the peer's FIN (TIME-WAIT) and its RST arrive in one poll, with
    // bytes still in the ring and the socket buffer: every byte, then a clean end.
    let (mut peer, mut stream, _l, sent) = setup_with(true, true);
    let mut got = Vec::new();
    let end = read_slowly(&mut stream, &mut peer, &mut got, usize::MAX);
    let expect: Vec<u8> = (0..sent).map(byte).collect();
    assert_eq!(got.len(), expect.len(), "bytes read before the end");
    assert!(got == expect, "stream content");
    assert!(matches!(end, Some(Ok(()))), "end of stream: {end:?}");
}
