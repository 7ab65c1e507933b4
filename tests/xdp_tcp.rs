//! The xwarp TCP engine on a real kernel path: a veth pair between two network namespaces,
//! the engine bound with AF_XDP to `veth-a` in namespace A and owning an address the kernel
//! in A does not have (`10.88.<net>.10`), kernel peers (curl, nc, socat, python3) in
//! namespace B. Root only: without root or AF_XDP every test prints `SKIPPED: <reason>` to
//! stderr and returns. Each test uses its own /24 and namespaces, bounds every external
//! command with a timeout, and tears everything down on drop (also on panic).
#![cfg(target_os = "linux")]

#[macro_use]
#[path = "support/afxdp_skip.rs"]
mod afxdp_skip;
#[path = "../examples/http_server.rs"]
mod http_server;
#[path = "../examples/tcp_echo.rs"]
mod tcp_echo;

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use xwarp::net::{Shutdown, TcpListener, TcpStream};
use xwarp::poll_driver::netns::{self, NetNs, VethPair};
use xwarp::toe::{start_xdp_engine, RxChecksum, XdpEngine, XdpEngineConfig};

/// Make sure `bin` exists, installing Debian package `pkg` with apt if it does not (we are
/// root here). Panics if it cannot be had: a missing tool is a broken CI machine.
fn ensure_tool(bin: &str, pkg: &str) {
    let have = |b: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {b}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if have(bin) {
        return;
    }
    let _ = writeln!(io::stderr(), "installing {pkg} for {bin}");
    let ok = Command::new("sh")
        .args([
            "-c",
            &format!(
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {pkg} \
                 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {pkg})"
            ),
        ])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok && have(bin),
        "{bin} missing and `apt-get install {pkg}` failed"
    );
}

/// A child process killed (and reaped) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run `cmd` to completion, killing it after `limit`; panics on timeout.
fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {what}: {e}"));
    wait_bounded(Proc(child), limit, &what)
}

fn wait_bounded(mut p: Proc, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        match p.0.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => panic!("{what} did not finish within {limit:?}"),
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    }
    let mut out = Output {
        status: p.0.wait().expect("reaped"),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    if let Some(mut o) = p.0.stdout.take() {
        let _ = o.read_to_end(&mut out.stdout);
    }
    if let Some(mut e) = p.0.stderr.take() {
        let _ = e.read_to_end(&mut out.stderr);
    }
    out
}

fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An example's accept loop on its own thread, stopped (and joined) by `finish` or drop.
struct Serving {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Serving {
    fn start(serve: fn(TcpListener, &AtomicBool) -> u64, listener: TcpListener) -> Serving {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || serve(listener, &flag));
        Serving {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop accepting; the number of connections accepted.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.thread
            .take()
            .map(|t| t.join().expect("server thread"))
            .unwrap_or(0)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("xwarp-xdp-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Deterministic test payload of `len` bytes (stream `seed`).
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    http_server::fill_body(seed, 0, &mut v);
    v
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn file_sha256(p: &Path) -> ([u8; 32], u64) {
    let data = fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    (sha256(&data), data.len() as u64)
}

/// Read `s` to end of stream: (bytes, SHA-256).
fn read_to_end_sha256(s: &mut TcpStream, seed: u64) -> Received {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut want = vec![0u8; 256 << 10];
    let mut n = 0u64;
    let mut first_mismatch = None;
    loop {
        let k = s.read(&mut buf).expect("read");
        if k == 0 {
            return Received {
                bytes: n,
                digest: h.finalize().into(),
                first_mismatch,
            };
        }
        h.update(&buf[..k]);
        if first_mismatch.is_none() {
            http_server::fill_body(seed, n, &mut want[..k]);
            if let Some(i) = (0..k).find(|&i| buf[i] != want[i]) {
                first_mismatch = Some(n + i as u64);
            }
        }
        n += k as u64;
    }
}

/// What [`read_to_end_sha256`] read: the count, the SHA-256 and, so that a failure says
/// *where* the stream went wrong (a lost, duplicated or corrupted stretch), the first
/// offset at which the bytes differ from the `fill_body` pattern they should follow.
#[derive(Debug)]
struct Received {
    bytes: u64,
    digest: [u8; 32],
    first_mismatch: Option<u64>,
}

/// Write `total` bytes (whole MiB) of the `fill_body` stream `seed` to `s`; its SHA-256.
fn write_pattern_sha256(s: &mut TcpStream, seed: u64, total: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < total {
        http_server::fill_body(seed, off, &mut buf);
        h.update(&buf);
        s.write_all(&buf).unwrap();
        off += buf.len() as u64;
    }
    h.finalize().into()
}

/// The engine's address in /24 `net`.
fn engine_ip(net: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, net, 10)
}

/// Start an engine on `veth-a` in namespace A owning `10.88.<net>.10`.
fn engine_in_a(net: &VethPair, n: u8, rx: RxChecksum) -> XdpEngine {
    let mut cfg = XdpEngineConfig::new(&net.if_a, engine_ip(n), 24);
    cfg.rx_checksum = rx;
    cfg.engine.name = format!("xdp-test-{n}");
    start_xdp_engine(Some(&net.a), cfg).expect("engine on veth-a")
}

/// Set both ends of `net` to IP MTU `mtu`, then start an engine on each: A owning
/// `10.88.<n>.10` ([`engine_ip`]), B owning `10.88.<n>.20`, each configured by `tweak`
/// and named `xdp-test-<n>a` / `-<n>b`. Returns both engines and B's address.
fn jumbo_engine_pair(
    net: &VethPair,
    n: u8,
    mtu: u32,
    tweak: impl Fn(&mut XdpEngineConfig),
) -> (XdpEngine, XdpEngine, Ipv4Addr) {
    let mtu = mtu.to_string();
    for (ns, ifname) in [(&net.a, &net.if_a), (&net.b, &net.if_b)] {
        ns.ip(&["link", "set", ifname, "mtu", &mtu])
            .expect("set the veth MTU");
    }
    let start = |ns: &NetNs, ifname: &str, ip: Ipv4Addr, side: &str| {
        let mut cfg = XdpEngineConfig::new(ifname, ip, 24);
        tweak(&mut cfg);
        cfg.engine.name = format!("xdp-test-{n}{side}");
        start_xdp_engine(Some(ns), cfg).expect("engine")
    };
    let b_ip = Ipv4Addr::new(10, 88, n, 20);
    let ea = start(&net.a, &net.if_a, engine_ip(n), "a");
    let eb = start(&net.b, &net.if_b, b_ip, "b");
    (ea, eb, b_ip)
}

/// The `Tcp:` counters of a namespace's kernel (`/proc/net/snmp`).
fn tcp_snmp(ns: &NetNs, field: &str) -> u64 {
    let mut cmd = ns.command("cat").expect("netns command");
    cmd.arg("/proc/net/snmp");
    let out = run_bounded(cmd, Duration::from_secs(5));
    assert_success(&out, "cat /proc/net/snmp");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let (Some(names), Some(values)) = (tcp.next(), tcp.next()) else {
        panic!("no Tcp: lines in /proc/net/snmp");
    };
    let i = names
        .split_whitespace()
        .position(|n| n == field)
        .unwrap_or_else(|| panic!("no {field} in {names}"));
    values
        .split_whitespace()
        .nth(i)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("bad value for {field} in {values}"))
}

/// Connect from the engine, retrying while the kernel server is still starting.
fn connect_retry(engine: &XdpEngine, addr: SocketAddr, limit: Duration) -> TcpStream {
    let deadline = Instant::now() + limit;
    loop {
        match TcpStream::connect_timeout(engine.stack(), addr, Duration::from_secs(2)) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("connecting to {addr} from xwarp: {e}"),
        }
    }
}

/// curl in B downloads `len` bytes from the engine's http_server; verified by SHA-256.
fn curl_download(net: &VethPair, n: u8, port: u16, len: u64, seed: u64, dir: &TempDir) {
    let out_file = dir.path(&format!("curl-{seed}.bin"));
    let mut cmd = net.b.command("curl").expect("netns command");
    cmd.args(["-sS", "--fail", "--max-time", "60", "-o"])
        .arg(&out_file)
        .arg(format!(
            "http://{}:{port}/bytes/{len}?seed={seed}",
            engine_ip(n)
        ));
    let out = run_bounded(cmd, Duration::from_secs(70));
    assert_success(&out, "curl");
    let (got, got_len) = file_sha256(&out_file);
    assert_eq!(got_len, len, "curl body length");
    assert_eq!(got, sha256(&payload(seed, len as usize)), "curl body hash");
}

/// `tool` in B sends `data` to the engine's echo port and must get it back byte for byte.
fn echo_from_b(net: &VethPair, n: u8, port: u16, tool: &str, data_seed: u64, dir: &TempDir) {
    // At most what the engine side alone can hold (smoltcp receive and send buffers of
    // 1 MiB each plus the two 256 KiB application rings): nc and socat may block in a
    // `write` to the socket without reading the echo meanwhile, and with more data in
    // flight than every buffer on the path holds, client and echo server wait on each
    // other for ever. With 4 MiB that happened in ~5% of runs (the engine's dump showed
    // every buffer full: rx ring free 0, tx ring full, 1 MiB unacknowledged behind the
    // client's zero window, the client having read only its 128 KiB receive buffer's worth).
    let len = 2 << 20;
    let input = dir.path(&format!("{tool}-in.bin"));
    let output = dir.path(&format!("{tool}-out.bin"));
    let data = payload(data_seed, len);
    fs::write(&input, &data).expect("write input");
    let target = format!("{}", engine_ip(n));
    let script = match tool {
        // -N: shut the socket down for writing at EOF on stdin, then read until the
        // server's FIN.
        "nc" => format!(
            "nc -N -w 30 {target} {port} < {} > {}",
            input.display(),
            output.display()
        ),
        "socat" => format!(
            "socat -t 30 - TCP:{target}:{port} < {} > {}",
            input.display(),
            output.display()
        ),
        _ => unreachable!("unknown tool {tool}"),
    };
    let mut cmd = net.b.command("sh").expect("netns command");
    cmd.args(["-c", &script]);
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert_success(&out, tool);
    let (got, got_len) = file_sha256(&output);
    assert_eq!(got_len, len as u64, "{tool} echoed length");
    assert_eq!(got, sha256(&data), "{tool} echoed bytes");
}

#[test]
fn kernel_curl_downloads_12mib_from_xwarp_http_server() {
    require_root_and_afxdp!();
    ensure_tool("curl", "curl");
    let net = VethPair::new(21).expect("veth pair");
    let engine = engine_in_a(&net, 21, RxChecksum::TrustL4);
    let listener =
        TcpListener::bind(engine.stack(), SocketAddr::from((engine_ip(21), 8080))).unwrap();
    let server = Serving::start(http_server::serve_until, listener);
    let dir = TempDir::new("curl");
    curl_download(&net, 21, 8080, 12 << 20, 11, &dir);
    // A second request with another seed on a fresh connection.
    curl_download(&net, 21, 8080, (1 << 20) + 12345, 12, &dir);
    assert_eq!(server.finish(), 2);
    drop(engine);
}

#[test]
fn kernel_nc_and_socat_echo_through_xwarp() {
    require_root_and_afxdp!();
    ensure_tool("nc", "netcat-openbsd");
    ensure_tool("socat", "socat");
    let net = VethPair::new(22).expect("veth pair");
    let engine = engine_in_a(&net, 22, RxChecksum::TrustL4);
    let listener = TcpListener::bind(engine.stack(), SocketAddr::from((engine_ip(22), 7))).unwrap();
    let server = Serving::start(tcp_echo::serve_until, listener);
    let dir = TempDir::new("echo");
    echo_from_b(&net, 22, 7, "nc", 21, &dir);
    echo_from_b(&net, 22, 7, "socat", 22, &dir);
    assert_eq!(server.finish(), 2);
    drop(engine);
}

/// Read an HTTP/1.0 response to the end: (status line, body).
fn http_get(s: &mut TcpStream, host: &str, path: &str) -> (String, Vec<u8>) {
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).expect("read response");
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&all[..end]).into_owned();
    let status = head.lines().next().unwrap_or("").to_string();
    let len: Option<usize> = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    });
    let body = all[end + 4..].to_vec();
    if let Some(len) = len {
        assert_eq!(body.len(), len, "Content-Length vs body");
    }
    (status, body)
}

