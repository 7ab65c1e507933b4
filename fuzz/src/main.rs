//! `xwarp-fuzz`: a stable-Rust mutation fuzzer for the xwarp wire parsers.
//!
//! ```text
//! xwarp-fuzz --list
//! xwarp-fuzz --target fpdu --seconds 60 [--seed N]
//! xwarp-fuzz --all --seconds 10
//! ```

mod engine;
mod targets;

use std::process::ExitCode;
use std::time::Duration;

fn usage() -> ExitCode {
    eprintln!("usage: xwarp-fuzz (--list | --all | --target NAME) [--seconds N] [--seed N]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seconds = 10u64;
    let mut seed = 0x5eed_u64;
    let mut chosen: Vec<&'static engine::Target> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| args.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match args[i].as_str() {
            "--list" => {
                for t in targets::ALL {
                    println!("{}", t.name);
                }
                return ExitCode::SUCCESS;
            }
            "--all" => chosen.extend(targets::ALL.iter()),
            "--target" => match args
                .get(i + 1)
                .and_then(|n| targets::ALL.iter().find(|t| t.name == n))
            {
                Some(t) => {
                    chosen.push(t);
                    i += 1;
                }
                None => return usage(),
            },
            "--seconds" => match value(i) {
                Some(v) => {
                    seconds = v;
                    i += 1;
                }
                None => return usage(),
            },
            "--seed" => match value(i) {
                Some(v) => {
                    seed = v;
                    i += 1;
                }
                None => return usage(),
            },
            _ => return usage(),
        }
        i += 1;
    }
    if chosen.is_empty() {
        return usage();
    }
    let mut failed = 0;
    for t in &chosen {
        let report = engine::fuzz(t, Duration::from_secs(seconds), seed);
        match report.crash {
            None => println!(
                "fuzz {:<12} ok      {:>10} execs in {} s",
                t.name, report.execs, seconds
            ),
            Some(input) => {
                let path = format!("fuzz-crash-{}.bin", t.name);
                let _ = std::fs::write(&path, &input);
                println!(
                    "fuzz {:<12} PANIC after {} execs; input saved to {path}",
                    t.name, report.execs
                );
                failed += 1;
            }
        }
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
