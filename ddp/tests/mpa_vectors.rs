//! Known-answer tests from docs/protocols.md §5.3 (Request/Reply bytes), docs/testing.md §6.1 (CRC32c) and
//! §6.2 (example FPDUs), byte for byte.

use xwarp_ddp::mpa::crc::{crc32c, crc32c_append, crc_to_trailer};
use xwarp_ddp::mpa::{
    FpduEncoder, FpduEvent, FpduParser, FrameKind, FrameParse, FrameRepr, MpaError,
};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Untagged DDP header (RFC 5041 §4.3) with RDMAP control byte (RFC 5040 §4.1).
fn untagged(last: bool, rdmap_opcode: u8, rsvd_ulp: u32, qn: u32, msn: u32, mo: u32) -> Vec<u8> {
    let mut h = vec![if last { 0x41 } else { 0x01 }, 0x40 | rdmap_opcode];
    h.extend_from_slice(&rsvd_ulp.to_be_bytes());
    h.extend_from_slice(&qn.to_be_bytes());
    h.extend_from_slice(&msn.to_be_bytes());
    h.extend_from_slice(&mo.to_be_bytes());
    h
}

/// Tagged DDP header (RFC 5041 §4.2).
fn tagged(last: bool, rdmap_opcode: u8, stag: u32, to: u64) -> Vec<u8> {
    let mut h = vec![if last { 0xC1 } else { 0x81 }, 0x40 | rdmap_opcode];
    h.extend_from_slice(&stag.to_be_bytes());
    h.extend_from_slice(&to.to_be_bytes());
    h
}

fn rping_info(buf: u64, rkey: u32, size: u32) -> Vec<u8> {
    let mut v = buf.to_be_bytes().to_vec();
    v.extend_from_slice(&rkey.to_be_bytes());
    v.extend_from_slice(&size.to_be_bytes());
    v
}

#[test]
fn rfc3720_b4_crc32c_vectors() {
    let ascending: Vec<u8> = (0u8..32).collect();
    let descending: Vec<u8> = (0u8..32).rev().collect();
    let scsi_read = hex(
        "01c00000 00000000 00000000 00000000 14000000 00000400 00000014 00000018
         28000000 00000000 02000000 00000000",
    );
    let cases: [(&[u8], u32, [u8; 4]); 6] = [
        (b"123456789", 0xE306_9283, [0x83, 0x92, 0x06, 0xe3]),
        (&[0u8; 32], 0x8A91_36AA, [0xaa, 0x36, 0x91, 0x8a]),
        (&[0xffu8; 32], 0x62A8_AB43, [0x43, 0xab, 0xa8, 0x62]),
        (&ascending, 0x46DD_794E, [0x4e, 0x79, 0xdd, 0x46]),
        (&descending, 0x113F_DB5C, [0x5c, 0xdb, 0x3f, 0x11]),
        (&scsi_read, 0xD996_3A56, [0x56, 0x3a, 0x96, 0xd9]),
    ];
    for (input, value, wire) in cases {
        assert_eq!(crc32c(input), value);
        assert_eq!(crc_to_trailer(crc32c(input)), wire);
        // Incremental over every split point gives the same value.
        for split in 0..=input.len() {
            let (a, b) = input.split_at(split);
            assert_eq!(crc32c_append(crc32c(a), b), value);
        }
    }
}

struct Example {
    name: &'static str,
    ulpdu: Vec<u8>,
    fpdu_without_crc: &'static str,
    crc: [u8; 4],
}

