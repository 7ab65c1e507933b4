//! `xwarp bench tcp` options: the command line, its defaults and the result of one pair.

use std::ffi::OsString;
use std::io;
use std::time::Duration;

use xwarp::poll_driver::afxdp::XdpMode;
use xwarp::poll_driver::engine::{EngineMode, SpinBudget};
use xwarp::stack::TcpCore;

/// Ping-pong message size (bytes each way).
pub(super) const PING_SIZE: usize = 64;
/// Largest `--mtu` (veth jumbo frames; above 3826 the engines use multi-buffer AF_XDP).
pub(super) const MAX_MTU: usize = 60000;
/// Ping-pong iterations before measuring.
pub(super) const WARMUP: u32 = 2000;
/// Port numbers on the servers.
pub(super) const BULK_PORT: u16 = 5201;
pub(super) const PING_PORT: u16 = 5202;
/// Bulk ports of the second and later `--sizes` (`BULK_SWEEP_PORT + i`).
pub(super) const BULK_SWEEP_PORT: u16 = 5300;
/// Most sizes in a `--sizes` sweep.
pub(super) const MAX_SIZES: usize = 32;
/// Most loss rates in a `--loss` list.
pub(super) const MAX_LOSSES: usize = 8;
/// Highest `--loss` probability.
pub(super) const MAX_LOSS: f64 = 0.5;

/// Who runs the xwarp engines' iterations in a row (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeSel {
    /// An engine thread per engine (`EngineMode::Thread`).
    Thread,
    /// Run to completion: the application threads drive their engine
    /// (`EngineMode::Inline`, what `XWARP_MODE=inline` selects).
    Inline,
}

impl ModeSel {
    /// The name in row names and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModeSel::Thread => "thread",
            ModeSel::Inline => "inline",
        }
    }

    /// The engine mode it selects.
    pub fn engine_mode(self) -> EngineMode {
        match self {
            ModeSel::Thread => EngineMode::Thread,
            ModeSel::Inline => EngineMode::Inline(Default::default()),
        }
    }
}

/// The name of a TCP core in row names.
pub fn core_name(c: TcpCore) -> &'static str {
    match c {
        TcpCore::Smoltcp => "smoltcp",
        TcpCore::Own => "own",
    }
}

/// How threads are placed on cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// Side A on the first core, side B on the second.
    Sides,
    /// Engines on the first core, applications on the second.
    Split,
    /// No pinning.
    None,
}

/// Benchmark options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Length of each bulk run and each ping-pong run.
    pub duration: Duration,
    /// Bulk write sizes (`--msg-size` or the `--sizes` sweep), ascending; each pair's bulk
    /// run is measured at every size.
    pub sizes: Vec<usize>,
    /// Engine idle spin.
    pub spin: SpinBudget,
    /// Application spin before sleeping.
    pub app_spin: Duration,
    /// Core placement.
    pub pin: Pin,
    /// IP MTU of the veth pair.
    pub mtu: usize,
    /// Pairs to run.
    pub pairs: Vec<PairKind>,
    /// JSON output file (`-`: stdout).
    pub json: Option<std::path::PathBuf>,
    /// SVG plot file.
    pub plot: Option<std::path::PathBuf>,
    /// No per-second progress lines.
    pub quiet: bool,
    /// Third octet of the test /24.
    pub net: u8,
    /// Rounds over all pairs; the results are medians.
    pub repeat: u32,
    /// Which pairs run with RPS masks (under `Pin::Sides`).
    pub rps: Rps,
    /// How the engines' XDP programs attach.
    pub xdp_mode: XdpMode,
    /// Engine modes the xwarp pairs run in, each a row of its own.
    pub modes: Vec<ModeSel>,
    /// The engines' TCP core (`StackConfig::tcp_core`).
    pub tcp_core: TcpCore,
    /// Loss probabilities of the loss rows (`--loss`; empty: no loss rows).
    pub loss: Vec<f64>,
}

