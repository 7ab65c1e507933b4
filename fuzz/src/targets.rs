//! The fuzz targets: each feeds arbitrary bytes to one wire parser.
//!
//! Invariants checked besides "no panic": payload handed out by the FPDU parser never exceeds
//! what the header announced, a frame that parses re-emits to the same bytes, and the RDMAP
//! receiver (alone, `rdmap-rx`, or behind a whole Connection, `conn`) never writes outside
//! the regions that allow it: every write lands inside its region (checked by the region
//! itself) and regions without write access keep their canary bytes.

use crate::engine::Target;
use std::time::Instant;
use xwarp_ddp::mpa::{
    AcceptParams, Event, FpduEncoder, FpduEvent, FpduParser, FrameParse, FrameRepr,
    InitiatorConfig, Negotiator, ResponderConfig,
};
use xwarp_rdmap::conn::{ConnConfig, ConnEvent, Connection};
use xwarp_rdmap::{
    Access, PdId, PostError, QpConfig, QueuePair, RecvWr, RegionMemory, Resources, RqConfig,
    SendOp, SendWr, Sge, Stag,
};

/// Every target, in the order `--all` runs them.
pub static ALL: &[Target] = &[
    Target {
        name: "mpa-frame",
        corpus: frame_corpus,
        run: run_frame,
    },
    Target {
        name: "mpa-negotiator",
        corpus: frame_corpus,
        run: run_negotiator,
    },
    Target {
        name: "fpdu",
        corpus: fpdu_corpus,
        run: run_fpdu,
    },
    Target {
        name: "rdmap-rx",
        corpus: rdmap_rx_corpus,
        run: run_rdmap_rx,
    },
    Target {
        name: "conn",
        corpus: conn_corpus,
        run: run_conn,
    },
];

fn frame_corpus() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    // siw rping Request and Reply (docs/protocols.md §5.3), a CRC request, a Rev 1 request
    // with private data, a reject, and a P2P Read-RTR request.
    let hdr = |key: &[u8; 16], rest: &[u8]| {
        let mut f = key.to_vec();
        f.extend_from_slice(rest);
        f
    };
    v.push(hdr(b"MPA ID Req Frame", &[0x10, 2, 0, 4, 0, 1, 0, 1]));
    v.push(hdr(b"MPA ID Rep Frame", &[0x10, 2, 0, 4, 0, 1, 0, 1]));
    v.push(hdr(b"MPA ID Req Frame", &[0x50, 2, 0, 4, 0, 1, 0, 1]));
    v.push(hdr(
        b"MPA ID Req Frame",
        &[0x40, 1, 0, 5, b'h', b'e', b'l', b'l', b'o'],
    ));
    v.push(hdr(
        b"MPA ID Rep Frame",
        &[0x30, 2, 0, 6, 0, 1, 0, 1, b'n', b'o'],
    ));
    v.push(hdr(
        b"MPA ID Req Frame",
        &[0x10, 2, 0, 4, 0x80, 0x20, 0x40, 0x01],
    ));
    v
}

fn run_frame(input: &[u8]) {
    if let Ok(FrameParse::Complete { repr, len }) = FrameRepr::parse(input) {
        assert!(len <= input.len());
        if let Ok(bytes) = repr.to_vec() {
            // Re-parsing what we emit must give the same frame back.
            match FrameRepr::parse(&bytes) {
                Ok(FrameParse::Complete { repr: again, .. }) => assert_eq!(again, repr),
                other => panic!("emitted frame does not parse: {other:?}"),
            }
        }
    }
}

fn run_negotiator(input: &[u8]) {
    let now = Instant::now();
    // The first byte picks the role and how the input is split.
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let mut n = if sel & 1 == 0 {
        match Negotiator::responder(ResponderConfig::default(), now) {
            Ok(n) => n,
            Err(_) => return,
        }
    } else {
        match Negotiator::initiator(InitiatorConfig::default(), now) {
            Ok(n) => n,
            Err(_) => return,
        }
    };
    let step = 1 + (sel as usize >> 1) % 31;
    let mut off = 0;
    while off < rest.len() {
        let end = (off + step).min(rest.len());
        match n.handle_input(now, &rest[off..end]) {
            Ok(used) => {
                assert!(used <= end - off);
                // Bytes the negotiator leaves unconsumed belong to the FPDU stream: skip them.
                off += if used == 0 { end - off } else { used };
            }
            Err(_) => break,
        }
        while let Some(ev) = n.poll_event() {
            if let Event::ConnectRequest(_) = ev {
                let _ = n.accept(AcceptParams::default());
            }
        }
        while n.poll_transmit().is_some() {}
    }
}

