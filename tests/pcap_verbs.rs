//! A capture of an `xwarp::verbs` RDMA run (two engines on the virtual wire, capture
//! switched on by `XWARP_PCAP` alone) is read back by tshark: one file per engine, every
//! frame the engine's NIC moved (the NIC's own counters) with its direction, the iWARP
//! layers (`iwarp_mpa`, `iwarp_ddp_rdmap`) dissected with good CRCs and no malformed frame
//! or expert error, and the placed bytes on the wire equal to the data written and read.
//! A capture to a full disk stops with an error while the RDMA run goes on unharmed.

mod verbs_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use verbs_common::*;
use xwarp::poll_driver::backend::Backend;
use xwarp::poll_driver::pcap::{self, CaptureSpec};
use xwarp::poll_driver::vwire::{VirtualNic, WireConfig};
use xwarp::verbs::{CmEvent, CompletionStatus, Context, SendRequest, WcOpcode};

const WRITE_LEN: usize = 100_000;
const READ_LEN: usize = 60_000;
const SEND_LEN: usize = 9_000;

fn tshark_ok() -> bool {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("\n!!!!!!!! SKIPPED pcap_verbs: tshark is not installed (apt-get install tshark) !!!!!!!!\n");
    }
    ok
}

/// `0x00000002`, `2` or empty (0).
fn num(s: &str) -> u64 {
    if s.is_empty() {
        return 0;
    }
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("{s:?}")),
        None => s.parse().unwrap_or_else(|_| panic!("{s:?}")),
    }
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// One row per frame of `fields`, dissected as iWARP.
fn tshark(path: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(path)
        .args(["-o", "tcp.try_heuristic_first:TRUE"])
        .args(["--enable-heuristic", "iwarp_mpa_tcp"])
        .args(["-T", "fields", "-E", "occurrence=a", "-E", "separator=|"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = c.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('|').map(str::to_owned).collect())
        .collect()
}

/// The value of attribute `key` in a PDML line.
fn attr<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=\"");
    let start = line.find(&pat)? + pat.len();
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

/// What the capture shows placed: tagged segments by STag and tagged offset, whole
/// untagged messages (tshark reassembles them) by (queue, MSN).
#[derive(Default)]
struct Placed {
    tagged: BTreeMap<u64, BTreeMap<u64, Vec<u8>>>,
    messages: BTreeMap<(u64, u64), Vec<u8>>,
}

fn placed(path: &Path) -> Placed {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["-o", "tcp.try_heuristic_first:TRUE"])
        .args(["--enable-heuristic", "iwarp_mpa_tcp", "-T", "pdml"])
        .output()
        .expect("run tshark");
    assert!(out.status.success(), "tshark -T pdml failed");
    let mut p = Placed::default();
    let (mut tagged, mut stag, mut to, mut qn, mut msn) = (false, 0, 0, 0, 0);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let (Some(name), show) = (attr(line, "name"), attr(line, "show").unwrap_or("")) else {
            continue;
        };
        match name {
            "iwarp_ddp.tagged_flag" => tagged = show == "1",
            "iwarp_ddp.stag" => stag = num(show),
            "iwarp_ddp.tagged_offset" => to = num(show),
            "iwarp_ddp.qn" => qn = num(show),
            "iwarp_ddp.msn" => msn = num(show),
            "data.data" => {
                let bytes = unhex(attr(line, "value").expect("data value"));
                if tagged {
                    p.tagged.entry(stag).or_default().insert(to, bytes);
                } else {
                    p.messages.insert((qn, msn), bytes);
                }
            }
            _ => {}
        }
    }
    p
}

/// The bytes placed under one STag, from its lowest offset, with no gap.
fn contiguous(segments: &BTreeMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    let base = *segments.keys().next().expect("segments");
    for (to, bytes) in segments {
        assert_eq!(to - base, out.len() as u64, "gap in the placed data");
        out.extend_from_slice(bytes);
    }
    out
}

