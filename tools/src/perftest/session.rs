//! One connection's session: the client connects with its parameters and runs the test;
//! the server checks the parameters, accepts, serves and reports.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xwarp::poll_driver::backend::Backend;

use xwarp::verbs::{CmEvent, ConnectParams, Context};

use super::bw::*;
use super::lat::*;
use super::opts::*;
use super::pattern::*;
use super::proto::*;
use super::report::Measured;
use super::side::*;
use crate::bench::report::Report;

/// How a report describes the run.
pub(super) struct Info<'a> {
    pub(super) transport: &'a str,
    pub(super) mtu: usize,
    pub(super) crc: bool,
    pub(super) tx_depth: usize,
}

pub(super) fn header(p: &Params, info: &Info<'_>) -> String {
    let line = "-".repeat(87);
    let on = |b: bool| if b { "ON" } else { "OFF" };
    format!(
        "{line}\n                    {}\n Number of qps   : {}\t\tTransport type : IW (xwarp, {})\n TX depth        : {}\n Mtu             : {}[B]\n CRC (MPA)       : {}\n Data verify     : {}\n Data ex. method : rdma_cm (MPA private data)\n{line}\n",
        p.test.title(),
        p.qps,
        info.transport,
        info.tx_depth,
        info.mtu,
        on(info.crc),
        on(p.verify),
    )
}

/// What a run produced: the perftest-style report, and (a client's) the same numbers as a
/// report of the bench schema `xwarp-bench/1` (bench `perftest`).
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The perftest-style report, as printed.
    pub text: String,
    /// The client's measurements; `None` for a server (it prints the client's results).
    pub report: Option<Report>,
}

/// The bench report of a client's run: the rows of `m` and the run's configuration.
fn bench_report(
    started: (Report, Instant),
    p: &Params,
    o: &Opts,
    m: &Measured,
    info: &Info<'_>,
) -> Report {
    let (mut r, t0) = started;
    let kind = if o.veth {
        "veth"
    } else if o.vwire {
        "vwire"
    } else {
        "iface"
    };
    r.config("test", p.test.name());
    r.config("size", p.size as u64);
    match p.duration {
        Some(d) => r.config("duration_s", d.as_secs_f64()),
        None => r.config("iterations", p.iters),
    }
    r.config("qps", p.qps as u64);
    r.config("tx_depth", info.tx_depth as u64);
    r.config("crc", info.crc);
    r.config("crc_requested", o.crc);
    r.config("verify", p.verify);
    r.config("transport", kind);
    r.config("transport_detail", info.transport);
    r.config("mtu", info.mtu as u64);
    r.config("port", o.port);
    if let Some(i) = &o.iface {
        r.config("iface", i.as_str());
    }
    if o.vwire {
        r.config("loss", o.loss);
    }
    for row in m.rows(p.test) {
        r.push(row);
    }
    r.finish(t0);
    r
}

/// Connect the client's QPs to `server`, run the client's part, exchange DONE/FIN.
pub(super) fn client_session<B: Backend + Send + 'static>(
    ctx: &Context<B>,
    test: Test,
    o: &Opts,
    server: SocketAddr,
    transport: &str,
) -> Result<Outcome, String> {
    let started = (Report::new("perftest"), Instant::now());
    let p = Params::of(test, o);
    let c = make_side(ctx, p.qps, o.tx_depth, p.buf_len(false)?, o.crc)?;
    // Receives first: the server may send as soon as the connection is up.
    match test {
        Test::SendBw => {
            for i in 0..p.qps {
                for k in 0..CTRL_RX {
                    post_ctrl_recv(&c, i, k)?;
                }
            }
        }
        Test::SendLat => {}
        _ => post_ctrl_recv(&c, 0, 0)?,
    }
    let mine = Remote::of(&c.buf);
    for (i, q) in c.qps.iter().enumerate() {
        q.connect(
            server,
            ConnectParams {
                private_data: encode_request(&p, i, &mine),
                timeout: SILENCE,
            },
        )
        .map_err(e2s)?;
    }
    let mut remote = None;
    let mut crc = o.crc;
    for q in &c.qps {
        match q.next_event(SILENCE + Duration::from_secs(2)) {
            Ok(CmEvent::Established {
                private_data,
                crc: used,
                ..
            }) => {
                remote = Some(decode_accept(&private_data, &p)?);
                crc = used;
            }
            Ok(CmEvent::Rejected { private_data }) => {
                return Err(format!(
                    "the server at {server} rejected the connection: {}",
                    decode_reject(&private_data)
                ))
            }
            Ok(CmEvent::ConnectError(e)) => return Err(format!("cannot connect to {server}: {e}")),
            Ok(e) => return Err(format!("connecting to {server}: {e:?}")),
            Err(e) => return Err(format!("cannot connect to {server}: {e}")),
        }
    }
    let remote = remote.ok_or("no QP")?;
    let run = match test {
        Test::WriteBw | Test::ReadBw => rdma_bw_client(&p, o.tx_depth, &c, &remote),
        Test::SendBw => send_bw_client(&p, o.tx_depth, &c),
        Test::WriteLat => write_lat_client(&p, &c, &remote),
        Test::ReadLat => read_lat_client(&p, &c, &remote),
        Test::SendLat => send_lat_client(&p, &c),
    }
    .and_then(|(m, posted)| {
        let text = m.text();
        client_finish(&p, &c, &posted, &text)?;
        Ok((m, text))
    });
    for q in &c.qps {
        let _ = q.disconnect();
    }
    let (m, text) = run?;
    // Let the disconnects go out before the engine stops.
    let deadline = Instant::now() + Duration::from_secs(2);
    for q in &c.qps {
        while let Ok(e) = q.next_event(deadline.saturating_duration_since(Instant::now())) {
            if e == CmEvent::Disconnected {
                break;
            }
        }
    }
    let info = Info {
        transport,
        mtu: ctx.stack().config().mtu,
        crc,
        tx_depth: o.tx_depth,
    };
    Ok(Outcome {
        text: format!("{}{text}", header(&p, &info)),
        report: Some(bench_report(started, &p, o, &m, &info)),
    })
}

