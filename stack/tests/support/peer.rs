//! The peer side of the hand-driven `TcpService` tests (`fin_trim.rs`, `hostile.rs`,
//! `peer_fin_reset.rs`): frame builders (ARP, IPv4 TCP with valid checksums), the engine
//! setup, and a [`Peer`] that plays one TCP connection against the engine over the
//! [`ScriptedNic`]. Included by `#[path]` after `scripted_nic.rs` (as `mod scripted_nic`);
//! not every test uses every item.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, IpAddress, IpProtocol, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr,
    TcpSeqNumber,
};
use xwarp_poll_driver::engine::Service;
use xwarp_stack::{ListenSocket, StackConfig, StackHandle, TcpService};

use super::scripted_nic::ScriptedNic;

/// The engine's MAC address.
pub const US_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
/// The peer's MAC address.
pub const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
/// The engine's listening port.
pub const PORT: u16 = 80;
/// The peer's port.
pub const PEER_PORT: u16 = 40000;
/// The MSS the peer announces in its SYN, and its largest segment.
pub const MSS: usize = 1460;

/// A test engine's configuration: address `us/prefix`, the given buffer sizes, no TCP
/// timestamps, and every segment acknowledged at once (no delayed ACK).
pub fn config(
    us: Ipv4Addr,
    prefix: u8,
    rx_buffer: usize,
    tx_buffer: usize,
    ring_size: usize,
) -> StackConfig {
    StackConfig {
        mac: US_MAC,
        ipv4: Some((us, prefix)),
        rx_buffer,
        tx_buffer,
        ring_size,
        timestamps: false,
        tcp: xwarp_stack::TcpOptions {
            ack_delay: None,
            ..Default::default()
        },
        ..StackConfig::default()
    }
}

/// An Ethernet frame from the peer of `payload_len` bytes after the header (zeroed), its
/// header written.
fn eth_frame(payload_len: usize, dst: EthernetAddress, ethertype: EthernetProtocol) -> Vec<u8> {
    let mut buf = vec![0u8; 14 + payload_len];
    EthernetRepr {
        src_addr: EthernetAddress(PEER_MAC),
        dst_addr: dst,
        ethertype,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
    buf
}

/// A raw IPv4 TCP frame from `src` to `dst`, valid checksums; a SYN carries [`MSS`].
pub fn tcp_frame(
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    control: TcpControl,
    seq: u32,
    ack: Option<u32>,
    window_scale: Option<u8>,
    payload: &[u8],
) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port: src.1,
        dst_port: dst.1,
        control,
        seq_number: TcpSeqNumber(seq as i32),
        ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
        window_len: 65535,
        window_scale,
        max_seg_size: (control == TcpControl::Syn).then_some(MSS as u16),
        sack_permitted: false,
        sack_ranges: [None, None, None],
        timestamp: None,
        payload,
    };
    let ip = Ipv4Repr {
        src_addr: src.0,
        dst_addr: dst.0,
        next_header: IpProtocol::Tcp,
        payload_len: tcp.buffer_len(),
        hop_limit: 64,
    };
    let mut buf = eth_frame(
        20 + tcp.buffer_len(),
        EthernetAddress(US_MAC),
        EthernetProtocol::Ipv4,
    );
    let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
    let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
    let caps = ChecksumCapabilities::default();
    ip.emit(&mut p, &caps);
    tcp.emit(
        &mut TcpPacket::new_unchecked(p.payload_mut()),
        &IpAddress::Ipv4(src.0),
        &IpAddress::Ipv4(dst.0),
        &caps,
    );
    buf
}

/// A broadcast ARP request from the peer at `src` for `target`.
pub fn arp_request(src: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: EthernetAddress(PEER_MAC),
        source_protocol_addr: src,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    };
    let mut buf = eth_frame(
        arp.buffer_len(),
        EthernetAddress::BROADCAST,
        EthernetProtocol::Arp,
    );
    let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
    arp.emit(&mut ArpPacket::new_unchecked(f.payload_mut()));
    buf
}

/// Poll the engine enough rounds for commands, ingress and egress to settle, then hand
/// every IPv4 TCP segment it sent to `each` (other frames are skipped).
pub fn drive(
    svc: &mut TcpService,
    nic: &mut ScriptedNic,
    mut each: impl FnMut(&Ipv4Packet<&[u8]>, &TcpPacket<&[u8]>),
) {
    // Like the engine's loop, which comes straight back while frames wait (an iteration
    // takes a bounded batch of them): poll until every injected frame was taken, then a
    // few more times for the timers and the answers.
    for _ in 0..100_000 {
        if nic.rx.is_empty() {
            break;
        }
        svc.poll(nic, Instant::now());
    }
    for _ in 0..4 {
        svc.poll(nic, Instant::now());
    }
    for f in std::mem::take(&mut nic.tx) {
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
        each(&ip, &t);
    }
}

/// Listen on `local` with `h` (the call waits for the engine, which `poll` drives on this
/// thread meanwhile).
pub fn listen_driving(
    h: &StackHandle,
    local: SocketAddr,
    backlog: usize,
    mut poll: impl FnMut(),
) -> ListenSocket {
    std::thread::scope(|sc| {
        let t = sc.spawn(|| h.listen(local, backlog, Duration::from_secs(10)).unwrap());
        while !t.is_finished() {
            poll();
        }
        t.join().unwrap()
    })
}

