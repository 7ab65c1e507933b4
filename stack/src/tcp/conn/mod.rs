//! The project's own sans-IO TCP connection (RFC 9293 state machine) built on smoltcp's
//! `wire` types and this crate's loss-recovery parts: [`Reassembly`] (out-of-order map,
//! SACK/DSACK blocks), [`Scoreboard`] (RFC 6675), [`Rack`]/[`Tlp`] (RFC 8985) and the RFC
//! 6298 estimator. Not wired into the engine yet (see "Own TCP core" in the crate README).
//!
//! Shape:
//! - time is an argument ([`Instant`]); no clock, no I/O;
//! - receive: [`Connection::on_segment`] hands in-order payload straight to the owner's
//!   [`RxSink`] (one copy); out-of-order payload waits in a bounded store;
//! - send: the owner keeps the bytes ([`TxSource`], offsets from SND.UNA);
//!   [`Connection::poll_transmit`] returns a [`Segment`] descriptor (header fields +
//!   which bytes), and [`Segment::emit`] writes the header and copies the payload straight
//!   from the source into the frame (no intermediate buffer); retransmissions read the
//!   source again;
//! - timers: [`Connection::poll_at`] is the earliest deadline; `poll_transmit` runs the
//!   timers that are due.

mod io;
mod ooo;
mod records;

#[cfg(test)]
mod lossy;
#[cfg(test)]
pub(crate) mod sim_endpoint;
#[cfg(test)]
mod tests;

pub use io::{RingTx, RxSink, TxSource};

use super::cc;
use super::rack::{Probe, Rack, RackConfig, Tlp, TlpVerdict};
use super::rtt::{
    elapsed, KarnSampler, RtoTimer, RttConfig, RttConfigError, RttEstimator, TsClock,
};
use super::sack::{
    receiver::MAX_WINDOW, Reassembly, ReassemblyConfig, Received, SackBlock, SackList, Scoreboard,
    ScoreboardConfig,
};
use super::seq::Seq;
use ooo::PieceStore;
use records::RecordPlan;
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{IpAddress, IpEndpoint, TcpControl, TcpPacket, TcpRepr, TcpTimestampRepr};

/// RFC 9293 connection states (LISTEN belongs to the owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Active open: SYN sent.
    SynSent,
    /// SYN received (passive open, or simultaneous open), SYN-ACK sent.
    SynReceived,
    /// Open both ways.
    Established,
    /// Our FIN sent, not acknowledged.
    FinWait1,
    /// Our FIN acknowledged; waiting for the peer's.
    FinWait2,
    /// Both FINs sent, ours not yet acknowledged.
    Closing,
    /// Both sides closed; waiting 2·MSL.
    TimeWait,
    /// The peer's FIN received; we may still send.
    CloseWait,
    /// The peer closed, then we did; waiting for our FIN's ACK.
    LastAck,
    /// Gone (the owner frees the connection).
    Closed,
}

impl State {
    fn synchronized(self) -> bool {
        !matches!(self, State::SynSent | State::SynReceived | State::Closed)
    }
    fn can_receive_data(self) -> bool {
        matches!(self, State::Established | State::FinWait1 | State::FinWait2)
    }
}

/// Why a connection ended abnormally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnError {
    /// The peer answered the SYN with a RST.
    Refused,
    /// The peer reset the connection.
    Reset,
    /// Retransmissions (or keep-alive probes) went unanswered.
    TimedOut,
    /// The owner aborted it.
    Aborted,
}

/// Configuration of one connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnConfig {
    /// Upper bound on the MSS (payload plus TCP options per segment) we advertise and
    /// send; the MSS in use is `min(mss, mtu − IP header − 20)` for the connection's address
    /// family (see [`ConnConfig::mss_for_mtu`]), further capped by the peer's MSS. The
    /// default (`u16::MAX`) leaves it to the MTU: 1460 for IPv4, 1440 for IPv6 at 1500.
    pub mss: u16,
    /// The local link's IP MTU: no segment we send, options included, exceeds it.
    pub mtu: u16,
    /// Largest receive window we will ever advertise (picks the window scale).
    pub rx_window_max: u32,
    /// Offer window scaling (RFC 7323 §2).
    pub window_scaling: bool,
    /// Offer SACK (RFC 2018).
    pub sack: bool,
    /// Offer timestamps (RFC 7323 §3).
    pub timestamps: bool,
    /// Nagle's algorithm (RFC 9293 §3.7.4).
    pub nagle: bool,
    /// Delayed ACK timeout (`None`: ACK every segment).
    pub ack_delay: Option<Duration>,
    /// The peer's largest delayed-ACK time, for the TLP PTO with one segment in flight
    /// (RFC 8985 §7.2 WCDelAckT; Linux peers delay 40–200 ms, so 200 ms by default).
    pub peer_max_ack_delay: Duration,
    /// RTO parameters (RFC 6298; `min_rto` is the floor).
    pub rtt: RttConfig,
    /// Out-of-order store bounds.
    pub ooo: ReassemblyConfig,
    /// Congestion control.
    pub cc: cc::Algorithm,
    /// Initial window in segments (RFC 6928).
    pub initial_window_segments: u32,
    /// TIME-WAIT length (2·MSL).
    pub time_wait: Duration,
    /// Keep-alive idle time (`None`: off).
    pub keepalive: Option<Duration>,
    /// Keep-alive probe interval.
    pub keepalive_interval: Duration,
    /// Unanswered keep-alive probes before the connection is dropped.
    pub keepalive_probes: u32,
    /// SYN / SYN-ACK retransmissions before giving up.
    pub syn_retries: u32,
    /// Retransmission timeouts in a row before giving up.
    pub max_rto_retries: u32,
    /// RFC 5961 §7: challenge ACKs per second.
    pub challenge_ack_limit: u32,
    /// Most segment records kept for RACK (bounds the flight in segments).
    pub max_segments: usize,
}

impl Default for ConnConfig {
    fn default() -> Self {
        ConnConfig {
            mss: u16::MAX,
            mtu: 1500,
            rx_window_max: 1 << 20,
            window_scaling: true,
            sack: true,
            timestamps: true,
            nagle: false,
            ack_delay: Some(Duration::from_millis(1)),
            peer_max_ack_delay: Duration::from_millis(200),
            rtt: RttConfig::default(),
            ooo: ReassemblyConfig::default(),
            cc: cc::Algorithm::Cubic,
            initial_window_segments: 10,
            time_wait: Duration::from_secs(60),
            keepalive: None,
            keepalive_interval: Duration::from_secs(75),
            keepalive_probes: 9,
            syn_retries: 6,
            max_rto_retries: 15,
            challenge_ack_limit: 1000,
            max_segments: 1 << 16,
        }
    }
}

/// A configuration or opening error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigError {
    /// `mss` below 64, or an `mtu` leaving less than 64 bytes for it.
    MssTooSmall,
    /// `rx_window_max` zero or above 2^30.
    BadWindow,
    /// The RTO parameters.
    Rtt(RttConfigError),
    /// `accept_syn` got a segment that is not a SYN without ACK.
    NotASyn,
    /// Local and remote addresses of different IP versions.
    AddressMismatch,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::MssTooSmall => write!(f, "mss must be at least 64"),
            ConfigError::BadWindow => write!(f, "rx_window_max must be in 1..=2^30"),
            ConfigError::Rtt(e) => write!(f, "rtt: {e}"),
            ConfigError::NotASyn => write!(f, "segment is not a SYN without ACK"),
            ConfigError::AddressMismatch => write!(f, "local and remote IP versions differ"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConnConfig {
    /// The MSS an IP MTU leaves for TCP (RFC 9293 §3.7.1, RFC 8200 §5): the MTU less the
    /// IP header (20 bytes IPv4, 40 IPv6) and the 20-byte TCP header; 0 if it leaves none.
    pub fn mss_for_mtu(mtu: u16, ipv6: bool) -> u16 {
        mtu.saturating_sub(if ipv6 { 40 } else { 20 } + 20)
    }

    /// The MSS used toward `remote`'s address family: `min(mss, mss_for_mtu(mtu))`.
    pub fn local_mss(&self, remote: &IpAddress) -> u16 {
        let v6 = matches!(remote, IpAddress::Ipv6(_));
        self.mss.min(Self::mss_for_mtu(self.mtu, v6))
    }

    /// Check the bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.mss < 64 || Self::mss_for_mtu(self.mtu, true) < 64 {
            return Err(ConfigError::MssTooSmall);
        }
        if self.rx_window_max == 0 || self.rx_window_max > MAX_WINDOW {
            return Err(ConfigError::BadWindow);
        }
        self.rtt.validate().map_err(ConfigError::Rtt)
    }
}

/// What one received segment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentOutcome {
    /// Send-queue bytes newly acknowledged: the owner drops this many from the front of
    /// its [`TxSource`].
    pub acked: u64,
    /// Bytes handed to the sink during this call.
    pub delivered: u64,
    /// The segment was not acceptable (dropped; an ACK may be owed).
    pub dropped: bool,
}

