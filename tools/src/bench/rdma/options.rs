//! `xwarp bench rdma` options: the command line, its defaults and the results of a run.

use std::ffi::OsString;
use std::time::Duration;
use xwarp::toe::RxChecksum;

use xwarp::poll_driver::afxdp::XdpMode;
use xwarp::poll_driver::engine::SpinBudget;

/// Bulk message size (bandwidth tests and kernel bulk).
pub(super) const BULK: usize = 64 << 10;
/// Outstanding RDMA requests in the bandwidth tests.
pub(super) const DEPTH: usize = 16;
/// Time limit for any single wait.
pub(super) const WAIT: Duration = Duration::from_secs(10);

/// Options of `xwarp bench rdma`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Length of each measurement.
    pub duration: Duration,
    /// Message size of the latency tests.
    pub small: usize,
    /// The veth pair's /24 (`10.88.<net>.0/24`).
    pub net: u8,
    /// Thread placement (`--pin`).
    pub pin: Pin,
    /// Engine idle spin budget (`None`: the engine default).
    pub spin: Option<SpinBudget>,
    /// Tests to run (`None`: all): names of `TESTS`.
    pub only: Option<Vec<String>>,
    /// IP MTU of the veth pair.
    pub mtu: usize,
    /// Receive checksum policy of the engines.
    pub rx_checksum: RxChecksum,
    /// How the engines' XDP programs attach.
    pub xdp_mode: XdpMode,
    /// Rounds; every reported value is the median over them.
    pub repeat: u32,
    /// Message sizes of the bandwidth tests and the kernel bulk (`--sizes`), ascending.
    pub sizes: Vec<usize>,
    /// JSON output file (`-`: stdout).
    pub json: Option<std::path::PathBuf>,
    /// SVG plot file.
    pub plot: Option<std::path::PathBuf>,
    /// No per-second progress lines.
    pub quiet: bool,
    /// `--preload` for the perftest rows' `xwarp run` (default: its own lookup).
    pub preload: Option<std::path::PathBuf>,
    /// `--rdma-lib` for the perftest rows' `xwarp run` (default: its own lookup).
    pub rdma_lib: Option<std::path::PathBuf>,
    /// Round trips of the `ib_send_lat` row (`-n`).
    pub perftest_iters: u64,
}

/// Thread placement of `xwarp bench rdma` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// Engine A on the first core, engine B and the server on the second; the client on
    /// the core of the engine that receives the bulk data (`--pin apart`).
    Apart,
    /// Client and engine A on the first core, server and engine B on the second
    /// (`--pin sides`).
    Sides,
    /// No pinning (`--pin none`).
    None,
}

impl Pin {
    /// The `--pin` name.
    pub fn name(self) -> &'static str {
        match self {
            Pin::Apart => "apart",
            Pin::Sides => "sides",
            Pin::None => "none",
        }
    }
}

/// Largest `--sizes` size (each bandwidth end registers `2 * DEPTH` messages).
pub(super) const MAX_SIZE: usize = 1 << 20;
/// Most sizes in a `--sizes` sweep.
pub(super) const MAX_SIZES: usize = 16;

/// Largest `--mtu`: 16 chained 4096-byte chunks (`afxdp::MAX_CHAIN`) minus headroom.
pub(super) const MAX_MTU: usize = 60000;

/// Test names for `--only`.
pub(super) const TESTS: [&str; 8] = [
    "write_bw",
    "read_bw",
    "write_lat",
    "send_lat",
    "tcp",
    "ceiling",
    "ib_write_bw",
    "ib_send_lat",
];

impl Options {
    pub(super) fn runs(&self, test: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|t| t == test))
    }

    /// True when `--only` names `test` (a test that cannot run is then an error, not a
    /// skipped row).
    pub(super) fn asked_for(&self, test: &str) -> bool {
        self.only
            .as_ref()
            .is_some_and(|o| o.iter().any(|t| t == test))
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            duration: Duration::from_secs(2),
            small: 64,
            net: 90,
            pin: Pin::Apart,
            spin: None,
            only: None,
            mtu: 1500,
            repeat: 1,
            rx_checksum: RxChecksum::TrustL4,
            xdp_mode: XdpMode::Generic,
            sizes: vec![BULK],
            json: None,
            plot: None,
            quiet: false,
            preload: None,
            rdma_lib: None,
            perftest_iters: 5000,
        }
    }
}

