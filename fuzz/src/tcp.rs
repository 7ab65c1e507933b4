//! The TCP frame target: raw Ethernet/IPv4/TCP frames into a [`TcpService`] driven by
//! hand through its public API with a scripted NIC (as `stack/tests/fin_trim.rs` does),
//! with a listener and one established connection so segments reach real state: the
//! engine's ingress, the stalled-flow rescue (pure ACKs, replayed templates, clock
//! records past `rto_floor`) and the FIN split of a data+FIN segment past the window.
//!
//! Input: records, each a tag byte then its fields (see [`tcp_frames`]). Segments the
//! script builds get correct checksums (unless a record asks for a corrupted one) and
//! sequence/acknowledgement numbers relative to the established flow, so most of them are
//! accepted; raw-frame records reach the parsers with anything at all.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use smoltcp::phy::{self, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, IpAddress, IpProtocol, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr,
    TcpSeqNumber,
};
use xwarp_poll_driver::backend::{Backend, BackendStats};
use xwarp_poll_driver::engine::Service;
use xwarp_stack::{new_stack, ListenSocket, StackConfig, Stream, TcpService};

use crate::cursor::Cursor;

const US_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const US: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 66, 0, 2);
/// The listening port.
pub const PORT: u16 = 80;
/// The peer's port of the established connection.
pub const PEER_PORT: u16 = 40000;
const MSS: u16 = 1460;

/// A NIC the script drives: frames to deliver, frames sent.
#[derive(Default)]
struct ScriptedNic {
    rx: VecDeque<Vec<u8>>,
    tx: Vec<Vec<u8>>,
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.0.push(buf);
        r
    }
}

impl phy::Device for ScriptedNic {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(
        &mut self,
        _t: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let f = self.rx.pop_front()?;
        Some((Rx(f), Tx(&mut self.tx)))
    }

    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(Tx(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = 1514;
        c.checksum = ChecksumCapabilities::default();
        c
    }
}

impl Backend for ScriptedNic {
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn poll_rx(&mut self) -> io::Result<bool> {
        Ok(!self.rx.is_empty())
    }
    fn wait_fd(&self) -> Option<RawFd> {
        None
    }
    fn prepare_sleep(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }
}

/// The peer: the engine under test, its NIC, the virtual clock and the flow's numbers.
struct Peer {
    svc: TcpService,
    nic: ScriptedNic,
    now: Instant,
    /// The engine's next sequence number as last heard (our ACK number).
    their_next: u32,
    /// Our next sequence number on the established flow.
    next: u32,
    /// Frames the engine sent.
    sent: usize,
}

/// One segment the script builds.
struct Seg<'a> {
    src_port: u16,
    dst_port: u16,
    control: TcpControl,
    seq: u32,
    ack: Option<u32>,
    window: u16,
    window_scale: Option<u8>,
    payload: &'a [u8],
}

impl Peer {
    fn poll(&mut self) {
        for _ in 0..3 {
            self.svc.poll(&mut self.nic, self.now);
        }
        for f in std::mem::take(&mut self.nic.tx) {
            self.sent += 1;
            let Ok(e) = EthernetFrame::new_checked(&f[..]) else {
                continue;
            };
            if e.ethertype() != EthernetProtocol::Ipv4 {
                continue;
            }
            let Ok(ip) = Ipv4Packet::new_checked(e.payload()) else {
                continue;
            };
            if ip.next_header() != IpProtocol::Tcp {
                continue;
            }
            let Ok(t) = TcpPacket::new_checked(ip.payload()) else {
                continue;
            };
            if t.dst_port() != PEER_PORT {
                continue;
            }
            let end = (t.seq_number().0 as u32)
                .wrapping_add(t.payload().len() as u32)
                .wrapping_add(u32::from(t.syn()) + u32::from(t.fin()));
            if t.syn() || end.wrapping_sub(self.their_next) as i32 > 0 {
                self.their_next = end;
            }
        }
    }

