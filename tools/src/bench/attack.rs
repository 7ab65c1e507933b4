//! `xwarp bench attack`: the attack suite of `tools/tests/attack.rs` with bigger volumes
//! ([`crate::attack::Volumes::bench`]), on the virtual wire (no root). Prints one row per
//! attack: volume, process RSS before / during / after and the bound, the victim's held
//! connections, the legitimate flow's throughput during the attack against without, what
//! the attacker received, the bytes changed outside what it may touch (must be 0) and the
//! checks that failed; `--json FILE` writes the same. Options: `--only NAME[,NAME...]`,
//! `--scale N` (multiply the volumes), `--json FILE`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::process::ExitCode;

use crate::attack::{self, Outcome, Volumes, ATTACKS};

/// Options of `xwarp bench attack`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Attacks to run (all when empty).
    pub only: Vec<String>,
    /// Volume multiplier (1 = the bench's volumes).
    pub scale: u64,
    /// Write JSON here too.
    pub json: Option<std::path::PathBuf>,
}

const USAGE: &str = "usage: xwarp bench attack [--only NAME[,NAME...]] [--scale N] [--json FILE]";

/// Parse the arguments after `xwarp bench attack`.
pub fn parse_args(args: &[OsString]) -> Result<Options, String> {
    let mut o = Options {
        scale: 1,
        ..Options::default()
    };
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--only" => {
                for n in val()?.split(',') {
                    if !ATTACKS.contains(&n) {
                        return Err(format!(
                            "unknown attack {n} (known: {})",
                            ATTACKS.join(", ")
                        ));
                    }
                    o.only.push(n.to_string());
                }
            }
            "--scale" => {
                o.scale = val()?
                    .parse()
                    .ok()
                    .filter(|&s| s >= 1)
                    .ok_or("--scale needs a positive integer")?
            }
            "--json" => o.json = Some(val()?.into()),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    Ok(o)
}

fn scaled(v: Volumes, k: u64) -> Volumes {
    Volumes {
        acks: v.acks * k,
        syns: v.syns * k,
        connections: v.connections * k,
        mpa_requests: v.mpa_requests * k,
        ooo_segments: v.ooo_segments * k,
        tiny_fpdus: v.tiny_fpdus * k,
        reads: v.reads * k,
        guesses: v.guesses * k,
    }
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

/// The table of `outcomes`.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| attack | volume | heap MiB before/during/after | RSS MiB before/during/after | bound | conns held | legit MB/s during/without | attacker got | outside changed | failed checks |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        let _ = writeln!(
            s,
            "| {} | {} {} | {}/{}/{} | {}/{}/{} | {} | {} | {:.1}/{:.1} ({:.2}×) | {} | {} | {} |",
            o.attack,
            o.volume,
            o.unit,
            mib(o.before.heap),
            mib(o.during.heap),
            mib(o.after.heap),
            mib(o.before.rss),
            mib(o.during.rss),
            mib(o.after.rss),
            o.bound,
            o.during.connections(),
            o.legit_during / 1e6,
            o.legit_base / 1e6,
            o.legit_fraction(),
            o.attacker_got,
            o.outside_changed,
            if o.failures().is_empty() {
                "none".to_string()
            } else {
                o.failures().join("; ")
            }
        );
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// `outcomes` as JSON.
pub fn json(outcomes: &[Outcome]) -> String {
    let rows: Vec<String> = outcomes
        .iter()
        .map(|o| {
            let checks: Vec<String> = o
                .checks
                .iter()
                .map(|(c, ok)| format!("{{\"check\":\"{}\",\"ok\":{ok}}}", esc(c)))
                .collect();
            format!(
                "{{\"attack\":\"{}\",\"volume\":{},\"unit\":\"{}\",\"heap_before\":{},\"heap_during\":{},\"heap_after\":{},\"rss_before\":{},\"rss_during\":{},\"rss_after\":{},\"bound\":\"{}\",\"connections_held\":{},\"legit_bytes_per_s_during\":{:.0},\"legit_bytes_per_s_without\":{:.0},\"legit_fraction\":{:.3},\"attacker_got\":\"{}\",\"outside_changed\":{},\"checks\":[{}]}}",
                esc(&o.attack),
                o.volume,
                o.unit,
                o.before.heap,
                o.during.heap,
                o.after.heap,
                o.before.rss,
                o.during.rss,
                o.after.rss,
                esc(&o.bound),
                o.during.connections(),
                o.legit_during,
                o.legit_base,
                o.legit_fraction(),
                esc(&o.attacker_got),
                o.outside_changed,
                checks.join(",")
            )
        })
        .collect();
    format!("[\n{}\n]\n", rows.join(",\n"))
}

/// Entry point of `xwarp bench attack ARGS...`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}\nattacks: {}", ATTACKS.join(", "));
        return ExitCode::SUCCESS;
    }
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xwarp bench attack: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let v = scaled(Volumes::bench(), o.scale);
    let mut outcomes = Vec::new();
    for name in ATTACKS
        .iter()
        .filter(|n| o.only.is_empty() || o.only.iter().any(|x| x == *n))
    {
        eprintln!("xwarp bench attack: {name} ...");
        match attack::run(name, &v) {
            Ok(out) => outcomes.push(out),
            Err(e) => {
                eprintln!("xwarp bench attack: {name}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    print!("{}", table(&outcomes));
    if let Some(path) = &o.json {
        if let Err(e) = std::fs::write(path, json(&outcomes)) {
            eprintln!("xwarp bench attack: writing {}: {e}", path.display());
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