/// The RDMA run: Send, Write, Read, each verified in memory, then a graceful close.
/// Returns (client engine's NIC, server engine's NIC) after both stopped, and the data.
fn rdma_run(a: Context<VirtualNic>, b: Context<VirtualNic>) -> (VirtualNic, VirtualNic) {
    let (c, s) = connect(&a, &b, 4791, |q| q.mpa.crc = true);
    let cbuf = mr(&c, 1 << 20);
    let sbuf = mr(&s, 1 << 20);

    let send = pattern(SEND_LEN, 11);
    cbuf.write(0, &send).unwrap();
    s.qp.post_recv(1, &[sbuf.sge(0, SEND_LEN).unwrap()])
        .unwrap();
    c.qp.post_send(SendRequest::send(1, vec![cbuf.sge(0, SEND_LEN).unwrap()]))
        .unwrap();
    assert_eq!(wc(&c.scq).status, CompletionStatus::Success);
    let r = wc(&s.rcq);
    assert_eq!(
        (r.status, r.byte_len),
        (CompletionStatus::Success, SEND_LEN as u32)
    );
    assert_eq!(sbuf.to_vec(0, SEND_LEN).unwrap(), send);

    let write = pattern(WRITE_LEN, 22);
    cbuf.write(0, &write).unwrap();
    c.qp.post_send(SendRequest::write(
        2,
        vec![cbuf.sge(0, WRITE_LEN).unwrap()],
        sbuf.rkey(),
        sbuf.addr() + 4096,
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.status, w.opcode),
        (CompletionStatus::Success, WcOpcode::Write)
    );

    let read = pattern(READ_LEN, 33);
    sbuf.write(500_000, &read).unwrap();
    c.qp.post_send(SendRequest::read(
        3,
        cbuf.sge(200_000, READ_LEN).unwrap(),
        sbuf.rkey(),
        sbuf.addr() + 500_000,
    ))
    .unwrap();
    let w = wc(&c.scq);
    assert_eq!(
        (w.status, w.opcode),
        (CompletionStatus::Success, WcOpcode::Read)
    );
    assert_eq!(cbuf.to_vec(200_000, READ_LEN).unwrap(), read);
    // The Write is visible once the Read that follows it completed.
    assert_eq!(sbuf.to_vec(4096, WRITE_LEN).unwrap(), write);

    c.qp.disconnect().unwrap();
    expect_event(&c.qp, &CmEvent::Disconnected);
    expect_event(&s.qp, &CmEvent::Disconnected);
    drop((c, s, cbuf, sbuf));
    // Stopping an engine drops its capture: the file is complete afterwards.
    (a.stop().unwrap(), b.stop().unwrap())
}

/// The capture files in `dir`, by interface name.
fn files_by_interface(dir: &Path) -> BTreeMap<String, PathBuf> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let rows = tshark(&p, &["frame.interface_name"]);
        let name = rows.first().map(|r| r[0].clone()).unwrap_or_default();
        assert!(rows.iter().all(|r| r[0] == name), "{}", p.display());
        assert!(m.insert(name, p).is_none());
    }
    m
}

