//! Helpers shared by the `net_*` integration tests: deterministic payloads and a
//! streaming hash to compare what was sent with what arrived.
#![allow(dead_code)]

use std::hash::{DefaultHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use xwarp::net::{PairConfig, StackConfig};

/// Address of end `last` of a [`PairConfig::default`] pair.
pub fn addr(last: u8, port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(10, 77, 0, last), port))
}

/// The payload byte at stream offset `i` of stream `seed` (not periodic at any power of
/// two, so a misplaced segment is caught).
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    for (k, b) in buf.iter_mut().enumerate() {
        let i = offset + k as u64;
        let x = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        *b = (x >> 56) as u8 ^ (i / 4093) as u8;
    }
}

/// Streaming hash (SipHash with fixed keys; split writes hash like one write).
#[derive(Default)]
pub struct StreamHash {
    h: DefaultHasher,
    pub len: u64,
}

impl StreamHash {
    pub fn update(&mut self, data: &[u8]) {
        self.h.write(data);
        self.len += data.len() as u64;
    }

    pub fn finish(&self) -> (u64, u64) {
        (self.len, self.h.finish())
    }
}

/// Write `total` bytes of stream `seed` in `chunk`-byte writes; returns (len, hash).
pub fn send_stream(
    w: &mut impl Write,
    seed: u64,
    total: u64,
    chunk: usize,
) -> io::Result<(u64, u64)> {
    let mut h = StreamHash::default();
    let mut buf = vec![0u8; chunk];
    let mut off = 0u64;
    while off < total {
        let n = chunk.min((total - off) as usize);
        fill(seed, off, &mut buf[..n]);
        w.write_all(&buf[..n])?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(h.finish())
}

/// Read to end of stream; returns (len, hash) and checks every byte against stream
/// `seed` when `verify` (the first mismatch fails with `InvalidData`).
pub fn recv_stream(r: &mut impl Read, seed: u64, verify: bool) -> io::Result<(u64, u64)> {
    let mut h = StreamHash::default();
    let mut buf = vec![0u8; 256 << 10];
    let mut expect = vec![0u8; 256 << 10];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish());
        }
        if verify {
            fill(seed, h.len, &mut expect[..n]);
            if buf[..n] != expect[..n] {
                let bad: Vec<usize> = (0..n).filter(|&i| buf[i] != expect[i]).collect();
                let flipped: u32 = bad.iter().map(|&i| (buf[i] ^ expect[i]).count_ones()).sum();
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "payload mismatch in bytes {}..{}: {} bytes differ (first at +{}, last at +{}), {} bits flipped",
                        h.len,
                        h.len + n as u64,
                        bad.len(),
                        bad[0],
                        bad[bad.len() - 1],
                        flipped
                    ),
                ));
            }
        }
        h.update(&buf[..n]);
    }
}

/// Stack settings for tests: default buffers unless told otherwise.
pub fn pair_config(adjust: impl Fn(&mut StackConfig)) -> PairConfig {
    let mut cfg = PairConfig::default();
    adjust(&mut cfg.a);
    adjust(&mut cfg.b);
    cfg
}

/// A generous bound for one test step on a loaded 2-core machine.
pub const STEP: Duration = Duration::from_secs(20);
