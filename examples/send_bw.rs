//! perftest-style `send_bw` over xwarp::verbs (see [`xwarp::verbs::perftest`]).
//!
//! `cargo run --release --example send_bw -- --vwire -s 65536 -n 5000`

use std::process::ExitCode;

fn main() -> ExitCode {
    xwarp::verbs::perftest::main(xwarp::verbs::perftest::Test::SendBw)
}
