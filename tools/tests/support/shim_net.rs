//! The harness of the shim matrix (`tests/shim_matrix.rs`): the same topology and process
//! handling as `tests/preload_programs.rs` (a veth pair between namespaces A and B; programs
//! under the shim in A with the engine bound by AF_XDP to `veth-a` and owning `10.88.<net>.10`,
//! an address A's kernel does not have; kernel peers in B), plus what the matrix adds: A's
//! kernel TCP counters (to prove the kernel never saw a connection) and the row printer.
//! Include with `#[path = "support/shim_net.rs"] mod shim_net;`.
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

fn have(bin: &str) -> bool {
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

/// The shim, built once (release profile) into this test binary's own target directory.
pub fn shim() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        if let Ok(p) = std::env::var("XWARP_PRELOAD") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("current_exe");
        // <target>/<profile>/deps/<test binary>
        let target = exe
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf();
        let st = Command::new(env!("CARGO"))
            .args(["build", "--release", "-q", "-p", "xwarp-preload"])
            .arg("--target-dir")
            .arg(&target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo");
        assert!(st.success(), "building xwarp-preload failed");
        let so = target.join("release").join("libxwarp_preload.so");
        assert!(so.exists(), "{} missing", so.display());
        so
    })
}

/// A child process in its own process group, killed (group and all) and reaped on drop.
pub struct Proc(Option<Child>, &'static str);

impl Proc {
    /// Stop it (SIGKILL to the group after `grace`) and return what it wrote.
    pub fn stop(mut self, grace: Duration) -> Output {
        let child = self.0.take().expect("child");
        let start = Instant::now();
        let pid = child.id();
        let out = std::thread::scope(|s| {
            let h = s.spawn(move || child.wait_with_output());
            while !h.is_finished() {
                if start.elapsed() > grace {
                    kill_group(pid);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            h.join().expect("join")
        });
        out.unwrap_or_else(|e| panic!("waiting for {}: {e}", self.1))
    }
}

fn kill_group(pgid: u32) {
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

/// One test network: the pair and the engine's address.
pub struct Net {
    /// Namespaces A (shim) and B (kernel peers).
    pub pair: VethPair,
    /// The engine's address on `veth-a`.
    pub engine: Ipv4Addr,
}

impl Net {
    /// The pair `10.88.<net>.0/24`, the shim built first (see preload_programs.rs).
    pub fn new(net: u8) -> Net {
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

    /// `timeout SECS prog args...` in namespace A, under the shim when `shim` (strict,
    /// `XWARP_LOG=info`), else on A's kernel.
    pub fn in_a(&self, shim_on: bool, secs: u32, prog: &str, args: &[&str]) -> Command {
        let mut c = self.pair.a.command("timeout").expect("ns A");
        c.arg(secs.to_string()).arg(prog).args(args);
        if shim_on {
            c.env("LD_PRELOAD", shim())
                .env("XWARP_IFACE", &self.pair.if_a)
                .env("XWARP_ADDR", format!("{}/24", self.engine))
                .env("XWARP_LOG", "info")
                .env("XWARP_STRICT", "1");
        }
        c
    }

    /// `timeout SECS prog args...` in namespace B (kernel).
    pub fn in_b(&self, secs: u32, prog: &str, args: &[&str]) -> Command {
        let mut c = self.pair.b.command("timeout").expect("ns B");
        c.arg(secs.to_string()).arg(prog).args(args);
        c
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
        let out = run(
            self.pair.a.command("cat").expect("ns A"),
            "snmp",
            &["/proc/net/snmp"],
        );
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
    c.process_group(0);
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    Proc(Some(child), name)
}

/// Run `c` with extra `args` to completion; panic with its output unless it succeeds.
pub fn run(mut c: Command, what: &str, args: &[&str]) -> Output {
    let out = c
        .args(args)
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
    let addr = std::net::SocketAddr::from((ip, port));
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let ok = net
            .pair
            .b
            .run(move || {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
            })
            .expect("setns");
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("nothing listens on {addr}");
}

/// SHA-256 of a file, hex.
pub fn sha256(path: &Path) -> String {
    let out = run(
        Command::new("sha256sum"),
        "sha256sum",
        &[path.to_str().unwrap()],
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A fresh scratch directory.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xwarp-matrix-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// `dir/name`: `mb` MiB of pseudo-random bytes.
pub fn random_file(dir: &Path, name: &str, mb: usize) -> PathBuf {
    let p = dir.join(name);
    let script = format!("head -c {} /dev/urandom > {}", mb << 20, p.display());
    run(Command::new("sh"), "make blob", &["-c", &script]);
    p
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
