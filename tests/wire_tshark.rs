//! A back-to-back exchange of two sans-IO Connections (MPA Request/Reply, every RDMAP
//! opcode 0–7) is synthesized into a pcap and dissected by tshark (docs/testing.md §6.3):
//! no malformed packets, no expert errors, "Good" CRCs when CRC is on, and the
//! `iwarp_rdma.opcode` sequence of each direction equals what was sent. Runs with CRC
//! on and off, and with markers on.

#[path = "support/tcp_pcap.rs"]
mod tcp_pcap;
#[path = "../rdmap/tests/conn_util.rs"]
mod util;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use tcp_pcap::{Dir, TcpPcap};
use util::*;
use xwarp_rdmap::conn::ConnConfig;
use xwarp_rdmap::*;

const A_PORT: u16 = 40000;
const B_PORT: u16 = 7174;

/// tshark, installed with apt-get when missing and we are root; `None` (after a loud
/// SKIPPED line) when it cannot be had.
fn tshark() -> Option<PathBuf> {
    let found = || {
        Command::new("tshark")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| PathBuf::from("tshark"))
    };
    if let Some(p) = found() {
        return Some(p);
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    if root {
        let _ = Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=300", "install", "-y", "tshark"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
    }
    let p = found();
    if p.is_none() {
        eprintln!(
            "\n=== SKIPPED wire_tshark: tshark is not installed and cannot be installed ===\n"
        );
    }
    p
}

struct Exchange {
    pcap: Vec<u8>,
    a_to_b: Vec<u8>,
    b_to_a: Vec<u8>,
}

fn send_op(se: bool, inv: Option<Stag>) -> SendOp {
    SendOp::Send {
        solicited: se,
        invalidate: inv,
    }
}

/// Every opcode: Write (3 segments), Read Request, Read Response (2 segments), Send,
/// Send with Invalidate, Send with SE, Send with SE and Invalidate, then a Send without
/// a posted receive, which the Responder answers with a Terminate.
fn exchange(crc: bool, markers: bool) -> Exchange {
    let mut rng = Rng(42);
    let tweak = move |c: &mut ConnConfig| {
        c.initiator.crc = crc;
        c.initiator.markers = markers;
        c.responder.markers = markers;
        c.emss = 1448;
        // One FPDU per poll_transmit, so each becomes its own TCP segment below: the
        // Wireshark dissector finds markers only in FPDU-aligned segments.
        if markers {
            c.tx_burst = 1;
        }
    };
    let (mut a, mut b) = connect(tweak, tweak, &mut rng, 700);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let src: Vec<u8> = (0..4000u32).map(|i| (i * 7 + 3) as u8).collect();
    let a_src = a.reg(0x1_0000, src.clone(), Access::LOCAL_WRITE);
    let a_sink = a.reg(0x2_0000, vec![0; 2500], rw);
    let b_init: Vec<u8> = (0..4000u32).map(|i| (i * 13 + 1) as u8).collect();
    let b_mem = b.reg(0x3_0000, b_init.clone(), rw);
    let sge = |lkey, addr, len| vec![Sge { lkey, addr, len }];
    a.send(
        1,
        SendOp::Write {
            remote_stag: b_mem,
            remote_to: 0x3_0000 + 1000,
        },
        sge(a_src, 0x1_0000, 3000),
    );
    a.send(
        2,
        SendOp::Read {
            remote_stag: b_mem,
            remote_to: 0x3_0000,
        },
        sge(a_sink, 0x2_0000, 900),
    );
    let mut recvs = Vec::new();
    for (k, (se, inv)) in [(false, false), (false, true), (true, false), (true, true)]
        .into_iter()
        .enumerate()
    {
        let len = 100 + 10 * k as u32;
        let rb = b.reg(0x5_0000, vec![0; len as usize], Access::LOCAL_WRITE);
        b.recv(10 + k as u64, sge(rb, 0x5_0000, len));
        recvs.push((rb, len));
        let inv = inv.then(|| b.reg(0x6_0000, vec![0; 8], rw));
        a.send(
            3 + k as u64,
            send_op(se, inv),
            sge(a_src, 0x1_0000 + 7, len),
        );
    }
    pump(&mut a, &mut b, &mut rng, 700, Instant::now());
    // The data moved as sent.
    let mut expect_b = b_init.clone();
    expect_b[1000..4000].copy_from_slice(&src[..3000]);
    assert_eq!(b.mem(b_mem), expect_b);
    assert_eq!(a.mem(a_sink)[..900], b_init[..900]);
    for (rb, len) in recvs {
        assert_eq!(b.mem(rb), src[7..7 + len as usize]);
    }
    let bc = b.completions();
    assert_eq!(bc.len(), 4);
    assert!(bc.iter().all(|c| c.status == CompletionStatus::Success));
    // A Send with no receive posted: the Responder sends a Terminate.
    a.send(9, send_op(false, None), sge(a_src, 0x1_0000, 16));
    pump(&mut a, &mut b, &mut rng, 700, Instant::now());
    assert!(b.conn.is_closed() && a.conn.is_closed());

    let mut chunks: Vec<(u64, Dir, Vec<u8>)> = a
        .chunks
        .iter()
        .map(|(t, c)| (*t, Dir::AtoB, c.clone()))
        .chain(b.chunks.iter().map(|(t, c)| (*t, Dir::BtoA, c.clone())))
        .collect();
    chunks.sort_by_key(|c| c.0);
    let mut pcap = TcpPcap::new(A_PORT, B_PORT);
    for (_, dir, data) in &chunks {
        pcap.data(*dir, data);
    }
    Exchange {
        pcap: pcap.finish(),
        // Write ×3, Read Request, Send, Send+Inv, Send+SE, Send+SE+Inv, Send.
        a_to_b: vec![0, 0, 0, 1, 3, 4, 5, 6, 3],
        // Read Response (900 bytes: one FPDU), Terminate.
        b_to_a: vec![2, 7],
    }
}

