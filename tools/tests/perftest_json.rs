//! The perftest-style tools' `--json FILE` (`-`: stdout): a report of the bench schema
//! (`xwarp-bench/1`, bench `perftest`) parsed back with the schema's own types, its rows
//! checked against the table line the tool printed. Over the in-process virtual wire (no
//! privileges).

use std::path::PathBuf;
use std::process::{Command, Output};

use xwarp_tools::bench::report::{Report, Row, Side, Unit, SCHEMA};

const WRITE_BW: &str = env!("CARGO_BIN_EXE_xwarp-write-bw");
const SEND_LAT: &str = env!("CARGO_BIN_EXE_xwarp-send-lat");
const READ_LAT: &str = env!("CARGO_BIN_EXE_xwarp-read-lat");
const SEND_BW: &str = env!("CARGO_BIN_EXE_xwarp-send-bw");

fn run(bin: &str, args: &[&str]) -> Output {
    let out = Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{bin}: {e}"));
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xwarp-perftest-json-{}-{name}", std::process::id()))
}

/// The numbers of the line under the table heading that starts with ` #bytes`.
fn table_numbers(text: &str) -> Vec<f64> {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| l.trim_start().starts_with("#bytes"))
        .unwrap_or_else(|| panic!("no table heading in:\n{text}"));
    let line = lines.next().expect("a result line");
    line.split_whitespace()
        .map(|w| w.parse().unwrap_or_else(|_| panic!("{w:?} in {line:?}")))
        .collect()
}

fn row<'a>(r: &'a Report, test: &str, name: &str, metric: &str, unit: Unit) -> &'a Row {
    let row = r
        .find(test, name, metric)
        .unwrap_or_else(|| panic!("no row {test}/{name}/{metric} in {:?}", r.rows));
    assert_eq!(row.unit, unit, "{metric}");
    assert_eq!(row.side, Side::Xwarp, "{metric}");
    assert!(row.value.is_finite() && row.value >= 0.0, "{row:?}");
    row
}

/// `a` and `b` agree to the table's rounding (`decimals` places) and a hair more.
fn close(a: f64, b: f64, decimals: i32, what: &str) {
    let tol = 0.5 * 10f64.powi(-decimals) + 1e-9 * a.abs().max(b.abs());
    assert!((a - b).abs() <= tol, "{what}: JSON {a} vs table {b}");
}

fn check_config(r: &Report, test: &str, size: u64, iters: u64) {
    assert_eq!(r.schema, SCHEMA);
    assert_eq!(r.bench, "perftest");
    let c = |k: &str| {
        r.config
            .get(k)
            .unwrap_or_else(|| panic!("config {k}: {:?}", r.config))
    };
    assert_eq!(c("test"), test);
    assert_eq!(c("size").as_u64(), Some(size));
    assert_eq!(c("iterations").as_u64(), Some(iters));
    assert_eq!(c("transport"), "vwire");
    assert_eq!(c("crc"), true);
    assert_eq!(c("verify"), false);
    assert!(c("mtu").as_u64().is_some_and(|m| m >= 576));
    assert!(r.elapsed_s.is_finite() && r.elapsed_s > 0.0);
}

#[test]
fn write_bw_json_on_stdout_matches_its_table() {
    let out = run(
        WRITE_BW,
        &["--vwire", "-s", "4096", "-n", "200", "--json", "-"],
    );
    let json = String::from_utf8(out.stdout).unwrap();
    // stdout is the JSON alone; the table went to stderr.
    let table = String::from_utf8(out.stderr).unwrap();
    let r = Report::from_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    check_config(&r, "write_bw", 4096, 200);
    let n = table_numbers(&table);
    let [size, msgs, peak, avg, mpps, gbps] = n[..] else {
        panic!("table line {n:?}")
    };
    assert_eq!((size, msgs), (4096.0, 200.0));
    let bw = row(&r, "bulk", "write_bw", "bandwidth", Unit::Gbps);
    let avg_row = row(&r, "bulk", "write_bw", "bw_average", Unit::MBps);
    let peak_row = row(&r, "bulk", "write_bw", "bw_peak", Unit::MBps);
    let rate = row(&r, "bulk", "write_bw", "msg_rate", Unit::PerSec);
    for x in [bw, avg_row, peak_row, rate] {
        assert_eq!(x.size, Some(4096));
        assert_eq!(x.bytes, Some(200 * 4096));
        assert!(x.value > 0.0, "{x:?}");
    }
    close(avg_row.value, avg, 2, "BW average");
    close(peak_row.value, peak, 2, "BW peak");
    close(bw.value, gbps, 3, "BW Gbit/s");
    close(rate.value / 1e6, mpps, 6, "MsgRate");
    // The rows agree with each other: Gbit/s from MB/s, bytes per message.
    close(
        bw.value,
        avg_row.value * 8.0 / 1e3,
        9,
        "Gbit/s = MB/s * 8e-3",
    );
    let per_msg = avg_row.value * 1e6 / rate.value;
    assert!((per_msg - 4096.0).abs() < 1e-6 * 4096.0, "{per_msg}");
    assert!(peak_row.value >= avg_row.value);
}

