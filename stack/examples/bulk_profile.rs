//! A bounded one-way bulk transfer between two engines on the virtual wire, for profiling
//! the TCP cores' cost per segment (e.g. under `valgrind --tool=callgrind`):
//!
//! ```text
//! cargo run --release -p xwarp-stack --example bulk_profile -- own 64
//! valgrind --tool=callgrind target/release/examples/bulk_profile smoltcp 16
//! ```
//!
//! Arguments: the TCP core (`own` or `smoltcp`) and the MiB to move (default 64). The
//! engines sleep as soon as they are idle (no spinning), so what a profile counts is the
//! work the transfer needs. The receiver checks every byte against the sender's pattern;
//! a mismatch, an error or a bad argument exits non-zero with a message.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xwarp_poll_driver::engine::{Engine, EngineConfig, EngineHandle, SpinBudget};
use xwarp_poll_driver::vwire::{VirtualNic, VirtualWire, WireConfig};
use xwarp_stack::{new_stack, StackConfig, StackHandle, Stream, TcpCore, TcpService};

type Handle = EngineHandle<VirtualNic, TcpService>;

/// The stream's byte at offset `off` (period [`PERIOD`], so the sender writes windows of
/// one buffer; 4093 is prime, so no power-of-two shift of the stream matches it).
fn pattern(off: u64) -> u8 {
    let o = off % PERIOD;
    (o.wrapping_mul(13) ^ (o >> 5)) as u8
}

const PERIOD: u64 = 4093;

fn start(nic: VirtualNic, last: u8, core: TcpCore) -> Result<(Handle, StackHandle), String> {
    let cfg = StackConfig {
        mac: [0x02, 0, 0, 0, 0, last],
        ipv4: Some((Ipv4Addr::new(10, 9, 0, last), 24)),
        rx_buffer: 1 << 20,
        tx_buffer: 1 << 20,
        ring_size: 256 << 10,
        tcp_core: core,
        ..StackConfig::default()
    };
    let (svc, h) = new_stack(cfg).map_err(|e| format!("stack: {e}"))?;
    let ecfg = EngineConfig {
        spin: SpinBudget::Iterations(0),
        ..EngineConfig::default()
    };
    let eng = Engine::spawn(ecfg, nic, svc).map_err(|e| format!("engine: {e}"))?;
    let bell = eng.doorbell();
    h.set_kick(std::sync::Arc::new(move || bell.ring()));
    Ok((eng, h))
}

fn wait(s: &mut Stream) -> Result<(), String> {
    s.wait(Some(Instant::now() + Duration::from_millis(50)))
        .map(|_| ())
        .map_err(|e| format!("wait: {e}"))
}

fn run(core: TcpCore, total: u64) -> Result<(), String> {
    let (na, nb) = VirtualWire::pair(WireConfig::default()).map_err(|e| format!("wire: {e}"))?;
    let (_ea, a) = start(na, 1, core)?;
    let (_eb, b) = start(nb, 2, core)?;
    let server = SocketAddr::from((Ipv4Addr::new(10, 9, 0, 2), 7200));
    let l = b
        .listen(server, 8, Duration::from_secs(5))
        .map_err(|e| format!("listen: {e}"))?;
    let mut c = a
        .connect(server, None, None)
        .map_err(|e| format!("connect: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.poll_connect().map_err(|e| format!("connect: {e}"))? {
        if Instant::now() > deadline {
            return Err("connect timed out".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut s = loop {
        match l.try_accept() {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    let t0 = Instant::now();
    let reader = std::thread::spawn(move || -> Result<u64, String> {
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0u64;
        loop {
            match s.try_read(&mut buf) {
                Ok(0) => return Ok(got),
                Ok(n) => {
                    for (k, &v) in buf[..n].iter().enumerate() {
                        if v != pattern(got + k as u64) {
                            return Err(format!("data mismatch at offset {}", got + k as u64));
                        }
                    }
                    got += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait(&mut s)?,
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    });
    let src: Vec<u8> = (0..(256u64 << 10) + PERIOD).map(pattern).collect();
    let mut sent = 0u64;
    while sent < total {
        let at = (sent % PERIOD) as usize;
        let n = ((total - sent) as usize).min(256 << 10);
        match c.try_write(&src[at..at + n]) {
            Ok(k) => sent += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait(&mut c)?,
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    c.shutdown_write().map_err(|e| format!("shutdown: {e}"))?;
    let got = reader.join().map_err(|_| "reader panicked".to_string())??;
    let secs = t0.elapsed().as_secs_f64();
    if got != total {
        return Err(format!("received {got} of {total} bytes"));
    }
    println!(
        "{core:?}: {} MiB one way in {secs:.2} s ({:.2} Gbit/s), {} segments of 1448 bytes",
        total >> 20,
        total as f64 * 8.0 / secs / 1e9,
        total.div_ceil(1448)
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let core = match args.first().map(String::as_str) {
        Some("own") => TcpCore::Own,
        Some("smoltcp") => TcpCore::Smoltcp,
        other => {
            eprintln!("usage: bulk_profile own|smoltcp [MiB] (got {other:?})");
            return ExitCode::from(2);
        }
    };
    let mib = match args.get(1).map(|v| v.parse::<u64>()) {
        None => 64,
        Some(Ok(m)) if (1..=4096).contains(&m) => m,
        Some(_) => {
            eprintln!("bulk_profile: MiB must be a number within 1..=4096");
            return ExitCode::from(2);
        }
    };
    match run(core, mib << 20) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bulk_profile: {e}");
            ExitCode::FAILURE
        }
    }
}
