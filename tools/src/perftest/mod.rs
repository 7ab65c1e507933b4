//! perftest-style RDMA benchmarks over `xwarp::verbs` (the `write_bw`, `write_lat`,
//! `read_bw`, `read_lat`, `send_bw`, `send_lat` examples call [`main`]).
//!
//! # Usage
//!
//! One end per process, as with perftest's `ib_write_bw` / `ib_write_bw <host>`: each
//! process runs an AF_XDP verbs engine ([`Context::start_xdp`]) that owns its own IPv4
//! address on a real interface (an address the kernel does not have; root):
//!
//! ```text
//! server:  write_bw --iface IF --addr A.B.C.D/PREFIX [--gateway G] [-p PORT] [options]
//! client:  write_bw --iface IF --addr E.F.G.H/PREFIX [--gateway G] [-p PORT] [options] A.B.C.D
//! ```
//!
//! The server prints `Waiting for client to connect on A.B.C.D:PORT`, serves one client
//! and exits; both ends print the perftest-style report (the server prints the results
//! the client measured). The client sends its run parameters and buffer address in the
//! MPA private data of each connection request; a server started with different `-s`,
//! `-n`, `-D`, `-q` or `--verify` rejects the connection, and both ends say why.
//!
//! Both ends in one process: `--vwire` over the in-process virtual wire (`--loss P` adds
//! loss, reordering and duplication); `--veth` on two AF_XDP verbs engines over a veth
//! pair between two network namespaces it creates (root; [`run_veth`]).
//!
//! Options (shared by all six tools): `-s SIZE`, `-n ITERATIONS`, `-D SECONDS`,
//! `-q QPS` (bandwidth tests), `-t TX_DEPTH`, `-p PORT`, `--no-crc` (MPA CRC32c is on by
//! default; CRC is used when either end asks for it), `--verify`.
//!
//! # Data verification (`--verify`)
//!
//! Off by default as in perftest. The sender fills every message with a pattern derived
//! from (QP, iteration, byte offset) before posting it; the receiver checks it:
//! * `write_bw`: the server checks, after the client's final message, that every buffer
//!   slot holds the pattern of the last iteration written to it;
//! * `send_bw`: the server checks every receive as it completes;
//! * `read_bw`, `read_lat`: the server fills its buffer once (the pattern of each slot);
//!   the client clears the target slot before each Read and checks it on completion;
//! * `write_lat`, `send_lat`: both ends check every iteration (ping and pong).
//!
//! A mismatch fails the run with the QP, the iteration and the first differing byte;
//! the server reports its failures to the client, so both ends exit non-zero. With
//! verification on, bandwidth tests keep at most one message per buffer slot in flight.
//!
//! # Flow
//!
//! Send tests use a credit scheme (iWARP has no RNR retry): the receiver grants credits
//! for the receives it re-posted, the sender never has more Sends in flight than
//! credits. Every receive the client needs is posted before it connects, every receive
//! the server needs before it accepts. At the end the client sends a DONE message
//! (Send with Solicited Event) on every QP after its data (so the server knows all data
//! is placed) carrying its iteration count and its result line; the server checks, then
//! answers with a FIN message (success, or the error text) on QP 0.
//!
//! Bounds: connecting gives up after 10 s; a client gives up after 10 s without
//! progress; the servers of the Send and Write-latency tests give up after 15 s without
//! hearing from their client. The servers of `write_bw`, `read_bw` and `read_lat` are
//! passive (the client's Writes and Reads need no help from them): they wait for DONE
//! or a connection event, and a client that vanished without closing leaves them
//! waiting until interrupted, as with perftest.

use std::ffi::OsString;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use xwarp::poll_driver::backend::Backend;
use xwarp::poll_driver::vwire::{LinkConfig, WireConfig};

use xwarp::net::PairConfig;
use xwarp::verbs::{
    vwire_pair, Access, CmEvent, CompletionQueue, CompletionStatus, ConnectParams, Context,
    MemoryRegion, QpInitAttr, QueuePair, SendOpcode, SendRequest, Stag, WorkCompletion,
};

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
    const ALL: [Test; 6] = [
        Test::WriteBw,
        Test::WriteLat,
        Test::ReadBw,
        Test::ReadLat,
        Test::SendBw,
        Test::SendLat,
    ];

    fn title(self) -> &'static str {
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

    fn code(self) -> u8 {
        Test::ALL.iter().position(|t| *t == self).unwrap_or(0) as u8 + 1
    }

    fn from_code(c: u8) -> Option<Test> {
        Test::ALL.get(usize::from(c).checked_sub(1)?).copied()
    }

    fn is_bw(self) -> bool {
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

const USAGE: &str = "usage: TEST --iface IF --addr A.B.C.D/PREFIX [--gateway G] [options] [host]
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
fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
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

/// Entry point of the example binaries: parse the command line, run, print the report.
/// Exit status 2 for a bad command line, 1 for a failed run.
pub fn main(test: Test) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let o = match parse(test, args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{}: {e}", test.bin_name());
            }
            eprintln!("{}", USAGE.replace("TEST", test.bin_name()));
            return ExitCode::from(2);
        }
    };
    let r = if o.veth {
        run_veth(test, &o)
    } else if o.vwire {
        run_vwire(test, &o)
    } else {
        run_iface(test, &o)
    };
    match r {
        Ok(report) => {
            print!("{report}");
            let _ = std::io::stdout().flush();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", test.bin_name());
            ExitCode::FAILURE
        }
    }
}

fn e2s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn post_err(e: impl std::fmt::Debug) -> String {
    format!("posting a work request: {e:?}")
}

// ---------------------------------------------------------------------------------------
// Run parameters, buffer layout, private data and control messages.

/// Bytes of one control message slot (DONE, FIN, credits).
const CTRL_LEN: usize = 1024;
/// Control receive slots per QP (credits and FIN at the client, DONE at the server).
const CTRL_RX: usize = 64;
/// Control slots per QP: the receives plus one send slot.
const CTRL_PER_QP: usize = CTRL_RX + 1;
/// `wr_id` flag of control receives and sends.
const CTRL_WR: u64 = 1 << 62;
/// `wr_id` of the server's FIN.
const FIN_WR: u64 = CTRL_WR | 0xffff_ffff;
/// Buffer bytes per side that the bandwidth rings aim for.
const RING_BYTES: usize = 64 << 20;
/// Receives a send_bw receiver grants at once.
const GRANT: u64 = 32;
const MAGIC: &[u8; 4] = b"XWPT";
const VERSION: u8 = 1;
const MSG_DONE: u8 = 1;
const MSG_FIN: u8 = 2;
/// How long a waiting end tolerates silence before giving up.
const SILENCE: Duration = Duration::from_secs(10);

/// What both ends agree on (the client sends it; the server must match).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Params {
    test: Test,
    size: usize,
    iters: u64,
    duration: Option<Duration>,
    qps: usize,
    verify: bool,
}

impl Params {
    fn of(test: Test, o: &Opts) -> Params {
        Params {
            test,
            size: o.size,
            iters: o.iters,
            duration: o.duration,
            qps: o.qps,
            verify: o.verify,
        }
    }

    /// Message slots per QP in the bandwidth rings.
    fn slots(&self) -> usize {
        (RING_BYTES / self.qps / self.size).clamp(1, 64)
    }

    /// Bytes of one receive buffer of the Send tests (a DONE message must fit).
    fn slot_len(&self) -> usize {
        self.size.max(CTRL_LEN)
    }

    /// Receives per QP the send_bw server keeps posted.
    fn rx(&self) -> usize {
        (RING_BYTES / self.qps / self.slot_len()).clamp(GRANT as usize, 256)
    }

    /// Bytes of the data buffer at the server or the client.
    fn buf_len(&self, server: bool) -> Result<usize, String> {
        let mul = |a: usize, b: usize, c: usize| a.checked_mul(b)?.checked_mul(c);
        match self.test {
            Test::WriteBw | Test::ReadBw => mul(self.qps, self.slots(), self.size),
            Test::SendBw if server => mul(self.qps, self.rx(), self.slot_len()),
            Test::SendBw => mul(self.qps, self.slots(), self.size),
            Test::WriteLat => self.size.checked_mul(2),
            Test::ReadLat => Some(self.size),
            Test::SendLat => self.slot_len().checked_add(self.size),
        }
        .ok_or_else(|| "buffer size overflows".to_string())
    }

    /// Why a server with parameters `self` cannot serve a client asking for `c`.
    fn mismatch(&self, c: &Params) -> Option<String> {
        if self.test != c.test {
            return Some(format!(
                "the client runs {} but this server runs {}",
                c.test.name(),
                self.test.name()
            ));
        }
        let mut d = Vec::new();
        if self.size != c.size {
            d.push(format!("-s {} (server {})", c.size, self.size));
        }
        if self.duration != c.duration {
            let s = |x: Option<Duration>| x.map_or("none".to_string(), |d| d.as_secs().to_string());
            d.push(format!(
                "-D {} (server {})",
                s(c.duration),
                s(self.duration)
            ));
        } else if self.duration.is_none() && self.iters != c.iters {
            d.push(format!("-n {} (server {})", c.iters, self.iters));
        }
        if self.qps != c.qps {
            d.push(format!("-q {} (server {})", c.qps, self.qps));
        }
        if self.verify != c.verify {
            d.push(format!(
                "--verify {} (server {})",
                if c.verify { "on" } else { "off" },
                if self.verify { "on" } else { "off" }
            ));
        }
        (!d.is_empty()).then(|| {
            format!(
                "the client asks for {}; start both ends with the same options",
                d.join(", ")
            )
        })
    }
}

