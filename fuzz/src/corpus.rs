//! The seed inputs of every target, built from the test vectors (siw's frames, the wire
//! notes' FPDUs) and from real exchanges between two [`Connection`]s. `fuzz/corpus/` holds
//! them as files (regenerate with
//! `XWARP_WRITE_CORPUS=1 cargo test -p xwarp-fuzz write_seed_corpus -- --ignored`).

use std::time::Instant;

use xwarp_ddp::mpa::{AcceptParams, FpduEncoder};
use xwarp_rdmap::conn::{ConnConfig, ConnEvent, Connection};
use xwarp_rdmap::{QpConfig, RqConfig};

use crate::targets::Script;

/// The seeds of target `name` (empty for an unknown name).
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "mpa_frame" => frames(),
        "mpa_negotiator" => negotiator(),
        "fpdu" => fpdu(),
        "rdmap_rx" => rdmap_rx(),
        "conn" => conn(),
        "mpa_pending" => pending(),
        "tcp_frames" => tcp(),
        _ => Vec::new(),
    }
}

fn frame(key: &[u8; 16], rest: &[u8]) -> Vec<u8> {
    let mut f = key.to_vec();
    f.extend_from_slice(rest);
    f
}

/// siw rping Request and Reply (docs/iwarp-wire.md §5.3), a CRC request, a Rev 1 request
/// with private data, a reject, and a P2P Read-RTR request.
fn frames() -> Vec<Vec<u8>> {
    vec![
        frame(b"MPA ID Req Frame", &[0x10, 2, 0, 4, 0, 1, 0, 1]),
        frame(b"MPA ID Rep Frame", &[0x10, 2, 0, 4, 0, 1, 0, 1]),
        frame(b"MPA ID Req Frame", &[0x50, 2, 0, 4, 0, 1, 0, 1]),
        frame(
            b"MPA ID Req Frame",
            &[0x40, 1, 0, 5, b'h', b'e', b'l', b'l', b'o'],
        ),
        frame(
            b"MPA ID Rep Frame",
            &[0x30, 2, 0, 6, 0, 1, 0, 1, b'n', b'o'],
        ),
        frame(
            b"MPA ID Req Frame",
            &[0x10, 2, 0, 4, 0x80, 0x20, 0x40, 0x01],
        ),
    ]
}

fn negotiator() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for (i, f) in frames().into_iter().enumerate() {
        // Requests to a Responder (even selector), Replies to an Initiator (odd).
        let role = u8::from(f.starts_with(b"MPA ID Rep"));
        let mut s = vec![role | (i as u8) << 3];
        s.extend_from_slice(&f);
        v.push(s);
    }
    v
}

/// An untagged DDP segment (RDMAP opcode `op`, queue `qn`, MSN `msn`, MO 0).
pub fn untagged(op: u8, qn: u32, msn: u32, last: bool, inv: u32, body: &[u8]) -> Vec<u8> {
    let mut s = vec![if last { 0x41 } else { 0x01 }, 0x40 | op];
    s.extend_from_slice(&inv.to_be_bytes());
    s.extend_from_slice(&qn.to_be_bytes());
    s.extend_from_slice(&msn.to_be_bytes());
    s.extend_from_slice(&0u32.to_be_bytes());
    s.extend_from_slice(body);
    s
}

/// A tagged RDMA Write segment into `stag` at `to`.
pub fn tagged(stag: u32, to: u64, body: &[u8]) -> Vec<u8> {
    let mut s = vec![0xc1, 0x40];
    s.extend_from_slice(&stag.to_be_bytes());
    s.extend_from_slice(&to.to_be_bytes());
    s.extend_from_slice(body);
    s
}

/// A Read Request (MSN `msn`) for `len` bytes of `src_stag`/`src_to` into the peer's
/// `0x1234`/0.
pub fn read_request(msn: u32, src_stag: u32, src_to: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0x1234u32.to_be_bytes());
    b.extend_from_slice(&0u64.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(&src_stag.to_be_bytes());
    b.extend_from_slice(&src_to.to_be_bytes());
    untagged(1, 1, msn, true, 0, &b)
}

