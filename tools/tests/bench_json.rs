//! Every bench's `--json FILE` parses back into the schema's own types
//! (`xwarp_tools::bench::report::Report`) with nothing lost (the parsed report serialises
//! to the same JSON value), carries the rows that bench measures with finite values and
//! the ratios the rows imply, and `bench tcp` / `bench rdma` write their `--plot` SVG and
//! per-second intervals. Each runs the real `xwarp` binary briefly:
//!
//! * `bench attack` on the virtual wire (no root);
//! * `bench tcp`, `bench rdma` (short runs, two sizes) and `bench shim` (sockperf only)
//!   over veth pairs: root and AF_XDP, else a loud `SKIPPED:` line.

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;
#[path = "support/shim_env.rs"]
mod shim_env;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use xwarp_tools::bench::report::{Report, Side, Unit, SCHEMA};

const XWARP: &str = env!("CARGO_BIN_EXE_xwarp");

/// A scratch file path unique to this process and `name`.
fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xwarp-bench-json-{}-{name}", std::process::id()))
}

/// Run `xwarp ARGS`, killed after `limit`; its output.
fn xwarp(args: &[&str], limit: Duration) -> Output {
    let child = Command::new(XWARP)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xwarp");
    let pid = child.id();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let h = s.spawn(move || child.wait_with_output());
        while !h.is_finished() {
            if t0.elapsed() > limit {
                // SAFETY: kill has no memory preconditions; pid is our own child's.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        h.join().expect("join").expect("wait xwarp")
    })
}

/// Check the run succeeded and its JSON parses into a [`Report`] of `bench` that loses
/// nothing; the report.
fn parse_back(out: &Output, path: &Path, bench: &str) -> Report {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "xwarp bench {bench}: {}\nstdout:\n{}\nstderr:\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let text = std::fs::read_to_string(path).expect("the JSON file");
    let _ = std::fs::remove_file(path);
    let rep = Report::from_json(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(rep.schema, SCHEMA);
    assert_eq!(rep.bench, bench);
    let original: serde_json::Value = serde_json::from_str(&text).unwrap();
    let again = serde_json::to_value(&rep).unwrap();
    assert_eq!(again, original, "fields lost in parsing the {bench} report");
    assert!(!rep.rows.is_empty(), "no rows: {text}");
    assert!(rep.host.cpus >= 1 && !rep.host.kernel.is_empty());
    assert!(
        rep.started.ends_with('Z') && rep.started.len() == 20,
        "{}",
        rep.started
    );
    for r in &rep.rows {
        assert!(r.value.is_finite(), "{r:?}");
        if let Some(d) = &r.dist {
            assert!(d.count > 0 && d.p50 <= d.p99 && d.cdf.last().map(|p| p[1]) == Some(1.0));
        }
    }
    rep
}

/// Every xwarp row's `ratio_to_kernel` is its value over the kernel row it names.
fn check_ratios(rep: &Report) {
    for r in rep.rows.iter().filter(|r| r.side == Side::Xwarp) {
        let (Some(ratio), Some(k)) = (r.ratio_to_kernel, r.kernel_row.as_deref()) else {
            continue;
        };
        let base = rep
            .rows
            .iter()
            .find(|b| {
                b.side == Side::Kernel
                    && b.name == k
                    && b.test == r.test
                    && b.metric == r.metric
                    && b.size == r.size
            })
            .unwrap_or_else(|| panic!("no kernel row {k} for {r:?}"));
        assert!(
            (ratio - r.value / base.value).abs() < 1e-9,
            "{r:?} / {base:?}"
        );
    }
}

/// The SVG at `path` is XML naming `series` in its text.
fn check_plot(path: &Path, series: &[&str]) {
    let svg = std::fs::read_to_string(path).expect("the SVG file");
    let _ = std::fs::remove_file(path);
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(str::trim))
        .collect();
    for s in series {
        assert!(texts.contains(s), "no series {s:?} in {texts:?}");
    }
}

