//! perftest-style `write_bw` over xwarp::verbs (see [`xwarp_tools::perftest`]).
//!
//! Both ends in one process: `cargo run --release --bin xwarp-write-bw -- --vwire`.
//! One end per process (root; each engine owns an address the kernel does not have):
//!
//! ```text
//! server: xwarp-write-bw --iface IF --addr 10.0.0.10/24 --verify
//! client: xwarp-write-bw --iface IF --addr 10.0.0.20/24 --verify 10.0.0.10
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    xwarp_tools::cli::init_logging();
    xwarp_tools::perftest::main(xwarp_tools::perftest::Test::WriteBw)
}
