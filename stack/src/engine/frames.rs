//! Ethernet + IPv4/IPv6 + TCP framing for the own TCP core: parsing a received frame
//! (checksums verified unless the device did), writing a connection's segment straight
//! into a transmit buffer, and the RST for a segment that matches no connection.

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, IpEndpoint,
    IpProtocol, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, TcpControl, TcpPacket, TcpRepr,
    TcpSeqNumber,
};

use crate::device::ETHERNET_HEADER_LEN;
use crate::tcp::conn::{EmitError, Segment, TxSource};

/// A received TCP segment, parsed and checked.
#[derive(Debug)]
pub(crate) struct TcpFrame<'a> {
    /// Source MAC of the frame: where replies go (a routed peer's frames carry the
    /// gateway's MAC, which is what the reply needs).
    pub(crate) src_mac: EthernetAddress,
    /// Our end (the frame's destination).
    pub(crate) local: IpEndpoint,
    /// The peer's end.
    pub(crate) remote: IpEndpoint,
    /// The segment; its `payload` borrows the frame (handed to the connection's sink).
    pub(crate) repr: TcpRepr<'a>,
}

/// What a received frame is.
#[derive(Debug)]
pub(crate) enum Ingress<'a> {
    /// A well-formed TCP segment with valid checksums.
    Tcp(TcpFrame<'a>),
    /// Not TCP over IP (ARP, NDP, ICMP, UDP, ...): the `Interface`'s business.
    Other,
    /// TCP over IP that is malformed or fails a checksum: dropped.
    Bad,
}

/// Parse `frame`. Checksums are verified as `caps` says (a device that verified them
/// reports `Checksum::None`/`Tx` for receive).
pub(crate) fn parse<'a>(frame: &'a [u8], caps: &ChecksumCapabilities) -> Ingress<'a> {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Ingress::Other;
    };
    let src_mac = eth.src_addr();
    let ip = &frame[ETHERNET_HEADER_LEN..];
    let (src, dst, tcp) = match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let Ok(p) = Ipv4Packet::new_checked(ip) else {
                return Ingress::Other;
            };
            if p.next_header() != IpProtocol::Tcp {
                return Ingress::Other;
            }
            // Fragments are the Interface's (it reassembles or drops them).
            if p.more_frags() || p.frag_offset() != 0 {
                return Ingress::Other;
            }
            let Ok(r) = Ipv4Repr::parse(&p, caps) else {
                return Ingress::Bad;
            };
            let h = p.header_len() as usize;
            (
                IpAddress::Ipv4(r.src_addr),
                IpAddress::Ipv4(r.dst_addr),
                &ip[h..h + r.payload_len],
            )
        }
        EthernetProtocol::Ipv6 => {
            let Ok(p) = Ipv6Packet::new_checked(ip) else {
                return Ingress::Other;
            };
            // Extension headers are left to the Interface.
            if p.next_header() != IpProtocol::Tcp {
                return Ingress::Other;
            }
            let Ok(r) = Ipv6Repr::parse(&p) else {
                return Ingress::Bad;
            };
            (
                IpAddress::Ipv6(r.src_addr),
                IpAddress::Ipv6(r.dst_addr),
                &ip[40..40 + r.payload_len],
            )
        }
        _ => return Ingress::Other,
    };
    let Ok(pkt) = TcpPacket::new_checked(tcp) else {
        return Ingress::Bad;
    };
    let Ok(repr) = TcpRepr::parse(&pkt, &src, &dst, caps) else {
        return Ingress::Bad;
    };
    Ingress::Tcp(TcpFrame {
        src_mac,
        local: IpEndpoint::new(dst, repr.dst_port),
        remote: IpEndpoint::new(src, repr.src_port),
        repr,
    })
}

/// Why a segment could not be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// IP packet longer than the MTU, or the buffer is shorter than the frame.
    TooLong,
    /// Local and remote address of different families.
    MixedFamilies,
    /// [`Segment::emit`] failed.
    Emit(EmitError),
}

