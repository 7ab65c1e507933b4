//! The `xwarp` command: `demo`, `devices`, `run`, `bench {tcp,rdma,shim,attack}`, `stat`.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xwarp_tools::demo::DemoArgs;

mod stat;

/// xwarp: a userspace TCP offload engine and iWARP (RDMA over TCP) stack.
///
/// Each command takes --help for its own options.
#[derive(Parser, Debug)]
#[command(name = "xwarp", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the demo over the in-process virtual wire (no privileges needed).
    Demo(DemoArgs),
    /// Network interfaces and what AF_XDP can do on each (`--probe IFACE` tries for real).
    Devices(xwarp_tools::devices::DevicesArgs),
    /// Run an unmodified program on the xwarp engine (LD_PRELOAD shim): `xwarp run
    /// [options] -- CMD [ARGS...]`; see `xwarp run --help`.
    #[command(disable_help_flag = true)]
    Run(Passthrough),
    /// Benchmarks against the kernel (root). `--pcap FILE` (any bench) records every
    /// frame of the xwarp engines (XWARP_PCAP; `bench shim` adds `-%p`: one file per program).
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
    /// Live counters of running engines (every process's, read from /dev/shm): per engine,
    /// per TCP connection and per queue pair; see `xwarp stat --help`.
    Stat(stat::StatArgs),
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// TCP: kernel vs xwarp over a veth pair (root); see `xwarp bench tcp --help`.
    #[command(disable_help_flag = true)]
    Tcp(Passthrough),
    /// RDMA: xwarp verbs vs kernel TCP over a veth pair (root); see `xwarp bench rdma --help`.
    #[command(disable_help_flag = true)]
    Rdma(Passthrough),
    /// LD_PRELOAD shim: redis and sockperf servers, shim vs kernel (root); see `xwarp bench
    /// shim --help`.
    #[command(disable_help_flag = true)]
    Shim(Passthrough),
    /// Attack suite: hostile peers against an engine on the virtual wire (no root); see
    /// `xwarp bench attack --help`.
    #[command(disable_help_flag = true)]
    Attack(Passthrough),
    /// Request/response at 1 to 10,000 connections and memory per idle connection, xwarp
    /// vs kernel over a veth pair (root); see `xwarp bench scale --help`.
    #[command(disable_help_flag = true)]
    Scale(Passthrough),
}

/// The arguments of a command with a clap parser of its own (`xwarp run`: `launcher`;
/// `xwarp bench ...`: `bench::*::options`), which reads everything after its name.
#[derive(clap::Args, Debug)]
struct Passthrough {
    #[arg(num_args = 0.., allow_hyphen_values = true, trailing_var_arg = true)]
    args: Vec<OsString>,
}

/// The words of `argv` that name the command (`xwarp run`, `xwarp bench tcp`, ...): only
/// those go through this parser for a command with a parser of its own, so `--` and the
/// command's options reach that one unchanged.
fn command_words(argv: &[OsString]) -> usize {
    let word = |i: usize| argv.get(i).and_then(|a| a.to_str());
    match (word(1), word(2)) {
        (Some("run"), _) => 2,
        (Some("bench"), Some("tcp" | "rdma" | "shim" | "attack" | "scale")) => 3,
        _ => argv.len(),
    }
}

/// Counts live heap bytes for `xwarp bench attack` (a relaxed atomic per allocation).
#[global_allocator]
static ALLOC: xwarp_tools::attack::lab::CountingAlloc = xwarp_tools::attack::lab::CountingAlloc;

fn main() -> ExitCode {
    xwarp_tools::cli::init_logging();
    let argv: Vec<OsString> = std::env::args_os().collect();
    let n = command_words(&argv);
    let mut rest = argv[n..].to_vec();
    if argv.get(1).is_some_and(|a| a == "bench") {
        // `--pcap FILE` on every bench: XWARP_PCAP for its engines and the programs it
        // starts (set before any thread exists).
        match xwarp_tools::cli::take_pcap_flag(&mut rest) {
            Ok(Some(mut f)) => {
                if argv.get(2).is_some_and(|a| a == "shim") {
                    f = xwarp_tools::cli::per_process(&f);
                }
                std::env::set_var(xwarp::poll_driver::pcap::PCAP_ENV, f)
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("xwarp bench: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let cli = Cli::parse_from(&argv[..n]);
    match cli.command {
        Command::Demo(a) => xwarp_tools::demo::main(&a),
        Command::Devices(a) => xwarp_tools::devices::main(&a),
        Command::Run(_) => xwarp_tools::launcher::main(rest),
        Command::Stat(a) => stat::main(&a),
        Command::Bench { which } => {
            // Ctrl-C / SIGTERM: remove the namespaces, veth pairs and processes it made.
            let name = match which {
                Bench::Tcp(_) => "xwarp bench tcp",
                Bench::Rdma(_) => "xwarp bench rdma",
                Bench::Shim(_) => "xwarp bench shim",
                Bench::Attack(_) => "xwarp bench attack",
                Bench::Scale(_) => "xwarp bench scale",
            };
            if let Err(e) = xwarp_tools::bench::common::install_teardown(name) {
                eprintln!("{name}: cannot install the signal handler: {e}");
            }
            match which {
                Bench::Tcp(_) => xwarp_tools::bench::tcp::main(rest),
                Bench::Rdma(_) => xwarp_tools::bench::rdma::main(rest),
                Bench::Shim(_) => xwarp_tools::bench::shim::main(rest),
                Bench::Attack(_) => xwarp_tools::bench::attack::main(rest),
                Bench::Scale(_) => xwarp_tools::bench::scale::main(rest),
            }
        }
    }
}