/// The stream byte at offset `i`.
pub fn byte(i: u32) -> u8 {
    (i.wrapping_mul(131) >> 3) as u8
}

/// The peer's view of what the engine last sent on the connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct Heard {
    /// Its last acknowledgement number.
    pub ack: u32,
    /// Its last window, scaled.
    pub win: u32,
    /// It sent a FIN.
    pub fin: bool,
}

/// What a test watches in the engine's segments besides [`Heard`].
pub trait Watch {
    /// Called first for each TCP segment the engine sent; may move the peer's ACK number.
    fn segment(&mut self, t: &TcpPacket<&[u8]>, their_next: &mut u32);
}

impl Watch for () {
    fn segment(&mut self, _t: &TcpPacket<&[u8]>, _their_next: &mut u32) {}
}

/// One TCP connection's peer, from `addr:PEER_PORT` to the engine at `us:PORT`.
pub struct Peer<W: Watch = ()> {
    /// The engine.
    pub svc: TcpService,
    /// Its NIC.
    pub nic: ScriptedNic,
    /// The engine's address.
    pub us: Ipv4Addr,
    /// The peer's address.
    pub addr: Ipv4Addr,
    /// The engine's window shift (from its SYN-ACK).
    pub shift: u8,
    /// The engine's ISN + 1 (our ACK number).
    pub their_next: u32,
    /// Our next sequence number.
    pub next: u32,
    /// What the engine last sent.
    pub heard: Heard,
    /// The test's own watch over the engine's segments.
    pub watch: W,
}

impl<W: Watch> Peer<W> {
    /// A peer of `svc` whose next sequence number is 1000 (ISN 999).
    pub fn new(svc: TcpService, us: Ipv4Addr, addr: Ipv4Addr, watch: W) -> Self {
        Peer {
            svc,
            nic: ScriptedNic::default(),
            us,
            addr,
            shift: 0,
            their_next: 0,
            next: 1000,
            heard: Heard::default(),
            watch,
        }
    }

    /// Poll the engine and take in what it sent.
    pub fn poll(&mut self) {
        let Peer {
            svc,
            nic,
            shift,
            their_next,
            heard,
            watch,
            ..
        } = self;
        drive(svc, nic, |ip, t| {
            watch.segment(t, their_next);
            if t.syn() {
                *their_next = (t.seq_number().0 as u32).wrapping_add(1);
                let repr = TcpRepr::parse(
                    t,
                    &IpAddress::Ipv4(ip.src_addr()),
                    &IpAddress::Ipv4(ip.dst_addr()),
                    &ChecksumCapabilities::default(),
                )
                .unwrap();
                *shift = repr.window_scale.unwrap_or(0);
            }
            if t.ack() {
                *heard = Heard {
                    ack: t.ack_number().0 as u32,
                    win: u32::from(t.window_len()) << *shift,
                    fin: heard.fin || t.fin(),
                };
            }
        });
    }

    /// Send a segment and poll.
    pub fn send(
        &mut self,
        control: TcpControl,
        payload: &[u8],
        seq: u32,
        window_scale: Option<u8>,
    ) {
        self.queue(control, payload, seq, window_scale);
        self.poll();
    }

    /// A segment for the engine's next poll (the test polls later).
    pub fn queue(
        &mut self,
        control: TcpControl,
        payload: &[u8],
        seq: u32,
        window_scale: Option<u8>,
    ) {
        let ack = (control != TcpControl::Syn).then_some(self.their_next);
        let f = tcp_frame(
            (self.addr, PEER_PORT),
            (self.us, PORT),
            control,
            seq,
            ack,
            window_scale,
            payload,
        );
        self.nic.rx.push_back(f);
    }

    /// The peer's ARP request for the engine, then a poll.
    pub fn arp(&mut self) {
        self.nic.rx.push_back(arp_request(self.addr, self.us));
        self.poll();
    }

    /// Listen on `us:PORT` with backlog 8, driving the engine meanwhile.
    pub fn listen(&mut self, h: &StackHandle) -> ListenSocket {
        let local = SocketAddr::from((self.us, PORT));
        listen_driving(h, local, 8, || self.poll())
    }

    /// Right edge of the window the engine last advertised.
    pub fn edge(&self) -> u32 {
        self.heard.ack.wrapping_add(self.heard.win)
    }

    /// Send stream bytes from offset 0 (the application reads nothing) until at most
    /// `MSS / 2` bytes of window are left, checking each is acknowledged; returns how many.
    pub fn fill(&mut self) -> u32 {
        let mut sent = 0u32;
        loop {
            let room = self.edge().wrapping_sub(self.next) as usize;
            if room <= MSS / 2 {
                break;
            }
            let n = MSS.min(room - MSS / 2);
            let data: Vec<u8> = (sent..sent + n as u32).map(byte).collect();
            let seq = self.next;
            self.send(TcpControl::None, &data, seq, None);
            self.next = self.next.wrapping_add(n as u32);
            sent += n as u32;
            assert_eq!(
                self.heard.ack, self.next,
                "every byte is taken while there is room"
            );
        }
        sent
    }
}
