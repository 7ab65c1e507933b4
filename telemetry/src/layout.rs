//! The binary layout of a segment (version [`VERSION`]), its counter sets and its table
//! records. Everything is a native-endian `u64` word at an 8-byte aligned offset; a
//! reader on a host of the other endianness sees a wrong [`MAGIC`] and refuses the file.
//!
//! ```text
//! word  0        MAGIC ("XWARPSTA" as a little-endian u64)
//! word  1        VERSION
//! word  2        total size in bytes
//! word  3        pid of the writer
//! word  4        start time of the writer process (/proc/PID/stat field 22, clock ticks)
//! word  5        engine index within the process (0, 1, ...)
//! word  6        creation time (Unix ns)
//! word  7        last update by the engine (Unix ns)
//! word  8        state: 1 running, 2 stopped
//! words 9..=11   engine counters: offset (bytes), count (words), 0
//! words 12..=14  NIC counters: offset, count, 0
//! words 15..=17  TCP stack counters: offset, count, 0
//! words 18..=20  connection table: offset, capacity (records), words per record
//! words 21..=23  QP table: offset, capacity, words per record
//! words 24..=31  program name (64 bytes, UTF-8, NUL padded)
//! words 32..=35  interface (32 bytes)
//! words 36..=41  address (48 bytes)
//! word  42       pid namespace of the writer (inode of /proc/self/ns/pid; 0: unknown)
//! words 43..64   reserved (0)
//! ```
//!
//! A counter section is `count` words, named by [`EngineCounters::NAMES`],
//! [`NicCounters::NAMES`] and [`StackCounters::NAMES`] in order; new counters are only ever
//! appended (a reader shows what it knows of a longer section, and zeroes for counters a
//! shorter one lacks), any other change bumps [`VERSION`].
//!
//! A table is a 4-word header — sequence number (odd while the engine writes), record
//! count, records that did not fit, publication time (Unix ns) — followed by `capacity`
//! records of `words per record` words ([`ConnRecord::WORDS`], [`QpRecord::WORDS`]). The
//! sequence number makes it a seqlock: a reader copies the table and keeps the copy only
//! if the number was even and unchanged across the copy.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// First word of every segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"XWARPSTA");
/// Layout version described in this module.
pub const VERSION: u64 = 1;
/// Header size in words.
pub const HEADER_WORDS: usize = 64;
/// Words of a table's header (sequence, count, dropped, publication time).
pub const TABLE_HEADER_WORDS: usize = 4;

/// Header word indices.
pub(crate) mod h {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const SIZE: usize = 2;
    pub const PID: usize = 3;
    pub const START_TICKS: usize = 4;
    pub const INDEX: usize = 5;
    pub const CREATED_NS: usize = 6;
    pub const UPDATED_NS: usize = 7;
    pub const STATE: usize = 8;
    pub const ENGINE: usize = 9;
    pub const NIC: usize = 12;
    pub const STACK: usize = 15;
    pub const CONNS: usize = 18;
    pub const QPS: usize = 21;
    pub const PROGRAM: (usize, usize) = (24, 64);
    pub const INTERFACE: (usize, usize) = (32, 32);
    pub const ADDRESS: (usize, usize) = (36, 48);
    /// The writer's pid namespace ([`crate::pid_namespace`]; 0: unknown).
    pub const PID_NS: usize = 42;
}

/// Header `state` word of a running engine.
pub const STATE_RUNNING: u64 = 1;
/// Header `state` word of an engine whose loop has ended.
pub const STATE_STOPPED: u64 = 2;

/// "Not available" in a record or counter word.
pub const NA: u64 = u64::MAX;