/// Which pairs run with receive packet steering to their side's core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rps {
    /// No pair.
    None,
    /// Only `xwarp-kernel` (the kernel receiver behind an xwarp sender).
    XwarpKernel,
    /// Every pair, the kernel baseline included.
    All,
}

impl Rps {
    pub(super) fn applies(self, kind: PairKind) -> bool {
        match self {
            Rps::None => false,
            Rps::XwarpKernel => kind == PairKind::XwarpKernel,
            Rps::All => true,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Rps::None => "none",
            Rps::XwarpKernel => "xwarp-kernel",
            Rps::All => "all",
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            duration: Duration::from_secs(3),
            sizes: vec![64 << 10],
            spin: SpinBudget::Duration(Duration::from_micros(1000)),
            app_spin: Duration::ZERO,
            pin: Pin::Sides,
            mtu: 1500,
            pairs: vec![
                PairKind::KernelKernel,
                PairKind::KernelBusyPoll,
                PairKind::XwarpKernel,
                PairKind::XwarpXwarp,
                PairKind::AfxdpCeiling,
            ],
            json: None,
            plot: None,
            quiet: false,
            net: 90,
            repeat: 3,
            rps: Rps::XwarpKernel,
            xdp_mode: XdpMode::Generic,
            modes: vec![if EngineMode::configured().is_inline() {
                ModeSel::Inline
            } else {
                ModeSel::Thread
            }],
            tcp_core: TcpCore::from_env(),
            loss: Vec::new(),
        }
    }
}

/// Which ends a measurement uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairKind {
    /// Kernel client, kernel server.
    KernelKernel,
    /// Kernel client and server on non-blocking sockets with `SO_BUSY_POLL`, both spinning
    /// on their reads: the kernel's lowest ping-pong latency (no bulk run).
    KernelBusyPoll,
    /// xwarp client, kernel server.
    XwarpKernel,
    /// xwarp client, xwarp server.
    XwarpXwarp,
    /// No TCP: raw frames from one AF_XDP socket to the other with one copy at each end,
    /// the upper bound of the xwarp rows on this path ([`crate::bench::ceiling`]).
    AfxdpCeiling,
}