/// Send DONE on every QP (after its data), then wait for the server's FIN.
pub(super) fn client_finish(
    p: &Params,
    c: &Side,
    posted: &[u64],
    text: &str,
) -> Result<(), String> {
    if p.test == Test::SendLat {
        post_ctrl_recv(c, 0, 0)?;
    }
    for i in 0..c.qps.len() {
        let t = if i == 0 { text } else { "" };
        let n = posted.get(i).copied().unwrap_or(0);
        send_ctrl(c, i, MSG_DONE, n, t, CTRL_WR | wr_id(i, 0))?;
    }
    let deadline = Instant::now() + 3 * SILENCE;
    // A failed Send (the server closed after an error) counts only if no FIN explains it.
    let mut send_err = None;
    loop {
        while let Some(w) = c.scq.poll_one() {
            if let Err(e) = check(&w) {
                send_err.get_or_insert(e);
            }
        }
        match c.rcq.next(Duration::from_millis(200)) {
            Ok(wc) => {
                check(&wc).map_err(|e| send_err.clone().unwrap_or(e))?;
                if !wc.solicited {
                    // A late credit (send_bw): give the slot back.
                    let (i, k) = split(wc.wr_id);
                    if wc.wr_id & CTRL_WR != 0 {
                        post_ctrl_recv(c, i, k as usize)?;
                    }
                    continue;
                }
                return match ctrl_msg(c, &wc, 0)? {
                    (MSG_FIN, 0, _) => Ok(()),
                    (MSG_FIN, _, why) => Err(format!("the server reported: {why}")),
                    (kind, ..) => Err(format!("unexpected control message {kind} at the end")),
                };
            }
            Err(_) => {
                watch(&c.qps).map_err(|e| send_err.clone().unwrap_or(e))?;
                if let Some(e) = send_err {
                    return Err(e);
                }
                if Instant::now() > deadline {
                    return Err("no final message from the server".into());
                }
            }
        }
    }
}

