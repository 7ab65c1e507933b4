//! The perftest rows of `xwarp bench rdma`: Debian's unmodified `ib_write_bw -R` and
//! `ib_send_lat -R` (`/usr/bin`, package `perftest`) between two xwarp engines, one per
//! process, each program under the launcher (`xwarp run --iface IF --addr A/24 -- ...`,
//! which preloads `libxwarp_ibverbs.so`, [`crate::launcher`]), on the same veth pair as the
//! Rust-API rows, after those rows' engines stopped (each process's engine binds the
//! interface's AF_XDP queue).
//!
//! The server runs in namespace B at `10.88.<net>.40`, the client in A at `.30`. Each row
//! gets a fresh port. The server is started first; the client starts once the server's
//! engine answers ARP (probed from A's kernel, at most [`LISTEN_WAIT`]; perftest's own
//! output says nothing before the connection) and 200 ms more. A client that still fails
//! without a result line while its server runs (its connect came before the listen and
//! was refused: perftest gives up at once) is started again, at most [`CLIENT_TRIES`]
//! times; `XWARP_CONNECT_RETRY_MS=5000` makes the library itself retry a refused connect
//! for up to 5 s.
//! Every process runs in its own process group with a deadline, and is killed (group and
//! all) when the row ends, fails, or the bench is torn down (`common::teardown`, SIGTERM).
//!
//! Bandwidth: `ib_write_bw -R -F --report_gbits -s SIZE -D SECS -t 16 -Q 4` (16
//! outstanding, every 4th signaled, as the Rust write_bw) reports its average in Gbit/s
//! (10^9); perftest busy-polls its CQ. Latency: `ib_send_lat -R -F -s SMALL -n N` reports
//! one-way times (half the round trip) typical (the median), average and the 99th
//! percentile, µs.

use std::io::{self, BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xwarp::poll_driver::netns::{NetNs, VethPair};

/// The perftest programs the rows run.
pub const WRITE_BW: &str = "ib_write_bw";
/// See [`WRITE_BW`].
pub const SEND_LAT: &str = "ib_send_lat";

/// How long the server may take to say it listens.
pub(super) const LISTEN_WAIT: Duration = Duration::from_secs(15);
/// Client attempts per row.
pub(super) const CLIENT_TRIES: u32 = 10;
/// Above the row's own length, how long a process may run before it is killed.
const SLACK: Duration = Duration::from_secs(30);

/// The result line of `ib_write_bw` (any perftest bandwidth test).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwLine {
    /// Message size, bytes.
    pub bytes: u64,
    /// Messages moved.
    pub iterations: u64,
    /// BW average, Gbit/s (10^9 bits; converted from MB/sec, 2^20 bytes, when perftest ran
    /// without `--report_gbits`).
    pub avg_gbps: f64,
}

/// The result line of `ib_send_lat` (any perftest latency test run with `-n`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatLine {
    /// Message size, bytes.
    pub bytes: u64,
    /// Round trips.
    pub iterations: u64,
    /// One-way minimum, µs.
    pub min_us: f64,
    /// One-way typical (median), µs.
    pub typical_us: f64,
    /// One-way average, µs.
    pub avg_us: f64,
    /// One-way 99th percentile, µs.
    pub p99_us: f64,
}

/// The numeric fields of the line after the last column header containing `mark`, and
/// that header.
fn result_fields<'a>(text: &'a str, mark: &str) -> Option<(&'a str, Vec<f64>)> {
    let lines: Vec<&str> = text.lines().collect();
    let i = lines
        .iter()
        .rposition(|l| l.contains("#bytes") && l.contains(mark))?;
    let fields: Option<Vec<f64>> = lines
        .get(i + 1)?
        .split_whitespace()
        .map(|f| f.parse::<f64>().ok().filter(|v| v.is_finite()))
        .collect();
    Some((lines[i], fields?))
}

/// Parse the result of a perftest bandwidth test (`#bytes #iterations BW peak BW average
/// MsgRate`); `None` when there is none or it is malformed.
pub fn parse_bw(text: &str) -> Option<BwLine> {
    let (header, f) = result_fields(text, "BW average")?;
    if f.len() < 5 {
        return None;
    }
    let avg = if header.contains("BW average[Gb/sec]") {
        f[3]
    } else if header.contains("BW average[MB/sec]") {
        f[3] * 1048576.0 * 8.0 / 1e9
    } else {
        return None;
    };
    Some(BwLine {
        bytes: f[0] as u64,
        iterations: f[1] as u64,
        avg_gbps: avg,
    })
}

