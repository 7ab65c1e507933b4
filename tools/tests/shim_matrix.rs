//! The shim's compatibility matrix (issue 17): one test per program, each run under the shim
//! and then on the kernel, on the same veth pair, with the same load.
//!
//! Topology (as `preload_programs.rs`): namespaces A and B joined by a veth pair; the
//! program under the shim runs in A with the engine bound by AF_XDP to `veth-a` and owning
//! `10.88.<net>.10`; kernel peers run in B. Each test proves that the program ran
//! accelerated: the shim's log says so (`listening on ... (engine)` for a server, `engine
//! started` for a client) **and** A's kernel TCP counters (`ActiveOpens`, `PassiveOpens`
//! in A's `/proc/net/snmp`) did not move while it ran, so A's kernel never saw one of its
//! connections (the same counters do move in the kernel run, which checks the check). The
//! data is verified (hashes, echoes compared byte for byte, the tools' own verification),
//! and the throughput under the shim is printed beside the kernel's as one line
//! `MATRIX | program | accelerated | verified | shim | kernel | shim/kernel` on stderr
//! (`--nocapture` to see them; `preload/README.md` has the table).
//!
//! Rows already exercised in depth by `preload_programs.rs` (redis, nginx, iperf3, curl)
//! are kept short here: these add the kernel comparison and the counter check.
//! Root and AF_XDP are required: without them each test prints `SKIPPED: <reason>`.
//! One test at a time (two cores); the whole file takes about two minutes.
#![cfg(target_os = "linux")]

#[macro_use]
#[path = "../../tests/support/afxdp_skip.rs"]
mod afxdp_skip;
#[path = "support/shim_env.rs"]
mod shim_env;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use shim_env::{
    ensure_tool, iperf_receiver_bps, random_file, report, run, scratch, serial, sha256, spawn,
    wait_port, Net,
};

