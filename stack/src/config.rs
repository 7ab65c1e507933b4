//! Engine configuration: addresses, MTU, socket buffers and TCP options.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;
use std::time::Duration;

/// Congestion control algorithm for every socket of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Congestion {
    /// No congestion control: the window is only bounded by the peer's receive window.
    /// Only sensible on a trusted, loss-free link.
    None,
    /// CUBIC (RFC 8312), smoltcp's `socket-tcp-cubic`.
    #[default]
    Cubic,
}

/// Which TCP implementation runs the engine's connections (issue 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpCore {
    /// smoltcp's `tcp::Socket` in a `SocketSet`, with the workarounds of `rescue.rs`.
    Smoltcp,
    /// The crate's own sans-IO connection (`tcp::conn`) for every connection, smoltcp's
    /// `Interface` only for ARP/NDP/ICMP (`own.rs`; opt-in, see the crate README, "Own
    /// TCP core: engine side").
    Own,
}

impl TcpCore {
    /// Parse `own` / `smoltcp` (ASCII case-insensitive, surrounding blanks ignored).
    pub fn parse(s: &str) -> Option<TcpCore> {
        match s.trim().to_ascii_lowercase().as_str() {
            "own" => Some(TcpCore::Own),
            "smoltcp" => Some(TcpCore::Smoltcp),
            _ => None,
        }
    }

    /// The default core: `XWARP_TCP_CORE` (`own` / `smoltcp`) if set and valid, else
    /// [`TcpCore::Smoltcp`]. An invalid value is warned about once per process.
    pub fn from_env() -> TcpCore {
        static WARNED: std::sync::Once = std::sync::Once::new();
        match std::env::var("XWARP_TCP_CORE") {
            Ok(v) => TcpCore::parse(&v).unwrap_or_else(|| {
                WARNED.call_once(|| {
                    log::warn!("XWARP_TCP_CORE={v:?} is neither `own` nor `smoltcp`: using smoltcp")
                });
                TcpCore::Smoltcp
            }),
            Err(_) => TcpCore::Smoltcp,
        }
    }
}

impl Default for TcpCore {
    /// [`TcpCore::from_env`].
    fn default() -> Self {
        TcpCore::from_env()
    }
}

/// Per-socket TCP options applied when a socket is created (connect or accept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpOptions {
    /// `TCP_NODELAY`: `true` disables Nagle's algorithm.
    pub nodelay: bool,
    /// Keep-alive probe interval; `None` disables keep-alive.
    pub keepalive: Option<Duration>,
    /// Delayed-ACK timeout; `None` acknowledges every segment at once.
    pub ack_delay: Option<Duration>,
    /// Abort the connection when nothing is acknowledged for this long (smoltcp `timeout`).
    pub user_timeout: Option<Duration>,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            nodelay: false,
            keepalive: None,
            // smoltcp's default of 10 ms stalls Cubic's small initial window against a
            // peer that waits for a second segment (docs/performance.md §8.2); 1 ms keeps the ACK
            // count halved on bulk transfers without the start-up stall.
            ack_delay: Some(Duration::from_millis(1)),
            user_timeout: None,
        }
    }
}

/// Keep-alive of one connection with Linux's three knobs (`TCP_KEEPIDLE`,
/// `TCP_KEEPINTVL`, `TCP_KEEPCNT`): the connection fails with `TimedOut` once the peer has
/// been silent for `idle + interval * count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// Silence before the peer is probed (`TCP_KEEPIDLE`; Linux default 7200 s).
    pub idle: Duration,
    /// Time between probes (`TCP_KEEPINTVL`; Linux default 75 s).
    pub interval: Duration,
    /// Unanswered probes before the connection is declared dead (`TCP_KEEPCNT`; Linux 9).
    pub count: u32,
}

impl Default for KeepAlive {
    fn default() -> Self {
        KeepAlive {
            idle: Duration::from_secs(7200),
            interval: Duration::from_secs(75),
            count: 9,
        }
    }
}

impl KeepAlive {
    /// How long the peer may stay silent before the connection fails: `idle + interval *
    /// count` (saturating).
    pub fn dead_after(&self) -> Duration {
        self.idle
            .saturating_add(self.interval.saturating_mul(self.count))
    }

    /// The smoltcp probe interval: smoltcp has one keep-alive period, re-armed by every
    /// transmission, so probes go out every `min(idle, interval)` of silence (at least
    /// 1 ms). Linux waits `idle` before the first probe; here the first probe may come
    /// earlier. The failure time (`dead_after`) is Linux's.
    pub fn probe_interval(&self) -> Duration {
        self.idle.min(self.interval).max(Duration::from_millis(1))
    }
}