/// The peer's data buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Remote {
    rkey: Stag,
    addr: u64,
    len: u64,
}

impl Remote {
    fn of(mr: &MemoryRegion) -> Remote {
        Remote {
            rkey: mr.rkey(),
            addr: mr.addr(),
            len: mr.len() as u64,
        }
    }

    fn put(&self, v: &mut Vec<u8>) {
        v.extend(self.rkey.0.to_be_bytes());
        v.extend(self.addr.to_be_bytes());
        v.extend(self.len.to_be_bytes());
    }

    fn get(b: &[u8], at: usize) -> Option<Remote> {
        Some(Remote {
            rkey: Stag(be32(b, at)?),
            addr: be64(b, at + 4)?,
            len: be64(b, at + 12)?,
        })
    }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Connection request private data: magic, version, test, flags, QP index, QP count,
/// size, iterations, duration (s, 0: none), the client's buffer (60 bytes).
fn encode_request(p: &Params, qp: usize, buf: &Remote) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(MAGIC);
    v.extend([VERSION, p.test.code(), u8::from(p.verify), 0]);
    v.extend((qp as u32).to_be_bytes());
    v.extend((p.qps as u32).to_be_bytes());
    v.extend((p.size as u64).to_be_bytes());
    v.extend(p.iters.to_be_bytes());
    v.extend(p.duration.map_or(0, |d| d.as_secs()).to_be_bytes());
    buf.put(&mut v);
    v
}

fn check_magic(b: &[u8]) -> Result<(), String> {
    if b.get(..4) != Some(&MAGIC[..]) {
        return Err("not an xwarp perftest peer (private data without the XWPT magic)".into());
    }
    if b.get(4) != Some(&VERSION) {
        return Err(format!(
            "perftest protocol version {:?}, expected {VERSION}",
            b.get(4)
        ));
    }
    Ok(())
}

/// Parse and validate a connection request's private data.
fn decode_request(b: &[u8]) -> Result<(Params, usize, Remote), String> {
    check_magic(b)?;
    let short = || "connection request private data too short".to_string();
    let test = Test::from_code(*b.get(5).ok_or_else(short)?).ok_or("unknown test code")?;
    let verify = *b.get(6).ok_or_else(short)? != 0;
    let qp = be32(b, 8).ok_or_else(short)? as usize;
    let qps = be32(b, 12).ok_or_else(short)? as usize;
    let size = be64(b, 16).ok_or_else(short)?;
    let iters = be64(b, 24).ok_or_else(short)?;
    let secs = be64(b, 32).ok_or_else(short)?;
    let remote = Remote::get(b, 40).ok_or_else(short)?;
    if !(1..=256).contains(&qps) || qp >= qps || (!test.is_bw() && qps != 1) {
        return Err(format!("bad QP index {qp} of {qps}"));
    }
    if size == 0 || size > 1 << 30 || iters == 0 || secs > 86_400 {
        return Err(format!(
            "bad run parameters: size {size}, iterations {iters}"
        ));
    }
    let p = Params {
        test,
        size: size as usize,
        iters,
        duration: (secs > 0).then(|| Duration::from_secs(secs)),
        qps,
        verify,
    };
    let need = p.buf_len(false)? as u64;
    if remote.len < need {
        return Err(format!(
            "client buffer of {} bytes, need {need}",
            remote.len
        ));
    }
    Ok((p, qp, remote))
}

/// Accept private data: magic, version, status 0, the server's buffer.
fn encode_accept(buf: &Remote) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend([VERSION, 0, 0, 0]);
    buf.put(&mut v);
    v
}

fn decode_accept(b: &[u8], p: &Params) -> Result<Remote, String> {
    check_magic(b)?;
    let r = Remote::get(b, 8).ok_or("accept private data too short")?;
    let need = p.buf_len(true)? as u64;
    if r.len < need {
        return Err(format!("server buffer of {} bytes, need {need}", r.len));
    }
    Ok(r)
}

/// Reject private data: magic, version, status 1, the reason (UTF-8).
fn encode_reject(why: &str) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend([VERSION, 1, 0, 0]);
    let mut n = why.len().min(200);
    while !why.is_char_boundary(n) {
        n -= 1;
    }
    v.extend(&why.as_bytes()[..n]);
    v
}

fn decode_reject(b: &[u8]) -> String {
    match check_magic(b) {
        Ok(()) => String::from_utf8_lossy(b.get(8..).unwrap_or_default()).into_owned(),
        Err(_) => "no reason given".into(),
    }
}

// ---------------------------------------------------------------------------------------
// Data patterns.

/// The pattern tag of a message: direction (0 client to server, 1 back), QP, iteration.
fn tag(dir: u64, qp: usize, seq: u64) -> u64 {
    dir << 63 | (qp as u64) << 40 | (seq & ((1 << 40) - 1))
}