#[test]
fn xwarp_client_downloads_from_python_http_server() {
    require_root_and_afxdp!();
    ensure_tool("python3", "python3");
    let net = VethPair::new(23).expect("veth pair");
    let dir = TempDir::new("pyhttp");
    let data = payload(31, (12 << 20) + 777);
    fs::write(dir.path("blob.bin"), &data).unwrap();
    let mut cmd = net.b.command("python3").expect("netns command");
    cmd.args(["-m", "http.server", "8000", "--bind"])
        .arg(net.addr_b.to_string())
        .arg("--directory")
        .arg(&dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _server = Proc(cmd.spawn().expect("python3 -m http.server"));
    let engine = engine_in_a(&net, 23, RxChecksum::TrustL4);
    let addr = SocketAddr::from((net.addr_b, 8000));
    let mut s = connect_retry(&engine, addr, Duration::from_secs(15));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let (status, body) = http_get(&mut s, &net.addr_b.to_string(), "/blob.bin");
    assert!(status.contains(" 200 "), "status {status}");
    assert_eq!(body.len(), data.len());
    assert_eq!(sha256(&body), sha256(&data), "downloaded file hash");
}

#[test]
fn xwarp_client_to_socat_echo_and_nc_sink() {
    require_root_and_afxdp!();
    ensure_tool("nc", "netcat-openbsd");
    ensure_tool("socat", "socat");
    let net = VethPair::new(24).expect("veth pair");
    let dir = TempDir::new("clients");
    let b = net.addr_b.to_string();

    // socat echo server in B.
    let mut cmd = net.b.command("socat").expect("netns command");
    cmd.arg(format!("TCP-LISTEN:9001,bind={b},reuseaddr"))
        .arg("EXEC:cat")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _socat = Proc(cmd.spawn().expect("socat"));
    // nc sink in B: writes what it receives to a file, exits at the client's FIN.
    let sink = dir.path("sink.bin");
    let mut cmd = net.b.command("sh").expect("netns command");
    cmd.args([
        "-c",
        &format!("nc -l -d -w 30 {b} 9002 > {}", sink.display()),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let nc = Proc(cmd.spawn().expect("nc"));

    let engine = engine_in_a(&net, 24, RxChecksum::TrustL4);

    // Echo in lock step: 64 KiB out, 64 KiB back, 4 MiB in all.
    let mut s = connect_retry(
        &engine,
        SocketAddr::from((net.addr_b, 9001)),
        Duration::from_secs(15),
    );
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let data = payload(41, 4 << 20);
    let mut back = vec![0u8; 64 << 10];
    for chunk in data.chunks(64 << 10) {
        s.write_all(chunk).unwrap();
        s.read_exact(&mut back[..chunk.len()]).unwrap();
        assert_eq!(&back[..chunk.len()], chunk, "socat echoed bytes");
    }
    s.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "socat sent {} extra bytes", rest.len());

    // Upload 8 MiB to nc.
    let mut s = connect_retry(
        &engine,
        SocketAddr::from((net.addr_b, 9002)),
        Duration::from_secs(15),
    );
    let data = payload(42, 8 << 20);
    s.write_all(&data).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let out = wait_bounded(nc, Duration::from_secs(30), "nc -l");
    assert_success(&out, "nc -l");
    let (got, len) = file_sha256(&sink);
    assert_eq!(len, data.len() as u64, "nc received length");
    assert_eq!(got, sha256(&data), "nc received bytes");
}

#[test]
fn xwarp_to_xwarp_across_namespaces_64mib_verified() {
    require_root_and_afxdp!();
    let net = VethPair::new(25).expect("veth pair");
    // Both ends compute full checksums, so both can verify everything.
    let ea = engine_in_a(&net, 25, RxChecksum::Verify);
    let b_ip = Ipv4Addr::new(10, 88, 25, 20);
    let mut cfg = XdpEngineConfig::new(&net.if_b, b_ip, 24);
    cfg.rx_checksum = RxChecksum::Verify;
    cfg.engine.name = "xdp-test-25b".into();
    let eb = start_xdp_engine(Some(&net.b), cfg).expect("engine on veth-b");

    let total: u64 = 64 << 20;
    let listener = TcpListener::bind(eb.stack(), SocketAddr::from((b_ip, 5001))).unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let r = read_to_end_sha256(&mut s, 51);
        // Reply with the digest so the sender knows the receiver saw everything.
        s.write_all(&r.digest).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        r
    });
    let mut s = TcpStream::connect_timeout(
        ea.stack(),
        SocketAddr::from((b_ip, 5001)),
        Duration::from_secs(5),
    )
    .expect("connect engine to engine");
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    let t0 = Instant::now();
    let want = write_pattern_sha256(&mut s, 51, total);
    s.shutdown(Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut digest = Vec::new();
    s.read_to_end(&mut digest).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let r = receiver.join().expect("receiver");
    assert_eq!(
        (r.bytes, r.first_mismatch),
        (total, None),
        "receiver: {r:?}"
    );
    assert_eq!(digest, want, "receiver's digest of 64 MiB");
    let _ = writeln!(
        io::stderr(),
        "xwarp->xwarp 64 MiB in {secs:.2} s ({:.2} Gbit/s)",
        total as f64 * 8.0 / secs / 1e9
    );
}

#[test]
fn kernel_beside_xwarp_sends_no_rst_and_keeps_working() {
    require_root_and_afxdp!();
    ensure_tool("curl", "curl");
    ensure_tool("nc", "netcat-openbsd");
    let net = VethPair::new(26).expect("veth pair");
    let rst_before = tcp_snmp(&net.a, "OutRsts");
    let in_before = tcp_snmp(&net.a, "InSegs");
    let engine = engine_in_a(&net, 26, RxChecksum::TrustL4);
    let listener =
        TcpListener::bind(engine.stack(), SocketAddr::from((engine_ip(26), 8080))).unwrap();
    let server = Serving::start(http_server::serve_until, listener);
    let dir = TempDir::new("rst");
    // xwarp flows from the kernel in B: the kernel in A must see none of them.
    curl_download(&net, 26, 8080, 4 << 20, 61, &dir);
    curl_download(&net, 26, 8080, 4 << 20, 62, &dir);
    // A SYN to an xwarp port nobody listens on: the engine answers (RST), not the kernel.
    let mut cmd = net.b.command("nc").expect("netns command");
    cmd.args(["-z", "-w", "3"])
        .arg(engine_ip(26).to_string())
        .arg("9999");
    let out = run_bounded(cmd, Duration::from_secs(10));
    assert!(!out.status.success(), "nothing listens on xwarp port 9999");
    assert_eq!(
        tcp_snmp(&net.a, "InSegs"),
        in_before,
        "the kernel in A received segments of xwarp's flows"
    );
    assert_eq!(
        tcp_snmp(&net.a, "OutRsts"),
        rst_before,
        "the kernel in A sent RSTs while xwarp served its flows"
    );

    // A kernel TCP socket in A on the same interface keeps working beside the engine.
    let kl = net
        .a
        .run(|| std::net::TcpListener::bind(SocketAddr::from((net.addr_a, 9100))))
        .unwrap()
        .expect("kernel listener in A");
    let kernel_side = std::thread::spawn(move || {
        let (mut s, _) = kl.accept().expect("kernel accept");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    let data = payload(63, 1 << 20);
    let input = dir.path("kernel-in.bin");
    fs::write(&input, &data).unwrap();
    let mut cmd = net.b.command("sh").expect("netns command");
    cmd.args([
        "-c",
        &format!("nc -N -w 10 {} 9100 < {}", net.addr_a, input.display()),
    ]);
    let out = run_bounded(cmd, Duration::from_secs(30));
    assert_success(&out, "nc to the kernel in A");
    let got = kernel_side.join().expect("kernel side");
    assert_eq!(
        sha256(&got),
        sha256(&data),
        "kernel-to-kernel bytes beside xwarp"
    );
    // And the engine still serves after that.
    curl_download(&net, 26, 8080, 1 << 20, 64, &dir);
    assert_eq!(
        tcp_snmp(&net.a, "OutRsts"),
        rst_before,
        "the kernel in A sent RSTs"
    );
    assert_eq!(server.finish(), 3);
    drop(engine);
}

#[test]
fn full_rx_checksum_verification_works_with_peer_tx_offload_off() {
    require_root_and_afxdp!();
    ensure_tool("nc", "netcat-openbsd");
    let net = VethPair::new(27).expect("veth pair");
    // The kernel in B fills complete TCP checksums only with TX offload off.
    let if_b = net.if_b.clone();
    net.b
        .run(move || netns::set_tx_checksum_offload(&if_b, false))
        .unwrap()
        .expect("ethtool -K veth-b tx off");
    let engine = engine_in_a(&net, 27, RxChecksum::Verify);
    let listener = TcpListener::bind(engine.stack(), SocketAddr::from((engine_ip(27), 7))).unwrap();
    let server = Serving::start(tcp_echo::serve_until, listener);
    let dir = TempDir::new("verify");
    echo_from_b(&net, 27, 7, "nc", 71, &dir);
    assert_eq!(server.finish(), 1);
    drop(engine);
}

/// Regression (stack bug found here): a thread blocked in `TcpListener::accept` must be
/// woken when its engine stops and fail with `ConnectionAborted`, as documented for
/// sockets of a stopped engine. Needs no root (virtual wire).
#[test]
fn blocked_accept_returns_when_engine_stops() {
    let (a, b) = xwarp::net::vwire_pair(Default::default()).expect("vwire pair");
    let listener = TcpListener::bind(b.stack(), "10.77.0.2:80".parse().unwrap()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = listener.accept().map(|_| ());
        let _ = tx.send(r.map_err(|e| e.kind()));
    });
    std::thread::sleep(Duration::from_millis(200));
    drop(b);
    drop(a);
    let r = rx
        .recv_timeout(Duration::from_secs(3))
        .expect("accept still blocked 3 s after its engine stopped");
    assert_eq!(
        r,
        Err(std::io::ErrorKind::ConnectionAborted),
        "accept on a stopped engine"
    );
}

/// Same for a thread blocked in `TcpStream::read` and one blocked in `write` (full rings):
/// both fail with `ConnectionAborted` once their engines stop. Needs no root.
#[test]
fn blocked_read_and_write_return_when_engine_stops() {
    let (a, b) = xwarp::net::vwire_pair(Default::default()).expect("vwire pair");
    let addr: SocketAddr = "10.77.0.2:81".parse().unwrap();
    let listener = TcpListener::bind(b.stack(), addr).unwrap();
    // Connection 1: its server reads, its client never writes.
    let silent_client = TcpStream::connect(a.stack(), addr).expect("connect 1");
    let (mut reader, _) = listener.accept().expect("accept 1");
    // Connection 2: its client writes, its server never reads (rings and window fill).
    let mut writer = TcpStream::connect(a.stack(), addr).expect("connect 2");
    let (unread_server, _) = listener.accept().expect("accept 2");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader_tx = tx.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        let _ = reader_tx.send(("read", reader.read(&mut buf).map_err(|e| e.kind())));
    });
    std::thread::spawn(move || {
        let chunk = vec![7u8; 1 << 20];
        let r: Result<usize, io::ErrorKind> = loop {
            if let Err(e) = writer.write(&chunk) {
                break Err(e.kind());
            }
        };
        let _ = tx.send(("write", r));
    });
    std::thread::sleep(Duration::from_millis(300));
    drop(b);
    drop(a);
    for _ in 0..2 {
        let (what, r) = rx
            .recv_timeout(Duration::from_secs(3))
            .expect("a blocked read or write still blocked 3 s after its engine stopped");
        assert_eq!(
            r,
            Err(io::ErrorKind::ConnectionAborted),
            "{what} on a stopped engine"
        );
    }
    drop((silent_client, unread_server));
}