/// Bandwidth results at one message size (Gbit/s; NaN: not run).
#[derive(Debug, Clone, Copy)]
pub struct BwResults {
    /// Message size, bytes.
    pub size: usize,
    /// RDMA Write bandwidth.
    pub write_bw_gbps: f64,
    /// RDMA Read bandwidth.
    pub read_bw_gbps: f64,
    /// Kernel TCP bulk, `size`-byte writes.
    pub tcp_bulk_gbps: f64,
    /// Process CPU seconds per GB moved by write_bw (engines, client, kernel work).
    pub write_bw_cpu_s_per_gb: f64,
    /// Process CPU seconds per GB moved by read_bw.
    pub read_bw_cpu_s_per_gb: f64,
    /// Process CPU seconds per GB moved by the kernel bulk transfer (both sockets).
    pub tcp_bulk_cpu_s_per_gb: f64,
    /// perftest's `ib_write_bw -R` between two engines through the C ABI: its BW average.
    pub ib_write_bw_gbps: f64,
}

impl BwResults {
    /// Nothing measured yet at `size`.
    pub fn new(size: usize) -> BwResults {
        BwResults {
            size,
            write_bw_gbps: f64::NAN,
            read_bw_gbps: f64::NAN,
            tcp_bulk_gbps: f64::NAN,
            write_bw_cpu_s_per_gb: f64::NAN,
            read_bw_cpu_s_per_gb: f64::NAN,
            tcp_bulk_cpu_s_per_gb: f64::NAN,
            ib_write_bw_gbps: f64::NAN,
        }
    }
}

/// Results of a run (bandwidth in Gbit/s, latency one-way = half the round trip, µs; NaN:
/// not run, `--only`).
#[derive(Debug, Clone)]
pub struct Results {
    /// Bandwidth at each `--sizes` size.
    pub bw: Vec<BwResults>,
    /// RDMA Write ping-pong, half round trip p50.
    pub write_lat_us: f64,
    /// Send ping-pong, half round trip p50.
    pub send_lat_us: f64,
    /// Raw UDP frames between two AF_XDP sockets on the same veth, one copy at each end, no
    /// TCP, no RDMA ([`crate::bench::ceiling`]): the most any engine on this path could move.
    pub ceiling_gbps: f64,
    /// Kernel TCP ping-pong, half round trip p50 (blocking reads: threads sleep).
    pub tcp_lat_us: f64,
    /// Kernel TCP ping-pong with non-blocking reads polled (yielding) like the xwarp
    /// waiters poll their memory and CQs: the like-for-like baseline for the latency ratio.
    pub tcp_lat_poll_us: f64,
    /// Every round's half round trips of write_lat, µs (the CDF).
    pub write_lat_samples: Vec<f64>,
    /// Of send_lat.
    pub send_lat_samples: Vec<f64>,
    /// Of the kernel ping-pong.
    pub tcp_lat_samples: Vec<f64>,
    /// Of the polled kernel ping-pong.
    pub tcp_lat_poll_samples: Vec<f64>,
    /// Every round's bandwidth results (the spread behind the medians; empty for one round's
    /// own results).
    pub bw_rounds: Vec<Vec<BwResults>>,
    /// perftest's `ib_send_lat -R` through the C ABI: typical (median) one-way time.
    pub ib_send_lat_us: f64,
    /// Its average one-way time.
    pub ib_send_lat_avg_us: f64,
    /// Its 99th percentile one-way time.
    pub ib_send_lat_p99_us: f64,
    /// Why the perftest rows did not run (perftest or the library missing), if so.
    pub perftest_skipped: Option<String>,
}

impl Results {
    /// Nothing measured yet, at `sizes`.
    pub fn new(sizes: &[usize]) -> Results {
        Results {
            bw: sizes.iter().map(|&s| BwResults::new(s)).collect(),
            write_lat_us: f64::NAN,
            send_lat_us: f64::NAN,
            ceiling_gbps: f64::NAN,
            tcp_lat_us: f64::NAN,
            tcp_lat_poll_us: f64::NAN,
            write_lat_samples: Vec::new(),
            send_lat_samples: Vec::new(),
            tcp_lat_samples: Vec::new(),
            tcp_lat_poll_samples: Vec::new(),
            bw_rounds: Vec::new(),
            ib_send_lat_us: f64::NAN,
            ib_send_lat_avg_us: f64::NAN,
            ib_send_lat_p99_us: f64::NAN,
            perftest_skipped: None,
        }
    }
}

