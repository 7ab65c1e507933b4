//! `xwarp stat` against running programs: a perftest bench on the virtual wire (no
//! privileges) and a TCP server under the LD_PRELOAD shim on a veth pair (root, AF_XDP).
//! Each test points the engines and `xwarp stat` at a private stats directory
//! (`XWARP_STATS_DIR`, `--dir`) so that engines of other tests or programs do not mix in.
#![cfg(target_os = "linux")]

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;

#[path = "support/shim_env.rs"]
mod shim_env;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const XWARP: &str = env!("CARGO_BIN_EXE_xwarp");
const WRITE_BW: &str = env!("CARGO_BIN_EXE_xwarp-write-bw");

/// A private stats directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("xwarp-stat-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn segments(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("xwarp-"))
            .collect()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child killed on drop.
struct Kid(Option<Child>);

impl Kid {
    fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// Wait (bounded) and return its output.
    fn finish(mut self, limit: Duration) -> Output {
        let mut c = self.0.take().unwrap();
        let t = Instant::now();
        while c.try_wait().unwrap().is_none() {
            if t.elapsed() > limit {
                let _ = c.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_with_output().unwrap()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn write_bw(dir: &Path, secs: u32) -> Kid {
    let c = Command::new(WRITE_BW)
        .args(["--vwire", "-D", &secs.to_string()])
        .env("XWARP_STATS_DIR", dir)
        .env_remove("XWARP_STATS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xwarp-write-bw");
    Kid(Some(c))
}

/// `xwarp stat ARGS --dir DIR`: its output.
fn stat(dir: &Path, args: &[&str]) -> Output {
    Command::new(XWARP)
        .arg("stat")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run xwarp stat")
}

fn stat_json(dir: &Path, args: &[&str]) -> Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let out = stat(dir, &a);
    assert!(
        out.status.success(),
        "xwarp stat failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["schema"], "xwarp-stat/1");
    v
}

fn engines(v: &Value) -> &Vec<Value> {
    v["engines"].as_array().expect("engines array")
}

fn u(v: &Value, p: &str) -> u64 {
    v.pointer(p)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no number at {p} in {v}"))
}

/// Poll `xwarp stat --json` until `ok` holds (10 s at most).
fn wait_for(dir: &Path, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let v = stat_json(dir, &[]);
        if ok(&v) {
            return v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{what}: {v:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Both engines of the bench up, with their connection, moving data.
fn bench_running(v: &Value) -> bool {
    let e = engines(v);
    e.len() == 2
        && e.iter().all(|e| {
            e["conns"]["records"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
                && e["nic"]["tx_bytes"].as_u64() > Some(1 << 20)
        })
}

#[test]
fn stat_sees_a_running_bench_its_counters_grow_and_its_segments_go_with_it() {
    let dir = Dir::new("bench");
    let bench = write_bw(&dir.0, 6);
    let first = wait_for(&dir.0, "bench engines with a connection", bench_running);
    std::thread::sleep(Duration::from_millis(400));
    let second = stat_json(&dir.0, &[]);
    let (a, b) = (engines(&first), engines(&second));
    assert_eq!(b.len(), 2, "{second:#}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x["path"], y["path"]);
        assert_eq!(x["pid"].as_u64(), Some(u64::from(bench.pid())));
        assert_eq!(x["program"], "xwarp-write-bw");
        assert_eq!(x["interface"], "vwire");
        assert_eq!(x["liveness"], "alive");
        assert_eq!(x["nic"]["mode_name"], "vwire");
        for c in [
            "/engine/iterations",
            "/engine/run_ns",
            "/nic/rx_frames",
            "/nic/tx_frames",
            "/nic/tx_bytes",
        ] {
            assert!(
                u(y, c) > u(x, c),
                "{c} did not grow: {} -> {}",
                u(x, c),
                u(y, c)
            );
        }
        let r = &y["conns"]["records"][0];
        assert_eq!(r["state_name"], "ESTAB");
        assert_eq!(r["hosted"], true, "the bench's connection is an iWARP one");
        // smoltcp does not expose the congestion window, the own core does
        // (XWARP_TCP_CORE=own); the engine's RTT estimate covers hosted connections too.
        match xwarp::stack::TcpCore::from_env() {
            xwarp::stack::TcpCore::Smoltcp => assert!(r["cwnd"].is_null(), "{r}"),
            xwarp::stack::TcpCore::Own => {
                assert!(r["cwnd"].as_u64().is_some_and(|c| c > 0), "{r}")
            }
        }
        assert!(r["srtt_us"].as_u64().is_some(), "no RTT sample: {r}");
        assert!(y["conns"]["consistent"].as_bool().unwrap());
    }
    // The client (10.77.0.1) sends, the server receives: their connection's byte counts
    // grow on the side that moves the data.
    let client = |v: &Value| -> Value {
        engines(v)
            .iter()
            .find(|e| e["address"] == "10.77.0.1/24")
            .expect("client engine")
            .clone()
    };
    let sent = |e: &Value| u(e, "/conns/records/0/bytes_sent");
    assert!(sent(&client(&second)) > sent(&client(&first)));
    assert!(u(&client(&second), "/stack/tx_bytes") > u(&client(&first), "/stack/tx_bytes"));
    let server_rx = u(&engines(&second)[1], "/conns/records/0/bytes_received")
        .max(u(&engines(&second)[0], "/conns/records/0/bytes_received"));
    assert!(server_rx > 1 << 20);
    // The QP table: one QP per engine in RTS with the MPA result of the bench's
    // connection (revision 1 or 2, CRC on by default), the server placing the client's
    // RDMA Writes (bytes placed grow between the two reads), the client posting them.
    let server = |v: &Value| -> Value {
        engines(v)
            .iter()
            .find(|e| e["address"] != "10.77.0.1/24")
            .expect("server engine")
            .clone()
    };
    for e in engines(&second) {
        let q = &e["qps"]["records"][0];
        assert_eq!(q["state"], "rts", "{q}");
        assert!(matches!(q["mpa_revision"].as_u64(), Some(1 | 2)), "{q}");
        assert_eq!(q["crc"], true, "{q}");
        assert_eq!(q["crc_errors"], 0, "{q}");
        assert_eq!(q["terminates_sent"], 0, "{q}");
    }
    let placed = |e: &Value| u(e, "/qps/records/0/bytes_placed");
    assert!(
        placed(&server(&second)) > placed(&server(&first)),
        "bytes placed did not grow: {} -> {}",
        placed(&server(&first)),
        placed(&server(&second))
    );
    assert!(u(&server(&second), "/qps/records/0/placements_tagged") > 0);
    let posted = |e: &Value| u(e, "/qps/records/0/wr_posted_send");
    assert!(posted(&client(&second)) > posted(&client(&first)));
    assert!(u(&client(&second), "/qps/records/0/bytes_sent") > 1 << 20);

    // --pid picks the process; another pid has no engine (a clear failure).
    let v = stat_json(&dir.0, &["--pid", &bench.pid().to_string()]);
    assert_eq!(engines(&v).len(), 2);
    let none = stat(&dir.0, &["--pid", "1"]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no xwarp engine in process 1"));
    // The text screen and --watch with --count.
    let text = stat(&dir.0, &["--watch", "0.2", "--count", "2"]);
    assert!(text.status.success());
    let t = String::from_utf8_lossy(&text.stdout);
    assert_eq!(
        t.matches("xwarp stat: 2 engines in 1 process").count(),
        2,
        "{t}"
    );
    assert!(
        t.contains("xwarp-write-bw") && t.contains("ESTAB*") && t.contains("/s)"),
        "{t}"
    );
    let lines = stat(&dir.0, &["--json", "--watch", "0.1", "--count", "3"]);
    let docs: Vec<Value> = String::from_utf8_lossy(&lines.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON document per line"))
        .collect();
    assert_eq!(docs.len(), 3);

    let out = bench.finish(Duration::from_secs(30));
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("BW average"));
    assert_eq!(
        dir.segments(),
        Vec::<String>::new(),
        "segments left after exit"
    );
    assert!(engines(&stat_json(&dir.0, &[])).is_empty());
}

#[test]
fn stat_reports_and_cleans_segments_of_a_killed_process_and_names_bad_files() {
    let dir = Dir::new("killed");
    let bench = write_bw(&dir.0, 30);
    let pid = bench.pid();
    wait_for(&dir.0, "bench engines", bench_running);
    drop(bench); // SIGKILL: no exit hook runs, the segments stay behind.
    assert_eq!(dir.segments().len(), 2);
    // A file under a segment name of a live process (ours) that is not a segment.
    let junk = dir.0.join(format!("xwarp-{}-9", std::process::id()));
    std::fs::write(&junk, b"hello").unwrap();
    let v = stat_json(&dir.0, &[]);
    assert!(engines(&v).is_empty(), "{v:#}");
    let stale = v["stale"].as_array().unwrap();
    assert_eq!(stale.len(), 2, "{v:#}");
    assert!(stale
        .iter()
        .all(|s| s["pid"].as_u64() == Some(u64::from(pid)) && s["reason"] == "process gone"));
    let errs = v["errors"].as_array().unwrap();
    assert_eq!(errs.len(), 1);
    assert!(errs[0]["error"]
        .as_str()
        .unwrap()
        .contains("truncated segment: 5 bytes"));
    let text = stat(&dir.0, &[]);
    let t = String::from_utf8_lossy(&text.stdout);
    assert!(
        t.contains("stale:") && t.contains("xwarp stat --clean"),
        "{t}"
    );
    assert!(t.contains("unreadable:"), "{t}");
    let clean = stat(&dir.0, &["--clean"]);
    assert!(clean.status.success());
    assert_eq!(
        String::from_utf8_lossy(&clean.stdout)
            .matches("removed ")
            .count(),
        2
    );
    // Only the junk of a live pid is left (it is not stale).
    assert_eq!(
        dir.segments(),
        vec![format!("xwarp-{}-9", std::process::id())]
    );
    // Bad options are clear errors.
    let bad = stat(&dir.0, &["--watch", "0"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--watch"));
    let missing = Command::new(XWARP)
        .args(["stat", "--dir", "/nonexistent/xwarp-stat"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/xwarp-stat"));
}

#[test]
fn publishing_is_off_with_xwarp_stats_0() {
    let dir = Dir::new("off");
    let c = Command::new(WRITE_BW)
        .args(["--vwire", "-D", "1"])
        .env("XWARP_STATS_DIR", &dir.0)
        .env("XWARP_STATS", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut kid = Kid(Some(c));
    let t = Instant::now();
    let mut seen = false;
    loop {
        seen |= !dir.segments().is_empty();
        let exited = kid
            .0
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        if exited || t.elapsed() > Duration::from_secs(20) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = kid.finish(Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("BW average"));
    assert!(!seen, "an engine published with XWARP_STATS=0");
}

#[test]
fn a_tcp_server_under_the_shim_shows_its_connection() {
    use shim_env::*;
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(137);
    let dir = Dir::new("shim");
    let flag = dir.0.join("release");
    // Echo one connection, then exit normally (the exit hook removes the segment).
    let server = "import socket\n\
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
        s.bind(('0.0.0.0', 7370)); s.listen(4)\n\
        while True:\n\
        \x20   c, _ = s.accept()\n\
        \x20   d = c.recv(1)\n\
        \x20   if not d:\n\
        \x20       c.close(); continue\n\
        \x20   while d:\n\
        \x20       c.sendall(d); d = c.recv(65536)\n\
        \x20   c.close(); break\n";
    let mut srv = net.shimmed(60, "python3", &["-c", server]);
    srv.env("XWARP_STATS_DIR", &dir.0).env_remove("XWARP_STATS");
    let srv = spawn(srv, "shim echo server");
    wait_port(&net, net.engine, 7370);
    // A kernel client in B: 256 KiB echoed and checked, then it holds the connection
    // until the test has looked.
    let client = format!(
        "import os, socket, time\n\
         data = os.urandom(256 << 10)\n\
         s = socket.create_connection(('{}', 7370), timeout=20)\n\
         s.sendall(data)\n\
         got = b''\n\
         while len(got) < len(data):\n\
         \x20   got += s.recv(65536)\n\
         assert got == data, 'echo differs'\n\
         t = time.time()\n\
         while not os.path.exists('{}') and time.time() - t < 20:\n\
         \x20   time.sleep(0.05)\n\
         s.close(); print('ok')\n",
        net.engine,
        flag.display()
    );
    let cli = spawn(net.in_b(40, "python3", &["-c", &client]), "client");
    let addr = format!("{}/24", net.engine);
    let v = wait_for(&dir.0, "the shim's connection", |v| {
        engines(v).iter().any(|e| {
            e["address"] == addr.as_str()
                && e["conns"]["records"].as_array().is_some_and(|r| {
                    r.iter().any(|c| {
                        c["state_name"] == "ESTAB"
                            && c["bytes_received"].as_u64() >= Some(256 << 10)
                    })
                })
        })
    });
    let e = engines(&v)
        .iter()
        .find(|e| e["address"] == addr.as_str())
        .unwrap();
    assert_eq!(e["program"], "python3");
    assert!(e["interface"].as_str().unwrap().starts_with(&net.pair.if_a));
    let mode = e["nic"]["mode_name"].as_str().unwrap();
    assert!(mode.starts_with("xdp-"), "{mode}");
    assert!(!e["nic"]["zero_copy"].is_null());
    let c = e["conns"]["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["state_name"] == "ESTAB")
        .unwrap();
    assert_eq!(c["local"], format!("{}:7370", net.engine));
    assert!(c["remote"]
        .as_str()
        .unwrap()
        .starts_with(&net.pair.addr_b.to_string()));
    assert_eq!(c["hosted"], false);
    assert!(c["bytes_sent"].as_u64() >= Some(256 << 10), "{c}");
    assert!(
        !c["srtt_us"].is_null(),
        "an echoing connection has an RTT sample: {c}"
    );
    let text = String::from_utf8_lossy(&stat(&dir.0, &[]).stdout).into_owned();
    eprintln!("{text}");
    assert!(
        text.contains("python3") && text.contains(":7370 -> "),
        "{text}"
    );
    std::fs::write(&flag, b"").unwrap();
    let out = cli.wait_output(Duration::from_secs(30));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    let out = srv.wait_output(Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Instant::now();
    while !dir.segments().is_empty() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        dir.segments(),
        Vec::<String>::new(),
        "segment left after exit"
    );
}
