//! `xwarp bench attack`: the attack suite of `tools/tests/attack.rs` with bigger volumes
//! ([`crate::attack::Volumes::bench`]), on the virtual wire (no root). Prints one row per
//! attack: volume, process RSS before / during / after and the bound, the victim's held
//! connections, the legitimate flow's throughput during the attack against without, what
//! the attacker received, the bytes changed outside what it may touch (must be 0) and the
//! checks that failed; `--json FILE` writes the same as a report of the bench schema
//! ([`super::report`]: rows, facts and checks). Options: `--only NAME[,NAME...]`,
//! `--scale N` (multiply the volumes), `--json FILE`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::process::ExitCode;

use std::time::Instant;

use super::plot::write_outputs;
use super::report::{Check, Fact, Report, Row, Side, Unit};
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

fn mib(b: f64) -> String {
    format!("{:.1}", b / (1u64 << 20) as f64)
}

/// Fill `rep` (made when the run started) with the options and the outcomes.
///
/// Rows (test: the attack; name `victim`, side xwarp): `volume` (count; the note names
/// the unit), `heap_before` / `heap_during` / `heap_after` and `rss_before` / `rss_during`
/// / `rss_after` (B), `connections_held` (count), `legit_during` and `legit_without` (MB/s
/// of the legitimate flow), `legit_fraction` (ratio), `outside_changed` (B, must be 0).
/// Facts: `bound`, `attacker_got`. Checks: every check with its result.
pub fn fill(rep: &mut Report, o: &Options, outcomes: &[Outcome]) {
    rep.config("scale", o.scale);
    rep.config("only", o.only.clone());
    for out in outcomes {
        let t = out.attack.as_str();
        let row = |metric: &str, unit, v: f64| Row::new(t, "victim", Side::Xwarp, metric, unit, v);
        rep.push(row("volume", Unit::Count, out.volume as f64).note(out.unit));
        for (when, m) in [
            ("before", &out.before),
            ("during", &out.during),
            ("after", &out.after),
        ] {
            rep.push(row(&format!("heap_{when}"), Unit::Bytes, m.heap as f64));
            rep.push(row(&format!("rss_{when}"), Unit::Bytes, m.rss as f64));
        }
        rep.push(row(
            "connections_held",
            Unit::Count,
            out.during.connections() as f64,
        ));
        rep.push(row("legit_during", Unit::MBps, out.legit_during / 1e6));
        rep.push(row("legit_without", Unit::MBps, out.legit_base / 1e6));
        rep.push(row("legit_fraction", Unit::Ratio, out.legit_fraction()));
        rep.push(row(
            "outside_changed",
            Unit::Bytes,
            out.outside_changed as f64,
        ));
        for (name, value) in [("bound", &out.bound), ("attacker_got", &out.attacker_got)] {
            rep.facts.push(Fact {
                test: t.into(),
                name: name.into(),
                value: value.clone(),
            });
        }
        for (c, ok) in &out.checks {
            rep.checks.push(Check {
                test: t.into(),
                name: c.clone(),
                ok: *ok,
            });
        }
    }
}

/// The table, generated from the report's rows, facts and checks.
pub fn table(rep: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| attack | volume | heap MiB before/during/after | RSS MiB before/during/after | bound | conns held | legit MB/s during/without | attacker got | outside changed | failed checks |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    let mut attacks: Vec<&str> = Vec::new();
    for r in &rep.rows {
        if !attacks.contains(&r.test.as_str()) {
            attacks.push(&r.test);
        }
    }
    for t in attacks {
        let v = |m: &str| rep.value(t, "victim", m).unwrap_or(f64::NAN);
        let fact = |n: &str| {
            rep.facts
                .iter()
                .find(|f| f.test == t && f.name == n)
                .map_or("", |f| f.value.as_str())
        };
        let failed: Vec<&str> = rep
            .checks
            .iter()
            .filter(|c| c.test == t && !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        let unit = rep
            .find(t, "victim", "volume")
            .and_then(|r| r.note.as_deref())
            .unwrap_or("");
        let _ = writeln!(
            s,
            "| {t} | {} {unit} | {}/{}/{} | {}/{}/{} | {} | {} | {:.1}/{:.1} ({:.2}×) | {} | {} | {} |",
            v("volume"),
            mib(v("heap_before")),
            mib(v("heap_during")),
            mib(v("heap_after")),
            mib(v("rss_before")),
            mib(v("rss_during")),
            mib(v("rss_after")),
            fact("bound"),
            v("connections_held"),
            v("legit_during"),
            v("legit_without"),
            v("legit_fraction"),
            fact("attacker_got"),
            v("outside_changed"),
            if failed.is_empty() {
                "none".to_string()
            } else {
                failed.join("; ")
            }
        );
    }
    s
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
    let (t0, mut rep) = (Instant::now(), Report::new("attack"));
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
    fill(&mut rep, &o, &outcomes);
    rep.finish(t0);
    print!("{}", table(&rep));
    if let Err(e) = write_outputs(&rep, o.json.as_deref(), None) {
        eprintln!("xwarp bench attack: {e}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
