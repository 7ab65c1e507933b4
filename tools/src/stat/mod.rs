//! `xwarp stat`: the live counters of every running xwarp engine, read from the
//! shared-memory segments the engines keep (`xwarp-telemetry`), without stopping them.
//!
//! ```text
//! xwarp stat                    every engine of every process, once
//! xwarp stat --pid 1234         only process 1234's engines
//! xwarp stat --watch [SECS]     refresh every SECS seconds (1); --count N stops after N
//! xwarp stat --json             one JSON document (per refresh with --watch: JSON lines)
//! xwarp stat --clean            remove the segments of processes that died
//! ```
//!
//! The JSON document (`"schema": "xwarp-stat/1"`) is
//! `{schema, time_unix_ns, dir, engines: [..], stale: [..], errors: [..]}`: `engines`
//! holds one object per live engine with the fields of
//! `xwarp_telemetry::reader::EngineSnapshot` (`pid`, `index`, `program`, `interface`,
//! `address`, `liveness`, `engine`, `nic`, `stack` counter objects, `conns` and `qps`
//! tables of records with `records`, `dropped`, `published_unix_ns`, `consistent`),
//! plus `state_name` in each connection record and `mode_name` in `nic`; values the
//! engine does not know are `null`. `stale` lists segments of dead processes (`path`,
//! `pid`, `index`, `reason`), `errors` files that could not be read (`path`, `error`).

mod render;

use std::collections::HashMap;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use xwarp_telemetry::layout::{mode_name, tcp_state_name, NA};
use xwarp_telemetry::reader::{self, EngineSnapshot, Found, Liveness, ReadError};

/// Options of `xwarp stat`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct StatArgs {
    /// Only the engines of process PID.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Refresh every SECS seconds (default 1) until interrupted or --count is reached.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1")]
    pub watch: Option<f64>,
    /// With --watch: stop after N refreshes.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Print JSON (schema "xwarp-stat/1"; one document per line with --watch).
    #[arg(long)]
    pub json: bool,
    /// Remove the segments of processes that are gone, then exit.
    #[arg(long)]
    pub clean: bool,
    /// Directory of the segments (default: $XWARP_STATS_DIR or /dev/shm).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// One look at the stats directory.
#[derive(Debug)]
pub struct Scan {
    /// Live engines (and engines stopping), sorted by pid and index.
    pub engines: Vec<EngineSnapshot>,
    /// Segments of processes that are gone: path, pid, index, why.
    pub stale: Vec<(PathBuf, u32, u32, &'static str)>,
    /// Files that could not be read.
    pub errors: Vec<(PathBuf, ReadError)>,
}

/// Read every segment in `dir` (only process `pid`'s if given).
pub fn scan(dir: &std::path::Path, pid: Option<u32>) -> io::Result<Scan> {
    let mut out = Scan {
        engines: Vec::new(),
        stale: Vec::new(),
        errors: Vec::new(),
    };
    for f in reader::scan(dir)? {
        if pid.is_some_and(|p| p != f.pid) {
            continue;
        }
        let stale = f.is_stale();
        let Found {
            path,
            pid,
            index,
            segment,
        } = f;
        match segment {
            Ok(s) if stale => {
                let why = if s.liveness == Liveness::PidReused {
                    "pid reused by another process"
                } else {
                    "process gone"
                };
                out.stale.push((path, pid, index, why));
            }
            Ok(s) => out.engines.push(s),
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) if stale => out.stale.push((path, pid, index, "process gone")),
            Err(e) => out.errors.push((path, e)),
        }
    }
    Ok(out)
}

/// `NA` (not known) as JSON null, recursively in an object's number fields.
fn nulls(v: &mut Value) {
    match v {
        Value::Object(m) => m.values_mut().for_each(nulls),
        Value::Array(a) => a.iter_mut().for_each(nulls),
        Value::Number(n) if n.as_u64() == Some(NA) => *v = Value::Null,
        _ => {}
    }
}