impl PairKind {
    /// Name used in the table and JSON.
    pub fn name(self) -> &'static str {
        match self {
            PairKind::KernelKernel => "kernel-kernel",
            PairKind::KernelBusyPoll => "kernel-busypoll",
            PairKind::XwarpKernel => "xwarp-kernel",
            PairKind::XwarpXwarp => "xwarp-xwarp",
            PairKind::AfxdpCeiling => "afxdp-ceiling",
        }
    }

    /// `true` for the pairs with an xwarp engine at one end or both.
    pub fn is_xwarp(self) -> bool {
        matches!(self, PairKind::XwarpKernel | PairKind::XwarpXwarp)
    }

    fn parse(s: &str) -> Option<PairKind> {
        [
            PairKind::KernelKernel,
            PairKind::KernelBusyPoll,
            PairKind::XwarpKernel,
            PairKind::XwarpXwarp,
            PairKind::AfxdpCeiling,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
}

pub(super) fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// The command line of `xwarp bench tcp` as clap sees it; every value is checked by
/// [`parse_args`].
#[derive(clap::Parser, Debug)]
#[command(
    name = "xwarp bench tcp",
    version,
    about = "TCP over one veth pair: kernel vs xwarp (root: creates namespaces, a veth pair \
             and XDP programs)"
)]
pub(super) struct Cli {
    /// Seconds per bulk and per ping-pong run (default 3).
    #[arg(long, value_name = "SECS")]
    duration: Option<String>,
    /// Bulk write size (default 65536).
    #[arg(long = "msg-size", value_name = "BYTES")]
    msg_size: Option<String>,
    /// Bulk write sizes to sweep instead, e.g. 1K,4K,16K,64K,256K (K = 1024, M = 1024²; at
    /// most 16M): every pair's bulk run at every size (the afxdp-ceiling moves MTU frames
    /// and runs once).
    #[arg(long = "sizes", value_name = "LIST")]
    sizes: Option<String>,
    /// Engine idle spin before sleeping, µs; 'forever' never sleeps (default 1000).
    #[arg(long = "spin-us", value_name = "US")]
    spin_us: Option<String>,
    /// Application spin before sleeping on a socket, µs (default 0).
    #[arg(long = "app-spin-us", value_name = "US")]
    app_spin_us: Option<String>,
    /// sides | split | none (default sides; see the docs of xwarp_tools::bench::tcp).
    #[arg(long, value_name = "MODE")]
    pin: Option<String>,
    /// IP MTU of the veth pair (default 1500; above 1778 uses 4096-byte UMEM chunks, above
    /// 3826 multi-buffer AF_XDP frames over up to 16 chunks, max 60000).
    #[arg(long, value_name = "BYTES")]
    mtu: Option<String>,
    /// Comma-separated subset of
    /// kernel-kernel,kernel-busypoll,xwarp-kernel,xwarp-xwarp,afxdp-ceiling (kernel-busypoll:
    /// ping-pong only, both ends spinning on non-blocking SO_BUSY_POLL sockets;
    /// afxdp-ceiling: raw UDP frames between two AF_XDP sockets, one copy at each end, no
    /// TCP: the upper bound of the xwarp rows on this path, and a 64-byte UDP ping-pong).
    #[arg(long, value_name = "LIST")]
    only: Option<String>,
    /// Rounds over all pairs, interleaved; medians are reported (default 3).
    #[arg(long, value_name = "N")]
    repeat: Option<String>,
    /// Also write the results as JSON (schema xwarp-bench/1, see tools/README.md; `-`:
    /// stdout).
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Also draw bandwidth against message size and the ping-pong latency CDFs as SVG.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<String>,
    /// No per-second progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// The /24 used: 10.88.N.0 (default 90).
    #[arg(long, value_name = "N")]
    net: Option<String>,
    /// generic | native | auto: how the engines' XDP programs attach to the veth (default
    /// generic, as xwarp bench rdma).
    #[arg(long = "xdp-mode", value_name = "MODE")]
    xdp_mode: Option<String>,
    /// xwarp-kernel | all | none: pairs that run with RPS masks for their side's core under
    /// --pin sides (default xwarp-kernel; see the docs of xwarp_tools::bench::tcp).
    #[arg(long, value_name = "MODE")]
    rps: Option<String>,
    /// thread | inline | both: who runs the xwarp engines' iterations (engine threads, or
    /// the application threads run to completion); both: every xwarp pair in each mode
    /// (default: what XWARP_MODE says, thread if unset).
    #[arg(long, value_name = "MODE")]
    mode: Option<String>,
    /// smoltcp | own: the engines' TCP core (StackConfig::tcp_core; default
    /// XWARP_TCP_CORE or smoltcp). own: the crate's own TCP connection (SACK, RACK-TLP), opt-in.
    #[arg(long = "tcp-core", value_name = "CORE")]
    tcp_core: Option<String>,
    /// Loss probabilities, e.g. 0.001,0.01,0.05 (each within 0..=0.5): after the loss-free
    /// rows, goodput of kernel-kernel, xwarp-kernel and xwarp-xwarp through a forwarding
    /// namespace whose XDP program drops that share of TCP frames each way, one-way and
    /// full duplex (see the docs of xwarp_tools::bench::tcp).
    #[arg(long, value_name = "LIST")]
    loss: Option<String>,
}

impl Cli {
    /// The options given, as (flag, value) pairs.
    fn given(self) -> Vec<(&'static str, String)> {
        [
            ("--duration", self.duration),
            ("--msg-size", self.msg_size),
            ("--sizes", self.sizes),
            ("--spin-us", self.spin_us),
            ("--app-spin-us", self.app_spin_us),
            ("--pin", self.pin),
            ("--mtu", self.mtu),
            ("--only", self.only),
            ("--repeat", self.repeat),
            ("--json", self.json),
            ("--plot", self.plot),
            ("--net", self.net),
            ("--xdp-mode", self.xdp_mode),
            ("--rps", self.rps),
            ("--mode", self.mode),
            ("--tcp-core", self.tcp_core),
            ("--loss", self.loss),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }
}

/// Parse the command line (without `xwarp bench tcp`). `Ok(None)`: help was asked for.
pub fn parse_args(args: &[OsString]) -> io::Result<Option<Options>> {
    use clap::error::ErrorKind;
    match parse_cli(args) {
        Ok(c) => check(c).map(Some),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            Ok(None)
        }
        Err(e) => Err(bad(crate::cli::clap_message(&e))),
    }
}

