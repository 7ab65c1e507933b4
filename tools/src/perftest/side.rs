//! One end's verbs resources ([`Side`]), its control messages and completion checks, and
//! the loop helpers every test shares.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xwarp::poll_driver::backend::Backend;

use xwarp::verbs::{
    Access, CmEvent, CompletionQueue, CompletionStatus, Context, MemoryRegion, QpInitAttr,
    QueuePair, SendOpcode, SendRequest, WorkCompletion,
};

use super::proto::*;

pub(super) struct Side {
    pub(super) qps: Vec<QueuePair>,
    pub(super) scq: CompletionQueue,
    pub(super) rcq: CompletionQueue,
    pub(super) buf: MemoryRegion,
    pub(super) ctrl: MemoryRegion,
}

pub(super) fn make_side<B: Backend + Send + 'static>(
    ctx: &Context<B>,
    nqps: usize,
    tx_depth: usize,
    buf_len: usize,
    crc: bool,
) -> Result<Side, String> {
    let dev = ctx.device();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(4096).map_err(e2s)?;
    let rcq = dev.create_cq(4096).map_err(e2s)?;
    let acc = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let buf = pd
        .alloc_mr(buf_len, acc, true)
        .map_err(|e| format!("registering a {buf_len}-byte buffer: {e}"))?;
    let ctrl = pd
        .alloc_mr(CTRL_LEN * CTRL_PER_QP * nqps, acc, false)
        .map_err(|e| format!("registering the control buffer: {e}"))?;
    let mut qps = Vec::new();
    for _ in 0..nqps {
        let mut at = QpInitAttr::new(&scq, &rcq);
        at.max_send_wr = tx_depth.max(8) + 16;
        at.max_recv_wr = 1024;
        at.max_inline_data = 256;
        at.mpa.crc = crc;
        qps.push(pd.create_qp(&at).map_err(e2s)?);
    }
    Ok(Side {
        qps,
        scq,
        rcq,
        buf,
        ctrl,
    })
}

pub(super) fn wr_id(qp: usize, seq: u64) -> u64 {
    (qp as u64) << 40 | seq
}

/// (QP index, sequence) of a `wr_id` made by [`wr_id`] (with or without [`CTRL_WR`]).
pub(super) fn split(id: u64) -> (usize, u64) {
    (((id & !CTRL_WR) >> 40) as usize, id & ((1 << 40) - 1))
}

pub(super) fn ctrl_off(qp: usize, k: usize) -> usize {
    (qp * CTRL_PER_QP + k) * CTRL_LEN
}

pub(super) fn post_ctrl_recv(s: &Side, qp: usize, k: usize) -> Result<(), String> {
    let sge = s
        .ctrl
        .sge(ctrl_off(qp, k), CTRL_LEN)
        .ok_or("control slot")?;
    s.qps
        .get(qp)
        .ok_or("control receive on a QP that does not exist")?
        .post_recv(CTRL_WR | wr_id(qp, k as u64), &[sge])
        .map_err(post_err)
}

/// Send a control message (Send with Solicited Event): kind, a number, a text.
pub(super) fn send_ctrl(
    s: &Side,
    qp: usize,
    kind: u8,
    n: u64,
    text: &str,
    id: u64,
) -> Result<(), String> {
    let mut m = vec![kind, 0, 0, 0, 0, 0, 0, 0];
    m.extend(n.to_be_bytes());
    let mut len = text.len().min(CTRL_LEN - 16);
    while !text.is_char_boundary(len) {
        len -= 1;
    }
    m.extend(&text.as_bytes()[..len]);
    let off = ctrl_off(qp, CTRL_RX);
    s.ctrl.write(off, &m).map_err(e2s)?;
    let sge = s.ctrl.sge(off, m.len()).ok_or("control slot")?;
    s.qps[qp]
        .post_send(SendRequest::new(
            id,
            SendOpcode::SendWithSolicitedEvent,
            vec![sge],
        ))
        .map_err(post_err)
}

/// The control message a receive completion carries: (kind, number, text). Control
/// receives are in the control buffer, data receives at `data_off` of the data buffer.
pub(super) fn ctrl_msg(
    s: &Side,
    wc: &WorkCompletion,
    data_off: usize,
) -> Result<(u8, u64, String), String> {
    let len = (wc.byte_len as usize).min(CTRL_LEN);
    let b = if wc.wr_id & CTRL_WR != 0 {
        let (i, k) = split(wc.wr_id);
        s.ctrl.to_vec(ctrl_off(i, k as usize), len)
    } else {
        s.buf.to_vec(data_off, len)
    }
    .map_err(e2s)?;
    let kind = *b.first().ok_or("empty control message")?;
    let n = be64(&b, 8).ok_or("control message too short")?;
    Ok((kind, n, String::from_utf8_lossy(&b[16..]).into_owned()))
}

