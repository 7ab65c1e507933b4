//! Benchmarks (`xwarp bench ...`): side-by-side measurements against the kernel.
//!
//! * `xwarp bench tcp`: kernel↔kernel, xwarp↔kernel and xwarp↔xwarp over one veth pair
//!   between two namespaces it creates (root): bulk throughput, 64-byte ping-pong half
//!   round trip, CPU time per GB. See [`tcp`].
//! * `xwarp bench rdma`: xwarp RDMA (Write/Read bandwidth, Write/Send latency) against
//!   kernel TCP bulk and ping-pong over one veth pair (root). See [`rdma`].
//! * `xwarp bench shim`: redis-server and sockperf server under the LD_PRELOAD shim vs on
//!   the kernel, redis-benchmark and sockperf ping-pong clients on the kernel (root). See
//!   [`shim`].

use std::ffi::OsString;
use std::process::ExitCode;

use xwarp::poll_driver::afxdp::{ChunkSize, XDP_PACKET_HEADROOM};

pub mod ceiling;
pub mod rdma;
pub mod shim;
pub mod tcp;

const USAGE: &str = "\
usage: xwarp bench <benchmark> [options]

benchmarks:
  tcp     kernel vs xwarp TCP over a veth pair (root); `xwarp bench tcp --help`
  rdma    xwarp RDMA vs kernel TCP over a veth pair (root); `xwarp bench rdma --help`
  shim    redis/sockperf servers under the LD_PRELOAD shim vs the kernel (root); `xwarp bench shim --help`";

/// Entry point of `xwarp bench ARGS...` (ARGS excludes `xwarp bench`).
pub fn main(args: Vec<OsString>) -> ExitCode {
    let Some(which) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match which.to_str() {
        Some("tcp") => tcp::main(args[1..].to_vec()),
        Some("rdma") => rdma::main(args[1..].to_vec()),
        Some("shim") => shim::main(args[1..].to_vec()),
        Some("help") | Some("--help") | Some("-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("xwarp bench: unknown benchmark {which:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The UMEM layout the benches' AF_XDP sockets use for an IP MTU: 4096-byte chunks when a
/// 2048-byte chunk cannot hold the frame, and multi-buffer chains (`multi_buffer`) when a
/// 4096-byte chunk cannot either.
pub(crate) fn umem_for_mtu(mtu: usize) -> (ChunkSize, bool) {
    let frame = mtu + 14;
    let chunk = if frame > ChunkSize::C2048.max_frame_size() {
        ChunkSize::C4096
    } else {
        ChunkSize::C2048
    };
    (chunk, frame > ChunkSize::C4096.max_frame_size())
}

/// RX UMEM chunks for an engine whose one bulk connection advertises `rx_buffer` bytes of
/// receive window at IP MTU `mtu` (see [`xwarp::toe::XdpEngineConfig::rx_frames`]): the
/// chunks a full window of full-sized frames occupies, plus a quarter, plus 64 for ACKs
/// and other small frames.
///
/// Why not the 2048-chunk default: the kernel fills RX chunks in address order, so the
/// whole area cycles through the cache, and over a veth that copy runs on the sending
/// engine's core, the bottleneck. At MTU 60000 the default area is 7.5 MiB; the copy into
/// it took 15-23% of the sending core against 10-14% with 768 chunks (3 interleaved pairs
/// of 3 s `perf` samples of write_bw, which ran 19.4 / 18.3 / 22.2 Gbit/s against
/// 21.6 / 24.3 / 23.3).
pub(crate) fn rx_frames_for(mtu: usize, rx_buffer: usize) -> u32 {
    let (chunk, multi_buffer) = umem_for_mtu(mtu);
    // TCP payload of a full frame (20-byte IP and TCP headers, 12 bytes of timestamps).
    let mss = mtu.saturating_sub(52).max(1);
    let frames = rx_buffer.div_ceil(mss);
    let per_frame = if multi_buffer {
        // Copy-mode multi-buffer RX chunks carry chunk - XDP_PACKET_HEADROOM bytes each.
        let data = chunk.bytes() as usize - XDP_PACKET_HEADROOM as usize;
        (mtu + 14).div_ceil(data)
    } else {
        1
    };
    let chunks = frames * per_frame;
    u32::try_from(chunks + chunks / 4 + 64).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full receive window of full-sized frames fits the RX area with room to spare, and
    /// the area is far below the 2048-chunk default at the bench MTUs.
    #[test]
    fn rx_frames_cover_a_full_window_of_full_frames() {
        for mtu in [1500usize, 4000, 9000, 16000, 60000] {
            let window = tcp::socket_buffer(mtu);
            let n = rx_frames_for(mtu, window) as usize;
            let (chunk, multi) = umem_for_mtu(mtu);
            let per_frame = if multi {
                (mtu + 14).div_ceil(chunk.bytes() as usize - 256)
            } else {
                1
            };
            let full_frames = window.div_ceil(mtu - 52);
            assert!(
                n >= full_frames * per_frame + 64,
                "mtu {mtu}: {n} chunks for {full_frames} frames of {per_frame}"
            );
            assert!(n < 2048, "mtu {mtu}: {n}");
        }
        // MTU 60000: 2 MiB window, 16 chunks a frame.
        assert_eq!(rx_frames_for(60000, 2 << 20), 764);
    }
}