/// Why [`RxChecksum::TrustL4`] is the default: a kernel veth peer sends partial TCP
/// checksums (docs/afxdp.md §7.3), so an engine verifying L4 checksums drops even its SYN.
#[test]
fn rx_checksum_verify_drops_partial_checksums_from_a_veth_peer() {
    require_root_and_afxdp!();
    ensure_tool("nc", "netcat-openbsd");
    let net = VethPair::new(28).expect("veth pair");
    let engine = engine_in_a(&net, 28, RxChecksum::Verify);
    let _listener =
        TcpListener::bind(engine.stack(), SocketAddr::from((engine_ip(28), 7))).unwrap();
    let mut cmd = net.b.command("nc").expect("netns command");
    cmd.args(["-z", "-w", "2"])
        .arg(engine_ip(28).to_string())
        .arg("7");
    let out = run_bounded(cmd, Duration::from_secs(10));
    assert!(
        !out.status.success(),
        "a kernel peer with TX checksum offload on got through a verifying engine"
    );
}

/// Multi-buffer AF_XDP on a veth pair at MTU 9000 with 2048-byte chunks: every full-size
/// segment (9014-byte frame) travels as a chain of six descriptors, received chains are
/// reassembled and transmitted frames are split. Engine↔engine both ways, then a kernel
/// peer (nc) echoing through the engine; all data verified by SHA-256.
#[test]
fn multi_buffer_jumbo_frames_both_ways_verified() {
    use xwarp::poll_driver::backend::Backend;
    require_root_and_afxdp!();
    ensure_tool("nc", "netcat-openbsd");
    let n = 29;
    let net = VethPair::new(n).expect("veth pair");
    let (ea, eb, b_ip) = jumbo_engine_pair(&net, n, 9000, |cfg| cfg.multi_buffer = true);
    assert_eq!(
        ea.stack().config().mtu,
        9000,
        "stack MTU follows the interface"
    );
    assert_eq!(eb.stack().config().mtu, 9000);

    // Engine to engine: 32 MiB A->B, then 8 MiB B->A on the same connection.
    let (up, down): (u64, usize) = (32 << 20, 8 << 20);
    let listener = TcpListener::bind(eb.stack(), SocketAddr::from((b_ip, 5001))).unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        let r = read_to_end_sha256(&mut s, 52);
        s.write_all(&payload(53, down)).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        r
    });
    let mut s = TcpStream::connect_timeout(
        ea.stack(),
        SocketAddr::from((b_ip, 5001)),
        Duration::from_secs(5),
    )
    .expect("connect engine to engine");
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let want = write_pattern_sha256(&mut s, 52, up);
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    if let Err(e) = s.read_to_end(&mut back) {
        drop(s);
        let mut xa = ea.stop().expect("stop a");
        let mut xb = eb.stop().expect("stop b");
        let sa = (
            xa.backend.stats(),
            xa.backend.xdp_statistics(),
            xa.backend.ring_snapshot(),
        );
        let sb = (
            xb.backend.stats(),
            xb.backend.xdp_statistics(),
            xb.backend.ring_snapshot(),
        );
        let la = net.a.ip(&["-s", "-s", "link", "show", &net.if_a]);
        let lb = net.b.ip(&["-s", "-s", "link", "show", &net.if_b]);
        let ea2 = net
            .a
            .command("ethtool")
            .map(|mut c| c.args(["-S", &net.if_a]).output());
        let eb2 = net
            .b
            .command("ethtool")
            .map(|mut c| c.args(["-S", &net.if_b]).output());
        panic!("download failed after {} bytes: {e}\nA {sa:?}\nB {sb:?}\n{la:?}\n{lb:?}\n{ea2:?}\n{eb2:?}", back.len());
    }
    let r = receiver.join().expect("receiver");
    if (r.bytes, r.first_mismatch) != (up, None) {
        let (sa, sb) = (ea.stack().stats(), eb.stack().stats());
        let xa = ea.stop().expect("stop a");
        let xb = eb.stop().expect("stop b");
        panic!(
            "B received {} of {up} bytes, first difference from the pattern at {:?}\nA {sa:?} {:?} {:?}\nB {sb:?} {:?} {:?}",
            r.bytes,
            r.first_mismatch,
            xa.backend.stats(),
            xa.backend.xdp_statistics(),
            xb.backend.stats(),
            xb.backend.xdp_statistics(),
        );
    }
    assert_eq!(r.digest, want, "B's digest of the upload");
    assert_eq!(back.len(), down, "bytes received by A");
    assert_eq!(sha256(&back), sha256(&payload(53, down)), "A's download");
    drop(s);

    // A kernel peer at MTU 9000 (GSO hands the veth 9014-byte frames) through engine A.
    let listener = TcpListener::bind(ea.stack(), SocketAddr::from((engine_ip(n), 7))).unwrap();
    let server = Serving::start(tcp_echo::serve_until, listener);
    let dir = TempDir::new("multibuf");
    echo_from_b(&net, n, 7, "nc", 72, &dir);
    assert_eq!(server.finish(), 1);

    // B received the 32 MiB as jumbo frames: its frames average far above one chunk.
    let exit_b = eb.stop().expect("stop engine b");
    let st = exit_b.backend.stats();
    assert!(
        st.rx_frames > 0 && st.rx_bytes / st.rx_frames > 4096,
        "engine b: {} bytes in {} frames",
        st.rx_bytes,
        st.rx_frames
    );
    drop(ea);
}

