//! The latency tests' client and server loops (Send, RDMA Write and RDMA Read latency).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use xwarp::verbs::{MemoryRegion, SendRequest};

use super::pattern::*;
use super::proto::*;
use super::report::*;
use super::side::*;

pub(super) fn send_lat_client(p: &Params, c: &Side) -> ClientResult {
    let qp = &c.qps[0];
    let (size, slot) = (p.size, p.slot_len());
    let inline = size <= 256;
    let mut lat = Lat::new()?;
    let mut scratch = vec![0x5au8; size];
    if !p.verify {
        c.buf.write(slot, &scratch).map_err(e2s)?;
    }
    let t0 = Instant::now();
    let mut i = 0u64;
    while lat_iters(p, t0, i) {
        // The pong's receive is posted before the ping can provoke it.
        qp.post_recv(i, &[c.buf.sge(0, slot).ok_or("sge")?])
            .map_err(post_err)?;
        if p.verify {
            scratch.resize(size, 0);
            pattern(tag(0, 0, i), &mut scratch);
            if !inline {
                c.buf.write(slot, &scratch).map_err(e2s)?;
            }
        }
        let t = Instant::now();
        let mut wr = if inline {
            SendRequest {
                inline: Some(scratch.clone()),
                ..SendRequest::send(i, vec![])
            }
        } else {
            SendRequest::send(i, vec![c.buf.sge(slot, size).ok_or("sge")?])
        };
        wr.signaled = (i + 1).is_multiple_of(16);
        qp.post_send(wr).map_err(post_err)?;
        let mut spin = Spin::new();
        let wc = loop {
            if let Some(w) = c.rcq.poll_one() {
                break w;
            }
            if spin.idle() {
                watch(&c.qps)?;
                if t.elapsed() > SILENCE {
                    return Err(format!("no answer to Send {i} for {SILENCE:?}"));
                }
            }
        };
        lat.add(t.elapsed());
        check(&wc)?;
        if wc.solicited {
            return Err(fin_error(c, &wc, 0));
        }
        if p.verify {
            if wc.byte_len as usize != size {
                return Err(format!(
                    "data verification failed: answer {i} has {} bytes, expected {size}",
                    wc.byte_len
                ));
            }
            verify_region(&c.buf, 0, size, tag(1, 0, i), &mut scratch, &|| {
                format!("the server's Send {i}")
            })?;
        }
        while let Some(w) = c.scq.poll_one() {
            check(&w)?;
        }
        i += 1;
    }
    Ok((Measured::lat(size, lat, true), vec![i]))
}

pub(super) fn send_lat_server(p: &Params, s: &Side, stop: &AtomicBool) -> Result<String, String> {
    let qp = &s.qps[0];
    let (size, slot) = (p.size, p.slot_len());
    let inline = size <= 256;
    let mut n = 0u64;
    let mut payload = vec![0u8; size];
    let mut heard = Instant::now();
    loop {
        let mut spin = Spin::new();
        let wc = loop {
            if let Some(w) = s.rcq.poll_one() {
                break w;
            }
            if spin.idle() {
                if stop.load(Ordering::Relaxed) {
                    return Err("stopped".into());
                }
                watch(&s.qps)?;
                client_silent(heard)?;
            }
        };
        heard = Instant::now();
        check(&wc)?;
        if wc.solicited {
            return match ctrl_msg(s, &wc, 0)? {
                (MSG_DONE, c, text) if c == n => Ok(text),
                (MSG_DONE, c, _) => Err(format!("the client reports {c} pings but {n} arrived")),
                (kind, ..) => Err(format!("unexpected control message {kind}")),
            };
        }
        if p.verify {
            if wc.byte_len as usize != size {
                return Err(format!(
                    "data verification failed: ping {n} has {} bytes, expected {size}",
                    wc.byte_len
                ));
            }
            verify_region(&s.buf, 0, size, tag(0, 0, n), &mut payload, &|| {
                format!("the client's Send {n}")
            })?;
            payload.resize(size, 0);
            pattern(tag(1, 0, n), &mut payload);
        } else {
            // Echo the ping.
            s.buf.read(0, &mut payload).map_err(e2s)?;
        }
        qp.post_recv(0, &[s.buf.sge(0, slot).ok_or("sge")?])
            .map_err(post_err)?;
        n += 1;
        let mut wr = if inline {
            SendRequest {
                inline: Some(payload.clone()),
                ..SendRequest::send(n, vec![])
            }
        } else {
            s.buf.write(slot, &payload).map_err(e2s)?;
            SendRequest::send(n, vec![s.buf.sge(slot, size).ok_or("sge")?])
        };
        wr.signaled = n.is_multiple_of(16);
        qp.post_send(wr).map_err(post_err)?;
        while let Some(w) = s.scq.poll_one() {
            check(&w)?;
        }
    }
}

