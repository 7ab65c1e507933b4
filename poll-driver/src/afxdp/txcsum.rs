//! TX L4 checksum offload through AF_XDP TX metadata (Linux
//! Documentation/networking/xsk-tx-metadata.rst).
//!
//! With `tx_metadata_len` registered on the UMEM, every TX descriptor has
//! `tx_metadata_len` bytes of metadata right in front of its `addr` (the kernel checks
//! `addr - tx_metadata_len` and `len + tx_metadata_len` against the chunk for every
//! descriptor, whether or not it asks for metadata). A first descriptor with option
//! `XDP_TX_METADATA` and metadata flag `XDP_TXMD_FLAGS_CHECKSUM` makes the copy path
//! (`xsk_build_skb` → `xsk_skb_metadata`) build a `CHECKSUM_PARTIAL` skb with the given
//! `csum_start` / `csum_offset`: a veth passes it on as is (the kernel receiver trusts it), a
//! device without checksum offload gets it finished in software by `validate_xmit_skb`
//! (`skb_checksum_help`, which also turns a computed 0 into 0xffff, `CSUM_MANGLED_0`).
//!
//! Linux's `CHECKSUM_PARTIAL` convention: the checksum field holds the folded one's
//! complement sum of the pseudo-header, **not** complemented; whoever finishes the checksum
//! sums from `csum_start` to the end of the frame (field included) and stores the
//! complement at `csum_start + csum_offset`.
//!
//! [`prepare`] does the per-frame part: parse Ethernet / IPv4 or IPv6 / TCP or UDP, write
//! the pseudo-header sum into the checksum field and say where the metadata must point.

/// Bytes of TX metadata in front of every TX frame when offload is active: the size of
/// `struct xsk_tx_metadata` on Linux 6.15+ (`flags`, `csum_start`, `csum_offset`, padding,
/// `launch_time`); a multiple of 8, as `XDP_UMEM_REG` requires.
pub(crate) const TX_METADATA_LEN: u32 = 24;

/// `XDP_TXMD_FLAGS_CHECKSUM` (linux/if_xdp.h).
const XDP_TXMD_FLAGS_CHECKSUM: u64 = 1 << 1;

/// Where the kernel is to finish an L4 checksum (`xsk_tx_metadata.request`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CsumRequest {
    /// Offset of the L4 header from the start of the frame.
    pub start: u16,
    /// Offset of the checksum field inside the L4 header (16 TCP, 6 UDP).
    pub offset: u16,
}

/// `struct xsk_tx_metadata` as the kernel reads it (native byte order).
#[repr(C)]
struct TxMetadata {
    flags: u64,
    csum_start: u16,
    csum_offset: u16,
    _pad: u32,
    launch_time: u64,
}

const _: () = assert!(std::mem::size_of::<TxMetadata>() == TX_METADATA_LEN as usize);

/// The metadata bytes asking for `req` (flags = `XDP_TXMD_FLAGS_CHECKSUM`).
pub(crate) fn metadata_bytes(req: CsumRequest) -> [u8; TX_METADATA_LEN as usize] {
    let m = TxMetadata {
        flags: XDP_TXMD_FLAGS_CHECKSUM,
        csum_start: req.start,
        csum_offset: req.offset,
        _pad: 0,
        launch_time: 0,
    };
    let mut out = [0u8; TX_METADATA_LEN as usize];
    out[0..8].copy_from_slice(&m.flags.to_ne_bytes());
    out[8..10].copy_from_slice(&m.csum_start.to_ne_bytes());
    out[10..12].copy_from_slice(&m.csum_offset.to_ne_bytes());
    out[12..16].copy_from_slice(&m._pad.to_ne_bytes());
    out[16..24].copy_from_slice(&m.launch_time.to_ne_bytes());
    out
}