macro_rules! counter_set {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        pub struct $name {
            $($(#[$fm])* pub $f: u64,)*
        }

        impl $name {
            /// Counter names, in layout order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($f)),*];
            /// Number of counters.
            pub const LEN: usize = Self::NAMES.len();

            /// The values in layout order.
            pub fn to_words(&self) -> [u64; Self::LEN] {
                [$(self.$f),*]
            }

            /// From words in layout order; counters missing from `w` are 0, extra words
            /// are ignored.
            pub fn from_words(w: &[u64]) -> Self {
                let mut it = w.iter().copied();
                $name { $($f: it.next().unwrap_or(0),)* }
            }

            /// `(name, value)` pairs in layout order.
            pub fn pairs(&self) -> impl Iterator<Item = (&'static str, u64)> {
                Self::NAMES.iter().copied().zip(self.to_words())
            }
        }
    };
}

counter_set! {
    /// Counters of the engine loop (`poll-driver`'s `EngineStats` plus where the time went).
    EngineCounters {
        /// Loop iterations.
        iterations,
        /// Iterations in which the service reported work.
        busy_iterations,
        /// Times the engine slept in `poll(2)`.
        sleeps,
        /// Sleeps cancelled because work showed up while preparing to sleep.
        sleeps_cancelled,
        /// Wakeups with the doorbell readable.
        wakeups_doorbell,
        /// Wakeups with the backend's wait fd readable.
        wakeups_backend,
        /// Wakeups because a deadline passed.
        wakeups_timeout,
        /// Transient backend errors the loop rode over.
        backend_soft_errors,
        /// Doorbell rings by application threads.
        doorbell_rings,
        /// Rings that had to write the eventfd (the engine slept).
        doorbell_syscalls,
        /// Nanoseconds since the loop started.
        run_ns,
        /// Nanoseconds spent idle but awake (spinning or yielding).
        spin_ns,
        /// Nanoseconds spent asleep in `poll(2)`.
        sleep_ns,
    }
}

counter_set! {
    /// Counters of the NIC backend. `mode` is one of the `MODE_*` constants.
    NicCounters {
        /// Backend kind and XDP attach mode ([`MODE_VWIRE`], [`MODE_XDP_GENERIC`], ...).
        mode,
        /// 1 when the AF_XDP socket is bound zero-copy, 0 in copy mode ([`NA`] otherwise).
        zero_copy,
        /// 1 when the AF_XDP socket takes multi-buffer frames ([`NA`] otherwise).
        multi_buffer,
        /// Frames handed to the stack.
        rx_frames,
        /// Bytes handed to the stack.
        rx_bytes,
        /// Frames submitted for transmission.
        tx_frames,
        /// Bytes submitted for transmission.
        tx_bytes,
        /// Frames dropped, all causes (the backend's own `dropped`).
        dropped,
        /// Received frames the backend dropped itself (invalid or oversize descriptors).
        rx_dropped_backend,
        /// Frames to send dropped for want of a free TX buffer (completion stall).
        tx_no_buffer,
        /// Kernel: frames dropped for other reasons than a full ring (`rx_dropped`).
        xsk_rx_dropped,
        /// Kernel: frames dropped because the RX ring was full (`rx_ring_full`).
        xsk_rx_ring_full,
        /// Kernel: times the fill ring was empty when a frame arrived (fill stall).
        xsk_fill_ring_empty,
        /// Kernel: times the TX ring was empty when the kernel looked (`tx_ring_empty_descs`).
        xsk_tx_ring_empty,
        /// Kernel: invalid RX descriptors.
        xsk_rx_invalid_descs,
        /// Kernel: invalid TX descriptors.
        xsk_tx_invalid_descs,
        /// Frames sent with TX checksum offload.
        tx_csum_offloaded,
        /// Multi-buffer chains read in place.
        rx_chains_in_place,
        /// Multi-buffer chains copied into one buffer.
        rx_chains_copied,
        /// Virtual wire: frames lost to injected faults (drop, rate limit, queue full,
        /// oversize); [`NA`] on other backends.
        wire_faults,
    }
}

counter_set! {
    /// Counters of the TCP stack (`xwarp-stack`'s `StackStats` and `EngineUsage`).
    StackCounters {
        /// Connections established (active and passive).
        established,
        /// Connections accepted from listeners.
        accepted,
        /// Connections that ended with a reset.
        resets,
        /// Sockets recycled after CLOSED.
        recycled,
        /// Bytes moved from application rings into TCP send buffers.
        tx_bytes,
        /// Bytes moved from TCP receive buffers into application rings.
        rx_bytes,
        /// Listening sockets armed.
        listeners_armed,
        /// SYNs dropped at a full backlog or limit.
        syn_dropped_backlog,
        /// Connects refused at a limit.
        refused_limit,
        /// Flows evicted from the ACK watch.
        flows_evicted,
        /// Handshakes expired in SYN-RECEIVED.
        syn_received_expired,
        /// smoltcp sockets alive.
        sockets,
        /// Socket buffer bytes held.
        socket_buffer_bytes,
        /// Connection records (application and hosted).
        connections,
        /// Hosted (in-engine protocol) connections.
        hosted_connections,
        /// Listening ports.
        listeners,
    }
}

/// [`NicCounters::mode`]: unknown backend.
pub const MODE_UNKNOWN: u64 = 0;
/// [`NicCounters::mode`]: the in-process virtual wire.
pub const MODE_VWIRE: u64 = 1;
/// [`NicCounters::mode`]: AF_XDP with the program attached in generic (SKB) mode.
pub const MODE_XDP_GENERIC: u64 = 2;
/// [`NicCounters::mode`]: AF_XDP with the program attached in native (driver) mode.
pub const MODE_XDP_NATIVE: u64 = 3;

/// Name of a [`NicCounters::mode`] value.
pub fn mode_name(mode: u64) -> &'static str {
    match mode {
        MODE_VWIRE => "vwire",
        MODE_XDP_GENERIC => "xdp-generic",
        MODE_XDP_NATIVE => "xdp-native",
        _ => "unknown",
    }
}

