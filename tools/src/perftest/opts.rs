//! The tools' command line: which test ([`Test`]) and its options ([`Opts`], [`parse`]).

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{clap_message, EngineArgs};

/// Which test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA Write bandwidth.
    WriteBw,
    /// RDMA Write latency (ping-pong, polling memory).
    WriteLat,
    /// RDMA Read bandwidth.
    ReadBw,
    /// RDMA Read latency.
    ReadLat,
    /// Send bandwidth (with credits).
    SendBw,
    /// Send latency (ping-pong).
    SendLat,
}

impl Test {
    pub(super) const ALL: [Test; 6] = [
        Test::WriteBw,
        Test::WriteLat,
        Test::ReadBw,
        Test::ReadLat,
        Test::SendBw,
        Test::SendLat,
    ];

    pub(super) fn title(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::SendBw => "Send BW Test",
            Test::SendLat => "Send Latency Test",
        }
    }

    /// The tool's name (`write_bw`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::WriteLat => "write_lat",
            Test::ReadBw => "read_bw",
            Test::ReadLat => "read_lat",
            Test::SendBw => "send_bw",
            Test::SendLat => "send_lat",
        }
    }

    /// The binary's name (`xwarp-write-bw`, ...).
    pub fn bin_name(self) -> &'static str {
        match self {
            Test::WriteBw => "xwarp-write-bw",
            Test::WriteLat => "xwarp-write-lat",
            Test::ReadBw => "xwarp-read-bw",
            Test::ReadLat => "xwarp-read-lat",
            Test::SendBw => "xwarp-send-bw",
            Test::SendLat => "xwarp-send-lat",
        }
    }

    pub(super) fn code(self) -> u8 {
        Test::ALL.iter().position(|t| *t == self).unwrap_or(0) as u8 + 1
    }

    pub(super) fn from_code(c: u8) -> Option<Test> {
        Test::ALL.get(usize::from(c).checked_sub(1)?).copied()
    }

    pub(super) fn is_bw(self) -> bool {
        matches!(self, Test::WriteBw | Test::ReadBw | Test::SendBw)
    }
}

/// Parsed options.
#[derive(Debug, Clone)]
pub struct Opts {
    /// Message size (`-s`).
    pub size: usize,
    /// Iterations per QP (`-n`).
    pub iters: u64,
    /// Run for this long instead (`-D`).
    pub duration: Option<Duration>,
    /// Queue pairs (`-q`).
    pub qps: usize,
    /// Send queue depth (`-t`).
    pub tx_depth: usize,
    /// TCP port (`-p`).
    pub port: u16,
    /// Peer host (client mode).
    pub host: Option<String>,
    /// Both ends in-process over the virtual wire.
    pub vwire: bool,
    /// Virtual wire loss/reorder/duplicate probability.
    pub loss: f64,
    /// Both ends in-process on AF_XDP engines over a veth pair (root).
    pub veth: bool,
    /// One end in this process on an AF_XDP engine on this interface (`--iface`).
    pub iface: Option<String>,
    /// The engine's address and prefix length on `iface` (`--addr A.B.C.D/PREFIX`).
    pub addr: Option<(Ipv4Addr, u8)>,
    /// IPv4 default gateway of the engine (`--gateway`).
    pub gateway: Option<Ipv4Addr>,
    /// Ask for MPA CRC32c (on unless `--no-crc`).
    pub crc: bool,
    /// Fill messages with a pattern and check it at the receiver (`--verify`).
    pub verify: bool,
    /// Write the client's results as a bench-schema report here (`--json`; `-`: stdout).
    pub json: Option<std::path::PathBuf>,
}

pub(super) const USAGE: &str =
    "usage: TEST --iface IF --addr A.B.C.D/PREFIX [--gateway G] [options] [host]
       TEST --vwire [--loss P] [options]
       TEST --veth [options]

  --iface IF   run one end on an AF_XDP engine on interface IF (root); without a host
               this is the server, with a host the client connecting to it
  --addr A/P   the engine's own IPv4 address and prefix (not configured in the kernel)
  --gateway G  IPv4 default gateway of the engine
  --pcap FILE  record every frame of the engines (pcapng; .pcap: classic; %p pid, %e engine)
  --vwire      both ends in this process over the in-process virtual wire
  --loss P     with --vwire: drop/reorder/duplicate probability per frame (<= 0.1)
  --veth       both ends in this process on AF_XDP engines over a veth pair between two
               network namespaces (root)
  -s SIZE      message size in bytes (default 65536 for bandwidth, 2 for latency)
  -n ITERS     iterations per QP (default 5000 for bandwidth, 1000 for latency)
  -D SECONDS   run for this long instead of -n
  -q QPS       queue pairs (bandwidth tests; default 1)
  -t DEPTH     send queue depth (default 128)
  -p PORT      TCP port (default 18515)
  --no-crc     do not ask for MPA CRC32c (used anyway if the peer asks)
  --verify     fill messages with a pattern and check every byte at the receiver
  --json FILE  also write the results as JSON of the bench schema xwarp-bench/1 (`-`:
               stdout, and the table goes to stderr); not on an --iface server";

