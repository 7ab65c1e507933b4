//! The targets that feed bytes to the MPA, DDP and RDMAP code (the TCP frame target is in
//! [`crate::tcp`]).
//!
//! Input layouts (byte 0 is always a selector):
//! * `mpa_frame`: one MPA Request/Reply frame; a frame that parses re-emits to itself.
//! * `mpa_negotiator`: selector bit 0 picks the role, the rest the chunk size.
//! * `fpdu`: bit 0 CRC, bit 1 markers, the rest the chunk size; payload handed out never
//!   exceeds what the header announced.
//! * `rdmap_rx`: `[len u16][DDP segment]...` fed to a QP in RTS (header, payload in
//!   chunks, end), with the [`Arena`] oracles.
//! * `conn` and `mpa_pending`: a script of records, see [`Script`], fed to a whole
//!   [`Connection`] with the [`Arena`] oracles.

use std::time::{Duration, Instant};

use xwarp_ddp::mpa::{
    AcceptParams, Event, FpduEncoder, FpduEvent, FpduParser, FrameParse, FrameRepr,
    InitiatorConfig, Negotiator, ResponderConfig, RtrSet, RtrType,
};
use xwarp_rdmap::conn::{ConnConfig, ConnEvent, Connection};
use xwarp_rdmap::{QpConfig, QueuePair, RqConfig, SendOp, SendWr, Sge, Stag};

use crate::cursor::Cursor;
use crate::oracle::{Arena, REGION_LEN, RW};