/// clap's view of the command line (help and version requests are errors of their kind).
pub(super) fn parse_cli(args: &[OsString]) -> Result<Cli, clap::Error> {
    let argv = std::iter::once(OsString::from("xwarp bench tcp")).chain(args.iter().cloned());
    <Cli as clap::Parser>::try_parse_from(argv)
}

/// Check every given value and build the options.
pub(super) fn check(c: Cli) -> io::Result<Options> {
    let mut o = Options {
        quiet: c.quiet,
        ..Options::default()
    };
    if c.msg_size.is_some() && c.sizes.is_some() {
        return Err(bad("give --msg-size or --sizes, not both".into()));
    }
    for (a, v) in c.given() {
        let v = v.as_str();
        let num = |v: &str| -> io::Result<u64> {
            v.parse()
                .map_err(|_| bad(format!("{a}: {v:?} is not a number")))
        };
        match a {
            "--duration" => {
                let s: f64 = v
                    .parse()
                    .map_err(|_| bad(format!("--duration: {v:?} is not a number")))?;
                if !(0.1..=3600.0).contains(&s) {
                    return Err(bad("--duration must be within 0.1..=3600 s".into()));
                }
                o.duration = Duration::from_secs_f64(s);
            }
            "--msg-size" => {
                let n = num(v)?;
                if !(1..=(16 << 20)).contains(&n) {
                    return Err(bad("--msg-size must be within 1..=16 MiB".into()));
                }
                o.sizes = vec![n as usize];
            }
            "--sizes" => {
                o.sizes = crate::bench::report::parse_sizes(a, v, 16 << 20).map_err(bad)?;
                if o.sizes.len() > MAX_SIZES {
                    return Err(bad(format!("--sizes: at most {MAX_SIZES} sizes")));
                }
            }
            "--spin-us" => {
                o.spin = if v == "forever" {
                    SpinBudget::Forever
                } else {
                    SpinBudget::Duration(Duration::from_micros(num(v)?.min(10_000_000)))
                }
            }
            "--app-spin-us" => o.app_spin = Duration::from_micros(num(v)?.min(10_000_000)),
            "--pin" => {
                o.pin = match v {
                    "sides" => Pin::Sides,
                    "split" => Pin::Split,
                    "none" => Pin::None,
                    _ => return Err(bad(format!("--pin: unknown mode {v:?}"))),
                }
            }
            "--mtu" => {
                let n = num(v)?;
                if !(576..=MAX_MTU as u64).contains(&n) {
                    return Err(bad(format!("--mtu must be within 576..={MAX_MTU}")));
                }
                o.mtu = n as usize;
            }
            "--only" => {
                o.pairs = v
                    .split(',')
                    .map(|p| PairKind::parse(p).ok_or_else(|| bad(format!("--only: {p:?}?"))))
                    .collect::<io::Result<_>>()?;
            }
            "--json" => o.json = Some(v.into()),
            "--plot" => o.plot = Some(v.into()),
            "--repeat" => {
                let n = num(v)?;
                if !(1..=100).contains(&n) {
                    return Err(bad("--repeat must be within 1..=100".into()));
                }
                o.repeat = n as u32;
            }
            "--net" => {
                o.net = u8::try_from(num(v)?).map_err(|_| bad("--net must be 0..=255".into()))?
            }
            "--xdp-mode" => {
                o.xdp_mode = XdpMode::from_name(v)
                    .ok_or_else(|| bad(format!("--xdp-mode: unknown mode {v:?}")))?
            }
            "--rps" => {
                o.rps = match v {
                    "none" => Rps::None,
                    "xwarp-kernel" => Rps::XwarpKernel,
                    "all" => Rps::All,
                    _ => return Err(bad(format!("--rps: unknown mode {v:?}"))),
                }
            }
            "--mode" => {
                o.modes = match v {
                    "thread" => vec![ModeSel::Thread],
                    "inline" => vec![ModeSel::Inline],
                    "both" => vec![ModeSel::Thread, ModeSel::Inline],
                    _ => return Err(bad(format!("--mode: unknown mode {v:?}"))),
                }
            }
            "--tcp-core" => {
                o.tcp_core = TcpCore::parse(v)
                    .ok_or_else(|| bad(format!("--tcp-core: {v:?} is neither smoltcp nor own")))?
            }
            "--loss" => o.loss = parse_losses(v)?,
            _ => return Err(bad(format!("unknown option {a}"))),
        }
    }
    Ok(o)
}