/// Parse the result of a perftest latency test run with `-n` (`#bytes #iterations t_min
/// t_max t_typical t_avg t_stdev 99% 99.9%`, µs); `None` when there is none or it is
/// malformed.
pub fn parse_lat(text: &str) -> Option<LatLine> {
    let (header, f) = result_fields(text, "t_typical")?;
    if f.len() < 9 || !header.contains("99% percentile[usec]") {
        return None;
    }
    Some(LatLine {
        bytes: f[0] as u64,
        iterations: f[1] as u64,
        min_us: f[2],
        typical_us: f[4],
        avg_us: f[5],
        p99_us: f[7],
    })
}

/// One end of the perftest rows.
pub(super) struct End<'a> {
    /// Its namespace.
    pub ns: &'a NetNs,
    /// The interface its engine binds.
    pub ifname: &'a str,
    /// The engine's address.
    pub ip: Ipv4Addr,
    /// The core the whole process is pinned to (`--pin sides` / `apart`), if any.
    pub core: Option<usize>,
}

/// Where the rows get their programs and libraries.
#[derive(Debug, Clone)]
pub(super) struct Tools {
    /// The `xwarp` executable (its `run` subcommand is the launcher).
    pub xwarp: PathBuf,
    /// `--preload` for `xwarp run`, if given.
    pub preload: Option<PathBuf>,
    /// `--rdma-lib` for `xwarp run`, if given.
    pub rdma_lib: Option<PathBuf>,
    /// The engines' MTU (`XWARP_MTU`).
    pub mtu: usize,
    /// The engines' prefix length.
    pub prefix: u8,
    /// The engines' idle policy as the library reads it (`XWARP_ENGINE_SPIN_US`,
    /// `XWARP_YIELD`): the Rust rows' engines' policy where the library can express it.
    pub engine_env: Vec<(&'static str, String)>,
}

impl Tools {
    /// Check that perftest and the launcher's libraries are there: `Err` says what is
    /// missing.
    pub fn check(
        xwarp: PathBuf,
        preload: Option<PathBuf>,
        rdma_lib: Option<PathBuf>,
        mtu: usize,
        prefix: u8,
    ) -> Result<Tools, String> {
        for p in [WRITE_BW, SEND_LAT] {
            if !Path::new("/usr/bin").join(p).is_file() {
                return Err(format!("/usr/bin/{p} missing (apt-get install perftest)"));
            }
        }
        let t = Tools {
            xwarp,
            preload,
            rdma_lib,
            mtu,
            prefix,
            engine_env: Vec::new(),
        };
        // The launcher's own lookup, as `xwarp run` will do it.
        let exe_dir = t.xwarp.parent().unwrap_or(Path::new(".")).to_path_buf();
        let args = t.run_args(&End::dummy_if(), WRITE_BW, &[]);
        let plan =
            crate::launcher::plan(&args, |k| std::env::var_os(k), &exe_dir, |p| p.is_file())?;
        let ld = plan
            .env
            .iter()
            .find(|(k, _)| k == "LD_PRELOAD")
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !ld.contains("libxwarp_ibverbs.so") && t.rdma_lib.is_none() {
            return Err("libxwarp_ibverbs.so not found (cargo build --release -p xwarp-ibverbs, or --rdma-lib)".into());
        }
        Ok(t)
    }

    /// The arguments of `xwarp run` for `prog args` at `end`.
    fn run_args(&self, end: &EndIf, prog: &str, args: &[String]) -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = vec![
            "--iface".into(),
            end.ifname.clone().into(),
            "--addr".into(),
            format!("{}/{}", end.ip, self.prefix).into(),
        ];
        if let Some(p) = &self.preload {
            v.push("--preload".into());
            v.push(p.into());
        }
        if let Some(p) = &self.rdma_lib {
            v.push("--rdma-lib".into());
            v.push(p.into());
        }
        v.push("--".into());
        v.push(prog.into());
        v.extend(args.iter().map(Into::into));
        v
    }

