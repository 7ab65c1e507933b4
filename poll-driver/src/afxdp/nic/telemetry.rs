//! The NIC's counters for `xwarp stat` (`Backend::telemetry`).

use xwarp_telemetry::layout::{MODE_XDP_GENERIC, MODE_XDP_NATIVE, NA};
use xwarp_telemetry::NicCounters;

use super::AfXdpNic;

/// Counters of `nic`: its own, the kernel's socket statistics (one `getsockopt`), the
/// attach mode and the bind mode.
pub(super) fn counters(nic: &AfXdpNic) -> NicCounters {
    // One getsockopt for both: `stats` would read the kernel's counters again.
    let k = nic.sock.statistics().unwrap_or_default();
    NicCounters {
        mode: if nic.is_native() {
            MODE_XDP_NATIVE
        } else {
            MODE_XDP_GENERIC
        },
        zero_copy: u64::from(nic.is_zero_copy()),
        multi_buffer: u64::from(nic.multi_buffer),
        rx_frames: nic.rxs.frames,
        rx_bytes: nic.rxs.bytes,
        tx_frames: nic.txs.frames,
        tx_bytes: nic.txs.bytes,
        dropped: nic.rxs.dropped
            + nic.txs.dropped
            + k.rx_dropped
            + k.rx_ring_full
            + k.rx_invalid_descs
            + k.tx_invalid_descs,
        rx_dropped_backend: nic.rxs.dropped,
        tx_no_buffer: nic.txs.dropped,
        xsk_rx_dropped: k.rx_dropped,
        xsk_rx_ring_full: k.rx_ring_full,
        xsk_fill_ring_empty: k.rx_fill_ring_empty_descs,
        xsk_tx_ring_empty: k.tx_ring_empty_descs,
        xsk_rx_invalid_descs: k.rx_invalid_descs,
        xsk_tx_invalid_descs: k.tx_invalid_descs,
        tx_csum_offloaded: nic.txs.offloaded,
        rx_chains_in_place: nic.rxs.chains_in_place,
        rx_chains_copied: nic.rxs.chains_copied,
        wire_faults: NA,
    }
}
