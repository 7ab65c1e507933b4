//! Real, unmodified programs under the LD_PRELOAD shim (`libxwarp_preload.so`).
//!
//! Topology per test: a veth pair between namespaces A and B (`VethPair`); programs under
//! the shim run in A with the engine bound by AF_XDP to `veth-a` and owning `10.88.<net>.10`
//! (an address the kernel in A does not have); kernel peers run in B. Every external command
//! runs under `timeout`, every spawned process is killed on drop, namespaces are deleted on
//! drop. Root and AF_XDP are required for the data tests: without them each prints
//! `SKIPPED: <reason>` on stderr and returns. The configuration tests need neither.
//! The tests take one global lock: the machine has two cores.
#![cfg(target_os = "linux")]

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "support/shim_env.rs"]
mod shim_env;

use shim_env::*;

#[test]
fn curl_downloads_100mb_from_python_http_server_under_shim() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("curl", "curl");
    let net = Net::new(61);
    let dir = scratch("srv");
    let blob = random_file(&dir, 100);
    let want = sha256(&blob);
    let mut srv = net.shimmed(
        120,
        "python3",
        &["-m", "http.server", "8000", "--bind", "0.0.0.0"],
    );
    srv.current_dir(&dir);
    let srv = spawn(srv, "python http.server");
    wait_port(&net, net.engine, 8000);
    let dl = dir.join("download");
    let url = format!("http://{}:8000/blob", net.engine);
    let t = Instant::now();
    run(
        net.kernel(
            false,
            90,
            "curl",
            &["-sS", "-o", dl.to_str().unwrap(), &url],
        ),
        "curl",
    );
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(sha256(&dl), want, "downloaded bytes differ");
    let _ = writeln!(
        io::stderr(),
        "python (shim) -> curl (kernel): 100 MiB in {secs:.2} s, {:.0} Mbit/s",
        800.0 * 1.048576 / secs
    );
    let out = srv.wait_output(Duration::from_millis(100));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("listening on 0.0.0.0:8000 (engine)"),
        "server did not run on the engine: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn xwarp_run_curl_downloads_100mb_from_kernel_python() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("curl", "curl");
    let net = Net::new(62);
    let dir = scratch("cli");
    let blob = random_file(&dir, 100);
    let want = sha256(&blob);
    let b_ip = net.pair.addr_b.to_string();
    let mut srv = net.kernel(
        false,
        120,
        "python3",
        &["-m", "http.server", "8001", "--bind", &b_ip],
    );
    srv.current_dir(&dir);
    let _srv = spawn(srv, "python http.server");
    wait_port(&net, net.pair.addr_b, 8001);
    let dl = dir.join("download");
    let url = format!("http://{b_ip}:8001/blob");
    let t = Instant::now();
    // Through the launcher: `xwarp run [options] -- curl ...`.
    let mut cmd = net.pair.a.command("timeout").expect("ns A");
    cmd.arg("90")
        .arg(env!("CARGO_BIN_EXE_xwarp"))
        .args(["run", "--iface", &net.pair.if_a])
        .args(["--addr", &format!("{}/24", net.engine)])
        .args(["--log", "info", "--strict", "--preload"])
        .arg(shim())
        .args(["--", "curl", "-sS", "-o", dl.to_str().unwrap(), &url]);
    let out = run(cmd, "xwarp run -- curl");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(sha256(&dl), want, "downloaded bytes differ");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("engine started"),
        "curl did not use the engine: {err}"
    );
    let _ = writeln!(
        io::stderr(),
        "python (kernel) -> curl (shim): 100 MiB in {secs:.2} s, {:.0} Mbit/s",
        800.0 * 1.048576 / secs
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `redis-benchmark -t set,get -c 50 -n 100000 -q` output → requests per second per test.
fn rps(out: &Output) -> Vec<(String, f64)> {
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(": ")?;
            let n = rest
                .strip_suffix(" requests per second")
                .or_else(|| rest.split(" requests per second").next())?;
            let v: f64 = n.trim().parse().ok()?;
            Some((name.to_string(), v))
        })
        .collect()
}

