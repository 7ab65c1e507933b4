//! FPDU framing and parsing: pad, CRC on/off, markers (RFC 5044 §4–§6), MULPDU sizing,
//! and the error paths of the streaming parser.

use xwarp_ddp::mpa::crc::{crc32c, crc_to_trailer};
use xwarp_ddp::mpa::error::LocalError;
use xwarp_ddp::mpa::{mulpdu, pad_len, FpduEncoder, FpduEvent, FpduParser, MpaError};

/// One parsed FPDU: (DDP header, payload).
type Fpdu = (Vec<u8>, Vec<u8>);

/// Parses everything; returns per-FPDU (ddp header, payload) and the error if any.
fn parse_all(p: &mut FpduParser, chunks: &[&[u8]]) -> (Vec<Fpdu>, Option<MpaError>) {
    let mut out = Vec::new();
    let mut cur: Option<(Vec<u8>, Vec<u8>)> = None;
    for chunk in chunks {
        let mut input = *chunk;
        loop {
            match p.next(&mut input) {
                Ok(None) => break,
                Ok(Some(FpduEvent::Header(h))) => {
                    assert!(cur.is_none());
                    cur = Some((h.ddp_header().to_vec(), Vec::new()));
                }
                Ok(Some(FpduEvent::Payload(s))) => cur.as_mut().unwrap().1.extend_from_slice(s),
                Ok(Some(FpduEvent::End)) => out.push(cur.take().unwrap()),
                Err(e) => return (out, Some(e)),
            }
        }
        assert!(input.is_empty());
    }
    (out, None)
}

fn untagged_hdr(msn: u32) -> Vec<u8> {
    let mut h = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0];
    h.extend_from_slice(&msn.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 0]);
    h
}

#[test]
fn rfc5044_mulpdu_sizing() {
    // Markers off: EMSS − (6 + EMSS mod 4).
    assert_eq!(mulpdu(1448, false), 1442); // siw: Send payload 1424 = 1442 − 18
    assert_eq!(mulpdu(1460, false), 1454);
    assert_eq!(mulpdu(1461, false), 1454);
    assert_eq!(mulpdu(1463, false), 1454);
    // Markers on: additionally − 4·⌈EMSS/512⌉.
    assert_eq!(mulpdu(1448, true), 1442 - 12);
    assert_eq!(mulpdu(1024, true), 1018 - 8);
    assert_eq!(mulpdu(4, false), 0);
    assert_eq!(mulpdu(1 << 20, false), 65535);
    // An FPDU of MULPDU bytes fits one segment, at any stream position with markers.
    for emss in [536usize, 1448, 1460, 4000, 8948, 9000] {
        for markers in [false, true] {
            let m = mulpdu(emss, markers);
            let mut e = FpduEncoder::new(true, markers);
            for _ in 0..600 {
                assert!(e.encoded_len(m) <= emss, "emss {emss} markers {markers}");
                e.encode_to_vec(&[&vec![0x41; m]]).unwrap();
            }
        }
    }
}

#[test]
fn rfc5044_pad_and_crc_coverage() {
    // CRC covers length, ULPDU and pad, not itself.
    let ulpdu = [untagged_hdr(1), b"abc".to_vec()].concat();
    let mut e = FpduEncoder::new(true, false);
    let v = e.encode_to_vec(&[&ulpdu]).unwrap();
    assert_eq!(pad_len(21), 1);
    assert_eq!(v.len(), 2 + 21 + 1 + 4);
    assert_eq!(v[23], 0, "pad byte is zero");
    assert_eq!(&v[24..], &crc_to_trailer(crc32c(&v[..24])));
}

#[test]
fn rfc5044_crc_off_field_never_checked() {
    let mut e = FpduEncoder::new(false, false);
    let mut v = e.encode_to_vec(&[&untagged_hdr(1), b"data"]).unwrap();
    let n = v.len();
    v[n - 4..].copy_from_slice(&[1, 2, 3, 4]);
    let (fpdus, err) = parse_all(&mut FpduParser::new(false, false), &[&v]);
    assert!(err.is_none());
    assert_eq!(fpdus, vec![(untagged_hdr(1), b"data".to_vec())]);
}

#[test]
fn rfc5044_crc_mismatch_is_llp_0x02_and_sticky() {
    let mut e = FpduEncoder::new(true, false);
    let mut v = e.encode_to_vec(&[&untagged_hdr(1), b"data"]).unwrap();
    v[21] ^= 0x01; // a payload bit
    let mut p = FpduParser::new(true, false);
    let (_, err) = parse_all(&mut p, &[&v]);
    let err = err.unwrap();
    assert!(matches!(err, MpaError::CrcMismatch { .. }));
    assert_eq!(err.llp_error_code(), Some(0x02));
    let mut more: &[u8] = &[0, 0];
    assert_eq!(p.next(&mut more), Err(err));
}