/// splitmix64's finalizer.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fill `out` with the pattern of `tag` (byte `k` depends on the tag and `k / 8`).
fn pattern(tag: u64, out: &mut [u8]) {
    let base = mix(tag);
    for (j, chunk) in out.chunks_mut(8).enumerate() {
        let w = mix(base ^ (j as u64).wrapping_mul(0xd1b5_4a32_d192_ed03)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// The first byte of `data` that differs from the pattern of `tag`: (offset, got, expected).
fn first_mismatch(tag: u64, data: &[u8]) -> Option<(usize, u8, u8)> {
    let base = mix(tag);
    for (j, chunk) in data.chunks(8).enumerate() {
        let w = mix(base ^ (j as u64).wrapping_mul(0xd1b5_4a32_d192_ed03)).to_le_bytes();
        if chunk != &w[..chunk.len()] {
            let k = chunk.iter().zip(w).position(|(a, b)| *a != b).unwrap_or(0);
            return Some((j * 8 + k, chunk[k], w[k]));
        }
    }
    None
}

/// Write the pattern of `tag` to `[off, off+len)` of `mr`.
fn put_pattern(
    mr: &MemoryRegion,
    off: usize,
    len: usize,
    tag: u64,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    scratch.resize(len, 0);
    pattern(tag, scratch);
    mr.write(off, scratch).map_err(e2s)
}

/// Check `[off, off+len)` of `mr` against the pattern of `tag`; `what` names the message.
fn verify_region(
    mr: &MemoryRegion,
    off: usize,
    len: usize,
    tag: u64,
    scratch: &mut Vec<u8>,
    what: &dyn Fn() -> String,
) -> Result<(), String> {
    scratch.resize(len, 0);
    mr.read(off, scratch).map_err(e2s)?;
    match first_mismatch(tag, scratch) {
        None => Ok(()),
        Some((k, got, want)) => Err(format!(
            "data verification failed: {}: byte {k} of {len} is {got:#04x}, expected {want:#04x}",
            what()
        )),
    }
}

/// [`verify_region`] for a buffer polled for its last byte: the bytes before it may become
/// visible a moment later (copies need not store in address order), so a mismatch is
/// re-read for up to a second before it counts.
fn verify_eventually(
    mr: &MemoryRegion,
    off: usize,
    len: usize,
    tag: u64,
    scratch: &mut Vec<u8>,
    what: &dyn Fn() -> String,
) -> Result<(), String> {
    let t = Instant::now();
    loop {
        match verify_region(mr, off, len, tag, scratch, what) {
            Ok(()) => return Ok(()),
            Err(e) if t.elapsed() > Duration::from_secs(1) => return Err(e),
            Err(_) => std::thread::yield_now(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Endpoints.

struct Side {
    qps: Vec<QueuePair>,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    buf: MemoryRegion,
    ctrl: MemoryRegion,
}

fn make_side<B: Backend + Send + 'static>(
    ctx: &Context<B>,
    nqps: usize,
    tx_depth: usize,
    buf_len: usize,
    crc: bool,
) -> Result<Side, String> {
    let dev = ctx.device();
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(4096).map_err(e2s)?;
    let rcq = dev.create_cq(4096).map_err(e2s)?;
    let acc = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let buf = pd
        .alloc_mr(buf_len, acc, true)
        .map_err(|e| format!("registering a {buf_len}-byte buffer: {e}"))?;
    let ctrl = pd
        .alloc_mr(CTRL_LEN * CTRL_PER_QP * nqps, acc, false)
        .map_err(|e| format!("registering the control buffer: {e}"))?;
    let mut qps = Vec::new();
    for _ in 0..nqps {
        let mut at = QpInitAttr::new(&scq, &rcq);
        at.max_send_wr = tx_depth.max(8) + 16;
        at.max_recv_wr = 1024;
        at.max_inline_data = 256;
        at.mpa.crc = crc;
        qps.push(pd.create_qp(&at).map_err(e2s)?);
    }
    Ok(Side {
        qps,
        scq,
        rcq,
        buf,
        ctrl,
    })
}

fn wr_id(qp: usize, seq: u64) -> u64 {
    (qp as u64) << 40 | seq
}

/// (QP index, sequence) of a `wr_id` made by [`wr_id`] (with or without [`CTRL_WR`]).
fn split(id: u64) -> (usize, u64) {
    (((id & !CTRL_WR) >> 40) as usize, id & ((1 << 40) - 1))
}

fn ctrl_off(qp: usize, k: usize) -> usize {
    (qp * CTRL_PER_QP + k) * CTRL_LEN
}

fn post_ctrl_recv(s: &Side, qp: usize, k: usize) -> Result<(), String> {
    let sge = s
        .ctrl
        .sge(ctrl_off(qp, k), CTRL_LEN)
        .ok_or("control slot")?;
    s.qps
        .get(qp)
        .ok_or("control receive on a QP that does not exist")?
        .post_recv(CTRL_WR | wr_id(qp, k as u64), &[sge])
        .map_err(post_err)
}

/// Send a control message (Send with Solicited Event): kind, a number, a text.
fn send_ctrl(s: &Side, qp: usize, kind: u8, n: u64, text: &str, id: u64) -> Result<(), String> {
    let mut m = vec![kind, 0, 0, 0, 0, 0, 0, 0];
    m.extend(n.to_be_bytes());
    let mut len = text.len().min(CTRL_LEN - 16);
    while !text.is_char_boundary(len) {
        len -= 1;
    }
    m.extend(&text.as_bytes()[..len]);
    let off = ctrl_off(qp, CTRL_RX);
    s.ctrl.write(off, &m).map_err(e2s)?;
    let sge = s.ctrl.sge(off, m.len()).ok_or("control slot")?;
    s.qps[qp]
        .post_send(SendRequest::new(
            id,
            SendOpcode::SendWithSolicitedEvent,
            vec![sge],
        ))
        .map_err(post_err)
}

/// The control message a receive completion carries: (kind, number, text). Control
/// receives are in the control buffer, data receives at `data_off` of the data buffer.
fn ctrl_msg(s: &Side, wc: &WorkCompletion, data_off: usize) -> Result<(u8, u64, String), String> {
    let len = (wc.byte_len as usize).min(CTRL_LEN);
    let b = if wc.wr_id & CTRL_WR != 0 {
        let (i, k) = split(wc.wr_id);
        s.ctrl.to_vec(ctrl_off(i, k as usize), len)
    } else {
        s.buf.to_vec(data_off, len)
    }
    .map_err(e2s)?;
    let kind = *b.first().ok_or("empty control message")?;
    let n = be64(&b, 8).ok_or("control message too short")?;
    Ok((kind, n, String::from_utf8_lossy(&b[16..]).into_owned()))
}

/// The error a FIN received during the run stands for.
fn fin_error(s: &Side, wc: &WorkCompletion, data_off: usize) -> String {
    if wc.status != CompletionStatus::Success {
        return format!("receive failed: {wc:?}");
    }
    match ctrl_msg(s, wc, data_off) {
        Ok((MSG_FIN, 0, _)) => "the server finished before the client".into(),
        Ok((MSG_FIN, _, text)) => format!("the server reported: {text}"),
        Ok((kind, ..)) => format!("unexpected control message {kind} from the server"),
        Err(e) => e,
    }
}

fn check(wc: &WorkCompletion) -> Result<(), String> {
    if wc.status != CompletionStatus::Success {
        return Err(format!("completion failed: {wc:?}"));
    }
    Ok(())
}

/// Fail on a connection event other than `Established` (the peer went away).
fn watch(qps: &[QueuePair]) -> Result<(), String> {
    for (i, q) in qps.iter().enumerate() {
        match q.poll_event() {
            None | Some(CmEvent::Established { .. }) => {}
            Some(CmEvent::Disconnected) => return Err(format!("QP {i}: the peer disconnected")),
            Some(e) => return Err(format!("QP {i}: connection failed: {e:?}")),
        }
    }
    Ok(())
}

/// Client checks while waiting: connection events and a FIN (the server's error) on the
/// receive CQ (`fin_on_rcq`: tests whose client receives nothing else).
fn client_idle(c: &Side, fin_on_rcq: bool) -> Result<(), String> {
    watch(&c.qps)?;
    if fin_on_rcq {
        if let Some(wc) = c.rcq.poll_one() {
            return Err(fin_error(c, &wc, 0));
        }
    }
    Ok(())
}

/// Fail when an active client (Sends, ping-pong) has not been heard from for longer
/// than its own per-iteration bound allows (it died without closing the connection).
fn client_silent(heard: Instant) -> Result<(), String> {
    let bound = SILENCE + Duration::from_secs(5);
    if heard.elapsed() > bound {
        return Err(format!("the client went silent for {bound:?}"));
    }
    Ok(())
}

/// Idle policy of the engines the tools start: both ends of `--vwire`/`--veth` share
/// the machine's cores with the waiting application threads (which yield, see [`Spin`]).
const ENGINE_SPIN: xwarp::poll_driver::engine::SpinBudget =
    xwarp::poll_driver::engine::SpinBudget::SHARED_CORES;

/// A waiting application thread: yield on every idle round, so an engine woken on the same
/// core runs at once (a busy-spinning waiter next to a yielding engine costs it a whole
/// scheduler slice per hand-over).
struct Spin(u32);

impl Spin {
    fn new() -> Spin {
        Spin(0)
    }

    /// One idle round; `true` every 1024 rounds (time for the slower checks).
    fn idle(&mut self) -> bool {
        self.0 = self.0.wrapping_add(1);
        std::thread::yield_now();
        self.0 % 1024 == 0
    }
}

// ---------------------------------------------------------------------------------------
// Sessions.

/// How a report describes the run.
struct Info<'a> {
    transport: &'a str,
    mtu: usize,
    crc: bool,
    tx_depth: usize,
}

fn header(p: &Params, info: &Info<'_>) -> String {
    let line = "-".repeat(87);
    let on = |b: bool| if b { "ON" } else { "OFF" };
    format!(
        "{line}\n                    {}\n Number of qps   : {}\t\tTransport type : IW (xwarp, {})\n TX depth        : {}\n Mtu             : {}[B]\n CRC (MPA)       : {}\n Data verify     : {}\n Data ex. method : rdma_cm (MPA private data)\n{line}\n",
        p.test.title(),
        p.qps,
        info.transport,
        info.tx_depth,
        info.mtu,
        on(info.crc),
        on(p.verify),
    )
}

/// Connect the client's QPs to `server`, run the client's part, exchange DONE/FIN.
fn client_session<B: Backend + Send + 'static>(
    ctx: &Context<B>,
    test: Test,
    o: &Opts,
    server: SocketAddr,
    transport: &str,
) -> Result<String, String> {
    let p = Params::of(test, o);
    let c = make_side(ctx, p.qps, o.tx_depth, p.buf_len(false)?, o.crc)?;
    // Receives first: the server may send as soon as the connection is up.
    match test {
        Test::SendBw => {
            for i in 0..p.qps {
                for k in 0..CTRL_RX {
                    post_ctrl_recv(&c, i, k)?;
                }
            }
        }
        Test::SendLat => {}
        _ => post_ctrl_recv(&c, 0, 0)?,
    }
    let mine = Remote::of(&c.buf);
    for (i, q) in c.qps.iter().enumerate() {
        q.connect(
            server,
            ConnectParams {
                private_data: encode_request(&p, i, &mine),
                timeout: SILENCE,
            },
        )
        .map_err(e2s)?;
    }
    let mut remote = None;
    let mut crc = o.crc;
    for q in &c.qps {
        match q.next_event(SILENCE + Duration::from_secs(2)) {
            Ok(CmEvent::Established {
                private_data,
                crc: used,
                ..
            }) => {
                remote = Some(decode_accept(&private_data, &p)?);
                crc = used;
            }
            Ok(CmEvent::Rejected { private_data }) => {
                return Err(format!(
                    "the server at {server} rejected the connection: {}",
                    decode_reject(&private_data)
                ))
            }
            Ok(CmEvent::ConnectError(e)) => return Err(format!("cannot connect to {server}: {e}")),
            Ok(e) => return Err(format!("connecting to {server}: {e:?}")),
            Err(e) => return Err(format!("cannot connect to {server}: {e}")),
        }
    }
    let remote = remote.ok_or("no QP")?;
    let run = match test {
        Test::WriteBw | Test::ReadBw => rdma_bw_client(&p, o.tx_depth, &c, &remote),
        Test::SendBw => send_bw_client(&p, o.tx_depth, &c),
        Test::WriteLat => write_lat_client(&p, &c, &remote),
        Test::ReadLat => read_lat_client(&p, &c, &remote),
        Test::SendLat => send_lat_client(&p, &c),
    }
    .and_then(|(text, posted)| {
        client_finish(&p, &c, &posted, &text)?;
        Ok(text)
    });
    for q in &c.qps {
        let _ = q.disconnect();
    }
    let text = run?;
    // Let the disconnects go out before the engine stops.
    let deadline = Instant::now() + Duration::from_secs(2);
    for q in &c.qps {
        while let Ok(e) = q.next_event(deadline.saturating_duration_since(Instant::now())) {
            if e == CmEvent::Disconnected {
                break;
            }
        }
    }
    let info = Info {
        transport,
        mtu: ctx.stack().config().mtu,
        crc,
        tx_depth: o.tx_depth,
    };
    Ok(format!("{}{text}", header(&p, &info)))
}

/// Send DONE on every QP (after its data), then wait for the server's FIN.
fn client_finish(p: &Params, c: &Side, posted: &[u64], text: &str) -> Result<(), String> {
    if p.test == Test::SendLat {
        post_ctrl_recv(c, 0, 0)?;
    }
    for i in 0..c.qps.len() {
        let t = if i == 0 { text } else { "" };
        let n = posted.get(i).copied().unwrap_or(0);
        send_ctrl(c, i, MSG_DONE, n, t, CTRL_WR | wr_id(i, 0))?;
    }
    let deadline = Instant::now() + 3 * SILENCE;
    // A failed Send (the server closed after an error) counts only if no FIN explains it.
    let mut send_err = None;
    loop {
        while let Some(w) = c.scq.poll_one() {
            if let Err(e) = check(&w) {
                send_err.get_or_insert(e);
            }
        }
        match c.rcq.next(Duration::from_millis(200)) {
            Ok(wc) => {
                check(&wc).map_err(|e| send_err.clone().unwrap_or(e))?;
                if !wc.solicited {
                    // A late credit (send_bw): give the slot back.
                    let (i, k) = split(wc.wr_id);
                    if wc.wr_id & CTRL_WR != 0 {
                        post_ctrl_recv(c, i, k as usize)?;
                    }
                    continue;
                }
                return match ctrl_msg(c, &wc, 0)? {
                    (MSG_FIN, 0, _) => Ok(()),
                    (MSG_FIN, _, why) => Err(format!("the server reported: {why}")),
                    (kind, ..) => Err(format!("unexpected control message {kind} at the end")),
                };
            }
            Err(_) => {
                watch(&c.qps).map_err(|e| send_err.clone().unwrap_or(e))?;
                if let Some(e) = send_err {
                    return Err(e);
                }
                if Instant::now() > deadline {
                    return Err("no final message from the server".into());
                }
            }
        }
    }
}

/// Listen on `addr`, serve one client (all its QPs), answer with FIN, return the report.
/// `listening` is called once the listener is up; `stop` aborts the wait.
fn server_session<B: Backend + Send + 'static>(
    ctx: &Context<B>,
    test: Test,
    o: &Opts,
    addr: SocketAddr,
    stop: &AtomicBool,
    listening: impl FnOnce(SocketAddr),
    transport: &str,
) -> Result<String, String> {
    let mine = Params::of(test, o);
    let listener = ctx
        .device()
        .listen(addr, 256)
        .map_err(|e| format!("listen on {addr}: {e}"))?;
    listening(addr);
    let (p, first_qp, remote, first) = loop {
        if stop.load(Ordering::Relaxed) {
            return Err("stopped before a client connected".into());
        }
        let req = match listener.get_request(Duration::from_millis(200)) {
            Ok(r) => r,
            Err(_) => continue,
        };
        match decode_request(&req.private_data) {
            Ok((p, qp, remote)) => break (p, qp, remote, req),
            Err(e) => {
                eprintln!(
                    "{}: ignoring a connection request from {}: {e}",
                    test.name(),
                    req.peer
                );
                let _ = req.reject(&encode_reject(&e));
            }
        }
    };
    let peer = first.peer;
    if let Some(why) = mine.mismatch(&p) {
        let _ = first.reject(&encode_reject(&why));
        // The engine stops with this process: give the MPA Reply time to leave.
        std::thread::sleep(Duration::from_millis(500));
        return Err(format!("rejected the client at {peer}: {why}"));
    }
    let s = make_side(ctx, p.qps, o.tx_depth, p.buf_len(true)?, o.crc)?;
    server_prepare(&p, &s)?;
    let accept = encode_accept(&Remote::of(&s.buf));
    let mut accepted = vec![false; p.qps];
    accepted[first_qp] = true;
    first.accept(&s.qps[first_qp], &accept).map_err(e2s)?;
    for _ in 1..p.qps {
        let req = listener
            .get_request(SILENCE)
            .map_err(|e| format!("waiting for the client's other QPs: {e}"))?;
        let (q, qp, _) = decode_request(&req.private_data)?;
        if q != p || accepted[qp] || req.peer.ip() != peer.ip() {
            let from = req.peer;
            let _ = req.reject(&encode_reject("unexpected QP"));
            return Err(format!("unexpected connection request from {from}"));
        }
        accepted[qp] = true;
        req.accept(&s.qps[qp], &accept).map_err(e2s)?;
    }
    let mut crc = o.crc;
    for q in &s.qps {
        match q.next_event(SILENCE).map_err(e2s)? {
            CmEvent::Established { crc: used, .. } => crc = used,
            e => return Err(format!("accepting {peer}: {e:?}")),
        }
    }
    let run = match test {
        Test::WriteBw | Test::ReadBw => rdma_bw_server(&p, &s, stop),
        Test::SendBw => send_bw_server(&p, &s, stop),
        Test::WriteLat => write_lat_server(&p, &s, &remote, stop),
        Test::ReadLat => wait_done(&s, stop).map(|(_, text)| text),
        Test::SendLat => send_lat_server(&p, &s, stop),
    };
    let fin = match &run {
        Ok(_) => send_ctrl(&s, 0, MSG_FIN, 0, "", FIN_WR),
        Err(e) => send_ctrl(&s, 0, MSG_FIN, 1, e, FIN_WR),
    };
    // The FIN leaves before the connection closes (completion), and the client gets the
    // time to read it (its disconnect).
    let deadline = Instant::now() + Duration::from_secs(5);
    while fin.is_ok() && Instant::now() < deadline {
        match s
            .scq
            .next(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(wc) if wc.wr_id == FIN_WR => break,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    if run.is_ok() {
        while let Ok(e) = s.qps[0].next_event(deadline.saturating_duration_since(Instant::now())) {
            if e == CmEvent::Disconnected {
                break;
            }
        }
    }
    for q in &s.qps {
        let _ = q.disconnect();
    }
    let text = run?;
    let info = Info {
        transport,
        mtu: ctx.stack().config().mtu,
        crc,
        tx_depth: o.tx_depth,
    };
    Ok(format!(
        "{}{text} (results measured by the client at {})\n",
        header(&p, &info),
        peer.ip()
    ))
}

/// Server set-up before it accepts: the receives the client's first messages need, the
/// Read source patterns.
fn server_prepare(p: &Params, s: &Side) -> Result<(), String> {
    let mut scratch = Vec::new();
    match p.test {
        Test::SendBw => {
            let (rx, slot) = (p.rx(), p.slot_len());
            for (i, qp) in s.qps.iter().enumerate() {
                for k in 0..rx {
                    let sge = s.buf.sge((i * rx + k) * slot, slot).ok_or("receive slot")?;
                    qp.post_recv(wr_id(i, k as u64), &[sge]).map_err(post_err)?;
                }
            }
        }
        Test::SendLat => {
            let sge = s.buf.sge(0, p.slot_len()).ok_or("receive slot")?;
            s.qps[0].post_recv(0, &[sge]).map_err(post_err)?;
        }
        _ => {
            for i in 0..s.qps.len() {
                post_ctrl_recv(s, i, 0)?;
            }
        }
    }
    if p.verify {
        match p.test {
            Test::ReadBw => {
                let slots = p.slots();
                for i in 0..p.qps {
                    for j in 0..slots {
                        let off = (i * slots + j) * p.size;
                        put_pattern(&s.buf, off, p.size, tag(1, i, j as u64), &mut scratch)?;
                    }
                }
            }
            Test::ReadLat => put_pattern(&s.buf, 0, p.size, tag(1, 0, 0), &mut scratch)?,
            _ => {}
        }
    }
    Ok(())
}

/// Wait for DONE on every QP (in the control receives): (iterations per QP, the
/// client's result text).
fn wait_done(s: &Side, stop: &AtomicBool) -> Result<(Vec<u64>, String), String> {
    let nq = s.qps.len();
    let mut posted = vec![None; nq];
    let mut text = String::new();
    while posted.iter().any(Option::is_none) {
        if stop.load(Ordering::Relaxed) {
            return Err("stopped".into());
        }
        let wc = match s.rcq.next(Duration::from_millis(200)) {
            Ok(w) => w,
            Err(_) => {
                watch(&s.qps)?;
                continue;
            }
        };
        check(&wc)?;
        let (i, _) = split(wc.wr_id);
        match ctrl_msg(s, &wc, 0)? {
            (MSG_DONE, n, t) if i < nq => {
                posted[i] = Some(n);
                if i == 0 {
                    text = t;
                }
            }
            (kind, ..) => return Err(format!("unexpected control message {kind} on QP {i}")),
        }
    }
    Ok((posted.into_iter().map(|p| p.unwrap_or(0)).collect(), text))
}

/// Run the test with both ends in this process over the virtual wire.
pub fn run_vwire(test: Test, o: &Opts) -> Result<String, String> {
    let link = |seed| LinkConfig {
        drop: o.loss,
        reorder: o.loss,
        duplicate: o.loss,
        ..LinkConfig::seeded(seed)
    };
    // Room for every QP's full TCP window in flight: the wire's queue is a buffer, not
    // a bottleneck to be found by loss.
    let wire = WireConfig {
        a_to_b: link(1),
        b_to_a: link(2),
        queue_depth: (1024 * o.qps).clamp(1024, 1 << 20),
        ..WireConfig::default()
    };
    let mut pair = PairConfig {
        wire,
        ..PairConfig::default()
    };
    pair.engine.spin = ENGINE_SPIN;
    let (a, b) = vwire_pair(pair).map_err(e2s)?;
    let transport = if o.loss > 0.0 {
        format!("in-process virtual wire, loss {}", o.loss)
    } else {
        "in-process virtual wire".to_string()
    };
    run_pair(test, o, &a, &b, Ipv4Addr::new(10, 77, 0, 2), &transport)
}

/// Run the test with both ends in this process on two AF_XDP verbs engines over a veth
/// pair between two network namespaces (`10.88.<net>.10` and `.20`, `net` 95; root).
pub fn run_veth(test: Test, o: &Opts) -> Result<String, String> {
    let net = xwarp::poll_driver::netns::VethPair::new(95).map_err(e2s)?;
    let a_ip = Ipv4Addr::new(10, 88, 95, 10);
    let b_ip = Ipv4Addr::new(10, 88, 95, 20);
    let cfg = |ifname: &str, ip, name: &str| {
        let mut c = xwarp::toe::XdpEngineConfig::new(ifname, ip, 24);
        // Both ends are xwarp engines: every checksum is complete.
        c.rx_checksum = xwarp::toe::RxChecksum::Verify;
        c.engine.name = name.into();
        c.engine.spin = ENGINE_SPIN;
        c
    };
    let a = Context::start_xdp(Some(&net.a), cfg(&net.if_a, a_ip, "perftest-a")).map_err(e2s)?;
    let b = Context::start_xdp(Some(&net.b), cfg(&net.if_b, b_ip, "perftest-b")).map_err(e2s)?;
    let r = run_pair(test, o, &a, &b, b_ip, "AF_XDP on a veth pair");
    // The engines stop before the namespaces go away.
    drop((a, b));
    drop(net);
    r
}

/// Run one end in this process on an AF_XDP verbs engine on `o.iface` with address
/// `o.addr`: the client when `o.host` is set (returns its report), the server otherwise
/// (serves one client, returns its report). Root is needed.
pub fn run_iface(test: Test, o: &Opts) -> Result<String, String> {
    let iface = o.iface.as_deref().ok_or("--iface is required")?;
    let (ip, prefix) = o.addr.ok_or("--addr A.B.C.D/PREFIX is required")?;
    // Resolve the server before starting anything.
    let server = o.host.as_deref().map(|h| resolve(h, o.port)).transpose()?;
    let mut cfg = xwarp::toe::XdpEngineConfig::new(iface, ip, prefix);
    // The peer is another xwarp engine or a host behind a real NIC: verify every checksum.
    cfg.rx_checksum = xwarp::toe::RxChecksum::Verify;
    cfg.stack.ipv4_gateway = o.gateway;
    cfg.engine.spin = ENGINE_SPIN;
    cfg.engine.name = format!(
        "{}-{}",
        test.name(),
        if server.is_some() { "client" } else { "server" }
    );
    let ctx = Context::start_xdp(None, cfg)
        .map_err(|e| format!("cannot start an AF_XDP verbs engine on {iface}: {e}"))?;
    let transport = format!("AF_XDP on {iface}");
    match server {
        Some(addr) => client_session(&ctx, test, o, addr, &transport),
        None => {
            let stop = AtomicBool::new(false);
            let listening = |a: SocketAddr| {
                println!(" Waiting for client to connect on {a} ...");
                let _ = std::io::stdout().flush();
            };
            server_session(
                &ctx,
                test,
                o,
                SocketAddr::from((ip, o.port)),
                &stop,
                listening,
                &transport,
            )
        }
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(SocketAddr::from((ip, port)));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or(format!("{host} has no IPv4 address"))
}

/// Run the test between engine `a` (client) and engine `b` (server at `server`): the
/// server's part on a thread, the client's here; returns the client's report.
fn run_pair<B: Backend + Send + 'static>(
    test: Test,
    o: &Opts,
    a: &Context<B>,
    b: &Context<B>,
    server: Ipv4Addr,
    transport: &str,
) -> Result<String, String> {
    let addr = SocketAddr::from((server, o.port));
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::channel();
        let srv = sc.spawn(|| {
            let listening = move |_| {
                let _ = tx.send(());
            };
            server_session(b, test, o, addr, &stop, listening, transport)
        });
        let r = match rx.recv_timeout(SILENCE) {
            Ok(()) => client_session(a, test, o, addr, transport),
            Err(_) => Err("the server did not start listening".into()),
        };
        if r.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let s = srv.join().map_err(|_| "server panicked".to_string())?;
        match (r, s) {
            (Ok(report), Ok(_)) => Ok(report),
            (Err(e), Err(se)) if e.contains("server did not start") => Err(se),
            (Err(e), _) => Err(e),
            (Ok(_), Err(se)) => Err(format!("server: {se}")),
        }
    })
}

// ---------------------------------------------------------------------------------------
// Measurements.

/// Bandwidth samples: (elapsed, cumulative bytes).
struct Bw {
    t0: Instant,
    samples: Vec<(Duration, u64)>,
}

impl Bw {
    fn report(&self, msgs: u64) -> (f64, f64, f64, f64) {
        let (end, bytes) = self.samples.last().copied().unwrap_or_default();
        let secs = end.as_secs_f64().max(1e-9);
        let avg_mbs = bytes as f64 / secs / 1e6;
        // Peak: the best rate over any window of at least 20 ms.
        let mut peak = avg_mbs;
        let mut j = 0;
        for i in 0..self.samples.len() {
            while j < i && self.samples[i].0 - self.samples[j].0 > Duration::from_millis(20) {
                let dt = (self.samples[i].0 - self.samples[j].0).as_secs_f64();
                let db = (self.samples[i].1 - self.samples[j].1) as f64;
                peak = peak.max(db / dt / 1e6);
                j += 1;
            }
        }
        (peak, avg_mbs, msgs as f64 / secs / 1e6, secs)
    }
}

fn bw_line(size: usize, bw: &Bw, msgs: u64) -> String {
    let (peak, avg, mpps, secs) = bw.report(msgs);
    format!(
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]   BW average[Gb/sec]\n {:<10} {:<14} {:<18.2} {:<20.2} {:<15.6} {:.3}\n (total {} bytes in {:.3} s)\n",
        size,
        msgs,
        peak,
        avg,
        mpps,
        avg * 8.0 / 1e3,
        msgs * size as u64,
        secs
    )
}

struct Lat {
    h: Histogram<u64>,
}

impl Lat {
    fn new() -> Result<Lat, String> {
        Ok(Lat {
            h: Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(e2s)?,
        })
    }

    fn add(&mut self, d: Duration) {
        let _ = self.h.record((d.as_nanos() as u64).max(1));
    }

    fn line(&self, size: usize, halve: bool) -> String {
        let div = if halve { 2.0 } else { 1.0 };
        let us = |v: u64| v as f64 / 1e3 / div;
        format!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]\n {:<6} {:<14} {:<14.2} {:<12.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}\n{}",
            size,
            self.h.len(),
            us(self.h.min()),
            us(self.h.max()),
            us(self.h.value_at_quantile(0.5)),
            self.h.mean() / 1e3 / div,
            self.h.stdev() / 1e3 / div,
            us(self.h.value_at_quantile(0.99)),
            us(self.h.value_at_quantile(0.999)),
            if halve {
                " (one-way: half the round trip, as perftest reports ping-pong tests)\n"
            } else {
                ""
            }
        )
    }
}

