//! The attack lab: a victim engine whose NIC ([`TapNic`]) forwards its frames to and from a
//! legitimate peer engine over the virtual wire and, beside them, lets a raw attacker inject
//! crafted frames and capture the victim's answers to spoofed addresses; a legitimate TCP
//! flow with verified data whose throughput is measured; memory and stats snapshots.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use smoltcp::phy::{Device, DeviceCapabilities};
use std::sync::mpsc::{sync_channel as bounded, Receiver, SyncSender as Sender};
use xwarp::net::{TcpListener, TcpStream};
use xwarp::poll_driver::backend::{Backend, BackendStats};
use xwarp::poll_driver::engine::EngineConfig;
use xwarp::poll_driver::vwire::{VirtualNic, VirtualWire, WireConfig};
use xwarp::stack::{StackConfig, StackStats};
use xwarp::verbs::Context;

use super::knobs;

/// The victim's address (10.77.0.2).
pub const VICTIM_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// The legitimate peer's address (10.77.0.1); the iWARP-level attacker connects from it too.
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The victim's Ethernet address.
pub const VICTIM_MAC: [u8; 6] = [0x02, 0x78, 0x77, 0x00, 0x00, 0x02];
/// The peer's Ethernet address.
pub const PEER_MAC: [u8; 6] = [0x02, 0x78, 0x77, 0x00, 0x00, 0x01];
/// The Ethernet address the tap answers ARP with for every spoofed source.
pub const ATTACKER_MAC: [u8; 6] = [0x02, 0x66, 0x66, 0x66, 0x66, 0x66];
/// Port of the victim's legitimate TCP listener.
pub const LEGIT_PORT: u16 = 7000;

/// The victim's NIC: the virtual wire to the peer plus a raw injection queue, with the
/// victim's frames to [`ATTACKER_MAC`] diverted to a capture queue and ARP requests for any
/// address but the peer's answered with [`ATTACKER_MAC`].
pub struct TapNic {
    wire: VirtualNic,
    inject: Receiver<Vec<u8>>,
    capture: Sender<Vec<u8>>,
    captured_lost: Arc<AtomicU64>,
    local: VecDeque<Vec<u8>>,
    scratch: Vec<u8>,
}

/// The attacker's side of a [`TapNic`]: inject frames, read the victim's answers.
pub struct RawPort {
    inject: Sender<Vec<u8>>,
    capture: Receiver<Vec<u8>>,
    captured_lost: Arc<AtomicU64>,
}

impl RawPort {
    /// Queue one crafted frame for the victim (blocks while the queue is full).
    pub fn send(&self, frame: Vec<u8>) {
        let _ = self.inject.send(frame);
    }

    /// Take every frame the victim sent to the attacker so far.
    pub fn drain(&self) -> Vec<Vec<u8>> {
        self.capture.try_iter().collect()
    }

    /// Frames the victim sent to the attacker that the capture queue had no room for.
    pub fn lost(&self) -> u64 {
        self.captured_lost.load(Ordering::Relaxed)
    }
}

/// Receive token of a [`TapNic`] (owns its frame).
pub struct TapRx(Vec<u8>);

/// Transmit token of a [`TapNic`].
pub struct TapTx<'a>(&'a mut TapNic);

impl smoltcp::phy::RxToken for TapRx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for TapTx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.0.route(buf);
        r
    }
}

