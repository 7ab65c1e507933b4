//! The `afxdp-ceiling` row of `xwarp bench tcp`: how fast frames move between two AF_XDP
//! sockets over the benchmark's veth pair with no TCP at all.
//!
//! Any TCP stack on AF_XDP pays, per byte, at least what this row pays: the sender copies
//! the application's bytes into a frame once (as a socket `write` must), the kernel moves the
//! frame from the sending UMEM to the receiving UMEM (on a veth in copy mode: an skb copy, a
//! generic-XDP copy and the copy into the receiving UMEM, all on the sender's core), and the
//! receiver copies the payload out once (as a socket `read` must). Everything TCP adds —
//! segmentation, ACK frames, checksums, timers, the engine↔application queues — comes on top.
//! So this row is an upper bound for `xwarp-xwarp` and `xwarp-kernel` on the same pair, and
//! its ratio to `kernel-kernel` says what the TCP engine could reach at best on this path.
//!
//! The frames are IPv4/UDP (UDP checksum 0, as RFC 768 allows) from the side-A engine
//! address to the side-B one, so the side-B steering program redirects them exactly like
//! the TCP rows' segments. Flow control replaces TCP's window without costing frames: the
//! receiver publishes the next sequence number it expects through shared memory, and the
//! sender keeps at most half as many frames beyond it as the receiver's RX chunks hold (so
//! the kernel does not drop for want of buffers; a loss is reported). Every frame carries a
//! sequence number; the receiver checks the pattern bytes at both ends of every payload
//! against the stream offset the sequence number gives and counts sequence gaps as losses.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use std::{io, thread};

use smoltcp::phy::{Device, RxToken, TxToken};

use super::common::{pattern, thread_cpu, PATTERN_PERIOD};
use xwarp::poll_driver::afxdp::{
    AfXdpConfig, AfXdpNic, SteeringFilter, TxChecksumOffload, XdpMode,
};
use xwarp::poll_driver::backend::Backend;
use xwarp::poll_driver::netns::NetNs;

/// Ethernet + IPv4 + UDP header bytes in front of the payload.
const HEADERS: usize = 14 + 20 + 8;
/// Sequence number bytes at the start of every payload.
const SEQ_LEN: usize = 8;
/// UDP port pair of the ceiling's frames.
const PORT: u16 = 5203;
/// How long the receiver waits for more frames after the sender stopped.
const DRAIN: Duration = Duration::from_millis(50);
/// Bound on a run beyond its duration (a receiver that never sees a frame gives up).
const GRACE: Duration = Duration::from_secs(10);

/// One side of the ceiling run.
pub struct Side<'a> {
    /// Namespace the interface lives in.
    pub ns: &'a NetNs,
    /// Interface the AF_XDP socket binds to.
    pub ifname: &'a str,
    /// The side's engine address (steered to the socket on side B).
    pub ip: Ipv4Addr,
    /// Core to pin the side's thread to.
    pub core: Option<usize>,
}

/// Settings shared by both sides.
pub struct Settings {
    /// IP MTU of the pair: every frame carries an IP packet of exactly this size.
    pub mtu: usize,
    /// XDP attach mode (as the engines use).
    pub mode: XdpMode,
    /// How long the sender sends.
    pub duration: Duration,
}

/// What one side did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    /// Payload bytes (excluding the sequence number) sent or received in order.
    pub bytes: u64,
    /// Frames sent or received.
    pub frames: u64,
    /// From the first to the last frame.
    pub elapsed: Duration,
    /// CPU time of the side's thread (user + system).
    pub cpu: Duration,
}

/// Result of one ceiling run.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// The sender.
    pub sent: Tally,
    /// The receiver.
    pub received: Tally,
    /// Sequence numbers the receiver never saw.
    pub lost: u64,
}

fn nic_config(side: &Side<'_>, s: &Settings) -> AfXdpConfig {
    let mut cfg = AfXdpConfig::new(side.ifname, SteeringFilter::new(vec![side.ip], Vec::new()));
    cfg.mode = s.mode;
    // The frames go out exactly as written (UDP checksum 0).
    cfg.tx_checksum = TxChecksumOffload::Off;
    // Frames larger than a chunk: multi-buffer (descriptor chains).
    (cfg.chunk, cfg.multi_buffer) = super::common::umem_for_mtu(s.mtu);
    cfg
}

