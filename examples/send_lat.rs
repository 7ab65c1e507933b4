//! perftest-style `send_lat` over xwarp::verbs (see [`xwarp::verbs::perftest`]).
//!
//! Both ends in one process: `cargo run --release --example send_lat -- --vwire`.
//! One end per process (root; each engine owns an address the kernel does not have):
//!
//! ```text
//! server: send_lat --iface IF --addr 10.0.0.10/24 --verify
//! client: send_lat --iface IF --addr 10.0.0.20/24 --verify 10.0.0.10
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    xwarp::verbs::perftest::main(xwarp::verbs::perftest::Test::SendLat)
}