fn fpdu_corpus() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for (crc, markers) in [(false, false), (true, false), (true, true)] {
        let mut enc = FpduEncoder::new(crc, markers);
        let mut stream = vec![u8::from(crc) | u8::from(markers) << 1];
        // Send "hello" (untagged), a zero-length RTR Write (tagged), a Read Request.
        let send: &[u8] = &[0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0];
        let write: &[u8] = &[0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut rreq = vec![0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
        rreq.extend_from_slice(&[
            0, 0, 1, 1, 0, 0, 0x55, 0xd0, 0xe0, 0xa0, 0xb0, 0, 0, 0, 0, 0x40,
        ]);
        rreq.extend_from_slice(&[0, 0, 2, 3, 0, 0, 0x55, 0x9d, 0x4c, 0x2a, 0x10, 0]);
        let big = vec![0xabu8; 1500];
        for parts in [
            vec![send, b"hello"],
            vec![write],
            vec![&rreq[..]],
            vec![send, &big[..]],
        ] {
            if let Ok(bytes) = enc.encode_to_vec(&parts) {
                stream.extend_from_slice(&bytes);
            }
        }
        v.push(stream);
    }
    v
}

fn run_fpdu(input: &[u8]) {
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let mut parser = FpduParser::new(sel & 1 != 0, sel & 2 != 0);
    let step = 1 + (sel as usize >> 2) % 64;
    let mut announced = 0usize;
    let mut seen = 0usize;
    for chunk in rest.chunks(step) {
        let mut cur = chunk;
        loop {
            match parser.next(&mut cur) {
                Ok(Some(FpduEvent::Header(h))) => {
                    announced = h.payload_len();
                    seen = 0;
                }
                Ok(Some(FpduEvent::Payload(p))) => {
                    seen += p.len();
                    assert!(
                        seen <= announced,
                        "parser handed out more payload than announced"
                    );
                }
                Ok(Some(FpduEvent::End)) => assert_eq!(seen, announced),
                Ok(None) | Err(_) => break,
            }
        }
        if parser.error().is_some() {
            return;
        }
    }
}

// ------------------------------------------------------------------ rdmap-rx / conn

/// Region memory that checks every write is inside it (a write outside would be a
/// placement bug even if the slice access happened not to panic).
struct Guarded(Vec<u8>);

impl RegionMemory for Guarded {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn write_at(&mut self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.0.len()),
            "write outside a region: {offset}+{}",
            data.len()
        );
        self.0[offset..offset + data.len()].copy_from_slice(data);
    }
    fn read_into(&self, offset: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self.0[offset..offset + dst.len()]);
    }
}

const CANARY: u8 = 0xa5;
const RX_BASE: u64 = 0x1000;

/// Resources with a writable region (STag 0x101, TO 0x1000, 4 KiB, any remote access),
/// a read-only canary region (0x201) and a no-access canary region (0x301); receives
/// posted into the writable region. Returns the canary STags.
fn rx_resources(res: &mut Resources, pd: PdId) -> [Stag; 2] {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let reg = |res: &mut Resources, acc, base| {
        res.stags
            .register(pd, acc, base, Box::new(Guarded(vec![CANARY; 4096])))
            .unwrap_or(Stag(0))
    };
    let _ = reg(res, rw, RX_BASE);
    let ro = reg(res, Access::REMOTE_READ, 0x10_000);
    let none = reg(res, Access::NONE, 0x20_000);
    [ro, none]
}

fn post_rx_recvs(post: &mut dyn FnMut(RecvWr) -> Result<(), PostError>) {
    for i in 0..4u32 {
        let _ = post(RecvWr {
            wr_id: u64::from(i),
            sgl: vec![Sge {
                lkey: Stag(0x101),
                addr: RX_BASE + u64::from(i) * 512,
                len: 512,
            }],
        });
    }
}

fn check_canaries(res: &Resources, canaries: &[Stag]) {
    for s in canaries {
        if let Some(r) = res.stags.region(*s) {
            assert!(
                r.memory().read_at(0, r.len()).iter().all(|&b| b == CANARY),
                "a region without write access was written"
            );
        }
    }
}