fn examples() -> Vec<Example> {
    let send_info = [
        untagged(true, 0x3, 0, 0, 1, 0),
        rping_info(0x0000_559d_4c2a_1000, 0x203, 64),
    ]
    .concat();
    let mut read_req = untagged(true, 0x1, 0, 1, 1, 0);
    read_req.extend_from_slice(&0x101u32.to_be_bytes());
    read_req.extend_from_slice(&0x0000_55d0_e0a0_b000u64.to_be_bytes());
    read_req.extend_from_slice(&64u32.to_be_bytes());
    read_req.extend_from_slice(&0x203u32.to_be_bytes());
    read_req.extend_from_slice(&0x0000_559d_4c2a_1000u64.to_be_bytes());
    let write_rtr = tagged(true, 0x0, 1, 0);
    let hello = [untagged(true, 0x3, 0, 0, 2, 0), b"hello".to_vec()].concat();
    // RFC 5040 layout Terminate: layer LLP (2), EType 0, code 0x02 (CRC error).
    let terminate = [
        untagged(true, 0x7, 0, 2, 1, 0),
        vec![0x20, 0x02, 0x00, 0x00],
    ]
    .concat();
    vec![
        Example {
            name: "send rping info",
            ulpdu: send_info,
            fpdu_without_crc: "00 22 41 43 00000000 00000000 00000001 00000000
                               0000559d4c2a1000 00000203 00000040",
            crc: [0xaf, 0x5d, 0x20, 0x2b],
        },
        Example {
            name: "read request",
            ulpdu: read_req,
            fpdu_without_crc: "00 2e 41 41 00000000 00000001 00000001 00000000 00000101
                               000055d0e0a0b000 00000040 00000203 0000559d4c2a1000",
            crc: [0xa6, 0xbf, 0xb4, 0x74],
        },
        Example {
            name: "zero-length write RTR",
            ulpdu: write_rtr,
            fpdu_without_crc: "00 0e c1 40 00000001 0000000000000000",
            crc: [0xeb, 0xd3, 0x4c, 0x5f],
        },
        Example {
            name: "send hello",
            ulpdu: hello,
            fpdu_without_crc: "00 17 41 43 00000000 00000000 00000002 00000000
                               68 65 6c 6c 6f 00 00 00",
            crc: [0x16, 0xd8, 0xc7, 0x5d],
        },
        Example {
            name: "terminate LLP CRC error",
            ulpdu: terminate,
            fpdu_without_crc: "00 16 41 47 00000000 00000002 00000001 00000000 20 02 00 00",
            crc: [0x7f, 0xe4, 0x25, 0x85],
        },
    ]
}

#[test]
fn iwarp_wire_6_2_example_fpdus_byte_for_byte() {
    for ex in examples() {
        let body = hex(ex.fpdu_without_crc);
        // CRC on: the CRC trailer of the table.
        let mut enc = FpduEncoder::new(true, false);
        assert_eq!(
            enc.encoded_len(ex.ulpdu.len()),
            body.len() + 4,
            "{}",
            ex.name
        );
        let mut out = vec![0xEE; body.len() + 4];
        // DDP header and payload as separate parts: no intermediate copy.
        let hdr_len = if ex.ulpdu[0] & 0x80 != 0 { 14 } else { 18 };
        let n = enc
            .encode(&[&ex.ulpdu[..hdr_len], &ex.ulpdu[hdr_len..]], &mut out)
            .unwrap();
        assert_eq!(n, out.len());
        assert_eq!(&out[..body.len()], &body[..], "{}", ex.name);
        assert_eq!(&out[body.len()..], &ex.crc, "{}", ex.name);
        // CRC off: four zero bytes (siw, docs/mpa.md §1.6).
        let mut enc = FpduEncoder::new(false, false);
        let v = enc.encode_to_vec(&[&ex.ulpdu]).unwrap();
        assert_eq!(&v[..body.len()], &body[..]);
        assert_eq!(&v[body.len()..], &[0, 0, 0, 0]);
    }
}

#[test]
fn iwarp_wire_6_2_example_fpdus_parse_at_every_split() {
    for ex in examples() {
        let mut wire = hex(ex.fpdu_without_crc);
        wire.extend_from_slice(&ex.crc);
        for split in 0..=wire.len() {
            let mut p = FpduParser::new(true, false);
            let mut hdr = None;
            let mut payload = Vec::new();
            let mut ended = false;
            for mut chunk in [&wire[..split], &wire[split..]] {
                while let Some(ev) = p.next(&mut chunk).unwrap() {
                    match ev {
                        FpduEvent::Header(h) => hdr = Some(h),
                        FpduEvent::Payload(s) => payload.extend_from_slice(s),
                        FpduEvent::End => ended = true,
                    }
                }
                assert!(chunk.is_empty());
            }
            let h = hdr.unwrap();
            assert!(ended, "{} split {split}", ex.name);
            assert_eq!(usize::from(h.ulpdu_len), ex.ulpdu.len());
            assert_eq!(
                [h.ddp_header(), &payload[..]].concat(),
                ex.ulpdu,
                "{}",
                ex.name
            );
        }
    }
}

#[test]
fn iwarp_wire_6_2_wrong_crc_is_llp_0x02() {
    let ex = &examples()[0];
    let mut wire = hex(ex.fpdu_without_crc);
    wire.extend_from_slice(&[0xaf, 0x5d, 0x20, 0x2c]);
    let mut p = FpduParser::new(true, false);
    let mut input = &wire[..];
    let err = loop {
        match p.next(&mut input) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error"),
            Err(e) => break e,
        }
    };
    assert!(matches!(
        err,
        MpaError::CrcMismatch {
            received: 0x2c20_5daf,
            ..
        }
    ));
    assert_eq!(err.llp_error_code(), Some(0x02));
}