/// Smallest socket buffer the engine accepts (after doubling), like Linux's
/// `SOCK_MIN_RCVBUF`/`SOCK_MIN_SNDBUF` order of magnitude.
pub const MIN_SOCKET_BUFFER: usize = 4608;

/// Largest socket buffer the engine accepts (after doubling).
pub const MAX_SOCKET_BUFFER: usize = 64 << 20;

/// The buffer a `SO_RCVBUF`/`SO_SNDBUF` request of `requested` bytes yields: Linux
/// doubles the value (room for bookkeeping) and reports the doubled value back; the
/// engine does the same and clamps it to [`MIN_SOCKET_BUFFER`]..=[`MAX_SOCKET_BUFFER`].
pub fn socket_buffer_size(requested: usize) -> usize {
    requested
        .saturating_mul(2)
        .clamp(MIN_SOCKET_BUFFER, MAX_SOCKET_BUFFER)
}

/// Options of one socket chosen by the application before `connect`/`listen`
/// (`None`: the engine default from [`StackConfig`]). Connections accepted from a
/// listener inherit the listener's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SocketOptions {
    /// `TCP_NODELAY`.
    pub nodelay: Option<bool>,
    /// `SO_KEEPALIVE` with its parameters; `None` keeps the engine default.
    pub keepalive: Option<KeepAlive>,
    /// smoltcp receive buffer in bytes (the advertised window follows); see
    /// [`socket_buffer_size`] for turning a `SO_RCVBUF` value into this.
    pub recv_buffer: Option<usize>,
    /// smoltcp send buffer in bytes.
    pub send_buffer: Option<usize>,
}

/// Default of [`StackConfig::max_sockets`] and [`StackConfig::max_tracked_flows`].
pub const DEFAULT_MAX_SOCKETS: usize = 16384;

