//! The in-process virtual wire: two [`VirtualNic`]s joined by bounded lock-free queues,
//! with seeded, deterministic fault injection per direction. No privileges needed.
//!
//! * Each NIC is a smoltcp [`Device`] (`Medium::Ethernet`) and a [`Backend`], so an engine
//!   on any thread can drive it; the two ends may live on different engine threads.
//! * Faults are applied on the sending side, in a fixed order per frame: drop, rate
//!   limit (tail drop when the backlog exceeds [`LinkConfig::rate_queue`]), delay +
//!   jitter, reorder, corrupt, duplicate (the copy is identical, corruption included).
//!   Only `reorder` (and jitter when [`LinkConfig::jitter_may_reorder`] is set) changes
//!   the order of frames. The random draws per frame do not depend on timing, so the
//!   same seed and the same frames give the same fault sequence.
//! * Time-based faults (delay, jitter, reorder, rate) stamp each frame with a delivery
//!   time; the receiver holds frames until then and reports the earliest one through
//!   [`Backend::next_deadline`] so a sleeping engine wakes for it.
//! * Frame buffers travel back to the sender after the receiver consumed them, so the
//!   steady state allocates nothing per frame.
//! * [`Backend::flush`] writes the peer's eventfd ([`Backend::wait_fd`]) only if the peer
//!   armed it in [`Backend::prepare_sleep`]: a spinning receiver costs the sender no syscall.

use crate::backend::{Backend, BackendStats};
use crate::rng::SplitMix64;
use crate::sys::EventFd;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use smoltcp::phy::{ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ethernet header length (no FCS, no VLAN tag) added to the IP MTU to get the frame size.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// Fault injection for one direction of the wire. All probabilities are per frame, in
/// `[0, 1]`; the default is a perfect link.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Seed of this direction's random generator.
    pub seed: u64,
    /// Probability that a frame is lost.
    pub drop: f64,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that a frame is held back by [`LinkConfig::reorder_delay`] so that
    /// frames sent after it overtake it.
    pub reorder: f64,
    /// Extra delay of a reordered frame.
    pub reorder_delay: Duration,
    /// Probability that a frame has bits flipped.
    pub corrupt: f64,
    /// How many bits are flipped in a corrupted frame (at least 1 is used).
    pub corrupt_bits: u32,
    /// Fixed one-way delay added to every frame.
    pub delay: Duration,
    /// Extra delay drawn uniformly from `[0, jitter]` per frame. Frames keep their order
    /// (a frame is never delivered before the one sent ahead of it) unless
    /// [`LinkConfig::jitter_may_reorder`] is set.
    pub jitter: Duration,
    /// Let jitter reorder frames, like netem does (heavy reordering at high frame rates;
    /// use [`LinkConfig::reorder`] for controlled reordering).
    pub jitter_may_reorder: bool,
    /// Line rate in bits per second (frame bytes × 8); `0` means unlimited.
    pub rate_bps: u64,
    /// With a rate limit: the longest backlog a frame may wait behind before it is
    /// tail-dropped (a queue of this many seconds of line time).
    pub rate_queue: Duration,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            seed: 0x5857_4152_505f_5657, // "XWARP_VW"
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_millis(1),
            corrupt: 0.0,
            corrupt_bits: 1,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            jitter_may_reorder: false,
            rate_bps: 0,
            rate_queue: Duration::from_millis(50),
        }
    }
}

impl LinkConfig {
    /// A perfect link with the given seed.
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed,
            ..Self::default()
        }
    }

    /// Whether frames on this link carry a delivery time (delay, jitter, reorder or rate).
    fn timed(&self) -> bool {
        !self.delay.is_zero() || !self.jitter.is_zero() || self.reorder > 0.0 || self.rate_bps > 0
    }

    fn validate(&self) -> io::Result<()> {
        for (name, p) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(invalid(format!(
                    "vwire: {name} probability {p} not in [0, 1]"
                )));
            }
        }
        const LIMIT: Duration = Duration::from_secs(3600);
        for (name, d) in [
            ("delay", self.delay),
            ("jitter", self.jitter),
            ("reorder_delay", self.reorder_delay),
            ("rate_queue", self.rate_queue),
        ] {
            if d > LIMIT {
                return Err(invalid(format!("vwire: {name} {d:?} longer than one hour")));
            }
        }
        if self.reorder > 0.0 && self.reorder_delay.is_zero() {
            return Err(invalid(
                "vwire: reorder needs a non-zero reorder_delay".into(),
            ));
        }
        Ok(())
    }
}