/// `XdpEngineConfig::rx_frames` sizes the RX area. Two engines at MTU 60000 (multi-buffer
/// chains of 16 chunks) with as few RX chunks as `xwarp bench` gives them for a 2 MiB
/// receive window (764: a full window of full frames plus a quarter, plus 64) move 48 MiB
/// intact, the receiver's kernel socket drops nothing for want of a fill buffer, and the
/// area has the asked-for size (every chunk back once traffic stopped).
#[test]
fn rx_area_sized_to_the_receive_window_takes_jumbo_frames_without_drops() {
    use xwarp::poll_driver::afxdp::ChunkSize;
    use xwarp::poll_driver::backend::Backend;
    require_root_and_afxdp!();
    let n = 30;
    let window = 2 << 20;
    let rx_frames = 764;
    let net = VethPair::new(n).expect("veth pair");
    let (ea, eb, b_ip) = jumbo_engine_pair(&net, n, 60000, |cfg| {
        cfg.chunk = ChunkSize::C4096;
        cfg.multi_buffer = true;
        cfg.rx_frames = rx_frames;
        cfg.stack.rx_buffer = window;
        cfg.stack.tx_buffer = window;
    });
    assert_eq!(
        eb.stack().config().mtu,
        60000,
        "stack MTU follows the interface"
    );

    let total: u64 = 48 << 20;
    let listener = TcpListener::bind(eb.stack(), SocketAddr::from((b_ip, 5001))).unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        read_to_end_sha256(&mut s, 91)
    });
    let mut s = TcpStream::connect_timeout(
        ea.stack(),
        SocketAddr::from((b_ip, 5001)),
        Duration::from_secs(5),
    )
    .expect("connect engine to engine");
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    let want = write_pattern_sha256(&mut s, 91, total);
    s.shutdown(Shutdown::Write).unwrap();
    let r = receiver.join().expect("receiver");
    assert_eq!(
        (r.bytes, r.first_mismatch),
        (total, None),
        "B received the whole pattern"
    );
    assert_eq!(r.digest, want, "B's digest of the upload");
    drop(s);
    drop(ea);
    let mut exit_b = eb.stop().expect("stop engine b");
    let xs = exit_b.backend.xdp_statistics().expect("XDP statistics");
    assert_eq!(
        (xs.rx_dropped, xs.rx_ring_full),
        (0, 0),
        "the kernel dropped frames into a window-sized RX area: {xs:?}"
    );
    let c = exit_b.backend.chunk_counts();
    assert_eq!(c.rx_total, rx_frames, "RX chunks as configured");
    let st = exit_b.backend.stats();
    assert!(
        st.rx_frames > 0 && st.rx_bytes / st.rx_frames > 16 << 10,
        "engine b took jumbo frames: {} bytes in {} frames",
        st.rx_bytes,
        st.rx_frames
    );
}