/// Configuration of one TCP engine (one interface).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackConfig {
    /// Ethernet address of the interface.
    pub mac: [u8; 6],
    /// Static IPv4 address and prefix length.
    pub ipv4: Option<(Ipv4Addr, u8)>,
    /// IPv4 default gateway.
    pub ipv4_gateway: Option<Ipv4Addr>,
    /// Static IPv6 address and prefix length.
    pub ipv6: Option<(Ipv6Addr, u8)>,
    /// IP MTU (bytes of IP packet, without the Ethernet header). The MSS follows from it
    /// (MTU − 40 for IPv4). Capped by the backend's own MTU.
    pub mtu: usize,
    /// smoltcp receive buffer per socket. The advertised window scale follows from it.
    pub rx_buffer: usize,
    /// smoltcp transmit buffer per socket.
    pub tx_buffer: usize,
    /// Application ring per direction per socket (between the app and the smoltcp buffer).
    pub ring_size: usize,
    /// Send TCP timestamps (RFC 7323).
    pub timestamps: bool,
    /// Congestion control.
    pub congestion: Congestion,
    /// Default per-socket options.
    pub tcp: TcpOptions,
    /// Default connect timeout, used when the caller gives none.
    pub connect_timeout: Duration,
    /// Local ports handed out to connections that do not bind one.
    pub ephemeral_ports: RangeInclusive<u16>,
    /// How long a socket closed by the application may go without progress (no byte or
    /// FIN newly acknowledged, no state change) before it is aborted, like Linux
    /// `tcp_fin_timeout`: it bounds FIN-WAIT-2 and a drain that stalled, not a drain that
    /// is still being acknowledged, however slowly.
    pub fin_timeout: Duration,
    /// Upper bound on handshakes in progress (SYN-RECEIVED) per listening port, the
    /// application's and the protocol host's alike (the SYN queue). A SYN beyond it is
    /// dropped before smoltcp sees it, as Linux without SYN cookies does; the client
    /// retransmits it. Each handshake holds a socket with full-size buffers.
    pub syn_backlog: usize,
    /// How long a handshake may stay in SYN-RECEIVED in a listener pool before its socket
    /// is dropped (smoltcp would retransmit the SYN-ACK forever, so spoofed SYNs would hold
    /// the `syn_backlog` slots for good). Linux gives up after `tcp_synack_retries` (5):
    /// about 63 s.
    pub syn_received_timeout: Duration,
    /// Largest accept queue a listener gets: a larger `backlog` is cut to this (Linux
    /// `net.core.somaxconn`, default 4096).
    pub max_backlog: usize,
    /// Most smoltcp sockets the engine holds at once: connections in any state (connecting,
    /// open, closing, TIME-WAIT), handshakes in progress and armed listening sockets. A
    /// connect beyond it fails with [`SocketError::NoBuffers`](crate::SocketError::NoBuffers)
    /// (`io::ErrorKind::OutOfMemory`); a listener is not re-armed (its SYNs are dropped)
    /// until a socket is freed.
    pub max_sockets: usize,
    /// Budget in bytes for the receive and send buffers of all smoltcp sockets together
    /// (each socket allocates both up front). Enforced like `max_sockets`.
    pub socket_buffer_budget: u64,
    /// Most flows the retransmission-floor ACK watch tracks (one per IPv4 connection,
    /// each holding a copy of one ACK frame). Beyond it the flow whose ACK number moved
    /// least recently is evicted (that connection falls back to smoltcp's own 1 s RTO).
    /// 0 tracks nothing (the retransmission floor is then off).
    pub max_tracked_flows: usize,
    /// Listening sockets kept armed per port (each holds full-size buffers).
    pub armed_listeners: usize,
    /// Random seed for the interface (initial sequence numbers, ...).
    pub random_seed: u64,
    /// Retransmission floor for IPv4 flows: when a flow with data outstanding hears no
    /// ACK progress for this long, the engine makes smoltcp fast-retransmit (smoltcp's
    /// own minimum RTO is 1 s; Linux uses 200 ms). `None` leaves smoltcp alone.
    /// Keep it well above the path's round-trip time.
    pub rto_floor: Option<Duration>,
    /// Which TCP implementation runs the connections; the default comes from
    /// `XWARP_TCP_CORE` ([`TcpCore::from_env`]).
    pub tcp_core: TcpCore,
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            mac: [0x02, 0x00, 0x00, 0x00, 0x00, 0x01],
            ipv4: None,
            ipv4_gateway: None,
            ipv6: None,
            mtu: 1500,
            rx_buffer: 1 << 20,
            tx_buffer: 1 << 20,
            ring_size: 256 << 10,
            timestamps: true,
            congestion: Congestion::Cubic,
            tcp: TcpOptions::default(),
            connect_timeout: Duration::from_secs(20),
            ephemeral_ports: 49152..=65535,
            fin_timeout: Duration::from_secs(60),
            syn_backlog: 256,
            syn_received_timeout: Duration::from_secs(63),
            max_backlog: 4096,
            max_sockets: DEFAULT_MAX_SOCKETS,
            socket_buffer_budget: 4 << 30,
            max_tracked_flows: DEFAULT_MAX_SOCKETS,
            armed_listeners: 4,
            random_seed: 0x7877_6172_7000_0001,
            rto_floor: Some(Duration::from_millis(200)),
            tcp_core: TcpCore::from_env(),
        }
    }
}

/// Reasons a [`StackConfig`] is rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// Neither an IPv4 nor an IPv6 address.
    NoAddress,
    /// Prefix length out of range.
    BadPrefix,
    /// MTU below the IPv4 minimum of 576 or above 65535.
    BadMtu,
    /// A buffer or ring size of zero, or a receive buffer above 1 GiB (RFC 7323 limit).
    BadBufferSize,
    /// Empty ephemeral port range or one containing port 0.
    BadPortRange,
    /// `armed_listeners`, `syn_backlog`, `max_backlog` or `max_sockets` is zero.
    BadBacklog,
    /// The MAC address is multicast or all zeros.
    BadMac,
    /// `rto_floor` below 1 ms.
    BadRtoFloor,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            ConfigError::NoAddress => "no IPv4 or IPv6 address configured",
            ConfigError::BadPrefix => "prefix length out of range",
            ConfigError::BadMtu => "MTU must be within 576..=65535",
            ConfigError::BadBufferSize => "buffer sizes must be within 1..=1 GiB",
            ConfigError::BadPortRange => "ephemeral port range is empty or contains 0",
            ConfigError::BadBacklog => {
                "armed_listeners, syn_backlog, max_backlog and max_sockets must be at least 1"
            }
            ConfigError::BadMac => "MAC address must be unicast and non-zero",
            ConfigError::BadRtoFloor => "rto_floor must be at least 1 ms",
        };
        f.write_str(s)
    }
}

impl std::error::Error for ConfigError {}