/// Encode an optional socket address into 3 words: family (4, 6 or 0) | port << 16, then
/// the 16 address bytes (IPv4 in the first 4).
fn put_addr(w: &mut [u64], a: Option<SocketAddr>) {
    let (fam, port, bytes) = match a {
        None => (0u64, 0u16, [0u8; 16]),
        Some(SocketAddr::V4(v)) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v.ip().octets());
            (4, v.port(), b)
        }
        Some(SocketAddr::V6(v)) => (6, v.port(), v.ip().octets()),
    };
    w[0] = fam | (u64::from(port) << 16);
    w[1] = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
    w[2] = u64::from_le_bytes(bytes[8..].try_into().unwrap_or_default());
}

fn get_addr(w: &[u64]) -> Option<SocketAddr> {
    let port = (w[0] >> 16) as u16;
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&w[1].to_le_bytes());
    b[8..].copy_from_slice(&w[2].to_le_bytes());
    match w[0] & 0xffff {
        4 => Some(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::new(b[0], b[1], b[2], b[3]),
            port,
        ))),
        6 => Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(b),
            port,
            0,
            0,
        ))),
        _ => None,
    }
}

fn opt(v: u64) -> Option<u64> {
    (v != NA).then_some(v)
}

fn unopt(v: Option<u64>) -> u64 {
    v.unwrap_or(NA)
}

/// Linux TCP state names by number (`include/net/tcp_states.h`), as `ss` prints them.
pub fn tcp_state_name(state: u8) -> &'static str {
    match state {
        1 => "ESTAB",
        2 => "SYN-SENT",
        3 => "SYN-RECV",
        4 => "FIN-WAIT-1",
        5 => "FIN-WAIT-2",
        6 => "TIME-WAIT",
        7 => "CLOSED",
        8 => "CLOSE-WAIT",
        9 => "LAST-ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        _ => "?",
    }
}

/// One TCP connection of an engine, as `ss -ti` would show it. `None` means the engine
/// does not know the value (e.g. smoltcp does not expose the congestion window).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ConnRecord {
    /// Connection id within the engine.
    pub id: u64,
    /// Linux TCP state number ([`tcp_state_name`]).
    pub state: u8,
    /// Owned by the in-engine protocol host (an iWARP connection), not an application.
    pub hosted: bool,
    /// Local address.
    pub local: Option<SocketAddr>,
    /// Remote address.
    pub remote: Option<SocketAddr>,
    /// Bytes handed to TCP for sending.
    pub bytes_sent: u64,
    /// Of those, bytes the peer acknowledged.
    pub bytes_acked: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Bytes in the TCP send buffer (unacknowledged or unsent).
    pub send_queue: u64,
    /// Size of the TCP send buffer.
    pub send_buffer: u64,
    /// Bytes in the TCP receive buffer not yet taken by the application.
    pub recv_queue: u64,
    /// Size of the TCP receive buffer.
    pub recv_buffer: u64,
    /// Bytes waiting in the application's receive ring (`None` for hosted connections).
    pub rx_ring_used: Option<u64>,
    /// Bytes waiting in the application's send ring (`None` for hosted connections).
    pub tx_ring_used: Option<u64>,
    /// Retransmissions the engine triggered (its loss rescues; smoltcp's own timer
    /// retransmissions are not counted).
    pub retransmits: u64,
    /// Smoothed RTT in µs (the engine's RFC 6298 estimate).
    pub srtt_us: Option<u64>,
    /// RTT variance in µs.
    pub rttvar_us: Option<u64>,
    /// Retransmission timeout in µs.
    pub rto_us: Option<u64>,
    /// Congestion window in bytes (`None`: smoltcp does not expose it).
    pub cwnd: Option<u64>,
    /// Maximum segment size.
    pub mss: u64,
}

