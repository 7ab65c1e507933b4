//! Building and configuring smoltcp TCP sockets from the engine's configuration and an
//! application's socket options.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use smoltcp::socket::tcp::{self, CongestionControl};

use crate::config::{Congestion, SocketOptions, StackConfig, TcpOptions};

fn tsval() -> u32 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u32
}

fn smol_duration(d: Duration) -> smoltcp::time::Duration {
    smoltcp::time::Duration::from_micros(d.as_micros().min(u128::from(u64::MAX)) as u64)
}

/// A socket with the engine's buffer sizes, congestion control and timestamps and the
/// TCP options `opts`.
pub(crate) fn new_socket(config: &StackConfig, opts: &TcpOptions) -> tcp::Socket<'static> {
    let mut s = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0u8; config.rx_buffer]),
        tcp::SocketBuffer::new(vec![0u8; config.tx_buffer]),
    );
    s.set_nagle_enabled(!opts.nodelay);
    s.set_ack_delay(opts.ack_delay.map(smol_duration));
    s.set_keep_alive(opts.keepalive.map(smol_duration));
    s.set_timeout(opts.user_timeout.map(smol_duration));
    s.set_congestion_control(match config.congestion {
        Congestion::None => CongestionControl::None,
        Congestion::Cubic => CongestionControl::Cubic,
    });
    if config.timestamps {
        s.set_tsval_generator(Some(tsval));
    }
    s
}

/// The (receive, send) buffer sizes a socket with options `o` gets.
pub(crate) fn buffer_sizes(config: &StackConfig, o: &SocketOptions) -> (usize, usize) {
    (
        o.recv_buffer.unwrap_or(config.rx_buffer),
        o.send_buffer.unwrap_or(config.tx_buffer),
    )
}

/// The (rx, tx) application ring sizes of a connection with options `o`. Under the own
/// TCP core the rings are the TCP buffers too (the rx ring is the receive buffer, the tx
/// ring holds the unacknowledged bytes), so each ring also gets the socket buffer it
/// replaces: the bytes a connection can hold are the same under both cores.
pub(crate) fn ring_sizes(config: &StackConfig, o: &SocketOptions) -> (usize, usize) {
    if config.tcp_core == crate::config::TcpCore::Own {
        let (rx, tx) = buffer_sizes(config, o);
        (config.ring_size + rx, config.ring_size + tx)
    } else {
        (config.ring_size, config.ring_size)
    }
}

/// A socket with the application's options on top of the engine defaults; also
/// returns its (receive, send) buffer sizes and whether smoltcp may time it out.
pub(crate) fn new_socket_with(
    config: &StackConfig,
    o: &SocketOptions,
) -> (tcp::Socket<'static>, (usize, usize), bool) {
    let (rx, tx) = buffer_sizes(config, o);
    let mut s = if (rx, tx) == (config.rx_buffer, config.tx_buffer) {
        new_socket(config, &config.tcp)
    } else {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0u8; rx]),
            tcp::SocketBuffer::new(vec![0u8; tx]),
        );
        let defaults = new_socket(config, &config.tcp);
        s.set_nagle_enabled(defaults.nagle_enabled());
        s.set_ack_delay(defaults.ack_delay());
        s.set_congestion_control(defaults.congestion_control());
        if config.timestamps {
            s.set_tsval_generator(Some(tsval));
        }
        s
    };
    let armed = apply_options(&config.tcp, &mut s, o);
    (s, (rx, tx), armed)
}

/// Apply the options that can change at any time (nodelay, keep-alive); returns
/// whether smoltcp now has a timeout (keep-alive death or user timeout).
pub(crate) fn apply_options(
    d: &TcpOptions,
    s: &mut tcp::Socket<'static>,
    o: &SocketOptions,
) -> bool {
    s.set_nagle_enabled(!o.nodelay.unwrap_or(d.nodelay));
    match o.keepalive {
        Some(k) => {
            s.set_keep_alive(Some(smol_duration(k.probe_interval())));
            // A silent peer is dead after idle + interval * count (Linux's rule);
            // smoltcp's timeout counts from the last segment heard from the peer.
            s.set_timeout(Some(smol_duration(k.dead_after())));
        }
        None => {
            s.set_keep_alive(d.keepalive.map(smol_duration));
            s.set_timeout(d.user_timeout.map(smol_duration));
        }
    }
    s.timeout().is_some()
}