    fn frame(&self, s: &Seg) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: s.src_port,
            dst_port: s.dst_port,
            control: s.control,
            seq_number: TcpSeqNumber(s.seq as i32),
            ack_number: s.ack.map(|a| TcpSeqNumber(a as i32)),
            window_len: s.window,
            window_scale: s.window_scale,
            max_seg_size: (s.control == TcpControl::Syn).then_some(MSS),
            sack_permitted: false,
            sack_ranges: [None, None, None],
            timestamp: None,
            payload: s.payload,
        };
        let ip = Ipv4Repr {
            src_addr: PEER,
            dst_addr: US,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let mut buf = vec![0u8; 14 + 20 + tcp.buffer_len()];
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        EthernetRepr {
            src_addr: EthernetAddress(PEER_MAC),
            dst_addr: EthernetAddress(US_MAC),
            ethertype: EthernetProtocol::Ipv4,
        }
        .emit(&mut f);
        let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
        let caps = ChecksumCapabilities::default();
        ip.emit(&mut p, &caps);
        tcp.emit(
            &mut TcpPacket::new_unchecked(p.payload_mut()),
            &IpAddress::Ipv4(PEER),
            &IpAddress::Ipv4(US),
            &caps,
        );
        buf
    }

    fn deliver(&mut self, frame: Vec<u8>) {
        self.nic.rx.push_back(frame);
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
        let mut buf = vec![0u8; 14 + arp.buffer_len()];
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        EthernetRepr {
            src_addr: EthernetAddress(PEER_MAC),
            dst_addr: EthernetAddress::BROADCAST,
            ethertype: EthernetProtocol::Arp,
        }
        .emit(&mut f);
        arp.emit(&mut ArpPacket::new_unchecked(f.payload_mut()));
        self.deliver(buf);
    }
}

fn control(bits: u8) -> TcpControl {
    match bits % 5 {
        0 => TcpControl::None,
        1 => TcpControl::Psh,
        2 => TcpControl::Syn,
        3 => TcpControl::Fin,
        _ => TcpControl::Rst,
    }
}

/// The engine with a listener on [`PORT`] and a connection from [`PEER_PORT`] accepted.
fn setup() -> Option<(Peer, ListenSocket, Stream)> {
    let cfg = StackConfig {
        mac: US_MAC,
        ipv4: Some((US, 24)),
        rx_buffer: 16 << 10,
        tx_buffer: 8 << 10,
        ring_size: 8 << 10,
        timestamps: false,
        syn_backlog: 8,
        armed_listeners: 1,
        tcp: xwarp_stack::TcpOptions {
            ack_delay: None,
            ..Default::default()
        },
        rto_floor: Some(Duration::from_millis(20)),
        ..StackConfig::default()
    };
    let (svc, h) = new_stack(cfg).ok()?;
    let mut peer = Peer {
        svc,
        nic: ScriptedNic::default(),
        now: Instant::now(),
        their_next: 0,
        next: 1000,
        sent: 0,
    };
    let listener = std::thread::scope(|sc| {
        let t = sc.spawn(|| h.listen(SocketAddr::from((US, PORT)), 8, Duration::from_secs(10)));
        while !t.is_finished() {
            peer.svc.poll(&mut peer.nic, peer.now);
            // Let the listening thread run (it waits for the engine this thread drives).
            std::thread::yield_now();
        }
        t.join().ok()?.ok()
    })?;
    peer.arp();
    let syn = Seg {
        src_port: PEER_PORT,
        dst_port: PORT,
        control: TcpControl::Syn,
        seq: 999,
        ack: None,
        window: 65535,
        window_scale: Some(7),
        payload: &[],
    };
    let f = peer.frame(&syn);
    peer.deliver(f);
    let ack = Seg {
        control: TcpControl::None,
        seq: 1000,
        ack: Some(peer.their_next),
        window_scale: None,
        ..syn
    };
    let f = peer.frame(&ack);
    peer.deliver(f);
    let stream = listener.try_accept().ok()?;
    Some((peer, listener, stream))
}