fn pin(core: Option<usize>) {
    if let Some(id) = core {
        core_affinity::set_for_current(core_affinity::CoreId { id });
    }
}

/// Ethernet/IPv4/UDP headers of every frame (IPv4 checksum filled; the IP ID stays 0 with DF).
fn headers(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    mtu: usize,
) -> [u8; HEADERS] {
    let mut h = [0u8; HEADERS];
    h[0..6].copy_from_slice(&dst_mac);
    h[6..12].copy_from_slice(&src_mac);
    h[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut h[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(mtu as u16).to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    smoltcp::wire::Ipv4Packet::new_unchecked(ip).fill_checksum();
    let udp = &mut h[34..42];
    udp[0..2].copy_from_slice(&PORT.to_be_bytes());
    udp[2..4].copy_from_slice(&PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&((mtu - 20) as u16).to_be_bytes());
    h
}

/// Run the ceiling once: side A sends for `s.duration`, side B receives.
pub fn run(a: &Side<'_>, b: &Side<'_>, s: &Settings) -> io::Result<Outcome> {
    if s.mtu < 576 || s.mtu > u16::MAX as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("MTU {} out of range", s.mtu),
        ));
    }
    let cfg_a = nic_config(a, s);
    let cfg_b = nic_config(b, s);
    // Window: half of the frames the receiver's RX chunks hold (multi-buffer frames take
    // several chunks each).
    let chunks_per_frame = (s.mtu + 14).div_ceil(cfg_b.chunk.max_frame_size()).max(1) as u64;
    let window = (u64::from(cfg_b.rx_frames) / chunks_per_frame / 2).max(1);
    let mut nic_a = a.ns.run(move || AfXdpNic::open(cfg_a))??;
    let mut nic_b = b.ns.run(move || AfXdpNic::open(cfg_b))??;
    let hdr = headers(nic_a.mac_address(), nic_b.mac_address(), a.ip, b.ip, s.mtu);
    let payload = s.mtu - 28 - SEQ_LEN;
    let next_expected = Arc::new(AtomicU64::new(0));
    let sender_done = Arc::new(AtomicBool::new(false));
    let receiver_ready = Arc::new(AtomicBool::new(false));

    let (core_b, ne, done, ready) = (
        b.core,
        next_expected.clone(),
        sender_done.clone(),
        receiver_ready.clone(),
    );
    let max_run = s.duration + GRACE;
    let receiver = thread::Builder::new().name("ceiling-rx".into()).spawn(
        move || -> io::Result<(Tally, u64)> {
            pin(core_b);
            let cpu0 = thread_cpu();
            let mut sink = vec![0u8; 256 << 10];
            let mut at = 0usize;
            let (mut t0, mut t_last) = (None::<Instant>, Instant::now());
            let (mut tally, mut lost, mut next) = (Tally::default(), 0u64, 0u64);
            let mut bad: Option<String> = None;
            let start = Instant::now();
            ready.store(true, Ordering::Release);
            loop {
                nic_b.poll_rx()?;
                let mut got = false;
                let before = tally.bytes;
                while let Some((rx, _)) = nic_b.receive(smoltcp::time::Instant::now()) {
                    got = true;
                    rx.consume(|f: &[u8]| {
                        if f.len() != HEADERS + SEQ_LEN + payload || f[36..38] != PORT.to_be_bytes()
                        {
                            return;
                        }
                        let mut seq = [0u8; SEQ_LEN];
                        seq.copy_from_slice(&f[HEADERS..HEADERS + SEQ_LEN]);
                        let seq = u64::from_le_bytes(seq);
                        if seq < next {
                            return; // never happens on a veth; not counted twice if it did
                        }
                        let data = &f[HEADERS + SEQ_LEN..];
                        let off = seq * payload as u64;
                        if bad.is_none()
                            && (data[0] != pattern(off)
                                || data[payload - 1] != pattern(off + payload as u64 - 1))
                        {
                            bad = Some(format!("payload of frame {seq} is not the pattern"));
                        }
                        // The one copy a socket read makes.
                        if at + payload > sink.len() {
                            at = 0;
                        }
                        sink[at..at + payload].copy_from_slice(data);
                        at += payload;
                        lost += seq - next;
                        next = seq + 1;
                        tally.frames += 1;
                        tally.bytes += payload as u64;
                    });
                }
                nic_b.flush()?;
                super::progress::add(tally.bytes - before);
                let now = Instant::now();
                if got {
                    ne.store(next, Ordering::Release);
                    t0.get_or_insert(now);
                    t_last = now;
                } else if (done.load(Ordering::Acquire)
                    && now - t_last > DRAIN
                    && (t0.is_some() || now - start > DRAIN))
                    || now - start > max_run
                {
                    break;
                }
            }
            tally.elapsed = t0.map(|t| t_last - t).unwrap_or_default();
            tally.cpu = thread_cpu() - cpu0;
            std::hint::black_box(&sink);
            match bad {
                Some(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
                None => Ok((tally, lost)),
            }
        },
    )?;

    let (core_a, duration) = (a.core, s.duration);
    let sender =
        thread::Builder::new()
            .name("ceiling-tx".into())
            .spawn(move || -> io::Result<Tally> {
                pin(core_a);
                while !receiver_ready.load(Ordering::Acquire) {
                    thread::yield_now();
                }
                let cpu0 = thread_cpu();
                // Source of the application bytes: one pattern period plus a payload, so every
                // payload is one window into it (as the TCP rows' sender does).
                let period = PATTERN_PERIOD;
                let src: Vec<u8> = (0..period + payload as u64).map(pattern).collect();
                let mut tally = Tally::default();
                let t0 = Instant::now();
                let mut seq = 0u64;
                while t0.elapsed() < duration {
                    while seq - next_expected.load(Ordering::Acquire) < window {
                        let Some(tx) = nic_a.transmit(smoltcp::time::Instant::now()) else {
                            break;
                        };
                        let from = ((seq * payload as u64) % period) as usize;
                        tx.consume(HEADERS + SEQ_LEN + payload, |f: &mut [u8]| {
                            f[..HEADERS].copy_from_slice(&hdr);
                            f[HEADERS..HEADERS + SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
                            // The one copy a socket write makes.
                            f[HEADERS + SEQ_LEN..].copy_from_slice(&src[from..from + payload]);
                        });
                        seq += 1;
                        tally.frames += 1;
                        tally.bytes += payload as u64;
                    }
                    if let Err(e) = nic_a.flush() {
                        sender_done.store(true, Ordering::Release);
                        return Err(e);
                    }
                }
                let flushed = nic_a.flush();
                tally.elapsed = t0.elapsed();
                tally.cpu = thread_cpu() - cpu0;
                sender_done.store(true, Ordering::Release);
                flushed.map(|()| tally)
            })?;
    let sent = sender
        .join()
        .map_err(|_| io::Error::other("ceiling sender panicked"));
    let received = receiver
        .join()
        .map_err(|_| io::Error::other("ceiling receiver panicked"))?;
    let sent = sent??;
    let (received, lost) = received?;
    if received.frames == 0 {
        return Err(io::Error::other(format!(
            "afxdp-ceiling: {} frames sent, none arrived",
            sent.frames
        )));
    }
    Ok(Outcome {
        sent,
        received,
        lost,
    })
}

/// UDP payload of one ping-pong frame (as the TCP rows' 64-byte messages).
pub const PING_PAYLOAD: usize = 64;
/// How long side A waits for a reply before sending the request again.
const PING_RESEND: Duration = Duration::from_millis(200);
/// Resends of one request before the ping-pong gives up.
const PING_TRIES: u32 = 10;

/// Settings of one ceiling ping-pong run.
pub struct PingSettings {
    /// XDP attach mode (as the engines use).
    pub mode: XdpMode,
    /// Round trips before the measured ones.
    pub warmup: u64,
    /// At most this many measured round trips.
    pub rounds: u64,
    /// At most this long for the measured round trips.
    pub duration: Duration,
}

/// Result of one ceiling ping-pong run.
pub struct PingOutcome {
    /// Half round trips of the measured round trips, ns.
    pub half_rtt_ns: hdrhistogram::Histogram<u64>,
    /// Requests sent again after [`PING_RESEND`] without a reply.
    pub resent: u64,
}

/// The payload of ping-pong request `seq` (`reply`: of its reply): the sequence number, a
/// direction byte, then pattern bytes at an offset both give.
pub fn ping_payload(seq: u64, reply: bool) -> [u8; PING_PAYLOAD] {
    let mut p = [0u8; PING_PAYLOAD];
    p[..SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
    p[SEQ_LEN] = u8::from(reply);
    let base = seq * PING_PAYLOAD as u64 + u64::from(reply) * 7;
    for (i, b) in p[SEQ_LEN + 1..].iter_mut().enumerate() {
        *b = pattern(base + i as u64);
    }
    p
}

/// Check a received ping-pong frame: `Some(seq)` if it is a UDP frame of the ceiling's port
/// whose payload is exactly [`ping_payload`]`(seq, reply)`, `None` for other frames; an error
/// for a ceiling frame with a wrong payload.
pub fn check_ping(frame: &[u8], reply: bool) -> io::Result<Option<u64>> {
    if frame.len() != HEADERS + PING_PAYLOAD
        || frame[12..14] != 0x0800u16.to_be_bytes()
        || frame[23] != 17
        || frame[36..38] != PORT.to_be_bytes()
    {
        return Ok(None);
    }
    let data = &frame[HEADERS..];
    let mut seq = [0u8; SEQ_LEN];
    seq.copy_from_slice(&data[..SEQ_LEN]);
    let seq = u64::from_le_bytes(seq);
    if data != ping_payload(seq, reply) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "ping-pong {} {seq}: payload is not the pattern",
                if reply { "reply" } else { "request" }
            ),
        ));
    }
    Ok(Some(seq))
}