#[test]
fn iwarp_wire_5_3_siw_rping_request_and_reply_bytes() {
    let request = hex("4d50412049442052 6571204672616d65 10 02 0004 0001 0001");
    match FrameRepr::parse(&request).unwrap() {
        FrameParse::Complete { repr, len } => {
            assert_eq!(len, 24);
            assert_eq!(repr.kind, FrameKind::Request);
            assert!(repr.enhanced && !repr.crc && !repr.markers && !repr.reject);
            assert_eq!(repr.revision, 2);
            let b = repr.enhanced_block.unwrap();
            assert_eq!((b.ird, b.ord, b.p2p), (1, 1, false));
            assert!(repr.private_data.is_empty());
            assert_eq!(repr.to_vec().unwrap(), request);
        }
        other => panic!("{other:?}"),
    }
    let reply = hex("4d50412049442052 6570204672616d65 10 02 0004 0001 0001");
    match FrameRepr::parse(&reply).unwrap() {
        FrameParse::Complete { repr, .. } => {
            assert_eq!(repr.kind, FrameKind::Reply);
            assert_eq!(repr.to_vec().unwrap(), reply);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn iwarp_wire_5_3_chelsio_request_p2p_read_rtr() {
    // "start-req C pdlen 36 mpav2: enhanced - ird 32 ord 1 peer2peer read RTR" (56 bytes).
    let mut f = hex("4d50412049442052 6571204672616d65 50 02 0024 8020 4001");
    f.extend_from_slice(&[0xAB; 32]);
    match FrameRepr::parse(&f).unwrap() {
        FrameParse::Complete { repr, len } => {
            assert_eq!(len, 56);
            assert!(repr.crc && repr.enhanced);
            let b = repr.enhanced_block.unwrap();
            assert!(b.p2p && b.rtr.read && !b.rtr.write && !b.rtr.send);
            assert_eq!((b.ird, b.ord), (32, 1));
            assert_eq!(repr.private_data, &[0xAB; 32][..]);
        }
        other => panic!("{other:?}"),
    }
}

/// The ULPDU of an example FPDU, taken from its literal bytes (after the 2-byte
/// length field, before the pad).
fn literal_ulpdu(ex: &Example) -> Vec<u8> {
    let fpdu = hex(ex.fpdu_without_crc);
    let len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
    fpdu[2..2 + len].to_vec()
}

#[test]
fn rfc5041_segment_view_and_repr_on_the_6_2_examples() {
    use xwarp_ddp::segment::{Packet, SegmentHeader, TaggedHeader, UntaggedHeader};
    let want = [
        SegmentHeader::Untagged(UntaggedHeader {
            last: true,
            rsvd_ulp: 0x43,
            rsvd_ulp_ext: 0,
            qn: 0,
            msn: 1,
            mo: 0,
        }),
        SegmentHeader::Untagged(UntaggedHeader {
            last: true,
            rsvd_ulp: 0x41,
            rsvd_ulp_ext: 0,
            qn: 1,
            msn: 1,
            mo: 0,
        }),
        SegmentHeader::Tagged(TaggedHeader {
            last: true,
            rsvd_ulp: 0x40,
            stag: 1,
            to: 0,
        }),
        SegmentHeader::Untagged(UntaggedHeader {
            last: true,
            rsvd_ulp: 0x43,
            rsvd_ulp_ext: 0,
            qn: 0,
            msn: 2,
            mo: 0,
        }),
        SegmentHeader::Untagged(UntaggedHeader {
            last: true,
            rsvd_ulp: 0x47,
            rsvd_ulp_ext: 0,
            qn: 2,
            msn: 1,
            mo: 0,
        }),
    ];
    let payloads: [&[u8]; 5] = [
        &hex("0000559d4c2a1000 00000203 00000040"),
        &hex("00000101 000055d0e0a0b000 00000040 00000203 0000559d4c2a1000"),
        &[],
        b"hello",
        &[0x20, 0x02, 0x00, 0x00],
    ];
    for ((ex, want), payload) in examples().iter().zip(want).zip(payloads) {
        let ulpdu = literal_ulpdu(ex);
        assert_eq!(ulpdu, ex.ulpdu, "{}", ex.name);
        let p = Packet::new_checked(&ulpdu[..]).unwrap();
        assert_eq!(p.header_len(), want.len(), "{}", ex.name);
        assert_eq!(p.payload(), payload, "{}", ex.name);
        assert_eq!(SegmentHeader::from_packet(&p), Ok(want), "{}", ex.name);
        assert_eq!(SegmentHeader::parse(&ulpdu), Ok(want), "{}", ex.name);
        let mut out = vec![0xee; ulpdu.len()];
        assert_eq!(want.emit(&mut out), Some(want.len()), "{}", ex.name);
        assert_eq!(out[..want.len()], ulpdu[..want.len()], "{}", ex.name);
    }
}
