//! The control protocol between the two ends: the parameters both agree on, the
//! connection private data (request, accept, reject) and the control message constants.

use std::time::Duration;

use xwarp::verbs::{MemoryRegion, Stag};

use super::opts::*;

/// Bytes of one control message slot (DONE, FIN, credits).
pub(super) const CTRL_LEN: usize = 1024;
/// Control receive slots per QP (credits and FIN at the client, DONE at the server).
pub(super) const CTRL_RX: usize = 64;
/// Control slots per QP: the receives plus one send slot.
pub(super) const CTRL_PER_QP: usize = CTRL_RX + 1;
/// `wr_id` flag of control receives and sends.
pub(super) const CTRL_WR: u64 = 1 << 62;
/// `wr_id` of the server's FIN.
pub(super) const FIN_WR: u64 = CTRL_WR | 0xffff_ffff;
/// Buffer bytes per side that the bandwidth rings aim for.
pub(super) const RING_BYTES: usize = 64 << 20;
/// Receives a send_bw receiver grants at once.
pub(super) const GRANT: u64 = 32;
pub(super) const MAGIC: &[u8; 4] = b"XWPT";
pub(super) const VERSION: u8 = 1;
pub(super) const MSG_DONE: u8 = 1;
pub(super) const MSG_FIN: u8 = 2;
/// How long a waiting end tolerates silence before giving up.
pub(super) const SILENCE: Duration = Duration::from_secs(10);

/// What both ends agree on (the client sends it; the server must match).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Params {
    pub(super) test: Test,
    pub(super) size: usize,
    pub(super) iters: u64,
    pub(super) duration: Option<Duration>,
    pub(super) qps: usize,
    pub(super) verify: bool,
}

impl Params {
    pub(super) fn of(test: Test, o: &Opts) -> Params {
        Params {
            test,
            size: o.size,
            iters: o.iters,
            duration: o.duration,
            qps: o.qps,
            verify: o.verify,
        }
    }

    /// Message slots per QP in the bandwidth rings.
    pub(super) fn slots(&self) -> usize {
        (RING_BYTES / self.qps / self.size).clamp(1, 64)
    }

    /// Bytes of one receive buffer of the Send tests (a DONE message must fit).
    pub(super) fn slot_len(&self) -> usize {
        self.size.max(CTRL_LEN)
    }

    /// Receives per QP the send_bw server keeps posted.
    pub(super) fn rx(&self) -> usize {
        (RING_BYTES / self.qps / self.slot_len()).clamp(GRANT as usize, 256)
    }

    /// Bytes of the data buffer at the server or the client.
    pub(super) fn buf_len(&self, server: bool) -> Result<usize, String> {
        let mul = |a: usize, b: usize, c: usize| a.checked_mul(b)?.checked_mul(c);
        match self.test {
            Test::WriteBw | Test::ReadBw => mul(self.qps, self.slots(), self.size),
            Test::SendBw if server => mul(self.qps, self.rx(), self.slot_len()),
            Test::SendBw => mul(self.qps, self.slots(), self.size),
            Test::WriteLat => self.size.checked_mul(2),
            Test::ReadLat => Some(self.size),
            Test::SendLat => self.slot_len().checked_add(self.size),
        }
        .ok_or_else(|| "buffer size overflows".to_string())
    }

    /// Why a server with parameters `self` cannot serve a client asking for `c`.
    pub(super) fn mismatch(&self, c: &Params) -> Option<String> {
        if self.test != c.test {
            return Some(format!(
                "the client runs {} but this server runs {}",
                c.test.name(),
                self.test.name()
            ));
        }
        let mut d = Vec::new();
        if self.size != c.size {
            d.push(format!("-s {} (server {})", c.size, self.size));
        }
        if self.duration != c.duration {
            let s = |x: Option<Duration>| x.map_or("none".to_string(), |d| d.as_secs().to_string());
            d.push(format!(
                "-D {} (server {})",
                s(c.duration),
                s(self.duration)
            ));
        } else if self.duration.is_none() && self.iters != c.iters {
            d.push(format!("-n {} (server {})", c.iters, self.iters));
        }
        if self.qps != c.qps {
            d.push(format!("-q {} (server {})", c.qps, self.qps));
        }
        if self.verify != c.verify {
            d.push(format!(
                "--verify {} (server {})",
                if c.verify { "on" } else { "off" },
                if self.verify { "on" } else { "off" }
            ));
        }
        (!d.is_empty()).then(|| {
            format!(
                "the client asks for {}; start both ends with the same options",
                d.join(", ")
            )
        })
    }
}

/// The peer's data buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Remote {
    pub(super) rkey: Stag,
    pub(super) addr: u64,
    pub(super) len: u64,
}