#[test]
fn an_rdma_run_captured_by_xwarp_pcap_dissects_as_iwarp_with_the_data_on_the_wire() {
    if !tshark_ok() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("xwarp-pcap-verbs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The only switch: the variable (this test binary's only test sets it).
    std::env::set_var(pcap::PCAP_ENV, dir.join("rdma.pcapng"));
    let (a, b) = pair(WireConfig::default());
    std::env::remove_var(pcap::PCAP_ENV);
    let (nic_a, nic_b) = rdma_run(a, b);
    let (sa, sb) = (nic_a.stats(), nic_b.stats());

    let files = files_by_interface(&dir);
    assert_eq!(
        files.keys().map(String::as_str).collect::<Vec<_>>(),
        ["vwire-a", "vwire-b"],
        "one file per engine"
    );
    for (name, st) in [("vwire-a", sa), ("vwire-b", sb)] {
        let rows = tshark(&files[name], &["frame.packet_flags_direction"]);
        let inbound = rows.iter().filter(|r| num(&r[0]) == 1).count() as u64;
        let outbound = rows.iter().filter(|r| num(&r[0]) == 2).count() as u64;
        assert_eq!(
            (inbound, outbound, rows.len() as u64),
            (st.rx_frames, st.tx_frames, st.rx_frames + st.tx_frames),
            "{name}: every frame of the NIC, with its direction"
        );
    }
    // A clean wire: what a sent is what b received.
    assert_eq!(sa.tx_frames, sb.rx_frames);

    let path = &files["vwire-a"];
    let rows = tshark(
        path,
        &[
            "frame.protocols",
            "_ws.malformed",
            "_ws.expert.severity",
            "iwarp_rdma.opcode",
            "iwarp_ddp.stag",
            "iwarp_ddp.tagged_offset",
            "iwarp_mpa.crc_check",
            "tcp.srcport",
            "frame.packet_flags_direction",
        ],
    );
    let p = placed(path);
    let mut bufs: Vec<Vec<u8>> = p.tagged.values().map(contiguous).collect();
    bufs.retain(|b| !b.is_empty());
    bufs.sort_by_key(Vec::len);
    assert_eq!(bufs.len(), 2, "the Write and the Read Response");
    assert!(
        bufs[0] == pattern(READ_LEN, 33),
        "Read Response bytes on the wire differ"
    );
    assert!(
        bufs[1] == pattern(WRITE_LEN, 22),
        "Write bytes on the wire differ"
    );
    let sends: Vec<&Vec<u8>> = p.messages.values().collect();
    assert_eq!(
        sends,
        [&pattern(SEND_LEN, 11)],
        "Send bytes on the wire differ"
    );
    let mut ops = std::collections::BTreeSet::new();
    let (mut mpa, mut ddp) = (0, 0);
    for r in &rows {
        assert!(r[1].is_empty(), "malformed frame: {r:?}");
        for sev in r[2].split(',').filter(|s| !s.is_empty()) {
            // 0x800000: PI_ERROR (epan/proto.h).
            assert!(num(sev) < 0x80_0000, "expert error: {r:?}");
        }
        mpa += r[0].contains("iwarp_mpa") as usize;
        ddp += r[0].contains("iwarp_ddp_rdmap") as usize;
        for op in r[3].split(',').filter(|s| !s.is_empty()) {
            ops.insert(num(op));
        }
    }
    // Write (0), Read Request (1), Read Response (2), Send (3) at least.
    for op in 0..=3 {
        assert!(ops.contains(&op), "opcode {op} not dissected: {ops:?}");
    }
    let fpdus = (SEND_LEN + WRITE_LEN + READ_LEN) / 1500;
    assert!(ddp >= fpdus, "{ddp} frames with DDP/RDMAP, want ≥ {fpdus}");
    assert!(mpa >= ddp, "{mpa} MPA frames, {ddp} DDP frames");
    let _ = std::fs::remove_dir_all(&dir);

    // The same run with the capture on a full disk (every engine's file a link to
    // /dev/full, which fails each write with ENOSPC): no harm to the run.
    std::fs::create_dir_all(&dir).unwrap();
    for e in 0..16 {
        std::os::unix::fs::symlink("/dev/full", dir.join(format!("full-{e}"))).unwrap();
    }
    let full = dir.join("full-%e");
    pcap::set_process_capture(Some(CaptureSpec::new(full.to_str().unwrap())));
    let (a, b) = pair(WireConfig::default());
    pcap::set_process_capture(None);
    let live = pcap::active_captures();
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(live.iter().all(|p| p.starts_with(&dir)), "{live:?}");
    let (na, nb) = rdma_run(a, b);
    let (ta, tb) = (na.stats().tx_frames, nb.stats().tx_frames);
    assert!(
        ta >= sa.tx_frames / 2 && tb >= sb.tx_frames / 2,
        "{ta} {tb}"
    );
    assert!(pcap::active_captures().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