impl ConnRecord {
    /// Words per record in the table.
    pub const WORDS: usize = 24;

    /// Encode into `w` (at least [`Self::WORDS`] long).
    pub fn encode(&self, w: &mut [u64]) {
        let w = &mut w[..Self::WORDS];
        w.fill(0);
        w[0] = self.id;
        w[1] = u64::from(self.state) | (u64::from(self.hosted) << 8);
        put_addr(&mut w[2..5], self.local);
        put_addr(&mut w[5..8], self.remote);
        w[8] = self.bytes_sent;
        w[9] = self.bytes_acked;
        w[10] = self.bytes_received;
        w[11] = self.send_queue;
        w[12] = self.send_buffer;
        w[13] = self.recv_queue;
        w[14] = self.recv_buffer;
        w[15] = unopt(self.rx_ring_used);
        w[16] = unopt(self.tx_ring_used);
        w[17] = self.retransmits;
        w[18] = unopt(self.srtt_us);
        w[19] = unopt(self.rttvar_us);
        w[20] = unopt(self.rto_us);
        w[21] = unopt(self.cwnd);
        w[22] = self.mss;
    }

    /// Decode from `w` (at least [`Self::WORDS`] long); any bit pattern decodes.
    pub fn decode(w: &[u64]) -> ConnRecord {
        ConnRecord {
            id: w[0],
            state: w[1] as u8,
            hosted: (w[1] >> 8) & 1 == 1,
            local: get_addr(&w[2..5]),
            remote: get_addr(&w[5..8]),
            bytes_sent: w[8],
            bytes_acked: w[9],
            bytes_received: w[10],
            send_queue: w[11],
            send_buffer: w[12],
            recv_queue: w[13],
            recv_buffer: w[14],
            rx_ring_used: opt(w[15]),
            tx_ring_used: opt(w[16]),
            retransmits: w[17],
            srtt_us: opt(w[18]),
            rttvar_us: opt(w[19]),
            rto_us: opt(w[20]),
            cwnd: opt(w[21]),
            mss: w[22],
        }
    }
}

/// State of a queue pair, as the verbs layer reports it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[repr(u8)]
pub enum QpState {
    /// Not connected yet (RESET/INIT/RTR, or the MPA exchange in progress).
    #[default]
    Idle = 0,
    /// Ready to send.
    Rts = 1,
    /// Closing gracefully.
    Closing = 2,
    /// A Terminate was sent or received.
    Terminate = 3,
    /// Error: work requests are flushed.
    Error = 4,
    /// A value this reader does not know.
    Unknown = 255,
}

impl QpState {
    /// From its number; unknown numbers give [`QpState::Unknown`].
    pub fn from_u8(v: u8) -> QpState {
        match v {
            0 => QpState::Idle,
            1 => QpState::Rts,
            2 => QpState::Closing,
            3 => QpState::Terminate,
            4 => QpState::Error,
            _ => QpState::Unknown,
        }
    }

    /// Short upper-case name (`IDLE`, `RTS`, ...).
    pub fn name(self) -> &'static str {
        match self {
            QpState::Idle => "IDLE",
            QpState::Rts => "RTS",
            QpState::Closing => "CLOSING",
            QpState::Terminate => "TERMINATE",
            QpState::Error => "ERROR",
            QpState::Unknown => "?",
        }
    }
}