/// The error a FIN received during the run stands for.
pub(super) fn fin_error(s: &Side, wc: &WorkCompletion, data_off: usize) -> String {
    if wc.status != CompletionStatus::Success {
        return format!("receive failed: {wc:?}");
    }
    match ctrl_msg(s, wc, data_off) {
        Ok((MSG_FIN, 0, _)) => "the server finished before the client".into(),
        Ok((MSG_FIN, _, text)) => format!("the server reported: {text}"),
        Ok((kind, ..)) => format!("unexpected control message {kind} from the server"),
        Err(e) => e,
    }
}

pub(super) fn check(wc: &WorkCompletion) -> Result<(), String> {
    if wc.status != CompletionStatus::Success {
        return Err(format!("completion failed: {wc:?}"));
    }
    Ok(())
}

/// Fail on a connection event other than `Established` (the peer went away).
pub(super) fn watch(qps: &[QueuePair]) -> Result<(), String> {
    for (i, q) in qps.iter().enumerate() {
        match q.poll_event() {
            None | Some(CmEvent::Established { .. }) => {}
            Some(CmEvent::Disconnected) => return Err(format!("QP {i}: the peer disconnected")),
            Some(e) => return Err(format!("QP {i}: connection failed: {e:?}")),
        }
    }
    Ok(())
}

/// Client checks while waiting: connection events and a FIN (the server's error) on the
/// receive CQ (`fin_on_rcq`: tests whose client receives nothing else).
pub(super) fn client_idle(c: &Side, fin_on_rcq: bool) -> Result<(), String> {
    watch(&c.qps)?;
    if fin_on_rcq {
        if let Some(wc) = c.rcq.poll_one() {
            return Err(fin_error(c, &wc, 0));
        }
    }
    Ok(())
}

/// Fail when an active client (Sends, ping-pong) has not been heard from for longer
/// than its own per-iteration bound allows (it died without closing the connection).
pub(super) fn client_silent(heard: Instant) -> Result<(), String> {
    let bound = SILENCE + Duration::from_secs(5);
    if heard.elapsed() > bound {
        return Err(format!("the client went silent for {bound:?}"));
    }
    Ok(())
}

/// Idle policy of the engines the tools start: both ends of `--vwire`/`--veth` share
/// the machine's cores with the waiting application threads (which yield, see [`Spin`]).
pub(super) const ENGINE_SPIN: xwarp::poll_driver::engine::SpinBudget =
    xwarp::poll_driver::engine::SpinBudget::SHARED_CORES;

/// A waiting application thread: yield on every idle round, so an engine woken on the same
/// core runs at once (a busy-spinning waiter next to a yielding engine costs it a whole
/// scheduler slice per hand-over).
pub(super) struct Spin(u32);

impl Spin {
    pub(super) fn new() -> Spin {
        Spin(0)
    }

    /// One idle round; `true` every 1024 rounds (time for the slower checks).
    pub(super) fn idle(&mut self) -> bool {
        self.0 = self.0.wrapping_add(1);
        std::thread::yield_now();
        self.0.is_multiple_of(1024)
    }
}

// ---------------------------------------------------------------------------------------
// Sessions.

pub(super) fn stop_now(p: &Params, t0: Instant, posted: u64) -> bool {
    match p.duration {
        Some(d) => t0.elapsed() >= d,
        None => posted >= p.iters,
    }
}

pub(super) fn lat_iters(p: &Params, t0: Instant, i: u64) -> bool {
    !stop_now(p, t0, i)
}

/// The latency tests' iteration mark (1..=255, never repeated back to back).
pub(super) fn mark(i: u64) -> u8 {
    (i % 255 + 1) as u8
}

// ---------------------------------------------------------------------------------------
// The tests. Client parts return (what they measured, iterations per QP).

pub(super) type ClientResult = Result<(super::report::Measured, Vec<u64>), String>;

/// Wait for DONE on every QP (in the control receives): (iterations per QP, the
/// client's result text).
pub(super) fn wait_done(s: &Side, stop: &AtomicBool) -> Result<(Vec<u64>, String), String> {
    let nq = s.qps.len();
    let mut posted = vec![None; nq];
    let mut text = String::new();
    while posted.iter().any(Option::is_none) {
        if stop.load(Ordering::Relaxed) {
            return Err("stopped".into());
        }
        let wc = match s.rcq.next(Duration::from_millis(200)) {
            Ok(w) => w,
            Err(_) => {
                watch(&s.qps)?;
                continue;
            }
        };
        check(&wc)?;
        let (i, _) = split(wc.wr_id);
        match ctrl_msg(s, &wc, 0)? {
            (MSG_DONE, n, t) if i < nq => {
                posted[i] = Some(n);
                if i == 0 {
                    text = t;
                }
            }
            (kind, ..) => return Err(format!("unexpected control message {kind} on QP {i}")),
        }
    }
    Ok((posted.into_iter().map(|p| p.unwrap_or(0)).collect(), text))
}