/// The ULPDUs a hostile or ordinary peer sends, STags as arena indices (see
/// [`crate::oracle::Arena::stag`]): a Send, a Write into the read+write region, a Read of
/// the read-only region, a Read of the no-access region, a two-segment Send, a Write into
/// the other PD's region, a Send with Invalidate, a Terminate.
fn ulpdus() -> Vec<Vec<u8>> {
    vec![
        untagged(3, 0, 1, true, 0, b"hello, rdmap"),
        tagged(0, 0x1000 + 100, &[0x11; 64]),
        read_request(1, 1, 0x2000, 64),
        read_request(2, 3, 0x4000, 64),
        untagged(3, 0, 2, false, 0, &[0x22; 40]),
        untagged(3, 0, 2, true, 0, &[0x33; 8]),
        tagged(5, 0x1000, &[0x44; 16]),
        untagged(4, 0, 3, true, 0, &[0x55; 4]),
        untagged(7, 2, 1, true, 0, &[0x12, 0x02, 0, 0]),
    ]
}

fn fpdu() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for (crc, markers) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut enc = FpduEncoder::new(crc, markers);
        let mut stream = vec![u8::from(crc) | u8::from(markers) << 1];
        let big = vec![0xabu8; 600];
        let mut parts = ulpdus();
        parts.push(untagged(3, 0, 4, true, 0, &big));
        for p in parts {
            if let Ok(bytes) = enc.encode_to_vec(&[&p]) {
                stream.extend_from_slice(&bytes);
            }
        }
        v.push(stream);
    }
    v
}

fn rdmap_rx() -> Vec<Vec<u8>> {
    let mut one = vec![0u8];
    for s in ulpdus() {
        one.extend_from_slice(&(s.len() as u16).to_be_bytes());
        one.extend_from_slice(&s);
    }
    vec![one]
}

fn cfg(sel: u8) -> ConnConfig {
    let mut c = ConnConfig::new(QpConfig {
        pd: xwarp_rdmap::PdId(1),
        ird: 2,
        ord: 2,
        sq_depth: 8,
        rq: RqConfig::Own(8),
    });
    c.initiator.crc = sel & 2 != 0;
    c.initiator.markers = sel & 4 != 0;
    c.responder.crc = sel & 2 != 0;
    c.responder.markers = sel & 4 != 0;
    if sel & 8 != 0 {
        c.initiator.p2p = Some(xwarp_ddp::mpa::RtrSet::only(if sel & 16 != 0 {
            xwarp_ddp::mpa::RtrType::Read
        } else {
            xwarp_ddp::mpa::RtrType::Write
        }));
    }
    c
}

/// The Request a real Initiator sends and the Reply a real Responder answers it with.
fn handshake(sel: u8) -> (Vec<u8>, Vec<u8>) {
    let now = Instant::now();
    let mut res = xwarp_rdmap::Resources::new();
    let (Ok(mut i), Ok(mut r)) = (
        Connection::initiator(cfg(sel), now),
        Connection::responder(cfg(sel), now),
    ) else {
        return (Vec::new(), Vec::new());
    };
    let mut req = Vec::new();
    while i.poll_transmit(&res, &mut req) > 0 {}
    let _ = r.handle_input(now, &req, &mut res);
    while let Some(e) = r.poll_event() {
        if let ConnEvent::ConnectRequest(_) = e {
            let _ = r.accept(AcceptParams {
                ird: 2,
                ord: 2,
                private_data: Vec::new(),
            });
        }
    }
    let mut rep = Vec::new();
    while r.poll_transmit(&res, &mut rep) > 0 {}
    (req, rep)
}

fn script(sel: u8, extra: Option<u8>, frame: &[u8], ulpdus: &[Vec<u8>]) -> Vec<u8> {
    let mut s = vec![sel];
    s.extend(extra);
    s.extend_from_slice(&Script::raw(frame));
    for u in ulpdus {
        s.extend_from_slice(&Script::ulpdu(u));
    }
    s
}

fn conn() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for sel in [0u8, 2, 4, 6, 8, 24] {
        let (req, rep) = handshake(sel);
        let mut first = Vec::new();
        if sel & 8 != 0 {
            // The P2P Responder waits for the RTR: a zero-length Write (or Read Request).
            first.push(tagged(0x100, 0, &[]));
        }
        first.extend(ulpdus());
        v.push(script(sel | 0x20, None, &req, &first));
        v.push(script(sel | 1, None, &rep, &ulpdus()));
    }
    v
}