#[test]
fn redis_server_under_shim_serves_cli_and_benchmark() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("redis-server", "redis-server");
    ensure_tool("redis-benchmark", "redis-tools");
    let net = Net::new(63);
    let common = [
        "--bind",
        "0.0.0.0",
        "--protected-mode",
        "no",
        "--save",
        "",
        "--appendonly",
        "no",
    ];
    let mut args = vec!["--port", "6379"];
    args.extend_from_slice(&common);
    let _redis = spawn(
        net.shimmed(180, "redis-server", &args),
        "redis-server (shim)",
    );
    let host = net.engine.to_string();
    wait_port(&net, net.engine, 6379);
    let set = run(
        net.kernel(
            false,
            10,
            "redis-cli",
            &["-h", &host, "set", "xwarp", "preload-ok"],
        ),
        "redis-cli set",
    );
    assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "OK");
    let get = run(
        net.kernel(false, 10, "redis-cli", &["-h", &host, "get", "xwarp"]),
        "redis-cli get",
    );
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), "preload-ok");
    let bench = |ip: &str, port: &str| {
        let out = run(
            net.kernel(
                false,
                120,
                "redis-benchmark",
                &[
                    "-h", ip, "-p", port, "-t", "set,get", "-c", "50", "-n", "100000", "-q",
                ],
            ),
            "redis-benchmark",
        );
        let r = rps(&out);
        assert!(
            r.iter().any(|(n, _)| n == "SET") && r.iter().any(|(n, _)| n == "GET"),
            "benchmark output: {r:?}"
        );
        r
    };
    let shim_rps = bench(&host, "6379");
    // The value written by the benchmark's SETs reads back (the data really went through).
    let keys = run(
        net.kernel(
            false,
            10,
            "redis-cli",
            &["-h", &host, "exists", "key:__rand_int__"],
        ),
        "redis-cli exists",
    );
    assert_eq!(String::from_utf8_lossy(&keys.stdout).trim(), "1");
    // The same server and benchmark on the kernel stack of the same veth, for comparison.
    let mut kargs = vec!["--port", "6380"];
    kargs.extend_from_slice(&common);
    let _kredis = spawn(
        net.kernel(true, 180, "redis-server", &kargs),
        "redis-server (kernel)",
    );
    wait_port(&net, net.pair.addr_a, 6380);
    let kernel_rps = bench(&net.pair.addr_a.to_string(), "6380");
    let _ = writeln!(
        io::stderr(),
        "redis-benchmark -c 50 -n 100000 (req/s): shim {shim_rps:?} kernel {kernel_rps:?}"
    );
}

#[test]
fn c_program_mixes_kernel_and_xwarp_fds_in_one_edge_triggered_epoll_set() {
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(64);
    let mix = epoll_mix(&net, "epoll", 8, &[]);
    let field = |k: &str| mix.field(k);
    let err = &mix.stderr;
    assert!(
        field("oneshot") >= 1,
        "EPOLLONESHOT set never reported the listener"
    );
    assert!(
        field("second_set") >= 1,
        "listener not reported by the second epoll set"
    );
    assert!(
        err.contains("(engine)"),
        "listener not on the engine: {err}"
    );
}

#[test]
fn unsupported_sockets_go_to_the_kernel_untouched() {
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(65);
    // Under the shim: AF_UNIX, UDP and loopback TCP keep working on the kernel, next to an
    // engine listener in the same process.
    let script = r#"
import socket, threading
a, b = socket.socketpair(); a.sendall(b"unix"); assert b.recv(10) == b"unix"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); v.sendto(b"udp", u.getsockname())
assert u.recv(10) == b"udp"
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
c = socket.create_connection(l.getsockname()); s, _ = l.accept()
c.sendall(b"loop"); assert s.recv(10) == b"loop"
e = socket.socket(); e.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
e.bind(("0.0.0.0", 7100)); e.listen()
print("kernel ok", e.getsockname()[1], flush=True)
while True:
    k, peer = e.accept()
    data = k.recv(100)
    if data:
        k.sendall(b"engine:" + data)
        k.close()
        break
    k.close()
"#;
    let p = spawn(
        net.shimmed(30, "python3", &["-c", script]),
        "python fallback",
    );
    wait_port(&net, net.engine, 7100);
    let cli = r#"
import socket
s = socket.create_connection(("ENGINE", 7100), timeout=5); s.sendall(b"hi"); print(s.recv(100).decode())
"#
    .replace("ENGINE", &net.engine.to_string());
    let out = run(net.kernel(false, 10, "python3", &["-c", &cli]), "client");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "engine:hi");
    let res = p.wait_output(Duration::from_secs(10));
    let so = String::from_utf8_lossy(&res.stdout);
    assert!(
        res.status.success(),
        "{so} {}",
        String::from_utf8_lossy(&res.stderr)
    );
    assert!(so.contains("kernel ok 7100"), "{so}");
}