/// Counters and estimates for `TCP_INFO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpInfo {
    /// Current state.
    pub state: State,
    /// Segments retransmitted (any cause).
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub rto_count: u64,
    /// Tail loss probes sent.
    pub tlp_count: u64,
    /// Fast recoveries entered.
    pub fast_recoveries: u64,
    /// DSACK blocks received.
    pub dsacks_received: u64,
    /// Congestion window (octets).
    pub cwnd: u32,
    /// Slow-start threshold (octets).
    pub ssthresh: u32,
    /// Smoothed RTT.
    pub srtt: Option<Duration>,
    /// RTT variation.
    pub rttvar: Duration,
    /// Current RTO.
    pub rto: Duration,
    /// Minimum RTT seen.
    pub min_rtt: Option<Duration>,
    /// Payload bytes sent (retransmissions included).
    pub bytes_sent: u64,
    /// Payload bytes acknowledged.
    pub bytes_acked: u64,
    /// Payload bytes received in order.
    pub bytes_received: u64,
    /// Reordering was seen (RACK).
    pub reordering_seen: bool,
    /// Out-of-order (and undelivered) bytes held.
    pub ooo_bytes: u64,
    /// Segments dropped by the out-of-order bounds.
    pub ooo_dropped: u64,
    /// Window reductions undone because DSACKs showed them spurious.
    pub undos: u64,
    /// Challenge ACKs sent (RFC 5961).
    pub challenge_acks: u64,
    /// Sender MSS in use.
    pub snd_mss: u32,
    /// Peer's window (octets).
    pub snd_wnd: u32,
}

/// One segment to send: the header fields (`repr.payload` is empty) and which bytes of the
/// [`TxSource`] it carries. Valid until the next call on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Header and options; its `payload` is empty, the payload is `payload_len` bytes of
    /// the source from `payload_offset`.
    pub repr: TcpRepr<'static>,
    /// Offset of the payload in the source (from SND.UNA).
    pub payload_offset: u64,
    /// Payload length.
    pub payload_len: usize,
}

/// Why [`Segment::emit`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmitError {
    /// The buffer is shorter than [`Segment::buffer_len`].
    BufferTooSmall,
    /// The source held fewer bytes than the segment needs (it changed against the
    /// contract).
    SourceShort,
}

impl Segment {
    /// TCP header plus payload length.
    pub fn buffer_len(&self) -> usize {
        self.repr.header_len() + self.payload_len
    }

    /// Sequence space the segment occupies (payload + SYN/FIN).
    pub fn seq_len(&self) -> usize {
        self.payload_len + self.repr.control.len()
    }

    /// Write the segment into `buf` (header, payload copied straight from `tx`, checksum
    /// over the pseudo-header of `src`/`dst`); returns the bytes written.
    pub fn emit(
        &self,
        buf: &mut [u8],
        src: &IpAddress,
        dst: &IpAddress,
        tx: &impl TxSource,
    ) -> Result<usize, EmitError> {
        let total = self.buffer_len();
        if buf.len() < total {
            return Err(EmitError::BufferTooSmall);
        }
        let mut pkt = TcpPacket::new_unchecked(&mut buf[..total]);
        self.repr
            .emit(&mut pkt, src, dst, &ChecksumCapabilities::ignored());
        if self.payload_len > 0
            && tx.copy_at(self.payload_offset, pkt.payload_mut()) != self.payload_len
        {
            return Err(EmitError::SourceShort);
        }
        pkt.fill_checksum(src, dst);
        Ok(total)
    }
}

/// The shortest probe timeout: a tiny SRTT (a LAN, or the SYN's RTT sample) must not fire a
/// probe right behind the flight it probes. Linux adds two ticks (2 ms at HZ=1000) to
/// 2·SRTT. Was 10 ms: toward a Linux receiver at 1% loss, a lost tail segment then cost
/// the probe's 10 ms plus the receiver's delayed ACK of the lone probe (~40 ms), some 50
/// times in a 3 s row.
pub const MIN_PTO: Duration = Duration::from_millis(2);

/// RFC 7323 §5.5: TS.Recent is invalid once it is older than 24 days.
const TS_RECENT_MAX_AGE: Duration = Duration::from_secs(24 * 24 * 3600);

/// Retransmissions of one fast recovery followed for a DSACK undo.
const MAX_UNDO_RANGES: usize = 64;

/// Probes in one fast recovery without SND.UNA moving (see `arm_recovery_probe`).
const MAX_RECOVERY_PROBES: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// A RST with this sequence number (and ACK number) to send.
    Rst(Seq, Option<Seq>),
}

/// One TCP connection.
#[derive(Debug)]
pub struct Connection {
    cfg: ConnConfig,
    local: IpEndpoint,
    remote: IpEndpoint,
    state: State,
    error: Option<ConnError>,

    // Send side.
    iss: Seq,
    snd_una: Seq,
    snd_nxt: Seq,
    snd_wnd: u32,
    max_snd_wnd: u32,
    snd_wl1: Seq,
    snd_wl2: Seq,
    snd_wscale: u8,
    snd_mss: u32,
    /// Our MSS from the config and MTU (advertised in the SYN).
    local_mss: u32,
    /// Effective MSS: min(peer MSS, local MSS), the most payload + TCP options a segment
    /// may carry (Linux's `tcp_current_mss` subtracts the options of each segment from it).
    seg_max: u32,
    /// Offset (in the source) of the byte at `snd_una`, counted in acked bytes.
    fin_queued: bool,
    fin_seq: Option<Seq>,
    board: Scoreboard,
    rack: Rack,
    tlp: Tlp,
    tlp_due: bool,
    rtt: RttEstimator,
    rto_timer: RtoTimer,
    karn: KarnSampler,
    rto_retries: u32,
    cc: cc::Controller,
    reo_at: Option<Instant>,
    pto_at: Option<Instant>,
    persist_at: Option<Instant>,
    persist_backoff: u32,
    /// Zero-window probes sent without an ACK since (timed out like Linux tcp_retries2).
    persist_probes: u32,
    persist_due: bool,
    last_send: Option<Instant>,
    syn_due: bool,
    syn_retries: u32,
    /// Without SACK: RFC 5681 duplicate ACKs counted, and the fast retransmission due.
    nosack_dups: u32,
    fast_rexmit: Option<SackBlock>,
    /// A RACK-started recovery's first retransmission is owed (RFC 6675 §5 (4.3)): it
    /// leaves whatever PRR allows.
    first_rexmit_due: bool,
    /// The recovery running was started by an RTO (no recovery probes then).
    after_rto: bool,
    /// The retransmissions of the last fast recovery not yet reported back as DSACK; when
    /// every one was (RFC 2883: each arrived twice), the reduction was spurious and is
    /// undone. `None`: nothing to undo (RTO, too many, or done).
    undo: Option<Vec<SackBlock>>,
    /// Probes sent in this recovery since SND.UNA last advanced.
    recovery_probes: u32,

    // Receive side.
    irs: Seq,
    rx: Reassembly,
    store: PieceStore,
    /// Stream offset / sequence of the next byte for the sink.
    delivered: u64,
    delivered_seq: Seq,
    fin_rcvd: bool,
    fin_at: Option<Seq>,
    rcv_wscale: u8,
    /// RCV.NXT + the window last advertised (never moves left).
    rcv_adv: Seq,
    rx_free: usize,
    rx_room_max: usize,
    ack_now: bool,
    delack_at: Option<Instant>,
    unacked_bytes: u32,
    /// Largest payload seen from the peer (starts at 536): what RFC 5681 §4.2 counts as a
    /// full-sized segment.
    rcv_mss: u32,

    // Options.
    sack_ok: bool,
    ts_ok: bool,
    ws_ok: bool,
    ts_clock: TsClock,
    ts_origin: Instant,
    ts_recent: u32,
    /// When TS.Recent was last set (RFC 7323 §5.5: invalid after 24 days).
    ts_recent_at: Instant,
    last_ack_sent: Seq,

    // RFC 5961 §7 throttle.
    challenge_window: Option<Instant>,
    challenge_count: u32,

    // Timers of the ends.
    time_wait_at: Option<Instant>,
    last_rcv: Instant,
    keepalive_at: Option<Instant>,
    keepalive_sent: u32,
    keepalive_due: bool,

    pending: Option<Pending>,
    info: Counters,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    retransmits: u64,
    rto_count: u64,
    tlp_count: u64,
    fast_recoveries: u64,
    dsacks: u64,
    bytes_sent: u64,
    bytes_acked: u64,
    bytes_received: u64,
    ooo_dropped: u64,
    challenge_acks: u64,
    undos: u64,
}

fn wscale_for(window: u32) -> u8 {
    let mut s = 0u8;
    while s < 14 && (window >> s) > 0xffff {
        s += 1;
    }
    s
}