#[test]
fn rfc5041_ulpdu_shorter_than_ddp_header_is_an_error() {
    // Untagged needs 18 bytes, tagged 14, and ULPDU_Length 0 has no header at all.
    let cases: [(&[u8], usize); 3] = [
        (&[0, 17, 0x41, 0x43], 18),
        (&[0, 13, 0xC1, 0x40], 14),
        (&[0, 0, 0, 0], 14),
    ];
    for (bytes, header_len) in cases {
        let mut p = FpduParser::new(false, false);
        let (_, err) = parse_all(&mut p, &[bytes]);
        match err {
            Some(MpaError::UlpduTooShort { header_len: h, .. }) => assert_eq!(h, header_len),
            other => panic!("{other:?}"),
        }
        let e = p.error().unwrap();
        assert_eq!(e.terminate_code().layer, 1);
    }
    // Exactly the header: fine, no payload events.
    let mut e = FpduEncoder::new(true, false);
    let v = e
        .encode_to_vec(&[&[0xC1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]])
        .unwrap();
    let mut p = FpduParser::new(true, false);
    let mut input = &v[..];
    assert!(
        matches!(p.next(&mut input).unwrap(), Some(FpduEvent::Header(h)) if h.payload_len() == 0)
    );
    assert_eq!(p.next(&mut input).unwrap(), Some(FpduEvent::End));
}

#[test]
fn rfc5041_header_length_from_tagged_bit() {
    let mut e = FpduEncoder::new(true, false);
    let tagged = [0x81u8, 0x40, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 1, 0];
    let v1 = e.encode_to_vec(&[&tagged, b"xyz"]).unwrap();
    let v2 = e.encode_to_vec(&[&untagged_hdr(3), b"xyz"]).unwrap();
    let all = [v1, v2].concat();
    let (fpdus, err) = parse_all(&mut FpduParser::new(true, false), &[&all]);
    assert!(err.is_none());
    assert_eq!(fpdus[0], (tagged.to_vec(), b"xyz".to_vec()));
    assert_eq!(fpdus[1], (untagged_hdr(3), b"xyz".to_vec()));
}

#[test]
fn encode_parts_equal_concatenation_and_write_in_place() {
    let hdr = untagged_hdr(9);
    let payload: Vec<u8> = (0..1000u32).map(|x| x as u8).collect();
    let mut a = FpduEncoder::new(true, true);
    let mut b = FpduEncoder::new(true, true);
    // Encode directly into a slice of a larger (TCP send) buffer.
    let mut ring = vec![0xAA; 4096];
    let len = a.encoded_len(hdr.len() + payload.len());
    let n = a
        .encode(
            &[&hdr, &payload[..300], &payload[300..]],
            &mut ring[100..100 + len],
        )
        .unwrap();
    assert_eq!(n, len);
    let whole = b
        .encode_to_vec(&[&[hdr.clone(), payload.clone()].concat()])
        .unwrap();
    assert_eq!(&ring[100..100 + n], &whole[..]);
    assert_eq!(ring[99], 0xAA);
    assert_eq!(ring[100 + n], 0xAA);
}

#[test]
fn encode_errors_leave_state_unchanged() {
    let mut e = FpduEncoder::new(true, true);
    let mut small = [0u8; 10];
    let err = e.encode(&[&untagged_hdr(1)], &mut small).unwrap_err();
    assert!(matches!(
        err,
        MpaError::Local(LocalError::BufferTooSmall {
            needed: 28,
            available: 10
        })
    ));
    assert_eq!(small, [0; 10]);
    assert_eq!(e.stream_position(), 0);
    let big = vec![0u8; 65536];
    assert_eq!(
        e.encode_to_vec(&[&big]).unwrap_err(),
        MpaError::Local(LocalError::UlpduTooLong(65536))
    );
    // 65535 works without markers, but its FPDUPTR would not fit 16 bits with markers.
    let max = vec![0x41u8; 65535];
    assert!(FpduEncoder::new(true, false).encode_to_vec(&[&max]).is_ok());
    assert_eq!(
        e.encode_to_vec(&[&max]).unwrap_err(),
        MpaError::Local(LocalError::FpduTooLongForMarkers)
    );
}