/// Configuration of a virtual wire.
#[derive(Debug, Clone, PartialEq)]
pub struct WireConfig {
    /// IP MTU of both NICs (frames carry up to `mtu + 14` bytes). 1500 by default.
    pub mtu: usize,
    /// Frames in flight per direction before the sender drops (counted as `queue_full`).
    pub queue_depth: usize,
    /// Faults on frames sent by NIC `a` to NIC `b`.
    pub a_to_b: LinkConfig,
    /// Faults on frames sent by NIC `b` to NIC `a`.
    pub b_to_a: LinkConfig,
    /// Advertise checksum offload to smoltcp (no IPv4/TCP/UDP/ICMP checksums computed or
    /// verified). Only for a trusted in-process peer (both ends xwarp, docs/performance.md §8.2);
    /// refused together with the `corrupt` fault, which checksums exist to catch.
    pub checksum_offload: bool,
}

impl Default for WireConfig {
    fn default() -> Self {
        Self {
            mtu: 1500,
            queue_depth: 1024,
            a_to_b: LinkConfig::seeded(1),
            b_to_a: LinkConfig::seeded(2),
            checksum_offload: false,
        }
    }
}

impl WireConfig {
    /// A perfect wire with jumbo frames (IP MTU 9000).
    pub fn jumbo() -> Self {
        Self {
            mtu: 9000,
            ..Self::default()
        }
    }

    /// The same faults in both directions (each direction keeps its own seed stream:
    /// `b_to_a` uses `link.seed` with its bits inverted).
    pub fn symmetric(mtu: usize, link: LinkConfig) -> Self {
        let mut back = link.clone();
        back.seed = !link.seed;
        Self {
            mtu,
            queue_depth: 1024,
            a_to_b: link,
            b_to_a: back,
            checksum_offload: false,
        }
    }

    fn validate(&self) -> io::Result<()> {
        if !(68..=65_535).contains(&self.mtu) {
            return Err(invalid(format!(
                "vwire: mtu {} not in 68..=65535",
                self.mtu
            )));
        }
        if self.queue_depth == 0 || self.queue_depth > 1 << 20 {
            return Err(invalid(format!(
                "vwire: queue_depth {} not in 1..=1048576",
                self.queue_depth
            )));
        }
        self.a_to_b.validate()?;
        self.b_to_a.validate()?;
        if self.checksum_offload && (self.a_to_b.corrupt > 0.0 || self.b_to_a.corrupt > 0.0) {
            return Err(invalid(
                "vwire: checksum_offload cannot be combined with the corrupt fault".into(),
            ));
        }
        Ok(())
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// What fault injection did to the frames one NIC sent (its outgoing direction).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultCounters {
    /// Frames lost to the `drop` probability.
    pub dropped: u64,
    /// Frames sent twice.
    pub duplicated: u64,
    /// Frames held back by `reorder_delay`.
    pub reordered: u64,
    /// Frames with flipped bits.
    pub corrupted: u64,
    /// Frames given a non-zero delay or jitter.
    pub delayed: u64,
    /// Frames that had to wait behind the rate limit.
    pub rate_limited: u64,
    /// Frames tail-dropped because the rate-limit backlog exceeded `rate_queue`.
    pub rate_dropped: u64,
    /// Frames dropped because the peer's queue was full or the peer is gone.
    pub queue_full: u64,
    /// Frames dropped because they were longer than the MTU allows.
    pub oversize: u64,
}

/// A frame in flight.
#[derive(Debug)]
struct Frame {
    buf: Vec<u8>,
    deliver_at: Option<Instant>,
    seq: u64,
}

/// Heap entry ordered by (delivery time, sequence number).
#[derive(Debug)]
struct Timed(Frame);

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}
impl Timed {
    fn key(&self) -> (Option<Instant>, u64) {
        (self.0.deliver_at, self.0.seq)
    }
}

/// Wakeup state of one receiving NIC, shared with the sender.
#[derive(Debug)]
struct WakeState {
    efd: EventFd,
    /// Set by the receiver before it sleeps; the sender notifies `efd` only when set.
    armed: AtomicBool,
}

