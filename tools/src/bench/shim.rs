//! `xwarp bench shim`: unmodified servers on the LD_PRELOAD shim against the same servers
//! on the kernel, over one veth pair.
//!
//! Setup (root): namespaces A and B joined by a veth pair; the kernel owns `10.88.<net>.1`
//! (A) and `.2` (B); the shim's engine owns `10.88.<net>.10` on `veth-a` (AF_XDP), an
//! address A's kernel does not have. Servers run in A, clients in B on B's kernel:
//!
//! * redis-server (kernel on `.1`, then under the shim on `.10`) against redis-benchmark
//!   SET/GET with `-c 50 -n N` (throughput) and `-c 1` (latency: requests per second of
//!   one client are the inverse of its round trip; p50 as redis-benchmark reports it);
//! * `memcached -t 1` (kernel, then shim) against `memcaslap -c 16 -t T` (16 connections,
//!   90% get / 10% set; operations per second);
//! * `sockperf server --tcp` (kernel, then shim) against `sockperf ping-pong --tcp -t T
//!   --msg-size 64` (sockperf reports half round trips).
//!
//! Missing tools are installed with apt (idempotent). One server at a time: the shim's
//! engine binds the interface's AF_XDP queue, so the shimmed servers run one after the
//! other. Prints a table with shim/kernel ratios and, with `--json`, writes the results
//! ([`super::shim_out`]).

use std::ffi::OsString;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use super::plot::write_outputs;
use super::report::Report;
pub use super::shim_out::{MemcachedResult, PingResult, RedisResult, StackResults};
use xwarp::poll_driver::netns::{self, VethPair};

/// Options of `xwarp bench shim`.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Third octet of the veth /24.
    pub net: u8,
    /// redis-benchmark `-n` with 50 clients.
    pub requests: u32,
    /// redis-benchmark `-n` with one client.
    pub latency_requests: u32,
    /// sockperf ping-pong and memcaslap duration.
    pub duration: Duration,
    /// The shim library.
    pub preload: Option<PathBuf>,
    /// Where to write JSON results.
    pub json: Option<PathBuf>,
    /// Run redis-benchmark.
    pub redis: bool,
    /// Run memcaslap against memcached.
    pub memcached: bool,
    /// Run sockperf ping-pong.
    pub sockperf: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            net: 92,
            requests: 100_000,
            latency_requests: 20_000,
            duration: Duration::from_secs(5),
            preload: None,
            json: None,
            redis: true,
            memcached: true,
            sockperf: true,
        }
    }
}

/// The command line of `xwarp bench shim` as clap sees it; every value is checked by
/// [`check`].
#[derive(clap::Parser, Debug)]
#[command(
    name = "xwarp bench shim",
    version,
    after_help = "The servers inherit the environment, so XWARP_SPIN_US, XWARP_ENGINE_SPIN_US and \
                  XWARP_YIELD reach the shimmed ones. With XWARP_LOG set, each server's stderr \
                  is printed.",
    about = "redis-server, memcached and sockperf server under the LD_PRELOAD shim vs the kernel (root: creates namespaces and a veth pair; installs redis-server, redis-tools, memcached, libmemcached-tools and sockperf with apt if missing)"
)]
struct Cli {
    /// Veth /24 to use: 10.88.N.0/24 (default 92).
    #[arg(long = "net", value_name = "N")]
    net: Option<String>,
    /// redis-benchmark requests per test with -c 50 (default 100000).
    #[arg(long = "requests", value_name = "N")]
    requests: Option<String>,
    /// redis-benchmark requests per test with -c 1 (default 20000).
    #[arg(long = "latency-requests", value_name = "N")]
    latency_requests: Option<String>,
    /// sockperf ping-pong and memcaslap seconds (default 5).
    #[arg(long = "duration", value_name = "SECS")]
    duration: Option<String>,
    /// The shim library (default: $XWARP_PRELOAD, else libxwarp_preload.so next to xwarp
    /// or one directory up).
    #[arg(long = "preload", value_name = "PATH")]
    preload: Option<String>,
    /// Also write the results as JSON (schema xwarp-bench/1, see tools/README.md; `-`:
    /// stdout).
    #[arg(long = "json", value_name = "FILE")]
    json: Option<String>,
    /// Run only `redis`, only `memcached` or only `sockperf` (both stacks); default: all.
    #[arg(long = "only", value_name = "TEST")]
    only: Option<String>,
}