impl TapNic {
    fn route(&mut self, frame: Vec<u8>) {
        if frame.len() >= 42 && frame[12..14] == [0x08, 0x06] && frame[20..22] == [0, 1] {
            let target = Ipv4Addr::new(frame[38], frame[39], frame[40], frame[41]);
            if target != PEER_IP {
                self.local.push_back(arp_reply(&frame));
                return;
            }
        }
        if frame.len() >= 6 && frame[..6] == ATTACKER_MAC {
            if self.capture.try_send(frame).is_err() {
                self.captured_lost.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        self.wire.send_frame(&frame);
    }

    /// Whether a synthesized or injected frame waits (moves one injected frame to `local`).
    fn injected_ready(&mut self) -> bool {
        if self.local.is_empty() {
            if let Ok(f) = self.inject.try_recv() {
                self.local.push_back(f);
            }
        }
        !self.local.is_empty()
    }

    fn next_frame(&mut self) -> Option<Vec<u8>> {
        if let Some(f) = self.local.pop_front() {
            return Some(f);
        }
        if let Ok(f) = self.inject.try_recv() {
            return Some(f);
        }
        if self.wire.recv_frame(&mut self.scratch) {
            return Some(self.scratch.clone());
        }
        None
    }
}

/// An ARP reply to the request `req` saying its target address is at [`ATTACKER_MAC`].
fn arp_reply(req: &[u8]) -> Vec<u8> {
    let mut r = vec![0u8; 42];
    r[..6].copy_from_slice(&req[6..12]);
    r[6..12].copy_from_slice(&ATTACKER_MAC);
    r[12..14].copy_from_slice(&[0x08, 0x06]);
    r[14..20].copy_from_slice(&[0, 1, 0x08, 0, 6, 4]);
    r[20..22].copy_from_slice(&[0, 2]);
    r[22..28].copy_from_slice(&ATTACKER_MAC);
    r[28..32].copy_from_slice(&req[38..42]);
    r[32..38].copy_from_slice(&req[22..28]);
    r[38..42].copy_from_slice(&req[28..32]);
    r
}

impl Device for TapNic {
    type RxToken<'a> = TapRx;
    type TxToken<'a> = TapTx<'a>;

    fn receive(
        &mut self,
        _timestamp: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let f = self.next_frame()?;
        Some((TapRx(f), TapTx(self)))
    }

    fn transmit(&mut self, _timestamp: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(TapTx(self))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.wire.capabilities()
    }
}

impl Backend for TapNic {
    fn flush(&mut self) -> io::Result<()> {
        self.wire.flush()
    }

    fn poll_rx(&mut self) -> io::Result<bool> {
        Ok(self.wire.poll_rx()? || self.injected_ready())
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.wire.wait_fd()
    }

    fn prepare_sleep(&mut self) -> io::Result<bool> {
        // Injected frames do not ring the wire's eventfd: the victim's engine runs with a
        // short `max_sleep` (see [`Lab::new`]) so it picks them up within a millisecond.
        if self.injected_ready() {
            return Ok(false);
        }
        self.wire.prepare_sleep()
    }

    fn stats(&self) -> BackendStats {
        self.wire.stats()
    }
}

/// A victim engine, a legitimate peer engine and the raw attacker port.
pub struct Lab {
    /// The engine under attack (verbs and sockets).
    pub victim: Context<TapNic>,
    /// The legitimate peer; the iWARP-level attacker's TCP connections start here too.
    pub peer: Context<VirtualNic>,
    /// Raw frames to and from the victim.
    pub raw: RawPort,
}

impl Lab {
    /// Start both engines; the victim's stack gets [`knobs::victim_stack`].
    pub fn new() -> io::Result<Lab> {
        let (p_nic, v_nic) = VirtualWire::pair(WireConfig::default())?;
        let (inject_tx, inject_rx) = bounded(4096);
        let (cap_tx, cap_rx) = bounded(1 << 16);
        let lost = Arc::new(AtomicU64::new(0));
        let tap = TapNic {
            wire: v_nic,
            inject: inject_rx,
            capture: cap_tx,
            captured_lost: lost.clone(),
            local: VecDeque::new(),
            scratch: Vec::new(),
        };
        let mut vcfg = StackConfig {
            mac: VICTIM_MAC,
            ipv4: Some((VICTIM_IP, 24)),
            ..StackConfig::default()
        };
        knobs::victim_stack(&mut vcfg);
        let pcfg = StackConfig {
            mac: PEER_MAC,
            ipv4: Some((PEER_IP, 24)),
            rx_buffer: knobs::SOCKET_BUFFER,
            tx_buffer: knobs::SOCKET_BUFFER,
            ring_size: knobs::SOCKET_BUFFER / 2,
            ..StackConfig::default()
        };
        let victim = Context::start(
            tap,
            vcfg,
            EngineConfig {
                name: "attack-victim".into(),
                max_sleep: Some(Duration::from_millis(1)),
                ..EngineConfig::default()
            },
        )?;
        let peer = Context::start(
            p_nic,
            pcfg,
            EngineConfig {
                name: "attack-peer".into(),
                ..EngineConfig::default()
            },
        )?;
        Ok(Lab {
            victim,
            peer,
            raw: RawPort {
                inject: inject_tx,
                capture: cap_rx,
                captured_lost: lost,
            },
        })
    }

    /// A snapshot of what the victim holds.
    pub fn memory(&self) -> Memory {
        Memory {
            rss: rss_bytes(),
            heap: heap_bytes().unwrap_or(0),
            stats: self.victim.stack_stats(),
        }
    }
}

/// A global allocator that counts live heap bytes, so the attacks can measure what the
/// engines hold (RSS hides growth that reuses freed heap). Install it in the binary:
/// `#[global_allocator] static A: CountingAlloc = CountingAlloc;`. Without it
/// [`Memory::heap`] stays 0 and the bounds apply to RSS.
pub struct CountingAlloc;

static HEAP_LIVE: AtomicU64 = AtomicU64::new(0);
static HEAP_COUNTING: AtomicBool = AtomicBool::new(false);

// SAFETY: every call forwards to the system allocator with the same layout; the counter
// is only arithmetic on the sizes.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        HEAP_COUNTING.store(true, Ordering::Relaxed);
        HEAP_LIVE.fetch_add(l.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { std::alloc::System.alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        HEAP_COUNTING.store(true, Ordering::Relaxed);
        HEAP_LIVE.fetch_add(l.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { std::alloc::System.alloc_zeroed(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        HEAP_LIVE.fetch_sub(l.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { std::alloc::System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        HEAP_LIVE.fetch_add(new as u64, Ordering::Relaxed);
        HEAP_LIVE.fetch_sub(l.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { std::alloc::System.realloc(p, l, new) }
    }
}

/// Live heap bytes of the process when [`CountingAlloc`] is installed, else `None`.
pub fn heap_bytes() -> Option<u64> {
    HEAP_COUNTING
        .load(Ordering::Relaxed)
        .then(|| HEAP_LIVE.load(Ordering::Relaxed))
}

/// What the victim holds at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// Resident set of the whole process (both engines and the attacker live in it).
    pub rss: u64,
    /// Live heap bytes of the process ([`CountingAlloc`]; 0 when not installed).
    pub heap: u64,
    /// The victim's TCP counters.
    pub stats: StackStats,
}

impl Memory {
    /// The measure the bounds apply to: live heap bytes when counted, else RSS.
    pub fn held(&self) -> u64 {
        if self.heap > 0 {
            self.heap
        } else {
            self.rss
        }
    }

    /// Connections the victim holds: established minus recycled sockets (an estimate:
    /// `StackStats` has no live-connection gauge).
    pub fn connections(&self) -> u64 {
        self.stats.established.saturating_sub(self.stats.recycled)
    }
}

/// Resident set size of this process in bytes (`/proc/self/statm`).
pub fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(4096) as u64
}

/// The byte at stream offset `i` of the legitimate flow.
pub fn legit_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// A legitimate TCP flow from the peer to the victim with verified data: the peer writes
/// a pattern as fast as it can, an application thread on the victim reads and checks it.
pub struct LegitFlow {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    bad: Arc<AtomicU64>,
    threads: Vec<JoinHandle<io::Result<()>>>,
}

impl LegitFlow {
    /// Connect and start moving data.
    pub fn start(lab: &Lab) -> io::Result<LegitFlow> {
        let addr = SocketAddr::from((VICTIM_IP, LEGIT_PORT));
        let listener = TcpListener::bind(lab.victim.stack(), addr)?;
        let mut out = TcpStream::connect_timeout(lab.peer.stack(), addr, Duration::from_secs(10))?;
        let (mut inp, _) = listener.accept()?;
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let bad = Arc::new(AtomicU64::new(0));
        let s = stop.clone();
        let writer = std::thread::spawn(move || {
            let mut off = 0u64;
            let mut buf = vec![0u8; 16 << 10];
            out.set_write_timeout(Some(Duration::from_millis(200)))?;
            while !s.load(Ordering::Relaxed) {
                for (k, b) in buf.iter_mut().enumerate() {
                    *b = legit_byte(off + k as u64);
                }
                let mut done = 0;
                while done < buf.len() && !s.load(Ordering::Relaxed) {
                    match out.write(&buf[done..]) {
                        Ok(n) => done += n,
                        Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
                off += done as u64;
            }
            drop(listener);
            Ok(())
        });
        let (s, r, b) = (stop.clone(), received.clone(), bad.clone());
        let reader = std::thread::spawn(move || {
            let mut off = 0u64;
            let mut buf = vec![0u8; 64 << 10];
            inp.set_read_timeout(Some(Duration::from_millis(200)))?;
            while !s.load(Ordering::Relaxed) {
                match inp.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let wrong = buf[..n]
                            .iter()
                            .enumerate()
                            .filter(|(k, &v)| v != legit_byte(off + *k as u64))
                            .count();
                        b.fetch_add(wrong as u64, Ordering::Relaxed);
                        off += n as u64;
                        r.store(off, Ordering::Relaxed);
                    }
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        });
        Ok(LegitFlow {
            stop,
            received,
            bad,
            threads: vec![writer, reader],
        })
    }

    /// Bytes the victim's application received and checked so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Bytes that arrived wrong.
    pub fn bad(&self) -> u64 {
        self.bad.load(Ordering::Relaxed)
    }

    /// Throughput over `window` (bytes per second), sleeping meanwhile.
    pub fn rate_over(&self, window: Duration) -> f64 {
        let (b0, t0) = (self.received(), Instant::now());
        std::thread::sleep(window);
        (self.received() - b0) as f64 / t0.elapsed().as_secs_f64()
    }

    /// Stop; `Err` if either end failed (the flow broke during the attack).
    pub fn stop(mut self) -> io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut res = Ok(());
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => res = Err(e),
                Err(_) => res = Err(io::Error::other("legit flow thread panicked")),
            }
        }
        res
    }
}

/// Measures the legitimate flow while an attack runs: call [`Meter::begin`] when the
/// attack starts and [`Meter::end`] when it ends.
pub struct Meter {
    bytes: u64,
    at: Instant,
}

impl Meter {
    /// Start a measurement window.
    pub fn begin(flow: &LegitFlow) -> Meter {
        Meter {
            bytes: flow.received(),
            at: Instant::now(),
        }
    }

    /// Time since [`Meter::begin`].
    pub fn elapsed(&self) -> Duration {
        self.at.elapsed()
    }

    /// Bytes per second since [`Meter::begin`].
    pub fn end(&self, flow: &LegitFlow) -> f64 {
        (flow.received() - self.bytes) as f64 / self.at.elapsed().as_secs_f64().max(1e-6)
    }
}

/// TCP flag bits.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// One crafted TCP segment (Ethernet + IPv4 + TCP, correct checksums) from `src` to the
/// victim.
#[derive(Debug, Clone)]
pub struct Segment<'a> {
    /// Spoofed source address.
    pub src: Ipv4Addr,
    /// Source port.
    pub sport: u16,
    /// Destination port on the victim.
    pub dport: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgement number.
    pub ack: u32,
    /// Flag bits ([`tcp_flags`]).
    pub flags: u8,
    /// Window.
    pub window: u16,
    /// Payload.
    pub payload: &'a [u8],
}

fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    sum
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Segment<'_> {
    /// The frame bytes.
    pub fn frame(&self) -> Vec<u8> {
        let tcp_len = 20 + self.payload.len();
        let mut f = vec![0u8; 14 + 20 + tcp_len];
        f[..6].copy_from_slice(&VICTIM_MAC);
        f[6..12].copy_from_slice(&ATTACKER_MAC);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&self.src.octets());
        ip[16..20].copy_from_slice(&VICTIM_IP.octets());
        let c = csum_fold(csum_add(0, ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let t = &mut f[34..];
        t[0..2].copy_from_slice(&self.sport.to_be_bytes());
        t[2..4].copy_from_slice(&self.dport.to_be_bytes());
        t[4..8].copy_from_slice(&self.seq.to_be_bytes());
        t[8..12].copy_from_slice(&self.ack.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = self.flags;
        t[14..16].copy_from_slice(&self.window.to_be_bytes());
        t[20..].copy_from_slice(self.payload);
        let mut sum = csum_add(0, &self.src.octets());
        sum = csum_add(sum, &VICTIM_IP.octets());
        sum += 6 + tcp_len as u32;
        let c = csum_fold(csum_add(sum, t));
        t[16..18].copy_from_slice(&c.to_be_bytes());
        f
    }
}

/// The TCP header fields of a frame the victim sent, if it is IPv4/TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenSegment {
    /// Destination (spoofed) address.
    pub dst: Ipv4Addr,
    /// Destination port.
    pub dport: u16,
    /// Source port on the victim.
    pub sport: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgement number.
    pub ack: u32,
    /// Flags.
    pub flags: u8,
}

/// Parse a captured frame.
pub fn parse_segment(f: &[u8]) -> Option<SeenSegment> {
    if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[23] != 6 {
        return None;
    }
    let ihl = usize::from(f[14] & 0x0f) * 4;
    let t = f.get(14 + ihl..)?;
    if t.len() < 20 {
        return None;
    }
    Some(SeenSegment {
        dst: Ipv4Addr::new(f[30], f[31], f[32], f[33]),
        sport: u16::from_be_bytes([t[0], t[1]]),
        dport: u16::from_be_bytes([t[2], t[3]]),
        seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
        ack: u32::from_be_bytes([t[8], t[9], t[10], t[11]]),
        flags: t[13],
    })
}

/// A small deterministic generator for spoofed ports, sequence numbers and guesses.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Next 64 random bits (SplitMix64).
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