/// Sending half of one direction.
#[derive(Debug)]
struct TxSide {
    queue: Sender<Frame>,
    returned: Receiver<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    cfg: LinkConfig,
    timed: bool,
    rng: SplitMix64,
    link_free_at: Option<Instant>,
    /// Delivery time of the previous frame (before any reorder hold), to keep order.
    last_due: Option<Instant>,
    seq: u64,
    max_frame: usize,
    peer: Arc<WakeState>,
    pending_wake: bool,
    faults: FaultCounters,
    tx_frames: u64,
    tx_bytes: u64,
}

/// Receiving half of one direction.
#[derive(Debug)]
struct RxSide {
    queue: Receiver<Frame>,
    recycle: Sender<Vec<u8>>,
    heap: BinaryHeap<Reverse<Timed>>,
    timed: bool,
    wake: Arc<WakeState>,
    rx_frames: u64,
    rx_bytes: u64,
}

/// One end of a [`VirtualWire`].
#[derive(Debug)]
pub struct VirtualNic {
    rx: RxSide,
    tx: TxSide,
    mtu: usize,
    checksum_offload: bool,
}

/// Constructor of virtual wires.
#[derive(Debug)]
pub struct VirtualWire;

impl VirtualWire {
    /// Two NICs joined back to back: what `a` sends, `b` receives, and the reverse.
    pub fn pair(config: WireConfig) -> io::Result<(VirtualNic, VirtualNic)> {
        config.validate()?;
        let max_frame = config.mtu + ETHERNET_HEADER_LEN;
        let wake_a = Arc::new(WakeState {
            efd: EventFd::new()?,
            armed: AtomicBool::new(false),
        });
        let wake_b = Arc::new(WakeState {
            efd: EventFd::new()?,
            armed: AtomicBool::new(false),
        });
        let (a_tx, b_rx) = direction(config.a_to_b, config.queue_depth, max_frame, wake_b.clone());
        let (b_tx, a_rx) = direction(config.b_to_a, config.queue_depth, max_frame, wake_a.clone());
        let a = VirtualNic {
            rx: a_rx,
            tx: a_tx,
            mtu: config.mtu,
            checksum_offload: config.checksum_offload,
        };
        let b = VirtualNic {
            rx: b_rx,
            tx: b_tx,
            mtu: config.mtu,
            checksum_offload: config.checksum_offload,
        };
        Ok((a, b))
    }
}

fn direction(
    cfg: LinkConfig,
    depth: usize,
    max_frame: usize,
    rx_wake: Arc<WakeState>,
) -> (TxSide, RxSide) {
    let (frame_tx, frame_rx) = bounded(depth);
    // Room for every buffer that can be in flight plus the receiver's holding heap.
    let (buf_tx, buf_rx) = bounded(depth * 2 + 16);
    let timed = cfg.timed();
    let tx = TxSide {
        queue: frame_tx,
        returned: buf_rx,
        spare: Vec::new(),
        rng: SplitMix64::new(cfg.seed),
        cfg,
        timed,
        link_free_at: None,
        last_due: None,
        seq: 0,
        max_frame,
        peer: rx_wake.clone(),
        pending_wake: false,
        faults: FaultCounters::default(),
        tx_frames: 0,
        tx_bytes: 0,
    };
    let rx = RxSide {
        queue: frame_rx,
        recycle: buf_tx,
        heap: BinaryHeap::with_capacity(if timed { depth * 2 } else { 0 }),
        timed,
        wake: rx_wake,
        rx_frames: 0,
        rx_bytes: 0,
    };
    (tx, rx)
}

/// Per-frame random draws, always taken in the same order so the fault sequence
/// depends only on the seed and the frames.
struct Draws {
    drop: f64,
    corrupt: f64,
    duplicate: f64,
    reorder: f64,
    jitter: f64,
}

impl TxSide {
    fn take_buf(&mut self) -> Vec<u8> {
        if let Some(b) = self.spare.pop() {
            return b;
        }
        match self.returned.try_recv() {
            Ok(b) => b,
            Err(_) => Vec::with_capacity(self.max_frame),
        }
    }

    fn keep_buf(&mut self, mut buf: Vec<u8>) {
        buf.clear();
        if self.spare.len() < 64 {
            self.spare.push(buf);
        }
    }