#[test]
fn bench_attack_json_parses_back_with_rows_facts_and_checks() {
    let path = scratch("attack.json");
    let out = xwarp(
        &[
            "bench",
            "attack",
            "--only",
            "read-beyond-ird",
            "--json",
            path.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    let rep = parse_back(&out, &path, "attack");
    let t = "read-beyond-ird";
    for m in ["volume", "heap_during", "rss_during", "legit_fraction"] {
        assert!(rep.find(t, "victim", m).is_some(), "no {m}: {:?}", rep.rows);
    }
    assert_eq!(rep.value(t, "victim", "outside_changed"), Some(0.0));
    assert!(rep.facts.iter().any(|f| f.test == t && f.name == "bound"));
    assert!(
        !rep.checks.is_empty() && rep.checks.iter().all(|c| c.ok),
        "{:?}",
        rep.checks
    );
    // The table is generated from the same rows.
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("| read-beyond-ird | 64 "), "{table}");
}

#[test]
fn bench_tcp_json_and_plot_parse_back_root() {
    require_root_and_afxdp!();
    let _serial = shim_env::serial();
    let (json, svg) = (scratch("tcp.json"), scratch("tcp.svg"));
    let out = xwarp(
        &[
            "bench",
            "tcp",
            "--duration",
            "0.3",
            "--repeat",
            "1",
            "--sizes",
            "4K,64K",
            "--net",
            "171",
            "--mode",
            "thread",
            "--tcp-core",
            "smoltcp",
            "--quiet",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        Duration::from_secs(240),
    );
    let rep = parse_back(&out, &json, "tcp");
    check_ratios(&rep);
    // xwarp rows are named pair/mode/tcp-core.
    for pair in [
        "kernel-kernel",
        "xwarp-kernel/thread/smoltcp",
        "xwarp-xwarp/thread/smoltcp",
    ] {
        for size in [4096, 65536] {
            let r = rep
                .rows
                .iter()
                .find(|r| r.name == pair && r.metric == "bandwidth" && r.size == Some(size))
                .unwrap_or_else(|| panic!("no {pair} bulk at {size}"));
            assert!(r.value > 0.0 && r.unit == Unit::Gbps && r.bytes.unwrap_or(0) > 0);
            if pair != "kernel-kernel" {
                assert!(
                    r.ratio_to_kernel.is_some() && r.ratio_to_ceiling.is_some(),
                    "{r:?}"
                );
            }
        }
    }
    // Every latency row has p50 (with its distribution), p90 and p99, in order; the
    // ceiling's and the busy-polling kernel's too, in the same run.
    for pair in [
        "kernel-kernel",
        "kernel-busypoll",
        "xwarp-kernel/thread/smoltcp",
        "xwarp-xwarp/thread/smoltcp",
        "afxdp-ceiling",
    ] {
        let lat = rep
            .find("pingpong", pair, "latency_p50")
            .unwrap_or_else(|| panic!("no {pair} ping-pong row"));
        assert!(lat.dist.as_ref().is_some_and(|d| d.count > 0), "{lat:?}");
        let p90 = rep.value("pingpong", pair, "latency_p90").expect("p90");
        let p99 = rep.value("pingpong", pair, "latency_p99").expect("p99");
        assert!(
            lat.value > 0.0 && lat.value <= p90 && p90 <= p99,
            "{pair}: {} {p90} {p99}",
            lat.value
        );
        let x = rep.find("pingpong", pair, "latency_p90").unwrap();
        assert_eq!(x.size, Some(64), "{x:?}");
    }
    let busy = rep
        .find("pingpong", "kernel-busypoll", "latency_p50")
        .unwrap();
    assert_eq!(busy.side, Side::Kernel);
    assert!(rep.find("bulk", "kernel-busypoll", "bandwidth").is_none());
    let x = rep
        .find("pingpong", "xwarp-xwarp/thread/smoltcp", "latency_p50")
        .unwrap();
    assert_eq!(x.kernel_row.as_deref(), Some("kernel-kernel"));
    assert!(x.ratio_to_ceiling.is_some(), "{x:?}");
    let c = rep
        .find("bulk", "afxdp-ceiling", "bandwidth")
        .expect("ceiling row");
    assert_eq!((c.side, c.size), (Side::Ceiling, None));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("x busy") && table.contains("p90"), "{table}");
    assert_eq!(
        rep.config.get("tcp_core").and_then(|v| v.as_str()),
        Some("smoltcp")
    );
    // Intervals of every bulk run were kept; --quiet printed none of them.
    assert!(rep
        .intervals
        .iter()
        .any(|i| i.name == "xwarp-xwarp/thread/smoltcp" && i.bytes > 0));
    assert!(rep
        .intervals
        .iter()
        .any(|i| i.name == "kernel-kernel" && i.retransmits.is_some()));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(" Gbit/s   retr"));
    check_plot(
        &svg,
        &[
            "kernel-kernel",
            "xwarp-xwarp/thread/smoltcp",
            "afxdp-ceiling (MTU frames)",
            "xwarp-xwarp/thread/smoltcp (us)",
        ],
    );
}