/// The code of a Terminate message (RFC 5040 §7.1): layer, error type, error code.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TermCode {
    /// Layer (0 RDMAP, 1 DDP, 2 LLP/MPA).
    pub layer: u8,
    /// Error type within the layer.
    pub etype: u8,
    /// Error code.
    pub code: u8,
}

fn put_term(t: Option<TermCode>) -> u64 {
    t.map_or(0, |t| {
        1 << 24 | u64::from(t.layer) << 16 | u64::from(t.etype) << 8 | u64::from(t.code)
    })
}

fn get_term(w: u64) -> Option<TermCode> {
    (w >> 24 & 1 == 1).then_some(TermCode {
        layer: (w >> 16) as u8,
        etype: (w >> 8) as u8,
        code: w as u8,
    })
}

/// One queue pair of an engine (filled in by the protocol host, see `xwarp-stack`'s
/// `ProtocolHost::qp_records`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct QpRecord {
    /// QP number.
    pub qp_num: u32,
    /// State.
    pub state: QpState,
    /// Local address of its TCP connection.
    pub local: Option<SocketAddr>,
    /// Remote address.
    pub remote: Option<SocketAddr>,
    /// Negotiated MPA revision (1 or 2; 0 before the exchange).
    pub mpa_revision: u8,
    /// MPA CRC in use.
    pub crc: bool,
    /// MPA markers in use.
    pub markers: bool,
    /// Inbound RDMA Read queue depth.
    pub ird: u32,
    /// Outbound RDMA Read queue depth.
    pub ord: u32,
    /// Send queue work requests posted.
    pub wr_posted_send: u64,
    /// Receive queue work requests posted.
    pub wr_posted_recv: u64,
    /// Work requests completed successfully.
    pub wr_completed: u64,
    /// Work requests flushed (completed in error).
    pub wr_flushed: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Payload bytes placed into local memory.
    pub bytes_placed: u64,
    /// Tagged placements (RDMA Write, Read Response).
    pub placements_tagged: u64,
    /// Untagged placements (Send, Read Request, Terminate).
    pub placements_untagged: u64,
    /// RDMA Read Requests served.
    pub read_requests_served: u64,
    /// FPDUs with a bad CRC.
    pub crc_errors: u64,
    /// Terminates sent.
    pub terminates_sent: u64,
    /// Terminates received.
    pub terminates_received: u64,
    /// Code of the last Terminate sent.
    pub last_terminate_sent: Option<TermCode>,
    /// Code of the last Terminate received.
    pub last_terminate_received: Option<TermCode>,
}

impl QpRecord {
    /// Words per record in the table.
    pub const WORDS: usize = 24;

    /// Encode into `w` (at least [`Self::WORDS`] long).
    pub fn encode(&self, w: &mut [u64]) {
        let w = &mut w[..Self::WORDS];
        w.fill(0);
        w[0] = u64::from(self.qp_num)
            | u64::from(self.state as u8) << 32
            | u64::from(self.mpa_revision) << 40
            | u64::from(self.crc) << 48
            | u64::from(self.markers) << 56;
        w[1] = u64::from(self.ird) | u64::from(self.ord) << 32;
        put_addr(&mut w[2..5], self.local);
        put_addr(&mut w[5..8], self.remote);
        let c = [
            self.wr_posted_send,
            self.wr_posted_recv,
            self.wr_completed,
            self.wr_flushed,
            self.bytes_sent,
            self.bytes_placed,
            self.placements_tagged,
            self.placements_untagged,
            self.read_requests_served,
            self.crc_errors,
            self.terminates_sent,
            self.terminates_received,
        ];
        w[8..20].copy_from_slice(&c);
        w[20] = put_term(self.last_terminate_sent);
        w[21] = put_term(self.last_terminate_received);
    }