fn rx_qp(pd: PdId) -> QueuePair {
    let mut qp = QueuePair::new(QpConfig {
        pd,
        ird: 2,
        ord: 2,
        sq_depth: 8,
        rq: RqConfig::Own(8),
    });
    let _ = qp.set_rts();
    qp
}

/// Length-prefixed DDP segments: Send (MSN 1, 2), Write, Read Request, Terminate.
fn rdmap_rx_corpus() -> Vec<Vec<u8>> {
    let untagged = |op: u8, qn: u32, msn: u32, last: bool, body: &[u8]| {
        let mut s = vec![if last { 0x41 } else { 0x01 }, 0x40 | op, 0, 0, 0, 0];
        s.extend_from_slice(&qn.to_be_bytes());
        s.extend_from_slice(&msn.to_be_bytes());
        s.extend_from_slice(&0u32.to_be_bytes());
        s.extend_from_slice(body);
        s
    };
    let mut write = vec![0xc1, 0x40, 0, 0, 1, 1];
    write.extend_from_slice(&(RX_BASE + 100).to_be_bytes());
    write.extend_from_slice(&[0x11; 64]);
    let mut rreq = Vec::new();
    rreq.extend_from_slice(&[0, 0, 0, 1]);
    rreq.extend_from_slice(&0x5000u64.to_be_bytes());
    rreq.extend_from_slice(&64u32.to_be_bytes());
    rreq.extend_from_slice(&[0, 0, 1, 1]);
    rreq.extend_from_slice(&RX_BASE.to_be_bytes());
    let segs = [
        untagged(3, 0, 1, true, b"hello, rdmap"),
        write,
        untagged(1, 1, 1, true, &rreq),
        untagged(5, 0, 2, false, &[0x22; 40]),
        untagged(5, 0, 2, true, &[0x33; 8]),
        untagged(7, 2, 1, true, &[0x12, 0x02, 0, 0]),
    ];
    let mut one = vec![0u8];
    for s in &segs {
        one.extend_from_slice(&(s.len() as u16).to_be_bytes());
        one.extend_from_slice(s);
    }
    vec![one]
}

fn run_rdmap_rx(input: &[u8]) {
    let Some((&sel, mut rest)) = input.split_first() else {
        return;
    };
    let mut res = Resources::with_stags(xwarp_rdmap::StagTable::sequential());
    let pd = res.stags.alloc_pd();
    let canaries = rx_resources(&mut res, pd);
    let mut qp = rx_qp(pd);
    post_rx_recvs(&mut |wr| qp.post_recv(wr));
    let split = 1 + usize::from(sel) % 23;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let seg = &rest[2..2 + n];
        rest = &rest[2 + n..];
        let Some(&first) = seg.first() else { continue };
        let hlen = xwarp_ddp::segment::header_len(first);
        if seg.len() < hlen {
            continue;
        }
        // Header, then the payload in pieces, as the FPDU parser hands them out.
        if qp
            .on_header_bytes(&mut res, &seg[..hlen], seg.len())
            .is_ok()
        {
            for chunk in seg[hlen..].chunks(split) {
                let _ = qp.on_payload(&mut res, chunk);
            }
            let _ = qp.on_end(&mut res);
        }
        // Drive the send side too (Read Responses, Terminates).
        for _ in 0..8 {
            match qp.poll_segment(&res, 1024, |h, p| h.len() + p.len()) {
                Ok(Some(n)) => assert!(n <= 1024),
                _ => break,
            }
        }
        while qp.poll_completion().is_some() {}
        while qp.poll_event().is_some() {}
    }
    check_canaries(&res, &canaries);
}

fn conn_config(pd: PdId, crc: bool) -> ConnConfig {
    let mut cfg = ConnConfig::new(QpConfig {
        pd,
        ird: 2,
        ord: 2,
        sq_depth: 8,
        rq: RqConfig::Own(8),
    });
    cfg.initiator.crc = crc;
    cfg.emss = 256;
    cfg
}

