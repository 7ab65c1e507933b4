//! The latency ceiling: 64-byte UDP ping-pong between two raw AF_XDP sockets (the
//! project's [`AfXdpNic`], no TCP) on the two ends of the bench's veth pair, both sides
//! spinning on their rings (no sleep). Any engine on this path pays at least this per
//! half round trip, so it is the bound of every latency ratio in the same run.
//!
//! Side A sends a frame to side B's engine address (steered to B's socket), B copies the
//! payload and sends it back to A's address (steered to A's socket); A checks every byte
//! of the echo. `warmup` round trips first, then `round_trips` measured ones (or fewer
//! when `max_time` ends first). Every wait is bounded by [`WAIT`].

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use smoltcp::phy::{Device, RxToken, TxToken};

use super::{headers, nic_config, pin, Settings as BulkSettings, Side, HEADERS, PORT};
use crate::bench::common::pattern;
use xwarp::poll_driver::afxdp::{AfXdpNic, XdpMode};
use xwarp::poll_driver::backend::Backend;

/// Longest wait for one echo (or for the first request on side B).
pub const WAIT: Duration = Duration::from_secs(2);

/// Settings of a ping-pong run.
pub struct PingSettings {
    /// UDP payload bytes (at least 8: the sequence number leads it).
    pub size: usize,
    /// Round trips before measuring.
    pub warmup: u64,
    /// Measured round trips (at most).
    pub round_trips: u64,
    /// Bound on the measured part.
    pub max_time: Duration,
    /// XDP attach mode.
    pub mode: XdpMode,
}

/// The measured round trips.
#[derive(Debug, Clone)]
pub struct PingOutcome {
    /// Every measured round trip, in order.
    pub rtts: Vec<Duration>,
}