fn stop_now(p: &Params, t0: Instant, posted: u64) -> bool {
    match p.duration {
        Some(d) => t0.elapsed() >= d,
        None => posted >= p.iters,
    }
}

fn lat_iters(p: &Params, t0: Instant, i: u64) -> bool {
    !stop_now(p, t0, i)
}

/// The latency tests' iteration mark (1..=255, never repeated back to back).
fn mark(i: u64) -> u8 {
    (i % 255 + 1) as u8
}

// ---------------------------------------------------------------------------------------
// The tests. Client parts return (result text, iterations per QP).

type ClientResult = Result<(String, Vec<u64>), String>;

fn rdma_bw_client(p: &Params, tx_depth: usize, c: &Side, r: &Remote) -> ClientResult {
    let read = p.test == Test::ReadBw;
    let slots = p.slots();
    let mut depth = if read { tx_depth.min(16) } else { tx_depth };
    if p.verify {
        // One message per slot in flight: a slot is rewritten only after it completed.
        depth = depth.min(slots);
    }
    // In duration mode the last request is not known in advance: signal every one.
    let cq_mod = if p.duration.is_some() {
        1
    } else {
        (depth / 4).clamp(1, 16) as u64
    };
    let nq = c.qps.len();
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let mut finished = vec![false; nq];
    let t0 = Instant::now();
    let mut bw = Bw {
        t0,
        samples: Vec::new(),
    };
    let mut total_done = 0u64;
    let mut wcs = Vec::with_capacity(64);
    let mut scratch = Vec::new();
    let mut spin = Spin::new();
    let mut last_progress = Instant::now();
    loop {
        for (i, qp) in c.qps.iter().enumerate() {
            if stop_now(p, t0, posted[i]) && done[i] >= posted[i] {
                finished[i] = true;
            }
            if finished[i] {
                continue;
            }
            while posted[i] - done[i] < depth as u64 && !stop_now(p, t0, posted[i]) {
                let seq = posted[i];
                let off = (i * slots + (seq % slots as u64) as usize) * p.size;
                let sge = c.buf.sge(off, p.size).ok_or("buffer slot")?;
                if p.verify {
                    if read {
                        c.buf.fill(off, p.size, 0).map_err(e2s)?;
                    } else {
                        put_pattern(&c.buf, off, p.size, tag(0, i, seq), &mut scratch)?;
                    }
                }
                let raddr = r.addr + off as u64;
                let mut wr = if read {
                    SendRequest::read(wr_id(i, seq), sge, r.rkey, raddr)
                } else {
                    SendRequest::write(wr_id(i, seq), vec![sge], r.rkey, raddr)
                };
                let last = p.duration.is_none() && seq + 1 == p.iters;
                wr.signaled = (seq + 1) % cq_mod == 0 || last;
                qp.post_send(wr).map_err(post_err)?;
                posted[i] += 1;
            }
        }
        wcs.clear();
        if c.scq.poll(&mut wcs, 64) == 0 {
            if finished.iter().all(|f| *f) {
                break;
            }
            if spin.idle() {
                client_idle(c, true)?;
                if last_progress.elapsed() > SILENCE {
                    return Err(format!(
                        "no completion for {SILENCE:?} (posted {posted:?}, completed {done:?})"
                    ));
                }
            }
            continue;
        }
        spin = Spin::new();
        last_progress = Instant::now();
        for wc in &wcs {
            check(wc)?;
            let (i, seq) = split(wc.wr_id);
            if i >= nq {
                return Err(format!("unexpected completion {wc:?}"));
            }
            let before = done[i];
            done[i] = done[i].max(seq + 1);
            total_done += done[i] - before;
            if read && p.verify {
                for s in before..done[i] {
                    let j = s % slots as u64;
                    let off = (i * slots + j as usize) * p.size;
                    verify_region(&c.buf, off, p.size, tag(1, i, j), &mut scratch, &|| {
                        format!("RDMA Read {s} on QP {i}")
                    })?;
                }
            }
        }
        bw.samples
            .push((bw.t0.elapsed(), total_done * p.size as u64));
    }
    Ok((bw_line(p.size, &bw, total_done), posted))
}