/// The command line as clap sees it (defaults that depend on the test are filled in by
/// [`from_cli`]).
#[derive(clap::Parser, Debug)]
#[command(version)]
pub(super) struct Cli {
    #[command(flatten)]
    engine: EngineArgs,
    /// Both ends in this process over the in-process virtual wire.
    #[arg(long)]
    vwire: bool,
    /// With --vwire: drop/reorder/duplicate probability per frame (<= 0.1).
    #[arg(long, value_name = "P", value_parser = loss_arg)]
    loss: Option<f64>,
    /// Both ends in this process on AF_XDP engines over a veth pair between two network
    /// namespaces (root).
    #[arg(long)]
    veth: bool,
    /// Message size in bytes (default 65536 for bandwidth, 2 for latency).
    #[arg(short = 's', long = "size", value_name = "SIZE", value_parser = num_arg("-s"))]
    size: Option<u64>,
    /// Iterations per QP (default 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long = "iters", value_name = "ITERS", value_parser = num_arg("-n"))]
    iters: Option<u64>,
    /// Run for this long instead of -n.
    #[arg(short = 'D', long = "duration", value_name = "SECONDS", value_parser = num_arg("-D"))]
    duration: Option<u64>,
    /// Queue pairs (bandwidth tests; default 1).
    #[arg(short = 'q', long = "qp", value_name = "QPS", value_parser = num_arg("-q"))]
    qps: Option<u64>,
    /// Send queue depth (default 128).
    #[arg(short = 't', long = "tx-depth", value_name = "DEPTH", value_parser = num_arg("-t"))]
    tx_depth: Option<u64>,
    /// TCP port (default 18515).
    #[arg(short = 'p', long = "port", value_name = "PORT", value_parser = port_arg)]
    port: Option<u16>,
    /// Do not ask for MPA CRC32c (used anyway if the peer asks).
    #[arg(long)]
    no_crc: bool,
    /// Fill messages with a pattern and check every byte at the receiver.
    #[arg(long)]
    verify: bool,
    /// Also write the results as JSON of the bench schema xwarp-bench/1 (`-`: stdout, the
    /// table then goes to stderr); the client writes it (not an --iface server).
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
    /// With --iface: the server to connect to (client mode); without it this is the server.
    host: Option<String>,
}

fn num_arg(name: &'static str) -> impl Fn(&str) -> Result<u64, String> + Clone {
    move |s| {
        s.parse::<u64>()
            .map_err(|_| format!("{name}: not a number: {s}"))
    }
}

fn port_arg(s: &str) -> Result<u16, String> {
    s.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or("-p: a port from 1 to 65535".into())
}

fn loss_arg(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=0.1).contains(p))
        .ok_or("--loss: a probability up to 0.1".into())
}

/// Parse the command line of `test` (without the program name) as clap sees it; help
/// and version requests are errors of kind `DisplayHelp` / `DisplayVersion`.
pub(super) fn cli(test: Test, args: Vec<OsString>) -> Result<Cli, clap::Error> {
    let usage = USAGE
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .trim_start_matches("usage: ")
        .replace("TEST", test.bin_name());
    let cmd = Cli::command()
        .name(test.bin_name())
        .bin_name(test.bin_name())
        .about(format!("perftest-style {} over xwarp verbs", test.title()))
        .override_usage(usage);
    let m =
        cmd.try_get_matches_from(std::iter::once(OsString::from(test.bin_name())).chain(args))?;
    Cli::from_arg_matches(&m)
}

/// Parse perftest-style arguments (without the program name). Exactly one of `--iface`,
/// `--vwire` and `--veth` is required. A help request is an error too (its text).
pub fn parse(test: Test, args: Vec<OsString>) -> Result<Opts, String> {
    let c = cli(test, args).map_err(|e| clap_message(&e))?;
    from_cli(test, c)
}

/// Check the parsed command line and fill in the test's defaults.
pub(super) fn from_cli(test: Test, c: Cli) -> Result<Opts, String> {
    c.engine.apply_pcap();
    let mut o = Opts {
        size: if test.is_bw() { 65536 } else { 2 },
        iters: if test.is_bw() { 5000 } else { 1000 },
        duration: c.duration.map(|d| Duration::from_secs(d.clamp(1, 86_400))),
        qps: c.qps.map_or(1, |q| q.clamp(1, 256) as usize),
        tx_depth: c.tx_depth.map_or(128, |t| t.clamp(1, 4096) as usize),
        port: c.port.unwrap_or(18515),
        host: c.host,
        vwire: c.vwire,
        loss: c.loss.unwrap_or(0.0),
        veth: c.veth,
        iface: c.engine.iface,
        addr: c.engine.addr,
        gateway: c.engine.gateway,
        crc: !c.no_crc,
        verify: c.verify,
        json: c.json,
    };
    if let Some(s) = c.size {
        o.size = usize::try_from(s).map_err(|_| "-s: too large")?;
    }
    if let Some(n) = c.iters {
        o.iters = n.max(1);
    }
    if o.size == 0 || o.size > (1 << 30) {
        return Err("-s must be 1..=1 GiB".into());
    }
    if !test.is_bw() {
        o.qps = 1;
    }
    let modes = [o.vwire, o.veth, o.iface.is_some()]
        .iter()
        .filter(|m| **m)
        .count();
    if modes == 0 {
        return Err(
            "choose --iface IF --addr A.B.C.D/PREFIX (one end per process), \
                    or --vwire or --veth (both ends in this process)"
                .into(),
        );
    }
    if modes > 1 {
        return Err("--iface, --vwire and --veth exclude each other".into());
    }
    if o.iface.is_some() && o.addr.is_none() {
        return Err("--iface needs --addr A.B.C.D/PREFIX (the engine's own address)".into());
    }
    if o.iface.is_none() && (o.addr.is_some() || o.gateway.is_some()) {
        return Err("--addr and --gateway need --iface".into());
    }
    if o.iface.is_none() && o.host.is_some() {
        return Err("a server host is only used with --iface".into());
    }
    if o.json.is_some() && o.iface.is_some() && o.host.is_none() {
        return Err(
            "--json is written by the client (the server prints the client's results)".into(),
        );
    }
    if o.loss > 0.0 && !o.vwire {
        return Err("--loss needs --vwire".into());
    }
    Ok(o)
}
