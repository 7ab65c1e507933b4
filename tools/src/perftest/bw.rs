//! The bandwidth tests' client and server loops (RDMA Write/Read bandwidth, Send bandwidth).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xwarp::verbs::SendRequest;

use super::opts::*;
use super::pattern::*;
use super::proto::*;
use super::report::*;
use super::side::*;

pub(super) fn rdma_bw_client(p: &Params, tx_depth: usize, c: &Side, r: &Remote) -> ClientResult {
    let read = p.test == Test::ReadBw;
    let slots = p.slots();
    let mut depth = if read { tx_depth.min(16) } else { tx_depth };
    if p.verify {
        // One message per slot in flight: a slot is rewritten only after it completed.
        depth = depth.min(slots);
    }
    // In duration mode the last request is not known in advance: signal every one.
    let cq_mod = if p.duration.is_some() {
        1
    } else {
        (depth / 4).clamp(1, 16) as u64
    };
    let nq = c.qps.len();
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let mut finished = vec![false; nq];
    let t0 = Instant::now();
    let mut bw = Bw {
        t0,
        samples: Vec::new(),
    };
    let mut total_done = 0u64;
    let mut wcs = Vec::with_capacity(64);
    let mut scratch = Vec::new();
    let mut spin = Spin::new();
    let mut last_progress = Instant::now();
    loop {
        for (i, qp) in c.qps.iter().enumerate() {
            if stop_now(p, t0, posted[i]) && done[i] >= posted[i] {
                finished[i] = true;
            }
            if finished[i] {
                continue;
            }
            while posted[i] - done[i] < depth as u64 && !stop_now(p, t0, posted[i]) {
                let seq = posted[i];
                let off = (i * slots + (seq % slots as u64) as usize) * p.size;
                let sge = c.buf.sge(off, p.size).ok_or("buffer slot")?;
                if p.verify {
                    if read {
                        c.buf.fill(off, p.size, 0).map_err(e2s)?;
                    } else {
                        put_pattern(&c.buf, off, p.size, tag(0, i, seq), &mut scratch)?;
                    }
                }
                let raddr = r.addr + off as u64;
                let mut wr = if read {
                    SendRequest::read(wr_id(i, seq), sge, r.rkey, raddr)
                } else {
                    SendRequest::write(wr_id(i, seq), vec![sge], r.rkey, raddr)
                };
                let last = p.duration.is_none() && seq + 1 == p.iters;
                wr.signaled = (seq + 1).is_multiple_of(cq_mod) || last;
                qp.post_send(wr).map_err(post_err)?;
                posted[i] += 1;
            }
        }
        wcs.clear();
        if c.scq.poll(&mut wcs, 64) == 0 {
            if finished.iter().all(|f| *f) {
                break;
            }
            if spin.idle() {
                client_idle(c, true)?;
                if last_progress.elapsed() > SILENCE {
                    return Err(format!(
                        "no completion for {SILENCE:?} (posted {posted:?}, completed {done:?})"
                    ));
                }
            }
            continue;
        }
        spin = Spin::new();
        last_progress = Instant::now();
        for wc in &wcs {
            check(wc)?;
            let (i, seq) = split(wc.wr_id);
            if i >= nq {
                return Err(format!("unexpected completion {wc:?}"));
            }
            let before = done[i];
            done[i] = done[i].max(seq + 1);
            total_done += done[i] - before;
            if read && p.verify {
                for s in before..done[i] {
                    let j = s % slots as u64;
                    let off = (i * slots + j as usize) * p.size;
                    verify_region(&c.buf, off, p.size, tag(1, i, j), &mut scratch, &|| {
                        format!("RDMA Read {s} on QP {i}")
                    })?;
                }
            }
        }
        bw.samples
            .push((bw.t0.elapsed(), total_done * p.size as u64));
    }
    Ok((Measured::bw(p.size, &bw, total_done), posted))
}

pub(super) fn rdma_bw_server(p: &Params, s: &Side, stop: &AtomicBool) -> Result<String, String> {
    let (posted, text) = wait_done(s, stop)?;
    if p.verify && p.test == Test::WriteBw {
        // Every slot holds the last iteration written to it (the DONE Send follows the
        // Writes on each QP, so they are all placed).
        let slots = p.slots() as u64;
        let mut scratch = Vec::new();
        for (i, n) in posted.iter().copied().enumerate() {
            for j in 0..slots.min(n) {
                let seq = j + slots * ((n - 1 - j) / slots);
                let off = (i * slots as usize + j as usize) * p.size;
                verify_region(&s.buf, off, p.size, tag(0, i, seq), &mut scratch, &|| {
                    format!("RDMA Write {seq} on QP {i}")
                })?;
            }
        }
    }
    Ok(text)
}