fn rdma_bw_server(p: &Params, s: &Side, stop: &AtomicBool) -> Result<String, String> {
    let (posted, text) = wait_done(s, stop)?;
    if p.verify && p.test == Test::WriteBw {
        // Every slot holds the last iteration written to it (the DONE Send follows the
        // Writes on each QP, so they are all placed).
        let slots = p.slots() as u64;
        let mut scratch = Vec::new();
        for (i, n) in posted.iter().copied().enumerate() {
            for j in 0..slots.min(n) {
                let seq = j + slots * ((n - 1 - j) / slots);
                let off = (i * slots as usize + j as usize) * p.size;
                verify_region(&s.buf, off, p.size, tag(0, i, seq), &mut scratch, &|| {
                    format!("RDMA Write {seq} on QP {i}")
                })?;
            }
        }
    }
    Ok(text)
}

fn send_bw_client(p: &Params, tx_depth: usize, c: &Side) -> ClientResult {
    let nq = c.qps.len();
    let slots = p.slots();
    // One receive per QP stays free for DONE.
    let max_credits = p.rx() as u64 - 1;
    let mut depth = tx_depth;
    if p.verify {
        depth = depth.min(slots);
    }
    // In duration mode the last Send is not known in advance: signal every one.
    let cq_mod = if p.duration.is_some() {
        1
    } else {
        (depth / 4).clamp(1, 16) as u64
    };
    let mut credits = vec![max_credits; nq];
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let t0 = Instant::now();
    let mut bw = Bw {
        t0,
        samples: Vec::new(),
    };
    let mut total = 0u64;
    let mut wcs = Vec::new();
    let mut scratch = Vec::new();
    let mut spin = Spin::new();
    let mut last_progress = Instant::now();
    loop {
        let mut all_stopped = true;
        for (i, qp) in c.qps.iter().enumerate() {
            while credits[i] > 0
                && posted[i] - done[i] < depth as u64
                && !stop_now(p, t0, posted[i])
            {
                let seq = posted[i];
                let off = (i * slots + (seq % slots as u64) as usize) * p.size;
                if p.verify {
                    put_pattern(&c.buf, off, p.size, tag(0, i, seq), &mut scratch)?;
                }
                let mut wr =
                    SendRequest::send(wr_id(i, seq), vec![c.buf.sge(off, p.size).ok_or("sge")?]);
                let last = p.duration.is_none() && seq + 1 == p.iters;
                wr.signaled = (seq + 1) % cq_mod == 0 || last;
                qp.post_send(wr).map_err(post_err)?;
                posted[i] += 1;
                credits[i] -= 1;
            }
            if !stop_now(p, t0, posted[i]) || done[i] < posted[i] {
                all_stopped = false;
            }
        }
        let mut progress = false;
        wcs.clear();
        c.scq.poll(&mut wcs, 64);
        for wc in &wcs {
            check(wc)?;
            let (i, seq) = split(wc.wr_id);
            if i >= nq {
                return Err(format!("unexpected completion {wc:?}"));
            }
            let before = done[i];
            done[i] = done[i].max(seq + 1);
            total += done[i] - before;
            progress = true;
        }
        while let Some(wc) = c.rcq.poll_one() {
            progress = true;
            check(&wc)?;
            if wc.solicited {
                return Err(fin_error(c, &wc, 0));
            }
            let (i, k) = split(wc.wr_id);
            if i >= nq || wc.wr_id & CTRL_WR == 0 {
                return Err(format!("unexpected receive {wc:?}"));
            }
            let n = c.ctrl.to_vec(ctrl_off(i, k as usize), 8).map_err(e2s)?;
            let n = be64(&n, 0).unwrap_or(0);
            credits[i] = credits[i].saturating_add(n).min(max_credits);
            post_ctrl_recv(c, i, k as usize)?;
        }
        if progress {
            bw.samples.push((bw.t0.elapsed(), total * p.size as u64));
            spin = Spin::new();
            last_progress = Instant::now();
        }
        if all_stopped {
            break;
        }
        if !progress && spin.idle() {
            watch(&c.qps)?;
            if last_progress.elapsed() > SILENCE {
                return Err(format!(
                    "no progress for {SILENCE:?} (posted {posted:?}, completed {done:?}, credits {credits:?})"
                ));
            }
        }
    }
    Ok((bw_line(p.size, &bw, total), posted))
}