#[test]
fn misconfiguration_is_a_clear_error_at_start_up() {
    let _g = serial();
    // No root needed: the configuration is read when the library loads.
    let out = Command::new("python3")
        .args(["-c", "print('ran')"])
        .env("LD_PRELOAD", shim())
        .env("XWARP_IFACE", "veth-a")
        .env("XWARP_ADDR", "10.88.1.300/24")
        .output()
        .expect("python3");
    assert_eq!(out.status.code(), Some(2), "misconfiguration must exit 2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("configuration error") && err.contains("XWARP_ADDR"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
}

#[test]
fn engine_start_failure_falls_back_to_the_kernel_unless_strict() {
    let _g = serial();
    // An interface that does not exist: the engine cannot start. The program's wildcard
    // listener then runs on the kernel (loopback works), with a warning.
    let script = r#"
import socket
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", 47123)); l.listen()
c = socket.create_connection(("127.0.0.1", 47123)); s, _ = l.accept()
c.sendall(b"k"); print("fallback", s.recv(1).decode())
"#;
    let run_with = |strict: &str| {
        Command::new("python3")
            .args(["-c", script])
            .env("LD_PRELOAD", shim())
            .env("XWARP_IFACE", "xw-nonexistent0")
            .env("XWARP_ADDR", "10.99.0.10/24")
            .env("XWARP_STRICT", strict)
            .output()
            .expect("python3")
    };
    let out = run_with("0");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fallback run failed: {err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "fallback k");
    assert!(
        err.contains("engine cannot start") && err.contains("kernel"),
        "{err}"
    );
    let out = run_with("1");
    assert_eq!(out.status.code(), Some(1), "XWARP_STRICT=1 must fail hard");
    assert!(String::from_utf8_lossy(&out.stderr).contains("XWARP_STRICT=1"));
}

/// nginx (`daemon on`, master + `workers` workers) under the shim on `net`: curl fetches
/// the index page `curls` times on new connections and a 10 MiB file three times (bodies
/// verified), then wrk runs 3 s with 20 connections (no socket errors, no non-2xx).
/// Returns nginx's error log (where nginx sends its stderr, hence the shim's messages) and
/// the master's pid.
fn nginx_serves_curl_and_wrk(net_id: u8, workers: u32, curls: usize) -> (String, String) {
    ensure_tool("nginx", "nginx-light");
    ensure_tool("wrk", "wrk");
    ensure_tool("curl", "curl");
    let net = Net::new(net_id);
    let dir = scratch(&format!("nginx{workers}"));
    let blob = random_file(&dir, 10);
    let want = sha256(&blob);
    std::fs::write(dir.join("index.html"), "hello from nginx\n").expect("index");
    let conf = format!(
        "daemon on;\nmaster_process on;\nworker_processes {workers};\n\
         # The worker opens the engine (AF_XDP needs root): keep root.\nuser root;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; sendfile on;\n\
           client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;\n\
           uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           server {{ listen 8080; root {d}; }} }}\n",
        d = dir.display()
    );
    std::fs::write(dir.join("nginx.conf"), conf).expect("conf");
    let dir_s = dir.to_str().unwrap().to_string();
    let conf_s = format!("{dir_s}/nginx.conf");
    let mut start = net.shimmed(20, "nginx", &["-c", &conf_s, "-p", &dir_s]);
    if workers > 1 {
        // Only one process can run the engine on the interface: the others fall back to
        // the kernel (with XWARP_STRICT=1 they would exit and nginx would respawn them).
        start.env("XWARP_STRICT", "0");
    }
    // nginx daemonizes: the command returns once the master runs in the background.
    run(start, "nginx start");
    struct Stop(PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Ok(pid) = std::fs::read_to_string(&self.0) {
                let _ = Command::new("kill").args(["-TERM", pid.trim()]).status();
                std::thread::sleep(Duration::from_millis(300));
                let _ = Command::new("kill")
                    .args(["-KILL", pid.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    let _stop = Stop(dir.join("nginx.pid"));
    wait_port(&net, net.engine, 8080);
    let url = format!("http://{}:8080", net.engine);
    // One new connection per request.
    let page = run(
        net.kernel(
            false,
            60,
            "sh",
            &[
                "-c",
                &format!("for i in $(seq {curls}); do curl -sS {url}/index.html || exit 1; done"),
            ],
        ),
        "curl loop",
    );
    assert_eq!(
        String::from_utf8_lossy(&page.stdout),
        "hello from nginx\n".repeat(curls),
        "curl loop bodies"
    );
    let dl = dir.join("download");
    for i in 0..3 {
        let _ = std::fs::remove_file(&dl);
        run(
            net.kernel(
                false,
                30,
                "curl",
                &["-sS", "-o", dl.to_str().unwrap(), &format!("{url}/blob")],
            ),
            "curl blob",
        );
        assert_eq!(sha256(&dl), want, "sendfile body {i} differs");
    }
    let w = run(
        net.kernel(
            false,
            30,
            "wrk",
            &["-t2", "-c20", "-d3s", &format!("{url}/index.html")],
        ),
        "wrk",
    );
    let text = String::from_utf8_lossy(&w.stdout).to_string();
    let reqs: u64 = text
        .lines()
        .find_map(|l| {
            l.trim()
                .split_once(" requests in ")
                .map(|(n, _)| n.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    assert!(
        reqs > 1000,
        "wrk made only {reqs} requests (keep-alive stalled?):\n{text}"
    );
    assert!(
        !text.contains("Socket errors") && !text.contains("Non-2xx"),
        "wrk saw errors:\n{text}"
    );
    let _ = writeln!(
        io::stderr(),
        "nginx (shim, daemon, master + {workers} worker(s)) wrk -c20 3s:\n{text}"
    );
    let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
    assert!(
        !log.contains("[alert]") && !log.contains("[emerg]"),
        "nginx error log:\n{log}"
    );
    let master = std::fs::read_to_string(dir.join("nginx.pid"))
        .unwrap_or_default()
        .trim()
        .to_string();
    drop(_stop);
    let _ = std::fs::remove_dir_all(&dir);
    (log, master)
}

#[test]
fn nginx_daemon_master_and_worker_under_shim_serve_curl_and_wrk() {
    require_root_and_afxdp!();
    let _g = serial();
    let (log, _) = nginx_serves_curl_and_wrk(66, 1, 5);
    assert!(!log.contains("engine cannot start"), "{log}");
}

#[test]
fn nginx_with_two_workers_serves_every_request_on_the_engine_and_the_second_worker_says_why_it_cannot(
) {
    // The documented limit, tested: one process per interface runs the engine. The first
    // worker to use the listener runs it; the second cannot bind AF_XDP (queue taken),
    // says so once, naming itself and the reason, and stays on the kernel, where nothing
    // reaches it (the engine's address is not the kernel's).
    require_root_and_afxdp!();
    let _g = serial();
    let (log, master) = nginx_serves_curl_and_wrk(76, 2, 40);
    let _ = writeln!(io::stderr(), "nginx error log (shim lines):");
    for l in log.lines().filter(|l| l.contains("xwarp-preload")) {
        let _ = writeln!(io::stderr(), "  {l}");
    }
    let started: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("engine started"))
        .collect();
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("engine cannot start"))
        .collect();
    assert_eq!(started.len(), 1, "one worker runs the engine:\n{log}");
    assert_eq!(
        failed.len(),
        1,
        "one warning, from the other worker:\n{log}"
    );
    let w = failed[0];
    assert!(
        w.contains("queue 0 is taken") && w.contains("another worker"),
        "the warning gives the reason: {w}"
    );
    // It names the process: a worker (nginx renames a worker only after it opened its
    // listeners, hence the parent pid), not the master, not the engine's worker.
    let pid = |l: &str| {
        l.split_once("xwarp-preload[")
            .and_then(|(_, r)| r.split_once(']'))
            .map(|(p, _)| p.to_string())
            .unwrap_or_default()
    };
    assert!(w.contains("in process `nginx"), "{w}");
    assert!(
        w.contains(&format!("(parent {master})")),
        "not a worker of master {master}: {w}"
    );
    assert_ne!(pid(w), master, "the master tried to start the engine");
    assert_ne!(
        pid(started[0]),
        pid(w),
        "the same process started and failed"
    );
}

#[test]
fn iperf3_server_and_client_under_shim() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("iperf3", "iperf3");
    let net = Net::new(67);
    // Server under the shim, client on the kernel.
    let srv = spawn(
        net.shimmed(40, "iperf3", &["-s", "-1", "-p", "5201"]),
        "iperf3 -s (shim)",
    );
    wait_port(&net, net.engine, 5201);
    // The probe connection was the one-off's control connection candidate: restart.
    drop(srv);
    let srv = spawn(
        net.shimmed(40, "iperf3", &["-s", "-1", "-p", "5201"]),
        "iperf3 -s (shim)",
    );
    std::thread::sleep(Duration::from_millis(500));
    let engine = net.engine.to_string();
    let out = run(
        net.kernel(
            false,
            30,
            "iperf3",
            &["-c", &engine, "-p", "5201", "-t", "2"],
        ),
        "iperf3 -c (kernel)",
    );
    let to_shim = iperf_receiver_bps(&out);
    // One engine per interface: the shimmed server must be gone before a shimmed client.
    drop(srv);
    std::thread::sleep(Duration::from_millis(200));
    // Client under the shim, server on the kernel, both directions.
    let b = net.pair.addr_b.to_string();
    let _ks = spawn(
        net.kernel(false, 40, "iperf3", &["-s", "-p", "5202"]),
        "iperf3 -s (kernel)",
    );
    wait_port(&net, net.pair.addr_b, 5202);
    let out = run(
        net.shimmed(30, "iperf3", &["-c", &b, "-p", "5202", "-t", "2"]),
        "iperf3 -c (shim)",
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine started"));
    let from_shim = iperf_receiver_bps(&out);
    let out = run(
        net.shimmed(30, "iperf3", &["-c", &b, "-p", "5202", "-t", "2", "-R"]),
        "iperf3 -c -R (shim)",
    );
    let reverse = iperf_receiver_bps(&out);
    let _ = writeln!(
        io::stderr(),
        "iperf3 Gbit/s: kernel->shim server {:.2}, shim client->kernel {:.2}, kernel->shim client (-R) {:.2}",
        to_shim / 1e9,
        from_shim / 1e9,
        reverse / 1e9
    );
    for (what, bps) in [
        ("to shim server", to_shim),
        ("from shim client", from_shim),
        ("-R", reverse),
    ] {
        assert!(bps > 10e6, "iperf3 {what}: {bps} bit/s");
    }
}

#[test]
fn fork_daemonize_exec_and_accept_then_fork_child_serves_the_inherited_connection() {
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(68);
    // 1. Daemonizing before opening sockets: the grandchild serves on the engine while the
    //    original process has exited. 2. fork + exec while holding an engine connection:
    //    the exec'd child closes its relayed copy (FD_CLOEXEC) and the parent's connection
    //    keeps working. 3. accept-then-fork: the parent closes its copy right after fork;
    //    the child reads the next request from the inherited connection and replies
    //    (through the parent's relay), with the TCP addresses and TCP_NODELAY answered.
    let script = format!(
        r#"
import os, socket, sys
if os.fork() > 0:
    sys.exit(0)
os.setsid()
if os.fork() > 0:
    os._exit(0)
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", 7200)); l.listen()
while True:
    c, _ = l.accept()
    data = c.recv(100)
    if not data:
        c.close(); continue
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(wfd, 1)
        os.execvp("sh", ["sh", "-c", "echo exec-ok"])
    os.close(wfd)
    out = os.read(rfd, 100).strip()
    os.waitpid(pid, 0)
    c.sendall(data + b" " + out + b"\n")
    pid = os.fork()
    if pid == 0:
        l.close()
        more = b""
        while not more.endswith(b"\n"):
            d = c.recv(100)
            if not d:
                break
            more += d
        names = c.getsockname() == ("{engine}", 7200) and c.getpeername()[0] == "{peer}"
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nd = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        c.sendall(more.strip() + b" child-served" + (b" names-ok" if names else b" names-bad")
                  + (b" nodelay" if nd else b" no-nodelay"))
        c.close()
        os._exit(0)
    c.close()
    _, st = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(st))
"#,
        engine = net.engine,
        peer = net.pair.addr_b
    );
    // The daemon keeps no pipe of ours open (else waiting for its parent would hang) and
    // ends by itself after one client (`timeout` does not follow the double fork).
    let st = net
        .shimmed(30, "python3", &["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("daemonizing python");
    assert!(st.success());
    wait_port(&net, net.engine, 7200);
    let cli = format!(
        r#"
import socket
s = socket.create_connection(("{}", 7200), timeout=10)
s.sendall(b"hello")
first = b""
while not first.endswith(b"\n"):
    d = s.recv(200)
    if not d:
        break
    first += d
s.sendall(b"again\n")
rest = b""
while True:
    d = s.recv(200)
    if not d:
        break
    rest += d
print(first.decode().strip() + " | " + rest.decode())
"#,
        net.engine
    );
    let r = run(net.kernel(false, 15, "python3", &["-c", &cli]), "client");
    assert_eq!(
        String::from_utf8_lossy(&r.stdout).trim(),
        "hello exec-ok | again child-served names-ok nodelay"
    );
}

/// `python3 socketserver.ForkingTCPServer` under the shim on `port` with `handler` (the
/// body of `handle(self)`).
fn forking_server(net: &Net, port: u16, handler: &str) -> Proc {
    let script = format!(
        r#"
import socketserver
class H(socketserver.BaseRequestHandler):
    def handle(self):
{handler}
class S(socketserver.ForkingTCPServer):
    allow_reuse_address = True
    request_queue_size = 32
with S(("0.0.0.0", {port}), H) as s:
    s.serve_forever()
"#
    );
    let p = spawn(
        net.shimmed(60, "python3", &["-c", &script]),
        "forking server",
    );
    wait_port(net, net.engine, port);
    p
}

#[test]
fn forking_tcp_server_echoes_8_concurrent_mib_streams_through_the_relay() {
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(72);
    // Every connection is accepted by the parent on the engine and served by a forked
    // child through the parent's relay; the parent closes its copy right after fork.
    let server = forking_server(
        &net,
        7210,
        "        while True:\n            d = self.request.recv(65536)\n            if not d:\n                break\n            self.request.sendall(d)",
    );
    let cli = format!(
        r#"
import hashlib, os, socket, threading, time
N, SIZE = 8, 1 << 20
res = [None] * N
def one(i):
    try:
        one_(i)
    except Exception as e:
        res[i] = repr(e)
def one_(i):
    data = os.urandom(SIZE)
    s = socket.create_connection(("{}", 7210), timeout=60)
    def send():
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=send); t.start()
    h, n = hashlib.sha256(), 0
    while True:
        d = s.recv(65536)
        if not d:
            break
        h.update(d); n += len(d)
    t.join(); s.close()
    res[i] = n == SIZE and h.hexdigest() == hashlib.sha256(data).hexdigest()
t0 = time.time()
ts = [threading.Thread(target=one, args=(i,)) for i in range(N)]
for t in ts: t.start()
for t in ts: t.join()
print("ok" if all(r is True for r in res) else f"bad {{res}}", f"{{time.time() - t0:.2f}}s")
"#,
        net.engine
    );
    let r = run(
        net.kernel(false, 60, "python3", &["-c", &cli]),
        "8 echo clients",
    );
    let text = String::from_utf8_lossy(&r.stdout).to_string();
    let _ = writeln!(io::stderr(), "forking echo, 8 x 1 MiB: {}", text.trim());
    if !text.starts_with("ok ") {
        let out = server.wait_output(Duration::from_millis(500));
        panic!(
            "{text}\nclient stderr: {}\nserver stderr: {}",
            String::from_utf8_lossy(&r.stderr),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(server);
}

#[test]
fn forked_child_sees_the_clients_half_close_and_still_replies() {
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(73);
    // The child reads until end of stream (the client's SHUT_WR), then replies with the
    // length and SHA-256 of what it got; the client then sees the reply and end of stream.
    let server = forking_server(
        &net,
        7220,
        "        import hashlib\n        h, n = hashlib.sha256(), 0\n        while True:\n            d = self.request.recv(65536)\n            if not d:\n                break\n            h.update(d); n += len(d)\n        self.request.sendall(f'{n} {h.hexdigest()}'.encode())",
    );
    let cli = format!(
        r#"
import hashlib, os, socket
data = os.urandom(300000)
s = socket.create_connection(("{}", 7220), timeout=20)
s.sendall(data)
s.shutdown(socket.SHUT_WR)
reply = b""
while True:
    d = s.recv(4096)
    if not d:
        break
    reply += d
want = f"{{len(data)}} {{hashlib.sha256(data).hexdigest()}}".encode()
print("ok" if reply == want else f"bad {{reply!r}}")
"#,
        net.engine
    );
    let r = run(
        net.kernel(false, 30, "python3", &["-c", &cli]),
        "half-close client",
    );
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "ok");
    drop(server);
}

#[test]
fn c_child_uses_an_inherited_engine_client_connection_with_epoll_and_sendfile() {
    require_root_and_afxdp!();
    let _g = serial();
    let dir = scratch("fork-client");
    let bin = dir.join("fork_client");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/preload/fork_client.c");
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src);
    run(cc, "gcc fork_client.c");
    let blob = random_file(&dir, 4);
    let net = Net::new(74);
    let b = net.pair.addr_b.to_string();
    // Kernel peer: reads the parent's hello, asks for the file, hashes it to end of stream.
    let peer = format!(
        r#"
import hashlib, socket
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("{b}", 7230)); l.listen()
while True:
    c, _ = l.accept()
    if c.getpeername()[0] == "{b}":
        c.close(); continue
    line = b""
    while not line.endswith(b"\n"):
        d = c.recv(1)
        if not d:
            break
        line += d
    c.sendall(b"send\n")
    h, n = hashlib.sha256(), 0
    while True:
        d = c.recv(65536)
        if not d:
            break
        h.update(d); n += len(d)
    c.close()
    print(line.decode().strip(), n, h.hexdigest(), flush=True)
    break
"#
    );
    let peer = spawn(net.kernel(false, 40, "python3", &["-c", &peer]), "peer");
    wait_port(&net, net.pair.addr_b, 7230);
    let t = Instant::now();
    let out = run(
        net.shimmed(
            30,
            bin.to_str().unwrap(),
            &[&b, "7230", blob.to_str().unwrap()],
        ),
        "fork_client under shim",
    );
    let secs = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("OK child=0"), "{text}");
    assert!(text.contains(&format!("child sent={}", 4 << 20)), "{text}");
    // The connection was the engine's (not a kernel fallback, which needs no relay).
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("engine started"),
        "engine did not start"
    );
    let p = peer.wait_output(Duration::from_secs(20));
    let got = String::from_utf8_lossy(&p.stdout).trim().to_string();
    assert_eq!(
        got,
        format!("hello-from-parent {} {}", 4 << 20, sha256(&blob)),
        "peer saw: {got}"
    );
    let _ = writeln!(
        io::stderr(),
        "fork_client: 4 MiB sendfile from the child through the relay, {secs:.2} s in all"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn blocking_calls_follow_eintr_and_sa_restart_and_exit_with_a_blocked_thread_is_prompt() {
    require_root_and_afxdp!();
    let _g = serial();
    let dir = scratch("eintr");
    let bin = dir.join("eintr");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/preload/eintr.c");
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src);
    run(cc, "gcc eintr.c");
    let net = Net::new(69);
    let b = net.pair.addr_b.to_string();
    let peer = format!(
        r#"
import socket, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("{b}", 7300)); l.listen()
while True:
    c, _ = l.accept()
    if c.getpeername()[0] == "{b}":
        c.close(); continue
    time.sleep(1.0); c.sendall(b"late")
    while c.recv(100): pass
    c.close(); break
"#
    );
    let _peer = spawn(net.kernel(false, 30, "python3", &["-c", &peer]), "peer");
    wait_port(&net, net.pair.addr_b, 7300);
    let t = Instant::now();
    let out = run(
        net.shimmed(20, bin.to_str().unwrap(), &[&b, "7300"]),
        "eintr under shim",
    );
    let secs = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("OK eintr=1 restarted=late handlers=2"),
        "{text}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine started"));
    // ~1 s of waiting for the peer, then exit with a thread still inside recv.
    assert!(secs < 4.0, "exit with a blocked thread took {secs:.1} s");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn socket_options_buffers_tcp_info_linger_zero_and_keepalive_apply_on_engine_connections() {
    require_root_and_afxdp!();
    let _g = serial();
    let dir = scratch("sockopts");
    let bin = dir.join("sockopts");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/preload/sockopts.c");
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src);
    run(cc, "gcc sockopts.c");
    let net = Net::new(71);
    let b = net.pair.addr_b.to_string();
    let peer = format!(
        r#"
import socket, subprocess, sys, time
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("{b}", 7400)); l.listen()
def conn():
    while True:
        c, a = l.accept()
        if a[0] == "{b}":
            c.close(); continue
        return c
c = conn()
while True:
    d = c.recv(65536)
    if not d: break
    c.sendall(d)
c.close()
c = conn()
try:
    while c.recv(100): pass
    print("peer: eof", flush=True)
except ConnectionResetError:
    print("peer: reset", flush=True)
c.close()
c = conn()
c.sendall(b"gone"); time.sleep(0.2)
subprocess.run(["ip", "route", "add", "blackhole", "{engine}/32"], check=True)
print("peer: blackholed", flush=True)
time.sleep(5)
"#,
        engine = net.engine
    );
    let peer = spawn(net.kernel(false, 40, "python3", &["-c", &peer]), "peer");
    wait_port(&net, net.pair.addr_b, 7400);
    let out = run(
        net.shimmed(30, bin.to_str().unwrap(), &[&b, "7400"]),
        "sockopts under shim",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        text.contains("OK buffers rcvbuf=16384 sndbuf=32768"),
        "{text}"
    );
    assert!(text.contains("OK tcp_info"), "{text}");
    assert!(text.contains("errno=Connection timed out"), "{text}");
    assert!(text.contains("OK done"), "{text}");
    let p = peer.wait_output(Duration::from_secs(20));
    let ptext = String::from_utf8_lossy(&p.stdout);
    assert!(ptext.contains("peer: reset"), "peer: {ptext}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ipv6_and_dual_stack_listener_and_ipv6_client() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("curl", "curl");
    let net = Net::new(70);
    net.pair
        .b
        .ip(&[
            "addr",
            "add",
            "fd00:88:70::2/64",
            "dev",
            &net.pair.if_b,
            "nodad",
        ])
        .expect("ipv6 on B");
    let dir = scratch("v6");
    let blob = random_file(&dir, 4);
    let want = sha256(&blob);
    // A `::` listener on the engine (IPv6 + IPv4-mapped), python's dual-stack server.
    let mut srv = net.shimmed(
        60,
        "python3",
        &["-m", "http.server", "8000", "--bind", "::"],
    );
    srv.env("XWARP_ADDR6", "fd00:88:70::10/64")
        .current_dir(&dir);
    let srv = spawn(srv, "python http.server ::");
    wait_port(&net, net.engine, 8000);
    for (i, url) in [
        "http://[fd00:88:70::10]:8000/blob",
        &format!("http://{}:8000/blob", net.engine),
    ]
    .iter()
    .enumerate()
    {
        let dl = dir.join(format!("dl{i}"));
        run(
            net.kernel(false, 30, "curl", &["-sS", "-o", dl.to_str().unwrap(), url]),
            "curl",
        );
        assert_eq!(sha256(&dl), want, "{url}");
    }
    drop(srv);
    std::thread::sleep(Duration::from_millis(200));
    // An IPv6 client on the engine against a kernel server.
    let mut ks = net.kernel(
        false,
        60,
        "python3",
        &["-m", "http.server", "8001", "--bind", "fd00:88:70::2"],
    );
    ks.current_dir(&dir);
    let _ks = spawn(ks, "kernel http.server v6");
    std::thread::sleep(Duration::from_millis(700));
    let dl = dir.join("dl6c");
    let mut c = net.shimmed(
        30,
        "curl",
        &[
            "-sS",
            "--retry",
            "3",
            "--retry-connrefused",
            "-o",
            dl.to_str().unwrap(),
            "http://[fd00:88:70::2]:8001/blob",
        ],
    );
    c.env("XWARP_ADDR6", "fd00:88:70::10/64");
    let out = run(c, "curl -6 under shim");
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine started"));
    assert_eq!(sha256(&dl), want, "IPv6 client download");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The scenarios of the close tests, as a kernel peer in B sees a server at `host:port`
/// (`tests/preload/close_server.py` under the shim, or on the kernel for comparison).
fn close_peer(net: &Net, host: Ipv4Addr, port: u16) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/preload/close_peer.py");
    let out = run(
        net.kernel(
            false,
            40,
            "python3",
            &[
                script.to_str().unwrap(),
                &host.to_string(),
                &port.to_string(),
            ],
        ),
        "close peer",
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn rfc2525_close_with_unread_input_resets_like_the_kernel_and_a_full_read_closes_with_fin() {
    // The same server program on the kernel (A's address) and under the shim (the
    // engine's): a close with unread input resets (the peer's recv: ECONNRESET), a close
    // after reading everything sends all the data then FIN, and input arriving after the
    // close resets the orphaned connection; the peer sees the same outcome from both.
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(77);
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/preload/close_server.py");
    let server = server.to_str().unwrap();
    let kernel_srv = spawn(
        net.kernel(
            true,
            60,
            "python3",
            &[server, &net.pair.addr_a.to_string(), "7700"],
        ),
        "kernel close server",
    );
    let shim_srv = spawn(
        net.shimmed(60, "python3", &[server, &net.engine.to_string(), "7700"]),
        "shimmed close server",
    );
    wait_port(&net, net.pair.addr_a, 7700);
    wait_port(&net, net.engine, 7700);
    let kernel = close_peer(&net, net.pair.addr_a, 7700);
    let shim = close_peer(&net, net.engine, 7700);
    let _ = writeln!(io::stderr(), "kernel server:\n{kernel}shim server:\n{shim}");
    for want in [
        "unread: ConnectionResetError",
        "read: fin 1048576 bytes intact",
        "late: bye, then BrokenPipeError",
        "fork: go digest ok fin",
    ] {
        assert!(
            kernel.contains(want),
            "kernel reference lacks `{want}`:\n{kernel}"
        );
    }
    assert_eq!(shim, kernel, "the shim's closes differ from the kernel's");
    for srv in [shim_srv, kernel_srv] {
        let out = srv.wait_output(Duration::from_secs(10));
        assert!(
            out.status.success(),
            "server failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