/// Listen on `addr`, serve one client (all its QPs), answer with FIN, return the report.
/// `listening` is called once the listener is up; `stop` aborts the wait.
pub(super) fn server_session<B: Backend + Send + 'static>(
    ctx: &Context<B>,
    test: Test,
    o: &Opts,
    addr: SocketAddr,
    stop: &AtomicBool,
    listening: impl FnOnce(SocketAddr),
    transport: &str,
) -> Result<String, String> {
    let mine = Params::of(test, o);
    let listener = ctx
        .device()
        .listen(addr, 256)
        .map_err(|e| format!("listen on {addr}: {e}"))?;
    listening(addr);
    let (p, first_qp, remote, first) = loop {
        if stop.load(Ordering::Relaxed) {
            return Err("stopped before a client connected".into());
        }
        let req = match listener.get_request(Duration::from_millis(200)) {
            Ok(r) => r,
            Err(_) => continue,
        };
        match decode_request(&req.private_data) {
            Ok((p, qp, remote)) => break (p, qp, remote, req),
            Err(e) => {
                eprintln!(
                    "{}: ignoring a connection request from {}: {e}",
                    test.name(),
                    req.peer
                );
                let _ = req.reject(&encode_reject(&e));
            }
        }
    };
    let peer = first.peer;
    if let Some(why) = mine.mismatch(&p) {
        let _ = first.reject(&encode_reject(&why));
        // The engine stops with this process: give the MPA Reply time to leave.
        std::thread::sleep(Duration::from_millis(500));
        return Err(format!("rejected the client at {peer}: {why}"));
    }
    let s = make_side(ctx, p.qps, o.tx_depth, p.buf_len(true)?, o.crc)?;
    server_prepare(&p, &s)?;
    let accept = encode_accept(&Remote::of(&s.buf));
    let mut accepted = vec![false; p.qps];
    accepted[first_qp] = true;
    first.accept(&s.qps[first_qp], &accept).map_err(e2s)?;
    for _ in 1..p.qps {
        let req = listener
            .get_request(SILENCE)
            .map_err(|e| format!("waiting for the client's other QPs: {e}"))?;
        let (q, qp, _) = decode_request(&req.private_data)?;
        if q != p || accepted[qp] || req.peer.ip() != peer.ip() {
            let from = req.peer;
            let _ = req.reject(&encode_reject("unexpected QP"));
            return Err(format!("unexpected connection request from {from}"));
        }
        accepted[qp] = true;
        req.accept(&s.qps[qp], &accept).map_err(e2s)?;
    }
    let mut crc = o.crc;
    for q in &s.qps {
        match q.next_event(SILENCE).map_err(e2s)? {
            CmEvent::Established { crc: used, .. } => crc = used,
            e => return Err(format!("accepting {peer}: {e:?}")),
        }
    }
    let run = match test {
        Test::WriteBw | Test::ReadBw => rdma_bw_server(&p, &s, stop),
        Test::SendBw => send_bw_server(&p, &s, stop),
        Test::WriteLat => write_lat_server(&p, &s, &remote, stop),
        Test::ReadLat => wait_done(&s, stop).map(|(_, text)| text),
        Test::SendLat => send_lat_server(&p, &s, stop),
    };
    let fin = match &run {
        Ok(_) => send_ctrl(&s, 0, MSG_FIN, 0, "", FIN_WR),
        Err(e) => send_ctrl(&s, 0, MSG_FIN, 1, e, FIN_WR),
    };
    // The FIN leaves before the connection closes (completion), and the client gets the
    // time to read it (its disconnect).
    let deadline = Instant::now() + Duration::from_secs(5);
    while fin.is_ok() && Instant::now() < deadline {
        match s
            .scq
            .next(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(wc) if wc.wr_id == FIN_WR => break,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    if run.is_ok() {
        while let Ok(e) = s.qps[0].next_event(deadline.saturating_duration_since(Instant::now())) {
            if e == CmEvent::Disconnected {
                break;
            }
        }
    }
    for q in &s.qps {
        let _ = q.disconnect();
    }
    let text = run?;
    let info = Info {
        transport,
        mtu: ctx.stack().config().mtu,
        crc,
        tx_depth: o.tx_depth,
    };
    Ok(format!(
        "{}{text} (results measured by the client at {})\n",
        header(&p, &info),
        peer.ip()
    ))
}

/// Server set-up before it accepts: the receives the client's first messages need, the
/// Read source patterns.
pub(super) fn server_prepare(p: &Params, s: &Side) -> Result<(), String> {
    let mut scratch = Vec::new();
    match p.test {
        Test::SendBw => {
            let (rx, slot) = (p.rx(), p.slot_len());
            for (i, qp) in s.qps.iter().enumerate() {
                for k in 0..rx {
                    let sge = s.buf.sge((i * rx + k) * slot, slot).ok_or("receive slot")?;
                    qp.post_recv(wr_id(i, k as u64), &[sge]).map_err(post_err)?;
                }
            }
        }
        Test::SendLat => {
            let sge = s.buf.sge(0, p.slot_len()).ok_or("receive slot")?;
            s.qps[0].post_recv(0, &[sge]).map_err(post_err)?;
        }
        _ => {
            for i in 0..s.qps.len() {
                post_ctrl_recv(s, i, 0)?;
            }
        }
    }
    if p.verify {
        match p.test {
            Test::ReadBw => {
                let slots = p.slots();
                for i in 0..p.qps {
                    for j in 0..slots {
                        let off = (i * slots + j) * p.size;
                        put_pattern(&s.buf, off, p.size, tag(1, i, j as u64), &mut scratch)?;
                    }
                }
            }
            Test::ReadLat => put_pattern(&s.buf, 0, p.size, tag(1, 0, 0), &mut scratch)?,
            _ => {}
        }
    }
    Ok(())
}
