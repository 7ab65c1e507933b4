//! The data pattern of `--verify`: derived from (direction, QP, iteration, byte offset),
//! written by the sender and checked by the receiver.

use std::time::{Duration, Instant};

use xwarp::verbs::MemoryRegion;

use super::proto::*;

/// The pattern tag of a message: direction (0 client to server, 1 back), QP, iteration.
pub(super) fn tag(dir: u64, qp: usize, seq: u64) -> u64 {
    dir << 63 | (qp as u64) << 40 | (seq & ((1 << 40) - 1))
}

/// splitmix64's finalizer.
pub(super) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fill `out` with the pattern of `tag` (byte `k` depends on the tag and `k / 8`).
pub(super) fn pattern(tag: u64, out: &mut [u8]) {
    let base = mix(tag);
    for (j, chunk) in out.chunks_mut(8).enumerate() {
        let w = mix(base ^ (j as u64).wrapping_mul(0xd1b5_4a32_d192_ed03)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// The first byte of `data` that differs from the pattern of `tag`: (offset, got, expected).
pub(super) fn first_mismatch(tag: u64, data: &[u8]) -> Option<(usize, u8, u8)> {
    let base = mix(tag);
    for (j, chunk) in data.chunks(8).enumerate() {
        let w = mix(base ^ (j as u64).wrapping_mul(0xd1b5_4a32_d192_ed03)).to_le_bytes();
        if chunk != &w[..chunk.len()] {
            let k = chunk.iter().zip(w).position(|(a, b)| *a != b).unwrap_or(0);
            return Some((j * 8 + k, chunk[k], w[k]));
        }
    }
    None
}

/// Write the pattern of `tag` to `[off, off+len)` of `mr`.
pub(super) fn put_pattern(
    mr: &MemoryRegion,
    off: usize,
    len: usize,
    tag: u64,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    scratch.resize(len, 0);
    pattern(tag, scratch);
    mr.write(off, scratch).map_err(e2s)
}

/// Check `[off, off+len)` of `mr` against the pattern of `tag`; `what` names the message.
pub(super) fn verify_region(
    mr: &MemoryRegion,
    off: usize,
    len: usize,
    tag: u64,
    scratch: &mut Vec<u8>,
    what: &dyn Fn() -> String,
) -> Result<(), String> {
    scratch.resize(len, 0);
    mr.read(off, scratch).map_err(e2s)?;
    match first_mismatch(tag, scratch) {
        None => Ok(()),
        Some((k, got, want)) => Err(format!(
            "data verification failed: {}: byte {k} of {len} is {got:#04x}, expected {want:#04x}",
            what()
        )),
    }
}

/// [`verify_region`] for a buffer polled for its last byte: the bytes before it may become
/// visible a moment later (copies need not store in address order), so a mismatch is
/// re-read for up to a second before it counts.
pub(super) fn verify_eventually(
    mr: &MemoryRegion,
    off: usize,
    len: usize,
    tag: u64,
    scratch: &mut Vec<u8>,
    what: &dyn Fn() -> String,
) -> Result<(), String> {
    let t = Instant::now();
    loop {
        match verify_region(mr, off, len, tag, scratch, what) {
            Ok(()) => return Ok(()),
            Err(e) if t.elapsed() > Duration::from_secs(1) => return Err(e),
            Err(_) => std::thread::yield_now(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Endpoints.
