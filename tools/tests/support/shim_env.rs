//! What the root tests of programs under the LD_PRELOAD shim share (`preload_programs`,
//! `shim_asyncio`, `shim_matrix`): the shim built once, a veth test network with the shim's
//! environment (namespaces A and B; programs under the shim in A with the engine bound by
//! AF_XDP to `veth-a` and owning `10.88.<net>.10`, an address A's kernel does not have;
//! kernel peers in B), A's kernel TCP counters (to prove the kernel never saw a connection),
//! child processes killed on drop, tools installed on demand, hashes and scratch files, the
//! parsers of tool output the tests share and the matrix's row printer.
//! Include with `#[path = "support/shim_env.rs"] mod shim_env;` (each test binary uses
//! part of it).
#![allow(dead_code)]

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use xwarp::poll_driver::netns::{self, VethPair};

static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time: the machine has two cores and the numbers are compared.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `bin` is on `PATH`.
pub fn have(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Make sure `bin` exists, installing Debian package `pkg` with apt if not (root only).
pub fn ensure_tool(bin: &str, pkg: &str) {
    if have(bin) {
        return;
    }
    let _ = writeln!(io::stderr(), "installing {pkg} for {bin}");
    let _ = Command::new("sh")
        .args([
            "-c",
            &format!(
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {pkg} \
                 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {pkg})"
            ),
        ])
        .stdout(Stdio::null())
        .status();
    assert!(
        have(bin),
        "{bin} missing and `apt-get install {pkg}` failed"
    );
}

/// The shim, built once (release profile: the shim's speed is part of what is tested) into
/// this test binary's own target directory.
pub fn shim() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        if let Ok(p) = std::env::var("XWARP_PRELOAD") {
            return PathBuf::from(p);
        }
        build_release_lib("xwarp-preload", "libxwarp_preload.so")
    })
}

/// The libibverbs-compatible library (`xwarp-ibverbs`), built once (release profile) into
/// this test binary's own target directory (`$XWARP_IBVERBS` if set).
pub fn ibverbs() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        if let Ok(p) = std::env::var("XWARP_IBVERBS") {
            return PathBuf::from(p);
        }
        build_release_lib("xwarp-ibverbs", "libxwarp_ibverbs.so")
    })
}

/// `cargo build --release -p PKG` into this test binary's target directory; the path of
/// its library `file`.
fn build_release_lib(pkg: &str, file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // <target>/<profile>/deps/<test binary>
    let target = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "-q", "-p", pkg, "--target-dir"])
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo");
    assert!(st.success(), "building {pkg} failed");
    let so = target.join("release").join(file);
    assert!(so.exists(), "{} missing", so.display());
    so
}