    /// `stdbuf -oL xwarp run ... -- prog args` in `end`'s namespace, pinned to its core.
    fn command(&self, end: &End, prog: &str, args: &[String]) -> io::Result<Command> {
        let mut c = end.ns.command("stdbuf")?;
        c.arg("-oL").arg(&self.xwarp).arg("run");
        c.args(self.run_args(&end.names(), prog, args));
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            // The run's own settings only (a variable of the caller's would be kept by
            // `xwarp run`: an interface, an address, another LD_PRELOAD).
            if k == "LD_PRELOAD"
                || matches!(
                    &*k,
                    "XWARP_IFACE" | "XWARP_ADDR" | "XWARP_MTU" | "XWARP_PCAP"
                )
            {
                c.env_remove(&*k);
            }
        }
        for (k, _) in &self.engine_env {
            c.env_remove(k);
        }
        c.envs(self.engine_env.iter().map(|(k, v)| (k, v)));
        c.env("XWARP_MTU", self.mtu.to_string())
            .env("XWARP_CONNECT_RETRY_MS", "5000")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(core) = end.core {
            // SAFETY: the hook only calls sched_setaffinity(2) (async-signal-safe) on a
            // cpu_set_t on its own stack.
            unsafe {
                c.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(core, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) < 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        Ok(c)
    }
}

/// The library's variables for the engine idle policy `spin` (`None`: it has no such
/// setting, e.g. an iteration budget, and keeps its default).
pub(super) fn engine_env(
    spin: xwarp::poll_driver::engine::SpinBudget,
) -> Option<Vec<(&'static str, String)>> {
    use xwarp::poll_driver::engine::SpinBudget;
    match spin {
        SpinBudget::Yield(d) => Some(vec![
            ("XWARP_ENGINE_SPIN_US", d.as_micros().to_string()),
            ("XWARP_YIELD", "1".into()),
        ]),
        SpinBudget::Duration(d) => Some(vec![
            ("XWARP_ENGINE_SPIN_US", d.as_micros().to_string()),
            ("XWARP_YIELD", "0".into()),
        ]),
        _ => None,
    }
}

/// The names of an [`End`] (what `xwarp run` is given).
struct EndIf {
    ifname: String,
    ip: Ipv4Addr,
}

impl End<'_> {
    fn names(&self) -> EndIf {
        EndIf {
            ifname: self.ifname.to_string(),
            ip: self.ip,
        }
    }

    fn dummy_if() -> EndIf {
        EndIf {
            ifname: "lo".into(),
            ip: Ipv4Addr::new(10, 0, 0, 1),
        }
    }
}

/// A perftest process in its own process group: its output collected as it comes,
/// killed (group and all) and reaped when dropped.
struct Proc {
    child: Option<Child>,
    out: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    deadline: Instant,
}