fn check_latency(r: &Report, table: &str, test: &str, iters: u64, halved: bool) {
    let n = table_numbers(table);
    let [_size, count, min, max, typical, avg, stdev, p99, p999] = n[..] else {
        panic!("table line {n:?}")
    };
    assert_eq!(count, iters as f64);
    let m = |metric| row(r, "pingpong", test, metric, Unit::Us);
    for (metric, t) in [
        ("latency_min", min),
        ("latency_max", max),
        ("latency_p50", typical),
        ("latency_avg", avg),
        ("latency_stdev", stdev),
        ("latency_p99", p99),
        ("latency_p999", p999),
    ] {
        close(m(metric).value, t, 2, metric);
        let note = m(metric).note.clone().unwrap_or_default();
        assert_eq!(note.contains("half the round trip"), halved, "{note}");
    }
    let v = |metric| m(metric).value;
    assert!(v("latency_min") > 0.0);
    assert!(v("latency_min") <= v("latency_p50"));
    assert!(v("latency_p50") <= v("latency_p99"));
    assert!(v("latency_p99") <= v("latency_p999"));
    assert!(v("latency_p999") <= v("latency_max"));
    let d = m("latency_p50")
        .dist
        .clone()
        .expect("the p50 row has the distribution");
    assert_eq!(d.count, iters);
    assert_eq!(d.p50, v("latency_p50"));
    assert_eq!(
        (d.min, d.max, d.p99),
        (v("latency_min"), v("latency_max"), v("latency_p99"))
    );
    assert!(d
        .cdf
        .iter()
        .all(|[x, f]| x.is_finite() && (0.0..=1.0).contains(f)));
    assert!(d
        .cdf
        .windows(2)
        .all(|w| w[0][0] <= w[1][0] && w[0][1] < w[1][1]));
    assert_eq!(d.cdf.last().map(|p| p[1]), Some(1.0));
}

#[test]
fn send_lat_json_file_matches_its_table() {
    let path = scratch("send_lat.json");
    let p = path.to_str().unwrap();
    let out = run(SEND_LAT, &["--vwire", "-n", "200", "--json", p]);
    let table = String::from_utf8(out.stdout).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let r = Report::from_json(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    check_config(&r, "send_lat", 2, 200);
    check_latency(&r, &table, "send_lat", 200, true);
    // Exactly the latency rows, nothing else.
    assert_eq!(r.rows.len(), 7, "{:?}", r.rows);
}

#[test]
fn read_lat_json_is_the_whole_round_trip() {
    let path = scratch("read_lat.json");
    let p = path.to_str().unwrap();
    let out = run(READ_LAT, &["--vwire", "-s", "64", "-n", "150", "--json", p]);
    let table = String::from_utf8(out.stdout).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let r = Report::from_json(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    check_config(&r, "read_lat", 64, 150);
    check_latency(&r, &table, "read_lat", 150, false);
}

#[test]
fn json_errors_are_clear() {
    // An --iface server has no measurements of its own.
    let out = Command::new(SEND_BW)
        .args(["--iface", "lo", "--addr", "10.9.9.9/24", "--json", "x.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--json is written by the client"), "{err}");
    // An unwritable path fails the run, after the table.
    let out = Command::new(WRITE_BW)
        .args([
            "--vwire",
            "-s",
            "1024",
            "-n",
            "20",
            "--json",
            "/nonexistent-dir/x.json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent-dir/x.json"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("BW average"));
}