/// Byte streams of a real exchange: for the responder, the initiator's Request and FPDUs
/// (Send, Write, Read Request into the responder's regions); for the initiator, the
/// responder's Reply and FPDUs. Byte 0 selects the role (bit 0), CRC (bit 1) and the split.
fn conn_corpus() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for crc in [false, true] {
        let now = Instant::now();
        let mut ires = Resources::with_stags(xwarp_rdmap::StagTable::sequential());
        let ipd = ires.stags.alloc_pd();
        let mut rres = Resources::with_stags(xwarp_rdmap::StagTable::sequential());
        let rpd = rres.stags.alloc_pd();
        let _ = rx_resources(&mut rres, rpd);
        let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let Ok(src) = ires
            .stags
            .register(ipd, rw, RX_BASE, Box::new(vec![0x42u8; 4096]))
        else {
            continue;
        };
        let (Ok(mut i), Ok(mut r)) = (
            Connection::initiator(conn_config(ipd, crc), now),
            Connection::responder(conn_config(rpd, crc), now),
        ) else {
            continue;
        };
        post_rx_recvs(&mut |wr| r.post_recv(wr));
        let sge = |len| {
            vec![Sge {
                lkey: src,
                addr: RX_BASE,
                len,
            }]
        };
        let wr = |wr_id, op, len| SendWr {
            wr_id,
            op,
            sgl: sge(len),
            signaled: true,
            fence: false,
        };
        let _ = i.post_send(wr(
            1,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            300,
        ));
        let _ = i.post_send(wr(
            2,
            SendOp::Write {
                remote_stag: Stag(0x101),
                remote_to: RX_BASE + 8,
            },
            600,
        ));
        let _ = i.post_send(wr(
            3,
            SendOp::Read {
                remote_stag: Stag(0x101),
                remote_to: RX_BASE,
            },
            500,
        ));
        let (mut to_r, mut to_i) = (vec![u8::from(crc) << 1], vec![1 | u8::from(crc) << 1]);
        for _ in 0..50 {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            while i.poll_transmit(&ires, &mut a) > 0 {}
            while r.poll_transmit(&rres, &mut b) > 0 {}
            if a.is_empty() && b.is_empty() {
                break;
            }
            let _ = r.handle_input(now, &a, &mut rres);
            let _ = i.handle_input(now, &b, &mut ires);
            to_r.extend_from_slice(&a);
            to_i.extend_from_slice(&b);
            while let Some(e) = r.poll_event() {
                if let ConnEvent::ConnectRequest(_) = e {
                    let _ = r.accept(AcceptParams {
                        ird: 2,
                        ord: 2,
                        private_data: Vec::new(),
                    });
                }
            }
            while i.poll_event().is_some() {}
        }
        v.push(to_r);
        v.push(to_i);
    }
    v
}

fn run_conn(input: &[u8]) {
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let now = Instant::now();
    let mut res = Resources::with_stags(xwarp_rdmap::StagTable::sequential());
    let pd = res.stags.alloc_pd();
    let canaries = rx_resources(&mut res, pd);
    let cfg = conn_config(pd, sel & 2 != 0);
    let conn = if sel & 1 == 0 {
        Connection::responder(cfg, now)
    } else {
        Connection::initiator(cfg, now)
    };
    let Ok(mut c) = conn else { return };
    post_rx_recvs(&mut |wr| c.post_recv(wr));
    let step = 1 + usize::from(sel >> 2) % 61;
    let mut out = Vec::new();
    for chunk in rest.chunks(step) {
        let _ = c.handle_input(now, chunk, &mut res);
        while let Some(e) = c.poll_event() {
            if let ConnEvent::ConnectRequest(_) = e {
                let _ = c.accept(AcceptParams {
                    ird: 2,
                    ord: 2,
                    private_data: Vec::new(),
                });
            }
        }
        out.clear();
        while c.poll_transmit(&res, &mut out) > 0 {
            out.clear();
        }
        while c.poll_completion().is_some() {}
    }
    c.handle_timeout(now + std::time::Duration::from_secs(30));
    c.handle_peer_closed();
    while c.poll_event().is_some() {}
    check_canaries(&res, &canaries);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_corpus_streams_carry_frames_and_fpdus() {
        let c = conn_corpus();
        assert_eq!(c.len(), 4);
        for s in &c {
            // Selector + 24-byte Request/Reply + FPDUs (the 300-byte Send alone is >300).
            assert!(s.len() > 1 + 24 + 300, "stream of {} bytes", s.len());
            assert!(s[1..].starts_with(b"MPA ID Re"));
        }
        for s in &c {
            run_conn(s);
        }
    }

    #[test]
    fn rdmap_rx_corpus_runs_clean() {
        for s in rdmap_rx_corpus() {
            run_rdmap_rx(&s);
        }
    }

    #[test]
    #[should_panic(expected = "write outside a region")]
    fn guarded_region_catches_out_of_bounds_writes() {
        Guarded(vec![0; 4]).write_at(2, &[1, 2, 3]);
    }
}
