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

pub mod ceiling;
pub mod common;
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
