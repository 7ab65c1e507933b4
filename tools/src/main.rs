//! The `xwarp` command: `demo`, `bench`, `run`.

use std::ffi::OsString;
use std::process::ExitCode;

const USAGE: &str = "\
usage: xwarp <command> [args...]

commands:
  demo            run the demo over the in-process virtual wire (no privileges needed)
  bench tcp       TCP benchmark: kernel vs xwarp over a veth pair (root)
  bench rdma      RDMA benchmark: xwarp verbs vs kernel TCP over a veth pair (root)
  bench shim      LD_PRELOAD shim benchmark: redis and sockperf servers, shim vs kernel (root)
  run -- CMD...   run an unmodified program on the xwarp engine (LD_PRELOAD shim)
  help            this text

Each command takes --help for its own options.";

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let cmd = args.remove(0);
    match cmd.to_str() {
        Some("demo") => xwarp_tools::demo::main(args),
        Some("bench") => xwarp_tools::bench::main(args),
        Some("run") => xwarp_tools::launcher::main(args),
        Some("help") | Some("--help") | Some("-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("xwarp: unknown command {cmd:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