/// Bytes of IP header for a connection on `addr`'s family.
pub(crate) fn ip_header_len(addr: &IpAddress) -> usize {
    match addr {
        IpAddress::Ipv4(_) => 20,
        IpAddress::Ipv6(_) => 40,
    }
}

/// Frame length of `seg` between `local` and `remote`.
pub(crate) fn frame_len(seg: &Segment, local: &IpAddress) -> usize {
    ETHERNET_HEADER_LEN + ip_header_len(local) + seg.buffer_len()
}

/// Write `seg` (payload copied from `tx` straight into the frame) as a complete Ethernet
/// frame into `buf`; the IP packet must fit `mtu`. Returns the frame length.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_segment(
    buf: &mut [u8],
    mtu: usize,
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
    local: IpAddress,
    remote: IpAddress,
    seg: &Segment,
    tx: &impl TxSource,
) -> Result<usize, FrameError> {
    let ip_len = ip_header_len(&local) + seg.buffer_len();
    let total = ETHERNET_HEADER_LEN + ip_len;
    if ip_len > mtu || buf.len() < total {
        return Err(FrameError::TooLong);
    }
    let ethertype = match (local, remote) {
        (IpAddress::Ipv4(_), IpAddress::Ipv4(_)) => EthernetProtocol::Ipv4,
        (IpAddress::Ipv6(_), IpAddress::Ipv6(_)) => EthernetProtocol::Ipv6,
        _ => return Err(FrameError::MixedFamilies),
    };
    EthernetRepr {
        src_addr: src_mac,
        dst_addr: dst_mac,
        ethertype,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut buf[..total]));
    let ip = &mut buf[ETHERNET_HEADER_LEN..total];
    let tcp_len = seg.buffer_len();
    let h = match (local, remote) {
        (IpAddress::Ipv4(s), IpAddress::Ipv4(d)) => {
            Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::Tcp,
                payload_len: tcp_len,
                hop_limit: 64,
            }
            .emit(
                &mut Ipv4Packet::new_unchecked(&mut *ip),
                &ChecksumCapabilities::default(),
            );
            20
        }
        (IpAddress::Ipv6(s), IpAddress::Ipv6(d)) => {
            Ipv6Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::Tcp,
                payload_len: tcp_len,
                hop_limit: 64,
            }
            .emit(&mut Ipv6Packet::new_unchecked(&mut *ip));
            40
        }
        _ => return Err(FrameError::MixedFamilies),
    };
    seg.emit(&mut ip[h..], &local, &remote, tx)
        .map_err(FrameError::Emit)?;
    Ok(total)
}

/// The reset RFC 9293 §3.10.7.1 sends for segment `seg` arriving for no connection
/// (CLOSED): none for a RST; `<SEQ=SEG.ACK><CTL=RST>` when the segment has an ACK, else
/// `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>`. Ports are swapped (the reply's header).
pub(crate) fn rst_for_unknown(seg: &TcpRepr) -> Option<TcpRepr<'static>> {
    if seg.control == TcpControl::Rst {
        return None;
    }
    let (seq_number, ack_number) = match seg.ack_number {
        Some(ack) => (ack, None),
        None => {
            let len = seg.payload.len() + seg.control.len();
            (TcpSeqNumber(0), Some(seg.seq_number + len))
        }
    };
    Some(TcpRepr {
        src_port: seg.dst_port,
        dst_port: seg.src_port,
        control: TcpControl::Rst,
        seq_number,
        ack_number,
        window_len: 0,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    })
}

