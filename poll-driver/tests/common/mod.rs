//! Helpers shared by the poll-driver integration tests.
#![allow(dead_code)]

use smoltcp::phy::{Device, RxToken, TxToken};
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpProtocol, Ipv4Address,
    Ipv4Packet, Ipv4Repr, UdpPacket, UdpRepr,
};
use xwarp_poll_driver::vwire::VirtualNic;

/// MAC of side A in test frames.
pub const MAC_A: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0a]);
/// MAC of side B in test frames.
pub const MAC_B: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0x0b]);

/// A test frame: Ethernet header + 8-byte big-endian sequence number + a pattern
/// derived from the sequence number, `len` bytes in total (at least 22).
pub fn numbered_frame(seq: u64, len: usize) -> Vec<u8> {
    let len = len.max(22);
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&MAC_B.0);
    f[6..12].copy_from_slice(&MAC_A.0);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // IEEE local experimental
    f[14..22].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[22..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    f
}

/// The sequence number of a [`numbered_frame`].
pub fn frame_seq(f: &[u8]) -> u64 {
    u64::from_be_bytes(f[14..22].try_into().expect("8 bytes"))
}

/// A valid Ethernet/IPv4/UDP frame (checksums filled) carrying `payload`, from A to B.
pub fn udp_frame(payload: &[u8]) -> Vec<u8> {
    let src = Ipv4Address::new(10, 0, 0, 1);
    let dst = Ipv4Address::new(10, 0, 0, 2);
    let udp = UdpRepr {
        src_port: 40000,
        dst_port: 7,
    };
    let ip = Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Udp,
        payload_len: 8 + payload.len(),
        hop_limit: 64,
    };
    let eth = EthernetRepr {
        src_addr: MAC_A,
        dst_addr: MAC_B,
        ethertype: EthernetProtocol::Ipv4,
    };
    let mut buf = vec![0u8; 14 + 20 + 8 + payload.len()];
    let mut frame = EthernetFrame::new_unchecked(&mut buf[..]);
    eth.emit(&mut frame);
    let caps = smoltcp::phy::ChecksumCapabilities::default();
    let mut ipp = Ipv4Packet::new_unchecked(frame.payload_mut());
    ip.emit(&mut ipp, &caps);
    let mut udpp = UdpPacket::new_unchecked(ipp.payload_mut());
    udp.emit(
        &mut udpp,
        &src.into(),
        &dst.into(),
        payload.len(),
        |p| p.copy_from_slice(payload),
        &caps,
    );
    buf
}

/// Send one frame through the smoltcp `Device` API.
pub fn dev_send<D: Device>(dev: &mut D, frame: &[u8]) {
    let tok = dev.transmit(SmolInstant::from_millis(0)).expect("tx token");
    tok.consume(frame.len(), |buf| buf.copy_from_slice(frame));
}

/// Receive one frame through the smoltcp `Device` API.
pub fn dev_recv<D: Device>(dev: &mut D) -> Option<Vec<u8>> {
    let (rx, _tx) = dev.receive(SmolInstant::from_millis(0))?;
    Some(rx.consume(|b| b.to_vec()))
}

/// Receive everything currently ready on `nic`.
pub fn drain(nic: &mut VirtualNic) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(f) = dev_recv(nic) {
        out.push(f);
    }
    out
}