pub fn mpa_frame(input: &[u8]) {
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

pub fn mpa_negotiator(input: &[u8]) {
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

pub fn fpdu(input: &[u8]) {
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

// ------------------------------------------------------------------ rdmap_rx

fn qp_config(arena: &Arena) -> QpConfig {
    QpConfig {
        pd: arena.pd,
        ird: 2,
        ord: 2,
        sq_depth: 8,
        rq: RqConfig::Own(8),
    }
}

/// Length-prefixed DDP segments into one QP in RTS (see the module doc).
pub fn rdmap_rx(input: &[u8]) {
    let mut cur = Cursor::new(input);
    let sel = cur.u8();
    let mut arena = Arena::new();
    let mut qp = QueuePair::new(qp_config(&arena));
    let _ = qp.set_rts();
    for wr in arena.recvs.clone() {
        let _ = qp.post_recv(wr);
    }
    let split = 1 + usize::from(sel) % 23;
    let mut tx = Vec::new();
    while !cur.is_empty() {
        let n = usize::from(cur.u16());
        let mut seg = cur.take(n).to_vec();
        arena.translate_segment(&mut seg);
        let Some(&first) = seg.first() else { continue };
        let hlen = xwarp_ddp::segment::header_len(first);
        if seg.len() < hlen {
            continue;
        }
        // Header, then the payload in pieces, as the FPDU parser hands them out.
        if qp
            .on_header_bytes(&mut arena.res, &seg[..hlen], seg.len())
            .is_ok()
        {
            for chunk in seg[hlen..].chunks(split) {
                if qp.on_payload(&mut arena.res, chunk).is_err() {
                    break;
                }
            }
            let _ = qp.on_end(&mut arena.res);
        }
        // Drive the send side too (Read Responses, Terminates).
        for _ in 0..16 {
            let r = qp.poll_segment(&arena.res, 1024, |h, p| {
                tx.extend_from_slice(h);
                tx.extend_from_slice(&p.to_vec());
                h.len() + p.len()
            });
            match r {
                Ok(Some(n)) => assert!(n <= 1024, "segment of {n} bytes for a 1024-byte room"),
                _ => break,
            }
        }
        while qp.poll_completion().is_some() {}
        while qp.poll_event().is_some() {}
        arena.check_writes();
    }
    arena.check_leak(&tx, input);
}

// ------------------------------------------------------------------ conn / mpa_pending

/// The record script of the `conn` and `mpa_pending` targets, after the selector byte(s):
/// * `0x00..=0x7f`: raw stream bytes, `(tag & 0x7f) + 1` of them follow (MPA frames,
///   garbage, torn FPDUs).
/// * `0x80..=0xbf`: one ULPDU (`u16` length, then the DDP segment) that the script frames
///   as an FPDU with the negotiated CRC and markers (STags translated by
///   [`Arena::translate_segment`]); raw while the connection is not open yet.
/// * `0xc0..=0xff`: advance the clock by `tag & 0x3f` milliseconds and run the timers.
///
/// Selector bits: 0 role (1 = Initiator), 1 CRC, 2 markers, 3 P2P (a Write RTR, a Read
/// RTR with bit 4), 5..7 the chunk size the stream is fed in.
pub struct Script;

impl Script {
    /// A raw-bytes record set carrying `bytes`.
    pub fn raw(bytes: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        for c in bytes.chunks(128) {
            v.push((c.len() - 1) as u8);
            v.extend_from_slice(c);
        }
        v
    }

    /// A ULPDU record.
    pub fn ulpdu(seg: &[u8]) -> Vec<u8> {
        let mut v = vec![0x80];
        v.extend_from_slice(&(seg.len() as u16).to_be_bytes());
        v.extend_from_slice(seg);
        v
    }

    /// A clock record.
    pub fn wait(ms: u8) -> Vec<u8> {
        vec![0xc0 | (ms & 0x3f)]
    }
}

fn conn_config(arena: &Arena, sel: u8, hold: bool) -> ConnConfig {
    let mut cfg = ConnConfig::new(qp_config(arena));
    let crc = sel & 2 != 0;
    let markers = sel & 4 != 0;
    cfg.initiator.crc = crc;
    cfg.initiator.markers = markers;
    cfg.responder.crc = crc;
    cfg.responder.markers = markers;
    if sel & 8 != 0 {
        let rtr = if sel & 16 != 0 {
            RtrType::Read
        } else {
            RtrType::Write
        };
        cfg.initiator.p2p = Some(RtrSet::only(rtr));
    }
    if hold {
        cfg.first_fpdu_delay = Duration::from_millis(5);
    }
    cfg.emss = 256;
    cfg
}

/// One side under test, the peer's framing state, and the bytes it transmitted.
struct Drive {
    arena: Arena,
    conn: Connection,
    /// The peer's encoder, made when the connection opens.
    peer_enc: Option<FpduEncoder>,
    tx: Vec<u8>,
    step: usize,
    now: Instant,
    /// Accept a Connect Request (false for the probe of the pending path).
    accept: bool,
}

impl Drive {
    fn new(sel: u8, cfg_sel: u8, hold: bool) -> Option<Drive> {
        let arena = Arena::new();
        let now = Instant::now();
        let cfg = conn_config(&arena, cfg_sel, hold);
        let conn = if sel & 1 == 0 {
            Connection::responder(cfg, now)
        } else {
            Connection::initiator(cfg, now)
        }
        .ok()?;
        let mut d = Drive {
            arena,
            conn,
            peer_enc: None,
            tx: Vec::new(),
            step: 1 + usize::from(sel >> 5) * 9,
            now,
            accept: true,
        };
        for wr in d.arena.recvs.clone() {
            let _ = d.conn.post_recv(wr);
        }
        d.pump();
        Some(d)
    }

    fn pump(&mut self) {
        while let Some(e) = self.conn.poll_event() {
            if let (ConnEvent::ConnectRequest(_), true) = (e, self.accept) {
                let _ = self.conn.accept(AcceptParams {
                    ird: 2,
                    ord: 2,
                    private_data: Vec::new(),
                });
            }
        }
        let mut out = Vec::new();
        while self.conn.poll_transmit(&self.arena.res, &mut out) > 0 {}
        self.tx.extend_from_slice(&out);
        while self.conn.poll_completion().is_some() {}
        if self.peer_enc.is_none() {
            if let Some(n) = self.conn.negotiated() {
                self.peer_enc = Some(FpduEncoder::new(n.crc, n.markers_rx));
            }
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(self.step) {
            let _ = self.conn.handle_input(self.now, chunk, &mut self.arena.res);
            self.pump();
        }
        if !bytes.is_empty() {
            self.arena.check_writes();
        }
    }

    /// The stream bytes of the next record (`None`: a clock record, already applied).
    fn next_record(&mut self, cur: &mut Cursor) -> Option<Vec<u8>> {
        let tag = cur.u8();
        match tag {
            0x00..=0x7f => Some(cur.take(usize::from(tag & 0x7f) + 1).to_vec()),
            0x80..=0xbf => {
                let n = usize::from(cur.u16());
                let mut seg = cur.take(n).to_vec();
                self.arena.translate_segment(&mut seg);
                match self.peer_enc.as_mut().map(|e| e.encode_to_vec(&[&seg])) {
                    Some(Ok(f)) => Some(f),
                    Some(Err(_)) => Some(Vec::new()),
                    None => Some(seg),
                }
            }
            _ => {
                self.now += Duration::from_millis(u64::from(tag & 0x3f));
                self.conn.handle_timeout(self.now);
                self.pump();
                None
            }
        }
    }

    fn finish(mut self, input: &[u8]) {
        self.conn.handle_timeout(self.now + Duration::from_secs(60));
        self.conn.handle_peer_closed();
        self.pump();
        self.arena.check_writes();
        self.arena.check_leak(&self.tx, input);
    }
}

/// A whole iWARP [`Connection`] fed a peer's stream (see [`Script`]).
pub fn conn(input: &[u8]) {
    let mut cur = Cursor::new(input);
    let sel = cur.u8();
    let Some(mut d) = Drive::new(sel, sel, false) else {
        return;
    };
    while !cur.is_empty() {
        if let Some(bytes) = d.next_record(&mut cur) {
            d.feed(&bytes);
        }
    }
    d.finish(input);
}

/// Most bytes the pending path keeps for the replay (the engine bounds it likewise).
const MAX_PENDING_RAW: usize = 4096;

/// The MPA pending/replay path, after the selector a second byte (the accepting QP's
/// settings, or the peer STag index of the Initiator's pending Write).
///
/// Responder (selector bit 0 clear), as the verbs engine does it: a probe Responder parses
/// what arrives until it reports the Request, keeping every byte; then a Responder with the
/// accepting QP's settings replays the kept bytes (bytes behind the Request included),
/// accepts, and gets the rest of the script (a P2P Responder holds its Established until
/// the first FPDU). Initiator: work is posted before the Reply (pending sends and
/// receives) and the first FPDU is held back by `first_fpdu_delay` until a clock record
/// passes it.
pub fn mpa_pending(input: &[u8]) {
    let mut cur = Cursor::new(input);
    let sel = cur.u8();
    let second = cur.u8();
    if sel & 1 == 0 {
        if let Some((probe, real)) = pending_responder(sel, second, &mut cur) {
            probe.finish(input);
            if let Some(r) = real {
                r.finish(input);
            }
        }
        return;
    }
    let Some(mut d) = Drive::new(sel, sel, true) else {
        return;
    };
    // Posted before the connection opens: the pending queues.
    let rw = d.arena.regions[RW].clone();
    let _ = d.conn.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: vec![Sge {
            lkey: rw.stag,
            addr: rw.base,
            len: 200,
        }],
        signaled: true,
        fence: false,
    });
    let _ = d.conn.post_send(SendWr {
        wr_id: 2,
        op: SendOp::Write {
            remote_stag: Stag(u32::from(second) << 8 | 1),
            remote_to: 0x1000,
        },
        sgl: vec![Sge {
            lkey: rw.stag,
            addr: rw.base + 8,
            len: (REGION_LEN / 2) as u32,
        }],
        signaled: true,
        fence: false,
    });
    d.pump();
    while !cur.is_empty() {
        if let Some(bytes) = d.next_record(&mut cur) {
            d.feed(&bytes);
        }
    }
    d.finish(input);
}

/// The probe and, once it reported the Request, the Responder that replayed its bytes.
fn pending_responder(sel: u8, second: u8, cur: &mut Cursor) -> Option<(Drive, Option<Drive>)> {
    let mut probe = Drive::new(sel, sel, false)?;
    probe.accept = false;
    let mut raw = Vec::new();
    let mut real: Option<Drive> = None;
    let mut dead = false;
    while !cur.is_empty() {
        if let Some(r) = real.as_mut() {
            if let Some(bytes) = r.next_record(cur) {
                r.feed(&bytes);
            }
            continue;
        }
        let Some(bytes) = probe.next_record(cur) else {
            continue;
        };
        if dead || raw.len() + bytes.len() > MAX_PENDING_RAW {
            dead = true;
            continue;
        }
        raw.extend_from_slice(&bytes);
        for chunk in bytes.chunks(probe.step) {
            let _ = probe
                .conn
                .handle_input(probe.now, chunk, &mut probe.arena.res);
            while let Some(e) = probe.conn.poll_event() {
                match e {
                    ConnEvent::ConnectRequest(_) if real.is_none() => {
                        // The accepting QP's settings may differ from the probe's.
                        if let Some(mut r) = Drive::new(sel, second & !1, false) {
                            r.feed(&raw);
                            real = Some(r);
                        }
                    }
                    ConnEvent::Error(_) | ConnEvent::Closed => dead = true,
                    _ => {}
                }
            }
        }
        probe.arena.check_writes();
    }
    Some((probe, real))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::{OTHER_RW, RECV};

    /// The seeds reach real state: the connection opens, the Write lands, the Send lands
    /// in its SGEs, the Read of the read-only region is answered.
    #[test]
    fn conn_seeds_open_and_place() {
        for (k, input) in crate::corpus::seeds("conn").iter().enumerate() {
            let mut cur = Cursor::new(input);
            let sel = cur.u8();
            let mut d = Drive::new(sel, sel, false).unwrap();
            while !cur.is_empty() {
                if let Some(b) = d.next_record(&mut cur) {
                    d.feed(&b);
                }
            }
            assert!(d.conn.negotiated().is_some(), "seed {k}: never opened");
            let rw = d.arena.bytes(RW);
            assert_eq!(&rw[100..164], &[0x11; 64][..], "seed {k}: Write not placed");
            let recv = d.arena.bytes(RECV);
            assert_eq!(&recv[16..28], b"hello, rdmap", "seed {k}: Send not placed");
            assert_eq!(d.arena.bytes(OTHER_RW), d.arena.regions[OTHER_RW].fill);
            let ro = d.arena.regions[crate::oracle::RO].fill.clone();
            let found = d.tx.windows(64).any(|w| w == &ro[..64]);
            assert!(found || sel & 4 != 0, "seed {k}: no Read Response");
            d.finish(input);
        }
    }

    /// The pending path's Responder seeds get the replayed Request accepted and the
    /// FPDUs after it placed; bytes behind the Request in the replay fail it instead.
    #[test]
    fn pending_seeds_replay_and_place() {
        let mut checked = 0;
        for (k, input) in crate::corpus::seeds("mpa_pending").iter().enumerate() {
            let mut cur = Cursor::new(input);
            let sel = cur.u8();
            let second = cur.u8();
            if sel & 9 != 0 {
                continue;
            }
            let (probe, real) = pending_responder(sel, second, &mut cur).unwrap();
            let r = real.unwrap_or_else(|| panic!("seed {k}: no replayed Responder"));
            if k % 3 == 1 {
                // Bytes behind the Request before the Reply: the replay fails the
                // connection (docs/iwarp-wire.md §4.5) and places nothing.
                assert_eq!(r.arena.bytes(RW), r.arena.regions[RW].fill, "seed {k}");
            } else {
                assert!(
                    r.conn.negotiated().is_some(),
                    "seed {k}: replay did not open"
                );
                assert_eq!(&r.arena.bytes(RW)[100..164], &[0x11; 64][..], "seed {k}");
            }
            probe.finish(input);
            r.finish(input);
            checked += 1;
        }
        assert!(checked >= 2);
    }
}