#[test]
fn bench_rdma_json_and_plot_parse_back_root() {
    require_root_and_afxdp!();
    let _serial = shim_env::serial();
    let (json, svg) = (scratch("rdma.json"), scratch("rdma.svg"));
    let out = xwarp(
        &[
            "bench",
            "rdma",
            "--duration",
            "0.3",
            "--sizes",
            "4K,64K",
            "--net",
            "172",
            // The perftest rows have their own test below.
            "--only",
            "write_bw,read_bw,write_lat,send_lat,tcp,ceiling",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        Duration::from_secs(240),
    );
    let rep = parse_back(&out, &json, "rdma");
    check_ratios(&rep);
    for name in ["tcp", "write_bw", "read_bw"] {
        for size in [4096, 65536] {
            let r = rep
                .rows
                .iter()
                .find(|r| r.name == name && r.metric == "bandwidth" && r.size == Some(size))
                .unwrap_or_else(|| panic!("no {name} at {size}"));
            assert!(r.value > 0.0, "{r:?}");
        }
    }
    for name in ["tcp", "tcp-polled", "write_lat", "send_lat"] {
        let r = rep.find("pingpong", name, "latency_p50").expect(name);
        assert!(r.dist.as_ref().is_some_and(|d| d.count > 0), "{r:?}");
    }
    let w = rep.find("pingpong", "write_lat", "latency_p50").unwrap();
    assert_eq!(w.kernel_row.as_deref(), Some("tcp"));
    // Not --quiet: the progress lines were printed, and kept.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("[bulk write_bw 65536 B]"), "{stderr}");
    assert!(rep
        .intervals
        .iter()
        .any(|i| i.name == "write_bw" && i.bytes > 0));
    check_plot(
        &svg,
        &[
            "tcp",
            "write_bw",
            "read_bw",
            "write_lat (us)",
            "tcp-polled (us)",
        ],
    );
}

/// The perftest rows: Debian's `ib_write_bw -R` and `ib_send_lat -R` under `xwarp run`
/// between two engines, beside the Rust-API rows and kernel TCP of the same run; the
/// parsed bandwidth and latencies are positive and the C ABI rows are the quotient and
/// difference of the rows they compare.
#[test]
fn bench_rdma_perftest_rows_parse_back_root() {
    require_root_and_afxdp!();
    if !Path::new("/usr/bin/ib_write_bw").exists() || !Path::new("/usr/bin/ib_send_lat").exists() {
        println!("SKIPPED: bench rdma perftest rows: /usr/bin/ib_write_bw or ib_send_lat missing (apt-get install perftest)");
        return;
    }
    let _serial = shim_env::serial();
    let (shim, ibverbs) = (shim_env::shim(), shim_env::ibverbs());
    let json = scratch("rdma-perftest.json");
    let out = xwarp(
        &[
            "bench",
            "rdma",
            "--duration",
            "1",
            "--only",
            "tcp,write_bw,send_lat,ib_write_bw,ib_send_lat",
            "--perftest-iters",
            "300",
            "--net",
            "174",
            "--quiet",
            "--preload",
            shim.to_str().unwrap(),
            "--rdma-lib",
            ibverbs.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
        Duration::from_secs(240),
    );
    let rep = parse_back(&out, &json, "rdma");
    check_ratios(&rep);
    let bw = |name: &str| {
        rep.rows
            .iter()
            .find(|r| {
                r.test == "bulk"
                    && r.name == name
                    && r.metric == "bandwidth"
                    && r.size == Some(65536)
            })
            .unwrap_or_else(|| panic!("no {name} bandwidth: {:?}", rep.rows))
    };
    let (c, rust) = (bw("ib_write_bw"), bw("write_bw"));
    assert!(c.value > 0.0 && c.unit == Unit::Gbps, "{c:?}");
    assert_eq!(c.kernel_row.as_deref(), Some("tcp"), "{c:?}");
    for m in ["latency_p50", "latency_avg", "latency_p99"] {
        let r = rep
            .find("pingpong", "ib_send_lat", m)
            .unwrap_or_else(|| panic!("no ib_send_lat {m}"));
        assert!(
            r.value > 0.0 && r.unit == Unit::Us && r.size == Some(64),
            "{r:?}"
        );
    }
    let lat = rep.value("pingpong", "ib_send_lat", "latency_p50").unwrap();
    let (p99, avg) = (
        rep.value("pingpong", "ib_send_lat", "latency_p99").unwrap(),
        rep.value("pingpong", "ib_send_lat", "latency_avg").unwrap(),
    );
    assert!(p99 >= lat && avg > 0.0, "p99 {p99} typical {lat}");
    let ratio = rep
        .find("c-abi", "ib_write_bw/write_bw", "bandwidth_ratio")
        .expect("bandwidth ratio");
    assert!(
        (ratio.value - c.value / rust.value).abs() < 1e-9,
        "{ratio:?}"
    );
    let added = rep
        .value("c-abi", "ib_send_lat-send_lat", "latency_added_p50")
        .expect("latency added");
    let rust_lat = rep.value("pingpong", "send_lat", "latency_p50").unwrap();
    assert!((added - (lat - rust_lat)).abs() < 1e-9, "{added}");
    assert_eq!(
        rep.config.get("perftest_iters").and_then(|v| v.as_u64()),
        Some(300)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for l in [
        "ib_write_bw 64 KiB (Gb/s)",
        "ib_send_lat typ",
        "ib_write_bw / write_bw 64 KiB",
        "ib_send_lat - send_lat p50 64 B",
    ] {
        assert!(table.contains(l), "{l:?} not in the table:\n{table}");
    }
}

#[test]
fn bench_shim_json_parses_back_root() {
    require_root_and_afxdp!();
    let _serial = shim_env::serial();
    shim_env::ensure_tool("redis-server", "redis-server");
    shim_env::ensure_tool("redis-benchmark", "redis-tools");
    shim_env::ensure_tool("sockperf", "sockperf");
    let json = scratch("shim.json");
    let out = xwarp(
        &[
            "bench",
            "shim",
            "--only",
            "sockperf",
            "--duration",
            "1",
            "--net",
            "173",
            "--preload",
            shim_env::shim().to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ],
        Duration::from_secs(240),
    );
    let rep = parse_back(&out, &json, "shim");
    check_ratios(&rep);
    let t = "sockperf ping-pong 64 B";
    for name in ["kernel", "shim"] {
        for m in ["latency_avg", "latency_p50", "latency_p99", "round_trips"] {
            let r = rep
                .find(t, name, m)
                .unwrap_or_else(|| panic!("no {name} {m}"));
            assert!(r.value > 0.0, "{r:?}");
        }
    }
    assert!(rep
        .find(t, "shim", "latency_p50")
        .unwrap()
        .ratio_to_kernel
        .is_some());
}