/// The JSON document of one scan (schema "xwarp-stat/1").
pub fn to_json(dir: &std::path::Path, s: &Scan) -> Value {
    let engines: Vec<Value> = s
        .engines
        .iter()
        .map(|e| {
            let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
            nulls(&mut v);
            if let Some(nic) = v.get_mut("nic").and_then(Value::as_object_mut) {
                nic.insert("mode_name".into(), json!(mode_name(e.nic.mode)));
            }
            if let Some(recs) = v
                .pointer_mut("/conns/records")
                .and_then(Value::as_array_mut)
            {
                for (r, c) in recs.iter_mut().zip(&e.conns.records) {
                    if let Some(o) = r.as_object_mut() {
                        o.insert("state_name".into(), json!(tcp_state_name(c.state)));
                    }
                }
            }
            v
        })
        .collect();
    json!({
        "schema": "xwarp-stat/1",
        "time_unix_ns": xwarp_telemetry::unix_ns(),
        "dir": dir,
        "engines": engines,
        "stale": s.stale.iter().map(|(p, pid, i, why)| json!({
            "path": p, "pid": pid, "index": i, "reason": why
        })).collect::<Vec<_>>(),
        "errors": s.errors.iter().map(|(p, e)| json!({
            "path": p, "error": e.to_string()
        })).collect::<Vec<_>>(),
    })
}

fn run(a: &StatArgs) -> Result<bool, String> {
    let dir = a.dir.clone().unwrap_or_else(xwarp_telemetry::stats_dir);
    let show = |e: io::Error| format!("{}: {e}", dir.display());
    if a.clean {
        let c = reader::clean(&dir).map_err(show)?;
        for p in &c.removed {
            println!("removed {}", p.display());
        }
        for (p, e) in &c.failed {
            eprintln!("xwarp stat: cannot remove {}: {e}", p.display());
        }
        if c.removed.is_empty() && c.failed.is_empty() {
            println!("no stale segments in {}", dir.display());
        }
        return Ok(c.failed.is_empty());
    }
    let every = match a.watch {
        Some(s) if !(0.05..=86_400.0).contains(&s) => {
            return Err(format!(
                "--watch: {s} seconds is out of range (0.05 to 86400)"
            ))
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let rounds = match (every, a.count) {
        (_, Some(0)) => return Err("--count must be at least 1".into()),
        (Some(_), n) => n.unwrap_or(u64::MAX),
        (None, _) => 1,
    };
    let tty = io::stdout().is_terminal();
    let mut prev: HashMap<PathBuf, (Instant, EngineSnapshot)> = HashMap::new();
    let mut found_any = false;
    for round in 0..rounds {
        let t0 = Instant::now();
        let s = scan(&dir, a.pid).map_err(show)?;
        found_any |= !s.engines.is_empty();
        let mut out = io::stdout().lock();
        let text = if a.json {
            let mut t = to_json(&dir, &s).to_string();
            t.push('\n');
            t
        } else {
            let mut t = String::new();
            if every.is_some() && tty {
                t.push_str("\x1b[H\x1b[2J");
            } else if round > 0 {
                t.push('\n');
            }
            render::screen(&mut t, &dir, &s, &prev, a.pid);
            t
        };
        if out
            .write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            // Reader gone (a pipe closed): stop quietly.
            return Ok(true);
        }
        drop(out);
        let now = Instant::now();
        prev = s
            .engines
            .into_iter()
            .map(|e| (e.path.clone(), (now, e)))
            .collect();
        if round + 1 < rounds {
            if let Some(d) = every {
                std::thread::sleep(d.saturating_sub(t0.elapsed()));
            }
        }
    }
    Ok(a.pid.is_none() || found_any)
}

/// Entry point of `xwarp stat`.
pub fn main(a: &StatArgs) -> ExitCode {
    match run(a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            if let (Some(pid), false) = (a.pid, a.clean) {
                eprintln!("xwarp stat: no xwarp engine in process {pid}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("xwarp stat: {e}");
            ExitCode::FAILURE
        }
    }
}