impl StackConfig {
    /// Check the configuration before an engine is built from it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ipv4.is_none() && self.ipv6.is_none() {
            return Err(ConfigError::NoAddress);
        }
        if matches!(self.ipv4, Some((_, p)) if p > 32)
            || matches!(self.ipv6, Some((_, p)) if p > 128)
        {
            return Err(ConfigError::BadPrefix);
        }
        if !(576..=65535).contains(&self.mtu) {
            return Err(ConfigError::BadMtu);
        }
        let sizes = [self.rx_buffer, self.tx_buffer, self.ring_size];
        if sizes.iter().any(|&s| s == 0 || s > (1 << 30)) {
            return Err(ConfigError::BadBufferSize);
        }
        if self.ephemeral_ports.is_empty() || *self.ephemeral_ports.start() == 0 {
            return Err(ConfigError::BadPortRange);
        }
        if self.armed_listeners == 0
            || self.syn_backlog == 0
            || self.max_backlog == 0
            || self.max_sockets == 0
        {
            return Err(ConfigError::BadBacklog);
        }
        if self.rto_floor.is_some_and(|d| d < Duration::from_millis(1)) {
            return Err(ConfigError::BadRtoFloor);
        }
        if self.mac[0] & 1 != 0 || self.mac == [0; 6] {
            return Err(ConfigError::BadMac);
        }
        Ok(())
    }

    /// The TCP maximum segment size an IPv4 connection advertises for this MTU.
    pub fn ipv4_mss(&self) -> usize {
        self.mtu.saturating_sub(40)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> StackConfig {
        StackConfig {
            ipv4: Some((Ipv4Addr::new(10, 0, 0, 1), 24)),
            ..StackConfig::default()
        }
    }

    #[test]
    fn default_with_address_is_valid() {
        assert_eq!(good().validate(), Ok(()));
        assert_eq!(good().ipv4_mss(), 1460);
    }

    #[test]
    fn socket_buffers_double_and_clamp_like_linux() {
        assert_eq!(socket_buffer_size(65536), 131072);
        assert_eq!(socket_buffer_size(1), MIN_SOCKET_BUFFER);
        assert_eq!(socket_buffer_size(usize::MAX), MAX_SOCKET_BUFFER);
    }

    #[test]
    fn keepalive_fails_after_idle_plus_interval_times_count() {
        let k = KeepAlive {
            idle: Duration::from_secs(2),
            interval: Duration::from_secs(1),
            count: 3,
        };
        assert_eq!(k.dead_after(), Duration::from_secs(5));
        assert_eq!(k.probe_interval(), Duration::from_secs(1));
        assert_eq!(
            KeepAlive::default().dead_after(),
            Duration::from_secs(7200 + 675)
        );
    }

    #[test]
    fn tcp_core_parses_own_and_smoltcp_only() {
        assert_eq!(TcpCore::parse("own"), Some(TcpCore::Own));
        assert_eq!(TcpCore::parse(" Smoltcp\n"), Some(TcpCore::Smoltcp));
        assert_eq!(TcpCore::parse("linux"), None);
        assert_eq!(TcpCore::parse(""), None);
    }

    #[test]
    fn rejects_bad_values() {
        assert_eq!(
            StackConfig::default().validate(),
            Err(ConfigError::NoAddress)
        );
        let c = StackConfig { mtu: 100, ..good() };
        assert_eq!(c.validate(), Err(ConfigError::BadMtu));
        let c = StackConfig {
            rx_buffer: 0,
            ..good()
        };
        assert_eq!(c.validate(), Err(ConfigError::BadBufferSize));
        let c = StackConfig {
            rx_buffer: (1 << 30) + 1,
            ..good()
        };
        assert_eq!(c.validate(), Err(ConfigError::BadBufferSize));
        let c = StackConfig {
            ephemeral_ports: 0..=10,
            ..good()
        };
        assert_eq!(c.validate(), Err(ConfigError::BadPortRange));
        let c = StackConfig {
            ipv4: Some((Ipv4Addr::LOCALHOST, 33)),
            ..good()
        };
        assert_eq!(c.validate(), Err(ConfigError::BadPrefix));
        let c = StackConfig {
            mac: [1, 0, 0, 0, 0, 0],
            ..good()
        };
        assert_eq!(c.validate(), Err(ConfigError::BadMac));
        let c = StackConfig {
            armed_listeners: 0,
            ..good()
        };
        assert_eq!(c.validate(), Err(ConfigError::BadBacklog));
        for c in [
            StackConfig {
                max_sockets: 0,
                ..good()
            },
            StackConfig {
                max_backlog: 0,
                ..good()
            },
        ] {
            assert_eq!(c.validate(), Err(ConfigError::BadBacklog));
        }
    }
}