/// Send one frame of `hdr` + `payload` (spinning until a TX slot is free, bounded).
fn send_frame(nic: &mut AfXdpNic, hdr: &[u8; HEADERS], payload: &[u8]) -> io::Result<()> {
    let t0 = Instant::now();
    loop {
        if let Some(tx) = nic.transmit(smoltcp::time::Instant::now()) {
            tx.consume(HEADERS + payload.len(), |f: &mut [u8]| {
                f[..HEADERS].copy_from_slice(hdr);
                f[HEADERS..].copy_from_slice(payload);
            });
            return nic.flush();
        }
        nic.flush()?;
        nic.poll_rx()?;
        if t0.elapsed() > Duration::from_secs(1) {
            return Err(io::Error::other("ceiling ping-pong: no TX slot for 1 s"));
        }
    }
}

/// The latency ceiling: 64-byte UDP ping-pong between two raw AF_XDP sockets, side A's
/// request to side B's engine address, B's reply back, both threads spinning on their
/// rings (no TCP, no wakeups). Every request and reply payload is checked.
pub fn pingpong(a: &Side<'_>, b: &Side<'_>, s: &PingSettings) -> io::Result<PingOutcome> {
    let ip_len = 20 + 8 + PING_PAYLOAD;
    let cfg = |side: &Side<'_>| {
        let mut cfg = nic_config(
            side,
            &Settings {
                mtu: 1500,
                mode: s.mode,
                duration: Duration::ZERO,
            },
        );
        cfg.rx_frames = cfg.rx_frames.min(512);
        cfg
    };
    let (cfg_a, cfg_b) = (cfg(a), cfg(b));
    let mut nic_a = a.ns.run(move || AfXdpNic::open(cfg_a))??;
    let mut nic_b = b.ns.run(move || AfXdpNic::open(cfg_b))??;
    let (mac_a, mac_b) = (nic_a.mac_address(), nic_b.mac_address());
    let req_hdr = headers(mac_a, mac_b, a.ip, b.ip, ip_len);
    let rep_hdr = headers(mac_b, mac_a, b.ip, a.ip, ip_len);
    let done = Arc::new(AtomicBool::new(false));
    let max_run = s.duration + GRACE;

    let (core_b, done_b) = (b.core, done.clone());
    let server =
        thread::Builder::new()
            .name("ceiling-pong".into())
            .spawn(move || -> io::Result<u64> {
                pin(core_b);
                let (start, mut echoed) = (Instant::now(), 0u64);
                while !done_b.load(Ordering::Acquire) {
                    if start.elapsed() > max_run {
                        return Err(io::Error::other("ceiling pong: run exceeded its bound"));
                    }
                    nic_b.poll_rx()?;
                    let mut seen = Vec::new();
                    while let Some((rx, _)) = nic_b.receive(smoltcp::time::Instant::now()) {
                        let r = rx.consume(|f: &[u8]| check_ping(f, false));
                        if let Some(seq) = r? {
                            seen.push(seq);
                        }
                    }
                    for seq in seen {
                        send_frame(&mut nic_b, &rep_hdr, &ping_payload(seq, true))?;
                        echoed += 1;
                    }
                }
                Ok(echoed)
            })?;

    let (core_a, sc) = (a.core, (s.warmup, s.rounds, s.duration));
    let client = thread::Builder::new().name("ceiling-ping".into()).spawn(
        move || -> io::Result<PingOutcome> {
            pin(core_a);
            let (warmup, rounds, duration) = sc;
            let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)
                .map_err(|e| io::Error::other(e.to_string()))?;
            let mut resent = 0u64;
            let mut t_end = None;
            let mut seq = 0u64;
            loop {
                let req = ping_payload(seq, false);
                let mut tries = 0;
                let rtt = 'reply: loop {
                    let t = Instant::now();
                    send_frame(&mut nic_a, &req_hdr, &req)?;
                    while t.elapsed() < PING_RESEND {
                        nic_a.poll_rx()?;
                        let mut got = false;
                        while let Some((rx, _)) = nic_a.receive(smoltcp::time::Instant::now()) {
                            // Stale replies (of a resent request) are skipped.
                            got |= rx.consume(|f: &[u8]| check_ping(f, true))? == Some(seq);
                        }
                        if got {
                            break 'reply t.elapsed();
                        }
                    }
                    tries += 1;
                    resent += 1;
                    if tries >= PING_TRIES {
                        return Err(io::Error::other(format!(
                            "ceiling ping-pong: no reply to request {seq} after {tries} tries"
                        )));
                    }
                };
                seq += 1;
                if seq == warmup {
                    t_end = Some(Instant::now() + duration);
                }
                if seq > warmup {
                    h.record((rtt.as_nanos() / 2).max(1) as u64)
                        .map_err(|e| io::Error::other(e.to_string()))?;
                    if h.len() >= rounds || t_end.is_some_and(|e| Instant::now() >= e) {
                        break;
                    }
                }
            }
            Ok(PingOutcome {
                half_rtt_ns: h,
                resent,
            })
        },
    );
    let out = match client {
        Ok(c) => c
            .join()
            .map_err(|_| io::Error::other("ceiling ping panicked")),
        Err(e) => Err(e),
    };
    done.store(true, Ordering::Release);
    let echoed = server
        .join()
        .map_err(|_| io::Error::other("ceiling pong panicked"))?;
    let out = out??;
    echoed?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc791_ceiling_headers_carry_a_valid_ipv4_checksum_and_udp_length() {
        let h = headers(
            [2; 6],
            [4; 6],
            Ipv4Addr::new(10, 88, 90, 10),
            Ipv4Addr::new(10, 88, 90, 20),
            1500,
        );
        let ip = smoltcp::wire::Ipv4Packet::new_unchecked(&h[14..34]);
        assert!(ip.verify_checksum());
        assert_eq!(ip.total_len(), 1500);
        assert_eq!(ip.next_header(), smoltcp::wire::IpProtocol::Udp);
        assert_eq!(u16::from_be_bytes([h[38], h[39]]), 1480);
        assert_eq!(&h[0..6], &[4; 6]);
    }

    #[test]
    fn ping_payload_check_accepts_its_own_frames_and_rejects_bad_ones() {
        let h = headers([2; 6], [4; 6], Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 92);
        let frame = |p: [u8; PING_PAYLOAD]| [&h[..], &p[..]].concat();
        assert_eq!(
            check_ping(&frame(ping_payload(7, false)), false).unwrap(),
            Some(7)
        );
        assert_eq!(
            check_ping(&frame(ping_payload(7, true)), true).unwrap(),
            Some(7)
        );
        // A reply is not a request (direction byte and pattern offset differ).
        assert!(check_ping(&frame(ping_payload(7, true)), false).is_err());
        let mut bad = frame(ping_payload(9, false));
        bad[HEADERS + 40] ^= 1;
        assert!(check_ping(&bad, false).is_err());
        // Not a ceiling frame: ignored.
        assert_eq!(check_ping(&bad[..bad.len() - 1], false).unwrap(), None);
        assert_ne!(ping_payload(1, false), ping_payload(2, false));
    }
}