/// Percentiles (p50, p90, p99) of the half round trips, µs (nearest-rank). `None` when
/// there are no samples.
pub fn half_rtt_percentiles_us(rtts: &[Duration]) -> Option<(f64, f64, f64)> {
    if rtts.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = rtts.iter().map(|d| d.as_secs_f64() * 1e6 / 2.0).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let q = |f: f64| v[((f * n as f64).ceil() as usize).clamp(1, n) - 1];
    Some((q(0.50), q(0.90), q(0.99)))
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Run the ping-pong once between `a` (client) and `b` (echo).
pub fn run(a: &Side<'_>, b: &Side<'_>, s: &PingSettings) -> io::Result<PingOutcome> {
    if s.size < 8 || s.size > 1400 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("ping-pong payload {} out of 8..=1400", s.size),
        ));
    }
    let ip_len = 28 + s.size;
    let bulk = BulkSettings {
        mtu: 1500,
        mode: s.mode,
        duration: Duration::ZERO,
    };
    let (cfg_a, cfg_b) = (nic_config(a, &bulk), nic_config(b, &bulk));
    let mut nic_a = a.ns.run(move || AfXdpNic::open(cfg_a))??;
    let mut nic_b = b.ns.run(move || AfXdpNic::open(cfg_b))??;
    let hdr_ab = headers(nic_a.mac_address(), nic_b.mac_address(), a.ip, b.ip, ip_len);
    let hdr_ba = headers(nic_b.mac_address(), nic_a.mac_address(), b.ip, a.ip, ip_len);
    let frame_len = HEADERS + s.size;
    let total = s.warmup + s.round_trips;
    let done = Arc::new(AtomicBool::new(false));
    let (core_b, stop) = (b.core, done.clone());
    let echo =
        thread::Builder::new()
            .name("ceiling-pong".into())
            .spawn(move || -> io::Result<u64> {
                pin(core_b);
                let mut buf = vec![0u8; frame_len];
                let mut echoed = 0u64;
                let mut last = Instant::now();
                while !stop.load(Ordering::Acquire) {
                    nic_b.poll_rx()?;
                    let mut got = false;
                    while let Some((rx, tx)) = nic_b.receive(smoltcp::time::Instant::now()) {
                        let ok = rx.consume(|f: &[u8]| {
                            if f.len() != frame_len || f[36..38] != PORT.to_be_bytes() {
                                return false;
                            }
                            buf[HEADERS..].copy_from_slice(&f[HEADERS..]);
                            true
                        });
                        if ok {
                            tx.consume(frame_len, |f: &mut [u8]| {
                                f[..HEADERS].copy_from_slice(&hdr_ba);
                                f[HEADERS..].copy_from_slice(&buf[HEADERS..]);
                            });
                            echoed += 1;
                            got = true;
                        }
                    }
                    if got {
                        nic_b.flush()?;
                        last = Instant::now();
                    } else if last.elapsed() > WAIT {
                        break;
                    }
                }
                Ok(echoed)
            })?;
    pin(a.core);
    let client = (|| -> io::Result<Vec<Duration>> {
        let mut rtts = Vec::with_capacity(s.round_trips.min(1 << 22) as usize);
        let mut msg = vec![0u8; s.size];
        let mut measure_end = None;
        for seq in 0..total {
            msg[..8].copy_from_slice(&seq.to_le_bytes());
            for (k, m) in msg[8..].iter_mut().enumerate() {
                *m = pattern(seq.wrapping_mul(977).wrapping_add(k as u64));
            }
            let t = Instant::now();
            let tx = nic_a
                .transmit(smoltcp::time::Instant::now())
                .ok_or_else(|| io::Error::other("ceiling ping: no TX frame"))?;
            tx.consume(frame_len, |f: &mut [u8]| {
                f[..HEADERS].copy_from_slice(&hdr_ab);
                f[HEADERS..].copy_from_slice(&msg);
            });
            nic_a.flush()?;
            // Spin until the echo of `seq` is back.
            let mut back = None;
            while back.is_none() {
                nic_a.poll_rx()?;
                while let Some((rx, _)) = nic_a.receive(smoltcp::time::Instant::now()) {
                    let r = rx.consume(|f: &[u8]| {
                        (f.len() == frame_len && f[36..38] == PORT.to_be_bytes())
                            .then(|| f[HEADERS..] == msg[..])
                    });
                    if let Some(same) = r {
                        back = Some(same);
                    }
                }
                if back.is_none() && t.elapsed() > WAIT {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("ceiling ping {seq}: no echo within {WAIT:?}"),
                    ));
                }
            }
            let rtt = t.elapsed();
            if back != Some(true) {
                return Err(bad(format!("ceiling ping {seq}: echo differs")));
            }
            if seq + 1 == s.warmup {
                measure_end = Some(Instant::now() + s.max_time);
            }
            if seq >= s.warmup {
                rtts.push(rtt);
                if measure_end.is_some_and(|e| Instant::now() >= e) {
                    break;
                }
            }
        }
        Ok(rtts)
    })();
    done.store(true, Ordering::Release);
    let echoed = echo
        .join()
        .map_err(|_| io::Error::other("ceiling echo panicked"))?;
    let rtts = client?;
    let echoed = echoed?;
    if echoed < s.warmup + rtts.len() as u64 {
        return Err(bad(format!(
            "ceiling echo: {echoed} echoes for {} round trips",
            s.warmup + rtts.len() as u64
        )));
    }
    Ok(PingOutcome { rtts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_rtt_percentiles_are_nearest_rank_of_half_the_round_trip() {
        let v: Vec<Duration> = (1..=100).map(|i| Duration::from_micros(2 * i)).collect();
        let (p50, p90, p99) = half_rtt_percentiles_us(&v).unwrap();
        assert!((p50 - 50.0).abs() < 1e-9, "{p50}");
        assert!((p90 - 90.0).abs() < 1e-9, "{p90}");
        assert!((p99 - 99.0).abs() < 1e-9, "{p99}");
        let one = half_rtt_percentiles_us(&[Duration::from_micros(10)]).unwrap();
        assert_eq!(one, (5.0, 5.0, 5.0));
        assert!(half_rtt_percentiles_us(&[]).is_none());
    }

    /// 1000 round trips between two AF_XDP sockets on a fresh veth pair, every echo
    /// checked byte for byte (root and AF_XDP needed; skipped loudly otherwise).
    #[test]
    fn ceiling_pingpong_round_trips_come_back_intact() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED ceiling_pingpong_round_trips_come_back_intact: needs root");
            return;
        }
        let veth = match xwarp::poll_driver::netns::VethPair::new(97) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("SKIPPED ceiling_pingpong_round_trips_come_back_intact: veth: {e}");
                return;
            }
        };
        let (ia, ib) = (
            std::net::Ipv4Addr::new(10, 88, 97, 10),
            std::net::Ipv4Addr::new(10, 88, 97, 20),
        );
        let a = Side {
            ns: &veth.a,
            ifname: &veth.if_a,
            ip: ia,
            core: None,
        };
        let b = Side {
            ns: &veth.b,
            ifname: &veth.if_b,
            ip: ib,
            core: None,
        };
        let s = PingSettings {
            size: 64,
            warmup: 100,
            round_trips: 1000,
            max_time: Duration::from_secs(20),
            mode: XdpMode::Generic,
        };
        match run(&a, &b, &s) {
            Ok(out) => {
                assert_eq!(out.rtts.len(), 1000);
                let (p50, _, p99) = half_rtt_percentiles_us(&out.rtts).unwrap();
                eprintln!("ceiling ping-pong: half RTT p50 {p50:.2} µs p99 {p99:.2} µs");
                assert!(p50 > 0.0 && p99 >= p50);
            }
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                eprintln!("SKIPPED ceiling_pingpong_round_trips_come_back_intact: {e}");
            }
            Err(e) => panic!("ceiling ping-pong: {e}"),
        }
    }
}