/// A header-only segment (`repr` without payload) as a [`Segment`], for
/// [`write_segment`] (RSTs the engine sends itself).
pub(crate) fn bare_segment(repr: TcpRepr<'static>) -> Segment {
    Segment {
        repr,
        payload_offset: 0,
        payload_len: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::conn::RingTx;
    use smoltcp::phy::Checksum;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
    const B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

    fn v4(last: u8) -> IpAddress {
        IpAddress::Ipv4(Ipv4Addr::new(10, 0, 0, last))
    }

    fn v6(last: u16) -> IpAddress {
        IpAddress::Ipv6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last))
    }

    fn data_segment(len: usize) -> Segment {
        Segment {
            repr: TcpRepr {
                src_port: 4000,
                dst_port: 80,
                control: TcpControl::Psh,
                seq_number: TcpSeqNumber(1000),
                ack_number: Some(TcpSeqNumber(77)),
                window_len: 512,
                window_scale: None,
                max_seg_size: None,
                sack_permitted: false,
                sack_ranges: [None; 3],
                timestamp: None,
                payload: &[],
            },
            payload_offset: 3,
            payload_len: len,
        }
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    /// A segment written by [`write_segment`] parses back with both checksums valid, its
    /// payload taken from the source at the segment's offset, for IPv4 and IPv6.
    #[test]
    fn written_segment_parses_back_with_checksums_for_both_families() {
        for (l, r) in [(v4(1), v4(2)), (v6(1), v6(2))] {
            let mut tx = RingTx::new(4096);
            let data = pattern(1203);
            tx.write(&data);
            let seg = data_segment(1200);
            let mut buf = vec![0u8; 1514];
            let n = write_segment(&mut buf, 1500, A, B, l, r, &seg, &tx).unwrap();
            assert_eq!(n, frame_len(&seg, &l));
            match parse(&buf[..n], &ChecksumCapabilities::default()) {
                Ingress::Tcp(f) => {
                    assert_eq!(f.src_mac, A);
                    assert_eq!(f.local, IpEndpoint::new(r, 80));
                    assert_eq!(f.remote, IpEndpoint::new(l, 4000));
                    assert_eq!(f.repr.seq_number, TcpSeqNumber(1000));
                    assert_eq!(f.repr.payload, &data[3..1203]);
                }
                other => panic!("not parsed back: {other:?}"),
            }
        }
    }

    /// One flipped payload bit fails the TCP checksum (dropped, not handed to a
    /// connection); a device that verified checksums itself skips the check.
    #[test]
    fn corrupted_segment_fails_the_tcp_checksum_unless_the_device_verified_it() {
        let mut tx = RingTx::new(64);
        tx.write(&pattern(40));
        let seg = data_segment(30);
        let mut buf = vec![0u8; 1514];
        let n = write_segment(&mut buf, 1500, A, B, v4(1), v4(2), &seg, &tx).unwrap();
        buf[n - 5] ^= 0x10;
        assert!(matches!(
            parse(&buf[..n], &ChecksumCapabilities::default()),
            Ingress::Bad
        ));
        let mut verified = ChecksumCapabilities::default();
        verified.ipv4 = Checksum::None;
        verified.tcp = Checksum::None;
        assert!(matches!(parse(&buf[..n], &verified), Ingress::Tcp(_)));
        // A corrupted IPv4 header checksum is caught too.
        let n = write_segment(&mut buf, 1500, A, B, v4(1), v4(2), &seg, &tx).unwrap();
        buf[ETHERNET_HEADER_LEN + 8] ^= 1; // TTL
        assert!(matches!(
            parse(&buf[..n], &ChecksumCapabilities::default()),
            Ingress::Bad
        ));
    }

    /// No frame above the MTU: a segment whose IP packet exceeds it is refused.
    #[test]
    fn segment_above_the_mtu_is_refused() {
        let mut tx = RingTx::new(4096);
        tx.write(&pattern(2000));
        let seg = data_segment(1461);
        let mut buf = vec![0u8; 4000];
        assert_eq!(
            write_segment(&mut buf, 1500, A, B, v4(1), v4(2), &seg, &tx),
            Err(FrameError::TooLong)
        );
        assert!(write_segment(&mut buf, 1501, A, B, v4(1), v4(2), &seg, &tx).is_ok());
    }

    /// ARP and UDP are not the own core's: they go to the Interface.
    #[test]
    fn non_tcp_frames_are_left_to_the_interface() {
        let mut buf = vec![0u8; 60];
        EthernetRepr {
            src_addr: A,
            dst_addr: B,
            ethertype: EthernetProtocol::Arp,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
        assert!(matches!(
            parse(&buf, &ChecksumCapabilities::default()),
            Ingress::Other
        ));
        let mut buf = vec![0u8; 14 + 28];
        EthernetRepr {
            src_addr: A,
            dst_addr: B,
            ethertype: EthernetProtocol::Ipv4,
        }
        .emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
        Ipv4Repr {
            src_addr: Ipv4Addr::new(10, 0, 0, 1),
            dst_addr: Ipv4Addr::new(10, 0, 0, 2),
            next_header: IpProtocol::Udp,
            payload_len: 8,
            hop_limit: 64,
        }
        .emit(
            &mut Ipv4Packet::new_unchecked(&mut buf[14..]),
            &ChecksumCapabilities::default(),
        );
        assert!(matches!(
            parse(&buf, &ChecksumCapabilities::default()),
            Ingress::Other
        ));
    }

    fn incoming(control: TcpControl, ack: Option<u32>, payload: &'static [u8]) -> TcpRepr<'static> {
        TcpRepr {
            control,
            ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
            payload,
            ..data_segment(0).repr
        }
    }

    /// RFC 9293 §3.10.7.1: a segment with an ACK for a closed port gets
    /// `<SEQ=SEG.ACK><CTL=RST>`.
    #[test]
    fn rfc9293_3_10_7_1_segment_for_closed_port_gets_rst() {
        let r = rst_for_unknown(&incoming(TcpControl::Psh, Some(5555), b"hello")).unwrap();
        assert_eq!(r.control, TcpControl::Rst);
        assert_eq!(r.seq_number, TcpSeqNumber(5555));
        assert_eq!(r.ack_number, None);
        assert_eq!((r.src_port, r.dst_port), (80, 4000));
        assert!(r.payload.is_empty());
    }

    /// RFC 9293 §3.10.7.1: without an ACK the reset is `<SEQ=0><ACK=SEG.SEQ+SEG.LEN>
    /// <CTL=RST,ACK>`, SEG.LEN counting the SYN (and FIN) and the payload.
    #[test]
    fn rfc9293_3_10_7_1_syn_for_closed_port_gets_rst_ack_covering_seg_len() {
        let r = rst_for_unknown(&incoming(TcpControl::Syn, None, b"")).unwrap();
        assert_eq!(r.seq_number, TcpSeqNumber(0));
        assert_eq!(r.ack_number, Some(TcpSeqNumber(1001)));
        let r = rst_for_unknown(&incoming(TcpControl::None, None, b"abc")).unwrap();
        assert_eq!(r.ack_number, Some(TcpSeqNumber(1003)));
        let r = rst_for_unknown(&incoming(TcpControl::Fin, None, b"ab")).unwrap();
        assert_eq!(r.ack_number, Some(TcpSeqNumber(1003)));
    }

    /// RFC 9293 §3.10.7.1: an incoming RST is discarded, never answered.
    #[test]
    fn rfc9293_3_10_7_1_rst_for_closed_port_is_not_answered() {
        assert!(rst_for_unknown(&incoming(TcpControl::Rst, None, b"")).is_none());
        assert!(rst_for_unknown(&incoming(TcpControl::Rst, Some(9), b"")).is_none());
    }

    /// The RST frame itself: written with [`write_segment`], it parses back as a valid
    /// RST addressed to the segment's sender.
    #[test]
    fn rst_frame_parses_back_addressed_to_the_sender() {
        let seg = incoming(TcpControl::Psh, Some(42), b"x");
        let rst = bare_segment(rst_for_unknown(&seg).unwrap());
        let mut buf = vec![0u8; 128];
        let tx = RingTx::new(0);
        let n = write_segment(&mut buf, 1500, B, A, v4(2), v4(1), &rst, &tx).unwrap();
        let Ingress::Tcp(f) = parse(&buf[..n], &ChecksumCapabilities::default()) else {
            panic!("RST frame did not parse");
        };
        assert_eq!(f.repr.control, TcpControl::Rst);
        assert_eq!(f.local, IpEndpoint::new(v4(1), 4000));
        assert_eq!(f.repr.seq_number, TcpSeqNumber(42));
    }
}