fn send_bw_server(p: &Params, s: &Side, stop: &AtomicBool) -> Result<String, String> {
    let nq = s.qps.len();
    let (rx, slot) = (p.rx(), p.slot_len());
    let mut got = vec![0u64; nq];
    let mut granted = vec![0u64; nq];
    let mut finished = vec![false; nq];
    let mut text = String::new();
    let mut sends = 0u64;
    let mut scratch = Vec::new();
    let mut heard = Instant::now();
    while finished.iter().any(|f| !f) {
        if stop.load(Ordering::Relaxed) {
            return Err("stopped".into());
        }
        let wc = match s.rcq.next(Duration::from_millis(200)) {
            Ok(w) => w,
            Err(_) => {
                watch(&s.qps)?;
                client_silent(heard)?;
                continue;
            }
        };
        heard = Instant::now();
        check(&wc)?;
        let (i, k) = split(wc.wr_id);
        if i >= nq || k as usize >= rx {
            return Err(format!("unexpected receive {wc:?}"));
        }
        let off = (i * rx + k as usize) * slot;
        if wc.solicited {
            let (kind, n, t) = ctrl_msg(s, &wc, off)?;
            if kind != MSG_DONE {
                return Err(format!("unexpected control message {kind} on QP {i}"));
            }
            if n != got[i] {
                return Err(format!(
                    "QP {i}: the client sent {n} messages but {} arrived",
                    got[i]
                ));
            }
            finished[i] = true;
            if i == 0 {
                text = t;
            }
            continue;
        }
        if p.verify {
            if wc.byte_len as usize != p.size {
                return Err(format!(
                    "data verification failed: Send {} on QP {i} has {} bytes, expected {}",
                    got[i], wc.byte_len, p.size
                ));
            }
            let seq = got[i];
            verify_region(&s.buf, off, p.size, tag(0, i, seq), &mut scratch, &|| {
                format!("Send {seq} on QP {i}")
            })?;
        }
        got[i] += 1;
        let sge = s.buf.sge(off, slot).ok_or("receive slot")?;
        s.qps[i].post_recv(wc.wr_id, &[sge]).map_err(post_err)?;
        if got[i] - granted[i] >= GRANT {
            let n = got[i] - granted[i];
            granted[i] = got[i];
            sends += 1;
            let mut wr = SendRequest {
                inline: Some(n.to_be_bytes().to_vec()),
                ..SendRequest::send(CTRL_WR | sends, vec![])
            };
            wr.signaled = sends % 16 == 0;
            s.qps[i].post_send(wr).map_err(post_err)?;
        }
        while let Some(w) = s.scq.poll_one() {
            check(&w)?;
        }
    }
    Ok(text)
}