/// Raw frames and scripted segments into a hand-driven [`TcpService`]. Records (tag byte
/// `t`, `t % 8` picks the kind):
/// * 0: a raw Ethernet frame (`u16` length, bytes), delivered as is;
/// * 1: a segment on the established flow: flags byte (control `% 5`; bit 3 keeps our
///   sequence number, bit 4 corrupts the checksum, bit 5 no ACK), `i16` sequence delta,
///   `i16` ACK delta, `u16` window, `u8` payload length in units of 8;
/// * 2: a segment from another port (`u16` source port, flags, `u32` seq, `u32` ack,
///   `u8` payload length): handshakes, spoofed ACKs, SYN floods;
/// * 3: advance the clock (`u8` in units of 5 ms) and poll (timers, rescue scans);
/// * 4: the application: read up to `u8 * 64` bytes, write, shut down or abort;
/// * 5: a scripted segment with one byte flipped (`u16` offset, `u8` xor);
/// * 6: `u8 % 16 + 1` full-sized in-order data segments (fills the window);
/// * 7: a data+FIN segment ending `u16` bytes past the last advertised window edge.
pub fn tcp_frames(input: &[u8]) {
    let Some((mut peer, _listener, mut stream)) = setup() else {
        return;
    };
    let mut cur = Cursor::new(input);
    let data = [0x5au8; 1460];
    let mut buf = vec![0u8; 16 << 10];
    let mut records = 0;
    while !cur.is_empty() && records < 64 {
        records += 1;
        let tag = cur.u8();
        match tag % 8 {
            0 => {
                let n = usize::from(cur.u16()) % 1600;
                let f = cur.take(n).to_vec();
                peer.deliver(f);
            }
            1 | 5 => {
                let flags = cur.u8();
                let seq_d = cur.u16() as i16;
                let ack_d = cur.u16() as i16;
                let window = cur.u16();
                let len = usize::from(cur.u8()) * 8 % 1461;
                let (at, xor) = if tag % 8 == 5 {
                    (usize::from(cur.u16()), cur.u8())
                } else {
                    (0, 0)
                };
                let seq = if flags & 8 != 0 {
                    peer.next
                } else {
                    peer.next.wrapping_add(seq_d as i32 as u32)
                };
                let s = Seg {
                    src_port: PEER_PORT,
                    dst_port: PORT,
                    control: control(flags),
                    seq,
                    ack: (flags & 0x20 == 0)
                        .then(|| peer.their_next.wrapping_add(ack_d as i32 as u32)),
                    window,
                    window_scale: None,
                    payload: &data[..len],
                };
                let mut f = peer.frame(&s);
                if flags & 0x10 != 0 {
                    let i = f.len() - 1;
                    f[i] ^= 0xff; // payload or checksum: the TCP checksum fails
                }
                if xor != 0 {
                    let i = at % f.len();
                    f[i] ^= xor;
                }
                if seq == peer.next {
                    peer.next = peer.next.wrapping_add(len as u32);
                }
                peer.deliver(f);
            }
            2 => {
                let src_port = cur.u16();
                let flags = cur.u8();
                let seq = cur.u32();
                let ack = cur.u32();
                let len = usize::from(cur.u8()) * 8 % 1461;
                let s = Seg {
                    src_port,
                    dst_port: if flags & 0x40 != 0 { PORT + 1 } else { PORT },
                    control: control(flags),
                    seq,
                    ack: (flags & 0x20 == 0).then_some(ack),
                    window: 65535,
                    window_scale: (flags & 0x80 != 0).then_some(flags & 15),
                    payload: &data[..len],
                };
                let f = peer.frame(&s);
                peer.deliver(f);
            }
            3 => {
                peer.now += Duration::from_millis(u64::from(cur.u8()) * 5);
                peer.poll();
            }
            4 => {
                let op = cur.u8();
                let n = (usize::from(op) * 64).min(buf.len());
                match op % 4 {
                    0 | 1 => {
                        let _ = stream.try_read(&mut buf[..n]);
                    }
                    2 => {
                        let _ = stream.try_write(&data[..n.min(data.len())]);
                    }
                    _ if op & 0x80 != 0 => {
                        let _ = stream.abort();
                    }
                    _ => {
                        let _ = stream.shutdown_write();
                    }
                }
                peer.poll();
            }
            6 => {
                for _ in 0..=cur.u8() % 16 {
                    let s = Seg {
                        src_port: PEER_PORT,
                        dst_port: PORT,
                        control: TcpControl::Psh,
                        seq: peer.next,
                        ack: Some(peer.their_next),
                        window: 65535,
                        window_scale: None,
                        payload: &data[..],
                    };
                    let f = peer.frame(&s);
                    peer.next = peer.next.wrapping_add(data.len() as u32);
                    peer.deliver(f);
                }
            }
            _ => {
                let past = usize::from(cur.u16()) % 1461;
                let s = Seg {
                    src_port: PEER_PORT,
                    dst_port: PORT,
                    control: TcpControl::Fin,
                    seq: peer.next,
                    ack: Some(peer.their_next),
                    window: 65535,
                    window_scale: None,
                    payload: &data[..past],
                };
                let f = peer.frame(&s);
                peer.deliver(f);
            }
        }
    }
    // Drain what the application may read; the engine must stay consistent.
    while let Ok(n) = stream.try_read(&mut buf) {
        if n == 0 {
            break;
        }
    }
    peer.now += Duration::from_secs(2);
    peer.poll();
    assert!(peer.svc.socket_count() < 64, "sockets pile up");
}