/// The command line of `xwarp bench rdma` as clap sees it; every value is checked by
/// [`check`].
#[derive(clap::Parser, Debug)]
#[command(
    name = "xwarp bench rdma",
    version,
    about = "RDMA over one veth pair: xwarp verbs vs kernel TCP (root)"
)]
pub(super) struct Cli {
    /// Seconds per measurement (default 2).
    #[arg(long = "duration", value_name = "SECS")]
    duration: Option<String>,
    /// Rounds of every test (kernel first in each round, then the ceiling, then the
    /// engines); every value is the median of the rounds (default 1).
    #[arg(long = "repeat", value_name = "N")]
    repeat: Option<String>,
    /// Message size of the latency tests (default 64).
    #[arg(long = "small", value_name = "BYTES")]
    small: Option<String>,
    /// Veth /24 to use: 10.88.N.0/24 (default 90).
    #[arg(long = "net", value_name = "N")]
    net: Option<String>,
    /// apart: engine A on the first core, engine B and the server on the second, the
    /// client on the core of the engine that receives the bulk data (B's for write_bw, else
    /// A's); sides: client + engine A on the first core, server + engine B on the second;
    /// none: no pinning (default apart). Waiters yield while they poll.
    #[arg(long = "pin", value_name = "MODE")]
    pin: Option<String>,
    /// Engine idle policy: US (busy-spin that long, then sleep), yieldUS (yield the core
    /// that long, then sleep) or forever (default: yield2000).
    #[arg(long = "spin-us", value_name = "SPIN")]
    spin_us: Option<String>,
    /// Run only these of write_bw,read_bw,write_lat,send_lat,tcp,ceiling,ib_write_bw,
    /// ib_send_lat (comma separated; the others have no rows). ib_write_bw and ib_send_lat
    /// are Debian's perftest programs under `xwarp run` (skipped with a note when perftest or
    /// libxwarp_ibverbs.so is missing, unless named here).
    #[arg(long = "only", value_name = "TESTS")]
    only: Option<String>,
    /// IP MTU of the veth pair, for both the kernel and the engines (default 1500, at
    /// most 60000; above 1778 the engines use 4096-byte UMEM chunks, above 3826 multi-buffer
    /// AF_XDP chains of up to 16 chunks).
    #[arg(long = "mtu", value_name = "BYTES")]
    mtu: Option<String>,
    /// TCP/IP checksums the engines verify on receive: trust-l4 (IPv4 header only, as
    /// `xwarp bench tcp` and the kernel on a veth; MPA CRC still covers every FPDU) or verify
    /// (every checksum) (default trust-l4).
    #[arg(long = "rx-checksum", value_name = "C")]
    rx_checksum: Option<String>,
    /// How the engines' XDP programs attach to the veth: generic (skb mode), native (veth
    /// driver mode) or auto (native, else generic) (default generic: less CPU per GB on a
    /// veth, see the module docs).
    #[arg(long = "xdp-mode", value_name = "M")]
    xdp_mode: Option<String>,
    /// Message sizes of write_bw, read_bw and the kernel bulk, e.g. 4K,16K,64K,256K,1M
    /// (K = 1024, M = 1024²; at most 1M; default 64K); the ceiling moves MTU frames and runs
    /// once.
    #[arg(long = "sizes", value_name = "LIST")]
    sizes: Option<String>,
    /// Also write the results as JSON (schema xwarp-bench/1, see tools/README.md; `-`:
    /// stdout).
    #[arg(long = "json", value_name = "FILE")]
    json: Option<String>,
    /// Also draw bandwidth against message size and the latency CDFs as SVG.
    #[arg(long = "plot", value_name = "FILE.svg")]
    plot: Option<String>,
    /// No per-second progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// The socket shim for the perftest rows' `xwarp run --preload` (default: its lookup).
    #[arg(long = "preload", value_name = "PATH")]
    preload: Option<String>,
    /// libxwarp_ibverbs.so for the perftest rows' `xwarp run --rdma-lib` (default: its
    /// lookup).
    #[arg(long = "rdma-lib", value_name = "PATH")]
    rdma_lib: Option<String>,
    /// Round trips of the ib_send_lat row, perftest's -n (default 5000).
    #[arg(long = "perftest-iters", value_name = "N")]
    perftest_iters: Option<String>,
}