fn send_lat_client(p: &Params, c: &Side) -> ClientResult {
    let qp = &c.qps[0];
    let (size, slot) = (p.size, p.slot_len());
    let inline = size <= 256;
    let mut lat = Lat::new()?;
    let mut scratch = vec![0x5au8; size];
    if !p.verify {
        c.buf.write(slot, &scratch).map_err(e2s)?;
    }
    let t0 = Instant::now();
    let mut i = 0u64;
    while lat_iters(p, t0, i) {
        // The pong's receive is posted before the ping can provoke it.
        qp.post_recv(i, &[c.buf.sge(0, slot).ok_or("sge")?])
            .map_err(post_err)?;
        if p.verify {
            scratch.resize(size, 0);
            pattern(tag(0, 0, i), &mut scratch);
            if !inline {
                c.buf.write(slot, &scratch).map_err(e2s)?;
            }
        }
        let t = Instant::now();
        let mut wr = if inline {
            SendRequest {
                inline: Some(scratch.clone()),
                ..SendRequest::send(i, vec![])
            }
        } else {
            SendRequest::send(i, vec![c.buf.sge(slot, size).ok_or("sge")?])
        };
        wr.signaled = (i + 1) % 16 == 0;
        qp.post_send(wr).map_err(post_err)?;
        let mut spin = Spin::new();
        let wc = loop {
            if let Some(w) = c.rcq.poll_one() {
                break w;
            }
            if spin.idle() {
                watch(&c.qps)?;
                if t.elapsed() > SILENCE {
                    return Err(format!("no answer to Send {i} for {SILENCE:?}"));
                }
            }
        };
        lat.add(t.elapsed());
        check(&wc)?;
        if wc.solicited {
            return Err(fin_error(c, &wc, 0));
        }
        if p.verify {
            if wc.byte_len as usize != size {
                return Err(format!(
                    "data verification failed: answer {i} has {} bytes, expected {size}",
                    wc.byte_len
                ));
            }
            verify_region(&c.buf, 0, size, tag(1, 0, i), &mut scratch, &|| {
                format!("the server's Send {i}")
            })?;
        }
        while let Some(w) = c.scq.poll_one() {
            check(&w)?;
        }
        i += 1;
    }
    Ok((lat.line(size, true), vec![i]))
}

fn send_lat_server(p: &Params, s: &Side, stop: &AtomicBool) -> Result<String, String> {
    let qp = &s.qps[0];
    let (size, slot) = (p.size, p.slot_len());
    let inline = size <= 256;
    let mut n = 0u64;
    let mut payload = vec![0u8; size];
    let mut heard = Instant::now();
    loop {
        let mut spin = Spin::new();
        let wc = loop {
            if let Some(w) = s.rcq.poll_one() {
                break w;
            }
            if spin.idle() {
                if stop.load(Ordering::Relaxed) {
                    return Err("stopped".into());
                }
                watch(&s.qps)?;
                client_silent(heard)?;
            }
        };
        heard = Instant::now();
        check(&wc)?;
        if wc.solicited {
            return match ctrl_msg(s, &wc, 0)? {
                (MSG_DONE, c, text) if c == n => Ok(text),
                (MSG_DONE, c, _) => Err(format!("the client reports {c} pings but {n} arrived")),
                (kind, ..) => Err(format!("unexpected control message {kind}")),
            };
        }
        if p.verify {
            if wc.byte_len as usize != size {
                return Err(format!(
                    "data verification failed: ping {n} has {} bytes, expected {size}",
                    wc.byte_len
                ));
            }
            verify_region(&s.buf, 0, size, tag(0, 0, n), &mut payload, &|| {
                format!("the client's Send {n}")
            })?;
            payload.resize(size, 0);
            pattern(tag(1, 0, n), &mut payload);
        } else {
            // Echo the ping.
            s.buf.read(0, &mut payload).map_err(e2s)?;
        }
        qp.post_recv(0, &[s.buf.sge(0, slot).ok_or("sge")?])
            .map_err(post_err)?;
        n += 1;
        let mut wr = if inline {
            SendRequest {
                inline: Some(payload.clone()),
                ..SendRequest::send(n, vec![])
            }
        } else {
            s.buf.write(slot, &payload).map_err(e2s)?;
            SendRequest::send(n, vec![s.buf.sge(slot, size).ok_or("sge")?])
        };
        wr.signaled = n % 16 == 0;
        qp.post_send(wr).map_err(post_err)?;
        while let Some(w) = s.scq.poll_one() {
            check(&w)?;
        }
    }
}

/// A Write of the source half `[size, 2 size)` of `mr` to the peer's sink half.
fn write_wr(id: u64, mr: &MemoryRegion, size: usize, r: &Remote) -> SendRequest {
    match mr.sge(size, size) {
        Some(sge) => SendRequest::write(id, vec![sge], r.rkey, r.addr),
        None => SendRequest::write(id, vec![], r.rkey, r.addr),
    }
}

fn write_lat_client(p: &Params, c: &Side, r: &Remote) -> ClientResult {
    // Each side Writes from its source half into the peer's sink half and polls the
    // last byte of its own sink half for the iteration mark, as perftest does. Source
    // and sink never overlap, so no buffer is written while a Write reads it.
    let qp = &c.qps[0];
    let size = p.size;
    let last = size - 1;
    let mut lat = Lat::new()?;
    let mut scratch = Vec::new();
    let t0 = Instant::now();
    let mut i = 0u64;
    while lat_iters(p, t0, i) {
        let m = mark(i);
        if p.verify && last > 0 {
            put_pattern(&c.buf, size, last, tag(0, 0, i), &mut scratch)?;
        }
        c.buf.write(size + last, &[m]).map_err(e2s)?;
        let t = Instant::now();
        let mut wr = write_wr(i, &c.buf, size, r);
        wr.signaled = (i + 1) % 16 == 0;
        qp.post_send(wr).map_err(post_err)?;
        let mut spin = Spin::new();
        while c.buf.poll_byte(last) != Some(m) {
            if spin.idle() {
                client_idle(c, true)?;
                if t.elapsed() > SILENCE {
                    return Err(format!("no answer to Write {i} for {SILENCE:?}"));
                }
            }
        }
        lat.add(t.elapsed());
        if p.verify && last > 0 {
            verify_eventually(&c.buf, 0, last, tag(1, 0, i), &mut scratch, &|| {
                format!("the server's Write {i}")
            })?;
        }
        while let Some(w) = c.scq.poll_one() {
            check(&w)?;
        }
        i += 1;
    }
    Ok((lat.line(size, true), vec![i]))
}

fn write_lat_server(p: &Params, s: &Side, r: &Remote, stop: &AtomicBool) -> Result<String, String> {
    let qp = &s.qps[0];
    let size = p.size;
    let last = size - 1;
    let mut scratch = Vec::new();
    let mut n = 0u64;
    let mut heard = Instant::now();
    loop {
        let m = mark(n);
        let mut spin = Spin::new();
        while s.buf.poll_byte(last) != Some(m) {
            if spin.idle() {
                if stop.load(Ordering::Relaxed) {
                    return Err("stopped".into());
                }
                watch(&s.qps)?;
                client_silent(heard)?;
                if let Some(wc) = s.rcq.poll_one() {
                    check(&wc)?;
                    return match ctrl_msg(s, &wc, 0)? {
                        (MSG_DONE, c, text) if c == n => Ok(text),
                        (MSG_DONE, c, _) => {
                            Err(format!("the client reports {c} Writes but {n} arrived"))
                        }
                        (kind, ..) => Err(format!("unexpected control message {kind}")),
                    };
                }
            }
        }
        heard = Instant::now();
        if p.verify && last > 0 {
            verify_eventually(&s.buf, 0, last, tag(0, 0, n), &mut scratch, &|| {
                format!("the client's Write {n}")
            })?;
            put_pattern(&s.buf, size, last, tag(1, 0, n), &mut scratch)?;
        }
        s.buf.write(size + last, &[m]).map_err(e2s)?;
        n += 1;
        let mut wr = write_wr(n, &s.buf, size, r);
        wr.signaled = n % 16 == 0;
        qp.post_send(wr).map_err(post_err)?;
        while let Some(w) = s.scq.poll_one() {
            check(&w)?;
        }
    }
}

