//! Synthesizes a classic pcap of one TCP connection (handshake, data both ways, FIN) from
//! the two byte streams of a test exchange, so tshark can dissect what our sans-IO
//! endpoints put on the wire without any network.

use std::io::Write;

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const IP_A: [u8; 4] = [10, 77, 0, 1];
const IP_B: [u8; 4] = [10, 77, 0, 2];
/// Largest TCP payload per synthesized segment (an Ethernet MSS).
pub const MSS: usize = 1460;

/// Which endpoint sent a chunk.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dir {
    /// The active opener (TCP client, MPA initiator).
    AtoB,
    /// The passive side.
    BtoA,
}

/// Builds the pcap in memory.
pub struct TcpPcap {
    out: Vec<u8>,
    seq: [u32; 2],
    ports: [u16; 2],
    usec: u32,
}

fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    sum
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl TcpPcap {
    /// A capture of a connection from port `a_port` (side A) to `b_port` (side B).
    pub fn new(a_port: u16, b_port: u16) -> Self {
        let mut out = Vec::new();
        // Global header: magic, v2.4, tz 0, sigfigs 0, snaplen 65535, LINKTYPE_ETHERNET.
        out.extend_from_slice(&0xa1b2c3d4u32.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&4u16.to_le_bytes());
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&65535u32.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        let mut p = TcpPcap {
            out,
            seq: [1000, 5000],
            ports: [a_port, b_port],
            usec: 0,
        };
        p.segment(Dir::AtoB, 0x02, &[]); // SYN
        p.segment(Dir::BtoA, 0x12, &[]); // SYN-ACK
        p.segment(Dir::AtoB, 0x10, &[]); // ACK
        p
    }

    /// Appends `data` sent in direction `dir`, cut into MSS-sized segments.
    pub fn data(&mut self, dir: Dir, data: &[u8]) {
        for chunk in data.chunks(MSS) {
            self.segment(dir, 0x18, chunk); // PSH+ACK
        }
    }

    /// Closes both directions with FIN and returns the pcap bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.segment(Dir::AtoB, 0x11, &[]);
        self.segment(Dir::BtoA, 0x11, &[]);
        self.segment(Dir::AtoB, 0x10, &[]);
        self.out
    }

    fn segment(&mut self, dir: Dir, flags: u8, payload: &[u8]) {
        let (s, d) = match dir {
            Dir::AtoB => (0, 1),
            Dir::BtoA => (1, 0),
        };
        let (smac, dmac, sip, dip) = if s == 0 {
            (MAC_A, MAC_B, IP_A, IP_B)
        } else {
            (MAC_B, MAC_A, IP_B, IP_A)
        };
        let mut tcp = Vec::with_capacity(20 + payload.len());
        tcp.extend_from_slice(&self.ports[s].to_be_bytes());
        tcp.extend_from_slice(&self.ports[d].to_be_bytes());
        tcp.extend_from_slice(&self.seq[s].to_be_bytes());
        let ack = if flags & 0x10 != 0 { self.seq[d] } else { 0 };
        tcp.extend_from_slice(&ack.to_be_bytes());
        tcp.push(5 << 4);
        tcp.push(flags);
        tcp.extend_from_slice(&65535u16.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent
        tcp.extend_from_slice(payload);
        let mut pseudo = Vec::with_capacity(12);
        pseudo.extend_from_slice(&sip);
        pseudo.extend_from_slice(&dip);
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        let c = csum_fold(csum_add(csum_add(0, &pseudo), &tcp));
        tcp[16..18].copy_from_slice(&c.to_be_bytes());

        let mut ip = Vec::with_capacity(20);
        ip.extend_from_slice(&[0x45, 0]);
        ip.extend_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
        ip.extend_from_slice(&sip);
        ip.extend_from_slice(&dip);
        let c = csum_fold(csum_add(0, &ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());

        let mut frame = Vec::with_capacity(14 + ip.len() + tcp.len());
        frame.extend_from_slice(&dmac);
        frame.extend_from_slice(&smac);
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&tcp);

        self.usec += 10;
        self.out.extend_from_slice(&1u32.to_le_bytes());
        self.out.extend_from_slice(&self.usec.to_le_bytes());
        self.out
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&frame).expect("write to Vec");

        let advance = payload.len() as u32 + u32::from(flags & 0x03 != 0); // SYN/FIN count one
        self.seq[s] = self.seq[s].wrapping_add(advance);
    }
}