impl Cli {
    /// The options given, as (flag, value) pairs.
    fn given(self) -> Vec<(&'static str, String)> {
        [
            ("--duration", self.duration),
            ("--repeat", self.repeat),
            ("--small", self.small),
            ("--net", self.net),
            ("--pin", self.pin),
            ("--spin-us", self.spin_us),
            ("--only", self.only),
            ("--mtu", self.mtu),
            ("--rx-checksum", self.rx_checksum),
            ("--xdp-mode", self.xdp_mode),
            ("--sizes", self.sizes),
            ("--json", self.json),
            ("--plot", self.plot),
            ("--preload", self.preload),
            ("--rdma-lib", self.rdma_lib),
            ("--perftest-iters", self.perftest_iters),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }
}

/// clap's view of the command line (without `xwarp bench rdma`; help and version requests are
/// errors of their kind).
pub(super) fn parse_cli(args: &[OsString]) -> Result<Cli, clap::Error> {
    let argv = std::iter::once(OsString::from("xwarp bench rdma")).chain(args.iter().cloned());
    <Cli as clap::Parser>::try_parse_from(argv)
}

/// Parse the command line (without `xwarp bench rdma`). `Ok(None)`: help was asked for.
pub fn parse(args: &[OsString]) -> Result<Option<Options>, String> {
    use clap::error::ErrorKind;
    match parse_cli(args) {
        Ok(c) => check(c).map(Some),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            Ok(None)
        }
        Err(e) => Err(crate::cli::clap_message(&e)),
    }
}

/// Check every given value and build the options.
pub(super) fn check(c: Cli) -> Result<Options, String> {
    let mut o = Options {
        quiet: c.quiet,
        ..Options::default()
    };
    for (a, v) in c.given() {
        let v = v.as_str();
        match a {
            "--duration" => {
                let s: f64 = v.parse().map_err(|_| format!("bad --duration {v}"))?;
                if !(0.05..=600.0).contains(&s) {
                    return Err(format!("--duration {v} out of range"));
                }
                o.duration = Duration::from_secs_f64(s);
            }
            "--small" => {
                o.small = v.parse().map_err(|_| format!("bad --small {v}"))?;
                if !(1..=65536).contains(&o.small) {
                    return Err(format!("--small {v} out of range (1..=65536)"));
                }
            }
            "--net" => o.net = v.parse().map_err(|_| format!("bad --net {v}"))?,
            "--pin" => {
                o.pin = match v {
                    "apart" => Pin::Apart,
                    "sides" => Pin::Sides,
                    "none" => Pin::None,
                    _ => return Err(format!("--pin: unknown mode {v:?}")),
                }
            }
            "--spin-us" => {
                o.spin = Some(if v == "forever" {
                    SpinBudget::Forever
                } else if let Some(y) = v.strip_prefix("yield") {
                    let us: u64 = y.parse().map_err(|_| format!("bad --spin-us {v}"))?;
                    SpinBudget::Yield(Duration::from_micros(us.min(10_000_000)))
                } else {
                    let us: u64 = v.parse().map_err(|_| format!("bad --spin-us {v}"))?;
                    SpinBudget::Duration(Duration::from_micros(us.min(10_000_000)))
                })
            }
            "--mtu" => {
                o.mtu = v.parse().map_err(|_| format!("bad --mtu {v}"))?;
                if !(576..=MAX_MTU).contains(&o.mtu) {
                    return Err(format!("--mtu {v} out of range (576..={MAX_MTU})"));
                }
            }
            "--rx-checksum" => {
                o.rx_checksum = match v {
                    "trust-l4" => RxChecksum::TrustL4,
                    "verify" => RxChecksum::Verify,
                    _ => return Err(format!("--rx-checksum: unknown policy {v:?}")),
                }
            }
            "--xdp-mode" => {
                o.xdp_mode = XdpMode::from_name(v)
                    .ok_or_else(|| format!("--xdp-mode: unknown mode {v:?}"))?
            }
            "--repeat" => {
                o.repeat = v.parse().map_err(|_| format!("bad --repeat {v}"))?;
                if !(1..=50).contains(&o.repeat) {
                    return Err(format!("--repeat {v} out of range (1..=50)"));
                }
            }
            "--sizes" => {
                o.sizes = crate::bench::report::parse_sizes(a, v, MAX_SIZE)?;
                if o.sizes.len() > MAX_SIZES {
                    return Err(format!("--sizes: at most {MAX_SIZES} sizes"));
                }
            }
            "--json" => o.json = Some(v.into()),
            "--preload" => o.preload = Some(v.into()),
            "--rdma-lib" => o.rdma_lib = Some(v.into()),
            "--perftest-iters" => {
                o.perftest_iters = v.parse().map_err(|_| format!("bad --perftest-iters {v}"))?;
                if !(10..=1_000_000).contains(&o.perftest_iters) {
                    return Err(format!("--perftest-iters {v} out of range (10..=1000000)"));
                }
            }
            "--plot" => o.plot = Some(v.into()),
            "--only" => {
                let list: Vec<String> = v.split(',').map(str::to_string).collect();
                if let Some(bad) = list.iter().find(|t| !TESTS.contains(&t.as_str())) {
                    return Err(format!("--only: unknown test {bad:?}"));
                }
                o.only = Some(list);
            }
            _ => return Err(format!("unknown option {a}")),
        }
    }
    Ok(o)
}
