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
//! * `xwarp bench attack`: the attack suite on the virtual wire with bigger volumes (no
//!   root): memory, legitimate throughput, what the attacker got. See [`attack`].
//!
//! * `xwarp bench scale`: 64-byte request/response at 1 to 10,000 concurrent connections
//!   and memory per idle connection, kernel and xwarp over one veth pair (root). See
//!   [`scale`].
//!
//! Every bench writes the same JSON shape with `--json FILE` ([`report`]); `bench tcp` and
//! `bench rdma` draw it with `--plot FILE.svg` ([`plot`]) and print per-second progress
//! lines during their bandwidth measurements ([`progress`]; `--quiet` stops them).

pub mod attack;
pub mod ceiling;
pub mod common;
pub mod plot;
pub mod progress;
pub mod rdma;
pub mod report;
pub mod scale;
pub mod shim;
pub mod shim_out;
pub mod tcp;
