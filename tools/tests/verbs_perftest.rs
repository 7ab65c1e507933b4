//! The perftest tools: both ends in one process over the virtual wire (short runs), and
//! the binaries as two processes (server in namespace A, client in namespace B)
//! on AF_XDP engines over a veth pair, data verified (`--verify`). The two-process tests
//! need root and AF_XDP; without them they print `SKIPPED: <reason>` to stderr and return.
#![cfg(target_os = "linux")]

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;

use std::io::{Read, Write};

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xwarp::poll_driver::netns::VethPair;
use xwarp_tools::perftest::{parse, run_vwire, Test};

fn run(test: Test, args: &[&str]) -> String {
    let o = parse(test, args.iter().map(Into::into).collect()).expect("options");
    run_vwire(test, &o).unwrap_or_else(|e| panic!("{test:?}: {e}"))
}

/// The line under the report's column titles.
fn result_line(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.contains("#bytes"))
        .nth(1)
        .unwrap_or_else(|| panic!("no result line in:\n{out}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn bandwidth_tools_report_the_requested_iterations() {
    for (test, args) in [
        (
            Test::WriteBw,
            &["--vwire", "-s", "65536", "-n", "200", "-q", "2"][..],
        ),
        (Test::ReadBw, &["--vwire", "-s", "16384", "-n", "200"][..]),
        (
            Test::SendBw,
            &["--vwire", "-s", "4096", "-n", "1000", "-q", "2"][..],
        ),
    ] {
        let out = run(test, args);
        let cols = result_line(&out);
        let qps: u64 = args
            .windows(2)
            .find(|w| w[0] == "-q")
            .map_or(1, |w| w[1].parse().unwrap());
        let n: u64 = args.windows(2).find(|w| w[0] == "-n").unwrap()[1]
            .parse()
            .unwrap();
        assert_eq!(cols[0], args[2], "{out}");
        assert_eq!(cols[1].parse::<u64>().unwrap(), n * qps, "{out}");
        assert!(cols[3].parse::<f64>().unwrap() > 0.0, "{out}");
    }
}

#[test]
fn latency_tools_report_percentiles() {
    for test in [Test::WriteLat, Test::ReadLat, Test::SendLat] {
        let out = run(test, &["--vwire", "-s", "64", "-n", "200"]);
        let cols: Vec<f64> = result_line(&out)
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(cols[0], 64.0);
        assert_eq!(cols[1], 200.0);
        // min <= typical <= p99 <= p99.9 <= max
        assert!(
            cols[2] <= cols[4] && cols[4] <= cols[7] && cols[7] <= cols[8] && cols[8] <= cols[3],
            "{out}"
        );
    }
}

#[test]
fn duration_mode_stops_on_time() {
    let t0 = Instant::now();
    let out = run(Test::WriteBw, &["--vwire", "-s", "8192", "-D", "1"]);
    assert!(t0.elapsed() < Duration::from_secs(10), "{out}");
    assert!(out.contains("BW average"));
}

/// Every tool with `--verify` (both ends check the pattern) over a lossy virtual wire,
/// CRC on and off; sizes that are not a multiple of the 8-byte pattern word.
#[test]
fn verify_mode_checks_every_tool_over_a_lossy_wire() {
    for test in [
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
    ] {
        for crc in [true, false] {
            let mut args = vec!["--vwire", "--loss", "0.01", "--verify", "-s", "3001"];
            args.extend(["-n", "150"]);
            if !crc {
                args.push("--no-crc");
            }
            let out = run(test, &args);
            assert!(out.contains("Data verify     : ON"), "{out}");
            let want = if crc {
                "CRC (MPA)       : ON"
            } else {
                "CRC (MPA)       : OFF"
            };
            assert!(out.contains(want), "{out}");
            let cols = result_line(&out);
            assert_eq!(cols[0], "3001", "{test:?}: {out}");
            assert_eq!(cols[1], "150", "{test:?}: {out}");
        }
    }
}

/// The perftest tools in interface mode (`--veth`): both ends on AF_XDP engines over a
/// veth pair; every iteration completes and is reported.
#[test]
fn xdp_perftest_veth_mode_reports_every_iteration() {
    require_root_and_afxdp!();
    use xwarp_tools::perftest::run_veth;
    for (test, args) in [
        (Test::WriteBw, &["--veth", "-s", "65536", "-n", "300"][..]),
        (Test::SendLat, &["--veth", "-s", "64", "-n", "300"][..]),
    ] {
        let o = parse(test, args.iter().map(Into::into).collect()).expect("options");
        assert!(o.veth);
        let out = run_veth(test, &o).unwrap_or_else(|e| panic!("{test:?}: {e}"));
        assert!(out.contains("AF_XDP on a veth pair"), "{out}");
        let line = out
            .lines()
            .skip_while(|l| !l.contains("#bytes"))
            .nth(1)
            .unwrap_or_else(|| panic!("{out}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[0], args[2], "{out}");
        assert_eq!(cols[1], "300", "{out}");
    }
    let both = ["--veth", "--vwire"].iter().map(Into::into).collect();
    assert!(parse(Test::WriteBw, both).is_err());
}

// ---------------------------------------------------------------------------------------
// The binaries as two processes.

/// The two-process runs one at a time: each has four busy threads (two engines, two
/// waiting ends) on a small shared machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The path of the perftest binary `name` (`xwarp-write-bw`, ...), built by cargo for
/// this test.
fn tool(name: &str) -> String {
    match name {
        "xwarp-write-bw" => env!("CARGO_BIN_EXE_xwarp-write-bw"),
        "xwarp-write-lat" => env!("CARGO_BIN_EXE_xwarp-write-lat"),
        "xwarp-read-bw" => env!("CARGO_BIN_EXE_xwarp-read-bw"),
        "xwarp-read-lat" => env!("CARGO_BIN_EXE_xwarp-read-lat"),
        "xwarp-send-bw" => env!("CARGO_BIN_EXE_xwarp-send-bw"),
        "xwarp-send-lat" => env!("CARGO_BIN_EXE_xwarp-send-lat"),
        other => panic!("no perftest binary {other}"),
    }
    .to_owned()
}

/// Collected output of a child.
type Sink = Arc<Mutex<String>>;

/// How a child ended: exit code (`None` if killed), stdout, stderr.
type Outcome = (Option<i32>, String, String);

/// A child process with its output collected; killed (and reaped) on drop.
struct Proc {
    child: Option<Child>,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    what: String,
}

impl Proc {
    fn spawn(mut cmd: Command, what: &str) -> Proc {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let pipes: [(Box<dyn Read + Send>, &Sink); 2] = [
            (Box::new(child.stdout.take().expect("stdout")), &out),
            (Box::new(child.stderr.take().expect("stderr")), &err),
        ];
        for (mut pipe, sink) in pipes {
            let sink = sink.clone();
            readers.push(std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }));
        }
        Proc {
            child: Some(child),
            out,
            err,
            readers,
            what: what.to_string(),
        }
    }

    fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Wait up to `limit`: (exit code, `None` if killed on the limit or by a signal;
    /// stdout; stderr).
    fn wait(mut self, limit: Duration) -> Outcome {
        let mut child = self.child.take().expect("child");
        let t = Instant::now();
        let code = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break st.code();
            }
            if t.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                let _ = writeln!(std::io::stderr(), "{}: killed after {limit:?}", self.what);
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let out = self.out.lock().unwrap().clone();
        let err = self.err.lock().unwrap().clone();
        (code, out, err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Bound on one process of a run (debug builds on a loaded 2-core machine).
const LIMIT: Duration = Duration::from_secs(120);

/// One tool as server (namespace A, `10.88.<net>.10` on veth-a) and client (namespace B,
/// `10.88.<net>.20` on veth-b, connecting to the server): the server's args, then the
/// client's. Returns (exit code, stdout, stderr) of the server and of the client.
fn two_process(
    net: u8,
    name: &str,
    server_args: &[&str],
    client_args: &[&str],
) -> (Outcome, Outcome) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bin = tool(name);
    // Declared first, dropped last: the processes end before the namespaces go away.
    let pair = VethPair::new(net).expect("veth pair");
    let server_ip = format!("10.88.{net}.10");
    let mut cmd = pair.a.command(&bin).expect("namespace A");
    cmd.args(["--iface", &pair.if_a, "--addr", &format!("{server_ip}/24")])
        .args(server_args);
    let mut server = Proc::spawn(cmd, &format!("{name} server"));
    let t = Instant::now();
    while !server.stdout().contains("Waiting for client") {
        if server.exited() || t.elapsed() > Duration::from_secs(30) {
            let (code, out, err) = server.wait(Duration::from_secs(1));
            panic!("{name} server did not start listening ({code:?}):\n{out}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut cmd = pair.b.command(&bin).expect("namespace B");
    cmd.args([
        "--iface",
        &pair.if_b,
        "--addr",
        &format!("10.88.{net}.20/24"),
    ])
    .args(client_args)
    .arg(&server_ip);
    let client = Proc::spawn(cmd, &format!("{name} client"));
    let c = client.wait(LIMIT);
    let s = server.wait(if c.0.is_some() {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(1)
    });
    (s, c)
}

/// Run `name` with the same `args` (plus `--verify`) on both ends; both must succeed and
/// report `iters` iterations of `size` bytes.
fn verified_run(net: u8, name: &str, args: &[&str], size: &str, iters: &str) {
    require_root_and_afxdp!();
    let mut args = args.to_vec();
    args.push("--verify");
    let (s, c) = two_process(net, name, &args, &args);
    let show = format!(
        "server {:?}:\n{}\n{}\nclient {:?}:\n{}\n{}",
        s.0, s.1, s.2, c.0, c.1, c.2
    );
    assert_eq!(c.0, Some(0), "{show}");
    assert_eq!(s.0, Some(0), "{show}");
    for out in [&s.1, &c.1] {
        assert!(out.contains("Data verify     : ON"), "{show}");
        assert!(out.contains("CRC (MPA)       : ON"), "{show}");
        assert!(out.contains("AF_XDP on veth-"), "{show}");
        let cols = result_line(out);
        assert_eq!(cols[0], size, "{show}");
        assert_eq!(cols[1], iters, "{show}");
    }
    assert!(
        s.1.contains("results measured by the client at 10.88."),
        "{show}"
    );
    assert!(
        !s.2.contains("panicked") && !c.2.contains("panicked"),
        "{show}"
    );
}

#[test]
fn two_processes_write_bw_verified() {
    verified_run(
        150,
        "xwarp-write-bw",
        &["-s", "8192", "-n", "200", "-q", "2"],
        "8192",
        "400",
    );
}

#[test]
fn two_processes_read_bw_verified() {
    verified_run(
        151,
        "xwarp-read-bw",
        &["-s", "8192", "-n", "200"],
        "8192",
        "200",
    );
}

#[test]
fn two_processes_send_bw_verified() {
    verified_run(
        152,
        "xwarp-send-bw",
        &["-s", "4096", "-n", "500", "-q", "2"],
        "4096",
        "1000",
    );
}

#[test]
fn two_processes_write_lat_verified() {
    verified_run(
        153,
        "xwarp-write-lat",
        &["-s", "64", "-n", "100"],
        "64",
        "100",
    );
}

#[test]
fn two_processes_send_lat_verified() {
    // Above the inline limit: the Sends go from registered memory.
    verified_run(
        154,
        "xwarp-send-lat",
        &["-s", "1000", "-n", "100"],
        "1000",
        "100",
    );
}

#[test]
fn two_processes_read_lat_verified() {
    verified_run(
        155,
        "xwarp-read-lat",
        &["-s", "64", "-n", "100"],
        "64",
        "100",
    );
}

/// A server started with other options rejects the client; both ends say why and fail.
#[test]
fn two_processes_with_different_options_fail_with_the_reason() {
    require_root_and_afxdp!();
    let (s, c) = two_process(
        156,
        "xwarp-write-bw",
        &["-s", "64", "-n", "50"],
        &["-s", "128", "-n", "50", "--verify"],
    );
    let show = format!("server:\n{}\n{}\nclient:\n{}\n{}", s.1, s.2, c.1, c.2);
    assert_eq!(s.0, Some(1), "{show}");
    assert_eq!(c.0, Some(1), "{show}");
    for err in [&s.2, &c.2] {
        assert!(err.contains("-s 128 (server 64)"), "{show}");
        assert!(err.contains("--verify on (server off)"), "{show}");
        assert!(!err.contains("panicked"), "{show}");
    }
    assert!(c.2.contains("rejected the connection"), "{show}");
}

/// A missing interface and an unreachable server: a clear message, exit status 1.
#[test]
fn missing_interface_and_unreachable_host_are_clear_errors() {
    require_root_and_afxdp!();
    let bin = tool("xwarp-send-lat");
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pair = VethPair::new(157).expect("veth pair");
    let mut cmd = pair.a.command(&bin).expect("namespace A");
    cmd.args([
        "--iface",
        "nope0",
        "--addr",
        "10.88.157.10/24",
        "10.88.157.20",
    ]);
    let (code, _, err) = Proc::spawn(cmd, "send_lat --iface nope0").wait(LIMIT);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("nope0") && err.contains("No such device"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    // Nobody owns 10.88.157.99: ARP goes unanswered, the connect times out.
    let mut cmd = pair.a.command(&bin).expect("namespace A");
    cmd.args([
        "--iface",
        &pair.if_a,
        "--addr",
        "10.88.157.10/24",
        "10.88.157.99",
    ]);
    let t = Instant::now();
    let (code, _, err) = Proc::spawn(cmd, "send_lat to nobody").wait(LIMIT);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("cannot connect to 10.88.157.99:18515"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
}

/// Bad command lines: exit status 2, the problem and the usage on stderr, no panic.
#[test]
fn bad_command_lines_exit_with_status_2() {
    for (name, args, says) in [
        ("xwarp-write-bw", &[][..], "--iface"),
        ("xwarp-read-bw", &["--iface", "eth0"][..], "--addr"),
        (
            "xwarp-send-bw",
            &["--iface", "eth0", "--addr", "1.2.3.4/40"][..],
            "--addr",
        ),
        (
            "xwarp-write-lat",
            &["--vwire", "-s", "lots"][..],
            "-s: not a number",
        ),
        (
            "xwarp-read-lat",
            &["--vwire", "--frobnicate"][..],
            "--frobnicate",
        ),
        (
            "xwarp-send-lat",
            &["--vwire", "10.0.0.1"][..],
            "only used with --iface",
        ),
    ] {
        let mut cmd = Command::new(tool(name));
        cmd.args(args);
        let (code, out, err) = Proc::spawn(cmd, name).wait(Duration::from_secs(30));
        assert_eq!(code, Some(2), "{name} {args:?}: {out}\n{err}");
        assert!(err.contains(says), "{name} {args:?}: {err}");
        assert!(err.contains(&format!("usage: {name}")), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
