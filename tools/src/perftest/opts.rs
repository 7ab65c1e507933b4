//! The tools' command line: which test ([`Test`]) and its options ([`Opts`], [`parse`]).

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::time::Duration;

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
}

pub(super) const USAGE: &str =
    "usage: TEST --iface IF --addr A.B.C.D/PREFIX [--gateway G] [options] [host]
       TEST --vwire [--loss P] [options]
       TEST --veth [options]

  --iface IF   run one end on an AF_XDP engine on interface IF (root); without a host
               this is the server, with a host the client connecting to it
  --addr A/P   the engine's own IPv4 address and prefix (not configured in the kernel)
  --gateway G  IPv4 default gateway of the engine
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
  --verify     fill messages with a pattern and check every byte at the receiver";

/// Parse `ADDR/PREFIX`.
pub(super) fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (a, p) = s.split_once('/')?;
    let p: u8 = p.parse().ok()?;
    (p <= 32).then_some(())?;
    Some((a.parse().ok()?, p))
}

/// Parse perftest-style arguments (without the program name). Exactly one of `--iface`,
/// `--vwire` and `--veth` is required.
pub fn parse(test: Test, args: Vec<OsString>) -> Result<Opts, String> {
    let mut o = Opts {
        size: if test.is_bw() { 65536 } else { 2 },
        iters: if test.is_bw() { 5000 } else { 1000 },
        duration: None,
        qps: 1,
        tx_depth: 128,
        port: 18515,
        host: None,
        vwire: false,
        loss: 0.0,
        veth: false,
        iface: None,
        addr: None,
        gateway: None,
        crc: true,
        verify: false,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let a = a.to_str().ok_or("arguments must be UTF-8")?.to_owned();
        let mut val = |name: &str| -> Result<String, String> {
            it.next()
                .and_then(|v| v.to_str().map(str::to_owned))
                .ok_or(format!("{name} needs a value"))
        };
        let num = |s: String, name: &str| -> Result<u64, String> {
            s.parse::<u64>()
                .map_err(|_| format!("{name}: not a number: {s}"))
        };
        match a.as_str() {
            "-s" | "--size" => {
                o.size = usize::try_from(num(val("-s")?, "-s")?).map_err(|_| "-s: too large")?
            }
            "-n" | "--iters" => o.iters = num(val("-n")?, "-n")?.max(1),
            "-D" | "--duration" => {
                o.duration = Some(Duration::from_secs(num(val("-D")?, "-D")?.clamp(1, 86_400)))
            }
            "-q" | "--qp" => o.qps = num(val("-q")?, "-q")?.clamp(1, 256) as usize,
            "-t" | "--tx-depth" => o.tx_depth = num(val("-t")?, "-t")?.clamp(1, 4096) as usize,
            "-p" | "--port" => {
                o.port = u16::try_from(num(val("-p")?, "-p")?)
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or("-p: a port from 1 to 65535")?
            }
            "--vwire" => o.vwire = true,
            "--veth" => o.veth = true,
            "--loss" => {
                o.loss = val("--loss")?
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=0.1).contains(p))
                    .ok_or("--loss: a probability up to 0.1")?
            }
            "--iface" => o.iface = Some(val("--iface")?),
            "--addr" => {
                let v = val("--addr")?;
                o.addr = Some(
                    parse_cidr(&v).ok_or(format!("--addr: expected A.B.C.D/PREFIX, got {v}"))?,
                )
            }
            "--gateway" => {
                let v = val("--gateway")?;
                o.gateway = Some(
                    v.parse()
                        .map_err(|_| format!("--gateway: not an IPv4 address: {v}"))?,
                )
            }
            "--no-crc" => o.crc = false,
            "--verify" => o.verify = true,
            "-h" | "--help" => return Err(String::new()),
            s if !s.starts_with('-') && o.host.is_none() => o.host = Some(s.to_owned()),
            s if !s.starts_with('-') => return Err(format!("unexpected argument {s}")),
            other => return Err(format!("unknown option {other}")),
        }
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
    if o.loss > 0.0 && !o.vwire {
        return Err("--loss needs --vwire".into());
    }
    Ok(o)
}