    /// Decode from `w` (at least [`Self::WORDS`] long); any bit pattern decodes.
    pub fn decode(w: &[u64]) -> QpRecord {
        QpRecord {
            qp_num: w[0] as u32,
            state: QpState::from_u8((w[0] >> 32) as u8),
            mpa_revision: (w[0] >> 40) as u8,
            crc: (w[0] >> 48) & 1 == 1,
            markers: (w[0] >> 56) & 1 == 1,
            ird: w[1] as u32,
            ord: (w[1] >> 32) as u32,
            local: get_addr(&w[2..5]),
            remote: get_addr(&w[5..8]),
            wr_posted_send: w[8],
            wr_posted_recv: w[9],
            wr_completed: w[10],
            wr_flushed: w[11],
            bytes_sent: w[12],
            bytes_placed: w[13],
            placements_tagged: w[14],
            placements_untagged: w[15],
            read_requests_served: w[16],
            crc_errors: w[17],
            terminates_sent: w[18],
            terminates_received: w[19],
            last_terminate_sent: get_term(w[20]),
            last_terminate_received: get_term(w[21]),
        }
    }
}

/// A record type stored in a table.
pub trait Record: Sized {
    /// Words per record.
    const WORDS: usize;
    /// Encode into `w`.
    fn encode_into(&self, w: &mut [u64]);
    /// Decode from `w`.
    fn decode_from(w: &[u64]) -> Self;
}

impl Record for ConnRecord {
    const WORDS: usize = ConnRecord::WORDS;
    fn encode_into(&self, w: &mut [u64]) {
        self.encode(w)
    }
    fn decode_from(w: &[u64]) -> Self {
        ConnRecord::decode(w)
    }
}

impl Record for QpRecord {
    const WORDS: usize = QpRecord::WORDS;
    fn encode_into(&self, w: &mut [u64]) {
        self.encode(w)
    }
    fn decode_from(w: &[u64]) -> Self {
        QpRecord::decode(w)
    }
}

/// `ip` as text (helper for displays).
pub fn ip_text(a: Option<SocketAddr>) -> String {
    match a {
        None => "-".into(),
        Some(SocketAddr::V4(v)) => format!("{}:{}", v.ip(), v.port()),
        Some(SocketAddr::V6(v)) => match v.ip().to_ipv4_mapped() {
            Some(m) => format!("{}:{}", IpAddr::V4(m), v.port()),
            None => format!("[{}]:{}", v.ip(), v.port()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_any_words_decode() {
        let c = ConnRecord {
            id: 7,
            state: 1,
            hosted: true,
            local: Some("10.0.0.1:80".parse().unwrap()),
            remote: Some("[fe80::1]:4242".parse().unwrap()),
            bytes_sent: 1 << 40,
            rx_ring_used: Some(5),
            srtt_us: Some(120),
            mss: 1460,
            ..ConnRecord::default()
        };
        let mut w = [0u64; ConnRecord::WORDS];
        c.encode(&mut w);
        assert_eq!(ConnRecord::decode(&w), c);
        let q = QpRecord {
            qp_num: 0xdead_beef,
            state: QpState::Terminate,
            mpa_revision: 2,
            crc: true,
            ird: 16,
            ord: 8,
            remote: Some("10.0.0.2:9999".parse().unwrap()),
            crc_errors: 3,
            terminates_sent: 1,
            last_terminate_sent: Some(TermCode {
                layer: 2,
                etype: 1,
                code: 2,
            }),
            ..QpRecord::default()
        };
        let mut w = [0u64; QpRecord::WORDS];
        q.encode(&mut w);
        assert_eq!(QpRecord::decode(&w), q);
        // Garbage decodes to something, without panicking.
        let junk = [u64::MAX; 24];
        let r = QpRecord::decode(&junk);
        assert_eq!(r.state, QpState::Unknown);
        let c = ConnRecord::decode(&junk);
        assert_eq!((c.local, c.srtt_us), (None, None));
        assert_eq!(tcp_state_name(c.state), "?");
    }

    #[test]
    fn counter_sets_are_named_in_order_and_tolerate_other_lengths() {
        let e = EngineCounters {
            iterations: 1,
            sleep_ns: 9,
            ..EngineCounters::default()
        };
        let w = e.to_words();
        assert_eq!(w.len(), EngineCounters::NAMES.len());
        assert_eq!(EngineCounters::from_words(&w), e);
        assert_eq!(EngineCounters::from_words(&w[..1]).sleep_ns, 0);
        let mut long = w.to_vec();
        long.push(77);
        assert_eq!(EngineCounters::from_words(&long), e);
        assert_eq!(e.pairs().last(), Some(("sleep_ns", 9)));
        assert_eq!(MAGIC.to_le_bytes(), *b"XWARPSTA");
    }
}
