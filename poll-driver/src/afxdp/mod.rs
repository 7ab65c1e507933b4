//! AF_XDP backend (Linux, root): UMEM, rings, the XSK socket, the XDP steering program and
//! [`AfXdpNic`], a smoltcp `Device` + [`crate::backend::Backend`].
//!
//! Built on `libc` alone (docs/afxdp.md §7.1): our own UMEM and rings, a steering
//! program generated as raw eBPF instructions and loaded with `bpf(BPF_PROG_LOAD)`, attached
//! with `BPF_LINK_CREATE` so the kernel detaches it when the process dies.
//!
//! * [`Umem`]: `rx_frames + tx_frames` chunks of 2048 or 4096 bytes ([`ChunkSize`]). RX
//!   chunks cycle fill ring → RX ring → stack → fill ring; TX chunks cycle free list → TX
//!   ring → completion ring → free list. The halves never mix, so smoltcp can hold an RX and
//!   a TX token at once.
//! * [`XskSocket`]: bound to (ifindex, queue); zero-copy where the driver allows it, copy
//!   mode otherwise (veth answers `EOPNOTSUPP`); `XDP_USE_NEED_WAKEUP` honoured. Copy-mode TX
//!   needs a `sendto` per 32 descriptors, so [`crate::backend::Backend::flush`] kicks in a loop
//!   until the TX ring is drained, reclaiming completions as it goes.
//! * Frames larger than chunk − 256 bytes cannot be received (the kernel drops them
//!   silently): [`AfXdpNic::max_frame_size`] / the device MTU tell the stack, unless
//!   [`AfXdpConfig::multi_buffer`] is set: then frames travel as descriptor chains, built in
//!   place on TX in runs of consecutive TX chunks and, in copy mode, read in place on RX
//!   from RX buffers laid out so that consecutive buffers' data areas touch (see
//!   poll-driver/README.md). [`AfXdpNic::chunk_counts`] accounts for every chunk.
//! * [`XdpProgram`] / [`SteeringFilter`]: redirect only the engine's traffic (its IPv4/IPv6
//!   addresses, ARP and NDP for them, optionally only some TCP ports); `XDP_PASS` the rest so
//!   the host stack keeps working on the interface. A stale program (ours, by the `xwarp`
//!   name prefix, or any if forced) is detached and replaced.
//!
//! ## Checksums
//! RX: this module checks no checksum; it reports [`AfXdpConfig::checksum`] to smoltcp and
//! the stack decides. Beware: frames from a local veth or tap peer arrive with only a
//! **partial L4 checksum** (CHECKSUM_PARTIAL: the sender's kernel left the TCP/UDP checksum
//! to an offload that never happens on a virtual link). A stack that verifies L4 checksums
//! on RX drops them, unless the peer turns TX checksum offload off (`ethtool -K <peer> tx
//! off`, or [`crate::netns::set_tx_checksum_offload`]).
//!
//! TX: with [`AfXdpConfig::tx_checksum`] ([`TxChecksumOffload`]) active, TCP and UDP
//! checksums go to the kernel through AF_XDP TX metadata (Linux 6.8+,
//! `XDP_UMEM_TX_METADATA_LEN`; honoured on the copy path: `xsk_build_skb` turns the request
//! into a `CHECKSUM_PARTIAL` skb). The UMEM is registered with 24 bytes of metadata in
//! front of every TX frame; smoltcp is told not to compute TCP/UDP TX checksums (it writes
//! 0); after the stack has built a frame, the TX token parses Ethernet / IPv4 or IPv6 /
//! TCP or UDP, writes the pseudo-header sum (folded, not complemented) into the checksum
//! field, fills the metadata (`csum_start` = L4 header offset, `csum_offset` = 16 / 6) and
//! sets `XDP_TX_METADATA` on the first descriptor (of a chain, with multi-buffer). A veth
//! passes such frames on as CHECKSUM_PARTIAL, which a kernel receiver trusts, and which an
//! AF_XDP receiver sees with only the pseudo-header sum (so `Auto` stays off on a NIC that
//! verifies received L4 checksums); a device without TX checksum offload has the kernel
//! finish them in software (`validate_xmit_skb`; a UDP checksum of 0 goes out as 0xffff).
//! ARP, ICMP, fragments and anything unparsed keep the software checksums the stack
//! wrote; the IPv4 header checksum is always computed by the stack.
//! [`AfXdpNic::tx_checksum_offload`] tells whether the offload is active.

//! ## Multi-queue
//! One [`AfXdpNic`] serves one RX queue. Frames steered by the program arrive on the queue
//! the NIC put them on; keep test interfaces at one queue or open a NIC per queue.

mod bpf;
pub mod caps;
pub mod dropper;
pub mod genl;
pub mod netlink;
mod nic;
mod program;
mod ring;
mod socket;
mod txcsum;
mod txslab;

pub use bpf::BpfInsn;
pub use nic::{
    AfXdpConfig, AfXdpNic, ChunkCounts, RxChainStats, RxToken, TxChecksumOffload, TxToken,
    ZeroCopy, MAX_CHAIN, TX_CHECKSUM_OFFLOAD_ENV,
};
pub use program::{
    steering_program, SteeringFilter, XdpLink, XdpMode, XdpProgram, PROGRAM_NAME_PREFIX,
};
pub use ring::{ConsumerRing, ProducerRing};
pub use socket::{
    BindOptions, ChunkSize, RingSizes, Umem, XdpStatistics, XskSocket, UNALIGNED_ADDR_MASK,
    UNALIGNED_OFFSET_SHIFT, XDP_PACKET_HEADROOM,
};

/// `true` if this process can create AF_XDP sockets (kernel support and privileges).
pub fn available() -> bool {
    // SAFETY: plain socket(2); closed right away.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    true
}