    fn send(&mut self, mut buf: Vec<u8>) {
        self.tx_frames += 1;
        self.tx_bytes += buf.len() as u64;
        if buf.len() > self.max_frame {
            self.faults.oversize += 1;
            self.keep_buf(buf);
            return;
        }
        let d = Draws {
            drop: self.rng.next_f64(),
            corrupt: self.rng.next_f64(),
            duplicate: self.rng.next_f64(),
            reorder: self.rng.next_f64(),
            jitter: self.rng.next_f64(),
        };
        if d.drop < self.cfg.drop {
            self.faults.dropped += 1;
            self.keep_buf(buf);
            return;
        }
        let mut deliver_at = None;
        if self.timed {
            let now = Instant::now();
            let mut depart = now;
            if self.cfg.rate_bps > 0 {
                let start = self.link_free_at.map_or(now, |t| t.max(now));
                if start.duration_since(now) > self.cfg.rate_queue {
                    self.faults.rate_dropped += 1;
                    self.keep_buf(buf);
                    return;
                }
                if start > now {
                    self.faults.rate_limited += 1;
                }
                let bits = buf.len() as u128 * 8;
                let nanos = bits * 1_000_000_000 / self.cfg.rate_bps as u128;
                depart = start + Duration::from_nanos(nanos.min(u64::MAX as u128) as u64);
                self.link_free_at = Some(depart);
            }
            let jitter = self.cfg.jitter.mul_f64(d.jitter);
            let extra = self.cfg.delay + jitter;
            if !extra.is_zero() {
                self.faults.delayed += 1;
            }
            let mut due = depart + extra;
            if !self.cfg.jitter_may_reorder {
                due = self.last_due.map_or(due, |last| due.max(last));
                self.last_due = Some(due);
            }
            if d.reorder < self.cfg.reorder {
                self.faults.reordered += 1;
                due += self.cfg.reorder_delay;
            }
            deliver_at = Some(due);
        }
        if d.corrupt < self.cfg.corrupt && !buf.is_empty() {
            self.faults.corrupted += 1;
            let bits = buf.len() as u64 * 8;
            for _ in 0..self.cfg.corrupt_bits.max(1) {
                let bit = self.rng.below(bits);
                buf[(bit / 8) as usize] ^= 1 << (bit % 8);
            }
        }
        if d.duplicate < self.cfg.duplicate {
            self.faults.duplicated += 1;
            let mut copy = self.take_buf();
            copy.clear();
            copy.extend_from_slice(&buf);
            self.push(buf, deliver_at);
            self.push(copy, deliver_at);
        } else {
            self.push(buf, deliver_at);
        }
    }

    fn push(&mut self, buf: Vec<u8>, deliver_at: Option<Instant>) {
        let frame = Frame {
            buf,
            deliver_at,
            seq: self.seq,
        };
        self.seq = self.seq.wrapping_add(1);
        match self.queue.try_send(frame) {
            Ok(()) => self.pending_wake = true,
            Err(TrySendError::Full(f)) | Err(TrySendError::Disconnected(f)) => {
                self.faults.queue_full += 1;
                self.keep_buf(f.buf);
            }
        }
    }

    fn dropped(&self) -> u64 {
        let f = &self.faults;
        f.dropped + f.rate_dropped + f.queue_full + f.oversize
    }
}

impl RxSide {
    /// Move arrived frames into the holding heap (timed links only).
    fn pull(&mut self) {
        if !self.timed {
            return;
        }
        while let Ok(f) = self.queue.try_recv() {
            self.heap.push(Reverse(Timed(f)));
        }
    }

    fn ready(&mut self, now: Option<Instant>) -> bool {
        if !self.timed {
            return !self.queue.is_empty();
        }
        self.pull();
        match self.heap.peek() {
            Some(Reverse(t)) => match t.0.deliver_at {
                Some(at) => at <= now.unwrap_or_else(Instant::now),
                None => true,
            },
            None => false,
        }
    }

    fn next(&mut self) -> Option<Vec<u8>> {
        if !self.timed {
            return self.queue.try_recv().ok().map(|f| f.buf);
        }
        if !self.ready(None) {
            return None;
        }
        self.heap.pop().map(|Reverse(t)| t.0.buf)
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        // A full return queue just means the sender has plenty; drop the buffer.
        let _ = self.recycle.try_send(buf);
    }
}

impl VirtualNic {
    /// Fault counters of frames this NIC sent.
    pub fn tx_faults(&self) -> FaultCounters {
        self.tx.faults
    }

    /// The IP MTU of this NIC.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The largest Ethernet frame (without FCS) this NIC carries.
    pub fn max_frame_len(&self) -> usize {
        self.mtu + ETHERNET_HEADER_LEN
    }