impl Proc {
    fn spawn(mut c: Command, limit: Duration) -> io::Result<Proc> {
        let mut child = c.spawn()?;
        let out = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        let pipes: [Option<Box<dyn Read + Send>>; 2] = [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ];
        for p in pipes.into_iter().flatten() {
            let out = out.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(p).lines() {
                    let Ok(line) = line else { break };
                    let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                    o.push_str(&line);
                    o.push('\n');
                }
            }));
        }
        Ok(Proc {
            child: Some(child),
            out,
            readers,
            deadline: Instant::now() + limit,
        })
    }

    fn output(&self) -> String {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `Some(success)` once it exited.
    fn exited(&mut self) -> io::Result<Option<bool>> {
        match self.child.as_mut() {
            Some(c) => Ok(c.try_wait()?.map(|s| s.success())),
            None => Ok(Some(false)),
        }
    }

    /// Wait until it exits or its deadline passes (then it is killed): whether it
    /// succeeded, and everything it wrote.
    fn wait(mut self) -> io::Result<(bool, String)> {
        let ok = loop {
            if let Some(ok) = self.exited()? {
                break ok;
            }
            if Instant::now() >= self.deadline {
                self.kill();
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.kill();
        Ok((ok, self.output()))
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = libc::pid_t::try_from(c.id()) {
                // SAFETY: kill(2) on our child's own process group only sends a signal.
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                }
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Wait until the engine of `srv` (owning `ip`) answers ARP: probed from the kernel of
/// `peer_ns` (the other end of the veth, where the client's engine has not started yet)
/// with an empty UDP datagram to the discard port, and the neighbour entry read back.
/// False when `srv` exited or [`LISTEN_WAIT`] passed. (The server's output cannot tell:
/// perftest prints its "waiting for the rdma_cm QP" line only after the connection.)
fn wait_engine(srv: &mut Proc, peer_ns: &NetNs, ip: Ipv4Addr) -> io::Result<bool> {
    let t0 = Instant::now();
    while t0.elapsed() < LISTEN_WAIT {
        if srv.exited()?.is_some() {
            return Ok(false);
        }
        peer_ns.run(move || {
            if let Ok(u) = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
                let _ = u.send_to(&[], (ip, 9));
            }
        })?;
        std::thread::sleep(Duration::from_millis(50));
        let neigh = peer_ns.ip(&["neigh", "show", &ip.to_string()])?;
        if neigh.contains("lladdr") {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(false)
}

/// Run `prog` as server at `server` and client at `client` (to the server's address) with
/// `args` (port included), the row taking about `len`: the client's output and the
/// server's. The client is retried while it fails before connecting (no result line,
/// `has_result`, and no remote QP printed) and the server still runs.
fn pair(
    t: &Tools,
    server: &End,
    client: &End,
    prog: &str,
    args: &[String],
    len: Duration,
    has_result: fn(&str) -> bool,
) -> io::Result<(String, String)> {
    let limit = len + SLACK;
    let mut srv = Proc::spawn(t.command(server, prog, args)?, limit + LISTEN_WAIT)?;
    if !wait_engine(&mut srv, client.ns, server.ip)? {
        let (_, out) = srv.wait()?;
        return Err(io::Error::other(format!(
            "{prog} server's engine never answered ARP for {}:\n{}",
            server.ip,
            out.trim()
        )));
    }
    // It binds and listens right after its engine starts; a client that comes too early
    // is refused and tried again below.
    std::thread::sleep(Duration::from_millis(200));
    let mut cargs = args.to_vec();
    cargs.push(server.ip.to_string());
    let mut tries = 0;
    loop {
        tries += 1;
        let cli = Proc::spawn(t.command(client, prog, &cargs)?, limit)?;
        let (ok, out) = cli.wait()?;
        if ok && has_result(&out) {
            let (_, sout) = srv.wait()?;
            return Ok((out, sout));
        }
        let server_runs = srv.exited()?.is_none();
        // Connected (perftest printed the peer's QP) and failed after: not a refusal.
        let connected = out.contains("remote address:");
        if has_result(&out) || connected || !server_runs || tries >= CLIENT_TRIES {
            let sout = if server_runs {
                srv.output()
            } else {
                srv.wait()?.1
            };
            return Err(io::Error::other(format!(
                "{prog} client failed (attempt {tries}):\n{}\n{prog} server:\n{}",
                out.trim(),
                sout.trim()
            )));
        }
        eprintln!(
            "xwarp bench rdma: {prog} client failed before connecting (attempt {tries}), retrying"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `ib_write_bw -R` at `size` bytes for about `dur` on `port`: the client's result.
pub(super) fn write_bw(
    t: &Tools,
    net: &(End, End),
    port: u16,
    size: usize,
    depth: usize,
    signal_every: u64,
    dur: Duration,
) -> io::Result<BwLine> {
    let secs = dur.as_secs_f64().ceil().max(1.0) as u64;
    let args: Vec<String> = [
        "-R",
        "-F",
        "--report_gbits",
        "-s",
        &size.to_string(),
        "-D",
        &secs.to_string(),
        "-t",
        &depth.to_string(),
        "-Q",
        &signal_every.to_string(),
        "-p",
        &port.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (server, client) = (&net.1, &net.0);
    let (out, _) = pair(
        t,
        server,
        client,
        WRITE_BW,
        &args,
        Duration::from_secs(secs),
        |o| parse_bw(o).is_some(),
    )?;
    let r = parse_bw(&out)
        .ok_or_else(|| io::Error::other(format!("{WRITE_BW}: no result line:\n{out}")))?;
    if r.bytes != size as u64 || r.avg_gbps <= 0.0 {
        return Err(io::Error::other(format!(
            "{WRITE_BW}: unexpected result {r:?}:\n{out}"
        )));
    }
    Ok(r)
}

/// `ib_send_lat -R` at `size` bytes, `iters` round trips, on `port`: the client's result.
pub(super) fn send_lat(
    t: &Tools,
    net: &(End, End),
    port: u16,
    size: usize,
    iters: u64,
) -> io::Result<LatLine> {
    let args: Vec<String> = [
        "-R",
        "-F",
        "-s",
        &size.to_string(),
        "-n",
        &iters.to_string(),
        "-p",
        &port.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (server, client) = (&net.1, &net.0);
    // At most 10 ms per round trip before the row counts as hung.
    let len = Duration::from_millis(10) * iters as u32;
    let (out, _) = pair(t, server, client, SEND_LAT, &args, len, |o| {
        parse_lat(o).is_some()
    })?;
    let r = parse_lat(&out)
        .ok_or_else(|| io::Error::other(format!("{SEND_LAT}: no result line:\n{out}")))?;
    if r.bytes != size as u64 || r.typical_us <= 0.0 || r.iterations != iters {
        return Err(io::Error::other(format!(
            "{SEND_LAT}: unexpected result {r:?}:\n{out}"
        )));
    }
    Ok(r)
}

/// The two ends on `net` (client in A at `.30`, server in B at `.40`).
pub(super) fn ends<'a>(net: &'a VethPair, n: u8, cores: [Option<usize>; 2]) -> (End<'a>, End<'a>) {
    (
        End {
            ns: &net.a,
            ifname: &net.if_a,
            ip: Ipv4Addr::new(10, 88, n, 30),
            core: cores[0],
        },
        End {
            ns: &net.b,
            ifname: &net.if_b,
            ip: Ipv4Addr::new(10, 88, n, 40),
            core: cores[1],
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const BW: &str = "\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      2155             0.00               0.56   \t\t   0.001074
---------------------------------------------------------------------------------------
";
    const LAT: &str = "\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      2000          32.22          11412.40      132.81   \t       321.56      \t571.04 \t\t2210.69 \t\t9179.08
---------------------------------------------------------------------------------------
";

    #[test]
    fn parses_perftest_bandwidth_in_both_units() {
        let b = parse_bw(BW).unwrap();
        assert_eq!((b.bytes, b.iterations, b.avg_gbps), (65536, 2155, 0.56));
        let mb = BW.replace("Gb/sec", "MB/sec").replace("0.56 ", "1000.00 ");
        let b = parse_bw(&mb).unwrap();
        assert!((b.avg_gbps - 8.388608).abs() < 1e-9, "{b:?}");
        assert!(parse_bw("no result").is_none());
        assert!(parse_bw(&BW.replace("0.56", "x")).is_none());
        // A header without its line (the program died).
        assert!(parse_bw(BW.lines().take(2).collect::<Vec<_>>().join("\n").as_str()).is_none());
        assert!(parse_bw(&BW.replace("BW average[Gb/sec]", "BW average[kb/sec]")).is_none());
    }

    #[test]
    fn engine_policy_becomes_the_library_variables() {
        use xwarp::poll_driver::engine::SpinBudget;
        let v = engine_env(SpinBudget::Yield(Duration::from_millis(2))).unwrap();
        assert_eq!(
            v,
            vec![
                ("XWARP_ENGINE_SPIN_US", "2000".into()),
                ("XWARP_YIELD", "1".into())
            ]
        );
        let v = engine_env(SpinBudget::Duration(Duration::from_micros(50))).unwrap();
        assert_eq!(
            v,
            vec![
                ("XWARP_ENGINE_SPIN_US", "50".into()),
                ("XWARP_YIELD", "0".into())
            ]
        );
        assert!(engine_env(SpinBudget::Forever).is_none());
    }

    #[test]
    fn parses_perftest_latency() {
        let l = parse_lat(LAT).unwrap();
        assert_eq!((l.bytes, l.iterations), (64, 2000));
        assert_eq!(
            (l.min_us, l.typical_us, l.avg_us, l.p99_us),
            (32.22, 132.81, 321.56, 2210.69)
        );
        assert!(parse_lat(BW).is_none());
        assert!(parse_lat(&LAT.replace("2210.69", "")).is_none());
        assert!(parse_lat("").is_none());
    }
}