/// A Write of the source half `[size, 2 size)` of `mr` to the peer's sink half.
pub(super) fn write_wr(id: u64, mr: &MemoryRegion, size: usize, r: &Remote) -> SendRequest {
    match mr.sge(size, size) {
        Some(sge) => SendRequest::write(id, vec![sge], r.rkey, r.addr),
        None => SendRequest::write(id, vec![], r.rkey, r.addr),
    }
}

pub(super) fn write_lat_client(p: &Params, c: &Side, r: &Remote) -> ClientResult {
    // Each side Writes from its source half into the peer's sink half and polls the
    // last byte of its own sink half for the iteration mark, as perftest does. Source
    // and sink never overlap, so no buffer is written while a Write reads it.
    let qp = &c.qps[0];
    let size = p.size;
    let last = size - 1;
    let mut lat = Lat::new()?;
    let mut scratch = Vec::new();
    let t0 = Instant::now();
    let mut i = 0u64;
    while lat_iters(p, t0, i) {
        let m = mark(i);
        if p.verify && last > 0 {
            put_pattern(&c.buf, size, last, tag(0, 0, i), &mut scratch)?;
        }
        c.buf.write(size + last, &[m]).map_err(e2s)?;
        let t = Instant::now();
        let mut wr = write_wr(i, &c.buf, size, r);
        wr.signaled = (i + 1).is_multiple_of(16);
        qp.post_send(wr).map_err(post_err)?;
        let mut spin = Spin::new();
        while c.buf.poll_byte(last) != Some(m) {
            if spin.idle() {
                client_idle(c, true)?;
                if t.elapsed() > SILENCE {
                    return Err(format!("no answer to Write {i} for {SILENCE:?}"));
                }
            }
        }
        lat.add(t.elapsed());
        if p.verify && last > 0 {
            verify_eventually(&c.buf, 0, last, tag(1, 0, i), &mut scratch, &|| {
                format!("the server's Write {i}")
            })?;
        }
        while let Some(w) = c.scq.poll_one() {
            check(&w)?;
        }
        i += 1;
    }
    Ok((Measured::lat(size, lat, true), vec![i]))
}

pub(super) fn write_lat_server(
    p: &Params,
    s: &Side,
    r: &Remote,
    stop: &AtomicBool,
) -> Result<String, String> {
    let qp = &s.qps[0];
    let size = p.size;
    let last = size - 1;
    let mut scratch = Vec::new();
    let mut n = 0u64;
    let mut heard = Instant::now();
    loop {
        let m = mark(n);
        let mut spin = Spin::new();
        while s.buf.poll_byte(last) != Some(m) {
            if spin.idle() {
                if stop.load(Ordering::Relaxed) {
                    return Err("stopped".into());
                }
                watch(&s.qps)?;
                client_silent(heard)?;
                if let Some(wc) = s.rcq.poll_one() {
                    check(&wc)?;
                    return match ctrl_msg(s, &wc, 0)? {
                        (MSG_DONE, c, text) if c == n => Ok(text),
                        (MSG_DONE, c, _) => {
                            Err(format!("the client reports {c} Writes but {n} arrived"))
                        }
                        (kind, ..) => Err(format!("unexpected control message {kind}")),
                    };
                }
            }
        }
        heard = Instant::now();
        if p.verify && last > 0 {
            verify_eventually(&s.buf, 0, last, tag(0, 0, n), &mut scratch, &|| {
                format!("the client's Write {n}")
            })?;
            put_pattern(&s.buf, size, last, tag(1, 0, n), &mut scratch)?;
        }
        s.buf.write(size + last, &[m]).map_err(e2s)?;
        n += 1;
        let mut wr = write_wr(n, &s.buf, size, r);
        wr.signaled = n.is_multiple_of(16);
        qp.post_send(wr).map_err(post_err)?;
        while let Some(w) = s.scq.poll_one() {
            check(&w)?;
        }
    }
}

pub(super) fn read_lat_client(p: &Params, c: &Side, r: &Remote) -> ClientResult {
    let qp = &c.qps[0];
    let mut lat = Lat::new()?;
    let mut scratch = Vec::new();
    let t0 = Instant::now();
    let mut i = 0u64;
    while lat_iters(p, t0, i) {
        if p.verify {
            c.buf.fill(0, p.size, 0).map_err(e2s)?;
        }
        let t = Instant::now();
        qp.post_send(SendRequest::read(
            i,
            c.buf.sge(0, p.size).ok_or("sge")?,
            r.rkey,
            r.addr,
        ))
        .map_err(post_err)?;
        let mut spin = Spin::new();
        let wc = loop {
            if let Some(w) = c.scq.poll_one() {
                break w;
            }
            if spin.idle() {
                client_idle(c, true)?;
                if t.elapsed() > SILENCE {
                    return Err(format!("RDMA Read {i}: no completion for {SILENCE:?}"));
                }
            }
        };
        lat.add(t.elapsed());
        check(&wc)?;
        if p.verify {
            verify_region(&c.buf, 0, p.size, tag(1, 0, 0), &mut scratch, &|| {
                format!("RDMA Read {i}")
            })?;
        }
        i += 1;
    }
    Ok((Measured::lat(p.size, lat, false), vec![i]))
}