pub(super) fn send_bw_client(p: &Params, tx_depth: usize, c: &Side) -> ClientResult {
    let nq = c.qps.len();
    let slots = p.slots();
    // One receive per QP stays free for DONE.
    let max_credits = p.rx() as u64 - 1;
    let mut depth = tx_depth;
    if p.verify {
        depth = depth.min(slots);
    }
    // In duration mode the last Send is not known in advance: signal every one.
    let cq_mod = if p.duration.is_some() {
        1
    } else {
        (depth / 4).clamp(1, 16) as u64
    };
    let mut credits = vec![max_credits; nq];
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let t0 = Instant::now();
    let mut bw = Bw {
        t0,
        samples: Vec::new(),
    };
    let mut total = 0u64;
    let mut wcs = Vec::new();
    let mut scratch = Vec::new();
    let mut spin = Spin::new();
    let mut last_progress = Instant::now();
    loop {
        let mut all_stopped = true;
        for (i, qp) in c.qps.iter().enumerate() {
            while credits[i] > 0
                && posted[i] - done[i] < depth as u64
                && !stop_now(p, t0, posted[i])
            {
                let seq = posted[i];
                let off = (i * slots + (seq % slots as u64) as usize) * p.size;
                if p.verify {
                    put_pattern(&c.buf, off, p.size, tag(0, i, seq), &mut scratch)?;
                }
                let mut wr =
                    SendRequest::send(wr_id(i, seq), vec![c.buf.sge(off, p.size).ok_or("sge")?]);
                let last = p.duration.is_none() && seq + 1 == p.iters;
                wr.signaled = (seq + 1).is_multiple_of(cq_mod) || last;
                qp.post_send(wr).map_err(post_err)?;
                posted[i] += 1;
                credits[i] -= 1;
            }
            if !stop_now(p, t0, posted[i]) || done[i] < posted[i] {
                all_stopped = false;
            }
        }
        let mut progress = false;
        wcs.clear();
        c.scq.poll(&mut wcs, 64);
        for wc in &wcs {
            check(wc)?;
            let (i, seq) = split(wc.wr_id);
            if i >= nq {
                return Err(format!("unexpected completion {wc:?}"));
            }
            let before = done[i];
            done[i] = done[i].max(seq + 1);
            total += done[i] - before;
            progress = true;
        }
        while let Some(wc) = c.rcq.poll_one() {
            progress = true;
            check(&wc)?;
            if wc.solicited {
                return Err(fin_error(c, &wc, 0));
            }
            let (i, k) = split(wc.wr_id);
            if i >= nq || wc.wr_id & CTRL_WR == 0 {
                return Err(format!("unexpected receive {wc:?}"));
            }
            let n = c.ctrl.to_vec(ctrl_off(i, k as usize), 8).map_err(e2s)?;
            let n = be64(&n, 0).unwrap_or(0);
            credits[i] = credits[i].saturating_add(n).min(max_credits);
            post_ctrl_recv(c, i, k as usize)?;
        }
        if progress {
            bw.samples.push((bw.t0.elapsed(), total * p.size as u64));
            spin = Spin::new();
            last_progress = Instant::now();
        }
        if all_stopped {
            break;
        }
        if !progress && spin.idle() {
            watch(&c.qps)?;
            if last_progress.elapsed() > SILENCE {
                return Err(format!(
                    "no progress for {SILENCE:?} (posted {posted:?}, completed {done:?}, credits {credits:?})"
                ));
            }
        }
    }
    Ok((Measured::bw(p.size, &bw, total), posted))
}

pub(super) fn send_bw_server(p: &Params, s: &Side, stop: &AtomicBool) -> Result<String, String> {
    let nq = s.qps.len();
    let (rx, slot) = (p.rx(), p.slot_len());
    let mut got = vec![0u64; nq];
    let mut granted = vec![0u64; nq];
    let mut finished = vec![false; nq];
    let mut text = String::new();
    let mut sends = 0u64;
    let mut scratch = Vec::new();
    let mut heard = Instant::now();
    while finished.iter().any(|f| !f) {
        if stop.load(Ordering::Relaxed) {
            return Err("stopped".into());
        }
        let wc = match s.rcq.next(Duration::from_millis(200)) {
            Ok(w) => w,
            Err(_) => {
                watch(&s.qps)?;
                client_silent(heard)?;
                continue;
            }
        };
        heard = Instant::now();
        check(&wc)?;
        let (i, k) = split(wc.wr_id);
        if i >= nq || k as usize >= rx {
            return Err(format!("unexpected receive {wc:?}"));
        }
        let off = (i * rx + k as usize) * slot;
        if wc.solicited {
            let (kind, n, t) = ctrl_msg(s, &wc, off)?;
            if kind != MSG_DONE {
                return Err(format!("unexpected control message {kind} on QP {i}"));
            }
            if n != got[i] {
                return Err(format!(
                    "QP {i}: the client sent {n} messages but {} arrived",
                    got[i]
                ));
            }
            finished[i] = true;
            if i == 0 {
                text = t;
            }
            continue;
        }
        if p.verify {
            if wc.byte_len as usize != p.size {
                return Err(format!(
                    "data verification failed: Send {} on QP {i} has {} bytes, expected {}",
                    got[i], wc.byte_len, p.size
                ));
            }
            let seq = got[i];
            verify_region(&s.buf, off, p.size, tag(0, i, seq), &mut scratch, &|| {
                format!("Send {seq} on QP {i}")
            })?;
        }
        got[i] += 1;
        let sge = s.buf.sge(off, slot).ok_or("receive slot")?;
        s.qps[i].post_recv(wc.wr_id, &[sge]).map_err(post_err)?;
        if got[i] - granted[i] >= GRANT {
            let n = got[i] - granted[i];
            granted[i] = got[i];
            sends += 1;
            let mut wr = SendRequest {
                inline: Some(n.to_be_bytes().to_vec()),
                ..SendRequest::send(CTRL_WR | sends, vec![])
            };
            wr.signaled = sends.is_multiple_of(16);
            s.qps[i].post_send(wr).map_err(post_err)?;
        }
        while let Some(w) = s.scq.poll_one() {
            check(&w)?;
        }
    }
    Ok(text)
}
