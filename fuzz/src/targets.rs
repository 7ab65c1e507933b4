//! The fuzz targets: each feeds arbitrary bytes to one wire parser.
//!
//! Invariants checked besides "no panic": payload handed out by the FPDU parser never exceeds
//! what the header announced, and a frame that parses re-emits to the same bytes.

use crate::engine::Target;
use std::time::Instant;
use xwarp_ddp::mpa::{
    AcceptParams, Event, FpduEncoder, FpduEvent, FpduParser, FrameParse, FrameRepr,
    InitiatorConfig, Negotiator, ResponderConfig,
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
];

fn frame_corpus() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    // siw rping Request and Reply (iwarp-wire.md §5.3), a CRC request, a Rev 1 request
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