/// What one load run measured and checked.
struct Load {
    /// Throughput in the row's unit.
    value: f64,
    /// What was verified, for the row.
    verified: String,
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// Both runs of a row, the shim's first, then its `MATRIX` line: `one(shim)` runs and
/// checks it once.
fn both_runs(program: &str, unit: &str, one: &dyn Fn(bool) -> Load) {
    let results: Vec<Load> = [true, false].into_iter().map(one).collect();
    report(
        program,
        &results[0].verified,
        unit,
        results[0].value,
        results[1].value,
    );
}

/// The checks of one run: under the shim, `on_engine` (the log `err` said so, else the
/// program did not `engine_what`) and A's kernel TCP counters did not move from `before` to
/// `after`; on the kernel, its `PassiveOpens` (a server, `passive`) or `ActiveOpens` moved.
#[allow(clippy::too_many_arguments)]
fn check_run(
    program: &str,
    shim_on: bool,
    err: &str,
    on_engine: bool,
    engine_what: &str,
    passive: bool,
    before: (u64, u64),
    after: (u64, u64),
) {
    if shim_on {
        assert!(on_engine, "{program} did not {engine_what}:\n{err}");
        assert_eq!(
            before, after,
            "{program} under the shim: A's kernel saw TCP opens (active, passive):\n{err}"
        );
    } else {
        let (name, moved) = if passive {
            ("PassiveOpens", after.1 > before.1)
        } else {
            ("ActiveOpens", after.0 > before.0)
        };
        assert!(
            moved,
            "{program} on the kernel: {name} did not move ({before:?} -> {after:?})"
        );
    }
}

/// A server row: `start(shim)` is the server command in A (under the shim or on A's
/// kernel), `load(ip)` runs the kernel clients in B against it; `log` is a file the server
/// writes its stderr to (nginx, lighttpd), if any.
fn server_row(
    net: &Net,
    program: &str,
    unit: &str,
    port: u16,
    log: Option<&Path>,
    start: &dyn Fn(bool) -> Command,
    load: &dyn Fn(Ipv4Addr) -> Load,
) {
    both_runs(program, unit, &|shim_on| {
        let ip = net.server_ip(shim_on);
        if let Some(l) = log {
            let _ = std::fs::remove_file(l);
        }
        let srv = spawn(start(shim_on), "server");
        wait_port(net, ip, port);
        let before = net.a_tcp_opens();
        let l = load(ip);
        let after = net.a_tcp_opens();
        let out = srv.wait_output(Duration::from_millis(200));
        let mut err = String::from_utf8_lossy(&out.stderr).into_owned();
        if let Some(l) = log {
            err += &std::fs::read_to_string(l).unwrap_or_default();
        }
        let on_engine = err.contains("(engine)") && err.contains("listening on");
        check_run(
            program,
            shim_on,
            &err,
            on_engine,
            "listen on the engine",
            true,
            before,
            after,
        );
        l
    });
}

/// A client row: `client(shim)` runs the client in A (under the shim or on A's kernel)
/// against kernel servers in B.
fn client_row(net: &Net, program: &str, unit: &str, client: &dyn Fn(bool) -> (Output, Load)) {
    both_runs(program, unit, &|shim_on| {
        let before = net.a_tcp_opens();
        let (out, l) = client(shim_on);
        let after = net.a_tcp_opens();
        let err = String::from_utf8_lossy(&out.stderr);
        let on_engine = err.contains("engine started");
        check_run(
            program,
            shim_on,
            &err,
            on_engine,
            "start the engine",
            false,
            before,
            after,
        );
        l
    });
}

/// The echo programs: an asyncio server (`serve`), a threaded server (`tserve`,
/// `socketserver.ThreadingTCPServer`), and an asyncio client (`client HOST PORT CONNS
/// BYTES`: all connections at once, each sends its own pattern, half-closes, and compares
/// what comes back; prints `ok CONNS BYTES SECS`).
const ECHO_PY: &str = r#"
import asyncio, hashlib, socketserver, sys, time

def payload(i, n):
    b = hashlib.sha256(str(i).encode()).digest()
    return (b * (n // 32 + 1))[:n]

async def handle(r, w):
    while True:
        d = await r.read(65536)
        if not d:
            break
        w.write(d)
        await w.drain()
    w.close()

async def serve(host, port):
    srv = await asyncio.start_server(handle, host, port, backlog=1024)
    async with srv:
        await srv.serve_forever()

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            d = self.request.recv(65536)
            if not d:
                break
            self.request.sendall(d)

class Threaded(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 1024

async def one(host, port, i, n):
    r, w = await asyncio.open_connection(host, port)
    data = payload(i, n)
    async def send():
        w.write(data)
        await w.drain()
        w.write_eof()
    t = asyncio.ensure_future(send())
    got = bytearray()
    while True:
        d = await r.read(65536)
        if not d:
            break
        got += d
    await t
    w.close()
    if bytes(got) != data:
        raise SystemExit(f"connection {i}: {len(got)} bytes back of {n}, or different")

async def client(host, port, conns, n):
    t = time.monotonic()
    await asyncio.gather(*(one(host, port, i, n) for i in range(conns)))
    print(f"ok {conns} {conns * n} {time.monotonic() - t:.3f}")

mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "serve":
    asyncio.run(serve(host, port))
elif mode == "tserve":
    Threaded((host, port), Echo).serve_forever()
else:
    asyncio.run(client(host, port, int(sys.argv[4]), int(sys.argv[5])))
"#;

fn echo_script(dir: &Path) -> String {
    let p = dir.join("echo.py");
    std::fs::write(&p, ECHO_PY).expect("echo.py");
    p.to_str().unwrap().to_string()
}

/// Run the echo client in `c` (already `python3 echo.py`): MiB/s echoed.
fn echo_load(mut c: Command, ip: Ipv4Addr, port: u16, conns: u32, bytes: u32) -> (Output, Load) {
    c.args(["client", &ip.to_string(), &port.to_string()])
        .args([conns.to_string(), bytes.to_string()]);
    let out = run(c, "echo client");
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = t.split_whitespace().collect();
    assert!(
        f.len() == 4 && f[0] == "ok",
        "echo client said: {}",
        text(&out)
    );
    let (total, secs): (f64, f64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
    let load = Load {
        value: total / secs / 1048576.0,
        verified: format!(
            "{conns} concurrent connections x {} KiB echoed, compared byte for byte",
            bytes >> 10
        ),
    };
    (out, load)
}

/// An echo server row on a fresh pair `net_id`: `start(net, shim, py)` is the server on
/// `port` (`py` the echo script, in scratch directory `name`), the load `conns` kernel
/// echo clients in B sending `bytes` each.
#[allow(clippy::too_many_arguments)]
fn echo_server_row(
    net_id: u8,
    name: &str,
    program: &str,
    port: u16,
    conns: u32,
    bytes: u32,
    start: &dyn Fn(&Net, bool, &str) -> Command,
) {
    let net = Net::new(net_id);
    let dir = scratch(name);
    let py = echo_script(&dir);
    server_row(
        &net,
        program,
        "MiB/s",
        port,
        None,
        &|shim| start(&net, shim, &py),
        &|ip| echo_load(net.in_b(60, "python3", &[&py]), ip, port, conns, bytes).1,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn asyncio_server() {
    require_root_and_afxdp!();
    let _g = serial();
    echo_server_row(
        101,
        "asyncio-srv",
        "python3 asyncio start_server",
        9000,
        200,
        256 << 10,
        &|net, shim, py| net.in_a(shim, 120, "python3", &[py, "serve", "0.0.0.0", "9000"]),
    );
}

#[test]
fn asyncio_client() {
    require_root_and_afxdp!();
    let _g = serial();
    let net = Net::new(102);
    let dir = scratch("asyncio-cli");
    let py = echo_script(&dir);
    let b = net.pair.addr_b.to_string();
    let _srv = spawn(
        net.in_b(120, "python3", &[&py, "serve", &b, "9001"]),
        "asyncio server",
    );
    wait_port(&net, net.pair.addr_b, 9001);
    client_row(&net, "python3 asyncio open_connection", "MiB/s", &|shim| {
        echo_load(
            net.in_a(shim, 60, "python3", &[&py]),
            net.pair.addr_b,
            9001,
            200,
            256 << 10,
        )
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_threading_tcp_server() {
    require_root_and_afxdp!();
    let _g = serial();
    echo_server_row(
        103,
        "threaded",
        "python3 socketserver.ThreadingTCPServer (thread per connection)",
        9002,
        64,
        512 << 10,
        &|net, shim, py| net.in_a(shim, 120, "python3", &[py, "tserve", "0.0.0.0", "9002"]),
    );
}

#[test]
fn socat_forking_echo_server() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("socat", "socat");
    echo_server_row(
        104,
        "socat",
        "socat TCP-LISTEN,fork EXEC:cat (fork per connection, exec)",
        9003,
        8,
        4 << 20,
        &|net, shim, _| {
            net.in_a(
                shim,
                120,
                "socat",
                &["TCP-LISTEN:9003,reuseaddr,fork", "EXEC:cat"],
            )
        },
    );
}

#[test]
fn memcached_memccapable_and_memcaslap() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("memcached", "memcached");
    ensure_tool("memcaslap", "libmemcached-tools");
    let net = Net::new(105);
    server_row(
        &net,
        "memcached -t 2 (libevent, worker threads)",
        "ops/s",
        11211,
        None,
        &|shim| {
            net.in_a(
                shim,
                120,
                "memcached",
                &["-u", "root", "-l", "0.0.0.0", "-p", "11211", "-t", "2"],
            )
        },
        &|ip| {
            let host = ip.to_string();
            let cap = run(
                net.in_b(60, "memccapable", &["-h", &host, "-p", "11211", "-t", "5"]),
                "memccapable",
            );
            let cap = text(&cap);
            let passed = cap.matches("[pass]").count();
            assert!(
                cap.contains("All tests passed") && passed >= 50 && !cap.contains("[FAIL]"),
                "memccapable:\n{cap}"
            );
            let slap = run(
                net.in_b(
                    60,
                    "memcaslap",
                    &[
                        "-s",
                        &format!("{host}:11211"),
                        "-T",
                        "2",
                        "-c",
                        "16",
                        "-t",
                        "3s",
                        "-v",
                        "0.1",
                    ],
                ),
                "memcaslap",
            );
            let slap = text(&slap);
            let field = |k: &str| -> f64 {
                slap.lines()
                    .rev()
                    .find_map(|l| {
                        let (_, v) = l.split_once(k)?;
                        v.split_whitespace().next()?.parse().ok()
                    })
                    .unwrap_or_else(|| panic!("no {k} in memcaslap output:\n{slap}"))
            };
            assert_eq!(field("verify_failed:"), 0.0, "memcaslap:\n{slap}");
            Load {
                value: field("TPS:"),
                verified: format!(
                    "memccapable {passed}/{passed} passed; memcaslap -c 16 3 s, 10% of gets verified, 0 failed"
                ),
            }
        },
    );
}

/// `redis-benchmark -q` lines → (test, requests per second).
fn redis_rps(out: &Output) -> Vec<(String, f64)> {
    String::from_utf8_lossy(&out.stdout)
        .replace('\r', "\n")
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(": ")?;
            let (n, _) = rest.split_once(" requests per second")?;
            Some((name.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn redis_server() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("redis-server", "redis-server");
    ensure_tool("redis-benchmark", "redis-tools");
    let net = Net::new(106);
    let value = "xwarp-matrix-".repeat(1000);
    server_row(
        &net,
        "redis-server (ae event loop, epoll)",
        "GET/s",
        6379,
        None,
        &|shim| {
            let args = [
                "--port",
                "6379",
                "--bind",
                "0.0.0.0",
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ];
            net.in_a(shim, 120, "redis-server", &args)
        },
        &|ip| {
            let host = ip.to_string();
            run(
                net.in_b(10, "redis-cli", &["-h", &host, "set", "m", &value]),
                "set",
            );
            let get = run(net.in_b(10, "redis-cli", &["-h", &host, "get", "m"]), "get");
            assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), value);
            let args = [
                "-h", &host, "-t", "set,get", "-c", "50", "-n", "20000", "-q",
            ];
            let r = redis_rps(&run(net.in_b(60, "redis-benchmark", &args), "bench"));
            let get = r.iter().find(|(n, _)| n == "GET").map(|(_, v)| *v);
            assert!(r.iter().any(|(n, _)| n == "SET"), "{r:?}");
            Load {
                value: get.unwrap_or_else(|| panic!("no GET in {r:?}")),
                verified: "redis-cli SET/GET of a 13 kB value equal; redis-benchmark -c 50 -n 20000 SET/GET complete".into(),
            }
        },
    );
}

/// curl `url` into `dir/download` from namespace B and compare its hash with `want`.
fn curl_check(net: &Net, dir: &Path, url: &str, want: &str) {
    let dl = dir.join("download");
    let _ = std::fs::remove_file(&dl);
    run(
        net.in_b(60, "curl", &["-sS", "-o", dl.to_str().unwrap(), url]),
        "curl",
    );
    assert_eq!(sha256(&dl), want, "{url}: downloaded bytes differ");
}

/// wrk (kernel, B, or the given command): requests per second, no socket errors, no non-2xx.
fn wrk_rps(mut c: Command, url: &str, conns: u32) -> (Output, f64) {
    c.args(["-t2", &format!("-c{conns}"), "-d3s", url]);
    let out = run(c, "wrk");
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !t.contains("Socket errors") && !t.contains("Non-2xx"),
        "wrk saw errors:\n{t}"
    );
    let rps = t
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in:\n{t}"));
    (out, rps)
}

/// A document root with `index.html` and a 10 MiB `blob`; the blob's hash.
fn docroot(name: &str) -> (PathBuf, String) {
    let dir = scratch(name);
    let blob = random_file(&dir, 10);
    std::fs::write(dir.join("index.html"), "hello from the matrix\n").expect("index");
    let h = sha256(&blob);
    (dir, h)
}

/// The load of the web server rows: three 10 MiB downloads hash-verified, then wrk -c20 3 s.
fn web_load(net: &Net, dir: &Path, want: &str, ip: Ipv4Addr, port: u16) -> Load {
    let url = format!("http://{ip}:{port}");
    for _ in 0..3 {
        curl_check(net, dir, &format!("{url}/blob"), want);
    }
    let (_, rps) = wrk_rps(net.in_b(30, "wrk", &[]), &format!("{url}/index.html"), 20);
    Load {
        value: rps,
        verified:
            "3 x 10 MiB curl downloads SHA-256 equal; wrk -c20 3 s without socket errors or non-2xx"
                .into(),
    }
}

/// A web server row: `start(shim)` serves `dir` (from `docroot`, blob hash `want`) on
/// `port`, writing its log to `dir/error.log` when `log`; the load is `web_load`. Removes
/// `dir` after.
#[allow(clippy::too_many_arguments)]
fn web_row(
    net: &Net,
    dir: &Path,
    want: &str,
    program: &str,
    port: u16,
    log: bool,
    start: &dyn Fn(bool) -> Command,
) {
    let log = log.then(|| dir.join("error.log"));
    server_row(net, program, "req/s", port, log.as_deref(), start, &|ip| {
        web_load(net, dir, want, ip, port)
    });
    let _ = std::fs::remove_dir_all(dir);
}

fn nginx_conf(dir: &Path, listen: &str) -> String {
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\nuser root;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; sendfile on;\n\
           client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;\n\
           uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           server {{ listen {listen}; root {d}; }} }}\n",
        d = dir.display()
    );
    let p = dir.join("nginx.conf");
    std::fs::write(&p, conf).expect("nginx.conf");
    p.to_str().unwrap().to_string()
}

#[test]
fn nginx_serves_curl_and_wrk() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("nginx", "nginx-light");
    ensure_tool("wrk", "wrk");
    ensure_tool("curl", "curl");
    let net = Net::new(107);
    let (dir, want) = docroot("nginx");
    let conf = nginx_conf(&dir, "8080");
    let d = dir.to_str().unwrap().to_string();
    web_row(
        &net,
        &dir,
        &want,
        "nginx (epoll ET, sendfile, keep-alive)",
        8080,
        true,
        &|shim| net.in_a(shim, 120, "nginx", &["-c", &conf, "-p", &d]),
    );
}

#[test]
fn lighttpd_serves_curl_and_wrk() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("lighttpd", "lighttpd");
    ensure_tool("wrk", "wrk");
    let net = Net::new(108);
    let (dir, want) = docroot("lighttpd");
    let conf = dir.join("lighttpd.conf");
    std::fs::write(
        &conf,
        format!(
            "server.document-root = \"{d}\"\nserver.port = 8081\nserver.bind = \"0.0.0.0\"\n\
             server.errorlog = \"{d}/error.log\"\nserver.max-connections = 1024\n\
             mimetype.assign = (\".html\" => \"text/html\", \"\" => \"application/octet-stream\")\n",
            d = dir.display()
        ),
    )
    .expect("lighttpd.conf");
    let conf = conf.to_str().unwrap().to_string();
    web_row(
        &net,
        &dir,
        &want,
        "lighttpd (single process, own event loop)",
        8081,
        true,
        &|shim| net.in_a(shim, 120, "lighttpd", &["-D", "-f", &conf]),
    );
}

#[test]
fn node_http_server() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("node", "nodejs");
    ensure_tool("wrk", "wrk");
    let net = Net::new(109);
    let (dir, want) = docroot("node");
    let js = dir.join("server.js");
    std::fs::write(
        &js,
        "const http = require('http'), fs = require('fs'), path = require('path');\n\
         const dir = process.argv[2];\n\
         const blob = fs.readFileSync(path.join(dir, 'blob'));\n\
         const index = fs.readFileSync(path.join(dir, 'index.html'));\n\
         http.createServer((req, res) => {\n\
           const body = req.url === '/blob' ? blob : index;\n\
           res.writeHead(200, {'content-length': body.length});\n\
           res.end(body);\n\
         }).listen(8082, '0.0.0.0');\n",
    )
    .expect("server.js");
    let (js, d) = (
        js.to_str().unwrap().to_string(),
        dir.to_str().unwrap().to_string(),
    );
    web_row(
        &net,
        &dir,
        &want,
        "node.js http.createServer (libuv, V8 and worker threads)",
        8082,
        false,
        &|shim| net.in_a(shim, 120, "node", &[&js, &d]),
    );
}

#[test]
fn haproxy_proxies_to_a_kernel_backend() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("haproxy", "haproxy");
    ensure_tool("wrk", "wrk");
    let net = Net::new(110);
    let (dir, want) = docroot("haproxy");
    // The backend: a kernel nginx in B; haproxy (A) is a server towards the clients and a
    // client towards the backend, both on the engine.
    let b = net.pair.addr_b;
    let conf = nginx_conf(&dir, &format!("{b}:8500"));
    let d = dir.to_str().unwrap().to_string();
    let _backend = spawn(
        net.in_b(120, "nginx", &["-c", &conf, "-p", &d]),
        "nginx backend",
    );
    wait_port(&net, b, 8500);
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  nbthread 2\n  log stderr local0 info\n\
             defaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
             frontend f\n  bind 0.0.0.0:8090\n  default_backend b\n\
             backend b\n  server s1 {b}:8500\n"
        ),
    )
    .expect("haproxy.cfg");
    let cfg = cfg.to_str().unwrap().to_string();
    web_row(
        &net,
        &dir,
        &want,
        "haproxy nbthread 2 (threads, proxy to a kernel nginx in B)",
        8090,
        false,
        &|shim| net.in_a(shim, 120, "haproxy", &["-db", "-f", &cfg]),
    );
}