impl Remote {
    pub(super) fn of(mr: &MemoryRegion) -> Remote {
        Remote {
            rkey: mr.rkey(),
            addr: mr.addr(),
            len: mr.len() as u64,
        }
    }

    pub(super) fn put(&self, v: &mut Vec<u8>) {
        v.extend(self.rkey.0.to_be_bytes());
        v.extend(self.addr.to_be_bytes());
        v.extend(self.len.to_be_bytes());
    }

    pub(super) fn get(b: &[u8], at: usize) -> Option<Remote> {
        Some(Remote {
            rkey: Stag(be32(b, at)?),
            addr: be64(b, at + 4)?,
            len: be64(b, at + 12)?,
        })
    }
}

pub(super) fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub(super) fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Connection request private data: magic, version, test, flags, QP index, QP count,
/// size, iterations, duration (s, 0: none), the client's buffer (60 bytes).
pub(super) fn encode_request(p: &Params, qp: usize, buf: &Remote) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(MAGIC);
    v.extend([VERSION, p.test.code(), u8::from(p.verify), 0]);
    v.extend((qp as u32).to_be_bytes());
    v.extend((p.qps as u32).to_be_bytes());
    v.extend((p.size as u64).to_be_bytes());
    v.extend(p.iters.to_be_bytes());
    v.extend(p.duration.map_or(0, |d| d.as_secs()).to_be_bytes());
    buf.put(&mut v);
    v
}

pub(super) fn check_magic(b: &[u8]) -> Result<(), String> {
    if b.get(..4) != Some(&MAGIC[..]) {
        return Err("not an xwarp perftest peer (private data without the XWPT magic)".into());
    }
    if b.get(4) != Some(&VERSION) {
        return Err(format!(
            "perftest protocol version {:?}, expected {VERSION}",
            b.get(4)
        ));
    }
    Ok(())
}

/// Parse and validate a connection request's private data.
pub(super) fn decode_request(b: &[u8]) -> Result<(Params, usize, Remote), String> {
    check_magic(b)?;
    let short = || "connection request private data too short".to_string();
    let test = Test::from_code(*b.get(5).ok_or_else(short)?).ok_or("unknown test code")?;
    let verify = *b.get(6).ok_or_else(short)? != 0;
    let qp = be32(b, 8).ok_or_else(short)? as usize;
    let qps = be32(b, 12).ok_or_else(short)? as usize;
    let size = be64(b, 16).ok_or_else(short)?;
    let iters = be64(b, 24).ok_or_else(short)?;
    let secs = be64(b, 32).ok_or_else(short)?;
    let remote = Remote::get(b, 40).ok_or_else(short)?;
    if !(1..=256).contains(&qps) || qp >= qps || (!test.is_bw() && qps != 1) {
        return Err(format!("bad QP index {qp} of {qps}"));
    }
    if size == 0 || size > 1 << 30 || iters == 0 || secs > 86_400 {
        return Err(format!(
            "bad run parameters: size {size}, iterations {iters}"
        ));
    }
    let p = Params {
        test,
        size: size as usize,
        iters,
        duration: (secs > 0).then(|| Duration::from_secs(secs)),
        qps,
        verify,
    };
    let need = p.buf_len(false)? as u64;
    if remote.len < need {
        return Err(format!(
            "client buffer of {} bytes, need {need}",
            remote.len
        ));
    }
    Ok((p, qp, remote))
}

/// Accept private data: magic, version, status 0, the server's buffer.
pub(super) fn encode_accept(buf: &Remote) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend([VERSION, 0, 0, 0]);
    buf.put(&mut v);
    v
}

pub(super) fn decode_accept(b: &[u8], p: &Params) -> Result<Remote, String> {
    check_magic(b)?;
    let r = Remote::get(b, 8).ok_or("accept private data too short")?;
    let need = p.buf_len(true)? as u64;
    if r.len < need {
        return Err(format!("server buffer of {} bytes, need {need}", r.len));
    }
    Ok(r)
}

/// Reject private data: magic, version, status 1, the reason (UTF-8).
pub(super) fn encode_reject(why: &str) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend([VERSION, 1, 0, 0]);
    let mut n = why.len().min(200);
    while !why.is_char_boundary(n) {
        n -= 1;
    }
    v.extend(&why.as_bytes()[..n]);
    v
}

pub(super) fn decode_reject(b: &[u8]) -> String {
    match check_magic(b) {
        Ok(()) => String::from_utf8_lossy(b.get(8..).unwrap_or_default()).into_owned(),
        Err(_) => "no reason given".into(),
    }
}

// ---------------------------------------------------------------------------------------
// Data patterns.

pub(super) fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

pub(super) fn post_err(e: impl std::fmt::Debug) -> String {
    format!("posting a work request: {e:?}")
}

// ---------------------------------------------------------------------------------------
// Run parameters, buffer layout, private data and control messages.
