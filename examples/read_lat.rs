//! perftest-style `read_lat` over xwarp::verbs (see [`xwarp::verbs::perftest`]).
//!
//! `cargo run --release --example read_lat -- --vwire -s 65536 -n 5000`

use std::process::ExitCode;

fn main() -> ExitCode {
    xwarp::verbs::perftest::main(xwarp::verbs::perftest::Test::ReadLat)
}
