//! The text screen of `xwarp stat`.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use xwarp_telemetry::layout::{ip_text, mode_name, tcp_state_name, MODE_VWIRE, NA};
use xwarp_telemetry::reader::{EngineSnapshot, Liveness};
use xwarp_telemetry::{QpRecord, TermCode};

use super::Scan;

/// `n` bytes with a binary unit.
fn bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or("n/a".into(), |v| v.to_string())
}

fn us(v: Option<u64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if v >= 10_000 => format!("{:.1}ms", v as f64 / 1000.0),
        Some(v) => format!("{v}us"),
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn ago(unix_ns: u64) -> String {
    let now = xwarp_telemetry::unix_ns();
    if unix_ns == 0 {
        return "never".into();
    }
    let d = now.saturating_sub(unix_ns);
    if d < 10_000_000_000 {
        format!("{} ms ago", d / 1_000_000)
    } else {
        format!("{} s ago", d / 1_000_000_000)
    }
}

fn term(t: Option<TermCode>) -> String {
    t.map_or("-".into(), |t| {
        format!("{}/{:#04x}/{:#04x}", t.layer, t.etype, t.code)
    })
}

/// Rows under a header, columns aligned; numbers right-aligned.
fn table(out: &mut String, indent: &str, head: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = (usize, String)>| {
        let mut s = String::from(indent);
        for (i, c) in cells {
            let numeric = c.starts_with(|ch: char| ch.is_ascii_digit()) && i > 1;
            if numeric {
                let _ = write!(s, "{c:>width$}  ", width = w[i]);
            } else {
                let _ = write!(s, "{c:<width$}  ", width = w[i]);
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(out, &mut head.iter().map(|h| h.to_string()).enumerate());
    for r in rows {
        line(out, &mut r.iter().cloned().enumerate());
    }
}

fn rate(
    prev: Option<&(Instant, EngineSnapshot)>,
    now: &EngineSnapshot,
    f: fn(&EngineSnapshot) -> u64,
) -> String {
    match prev {
        Some((_, p)) if now.updated_unix_ns > p.updated_unix_ns => {
            let dt = (now.updated_unix_ns - p.updated_unix_ns) as f64 / 1e9;
            let d = f(now).saturating_sub(f(p)) as f64;
            format!(" ({}/s)", bytes((d / dt) as u64))
        }
        _ => String::new(),
    }
}

fn engine(out: &mut String, e: &EngineSnapshot, prev: Option<&(Instant, EngineSnapshot)>) {
    let up = xwarp_telemetry::unix_ns().saturating_sub(e.created_unix_ns) as f64 / 1e9;
    let state = match e.liveness {
        Liveness::Stopped => "  STOPPING",
        Liveness::OtherNamespace => "  (another pid namespace)",
        _ => "",
    };
    let _ = writeln!(
        out,
        "engine {}/{}  {}  {}  {}  up {up:.1}s  updated {}{state}",
        e.pid,
        e.index,
        e.program,
        if e.interface.is_empty() {
            "-"
        } else {
            &e.interface
        },
        if e.address.is_empty() {
            "-"
        } else {
            &e.address
        },
        ago(e.updated_unix_ns),
    );
    let l = &e.engine;
    let _ = writeln!(
        out,
        "  loop  iterations {} (busy {})  sleeps {} (cancelled {})  wakeups: doorbell {} backend {} timeout {}  soft errors {}",
        l.iterations,
        pct(l.busy_iterations, l.iterations),
        l.sleeps,
        l.sleeps_cancelled,
        l.wakeups_doorbell,
        l.wakeups_backend,
        l.wakeups_timeout,
        l.backend_soft_errors,
    );
    // Segment values are whatever the file says: never let them overflow.
    let busy = l
        .run_ns
        .saturating_sub(l.spin_ns.saturating_add(l.sleep_ns));
    let _ = writeln!(
        out,
        "        time: busy {} spin {} sleep {}  doorbell rings {} (syscalls {})",
        pct(busy, l.run_ns),
        pct(l.spin_ns, l.run_ns),
        pct(l.sleep_ns, l.run_ns),
        l.doorbell_rings,
        l.doorbell_syscalls,
    );
    let n = &e.nic;
    let copy = match n.zero_copy {
        1 => " zero-copy",
        0 => " copy",
        _ => "",
    };
    let mb = if n.multi_buffer == 1 {
        " multi-buffer"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "  nic   {}{copy}{mb}  rx {} frames {}{}  tx {} frames {}{}  dropped {}",
        mode_name(n.mode),
        n.rx_frames,
        bytes(n.rx_bytes),
        rate(prev, e, |s| s.nic.rx_bytes),
        n.tx_frames,
        bytes(n.tx_bytes),
        rate(prev, e, |s| s.nic.tx_bytes),
        n.dropped,
    );
    if n.mode == MODE_VWIRE {
        let _ = writeln!(
            out,
            "        wire faults {}",
            opt((n.wire_faults != NA).then_some(n.wire_faults))
        );
    } else if n.zero_copy != NA {
        let _ = writeln!(
            out,
            "        rx-ring-full {}  fill-ring-empty {}  tx-ring-empty {}  tx-no-buffer {}  rx-dropped {} (backend {})  invalid rx {} tx {}  csum-offload {}  chains in-place {} copied {}",
            n.xsk_rx_ring_full,
            n.xsk_fill_ring_empty,
            n.xsk_tx_ring_empty,
            n.tx_no_buffer,
            n.xsk_rx_dropped,
            n.rx_dropped_backend,
            n.xsk_rx_invalid_descs,
            n.xsk_tx_invalid_descs,
            n.tx_csum_offloaded,
            n.rx_chains_in_place,
            n.rx_chains_copied,
        );
    }
    let s = &e.stack;
    let _ = writeln!(
        out,
        "  tcp   established {} accepted {} resets {}  tx {} rx {}  conns {} (hosted {}) sockets {} buffers {}  listeners {}  syn-drops {} refused {} expired {}",
        s.established,
        s.accepted,
        s.resets,
        bytes(s.tx_bytes),
        bytes(s.rx_bytes),
        s.connections,
        s.hosted_connections,
        s.sockets,
        bytes(s.socket_buffer_bytes),
        s.listeners,
        s.syn_dropped_backlog,
        s.refused_limit,
        s.syn_received_expired,
    );
    conns(out, e);
    qps(out, e);
}

fn fit_note(dropped: u64, consistent: bool, published: u64) -> String {
    let mut s = format!(", published {}", ago(published));
    if dropped > 0 {
        let _ = write!(s, ", {dropped} more did not fit");
    }
    if !consistent {
        s.push_str(", UNREADABLE: the engine was always mid-update");
    }
    s
}

fn conns(out: &mut String, e: &EngineSnapshot) {
    let t = &e.conns;
    let _ = writeln!(
        out,
        "  connections: {}{}",
        t.records.len(),
        fit_note(t.dropped, t.consistent, t.published_unix_ns)
    );
    if t.records.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = t
        .records
        .iter()
        .map(|r| {
            vec![
                tcp_state_name(r.state).to_string() + if r.hosted { "*" } else { "" },
                format!("{} -> {}", ip_text(r.local), ip_text(r.remote)),
                bytes(r.bytes_sent),
                bytes(r.bytes_acked),
                bytes(r.bytes_received),
                format!("{}/{}", r.send_queue, r.send_buffer),
                format!("{}/{}", r.recv_queue, r.recv_buffer),
                match (r.rx_ring_used, r.tx_ring_used) {
                    (Some(a), Some(b)) => format!("{a}/{b}"),
                    _ => "-".into(),
                },
                r.retransmits.to_string(),
                us(r.srtt_us),
                us(r.rttvar_us),
                us(r.rto_us),
                opt(r.cwnd),
                r.mss.to_string(),
            ]
        })
        .collect();
    table(
        out,
        "    ",
        &[
            "STATE",
            "LOCAL -> REMOTE",
            "SENT",
            "ACKED",
            "RECEIVED",
            "SEND-Q/BUF",
            "RECV-Q/BUF",
            "RINGS rx/tx",
            "RETRANS",
            "SRTT",
            "RTTVAR",
            "RTO",
            "CWND",
            "MSS",
        ],
        &rows,
    );
    if t.records.iter().any(|r| r.hosted) {
        out.push_str("    (* owned by the in-engine protocol host: an iWARP connection)\n");
    }
}

fn qps(out: &mut String, e: &EngineSnapshot) {
    let t = &e.qps;
    if t.records.is_empty() && e.stack.hosted_connections == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "  queue pairs: {}{}",
        t.records.len(),
        fit_note(t.dropped, t.consistent, t.published_unix_ns)
    );
    if t.records.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = t.records.iter().map(qp_row).collect();
    table(
        out,
        "    ",
        &[
            "QPN",
            "STATE",
            "LOCAL -> REMOTE",
            "MPA",
            "IRD/ORD",
            "POSTED s/r",
            "DONE",
            "FLUSHED",
            "SENT",
            "PLACED",
            "PLACEMENTS t/u",
            "READS",
            "CRC-ERR",
            "TERM s/r",
            "LAST-TERM s",
            "LAST-TERM r",
        ],
        &rows,
    );
}

fn qp_row(q: &QpRecord) -> Vec<String> {
    let mpa = format!(
        "r{}{}{}",
        q.mpa_revision,
        if q.crc { " crc" } else { " no-crc" },
        if q.markers { " markers" } else { "" }
    );
    vec![
        q.qp_num.to_string(),
        q.state.name().into(),
        format!("{} -> {}", ip_text(q.local), ip_text(q.remote)),
        mpa,
        format!("{}/{}", q.ird, q.ord),
        format!("{}/{}", q.wr_posted_send, q.wr_posted_recv),
        q.wr_completed.to_string(),
        q.wr_flushed.to_string(),
        bytes(q.bytes_sent),
        bytes(q.bytes_placed),
        format!("{}/{}", q.placements_tagged, q.placements_untagged),
        q.read_requests_served.to_string(),
        q.crc_errors.to_string(),
        format!("{}/{}", q.terminates_sent, q.terminates_received),
        term(q.last_terminate_sent),
        term(q.last_terminate_received),
    ]
}

/// The whole screen of one scan into `out`.
pub(super) fn screen(
    out: &mut String,
    dir: &Path,
    s: &Scan,
    prev: &HashMap<PathBuf, (Instant, EngineSnapshot)>,
    pid: Option<u32>,
) {
    let mut pids: Vec<u32> = s.engines.iter().map(|e| e.pid).collect();
    pids.dedup();
    let _ = writeln!(
        out,
        "xwarp stat: {} engine{} in {} process{} ({}){}",
        s.engines.len(),
        if s.engines.len() == 1 { "" } else { "s" },
        pids.len(),
        if pids.len() == 1 { "" } else { "es" },
        dir.display(),
        pid.map_or(String::new(), |p| format!(", pid {p}")),
    );
    for e in &s.engines {
        out.push('\n');
        engine(out, e, prev.get(&e.path));
    }
    if !s.stale.is_empty() {
        out.push('\n');
        for (p, pid, i, why) in &s.stale {
            let _ = writeln!(out, "stale: {} (engine {pid}/{i}: {why})", p.display());
        }
        out.push_str("remove them with `xwarp stat --clean`\n");
    }
    for (p, e) in &s.errors {
        let _ = writeln!(out, "unreadable: {}: {e}", p.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xwarp_telemetry::reader::Table;
    use xwarp_telemetry::{EngineCounters, NicCounters, StackCounters};

    fn snapshot(engine: EngineCounters) -> EngineSnapshot {
        EngineSnapshot {
            path: PathBuf::from("/dev/shm/xwarp-1-0"),
            version: 1,
            pid: 1,
            index: 0,
            program: "p".into(),
            interface: "vwire".into(),
            address: "10.0.0.1/24".into(),
            liveness: Liveness::Alive,
            created_unix_ns: 1,
            updated_unix_ns: 1,
            engine,
            nic: NicCounters::default(),
            stack: StackCounters::default(),
            conns: Table::default(),
            qps: Table::default(),
        }
    }

    #[test]
    fn render_does_not_overflow_on_huge_segment_values() {
        let mut out = String::new();
        let e = snapshot(EngineCounters {
            run_ns: 100,
            spin_ns: u64::MAX,
            sleep_ns: 2,
            iterations: u64::MAX,
            busy_iterations: u64::MAX,
            ..EngineCounters::default()
        });
        engine(&mut out, &e, None);
        assert!(out.contains("time: busy 0.0%"), "{out}");
        let mut later = e.clone();
        later.updated_unix_ns = u64::MAX;
        let mut out = String::new();
        engine(&mut out, &later, Some(&(Instant::now(), e)));
        assert!(out.contains("engine 1/0"), "{out}");
    }
}