const ETHERNET_HEADER_LEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// IPv6 extension headers walked over (Hop-by-Hop, Destination Options): they do not
/// change the pseudo-header. Any other (Routing changes the destination, Fragment splits
/// the datagram) leaves the frame alone.
const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_DEST_OPTS: u8 = 60;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// One's complement sum of `data` as big-endian 16-bit words (an odd last byte is padded
/// with zero), added to `acc` (not folded).
pub(crate) fn sum_words(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for w in &mut chunks {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// Fold a one's complement sum to 16 bits (end-around carry).
pub(crate) fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// L4 protocol, offset of its header in the frame, its length and the pseudo-header sum
/// (unfolded, without the length and protocol, which the caller adds).
struct L4 {
    proto: u8,
    start: usize,
    len: usize,
    /// Where the IP datagram ends in the frame (anything after it is Ethernet padding).
    end: usize,
    /// Sum of the pseudo-header's addresses.
    addr_sum: u64,
}

fn parse_ipv4(frame: &[u8]) -> Option<L4> {
    let ip = &frame[ETHERNET_HEADER_LEN..];
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(be16(ip, 2));
    if ihl < 20 || total < ihl || total > ip.len() {
        return None;
    }
    // A fragment (More Fragments set or a non-zero offset): the checksum covers the whole
    // datagram, not this frame.
    if be16(ip, 6) & 0x3fff != 0 {
        return None;
    }
    Some(L4 {
        proto: ip[9],
        start: ETHERNET_HEADER_LEN + ihl,
        len: total - ihl,
        end: ETHERNET_HEADER_LEN + total,
        addr_sum: sum_words(&ip[12..20], 0),
    })
}

fn parse_ipv6(frame: &[u8]) -> Option<L4> {
    let ip = &frame[ETHERNET_HEADER_LEN..];
    if ip.len() < 40 || ip[0] >> 4 != 6 {
        return None;
    }
    let end = 40 + usize::from(be16(ip, 4));
    if end > ip.len() {
        return None;
    }
    let mut next = ip[6];
    let mut pos = 40;
    // A few extension headers at most; a longer chain is left alone.
    for _ in 0..4 {
        if next != IPV6_HOP_BY_HOP && next != IPV6_DEST_OPTS {
            break;
        }
        if pos + 2 > end {
            return None;
        }
        let len = (usize::from(ip[pos + 1]) + 1) * 8;
        next = ip[pos];
        pos += len;
    }
    if pos > end {
        return None;
    }
    Some(L4 {
        proto: next,
        start: ETHERNET_HEADER_LEN + pos,
        len: end - pos,
        end: ETHERNET_HEADER_LEN + end,
        addr_sum: sum_words(&ip[8..40], 0),
    })
}

/// Prepare `frame` (a whole Ethernet frame) for TX checksum offload: for an unfragmented
/// TCP or UDP datagram over IPv4 or IPv6, write the folded pseudo-header sum (not
/// complemented) into its checksum field, zero any Ethernet padding after the datagram (the
/// kernel sums to the end of the frame) and return where the kernel must finish the
/// checksum. Anything else (ARP, ICMP, fragments, truncated or malformed headers) is left
/// untouched and gets `None`: its checksums stay whatever the stack wrote.
pub(crate) fn prepare(frame: &mut [u8]) -> Option<CsumRequest> {
    if frame.len() < ETHERNET_HEADER_LEN {
        return None;
    }
    let l4 = match be16(frame, 12) {
        ETHERTYPE_IPV4 => parse_ipv4(frame)?,
        ETHERTYPE_IPV6 => parse_ipv6(frame)?,
        _ => return None,
    };
    let (offset, min_len) = match l4.proto {
        PROTO_TCP => (16usize, 20usize),
        PROTO_UDP => (6, 8),
        _ => return None,
    };
    if l4.len < min_len {
        return None;
    }
    let start = u16::try_from(l4.start).ok()?;
    let len = u32::try_from(l4.len).ok()?;
    // Pseudo-header: addresses, protocol and the L4 length (IPv6: 32-bit length and a
    // 32-bit next-header word; as 16-bit words the sum is the same).
    let acc = l4.addr_sum + u64::from(l4.proto) + u64::from(len >> 16) + u64::from(len & 0xffff);
    let pseudo = fold(acc);
    frame[l4.end..].fill(0);
    let at = l4.start + offset;
    frame[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
    Some(CsumRequest {
        start,
        offset: offset as u16,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, IpProtocol,
        Ipv4Address, Ipv4Packet, Ipv4Repr, Ipv6Address, Ipv6Packet, Ipv6Repr, TcpControl,
        TcpPacket, TcpRepr, TcpSeqNumber, UdpPacket, UdpRepr,
    };

    const SRC4: Ipv4Address = Ipv4Address::new(10, 88, 1, 10);
    const DST4: Ipv4Address = Ipv4Address::new(10, 88, 1, 2);

    fn src6() -> Ipv6Address {
        Ipv6Address::new(0xfd00, 0x88, 0, 1, 0, 0, 0, 0x10)
    }
    fn dst6() -> Ipv6Address {
        Ipv6Address::new(0xfd00, 0x88, 0, 1, 0xabcd, 0, 0, 2)
    }

    fn eth(buf: &mut [u8], ethertype: EthernetProtocol) {
        EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype,
        }
        .emit(&mut EthernetFrame::new_unchecked(buf));
    }

    fn payload(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
            .collect()
    }

    /// A TCP/IPv4 frame built by smoltcp with the given checksum capabilities.
    fn tcp4(data: &[u8], caps: &ChecksumCapabilities) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: 49152,
            dst_port: 5001,
            control: TcpControl::Psh,
            seq_number: TcpSeqNumber(0x1234_5678),
            ack_number: Some(TcpSeqNumber(0x0bad_cafe)),
            window_len: 4096,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None, None, None],
            timestamp: None,
            payload: data,
        };
        let ip = Ipv4Repr {
            src_addr: SRC4,
            dst_addr: DST4,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let mut buf = vec![0u8; 14 + 20 + tcp.buffer_len()];
        eth(&mut buf, EthernetProtocol::Ipv4);
        let mut ipp = Ipv4Packet::new_unchecked(&mut buf[14..]);
        ip.emit(&mut ipp, caps);
        tcp.emit(
            &mut TcpPacket::new_unchecked(ipp.payload_mut()),
            &IpAddress::Ipv4(SRC4),
            &IpAddress::Ipv4(DST4),
            caps,
        );
        buf
    }

    /// A UDP/IPv4 frame built by smoltcp.
    fn udp4(data: &[u8], caps: &ChecksumCapabilities) -> Vec<u8> {
        let ip = Ipv4Repr {
            src_addr: SRC4,
            dst_addr: DST4,
            next_header: IpProtocol::Udp,
            payload_len: 8 + data.len(),
            hop_limit: 64,
        };
        let mut buf = vec![0u8; 14 + 20 + 8 + data.len()];
        eth(&mut buf, EthernetProtocol::Ipv4);
        let mut ipp = Ipv4Packet::new_unchecked(&mut buf[14..]);
        ip.emit(&mut ipp, caps);
        UdpRepr {
            src_port: 40000,
            dst_port: 9000,
        }
        .emit(
            &mut UdpPacket::new_unchecked(ipp.payload_mut()),
            &IpAddress::Ipv4(SRC4),
            &IpAddress::Ipv4(DST4),
            data.len(),
            |b| b.copy_from_slice(data),
            caps,
        );
        buf
    }

    /// A TCP or UDP / IPv6 frame built by smoltcp.
    fn l4_6(tcp_not_udp: bool, data: &[u8], caps: &ChecksumCapabilities) -> Vec<u8> {
        let (next, l4len) = if tcp_not_udp {
            (IpProtocol::Tcp, 20 + data.len())
        } else {
            (IpProtocol::Udp, 8 + data.len())
        };
        let ip = Ipv6Repr {
            src_addr: src6(),
            dst_addr: dst6(),
            next_header: next,
            payload_len: l4len,
            hop_limit: 64,
        };
        let mut buf = vec![0u8; 14 + 40 + l4len];
        eth(&mut buf, EthernetProtocol::Ipv6);
        let mut ipp = Ipv6Packet::new_unchecked(&mut buf[14..]);
        ip.emit(&mut ipp);
        let (s, d) = (IpAddress::Ipv6(src6()), IpAddress::Ipv6(dst6()));
        if tcp_not_udp {
            TcpRepr {
                src_port: 1,
                dst_port: 2,
                control: TcpControl::None,
                seq_number: TcpSeqNumber(7),
                ack_number: Some(TcpSeqNumber(9)),
                window_len: 512,
                window_scale: None,
                max_seg_size: None,
                sack_permitted: false,
                sack_ranges: [None, None, None],
                timestamp: None,
                payload: data,
            }
            .emit(
                &mut TcpPacket::new_unchecked(ipp.payload_mut()),
                &s,
                &d,
                caps,
            );
        } else {
            UdpRepr {
                src_port: 3,
                dst_port: 4,
            }
            .emit(
                &mut UdpPacket::new_unchecked(ipp.payload_mut()),
                &s,
                &d,
                data.len(),
                |b| b.copy_from_slice(data),
                caps,
            );
        }
        buf
    }

    /// TX checksums off for TCP and UDP: what the NIC reports to smoltcp with offload on.
    fn offload_caps() -> ChecksumCapabilities {
        let mut c = ChecksumCapabilities::default();
        c.tcp = smoltcp::phy::Checksum::Rx;
        c.udp = smoltcp::phy::Checksum::Rx;
        c
    }

    /// What the kernel does with a CHECKSUM_PARTIAL frame (`skb_checksum_help`): sum from
    /// `csum_start` to the end of the frame, complement, 0 becomes 0xffff, store.
    fn kernel_finish(frame: &mut [u8], req: CsumRequest) {
        let start = usize::from(req.start);
        let c = !fold(sum_words(&frame[start..], 0));
        let c = if c == 0 { 0xffff } else { c };
        let at = start + usize::from(req.offset);
        frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }

    /// smoltcp fills 0, [`prepare`] the pseudo-header sum, the kernel the rest: the frame
    /// is then byte for byte what smoltcp's full `fill_checksum` gives.
    fn offloaded_equals_full(full: Vec<u8>, mut partial: Vec<u8>, start: u16, offset: u16) {
        assert_ne!(full, partial, "the stack left the checksum to the NIC");
        let req = prepare(&mut partial).expect("TCP/UDP frames are offloaded");
        assert_eq!(req, CsumRequest { start, offset });
        let at = usize::from(start + offset);
        let pseudo = u16::from_be_bytes([partial[at], partial[at + 1]]);
        assert_ne!(pseudo, 0, "the pseudo-header sum is written");
        kernel_finish(&mut partial, req);
        assert_eq!(partial, full);
    }

    #[test]
    fn tcp_ipv4_pseudo_header_sum_plus_kernel_equals_smoltcp_full_checksum() {
        let full_caps = ChecksumCapabilities::default();
        for n in [0usize, 1, 2, 3, 100, 1459, 1460, 8960] {
            let data = payload(n, n as u8);
            offloaded_equals_full(
                tcp4(&data, &full_caps),
                tcp4(&data, &offload_caps()),
                34,
                16,
            );
        }
    }

    #[test]
    fn udp_ipv4_pseudo_header_sum_plus_kernel_equals_smoltcp_full_checksum() {
        let full_caps = ChecksumCapabilities::default();
        for n in [0usize, 1, 17, 1472, 8972] {
            let data = payload(n, 3);
            offloaded_equals_full(udp4(&data, &full_caps), udp4(&data, &offload_caps()), 34, 6);
        }
    }

    #[test]
    fn ipv6_tcp_and_udp_pseudo_header_sums_are_right() {
        let full_caps = ChecksumCapabilities::default();
        for n in [0usize, 5, 1440] {
            let data = payload(n, 9);
            offloaded_equals_full(
                l4_6(true, &data, &full_caps),
                l4_6(true, &data, &offload_caps()),
                54,
                16,
            );
            offloaded_equals_full(
                l4_6(false, &data, &full_caps),
                l4_6(false, &data, &offload_caps()),
                54,
                6,
            );
        }
    }

    /// RFC 768: a computed UDP checksum of zero is sent as all ones (zero means "none");
    /// the kernel's `skb_checksum_help` does that (`CSUM_MANGLED_0`), and so does
    /// smoltcp's `fill_checksum`.
    #[test]
    fn rfc768_udp_checksum_computing_to_zero_is_sent_as_ffff() {
        let mut data = payload(32, 1);
        // Choose the last two bytes so that the datagram's sum is 0xffff: its checksum
        // (the complement) is then 0.
        data[30] = 0;
        data[31] = 0;
        let mut probe = udp4(&data, &offload_caps());
        let req = prepare(&mut probe).unwrap();
        let s = fold(sum_words(&probe[usize::from(req.start)..], 0));
        let fix = 0xffff - s; // one's complement: adding it makes the sum 0xffff
        data[30..32].copy_from_slice(&fix.to_be_bytes());
        let mut partial = udp4(&data, &offload_caps());
        let req = prepare(&mut partial).unwrap();
        assert_eq!(fold(sum_words(&partial[34..], 0)), 0xffff);
        kernel_finish(&mut partial, req);
        assert_eq!(&partial[40..42], &[0xff, 0xff]);
        let full = udp4(&data, &ChecksumCapabilities::default());
        assert_eq!(partial, full, "smoltcp also sends 0xffff");
        let udp = UdpPacket::new_checked(&partial[34..]).unwrap();
        assert!(udp.verify_checksum(&IpAddress::Ipv4(SRC4), &IpAddress::Ipv4(DST4)));
    }

    #[test]
    fn stale_checksum_and_ethernet_padding_do_not_matter() {
        let data = payload(6, 4);
        let full = tcp4(&data, &ChecksumCapabilities::default());
        // A full checksum already there (the stack computed one) and stale bytes after
        // the datagram (padding in a reused UMEM chunk).
        let mut f = full.clone();
        f.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        let req = prepare(&mut f).unwrap();
        assert_eq!(&f[full.len()..], &[0, 0, 0, 0], "padding zeroed");
        kernel_finish(&mut f, req);
        assert_eq!(&f[..full.len()], &full[..]);
    }

    #[test]
    fn non_tcp_udp_fragments_and_malformed_frames_are_left_alone() {
        let caps = offload_caps();
        // ICMP (protocol 1), ARP, a fragment, a truncated header, a bad IHL.
        let mut icmp = udp4(&payload(8, 0), &caps);
        icmp[14 + 9] = 1;
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let mut frag = tcp4(&payload(100, 0), &caps);
        frag[14 + 6] = 0x20; // More Fragments
        let mut later_frag = udp4(&payload(100, 0), &caps);
        later_frag[14 + 7] = 0x10; // offset 16 * 8
        let mut short = tcp4(&payload(0, 0), &caps);
        short.truncate(14 + 20 + 10);
        let mut bad_ihl = tcp4(&payload(0, 0), &caps);
        bad_ihl[14] = 0x44;
        let mut long_total = udp4(&payload(4, 0), &caps);
        long_total[14 + 2] = 0x40;
        let mut tiny = vec![0u8; 10];
        for f in [
            &mut icmp,
            &mut arp,
            &mut frag,
            &mut later_frag,
            &mut short,
            &mut bad_ihl,
            &mut long_total,
            &mut tiny,
        ] {
            let before = f.clone();
            assert_eq!(prepare(f), None);
            assert_eq!(*f, before, "untouched");
        }
    }

    #[test]
    fn ipv6_hop_by_hop_is_walked_and_fragment_header_is_not_offloaded() {
        let caps = offload_caps();
        let data = payload(20, 2);
        // Insert an 8-byte Hop-by-Hop header (PadN) in front of UDP.
        let base = l4_6(false, &data, &caps);
        let mut f = base[..54].to_vec();
        f[14 + 6] = IPV6_HOP_BY_HOP;
        let plen = be16(&f, 14 + 4) + 8;
        f[14 + 4..14 + 6].copy_from_slice(&plen.to_be_bytes());
        f.extend_from_slice(&[PROTO_UDP, 0, 1, 4, 0, 0, 0, 0]);
        f.extend_from_slice(&base[54..]);
        let req = prepare(&mut f).expect("UDP behind Hop-by-Hop");
        assert_eq!(
            req,
            CsumRequest {
                start: 62,
                offset: 6
            }
        );
        kernel_finish(&mut f, req);
        let udp = UdpPacket::new_checked(&f[62..]).unwrap();
        assert!(udp.verify_checksum(&IpAddress::Ipv6(src6()), &IpAddress::Ipv6(dst6())));
        // The same with a Fragment header (44) instead: left alone.
        let mut g = f.clone();
        g[14 + 6] = 44;
        let before = g.clone();
        assert_eq!(prepare(&mut g), None);
        assert_eq!(g, before);
    }

    #[test]
    fn metadata_layout_matches_struct_xsk_tx_metadata() {
        let m = metadata_bytes(CsumRequest {
            start: 34,
            offset: 16,
        });
        assert_eq!(u64::from_ne_bytes(m[0..8].try_into().unwrap()), 2);
        assert_eq!(
            XDP_TXMD_FLAGS_CHECKSUM,
            u64::from(libc::XDP_TXMD_FLAGS_CHECKSUM)
        );
        assert_eq!(u16::from_ne_bytes([m[8], m[9]]), 34);
        assert_eq!(u16::from_ne_bytes([m[10], m[11]]), 16);
        assert!(m[12..].iter().all(|b| *b == 0));
        // libc's (pre-6.15) struct is the first 16 bytes of ours.
        assert_eq!(std::mem::size_of::<libc::xsk_tx_metadata>(), 16);
    }
}