impl Cli {
    /// The options given, as (flag, value) pairs.
    fn given(self) -> Vec<(&'static str, String)> {
        [
            ("--net", self.net),
            ("--requests", self.requests),
            ("--latency-requests", self.latency_requests),
            ("--duration", self.duration),
            ("--preload", self.preload),
            ("--json", self.json),
            ("--only", self.only),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }
}

/// clap's view of the command line (without `xwarp bench shim`; help and version requests are
/// errors of their kind).
fn parse_cli(args: &[OsString]) -> Result<Cli, clap::Error> {
    let argv = std::iter::once(OsString::from("xwarp bench shim")).chain(args.iter().cloned());
    <Cli as clap::Parser>::try_parse_from(argv)
}

/// Parse `args` (after `xwarp bench shim`).
pub fn parse_args(args: &[OsString]) -> Result<Options, String> {
    use clap::error::ErrorKind;
    match parse_cli(args) {
        Ok(c) => check(c),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            Err(String::new())
        }
        Err(e) => Err(crate::cli::clap_message(&e)),
    }
}

/// Check every given value and build the options.
fn check(c: Cli) -> Result<Options, String> {
    let mut o = Options::default();
    for (a, v) in c.given() {
        let v = v.as_str();
        let int = |max: u64| -> Result<u64, String> {
            match v.parse::<u64>() {
                Ok(n) if n >= 1 && n <= max => Ok(n),
                _ => Err(format!("{a}: expected an integer in 1..={max}, got {v:?}")),
            }
        };
        match a {
            "--net" => o.net = int(254)? as u8,
            "--requests" => o.requests = int(100_000_000)? as u32,
            "--latency-requests" => o.latency_requests = int(100_000_000)? as u32,
            "--duration" => o.duration = Duration::from_secs(int(3600)?),
            "--preload" => o.preload = Some(v.into()),
            "--json" => o.json = Some(v.into()),
            "--only" => {
                (o.redis, o.memcached, o.sockperf) = match v {
                    "redis" => (true, false, false),
                    "memcached" => (false, true, false),
                    "sockperf" => (false, false, true),
                    _ => {
                        return Err(format!(
                            "--only: expected redis, memcached or sockperf, got {v:?}"
                        ))
                    }
                }
            }
            _ => return Err(format!("unknown option {a}")),
        }
    }
    Ok(o)
}

/// Fill `rep` (made when the run started) with the options and both stacks' results
/// (the rows: [`super::shim_out::fill`]).
pub fn fill(rep: &mut Report, o: &Options, kernel: &StackResults, shim: &StackResults) {
    rep.config("net", o.net);
    rep.config("requests", o.requests);
    rep.config("latency_requests", o.latency_requests);
    rep.config("duration_s", o.duration.as_secs());
    rep.config("msg_size", 64);
    rep.config("redis", o.redis);
    rep.config("memcached", o.memcached);
    rep.config("sockperf", o.sockperf);
    super::shim_out::fill(rep, (o.requests, o.latency_requests), kernel, shim);
}

/// Entry point of `xwarp bench shim ARGS...`.
pub fn main(args: Vec<OsString>) -> ExitCode {
    // --help / --version: on stdout, status 0; a bad command line: status 2 with the usage.
    let cli = parse_cli(&args).unwrap_or_else(|e| e.exit());
    let o = match check(cli) {
        Ok(o) => o,
        Err(e) => {
            let usage = <Cli as clap::CommandFactory>::command().render_usage();
            eprintln!("xwarp bench shim: {e}\n\n{usage}\n\nFor more information, try '--help'.");
            return ExitCode::from(2);
        }
    }; // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("xwarp bench shim: needs root (network namespaces, veth, AF_XDP)");
        return ExitCode::from(1);
    }
    let (t0, mut rep) = (Instant::now(), Report::new("shim"));
    match run(&o) {
        Ok((kernel, shim)) => {
            fill(&mut rep, &o, &kernel, &shim);
            rep.finish(t0);
            print!("{}", super::shim_out::table(o.net, &rep));
            if let Err(e) = write_outputs(&rep, o.json.as_deref(), None) {
                eprintln!("xwarp bench shim: {e}");
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xwarp bench shim: {e}");
            ExitCode::from(1)
        }
    }
}