impl Connection {
    fn new(
        cfg: ConnConfig,
        local: IpEndpoint,
        remote: IpEndpoint,
        iss: Seq,
        now: Instant,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        if std::mem::discriminant(&local.addr) != std::mem::discriminant(&remote.addr) {
            return Err(ConfigError::AddressMismatch);
        }
        let mss = cfg.local_mss(&remote.addr) as u32;
        let rtt = RttEstimator::new(cfg.rtt).map_err(ConfigError::Rtt)?;
        Ok(Connection {
            cfg,
            local,
            remote,
            state: State::SynSent,
            error: None,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_wnd: 0,
            max_snd_wnd: 0,
            snd_wl1: Seq(0),
            snd_wl2: iss,
            snd_wscale: 0,
            snd_mss: 536.min(mss),
            local_mss: mss,
            seg_max: 536.min(mss),
            fin_queued: false,
            fin_seq: None,
            board: Scoreboard::new(iss.wrapping_add(1), ScoreboardConfig::default()),
            rack: Rack::new(RackConfig {
                max_segments: cfg.max_segments,
                ..RackConfig::default()
            }),
            tlp: Tlp::new(),
            tlp_due: false,
            rtt,
            rto_timer: RtoTimer::new(),
            karn: KarnSampler::new(),
            rto_retries: 0,
            cc: cc::Controller::new(cc::CcConfig {
                algorithm: cfg.cc,
                mss: 536,
                initial_window: 536 * cfg.initial_window_segments.max(1),
            }),
            reo_at: None,
            pto_at: None,
            persist_at: None,
            persist_backoff: 0,
            persist_probes: 0,
            persist_due: false,
            last_send: None,
            syn_due: true,
            syn_retries: 0,
            nosack_dups: 0,
            fast_rexmit: None,
            first_rexmit_due: false,
            after_rto: false,
            undo: None,
            recovery_probes: 0,
            irs: Seq(0),
            rx: Reassembly::new(Seq(0), cfg.ooo),
            store: PieceStore::default(),
            delivered: 0,
            delivered_seq: Seq(0),
            fin_rcvd: false,
            fin_at: None,
            rcv_wscale: if cfg.window_scaling {
                wscale_for(cfg.rx_window_max)
            } else {
                0
            },
            rcv_adv: Seq(0),
            rx_free: 0,
            rx_room_max: 0,
            ack_now: false,
            delack_at: None,
            unacked_bytes: 0,
            rcv_mss: 536.min(mss),
            sack_ok: false,
            ts_ok: false,
            ws_ok: false,
            ts_clock: TsClock::new(now - Duration::from_millis(1)),
            ts_origin: now - Duration::from_millis(1),
            ts_recent: 0,
            ts_recent_at: now,
            last_ack_sent: Seq(0),
            challenge_window: None,
            challenge_count: 0,
            time_wait_at: None,
            last_rcv: now,
            keepalive_at: None,
            keepalive_sent: 0,
            keepalive_due: false,
            pending: None,
            info: Counters::default(),
        })
    }

    /// Active open: the first [`Self::poll_transmit`] sends the SYN (ISS `iss`).
    pub fn connect(
        cfg: ConnConfig,
        local: IpEndpoint,
        remote: IpEndpoint,
        iss: Seq,
        now: Instant,
    ) -> Result<Self, ConfigError> {
        let mut c = Self::new(cfg, local, remote, iss, now)?;
        c.rto_timer.on_send(now, &c.rtt);
        Ok(c)
    }

    /// Passive open from a SYN the owner's listener received: SYN-RECEIVED; the first
    /// [`Self::poll_transmit`] sends the SYN-ACK.
    pub fn accept_syn(
        cfg: ConnConfig,
        local: IpEndpoint,
        remote: IpEndpoint,
        syn: &TcpRepr,
        iss: Seq,
        now: Instant,
    ) -> Result<Self, ConfigError> {
        if syn.control != TcpControl::Syn || syn.ack_number.is_some() {
            return Err(ConfigError::NotASyn);
        }
        let mut c = Self::new(cfg, local, remote, iss, now)?;
        c.state = State::SynReceived;
        c.take_syn_options(syn, now);
        c.rto_timer.on_send(now, &c.rtt);
        Ok(c)
    }

    /// The peer's SYN options and initial sequence number.
    fn take_syn_options(&mut self, syn: &TcpRepr, _now: Instant) {
        self.irs = Seq::from(syn.seq_number);
        let rcv_nxt = self.irs.wrapping_add(1);
        self.rx = Reassembly::new(rcv_nxt, self.cfg.ooo);
        self.delivered_seq = rcv_nxt;
        self.rcv_adv = rcv_nxt;
        self.last_ack_sent = rcv_nxt;
        self.ws_ok = self.cfg.window_scaling && syn.window_scale.is_some();
        self.snd_wscale = if self.ws_ok {
            syn.window_scale.unwrap_or(0).min(14)
        } else {
            0
        };
        if !self.ws_ok {
            self.rcv_wscale = 0;
        }
        self.sack_ok = self.cfg.sack && syn.sack_permitted;
        self.ts_ok = self.cfg.timestamps && syn.timestamp.is_some();
        if let Some(ts) = syn.timestamp {
            self.ts_recent = ts.tsval;
            self.ts_recent_at = _now;
        }
        // RFC 9293 §3.7.1: 536 without the option (IPv4), 1220 for IPv6 (RFC 8200 §5).
        let default = match self.remote.addr {
            IpAddress::Ipv4(_) => 536,
            IpAddress::Ipv6(_) => 1220,
        };
        let peer_mss = syn.max_seg_size.map_or(default, |m| m as u32).max(64);
        self.seg_max = peer_mss.min(self.local_mss).max(64);
        self.snd_mss = self.seg_max.saturating_sub(self.options_len(0)).max(32);
        // The SYN's window is never scaled (RFC 7323 §2.2).
        self.snd_wnd = syn.window_len as u32;
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = self.irs;
    }

    /// Set up the sender's parts once the handshake fixed the MSS.
    fn on_established(&mut self, now: Instant) {
        let base = self.iss.wrapping_add(1);
        self.board = Scoreboard::new(
            base,
            ScoreboardConfig {
                smss: self.snd_mss,
                max_ranges: self.cfg.ooo.max_ranges,
                ..ScoreboardConfig::default()
            },
        );
        self.cc = cc::Controller::new(cc::CcConfig {
            algorithm: self.cfg.cc,
            mss: self.snd_mss,
            initial_window: self.snd_mss * self.cfg.initial_window_segments.max(1),
        });
        self.rto_timer.stop();
        self.rto_retries = 0;
        self.syn_due = false;
        self.arm_keepalive(now);
    }

    /// The state.
    pub fn state(&self) -> State {
        self.state
    }
    /// Why it ended, if abnormally.
    pub fn error(&self) -> Option<ConnError> {
        self.error
    }
    /// Local endpoint.
    pub fn local(&self) -> IpEndpoint {
        self.local
    }
    /// Remote endpoint.
    pub fn remote(&self) -> IpEndpoint {
        self.remote
    }
    /// Whether SACK, timestamps and window scaling were negotiated.
    pub fn negotiated(&self) -> (bool, bool, bool) {
        (self.sack_ok, self.ts_ok, self.ws_ok)
    }
    /// Our and the peer's window scale shift (0 when not negotiated).
    pub fn window_scales(&self) -> (u8, u8) {
        (self.rcv_wscale, self.snd_wscale)
    }
    /// Whether the peer's FIN arrived and every byte before it reached the sink.
    pub fn rx_eof(&self) -> bool {
        self.fin_rcvd && self.store.bytes() == 0 && self.delivered_seq == self.rx.rcv_nxt()
    }
    /// Whether the connection may still accept bytes to send (not closed for writing).
    pub fn may_send(&self) -> bool {
        matches!(
            self.state,
            State::Established | State::CloseWait | State::SynSent | State::SynReceived
        ) && !self.fin_queued
    }
    /// RCV.NXT (the peer's FIN included once received).
    pub fn rcv_nxt(&self) -> Seq {
        self.rx.rcv_nxt().wrapping_add(self.fin_rcvd as u32)
    }

    /// Counters and estimates.
    pub fn info(&self) -> TcpInfo {
        TcpInfo {
            state: self.state,
            retransmits: self.info.retransmits,
            rto_count: self.info.rto_count,
            tlp_count: self.info.tlp_count,
            fast_recoveries: self.info.fast_recoveries,
            dsacks_received: self.info.dsacks,
            cwnd: self.cc.cwnd(),
            ssthresh: self.cc.ssthresh(),
            srtt: self.rtt.srtt(),
            rttvar: self.rtt.rttvar(),
            rto: self.rtt.rto(),
            min_rtt: self.rtt.min_rtt(),
            bytes_sent: self.info.bytes_sent,
            bytes_acked: self.info.bytes_acked,
            bytes_received: self.info.bytes_received,
            reordering_seen: self.rack.reordering_seen(),
            ooo_bytes: self.store.bytes() as u64,
            ooo_dropped: self.info.ooo_dropped,
            undos: self.info.undos,
            challenge_acks: self.info.challenge_acks,
            snd_mss: self.snd_mss,
            snd_wnd: self.snd_wnd,
        }
    }

    /// Change keep-alive (`SO_KEEPALIVE`, `TCP_KEEPIDLE`/`KEEPINTVL`/`KEEPCNT`): `idle`
    /// `None` turns it off; otherwise the idle timer restarts at `now`.
    pub fn set_keepalive(
        &mut self,
        idle: Option<Duration>,
        interval: Duration,
        probes: u32,
        now: Instant,
    ) {
        self.cfg.keepalive = idle;
        self.cfg.keepalive_interval = interval;
        self.cfg.keepalive_probes = probes.max(1);
        if self.state.synchronized() && self.state != State::TimeWait {
            self.arm_keepalive(now);
        } else {
            self.keepalive_at = None;
        }
    }

    /// Turn Nagle's algorithm on or off (`TCP_NODELAY`).
    pub fn set_nagle(&mut self, on: bool) {
        self.cfg.nagle = on;
    }