    /// Send one raw frame outside smoltcp (tests, raw echo services). Faults apply.
    pub fn send_frame(&mut self, frame: &[u8]) {
        let mut buf = self.tx.take_buf();
        buf.clear();
        buf.extend_from_slice(frame);
        self.tx.send(buf);
    }

    /// Receive one raw frame outside smoltcp into `out` (cleared first). Returns `false`
    /// if no frame is ready.
    pub fn recv_frame(&mut self, out: &mut Vec<u8>) -> bool {
        match self.rx.next() {
            Some(buf) => {
                out.clear();
                out.extend_from_slice(&buf);
                self.rx.rx_frames += 1;
                self.rx.rx_bytes += buf.len() as u64;
                self.rx.recycle(buf);
                true
            }
            None => false,
        }
    }
}

/// Receive token of a [`VirtualNic`].
#[derive(Debug)]
pub struct VwireRxToken<'a> {
    buf: Vec<u8>,
    side: &'a mut RxSide,
}

impl smoltcp::phy::RxToken for VwireRxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        let r = f(&self.buf);
        self.side.rx_frames += 1;
        self.side.rx_bytes += self.buf.len() as u64;
        self.side.recycle(self.buf);
        r
    }
}

/// Transmit token of a [`VirtualNic`].
#[derive(Debug)]
pub struct VwireTxToken<'a> {
    side: &'a mut TxSide,
}

impl smoltcp::phy::TxToken for VwireTxToken<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let mut buf = self.side.take_buf();
        buf.clear();
        buf.resize(len, 0);
        let r = f(&mut buf);
        self.side.send(buf);
        r
    }
}

impl Device for VirtualNic {
    type RxToken<'a>
        = VwireRxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = VwireTxToken<'a>
    where
        Self: 'a;

    fn receive(
        &mut self,
        _timestamp: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let buf = self.rx.next()?;
        Some((
            VwireRxToken {
                buf,
                side: &mut self.rx,
            },
            VwireTxToken { side: &mut self.tx },
        ))
    }

    fn transmit(&mut self, _timestamp: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(VwireTxToken { side: &mut self.tx })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.max_frame_len();
        if self.checksum_offload {
            caps.checksum = ChecksumCapabilities::ignored();
        }
        caps
    }
}

impl Backend for VirtualNic {
    fn flush(&mut self) -> io::Result<()> {
        if self.tx.pending_wake {
            self.tx.pending_wake = false;
            if self.tx.peer.armed.swap(false, Ordering::SeqCst) {
                self.tx.peer.efd.notify()?;
            }
        }
        Ok(())
    }

    fn poll_rx(&mut self) -> io::Result<bool> {
        Ok(self.rx.ready(None))
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.rx.wake.efd.as_raw_fd())
    }

    fn prepare_sleep(&mut self) -> io::Result<bool> {
        self.rx.wake.efd.drain()?;
        self.rx.wake.armed.store(true, Ordering::SeqCst);
        // Re-check after arming: a frame pushed before the sender saw `armed` must not
        // be slept through.
        if self.rx.ready(None) {
            self.rx.wake.armed.store(false, Ordering::SeqCst);
            return Ok(false);
        }
        Ok(true)
    }

    fn next_deadline(&self) -> Option<Instant> {
        if !self.rx.timed {
            return None;
        }
        self.rx.heap.peek().and_then(|Reverse(t)| t.0.deliver_at)
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            rx_frames: self.rx.rx_frames,
            rx_bytes: self.rx.rx_bytes,
            tx_frames: self.tx.tx_frames,
            tx_bytes: self.tx.tx_bytes,
            dropped: self.tx.dropped(),
        }
    }

    fn telemetry(&self) -> xwarp_telemetry::NicCounters {
        let s = Backend::stats(self);
        let f = &self.tx.faults;
        xwarp_telemetry::NicCounters {
            mode: xwarp_telemetry::layout::MODE_VWIRE,
            zero_copy: xwarp_telemetry::layout::NA,
            multi_buffer: xwarp_telemetry::layout::NA,
            rx_frames: s.rx_frames,
            rx_bytes: s.rx_bytes,
            tx_frames: s.tx_frames,
            tx_bytes: s.tx_bytes,
            dropped: s.dropped,
            wire_faults: f.dropped + f.rate_dropped + f.queue_full + f.oversize,
            ..xwarp_telemetry::NicCounters::default()
        }
    }

    fn interface_label(&self) -> String {
        "vwire".into()
    }
}