#[test]
fn rfc5044_markers_every_512_bytes_with_fpduptr() {
    let mut e = FpduEncoder::new(true, true);
    let mut wire = Vec::new();
    let mut starts = Vec::new();
    let mut expected = Vec::new();
    for (k, len) in [0usize, 100, 490, 506, 1500, 3, 2000, 7]
        .into_iter()
        .enumerate()
    {
        starts.push(wire.len());
        let payload = vec![k as u8; len];
        wire.extend(
            e.encode_to_vec(&[&untagged_hdr(k as u32), &payload])
                .unwrap(),
        );
        expected.push((untagged_hdr(k as u32), payload));
    }
    assert_eq!(e.stream_position(), wire.len() as u64);
    assert_eq!(
        &wire[..4],
        &[0, 0, 0, 0],
        "S0 starts with a marker, FPDUPTR 0"
    );
    // Every 512th byte is a marker pointing back at its FPDU's start.
    for m in (0..wire.len()).step_by(512) {
        let start = *starts.iter().filter(|&&s| s <= m).max().unwrap();
        let ptr = u16::from_be_bytes([wire[m + 2], wire[m + 3]]) as usize;
        assert_eq!(&wire[m..m + 2], &[0, 0]);
        assert_eq!(ptr, m - start, "marker at {m}");
    }
    // Parsing strips the markers, at every split.
    for split in (0..wire.len()).step_by(37) {
        let (fpdus, err) = parse_all(
            &mut FpduParser::new(true, true),
            &[&wire[..split], &wire[split..]],
        );
        assert!(err.is_none(), "{err:?}");
        assert_eq!(fpdus, expected);
    }
    // Byte at a time.
    let chunks: Vec<&[u8]> = wire.chunks(1).collect();
    let (fpdus, err) = parse_all(&mut FpduParser::new(true, true), &chunks);
    assert!(err.is_none());
    assert_eq!(fpdus, expected);
}

#[test]
fn rfc5044_marker_mismatch_is_llp_0x03() {
    let mut e = FpduEncoder::new(false, true);
    let mut wire = e.encode_to_vec(&[&untagged_hdr(1), &[5u8; 1000]]).unwrap();
    assert_eq!(u16::from_be_bytes([wire[514], wire[515]]), 512);
    wire[515] ^= 0x04;
    let (_, err) = parse_all(&mut FpduParser::new(false, true), &[&wire]);
    let err = err.unwrap();
    assert_eq!(
        err,
        MpaError::MarkerMismatch {
            expected: 512,
            found: 516
        }
    );
    assert_eq!(err.llp_error_code(), Some(0x03));
}

#[test]
fn rfc5044_markers_are_covered_by_crc() {
    let mut e = FpduEncoder::new(true, true);
    let mut wire = e.encode_to_vec(&[&untagged_hdr(1), &[5u8; 1000]]).unwrap();
    // Flip a bit in the marker's reserved field: FPDUPTR still right, CRC catches it.
    wire[512] ^= 0x80;
    let (_, err) = parse_all(&mut FpduParser::new(true, true), &[&wire]);
    assert!(matches!(err, Some(MpaError::CrcMismatch { .. })));
}

#[test]
fn payload_slices_borrow_the_input() {
    let mut e = FpduEncoder::new(true, false);
    let payload = vec![0x5A; 4000];
    let wire = e.encode_to_vec(&[&untagged_hdr(1), &payload]).unwrap();
    let mut p = FpduParser::new(true, false);
    let mut input = &wire[..];
    assert!(matches!(
        p.next(&mut input).unwrap(),
        Some(FpduEvent::Header(_))
    ));
    match p.next(&mut input).unwrap() {
        Some(FpduEvent::Payload(s)) => {
            assert_eq!(s.len(), 4000);
            assert_eq!(
                s.as_ptr(),
                wire[20..].as_ptr(),
                "zero-copy slice of the input"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.next(&mut input).unwrap(), Some(FpduEvent::End));
    assert!(input.is_empty() && p.is_idle());
}

#[test]
fn rfc5044_marker_inside_ddp_header_is_crc_covered_in_stream_order() {
    // First FPDU: marker + 496 bytes ends at 500; the second FPDU's header then spans
    // the marker at 512 (found by the property test).
    let mut e = FpduEncoder::new(true, true);
    let a = e.encode_to_vec(&[&untagged_hdr(1), &[1u8; 469]]).unwrap();
    assert_eq!(a.len(), 500);
    let b = e.encode_to_vec(&[&untagged_hdr(2)]).unwrap();
    assert_eq!(b.len(), 28);
    assert_eq!(
        &b[12..16],
        &[0, 0, 0, 12],
        "marker at 512, 12 bytes into the FPDU"
    );
    let wire = [a, b].concat();
    for split in 0..wire.len() {
        let (fpdus, err) = parse_all(
            &mut FpduParser::new(true, true),
            &[&wire[..split], &wire[split..]],
        );
        assert!(err.is_none(), "split {split}: {err:?}");
        assert_eq!(fpdus[1], (untagged_hdr(2), vec![]));
    }
}