/// A child process killed (and reaped) on drop.
pub struct Proc(pub Option<Child>, pub &'static str);

impl Proc {
    /// Wait for it (SIGKILL to the group after `limit`) and return what it wrote.
    pub fn wait_output(mut self, limit: Duration) -> Output {
        let child = self.0.take().expect("child");
        let start = Instant::now();
        let pid = child.id();
        let out = std::thread::scope(|s| {
            let h = s.spawn(move || child.wait_with_output());
            while !h.is_finished() {
                if start.elapsed() > limit {
                    kill_group(pid);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            h.join().expect("join")
        });
        out.unwrap_or_else(|e| panic!("waiting for {}: {e}", self.1))
    }
}

/// SIGKILL the process group `pgid` (the `timeout` wrapper and the program under it).
pub fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-9", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            kill_group(c.id());
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One test network: the pair, the engine's address and the shim environment.
pub struct Net {
    /// Namespaces A (shim) and B (kernel peers).
    pub pair: VethPair,
    /// The engine's address on `veth-a`.
    pub engine: Ipv4Addr,
}

impl Net {
    /// The pair `10.88.<net>.0/24`, the shim built first.
    pub fn new(net: u8) -> Net {
        // Build the shim now, before a test starts peers or clocks: the first `shimmed`
        // call otherwise runs `cargo build --release -p xwarp-preload` (tens of seconds
        // on a loaded machine, e.g. a clean-clone CI run) while kernel peers started
        // under `timeout 30` are already running. The eintr test's peer died of its
        // timeout that way before the program connected ("FAIL connect: Connection
        // refused" with "engine started" in its stderr), or the build landed inside the
        // test's 4 s promptness window (reproduced: 31 s run, `secs < 4.0` failed).
        shim();
        let pair = VethPair::new(net).expect("veth pair");
        // Peers send complete checksums (docs/afxdp.md §7.3: veth hands over partial ones).
        let if_b = pair.if_b.clone();
        pair.b
            .run(move || netns::set_tx_checksum_offload(&if_b, false))
            .expect("setns")
            .expect("ethtool tx off");
        Net {
            pair,
            engine: Ipv4Addr::new(10, 88, net, 10),
        }
    }

    /// `timeout SECS prog args...` in namespace A under the shim.
    pub fn shimmed(&self, secs: u32, prog: &str, args: &[&str]) -> Command {
        let mut c = self.pair.a.command("timeout").expect("ns A");
        c.arg(secs.to_string()).arg(prog).args(args);
        c.env("LD_PRELOAD", shim())
            .env("XWARP_IFACE", &self.pair.if_a)
            .env("XWARP_ADDR", format!("{}/24", self.engine))
            .env("XWARP_LOG", "info")
            .env("XWARP_STRICT", "1");
        c
    }

    /// `timeout SECS prog args...` in namespace `b` (or A without the shim when `a`).
    pub fn kernel(&self, in_a: bool, secs: u32, prog: &str, args: &[&str]) -> Command {
        let ns = if in_a { &self.pair.a } else { &self.pair.b };
        let mut c = ns.command("timeout").expect("ns");
        c.arg(secs.to_string()).arg(prog).args(args);
        c
    }

    /// `timeout SECS prog args...` in namespace A, under the shim when `shim_on`, else on
    /// A's kernel.
    pub fn in_a(&self, shim_on: bool, secs: u32, prog: &str, args: &[&str]) -> Command {
        if shim_on {
            self.shimmed(secs, prog, args)
        } else {
            self.kernel(true, secs, prog, args)
        }
    }

    /// `timeout SECS prog args...` in namespace B (kernel).
    pub fn in_b(&self, secs: u32, prog: &str, args: &[&str]) -> Command {
        self.kernel(false, secs, prog, args)
    }

    /// The address a server in A listens on: the engine's under the shim, else the kernel's.
    pub fn server_ip(&self, shim_on: bool) -> Ipv4Addr {
        if shim_on {
            self.engine
        } else {
            self.pair.addr_a
        }
    }

    /// A's kernel TCP counters `(ActiveOpens, PassiveOpens)` from its `/proc/net/snmp`.
    pub fn a_tcp_opens(&self) -> (u64, u64) {
        let mut c = self.pair.a.command("cat").expect("ns A");
        c.arg("/proc/net/snmp");
        let out = run(c, "snmp");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
        let (names, values) = (
            tcp.next().expect("Tcp names"),
            tcp.next().expect("Tcp values"),
        );
        let field = |want: &str| -> u64 {
            let i = names
                .split_whitespace()
                .position(|n| n == want)
                .unwrap_or_else(|| panic!("no {want} in {names}"));
            values
                .split_whitespace()
                .nth(i)
                .expect("value")
                .parse()
                .expect("number")
        };
        (field("ActiveOpens"), field("PassiveOpens"))
    }
}

/// Spawn `c` in its own process group with piped output.
pub fn spawn(mut c: Command, name: &'static str) -> Proc {
    // Its own process group, so the program under `timeout` dies with it.
    c.process_group(0);
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    Proc(Some(child), name)
}

/// Run `c` to completion; panic with its output unless it succeeds.
pub fn run(mut c: Command, what: &str) -> Output {
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Wait until something listens on `ip:port` as seen from namespace B.
pub fn wait_port(net: &Net, ip: Ipv4Addr, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let script =
        format!("import socket\ns=socket.create_connection(('{ip}',{port}),timeout=1)\ns.close()");
    while Instant::now() < deadline {
        let ok = net
            .kernel(false, 3, "python3", &["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("nothing listens on {ip}:{port}");
}

/// SHA-256 of a file, hex.
pub fn sha256(path: &Path) -> String {
    let out = run(
        {
            let mut c = Command::new("sha256sum");
            c.arg(path);
            c
        },
        "sha256sum",
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A fresh scratch directory.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xwarp-preload-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// A file of `mb` MiB of pseudo-random bytes.
pub fn random_file(dir: &Path, mb: usize) -> PathBuf {
    let p = dir.join("blob");
    run(
        {
            let mut c = Command::new("sh");
            c.args([
                "-c",
                &format!("head -c {} /dev/urandom > {}", mb << 20, p.display()),
            ]);
            c
        },
        "make blob",
    );
    p
}

/// `iperf3` "receiver" line: bits per second.
pub fn iperf_receiver_bps(out: &Output) -> f64 {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("receiver"))
        .unwrap_or_else(|| panic!("no receiver line in:\n{text}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    let i = f
        .iter()
        .position(|w| w.ends_with("bits/sec"))
        .expect("unit");
    let v: f64 = f[i - 1].parse().expect("rate");
    v * match f[i].chars().next() {
        Some('G') => 1e9,
        Some('M') => 1e6,
        Some('K') => 1e3,
        _ => 1.0,
    }
}

/// Print one row of the matrix (stderr, so that it shows without `--nocapture` only on
/// failure, and with it always):
/// `MATRIX | program | accelerated | verified | shim | kernel | shim/kernel`.
pub fn report(program: &str, verified: &str, unit: &str, shim_v: f64, kernel_v: f64) {
    let ratio = if kernel_v > 0.0 {
        shim_v / kernel_v
    } else {
        f64::NAN
    };
    let _ = writeln!(
        io::stderr(),
        "MATRIX | {program} | yes | {verified} | {shim_v:.0} {unit} | {kernel_v:.0} {unit} | {ratio:.2}x"
    );
}

/// Kernel clients in B: `conns` concurrent connections, each sending a distinct random
/// payload and checking the echo's SHA-256.
pub fn echo_clients(net: &Net, port: u16, conns: usize, base: usize) {
    let script = format!(
        r#"
import hashlib, os, socket, threading, sys
errs = []
def one(i):
    try:
        data = os.urandom({base} + 4099 * i)
        s = socket.create_connection(("{ip}", {port}), timeout=20)
        def tx():
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        t = threading.Thread(target=tx); t.start()
        got = bytearray()
        while True:
            b = s.recv(1 << 16)
            if not b: break
            got += b
        t.join(); s.close()
        if hashlib.sha256(got).digest() != hashlib.sha256(data).digest():
            errs.append(f"conn {{i}}: echo differs ({{len(got)}} of {{len(data)}} bytes)")
    except Exception as e:
        errs.append(f"conn {{i}}: {{e!r}}")
ts = [threading.Thread(target=one, args=(i,)) for i in range({conns})]
[t.start() for t in ts]; [t.join() for t in ts]
print("\n".join(errs) or "clients ok"); sys.exit(1 if errs else 0)
"#,
        ip = net.engine
    );
    run(
        net.kernel(false, 60, "python3", &["-c", &script]),
        "echo clients",
    );
}

/// What `tests/preload/epoll_mix.c` printed on its `OK ` line, and its stderr.
pub struct EpollMix {
    line: String,
    /// The program's standard error (the shim's log lines).
    pub stderr: String,
}

impl EpollMix {
    /// The integer field `key=` of the result line; panics, naming it, if it is missing.
    pub fn field(&self, key: &str) -> i64 {
        self.line
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} missing in {}", self.line))
    }
}

/// Builds `tests/preload/epoll_mix.c`, runs it under the shim in A (with `env` set, e.g.
/// `XWARP_MODE=inline`) serving `conns` connections on port 7000, and checks what every
/// mode shares: the loopback UDP probe echoed by the kernel fallback, `conns - 1` kernel
/// echo clients from B verified by SHA-256 (`wait_port`'s probe is the last connection),
/// the byte count, the pipe, timerfd and UDP event counts. Returns the result line for
/// the caller's own checks.
pub fn epoll_mix(net: &Net, scratch_name: &str, conns: usize, env: &[(&str, &str)]) -> EpollMix {
    let dir = scratch(scratch_name);
    let bin = dir.join("epoll_mix");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/preload/epoll_mix.c");
    let mut cc = Command::new("gcc");
    cc.args(["-O2", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src);
    run(cc, "gcc epoll_mix.c");
    let mut prog = net.shimmed(60, bin.to_str().unwrap(), &["7000", &conns.to_string()]);
    prog.envs(env.iter().copied());
    let srv = spawn(prog, "epoll_mix");
    wait_port(net, net.engine, 7000);
    // A UDP datagram to the program's loopback UDP socket (kernel fallback) is echoed.
    let udp = r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
s.sendto(b"udp-probe", ("127.0.0.1", 7000)); print(s.recv(100).decode())
"#;
    let u = run(net.kernel(true, 10, "python3", &["-c", udp]), "udp probe");
    assert_eq!(String::from_utf8_lossy(&u.stdout).trim(), "udp-probe");
    // wait_port's probe connection counts as one (it sends nothing and closes).
    let clients = conns - 1;
    echo_clients(net, 7000, clients, 1_000_000);
    let out = srv.wait_output(Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "epoll_mix failed: {text} {stderr}");
    let line = text
        .lines()
        .find(|l| l.starts_with("OK "))
        .unwrap_or_else(|| panic!("no result: {text} {stderr}"))
        .to_string();
    let mix = EpollMix { line, stderr };
    assert_eq!(mix.field("conns"), conns as i64);
    let expect: i64 = (0..clients).map(|i| 1_000_000 + 4099 * i as i64).sum();
    assert_eq!(mix.field("bytes"), expect, "bytes echoed");
    assert_eq!(
        mix.field("pipe"),
        5,
        "pipe events (kernel fd in the same ET set)"
    );
    assert!(mix.field("timer") >= 1, "timerfd events");
    assert_eq!(mix.field("udp"), 1, "UDP datagrams (kernel fallback)");
    let _ = std::fs::remove_dir_all(&dir);
    mix
}