fn dissect(name: &str, crc: bool, markers: bool) {
    let Some(tshark) = tshark() else { return };
    let ex = exchange(crc, markers);
    // One directory per test: the tests run in parallel and each removes its own.
    let dir = std::env::temp_dir().join(format!("xwarp-wire-tshark-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.pcap"));
    std::fs::write(&path, &ex.pcap).unwrap();
    let out = Command::new(&tshark)
        .arg("-r")
        .arg(&path)
        .args(["-o", "tcp.try_heuristic_first:TRUE"])
        .args(["--enable-heuristic", "iwarp_mpa_tcp"])
        .args(["-T", "fields", "-E", "occurrence=a", "-E", "separator=|"])
        .args(["-e", "tcp.srcport", "-e", "iwarp_rdma.opcode"])
        .args(["-e", "iwarp_mpa.crc_check", "-e", "_ws.malformed"])
        .args(["-e", "_ws.expert.severity", "-e", "iwarp_mpa.key.req"])
        .args(["-e", "iwarp_mpa.key.rep"])
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{name}:\n{text}");
    let (mut ab, mut ba) = (Vec::new(), Vec::new());
    let (mut good_crcs, mut saw_req, mut saw_rep) = (0, false, false);
    for line in text.lines() {
        let f: Vec<&str> = line.split('|').collect();
        assert!(f.len() >= 7, "unexpected tshark line {line:?}");
        assert!(f[3].is_empty(), "malformed packet: {line}");
        // Expert severities (epan/proto.h): 0x200000 chat, 0x400000 note, 0x600000
        // warning (the harmless MPA v2 Rev/Res notes of docs/testing.md §6.3), 0x800000 error.
        for sev in f[4].split(',').filter(|s| !s.is_empty()) {
            let v: u64 = sev.parse().unwrap_or(0);
            assert!(v < 8_388_608, "expert error: {line}");
        }
        saw_req |= !f[5].is_empty();
        saw_rep |= !f[6].is_empty();
        let ops: Vec<u8> = f[1]
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| u8::from_str_radix(s.trim_start_matches("0x"), 16).unwrap())
            .collect();
        let checked = f[2].split(',').filter(|s| !s.is_empty()).count();
        assert!(
            crc || checked == 0,
            "CRC checked although CRC is off: {line}"
        );
        good_crcs += checked;
        match f[0].parse::<u16>() {
            Ok(A_PORT) => ab.extend(ops),
            Ok(B_PORT) => ba.extend(ops),
            _ => panic!("bad line {line}"),
        }
    }
    assert!(saw_req && saw_rep, "MPA Request/Reply not recognized");
    assert_eq!(ab, ex.a_to_b, "opcodes A→B");
    assert_eq!(ba, ex.b_to_a, "opcodes B→A");
    if crc {
        let fpdus = ex.a_to_b.len() + ex.b_to_a.len();
        assert_eq!(good_crcs, fpdus, "one CRC check per FPDU");
        // The verdict is only in the text tree: "CRC check: 0x… (Good CRC32)".
        let tree = Command::new(&tshark)
            .arg("-r")
            .arg(&path)
            .args(["-o", "tcp.try_heuristic_first:TRUE"])
            .args(["--enable-heuristic", "iwarp_mpa_tcp", "-V"])
            .output()
            .expect("run tshark -V");
        assert!(tree.status.success(), "tshark -V failed");
        let tree = String::from_utf8_lossy(&tree.stdout);
        assert_eq!(
            tree.matches("(Good CRC32)").count(),
            fpdus,
            "Good CRC per FPDU"
        );
        assert!(!tree.contains("Bad CRC"), "a bad CRC");
    }
    if std::env::var_os("XWARP_KEEP_PCAP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn tshark_dissects_every_opcode_crc_off() {
    dissect("crc_off", false, false);
}

#[test]
fn tshark_dissects_every_opcode_crc_on() {
    dissect("crc_on", true, false);
}

#[test]
fn tshark_dissects_every_opcode_markers_on() {
    dissect("markers_on", true, true);
}