fn have(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Install `pkg` with apt unless `bin` is already there.
fn ensure_tool(bin: &str, pkg: &str) -> io::Result<()> {
    if have(bin) {
        return Ok(());
    }
    eprintln!("xwarp bench shim: installing {pkg} for {bin}");
    let script = format!(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {pkg} \
         || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {pkg})"
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .status()?;
    if have(bin) {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{bin} missing and `apt-get install {pkg}` failed"
        )))
    }
}

fn find_preload(o: &Options) -> io::Result<PathBuf> {
    if let Some(p) = o
        .preload
        .clone()
        .or_else(|| std::env::var_os("XWARP_PRELOAD").map(PathBuf::from))
    {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(io::Error::other(format!("{}: no such file", p.display())))
        };
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let name = "libxwarp_preload.so";
    let mut cands = vec![dir.join(name)];
    if let Some(up) = dir.parent() {
        cands.push(up.join(name));
    }
    cands.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        io::Error::other(format!(
            "{name} not found next to {} (cargo build --release -p xwarp-preload, or --preload)",
            dir.display()
        ))
    })
}

/// A server process in its own process group, killed (group and all) when dropped.
struct Server(Option<Child>, &'static str);

impl Server {
    fn spawn(mut c: Command, name: &'static str) -> io::Result<Server> {
        c.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Ok(Server(Some(c.spawn()?), name))
    }

    /// Stop it and wait until it is gone (the engine's AF_XDP socket with it).
    fn stop(mut self) -> io::Result<()> {
        self.kill()
    }

    fn kill(&mut self) -> io::Result<()> {
        if let Some(mut c) = self.0.take() {
            let _ = Command::new("kill")
                .args(["-9", "--", &format!("-{}", c.id())])
                .stderr(Stdio::null())
                .status();
            let _ = c.kill();
            let status = c.wait()?;
            if let Some(mut err) = c.stderr.take() {
                let mut s = String::new();
                let _ = io::Read::read_to_string(&mut err, &mut s);
                if s.contains("warning")
                    || s.contains("error")
                    || std::env::var_os("XWARP_LOG").is_some()
                {
                    eprintln!(
                        "xwarp bench shim: {} stderr ({status}):\n{}",
                        self.1,
                        s.trim()
                    );
                }
            }
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

struct Net {
    pair: VethPair,
    engine: Ipv4Addr,
    preload: PathBuf,
}

impl Net {
    /// `prog args...` in namespace A, under the shim if `shim`.
    fn server(&self, shim: bool, prog: &str, args: &[&str]) -> io::Result<Command> {
        let mut c = self.pair.a.command("timeout")?;
        c.arg("600").arg(prog).args(args);
        if shim {
            c.env("LD_PRELOAD", &self.preload)
                .env("XWARP_IFACE", &self.pair.if_a)
                .env(
                    "XWARP_ADDR",
                    format!("{}/{}", self.engine, self.pair.prefix),
                )
                .env("XWARP_STRICT", "1");
        }
        Ok(c)
    }

    /// `prog args...` in namespace B on the kernel, waited for.
    fn client(&self, limit: Duration, prog: &str, args: &[&str]) -> io::Result<Output> {
        let mut c = self.pair.b.command("timeout")?;
        c.arg(limit.as_secs().max(1).to_string())
            .arg(prog)
            .args(args)
            .stdin(Stdio::null());
        let out = c.output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{prog} {}: {}\n{}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(out)
    }

    /// Wait until `ip:port` accepts connections from namespace B.
    fn wait_port(&self, ip: Ipv4Addr, port: u16) -> io::Result<()> {
        let addr = SocketAddr::from((ip, port));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = self.pair.b.run(move || {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
            })?;
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "{addr} never accepted a connection"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Set up the network and run everything: (kernel, shim) results.
pub fn run(o: &Options) -> io::Result<(StackResults, StackResults)> {
    ensure_tool("redis-server", "redis-server")?;
    ensure_tool("redis-benchmark", "redis-tools")?;
    ensure_tool("sockperf", "sockperf")?;
    if o.memcached {
        ensure_tool("memcached", "memcached")?;
        ensure_tool("memcaslap", "libmemcached-tools")?;
    }
    let preload = find_preload(o)?;
    let pair = VethPair::new(o.net)?;
    // The engine verifies L4 checksums; a veth hands over partial ones (docs/afxdp.md §7.3).
    let if_b = pair.if_b.clone();
    pair.b
        .run(move || netns::set_tx_checksum_offload(&if_b, false))??;
    let net = Net {
        engine: Ipv4Addr::new(10, 88, o.net, 10),
        pair,
        preload,
    };
    let mut kernel = StackResults::default();
    let mut shim = StackResults::default();
    for (is_shim, res) in [(false, &mut kernel), (true, &mut shim)] {
        let ip = if is_shim { net.engine } else { net.pair.addr_a };
        let label = if is_shim { "shim" } else { "kernel" };
        if o.redis {
            eprintln!("xwarp bench shim: redis on {label} ({ip})");
            res.redis = bench_redis(&net, o, is_shim, ip)?;
        }
        if o.memcached {
            eprintln!("xwarp bench shim: memcached on {label} ({ip})");
            res.memcached = Some(bench_memcached(&net, o, is_shim, ip)?);
        }
        if o.sockperf {
            eprintln!("xwarp bench shim: sockperf on {label} ({ip})");
            res.ping = Some(bench_sockperf(&net, o, is_shim, ip)?);
        }
    }
    Ok((kernel, shim))
}

fn bench_redis(net: &Net, o: &Options, shim: bool, ip: Ipv4Addr) -> io::Result<Vec<RedisResult>> {
    let port = 6379u16;
    let port_s = port.to_string();
    let server = Server::spawn(
        net.server(
            shim,
            "redis-server",
            &[
                "--bind",
                "0.0.0.0",
                "--port",
                &port_s,
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        )?,
        "redis-server",
    )?;
    net.wait_port(ip, port)?;
    let host = ip.to_string();
    let mut out = Vec::new();
    for (clients, n) in [(50u32, o.requests), (1, o.latency_requests)] {
        let r = net.client(
            Duration::from_secs(600),
            "redis-benchmark",
            &[
                "-h",
                &host,
                "-p",
                &port_s,
                "-t",
                "set,get",
                "-c",
                &clients.to_string(),
                "-n",
                &n.to_string(),
                "-q",
            ],
        )?;
        let parsed = parse_redis(&String::from_utf8_lossy(&r.stdout), clients);
        if !parsed.iter().any(|r| r.test == "SET") || !parsed.iter().any(|r| r.test == "GET") {
            return Err(io::Error::other(format!(
                "redis-benchmark output without SET/GET results:\n{}",
                String::from_utf8_lossy(&r.stdout)
            )));
        }
        out.extend(parsed);
    }
    server.stop()?;
    Ok(out)
}

/// memcaslap's connections (the measurement: 16 connections).
const MEMCASLAP_CONNECTIONS: u32 = 16;

fn bench_memcached(
    net: &Net,
    o: &Options,
    shim: bool,
    ip: Ipv4Addr,
) -> io::Result<MemcachedResult> {
    let port = 11211u16;
    let port_s = port.to_string();
    let server = Server::spawn(
        net.server(
            shim,
            "memcached",
            &["-u", "root", "-l", "0.0.0.0", "-p", &port_s, "-t", "1"],
        )?,
        "memcached",
    )?;
    net.wait_port(ip, port)?;
    let r = net.client(
        o.duration + Duration::from_secs(60),
        "memcaslap",
        &[
            "-s",
            &format!("{ip}:{port}"),
            "-T",
            "2",
            "-c",
            &MEMCASLAP_CONNECTIONS.to_string(),
            "-t",
            &format!("{}s", o.duration.as_secs()),
        ],
    )?;
    server.stop()?;
    let text =
        String::from_utf8_lossy(&r.stdout).into_owned() + &String::from_utf8_lossy(&r.stderr);
    parse_memcaslap(&text, MEMCASLAP_CONNECTIONS)
        .ok_or_else(|| io::Error::other(format!("memcaslap output without a result line:\n{text}")))
}

/// Parse memcaslap's last `Run time: 10.0s Ops: 460000 TPS: 46000 Net_rate: 51.2M/s` line.
pub fn parse_memcaslap(text: &str, connections: u32) -> Option<MemcachedResult> {
    let l = text.lines().rev().find(|l| l.contains("TPS:"))?;
    let after =
        |key: &str| -> Option<f64> { l.split_once(key)?.1.split_whitespace().next()?.parse().ok() };
    Some(MemcachedResult {
        connections,
        tps: after("TPS:")?,
        ops: after("Ops:")? as u64,
    })
}

fn bench_sockperf(net: &Net, o: &Options, shim: bool, ip: Ipv4Addr) -> io::Result<PingResult> {
    let port = 11111u16;
    let host = ip.to_string();
    let port_s = port.to_string();
    let server = Server::spawn(
        net.server(
            shim,
            "sockperf",
            &["server", "--tcp", "-i", &host, "-p", &port_s],
        )?,
        "sockperf server",
    )?;
    net.wait_port(ip, port)?;
    let secs = o.duration.as_secs().to_string();
    let r = net.client(
        o.duration + Duration::from_secs(60),
        "sockperf",
        &[
            "ping-pong",
            "--tcp",
            "-i",
            &host,
            "-p",
            &port_s,
            "-t",
            &secs,
            "--msg-size",
            "64",
        ],
    )?;
    server.stop()?;
    let text =
        String::from_utf8_lossy(&r.stdout).into_owned() + &String::from_utf8_lossy(&r.stderr);
    parse_sockperf(&text).ok_or_else(|| {
        io::Error::other(format!("sockperf output without latency results:\n{text}"))
    })
}

/// Parse `redis-benchmark -q` lines such as `SET: 84033.61 requests per second, p50=0.303
/// msec` (carriage-return progress lines included).
pub fn parse_redis(text: &str, clients: u32) -> Vec<RedisResult> {
    text.replace('\r', "\n")
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(": ")?;
            let (n, tail) = rest.split_once(" requests per second")?;
            let rps: f64 = n.trim().parse().ok()?;
            let p50_ms = tail
                .split_once("p50=")
                .and_then(|(_, v)| v.split_whitespace().next())
                .and_then(|v| v.parse().ok());
            Some(RedisResult {
                test: name.to_string(),
                clients,
                rps,
                p50_ms,
            })
        })
        .collect()
}

/// Parse sockperf's summary (`Summary: Latency is X usec`, `percentile 50.000 = X`,
/// `percentile 99.000 = X`, `[Valid Duration] ... ReceivedMessages=N`).
pub fn parse_sockperf(text: &str) -> Option<PingResult> {
    let after = |key: &str| -> Option<f64> {
        let l = text.lines().find(|l| l.contains(key))?;
        let (_, v) = l.split_once(key)?;
        v.trim()
            .trim_start_matches('=')
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let observations = text
        .lines()
        .find(|l| l.contains("[Valid Duration]"))
        .and_then(|l| l.split_once("ReceivedMessages="))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    Some(PingResult {
        avg_us: after("Latency is")?,
        p50_us: after("percentile 50.000")?,
        p99_us: after("percentile 99.000")?,
        observations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_options_and_rejects_bad_ones() {
        let o = parse_args(&args(&[
            "--net",
            "93",
            "--requests",
            "5000",
            "--duration",
            "2",
        ]))
        .unwrap();
        assert_eq!(o.net, 93);
        assert_eq!(o.requests, 5000);
        assert_eq!(o.duration, Duration::from_secs(2));
        assert!(o.redis && o.memcached && o.sockperf);
        let o = parse_args(&args(&["--only", "sockperf"])).unwrap();
        assert!(!o.redis && !o.memcached && o.sockperf);
        let o = parse_args(&args(&["--only", "redis"])).unwrap();
        assert!(o.redis && !o.memcached && !o.sockperf);
        let o = parse_args(&args(&["--only", "memcached"])).unwrap();
        assert!(!o.redis && o.memcached && !o.sockperf);
        assert!(parse_args(&args(&["--only", "iperf"])).is_err());
        assert!(parse_args(&args(&["--net", "0"])).is_err());
        assert!(parse_args(&args(&["--requests"])).is_err());
        assert!(parse_args(&args(&["--bogus", "1"])).is_err());
        assert_eq!(parse_args(&args(&["--help"])), Err(String::new()));
    }

    #[test]
    fn parses_redis_benchmark_and_sockperf_output() {
        let r = parse_redis(
            "SET: rps=0.0 (overall: nan) avg_msec=nan\rSET: 84033.61 requests per second, p50=0.303 msec\nGET: 90000.00 requests per second, p50=0.271 msec\n",
            50,
        );
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].test, "SET");
        assert!((r[0].rps - 84033.61).abs() < 1e-6);
        assert_eq!(r[0].p50_ms, Some(0.303));
        assert_eq!(r[1].clients, 50);
        let p = parse_sockperf(
            "sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=95427; ReceivedMessages=95427\n\
             sockperf: Summary: Latency is 8.107 usec\n\
             sockperf: ---> percentile 99.000 =   22.633\n\
             sockperf: ---> percentile 50.000 =    7.090\n",
        )
        .unwrap();
        assert_eq!(p.observations, 95427);
        assert!((p.avg_us - 8.107).abs() < 1e-9);
        assert!((p.p50_us - 7.090).abs() < 1e-9);
        assert!((p.p99_us - 22.633).abs() < 1e-9);
        assert_eq!(parse_sockperf("nothing"), None);
        let m = parse_memcaslap(
            "cmd_get: 127379\nverify_failed: 0\n\nRun time: 2.0s Ops: 141539 TPS: 70738 Net_rate: 79.1M/s\n",
            16,
        )
        .unwrap();
        assert_eq!((m.connections, m.ops), (16, 141539));
        assert!((m.tps - 70738.0).abs() < 1e-9);
        assert_eq!(parse_memcaslap("nothing", 16), None);
    }

    #[test]
    fn table_and_json_carry_ratios() {
        let o = Options::default();
        let mk = |rps: f64, p50: f64| StackResults {
            redis: vec![
                RedisResult {
                    test: "SET".into(),
                    clients: 50,
                    rps,
                    p50_ms: None,
                },
                RedisResult {
                    test: "GET".into(),
                    clients: 1,
                    rps: rps / 10.0,
                    p50_ms: Some(p50),
                },
            ],
            memcached: Some(MemcachedResult {
                connections: 16,
                tps: rps * 2.0,
                ops: 9,
            }),
            ping: Some(PingResult {
                avg_us: p50,
                p50_us: p50,
                p99_us: p50 * 2.0,
                observations: 7,
            }),
        };
        let (k, x) = (mk(1000.0, 10.0), mk(500.0, 5.0));
        let mut rep = Report::new("shim");
        fill(&mut rep, &o, &k, &x);
        rep.fill_ratios();
        let t = super::super::shim_out::table(o.net, &rep);
        assert!(t.contains("0.50x"), "{t}");
        assert!(t.contains("memcaslap -c 16"), "{t}");
        let ratio = |test: &str, metric: &str| {
            rep.find(test, "shim", metric)
                .and_then(|r| r.ratio_to_kernel)
        };
        assert_eq!(ratio("redis SET -c 50 -n 100000", "rate"), Some(0.5));
        assert_eq!(ratio("redis GET -c 1 -n 20000", "latency_p50"), Some(0.5));
        assert_eq!(ratio("memcaslap -c 16", "rate"), Some(0.5));
        assert_eq!(ratio("sockperf ping-pong 64 B", "latency_p99"), Some(0.5));
        assert_eq!(Report::from_json(&rep.to_json()).unwrap(), rep);
    }
}