    /// Close the write side: a FIN follows the queued bytes (RFC 9293 §3.10.4). The owner
    /// must not queue more bytes after it.
    pub fn close(&mut self) {
        match self.state {
            State::SynSent => self.enter_closed(None),
            State::SynReceived | State::Established | State::CloseWait => self.fin_queued = true,
            _ => {}
        }
    }

    /// Abort: a RST leaves on the next [`Self::poll_transmit`], then CLOSED (§3.10.5).
    pub fn abort(&mut self) {
        // RFC 9293 §3.10.5: in CLOSING, LAST-ACK and TIME-WAIT just delete the connection.
        let rst = match self.state {
            State::Closing | State::LastAck | State::TimeWait => false,
            s => s.synchronized() || s == State::SynReceived,
        };
        if rst {
            self.pending = Some(Pending::Rst(self.snd_nxt, Some(self.rcv_nxt())));
        }
        self.enter_closed(Some(ConnError::Aborted));
    }

    fn enter_closed(&mut self, err: Option<ConnError>) {
        self.state = State::Closed;
        if self.error.is_none() {
            self.error = err;
        }
        self.rto_timer.stop();
        self.pto_at = None;
        self.reo_at = None;
        self.persist_at = None;
        self.delack_at = None;
        self.keepalive_at = None;
        self.time_wait_at = None;
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.rto_timer.stop();
        self.pto_at = None;
        self.reo_at = None;
        self.persist_at = None;
        self.keepalive_at = None;
        self.time_wait_at = Some(now + self.cfg.time_wait);
    }

    fn arm_keepalive(&mut self, now: Instant) {
        self.keepalive_sent = 0;
        self.keepalive_at = self.cfg.keepalive.map(|k| now + k);
    }