#[test]
fn iperf3_server() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("iperf3", "iperf3");
    let net = Net::new(111);
    server_row(
        &net,
        "iperf3 -s (select)",
        "Mbit/s",
        5201,
        None,
        &|shim| net.in_a(shim, 60, "iperf3", &["-s", "-p", "5201"]),
        &|ip| {
            let out = run(
                net.in_b(
                    30,
                    "iperf3",
                    &["-c", &ip.to_string(), "-p", "5201", "-t", "3"],
                ),
                "iperf3 -c",
            );
            let bps = iperf_receiver_bps(&out);
            assert!(bps > 10e6, "iperf3: {bps} bit/s");
            Load {
                value: bps / 1e6,
                verified: "3 s stream completes, receiver byte count reported (content not checked by iperf3)".into(),
            }
        },
    );
}

#[test]
fn curl_client_downloads_from_a_kernel_server() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("curl", "curl");
    let net = Net::new(112);
    let dir = scratch("curl");
    let blob = random_file(&dir, 50);
    let want = sha256(&blob);
    let b = net.pair.addr_b.to_string();
    let mut srv = net.in_b(120, "python3", &["-m", "http.server", "8600", "--bind", &b]);
    srv.current_dir(&dir);
    let _srv = spawn(srv, "python http.server");
    wait_port(&net, net.pair.addr_b, 8600);
    let dl = dir.join("download");
    let url = format!("http://{b}:8600/blob");
    client_row(&net, "curl (client)", "MiB/s", &|shim| {
        let _ = std::fs::remove_file(&dl);
        let t = Instant::now();
        let out = run(
            net.in_a(shim, 60, "curl", &["-sS", "-o", dl.to_str().unwrap(), &url]),
            "curl",
        );
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(sha256(&dl), want, "downloaded bytes differ");
        let load = Load {
            value: 50.0 / secs,
            verified: "50 MiB download from a kernel python http.server, SHA-256 equal".into(),
        };
        (out, load)
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wrk_client_loads_a_kernel_nginx() {
    require_root_and_afxdp!();
    let _g = serial();
    ensure_tool("nginx", "nginx-light");
    ensure_tool("wrk", "wrk");
    let net = Net::new(113);
    let (dir, _) = docroot("wrk");
    let b = net.pair.addr_b;
    let conf = nginx_conf(&dir, &format!("{b}:8700"));
    let d = dir.to_str().unwrap().to_string();
    let _srv = spawn(net.in_b(120, "nginx", &["-c", &conf, "-p", &d]), "nginx");
    wait_port(&net, b, 8700);
    let url = format!("http://{b}:8700/index.html");
    client_row(&net, "wrk -t2 (client, two threads)", "req/s", &|shim| {
        let (out, rps) = wrk_rps(net.in_a(shim, 30, "wrk", &[]), &url, 20);
        let load = Load {
            value: rps,
            verified: "wrk -c20 3 s against a kernel nginx, no socket errors or non-2xx".into(),
        };
        (out, load)
    });
    let _ = std::fs::remove_dir_all(&dir);
}