/// A `--loss` list: comma-separated probabilities within 0..=[`MAX_LOSS`], at most
/// [`MAX_LOSSES`], kept in the order given (duplicates dropped).
pub(super) fn parse_losses(v: &str) -> io::Result<Vec<f64>> {
    let mut out: Vec<f64> = Vec::new();
    for p in v.split(',') {
        let x: f64 = p
            .trim()
            .parse()
            .map_err(|_| bad(format!("--loss: {p:?} is not a number")))?;
        if !(0.0..=MAX_LOSS).contains(&x) {
            return Err(bad(format!("--loss: {p} is not within 0..={MAX_LOSS}")));
        }
        if !out.contains(&x) {
            out.push(x);
        }
    }
    if out.len() > MAX_LOSSES {
        return Err(bad(format!("--loss: at most {MAX_LOSSES} rates")));
    }
    Ok(out)
}

/// One bulk measurement of a pair at one write size.
#[derive(Debug, Clone)]
pub struct BulkResult {
    /// Write size (`None`: the afxdp-ceiling, which moves MTU-sized frames).
    pub size: Option<usize>,
    /// Goodput, Gbit/s (the median of the runs).
    pub gbps: f64,
    /// Lowest goodput of the runs, Gbit/s.
    pub gbps_min: f64,
    /// Highest goodput of the runs, Gbit/s.
    pub gbps_max: f64,
    /// Bytes moved (all runs).
    pub bytes: u64,
    /// Client application CPU seconds per GB (`None` for the ceiling: no application).
    pub client_cpu_s_per_gb: Option<f64>,
    /// Server application CPU seconds per GB.
    pub server_cpu_s_per_gb: Option<f64>,
    /// Engine threads' CPU seconds per GB (0 for kernel-only pairs).
    pub engine_cpu_s_per_gb: f64,
}

/// Results of one pair.
#[derive(Debug, Clone)]
pub struct PairResult {
    /// Which pair.
    pub kind: PairKind,
    /// The name of its rows: the pair's name, for xwarp pairs followed by
    /// `/<mode>/<core>` (`xwarp-xwarp/inline/smoltcp`).
    pub name: String,
    /// Runs the values are the median of.
    pub runs: u32,
    /// Bulk at each write size, ascending.
    pub bulk: Vec<BulkResult>,
    /// Ping-pong half round trip p50, µs (NaN: no ping-pong).
    pub half_rtt_p50_us: f64,
    /// Ping-pong half round trip p90, µs.
    pub half_rtt_p90_us: f64,
    /// Ping-pong half round trip p99, µs.
    pub half_rtt_p99_us: f64,
    /// Ping-pong round trips measured.
    pub pingpongs: u64,
    /// Every run's half round trips (ns), merged: the latency CDF.
    pub half_rtt_ns: Option<hdrhistogram::Histogram<u64>>,
}

/// The row name of `kind` run in `mode` with `core` (kernel pairs and the ceiling: the
/// pair's own name).
pub fn row_name(kind: PairKind, mode: ModeSel, core: TcpCore) -> String {
    if kind.is_xwarp() {
        format!("{}/{}/{}", kind.name(), mode.name(), core_name(core))
    } else {
        kind.name().to_string()
    }
}