    /// The earliest deadline the connection waits for.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.pending.is_some() {
            return Some(Instant::ZERO);
        }
        [
            self.rto_timer.deadline(),
            self.pto_at,
            self.reo_at,
            self.delack_at,
            self.persist_at,
            self.keepalive_at,
            self.time_wait_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // ---------------------------------------------------------------- receive side

    fn rcv_wnd(&self) -> u32 {
        self.rcv_adv.since(self.rx.rcv_nxt()).min(MAX_WINDOW)
    }

    fn challenge_ack(&mut self, now: Instant) {
        // RFC 5961 §7: at most `challenge_ack_limit` per second.
        let fresh = self
            .challenge_window
            .is_none_or(|w| elapsed(w, now) >= Duration::from_secs(1));
        if fresh {
            self.challenge_window = Some(now);
            self.challenge_count = 0;
        }
        if self.challenge_count < self.cfg.challenge_ack_limit {
            self.challenge_count += 1;
            self.info.challenge_acks += 1;
            self.ack_now = true;
        }
    }

    /// Deliver what the store holds in order; returns bytes delivered.
    fn deliver_pending(&mut self, sink: &mut impl RxSink) -> u64 {
        let limit = self.delivered + self.rx.rcv_nxt().since(self.delivered_seq) as u64;
        if self.store.bytes() == 0 || limit == self.delivered {
            return 0;
        }
        let n = self
            .store
            .drain_from(self.delivered, limit, |d| sink.deliver(d));
        self.delivered += n;
        self.delivered_seq = self.delivered_seq.wrapping_add(n as u32);
        n
    }

    /// One received segment for this connection (the owner demultiplexed it and checked
    /// its checksum). In-order payload goes to `sink`.
    pub fn on_segment(
        &mut self,
        now: Instant,
        repr: &TcpRepr,
        payload: &[u8],
        sink: &mut impl RxSink,
    ) -> SegmentOutcome {
        let mut out = SegmentOutcome::default();
        out.delivered += self.deliver_pending(sink);
        self.note_room(sink.free());
        match self.state {
            State::Closed => {
                out.dropped = true;
                return out;
            }
            State::SynSent => {
                self.on_segment_syn_sent(now, repr, &mut out);
                return out;
            }
            _ => {}
        }
        self.last_rcv = now;
        if self.state.synchronized() {
            self.arm_keepalive(now);
        }
        let mut seq = Seq::from(repr.seq_number);
        let mut syn = repr.control == TcpControl::Syn;
        let mut payload = payload;
        // Simultaneous open (§3.5, figure 8): the peer's SYN-ACK reaches SYN-RECEIVED. Its
        // SYN is old (already counted in RCV.NXT): trim it (§3.10.7.4, only the new part is
        // processed) so the segment's ACK completes the handshake. Data on it is dropped
        // (not acknowledged, the peer sends it again).
        if self.state == State::SynReceived && syn && seq == self.irs && repr.ack_number.is_some() {
            syn = false;
            seq = self.irs.wrapping_add(1);
            payload = &[];
        }
        let fin = repr.control == TcpControl::Fin;
        let rst = repr.control == TcpControl::Rst;
        let seg_len = payload.len() as u32 + syn as u32 + fin as u32;

        // A retransmitted SYN in SYN-RECEIVED: our SYN-ACK was lost.
        if self.state == State::SynReceived && syn && seq == self.irs && repr.ack_number.is_none() {
            self.syn_due = true;
            return out;
        }
        // TIME-WAIT: a retransmitted FIN is acknowledged and restarts 2·MSL (§3.10.7.4).
        if self.state == State::TimeWait
            && fin
            && seq.wrapping_add(payload.len() as u32 + 1) == self.rcv_nxt()
        {
            self.ack_now = true;
            self.time_wait_at = Some(now + self.cfg.time_wait);
            return out;
        }

        // RFC 7323 §5.3 PAWS: an old timestamp marks an old duplicate.
        if self.ts_ok && !rst {
            if let Some(ts) = repr.timestamp {
                // RFC 7323 §5.5: a TS.Recent older than 24 days is invalid (the peer's
                // clock may have wrapped half its space): take the segment's TSval.
                if elapsed(self.ts_recent_at, now) > TS_RECENT_MAX_AGE {
                    self.ts_recent = ts.tsval;
                    self.ts_recent_at = now;
                } else if (ts.tsval.wrapping_sub(self.ts_recent) as i32) < 0 {
                    self.ack_now = true;
                    out.dropped = true;
                    return out;
                }
            }
        }

        // RFC 9293 §3.10.7.4 first: the acceptability test.
        let rcv_nxt = self.rcv_nxt();
        let wnd = if self.fin_rcvd { 0 } else { self.rcv_wnd() };
        let in_wnd = |s: Seq| s.diff(rcv_nxt) >= 0 && (s.since(rcv_nxt) < wnd);
        let acceptable = match (seg_len, wnd) {
            (0, 0) => seq == rcv_nxt,
            (0, _) => in_wnd(seq),
            (_, 0) => false,
            (l, _) => in_wnd(seq) || in_wnd(seq.wrapping_add(l - 1)),
        };
        // A zero window still takes ACKs of data-carrying segments at RCV.NXT.
        let zero_window_ack = !acceptable && wnd == 0 && seq == rcv_nxt && !rst && !syn;
        if !acceptable && !zero_window_ack {
            if !rst {
                self.ack_now = true;
                // RFC 2883 §4: a wholly old duplicate is reported as DSACK.
                let end = seq.wrapping_add(payload.len() as u32);
                if self.sack_ok && !syn && !payload.is_empty() && end.before_eq(self.rx.rcv_nxt()) {
                    self.rx
                        .insert(seq, payload.len().min(MAX_WINDOW as usize) as u32, 0);
                }
            }
            out.dropped = true;
            return out;
        }

        // Second: RST (RFC 5961 §3.2).
        if rst {
            if seq == rcv_nxt {
                let err = if self.state == State::SynReceived {
                    ConnError::Refused
                } else {
                    ConnError::Reset
                };
                let err = if matches!(
                    self.state,
                    State::Closing | State::LastAck | State::TimeWait
                ) {
                    None
                } else {
                    Some(err)
                };
                self.enter_closed(err);
            } else {
                self.challenge_ack(now);
            }
            return out;
        }
        // Fourth: SYN in a synchronized state (RFC 5961 §4.2): challenge ACK.
        if syn {
            self.challenge_ack(now);
            out.dropped = true;
            return out;
        }
        // Fifth: the ACK field.
        let Some(ack) = repr.ack_number.map(Seq::from) else {
            out.dropped = true;
            return out;
        };
        if self.state == State::SynReceived {
            if ack.after(self.snd_una) && ack.before_eq(self.snd_nxt) {
                self.state = State::Established;
                self.on_established(now);
                self.snd_wnd = (repr.window_len as u32) << self.snd_wscale;
                self.max_snd_wnd = self.snd_wnd;
                self.snd_wl1 = seq;
                self.snd_wl2 = ack;
            } else {
                self.pending = Some(Pending::Rst(ack, None));
                out.dropped = true;
                return out;
            }
        }
        // RFC 5961 §5.2: an ACK outside SND.UNA − MAX.SND.WND ..= SND.NXT.
        if ack.after(self.snd_nxt) {
            self.challenge_ack(now);
            out.dropped = true;
            return out;
        }
        if ack.before(self.snd_una.wrapping_sub(self.max_snd_wnd)) {
            self.challenge_ack(now);
            out.dropped = true;
            return out;
        }
        // RFC 7323 §4.3: TS.Recent follows segments that cover Last.ACK.sent.
        if self.ts_ok {
            if let Some(ts) = repr.timestamp {
                if seq.before_eq(self.last_ack_sent) {
                    self.ts_recent = ts.tsval;
                    self.ts_recent_at = now;
                }
            }
        }
        self.on_ack(now, seq, ack, repr, payload.len() as u32, &mut out);
        if self.state == State::Closed {
            return out;
        }

        // Seventh: the payload.
        if !payload.is_empty() && !zero_window_ack {
            if self.state.can_receive_data() && !self.fin_rcvd {
                self.receive_data(now, seq, payload, fin, sink, &mut out);
            } else {
                self.ack_now = true;
            }
        } else if zero_window_ack && !payload.is_empty() {
            self.ack_now = true;
        }
        // Eighth: FIN.
        if fin && !self.fin_rcvd && self.state.can_receive_data() {
            let at = seq.wrapping_add(payload.len() as u32);
            if self.fin_at.is_none() && at.since(self.rx.rcv_nxt()) < MAX_WINDOW {
                self.fin_at = Some(at);
            }
            self.ack_now = true;
        }
        self.check_fin(now);
        out.delivered += self.deliver_pending(sink);
        self.note_room(sink.free());
        out
    }

    fn check_fin(&mut self, now: Instant) {
        if self.fin_rcvd || self.fin_at != Some(self.rx.rcv_nxt()) {
            return;
        }
        self.fin_rcvd = true;
        self.ack_now = true;
        match self.state {
            State::Established | State::SynReceived => self.state = State::CloseWait,
            State::FinWait1 => {
                if self.fin_acked() {
                    self.enter_time_wait(now)
                } else {
                    self.state = State::Closing
                }
            }
            State::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }

    fn fin_acked(&self) -> bool {
        self.fin_seq.is_some_and(|f| self.snd_una.after(f))
    }

    fn receive_data(
        &mut self,
        now: Instant,
        seq: Seq,
        payload: &[u8],
        _fin: bool,
        sink: &mut impl RxSink,
        out: &mut SegmentOutcome,
    ) {
        let had_holes = self.rx.range_count() > 0;
        let wnd = self.rcv_wnd();
        let len = payload.len().min(MAX_WINDOW as usize) as u32;
        match self.rx.insert(seq, len, wnd) {
            Received::Accepted {
                stored,
                advanced,
                duplicate,
                trimmed,
                ..
            } => {
                let skip = stored.start.since(seq) as usize;
                let data = &payload[skip..skip + stored.len() as usize];
                let base = self.delivered + stored.start.since(self.delivered_seq) as u64;
                if advanced > 0 {
                    self.info.bytes_received += advanced as u64;
                    if self.store.bytes() == 0 && stored.start == self.delivered_seq {
                        // The one copy: straight to the sink.
                        let n = sink.deliver(data).min(data.len());
                        out.delivered += n as u64;
                        self.delivered += n as u64;
                        self.delivered_seq = self.delivered_seq.wrapping_add(n as u32);
                        if n < data.len() {
                            self.store.insert(base + n as u64, &data[n..]);
                        }
                    } else {
                        self.store.insert(base, data);
                    }
                } else if !data.is_empty() {
                    self.store.insert(base, data);
                }
                // RFC 5681 §4.2: immediate ACK for out-of-order segments and for those
                // filling a hole; DSACK (RFC 2883) at once too.
                if advanced == 0 || had_holes || duplicate.is_some() || trimmed > 0 {
                    self.ack_now = true;
                } else {
                    self.unacked_bytes = self.unacked_bytes.saturating_add(len);
                    // The peer's full segment size as seen (Linux `rcv_mss`): with
                    // timestamps a full segment is 1448 bytes, not the MSS.
                    if len > self.rcv_mss {
                        self.rcv_mss = len.min(self.local_mss);
                    }
                    match self.cfg.ack_delay {
                        None => self.ack_now = true,
                        Some(_) if self.unacked_bytes >= 2 * self.rcv_mss => self.ack_now = true,
                        Some(d) => {
                            if self.delack_at.is_none() {
                                self.delack_at = Some(now + d);
                            }
                        }
                    }
                }
            }
            Received::Duplicate(_) => self.ack_now = true,
            Received::Dropped(_) => {
                self.info.ooo_dropped += 1;
                self.ack_now = true;
            }
        }
    }

    fn on_segment_syn_sent(&mut self, now: Instant, repr: &TcpRepr, out: &mut SegmentOutcome) {
        let ack = repr.ack_number.map(Seq::from);
        // RFC 9293 §3.10.7.3: an ACK outside ISS+1..=SND.NXT gets a RST (unless a RST).
        let ack_ok = ack.map(|a| a.after(self.iss) && a.before_eq(self.snd_nxt));
        if ack_ok == Some(false) {
            if repr.control != TcpControl::Rst {
                self.pending = Some(Pending::Rst(ack.unwrap_or(Seq(0)), None));
            }
            out.dropped = true;
            return;
        }
        if repr.control == TcpControl::Rst {
            // RFC 5961 §3.2 for SYN-SENT: only a RST acknowledging our SYN counts.
            if ack_ok == Some(true) {
                self.enter_closed(Some(ConnError::Refused));
            }
            out.dropped = true;
            return;
        }
        if repr.control != TcpControl::Syn {
            out.dropped = true;
            return;
        }
        self.take_syn_options(repr, now);
        self.last_rcv = now;
        match ack {
            Some(a) => {
                // RTT sample of the SYN (not retransmitted: Karn).
                if self.syn_retries == 0 {
                    if let Some(sent) = self.last_send {
                        self.rtt.on_sample(elapsed(sent, now), now);
                    }
                }
                self.snd_una = a;
                self.state = State::Established;
                self.on_established(now);
                self.snd_wl2 = a;
                self.ack_now = true;
            }
            None => {
                // Simultaneous open (§3.5): SYN-RECEIVED, SYN-ACK with the same ISS.
                self.state = State::SynReceived;
                self.syn_due = true;
            }
        }
    }

    /// The ACK field of an acceptable segment (§3.10.7.4 fifth).
    fn on_ack(
        &mut self,
        now: Instant,
        seq: Seq,
        ack: Seq,
        repr: &TcpRepr,
        payload_len: u32,
        out: &mut SegmentOutcome,
    ) {
        // Any ACK answers the zero-window probes.
        self.persist_probes = 0;
        // Window update (SND.WL1/WL2 rule).
        if self.snd_wl1.before(seq) || (self.snd_wl1 == seq && self.snd_wl2.before_eq(ack)) {
            let w = ((repr.window_len as u64) << self.snd_wscale).min(MAX_WINDOW as u64) as u32;
            self.snd_wnd = w;
            self.max_snd_wnd = self.max_snd_wnd.max(w);
            self.snd_wl1 = seq;
            self.snd_wl2 = ack;
            if w > 0 {
                self.persist_at = None;
                self.persist_backoff = 0;
            }
        }
        let newly = if ack.after(self.snd_una) {
            ack.since(self.snd_una)
        } else {
            0
        };
        let data_start = self.iss.wrapping_add(1);
        let data_end = self.fin_seq.unwrap_or(self.snd_nxt);
        if newly > 0 {
            // Only the SYN's octet (SND.UNA = ISS) is no data. Not `max_seq(ISS + 1)`:
            // 2^31 octets after ISS that compares the other way, and the whole distance
            // back to ISS counted as acknowledged data (the send queue lost unsent bytes).
            let lo = if self.snd_una == self.iss {
                data_start
            } else {
                self.snd_una
            };
            let hi = ack.min_seq(data_end);
            let data = if hi.after(lo) { hi.since(lo) } else { 0 };
            out.acked += data as u64;
            self.info.bytes_acked += data as u64;
            self.snd_una = ack;
            self.rto_retries = 0;
            self.recovery_probes = 0;
        }
        let blocks = if self.sack_ok {
            SackList::from_smoltcp(&repr.sack_ranges)
        } else {
            SackList::new()
        };
        let flight_before = self.board.outstanding();
        let sacked_before = self.board.sacked_bytes();
        let info = self.board.on_ack(ack, &blocks);
        if !info.ignored {
            // The SACK blocks without the DSACK one (at most 4, no allocation).
            let mut valid = [SackBlock::new(Seq(0), Seq(0)); 4];
            let mut nvalid = 0;
            for b in blocks.iter().skip(usize::from(info.dsack.is_some())) {
                valid[nvalid] = b;
                nvalid += 1;
            }
            let valid = &valid[..nvalid];
            let ts_echo = if self.ts_ok {
                repr.timestamp
                    .filter(|t| t.tsecr != 0)
                    .map(|t| self.ts_instant(t.tsecr))
            } else {
                None
            };
            let rack_sample = self.rack.on_ack(
                now,
                ack,
                valid,
                info.dsack.is_some(),
                ts_echo,
                self.rtt.min_rtt(),
            );
            if let Some(d) = info.dsack {
                self.info.dsacks += 1;
                self.on_dsack_for_undo(now, d);
            }
            // RTT: the send time of the newest never-retransmitted segment this ACK
            // delivered (RACK's records, cumulative or SACK; microseconds, Karn-safe),
            // else Karn's sampler, else the echoed timestamp (RFC 7323 §4; whole
            // milliseconds, so a sub-millisecond path would read 0 from it alone).
            let karn = if info.acked > 0 {
                self.karn.on_ack(ack, now)
            } else {
                None
            };
            let mut sample = rack_sample.or(karn);
            if sample.is_some() || info.acked > 0 {
                if sample.is_none() && self.ts_ok {
                    if let Some(t) = repr.timestamp.filter(|t| t.tsecr != 0) {
                        sample = self.ts_clock.rtt_from_tsecr(now, t.tsecr);
                    }
                }
                if let Some(s) = sample {
                    self.rtt.on_sample(s, now);
                }
            }
            match self.tlp.on_ack(ack, info.dsack) {
                TlpVerdict::RepairedLoss => {
                    // RFC 8985 §7.4.2: the probe repaired a loss; respond as to one.
                    let fs = self.board.outstanding();
                    self.cc.enter_recovery(
                        now,
                        self.board.pipe(),
                        self.flight_for_cc(flight_before.max(fs)),
                    );
                    self.cc.exit_recovery(now);
                }
                TlpVerdict::NoLoss | TlpVerdict::Pending => {}
            }
            let pipe = self.board.pipe();
            self.cc.on_ack(
                now,
                &cc::AckEvent {
                    // Each octet counted once (octets SACKed earlier are not counted again
                    // when the cumulative ACK passes them).
                    newly_acked: cc::newly_acked_not_sacked(
                        info.acked,
                        info.newly_sacked,
                        sacked_before,
                        self.board.sacked_bytes(),
                    ),
                    newly_sacked: info.newly_sacked,
                    rtt: sample,
                    min_rtt: self.rtt.min_rtt(),
                    pipe,
                    flight_size: self.board.outstanding(),
                    app_limited: false,
                },
            );
            if info.recovery_ended {
                self.after_rto = false;
                self.rack.on_recovery_exit();
                self.cc.exit_recovery(now);
            }
            if self.sack_ok {
                self.detect_loss(now);
            } else if info.acked == 0
                && payload_len == 0
                && self.board.outstanding() > 0
                && ack == self.snd_una
                && !self.board.in_recovery()
            {
                // Without SACK: RFC 5681 duplicate ACKs (payload-free, same window).
                self.nosack_dups += 1;
                if self.nosack_dups == 3 {
                    if let Some(b) = self.board.enter_recovery() {
                        self.info.fast_recoveries += 1;
                        self.undo = Some(Vec::new());
                        self.cc.enter_recovery(
                            now,
                            self.board.pipe(),
                            self.flight_for_cc(self.board.outstanding()),
                        );
                        self.fast_rexmit = Some(b);
                    }
                }
            }
            if info.acked > 0 {
                self.nosack_dups = 0;
            }
        }
        self.rto_timer
            .on_ack(now, &self.rtt, newly > 0, self.snd_una == self.snd_nxt);
        if newly > 0 {
            self.arm_pto(now);
        }
        // State changes on our FIN's ACK.
        if self.fin_acked() {
            match self.state {
                State::FinWait1 => self.state = State::FinWait2,
                State::Closing => self.enter_time_wait(now),
                State::LastAck => self.enter_closed(None),
                _ => {}
            }
        }
    }

    /// The latest instant the TSval `tsecr` echoes can have been sent at (TSval counts
    /// whole milliseconds from `ts_origin`): RACK's "delivered copy was the original" test
    /// (RFC 8985 §6.2 step 2) must not mistake a retransmission sent later in the same
    /// millisecond for the original.
    fn ts_instant(&self, tsecr: u32) -> Instant {
        let ms = self.ts_origin.total_millis() + tsecr as i64;
        Instant::from_micros(ms * 1000 + 999)
    }

    /// FlightSize for the congestion response: SND.NXT − SND.UNA (RFC 5681 (4)), but no
    /// more than cwnd. With SACK the sender keeps sending while pipe is below cwnd, so the
    /// outstanding span (SACKed octets included) can reach the peer's whole window; halving
    /// that would leave cwnd far above what the path holds (Linux takes cwnd).
    fn flight_for_cc(&self, outstanding: u32) -> u32 {
        outstanding.min(self.cc.cwnd().max(self.snd_mss))
    }

    /// A DSACK block `d` arrived: if it reports one of the last fast recovery's
    /// retransmissions (not a copy the network duplicated), strike it; when none is left,
    /// every retransmission was spurious: undo the window reduction (RFC 9438 §4.9).
    fn on_dsack_for_undo(&mut self, now: Instant, d: SackBlock) {
        let Some(list) = self.undo.as_mut() else {
            return;
        };
        if let Some(i) = list
            .iter()
            .position(|r| d.contains_block(r) || r.contains_block(&d))
        {
            list.swap_remove(i);
            if list.is_empty() {
                self.undo = None;
                if self.cc.undo_reduction(now) {
                    self.info.undos += 1;
                }
            }
        }
    }

    fn detect_loss(&mut self, now: Instant) {
        let srtt = self.rtt.srtt().unwrap_or(self.cfg.rtt.initial_rto);
        let min = self.rtt.min_rtt().unwrap_or(srtt);
        let wnd = self.rack.reo_wnd(min, srtt, self.board.in_recovery());
        let scan = self.rack.detect_loss(now, wnd);
        if scan.newly_lost > 0 {
            for b in self.rack.lost() {
                self.board.mark_lost(b);
            }
            if !self.board.in_recovery() && self.board.begin_recovery() {
                self.info.fast_recoveries += 1;
                self.undo = Some(Vec::new());
                self.tlp.reset();
                self.pto_at = None;
                self.cc.enter_recovery(
                    now,
                    self.board.pipe(),
                    self.flight_for_cc(self.board.outstanding()),
                );
                // RFC 6675 §5 (4.3): the first segment presumed lost leaves now, outside
                // PRR's quota (which starts at 0 and may stay there with no further ACK).
                self.first_rexmit_due = true;
            }
        }
        self.reo_at = scan.reorder_timeout.map(|t| now + t);
    }

    /// In recovery RFC 8985 §7.2 arms no probe, and RACK finds a lost retransmission
    /// only when something sent after it is delivered. A sender limited by the peer's
    /// window (or with nothing more to send) sends nothing after it, so a lost
    /// retransmission would wait for the RTO. Each retransmission in recovery therefore
    /// (re)arms a probe at the PTO: it fires only when recovery sent nothing for that
    /// long, and retransmits the highest undelivered segment (or sends new data).
    fn arm_recovery_probe(&mut self, now: Instant) {
        let rto_left = self.rto_timer.deadline().map(|d| elapsed(now, d));
        let ack_delay = self.cfg.ack_delay.map(|d| d.max(Duration::from_millis(1)));
        let pto = Tlp::pto(self.rtt.srtt(), false, ack_delay, rto_left).max(MIN_PTO);
        self.pto_at = Some(now + pto);
    }

    fn arm_pto(&mut self, now: Instant) {
        let outstanding = self.snd_nxt != self.snd_una;
        if self
            .tlp
            .may_arm(self.sack_ok, outstanding, self.board.in_recovery())
        {
            let rto_left = self.rto_timer.deadline().map(|d| elapsed(now, d));
            let one = self.snd_nxt.since(self.snd_una) <= self.snd_mss;
            let ack_delay = Some(self.cfg.peer_max_ack_delay);
            let pto = Tlp::pto(self.rtt.srtt(), one, ack_delay, rto_left).max(MIN_PTO);
            self.pto_at = Some(now + pto);
        } else if !self.board.in_recovery() {
            self.pto_at = None;
        }
    }

    // ---------------------------------------------------------------- send side

    /// The next segment to send, if any: RST, SYN/SYN-ACK, retransmissions (RACK-TLP /
    /// RFC 6675 marks, probes), new data and FIN within cwnd/rwnd, or a pure ACK. Runs the
    /// timers that are due first. Call until `None`; emit each with [`Segment::emit`]
    /// before calling again (offsets are relative to SND.UNA of this moment). `sink` is
    /// asked for its free space (the receive window) and given bytes held back earlier.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        tx: &impl TxSource,
        sink: &mut impl RxSink,
    ) -> Option<Segment> {
        self.deliver_pending(sink);
        self.note_room(sink.free());
        if let Some(Pending::Rst(seq, ack)) = self.pending.take() {
            return Some(self.rst_segment(seq, ack));
        }
        self.run_timers(now);
        match self.state {
            State::Closed => None,
            State::SynSent | State::SynReceived => {
                if self.syn_due {
                    self.syn_due = false;
                    Some(self.syn_segment(now))
                } else {
                    None
                }
            }
            _ => self.transmit_synced(now, tx),
        }
    }

    fn run_timers(&mut self, now: Instant) {
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        if due(self.time_wait_at) {
            self.enter_closed(None);
            return;
        }
        if due(self.delack_at) {
            self.delack_at = None;
            self.ack_now = true;
        }
        if due(self.reo_at) {
            self.reo_at = None;
            self.detect_loss(now);
        }
        if due(self.pto_at) {
            self.pto_at = None;
            self.tlp_due = true;
        }
        if self.rto_timer.expired(now) {
            self.on_rto(now);
            if self.state == State::Closed {
                return;
            }
        }
        if due(self.persist_at) {
            self.persist_at = None;
            self.persist_due = true;
        }
        if due(self.keepalive_at) {
            if self.snd_una != self.snd_nxt {
                // Data outstanding: the RTO watches the peer.
                self.arm_keepalive(now);
            } else if self.keepalive_sent >= self.cfg.keepalive_probes {
                self.enter_closed(Some(ConnError::TimedOut));
            } else {
                self.keepalive_sent += 1;
                self.keepalive_due = true;
                self.keepalive_at = Some(now + self.cfg.keepalive_interval);
            }
        }
    }

    fn on_rto(&mut self, now: Instant) {
        match self.state {
            State::SynSent | State::SynReceived => {
                self.syn_retries += 1;
                if self.syn_retries > self.cfg.syn_retries {
                    self.enter_closed(Some(ConnError::TimedOut));
                    return;
                }
                self.syn_due = true;
                self.rto_timer.on_expired(now, &mut self.rtt);
            }
            _ if self.snd_una != self.snd_nxt => {
                self.rto_retries += 1;
                if self.rto_retries > self.cfg.max_rto_retries {
                    self.enter_closed(Some(ConnError::TimedOut));
                    return;
                }
                self.info.rto_count += 1;
                // RFC 6298 §5.5–5.6: back off and restart; RFC 6675 §5.1 / RFC 8985 §6.3:
                // every un-SACKed segment is lost.
                self.rto_timer.on_expired(now, &mut self.rtt);
                let flight = self.flight_for_cc(self.board.outstanding());
                self.board.on_rto();
                self.rack.on_rto();
                for b in self.rack.lost() {
                    self.board.mark_lost(b);
                }
                self.cc.on_rto(now, flight);
                self.tlp.reset();
                self.tlp_due = false;
                self.pto_at = None;
                self.karn.on_retransmit();
                self.fast_rexmit = None;
                self.first_rexmit_due = false;
                self.after_rto = true;
                self.undo = None;
            }
            _ => self.rto_timer.stop(),
        }
    }

    /// TCP option bytes of a synchronized-state segment with `sack_blocks` SACK blocks
    /// (timestamps 10, SACK 2 + 8 per block, padded to 4 as `TcpRepr::header_len` does).
    fn options_len(&self, sack_blocks: usize) -> u32 {
        let ts = if self.ts_ok { 10 } else { 0 };
        let sack = if sack_blocks > 0 {
            2 + 8 * sack_blocks as u32
        } else {
            0
        };
        (ts + sack).div_ceil(4) * 4
    }

    /// At most the SACK blocks the next segment carries (RFC 2018: up to three).
    fn sack_blocks_owed(&self) -> usize {
        if self.sack_ok {
            (self.rx.range_count() + self.rx.dsack_pending() as usize).min(3)
        } else {
            0
        }
    }

    /// Most payload a new segment may carry now: the effective MSS less the options this
    /// segment carries (Linux `tcp_current_mss`).
    fn current_mss(&self) -> u32 {
        self.seg_max
            .saturating_sub(self.options_len(self.sack_blocks_owed()))
            .clamp(1, self.snd_mss)
    }

    fn base_repr(&self, seq: Seq, control: TcpControl, ack: Option<Seq>) -> TcpRepr<'static> {
        TcpRepr {
            src_port: self.local.port,
            dst_port: self.remote.port,
            control,
            seq_number: seq.into(),
            ack_number: ack.map(Into::into),
            window_len: 0,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        }
    }

    fn rst_segment(&self, seq: Seq, ack: Option<Seq>) -> Segment {
        Segment {
            repr: self.base_repr(seq, TcpControl::Rst, ack),
            payload_offset: 0,
            payload_len: 0,
        }
    }

    fn syn_segment(&mut self, now: Instant) -> Segment {
        let passive = self.state == State::SynReceived;
        let ack = passive.then(|| self.rcv_nxt());
        let mut r = self.base_repr(self.iss, TcpControl::Syn, ack);
        let free = self
            .rx_free
            .min(self.cfg.rx_window_max as usize)
            .min(0xffff);
        r.window_len = free as u16;
        r.max_seg_size = Some(self.local_mss as u16);
        let (ws, sack, ts) = if passive {
            (self.ws_ok, self.sack_ok, self.ts_ok)
        } else {
            (self.cfg.window_scaling, self.cfg.sack, self.cfg.timestamps)
        };
        r.window_scale = ws.then_some(self.rcv_wscale);
        r.sack_permitted = sack;
        r.timestamp = ts.then(|| {
            TcpTimestampRepr::new(
                self.ts_clock.tsval(now),
                if passive { self.ts_recent } else { 0 },
            )
        });
        if passive {
            self.rcv_adv = self.rx.rcv_nxt().wrapping_add(free as u32);
        }
        self.snd_nxt = self.iss.wrapping_add(1);
        self.last_send = Some(now);
        self.rto_timer.on_send(now, &self.rtt);
        Segment {
            repr: r,
            payload_offset: 0,
            payload_len: 0,
        }
    }

    /// The window that would be advertised now, without advertising it: the sink's room
    /// (less the in-order bytes it has not taken), rounded down to the window-scale unit
    /// and capped at `0xffff << shift`, receiver SWS avoidance (RFC 9293 §3.8.6.2.2),
    /// never moving the right edge left (§3.8.6, RFC 7323 §2.4). Returns (the window chosen
    /// before rounding the field up, the field value, the right edge it advertises).
    fn advertisable(&self) -> (u32, u32, Seq) {
        let s = self.rcv_wscale as u32;
        let rcv_nxt = self.rx.rcv_nxt();
        let pending = rcv_nxt.since(self.delivered_seq) as usize;
        let free = self
            .rx_free
            .saturating_sub(pending)
            .min(self.cfg.rx_window_max as usize)
            .min((0xffffusize) << s) as u32;
        let cur = self.advertised_now();
        let new = free & !((1u32 << s) - 1);
        let step = self.sws_step();
        let wnd = if new > cur && new - cur >= step.max(1) {
            new
        } else {
            cur
        };
        let field = (wnd as u64).div_ceil(1u64 << s).min(0xffff) as u32;
        (wnd, field, rcv_nxt.wrapping_add(field << s))
    }

    /// RCV.ADV − RCV.NXT: the window the peer was last told (0 when passed).
    fn advertised_now(&self) -> u32 {
        let rcv_nxt = self.rx.rcv_nxt();
        if self.rcv_adv.after(rcv_nxt) {
            self.rcv_adv.since(rcv_nxt)
        } else {
            0
        }
    }

    /// The window field to send now (see [`Self::advertisable`]); updates RCV.ADV.
    fn window_field(&mut self) -> u16 {
        let (_, field, edge) = self.advertisable();
        if edge.after(self.rcv_adv) {
            self.rcv_adv = edge;
        }
        field as u16
    }

    /// The sink's room now, and the largest seen (the receive buffer's size as far as the
    /// connection can tell).
    fn note_room(&mut self, free: usize) {
        self.rx_free = free;
        self.rx_room_max = self.rx_room_max.max(free);
    }

    /// RCV.BUFF of RFC 9293 §3.8.6.2.2: the largest room the sink offered, at most
    /// `rx_window_max`.
    fn rx_buffer(&self) -> u32 {
        (self.rx_room_max.min(self.cfg.rx_window_max as usize) as u32).max(1)
    }

    /// Receiver SWS avoidance (RFC 9293 §3.8.6.2.2): the right edge moves only by at least
    /// min(RCV.BUFF / 2, MSS).
    fn sws_step(&self) -> u32 {
        (self.rx_buffer() / 2).min(self.local_mss).max(1)
    }

    /// Whether freed room makes a window update worth an ACK of its own: the window that
    /// would actually be advertised (rounding, scale cap and SWS step included) moves the
    /// right edge, and the window last advertised is below half the buffer.
    fn window_update_due(&self) -> bool {
        let cur = self.advertised_now();
        let (wnd, _, edge) = self.advertisable();
        wnd > cur && edge.after(self.rcv_adv) && cur < self.rx_buffer() / 2
    }

    /// A segment of the synchronized states carrying ACK, window, SACK and timestamps.
    fn data_repr(&mut self, now: Instant, seq: Seq, control: TcpControl) -> TcpRepr<'static> {
        let ack = self.rcv_nxt();
        let mut r = self.base_repr(seq, control, Some(ack));
        r.window_len = self.window_field();
        if self.sack_ok {
            r.sack_ranges = self.rx.sack_blocks(3).to_smoltcp();
        }
        if self.ts_ok {
            r.timestamp = Some(TcpTimestampRepr::new(
                self.ts_clock.tsval(now),
                self.ts_recent,
            ));
        }
        self.ack_now = false;
        self.delack_at = None;
        self.unacked_bytes = 0;
        self.last_ack_sent = ack;
        r
    }

    /// A segment for the sequence range `range` (data, maybe the FIN).
    fn range_segment(&mut self, now: Instant, range: SackBlock, psh: bool) -> Segment {
        let start = range.start.max_seq(self.snd_una);
        let fin = self
            .fin_seq
            .is_some_and(|f| start.before_eq(f) && f.before(range.end));
        let data_end = match self.fin_seq {
            Some(f) if fin => f,
            _ => range.end,
        };
        let len = if data_end.after(start) {
            data_end.since(start)
        } else {
            0
        };
        let control = if fin {
            TcpControl::Fin
        } else if psh {
            TcpControl::Psh
        } else {
            TcpControl::None
        };
        let mut repr = self.data_repr(now, start, control);
        // A retransmission keeps its original size: fewer SACK blocks then, so the segment
        // never exceeds the effective MSS (and the MTU).
        let mut n = repr.sack_ranges.iter().filter(|b| b.is_some()).count();
        while n > 0 && len + self.options_len(n) > self.seg_max {
            n -= 1;
            repr.sack_ranges[n] = None;
        }
        self.info.bytes_sent += len as u64;
        self.last_send = Some(now);
        Segment {
            repr,
            payload_offset: start.since(self.snd_una) as u64,
            payload_len: len as usize,
        }
    }

    fn retransmit(&mut self, now: Instant, b: SackBlock, tx: &impl TxSource) -> Segment {
        let b = self.record_clamp(tx, SackBlock::new(b.start.max_seq(self.snd_una), b.end));
        self.rack.on_retransmit(b, now);
        self.board.on_retransmit(b);
        self.karn.on_retransmit();
        self.info.retransmits += 1;
        if let Some(list) = self.undo.as_mut() {
            if list.len() < MAX_UNDO_RANGES {
                list.push(b);
            } else {
                // Too many to follow: this reduction will not be undone.
                self.undo = None;
            }
        }
        self.cc.on_sent(now, b.len());
        self.rto_timer.on_send(now, &self.rtt);
        if self.board.in_recovery() && !self.after_rto && self.recovery_probes < MAX_RECOVERY_PROBES
        {
            self.arm_recovery_probe(now);
        }
        self.range_segment(now, b, false)
    }

    /// Where new data would start, its length and whether it may carry the FIN.
    fn new_data_plan(&self, tx: &impl TxSource, ignore_cwnd: bool) -> Option<(u32, bool, bool)> {
        if self.fin_seq.is_some() || !matches!(self.state, State::Established | State::CloseWait) {
            return None;
        }
        let sent = self.snd_nxt.since(self.snd_una) as u64;
        let avail = tx.len().saturating_sub(sent).min(MAX_WINDOW as u64) as u32;
        let right = self.snd_una.wrapping_add(self.snd_wnd);
        let wnd_left = if right.after(self.snd_nxt) {
            right.since(self.snd_nxt)
        } else {
            0
        };
        let mss = self.current_mss();
        // Records (FPDUs): one whole record per segment, or wait (records.rs).
        let record = match self.record_plan(tx, sent, avail) {
            RecordPlan::Stream => None,
            RecordPlan::Incomplete => return None,
            RecordPlan::Whole(r) => Some(r),
        };
        let full = match (record, tx.next_boundary(sent)) {
            (Some(r), _) => r,
            (None, Some(b)) if b > sent => {
                avail.min(mss).min((b - sent).min(MAX_WINDOW as u64) as u32)
            }
            _ => avail.min(mss),
        };
        let pipe = self.board.pipe();
        let quota = if ignore_cwnd {
            u32::MAX
        } else {
            self.cc.send_quota(pipe)
        };
        let mut len = full.min(wnd_left).min(quota);
        if let Some(r) = record {
            if len < r {
                len = self.record_len(tx, sent, wnd_left, quota, pipe)?;
            }
        }
        let outstanding = self.snd_nxt != self.snd_una;
        let all = len == avail;
        let fin = self.fin_queued && all;
        if len == 0 {
            // A lone FIN needs no window.
            return (fin && avail == 0).then_some((0, true, true));
        }
        if len < full {
            // Limited by the peer's window or cwnd: sender SWS avoidance (§3.8.6.2.1).
            let window_limited = len == wnd_left;
            if outstanding && (!window_limited || len < self.max_snd_wnd / 2) {
                return None;
            }
            if !outstanding && !window_limited && quota < full && pipe > 0 {
                return None;
            }
        } else if self.cfg.nagle && len < mss && outstanding && all && !fin {
            // Nagle (§3.7.4): one small segment in flight at a time.
            return None;
        }
        Some((len, fin && len == avail, all))
    }

    fn send_new(&mut self, now: Instant, len: u32, fin: bool, psh: bool) -> Option<Segment> {
        let seq = self.snd_nxt;
        let end = seq.wrapping_add(len + fin as u32);
        if !self.rack.on_send(SackBlock::new(seq, end), now) {
            return None;
        }
        if let Some(last) = self.last_send {
            if self.snd_una == self.snd_nxt && elapsed(last, now) > self.rtt.rto() {
                self.cc.on_idle(now, self.rtt.rto());
            }
        }
        if fin {
            self.fin_seq = Some(seq.wrapping_add(len));
            self.state = match self.state {
                State::CloseWait => State::LastAck,
                _ => State::FinWait1,
            };
        }
        self.snd_nxt = end;
        self.board.on_send_new(end);
        self.karn.on_send(end, now);
        self.rto_timer.on_send(now, &self.rtt);
        self.cc.on_sent(now, len + fin as u32);
        let seg = self.range_segment(now, SackBlock::new(seq, end), psh && !fin);
        if !self.tlp.in_flight() {
            self.arm_pto(now);
        }
        Some(seg)
    }

    fn probe_segment(&mut self, now: Instant) -> Segment {
        // An ACK one below SND.NXT: the peer finds it unacceptable and answers with an ACK
        // carrying its window (zero-window probe, keep-alive).
        let seq = self.snd_nxt.wrapping_sub(1);
        let repr = self.data_repr(now, seq, TcpControl::None);
        Segment {
            repr,
            payload_offset: 0,
            payload_len: 0,
        }
    }

    fn transmit_synced(&mut self, now: Instant, tx: &impl TxSource) -> Option<Segment> {
        if let Some(b) = self.fast_rexmit.take() {
            return Some(self.retransmit(now, b, tx));
        }
        if self.tlp_due {
            self.tlp_due = false;
            let plan = self.new_data_plan(tx, true).filter(|p| p.0 > 0);
            match self
                .tlp
                .on_pto(plan.is_some(), self.rack.last_undelivered())
            {
                Probe::NewData => {
                    if let Some((len, fin, psh)) = plan {
                        if let Some(seg) = self.send_new(now, len, fin, psh) {
                            self.info.tlp_count += 1;
                            self.tlp.on_probe_sent(self.snd_nxt, false);
                            self.pto_at = None;
                            return Some(seg);
                        }
                    }
                }
                Probe::Retransmit(b) => {
                    self.info.tlp_count += 1;
                    let in_recovery = self.board.in_recovery();
                    if in_recovery {
                        self.recovery_probes += 1;
                    }
                    let seg = self.retransmit(now, b, tx);
                    self.tlp.on_probe_sent(self.snd_nxt, true);
                    if !in_recovery {
                        self.pto_at = None;
                    }
                    return Some(seg);
                }
                Probe::Nothing => {}
            }
        }
        // Retransmit what RACK (or the RTO) marked lost, within the congestion quota.
        let first_lost = self.rack.lost().next();
        if let Some(b) = first_lost {
            let pipe = self.board.pipe();
            let quota = self.cc.send_quota(pipe);
            let first = std::mem::take(&mut self.first_rexmit_due) && quota == 0;
            if first || quota >= b.len().min(self.snd_mss) || pipe == 0 {
                return Some(self.retransmit(now, b, tx));
            }
            return self.ack_if_owed(now);
        }
        self.first_rexmit_due = false;
        if let Some((len, fin, psh)) = self.new_data_plan(tx, false) {
            if let Some(seg) = self.send_new(now, len, fin, psh) {
                return Some(seg);
            }
        }
        // Zero window with data waiting and nothing in flight: the persist timer.
        let sent = self.snd_nxt.since(self.snd_una) as u64;
        let blocked = self.fin_seq.is_none()
            && tx.len() > sent
            && self.snd_una == self.snd_nxt
            && matches!(self.state, State::Established | State::CloseWait);
        if blocked && self.persist_due {
            self.persist_due = false;
            if self.persist_probes >= self.cfg.max_rto_retries {
                // The peer keeps its window shut and answers nothing: give up.
                self.enter_closed(Some(ConnError::TimedOut));
                return None;
            }
            self.persist_probes += 1;
            self.persist_backoff = (self.persist_backoff + 1).min(10);
            self.persist_at = Some(now + self.persist_interval());
            return Some(self.probe_segment(now));
        }
        if blocked && self.persist_at.is_none() {
            self.persist_at = Some(now + self.persist_interval());
        } else if !blocked {
            self.persist_at = None;
            self.persist_due = false;
        }
        if self.keepalive_due {
            self.keepalive_due = false;
            return Some(self.probe_segment(now));
        }
        if self.window_update_due() {
            self.ack_now = true;
        }
        self.ack_if_owed(now)
    }

    fn persist_interval(&self) -> Duration {
        let base = self.rtt.rto().total_micros();
        Duration::from_micros(
            base.saturating_mul(1 << self.persist_backoff)
                .min(60_000_000),
        )
    }

    fn ack_if_owed(&mut self, now: Instant) -> Option<Segment> {
        if !self.ack_now {
            return None;
        }
        let seq = self.snd_nxt;
        let repr = self.data_repr(now, seq, TcpControl::None);
        Some(Segment {
            repr,
            payload_offset: 0,
            payload_len: 0,
        })
    }
}