fn pending() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for sel in [0u8, 2, 8] {
        let (req, rep) = handshake(sel);
        // Responder: the Request alone, then FPDUs; the accepting QP with other settings.
        v.push(script(sel, Some(sel ^ 2), &req, &ulpdus()));
        // Bytes behind the Request in the same record (replayed to the real Responder).
        let mut behind = req.clone();
        behind.extend_from_slice(&tagged(0, 0x1000, &[0x66; 8]));
        v.push(script(sel, Some(sel), &behind, &ulpdus()));
        // Initiator: pending work, the Reply, the held first FPDU released by the clock.
        let mut s = script(sel | 1, Some(0), &rep, &[]);
        s.extend_from_slice(&Script::wait(10));
        for u in ulpdus() {
            s.extend_from_slice(&Script::ulpdu(&u));
        }
        v.push(s);
    }
    v
}

fn tcp() -> Vec<Vec<u8>> {
    let seg = |flags: u8, len8: u8| {
        let mut r = vec![1, flags, 0, 0, 0, 0, 0xff, 0xff, len8];
        r.truncate(9);
        r
    };
    let mut v = Vec::new();
    // Data, the application reads, the peer closes.
    let mut a = seg(0x08 | 1, 20);
    a.extend_from_slice(&[4, 8, 3, 2]);
    a.extend(seg(0x08 | 3, 4));
    a.extend_from_slice(&[4, 0x20, 3, 200]);
    v.push(a);
    // A window-filling burst, then data+FIN past the window edge (the FIN split).
    let mut b = vec![6, 15, 6, 15, 7, 0x02, 0x00];
    b.extend_from_slice(&[4, 0x40, 3, 50, 4, 0x40]);
    v.push(b);
    // Stalled flow: the application writes, the peer only repeats its ACK (rescue).
    let mut c = vec![4, 0x22];
    for _ in 0..4 {
        c.extend(seg(0x08, 0));
        c.extend_from_slice(&[3, 10]);
    }
    v.push(c);
    // Spoofed pure ACKs and SYNs from other ports, a duplicate SYN, a RST.
    let mut d = Vec::new();
    for p in 0..6u8 {
        d.extend_from_slice(&[2, 0x90, p, 0, 0, 0, 1, 0, 0, 0, 1, 0]);
        d.extend_from_slice(&[2, 0x80, p, 2, 0, 0, 2, 0, 0, 0, 0, 0]);
    }
    d.extend(seg(0x08 | 2, 0));
    d.extend(seg(0x08 | 4, 0));
    v.push(d);
    // A corrupted segment, out-of-order data, and a raw truncated frame.
    let mut e = vec![5, 0x09, 0, 0, 0, 0, 0xff, 0xff, 8, 0, 20, 0x40];
    e.extend_from_slice(&[1, 0x01, 0x05, 0xb4, 0, 0, 0xff, 0xff, 40]);
    e.extend_from_slice(&[0, 0, 20]);
    e.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 1, 0, 8, 0, 0x45, 0, 0, 40, 0, 0, 0, 0]);
    v.push(e);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn corpus_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus")
    }

    #[test]
    #[ignore = "writes fuzz/corpus; run with XWARP_WRITE_CORPUS=1 to regenerate"]
    fn write_seed_corpus() {
        if std::env::var_os("XWARP_WRITE_CORPUS").is_none() {
            return;
        }
        for (name, _) in crate::TARGETS {
            let dir = corpus_dir().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for (i, s) in seeds(name).iter().enumerate() {
                std::fs::write(dir.join(format!("seed-{i:02}")), s).unwrap();
            }
        }
    }

    #[test]
    fn every_target_has_seeds_and_they_run_clean() {
        for (name, run) in crate::TARGETS {
            let s = seeds(name);
            assert!(!s.is_empty(), "{name} has no seeds");
            for input in &s {
                run(input);
            }
        }
    }

    /// The committed corpus (seeds, and regression inputs a campaign found) replays
    /// through every target's oracles on stable.
    #[test]
    fn committed_corpus_replays_clean() {
        let mut files = 0;
        for (name, run) in crate::TARGETS {
            let Ok(dir) = std::fs::read_dir(corpus_dir().join(name)) else {
                panic!("fuzz/corpus/{name} is missing");
            };
            for e in dir.flatten() {
                let input = std::fs::read(e.path()).unwrap();
                run(&input);
                files += 1;
            }
        }
        assert!(files >= crate::TARGETS.len());
    }
}