fn read_lat_client(p: &Params, c: &Side, r: &Remote) -> ClientResult {
    let qp = &c.qps[0];
    let mut lat = Lat::new()?;
    let mut scratch = Vec::new();
    let t0 = Instant::now();
    let mut i = 0u64;
    while lat_iters(p, t0, i) {
        if p.verify {
            c.buf.fill(0, p.size, 0).map_err(e2s)?;
        }
        let t = Instant::now();
        qp.post_send(SendRequest::read(
            i,
            c.buf.sge(0, p.size).ok_or("sge")?,
            r.rkey,
            r.addr,
        ))
        .map_err(post_err)?;
        let mut spin = Spin::new();
        let wc = loop {
            if let Some(w) = c.scq.poll_one() {
                break w;
            }
            if spin.idle() {
                client_idle(c, true)?;
                if t.elapsed() > SILENCE {
                    return Err(format!("RDMA Read {i}: no completion for {SILENCE:?}"));
                }
            }
        };
        lat.add(t.elapsed());
        check(&wc)?;
        if p.verify {
            verify_region(&c.buf, 0, p.size, tag(1, 0, 0), &mut scratch, &|| {
                format!("RDMA Read {i}")
            })?;
        }
        i += 1;
    }
    Ok((lat.line(p.size, false), vec![i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(test: Test) -> Params {
        Params {
            test,
            size: 4096,
            iters: 100,
            duration: None,
            qps: 2,
            verify: true,
        }
    }

    #[test]
    fn pattern_depends_on_tag_and_offset_and_finds_the_first_difference() {
        let mut a = vec![0u8; 100];
        pattern(tag(0, 1, 7), &mut a);
        assert_eq!(first_mismatch(tag(0, 1, 7), &a), None);
        // Another iteration, QP or direction gives other bytes.
        for other in [tag(0, 1, 8), tag(0, 2, 7), tag(1, 1, 7)] {
            assert!(first_mismatch(other, &a).is_some());
        }
        // Words differ from each other (a shifted copy does not verify).
        assert_ne!(a[0..8], a[8..16]);
        let mut b = a.clone();
        b[93] ^= 0x40;
        assert_eq!(
            first_mismatch(tag(0, 1, 7), &b),
            Some((93, a[93] ^ 0x40, a[93]))
        );
        // A prefix of the pattern is the pattern of the shorter message.
        let mut c = vec![0u8; 13];
        pattern(tag(0, 1, 7), &mut c);
        assert_eq!(c, a[..13]);
    }

    #[test]
    fn request_private_data_round_trips_and_bad_data_is_an_error() {
        let p = params(Test::WriteBw);
        let r = Remote {
            rkey: Stag(0x1234_5601),
            addr: 0x7f00_0000_1000,
            len: p.buf_len(false).unwrap() as u64,
        };
        let b = encode_request(&p, 1, &r);
        assert!(b.len() <= 251, "fits siw's private data limit");
        assert_eq!(decode_request(&b), Ok((p.clone(), 1, r)));
        // Every truncation is an error, never a panic.
        for n in 0..b.len() {
            assert!(decode_request(&b[..n]).is_err(), "truncated to {n}");
        }
        let mut bad = b.clone();
        bad[0] = b'Y';
        assert!(decode_request(&bad).unwrap_err().contains("magic"));
        // QP index 9 of 2.
        let mut bad = b.clone();
        bad[11] = 9;
        assert!(decode_request(&bad).is_err());
        let mut short_buf = r;
        short_buf.len = 10;
        assert!(decode_request(&encode_request(&p, 0, &short_buf)).is_err());
        // Accept and reject data.
        let acc = encode_accept(&Remote {
            len: p.buf_len(true).unwrap() as u64,
            ..r
        });
        assert_eq!(decode_accept(&acc, &p).unwrap().rkey, r.rkey);
        assert!(decode_accept(&acc[..10], &p).is_err());
        assert_eq!(decode_reject(&encode_reject("-s differs")), "-s differs");
        assert_eq!(decode_reject(b"junk"), "no reason given");
    }

    #[test]
    fn server_names_every_differing_option() {
        let s = params(Test::SendBw);
        assert_eq!(s.mismatch(&s), None);
        let c = Params {
            size: 64,
            qps: 1,
            verify: false,
            ..s.clone()
        };
        let why = s.mismatch(&c).unwrap();
        assert!(why.contains("-s 64 (server 4096)"), "{why}");
        assert!(why.contains("-q 1 (server 2)"), "{why}");
        assert!(why.contains("--verify off (server on)"), "{why}");
        let other = params(Test::WriteBw);
        assert!(s.mismatch(&other).unwrap().contains("write_bw"));
        // -n does not matter in duration mode.
        let d = Params {
            duration: Some(Duration::from_secs(2)),
            ..s.clone()
        };
        let d2 = Params {
            iters: 5,
            ..d.clone()
        };
        assert_eq!(d.mismatch(&d2), None);
    }

    #[test]
    fn bad_command_lines_are_errors() {
        let p = |a: &[&str]| parse(Test::WriteBw, a.iter().map(Into::into).collect());
        assert!(p(&[]).unwrap_err().contains("--iface"));
        assert!(p(&["--iface", "eth0"]).unwrap_err().contains("--addr"));
        assert!(p(&["--iface", "eth0", "--addr", "10.0.0.1"])
            .unwrap_err()
            .contains("PREFIX"));
        assert!(p(&["--iface", "eth0", "--addr", "10.0.0.1/33"]).is_err());
        assert!(p(&["--vwire", "10.0.0.1"]).unwrap_err().contains("--iface"));
        assert!(p(&["--vwire", "--veth"]).is_err());
        assert!(p(&["--vwire", "-s", "x"]).unwrap_err().contains("-s"));
        assert!(p(&["--vwire", "-s"]).unwrap_err().contains("needs a value"));
        assert!(p(&["--vwire", "-p", "0"]).is_err());
        assert!(p(&["--vwire", "--bogus"]).unwrap_err().contains("--bogus"));
        assert!(p(&["--veth", "--loss", "0.01"]).is_err());
        let o = p(&[
            "--iface",
            "eth0",
            "--addr",
            "10.0.0.1/24",
            "--gateway",
            "10.0.0.254",
            "--no-crc",
            "--verify",
            "10.0.0.2",
        ])
        .unwrap();
        assert_eq!(o.addr, Some((Ipv4Addr::new(10, 0, 0, 1), 24)));
        assert_eq!(o.gateway, Some(Ipv4Addr::new(10, 0, 0, 254)));
        assert!(!o.crc && o.verify);
        assert_eq!(o.host.as_deref(), Some("10.0.0.2"));
    }

    /// A client that sends one wrong byte: the server's verification names the message
    /// and the byte, and the client learns it from the FIN.
    #[test]
    fn server_verification_catches_a_wrong_byte_and_tells_the_client() {
        for (test, what) in [
            (Test::WriteBw, "RDMA Write 7 on QP 0: byte 123 of 1000"),
            (Test::SendBw, "Send 7 on QP 0: byte 123 of 1000"),
        ] {
            let (a, b) = vwire_pair(PairConfig::default()).unwrap();
            let args = ["--vwire", "--verify", "-s", "1000", "-n", "20"];
            let o = parse(test, args.iter().map(Into::into).collect()).unwrap();
            let p = Params::of(test, &o);
            let addr = SocketAddr::from((Ipv4Addr::new(10, 77, 0, 2), o.port));
            let stop = AtomicBool::new(false);
            std::thread::scope(|sc| {
                let (tx, rx) = std::sync::mpsc::channel();
                let srv = sc.spawn(|| {
                    let listening = move |_| {
                        let _ = tx.send(());
                    };
                    server_session(&b, test, &o, addr, &stop, listening, "test")
                });
                rx.recv_timeout(SILENCE).unwrap();
                let c = make_side(&a, 1, 16, p.buf_len(false).unwrap(), true).unwrap();
                for k in 0..CTRL_RX {
                    post_ctrl_recv(&c, 0, k).unwrap();
                }
                let params = ConnectParams {
                    private_data: encode_request(&p, 0, &Remote::of(&c.buf)),
                    timeout: SILENCE,
                };
                c.qps[0].connect(addr, params).unwrap();
                let r = match c.qps[0].next_event(SILENCE).unwrap() {
                    CmEvent::Established { private_data, .. } => {
                        decode_accept(&private_data, &p).unwrap()
                    }
                    e => panic!("{e:?}"),
                };
                let mut scratch = Vec::new();
                // The right pattern, but for one byte of iteration 7 (its own slot).
                for seq in 0..8u64 {
                    let off = seq as usize * p.size;
                    put_pattern(&c.buf, off, p.size, tag(0, 0, seq), &mut scratch).unwrap();
                    if seq == 7 {
                        c.buf.write(off + 123, &[!scratch[123]]).unwrap();
                    }
                    let sge = c.buf.sge(off, p.size).unwrap();
                    let wr = match test {
                        Test::WriteBw => {
                            SendRequest::write(seq, vec![sge], r.rkey, r.addr + off as u64)
                        }
                        _ => SendRequest::send(seq, vec![sge]),
                    };
                    c.qps[0].post_send(wr).unwrap();
                    check(&c.scq.next(SILENCE).unwrap()).unwrap();
                }
                let e = client_finish(&p, &c, &[8], "").unwrap_err();
                assert!(
                    e.contains("the server reported: data verification failed"),
                    "{e}"
                );
                assert!(e.contains(what), "{e}");
                let se = srv.join().unwrap().unwrap_err();
                assert!(se.contains(what), "{se}");
            });
        }
    }

    #[test]
    fn buffer_layouts_hold_the_rings() {
        for t in Test::ALL {
            let p = Params {
                qps: if t.is_bw() { 2 } else { 1 },
                ..params(t)
            };
            assert!(p.buf_len(true).unwrap() >= p.size);
            assert!(p.buf_len(false).unwrap() >= p.size);
            assert!(p.rx() as u64 > GRANT - 1);
        }
        let huge = Params {
            size: 1 << 30,
            qps: 256,
            ..params(Test::WriteBw)
        };
        assert_eq!(huge.slots(), 1);
        assert_eq!(Test::from_code(0), None);
        for t in Test::ALL {
            assert_eq!(Test::from_code(t.code()), Some(t));
        }
    }
}
